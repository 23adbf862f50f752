//! C++ exception tables: the language-specific data areas (LSDAs) that
//! `.eh_frame` FDEs point to through their CIE's `L` augmentation, as gcc
//! and clang emit them in `.gcc_except_table` (Itanium C++ ABI, "Exception
//! Handling Tables"; the layout libstdc++'s `__gxx_personality_v0` parses).
//!
//! An LSDA is a header (landing-pad base, type-table encoding and offset,
//! call-site encoding and table length), the call-site table (`start`,
//! `len`, `landing pad`, `action` per record, offsets from the FDE's start),
//! the action table (pairs of sleb128: type filter, displacement of the next
//! action), the type table (growing down from its base, one encoded pointer
//! per positive filter) and, after that base, the exception-specification
//! lists (uleb128 type indices ended by 0) that negative filters index.
//!
//! The rewriter needs two things from them: every landing pad must start a
//! block ([`landing_pads_by_fde`], used by CFG recovery: a procedure
//! whose LSDA cannot be read exactly is not analysed), and the relocated
//! copies need new LSDAs whose ranges and landing pads are in the copy
//! ([`Lsda::parse`], [`Lsda::encode`], used by `rewrite::unwind`).
//!
//! Invariants: parsing never panics on bad bytes (every read is checked and
//! returns a message naming the LSDA address); a parsed [`Lsda`] holds
//! absolute addresses only, so it can be re-encoded anywhere; encoding
//! refuses what it cannot represent exactly instead of truncating.

use std::collections::BTreeMap;

use gimli::leb128::write::Leb128;
use gimli::{leb128, BaseAddresses, CieOrFde, EhFrame, EndianSlice, LittleEndian, UnwindSection};

use crate::elf::Module;
use crate::error::{Error, Result};

/// `DW_EH_PE_omit`.
pub const OMIT: u8 = 0xff;
const PE_ULEB128: u8 = 0x01;
const PE_PCREL: u8 = 0x10;
/// Filters and chains walked per LSDA before we call the action table cyclic.
const MAX_ACTIONS: usize = 1 << 16;

/// One call-site record, in absolute addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallSite {
    /// Absolute start address of the covered range.
    pub start: u64,
    /// Length of the covered range in bytes.
    pub len: u64,
    /// Where the unwinder transfers control, if anywhere.
    pub landing_pad: Option<u64>,
    /// 0: cleanup only; else 1 + the byte offset of the first action.
    pub action: u64,
}

/// The type table and what follows its base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeTable {
    /// Pointer encoding of the entries (fixed size: 2, 4 or 8 bytes).
    pub encoding: u8,
    /// `entries[i - 1]` is the absolute value for filter `i` (the address of
    /// a `type_info`, or of a slot holding it when `encoding` is indirect;
    /// 0 for `catch (...)`).
    pub entries: Vec<u64>,
    /// The exception-specification lists after the base (position
    /// independent: uleb128 indices).
    pub specs: Vec<u8>,
}

/// A parsed LSDA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lsda {
    /// Sorted by `start` (the personality routine stops at the first record
    /// past the pc).
    pub call_sites: Vec<CallSite>,
    /// The action table's bytes (position independent).
    pub actions: Vec<u8>,
    /// The type table, if the LSDA has one.
    pub types: Option<TypeTable>,
}

