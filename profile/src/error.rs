//! The profile model's error type.

use std::path::PathBuf;

/// Everything that can go wrong while reading, recovering or reporting a
/// profile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The profile is malformed, of another version, or inconsistent.
    #[error("profile: {what}")]
    Profile { what: String },
    /// Writing the report failed (closed pipe, full disk).
    #[error("writing the report: {0}")]
    Output(#[from] std::io::Error),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
