//! Where a frame's CFA comes from, by the module's `.eh_frame` (found
//! through `.eh_frame_hdr`'s search table): whether gdb needs the frame's
//! `rbp` to compute its frame base. The unwinder (`aetrace.py`) gives a
//! caller the made-up `rbp` only where its CFA is `rbp`-based (a frame
//! pointer, as at -O0); elsewhere `rbp` is left "not saved", so an
//! optimised caller's variable that lives in `rbp` reads `<optimized
//! out>` rather than the made-up address as a number. And whether a
//! frame's return address is undefined (glibc's `_start`): the outermost
//! frame, where gdb ends a backtrace.
//!
//! Invariant: an address without CFI (no `.eh_frame_hdr`, no FDE, made-up
//! code such as `<untraced>`) counts as `rbp`-based: gdb's prologue
//! analyser may need `rbp` there, and "Register 6 was not saved" is worse
//! than a made-up value.

use crate::image::Image;
use aetrace_analysis::addr::Gpr;
use gimli::{BaseAddresses, CfaRule, EhFrame, EhFrameHdr, LittleEndian, Pointer, UnwindContext};
use gimli::{RegisterRule, UnwindSection, UnwindTableRow, X86_64};

/// Whether the CFA at `pc` is computed from `rbp` (or `pc` has no CFI).
pub fn cfa_from_rbp(image: &Image, pc: u64) -> bool {
    with_row(image, pc, |row| match row.cfa() {
        CfaRule::RegisterAndOffset { register, .. } => *register == X86_64::RBP,
        // gcc's CFA expressions (stack realignment) read rbp.
        CfaRule::Expression(_) => true,
    })
    .unwrap_or(true)
}

/// The CFA at `pc` as a register and an offset (`rsp` or `rbp` plus a
/// constant), where its CFI says so: the frames' real addresses
/// (`crate::frames`) come from it and a register's value.
pub fn cfa_rule(image: &Image, pc: u64) -> Option<(Gpr, i64)> {
    with_row(image, pc, |row| match *row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RSP => {
            Some((Gpr::RSP, offset))
        }
        CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RBP => {
            Some((Gpr::RBP, offset))
        }
        _ => None,
    })
    .flatten()
}

/// Whether the return address at `pc` is undefined by its CFI: the
/// outermost frame, as glibc's `_start` says (`cfi_undefined (rip)`),
/// where gdb ends a backtrace. False where `pc` has no CFI.
pub fn outermost(image: &Image, pc: u64) -> bool {
    with_row(image, pc, |row| {
        matches!(row.register(X86_64::RA), Some(RegisterRule::Undefined))
    })
    .unwrap_or(false)
}

/// `f` of the CFI's row at `pc`: `None` where `pc` has no CFI.
fn with_row<T>(image: &Image, pc: u64, f: impl FnOnce(&UnwindTableRow<usize>) -> T) -> Option<T> {
    let hdr_at = image.module_at(pc)?.eh_frame_hdr;
    if hdr_at == 0 {
        return None;
    }
    let bases = BaseAddresses::default().set_eh_frame_hdr(hdr_at);
    let hdr = EhFrameHdr::new(image.bytes_from(hdr_at), LittleEndian)
        .parse(&bases, 8)
        .ok()?;
    let Pointer::Direct(eh_at) = hdr.eh_frame_ptr() else {
        return None;
    };
    let bases = bases.set_eh_frame(eh_at);
    let eh_frame = EhFrame::new(image.bytes_from(eh_at), LittleEndian);
    let mut ctx = UnwindContext::new();
    let row = hdr
        .table()?
        .unwind_info_for_address(&eh_frame, &bases, &mut ctx, pc, EhFrame::cie_from_offset)
        .ok()?;
    Some(f(row))
}
