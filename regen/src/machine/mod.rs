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
//! Files by topic, each one `impl Machine` block: this one holds the state
//! and the main walk ([`Machine::run`]: blocks, fall-throughs, summarised
//! segments, Figure 7's choice at predicates, returns through EXIT);
//! [`calls`] the procedure stack (calls, returns, ENTER, untraced code);
//! [`plt`] PLT stubs and lazy binding; [`signals`] the trail and SIGNAL
//! placement; [`unwind`] longjmp and C++ landing pads; [`fork`] fork
//! children; [`diag`] how errors name places.

mod calls;
mod diag;
mod fault;
mod fork;
mod plt;
mod signals;
mod snapshot;
mod unwind;

pub use fork::ForkState;
use signals::{Interrupt, Mark, Retry, Suspended};

use crate::compile::{Block, BlockIx, Module, ProcIx, AMBIGUOUS, EXIT, NO_WITNESS};
use crate::ending::End;
use crate::error::{Error, Result};
use crate::stream::{Item, Stream};
use crate::summary::{Seg, Summaries};
use aetrace_format::progdb::EdgeKindDb;
use aetrace_format::ThreadId;
use aetrace_graph::EntityRef;
use std::collections::HashSet;

/// Callers a counting chain may return to without the machine (the
/// newest frames of its stack, moved into the chain for its run).
const CHAIN_FRAMES: usize = 4;

/// ENTER and LANDING payloads: `tag << TAG_SHIFT | procedure` (the
/// rewriter's encoding, `docs/runtime.md` section 2).
pub const TAG_SHIFT: u32 = 24;

aetrace_graph::entity!(
    /// A module of the machine's process image: its index in
    /// [`Machine::modules`] (not its tag in the trace, see [`TAG_SHIFT`]).
    pub struct ModuleIx,
    "module"
);

/// A traced block of one module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    /// The module's index in the machine's module list.
    pub module: ModuleIx,
    /// The block's global index in that module.
    pub block: BlockIx,
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
    Signal(Interrupt),
}

impl From<Error> for Flow {
    fn from(e: Error) -> Flow {
        Flow::Err(e)
    }
}

type Step<T = ()> = std::result::Result<T, Flow>;

/// Where regenerated blocks go: their output bytes, or (when `counts` is
/// set) only how many there were.
pub struct Sink {
    /// The regenerated output bytes.
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
    /// When set, only count executed blocks and instructions (`--count`); `out` stays empty.
    pub counts: Option<Counts>,
    /// When set, each signal delivery the machine regenerates is noted
    /// here (the debugger's signal stops; off by default: a long run may
    /// take many signals).
    pub deliveries: Option<Vec<Delivery>>,
    /// Per module: the segments from read points (`summary`).
    segs: Vec<Summaries>,
}

impl Sink {
    /// A sink for the output bytes of a machine over `modules`, pausing
    /// every `limit` bytes.
    pub fn output(modules: &[&Module], out: Vec<u8>, limit: usize) -> Sink {
        let segs = modules.iter().map(|m| Summaries::with_text(m)).collect();
        Sink::output_with(segs, out, limit)
    }

    /// [`Sink::output`] with `segs`, taken from a sink made as this one
    /// was (the next piece a worker expands: summaries depend on the
    /// modules alone, so their tables and output arena are allocated and
    /// paged in once per worker, not once per piece).
    pub(crate) fn output_with(segs: Vec<Summaries>, out: Vec<u8>, limit: usize) -> Sink {
        Sink {
            certain: out.len(),
            out,
            limit,
            pause_at: u64::MAX,
            counts: None,
            deliveries: None,
            segs,
        }
    }

    /// Its summaries, for [`Sink::output_with`] or [`Sink::counting_with`].
    pub(crate) fn take_summaries(&mut self) -> Vec<Summaries> {
        std::mem::take(&mut self.segs)
    }

    /// A sink that counts, for a machine over `modules`.
    pub fn counting(modules: &[&Module]) -> Sink {
        Sink::counting_with(modules.iter().map(|m| Summaries::new(m)).collect())
    }

    /// [`Sink::counting`] with `segs`, taken from a counting sink over the
    /// same modules (the next piece a worker counts, as
    /// [`Sink::output_with`]; fresh tables per piece cost a page fault per
    /// 4 KiB of them).
    pub(crate) fn counting_with(mut segs: Vec<Summaries>) -> Sink {
        // A run that failed may have left frames lent to its chain.
        segs.iter_mut().for_each(|s| s.frames.clear());
        debug_assert!(
            segs.iter().all(Summaries::settled),
            "a run settles its entries"
        );
        Sink {
            out: Vec::new(),
            certain: 0,
            limit: usize::MAX,
            pause_at: u64::MAX,
            counts: Some(Counts {
                totals: vec![(0, 0); segs.len()],
            }),
            deliveries: None,
            segs,
        }
    }
}

