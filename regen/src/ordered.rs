//! The one writer of `-j N` output that goes out in order (`docs/regen.md`
//! section 4, "Writing"): a cutter hands out pieces in order, workers take
//! them in that order and send each piece's output in batches on the
//! piece's own channel, and the writer hands the batches on, piece after
//! piece. It serves regeneration into a pipe (`output`) and the data
//! walk's pieces (`visit::Pieces::write_in_order`, `regen --data -j N`).
//! (Pieces written at their offsets need no order: `regions`.)
//!
//! Invariants: the output is every piece's batches in piece order, each
//! piece's in the order its worker emitted them; after a piece's error
//! nothing of a later piece is handed on. The pieces not being written
//! hold at most `ahead` batches between them and at most `2 * workers`
//! cut pieces wait, so memory stays bounded; the piece being written never
//! waits, and pieces are taken in order, so the piece the writer waits
//! for always has a worker (no deadlock).

use crate::error::{Error, Result};
use crate::output::BATCH;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Condvar, Mutex};

/// Written batches, for the workers to fill again: a batch allocated by
/// one thread and freed by another goes back to the system and comes back
/// as fresh pages, one page fault per 4 KiB of output (pieces expanded in
/// parallel from a state index made 110 k page faults on gzip's `bin`
/// with 16 kept; the data walk's pieces 2.3-4.4 s of system time).
pub(crate) struct Spare {
    list: Mutex<Vec<Vec<u8>>>,
    /// Batches kept at most: as many as may be in flight, so keeping them
    /// never holds more than the lookahead already allowed.
    max: usize,
}

impl Spare {
    /// Keeping at most `max` batches.
    pub(crate) fn new(max: usize) -> Self {
        Spare {
            list: Mutex::default(),
            max,
        }
    }

    /// A written batch, emptied, if one is kept.
    pub(crate) fn take(&self) -> Option<Vec<u8>> {
        self.list.lock().ok()?.pop()
    }

    /// Keeps written batch `b` (a full-sized one, while there is room).
    pub(crate) fn put(&self, mut b: Vec<u8>) {
        if let Ok(mut list) = self.list.lock() {
            if list.len() < self.max && b.capacity() >= BATCH {
                b.clear();
                list.push(b);
            }
        }
    }
}

/// A batch of one piece's output, or how the piece ended.
enum Msg {
    Bytes(Vec<u8>),
    End(Result<()>),
}

/// The batches the workers hold ahead of the writer, counted over all
/// pieces in flight. Each piece's channel bounded only its own piece, so
/// a worker whose pieces fit their channels ran any number of pieces
/// ahead (gzip's `bin` with 1 MiB pieces: 83-110 k page faults of fresh
/// batches, against 42-45 k with the default 4 MiB ones). Pieces are
/// numbered in cut order; the one being written (`head`) never waits.
struct Budget {
    state: Mutex<Held>,
    freed: Condvar,
    max: usize,
}

/// [`Budget`]'s counts.
#[derive(Default)]
struct Held {
    /// The piece being written.
    head: u64,
    /// Batches sent and not written yet.
    batches: usize,
    /// The writer stopped: nobody waits any more.
    stop: bool,
}

impl Budget {
    fn new(max: usize) -> Self {
        Budget {
            state: Default::default(),
            freed: Default::default(),
            max,
        }
    }

    /// Counts a batch of piece `piece`, first waiting for room unless it
    /// is the piece being written; false once the writer stopped.
    fn take(&self, piece: u64) -> bool {
        let Ok(mut h) = self.state.lock() else {
            return false;
        };
        while !h.stop && piece != h.head && h.batches >= self.max {
            h = match self.freed.wait(h) {
                Ok(h) => h,
                Err(_) => return false,
            };
        }
        h.batches += 1;
        !h.stop
    }

    /// Applies `f` to the counts and wakes the waiting workers.
    fn update(&self, f: impl FnOnce(&mut Held)) {
        if let Ok(mut h) = self.state.lock() {
            f(&mut h);
        }
        self.freed.notify_all();
    }
}

/// A cut piece waiting for a worker: the piece, its channel, its number.
type Work<P> = (P, mpsc::SyncSender<Msg>, u64);

/// The pieces for the workers of [`in_order`], in cut order.
pub struct Tasks<'w, P> {
    rx: &'w Mutex<mpsc::Receiver<Work<P>>>,
    stop: &'w AtomicBool,
    budget: &'w Budget,
    spare: &'w Spare,
}

