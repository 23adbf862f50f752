//! Reading one thread's witness stream (`docs/runtime.md` section 2) as
//! items: witnesses and escape records.
//!
//! The stream is the concatenation of the thread's chunks, decompressed one
//! at a time (a record may straddle two chunks); a stream read from its
//! start decompresses the chunk after the buffered ones on a helper thread
//! while the walk reads ([`Ahead`]), and takes its bytes, or its error,
//! only when the walk needs them. Invariants: nothing here
//! panics on any byte sequence; every item knows its stream byte offset; a
//! byte 0x00, a record kind this table does not know or a record cut by the
//! end of the stream is a typed error, never skipped.

use crate::error::{Error, Result};
use aetrace_format::{Chunk, ThreadId};
use std::sync::Arc;

/// Byte that starts an escape record.
pub const ESCAPE: u8 = 0xFF;

/// Whether `b` is a one-byte witness, witness `b - 1`: 0x00 is reserved
/// (never written) and [`ESCAPE`] starts a record.
#[inline(always)]
pub(crate) fn is_byte_witness(b: u8) -> bool {
    b.wrapping_sub(1) < 0xFE
}

/// Record kinds (`docs/runtime.md` section 2) and their total lengths,
/// escape byte and kind byte included.
pub mod kind {
    /// ENTER: an indirectly called (or main) procedure announces itself.
    pub const ENTER: u8 = 1;
    /// INDIRECT: the target of an indirect transfer.
    pub const INDIRECT: u8 = 2;
    /// SIGNAL without the transfer count (format 1.1).
    pub const SIGNAL_1_1: u8 = 3;
    /// SETJMP_RESUME: a setjmp-like call returned again (format 1.10).
    pub const SETJMP_RESUME: u8 = 4;
    /// DESYNC: control escaped to uninstrumented code (e.g. a traced `clone` system call) at this address.
    pub const DESYNC: u8 = 5;
    /// EXIT: an `exit`-like call with this status.
    pub const EXIT: u8 = 6;
    /// FORK: the first record of a fork child's stream (the parent's slot).
    pub const FORK: u8 = 7;
    /// THREAD: the first record of every other stream (the creating slot).
    pub const THREAD: u8 = 8;
    /// WIDE: a 16-bit witness, in procedures with more than 254 witness edges.
    pub const WIDE: u8 = 9;
    /// RETURN: control came back from an external call, after any callbacks.
    pub const RETURN: u8 = 10;
    /// LANDING: the unwinder entered a landing pad of this procedure.
    pub const LANDING: u8 = 11;
    /// FORKED: in a fork's parent, the child's pid.
    pub const FORKED: u8 = 12;
    /// SETJMP: just before a call to `setjmp`, `rsp` (format 1.10; its
    /// jmp_buf before).
    pub const SETJMP: u8 = 13;
    /// LONGJMP: just before a call to `longjmp`, its jmp_buf (before
    /// format 1.10 only).
    pub const LONGJMP: u8 = 14;
    /// SIGNAL with the thread's transfer count (format 1.2).
    pub const SIGNAL: u8 = 15;
    /// A PLT stub's lazy-binding outcome (format 1.3).
    pub const LAZY: u8 = 16;
    /// FAULT: the runtime's handler of a signal that ends the process
    /// (SIGNAL's payload; format 1.5).
    pub const FAULT: u8 = 17;
    /// VALUE: a data value (`record --data`, format 1.4), read by
    /// [`super::Stream::values`] and invisible to the control walk.
    pub const VALUE: u8 = 18;
    /// ENTER_AT: a procedure entered at a secondary entry point, its
    /// link-time address (format 1.6).
    pub const ENTER_AT: u8 = 19;
    /// SIGRETURN: a traced handler returned; the rip the thread resumes
    /// at, mapped as SIGNAL's (format 1.11).
    pub const SIGRETURN: u8 = 20;
    /// ENTER_SAME: ENTER in a control-only trace whose entry's `rsp` is
    /// the thread's last recorded one, no VALUE after it (format 1.21):
    /// [`Item::Enter`] to the control walk, and [`super::Stream::next_data`]
    /// gives that `rsp` as the VALUE after it.
    pub const ENTER_SAME: u8 = 21;
    /// Set in a SIGNAL's or FAULT's signal number when the interrupted
    /// `rep` string instruction's `rcx`, `rsi` and `rdi` follow as three
    /// VALUEs (format 1.16; the runtime's `layout::SIGNAL_REP_REGISTERS`).
    pub const SIGNAL_REP_REGISTERS: u32 = 1 << 8;

    /// Total length of a record of `kind`, `None` for an unknown kind.
    pub fn len(kind: u8) -> Option<usize> {
        Some(match kind {
            ENTER | ENTER_SAME | EXIT | FORK | THREAD | LANDING | FORKED | LAZY => 6,
            INDIRECT | DESYNC | SETJMP | LONGJMP | VALUE | ENTER_AT | SIGRETURN => 10,
            SIGNAL_1_1 => 14,
            SIGNAL | FAULT | SETJMP_RESUME => 18,
            RETURN => 2,
            WIDE => 4,
            _ => return None,
        })
    }
}

