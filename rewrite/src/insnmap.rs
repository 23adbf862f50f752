//! The runtime's table of instruction starts, copy to original and back
//! (docs/runtime.md section 5, "The handler sees the native rip"):
//! `signal_entry` shows a handler the original address of the copied
//! instruction a signal interrupted, and the runtime's `sigreturn` maps
//! the rip the handler returns to back to its copy.
//!
//! Layout (read-only, little-endian, offsets from the runtime blob's
//! first byte, whose data page holds the table's offset, `insn_table`):
//! `u32` rows, then per row `u32` copy start, `i32` original start, `u32`
//! first entry, `u32` entries (16 bytes), then the entries, `u16` original
//! delta and `u16` copy delta (4 bytes each). A row is a run of one
//! procedure's instructions whose deltas from the row's starts fit 16
//! bits and ascend both ways.
//!
//! Invariants: within a row both deltas strictly ascend, so each lookup
//! has at most one answer and the two lookups invert each other on every
//! entry (a bijection); rows follow the copy's layout; an instruction
//! with instrumentation right before its copy, or whose original offset
//! does not fit 32 bits, is left out (its rip is then shown as it is, and
//! regen refuses a handler that moves the rip to it).

use iced_x86::{Decoder, DecoderOptions};

use crate::codegen::ProcCopy;

/// One row's head: copy start, original start, its entries.
struct Row {
    copy: u64,
    orig: u64,
    entries: Vec<(u16, u16)>,
}

/// Whether the copied instruction at `prev` (in `code`, at `code_vaddr`)
/// ends where the one at `next` starts: no instrumentation between them.
fn adjacent(code: &[u8], code_vaddr: u64, prev: u64, next: u64) -> bool {
    let Some(bytes) = prev
        .checked_sub(code_vaddr)
        .and_then(|o| code.get(o as usize..))
    else {
        return false;
    };
    let mut d = Decoder::with_ip(64, bytes, prev, DecoderOptions::NONE);
    let i = d.decode();
    !i.is_invalid() && i.next_ip() == next
}

/// The table for `procs` (their code `code` at `code_vaddr`), whose
/// runtime blob starts at `base`. Only instructions whose copy follows
/// the previous copied instruction directly are listed: the rip a
/// handler sets to one of them lands where a run arriving there would
/// be, with no instrumentation of the instruction's own (a witness, the
/// transfer count's increment) or of the one before it (a VALUE) passed
/// over.
pub(crate) fn table(procs: &[ProcCopy], base: u64, code: &[u8], code_vaddr: u64) -> Vec<u8> {
    let mut rows: Vec<Row> = Vec::new();
    for p in procs {
        let mut row: Option<Row> = None;
        let adjacent_pairs = p
            .insn_map
            .windows(2)
            .map(|w| (w[1], adjacent(code, code_vaddr, w[0].1, w[1].1)));
        for ((orig, copy), plain) in adjacent_pairs {
            if !plain {
                rows.extend(row.take());
                continue;
            }
            let fits = |r: &Row| {
                let (o, c) = (orig.wrapping_sub(r.orig), copy.wrapping_sub(r.copy));
                let last = r
                    .entries
                    .last()
                    .map_or((0, 0), |&(o, c)| (o as u64, c as u64));
                o <= 0xFFFF && c <= 0xFFFF && o > last.0 && c > last.1
            };
            match row.as_mut() {
                Some(r) if fits(r) => r
                    .entries
                    .push(((orig - r.orig) as u16, (copy - r.copy) as u16)),
                _ => {
                    rows.extend(row.take());
                    let off = orig.wrapping_sub(base) as i64;
                    if i32::try_from(off).is_ok() && copy >= base && copy - base <= u32::MAX as u64
                    {
                        row = Some(Row {
                            copy,
                            orig,
                            entries: vec![(0, 0)],
                        });
                    }
                }
            }
        }
        rows.extend(row);
    }
    encode(&rows, base)
}

