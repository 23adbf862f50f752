//! `aetrace-format`: everything aetrace writes to disk.
//!
//! - The trace container (`TRACE.aet`, specified byte by byte in `docs/format.md`):
//!   a 64-byte [`header`], then an append-only sequence of checksummed
//!   [`section`]s: modules with their load bases, each module's opaque program
//!   database, per-thread streams of zstd-compressed witness chunks, thread and
//!   process ends, notes, and END. [`writer`] appends while the traced program runs;
//!   [`trace`] reads any prefix of such a file (a recorder killed mid-write leaves a
//!   readable, explicitly incomplete trace) and never panics on bad bytes.
//! - [`atomic`]: output files written under a temporary name and renamed.
//! - [`addrtrace`]: the binary address-trace format (`aetrace regen --format bin`,
//!   read by `cachesim`).
//!
//! ```
//! use aetrace_format::*;
//! # fn main() -> Result<()> {
//! let mut w = TraceWriter::new(Vec::new(), &Header::new("aetrace 0.1.0", 0)?)?;
//! w.thread_start(&ThreadStart {
//!     thread: ThreadId(0),
//!     parent: None,
//!     os_tid: 4242,
//!     pid: 4242,
//!     reason: StartReason::Main,
//! })?;
//! w.chunk(ThreadId(0), &[1, 1, 1, 2, 1, 1, 1, 2], 8)?;
//! // A reader may open the file at any time: without END it is incomplete.
//! assert!(!Trace::parse(w.get_ref().as_slice())?.is_complete());
//! w.thread_end(ThreadId(0), EndReason::Exit)?;
//! let (bytes, _end) = w.finish()?;
//! let trace = Trace::parse(bytes)?;
//! trace.require_complete()?;
//! let chunk = trace.chunks(ThreadId(0)).next().unwrap();
//! assert_eq!(chunk.decompress()?, [1, 1, 1, 2, 1, 1, 1, 2]);
//! # Ok(())
//! # }
//! ```
//!
//! Invariants: all integers are little-endian and fixed-width; every section starts
//! at a multiple of 8; every byte of a trace is under a CRC-32, is padding checked to
//! be zero, or is the header's own CRC. The witness-stream encoding inside chunks and
//! the program database encoding belong to the rewriter and are opaque here. Each
//! thread's stream is the `trace_record(EX, epl) = (w1, ..., wk) || EOF` of Ball &
//! Larus, *Optimally Profiling and Tracing Programs*, Section 4.1, with THREAD_END
//! as its EOF; the container adds what a real run needs around it (modules and
//! their load bases, threads, processes, integrity, crash tolerance).

pub mod addrtrace;
pub mod atomic;
mod bytes;
pub mod error;
pub mod header;
pub mod index;
pub mod progdb;
pub mod section;
pub mod stats;
pub mod trace;
pub mod values;
pub mod writer;

#[cfg(test)]
mod tests;

pub use error::{Error, Result};
pub use header::Header;
pub use index::{ChunkRef, DatabaseRef, ThreadInfo};
pub use section::{
    module_flags, Codec, Command, EndReason, ExitStatus, Image, Module, Note, ProcessExit,
    SectionKind, StartReason, Stdin, ThreadEnd, ThreadStart,
};
pub use stats::{ExitStats, ModuleStats, Stats, ThreadStats};
pub use trace::{Chunk, Database, Fingerprint, Status, Trace, TraceFile};
pub use writer::{
    compress_chunk, compress_database, replaceable, EncodedChunk, EncodedDatabase, TraceWriter,
    DEFAULT_LEVEL,
};

use std::fmt;

/// A thread of the traced program, numbered densely by the recorder (not the OS tid).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct ThreadId(pub u32);

/// A loaded module, numbered densely by the recorder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct ModuleId(pub u32);

impl fmt::Display for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Display for ModuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}
