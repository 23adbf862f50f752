//! Running a program under `valgrind --tool=lackey --trace-mem=yes` and
//! reducing its instruction stream, while it streams, to per-module sets:
//! executed addresses, distinct consecutive pairs, entries into the module;
//! or keeping each module's whole sequence (`Capture::Sequences`); or
//! handing each instruction to a sink and keeping nothing
//! (`run_streaming`, the comparison of `exact.rs`).
//!
//! Module load bases come from valgrind itself, not from our code: with
//! `--trace-symtab=yes --trace-symtab-patt=PATTERN` valgrind 3.19 dumps, for
//! every object whose name matches PATTERN, a block opening with
//! `------ name = PATH`, containing `rx_map:  avma 0x.. size N foff N` (the
//! runtime range of each executable mapping) and
//! `PT_LOAD[i]:   acquired as rx, bias 0x..` (runtime minus link-time
//! address). This dump goes to the same log as lackey's `I  addr,size` lines
//! and precedes the module's first instruction (it is written when the
//! mapping appears), so one pass over the log suffices. A runtime address
//! inside a module's rx mapping normalises to `addr - bias`, the address the
//! CFG uses.
//!
//! Consecutive pairs are taken per thread: valgrind runs one thread at a
//! time and, with `--trace-sched=yes`, logs `SCHED[tid]:  acquired lock`
//! in the same stream whenever a thread (re)starts running, so the reducer
//! keeps each thread's previous instruction across switches (lackey's
//! events of a superblock are flushed before control returns to the
//! scheduler, so the order is exact).
//!
//! Signal delivery is followed the same way (`--trace-signals=yes` logs
//! `push_signal_frame` and `VG_(signal_return)`): a handler's first
//! instruction is an entry, and after `rt_sigreturn` the interrupted chain
//! resumes where it stopped.
//!
//! The chain of consecutive instructions is broken whenever the stream
//! leaves the modules being checked (the dynamic loader, libc, valgrind's
//! own replacement functions in vgpreload, the vdso): a pair is recorded only
//! for two consecutive instructions of the same module, and the first
//! instruction after a break is recorded as an *entry* of its module.
//!
//! The log goes through a pipe (`--log-fd=3`, fd 3 being our pipe), never
//! into memory whole: bzip2 on 20 kB is about 25 million `I` lines. Programs
//! that fork use per-process log files (`--log-file=DIR/lackey.%p`) instead,
//! because two processes writing one pipe would interleave lines; a forked
//! child inherits its parent's mappings but valgrind does not dump them
//! again, so the maps are read from all files before any instruction.
//!
//! A log through the pipe is kept, compressed, for this process's other
//! runs of the same program, arguments and input (`lackey_cache`: gzip on
//! the 20 kB text is read by eight tests, from one valgrind run); the
//! program's stdout and stderr go to files named as the shell's
//! arguments, not in variables, so its environment is the test's.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};

use super::{lackey_cache, FastMap, FastSet};

/// What the instruction stream did inside one module (addresses normalised
/// to link-time addresses).
#[derive(Default, Debug)]
pub struct ModuleTrace {
    pub path: PathBuf,
    pub bias: Option<u64>,
    /// Number of executed instructions (`I` lines) inside the module.
    pub executed: u64,
    /// Distinct (a, b): b executed right after a, both in this module.
    pub pairs: FastSet<(u64, u64)>,
    /// First instructions after the stream came from outside the module (or
    /// at the start of a process).
    pub entries: FastSet<u64>,
    /// First instructions of a new thread or a forked child, when in the
    /// module: they continue the `clone`/`fork` system call of their
    /// parent, so they must directly follow a `syscall` instruction.
    pub resumes: FastSet<u64>,
    /// With [`Capture::Sequences`]: every executed address in order, per
    /// thread, keyed by the order threads started (valgrind reuses its
    /// thread ids once a thread has exited).
    pub sequences: std::collections::BTreeMap<usize, Vec<u64>>,
    /// With [`run_counting_data`]: the data references (` L addr,size`,
    /// ` S`, ` M` lines) of the module's instructions, per form (`L8`).
    pub data: std::collections::BTreeMap<String, u64>,
}

