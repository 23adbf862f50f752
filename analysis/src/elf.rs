//! ELF loading: the facts about one x86-64 ELF64 module that CFG recovery
//! needs, parsed once with goblin over a memory map and kept as owned data.
//!
//! Invariants:
//! - A `Module` is always ELF64, little-endian, `EM_X86_64`, of type
//!   `ET_EXEC` or `ET_DYN`; anything else is refused by [`Module::open`] with
//!   a typed one-line error before goblin sees the bytes.
//! - Every `Section` with `file_bytes` lies inside the file: its bytes are
//!   read with checked slicing only ([`Module::bytes_at`]), so malformed
//!   offsets give `None`, never a panic.
//! - Addresses are link-time virtual addresses (offsets from the load base
//!   for PIE and shared objects).

use std::path::{Path, PathBuf};

use goblin::elf::{header, program_header, section_header, sym, Elf};

use crate::error::{Error, Result};

/// What the loader makes of the file (`ET_EXEC`, PIE, or a shared object).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ElfKind {
    /// A position-dependent executable (`ET_EXEC`).
    Exec,
    /// A position-independent executable (`ET_DYN` with `PT_INTERP` or `DF_1_PIE`).
    Pie,
    /// A shared object.
    Shared,
}

impl ElfKind {
    /// The kind's name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            ElfKind::Exec => "exec",
            ElfKind::Pie => "pie",
            ElfKind::Shared => "shared",
        }
    }
}

/// One section header, reduced to what we use.
#[derive(Clone, Debug)]
pub struct Section {
    /// The section's name (`.text`).
    pub name: String,
    /// Link-time address of its first byte.
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// File offset of the bytes, when the section has bytes in the file
    /// (not `SHT_NOBITS`) and they lie inside it.
    pub file_offset: Option<u64>,
    /// Holds executable code (`SHF_EXECINSTR`).
    pub exec: bool,
    /// Occupies memory at run time (`SHF_ALLOC`).
    pub alloc: bool,
    /// Size of one entry, for sections that are tables (0 otherwise).
    pub entsize: u64,
}

impl Section {
    /// Link-time address just past the section's last byte.
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.size)
    }
    /// Whether link-time address `addr` lies in the section.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.addr && addr < self.end()
    }
}

/// Where a symbol came from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SymSource {
    /// `.symtab`.
    Symtab,
    /// `.dynsym`.
    Dynsym,
}

/// A defined function symbol (`STT_FUNC` or `STT_GNU_IFUNC`) in an
/// executable section.
#[derive(Clone, Debug)]
pub struct FuncSymbol {
    /// The symbol's name.
    pub name: String,
    /// Its link-time address.
    pub addr: u64,
    /// Its size in bytes (0 when the symbol does not say).
    pub size: u64,
    /// The symbol table it comes from.
    pub source: SymSource,
}

/// A dynamic relocation, with its symbol's name when it has one.
#[derive(Clone, Debug)]
pub struct Reloc {
    /// Link-time address of the location the relocation writes.
    pub offset: u64,
    /// The relocation type (`R_X86_64_*`).
    pub r_type: u32,
    /// The name of the relocation's symbol, if it has one.
    pub sym_name: Option<String>,
    /// The constant addend.
    pub addend: i64,
}

/// Relocation type: the symbol's address plus the addend, 8 bytes.
pub const R_X86_64_64: u32 = 1;
/// Relocation type: a GOT entry set to the symbol's address.
pub const R_X86_64_GLOB_DAT: u32 = 6;
/// Relocation type: a PLT GOT slot set to the symbol's address (lazily bound).
pub const R_X86_64_JUMP_SLOT: u32 = 7;
/// Relocation type: the load base plus the addend.
pub const R_X86_64_RELATIVE: u32 = 8;
/// Relocation type: the result of calling the ifunc resolver at load base plus the addend.
pub const R_X86_64_IRELATIVE: u32 = 37;

