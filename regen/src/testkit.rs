//! Synthetic traces for tests and benchmarks (feature `testkit`): random
//! programs and executions from `aetrace_graph::testgen` turned into a
//! program database and the byte streams the rewritten program would write,
//! in a real trace. Shares nothing with the regenerator but the formats.
//!
//! Invariants: a synthesised database passes `ProgramDb::check`; the stream
//! of an execution follows the rules of `docs/regen.md` (witness bytes as
//! edges are traversed, ENTER for main and indirect callees, RETURN after
//! marked calls, EXIT before `exit`); the expected output is formatted from
//! the execution's steps.

use aetrace_format::progdb::{
    BlockDb, CallDb, CallTarget, EdgeDb, EdgeKindDb::*, ProcDb, ProcStatus, ProgramDb,
};
use aetrace_format::{
    module_flags, EndReason, Header, Module, ModuleId, StartReason, ThreadId, ThreadStart,
    TraceWriter,
};
use aetrace_graph::program::{walk, Callee, End, Execution, Program, Transfer};
use aetrace_graph::testgen::{self, Rng};
use aetrace_graph::trace::{place_witnesses, WitnessPlacement};
use aetrace_graph::{EntityRef, PrimaryMap, ProcId};

/// Run-time address the synthetic executable is loaded at.
pub const LOAD_BASE: u64 = 0x5555_5555_0000;
pub(crate) const LINK_BASE: u64 = 0x40_0000;
pub(crate) const PID: u32 = 4242;

// ---------------------------------------------------------------- streams

pub(crate) fn rec(out: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    out.push(0xFF);
    out.push(kind);
    out.extend_from_slice(payload);
}
pub(crate) fn thread_rec(out: &mut Vec<u8>) {
    rec(out, 8, &u32::MAX.to_le_bytes());
}
pub(crate) fn enter(out: &mut Vec<u8>, p: u32) {
    rec(out, 1, &p.to_le_bytes());
}
pub(crate) fn ret(out: &mut Vec<u8>) {
    rec(out, 10, &[]);
}
pub(crate) fn exit_rec(out: &mut Vec<u8>, status: u32) {
    rec(out, 6, &status.to_le_bytes());
}
pub(crate) fn witness(out: &mut Vec<u8>, w: u32) {
    if w < 254 {
        out.push(w as u8 + 1);
    } else {
        rec(out, 9, &(w as u16).to_le_bytes());
    }
}

// ---------------------------------------------------------------- traces

/// A trace of one module (`db`) and one thread per stream, each stream cut
/// into chunks of the given size.
pub fn trace_bytes(db: &ProgramDb, streams: &[Vec<u8>], chunk: usize) -> Vec<u8> {
    trace_bytes_of_minor(db, streams, chunk, aetrace_format::header::VERSION_MINOR)
}

/// [`trace_bytes`] of a run a signal killed (every THREAD_END `killed`).
pub fn killed_trace_bytes(db: &ProgramDb, streams: &[Vec<u8>], chunk: usize) -> Vec<u8> {
    let minor = aetrace_format::header::VERSION_MINOR;
    trace_bytes_ending(db, streams, chunk, minor, EndReason::Killed)
}

/// [`trace_bytes`] with the header's format minor set to `minor` (how
/// regen reads an older runtime's streams).
pub fn trace_bytes_of_minor(
    db: &ProgramDb,
    streams: &[Vec<u8>],
    chunk: usize,
    minor: u16,
) -> Vec<u8> {
    trace_bytes_ending(db, streams, chunk, minor, EndReason::Exit)
}

