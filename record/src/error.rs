//! The recorder's error types: [`Error`], with the failure kinds of a
//! recorded run in [`RecordError`], of the libraries `--libs` selects in
//! [`LibError`] and of a counted run in [`CountError`].
//!
//! Every message is one line naming the file or program it concerns, so
//! the command-line front end can print it as is (users and tests grep the
//! texts: keep them).

use std::path::PathBuf;

/// Everything that can go wrong while recording, profiling or counting a
/// run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A module could not be loaded or analysed.
    #[error(transparent)]
    Analysis(#[from] aetrace_analysis::Error),
    /// A module could not be rewritten.
    #[error(transparent)]
    Rewrite(#[from] aetrace_rewrite::Error),
    /// A profile could not be read, recovered or written.
    #[error(transparent)]
    Profile(#[from] aetrace_profile::Error),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system reported.
        source: std::io::Error,
    },
    /// A `#!` script's interpreter cannot be run (the shell's words).
    #[error("{}: {}: bad interpreter: {reason}", script.display(), interp.display())]
    BadInterpreter {
        /// The script the user named.
        script: PathBuf,
        /// The interpreter its `#!` line names.
        interp: PathBuf,
        /// Why it cannot be run, anywhere down the chain of scripts.
        reason: String,
    },
    /// Recording a run failed.
    #[error("recording failed: {0}")]
    Record(#[from] RecordError),
    /// The `--libs` selection cannot be traced or profiled.
    #[error("recording failed: {0}")]
    Lib(#[from] LibError),
    /// A counted run (profile, count, paths) failed.
    #[error("profile: {0}")]
    Count(#[from] CountError),
    /// Writing the report failed (closed pipe, full disk).
    #[error("writing the report: {0}")]
    Output(#[from] std::io::Error),
}

impl From<aetrace_format::atomic::Error> for Error {
    fn from(e: aetrace_format::atomic::Error) -> Self {
        Error::Io {
            path: e.path,
            source: e.source,
        }
    }
}

/// How a recorded run (`aetrace record`, [`crate::launch`]) fails.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The program is not a file, nor an executable on `PATH`.
    #[error("{}: program not found", .0.display())]
    ProgramNotFound(PathBuf),
    /// `AETRACE_HALF_SIZE` is not a number.
    #[error("{var}={value}: not a number of bytes")]
    HalfSize {
        /// The variable's name.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The shared witness region could not be made or passed on.
    #[error("{0}")]
    WitnessRegion(aetrace_runtime::Error),
    /// Reading the witness region while the program runs.
    #[error("reading the witness region: {0}")]
    Drain(aetrace_runtime::Error),
    /// The trace file could not be created or written.
    #[error("writing {}: {source}", path.display())]
    TraceFile {
        /// The trace file.
        path: PathBuf,
        /// What the trace writer reported.
        source: aetrace_format::Error,
    },
    /// The recording failed while the program ran, which ran on to its
    /// end: the trace has no END, and what it holds ends at `at`.
    #[error("{}: the trace is incomplete (the program ran on to its end): it holds whole sections up to byte {at}, then {}", path.display(), cause(source))]
    Incomplete {
        /// The trace file.
        path: PathBuf,
        /// Bytes of whole sections (a torn one may follow).
        at: u64,
        /// What failed first.
        source: Box<crate::Error>,
    },
    /// The trace was closed after an earlier failure.
    #[error("trace closed")]
    TraceClosed,
    #[error("trace closed after an earlier failure")]
    /// The trace writer is used again after a write to it failed (it was dropped).
    TraceClosedAfterFailure,
    /// The program database could not be compressed into the cache.
    #[error("{}: compressing the program database: {source}", exe.display())]
    Database {
        /// The original executable.
        exe: PathBuf,
        /// What the compressor reported.
        source: aetrace_format::Error,
    },
    /// The modules given to the launcher are inconsistent.
    #[error("no module given for the main executable")]
    NoMainModule,
    #[error("{}: the first module must be the main executable", .0.display())]
    /// The first module given is not flagged as the main executable.
    FirstNotMain(PathBuf),
    #[error("{}: a library module must be instrumented and not the main executable", .0.display())]
    /// A library module is flagged as the main executable or not instrumented.
    BadLibraryModule(PathBuf),
    #[error("{}: more than {max} instrumented libraries", path.display())]
    /// More libraries than the runtime's module ids can number.
    TooManyLibraries {
        /// The library past the limit.
        path: PathBuf,
        /// The most instrumented libraries a run can have.
        max: u32,
    },
    /// A child process could not be managed: a system call on the
    /// recorder's side failed.
    #[error("PR_SET_CHILD_SUBREAPER: {0}")]
    Subreaper(std::io::Error),
    #[error("blocking signals around the spawn")]
    /// Blocking signals around the spawn (so the child starts with them blocked) failed.
    BlockSignals,
    #[error("waitpid: {0}")]
    /// `waitpid` failed.
    Wait(std::io::Error),
    #[error("process {0} was never reaped, yet no child is left")]
    /// A process the recorder tracks (the pid) was never reaped though no child is left.
    NeverReaped(i32),
    /// A module's runtime reports an impossible address.
    #[error("{}: pid {pid} reports its runtime at {runtime:#x}, below the runtime's link address {link:#x}", path.display())]
    RuntimeAddress {
        /// The module.
        path: PathBuf,
        /// The process reporting.
        pid: u32,
        /// The runtime address it reports.
        runtime: u64,
        /// The runtime's link-time address.
        link: u64,
    },
    /// A thread's witness stream does not start as one must.
    #[error("slot {slot} (pid {pid}, tid {tid}): stream starts with {start:02x?} instead of a THREAD or FORK record")]
    StreamStart {
        /// The thread's slot in the shared witness region.
        slot: u32,
        /// Its process id.
        pid: u32,
        /// Its OS thread id.
        tid: u32,
        /// The stream's first bytes.
        start: Vec<u8>,
    },
    /// A thread created by a slot that has written nothing.
    #[error(
        "slot {slot} (pid {pid}, tid {tid}): created by slot {parent}, which has written nothing"
    )]
    UnknownParent {
        /// The thread's slot in the shared witness region.
        slot: u32,
        /// Its process id.
        pid: u32,
        /// Its OS thread id.
        tid: u32,
        /// The slot of the thread that created it.
        parent: u32,
    },
    /// Compressing a chunk failed (`thread` when known).
    #[error("{}zstd: {source}", thread.map_or(String::new(), |t| format!("thread {t}: ")))]
    Zstd {
        /// The thread whose chunk it was, when known.
        thread: Option<aetrace_format::ThreadId>,
        /// What zstd reported.
        source: std::io::Error,
    },
    #[error("internal: drained batches out of order")]
    /// Drained witness batches do not tile the slot's buffer in order (a bug).
    BatchOrder,
}

/// Why the libraries `--libs` names cannot be traced or profiled.
#[derive(Debug, thiserror::Error)]
pub enum LibError {
    #[error("--libs {0:?}: an empty library name")]
    /// `--libs` lists an empty name (e.g. a doubled comma).
    EmptyName(String),
    /// The loader's search finds no file for a DT_NEEDED name.
    #[error("{}: needed library {needed} not found (DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH, ld.so.cache, default directories)", object.display())]
    NotFound {
        /// The object that needs it.
        object: PathBuf,
        /// The DT_NEEDED name.
        needed: String,
    },
    #[error("--libs: {0} cannot be traced here: {1}")]
    /// `--libs` names ld.so, or a glibc library where it cannot be traced.
    Glibc(String, &'static str),
    #[error("--libs: {needed} is found through a DT_RPATH ({}), which the loader searches before LD_LIBRARY_PATH: the rewritten copy could not be substituted", path.display())]
    /// A library given to `--libs` is found through a DT_RPATH, so a rewritten copy on `LD_LIBRARY_PATH` would not be used.
    ViaRpath {
        /// The DT_NEEDED name.
        needed: String,
        /// Where DT_RPATH finds it.
        path: PathBuf,
    },
    /// A library the program would dlopen, named by a path.
    #[error("--libs: {name} is not among the libraries {} loads ({listed}), and a dlopen of a path bypasses the loader's search, so the rewritten copy cannot be substituted: a dlopened library is traced when the program opens it by a name without a slash, given here as that name", exe.display())]
    DlopenPath {
        /// The name given to `--libs`.
        name: String,
        /// The program.
        exe: PathBuf,
        /// The libraries the program loads, comma-separated.
        listed: String,
    },
    /// A library neither needed nor found as a dlopen would find it.
    #[error("--libs: {name} is not among the libraries {} loads ({listed}) and no library of that name is found as a dlopen from it would find it (DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH, ld.so.cache, default directories)", exe.display())]
    DlopenNotFound {
        /// The name given to `--libs`.
        name: String,
        /// The program.
        exe: PathBuf,
        /// The libraries the program loads, comma-separated.
        listed: String,
    },
    /// A dlopened library given to a counted run.
    #[error("--libs: {needed} is not a DT_NEEDED library of {}: libraries loaded by dlopen are traced by `aetrace record`, not profiled (a dlclose and a second dlopen would lose counts)", exe.display())]
    Dlopened {
        /// The name given to `--libs`.
        needed: String,
        /// The program.
        exe: PathBuf,
    },
}

/// How a counted run (`aetrace profile`, `count`, `paths`) fails.
#[derive(Debug, thiserror::Error)]
pub enum CountError {
    /// `--weights` names a profile without edge counts.
    #[error("the weights profile has block counts only (every-block placement)")]
    WeightsBlockCounts,
    /// A rewrite's counter layout disagrees with itself.
    #[error("internal: {0}")]
    CounterLayout(String),
    #[error("cannot create a temporary directory")]
    /// No fresh temporary directory could be created after 100 tries.
    TempDir,
    /// A profile or skeleton could not be encoded.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("--stop-at {0}: events are numbered from 1 to 2^60")]
    /// `--stop-at` is 0 or above 2^60.
    StopAtRange(u64),
    #[error("--stop-at counts the executable only (no --libs)")]
    /// `--stop-at` was given with `--libs`.
    StopAtWithLibs,
    /// The counter memory (`what`: the call) failed.
    #[error("{what}: {source}")]
    Counters {
        /// The system call that failed.
        what: &'static str,
        /// What the system reported.
        source: std::io::Error,
    },
    /// The program could not be started or waited for.
    #[error("{}: {source}", program.display())]
    Child {
        /// The program.
        program: PathBuf,
        /// What the system reported.
        source: std::io::Error,
    },
    #[error("the program ended in an unknown way")]
    /// The program's wait status is neither an exit nor a signal.
    UnknownEnd,
    /// A counted path id that regenerates to no path.
    #[error("path {id}: {source}")]
    Path {
        /// The path id.
        id: u64,
        /// What path regeneration reported.
        source: aetrace_graph::Error,
    },
    /// The count could not be written to `-o FILE`.
    #[error("{}: {source}", path.display())]
    Output {
        /// The output file.
        path: PathBuf,
        /// What the system reported.
        source: std::io::Error,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `e`'s message without the "recording failed: " that the outer error
/// says already.
fn cause(e: &Error) -> String {
    match e {
        Error::Record(r) => r.to_string(),
        e => e.to_string(),
    }
}
