//! The data walk across signal handlers (docs/data.md, "Signals with
//! data"). A VALUE record of instruction K stands before K, so a signal
//! can arrive after some of K's values: the thread's stream is then `[K's
//! early values] SIGNAL [the handler's records] [K's other values]`.
//! `regen::visit` gives an [`Event::Signal`] where the handler was
//! entered (in the order of the SIGNAL records) and an
//! [`Event::SigReturn`] where it returned; the values come from a
//! streaming cursor (`regen::DataCursor`), whose windows stop at each
//! SIGNAL record.
//!
//! A fault's instruction (a run marked `BlockRun::faults`) had no
//! effect: the walk shows its fetch alone, as lackey does, and leaves its
//! values unread, so they are the handler's early values; if the handler
//! returns, the instruction runs again and reads them then.
//!
//! At the delivery the thread's state (abstract registers and the run
//! before) is saved with K's early values (the values before the SIGNAL
//! the walk has not read), and the handler starts with nothing known (its
//! outside-entry stub gives `rsp`). At the return the state comes back
//! whole (`rt_sigreturn` restores every register) and K's early values
//! are put back before the values after the handler, so K reads them
//! first; the resumed run may start in the middle of its block, with the
//! restored state instead of the ways-in check. A handler that never
//! returns (`siglongjmp`) leaves its saved state to be dropped when a
//! handler below it returns (or the thread ends): K never ran, and its
//! early values are never read.
//!
//! A handler may move the rip (skip a faulting load, format 1.11's
//! SIGRETURN): the interrupted instruction then never runs, its early
//! values are dropped, and the thread goes on at another instruction's
//! lead, which writes that one's values. A handler may change registers
//! in its context: the runtime's `sigreturn` records the 16 general
//! registers before SIGRETURN (a `--data` executable), and the restored
//! state's known registers take those values.
//!
//! Invariants: every SIGNAL record of the thread is delivered once, in
//! order, and only a FAULT (the thread's end) is not (`Values::finish`);
//! the walk never reads a value after a SIGNAL before its delivery (the
//! windows stop there); memory holds one window and the saved early
//! values, never the thread's values.
//!
//! [`Event::Signal`]: aetrace_regen::visit::Event::Signal
//! [`Event::SigReturn`]: aetrace_regen::visit::Event::SigReturn

use super::{Error, Sink, ThreadExec, Values, Writer, WINDOW};
use aetrace_analysis::addr::exec::code::BlockCode;
use aetrace_analysis::addr::Repeat;
use aetrace_regen::compile::Module;
use aetrace_regen::handlers::Handlers;
use aetrace_regen::visit::{BlockRun, Visit};
use aetrace_regen::DataValues;
use std::rc::Rc;

/// A thread's signal handlers as the walk meets them.
#[derive(Default)]
pub(super) struct Signals {
    /// One per handler entered and not returned.
    saved: Handlers<Saved>,
    /// A handler returned: the next run continues the interrupted code.
    pub(super) resumed: bool,
}

/// The interrupted code's state while a handler runs.
struct Saved {
    state: ThreadExec,
    /// The interrupted instruction's values written before the signal,
    /// with their outside-entry marks.
    early: DataValues,
    /// The SIGNAL came between an ENTER and its stub's `rsp` value: the
    /// first value after the handler is that stub's.
    enter: Option<u32>,
}

impl Values<'_> {
    /// Takes the values up to the thread's next SIGNAL record, which must
    /// be the one of `signo` at stream `offset`, and that record: the
    /// early values, and the ENTER the first value after the handler
    /// follows.
    fn until_signal(
        &mut self,
        signo: u32,
        offset: u64,
    ) -> Result<(DataValues, Option<u32>), String> {
        let t = self.thread.map_or(0, |t| t.0);
        let mut early = DataValues::default();
        let rest = self.next;
        early.values.extend_from_slice(&self.win.values[rest..]);
        let marks = self.win.entered.iter().filter(|e| e.0 >= rest);
        early.entered.extend(marks.map(|&(n, raw)| (n - rest, raw)));
        self.before += rest as u64;
        self.win.values.clear();
        self.win.entered.clear();
        (self.next, self.entered) = (0, 0);
        let carried = self.carry.take();
        let at = early.values.len();
        if let Some(raw) = carried {
            early.entered.push((at, raw));
        }
        let c = (self.cursor.as_mut()).ok_or_else(|| format!("thread {t}: no data values"))?;
        let more = c.append(WINDOW, &mut early).map_err(|e| e.to_string())?;
        if more == 0 && carried.is_some() {
            early.entered.pop();
        }
        let sig = (c.signal().map_err(|e| e.to_string())?)
            .filter(|s| !s.fault && s.signo == signo && s.offset == offset)
            .ok_or_else(|| {
                format!("thread {t}: a handler of the SIGNAL({signo}) at stream offset {offset} was entered, but the thread's next SIGNAL record after the walk's values is not that one")
            })?;
        let enter = sig.enter.or(carried.filter(|_| more == 0));
        Ok((early, enter))
    }

    /// Puts `early` before the values not read yet; `enter`: the first of
    /// those follows that ENTER.
    fn put_back(&mut self, mut early: DataValues, enter: Option<u32>) {
        let (rest, shift) = (self.next, early.values.len());
        match (enter, rest < self.win.values.len()) {
            (Some(raw), true) => early.entered.push((shift, raw)),
            (Some(raw), false) => self.carry = Some(raw),
            (None, _) => {}
        }
        let marks = self.win.entered.iter().filter(|e| e.0 >= rest);
        early
            .entered
            .extend(marks.map(|&(n, raw)| (n - rest + shift, raw)));
        early.values.extend_from_slice(&self.win.values[rest..]);
        self.before += rest as u64;
        self.win = early;
        (self.next, self.entered) = (0, 0);
    }
}

