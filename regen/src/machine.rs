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
//!
//! Signals (docs/regen.md, "Signals"): the *trail* lists, in order, the
//! blocks output since the last item the thread wrote before the one being
//! read (and the untraced calls passed without a record, `Gap`), and
//! covers exactly the last `trail_bytes` bytes of output; it is the only
//! output that may still be cut. A SIGNAL record read where another item
//! was needed aborts the step in progress ([`Flow::Signal`]); its rip,
//! placed by the module's signal map, is found in the trail (or on the
//! unique witness-free path ahead), the output is cut there, the part
//! after the cut is kept in a `Sig` frame with the step to redo, and the
//! handler's trace follows. When the handler's frame is popped, the kept
//! output is put back (its trail after the handler's) and the step is
//! redone. `sigs` holds one entry per
//! `Sig` frame of the stack, in order.
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
//!
//! The transfer count (`xfers`, docs/regen.md "The transfer count")
//! mirrors the runtime's per-thread XFERS: it grows by one exactly when the
//! machine makes a counted transfer ([`Machine::counted`]:
//! `CallDb::counts_transfer`, the rewriter's rule), never when a step is
//! aborted before it. Every trail mark holds
//! the count it ran with, so two marks a SIGNAL's point could name differ
//! in count (two runs of one block are separated by the counted call of
//! the second; two gaps by the counted transfer into the second), except
//! *before a counted call*, which stands with the count and one more (the
//! increment is the instruction before the call): [`Machine::fits`].

use crate::compile::{Block, Module, SigAt, AMBIGUOUS, EXIT, NO_WITNESS};
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
    /// A signal interrupted the code below (its state in `Machine::sigs`).
    Sig,
}

/// How a step ended early: an error, or a SIGNAL record where the step
/// needed another item (the step is redone by `retry` once the handler
/// has run).
enum Flow {
    Err(Error),
    Signal {
        signo: u32,
        rip: u64,
        /// The thread's transfer count in the record (`None`: format 1.1).
        count: Option<u32>,
        offset: u64,
        retry: Retry,
    },
}

impl From<Error> for Flow {
    fn from(e: Error) -> Flow {
        Flow::Err(e)
    }
}

type Step<T = ()> = std::result::Result<T, Flow>;

/// The step a SIGNAL record interrupted, redone when its handler returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Retry {
    /// Leave block `l` (its call, or its successor).
    Leave(Loc),
    /// Take the successor edge of `l` (and follow returns).
    Step(Loc),
    /// Read the RETURN of marked call `c`, then take its successor.
    Return(Loc),
    /// Make the call of block `l`.
    Call(Loc),
    /// Jump from block `l` into untraced code.
    JumpUntraced(Loc),
    /// Read the next item while untraced code runs.
    Untraced,
}

impl Retry {
    /// The block whose end the step stands at, if any.
    fn block(self) -> Option<Loc> {
        match self {
            Retry::Leave(l)
            | Retry::Step(l)
            | Retry::Return(l)
            | Retry::Call(l)
            | Retry::JumpUntraced(l) => Some(l),
            Retry::Untraced => None,
        }
    }
}

/// An entry of the trail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mark {
    /// Block `loc` from instruction `first` on, then the blocks it falls
    /// into without a decision (`Block::next`); a signal can stand before
    /// instruction `min` or later of `loc` (an item written before `loc`'s
    /// last instruction has been read: `min` is that instruction).
    /// `cnt`: the thread's transfer count there (the chain's blocks have
    /// no call but its last, whose counted transfer adds 1 at its last
    /// instruction).
    Block {
        loc: Loc,
        first: u32,
        min: u32,
        cnt: u32,
    },
    /// Untraced code ran (a call or jump that came back without writing),
    /// with transfer count `cnt`.
    Gap { cnt: u32 },
    /// A signal handler's restorer ran and returned into the traced code
    /// the signal had interrupted: untraced code ran here, but never at a
    /// traced procedure's entry (the restorer is glibc's, and returns to
    /// an instrumented copy). Transfer count `cnt`.
    Restored { cnt: u32 },
    /// A summarised segment's blocks (`summary`), output in one piece. The
    /// item after its witness is a witness, which ends the trail before
    /// any SIGNAL could need them; a trail holding this has no
    /// occurrences for them, so placing a signal in it fails loudly.
    Segment,
}

/// One occurrence of a block in the trail.
#[derive(Clone, Copy, Debug)]
struct Occ {
    loc: Loc,
    first: u32,
    min: u32,
    /// The transfer count while it runs (before its counted call, if any).
    cnt: u32,
    /// Output offset of its text (from the start of the trail), length.
    pos: usize,
    len: usize,
    /// Index of its mark in the trail.
    mark: usize,
}

/// The state of code a signal interrupted.
#[derive(Clone, Debug)]
struct Suspended {
    /// Output cut off at the interrupted instruction, put back on return.
    tail: Vec<u8>,
    /// The trail covering `tail`.
    trail: Vec<Mark>,
    retry: Retry,
    /// The handler's ENTER has been read.
    entered: bool,
    /// Counting: blocks counted in `tail` (uncounted if it is dropped).
    counted: Vec<Loc>,
    /// The signal interrupted untraced code (its restorer returns there).
    outside: bool,
    /// The transfer count at the interruption (the handler starts from it).
    at_cut: u32,
    /// The transfers the machine had mirrored after the cut (the tail's;
    /// `u32::MAX`, i.e. -1, when the interrupted counted transfer's
    /// increment ran but the machine had not made that transfer yet).
    tail_inc: u32,
}

/// A fork's parent state where its child continues (the child's stream,
/// after its FORK record, goes on from here: RETURN of the fork call first).
#[derive(Clone, Debug)]
pub struct ForkState {
    stack: Vec<Frame>,
    seen_lazy: HashSet<(u32, u32)>,
    sigs: Vec<Suspended>,
    /// The parent's setjmp bindings: the child has copies of their
    /// jmp_bufs and frames, and may longjmp to one (perl's `exit` in a
    /// forked child does).
    jmpbufs: std::collections::HashMap<u64, (usize, Loc)>,
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
    /// Per module: the segments from read points (`summary`).
    segs: Vec<Summaries>,
}

