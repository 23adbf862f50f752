//! `aetrace verify --profile PROFILE [-- PROGRAM ARGS]`: paper 004's own
//! use (Section 3.1). The ORIGINAL program runs under the block follower;
//! every block entered and every CFG edge taken is counted per procedure,
//! and at the end each count is compared with the one the profile recovered
//! (`aetrace profile`, `profile/src/lib.rs`): the paper's "decrement each
//! edge's count as it is taken, report every edge left non-zero", kept as
//! two counts so the report shows both. Blocks executed that the profile
//! does not have are the paper's case (b), transitions between its blocks
//! that it has no edge for are case (c).
//!
//! The graph checked is the profile's own (its blocks, by link-time start,
//! and its `[from, to, kind]` edges); the verifier only decodes the last
//! instruction of each block from the original file, to know whether
//! control left the block by a call, a return or anything else (the paper's
//! cached "kind of the last instruction", Section 3.2). Edges inside a
//! procedure are recognised per thread with a stack of pending calls:
//! a call pushes its return point; the `return_from_call` edge is taken
//! when control comes back there (from a return, or from code that is not
//! followed: a library); an edge to EXIT is taken by a return, a tail call
//! (a jump to another procedure or out of the module), a call that the
//! profile says does not return, or a halt. A signal saves the interrupted
//! block and the stack depth; the block is resumed when its handler has
//! returned to that depth.
//!
//! Invariants: a block's out-edge is resolved exactly once, when the
//! thread's next block arrives (or at the end, for a call that does not
//! return); frames are only popped by a return to their return point or by
//! control landing in a procedure deeper in the stack (`longjmp`, an
//! exception's landing pad); "exact" needs every counted procedure's block
//! and edge counts equal, no case (b) or (c), and no lost position.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use aetrace_analysis::elf;
use aetrace_analysis::lines::Lines;
use aetrace_profile::{ProcProfile, Profile};
use iced_x86::{Decoder, DecoderOptions, FlowControl};

use crate::{Arrival, Error, Event, Observer, Options, Outcome, Pid};

/// What `aetrace verify --profile` was asked for.
#[derive(Clone, Debug, Default)]
pub struct ProfileOptions {
    /// The profile to check.
    pub profile: PathBuf,
    /// The program's stdin (default: ours).
    pub stdin: Option<PathBuf>,
    /// `PROGRAM ARGS...` (default: the profile's program and arguments).
    pub command: Vec<OsString>,
    /// Do not pin the follower and the program to one CPU
    /// (`Options::no_pin`).
    pub no_pin: bool,
}

/// How control leaves a block: by its last instruction.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Exit {
    Call,
    Ret,
    Other,
}

/// One block of the profile.
#[derive(Clone, Debug)]
struct Blk {
    start: u64,
    /// Address after the last instruction (the return point of a call).
    end: u64,
    proc: u32,
    idx: u32,
    exit: Exit,
}

/// Where a thread is: a block of the profile, or an address no block of
/// the profile starts at (case (b)), seen as the rest of the block that
/// contains it.
#[derive(Copy, Clone, Debug)]
struct Loc {
    addr: u64,
    /// Index into `Graph::blocks` (the block itself, or the one containing
    /// `addr` for a missing block).
    blk: Option<u32>,
    known: bool,
}

#[derive(Copy, Clone, Debug)]
struct Frame {
    call: Loc,
    ret: u64,
}

#[derive(Default)]
struct ThreadState {
    /// The block entered last, whose way out is not resolved yet.
    cur: Option<Loc>,
    frames: Vec<Frame>,
    /// Blocks interrupted by a signal, with the stack depth at the time.
    interrupted: Vec<(Option<Loc>, usize)>,
}

