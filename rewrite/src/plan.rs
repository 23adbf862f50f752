//! Per-procedure plans (docs/rewrite.md, steps 3-4): for each traced
//! procedure, its witnesses (Section 4.2: blocking witnesses, then the
//! constrained maximum spanning tree) or counters, its call-site plans,
//! its jump tables' new places, its buffer checks and its liveness; and
//! the program database entry of every procedure, traced or not.
//!
//! Invariants:
//! - `db.procs[i]` describes procedure `i`; traced ones have a plan, in
//!   procedure order, with the same witness numbers (`WitnessPlacement`
//!   numbering) but under fault injection ([`crate::FAULT_ENV`]);
//! - call-return edges never carry a witness (their weight forces them
//!   into the spanning tree), so a witness is always written in the
//!   procedure that owns it;
//! - counting: counter numbers are dense from 0 in procedure order
//!   ([`CountLayout::len`] is the next free one).

use aetrace_analysis::addr::returns::Returns;
use aetrace_analysis::cfg::{BlockKind, Cfg, EdgeKind, JumpResolution};
use aetrace_analysis::elf::ElfKind;
use aetrace_analysis::Procedure;
use aetrace_format::progdb::{
    BlockDb, CallDb, EdgeDb, EdgeKindDb, MovedTable, ProcDb, ProcStatus, ProgramDb,
};
use aetrace_graph::trace::{
    all_predicate_edges, naive_blocking_needed, place_witnesses, WitnessPlacement,
};
use aetrace_graph::weights::heuristic;
use aetrace_graph::{BlockId, EntityRef, ProcId, VertexKind};
use aetrace_runtime::layout::TAG_SHIFT;

use crate::calls::Calls;
use crate::codegen::{Chunk, Dispatch, EntryStub, Map, PlanCounters, ProcPlan, Table};
use crate::traced::Traced;
use crate::{checks, counters, data, liveness, pathprof};
use crate::{CountLayout, How, Placement, Refusal, Result, Rewrite, FAULT_ENV};

/// The outcome of the phase.
pub(crate) struct Plans<'p> {
    /// The program database, but for the signal maps (from the code).
    pub db: ProgramDb,
    /// One per traced procedure, in procedure order.
    pub plans: Vec<ProcPlan<'p>>,
    /// Procedures left alone and why, and other notes, one line each.
    pub notes: Vec<String>,
    /// Witness edges placed (tracing).
    pub witness_edges: usize,
    /// Counting: the counters, as far as the plans decide them.
    pub layout: CountLayout,
    /// The end of the rewritten jump tables, placed from the start of the
    /// code segment.
    pub tables_end: u64,
    /// Per plan, what [`Plans::finish`] still needs.
    pending: Vec<Pending>,
}

/// A traced procedure's inputs to its buffer checks, kept until every
/// procedure's database entry is built.
struct Pending {
    /// The procedure's number in the module.
    id: usize,
    /// Its witness numbers as the database promises them.
    witness: Vec<Option<u32>>,
    /// Whether it may end a chain of calls without a check (`chain_end`).
    chain_end: bool,
}

/// A procedure's witness (or counter) numbers per edge: what the database
/// promises, what the code writes (they differ only under fault
/// injection), and its counters when counting.
type Witnesses = (Vec<Option<u32>>, Vec<Option<u32>>, Option<PlanCounters>);

