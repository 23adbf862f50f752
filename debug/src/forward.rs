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
//! first as the walk back does ([`Forward::openers`]), with the frames the
//! procedure stack gives there.
//!
//! A call whose callee came back to its return address without a traced
//! return (a PLT stub's jump into untraced code) is kept by the walk back
//! for ever; it opens a frame there only if that frame's caller's pc is
//! its return address, so it is dropped once reached unless another
//! opener kept returns there too (recursion through the call). The openers
//! kept are then those of the frames open, and the calls whose callees
//! have not come back: the state per interval start is bounded by the
//! stack's depth (24 bytes per opener).
//!
//! Where a frame's CFA needs a call's stack delta that the static deltas
//! do not know (`alloca`, `and` for alignment), the instructions of its
//! caller's own are needed: the stop walks back instead (`None` from
//! [`Forward::cfas`]).
//!
//! Invariants: the openers at position `n` are the same for any order of
//! visits (kept per interval start, computed front to back); the CFAs
//! given are those of the walk back from the same stop
//! (`tests/debug.rs`, `frames_from_snapshots_are_the_walks_from_the_start`).

use crate::data::{Code, Data, Flow};
use crate::frames::{by_call, cfas_of, Frame, Opener, Stand};
use crate::pcmap::PcFlags;
use crate::untraced::is_untraced;
use iced_x86::{Decoder, DecoderOptions, FlowControl};

/// [`Forward::marks`]: a call or a return.
const MOVES: u8 = 1;
/// [`Forward::marks`]: a procedure's entry (an outside entry's stub may
/// have recorded `rsp` before it).
const ENTRY: u8 = 2;

/// An opener no return has paired with yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Opening {
    kind: Kind,
    /// The call's or the entry's address.
    pc: u64,
    /// A call's return address.
    ret: u64,
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

/// The openers at each interval's start (see the module comment).
pub struct Forward {
    marks: PcFlags,
    /// Interval `k`'s start's at index `k`.
    states: Vec<State>,
}

impl Forward {
    /// The pass over `modules`' code (read from `code.image`).
    pub fn new(code: &Code<'_, '_>) -> Forward {
        Forward {
            marks: marks(code),
            states: vec![State::default()],
        }
    }

    /// The CFAs of `frames[..needed]` (innermost first) at `at`, as
    /// [`crate::frames::cfas_by_entries`] finds them; `None` where that
    /// needs a caller's instructions walked (an unknown stack delta).
    pub fn cfas(
        &mut self,
        cx: &mut crate::frames::Walking<'_, '_, '_>,
        at: Stand,
        frames: &[Frame],
        needed: usize,
    ) -> Result<Option<Vec<Option<u64>>>, String> {
        let needed_back = crate::frames::needed_back(frames, needed);
        let none = vec![None; needed];
        let Some(last) = at.last().filter(|_| needed_back > 0) else {
            return Ok(Some(none));
        };
        let mut s = self.state_at(cx, last)?;
        if at.passage {
            // What ran last went to the untraced code.
            let next = (frames[0].0, false);
            apply(&mut s, next, |_, _| false);
        }
        let Some(openers) = take(&s.open, frames, needed_back) else {
            return Ok(Some(none));
        };
        cfas_of(cx.data, cx.code, frames, &openers, None, needed)
    }

    /// The state at position `n` (before it runs, its outside entry
    /// opened), from its interval's start.
    fn state_at(
        &mut self,
        cx: &mut crate::frames::Walking<'_, '_, '_>,
        n: u64,
    ) -> Result<State, String> {
        let Some(k) = cx.t.interval_of(n) else {
            return Ok(State::default());
        };
        self.reach(cx, k)?;
        let mut s = self.states[k].clone();
        let (start, addrs) = cx.t.interval(k);
        let upto = &addrs[..=(n - start) as usize];
        self.walk(cx.data, cx.code, &mut s, upto)?;
        Ok(s)
    }

    /// Computes the states at the starts of intervals up to `k`.
    fn reach(
        &mut self,
        cx: &mut crate::frames::Walking<'_, '_, '_>,
        k: usize,
    ) -> Result<(), String> {
        while self.states.len() <= k {
            let j = self.states.len() - 1;
            let mut s = self.states[j].clone();
            let (_, addrs) = cx.t.interval(j);
            self.walk(cx.data, cx.code, &mut s, addrs)?;
            self.states.push(s);
        }
        Ok(())
    }

    /// Steps `s` through the instructions at `addrs`.
    fn walk(
        &self,
        data: &mut Data,
        code: &Code<'_, '_>,
        s: &mut State,
        addrs: &[u64],
    ) -> Result<(), String> {
        for &pc in addrs {
            let m = self.marks.get(pc);
            let entered = match m & ENTRY != 0 {
                true => data.outside_entry(code, s.prev.map(|p| p.0), pc)?,
                false => false,
            };
            apply(s, (pc, entered), |a, b| same_proc(code, a, b));
            if entered {
                let rsp = data.entry_value(s.values, pc)?;
                s.values += 1;
                s.open.push(Opening {
                    kind: Kind::Entry(rsp),
                    pc,
                    ret: 0,
                });
            }
            let flow = match m & MOVES != 0 {
                true => data.flow(code, pc)?,
                false => Flow::Other,
            };
            s.prev = Some((pc, flow));
        }
        Ok(())
    }
}

/// Applies the previous position's flow to `s`, the position after it
/// being `next` (its pc, and whether it is an outside entry);
/// `same_proc(a, b)`: whether `a` and `b` are in one procedure.
fn apply(s: &mut State, next: (u64, bool), same_proc: impl Fn(u64, u64) -> bool) {
    let Some((pc, flow)) = s.prev.take() else {
        return;
    };
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
            s.open.truncate(i.unwrap_or(0));
        }
        Flow::Call(ret) => {
            let kind = match to == ret || entry {
                true => Kind::Passed,
                false => Kind::Call,
            };
            s.open.push(Opening { kind, pc, ret });
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
    }
}

/// Whether `a` and `b` are in one procedure's blocks.
fn same_proc(code: &Code<'_, '_>, a: u64, b: u64) -> bool {
    let entry = |x: u64| code.blocks.at(x).map(|blk| blk.entry);
    entry(a).is_some() && entry(a) == entry(b)
}

/// The openers of `frames[..needed]` (innermost first), taking `open`
/// newest first as the walk back does; `None` where it finds fewer, or an
/// outside entry that is not its frame's.
fn take(open: &[Opening], frames: &[Frame], needed: usize) -> Option<Vec<Opener>> {
    let mut openers = Vec::with_capacity(needed);
    for o in open.iter().rev() {
        let l = openers.len();
        if l >= needed {
            break;
        }
        let made = by_call(frames, l) && frames[l + 1].0 == o.ret;
        match o.kind {
            Kind::Entry(rsp) if frames[l].1 == o.pc => openers.push(Opener::Entry(rsp)),
            Kind::Entry(_) => return None,
            Kind::Call if made => openers.push(Opener::Call(o.pc)),
            Kind::Passed if made && is_untraced(frames[l].0) => openers.push(Opener::Passed(o.pc)),
            _ => {}
        }
    }
    (openers.len() >= needed).then_some(openers)
}

/// [`MOVES`] on every call and return of `modules`' traced blocks,
/// [`ENTRY`] on every procedure's entry.
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
