//! The ELF writer of the rewriter: given the bytes of an original x86-64 ELF
//! (executable, PIE, static, static-pie or shared object) and the
//! [`Additions`] the rewriter wants (new segments, byte patches, a function to
//! run first, a new entry point), produce a new ELF that the kernel and
//! `ld.so` load correctly and that `readelf`, `objdump` and `gdb` still read.
//! Design decision 2 of `DESIGN.md` (relocate procedures, keep the old code);
//! the tricks are the ones of static binary rewriters (e9patch, BOLT).
//!
//! The original bytes are kept at their offsets; everything new is appended:
//!
//! ```text
//! [original file, edited in place] [zero padding] [program headers]
//! [caller's segments, each at offset = vaddr mod 4096] [our RW segment]
//! ```
//!
//! - **Program headers.** The old table sits right after the ELF header with
//!   no room to grow, so a new one goes at file offset `F`, inside a new
//!   `PT_LOAD` (R) at `vaddr = base + F` where `base = first_load.p_vaddr -
//!   first_load.p_offset`. Kernels before 5.18 report `AT_PHDR = load_bias +
//!   base + e_phoff`; newer ones translate `e_phoff` through the `PT_LOAD`
//!   that contains it: both agree with this placement. `F` is the 8-aligned
//!   end of the file, moved up (zero padding) until `base + F` lies above
//!   every original segment (a `.bss` can make this cost a few hundred kB).
//!   When that would need more than [`PAD_LIMIT`] of zeros, the table goes
//!   at the end of the file and above the image at a page-congruent vaddr:
//!   only kernels >= 5.18 load that. A page ([`MAX_PHDR_TABLE`], the kernel's
//!   own limit on the table) is reserved for it; [`first_free_vaddr`] is the
//!   first page above that reservation plus a one-page gap. `PT_PHDR` is
//!   updated (`ld.so` computes the main program's load bias from it). All
//!   `PT_LOAD`s are emitted sorted by vaddr (the kernel sizes the mapping from
//!   the first and last ones, `ld.so` requires ascending order), and the
//!   entries before the first original `PT_LOAD` (`PT_PHDR`, `PT_INTERP`)
//!   keep their place.
//! - **The heap's room.** With [`Additions::heap_gap`] (an executable's,
//!   [`HEAP_GAP`]), the table and every new segment go that far above the
//!   image (the table at the end of the file, the kernels-≥5.18 placement),
//!   so the heap can grow from the original image's end as natively once
//!   the runtime moves the break there (`docs/runtime.md` section 5).
//! - **New segments** get `p_offset ≡ p_vaddr (mod 4096)` and `p_align =
//!   4096`: the congruence is only guaranteed modulo the page, and the loaders
//!   check nothing more. `mem_size > bytes.len()` is zero-filled by the loader.
//! - **`preinit`** (dynamic executables only: `ld.so` runs `DT_PREINIT_ARRAY`
//!   for the main program alone, and static programs run their linker-made
//!   `__preinit_array_start` list, not the dynamic tag). A new array goes in
//!   our own RW segment after the caller's: our function first, then the old
//!   entries if there was an array. `ld.so` calls `l_addr + DT_PREINIT_ARRAY`
//!   entries as absolute pointers, so in a PIE every entry needs an
//!   `R_X86_64_RELATIVE` relocation: `.rela.dyn` is copied into our segment
//!   with those relocations FIRST (so `DT_RELACOUNT`, the length of the
//!   leading RELATIVE run, just grows), and `DT_RELA`/`DT_RELASZ` point at
//!   the copy. The addends of old entries come from their RELA RELATIVE
//!   relocation or, in a `DT_RELR` binary, from the word itself (RELR is left
//!   alone: `ld.so` applies RELR and RELA both). New dynamic tags use the
//!   spare `DT_NULL` slots GNU ld leaves (`--spare-dynamic-tags`, 5 by
//!   default), keeping one terminator; without room `.dynamic` moves to our
//!   segment, `PT_DYNAMIC` and the `SHT_DYNAMIC` section header follow it
//!   (`gdb` finds `DT_DEBUG` through the section).
//! - **`init`** (shared objects): the same construction for
//!   `DT_INIT_ARRAY`, our function first, then the object's constructors.
//! - **Detached additions** ([`Additions::detached`], a `--libs` library
//!   loaded at start-up; issue 23): the new segments are written to the
//!   file as above, [`DETACH_GAP`] above the image, but in no `PT_LOAD`:
//!   the program header table stays the original's, so `ld.so` reserves
//!   and places the original span and every later mapping lands where it
//!   does natively. Where the table would go, a descriptor lists the
//!   segments (`aetrace_runtime::blob::detach`), and a `DT_ADDITIONS` tag
//!   in a spare `DT_NULL` slot gives its file offset; the executable's
//!   runtime `init` maps them before any library code runs. Nothing
//!   `ld.so` reads may be among them: no init, preinit or entry, no
//!   relocated words, no moved `.dynamic`; `PT_GNU_EH_FRAME` keeps the
//!   original's table (`_dl_find_object` knows only the span), and the
//!   descriptor gives the new `.eh_frame`, which the executable's runtime
//!   registers with libgcc (`__register_frame_info`).
//! - **CET.** The relocated code is not IBT/SHSTK clean, so the
//!   `GNU_PROPERTY_X86_FEATURE_1_IBT` and `_SHSTK` bits of every
//!   `NT_GNU_PROPERTY_TYPE_0` note are cleared (kernel and `ld.so` read
//!   `PT_GNU_PROPERTY`, `readelf -n` the `PT_NOTE`: same bytes).
//! - **Section headers.** Each new segment gets sections (`.aetrace.phdr`,
//!   `.aetrace.text` / `.rodata` / `.data` / `.bss` by its flags,
//!   `.aetrace.preinit`) so that `objdump -d`, gdb and perf see the added
//!   bytes; `.dynamic`'s entry follows a move. The table, with a copy of
//!   `.shstrtab` holding the new names, is appended at the end of the file
//!   (`e_shoff`, `e_shnum` updated). A file with no table, or with extended
//!   section numbering, keeps its table in place and gets no new sections.
//! - **Checks.** `entry` and `preinit` must lie in the file-backed part of an
//!   executable segment; patches inside one original `PT_LOAD`'s file bytes,
//!   not overlapping; new segments page-aligned, ascending, above
//!   [`first_free_vaddr`].
//!
//! Not supported: running `strip`/`objcopy` on the output. binutils 2.40
//! moves the table's `PT_LOAD` to an offset no longer congruent to its vaddr
//! ("section .aetrace.phdr lma adjusted") and the PIE it writes crashes at
//! start-up; strip the original before rewriting it.
//!
//! Cost (measured on Debian 12's `/usr/bin/gzip`, 98,136 bytes with an
//! 800 kB `.bss`): with a one-byte segment and a preinit the output is
//! 928,176 bytes, almost all of it the zero padding that puts the program
//! headers at `base + offset` for old kernels.
//!
//! Invariants (checked before writing, debug-asserted on the result): every
//! `PT_LOAD` of the output satisfies `p_offset ≡ p_vaddr (mod 4096)` and
//! lies inside the file; the `PT_LOAD`s are in ascending vaddr order; no new
//! one shares a page of address space with another; the program
//! header table is inside a `PT_LOAD` at `base + e_phoff` (or the documented
//! fallback); nothing panics on malformed input: every read is checked and
//! returns [`Error`].

use std::path::Path;

use goblin::container::{Container, Ctx};
use goblin::elf::dynamic::{
    DF_1_PIE, DT_FLAGS_1, DT_INIT_ARRAY, DT_INIT_ARRAYSZ, DT_NEEDED, DT_PREINIT_ARRAY,
    DT_PREINIT_ARRAYSZ, DT_RPATH, DT_RUNPATH, DT_STRSZ, DT_STRTAB,
};
use goblin::elf::header::{Header, EM_X86_64, ET_DYN, ET_EXEC};
use goblin::elf::program_header::{
    ProgramHeader, PF_R, PF_W, PF_X, PT_DYNAMIC, PT_GNU_EH_FRAME, PT_GNU_PROPERTY, PT_INTERP,
    PT_LOAD, PT_NOTE, PT_PHDR,
};
use goblin::elf::section_header::{
    SectionHeader, SHF_ALLOC, SHF_EXECINSTR, SHF_WRITE, SHN_LORESERVE, SHT_DYNAMIC, SHT_INIT_ARRAY,
    SHT_NOBITS, SHT_PREINIT_ARRAY, SHT_PROGBITS, SHT_RELA, SHT_STRTAB,
};
use goblin::elf::Elf;

use crate::error::{Error, Refusal, Result, SegmentFault};
use aetrace_analysis::elf::R_X86_64_RELATIVE;
use aetrace_runtime::blob::detach;

/// A new loadable segment to append. `flags` are the segment permission bits
/// (PF_X=1, PF_W=2, PF_R=4).
#[derive(Clone, Debug)]
pub struct NewSegment {
    /// Link-time virtual address, page-aligned.
    pub vaddr: u64,
    /// Permission bits (PF_X=1, PF_W=2, PF_R=4).
    pub flags: u32,
    /// The file-backed contents.
    pub bytes: Vec<u8>,
    /// Size in memory (at least `bytes.len()`; the rest is zero-filled).
    pub mem_size: u64,
}

/// Overwrite bytes of the original image at a link-time vaddr (springboards:
/// 5-byte jmps at original procedure entries). Must lie inside a `PT_LOAD`'s
/// file-backed part.
#[derive(Clone, Debug)]
pub struct Patch {
    /// Link-time virtual address of the first byte to overwrite.
    pub vaddr: u64,
    /// The new bytes.
    pub bytes: Vec<u8>,
}