impl<'p> Plans<'p> {
    /// Plans every procedure; the jump tables go from `code_seg` up.
    pub fn build(rw: &Rewrite<'p>, calls: &Calls<'_>, code_seg: u64) -> Result<Plans<'p>> {
        let traced = calls.traced;
        let n = rw.prog.procs.len();
        let mut plans = Plans {
            db: ProgramDb {
                link_base: rw.link_base,
                runtime_vaddr: 0,
                counts_returns: false,
                moved_tables: Vec::new(),
                copy_dependent: Vec::new(),
                procs: Vec::with_capacity(n),
            },
            plans: Vec::new(),
            notes: Vec::new(),
            witness_edges: 0,
            layout: CountLayout {
                atomic: rw.atomic,
                procs: vec![None; n],
                paths: vec![None; n],
                ..CountLayout::default()
            },
            tables_end: code_seg,
            pending: Vec::new(),
        };
        if traced.stripped {
            // docs/rewrite.md, "Static executables".
            plans.notes.push(format!(
                "static executable without setjmp/longjmp symbols (stripped): {} setjmp-like and {} \
                 longjmp-like procedures recognised by their use of the pointer guard (fs:[0x30]); \
                 a context switch they do not cover (setcontext, swapcontext, an own stack switch) \
                 is not recognised",
                traced.family.setjmp.len(),
                traced.family.longjmp.len()
            ));
        }
        if let Some(note) = early_note(rw, traced) {
            plans.notes.push(note);
        }
        for (id, p) in rw.prog.procs.iter() {
            match traced.reasons.get(&id) {
                Some(r) => plans.left_alone(p, r),
                None => plans.plan(rw, calls, id, p)?,
            }
        }
        plans.db.copy_dependent = copy_dependent(&plans.db);
        plans.finish(rw)?;
        plans.check(rw, traced)?;
        Ok(plans)
    }

    /// With every procedure's database entry built: each plan's VALUE
    /// records (`--data`: which return points keep `rsp` is a property of
    /// the whole module, `addr::returns`) and then its buffer checks,
    /// whose budget counts them.
    fn finish(&mut self, rw: &Rewrite<'p>) -> Result<()> {
        let returns = (rw.data != crate::DataMode::Off)
            .then(|| Returns::of_module(&self.db, &rw.prog.module));
        for (plan, pend) in self.plans.iter_mut().zip(std::mem::take(&mut self.pending)) {
            match &returns {
                Some(r) => {
                    let db = &self.db.procs[pend.id];
                    let (values, entry) = data::values(rw, plan.name, db, r, &plan.insns)?;
                    plan.values = Some(values);
                    plan.entry_value = entry;
                }
                // Control only: every outside entry's `rsp` (format 1.21),
                // ENTER_SAME where it repeats the thread's last.
                None => {
                    plan.entry_value = Some(data::entry_value(0));
                    plan.entry_same = true;
                }
            }
            let unchecked: Vec<bool> = plan.calls.iter().map(|c| c.unchecked_return).collect();
            plan.loop_header = checks::check_blocks(
                plan.cfg,
                &plan.insns,
                &pend.witness,
                &plan.landing_pads,
                pend.chain_end,
                &unchecked,
                &plan
                    .values
                    .as_ref()
                    .map(data::extra_costs)
                    .unwrap_or_default(),
            );
        }
        Ok(())
    }

    fn left_alone(&mut self, p: &Procedure, r: &str) {
        self.notes.push(format!(
            "procedure {} at {:#x} left alone: {r}",
            p.name, p.start
        ));
        self.db.procs.push(ProcDb {
            name: p.name.clone(),
            status: ProcStatus::LeftAlone(r.to_owned()),
            entry: 0,
            blocks: Vec::new(),
            edges: Vec::new(),
            sigmap: None,
        });
    }

    /// The plan of traced procedure `id`.
    fn plan(
        &mut self,
        rw: &Rewrite<'p>,
        calls: &Calls<'_>,
        id: ProcId,
        p: &'p Procedure,
    ) -> Result<()> {
        let module = &rw.prog.module;
        let cfg = p.cfg.as_ref().expect("traced procedures have a CFG");
        let insns = liveness::decode_blocks(module, cfg)?;
        let live = liveness::analyze(cfg, &insns);
        let landing_pads: Vec<BlockId> = p
            .landing_pads
            .iter()
            .filter_map(|&a| cfg.block_at(a))
            .collect();
        let (witness, code_witness, plan_counters) = match rw.how {
            // A PLT stub's jump decided by LAZY: no witness in the stub.
            How::Trace(_) if calls.lazy_stubs.contains_key(&id) => {
                let none = vec![None; cfg.edges.len()];
                (none.clone(), none, None)
            }
            How::Trace(which) => self.witnesses(rw, p, cfg, *which)?,
            How::Count(spec) if spec.paths => self.path_counters(rw, calls, id, p, cfg)?,
            How::Count(spec) => self.edge_counters(rw, calls, (id, p), spec, &landing_pads)?,
        };
        let (site_plans, call_db) = calls.plan_sites(rw, (id, cfg), &insns, &live);
        // `--stop-at` and a throw: every frame it leaves stands at a call
        // with a virtual exit edge, whose query increment is 0 (the counter
        // is exact for the caller there), and the unwinder's entry at a
        // pad adds `R0 -> pad`'s increment: exact. A `setjmp` call's query
        // increment would be taken back once more at each of its returns
        // through `longjmp`.
        if rw.stop_at.is_some()
            && !rw.fatal_longjmps
            && site_plans.iter().any(|c| c.jmpbuf.is_some())
        {
            return Err(rw.err(Refusal::StopAtSetjmp(p.name.clone())));
        }
        let tables = self.jump_tables(rw, calls.traced, id, p, cfg)?;
        let map = self.map(rw, p, cfg);
        let dispatches = self.dispatches(rw, cfg);
        let db = proc_db(p, cfg, &insns, &call_db, &witness, plan_counters.is_none());
        self.pending.push(Pending {
            id: id.index(),
            witness,
            chain_end: chain_end(rw, calls, p, cfg),
        });
        self.db.procs.push(db);
        self.plans.push(ProcPlan {
            number: rw.tag << TAG_SHIFT | id.index() as u32,
            name: &p.name,
            start: p.start,
            stub: if p.start == module.entry && module.is_static {
                EntryStub::StaticEntry
            } else if p.start == module.entry && !rw.library {
                EntryStub::ProcessEntry
            } else {
                EntryStub::Full
            },
            cfg,
            insns,
            live,
            witness: code_witness,
            calls: site_plans,
            tables,
            loop_header: Vec::new(),
            // The copy's LSDAs point at LANDING stubs (see `unwind`).
            landing_pads,
            counters: plan_counters,
            values: None,
            entry_value: None,
            entry_same: false,
            map,
            unowned: &rw.prog.unowned,
            dispatches,
            entry_points: p.entries[1..]
                .iter()
                .filter_map(|&e| Some((e, cfg.block_at(e)?)))
                .collect(),
            direct_entries: calls.traced.direct.get(&id).cloned().unwrap_or_default(),
            springboard: !calls.traced.boardless.contains(&id),
        });
        Ok(())
    }

    /// Tracing: the witness placement, and the fault injected into it.
    fn witnesses(
        &mut self,
        rw: &Rewrite<'_>,
        p: &Procedure,
        cfg: &Cfg,
        which: Placement,
    ) -> Result<Witnesses> {
        let pl = placement(cfg, which);
        self.witness_edges += pl.len();
        let witness: Vec<Option<u32>> = cfg.edges.keys().map(|e| pl.witness(e)).collect();
        // The code writes `code_witness`, the database promises
        // `witness`: they differ only under fault injection.
        let mut code_witness = witness.clone();
        if let Some((name, k)) = rw.fault.as_ref().filter(|(name, _)| *name == p.name) {
            let Some(w) = code_witness.iter_mut().find(|w| **w == Some(*k)) else {
                return Err(rw.err(Refusal::FaultNoWitness {
                    proc: name.clone(),
                    witness: *k,
                }));
            };
            *w = None;
            self.notes.push(format!(
                "FAULT INJECTED ({FAULT_ENV}): procedure {name} does not write witness {k}"
            ));
        }
        Ok((witness, code_witness, None))
    }

    /// Path profiling: the path numbering's operations, or edge counters
    /// when the procedure has too many paths (the documented fallback).
    fn path_counters(
        &mut self,
        rw: &Rewrite<'_>,
        calls: &Calls<'_>,
        id: ProcId,
        p: &Procedure,
        cfg: &Cfg,
    ) -> Result<Witnesses> {
        let layout = &mut self.layout;
        let virt = counters::virtual_exits(cfg, &|c| calls.may_exit_call(c));
        let mut c = PlanCounters::default();
        let mut w = vec![None; cfg.edges.len()];
        match pathprof::number(cfg, virt.clone(), layout.len, pathprof::PATH_LIMIT) {
            Ok(pp) => {
                let o = pathprof::ops(cfg, &pp);
                for (i, ops) in o.edges.into_iter().enumerate() {
                    w[i] = layout.push_ops(ops);
                }
                c.entry = layout.push_ops(o.entry);
                c.before_call = o
                    .before_call
                    .into_iter()
                    .map(|ops| layout.push_ops(ops))
                    .collect();
                let n = u32::try_from(pp.numbering.num_paths())
                    .ok()
                    .and_then(|n| layout.len.checked_add(n))
                    .ok_or_else(|| rw.err(Refusal::TooManyPathCounters))?;
                layout.len = n;
                layout.paths[id.index()] = Some(pp);
            }
            Err(aetrace_graph::Error::TooManyPaths { .. }) => {
                // The documented fallback: edge counters (QP).
                let edges = counters::CountSpec::default();
                let start = cfg.blocks[cfg.entry].start;
                // Paths refuse landing pads and setjmp: exits only.
                let virt = counters::Virtual {
                    exits: virt,
                    ..counters::Virtual::default()
                };
                let pc = counters::place(cfg, &edges, start, virt, layout.len)
                    .map_err(|e| counters_err(rw, p, e))?;
                for (i, k) in pc.chords.iter().enumerate() {
                    let n = layout.push_ops(vec![pathprof::PathOp::Word {
                        word: pc.first + i as u32,
                    }]);
                    match *k {
                        counters::Counted::Edge(e) => w[e.index()] = n,
                        counters::Counted::Entry => c.entry = n,
                        counters::Counted::Landing(_) | counters::Counted::Resume(_) => {
                            return Err(rw.err(Refusal::PathCounterKinds(p.name.clone())))
                        }
                    }
                }
                layout.len += pc.len(cfg.blocks.len());
                layout.procs[id.index()] = Some(pc);
            }
            Err(e) => return Err(counters_err(rw, p, e)),
        }
        Ok((w.clone(), w, Some(c)))
    }

    /// Edge or event counting: the counter placement (`counters`).
    fn edge_counters(
        &mut self,
        rw: &Rewrite<'_>,
        calls: &Calls<'_>,
        (id, p): (ProcId, &Procedure),
        spec: &counters::CountSpec,
        landing_pads: &[BlockId],
    ) -> Result<Witnesses> {
        let cfg = p.cfg.as_ref().expect("traced procedures have a CFG");
        let layout = &mut self.layout;
        let mut setjmp_blocks: Vec<BlockId> = cfg
            .calls
            .iter()
            .filter(|c| calls.traced.setjmp_call(c) || calls.may_fork_call(id, c))
            .map(|c| c.block)
            .filter(|&b| {
                cfg.edges
                    .values()
                    .any(|e| e.from == b && e.kind == EdgeKind::CallReturn)
            })
            .collect();
        setjmp_blocks.sort_unstable();
        setjmp_blocks.dedup();
        let virt = counters::Virtual {
            exits: counters::virtual_exits(cfg, &|c| calls.may_exit_call(c)),
            pads: landing_pads.to_vec(),
            setjmps: setjmp_blocks,
        };
        let pc = counters::place(cfg, spec, cfg.blocks[cfg.entry].start, virt, layout.len)
            .map_err(|e| counters_err(rw, p, e))?;
        let mut w = vec![None; cfg.edges.len()];
        let mut c = PlanCounters::default();
        for (i, k) in pc.chords.iter().enumerate() {
            let n = pc.first + i as u32;
            match *k {
                counters::Counted::Edge(e) => w[e.index()] = Some(n),
                counters::Counted::Entry => c.entry = Some(n),
                counters::Counted::Landing(b) => {
                    c.landing.resize_with(cfg.blocks.len(), || None);
                    c.landing[b.index()] = Some(n);
                }
                counters::Counted::Resume(b) => {
                    c.resume.resize_with(cfg.blocks.len(), || None);
                    c.resume[b.index()] = Some(n);
                }
            }
        }
        c.split_return = vec![false; cfg.blocks.len()];
        for &b in &pc.virt.setjmps {
            c.split_return[b.index()] = true;
        }
        c.stop = pc.stop.clone();
        if pc.every_block {
            c.blocks = (0..cfg.blocks.len() as u32)
                .map(|i| Some(pc.first + i))
                .collect();
        }
        layout.len += pc.len(cfg.blocks.len());
        layout.amounts.extend_from_slice(&pc.amounts);
        layout.procs[id.index()] = Some(pc);
        Ok((w.clone(), w, Some(c)))
    }

    /// The new places of procedure `id`'s jump tables, from `tables_end` up.
    fn jump_tables(
        &mut self,
        rw: &Rewrite<'_>,
        traced: &Traced,
        id: ProcId,
        p: &Procedure,
        cfg: &Cfg,
    ) -> Result<Vec<Table>> {
        let mut out = Vec::new();
        for (old, rel32, j) in traced.tables.get(&id).into_iter().flatten() {
            let JumpResolution::Table { targets, .. } = &j.resolution else {
                continue;
            };
            // A case in another procedure (`traced::outside_cases`) is
            // the jump's tail call: its edge goes to EXIT.
            let leaves = |t: u64| {
                cfg.calls
                    .iter()
                    .any(|c| c.block == j.block && c.tail && c.target == Some(t))
            };
            let targets: Vec<_> = targets
                .iter()
                .map(|&t| match cfg.block_at(t) {
                    None if leaves(t) => Ok(cfg.exit()),
                    b => b.ok_or(t),
                })
                .collect::<std::result::Result<_, _>>()
                .map_err(|case| {
                    rw.err(Refusal::CaseNotBlock {
                        proc: p.name.clone(),
                        case,
                    })
                })?;
            let t = Table {
                old: *old,
                new: self.tables_end,
                rel32: *rel32,
                biased: !*rel32 && rw.prog.module.kind != ElfKind::Exec,
                targets,
                block: j.block,
            };
            self.tables_end += t.size().next_multiple_of(8);
            self.db.moved_tables.push(MovedTable {
                old: t.old,
                new: t.new,
                size: t.size(),
            });
            out.push(t);
        }
        Ok(out)
    }

    /// The map of a procedure with an unresolved jump (tracing), placed
    /// from `tables_end` up.
    fn map(&mut self, rw: &Rewrite<'_>, p: &Procedure, cfg: &Cfg) -> Option<Map> {
        let tracing = matches!(rw.how, How::Trace(_));
        if !tracing || !cfg.indirect_jumps.iter().any(|j| j.is_unresolved()) {
            return None;
        }
        let m = Map {
            new: self.tables_end,
            start: p.start,
            len: p.end - p.start,
        };
        self.tables_end += (4 * m.len).next_multiple_of(8);
        Some(m)
    }

    /// The dispatches of a procedure's jumps to computed code addresses
    /// and through tables several jumps read (`traced::shared_tables`;
    /// tracing), their chunks placed from `tables_end` up.
    fn dispatches(&mut self, rw: &Rewrite<'_>, cfg: &Cfg) -> Vec<Dispatch> {
        if !matches!(rw.how, How::Trace(_)) {
            return Vec::new();
        }
        let shared = crate::traced::shared_tables(cfg);
        let mut out = Vec::new();
        for j in &cfg.indirect_jumps {
            let targets = match &j.resolution {
                JumpResolution::Computed(t) if !t.is_empty() => t,
                JumpResolution::Table { table, targets } if shared.contains(table) => targets,
                _ => continue,
            };
            let mut targets = targets.clone();
            targets.sort_unstable();
            let chunks = clusters(&targets)
                .into_iter()
                .map(|span| {
                    let cases = (span[0]..=span[span.len() - 1])
                        .map(|a| {
                            // A target outside the procedure is the jump's
                            // tail call (`traced::outside_cases`).
                            let case = || cfg.block_at(a).unwrap_or(cfg.exit());
                            span.binary_search(&a).ok().map(|_| case())
                        })
                        .collect::<Vec<_>>();
                    let c = Chunk {
                        start: span[0],
                        new: self.tables_end,
                        cases,
                    };
                    self.tables_end += (4 * c.cases.len() as u64).next_multiple_of(8);
                    c
                })
                .collect();
            out.push(Dispatch {
                block: j.block,
                chunks,
            });
        }
        out
    }

    /// What no plan may lack, over all of them.
    fn check(&self, rw: &Rewrite<'_>, traced: &Traced) -> Result<()> {
        let module = &rw.prog.module;
        if self.plans.is_empty() {
            return Err(rw.err(Refusal::NothingTraced));
        }
        // A static executable has no preinit array: its traced entry procedure
        // is the only place to run the runtime's init before any traced code.
        if module.is_static && !self.plans.iter().any(|p| p.stub == EntryStub::StaticEntry) {
            let left_alone = rw
                .prog
                .procs
                .iter()
                .find(|(_, p)| p.start == module.entry)
                .map(|(id, p)| {
                    let why = traced.reasons.get(&id).map_or("", String::as_str);
                    (p.name.clone(), why.to_owned())
                });
            return Err(rw.err(Refusal::StaticEntry {
                entry: module.entry,
                left_alone,
            }));
        }
        if self.db.procs.iter().any(|p| {
            p.edges
                .iter()
                .any(|e| e.witness.is_some_and(|w| w == u16::MAX))
        }) {
            return Err(rw.err(Refusal::TooManyWitnesses));
        }
        Ok(())
    }
}

