//! The wrapper personality routine of the copies' FDEs: the original
//! personality (libstdc++'s `__gxx_personality_v0`, traced or not) is
//! called on the original return address, LSDA and region start, so it
//! walks the original call-site table exactly as natively (a traced
//! personality then runs the native instruction sequence), and the
//! landing pad it chooses is mapped back to the copy's LANDING stub.
//!
//! Each copied FDE with an LSDA points to its translated LSDA `L` (what
//! readelf, gdb and the fallback read), preceded by a shim:
//!
//! ```text
//! [rets: n_ret x (i32 copy return address - L, i32 original - L)]
//! [pads: n_pad x (i32 original landing pad - L, i32 LANDING stub - L)]
//! L-56: u32 n_ret, u32 n_pad      L-48: i64 personality - L
//! L-40: u64 1 if that is a slot holding it (DW_EH_PE_indirect), else 0
//! L-32: i64 original LSDA - L     L-24: i64 original region start - L
//! L-16: u64 0                     L-8:  u64 MAGIC
//! L: the translated LSDA
//! ```
//!
//! The wrapper edits libgcc's `struct _Unwind_Context` in place around the
//! call (`ra` at 0x98, `lsda` at 0xa0, `bases.func` at 0xb8: libgcc since
//! gcc 4.x, checked on Debian 12's gcc 12 by `_Unwind_GetIP`,
//! `_Unwind_GetLanguageSpecificData` and `_Unwind_GetRegionStart`), and
//! puts back the copy's values afterwards, so the unwinder's own walk is
//! unchanged. A pc that is no copied call's return address (a signal
//! frame) leaves the context alone: the personality reads the translated
//! LSDA, correct but not the native walk. A context whose LSDA lacks the
//! magic stops the program (`ud2`) rather than guess a layout.
//!
//! Invariants: every offset is relative to `L`, so the shim needs no
//! relocation; the wrapper preserves what the psABI says a callee
//! preserves and passes the personality's five arguments untouched.

use iced_x86::code_asm::{
    dword_ptr, eax, qword_ptr, r10, r10d, r11, r12, r13, r14, r15, r15d, r8, r9, r9d, rax, rbp,
    rbx, rcx, rdx, rsi, rsp, AsmRegister64, CodeAssembler, CodeLabel,
};

/// Marks a shim ("AETRSHIM").
pub const MAGIC: u64 = u64::from_le_bytes(*b"AETRSHIM");
/// Bytes of the shim's fixed part, just below the LSDA.
pub const SHIM_HEAD: usize = 56;
/// `_URC_INSTALL_CONTEXT`: the personality set the landing pad.
const URC_INSTALL_CONTEXT: i32 = 7;
/// Offsets in libgcc's `struct _Unwind_Context`.
const CTX_RA: i32 = 0x98;
const CTX_LSDA: i32 = 0xa0;
const CTX_FUNC: i32 = 0xb8;

/// What the shim of one copied FDE says.
#[derive(Clone, Debug)]
pub struct Shim {
    /// The original personality, or the slot holding it.
    pub personality: u64,
    /// `personality` is a slot (DW_EH_PE_indirect).
    pub indirect: bool,
    /// The original LSDA.
    pub lsda: u64,
    /// The original FDE's start (the personality's region start).
    pub func: u64,
    /// (copy, original) return address of each copied call.
    pub rets: Vec<(u64, u64)>,
    /// (original landing pad, LANDING stub).
    pub pads: Vec<(u64, u64)>,
}

/// A shim that cannot be written: an offset beyond 2 GiB of its LSDA.
#[derive(Debug, thiserror::Error)]
#[error("{0:#x} is more than 2 GiB from its LSDA")]
pub struct ShimRange(pub u64);

impl Shim {
    /// Its bytes for an LSDA at `lsda_at`; they end where the LSDA starts.
    pub fn encode(&self, lsda_at: u64) -> Result<Vec<u8>, ShimRange> {
        let rel = |a: u64| -> Result<[u8; 4], ShimRange> {
            i32::try_from(a.wrapping_sub(lsda_at) as i64)
                .map(i32::to_le_bytes)
                .map_err(|_| ShimRange(a))
        };
        let wide = |a: u64| a.wrapping_sub(lsda_at).to_le_bytes();
        let mut out = Vec::with_capacity(8 * (self.rets.len() + self.pads.len()) + SHIM_HEAD);
        for &(a, b) in self.rets.iter().chain(&self.pads) {
            out.extend_from_slice(&rel(a)?);
            out.extend_from_slice(&rel(b)?);
        }
        let count = |n: usize| u32::try_from(n).map_err(|_| ShimRange(n as u64));
        out.extend_from_slice(&count(self.rets.len())?.to_le_bytes());
        out.extend_from_slice(&count(self.pads.len())?.to_le_bytes());
        out.extend_from_slice(&wide(self.personality));
        out.extend_from_slice(&u64::from(self.indirect).to_le_bytes());
        out.extend_from_slice(&wide(self.lsda));
        out.extend_from_slice(&wide(self.func));
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(&MAGIC.to_le_bytes());
        Ok(out)
    }
}