/// Why an LSDA cannot be read or written exactly.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LsdaError {
    /// The LSDA at `lsda` is malformed or uses a form not handled.
    #[error("LSDA at {lsda:#x}: {what}")]
    Malformed {
        /// Address of the LSDA.
        lsda: u64,
        /// What is wrong.
        what: Malformed,
    },
    /// The FDE's LSDA pointer is indirect.
    #[error("FDE at {fde:#x}: indirect LSDA pointer {pointer:#x}")]
    IndirectPointer {
        /// Address of the FDE.
        fde: u64,
        /// The indirect pointer's value.
        pointer: u64,
    },
    /// Encoding: a call site or landing pad before the FDE's start.
    #[error("{what} {addr:#x} lies before its FDE's start {region:#x}")]
    BeforeRegion {
        /// "call site" or "landing pad".
        what: &'static str,
        /// The address.
        addr: u64,
        /// The FDE's start address.
        region: u64,
    },
    /// Encoding: a landing pad at offset 0 reads as none.
    #[error("landing pad {0:#x} at its FDE's start")]
    PadAtRegionStart(u64),
    #[error("type encoding {0:#x} is not fixed-size")]
    /// Encoding: the type table's pointer encoding has no fixed size.
    TypeEncodingNotFixed(u8),
    #[error("no consistent type table offset")]
    /// Encoding: no type table offset is consistent with its own uleb128 length and the padding.
    NoTypeTableOffset,
    #[error("unsupported type pointer application {0:#x}")]
    /// Encoding: a type entry uses a pointer application other than absolute or pc-relative.
    TypePointerApplication(u8),
    #[error("encoding {0:#x} is not fixed-size")]
    /// Encoding: a pointer encoding has no fixed size.
    NotFixedSize(u8),
    #[error("{value:#x} does not fit pointer encoding {enc:#x}")]
    /// Encoding: a value cannot be written in the given pointer encoding.
    DoesNotFit {
        /// The value.
        value: u64,
        /// The DWARF pointer encoding (`DW_EH_PE_*`).
        enc: u8,
    },
}

/// What is wrong with an LSDA's bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("cut short at {0:#x}")]
    /// The data ends before the given address.
    CutShort(u64),
    #[error("uleb128 overflow at {0:#x}")]
    /// An unsigned LEB128 number at the address does not fit 64 bits.
    UlebOverflow(u64),
    #[error("sleb128 overflow at {0:#x}")]
    /// A signed LEB128 number at the address does not fit 64 bits.
    SlebOverflow(u64),
    #[error("unknown pointer format {format:#x} in encoding {enc:#x}")]
    /// A pointer encoding's low nibble is not a known format.
    PointerFormat {
        /// The format nibble.
        format: u8,
        /// The whole `DW_EH_PE_*` encoding.
        enc: u8,
    },
    #[error("unsupported pointer application {app:#x} at {at:#x}")]
    /// A pointer encoding's application (pcrel, datarel...) is not handled.
    PointerApplication {
        /// The application bits.
        app: u8,
        /// Address of the pointer.
        at: u64,
    },
    #[error("not in a section with file bytes")]
    /// The LSDA is not in a section backed by file bytes.
    NoFileBytes,
    #[error("type table base past the end of its section")]
    /// The type table's base lies past its section's end.
    TypeBasePastEnd,
    #[error("call-site encoding {0:#x} has an application")]
    /// The call-site encoding has application bits (it must be plain offsets).
    CallSiteApplication(u8),
    #[error("call-site table past the end of its section")]
    /// The call-site table runs past its section's end.
    CallSitesPastEnd,
    #[error("the last call-site record overruns the table")]
    /// The last call-site record runs past the table's declared length.
    CallSiteOverrun,
    #[error("call-site records overlap or are not sorted")]
    /// Call-site records are not in ascending, disjoint order.
    CallSitesUnsorted,
    #[error("action offset overflow")]
    /// An action record's offset overflows.
    ActionOffsetOverflow,
    #[error("the action table has a cycle")]
    /// Following the action chain loops.
    ActionCycle,
    #[error("action displacement before the table")]
    /// An action record's next displacement points before the action table.
    ActionBeforeTable,
    #[error("type filters without a type table")]
    /// Actions use type filters but the LSDA has no type table.
    FiltersWithoutTypes,
    #[error("type table encoding {0:#x} is not fixed-size")]
    /// The type table's encoding has no fixed size.
    TypeTableNotFixed(u8),
    #[error("{0} type entries do not fit before the base")]
    /// The given number of type entries would start before address 0.
    TypesDoNotFit(usize),
    #[error("the type table overlaps the action table")]
    /// The type table overlaps the action table.
    TypesOverlapActions,
    #[error("type entry {i} at {at:#x} is relocated at load time")]
    /// A type entry is written by a dynamic relocation, so its file bytes are not its value.
    RelocatedTypeEntry {
        /// The filter index.
        i: usize,
        /// Address of the entry.
        at: u64,
    },
}

fn fail<T>(lsda: u64, what: Malformed) -> std::result::Result<T, LsdaError> {
    Err(LsdaError::Malformed { lsda, what })
}

