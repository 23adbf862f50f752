//! The regeneration state machine: paper 003's Figure 7 with a procedure
//! stack (Section 4.2), extended to the records a real program writes
//! (`docs/regen.md` states the rules; they are the contract with the
//! rewriter).
//!
//! State: `cur` (the block executing next, `None` while untraced code runs),
//! a stack of frames (`Ret`: a traced caller waiting at a call vertex, `Cb`:
//! untraced code that called traced code back, `Lazy`: a lazy-binding path
//! in progress), the pending witness of Figure 7 and the lazy-binding
//! procedures already seen by this thread.
//!
//! Invariants: every block output was executed, in this order (the sink
//! only hands out blocks a later witness or record proves ran); the
//! pending witness is empty at every call vertex and EXIT (the blocking
//! property), which is checked; locations carry their module: the
//! executable and its instrumented libraries share one stack, and ENTER
//! and LANDING name a procedure by module tag (its top bits, see
//! [`TAG_SHIFT`]) and number within that module.

use crate::compile::{Block, Module, AMBIGUOUS, EXIT, NO_WITNESS};
use crate::error::{Error, Result};
use crate::stream::{Item, Stream};
use crate::summary::{Seg, Summaries};
use aetrace_format::progdb::{CallTarget, EdgeKindDb};
use aetrace_format::ThreadId;
use std::collections::HashSet;

/// ENTER and LANDING payloads: `tag << TAG_SHIFT | procedure` (the
/// rewriter's encoding, `docs/runtime.md` section 2).
pub const TAG_SHIFT: u32 = 24;

/// A traced block of one module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub module: u32,
    pub block: u32,
}

/// A procedure-stack entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frame {
    /// A traced caller at its call vertex.
    Ret(Loc),
    /// Untraced code that called traced code.
    Cb,
    /// A lazy-binding path entered from a PLT stub.
    Lazy,
}

/// A fork's parent state where its child continues (the child's stream,
/// after its FORK record, goes on from here: RETURN of the fork call first).
#[derive(Clone, Debug)]
pub struct ForkState {
    stack: Vec<Frame>,
    seen_lazy: HashSet<(u32, u32)>,
}

/// Where regenerated blocks go: their output bytes, or (when `counts` is
/// set) only how many there were.
pub struct Sink {
    pub out: Vec<u8>,
    /// `out[..certain]` certainly ran: a witness or record the program wrote
    /// later has been read. The blocks after it were forced moves since the
    /// program's last write; a stream that ends there (a killed program)
    /// does not say how far the program got, so they are not output.
    pub certain: usize,
    /// The machine pauses once `certain` reaches this many bytes.
    pub limit: usize,
    /// The machine pauses at the first read point (`summary` module) whose
    /// witness is at this stream offset or later, before the block there:
    /// where a long stream is cut into pieces.
    pub pause_at: u64,
    pub counts: Option<Counts>,
}

impl Sink {
    /// A sink for output bytes, pausing every `limit` bytes.
    pub fn output(out: Vec<u8>, limit: usize) -> Sink {
        Sink {
            certain: out.len(),
            out,
            limit,
            pause_at: u64::MAX,
            counts: None,
        }
    }

    /// A sink that counts, for a machine over `modules`.
    pub fn counting(modules: &[&Module]) -> Sink {
        Sink {
            out: Vec::new(),
            certain: 0,
            limit: usize::MAX,
            pause_at: u64::MAX,
            counts: Some(Counts {
                totals: vec![(0, 0); modules.len()],
                summaries: modules.iter().map(|m| Summaries::new(m)).collect(),
            }),
        }
    }
}

/// What a counting sink accumulates.
pub struct Counts {
    /// Per module: instructions and blocks executed.
    pub totals: Vec<(u64, u64)>,
    summaries: Vec<Summaries>,
}

/// What `run` stopped for.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    /// The output buffer is full: call `run` again.
    More,
    /// The stream ended cleanly.
    Done,
    /// At `Sink::pause_at`: the machine is at a read point, before its block.
    Paused,
}

