//! The regenerated trace for a consumer in the same process (`aetrace
//! cachesim TRACE`): the executed blocks as [`Event`]s, per thread and in
//! order, instead of formatted text. A consumer looks the blocks' code up
//! in [`Visit::modules`] (each block's address and instruction lengths)
//! once, then sees a block run as four numbers.
//!
//! The walk is the one every output format uses (`output`, with the
//! internal [`Format::Runs`]: one 16-byte record per executed block, or per
//! part of a block where a signal cut it, and one per thread start), so
//! the events are exactly the blocks `--format insn` would print, in the
//! same order, for any number of jobs.
//!
//! With [`Visit::with_segments`] ([`Format::RunSegments`]), a summarised
//! segment (`summary`: the blocks one witness passes, which always run
//! together) comes as one [`Segment`] record instead of one record per
//! block, up to its trail (the blocks a later record could still cut,
//! given block by block as before): a consumer that precomputes what a
//! segment's blocks do (`aetrace cachesim`: the cache lines they fetch)
//! then takes one step per witness.
//!
//! Signals (docs/regen.md section 3a): the handler's runs follow a
//! [`Event::Signal`] where the machine cut the interrupted code, and the
//! interrupted code's runs resume after the [`Event::SigReturn`] naming
//! the same SIGNAL record. In the events' order handlers nest: a return
//! is the innermost running handler's, but for handlers above it that
//! never returned (`siglongjmp`: no event says so). A consumer that
//! follows only instructions ignores both (the output is `--format
//! insn`'s); one that keeps per-thread state (the data walk) saves it at
//! the first and restores it at the second, as `rt_sigreturn` does. Segment
//! records ([`Visit::with_segments`]) stand among them in the same order.
//!
//! A fault raised by an instruction (SIGSEGV, SIGBUS, SIGFPE, SIGILL) is
//! a run of that instruction alone, marked [`BlockRun::faults`]: it did
//! nothing (the kernel stopped it before any effect). Its handler
//! follows, and it runs again if the handler returns; or, with no
//! handler (a crash), the thread ends there.
//!
//! Invariant: a run's `first..end` is a non-empty range of its block's
//! instructions; whole blocks (`first == 0`, `end == ninsns`) are the
//! common case. A segment's blocks run whole, in the order of
//! [`Segment::blocks`].

use crate::compile::{BlockIx, Module};
use crate::error::{Error, Result};
use crate::index::{Entry, StateIndex};
pub use crate::ordered::{Task, Tasks};
pub use crate::output::PieceKeep;
use crate::output::{prepare, Ctx, Format, Options, Prepared, AHEAD_BYTES};
use crate::stream::Chunks;
use crate::DataCursor;
use aetrace_format::{ThreadId, Trace};

/// Thread-start records carry this module number.
const THREAD: u32 = u32::MAX;
/// Segment records carry their module number with this bit.
pub(crate) const SEGMENT: u32 = 1 << 31;
/// The run record of an instruction that raised a fault carries its
/// module number with this bit ([`BlockRun::faults`]).
pub(crate) const FAULTS: u32 = 1 << 30;
/// Signal-delivery records carry this module number (checked before
/// [`SEGMENT`], whose bit it has; no module has such a number).
const SIGNAL: u32 = u32::MAX - 1;
/// Handler-return records carry this module number.
const SIGRETURN: u32 = u32::MAX - 2;
/// Records of a pause where a state index keeps a state carry this
/// module number ([`Visit::run_indexing`]).
const PAUSE: u32 = u32::MAX - 3;
/// Bytes per record.
pub(crate) const RECORD: usize = 16;

/// Instructions `first..end` of one executed block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRun {
    /// The block's module: an index into [`Visit::modules`].
    pub module: u32,
    /// The block in that module.
    pub block: BlockIx,
    /// The first instruction run.
    pub first: u32,
    /// One past the last instruction run.
    pub end: u32,
    /// The run is one instruction that raised a fault: the next event is
    /// its handler's [`Event::Signal`], or the thread ends (a crash). The
    /// instruction had no effect (its references did not happen).
    pub faults: bool,
}

/// What the regeneration hands a consumer, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The runs that follow belong to this thread.
    Thread(ThreadId),
    /// Instructions of a block ran.
    Run(BlockRun),
    /// A traced handler of `signo` was entered where the runs before
    /// stop: the thread's SIGNAL record at stream offset `offset` (the
    /// events come in the order of the records). A fault's instruction is
    /// the run before, marked [`BlockRun::faults`].
    Signal {
        /// The signal number.
        signo: u32,
        /// The SIGNAL record's stream offset.
        offset: u64,
    },
    /// The handler entered by the SIGNAL record at stream offset
    /// `offset` returned (`rt_sigreturn`): the code it interrupted resumes.
    SigReturn {
        /// Its SIGNAL record's stream offset.
        offset: u64,
        /// The handler moved the rip (SIGRETURN's differs from SIGNAL's):
        /// the interrupted instruction does not run again.
        moved: bool,
    },
    /// The walk kept the thread's state for a state index here, the
    /// entry of stream offset `offset` ([`Visit::run_indexing`] only).
    Pause {
        /// The entry's stream offset.
        offset: u64,
    },
}

