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
//! A `rep` string instruction stopped after some iterations, by its fault
//! (format 1.13) or by an asynchronous signal (format 1.16, the SIGNAL
//! flagged), has its `rcx`, `rsi` and `rdi` right after the record: the
//! iterations that ran are listed before the handler, the rest after it.
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

use super::{feed, iterations, Error, Sink, ThreadExec, Values, Writer, WINDOW};
use aetrace_analysis::addr::exec::code::BlockCode;
use aetrace_analysis::addr::exec::InsnAddrs;
use aetrace_analysis::addr::full::{self, Recorded};
use aetrace_analysis::addr::{Gpr, Repeat};
use aetrace_regen::compile::{Module, SigAt};
use aetrace_regen::handlers::Handlers;
use aetrace_regen::visit::{BlockRun, Visit};
use aetrace_regen::{DataValues, SignalAt};
use std::rc::Rc;

/// A faulting instruction run on its early values: its code, the values
/// it read (their places among them, and what each is) and its addresses.
type Early = (Rc<BlockCode>, Vec<(usize, Recorded)>, InsnAddrs);

/// A thread's signal handlers as the walk meets them.
#[derive(Default)]
pub(super) struct Signals {
    /// One per handler entered and not returned.
    saved: Handlers<Saved>,
    /// A handler returned: the next run continues the interrupted code.
    pub(super) resumed: bool,
    /// A `rep` string instruction raised a fault (format 1.13): its
    /// iterations before it are listed when its SIGNAL, or the FAULT that
    /// ends the thread, gives its registers.
    rep: Option<BlockRun>,
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
    /// The thread constants the interrupted code had taken: the handler
    /// starts without any, as the runtime's `signal_entry` clears the
    /// slot's `ONCE` word and `sigreturn` puts it back.
    once: super::Once,
}

impl Signals {
    /// No handler's state saved and no `rep` fault pending: the data
    /// walk may keep its state here (`state`).
    pub(super) fn quiet(&self) -> bool {
        self.saved.is_empty() && self.rep.is_none()
    }
}

