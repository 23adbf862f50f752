//! The procedure stack at any position, rebuilt from the instruction
//! stream alone (a shadow stack, as call-trace tools build one from branch
//! traces), for backtraces, `finish` and `next` in gdb.
//!
//! Rules, applied at each step from instruction `a` to instruction `b`:
//! `b` right after `a` changes nothing (a fall-through, or a call into
//! untraced code that came back); `a` a call (not a tail call) and `b`
//! elsewhere pushes `a`'s return address (a traced callee, or a callback
//! from untraced code the call ran); `b` a return address on the stack
//! pops down to it (a return, a longjmp or an exception to a caller),
//! unless `b` is a direct successor of `a` in the CFG and follows a call
//! that returns (a jump within the frame onto a return address: libc's
//! `msort_with_tmp`, whose recursion gcc inlined one level of, jumps past
//! its call onto the instruction after it, the return address of its
//! callers' frames of itself);
//! `b` a C++ landing pad of procedure `q` reached by no CFG edge from `a`
//! (the unwinder entered it) pops the frames from the newest one of `q`
//! at a call with a landing pad on, as the regenerator's LANDING does:
//! that frame goes on at `b` (before 2026-12-01 the unwinder's skipped
//! frames stayed until a later return popped them);
//! anything else is a jump within the frame ([`Stacks::change`]). Untraced
//! code therefore has no frames of its own: a callback's caller is the
//! traced call that started the untraced code.
//!
//! With passages ([`Stacks::with_passages`], the debugger's stacks), a
//! step that went through untraced code which called traced code back
//! (`crate::untraced`) has a frame for that code, whose return address is
//! [`RETURNED`]: a call or jump into untraced code that did not come
//! straight back (its target, by the instruction's encoding, is not `b`)
//! enters it (a call first pushes its return address); a return with
//! [`RETURNED`] on top, or one to no address on the stack that lands on
//! a procedure's entry, returns into it. After the passage, `b` on the
//! stack pops to it (the untraced code returned), a procedure's entry is
//! a callback (push [`RETURNED`]), anything else replaces the frame.
//!
//! A signal that interrupted traced code at instruction `x` (the
//! timeline's deliveries, with passages) makes the handler's caller the
//! restorer ([`SIGRETURN`], untraced: gdb's `<signal handler called>`)
//! and its caller `x`'s frame: the stack steps to `x`, pushes `x` and
//! [`SIGRETURN`], and the handler's first instruction is no step from
//! anything; its return pops to `x`. A signal that interrupted untraced
//! code (`raise`) makes its handler a callback from there called by the
//! restorer: it pushes [`RETURNED`] (the untraced code's frame) and
//! [`SIGRETURN`], and its return is a passage of two positions
//! ([`Passage::SigreturnedIntoUntraced`]: the restorer's, then the
//! untraced code's, whose frame pops there), as natively the restorer,
//! then libc.
//!
//! Invariants: the stack at an interval's start is the same whatever order
//! positions are visited in (it is computed front to back, interval by
//! interval, and kept per interval), and so are the passages.

use crate::image::Image;
use crate::pcmap::{Flagged, PcFlags, PcMap, PcSet};
use crate::timeline::{Signal, Timeline};
use crate::untraced::{decode, Exit, Passage, To, RETURNED, SIGRETURN, UNTRACED};
use aetrace_format::progdb::EdgeKindDb;
use aetrace_regen::compile::{BlockIx, Module as Compiled};

/// The stack and the previous instruction's address, at an interval start.
#[derive(Clone, Debug, Default)]
struct State {
    stack: Vec<u64>,
    prev: Option<u64>,
    /// Whether `prev` has [`FROM`] (looked up as the step's target).
    from: bool,
    /// Whether `stack` may hold an address without [`RET`] (a signal's
    /// interrupted instruction), which any step may pop to.
    odd: bool,
}

/// [`Stacks::marks`]: a step from this instruction may change the stack
/// or pass through untraced code (a key of `calls` or of the passages'
/// sites, a source of `jumps_to_returns` or `jumps_to_pads`).
const FROM: u8 = 1;
/// [`Stacks::marks`]: a landing pad.
const PAD: u8 = 2;
/// [`Stacks::marks`]: a return address a call pushes (the stack holds
/// only those, [`RETURNED`], [`SIGRETURN`] and, while [`State::odd`],
/// signals' interrupted instructions).
const RET: u8 = 4;

