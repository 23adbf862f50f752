//! Counters instead of witnesses: the instrumentation of `aetrace profile`
//! (paper 003 Section 3, "QP" edge profiling, with the early-exit
//! correction of Figure 4).
//!
//! Per traced procedure, the counted graph is the CFG plus
//! - a virtual root `R0` with the edge `R0 -> root` (its count is the
//!   number of invocations; `EXIT -> R0` seeds the spanning tree),
//! - one virtual edge `c -> EXIT` for every call vertex `c` whose frame may
//!   be abandoned while the call is active: the callee may end the process
//!   (an `exit`-like or non-returning call somewhere below it), throw or
//!   `longjmp`. Its derived count is the number of frames left at `c`
//!   (Figure 4's edge, derived instead of reported);
//! - one virtual edge `R0 -> pad` for every C++ landing pad: the unwinder
//!   enters the frame there, without a CFG edge (a frame that catches is
//!   two paths, root to `c -> EXIT` and `R0 -> pad` to EXIT). It weighs
//!   nothing, so it is normally a chord, counted in the pad's entry stub
//!   (which only the unwinder runs);
//! - for every call `c` to `setjmp`, a vertex `S` splitting its return
//!   edge: `c -> S` (first returns; counted before the call when it is a
//!   chord), `R0 -> S` (returns through `longjmp`, derived) and `S -> r`
//!   (every return, counted at the return point). The frame a `longjmp`
//!   abandons at `c'` is again two paths: to `c' -> EXIT`, and from
//!   `R0 -> S`.
//!
//! Derived edges (`c -> EXIT`, `R0 -> S`) weigh more than any real edge,
//! so they are always tree edges and never need a counter; each costs one
//! counter on the cheapest edge of its cycle. A procedure without calls
//! that may unwind, landing pads or `setjmp` calls gets the plain QP
//! placement.
//!
//! Counters go on the chords of the maximum spanning tree of that graph
//! (`graph::profile::place_counters`); a chord `R0 -> root` is counted on
//! the copy's invocation label (every call and outside entry passes it,
//! loops back to the entry block do not). `--placement every-block`
//! counts every block instead (pixie, "slow" QP: block counts only).
//!
//! Counters are 8-byte words in a page-aligned RW segment of the rewritten
//! module; the module's first-run entry ([`emit_init`]: the executable's
//! preinit, a library's first constructor, called by a new entry point in
//! a static executable, [`emit_static_entry`]) maps the recorder's memfd (one
//! per module) over it (`MAP_SHARED|MAP_FIXED`) so that the counts survive
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
//! `--stop-at N` ([`StopChecks`], paper 002's on-line queries): the counter
//! starts at `-N`; every returning call adds its query increment
//! `phi(c) + events(c)` before the call and takes it back after, so that
//! before block `v` of the innermost frame runs, `N + counter + phi(v)`
//! events have happened; a check `counter + phi(v) + events(v) >= 0` at
//! each block entry (calls: at the invocation) finds the block of event N,
//! and `codegen` traps at its instruction's original address
//! (docs/profile.md, "Stopping at the N-th event"). Exact across C++
//! exceptions (a throw leaves frames only at calls with a virtual exit
//! edge, whose query increment is 0; a landing pad's entry adds
//! `R0 -> pad`'s increment); not with `longjmp` (refused at rewrite time;
//! in a static executable a longjmp call ends the program instead),
//! signal handlers or a second thread in traced code (the program ends
//! with status 125 when one enters it).
//!
//! Invariants: derived edges are tree edges in every placement this module
//! returns (checked, else the procedure is refused); every chord is a
//! [`Counted`] with a place in the code; counter numbers are
//! dense, per procedure contiguous from [`ProcCounters::first`].

use std::collections::HashMap;