/// The profile's graph and what the run did on it.
struct Graph<'p> {
    profile: &'p Profile,
    blocks: Vec<Blk>,
    by_start: HashMap<u64, u32>,
    /// `(proc, from, to)` -> edge index; `to == blocks.len()` is EXIT.
    edges: HashMap<(u32, u32, u32), u32>,
    seen_blocks: Vec<Vec<u64>>,
    seen_edges: Vec<Vec<u64>>,
    /// Case (b): address -> times entered.
    missing_blocks: BTreeMap<u64, u64>,
    /// Case (c): `(from, to)` (link-time starts; `None`: EXIT) -> times taken.
    missing_edges: BTreeMap<(u64, Option<u64>), u64>,
    threads: HashMap<Pid, ThreadState>,
    /// C++ landing pads (from the LSDAs): the unwinder enters them, even
    /// at the return point of a call that does not return (`__cxa_throw`).
    pads: HashSet<u64>,
    /// Defects the follower reported against its own CFG.
    follower_defects: Vec<String>,
    forks: u64,
}

impl<'p> Graph<'p> {
    fn new(profile: &'p Profile, elf: &elf::Module) -> Result<Self, Error> {
        let mut blocks = Vec::new();
        let mut by_start = HashMap::new();
        let mut edges = HashMap::new();
        for (pi, p) in profile.procs.iter().enumerate() {
            let n = p.blocks.len() as u32;
            for (bi, b) in p.blocks.iter().enumerate() {
                let last = b.start + u64::from(*b.insns.last().unwrap_or(&0));
                // At most 15 bytes, fewer at the end of a section.
                let insn = (1..=15)
                    .rev()
                    .find_map(|len| elf.bytes_at(last, len))
                    .map(|bytes| Decoder::with_ip(64, bytes, last, DecoderOptions::NONE).decode())
                    .filter(|i| !i.is_invalid())
                    .ok_or_else(|| {
                        Error::Profile(format!(
                            "the profile's block {:#x} of {} is not code in {} (another binary?)",
                            b.start,
                            p.name,
                            elf.path.display()
                        ))
                    })?;
                let exit = match insn.flow_control() {
                    // A system call comes back to the next block like any
                    // other edge (`return_from_call` in the CFG).
                    _ if aetrace_analysis::procs::is_syscall(&insn) => Exit::Other,
                    FlowControl::Call | FlowControl::IndirectCall => Exit::Call,
                    FlowControl::Return => Exit::Ret,
                    _ => Exit::Other,
                };
                let i = blocks.len() as u32;
                if by_start.insert(b.start, i).is_some() {
                    return Err(Error::Profile(format!(
                        "the profile has two blocks at {:#x}",
                        b.start
                    )));
                }
                blocks.push(Blk {
                    start: b.start,
                    end: insn.next_ip(),
                    proc: pi as u32,
                    idx: bi as u32,
                    exit,
                });
            }
            for (ei, &(f, t, _)) in p.edges.iter().enumerate() {
                if f >= n || t > n {
                    return Err(Error::Profile(format!(
                        "the profile's procedure {} has an edge {f} -> {t} outside its {n} blocks",
                        p.name
                    )));
                }
                edges.insert((pi as u32, f, t), ei as u32);
            }
        }
        Ok(Graph {
            seen_blocks: profile
                .procs
                .iter()
                .map(|p| vec![0; p.blocks.len()])
                .collect(),
            seen_edges: profile
                .procs
                .iter()
                .map(|p| vec![0; p.edges.len()])
                .collect(),
            profile,
            blocks,
            by_start,
            edges,
            missing_blocks: BTreeMap::new(),
            missing_edges: BTreeMap::new(),
            threads: HashMap::new(),
            pads: aetrace_analysis::lsda::call_site_pads(elf)
                .into_iter()
                .map(|(_, _, pad)| pad)
                .collect(),
            follower_defects: Vec::new(),
            forks: 0,
        })
    }