/// Shadow stacks of one timeline.
pub struct Stacks {
    /// Call instruction address -> return address (the next instruction).
    calls: PcMap<u64, u64>,
    /// CFG edges within a procedure (fall-through, direct or jump-table
    /// jump) that land on a return address: (last instruction of the
    /// block, the return address).
    jumps_to_returns: PcSet<(u64, u64)>,
    /// Landing pads of C++ exceptions: pad address -> its procedure (module
    /// index, procedure entry).
    pads: PcMap<u64, (usize, u64)>,
    /// Return addresses of calls with a landing pad -> the calling
    /// procedure (module index, procedure entry).
    landing_calls: PcMap<u64, (usize, u64)>,
    /// CFG edges within a procedure that reach a landing pad (no unwinding).
    jumps_to_pads: PcSet<(u64, u64)>,
    /// [`FROM`], [`PAD`] and [`RET`]: a step from an instruction without
    /// [`FROM`] to one without [`PAD`] changes the stack only by popping
    /// to its target, when that is on the stack, which needs [`RET`]
    /// unless [`State::odd`] ([`Stacks::step`]'s fast path: one look-up
    /// per instruction, no hashing, no search of the stack).
    marks: PcFlags,
    /// States at the starts of intervals `0..states.len()` (the last one
    /// may be the state after the last interval).
    states: Vec<State>,
    /// Passages through untraced code, when looked for.
    passages: Option<Passages>,
}

impl Stacks {
    /// The call sites of `modules` (non-tail calls ending a block).
    pub fn new(modules: &[&Compiled]) -> Stacks {
        let mut calls = PcMap::default();
        for (a, len, b) in block_ends(modules) {
            if b.call.is_some_and(|c| !c.tail) {
                calls.insert(a, a + len);
            }
        }
        let returns = returns_of_returning_calls(modules);
        let (pads, landing_calls) = landings(modules);
        let pad_set = pads.keys().copied().collect();
        let jumps_to_returns = jumps_to(modules, &returns);
        let jumps_to_pads = jumps_to(modules, &pad_set);
        let mut marks = PcFlags::over(code_spans(modules));
        let sources = jumps_to_returns.iter().chain(&jumps_to_pads).map(|j| j.0);
        calls
            .keys()
            .copied()
            .chain(sources)
            .for_each(|a| mark(&mut marks, a, FROM));
        pads.keys().for_each(|&a| mark(&mut marks, a, PAD));
        // (A return address past a module's code is no traced
        // instruction's: the walk never looks it up.)
        calls.values().for_each(|&r| _ = marks.set(r, RET));
        Stacks {
            calls,
            jumps_to_returns,
            pads,
            landing_calls,
            jumps_to_pads,
            marks,
            states: vec![State::default()],
            passages: None,
        }
    }

    /// The same stacks with passages through untraced code (the module
    /// comment), decoding the blocks' last instructions from `image`.
    pub fn with_passages(mut self, modules: &[&Compiled], image: &Image) -> Stacks {
        let p = Passages::new(modules, image);
        p.sites.keys().for_each(|&a| mark(&mut self.marks, a, FROM));
        for site in p.sites.values() {
            if let Exit::Call { ret, .. } = site.exit {
                _ = self.marks.set(ret, RET);
            }
        }
        self.passages = Some(p);
        self
    }

    /// Return addresses at position `n` (before its instruction runs),
    /// innermost first; with `passage` `Some(i)`, in the `i`th position
    /// of the passage through untraced code just before it (its last if
    /// it has fewer).
    pub fn at(&mut self, t: &mut Timeline<'_>, n: u64, passage: Option<u8>) -> Vec<u64> {
        let mut s = match passage {
            Some(_) => self.state_at(t, n - 1),
            None => self.state_at(t, n),
        };
        // The passage leads to the instruction a signal interrupted, if one
        // was delivered before `n`, else to `n`.
        let to = match self.interrupted(t, n) {
            Some(x) => Some(x),
            None => t.address(n),
        };
        if let (Some(i), Some(p), Some(a), Some(b)) = (passage, &self.passages, s.prev, to) {
            let two = p.enter(a, b, &mut s.stack) == Some(Passage::SigreturnedIntoUntraced);
            if two && i > 0 {
                // The restorer returned into the untraced code.
                s.stack.pop();
            }
        }
        s.stack.reverse();
        s.stack
    }