impl<S: Sink> Writer<'_, '_, S> {
    fn thread_no(&self) -> u32 {
        self.values.thread.map_or(0, |t| t.0)
    }

    /// The handler of the SIGNAL record at stream offset `offset` was
    /// entered: saves the interrupted code's state and early values; the
    /// handler's values follow the SIGNAL.
    pub(super) fn deliver(&mut self, signo: u32, offset: u64) -> Result<(), Error> {
        let (early, enter) = self.values.until_signal(signo, offset)?;
        let state = std::mem::take(&mut self.state);
        self.sig.saved.enter(
            offset,
            Saved {
                state,
                early,
                enter,
            },
        );
        Ok(())
    }

    /// The handler of the SIGNAL record at stream offset `offset`
    /// returned: the state of the code it interrupted comes back, and
    /// that code's early values are read next, unless the handler
    /// `moved` the rip (that code's instruction never runs: the thread
    /// goes on at another one's lead, which writes that one's values).
    /// Handlers entered after it never returned.
    pub(super) fn sigreturn(&mut self, offset: u64, moved: bool) -> Result<(), Error> {
        let t = self.thread_no();
        let mut s = (self.sig.saved.returned(offset))
            .ok_or_else(|| format!("thread {t}: the handler of the SIGNAL at stream offset {offset} returned, but the walk did not enter it"))?;
        if moved {
            s.early = DataValues::default();
        }
        if self.values.registers && moved {
            // A handler may have changed them in its context: the known
            // ones take what `rt_sigreturn` restores (the set stays the
            // analysis's, so the values read after are the ones placed).
            let regs = self.take(16)?;
            for g in s.state.regs.known.iter() {
                s.state.regs.set(g, regs[g.index()]);
            }
        }
        self.values.put_back(s.early, s.enter);
        self.state = s.state;
        self.sig.resumed = true;
        Ok(())
    }

    /// Run `r`, one instruction, raised a fault: it did nothing, so the
    /// sink gets its fetch alone (as lackey gives it), and its values,
    /// unread, are the handler's early values (or, a crash, the values a
    /// FAULT leaves unread). A `rep` string instruction is refused: it may
    /// have done some iterations before the fault, and nothing recorded
    /// says how many (its values are `rcx` before the first).
    #[cold]
    pub(super) fn faulting<B: AsRef<[u8]> + Sync>(
        &mut self,
        visit: &Visit<'_, B>,
        r: BlockRun,
    ) -> Result<(), Error> {
        debug_assert_eq!(r.end, r.first + 1, "a fault is one instruction");
        let m = &visit.modules()[r.module as usize];
        if !m.shown {
            return Ok(());
        }
        let lens = m.insn_lens(r.block);
        let skip: u64 = lens[..r.first as usize].iter().map(|&l| u64::from(l)).sum();
        let ip = (m.load_base).wrapping_add(m.blocks[r.block].start + skip);
        let insns = self.decoded(m, r.module, r.block)?;
        let i = &insns[r.first as usize];
        if i.prog.refs.iter().any(|x| x.repeat != Repeat::Once) {
            return Err(format!(
                "thread {}: the `rep` string instruction at {ip:#x} ({}) raised a fault, \
                 after iterations whose number no record gives: its data addresses \
                 cannot be rebuilt (docs/data.md, \"Signals with data\")",
                self.thread_no(),
                i.insn
            )
            .into());
        }
        self.sink.run(r);
        self.sink
            .insn(r.first, ip, u32::from(lens[r.first as usize]))
    }

    /// The run right after a handler returned, when it resumes its block
    /// in the middle: the code from there for the restored state (no
    /// ways-in check: it is the state the interrupted run left).
    #[cold]
    pub(super) fn resumed_run(
        &mut self,
        m: &Module,
        r: BlockRun,
    ) -> Result<Option<Rc<BlockCode>>, Error> {
        self.sig.resumed = false;
        if r.first == 0 {
            return Ok(None);
        }
        let known = self.state.regs.known;
        Ok(Some(Rc::new(self.compile(m, r, known)?)))
    }
}
