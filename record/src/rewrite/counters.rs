//! Counters instead of witnesses: the instrumentation of `aetrace profile`
//! (paper 003 Section 3, "QP" edge profiling, with the early-exit
//! correction of Figure 4).
//!
//! Per traced procedure, the counted graph is the CFG plus
//! - a virtual root `R0` with the edge `R0 -> root` (its count is the
//!   number of invocations; `EXIT -> R0` seeds the spanning tree), and
//! - one virtual edge `c -> EXIT` for every call vertex `c` whose callee may
//!   end the process while the call is active (an `exit`-like or
//!   non-returning call somewhere below it): its derived count is the number
//!   of frames left at `c` when the program terminated (Figure 4's edge,
//!   derived instead of reported). Virtual edges weigh more than any real
//!   edge, so they are always tree edges and never need a counter; each
//!   costs one counter on the cheapest edge of its cycle.
//!
//! Counters go on the chords of the maximum spanning tree of that graph
//! (`graph::profile::place_counters`); a chord `R0 -> root` is counted on
//! the copy's invocation label (every call and outside entry passes it,
//! loops back to the entry block do not). `--placement every-block`
//! counts every block instead (pixie, "slow" QP: block counts only).
//!
//! Counters are 8-byte words in a page-aligned RW segment of the rewritten
//! module; the module's preinit entry ([`emit_init`]) maps the recorder's
//! memfd over it (`MAP_SHARED|MAP_FIXED`) so that the counts survive
//! SIGKILL and are shared with fork children. An increment is one
//! instruction, `add qword [rip+c], 1`, with a `lock` prefix when the program
//! can start threads (it imports `pthread_create`, `clone` or `thrd_create`);
//! with live flags it is `mov/lea/mov` through a dead register
//! (single-threaded) or wrapped in `pushfq/popfq` (stepping over the red
//! zone).
//!
//! Event counting (`aetrace count`, paper 002): the same tree; every chord
//! adds its increment `Inc(c)` (`graph::events`) to one program-wide
//! counter instead of 1 to its own.
//!
//! Invariants: virtual edges are tree edges in every placement this module
//! returns (checked, else the procedure is refused); counter numbers are
//! dense, per procedure contiguous from [`ProcCounters::first`].

use std::collections::HashMap;

use aetrace_graph::events::place_event_counters;
use aetrace_graph::profile::place_counters;
use aetrace_graph::weights::{heuristic, Weights};
use aetrace_graph::{BlockId, EdgeId, EntityRef, Graph, GraphBuilder, SecondaryMap, VertexKind};
use aetrace_runtime::Site;
use iced_x86::code_asm::{
    byte_ptr, eax, ebx, ecx, edi, edx, esi, ptr, qword_ptr, r10d, r8, r8d, r9d, rax, rbx, rdi, rdx,
    rsi, CodeAssembler,
};
use iced_x86::{Code, Instruction, MemoryOperand, Register};

use crate::cfg::{Cfg, EdgeKind};

/// Environment variable naming the counter memfd (set by `aetrace profile`).
pub const ENV_FD: &str = "AETRACE_COUNTERS_FD";

/// Where counters go.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum CountPlacement {
    /// On the chords of a maximum spanning tree (QP).
    #[default]
    Optimal,
    /// A counter at the start of every block (block counts only).
    EveryBlock,
}

/// Edge counts of a previous profile, used as the spanning tree's weights
/// (feedback): per procedure start address, the count of every CFG edge
/// (in CFG order) and the number of invocations.
pub type Feedback = HashMap<u64, (Vec<u64>, u64)>;

/// The events `aetrace count` counts (paper 002).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Instructions executed.
    Insns,
    /// Blocks executed.
    Blocks,
    /// Procedure invocations.
    Calls,
}

/// What `aetrace profile` / `aetrace count` ask of the rewriter.
#[derive(Clone, Debug, Default)]
pub struct CountSpec {
    pub placement: CountPlacement,
    pub feedback: Option<Feedback>,
    /// Event counting: one program-wide counter (slot 0) to which each
    /// chord adds its increment, instead of a counter per chord.
    pub events: Option<Event>,
    /// Path profiling (`aetrace paths`, [`super::pathprof`]): path
    /// counters, edge counters only where a procedure has too many paths.
    pub paths: bool,
}