/// Counter placement or path numbering failed for procedure `p`.
fn counters_err(
    rw: &Rewrite<'_>,
    p: &Procedure,
    why: impl Into<counters::CounterError>,
) -> crate::Error {
    rw.err(Refusal::Counters {
        proc: p.name.clone(),
        why: why.into(),
    })
}

impl CountLayout {
    /// Path profiling: the counter number running `ops` (none for none).
    fn push_ops(&mut self, ops: Vec<pathprof::PathOp>) -> Option<u32> {
        (!ops.is_empty()).then(|| {
            self.ops.push(ops);
            self.ops.len() as u32 - 1
        })
    }
}

/// Whether procedure `p` ends every chain of calls without entry checks
/// (`checks`). Direct calls and tail calls to traced procedures skip
/// their outside-entry stubs (and its check); every other entry passes
/// one. A chain of calls without entry checks is at most two deep.
fn chain_end(rw: &Rewrite<'_>, calls: &Calls<'_>, p: &Procedure, cfg: &Cfg) -> bool {
    // `--data`: the entry writes VALUE records its callers do not count.
    rw.data == crate::DataMode::Off
        && p.start != rw.prog.module.entry
        && !checks::reaches_call(cfg, |t| {
            calls
                .traced
                .traced_at(t)
                .is_some_and(|q| calls.calls_traced.contains(&q))
        })
}

