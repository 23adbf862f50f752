//! Linking (docs/rewrite.md, step 7): the runtime with its symbols filled
//! in, the code segment (jump tables, then the copies), the springboards
//! and redirected GOT slots patched into the original, the unwind and
//! counter segments, and the new ELF (`elfout`).
//!
//! Invariants:
//! - every GOT slot redirected to a LAZY piece belongs to a PLT stub
//!   chosen for it (`calls::recorded_stubs`), and the other way round;
//! - a springboard is a `jmp rel32` of [`SPRINGBOARD`] bytes at a traced
//!   procedure's entry, to its copy's outside-entry stub;
//! - a retargeted call or jump of untraced code changes only its rel32
//!   field, to its callee's preserving stub;
//! - a patch in the code ld.so runs before the runtime's init
//!   (`Traced::early`) is made by the executable's runtime at its init,
//!   not in the file (`Additions::late_patches`);
//! - an executable runs the runtime's init (or, counting, the init code)
//!   from its preinit array, a static one from its new entry point, a
//!   library from a new first init function.

use crate::calls::Calls;
use crate::elfout::{self, Additions, NewSegment, Patch};
use crate::emit::{Emitted, Runtime};
use crate::traced::SPRINGBOARD;
use crate::{Refusal, Result, Rewrite};