/// One item of a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item {
    /// Witness number `n` of the current procedure (a byte `n + 1`, or WIDE).
    Witness(u32),
    /// ENTER: procedure `tag << 24 | procedure` starts (main, or an indirect callee).
    Enter(u32),
    /// ENTER_AT: procedure `tag << 24 | procedure` starts at the secondary
    /// entry point with this link-time address.
    EnterAt(u32, u32),
    /// INDIRECT: an indirect transfer to this run-time address.
    Indirect(u64),
    /// `count`: the thread's transfer count at the interruption (`None`
    /// in a format 1.1 trace, which did not record it). A FAULT record is
    /// a SIGNAL with `fault` set: placed the same way, it ends the thread.
    Signal {
        /// The signal number.
        signo: u32,
        /// The interrupted instruction's run-time address (after the runtime's fix-up).
        rip: u64,
        /// The thread's transfer count at the interruption.
        count: Option<u32>,
        /// A FAULT record: the signal ended the process there.
        fault: bool,
        /// The interrupted `rep` string instruction's `rcx`, `rsi` and
        /// `rdi` follow as three VALUEs ([`kind::SIGNAL_REP_REGISTERS`]).
        rep: bool,
    },
    /// SETJMP_RESUME: the setjmp-like call of block `block` of procedure
    /// `tag << 24 | proc` returned again, with `rsp` (its SETJMP's).
    SetjmpResume {
        /// `tag << 24 | procedure`.
        proc: u32,
        /// `rsp` at the return point.
        rsp: u64,
        /// The call block's index in the procedure.
        block: u32,
    },
    /// DESYNC: control escaped to uninstrumented code at this address.
    Desync(u64),
    /// EXIT: an `exit`-like call with this status.
    Exit(u32),
    /// FORK: a fork child's stream starts; the parent's slot.
    Fork(u32),
    /// THREAD: a thread's stream starts; the creating slot.
    Thread(u32),
    /// RETURN: control came back from an external call.
    Return,
    /// The unwinder entered a landing pad of this procedure.
    Landing(u32),
    /// In a fork's parent: the child with this pid continues from here.
    Forked(u32),
    /// Before a call to setjmp: `rsp` (format 1.10; its jmp_buf before).
    Setjmp(u64),
    /// Before a call to longjmp: its jmp_buf.
    Longjmp(u64),
    /// The PLT stub `tag << 24 | procedure` took its lazy-binding outcome.
    Lazy(u32),
    /// A data value ([`Stream::values`] only: the control walk skips them).
    Value(u64),
    /// SIGRETURN: the newest handler returned; the thread resumes at this
    /// rip (as SIGNAL's: run-time, in the copy).
    SigReturn(u64),
    /// The end of the stream.
    End,
}

impl Item {
    /// How messages name the item.
    pub fn describe(&self) -> String {
        match *self {
            Item::Witness(n) => format!("witness {n}"),
            Item::Enter(p) => format!("ENTER({p})"),
            Item::EnterAt(p, a) => format!("ENTER_AT({p}, {a:#x})"),
            Item::Indirect(t) => format!("INDIRECT({t:#x})"),
            Item::Signal {
                signo,
                rip,
                count: None,
                ..
            } => format!("SIGNAL({signo}, {rip:#x})"),
            Item::Signal {
                signo,
                rip,
                count: Some(n),
                fault,
                ..
            } => format!(
                "{}({signo}, {rip:#x}, transfer {n})",
                if fault { "FAULT" } else { "SIGNAL" }
            ),
            Item::SetjmpResume { proc, rsp, block } => {
                format!("SETJMP_RESUME({proc}, {rsp:#x}, block {block})")
            }
            Item::Desync(a) => format!("DESYNC({a:#x})"),
            Item::Exit(s) => format!("EXIT({s})"),
            Item::Fork(s) => format!("FORK({s})"),
            Item::Thread(s) => format!("THREAD({s})"),
            Item::Return => "RETURN".into(),
            Item::Landing(p) => format!("LANDING({p})"),
            Item::Forked(p) => format!("FORKED({p})"),
            Item::Setjmp(b) => format!("SETJMP({b:#x})"),
            Item::Longjmp(b) => format!("LONGJMP({b:#x})"),
            Item::Lazy(p) => format!("LAZY({p})"),
            Item::SigReturn(rip) => format!("SIGRETURN({rip:#x})"),
            Item::Value(v) => format!("VALUE({v:#x})"),
            Item::End => "the end of the stream".into(),
        }
    }
}

/// The bytes of the whole VALUE records of `buf` from `from`, all more
/// than [`TORN_TAIL`] bytes before its end, when a one-byte witness
/// follows them there (none: `Some(0)` when the witness is at `from`).
#[inline]
pub fn values_before_witness(buf: &[u8], from: usize) -> Option<usize> {
    let end = buf.len().saturating_sub(TORN_TAIL);
    let mut at = from;
    while at < end && buf[at] == ESCAPE {
        if buf[at + 1] != kind::VALUE || at + VALUE_LEN >= end {
            return None;
        }
        at += VALUE_LEN;
    }
    (at < end && is_byte_witness(buf[at])).then_some(at - from)
}

/// How many bytes a killed thread may leave reserved and unwritten at
/// its stream's end: its last reservation, and one of a handler nested
/// in it (records are at most 18 bytes).
const TORN_TAIL: usize = 40;

/// A VALUE record's bytes: escape, kind, the 8-byte value.
const VALUE_LEN: usize = 10;

