//! One module per subcommand: its arguments (clap `Args`), and what it
//! prints and exits with. The options several commands share are defined
//! here once and flattened into theirs.
//!
//! Invariants: a command's errors go back to `main` as values (one line
//! each); only a command that ran the program ends like it ([`exit_like`]).

pub mod cachesim;
pub mod census;
pub mod cfg;
pub mod count;
pub mod dataout;
pub mod debug;
pub mod index;
pub mod info;
pub mod instrument;
pub mod paths;
pub mod profile;
pub mod record;
pub mod regen;
pub mod report;
pub mod timeline;
pub mod verify;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use aetrace_record::launch::Outcome;
use aetrace_record::libs::LibSelection;

/// What a command ends with: its exit code, or the error `main` prints.
pub type Result = std::result::Result<ExitCode, Box<dyn std::error::Error>>;

/// `--libs`, of the commands that run the program.
#[derive(clap::Args)]
pub struct Libs {
    /// Shared libraries to trace, profile or count too: `none`, `all` (but glibc's)
    /// or DT_NEEDED names such as `libbz2.so.1.0`, comma-separated.
    #[arg(long, default_value = "none")]
    libs: String,
}

impl Libs {
    /// The selection; a malformed list is the command's error (status 1).
    pub fn selection(&self) -> std::result::Result<LibSelection, aetrace_record::Error> {
        LibSelection::parse(&self.libs)
    }
}

/// `-o FILE` of the commands that run the program.
#[derive(clap::Args)]
pub struct Output {
    /// File to write (default: PROGRAM's base name + .aet, .aprof or .apath; `count`:
    /// stderr).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// The program and its arguments. Options of aetrace come before it: an
/// unknown one there is a usage error, not a program name; everything from
/// the program name on (or after `--`) is the program's, untouched.
#[derive(clap::Args)]
pub struct Program {
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true)]
    command: Vec<OsString>,
}

impl Program {
    /// The program name and its arguments.
    pub fn split(mut self) -> (PathBuf, Vec<OsString>) {
        let program = PathBuf::from(self.command.remove(0));
        (program, self.command)
    }
}

/// `--placement` of `instrument` and `record`.
#[derive(Copy, Clone, clap::ValueEnum)]
pub enum Placement {
    Optimal,
    AllPredicates,
    NaiveBlocking,
}

impl From<Placement> for aetrace_rewrite::Placement {
    fn from(p: Placement) -> Self {
        match p {
            Placement::Optimal => Self::Optimal,
            Placement::AllPredicates => Self::AllPredicates,
            Placement::NaiveBlocking => Self::NaiveBlocking,
        }
    }
}

/// One warning line on stderr.
pub fn warn(message: &str) {
    eprintln!("aetrace: warning: {message}");
}

/// Whether `e` (or an error it wraps) is a write to a closed pipe.
pub fn is_broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(e);
    while let Some(e) = at {
        let io = e.downcast_ref::<std::io::Error>();
        if io.is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) {
            return true;
        }
        at = e.source();
    }
    false
}

/// The exit code of a command that ran the program: the program's status,
/// or for a program killed by a signal the same signal (re-raised on
/// ourselves with its default action), else 128 + signal.
pub fn exit_like(outcome: Outcome) -> ExitCode {
    match outcome {
        Outcome::Exited(c) => ExitCode::from(c as u8),
        Outcome::Signaled(s) => {
            // SAFETY: resetting a disposition and raising a signal on ourselves.
            unsafe {
                libc::signal(s, libc::SIG_DFL);
                libc::raise(s);
            }
            ExitCode::from(128u8.wrapping_add(s as u8))
        }
    }
}