pub use aetrace_graph::counted::{Counted, CountedEdge, Virtual};
use aetrace_graph::events::place_event_counters;
use aetrace_graph::profile::place_counters;
use aetrace_graph::weights::{heuristic, Weights};
use aetrace_graph::{BlockId, EdgeId, EntityRef, Graph, SecondaryMap, VertexKind};
use aetrace_runtime::Site;
use iced_x86::code_asm::{
    byte_ptr, eax, ebx, ecx, edi, edx, esi, ptr, qword_ptr, r10d, r12, r8, r8d, r9d, rax, rbx, rdi,
    rdx, rsi, CodeAssembler,
};
use iced_x86::{Code, Instruction, MemoryOperand, Register};

use crate::codegen::CodegenError;
use aetrace_analysis::cfg::{Cfg, EdgeKind};

/// Why counter placement or path numbering failed for a procedure.
#[derive(Debug, thiserror::Error)]
pub enum CounterError {
    /// The counted graph could not be built (`Virtual::graph`'s message).
    #[error("{0}")]
    Graph(String),
    /// Path numbering failed.
    #[error(transparent)]
    Paths(#[from] aetrace_graph::Error),
    /// The feedback profile's CFG of the procedure at this address is another one.
    #[error("the feedback profile's CFG of the procedure at {0:#x} differs from this one")]
    FeedbackMismatch(u64),
    /// The event increment of this chord does not fit 32 bits.
    #[error("the event increment of edge {0} does not fit 32 bits")]
    EventIncrement(EdgeId),
    /// A chord of the counted graph is not one of its derived edges (a bug).
    #[error("the derived edge {0:?} is not a tree edge")]
    NotTreeEdge(Option<CountedEdge>),
    /// The spanning tree lacks `EXIT -> R0`, which `--stop-at` needs.
    #[error("the spanning tree does not hold EXIT -> R0 (stop-at needs it)")]
    StopTree,
    /// A stop-at query does not fit 32 bits.
    #[error("the stop-at query of {0} does not fit 32 bits")]
    StopQuery(QueryAt),
}

/// Where a stop-at query is checked ([`CounterError::StopQuery`]).
#[derive(Debug, Clone, Copy)]
pub enum QueryAt {
    /// At the procedure's entry.
    Entry,
    /// At the end of this block.
    Block(BlockId),
    /// Around the call ending this block.
    Call(BlockId),
}

impl std::fmt::Display for QueryAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueryAt::Entry => write!(f, "the entry"),
            QueryAt::Block(b) => write!(f, "block {b}"),
            QueryAt::Call(b) => write!(f, "the call in block {b}"),
        }
    }
}

/// Environment variable naming the counter memfd of the executable (set by
/// `aetrace profile`); a library with module tag `t` reads [`env_fd`]`(t)`.
pub const ENV_FD: &str = "AETRACE_COUNTERS_FD";

/// `--stop-at`: offset in the counter page of the word holding the first
/// thread's `fs:[0]` (stored by [`emit_init`], compared by the outside-entry
/// guard; 0 until the preinit ran), after the event counter.
pub const STOP_OWNER: u64 = 8;

/// `--stop-at`: offset of the word whose bit 0 the first thread that
/// refuses takes (`lock bts`), so that one message is written however
/// many threads reach the guard at once (0 at the start).
pub const STOP_REFUSED: u64 = 16;

/// The variable naming the counter memfd of module `tag` (0: the
/// executable, else a `--libs` library).
pub fn env_fd(tag: u32) -> String {
    if tag == 0 {
        ENV_FD.to_string()
    } else {
        format!("{ENV_FD}{tag}")
    }
}

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

impl Event {
    /// The event's name on the command line and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Event::Insns => "insns",
            Event::Blocks => "blocks",
            Event::Calls => "calls",
        }
    }
}

/// What `aetrace profile` / `aetrace count` ask of the rewriter.
#[derive(Clone, Debug, Default)]
pub struct CountSpec {
    /// Where the counters go (which edges get one).
    pub placement: CountPlacement,
    /// Edge counts of an earlier run, to place counters on cold edges.
    pub feedback: Option<Feedback>,
    /// Event counting: one program-wide counter (slot 0) to which each
    /// chord adds its increment, instead of a counter per chord.
    pub events: Option<Event>,
    /// Another module of the process starts threads: `lock add` even if
    /// this one imports no thread starter.
    pub threads: bool,
    /// With `events`: raise SIGTRAP at the N-th event (`--stop-at N`,
    /// [`StopChecks`]).
    pub stop_at: Option<u64>,
    /// Path profiling (`aetrace paths`, [`super::pathprof`]): path
    /// counters, edge counters only where a procedure has too many paths.
    pub paths: bool,
}