/// A counted edge of the counted graph (see the module comment).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Counted {
    /// A CFG edge.
    Edge(EdgeId),
    /// `R0 -> root`: the invocations.
    Entry,
}

/// The counters of one procedure.
#[derive(Clone, Debug, Default)]
pub struct ProcCounters {
    /// First counter index.
    pub first: u32,
    /// Optimal placement: the counted edges, counter `first + i` for the i-th.
    pub chords: Vec<Counted>,
    /// Call vertices with a virtual `c -> EXIT` edge, in edge order.
    pub virtual_exits: Vec<BlockId>,
    /// Every-block placement: counter `first + i` counts block `i`.
    pub every_block: bool,
    /// Event counting: the increment of each chord (paper 002's `Inc`).
    pub amounts: Vec<i32>,
}

impl ProcCounters {
    /// Number of counters.
    pub fn len(&self, blocks: usize) -> u32 {
        if self.every_block {
            blocks as u32
        } else {
            self.chords.len() as u32
        }
    }
}

/// The counted graph of `cfg` (module comment): CFG vertices and edges
/// with their ids, then EXIT, then `R0`; edges: CFG edges, `R0 -> root`,
/// then `c -> EXIT` for each of `virtual_exits`.
pub fn counted_graph(cfg: &Cfg, virtual_exits: &[BlockId]) -> Graph {
    let mut b = GraphBuilder::new();
    for blk in cfg.blocks.values() {
        b.add_vertex(match blk.kind {
            crate::cfg::BlockKind::Plain => VertexKind::Plain,
            crate::cfg::BlockKind::Call => VertexKind::Call,
        });
    }
    let exit = b.add_vertex(VertexKind::Exit);
    let r0 = b.add_vertex(VertexKind::Plain);
    for e in cfg.edges.values() {
        b.add_edge(e.from, e.to);
    }
    b.add_edge(r0, cfg.entry);
    for &c in virtual_exits {
        b.add_edge(c, exit);
    }
    let g = b.finish(r0, exit);
    debug_assert_eq!(g.num_edges(), cfg.edges.len() + 1 + virtual_exits.len());
    g
}