/// A signal's delivery or its handler's return, where the output is then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The output offset: where the handler's instructions begin (all the
    /// output before it ran before the signal was delivered), or where
    /// the interrupted code's resume after the handler returned.
    pub out: usize,
    /// The SIGNAL record's stream offset (a return names its delivery).
    pub record: u64,
    /// Which of the two.
    pub what: Noted,
}

/// What a [`Delivery`] notes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Noted {
    /// The signal was delivered.
    Delivered {
        /// The signal number.
        signo: u32,
        /// The run-time address of the interrupted instruction, the next
        /// one the thread would have run (a fault's: the faulting one),
        /// where the module's code says it; `None` in untraced code or in
        /// instrumentation before a witness (the next instruction is
        /// where the interrupted code resumes, once the witness is read).
        pc: Option<u64>,
        /// The signal interrupted untraced code.
        outside: bool,
    },
    /// Its handler returned.
    Returned,
}

/// What a counting sink accumulates.
pub struct Counts {
    /// Per module: instructions and blocks executed.
    pub totals: Vec<(u64, u64)>,
}

impl Counts {
    #[inline]
    fn add(&mut self, module: ModuleIx, insns: u32, blocks: u64) {
        let t = &mut self.totals[module.index()];
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
    by_tag: Vec<Option<ModuleIx>>,
    stream: Stream<'a>,
    cur: Option<Loc>,
    stack: Vec<Frame>,
    /// The pending witness of Figure 7 and its stream offset.
    pending: Option<(u32, u64)>,
    seen_lazy: HashSet<(ModuleIx, ProcIx)>,
    started: bool,
    /// Entries into each procedure, per module.
    pub entries: Vec<Vec<u64>>,
    /// Appended to truncation messages (e.g. "the trace is incomplete").
    note: String,
    /// The thread's process was killed by a signal (its THREAD_END).
    killed: bool,
    /// A killed thread's stream ended: where the next item was needed
    /// ([`crate::Ending::needed`]).
    pub stopped: Option<End>,
    /// For a fork child: its parent's state at the fork.
    forked_from: Option<ForkState>,
    /// FORKED records read: each child pid with the state it continues from.
    pub forks: Vec<(u32, ForkState)>,
    /// Each setjmp-like call made, by its call block and `rsp` there (its
    /// SETJMP): the stack depth at the call (a SETJMP_RESUME naming both
    /// returns there).
    setjmps: std::collections::HashMap<(Loc, u64), usize>,
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
    /// SETJMP and LONGJMP name jmp_bufs (traces before format 1.10):
    /// refused where read.
    jmp_bufs: bool,
    /// Every traced handler that returns writes SIGRETURN (format 1.11).
    sigreturns: bool,
}

impl<'a> Machine<'a> {
    /// A machine regenerating thread `thread` from its witness `stream`
    /// over `modules`; `note` is appended to truncation messages; `minor`
    /// is the trace's format minor version.
    pub(crate) fn new(
        thread: ThreadId,
        modules: &'a [&'a Module],
        stream: Stream<'a>,
        note: String,
        minor: u16,
    ) -> Self {
        use aetrace_format::header::{MINOR_RESTORER_RESOLVED, MINOR_SETJMP_RSP, MINOR_SIGRETURN};
        let mut by_tag = Vec::new();
        for (i, m) in modules.iter().enumerate() {
            let t = m.tag as usize;
            if by_tag.len() <= t {
                by_tag.resize(t + 1, None);
            }
            by_tag[t] = Some(ModuleIx::new(i));
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
            stopped: None,
            forked_from: None,
            forks: Vec::new(),
            setjmps: Default::default(),
            trail: Vec::new(),
            trail_bytes: 0,
            sigs: Vec::new(),
            uncount: Vec::new(),
            signals: (0, 0),
            chained: false,
            xfers: 0,
            restorer_rips: minor < MINOR_RESTORER_RESOLVED,
            jmp_bufs: minor < MINOR_SETJMP_RSP,
            sigreturns: minor >= MINOR_SIGRETURN,
        }
    }

