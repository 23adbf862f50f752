//! `aetrace-verify`: the independent ptrace checker of paper 004 (Moseley,
//! Debray & Andrews, "Verifying Program Profiles"). It runs the original,
//! uninstrumented program under ptrace and follows each traced module block
//! by block the paper's way (Section 3.1): a breakpoint on the last
//! instruction of every block reached, inserted lazily; at the breakpoint the
//! last instruction is executed (emulated when it is a near branch, else
//! single-stepped) and the new `rip` is the next block's start. It shares
//! nothing with the instrumented code: only the CFG recovered from the
//! original file by `aetrace-record`, which it checks as it goes (the
//! paper's missing blocks, case (b), and missing edges, case (c)).
//!
//! This crate is the engine: [`follow`] launches the program and reports
//! every block entered, per thread, to an [`Observer`]; the trace comparison
//! (`check.rs`) and the profile check (`profile.rs`) of `aetrace verify`
//! plug in there.
//! `docs/verify.md` documents the method, the choices (breakpoints, threads,
//! signals, fork, exec) and the measured speed.
//!
//! Invariants: the tracer is single-threaded and drives all stops through
//! one `waitpid(__WALL)` loop; every breakpoint byte we write is restored
//! in any process we stop following (fork children) and the program's own
//! traps and signals are delivered to it unchanged.

pub mod check;
mod emulate;
mod loader;
pub mod module;
pub mod profile;
mod scratch;
mod sys;
mod tracer;

use std::path::PathBuf;

pub use check::{verify_trace, Report, VerifyOptions};
pub use profile::{verify_profile, ProfileOptions, ProfileReport};
pub use sys::Pid;
pub use tracer::follow;

/// Everything that can stop the checker. Each message is one line naming
/// the program, thread, module or address concerned.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Loading a module or recovering its CFG failed.
    #[error(transparent)]
    Analysis(#[from] aetrace_analysis::Error),
    /// The profile to check could not be read.
    #[error(transparent)]
    ProfileFile(#[from] aetrace_profile::Error),
    /// The CFG of a module cannot be followed (names what is wrong).
    #[error("{}: {what}", path.display())]
    Cfg {
        /// The module.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The program to run was not found (not a path, not on `PATH`).
    #[error("{program}: program not found")]
    NotFound {
        /// The name as given.
        program: String,
    },
    /// The program's stdin or stdout file could not be opened.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system reported.
        source: std::io::Error,
    },
    /// An argument contains a NUL byte.
    #[error("argument {arg:?} contains a NUL byte")]
    Nul {
        /// The argument.
        arg: String,
    },
    /// The program did not reach its first instruction (exec failed).
    #[error("{program}: could not be started (wait status {status:#x})")]
    Launch {
        /// The program.
        program: String,
        /// The raw wait status.
        status: i32,
    },
    /// A system call on a traced thread failed.
    #[error("{what} on thread {tid}: {source}")]
    Sys {
        /// The system call or ptrace request.
        what: &'static str,
        /// The traced thread.
        tid: Pid,
        /// What the system reported.
        source: std::io::Error,
    },
    /// Reading or writing the program's memory failed.
    #[error("memory of process {pid} at {addr:#x}: {source}")]
    Memory {
        /// The traced process.
        pid: Pid,
        /// The runtime address read or written.
        addr: u64,
        /// What the system reported.
        source: std::io::Error,
    },
    /// A traced module never appeared in the process's mappings.
    #[error(
        "{}: not mapped by the program when it reached its entry point (did the loader find another file, or is it loaded with dlopen?)",
        path.display()
    )]
    NotMapped {
        /// The module.
        path: PathBuf,
    },
    /// The trace cannot be checked (unreadable, or it does not match the
    /// program on disk); the message says what.
    #[error("{0}")]
    Trace(String),
    /// The profile cannot be checked against this program (the message
    /// says what).
    #[error("{0}")]
    Profile(String),
    /// The bytes at a module's runtime entry differ from the file: the load
    /// base is wrong or the file is not what runs.
    #[error("{}: code in memory at {addr:#x} differs from the file", path.display())]
    CodeMismatch {
        /// The module.
        path: PathBuf,
        /// The first differing runtime address.
        addr: u64,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What to follow.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Shared libraries to follow besides the main executable, from the
    /// moment the dynamic loader announces them mapped (`loader.rs`), before
    /// their initialisers run; where the loader cannot be watched, from the
    /// program's entry point on ([`Event::LibrariesMapped`] says which).
    pub libs: Vec<PathBuf>,
    /// Environment variables to set (or override) for the program; the
    /// rest of the environment is inherited.
    pub env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    /// The program's standard input (the recorded run's input file); `None`
    /// inherits ours.
    pub stdin: Option<PathBuf>,
    /// Where the program's standard output goes; `None` inherits ours.
    pub stdout: Option<PathBuf>,
    /// `argv[0]` (default: the program as given).
    pub argv0: Option<std::ffi::OsString>,
    /// The program's whole environment (`KEY=VALUE`, e.g. a recorded run's),
    /// replacing ours; `env` still overrides it.
    pub environment: Option<Vec<std::ffi::OsString>>,
    /// The working directory (default: ours).
    pub cwd: Option<PathBuf>,
    /// Do not pin the follower and the program to the CPU the follower
    /// runs on. Pinned (the default), each ptrace stop is a context switch
    /// instead of a cross-CPU wake-up, and the program's
    /// `sched_getaffinity` is answered with the mask it would have had
    /// (a seccomp filter stops it for the tracer): docs/verify.md, Speed.
    pub no_pin: bool,
}

