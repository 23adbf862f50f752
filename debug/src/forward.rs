//! The frames' openers of a control-only trace, kept forwards (issue 22:
//! a stop's cost must not grow with the history before it;
//! `docs/debug.md`, "Frames' addresses").
//!
//! [`crate::frames::cfas_by_entries`] walks back from a stop, pairing each
//! traced return with the opener further back that it returned from: an
//! outside entry (which pairs with any return) or a traced call returning
//! where the return went; what it meets while no return is pending opens
//! the frame it is in, or is passed over. Which openers pair with which
//! returns does not depend on where the walk started, so the pass that
//! goes forwards keeps the openers no return has paired with yet, oldest
//! first ([`Opening`]): a return removes the one it pairs with and every
//! one after it (the walk back meets those while the return is pending,
//! which takes none of them), or, pairing with none, all of them (the walk
//! back never has no return pending again). A stop then takes them newest
//! first as the walk back does ([`take`]), with the frames the procedure
//! stack gives there.
//!
//! A call whose callee came back to its return address without a traced
//! return (a PLT stub's jump into untraced code) is kept by the walk back
//! for ever; it opens a frame there only if that frame's caller's pc is
//! its return address, so it is dropped once reached unless another
//! opener kept returns there too (recursion through the call). The openers
//! kept are then those of the frames open, the calls whose callees have
//! not come back, and such calls under recursion through them: the state
//! per interval start is 56 bytes and 40 per opener, about the stack's
//! depth.
//!
//! Where a frame's CFA needs a call's stack delta that the static deltas
//! do not know (`alloca`, `and` for alignment), the caller's own
//! instructions from its entry to the call are followed, as the walk back
//! collects them: the stop walks that stretch forwards again, keeping the
//! instructions of each opener until a return pairs with it
//! ([`Forward::body`]).
//!
//! Invariants: the openers at position `n` are the same for any order of
//! visits (kept per interval start, computed front to back); the CFAs
//! given are those of the walk back from the same stop
//! (`tests/debug.rs`, `frames_from_snapshots_are_the_walks_from_the_start`).

use crate::data::{Code, Data, Flow};
use crate::frames::{body_cfa, by_call, cfas_of, slot, Frame, Opener, Stand, Walking, BODY};
use crate::pcmap::{Flagged, PcFlags};
use crate::timeline::Timeline;
use crate::untraced::is_untraced;
use aetrace_analysis::addr::Access;
use iced_x86::{Decoder, DecoderOptions, FlowControl};

/// [`Forward::marks`]: a call or a return. (Bits other than the procedure
/// stack's flags, `crate::stack`: the stub scans an interval once for both
/// walks, [`PcFlags::union`].)
const MOVES: u8 = 8;
/// [`Forward::marks`]: a procedure's entry (an outside entry's stub may
/// have recorded `rsp` before it).
const ENTRY: u8 = 16;
/// [`Forward::marks`]: a call's return address (a kept call's `ret`).
const RETURN: u8 = 32;

/// An opener no return has paired with yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Opening {
    kind: Kind,
    /// The call's or the entry's position.
    pos: u64,
    /// Its address.
    pc: u64,
    /// A call's return address.
    ret: u64,
    /// An outside entry's pc was reached again while it was the newest
    /// opener (a jump back to the entry): where a data trace's walk back
    /// ends the frame ([`Forward::data_cfas`]).
    again: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// An outside entry whose stub recorded this `rsp`.
    Entry(u64),
    /// A call to a traced callee.
    Call,
    /// A call whose callee came straight back or is an outside entry
    /// (opens only an untraced frame, [`Opener::Passed`]).
    Passed,
}

/// The pass's state before a position's instruction runs.
#[derive(Clone, Debug, Default)]
struct State {
    open: Vec<Opening>,
    /// The previous position's pc and flow, applied once the position
    /// after it is known.
    prev: Option<(u64, Flow)>,
    /// The entry values read.
    values: usize,
}

/// Per opener of a [`State`], its own instructions in order (`None`:
/// more than [`BODY`]), where they are kept ([`Forward::body`]).
type Bodies = Vec<Option<Vec<u64>>>;