/// One thread's regenerator. A clone is a snapshot: run from it, it
/// regenerates the rest of the stream as the original would.
#[derive(Clone)]
pub struct Machine<'a> {
    thread: ThreadId,
    modules: &'a [&'a Module],
    /// Module tag -> index in `modules`.
    by_tag: Vec<Option<u32>>,
    stream: Stream<'a>,
    cur: Option<Loc>,
    stack: Vec<Frame>,
    /// The pending witness of Figure 7 and its stream offset.
    pending: Option<(u32, u64)>,
    seen_lazy: HashSet<(u32, u32)>,
    started: bool,
    /// Entries into each procedure, per module.
    pub entries: Vec<Vec<u64>>,
    /// Appended to truncation messages (e.g. "the trace is incomplete").
    note: String,
    /// For a fork child: its parent's state at the fork.
    forked_from: Option<ForkState>,
    /// FORKED records read: each child pid with the state it continues from.
    pub forks: Vec<(u32, ForkState)>,
    /// Each jmp_buf's setjmp: the stack depth and call block where it was
    /// called (a later longjmp returns there).
    jmpbufs: std::collections::HashMap<u64, (usize, Loc)>,
    /// A longjmp in progress: its jmp_buf.
    longjmp_to: Option<(u64, u64)>,
}

