//! Non-local exits: a setjmp's call returning again, and the C++
//! unwinder entering a landing pad (docs/regen.md section 3, "Fork,
//! exceptions, setjmp"; beyond paper 003's Figure 7, whose stack only pops at
//! EXIT).
//!
//! Invariants: frames are only dropped from the top, down to the frame the
//! record names (a setjmp's depth at its call, the newest frame of the landing pad's
//! procedure at a call site with a pad); suspended signal states whose
//! `Sig` frames go are dropped with them ([`Machine::sync_sigs`]).

use super::{Frame, Loc, Machine, Mark, Step};
use crate::compile::BlockIx;
use crate::error::{Error, Result};

impl<'a> Machine<'a> {
    /// Untraced code runs after a call that never returns; the call's
    /// frame stays (a longjmp's SETJMP_RESUME or a LANDING drops it).
    pub(super) fn never_returns(&mut self) -> Step {
        self.cur = None;
        Ok(())
    }

    /// SETJMP_RESUME: the setjmp-like call of block `block` of procedure
    /// `raw` returned again with `rsp`: a longjmp, made by traced code or
    /// not, came back to the activation whose SETJMP had that `rsp` at
    /// that call. The frames above its call are gone; it continues at the
    /// return point (a marked call waits there for the RETURN its code
    /// writes again: gcc -O1 marks main's setjmp call once the program
    /// has callbacks, `traces/combo.c`).
    pub(super) fn setjmp_resume(&mut self, raw: u32, rsp: u64, block: u32, offset: u64) -> Step {
        let (module, q) = self.locate("SETJMP_RESUME", raw, offset)?;
        let p = &self.image(module).procs[q];
        let at = (block < p.blocks.len() as u32).then(|| Loc {
            module,
            block: BlockIx::from_u32(p.blocks.start + block),
        });
        let depth = at.and_then(|at| Some((at, *self.setjmps.get(&(at, rsp))?)));
        let why = match depth {
            None => "with no setjmp recorded at that call with that rsp",
            Some((_, d)) if d > self.stack.len() => "to a setjmp whose frame has returned",
            Some((at, d)) => {
                self.stack.truncate(d);
                self.sync_sigs();
                self.trail.push(Mark::Gap { cnt: self.xfers });
                if self.call_of(at).marker {
                    self.stack.push(Frame::Ret(at));
                    return Ok(());
                }
                return self.step_from(at);
            }
        };
        Err(Error::Unexpected {
            thread: self.thread,
            record: format!("SETJMP_RESUME({raw}, {rsp:#x}, block {block})"),
            offset,
            at: why.into(),
        }
        .into())
    }

    /// The unwinder entered a landing pad of procedure `q`: the frames
    /// above the newest frame of `q` whose call site has a landing pad are
    /// gone, and that frame continues at its landing pad (the unwinder
    /// stops at the first frame, from the top, with a handler or cleanup
    /// for its call site).
    pub(super) fn land(&mut self, raw: u32, offset: u64) -> Result<()> {
        let (module, q) = self.locate("LANDING", raw, offset)?;
        while let Some(f) = self.stack.pop() {
            let Frame::Ret(c) = f else { continue };
            if c.module == module && self.block(c).proc == q {
                if let Some(pad) = self.call_of(c).landing {
                    self.sync_sigs();
                    // `compile` made the pad a module-wide block index.
                    self.cur = Some(Loc {
                        module: c.module,
                        block: BlockIx::from_u32(pad),
                    });
                    return Ok(());
                }
            }
        }
        self.sync_sigs();
        Err(Error::Unexpected {
            thread: self.thread,
            record: format!("LANDING({raw})"),
            offset,
            at: "with no active frame of that procedure at a call site with a landing pad".into(),
        })
    }
}