/// The openers at each interval's start (see the module comment).
pub struct Forward {
    marks: PcFlags,
    /// The outside entries' `rsp` are read (a control-only trace's
    /// values); a data trace's frames take their addresses from its
    /// references instead ([`Forward::data_cfas`]).
    entry_rsp: bool,
    /// Interval `k`'s start's at index `k`.
    states: Vec<State>,
    /// What stopped the pass (given again to every stop after it, which
    /// would otherwise walk the intervals before it again).
    broken: Option<String>,
}

impl Forward {
    /// The pass over `code`'s traced blocks, reading the outside entries'
    /// `rsp` if `entry_rsp`.
    pub fn new(code: &Code<'_, '_>, entry_rsp: bool) -> Forward {
        Forward {
            marks: marks(code),
            entry_rsp,
            states: vec![State::default()],
            broken: None,
        }
    }

    /// The intervals whose starts' states are known: `0..=reached()`.
    pub fn reached(&self) -> usize {
        self.states.len() - 1
    }

    /// The CFAs of `frames[..needed]` (innermost first) at `at`, as
    /// [`crate::frames::cfas_by_entries`] finds them.
    pub fn cfas(
        &mut self,
        cx: &mut Walking<'_, '_, '_, '_>,
        at: Stand,
        frames: &[Frame],
        needed: usize,
    ) -> Result<Vec<Option<u64>>, String> {
        let needed_back = crate::frames::needed_back(frames, needed);
        let none = vec![None; needed];
        if needed_back == 0 {
            return Ok(none);
        }
        let Some(taken) = self.openers_at(cx, at, frames, needed_back)? else {
            return Ok(none);
        };
        let openers: Vec<Opener> = taken.iter().map(|t| t.0).collect();
        let t = &mut *cx.t;
        let code = cx.code;
        let this = &*self;
        let mut body = |data: &mut Data, l: usize| {
            // Frame `l`'s, to the call that opened frame `l - 1`.
            this.body(data, t, code, taken[l].1, taken[l - 1].1.pos)
        };
        cfas_of(cx.data, code, frames, &openers, &mut body, needed)
    }

    /// The CFAs of `frames[..needed]` (innermost first) at `at` on a data
    /// trace, as [`crate::frames::cfas`]'s walk back finds them, from the
    /// references at the openers kept: a frame opened by a call 8 above
    /// the slot it stored its return address to, one opened by an outside
    /// entry from its first reference through its CFA's register after
    /// the entry ([`entry_cfa`]). `None` where the openers do not tell
    /// what that walk would find (then the stub walks back): fewer than
    /// needed or an outside entry not its frame's, a call with no store
    /// to its slot or one not above the frame below's, an entry reached
    /// again by a jump, its frame's first move before such a reference.
    pub fn data_cfas(
        &mut self,
        cx: &mut Walking<'_, '_, '_, '_>,
        at: Stand,
        frames: &[Frame],
        needed: usize,
    ) -> Result<Option<Vec<Option<u64>>>, String> {
        let Some(last) = at.last().filter(|_| needed > 0) else {
            return Ok(Some(vec![None; needed]));
        };
        let Some(taken) = self.openers_at(cx, at, frames, needed)? else {
            return Ok(None);
        };
        // The slot the frame below's creator stored to, or its CFA less 8
        // (the walk back's bound on the next creator's slot).
        let mut below: Option<u64> = None;
        let mut cfas = Vec::with_capacity(needed);
        for (l, &(opener, o)) in taken.iter().enumerate() {
            let cfa = match opener {
                Opener::Entry(_) if o.again => return Ok(None),
                Opener::Entry(_) => {
                    let end = match l {
                        0 => last,
                        _ => taken[l - 1].1.pos,
                    };
                    let Some(found) = entry_cfa(cx, at, frames[l].1, o.pos, end)? else {
                        return Ok(None);
                    };
                    below = found.map(|c| c.wrapping_sub(8));
                    found
                }
                Opener::Call(_) | Opener::Passed(_) => {
                    let slot = call_slot(cx, o.pos)?;
                    match slot.filter(|&a| below.map_or(true, |b| a > b)) {
                        Some(a) => below = Some(a),
                        None => return Ok(None),
                    }
                    slot.map(|a| a.wrapping_add(8))
                }
            };
            cfas.push(cfa);
        }
        Ok(crate::frames::grows(&cfas).then_some(cfas))
    }

