//! `regen --data -j N` from a state index whose entries keep the data
//! walk's state (`state`; `docs/data.md`, "`-j N` from the state index"):
//! the workers take the pieces between those entries in order, each
//! walking its piece's control events (`aetrace_regen::visit::Pieces`)
//! and data from the entry's states into its own buffer, and this thread
//! writes the buffers in piece order.
//!
//! Invariants: the output is the bytes `-j 1` writes (a piece's data walk
//! starts in the state the whole walk had there, and checks at its end
//! that it reached the next entry's); at most `2N` finished pieces wait
//! for the writer; after a piece's error nothing of a later piece is
//! written.

use super::{state, Bin, Caches, Counts, DataFormat, Records, Sink, Text, Writer, BIN_BUFFER};
use super::{Error, Result, INDEX_STALE};
use aetrace_format::Trace;
use aetrace_regen::index::StateIndex;
use aetrace_regen::visit::{PieceKeep, Pieces, Span, Visit};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::Write;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

/// Stream bytes per piece at least: each piece's start passes up to a
/// window of values again and restarts its control walk, and its output
/// waits whole for the writer (gzip's 2 MB trace: 360 MB of stream, 4.6
/// GB of `bin`; pieces at every 256 KiB entry cost `-j 2` 1.46x the CPU
/// of `-j 1`).
const PIECE_BYTES: u64 = 2 << 20;

/// A piece's output: its bytes, or its error as text (a worker's errors
/// are not `Send`) after those bytes.
type Done = (Vec<u8>, Counts, Option<String>);

/// The finished pieces waiting for the writer, and how many were written.
#[derive(Default)]
struct Board {
    done: BTreeMap<usize, Done>,
    written: usize,
    /// Written buffers, for the workers to fill again: a buffer freed
    /// comes back from the system as fresh pages (2.3-4.4 s of system
    /// time on `-j 2` of gzip's and bzip2's 2 MB traces).
    spare: Vec<Vec<u8>>,
}

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
    let (board, moved) = (Mutex::new(Board::default()), Condvar::new());
    let (next, stop) = (AtomicUsize::new(0), AtomicBool::new(false));
    let ahead = 2 * workers;
    let job = Job {
        trace,
        visit: &visit,
        pieces: &pieces,
        spans: &spans,
        index,
    };
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let mut take = || {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let mut b = board.lock().ok()?;
                    while i >= b.written + ahead && !stop.load(Ordering::SeqCst) {
                        b = moved.wait(b).ok()?;
                    }
                    (i < spans.len() && !stop.load(Ordering::SeqCst)).then_some(i)
                };
                let mut put = |i: usize, d: Done| -> Vec<u8> {
                    let mut spare = Vec::new();
                    if let Ok(mut b) = board.lock() {
                        b.done.insert(i, d);
                        spare = b.spare.pop().unwrap_or_default();
                    }
                    moved.notify_all();
                    spare.clear();
                    spare
                };
                job.work(format, &mut take, &mut put);
            });
        }
        let r = drain(&board, &moved, spans.len(), out);
        stop.store(true, Ordering::SeqCst);
        moved.notify_all();
        r
    })
}

/// Writes the pieces in order as they finish; their counts summed, or
/// the first error.
fn drain(board: &Mutex<Board>, moved: &Condvar, n: usize, out: &mut dyn Write) -> Result<Counts> {
    let mut total = Counts::default();
    for i in 0..n {
        let mut b = board.lock().map_err(|_| "a worker failed")?;
        let (bytes, counts, err) = loop {
            match b.done.remove(&i) {
                Some(d) => break d,
                None => b = moved.wait(b).map_err(|_| "a worker failed")?,
            }
        };
        b.written = i + 1;
        drop(b);
        moved.notify_all();
        out.write_all(&bytes)?;
        if let Ok(mut b) = board.lock() {
            b.spare.push(bytes);
        }
        if let Some(e) = err {
            return Err(e.into());
        }
        total.refs += counts.refs;
        total.static_refs += counts.static_refs;
        total.recorded_refs += counts.recorded_refs;
        total.checked_refs += counts.checked_refs;
    }
    Ok(total)
}

/// What every worker shares.
struct Job<'j, 'v, B> {
    trace: &'j Trace<B>,
    visit: &'j Visit<'v, B>,
    pieces: &'j Pieces<'j, B>,
    spans: &'j [Span],
    index: &'j StateIndex,
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

impl<'j, B: AsRef<[u8]> + Sync> Job<'j, '_, B> {
    /// A worker: its sink and its walker kept from piece to piece (its
    /// records of each block are built once).
    fn work(
        &self,
        format: DataFormat,
        take: &mut dyn FnMut() -> Option<usize>,
        put: &mut dyn FnMut(usize, Done) -> Vec<u8>,
    ) {
        let buf = Rc::new(RefCell::new(Vec::new()));
        let mut shared = Shared(buf.clone());
        let walker = Walker::new(self.trace, self.visit, self.pieces, self.index);
        let Ok(mut walker) = walker.map_err(|e| {
            if let Some(i) = take() {
                put(i, (Vec::new(), Counts::default(), Some(e.to_string())));
            }
        }) else {
            return;
        };
        let mut go = |sink: &mut dyn FnMut(usize) -> (Counts, Option<String>)| {
            while let Some(i) = take() {
                let (counts, err) = sink(i);
                let bytes = std::mem::take(&mut *buf.borrow_mut());
                *buf.borrow_mut() = put(i, (bytes, counts, err));
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
                go(&mut |i| {
                    let r = walker.piece(&mut bin, self.spans[i]);
                    let flushed = bin.records.flush();
                    finish(r.and_then(|c| flushed.map(|()| c)))
                });
            }
            f => {
                let lackey = f == DataFormat::Lackey;
                let mut text = Text {
                    lackey,
                    out: &mut shared,
                };
                go(&mut |i| finish(walker.piece(&mut text, self.spans[i])));
            }
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
    /// checked at its end against the next entry's (or the thread's end).
    pub fn piece<S: Sink>(&mut self, sink: &mut S, span: Span) -> Result<Counts> {
        let c = self.caches.take().ok_or("a piece's walk failed before")?;
        let mut w = Writer::new(sink, c);
        let r = self.walk(&mut w, span);
        self.caches = Some(w.caches());
        r
    }

    fn walk<S: Sink>(&mut self, w: &mut Writer<'_, 'j, S>, span: Span) -> Result<Counts> {
        let entries = self.index.entries(span.thread.0);
        if let Some(k) = span.from {
            let s = state::decode(&entries[k].data).ok_or(INDEX_STALE)?;
            w.restore_data(self.trace, self.visit, span.thread, s)?;
        }
        let mut err: Option<Error> = None;
        let ran = self.pieces.run(span, &mut self.keep, &mut |runs| match w
            .batch(self.trace, self.visit, runs)
        {
            Ok(()) => true,
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

/// A piece's counts and error as [`Done`] keeps them.
fn finish(r: Result<Counts>) -> (Counts, Option<String>) {
    match r {
        Ok(c) => (c, None),
        Err(e) => (Counts::default(), Some(e.to_string())),
    }
}
