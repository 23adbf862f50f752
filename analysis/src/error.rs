//! The crate's one error type.
//!
//! Every message is one line naming the file or procedure it concerns, so the
//! command-line front end can print it as is.

use std::path::PathBuf;

/// Everything that can go wrong while loading a module or recovering its CFG.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be opened or mapped.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system reported.
        source: std::io::Error,
    },
    /// The file does not start with the ELF magic.
    #[error("{}: not an ELF file", path.display())]
    NotElf {
        /// The file.
        path: PathBuf,
    },
    /// An ELF file of a kind aetrace does not handle (32-bit, big-endian,
    /// another machine, an object file or core dump).
    #[error("{}: unsupported ELF: {what}", path.display())]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// What is unsupported.
        what: String,
    },
    /// The ELF structures are inconsistent or cut short.
    #[error("{}: malformed ELF: {what}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is inconsistent.
        what: String,
    },
    /// `--function` named nothing the module has.
    #[error("{}: no procedure named or starting at `{name}`", path.display())]
    NoSuchFunction {
        /// The module searched.
        path: PathBuf,
        /// The name or address asked for.
        name: String,
    },
    /// Writing the report failed (closed pipe, full disk).
    #[error("writing the report: {0}")]
    Output(#[from] std::io::Error),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