/// The call vertices of `cfg` that get a virtual exit edge: calls that
/// return normally but may not (the callee may end the process).
pub fn virtual_exits(cfg: &Cfg, may_exit: &dyn Fn(&crate::cfg::CallSite) -> bool) -> Vec<BlockId> {
    let mut out: Vec<BlockId> = cfg
        .calls
        .iter()
        .filter(|c| c.returns && !c.tail && may_exit(c))
        .map(|c| c.block)
        .filter(|&b| {
            cfg.edges
                .values()
                .any(|e| e.from == b && e.kind == EdgeKind::CallReturn)
                && !cfg
                    .edges
                    .values()
                    .any(|e| e.from == b && e.to == cfg.exit())
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Places the counters of one procedure; `first` is its first counter.
pub fn place(
    cfg: &Cfg,
    spec: &CountSpec,
    start: u64,
    virtual_exits: Vec<BlockId>,
    first: u32,
) -> Result<ProcCounters, String> {
    if spec.placement == CountPlacement::EveryBlock {
        return Ok(ProcCounters {
            first,
            chords: Vec::new(),
            virtual_exits: Vec::new(),
            every_block: true,
            amounts: Vec::new(),
        });
    }
    let real = cfg.to_graph();
    let base: Weights = match spec.feedback.as_ref().and_then(|f| f.get(&start)) {
        Some((counts, calls)) if counts.len() == cfg.edges.len() => {
            let mut w = SecondaryMap::filled(real.num_edges() + 1, 0.0);
            for (i, &c) in counts.iter().enumerate() {
                w[EdgeId::new(i)] = c as f64;
            }
            w[real.exit_root()] = *calls as f64;
            w
        }
        Some(_) => {
            return Err(format!(
                "the feedback profile's CFG of the procedure at {start:#x} differs from this one"
            ))
        }
        None => heuristic(&real),
    };
    let g = counted_graph(cfg, &virtual_exits);
    let m = cfg.edges.len();
    let top = base.values().fold(1.0f64, |a, &x| a.max(x)) * 4.0 + 1.0;
    let mut w: Weights = SecondaryMap::filled(g.num_edges() + 1, 0.0);
    for i in 0..m {
        w[EdgeId::new(i)] = base[EdgeId::new(i)];
    }
    w[EdgeId::new(m)] = base[real.exit_root()];
    for i in m + 1..g.num_edges() {
        w[EdgeId::new(i)] = top;
    }
    w[g.exit_root()] = base[real.exit_root()];
    let pl = place_counters(&g, &w);
    // Event counting: the same tree, chord increments from the events of
    // each edge (a block's events on its out-edges, a virtual exit edge
    // included: the call block ran; invocations on `R0 -> root`).
    let mut amounts = Vec::new();
    if let Some(ev) = spec.events {
        let mut events: SecondaryMap<EdgeId, i64> = SecondaryMap::filled(g.num_edges() + 1, 0);
        for e in g.edge_ids() {
            let from = g.edge(e).from;
            events[e] = match ev {
                _ if e.index() == m => i64::from(ev == Event::Calls),
                Event::Calls => 0,
                Event::Blocks => 1,
                Event::Insns => cfg.blocks[from].insns.len() as i64,
            };
        }
        let ec = place_event_counters(&g, &w, &events);
        debug_assert_eq!(ec.tree.chords(&g), pl.chords, "one tree for both");
        for &e in &pl.chords {
            amounts
                .push(i32::try_from(ec.inc[e]).map_err(|_| {
                    format!("the event increment of edge {e} does not fit 32 bits")
                })?);
        }
    }
    let mut chords = Vec::with_capacity(pl.chords.len());
    for &e in &pl.chords {
        match e.index() {
            i if i < m => chords.push(Counted::Edge(e)),
            i if i == m => chords.push(Counted::Entry),
            _ => {
                return Err(format!(
                    "the virtual exit edge of the call block {} is not a tree edge",
                    virtual_exits[e.index() - m - 1]
                ))
            }
        }
    }
    Ok(ProcCounters {
        first,
        chords,
        virtual_exits,
        every_block: false,
        amounts,
    })
}

/// The instructions adding `amount` to the counter at `addr` (module
/// comment).
pub fn increment(
    addr: u64,
    amount: i32,
    atomic: bool,
    site: Site,
) -> Result<Vec<Instruction>, String> {
    let err = |e: iced_x86::IcedError| e.to_string();
    let mem = MemoryOperand::with_base_displ_size(Register::RIP, addr as i64, 8);
    let code = if i8::try_from(amount).is_ok() {
        Code::Add_rm64_imm8
    } else {
        Code::Add_rm64_imm32
    };
    let mut add = Instruction::with2(code, mem, amount).map_err(err)?;
    add.set_has_lock_prefix(atomic);
    if !site.flags_live {
        return Ok(vec![add]);
    }
    if let (Some(r), false) = (site.scratch, atomic) {
        let r: Register = r.into();
        return Ok(vec![
            Instruction::with2(Code::Mov_r64_rm64, r, mem).map_err(err)?,
            Instruction::with2(
                Code::Lea_r64_m,
                r,
                MemoryOperand::with_base_displ(r, i64::from(amount)),
            )
            .map_err(err)?,
            Instruction::with2(Code::Mov_rm64_r64, mem, r).map_err(err)?,
        ]);
    }
    let step = |d: i64| {
        Instruction::with2(
            Code::Lea_r64_m,
            Register::RSP,
            MemoryOperand::with_base_displ(Register::RSP, d),
        )
        .map_err(err)
    };
    let mut v = Vec::new();
    if site.red_zone_live {
        v.push(step(-128)?);
    }
    v.push(Instruction::with(Code::Pushfq));
    v.push(add);
    v.push(Instruction::with(Code::Popfq));
    if site.red_zone_live {
        v.push(step(128)?);
    }
    Ok(v)
}

/// The module's preinit entry `init(argc, argv, envp)`, assembled at
/// `rip`: if `AETRACE_COUNTERS_FD=n` is in the environment, maps fd `n` over
/// the `len` bytes of counters at `counters` (link-time addresses, reached
/// relative to `rip`) with `MAP_SHARED|MAP_FIXED` and closes the fd; if that
/// fails, prints a message and exits 125. Without the variable the counters
/// stay private to the process (lost at exit).
pub fn emit_init(rip: u64, counters: u64, len: u64) -> Result<Vec<u8>, String> {
    let delta = i32::try_from(counters as i64 - rip as i64)
        .map_err(|_| "counters out of reach of the init code".to_string())?;
    let len = u32::try_from(len).map_err(|_| "too many counters".to_string())?;
    let asm = || -> Result<Vec<u8>, iced_x86::IcedError> {
        let mut a = CodeAssembler::new(64)?;
        let mut start = a.create_label();
        let mut next_env = a.create_label();
        let mut cmp_loop = a.create_label();
        let mut matched = a.create_label();
        let mut digits = a.create_label();
        let mut map = a.create_label();
        let mut done = a.create_label();
        let mut fail = a.create_label();
        let mut name = a.create_label();
        let mut message = a.create_label();
        let text = b"aetrace: cannot map the profile counters (AETRACE_COUNTERS_FD)\n";
        a.set_label(&mut start)?;
        a.push(rbx)?;
        a.mov(rbx, rdx)?; // envp
        a.set_label(&mut next_env)?;
        a.mov(rsi, qword_ptr(rbx))?;
        a.test(rsi, rsi)?;
        a.jz(done)?;
        a.add(rbx, 8)?;
        a.lea(rdi, ptr(name))?;
        a.set_label(&mut cmp_loop)?;
        a.movzx(eax, byte_ptr(rdi))?;
        a.test(eax, eax)?;
        a.jz(matched)?;
        a.movzx(ecx, byte_ptr(rsi))?;
        a.cmp(eax, ecx)?;
        a.jne(next_env)?;
        a.inc(rdi)?;
        a.inc(rsi)?;
        a.jmp(cmp_loop)?;
        a.set_label(&mut matched)?;
        a.xor(r8d, r8d)?;
        a.xor(r9d, r9d)?;
        a.set_label(&mut digits)?;
        a.movzx(eax, byte_ptr(rsi))?;
        a.sub(eax, b'0' as i32)?;
        a.cmp(eax, 9)?;
        a.ja(map)?;
        a.imul_3(r8d, r8d, 10)?;
        a.add(r8d, eax)?;
        a.inc(rsi)?;
        a.inc(r9d)?;
        a.jmp(digits)?;
        a.set_label(&mut map)?;
        a.test(r9d, r9d)?;
        a.jz(fail)?;
        a.mov(rbx, r8)?;
        a.mov(eax, 9)?; // mmap(counters, len, RW, MAP_SHARED|MAP_FIXED, fd, 0)
        a.lea(rdi, ptr(start))?;
        a.add(rdi, delta)?;
        a.mov(esi, len)?;
        a.mov(edx, 3)?;
        a.mov(r10d, 0x11)?;
        a.xor(r9d, r9d)?;
        a.syscall()?;
        a.cmp(rax, -4095)?;
        a.jae(fail)?;
        a.mov(eax, 3)?; // close(fd)
        a.mov(edi, ebx)?;
        a.syscall()?;
        a.set_label(&mut done)?;
        a.pop(rbx)?;
        a.ret()?;
        a.set_label(&mut fail)?;
        a.mov(eax, 1)?;
        a.mov(edi, 2)?;
        a.lea(rsi, ptr(message))?;
        a.mov(edx, text.len() as u32)?;
        a.syscall()?;
        a.mov(eax, 231)?;
        a.mov(edi, 125)?;
        a.syscall()?;
        a.set_label(&mut name)?;
        a.db(format!("{ENV_FD}=\0").as_bytes())?;
        a.set_label(&mut message)?;
        a.db(text)?;
        a.assemble(rip)
    };
    asm().map_err(|e| e.to_string())
}
