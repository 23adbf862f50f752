//! Fork children: a child's stream continues from its parent's state at
//! the fork (its FORK record first, then RETURN of the fork call), taken
//! from the parent's FORKED record; so does a thread a traced `clone3` or
//! `clone` system call started (THREAD, then RETURN of the system call)
//! (docs/regen.md section 3, "Fork, exceptions, setjmp"). A child of a
//! clone on a stack of its own has no parent state: its stream, THREAD
//! or FORK first, goes on with an outside entry (ENTER_AT its system
//! call's return point, or ENTER where it first reaches traced code).
//!
//! Invariant: a child starts with its parent's stack, lazy bindings seen
//! and setjmp bindings; a fork inside a signal handler is refused.

use super::{Frame, Loc, Machine, ModuleIx, Progress, Suspended};
use crate::compile::ProcIx;
use crate::error::{Error, Result};
use crate::stream::Item;
use std::collections::HashSet;

/// A fork's parent state where its child continues (the child's stream,
/// after its FORK record, goes on from here: RETURN of the fork call first).
#[derive(Clone, Debug)]
pub struct ForkState {
    pub(super) stack: Vec<Frame>,
    pub(super) seen_lazy: HashSet<(ModuleIx, ProcIx)>,
    pub(super) sigs: Vec<Suspended>,
    /// The parent's setjmp bindings: the child has copies of their
    /// jmp_bufs and frames, and may longjmp to one (perl's `exit` in a
    /// forked child does).
    pub(super) setjmps: std::collections::HashMap<(Loc, u64), usize>,
}

impl<'a> Machine<'a> {
    /// Makes this the machine of a fork child that continues from `state`.
    pub fn continue_fork(&mut self, state: ForkState) {
        self.forked_from = Some(state);
    }

    /// The parent's state a child forked now continues from (a FORKED
    /// record).
    pub(super) fn fork_state(&self) -> ForkState {
        ForkState {
            stack: self.stack.clone(),
            seen_lazy: self.seen_lazy.clone(),
            sigs: self.sigs.clone(),
            setjmps: self.setjmps.clone(),
        }
    }

    /// Reads the stream's first record: THREAD, or FORK in a fork child,
    /// which takes its parent's state (as a traced clone's THREAD does).
    /// `Some` when there is nothing to regenerate.
    pub(super) fn start(&mut self) -> Result<Option<Progress>> {
        match self.stream.next_item()? {
            (Item::End, _) => return Ok(Some(Progress::Done)),
            // A thread a traced clone started goes on inside the system
            // call, from its creator's stack (it never returns into those
            // frames: it ends with `exit`).
            (Item::Thread(_), _) => {
                if let Some(state) = self.forked_from.take() {
                    self.stack = state.stack;
                    self.seen_lazy = state.seen_lazy;
                }
            }
            (Item::Fork(slot), off) => match self.forked_from.take() {
                Some(state) if !state.sigs.is_empty() => {
                    return Err(Error::Unsupported {
                        thread: self.thread,
                        record: Item::Fork(slot).describe(),
                        offset: off,
                        at: "(a fork child)".into(),
                        why: "the parent forked inside a signal handler; the child's return to the interrupted code is not regenerated",
                    })
                }
                Some(state) => {
                    self.stack = state.stack;
                    self.seen_lazy = state.seen_lazy;
                    self.setjmps = state.setjmps;
                }
                // A child that only execs (or dies) writes nothing more;
                // one a clone started on a stack of its own enters traced
                // code from untraced code, as a thread does, its frames
                // none of its parent's.
                None => {
                    return match self.stream.peek()? {
                        (Item::End, _, _) => Ok(Some(Progress::Done)),
                        (Item::Enter(_) | Item::EnterAt(..), _, _) => Ok(None),
                        _ => Err(self.unexpected(Item::Fork(slot), off, None)),
                    }
                }
            },
            (item, off) => {
                return Err(Error::Unexpected {
                    thread: self.thread,
                    record: item.describe(),
                    offset: off,
                    at: "as the first record of a stream (THREAD or FORK must come first)".into(),
                })
            }
        }
        Ok(None)
    }
}
