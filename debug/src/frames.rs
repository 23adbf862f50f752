//! The frames' real addresses (their CFAs, as gdb's frame ids and frame
//! bases have them) from a trace's data references (issue 22: no number
//! a user sees is invented; `docs/debug.md`, "Frames' addresses").
//!
//! A frame made by a traced call has its CFA 8 above the slot the call
//! pushed its return address to (the call's store). Walking back from
//! the position, a return pops a slot a call further back pushed: a call
//! whose slot a later return popped is matched (its callee returned);
//! an unmatched call returning where the frame's caller is (the next
//! frame's pc), its slot above the last one found, made the frame. A
//! frame entered from untraced code (`main`, a callback) has its CFA from
//! its first reference after its entry through `rsp` or `rbp` (the
//! register's value is the address less the displacement), by the CFI
//! row there (`crate::cfi::cfa_rule`): walking back, the last one seen
//! before the entry.
//!
//! A control-only trace (format 1.21) has no references but each outside
//! entry's `rsp`, which its stub recorded ([`cfas_by_entries`]): walking
//! back, a return is matched by the traced call that returns where it went
//! or the outside entry that opened its callee (the innermost return
//! walked), and the first unmatched one opens the frame the walk is in. A
//! call whose return is not traced (a PLT stub's jump into untraced code)
//! is its caller's own instruction, `rsp` as before it after it, as in the
//! data walk. A frame opened by an outside entry has its CFA 8 above the
//! recorded `rsp`; one opened by a traced call the caller's `rsp` at the
//! call: the caller's entry `rsp` (its CFA less 8) plus the stack deltas
//! of its procedure to the call (`value::rsp_offsets`). Where a delta is
//! unknown (`alloca`, `and` for alignment) the frame opened by that call
//! has no CFA, nor the frames calls inside it opened (the stub makes up
//! every frame inside it); where an opener is not the frame's, no frame
//! has one.
//!
//! In a passage through untraced code ([`Stand`]) frame 0 is the untraced
//! code's: the walk starts at the instruction that went there, so the
//! untraced frame has the CFA it has seen from a callback (`finish` out
//! of the callback compares them).
//!
//! Invariants: a CFA is given only where found as above, never guessed;
//! the CFAs found grow outwards (each creator's slot above the one before).

use crate::data::{Code, Data, Flow, Ref};
use crate::image::Image;
use crate::timeline::Timeline;
use crate::untraced::is_untraced;
use aetrace_analysis::addr::{Access, Gpr};

/// Where the frames are asked for: before the instruction at `pos` runs,
/// or in the passage through untraced code just before it (`passage`:
/// frame 0 is the untraced code's, the instruction before `pos` is the
/// last that ran, and `pos`'s is none of the frames').
#[derive(Clone, Copy, Debug)]
pub struct Stand {
    /// The next traced instruction's position.
    pub pos: u64,
    /// In the passage before it.
    pub passage: bool,
}

impl Stand {
    /// The latest position the walk back looks at: `pos`, whose
    /// instruction is frame 0's (not run), or in a passage the one
    /// before (run).
    fn last(self) -> Option<u64> {
        self.pos.checked_sub(u64::from(self.passage))
    }
}

/// The CFAs of `frames[..needed]` (pc and procedure entry, innermost
/// first) at `at`, each `None` where not found.
pub fn cfas(
    data: &mut Data,
    t: &mut Timeline<'_>,
    code: &Code<'_, '_>,
    at: Stand,
    frames: &[(u64, u64)],
    needed: usize,
) -> Result<Vec<Option<u64>>, String> {
    let mut walk = Walk {
        frames,
        found: vec![None; needed],
        level: 0,
        pending: Vec::new(),
        last_slot: None,
    };
    if let (true, Some(last)) = (needed > 0, at.last()) {
        data.scan_back(t, code, last, |q, pc, flow, refs| {
            walk.step(code.image, q < at.pos, pc, flow, refs);
            walk.level >= needed
        })?;
    }
    debug_assert!(grows(&walk.found));
    Ok(walk.found)
}

/// The walk back ([`cfas`]): the frame whose body it is in and the slots
/// of returns whose calls are further back.
struct Walk<'f> {
    frames: &'f [(u64, u64)],
    found: Vec<Option<u64>>,
    level: usize,
    pending: Vec<u64>,
    /// The slot the frame below the current one was found at.
    last_slot: Option<u64>,
}