impl Values<'_> {
    /// Takes the values up to the thread's next SIGNAL record, which must
    /// be the one of `signo` at stream `offset` (`want`; `None`: the
    /// thread's FAULT), and that record: the early values, the ENTER the
    /// first value after the handler follows, and the record.
    fn until_signal(
        &mut self,
        want: Option<(u32, u64)>,
    ) -> Result<(DataValues, Option<u32>, SignalAt), String> {
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
        self.mark = None;
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
            .filter(|s| match want {
                Some((signo, offset)) => !s.fault && s.signo == signo && s.offset == offset,
                None => s.fault,
            })
            .ok_or_else(|| match want {
                Some((signo, offset)) => format!("thread {t}: a handler of the SIGNAL({signo}) at stream offset {offset} was entered, but the thread's next SIGNAL record after the walk's values is not that one"),
                None => format!("thread {t}: a `rep` string instruction's fault ended the thread, but its next record after the walk's values is no FAULT"),
            })?;
        let enter = sig.enter.or(carried.filter(|_| more == 0));
        Ok((early, enter, sig))
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
        // The window's values from the stream move with it (`state`).
        self.spliced = shift + self.spliced.saturating_sub(rest);
        self.mark_at += shift as i64 - rest as i64;
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
    /// handler's values follow the SIGNAL (after a `rep` fault's three).
    pub(super) fn deliver<B: AsRef<[u8]> + Sync>(
        &mut self,
        visit: &Visit<'_, B>,
        signo: u32,
        offset: u64,
    ) -> Result<(), Error> {
        let (mut early, enter, sig) = self.values.until_signal(Some((signo, offset)))?;
        if let Some(r) = self.sig.rep.take() {
            self.rep_stopped(visit, r, &mut early, true)?;
        } else if sig.rep {
            self.rep_signal(visit, sig.rip, &mut early)?;
        }
        let state = std::mem::take(&mut self.state);
        let once = std::mem::take(&mut self.values.once);
        self.sig.saved.enter(
            offset,
            Saved {
                state,
                early,
                enter,
                once,
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
            s.state.back = s.state.back.filter(|b| b.unmoved(&s.state.regs, &regs));
            for g in s.state.regs.known.iter() {
                s.state.regs.set(g, regs[g.index()]);
            }
        }
        self.values.put_back(s.early, s.enter);
        self.values.once = s.once;
        self.state = s.state;
        self.sig.resumed = true;
        Ok(())
    }

    /// Run `r`, one instruction, raised a fault: it did nothing, so the
    /// sink gets its fetch alone (as lackey gives it), and its values,
    /// unread, are the handler's early values (or, a crash, the values a
    /// FAULT leaves unread). A `rep` string instruction may have done some
    /// iterations before the fault: from format 1.13 its registers after
    /// the SIGNAL or FAULT say how many (`rep_fault`, when the walk
    /// reaches that record); in older traces it is refused.
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
        if self.values.rep_faults && full::registers_at_fault(&i.prog) {
            self.sig.rep = Some(r);
            return Ok(());
        }
        if i.prog.refs.iter().any(|x| x.repeat != Repeat::Once) {
            return Err(format!(
                "thread {}: the `rep` string instruction at {ip:#x} ({}) raised a fault, \
                 after iterations whose number no record of this trace gives (format \
                 1.13 records it): its data addresses cannot be rebuilt (docs/data.md, \
                 \"Signals with data\")",
                self.thread_no(),
                i.insn
            )
            .into());
        }
        self.sink.run(r);
        self.sink
            .insn(r.first, ip, u32::from(lens[r.first as usize]))
    }

    /// The thread ends (its next is another, or the trace ends): a `rep`
    /// whose fault ended it lists its iterations before the fault.
    pub(super) fn end_thread<B: AsRef<[u8]> + Sync>(
        &mut self,
        visit: &Visit<'_, B>,
    ) -> Result<(), Error> {
        if let Some(r) = self.sig.rep.take() {
            let (mut early, ..) = self.values.until_signal(None)?;
            self.rep_stopped(visit, r, &mut early, true)?;
        }
        self.values.finish()
    }

    /// An asynchronous signal stopped a `rep` string instruction at `rip`
    /// (its SIGNAL flagged, format 1.16): its registers are the next three
    /// values. In traced code (the copy of an instruction, not
    /// instrumentation) the iterations before the signal are listed now,
    /// before the handler's; in untraced code the three are passed over.
    #[cold]
    fn rep_signal<B: AsRef<[u8]> + Sync>(
        &mut self,
        visit: &Visit<'_, B>,
        rip: u64,
        early: &mut DataValues,
    ) -> Result<(), Error> {
        let copied =
            (visit.modules().iter().zip(0..)).find_map(|(m, module)| match m.locate(rip) {
                Ok((SigAt::Insn { block, insn }, false)) => Some(BlockRun {
                    module,
                    block,
                    first: insn,
                    end: insn + 1,
                    faults: false,
                }),
                _ => None,
            });
        let Some(r) = copied else {
            self.take(3)?;
            return Ok(());
        };
        let m = &visit.modules()[r.module as usize];
        if !full::registers_at_fault(&self.decoded(m, r.module, r.block)?[r.first as usize].prog) {
            return Err(format!(
                "thread {}: a SIGNAL at {rip:#x} gives a `rep` string instruction's registers, but the instruction there is none",
                self.thread_no()
            )
            .into());
        }
        self.rep_stopped(visit, r, early, false)
    }

    /// Run `r`, a `rep` string instruction, stopped after some of its
    /// iterations: it raised a fault (`faulted`, format 1.13) or an
    /// asynchronous signal came (format 1.16). Its `rcx`, `rsi` and `rdi`
    /// then are the next three values, after its SIGNAL or FAULT, and
    /// `early` holds the values it wrote before. Lists the iterations
    /// before the stop, then a faulting one's fetch alone (lackey's
    /// order), and makes its early values and the state say what the
    /// instruction resumes with, so that after the handler it runs the
    /// iterations left from where it stopped.
    #[cold]
    fn rep_stopped<B: AsRef<[u8]> + Sync>(
        &mut self,
        visit: &Visit<'_, B>,
        r: BlockRun,
        early: &mut DataValues,
        faulted: bool,
    ) -> Result<(), Error> {
        let regs = self.take(3)?;
        let at_fault = |g: Gpr| match g.0 {
            1 => Some(regs[0]),
            6 => Some(regs[1]),
            7 => Some(regs[2]),
            _ => None,
        };
        let m = &visit.modules()[r.module as usize];
        let (code, read, got) = self.before_fault(m, r, early)?;
        let (count, flags) = got.rep.ok_or("internal: a `rep` without its count")?;
        let done = count.checked_sub(regs[0]).ok_or_else(|| {
            format!(
                "thread {}: a `rep` string instruction at {:#x} stopped with rcx {:#x}, above the {count} it started with",
                self.thread_no(),
                m.load_base.wrapping_add(code.insns[0].ip),
                regs[0]
            )
        })?;
        self.count(&code, 0, done);
        if m.shown && (faulted || done > 0) {
            self.sink.run(r);
            let (c, refs) = (
                (&code.insns[0], m.load_base),
                (code.refs(0), &got.addrs[..]),
            );
            match faulted {
                true => feed(self.sink, r.first, c, refs, Some((done, flags)))?,
                false => iterations(self.sink, r.first, c, refs, (done, flags))?,
            }
        }
        let insns = self.decoded(m, r.module, r.block)?;
        let refs = &insns[r.first as usize].prog.refs;
        for (n, what) in read {
            let v = match what {
                Recorded::Rcx => Some(regs[0]),
                Recorded::Reg(g) => at_fault(g),
                Recorded::Addr(j) => refs[j].addr.base.and_then(at_fault),
                _ => None,
            };
            if let Some(v) = v {
                early.values[n] = v;
            }
        }
        for g in [1, 6, 7].map(Gpr) {
            if self.state.regs.get(g).is_some() {
                self.state.regs.set(g, at_fault(g).unwrap_or_default());
            }
        }
        Ok(())
    }

    /// The code of run `r` (one instruction) for the thread's state, the
    /// values it read from `early` (their places and what each is, the
    /// full ones of `--check` too) and its addresses and count: the
    /// instruction run on its early values, with the state and the
    /// values left as they were.
    fn before_fault(
        &mut self,
        m: &Module,
        r: BlockRun,
        early: &mut DataValues,
    ) -> Result<Early, Error> {
        let kept = (self.state.clone(), self.sig.resumed);
        let scratch = Values {
            win: std::mem::take(early),
            thread: self.values.thread,
            ..Values::default()
        };
        let outer = std::mem::replace(&mut self.values, scratch);
        let ran = self.run_early(m, r);
        *early = std::mem::replace(&mut self.values, outer).win;
        (self.state, self.sig.resumed) = kept;
        ran
    }

    /// [`Writer::before_fault`] on the scratch values.
    fn run_early(&mut self, m: &Module, r: BlockRun) -> Result<Early, Error> {
        let code = match r.first {
            0 => match self.enter(m, r, &mut false)? {
                Some(code) => code,
                None => self.mods[r.module as usize].entries[r.block.as_u32() as usize]
                    .as_ref()
                    .map(|e| e.code.clone())
                    .ok_or("internal: a block entered without its entry")?,
            },
            _ => Rc::new(self.compile(m, r, self.state.regs.known)?),
        };
        let (mut got, mut read) = (InsnAddrs::default(), Vec::new());
        let mut exec = self.state.regs.exec(m.load_base);
        let values = &mut self.values;
        let take = &mut |what| {
            read.push((values.next, what));
            values.take_as(what, m)
        };
        if let Err(why) = exec.run_code(&code, 0, take, &mut got) {
            return Err(self.failed(m, r, 0, why));
        }
        if self.mods[r.module as usize].check {
            let insns = self.decoded(m, r.module, r.block)?;
            for &what in &insns[r.first as usize].full {
                read.push((self.values.next, what));
                self.values.take()?;
            }
        }
        Ok((code, read, got))
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