/// A checked reader over the bytes of the section holding an LSDA.
struct Cursor<'a> {
    bytes: &'a [u8],
    /// Address of `bytes[0]`.
    base: u64,
    pos: usize,
    /// The LSDA's address, for messages.
    lsda: u64,
}

impl Cursor<'_> {
    fn addr(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn take(&mut self, n: usize) -> std::result::Result<&[u8], LsdaError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(e) => {
                let s = &self.bytes[self.pos..e];
                self.pos = e;
                Ok(s)
            }
            None => fail(self.lsda, Malformed::CutShort(self.addr())),
        }
    }

    fn u8(&mut self) -> std::result::Result<u8, LsdaError> {
        Ok(self.take(1)?[0])
    }

    fn uleb(&mut self) -> std::result::Result<u64, LsdaError> {
        let (mut v, mut shift) = (0u64, 0u32);
        loop {
            let b = self.u8()?;
            if shift >= 64 || (shift == 63 && b & 0x7e != 0) {
                return fail(self.lsda, Malformed::UlebOverflow(self.addr()));
            }
            v |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
    }

    fn sleb(&mut self) -> std::result::Result<i64, LsdaError> {
        let (mut v, mut shift) = (0i64, 0u32);
        loop {
            let b = self.u8()?;
            if shift >= 64 {
                return fail(self.lsda, Malformed::SlebOverflow(self.addr()));
            }
            v |= i64::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                if shift < 64 && b & 0x40 != 0 {
                    v |= -1i64 << shift;
                }
                return Ok(v);
            }
        }
    }

    /// A value in pointer format `enc & 0x0f` (application ignored).
    fn value(&mut self, enc: u8) -> std::result::Result<u64, LsdaError> {
        let fixed = |c: &mut Self, n: usize, signed: bool| -> std::result::Result<u64, LsdaError> {
            let b = c.take(n)?;
            let mut raw = [0u8; 8];
            raw[..n].copy_from_slice(b);
            let v = u64::from_le_bytes(raw);
            Ok(if signed && n < 8 {
                let sh = 64 - 8 * n as u32;
                (((v << sh) as i64) >> sh) as u64
            } else {
                v
            })
        };
        match enc & 0x0f {
            0x00 => fixed(self, 8, false),
            0x01 => self.uleb(),
            0x02 => fixed(self, 2, false),
            0x03 => fixed(self, 4, false),
            0x04 => fixed(self, 8, false),
            0x09 => self.sleb().map(|v| v as u64),
            0x0a => fixed(self, 2, true),
            0x0b => fixed(self, 4, true),
            0x0c => fixed(self, 8, true),
            f => fail(self.lsda, Malformed::PointerFormat { format: f, enc }),
        }
    }

    /// A pointer in encoding `enc`: absolute or pc-relative only (what gcc
    /// and clang emit on x86-64). A raw 0 stays 0 (a null pointer).
    fn pointer(&mut self, enc: u8) -> std::result::Result<u64, LsdaError> {
        let at = self.addr();
        let v = self.value(enc)?;
        match enc & 0x70 {
            _ if v == 0 => Ok(0),
            0x00 => Ok(v),
            PE_PCREL => Ok(at.wrapping_add(v)),
            a => fail(self.lsda, Malformed::PointerApplication { app: a, at }),
        }
    }
}

/// Size of a fixed-size pointer format, `None` for leb128 ones.
fn fixed_size(enc: u8) -> Option<usize> {
    match enc & 0x0f {
        0x00 | 0x04 | 0x0c => Some(8),
        0x02 | 0x0a => Some(2),
        0x03 | 0x0b => Some(4),
        _ => None,
    }
}

/// Writes `v` in the fixed-size format of `enc`, refusing values that do
/// not fit.
fn put_fixed(out: &mut Vec<u8>, enc: u8, v: u64) -> std::result::Result<(), LsdaError> {
    let n = fixed_size(enc).ok_or(LsdaError::NotFixedSize(enc))?;
    let signed = enc & 0x08 != 0;
    let fits = match (n, signed) {
        (8, _) => true,
        (n, false) => v >> (8 * n) == 0,
        (n, true) => {
            let sh = 64 - 8 * n as u32;
            ((((v << sh) as i64) >> sh) as u64) == v
        }
    };
    if !fits {
        return Err(LsdaError::DoesNotFit { value: v, enc });
    }
    out.extend_from_slice(&v.to_le_bytes()[..n]);
    Ok(())
}