impl<'a> Machine<'a> {
    pub fn new(
        thread: ThreadId,
        modules: &'a [&'a Module],
        stream: Stream<'a>,
        note: String,
    ) -> Self {
        let mut by_tag = Vec::new();
        for (i, m) in modules.iter().enumerate() {
            let t = m.tag as usize;
            if by_tag.len() <= t {
                by_tag.resize(t + 1, None);
            }
            by_tag[t] = Some(i as u32);
        }
        Machine {
            thread,
            modules,
            by_tag,
            stream,
            cur: None,
            stack: Vec::new(),
            pending: None,
            seen_lazy: HashSet::new(),
            started: false,
            entries: modules.iter().map(|m| vec![0; m.procs.len()]).collect(),
            note,
            forked_from: None,
            forks: Vec::new(),
            jmpbufs: Default::default(),
            longjmp_to: None,
        }
    }

    /// Stream offset of the next unread byte.
    pub fn stream_offset(&self) -> u64 {
        self.stream.offset()
    }

    /// Makes this the machine of a fork child that continues from `state`.
    pub fn continue_fork(&mut self, state: ForkState) {
        self.forked_from = Some(state);
    }

    fn module(&self, l: Loc) -> &'a Module {
        self.modules[l.module as usize]
    }

    fn block(&self, l: Loc) -> &'a Block {
        &self.module(l).blocks[l.block as usize]
    }

    fn proc_name(&self, l: Loc) -> &'a str {
        let m = self.module(l);
        &m.procs[m.blocks[l.block as usize].proc as usize].name
    }

    /// "in procedure f after block 0x401000" / "while untraced code runs".
    fn at(&self, l: Option<Loc>) -> String {
        match l {
            Some(l) => format!(
                "in procedure {} after block {}",
                self.proc_name(l),
                self.module(l).block_name(l.block)
            ),
            None => "while untraced code runs".into(),
        }
    }

    fn unexpected(&self, item: Item, offset: u64, at: Option<Loc>) -> Error {
        let at = self.at(at);
        match item {
            Item::End => Error::Truncated {
                thread: self.thread,
                offset,
                at: format!("{at}, where the program must have written more"),
                note: self.note.clone(),
            },
            Item::Signal { signo, rip } => Error::Signal {
                thread: self.thread,
                signo,
                rip,
                offset,
            },
            Item::Indirect(_) => Error::Unsupported {
                thread: self.thread,
                record: item.describe(),
                offset,
                at,
                why: "unresolved indirect jumps are not regenerated yet",
            },
            Item::SetjmpResume => Error::Unsupported {
                thread: self.thread,
                record: item.describe(),
                offset,
                at,
                why: "setjmp/longjmp is not regenerated yet",
            },
            Item::Landing(_) => Error::Unsupported {
                thread: self.thread,
                record: item.describe(),
                offset,
                at,
                why: "a landing pad is entered by the unwinder (untraced code), never from traced code",
            },
            Item::Fork(_) => Error::Unsupported {
                thread: self.thread,
                record: item.describe(),
                offset,
                at,
                why: "a fork child continues from its parent's state at the fork, and the parent's stream has no FORKED record for this child (the parent was not traced at the fork)",
            },
            Item::Desync(_) => Error::Unsupported {
                thread: self.thread,
                record: item.describe(),
                offset,
                at,
                why: "the program left instrumented code here; nothing after it can be regenerated",
            },
            _ => Error::Unexpected {
                thread: self.thread,
                record: item.describe(),
                offset,
                at,
            },
        }
    }

    /// The pending witness, or the one the program wrote when leaving `at`.
    #[inline(always)]
    fn take_witness(&mut self, at: Loc) -> Result<(u32, u64)> {
        if let Some(p) = self.pending.take() {
            return Ok(p);
        }
        if let Some(w) = self.stream.next_byte_witness() {
            return Ok(w);
        }
        self.read_witness(at)
    }

    /// Reads the witness the program wrote when leaving `at`.
    #[inline(never)]
    fn read_witness(&mut self, at: Loc) -> Result<(u32, u64)> {
        match self.stream.next_item()? {
            (Item::Witness(w), off) => Ok((w, off)),
            (item, off) => Err(self.unexpected(item, off, Some(at))),
        }
    }

    /// Checks that no witness is pending where the blocking property says
    /// none can be (a call vertex, EXIT).
    fn no_pending(&self, at: Loc, what: &str) -> Result<()> {
        match self.pending {
            None => Ok(()),
            Some((w, off)) => Err(Error::Unexpected {
                thread: self.thread,
                record: format!("witness {w} (still pending)"),
                offset: off,
                at: format!("{} at {what}", self.at(Some(at))),
            }),
        }
    }

    /// The module index and procedure number an ENTER or LANDING names.
    fn locate(&self, record: &str, raw: u32, offset: u64) -> Result<(u32, u32)> {
        let tag = raw >> TAG_SHIFT;
        match self.by_tag.get(tag as usize).copied().flatten() {
            Some(i) => Ok((i, raw & ((1 << TAG_SHIFT) - 1))),
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
    fn raw_id(&self, module: u32, q: u32) -> u32 {
        self.modules[module as usize].tag << TAG_SHIFT | q
    }

    fn enter(&mut self, module: u32, q: u32, offset: u64) -> Result<()> {
        let m = self.modules[module as usize];
        match m.procs.get(q as usize) {
            Some(p) if p.traced => {
                self.entries[module as usize][q as usize] += 1;
                self.cur = Some(Loc {
                    module,
                    block: p.entry,
                });
                Ok(())
            }
            Some(p) => Err(Error::Unexpected {
                thread: self.thread,
                record: format!("ENTER({q})"),
                offset,
                at: format!("(procedure {q}, {}, is not traced)", p.name),
            }),
            None => Err(Error::Unexpected {
                thread: self.thread,
                record: format!("ENTER({q})"),
                offset,
                at: format!("(module {} has {} procedures)", m.name, m.procs.len()),
            }),
        }
    }

    /// Chooses the successor edge `from` leaves by (Figure 7 at
    /// predicates; a witness edge consumes its witness) and returns its
    /// index in `succs`.
    fn choose_succ(&mut self, from: Loc) -> Result<u32> {
        let m = self.module(from);
        let b = &m.blocks[from.block as usize];
        let si = match b.succ_hi - b.succ_lo {
            0 => {
                return Err(Error::Unexpected {
                    thread: self.thread,
                    record: "control flow".into(),
                    offset: self.stream.offset(),
                    at: format!(
                        "{}: the block has no successor in the program database",
                        self.at(Some(from))
                    ),
                })
            }
            1 => {
                let s = m.succs[b.succ_lo as usize];
                if s.witness != NO_WITNESS {
                    let (w, off) = self.take_witness(from)?;
                    if w != s.witness {
                        return Err(Error::WrongWitness {
                            thread: self.thread,
                            proc: self.proc_name(from).to_owned(),
                            block: b.start,
                            to: m.target_name(s.to),
                            expected: s.witness,
                            found: w,
                            offset: off,
                        });
                    }
                }
                b.succ_lo
            }
            _ => {
                let (w, off) = self.take_witness(from)?;
                let si = match m.choose(b, w) {
                    Some(si) if si != AMBIGUOUS => si,
                    found => {
                        let mut e = Error::BadWitness {
                            thread: self.thread,
                            proc: self.proc_name(from).to_owned(),
                            block: b.start,
                            witness: w,
                            offset: off,
                        };
                        if found == Some(AMBIGUOUS) {
                            e = Error::Database {
                                module: m.name.clone(),
                                proc: self.proc_name(from).to_owned(),
                                what: format!(
                                    "block {:#x}: witness {w} (thread {}, stream byte offset {off}) is in the witness sets of two successors: the placement does not satisfy Trace(G, epl)",
                                    b.start, self.thread
                                ),
                            };
                        }
                        return Err(e);
                    }
                };
                if m.succs[si as usize].witness == NO_WITNESS {
                    self.pending = Some((w, off));
                }
                si
            }
        };
        Ok(si)
    }

    /// Takes the successor edge of `from`, then follows returns through
    /// EXIT until control is at a block or in untraced code (or, on a tail
    /// call's edge, makes the tail call).
    fn step_from(&mut self, mut from: Loc) -> Result<()> {
        loop {
            let si = self.choose_succ(from)?;
            let m = self.module(from);
            let b = &m.blocks[from.block as usize];
            let s = m.succs[si as usize];
            if s.to != EXIT {
                self.cur = Some(Loc {
                    module: from.module,
                    block: s.to,
                });
                return Ok(());
            }
            self.no_pending(from, "EXIT")?;
            if let Some(c) = b.call.filter(|c| c.tail && s.kind == EdgeKindDb::TailCall) {
                return self.call(from, c);
            }
            match s.kind {
                EdgeKindDb::Halt => {
                    // hlt/ud2/int3 trap to the kernel: nothing returns from them.
                    self.stack.clear();
                    self.cur = None;
                    return Ok(());
                }
                // A jump out of the procedure (a PLT stub's bound-import
                // outcome, a conditional tail call): untraced code runs.
                EdgeKindDb::TailCall => return self.jump_untraced(),
                _ => {}
            }
            // Return from the procedure.
            loop {
                match self.stack.pop() {
                    None | Some(Frame::Cb) => {
                        self.cur = None;
                        return Ok(());
                    }
                    Some(Frame::Lazy) => continue,
                    Some(Frame::Ret(c)) => {
                        if self.call_of(c).marker {
                            self.expect_return(c)?;
                        }
                        from = c;
                        break;
                    }
                }
            }
        }
    }

    fn call_of(&self, c: Loc) -> aetrace_format::progdb::CallDb {
        self.block(c)
            .call
            .expect("a Ret frame is pushed at call blocks only")
    }

    fn expect_return(&mut self, c: Loc) -> Result<()> {
        match self.stream.next_item()? {
            (Item::Return, _) => Ok(()),
            (item, off) => Err(self.unexpected(item, off, Some(c))),
        }
    }

    /// Control jumped to untraced code (it never returns here). An
    /// `exit`-like import reached this way announces itself with EXIT just
    /// before the jump; otherwise the untraced code returns to the top of
    /// the stack.
    fn jump_untraced(&mut self) -> Result<()> {
        if let (Item::Exit(_), _, len) = self.stream.peek()? {
            self.stream.advance(len);
            self.stack.clear();
            self.cur = None;
            return Ok(());
        }
        self.leave()
    }

    /// Untraced code returns to whatever is on top of the stack.
    fn leave(&mut self) -> Result<()> {
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
                    return self.step_from(c);
                }
            }
        }
    }

    /// Untraced code runs after a call that never returns: a longjmp in
    /// progress lands at its setjmp's return point (the frames above that
    /// setjmp's caller are gone); otherwise the call's frame stays.
    fn never_returns(&mut self) -> Result<()> {
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
            });
        };
        if depth > self.stack.len() {
            return Err(Error::Unexpected {
                thread: self.thread,
                record: format!("LONGJMP({buf:#x})"),
                offset,
                at: "to a setjmp whose frame has returned".into(),
            });
        }
        self.stack.truncate(depth);
        self.step_from(at)
    }

    /// Control leaves call block `at`.
    fn call(&mut self, at: Loc, c: aetrace_format::progdb::CallDb) -> Result<()> {
        self.no_pending(at, "a call")?;
        if !c.tail {
            // SETJMP/LONGJMP are written just before their call.
            match self.stream.peek()? {
                (Item::Setjmp(buf), _, len) => {
                    self.stream.advance(len);
                    self.jmpbufs.insert(buf, (self.stack.len(), at));
                }
                (Item::Longjmp(buf), off, len) => {
                    self.stream.advance(len);
                    self.longjmp_to = Some((buf, off));
                }
                _ => {}
            }
        }
        match c.target {
            CallTarget::Proc(q) => {
                if !c.tail {
                    self.stack.push(Frame::Ret(at));
                }
                let off = self.stream.offset();
                self.enter(at.module, q, off)
            }
            CallTarget::External if !c.tail => {
                if c.marker {
                    self.stack.push(Frame::Ret(at));
                    self.cur = None;
                    Ok(())
                } else if c.returns {
                    self.step_from(at)
                } else {
                    // Never returns; the frame stays for a LANDING record.
                    self.stack.push(Frame::Ret(at));
                    self.never_returns()
                }
            }
            CallTarget::External => {
                if let Some(l) = c.lazy {
                    if !self.seen_lazy.contains(&(at.module, l)) {
                        let (item, off, len) = self.stream.peek()?;
                        if item == Item::Enter(self.raw_id(at.module, l)) {
                            self.stream.advance(len);
                            self.seen_lazy.insert((at.module, l));
                            self.stack.push(Frame::Lazy);
                            return self.enter(at.module, l, off);
                        }
                    }
                }
                self.jump_untraced()
            }
            // A system call: EXIT before it when it ended the thread,
            // RETURN after it when it returned (nothing is pending at a
            // call vertex, so the next item is one of the two).
            CallTarget::Exit if c.returns && c.marker => match self.stream.next_item()? {
                (Item::Exit(_), _) => {
                    self.stack.clear();
                    self.cur = None;
                    Ok(())
                }
                (Item::Return, _) => self.step_from(at),
                (item, off) => Err(self.unexpected(item, off, Some(at))),
            },
            CallTarget::Exit => match self.stream.next_item()? {
                (Item::Exit(_), _) => {
                    self.stack.clear();
                    self.cur = None;
                    Ok(())
                }
                (item, off) => Err(self.unexpected(item, off, Some(at))),
            },
        }
    }

    /// The unwinder entered a landing pad of procedure `q`: the frames
    /// above the newest frame of `q` whose call site has a landing pad are
    /// gone, and that frame continues at its landing pad (the unwinder
    /// stops at the first frame, from the top, with a handler or cleanup
    /// for its call site).
    fn land(&mut self, raw: u32, offset: u64) -> Result<()> {
        let (module, q) = self.locate("LANDING", raw, offset)?;
        while let Some(f) = self.stack.pop() {
            let Frame::Ret(c) = f else { continue };
            if c.module == module && self.block(c).proc == q {
                if let Some(pad) = self.call_of(c).landing {
                    self.cur = Some(Loc {
                        module: c.module,
                        block: pad,
                    });
                    return Ok(());
                }
            }
        }
        Err(Error::Unexpected {
            thread: self.thread,
            record: format!("LANDING({raw})"),
            offset,
            at: "with no active frame of that procedure at a call site with a landing pad".into(),
        })
    }

    /// One item while untraced code runs; false at the end of the stream.
    fn untraced(&mut self) -> Result<bool> {
        let (item, off) = self.stream.next_item()?;
        match item {
            Item::End => return Ok(false),
            Item::Enter(raw) => {
                self.stack.push(Frame::Cb);
                let (module, q) = self.locate("ENTER", raw, off)?;
                self.enter(module, q, off)?;
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
                    })
                }
            },
            Item::Exit(_) => {
                self.stack.clear();
            }
            Item::Landing(q) => self.land(q, off)?,
            Item::Forked(pid) => self.forks.push((
                pid,
                ForkState {
                    stack: self.stack.clone(),
                    seen_lazy: self.seen_lazy.clone(),
                },
            )),
            other => return Err(self.unexpected(other, off, None)),
        }
        Ok(true)
    }

    /// Regenerates into `sink` until its buffer is full or the stream ends.
    /// On error, everything regenerated before it is in `sink`.
    pub fn run(&mut self, sink: &mut Sink) -> Result<Progress> {
        if !self.started {
            self.started = true;
            match self.stream.next_item()? {
                (Item::End, _) => return Ok(Progress::Done),
                (Item::Thread(_), _) => {}
                (Item::Fork(slot), off) => match self.forked_from.take() {
                    Some(state) => {
                        self.stack = state.stack;
                        self.seen_lazy = state.seen_lazy;
                    }
                    // A child that only execs (or dies) writes nothing more.
                    None => {
                        return match self.stream.peek()? {
                            (Item::End, _, _) => Ok(Progress::Done),
                            _ => Err(self.unexpected(Item::Fork(slot), off, None)),
                        }
                    }
                },
                (item, off) => {
                    return Err(Error::Unexpected {
                        thread: self.thread,
                        record: item.describe(),
                        offset: off,
                        at: "as the first record of a stream (THREAD or FORK must come first)"
                            .into(),
                    })
                }
            }
        }
        loop {
            let Some(l) = self.cur else {
                if !self.untraced()? {
                    sink.certain = sink.out.len();
                    return Ok(Progress::Done);
                }
                sink.certain = sink.out.len();
                continue;
            };
            let m = self.module(l);
            let b = &m.blocks[l.block as usize];
            // A read point (see `summary`): where pieces are cut and where
            // counting takes one step per witness.
            let read = match (self.pending, b.next, b.call) {
                (None, EXIT, None) => self.stream.peek_byte_witness(),
                _ => None,
            };
            if read.is_some() && self.stream.offset() >= sink.pause_at {
                // The witness is there, so everything output so far ran.
                sink.certain = sink.out.len();
                return Ok(Progress::Paused);
            }
            let counting = match &mut sink.counts {
                Some(c) => {
                    let t = &mut c.totals[l.module as usize];
                    t.0 += u64::from(b.ninsns);
                    t.1 += 1;
                    if let Some(w) = read {
                        let seg = c.summaries[l.module as usize].get(m, l.block, w);
                        if seg != Seg::NONE {
                            let (_, off) = self.stream.next_byte_witness().expect("peeked");
                            t.0 += u64::from(seg.insns);
                            t.1 += u64::from(seg.blocks);
                            self.pending =
                                (seg.pending != NO_WITNESS).then_some((seg.pending, off));
                            self.cur = Some(Loc {
                                module: l.module,
                                block: seg.end,
                            });
                            continue;
                        }
                    }
                    true
                }
                None => {
                    sink.out.extend_from_slice(m.text(b));
                    false
                }
            };
            if b.next != EXIT {
                // Fast path: a block that always falls into the next one.
                if self.pending.is_some() {
                    // The pending witness was written further on.
                    sink.certain = sink.out.len();
                }
                self.cur = Some(Loc {
                    module: l.module,
                    block: b.next,
                });
            } else {
                let (pending, offset) = (self.pending.is_some(), self.stream.offset());
                self.leave_block(l, b)?;
                if pending || self.pending.is_some() || self.stream.offset() != offset {
                    sink.certain = sink.out.len();
                }
            }
            if !counting && sink.certain >= sink.limit {
                return Ok(Progress::More);
            }
        }
    }

    #[inline]
    fn leave_block(&mut self, l: Loc, b: &Block) -> Result<()> {
        match b.call {
            Some(c) if !c.tail => self.call(l, c),
            _ => self.step_from(l),
        }
    }
}
