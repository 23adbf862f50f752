//! The data walk's state at a state index entry (`docs/data.md`, "`-j N`
//! from the state index"): what a piece of `regen --data -j N` needs to
//! start there, kept in the entry's `data` bytes beside the control
//! machine's state (`aetrace_regen::index`).
//!
//! The state is two parts. The first is canonical, equal for equal walks
//! whatever their history: the values used so far, the values put back
//! before the next ones (a handler's interrupted instruction's), the
//! thread constants, the abstract registers known (unknown ones are not
//! state), the run before, the kept call state, how the last run was
//! entered and whether a handler just returned. A piece that reaches the
//! next entry checks its own first part against the entry's. The second
//! is where the value cursor starts: a mark of the stream ([`ValueMark`])
//! and how many values after it to pass; a window read ahead differs from
//! walk to walk, so it is not compared.
//!
//! Invariants: no state is kept inside a signal handler, nor with a
//! handler's saved state, a `rep` fault pending or an ENTER carried to
//! the next window; decoding never panics on any bytes.

use super::{Back, ThreadExec, Values, Writer};
use aetrace_analysis::addr::{Gpr, RegSet};
use aetrace_regen::compile::BlockIx;
use aetrace_regen::{DataValues, ValueMark};

/// A decoded state: the canonical part's fields and the cursor's start.
pub(super) struct DataState {
    used: u64,
    prefix: DataValues,
    once: super::Once,
    exec: ThreadExec,
    resumed: bool,
    mark: ValueMark,
    skip: u64,
}

impl<S: super::Sink> Writer<'_, '_, S> {
    /// The state here, encoded; `None` where none is kept (above).
    pub(super) fn data_state(&self) -> Option<Vec<u8>> {
        let v = &self.values;
        if !self.sig.quiet() || v.carry.is_some() || v.carried.is_some() {
            return None;
        }
        let (next, len) = (v.next, v.win.values.len());
        let (mark, skip, prefix_end) = if next == len {
            (v.cursor.as_ref()?.mark()?, 0, next)
        } else {
            let start = next.max(v.spliced);
            let skip = u64::try_from(start as i64 - v.mark_at).ok()?;
            (v.mark.clone()?, skip, start)
        };
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(&[0; 4]);
        put(&mut out, v.used());
        let prefix = &v.win.values[next..prefix_end];
        put(&mut out, prefix.len() as u64);
        prefix.iter().for_each(|&x| put(&mut out, x));
        let marks: Vec<_> = (v.win.entered.iter())
            .filter(|e| (next..prefix_end).contains(&e.0))
            .collect();
        put(&mut out, marks.len() as u64);
        for &&(n, raw) in &marks {
            put(&mut out, (n - next) as u64);
            put(&mut out, raw.into());
        }
        for c in &v.once {
            opt(&mut out, *c);
        }
        encode_exec(&self.state, &mut out);
        out.push(self.sig.resumed.into());
        let canonical = (out.len() - 4) as u32;
        out[..4].copy_from_slice(&canonical.to_le_bytes());
        mark.encode(&mut out);
        put(&mut out, skip);
        Some(out)
    }
}

impl<'t, S: super::Sink> Writer<'_, 't, S> {
    /// Starts thread `t`'s walk at state `s` (the walk of a piece).
    pub(super) fn restore_data<B: AsRef<[u8]> + Sync>(
        &mut self,
        trace: &aetrace_format::Trace<B>,
        visit: &'t aetrace_regen::visit::Visit<'_, B>,
        t: aetrace_format::ThreadId,
        s: DataState,
    ) -> super::Result<()> {
        let mut cursor = visit.values_at(t, &s.mark)?;
        let (mut left, mut scratch) = (s.skip, DataValues::default());
        while left > 0 {
            let want = usize::try_from(left)
                .unwrap_or(usize::MAX)
                .min(super::WINDOW);
            match cursor.read(want, &mut scratch)? {
                0 => return Err(super::INDEX_STALE.into()),
                n => left -= n as u64,
            }
        }
        let mut values = Values::start(trace, visit, t)?;
        values.mark = cursor.mark();
        values.cursor = Some(cursor);
        (values.mark_at, values.spliced) = (s.prefix.values.len() as i64, s.prefix.values.len());
        values.win = s.prefix;
        values.before = s.used;
        values.once = s.once;
        self.values = values;
        // The way into the next run is checked against the run before's
        // entry, which this walk may not have built yet.
        if let Some((pm, pb, ..)) = s.exec.prev {
            let m = (visit.modules().get(pm as usize)).ok_or(super::INDEX_STALE)?;
            if pb.as_u32() as usize >= m.blocks.len() {
                return Err(super::INDEX_STALE.into());
            }
            if self.mods[pm as usize].entries[pb.as_u32() as usize].is_none() {
                let end = m.blocks[pb].ninsns;
                let r = aetrace_regen::visit::BlockRun {
                    module: pm,
                    block: pb,
                    first: 0,
                    end,
                    faults: false,
                };
                self.new_entry(m, r)?;
            }
        }
        self.state = s.exec;
        self.sig = super::signals::Signals::default();
        self.sig.resumed = s.resumed;
        Ok(())
    }
}