/// A gap between targets wider than this starts another chunk of a
/// dispatch: its 16 KiB of entries would cost more than one more compare
/// (a procedure's `.cold` part lies megabytes away).
const CHUNK_GAP: u64 = 4096;

/// Sorted targets in clusters without a gap over [`CHUNK_GAP`].
fn clusters(targets: &[u64]) -> Vec<&[u64]> {
    let mut out = Vec::new();
    let mut first = 0;
    for i in 1..=targets.len() {
        if i == targets.len() || targets[i] - targets[i - 1] > CHUNK_GAP {
            out.push(&targets[first..i]);
            first = i;
        }
    }
    out
}

/// The program database's entry of a traced procedure (its signal map
/// comes from the code). `witnesses`: its edges carry witness numbers
/// (tracing), not counter numbers.
fn proc_db(
    p: &Procedure,
    cfg: &Cfg,
    insns: &[Vec<iced_x86::Instruction>],
    call_db: &[Option<CallDb>],
    witness: &[Option<u32>],
    witnesses: bool,
) -> ProcDb {
    ProcDb {
        name: p.name.clone(),
        status: ProcStatus::Traced,
        entry: cfg.entry.index() as u32,
        blocks: cfg
            .blocks
            .iter()
            .map(|(b, blk)| BlockDb {
                start: blk.start,
                insn_lens: insns[b.index()].iter().map(|i| i.len() as u8).collect(),
                call: call_db[b.index()].filter(|c| c.tail || blk.kind == BlockKind::Call),
            })
            .collect(),
        edges: cfg
            .edges
            .iter()
            .map(|(e, ed)| EdgeDb {
                from: ed.from.index() as u32,
                to: ed.to.index() as u32,
                kind: edge_kind_db(ed.kind),
                witness: witness[e.index()].filter(|_| witnesses).map(|w| w as u16),
            })
            .collect(),
        // Filled in from the generated code (`emit`).
        sigmap: None,
    }
}

