//! `aetrace-debug`: trace-driven debugging. A gdb remote stub
//! (`aetrace debug --server`) that serves the threads of one process (and
//! its fork children) of a recorded run as gdb's target, each replayed on its own, with time travel over the whole run: gdb steps, breaks
//! and runs backwards through the regenerated instruction stream
//! (`../shared/DESIGN-debug.md`, issue 22; `docs/debug.md` says what works).
//!
//! - [`timeline`]: the thread's instructions as positions, with snapshots
//!   of the regenerator's machine for going back;
//! - [`image`]: the memory and module lists gdb reads (read-only segments
//!   of the modules' ELF files at their load bases);
//! - [`stack`]: the procedure stack at any position (for backtraces);
//! - [`cfi`]: which frames compute their CFA from `rbp` (what the
//!   backtraces' made-up `rbp` is given to);
//! - [`stub`]: one thread's replay (position, breakpoints, `monitor`);
//! - [`process`]: the gdb target, every thread of the process (`gdbstub`
//!   speaks the protocol);
//! - [`hc`]: the thread gdb names for reverse commands, read off the
//!   connection;
//! - [`materialise`]: the program re-run natively to the current
//!   instruction, for gdb to attach (`monitor materialise`);
//! - [`blocks`]: which procedure an address is in;
//! - [`data`]: each instruction's data references (watchpoints, frames'
//!   addresses); [`rebuilt`]: those the abstract data walk rebuilt;
//! - [`frames`]: the frames' real addresses, walking back from a stop;
//!   [`forward`]: those of a control-only trace, kept forwards;
//! - [`calltree`]: the whole run's call tree as Chrome/Perfetto trace JSON
//!   (`aetrace timeline`);
//! - [`pcmap`]: hash maps keyed by addresses, with a cheap hasher;
//! - [`untraced`]: passages through untraced code that calls traced code
//!   back, shown as positions in a made-up function `<untraced>`.
//!
//! Invariants: the pc at position `n` is the `n`th address of `aetrace
//! regen --thread T --format insn` (a passage through untraced code
//! before it has the made-up pc of [`untraced`]); no register or memory byte the trace
//! does not determine is ever served (unavailable instead); the library
//! prints nothing (errors are [`Error`] values for the binary to report).

pub mod blocks;
pub mod calltree;
pub mod cfi;
pub mod data;
pub mod forward;
pub mod frames;
pub mod hc;
pub mod image;
pub mod materialise;
pub mod pcmap;
pub mod process;
pub mod rebuilt;
pub mod stack;
pub mod stub;
pub mod timeline;
pub mod untraced;

#[cfg(test)]
mod tests;

use aetrace_format::section::{StartReason, ThreadStart};
use aetrace_format::{ModuleId, Trace};
use gdbstub::conn::{Connection, ConnectionExt};
use gdbstub::stub::{run_blocking, DisconnectReason, GdbStub, MultiThreadStopReason};
use std::io::{BufRead, Write};

/// What can stop a debugging session.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The trace could not be read.
    #[error(transparent)]
    Trace(#[from] aetrace_format::Error),
    /// The thread could not be regenerated.
    #[error(transparent)]
    Regen(#[from] aetrace_regen::Error),
    /// The thread ran no traced instruction.
    #[error("thread {0} executed no traced instruction: nothing to debug")]
    Empty(u32),
    /// `--at` is past the thread's end.
    #[error("thread {thread} executed fewer than {} traced instructions (--at {at})", at + 1)]
    At {
        /// The thread.
        thread: u32,
        /// The position asked for.
        at: u64,
    },
    /// The connection to gdb failed.
    #[error("the connection to gdb failed: {0}")]
    Connection(std::io::Error),
    /// Regenerating a thread stopped before its stream's end.
    #[error("thread {thread}: regeneration stopped early: {error}")]
    Cut {
        /// The thread.
        thread: u32,
        /// Why.
        error: String,
    },
    /// The output could not be written.
    #[error("cannot write the timeline: {0}")]
    Write(std::io::Error),
    /// The protocol or the target failed.
    #[error("the gdb stub failed: {0}")]
    Stub(String),
}

/// The data references of a thread (by id) of a trace recorded with
/// `--data` but not `--check`, rebuilt piece by piece as a session asks by
/// the abstract data walk, which lives in the binary ([`rebuilt`]).
pub type Rebuild<'a> = &'a dyn Fn(u32) -> Result<Box<dyn rebuilt::Source + 'a>, String>;

/// Which thread, and where to start.
#[derive(Clone, Copy, Default)]
pub struct Options<'a> {
    /// The trace's thread id (default: the first thread).
    pub thread: Option<u32>,
    /// The position to start at (default 0, the first instruction).
    pub at: u64,
    /// Instructions between snapshots (0: [`timeline::INTERVAL`]).
    pub interval: usize,
    /// Where to say why a watchpoint was refused (the library prints
    /// nothing itself).
    pub warn: Option<fn(&str)>,
    /// How to rebuild a thread's data references when the trace has
    /// them abstract only (`--data` without `--check`); without it such
    /// a trace has none (no watchpoints, frames' addresses made up).
    pub rebuild: Option<Rebuild<'a>>,
    /// A control-only trace's frames' addresses found by walking back
    /// from each stop ([`frames::cfas_by_entries`]) rather than by the
    /// pass forwards ([`forward`]): the reference the tests compare that
    /// pass with.
    pub walk_back: bool,
}