impl ModuleTrace {
    /// Every executed address of the module.
    pub fn executed_addrs(&self) -> FastSet<u64> {
        let mut s: FastSet<u64> = self.entries.union(&self.resumes).copied().collect();
        for &(a, b) in &self.pairs {
            s.insert(a);
            s.insert(b);
        }
        s
    }
}

pub struct Run {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub modules: Vec<ModuleTrace>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum LogMode {
    Pipe,
    PerProcessFiles,
}

struct Range {
    lo: u64,
    hi: u64,
    module: usize,
}

const CACHE_SLOTS: usize = 1 << 12;

/// Receives each instruction inside a checked module, in log order, as
/// (module index, thread key, link-time address); returns false to stop
/// reading the log (the comparison has failed).
pub type Sink<'s> = &'s mut dyn FnMut(usize, usize, u64) -> bool;

/// Receives each data reference of an instruction the [`Sink`] was given,
/// as (kind `b'L'`/`b'S'`/`b'M'`, run-time address, size, the modules with
/// the load biases valgrind reported); returns false to stop reading.
pub type DataSink<'s> = &'s mut dyn FnMut(u8, u64, u32, &[ModuleTrace]) -> bool;

/// The streaming reducer: the state carried from one log line to the next.
struct Reducer<'s> {
    wanted: Vec<PathBuf>,
    modules: Vec<ModuleTrace>,
    ranges: Vec<Range>,
    current_object: Option<usize>,
    last_range: usize,
    /// The previous instruction of the running thread, if it was in a
    /// module.
    prev: Option<(usize, u64)>,
    /// Valgrind's id of the running thread, and each switched-out thread's
    /// `prev`.
    thread: usize,
    parked: Vec<Option<(usize, u64)>>,
    /// Per thread, the `prev` of each signal frame being handled.
    signal_frames: Vec<Vec<Option<(usize, u64)>>>,
    /// The next instruction starts a new thread or forked process.
    resume_next: bool,
    /// Direct-mapped cache of recently seen pairs, so the hot loops of a
    /// program do not pay a hash-set insertion per instruction.
    recent: Vec<(usize, u64, u64)>,
    capture: Capture,
    /// Per valgrind thread id, the start-order key of the thread it runs.
    thread_key: Vec<usize>,
    threads_started: usize,
    /// When set, instructions go here instead of into the sets and
    /// sequences; `stopped` once it has returned false.
    sink: Option<Sink<'s>>,
    /// With a sink: where the data references of its instructions go.
    data_sink: Option<DataSink<'s>>,
    stopped: bool,
    /// Count data references per module (`ModuleTrace::data`): the module
    /// of the last `I` line, if any, and the counts by (kind, size).
    data: bool,
    current: Option<usize>,
    /// Per module, link-time ranges whose instructions are left out
    /// (neither executed nor data).
    excluded: Vec<Vec<(u64, u64)>>,
    data_counts: Vec<FastMap<(u8, u32), u64>>,
}

/// Whether to keep the whole instruction sequence of each module (exact
/// trace comparisons) or only the reduced sets.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    Sets,
    Sequences,
}

fn hex(s: &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    for &c in s {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => return None,
        };
        v = v << 4 | u64::from(d);
    }
    Some(v)
}

/// `ADDR,SIZE`, the rest of a lackey-format line after its kind (hex
/// address, decimal size).
pub fn addr_size(rest: &[u8]) -> Option<(u64, u32)> {
    let comma = rest.iter().position(|&c| c == b',')?;
    let digits = &rest[comma + 1..];
    if digits.is_empty() || digits.len() > 9 {
        return None;
    }
    let mut size = 0u32;
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        size = size * 10 + u32::from(c - b'0');
    }
    Some((hex(&rest[..comma])?, size))
}

fn bad_line(line: &[u8]) -> ! {
    panic!("bad lackey line {:?}", String::from_utf8_lossy(line))
}

/// The decimal number following `key` in `line`.
fn number_after(line: &[u8], key: &[u8]) -> Option<usize> {
    let at = line.windows(key.len()).position(|w| w == key)? + key.len();
    let rest = &line[at..];
    let len = rest.iter().take_while(|c| c.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..len]).ok()?.parse().ok()
}

