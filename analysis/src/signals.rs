//! Signal-handler discovery: which imports install a handler, and which
//! code addresses an instruction takes (the candidates for a handler it
//! passes to one).
//!
//! A handler is found where it is installed: a procedure calling
//! `sigaction`, `signal`, ... takes its address (`lea` of a RIP-relative
//! address, or an immediate) in its own code. A handler whose address
//! travels through data is not seen.

use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind};

use crate::elf::Module;

/// Functions that install a signal handler.
const INSTALLERS: &[&str] = &[
    "sigaction",
    "signal",
    "sigset",
    "bsd_signal",
    "__sysv_signal",
    "sysv_signal",
];

/// Whether `import` (symbol version ignored) installs a signal handler.
pub fn is_installer(import: &str) -> bool {
    INSTALLERS.contains(&import.split('@').next().unwrap_or(import))
}

/// The addresses the instruction at `at` takes: a RIP-relative `lea`'s
/// address and its immediates. Empty where `at` is not in the module.
pub fn addresses_taken(module: &Module, at: u64) -> Vec<u64> {
    let Some(bytes) = (1..=15u64).rev().find_map(|n| module.bytes_at(at, n)) else {
        return Vec::new();
    };
    let i = Decoder::with_ip(64, bytes, at, DecoderOptions::NONE).decode();
    let mut taken = Vec::new();
    if i.mnemonic() == Mnemonic::Lea && i.is_ip_rel_memory_operand() {
        taken.push(i.ip_rel_memory_address());
    }
    for k in 0..i.op_count() {
        if matches!(
            i.op_kind(k),
            OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate64
        ) {
            taken.push(i.immediate(k));
        }
    }
    taken
}