    fn locate(&self, addr: u64) -> Loc {
        if let Some(&i) = self.by_start.get(&addr) {
            return Loc {
                addr,
                blk: Some(i),
                known: true,
            };
        }
        // The innermost profile block around `addr` (starts are not sorted
        // in `blocks`; a missing block is rare, so a scan is fine).
        let blk = self
            .blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.start < addr && addr < b.end)
            .max_by_key(|(_, b)| b.start)
            .map(|(i, _)| i as u32);
        Loc {
            addr,
            blk,
            known: false,
        }
    }

    fn proc_of(&self, l: &Loc) -> Option<u32> {
        l.blk.map(|i| self.blocks[i as usize].proc)
    }

    fn exit_of(&self, l: &Loc) -> Exit {
        l.blk.map_or(Exit::Other, |i| self.blocks[i as usize].exit)
    }

    fn end_of(&self, l: &Loc) -> Option<u64> {
        l.blk.map(|i| self.blocks[i as usize].end)
    }

    /// The profile's edge from `from` to `to` (`None`: EXIT), if it has one.
    fn edge(&self, from: &Loc, to: Option<&Loc>) -> Option<(u32, u32)> {
        if !from.known {
            return None;
        }
        let f = &self.blocks[from.blk? as usize];
        let n = self.profile.procs[f.proc as usize].blocks.len() as u32;
        let t = match to {
            None => n,
            Some(t) if t.known => {
                let tb = &self.blocks[t.blk? as usize];
                if tb.proc != f.proc {
                    return None;
                }
                tb.idx
            }
            Some(_) => return None,
        };
        self.edges.get(&(f.proc, f.idx, t)).map(|&e| (f.proc, e))
    }

    /// Counts the transition `from -> to` (`None`: EXIT): on the profile's
    /// edge, or as a case (c) edge.
    fn take(&mut self, from: &Loc, to: Option<&Loc>) {
        match self.edge(from, to) {
            Some((p, e)) => self.seen_edges[p as usize][e as usize] += 1,
            None => {
                // Transitions out of a procedure the profile does not count,
                // or out of a case (b) block (already reported), say nothing
                // more.
                let counted = from
                    .blk
                    .is_some_and(|i| self.counted(self.blocks[i as usize].proc));
                if from.known && counted {
                    *self
                        .missing_edges
                        .entry((from.addr, to.map(|t| t.addr)))
                        .or_default() += 1;
                }
            }
        }
    }

    fn counted(&self, proc: u32) -> bool {
        let p = &self.profile.procs[proc as usize];
        p.left_alone.is_none()
    }

    /// Resolves how the thread left `p` for `b`, then where `b` sits on the
    /// thread's stack.
    fn arrive(&mut self, tid: Pid, b: Loc, arrival: Arrival) {
        let mut th = self.threads.remove(&tid).unwrap_or_default();
        let mut p = th.cur.take();
        // A signal that ran no followed handler (ignored, default action,
        // or a handler outside the module): the interrupted block goes on.
        if p.is_none() && arrival == Arrival::Flow {
            if let Some(&(saved, depth)) = th.interrupted.last() {
                if depth == th.frames.len() {
                    th.interrupted.pop();
                    p = saved;
                }
            }
        }
        self.resolve(&mut th, p, b, arrival);
        th.cur = Some(b);
        self.threads.insert(tid, th);
    }

    fn resolve(&mut self, th: &mut ThreadState, p: Option<Loc>, b: Loc, arrival: Arrival) {
        let same_proc = |g: &Self, p: &Loc| g.proc_of(p).is_some() && g.proc_of(p) == g.proc_of(&b);
        // Did control come back to `b` (a return, or code we do not follow)?
        let mut returned = arrival != Arrival::Flow;
        if let Some(p) = p {
            match self.exit_of(&p) {
                Exit::Call => self.call(th, p),
                Exit::Ret => {
                    self.take(&p, None);
                    returned = true;
                }
                Exit::Other => {
                    // Flow to a block the profile lacks is a case (c) edge
                    // to it.
                    if self.edge(&p, Some(&b)).is_some()
                        || (arrival == Arrival::Flow && (same_proc(self, &p) || !b.known))
                    {
                        self.take(&p, Some(&b));
                        returned = false;
                    } else {
                        // A tail call: to another procedure, or out of the
                        // module.
                        self.take(&p, None);
                    }
                }
            }
        }
        if !returned {
            return;
        }
        let entry = b.blk.is_some_and(|i| {
            let blk = &self.blocks[i as usize];
            b.known && self.profile.procs[blk.proc as usize].entry == blk.idx
        });
        if entry && arrival != Arrival::Flow {
            // A procedure entered from code we do not follow: a callback, a
            // signal handler, a new thread (also when it starts right after
            // a call that does not return, whose return point it is).
            return;
        }
        // A return point, unless the unwinder landed there (a landing pad
        // that is no return of the call before it).
        let landing = arrival != Arrival::Flow && self.pads.contains(&b.addr);
        let is_return = |g: &Self, f: &Frame| {
            f.ret == b.addr && !(landing && g.edge(&f.call, Some(&b)).is_none())
        };
        let floor = th.interrupted.last().map_or(0, |&(_, d)| d);
        if let Some(k) = th.frames[floor..].iter().rposition(|f| is_return(self, f)) {
            return self.pop_to(th, floor + k, &b);
        }
        // Back from a signal handler to the block it interrupted.
        if th.frames.len() == floor {
            if let Some((saved, _)) = th.interrupted.pop() {
                return self.resolve(th, saved, b, arrival);
            }
        }
        // A return point below a handler (`siglongjmp` out of it).
        if let Some(k) = th.frames.iter().rposition(|f| is_return(self, f)) {
            return self.pop_to(th, k, &b);
        }
        // Landed in a procedure deeper in the stack (`longjmp`, a landing
        // pad): its frames above are abandoned, as the profile's virtual
        // exit edges count them.
        if let Some(pb) = self.proc_of(&b) {
            if let Some(k) = th
                .frames
                .iter()
                .rposition(|f| self.proc_of(&f.call) == Some(pb))
            {
                th.frames.truncate(k);
            }
        }
        Self::forget_handlers(th);
    }

    /// Control came back to the return point of frame `k`: the frames
    /// above it were abandoned, its call's `return_from_call` edge is taken.
    fn pop_to(&mut self, th: &mut ThreadState, k: usize, b: &Loc) {
        let f = th.frames[k];
        th.frames.truncate(k);
        Self::forget_handlers(th);
        self.take(&f.call, Some(b));
    }

    /// Handlers whose frames were left (by `longjmp`) no longer wait for
    /// their return.
    fn forget_handlers(th: &mut ThreadState) {
        let depth = th.frames.len();
        th.interrupted.retain(|&(_, d)| d <= depth);
    }

    /// `p` ends with a call that was executed: its return point waits on
    /// the stack; a call the profile says does not return takes its edge to
    /// EXIT now.
    fn call(&mut self, th: &mut ThreadState, p: Loc) {
        let exit_edge = self.edge(&p, None);
        if let Some((proc, e)) = exit_edge {
            self.seen_edges[proc as usize][e as usize] += 1;
        }
        if let Some(ret) = self.end_of(&p) {
            th.frames.push(Frame { call: p, ret });
        }
    }

    /// The thread ended in or after its last block: a call there (`exit`)
    /// was executed, a return (out of `_fini`) too, and a block whose one
    /// way out leaves the procedure took it (a halt), as the profile's flow
    /// conservation counts it.
    fn finish(&mut self, tid: Pid) {
        let Some(mut th) = self.threads.remove(&tid) else {
            return;
        };
        let Some(p) = th.cur.take() else { return };
        match self.exit_of(&p) {
            Exit::Call => self.call(&mut th, p),
            Exit::Ret => self.take(&p, None),
            Exit::Other => {
                let Some(b) = p.blk.filter(|_| p.known) else {
                    return;
                };
                let blk = &self.blocks[b as usize];
                let pp = &self.profile.procs[blk.proc as usize];
                let mut outs = pp.edges.iter().enumerate().filter(|(_, e)| e.0 == blk.idx);
                // An edge to a block would have been taken by entering it
                // (not so after an `exit_group` system call).
                let n = pp.blocks.len() as u32;
                if let (Some((e, _)), None) = (outs.next().filter(|(_, e)| e.1 == n), outs.next()) {
                    self.seen_edges[blk.proc as usize][e] += 1;
                }
            }
        }
    }
}

