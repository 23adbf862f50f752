//! `record --data`'s chunks encoded off the drain's thread: the drain
//! thread hands each closed chunk's raw bytes to the rayon pool, whose
//! threads run the `zstd+split` encoder and zstd (most of the recorder's
//! CPU, docs/data.md "Where `record --data` spends its time"), so the
//! drain thread is free to empty the program's buffer again at once.
//!
//! Invariants: chunks come back in the order they were handed in (each
//! job is numbered, results are released by number), so the trace holds
//! the chunks a single thread would write, in its order, for any number
//! of pool threads; a chunk's encoding depends on its bytes alone (the
//! encoder starts empty at each chunk); at most [`IN_FLIGHT`] chunks are
//! held, then [`Pipeline::take`] waits (the program then waits for
//! buffer space, as it would for a single-threaded recorder).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::mpsc::{channel, Receiver, Sender};

use aetrace_format::values::Encoder;
use aetrace_format::{Codec, EncodedChunk, ThreadId};

/// Chunks handed to the pool and not yet taken back: enough to keep two
/// encoders busy while the drain thread closes the next chunk; bounds the
/// memory to a few MiB.
pub const IN_FLIGHT: usize = 4;

/// One closed chunk to encode.
pub struct Job {
    /// The thread whose stream it continues, and its place there.
    pub thread: ThreadId,
    pub seq: u64,
    /// Witness bytes in `raw` (the rest are escape records).
    pub witnesses: u64,
    /// The chunk's raw stream (whole records).
    pub raw: Vec<u8>,
    /// The offsets in `raw` of its VALUE records, ascending.
    pub values: Vec<usize>,
}

/// An encoded chunk, with the job's buffers to reuse for the next.
pub struct Done {
    /// The chunk, or what zstd reported (for the job's thread).
    pub chunk: Result<EncodedChunk, (ThreadId, std::io::Error)>,
    pub raw: Vec<u8>,
    pub values: Vec<usize>,
}

/// Jobs numbered in, chunks out in the same order.
pub struct Pipeline {
    tx: Sender<(u64, Done)>,
    rx: Receiver<(u64, Done)>,
    /// Jobs handed out, and the number of the next to take back.
    sent: u64,
    next: u64,
    /// Results that came before an earlier job's.
    early: BTreeMap<u64, Done>,
}

impl Default for Pipeline {
    fn default() -> Self {
        let (tx, rx) = channel();
        Pipeline {
            tx,
            rx,
            sent: 0,
            next: 0,
            early: BTreeMap::new(),
        }
    }
}

thread_local! {
    /// Each pool thread's encoder and zstd context (a context holds about
    /// a megabyte of tables: made once per thread, not per chunk).
    static CODER: RefCell<Option<(Encoder, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
}

impl Pipeline {
    /// Makes every pool thread's zstd context now (its first compression
    /// allocates the workspace), while the program starts, not at its
    /// first chunk.
    pub fn warm(level: i32) {
        rayon::spawn_broadcast(move |_| {
            let _ = with_coder(level, |_, z| z.compress(&[0]));
        });
    }

    /// Hands `job` to the pool, whose zstd runs at `level`.
    pub fn submit(&mut self, job: Job, level: i32) {
        let (k, tx) = (self.sent, self.tx.clone());
        self.sent += 1;
        rayon::spawn(move || {
            let _ = tx.send((k, encode(job, level)));
        });
    }

    /// The chunks ready in job order; waits until at most `keep` jobs are
    /// still out.
    pub fn take(&mut self, keep: usize) -> Vec<Done> {
        let mut ready = Vec::new();
        loop {
            while let Ok((k, d)) = self.rx.try_recv() {
                self.early.insert(k, d);
            }
            while let Some(d) = self.early.remove(&self.next) {
                self.next += 1;
                ready.push(d);
            }
            if self.sent - self.next <= keep as u64 {
                return ready;
            }
            // Never disconnected: `self.tx` is a sender.
            match self.rx.recv() {
                Ok((k, d)) => {
                    self.early.insert(k, d);
                }
                Err(_) => return ready,
            }
        }
    }
}

/// `f` on this thread's encoder and zstd context (made at `level` on
/// first use).
fn with_coder<T>(
    level: i32,
    f: impl FnOnce(&mut Encoder, &mut zstd::bulk::Compressor<'static>) -> std::io::Result<T>,
) -> std::io::Result<T> {
    CODER.with(|cell| {
        let mut cell = cell.borrow_mut();
        let (e, z) = match &mut *cell {
            Some(c) => c,
            None => cell.insert((Encoder::default(), zstd::bulk::Compressor::new(level)?)),
        };
        f(e, z)
    })
}

/// One chunk through the `zstd+split` codec.
fn encode(job: Job, level: i32) -> Done {
    let chunk = with_coder(level, |e, z| {
        let mut data = Vec::new();
        e.push(&job.raw, &job.values);
        e.finish(z, &mut data)?;
        Ok(data)
    })
    .map(|data| EncodedChunk {
        thread: job.thread,
        seq: job.seq,
        raw_len: job.raw.len() as u64,
        witnesses: job.witnesses,
        codec: Codec::ZstdSplit,
        data,
    })
    .map_err(|e| (job.thread, e));
    Done {
        chunk,
        raw: job.raw,
        values: job.values,
    }
}