    /// Return addresses where the signal delivered before position `n`
    /// interrupted traced code at `pc` (before that instruction ran),
    /// innermost first.
    pub fn at_signal(&mut self, t: &mut Timeline<'_>, n: u64, pc: u64) -> Vec<u64> {
        let mut s = self.state_at(t, n - 1);
        self.step(&mut s, pc, false);
        s.stack.reverse();
        s.stack
    }

    /// The traced instruction a signal delivered before position `n`
    /// interrupted, with passages (the debugger's stacks).
    fn interrupted(&self, t: &mut Timeline<'_>, n: u64) -> Option<u64> {
        self.passages.as_ref()?;
        let s = t.signal_before(n, 0)?;
        t.interrupted(s).pc
    }

    /// Past the thread's last instruction, at position `len` (what ran
    /// next was untraced: libc's `exit`, a thread's start routine's caller,
    /// the kernel): the pc of `<untraced>` there ([`RETURNED`] after a
    /// return, else [`UNTRACED`]) and the return addresses, innermost first.
    pub fn after_end(&mut self, t: &mut Timeline<'_>, len: u64) -> (u64, Vec<u64>) {
        let mut s = self.state_at(t, len - 1);
        let last = s.prev.and_then(|a| self.exit_of(a));
        let pc = match last {
            Some(Exit::Call { ret, .. }) => {
                s.stack.push(ret);
                UNTRACED
            }
            Some(Exit::Ret) => {
                s.stack.pop();
                RETURNED
            }
            _ => UNTRACED,
        };
        s.stack.reverse();
        (pc, s.stack)
    }

    /// How the instruction at `a` transfers control, if it ends a block
    /// with a call, an unconditional jump or a return (with passages).
    fn exit_of(&self, a: u64) -> Option<Exit> {
        self.passages.as_ref()?.sites.get(&a).map(|s| s.exit)
    }

    /// The state after position `n`'s step (an empty one past the end).
    fn state_at(&mut self, t: &mut Timeline<'_>, n: u64) -> State {
        let Some(k) = t.interval_of(n) else {
            return State::default();
        };
        self.reach(t, k);
        let mut s = self.states[k].clone();
        let (start, sigs) = self.signals(t, k);
        let (_, addrs) = t.interval(k);
        let upto = &addrs[..=(n - start) as usize];
        let mut flagged = Vec::new();
        self.marks.flagged(upto, &mut flagged);
        self.walk(&mut s, start, upto, &flagged, &sigs, |_, _| ());
        s
    }

    /// Interval `k`'s first position and the signals delivered before its
    /// positions, when the stacks show handlers as called by the code a
    /// signal interrupted (with passages: the debugger's).
    fn signals(&self, t: &mut Timeline<'_>, k: usize) -> (u64, Vec<Signal>) {
        let (start, addrs) = t.interval(k);
        let end = start + addrs.len() as u64;
        let sigs = match self.passages {
            Some(_) => t.signals_between(start, end).to_vec(),
            None => Vec::new(),
        };
        let sigs = sigs.into_iter().map(|s| t.interrupted(s)).collect();
        (start, sigs)
    }

    /// Steps `s` through `addrs`, the instructions from position `start`
    /// on, whose flagged positions (the stack's flags at least) `flagged`
    /// lists ([`PcFlags::flagged`]), calling `f` with each passage and
    /// the position after it. A
    /// signal that interrupted traced code at `x` ([`Signal::pc`]) first
    /// steps to `x`, then calls its handler from there: the handler's
    /// caller is the restorer (untraced code, [`SIGRETURN`]), whose caller
    /// is `x`'s frame (as gdb shows `<signal handler called>`). One that
    /// interrupted untraced code makes the step into its handler push the
    /// restorer over the untraced code's frame ([`Passages::through`]).
    fn walk(
        &self,
        s: &mut State,
        start: u64,
        addrs: &[u64],
        flagged: &[(u32, u8)],
        sigs: &[Signal],
        mut f: impl FnMut(u64, Passage),
    ) {
        let mut sigs = sigs.iter().peekable();
        let mut loud = Flagged::new(flagged);
        let mut i = 0;
        while i < addrs.len() {
            let q = start + i as u64;
            // The steps [`Stacks::step`] makes nothing of (no [`FROM`]
            // before, no [`PAD`] or [`RET`] target, no signal) at once.
            let sig = sigs.peek().map_or(u64::MAX, |g| g.pos);
            if !s.from && !s.odd && s.prev.is_some() && q < sig {
                let upto = addrs
                    .len()
                    .min((sig - start).try_into().unwrap_or(usize::MAX));
                let n = loud.quiet(i, upto, FROM | PAD | RET);
                if n > 0 {
                    s.prev = Some(addrs[i + n - 1]);
                    i += n;
                    continue;
                }
            }
            let b = addrs[i];
            i += 1;
            let (mut before, mut untraced) = (None, false);
            while let Some(g) = sigs.next_if(|g| g.pos <= q) {
                let Some(x) = g.pc else {
                    untraced = true;
                    continue;
                };
                before = before.or(self.step(s, x, false));
                s.stack.extend([x, SIGRETURN]);
                s.odd = true;
                s.prev = None;
            }
            if let Some(p) = before.or(self.step(s, b, untraced)) {
                f(q, p);
            }
        }
    }