/// A thread's stream, read front to back.
#[derive(Clone)]
pub struct Stream<'t> {
    thread: ThreadId,
    /// The thread's process was killed: bytes it reserved and did not
    /// finish writing may end the stream (see [`Stream::torn_tail`]).
    pub(crate) killed: bool,
    chunks: std::vec::IntoIter<Chunk<'t>>,
    /// Bytes not consumed yet start at `buf[pos]`. Shared with the
    /// stream's clones until one changes it: a clone is a machine's
    /// snapshot, and the debugger's timeline keeps one per 131,072
    /// instructions (a copy of the chunk each cost a page-faulted MiB).
    buf: Arc<Vec<u8>>,
    pos: usize,
    /// Stream offset of `buf[0]`.
    base: u64,
    spare: Vec<u8>,
    /// The chunk after `buf`'s, taken from `chunks`, maybe decompressing.
    ahead: Option<Ahead<'t>>,
    /// Whether chunks are decompressed ahead: not in a stream that `seek`
    /// positioned (a piece of `-j`, which may stop in the next chunk and
    /// would decompress one for nothing).
    prefetch: bool,
    /// [`Item::Value`]s are items (else skipped).
    values: bool,
    /// Chunks shared with the other pieces of `-j N` (`None`: this
    /// stream decompresses its own).
    shared: Option<&'t Chunks>,
    /// The entries' `rsp` as [`Stream::next_data`] reads them.
    entries: EntryRsp,
}

/// The `rsp` an ENTER_SAME repeats (format 1.21), kept as the runtime
/// keeps its slot's `ENTRY_RSP` word: the last VALUE read; none at the
/// start of the stream and of a handler (SIGNAL), the interrupted code's
/// back at the handler's SIGRETURN. (A control-only trace's VALUEs are
/// its entries' `rsp`s; a data trace has no ENTER_SAME.)
#[derive(Clone, Debug, Default)]
struct EntryRsp {
    last: Option<u64>,
    /// The interrupted code's, one per handler not returned from.
    kept: Vec<Option<u64>>,
    /// ENTER_SAME records read.
    same: u64,
}

/// Decompressed chunks shared by the readers of one regeneration: the
/// pieces of `-j N` from a state index (a piece starts in the chunk the
/// piece before it ends in, and each of the two would decompress it:
/// pieces of 512 KiB of stream in chunks of about 1 MiB decompressed each
/// chunk 2.4 times on gzip's trace, 9 % of `-j 2`'s CPU time), and, for a
/// data walk ([`Chunks::from_start`]), its control walk and its value
/// cursor, which read every chunk of a thread from the start (each
/// decompressed and decoded every chunk: 12 % of the samples of `regen
/// --format bin --data`). The most recently claimed chunks stay, up to a
/// budget of decompressed bytes; readers in flight are close together in
/// the stream, so they find what they need, and one that does not
/// decompresses the chunk again (the same bytes).
/// Invariants: a chunk's bytes are keyed by (thread, seq), its identity in
/// the trace, and are exactly [`Chunk::decompress_into`]'s; a slot is
/// claimed by one reader, which fills it on a thread that waits for no
/// other reader (its own, at once, or a helper's), so a reader waiting
/// for a slot never waits for itself.
pub(crate) struct Chunks {
    /// Claimed chunks, oldest first, each with its raw length: counted
    /// from the claim, so a slot still being filled holds its place.
    kept: std::sync::Mutex<std::collections::VecDeque<(ChunkKey, usize, Slot)>>,
    /// Decompressed bytes kept at most (and the last chunk, whatever its size).
    budget: usize,
    /// Streams read from their start go through it too, decompressing
    /// ahead into its slots (else only streams positioned by `seek`).
    from_start: bool,
}

impl Default for Chunks {
    fn default() -> Self {
        Chunks::keeping(SHARED_BYTES)
    }
}

type ChunkKey = (ThreadId, u64);

/// A chunk's bytes once its claimer has them (`None`: it failed; a reader
/// then decompresses the chunk itself, for the error).
type Slot = std::sync::Arc<SlotCell>;

/// A [`Slot`]'s state: set once, waited for (`OnceLock::wait` is newer
/// than the workspace's MSRV).
#[derive(Default)]
pub(crate) struct SlotCell {
    bytes: std::sync::Mutex<Option<Option<std::sync::Arc<Vec<u8>>>>>,
    filled: std::sync::Condvar,
}

impl SlotCell {
    /// Fills the slot unless it is filled already.
    fn set(&self, bytes: Option<std::sync::Arc<Vec<u8>>>) {
        if let Ok(mut b) = self.bytes.lock() {
            b.get_or_insert(bytes);
        }
        self.filled.notify_all();
    }

    /// The bytes once filled (`None`: failed, or a lock poisoned).
    fn wait(&self) -> Option<std::sync::Arc<Vec<u8>>> {
        let mut b = self.bytes.lock().ok()?;
        loop {
            if let Some(bytes) = &*b {
                return bytes.clone();
            }
            b = self.filled.wait(b).ok()?;
        }
    }
}

/// Decompressed bytes [`Chunks`] keeps: a few chunks of the recorder's
/// size (about 1 MiB, `CHUNK_BYTES`), for the two pieces per worker in
/// flight, or the control walk ahead of the value cursor (at most
/// `RUNS_AHEAD` batches of runs, a few chunks).
const SHARED_BYTES: usize = 16 << 20;

impl Chunks {
    /// Shared chunks keeping at most `budget` decompressed bytes.
    pub(crate) fn keeping(budget: usize) -> Self {
        Chunks {
            kept: Default::default(),
            budget,
            from_start: false,
        }
    }

    /// Chunks shared by readers of whole streams: a data walk's control
    /// walk and value cursor ([`crate::Visit::sharing_values`]).
    pub(crate) fn from_start() -> Self {
        Chunks {
            from_start: true,
            ..Chunks::default()
        }
    }