fn trace_bytes_ending(
    db: &ProgramDb,
    streams: &[Vec<u8>],
    chunk: usize,
    minor: u16,
    end: EndReason,
) -> Vec<u8> {
    let mut header = Header::new("regen test", 0).unwrap();
    header.minor = minor;
    let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
    w.module(&Module {
        id: ModuleId(0),
        pid: PID,
        flags: module_flags::MAIN | module_flags::INSTRUMENTED,
        load_base: LOAD_BASE,
        size: 0x10_0000,
        build_id: vec![1, 2, 3],
        path: b"/tmp/prog".to_vec(),
    })
    .unwrap();
    w.program_database(ModuleId(0), aetrace_format::progdb::VERSION, &db.encode())
        .unwrap();
    for (i, s) in streams.iter().enumerate() {
        let t = ThreadId(i as u32);
        w.thread_start(&ThreadStart {
            thread: t,
            parent: (i > 0).then_some(ThreadId(0)),
            os_tid: PID + i as u32,
            pid: PID,
            reason: if i == 0 {
                StartReason::Main
            } else {
                StartReason::Thread
            },
        })
        .unwrap();
        for c in s.chunks(chunk.max(1)) {
            let n = c.iter().filter(|&&b| b != 0xFF).count() as u64;
            w.chunk(t, c, n.min(c.len() as u64)).unwrap();
        }
    }
    for i in 0..streams.len() {
        w.thread_end(ThreadId(i as u32), end).unwrap();
    }
    w.finish().unwrap().0
}

/// A random program as a database: addresses, lengths and placements.
pub struct Synth {
    /// The random program.
    pub prog: Program,
    /// Its witness placements, one per procedure.
    pub placements: PrimaryMap<ProcId, WitnessPlacement>,
    /// The program database describing it.
    pub db: ProgramDb,
    /// Graph vertex -> database block, per procedure (EXIT -> blocks.len()).
    pub vmap: Vec<Vec<u32>>,
    /// External calls that write RETURN.
    marked: Vec<Vec<bool>>,
}

pub(crate) fn synth(prog: Program, rng: &mut Rng) -> Synth {
    let mut placements = PrimaryMap::new();
    let mut procs = Vec::new();
    let mut vmap = Vec::new();
    let mut marked = Vec::new();
    let mut addr = LINK_BASE + 0x1000;
    for (p, g) in prog.procs.iter() {
        let pl = place_witnesses(g, &aetrace_graph::weights::heuristic(g));
        let mut map = vec![0u32; g.num_vertices()];
        let mut k = 0;
        for v in g.vertices() {
            if v != g.exit() {
                map[v.index()] = k;
                k += 1;
            }
        }
        map[g.exit().index()] = k;
        let mut mk = vec![false; g.num_vertices()];
        let mut blocks = Vec::new();
        for v in g.vertices().filter(|&v| v != g.exit()) {
            let lens: Vec<u8> = (0..1 + rng.below(4))
                .map(|_| 1 + rng.below(15) as u8)
                .collect();
            let call = prog.callees[p][v].map(|c| {
                let (target, marker, returns) = match c {
                    Callee::Direct(q) => (CallTarget::Proc(q.as_u32()), false, true),
                    Callee::Indirect => (CallTarget::External, true, true),
                    Callee::External => (CallTarget::External, rng.chance(0.5), true),
                    Callee::Exit => (CallTarget::Exit, false, false),
                };
                mk[v.index()] = marker;
                CallDb {
                    target,
                    marker,
                    returns,
                    tail: false,
                    lazy: None,
                    landing: None,
                    jmpbuf: false,
                    plt: false,
                    indirect: false,
                }
            });
            let start = addr;
            addr += lens.iter().map(|&l| u64::from(l)).sum::<u64>() + rng.below(3) as u64;
            blocks.push(BlockDb {
                start,
                insn_lens: lens,
                call,
            });
        }
        let edges = g
            .edge_ids()
            .map(|e| {
                let ed = g.edge(e);
                let (from, to) = (map[ed.from.index()], map[ed.to.index()]);
                let is_call = prog.callees[p][ed.from].is_some();
                let kind = if ed.to == g.exit() {
                    if prog.callees[p][ed.from] == Some(Callee::Exit) {
                        NoReturn
                    } else {
                        Return
                    }
                } else if is_call && g.succs(ed.from).len() == 1 {
                    CallReturn
                } else if to == from + 1 {
                    FallThrough
                } else {
                    Taken
                };
                EdgeDb {
                    from,
                    to,
                    kind,
                    witness: pl.witness(e).map(|w| w as u16),
                }
            })
            .collect();
        procs.push(ProcDb {
            name: format!("p{}", p.index()),
            status: ProcStatus::Traced,
            entry: map[g.entry().index()],
            blocks,
            edges,
            sigmap: None,
        });
        placements.push(pl);
        vmap.push(map);
        marked.push(mk);
    }
    let db = ProgramDb {
        link_base: LINK_BASE,
        runtime_vaddr: 0,
        counts_returns: false,
        moved_tables: Vec::new(),
        copy_dependent: Vec::new(),
        procs,
    };
    db.check().unwrap();
    Synth {
        prog,
        placements,
        db,
        vmap,
        marked,
    }
}

