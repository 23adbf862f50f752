//! Calls and the procedure stack (paper 003 Figure 7's stack, Section
//! 4.2): a traced call pushes its caller (`Ret`) and enters the callee;
//! EXIT pops it; untraced code that calls traced code back pushes `Cb`;
//! marked calls wait for RETURN; external calls, system calls and `exit`
//! are read by their records (docs/regen.md section 3, "At block b").
//!
//! Invariants: nothing is pending at a call vertex (checked); ENTER names a
//! procedure by module tag and number ([`TAG_SHIFT`]); the machine's
//! transfer count grows at exactly the counted transfers
//! ([`Machine::counted`], see [`signals`](super::signals)).

use super::{Flow, Frame, Interrupt, Loc, Machine, Mark, ModuleIx, Retry, Step, TAG_SHIFT};
use crate::compile::ProcIx;
use crate::error::{Error, Result};
use crate::stream::Item;
use aetrace_format::progdb::{CallDb, CallTarget, EdgeKindDb};
use aetrace_graph::EntityRef;

impl<'a> Machine<'a> {
    /// The module index and procedure number an ENTER or LANDING names.
    pub(super) fn locate(&self, record: &str, raw: u32, offset: u64) -> Result<(ModuleIx, ProcIx)> {
        let tag = raw >> TAG_SHIFT;
        match self.by_tag.get(tag as usize).copied().flatten() {
            Some(i) => Ok((i, ProcIx::from_u32(raw & ((1 << TAG_SHIFT) - 1)))),
            None => Err(Error::Unexpected {
                thread: self.thread,
                record: format!("{record}({raw})"),
                offset,
                at: format!(
                    "(module tag {tag}: the trace has no instrumented module {tag} for this process)"
                ),
            }),
        }
    }

    /// The ENTER payload naming procedure `q` of module `module`.
    pub(super) fn raw_id(&self, module: ModuleIx, q: ProcIx) -> u32 {
        self.image(module).tag << TAG_SHIFT | q.as_u32()
    }

    pub(super) fn enter(&mut self, module: ModuleIx, q: ProcIx, offset: u64) -> Result<()> {
        let m = self.image(module);
        let n = q.as_u32();
        match m.procs.get(q) {
            Some(p) if p.traced => {
                self.entries[module.index()][q.index()] += 1;
                self.cur = Some(Loc {
                    module,
                    block: p.entry,
                });
                Ok(())
            }
            Some(p) => Err(Error::Unexpected {
                thread: self.thread,
                record: format!("ENTER({n})"),
                offset,
                at: format!("(procedure {n}, {}, is not traced)", p.name),
            }),
            None => Err(Error::Unexpected {
                thread: self.thread,
                record: format!("ENTER({n})"),
                offset,
                at: format!("(module {} has {} procedures)", m.name, m.procs.len()),
            }),
        }
    }

    /// ENTER_AT: traced procedure `q` was entered at its secondary entry
    /// point at link-time address `a` (a block start), not at its entry.
    fn enter_at(&mut self, module: ModuleIx, q: ProcIx, a: u32, offset: u64) -> Result<()> {
        let m = self.image(module);
        match m.block_starting(q, u64::from(a)) {
            Some(block) => {
                self.cur = Some(Loc { module, block });
                Ok(())
            }
            None => Err(Error::Unexpected {
                thread: self.thread,
                record: format!("ENTER_AT({}, {a:#x})", self.raw_id(module, q)),
                offset,
                at: format!(
                    "(procedure {} has no block starting there)",
                    m.procs[q].name
                ),
            }),
        }
    }

    /// Whether the call of block `l` is a counted transfer: the rewriter
    /// increments the thread's transfer count just before it
    /// (`CallDb::counts_transfer`).
    pub(super) fn counted(&self, l: Loc) -> bool {
        self.block(l).call.is_some_and(|c| c.counts_transfer())
    }