/// What to add to the original ELF.
#[derive(Clone, Debug, Default)]
pub struct Additions {
    /// Page-aligned vaddrs, ascending, at or above [`first_free_vaddr`].
    pub segments: Vec<NewSegment>,
    /// Overwrites of the original image (springboards), non-overlapping.
    pub patches: Vec<Patch>,
    /// Overwrites the executable's runtime makes at its init, after
    /// ld.so's early calls into this object ([`Additions::detached`]
    /// only): a table after the descriptor (`detach`), none overlapping
    /// another or one of `patches`.
    pub late_patches: Vec<Patch>,
    /// A function (link-time vaddr) to run before anything else of the
    /// program: the first entry of `DT_PREINIT_ARRAY`, called with argc,
    /// argv, envp. Only for dynamically linked executables; static ones
    /// must use `entry`.
    pub preinit: Option<u64>,
    /// A function (link-time vaddr) a shared object runs before its own
    /// constructors: the first entry of a new `DT_INIT_ARRAY` (same calling
    /// convention; `ld.so` runs the object's `DT_INIT` before it). Only for
    /// shared objects, and not together with `preinit`.
    pub init: Option<u64>,
    /// Replaces `e_entry`.
    pub entry: Option<u64>,
    /// `(vaddr, size)` of a new `.eh_frame_hdr` inside one of `segments`
    /// (`rewrite::unwind`): `PT_GNU_EH_FRAME` (added when there is none)
    /// and the original `.eh_frame_hdr` section header are repointed at it.
    pub eh_frame_hdr: Option<(u64, u64)>,
    /// `(vaddr, size)` of a new, complete `.eh_frame` inside one of
    /// `segments`: the original `.eh_frame` section header is repointed at
    /// it (readelf and gdb read FDEs through the section).
    pub eh_frame: Option<(u64, u64)>,
    /// Bytes of address space left free above the original image, below
    /// everything new (the program header table first): the heap of an
    /// executable ([`HEAP_GAP`]), a detached shared object's
    /// ([`DETACH_GAP`]); else 0. The same value [`first_free_vaddr`] was
    /// given.
    pub heap_gap: u64,
    /// The segments are in no `PT_LOAD` (module documentation, "Detached
    /// additions"): a shared object with a spare `DT_NULL` slot
    /// ([`can_detach`]), no init or preinit, every segment file-backed.
    pub detached: bool,
    /// A directory the loader searches first for this executable's
    /// libraries (`record --libs`: the rewritten copies), put before the
    /// native `DT_RUNPATH`, or else `DT_RPATH` (added when there is none);
    /// only with `preinit` ([`search_first`]).
    pub search_first: Option<SearchFirst>,
}

/// A directory put first in an executable's library search path, and the
/// DT_NEEDED names its copy names by their path in that directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SearchFirst {
    /// The directory.
    pub dir: Vec<u8>,
    /// Names the loader would otherwise find elsewhere first (the native
    /// `LD_LIBRARY_PATH`, searched before an executable's DT_RUNPATH):
    /// their DT_NEEDED entries name `dir/NAME`, which the loader opens
    /// without a search.
    pub by_path: Vec<Vec<u8>>,
    /// The DT_NEEDED name at which the native loader first reads
    /// `/etc/ld.so.cache` when the copy's loader would not (the library
    /// is now found in `dir`): a `DT_AUXILIARY` naming [`CACHE_PROBE`]
    /// goes before it ([`search_first`]).
    pub cache_probe_before: Option<Vec<u8>>,
}

/// The name a cache probe's `DT_AUXILIARY` asks the loader for: no search
/// path, cache or default directory holds it, so the loader searches them
/// all, mapping `/etc/ld.so.cache` on the way, and ignores the failure.
pub const CACHE_PROBE: &[u8] = b"aetrace-ld.so.cache-probe";

/// The x86-64 page size: loaders map at this granularity.
const PAGE: u64 = 4096;
const EHDR_SIZE: usize = 64;
const PHDR_SIZE: u64 = 56;
const SHDR_SIZE: u64 = 64;
const DYN_SIZE: u64 = 16;
const RELA_SIZE: u64 = 24;
/// The kernel's `load_elf_phdrs` refuses tables larger than a page.
pub const MAX_PHDR_TABLE: u64 = PAGE;
/// Above this much zero padding, the program header table gives up the
/// `vaddr = base + offset` placement that kernels before 5.18 need.
pub const PAD_LIMIT: u64 = 16 << 20;
/// The [`Additions::heap_gap`] of an executable: the kernel starts its
/// break after the highest `PT_LOAD`, and the runtime's `init` moves it
/// back to the original image's end (`docs/runtime.md` section 5), where
/// the heap then grows as natively, up to this much (then glibc's malloc
/// goes on with `mmap`). 1 GiB keeps every copy within a rel32 of the
/// image for images up to about 1 GiB.
pub const HEAP_GAP: u64 = 1 << 30;
/// The least [`Additions::heap_gap`] of a detached shared object: its
/// additions start at least this far above its image, in the room between
/// `mmap_base` and the stack that no unhinted `mmap` takes (at least 119
/// MiB with address randomisation off: 128 MiB less the stack's 8 MiB
/// limit and guard gap), for a library mapped less than this far below
/// `mmap_base`.
pub const DETACH_GAP: u64 = 32 << 20;
/// The libraries of one process are mapped next to each other, so their
/// additions, larger than their images, would overlap at one distance:
/// module tag *t* adds `(t - 1)` slots to [`DETACH_GAP`], and a library
/// whose image and additions together exceed a slot is not detached.
pub const DETACH_SLOT: u64 = 24 << 20;
/// The highest module tag detached: [`DETACH_GAP`] plus its slots stays
/// within the room above `mmap_base`.
pub const DETACH_TAGS: u32 = 3;
/// Spare `DT_NULL` slots left in a moved `.dynamic`, like GNU ld's default.
const SPARE_DYNAMIC: usize = 5;

const DT_NULL: u64 = 0;
/// A filtee the loader loads if it can and skips silently if not (not in
/// goblin's list).
const DT_AUXILIARY: u64 = 0x7fff_fffd;
const DT_PLTRELSZ: u64 = 2;
const DT_RELA: u64 = 7;
const DT_RELASZ: u64 = 8;
const DT_RELAENT: u64 = 9;
const DT_JMPREL: u64 = 23;
const DT_RELRSZ: u64 = 35;
const DT_RELR: u64 = 36;
const DT_RELACOUNT: u64 = 0x6fff_fff9;
const NT_GNU_PROPERTY_TYPE_0: u32 = 5;
const GNU_PROPERTY_X86_FEATURE_1_AND: u32 = 0xc000_0002;
/// `GNU_PROPERTY_X86_FEATURE_1_IBT | GNU_PROPERTY_X86_FEATURE_1_SHSTK`.
const X86_FEATURE_1_CET: u32 = 0b11;

fn page_up(x: u64) -> Option<u64> {
    Some(x.checked_add(PAGE - 1)? & !(PAGE - 1))
}

fn align8(x: u64) -> Option<u64> {
    Some(x.checked_add(7)? & !7)
}

fn get<const N: usize>(bytes: &[u8], off: u64) -> Option<[u8; N]> {
    let off = usize::try_from(off).ok()?;
    bytes.get(off..off.checked_add(N)?)?.try_into().ok()
}

fn u32_at(bytes: &[u8], off: u64) -> Option<u32> {
    get::<4>(bytes, off).map(u32::from_le_bytes)
}

/// Writes `data` at `off`; the callers only write inside bounds they checked,
/// a miss is reported as an error rather than trusted.
fn put(out: &mut [u8], off: u64, data: &[u8]) -> Option<()> {
    let off = usize::try_from(off).ok()?;
    out.get_mut(off..off.checked_add(data.len())?)?
        .copy_from_slice(data);
    Some(())
}

