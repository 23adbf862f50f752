//! `regen --data -j N` from a state index whose entries keep the data
//! walk's states (`state`; `docs/data.md`, "`-j N` from the state index"):
//! the workers take the pieces between those entries in order, each
//! walking its piece's control events (`aetrace_regen::visit::Pieces`)
//! and data from the entry's states, and hand its output in batches to
//! the writer `regen -j N` writes a pipe with (`Pieces::write_in_order`),
//! which writes them in piece order. The piece walk itself ([`Walker`])
//! also serves `aetrace debug`, which rebuilds only the pieces a session
//! reads.
//!
//! Invariants: the output is the bytes `-j 1` writes (a piece's data walk
//! starts in the state the whole walk had there, and checks at its end
//! that it reached the next entry's); the writer's lookahead bounds the
//! output waiting in memory; after a piece's error nothing of a later
//! piece is written.

use super::{state, Bin, Caches, Counts, DataFormat, Records, Sink, Text, Writer, BIN_BUFFER};
use super::{Error, Result, INDEX_STALE};
use aetrace_format::Trace;
use aetrace_regen::index::StateIndex;
use aetrace_regen::output::BATCH;
use aetrace_regen::visit::{PieceKeep, Pieces, Span, Task, Tasks, Visit};
use std::cell::RefCell;
use std::io::Write;
use std::rc::Rc;
use std::sync::Mutex;

/// Stream bytes per piece at least: each piece's start passes up to a
/// window of values again and restarts its control walk (gzip's 2 MB
/// trace: 360 MB of stream, 4.6 GB of `bin`; pieces at every 256 KiB
/// entry cost `-j 2` 1.46x the CPU of `-j 1`).
const PIECE_BYTES: u64 = 2 << 20;

/// Writes the data trace of `trace` (its options' index holding data
/// states) with `workers` workers.
pub(super) fn write<B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    opts: &aetrace_regen::Options,
    format: DataFormat,
    out: &mut dyn Write,
    workers: usize,
) -> Result<Counts> {
    let index = opts.index.as_deref().ok_or("no state index")?;
    let visit = Visit::with_segments(trace, opts)?.sharing_values();
    let pieces = visit.pieces()?;
    // Cut at entries with data states at least `--piece` (else
    // PIECE_BYTES) stream bytes apart (a
    // thread's offsets start again below the last).
    let piece = match opts.piece_bytes {
        0 => PIECE_BYTES,
        n => n,
    };
    let last = std::cell::Cell::new(0u64);
    let spans = pieces.spans(&|e| {
        let far = e.offset >= last.get().saturating_add(piece) || e.offset < last.get();
        let cut = !e.data.is_empty() && far;
        if cut || e.offset < last.get() {
            last.set(if cut { e.offset } else { 0 });
        }
        cut
    });
    if format == DataFormat::Bin {
        let header = aetrace_format::addrtrace::Header { count: None };
        out.write_all(&header.to_bytes())?;
    }
    let total = Mutex::new(Counts::default());
    let job = Job {
        trace,
        visit: &visit,
        pieces: &pieces,
        index,
        total: &total,
    };
    let work = |tasks: &Tasks<'_, Span>| job.work(format, tasks);
    match pieces.write_in_order(&spans, workers, work, &mut |b| out.write_all(b)) {
        // As `-j 1` reports a failed write.
        Err(aetrace_regen::Error::Output(e)) => return Err(e.into()),
        r => r?,
    }
    Ok(total.into_inner().unwrap_or_default())
}

/// What every worker shares.
struct Job<'j, 'v, B> {
    trace: &'j Trace<B>,
    visit: &'j Visit<'v, B>,
    pieces: &'j Pieces<'j, B>,
    index: &'j StateIndex,
    /// The pieces' counts summed (the total when none failed).
    total: &'j Mutex<Counts>,
}

