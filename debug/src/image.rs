//! The process image gdb sees: the modules the trace says were loaded (path
//! and load base), their read-only load segments read from the ELF files as
//! memory, and what gdb needs to place each module's symbols where it was
//! loaded: the executable's path (`qXfer:exec-file`), an auxiliary vector
//! with `AT_ENTRY`/`AT_PHDR` (gdb relocates a PIE executable from it) and
//! the shared libraries as an SVR4 list (`qXfer:libraries-svr4`).
//!
//! Invariants: only bytes of non-writable segments are served (code, rodata:
//! the same at every moment of the run); anything else reads as an error,
//! never as a made-up value. A module whose file is missing or is not an
//! ELF file keeps its place in the lists but has no memory.

use aetrace_format::{module_flags, ModuleId, Trace};
use goblin::elf::program_header::{PF_W, PT_DYNAMIC, PT_GNU_EH_FRAME, PT_LOAD, PT_PHDR};
use goblin::elf::sym::{STT_FUNC, STT_GNU_IFUNC};
use std::collections::HashMap;

/// One module of the image.
#[derive(Clone, Debug)]
pub struct Module {
    /// The path the loader opened.
    pub path: String,
    /// Where its vaddr 0 was loaded.
    pub load_base: u64,
    /// Whether it is the executable.
    pub main: bool,
    /// Run-time address of its dynamic section (0: none).
    dynamic: u64,
    /// Run-time entry point and program headers (the executable's auxv).
    entry: u64,
    phdr: u64,
    phnum: u64,
    /// Read-only segments: run-time start and file bytes.
    segments: Vec<(u64, Vec<u8>)>,
    /// Run-time address of its `.eh_frame_hdr` (`PT_GNU_EH_FRAME`; 0:
    /// none).
    pub eh_frame_hdr: u64,
    /// Its `.got` and `.got.plt` sections: run-time start and end.
    gots: Vec<(u64, u64)>,
    /// The functions it exports (dynamic symbols): run-time address ->
    /// names (one function has aliases: libc's `printf` is `_IO_printf`).
    exports: HashMap<u64, Vec<String>>,
}

/// The modules of one process.
#[derive(Clone, Debug, Default)]
pub struct Image {
    /// Executable first.
    pub modules: Vec<Module>,
}

impl Image {
    /// The trace's modules `ids` (a stream's process image, as the
    /// regenerator chose it: an exec'd image has modules of its own).
    pub fn of_modules<B: AsRef<[u8]>>(trace: &Trace<B>, ids: &[ModuleId]) -> Image {
        let mut modules: Vec<Module> = ids
            .iter()
            .filter_map(|&id| trace.module(id))
            .map(|m| {
                Module::load(
                    String::from_utf8_lossy(&m.path).into_owned(),
                    m.load_base,
                    m.flags & module_flags::MAIN != 0,
                )
            })
            .collect();
        modules.sort_by_key(|m| !m.main);
        Image { modules }
    }

    /// The executable, if the trace names one.
    pub fn main(&self) -> Option<&Module> {
        self.modules.iter().find(|m| m.main)
    }

    /// The module whose load segments hold `addr`, by load base.
    pub fn module_at(&self, addr: u64) -> Option<&Module> {
        self.modules
            .iter()
            .filter(|m| m.load_base <= addr)
            .max_by_key(|m| m.load_base)
    }

    /// The names the function at `addr` is exported as (dynamic symbols
    /// of its module).
    pub fn exported(&self, addr: u64) -> &[String] {
        self.module_at(addr)
            .and_then(|m| m.exports.get(&addr))
            .map_or(&[], Vec::as_slice)
    }

    /// Reads `buf.len()` bytes at `addr`: how many leading bytes are
    /// served (0 when `addr` is in no read-only segment).
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> usize {
        let from = self.bytes_from(addr);
        let n = from.len().min(buf.len());
        buf[..n].copy_from_slice(&from[..n]);
        n
    }

    /// Whether `addr` is in a module's GOT (`.got`, `.got.plt`): a slot
    /// the dynamic linker fills with an import's address.
    pub fn in_got(&self, addr: u64) -> bool {
        (self.module_at(addr).into_iter())
            .flat_map(|m| &m.gots)
            .any(|&(start, end)| (start..end).contains(&addr))
    }

    /// The bytes of the read-only segment holding `addr`, from `addr` to
    /// the segment's end (empty when `addr` is in none).
    pub fn bytes_from(&self, addr: u64) -> &[u8] {
        for m in &self.modules {
            for (start, bytes) in &m.segments {
                if addr >= *start && addr - start < bytes.len() as u64 {
                    return &bytes[(addr - start) as usize..];
                }
            }
        }
        &[]
    }

