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
//! Joins (issue 22: a stop's cost must not grow with the history before
//! it), for the data walk: [`Joins`] keeps, for each interval of the
//! timeline (its snapshots), what the walk back from the interval's start
//! found of the frames there. A walk that reaches an interval's start, its
//! instruction walked, in a state that walks the rest of the way as the
//! start's own walk, shifted by some levels, ends there with what that one
//! found ([`Walk::join`]): its frames outside the ones it is in are the
//! same (the same return addresses and entries), the returns it has not
//! yet paired are those of the start's innermost frames, which that walk
//! found opened by traced calls, and nothing that walk met on its way back
//! would have been taken differently with the other walk's bounds (the
//! slots a creator must be above, the returns still pending). Where any of
//! this is not certain, the walk goes on to the interval before: a join
//! never changes a result, only where the walk ends. The starts' walks are
//! built in order, each joining the ones before. A control-only trace's
//! openers are kept forwards instead ([`crate::forward`]); the walk back
//! of [`cfas_by_entries`] is what that pass must equal, and what a stop
//! walks where it needs a caller's own instructions.
//!
//! Invariants: a CFA is given only where found as above, never guessed;
//! the CFAs found grow outwards (each creator's slot above the one before);
//! the result of a walk that joins is the result of the same walk
//! walked to its end (`tests/debug.rs`, `frames_from_snapshots_are_the_walks_from_the_start`).

use crate::data::{Code, Data, Flow, Ref};
use crate::timeline::Timeline;
use crate::untraced::is_untraced;
use aetrace_analysis::addr::{Access, Gpr};

/// A frame: its pc (a caller's: its return address) and its procedure's
/// entry.
pub type Frame = (u64, u64);

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
    pub(crate) fn last(self) -> Option<u64> {
        self.pos.checked_sub(u64::from(self.passage))
    }
}

/// The frames at a position, before its instruction runs (the stub's
/// procedure stack): what [`Joins`] keeps the walks of.
pub type FramesAt<'a> = &'a mut dyn for<'t, 'm> FnMut(&'t mut Timeline<'m>, u64) -> Vec<Frame>;

/// What a walk over a thread's positions reads: its references and its
/// timeline, and the code.
pub struct Walking<'x, 'm, 'c, 'd> {
    /// The thread's references (or its outside entries' `rsp`).
    pub data: &'x mut Data<'d>,
    /// The thread's timeline.
    pub t: &'x mut Timeline<'m>,
    /// Where the code is.
    pub code: &'x Code<'x, 'c>,
}

/// What the walks back of [`cfas`] from the intervals' starts found
/// ([`Walk::join`]): interval `k`'s (`k` >= 1) at index `k - 1`, with its
/// start. Per snapshot 56 bytes, and per frame there 16 and a [`Level`]
/// (72 bytes).
#[derive(Default)]
pub struct Joins {
    snaps: Vec<(u64, Snap)>,
    /// A start's walk failed: no later one is built.
    failed: bool,
}

impl Joins {
    /// Builds the walks of the starts of intervals `1..=k`, in order.
    fn reach(&mut self, cx: &mut Walking<'_, '_, '_, '_>, k: usize, frames_at: FramesAt<'_>) {
        while !self.failed && self.snaps.len() < k {
            let start = cx.t.start(self.snaps.len() + 1);
            let frames = frames_at(cx.t, start);
            let n = frames.len();
            let mut w = Walk::new(frames, n);
            match walk_back(cx, start, start, &mut w, &self.snaps) {
                Ok(()) => self.snaps.push((start, w.snap())),
                Err(_) => self.failed = true,
            }
        }
    }
}

/// What the walk back from an interval's start found: the frames there
/// (innermost first) and per frame what the walk learnt.
#[derive(Clone, Debug)]
struct Snap {
    frames: Vec<Frame>,
    levels: Vec<Level>,
}

/// A walk back, a position at a time.
trait Back {
    /// One position back; `ran`: its instruction ran.
    fn step(&mut self, code: &Code<'_, '_>, ran: bool, pc: u64, flow: Flow, refs: &[Ref]);
    /// Whether it has found what it looks for.
    fn done(&self) -> bool;
}