impl Walk<'_> {
    /// One position back; `ran`: its instruction ran (it is before the
    /// position the frames are of).
    fn step(&mut self, image: &Image, ran: bool, pc: u64, flow: Flow, refs: &[Ref]) {
        match (ran, flow) {
            (true, Flow::Ret) => {
                // Its references are the callee's.
                self.pending.extend(slot(refs, Access::Load, 0));
                return;
            }
            (true, Flow::Call(ret)) => {
                if let Some(s) = slot(refs, Access::Store, 8u64.wrapping_neg()) {
                    self.call(s, ret);
                }
            }
            _ => {}
        }
        if self.level >= self.found.len() || !self.pending.is_empty() || self.by_call(self.level) {
            return;
        }
        if let Some(c) = body_cfa(image, pc, refs) {
            self.found[self.level] = Some(c);
        }
        if pc == self.frames[self.level].1 {
            // The frame's entry: the walk is in its caller's body now.
            self.last_slot = self.found[self.level].map(|c| c - 8);
            self.level += 1;
        }
    }

    /// A call that pushed its return address `ret` to slot `s`.
    fn call(&mut self, s: u64, ret: u64) {
        if let Some(i) = self.pending.iter().position(|&x| x == s) {
            self.pending.swap_remove(i);
            return;
        }
        // Returns below its slot were in what it called (untraced code
        // calling back, signal handlers).
        self.pending.retain(|&x| x > s);
        let l = self.level;
        let creator = l < self.found.len()
            && self.by_call(l)
            && self.frames[l + 1].0 == ret
            && self.last_slot.map_or(true, |below| s > below);
        if creator {
            self.found[l] = Some(s + 8);
            self.last_slot = Some(s);
            self.level += 1;
        }
    }

    /// Whether frame `l` was made by a traced call ([`by_call`]).
    fn by_call(&self, l: usize) -> bool {
        by_call(self.frames, l)
    }
}

/// The slot a call pushed to (`disp` -8, a store) or a return popped
/// (`disp` 0, a load): 8 bytes at `rsp` + `disp`.
fn slot(refs: &[Ref], access: Access, disp: u64) -> Option<u64> {
    refs.iter()
        .find(|r| r.access == access && r.end - r.start == 8 && r.from == Some((Gpr::RSP, disp)))
        .map(|r| r.start)
}

/// The CFA at `pc` from a reference through the register its CFI row
/// computes the CFA from.
fn body_cfa(image: &Image, pc: u64, refs: &[Ref]) -> Option<u64> {
    let (reg, off) = crate::cfi::cfa_rule(image, pc)?;
    refs.iter().find_map(|r| match r.from {
        Some((g, disp)) if g == reg => Some(r.start.wrapping_sub(disp).wrapping_add(off as u64)),
        _ => None,
    })
}

/// The most instructions of a frame's own kept for following `rsp`
/// through them ([`Data::follow_rsp`]) where its static deltas do not
/// know it.
const BODY: usize = 4096;

/// What opened a frame ([`cfas_by_entries`]).
#[derive(Clone, Copy, Debug)]
enum Opener {
    /// An outside entry whose stub recorded this `rsp`.
    Entry(u64),
    /// A traced call at this address.
    Call(u64),
}

/// [`cfas`] of a control-only trace from its outside entries' `rsp`
/// ([`Ref::entered_with`]) and the stack deltas of the callers' code.
pub fn cfas_by_entries(
    data: &mut Data,
    t: &mut Timeline<'_>,
    code: &Code<'_, '_>,
    at: Stand,
    frames: &[(u64, u64)],
    needed: usize,
) -> Result<Vec<Option<u64>>, String> {
    // A frame opened by a call needs its caller's entry too.
    let needed_back = match needed {
        0 => return Ok(Vec::new()),
        n if by_call(frames, n - 1) => n + 1,
        n => n,
    };
    let mut walk = Openers {
        frames,
        opened: Vec::new(),
        bodies: Vec::new(),
        needed: needed_back,
        pending: Vec::new(),
        // In a passage, what ran last went to the untraced code.
        next: at.passage.then(|| (frames[0].0, false)),
        broken: false,
    };
    let none = vec![None; needed];
    let Some(last) = at.last() else {
        return Ok(none);
    };
    data.scan_back(t, code, last, |q, pc, flow, refs| {
        walk.step(q < at.pos, pc, flow, refs);
        walk.broken || walk.opened.len() >= walk.needed
    })?;
    if walk.broken || walk.opened.len() < needed_back {
        return Ok(none);
    }
    let mut cfas = vec![None; needed_back];
    for l in (0..needed_back).rev() {
        cfas[l] = match walk.opened[l] {
            Opener::Entry(rsp) => Some(rsp.wrapping_add(8)),
            Opener::Call(call) => match cfas.get(l + 1).copied().flatten() {
                Some(caller) => {
                    let body = walk.bodies.get(l + 1).and_then(Option::as_deref);
                    rsp_at_call(
                        data,
                        code,
                        caller.wrapping_sub(8),
                        body,
                        frames[l + 1].1,
                        call,
                    )?
                }
                None => None,
            },
        };
    }
    cfas.truncate(needed);
    // Outwards, each frame's CFA above the one before, or none is real.
    Ok(match grows(&cfas) {
        true => cfas,
        false => none,
    })
}