/// The on-line queries of `--stop-at` (paper 002) in one procedure: the
/// counter starts at `-N`, so "event N is reached" is `counter + t >= 0`
/// for a per-site constant `t`.
#[derive(Clone, Debug, Default)]
pub struct StopChecks {
    /// Per block: `t = phi(v) + events(v)`, checked at the block's entry
    /// (insns, blocks); the N-th event is in the block when the check holds.
    pub block: Vec<Option<i64>>,
    /// Calls: `t = phi(root)`, checked once the invocation is counted.
    pub entry: Option<i64>,
    /// Per block: the query increment `phi(c) + events(c)` a returning call
    /// adds before the call and takes back after it (0: none).
    pub call: Vec<i64>,
    /// Per block: `phi(v)`; with insns, event N is instruction
    /// `-(counter + phi(v)) - 1` of the block whose check holds.
    pub phi: Vec<i64>,
}

/// The counters of one procedure.
#[derive(Clone, Debug, Default)]
pub struct ProcCounters {
    /// First counter index.
    pub first: u32,
    /// Optimal placement: the counted edges, counter `first + i` for the i-th.
    pub chords: Vec<Counted>,
    /// The virtual edges of the counted graph.
    pub virt: Virtual,
    /// Every-block placement: counter `first + i` counts block `i`.
    pub every_block: bool,
    /// Event counting: the increment of each chord (paper 002's `Inc`).
    pub amounts: Vec<i32>,
    /// `--stop-at`: the checks and query increments.
    pub stop: Option<StopChecks>,
    /// The procedure's calls (for the callgrind `calls=` lines).
    pub calls: Vec<CallOut>,
}

/// A call site: its block, the callee's address for a direct or PLT call,
/// the import's name when known, and whether it is a tail call (`jmp`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallOut {
    /// The call block.
    pub block: BlockId,
    /// Callee address (link-time) of a direct or PLT call; `None` if indirect.
    pub target: Option<u64>,
    /// The imported symbol called through the PLT or GOT, when known.
    pub import: Option<String>,
    /// A tail call (`jmp`) rather than a `call`.
    pub tail: bool,
}

