//! Non-local exits: a longjmp returning to its setjmp's call, and the C++
//! unwinder entering a landing pad (docs/regen.md section 3, "Fork,
//! exceptions, setjmp"; beyond paper 003's Figure 7, whose stack only pops at
//! EXIT).
//!
//! Invariants: frames are only dropped from the top, down to the frame the
//! record names (a setjmp's depth, the newest frame of the landing pad's
//! procedure at a call site with a pad); suspended signal states whose
//! `Sig` frames go are dropped with them ([`Machine::sync_sigs`]).

use super::{Frame, Loc, Machine, Mark, Step};
use crate::compile::BlockIx;
use crate::error::{Error, Result};

impl<'a> Machine<'a> {
    /// Untraced code runs after a call that never returns: a longjmp in
    /// progress lands at its setjmp's return point (the frames above that
    /// setjmp's caller are gone); otherwise the call's frame stays.
    pub(super) fn never_returns(&mut self) -> Step {
        self.cur = None;
        let Some((buf, offset)) = self.longjmp_to.take() else {
            return Ok(());
        };
        let Some(&(depth, at)) = self.jmpbufs.get(&buf) else {
            return Err(Error::Unexpected {
                thread: self.thread,
                record: format!("LONGJMP({buf:#x})"),
                offset,
                at: "with no setjmp recorded for that jmp_buf".into(),
            }
            .into());
        };
        if depth > self.stack.len() {
            return Err(Error::Unexpected {
                thread: self.thread,
                record: format!("LONGJMP({buf:#x})"),
                offset,
                at: "to a setjmp whose frame has returned".into(),
            }
            .into());
        }
        self.stack.truncate(depth);
        self.sync_sigs();
        self.trail.push(Mark::Gap { cnt: self.xfers });
        if self.call_of(at).marker {
            // setjmp "returns" again: the code after a marked call writes
            // its RETURN again (gcc -O1 marks main's setjmp call once the
            // program has callbacks: `traces/combo.c`).
            self.stack.push(Frame::Ret(at));
            return Ok(());
        }
        self.step_from(at)
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