    /// `chunk`'s slot, and, when the caller claimed it (it must then fill
    /// it), a buffer to fill it in: an evicted chunk's when no reader holds
    /// it any more, its pages in already (a fresh buffer per chunk made a
    /// page fault per 4 KiB: 7 k of gzip's `block` at `-j 2`, docs/regen.md
    /// section 5).
    pub(crate) fn claim(&self, chunk: Chunk<'_>) -> (Slot, Option<Vec<u8>>) {
        let key = (chunk.meta.thread, chunk.meta.seq);
        let Ok(mut kept) = self.kept.lock() else {
            return (Default::default(), Some(Vec::new()));
        };
        if let Some((_, _, slot)) = kept.iter().find(|(k, _, _)| *k == key) {
            return (slot.clone(), None);
        }
        let slot = Slot::default();
        let raw = usize::try_from(chunk.meta.raw_len).unwrap_or(usize::MAX);
        kept.push_back((key, raw, slot.clone()));
        let mut held = kept
            .iter()
            .fold(0usize, |n, (_, r, _)| n.saturating_add(*r));
        let mut spare = None;
        while held > self.budget && kept.len() > 1 {
            if let Some((_, r, old)) = kept.pop_front() {
                held = held.saturating_sub(r);
                spare = spare.or_else(|| unshared(old));
            }
        }
        (slot, Some(spare.unwrap_or_default()))
    }

    /// `chunk`'s bytes, decompressed here unless a reader did it, or is
    /// doing it (then waited for).
    pub(crate) fn get(&self, chunk: Chunk<'_>) -> Result<std::sync::Arc<Vec<u8>>> {
        let (slot, mine) = self.claim(chunk);
        if let Some(out) = mine {
            fill(&slot, chunk, out);
        }
        taken(&slot, chunk)
    }
}

/// The bytes of an evicted `slot`, if nothing else holds them.
fn unshared(slot: Slot) -> Option<Vec<u8>> {
    let cell = Slot::try_unwrap(slot).ok()?;
    let bytes = cell.bytes.into_inner().ok()??;
    std::sync::Arc::try_unwrap(bytes?).ok()
}

/// Decompresses `chunk` into its claimed `slot`, in buffer `out`; the
/// slot is filled (as failed) even if this panics, so no reader waits for
/// ever.
fn fill(slot: &Slot, chunk: Chunk<'_>, mut out: Vec<u8>) {
    struct Failed<'s>(&'s Slot);
    impl Drop for Failed<'_> {
        fn drop(&mut self) {
            self.0.set(None);
        }
    }
    let _failed = Failed(slot);
    let bytes = chunk.decompress_into(&mut out).ok().map(|_| out.into());
    slot.set(bytes);
}

/// The bytes of `chunk`'s `slot` once filled, or the chunk's error.
fn taken(slot: &Slot, chunk: Chunk<'_>) -> Result<std::sync::Arc<Vec<u8>>> {
    match slot.wait() {
        Some(bytes) => Ok(bytes.clone()),
        None => {
            let mut out = Vec::new();
            chunk.decompress_into(&mut out)?;
            Ok(out.into())
        }
    }
}

/// Smallest chunk (decompressed bytes) worth a helper thread: spawning
/// one costs tens of microseconds, decompressing 64 KiB about as much.
const AHEAD_MIN: u64 = 64 << 10;

/// A chunk decompressing on a helper thread (issue 24 item 3: zstd was
/// 13 % of `--count`'s time on gzip's trace, all of it on the walk's
/// path), or in a slot of shared [`Chunks`] (by this stream's helper or
/// another reader). The helper owns copies of the chunk's stored bytes and
/// of its reference and returns the output buffer with the result.
struct Ahead<'t> {
    chunk: Chunk<'t>,
    job: Option<std::thread::JoinHandle<(Vec<u8>, aetrace_format::Result<()>)>>,
    slot: Option<Slot>,
}

impl Clone for Ahead<'_> {
    /// A clone decompresses the chunk itself when it needs it, or waits
    /// for the slot (filled by the original's helper, which runs on).
    fn clone(&self) -> Self {
        Ahead {
            chunk: self.chunk,
            job: None,
            slot: self.slot.clone(),
        }
    }
}

/// A helper thread running `f` on copies of `chunk`'s reference and
/// stored bytes; `None` when no thread is to be had.
fn helper<T: Send + 'static>(
    chunk: Chunk<'_>,
    f: impl FnOnce(Chunk<'_>) -> T + Send + 'static,
) -> Option<std::thread::JoinHandle<T>> {
    let (meta, data) = (chunk.meta.clone(), chunk.data.to_vec());
    std::thread::Builder::new()
        .name("aetrace-unzstd".into())
        .spawn(move || {
            f(Chunk {
                meta: &meta,
                data: &data,
            })
        })
        .ok()
}

impl<'t> Ahead<'t> {
    /// Starts decompressing `chunk` on a helper thread, into `spare`'s
    /// buffer (taken), or leaves it for the reader (a small chunk, or no
    /// thread to be had). With `shared` chunks, into the chunk's slot
    /// unless another reader claimed it.
    fn start(chunk: Chunk<'t>, spare: &mut Vec<u8>, shared: Option<&Chunks>) -> Self {
        if let Some(shared) = shared {
            return Ahead::share(chunk, shared);
        }
        let job = (chunk.meta.raw_len >= AHEAD_MIN).then(|| {
            let mut out = std::mem::take(spare);
            helper(chunk, move |c| {
                let r = c.decompress_into(&mut out);
                (out, r)
            })
        });
        Ahead {
            chunk,
            job: job.flatten(),
            slot: None,
        }
    }