impl Sink {
    /// A sink for the output bytes of a machine over `modules`, pausing
    /// every `limit` bytes.
    pub fn output(modules: &[&Module], out: Vec<u8>, limit: usize) -> Sink {
        Sink {
            certain: out.len(),
            out,
            limit,
            pause_at: u64::MAX,
            counts: None,
            segs: modules.iter().map(|m| Summaries::with_text(m)).collect(),
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
            }),
            segs: modules.iter().map(|m| Summaries::new(m)).collect(),
        }
    }
}

/// What a counting sink accumulates.
pub struct Counts {
    /// Per module: instructions and blocks executed.
    pub totals: Vec<(u64, u64)>,
}

impl Counts {
    #[inline]
    fn add(&mut self, module: u32, insns: u32, blocks: u64) {
        let t = &mut self.totals[module as usize];
        t.0 += u64::from(insns);
        t.1 += blocks;
    }
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
    /// The thread's process was killed by a signal (its THREAD_END).
    killed: bool,
    /// For a fork child: its parent's state at the fork.
    forked_from: Option<ForkState>,
    /// FORKED records read: each child pid with the state it continues from.
    pub forks: Vec<(u32, ForkState)>,
    /// Each jmp_buf's setjmp: the stack depth and call block where it was
    /// called (a later longjmp returns there).
    jmpbufs: std::collections::HashMap<u64, (usize, Loc)>,
    /// A longjmp in progress: its jmp_buf.
    longjmp_to: Option<(u64, u64)>,
    /// Output since the last item read (see the module comment).
    trail: Vec<Mark>,
    trail_bytes: usize,
    /// One per `Sig` frame of the stack, bottom first.
    sigs: Vec<Suspended>,
    /// Counting: blocks of dropped `Suspended::tail`s, to uncount.
    uncount: Vec<Loc>,
    /// SIGNAL records placed, and how many interrupted instrumentation.
    pub signals: (u64, u64),
    /// `cur` continues the trail's last chain (a resumed block that falls
    /// into the next one): no new mark.
    chained: bool,
    /// The thread's transfer count (the runtime's XFERS, docs/runtime.md
    /// section 2) as of the transfers made so far: 0 at a stream's start
    /// (a thread's or fork child's new slot), incremented at each counted
    /// transfer ([`Machine::counted`]) when the machine makes it.
    xfers: u32,
    /// A SIGNAL's rip may be glibc's signal restorer (traces before
    /// format 1.4): a `Restored` mark is then a place untraced code ran.
    restorer_rips: bool,
}

