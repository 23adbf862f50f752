//! Driving the regeneration of a whole trace: choosing threads and modules,
//! running one [`Machine`] per thread, with `-j N` cut into pieces by the
//! summarised fast pass and expanded in parallel (`docs/regen.md` section
//! 4), and writing the output in thread and piece order, byte-identical
//! for any number of jobs and any piece size.
//!
//! Output formats (`docs/regen.md`): `insn` one lowercase hex address per
//! instruction; `block` `ADDR SIZE NINSNS` (hex, decimal, decimal); `din`
//! `2 ADDR` per instruction (Dinero's traditional format); `xdin`
//! `i ADDR SIZE` per instruction (extended din, both hex); `bin` the
//! `aetrace_format::addrtrace` format with an unknown count. Text formats
//! `insn` and `block` announce each thread with `# thread N pid P tid T`
//! and mark where the recorded run took a signal with `# signal SIGNO`;
//! `din`, `xdin` and `bin` carry no comments (Dinero IV accepts none).
//!
//! Invariants: output is produced in batches of about [`BATCH`] bytes;
//! with `jobs > 1` at most `jobs` pieces expand at once, the pieces not
//! being written together at most a worker's share of [`AHEAD_BYTES`]
//! ahead of the writer (the one being written as much again), and at most `2 * jobs` cut pieces
//! wait (`ordered`, the one writer of output in order, which the
//! data walk's pieces use too), so memory stays bounded however long the streams are; a piece
//! ends exactly where the next one's snapshot was taken (the same read
//! point, checked by the equality tests against `-j 1`). Into a file, when
//! the state index counted the output before each piece, the workers write
//! their pieces at their offsets and nothing waits for the writer; each
//! walks a region of consecutive pieces as one walk and then steals from
//! the largest region left ([`crate::regions`]), and the writer checks
//! that each piece starts where the one before it ended.

use crate::compile::{Addressing, Module};
use crate::ending::Ending;
use crate::error::{Error, Result};
use crate::index::{Entry, StateIndex};
use crate::machine::{ForkState, Machine, Progress, Sink};
use crate::ordered::{in_order, Spare, Tasks};
use crate::regions::Regions;
use crate::stream::Stream;
use crate::summary::Summaries;
use aetrace_format::{
    module_flags, EndReason, ExitStatus, ModuleId, StartReason, Status, ThreadId, ThreadInfo, Trace,
};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Seek, Write};
use std::os::unix::fs::FileExt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

/// Bytes of output a machine produces before handing them to the writer.
pub const BATCH: usize = 1 << 20;
/// Output the parallel workers may hold ahead of the writer, in total: the
/// thread being written streams through, the others can only get this far
/// ahead (measured: 16 MiB per worker gave `-j 2` no speed-up on two
/// threads of 110 MB of output each; 128 MiB gave 1.19x on a loaded machine).
pub const AHEAD_BYTES: usize = 256 << 20;
/// [`AHEAD_BYTES`] for streams cut at state index entries: the piece
/// after the one being written need only get half its output ahead (about
/// 30 MB of `bin` in a piece of [`OUTPUT_PIECE_BYTES`] on gzip's trace)
/// for its worker never to wait, and every batch held more is a fresh
/// page per 4 KiB (256 MiB: 44 k page faults on gzip's `bin` at `-j 2`,
/// 64 MiB: 22 k, docs/regen.md section 4, "Writing").
const PIECES_AHEAD_BYTES: usize = 64 << 20;

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One line per executed instruction: its address in hex.
    Insn,
    /// One line per executed block: its address, length in bytes and instruction count.
    Block,
    /// Dinero's din format: `2 ADDR` (instruction fetch) per instruction.
    Din,
    /// Extended din: `i ADDR LEN` per instruction.
    Xdin,
    /// Binary: one little-endian 8-byte address record per instruction (the cache simulator's input).
    Bin,
    /// In-process only ([`crate::visit`], not in [`Format::NAMES`]): one
    /// 16-byte record per executed block or part of a block.
    Runs,
    /// In-process only: as [`Format::Runs`], but a summarised segment's
    /// blocks before its trail are one record ([`crate::visit::Segment`]).
    RunSegments,
}

impl Format {
    /// Names as the command line spells them.
    pub const NAMES: [(&'static str, Format); 5] = [
        ("insn", Format::Insn),
        ("block", Format::Block),
        ("din", Format::Din),
        ("xdin", Format::Xdin),
        ("bin", Format::Bin),
    ];

    /// A record per executed instruction: output many times the stream.
    fn per_instruction(self) -> bool {
        matches!(
            self,
            Format::Insn | Format::Din | Format::Xdin | Format::Bin
        )
    }

    pub(crate) fn comments(self) -> bool {
        matches!(self, Format::Insn | Format::Block)
    }

    /// One of the in-process record formats ([`crate::visit`]).
    pub(crate) fn runs(self) -> bool {
        matches!(self, Format::Runs | Format::RunSegments)
    }
}

impl FromStr for Format {
    type Err = Error;
    fn from_str(s: &str) -> Result<Format> {
        Format::NAMES
            .iter()
            .find(|(n, _)| *n == s)
            .map(|&(_, f)| f)
            .ok_or_else(|| {
                Error::Usage(format!(
                    "unknown format {s:?} (insn, block, din, xdin, bin)"
                ))
            })
    }
}

/// What `aetrace regen` was asked for.
#[derive(Clone, Debug)]
pub struct Options {
    /// The output format.
    pub format: Format,
    /// Keep only blocks of the module with this file name or path.
    pub module: Option<String>,
    /// Addresses as `vaddr - link_base` instead of run-time addresses.
    pub relative: bool,
    /// Regenerate only this thread.
    pub thread: Option<u32>,
    /// Threads regenerated at once; 0 means one per CPU.
    pub jobs: usize,
    /// Print totals instead of the trace.
    pub count: bool,
    /// Stream bytes per piece when a stream is cut for parallel expansion;
    /// 0 chooses from the stream's length and the number of jobs.
    pub piece_bytes: u64,
    /// States to start pieces from instead of the fast pass (checked
    /// against the trace: [`crate::index`]).
    pub index: Option<std::sync::Arc<StateIndex>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            format: Format::Insn,
            module: None,
            relative: false,
            thread: None,
            jobs: 1,
            count: false,
            piece_bytes: 0,
            index: None,
        }
    }
}

/// `aetrace regen -o FILE` (or stdout when `path` is `None`). A regular
/// file is written under a temporary name and renamed when regeneration
/// succeeded, so a failed run never leaves a complete-looking output;
/// other targets (a device such as /dev/null, a pipe) are written directly.
pub fn regen_to(
    trace: &std::path::Path,
    opts: &Options,
    path: Option<&std::path::Path>,
) -> Result<Vec<Ending>> {
    regen_trace_to(&aetrace_format::TraceFile::open(trace)?, opts, path)
}

/// [`regen_to`] of a trace already open (the caller checked a state
/// index against it), with a progress line on stderr while it is a
/// terminal.
pub fn regen_trace_to<B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    opts: &Options,
    path: Option<&std::path::Path>,
) -> Result<Vec<Ending>> {
    Ok(regen_trace_indexing(trace, opts, path, None)?.0)
}

/// [`regen_trace_to`], keeping, when `interval` is given, the states a
/// state index keeps every `interval` stream bytes as the threads go:
/// the index [`StateIndex::build`] would build, returned when every
/// thread was regenerated whole (none cut into pieces; a regeneration
/// that fails returns its error instead), so that the first
/// regeneration of a trace writes its index (issue 24 item 4).
pub fn regen_trace_indexing<B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    opts: &Options,
    path: Option<&std::path::Path>,
    interval: Option<u64>,
) -> Result<(Vec<Ending>, Option<StateIndex>)> {
    let Some(path) = path else {
        let stdout = std::io::stdout();
        let file = positional(std::os::fd::AsFd::as_fd(&stdout));
        let mut out = stdout.lock();
        let out = &mut ProgressOut::on_terminal(&mut out);
        return regen_trace_ahead(trace, opts, out, AHEAD_BYTES, interval, file.as_ref());
    };
    let mut f = aetrace_format::atomic::AtomicFile::create(path, None).map_err(output_err)?;
    let file = positional(std::os::fd::AsFd::as_fd(f.file()));
    let done = regen_trace_ahead(
        trace,
        opts,
        &mut ProgressOut::on_terminal(&mut f),
        AHEAD_BYTES,
        interval,
        file.as_ref(),
    )?;
    f.sync_all().map_err(output_err)?;
    f.commit().map_err(output_err)?;
    Ok(done)
}

/// The output file `fd` as a file pieces may be written into at their
/// offsets: a regular file not opened for appending (`pwrite` would
/// append), or /dev/null; `None` for anything else (a pipe, a terminal).
fn positional(fd: std::os::fd::BorrowedFd<'_>) -> Option<File> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let file = File::from(fd.try_clone_to_owned().ok()?);
    let meta = file.metadata().ok()?;
    let null = || {
        meta.file_type().is_char_device()
            && std::fs::metadata("/dev/null").is_ok_and(|n| n.rdev() == meta.rdev())
    };
    ((meta.is_file() && !appends(fd)) || null()).then_some(file)
}

/// Whether `fd` was opened with `O_APPEND` (its flags in
/// `/proc/self/fdinfo`, in octal; unreadable: assumed so).
fn appends(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    const O_APPEND: u32 = 0o2000;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
    let flags = info.lines().find_map(|l| l.strip_prefix("flags:"));
    flags
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .map_or(true, |f| f & O_APPEND != 0)
}

