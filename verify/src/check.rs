//! `aetrace verify TRACE`: runs the ORIGINAL program again, the way the
//! trace's COMMAND section says it was run, under the block follower, and
//! compares each thread's block sequence with the one the regenerator
//! rebuilds from the trace (paper 004's check, applied to a trace instead of
//! a profile).
//!
//! The regenerator's per-block output (`aetrace_regen`, format `block`) is
//! produced by one producer thread per trace thread into a bounded channel
//! and parsed as the follower reports blocks, so neither sequence is ever
//! held whole in memory. The follower follows every analysable procedure
//! of every traced module (the executable and the `--libs` libraries the
//! trace's module table names); the trace covers the relocated ones only,
//! so the followed blocks are first filtered to the blocks of the
//! procedures each module's program database marks traced. Blocks are
//! compared as (module, link-time address) pairs, in one sequence per
//! thread across modules.
//!
//! Invariants: a thread is compared until its first divergence, which is
//! final (later blocks only give context, and once every compared thread
//! has diverged the program is stopped); "exact" is reported only when
//! every compared thread's two sequences ended together, the follower lost
//! no position (`Stats::resyncs == 0`), and the run's threads could be
//! paired with the trace's. Traced and followed addresses are both
//! link-time addresses of the same files (each build-id is checked).

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use aetrace_analysis::elf;
use aetrace_format::progdb::{ProcStatus, ProgramDb};
use aetrace_format::{module_flags, ExitStatus, Module, StartReason, Stdin, TraceFile};
use aetrace_graph::EntityRef;

use crate::{Arrival, Error, Event, Exit, Observer, Options, Outcome, Pid};
use aetrace_analysis::lines::Lines;

/// Blocks of context printed before a divergence.
const CONTEXT: usize = 6;
/// Blocks printed after it, on each side.
const AFTER: usize = 3;
/// Bytes of regenerated text per message of a producer.
const BATCH: usize = 256 << 10;
/// Messages a producer may be ahead of the comparison.
const AHEAD: usize = 16;

/// What `aetrace verify` was asked for.
#[derive(Clone, Debug, Default)]
pub struct VerifyOptions {
    /// The program's stdin instead of the recorded one.
    pub stdin: Option<PathBuf>,
    /// Compare only this trace thread.
    pub thread: Option<u32>,
    /// `PROGRAM ARGS...` for a trace without COMMAND (or to override it).
    pub command: Vec<OsString>,
    /// Do not pin the follower and the program to one CPU
    /// (`Options::no_pin`).
    pub no_pin: bool,
}

/// One block as the report shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    /// Link-time address.
    pub addr: u64,
    /// The procedure's name (its symbol, `import@plt`, or `sub_<hex>`).
    pub proc: String,
    /// The module's file name, when the trace has more than one module.
    pub module: Option<String>,
    /// `file:line` from DWARF, when the binary has it.
    pub line: Option<String>,
}

/// Where one thread's two sequences part.
#[derive(Clone, Debug)]
pub struct Divergence {
    /// The trace thread (its number in the trace, as `--thread` takes it).
    pub thread: u32,
    /// OS thread id in the verifying run.
    pub tid: Pid,
    /// 0-based position in the thread's (traced-procedure) block sequence.
    pub position: u64,
    /// The trace's block there (`None`: the trace ends).
    pub expected: Option<Place>,
    /// The run's block there (`None`: the thread ended).
    pub seen: Option<Place>,
    /// The blocks both agreed on just before, oldest first.
    pub before: Vec<Place>,
    /// The trace's next blocks after `expected`.
    pub expected_after: Vec<Place>,
    /// The run's next blocks after `seen`.
    pub seen_after: Vec<Place>,
    /// Why the difference may be the environment's, not the trace's.
    pub notes: Vec<String>,
    /// The regenerator stopped with this error instead of giving a block.
    pub regen_error: Option<String>,
}

/// The verdict.
#[derive(Clone, Debug)]
pub struct Report {
    /// Blocks compared and found equal, over all threads (executions of
    /// blocks, as `aetrace regen --count` counts them).
    pub blocks: u64,
    /// Rests of blocks resumed after a signal handler, compared equal and
    /// not counted in `blocks` (both sides list them as blocks of their
    /// own; they are no new execution).
    pub resumed: u64,
    /// Threads compared.
    pub threads: usize,
    /// First divergence per thread that has one.
    pub divergences: Vec<Divergence>,
    /// Problems that make the verdict inconclusive (unpaired threads, lost
    /// positions, CFG defects the follower found).
    pub problems: Vec<String>,
    /// Facts worth knowing that do not change the verdict.
    pub notes: Vec<String>,
    /// What the verifying run produced: its exit, modules and statistics.
    pub outcome: Outcome,
}

impl Report {
    /// True when every compared thread matched and nothing is in doubt.
    pub fn exact(&self) -> bool {
        self.divergences.is_empty() && self.problems.is_empty()
    }
}

