//! Signals: the trail, placing a SIGNAL record's rip in it, cutting the
//! output there and resuming the interrupted code after the handler
//! (paper 003 has no signals: this extends Figure 7's machine with the
//! rules of docs/regen.md section 3a).
//!
//! Signals (docs/regen.md, "Signals"): the *trail* lists, in order, the
//! blocks output since the last item the thread wrote before the one being
//! read (and the untraced calls passed without a record, `Gap`), and
//! covers exactly the last `trail_bytes` bytes of output; it is the only
//! output that may still be cut. A SIGNAL record read where another item
//! was needed aborts the step in progress ([`Flow::Signal`]); its rip,
//! placed by the module's signal map, is found in the trail (or on the
//! unique witness-free path ahead), the output is cut there, the part
//! after the cut is kept in a `Sig` frame with the step to redo, and the
//! handler's trace follows. When the handler's frame is popped, the kept
//! output is put back (its trail after the handler's) and the step is
//! redone. `sigs` holds one entry per
//! `Sig` frame of the stack, in order.
//!
//! The transfer count (`xfers`, docs/regen.md "The transfer count")
//! mirrors the runtime's per-thread XFERS: it grows by one exactly when the
//! machine makes a counted transfer ([`Machine::counted`]:
//! `CallDb::counts_transfer`, the rewriter's rule; and every `ret` of a
//! module whose database `counts_returns`), never when a step is
//! aborted before it. Every trail mark holds
//! the count it ran with, so two marks a SIGNAL's point could name differ
//! in count (two runs of one block are separated by a counted call or
//! return; two gaps by the counted transfer into the second), except
//! *before a counted call*, which stands with the count and one more (the
//! increment is the instruction before the call), and *before a counted
//! `ret`*, where the rip says which of the two: [`Machine::fits`].

use super::{Delivery, Flow, Frame, Loc, Machine, ModuleIx, Noted, Sink, Step};
use crate::compile::{BlockIx, SigAt, EXIT, NO_WITNESS};
use crate::error::Result;
use crate::stream::Item;
use aetrace_format::progdb::{CallTarget, EdgeKindDb};
use aetrace_graph::EntityRef;

/// A SIGNAL record read where a step needed another item, and that step
/// (redone by `retry` once the handler has run).
#[derive(Clone, Copy, Debug)]
pub(super) struct Interrupt {
    pub(super) signo: u32,
    pub(super) rip: u64,
    /// The thread's transfer count in the record (`None`: format 1.1).
    pub(super) count: Option<u32>,
    /// A FAULT record: the thread ends at the rip.
    pub(super) fault: bool,
    pub(super) offset: u64,
    pub(super) retry: Retry,
}

/// Where a SIGNAL's interrupted position cuts the output.
enum Cut {
    /// At the end of the output.
    End,
    /// Before trail mark `.0` (a gap: everything after it is kept).
    Gap(usize),
    /// Inside occurrence `.0`, before instruction `.1`.
    Insn(usize, u32),
    /// Ahead on the witness-free path from the step's block to
    /// block `.1`, before instruction `.2` (`None`: after the block).
    Ahead(Loc, BlockIx, Option<u32>),
}

/// What a cut keeps for after the handler: the output after it, its
/// trail, (counting) its blocks, and the step to redo.
pub(super) struct Kept {
    tail: Vec<u8>,
    trail: Vec<Mark>,
    counted: Vec<Loc>,
    retry: Retry,
}

/// The step a SIGNAL record interrupted, redone when its handler returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Retry {
    /// Leave block `l` (its call, or its successor).
    Leave(Loc),
    /// Take the successor edge of `l` (and follow returns).
    Step(Loc),
    /// Read the RETURN of marked call `c`, then take its successor.
    Return(Loc),
    /// Make the call of block `l`.
    Call(Loc),
    /// Jump from block `l` into untraced code.
    JumpUntraced(Loc),
    /// Read the next item while untraced code runs.
    Untraced,
}

impl Retry {
    /// The block whose end the step stands at, if any.
    pub(super) fn block(self) -> Option<Loc> {
        match self {
            Retry::Leave(l)
            | Retry::Step(l)
            | Retry::Return(l)
            | Retry::Call(l)
            | Retry::JumpUntraced(l) => Some(l),
            Retry::Untraced => None,
        }
    }
}

/// An entry of the trail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mark {
    /// Block `loc` from instruction `first` on, then the blocks it falls
    /// into without a decision (`Block::next`); a signal can stand before
    /// instruction `min` or later of `loc` (an item written before `loc`'s
    /// last instruction has been read: `min` is that instruction).
    /// `cnt`: the thread's transfer count there (the chain's blocks have
    /// no call or return but its last, whose counted transfer adds 1 at
    /// its last instruction).
    Block {
        loc: Loc,
        first: u32,
        min: u32,
        cnt: u32,
    },
    /// Untraced code ran (a call or jump that came back without writing),
    /// with transfer count `cnt`.
    Gap { cnt: u32 },
    /// A signal handler's restorer ran and returned into the traced code
    /// the signal had interrupted: untraced code ran here, but never at a
    /// traced procedure's entry (the restorer is glibc's, and returns to
    /// an instrumented copy). Transfer count `cnt`.
    Restored { cnt: u32 },
    /// A summarised segment's blocks (`summary`), output in one piece. The
    /// item after its witness is a witness, which ends the trail before
    /// any SIGNAL could need them; a trail holding this has no
    /// occurrences for them, so placing a signal in it fails loudly.
    Segment,
    /// Output that is no instruction: [`Format::Runs`]' record of a
    /// handler's return (`bytes` long), which a cut before it keeps.
    ///
    /// [`Format::Runs`]: crate::output::Format
    Note { bytes: usize },
}