    /// The intervals whose starts' states are known: `0..=reached()`.
    pub fn reached(&self) -> usize {
        self.states.len() - 1
    }

    /// Computes the states at the starts of intervals up to `k` (one
    /// past the last interval: the state after it); walking interval
    /// `k - 1` while it is the timeline's window regenerates nothing.
    pub fn reach(&mut self, t: &mut Timeline<'_>, k: usize) {
        let mut flagged = Vec::new();
        while self.states.len() <= k {
            let (_, addrs) = t.interval(self.reached());
            self.marks.flagged(addrs, &mut flagged);
            self.reach_next(t, &flagged);
        }
    }

    /// Walks interval `reached()`, whose flagged positions (the stack's
    /// flags at least) `flagged` lists, keeping the state after it: the
    /// stub's riders scan the interval once for this walk and the
    /// openers'.
    pub fn reach_next(&mut self, t: &mut Timeline<'_>, flagged: &[(u32, u8)]) {
        let j = self.reached();
        let mut s = self.states[j].clone();
        let (start, sigs) = self.signals(t, j);
        let (_, addrs) = t.interval(j);
        self.walk(&mut s, start, addrs, flagged, &sigs, |_, _| ());
        self.states.push(s);
    }

    /// The flags the walk stops at.
    pub fn marks(&self) -> &PcFlags {
        &self.marks
    }

    /// The passages through untraced code before positions of interval
    /// `k`: (position, passage), in order (none without passages).
    pub fn passages(&mut self, t: &mut Timeline<'_>, k: usize) -> &[(u64, Passage)] {
        let known = self.passages.as_ref().map(|p| p.found.contains_key(&k));
        if known == Some(false) {
            self.reach(t, k);
            let mut s = self.states[k].clone();
            let (start, sigs) = self.signals(t, k);
            let (_, addrs) = t.interval(k);
            let mut found = Vec::new();
            let mut flagged = Vec::new();
            self.marks.flagged(addrs, &mut flagged);
            self.walk(&mut s, start, addrs, &flagged, &sigs, |q, p| {
                found.push((q, p))
            });
            let p = self.passages.as_mut().expect("looked for");
            p.found.insert(k, found);
        }
        match &self.passages {
            Some(p) => &p.found[&k],
            None => &[],
        }
    }

    /// Steps `s` to instruction `b`, the first of a handler of a signal
    /// that interrupted untraced code if `signal`: the passage before it,
    /// if any. Inlined into the walk: most steps change nothing.
    #[inline(always)]
    fn step(&self, s: &mut State, b: u64, signal: bool) -> Option<Passage> {
        let marks = self.marks.get(b);
        let from = std::mem::replace(&mut s.from, marks & FROM != 0);
        let a = s.prev.replace(b)?;
        debug_assert_eq!(from, self.marks.get(a) & FROM != 0);
        let kept = (marks & RET != 0 || s.odd) && s.stack.contains(&b);
        debug_assert!(kept || !s.stack.contains(&b), "{b:#x} on the stack");
        if !from && marks & PAD == 0 && !kept {
            // No site, call, jump onto a return address or pad, no pop.
            debug_assert_eq!(self.change(a, b, &s.stack), Change::None);
            return None;
        }
        self.step_from(s, a, b, signal)
    }

