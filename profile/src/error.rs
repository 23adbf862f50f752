//! The profile model's error type.

use std::path::PathBuf;

/// Everything that can go wrong while reading, recovering or reporting a
/// profile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The profile is malformed, of another version, or inconsistent.
    #[error("profile: {what}")]
    Profile {
        /// What is wrong with it.
        what: String,
    },
    /// A module of the profile could not be read or analysed again.
    #[error("{}: {source}", path.display())]
    Analysis {
        /// The module.
        path: PathBuf,
        /// Why.
        source: aetrace_analysis::Error,
    },
    /// Writing the report failed (closed pipe, full disk).
    #[error("writing the report: {0}")]
    Output(#[from] std::io::Error),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