    /// Whether block `l` ends in a `ret` that is a counted transfer
    /// (`ProgramDb::counts_returns`): its increment is the last
    /// instrumentation before the `ret`.
    pub(super) fn counted_return(&self, l: Loc) -> bool {
        let m = self.module(l);
        let b = self.block(l);
        m.counts_returns
            && m.succs[b.succ_lo as usize..b.succ_hi as usize]
                .iter()
                .any(|s| s.kind == EdgeKindDb::Return)
    }

    pub(super) fn call_of(&self, c: Loc) -> aetrace_format::progdb::CallDb {
        self.block(c)
            .call
            .expect("a Ret frame is pushed at call blocks only")
    }

    pub(super) fn expect_return(&mut self, c: Loc) -> Step {
        match self.next(Retry::Return(c))? {
            (Item::Return, _) => {
                self.consumed(None);
                Ok(())
            }
            (item, off) => Err(self.unexpected(item, off, Some(c)).into()),
        }
    }

    /// Control leaves call block `at`.
    pub(super) fn call(&mut self, at: Loc, c: CallDb) -> Step {
        self.no_pending(at, "a call")?;
        if !c.tail {
            self.records_before_call(at, c)?;
        }
        match c.target {
            CallTarget::Proc(q) => {
                // A call, or a tail jump to a PLT stub whose own jump is
                // not counted (`CallDb::counts_transfer`).
                if c.counts_transfer() {
                    self.xfers = self.xfers.wrapping_add(1);
                }
                if !c.tail {
                    self.stack.push(Frame::Ret(at));
                }
                let off = self.stream.offset();
                Ok(self.enter(at.module, ProcIx::from_u32(q), off)?)
            }
            CallTarget::External if c.indirect => self.jump_indirect(at),
            CallTarget::External if !c.tail => self.call_external(at, c),
            CallTarget::External => self.jump_external(at, c),
            CallTarget::Exit => self.call_system(at, c),
        }
    }

    /// The records a thread writes just before a call it makes: SETJMP
    /// (before its own call: a callee's first record may be its setjmp's,
    /// right after ours), or a SIGNAL that stands before the call.
    fn records_before_call(&mut self, at: Loc, c: CallDb) -> Step {
        if self.stream.witness_next() {
            return Ok(());
        }
        match self.stream.peek()? {
            (item @ (Item::Setjmp(_) | Item::Longjmp(_)), off, _) if self.jmp_bufs => {
                return Err(self.unexpected(item, off, Some(at)).into());
            }
            (Item::Setjmp(rsp), _, len) if c.jmpbuf => {
                self.stream.advance(len);
                self.consumed(Some(at));
                self.setjmps.insert((at, rsp), self.stack.len());
            }
            (
                Item::Signal {
                    signo,
                    rip,
                    count,
                    fault,
                    ..
                },
                off,
                len,
            ) if self.before_call(rip, count) => {
                self.stream.advance(len);
                return Err(Flow::Signal(Interrupt {
                    signo,
                    rip,
                    count,
                    fault,
                    offset: off,
                    retry: Retry::Call(at),
                }));
            }
            _ => {}
        }
        Ok(())
    }

    /// A call (not a tail jump) to untraced code: a marked call waits for
    /// RETURN, an unmarked one comes back without a record, one that never
    /// returns keeps its frame.
    fn call_external(&mut self, at: Loc, c: CallDb) -> Step {
        self.xfers = self.xfers.wrapping_add(1);
        if c.marker {
            self.stack.push(Frame::Ret(at));
            self.cur = None;
            Ok(())
        } else if c.returns {
            self.trail.push(Mark::Gap { cnt: self.xfers });
            self.step_from(at)
        } else {
            // Never returns; the frame stays for a LANDING record.
            self.stack.push(Frame::Ret(at));
            self.never_returns()
        }
    }