fn place_text(p: &Option<Place>, none: &str) -> String {
    match p {
        None => none.to_owned(),
        Some(p) => {
            let mut s = format!("{:#x} in {}", p.addr, p.proc);
            if let Some(m) = &p.module {
                let _ = write!(s, " [{m}]");
            }
            if let Some(l) = &p.line {
                let _ = write!(s, " ({l})");
            }
            s
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for d in &self.divergences {
            writeln!(
                f,
                "thread {} (tid {}): diverges at block {} of its sequence",
                d.thread, d.tid, d.position
            )?;
            writeln!(
                f,
                "  expected (trace): {}",
                place_text(&d.expected, "the trace ends here")
            )?;
            if let Some(e) = &d.regen_error {
                writeln!(f, "    regeneration stopped: {e}")?;
            }
            writeln!(
                f,
                "  seen (run):       {}",
                place_text(&d.seen, "the thread ends here")
            )?;
            if !d.before.is_empty() {
                writeln!(f, "  before, in both:")?;
                for p in &d.before {
                    writeln!(f, "    {}", place_text(&Some(p.clone()), ""))?;
                }
            }
            for (what, list) in [("trace", &d.expected_after), ("run", &d.seen_after)] {
                if !list.is_empty() {
                    writeln!(f, "  then in the {what}:")?;
                    for p in list {
                        writeln!(f, "    {}", place_text(&Some(p.clone()), ""))?;
                    }
                }
            }
            for n in &d.notes {
                writeln!(f, "  note: {n}")?;
            }
        }
        for p in &self.problems {
            writeln!(f, "inconclusive: {p}")?;
        }
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        let rate = self.outcome.stats.blocks as f64 / self.outcome.elapsed.as_secs_f64().max(1e-9);
        if self.exact() {
            writeln!(
                f,
                "exact: {} blocks in {} thread{} ({}{} blocks followed in {:.2} s, {:.0} blocks/s)",
                self.blocks,
                self.threads,
                if self.threads == 1 { "" } else { "s" },
                if self.resumed > 0 {
                    format!(
                        "and {} rests of blocks resumed after signal handlers; ",
                        self.resumed
                    )
                } else {
                    String::new()
                },
                self.outcome.stats.blocks,
                self.outcome.elapsed.as_secs_f64(),
                rate
            )
        } else {
            writeln!(
                f,
                "NOT exact: {} of {} threads diverge, {} problem{} ({} blocks compared equal)",
                self.divergences.len(),
                self.threads,
                self.problems.len(),
                if self.problems.len() == 1 { "" } else { "s" },
                self.blocks
            )
        }
    }
}

/// The trace's side of one thread: parsed lines of the regenerator's
/// `block` output, runtime addresses turned into link-time ones.
struct Expected<'a> {
    rx: Receiver<Msg>,
    buf: Vec<u8>,
    pos: usize,
    /// Per traced module (index as in the follower), its recorded runtime
    /// range `[load_base, load_base + size)`.
    ranges: &'a [(u64, u64)],
    /// How the producer ended, once it has.
    end: Option<Result<(), String>>,
    /// The signal the recorded run took right before the block `next`
    /// returned last (the regenerator's `# signal N` line).
    signal: Option<u32>,
}

enum Msg {
    Bytes(Vec<u8>),
    End(Result<(), String>),
}

/// An `io::Write` that hands the regenerator's output to a channel.
struct ChannelOut {
    tx: SyncSender<Msg>,
    buf: Vec<u8>,
}

impl std::io::Write for ChannelOut {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= BATCH {
            self.flush()?;
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let b = std::mem::replace(&mut self.buf, Vec::with_capacity(BATCH + 4096));
        // A closed channel: the comparison has what it needs.
        self.tx
            .send(Msg::Bytes(b))
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
}

impl Expected<'_> {
    /// The next block's module and link-time address; `None` at the end
    /// (then `end` says whether regeneration succeeded).
    fn next(&mut self) -> Option<Loc> {
        self.signal = None;
        loop {
            if let Some(nl) = self
                .buf
                .get(self.pos..)
                .and_then(|r| r.iter().position(|&c| c == b'\n'))
            {
                let line = &self.buf[self.pos..self.pos + nl];
                self.pos += nl + 1;
                if let Some(n) = line.strip_prefix(b"# signal ") {
                    self.signal = std::str::from_utf8(n).ok().and_then(|n| n.parse().ok());
                }
                if line.first() == Some(&b'#') {
                    continue;
                }
                let hex = line.split(|&c| c == b' ').next().unwrap_or(line);
                let addr = std::str::from_utf8(hex)
                    .ok()
                    .and_then(|h| u64::from_str_radix(h, 16).ok());
                let loc = addr.and_then(|a| {
                    self.ranges
                        .iter()
                        .position(|&(lo, size)| a.wrapping_sub(lo) < size)
                        .map(|m| (m, a - self.ranges[m].0))
                });
                return match loc {
                    Some(l) => Some(l),
                    None => {
                        self.end = Some(Err(format!(
                            "regenerator output {:?} is not a block of a traced module",
                            String::from_utf8_lossy(line)
                        )));
                        None
                    }
                };
            }
            if self.end.is_some() {
                return None;
            }
            match self.rx.recv() {
                Ok(Msg::Bytes(b)) => {
                    self.buf.drain(..self.pos);
                    self.pos = 0;
                    self.buf.extend_from_slice(&b);
                }
                Ok(Msg::End(r)) => self.end = Some(r),
                Err(_) => self.end = Some(Err("the regenerator thread died".into())),
            }
        }
    }
}

/// Where a thread's sequences part: the position, the trace's block there
/// (`None`: it ends, `regen_error` says if the regenerator gave up) and the
/// run's (`None`: the thread ended).
#[derive(Clone, Debug)]
struct Split {
    position: u64,
    expected: Option<Loc>,
    seen: Option<Loc>,
    regen_error: Option<String>,
    /// A signal delivered to the thread since the last equal block.
    signal: Option<i32>,
    /// The signal the recorded run took right before the trace's block.
    trace_signal: Option<u32>,
}

