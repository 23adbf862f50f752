//! `aetrace-cachesim`: a Dinero IV-compatible, trace-driven cache simulator,
//! the consumer of `aetrace regen | cachesim`.
//!
//! - [`trace`]: the input formats (Dinero's traditional din `-informat d`,
//!   its extended din `-informat D`, the default, and aetrace's binary `bin`
//!   format `-informat b`, also recognised by its header), parsed without
//!   per-line allocation.
//! - [`config`]: Dinero IV's option family (`-lN-Tsize` and friends) and the
//!   geometry checks.
//! - [`cache`]: one cache's sets and replacement state.
//! - [`dinero`]: Dinero IV's reference semantics for a hierarchy (block
//!   splitting, write-back/write-through, write-allocate, the order of the
//!   references sent towards memory, compulsory/capacity/conflict).
//! - [`cachegrind`]: cachegrind's simpler semantics (`--model cachegrind`).
//! - [`fetch`]: block-level instruction fetch (one simulated access per
//!   line a block touches, the rest counted in bulk), exact by construction.
//! - [`sweep`]: one-pass LRU miss ratios for many sizes and associativities
//!   (Mattson stack distances; per-set-count stacks), and the SVG curve.
//! - [`report`]: Dinero's statistics layout and `--json`.
//!
//! The command line (`cachesim` and `aetrace cachesim`) lives in the
//! `aetrace` binary's `src/cmd/cachesim.rs`. Its exit codes:
//! - `0`: success.
//! - `1`: bad input or a runtime error (a malformed trace line, named by its
//!   line number; an unreadable file; a reference the model cannot take).
//! - `2`: usage error (unknown option, missing or impossible geometry).
//!
//! Invariants: every simulated reference is counted exactly as Dinero IV
//! counts it (see `docs/cachesim.md` for the few documented departures);
//! input that cannot be simulated exactly is refused with a message, never
//! approximated.

pub mod cache;
pub mod cachegrind;
pub mod config;
pub mod dinero;
pub mod fetch;
pub mod report;
pub mod sweep;
pub mod trace;

pub use aetrace_format::addrtrace::AccessKind;

/// Everything that can go wrong in cachesim.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line is wrong (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// A text trace line is malformed.
    #[error("line {line}: {message}")]
    Line {
        /// The 1-based line number.
        line: u64,
        /// What is wrong with the line.
        message: String,
    },
    /// A reference cannot be simulated (e.g. it straddles more lines than
    /// the model allows).
    #[error("reference {index}: {message}")]
    Reference {
        /// The 0-based position of the reference in the trace.
        index: u64,
        /// Why it cannot be simulated.
        message: String,
    },
    /// A `bin` trace that cannot be read.
    #[error(transparent)]
    Format(#[from] aetrace_format::Error),
    /// A file that cannot be opened or read.
    #[error("{path}: {source}")]
    File {
        /// The file's path, as given.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// Reading the trace or writing the output failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The producer of the references failed (the regenerator, when a
    /// trace is simulated in the same process).
    #[error(transparent)]
    Producer(Box<dyn std::error::Error + Send + Sync>),
    /// Plotters failed to draw the sweep's SVG curve.
    #[error("cannot draw the miss-ratio curve: {0}")]
    Plot(String),
}

/// Shorthand for results in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