/// The hex number following `key` in `line` (`key` includes the `0x`).
fn hex_after(line: &[u8], key: &[u8]) -> Option<u64> {
    let at = line.windows(key.len()).position(|w| w == key)? + key.len();
    let rest = &line[at..];
    let len = rest.iter().take_while(|c| c.is_ascii_hexdigit()).count();
    hex(&rest[..len])
}

fn dec_after(line: &[u8], key: &[u8]) -> Option<u64> {
    let at = line.windows(key.len()).position(|w| w == key)? + key.len();
    let rest = &line[at..];
    let rest = &rest[rest.iter().take_while(|c| **c == b' ').count()..];
    let len = rest.iter().take_while(|c| c.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..len]).ok()?.parse().ok()
}

impl<'s> Reducer<'s> {
    fn new(wanted: &[PathBuf], capture: Capture, sink: Option<Sink<'s>>) -> Reducer<'s> {
        let wanted: Vec<PathBuf> = wanted
            .iter()
            .map(|p| std::fs::canonicalize(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
            .collect();
        let modules = wanted
            .iter()
            .map(|p| ModuleTrace {
                path: p.clone(),
                ..Default::default()
            })
            .collect();
        Reducer {
            wanted,
            modules,
            ranges: Vec::new(),
            current_object: None,
            last_range: 0,
            prev: None,
            thread: 1,
            parked: Vec::new(),
            signal_frames: Vec::new(),
            resume_next: false,
            recent: vec![(usize::MAX, 0, 0); CACHE_SLOTS],
            capture,
            thread_key: Vec::new(),
            threads_started: 0,
            sink,
            data_sink: None,
            stopped: false,
            data: false,
            current: None,
            excluded: Vec::new(),
            data_counts: Vec::new(),
        }
    }

    /// A line of valgrind's symbol-table trace (object name, rx maps, bias).
    fn symtab_line(&mut self, line: &[u8]) {
        if line.starts_with(b"------ end ELF OBJECT") {
            self.current_object = None;
        } else if let Some(name) = line.strip_prefix(b"------ name = ") {
            let name = String::from_utf8_lossy(name).trim().to_owned();
            self.current_object = std::fs::canonicalize(&name)
                .ok()
                .and_then(|p| self.wanted.iter().position(|w| *w == p));
        } else if let Some(m) = self.current_object {
            if line.starts_with(b"rx_map:") {
                let lo = hex_after(line, b"avma 0x").expect("rx_map line has avma");
                let size = dec_after(line, b"size").expect("rx_map line has size");
                if !self.ranges.iter().any(|r| r.lo == lo && r.module == m) {
                    self.ranges.push(Range {
                        lo,
                        hi: lo + size,
                        module: m,
                    });
                }
            } else if line.windows(15).any(|w| w == b"acquired as rx,") {
                let bias = hex_after(line, b"bias 0x").expect("PT_LOAD line has a bias");
                let old = self.modules[m].bias.replace(bias);
                assert!(
                    old.is_none() || old == Some(bias),
                    "valgrind reports two biases for {}",
                    self.modules[m].path.display()
                );
            }
        }
    }

    fn module_of(&mut self, addr: u64) -> Option<usize> {
        if let Some(r) = self.ranges.get(self.last_range) {
            if r.lo <= addr && addr < r.hi {
                return Some(r.module);
            }
        }
        let i = self
            .ranges
            .iter()
            .position(|r| r.lo <= addr && addr < r.hi)?;
        self.last_range = i;
        Some(self.ranges[i].module)
    }

    fn instruction(&mut self, runtime: u64) {
        let resume = std::mem::take(&mut self.resume_next);
        self.current = self.module_of(runtime);
        let Some(m) = self.current else {
            self.prev = None;
            return;
        };
        let bias = self.modules[m].bias.unwrap_or_else(|| {
            panic!(
                "valgrind gave no load bias for {} before its first instruction",
                self.modules[m].path.display()
            )
        });
        let addr = runtime.wrapping_sub(bias);
        let excluded = self
            .excluded
            .get(m)
            .is_some_and(|r| r.iter().any(|&(lo, hi)| lo <= addr && addr < hi));
        if excluded {
            self.current = None;
            self.prev = None;
            return;
        }
        let key = self.thread_key.get(self.thread).copied().unwrap_or(0);
        let t = &mut self.modules[m];
        // Lackey logs a `rep` instruction once per iteration: with data
        // counted, a repeat of the previous address is the same instance.
        if self.data && self.prev == Some((m, addr)) {
            return;
        }
        t.executed += 1;
        if let Some(sink) = &mut self.sink {
            self.prev = Some((m, addr));
            self.stopped = !sink(m, key, addr);
            return;
        }
        if self.capture == Capture::Sequences {
            t.sequences.entry(key).or_default().push(addr);
        }
        match self.prev {
            Some((pm, a)) if pm == m => {
                let h = (a ^ addr.rotate_left(23)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52;
                let slot = &mut self.recent[h as usize % CACHE_SLOTS];
                if *slot != (m, a, addr) {
                    *slot = (m, a, addr);
                    t.pairs.insert((a, addr));
                }
            }
            _ if resume => {
                t.resumes.insert(addr);
            }
            _ => {
                t.entries.insert(addr);
            }
        }
        self.prev = Some((m, addr));
    }

    /// A line of valgrind's own log. Scheduler events (`--trace-sched=yes`):
    /// `SCHED[tid]:  acquired lock (...)` says thread tid runs from here on;
    /// a new thread starts and an exiting thread ends its chain. Signal
    /// events (`--trace-signals=yes`): `push_signal_frame (thread tid)`
    /// starts the handler as a new chain (an entry) and
    /// `VG_(signal_return) (thread tid)` resumes the interrupted one.
    fn core_line(&mut self, line: &[u8]) {
        let has = |s: &[u8]| line.windows(s.len()).any(|w| w == s);
        if has(b"push_signal_frame (thread ") || has(b"VG_(signal_return) (thread ") {
            let Some(tid) = number_after(line, b"(thread ") else {
                return;
            };
            if self.signal_frames.len() <= tid {
                self.signal_frames.resize(tid + 1, Vec::new());
            }
            if has(b"push_signal_frame") {
                self.signal_frames[tid].push(self.prev);
                self.prev = None;
            } else {
                self.prev = self.signal_frames[tid].pop().flatten();
            }
            return;
        }
        let Some(tid) = number_after(line, b"SCHED[") else {
            return;
        };
        if has(b"acquired lock") {
            if self.parked.len() <= tid.max(self.thread) {
                self.parked.resize(tid.max(self.thread) + 1, None);
            }
            self.parked[self.thread] = self.prev;
            self.thread = tid;
            if has(b"starting new thread") {
                if self.thread_key.len() <= tid {
                    self.thread_key.resize(tid + 1, 0);
                }
                self.thread_key[tid] = self.threads_started;
                self.threads_started += 1;
            }
            self.prev = if has(b"starting new thread") {
                // Thread 1 starts the process; the others return from clone.
                self.resume_next = tid != 1;
                None
            } else {
                self.parked[tid]
            };
        } else if has(b"exit_thread") || has(b"exiting VG_(scheduler)") {
            self.prev = None;
        }
    }

    fn line(&mut self, line: &[u8], maps: bool, trace: bool) {
        if let Some(rest) = line.strip_prefix(b"I  ") {
            if trace {
                let len = rest.iter().position(|&c| c == b',').unwrap_or(rest.len());
                match hex(&rest[..len]) {
                    Some(a) => self.instruction(a),
                    None => panic!("bad lackey line {:?}", String::from_utf8_lossy(line)),
                }
            }
        } else if line.starts_with(b" ") {
            if trace && self.data {
                self.data_line(line);
            }
        } else {
            // (Lines opening with a space are data references, ` L
            // addr,size`, the other frequent kind.)
            if trace && line.starts_with(b"--") {
                self.core_line(line);
            }
            if maps {
                self.symtab_line(line);
            }
        }
    }

    /// A data reference, ` K addr,size`, of the last instruction.
    fn data_line(&mut self, line: &[u8]) {
        let Some(m) = self.current else { return };
        let kind = line.get(1).copied().unwrap_or(b'?');
        let (addr, size) = line
            .get(3..)
            .and_then(addr_size)
            .unwrap_or_else(|| bad_line(line));
        if let Some(sink) = &mut self.data_sink {
            self.stopped = !sink(kind, addr, size, &self.modules);
            return;
        }
        if self.data_counts.len() <= m {
            self.data_counts.resize_with(m + 1, FastMap::default);
        }
        *self.data_counts[m].entry((kind, size)).or_default() += 1;
    }

    /// Reduces one log; `forked`: the log of a forked child, whose first
    /// instruction returns from `fork`.
    fn feed(&mut self, input: impl Read, maps: bool, trace: bool, forked: bool) {
        let mut r = BufReader::with_capacity(1 << 20, input);
        let mut buf = Vec::with_capacity(256);
        self.prev = None;
        self.thread = 1;
        self.parked.clear();
        self.signal_frames.clear();
        self.resume_next = forked;
        if trace {
            // Each process's first thread is a new sequence.
            if self.thread_key.len() < 2 {
                self.thread_key.resize(2, 0);
            }
            self.thread_key[1] = self.threads_started;
            self.threads_started += 1;
        }
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => panic!("reading the lackey log: {e}"),
            }
            let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
            self.line(line, maps, trace);
            if self.stopped {
                break;
            }
        }
        self.prev = None;
    }
}

/// A pipe valgrind writes one line per system call into. After a short
/// read the reader waits 5 ms, so it is seldom asleep on the pipe when
/// valgrind writes: a write that wakes a reader costs a context switch.
/// (lackey on gzip 20 kB, 5 M lines, at load 12: 7.3 s user + system with
/// a reader asleep on each write, 5.4 s with one waiting 5 ms.)
struct Patient<R>(R);

impl<R: Read> Read for Patient<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.read(buf)?;
        if n > 0 && n < buf.len() / 4 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(n)
    }
}