/// A thread of the run, paired with a trace thread.
struct Track<'a> {
    thread: u32,
    expected: Expected<'a>,
    /// Blocks compared equal so far (resumed rests included).
    equal: u64,
    /// Of those, rests of blocks resumed after a signal handler.
    resumed: u64,
    before: VecDeque<Loc>,
    /// Set at the first divergence.
    diverged: Option<Split>,
    seen_after: Vec<Loc>,
    finished: bool,
    /// A signal delivered since the last equal block.
    signal: Option<i32>,
    /// Paired but not compared (`--thread` chose another).
    ignored: bool,
}

impl Track<'_> {
    fn block(&mut self, addr: Loc, resumed: bool) {
        if self.finished || self.ignored {
            return;
        }
        if self.diverged.is_some() {
            if self.seen_after.len() < AFTER {
                self.seen_after.push(addr);
            }
            return;
        }
        match self.expected.next() {
            Some(e) if e == addr => {
                self.equal += 1;
                self.resumed += u64::from(resumed);
                self.signal = None;
                if self.before.len() == CONTEXT {
                    self.before.pop_front();
                }
                self.before.push_back(addr);
            }
            e => {
                let err = self.expected.end.clone().and_then(Result::err);
                self.diverged = Some(Split {
                    position: self.equal,
                    expected: e,
                    seen: Some(addr),
                    regen_error: err,
                    signal: self.signal,
                    trace_signal: self.expected.signal,
                });
            }
        }
    }

    /// Nothing the run does from now on changes this thread's report: it
    /// ended, or it diverged and its context after the divergence is full.
    fn settled(&self) -> bool {
        self.ignored || self.finished || (self.diverged.is_some() && self.seen_after.len() >= AFTER)
    }

    /// The run's thread ended: the trace must end too.
    fn finish(&mut self) {
        if self.finished || self.ignored {
            return;
        }
        self.finished = true;
        if self.diverged.is_none() {
            let next = self.expected.next();
            let err = self.expected.end.clone().and_then(Result::err);
            if next.is_some() || err.is_some() {
                self.diverged = Some(Split {
                    position: self.equal,
                    expected: next,
                    seen: None,
                    regen_error: err,
                    signal: self.signal,
                    trace_signal: self.expected.signal,
                });
            }
        }
    }
}

/// A compared thread, its producer gone.
struct Done {
    thread: u32,
    tid: Pid,
    equal: u64,
    resumed: u64,
    before: Vec<Loc>,
    diverged: Option<Split>,
    seen_after: Vec<Loc>,
    expected_after: Vec<Loc>,
}

/// A block: the index of its module (0: the executable, then the traced
/// libraries, as the follower numbers them) and its link-time address.
type Loc = (usize, u64);

/// The observer: pairs the run's threads with the trace's and compares.
struct Compare<'a> {
    /// Per module, the link-time starts of the blocks of traced procedures.
    traced: &'a [HashSet<u64>],
    /// Trace threads not paired yet: the main one, then new threads in
    /// creation order.
    main: Option<Track<'a>>,
    spawned: VecDeque<Track<'a>>,
    tracks: HashMap<Pid, Track<'a>>,
    /// Threads of the run announced by `ThreadStart` (the main thread is
    /// the one that reports a block without having been announced).
    started: HashSet<Pid>,
    /// New threads of the run beyond the trace's.
    extra_threads: u64,
    /// CFG defects the follower found in traced procedures (they make the
    /// verdict inconclusive) and in procedures the trace leaves alone
    /// (they do not bear on it), each message with its count.
    cfg_defects: Tally,
    untraced_defects: Tally,
    /// The follower armed the libraries only at the program's entry point.
    libs_at_entry: bool,
    /// The modules' file names, for the CFG defects' messages.
    names: &'a [String],
}

impl Observer for Compare<'_> {
    fn block(&mut self, tid: Pid, module: usize, start: u64, arrival: Arrival) {
        let block = match arrival {
            Arrival::Resumed { block } => block,
            _ => start,
        };
        if !self.traced.get(module).is_some_and(|t| t.contains(&block)) {
            return;
        }
        if !self.started.contains(&tid) {
            if let Some(t) = self.main.take() {
                self.tracks.insert(tid, t);
            }
        }
        if let Some(t) = self.tracks.get_mut(&tid) {
            t.block((module, start), matches!(arrival, Arrival::Resumed { .. }));
        }
    }

    /// Every trace thread is paired, and every compared thread settled with
    /// at least one divergence: the report is final, the run may stop (a
    /// program whose timer signals outpace the follower would not end).
    fn done(&self) -> bool {
        self.main.is_none()
            && self.spawned.iter().all(|t| t.ignored)
            && self.tracks.values().all(Track::settled)
            && self.tracks.values().any(|t| t.diverged.is_some())
    }

    fn event(&mut self, tid: Pid, event: &Event) {
        match event {
            Event::ThreadStart => {
                self.started.insert(tid);
                match self.spawned.pop_front() {
                    Some(t) => {
                        self.tracks.insert(tid, t);
                    }
                    None => self.extra_threads += 1,
                }
            }
            Event::Signal { sig } => {
                if let Some(t) = self.tracks.get_mut(&tid) {
                    t.signal = Some(*sig);
                }
            }
            Event::ThreadExit { .. } => {
                if let Some(t) = self.tracks.get_mut(&tid) {
                    t.finish();
                }
            }
            Event::LibrariesMapped { at_entry } => self.libs_at_entry = *at_entry,
            Event::MissingBlock {
                module,
                addr,
                containing,
                proc,
            } => {
                let text = format!(
                    "the run reached {addr:#x} in {proc}{}, where the CFG has no block (paper 004, case (b))",
                    self.module_suffix(*module)
                );
                self.defect(*module, *containing, text);
            }
            Event::MissingEdge {
                module,
                from,
                to,
                proc,
            } => {
                let text = format!(
                    "the run went from {from:#x} to {to:#x} in {proc}{}, an edge the CFG lacks (paper 004, case (c))",
                    self.module_suffix(*module)
                );
                self.defect(*module, *from, text);
            }
            _ => {}
        }
    }
}