fn calls_of(cfg: &Cfg) -> Vec<CallOut> {
    cfg.calls
        .iter()
        .filter(|c| c.kind != aetrace_analysis::cfg::CallKind::Syscall)
        .map(|c| CallOut {
            block: c.block,
            target: c.target,
            import: c.name.clone(),
            tail: c.tail,
        })
        .collect()
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

/// The counted graph of `cfg` (module comment, [`Virtual`]).
pub fn counted_graph(cfg: &Cfg, virt: &Virtual) -> Result<Graph, CounterError> {
    let kinds: Vec<VertexKind> = cfg
        .blocks
        .values()
        .map(|blk| match blk.kind {
            aetrace_analysis::cfg::BlockKind::Plain => VertexKind::Plain,
            aetrace_analysis::cfg::BlockKind::Call => VertexKind::Call,
        })
        .collect();
    let edges: Vec<(BlockId, BlockId, bool)> = cfg
        .edges
        .values()
        .map(|e| (e.from, e.to, e.kind == EdgeKind::CallReturn))
        .collect();
    virt.graph(&kinds, cfg.entry, &edges)
        .map_err(CounterError::Graph)
}

/// The call vertices of `cfg` that get a virtual exit edge: calls that
/// return normally but may not (the callee may end the process, throw or
/// `longjmp`).
pub fn virtual_exits(
    cfg: &Cfg,
    may_exit: &dyn Fn(&aetrace_analysis::cfg::CallSite) -> bool,
) -> Vec<BlockId> {
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
    virt: Virtual,
    first: u32,
) -> Result<ProcCounters, CounterError> {
    if spec.placement == CountPlacement::EveryBlock {
        return Ok(ProcCounters {
            first,
            chords: Vec::new(),
            virt: Virtual::default(),
            every_block: true,
            amounts: Vec::new(),
            calls: calls_of(cfg),
            stop: None,
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
        Some(_) => return Err(CounterError::FeedbackMismatch(start)),
        None => heuristic(&real),
    };
    let g = counted_graph(cfg, &virt)?;
    let m = cfg.edges.len();
    let top = base.values().fold(1.0f64, |a, &x| a.max(x)) * 4.0 + 1.0;
    let mut w: Weights = SecondaryMap::filled(g.num_edges() + 1, 0.0);
    // Derived edges weigh more than any real one (always in the tree);
    // landing pads weigh nothing (exceptions are rare: counting at the
    // pad's entry is the cheapest place); `S -> r` weighs as the call's
    // return edge.
    let return_edge = |c: BlockId| {
        cfg.edges
            .iter()
            .find(|(_, e)| e.from == c && e.kind == EdgeKind::CallReturn)
            .map_or(0.0, |(e, _)| base[e])
    };
    for e in g.edge_ids() {
        w[e] = match virt.classify(m, e).expect("an edge of the graph") {
            CountedEdge::Cfg(e) => base[e],
            CountedEdge::Entry => base[real.exit_root()],
            CountedEdge::Exit(_) | CountedEdge::SecondReturn(_) => top,
            CountedEdge::Landing(_) => 0.0,
            CountedEdge::Resume(c) => return_edge(c),
        };
    }
    w[g.exit_root()] = base[real.exit_root()];
    let pl = place_counters(&g, &w);
    // Event counting: the same tree, chord increments from the events of
    // each edge (a block's events on its out-edges, a virtual exit edge
    // included: the call block ran; invocations on `R0 -> root`; edges
    // out of `R0` and `S` carry none).
    let mut amounts = Vec::new();
    let mut stop = None;
    if let Some(ev) = spec.events {
        let mut events: SecondaryMap<EdgeId, i64> = SecondaryMap::filled(g.num_edges() + 1, 0);
        for e in g.edge_ids() {
            let from = g.edge(e).from;
            events[e] = match (ev, cfg.blocks.get(from)) {
                _ if e.index() == m => i64::from(ev == Event::Calls),
                (Event::Calls, _) | (_, None) => 0,
                (Event::Blocks, Some(_)) => 1,
                (Event::Insns, Some(b)) => b.insns.len() as i64,
            };
        }
        let ec = place_event_counters(&g, &w, &events);
        debug_assert_eq!(ec.tree.chords(&g), pl.chords, "one tree for both");
        for &e in &pl.chords {
            amounts.push(i32::try_from(ec.inc[e]).map_err(|_| CounterError::EventIncrement(e))?);
        }
        if spec.stop_at.is_some() {
            stop = Some(stop_checks(cfg, &g, &ec.query, ev)?);
        }
    }
    let mut chords = Vec::with_capacity(pl.chords.len());
    for &e in &pl.chords {
        match virt.counted(m, e) {
            Some(c) => chords.push(c),
            None => return Err(CounterError::NotTreeEdge(virt.classify(m, e))),
        }
    }
    debug_assert!(chords
        .iter()
        .zip(&pl.chords)
        .all(|(&c, &e)| virt.edge_of(m, c) == Some(e)));
    Ok(ProcCounters {
        first,
        chords,
        virt,
        every_block: false,
        amounts,
        calls: calls_of(cfg),
        stop,
    })
}

/// The `--stop-at` checks of one procedure from the potentials `phi` of
/// its counted graph `g` (invariant of `graph::events`: before block `v`
/// of the innermost frame runs, `counter + phi(v)` events happened, once
/// every returning call adds `phi(c) + events(c)` around itself).
fn stop_checks(
    cfg: &Cfg,
    g: &Graph,
    phi: &SecondaryMap<BlockId, i64>,
    ev: Event,
) -> Result<StopChecks, CounterError> {
    // `EXIT -> R0` is a tree edge without events: every path out of a
    // frame leaves the counter exact for the caller.
    if phi[g.exit()] != 0 || phi[g.entry()] != 0 {
        return Err(CounterError::StopTree);
    }
    let events = |b: BlockId| -> i64 {
        match ev {
            Event::Insns => cfg.blocks[b].insns.len() as i64,
            Event::Blocks => 1,
            Event::Calls => 0,
        }
    };
    let fits = |t: i64, at: QueryAt| -> Result<Option<i64>, CounterError> {
        i32::try_from(t)
            .map(|_| Some(t))
            .map_err(|_| CounterError::StopQuery(at))
    };
    let mut s = StopChecks {
        block: vec![None; cfg.blocks.len()],
        entry: None,
        call: vec![0; cfg.blocks.len()],
        phi: cfg.blocks.keys().map(|b| phi[b]).collect(),
    };
    match ev {
        Event::Calls => s.entry = fits(phi[cfg.entry], QueryAt::Entry)?,
        Event::Insns | Event::Blocks => {
            for b in cfg.blocks.keys() {
                s.block[b.index()] = fits(phi[b] + events(b), QueryAt::Block(b))?;
            }
        }
    }
    for e in cfg
        .edges
        .values()
        .filter(|e| e.kind == EdgeKind::CallReturn)
    {
        let b = e.from;
        let q = phi[b] + events(b);
        s.call[b.index()] = fits(q, QueryAt::Call(b))?.unwrap_or(0);
    }
    Ok(s)
}

/// The instructions adding `amount` to the counter at `addr` (module
/// comment).
pub fn increment(
    addr: u64,
    amount: i32,
    atomic: bool,
    site: Site,
) -> Result<Vec<Instruction>, CodegenError> {
    let mem = MemoryOperand::with_base_displ_size(Register::RIP, addr as i64, 8);
    let code = if i8::try_from(amount).is_ok() {
        Code::Add_rm64_imm8
    } else {
        Code::Add_rm64_imm32
    };
    let mut add = Instruction::with2(code, mem, amount)?;
    add.set_has_lock_prefix(atomic);
    if !site.flags_live {
        return Ok(vec![add]);
    }
    if let (Some(r), false) = (site.scratch, atomic) {
        let r: Register = r.into();
        return Ok(vec![
            Instruction::with2(Code::Mov_r64_rm64, r, mem)?,
            Instruction::with2(
                Code::Lea_r64_m,
                r,
                MemoryOperand::with_base_displ(r, i64::from(amount)),
            )?,
            Instruction::with2(Code::Mov_rm64_r64, mem, r)?,
        ]);
    }
    let step = super::codegen::rsp_step;
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

/// The module's first-run entry `init(argc, argv, envp)` (the executable's
/// first DT_PREINIT_ARRAY entry, a library's first DT_INIT_ARRAY entry),
/// assembled at `rip`: if `VAR=n` is in the environment (`VAR` is
/// [`env_fd`] of the module's tag), copies the counters made so far (a
/// library's code can run before its constructors) to fd `n` with
/// `pwrite`, maps fd `n` over the `len` bytes of counters at `counters`
/// (link-time addresses, reached relative to `rip`) with
/// `MAP_SHARED|MAP_FIXED`, closes the fd and renames the variable in place
/// (`_ETRACE...`: a program this process execs must not take another file
/// that got the number for its counters); if that fails, prints a message
/// and exits 125. Without the variable the counters stay private to the
/// process (lost at exit). With `owner` (`--stop-at`), it then stores the
/// calling thread's `fs:[0]` (glibc's TCB self pointer) at that address:
/// the executable's preinit runs in the first thread, the only one
/// allowed to run counted code (`codegen`'s outside-entry guard).
pub fn emit_init(
    rip: u64,
    counters: u64,
    len: u64,
    var: &str,
    owner: Option<u64>,
) -> Result<Vec<u8>, CodegenError> {
    let delta = i32::try_from(counters as i64 - rip as i64)
        .map_err(|_| CodegenError::InitLayout("counters out of reach of the init code"))?;
    let owner_delta = owner
        .map(|o| i32::try_from(o as i64 - rip as i64))
        .transpose()
        .map_err(|_| {
            CodegenError::InitLayout("the thread owner word out of reach of the init code")
        })?;
    // Below 2^31: `cmp rax, len` sign-extends its immediate.
    let len = u32::try_from(len)
        .ok()
        .filter(|&l| l <= i32::MAX as u32)
        .ok_or(CodegenError::InitLayout("too many counters"))?;
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
        let text = format!("aetrace: cannot map the profile counters ({var})\n");
        let text = text.as_bytes();
        a.set_label(&mut start)?;
        a.push(rbx)?;
        a.push(r12)?;
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
        a.mov(r12, qword_ptr(rbx - 8))?; // the variable, renamed below
        a.mov(rbx, r8)?;
        a.mov(eax, 18)?; // pwrite64(fd, counters, len, 0)
        a.mov(edi, ebx)?;
        a.lea(rsi, ptr(start))?;
        a.add(rsi, delta)?;
        a.mov(edx, len)?;
        a.xor(r10d, r10d)?;
        a.syscall()?;
        a.cmp(rax, len as i32)?;
        a.jne(fail)?;
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
        a.mov(byte_ptr(r12), b'_' as i32)?;
        a.set_label(&mut done)?;
        if let Some(d) = owner_delta {
            // After the mapping: the word is in the shared counter page.
            let fs0 =
                MemoryOperand::new(Register::None, Register::None, 1, 0, 4, false, Register::FS);
            a.add_instruction(Instruction::with2(Code::Mov_r64_rm64, Register::RAX, fs0)?)?;
            a.lea(rdi, ptr(start))?;
            a.add(rdi, d)?;
            a.mov(qword_ptr(rdi), rax)?;
        }
        a.pop(r12)?;
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
        a.db(format!("{var}=\0").as_bytes())?;
        a.set_label(&mut message)?;
        a.db(text)?;
        a.assemble(rip)
    };
    Ok(asm()?)
}

/// A static executable's new entry point in counting mode, assembled at
/// `rip`: there is no DT_PREINIT_ARRAY (no ld.so runs one), so it calls the
/// module's `init(argc, argv, envp)` ([`emit_init`], or the path state's
/// initialiser that ends in it) with the arguments read from the initial
/// stack (`[rsp]` = argc, argv from `rsp+8`, envp after argv's NULL), then
/// jumps to `then`, the copy of the entry procedure. Nothing else has run
/// yet (static-PIE: not even the self-relocation; `fs` has no TLS block),
/// so `init` must not need either. Every register and the flags are
/// preserved, `rdx` (the ELF ABI's `atexit` function) and `rsp` included:
/// only memory below `rsp` is used.
pub fn emit_static_entry(rip: u64, init: u64, then: u64) -> Result<Vec<u8>, CodegenError> {
    use iced_x86::code_asm::{r10, r11, r9, rcx, rsp, AsmRegister64};
    // What `init` may clobber (it keeps rbx, r12 and up itself); the
    // flags are pushed last.
    const SAVED: [AsmRegister64; 9] = [rax, rcx, rdx, rsi, rdi, r8, r9, r10, r11];
    let asm = || -> Result<Vec<u8>, iced_x86::IcedError> {
        let mut a = CodeAssembler::new(64)?;
        for r in SAVED {
            a.push(r)?;
        }
        a.pushfq()?;
        let argc = 8 * (SAVED.len() as i32 + 1);
        a.mov(rdi, qword_ptr(rsp + argc))?;
        a.lea(rsi, ptr(rsp + argc + 8))?;
        a.lea(rdx, ptr(rsi + rdi * 8 + 8))?;
        a.call(init)?;
        a.popfq()?;
        for r in SAVED.iter().rev() {
            a.pop(*r)?;
        }
        a.jmp(then)?;
        a.assemble(rip)
    };
    Ok(asm()?)
}
