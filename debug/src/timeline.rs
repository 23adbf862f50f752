//! One thread's instruction stream as a timeline the debugger moves along in
//! both directions: position `n` is the `n`th instruction the thread
//! executed (0-based), its address the `n`th of `aetrace regen --format
//! bin --thread T`.
//!
//! The regenerator only runs forwards, so the timeline keeps snapshots of
//! its machine (a clone is a snapshot, `aetrace_regen::machine::Machine`)
//! at the start of each interval of about [`INTERVAL`] instructions: going
//! back restores the snapshot before the target and regenerates the
//! interval, which becomes the window (its addresses, decoded). The first
//! run of each interval notes the signals delivered there and the handler
//! returns (`Sink::deliveries`), kept by position for the whole timeline.
//! Invariants:
//! interval `k` covers positions `[snaps[k].pos, snaps[k + 1].pos)`; an
//! interval's addresses are the ones `regen` writes there, for any order
//! of visits (each is regenerated from the same snapshot); the end of the
//! stream, or a regeneration error, ends the timeline at the last
//! instruction certainly executed.

use aetrace_regen::machine::{Delivery, Machine, Noted, Progress, Sink};
use aetrace_regen::Error;

/// Instructions per interval by default (8 bytes of `bin` output each):
/// reverse stepping across an interval's start costs regenerating one
/// interval.
pub const INTERVAL: usize = 1 << 17;

/// The address bits of a `bin` record (the others are kind and size).
const ADDRESS_MASK: u64 = aetrace_format::addrtrace::ADDRESS_LIMIT - 1;

/// A machine state at an interval's start, with the output the machine has
/// produced but not yet proven to have run (`Sink::certain`).
#[derive(Clone)]
struct Snap<'m> {
    pos: u64,
    machine: Machine<'m>,
    tail: Vec<u8>,
}

/// One thread's timeline (see the module comment).
pub struct Timeline<'m> {
    snaps: Vec<Snap<'m>>,
    sink: Sink,
    /// The interval whose addresses `window` holds.
    win_k: usize,
    window: Vec<u64>,
    /// The number of instructions, once the last interval was regenerated.
    len: Option<u64>,
    /// What stopped regeneration before the stream's end.
    error: Option<Error>,
    /// The signals delivered in the intervals regenerated so far, in
    /// order.
    signals: Vec<Signal>,
}

/// A signal delivered to the thread, between two positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signal {
    /// The position of the handler's first instruction: the signal was
    /// delivered after position `pos - 1` and before `pos`.
    pub pos: u64,
    /// The signal number.
    pub signo: u32,
    /// The interrupted instruction's address, when traced code was
    /// interrupted ([`Timeline::interrupted`] completes it).
    pub pc: Option<u64>,
    /// The signal interrupted untraced code.
    pub outside: bool,
    /// The SIGNAL record's stream offset.
    record: u64,
    /// Where the interrupted code resumed, once its handler returned.
    resumed: Option<u64>,
}