    /// Its witness stream (a `-j N` worker passes its chunk buffers from
    /// piece to piece).
    pub(crate) fn stream_mut(&mut self) -> &mut Stream<'a> {
        &mut self.stream
    }

    /// The thread it regenerates.
    pub fn thread(&self) -> ThreadId {
        self.thread
    }

    /// The modules of its process image.
    pub fn modules(&self) -> &'a [&'a Module] {
        self.modules
    }

    /// Stream offset of the next unread byte.
    pub fn stream_offset(&self) -> u64 {
        self.stream.offset()
    }

    /// The thread's process was killed by a signal: a stream that ends
    /// while a traced caller waits for its call to return is the death of
    /// the thread inside that call, reported instead of taken for a normal
    /// end (a thread of a process that exits normally may end inside a
    /// blocking call another thread's `exit` cut short).
    pub fn set_killed(&mut self) {
        self.killed = true;
        self.stream.killed = true;
    }

    fn module(&self, l: Loc) -> &'a Module {
        self.image(l.module)
    }

    /// Module `mi` of the process image.
    fn image(&self, mi: ModuleIx) -> &'a Module {
        self.modules[mi.index()]
    }

    fn block(&self, l: Loc) -> &'a Block {
        &self.module(l).blocks[l.block]
    }

    fn proc_name(&self, l: Loc) -> &'a str {
        let m = self.module(l);
        &m.procs[m.blocks[l.block].proc].name
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
    /// none can be (a call vertex, EXIT). Inlined, its error out of line:
    /// it runs at every call and return.
    #[inline(always)]
    fn no_pending(&self, at: Loc, what: &str) -> Result<()> {
        match self.pending {
            None => Ok(()),
            Some((w, off)) => Err(self.still_pending(at, what, w, off)),
        }
    }

    #[cold]
    #[inline(never)]
    fn still_pending(&self, at: Loc, what: &str, w: u32, off: u64) -> Error {
        Error::Unexpected {
            thread: self.thread,
            record: format!("witness {w} (still pending)"),
            offset: off,
            at: format!("{} at {what}", self.at(Some(at))),
        }
    }

    /// Chooses the successor edge `from` leaves by (Figure 7 at
    /// predicates; a witness edge consumes its witness) and returns its
    /// index in `succs`.
    fn choose_succ(&mut self, from: Loc) -> Step<u32> {
        let m = self.module(from);
        let b = &m.blocks[from.block];
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

    /// Takes the successor edge of `from`, then follows returns through
    /// EXIT until control is at a block or in untraced code (or, on a tail
    /// call's edge, makes the tail call).
    fn step_from(&mut self, mut from: Loc) -> Step {
        loop {
            let si = self.choose_succ(from)?;
            let m = self.module(from);
            let b = &m.blocks[from.block];
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
                // The `ret` is a counted transfer (its increment, just
                // before it, stands at the block's last instruction).
                EdgeKindDb::Return if m.counts_returns => self.xfers = self.xfers.wrapping_add(1),
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

    /// Ends a step: a signal is placed, an error returned; the block
    /// control reached starts a new chain of the trail.
    #[inline]
    fn settle(&mut self, sink: &mut Sink, r: Step) -> Result<()> {
        match r {
            Ok(()) => {}
            Err(Flow::Err(e)) => {
                // What the step read before it failed still proves the
                // output before it ran: a `ret` edge's witness read, then
                // the caller's next witness missing (a cut stream) leaves
                // the blocks up to the `ret` certain, as a piece cut at
                // that witness has them.
                self.settle_certain(sink);
                return Err(e);
            }
            Err(Flow::Signal(sig)) => {
                if let Err(e) = self.on_signal(sink, sig) {
                    // (A FAULT that cannot be placed ends the trace as
                    // a killed thread's stream does.)
                    self.settle_certain(sink);
                    return Err(e);
                }
            }
        }
        if !self.uncount.is_empty() {
            if let Some(c) = sink.counts.as_mut() {
                for l in &self.uncount {
                    let t = &mut c.totals[l.module.index()];
                    t.0 = t.0.saturating_sub(u64::from(self.block(*l).ninsns));
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
    /// On error, everything regenerated before it is in `sink`. A killed
    /// thread's stream that ends where the next item is needed ends its
    /// trace ([`Machine::stopped`]): what certainly ran is in `sink`.
    /// Counting, `entries` are whole when it returns.
    pub fn run(&mut self, sink: &mut Sink) -> Result<Progress> {
        let r = match self.walk(sink) {
            Err(Error::Truncated { at, .. }) if self.killed && self.stream.at_end() => {
                let at = at.trim_end_matches(diag::MUST_WRITE_MORE);
                self.stopped = Some(End::Stopped(at.to_owned()));
                Ok(Progress::Done)
            }
            r => r,
        };
        if sink.counts.is_some() {
            for (s, e) in sink.segs.iter_mut().zip(&mut self.entries) {
                s.settle_entries(e);
            }
        }
        r
    }

    fn walk(&mut self, sink: &mut Sink) -> Result<Progress> {
        if !self.started {
            self.started = true;
            if let Some(p) = self.start()? {
                return Ok(p);
            }
        }
        loop {
            let Some(l) = self.cur else {
                if !self.untraced_step(sink)? {
                    return Ok(Progress::Done);
                }
                continue;
            };
            let m = self.module(l);
            let b = &m.blocks[l.block];
            // A read point (see `summary`): where pieces are cut, and
            // where the machine takes one step per witness.
            let candidate = matches!((self.pending, b.next, b.call), (None, EXIT, None));
            let read = if candidate {
                self.stream.peek_byte_witness()
            } else {
                None
            };
            // Pieces are not cut inside a signal handler: the interrupted
            // code's output kept for after it exists only when outputting.
            // The pause depends on the stream's bytes only, so a witness
            // not buffered yet is read (a piece started from the state
            // index must pause where the walk that built it did).
            if candidate
                && self.sigs.is_empty()
                && self.stream.offset() >= sink.pause_at
                && (read.is_some() || self.stream.peek_byte_witness_read()?.is_some())
            {
                // The witness is there, so everything output so far ran.
                sink.certain = sink.out.len();
                return Ok(Progress::Paused);
            }
            // In a data trace, the VALUE records before the witness are
            // passed over (a SIGNAL or ENTER among them still stops it),
            // after the pause: pieces are cut where a witness is next.
            let read = match read {
                None if candidate => self.stream.skip_values_to_witness(),
                r => r,
            };
            let counting = match &mut sink.counts {
                Some(c) => {
                    if read.is_some() && self.count_run(l, c, &mut sink.segs, sink.pause_at) {
                        continue;
                    }
                    let t = &mut c.totals[l.module.index()];
                    t.0 += u64::from(b.ninsns);
                    t.1 += 1;
                    // A summary only when the item after `w` is a witness
                    // too: a SIGNAL there would need the skipped blocks.
                    if let Some(w) = read.filter(|_| second_is_witness(&self.stream)) {
                        let seg = sink.segs[l.module.index()].get(m, l.block, w);
                        if seg.is_some() {
                            t.0 += u64::from(seg.insns);
                            t.1 += u64::from(seg.blocks);
                            self.skip_segment(l, seg);
                            continue;
                        }
                    }
                    true
                }
                None => {
                    // As counting does; the segment's output starts with
                    // this block's.
                    if read.is_some() && self.output_run(l, sink) {
                        self.settle_certain(sink);
                        if sink.certain >= sink.limit {
                            return Ok(Progress::More);
                        }
                        continue;
                    }
                    if let Some(w) = read.filter(|_| second_is_witness(&self.stream)) {
                        let segs = &mut sink.segs[l.module.index()];
                        let seg = segs.get(m, l.block, w);
                        if seg.is_some() {
                            sink.out.extend_from_slice(segs.text(seg));
                            // The trail the block-by-block walk would have
                            // (its bytes decide what is certain).
                            self.skip_segment(l, seg);
                            self.trail.push(Mark::Segment);
                            self.trail_bytes = seg.trail as usize;
                            // The segment's end, as `skip_segment` set it: not
                            // read back from `self.cur`, whose two halves were
                            // just stored (a wide load of them stalls).
                            self.trail.push(Mark::Block {
                                loc: Loc {
                                    module: l.module,
                                    block: seg.end,
                                },
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

    /// Untraced code runs: the handler of the newest signal returned, or
    /// the next item is read. False at the end of the stream.
    fn untraced_step(&mut self, sink: &mut Sink) -> Result<bool> {
        if self.stack.last() == Some(&Frame::Sig) && self.sigs.last().is_some_and(|s| s.entered) {
            // The handler returned (through the restorer).
            let r = self.resume(sink);
            self.settle(sink, r)?;
            self.settle_certain(sink);
            return Ok(true);
        }
        let (r, more) = match self.untraced() {
            Ok(more) => (Ok(()), more),
            Err(f) => (Err(f), true),
        };
        self.settle(sink, r)?;
        self.settle_certain(sink);
        Ok(more)
    }

    /// Passes summarised segment `seg` from read point `l`: its witness is
    /// read, and control is at the segment's end with its pending witness.
    #[inline(always)]
    fn skip_segment(&mut self, l: Loc, seg: Seg) {
        let (_, off) = self.stream.next_byte_witness().expect("peeked");
        self.consumed(None);
        self.pending = (seg.pending != NO_WITNESS).then_some((seg.pending, off));
        self.cur = Some(Loc {
            module: l.module,
            block: seg.end,
        });
    }

    /// Output at read point `l`: passes the chain [`Summaries::output_run`]
    /// finds there (stopping before `pause_at`), outputting it, and leaves
    /// the machine as the block-by-block walk would be at its end, with
    /// its trail. False when it passed none.
    #[inline(always)]
    fn output_run(&mut self, l: Loc, sink: &mut Sink) -> bool {
        let max = sink.pause_at.saturating_sub(self.stream.offset());
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        let m = self.module(l);
        let s = &mut sink.segs[l.module.index()];
        self.lend_frames(l.module, s);
        let entries = &mut self.entries[l.module.index()];
        let bytes = self.stream.buffered();
        let run = s.output_run(m, l.block, bytes, (max, sink.limit), &mut sink.out, entries);
        self.take_frames(l.module, s);
        if run.witnesses == 0 {
            return false;
        }
        self.stream.advance(run.witnesses);
        self.consumed(None);
        self.xfers = self.xfers.wrapping_add(run.xfers);
        let end = Loc {
            module: l.module,
            block: BlockIx::new(run.end as usize),
        };
        self.cur = Some(end);
        self.trail.push(Mark::Segment);
        self.trail_bytes = run.trail;
        self.trail.push(Mark::Block {
            loc: end,
            first: 0,
            min: 0,
            cnt: self.xfers,
        });
        true
    }

    /// Moves the newest callers of `module` on the stack (at most
    /// [`CHAIN_FRAMES`]) onto `s.frames`, oldest first: a chain may
    /// return to them.
    #[inline(always)]
    fn lend_frames(&mut self, module: ModuleIx, s: &mut Summaries) {
        let keep = self.stack.len().saturating_sub(CHAIN_FRAMES);
        while self.stack.len() > keep {
            match self.stack.last() {
                Some(Frame::Ret(c)) if c.module == module => {
                    s.frames.push(c.block.as_u32());
                    self.stack.pop();
                }
                _ => break,
            }
        }
        s.frames.reverse();
    }

    /// Moves what is left on `s.frames` back onto the stack.
    #[inline(always)]
    fn take_frames(&mut self, module: ModuleIx, s: &mut Summaries) {
        self.stack.extend(s.frames.drain(..).map(|c| {
            Frame::Ret(Loc {
                module,
                block: BlockIx::new(c as usize),
            })
        }));
    }

    /// Counting at read point `l`: passes the chain of summarised
    /// segments [`Summaries::count_run`] finds there (stopping before
    /// `pause_at`), as many `skip_segment`s would. False when it passed
    /// none.
    #[inline(always)]
    fn count_run(&mut self, l: Loc, c: &mut Counts, segs: &mut [Summaries], pause_at: u64) -> bool {
        let max = pause_at.saturating_sub(self.stream.offset());
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        let m = self.module(l);
        let s = &mut segs[l.module.index()];
        self.lend_frames(l.module, s);
        let entries = &mut self.entries[l.module.index()];
        let skip = self.stream.skips_values();
        let run = s.count_run(m, l.block, self.stream.buffered(), max, skip, entries);
        self.take_frames(l.module, s);
        if run.blocks == 0 {
            return false;
        }
        self.stream.advance(run.witnesses);
        self.consumed(None);
        self.xfers = self.xfers.wrapping_add(run.xfers);
        let t = &mut c.totals[l.module.index()];
        t.0 += run.insns;
        t.1 += run.blocks;
        self.cur = Some(Loc {
            module: l.module,
            block: BlockIx::new(run.end as usize),
        });
        true
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

/// Whether the item after the next one (a witness) is a one-byte witness
/// too, past VALUE records where the stream skips them: a summarised
/// segment is taken only then (a SIGNAL there would need its blocks).
#[inline]
fn second_is_witness(s: &Stream) -> bool {
    s.peek_second_is_witness() || s.second_is_witness_past_values()
}
