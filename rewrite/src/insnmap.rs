//! The runtime's table of instruction starts, copy to original and back
//! (docs/runtime.md section 5, "The handler sees the native rip"):
//! `signal_entry` shows a handler the original address of the copied
//! instruction a signal interrupted, and the runtime's `sigreturn` maps
//! an original instruction a handler returns to back into the copy, where
//! that instruction's lead starts (the instrumentation standing before
//! its copy: the VALUEs it needs, a witness, the transfer count's
//! increment), so arriving there does what arriving at the original does.
//!
//! Layout (read-only, little-endian, offsets from the runtime blob's
//! first byte, whose data page holds the table's offset, `insn_table`):
//! `u32` rows, `u32` flags (bit 0, `TABLE_REGISTERS`: the module was
//! rewritten with `--data`, so `sigreturn` records the registers), then per row `u32` copy start, `i32` original start, `u32`
//! first entry, `u32` entries (16 bytes), then the entries, `u16` original
//! delta, `u16` copy delta and `u16` lead (bytes of instrumentation right
//! before the copy; 6 bytes each). A row is a run of one procedure's
//! instructions whose deltas from the row's starts fit 16 bits and ascend
//! both ways.
//!
//! Invariants: within a row both deltas strictly ascend, so each lookup
//! has at most one answer; copy to original answers exact copies only,
//! original to copy gives the lead, which lies after the previous entry's
//! copy (leads never overlap); a procedure's first instruction (its
//! springboard's bytes, where arriving means ENTER) and an instruction
//! whose original offset does not fit 32 bits or whose lead exceeds
//! 64 KiB are left out (its rip is then shown as it is, and regen refuses
//! a handler that moves the rip to it).

use aetrace_runtime::blob::TABLE_REGISTERS;

use crate::codegen::ProcCopy;

/// One row's head: copy start, original start, its entries.
struct Row {
    copy: u64,
    orig: u64,
    entries: Vec<Entry>,
}

/// Deltas from the row's starts, and the lead's length.
#[derive(Clone, Copy)]
struct Entry {
    orig: u16,
    copy: u16,
    lead: u16,
}

/// The table for `procs`, whose runtime blob starts at `base`;
/// `registers`: its flag [`TABLE_REGISTERS`].
pub(crate) fn table(procs: &[ProcCopy], base: u64, registers: bool) -> Vec<u8> {
    let mut rows: Vec<Row> = Vec::new();
    for p in procs {
        let mut row: Option<Row> = None;
        for (&(orig, copy), &lead) in p.insn_map.iter().zip(&p.leads) {
            let lead = copy.checked_sub(lead).and_then(|d| u16::try_from(d).ok());
            let Some(lead) = lead.filter(|_| orig != p.start) else {
                continue;
            };
            let fits = |r: &Row| {
                let (o, c) = (orig.wrapping_sub(r.orig), copy.wrapping_sub(r.copy));
                let last = r
                    .entries
                    .last()
                    .map_or((0, 0), |e| (u64::from(e.orig), u64::from(e.copy)));
                o <= 0xFFFF && c <= 0xFFFF && o > last.0 && c > last.1
            };
            match row.as_mut() {
                Some(r) if fits(r) => r.entries.push(Entry {
                    orig: (orig - r.orig) as u16,
                    copy: (copy - r.copy) as u16,
                    lead,
                }),
                _ => {
                    rows.extend(row.take());
                    let off = orig.wrapping_sub(base) as i64;
                    if i32::try_from(off).is_ok() && copy >= base && copy - base <= u32::MAX as u64
                    {
                        row = Some(Row {
                            copy,
                            orig,
                            entries: vec![Entry {
                                orig: 0,
                                copy: 0,
                                lead,
                            }],
                        });
                    }
                }
            }
        }
        rows.extend(row);
    }
    let flags = if registers { TABLE_REGISTERS } else { 0 };
    encode(&rows, base, flags)
}