/// Walks `w` back from position `from` (the positions before `ran` ran;
/// an interval's start, `from == ran`, did not and only ends the walk
/// there), ending where it is done or joins the walk of an interval's
/// start in `snaps`.
fn walk_back(
    cx: &mut Walking<'_, '_, '_, '_>,
    from: u64,
    ran: u64,
    w: &mut Walk,
    snaps: &[(u64, Snap)],
) -> Result<(), String> {
    let code = cx.code;
    // The starts at or before the position walked, latest last (the walk
    // goes back: a search per position was a sixth of a data trace's
    // first stop, 2026-12-02).
    let mut before = snaps.partition_point(|s| s.0 <= from);
    cx.data.scan_back(cx.t, code, from, |q, pc, flow, refs| {
        // The start's own instruction, which did not run, is frame 0's
        // (the data walk learns nothing from it).
        if q == ran {
            return false;
        }
        w.step(code, q < ran, pc, flow, refs);
        while before > 0 && snaps[before - 1].0 > q {
            before -= 1;
        }
        let start = before
            .checked_sub(1)
            .map(|i| &snaps[i])
            .filter(|s| s.0 == q);
        w.done() || (q < ran && start.is_some_and(|s| w.join(&s.1)))
    })
}

/// Whether `w` joins the walk of an interval that starts at `q`.
fn join_at(w: &mut Walk, snaps: &[(u64, Snap)], q: u64) -> bool {
    match snaps.binary_search_by_key(&q, |s| s.0) {
        Ok(i) => w.join(&snaps[i].1),
        Err(_) => false,
    }
}

/// Walks `w` back from `at` to where it is done (or the first position).
fn walk_from<W: Back>(
    cx: &mut Walking<'_, '_, '_, '_>,
    at: Stand,
    w: &mut W,
) -> Result<(), String> {
    let Some(last) = at.last() else {
        return Ok(());
    };
    let code = cx.code;
    cx.data.scan_back(cx.t, code, last, |q, pc, flow, refs| {
        w.step(code, q < at.pos, pc, flow, refs);
        w.done()
    })
}

/// Walks `w` back from `at`: its interval first, then, if not done, the
/// intervals before, joining their starts' walks.
fn run(
    cx: &mut Walking<'_, '_, '_, '_>,
    joins: &mut Joins,
    frames_at: FramesAt<'_>,
    at: Stand,
    w: &mut Walk,
) -> Result<(), String> {
    let Some(last) = at.last() else {
        return Ok(());
    };
    let Some(k) = cx.t.interval_of(last) else {
        return Ok(());
    };
    let start = cx.t.start(k);
    // Most stops find their frames in their interval: no start's walk is
    // built for them.
    let mut paused = false;
    let code = cx.code;
    cx.data.scan_back(cx.t, code, last, |q, pc, flow, refs| {
        w.step(code, q < at.pos, pc, flow, refs);
        paused = q == start && !w.done();
        w.done() || paused
    })?;
    if !paused || start == 0 {
        return Ok(());
    }
    joins.reach(cx, k, frames_at);
    if start < at.pos && join_at(w, &joins.snaps, start) {
        return Ok(());
    }
    walk_back(cx, start - 1, at.pos, w, &joins.snaps)
}

/// The CFAs of `frames[..needed]` (pc and procedure entry, innermost
/// first) at `at`, each `None` where not found.
pub fn cfas(
    cx: &mut Walking<'_, '_, '_, '_>,
    joins: &mut Joins,
    frames_at: FramesAt<'_>,
    at: Stand,
    frames: &[Frame],
    needed: usize,
) -> Result<Vec<Option<u64>>, String> {
    let mut walk = Walk::new(frames.to_vec(), needed);
    if needed > 0 {
        run(cx, joins, frames_at, at, &mut walk)?;
    }
    let found: Vec<Option<u64>> = walk.levels.iter().map(|l| l.found).collect();
    debug_assert!(grows(&found));
    Ok(found)
}