/// Reduces one complete valgrind log (symbol-table trace, scheduler trace
/// and lackey lines) for `modules`.
pub fn reduce(log: impl Read, modules: &[PathBuf]) -> Vec<ModuleTrace> {
    let mut reducer = Reducer::new(modules, Capture::Sets, None);
    reducer.feed(log, true, true, false);
    reducer.modules
}

/// The narrowest `--trace-symtab-patt` glob that still names every one of
/// `modules`: `*/NAME` for a single module whose path and canonical path
/// end in the same NAME (valgrind names the object by either), else `*`.
/// Valgrind dumps the symbol table of every object the pattern matches:
/// with `*`, libc's alone is about 2 MB of log, 46 % of a small program's
/// run under lackey (`signal.c` -O2: 4.7 MB against 2.6 MB; 0.68 against
/// 0.53 s of valgrind's CPU). A module the pattern misses fails the run
/// (`run_into`: "valgrind never mapped").
pub fn symtab_pattern(modules: &[PathBuf]) -> String {
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    match modules {
        [m] => match (name(m), std::fs::canonicalize(m).ok()) {
            (Some(n), Some(c)) if name(&c).as_ref() == Some(&n) && !n.contains(['*', '?']) => {
                format!("*/{n}")
            }
            _ => "*".into(),
        },
        _ => "*".into(),
    }
}