fn edge_kind_db(k: EdgeKind) -> EdgeKindDb {
    match k {
        EdgeKind::FallThrough => EdgeKindDb::FallThrough,
        EdgeKind::Taken => EdgeKindDb::Taken,
        EdgeKind::JumpTable => EdgeKindDb::JumpTable,
        EdgeKind::CallReturn => EdgeKindDb::CallReturn,
        EdgeKind::Return => EdgeKindDb::Return,
        EdgeKind::TailCall => EdgeKindDb::TailCall,
        EdgeKind::NoReturn => EdgeKindDb::NoReturn,
        EdgeKind::Halt => EdgeKindDb::Halt,
        EdgeKind::Resume => EdgeKindDb::Resume,
    }
}

/// The witness placement of one procedure.
fn placement(cfg: &Cfg, which: Placement) -> WitnessPlacement {
    let g = cfg.to_graph();
    let mut w = heuristic(&g);
    // Edges out of call vertices never carry a witness: it would be
    // written after the callee's records (or never, after a call that does
    // not return). Such edges form no cycle among themselves, so a weight
    // above every other puts all of them in the maximum spanning tree.
    let top = w.values().fold(1.0f64, |m, &x| m.max(x)) * 4.0 + 1.0;
    for e in g.edge_ids() {
        if g.kind(g.edge(e).from) == VertexKind::Call && e != g.exit_root() {
            w[e] = top;
        }
    }
    // A trap's resume edge carries a witness wherever the tree can spare
    // it: after a handler returns, regen tells by it that the handler
    // moved rip past the trap (docs/regen.md, "Traps").
    for (e, ed) in cfg.edges.iter() {
        if ed.kind == EdgeKind::Resume {
            w[e] = -top;
        }
    }
    match which {
        Placement::Optimal => place_witnesses(&g, &w),
        Placement::AllPredicates => all_predicate_edges(&g),
        // Not the paper's naive placement itself, which would also force a
        // witness on the edge from one call vertex into another (no code
        // could write it: see the weights above) and in procedures without
        // predicates, which need none (`<plt0>`'s witness before its jump to
        // ld.so came after an `exit` stub's EXIT record: regen refused it).
        Placement::NaiveBlocking => naive_blocking_needed(&g, &w),
    }
}

