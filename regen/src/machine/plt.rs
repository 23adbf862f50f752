//! PLT stubs and lazy binding: deciding a stub's `jmp [GOT]` between the
//! bound import and the lazy-binding path (paper 003 Section 4.2's calls,
//! extended to the dynamic linker's stubs).
//!
//! PLT stubs (docs/regen.md, "PLT stubs"): a stub's `jmp [GOT]` with
//! `CallDb::plt` writes nothing when bound; its lazy outcome writes
//! LAZY(stub) first. Invariant: at such a jump, the thread's next item is
//! LAZY naming this stub exactly when the lazy outcome was taken (the lazy
//! path writes nothing before it; after a bound jump the thread cannot
//! find the same slot unbound again, a slot never going back to its lazy
//! value, so this stub's LAZY cannot come next). [`Machine::plt_outcome`]
//! and the IBT case of [`Machine::call`] decide by it; a LAZY read
//! anywhere else is an error naming the stub.

use super::{Frame, Loc, Machine, Retry, Step};
use crate::compile::{ProcIx, SigAt, EXIT};
use crate::error::Error;
use crate::stream::Item;
use aetrace_format::progdb::CallDb;

impl<'a> Machine<'a> {
    /// The outcome of a PLT stub's `jmp [GOT]` whose database call has
    /// `plt` (`docs/regen.md`, "PLT stubs"): the index in `succs` of its
    /// lazy-binding half when the thread's next item is LAZY naming this
    /// stub (consumed), else of its edge to EXIT (the bound import). Exact
    /// because the lazy path writes LAZY before anything else it runs
    /// (it is the first thing the GOT slot's lazy value leads to), and the
    /// bound outcome cannot be followed by this stub's LAZY before another
    /// item: that would need this thread to find the slot unbound again
    /// after finding it bound, and a slot never goes back to its lazy
    /// value (`dlclose` of a traced module is refused). A SIGNAL read here
    /// aborts the step; the handler runs first, then the decision is redone.
    pub(super) fn plt_outcome(&mut self, from: Loc) -> Step<u32> {
        let m = self.module(from);
        let b = &m.blocks[from.block];
        let (mut bound, mut lazy) = (None, None);
        for si in b.succ_lo..b.succ_hi {
            if m.succs[si as usize].to == EXIT {
                bound = bound.or(Some(si));
            } else {
                lazy = lazy.or(Some(si));
            }
        }
        let (Some(bound), Some(lazy), 2) = (bound, lazy, b.succ_hi - b.succ_lo) else {
            return Err(Error::Database {
                module: m.name.clone(),
                proc: self.proc_name(from).to_owned(),
                what: format!(
                    "block {:#x}: a PLT stub's jump needs one edge to EXIT and one to its lazy-binding half",
                    b.start
                ),
            }
            .into());
        };
        if let Some((w, off)) = self.pending {
            return Err(Error::Unexpected {
                thread: self.thread,
                record: format!("witness {w} (still pending)"),
                offset: off,
                at: format!("{} at a PLT stub's jump", self.at(Some(from))),
            }
            .into());
        }
        Ok(if self.lazy_record(from, Retry::Step(from))? {
            lazy
        } else {
            bound
        })
    }

    /// At PLT jump `at` (`CallDb::plt`): whether the next item is LAZY
    /// naming its stub (consumed: the lazy outcome). A SIGNAL in traced
    /// code the thread reached after the bound jump (a callback, the
    /// caller after the import returned) or in untraced code entered later
    /// means the bound outcome, and the step that reaches it reads it; one
    /// before the jump, on the LAZY piece before its record (the jump's
    /// edge, "witness not reserved") or in the import aborts the step
    /// (`retry`), decided again after the handler.
    pub(super) fn lazy_record(&mut self, at: Loc, retry: Retry) -> Step<bool> {
        // The common case, without building an item: a witness is next.
        if self.stream.witness_next() {
            return Ok(false);
        }
        let me = self.raw_id(at.module, self.block(at).proc);
        match self.stream.peek()? {
            (Item::Lazy(raw), _, len) if raw == me => {
                self.stream.advance(len);
                self.consumed(None);
                Ok(true)
            }
            (Item::Signal { rip, count, .. }, _, _)
                if self.ahead_of_trail(rip, count)
                    && !matches!(self.place_rip(rip), Ok((mi, SigAt::Witness { from: f }, _))
                        if mi == at.module && f == at.block) =>
            {
                Ok(false)
            }
            (item, off, len) => match Self::signal(item, off, retry) {
                Some(f) => {
                    self.stream.advance(len);
                    Err(f)
                }
                None => Ok(false),
            },
        }
    }

    /// Whether block `l` is a PLT stub's jump decided by LAZY
    /// ([`Machine::plt_outcome`]).
    pub(super) fn is_plt_jump(&self, l: Loc) -> bool {
        let b = self.block(l);
        b.succ_hi - b.succ_lo == 2 && b.call.is_some_and(|c| c.plt)
    }

    /// A tail jump to untraced code through a PLT stub's GOT slot: the
    /// bound import, or the lazy-binding path (procedure `c.lazy`), taken
    /// when the thread's next item says so: LAZY naming the stub (IBT
    /// stubs, entered without ENTER), or the lazy procedure's ENTER the
    /// first time this thread binds through it.
    pub(super) fn jump_external(&mut self, at: Loc, c: CallDb) -> Step {
        // The database names the lazy-binding procedure by its number.
        let lazy_proc = c.lazy.map(ProcIx::from_u32);
        if let (true, Some(l)) = (c.plt, lazy_proc) {
            if self.lazy_record(at, Retry::Call(at))? {
                self.stack.push(Frame::Lazy);
                let off = self.stream.offset();
                return Ok(self.enter(at.module, l, off)?);
            }
            return self.jump_untraced(at);
        }
        let mut lazy = None;
        if let Some(l) = lazy_proc {
            if !self.seen_lazy.contains(&(at.module, l)) {
                let (item, off, len) = self.stream.peek()?;
                if let Some(f) = Self::signal(item, off, Retry::Call(at)) {
                    self.stream.advance(len);
                    return Err(f);
                }
                if item == Item::Enter(self.raw_id(at.module, l)) {
                    lazy = Some((l, off, len));
                }
            }
        }
        // The GOT jump (a `.plt.sec` stub's, whose GOT slot may
        // hold the lazy-binding entry: its ENTER) is counted either
        // way unless the way into the stub was (`CallDb::plt`); a
        // stub whose lazy half is its own successor block and
        // without `plt` counts only the bound outcome, this edge.
        if c.counts_transfer() {
            self.xfers = self.xfers.wrapping_add(1);
        }
        if let Some((l, off, len)) = lazy {
            self.stream.advance(len);
            self.consumed(None);
            self.seen_lazy.insert((at.module, l));
            self.stack.push(Frame::Lazy);
            return Ok(self.enter(at.module, l, off)?);
        }
        self.jump_untraced(at)
    }
}