    /// `chunk` through its slot of `shared`, filled by a helper if this
    /// reader claimed it (here at once when no helper is to be had: a
    /// slot waited for must be filled without this reader).
    fn share(chunk: Chunk<'t>, shared: &Chunks) -> Self {
        let (slot, mine) = shared.claim(chunk);
        if let Some(out) = mine {
            let s = slot.clone();
            let spawned = (chunk.meta.raw_len >= AHEAD_MIN)
                .then(|| helper(chunk, move |c| fill(&s, c, out)))
                .flatten();
            if spawned.is_none() {
                fill(&slot, chunk, Vec::new());
            }
        }
        Ahead {
            chunk,
            job: None,
            slot: Some(slot),
        }
    }

    /// The chunk's bytes in `out` (the helper's buffer when it ran).
    fn finish(self, out: &mut Vec<u8>) -> Result<()> {
        if let Some(slot) = &self.slot {
            let bytes = taken(slot, self.chunk)?;
            out.clear();
            out.extend_from_slice(&bytes);
            return Ok(());
        }
        match self.job.map(|j| j.join()) {
            Some(Ok((bytes, r))) => {
                *out = bytes;
                Ok(r?)
            }
            // No helper, or it panicked: decompress here.
            _ => Ok(self.chunk.decompress_into(out)?),
        }
    }
}

/// `chunk`'s bytes in `out`: from `shared` when given, else decompressed
/// here.
fn read_chunk(shared: Option<&Chunks>, chunk: Chunk<'_>, out: &mut Vec<u8>) -> Result<()> {
    match shared {
        Some(shared) => {
            let bytes = shared.get(chunk)?;
            out.clear();
            out.extend_from_slice(&bytes);
            Ok(())
        }
        None => Ok(chunk.decompress_into(out)?),
    }
}

/// The record of kind `k` (a known one) whose bytes after its kind are
/// `p`.
#[inline(always)]
fn record(k: u8, p: &[u8]) -> Item {
    match k {
        kind::ENTER | kind::ENTER_SAME => Item::Enter(le(p) as u32),
        kind::ENTER_AT => Item::EnterAt(le(&p[..4]) as u32, le(&p[4..]) as u32),
        kind::INDIRECT => Item::Indirect(le(p)),
        kind::SIGNAL_1_1 => Item::Signal {
            signo: le(&p[..4]) as u32,
            rip: le(&p[4..]),
            count: None,
            fault: false,
            rep: false,
        },
        kind::SIGNAL | kind::FAULT => {
            let signo = le(&p[..4]) as u32;
            Item::Signal {
                signo: signo & !kind::SIGNAL_REP_REGISTERS,
                rip: le(&p[4..12]),
                count: Some(le(&p[12..]) as u32),
                fault: k == kind::FAULT,
                rep: signo & kind::SIGNAL_REP_REGISTERS != 0,
            }
        }
        kind::SETJMP_RESUME => Item::SetjmpResume {
            proc: le(&p[..4]) as u32,
            rsp: le(&p[4..12]),
            block: le(&p[12..]) as u32,
        },
        kind::DESYNC => Item::Desync(le(p)),
        kind::EXIT => Item::Exit(le(p) as u32),
        kind::FORK => Item::Fork(le(p) as u32),
        kind::THREAD => Item::Thread(le(p) as u32),
        kind::WIDE => Item::Witness(le(p) as u32),
        kind::LANDING => Item::Landing(le(p) as u32),
        kind::FORKED => Item::Forked(le(p) as u32),
        kind::SETJMP => Item::Setjmp(le(p)),
        kind::LONGJMP => Item::Longjmp(le(p)),
        kind::LAZY => Item::Lazy(le(p) as u32),
        kind::VALUE => Item::Value(le(p)),
        kind::SIGRETURN => Item::SigReturn(le(p)),
        _ => Item::Return,
    }
}

fn le(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .rev()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
}

impl<'t> Stream<'t> {
    pub(crate) fn new(thread: ThreadId, chunks: Vec<Chunk<'t>>) -> Self {
        Stream {
            thread,
            killed: false,
            chunks: chunks.into_iter(),
            buf: Arc::default(),
            pos: 0,
            base: 0,
            spare: Vec::new(),
            ahead: None,
            prefetch: true,
            values: false,
            shared: None,
            entries: EntryRsp::default(),
        }
    }

    /// The same stream, its chunks read through `shared` when it is
    /// positioned by [`Stream::seek`] (a piece of `-j N`).
    pub(crate) fn sharing(mut self, shared: &'t Chunks) -> Self {
        self.shared = Some(shared);
        self
    }

    /// Decompresses each chunk when the walk needs it (through the shared
    /// chunks, if any), never ahead on a helper thread: for a piece of
    /// `-j N` from the stream's start, whose workers take the CPUs
    /// already (a helper would be a third runnable thread beside two
    /// workers) and whose next piece reads its last chunk too.
    pub(crate) fn on_demand(&mut self) {
        debug_assert!(self.ahead.is_none(), "set before the stream is read");
        self.prefetch = false;
    }