impl Observer for Graph<'_> {
    fn block(&mut self, tid: Pid, module: usize, start: u64, arrival: Arrival) {
        // The rest of a block after a signal handler is no new execution
        // of it and takes no edge: the profile counts neither.
        if module != 0 || matches!(arrival, Arrival::Resumed { .. }) {
            return;
        }
        let b = self.locate(start);
        match b.blk.filter(|_| b.known) {
            Some(i) => {
                let blk = &self.blocks[i as usize];
                self.seen_blocks[blk.proc as usize][blk.idx as usize] += 1;
            }
            None => *self.missing_blocks.entry(start).or_default() += 1,
        }
        self.arrive(tid, b, arrival);
    }

    fn event(&mut self, tid: Pid, event: &Event) {
        match event {
            Event::Signal { .. } => {
                let th = self.threads.entry(tid).or_default();
                let depth = th.frames.len();
                let cur = th.cur.take();
                th.interrupted.push((cur, depth));
            }
            Event::ThreadExit { .. } => self.finish(tid),
            Event::ForkDetached { .. } => self.forks += 1,
            Event::MissingBlock { addr, proc, .. } => self.follower_defects.push(format!(
                "the run reached {addr:#x} in {proc}, where the recovered CFG has no block (paper 004, case (b))"
            )),
            Event::MissingEdge { from, to, proc, .. } => self.follower_defects.push(format!(
                "the run went from {from:#x} to {to:#x} in {proc}, an edge the recovered CFG lacks (paper 004, case (c))"
            )),
            _ => {}
        }
    }
}