impl Lsda {
    /// Parses the LSDA at `addr` of the FDE starting at `region` (call-site
    /// offsets and, by default, landing pads are relative to it);
    /// `relocs` are the module's load-time relocations.
    pub fn parse(
        module: &Module,
        relocs: &LoadRelocs,
        addr: u64,
        region: u64,
    ) -> std::result::Result<Lsda, LsdaError> {
        let sec = module
            .sections
            .iter()
            .find(|s| s.alloc && s.file_offset.is_some() && s.contains(addr));
        let Some(bytes) = sec.and_then(|s| module.bytes_at(addr, s.end() - addr)) else {
            return fail(addr, Malformed::NoFileBytes);
        };
        Lsda::parse_bytes(bytes, addr, region, &|at, n| relocs.touch(at, n))
    }

    /// [`Lsda::parse`] on `bytes`, which start at `addr` and run to the end
    /// of their section; `relocated(at, n)` tells whether the loader
    /// rewrites any of the `n` bytes at `at`.
    pub fn parse_bytes(
        bytes: &[u8],
        addr: u64,
        region: u64,
        relocated: &dyn Fn(u64, u64) -> bool,
    ) -> std::result::Result<Lsda, LsdaError> {
        let mut c = Cursor {
            bytes,
            base: addr,
            pos: 0,
            lsda: addr,
        };
        let lp_enc = c.u8()?;
        let lp_start = if lp_enc == OMIT {
            region
        } else {
            c.pointer(lp_enc)?
        };
        let tt_enc = c.u8()?;
        let tt_base = if tt_enc == OMIT {
            None
        } else {
            let off = c.uleb()?;
            let base = usize::try_from(off)
                .ok()
                .and_then(|o| c.pos.checked_add(o))
                .filter(|&b| b <= bytes.len());
            match base {
                Some(b) => Some(b),
                None => return fail(addr, Malformed::TypeBasePastEnd),
            }
        };
        let cs_enc = c.u8()?;
        if cs_enc & 0x70 != 0 {
            return fail(addr, Malformed::CallSiteApplication(cs_enc));
        }
        let cs_len = c.uleb()?;
        let cs_end = usize::try_from(cs_len)
            .ok()
            .and_then(|l| c.pos.checked_add(l))
            .filter(|&e| e <= bytes.len());
        let Some(cs_end) = cs_end else {
            return fail(addr, Malformed::CallSitesPastEnd);
        };
        let mut call_sites = Vec::new();
        while c.pos < cs_end {
            let start = c.value(cs_enc)?;
            let len = c.value(cs_enc)?;
            let lp = c.value(cs_enc)?;
            let action = c.uleb()?;
            call_sites.push(CallSite {
                start: region.wrapping_add(start),
                len,
                landing_pad: (lp != 0).then(|| lp_start.wrapping_add(lp)),
                action,
            });
        }
        if c.pos != cs_end {
            return fail(addr, Malformed::CallSiteOverrun);
        }
        if call_sites
            .windows(2)
            .any(|w| w[1].start < w[0].start.saturating_add(w[0].len))
        {
            return fail(addr, Malformed::CallSitesUnsorted);
        }
        // The actions reachable from the call sites: their extent, the
        // largest type index, the exception specifications.
        let table = &bytes[cs_end..];
        let mut act = Cursor {
            bytes: table,
            base: addr + cs_end as u64,
            pos: 0,
            lsda: addr,
        };
        let (mut act_end, mut max_type, mut specs) = (0usize, 0u64, Vec::new());
        let mut walked = 0;
        for cs in &call_sites {
            let mut next = match usize::try_from(cs.action) {
                Ok(0) => continue,
                Ok(a) => a - 1,
                Err(_) => return fail(addr, Malformed::ActionOffsetOverflow),
            };
            loop {
                walked += 1;
                if walked > MAX_ACTIONS {
                    return fail(addr, Malformed::ActionCycle);
                }
                act.pos = next;
                let filter = act.sleb()?;
                let disp_at = act.pos;
                let disp = act.sleb()?;
                act_end = act_end.max(act.pos);
                match filter {
                    f if f > 0 => max_type = max_type.max(f as u64),
                    f if f < 0 => specs.push(f.unsigned_abs() - 1),
                    _ => {}
                }
                if disp == 0 {
                    break;
                }
                next = match (disp_at as i64).checked_add(disp) {
                    Some(n) if n >= 0 => n as usize,
                    _ => return fail(addr, Malformed::ActionBeforeTable),
                };
            }
        }
        let actions = table[..act_end].to_vec();
        let types = match tt_base {
            None if max_type > 0 || !specs.is_empty() => {
                return fail(addr, Malformed::FiltersWithoutTypes)
            }
            None => None,
            Some(base) => {
                let Some(size) = fixed_size(tt_enc) else {
                    return fail(addr, Malformed::TypeTableNotFixed(tt_enc));
                };
                // Exception specifications: uleb128 indices ended by 0.
                let mut spec = Cursor {
                    bytes: &bytes[base..],
                    base: addr + base as u64,
                    pos: 0,
                    lsda: addr,
                };
                let mut spec_end = 0;
                for &s in &specs {
                    spec.pos = usize::try_from(s).unwrap_or(usize::MAX);
                    loop {
                        let i = spec.uleb()?;
                        if i == 0 {
                            break;
                        }
                        max_type = max_type.max(i);
                    }
                    spec_end = spec_end.max(spec.pos);
                }
                let n = usize::try_from(max_type).unwrap_or(usize::MAX);
                let Some(first) = n.checked_mul(size).and_then(|s| base.checked_sub(s)) else {
                    return fail(addr, Malformed::TypesDoNotFit(n));
                };
                if first < cs_end + act_end {
                    return fail(addr, Malformed::TypesOverlapActions);
                }
                let mut entries = Vec::with_capacity(n);
                for i in 1..=n {
                    let mut e = Cursor {
                        bytes,
                        base: addr,
                        pos: base - i * size,
                        lsda: addr,
                    };
                    let at = e.addr();
                    if relocated(at, size as u64) {
                        return fail(addr, Malformed::RelocatedTypeEntry { i, at });
                    }
                    entries.push(e.pointer(tt_enc)?);
                }
                Some(TypeTable {
                    encoding: tt_enc,
                    entries,
                    specs: bytes[base..base + spec_end].to_vec(),
                })
            }
        };
        Ok(Lsda {
            call_sites,
            actions,
            types,
        })
    }