/// A connection over a byte reader and writer (stdin and stdout for `target
/// remote | aetrace debug --server`, in-memory buffers in tests).
pub struct Pipe<R, W> {
    input: R,
    output: W,
}

impl<R: BufRead, W: Write> Pipe<R, W> {
    /// A connection reading `input` and writing `output`.
    pub fn new(input: R, output: W) -> Self {
        Pipe { input, output }
    }

    /// The writer, back (tests read the replies from it).
    pub fn into_output(self) -> W {
        self.output
    }
}

impl<R: BufRead, W: Write> Connection for Pipe<R, W> {
    type Error = std::io::Error;

    fn write(&mut self, byte: u8) -> std::io::Result<()> {
        self.output.write_all(&[byte])
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.output.write_all(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.output.flush()
    }
}

impl<R: BufRead, W: Write> ConnectionExt for Pipe<R, W> {
    fn read(&mut self) -> std::io::Result<u8> {
        let b = *self
            .input
            .fill_buf()?
            .first()
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        self.input.consume(1);
        Ok(b)
    }

    /// Never used: the stub does not poll gdb while the target runs (a run
    /// ends at regeneration speed), so nothing is ever waiting here.
    fn peek(&mut self) -> std::io::Result<Option<u8>> {
        Ok(None)
    }
}

/// The event loop: the target runs in the stub's thread, to the end of each
/// action, without polling the connection.
struct Loop<'m, C>(std::marker::PhantomData<(&'m (), C)>);

impl<'m, C: ConnectionExt> run_blocking::BlockingEventLoop for Loop<'m, C> {
    type Target = process::Process<'m>;
    type Connection = C;
    type StopReason = MultiThreadStopReason<u64>;

    #[allow(clippy::type_complexity)]
    fn wait_for_stop_reason(
        target: &mut process::Process<'m>,
        _conn: &mut C,
    ) -> Result<
        run_blocking::Event<MultiThreadStopReason<u64>>,
        run_blocking::WaitForStopReasonError<String, C::Error>,
    > {
        match target.run() {
            Ok(stop) => Ok(run_blocking::Event::TargetStopped(stop)),
            Err(e) => Err(run_blocking::WaitForStopReasonError::Target(e)),
        }
    }

    fn on_interrupt(
        _target: &mut process::Process<'m>,
    ) -> Result<Option<MultiThreadStopReason<u64>>, String> {
        Ok(Some(MultiThreadStopReason::Signal(
            gdbstub::common::Signal::SIGINT,
        )))
    }
}

