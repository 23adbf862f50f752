//! FAULT: the runtime's handler of a signal that ends the process wrote
//! where it struck (docs/regen.md, "Killed runs"). The record is placed
//! as a SIGNAL's rip is (section 3a); the output is cut there and the
//! thread's trace ends: with the faulting instruction when the
//! instruction at the rip raised the signal (it was fetched and started,
//! as valgrind reports it), else before the instruction the signal
//! interrupted. Nothing after the cut ran. A FAULT that cannot be placed
//! ends the trace as a killed thread's stream ends, at the last point its
//! witnesses determine, saying why.

use super::signals::Interrupt;
use super::{Frame, Loc, Machine, ModuleIx, Sink};
use crate::compile::SigAt;
use crate::ending::End;
use crate::error::{Error, Result};

impl<'a> Machine<'a> {
    /// A FAULT record where `sig.retry` needed another item.
    pub(super) fn on_fault(&mut self, sink: &mut Sink, sig: Interrupt) -> Result<()> {
        let (mi, at, raised) = match self.cut_at(sink, &sig) {
            Ok((mi, at, _, kept)) => {
                drop(kept);
                (mi, at, super::signals::raised(sig.signo, at))
            }
            Err(e) => {
                return Err(Error::Truncated {
                    thread: self.thread,
                    offset: sig.offset,
                    at: format!(
                        "{}, where its FAULT({}, {:#x}) could not be placed ({e})",
                        self.at(sig.retry.block().or(self.cur)),
                        sig.signo,
                        sig.rip
                    ),
                    note: String::new(),
                })
            }
        };
        let place = self.fault_place(mi, at, sig.rip);
        sink.certain = sink.out.len();
        self.stopped = Some(End::Fault {
            signo: sig.signo,
            at: place,
            raised,
        });
        self.cur = None;
        self.clear_stack();
        Ok(())
    }

    /// The thread wrote FAULT, its last item.
    pub(super) fn faulted(&self) -> bool {
        matches!(self.stopped, Some(End::Fault { .. }))
    }

    /// How an ending names the place `at` of module `mi` a FAULT with
    /// `rip` stands at.
    fn fault_place(&self, mi: ModuleIx, at: SigAt, rip: u64) -> String {
        let named = |block| {
            let l = Loc { module: mi, block };
            format!(
                "in procedure {} of {}",
                self.proc_name(l),
                self.module(l).name
            )
        };
        match at {
            SigAt::Insn { block, insn } => {
                let m = self.module(Loc { module: mi, block });
                let skip: u64 = m.insn_lens(block)[..insn as usize]
                    .iter()
                    .map(|&n| u64::from(n))
                    .sum();
                let addr = m.blocks[block].start + skip;
                format!("at instruction {addr:#x} {}", named(block))
            }
            SigAt::Witness { from } => {
                format!(
                    "on an edge leaving block {:#x} {}",
                    self.module(Loc {
                        module: mi,
                        block: from
                    })
                    .blocks[from]
                        .start,
                    named(from)
                )
            }
            SigAt::Returned { block } => format!(
                "after the call of block {:#x} {} returned",
                self.module(Loc { module: mi, block }).blocks[block].start,
                named(block)
            ),
            SigAt::Outside => {
                let caller = self.stack.iter().rev().find_map(|f| match f {
                    Frame::Ret(c) => Some(*c),
                    _ => None,
                });
                match caller {
                    Some(c) => format!(
                        "in untraced code at {rip:#x}, inside the call of block {} in procedure {}",
                        self.block_named(c),
                        self.proc_name(c)
                    ),
                    None => format!("in untraced code at {rip:#x}"),
                }
            }
        }
    }
}
