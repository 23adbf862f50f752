//! `aetrace debug`: gdb on a recorded run, with reverse execution
//! (aetrace-debug). Without `--server`, starts the machine's gdb connected
//! to `aetrace debug --server` (this binary) through a pipe, with the
//! program's file and aetrace's gdb commands; with `--server`, speaks gdb's
//! remote protocol on stdin and stdout, and removes what `materialise`
//! wrote however it ends: gdb closing the pipe (EOF), or gdb's SIGTERM
//! (gdb sends one to a pipe target's command when it closes the
//! connection: `quit`, `kill`, `detach`, the end of a batch script).

use super::dataout::pieces::Walker;
use super::dataout::Sink;
use aetrace_analysis::addr::Access;
use aetrace_debug::rebuilt::{Rebuilt, Source};
use aetrace_format::Trace;
use aetrace_regen::index::StateIndex;
use aetrace_regen::visit::{BlockRun, Pieces, Span, Visit};
use std::cell::OnceCell;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    trace: PathBuf,
    /// The thread to debug (a thread id of `aetrace info`; default: the first).
    #[arg(long)]
    thread: Option<u32>,
    /// Start at this instruction of the thread (0: its first).
    #[arg(long, default_value_t = 0)]
    at: u64,
    /// Speak gdb's remote protocol on stdin/stdout (`target remote | aetrace debug --server TRACE`).
    #[arg(long)]
    server: bool,
    /// The gdb to run.
    #[arg(long, default_value = "gdb")]
    gdb: OsString,
    /// Instructions between the timeline's snapshots (0: the default); for
    /// tests (tests/debug.rs, `frames_from_snapshots_are_the_walks_from_the_start`).
    #[arg(long, default_value_t = 0, hide = true)]
    interval: usize,
    /// The frames' addresses by the walk back from each stop, the
    /// reference of the pass forwards; for tests.
    #[arg(long, hide = true)]
    walk_back: bool,
}

pub fn run(a: Args) -> super::Result {
    let trace = aetrace_format::TraceFile::open(&a.trace)?;
    // What the threads' pieces share, made when a piece is first asked.
    let (index, visit, pieces) = (OnceCell::new(), OnceCell::new(), OnceCell::new());
    let shared = Shared {
        trace: &trace,
        path: &a.trace,
        index: &index,
        visit: &visit,
        pieces: &pieces,
    };
    let rebuild = |thread| -> Result<Box<dyn Source + '_>, String> {
        Ok(Box::new(ThreadPieces {
            thread,
            shared,
            walker: None,
            spans: Vec::new(),
        }))
    };
    let opts = aetrace_debug::Options {
        thread: a.thread,
        at: a.at,
        interval: a.interval,
        // The server's stderr is gdb's terminal.
        warn: Some(|why| eprintln!("aetrace: {why}")),
        rebuild: Some(&rebuild),
        walk_back: a.walk_back,
    };
    if a.server {
        clean_up_when_signalled()?;
        let conn = aetrace_debug::Pipe::new(std::io::stdin().lock(), std::io::stdout().lock());
        let served = aetrace_debug::serve(&trace, opts, conn);
        remove_scratch();
        served?;
        return Ok(ExitCode::SUCCESS);
    }
    let exe = aetrace_debug::check(&trace, opts)?;
    let script = gdb_script()?;
    // gdb takes this process's place (Ctrl-C then reaches gdb alone); it
    // removes the script once sourced.
    let e = gdb_command(&a, &exe, &script).exec();
    let _ = std::fs::remove_file(&script);
    Err(format!(
        "cannot run {:?} ({e}): install gdb or name one with --gdb",
        a.gdb
    )
    .into())
}

/// What the pieces of every thread of a `--data` trace share: the state
/// index with the data walk's states (`TRACE.idx` when it has them and
/// counts the instructions before each entry; else built, as `aetrace
/// index` builds it, and written there for the next session), the walk
/// of the trace from it and its pieces.
struct Shared<'s, 't, B> {
    trace: &'t Trace<B>,
    path: &'t Path,
    index: &'s OnceCell<Arc<StateIndex>>,
    visit: &'s OnceCell<Visit<'t, B>>,
    pieces: &'s OnceCell<Pieces<'s, B>>,
}