/// The temporary-file error as an output error.
fn output_err(e: aetrace_format::atomic::Error) -> Error {
    Error::Output(e.source)
}

/// Regenerates the trace at `path` into `out`, with a progress line on
/// stderr while it is a terminal (the command line's; library callers of
/// [`regen_trace`] get none).
pub fn regen_command(
    trace: &std::path::Path,
    opts: &Options,
    out: &mut dyn Write,
) -> Result<Vec<Ending>> {
    let t = aetrace_format::TraceFile::open(trace)?;
    regen_trace(&t, opts, &mut ProgressOut::on_terminal(out))
}

/// A thread to regenerate, with its process image's modules.
pub(crate) struct Job<'t> {
    info: &'t ThreadInfo,
    /// Index into the groups: the compiled modules of one process image
    /// (the executable and its instrumented libraries).
    group: usize,
}

fn path_name(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

/// Whether `name` names the module at `path` (full path or file name).
fn matches_module(path: &[u8], name: &str) -> bool {
    let p = path_name(path);
    p == name || p.rsplit('/').next() == Some(name)
}

/// Regenerates an already parsed trace into `out`; how the threads a
/// signal killed end (their traces stop where their witnesses do).
pub fn regen_trace<B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    opts: &Options,
    out: &mut dyn Write,
) -> Result<Vec<Ending>> {
    Ok(regen_trace_ahead(trace, opts, out, AHEAD_BYTES, None, None)?.0)
}

/// [`regen_trace`] with another lookahead budget (tests make workers
/// block), keeping states every `interval` stream bytes when given
/// ([`regen_trace_indexing`]); `file`, when given, is `out`'s file, for
/// workers that write their pieces at their offsets.
pub(crate) fn regen_trace_ahead<B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    opts: &Options,
    out: &mut dyn Write,
    ahead_bytes: usize,
    interval: Option<u64>,
    file: Option<&File>,
) -> Result<(Vec<Ending>, Option<StateIndex>)> {
    let prepared = prepare(trace, opts)?;
    let mut ctx = Ctx::new(trace, &prepared, opts, ahead_bytes)?;
    ctx.states = interval.filter(|&i| i > 0).map(|interval| States {
        interval,
        threads: Default::default(),
    });
    let endings = if opts.count {
        let totals = ctx.totals()?;
        out.write_all(totals.to_string().as_bytes())
            .map_err(Error::Output)?;
        totals.endings
    } else {
        ctx.write(out, file)?;
        ctx.take_endings()
    };
    // Every stream of an incomplete trace may have ended where it did
    // (none ran short, or none started): what was written is all the
    // trace holds, still not the whole run.
    trace.require_complete()?;
    Ok((endings, ctx.take_index()))
}

/// Totals of a whole trace (`--count`; `aetrace info`).
pub fn totals<B: AsRef<[u8]> + Sync>(trace: &Trace<B>, opts: &Options) -> Result<Totals> {
    let opts = Options {
        count: true,
        ..opts.clone()
    };
    let prepared = prepare(trace, &opts)?;
    Ctx::new(trace, &prepared, &opts, AHEAD_BYTES)?.totals()
}

/// Every thread's states at pause points `interval` stream bytes apart
/// ([`StateIndex::build`]), threads in parallel. A thread whose
/// regeneration fails keeps the states before the failure.
pub(crate) fn index_states<B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    opts: &Options,
    interval: u64,
) -> Result<BTreeMap<u32, Vec<Entry>>> {
    use rayon::prelude::*;
    let prepared = prepare(trace, opts)?;
    let ctx = Ctx::new(trace, &prepared, opts, AHEAD_BYTES)?;
    let run = |job: &Job<'_>| (job.info.start.thread.0, ctx.index_thread(job, interval));
    Ok(prepared.2.par_iter().map(run).collect())
}

/// One thread's regeneration as a [`Machine`] at the start of its stream,
/// its modules compiled for `format` with run-time addresses, handed to
/// `f`: for callers that step through a thread's trace themselves (the
/// debugger, which clones the machine to keep snapshots). The machine is
/// set up as `regen --thread thread` sets it up (fork children continue
/// from their parent's state), so its output is `regen`'s.
pub fn with_thread_machine<B: AsRef<[u8]> + Sync, R>(
    trace: &Trace<B>,
    thread: u32,
    format: Format,
    f: impl FnOnce(Machine<'_>) -> R,
) -> Result<R> {
    let opts = Options {
        format,
        thread: Some(thread),
        ..Options::default()
    };
    let prepared = prepare(trace, &opts)?;
    let ctx = Ctx::new(trace, &prepared, &opts, AHEAD_BYTES)?;
    let job = prepared
        .2
        .first()
        .expect("prepare keeps the thread asked for");
    Ok(f(ctx.machine(job)))
}

/// [`with_thread_machine`] for several threads at once, machines in the
/// order of `threads` (the debugger serves every thread of a process).
/// Every thread asked for must run an instrumented module; the others
/// may run an exec'd image whose modules the trace does not hold.
pub fn with_thread_machines<B: AsRef<[u8]> + Sync, R>(
    trace: &Trace<B>,
    threads: &[u32],
    format: Format,
    f: impl FnOnce(Vec<Machine<'_>>) -> R,
) -> Result<R> {
    if let [one] = threads {
        return with_thread_machine(trace, *one, format, |m| f(vec![m]));
    }
    let opts = Options {
        format,
        ..Options::default()
    };
    // A stream of an unknown exec'd image is refused only when asked for.
    let prepared = prepare_some(trace, &opts, true)?;
    let ctx = Ctx::new(trace, &prepared, &opts, AHEAD_BYTES)?;
    let mut machines = Vec::new();
    for &t in threads {
        let Some(job) = prepared.2.iter().find(|j| j.info.start.thread.0 == t) else {
            let one = Options {
                thread: Some(t),
                ..opts.clone()
            };
            return Err(prepare(trace, &one)
                .err()
                .unwrap_or_else(|| Error::Usage(format!("no thread {t} in the trace"))));
        };
        machines.push(ctx.machine(job));
    }
    Ok(f(machines))
}

/// What `--count` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Totals {
    /// One row per thread and module shown, in thread order.
    pub threads: Vec<ThreadTotals>,
    /// Per module regenerated: entries into each procedure (calls, tail
    /// calls, ENTERs), nonzero only, largest first.
    pub calls: Vec<(String, Vec<(String, u64)>)>,
    /// How the threads a signal killed end.
    pub endings: Vec<Ending>,
}

/// One thread's totals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadTotals {
    /// The thread's id in the trace.
    pub thread: ThreadId,
    /// Its process id.
    pub pid: u32,
    /// Its OS thread id.
    pub tid: u32,
    /// The module the row counts (its path).
    pub module: String,
    /// Instructions executed in the module.
    pub instructions: u64,
    /// Blocks executed in the module.
    pub blocks: u64,
    /// Signal handlers entered from traced or untraced code (SIGNAL
    /// records), and how many of them interrupted instrumentation.
    pub signals: u64,
    /// Of `signals`, those that interrupted instrumentation code.
    pub signals_in_instrumentation: u64,
}

impl std::fmt::Display for Totals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (mut all_i, mut all_b) = (0u64, 0u64);
        for t in &self.threads {
            write!(
                f,
                "thread {} pid {} tid {} module {}: {} instructions, {} blocks",
                t.thread, t.pid, t.tid, t.module, t.instructions, t.blocks
            )?;
            if t.signals > 0 {
                write!(
                    f,
                    ", {} signals ({} interrupting instrumentation)",
                    t.signals, t.signals_in_instrumentation
                )?;
            }
            writeln!(f)?;
            all_i += t.instructions;
            all_b += t.blocks;
        }
        writeln!(f, "total: {all_i} instructions, {all_b} blocks")?;
        for e in &self.endings {
            writeln!(f, "{e}")?;
        }
        for (m, rows) in &self.calls {
            writeln!(f, "calls per procedure of {m}:")?;
            for (name, n) in rows {
                writeln!(f, "{n:>12} {name}")?;
            }
        }
        Ok(())
    }
}

/// The compiled modules, the groups of them (indices), the threads to
/// regenerate and the note for truncation messages.
pub(crate) type Prepared<'t> = (Vec<Module>, Vec<Vec<usize>>, Vec<Job<'t>>, String);

fn group_views<'a>(compiled: &'a [Module], groups: &[Vec<usize>]) -> Vec<Vec<&'a Module>> {
    groups
        .iter()
        .map(|g| g.iter().map(|&i| &compiled[i]).collect())
        .collect()
}

/// Why a trace has no module to regenerate: a program killed before its
/// runtime registered the first module ran no traced instruction, which is
/// worth saying apart from a trace without instrumented modules.
fn no_module_reason<B: AsRef<[u8]>>(trace: &Trace<B>) -> String {
    let killed = trace.process_exits().iter().find_map(|x| match x.status {
        ExitStatus::Signaled { signal, .. } => Some(signal),
        _ => None,
    });
    match killed {
        Some(signal) => format!(
            "the program was killed by signal {signal} ({}) before its traced code started: \
             the trace holds no instruction",
            crate::ending::signal_name(signal)
        ),
        None => "the trace has no instrumented module with a program database".into(),
    }
}

