//! The one error type of `aetrace-regen`.
//!
//! Regeneration is exact or it stops: every way a trace can disagree with
//! its program database is a variant here, and each names what it can of
//! thread, procedure, block (link-time address) and stream byte offset (the
//! offset in the thread's decompressed witness stream, counted from 0).
//! Output written before an error is exact; the error says where it stops.

use aetrace_format::ThreadId;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can stop a regeneration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The trace container or a program database is unreadable.
    #[error(transparent)]
    Format(#[from] aetrace_format::Error),

    /// Writing the output failed (a closed pipe, a full disk).
    #[error("writing the regenerated trace: {0}")]
    Output(#[source] std::io::Error),

    /// The options ask for something the trace does not have.
    #[error("{0}")]
    Usage(String),

    /// An in-process consumer of pieces (the data walk of `regen --data
    /// -j N`, `visit::Pieces::write_in_order`) stopped with this error.
    #[error("{0}")]
    Consumer(String),

    /// A state index (`index`) that does not fit its trace: unreadable,
    /// built for other bytes, or a state the regeneration does not reach.
    #[error("state index: {0}")]
    Index(String),

    /// A program database whose witness numbering is not the one the
    /// placement algorithm gives its edges (the regenerator would misread
    /// every witness of the procedure).
    #[error("program database of {module}: procedure {proc}: {what}")]
    Database {
        /// The module whose database it is.
        module: String,
        /// The procedure whose numbering differs.
        proc: String,
        /// How it differs.
        what: String,
    },

    /// A witness that fits no successor of the predicate being decided.
    #[error("thread {thread}: procedure {proc} block {block:#x}: witness {witness} (stream byte offset {offset}) is not in any successor's witness set")]
    BadWitness {
        /// The thread whose stream it is.
        thread: ThreadId,
        /// The procedure being regenerated.
        proc: String,
        /// Link-time address of the predicate block being decided.
        block: u64,
        /// The witness read.
        witness: u32,
        /// Its byte offset in the thread's stream.
        offset: u64,
    },

    /// A witness edge was traversed but the stream holds another witness.
    #[error("thread {thread}: procedure {proc} block {block:#x}: the edge to {to} writes witness {expected}, but the stream has witness {found} (stream byte offset {offset})")]
    WrongWitness {
        /// The thread whose stream it is.
        thread: ThreadId,
        /// The procedure being regenerated.
        proc: String,
        /// Link-time address of the block the edge leaves.
        block: u64,
        /// The edge's target block.
        to: String,
        /// The witness the edge writes.
        expected: u32,
        /// The witness the stream holds.
        found: u32,
        /// Its byte offset in the thread's stream.
        offset: u64,
    },

    /// A record that cannot occur where it was read.
    #[error("thread {thread}: {record} at stream byte offset {offset} cannot occur {at}")]
    Unexpected {
        /// The thread whose stream it is.
        thread: ThreadId,
        /// The record read.
        record: String,
        /// Its byte offset in the thread's stream.
        offset: u64,
        /// Where the regenerator was ("in procedure f after block 0x401000").
        at: String,
    },

    /// The stream ends where the program must have written more.
    #[error("thread {thread}: the witness stream ends at byte offset {offset} {at}{note}")]
    Truncated {
        /// The thread whose stream it is.
        thread: ThreadId,
        /// The byte offset where the stream ends.
        offset: u64,
        /// Where the regenerator was ("in procedure f after block 0x401000").
        at: String,
        /// Why the stream may be short (an incomplete trace), or empty.
        note: String,
    },

    /// Bytes that are no record of the stream encoding.
    #[error("thread {thread}: malformed witness stream at byte offset {offset}: {what}")]
    BadStream {
        /// The thread whose stream it is.
        thread: ThreadId,
        /// Byte offset of the bad bytes in the stream.
        offset: u64,
        /// What is wrong with them.
        what: String,
    },

    /// A signal whose interrupted position cannot be placed exactly in the
    /// regenerated trace (docs/regen.md, "Signals").
    #[error("thread {thread}: SIGNAL({signo}, interrupted rip {rip:#x}) at stream byte offset {offset} {at}: {why}")]
    Signal {
        /// The thread whose stream it is.
        thread: ThreadId,
        /// The signal number.
        signo: u32,
        /// The interrupted instruction's run-time address.
        rip: u64,
        /// The SIGNAL record's byte offset in the thread's stream.
        offset: u64,
        /// Where the regenerator was ("in procedure f after block 0x401000").
        at: String,
        /// Why the position cannot be placed.
        why: String,
    },

    /// A record the regenerator cannot follow where it stands (a
    /// SETJMP_RESUME while traced code runs, an older trace's SETJMP) or
    /// one that says the trace lost the program (DESYNC).
    #[error("thread {thread}: {record} at stream byte offset {offset} {at}: {why}")]
    Unsupported {
        /// The thread whose stream it is.
        thread: ThreadId,
        /// The record read.
        record: String,
        /// Its byte offset in the thread's stream.
        offset: u64,
        /// Where the regenerator was ("in procedure f after block 0x401000").
        at: String,
        /// Why it cannot be followed.
        why: &'static str,
    },
}