/// The wrapper personality, assembled at `rip` (position independent).
pub fn wrapper(rip: u64) -> Result<Vec<u8>, iced_x86::IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut call = a.create_label();
    let mut direct = a.create_label();
    let mut put_back = a.create_label();
    let mut restore = a.create_label();
    let mut done = a.create_label();
    let mut bad = a.create_label();
    for r in [rbx, rbp, r12, r13, r14, r15] {
        a.push(r)?;
    }
    a.sub(rsp, 8)?; // the call below needs rsp 16-aligned
    a.mov(rbx, r8)?; // the context
    a.mov(r12, qword_ptr(rbx + CTX_LSDA))?; // L
    a.mov(rax, MAGIC)?;
    a.cmp(qword_ptr(r12 - 8), rax)?;
    a.jne(bad)?;
    a.mov(r13, qword_ptr(rbx + CTX_RA))?;
    a.mov(r14, qword_ptr(rbx + CTX_FUNC))?;
    a.xor(r15d, r15d)?; // 1 once the context shows the original
    a.mov(r9d, dword_ptr(r12 - 56))?; // n_ret
    a.mov(r10d, dword_ptr(r12 - 52))?; // n_pad
    a.lea(r11, qword_ptr(r9 + r10))?;
    a.shl(r11, 3)?;
    a.lea(rbp, qword_ptr(r12 - 56))?;
    a.sub(rbp, r11)?; // rets
    emit_map(&mut a, [rbp, r9, rax, r11, r13], call)?;
    for (field, ctx) in [(-32, CTX_LSDA), (-24, CTX_FUNC)] {
        a.mov(r11, qword_ptr(r12 + field))?;
        a.add(r11, r12)?;
        a.mov(qword_ptr(rbx + ctx), r11)?;
    }
    a.mov(r15d, 1)?;
    a.set_label(&mut call)?;
    a.mov(rax, qword_ptr(r12 - 48))?;
    a.add(rax, r12)?;
    a.test(qword_ptr(r12 - 40), 1)?;
    a.jz(direct)?;
    a.mov(rax, qword_ptr(rax))?;
    a.set_label(&mut direct)?;
    a.call(rax)?; // rdi, rsi, rdx, rcx, r8: the caller's arguments
    a.test(r15d, r15d)?;
    a.jz(done)?;
    a.cmp(eax, URC_INSTALL_CONTEXT)?; // an int: the upper half is undefined
    a.jne(restore)?;
    // The landing pad the personality set: the original's, to its stub.
    a.mov(r11, qword_ptr(rbx + CTX_RA))?;
    a.mov(r9d, dword_ptr(r12 - 56))?;
    a.mov(r10d, dword_ptr(r12 - 52))?;
    a.lea(rsi, qword_ptr(rbp + r9 * 8))?; // pads
    emit_map(&mut a, [rsi, r10, rcx, rdx, r11], bad)?;
    a.jmp(put_back)?;
    a.set_label(&mut restore)?;
    a.mov(qword_ptr(rbx + CTX_RA), r13)?;
    a.set_label(&mut put_back)?;
    a.mov(qword_ptr(rbx + CTX_LSDA), r12)?;
    a.mov(qword_ptr(rbx + CTX_FUNC), r14)?;
    a.set_label(&mut done)?;
    a.add(rsp, 8)?;
    for r in [r15, r14, r13, r12, rbp, rbx] {
        a.pop(r)?;
    }
    a.ret()?;
    a.set_label(&mut bad)?;
    a.ud2()?;
    a.assemble(rip)
}

/// Looks `key` up among the `count` pairs at `table` (i32 offsets from
/// `L`, in r12): found, the context's `ra` becomes the pair's second
/// address and the code falls through; else a jump to `missing`.
fn emit_map(
    a: &mut CodeAssembler,
    [table, count, index, value, key]: [AsmRegister64; 5],
    missing: CodeLabel,
) -> Result<(), iced_x86::IcedError> {
    let mut scan = a.create_label();
    let mut found = a.create_label();
    a.xor(index, index)?;
    a.set_label(&mut scan)?;
    a.cmp(index, count)?;
    a.jae(missing)?;
    a.movsxd(value, dword_ptr(table + index * 8))?;
    a.add(value, r12)?;
    a.cmp(value, key)?;
    a.je(found)?;
    a.inc(index)?;
    a.jmp(scan)?;
    a.set_label(&mut found)?;
    a.movsxd(value, dword_ptr(table + index * 8 + 4))?;
    a.add(value, r12)?;
    a.mov(qword_ptr(rbx + CTX_RA), value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields sit where the wrapper reads them: below `L`, each
    /// relative to it, the tables below the fixed part.
    #[test]
    fn shim_fields_are_where_the_wrapper_reads_them() {
        let l = 0x10_0000u64;
        let shim = Shim {
            personality: 0x2000,
            indirect: true,
            lsda: 0x3000,
            func: 0x4000,
            rets: vec![(l + 0x10, 0x4010), (l + 0x20, 0x4020)],
            pads: vec![(0x4030, l + 0x30)],
        };
        let b = shim.encode(l).unwrap();
        assert_eq!(b.len(), 8 * 3 + SHIM_HEAD);
        let head = b.len() - SHIM_HEAD;
        let word = |off: usize| i64::from_le_bytes(b[off..off + 8].try_into().unwrap());
        let half = |off: usize| i32::from_le_bytes(b[off..off + 4].try_into().unwrap());
        assert_eq!((half(head), half(head + 4)), (2, 1));
        assert_eq!(word(head + 8), 0x2000 - l as i64);
        assert_eq!(word(head + 16), 1);
        assert_eq!(word(head + 24), 0x3000 - l as i64);
        assert_eq!(word(head + 32), 0x4000 - l as i64);
        assert_eq!(word(head + 48) as u64, MAGIC);
        // Pairs: the second return address, then the landing pad.
        assert_eq!((half(8), half(12)), (0x20, 0x4020 - l as i32));
        assert_eq!((half(16), half(20)), (0x4030 - l as i32, 0x30));
    }

    #[test]
    fn a_far_address_is_refused() {
        let shim = Shim {
            personality: 1 << 40,
            indirect: false,
            lsda: 0,
            func: 0,
            rets: vec![(1 << 40, 0)],
            pads: Vec::new(),
        };
        assert!(shim.encode(0x1000).is_err());
    }
}