    /// Decompresses its chunks itself, into its own buffers, never
    /// through the shared chunks: for a `-j N` worker walking a region of
    /// consecutive pieces ([`crate::regions`]), which reads each chunk of
    /// its region once (only a chunk where two regions meet is
    /// decompressed by both), while a shared chunk costs a copy out of its
    /// slot and fresh pages for the slots (docs/regen.md section 5,
    /// "Fresh pages of `-j 2`").
    pub(crate) fn own_chunks(&mut self) {
        debug_assert!(
            self.buf.is_empty() && self.ahead.is_none(),
            "set before the stream is read"
        );
        self.shared = None;
    }

    /// Its two chunk buffers, emptied, for the next stream of the same
    /// reader ([`Stream::reusing`]).
    pub(crate) fn take_buffers(&mut self) -> (Vec<u8>, Vec<u8>) {
        let buf = Arc::try_unwrap(std::mem::take(&mut self.buf));
        let (mut buf, mut spare) = (buf.unwrap_or_default(), std::mem::take(&mut self.spare));
        self.pos = 0;
        buf.clear();
        spare.clear();
        (buf, spare)
    }

    /// Fills `buffers` (from [`Stream::take_buffers`]) instead of new ones
    /// if it has read nothing yet (a clone of a stream being read keeps
    /// its own): a worker's pieces of `-j N` then copy their chunks into
    /// memory already paged in and cached (fresh buffers cost a page
    /// fault per 4 KiB of every chunk a piece reads).
    pub(crate) fn reusing(&mut self, (buf, spare): (Vec<u8>, Vec<u8>)) {
        if self.buf.is_empty()
            && self.spare.is_empty()
            && self.offset() == 0
            && self.ahead.is_none()
        {
            (self.buf, self.spare) = (Arc::new(buf), spare);
        }
    }