/// How the walk back of [`cfas`] left a frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum End {
    /// Not yet (the walk is in it, or ended in it).
    #[default]
    Open,
    /// At its creator, the call that pushed its return address to this
    /// slot.
    Creator(u64),
    /// At its entry.
    Entry,
}

/// What the walk back of [`cfas`] learnt of a frame: its CFA, and what a
/// join needs to know of the way ([`Walk::join`]).
#[derive(Clone, Debug, Default)]
struct Level {
    found: Option<u64>,
    end: End,
    /// The highest slot of a creator (by its return address) that the
    /// bound (the slot of the frame below) refused.
    refused: Option<u64>,
    /// The highest slot of the calls walked in it that neither paired
    /// with a return nor created it.
    others: Option<u64>,
    /// The creator's call dropped returns still pending (below its slot).
    dropped: bool,
}

/// The walk back ([`cfas`]): the frame whose body it is in and the slots
/// of returns whose calls are further back.
struct Walk {
    frames: Vec<Frame>,
    levels: Vec<Level>,
    level: usize,
    pending: Vec<u64>,
    /// The slot the frame below the current one was found at.
    last_slot: Option<u64>,
    joined: bool,
}

impl Walk {
    fn new(frames: Vec<Frame>, needed: usize) -> Walk {
        Walk {
            frames,
            levels: vec![Level::default(); needed],
            level: 0,
            pending: Vec::new(),
            last_slot: None,
            joined: false,
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
        let before = self.pending.len();
        self.pending.retain(|&x| x > s);
        let l = self.level;
        if l >= self.levels.len() {
            return;
        }
        let candidate = self.by_call(l) && self.frames[l + 1].0 == ret;
        let above = self.last_slot.map_or(true, |below| s > below);
        let v = &mut self.levels[l];
        if candidate && above {
            v.found = Some(s + 8);
            v.end = End::Creator(s);
            v.dropped = self.pending.len() < before;
            self.last_slot = Some(s);
            self.level += 1;
            return;
        }
        if candidate {
            v.refused = v.refused.max(Some(s));
        }
        v.others = v.others.max(Some(s));
    }

    /// Whether frame `l` was made by a traced call ([`by_call`]).
    fn by_call(&self, l: usize) -> bool {
        by_call(&self.frames, l)
    }

    /// Whether the rest of the walk from the start of `s`'s interval
    /// would be `s`'s walk shifted by levels (`j` of its frames' returns
    /// pending here): the frames outside the current one the same, the
    /// pending returns those of `s`'s innermost `j` frames, each found at
    /// its creator, and no call `s` walked taken otherwise here (a
    /// creator refused or taken by the other bound, a pending return
    /// dropped).
    fn joins(&self, s: &Snap) -> bool {
        let (l0, j) = (self.level, self.pending.len());
        let n = self.frames.len();
        if s.frames.len() <= j || n - l0 != s.frames.len() - j {
            return false;
        }
        if self.frames[l0].1 != s.frames[j].1 || self.frames[l0 + 1..] != s.frames[j + 1..] {
            return false;
        }
        let inner = &s.levels[..j];
        let mut slots: Vec<u64> = inner
            .iter()
            .filter_map(|v| match v.end {
                End::Creator(c) => Some(c),
                _ => None,
            })
            .collect();
        let mut pending = self.pending.clone();
        slots.sort_unstable();
        pending.sort_unstable();
        if slots != pending || inner.iter().any(|v| v.dropped) {
            return false;
        }
        // A call between the start and the creators, pairing with no
        // return: it drops no pending return here (all above it) ...
        let mut lowest = u64::MAX;
        for v in inner.iter().rev() {
            if let End::Creator(c) = v.end {
                lowest = lowest.min(c);
            }
            if v.others.is_some_and(|m| m >= lowest) {
                return false;
            }
        }
        // ... nor creates the current frame here (below the bound).
        let others = inner.iter().filter_map(|v| v.others).max();
        if self.by_call(l0) && others.is_some_and(|m| self.last_slot.map_or(true, |b| m > b)) {
            return false;
        }
        self.same_bounds(s, j)
    }

    /// Whether the creators of `s`'s frames `j` and `j + 1` are taken
    /// and refused here as there, where the bound differs: frame `j`'s is
    /// the slot of the frame below the current one here; frame `j + 1`'s
    /// differs where frame `j` ended at its entry with no CFA there but
    /// one here.
    fn same_bounds(&self, s: &Snap, j: usize) -> bool {
        let b = self.last_slot;
        let v = &s.levels[j];
        if v.refused.is_some_and(|r| b.map_or(true, |b| r > b)) {
            return false;
        }
        if matches!(v.end, End::Creator(a) if b.is_some_and(|b| a <= b)) {
            return false;
        }
        let mine = self.levels[self.level].found;
        let next = s.levels.get(j + 1).map(|w| w.end);
        !matches!((v.end, v.found, mine, next),
            (End::Entry, None, Some(c), Some(End::Creator(a))) if a <= c.wrapping_sub(8))
    }

    /// At the start of `s`'s interval, its instruction walked: ends the
    /// walk with what `s` found, if the rest of the way would be `s`'s
    /// walk's (then `true`).
    fn join(&mut self, s: &Snap) -> bool {
        if !self.joins(s) {
            return false;
        }
        let (l0, j) = (self.level, self.pending.len());
        let mine = &self.levels[l0];
        // The calls between the start and the creators are the current
        // frame's here.
        let passed = s.levels[..j].iter().filter_map(|v| v.others).max();
        let v = &s.levels[j];
        let merged = Level {
            found: v.found.or(mine.found),
            end: v.end,
            refused: mine.refused.max(passed).max(v.refused),
            others: mine.others.max(passed).max(v.others),
            dropped: mine.dropped || v.dropped,
        };
        self.levels[l0] = merged;
        let rest = self.levels.len() - l0 - 1;
        self.levels[l0 + 1..].clone_from_slice(&s.levels[j + 1..j + 1 + rest]);
        self.joined = true;
        true
    }

    /// What it found.
    fn snap(self) -> Snap {
        Snap {
            frames: self.frames,
            levels: self.levels,
        }
    }
}

impl Back for Walk {
    fn step(&mut self, code: &Code<'_, '_>, ran: bool, pc: u64, flow: Flow, refs: &[Ref]) {
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
        let l = self.level;
        if l >= self.levels.len() || !self.pending.is_empty() || self.by_call(l) {
            return;
        }
        if let Some(c) = body_cfa(code.image, pc, refs) {
            self.levels[l].found = Some(c);
        }
        if pc == self.frames[l].1 {
            // The frame's entry: the walk is in its caller's body now.
            self.levels[l].end = End::Entry;
            self.last_slot = self.levels[l].found.map(|c| c - 8);
            self.level += 1;
        }
    }