impl Synth {
    /// The stream the rewritten program writes for `exec`.
    pub fn stream(&self, exec: &Execution) -> Vec<u8> {
        self.stream_with(exec, |_| {})
    }

    /// [`Synth::stream`], with `before_witness` writing what goes before
    /// each one-byte witness (a data trace's VALUE records).
    pub fn stream_with(
        &self,
        exec: &Execution,
        mut before_witness: impl FnMut(&mut Vec<u8>),
    ) -> Vec<u8> {
        let mut out = Vec::new();
        thread_rec(&mut out);
        let prog = &self.prog;
        walk(prog, exec, &mut Vec::new(), |_, t| match t {
            // main is called by libc: an outside entry.
            Transfer::Start(p) => enter(&mut out, p.as_u32()),
            Transfer::Edge { proc, edge } => {
                let from = prog.procs[proc].edge(edge).from;
                if self.marked[proc.index()][from.index()] {
                    ret(&mut out);
                }
                if let Some(w) = self.placements[proc].witness(edge) {
                    if w < 254 {
                        before_witness(&mut out);
                    }
                    witness(&mut out, w);
                }
            }
            Transfer::Call { caller, at, callee } => {
                if prog.callees[caller][at] == Some(Callee::Indirect) {
                    enter(&mut out, callee.as_u32());
                }
            }
        })
        .unwrap();
        if exec.end == End::Terminated {
            exit_rec(&mut out, 1);
        }
        out
    }

    /// The database block of graph vertex `v` of procedure `p`.
    pub fn block(&self, p: ProcId, v: aetrace_graph::BlockId) -> &BlockDb {
        &self.db.procs[p.index()].blocks[self.vmap[p.index()][v.index()] as usize]
    }

    /// The blocks the execution ran, in order (EXIT vertices skipped).
    pub fn executed<'a>(&'a self, exec: &'a Execution) -> impl Iterator<Item = &'a BlockDb> + 'a {
        exec.steps
            .iter()
            .filter(|&&(p, v)| v != self.prog.procs[p].exit())
            .map(|&(p, v)| self.block(p, v))
    }

    /// The instruction addresses the execution fetched, one hex per line.
    pub fn expected_insns(&self, exec: &Execution) -> String {
        let mut s = String::new();
        for b in self.executed(exec) {
            let mut a = LOAD_BASE + b.start;
            for &l in &b.insn_lens {
                s.push_str(&format!("{a:x}\n"));
                a += u64::from(l);
            }
        }
        s
    }
}

/// A random program of `nprocs` procedures of up to `max_blocks` blocks (structured, i.e. reducible, graphs when `structured`) from `seed`, synthesised.
pub fn random_case(seed: u64, nprocs: usize, max_blocks: usize, structured: bool) -> Synth {
    let mut rng = Rng::new(seed);
    let prog = testgen::random_program(&mut rng, nprocs, max_blocks, structured);
    synth(prog, &mut rng)
}