/// One count that differs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The procedure's name (its symbol, `import@plt`, or `sub_<hex>`).
    pub proc: String,
    /// `block 0x..`, `edge 0x.. -> 0x.. (kind)`, `invocations`.
    pub what: String,
    /// The count in the profile.
    pub profile: u64,
    /// The count the single-stepped run observed.
    pub seen: u64,
    /// `file:line` of the block (or the edge's source) when DWARF has it.
    pub line: Option<String>,
}

/// The verdict on a profile.
#[derive(Clone, Debug)]
pub struct ProfileReport {
    /// The program run (its path).
    pub program: String,
    /// Every block and edge count that differs, in profile order.
    pub mismatches: Vec<Mismatch>,
    /// Case (b): blocks executed that the profile lacks (address, times,
    /// procedure around it).
    pub missing_blocks: Vec<(u64, u64, String)>,
    /// Case (c): edges taken that the profile lacks (from, to or EXIT,
    /// times, procedure).
    pub missing_edges: Vec<(u64, Option<u64>, u64, String)>,
    /// What makes the check inconclusive.
    pub problems: Vec<String>,
    /// Facts worth knowing that do not change the verdict.
    pub notes: Vec<String>,
    /// Counts compared and equal.
    pub blocks_checked: u64,
    /// Edge counts compared and equal.
    pub edges_checked: u64,
    /// Procedures compared.
    pub procs_checked: usize,
    /// What the verifying run produced: its exit, modules and statistics.
    pub outcome: Outcome,
}

impl ProfileReport {
    /// True when every count matched and nothing is in doubt.
    pub fn exact(&self) -> bool {
        self.mismatches.is_empty()
            && self.missing_blocks.is_empty()
            && self.missing_edges.is_empty()
            && self.problems.is_empty()
    }
}