    fn done(&self) -> bool {
        self.joined || self.level >= self.levels.len()
    }
}

/// The slot a call pushed to (`disp` -8, a store) or a return popped
/// (`disp` 0, a load): 8 bytes at `rsp` + `disp`.
pub(crate) fn slot(refs: &[Ref], access: Access, disp: u64) -> Option<u64> {
    refs.iter()
        .find(|r| r.access == access && r.end - r.start == 8 && r.from == Some((Gpr::RSP, disp)))
        .map(|r| r.start)
}

/// The CFA at `pc` from a reference through the register its CFI row
/// computes the CFA from.
pub(crate) fn body_cfa(image: &crate::image::Image, pc: u64, refs: &[Ref]) -> Option<u64> {
    let (reg, off) = crate::cfi::cfa_rule(image, pc)?;
    refs.iter().find_map(|r| match r.from {
        Some((g, disp)) if g == reg => Some(r.start.wrapping_sub(disp).wrapping_add(off as u64)),
        _ => None,
    })
}

/// The most instructions of a frame's own kept for following `rsp`
/// through them ([`Data::follow_rsp`]) where its static deltas do not
/// know it.
pub(crate) const BODY: usize = 4096;

/// What opened a frame ([`cfas_by_entries`], [`crate::forward`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Opener {
    /// An outside entry whose stub recorded this `rsp`.
    Entry(u64),
    /// A traced call at this address.
    Call(u64),
    /// A traced call at this address into untraced code that called
    /// back (the untraced frame's opener, found with its callee's
    /// outside entry after it).
    Passed(u64),
}

