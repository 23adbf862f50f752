//! `aetrace-runtime`: the code the rewritten program runs and the
//! shared-memory protocol the recorder reads (design decisions 4-6; paper
//! 003 section 4: witnesses are written as instrumented edges are taken).
//!
//! - [`layout`]: the region layout and the witness/record encoding.
//! - [`emit`]: the inline sequences the rewriter places (witness, record,
//!   buffer check, outside-entry stub), all safe against async signals.
//! - [`blob`]: the generated runtime (`init`, `attach_thread`, `flush`,
//!   `fork_child`, `signal_entry`), position independent, raw syscalls only.
//! - [`region`]: the recorder side: create the region, drain it while the
//!   program runs and after it dies; read standalone trace files.
//!
//! Invariants: one writer per slot (one thread of one process); a byte is
//! reserved before it is written; `0x00` is never a valid witness. See
//! `docs/runtime.md`.

pub mod blob;
pub mod emit;
pub mod layout;
pub mod region;

pub use blob::{generate, Blob};
pub use emit::{
    emit_buffer_check, emit_direct_entry, emit_entry_rsp_differs, emit_entry_rsp_kept,
    emit_outside_entry, emit_outside_entry_at, emit_outside_entry_checks, emit_outside_entry_with,
    emit_record, emit_rsp_record, emit_static_entry, emit_transfer, emit_value, emit_witness,
    emit_witness_checked, AddrOperand, FlagsSave, Payload, RuntimeAddrs, Site, Value,
    ENTRY_SCRATCH,
};
pub use layout::{Geometry, RecordKind};
pub use region::{read_standalone, Batch, Drainer, ExecRequest, Region, Stream};

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call on the recorder side failed.
    #[error("{what}: {source}")]
    Io {
        /// The failed operation.
        what: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// iced-x86 refused an instruction while generating code.
    #[error("code generation: {0}")]
    Asm(#[from] iced_x86::IcedError),
    /// An emitter was asked for something it cannot do exactly.
    #[error("cannot emit instrumentation: {0}")]
    Emit(String),
    /// A region or standalone file does not have the expected layout.
    #[error("bad witness region: {0}")]
    BadRegion(String),
    /// A slot's stream holds an escape record of unknown kind.
    #[error("slot {slot}: unknown record kind {kind:#04x} at byte {offset} of half {half}")]
    BadRecord {
        /// The slot whose stream holds the record.
        slot: u32,
        /// The half (0 or 1) it was in.
        half: u32,
        /// Byte offset of the record in that half.
        offset: u64,
        /// The unknown kind byte.
        kind: u8,
    },
}