/// Whole blocks of one summarised segment ran ([`Visit::with_segments`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The blocks' module: an index into [`Visit::modules`].
    pub module: u32,
    /// The segment's read point, its first block.
    pub read: BlockIx,
    /// The witness read there.
    pub witness: u32,
    /// How many of the segment's blocks ran (at least two).
    pub blocks: u32,
    /// The segment's number in its module, below
    /// [`Segment::numbers`]: one number, one `(read, witness)`, so one
    /// list of blocks.
    pub number: u32,
}

impl Segment {
    /// The blocks that ran, in order.
    pub fn blocks(&self, m: &Module) -> Vec<BlockIx> {
        crate::summary::segment_blocks(m, self.read, self.witness, self.blocks)
    }

    /// The numbers segments of module `m` may have are below this.
    pub fn numbers(m: &Module) -> usize {
        crate::summary::segment_numbers(m)
    }
}

/// What a [`Visit::with_segments`] hands out: an event or a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A thread start or a block run.
    Event(Event),
    /// The blocks of a segment.
    Segment(Segment),
}

/// The record announcing a thread.
pub(crate) fn thread_record(t: ThreadId) -> Vec<u8> {
    [THREAD, t.0, 0, 0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

/// The record of a handler's entry ([`Event::Signal`]).
pub(crate) fn signal_record(signo: u32, offset: u64, out: &mut Vec<u8>) {
    for v in [SIGNAL, signo, offset as u32, (offset >> 32) as u32] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// The record of a handler's return ([`Event::SigReturn`]).
pub(crate) fn sigreturn_record(offset: u64, moved: bool, out: &mut Vec<u8>) {
    for v in [
        SIGRETURN,
        offset as u32,
        (offset >> 32) as u32,
        moved.into(),
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// The record of a pause kept for a state index ([`Event::Pause`]).
pub(crate) fn pause_record(offset: u64, out: &mut Vec<u8>) {
    for v in [PAUSE, offset as u32, (offset >> 32) as u32, 0] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Inlined, so that a consumer's match on the step is fused with it (no
/// step built and read back per record: 8 % of `aetrace cachesim`'s
/// samples on bzip2's trace when it was a call; always, since the data
/// walk's look ahead over a segment's chain left it a call).
#[inline(always)]
fn decode(r: &[u8]) -> Step {
    let w = |k: usize| u32::from_le_bytes(r[4 * k..4 * k + 4].try_into().expect("4 bytes"));
    match w(0) {
        THREAD => Step::Event(Event::Thread(ThreadId(w(1)))),
        SIGNAL => Step::Event(Event::Signal {
            signo: w(1),
            offset: u64::from(w(2)) | u64::from(w(3)) << 32,
        }),
        PAUSE => Step::Event(Event::Pause {
            offset: u64::from(w(1)) | u64::from(w(2)) << 32,
        }),
        SIGRETURN => Step::Event(Event::SigReturn {
            offset: u64::from(w(1)) | u64::from(w(2)) << 32,
            moved: w(3) != 0,
        }),
        module if module & SEGMENT != 0 => Step::Segment(Segment {
            module: module & !SEGMENT,
            read: BlockIx::from_u32(w(1)),
            number: w(2),
            witness: w(3) >> 16,
            blocks: w(3) & 0xFFFF,
        }),
        module => Step::Event(Event::Run(BlockRun {
            module: module & !FAULTS,
            block: BlockIx::from_u32(w(1)),
            first: w(2),
            end: w(3),
            faults: module & FAULTS != 0,
        })),
    }
}

/// The consumer asked to stop (its own reason is its own business).
#[derive(Debug)]
struct Stopped;

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the consumer stopped")
    }
}

impl std::error::Error for Stopped {}

/// A trace prepared for visiting: its threads chosen and modules compiled.
pub struct Visit<'t, B> {
    trace: &'t aetrace_format::Trace<B>,
    opts: Options,
    prepared: Prepared<'t>,
    /// The decompressed chunks its walk shares ([`Visit::sharing_values`]).
    chunks: std::sync::Arc<Chunks>,
}

impl<'t, B: AsRef<[u8]> + Sync> Visit<'t, B> {
    /// Prepares `trace` with `opts`' thread, module and jobs choices (its
    /// format and `count` are ignored).
    pub fn new(trace: &'t Trace<B>, opts: &Options) -> Result<Self> {
        Self::prepare(trace, opts, Format::Runs)
    }

    /// The same, handing out segments as [`Step::Segment`]s
    /// ([`Runs::steps`]).
    pub fn with_segments(trace: &'t Trace<B>, opts: &Options) -> Result<Self> {
        Self::prepare(trace, opts, Format::RunSegments)
    }

    fn prepare(trace: &'t Trace<B>, opts: &Options, format: Format) -> Result<Self> {
        let opts = Options {
            format,
            count: false,
            ..opts.clone()
        };
        let prepared = prepare(trace, &opts)?;
        Ok(Visit {
            trace,
            opts,
            prepared,
            chunks: Default::default(),
        })
    }

    /// The same, its walk sharing each decompressed chunk with the
    /// [`Visit::values`] cursors, so that a chunk read by both is
    /// decompressed and decoded once.
    pub fn sharing_values(mut self) -> Self {
        self.chunks = std::sync::Arc::new(Chunks::from_start());
        self
    }

    /// The data values of `thread` ([`DataCursor::new`]), read through the
    /// walk's chunks.
    pub fn values(&self, thread: aetrace_format::ThreadId) -> Result<DataCursor<'_>> {
        DataCursor::sharing(self.trace, thread, Some(&self.chunks))
    }

    /// The compiled modules [`BlockRun::module`] indexes.
    pub fn modules(&self) -> &[Module] {
        &self.prepared.0
    }

    /// A cursor of `thread`'s data values where `mark` says
    /// ([`DataCursor::mark`]), reading through the walk's chunks.
    pub fn values_at(
        &self,
        thread: aetrace_format::ThreadId,
        mark: &crate::ValueMark,
    ) -> Result<DataCursor<'_>> {
        let chunks = self.trace.chunks(thread).collect();
        let stream = crate::stream::Stream::new(thread, chunks).sharing(&self.chunks);
        DataCursor::at_mark(stream, mark)
    }

    /// Regenerates, handing the events to `give` in batches (it may take
    /// the batch, leaving another [`Runs`] to fill in its place);
    /// `give` returning false stops the walk early with `Ok`. On a
    /// regeneration error, everything before it was given.
    pub fn run(&self, give: &mut dyn FnMut(&mut Runs) -> bool) -> Result<()> {
        self.run_indexing(0, give).map(|_| ())
    }

    /// [`Visit::run`], keeping (`interval` > 0) the states of a state
    /// index every `interval` stream bytes, each marked by an
    /// [`Event::Pause`] where it was kept: the index, when every thread
    /// was walked whole (as [`crate::regen_trace_indexing`]).
    pub fn run_indexing(
        &self,
        interval: u64,
        give: &mut dyn FnMut(&mut Runs) -> bool,
    ) -> Result<Option<StateIndex>> {
        let mut ctx = Ctx::new(self.trace, &self.prepared, &self.opts, AHEAD_BYTES)?;
        ctx.chunks = self.chunks.clone();
        ctx.keep_states(interval);
        let mut deliver = whole_records(give);
        stopped_ok(ctx.deliver(&mut |b| deliver(b)))?;
        Ok(ctx.take_index())
    }

    /// The trace's pieces between the entries of the state index of its
    /// options, to be regenerated in any order ([`Pieces::run`]).
    pub fn pieces(&self) -> Result<Pieces<'_, B>> {
        let mut ctx = Ctx::new(self.trace, &self.prepared, &self.opts, AHEAD_BYTES)?;
        ctx.chunks = self.chunks.clone();
        Ok(Pieces { ctx })
    }
}