/// The frames whose openers the CFAs of `frames[..needed]` need: a frame
/// opened by a call needs its caller's entry too.
pub(crate) fn needed_back(frames: &[Frame], needed: usize) -> usize {
    match needed {
        0 => 0,
        n if by_call(frames, n - 1) => n + 1,
        n => n,
    }
}

/// [`cfas`] of a control-only trace from its outside entries' `rsp`
/// ([`Ref::entered_with`]) and the stack deltas of the callers' code,
/// walking back from `at` (the reference [`crate::forward`] is compared
/// with).
pub fn cfas_by_entries(
    cx: &mut Walking<'_, '_, '_, '_>,
    at: Stand,
    frames: &[Frame],
    needed: usize,
) -> Result<Vec<Option<u64>>, String> {
    let needed_back = needed_back(frames, needed);
    let mut walk = Openers::new(frames.to_vec(), needed_back);
    // In a passage, what ran last went to the untraced code.
    walk.next = at.passage.then(|| (frames[0].0, false));
    let none = vec![None; needed];
    if needed_back == 0 || at.last().is_none() {
        return Ok(none);
    }
    walk_from(cx, at, &mut walk)?;
    if walk.broken.is_some() || walk.opened < needed_back {
        return Ok(none);
    }
    let openers: Vec<Opener> = (walk.levels.iter().take(needed_back))
        .map(|v| v.opener.expect("opened"))
        .collect();
    let levels = &walk.levels;
    let mut body = |_: &mut Data, l: usize| Ok(levels.get(l).and_then(|v| v.body.clone()));
    cfas_of(cx.data, cx.code, frames, &openers, &mut body, needed)
}

/// Frame `l`'s own instructions walked back from the call that opened
/// frame `l - 1` (latest first, its entry last; [`BODY`] at most), or
/// `None` where there are more.
pub(crate) type Body<'a> = &'a mut dyn FnMut(&mut Data, usize) -> Result<Option<Vec<u64>>, String>;

/// The CFAs of `frames[..needed]` from their openers (innermost first),
/// or none where they do not grow outwards. A frame opened by a call has
/// its caller's `rsp` at the call: by the caller's static stack deltas,
/// else by following them through the caller's own instructions
/// (`body`).
pub(crate) fn cfas_of(
    data: &mut Data,
    code: &Code<'_, '_>,
    frames: &[Frame],
    openers: &[Opener],
    body: Body<'_>,
    needed: usize,
) -> Result<Vec<Option<u64>>, String> {
    let n = openers.len();
    let mut cfas = vec![None; n];
    for l in (0..n).rev() {
        cfas[l] = match openers[l] {
            Opener::Entry(rsp) => Some(rsp.wrapping_add(8)),
            Opener::Call(call) | Opener::Passed(call) => match cfas.get(l + 1).copied().flatten() {
                Some(caller) => {
                    let entry_rsp = caller.wrapping_sub(8);
                    match data.rsp_offset(code, call)? {
                        Some(k) => Some(entry_rsp.wrapping_add(k as u64)),
                        None => {
                            let own = body(data, l + 1)?;
                            data.follow_rsp(code, entry_rsp, own.as_deref(), frames[l + 1].1)?
                        }
                    }
                }
                None => None,
            },
        };
    }
    cfas.truncate(needed);
    // Outwards, each frame's CFA above the one before, or none is real.
    Ok(match grows(&cfas) {
        true => cfas,
        false => vec![None; needed],
    })
}