impl Compare<'_> {
    /// Counts a CFG defect found in the procedure of block `block` (a
    /// link-time start) of module `m`.
    fn defect(&mut self, m: usize, block: u64, text: String) {
        if self.traced.get(m).is_some_and(|t| t.contains(&block)) {
            self.cfg_defects.add(text);
        } else {
            self.untraced_defects.add(text);
        }
    }

    /// ` [NAME]` for module `m` when there is more than one module.
    fn module_suffix(&self, m: usize) -> String {
        match self.names.get(m) {
            Some(n) if self.names.len() > 1 => format!(" [{n}]"),
            _ => String::new(),
        }
    }
}

/// Messages in order of first occurrence, each with how often it came.
#[derive(Default)]
struct Tally {
    counts: Vec<(String, u64)>,
    index: HashMap<String, usize>,
}

impl Tally {
    fn add(&mut self, text: String) {
        match self.index.get(&text) {
            Some(&i) => self.counts[i].1 += 1,
            None => {
                self.index.insert(text.clone(), self.counts.len());
                self.counts.push((text, 1));
            }
        }
    }

    /// One line per message, with its count when it came more than once.
    fn lines(self) -> impl Iterator<Item = String> {
        self.counts.into_iter().map(|(t, n)| match n {
            1 => t,
            n => format!("{t} ({n} times)"),
        })
    }
}

fn os(b: &[u8]) -> OsString {
    OsString::from_vec(b.to_vec())
}