fn encode(rows: &[Row], base: u64) -> Vec<u8> {
    let mut out = (rows.len() as u32).to_le_bytes().to_vec();
    let mut first = 0u32;
    for r in rows {
        out.extend_from_slice(&((r.copy - base) as u32).to_le_bytes());
        out.extend_from_slice(&(r.orig.wrapping_sub(base) as i32).to_le_bytes());
        out.extend_from_slice(&first.to_le_bytes());
        out.extend_from_slice(&(r.entries.len() as u32).to_le_bytes());
        first += r.entries.len() as u32;
    }
    for r in rows {
        for &(o, c) in &r.entries {
            out.extend_from_slice(&o.to_le_bytes());
            out.extend_from_slice(&c.to_le_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the runtime's lookup does, over the encoded bytes.
    fn lookup(t: &[u8], base: u64, addr: u64, to_copy: bool) -> Option<u64> {
        let u32_at = |o: usize| u32::from_le_bytes(t[o..o + 4].try_into().unwrap());
        let n = u32_at(0) as usize;
        let entries = 4 + 16 * n;
        let mut hits = (0..n).flat_map(|i| {
            let h = 4 + 16 * i;
            let copy = base + u64::from(u32_at(h));
            let orig = base.wrapping_add(u32_at(h + 4) as i32 as i64 as u64);
            let (first, count) = (u32_at(h + 8) as usize, u32_at(h + 12) as usize);
            (first..first + count).filter_map(move |e| {
                let at = entries + 4 * e;
                let o = u64::from(u16::from_le_bytes([t[at], t[at + 1]]));
                let c = u64::from(u16::from_le_bytes([t[at + 2], t[at + 3]]));
                match to_copy {
                    true => (orig + o == addr).then_some(copy + c),
                    false => (copy + c == addr).then_some(orig + o),
                }
            })
        });
        let hit = hits.next();
        assert!(hits.next().is_none(), "{addr:#x}: one answer at most");
        hit
    }

    fn proc(insn_map: Vec<(u64, u64)>) -> ProcCopy {
        ProcCopy {
            start: insn_map[0].0,
            new_start: insn_map[0].1 - 16,
            new_end: insn_map.last().unwrap().1 + 8,
            insn_map,
            landing: Vec::new(),
            sigmap: Vec::new(),
        }
    }

    #[test]
    fn both_lookups_invert_each_other_on_every_listed_instruction() {
        let base = 0x4000_0000;
        // Copies of one-byte `nop`s back to back, the first of each
        // procedure after its stub: a short procedure, a long one (rows
        // split at 64 KiB), one with a far `.cold` part (a row of its
        // own), and one with instrumentation before its third instruction.
        let short = proc(vec![
            (0x401000, base + 0x2010),
            (0x401003, base + 0x2011),
            (0x401004, base + 0x2012),
        ]);
        let long = proc(
            (0..30_000)
                .map(|i| (0x402000 + 3 * i, base + 0x3000 + i))
                .collect(),
        );
        let cold = proc(vec![
            (0x440000, base + 0x40000),
            (0x440002, base + 0x40001),
            (0x4f0000, base + 0x40002),
        ]);
        let gap = proc(vec![
            (0x450000, base + 0x41000),
            (0x450001, base + 0x41001),
            (0x450002, base + 0x41009),
        ]);
        let procs = [short, long, cold, gap];
        let code = vec![0x90u8; 0x50000];
        let t = table(&procs, base, &code, base);
        let n = u32::from_le_bytes(t[..4].try_into().unwrap());
        assert!(
            n >= 5,
            "the long procedure and the cold part get rows of their own: {n}"
        );
        for p in &procs {
            for (i, &(o, c)) in p.insn_map.iter().enumerate() {
                let listed = i > 0 && c != base + 0x41009;
                assert_eq!(lookup(&t, base, o, true), listed.then_some(c), "{o:#x}");
                assert_eq!(lookup(&t, base, c, false), listed.then_some(o), "{c:#x}");
            }
        }
        // Between instructions: nothing.
        assert_eq!(lookup(&t, base, 0x401002, true), None);
    }
}