/// The instrumented modules with a program database, by process image:
/// the executable first, then its libraries by module id (the module tag
/// their ENTER records carry).
struct Images {
    /// Each pid's first image (modules without an IMAGE section).
    by_pid: BTreeMap<u32, Vec<ModuleId>>,
    /// Images an exec started (format 1.12), by their first stream.
    by_thread: BTreeMap<ThreadId, Vec<ModuleId>>,
    /// The trace ties exec'd images to their streams (1.12): a stream an
    /// exec started without an image has unknown modules. Before, such a
    /// stream took its pid's modules, as readers of the time did.
    tied: bool,
}

impl Images {
    fn of<B: AsRef<[u8]>>(trace: &Trace<B>) -> Self {
        let mut images = Images {
            by_pid: BTreeMap::new(),
            by_thread: BTreeMap::new(),
            tied: trace.header().minor >= aetrace_format::header::MINOR_IMAGES,
        };
        for m in trace.modules() {
            if m.flags & module_flags::INSTRUMENTED == 0 || trace.program_database(m.id).is_none() {
                continue;
            }
            match trace.image_thread(m.id) {
                Some(t) => images.by_thread.entry(t).or_default().push(m.id),
                None => images.by_pid.entry(m.pid).or_default().push(m.id),
            }
        }
        let main_first = |id: &ModuleId| {
            let main = trace
                .module(*id)
                .is_some_and(|m| m.flags & module_flags::MAIN != 0);
            (!main, id.0)
        };
        for ids in images.by_pid.values_mut() {
            ids.sort_by_key(main_first);
        }
        for ids in images.by_thread.values_mut() {
            ids.sort_by_key(main_first);
        }
        images
    }

    fn is_empty(&self) -> bool {
        self.by_pid.is_empty() && self.by_thread.is_empty()
    }

    fn has(&self, id: ModuleId) -> bool {
        self.by_pid
            .values()
            .chain(self.by_thread.values())
            .flatten()
            .any(|&m| m == id)
    }

    /// The modules `info`'s stream runs: those of the image it belongs
    /// to, found up its creators (a thread or fork child runs its
    /// creator's image) to the stream that started the image.
    fn of_thread<B: AsRef<[u8]>>(
        &self,
        trace: &Trace<B>,
        info: &ThreadInfo,
    ) -> Result<&[ModuleId]> {
        let mut t = info;
        for _ in 0..1 << 20 {
            if let Some(ids) = self.by_thread.get(&t.start.thread) {
                return Ok(ids);
            }
            if self.tied && t.start.reason == StartReason::Exec {
                return Err(Error::Usage(format!(
                    "thread {} (pid {}) runs a program its process exec'd (stream {}), whose \
                     modules the trace does not hold: the recorder knows the traced \
                     executable's only",
                    info.start.thread, info.start.pid, t.start.thread
                )));
            }
            let first = !self.tied || t.start.reason == StartReason::Main;
            if let Some(ids) = self.by_pid.get(&t.start.pid).filter(|_| first) {
                return Ok(ids);
            }
            match t.start.parent.and_then(|p| trace.thread(p)) {
                Some(p) => t = p,
                None => break,
            }
        }
        Err(Error::Usage(format!(
            "thread {} (pid {}) runs no instrumented module of the trace",
            info.start.thread, info.start.pid
        )))
    }
}

/// Chooses the threads and their modules, and compiles the modules.
pub(crate) fn prepare<'t, B: AsRef<[u8]> + Sync>(
    trace: &'t Trace<B>,
    opts: &Options,
) -> Result<Prepared<'t>> {
    prepare_some(trace, opts, false)
}

/// [`prepare`]; with `lenient`, a stream whose image has unknown modules
/// is left out instead of refused (the fork parents' walk: such a
/// stream is only refused where it is asked for).
fn prepare_some<'t, B: AsRef<[u8]> + Sync>(
    trace: &'t Trace<B>,
    opts: &Options,
    lenient: bool,
) -> Result<Prepared<'t>> {
    let images = Images::of(trace);
    if images.is_empty() {
        return Err(Error::Usage(no_module_reason(trace)));
    }
    if let Some(name) = &opts.module {
        let known: Vec<String> = trace.modules().iter().map(|m| path_name(&m.path)).collect();
        let hit: Vec<_> = trace
            .modules()
            .iter()
            .filter(|m| matches_module(&m.path, name))
            .collect();
        if hit.is_empty() {
            return Err(Error::Usage(format!(
                "no module named {name} in the trace (modules: {})",
                known.join(", ")
            )));
        }
        if !hit.iter().any(|m| images.has(m.id)) {
            return Err(Error::Usage(format!(
                "module {name} is not instrumented: none of its blocks are in the trace"
            )));
        }
    }
    let threads: Vec<&ThreadInfo> = match opts.thread {
        Some(n) => vec![trace.thread(ThreadId(n)).ok_or_else(|| {
            let ids: Vec<String> = trace
                .threads()
                .map(|t| t.start.thread.to_string())
                .collect();
            Error::Usage(format!(
                "no thread {n} in the trace (threads: {})",
                ids.join(", ")
            ))
        })?],
        None => trace.threads().collect(),
    };
    // Each thread's modules: its process's, else its creator's (a fork
    // child runs its parent's image).
    let mut module_ids: Vec<ModuleId> = Vec::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut jobs = Vec::new();
    for info in threads {
        let ids = match images.of_thread(trace, info) {
            Err(_) if lenient => continue,
            r => r?,
        };
        if let Some(name) = &opts.module {
            let path = |id| &trace.module(id).expect("indexed module").path;
            if !ids.iter().any(|&id| matches_module(path(id), name)) {
                continue;
            }
        }
        let group: Vec<usize> = ids
            .iter()
            .map(|&id| match module_ids.iter().position(|&x| x == id) {
                Some(i) => i,
                None => {
                    module_ids.push(id);
                    module_ids.len() - 1
                }
            })
            .collect();
        let group = match groups.iter().position(|g| *g == group) {
            Some(i) => i,
            None => {
                groups.push(group);
                groups.len() - 1
            }
        };
        jobs.push(Job { info, group });
    }
    let compiled: Vec<Module> = module_ids
        .iter()
        .enumerate()
        .map(|(number, &id)| {
            let m = trace.module(id).expect("indexed module");
            let dbs = trace.program_database(id).expect("checked above");
            let raw = dbs.decompress()?;
            let db = aetrace_format::progdb::ProgramDb::decode_at(&raw, dbs.meta.section_offset)?;
            let addressing = if opts.relative {
                Addressing::Relative {
                    link_base: db.link_base,
                }
            } else {
                Addressing::Runtime {
                    load_base: m.load_base,
                }
            };
            // `--module`: the other modules of the image are walked (the
            // procedure stack crosses them) but print nothing.
            let shown = opts
                .module
                .as_ref()
                .map_or(true, |name| matches_module(&m.path, name));
            let format = (!opts.count && shown).then_some(opts.format);
            let mut c =
                Module::compile(&path_name(&m.path), number as u32, &db, format, addressing)?;
            // An exec'd image's modules (IMAGE) are other modules than
            // the first image's, with the first image's tags.
            c.tag = trace.module_tag(m);
            c.id = m.id.0;
            c.shown = shown;
            c.load_base = m.load_base;
            Ok(c)
        })
        .collect::<Result<_>>()?;
    let note = match trace.status() {
        Status::Complete(_) => String::new(),
        Status::Incomplete { tear: None } => {
            " (the trace is incomplete: the recorder did not finish it)".into()
        }
        Status::Incomplete { tear: Some(e) } => {
            format!(" (the trace is incomplete: {e})")
        }
    };
    Ok((compiled, groups, jobs, note))
}

/// A fork child's or a new task's parent state, by (creating thread, the
/// child's thread id: the FORKED record's payload; a fork child's is its
/// pid).
type ForkStates = HashMap<(ThreadId, u32), ForkState>;

/// The state each fork child, and each thread a traced `clone` system
/// call started, continues from: the parents' machines run (without
/// output, in thread order, so a parent that is itself such a child has
/// its own state already) and note it at each FORKED record.
fn fork_states<B: AsRef<[u8]> + Sync>(trace: &Trace<B>) -> Result<ForkStates> {
    let mut forks = HashMap::new();
    let parents: Vec<ThreadId> = trace
        .threads()
        .filter(|t| continues_a_parent(trace, t))
        .filter_map(|t| t.start.parent)
        .collect();
    if parents.is_empty() {
        return Ok(forks);
    }
    let opts = Options {
        count: true,
        ..Options::default()
    };
    let (compiled, groups, jobs, note) = prepare_some(trace, &opts, true)?;
    let views = group_views(&compiled, &groups);
    for job in jobs
        .iter()
        .filter(|j| parents.contains(&j.info.start.thread))
    {
        let thread = job.info.start.thread;
        let stream = Stream::new(thread, trace.chunks(thread).collect());
        let mods = &views[job.group];
        let mut m = Machine::new(thread, mods, stream, note.clone(), trace.header().minor);
        if let Some(state) = parent_state(&forks, job.info) {
            m.continue_fork(ForkState::clone(state));
        }
        let mut sink = Sink::counting(mods);
        // A parent whose own regeneration fails later still gave its
        // children their states up to there.
        let _ = m.run(&mut sink);
        forks.extend(m.forks.drain(..).map(|(tid, s)| ((thread, tid), s)));
    }
    Ok(forks)
}