/// One occurrence of a block in the trail.
#[derive(Clone, Copy, Debug)]
pub(super) struct Occ {
    loc: Loc,
    first: u32,
    min: u32,
    /// The transfer count while it runs (before its counted call, if any).
    cnt: u32,
    /// Output offset of its text (from the start of the trail), length.
    pos: usize,
    len: usize,
    /// Index of its mark in the trail.
    mark: usize,
}

/// The state of code a signal interrupted.
#[derive(Clone, Debug)]
pub(super) struct Suspended {
    /// Output cut off at the interrupted instruction, put back on return.
    pub(super) tail: Vec<u8>,
    /// The trail covering `tail`.
    pub(super) trail: Vec<Mark>,
    pub(super) retry: Retry,
    /// The handler's ENTER has been read.
    pub(super) entered: bool,
    /// Counting: blocks counted in `tail` (uncounted if it is dropped).
    pub(super) counted: Vec<Loc>,
    /// The signal interrupted untraced code (its restorer returns there).
    pub(super) outside: bool,
    /// The transfer count at the interruption (the handler starts from it).
    pub(super) at_cut: u32,
    /// The SIGNAL record's stream offset (its handler's return names it).
    pub(super) offset: u64,
    /// The transfers the machine had mirrored after the cut (the tail's;
    /// `u32::MAX`, i.e. -1, when the interrupted counted transfer's
    /// increment ran but the machine had not made that transfer yet).
    pub(super) tail_inc: u32,
    /// A fault the trap ending this block raised, where a handler may
    /// resume after it (`EdgeKindDb::Resume`); with the signal.
    pub(super) trap: Option<(Loc, Interrupt)>,
    /// The SIGNAL record (its rip: where the handler returns unless it
    /// moves the rip, which SIGRETURN then says).
    pub(super) sig: Interrupt,
}

impl<'a> Machine<'a> {
    /// A SIGNAL record read by a step that must be redone after it.
    pub(super) fn signal(item: Item, offset: u64, retry: Retry) -> Option<Flow> {
        match item {
            Item::Signal {
                signo,
                rip,
                count,
                fault,
                ..
            } => Some(Flow::Signal(Interrupt {
                signo,
                rip,
                count,
                fault,
                offset,
                retry,
            })),
            _ => None,
        }
    }

    /// Whether transfer count `n` can stand before instruction `insn` of
    /// occurrence `o`, the rip in `instrumentation` or in the copy of the
    /// instruction: its count, or one more at the last instruction of a
    /// counted call once the increment (just before the call) ran. Before
    /// a counted `ret`, exactly one of the two: its increment is the last
    /// instrumentation, so a rip at the `ret`'s copy comes after it (not
    /// undone: the handler's runtime moves a rip right after an increment
    /// of its module back to it), a rip in the instrumentation before it.
    /// (Each frame of an unwinding recursion runs the same `ret` block
    /// with the next count: both rules at once would fit two runs.)
    pub(super) fn fits(&self, o: &Occ, insn: u32, n: u32, instrumentation: bool) -> bool {
        let last = insn + 1 == self.block(o.loc).ninsns;
        if last && self.counted_return(o.loc) {
            return n == o.cnt.wrapping_add(u32::from(!instrumentation));
        }
        o.cnt == n || (o.cnt.wrapping_add(1) == n && last && self.counted(o.loc))
    }

    /// Drops the suspended states whose `Sig` frames are gone (a handler
    /// that longjmps or exits never resumes the code it interrupted: the
    /// output kept for that code never ran).
    pub(super) fn sync_sigs(&mut self) {
        let n = self.stack.iter().filter(|f| **f == Frame::Sig).count();
        for s in self.sigs.drain(n.min(self.sigs.len())..) {
            self.uncount.extend_from_slice(&s.counted);
        }
    }