impl std::fmt::Display for ProfileReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for m in &self.mismatches {
            write!(
                f,
                "{}: {}: profile {}, seen {}",
                m.proc, m.what, m.profile, m.seen
            )?;
            match &m.line {
                Some(l) => writeln!(f, " ({l})")?,
                None => writeln!(f)?,
            }
        }
        for (addr, n, proc) in &self.missing_blocks {
            writeln!(
                f,
                "{proc}: block {addr:#x} executed {n} times, absent from the profile (paper 004, case (b))"
            )?;
        }
        for (from, to, n, proc) in &self.missing_edges {
            let to = to.map_or_else(|| "EXIT".to_string(), |t| format!("{t:#x}"));
            writeln!(
                f,
                "{proc}: edge {from:#x} -> {to} taken {n} times, absent from the profile (paper 004, case (c))"
            )?;
        }
        for p in &self.problems {
            writeln!(f, "inconclusive: {p}")?;
        }
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        let secs = self.outcome.elapsed.as_secs_f64();
        if self.exact() {
            writeln!(
                f,
                "exact: {} block and {} edge counts of {} procedures ({} blocks followed in {:.2} s, {:.0} blocks/s)",
                self.blocks_checked,
                self.edges_checked,
                self.procs_checked,
                self.outcome.stats.blocks,
                secs,
                self.outcome.stats.blocks as f64 / secs.max(1e-9)
            )
        } else {
            writeln!(
                f,
                "NOT exact: {} counts differ, {} blocks and {} edges absent from the profile, {} problem{}",
                self.mismatches.len(),
                self.missing_blocks.len(),
                self.missing_edges.len(),
                self.problems.len(),
                if self.problems.len() == 1 { "" } else { "s" }
            )
        }
    }
}

/// Runs the check of the profile at `opts.profile`.
pub fn verify_profile(opts: &ProfileOptions) -> Result<ProfileReport, Error> {
    let profile = aetrace_profile::read(&opts.profile).map_err(Error::ProfileFile)?;
    let (program, args) = match opts.command.split_first() {
        Some((p, rest)) => (PathBuf::from(p), rest.to_vec()),
        None => (
            PathBuf::from(&profile.program),
            profile.args.iter().map(OsString::from).collect(),
        ),
    };
    let run_path = crate::tracer::resolve(&program)?;
    let profiled = Path::new(&profile.program);
    let mut notes = Vec::new();
    if std::fs::canonicalize(profiled).ok().as_deref() != Some(run_path.as_path()) {
        notes.push(format!(
            "the profile is of {}, this run is of {}",
            profiled.display(),
            run_path.display()
        ));
    }
    let elf = elf::Module::open(&run_path).map_err(Error::Analysis)?;
    let mut graph = Graph::new(&profile, &elf)?;
    let options = Options {
        argv0: Some(program.clone().into_os_string()),
        stdin: opts.stdin.clone(),
        // The program's output is not the report.
        stdout: Some(PathBuf::from("/dev/null")).filter(|p| p.exists()),
        no_pin: opts.no_pin,
        ..Options::default()
    };
    let outcome = crate::tracer::follow(&program, &args, &options, &mut graph)?;
    let tids: Vec<Pid> = graph.threads.keys().copied().collect();
    for t in tids {
        graph.finish(t);
    }
    let lines = Lines::load(&elf);
    let line = |addr: u64| {
        lines
            .at(addr)
            .map(|(file, l)| format!("{}:{l}", file.rsplit('/').next().unwrap_or(file)))
    };
    // The procedure of the nearest profile block at or before `addr`.
    let name_at = |addr: u64| -> String {
        graph
            .blocks
            .iter()
            .filter(|b| b.start <= addr)
            .max_by_key(|b| b.start)
            .map_or_else(
                || "?".to_string(),
                |b| profile.procs[b.proc as usize].name.clone(),
            )
    };

    let mut report = ProfileReport {
        program: run_path.display().to_string(),
        mismatches: Vec::new(),
        missing_blocks: graph
            .missing_blocks
            .iter()
            .map(|(&a, &n)| (a, n, name_at(a)))
            .collect(),
        missing_edges: graph
            .missing_edges
            .iter()
            .map(|(&(f, t), &n)| (f, t, n, name_at(f)))
            .collect(),
        problems: std::mem::take(&mut graph.follower_defects),
        notes,
        blocks_checked: 0,
        edges_checked: 0,
        procs_checked: 0,
        outcome,
    };
    let mut left_alone = 0u64;
    for (pi, p) in profile.procs.iter().enumerate() {
        let seen_blocks = &graph.seen_blocks[pi];
        if p.left_alone.is_some() {
            left_alone += seen_blocks.iter().sum::<u64>();
            continue;
        }
        let Some(c) = &p.counts else {
            if seen_blocks.iter().any(|&n| n > 0) {
                report.problems.push(format!(
                    "{}: the profile has no counts ({}) for a procedure that ran",
                    p.name,
                    p.error.as_deref().unwrap_or("not recovered")
                ));
            }
            continue;
        };
        report.procs_checked += 1;
        compare_proc(p, c, seen_blocks, &graph.seen_edges[pi], &line, &mut report);
    }
    if left_alone > 0 {
        report.notes.push(format!(
            "{left_alone} blocks ran in procedures the profile does not count (left alone by the rewriter)"
        ));
    }
    if report.outcome.stats.resyncs > 0 {
        report.problems.push(format!(
            "the follower lost a thread's position {} time(s): its counts are not exact (docs/verify.md, threads)",
            report.outcome.stats.resyncs
        ));
    }
    if graph.forks > 0 {
        report.notes.push(format!(
            "{} forked child(ren) ran untraced: the profile counts their blocks too (they share its counters), this run does not",
            graph.forks
        ));
    }
    let want = match report.outcome.exit {
        crate::Exit::Code(c) => format!("exited {c}"),
        crate::Exit::Signal(s) => format!("killed by signal {s}"),
    };
    if opts.command.is_empty() && !report.exact() {
        report.notes.push(
            "the profile does not record argv[0], the environment or stdin: this run used the profiled \
             program's absolute path as argv[0] and our environment; code that reads them (e.g. a \
             basename of argv[0]) may differ for that reason alone (paper 004, Section 4.2); give the \
             command as profiled after --"
                .into(),
        );
    }
    if want != profile.status {
        report.notes.push(format!(
            "the profiled run {}, this run {want}",
            profile.status
        ));
    }
    Ok(report)
}