/// Runs `exe args` (stdin from /dev/null) under lackey and reduces
/// the instruction stream for each module in `modules` (paths of the files
/// the CFGs were computed from). `pattern` is valgrind's
/// `--trace-symtab-patt` glob: it must match the object names of all of
/// `modules` and should match little else (the dumps are large).
pub fn run(exe: &Path, args: &[&str], modules: &[PathBuf], pattern: &str, mode: LogMode) -> Run {
    let reducer = Reducer::new(modules, Capture::Sets, None);
    run_into(exe, args, &Launch::default(), pattern, mode, reducer)
}

/// [`run`] with the narrowest symbol-table pattern for `modules`
/// ([`symtab_pattern`]), keeping the instruction sequences when `capture`
/// says so.
pub fn run_with(
    exe: &Path,
    args: &[&str],
    modules: &[PathBuf],
    mode: LogMode,
    capture: Capture,
) -> Run {
    let pattern = symtab_pattern(modules);
    let reducer = Reducer::new(modules, capture, None);
    run_into(exe, args, &Launch::default(), &pattern, mode, reducer)
}

/// [`run_with`] for the executable `exe` alone, keeping its instruction
/// sequence per thread (one log through a pipe).
pub fn executable_sequences(exe: &Path, args: &[&str]) -> Run {
    executable_sequences_with(exe, args, &Launch::default())
}