    /// The transfer counts of the trail's places where a SIGNAL whose rip
    /// is in untraced code can stand: gaps, and (before format 1.4, whose
    /// rips can be glibc's restorer) restorers.
    fn untraced_counts(&self) -> impl Iterator<Item = u32> + '_ {
        self.trail.iter().filter_map(|m| match *m {
            Mark::Gap { cnt } => Some(cnt),
            Mark::Restored { cnt } if self.restorer_rips => Some(cnt),
            _ => None,
        })
    }

    /// Whether a SIGNAL with `rip`, read where a block is about to make
    /// its call, stands before a record written before that call
    /// (else it comes from the callee, later).
    /// With a transfer count (format 1.2), only a place the count fits:
    /// a run of the block in the trail that fits it stands before the
    /// call, a later run of the same block (in the callee) does not.
    pub(super) fn before_call(&self, rip: u64, count: Option<u32>) -> bool {
        match self.place_rip(rip) {
            Ok((module, SigAt::Insn { block, insn }, ins)) => {
                self.occurrences(|_, _| 0).iter().any(|o| {
                    o.loc == Loc { module, block }
                        && o.min.max(o.first) <= insn
                        && count.map_or(true, |n| self.fits(o, insn, n, ins))
                })
            }
            Ok((_, SigAt::Outside, _)) => self
                .untraced_counts()
                .any(|cnt| count.map_or(true, |n| n == cnt)),
            _ => false,
        }
    }

    /// Whether a SIGNAL with `rip` stands in traced code the thread has not
    /// run since its last record, or in untraced code the thread entered
    /// later than now: its transfer count is past the current one (every
    /// later entry into untraced code follows a counted transfer; without
    /// a witness at a PLT stub's bound jump, the next record may come from
    /// a later import).
    pub(super) fn ahead_of_trail(&self, rip: u64, count: Option<u32>) -> bool {
        match self.place_rip(rip) {
            Ok((_, SigAt::Insn { .. } | SigAt::Witness { .. } | SigAt::Returned { .. }, _)) => {
                !self.before_call(rip, count)
            }
            Ok((_, SigAt::Outside, _)) => count.is_some_and(|n| {
                (n.wrapping_sub(self.xfers) as i32) > 0
                    && !self.untraced_counts().any(|cnt| cnt == n)
            }),
            Err(_) => false,
        }
    }

    /// The trail's block occurrences, in order, with the text length
    /// `len(block, first)` gives each (0 when only their order matters).
    fn occurrences(&self, len: impl Fn(Loc, u32) -> usize) -> Vec<Occ> {
        let mut out = Vec::new();
        let mut pos = 0;
        for (mark, &t) in self.trail.iter().enumerate() {
            let Mark::Block {
                loc,
                first,
                min,
                cnt,
            } = t
            else {
                pos += note_bytes(&t);
                continue;
            };
            let (mut l, mut first, mut min) = (loc, first, min);
            // A chain of forced moves: bounded by the module's blocks (a
            // cycle of them would be a witness-free cycle).
            for _ in 0..=self.module(loc).blocks.len() {
                let n = len(l, first);
                out.push(Occ {
                    loc: l,
                    first,
                    min,
                    cnt,
                    pos,
                    len: n,
                    mark,
                });
                pos += n;
                let next = self.block(l).next;
                if next == EXIT {
                    break;
                }
                l = Loc {
                    module: l.module,
                    block: next,
                };
                (first, min) = (0, 0);
            }
        }
        out
    }

    /// Where run-time address `rip` stands: by the signal map of the module
    /// whose instrumented copy holds it (the copies of a process image's
    /// modules never overlap), else in untraced code. Also whether it is
    /// inside instrumentation.
    pub(super) fn place_rip(
        &self,
        rip: u64,
    ) -> std::result::Result<(ModuleIx, SigAt, bool), String> {
        let mut stub = false;
        for (i, m) in self.modules.iter().enumerate() {
            match m.locate(rip) {
                Ok((SigAt::Outside, ins)) => stub |= ins,
                Ok((at, ins)) => return Ok((ModuleIx::new(i), at, ins)),
                Err(e) if i == 0 => return Err(e),
                Err(e) => return Err(format!("{e} of {}", m.name)),
            }
        }
        Ok((ModuleIx::new(0), SigAt::Outside, stub))
    }

    /// Whether run-time address `rip` is the original entry of a traced
    /// procedure of some module (its springboard).
    fn is_entry(&self, rip: u64) -> bool {
        self.modules.iter().any(|m| {
            let a = rip.wrapping_sub(m.load_base);
            m.procs
                .values()
                .any(|p| p.traced && m.blocks.get(p.entry).is_some_and(|b| b.start == a))
        })
    }

    /// The witness-free path from `from` to `to` inside their procedure
    /// (without `from`): unique when it exists, as `E - epl` is a forest
    /// (paper 003, Theorem 4.2). Only `from` may be a call block already
    /// returned from (`returned`); the path passes through no other call.
    fn path(
        &self,
        from: Loc,
        to: BlockIx,
        returned: bool,
    ) -> std::result::Result<Vec<BlockIx>, String> {
        let m = self.module(from);
        if self.block(from).call.is_some() && !returned {
            return Err("the block makes a call first".into());
        }
        let mut parent: std::collections::HashMap<BlockIx, BlockIx> = Default::default();
        let mut work = vec![from.block];
        while let Some(b) = work.pop() {
            if b != from.block && (b == to || m.blocks[b].call.is_some()) {
                continue;
            }
            let blk = &m.blocks[b];
            for s in &m.succs[blk.succ_lo as usize..blk.succ_hi as usize] {
                if s.witness != NO_WITNESS || s.to == EXIT {
                    continue;
                }
                if s.to == from.block || parent.insert(s.to, b).is_some() {
                    return Err(format!(
                        "block {} is reached by two witness-free paths",
                        m.block_name(s.to)
                    ));
                }
                work.push(s.to);
            }
        }
        if !parent.contains_key(&to) {
            return Err(format!(
                "no witness-free path leads there from block {}",
                m.block_name(from.block)
            ));
        }
        let mut path = vec![to];
        while let Some(&p) = parent.get(path.last().expect("non-empty")) {
            if p == from.block {
                break;
            }
            path.push(p);
        }
        path.reverse();
        Ok(path)
    }

    /// A SIGNAL record where `sig.retry` needed another item: places the
    /// interrupted position, cuts the output there (`sink.out` ends with
    /// the trail) and suspends the interrupted code under a `Sig` frame.
    pub(super) fn on_signal(&mut self, sink: &mut Sink, sig: Interrupt) -> Result<()> {
        if sig.fault {
            return self.on_fault(sink, sig);
        }
        let (mi, at, _, kept) = self.cut_at(sink, &sig)?;
        self.suspend(sink, &sig, kept, mi, at);
        Ok(())
    }

    /// Places `sig`'s interrupted position and cuts the output there: the
    /// output after the cut, with the step to redo, is returned. Also
    /// where it stands and whether inside instrumentation.
    pub(super) fn cut_at(
        &mut self,
        sink: &mut Sink,
        sig: &Interrupt,
    ) -> Result<(ModuleIx, SigAt, bool, Kept)> {
        let sig = *sig;
        let (mi, at, instrumentation) = self.place_rip(sig.rip).map_err(|e| {
            self.sig_error(
                &sig,
                format!("the rip is no position a thread stops at: {e}"),
            )
        })?;
        self.signals.0 += 1;
        self.signals.1 += u64::from(instrumentation);
        let tried = u32::from(raised(sig.signo, at));
        let counting = sink.counts.is_some();
        let occs = self.occurrences(|l, first| self.text_len(counting, l, first));
        let notes: usize = self.trail.iter().map(note_bytes).sum();
        let total: usize = occs.iter().map(|o| o.len).sum::<usize>() + notes;
        if total != self.trail_bytes || sink.out.len() < total {
            return Err(self.sig_error(
                &sig,
                format!(
                    "internal: the trail covers {total} bytes, {} expected",
                    self.trail_bytes
                ),
            ));
        }
        let here = |block| Loc { module: mi, block };
        let cut = match at {
            SigAt::Outside => self.cut_outside(&sig, &occs, instrumentation)?,
            SigAt::Insn { block, insn } => {
                self.cut_insn(&sig, &occs, here(block), insn, instrumentation)?
            }
            SigAt::Witness { from } => self.cut_witness(&sig, here(from))?,
            SigAt::Returned { block } => self.cut_returned(&sig, here(block))?,
        };
        let base = sink.out.len() - total;
        let kept = self.make_cut(sink, &sig, cut, &occs, base, tried)?;
        Ok((mi, at, instrumentation, kept))
    }

    /// The output length of block `l` from instruction `first` on (0 when
    /// counting).
    fn text_len(&self, counting: bool, l: Loc, first: u32) -> usize {
        if counting {
            return 0;
        }
        let b = self.block(l);
        if first == 0 {
            return self.module(l).text(b).len();
        }
        let mut v = Vec::new();
        self.module(l).part(l.block, first, b.ninsns, &mut v);
        v.len()
    }

    /// Where to cut for a rip in untraced code: the one place since the
    /// last record where untraced code ran (a gap, a restorer, or now if
    /// the step was waiting for it) whose transfer count fits.
    fn cut_outside(&self, sig: &Interrupt, occs: &[Occ], instrumentation: bool) -> Result<Cut> {
        let (retry, count) = (sig.retry, sig.count);
        let fail = |why: String| self.sig_error(sig, why);
        // A rip at a traced procedure's entry (its springboard, or the
        // outside-entry stub before its ENTER) is not in a restorer that
        // returns to traced code (the procedure scan only when it matters).
        let restorer = self.restorer_rips
            && !instrumentation
            && self
                .trail
                .iter()
                .any(|m| matches!(m, Mark::Restored { .. }))
            && !self.is_entry(sig.rip);
        // Each gap with its transfer count.
        let gaps = (0..self.trail.len()).filter_map(|i| match self.trail[i] {
            Mark::Gap { cnt } => Some((i, cnt)),
            Mark::Restored { cnt } if restorer => Some((i, cnt)),
            _ => None,
        });
        // Untraced code ran at each gap, and runs now if the step
        // was waiting for it; positions that no block separates
        // are one position.
        let at_gap = |g: usize| occs.iter().filter(|o| o.mark < g).count();
        let mut places: Vec<(usize, Option<usize>, u32)> =
            gaps.map(|(g, cnt)| (at_gap(g), Some(g), cnt)).collect();
        // (Deciding a PLT stub's jump: its bound outcome may have
        // entered the import.)
        if matches!(
            retry,
            Retry::Untraced | Retry::Call(_) | Retry::JumpUntraced(_)
        ) || matches!(retry, Retry::Step(l) if self.is_plt_jump(l))
        {
            // A call the step was about to make counted itself
            // before it left for untraced code.
            let made = matches!(retry, Retry::Call(l) if self.counted(l));
            places.push((occs.len(), None, self.xfers.wrapping_add(u32::from(made))));
        }
        if let Some(n) = count {
            let all: Vec<u32> = places.iter().map(|p| p.2).collect();
            places.retain(|p| p.2 == n);
            if places.is_empty() && !all.is_empty() {
                return Err(fail(format!("the rip is in untraced code with transfer count {n}, but the thread entered untraced code since its last record only with transfer counts {all:?}: no place fits")));
            }
        }
        let first = places.first().map(|p| p.0);
        if places.iter().any(|p| Some(p.0) != first) {
            return Err(fail(format!("the rip is in untraced code, which the thread entered at {} places since its last record (external calls without RETURN{}): the trace cannot tell which one was interrupted", places.len(), if count.is_some() { ", with one transfer count" } else { "" })));
        }
        match places.last() {
            None => Err(fail("the rip is in untraced code, but the thread ran no untraced code since its last record".into())),
            Some((_, None, _)) => Ok(Cut::End),
            Some((_, Some(g), _)) => Ok(Cut::Gap(*g)),
        }
    }

    /// Where to cut for a rip before instruction `insn` of block `here`:
    /// its one run in the trail whose transfer count fits, or ahead on the
    /// witness-free path from the step's block.
    fn cut_insn(
        &self,
        sig: &Interrupt,
        occs: &[Occ],
        here: Loc,
        insn: u32,
        instrumentation: bool,
    ) -> Result<Cut> {
        let fail = |why: String| self.sig_error(sig, why);
        let name = self.block_named(here);
        let mut hits: Vec<usize> = (0..occs.len())
            .filter(|&i| {
                let o = occs[i];
                o.loc == here && o.first.max(o.min) <= insn
            })
            .collect();
        if let Some(n) = sig.count {
            let all: Vec<u32> = hits.iter().map(|&i| occs[i].cnt).collect();
            hits.retain(|&i| self.fits(&occs[i], insn, n, instrumentation));
            if hits.is_empty() && !all.is_empty() {
                return Err(fail(format!("the rip is before instruction {insn} of block {name} with transfer count {n}, but the thread ran that block since its last record only with transfer counts {all:?}: no run fits")));
            }
        }
        match (hits.as_slice(), sig.retry) {
            ([i], _) => Ok(Cut::Insn(*i, insn)),
            ([], Retry::Step(f) | Retry::Leave(f)) if f.module == here.module => {
                // Ahead on a witness-free path, which makes no call.
                let ahead = Occ {
                    loc: here,
                    first: 0,
                    min: 0,
                    cnt: self.xfers,
                    pos: 0,
                    len: 0,
                    mark: 0,
                };
                if let Some(n) = sig
                    .count
                    .filter(|&n| !self.fits(&ahead, insn, n, instrumentation))
                {
                    return Err(fail(format!("the rip is before instruction {insn} of block {name}, ahead with transfer count {}, but the record has transfer count {n}", self.xfers)));
                }
                Ok(Cut::Ahead(f, here.block, Some(insn)))
            }
            ([], _) => Err(fail(format!("the rip is before instruction {insn} of block {name}, which the thread did not reach since its last record"))),
            (_, _) => Err(fail(format!("the rip is before instruction {insn} of block {name}, which the thread ran {} times since its last record: the trace cannot tell which time was interrupted", hits.len()))),
        }
    }

    /// Where to cut for a rip on an edge leaving block `from` before its
    /// witness: the step must be deciding there, or about to on the
    /// witness-free path ahead.
    fn cut_witness(&self, sig: &Interrupt, from: Loc) -> Result<Cut> {
        match sig.retry {
            // (`Call`: the LAZY piece of an IBT stub's jump.)
            Retry::Step(f) | Retry::Leave(f) | Retry::Call(f) if f == from => Ok(Cut::End),
            Retry::Step(f) | Retry::Leave(f) if f.module == from.module => {
                Ok(Cut::Ahead(f, from.block, None))
            }
            _ => Err(self.sig_error(sig, format!("the rip is on an edge leaving block {} before its witness, but the thread is not deciding there", self.block_named(from)))),
        }
    }

    /// Where to cut for a rip after call block `c` returned, before its
    /// RETURN: the thread must be waiting for that call.
    fn cut_returned(&self, sig: &Interrupt, c: Loc) -> Result<Cut> {
        let waiting = match sig.retry {
            Retry::Untraced => self.stack.last() == Some(&Frame::Ret(c)),
            Retry::Return(r) => r == c,
            // A `syscall` returned: its RETURN (or EXIT) is next.
            Retry::Call(r) => r == c && matches!(self.call_of(c).target, CallTarget::Exit),
            _ => false,
        };
        if !waiting {
            return Err(self.sig_error(sig, format!("the rip is after the call of block {} returned, but the thread is not waiting for that call", self.block_named(c))));
        }
        Ok(Cut::End)
    }

    /// Makes the cut: `sink.out` keeps the output before it; the output
    /// after it and its marks are kept for after the handler.
    fn make_cut(
        &self,
        sink: &mut Sink,
        sig: &Interrupt,
        cut: Cut,
        occs: &[Occ],
        base: usize,
        tried: u32,
    ) -> Result<Kept> {
        let mut kept = Kept {
            tail: Vec::new(),
            trail: Vec::new(),
            counted: Vec::new(),
            retry: sig.retry,
        };
        match cut {
            Cut::End => {}
            Cut::Gap(g) => {
                // Everything the marks after the gap output.
                let keep = occs
                    .iter()
                    .filter(|o| o.mark < g)
                    .map(|o| o.len)
                    .sum::<usize>()
                    + self.trail[..g].iter().map(note_bytes).sum::<usize>();
                kept.tail = sink.out.split_off(base + keep);
                kept.trail = self.trail[g + 1..].to_vec();
                kept.counted = occs.iter().filter(|o| o.mark > g).map(|o| o.loc).collect();
            }
            Cut::Insn(i, insn) => {
                let o = occs[i];
                let m = self.module(o.loc);
                let b = self.block(o.loc);
                let rest = sink.out.split_off(base + o.pos);
                m.part_before_signal(o.loc.block, o.first, insn, tried != 0, &mut sink.out);
                m.part(o.loc.block, insn, b.ninsns, &mut kept.tail);
                kept.tail
                    .extend_from_slice(rest.get(o.len..).unwrap_or_default());
                kept.trail.push(Mark::Block {
                    loc: o.loc,
                    first: insn,
                    min: insn,
                    cnt: o.cnt,
                });
                // The mark's chain goes on from the cut block by itself.
                kept.trail.extend_from_slice(&self.trail[o.mark + 1..]);
                kept.counted = occs[i + 1..].iter().map(|o| o.loc).collect();
                if insn + tried == 0 {
                    kept.counted.push(o.loc);
                }
            }
            Cut::Ahead(f, to, insn) => self.cut_ahead(sink, sig, &mut kept, f, to, insn, tried)?,
        }
        Ok(kept)
    }

    /// Cuts ahead of the output: outputs the witness-free path from the
    /// step's block `f` to block `to`, up to instruction `insn` of `to`
    /// (`None`: all of it); the rest of `to` is kept, and the step
    /// redone after the handler leaves `to`.
    #[allow(clippy::too_many_arguments)]
    fn cut_ahead(
        &self,
        sink: &mut Sink,
        sig: &Interrupt,
        kept: &mut Kept,
        f: Loc,
        to: BlockIx,
        insn: Option<u32>,
        tried: u32,
    ) -> Result<()> {
        let returned = matches!(sig.retry, Retry::Step(_));
        let path = self
            .path(f, to, returned)
            .map_err(|w| self.sig_error(sig, w))?;
        let m = self.module(f);
        let mut last_out = None;
        for &p in &path {
            let l = Loc {
                module: f.module,
                block: p,
            };
            let b = self.block(l);
            match sink.counts.as_mut() {
                Some(c) => c.add(l.module, b.ninsns, 1),
                None if p == to => match insn {
                    Some(k) => m.part_before_signal(p, 0, k, tried != 0, &mut sink.out),
                    None => m.part(p, 0, b.ninsns, &mut sink.out),
                },
                None => sink.out.extend_from_slice(m.text(b)),
            }
            last_out = Some(l);
        }
        let l = last_out.expect("a path ends at its target");
        if let Some(k) = insn {
            m.part(to, k, self.block(l).ninsns, &mut kept.tail);
            kept.trail.push(Mark::Block {
                loc: l,
                first: k,
                min: k,
                cnt: self.xfers,
            });
            if k + tried == 0 {
                kept.counted.push(l);
            }
        }
        kept.retry = Retry::Leave(l);
        Ok(())
    }

    /// Suspends the interrupted code (its output after the cut in `kept`)
    /// under a `Sig` frame; the handler's trace follows.
    fn suspend(
        &mut self,
        sink: &mut Sink,
        sig: &Interrupt,
        mut kept: Kept,
        mi: ModuleIx,
        at: SigAt,
    ) {
        if sink.counts.is_some() {
            kept.tail.clear();
        } else {
            kept.counted.clear();
            // Where the handler's blocks begin: a reader (`aetrace verify`)
            // can tell them from a call.
            let m = self.image(mi);
            m.signal_note(sig.signo, sig.offset, &mut sink.out);
            if let Some(d) = sink.deliveries.as_mut() {
                d.push(Delivery {
                    out: sink.out.len(),
                    record: sig.offset,
                    what: Noted::Delivered {
                        signo: sig.signo,
                        pc: interrupted_pc(m, at),
                        outside: matches!(at, SigAt::Outside),
                    },
                });
            }
        }
        let outside = matches!(at, SigAt::Outside);
        let trap = match at {
            SigAt::Insn { block, insn } if raised(sig.signo, at) => Some(Loc { module: mi, block })
                .filter(|&l| insn + 1 == self.block(l).ninsns && self.resumes(l))
                .map(|l| (l, *sig)),
            _ => None,
        };
        sink.certain = sink.certain.max(sink.out.len());
        // The handler starts from the count at the interruption; the
        // transfers mirrored past the cut are made again after it.
        let at_cut = sig.count.unwrap_or(self.xfers);
        let tail_inc = self.xfers.wrapping_sub(at_cut);
        self.xfers = at_cut;
        self.stack.push(Frame::Sig);
        self.sigs.push(Suspended {
            tail: kept.tail,
            trail: kept.trail,
            retry: kept.retry,
            entered: false,
            counted: kept.counted,
            outside,
            at_cut,
            tail_inc,
            offset: sig.offset,
            trap,
            sig: *sig,
        });
        self.cur = None;
        self.consumed(None);
    }

    /// Whether block `l` ends with a trap a handler may resume after.
    fn resumes(&self, l: Loc) -> bool {
        let m = self.module(l);
        let b = &m.blocks[l.block];
        (b.succ_lo..b.succ_hi).any(|i| m.succs[i as usize].kind == EdgeKindDb::Resume)
    }

    /// Whether the handler of `s`, run for a fault of the trap ending
    /// its block, moved rip past the trap: the trap then did not run
    /// again. The next item tells: the resume edge's witness, or the trap's
    /// next SIGNAL or FAULT (it ran again). Without that witness, or with
    /// the step elsewhere, the trace cannot tell: an error.
    fn skipped_trap(&mut self, s: &Suspended) -> Result<bool> {
        let Some((l, sig)) = s.trap else {
            return Ok(false);
        };
        let m = self.module(l);
        let b = &m.blocks[l.block];
        let witnessed = (b.succ_lo..b.succ_hi).all(|i| m.succs[i as usize].witness != NO_WITNESS);
        if !witnessed || !matches!(s.retry, Retry::Step(r) | Retry::Leave(r) if r == l) {
            return Err(self.sig_error(&sig, format!("the handler returned to the trap ending block {} of procedure {}, whose resume edge has no witness here: the trace cannot tell whether the handler moved rip past the trap", self.block_named(l), self.proc_name(l))));
        }
        let (item, _, _) = self.stream.peek()?;
        Ok(!matches!(item, Item::Signal { .. }))
    }

    /// Since format 1.11 the handler's return writes SIGRETURN(rip) (the
    /// runtime's restorer): read it, after any signal nested in the
    /// handler's last blocks (placed first, with the handler's return
    /// redone after it). `None`: an older trace, or the stream ends (a
    /// killed thread).
    fn sigreturn(&mut self) -> Step<Option<u64>> {
        if !self.sigreturns {
            return Ok(None);
        }
        let (item, off, len) = self.stream.peek()?;
        let rip = match item {
            Item::SigReturn(rip) => rip,
            Item::End => return Ok(None),
            _ => {
                self.stream.advance(len);
                return Err(match Self::signal(item, off, Retry::Untraced) {
                    Some(f) => f,
                    None => self.unexpected(item, off, None).into(),
                });
            }
        };
        self.stream.advance(len);
        self.consumed(None);
        Ok(Some(rip))
    }

    /// The instruction whose arrival `rip` is: its copy, or the start of
    /// the instrumentation standing before it (its lead, where the
    /// runtime sends a handler's return to it); `None` for anything else.
    fn arrival(&self, rip: u64) -> Option<(Loc, u32)> {
        match self.place_rip(rip) {
            Ok((module, SigAt::Insn { block, insn }, lead))
                if !lead || self.modules[module.index()].starts_lead(rip) =>
            {
                Some((Loc { module, block }, insn))
            }
            _ => None,
        }
    }

    /// The handler of `s` returned to `rip`, not to where its signal
    /// interrupted the thread: the thread goes on from `rip`, the copy of
    /// an instruction of the interrupted procedure (the runtime maps the
    /// original address a handler sets to it). Later in the block the
    /// signal cut (a faulting instruction skipped), the kept output
    /// loses the instructions passed over and the step is redone as it
    /// was; elsewhere in that procedure, when the step redone is the
    /// procedure's own (no call or return kept), the kept output is
    /// dropped and the thread leaves `rip`'s block from there (a trap's
    /// `Resume` edge, whose witness the jump passes over). Anything else
    /// is refused, naming both addresses.
    fn moved(&self, sink: &mut Sink, s: &mut Suspended, rip: u64) -> Result<()> {
        let to = self.arrival(rip);
        let cut = match s.trail.first() {
            Some(&Mark::Block { loc, first, .. }) => Some((loc, first)),
            _ => None,
        };
        let proc_of = |l: Loc| (l.module, self.module(l).blocks[l.block].proc);
        let own = |l: Loc| {
            s.retry.block().is_some_and(|r| proc_of(r) == proc_of(l))
                && s.trail.iter().all(|m| match *m {
                    Mark::Block { loc, .. } => proc_of(loc) == proc_of(l),
                    _ => false,
                })
        };
        match (to, cut) {
            (Some((l, k)), Some((c, first))) if l == c && k >= first => {
                if sink.counts.is_none() {
                    // The kept output starts with the rest of the block
                    // from the cut (one record in the runs formats, one
                    // line in `block`): it becomes the rest from `k`.
                    let (m, n) = (self.module(l), self.block(l).ninsns);
                    let (mut old, mut new) = (Vec::new(), Vec::new());
                    m.part(l.block, first, n, &mut old);
                    m.part(l.block, k, n, &mut new);
                    if !s.tail.starts_with(&old) {
                        let why = "the output kept after the cut is not the rest of its block";
                        return Err(self.sig_error(&s.sig, why.into()));
                    }
                    s.tail.splice(..old.len(), new);
                }
                if let Some(Mark::Block { first, min, .. }) = s.trail.first_mut() {
                    *first = k;
                    *min = k;
                }
            }
            (Some((l, k)), Some((c, _))) if proc_of(l) == proc_of(c) && own(c) => {
                s.tail.clear();
                match sink.counts.as_mut() {
                    // (Counted whole, as a block cut by a signal is.)
                    Some(n) => n.add(l.module, self.block(l).ninsns, 1),
                    None => self
                        .module(l)
                        .part(l.block, k, self.block(l).ninsns, &mut s.tail),
                }
                s.trail = vec![Mark::Block {
                    loc: l,
                    first: k,
                    min: k,
                    cnt: s.at_cut,
                }];
                s.counted.clear();
                s.retry = Retry::Leave(l);
                s.tail_inc = 0;
            }
            _ => {
                let at = match cut {
                    Some((c, _)) => format!(
                        "in block {} of procedure {}",
                        self.block_named(c),
                        self.proc_name(c)
                    ),
                    None => "outside any traced instruction".into(),
                };
                return Err(self.sig_error(&s.sig, format!("the handler returned to {rip:#x}, not to the interrupted {:#x} {at}, and the trace cannot follow it there (no instruction of that procedure the thread could go on from)", s.sig.rip)));
            }
        }
        s.trap = None;
        Ok(())
    }

    /// The handler of the newest signal returned: puts back the output
    /// kept for the interrupted code and redoes its step.
    pub(super) fn resume(&mut self, sink: &mut Sink) -> Step {
        let back = self.sigreturn()?;
        self.stack.pop();
        let mut s = self.sigs.pop().expect("one suspended state per Sig frame");
        match back {
            // Where the handler returned says it (a trap skipped or not
            // included: its `Resume` edge's witness is not written when
            // the handler moved the rip past it).
            // (A trap's handler moving the rip to no listed instruction:
            // the `Resume` edge's witness tells, as before 1.11.)
            Some(rip) if rip != s.sig.rip && (s.trap.is_none() || self.arrival(rip).is_some()) => {
                self.moved(sink, &mut s, rip)?
            }
            Some(rip) if rip != s.sig.rip => {}
            Some(_) => s.trap = None,
            None => {}
        }
        if self.skipped_trap(&s)? {
            // Nothing of the block runs again: its resume edge is next.
            s.tail.clear();
            if let Some(Mark::Block { first, min, .. }) = s.trail.first_mut() {
                *first += 1;
                *min = *first;
            }
        }
        // The handler's last blocks stay in the trail (a signal nested in
        // the handler after its last record is read only now), then its
        // return, the restorer (untraced), then the resumed code.
        if sink.counts.is_none() {
            let moved = back.is_some_and(|rip| rip != s.sig.rip);
            let bytes = (self.image(ModuleIx::new(0))).return_note(s.offset, moved, &mut sink.out);
            if let Some(d) = sink.deliveries.as_mut() {
                d.push(Delivery {
                    out: sink.out.len(),
                    record: s.offset,
                    what: Noted::Returned,
                });
            }
            if bytes > 0 {
                self.trail.push(Mark::Note { bytes });
                self.trail_bytes += bytes;
            }
            sink.out.extend_from_slice(&s.tail);
        }
        let cnt = self.xfers;
        self.trail.push(if s.outside {
            Mark::Gap { cnt }
        } else {
            Mark::Restored { cnt }
        });
        // The kept marks' counts move by the handler's transfers.
        let h = cnt.wrapping_sub(s.at_cut);
        self.trail.extend(s.trail.iter().map(|&m| match m {
            Mark::Block {
                loc,
                first,
                min,
                cnt,
            } => Mark::Block {
                loc,
                first,
                min,
                cnt: cnt.wrapping_add(h),
            },
            Mark::Gap { cnt } => Mark::Gap {
                cnt: cnt.wrapping_add(h),
            },
            Mark::Restored { cnt } => Mark::Restored {
                cnt: cnt.wrapping_add(h),
            },
            m @ (Mark::Segment | Mark::Note { .. }) => m,
        }));
        self.xfers = cnt.wrapping_add(s.tail_inc);
        self.trail_bytes += s.tail.len();
        self.cur = None;
        match s.retry {
            Retry::Leave(l) if self.block(l).next != EXIT => {
                // The trail's chain through `l` goes on by itself.
                self.cur = Some(Loc {
                    module: l.module,
                    block: self.block(l).next,
                });
                self.chained = true;
                Ok(())
            }
            Retry::Leave(l) => {
                let b = self.block(l);
                self.leave_block(l, b)
            }
            Retry::Step(l) => self.step_from(l),
            Retry::Return(c) => {
                self.expect_return(c)?;
                self.step_from(c)
            }
            Retry::Call(l) => {
                let c = self.call_of(l);
                self.call(l, c)
            }
            Retry::JumpUntraced(l) => self.jump_untraced(l),
            Retry::Untraced => Ok(()),
        }
    }
}