    /// Encodes this LSDA to live at `at` for the FDE starting at `region`:
    /// landing pads relative to the region (no explicit base), call sites
    /// in uleb128, the type table re-encoded for its new position.
    pub fn encode(&self, at: u64, region: u64) -> std::result::Result<Vec<u8>, LsdaError> {
        let rel = |a: u64, what: &'static str| {
            a.checked_sub(region).ok_or(LsdaError::BeforeRegion {
                what,
                addr: a,
                region,
            })
        };
        let mut cs = Vec::new();
        for s in &self.call_sites {
            cs.extend_from_slice(Leb128::unsigned(rel(s.start, "call site")?).bytes());
            cs.extend_from_slice(Leb128::unsigned(s.len).bytes());
            match s.landing_pad {
                Some(lp) => {
                    let off = rel(lp, "landing pad")?;
                    if off == 0 {
                        // 0 means "no landing pad": a pad at the FDE's very
                        // start cannot be expressed without a base.
                        return Err(LsdaError::PadAtRegionStart(lp));
                    }
                    cs.extend_from_slice(Leb128::unsigned(off).bytes());
                }
                None => cs.push(0),
            }
            cs.extend_from_slice(Leb128::unsigned(s.action).bytes());
        }
        let mut out = vec![OMIT];
        match &self.types {
            None => out.push(OMIT),
            Some(t) => {
                let size =
                    fixed_size(t.encoding).ok_or(LsdaError::TypeEncodingNotFixed(t.encoding))?;
                out.push(t.encoding);
                // Bytes from after the offset field to the base, with the
                // base aligned to the entry size; the field's own length
                // moves the base, so try each length.
                let body = 1
                    + leb128::write::uleb128_size(cs.len() as u64)
                    + cs.len()
                    + self.actions.len();
                let tables = size * t.entries.len();
                let (off, pad) = (1..=10)
                    .find_map(|l| {
                        let unaligned = at + 2 + l as u64 + (body + tables) as u64;
                        let pad = (unaligned.next_multiple_of(size as u64) - unaligned) as usize;
                        let off = (body + pad + tables) as u64;
                        (leb128::write::uleb128_size(off) == l).then_some((off, pad))
                    })
                    .ok_or(LsdaError::NoTypeTableOffset)?;
                out.extend_from_slice(Leb128::unsigned(off).bytes());
                out.push(PE_ULEB128);
                out.extend_from_slice(Leb128::unsigned(cs.len() as u64).bytes());
                out.extend_from_slice(&cs);
                out.extend_from_slice(&self.actions);
                out.resize(out.len() + pad, 0);
                let base = at + (out.len() + tables) as u64;
                for i in (1..=t.entries.len()).rev() {
                    let v = t.entries[i - 1];
                    let pos = base - (i * size) as u64;
                    let raw = match t.encoding & 0x70 {
                        _ if v == 0 => 0,
                        0x00 => v,
                        PE_PCREL => v.wrapping_sub(pos),
                        a => return Err(LsdaError::TypePointerApplication(a)),
                    };
                    put_fixed(&mut out, t.encoding, raw)?;
                }
                debug_assert_eq!(at + out.len() as u64, base);
                out.extend_from_slice(&t.specs);
                return Ok(out);
            }
        }
        out.push(PE_ULEB128);
        out.extend_from_slice(Leb128::unsigned(cs.len() as u64).bytes());
        out.extend_from_slice(&cs);
        out.extend_from_slice(&self.actions);
        Ok(out)
    }
}