/// Whether `t`'s stream goes on from its creator's state: a fork child,
/// or a thread whose stream starts inside the system call that created it
/// (RETURN right after its THREAD record: a traced `clone3` or `clone`,
/// docs/regen.md). A thread an outside entry started does not.
fn continues_a_parent<B: AsRef<[u8]>>(trace: &Trace<B>, t: &ThreadInfo) -> bool {
    match t.start.reason {
        StartReason::Fork => true,
        StartReason::Thread => {
            let mut stream = Stream::new(t.start.thread, trace.chunks(t.start.thread).collect());
            stream.next_item().is_ok()
                && matches!(stream.peek(), Ok((crate::stream::Item::Return, _, _)))
        }
        _ => false,
    }
}

/// The state `info`'s stream continues from, when its creator wrote one.
fn parent_state<'f>(forks: &'f ForkStates, info: &ThreadInfo) -> Option<&'f ForkState> {
    match info.start.reason {
        StartReason::Fork | StartReason::Thread => {
            forks.get(&(info.start.parent?, info.start.os_tid))
        }
        _ => None,
    }
}

pub(crate) struct Ctx<'a, B> {
    trace: &'a Trace<B>,
    /// Each fork child's and traced clone's parent state.
    forks: ForkStates,
    compiled: &'a [Module],
    /// Each group's modules, in the machine's order.
    groups: Vec<Vec<&'a Module>>,
    /// The same groups as indices into `compiled`.
    group_ids: Vec<Vec<usize>>,
    jobs: &'a [Job<'a>],
    note: String,
    opts: &'a Options,
    ahead_bytes: usize,
    /// Written batches, for the workers to fill again.
    pub(crate) spare: Spare,
    /// Killed threads' ends, as their last pieces reach them.
    endings: std::sync::Mutex<Vec<Ending>>,
    /// The states kept for a state index as whole threads go, if asked.
    states: Option<States>,
    /// Decompressed chunks the pieces of one stream share (and, for a
    /// data walk, its value cursor).
    pub(crate) chunks: std::sync::Arc<crate::stream::Chunks>,
}

/// Output bytes written so far, shown on stderr while it is a terminal
/// (long regenerations); a plain pass-through otherwise.
struct ProgressOut<'w> {
    inner: &'w mut dyn Write,
    bar: Option<indicatif::ProgressBar>,
}

impl<'w> ProgressOut<'w> {
    fn on_terminal(inner: &'w mut dyn Write) -> ProgressOut<'w> {
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "regenerating: {bytes} written ({bytes_per_sec}) {elapsed}",
                )
                .expect("a valid template"),
            );
            bar
        });
        ProgressOut { inner, bar }
    }
}

impl Write for ProgressOut<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        if let Some(b) = &self.bar {
            b.inc(n as u64);
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl Drop for ProgressOut<'_> {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// One piece's or thread's counts: per module of its group (instructions,
/// blocks); procedure entries; (signals, of them interrupting
/// instrumentation).
type Counts = (Vec<(u64, u64)>, Vec<Vec<u64>>, (u64, u64));

/// Adds piece counts `c` to `sum`.
fn add_counts(sum: &mut Counts, c: &Counts) {
    for (s, x) in sum.0.iter_mut().zip(&c.0) {
        s.0 += x.0;
        s.1 += x.1;
    }
    for (s, x) in sum.1.iter_mut().zip(&c.1) {
        for (a, b) in s.iter_mut().zip(x) {
            *a += b;
        }
    }
    sum.2 .0 += c.2 .0;
    sum.2 .1 += c.2 .1;
}

/// Where the workers write their pieces ([`Ctx::write_regions`]): the
/// file, the offset of the thread's output in it, and the flag that
/// stops them (the writer found an error).
#[derive(Clone, Copy)]
struct At<'f> {
    file: &'f File,
    body: u64,
    stop: &'f AtomicBool,
}

/// A piece's end: its result and the bytes its worker wrote.
type PieceEnd = (Result<()>, u64);

/// Dropped by each worker of [`Ctx::write_regions`] as it returns (or
/// unwinds): the last one drops the channels of the pieces nobody took,
/// so the writer waiting for one learns that no worker is left.
struct Closing<'a> {
    running: &'a std::sync::atomic::AtomicUsize,
    ends: &'a [std::sync::Mutex<Option<mpsc::Sender<PieceEnd>>>],
}

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        if self.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            for e in self.ends {
                if let Ok(mut e) = e.lock() {
                    e.take();
                }
            }
        }
    }
}

/// A piece of one thread's regeneration: a machine at its start, or at
/// the stream's start with the index entry to restore first (`from`: the
/// worker restores it, in its own buffers), where it pauses (`u64::MAX`:
/// the end of the stream), what precedes its output, and the state the
/// index says it pauses in.
struct Piece<'m> {
    machine: Machine<'m>,
    from: Option<&'m Entry>,
    /// The job's group (its modules).
    group: usize,
    pause_at: u64,
    header: Vec<u8>,
    expect: Option<&'m Entry>,
    /// The whole thread: it may keep states for a state index.
    whole: bool,
    /// Where its output starts in the thread's, when the index counted
    /// the output before it ([`Ctx::offset_of`]).
    at: Option<u64>,
}

/// The states of a state index, kept by the threads regenerated whole
/// ([`regen_trace_indexing`]).
pub(crate) struct States {
    interval: u64,
    threads: std::sync::Mutex<BTreeMap<u32, Vec<Entry>>>,
}

/// What a worker's last piece leaves for its next one: the summaries of
/// its group (with their output arena, or counting), its stream's chunk
/// buffers and its written batches, all paged in already and in this
/// worker's CPU cache (fresh ones per piece cost more page faults than
/// the output: docs/regen.md section 4, "Writing"; batches shared by the
/// workers moved between the CPUs' caches: section 5).
#[derive(Default)]
struct Kept {
    summaries: Option<(usize, Vec<Summaries>)>,
    stream: (Vec<u8>, Vec<u8>),
    /// Its written batches ([`Ctx::own_batch`]).
    batches: Vec<Vec<u8>>,
}

/// What a worker of [`crate::visit::Pieces`] keeps from one piece to the
/// next (its summaries, chunk buffers and batches).
#[derive(Default)]
pub struct PieceKeep(Kept);

/// A piece being expanded: its machine, its sink, and the index entry
/// where it pauses (`None`: at the end of its stream).
struct Walk<'m> {
    machine: Machine<'m>,
    sink: Sink,
    group: usize,
    expect: Option<&'m Entry>,
}

/// What the pieces counted so far left for the next ones (their
/// summaries: [`Sink::counting_with`]): one per piece counted at once.
type KeptCounting = std::sync::Mutex<Vec<Kept>>;

/// Puts piece machine `m` at index entry `from` (none: it starts where it
/// is).
fn restore(m: &mut Machine<'_>, from: Option<&Entry>) -> Result<()> {
    from.map_or(Ok(()), |e| m.restore(&e.state))
}

/// Why a piece cannot be written at its offset.
const UNCOUNTED: &str = "an index entry that did not count the output before it: \
    the piece after it cannot be written at its offset";

/// The error of a piece that does not start where the output before it
/// ends: the index's counts do not describe the trace.
fn misplaced(start: Option<u64>, end: u64) -> Error {
    Error::Index(format!(
        "the index puts a piece's output at byte {} of the thread's, where the output \
         before it ends at byte {end}: the index does not describe this trace (delete it; \
         `aetrace index` rebuilds it)",
        start.map_or_else(|| "(unknown)".to_owned(), |s| s.to_string())
    ))
}

/// A piece as index entries: where it starts (`None`: the stream's start)
/// and where it pauses (`None`: the stream's end).
type Span<'e> = (Option<&'e Entry>, Option<&'e Entry>);

/// The smallest piece worth a snapshot (a machine clone holds a chunk).
const MIN_PIECE_BYTES: u64 = 1 << 20;

/// Stream bytes per piece of a format with a record per instruction,
/// started from a state index. The piece after the one being written
/// waits whole in memory, so a long one stalls its worker at the lookahead
/// (docs/regen.md, section 5: "Pieces sized for their output").
const OUTPUT_PIECE_BYTES: u64 = 512 << 10;

/// Keeps the state of machine `m`, paused for a state index after
/// (`instructions`, `block` output bytes) (if counted), in `entries`;
/// where it pauses next.
fn keep_state(
    m: &Machine<'_>,
    interval: u64,
    (instructions, block_bytes): (Option<u64>, Option<u64>),
    entries: &mut Vec<Entry>,
) -> u64 {
    let offset = m.stream_offset();
    if let Some(state) = m.snapshot() {
        entries.push(Entry {
            offset,
            instructions,
            block_bytes,
            state,
            data: Vec::new(),
        });
    }
    offset.saturating_add(interval)
}

/// The `bin` output of `instructions` instructions: one record each.
fn bin_bytes(instructions: u64) -> u64 {
    instructions.saturating_mul(aetrace_format::addrtrace::RECORD_LEN as u64)
}

/// A piece that paused: in the state its index entry says, if it has one.
fn check_pause(m: &Machine<'_>, expect: Option<&Entry>) -> Result<()> {
    match expect {
        Some(e) if m.snapshot().as_deref() != Some(&e.state[..]) => Err(Error::Index(format!(
            "thread {}: the regeneration pauses at stream byte offset {} in another state \
             than the index's entry for offset {}: the index does not describe this trace \
             (delete it; `aetrace index` rebuilds it)",
            m.thread(),
            m.stream_offset(),
            e.offset
        ))),
        _ => Ok(()),
    }
}