// References only, whatever `B` is.
impl<B> Clone for Shared<'_, '_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for Shared<'_, '_, B> {}

/// The state index, the walk of the trace from it, and its pieces.
type Walks<'s, 't, B> = (&'s Arc<StateIndex>, &'s Visit<'t, B>, &'s Pieces<'s, B>);

impl<'s, 't, B: AsRef<[u8]> + Sync> Shared<'s, 't, B> {
    /// The walk of the trace from its index, and its pieces.
    fn pieces(self) -> Result<Walks<'s, 't, B>, String> {
        if self.index.get().is_none() {
            let _ = self.index.set(data_index(self.trace, self.path)?);
        }
        let index = self.index.get().ok_or("no state index")?;
        if self.visit.get().is_none() {
            let opts = aetrace_regen::Options {
                index: Some(index.clone()),
                ..aetrace_regen::Options::default()
            };
            let v = Visit::with_segments(self.trace, &opts).map_err(|e| e.to_string())?;
            let _ = self.visit.set(v.sharing_values());
        }
        let visit = self.visit.get().ok_or("no walk")?;
        if self.pieces.get().is_none() {
            let _ = self.pieces.set(visit.pieces().map_err(|e| e.to_string())?);
        }
        Ok((index, visit, self.pieces.get().ok_or("no pieces")?))
    }
}

/// The state index of the trace at `path` with the data walk's states and
/// the instructions before each entry counted (see [`Shared`]).
fn data_index<B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    path: &Path,
) -> Result<Arc<StateIndex>, String> {
    let counted = |i: &StateIndex| {
        let mut entries = i.threads.values().flatten();
        entries.clone().any(|e| !e.data.is_empty())
            && entries.all(|e| e.data.is_empty() || e.instructions.is_some())
    };
    if let Some(i) = super::index::load(path, None, trace).filter(|i| counted(i)) {
        return Ok(i);
    }
    let i = super::index::build(trace, aetrace_regen::index::DEFAULT_INTERVAL)
        .map_err(|e| format!("the trace's state index cannot be built: {e}"))?;
    // As `regen` does: no index written only means the next session
    // builds it again.
    let _ = i.save(&StateIndex::sidecar(path));
    Ok(Arc::new(i))
}

/// A thread's pieces, rebuilt as its session reads them
/// (`aetrace_debug::rebuilt::Lazy`).
struct ThreadPieces<'s, 't, B> {
    thread: u32,
    shared: Shared<'s, 't, B>,
    walker: Option<Walker<'s, 't, B>>,
    /// The thread's pieces with their first positions, in order (known
    /// once a piece is asked).
    spans: Vec<(u64, Span)>,
}

impl<B: AsRef<[u8]> + Sync> Source for ThreadPieces<'_, '_, B> {
    fn piece(&mut self, p: u64) -> Result<Option<Rebuilt>, String> {
        let why = |e: Box<dyn std::error::Error>| {
            format!(
                "thread {}: the data addresses cannot be rebuilt: {e}",
                self.thread
            )
        };
        if self.walker.is_none() {
            let (index, visit, pieces) = self.shared.pieces()?;
            self.spans = thread_spans(index, pieces, self.thread)?;
            let w = Walker::new(self.shared.trace, visit, pieces, index);
            self.walker = Some(w.map_err(why)?);
        }
        let k = self.spans.partition_point(|&(first, _)| first <= p);
        let Some(&(first, span)) = k.checked_sub(1).and_then(|k| self.spans.get(k)) else {
            return Ok(None);
        };
        let walker = self.walker.as_mut().ok_or("no walker")?;
        let mut sink = Rebuilding(Rebuilt::starting_at(first));
        walker.piece(&mut sink, span, &mut || true).map_err(why)?;
        // The next piece starts where this one ends, by the entries' counts.
        let end = self.spans.get(k).map(|&(next, _)| next);
        if end.is_some_and(|e| e != sink.0.positions().end) {
            return Err(format!(
                "thread {}: the state index counts {end:?} instructions where the data walk's piece from {first} ends at {}",
                self.thread,
                sink.0.positions().end
            ));
        }
        Ok(Some(sink.0))
    }
}

