//! The data walk across signal handlers (docs/data.md, "Signals with
//! data"). A VALUE record of instruction K stands before K, so a signal
//! can arrive after some of K's values: the thread's stream is then `[K's
//! early values] SIGNAL [the handler's records] [K's other values]`, and
//! the SIGNAL's place among the values ([`SignalAt::at`]) is where the
//! handler's start. `regen::visit` gives an [`Event::Signal`] where the
//! handler was entered (in the order of the SIGNAL records) and an
//! [`Event::SigReturn`] where it returned.
//!
//! At the delivery the thread's state (abstract registers and the run
//! before) is saved with K's early values, and the handler starts with
//! nothing known (its outside-entry stub gives `rsp`). At the return the
//! state comes back whole (`rt_sigreturn` restores every register) and
//! K's early values are put right before the values after the handler
//! (over the handler's, already read), so K reads them first; the
//! resumed run may start in the middle of its block, with the restored
//! state instead of the ways-in check. A handler that never returns
//! (`siglongjmp`) leaves its saved state to be dropped when a handler
//! below it returns (or the thread ends): K never ran, and its early
//! values are never read.
//!
//! Invariants: every SIGNAL record of the thread is delivered once, in
//! order, and only a FAULT (the thread's end) is not; the values read
//! before a delivery never pass its position.
//!
//! [`Event::Signal`]: aetrace_regen::visit::Event::Signal
//! [`Event::SigReturn`]: aetrace_regen::visit::Event::SigReturn

use super::{Error, Sink, ThreadExec, Writer};
use aetrace_analysis::addr::exec::code::BlockCode;
use aetrace_analysis::addr::exec::Exec;
use aetrace_regen::compile::Module;
use aetrace_regen::visit::BlockRun;
use aetrace_regen::SignalAt;
use std::rc::Rc;

/// A thread's signals as the walk meets them.
#[derive(Default)]
pub(super) struct Signals {
    /// Its SIGNAL and FAULT records, in order, and the next to deliver.
    list: Vec<SignalAt>,
    next: usize,
    /// One per handler entered and not returned, the oldest first.
    saved: Vec<Saved>,
    /// A handler returned: the next run continues the interrupted code.
    resumed: bool,
    /// A handler returned between an ENTER and its stub's `rsp` value:
    /// that value's position and the ENTER (also in `Writer::entered`).
    pending: Option<(usize, u32)>,
}

/// The interrupted code's state while a handler runs.
struct Saved {
    /// The SIGNAL record's stream offset.
    offset: u64,
    state: ThreadExec,
    /// The interrupted instruction's values written before the signal.
    early: Vec<u64>,
    /// Their outside-entry marks (`Writer::entered`), by offset in `early`.
    marks: Vec<(usize, u32)>,
    /// The SIGNAL came between an ENTER and its stub's `rsp` value.
    enter: Option<u32>,
    /// A fault of the instruction before the handler (it would run again).
    raised: bool,
}

impl Signals {
    /// The signals of a thread's stream.
    pub(super) fn of(list: Vec<SignalAt>) -> Self {
        Signals {
            list,
            ..Signals::default()
        }
    }

    /// How many values at the end of the thread may stay unread: those
    /// an instruction wrote before the FAULT that ended the thread.
    pub(super) fn unread_at_end(&self, values: usize, read: usize) -> Result<usize, String> {
        match &self.list[self.next..] {
            [] => Ok(0),
            [f] if f.fault && f.at == values && read <= values => Ok(values - read),
            [s, ..] => Err(format!(
                "its SIGNAL({}) at stream offset {} was not delivered by the walk",
                s.signo, s.offset
            )),
        }
    }
}

fn thread_no<S>(w: &Writer<'_, S>) -> u32 {
    w.thread.map_or(0, |t| t.0)
}