/// Whether the CFAs found grow outwards.
pub(crate) fn grows(cfas: &[Option<u64>]) -> bool {
    let found: Vec<u64> = cfas.iter().flatten().copied().collect();
    found.windows(2).all(|w| w[0] < w[1])
}

/// Whether frame `l` of `frames` was made by a traced call: its caller's
/// pc is a traced return address.
pub(crate) fn by_call(frames: &[Frame], l: usize) -> bool {
    frames.get(l + 1).is_some_and(|f| !is_untraced(f.0))
}

/// What the walk back of [`cfas_by_entries`] learnt of a frame.
#[derive(Clone, Debug)]
struct EntryLevel {
    /// What opened it, once found.
    opener: Option<Opener>,
    /// The pcs of its own instructions walked (latest first, its entry
    /// last), up to [`BODY`] of them; `None` past that.
    body: Option<Vec<u64>>,
}

impl Default for EntryLevel {
    fn default() -> Self {
        EntryLevel {
            opener: None,
            body: Some(Vec::new()),
        }
    }
}

/// The walk back of [`cfas_by_entries`]: each frame's opener, innermost
/// first, and the returns whose openers are further back.
struct Openers {
    frames: Vec<Frame>,
    /// Per frame opened or being walked.
    levels: Vec<EntryLevel>,
    /// How many are opened.
    opened: usize,
    needed: usize,
    /// Where the traced returns walked whose openers are further back
    /// went, innermost last.
    pending: Vec<u64>,
    /// The position after the one stepped to: its pc, and whether it
    /// is an outside entry.
    next: Option<(u64, bool)>,
    /// The level at which an outside entry was found that is not its
    /// frame's: a `longjmp`, a throw or a tail jump into untraced code
    /// passed frames without their returns.
    broken: Option<usize>,
}

impl Openers {
    fn new(frames: Vec<Frame>, needed: usize) -> Openers {
        Openers {
            frames,
            levels: Vec::new(),
            opened: 0,
            needed,
            pending: Vec::new(),
            next: None,
            broken: None,
        }
    }

    /// Frame `l`'s level, made if not yet.
    fn level(&mut self, l: usize) -> &mut EntryLevel {
        if self.levels.len() <= l {
            self.levels.resize(l + 1, EntryLevel::default());
        }
        &mut self.levels[l]
    }

    /// Opens the frame the walk is in.
    fn push(&mut self, o: Opener) {
        let l = self.opened;
        self.level(l).opener = Some(o);
        self.opened += 1;
    }

    /// The instruction at `pc` is frame `l`'s own.
    fn body(&mut self, l: usize, pc: u64) {
        let b = &mut self.level(l).body;
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
                true => self.push(o),
                false => self.broken = Some(self.opened),
            }
        }
    }
}

impl Back for Openers {
    fn step(&mut self, _: &Code<'_, '_>, ran: bool, pc: u64, flow: Flow, refs: &[Ref]) {
        let entered = refs.iter().find_map(Ref::entered_with);
        let next = self.next.replace((pc, entered.is_some()));
        let (level, idle) = (self.opened, self.pending.is_empty());
        if let Some(rsp) = entered {
            let fits = self.frames[level].1 == pc;
            self.open(Opener::Entry(rsp), fits);
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
        let l = self.opened;
        let made = |l: usize| by_call(&self.frames, l) && self.frames[l + 1].0 == ret;
        match next {
            // The callee came straight back, or is the outside entry
            // after it (an indirect call: the entry pairs with its return),
            // or untraced code that called back, whose frame (no return
            // of it is traced) is open only if it is on the stack.
            Some((a, entry)) if a == ret || entry => {
                let untraced = self.frames.get(l).is_some_and(|f| is_untraced(f.0));
                if self.pending.is_empty() && untraced && made(l) {
                    self.push(Opener::Passed(pc));
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
            _ if self.pending.is_empty() && made(l) => self.push(Opener::Call(pc)),
            _ => {}
        }
        if idle && self.opened == l {
            self.body(l, pc);
        }
    }

    fn done(&self) -> bool {
        self.broken.is_some() || self.opened >= self.needed
    }
}