fn encode(rows: &[Row], base: u64, flags: u32) -> Vec<u8> {
    let mut out = (rows.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&flags.to_le_bytes());
    let mut first = 0u32;
    for r in rows {
        out.extend_from_slice(&((r.copy - base) as u32).to_le_bytes());
        out.extend_from_slice(&(r.orig.wrapping_sub(base) as i32).to_le_bytes());
        out.extend_from_slice(&first.to_le_bytes());
        out.extend_from_slice(&(r.entries.len() as u32).to_le_bytes());
        first += r.entries.len() as u32;
    }
    for e in rows.iter().flat_map(|r| &r.entries) {
        for w in [e.orig, e.copy, e.lead] {
            out.extend_from_slice(&w.to_le_bytes());
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
        let u16_at = |o: usize| u64::from(u16::from_le_bytes([t[o], t[o + 1]]));
        let n = u32_at(0) as usize;
        let entries = 8 + 16 * n;
        let mut hits = (0..n).flat_map(|i| {
            let h = 8 + 16 * i;
            let copy = base + u64::from(u32_at(h));
            let orig = base.wrapping_add(u32_at(h + 4) as i32 as i64 as u64);
            let (first, count) = (u32_at(h + 8) as usize, u32_at(h + 12) as usize);
            (first..first + count).filter_map(move |e| {
                let at = entries + 6 * e;
                let (o, c, lead) = (u16_at(at), u16_at(at + 2), u16_at(at + 4));
                match to_copy {
                    true => (orig + o == addr).then_some(copy + c - lead),
                    false => (copy + c == addr).then_some(orig + o),
                }
            })
        });
        let hit = hits.next();
        assert!(hits.next().is_none(), "{addr:#x}: one answer at most");
        hit
    }

    /// A procedure whose copies are `(original, copy, lead)`.
    fn proc(insns: Vec<(u64, u64, u64)>) -> ProcCopy {
        ProcCopy {
            start: insns[0].0,
            new_start: insns[0].1 - 16,
            new_end: insns.last().unwrap().1 + 8,
            insn_map: insns.iter().map(|&(o, c, _)| (o, c)).collect(),
            leads: insns.iter().map(|&(_, _, l)| l).collect(),
            landing: Vec::new(),
            sigmap: Vec::new(),
        }
    }

    #[test]
    fn originals_go_to_their_leads_and_copies_back_to_originals() {
        let base = 0x4000_0000;
        // Copies of one-byte `nop`s back to back, the first of each
        // procedure after its stub: a short procedure, a long one (rows
        // split at 64 KiB), one with a far `.cold` part (a row of its
        // own), and one with 8 bytes of instrumentation before its third
        // instruction and a lead too long for the table before its fourth.
        let plain = |o, c| (o, c, c);
        let short = proc(vec![
            plain(0x401000, base + 0x2010),
            plain(0x401003, base + 0x2011),
            plain(0x401004, base + 0x2012),
        ]);
        let long = proc(
            (0..30_000)
                .map(|i| plain(0x402000 + 3 * i, base + 0x3000 + i))
                .collect(),
        );
        let cold = proc(vec![
            plain(0x440000, base + 0x40000),
            plain(0x440002, base + 0x40001),
            plain(0x4f0000, base + 0x40002),
        ]);
        let gap = proc(vec![
            plain(0x450000, base + 0x41000),
            plain(0x450001, base + 0x41001),
            (0x450002, base + 0x41009, base + 0x41002),
            (0x450003, base + 0x5200a, base + 0x4100a),
            plain(0x450004, base + 0x5200b),
        ]);
        let procs = [short, long, cold, gap];
        let t = table(&procs, base, true);
        assert_eq!(t[4..8], TABLE_REGISTERS.to_le_bytes());
        let n = u32::from_le_bytes(t[..4].try_into().unwrap());
        assert!(
            n >= 5,
            "the long procedure and the cold part get rows of their own: {n}"
        );
        for p in &procs {
            for (&(o, c), &lead) in p.insn_map.iter().zip(&p.leads) {
                let listed = o != p.start && c - lead <= 0xFFFF;
                assert_eq!(lookup(&t, base, o, true), listed.then_some(lead), "{o:#x}");
                assert_eq!(lookup(&t, base, c, false), listed.then_some(o), "{c:#x}");
            }
        }
        // Between instructions, and in a lead: nothing.
        assert_eq!(lookup(&t, base, 0x401002, true), None);
        assert_eq!(lookup(&t, base, base + 0x41002, false), None);
    }
}
