//! PLT stubs (`.plt`, `.plt.sec`, `.plt.got`) and the imports they jump to.
//!
//! Each stub is its own procedure of kind "plt" (so its instructions are part
//! of the module's coverage and trace). A stub is named after its import by
//! decoding its `jmp *slot(%rip)` and mapping the GOT slot to the
//! relocation that fills it (`R_X86_64_JUMP_SLOT` from `.rela.plt`,
//! `R_X86_64_GLOB_DAT`/`R_X86_64_64` from `.rela.dyn`); an IBT `.plt` entry,
//! which has no GOT jump, is named from its `push n` (the index into
//! `.rela.plt`). `IRELATIVE` slots (ifuncs resolved at load time) are named
//! `*ABS*+0x<resolver>` like objdump does.
//!
//! Invariants: stubs are disjoint, lie inside their section, and have the
//! section's entry size (16 bytes for `.plt`/`.plt.sec`, 8 for a `.plt` of
//! non-lazy entries, `sh_entsize` or 8 for `.plt.got`); the first entry of a
//! lazy `.plt` is the lazy-binding header `<plt0>`.

use std::collections::HashMap;

use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};

use crate::elf::{
    Module, Reloc, R_X86_64_64, R_X86_64_GLOB_DAT, R_X86_64_IRELATIVE, R_X86_64_JUMP_SLOT,
};

/// One PLT stub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PltStub {
    /// Link-time address of the stub's first byte.
    pub start: u64,
    /// Link-time address just past its last byte.
    pub end: u64,
    /// The import's name (`exit`), `*ABS*+0x...` for an ifunc slot, `None`
    /// for `<plt0>` or a stub we could not name.
    pub import: Option<String>,
    /// The GOT slot the stub jumps through, if it has such a jump.
    pub got_slot: Option<u64>,
    pub(crate) is_plt0: bool,
}

impl PltStub {
    /// The procedure name: `exit@plt`, `<plt0>`, or `plt_<hex>`.
    pub fn name(&self) -> String {
        match (&self.import, self.is_plt0) {
            (_, true) => "<plt0>".to_owned(),
            (Some(i), _) => format!("{i}@plt"),
            (None, _) => format!("plt_{:x}", self.start),
        }
    }
}

fn reloc_name(r: &Reloc) -> Option<String> {
    match (&r.sym_name, r.r_type) {
        (Some(n), _) => Some(n.clone()),
        (None, R_X86_64_IRELATIVE) => Some(format!("*ABS*+{:#x}", r.addend)),
        _ => None,
    }
}

/// GOT slot address -> the import that fills it.
pub fn got_names(module: &Module) -> HashMap<u64, String> {
    let mut map = HashMap::new();
    for r in module.plt_relocs.iter().chain(&module.dyn_relocs) {
        if matches!(
            r.r_type,
            R_X86_64_JUMP_SLOT | R_X86_64_GLOB_DAT | R_X86_64_64 | R_X86_64_IRELATIVE
        ) {
            if let Some(n) = reloc_name(r) {
                map.entry(r.offset).or_insert(n);
            }
        }
    }
    map
}

/// Finds and names every PLT stub of the module, in address order.
pub fn find_stubs(module: &Module) -> Vec<PltStub> {
    let got = got_names(module);
    let mut stubs = Vec::new();
    for sec in module.exec_sections() {
        let Some(bytes) = module.section_bytes(sec) else {
            continue;
        };
        let non_lazy = sec.name == ".plt" && is_non_lazy_entry(bytes);
        let is_plt = sec.name == ".plt" && !non_lazy;
        let entsize = match sec.name.as_str() {
            ".plt" if non_lazy => 8,
            ".plt" | ".plt.sec" => 16,
            ".plt.got" | ".plt.bnd" => {
                if sec.entsize == 8 || sec.entsize == 16 {
                    sec.entsize
                } else {
                    8
                }
            }
            _ => continue,
        };
        let n = sec.size / entsize;
        for i in 0..n {
            let start = sec.addr + i * entsize;
            let off = (i * entsize) as usize;
            let Some(code) = bytes.get(off..off + entsize as usize) else {
                break;
            };
            let (got_slot, push) = scan_stub(code, start);
            let is_plt0 = is_plt && i == 0;
            let import = if is_plt0 {
                None
            } else if let Some(slot) = got_slot {
                got.get(&slot).cloned()
            } else {
                push.and_then(|k| module.plt_relocs.get(k as usize))
                    .and_then(reloc_name)
            };
            stubs.push(PltStub {
                start,
                end: start + entsize,
                import,
                got_slot,
                is_plt0,
            });
        }
    }
    stubs.sort_by_key(|s| s.start);
    stubs
}