/// [`executable_sequences`], the program given `with` (stdin, variables).
pub fn executable_sequences_with(exe: &Path, args: &[&str], with: &Launch) -> Run {
    let modules = [exe.to_path_buf()];
    let reducer = Reducer::new(&modules, Capture::Sequences, None);
    let pattern = symtab_pattern(&modules);
    run_into(exe, args, with, &pattern, LogMode::Pipe, reducer)
}

/// [`run`] also counting each module's data references by form
/// (`ModuleTrace::data`), leaving out the instructions in each module's
/// `excluded` link-time ranges.
pub fn run_counting_data(
    exe: &Path,
    args: &[&str],
    modules: &[PathBuf],
    pattern: &str,
    excluded: Vec<Vec<(u64, u64)>>,
) -> Run {
    let mut reducer = Reducer::new(modules, Capture::Sets, None);
    reducer.data = true;
    reducer.excluded = excluded;
    run_into(
        exe,
        args,
        &Launch::default(),
        pattern,
        LogMode::Pipe,
        reducer,
    )
}

/// [`run`] handing each instruction of `modules` to `sink` as the log
/// streams, keeping nothing (a run of billions of instructions needs no
/// memory); a single log through a pipe. If `sink` stops the reading,
/// valgrind is killed and the returned status is its death.
pub fn run_streaming(
    exe: &Path,
    args: &[&str],
    with: &Launch,
    modules: &[PathBuf],
    sink: Sink,
) -> Run {
    let reducer = Reducer::new(modules, Capture::Sets, Some(sink));
    let mode = LogMode::Pipe;
    run_into(exe, args, with, &symtab_pattern(modules), mode, reducer)
}

/// [`run_streaming`] with the data references too: each instruction of
/// `modules` outside their `excluded` link-time ranges goes to `sink`
/// (a `rep` instruction once, as lackey logs it once per iteration), then
/// its data references, every iteration's, to `data_sink`.
pub fn run_streaming_data(
    exe: &Path,
    args: &[&str],
    with: &Launch,
    modules: &[PathBuf],
    excluded: Vec<Vec<(u64, u64)>>,
    sinks: (Sink, DataSink),
) -> Run {
    let mut reducer = Reducer::new(modules, Capture::Sets, Some(sinks.0));
    reducer.data_sink = Some(sinks.1);
    reducer.data = true;
    reducer.excluded = excluded;
    run_into(
        exe,
        args,
        with,
        &symtab_pattern(modules),
        LogMode::Pipe,
        reducer,
    )
}

/// What the program under valgrind gets besides its arguments: stdin
/// (else /dev/null) and variables added to the inherited environment.
#[derive(Default)]
pub struct Launch<'a> {
    pub stdin: Option<&'a Path>,
    pub env: &'a [(String, String)],
}

/// The options every run gets (its symbol-table pattern and log apart).
fn valgrind_options() -> Vec<String> {
    [
        "valgrind",
        "--tool=lackey",
        "--trace-mem=yes",
        // VEX's chasing into conditional branch targets makes lackey report
        // instructions of the untaken side (measured: nested_if's `je` at
        // 0x10dc, 1026 reported executions of its fall-through block against
        // 505 counted by gdb breakpoints); without chasing the stream is exact.
        "--vex-guest-chase=no",
        // valgrind runs glibc's and libstdc++'s free-at-exit code, which a
        // native run never runs (seen in libc.so.6 once it is traced).
        "--run-libc-freeres=no",
        "--run-cxx-freeres=no",
        "--basic-counts=no",
        "--trace-symtab=yes",
        "--trace-sched=yes",
        "--trace-signals=yes",
    ]
    .map(String::from)
    .to_vec()
}

/// How a run ended: valgrind's status, the program's stdout and stderr.
type Ended = (ExitStatus, Vec<u8>, Vec<u8>);