    /// The openers of `frames[..needed]` at `at` ([`take`]).
    fn openers_at(
        &mut self,
        cx: &mut Walking<'_, '_, '_, '_>,
        at: Stand,
        frames: &[Frame],
        needed: usize,
    ) -> Result<Option<Vec<(Opener, Opening)>>, String> {
        let Some(last) = at.last() else {
            return Ok(None);
        };
        let mut s = self.state_at(cx, last)?;
        if at.passage {
            // What ran last went to the untraced code.
            let next = (frames[0].0, false);
            apply(&mut s, at.pos, next, |_, _| false, None);
        }
        Ok(take(&s.open, frames, needed))
    }

    /// The state at position `n` (before it runs, its outside entry
    /// opened), from its interval's start.
    fn state_at(&mut self, cx: &mut Walking<'_, '_, '_, '_>, n: u64) -> Result<State, String> {
        let Some(k) = cx.t.interval_of(n) else {
            return Ok(State::default());
        };
        self.reach(cx, k)?;
        let mut s = self.states[k].clone();
        let (start, addrs) = cx.t.interval(k);
        let upto = &addrs[..addrs.len().min((n - start + 1) as usize)];
        let mut flagged = Vec::new();
        self.marks.flagged(upto, &mut flagged);
        self.steps(cx.data, cx.code, &mut s, start, upto, &flagged)?;
        Ok(s)
    }

