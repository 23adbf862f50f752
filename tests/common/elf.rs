//! A minimal ELF64 little-endian section-header reader, written for the
//! tests so the coverage figures do not come from the code they check.
//! Input files are the machine's own binaries; malformed input panics with
//! a message (this is test code, not a parser of untrusted bytes).

use std::path::Path;

#[derive(Clone)]
pub struct Section {
    pub name: String,
    pub addr: u64,
    pub offset: u64,
    pub size: u64,
    pub exec: bool,
    pub nobits: bool,
}

#[derive(Clone)]
pub struct Elf {
    pub bytes: Vec<u8>,
    pub sections: Vec<Section>,
}

fn u16_at(b: &[u8], off: usize) -> u64 {
    u64::from(u16::from_le_bytes(b[off..off + 2].try_into().unwrap()))
}
fn u32_at(b: &[u8], off: usize) -> u64 {
    u64::from(u32::from_le_bytes(b[off..off + 4].try_into().unwrap()))
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

const SHF_EXECINSTR: u64 = 0x4;
const SHT_NOBITS: u64 = 8;

impl Elf {
    pub fn read(path: &Path) -> Elf {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            bytes.len() >= 64 && &bytes[..4] == b"\x7fELF",
            "{}: not ELF",
            path.display()
        );
        assert_eq!(
            (bytes[4], bytes[5]),
            (2, 1),
            "{}: not ELF64 LE",
            path.display()
        );
        let shoff = u64_at(&bytes, 0x28) as usize;
        let shentsize = u16_at(&bytes, 0x3a) as usize;
        let shnum = u16_at(&bytes, 0x3c) as usize;
        let shstrndx = u16_at(&bytes, 0x3e) as usize;
        let raw: Vec<(u64, u64, u64, u64, u64, u64)> = (0..shnum)
            .map(|i| {
                let h = shoff + i * shentsize;
                (
                    u32_at(&bytes, h),        // name offset
                    u32_at(&bytes, h + 4),    // type
                    u64_at(&bytes, h + 8),    // flags
                    u64_at(&bytes, h + 0x10), // addr
                    u64_at(&bytes, h + 0x18), // offset
                    u64_at(&bytes, h + 0x20), // size
                )
            })
            .collect();
        let strtab_off = raw[shstrndx].4 as usize;
        let sections = raw
            .iter()
            .map(|&(name, ty, flags, addr, offset, size)| {
                let start = strtab_off + name as usize;
                let len = bytes[start..].iter().position(|&c| c == 0).unwrap();
                Section {
                    name: String::from_utf8_lossy(&bytes[start..start + len]).into_owned(),
                    addr,
                    offset,
                    size,
                    exec: flags & SHF_EXECINSTR != 0,
                    nobits: ty == SHT_NOBITS,
                }
            })
            .collect();
        Elf { bytes, sections }
    }

    /// The file bytes of `[addr, addr + len)` inside `s`.
    /// The spans `[addr, addr + size)` of the PLT sections (`.plt`,
    /// `.plt.got`, `.plt.sec`), PLT0 included.
    pub fn plt_spans(&self) -> Vec<(u64, u64)> {
        let plt = self.sections.iter().filter(|s| s.name.starts_with(".plt"));
        plt.map(|s| (s.addr, s.addr + s.size)).collect()
    }

    pub fn bytes_of(&self, s: &Section, addr: u64, len: u64) -> &[u8] {
        let off = (s.offset + (addr - s.addr)) as usize;
        &self.bytes[off..off + len as usize]
    }

    /// Up to `len` bytes of the executable section holding `addr`
    /// (empty outside every one).
    fn code_at(&self, addr: u64, len: u64) -> &[u8] {
        self.sections
            .iter()
            .find(|s| s.exec && s.addr <= addr && addr < s.addr + s.size)
            .map_or(&[], |s| {
                self.bytes_of(s, addr, len.min(s.addr + s.size - addr))
            })
    }

    /// Whether the instruction at `addr` carries a `rep`/`repne` prefix:
    /// valgrind counts one execution per iteration of such an instruction
    /// (VEX turns each iteration into its own jump back), the program
    /// executes it once.
    pub fn is_rep(&self, addr: u64) -> bool {
        self.code_at(addr, 4)
            .iter()
            .take_while(|b| {
                matches!(
                    b,
                    0x66 | 0x67 | 0x2e | 0x3e | 0x26 | 0x64 | 0x65 | 0x36 | 0xf2 | 0xf3
                )
            })
            .any(|&b| b == 0xf2 || b == 0xf3)
    }

    /// Whether the instruction at `addr` is a bit test of a register by a
    /// register (`bt`, `bts`, `btr`, `btc`: `0f a3/ab/b3/bb`, ModRM mod
    /// 3): VEX runs it by storing the register below the stack pointer and
    /// testing a byte of memory, so lackey logs a store and a load the
    /// program never makes (seen in sort: `bt %rax,%rdx` with ` S ...,8`
    /// ` L ...,1`).
    pub fn is_register_bit_test(&self, addr: u64) -> bool {
        let b = self.code_at(addr, 15);
        let prefixes = b
            .iter()
            .take_while(|&&c| matches!(c, 0x66 | 0x40..=0x4f))
            .count();
        matches!(
            b.get(prefixes..prefixes + 3),
            Some(&[0x0f, 0xa3 | 0xab | 0xb3 | 0xbb, modrm]) if modrm >= 0xc0
        )
    }

    /// Whether the instruction at `addr` is a `call` (`e8`, or `ff /2`),
    /// and whether it is an indirect call or jump (`ff /2`, `ff /4`).
    pub fn branch_at(&self, addr: u64) -> (bool, bool) {
        let Some(s) = self
            .sections
            .iter()
            .find(|s| s.exec && s.addr <= addr && addr < s.addr + s.size)
        else {
            return (false, false);
        };
        let b = self.bytes_of(s, addr, 8.min(s.addr + s.size - addr));
        // Legacy prefixes (bnd is f2), then REX.
        let mut i = 0;
        while b
            .get(i)
            .is_some_and(|x| matches!(x, 0x66 | 0x67 | 0x2e | 0x3e | 0xf2 | 0xf3))
        {
            i += 1;
        }
        if b.get(i).is_some_and(|x| x & 0xf0 == 0x40) {
            i += 1;
        }
        match (b.get(i), b.get(i + 1).map(|m| (m >> 3) & 7)) {
            (Some(0xe8), _) => (true, false),
            (Some(0xff), Some(2)) => (true, true),
            (Some(0xff), Some(4)) => (false, true),
            _ => (false, false),
        }
    }
}