impl<'m> Timeline<'m> {
    /// The timeline of `machine`, a machine at the start of its stream
    /// producing the `bin` format, with intervals of about `interval`
    /// instructions. Regenerates the first interval.
    pub fn new(machine: Machine<'m>, interval: usize) -> Timeline<'m> {
        let mut sink = Sink::output(machine.modules(), Vec::new(), interval.max(1) * 8);
        sink.deliveries = Some(Vec::new());
        let mut t = Timeline {
            snaps: vec![Snap {
                pos: 0,
                machine,
                tail: Vec::new(),
            }],
            sink,
            win_k: usize::MAX,
            window: Vec::new(),
            len: None,
            error: None,
            signals: Vec::new(),
        };
        t.load(0);
        t
    }

    /// The error that ended regeneration early, if any.
    pub fn error(&self) -> Option<&Error> {
        self.error.as_ref()
    }

    /// Whether position `n` exists (regenerating up to it if needed).
    pub fn has(&mut self, n: u64) -> bool {
        self.address(n).is_some()
    }

    /// The address of the instruction at position `n`, `None` past the end.
    pub fn address(&mut self, n: u64) -> Option<u64> {
        let k = self.interval_of(n)?;
        self.load(k);
        let i = n - self.snaps[k].pos;
        self.window.get(i as usize).copied()
    }

    /// Notes delivery or return `d`, made by the run of the interval that
    /// starts at position `base`.
    fn note(&mut self, base: u64, d: &Delivery) {
        let pos = base + d.out as u64 / 8;
        match d.what {
            Noted::Delivered { signo, pc, outside } => self.signals.push(Signal {
                pos,
                signo,
                pc,
                outside,
                record: d.record,
                resumed: None,
            }),
            Noted::Returned => {
                let s = self.signals.iter_mut().rev().find(|s| s.record == d.record);
                if let Some(s) = s {
                    s.resumed = Some(pos);
                }
            }
        }
    }

    /// `s` with the interrupted instruction's address where the module's
    /// code left it open (instrumentation before a witness): the
    /// instruction the interrupted code resumed at, once the handler
    /// returned (the next interval is regenerated to find that out). A
    /// signal delivered right after another, no instruction between them
    /// ([`Timeline::rank`] > 0), interrupted the previous one's handler
    /// before its first instruction: the kernel set up both frames, and
    /// its handler returns to that first instruction, as natively gdb's
    /// second stop is there.
    pub fn interrupted(&mut self, s: Signal) -> Signal {
        let stacked = self.rank(&s) > 0;
        if !stacked && (s.pc.is_some() || s.outside) {
            return s;
        }
        let mut g = self.returned(s);
        let Some(mut r) = g.resumed else { return g };
        if stacked {
            // Signals delivered as its handler returned interrupted the
            // same first instruction: it ran once their handlers returned.
            while let Some(b) = self.signal_before(r, 0).filter(|b| b.record != s.record) {
                match self.returned(b).resumed {
                    Some(q) if q > r => r = q,
                    _ => break,
                }
            }
            g.pc = self.address(r).or(g.pc);
            return g;
        }
        // Another signal delivered right there interrupted the same
        // instruction, which it may know only where its own handler
        // returned to (it interrupted instrumentation before a witness).
        g.pc = match self.signal_before(r, 0) {
            Some(b) if b.record != g.record => self.interrupted(b).pc,
            _ => self.address(r),
        };
        g
    }

    /// `s` as noted so far, with where its handler returned to when that
    /// is in the intervals regenerated so far or the next one.
    fn returned(&mut self, s: Signal) -> Signal {
        let find = |t: &Self| t.signals.iter().find(|g| g.record == s.record).copied();
        let g = find(self).unwrap_or(s);
        if g.resumed.is_some() || self.len.is_some() {
            return g;
        }
        let next = self.snaps.last().map_or(0, |l| l.pos);
        self.interval_of(next + 1);
        find(self).unwrap_or(s)
    }

    /// How many signals were delivered at `s`'s position before it (with
    /// no instruction between them).
    pub fn rank(&self, s: &Signal) -> usize {
        let i = self.signals.partition_point(|g| g.pos < s.pos);
        let same = &self.signals[i..];
        same.iter().position(|g| g.record == s.record).unwrap_or(0)
    }

    /// The `k`th signal (0 the first) delivered just before position `n`
    /// (after `n - 1`), if any: several may be delivered there at once.
    pub fn signal_before(&mut self, n: u64, k: usize) -> Option<Signal> {
        self.interval_of(n.saturating_sub(1))?;
        let i = self.signals.partition_point(|s| s.pos < n);
        self.signals.get(i + k).filter(|s| s.pos == n).copied()
    }

    /// The signals delivered before positions `from..to` of intervals
    /// already regenerated, in order.
    pub fn signals_between(&self, from: u64, to: u64) -> &[Signal] {
        let i = self.signals.partition_point(|s| s.pos < from);
        let j = self.signals.partition_point(|s| s.pos < to);
        &self.signals[i..j]
    }

    /// The first signal delivered after position `from` and at or before
    /// `to` (its `pos`: `from < pos <= to`), regenerating up to `to`.
    pub fn signal_in(&mut self, from: u64, to: u64) -> Option<Signal> {
        self.interval_of(to.saturating_sub(1));
        let i = self.signals.partition_point(|s| s.pos <= from);
        self.signals.get(i).filter(|s| s.pos <= to).copied()
    }

    /// The last signal delivered after position `from` and at or before
    /// `to` (`from < pos <= to`).
    pub fn signal_last_in(&mut self, from: u64, to: u64) -> Option<Signal> {
        self.interval_of(to.saturating_sub(1));
        let i = self.signals.partition_point(|s| s.pos <= to);
        let s = *self.signals.get(i.checked_sub(1)?)?;
        (s.pos > from).then_some(s)
    }

    /// The last position, once known without regenerating further: `None`
    /// until the end was reached.
    pub fn known_len(&self) -> Option<u64> {
        self.len
    }

    /// The first position after `from` (exclusive) whose address satisfies
    /// `hit`, or the last position when none does (`Err`).
    pub fn find_forward(&mut self, from: u64, hit: impl Hit) -> Found {
        self.find_forward_visiting(from, hit, |_, _| {})
    }

    /// [`Timeline::find_forward`], calling `visit` with each interval
    /// searched while it is the window, so that a walk over the same
    /// instructions (the procedure stack's) regenerates none again.
    pub fn find_forward_visiting(
        &mut self,
        from: u64,
        hit: impl Hit,
        mut visit: impl FnMut(&mut Self, usize),
    ) -> Found {
        let mut k = match self.interval_of(from + 1) {
            Some(k) => k,
            None => return Found::End(from),
        };
        let mut start = from + 1;
        loop {
            self.load(k);
            visit(self, k);
            // (Regenerated again only if `visit` moved the window.)
            self.load(k);
            let base = self.snaps[k].pos;
            let skip = (start - base) as usize;
            if let Some(i) = first(&self.window[skip..], &hit) {
                return Found::At(start + i as u64);
            }
            let next = base + self.window.len() as u64;
            match self.interval_of(next) {
                Some(k2) => {
                    k = k2;
                    start = next;
                }
                None => return Found::End(next.saturating_sub(1).max(from)),
            }
        }
    }

    /// Whether position `n` exists, regenerating forwards to it; `visit`
    /// is called with each interval from `k` to the one before `n`'s
    /// while it is the window, as [`Timeline::find_forward_visiting`]
    /// does (the stub's walks riding along regenerate none again).
    pub fn has_visiting(
        &mut self,
        n: u64,
        mut k: usize,
        mut visit: impl FnMut(&mut Self, usize),
    ) -> bool {
        // Intervals reached already, or from a position past the end.
        while k < self.snaps.len() {
            self.load(k);
            if n < self.snaps[k].pos + self.window.len() as u64 {
                return true;
            }
            visit(self, k);
            k += 1;
        }
        self.has(n)
    }

    /// The last position before `from` (exclusive) whose address satisfies
    /// `hit`, or position 0 when none does (`End`).
    pub fn find_backward(&mut self, from: u64, hit: impl Hit) -> Found {
        if from == 0 {
            return Found::End(0);
        }
        let Some(mut k) = self.interval_of(from - 1) else {
            return Found::End(0);
        };
        let mut end = from;
        loop {
            self.load(k);
            let base = self.snaps[k].pos;
            let upto = ((end - base) as usize).min(self.window.len());
            if let Some(i) = last(&self.window[..upto], &hit) {
                return Found::At(base + i as u64);
            }
            if k == 0 {
                return Found::End(0);
            }
            k -= 1;
            end = base;
        }
    }

    /// Up to `n` positions whose addresses satisfy `hit`, nearest first,
    /// after `from` (`forward`) or before it (exclusive both ways).
    pub fn find_many(
        &mut self,
        from: u64,
        n: usize,
        forward: bool,
        hit: impl Fn(u64) -> bool + Copy,
    ) -> Vec<u64> {
        let mut found = Vec::new();
        let mut p = from;
        while found.len() < n {
            let f = match forward {
                true => self.find_forward(p, hit),
                false => self.find_backward(p, hit),
            };
            let Found::At(q) = f else { break };
            found.push(q);
            p = q;
        }
        found
    }

    /// Interval `k` (one at or before the interval of a position already
    /// reached): its first position and its addresses.
    pub fn interval(&mut self, k: usize) -> (u64, &[u64]) {
        self.load(k);
        (self.snaps[k].pos, &self.window)
    }

    /// The first position of interval `k`, one at or before the interval
    /// of a position already reached.
    pub fn start(&self, k: usize) -> u64 {
        self.snaps[k].pos
    }

    /// The interval holding position `n`, regenerating forwards to it;
    /// `None` when the stream ends before it.
    pub fn interval_of(&mut self, n: u64) -> Option<usize> {
        loop {
            let k = self.snaps.partition_point(|s| s.pos <= n) - 1;
            if k + 1 < self.snaps.len() {
                return Some(k);
            }
            // `k` is the last interval: its end is known once regenerated.
            self.load(k);
            let end = self.snaps[k].pos + self.window.len() as u64;
            if n < end {
                return Some(k);
            }
            if self.len.is_some() {
                return None;
            }
            // `load` of the last interval pushed the next snapshot, or set `len`.
        }
    }

    /// Makes interval `k` the window: restores its snapshot and
    /// regenerates one interval; the last interval's run adds the next
    /// snapshot (or ends the timeline).
    fn load(&mut self, k: usize) {
        if self.win_k == k {
            return;
        }
        let snap = &self.snaps[k];
        let mut machine = snap.machine.clone();
        self.sink.out.clear();
        self.sink.out.extend_from_slice(&snap.tail);
        self.sink.certain = 0;
        let delivered = self.sink.deliveries.as_mut().expect("set by new");
        delivered.clear();
        let r = machine.run(&mut self.sink);
        let certain = self.sink.certain.min(self.sink.out.len());
        self.window.clear();
        self.window.extend(
            self.sink.out[..certain]
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) & ADDRESS_MASK),
        );
        self.win_k = k;
        if k + 1 < self.snaps.len() || self.len.is_some() {
            return;
        }
        let pos = snap.pos + self.window.len() as u64;
        // The first run of each interval (in order) notes its signals.
        let base = snap.pos;
        let notes = self.sink.deliveries.take().expect("set by new");
        notes.iter().for_each(|d| self.note(base, d));
        self.sink.deliveries = Some(notes);
        match r {
            Ok(Progress::More) if !self.window.is_empty() => {
                let tail = self.sink.out[certain..].to_vec();
                self.snaps.push(Snap { pos, machine, tail });
            }
            Ok(_) => self.len = Some(pos),
            Err(e) => {
                self.error = Some(e);
                self.len = Some(pos);
            }
        }
    }
}