/// A worker's output buffer, shared with its sink.
struct Shared(Rc<RefCell<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Hands `buf` to `task`'s writer once it holds `least` bytes (at least
/// one); false once the writer stopped.
fn send(buf: &RefCell<Vec<u8>>, task: &Task<'_>, least: usize) -> bool {
    let mut b = buf.borrow_mut();
    b.len() < least.max(1) || task.emit(&mut b)
}

/// A piece's walk: into the worker's sink, calling its argument after
/// each batch of control events (false: the writer stopped).
type PieceWalk<'a> = dyn FnMut(Span, &mut dyn FnMut() -> bool) -> Result<Counts> + 'a;

impl<'j, B: AsRef<[u8]> + Sync> Job<'j, '_, B> {
    /// A worker: its sink and its walker kept from piece to piece (its
    /// records of each block are built once), its output handed on a
    /// batch at a time.
    fn work(&self, format: DataFormat, tasks: &Tasks<'_, Span>) {
        let buf = Rc::new(RefCell::new(Vec::new()));
        let mut shared = Shared(buf.clone());
        let mut walker = match Walker::new(self.trace, self.visit, self.pieces, self.index) {
            Ok(w) => w,
            Err(e) => {
                if let Some((_, task)) = tasks.next() {
                    task.end(Err(consumer(&e)));
                }
                return;
            }
        };
        let go = |walk: &mut PieceWalk<'_>| {
            while let Some((span, task)) = tasks.next() {
                let r = walk(span, &mut || send(&buf, &task, BATCH));
                send(&buf, &task, 0);
                task.end(r.map(|c| self.add(c)).map_err(|e| consumer(&e)));
            }
        };
        match format {
            DataFormat::Bin => {
                let records = Records {
                    out: &mut shared,
                    buf: vec![[0; 8]; BIN_BUFFER],
                    len: 0,
                };
                let mut bin = Bin {
                    records,
                    words: Vec::new(),
                    segs: Vec::new(),
                };
                bin.modules(self.visit.modules());
                go(&mut |span, emit| {
                    let r = walker.piece(&mut bin, span, emit);
                    let flushed = bin.records.flush();
                    r.and_then(|c| flushed.map(|()| c))
                });
            }
            f => {
                let lackey = f == DataFormat::Lackey;
                let mut text = Text::new(lackey, &mut shared);
                go(&mut |span, emit| {
                    let r = walker.piece(&mut text, span, emit);
                    let flushed = text.flush();
                    r.and_then(|c| flushed.map(|()| c))
                });
            }
        }
    }

    /// Adds a piece's counts to the total.
    fn add(&self, c: Counts) {
        if let Ok(mut t) = self.total.lock() {
            t.refs += c.refs;
            t.static_refs += c.static_refs;
            t.recorded_refs += c.recorded_refs;
            t.checked_refs += c.checked_refs;
        }
    }
}

/// Walks the pieces of a trace one at a time, each from the data state
/// its first entry keeps (`regen --data -j N`'s workers; `aetrace debug`,
/// which rebuilds the pieces a session reads, `src/cmd/debug.rs`), with
/// what it learns of the code carried from piece to piece.
pub struct Walker<'j, 'v, B> {
    trace: &'j Trace<B>,
    visit: &'j Visit<'v, B>,
    pieces: &'j Pieces<'j, B>,
    index: &'j StateIndex,
    caches: Option<Caches>,
    keep: PieceKeep,
}

impl<'j, 'v, B: AsRef<[u8]> + Sync> Walker<'j, 'v, B> {
    /// A walker of `visit`'s `pieces`, from the data states of `index`
    /// (the index `visit`'s options hold).
    pub fn new(
        trace: &'j Trace<B>,
        visit: &'j Visit<'v, B>,
        pieces: &'j Pieces<'j, B>,
        index: &'j StateIndex,
    ) -> Result<Self> {
        Ok(Walker {
            trace,
            visit,
            pieces,
            index,
            caches: Some(Caches::of(trace, visit.modules())?),
            keep: PieceKeep::default(),
        })
    }

    /// Walks piece `span` into `sink`: from its first entry's data state,
    /// checked at its end against the next entry's (or the thread's end),
    /// calling `emit` after each batch of control events (false: stop).
    pub fn piece<S: Sink>(
        &mut self,
        sink: &mut S,
        span: Span,
        emit: &mut dyn FnMut() -> bool,
    ) -> Result<Counts> {
        let c = self.caches.take().ok_or("a piece's walk failed before")?;
        let mut w = Writer::new(sink, c);
        let r = self.walk(&mut w, span, emit);
        self.caches = Some(w.caches());
        r
    }

    fn walk<S: Sink>(
        &mut self,
        w: &mut Writer<'_, 'j, S>,
        span: Span,
        emit: &mut dyn FnMut() -> bool,
    ) -> Result<Counts> {
        let entries = self.index.entries(span.thread.0);
        if let Some(k) = span.from {
            let s = state::decode(&entries[k].data).ok_or(INDEX_STALE)?;
            w.restore_data(self.trace, self.visit, span.thread, s)?;
        }
        let mut err: Option<Error> = None;
        let ran = self.pieces.run(span, &mut self.keep, &mut |runs| match w
            .batch(self.trace, self.visit, runs)
        {
            Ok(()) => emit(),
            Err(e) => {
                err = Some(e);
                false
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        ran?;
        match span.to {
            Some(k) => {
                let mine = w.data_state();
                if mine.as_deref().and_then(state::canonical) != state::canonical(&entries[k].data)
                {
                    return Err(INDEX_STALE.into());
                }
            }
            None => w.end_thread(self.visit)?,
        }
        Ok(w.counts)
    }
}

/// A worker's error (not `Send`) as the writer's.
fn consumer(e: &Error) -> aetrace_regen::Error {
    aetrace_regen::Error::Consumer(e.to_string())
}