/// The rewritten module's bytes.
pub(crate) fn link(
    rw: &Rewrite<'_>,
    runtime: &Runtime,
    calls: &Calls<'_>,
    emitted: Emitted,
    image: u64,
) -> Result<Vec<u8>> {
    let module = &rw.prog.module;
    let blob = &runtime.blob;
    let blob_bytes = runtime_bytes(rw, runtime, &emitted, image)?;
    check_lazy_slots(rw, calls, &emitted)?;
    let (late_patches, patches) = patches(rw, &emitted)?
        .into_iter()
        .partition(|p| calls.traced.patched_at_init(rw.prog, p.vaddr));
    let data = blob.data_offset as usize;
    let init = runtime.vaddr
        + blob
            .symbol("init")
            .ok_or_else(|| rw.err(Refusal::RuntimeLacks("init")))?;
    let code = &emitted.code;
    let preinit = emitted.counted.as_ref().map(|c| c.preinit);
    let copy_of_entry = || {
        code.springboards
            .iter()
            .find(|&&(from, _)| from == module.entry)
            .map(|&(_, to)| to)
    };
    let mut add = Additions {
        segments: vec![
            NewSegment {
                vaddr: runtime.vaddr,
                flags: 5,
                mem_size: data as u64,
                bytes: blob_bytes[..data].to_vec(),
            },
            NewSegment {
                vaddr: runtime.vaddr + data as u64,
                flags: 6,
                mem_size: (blob_bytes.len() - data) as u64,
                bytes: blob_bytes[data..].to_vec(),
            },
            code_segment(runtime, &emitted),
        ],
        patches,
        late_patches,
        preinit: (!rw.library && !module.is_static).then(|| preinit.unwrap_or(init)),
        // A library's counters are mapped by its own first constructor.
        init: preinit.filter(|_| rw.library),
        entry: if module.is_static {
            emitted
                .counted
                .as_ref()
                .and_then(|c| c.static_entry)
                .or_else(copy_of_entry)
        } else {
            None
        },
        eh_frame_hdr: emitted.unwind.as_ref().map(|u| (u.hdr_vaddr, u.hdr_size)),
        eh_frame: emitted
            .unwind
            .as_ref()
            .map(|u| (u.eh_frame.0, u.eh_frame.1 - u.eh_frame.0)),
        heap_gap: rw.heap_gap(),
        detached: rw.detached,
        search_first: rw.search_first.clone(),
    };
    if let Some(u) = emitted.unwind {
        add.segments.push(NewSegment {
            vaddr: u.hdr_vaddr,
            // Read-only, and executable for the wrapper personality.
            flags: if u.wrapper.is_some() { 5 } else { 4 },
            mem_size: u.bytes.len() as u64,
            bytes: u.bytes,
        });
    }
    if let Some(c) = emitted.counted {
        add.segments.extend(c.segments);
    }
    insn_table(rw, runtime, &emitted.code, &mut add.segments)?;
    if rw.detached {
        // No PT_LOAD holds the runtime: its words go into the segment's
        // bytes first.
        let end = add.segments.iter().map(|s| s.vaddr + s.mem_size).max();
        let end = end.unwrap_or(runtime.vaddr);
        let used = end - elfout::added_start(module.bytes(), rw.heap_gap())? + rw.size;
        if used > elfout::DETACH_SLOT {
            return Err(rw.err(Refusal::Detached(
                "the image and its additions are larger than a slot (DETACH_SLOT)",
            )));
        }
        let fields = added_range(rw, runtime, end, None)?;
        for (off, value) in fields {
            let at = off as usize - data;
            add.segments[1].bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
        return elfout::write(rw.path, module.bytes(), &add);
    }
    let mut out = elfout::write(rw.path, module.bytes(), &add)?;
    let fields = added_range(
        rw,
        runtime,
        elfout::image_end(&out)?,
        elfout::dynamic_vaddr(&out)?,
    )?;
    for (off, value) in fields {
        elfout::patch_vaddr(&mut out, runtime.vaddr + off, &value.to_le_bytes())?;
    }
    Ok(out)
}

/// The table of instruction starts (`insnmap`) in a read-only segment
/// on the page after the others, its offset from the blob in the blob's
/// data page (`insn_table`, segment 1).
fn insn_table(
    rw: &Rewrite<'_>,
    runtime: &Runtime,
    code: &crate::codegen::Copies,
    segments: &mut Vec<NewSegment>,
) -> Result<()> {
    let end = segments.iter().map(|s| s.vaddr + s.mem_size).max();
    let vaddr = end.unwrap_or(runtime.vaddr).next_multiple_of(crate::PAGE);
    let bytes = crate::insnmap::table(&code.procs, runtime.vaddr, rw.data != crate::DataMode::Off);
    let sym = "insn_table";
    let off = runtime
        .blob
        .symbol(sym)
        .ok_or_else(|| rw.err(Refusal::RuntimeLacks(sym)))?;
    let at = (off - runtime.blob.data_offset) as usize;
    segments[1].bytes[at..at + 8].copy_from_slice(&(vaddr - runtime.vaddr).to_le_bytes());
    segments.push(NewSegment {
        vaddr,
        flags: 4,
        mem_size: bytes.len() as u64,
        bytes,
    });
    Ok(())
}

/// The runtime's words that say where the added segments are, as
/// (offset in the blob, value): from the first page above the gap to
/// `end`, the end of the additions (`added_start` and `added_end`,
/// offsets from the blob), so that the program's view of its maps leaves
/// them out, and, in an executable, where the original image ends
/// (`native_brk`), where `init` moves the break, and its `.dynamic` at
/// `dynamic`, through which `init` finds detached libraries
/// (docs/runtime.md section 5).
fn added_range(
    rw: &Rewrite<'_>,
    runtime: &Runtime,
    end: u64,
    dynamic: Option<u64>,
) -> Result<Vec<(u64, u64)>> {
    let original = rw.prog.module.bytes();
    let lo = elfout::added_start(original, rw.heap_gap())?;
    let hi = end.next_multiple_of(crate::PAGE);
    let exe = !rw.library && rw.heap_gap() > 0;
    let brk = exe.then(|| elfout::image_end(original)).transpose()?;
    let fields = [
        ("added_start", Some(lo)),
        ("added_end", Some(hi)),
        ("native_brk", brk),
        ("dynamic", dynamic.filter(|_| !rw.library)),
    ];
    let mut out = Vec::new();
    for (sym, at) in fields {
        let Some(at) = at else { continue };
        let off = runtime
            .blob
            .symbol(sym)
            .ok_or_else(|| rw.err(Refusal::RuntimeLacks(sym)))?;
        out.push((off, at.wrapping_sub(runtime.vaddr)));
    }
    Ok(out)
}

/// Every redirected slot belongs to a stub chosen for it, and the other
/// way round.
fn check_lazy_slots(rw: &Rewrite<'_>, calls: &Calls<'_>, emitted: &Emitted) -> Result<()> {
    let mut want: Vec<u64> = calls.lazy_stubs.values().filter_map(|s| s.slot).collect();
    let mut got: Vec<u64> = emitted
        .code
        .lazy_slots
        .iter()
        .map(|&(slot, _)| slot)
        .collect();
    want.sort_unstable();
    got.sort_unstable();
    if want != got {
        return Err(rw.err(Refusal::LazySlots { got, want }));
    }
    Ok(())
}

/// The id of a rewritten module (the runtime's `image_id`, never 0): a
/// hash of its copies, where they and the runtime go, and its tag, so two
/// rewrites with the same program database share it and two different
/// modules do not (the recorder tells a process's new image by it). A
/// fixed-key hash: a copy rewritten again gets the same id.
pub(crate) fn image_id(runtime: &Runtime, emitted: &Emitted, tag: u32) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (runtime.vaddr, emitted.code_vaddr, tag).hash(&mut h);
    emitted.code.bytes.hash(&mut h);
    emitted.code.tables.hash(&mut h);
    h.finish().max(1)
}