/// Serves the threads of thread `opts.thread`'s program image
/// ([`process_threads`]) of `trace` to gdb over
/// `conn`, that thread selected, until gdb disconnects.
pub fn serve<B, C>(trace: &Trace<B>, opts: Options<'_>, conn: C) -> Result<(), Error>
where
    B: AsRef<[u8]> + Sync,
    C: ConnectionExt<Error = std::io::Error>,
{
    with_process(trace, opts, |process| run(process, conn))
}

/// Checks that thread `opts.thread` of `trace` can be served from
/// `opts.at` (before gdb is started): the executable's path, as the trace
/// names it.
pub fn check<B: AsRef<[u8]> + Sync>(trace: &Trace<B>, opts: Options<'_>) -> Result<String, Error> {
    with_process(trace, opts, |process| {
        Ok(process.current().exe_path().to_owned())
    })
}

/// The gdb script `aetrace debug` loads: commands that wrap `monitor` (so
/// that gdb rereads the registers after a seek).
pub const GDB_SCRIPT: &str = include_str!("../gdb/aetrace.py");

/// The trace's thread ids served with thread `thread`, in the trace's
/// order: the threads of its program image, that is of its process, of
/// the processes forked from it (a fork copies the image; forks of forks
/// too) and of the process it was forked from, not the streams after an
/// `execve` (another image, served by a session of its own).
fn process_threads<B: AsRef<[u8]>>(trace: &Trace<B>, thread: u32) -> Vec<u32> {
    let starts: std::collections::HashMap<u32, &ThreadStart> = trace
        .threads()
        .map(|t| (t.start.thread.0, &t.start))
        .collect();
    if !starts.contains_key(&thread) {
        // Unknown: regeneration says so.
        return vec![thread];
    }
    let root = image_root(&starts, thread);
    let same = trace
        .threads()
        .filter(|t| image_root(&starts, t.start.thread.0) == root);
    same.map(|t| t.start.thread.0).collect()
}

/// The thread that started `thread`'s program image: up through the
/// threads that created it, to the program's first thread or the thread
/// that continued after an `execve`.
fn image_root(starts: &std::collections::HashMap<u32, &ThreadStart>, thread: u32) -> u32 {
    let mut t = thread;
    // A parent comes before its children: at most one step per thread.
    for _ in 0..starts.len() {
        let s = starts[&t];
        match (s.reason, s.parent) {
            (StartReason::Thread | StartReason::Fork, Some(p)) if starts.contains_key(&p.0) => {
                t = p.0
            }
            _ => break,
        }
    }
    t
}

/// Runs `f` on the threads of thread `opts.thread`'s program image, that
/// thread selected at `opts.at`, the others at their first instruction.
fn with_process<B, R>(
    trace: &Trace<B>,
    opts: Options<'_>,
    f: impl FnOnce(&mut process::Process<'_>) -> Result<R, Error>,
) -> Result<R, Error>
where
    B: AsRef<[u8]> + Sync,
{
    let thread = match opts.thread {
        Some(t) => t,
        None => trace.threads().next().map_or(0, |t| t.start.thread.0),
    };
    let ids = process_threads(trace, thread);
    let format = aetrace_regen::Format::Bin;
    aetrace_regen::with_thread_machines(trace, &ids, format, |machines| {
        let mut threads = Vec::new();
        for (&id, machine) in ids.iter().zip(machines) {
            let at = if id == thread { opts.at } else { 0 };
            let stub = thread_stub(trace, id, machine, at, &opts)?;
            let start = trace.thread(aetrace_format::ThreadId(id)).map(|t| t.start);
            threads.push(process::Thread {
                thread: id,
                pid: start.map_or(0, |s| s.pid),
                os_tid: start.map_or(0, |s| s.os_tid),
                stub,
            });
        }
        let current = ids.iter().position(|&id| id == thread).unwrap_or(0);
        f(&mut process::Process::new(threads, current))
    })?
}

/// The stub of thread `thread` at position `at` over `machine`.
fn thread_stub<'m, 'a: 'm, B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    thread: u32,
    machine: aetrace_regen::machine::Machine<'m>,
    at: u64,
    opts: &Options<'a>,
) -> Result<stub::Stub<'m>, Error> {
    let interval = match opts.interval {
        0 => timeline::INTERVAL,
        n => n,
    };
    let modules = machine.modules();
    let ids: Vec<ModuleId> = modules.iter().map(|m| ModuleId(m.id)).collect();
    let image = image::Image::of_modules(trace, &ids);
    let mut timeline = timeline::Timeline::new(machine, interval);
    if !timeline.has(0) {
        return Err(match timeline.error() {
            Some(e) => Error::Stub(e.to_string()),
            None => Error::Empty(thread),
        });
    }
    let plan = materialise::plan(trace, thread);
    let values = data::values(trace, thread, modules, opts.rebuild);
    let mut stub = stub::Stub::new(timeline, image, modules, 0).with_plan(plan);
    stub.walk_back = opts.walk_back;
    // Without data, a control-only trace's entries give frames' addresses.
    if values.is_err() {
        if let Ok(entries) = data::entry_values(trace, thread, modules) {
            stub = stub.with_entries(entries);
        }
    }
    let mut stub = stub.with_data(values, opts.warn.unwrap_or(|_| {}));
    // The walks kept per interval ride along the regeneration to `at`.
    if !stub.seek(at) {
        return Err(Error::At { thread, at });
    }
    Ok(stub)
}

/// Runs the protocol over `conn` until gdb disconnects.
fn run<C: ConnectionExt<Error = std::io::Error>>(
    target: &mut process::Process<'_>,
    conn: C,
) -> Result<(), Error> {
    let conn = hc::Watch::new(conn, target.hc());
    match GdbStub::new(conn).run_blocking::<Loop<'_, hc::Watch<C>>>(target) {
        Ok(DisconnectReason::Disconnect | DisconnectReason::Kill) => Ok(()),
        Ok(other) => Err(Error::Stub(format!("unexpected end: {other:?}"))),
        Err(e) if e.is_connection_error() => match e.into_connection_error() {
            Some((e, _)) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(()),
            Some((e, _)) => Err(Error::Connection(e)),
            None => Ok(()),
        },
        Err(e) => Err(Error::Stub(e.to_string())),
    }
}