fn phdr_bytes(p: &ProgramHeader) -> [u8; PHDR_SIZE as usize] {
    let mut b = [0u8; PHDR_SIZE as usize];
    b[0..4].copy_from_slice(&p.p_type.to_le_bytes());
    b[4..8].copy_from_slice(&p.p_flags.to_le_bytes());
    for (i, v) in [
        p.p_offset, p.p_vaddr, p.p_paddr, p.p_filesz, p.p_memsz, p.p_align,
    ]
    .into_iter()
    .enumerate()
    {
        b[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    b
}

fn load(flags: u32, offset: u64, vaddr: u64, filesz: u64, memsz: u64) -> ProgramHeader {
    ProgramHeader {
        p_type: PT_LOAD,
        p_flags: flags,
        p_offset: offset,
        p_vaddr: vaddr,
        p_paddr: vaddr,
        p_filesz: filesz,
        p_memsz: memsz,
        p_align: PAGE,
    }
}

/// The parsed original.
struct Image<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    header: Header,
    phdrs: Vec<ProgramHeader>,
    shdrs: Vec<SectionHeader>,
    /// The `PT_LOAD`s sorted by vaddr.
    loads: Vec<ProgramHeader>,
}

/// Where the new program header table goes.
#[derive(Clone, Copy, Debug)]
struct PhdrPlace {
    offset: u64,
    vaddr: u64,
}

impl<'a> Image<'a> {
    fn err(&self, what: Refusal) -> Error {
        Error::Rewrite {
            path: self.path.to_owned(),
            what,
        }
    }

    fn malformed(&self, what: impl Into<String>) -> Error {
        Error::Analysis(aetrace_analysis::Error::Malformed {
            path: self.path.to_owned(),
            what: what.into(),
        })
    }

    fn parse(path: &'a Path, bytes: &'a [u8]) -> Result<Image<'a>> {
        let malformed = |what: String| {
            Error::Analysis(aetrace_analysis::Error::Malformed {
                path: path.to_owned(),
                what,
            })
        };
        let unsupported = |what: &str| {
            Error::Analysis(aetrace_analysis::Error::Unsupported {
                path: path.to_owned(),
                what: what.into(),
            })
        };
        if bytes.get(..4) != Some(&b"\x7fELF"[..]) {
            return Err(Error::Analysis(aetrace_analysis::Error::NotElf {
                path: path.to_owned(),
            }));
        }
        if bytes.len() < EHDR_SIZE {
            return Err(malformed(format!(
                "truncated: {} bytes, the ELF64 header alone is 64",
                bytes.len()
            )));
        }
        if bytes[4] != 2 || bytes[5] != 1 {
            return Err(unsupported("only ELF64 little-endian x86-64 is supported"));
        }
        let header = Elf::parse_header(bytes).map_err(|e| malformed(e.to_string()))?;
        if header.e_machine != EM_X86_64 {
            return Err(unsupported("only x86-64 is supported"));
        }
        if header.e_type != ET_EXEC && header.e_type != ET_DYN {
            return Err(unsupported(
                "only executables and shared objects can be rewritten",
            ));
        }
        if header.e_phentsize as u64 != PHDR_SIZE || header.e_phnum == 0 {
            return Err(malformed(format!(
                "{} program headers of {} bytes",
                header.e_phnum, header.e_phentsize
            )));
        }
        if header.e_phnum == u16::MAX {
            return Err(unsupported("extended program header numbering (PN_XNUM)"));
        }
        let ctx = Ctx::new(Container::Big, goblin::container::Endian::Little);
        let phoff = usize::try_from(header.e_phoff)
            .map_err(|_| malformed("e_phoff out of range".into()))?;
        // goblin returns errors for short input, but is not written to the
        // never-panic standard on every path: a panic becomes the same error.
        let phdrs = std::panic::catch_unwind(|| {
            ProgramHeader::parse(bytes, phoff, header.e_phnum as usize, ctx)
        })
        .map_err(|_| malformed("goblin failed on the program headers".into()))?
        .map_err(|e| malformed(format!("program headers: {e}")))?;
        let shdrs = if header.e_shoff == 0 {
            Vec::new()
        } else {
            if header.e_shentsize as u64 != SHDR_SIZE {
                return Err(malformed(format!(
                    "section headers of {} bytes",
                    header.e_shentsize
                )));
            }
            let shoff = usize::try_from(header.e_shoff)
                .map_err(|_| malformed("e_shoff out of range".into()))?;
            std::panic::catch_unwind(|| {
                SectionHeader::parse(bytes, shoff, header.e_shnum as usize, ctx)
            })
            .map_err(|_| malformed("goblin failed on the section headers".into()))?
            .map_err(|e| malformed(format!("section headers: {e}")))?
        };
        let mut loads: Vec<ProgramHeader> = phdrs
            .iter()
            .filter(|p| p.p_type == PT_LOAD)
            .cloned()
            .collect();
        loads.sort_by_key(|p| p.p_vaddr);
        let img = Image {
            path,
            bytes,
            header,
            phdrs,
            shdrs,
            loads,
        };
        img.check_loads()?;
        Ok(img)
    }

    fn check_loads(&self) -> Result<()> {
        if self.loads.is_empty() {
            return Err(self.malformed("no PT_LOAD segment"));
        }
        let mut prev_end = 0u64;
        for p in &self.loads {
            let what = |w: &str| {
                self.malformed(format!(
                    "PT_LOAD at vaddr {:#x} offset {:#x}: {w}",
                    p.p_vaddr, p.p_offset
                ))
            };
            let file_end = p.p_offset.checked_add(p.p_filesz);
            if file_end.map_or(true, |e| e > self.bytes.len() as u64) {
                return Err(what("extends past the end of the file"));
            }
            if p.p_filesz > p.p_memsz {
                return Err(what("file size exceeds memory size"));
            }
            if p.p_vaddr.checked_add(p.p_memsz).and_then(page_up).is_none() {
                return Err(what("memory range overflows"));
            }
            if p.p_vaddr.wrapping_sub(p.p_offset) % PAGE != 0 {
                return Err(what("vaddr and offset are not congruent modulo the page"));
            }
            if p.p_vaddr < prev_end {
                return Err(what("overlaps the previous PT_LOAD"));
            }
            prev_end = p.p_vaddr + p.p_memsz;
        }
        if self.loads[0].p_offset > self.loads[0].p_vaddr {
            return Err(self.malformed("the first PT_LOAD's offset exceeds its vaddr"));
        }
        Ok(())
    }

    /// `first_load.p_vaddr - first_load.p_offset`: the vaddr of file offset 0.
    fn base(&self) -> u64 {
        self.loads[0].p_vaddr - self.loads[0].p_offset
    }

    /// The page-aligned end of the original image.
    fn image_end(&self) -> u64 {
        // Checked in `check_loads`.
        self.loads
            .iter()
            .map(|p| page_up(p.p_vaddr + p.p_memsz).unwrap_or(u64::MAX))
            .max()
            .unwrap_or(0)
    }

    /// With a `gap`, the table goes above it (the heap's room), at the
    /// end of the file: only kernels >= 5.18 load that.
    fn phdr_place(&self, gap: u64) -> Result<PhdrPlace> {
        let overflow = || self.err(Refusal::AddressSpace);
        let base = self.base();
        let end = self.image_end();
        let offset = align8(self.bytes.len() as u64).ok_or_else(overflow)?;
        let vaddr = base.checked_add(offset).ok_or_else(overflow)?;
        if gap == 0 && vaddr >= end {
            return Ok(PhdrPlace { offset, vaddr });
        }
        let padded = end - base;
        if gap == 0 && padded - offset <= PAD_LIMIT {
            return Ok(PhdrPlace {
                offset: padded,
                vaddr: end,
            });
        }
        let above = end.checked_add(gap).ok_or_else(overflow)?;
        Ok(PhdrPlace {
            offset,
            vaddr: above + offset % PAGE,
        })
    }

    fn first_free(&self, place: PhdrPlace) -> Result<u64> {
        place
            .vaddr
            .checked_add(MAX_PHDR_TABLE)
            .and_then(page_up)
            .and_then(|v| v.checked_add(PAGE))
            .ok_or_else(|| self.err(Refusal::AddressSpace))
    }

    /// The file offset of `[vaddr, vaddr + len)`, which must lie inside the
    /// file-backed part of one original `PT_LOAD`.
    fn offset_of(&self, vaddr: u64, len: u64) -> Option<u64> {
        let end = vaddr.checked_add(len)?;
        self.loads
            .iter()
            .find(|p| vaddr >= p.p_vaddr && end <= p.p_vaddr + p.p_filesz)
            .map(|p| p.p_offset + (vaddr - p.p_vaddr))
    }

    /// Reads `len` bytes at a vaddr of the original image.
    fn read_vaddr(&self, vaddr: u64, len: u64, what: &str) -> Result<&'a [u8]> {
        self.offset_of(vaddr, len)
            .and_then(|off| {
                let off = usize::try_from(off).ok()?;
                self.bytes
                    .get(off..off.checked_add(usize::try_from(len).ok()?)?)
            })
            .ok_or_else(|| {
                self.malformed(format!(
                    "{what} [{vaddr:#x}, +{len:#x}) is not in the file-backed part of a PT_LOAD"
                ))
            })
    }
}

/// First page-aligned vaddr free for new segments: above every `PT_LOAD` of
/// `elf`, `heap_gap` ([`Additions::heap_gap`]) and the page reserved for the
/// new program header table, with a one-page gap.
pub fn first_free_vaddr(elf: &[u8], heap_gap: u64) -> Result<u64> {
    let img = Image::parse(Path::new("<input ELF>"), elf)?;
    img.first_free(img.phdr_place(heap_gap)?)
}

/// The first page of the rewritten module's additions (its program header
/// table's), for `elf` the original and `heap_gap` as given to
/// [`first_free_vaddr`].
pub fn added_start(elf: &[u8], heap_gap: u64) -> Result<u64> {
    let img = Image::parse(Path::new("<input ELF>"), elf)?;
    Ok(img.phdr_place(heap_gap)?.vaddr & !(PAGE - 1))
}

/// The page-aligned end of `elf`'s highest `PT_LOAD` (its image in
/// memory, `.bss` included; the heap starts above it).
pub fn image_end(elf: &[u8]) -> Result<u64> {
    let img = Image::parse(Path::new("<input ELF>"), elf)?;
    img.loads
        .iter()
        .map(|p| p.p_vaddr.checked_add(p.p_memsz).and_then(page_up))
        .try_fold(0, |end, e| e.map(|e| end.max(e)))
        .ok_or_else(|| img.err(Refusal::AddressSpace))
}

/// The vaddr of `elf`'s `.dynamic` (`PT_DYNAMIC`), if it has one.
pub fn dynamic_vaddr(elf: &[u8]) -> Result<Option<u64>> {
    let img = Image::parse(Path::new("<rewritten ELF>"), elf)?;
    Ok(img
        .phdrs
        .iter()
        .find(|p| p.p_type == PT_DYNAMIC)
        .map(|p| p.p_vaddr))
}

/// Overwrites the bytes at `vaddr` of `elf`, which must lie inside the
/// file-backed part of one `PT_LOAD`.
pub fn patch_vaddr(elf: &mut [u8], vaddr: u64, bytes: &[u8]) -> Result<()> {
    let len = bytes.len() as u64;
    let at = {
        let img = Image::parse(Path::new("<rewritten ELF>"), elf)?;
        img.offset_of(vaddr, len).ok_or_else(|| {
            img.malformed(format!(
                "[{vaddr:#x}, +{len:#x}) is not in the file-backed part of a PT_LOAD"
            ))
        })? as usize
    };
    elf[at..at + bytes.len()].copy_from_slice(bytes);
    Ok(())
}

/// Our own RW segment (the preinit array, the copied `.rela.dyn`, maybe a
/// moved `.dynamic`), built before the file layout is known: its contents
/// depend only on its vaddr.
struct OwnSegment {
    vaddr: u64,
    bytes: Vec<u8>,
    /// Where the parts are, as `(offset in the segment, size)`, with the
    /// link-time address of the original they replace (for its section).
    array: (u64, u64),
    old_array: Option<u64>,
    /// Which array it is.
    kind: FirstRun,
    /// The copied `.rela.dyn` (PIE only).
    rela: Option<(u64, u64)>,
    old_rela: Option<u64>,
    /// `.dynamic`, when it had to move.
    moved_dynamic: Option<(u64, u64)>,
}

/// The decoded `.dynamic` of the original.
struct Dynamic {
    /// File offset of the first entry.
    offset: u64,
    /// Entries before the first `DT_NULL`.
    used: Vec<(u64, u64)>,
    /// `DT_NULL` slots after the first one (free for new tags).
    spare: usize,
}

impl Dynamic {
    fn get(&self, tag: u64) -> Option<u64> {
        self.used.iter().find(|e| e.0 == tag).map(|e| e.1)
    }

    fn set(entries: &mut Vec<(u64, u64)>, tag: u64, val: u64) {
        match entries.iter_mut().find(|e| e.0 == tag) {
            Some(e) => e.1 = val,
            None => entries.push((tag, val)),
        }
    }
}

fn read_dynamic(img: &Image) -> Result<Dynamic> {
    let seg = img
        .phdrs
        .iter()
        .find(|p| p.p_type == PT_DYNAMIC)
        .ok_or_else(|| img.err(Refusal::NoDynamic))?;
    let bytes = usize::try_from(seg.p_offset)
        .ok()
        .zip(usize::try_from(seg.p_filesz).ok())
        .and_then(|(off, len)| img.bytes.get(off..off.checked_add(len)?))
        .ok_or_else(|| img.malformed("PT_DYNAMIC extends past the end of the file"))?;
    let mut all: Vec<(u64, u64)> = bytes
        .chunks_exact(DYN_SIZE as usize)
        .map(|e| {
            let word = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().unwrap_or_default());
            (word(0), word(8))
        })
        .collect();
    // `ld --spare-dynamic-tags=0` leaves no terminator inside PT_DYNAMIC
    // (ld.so then reads on into `.got`): all slots are used, none spare.
    let used = all.iter().position(|e| e.0 == DT_NULL).unwrap_or(all.len());
    let rest = all.get(used + 1..).unwrap_or(&[]);
    let spare = if rest.iter().all(|e| e.0 == DT_NULL) {
        rest.len()
    } else {
        0
    };
    all.truncate(used);
    Ok(Dynamic {
        offset: seg.p_offset,
        used: all,
        spare,
    })
}