    /// Computes the states at the starts of intervals up to `k` (the
    /// stub's first pass over the history walks each interval while it is
    /// the timeline's window instead, along with the procedure stack's:
    /// [`Forward::reach_next`]).
    fn reach(&mut self, cx: &mut Walking<'_, '_, '_, '_>, k: usize) -> Result<(), String> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let r = self.walk_to(cx, k);
        self.broken = r.clone().err();
        r
    }

    /// [`Forward::reach`] unless broken.
    fn walk_to(&mut self, cx: &mut Walking<'_, '_, '_, '_>, k: usize) -> Result<(), String> {
        let mut flagged = Vec::new();
        while self.states.len() <= k {
            let (_, addrs) = cx.t.interval(self.reached());
            self.marks.flagged(addrs, &mut flagged);
            self.walk_next(cx, &flagged)?;
        }
        Ok(())
    }

    /// Walks interval `reached()`, whose flagged positions (the openers'
    /// flags at least) `flagged` lists, keeping the state after it, unless
    /// broken: the stub's riders scan the interval once for this walk
    /// and the procedure stack's.
    pub fn reach_next(&mut self, cx: &mut Walking<'_, '_, '_, '_>, flagged: &[(u32, u8)]) {
        if self.broken.is_none() {
            self.broken = self.walk_next(cx, flagged).err();
        }
    }

    /// [`Forward::reach_next`], its error.
    fn walk_next(
        &mut self,
        cx: &mut Walking<'_, '_, '_, '_>,
        flagged: &[(u32, u8)],
    ) -> Result<(), String> {
        let j = self.reached();
        let mut s = self.states[j].clone();
        let (start, addrs) = cx.t.interval(j);
        self.steps(cx.data, cx.code, &mut s, start, addrs, flagged)?;
        self.states.push(s);
        Ok(())
    }

    /// Whether the pass stopped (an error: every stop is given it).
    pub fn broken(&self) -> bool {
        self.broken.is_some()
    }

    /// The flags the pass stops at.
    pub fn marks(&self) -> &PcFlags {
        &self.marks
    }

    /// Steps `s` over the positions from `start` whose pcs are `addrs`
    /// and whose flagged positions (the openers' flags at least) `flagged`
    /// lists ([`PcFlags::flagged`]); those that change nothing but `prev`
    /// (after an instruction that neither calls nor returns, to one that
    /// is no entry and no call's return address: [`Forward::step`]'s plain
    /// steps) at once.
    fn steps(
        &self,
        data: &mut Data,
        code: &Code<'_, '_>,
        s: &mut State,
        start: u64,
        addrs: &[u64],
        flagged: &[(u32, u8)],
    ) -> Result<(), String> {
        let mut loud = Flagged::new(flagged);
        let mut i = 0;
        while i < addrs.len() {
            if matches!(s.prev, Some((_, Flow::Other))) {
                let n = loud.quiet(i, addrs.len(), MOVES | ENTRY | RETURN);
                if n > 0 {
                    s.prev = Some((addrs[i + n - 1], Flow::Other));
                    i += n;
                    continue;
                }
            }
            self.step(data, code, s, start + i as u64, addrs[i], None)?;
            i += 1;
        }
        Ok(())
    }

    /// Steps `s` over position `p`, whose instruction is at `pc`, keeping
    /// its openers' own instructions in `bodies` if given (the entries'
    /// values are not read then).
    #[inline(always)]
    fn step(
        &self,
        data: &mut Data,
        code: &Code<'_, '_>,
        s: &mut State,
        p: u64,
        pc: u64,
        mut bodies: Option<&mut Bodies>,
    ) -> Result<(), String> {
        let m = self.marks.get(pc);
        let entered = match m & ENTRY != 0 {
            true => data.outside_entry(code, s.prev.map(|p| p.0), pc)?,
            false => false,
        };
        // Most steps change nothing: no call or return before, no
        // callee's return address reached.
        let plain =
            matches!(s.prev, Some((_, Flow::Other))) && s.open.last().map_or(true, |o| o.ret != pc);
        if plain {
            s.prev = None;
            // A jump back to the newest opener's entry (the walk back
            // ends its frame there); not kept in a body's stretch.
            let again = m & ENTRY != 0 && !entered;
            if let (Some(o), true, None) = (s.open.last_mut(), again, &bodies) {
                o.again |= matches!(o.kind, Kind::Entry(_)) && o.pc == pc;
            }
        } else {
            let same = |a, b| same_proc(code, a, b);
            apply(s, p, (pc, entered), same, bodies.as_deref_mut());
        }
        if entered {
            let rsp = match bodies.as_deref_mut() {
                Some(b) => {
                    b.push(Some(Vec::new()));
                    0
                }
                None if self.entry_rsp => {
                    s.values += 1;
                    data.entry_value(s.values - 1, pc)?
                }
                None => 0,
            };
            let kind = Kind::Entry(rsp);
            s.open.push(Opening {
                kind,
                pos: p,
                pc,
                ret: 0,
                again: false,
            });
        }
        let flow = match m & MOVES != 0 {
            true => data.flow(code, pc)?,
            false => Flow::Other,
        };
        // A return is no frame's own instruction.
        if let (Some(b), false) = (bodies, flow == Flow::Ret) {
            own(b, pc);
        }
        s.prev = Some((pc, flow));
        Ok(())
    }

    /// The own instructions (latest first, its entry last) of the frame
    /// `o` opened, from its first position to position `to` (the call
    /// that opened the frame inside it), as the walk back from `to`
    /// collects them: the stretch walked forwards again from `o` alone,
    /// each opener's instructions kept until a return pairs with it (a
    /// callee's that came back without one are its caller's).
    fn body(
        &self,
        data: &mut Data,
        t: &mut Timeline<'_>,
        code: &Code<'_, '_>,
        o: Opening,
        to: u64,
    ) -> Result<Option<Vec<u64>>, String> {
        let from = match o.kind {
            Kind::Entry(_) => o.pos,
            _ => o.pos + 1,
        };
        let mut s = State {
            open: vec![o],
            prev: None,
            values: 0,
        };
        let mut bodies: Bodies = vec![Some(Vec::new())];
        let mut p = from;
        while p <= to {
            let Some(k) = t.interval_of(p) else { break };
            let (start, addrs) = t.interval(k);
            for (q, &pc) in (p..=to).zip(&addrs[(p - start) as usize..]) {
                if q == from {
                    // Its entry, opened already.
                    own(&mut bodies, pc);
                    s.prev = Some((pc, data.flow(code, pc)?));
                } else if q == to {
                    // The call that opened the frame inside: not its own.
                    let m = self.marks.get(pc) & ENTRY != 0;
                    let entered = m && data.outside_entry(code, s.prev.map(|p| p.0), pc)?;
                    let same = |a, b| same_proc(code, a, b);
                    apply(&mut s, q, (pc, entered), same, Some(&mut bodies));
                } else {
                    self.step(data, code, &mut s, q, pc, Some(&mut bodies))?;
                }
                p = q + 1;
            }
        }
        if s.open.first() != Some(&o) {
            return Ok(None);
        }
        // Those of the openers after it are its own too (calls whose
        // callees have not come back).
        let mut all = Vec::new();
        for b in bodies {
            match b {
                Some(b) if all.len() + b.len() <= BODY => all.extend(b),
                _ => return Ok(None),
            }
        }
        all.reverse();
        Ok(Some(all))
    }
}