/// How a thread came to a block.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// From the previous block of the same thread (its last instruction
    /// was executed and led here).
    Flow,
    /// From code that is not followed (libc calling back, a return from a
    /// library call, a signal handler's first block, thread start).
    Entry,
    /// Resumed after the block's start was missed (a signal handler that
    /// did not return normally, an unforeseen entry): the block is known
    /// only from the breakpoint at its end. Also reported as [`Event::Resync`].
    Unobserved,
    /// The rest of the block starting at `block`, from the reported address
    /// (inside it) on: a signal handler returned into the middle of a
    /// block the thread had begun. The instructions from there run after
    /// the handler's, so they are listed again as a block of their own, as
    /// the regenerator lists them (docs/regen.md, section 3a). Not a new
    /// execution of the block.
    Resumed {
        /// Link-time start address of the interrupted block.
        block: u64,
    },
}

/// Something the observer should know besides blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A new thread (reported on the new thread's id).
    ThreadStart,
    /// The thread ended (its wait status).
    ThreadExit {
        /// The raw wait status.
        status: i32,
    },
    /// A signal was delivered to the program.
    Signal {
        /// The signal number.
        sig: i32,
    },
    /// The paper's case (b): control reached `addr`, which no block of the
    /// CFG starts at; it lies inside the block starting at `containing`
    /// (which is followed from there on).
    MissingBlock {
        /// Index of the module in [`Outcome::modules`].
        module: usize,
        /// The reached link-time address.
        addr: u64,
        /// Start of the block that contains it.
        containing: u64,
        /// Name of the procedure.
        proc: String,
    },
    /// The paper's case (c): both blocks exist in the same procedure but the
    /// CFG has no edge between them.
    MissingEdge {
        /// Index of the module in [`Outcome::modules`].
        module: usize,
        /// Start of the block control left.
        from: u64,
        /// Start of the block control reached.
        to: u64,
        /// Name of the procedure.
        proc: String,
    },
    /// Control reached module code outside every recovered block (a
    /// procedure without CFG, or bytes no procedure covers).
    Untraced {
        /// Index of the module in [`Outcome::modules`].
        module: usize,
        /// The link-time address reached.
        addr: u64,
    },
    /// The thread's position was lost and found again at `at`.
    Resync {
        /// Index of the module in [`Outcome::modules`].
        module: usize,
        /// Link-time address where the thread was found again.
        at: u64,
        /// How the position was lost.
        reason: &'static str,
    },
    /// A forked child: breakpoints removed from its memory, then detached.
    ForkDetached {
        /// The child's process id.
        child: Pid,
    },
    /// The program called `execve`: following stops there.
    Exec,
    /// The traced libraries were found mapped and their entry traps
    /// written: when the loader announced them, before their initialisers
    /// ran, or (`at_entry`) only at the program's entry point, so that code
    /// they ran before it was not followed.
    LibrariesMapped {
        /// Found only at the program's entry point.
        at_entry: bool,
    },
}

/// Receives the followed execution. Addresses are link-time addresses of
/// module `module` (an index into [`Outcome::modules`]; 0 is the program).
pub trait Observer {
    /// A block of module `module` starting at `start` was executed by thread `tid`, reached as `arrival` says.
    fn block(&mut self, tid: Pid, module: usize, start: u64, arrival: Arrival);
    /// Something other than a block happened on thread `tid`; ignored by default.
    fn event(&mut self, tid: Pid, event: &Event) {
        let _ = (tid, event);
    }
    /// True once the observer needs nothing more from the run (every
    /// thread it compares has diverged): the follower then kills the
    /// program and returns ([`Outcome::stopped`]). Asked at every stop.
    fn done(&self) -> bool {
        false
    }
}

/// How the program ended (after an `execve` the new image runs untraced
/// and its end is still reported here).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Exit {
    /// The program exited with this status code.
    Code(i32),
    /// The program was killed by this signal.
    Signal(i32),
}

/// A traced module, as loaded in the run.
#[derive(Clone, Debug)]
pub struct LoadedModule {
    /// The module's file.
    pub path: PathBuf,
    /// Runtime minus link-time address.
    pub base: u64,
}

/// Counters of one run.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Blocks reported to the observer.
    pub blocks: u64,
    /// Breakpoint stops.
    pub traps: u64,
    /// Single steps (last instructions that could not be emulated, and
    /// first instructions under an entry breakpoint).
    pub steps: u64,
    /// Of the single steps, those run from a copy in the scratch page.
    pub displaced: u64,
    /// Last instructions executed by emulation.
    pub emulated: u64,
    /// Breakpoints written (entries at start, block ends lazily).
    pub breakpoints: u64,
    /// Signals passed on to the program.
    pub signals: u64,
    /// Positions lost and found again (should be 0).
    pub resyncs: u64,
    /// Threads followed, the first one included.
    pub threads: u64,
}

/// What a run produced besides the observer's view.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// How the program ended.
    pub exit: Exit,
    /// The modules followed: the program first, then the traced libraries.
    pub modules: Vec<LoadedModule>,
    /// Counters of the run.
    pub stats: Stats,
    /// Wall-clock time of the run.
    pub elapsed: std::time::Duration,
    /// The CPU the follower and the program were pinned to (`None`:
    /// `no_pin`, or the kernel refused the pin or the filter).
    pub cpu: Option<usize>,
    /// The follower killed the program because the observer was done
    /// ([`Observer::done`]); `exit` is then that `SIGKILL`.
    pub stopped: bool,
}