/// A stop asked by the consumer is no error.
fn stopped_ok(r: Result<()>) -> Result<()> {
    match r {
        Err(Error::Output(e)) if e.get_ref().is_some_and(|i| i.is::<Stopped>()) => Ok(()),
        r => r,
    }
}

/// The batches of a walk as whole records for `give`.
fn whole_records<'g>(
    give: &'g mut dyn FnMut(&mut Runs) -> bool,
) -> impl FnMut(&mut Vec<u8>) -> std::io::Result<()> + 'g {
    // A record cut between two batches (not expected: batches end at
    // block boundaries, but the stream is a concatenation either way).
    let mut carry: Vec<u8> = Vec::new();
    move |b| {
        if !carry.is_empty() {
            b.splice(0..0, carry.drain(..));
        }
        let whole = b.len() / RECORD * RECORD;
        carry.extend_from_slice(&b[whole..]);
        b.truncate(whole);
        let mut runs = Runs {
            bytes: std::mem::take(b),
        };
        let go = give(&mut runs);
        // What `give` left: the batch, or a buffer for the next one.
        *b = runs.bytes;
        b.clear();
        if go {
            Ok(())
        } else {
            Err(std::io::Error::other(Stopped))
        }
    }
}

/// One piece of a thread's stream between two entries of a state index
/// ([`Visit::pieces`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Its thread.
    pub thread: ThreadId,
    /// Its first entry (`None`: the stream's start, with a
    /// [`Event::Thread`] first).
    pub from: Option<usize>,
    /// The entry where it pauses (`None`: the stream's end).
    pub to: Option<usize>,
    job: usize,
}

