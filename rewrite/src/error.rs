//! The rewriter's error type.
//!
//! Every message is one line naming the file it concerns, so the
//! command-line front end can print it as is.

use std::path::PathBuf;

/// Everything that can go wrong while rewriting a module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The module could not be loaded or analysed.
    #[error(transparent)]
    Analysis(#[from] aetrace_analysis::Error),
    /// The rewritten ELF could not be produced.
    #[error("{}: cannot rewrite: {what}", path.display())]
    Rewrite { path: PathBuf, what: String },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