/// Runs the check for the trace at `path`.
pub fn verify_trace(path: &Path, opts: &VerifyOptions) -> Result<Report, Error> {
    let trace = TraceFile::open(path).map_err(|e| Error::Trace(e.to_string()))?;
    let main_thread = trace
        .threads()
        .find(|t| t.start.reason == StartReason::Main)
        .ok_or_else(|| Error::Trace("the trace has no main thread".into()))?;
    let pid = main_thread.start.pid;
    let module: &Module = trace
        .modules()
        .iter()
        .find(|m| m.pid == pid && m.flags & module_flags::MAIN != 0)
        .ok_or_else(|| Error::Trace(format!("no main executable for process {pid}")))?;
    // Every traced module of the process: the executable, then the
    // libraries recorded with `--libs`, in the follower's order.
    let traced_modules: Vec<&Module> = std::iter::once(module)
        .chain(trace.modules().iter().filter(|m| {
            m.pid == pid && m.id != module.id && m.flags & module_flags::INSTRUMENTED != 0
        }))
        .collect();
    let mut dbs = Vec::new();
    for m in &traced_modules {
        let db = trace.program_database(m.id).ok_or_else(|| {
            Error::Trace(format!(
                "{}: the traced module has no program database",
                String::from_utf8_lossy(&m.path)
            ))
        })?;
        let raw = db.decompress().map_err(|e| Error::Trace(e.to_string()))?;
        dbs.push(ProgramDb::decode(&raw).map_err(|e| Error::Trace(e.to_string()))?);
    }
    let traced: Vec<HashSet<u64>> = dbs
        .iter()
        .map(|db| {
            db.procs
                .iter()
                .filter(|p| matches!(p.status, ProcStatus::Traced))
                .flat_map(|p| p.blocks.iter().map(|b| b.start))
                .collect()
        })
        .collect();
    let ranges: Vec<(u64, u64)> = traced_modules
        .iter()
        .map(|m| (m.load_base, m.size))
        .collect();
    let names: Vec<String> = traced_modules
        .iter()
        .map(|m| {
            let p = String::from_utf8_lossy(&m.path).into_owned();
            p.rsplit('/').next().unwrap_or(&p).to_owned()
        })
        .collect();
    // Each library must be the file that was traced; the loader of the
    // run must map that file (the follower says so when it does not).
    let mut lib_elfs = Vec::new();
    for m in &traced_modules[1..] {
        let p = PathBuf::from(os(&m.path));
        let elf = elf::Module::open(&p).map_err(Error::Analysis)?;
        if elf.build_id() != m.build_id {
            return Err(Error::Trace(format!(
                "{}: build-id {} differs from the traced library's {}: not the library that was traced",
                p.display(),
                hex(&elf.build_id()),
                hex(&m.build_id)
            )));
        }
        lib_elfs.push((p, elf));
    }

    // The program, its arguments, environment, directory and stdin.
    let recorded = trace.command();
    let mut options = Options {
        libs: lib_elfs.iter().map(|(p, _)| p.clone()).collect(),
        ..Options::default()
    };
    let mut notes = Vec::new();
    let (program, args) = if let Some((p, rest)) = opts.command.split_first() {
        options.argv0 = Some(p.clone());
        (PathBuf::from(p), rest.to_vec())
    } else {
        let c = recorded.ok_or_else(|| {
            Error::Trace(
                "the trace does not say how the program was run (no COMMAND section: recorded \
                 before format 1.1); give it after --: aetrace verify TRACE -- PROGRAM ARGS"
                    .into(),
            )
        })?;
        options.argv0 = c.argv.first().map(|a| os(a));
        options.environment = Some(c.env.iter().map(|e| os(e)).collect());
        options.cwd = Some(PathBuf::from(os(&c.cwd)));
        (
            PathBuf::from(os(&c.program)),
            c.argv.iter().skip(1).map(|a| os(a)).collect(),
        )
    };
    let module_path = PathBuf::from(os(&module.path));
    options.stdin = match (&opts.stdin, recorded.map(|c| &c.stdin)) {
        (Some(s), _) => Some(s.clone()),
        (None, Some(Stdin::File { path, size })) => {
            let p = PathBuf::from(os(path));
            let now = std::fs::metadata(&p).map(|m| m.len()).ok();
            if now != Some(*size) {
                return Err(Error::Trace(format!(
                    "the recorded run read stdin from {} ({size} bytes), which is {}; give the input with --stdin FILE",
                    p.display(),
                    match now {
                        Some(n) => format!("now {n} bytes"),
                        None => "gone".into(),
                    }
                )));
            }
            Some(p)
        }
        (None, Some(Stdin::Other)) => {
            notes.push(
                "the recorded run's stdin was a terminal or a pipe, which cannot be replayed: \
                 this run reads /dev/null (give the input with --stdin FILE)"
                    .into(),
            );
            Some(PathBuf::from("/dev/null"))
        }
        (None, _) => Some(PathBuf::from("/dev/null")),
    };
    // The program's output is not ours to print (and /dev/null is not ours
    // to create where a sandbox lacks it).
    options.stdout = Some(PathBuf::from("/dev/null")).filter(|p| p.exists());

    // The file that runs must be the one that was traced.
    let run_path = crate::tracer::resolve(&program)?;
    let traced_path = std::fs::canonicalize(&module_path).unwrap_or(module_path.clone());
    if run_path != traced_path && opts.command.is_empty() {
        return Err(Error::Trace(format!(
            "the trace's module is {} but its command runs {}",
            traced_path.display(),
            run_path.display()
        )));
    }
    let elf = elf::Module::open(&run_path).map_err(Error::Analysis)?;
    let build_id = elf.build_id();
    if build_id != module.build_id {
        return Err(Error::Trace(format!(
            "{}: build-id {} differs from the traced module's {}: not the binary that was traced",
            run_path.display(),
            hex(&build_id),
            hex(&module.build_id)
        )));
    }

    // Trace threads to compare, each with its producer.
    let mut chosen: Vec<&aetrace_format::ThreadInfo> = trace
        .threads()
        .filter(|t| {
            t.start.pid == pid && matches!(t.start.reason, StartReason::Main | StartReason::Thread)
        })
        .collect();
    let skipped = trace.threads().len() - chosen.len();
    if skipped > 0 {
        notes.push(format!(
            "{skipped} thread(s) of forked or exec'd processes not compared (the follower detaches fork children)"
        ));
    }
    // New threads in creation order (the OS gives increasing tids).
    chosen.sort_by_key(|t| (t.start.reason != StartReason::Main, t.start.os_tid));
    if let Some(n) = opts.thread {
        if !chosen.iter().any(|t| t.start.thread.0 == n) {
            return Err(Error::Trace(format!(
                "thread {n} is not a thread of the traced process that verify can compare"
            )));
        }
    }

    options.no_pin = opts.no_pin;
    let traced_ref = &traced[..];
    let ranges_ref = &ranges[..];
    let trace_ref = &trace;
    let outcome_and_tracks = std::thread::scope(|s| -> Result<_, Error> {
        let mut tracks = Vec::new();
        for t in &chosen {
            let (tx, rx) = sync_channel(AHEAD);
            let n = t.start.thread.0;
            let ignored = opts.thread.is_some_and(|k| k != n);
            if !ignored {
                s.spawn(move || {
                    let ropts = aetrace_regen::Options {
                        format: aetrace_regen::Format::Block,
                        module: None,
                        thread: Some(n),
                        jobs: 1,
                        ..aetrace_regen::Options::default()
                    };
                    let mut out = ChannelOut {
                        tx: tx.clone(),
                        buf: Vec::with_capacity(BATCH + 4096),
                    };
                    let r = aetrace_regen::regen_trace(trace_ref, &ropts, &mut out)
                        .and_then(|_| {
                            std::io::Write::flush(&mut out).map_err(aetrace_regen::Error::Output)
                        })
                        .map_err(|e| e.to_string());
                    let _ = tx.send(Msg::End(r));
                });
            }
            tracks.push(Track {
                thread: n,
                expected: Expected {
                    rx,
                    buf: Vec::new(),
                    pos: 0,
                    ranges: ranges_ref,
                    end: None,
                    signal: None,
                },
                equal: 0,
                resumed: 0,
                before: VecDeque::new(),
                diverged: None,
                seen_after: Vec::new(),
                finished: false,
                signal: None,
                ignored,
            });
        }
        let mut tracks = tracks.into_iter();
        let main = tracks.next();
        let mut cmp = Compare {
            traced: traced_ref,
            main,
            spawned: tracks.collect(),
            tracks: HashMap::new(),
            started: HashSet::new(),
            extra_threads: 0,
            cfg_defects: Tally::default(),
            untraced_defects: Tally::default(),
            libs_at_entry: false,
            names: &names,
        };
        let outcome = crate::tracer::follow(&program, &args, &options, &mut cmp)?;
        let mut done: Vec<Done> = cmp
            .tracks
            .drain()
            .filter(|(_, t)| !t.ignored)
            .map(|(tid, mut t)| {
                t.finish();
                let mut expected_after = Vec::new();
                if t.diverged.as_ref().is_some_and(|d| d.expected.is_some()) {
                    while expected_after.len() < AFTER {
                        match t.expected.next() {
                            Some(a) => expected_after.push(a),
                            None => break,
                        }
                    }
                }
                // Dropping `t.expected` ends its producer if it is still ahead.
                Done {
                    thread: t.thread,
                    tid,
                    equal: t.equal,
                    resumed: t.resumed,
                    before: t.before.into_iter().collect(),
                    diverged: t.diverged,
                    seen_after: t.seen_after,
                    expected_after,
                }
            })
            .collect();
        done.sort_by_key(|d| d.thread);
        let unpaired: Vec<u32> = cmp
            .main
            .into_iter()
            .chain(cmp.spawned)
            .filter(|t| !t.ignored)
            .map(|t| t.thread)
            .collect();
        let at_entry = cmp.libs_at_entry;
        let defects = (cmp.cfg_defects, cmp.untraced_defects);
        Ok((
            outcome,
            done,
            unpaired,
            cmp.extra_threads,
            defects,
            at_entry,
        ))
    });
    let (outcome, done, unpaired, extra_threads, (cfg_defects, untraced_defects), libs_at_entry) =
        outcome_and_tracks?;
    // The follower follows the procedures the rewriter left alone too (an
    // unresolved indirect jump): what it finds wrong there is no part of
    // the trace.
    notes.extend(
        untraced_defects
            .lines()
            .map(|t| format!("{t}; a procedure the trace leaves alone, not compared")),
    );
    if libs_at_entry {
        notes.push(
            "the program's loader exports no _dl_debug_state: the traced libraries were followed \
             from the program's entry point on, so code they ran before it (their initialisers) \
             is not in the run's sequence"
                .into(),
        );
    }

    // Describe what was found.
    let mut problems: Vec<String> = cfg_defects.lines().collect();
    for t in &unpaired {
        problems.push(format!(
            "trace thread {t} has no thread of the run to compare with"
        ));
    }
    if extra_threads > 0 {
        problems.push(format!(
            "the run created {extra_threads} more thread(s) than the trace has"
        ));
    }
    if outcome.stats.resyncs > 0 {
        problems.push(format!(
            "the follower lost a thread's position {} time(s): its sequences are not exact (docs/verify.md, threads)",
            outcome.stats.resyncs
        ));
    }
    match (
        trace.process_exits().iter().find(|e| e.pid == pid),
        outcome.exit,
    ) {
        _ if outcome.stopped => notes.push(
            "the run was stopped once every compared thread had diverged (the rest of it cannot change this report)".into(),
        ),
        (Some(e), exit) => {
            let same = matches!(
                (e.status, exit),
                (ExitStatus::Exited(a), Exit::Code(b)) if (a & 0xff) == b
            ) || matches!(
                (e.status, exit),
                (ExitStatus::Signaled { signal: a, .. }, Exit::Signal(b)) if a == b
            );
            if !same {
                notes.push(format!(
                    "the recorded run ended with {:?}, this run with {:?}",
                    e.status, exit
                ));
            }
        }
        (None, _) => notes.push("the trace records no exit for the process".into()),
    }
    let mut describe = Describer::new(
        std::iter::once((&elf, run_path.as_path()))
            .chain(lib_elfs.iter().map(|(p, e)| (e, p.as_path())))
            .zip(&dbs)
            .map(|((e, p), db)| (e, p, db))
            .collect(),
        &names,
    );
    let mut divergences = Vec::new();
    let (mut blocks, mut resumed) = (0, 0);
    let compared = done.len();
    for t in done {
        blocks += t.equal - t.resumed;
        resumed += t.resumed;
        let Some(Split {
            position,
            expected,
            seen,
            regen_error,
            signal,
            trace_signal,
        }) = t.diverged
        else {
            continue;
        };
        let d = Divergence {
            thread: t.thread,
            tid: t.tid,
            position,
            // A trace the regenerator refuses says nothing about the run.
            notes: if regen_error.is_some() {
                Vec::new()
            } else {
                let path: Vec<Loc> = t
                    .before
                    .iter()
                    .chain(&expected)
                    .chain(&seen)
                    .copied()
                    .collect();
                let mut notes = describe.environment(&t.before, &path);
                if let Some(&last) = t.before.last() {
                    for (side, next) in [("trace", expected), ("run", seen)] {
                        notes.extend(next.and_then(|n| describe.async_entry(side, last, n)));
                    }
                }
                if let Some(sig) = signal {
                    notes.push(format!(
                        "signal {sig} was delivered to the thread just before: signals arrive at other points in other runs"
                    ));
                }
                if let Some(sig) = trace_signal {
                    notes.push(format!(
                        "the recorded run took signal {sig} just before the trace's block (its SIGNAL record): signals arrive at other points in other runs"
                    ));
                }
                notes
            },
            expected: expected.map(|a| describe.place(a)),
            seen: seen.map(|a| describe.place(a)),
            before: t.before.iter().map(|&a| describe.place(a)).collect(),
            expected_after: t
                .expected_after
                .iter()
                .map(|&a| describe.place(a))
                .collect(),
            seen_after: t.seen_after.iter().map(|&a| describe.place(a)).collect(),
            regen_error,
        };
        divergences.push(d);
    }
    notes.extend(db_notes(&trace));
    Ok(Report {
        blocks,
        resumed,
        threads: compared,
        divergences,
        problems,
        notes,
        outcome,
    })
}