impl<'a> Machine<'a> {
    pub fn new(
        thread: ThreadId,
        modules: &'a [&'a Module],
        stream: Stream<'a>,
        note: String,
        restorer_rips: bool,
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
            killed: false,
            forked_from: None,
            forks: Vec::new(),
            jmpbufs: Default::default(),
            longjmp_to: None,
            trail: Vec::new(),
            trail_bytes: 0,
            sigs: Vec::new(),
            uncount: Vec::new(),
            signals: (0, 0),
            chained: false,
            xfers: 0,
            restorer_rips,
        }
    }

    /// The modules of its process image.
    pub fn modules(&self) -> &'a [&'a Module] {
        self.modules
    }

    /// Stream offset of the next unread byte.
    pub fn stream_offset(&self) -> u64 {
        self.stream.offset()
    }

    /// Makes this the machine of a fork child that continues from `state`.
    pub fn continue_fork(&mut self, state: ForkState) {
        self.forked_from = Some(state);
    }

    /// The thread's process was killed by a signal: a stream that ends
    /// while a traced caller waits for its call to return is the death of
    /// the thread inside that call, reported instead of taken for a normal
    /// end (a thread of a process that exits normally may end inside a
    /// blocking call another thread's `exit` cut short).
    pub fn set_killed(&mut self) {
        self.killed = true;
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
            Item::Signal { signo, rip, .. } => Error::Signal {
                thread: self.thread,
                signo,
                rip,
                offset,
                at,
                why: "a signal cannot be placed here".into(),
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
            // Written only on a stub's lazy path, read only where that
            // stub's jump is decided: anywhere else the trace and the
            // database disagree.
            Item::Lazy(raw) => Error::Unexpected {
                thread: self.thread,
                record: format!(
                    "{} (lazy binding in PLT stub {})",
                    item.describe(),
                    self.proc_named(raw)
                ),
                offset,
                at: format!("{at}, where no jump of that stub is being decided"),
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

    /// A SIGNAL record read by a step that must be redone after it.
    fn signal(item: Item, offset: u64, retry: Retry) -> Option<Flow> {
        match item {
            Item::Signal { signo, rip, count } => Some(Flow::Signal {
                signo,
                rip,
                count,
                offset,
                retry,
            }),
            _ => None,
        }
    }

    /// The next item, consumed; a SIGNAL aborts the step (`retry`).
    fn next(&mut self, retry: Retry) -> Step<(Item, u64)> {
        let (item, off) = self.stream.next_item()?;
        match Self::signal(item, off, retry) {
            Some(f) => Err(f),
            None => Ok((item, off)),
        }
    }

    /// An item the thread wrote has been read: the output so far ran,
    /// except the last instruction of `early`, the last block output, when
    /// the item was written before it.
    #[inline]
    fn consumed(&mut self, early: Option<Loc>) {
        self.trail.clear();
        self.trail_bytes = 0;
        if let Some(l) = early {
            let b = self.block(l);
            self.trail.push(Mark::Block {
                loc: l,
                first: 0,
                min: b.ninsns - 1,
                cnt: self.xfers,
            });
            self.trail_bytes = self.module(l).text(b).len();
        }
    }

    /// The pending witness, or the one the program wrote when leaving `at`.
    #[inline(always)]
    fn take_witness(&mut self, at: Loc) -> Step<(u32, u64)> {
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
    fn read_witness(&mut self, at: Loc) -> Step<(u32, u64)> {
        match self.next(Retry::Step(at))? {
            (Item::Witness(w), off) => Ok((w, off)),
            (item, off) => Err(self.unexpected(item, off, Some(at)).into()),
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

    /// How messages name the procedure an ENTER-style payload names.
    fn proc_named(&self, raw: u32) -> String {
        let (tag, q) = (raw >> TAG_SHIFT, raw & ((1 << TAG_SHIFT) - 1));
        match self.by_tag.get(tag as usize).copied().flatten() {
            Some(i) => {
                let m = self.modules[i as usize];
                match m.procs.get(q as usize) {
                    Some(p) => format!("{} of {}", p.name, m.name),
                    None => format!("{q} (module {} has {} procedures)", m.name, m.procs.len()),
                }
            }
            None => format!("{q} of module tag {tag}, which the process does not have"),
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
    fn choose_succ(&mut self, from: Loc) -> Step<u32> {
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
                }
                .into())
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
                        }
                        .into());
                    }
                    self.consumed(s.early.then_some(from));
                }
                b.succ_lo
            }
            _ if b.call.is_some_and(|c| c.plt) => self.plt_outcome(from)?,
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
                        return Err(e.into());
                    }
                };
                let s = m.succs[si as usize];
                if s.witness == NO_WITNESS {
                    self.pending = Some((w, off));
                    self.consumed(None);
                } else {
                    self.consumed(s.early.then_some(from));
                }
                si
            }
        };
        Ok(si)
    }

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
    fn plt_outcome(&mut self, from: Loc) -> Step<u32> {
        let m = self.module(from);
        let b = &m.blocks[from.block as usize];
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
    fn lazy_record(&mut self, at: Loc, retry: Retry) -> Step<bool> {
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
    fn is_plt_jump(&self, l: Loc) -> bool {
        let b = self.block(l);
        b.succ_hi - b.succ_lo == 2 && b.call.is_some_and(|c| c.plt)
    }

    /// Takes the successor edge of `from`, then follows returns through
    /// EXIT until control is at a block or in untraced code (or, on a tail
    /// call's edge, makes the tail call).
    fn step_from(&mut self, mut from: Loc) -> Step {
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
                    // hlt/ud2/int3 trap to the kernel: nothing returns from
                    // them. The frames stay, as under a call that never
                    // returns: a SIGILL/SIGSEGV/SIGTRAP handler may
                    // siglongjmp to one of them.
                    self.cur = None;
                    return Ok(());
                }
                // A jump out of the procedure (a PLT stub's bound-import
                // outcome, a conditional tail call): untraced code runs.
                EdgeKindDb::TailCall => return self.jump_untraced(from),
                _ => {}
            }
            // Return from the procedure.
            loop {
                match self.stack.pop() {
                    None | Some(Frame::Cb) => {
                        self.cur = None;
                        return Ok(());
                    }
                    Some(Frame::Sig) => {
                        // The signal's restorer runs (the handler's Cb
                        // frame is missing: a malformed stream resumes here).
                        self.stack.push(Frame::Sig);
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

    /// Whether the call of block `l` is a counted transfer: the rewriter
    /// increments the thread's transfer count just before it
    /// (`CallDb::counts_transfer`).
    fn counted(&self, l: Loc) -> bool {
        self.block(l).call.is_some_and(|c| c.counts_transfer())
    }

    /// Whether transfer count `n` can stand before instruction `insn` of
    /// occurrence `o`: its count, or one more at the last instruction of a
    /// counted call once the increment (just before the call) ran.
    fn fits(&self, o: &Occ, insn: u32, n: u32) -> bool {
        o.cnt == n
            || (o.cnt.wrapping_add(1) == n
                && insn + 1 == self.block(o.loc).ninsns
                && self.counted(o.loc))
    }

    fn call_of(&self, c: Loc) -> aetrace_format::progdb::CallDb {
        self.block(c)
            .call
            .expect("a Ret frame is pushed at call blocks only")
    }

    fn expect_return(&mut self, c: Loc) -> Step {
        match self.next(Retry::Return(c))? {
            (Item::Return, _) => {
                self.consumed(None);
                Ok(())
            }
            (item, off) => Err(self.unexpected(item, off, Some(c)).into()),
        }
    }

    /// Control jumped from block `from` to untraced code (it never returns
    /// here). An `exit`-like import reached this way announces itself with
    /// EXIT just before the jump; otherwise the untraced code returns to
    /// the top of the stack.
    fn jump_untraced(&mut self, from: Loc) -> Step {
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

    /// Untraced code runs after a call that never returns: a longjmp in
    /// progress lands at its setjmp's return point (the frames above that
    /// setjmp's caller are gone); otherwise the call's frame stays.
    fn never_returns(&mut self) -> Step {
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
        self.step_from(at)
    }

    /// Empties the stack (the program ends, or traps with no return).
    fn clear_stack(&mut self) {
        self.stack.clear();
        self.sync_sigs();
    }

    /// Drops the suspended states whose `Sig` frames are gone (a handler
    /// that longjmps or exits never resumes the code it interrupted: the
    /// output kept for that code never ran).
    fn sync_sigs(&mut self) {
        let n = self.stack.iter().filter(|f| **f == Frame::Sig).count();
        for s in self.sigs.drain(n.min(self.sigs.len())..) {
            self.uncount.extend_from_slice(&s.counted);
        }
    }

    /// The transfer counts of the trail's places where a SIGNAL whose rip
    /// is in untraced code can stand: gaps, and (before format 1.4, whose
    /// rips can be glibc's restorer) restorers.
    fn untraced_counts(&self) -> impl Iterator<Item = u32> + '_ {
        self.trail.iter().filter_map(|m| match *m {
            Mark::Gap { cnt } => Some(cnt),
            Mark::Restored { cnt } if self.restorer_rips => Some(cnt),
            _ => None,
        })
    }

    /// Whether a SIGNAL with `rip`, read where a block is about to make
    /// its call, stands before a record written before that call
    /// (else it comes from the callee, later).
    /// With a transfer count (format 1.2), only a place the count fits:
    /// a run of the block in the trail that fits it stands before the
    /// call, a later run of the same block (in the callee) does not.
    fn before_call(&self, rip: u64, count: Option<u32>) -> bool {
        match self.place_rip(rip) {
            Ok((module, SigAt::Insn { block, insn }, _)) => {
                self.occurrences(|_, _| 0).iter().any(|o| {
                    o.loc == Loc { module, block }
                        && o.min.max(o.first) <= insn
                        && count.is_none_or(|n| self.fits(o, insn, n))
                })
            }
            Ok((_, SigAt::Outside, _)) => self
                .untraced_counts()
                .any(|cnt| count.is_none_or(|n| n == cnt)),
            _ => false,
        }
    }

    /// Whether a SIGNAL with `rip` stands in traced code the thread has not
    /// run since its last record, or in untraced code the thread entered
    /// later than now: its transfer count is past the current one (every
    /// later entry into untraced code follows a counted transfer; without
    /// a witness at a PLT stub's bound jump, the next record may come from
    /// a later import).
    fn ahead_of_trail(&self, rip: u64, count: Option<u32>) -> bool {
        match self.place_rip(rip) {
            Ok((_, SigAt::Insn { .. } | SigAt::Witness { .. } | SigAt::Returned { .. }, _)) => {
                !self.before_call(rip, count)
            }
            Ok((_, SigAt::Outside, _)) => count.is_some_and(|n| {
                (n.wrapping_sub(self.xfers) as i32) > 0
                    && !self.untraced_counts().any(|cnt| cnt == n)
            }),
            Err(_) => false,
        }
    }

    /// Control leaves call block `at`.
    fn call(&mut self, at: Loc, c: aetrace_format::progdb::CallDb) -> Step {
        self.no_pending(at, "a call")?;
        if !c.tail {
            // SETJMP/LONGJMP are written just before their own call (a
            // callee's first record may be its setjmp's, right after ours).
            match self.stream.peek()? {
                (Item::Setjmp(buf), _, len) if c.jmpbuf => {
                    self.stream.advance(len);
                    self.consumed(Some(at));
                    self.jmpbufs.insert(buf, (self.stack.len(), at));
                }
                (Item::Longjmp(buf), off, len) if c.jmpbuf => {
                    self.stream.advance(len);
                    self.consumed(Some(at));
                    self.longjmp_to = Some((buf, off));
                }
                (Item::Signal { signo, rip, count }, off, len) if self.before_call(rip, count) => {
                    self.stream.advance(len);
                    return Err(Flow::Signal {
                        signo,
                        rip,
                        count,
                        offset: off,
                        retry: Retry::Call(at),
                    });
                }
                _ => {}
            }
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
                Ok(self.enter(at.module, q, off)?)
            }
            CallTarget::External if !c.tail => {
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
            // IBT: the lazy-binding half is procedure `l`, entered from
            // the LAZY piece without ENTER.
            CallTarget::External if c.plt && c.lazy.is_some() => {
                if self.lazy_record(at, Retry::Call(at))? {
                    let l = c.lazy.expect("matched");
                    self.stack.push(Frame::Lazy);
                    let off = self.stream.offset();
                    return Ok(self.enter(at.module, l, off)?);
                }
                self.jump_untraced(at)
            }
            CallTarget::External => {
                let mut lazy = None;
                if let Some(l) = c.lazy {
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
            // A system call: EXIT before it when it ended the thread,
            // RETURN after it when it returned (nothing is pending at a
            // call vertex, so the next item is one of the two).
            CallTarget::Exit if c.returns && c.marker => match self.next(Retry::Call(at))? {
                (Item::Exit(_), _) => {
                    self.consumed(Some(at));
                    self.clear_stack();
                    self.cur = None;
                    Ok(())
                }
                (Item::Return, _) => {
                    self.consumed(None);
                    self.step_from(at)
                }
                (item, off) => Err(self.unexpected(item, off, Some(at)).into()),
            },
            CallTarget::Exit => match self.next(Retry::Call(at))? {
                (Item::Exit(_), _) => {
                    self.consumed(Some(at));
                    self.clear_stack();
                    self.cur = None;
                    Ok(())
                }
                (item, off) => Err(self.unexpected(item, off, Some(at)).into()),
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
                    self.sync_sigs();
                    self.cur = Some(Loc {
                        module: c.module,
                        block: pad,
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

    /// One item while untraced code runs; false at the end of the stream.
    fn untraced(&mut self) -> Step<bool> {
        let (item, off) = self.next(Retry::Untraced)?;
        self.consumed(None);
        match item {
            Item::End => {
                let caller = self.stack.iter().rev().find_map(|f| match f {
                    Frame::Ret(c) => Some(*c),
                    _ => None,
                });
                return match caller {
                    Some(c) if self.killed => Err(Error::Truncated {
                        thread: self.thread,
                        offset: off,
                        at: format!(
                            "while procedure {} waits for the call of block {} to return: the process was killed by a signal after the thread's last record, at the latest inside that call",
                            self.proc_name(c),
                            self.module(c).block_name(c.block)
                        ),
                        note: self.note.clone(),
                    }
                    .into()),
                    _ => Ok(false),
                };
            }
            Item::Enter(raw) => {
                if self.stack.last() == Some(&Frame::Sig) {
                    // The handler's entry (its stub wrote SIGNAL, then ENTER).
                    if let Some(s) = self.sigs.last_mut() {
                        s.entered = true;
                    }
                }
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
                    }
                    .into())
                }
            },
            Item::Exit(_) => {
                self.clear_stack();
            }
            Item::Landing(q) => self.land(q, off)?,
            Item::Forked(pid) => self.forks.push((
                pid,
                ForkState {
                    stack: self.stack.clone(),
                    seen_lazy: self.seen_lazy.clone(),
                    sigs: self.sigs.clone(),
                    jmpbufs: self.jmpbufs.clone(),
                },
            )),
            other => return Err(self.unexpected(other, off, None).into()),
        }
        Ok(true)
    }

    /// The trail's block occurrences, in order, with the text length
    /// `len(block, first)` gives each (0 when only their order matters).
    fn occurrences(&self, len: impl Fn(Loc, u32) -> usize) -> Vec<Occ> {
        let mut out = Vec::new();
        let mut pos = 0;
        for (mark, &t) in self.trail.iter().enumerate() {
            let Mark::Block {
                loc,
                first,
                min,
                cnt,
            } = t
            else {
                continue;
            };
            let (mut l, mut first, mut min) = (loc, first, min);
            // A chain of forced moves: bounded by the module's blocks (a
            // cycle of them would be a witness-free cycle).
            for _ in 0..=self.module(loc).blocks.len() {
                let n = len(l, first);
                out.push(Occ {
                    loc: l,
                    first,
                    min,
                    cnt,
                    pos,
                    len: n,
                    mark,
                });
                pos += n;
                let next = self.block(l).next;
                if next == EXIT {
                    break;
                }
                l = Loc {
                    module: l.module,
                    block: next,
                };
                (first, min) = (0, 0);
            }
        }
        out
    }

    /// Where run-time address `rip` stands: by the signal map of the module
    /// whose instrumented copy holds it (the copies of a process image's
    /// modules never overlap), else in untraced code. Also whether it is
    /// inside instrumentation.
    fn place_rip(&self, rip: u64) -> std::result::Result<(u32, SigAt, bool), String> {
        let mut stub = false;
        for (i, m) in self.modules.iter().enumerate() {
            match m.locate(rip) {
                Ok((SigAt::Outside, ins)) => stub |= ins,
                Ok((at, ins)) => return Ok((i as u32, at, ins)),
                Err(e) if i == 0 => return Err(e),
                Err(e) => return Err(format!("{e} of {}", m.name)),
            }
        }
        Ok((0, SigAt::Outside, stub))
    }

    /// Whether run-time address `rip` is the original entry of a traced
    /// procedure of some module (its springboard).
    fn is_entry(&self, rip: u64) -> bool {
        self.modules.iter().any(|m| {
            let a = rip.wrapping_sub(m.load_base);
            m.procs
                .iter()
                .any(|p| p.traced && m.blocks.get(p.entry as usize).is_some_and(|b| b.start == a))
        })
    }

    /// A signal that cannot be placed: the error.
    fn sig_error(&self, signo: u32, rip: u64, offset: u64, retry: Retry, why: String) -> Error {
        Error::Signal {
            thread: self.thread,
            signo,
            rip,
            offset,
            at: self.at(retry.block().or(self.cur)),
            why,
        }
    }

    /// The witness-free path from `from` to `to` inside their procedure
    /// (without `from`): unique when it exists, as `E - epl` is a forest
    /// (paper 003, Theorem 4.2). Only `from` may be a call block already
    /// returned from (`returned`); the path passes through no other call.
    fn path(&self, from: Loc, to: u32, returned: bool) -> std::result::Result<Vec<u32>, String> {
        let m = self.module(from);
        if self.block(from).call.is_some() && !returned {
            return Err("the block makes a call first".into());
        }
        let mut parent: std::collections::HashMap<u32, u32> = Default::default();
        let mut work = vec![from.block];
        while let Some(b) = work.pop() {
            if b != from.block && (b == to || m.blocks[b as usize].call.is_some()) {
                continue;
            }
            let blk = &m.blocks[b as usize];
            for s in &m.succs[blk.succ_lo as usize..blk.succ_hi as usize] {
                if s.witness != NO_WITNESS || s.to == EXIT {
                    continue;
                }
                if s.to == from.block || parent.insert(s.to, b).is_some() {
                    return Err(format!(
                        "block {} is reached by two witness-free paths",
                        m.block_name(s.to)
                    ));
                }
                work.push(s.to);
            }
        }
        if !parent.contains_key(&to) {
            return Err(format!(
                "no witness-free path leads there from block {}",
                m.block_name(from.block)
            ));
        }
        let mut path = vec![to];
        while let Some(&p) = parent.get(path.last().expect("non-empty")) {
            if p == from.block {
                break;
            }
            path.push(p);
        }
        path.reverse();
        Ok(path)
    }

    /// A SIGNAL record where `retry` needed another item: places the
    /// interrupted position, cuts the output there (`sink.out` ends with
    /// the trail) and suspends the interrupted code under a `Sig` frame.
    fn on_signal(
        &mut self,
        sink: &mut Sink,
        signo: u32,
        rip: u64,
        count: Option<u32>,
        offset: u64,
        retry: Retry,
    ) -> Result<()> {
        let fail = |me: &Self, why: String| me.sig_error(signo, rip, offset, retry, why);
        let (mi, at, instrumentation) = self.place_rip(rip).map_err(|e| {
            fail(
                self,
                format!("the rip is no position a thread stops at: {e}"),
            )
        })?;
        let m = self.modules[mi as usize];
        // How messages name a block of the interrupted module.
        let name = |b: u32| match mi {
            0 => m.block_name(b),
            _ => format!("{} of {}", m.block_name(b), m.name),
        };
        let here = |b: u32| Loc {
            module: mi,
            block: b,
        };
        self.signals.0 += 1;
        self.signals.1 += u64::from(instrumentation);
        // A fault raised by the instruction at the rip (SIGILL, SIGBUS,
        // SIGFPE, SIGSEGV): it was fetched and started, as valgrind reports
        // it, and runs again if the handler returns.
        let tried = u32::from(matches!(signo, 4 | 7 | 8 | 11) && matches!(at, SigAt::Insn { .. }));
        let counting = sink.counts.is_some();
        let len = |l: Loc, first: u32| {
            if counting {
                return 0;
            }
            let b = self.block(l);
            if first == 0 {
                return self.module(l).text(b).len();
            }
            let mut v = Vec::new();
            self.module(l).part(l.block, first, b.ninsns, &mut v);
            v.len()
        };
        let occs = self.occurrences(len);
        let total: usize = occs.iter().map(|o| o.len).sum();
        if total != self.trail_bytes || sink.out.len() < total {
            return Err(fail(
                self,
                format!(
                    "internal: the trail covers {total} bytes, {} expected",
                    self.trail_bytes
                ),
            ));
        }
        let base = sink.out.len() - total;
        // A rip at a traced procedure's entry (its springboard, or the
        // outside-entry stub before its ENTER) is not in a restorer that
        // returns to traced code (the procedure scan only when it matters).
        let restorer = self.restorer_rips
            && matches!(at, SigAt::Outside)
            && !instrumentation
            && self
                .trail
                .iter()
                .any(|m| matches!(m, Mark::Restored { .. }))
            && !self.is_entry(rip);
        // Each gap with its transfer count.
        let gaps: Vec<(usize, u32)> = (0..self.trail.len())
            .filter_map(|i| match self.trail[i] {
                Mark::Gap { cnt } => Some((i, cnt)),
                Mark::Restored { cnt } if restorer => Some((i, cnt)),
                _ => None,
            })
            .collect();
        // Where to cut: (index of the first mark kept, occurrence split
        // at an instruction, output offset from `base`).
        enum Cut {
            /// At the end of the output.
            End,
            /// Before mark `mark` (a gap: everything after it is kept).
            Gap(usize),
            /// Inside occurrence `occ`, before instruction `insn`.
            Insn(usize, u32),
            /// Ahead on the witness-free path from the step's block to
            /// block `.1`, before instruction `.2` (`None`: after the block).
            Ahead(Loc, u32, Option<u32>),
        }
        let cut = match at {
            SigAt::Outside => {
                // Untraced code ran at each gap, and runs now if the step
                // was waiting for it; positions that no block separates
                // are one position.
                let at_gap = |g: usize| occs.iter().filter(|o| o.mark < g).count();
                let mut places: Vec<(usize, Option<usize>, u32)> = gaps
                    .iter()
                    .map(|&(g, cnt)| (at_gap(g), Some(g), cnt))
                    .collect();
                // (Deciding a PLT stub's jump: its bound outcome may have
                // entered the import.)
                if matches!(retry, Retry::Untraced | Retry::Call(_) | Retry::JumpUntraced(_))
                    || matches!(retry, Retry::Step(l) if self.is_plt_jump(l))
                {
                    // A call the step was about to make counted itself
                    // before it left for untraced code.
                    let made = matches!(retry, Retry::Call(l) if self.counted(l));
                    places.push((occs.len(), None, self.xfers.wrapping_add(u32::from(made))));
                }
                if let Some(n) = count {
                    let all: Vec<u32> = places.iter().map(|p| p.2).collect();
                    places.retain(|p| p.2 == n);
                    if places.is_empty() && !all.is_empty() {
                        return Err(fail(self, format!("the rip is in untraced code with transfer count {n}, but the thread entered untraced code since its last record only with transfer counts {all:?}: no place fits")));
                    }
                }
                let first = places.first().map(|p| p.0);
                if places.iter().any(|p| Some(p.0) != first) {
                    return Err(fail(self, format!("the rip is in untraced code, which the thread entered at {} places since its last record (external calls without RETURN{}): the trace cannot tell which one was interrupted", places.len(), if count.is_some() { ", with one transfer count" } else { "" })));
                }
                match places.last() {
                    None => {
                        return Err(fail(self, "the rip is in untraced code, but the thread ran no untraced code since its last record".into()))
                    }
                    Some((_, None, _)) => Cut::End,
                    Some((_, Some(g), _)) => Cut::Gap(*g),
                }
            }
            SigAt::Insn { block, insn } => {
                let mut hits: Vec<usize> = (0..occs.len())
                    .filter(|&i| {
                        let o = occs[i];
                        o.loc == here(block) && o.first.max(o.min) <= insn
                    })
                    .collect();
                if let Some(n) = count {
                    let all: Vec<u32> = hits.iter().map(|&i| occs[i].cnt).collect();
                    hits.retain(|&i| self.fits(&occs[i], insn, n));
                    if hits.is_empty() && !all.is_empty() {
                        return Err(fail(self, format!("the rip is before instruction {insn} of block {} with transfer count {n}, but the thread ran that block since its last record only with transfer counts {all:?}: no run fits", name(block))));
                    }
                }
                match (hits.as_slice(), retry) {
                    ([i], _) => Cut::Insn(*i, insn),
                    ([], Retry::Step(f) | Retry::Leave(f)) if f.module == mi => {
                        // Ahead on a witness-free path, which makes no call.
                        let ahead = Occ {
                            loc: here(block),
                            first: 0,
                            min: 0,
                            cnt: self.xfers,
                            pos: 0,
                            len: 0,
                            mark: 0,
                        };
                        if let Some(n) = count.filter(|&n| !self.fits(&ahead, insn, n)) {
                            return Err(fail(self, format!("the rip is before instruction {insn} of block {}, ahead with transfer count {}, but the record has transfer count {n}", name(block), self.xfers)));
                        }
                        Cut::Ahead(f, block, Some(insn))
                    }
                    ([], _) => {
                        return Err(fail(self, format!("the rip is before instruction {insn} of block {}, which the thread did not reach since its last record", name(block))))
                    }
                    (_, _) => {
                        return Err(fail(self, format!("the rip is before instruction {insn} of block {}, which the thread ran {} times since its last record: the trace cannot tell which time was interrupted", name(block), hits.len())))
                    }
                }
            }
            SigAt::Witness { from } => match retry {
                // (`Call`: the LAZY piece of an IBT stub's jump.)
                Retry::Step(f) | Retry::Leave(f) | Retry::Call(f) if f == here(from) => Cut::End,
                Retry::Step(f) | Retry::Leave(f) if f.module == mi => Cut::Ahead(f, from, None),
                _ => {
                    return Err(fail(self, format!("the rip is on an edge leaving block {} before its witness, but the thread is not deciding there", name(from))))
                }
            },
            SigAt::Returned { block } => {
                let c = here(block);
                let waiting = match retry {
                    Retry::Untraced => self.stack.last() == Some(&Frame::Ret(c)),
                    Retry::Return(r) => r == c,
                    // A `syscall` returned: its RETURN (or EXIT) is next.
                    Retry::Call(r) => {
                        r == c && matches!(self.call_of(c).target, CallTarget::Exit)
                    }
                    _ => false,
                };
                if !waiting {
                    return Err(fail(self, format!("the rip is after the call of block {} returned, but the thread is not waiting for that call", name(block))));
                }
                Cut::End
            }
        };
        // Make the cut: `tail` is the output after it, `trail` its marks.
        let mut tail = Vec::new();
        let mut trail = Vec::new();
        let mut counted = Vec::new();
        let mut retry = retry;
        match cut {
            Cut::End => {}
            Cut::Gap(g) => {
                let keep = occs.iter().find(|o| o.mark > g).map_or(total, |o| o.pos);
                tail = sink.out.split_off(base + keep);
                trail = self.trail[g + 1..].to_vec();
                counted = occs.iter().filter(|o| o.mark > g).map(|o| o.loc).collect();
            }
            Cut::Insn(i, insn) => {
                let o = occs[i];
                let b = self.block(o.loc);
                let rest = sink.out.split_off(base + o.pos);
                debug_assert_eq!(o.loc.module, mi);
                m.part(o.loc.block, o.first, insn + tried, &mut sink.out);
                m.part(o.loc.block, insn, b.ninsns, &mut tail);
                tail.extend_from_slice(rest.get(o.len..).unwrap_or_default());
                trail.push(Mark::Block {
                    loc: o.loc,
                    first: insn,
                    min: insn,
                    cnt: o.cnt,
                });
                // The mark's chain goes on from the cut block by itself.
                trail.extend_from_slice(&self.trail[o.mark + 1..]);
                counted = occs[i + 1..].iter().map(|o| o.loc).collect();
                if insn + tried == 0 {
                    counted.push(o.loc);
                }
            }
            Cut::Ahead(f, to, insn) => {
                let returned = matches!(retry, Retry::Step(_));
                let path = self.path(f, to, returned).map_err(|w| fail(self, w))?;
                let mut last_out = None;
                for &p in &path {
                    let l = Loc {
                        module: f.module,
                        block: p,
                    };
                    let b = self.block(l);
                    match sink.counts.as_mut() {
                        Some(c) => c.add(l.module, b.ninsns, 1),
                        None if p == to => {
                            m.part(p, 0, insn.map_or(b.ninsns, |k| k + tried), &mut sink.out)
                        }
                        None => sink.out.extend_from_slice(m.text(b)),
                    }
                    last_out = Some(l);
                }
                let l = last_out.expect("a path ends at its target");
                if let Some(k) = insn {
                    m.part(to, k, self.block(l).ninsns, &mut tail);
                    trail.push(Mark::Block {
                        loc: l,
                        first: k,
                        min: k,
                        cnt: self.xfers,
                    });
                    if k + tried == 0 {
                        counted.push(l);
                    }
                }
                retry = Retry::Leave(l);
            }
        }
        if counting {
            tail.clear();
        } else {
            counted.clear();
            // Where the handler's blocks begin: a reader (`aetrace verify`)
            // can tell them from a call.
            m.signal_note(signo, &mut sink.out);
        }
        sink.certain = sink.certain.max(sink.out.len());
        // The handler starts from the count at the interruption; the
        // transfers mirrored past the cut are made again after it.
        let at_cut = count.unwrap_or(self.xfers);
        let tail_inc = self.xfers.wrapping_sub(at_cut);
        self.xfers = at_cut;
        self.stack.push(Frame::Sig);
        self.sigs.push(Suspended {
            tail,
            trail,
            retry,
            entered: false,
            counted,
            outside: matches!(at, SigAt::Outside),
            at_cut,
            tail_inc,
        });
        self.cur = None;
        self.consumed(None);
        Ok(())
    }

    /// The handler of the newest signal returned: puts back the output
    /// kept for the interrupted code and redoes its step.
    fn resume(&mut self, sink: &mut Sink) -> Step {
        self.stack.pop();
        let s = self.sigs.pop().expect("one suspended state per Sig frame");
        if sink.counts.is_none() {
            sink.out.extend_from_slice(&s.tail);
        }
        // The handler's last blocks stay in the trail (a signal nested in
        // the handler after its last record is read only now), then the
        // restorer (untraced), then the resumed code.
        let cnt = self.xfers;
        self.trail.push(if s.outside {
            Mark::Gap { cnt }
        } else {
            Mark::Restored { cnt }
        });
        // The kept marks' counts move by the handler's transfers.
        let h = cnt.wrapping_sub(s.at_cut);
        self.trail.extend(s.trail.iter().map(|&m| match m {
            Mark::Block {
                loc,
                first,
                min,
                cnt,
            } => Mark::Block {
                loc,
                first,
                min,
                cnt: cnt.wrapping_add(h),
            },
            Mark::Gap { cnt } => Mark::Gap {
                cnt: cnt.wrapping_add(h),
            },
            Mark::Restored { cnt } => Mark::Restored {
                cnt: cnt.wrapping_add(h),
            },
            Mark::Segment => Mark::Segment,
        }));
        self.xfers = cnt.wrapping_add(s.tail_inc);
        self.trail_bytes += s.tail.len();
        self.cur = None;
        match s.retry {
            Retry::Leave(l) if self.block(l).next != EXIT => {
                // The trail's chain through `l` goes on by itself.
                self.cur = Some(Loc {
                    module: l.module,
                    block: self.block(l).next,
                });
                self.chained = true;
                Ok(())
            }
            Retry::Leave(l) => {
                let b = self.block(l);
                self.leave_block(l, b)
            }
            Retry::Step(l) => self.step_from(l),
            Retry::Return(c) => {
                self.expect_return(c)?;
                self.step_from(c)
            }
            Retry::Call(l) => {
                let c = self.call_of(l);
                self.call(l, c)
            }
            Retry::JumpUntraced(l) => self.jump_untraced(l),
            Retry::Untraced => Ok(()),
        }
    }

    /// Ends a step: a signal is placed, an error returned; the block
    /// control reached starts a new chain of the trail.
    #[inline]
    fn settle(&mut self, sink: &mut Sink, r: Step) -> Result<()> {
        match r {
            Ok(()) => {}
            Err(Flow::Err(e)) => return Err(e),
            Err(Flow::Signal {
                signo,
                rip,
                count,
                offset,
                retry,
            }) => self.on_signal(sink, signo, rip, count, offset, retry)?,
        }
        if !self.uncount.is_empty() {
            if let Some(c) = sink.counts.as_mut() {
                for l in &self.uncount {
                    let t = &mut c.totals[l.module as usize];
                    t.0 = t.0.saturating_sub(u64::from(
                        self.modules[l.module as usize].blocks[l.block as usize].ninsns,
                    ));
                    t.1 = t.1.saturating_sub(1);
                }
            }
            self.uncount.clear();
        }
        if std::mem::take(&mut self.chained) {
            return Ok(());
        }
        if let Some(l) = self.cur {
            self.trail.push(Mark::Block {
                loc: l,
                first: 0,
                min: 0,
                cnt: self.xfers,
            });
        }
        Ok(())
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
                        self.jmpbufs = state.jmpbufs;
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
                if self.stack.last() == Some(&Frame::Sig)
                    && self.sigs.last().is_some_and(|s| s.entered)
                {
                    // The handler returned (through the restorer).
                    let r = self.resume(sink);
                    self.settle(sink, r)?;
                    self.settle_certain(sink);
                    continue;
                }
                let (r, more) = match self.untraced() {
                    Ok(more) => (Ok(()), more),
                    Err(f) => (Err(f), true),
                };
                self.settle(sink, r)?;
                self.settle_certain(sink);
                if !more {
                    return Ok(Progress::Done);
                }
                continue;
            };
            let m = self.module(l);
            let b = &m.blocks[l.block as usize];
            // A read point (see `summary`): where pieces are cut, and
            // where the machine takes one step per witness.
            let read = match (self.pending, b.next, b.call) {
                (None, EXIT, None) => self.stream.peek_byte_witness(),
                _ => None,
            };
            // Pieces are not cut inside a signal handler: the interrupted
            // code's output kept for after it exists only when outputting.
            if read.is_some() && self.sigs.is_empty() && self.stream.offset() >= sink.pause_at {
                // The witness is there, so everything output so far ran.
                sink.certain = sink.out.len();
                return Ok(Progress::Paused);
            }
            let counting = match &mut sink.counts {
                Some(c) => {
                    let t = &mut c.totals[l.module as usize];
                    t.0 += u64::from(b.ninsns);
                    t.1 += 1;
                    // A summary only when the item after `w` is a witness
                    // too: a SIGNAL there would need the skipped blocks.
                    if let Some(w) = read.filter(|_| self.stream.peek_second_is_witness()) {
                        let seg = sink.segs[l.module as usize].get(m, l.block, w);
                        if seg != Seg::NONE {
                            let (_, off) = self.stream.next_byte_witness().expect("peeked");
                            self.consumed(None);
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
                    // As counting does; the segment's output starts with
                    // this block's.
                    if let Some(w) = read.filter(|_| self.stream.peek_second_is_witness()) {
                        let segs = &mut sink.segs[l.module as usize];
                        let seg = segs.get(m, l.block, w);
                        if seg != Seg::NONE {
                            let (_, off) = self.stream.next_byte_witness().expect("peeked");
                            // The trail the block-by-block walk would have
                            // (its bytes decide what is certain).
                            self.consumed(None);
                            self.trail.push(Mark::Segment);
                            self.trail_bytes = seg.trail as usize;
                            sink.out.extend_from_slice(segs.text(seg));
                            self.pending =
                                (seg.pending != NO_WITNESS).then_some((seg.pending, off));
                            let end = Loc {
                                module: l.module,
                                block: seg.end,
                            };
                            self.cur = Some(end);
                            self.trail.push(Mark::Block {
                                loc: end,
                                first: 0,
                                min: 0,
                                cnt: self.xfers,
                            });
                            self.settle_certain(sink);
                            if sink.certain >= sink.limit {
                                return Ok(Progress::More);
                            }
                            continue;
                        }
                    }
                    let t = m.text(b);
                    self.trail_bytes += t.len();
                    sink.out.extend_from_slice(t);
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
                let r = self.leave_block(l, b);
                self.settle(sink, r)?;
                self.settle_certain(sink);
            }
            if !counting && sink.certain >= sink.limit {
                return Ok(Progress::More);
            }
        }
    }

    /// After a step: the output before the trail certainly ran, and all
    /// of it while a witness read is pending (it was written further on).
    #[inline]
    fn settle_certain(&mut self, sink: &mut Sink) {
        let c = if self.pending.is_some() {
            sink.out.len()
        } else {
            sink.out.len().saturating_sub(self.trail_bytes)
        };
        sink.certain = sink.certain.max(c);
    }

    #[inline]
    fn leave_block(&mut self, l: Loc, b: &Block) -> Step {
        match b.call {
            Some(c) if !c.tail => self.call(l, c),
            _ => self.step_from(l),
        }
    }
}