/// The slot the call at position `pos` stored its return address to.
fn call_slot(cx: &mut Walking<'_, '_, '_, '_>, pos: u64) -> Result<Option<u64>, String> {
    let found = cx
        .data
        .scan_flow(cx.t, cx.code, pos, true, |_, _, _, refs| {
            Some(slot(refs, Access::Store, 8u64.wrapping_neg()))
        })?;
    Ok(found.and_then(|f| f.1))
}

/// The CFA of the frame an outside entry into `entry` at position `from`
/// opened, as the data walk back from `end` (the stop's last position, or
/// the call that opened the frame inside) finds it: by the frame's first
/// reference through its CFA's register ([`body_cfa`]) from `from` to
/// `end`, `Some(None)` if there is none; `None` where the frame moved
/// (a call or a return ran) before one, so its own instructions after
/// are not known here.
fn entry_cfa(
    cx: &mut Walking<'_, '_, '_, '_>,
    at: Stand,
    entry: u64,
    from: u64,
    end: u64,
) -> Result<Option<Option<u64>>, String> {
    let image = cx.code.image;
    let found = cx
        .data
        .scan_flow(cx.t, cx.code, from, true, |q, pc, flow, refs| {
            let ran = q < at.pos;
            match body_cfa(image, pc, refs) {
                // The walk back would end the frame at an entry after `from`.
                _ if q > from && pc == entry => Some(None),
                // A return is its callee's.
                _ if ran && flow == Flow::Ret => Some(None),
                Some(c) => Some(Some(Some(c))),
                None if q >= end => Some(Some(None)),
                None if ran && flow != Flow::Other => Some(None),
                None => None,
            }
        })?;
    Ok(found.and_then(|f| f.1))
}

/// Keeps `pc` as the newest opener's own instruction.
fn own(bodies: &mut Bodies, pc: u64) {
    if let Some(slot) = bodies.last_mut() {
        match slot {
            Some(b) if b.len() < BODY => b.push(pc),
            _ => *slot = None,
        }
    }
}

/// Applies the previous position's flow to `s`, position `p` after it
/// being `next` (its pc, and whether it is an outside entry);
/// `same_proc(a, b)`: whether `a` and `b` are in one procedure; the
/// openers' own instructions in `bodies`, if kept.
fn apply(
    s: &mut State,
    p: u64,
    next: (u64, bool),
    same_proc: impl Fn(u64, u64) -> bool,
    bodies: Option<&mut Bodies>,
) {
    let Some((pc, flow)) = s.prev.take() else {
        return;
    };
    let keep = bodies.is_some();
    let mut none = Vec::new();
    let bodies = bodies.unwrap_or(&mut none);
    let (to, entry) = next;
    let mut from_callback = false;
    match flow {
        Flow::Ret => {
            // The newest opener it pairs with, and every one after it.
            let pairs = |o: &Opening| {
                matches!(o.kind, Kind::Entry(_)) || (o.kind == Kind::Call && o.ret == to)
            };
            let i = s.open.iter().rposition(pairs);
            from_callback = i.is_some_and(|i| matches!(s.open[i].kind, Kind::Entry(_)));
            if let (Some(i), true) = (i, keep) {
                bodies.truncate(i);
                // A call whose callee returned is not its caller's own.
                let call = s.open[i];
                if let (Kind::Call, Some(Some(b))) = (call.kind, bodies.last_mut()) {
                    if b.last() == Some(&call.pc) {
                        b.pop();
                    }
                }
            }
            let i = i.unwrap_or(0);
            s.open.truncate(i);
            bodies.truncate(i);
        }
        Flow::Call(ret) => {
            let kind = match to == ret || entry {
                true => Kind::Passed,
                false => Kind::Call,
            };
            let pos = p - 1;
            // A call that is an outside entry's first instruction: the
            // walk back meets its entry first (a position's entry, then
            // its flow), so the call is the older opener.
            let n = s.open.len();
            let at = match s.open.last() {
                Some(o) if matches!(o.kind, Kind::Entry(_)) && o.pos == pos => n - 1,
                _ => n,
            };
            let again = false;
            s.open.insert(
                at,
                Opening {
                    kind,
                    pos,
                    pc,
                    ret,
                    again,
                },
            );
            if keep {
                bodies.insert(at.min(bodies.len()), Some(Vec::new()));
            }
        }
        Flow::Other => {}
    }
    // A callee came back to its call's return address without a traced
    // return (straight back, or from untraced code: a PLT stub's jump,
    // a callback's return; not a jump within the procedure onto it): the
    // call opens no frame of a later stop, unless another opener kept
    // returns there (recursion through the call).
    let call = |o: &Opening| !matches!(o.kind, Kind::Entry(_)) && o.ret == to;
    let Some((top, below)) = s.open.split_last() else {
        return;
    };
    let back = || match flow {
        Flow::Call(ret) => ret == to,
        Flow::Ret => from_callback,
        Flow::Other => !same_proc(pc, to),
    };
    if call(top) && back() && !below.iter().any(call) {
        s.open.pop();
        // Its callee's instructions were its caller's own.
        if let (Some(b), true) = (bodies.pop(), keep) {
            match (bodies.last_mut(), b) {
                (Some(Some(a)), Some(b)) if a.len() + b.len() <= BODY => a.extend(b),
                (Some(a), _) => *a = None,
                (None, _) => {}
            }
        }
    }
}