/// NOTEs of the trace that matter to a verdict (fault injection).
fn db_notes<B: AsRef<[u8]>>(trace: &aetrace_format::Trace<B>) -> Vec<String> {
    trace
        .notes()
        .iter()
        .filter(|n| n.text.starts_with("FAULT INJECTED"))
        .map(|n| format!("the trace says: {}", n.text))
        .collect()
}

fn hex(b: &[u8]) -> String {
    if b.is_empty() {
        return "(none)".into();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Names blocks and guesses at environmental causes, from the original
/// files (a module's CFG is recovered only when a divergence needs
/// describing).
struct Describer<'a> {
    mods: Vec<Described<'a>>,
    /// The modules' file names, shown when there is more than one.
    names: &'a [String],
}

/// One traced module, as the report describes it.
struct Described<'a> {
    elf: &'a elf::Module,
    path: &'a Path,
    db: &'a ProgramDb,
    lines: Option<Lines>,
    program: Option<Option<aetrace_analysis::Program>>,
}

impl<'a> Describer<'a> {
    fn new(mods: Vec<(&'a elf::Module, &'a Path, &'a ProgramDb)>, names: &'a [String]) -> Self {
        Describer {
            mods: mods
                .into_iter()
                .map(|(elf, path, db)| Described {
                    elf,
                    path,
                    db,
                    lines: None,
                    program: None,
                })
                .collect(),
            names,
        }
    }

    fn place(&mut self, (m, addr): Loc) -> Place {
        let module = (self.names.len() > 1)
            .then(|| self.names.get(m).cloned())
            .flatten();
        let Some(d) = self.mods.get_mut(m) else {
            return Place {
                addr,
                proc: "?".into(),
                module,
                line: None,
            };
        };
        let proc =
            d.db.procs
                .iter()
                .find(|p| p.blocks.iter().any(|b| b.start == addr))
                .map_or_else(|| "?".into(), |p| p.name.clone());
        let elf = d.elf;
        let line = d
            .lines
            .get_or_insert_with(|| Lines::load(elf))
            .at(addr)
            .map(|(file, l)| format!("{}:{l}", file.rsplit('/').next().unwrap_or(file)));
        Place {
            addr,
            proc,
            module,
            line,
        }
    }

    fn program(&mut self, m: usize) -> Option<&aetrace_analysis::Program> {
        let d = self.mods.get_mut(m)?;
        let path = d.path;
        d.program
            .get_or_insert_with(|| aetrace_analysis::Program::open(path).ok())
            .as_ref()
    }

    /// A note when `next`, the `side`'s block after the last common block
    /// `last`, enters a procedure that `last` neither calls nor branches to:
    /// an asynchronous entry, a signal handler, and asynchronous signals
    /// (a timer's) arrive at other points in another run.
    /// Blocks of two modules are not compared (a call between modules goes
    /// through a PLT the CFG does not join): no note.
    fn async_entry(&mut self, side: &str, (lm, last): Loc, (nm, next): Loc) -> Option<String> {
        if lm != nm {
            return None;
        }
        let prog = self.program(nm)?;
        let (_, p) = prog.procs.iter().find(|(_, p)| {
            p.cfg
                .as_ref()
                .is_ok_and(|cfg| cfg.blocks[cfg.entry].start == next)
        })?;
        let reaches = prog.procs.iter().any(|(_, q)| {
            let Ok(cfg) = &q.cfg else { return false };
            let Some(b) = cfg.block_at(last) else {
                return false;
            };
            cfg.calls.iter().any(|c| c.block == b)
                || cfg
                    .edges
                    .values()
                    .any(|e| e.from == b && cfg.blocks.get(e.to).is_some_and(|t| t.start == next))
        });
        (!reaches).then(|| format!(
            "the {side} enters {} at {next:#x} right after {last:#x}, which neither calls nor branches there: an asynchronous entry (a signal handler); asynchronous signals, a timer's above all, arrive at other points in another run (paper 004, Section 4.2)",
            p.name
        ))
    }

    /// Paper 004, Section 4.2: what may make two runs of the same program
    /// differ, looked for in the blocks both runs executed last (`before`,
    /// oldest first: a call out of the module or a system call, whose result
    /// comes from outside) and in the
    /// procedures of the blocks around the divergence (`path`): reads of
    /// code addresses or of the return address, which the instrumented
    /// run sees changed.
    fn environment(&mut self, before: &[Loc], path: &[Loc]) -> Vec<String> {
        let mut notes = Vec::new();
        // The newest common block that calls outside the module's own code
        // (an import, an indirect target) or makes a system call.
        'calls: for (distance, &(m, addr)) in before.iter().rev().enumerate() {
            let Some(prog) = self.program(m) else {
                continue;
            };
            let decode = |start, end| decode(&prog.module, start, end);
            for (_, p) in prog.procs.iter() {
                let Ok(cfg) = &p.cfg else { continue };
                let Some(b) = cfg.block_at(addr) else {
                    continue;
                };
                let blk = &cfg.blocks[b];
                let when = match distance {
                    0 => "the last block both runs executed".to_owned(),
                    d => format!(
                        "{d} block{} before the divergence, the run",
                        if d == 1 { "" } else { "s" }
                    ),
                };
                if let Some(c) = cfg
                    .calls
                    .iter()
                    .find(|c| c.block == b && c.kind != aetrace_analysis::cfg::CallKind::Direct)
                {
                    let name = c.name.clone().unwrap_or_else(|| match c.target {
                        Some(t) => format!("{t:#x}"),
                        None => "an indirect target".into(),
                    });
                    notes.push(format!(
                        "{when} called {name} (at {:#x}): if its result differs between runs (time, pid, input, addresses, the environment), the two runs can legitimately part",
                        blk.start
                    ));
                    break 'calls;
                }
                if decode(blk.start, blk.end)
                    .iter()
                    .any(|i| i.mnemonic() == iced_x86::Mnemonic::Syscall)
                {
                    notes.push(format!(
                        "{when} made a system call (in the block at {:#x}): its result may differ between runs",
                        blk.start
                    ));
                    break 'calls;
                }
                break;
            }
        }
        let mut done: Vec<(usize, usize)> = Vec::new();
        for &(m, addr) in path {
            let Some(prog) = self.program(m) else {
                continue;
            };
            let decode = |start, end| decode(&prog.module, start, end);
            let code_end = prog
                .module
                .exec_sections()
                .map(|s| s.end())
                .max()
                .unwrap_or(0);
            for (id, p) in prog.procs.iter() {
                let Ok(cfg) = &p.cfg else { continue };
                if cfg.block_at(addr).is_none() {
                    continue;
                }
                if done.contains(&(m, id.index())) {
                    break;
                }
                done.push((m, id.index()));
                if let Some(at) = reads_return_address(&decode(
                    cfg.blocks[cfg.entry].start,
                    cfg.blocks[cfg.entry].end,
                )) {
                    notes.push(format!(
                        "procedure {} reads its return address (at {at:#x}): in the instrumented run return addresses point into the relocated copies, so code that looks at them behaves differently (paper 004, Section 4.2 and Figure 2); the trace describes the instrumented run, which differs from the original",
                        p.name
                    ));
                }
                let code_ref = cfg.blocks.values().find_map(|b| {
                    decode(b.start, b.end).into_iter().find_map(|i| {
                        let target = i.ip_rel_memory_address();
                        (i.is_ip_rel_memory_operand()
                            && i.flow_control() == iced_x86::FlowControl::Next
                            && target <= code_end)
                            .then_some((i.ip(), target))
                    })
                });
                if let Some((at, target)) = code_ref {
                    notes.push(format!(
                        "procedure {} uses the address {target:#x} of code or of the program's headers (at {at:#x}): a program that reads its own code bytes or compares code addresses sees other values in the instrumented run, which runs relocated copies and has springboards patched into the original text (paper 004, Section 4.2 and Figure 2)",
                        p.name
                    ));
                }
                break;
            }
        }
        notes
    }
}