/// Where the loader writes: the offsets of the module's dynamic
/// relocations, sorted (each writes at most 8 bytes).
pub struct LoadRelocs(Vec<u64>);

impl LoadRelocs {
    /// The dynamic relocation offsets of `module`, sorted.
    pub fn of(module: &Module) -> LoadRelocs {
        let mut v: Vec<u64> = module.dyn_relocs.iter().map(|r| r.offset).collect();
        v.sort_unstable();
        LoadRelocs(v)
    }

    /// Whether a relocation writes any of the `n` bytes at `at`.
    fn touch(&self, at: u64, n: u64) -> bool {
        let i = self.0.partition_point(|&r| r.saturating_add(8) <= at);
        self.0.get(i).is_some_and(|&r| r < at.saturating_add(n))
    }
}

/// The module's `.eh_frame` for gimli, with the bases its pointers need.
pub fn eh_frame(
    module: &Module,
) -> Option<(EhFrame<EndianSlice<'_, LittleEndian>>, BaseAddresses, u64)> {
    let sec = module.section(".eh_frame")?;
    let bytes = module.section_bytes(sec)?;
    let mut bases = BaseAddresses::default().set_eh_frame(sec.addr);
    if let Some(t) = module.section(".text") {
        bases = bases.set_text(t.addr);
    }
    if let Some(g) = module.section(".got") {
        bases = bases.set_got(g.addr);
    }
    Some((EhFrame::new(bytes, LittleEndian), bases, sec.addr))
}

/// Per FDE with an LSDA (keyed by the FDE's start): its LSDA, or why it
/// cannot be read exactly.
pub fn lsdas_by_fde(module: &Module) -> BTreeMap<u64, std::result::Result<Lsda, LsdaError>> {
    let mut out = BTreeMap::new();
    let Some((eh, bases, _)) = eh_frame(module) else {
        return out;
    };
    let relocs = LoadRelocs::of(module);
    let mut entries = eh.entries(&bases);
    // A malformed entry ends the walk (as in procedure discovery): the
    // following entries cannot be located.
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else {
            continue;
        };
        let start = fde.initial_address();
        let lsda = match fde.lsda() {
            None => continue,
            Some(gimli::Pointer::Indirect(p)) => Err(LsdaError::IndirectPointer {
                fde: start,
                pointer: p,
            }),
            Some(gimli::Pointer::Direct(a)) => Lsda::parse(module, &relocs, a, start),
        };
        out.insert(start, lsda);
    }
    out
}