/// Whether `a` and `b` are in one procedure's blocks.
fn same_proc(code: &Code<'_, '_>, a: u64, b: u64) -> bool {
    let entry = |x: u64| code.blocks.at(x).map(|blk| blk.entry);
    entry(a).is_some() && entry(a) == entry(b)
}

/// The openers of `frames[..needed]` (innermost first), taking `open`
/// newest first as the walk back does, each with what it is; `None` where
/// it finds fewer, or an outside entry that is not its frame's.
fn take(open: &[Opening], frames: &[Frame], needed: usize) -> Option<Vec<(Opener, Opening)>> {
    let mut openers = Vec::with_capacity(needed);
    for &o in open.iter().rev() {
        let l = openers.len();
        if l >= needed {
            break;
        }
        let made = by_call(frames, l) && frames[l + 1].0 == o.ret;
        match o.kind {
            Kind::Entry(rsp) if frames[l].1 == o.pc => openers.push((Opener::Entry(rsp), o)),
            Kind::Entry(_) => return None,
            Kind::Call if made => openers.push((Opener::Call(o.pc), o)),
            Kind::Passed if made && is_untraced(frames[l].0) => {
                openers.push((Opener::Passed(o.pc), o))
            }
            _ => {}
        }
    }
    (openers.len() >= needed).then_some(openers)
}

/// [`MOVES`] on every call and return of `modules`' traced blocks,
/// [`RETURN`] after every call, [`ENTRY`] on every procedure's entry.
fn marks(code: &Code<'_, '_>) -> PcFlags {
    let mut marks = PcFlags::over(crate::stack::code_spans(code.modules));
    for m in code.modules {
        for (bi, b) in m.blocks.iter() {
            let start = m.load_base.wrapping_add(b.start);
            let mut bytes = vec![0u8; b.size as usize];
            code.image.read(start, &mut bytes);
            let mut d = Decoder::with_ip(64, &bytes, start, DecoderOptions::NONE);
            for _ in m.insn_lens(bi) {
                let i = d.decode();
                let moves = matches!(
                    i.flow_control(),
                    FlowControl::Call | FlowControl::IndirectCall | FlowControl::Return
                );
                if moves || i.is_invalid() {
                    marks.set(i.ip(), MOVES);
                }
                if matches!(
                    i.flow_control(),
                    FlowControl::Call | FlowControl::IndirectCall
                ) {
                    // (Past the module's code it is no traced pc.)
                    marks.set(i.next_ip(), RETURN);
                }
            }
        }
        for p in m.procs.values() {
            if let Some(e) = m.blocks.get(p.entry) {
                marks.set(m.load_base.wrapping_add(e.start), ENTRY);
            }
        }
    }
    marks
}