/// The instructions of `module` in link-time `[start, end)`.
fn decode(module: &elf::Module, start: u64, end: u64) -> Vec<iced_x86::Instruction> {
    let bytes = module.bytes_at(start, end - start).unwrap_or(&[]);
    iced_x86::Decoder::with_ip(64, bytes, start, iced_x86::DecoderOptions::NONE)
        .into_iter()
        .collect()
}

/// Where an entry block reads the return address (`[rsp]` before the
/// stack pointer moves, or `[rsp+N]` after N bytes of pushes and `sub`),
/// if it does.
fn reads_return_address(insns: &[iced_x86::Instruction]) -> Option<u64> {
    use iced_x86::{Mnemonic, OpKind, Register};
    let mut depth: i64 = 0;
    let mut frame: Option<i64> = None;
    for i in insns {
        let reads_mem = (0..i.op_count()).any(|k| i.op_kind(k) == OpKind::Memory)
            && !matches!(
                i.mnemonic(),
                Mnemonic::Push | Mnemonic::Pop | Mnemonic::Ret | Mnemonic::Call | Mnemonic::Lea
            );
        let disp = i.memory_displacement64() as i64;
        if reads_mem && i.memory_index() == Register::None {
            if i.memory_base() == Register::RSP && disp == depth {
                return Some(i.ip());
            }
            if i.memory_base() == Register::RBP && frame == Some(disp) {
                return Some(i.ip());
            }
        }
        match i.mnemonic() {
            Mnemonic::Push => depth += 8,
            Mnemonic::Pop => depth -= 8,
            Mnemonic::Sub
                if i.op0_register() == Register::RSP && i.op_kind(1) != OpKind::Register =>
            {
                depth += i.immediate(1) as i64
            }
            Mnemonic::Add
                if i.op0_register() == Register::RSP && i.op_kind(1) != OpKind::Register =>
            {
                depth -= i.immediate(1) as i64
            }
            Mnemonic::Mov
                if i.op0_register() == Register::RBP && i.op1_register() == Register::RSP =>
            {
                frame = Some(depth)
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::reads_return_address;

    fn decode(bytes: &[u8]) -> Vec<iced_x86::Instruction> {
        iced_x86::Decoder::with_ip(64, bytes, 0x1000, iced_x86::DecoderOptions::NONE)
            .into_iter()
            .collect()
    }

    #[test]
    fn return_address_reads() {
        // mov rax, [rsp]
        assert_eq!(
            reads_return_address(&decode(&[0x48, 0x8b, 0x04, 0x24])),
            Some(0x1000)
        );
        // push rbp; mov rbp, rsp; mov rax, [rbp+8]
        let framed = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x8b, 0x45, 0x08];
        assert_eq!(reads_return_address(&decode(&framed)), Some(0x1004));
        // sub rsp, 8; mov rax, [rsp+8]
        let sub = [0x48, 0x83, 0xec, 0x08, 0x48, 0x8b, 0x44, 0x24, 0x08];
        assert_eq!(reads_return_address(&decode(&sub)), Some(0x1004));
        // mov rax, [rsp+8] before any push: the caller's frame, not the
        // return address; push rax; pop rax: the stack, not a read.
        assert_eq!(
            reads_return_address(&decode(&[0x48, 0x8b, 0x44, 0x24, 0x08])),
            None
        );
        assert_eq!(reads_return_address(&decode(&[0x50, 0x58])), None);
    }
}