/// Compares one procedure's counts; every difference becomes a mismatch.
fn compare_proc(
    p: &ProcProfile,
    c: &aetrace_profile::Counts,
    seen_blocks: &[u64],
    seen_edges: &[u64],
    line: &dyn Fn(u64) -> Option<String>,
    report: &mut ProfileReport,
) {
    let start = |i: u32| p.blocks.get(i as usize).map(|b| b.start);
    for (i, (&want, &got)) in c.blocks.iter().zip(seen_blocks).enumerate() {
        report.blocks_checked += 1;
        if want != got {
            let addr = p.blocks[i].start;
            report.mismatches.push(Mismatch {
                proc: p.name.clone(),
                what: format!("block {addr:#x}"),
                profile: want,
                seen: got,
                line: line(addr),
            });
        }
    }
    let Some(edges) = &c.edges else {
        report.notes.push(format!(
            "{}: block counts only in the profile (every-block placement)",
            p.name
        ));
        return;
    };
    for (e, (&want, &got)) in edges.iter().zip(seen_edges).enumerate() {
        report.edges_checked += 1;
        if want != got {
            let (f, t, kind) = &p.edges[e];
            let from = start(*f).unwrap_or(0);
            let mut what = format!("edge {from:#x} -> ");
            match start(*t) {
                Some(a) => {
                    let _ = write!(what, "{a:#x}");
                }
                None => what.push_str("EXIT"),
            }
            let _ = write!(what, " ({kind})");
            report.mismatches.push(Mismatch {
                proc: p.name.clone(),
                what,
                profile: want,
                seen: got,
                line: line(from),
            });
        }
    }
    // Invocations follow from the rest (entry count minus the edges into
    // the entry inside the procedure); checked so a wrong R0 count shows.
    let into_entry: u64 = p
        .edges
        .iter()
        .zip(seen_edges)
        .filter(|((_, t, _), _)| *t == p.entry)
        .map(|(_, &n)| n)
        .sum();
    let seen_inv = seen_blocks
        .get(p.entry as usize)
        .copied()
        .unwrap_or(0)
        .saturating_sub(into_entry);
    if seen_inv != c.invocations {
        report.mismatches.push(Mismatch {
            proc: p.name.clone(),
            what: "invocations".into(),
            profile: c.invocations,
            seen: seen_inv,
            line: start(p.entry).and_then(line),
        });
    }
}