    /// [`Stacks::step`] from `a` where the step may change the stack.
    #[inline(never)]
    fn step_from(&self, s: &mut State, a: u64, b: u64, signal: bool) -> Option<Passage> {
        let p = self.change_state(s, a, b, signal);
        if s.odd {
            let odd = |&r: &u64| self.marks.get(r) & RET == 0 && r != RETURNED && r != SIGRETURN;
            s.odd = s.stack.iter().any(odd);
        }
        p
    }

    /// [`Stacks::step_from`] but for [`State::odd`].
    fn change_state(&self, s: &mut State, a: u64, b: u64, signal: bool) -> Option<Passage> {
        if let Some(passage) = self
            .passages
            .as_ref()
            .and_then(|p| p.through(a, b, signal, &mut s.stack))
        {
            // The unwinder (untraced code) entered a landing pad.
            if let Some(i) = self.landed(a, b, &s.stack) {
                s.stack.truncate(i);
            }
            return Some(passage);
        }
        match self.change(a, b, &s.stack) {
            Change::Push(ret) => s.stack.push(ret),
            Change::PopTo(i) => s.stack.truncate(i),
            Change::None => {}
        }
        None
    }

    /// Where the step from `a` to landing pad `b` of procedure `q` left
    /// the stack (outermost first), as the regenerator's LANDING: the
    /// frames from the newest one of `q` at a call with a landing pad on
    /// are gone (that frame goes on at `b`, as frame 0). `None` where `b`
    /// is no landing pad, the step is a CFG edge within the procedure, or
    /// no such frame is on the stack.
    fn landed(&self, a: u64, b: u64, stack: &[u64]) -> Option<usize> {
        let q = self.pads.get(&b)?;
        if self.jumps_to_pads.contains(&(a, b)) {
            return None;
        }
        stack
            .iter()
            .rposition(|r| self.landing_calls.get(r) == Some(q))
    }

    /// What the step from instruction `a` to instruction `b` does to
    /// `stack` (return addresses, outermost first): the module comment's
    /// rules.
    pub fn change(&self, a: u64, b: u64, stack: &[u64]) -> Change {
        if let Some(i) = self.landed(a, b, stack) {
            // Checked first: the call into the unwinder (`__cxa_throw`)
            // would push its return address.
            return Change::PopTo(i);
        }
        match self.calls.get(&a) {
            // The callee was untraced and returned.
            Some(&ret) if ret == b => Change::None,
            Some(&ret) => Change::Push(ret),
            None if self.jumps_to_returns.contains(&(a, b)) => Change::None,
            None => match stack.iter().rposition(|&r| r == b) {
                Some(i) => Change::PopTo(i),
                None => Change::None,
            },
        }
    }
}

/// Sets `flag` on `a` in `marks`, which span every block of the modules.
fn mark(marks: &mut PcFlags, a: u64, flag: u8) {
    let spanned = marks.set(a, flag);
    debug_assert!(spanned, "{a:#x} is in a module's code");
}

/// Per module, the run-time addresses its blocks span: (start, end).
pub(crate) fn code_spans(modules: &[&Compiled]) -> Vec<(u64, u64)> {
    let span = |m: &Compiled| {
        let blocks = m
            .blocks
            .iter()
            .map(|(_, b)| (b.start, b.start + u64::from(b.size)));
        let (lo, hi) = blocks.fold((u64::MAX, 0), |(l, h), (s, e)| (l.min(s), h.max(e)));
        (lo < hi).then(|| (m.load_base.wrapping_add(lo), m.load_base.wrapping_add(hi)))
    };
    modules.iter().filter_map(|m| span(m)).collect()
}