fn run_into(
    exe: &Path,
    args: &[&str],
    with: &Launch,
    pattern: &str,
    mode: LogMode,
    mut reducer: Reducer,
) -> Run {
    let program: Vec<String> = std::iter::once(exe.display().to_string())
        .chain(args.iter().map(|s| s.to_string()))
        .collect();
    let (status, stdout, stderr) = match mode {
        LogMode::Pipe => piped(&program, with, pattern, &mut reducer),
        LogMode::PerProcessFiles => per_process(&program, with, pattern, &mut reducer),
    };
    for m in &reducer.modules {
        assert!(
            m.bias.is_some(),
            "valgrind never mapped {} (pattern {pattern:?}); stderr: {}",
            m.path.display(),
            String::from_utf8_lossy(&stderr)
        );
    }
    for (m, counts) in reducer.data_counts.iter().enumerate() {
        reducer.modules[m].data = counts
            .iter()
            .map(|(&(kind, size), &n)| (format!("{}{size}", kind as char), n))
            .collect();
    }
    Run {
        status,
        stdout,
        modules: reducer.modules,
    }
}

/// A run whose single log comes through a pipe, or from this process's
/// kept log of the same run (`lackey_cache`), which it is kept as when
/// read whole.
fn piped(program: &[String], with: &Launch, pattern: &str, reducer: &mut Reducer) -> Ended {
    let mut argv = valgrind_options();
    argv.extend_from_slice(program);
    let run = lackey_cache::Run {
        argv: &argv,
        stdin: with.stdin,
        env: with.env,
        modules: &reducer.wanted,
    };
    let slot = lackey_cache::slot(&run);
    let mut slot = lackey_cache::lock(&slot);
    if let Some(kept) = slot.serving(&run, pattern) {
        reducer.feed(kept.log(), true, true, false);
        return (kept.status, kept.stdout.clone(), kept.stderr.clone());
    }
    let mut copy = slot.writer(&run, pattern);
    let mut vg = launch(program, with, pattern, "--log-fd=3");
    // valgrind writes each log line with a system call of its own: a 1 MiB
    // pipe lets it run ahead of the reader (lackey on gzip 20 kB: 2.3 s
    // into a 1 MiB pipe read 1 MiB at a time, 3.0 s into a default pipe
    // read by `wc`, 1.8 s into /dev/null; fails harmlessly where the limit
    // is lower).
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&vg.pipe),
            libc::F_SETPIPE_SZ,
            1 << 20,
        )
    };
    let from = Patient(&mut vg.pipe);
    let tee = lackey_cache::Tee {
        from,
        copy: &mut copy,
    };
    reducer.feed(tee, true, true, false);
    let ended = vg.end(reducer.stopped);
    if reducer.stopped || !copy.whole() {
        copy.discard();
    } else {
        slot.keep(copy, ended.0, &ended.1, &ended.2);
    }
    ended
}