/// Whether `bytes` are nothing but the padding compilers and linkers put
/// between functions: the multi-byte NOP forms (with any number of 0x66 and
/// a `cs` prefix), `xchg %ax,%ax`, `int3` and zero fill.
pub fn is_padding(bytes: &[u8]) -> bool {
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        if rest[0] == 0x90 || rest[0] == 0xcc || rest[0] == 0x00 {
            i += 1;
            continue;
        }
        // Prefixes of the long NOP: 0x66 (any number) then optional 0x2e.
        let mut j = 0;
        while j < rest.len() && rest[j] == 0x66 {
            j += 1;
        }
        if j < rest.len() && rest[j] == 0x2e {
            j += 1;
        }
        if j > 0 && j < rest.len() && rest[j] == 0x90 {
            i += j + 1; // xchg %ax,%ax and friends
            continue;
        }
        // 0f 1f /0 with a ModRM-encoded memory operand.
        if rest.len() < j + 3 || rest[j] != 0x0f || rest[j + 1] != 0x1f {
            return false;
        }
        let modrm = rest[j + 2];
        if (modrm >> 3) & 7 != 0 {
            return false;
        }
        let md = modrm >> 6;
        let rm = modrm & 7;
        let mut len = j + 3;
        if md != 3 && rm == 4 {
            len += 1; // SIB
        }
        len += match md {
            0 if rm == 5 => 4,
            1 => 1,
            2 => 4,
            _ => 0,
        };
        if rest.len() < len {
            return false;
        }
        i += len;
    }
    true
}

impl Elf {
    /// Addresses of signal-return stubs (`__restore_rt`: `mov $15,%rax;
    /// syscall`, i.e. rt_sigreturn), found by their bytes: a signal handler
    /// returns there, to no return address.
    pub fn sigreturn_stubs(&self) -> super::FastSet<u64> {
        const STUB: &[u8] = &[0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
        let mut out = super::FastSet::default();
        for s in self.sections.iter().filter(|s| s.exec && !s.nobits) {
            let b = self.bytes_of(s, s.addr, s.size);
            for (i, w) in b.windows(STUB.len()).enumerate() {
                if w == STUB {
                    out.insert(s.addr + i as u64);
                }
            }
        }
        out
    }
}