/// A piece that reached the end of its stream: it had no entry to reach.
fn check_end(m: &Machine<'_>, expect: Option<&Entry>) -> Result<()> {
    match expect {
        Some(e) => Err(Error::Index(format!(
            "thread {}: the stream ends before the index's entry for offset {}: \
             the index does not describe this trace (delete it; `aetrace index` rebuilds it)",
            m.thread(),
            e.offset
        ))),
        None => Ok(()),
    }
}

/// The workers `opts` asks for: `-j N`, 0 meaning one per CPU.
fn workers(opts: &Options) -> usize {
    if opts.jobs == 0 {
        rayon::current_num_threads()
    } else {
        opts.jobs
    }
    .max(1)
}

/// Decompressed bytes the pieces of `-j N` share ([`crate::stream::Chunks`]):
/// the chunks the pieces in flight read, one per worker and the one a
/// piece starts in, which the piece before it read, as many again for
/// the pieces in flight in order. Past it the oldest chunk's buffer is
/// filled again: each chunk up to a larger budget was a fresh buffer, a
/// page fault per 4 KiB (16 MiB: 3.9 k of the 7.7 k page faults of
/// gzip's `bin -j 2`, docs/regen.md section 5).
fn shared_budget<B: AsRef<[u8]>>(trace: &Trace<B>, opts: &Options) -> usize {
    let chunk = (trace.threads())
        .flat_map(|t| trace.chunks(t.start.thread))
        .map(|c| usize::try_from(c.meta.raw_len).unwrap_or(usize::MAX))
        .max()
        .unwrap_or(0);
    chunk.saturating_mul(2 * workers(opts) + 2)
}

impl<'a, B: AsRef<[u8]> + Sync> Ctx<'a, B> {
    /// The regeneration of `prepared` (from [`prepare`] with `opts`).
    pub(crate) fn new(
        trace: &'a Trace<B>,
        prepared: &'a Prepared<'a>,
        opts: &'a Options,
        ahead_bytes: usize,
    ) -> Result<Self> {
        let (compiled, groups, jobs, note) = prepared;
        if let Some(index) = &opts.index {
            index.check(trace)?;
        }
        Ok(Ctx {
            trace,
            forks: fork_states(trace)?,
            compiled,
            groups: group_views(compiled, groups),
            group_ids: groups.clone(),
            jobs,
            note: note.clone(),
            opts,
            ahead_bytes,
            spare: Spare::new((ahead_bytes / BATCH).max(16)),
            endings: Default::default(),
            states: None,
            chunks: std::sync::Arc::new(crate::stream::Chunks::keeping(shared_budget(trace, opts))),
        })
    }

    /// Each job's thread.
    pub(crate) fn job_threads(&self) -> Vec<ThreadId> {
        self.jobs.iter().map(|j| j.info.start.thread).collect()
    }

    fn groups_idx(&self, job: &Job<'_>) -> &[usize] {
        &self.group_ids[job.group]
    }

    fn workers(&self) -> usize {
        workers(self.opts)
    }

    fn machine<'m>(&'m self, job: &Job<'m>) -> Machine<'m> {
        let thread = job.info.start.thread;
        let stream = Stream::new(thread, self.trace.chunks(thread).collect()).sharing(&self.chunks);
        let mut note = self.note.clone();
        if note.is_empty() && job.info.end.is_none() {
            note = format!(" (thread {thread} has no THREAD_END)");
        }
        let mut m = Machine::new(
            thread,
            &self.groups[job.group],
            stream,
            note,
            self.trace.header().minor,
        );
        if job
            .info
            .end
            .as_ref()
            .is_some_and(|e| e.reason == EndReason::Killed)
        {
            m.set_killed();
        }
        if let Some(state) = parent_state(&self.forks, job.info) {
            m.continue_fork(state.clone());
        }
        m
    }

    fn header(&self, job: &Job<'_>) -> Vec<u8> {
        let s = &job.info.start;
        if self.opts.format.comments() {
            format!("# thread {} pid {} tid {}\n", s.thread, s.pid, s.os_tid).into_bytes()
        } else if self.opts.format.runs() {
            crate::visit::thread_record(s.thread)
        } else {
            Vec::new()
        }
    }

    /// Whether long streams are cut into pieces: with an explicit `-j` or
    /// `--piece`, and by default only with three CPUs or more. The cutting
    /// pass costs about as much as the expansion it feeds (docs/regen.md,
    /// section 5), so on two CPUs cutting one stream makes it slower; the
    /// threads of a trace still run in parallel.
    /// With a state index cutting costs nothing, so it cuts on two CPUs.
    fn cuts(&self) -> bool {
        self.opts.jobs != 0
            || self.opts.piece_bytes != 0
            || self.workers() > 2
            || (self.opts.index.is_some() && self.workers() > 1)
    }

    /// The output pieces may hold ahead of the writer: less when the
    /// streams are cut at index entries, whose pieces are short.
    fn pieces_ahead(&self) -> usize {
        if self.opts.index.is_some() && self.cuts() {
            PIECES_AHEAD_BYTES
        } else {
            AHEAD_BYTES
        }
    }

    /// A whole thread as one piece.
    fn whole<'m>(&'m self, job: &Job<'m>) -> Piece<'m> {
        self.piece(job, (None, None))
    }