/// Thread `thread`'s pieces of `pieces`, cut at the entries of `index`
/// with data states, each with its first position (the instructions its
/// entry counted).
fn thread_spans<B: AsRef<[u8]> + Sync>(
    index: &StateIndex,
    pieces: &Pieces<'_, B>,
    thread: u32,
) -> Result<Vec<(u64, Span)>, String> {
    let entries = index.entries(thread);
    let spans = pieces.spans(&|e| !e.data.is_empty());
    let first = |s: &Span| match s.from {
        None => Some(0),
        Some(k) => entries.get(k).and_then(|e| e.instructions),
    };
    (spans.into_iter().filter(|s| s.thread.0 == thread))
        .map(|s| {
            Ok((
                first(&s).ok_or("an index entry without its instructions")?,
                s,
            ))
        })
        .collect()
}

/// The data walk's sink that fills a [`Rebuilt`].
struct Rebuilding(Rebuilt);

impl Sink for Rebuilding {
    fn run(&mut self, r: BlockRun) {
        self.0.run(r.first, r.end);
    }

    fn insn(&mut self, k: u32, _: u64, _: u32) -> super::dataout::Result<()> {
        Ok(self.0.insn(k)?)
    }

    fn data(&mut self, access: Access, addr: u64, size: u32) -> super::dataout::Result<()> {
        Ok(self.0.data(access, addr, size)?)
    }
}

/// The signals that end the server: gdb's SIGTERM, a hangup, an
/// interrupt.
const ENDING: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGHUP, libc::SIGINT];

/// Blocks [`ENDING`] in every thread (threads inherit the mask; the
/// processes `materialise` runs reset it) and waits for one in a thread of
/// its own, which removes what `materialise` wrote and ends the process
/// with 128 + the signal.
fn clean_up_when_signalled() -> std::io::Result<()> {
    // SAFETY: a signal set on the stack, filled by libc before use, and
    // the calling thread's mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in ENDING {
            libc::sigaddset(&mut set, s);
        }
        match libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) {
            0 => set,
            e => return Err(std::io::Error::from_raw_os_error(e)),
        }
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: waits for a signal of a set blocked in every thread.
            unsafe { libc::sigwait(&set, &mut sig) };
            remove_scratch();
            std::process::exit(128 + sig);
        })?;
    Ok(())
}

/// Removes what `materialise` wrote (gdb has read it; a process it
/// debugs keeps its program mapped).
fn remove_scratch() {
    if let Err(e) = aetrace_debug::materialise::remove_scratch() {
        eprintln!(
            "aetrace: cannot remove {}: {e}",
            aetrace_debug::materialise::scratch_dir().display()
        );
    }
}

/// gdb's command line: the program's file, the stub through a pipe,
/// aetrace's commands.
fn gdb_command(a: &Args, exe: &str, script: &Path) -> Command {
    let mut server = format!(
        "{} debug --server --at {} {}",
        shell_quote(&std::env::current_exe().unwrap_or_else(|_| "aetrace".into())),
        a.at,
        shell_quote(&a.trace)
    );
    if let Some(t) = a.thread {
        server.push_str(&format!(" --thread {t}"));
    }
    let mut c = Command::new(&a.gdb);
    c.arg("-q");
    c.arg("-ex").arg(format!("source {}", script.display()));
    c.arg("-ex").arg(format!(
        "python import os; os.remove({:?})",
        script.display().to_string()
    ));
    // The stub loads and checks the trace before its first reply, which
    // can take longer than gdb's 2 s on a long trace or a loaded machine:
    // gdb then resends, and the replies fall out of step.
    c.arg("-ex").arg("set remotetimeout 60");
    c.arg("-ex").arg(format!("target remote | {server}"));
    if Path::new(exe).is_file() {
        c.arg(exe);
    }
    c
}

/// `p` quoted for `sh -c` (gdb runs the pipe's command through the shell).
fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// aetrace's gdb commands in a temporary file gdb sources.
fn gdb_script() -> std::io::Result<PathBuf> {
    let path = std::env::temp_dir().join(format!("aetrace-debug-{}.py", std::process::id()));
    std::fs::File::create(&path)?.write_all(aetrace_debug::GDB_SCRIPT.as_bytes())?;
    Ok(path)
}
