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
//! Signals (docs/regen.md section 3a): the handler's runs follow a
//! [`Event::Signal`] where the machine cut the interrupted code, and the
//! interrupted code's runs resume after the [`Event::SigReturn`] naming
//! the same SIGNAL record. In the events' order handlers nest: a return
//! is the innermost running handler's, but for handlers above it that
//! never returned (`siglongjmp`: no event says so). A consumer that
//! follows only instructions ignores both (the output is `--format
//! insn`'s); one that keeps per-thread state (the data walk) saves it at
//! the first and restores it at the second, as `rt_sigreturn` does.
//!
//! Invariant: a run's `first..end` is a non-empty range of its block's
//! instructions; whole blocks (`first == 0`, `end == ninsns`) are the
//! common case.

use crate::compile::{BlockIx, Module};
use crate::error::{Error, Result};
use crate::output::{prepare, Ctx, Format, Options, Prepared, AHEAD_BYTES};
use aetrace_format::{ThreadId, Trace};

/// Thread-start records carry this module number.
const THREAD: u32 = u32::MAX;
/// Signal-delivery records carry this module number.
const SIGNAL: u32 = u32::MAX - 1;
/// Handler-return records carry this module number.
const SIGRETURN: u32 = u32::MAX - 2;
/// Bytes per record.
const RECORD: usize = 16;

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
    /// events come in the order of the records). `raised`: the signal
    /// was a fault raised by the instruction the runs before end with
    /// (listed once before the handler, and again if it returns).
    Signal {
        /// The signal number.
        signo: u32,
        /// The SIGNAL record's stream offset.
        offset: u64,
        /// A fault raised by the last instruction before it.
        raised: bool,
    },
    /// The handler entered by the SIGNAL record at stream offset
    /// `offset` returned (`rt_sigreturn`): the code it interrupted resumes.
    SigReturn {
        /// Its SIGNAL record's stream offset.
        offset: u64,
    },
}

/// The record announcing a thread.
pub(crate) fn thread_record(t: ThreadId) -> Vec<u8> {
    [THREAD, t.0, 0, 0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

/// The record of a handler's entry ([`Event::Signal`]).
/// (The signal number, below 2^31, shares its word with `raised`.)
pub(crate) fn signal_record(signo: u32, offset: u64, raised: bool, out: &mut Vec<u8>) {
    let word = signo | u32::from(raised) << 31;
    for v in [SIGNAL, word, offset as u32, (offset >> 32) as u32] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// The record of a handler's return ([`Event::SigReturn`]).
pub(crate) fn sigreturn_record(offset: u64, out: &mut Vec<u8>) {
    for v in [SIGRETURN, offset as u32, (offset >> 32) as u32, 0] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn decode(r: &[u8]) -> Event {
    let w = |k: usize| u32::from_le_bytes(r[4 * k..4 * k + 4].try_into().expect("4 bytes"));
    match w(0) {
        THREAD => Event::Thread(ThreadId(w(1))),
        SIGNAL => Event::Signal {
            signo: w(1) & !(1 << 31),
            offset: u64::from(w(2)) | u64::from(w(3)) << 32,
            raised: w(1) >> 31 != 0,
        },
        SIGRETURN => Event::SigReturn {
            offset: u64::from(w(1)) | u64::from(w(2)) << 32,
        },
        module => Event::Run(BlockRun {
            module,
            block: BlockIx::from_u32(w(1)),
            first: w(2),
            end: w(3),
        }),
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
}

impl<'t, B: AsRef<[u8]> + Sync> Visit<'t, B> {
    /// Prepares `trace` with `opts`' thread, module and jobs choices (its
    /// format and `count` are ignored).
    pub fn new(trace: &'t Trace<B>, opts: &Options) -> Result<Self> {
        let opts = Options {
            format: Format::Runs,
            count: false,
            ..opts.clone()
        };
        let prepared = prepare(trace, &opts)?;
        Ok(Visit {
            trace,
            opts,
            prepared,
        })
    }

    /// The compiled modules [`BlockRun::module`] indexes.
    pub fn modules(&self) -> &[Module] {
        &self.prepared.0
    }

    /// Regenerates, handing the events to `give` in batches (it may take
    /// the batch, leaving another [`Runs`] to fill in its place);
    /// `give` returning false stops the walk early with `Ok`. On a
    /// regeneration error, everything before it was given.
    pub fn run(&self, give: &mut dyn FnMut(&mut Runs) -> bool) -> Result<()> {
        let ctx = Ctx::new(self.trace, &self.prepared, &self.opts, AHEAD_BYTES)?;
        // A record cut between two batches (not expected: batches end at
        // block boundaries, but the stream is a concatenation either way).
        let mut carry: Vec<u8> = Vec::new();
        let r = ctx.deliver(&mut |b| {
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
        });
        match r {
            Err(Error::Output(e)) if e.get_ref().is_some_and(|i| i.is::<Stopped>()) => Ok(()),
            r => r,
        }
    }
}

/// A batch of events, decoded as they are read.
#[derive(Debug, Default)]
pub struct Runs {
    bytes: Vec<u8>,
}

impl Runs {
    /// The events, in order.
    pub fn events(&self) -> impl Iterator<Item = Event> + '_ {
        self.bytes.chunks_exact(RECORD).map(decode)
    }
}
