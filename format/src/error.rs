//! The one error type of `aetrace-format`.
//!
//! Every reader of untrusted bytes returns these instead of panicking. Byte offsets
//! are absolute positions in the trace file, so a message can be checked with
//! `xxd -s OFFSET`. Which errors a reader may still recover a prefix from is a
//! property of the *place* of the damage, not of the variant: see
//! [`crate::trace::Status`] (a torn tail is reported there, inside an `Ok` trace;
//! the same variants returned as `Err` mean damage before the tail).

use crate::section::SectionKind;
use crate::ThreadId;
use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong reading or writing aetrace files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file does not start with the trace magic.
    #[error("not an aetrace trace (bad magic number at byte offset 0)")]
    NotATrace,

    /// The file's major version is not one this reader knows.
    #[error(
        "unsupported trace format version {major}.{minor} (this reader reads {}.x)",
        crate::header::VERSION_MAJOR
    )]
    UnsupportedVersion {
        /// The file's major version.
        major: u16,
        /// The file's minor version.
        minor: u16,
    },

    /// The header sets an incompatible feature flag this reader does not know.
    #[error("trace uses unknown incompatible feature flags {flags:#x}")]
    UnsupportedFeatures {
        /// The header's incompatible feature flags, unknown ones included.
        flags: u32,
    },

    /// A section of a kind marked critical that this reader does not know.
    #[error("unsupported critical section kind {kind} at byte offset {offset}")]
    UnsupportedSection {
        /// File offset of the section header.
        offset: u64,
        /// The section's kind.
        kind: SectionKind,
    },

    /// The bytes end inside the structure starting at `offset`.
    #[error("trace truncated: {what} at byte offset {offset} is cut short by the end of the file")]
    Truncated {
        /// File offset where the cut-short structure starts.
        offset: u64,
        /// What the structure is (for the message).
        what: &'static str,
    },

    /// A checksum does not match its bytes.
    #[error("bad checksum in the {part} of the {kind} section at byte offset {offset}")]
    BadChecksum {
        /// File offset of the section header.
        offset: u64,
        /// The kind as stored; when `part` is "header" the kind field itself is suspect.
        kind: SectionKind,
        /// Which checksum failed: "header" or "payload".
        part: &'static str,
    },

    /// Well-checksummed bytes that break a rule of the format.
    #[error("corrupt trace at byte offset {offset}: {what}")]
    Corrupt {
        /// File offset of the offending structure.
        offset: u64,
        /// Which rule is broken, and how.
        what: String,
    },

    /// A thread's chunk sequence skips a number.
    #[error(
        "thread {thread}: chunk {seq} is missing (found at byte offset {offset} instead: {found})"
    )]
    MissingChunk {
        /// The thread whose stream has the gap.
        thread: ThreadId,
        /// The sequence number expected next.
        seq: u64,
        /// File offset of the section found in its place.
        offset: u64,
        /// What was found instead.
        found: String,
    },

    /// A complete trace was required but this one has no END section.
    #[error("incomplete trace: {0}")]
    Incomplete(String),

    /// A writer was asked to append something the reader would reject.
    #[error("trace writer misuse: {0}")]
    Misuse(String),

    /// The writer stopped after a failed write; the file ends with a torn section.
    #[error("trace writer is unusable after an earlier write error")]
    Poisoned,

    /// Opening or mapping a file failed.
    #[error("{}: {source}", path.display())]
    Open {
        /// The file that could not be opened or mapped.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// The bytes are not a `bin` address trace.
    #[error("not an aetrace address trace (bad magic {0:02x?})")]
    NotAnAddrTrace([u8; 8]),

    /// A `bin` address trace of a version this reader does not know.
    #[error("unsupported address-trace version {0} (this build reads version {v})", v = crate::addrtrace::VERSION)]
    UnsupportedAddrTraceVersion(u16),

    /// A `bin` address trace with flags this reader does not know.
    #[error("unsupported address-trace flags {0:#06x}")]
    UnsupportedAddrTraceFlags(u16),

    /// A `bin` address trace that ends inside its header or a record.
    #[error("address trace truncated: {0}")]
    AddrTraceTruncated(String),

    /// A `bin` address trace whose header count disagrees with its records.
    #[error("address trace header declares {declared} records but {actual} are present")]
    AddrCountMismatch {
        /// The record count stored in the header.
        declared: u64,
        /// The number of whole records in the body.
        actual: u64,
    },

    /// An address that does not fit the `bin` record's 56-bit field.
    #[error("address {0:#x} does not fit the 56-bit address field")]
    AddressTooLarge(u64),

    /// An access size outside what a `bin` record holds.
    #[error("access size {0} is outside 1..=64")]
    SizeOutOfRange(u32),

    /// Any other I/O error (writing, compressing).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl Error {
    pub(crate) fn corrupt(offset: u64, what: impl Into<String>) -> Self {
        Error::Corrupt {
            offset,
            what: what.into(),
        }
    }
}