/// Addresses tested at once by [`first`] and [`last`].
const CHUNK: usize = 32;

/// What a search looks for: an address at a time ([`Hit::hit`]) and a
/// chunk of addresses at once ([`Hit::any`]).
pub trait Hit {
    /// Whether `a` is one.
    fn hit(&self, a: u64) -> bool;

    /// Whether any address of `c` is one: tested whole, without an early
    /// exit, so that the common case (no hit in a chunk) vectorises.
    fn any(&self, c: &[u64]) -> bool {
        c.iter().fold(false, |o, &a| o | self.hit(a))
    }
}

impl<F: Fn(u64) -> bool> Hit for F {
    fn hit(&self, a: u64) -> bool {
        self(a)
    }
}

/// The index of the first address of `w` that is a hit; only the chunk
/// that [`Hit::any`] finds is searched address by address.
fn first(w: &[u64], hit: &impl Hit) -> Option<usize> {
    let k = w.chunks(CHUNK).position(|c| hit.any(c))?;
    let c = &w[k * CHUNK..];
    c.iter().position(|&a| hit.hit(a)).map(|i| k * CHUNK + i)
}

/// The index of the last address of `w` that is a hit ([`first`]
/// backwards).
fn last(w: &[u64], hit: &impl Hit) -> Option<usize> {
    let k = w.rchunks(CHUNK).position(|c| hit.any(c))?;
    let end = w.len() - k * CHUNK;
    let c = &w[end.saturating_sub(CHUNK)..end];
    let i = c.iter().rposition(|&a| hit.hit(a))?;
    Some(end - c.len() + i)
}

/// What a search found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// A position whose address matched.
    At(u64),
    /// No match: the search ended at this end of the timeline.
    End(u64),
}

#[cfg(test)]
mod tests {
    use super::{first, last};

    /// [`first`] and [`last`] agree with a plain search, at every length
    /// around chunk boundaries and every place of one or two hits.
    #[test]
    fn chunked_searches_equal_plain_ones() {
        for len in 0..100u64 {
            let w: Vec<u64> = (0..len).collect();
            for (x, y) in (0..=len).flat_map(|x| (x..=len).map(move |y| (x, y))) {
                let hit = |a: u64| a == x || a == y;
                assert_eq!(first(&w, &hit), w.iter().position(|&a| hit(a)));
                assert_eq!(last(&w, &hit), w.iter().rposition(|&a| hit(a)));
            }
        }
    }
}