impl<'w, P> Tasks<'w, P> {
    /// The next piece and where its output goes; `None` when no piece is
    /// left or the writer stopped.
    pub fn next(&self) -> Option<(P, Task<'w>)> {
        let (piece, tx, number) = self.rx.lock().ok()?.recv().ok()?;
        if self.stop.load(Ordering::SeqCst) {
            return None;
        }
        let task = Task {
            number,
            tx,
            budget: self.budget,
            spare: self.spare,
        };
        Some((piece, task))
    }
}

/// Where a piece's output goes ([`Tasks::next`]).
pub struct Task<'w> {
    number: u64,
    tx: mpsc::SyncSender<Msg>,
    budget: &'w Budget,
    spare: &'w Spare,
}

impl Task<'_> {
    /// Hands batch `b` to the writer, leaving a written batch (or an
    /// empty buffer) in its place; false once the writer stopped.
    pub fn emit(&self, b: &mut Vec<u8>) -> bool {
        if !self.budget.take(self.number) {
            return false;
        }
        let next = self.spare.take().unwrap_or_default();
        self.tx.send(Msg::Bytes(std::mem::replace(b, next))).is_ok()
    }

    /// Ends the piece with `r`: after an error the writer hands on nothing
    /// of a later piece.
    pub fn end(self, r: Result<()>) {
        let _ = self.tx.send(Msg::End(r));
    }
}

/// Runs `workers` workers, each `work` taking pieces from its [`Tasks`],
/// on the pieces `cut` hands out (its callback false: stop cutting), and
/// hands their output to `give` piece after piece; its error stops the
/// workers and is the result, as is the first piece's error. The pieces
/// not being written hold at most `ahead` batches; written batches go
/// to `spare`.
pub(crate) fn in_order<P: Send>(
    workers: usize,
    ahead: usize,
    spare: &Spare,
    cut: impl FnOnce(&mut dyn FnMut(P) -> bool) + Send,
    work: impl Fn(&Tasks<'_, P>) + Sync,
    give: &mut dyn FnMut(&mut Vec<u8>) -> std::io::Result<()>,
) -> Result<()> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(workers + 1)
        .build()
        .map_err(|e| Error::Usage(format!("cannot start {workers} worker threads: {e}")))?;
    let budget = Budget::new(ahead);
    let (order_tx, order_rx) = mpsc::channel::<mpsc::Receiver<Msg>>();
    let (work_tx, work_rx) = mpsc::sync_channel::<Work<P>>(2 * workers);
    let work_rx = Mutex::new(work_rx);
    let stop = AtomicBool::new(false);
    let tasks = Tasks {
        rx: &work_rx,
        stop: &stop,
        budget: &budget,
        spare,
    };
    pool.in_place_scope(|s| {
        let stop = &stop;
        s.spawn(move |_| {
            let mut number = 0;
            cut(&mut |p| {
                let (tx, rx) = mpsc::sync_channel::<Msg>(ahead);
                let go = !stop.load(Ordering::SeqCst)
                    && order_tx.send(rx).is_ok()
                    && work_tx.send((p, tx, number)).is_ok();
                number += 1;
                go
            });
        });
        for _ in 0..workers {
            s.spawn(|_| work(&tasks));
        }
        let result = drain(&order_rx, &budget, spare, give);
        if result.is_err() {
            // Stop the cutter and the workers: their sends now fail.
            stop.store(true, Ordering::SeqCst);
            budget.update(|h| h.stop = true);
            drop(order_rx);
            if let Ok(rx) = work_rx.lock() {
                while rx.try_recv().is_ok() {}
            }
        }
        result
    })
}

/// The writer: each piece's batches to `give`, in cut order, up to the
/// first error.
fn drain(
    order: &mpsc::Receiver<mpsc::Receiver<Msg>>,
    budget: &Budget,
    spare: &Spare,
    give: &mut dyn FnMut(&mut Vec<u8>) -> std::io::Result<()>,
) -> Result<()> {
    for rx in order {
        loop {
            match rx.recv() {
                Ok(Msg::Bytes(mut b)) => {
                    give(&mut b).map_err(Error::Output)?;
                    spare.put(b);
                    budget.update(|h| h.batches = h.batches.saturating_sub(1));
                }
                Ok(Msg::End(r)) => {
                    r?;
                    budget.update(|h| h.head += 1);
                    break;
                }
                Err(_) => return Err(Error::Usage("a regeneration worker died".into())),
            }
        }
    }
    Ok(())
}