/// Each block's last instruction: its run-time address, its length and
/// the block.
fn block_ends<'a>(
    modules: &'a [&'a Compiled],
) -> impl Iterator<Item = (u64, u64, &'a aetrace_regen::compile::Block)> + 'a {
    modules.iter().flat_map(|m| {
        m.blocks.iter().map(move |(bi, b)| {
            let lens = m.insn_lens(bi);
            let len = u64::from(lens[lens.len() - 1]);
            let start = m.load_base.wrapping_add(b.start);
            (start + u64::from(b.size) - len, len, b)
        })
    })
}

/// The return addresses of the calls of `modules` that return (a
/// `CallReturn` edge): a noreturn call's return address (after `call
/// __cxa_throw` at -O0, the code of a branch that does not throw) is no
/// frame's, and a jump onto it must still pop the stale return addresses
/// an exception left (its landing pads are entered like callbacks).
fn returns_of_returning_calls(modules: &[&Compiled]) -> PcSet<u64> {
    let mut found = PcSet::default();
    for m in modules {
        for (last, len, b) in block_ends(std::slice::from_ref(m)) {
            let returns = m.succs[b.succ_lo as usize..b.succ_hi as usize]
                .iter()
                .any(|s| s.kind == EdgeKindDb::CallReturn);
            if b.call.is_some_and(|c| !c.tail) && returns {
                found.insert(last + len);
            }
        }
    }
    found
}

/// The landing pads of `modules`' calls (pad -> its procedure) and the
/// return addresses of those calls (-> their procedure), run-time
/// addresses; a procedure is (its module's index, its entry's address).
type Landings = (PcMap<u64, (usize, u64)>, PcMap<u64, (usize, u64)>);

fn landings(modules: &[&Compiled]) -> Landings {
    let (mut pads, mut calls) = (PcMap::default(), PcMap::default());
    for (mi, m) in modules.iter().enumerate() {
        for (last, len, b) in block_ends(std::slice::from_ref(m)) {
            let pad = b.call.and_then(|c| c.landing);
            let pad = pad.and_then(|p| m.blocks.get(BlockIx::from_u32(p)));
            let entry = m.blocks.get(m.procs[b.proc].entry);
            if let (Some(pad), Some(entry)) = (pad, entry) {
                let q = (mi, m.load_base.wrapping_add(entry.start));
                pads.insert(m.load_base.wrapping_add(pad.start), q);
                calls.insert(last + len, q);
            }
        }
    }
    (pads, calls)
}

/// The CFG edges of `modules` within a procedure (fall-through, taken
/// jump, jump table case) whose target is in `targets`: (the source
/// block's last instruction, the target), as run-time addresses.
fn jumps_to(modules: &[&Compiled], targets: &PcSet<u64>) -> PcSet<(u64, u64)> {
    let mut found = PcSet::default();
    for m in modules {
        for (last, _, b) in block_ends(std::slice::from_ref(m)) {
            for s in &m.succs[b.succ_lo as usize..b.succ_hi as usize] {
                let within = matches!(
                    s.kind,
                    EdgeKindDb::FallThrough | EdgeKindDb::Taken | EdgeKindDb::JumpTable
                );
                let Some(to) = m.blocks.get(s.to).filter(|_| within) else {
                    continue;
                };
                let to = m.load_base.wrapping_add(to.start);
                if targets.contains(&to) {
                    found.insert((last, to));
                }
            }
        }
    }
    found
}

/// A block's last instruction that transfers control, and where it is.
struct Site {
    exit: Exit,
    /// The address after the instruction.
    next: u64,
    module: usize,
    /// The import a PLT stub jumps to (its procedure's name without
    /// `@plt`).
    import: Option<String>,
}

/// A procedure entry: its module and names.
struct Entry {
    module: usize,
    /// Its procedure's name and the names its module exports it as.
    names: Vec<String>,
}

/// What passages are found with (the module comment's rules).
struct Passages {
    sites: PcMap<u64, Site>,
    entries: PcMap<u64, Entry>,
    /// Per interval visited: its passages.
    found: PcMap<usize, Vec<(u64, Passage)>>,
}

impl Passages {
    fn new(modules: &[&Compiled], image: &Image) -> Passages {
        let mut sites = PcMap::default();
        let mut entries = PcMap::default();
        for (mi, m) in modules.iter().enumerate() {
            for p in m.procs.values().filter(|p| p.traced) {
                if let Some(e) = m.blocks.get(p.entry) {
                    let at = m.load_base.wrapping_add(e.start);
                    let names = (image.exported(at).iter())
                        .chain(std::iter::once(&p.name))
                        .cloned()
                        .collect();
                    entries.insert(at, Entry { module: mi, names });
                }
            }
            for (a, len, b) in block_ends(std::slice::from_ref(m)) {
                let mut insn = [0; 16];
                let insn = &mut insn[..len as usize];
                if image.read(a, insn) < insn.len() {
                    continue;
                }
                if let Some(exit) = decode(a, insn).map(|e| slot_or_pointer(e, image)) {
                    let name = &m.procs[b.proc].name;
                    let import = name.strip_suffix("@plt").map(str::to_owned);
                    sites.insert(
                        a,
                        Site {
                            exit,
                            next: a + len,
                            module: mi,
                            import,
                        },
                    );
                }
            }
        }
        Passages {
            sites,
            entries,
            found: PcMap::default(),
        }
    }

    /// The step from `a` to `b` through untraced code: the passage, with
    /// `stack` at `b` (else `None`, `stack` untouched). `b` is the first
    /// instruction of a handler of a signal that interrupted the untraced
    /// code if `signal`: its caller is the restorer.
    fn through(&self, a: u64, b: u64, signal: bool, stack: &mut Vec<u64>) -> Option<Passage> {
        let passage = self.enter(a, b, stack)?;
        if passage == Passage::SigreturnedIntoUntraced {
            // The restorer returned into the untraced code.
            stack.pop();
        }
        match stack.iter().rposition(|&r| r == b) {
            Some(i) => stack.truncate(i),
            None if self.entries.contains_key(&b) => {
                stack.push(RETURNED);
                if signal {
                    stack.push(SIGRETURN);
                }
            }
            None => {}
        }
        Some(passage)
    }

    /// Whether the step from `a` to `b` passes through untraced code: the
    /// passage, with `stack` as it is there (else `stack` untouched).
    fn enter(&self, a: u64, b: u64, stack: &mut Vec<u64>) -> Option<Passage> {
        let site = self.sites.get(&a)?;
        let on_stack = stack.contains(&b);
        match site.exit {
            Exit::Call { ret, to } if b != ret && self.called_back(site, to, b) => {
                stack.push(ret);
                Some(Passage::Entered)
            }
            Exit::Jump(to) if !on_stack && self.called_back(site, to, b) => Some(Passage::Entered),
            Exit::Ret if stack.last() == Some(&RETURNED) => {
                stack.pop();
                Some(Passage::Returned)
            }
            // A handler's return, into the restorer (the frame gdb's
            // `finish` out of the handler waits for: same depth), then the
            // code the signal interrupted.
            Exit::Ret if stack.last() == Some(&SIGRETURN) => {
                stack.pop();
                // Below the restorer, the untraced code the signal
                // interrupted (traced code is a traced pc).
                Some(match stack.last() == Some(&RETURNED) {
                    true => Passage::SigreturnedIntoUntraced,
                    false => Passage::Sigreturned,
                })
            }
            Exit::Ret if !on_stack && self.entries.contains_key(&b) => Some(Passage::Returned),
            _ => None,
        }
    }

    /// Whether a call or jump from `site` to `to` that reached `b` went
    /// through untraced code: a direct one that did not land on its
    /// target, or one through an import's GOT slot that landed on a
    /// procedure other than the PLT stub's import (by its procedure's
    /// name or an exported alias: a traced library's function, `--libs`,
    /// is reached directly, and so is libc's own `malloc` from libc's
    /// `malloc@plt`), or, for a slot of no known import, in its own
    /// module; but not on the instruction after it (a lazily bound PLT
    /// stub's slot points there until ld.so binds it: no untraced code
    /// ran).
    fn called_back(&self, site: &Site, to: To, b: u64) -> bool {
        match to {
            To::Direct(t) => t != b,
            To::Other => false,
            To::Got(_) => match (self.entries.get(&b), &site.import) {
                (Some(e), Some(i)) => !e.names.contains(i),
                (Some(e), None) => e.module == site.module,
                (None, _) => b != site.next,
            },
        }
    }
}

/// `exit` with a call or jump through a rip-relative pointer that is no
/// GOT slot (a function pointer in the module's data: gzip's `call
/// *work(%rip)`) taken as through any other pointer: where it went is its
/// target, not a sign of untraced code calling back.
fn slot_or_pointer(exit: Exit, image: &Image) -> Exit {
    let other = |to| match to {
        To::Got(slot) if !image.in_got(slot) => To::Other,
        to => to,
    };
    match exit {
        Exit::Call { ret, to } => Exit::Call { ret, to: other(to) },
        Exit::Jump(to) => Exit::Jump(other(to)),
        Exit::Ret => Exit::Ret,
    }
}

/// What one step does to the procedure stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing: a fall-through, a jump within the frame.
    None,
    /// A call: the callee's frame, with this return address.
    Push(u64),
    /// A return (or longjmp, exception) to the frame whose return address
    /// is at this depth: it and the frames above it end.
    PopTo(usize),
}