    /// The piece of `job` between two index entries.
    fn piece<'m>(&'m self, job: &Job<'m>, (from, to): Span<'m>) -> Piece<'m> {
        let mut machine = self.machine(job);
        if to.is_some() {
            machine.stream_mut().on_demand();
        }
        Piece {
            machine,
            from,
            group: job.group,
            pause_at: to.map_or(u64::MAX, |e| e.offset),
            header: if from.is_none() {
                self.header(job)
            } else {
                Vec::new()
            },
            expect: to,
            whole: from.is_none() && to.is_none(),
            at: from.map_or(Some(0), |e| self.offset_of(e)),
        }
    }

    /// Where the output at index entry `e` starts in its thread's, when
    /// the entry counted it: `bin` from its instructions, `block` (with
    /// run-time addresses) its bytes.
    fn offset_of(&self, e: &Entry) -> Option<u64> {
        match self.opts.format {
            Format::Bin => e.instructions.map(bin_bytes),
            Format::Block if !self.opts.relative => e.block_bytes,
            _ => None,
        }
    }

    /// What a whole thread's output of `emitted` bytes counted, for its
    /// index entry there: (instructions, `block` output bytes).
    fn counts_of(&self, emitted: u64) -> (Option<u64>, Option<u64>) {
        match self.opts.format {
            Format::Bin => (Some(emitted / bin_bytes(1)), None),
            Format::Block if !self.opts.relative => (None, Some(emitted)),
            _ => (None, None),
        }
    }

    /// Stream bytes per piece of `job`'s stream in order for the writer:
    /// `--piece`; for a format with a record per instruction, or `block`,
    /// from a state index [`OUTPUT_PIECE_BYTES`] (short pieces keep both
    /// workers busy to the end); else a quarter of each worker's share.
    /// (Pieces written at their offsets: [`Ctx::region_spans`].)
    fn piece_bytes(&self, job: &Job<'_>) -> u64 {
        match self.opts.piece_bytes {
            0 if self.opts.index.is_some()
                && !self.opts.count
                && (self.opts.format.per_instruction() || self.opts.format == Format::Block) =>
            {
                OUTPUT_PIECE_BYTES
            }
            0 => {
                let thread = job.info.start.thread;
                let stream_len: u64 = self.trace.chunks(thread).map(|c| c.meta.raw_len).sum();
                (stream_len / (4 * self.workers() as u64)).max(MIN_PIECE_BYTES)
            }
            n => n,
        }
    }

    /// `job`'s stream cut at index entries into pieces of about
    /// [`Ctx::piece_bytes`] (one piece without an index or entries).
    fn spans<'m>(&'m self, job: &Job<'m>) -> Vec<Span<'m>> {
        self.spans_by(job, self.piece_bytes(job))
    }

    /// `job`'s stream cut at index entries for workers that write at
    /// their offsets ([`Ctx::write_regions`]): at every entry unless
    /// `--piece` says otherwise, since a worker's next piece then costs
    /// a pause and a state check, not a restore, and short last pieces
    /// leave no worker idle long.
    fn region_spans<'m>(&'m self, job: &Job<'m>) -> Vec<Span<'m>> {
        self.spans_by(job, self.opts.piece_bytes.max(1))
    }

    /// `job`'s stream cut at the index entries about `piece` stream bytes
    /// apart.
    fn spans_by<'m>(&'m self, job: &Job<'m>, piece: u64) -> Vec<Span<'m>> {
        let Some(index) = &self.opts.index else {
            return vec![(None, None)];
        };
        let mut cuts = Vec::new();
        let mut next = piece;
        for e in index.entries(job.info.start.thread.0) {
            if e.offset >= next {
                cuts.push(e);
                next = e.offset.saturating_add(piece);
            }
        }
        let starts = std::iter::once(None).chain(cuts.iter().copied().map(Some));
        let ends = cuts.iter().copied().map(Some).chain(std::iter::once(None));
        starts.zip(ends).collect()
    }

    /// Cuts a thread into pieces of about `piece` stream bytes with the fast
    /// pass (counting with summaries), handing each to `give` as soon as its
    /// end is known (false: stop). A pass that fails ends the last piece at
    /// the end of the stream: its expansion meets the same error after
    /// writing everything before it.
    /// With a state index, the pieces start at its entries: no pass.
    fn cut<'m>(&'m self, job: &Job<'m>, give: &mut dyn FnMut(Piece<'m>) -> bool) {
        if !self.cuts() {
            give(self.whole(job));
            return;
        }
        if self.opts.index.is_some() {
            for span in self.spans(job) {
                if !give(self.piece(job, span)) {
                    return;
                }
            }
            return;
        }
        let piece = self.piece_bytes(job);
        let mut start = self.whole(job);
        let mut fast = start.machine.clone();
        let mut sink = Sink::counting(&self.groups[job.group]);
        sink.pause_at = piece;
        while let Ok(Progress::Paused) = fast.run(&mut sink) {
            let at = fast.stream_offset();
            let next = Piece {
                machine: fast.clone(),
                from: None,
                group: job.group,
                pause_at: u64::MAX,
                header: Vec::new(),
                expect: None,
                whole: false,
                at: None,
            };
            start.pause_at = at;
            start.whole = false;
            if !give(std::mem::replace(&mut start, next)) {
                return;
            }
            sink.pause_at = at.saturating_add(piece);
        }
        give(start);
    }

    /// The states of `job`'s thread at pause points `interval` stream
    /// bytes apart, up to its end or its first error.
    fn index_thread(&self, job: &Job<'_>, interval: u64) -> Vec<Entry> {
        let mut m = self.machine(job);
        let mut sink = Sink::counting(&self.groups[job.group]);
        sink.pause_at = interval;
        let mut entries = Vec::new();
        loop {
            match m.run(&mut sink) {
                Ok(Progress::More) => {}
                Ok(Progress::Paused) => {
                    let n = sink
                        .counts
                        .as_ref()
                        .map(|c| c.totals.iter().map(|t| t.0).sum());
                    sink.pause_at = keep_state(&m, interval, (n, None), &mut entries);
                }
                Ok(Progress::Done) | Err(_) => return entries,
            }
        }
    }

    /// Regenerates one piece, handing batches to `emit` (false: stop),
    /// which may take them; those it leaves are filled again by this
    /// worker. `keep` holds what the worker's last piece leaves for the
    /// next.
    fn produce(
        &self,
        piece: Piece<'_>,
        emit: &mut dyn FnMut(&mut Vec<u8>) -> bool,
        keep: &mut Kept,
    ) -> Result<()> {
        let whole = piece.whole;
        let mut w = self.begin(piece, keep)?;
        let mut states = self.states.as_ref().filter(|_| whole).map(|s| {
            w.sink.pause_at = s.interval;
            (s, Vec::new())
        });
        let r = self.expand(
            &mut w.machine,
            &mut w.sink,
            w.expect,
            emit,
            states.as_mut(),
            &mut keep.batches,
        );
        if let Some((s, entries)) = states {
            if let Ok(mut t) = s.threads.lock() {
                t.insert(w.machine.thread().0, entries);
            }
        }
        self.end(w, keep);
        r
    }

    /// Piece `piece`'s machine at its start (restored from its index
    /// entry into the buffers `keep` holds) with a sink pausing where the
    /// piece ends, its output begun with its header; an error of the
    /// restore leaves the buffers in `keep`.
    fn begin<'m>(&self, piece: Piece<'m>, keep: &mut Kept) -> Result<Walk<'m>> {
        let Piece {
            machine: mut m,
            from,
            group,
            pause_at,
            header,
            expect,
            ..
        } = piece;
        m.stream_mut().reusing(std::mem::take(&mut keep.stream));
        if let Err(e) = restore(&mut m, from) {
            keep.stream = m.stream_mut().take_buffers();
            return Err(e);
        }
        // A recycled batch: one grown from the header would page in fresh
        // memory at every piece.
        let mut out = self.own_batch(&mut keep.batches);
        out.extend_from_slice(&header);
        let mut sink = match keep.summaries.take().filter(|(g, _)| *g == group) {
            Some((_, segs)) => Sink::output_with(segs, out, BATCH),
            None => Sink::output(m.modules(), out, BATCH),
        };
        sink.pause_at = pause_at;
        Ok(Walk {
            machine: m,
            sink,
            group,
            expect,
        })
    }

    /// Keeps what walk `w` leaves for the worker's next piece in `keep`.
    fn end(&self, mut w: Walk<'_>, keep: &mut Kept) {
        // The batch the last run left unused.
        self.keep_batch(&mut keep.batches, std::mem::take(&mut w.sink.out));
        keep.summaries = Some((w.group, w.sink.take_summaries()));
        keep.stream = w.machine.stream_mut().take_buffers();
    }

    /// Runs machine `m` into `sink`, handing batches to `emit` (false:
    /// stop), up to its pause point or the end of its stream.
    /// With `states`, a whole thread's walk pauses every `interval`
    /// stream bytes (at the pause points [`Ctx::index_thread`] keeps) to
    /// keep its state there.
    fn expand(
        &self,
        m: &mut Machine<'_>,
        sink: &mut Sink,
        expect: Option<&Entry>,
        emit: &mut dyn FnMut(&mut Vec<u8>) -> bool,
        mut states: Option<&mut (&States, Vec<Entry>)>,
        own: &mut Vec<Vec<u8>>,
    ) -> Result<()> {
        // Output bytes so far: a whole thread's `bin` counts its
        // instructions, its `block` itself (other formats' are not counted
        // as they go).
        let mut emitted = 0u64;
        loop {
            let r = m.run(sink);
            // Only what certainly ran is output (see `Sink::certain`); after a
            // pause the uncertain tail waits for the next batch.
            let mut next = self.own_batch(own);
            next.extend_from_slice(&sink.out[sink.certain.min(sink.out.len())..]);
            sink.out.truncate(sink.certain);
            let mut bytes = std::mem::replace(&mut sink.out, next);
            sink.certain = 0;
            emitted += bytes.len() as u64;
            if !bytes.is_empty() && !emit(&mut bytes) {
                return Ok(());
            }
            self.keep_batch(own, bytes);
            match r? {
                Progress::More => {}
                Progress::Paused => match states.as_deref_mut() {
                    Some((s, entries)) => {
                        let counts = self.counts_of(emitted);
                        let kept = entries.len();
                        sink.pause_at = keep_state(m, s.interval, counts, entries);
                        // A consumer of runs (the data walk) keeps its own
                        // state there too: nothing uncertain is left at a
                        // pause point, so the record stands where the walk is.
                        if self.opts.format.runs() && entries.len() > kept && sink.out.is_empty() {
                            crate::visit::pause_record(m.stream_offset(), &mut sink.out);
                        }
                    }
                    None => return check_pause(m, expect),
                },
                Progress::Done => {
                    check_end(m, expect)?;
                    self.note_ending(m);
                    return Ok(());
                }
            }
        }
    }

    /// Keeps machine `m`'s ending if its thread was killed.
    fn note_ending(&self, m: &Machine<'_>) {
        let Some(end) = m.stopped.clone() else {
            return;
        };
        let thread = m.thread();
        let pid = self
            .jobs
            .iter()
            .find(|j| j.info.start.thread == thread)
            .map_or(0, |j| j.info.start.pid);
        let signal = self
            .trace
            .process_exits()
            .iter()
            .find_map(|x| match x.status {
                ExitStatus::Signaled { signal, .. } if x.pid == pid => Some(signal),
                _ => None,
            });
        if let Ok(mut e) = self.endings.lock() {
            e.push(Ending {
                thread,
                pid,
                signal,
                end,
            });
        }
    }

    /// Keeps states every `interval` stream bytes as whole threads go
    /// (0: none), for [`Ctx::take_index`].
    pub(crate) fn keep_states(&mut self, interval: u64) {
        self.states = (interval > 0).then(|| States {
            interval,
            threads: Default::default(),
        });
    }

    /// The pieces of `job` (an index into the jobs) cut at the index
    /// entries `cut` accepts, as entry numbers of its thread: from (none:
    /// the stream's start) and to (none: its end).
    pub(crate) fn piece_spans(
        &self,
        cut: &dyn Fn(&Entry) -> bool,
    ) -> Vec<(usize, Option<usize>, Option<usize>)> {
        let mut spans = Vec::new();
        for (j, job) in self.jobs.iter().enumerate() {
            let entries =
                (self.opts.index.as_ref()).map_or(&[][..], |i| i.entries(job.info.start.thread.0));
            let cuts: Vec<usize> = (0..entries.len()).filter(|&k| cut(&entries[k])).collect();
            let starts = std::iter::once(None).chain(cuts.iter().copied().map(Some));
            let ends = cuts.iter().copied().map(Some).chain(std::iter::once(None));
            spans.extend(starts.zip(ends).map(|(a, b)| (j, a, b)));
        }
        spans
    }

    /// Regenerates the piece of job `j` between its thread's index entries
    /// `from` and `to` ([`Ctx::piece_spans`]) to `give`, with what the
    /// worker's last piece left in `keep`.
    pub(crate) fn produce_span(
        &self,
        (j, from, to): (usize, Option<usize>, Option<usize>),
        give: &mut dyn FnMut(&mut Vec<u8>) -> std::io::Result<()>,
        keep: &mut PieceKeep,
    ) -> Result<()> {
        let job = &self.jobs[j];
        let entries =
            (self.opts.index.as_ref()).map_or(&[][..], |i| i.entries(job.info.start.thread.0));
        let piece = self.piece(job, (from.map(|k| &entries[k]), to.map(|k| &entries[k])));
        self.produce_to(piece, give, &mut keep.0)
    }

    /// The state index the whole threads kept, if every thread kept its
    /// states ([`regen_trace_indexing`]).
    pub(crate) fn take_index(&mut self) -> Option<StateIndex> {
        let States { interval, threads } = self.states.take()?;
        let threads = threads.into_inner().ok()?;
        (threads.len() == self.jobs.len()).then(|| StateIndex {
            fingerprint: self.trace.fingerprint(),
            interval,
            threads,
        })
    }

    /// The killed threads' ends noted so far, in thread order.
    fn take_endings(&self) -> Vec<Ending> {
        let mut e = self
            .endings
            .lock()
            .map(|mut e| std::mem::take(&mut *e))
            .unwrap_or_default();
        e.sort_by_key(|e| e.thread);
        e
    }

    /// An empty batch buffer.
    fn batch(&self) -> Vec<u8> {
        (self.spare.take()).unwrap_or_else(|| Vec::with_capacity(BATCH + BATCH / 4))
    }

    /// An empty batch for a worker: one of its own written ones (`own`)
    /// if it has one, else [`Ctx::batch`].
    fn own_batch(&self, own: &mut Vec<Vec<u8>>) -> Vec<u8> {
        own.pop().unwrap_or_else(|| self.batch())
    }

    /// Keeps written batch `b` for its worker's [`Ctx::own_batch`] (two at
    /// most: the one being filled and the one written), the others for
    /// [`Ctx::batch`]. A batch taken from the shared ones was often last
    /// written on the other CPU, its lines in that CPU's cache.
    fn keep_batch(&self, own: &mut Vec<Vec<u8>>, mut b: Vec<u8>) {
        if own.len() < 2 && b.capacity() >= BATCH {
            b.clear();
            own.push(b);
        } else {
            self.spare.put(b);
        }
    }

    /// Writes the output to `out`, or, when the workers can write their
    /// pieces at their offsets, to `file` (the same file: a regular one
    /// or /dev/null).
    fn write(&self, out: &mut dyn Write, file: Option<&File>) -> Result<()> {
        if let Some(file) = file.filter(|_| self.writes_at_offsets()) {
            return self.write_at_offsets(file);
        }
        let mut out = std::io::BufWriter::with_capacity(1 << 20, out);
        if self.opts.format == crate::Format::Bin {
            let h = aetrace_format::addrtrace::Header { count: None };
            out.write_all(&h.to_bytes()).map_err(Error::Output)?;
        }
        let r = self.deliver(&mut |b| out.write_all(b));
        // The exact part before an error still goes out; the error itself
        // is the one to report.
        let flushed = out.flush().map_err(Error::Output);
        r.and(flushed)
    }

    /// Whether the workers write their pieces themselves, each at its
    /// offset: `bin` or `block` of one thread, cut at index entries that
    /// counted the output before them ([`Ctx::offset_of`]).
    fn writes_at_offsets(&self) -> bool {
        let [job] = self.jobs else {
            return false;
        };
        self.opts.module.is_none()
            && self.opts.index.is_some()
            && self.workers() > 1
            && self.cuts()
            && self
                .region_spans(job)
                .iter()
                .all(|(from, _)| from.map_or(true, |e| self.offset_of(e).is_some()))
    }

    /// Output written by the workers at their pieces' offsets in `file`,
    /// from its position, which is then left after the output as a
    /// sequential write leaves it. After an error a regular file is cut
    /// to the exact output before it (later pieces may have written past).
    fn write_at_offsets(&self, file: &File) -> Result<()> {
        let mut f = file;
        let base = f.stream_position().map_err(Error::Output)?;
        let mut header = Vec::new();
        if self.opts.format == Format::Bin {
            header = aetrace_format::addrtrace::Header { count: None }
                .to_bytes()
                .to_vec();
        }
        file.write_all_at(&header, base).map_err(Error::Output)?;
        let body = base + header.len() as u64;
        let (r, len) = self.write_regions(file, body);
        if r.is_err() && file.metadata().is_ok_and(|m| m.is_file()) {
            file.set_len(body + len).map_err(Error::Output)?;
        }
        f.seek(std::io::SeekFrom::Start(body + len))
            .map_err(Error::Output)?;
        r
    }

    /// Hands the output, in order, batch after batch, to `give` (its error
    /// stops the regeneration as an [`Error::Output`]). `give` may take the
    /// batch, leaving a buffer for the next ones in its place.
    pub(crate) fn deliver(
        &self,
        give: &mut dyn FnMut(&mut Vec<u8>) -> std::io::Result<()>,
    ) -> Result<()> {
        let workers = self.workers();
        if workers > 1 && (self.jobs.len() > 1 || self.cuts()) {
            return self.write_parallel(workers, give);
        }
        let mut keep = Kept::default();
        for job in self.jobs {
            self.produce_to(self.whole(job), give, &mut keep)?;
        }
        Ok(())
    }

    /// [`Ctx::produce`] handing batches to `give`, whose error stops it
    /// and is the result.
    fn produce_to(
        &self,
        piece: Piece<'_>,
        give: &mut dyn FnMut(&mut Vec<u8>) -> std::io::Result<()>,
        keep: &mut Kept,
    ) -> Result<()> {
        let mut werr = None;
        let mut emit = |b: &mut Vec<u8>| match give(b) {
            Ok(()) => true,
            Err(e) => {
                werr = Some(e);
                false
            }
        };
        let r = self.produce(piece, &mut emit, keep);
        match werr {
            Some(e) => Err(Error::Output(e)),
            None => r,
        }
    }

    /// Output written by the workers at their pieces' offsets in `file`
    /// from byte `body` on (one thread cut at index entries:
    /// [`Ctx::writes_at_offsets`]). Each worker walks a region of
    /// consecutive pieces as one walk and then steals the back half of
    /// the largest region left ([`Regions`]): no piece waits for a
    /// thread that cuts, and no worker for the other's chunk but where a
    /// region starts. This thread checks, piece after piece, that each
    /// starts where the one before it ended; also returns the bytes
    /// written in order before any error.
    fn write_regions(&self, file: &File, body: u64) -> (Result<()>, u64) {
        let Some(job) = self.jobs.first() else {
            return (Ok(()), 0);
        };
        let spans = self.region_spans(job);
        let workers = self.workers().min(spans.len()).max(1);
        let pool = match rayon::ThreadPoolBuilder::new().num_threads(workers).build() {
            Ok(p) => p,
            Err(e) => {
                let e = format!("cannot start {workers} worker threads: {e}");
                return (Err(Error::Usage(e)), 0);
            }
        };
        let regions = Regions::new(spans.len(), workers);
        let (ends, rxs): (Vec<_>, Vec<_>) = (spans.iter())
            .map(|_| {
                let (tx, rx) = mpsc::channel::<PieceEnd>();
                (std::sync::Mutex::new(Some(tx)), rx)
            })
            .unzip();
        let stop = AtomicBool::new(false);
        let running = std::sync::atomic::AtomicUsize::new(workers);
        let at = At {
            file,
            body,
            stop: &stop,
        };
        pool.in_place_scope(|s| {
            for w in 0..workers {
                let (spans, regions, ends, running) = (&spans, &regions, &ends, &running);
                s.spawn(move |_| {
                    let _last = Closing { running, ends };
                    self.walk_regions(job, spans, (regions, w), at, ends);
                });
            }
            let mut pos = 0;
            let r = (|| {
                for (k, rx) in rxs.iter().enumerate() {
                    let (r, written) = rx
                        .recv()
                        .map_err(|_| Error::Usage("a regeneration worker died".into()))?;
                    let start = spans[k].0.map_or(Some(0), |e| self.offset_of(e));
                    if start != Some(pos) {
                        return Err(misplaced(start, pos));
                    }
                    pos += written;
                    r?;
                }
                Ok(())
            })();
            if r.is_err() {
                stop.store(true, Ordering::SeqCst);
            }
            (r, pos)
        })
    }

    /// Worker `w`'s walks of `job`'s pieces (`spans`): its region, then
    /// what it steals, each run of consecutive pieces as one walk, each
    /// piece's end (its result and the bytes it wrote) sent on its
    /// channel in `ends`.
    fn walk_regions<'m>(
        &'m self,
        job: &Job<'m>,
        spans: &[Span<'m>],
        (regions, w): (&Regions, usize),
        at: At<'_>,
        ends: &[std::sync::Mutex<Option<mpsc::Sender<PieceEnd>>>],
    ) {
        let mut keep = Kept::default();
        let mut next = || regions.next(w);
        while let Some(first) = next().or_else(|| regions.steal(w)) {
            if at.stop.load(Ordering::SeqCst) {
                return;
            }
            let mut end = |k: usize, r: Result<()>, written: u64| {
                let tx = ends.get(k).and_then(|e| e.lock().ok()?.take());
                tx.is_some_and(|tx| tx.send((r, written)).is_ok())
            };
            if !self.walk_run((job, spans), first, &mut next, at, &mut end, &mut keep) {
                return;
            }
        }
    }

    /// Expands piece `first` of `spans` into `at`'s file at its offset,
    /// and goes on, in the same walk, with each piece `next` gives (the
    /// one after the last, while there is one), reporting each piece's
    /// result and bytes to `end`; false when a piece failed, the writer
    /// stopped or `end` could not report.
    fn walk_run<'m>(
        &'m self,
        (job, spans): (&Job<'m>, &[Span<'m>]),
        first: usize,
        next: &mut dyn FnMut() -> Option<usize>,
        at: At<'_>,
        end: &mut dyn FnMut(usize, Result<()>, u64) -> bool,
        keep: &mut Kept,
    ) -> bool {
        let mut piece = self.piece(job, spans[first]);
        // A region reads its chunks one after another, once each.
        piece.machine.stream_mut().own_chunks();
        let Some(start) = piece.at else {
            return end(first, Err(Error::Index(UNCOUNTED.into())), 0);
        };
        let mut w = match self.begin(piece, keep) {
            Ok(w) => w,
            Err(e) => return end(first, Err(e), 0),
        };
        let (mut k, mut written, mut werr) = (first, 0u64, None);
        let go = loop {
            let before = written;
            let mut emit =
                |b: &mut Vec<u8>| match at.file.write_all_at(b, at.body + start + written) {
                    Ok(()) => {
                        written += b.len() as u64;
                        !at.stop.load(Ordering::SeqCst)
                    }
                    Err(e) => {
                        werr = Some(e);
                        false
                    }
                };
            let r = self.expand(
                &mut w.machine,
                &mut w.sink,
                w.expect,
                &mut emit,
                None,
                &mut keep.batches,
            );
            let r = werr.take().map_or(r, |e| Err(Error::Output(e)));
            let (ok, paused) = (r.is_ok(), w.expect.is_some());
            if !end(k, r, written - before) || !ok || at.stop.load(Ordering::SeqCst) {
                break false;
            }
            // A piece after this one's end goes on from here: the walk
            // paused in the state its index entry keeps (checked).
            match if paused { next() } else { None } {
                Some(n) => {
                    debug_assert_eq!(n, k + 1, "a region's pieces are consecutive");
                    let (_, to) = spans[n];
                    w.sink.pause_at = to.map_or(u64::MAX, |e| e.offset);
                    w.expect = to;
                    k = n;
                }
                None => break true,
            }
        };
        self.end(w, keep);
        go
    }

    /// One thread cuts the streams into pieces, thread after thread; the
    /// workers expand pieces in the order they were cut; the writer drains
    /// piece after piece, handing the batches to `give`
    /// ([`crate::ordered`]).
    fn write_parallel(
        &self,
        workers: usize,
        give: &mut dyn FnMut(&mut Vec<u8>) -> std::io::Result<()>,
    ) -> Result<()> {
        let cut = |put: &mut dyn FnMut(_) -> bool| {
            for job in self.jobs {
                let mut go = true;
                self.cut(job, &mut |p| {
                    go = put(p);
                    go
                });
                if !go {
                    return;
                }
            }
        };
        let work = |tasks: &Tasks<'_, _>| {
            let mut keep = Kept::default();
            while let Some((piece, task)) = tasks.next() {
                let r = self.produce(piece, &mut |b| task.emit(b), &mut keep);
                task.end(r);
            }
        };
        let ahead = self.ahead_batches(workers);
        in_order(workers, ahead, &self.spare, cut, work, give)
    }

    /// Batches the pieces in flight may hold ahead of the writer, all
    /// together: a worker's share of the lookahead, what one piece's
    /// channel held before (the whole of it, with pieces a quarter as
    /// long, made 84-90 k page faults of fresh batches on bzip2's `bin`
    /// against 45 k, and no less CPU time).
    pub(crate) fn ahead_batches(&self, workers: usize) -> usize {
        (self.ahead_bytes.min(self.pieces_ahead()) / BATCH / workers.max(1)).max(4)
    }

    /// Counts one piece: per module of its group (instructions, blocks);
    /// procedure entries; (signals, of them interrupting instrumentation).
    /// It takes what a piece counted before left in `kept` (its group's
    /// summaries first), and leaves its own there.
    fn count_piece(&self, piece: Piece<'_>, group: usize, kept: &KeptCounting) -> Result<Counts> {
        let mut keep = kept
            .lock()
            .ok()
            .and_then(|mut k| {
                let same = k
                    .iter()
                    .position(|e| matches!(e.summaries, Some((g, _)) if g == group));
                let i = same.or_else(|| k.len().checked_sub(1))?;
                Some(k.swap_remove(i))
            })
            .unwrap_or_default();
        let mut m = piece.machine;
        m.stream_mut().reusing(std::mem::take(&mut keep.stream));
        let mut sink = match keep.summaries.take().filter(|(g, _)| *g == group) {
            Some((_, segs)) => Sink::counting_with(segs),
            None => Sink::counting(&self.groups[group]),
        };
        sink.pause_at = piece.pause_at;
        let r = restore(&mut m, piece.from)
            .and_then(|()| self.count_to_pause(&mut m, &mut sink, piece.expect));
        keep.summaries = Some((group, sink.take_summaries()));
        keep.stream = m.stream_mut().take_buffers();
        if let Ok(mut k) = kept.lock() {
            k.push(keep);
        }
        r?;
        Ok((
            sink.counts.map(|c| c.totals).unwrap_or_default(),
            m.entries,
            m.signals,
        ))
    }

    /// Runs counting machine `m` to its sink's pause point or the end of
    /// its stream.
    fn count_to_pause(
        &self,
        m: &mut Machine<'_>,
        sink: &mut Sink,
        expect: Option<&Entry>,
    ) -> Result<()> {
        loop {
            match m.run(sink)? {
                Progress::More => {}
                Progress::Paused => return check_pause(m, expect),
                Progress::Done => {
                    check_end(m, expect)?;
                    self.note_ending(m);
                    return Ok(());
                }
            }
        }
    }

    /// Each job's counts, in job order. With a state index, the pieces of
    /// each thread count in parallel too, and a job's are added in order
    /// (its first error wins, as the whole walk would meet it first).
    fn count_jobs(&self) -> Result<Vec<Result<Counts>>> {
        use rayon::prelude::*;
        let cut = self.opts.index.is_some() && self.workers() > 1;
        let spans: Vec<(usize, Span<'_>)> = (self.jobs.iter().enumerate())
            .flat_map(|(j, job)| {
                let spans = if cut {
                    self.spans(job)
                } else {
                    vec![(None, None)]
                };
                spans.into_iter().map(move |s| (j, s))
            })
            .collect();
        let kept = KeptCounting::default();
        let run = |&(j, span): &(usize, Span<'_>)| {
            let job = &self.jobs[j];
            self.count_piece(self.piece(job, span), job.group, &kept)
        };
        let workers = self.workers().min(spans.len()).max(1);
        let counted: Vec<Result<Counts>> = if workers <= 1 {
            spans.iter().map(run).collect()
        } else {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(workers)
                .build()
                .map_err(|e| Error::Usage(format!("cannot start {workers} worker threads: {e}")))?;
            pool.install(|| spans.par_iter().map(run).collect())
        };
        let mut results: Vec<Result<Counts>> = Vec::with_capacity(self.jobs.len());
        for ((j, _), c) in spans.iter().zip(counted) {
            if *j == results.len() {
                results.push(c);
                continue;
            }
            let Some(last) = results.last_mut() else {
                continue;
            };
            match c {
                Ok(c) => {
                    if let Ok(sum) = last {
                        add_counts(sum, &c);
                    }
                }
                Err(e) => {
                    if last.is_ok() {
                        *last = Err(e);
                    }
                }
            }
        }
        Ok(results)
    }

    /// `--count`: totals per thread and module, calls per procedure.
    fn totals(&self) -> Result<Totals> {
        let results = self.count_jobs()?;
        let mut calls: Vec<Vec<u64>> = self
            .compiled
            .iter()
            .map(|m| vec![0; m.procs.len()])
            .collect();
        let mut threads = Vec::new();
        for (job, r) in self.jobs.iter().zip(results) {
            let (totals, entries, signals) = r?;
            let s = &job.info.start;
            // One row per module shown (every module without `--module`);
            // a thread's signals on its first row.
            let mut first = true;
            for (k, &ci) in self.groups_idx(job).iter().enumerate() {
                let m = &self.compiled[ci];
                if !m.shown {
                    continue;
                }
                let (ni, nb) = totals[k];
                for (c, e) in calls[ci].iter_mut().zip(&entries[k]) {
                    *c += e;
                }
                let (sg, si) = if std::mem::take(&mut first) {
                    signals
                } else {
                    (0, 0)
                };
                threads.push(ThreadTotals {
                    thread: s.thread,
                    pid: s.pid,
                    tid: s.os_tid,
                    module: m.name.clone(),
                    instructions: ni,
                    blocks: nb,
                    signals: sg,
                    signals_in_instrumentation: si,
                });
            }
        }
        let calls = self
            .compiled
            .iter()
            .zip(&calls)
            .filter(|(m, _)| m.shown)
            .map(|(m, c)| {
                let mut rows: Vec<(String, u64)> = m
                    .procs
                    .values()
                    .zip(c)
                    .filter(|(_, &n)| n > 0)
                    .map(|(p, &n)| (p.name.clone(), n))
                    .collect();
                rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                (m.name.clone(), rows)
            })
            .collect();
        Ok(Totals {
            threads,
            calls,
            endings: self.take_endings(),
        })
    }
}