enum Data {
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// A loaded module.
pub struct Module {
    /// The file the module was loaded from.
    pub path: PathBuf,
    data: Data,
    /// How the loader maps it.
    pub kind: ElfKind,
    /// An executable without a dynamic loader (no `PT_INTERP`).
    pub is_static: bool,
    /// Without a `.symtab` section.
    pub stripped: bool,
    /// Link-time address of the ELF entry point.
    pub entry: u64,
    /// Every section header.
    pub sections: Vec<Section>,
    /// The defined function symbols of executable sections.
    pub func_symbols: Vec<FuncSymbol>,
    /// `.rela.plt` in order (the PLT's `push n` indexes it).
    pub plt_relocs: Vec<Reloc>,
    /// `.rela.dyn` (GLOB_DAT, RELATIVE, 64, ...).
    pub dyn_relocs: Vec<Reloc>,
    /// Function pointers of `.init_array`, `.fini_array`, `.preinit_array`
    /// (after applying RELATIVE relocations), and `DT_INIT`/`DT_FINI`.
    pub init_fini: Vec<u64>,
    /// Imported functions whose address in the whole process is this
    /// module's PLT stub (undefined `.dynsym` functions with a value: a
    /// non-PIE executable taking an import's address). ld.so binds other
    /// modules' address references to the stub, so they call it: libc's
    /// own `free` and `malloc` calls go through such references.
    pub canonical_plt: Vec<String>,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("path", &self.path)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

const EM_NAMES: &[(u16, &str)] = &[
    (3, "i386"),
    (8, "MIPS"),
    (20, "PowerPC"),
    (21, "PowerPC64"),
    (22, "s390"),
    (40, "ARM"),
    (183, "AArch64"),
    (243, "RISC-V"),
];

/// Checks the identification and header fields by hand, so that foreign
/// files get a precise message and goblin only ever sees ELF64 x86-64.
fn check_header(path: &Path, bytes: &[u8]) -> Result<u16> {
    let unsupported = |what: String| Error::Unsupported {
        path: path.to_owned(),
        what,
    };
    if bytes.get(..4) != Some(&b"\x7fELF"[..]) {
        return Err(Error::NotElf {
            path: path.to_owned(),
        });
    }
    match bytes.get(4) {
        Some(2) => {}
        Some(1) => {
            return Err(unsupported(
                "32-bit ELF (only ELF64 x86-64 is supported)".into(),
            ))
        }
        _ => {
            return Err(Error::Malformed {
                path: path.to_owned(),
                what: "bad or missing ELF class byte".into(),
            })
        }
    }
    if bytes.get(5) != Some(&1) {
        return Err(unsupported(
            "big-endian ELF (only little-endian x86-64 is supported)".into(),
        ));
    }
    if bytes.len() < 64 {
        return Err(Error::Malformed {
            path: path.to_owned(),
            what: format!(
                "truncated: {} bytes, the ELF64 header alone is 64",
                bytes.len()
            ),
        });
    }
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
    let e_type = u16_at(16);
    let machine = u16_at(18);
    if machine != header::EM_X86_64 {
        let name = EM_NAMES
            .iter()
            .find(|(m, _)| *m == machine)
            .map_or("unknown", |(_, n)| n);
        return Err(unsupported(format!(
            "machine {machine} ({name}), only x86-64 is supported"
        )));
    }
    match e_type {
        header::ET_EXEC | header::ET_DYN => Ok(e_type),
        header::ET_REL => Err(unsupported(
            "relocatable object file (link it first)".into(),
        )),
        header::ET_CORE => Err(unsupported("core dump".into())),
        t => Err(unsupported(format!("ELF type {t}"))),
    }
}

impl Module {
    /// Opens, maps and parses `path`.
    pub fn open(path: &Path) -> Result<Module> {
        let io = |source| Error::Io {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if meta.is_dir() {
            return Err(io(std::io::Error::other("is a directory")));
        }
        if meta.len() == 0 {
            return Err(Error::NotElf {
                path: path.to_owned(),
            });
        }
        // SAFETY: the map is read-only and private to this process; like every
        // tool that maps its input (objdump, ripgrep) we accept that a file
        // truncated by another process under us may fault.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::from_data(path.to_owned(), Data::Map(map))
    }

    /// Parses an in-memory image (tests, and files read another way).
    pub fn from_bytes(path: PathBuf, bytes: Vec<u8>) -> Result<Module> {
        Self::from_data(path, Data::Owned(bytes))
    }

    fn from_data(path: PathBuf, data: Data) -> Result<Module> {
        let bytes: &[u8] = match &data {
            Data::Map(m) => m,
            Data::Owned(v) => v,
        };
        let e_type = check_header(&path, bytes)?;
        let malformed = |what: String| Error::Malformed {
            path: path.clone(),
            what,
        };
        // goblin returns errors for most bad inputs, but it is not written to
        // the never-panic standard on every path: a panic inside it becomes
        // the same typed error.
        let elf = std::panic::catch_unwind(|| Elf::parse(bytes))
            .map_err(|_| malformed("goblin failed on the headers".into()))?
            .map_err(|e| malformed(e.to_string()))?;
        let parsed = std::panic::catch_unwind(|| Parsed::new(&elf, bytes, e_type))
            .map_err(|_| malformed("inconsistent headers".into()))?
            .map_err(malformed)?;
        Ok(Module {
            path,
            data,
            kind: parsed.kind,
            is_static: parsed.is_static,
            stripped: parsed.stripped,
            entry: parsed.entry,
            sections: parsed.sections,
            func_symbols: parsed.func_symbols,
            plt_relocs: parsed.plt_relocs,
            dyn_relocs: parsed.dyn_relocs,
            init_fini: parsed.init_fini,
            canonical_plt: parsed.canonical_plt,
        })
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        match &self.data {
            Data::Map(m) => m,
            Data::Owned(v) => v,
        }
    }

    /// The file bytes of `section`, if it has them.
    pub fn section_bytes(&self, section: &Section) -> Option<&[u8]> {
        let off = usize::try_from(section.file_offset?).ok()?;
        let len = usize::try_from(section.size).ok()?;
        self.bytes().get(off..off.checked_add(len)?)
    }

    /// `len` bytes at virtual address `addr`, if one allocated section with
    /// file bytes holds all of them.
    pub fn bytes_at(&self, addr: u64, len: u64) -> Option<&[u8]> {
        let s = self
            .sections
            .iter()
            .find(|s| s.alloc && s.file_offset.is_some() && s.contains(addr))?;
        if addr.checked_add(len)? > s.end() {
            return None;
        }
        let bytes = self.section_bytes(s)?;
        let start = usize::try_from(addr - s.addr).ok()?;
        bytes.get(start..start.checked_add(usize::try_from(len).ok()?)?)
    }

    /// The section called `name`, if there is one.
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// The executable sections, in address order.
    pub fn exec_sections(&self) -> impl Iterator<Item = &Section> {
        self.sections
            .iter()
            .filter(|s| s.exec && s.alloc && s.size > 0)
    }

    /// Whether `addr` lies in an executable section.
    pub fn is_exec(&self, addr: u64) -> bool {
        self.exec_sections().any(|s| s.contains(addr))
    }

    /// The descriptor of the `NT_GNU_BUILD_ID` note (empty when there is none).
    pub fn build_id(&self) -> Vec<u8> {
        let Some(b) = self
            .section(".note.gnu.build-id")
            .and_then(|s| self.section_bytes(s))
        else {
            return Vec::new();
        };
        let u32_at = |o: usize| {
            b.get(o..o + 4)
                .map(|x| u32::from_le_bytes(x.try_into().unwrap_or([0; 4])) as usize)
        };
        match (u32_at(0), u32_at(4)) {
            (Some(namesz), Some(descsz)) => {
                let off = 12 + namesz.div_ceil(4) * 4;
                b.get(off..off + descsz)
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default()
            }
            _ => Vec::new(),
        }
    }
}

/// Everything taken out of goblin's borrowed view.
struct Parsed {
    kind: ElfKind,
    is_static: bool,
    stripped: bool,
    entry: u64,
    sections: Vec<Section>,
    func_symbols: Vec<FuncSymbol>,
    plt_relocs: Vec<Reloc>,
    dyn_relocs: Vec<Reloc>,
    init_fini: Vec<u64>,
    canonical_plt: Vec<String>,
}

impl Parsed {
    fn new(elf: &Elf, bytes: &[u8], e_type: u16) -> std::result::Result<Parsed, String> {
        let has_interp = elf
            .program_headers
            .iter()
            .any(|p| p.p_type == program_header::PT_INTERP);
        let pie_flag = elf
            .dynamic
            .as_ref()
            .is_some_and(|d| d.info.flags_1 & goblin::elf::dynamic::DF_1_PIE != 0);
        // A shared object may be runnable too (libc.so.6 has PT_INTERP and
        // prints its version): its DT_SONAME, which an executable lacks,
        // makes it a library.
        let runnable_library = elf.soname.is_some() && !pie_flag;
        let kind = match e_type {
            header::ET_EXEC => ElfKind::Exec,
            _ if (has_interp && !runnable_library) || pie_flag => ElfKind::Pie,
            _ => ElfKind::Shared,
        };
        let is_static = kind != ElfKind::Shared && !has_interp;

        let mut sections = Vec::with_capacity(elf.section_headers.len());
        for sh in &elf.section_headers {
            let name = elf.shdr_strtab.get_at(sh.sh_name).unwrap_or("").to_owned();
            let in_file = sh
                .sh_offset
                .checked_add(sh.sh_size)
                .is_some_and(|end| end <= bytes.len() as u64);
            let nobits = sh.sh_type == section_header::SHT_NOBITS;
            if !nobits && !in_file && sh.sh_type != section_header::SHT_NULL {
                return Err(format!(
                    "section {name} (offset {:#x}, size {:#x}) runs past the end of the file ({:#x} bytes)",
                    sh.sh_offset,
                    sh.sh_size,
                    bytes.len()
                ));
            }
            sections.push(Section {
                name,
                addr: sh.sh_addr,
                size: sh.sh_size,
                file_offset: (!nobits && in_file).then_some(sh.sh_offset),
                exec: sh.sh_flags & u64::from(section_header::SHF_EXECINSTR) != 0,
                alloc: sh.sh_flags & u64::from(section_header::SHF_ALLOC) != 0,
                entsize: sh.sh_entsize,
            });
        }
        let stripped = !sections.iter().any(|s| s.name == ".symtab");
        let is_exec_addr = |a: u64| sections.iter().any(|s| s.exec && s.alloc && s.contains(a));

        let mut func_symbols = Vec::new();
        let tables = [
            (&elf.syms, &elf.strtab, SymSource::Symtab),
            (&elf.dynsyms, &elf.dynstrtab, SymSource::Dynsym),
        ];
        for (table, strtab, source) in tables {
            for s in table.iter() {
                let t = s.st_type();
                if (t != sym::STT_FUNC && t != sym::STT_GNU_IFUNC)
                    || s.st_shndx == 0
                    || !is_exec_addr(s.st_value)
                {
                    continue;
                }
                func_symbols.push(FuncSymbol {
                    name: strtab.get_at(s.st_name).unwrap_or("").to_owned(),
                    addr: s.st_value,
                    size: s.st_size,
                    source,
                });
            }
        }

        let sym_name = |idx: usize| -> Option<String> {
            let s = elf.dynsyms.get(idx)?;
            let n = elf.dynstrtab.get_at(s.st_name)?;
            (!n.is_empty()).then(|| n.to_owned())
        };
        let convert = |r: goblin::elf::Reloc| Reloc {
            offset: r.r_offset,
            r_type: r.r_type,
            sym_name: if r.r_sym == 0 {
                None
            } else {
                sym_name(r.r_sym)
            },
            addend: r.r_addend.unwrap_or(0),
        };
        let mut plt_relocs: Vec<Reloc> = elf.pltrelocs.iter().map(convert).collect();
        let mut dyn_relocs: Vec<Reloc> = elf.dynrelas.iter().map(convert).collect();
        if elf.dynamic.is_none() {
            // Static executables keep their IRELATIVE relocations in a
            // `.rela.plt` section that no dynamic tag points at.
            for (idx, rs) in &elf.shdr_relocs {
                let name = sections.get(*idx).map_or("", |s| s.name.as_str());
                let target = if name == ".rela.plt" {
                    &mut plt_relocs
                } else {
                    &mut dyn_relocs
                };
                target.extend(rs.iter().map(|r| Reloc {
                    offset: r.r_offset,
                    r_type: r.r_type,
                    sym_name: None,
                    addend: r.r_addend.unwrap_or(0),
                }));
            }
        }

        let mut init_fini = Vec::new();
        let relative: std::collections::HashMap<u64, u64> = dyn_relocs
            .iter()
            .filter(|r| r.r_type == R_X86_64_RELATIVE)
            .map(|r| (r.offset, r.addend as u64))
            .collect();
        for s in &sections {
            let is_array = matches!(
                s.name.as_str(),
                ".init_array" | ".fini_array" | ".preinit_array"
            );
            if !is_array {
                continue;
            }
            let Some(off) = s.file_offset else { continue };
            let data = usize::try_from(off)
                .ok()
                .and_then(|o| bytes.get(o..o.checked_add(usize::try_from(s.size).ok()?)?));
            let Some(data) = data else { continue };
            for (i, chunk) in data.chunks_exact(8).enumerate() {
                let slot = s.addr + 8 * i as u64;
                let raw = u64::from_le_bytes(chunk.try_into().expect("chunks_exact(8)"));
                let value = relative.get(&slot).copied().unwrap_or(raw);
                // -1 and 0 are the legacy list terminators, not functions.
                if value != 0 && value != u64::MAX && is_exec_addr(value) {
                    init_fini.push(value);
                }
            }
        }
        // `.init`/`.fini` run before `main`/at exit; static executables
        // have no DT_INIT/DT_FINI to point at them.
        for s in &sections {
            if (s.name == ".init" || s.name == ".fini") && s.exec && s.size > 0 {
                init_fini.push(s.addr);
            }
        }
        if let Some(d) = &elf.dynamic {
            for a in [d.info.init, d.info.fini] {
                if a != 0 && is_exec_addr(a) {
                    init_fini.push(a);
                }
            }
        }

        let canonical_plt = elf
            .dynsyms
            .iter()
            .filter(|s| s.st_shndx == 0 && s.st_value != 0 && s.st_type() == sym::STT_FUNC)
            .map(|s| elf.dynstrtab.get_at(s.st_name).unwrap_or("").to_owned())
            .collect();
        Ok(Parsed {
            kind,
            is_static,
            stripped,
            entry: elf.entry,
            sections,
            func_symbols,
            plt_relocs,
            dyn_relocs,
            init_fini,
            canonical_plt,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_of(bytes: Vec<u8>) -> String {
        Module::from_bytes("t".into(), bytes)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn refuses_foreign_files() {
        assert_eq!(err_of(b"hello world\n".to_vec()), "t: not an ELF file");
        assert_eq!(err_of(Vec::new()), "t: not an ELF file");
        let mut elf32 = b"\x7fELF\x01\x01\x01".to_vec();
        elf32.resize(52, 0);
        assert!(err_of(elf32).contains("32-bit"));
        let mut arm = b"\x7fELF\x02\x01\x01".to_vec();
        arm.resize(64, 0);
        arm[16] = 2;
        arm[18] = 183;
        assert!(err_of(arm).contains("AArch64"));
        assert!(err_of(b"\x7fELF\x02\x01\x01\0".to_vec()).contains("truncated"));
    }

    #[test]
    fn refuses_truncated_gzip() {
        let Ok(bytes) = std::fs::read("/usr/bin/gzip") else {
            panic!("/usr/bin/gzip is part of the test machine's base system");
        };
        for len in [64, 1000, bytes.len() / 2] {
            let e = err_of(bytes[..len].to_vec());
            assert!(e.contains("malformed ELF"), "{len}: {e}");
        }
    }

    #[test]
    fn loads_gzip() {
        let m = Module::open(Path::new("/usr/bin/gzip")).unwrap();
        assert_eq!(m.kind, ElfKind::Pie);
        assert!(!m.is_static);
        assert!(m.is_exec(m.entry));
        assert!(m.section(".text").is_some());
        assert!(!m.plt_relocs.is_empty());
        assert!(m.init_fini.iter().all(|&a| m.is_exec(a)));
    }
}