/// The canonical part of encoded state `bytes` (what two walks at the
/// same point agree on); `None`: malformed.
pub(super) fn canonical(bytes: &[u8]) -> Option<&[u8]> {
    let n = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    bytes.get(4..4 + n)
}

/// Decodes an encoded state (`None`: malformed).
pub(super) fn decode(bytes: &[u8]) -> Option<DataState> {
    let body = canonical(bytes)?;
    let mut r = body;
    let used = get(&mut r)?;
    let n = usize::try_from(get(&mut r)?).ok()?.min(r.len() / 8 + 1);
    let mut prefix = DataValues::default();
    for _ in 0..n {
        prefix.values.push(get(&mut r)?);
    }
    let m = usize::try_from(get(&mut r)?).ok()?.min(r.len() / 16 + 1);
    for _ in 0..m {
        let (k, raw) = (usize::try_from(get(&mut r)?).ok()?, get(&mut r)?);
        if k >= prefix.values.len() || prefix.entered.last().is_some_and(|l| l.0 >= k) {
            return None;
        }
        prefix.entered.push((k, u32::try_from(raw).ok()?));
    }
    let mut once = super::Once::default();
    for c in &mut once {
        *c = get_opt(&mut r)?;
    }
    let exec = decode_exec(&mut r)?;
    let resumed = match take(&mut r, 1)? {
        [0] => false,
        [1] => true,
        _ => return None,
    };
    if !r.is_empty() {
        return None;
    }
    let mut rest = &bytes[4 + body.len()..];
    let mark = ValueMark::decode(&mut rest)?;
    let skip = get(&mut rest)?;
    rest.is_empty().then_some(DataState {
        used,
        prefix,
        once,
        exec,
        resumed,
        mark,
        skip,
    })
}

fn encode_exec(e: &ThreadExec, out: &mut Vec<u8>) {
    put_regs(out, e.regs.known, &e.regs.v[..16]);
    match e.prev {
        None => out.push(0),
        Some((m, b, whole, ret)) => {
            out.push(1 | u8::from(whole) << 1 | u8::from(ret) << 2);
            put(out, m.into());
            put(out, b.as_u32().into());
        }
    }
    match &e.back {
        None => out.push(0),
        Some(b) => {
            out.push(1);
            for x in [b.module, b.proc, b.local] {
                put(out, x.into());
            }
            put_regs(out, b.known, &b.v);
        }
    }
}

fn decode_exec(r: &mut &[u8]) -> Option<ThreadExec> {
    let mut e = ThreadExec::default();
    let (known, v) = get_regs(r)?;
    for g in known.iter() {
        e.regs.set(g, v[g.index()]);
    }
    e.prev = match take(r, 1)?[0] {
        0 => None,
        f if f & !7 == 0 && f & 1 == 1 => {
            let m = u32::try_from(get(r)?).ok()?;
            let b = BlockIx::from_u32(u32::try_from(get(r)?).ok()?);
            Some((m, b, f & 2 != 0, f & 4 != 0))
        }
        _ => return None,
    };
    e.back = match take(r, 1)?[0] {
        0 => None,
        1 => {
            let mut x = [0u32; 3];
            for y in &mut x {
                *y = u32::try_from(get(r)?).ok()?;
            }
            let (known, v) = get_regs(r)?;
            Some(Back {
                module: x[0],
                proc: x[1],
                local: x[2],
                v,
                known,
            })
        }
        _ => return None,
    };
    Some(e)
}

/// The known registers of `v` (16), the others not state.
fn put_regs(out: &mut Vec<u8>, known: RegSet, v: &[u64]) {
    out.extend_from_slice(&known.0.to_le_bytes());
    for g in known.iter() {
        put(out, v[g.index()]);
    }
}

fn get_regs(r: &mut &[u8]) -> Option<(RegSet, [u64; 16])> {
    let known = RegSet(u16::from_le_bytes(take(r, 2)?.try_into().ok()?));
    let mut v = [0; 16];
    for Gpr(g) in known.iter() {
        v[usize::from(g)] = get(r)?;
    }
    Some((known, v))
}

fn put(out: &mut Vec<u8>, x: u64) {
    out.extend_from_slice(&x.to_le_bytes());
}

fn opt(out: &mut Vec<u8>, x: Option<u64>) {
    out.push(x.is_some().into());
    put(out, x.unwrap_or(0));
}

fn take<'b>(r: &mut &'b [u8], n: usize) -> Option<&'b [u8]> {
    let head = r.get(..n)?;
    *r = &r[n..];
    Some(head)
}

fn get(r: &mut &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(take(r, 8)?.try_into().ok()?))
}

fn get_opt(r: &mut &[u8]) -> Option<Option<u64>> {
    match (take(r, 1)?[0], get(r)?) {
        (0, _) => Some(None),
        (1, x) => Some(Some(x)),
        _ => None,
    }
}