    /// A system call: EXIT before it when it ended the thread, RETURN
    /// after it when it returned and is marked (nothing is pending at a
    /// call vertex, so the next item is one of the two). A stream that
    /// ends here, of a thread not killed, ends with the system call: it
    /// never returned (a static libc's traced `execve` that replaced the
    /// process image, as a dynamic program's untraced one does). A static
    /// executable's fork system call writes FORKED(child) before its
    /// RETURN in the parent: the child goes on from here, its RETURN first.
    fn call_system(&mut self, at: Loc, c: CallDb) -> Step {
        match self.next(Retry::Call(at))? {
            (Item::Forked(pid), _) if c.returns && c.marker => {
                self.consumed(None);
                self.stack.push(Frame::Ret(at));
                let state = self.fork_state();
                self.stack.pop();
                self.forks.push((pid, state));
                self.call_system(at, c)
            }
            (Item::Exit(_), _) => {
                self.consumed(Some(at));
                self.clear_stack();
                self.cur = None;
                Ok(())
            }
            (Item::End, _) if c.marker && !self.killed => {
                self.consumed(None);
                self.clear_stack();
                self.cur = None;
                Ok(())
            }
            (Item::Return, _) if c.returns && c.marker => {
                self.consumed(None);
                self.step_from(at)
            }
            (item, off) => Err(self.unexpected(item, off, Some(at)).into()),
        }
    }

    /// An unresolved jump leaves block `at`: INDIRECT(target) was written
    /// just before it. A block start of its procedure is where the copy
    /// went on (nothing pending, nothing counted); the entry of a traced
    /// procedure is its springboard, like any other target a counted jump
    /// into untraced code. DESYNC (a target inside the procedure that is
    /// no instruction, or in code no procedure holds: docs/rewrite.md,
    /// "Code no procedure holds") and a target inside another traced procedure (its
    /// original code ran untraced) end the walk with an error.
    fn jump_indirect(&mut self, at: Loc) -> Step {
        let (item, off) = self.next(Retry::Call(at))?;
        let Item::Indirect(target) = item else {
            return Err(self.unexpected(item, off, Some(at)).into());
        };
        self.consumed(Some(at));
        let m = self.module(at);
        let a = target.wrapping_sub(m.load_base);
        let proc = m.blocks[at.block].proc;
        if let Some(block) = m.block_starting(proc, a) {
            self.cur = Some(Loc {
                module: at.module,
                block,
            });
            return Ok(());
        }
        let desync = matches!(self.stream.peek()?, (Item::Desync(_), _, _));
        let m = self.module(at);
        let lost = |why| Error::Unsupported {
            thread: self.thread,
            record: item.describe(),
            offset: off,
            at: format!("{} (target {a:#x})", self.at(Some(at))),
            why,
        };
        if desync {
            // The copy writes DESYNC for a byte inside one of its
            // procedure's instructions, or for code no procedure holds.
            let inside = m.traced_at(a).is_some_and(|(q, _)| q == proc);
            return Err(lost(if inside {
                "the unresolved jump's target lies inside its procedure but starts no instruction the analysis decoded: the original code ran untraced from there"
            } else {
                "the unresolved jump's target lies in code no procedure holds: it ran untraced from there"
            })
            .into());
        }
        if let Some((q, false)) = m.traced_at(a) {
            let mut e = lost("the unresolved jump's target lies inside another traced procedure, not at its entry: that procedure's original code ran untraced from there");
            if let Error::Unsupported { at, .. } = &mut e {
                at.push_str(&format!(", inside {}", m.procs[q].name));
            }
            return Err(e.into());
        }
        self.xfers = self.xfers.wrapping_add(1);
        self.jump_untraced(at)
    }

    /// Control jumped from block `from` to untraced code (it never returns
    /// here). An `exit`-like import reached this way announces itself with
    /// EXIT just before the jump; otherwise the untraced code returns to
    /// the top of the stack.
    pub(super) fn jump_untraced(&mut self, from: Loc) -> Step {
        if self.stream.witness_next() {
            return self.leave();
        }
        match self.stream.peek()? {
            (Item::Exit(_), _, len) => {
                self.stream.advance(len);
                self.consumed(Some(from));
                self.clear_stack();
                self.cur = None;
                return Ok(());
            }
            // The untraced code returned first: the SIGNAL comes from traced
            // code ahead (a program's own `int3` trapping before any item
            // follows a lazy binding's jump); the step that reaches it reads it.
            (Item::Signal { rip, count, .. }, _, _) if self.ahead_of_trail(rip, count) => {}
            (item, off, len) => {
                if let Some(f) = Self::signal(item, off, Retry::JumpUntraced(from)) {
                    self.stream.advance(len);
                    return Err(f);
                }
            }
        }
        self.leave()
    }