/// `rsp` at the call at `call` of a procedure entered at `entry` with
/// `entry_rsp`, its own instructions walked being `body`: by its static
/// stack deltas, else by following them (`None` where `rsp` moved by a
/// value not known).
fn rsp_at_call(
    data: &mut Data,
    code: &Code<'_, '_>,
    entry_rsp: u64,
    body: Option<&[u64]>,
    entry: u64,
    call: u64,
) -> Result<Option<u64>, String> {
    match data.rsp_offset(code, call)? {
        Some(k) => Ok(Some(entry_rsp.wrapping_add(k as u64))),
        None => data.follow_rsp(code, entry_rsp, body, entry),
    }
}

/// Whether the CFAs found grow outwards.
fn grows(cfas: &[Option<u64>]) -> bool {
    let found: Vec<u64> = cfas.iter().flatten().copied().collect();
    found.windows(2).all(|w| w[0] < w[1])
}

/// Whether frame `l` of `frames` was made by a traced call: its caller's
/// pc is a traced return address.
fn by_call(frames: &[(u64, u64)], l: usize) -> bool {
    frames.get(l + 1).is_some_and(|f| !is_untraced(f.0))
}

/// The walk back of [`cfas_by_entries`]: each frame's opener, innermost
/// first, and the returns whose openers are further back.
struct Openers<'f> {
    frames: &'f [(u64, u64)],
    opened: Vec<Opener>,
    /// Per frame opened or being walked, the pcs of its own instructions
    /// walked (latest first, its entry last), up to [`BODY`] of them; `None`
    /// past that.
    bodies: Vec<Option<Vec<u64>>>,
    needed: usize,
    /// Where the traced returns walked whose openers are further back
    /// went, innermost last.
    pending: Vec<u64>,
    /// The position after the one stepped to: its pc, and whether it
    /// is an outside entry.
    next: Option<(u64, bool)>,
    /// An outside entry that is not its frame's: a `longjmp`, a throw or
    /// a tail jump into untraced code passed frames without their returns.
    broken: bool,
}

impl Openers<'_> {
    /// One position back; `ran`: its instruction ran.
    fn step(&mut self, ran: bool, pc: u64, flow: Flow, refs: &[Ref]) {
        let entered = refs.iter().find_map(Ref::entered_with);
        let next = self.next.replace((pc, entered.is_some()));
        let (level, idle) = (self.opened.len(), self.pending.is_empty());
        if let Some(rsp) = entered {
            self.open(Opener::Entry(rsp), self.frames[level].1 == pc);
        }
        let (true, Flow::Call(ret)) = (ran, flow) else {
            if ran && flow == Flow::Ret {
                // Where it went: a traced call that returned there pairs.
                self.pending.extend(next.map(|(a, _)| a));
            } else if idle && ran {
                self.body(level, pc);
            }
            return;
        };
        let l = self.opened.len();
        let made = |l: usize| by_call(self.frames, l) && self.frames[l + 1].0 == ret;
        match next {
            // The callee came straight back, or is the outside entry
            // after it (an indirect call: the entry pairs with its return),
            // or untraced code that called back, whose frame (no return
            // of it is traced) is open only if it is on the stack.
            Some((a, entry)) if a == ret || entry => {
                let untraced = self.frames.get(l).is_some_and(|f| is_untraced(f.0));
                if self.pending.is_empty() && untraced && made(l) {
                    self.opened.push(Opener::Call(pc));
                }
            }
            // A traced callee that returned by a traced `ret`.
            _ if self.pending.last() == Some(&ret) => {
                self.pending.pop();
            }
            // A traced callee whose return was not traced (a PLT stub's
            // jump through the GOT, a tail jump into untraced code) came
            // back with `rsp` as before the call: the frame's own, as in
            // the data walk, unless it opened the frame.
            _ if self.pending.is_empty() && made(l) => self.opened.push(Opener::Call(pc)),
            _ => {}
        }
        if idle && self.opened.len() == l {
            self.body(l, pc);
        }
    }

    /// The instruction at `pc` is frame `l`'s own.
    fn body(&mut self, l: usize, pc: u64) {
        if self.bodies.len() <= l {
            self.bodies.resize(l + 1, Some(Vec::new()));
        }
        let b = &mut self.bodies[l];
        match b {
            Some(pcs) if pcs.len() < BODY => pcs.push(pc),
            _ => *b = None,
        }
    }

    /// An outside entry that pairs with the innermost return seen, or
    /// opens the frame the walk is in if it `fits` it.
    fn open(&mut self, o: Opener, fits: bool) {
        if self.pending.pop().is_none() {
            match fits {
                true => self.opened.push(o),
                false => self.broken = true,
            }
        }
    }
}