impl<S: Sink> Writer<'_, S> {
    /// The handler of the SIGNAL record at stream offset `offset` was
    /// entered: saves the interrupted code's state and early values; the
    /// handler's values start at the SIGNAL's position.
    pub(super) fn deliver(&mut self, signo: u32, offset: u64, raised: bool) -> Result<(), Error> {
        let t = thread_no(self);
        let sig = (self.sig.list.get(self.sig.next).copied())
            .filter(|s| !s.fault && s.signo == signo && s.offset == offset)
            .ok_or_else(|| {
                format!("thread {t}: a handler of the SIGNAL({signo}) at stream offset {offset} was entered, but the thread's next SIGNAL record is not that one")
            })?;
        self.sig.next += 1;
        if sig.at < self.next {
            return Err(format!(
                "thread {t}: the SIGNAL({signo}) at stream offset {offset} stands after {} data values, but the walk read {} before it",
                sig.at, self.next
            )
            .into());
        }
        // A second handler before the stub's value: it still comes after.
        let carried = (self.sig.pending.take()).filter(|&(n, _)| n == sig.at && n == self.next);
        if carried.is_some() && self.entered.last() == carried.as_ref() {
            self.entered.pop();
        }
        let early = self.values[self.next..sig.at].to_vec();
        let marks = self.take_marks(sig.at);
        let state = std::mem::replace(
            &mut self.state,
            ThreadExec {
                exec: Exec::unknown(0),
                prev: None,
            },
        );
        self.sig.saved.push(Saved {
            offset,
            state,
            early,
            marks,
            enter: sig.enter.or(carried.map(|(_, raw)| raw)),
            raised,
        });
        self.next = sig.at;
        Ok(())
    }

    /// The outside-entry marks of the values from the next one up to
    /// `at`, by offset from the next one (older ones are stale).
    fn take_marks(&mut self, at: usize) -> Vec<(usize, u32)> {
        let mut out = Vec::new();
        while let Some(&(n, raw)) = self.entered.last().filter(|&&(n, _)| n < at) {
            self.entered.pop();
            if n >= self.next {
                out.push((n - self.next, raw));
            }
        }
        out
    }

    /// The handler of the SIGNAL record at stream offset `offset`
    /// returned: the state of the code it interrupted comes back, and
    /// that code's early values are read next. Handlers entered after it
    /// never returned.
    pub(super) fn sigreturn(&mut self, offset: u64) -> Result<(), Error> {
        let t = thread_no(self);
        let i = (self.sig.saved.iter().rposition(|s| s.offset == offset))
            .ok_or_else(|| format!("thread {t}: the handler of the SIGNAL at stream offset {offset} returned, but the walk did not enter it"))?;
        self.sig.saved.truncate(i + 1);
        let s = self.sig.saved.pop().expect("found above");
        if s.raised {
            return Err(format!("thread {t}: a fault handler returned to the instruction that raised the fault, which runs again with values it already used: not handled with data").into());
        }
        // Positions before `end` were read: the early values go there.
        let end = self.next;
        let start = end - s.early.len();
        self.values[start..end].copy_from_slice(&s.early);
        while self.entered.last().is_some_and(|&(n, _)| n < end) {
            self.entered.pop();
        }
        if let Some(raw) = s.enter {
            self.entered.push((end, raw));
        }
        self.sig.pending = s.enter.map(|raw| (end, raw));
        for &(off, raw) in s.marks.iter().rev() {
            self.entered.push((start + off, raw));
        }
        self.next = start;
        self.state = s.state;
        self.sig.resumed = true;
        Ok(())
    }

    /// The run right after a handler returned, when it resumes its block
    /// in the middle: the code from there for the restored state (no
    /// ways-in check: it is the state the interrupted run left).
    pub(super) fn resumed_run(
        &mut self,
        m: &Module,
        r: BlockRun,
    ) -> Result<Option<Rc<BlockCode>>, Error> {
        if !std::mem::take(&mut self.sig.resumed) || r.first == 0 {
            return Ok(None);
        }
        let facts = self.proc_facts(m, r.module, r.block)?;
        let local = r.block.as_u32() - m.procs[m.blocks[r.block].proc].blocks.start;
        let st = &mut self.state.exec;
        st.bias = m.load_base;
        let known = st.known();
        self.compile(m, r, known, facts.anchors[local as usize])
            .map(Some)
    }
}