/// Whether signal `signo` standing at `at` was a fault the instruction
/// there raised (SIGILL, SIGBUS, SIGFPE, SIGSEGV before a traced
/// instruction): it was fetched and started, as valgrind reports it, and
/// runs again if the handler returns.
pub(super) fn raised(signo: u32, at: SigAt) -> bool {
    matches!(signo, 4 | 7 | 8 | 11) && matches!(at, SigAt::Insn { .. })
}

/// The run-time address of the instruction a signal standing at `at` of
/// module `m` interrupted, where the module's code says it: before an
/// instruction, or after a call returned (its return address).
fn interrupted_pc(m: &crate::compile::Module, at: SigAt) -> Option<u64> {
    let start = |b: BlockIx| m.load_base.wrapping_add(m.blocks[b].start);
    match at {
        SigAt::Insn { block, insn } => {
            let lens = &m.insn_lens(block)[..insn as usize];
            Some(start(block) + lens.iter().map(|&l| u64::from(l)).sum::<u64>())
        }
        SigAt::Returned { block } => Some(start(block) + u64::from(m.blocks[block].size)),
        SigAt::Outside | SigAt::Witness { .. } => None,
    }
}

/// The output bytes of a mark that is no block.
fn note_bytes(m: &Mark) -> usize {
    match *m {
        Mark::Note { bytes } => bytes,
        _ => 0,
    }
}