/// The vaddrs `DT_RELR` relocates (implicit addends: the words themselves).
fn relr_targets(img: &Image, dynamic: &Dynamic) -> Result<Vec<u64>> {
    let (Some(relr), Some(size)) = (dynamic.get(DT_RELR), dynamic.get(DT_RELRSZ)) else {
        return Ok(Vec::new());
    };
    let table = img.read_vaddr(relr, size, "DT_RELR")?;
    let mut out = Vec::new();
    let mut next = 0u64;
    for w in table.chunks_exact(8) {
        let w = u64::from_le_bytes(w.try_into().unwrap_or_default());
        if w & 1 == 0 {
            out.push(w);
            next = w.wrapping_add(8);
        } else {
            for bit in 1..64 {
                if w >> bit & 1 == 1 {
                    out.push(next.wrapping_add((bit - 1) * 8));
                }
            }
            next = next.wrapping_add(63 * 8);
        }
    }
    Ok(out)
}

/// The array a function to run first goes in.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum FirstRun {
    /// `DT_PREINIT_ARRAY` of a dynamically linked executable.
    Preinit,
    /// `DT_INIT_ARRAY` of a shared object.
    Init,
}

impl FirstRun {
    /// The dynamic tag's name, for messages.
    fn name(self) -> &'static str {
        match self {
            FirstRun::Preinit => "DT_PREINIT_ARRAY",
            FirstRun::Init => "DT_INIT_ARRAY",
        }
    }

    /// The array's and its size's dynamic tags, section type and name.
    fn tags(self) -> (u64, u64, u32, &'static str) {
        match self {
            FirstRun::Preinit => (
                DT_PREINIT_ARRAY,
                DT_PREINIT_ARRAYSZ,
                SHT_PREINIT_ARRAY,
                ".preinit_array",
            ),
            FirstRun::Init => (
                DT_INIT_ARRAY,
                DT_INIT_ARRAYSZ,
                SHT_INIT_ARRAY,
                ".init_array",
            ),
        }
    }
}

/// Builds the new preinit (or init) array (and in a PIE or shared object
/// its relocations) in our segment at `vaddr`, with `search` put first in
/// the library search path ([`search_first`]), and points `.dynamic` at
/// them (in place in `out`, or in a moved copy).
fn preinit(
    img: &Image,
    out: &mut [u8],
    (func, search): (u64, Option<&SearchFirst>),
    vaddr: u64,
    kind: FirstRun,
) -> Result<OwnSegment> {
    let (dt_array, dt_size, _, _) = kind.tags();
    if kind == FirstRun::Preinit && !img.phdrs.iter().any(|p| p.p_type == PT_INTERP) {
        return Err(img.err(Refusal::PreinitStatic));
    }
    let dynamic = read_dynamic(img)?;
    let pie = img.header.e_type == ET_DYN;
    let flagged_pie = dynamic.get(DT_FLAGS_1).unwrap_or(0) & DF_1_PIE != 0;
    if kind == FirstRun::Init && (!pie || flagged_pie) {
        return Err(img.err(Refusal::InitNotShared));
    }
    if kind == FirstRun::Preinit && pie && !flagged_pie {
        return Err(img.err(Refusal::PreinitNotPie));
    }
    let mut values = vec![func];
    match (dynamic.get(dt_array), dynamic.get(dt_size)) {
        (None, None) => {}
        (Some(arr), Some(size)) => {
            if size % 8 != 0 {
                return Err(
                    img.malformed(format!("{}SZ {size} is not a multiple of 8", kind.name()))
                );
            }
            let old = img.read_vaddr(arr, size, kind.name())?;
            let relas = if pie {
                old_relas(img, &dynamic)?
            } else {
                Vec::new()
            };
            let relr = if pie {
                relr_targets(img, &dynamic)?
            } else {
                Vec::new()
            };
            for (i, w) in old.chunks_exact(8).enumerate() {
                let at = arr + 8 * i as u64;
                let word = u64::from_le_bytes(w.try_into().unwrap_or_default());
                let value = if !pie {
                    word
                } else if let Some(r) = relas
                    .iter()
                    .find(|r| r.0 == at && r.1 & 0xffff_ffff == u64::from(R_X86_64_RELATIVE))
                {
                    r.2
                } else if relr.contains(&at) {
                    word
                } else {
                    return Err(img.err(Refusal::NoRelative {
                        array: kind.name(),
                        at,
                    }));
                };
                values.push(value);
            }
        }
        _ => {
            return Err(img.malformed(format!(
                "{} without {}SZ or the reverse",
                kind.name(),
                kind.name()
            )))
        }
    }
    let mut seg = Vec::new();
    for v in &values {
        seg.extend_from_slice(&v.to_le_bytes());
    }
    let mut entries = dynamic.used.clone();
    Dynamic::set(&mut entries, dt_array, vaddr);
    Dynamic::set(&mut entries, dt_size, seg.len() as u64);
    let mut rela = None;
    if pie {
        let rela_at = seg.len() as u64;
        for (i, v) in values.iter().enumerate() {
            seg.extend_from_slice(&(vaddr + 8 * i as u64).to_le_bytes());
            seg.extend_from_slice(&u64::from(R_X86_64_RELATIVE).to_le_bytes());
            seg.extend_from_slice(&v.to_le_bytes());
        }
        seg.extend_from_slice(old_rela_bytes(img, &dynamic)?);
        rela = Some((rela_at, seg.len() as u64 - rela_at));
        Dynamic::set(&mut entries, DT_RELA, vaddr + rela_at);
        Dynamic::set(&mut entries, DT_RELASZ, seg.len() as u64 - rela_at);
        Dynamic::set(&mut entries, DT_RELAENT, RELA_SIZE);
        if let Some(count) = dynamic.get(DT_RELACOUNT) {
            Dynamic::set(&mut entries, DT_RELACOUNT, count + values.len() as u64);
        }
    }
    if let Some(dir) = search {
        search_first(img, &dynamic, &mut entries, (&mut seg, vaddr), dir)?;
    }
    let added = entries.len() - dynamic.used.len();
    let moved_dynamic = if added <= dynamic.spare {
        let mut off = dynamic.offset;
        for (t, v) in &entries {
            put(out, off, &t.to_le_bytes())
                .ok_or_else(|| img.malformed(".dynamic out of the file"))?;
            put(out, off + 8, &v.to_le_bytes())
                .ok_or_else(|| img.malformed(".dynamic out of the file"))?;
            off += DYN_SIZE;
        }
        None
    } else {
        let at = seg.len() as u64;
        for (t, v) in entries
            .iter()
            .chain(std::iter::repeat(&(DT_NULL, 0)).take(1 + SPARE_DYNAMIC))
        {
            seg.extend_from_slice(&t.to_le_bytes());
            seg.extend_from_slice(&v.to_le_bytes());
        }
        Some((at, seg.len() as u64 - at))
    };
    Ok(OwnSegment {
        vaddr,
        bytes: seg,
        array: (0, 8 * values.len() as u64),
        old_array: dynamic.get(dt_array),
        kind,
        rela,
        old_rela: dynamic.get(DT_RELA),
        moved_dynamic,
    })
}

/// Puts `dir` first in the executable's library search path: the string
/// `dir:NATIVE` (or `dir`) is appended to our segment `seg` (at `vaddr`),
/// and its `DT_RUNPATH`, or else `DT_RPATH`, names it. `ld.so` reads
/// such a path at `DT_STRTAB + d_val` with no bound (`decompose_rpath`),
/// so the string need not be in `.dynstr`: `d_val` is its distance from
/// the table (wrapping). Our segment is in a `PT_LOAD`, mapped by the
/// kernel before `ld.so` runs. The search order is otherwise the native
/// one: `DT_RPATH` (without `DT_RUNPATH`) is searched for every object
/// loaded on behalf of one without `DT_RUNPATH`, `DT_RUNPATH` only for
/// the executable's own `DT_NEEDED` and after `LD_LIBRARY_PATH`. A
/// `DT_NEEDED` of `search.by_path` names the library's path in the
/// directory, read the same unbounded way (`_dl_map_object_deps`), and a
/// name with a slash is opened without a search. With
/// `search.cache_probe_before`, a `DT_AUXILIARY` naming [`CACHE_PROBE`]
/// precedes that `DT_NEEDED`: `_dl_map_object_deps` handles an object's
/// entries in order, the failed search maps `/etc/ld.so.cache` (which
/// stays mapped until the end of start-up) exactly where the native
/// search for that library did, so it and every later mapping land at
/// their native addresses (docs/rewrite.md, "Loading the rewritten
/// copies").
fn search_first(
    img: &Image,
    dynamic: &Dynamic,
    entries: &mut Vec<(u64, u64)>,
    (seg, vaddr): (&mut Vec<u8>, u64),
    search: &SearchFirst,
) -> Result<()> {
    let strtab = dynamic
        .get(DT_STRTAB)
        .ok_or_else(|| img.malformed(".dynamic has no DT_STRTAB"))?;
    let size = dynamic.get(DT_STRSZ).unwrap_or(0);
    let table = img.read_vaddr(strtab, size, "DT_STRTAB")?;
    let string = |at: u64| {
        usize::try_from(at)
            .ok()
            .and_then(|at| table.get(at..))
            .and_then(|t| t.split(|&b| b == 0).next().filter(|_| t.contains(&0)))
            .ok_or_else(|| img.malformed(format!("string {at:#x} outside DT_STRTAB")))
    };
    // Appends `bytes` and a NUL to our segment: its `d_val`.
    let mut add = |bytes: &[&[u8]]| {
        let at = vaddr + seg.len() as u64;
        bytes.iter().for_each(|b| seg.extend_from_slice(b));
        seg.push(0);
        at.wrapping_sub(strtab)
    };
    let mut probe_at = None;
    for (i, e) in entries
        .iter_mut()
        .enumerate()
        .filter(|(_, e)| e.0 == DT_NEEDED)
    {
        let name = string(e.1)?;
        if probe_at.is_none() && search.cache_probe_before.as_deref() == Some(name) {
            probe_at = Some(i);
        }
        if search.by_path.iter().any(|n| n == name) {
            e.1 = add(&[&search.dir, b"/", name]);
        }
    }
    if let Some(i) = probe_at {
        let probe = add(&[CACHE_PROBE]);
        entries.insert(i, (DT_AUXILIARY, probe));
    }
    let tag = if dynamic.get(DT_RUNPATH).is_some() {
        DT_RUNPATH
    } else {
        DT_RPATH
    };
    let native = dynamic.get(tag).map(string).transpose()?;
    let val = match native.filter(|n| !n.is_empty()) {
        Some(n) => add(&[&search.dir, b":", n]),
        None => add(&[&search.dir]),
    };
    Dynamic::set(entries, tag, val);
    Ok(())
}

