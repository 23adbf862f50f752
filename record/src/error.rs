//! The recorder's error type.
//!
//! Every message is one line naming the file or program it concerns, so
//! the command-line front end can print it as is.

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
    /// Recording a run failed (witness region, trace file, a child process).
    #[error("recording failed: {what}")]
    Record { what: String },
    /// Writing the report failed (closed pipe, full disk).
    #[error("writing the report: {0}")]
    Output(#[from] std::io::Error),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