    /// Untraced code returns to whatever is on top of the stack.
    fn leave(&mut self) -> Step {
        loop {
            match self.stack.last().copied() {
                None => {
                    self.cur = None;
                    return Ok(());
                }
                Some(Frame::Cb) => {
                    self.stack.pop();
                    self.cur = None;
                    return Ok(());
                }
                Some(Frame::Sig) => {
                    self.cur = None;
                    return Ok(());
                }
                Some(Frame::Lazy) => {
                    self.stack.pop();
                }
                Some(Frame::Ret(c)) => {
                    let call = self.call_of(c);
                    if call.marker {
                        // Callbacks and then RETURN follow.
                        self.cur = None;
                        return Ok(());
                    }
                    if !call.returns {
                        // A call that never returns (exit, abort, a C++
                        // throw or a longjmp through a PLT stub): the frames
                        // stay, for a LANDING record to unwind to.
                        return self.never_returns();
                    }
                    self.stack.pop();
                    self.trail.push(Mark::Gap { cnt: self.xfers });
                    return self.step_from(c);
                }
            }
        }
    }

    /// Empties the stack (the program ends, or traps with no return).
    pub(super) fn clear_stack(&mut self) {
        self.stack.clear();
        self.sync_sigs();
    }

    /// One item while untraced code runs; false at the end of the stream.
    pub(super) fn untraced(&mut self) -> Step<bool> {
        let (item, off) = self.next(Retry::Untraced)?;
        if self.faulted() {
            return match item {
                Item::End => Ok(false),
                _ => Err(self.unexpected(item, off, None).into()),
            };
        }
        if item == Item::End && self.killed {
            // Not `consumed`: the end of a killed thread's stream proves
            // nothing ran (the blocks since its last item may not have).
            let caller = self.stack.iter().rev().find_map(|f| match f {
                Frame::Ret(c) => Some(*c),
                _ => None,
            });
            self.stopped = Some(crate::ending::End::Stopped(match caller {
                Some(c) => format!(
                    "inside the call of block {} in procedure {}",
                    self.module(c).block_name(c.block),
                    self.proc_name(c)
                ),
                None => "in untraced code".into(),
            }));
            return Ok(false);
        }
        self.consumed(None);
        match item {
            Item::End => return Ok(false),
            Item::Enter(raw) | Item::EnterAt(raw, _) => {
                if self.stack.last() == Some(&Frame::Sig) {
                    // The handler's entry (its stub wrote SIGNAL, then ENTER).
                    if let Some(s) = self.sigs.last_mut() {
                        s.entered = true;
                    }
                }
                self.stack.push(Frame::Cb);
                let (module, q) = self.locate("ENTER", raw, off)?;
                self.enter(module, q, off)?;
                if let Item::EnterAt(_, a) = item {
                    self.enter_at(module, q, a, off)?;
                }
            }
            Item::Return => match self.stack.last().copied() {
                Some(Frame::Ret(c)) if self.call_of(c).marker => {
                    self.stack.pop();
                    self.step_from(c)?;
                }
                _ => {
                    return Err(Error::Unexpected {
                        thread: self.thread,
                        record: "RETURN".into(),
                        offset: off,
                        at: "while untraced code runs with no marked call waiting for it".into(),
                    }
                    .into())
                }
            },
            Item::Exit(_) => {
                self.clear_stack();
            }
            Item::Landing(q) => self.land(q, off)?,
            Item::SetjmpResume { proc, rsp, block } => self.setjmp_resume(proc, rsp, block, off)?,
            Item::Forked(pid) => {
                let state = self.fork_state();
                self.forks.push((pid, state));
            }
            other => return Err(self.unexpected(other, off, None).into()),
        }
        Ok(true)
    }
}