/// Per FDE with an LSDA (keyed by the FDE's start): its landing pads,
/// sorted, or why its LSDA cannot be read exactly.
pub fn landing_pads_by_fde(
    module: &Module,
) -> BTreeMap<u64, std::result::Result<Vec<u64>, LsdaError>> {
    lsdas_by_fde(module)
        .into_iter()
        .map(|(start, lsda)| {
            let pads = lsda.map(|l| {
                let mut v: Vec<u64> = l.call_sites.iter().filter_map(|c| c.landing_pad).collect();
                v.sort_unstable();
                v.dedup();
                v
            });
            (start, pads)
        })
        .collect()
}

/// Every call-site range with a landing pad, over all readable LSDAs:
/// `(start, end, landing pad)`, sorted by start.
pub fn call_site_pads(module: &Module) -> Vec<(u64, u64, u64)> {
    let mut out: Vec<(u64, u64, u64)> = lsdas_by_fde(module)
        .into_values()
        .flatten()
        .flat_map(|l| l.call_sites)
        .filter_map(|c| Some((c.start, c.start + c.len, c.landing_pad?)))
        .collect();
    out.sort_unstable();
    out
}

/// Every FDE's landing pads (keyed by the FDE's start); the first LSDA that
/// cannot be read exactly is an error.
pub fn landing_pads(module: &Module) -> Result<BTreeMap<u64, Vec<u64>>> {
    landing_pads_by_fde(module)
        .into_iter()
        .map(|(k, v)| {
            v.map(|pads| (k, pads)).map_err(|e| Error::Malformed {
                path: module.path.clone(),
                what: e.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lsda(types: Option<TypeTable>) -> Lsda {
        let typed = types.is_some();
        Lsda {
            call_sites: vec![
                CallSite {
                    start: 0x1004,
                    len: 5,
                    landing_pad: Some(0x1040),
                    action: if typed { 3 } else { 0 },
                },
                CallSite {
                    start: 0x1010,
                    len: 0x20,
                    landing_pad: None,
                    action: 0,
                },
            ],
            // filter 1, end; filter 2, next = -3 (back to the first record).
            actions: if typed { vec![1, 0, 2, 0x7d] } else { vec![] },
            types,
        }
    }

    fn parse_at(bytes: &[u8], addr: u64, region: u64) -> std::result::Result<Lsda, LsdaError> {
        Lsda::parse_bytes(bytes, addr, region, &|_, _| false)
    }

    #[test]
    fn encode_then_parse_round_trips_at_any_address() {
        let types = TypeTable {
            encoding: 0x9b,
            entries: vec![0x5000, 0],
            specs: vec![],
        };
        for types in [None, Some(types)] {
            let l = lsda(types.clone());
            for at in [0x3000u64, 0x3001, 0x3003] {
                let bytes = l.encode(at, 0x1000).unwrap();
                let back = parse_at(&bytes, at, 0x1000).unwrap();
                assert_eq!(back, l, "at {at:#x}");
            }
        }
    }

    #[test]
    fn relocations_touch_the_bytes_they_write() {
        let r = LoadRelocs(vec![0x100, 0x200]);
        assert!(r.touch(0x100, 4) && r.touch(0x104, 4) && r.touch(0x0fc, 8));
        assert!(!r.touch(0x108, 4) && !r.touch(0x0fc, 4) && !r.touch(0x1f8, 8));
        assert!(r.touch(0x1f8, 9) && !r.touch(u64::MAX - 3, 4));
    }

    #[test]
    fn bad_bytes_are_errors_not_panics() {
        let good = lsda(Some(TypeTable {
            encoding: 0x1b,
            entries: vec![0x5000, 0x5008],
            specs: vec![],
        }))
        .encode(0x3000, 0x1000)
        .unwrap();
        for cut in 0..good.len() {
            let _ = parse_at(&good[..cut], 0x3000, 0x1000);
        }
        let mut flipped = good.clone();
        for i in 0..flipped.len() {
            for b in [0x00, 0x7f, 0x80, 0xff] {
                let old = flipped[i];
                flipped[i] = b;
                let _ = parse_at(&flipped, 0x3000, 0x1000);
                flipped[i] = old;
            }
        }
        assert!(parse_at(&[0xff, 0xff, 0x01, 0x05, 0x00], 0x3000, 0x1000).is_err());
    }
}