/// The bytes of the original `DT_RELA` table that `ld.so` processes as such:
/// without a `DT_JMPREL` table at its tail (some linkers count `.rela.plt`
/// in `DT_RELASZ`; `ld.so` subtracts it only when the two are adjacent).
fn old_rela_bytes<'a>(img: &Image<'a>, dynamic: &Dynamic) -> Result<&'a [u8]> {
    let Some(rela) = dynamic.get(DT_RELA) else {
        return Ok(&[]);
    };
    let mut size = dynamic
        .get(DT_RELASZ)
        .ok_or_else(|| img.malformed("DT_RELA without DT_RELASZ"))?;
    if let Some(ent) = dynamic.get(DT_RELAENT) {
        if ent != RELA_SIZE {
            return Err(img.malformed(format!("DT_RELAENT is {ent}, not 24")));
        }
    }
    if let (Some(jmprel), Some(pltsz)) = (dynamic.get(DT_JMPREL), dynamic.get(DT_PLTRELSZ)) {
        if jmprel >= rela && jmprel < rela.saturating_add(size) {
            if jmprel.checked_add(pltsz) != rela.checked_add(size) {
                return Err(img.err(Refusal::JmprelInsideRela));
            }
            size = jmprel - rela;
        }
    }
    if size % RELA_SIZE != 0 {
        return Err(img.malformed(format!("DT_RELASZ {size} is not a multiple of 24")));
    }
    img.read_vaddr(rela, size, "DT_RELA")
}

/// The original RELA relocations as `(r_offset, r_info, r_addend)`.
fn old_relas(img: &Image, dynamic: &Dynamic) -> Result<Vec<(u64, u64, u64)>> {
    Ok(old_rela_bytes(img, dynamic)?
        .chunks_exact(RELA_SIZE as usize)
        .map(|r| {
            let w = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().unwrap_or_default());
            (w(0), w(8), w(16))
        })
        .collect())
}

/// Clears the IBT and SHSTK bits of every x86 feature property note.
fn clear_cet(img: &Image, out: &mut [u8]) -> Result<()> {
    for p in img
        .phdrs
        .iter()
        .filter(|p| p.p_type == PT_NOTE || p.p_type == PT_GNU_PROPERTY)
    {
        let align = if p.p_align == 8 { 8 } else { 4 };
        let bad = || {
            img.malformed(format!(
                "note segment at offset {:#x}: a note runs past its end",
                p.p_offset
            ))
        };
        let end = p.p_offset.checked_add(p.p_filesz).ok_or_else(bad)?;
        let mut at = p.p_offset;
        while at + 12 <= end {
            let (Some(namesz), Some(descsz), Some(ntype)) = (
                u32_at(img.bytes, at),
                u32_at(img.bytes, at + 4),
                u32_at(img.bytes, at + 8),
            ) else {
                return Err(bad());
            };
            // Name and descriptor each start aligned (relative to the
            // segment, whose offset is aligned in any loadable note).
            let up = |x: u64| p.p_offset + ((x - p.p_offset + align - 1) & !(align - 1));
            let desc = up(at + 12 + u64::from(namesz));
            let next = up(desc + u64::from(descsz));
            if next > end {
                return Err(bad());
            }
            let name = get::<4>(img.bytes, at + 12);
            if ntype == NT_GNU_PROPERTY_TYPE_0 && namesz == 4 && name == Some(*b"GNU\0") {
                let desc_end = desc + u64::from(descsz);
                let mut q = desc;
                while q + 8 <= desc_end {
                    let (Some(pr_type), Some(datasz)) =
                        (u32_at(img.bytes, q), u32_at(img.bytes, q + 4))
                    else {
                        return Err(bad());
                    };
                    if pr_type == GNU_PROPERTY_X86_FEATURE_1_AND && datasz >= 4 {
                        let v = u32_at(img.bytes, q + 8).ok_or_else(bad)?;
                        put(out, q + 8, &(v & !X86_FEATURE_1_CET).to_le_bytes()).ok_or_else(bad)?;
                    }
                    q += 8 + ((u64::from(datasz) + 7) & !7);
                }
            }
            at = next;
        }
    }
    Ok(())
}

/// Writes `patches` into `out`; `late` ones (the runtime's, at init) must
/// fit as well, and none may overlap another.
fn apply_patches(img: &Image, out: &mut [u8], patches: &[Patch], late: &[Patch]) -> Result<()> {
    let mut spans: Vec<(u64, u64)> = Vec::with_capacity(patches.len() + late.len());
    let now = patches.iter().map(|p| (p, true));
    for (p, now) in now.chain(late.iter().map(|p| (p, false))) {
        let len = p.bytes.len() as u64;
        let off = img
            .offset_of(p.vaddr, len)
            .ok_or_else(|| img.err(Refusal::PatchOutside { at: p.vaddr, len }))?;
        if now {
            put(out, off, &p.bytes).ok_or_else(|| img.err(Refusal::PatchOutOfFile))?;
        }
        spans.push((p.vaddr, p.vaddr + len));
    }
    spans.sort_unstable();
    if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
        return Err(img.err(Refusal::PatchesOverlap(w[1].0)));
    }
    Ok(())
}

/// Produces the bytes of the rewritten ELF (see the module documentation).
/// `path` names the original in error messages.
pub fn write(path: &Path, elf: &[u8], add: &Additions) -> Result<Vec<u8>> {
    let img = Image::parse(path, elf)?;
    let place = img.phdr_place(add.heap_gap)?;
    let next_free = check_segments(&img, add, img.first_free(place)?)?;

    let mut out = elf.to_vec();
    if !add.detached && !add.late_patches.is_empty() {
        return Err(img.err(Refusal::Detached(
            "patches made at init without detached additions",
        )));
    }
    apply_patches(&img, &mut out, &add.patches, &add.late_patches)?;
    clear_cet(&img, &mut out)?;
    if add.detached {
        write_detached(&img, &mut out, add, place)?;
        return Ok(out);
    }
    if let Some(entry) = add.entry {
        out[24..32].copy_from_slice(&entry.to_le_bytes());
    }
    let own = match (add.preinit, add.init) {
        (Some(func), None) => Some(preinit(
            &img,
            &mut out,
            (func, add.search_first.as_ref()),
            next_free,
            FirstRun::Preinit,
        )?),
        (None, Some(func)) => Some(preinit(
            &img,
            &mut out,
            (func, None),
            next_free,
            FirstRun::Init,
        )?),
        (None, None) if add.search_first.is_some() => {
            return Err(img.err(Refusal::SearchWithoutPreinit))
        }
        (None, None) => None,
        (Some(_), Some(_)) => return Err(img.err(Refusal::PreinitAndInit)),
    };

    // The file layout.
    // A static executable linked without `--eh-frame-hdr` (gcc's default
    // for `-static`) gets a PT_GNU_EH_FRAME: its unwinder finds the copies'
    // FDEs through `dl_iterate_phdr` once the registered original
    // `.eh_frame` has no entry for a pc.
    let new_eh_phdr =
        add.eh_frame_hdr.is_some() && !img.phdrs.iter().any(|p| p.p_type == PT_GNU_EH_FRAME);
    let n_phdrs = img.phdrs.len()
        + 1
        + add.segments.len()
        + usize::from(own.is_some())
        + usize::from(new_eh_phdr);
    let table_size = n_phdrs as u64 * PHDR_SIZE;
    if table_size > MAX_PHDR_TABLE {
        return Err(img.err(Refusal::TooManyHeaders(n_phdrs)));
    }
    let mut layout = Layout::new(place, table_size, &add.segments);
    layout.unwind_tables(&img, add)?;
    if let Some(o) = &own {
        layout.own_segment(&img, o);
    }
    let table = phdr_table(&img, &layout, own.as_ref(), new_eh_phdr);
    debug_assert_eq!(table.len(), n_phdrs);
    debug_assert!(check_layout(&table, &layout.loads, layout.end));
    check_starts(&img, &table, add)?;

    // The header.
    out[32..40].copy_from_slice(&place.offset.to_le_bytes());
    out[56..58].copy_from_slice(&(n_phdrs as u16).to_le_bytes());

    // The appended bytes.
    out.resize(place.offset as usize, 0);
    for p in &table {
        out.extend_from_slice(&phdr_bytes(p));
    }
    let bodies = add
        .segments
        .iter()
        .map(|s| &s.bytes)
        .chain(own.as_ref().map(|o| &o.bytes));
    for (l, body) in layout.loads[1..].iter().zip(bodies) {
        out.resize(l.p_offset as usize, 0);
        out.extend_from_slice(body);
    }
    section_table(&img, &mut out, &layout.new_sections, &layout.moved_sections)?;
    Ok(out)
}

/// Whether a shared object's additions can be detached: a spare `DT_NULL`
/// slot for [`DT_ADDITIONS`].
pub fn can_detach(elf: &[u8]) -> Result<bool> {
    let img = Image::parse(Path::new("<input ELF>"), elf)?;
    Ok(img.header.e_type == ET_DYN && read_dynamic(&img)?.spare > 0)
}

/// The detached layout (module documentation): the segments' bytes as
/// [`write`] lays them out, the descriptor where the table would be, and
/// the `DT_ADDITIONS` tag; the program headers untouched.
fn write_detached(img: &Image, out: &mut Vec<u8>, add: &Additions, place: PhdrPlace) -> Result<()> {
    let unfit = |what: Refusal| Err(img.err(what));
    if add.preinit.is_some() || add.init.is_some() || add.entry.is_some() {
        return unfit(Refusal::Detached("an init, preinit or entry function"));
    }
    if add.segments.len() > detach::MAX_SEGMENTS
        || add
            .segments
            .iter()
            .any(|s| s.mem_size != s.bytes.len() as u64)
    {
        return unfit(Refusal::Detached("more segments, or zero-filled ones"));
    }
    let dynamic = read_dynamic(img)?;
    if dynamic.spare == 0 {
        return unfit(Refusal::Detached("no spare DT_NULL slot"));
    }
    let mut layout = Layout::new(place, detach::DESC_SIZE as u64, &add.segments);
    layout.unwind_tables(img, add)?;
    let mut desc = Vec::with_capacity(detach::DESC_SIZE);
    desc.extend_from_slice(&detach::MAGIC.to_le_bytes());
    desc.extend_from_slice(&(add.segments.len() as u64).to_le_bytes());
    for l in &layout.loads[1..] {
        // New segments start on a page, so their offsets do too.
        let len = page_up(l.p_filesz).ok_or_else(|| img.err(Refusal::AddressSpace))?;
        for word in [l.p_vaddr, len, l.p_offset, prot_bits(l.p_flags)] {
            desc.extend_from_slice(&word.to_le_bytes());
        }
    }
    // Registered by the executable's runtime (`detach`): libgcc then finds
    // the copies' FDEs, outside the span `_dl_find_object` knows.
    desc.resize(detach::DESC_EH_FRAME, 0);
    desc.extend_from_slice(&add.eh_frame.map_or(0, |e| e.0).to_le_bytes());
    // The table of patches made at init, if any (`late_patch_table`).
    desc.resize(detach::DESC_SIZE, 0);
    let slot = dynamic.offset + dynamic.used.len() as u64 * DYN_SIZE;
    let mut tag = detach::DT_ADDITIONS.to_le_bytes().to_vec();
    tag.extend_from_slice(&place.offset.to_le_bytes());
    put(out, slot, &tag).ok_or_else(|| img.malformed("PT_DYNAMIC is outside the file"))?;
    out.resize(place.offset as usize, 0);
    out.extend_from_slice(&desc);
    for (l, s) in layout.loads[1..].iter().zip(&add.segments) {
        out.resize(l.p_offset as usize, 0);
        out.extend_from_slice(&s.bytes);
    }
    late_patch_table(img, out, place.offset, &add.late_patches)?;
    section_table(img, out, &layout.new_sections, &layout.moved_sections)
}