/// A trace's pieces between state index entries, for workers that
/// regenerate them (`regen --data -j N`: [`Pieces::write_in_order`]): a
/// piece started from an entry gives the events after that entry's pause
/// up to the next one's, and checks that the machine pauses there in the
/// entry's state.
pub struct Pieces<'v, B> {
    ctx: Ctx<'v, B>,
}

impl<B: AsRef<[u8]> + Sync> Pieces<'_, B> {
    /// The pieces, per thread in order, cut at the index entries `cut`
    /// accepts.
    pub fn spans(&self, cut: &dyn Fn(&Entry) -> bool) -> Vec<Span> {
        let threads = self.ctx.job_threads();
        (self.ctx.piece_spans(cut).into_iter())
            .map(|(job, from, to)| Span {
                thread: threads[job],
                from,
                to,
                job,
            })
            .collect()
    }

    /// Regenerates piece `span`, handing its events to `give` in batches
    /// as [`Visit::run`] does; `keep` carries a worker's buffers from
    /// one piece to its next.
    pub fn run(
        &self,
        span: Span,
        keep: &mut PieceKeep,
        give: &mut dyn FnMut(&mut Runs) -> bool,
    ) -> Result<()> {
        let mut deliver = whole_records(give);
        stopped_ok((self.ctx).produce_span((span.job, span.from, span.to), &mut deliver, keep))
    }

    /// Runs `workers` workers, each `work`: it takes piece after piece of
    /// `spans` ([`Tasks::next`]), regenerates it ([`Pieces::run`]) into
    /// output batches it gives its [`Task`], and ends the task with the
    /// piece's result. The output goes to `give` in the order of `spans`,
    /// through the writer of `regen -j N` into a pipe (one writer,
    /// bounded lookahead; `docs/regen.md` section 4, "Writing"); the
    /// first piece's error, or `give`'s, is the result, with nothing of a
    /// later piece given.
    pub fn write_in_order(
        &self,
        spans: &[Span],
        workers: usize,
        work: impl Fn(&Tasks<'_, Span>) + Sync,
        give: &mut dyn FnMut(&mut Vec<u8>) -> std::io::Result<()>,
    ) -> Result<()> {
        let cut = |put: &mut dyn FnMut(Span) -> bool| {
            for &s in spans {
                if !put(s) {
                    return;
                }
            }
        };
        let ahead = self.ctx.ahead_batches(workers);
        crate::ordered::in_order(workers, ahead, &self.ctx.spare, cut, work, give)
    }
}

/// A batch of events, decoded as they are read.
#[derive(Debug, Default)]
pub struct Runs {
    bytes: Vec<u8>,
}

impl Runs {
    /// The events, in order (of a [`Visit::new`]).
    pub fn events(&self) -> impl Iterator<Item = Event> + '_ {
        self.steps().map(|s| match s {
            Step::Event(e) => e,
            Step::Segment(_) => unreachable!("segments only from Visit::with_segments"),
        })
    }

    /// The events and segments, in order.
    #[inline]
    pub fn steps(&self) -> Steps<'_> {
        Steps { rest: &self.bytes }
    }
}

/// The steps of a batch ([`Runs::steps`]), and its records not read yet,
/// for a consumer that looks ahead: equal records are equal steps, so
/// steps seen before are found again by comparing bytes.
#[derive(Clone, Debug)]
pub struct Steps<'a> {
    rest: &'a [u8],
}

impl<'a> Steps<'a> {
    /// The records not read yet.
    #[inline]
    pub fn ahead(&self) -> &'a [u8] {
        self.rest
    }

    /// Passes the first `n` bytes of [`Steps::ahead`], whole records.
    #[inline]
    pub fn pass(&mut self, n: usize) {
        debug_assert_eq!(n % RECORD, 0, "whole records");
        self.rest = &self.rest[n..];
    }
}

impl Iterator for Steps<'_> {
    type Item = Step;

    #[inline(always)]
    fn next(&mut self) -> Option<Step> {
        let (r, rest) = self.rest.split_first_chunk::<RECORD>()?;
        self.rest = rest;
        Some(decode(r))
    }
}