/// libgcc's FDE search (by symbol, `.cold` parts included): it looks up
/// the pcs of the frames the unwinder walks, return addresses that are the
/// copies' in the rewritten program, so it compares other values and takes
/// other branches than natively (`backtrace()`, a C++ `throw` in a static
/// image: docs/rewrite.md, "Static executables").
const FDE_SEARCH: [&str; 4] = [
    "_Unwind_Find_FDE",
    "_Unwind_IteratePhdrCallback",
    "search_object",
    "linear_search_fdes",
];

/// The traced procedures of `db` whose path depends on the copies'
/// addresses ([`ProgramDb::copy_dependent`]).
fn copy_dependent(db: &ProgramDb) -> Vec<u32> {
    (0..db.procs.len() as u32)
        .filter(|&q| {
            let p = &db.procs[q as usize];
            let base = p.name.split('.').next().unwrap_or_default();
            p.is_traced() && FDE_SEARCH.contains(&base)
        })
        .collect()
}

/// The note naming the procedures ld.so runs before the runtime's init
/// that are traced from it on (`Traced::early`), by address.
fn early_note(rw: &Rewrite<'_>, traced: &Traced) -> Option<String> {
    let mut early: Vec<&Procedure> = (traced.early.iter())
        .filter(|&&id| traced.is_traced(id))
        .map(|&id| &rw.prog.procs[id])
        .collect();
    early.sort_by_key(|p| p.start);
    let names: Vec<&str> = early.iter().map(|p| p.name.as_str()).collect();
    (!names.is_empty()).then(|| {
        format!(
            "{EARLY_NOTE} in {} ({} procedures; the runtime's init installs their springboards): {}",
            rw.path.display(),
            names.len(),
            names.join(", ")
        )
    })
}

/// How the note of [`early_note`] starts.
const EARLY_NOTE: &str =
    "traced from the runtime's init on, untraced before it: the code ld.so runs first";