/// A run of a program that forks, logging to one file per process.
fn per_process(program: &[String], with: &Launch, pattern: &str, reducer: &mut Reducer) -> Ended {
    let log_dir = super::scratch("lackey").join(format!("{}.logs", run_tag(program)));
    let _ = std::fs::remove_dir_all(&log_dir);
    std::fs::create_dir_all(&log_dir).unwrap();
    let log = format!("--log-file={}/lackey.%p", log_dir.display());
    let vg = launch(program, with, pattern, &log);
    let first = format!("lackey.{}", vg.child.id());
    let key = super::creation_key(vg.child.id());
    let ended = vg.end(false);
    let mut logs: Vec<PathBuf> = std::fs::read_dir(&log_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    // `sh` execs valgrind: the first process keeps the shell's pid.
    // The first process, then the others in the order they were created.
    let pid = |l: &PathBuf| -> (bool, u32) {
        let name = l.file_name().unwrap().to_string_lossy().into_owned();
        let n = name.trim_start_matches("lackey.").parse().map(&key);
        (name != first, n.unwrap_or(u32::MAX))
    };
    logs.sort_by_key(pid);
    for l in &logs {
        reducer.feed(File::open(l).unwrap(), true, false, false);
    }
    for l in &logs {
        let forked = l.file_name().is_some_and(|n| *n != *first);
        reducer.feed(File::open(l).unwrap(), false, true, forked);
    }
    let _ = std::fs::remove_dir_all(&log_dir);
    ended
}

/// A name for one run's files: the program, this process and thread.
fn run_tag(program: &[String]) -> String {
    let name = Path::new(&program[0])
        .file_name()
        .unwrap()
        .to_string_lossy();
    format!(
        "{name}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    )
    .replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_")
}

/// Valgrind running, its fd 3 our pipe, the program's stdout and stderr
/// going to files.
struct Valgrind {
    child: Child,
    pipe: ChildStdout,
    out: PathBuf,
    err: PathBuf,
}

/// Starts `program` under lackey with symbol-table `pattern` and `log`
/// (the option naming where the log goes).
fn launch(program: &[String], with: &Launch, pattern: &str, log: &str) -> Valgrind {
    let work = super::scratch("lackey");
    let tag = run_tag(program);
    let (out, err) = (
        work.join(format!("{tag}.stdout")),
        work.join(format!("{tag}.stderr")),
    );
    // The shell routes the program's stdout/stderr to files and valgrind's
    // log (fd 3) to our pipe; the files are its arguments, not variables,
    // so the program's environment is the test's (and `with.env`).
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"o=$1 e=$2; shift 2; exec "$@" 3>&1 1>"$o" 2>"$e""#)
        .arg("sh")
        .arg(&out)
        .arg(&err)
        .args(valgrind_options())
        .arg(format!("--trace-symtab-patt={pattern}"))
        .arg(log)
        .args(program)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    match with.stdin {
        Some(f) => cmd.stdin(File::open(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()))),
        None => cmd.stdin(Stdio::null()),
    };
    cmd.envs(with.env.iter().map(|(k, v)| (k, v)));
    let mut child = cmd.spawn().expect("spawning valgrind");
    let pipe = child.stdout.take().unwrap();
    Valgrind {
        child,
        pipe,
        out,
        err,
    }
}

impl Valgrind {
    /// Waits for valgrind (killed first if `kill`: its reader stopped)
    /// and takes the program's output.
    fn end(mut self, kill: bool) -> Ended {
        if kill {
            let _ = self.child.kill();
        }
        drop(self.pipe);
        let status = self.child.wait().expect("waiting for valgrind");
        let take = |p: &Path| {
            let bytes = std::fs::read(p).unwrap_or_default();
            let _ = std::fs::remove_file(p);
            bytes
        };
        (status, take(&self.out), take(&self.err))
    }
}

/// Runs `exe args` under `valgrind --tool=lackey --trace-mem=yes
/// --vex-guest-chase=no` with its log at `log` (the program's stdout
/// dropped) and returns the log's text; panics naming `exe` when the run
/// fails.
pub fn memory_log(exe: &Path, args: &[&str], log: &Path) -> String {
    memory_log_with(exe, args, log, &[])
}

/// Valgrind's options for a program whose fault handlers return: the
/// faulting instruction then runs again with every register as natively
/// (else only `rsp`, `rip` and `rbp` are exact at a memory access), and a
/// superblock is one instruction, so a fault drops the events of that
/// instruction alone (lackey never lists it), not of the ones before it.
pub const AT_FAULTS: &[&str] = &[
    "--vex-iropt-register-updates=allregs-at-mem-access",
    "--vex-guest-max-insns=1",
];

/// [`memory_log`] with more valgrind options (`valgrind`).
pub fn memory_log_with(exe: &Path, args: &[&str], log: &Path, valgrind: &[&str]) -> String {
    let (status, text) = memory_run(exe, args, log, valgrind);
    assert!(status.success(), "{}: lackey run failed", exe.display());
    text
}

/// [`memory_log_with`] of a run that must end by a signal (a crash).
pub fn crash_memory_log(exe: &Path, args: &[&str], log: &Path, valgrind: &[&str]) -> String {
    let (status, text) = memory_run(exe, args, log, valgrind);
    assert!(
        !status.success(),
        "{}: the lackey run did not crash",
        exe.display()
    );
    text
}

fn memory_run(
    exe: &Path,
    args: &[&str],
    log: &Path,
    valgrind: &[&str],
) -> (std::process::ExitStatus, String) {
    let status = Command::new("valgrind")
        .args(["--tool=lackey", "--trace-mem=yes", "--vex-guest-chase=no"])
        .args(valgrind)
        .arg(format!("--log-file={}", log.display()))
        .arg(exe)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    (status, std::fs::read_to_string(log).unwrap())
}