/// Appends the table of patches the executable's runtime makes at init
/// (`detach`: per patch its link-time vaddr, length, bytes and the
/// `PROT_*` bits of its `PT_LOAD`, four words) and gives its file offset
/// and length in the descriptor at `desc`.
fn late_patch_table(img: &Image, out: &mut Vec<u8>, desc: u64, late: &[Patch]) -> Result<()> {
    if late.is_empty() {
        return Ok(());
    }
    let offset = align8(out.len() as u64).ok_or_else(|| img.err(Refusal::AddressSpace))?;
    out.resize(offset as usize, 0);
    for p in late {
        let end = p.vaddr + p.bytes.len() as u64;
        let load = (img.loads.iter())
            .find(|l| p.vaddr >= l.p_vaddr && end <= l.p_vaddr + l.p_filesz)
            .ok_or_else(|| {
                img.err(Refusal::PatchOutside {
                    at: p.vaddr,
                    len: 0,
                })
            })?;
        if p.bytes.len() > 8 {
            return Err(img.err(Refusal::Detached(
                "a patch made at init longer than 8 bytes",
            )));
        }
        let mut word = [0u8; 8];
        word[..p.bytes.len()].copy_from_slice(&p.bytes);
        let prot = prot_bits(load.p_flags);
        for w in [
            p.vaddr,
            p.bytes.len() as u64,
            u64::from_le_bytes(word),
            prot,
        ] {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }
    let at = (desc as usize) + detach::DESC_PATCHES;
    out[at..at + 8].copy_from_slice(&offset.to_le_bytes());
    out[at + 8..at + 16].copy_from_slice(&(late.len() as u64).to_le_bytes());
    Ok(())
}

/// `PROT_*` bits of a program header's `PF_*` flags.
fn prot_bits(p_flags: u32) -> u64 {
    [(PF_R, 1), (PF_W, 2), (PF_X, 4)]
        .iter()
        .filter(|(pf, _)| p_flags & pf != 0)
        .fold(0u64, |p, (_, bit)| p | bit)
}

/// The new segments are page-aligned, ascending from `free`, non-empty,
/// with known flags. Returns the first free page above them.
fn check_segments(img: &Image, add: &Additions, free: u64) -> Result<u64> {
    let overflow = || img.err(Refusal::AddressSpace);
    let mut next_free = free;
    for s in &add.segments {
        let what = |why| {
            img.err(Refusal::NewSegment {
                vaddr: s.vaddr,
                why,
            })
        };
        if s.vaddr % PAGE != 0 {
            return Err(what(SegmentFault::NotPageAligned));
        }
        if s.vaddr < next_free {
            return Err(what(SegmentFault::Below(next_free)));
        }
        if s.mem_size < s.bytes.len() as u64 || s.mem_size == 0 {
            return Err(what(SegmentFault::MemSize));
        }
        if s.flags & !7 != 0 {
            return Err(what(SegmentFault::Flags));
        }
        next_free = s
            .vaddr
            .checked_add(s.mem_size)
            .and_then(page_up)
            .ok_or_else(overflow)?;
    }
    Ok(next_free)
}

/// Where the appended parts go in the file, and the sections that name
/// them.
struct Layout {
    /// The new program header table.
    place: PhdrPlace,
    table_size: u64,
    /// The new `PT_LOAD`s: the table's, then one per new segment, then
    /// the own segment's.
    loads: Vec<ProgramHeader>,
    new_sections: Vec<NewSection>,
    moved_sections: Vec<SectionMove>,
    /// The new `.eh_frame_hdr`: `(vaddr, size, file offset)`.
    eh_hdr: Option<(u64, u64, u64)>,
    /// The end of the file bytes laid out so far.
    end: u64,
}

/// The first offset at or after `cur` congruent to `vaddr` modulo a page.
fn congruent(cur: u64, vaddr: u64) -> u64 {
    cur + (vaddr.wrapping_sub(cur) & (PAGE - 1))
}

impl Layout {
    /// The table at `place`, then the new segments.
    fn new(place: PhdrPlace, table_size: u64, segments: &[NewSegment]) -> Layout {
        let mut l = Layout {
            place,
            table_size,
            loads: vec![load(
                PF_R,
                place.offset,
                place.vaddr,
                table_size,
                table_size,
            )],
            // Every new segment has sections: BFD (objcopy, strip) lays out a
            // segment without sections at an offset that breaks its congruence.
            new_sections: vec![NewSection {
                name: ".aetrace.phdr",
                sh_type: SHT_PROGBITS,
                flags: u64::from(SHF_ALLOC),
                addr: place.vaddr,
                offset: place.offset,
                size: table_size,
                align: 8,
                entsize: 0,
            }],
            moved_sections: Vec::new(),
            eh_hdr: None,
            end: place.offset + table_size,
        };
        for s in segments {
            let off = congruent(l.end, s.vaddr);
            let len = s.bytes.len() as u64;
            l.loads.push(load(s.flags, off, s.vaddr, len, s.mem_size));
            l.new_sections.extend(NewSection::of_segment(
                s.flags, off, s.vaddr, len, s.mem_size,
            ));
            l.end = off + len;
        }
        l
    }

    /// The file offset of `[a, a + len)`, which must lie in the file bytes
    /// of a new segment.
    fn in_new(&self, img: &Image, what: &'static str, (addr, len): (u64, u64)) -> Result<u64> {
        self.loads[1..]
            .iter()
            .find(|l| addr >= l.p_vaddr && addr.saturating_add(len) <= l.p_vaddr + l.p_filesz)
            .map(|l| l.p_offset + (addr - l.p_vaddr))
            .ok_or_else(|| img.err(Refusal::NotInNewSegment { what, addr, len }))
    }

    /// New unwind tables: PT_GNU_EH_FRAME and the `.eh_frame_hdr` section
    /// follow the new header (the unwinder finds FDEs through it), the
    /// `.eh_frame` section the new, complete `.eh_frame` (readelf and gdb
    /// read the section).
    fn unwind_tables(&mut self, img: &Image, add: &Additions) -> Result<()> {
        if let Some(r) = add.eh_frame_hdr {
            let off = self.in_new(img, "the new .eh_frame_hdr", r)?;
            let old = img.phdrs.iter().find(|p| p.p_type == PT_GNU_EH_FRAME);
            if let Some(index) = old.and_then(|old| {
                img.shdrs
                    .iter()
                    .position(|s| s.sh_type == SHT_PROGBITS && s.sh_addr == old.p_vaddr)
            }) {
                self.moved_sections.push(SectionMove {
                    index,
                    addr: r.0,
                    offset: off,
                    size: r.1,
                });
            }
            self.eh_hdr = Some((r.0, r.1, off));
        }
        if let Some(r) = add.eh_frame {
            let offset = self.in_new(img, "the new .eh_frame", r)?;
            if let Some(index) = section_named(img, ".eh_frame") {
                self.moved_sections.push(SectionMove {
                    index,
                    addr: r.0,
                    offset,
                    size: r.1,
                });
            }
        }
        Ok(())
    }

    /// The own segment (init array, relocations, moved `.dynamic`) last.
    fn own_segment(&mut self, img: &Image, o: &OwnSegment) {
        let off = congruent(self.end, o.vaddr);
        let len = o.bytes.len() as u64;
        self.loads.push(load(PF_R | PF_W, off, o.vaddr, len, len));
        let old_dynamic = img
            .phdrs
            .iter()
            .find(|p| p.p_type == PT_DYNAMIC)
            .map(|p| p.p_vaddr);
        // The original's sections for the replaced parts follow them (so
        // `readelf -r` shows the relocations ld.so applies); parts the
        // original had no section for get new ones.
        let (_, _, array_type, array_name) = o.kind.tags();
        let parts = [
            (o.array, o.old_array, array_type, array_name, 8),
            (
                o.rela.unwrap_or_default(),
                o.old_rela,
                SHT_RELA,
                ".aetrace.rela",
                RELA_SIZE,
            ),
            (
                o.moved_dynamic.unwrap_or_default(),
                old_dynamic,
                SHT_DYNAMIC,
                ".dynamic",
                DYN_SIZE,
            ),
        ];
        for ((at, size), old_addr, sh_type, name, entsize) in parts {
            if size == 0 {
                continue;
            }
            let (addr, offset) = (o.vaddr + at, off + at);
            let existing = img
                .shdrs
                .iter()
                .position(|s| s.sh_type == sh_type && old_addr == Some(s.sh_addr));
            match existing {
                Some(index) => self.moved_sections.push(SectionMove {
                    index,
                    addr,
                    offset,
                    size,
                }),
                None => self.new_sections.push(NewSection {
                    name,
                    sh_type,
                    flags: u64::from(SHF_ALLOC | SHF_WRITE),
                    addr,
                    offset,
                    size,
                    align: 8,
                    entsize,
                }),
            }
        }
        self.end = off + len;
    }
}

/// The new program header table: the original's headers before its first
/// `PT_LOAD`, all `PT_LOAD`s by address, the original's others, and a new
/// `PT_GNU_EH_FRAME` (`new_eh_phdr`); `PT_PHDR`, `PT_GNU_EH_FRAME` and a
/// moved `PT_DYNAMIC` repointed.
fn phdr_table(
    img: &Image,
    layout: &Layout,
    own: Option<&OwnSegment>,
    new_eh_phdr: bool,
) -> Vec<ProgramHeader> {
    let first_load = img
        .phdrs
        .iter()
        .position(|p| p.p_type == PT_LOAD)
        .unwrap_or(0);
    let mut loads: Vec<ProgramHeader> = img.loads.iter().chain(&layout.loads).cloned().collect();
    loads.sort_by_key(|p| p.p_vaddr);
    let mut table: Vec<ProgramHeader> = img.phdrs[..first_load].to_vec();
    table.extend(loads);
    table.extend(
        img.phdrs[first_load..]
            .iter()
            .filter(|p| p.p_type != PT_LOAD)
            .cloned(),
    );
    if new_eh_phdr {
        // Filled in below like a repointed one.
        table.push(ProgramHeader {
            p_type: PT_GNU_EH_FRAME,
            p_flags: PF_R,
            p_align: 4,
            ..ProgramHeader::default()
        });
    }
    let own_load = layout.loads.last().filter(|_| own.is_some()).cloned();
    let (place, table_size) = (layout.place, layout.table_size);
    for p in &mut table {
        if let (PT_GNU_EH_FRAME, Some((vaddr, size, offset))) = (p.p_type, layout.eh_hdr) {
            p.p_offset = offset;
            p.p_vaddr = vaddr;
            p.p_paddr = vaddr;
            p.p_filesz = size;
            p.p_memsz = size;
        }
        if p.p_type == PT_PHDR {
            p.p_offset = place.offset;
            p.p_vaddr = place.vaddr;
            p.p_paddr = place.vaddr;
            p.p_filesz = table_size;
            p.p_memsz = table_size;
        }
        if let (PT_DYNAMIC, Some((at, size)), Some(l)) =
            (p.p_type, own.and_then(|o| o.moved_dynamic), &own_load)
        {
            p.p_offset = l.p_offset + at;
            p.p_vaddr = l.p_vaddr + at;
            p.p_paddr = p.p_vaddr;
            p.p_filesz = size;
            p.p_memsz = size;
        }
    }
    table
}

/// A start address outside executable memory would only show up as a
/// SIGSEGV before main.
fn check_starts(img: &Image, table: &[ProgramHeader], add: &Additions) -> Result<()> {
    for (what, addr) in [
        ("entry", add.entry),
        ("preinit", add.preinit),
        ("init", add.init),
    ] {
        let Some(addr) = addr else { continue };
        let exec = table.iter().any(|p| {
            p.p_type == PT_LOAD
                && p.p_flags & PF_X != 0
                && addr >= p.p_vaddr
                && addr - p.p_vaddr < p.p_filesz
        });
        if !exec {
            return Err(img.err(Refusal::NotExecutable { what, addr }));
        }
    }
    Ok(())
}

/// The index of the original section called `name`, if the file has an
/// ordinary section name table naming one.
fn section_named(img: &Image, name: &str) -> Option<usize> {
    let strtab = img.shdrs.get(usize::from(img.header.e_shstrndx))?;
    if strtab.sh_type != SHT_STRTAB {
        return None;
    }
    let off = usize::try_from(strtab.sh_offset).ok()?;
    let names = img
        .bytes
        .get(off..off.checked_add(usize::try_from(strtab.sh_size).ok()?)?)?;
    img.shdrs.iter().position(|s| {
        names
            .get(s.sh_name..)
            .and_then(|n| n.split(|&b| b == 0).next())
            .is_some_and(|n| n == name.as_bytes())
    })
}

/// A section header for added bytes, so that `objdump -d`, gdb and perf
/// see the new code and data by name.
struct NewSection {
    name: &'static str,
    sh_type: u32,
    flags: u64,
    addr: u64,
    offset: u64,
    size: u64,
    align: u64,
    entsize: u64,
}

/// An original section whose bytes moved to our segment.
struct SectionMove {
    index: usize,
    addr: u64,
    offset: u64,
    size: u64,
}

impl NewSection {
    /// `.aetrace.text` / `.aetrace.data` / `.aetrace.rodata` for the file
    /// bytes of a caller's segment, `.aetrace.bss` for its zero-filled tail.
    fn of_segment(flags: u32, offset: u64, vaddr: u64, len: u64, mem_size: u64) -> Vec<NewSection> {
        let mut sh_flags = u64::from(SHF_ALLOC);
        if flags & PF_W != 0 {
            sh_flags |= u64::from(SHF_WRITE);
        }
        if flags & PF_X != 0 {
            sh_flags |= u64::from(SHF_EXECINSTR);
        }
        let name = if flags & PF_X != 0 {
            ".aetrace.text"
        } else if flags & PF_W != 0 {
            ".aetrace.data"
        } else {
            ".aetrace.rodata"
        };
        let mut v = Vec::new();
        if len > 0 {
            v.push(NewSection {
                name,
                sh_type: SHT_PROGBITS,
                flags: sh_flags,
                addr: vaddr,
                offset,
                size: len,
                align: 16,
                entsize: 0,
            });
        }
        if mem_size > len {
            v.push(NewSection {
                name: ".aetrace.bss",
                sh_type: SHT_NOBITS,
                flags: sh_flags & !u64::from(SHF_EXECINSTR),
                addr: vaddr + len,
                offset: offset + len,
                size: mem_size - len,
                align: 1,
                entsize: 0,
            });
        }
        v
    }
}

fn shdr_bytes(s: &SectionHeader) -> [u8; SHDR_SIZE as usize] {
    let mut b = [0u8; SHDR_SIZE as usize];
    b[0..4].copy_from_slice(&(s.sh_name as u32).to_le_bytes());
    b[4..8].copy_from_slice(&s.sh_type.to_le_bytes());
    b[8..16].copy_from_slice(&s.sh_flags.to_le_bytes());
    b[16..24].copy_from_slice(&s.sh_addr.to_le_bytes());
    b[24..32].copy_from_slice(&s.sh_offset.to_le_bytes());
    b[32..40].copy_from_slice(&s.sh_size.to_le_bytes());
    b[40..44].copy_from_slice(&s.sh_link.to_le_bytes());
    b[44..48].copy_from_slice(&s.sh_info.to_le_bytes());
    b[48..56].copy_from_slice(&s.sh_addralign.to_le_bytes());
    b[56..64].copy_from_slice(&s.sh_entsize.to_le_bytes());
    b
}

/// The output's section headers: the original ones, `moved` ones following
/// their bytes, plus `added`. When the original table is an ordinary one (no
/// extended numbering), a new table goes at the end of the file with a copy
/// of `.shstrtab` holding the new names; otherwise the old table is kept in
/// place, only `.dynamic`'s entry edited, and nothing added.
fn section_table(
    img: &Image,
    out: &mut Vec<u8>,
    added: &[NewSection],
    moved: &[SectionMove],
) -> Result<()> {
    let mut shdrs = img.shdrs.clone();
    for m in moved {
        if let Some(s) = shdrs.get_mut(m.index) {
            s.sh_addr = m.addr;
            s.sh_offset = m.offset;
            s.sh_size = m.size;
        }
    }
    let h = &img.header;
    let strndx = usize::from(h.e_shstrndx);
    let strtab = shdrs
        .get(strndx)
        .filter(|s| s.sh_type == SHT_STRTAB)
        .and_then(|s| {
            let off = usize::try_from(s.sh_offset).ok()?;
            img.bytes
                .get(off..off.checked_add(usize::try_from(s.sh_size).ok()?)?)
        });
    let ordinary =
        usize::from(h.e_shnum) == shdrs.len() && shdrs.len() + added.len() < SHN_LORESERVE as usize;
    let Some(strtab) = strtab.filter(|_| ordinary) else {
        // Keep the table where it is, with the moved entries edited.
        for (i, (new, old)) in shdrs.iter().zip(&img.shdrs).enumerate() {
            if new != old {
                put(out, h.e_shoff + i as u64 * SHDR_SIZE, &shdr_bytes(new))
                    .ok_or_else(|| img.malformed("a section header is outside the file"))?;
            }
        }
        return Ok(());
    };
    let mut names = strtab.to_vec();
    for s in added {
        let sh_name = names.len();
        names.extend_from_slice(s.name.as_bytes());
        names.push(0);
        shdrs.push(SectionHeader {
            sh_name,
            sh_type: s.sh_type,
            sh_flags: s.flags,
            sh_addr: s.addr,
            sh_offset: s.offset,
            sh_size: s.size,
            sh_link: 0,
            sh_info: 0,
            sh_addralign: s.align,
            sh_entsize: s.entsize,
        });
    }
    shdrs[strndx].sh_offset = out.len() as u64;
    shdrs[strndx].sh_size = names.len() as u64;
    out.extend_from_slice(&names);
    out.resize(out.len().next_multiple_of(8), 0);
    let shoff = out.len() as u64;
    for s in &shdrs {
        out.extend_from_slice(&shdr_bytes(s));
    }
    out[40..48].copy_from_slice(&shoff.to_le_bytes());
    out[60..62].copy_from_slice(&(shdrs.len() as u16).to_le_bytes());
    Ok(())
}

/// The output invariants of the module documentation, for `debug_assert!`:
/// every load congruent and inside the file, and each new load (`new`) on
/// pages no other load touches.
fn check_layout(table: &[ProgramHeader], new: &[ProgramHeader], file_len: u64) -> bool {
    let pages = |p: &ProgramHeader| (p.p_vaddr / PAGE, (p.p_vaddr + p.p_memsz).div_ceil(PAGE));
    let loads: Vec<&ProgramHeader> = table.iter().filter(|p| p.p_type == PT_LOAD).collect();
    loads.iter().all(|p| {
        p.p_vaddr.wrapping_sub(p.p_offset) % PAGE == 0 && p.p_offset + p.p_filesz <= file_len
    }) && loads.windows(2).all(|w| w[0].p_vaddr <= w[1].p_vaddr)
        && new.iter().all(|n| {
            let (a, b) = pages(n);
            loads
                .iter()
                .filter(|p| p.p_vaddr != n.p_vaddr)
                .all(|p| pages(p).1 <= a || pages(p).0 >= b)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GZIP: &str = "/usr/bin/gzip";

    fn u64_at(bytes: &[u8], off: u64) -> Option<u64> {
        get::<8>(bytes, off).map(u64::from_le_bytes)
    }

    fn gzip() -> Vec<u8> {
        std::fs::read(GZIP).unwrap()
    }

    fn preinit_at(elf: &[u8]) -> Additions {
        let at = first_free_vaddr(elf, 0).unwrap();
        Additions {
            segments: vec![NewSegment {
                vaddr: at,
                flags: 5,
                bytes: vec![0xc3],
                mem_size: 1,
            }],
            preinit: Some(at),
            ..Additions::default()
        }
    }

    #[test]
    fn not_elf_and_empty_input_are_refused() {
        let p = Path::new("x");
        for bytes in [&b""[..], b"\x7fEL", b"#!/bin/sh\necho hi\n"] {
            assert!(matches!(
                write(p, bytes, &Additions::default()),
                Err(Error::Analysis(aetrace_analysis::Error::NotElf { .. }))
            ));
            assert!(first_free_vaddr(bytes, 0).is_err());
        }
    }

    /// Every prefix length of interest gives an error, never a panic; the
    /// ones that cut the headers or a segment are `Malformed`.
    #[test]
    fn truncated_elf_is_refused() {
        let elf = gzip();
        let add = preinit_at(&elf);
        let mut lens: Vec<usize> = (0..0x400).step_by(7).collect();
        lens.extend([
            0x2000,
            0x10000,
            elf.len() / 2,
            elf.len() - 0x800,
            elf.len() - 1,
        ]);
        for len in lens {
            let r = write(Path::new("t"), &elf[..len], &add);
            assert!(r.is_err(), "prefix of {len} bytes accepted");
            if (64..0x10000).contains(&len) {
                assert!(
                    matches!(
                        r,
                        Err(Error::Analysis(aetrace_analysis::Error::Malformed { .. }))
                    ),
                    "{len}: {r:?}"
                );
            }
        }
    }

    /// Overwriting any byte of the headers, the notes or `.dynamic` with
    /// 0x00 or 0xff gives a result or an error, never a panic (the
    /// debug-build invariant checks run on every success).
    #[test]
    fn corrupted_headers_never_panic() {
        // A small PIE with a small `.bss`, to keep the debug build fast.
        let path = Path::new("/usr/bin/true");
        let elf = std::fs::read(path).unwrap();
        let add = preinit_at(&elf);
        let img = Image::parse(path, &elf).unwrap();
        let dynamic = img.phdrs.iter().find(|p| p.p_type == PT_DYNAMIC).unwrap();
        let dyn_range = dynamic.p_offset as usize..(dynamic.p_offset + dynamic.p_filesz) as usize;
        for i in (0..0x3a0).chain(dyn_range) {
            for v in [0x00, 0xff] {
                let mut bad = elf.clone();
                bad[i] = v;
                let _ = write(Path::new("c"), &bad, &add);
                let _ = first_free_vaddr(&bad, 0);
            }
        }
    }

    /// The structure of a rewritten gzip: loads sorted and congruent, the
    /// table at `base + e_phoff` inside a load and named by `PT_PHDR`, the
    /// new preinit array with one more RELATIVE relocation first.
    #[test]
    fn rewritten_gzip_structure() {
        let elf = gzip();
        let add = preinit_at(&elf);
        let out = write(Path::new(GZIP), &elf, &add).unwrap();
        let new = Image::parse(Path::new("out"), &out).unwrap();
        let table_loads: Vec<u64> = new
            .phdrs
            .iter()
            .filter(|p| p.p_type == PT_LOAD)
            .map(|p| p.p_vaddr)
            .collect();
        assert!(table_loads.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(table_loads.len(), 4 + 3);
        assert_eq!(new.phdrs[0].p_type, PT_PHDR);
        assert_eq!(new.phdrs[0].p_vaddr, new.base() + new.header.e_phoff);
        assert_eq!(new.phdrs[0].p_filesz, new.phdrs.len() as u64 * PHDR_SIZE);
        assert!(
            new.offset_of(new.phdrs[0].p_vaddr, new.phdrs[0].p_filesz) == Some(new.header.e_phoff)
        );
        assert!(first_free_vaddr(&elf, 0).unwrap() > new.phdrs[0].p_vaddr);

        let old_dyn = read_dynamic(&Image::parse(Path::new(GZIP), &elf).unwrap()).unwrap();
        let dynamic = read_dynamic(&new).unwrap();
        assert_eq!(
            dynamic.used.len(),
            old_dyn.used.len() + 2,
            "two spare slots used"
        );
        assert_eq!(dynamic.spare, old_dyn.spare - 2);
        let arr = dynamic.get(DT_PREINIT_ARRAY).unwrap();
        assert_eq!(dynamic.get(DT_PREINIT_ARRAYSZ), Some(8));
        assert_eq!(
            dynamic.get(DT_RELACOUNT),
            old_dyn.get(DT_RELACOUNT).map(|c| c + 1)
        );
        assert_eq!(
            dynamic.get(DT_RELASZ),
            old_dyn.get(DT_RELASZ).map(|c| c + RELA_SIZE)
        );
        let relas = old_relas(&new, &dynamic).unwrap();
        assert_eq!(
            relas[0],
            (arr, u64::from(R_X86_64_RELATIVE), add.segments[0].vaddr)
        );
        assert_eq!(
            &relas[1..],
            &old_relas(&Image::parse(Path::new(GZIP), &elf).unwrap(), &old_dyn).unwrap()[..]
        );
        assert_eq!(
            u64_at(&out, new.offset_of(arr, 8).unwrap()),
            Some(add.segments[0].vaddr)
        );
    }

    /// A shared object's init function: first in a new `DT_INIT_ARRAY`,
    /// then the old constructors (their addends from their RELATIVE
    /// relocations), each entry relocated; refused for an executable and
    /// together with a preinit.
    #[test]
    fn init_function_of_a_shared_object() {
        let path = Path::new("/lib/x86_64-linux-gnu/libbz2.so.1.0");
        let elf = std::fs::read(path).unwrap();
        let mut add = preinit_at(&elf);
        add.init = add.preinit.take();
        let out = write(path, &elf, &add).unwrap();
        let old = Image::parse(path, &elf).unwrap();
        let old_dyn = read_dynamic(&old).unwrap();
        let new = Image::parse(Path::new("out"), &out).unwrap();
        let dynamic = read_dynamic(&new).unwrap();
        let (arr, size) = (
            dynamic.get(DT_INIT_ARRAY).unwrap(),
            dynamic.get(DT_INIT_ARRAYSZ).unwrap(),
        );
        let old_size = old_dyn.get(DT_INIT_ARRAYSZ).unwrap();
        assert_eq!(size, old_size + 8);
        let relas = old_relas(&new, &dynamic).unwrap();
        let old_relas = old_relas(&old, &old_dyn).unwrap();
        let n = (size / 8) as usize;
        assert_eq!(
            relas[0],
            (arr, u64::from(R_X86_64_RELATIVE), add.segments[0].vaddr)
        );
        for (i, rela) in relas.iter().enumerate().take(n).skip(1) {
            let at = old_dyn.get(DT_INIT_ARRAY).unwrap() + 8 * (i as u64 - 1);
            let was = old_relas.iter().find(|r| r.0 == at).unwrap();
            assert_eq!(*rela, (arr + 8 * i as u64, was.1, was.2));
        }
        assert_eq!(&relas[n..], &old_relas[..]);
        assert_eq!(
            dynamic.get(DT_RELACOUNT),
            old_dyn.get(DT_RELACOUNT).map(|c| c + n as u64)
        );
        assert!(dynamic.get(DT_PREINIT_ARRAY).is_none());
        // Not for an executable; not both.
        let gz = gzip();
        let mut add = preinit_at(&gz);
        add.init = add.preinit.take();
        assert!(write(Path::new(GZIP), &gz, &add).is_err());
        let mut add = preinit_at(&elf);
        add.init = add.preinit;
        assert!(write(path, &elf, &add).is_err());
    }

    /// Detached additions: the original program headers, the segments'
    /// bytes in the file where the descriptor says, the tag naming the
    /// descriptor; an init function is refused.
    #[test]
    fn detached_additions_of_a_shared_object() {
        let path = Path::new("/lib/x86_64-linux-gnu/libbz2.so.1.0");
        let elf = std::fs::read(path).unwrap();
        assert!(can_detach(&elf).unwrap());
        let at = first_free_vaddr(&elf, DETACH_GAP).unwrap();
        let segments: Vec<NewSegment> = [(5, 0xc3u8), (6, 0x5a)]
            .iter()
            .enumerate()
            .map(|(i, &(flags, byte))| NewSegment {
                vaddr: at + 2 * PAGE * i as u64,
                flags,
                bytes: vec![byte; 100 + i],
                mem_size: 100 + i as u64,
            })
            .collect();
        let add = Additions {
            segments: segments.clone(),
            heap_gap: DETACH_GAP,
            detached: true,
            search_first: None,
            ..Additions::default()
        };
        let out = write(path, &elf, &add).unwrap();
        let (old, new) = (
            Image::parse(path, &elf).unwrap(),
            Image::parse(Path::new("out"), &out).unwrap(),
        );
        assert_eq!(new.phdrs, old.phdrs);
        let dynamic = read_dynamic(&new).unwrap();
        assert_eq!(dynamic.spare + 1, read_dynamic(&old).unwrap().spare);
        let desc = dynamic.get(detach::DT_ADDITIONS).unwrap();
        let word = |i: u64| u64::from_le_bytes(get::<8>(&out, desc + 8 * i).unwrap());
        assert_eq!((word(0), word(1)), (detach::MAGIC, 2));
        let prots = [5, 3];
        for (i, s) in segments.iter().enumerate() {
            let e = 2 + 4 * i as u64;
            assert_eq!(
                (word(e), word(e + 1), word(e + 3)),
                (s.vaddr, PAGE, prots[i])
            );
            let off = word(e + 2) as usize;
            assert_eq!(off as u64 % PAGE, 0);
            assert_eq!(&out[off..off + s.bytes.len()], &s.bytes[..]);
        }
        let mut init = add.clone();
        init.init = Some(at);
        assert!(matches!(
            write(path, &elf, &init),
            Err(Error::Rewrite {
                what: Refusal::Detached(_),
                ..
            })
        ));
    }

    #[test]
    fn start_addresses_outside_code_are_refused() {
        let elf = gzip();
        let mut add = preinit_at(&elf);
        let data = add.segments[0].vaddr + 0x1000;
        add.segments.push(NewSegment {
            vaddr: data,
            flags: PF_R | PF_W,
            bytes: vec![0; 16],
            mem_size: 16,
        });
        for (preinit, entry) in [(Some(data), None), (add.preinit, Some(data + 0x1000))] {
            let add = Additions {
                preinit,
                entry,
                ..add.clone()
            };
            let r = write(Path::new("g"), &elf, &add);
            assert!(
                matches!(
                    r,
                    Err(Error::Rewrite {
                        what: Refusal::NotExecutable { .. },
                        ..
                    })
                ),
                "{r:?}"
            );
        }
        assert!(write(Path::new("g"), &elf, &add).is_ok());
    }

    #[test]
    fn preinit_is_refused_where_no_loader_would_run_it() {
        // A static executable: made from gzip by blanking PT_INTERP, which
        // is enough for the check (no compiler in unit tests).
        let mut elf = gzip();
        let img = Image::parse(Path::new(GZIP), &elf).unwrap();
        let i = img
            .phdrs
            .iter()
            .position(|p| p.p_type == PT_INTERP)
            .unwrap();
        let at = img.header.e_phoff as usize + i * PHDR_SIZE as usize;
        elf[at..at + 4].copy_from_slice(&0u32.to_le_bytes()); // PT_NULL
        let add = preinit_at(&elf);
        let r = write(Path::new("s"), &elf, &add);
        assert!(
            matches!(
                r,
                Err(Error::Rewrite {
                    what: Refusal::PreinitStatic,
                    ..
                })
            ),
            "{r:?}"
        );
    }
}