/// Whether a `.plt` starts with GNU ld's 8-byte non-lazy entry, `jmp
/// [rip+disp]; xchg ax, ax`, instead of the lazy header `push [rip+disp]`:
/// a static non-PIE executable's `.plt` of IRELATIVE stubs has no header
/// (each entry would otherwise be read as 16 bytes, two stubs in one).
fn is_non_lazy_entry(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && bytes[..2] == [0xff, 0x25] && bytes[6..8] == [0x66, 0x90]
}

/// The GOT slot of the stub's `jmp [rip+disp]` and the operand of its
/// `push imm`, if present.
fn scan_stub(code: &[u8], ip: u64) -> (Option<u64>, Option<u64>) {
    let mut slot = None;
    let mut push = None;
    for insn in Decoder::with_ip(64, code, ip, DecoderOptions::NONE).into_iter() {
        match insn.mnemonic() {
            Mnemonic::Jmp
                if insn.op0_kind() == OpKind::Memory && insn.memory_base() == Register::RIP =>
            {
                slot.get_or_insert(insn.ip_rel_memory_address());
            }
            Mnemonic::Push
                if insn.op0_kind() != OpKind::Memory && insn.op0_kind() != OpKind::Register =>
            {
                push.get_or_insert(insn.immediate(0));
            }
            _ => {}
        }
    }
    (slot, push)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn stub_scan_reads_slot_and_index() {
        // jmp *0x2fe2(%rip); push $3; jmp plt0
        let code = [
            0xff, 0x25, 0xe2, 0x2f, 0x00, 0x00, 0x68, 0x03, 0x00, 0x00, 0x00, 0xe9, 0xd0, 0xff,
            0xff, 0xff,
        ];
        let (slot, push) = scan_stub(&code, 0x1030);
        assert_eq!(slot, Some(0x1030 + 6 + 0x2fe2));
        assert_eq!(push, Some(3));
    }

    #[test]
    fn non_lazy_entries_are_told_from_the_lazy_header() {
        // jmp *0xa2fe2(%rip); xchg %ax,%ax (static non-PIE glibc's `.plt`)
        let non_lazy = [0xff, 0x25, 0xe2, 0x2f, 0x0a, 0x00, 0x66, 0x90];
        assert!(is_non_lazy_entry(&non_lazy));
        // push 0xecfca(%rip); jmp *0xecfcc(%rip): `<plt0>`
        let lazy = [0xff, 0x35, 0xca, 0xcf, 0x0e, 0x00, 0xff, 0x25];
        assert!(!is_non_lazy_entry(&lazy));
        assert!(!is_non_lazy_entry(&non_lazy[..6]));
    }

    #[test]
    fn gzip_stubs_are_named_after_imports() {
        let m = Module::open(Path::new("/usr/bin/gzip")).unwrap();
        let stubs = find_stubs(&m);
        assert!(stubs[0].is_plt0);
        let names: Vec<String> = stubs.iter().map(PltStub::name).collect();
        for want in ["exit@plt", "__stack_chk_fail@plt", "<plt0>"] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
        // Every stub but plt0 of a dynamic executable has an import name.
        assert!(stubs.iter().all(|s| s.is_plt0 || s.import.is_some()));
    }
}