/// The runtime's bytes, with where the copies are, the module's tag and
/// its image id.
fn runtime_bytes(
    rw: &Rewrite<'_>,
    runtime: &Runtime,
    emitted: &Emitted,
    image: u64,
) -> Result<Vec<u8>> {
    let code_end = emitted.code_vaddr + emitted.code.bytes.len() as u64;
    let mut bytes = runtime.blob.bytes.clone();
    for (sym, value) in [
        ("witness_code_start", emitted.code_vaddr - runtime.vaddr),
        ("witness_code_end", code_end - runtime.vaddr),
        ("module_tag", u64::from(rw.tag)),
        ("image_id", image),
    ] {
        let off = runtime
            .blob
            .symbol(sym)
            .ok_or_else(|| rw.err(Refusal::RuntimeLacks(sym)))? as usize;
        bytes[off..off + 8].copy_from_slice(&value.to_le_bytes());
    }
    Ok(bytes)
}

/// The jump tables, then the copies.
fn code_segment(runtime: &Runtime, emitted: &Emitted) -> NewSegment {
    let code = &emitted.code;
    let code_seg = runtime.code_seg;
    let code_end = emitted.code_vaddr + code.bytes.len() as u64;
    let mut seg = vec![0u8; (code_end - code_seg) as usize];
    for (at, bytes) in &code.tables {
        let o = (at - code_seg) as usize;
        seg[o..o + bytes.len()].copy_from_slice(bytes);
    }
    let o = (emitted.code_vaddr - code_seg) as usize;
    seg[o..].copy_from_slice(&code.bytes);
    NewSegment {
        vaddr: code_seg,
        flags: 5,
        mem_size: seg.len() as u64,
        bytes: seg,
    }
}

/// The springboards, the retargeted direct calls and jumps of untraced
/// code (to their callees' preserving stubs), and the redirected GOT
/// slots: a lazily bound slot's initial value (the stub's own lazy-binding
/// half) becomes the copy's LAZY piece.
fn patches(rw: &Rewrite<'_>, emitted: &Emitted) -> Result<Vec<Patch>> {
    let code = &emitted.code;
    code.springboards
        .iter()
        .map(|&(from, to)| {
            let rel = i32::try_from(to as i64 - (from as i64 + SPRINGBOARD as i64))
                .map_err(|_| rw.err(Refusal::SpringboardRange))?;
            let mut bytes = vec![0xE9];
            bytes.extend_from_slice(&rel.to_le_bytes());
            Ok(Patch { vaddr: from, bytes })
        })
        .chain(code.retargets.iter().map(|&(site, stub)| {
            let rel = i32::try_from(stub as i64 - site.next as i64)
                .map_err(|_| rw.err(Refusal::SpringboardRange))?;
            Ok(Patch {
                vaddr: site.field,
                bytes: rel.to_le_bytes().to_vec(),
            })
        }))
        .chain(code.lazy_slots.iter().map(|&(slot, piece)| {
            Ok(Patch {
                vaddr: slot,
                bytes: piece.to_le_bytes().to_vec(),
            })
        }))
        .collect()
}
