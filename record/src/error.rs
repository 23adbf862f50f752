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
        path: PathBuf,
        source: std::io::Error,
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
    HalfSize { var: &'static str, value: String },
    /// The shared witness region could not be made or passed on.
    #[error("{0}")]
    WitnessRegion(aetrace_runtime::Error),
    /// Reading the witness region while the program runs.
    #[error("reading the witness region: {0}")]
    Drain(aetrace_runtime::Error),
    /// The trace file could not be created or written.
    #[error("writing {}: {source}", path.display())]
    TraceFile {
        path: PathBuf,
        source: aetrace_format::Error,
    },
    /// The trace was closed after an earlier failure.
    #[error("trace closed")]
    TraceClosed,
    #[error("trace closed after an earlier failure")]
    TraceClosedAfterFailure,
    /// The program database could not be compressed into the cache.
    #[error("{}: compressing the program database: {source}", exe.display())]
    Database {
        exe: PathBuf,
        source: aetrace_format::Error,
    },
    /// The modules given to the launcher are inconsistent.
    #[error("no module given for the main executable")]
    NoMainModule,
    #[error("{}: the first module must be the main executable", .0.display())]
    FirstNotMain(PathBuf),
    #[error("{}: a library module must be instrumented and not the main executable", .0.display())]
    BadLibraryModule(PathBuf),
    #[error("{}: more than {max} instrumented libraries", path.display())]
    TooManyLibraries { path: PathBuf, max: u32 },
    /// A child process could not be managed: a system call on the
    /// recorder's side failed.
    #[error("PR_SET_CHILD_SUBREAPER: {0}")]
    Subreaper(std::io::Error),
    #[error("blocking signals around the spawn")]
    BlockSignals,
    #[error("waitpid: {0}")]
    Wait(std::io::Error),
    #[error("process {0} was never reaped, yet no child is left")]
    NeverReaped(i32),
    /// A module's runtime reports an impossible address.
    #[error("{}: pid {pid} reports its runtime at {runtime:#x}, below the runtime's link address {link:#x}", path.display())]
    RuntimeAddress {
        path: PathBuf,
        pid: u32,
        runtime: u64,
        link: u64,
    },
    /// A thread's witness stream does not start as one must.
    #[error("slot {slot} (pid {pid}, tid {tid}): stream starts with {start:02x?} instead of a THREAD or FORK record")]
    StreamStart {
        slot: u32,
        pid: u32,
        tid: u32,
        start: Vec<u8>,
    },
    /// A thread created by a slot that has written nothing.
    #[error(
        "slot {slot} (pid {pid}, tid {tid}): created by slot {parent}, which has written nothing"
    )]
    UnknownParent {
        slot: u32,
        pid: u32,
        tid: u32,
        parent: u32,
    },
    /// Compressing a chunk failed (`thread` when known).
    #[error("{}zstd: {source}", thread.map_or(String::new(), |t| format!("thread {t}: ")))]
    Zstd {
        thread: Option<aetrace_format::ThreadId>,
        source: std::io::Error,
    },
    #[error("internal: drained batches out of order")]
    BatchOrder,
}

/// Why the libraries `--libs` names cannot be traced or profiled.
#[derive(Debug, thiserror::Error)]
pub enum LibError {
    #[error("--libs {0:?}: an empty library name")]
    EmptyName(String),
    /// The loader's search finds no file for a DT_NEEDED name.
    #[error("{}: needed library {needed} not found (DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH, ld.so.cache, default directories)", object.display())]
    NotFound { object: PathBuf, needed: String },
    #[error("--libs: {0} cannot be traced: glibc's libraries and ld.so run before the runtime's init (libc's early init, IFUNC resolution) and the runtime relies on them")]
    Glibc(String),
    #[error("--libs: {needed} is found through a DT_RPATH ({}), which the loader searches before LD_LIBRARY_PATH: the rewritten copy could not be substituted", path.display())]
    ViaRpath { needed: String, path: PathBuf },
    /// A library the program would dlopen, named by a path.
    #[error("--libs: {name} is not among the libraries {} loads ({listed}), and a dlopen of a path bypasses the loader's search, so the rewritten copy cannot be substituted: a dlopened library is traced when the program opens it by a name without a slash, given here as that name", exe.display())]
    DlopenPath {
        name: String,
        exe: PathBuf,
        listed: String,
    },
    /// A library neither needed nor found as a dlopen would find it.
    #[error("--libs: {name} is not among the libraries {} loads ({listed}) and no library of that name is found as a dlopen from it would find it (DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH, ld.so.cache, default directories)", exe.display())]
    DlopenNotFound {
        name: String,
        exe: PathBuf,
        listed: String,
    },
    /// A dlopened library given to a counted run.
    #[error("--libs: {needed} is not a DT_NEEDED library of {}: libraries loaded by dlopen are traced by `aetrace record`, not profiled (a dlclose and a second dlopen would lose counts)", exe.display())]
    Dlopened { needed: String, exe: PathBuf },
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
    TempDir,
    /// A profile or skeleton could not be encoded.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("--stop-at {0}: events are numbered from 1 to 2^60")]
    StopAtRange(u64),
    #[error("--stop-at counts the executable only (no --libs)")]
    StopAtWithLibs,
    /// The counter memory (`what`: the call) failed.
    #[error("{what}: {source}")]
    Counters {
        what: &'static str,
        source: std::io::Error,
    },
    /// The program could not be started or waited for.
    #[error("{}: {source}", program.display())]
    Child {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("the program ended in an unknown way")]
    UnknownEnd,
    /// A counted path id that regenerates to no path.
    #[error("path {id}: {source}")]
    Path {
        id: u64,
        source: aetrace_graph::Error,
    },
    /// The count could not be written to `-o FILE`.
    #[error("{}: {source}", path.display())]
    Output {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