    /// The shared chunks, for a stream positioned by [`Stream::seek`] (one
    /// read from its start decompresses ahead on its own).
    fn shared(&self) -> Option<&'t Chunks> {
        self.shared.filter(|c| !self.prefetch || c.from_start)
    }

    /// The next data item of the stream: a value ([`Item::Value`]) with,
    /// when an ENTER came right before it, that ENTER's procedure, or a
    /// SIGNAL or FAULT record (`at`: the values before it, counted by the
    /// caller); `None` at the end. An ENTER_SAME gives the `rsp` it
    /// repeats as the value after it ([`EntryRsp`]). Reads chunks as it
    /// goes, so a reader of values holds one chunk at a time.
    pub(crate) fn next_data(&mut self, at: usize) -> Result<Option<crate::DataItem>> {
        self.values = true;
        let mut enter = None;
        loop {
            while self.next_byte_witness().is_some() {
                enter = None;
            }
            let (item, offset, len) = self.peek()?;
            let same = matches!(item, Item::Enter(_)) && self.buf[self.pos + 1] == kind::ENTER_SAME;
            self.advance(len);
            match item {
                Item::Value(v) => {
                    self.entries.last = Some(v);
                    return Ok(Some(crate::DataItem::Value(v, enter)));
                }
                Item::Enter(raw) if same => {
                    let what = || "ENTER_SAME with no entry's rsp before it".to_string();
                    let v = (self.entries.last).ok_or_else(|| self.bad(offset, what()))?;
                    self.entries.same += 1;
                    return Ok(Some(crate::DataItem::Value(v, Some(raw))));
                }
                Item::Enter(raw) => {
                    enter = Some(raw);
                    continue;
                }
                Item::SigReturn(_) => {
                    self.entries.last = self.entries.kept.pop().flatten();
                }
                Item::End => return Ok(None),
                Item::Signal {
                    signo,
                    rip,
                    fault,
                    rep,
                    ..
                } => {
                    let last = self.entries.last.take();
                    self.entries.kept.push(last);
                    return Ok(Some(crate::DataItem::Signal(crate::SignalAt {
                        at,
                        signo,
                        fault,
                        offset,
                        enter,
                        rip,
                        rep,
                    })));
                }
                _ => {}
            }
            enter = None;
        }
    }

    /// Stream offset of the next unread byte.
    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Positions a fresh stream at `offset`: the chunks wholly before it
    /// are skipped unread and the one holding it is read. False when the
    /// stream has no byte there.
    pub(crate) fn seek(&mut self, offset: u64) -> Result<bool> {
        self.prefetch = false;
        while let Some(c) = self.chunks.as_slice().first() {
            if self.base + c.meta.raw_len > offset {
                break;
            }
            self.base += c.meta.raw_len;
            self.chunks.next();
        }
        let Some(chunk) = self.chunks.next() else {
            return Ok(false);
        };
        debug_assert!(self.buf.is_empty() && self.pos == 0);
        read_chunk(self.shared(), chunk, Arc::make_mut(&mut self.buf))?;
        self.pos = match usize::try_from(offset - self.base) {
            Ok(p) if p < self.buf.len() => p,
            _ => return Ok(false),
        };
        Ok(true)
    }

    /// Makes at least `need` unread bytes available if the stream has them;
    /// returns how many there are (fewer only at the end of the stream).
    fn fill(&mut self, need: usize) -> Result<usize> {
        while self.buf.len() - self.pos < need {
            match self.ahead.take() {
                Some(a) => a.finish(&mut self.spare)?,
                None => match self.chunks.next() {
                    Some(chunk) => read_chunk(self.shared(), chunk, &mut self.spare)?,
                    None => break,
                },
            }
            if self.pos == self.buf.len() {
                self.base += self.buf.len() as u64;
                let next = Arc::new(std::mem::take(&mut self.spare));
                // The old buffer is the next spare unless a clone holds it.
                let old = std::mem::replace(&mut self.buf, next);
                self.spare = Arc::try_unwrap(old).unwrap_or_default();
            } else {
                let buf = Arc::make_mut(&mut self.buf);
                buf.drain(..self.pos);
                self.base += self.pos as u64;
                buf.extend_from_slice(&self.spare);
            }
            self.pos = 0;
            if self.prefetch {
                // `spare` is free again: the helper fills it.
                let shared = self.shared();
                self.ahead = (self.chunks.next()).map(|c| Ahead::start(c, &mut self.spare, shared));
            }
        }
        Ok(self.buf.len() - self.pos)
    }

    fn bad(&self, offset: u64, what: String) -> Error {
        Error::BadStream {
            thread: self.thread,
            offset,
            what,
        }
    }

    /// The next item and its offset, without consuming it; `len` is its
    /// size. VALUE records are skipped unless [`Stream::values`] reads.
    pub fn peek(&mut self) -> Result<(Item, u64, usize)> {
        loop {
            if let Some(v) = self.buffered_value() {
                if self.values {
                    return Ok((Item::Value(v), self.offset(), VALUE_LEN));
                }
                self.advance(VALUE_LEN);
                continue;
            }
            match self.peek_any()? {
                (Item::Value(_), _, len) if !self.values => self.advance(len),
                r => return Ok(r),
            }
        }
    }

    /// The value of a VALUE record buffered more than [`TORN_TAIL`] bytes
    /// before the buffer's end, where [`Stream::peek_any`] would read the
    /// same without loading a chunk or seeing a torn tail (a data trace
    /// has one per recorded address: this is their hot path).
    #[inline(always)]
    fn buffered_value(&self) -> Option<u64> {
        let b = self.buf.get(self.pos..self.pos + TORN_TAIL + 1)?;
        (b[0] == ESCAPE && b[1] == kind::VALUE)
            .then(|| u64::from_le_bytes(b[2..VALUE_LEN].try_into().expect("8 bytes")))
    }

    /// The next item when [`TORN_TAIL`] bytes from its start on are
    /// buffered, where [`Stream::peek_any`] reads the same without loading
    /// a chunk or seeing a torn tail; `None` to let it decide (and report
    /// a bad byte). An indirect call's ENTER and RETURN are read here
    /// (xz's liblzma makes about a million of each per MB of input).
    #[inline(always)]
    fn buffered_item(&self) -> Option<(Item, usize)> {
        let b = self.buf.get(self.pos..self.pos + TORN_TAIL + 1)?;
        match b[0] {
            0 => None,
            ESCAPE => {
                let len = kind::len(b[1])?;
                Some((record(b[1], &b[2..len]), len))
            }
            w => Some((Item::Witness(u32::from(w) - 1), 1)),
        }
    }

    fn peek_any(&mut self) -> Result<(Item, u64, usize)> {
        let offset = self.offset();
        if let Some((item, len)) = self.buffered_item() {
            return Ok((item, offset, len));
        }
        if self.fill(2)? == 0 || self.torn_tail()? {
            return Ok((Item::End, offset, 0));
        }
        let first = self.buf[self.pos];
        match first {
            0 => {
                return Err(self.bad(
                    offset,
                    "byte 0x00 (reserved, never written by the runtime)".into(),
                ))
            }
            ESCAPE => {}
            w => return Ok((Item::Witness(u32::from(w) - 1), offset, 1)),
        }
        let Some(&k) = self.buf.get(self.pos + 1) else {
            return Err(Error::Truncated {
                thread: self.thread,
                offset: offset + 1,
                at: "inside a record (the stream stops after its escape byte)".into(),
                note: String::new(),
            });
        };
        let Some(len) = kind::len(k) else {
            let what = if k & 0x80 != 0 {
                format!("record kind {k:#04x} is still being written (bit 7 set)")
            } else {
                format!("unknown record kind {k}")
            };
            return Err(self.bad(offset, what));
        };
        let have = self.fill(len)?;
        if have < len {
            return Err(Error::Truncated {
                thread: self.thread,
                offset: offset + have as u64,
                at: format!("inside a record of kind {k} ({len} bytes, {have} present)"),
                note: String::new(),
            });
        }
        Ok((
            record(k, &self.buf[self.pos + 2..self.pos + len]),
            offset,
            len,
        ))
    }

    /// Whether the unread bytes are what a killed thread leaves of the
    /// item it was writing: a byte still 0 (reserved, not stored) or a
    /// record whose kind still has its pending bit or whose bytes stop
    /// short, all within [`TORN_TAIL`] bytes of the end of the stream.
    fn torn_tail(&mut self) -> Result<bool> {
        if !self.killed || self.fill(TORN_TAIL + 1)? > TORN_TAIL {
            return Ok(false);
        }
        let rest = &self.buf[self.pos..];
        Ok(match rest {
            [0, ..] | [ESCAPE] => true,
            [ESCAPE, k, ..] => k & 0x80 != 0 || kind::len(*k).is_some_and(|n| rest.len() < n),
            _ => false,
        })
    }

    /// Whether nothing is left to read (a torn tail of a killed thread
    /// counts as nothing).
    pub fn at_end(&mut self) -> bool {
        matches!(self.peek(), Ok((Item::End, _, _)))
    }

    /// Consumes `len` bytes of a peeked item.
    pub fn advance(&mut self, len: usize) {
        debug_assert!(self.pos + len <= self.buf.len());
        self.pos += len;
    }

    /// Appends to `out` the values of the VALUE records that come next,
    /// at most `max`, with nothing but one-byte witnesses before and
    /// between them, all buffered more than [`TORN_TAIL`] bytes before the
    /// buffer's end; how many. It stops before anything else (and leaves
    /// the witnesses before it unread), so [`Stream::next_data`] reads the
    /// rest the same: this is what the value cursor does per value, one
    /// scan of the buffer instead of a call per witness byte and per item.
    pub(crate) fn buffered_values(&mut self, max: usize, out: &mut Vec<u64>) -> usize {
        self.values = true;
        let (buf, end) = (&self.buf[..], self.buf.len().saturating_sub(TORN_TAIL));
        let (mut pos, mut n) = (self.pos, 0);
        while n < max {
            let mut at = pos;
            while at < end && is_byte_witness(buf[at]) {
                at += 1;
            }
            if at >= end || buf[at] != ESCAPE || buf[at + 1] != kind::VALUE {
                break;
            }
            let v = buf[at + 2..at + VALUE_LEN].try_into().expect("8 bytes");
            out.push(u64::from_le_bytes(v));
            (pos, n) = (at + VALUE_LEN, n + 1);
        }
        self.pos = pos;
        if n > 0 {
            self.entries.last = out.last().copied();
        }
        n
    }

    /// The `rsp` an ENTER_SAME would repeat, and those kept for the
    /// handlers running ([`crate::ValueMark`]).
    pub(crate) fn entry_rsp(&self) -> (Option<u64>, &[Option<u64>]) {
        (self.entries.last, &self.entries.kept)
    }

    /// Sets what [`Stream::entry_rsp`] gives, for a stream started mid-way.
    pub(crate) fn set_entry_rsp(&mut self, last: Option<u64>, kept: Vec<Option<u64>>) {
        (self.entries.last, self.entries.kept) = (last, kept);
    }

    /// The ENTER_SAME records [`Stream::next_data`] has read.
    pub(crate) fn entries_same(&self) -> u64 {
        self.entries.same
    }

    /// The next item if it is a one-byte witness already buffered (the hot
    /// path of Figure 7), consumed; `None` otherwise (nothing consumed).
    #[inline(always)]
    pub fn next_byte_witness(&mut self) -> Option<(u32, u64)> {
        let b = *self.buf.get(self.pos)?;
        if is_byte_witness(b) {
            let offset = self.offset();
            self.pos += 1;
            Some((u32::from(b) - 1, offset))
        } else {
            None
        }
    }

    /// Whether the next item is a one-byte witness, as [`Stream::peek`]
    /// would say without reading a chunk or seeing a torn tail (the test
    /// that spares call sites building an item).
    #[inline(always)]
    pub fn witness_next(&self) -> bool {
        self.buf.len() - self.pos > TORN_TAIL && self.peek_byte_witness().is_some()
    }

    /// The unread bytes already buffered (consume them with `advance`).
    #[inline(always)]
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// The next item if it is a one-byte witness, not consumed, reading
    /// the next chunk when nothing is buffered: whether a walk pauses must
    /// not depend on how many chunks it has read (a piece restored from
    /// the state index has read fewer or more than the walk that built it).
    pub fn peek_byte_witness_read(&mut self) -> Result<Option<u32>> {
        self.fill(1)?;
        Ok(self.peek_byte_witness())
    }

    /// The next item if it is a one-byte witness already buffered, not
    /// consumed.
    #[inline(always)]
    pub fn peek_byte_witness(&self) -> Option<u32> {
        let b = *self.buf.get(self.pos)?;
        is_byte_witness(b).then(|| u32::from(b) - 1)
    }

    /// Skips the VALUE records that come next when the item after them is
    /// a one-byte witness, and gives that witness (not consumed); `None`,
    /// nothing skipped, otherwise or when values are read. They are what
    /// [`Stream::peek`] skips anyway: a data trace's block writes its
    /// values before the witness of its exit, and the machine's summarised
    /// segments start only where a witness is next.
    #[inline]
    pub fn skip_values_to_witness(&mut self) -> Option<u32> {
        if self.values {
            return None;
        }
        self.pos += self.values_before_witness(self.pos)?;
        self.peek_byte_witness()
    }

    /// Whether the item after the next one (a witness) is, past VALUE
    /// records, a one-byte witness, all buffered ([`Stream::peek_second_is_witness`]
    /// for a stream whose values are skipped).
    #[inline]
    pub fn second_is_witness_past_values(&self) -> bool {
        !self.values && self.values_before_witness(self.pos + 1).is_some()
    }

    /// [`values_before_witness`] in the buffer.
    #[inline]
    fn values_before_witness(&self, from: usize) -> Option<usize> {
        values_before_witness(&self.buf, from)
    }

    /// Whether VALUE records are skipped (not read as items).
    pub fn skips_values(&self) -> bool {
        !self.values
    }

    /// Whether the item after the next one is a one-byte witness already
    /// buffered.
    #[inline(always)]
    pub fn peek_second_is_witness(&self) -> bool {
        self.buf
            .get(self.pos + 1)
            .is_some_and(|&b| is_byte_witness(b))
    }

    /// The next item and its offset, consumed.
    #[inline]
    pub fn next_item(&mut self) -> Result<(Item, u64)> {
        if let Some((w, offset)) = self.next_byte_witness() {
            return Ok((Item::Witness(w), offset));
        }
        let (item, offset, len) = self.peek()?;
        self.advance(len);
        Ok((item, offset))
    }
}