    /// The auxiliary vector gdb reads to relocate the executable.
    pub fn auxv(&self) -> Vec<u8> {
        const AT_NULL: u64 = 0;
        const AT_PHDR: u64 = 3;
        const AT_PHENT: u64 = 4;
        const AT_PHNUM: u64 = 5;
        const AT_PAGESZ: u64 = 6;
        const AT_BASE: u64 = 7;
        const AT_ENTRY: u64 = 9;
        // The dynamic linker's base is not recorded (it is never traced).
        // Without AT_BASE gdb guesses it from the pc, taking the stop for
        // ld.so's entry, and lays ld.so's symbols over the executable's;
        // 0 keeps them at their link addresses, where nothing traced runs.
        let mut pairs = vec![(AT_PAGESZ, 4096), (AT_BASE, 0)];
        if let Some(m) = self.main().filter(|m| m.entry != 0) {
            pairs.extend([
                (AT_PHDR, m.phdr),
                (AT_PHENT, 56),
                (AT_PHNUM, m.phnum),
                (AT_ENTRY, m.entry),
            ]);
        }
        pairs.push((AT_NULL, 0));
        pairs
            .iter()
            .flat_map(|&(k, v)| k.to_le_bytes().into_iter().chain(v.to_le_bytes()))
            .collect()
    }

    /// The shared libraries as gdb's `library-list-svr4` document.
    pub fn libraries_svr4(&self) -> String {
        let mut s = String::from("<library-list-svr4 version=\"1.0\">");
        for (i, m) in self.modules.iter().filter(|m| !m.main).enumerate() {
            s.push_str(&format!(
                "<library name=\"{}\" lm=\"{:#x}\" l_addr=\"{:#x}\" l_ld=\"{:#x}\" lmid=\"0x0\"/>",
                xml_escape(&m.path),
                // A made-up link-map address: gdb only tells entries apart by
                // it. `lmid` (the default namespace) is required by gdb 13's
                // DTD and ignored by older gdbs.
                0x1000 * (i as u64 + 1),
                m.load_base,
                m.dynamic
            ));
        }
        s.push_str("</library-list-svr4>");
        s
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl Module {
    /// The module at `path` loaded at `load_base`, read from its file.
    fn load(path: String, load_base: u64, main: bool) -> Module {
        let mut m = Module {
            path,
            load_base,
            main,
            dynamic: 0,
            entry: 0,
            phdr: 0,
            phnum: 0,
            segments: Vec::new(),
            eh_frame_hdr: 0,
            gots: Vec::new(),
            exports: HashMap::new(),
        };
        if let Ok(bytes) = std::fs::read(&m.path) {
            m.read_elf(&bytes);
        }
        m
    }

    fn read_elf(&mut self, bytes: &[u8]) {
        let Ok(elf) = goblin::elf::Elf::parse(bytes) else {
            return;
        };
        let base = self.load_base;
        self.entry = base + elf.header.e_entry;
        self.phnum = elf.program_headers.len() as u64;
        for ph in &elf.program_headers {
            match ph.p_type {
                PT_DYNAMIC => self.dynamic = base + ph.p_vaddr,
                PT_PHDR => self.phdr = base + ph.p_vaddr,
                PT_GNU_EH_FRAME => self.eh_frame_hdr = base + ph.p_vaddr,
                PT_LOAD if ph.p_flags & PF_W == 0 => {
                    let file = bytes.get(ph.file_range()).unwrap_or_default();
                    self.segments.push((base + ph.p_vaddr, file.to_vec()));
                    // The headers are in the first segment when no PT_PHDR says.
                    if ph.p_offset == 0 && self.phdr == 0 {
                        self.phdr = base + ph.p_vaddr + elf.header.e_phoff;
                    }
                }
                _ => {}
            }
        }
        for sh in &elf.section_headers {
            if matches!(
                elf.shdr_strtab.get_at(sh.sh_name),
                Some(".got" | ".got.plt")
            ) {
                let start = base + sh.sh_addr;
                self.gots.push((start, start + sh.sh_size));
            }
        }
        let functions = (elf.dynsyms.iter())
            .filter(|s| s.st_shndx != 0 && matches!(s.st_type(), STT_FUNC | STT_GNU_IFUNC));
        for sym in functions {
            if let Some(name) = elf.dynstrtab.get_at(sym.st_name) {
                let names = self.exports.entry(base + sym.st_value).or_default();
                names.push(name.to_owned());
            }
        }
    }
}
