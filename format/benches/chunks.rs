//! Chunk compression and reading speed: `cargo bench -p aetrace-format --bench chunks`.
//!
//! Synthetic witness streams stand in for real ones until the recorder exists:
//! - `loops`: nested loops of varying trip counts (one witness per iteration, a
//!   different one at loop exit), calls announced by 5-byte escape records, and a
//!   data-dependent branch taken 1 time in 8 — the shape Ball & Larus report;
//! - `branchy`: every witness a fair coin between two values (1 bit of entropy per
//!   byte, the worst case for a one-byte alphabet).
//!
//! For zstd levels 1, 3, 9 and 19 it prints the compression ratio and the speed of
//! compressing 1 MiB chunks on one core, then the speed of the reader (open, index,
//! decompress every chunk) on a trace written at the default level. The default
//! level (`DEFAULT_LEVEL`) was chosen from these numbers; see docs/format.md.

use aetrace_format::*;
use std::time::Instant;

const STREAM: usize = 32 << 20;
const CHUNK: usize = 1 << 20;

/// xorshift: deterministic noise without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn loops(n: usize) -> Vec<u8> {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let mut out = Vec::with_capacity(n + 64);
    while out.len() < n {
        // A call: ENTER escape (0xff, 4-byte procedure number from a small set).
        out.push(0xff);
        out.extend_from_slice(&((r.next() % 40) as u32).to_le_bytes());
        let outer = 1 + r.next() % 20;
        for _ in 0..outer {
            let inner = 5 + r.next() % 60;
            for _ in 0..inner {
                // The data-dependent branch inside the loop, taken 1 time in 8.
                let taken = r.next() & 7 == 0;
                out.extend_from_slice(if taken { &[1, 3] } else { &[1] });
            }
            out.push(2);
        }
        out.push(4);
    }
    out.truncate(n);
    out
}

fn branchy(n: usize) -> Vec<u8> {
    let mut r = Rng(0x2545_f491_4f6c_dd1d);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let bits = r.next();
        for i in 0..64 {
            out.push(1 + ((bits >> i) & 1) as u8);
        }
    }
    out.truncate(n);
    out
}

/// Runs `f` `runs` times; the shortest time in seconds and the last result.
fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut best = f64::INFINITY;
    let mut out = None;
    for _ in 0..runs {
        let t = Instant::now();
        out = Some(f());
        best = best.min(t.elapsed().as_secs_f64());
    }
    (best, out.expect("at least one run"))
}

fn mb_s(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e6
}

fn main() {
    for (name, stream) in [("loops", loops(STREAM)), ("branchy", branchy(STREAM))] {
        println!(
            "stream {name}: {} MiB in {} KiB chunks",
            STREAM >> 20,
            CHUNK >> 10
        );
        println!("  level   ratio   compress MB/s   decompress MB/s");
        for level in [-1, 1, 3, 9, 19] {
            // Level 19 is slow enough to measure once; the rest take the best of 3
            // runs (the machine is shared).
            let runs = if level >= 19 { 1 } else { 3 };
            let (ct, chunks) = best_of(runs, || {
                stream
                    .chunks(CHUNK)
                    .map(|c| zstd::bulk::compress(c, level).unwrap())
                    .collect::<Vec<_>>()
            });
            let stored: usize = chunks.iter().map(Vec::len).sum();
            let (dt, total) = best_of(3, || {
                chunks
                    .iter()
                    .map(|c| zstd::bulk::decompress(c, CHUNK).unwrap().len())
                    .sum::<usize>()
            });
            assert_eq!(total, stream.len());
            println!(
                "  {level:>5} {:>7.1} {:>15.0} {:>17.0}",
                stream.len() as f64 / stored as f64,
                mb_s(stream.len(), ct),
                mb_s(stream.len(), dt)
            );
        }
    }

    // Chunk size: smaller chunks give the regenerator more parallelism and lose less
    // to a crash, larger ones compress better.
    let stream = loops(STREAM);
    println!("chunk size at level {DEFAULT_LEVEL} (loops): KiB, ratio, compress MB/s");
    for kib in [64, 256, 1024, 4096] {
        let (t, stored) = best_of(3, || {
            stream
                .chunks(kib << 10)
                .map(|c| zstd::bulk::compress(c, DEFAULT_LEVEL).unwrap().len())
                .sum::<usize>()
        });
        println!(
            "  {kib:>5} {:>6.1} {:>6.0}",
            STREAM as f64 / stored as f64,
            mb_s(STREAM, t)
        );
    }

    // The reader end to end: a trace file of 4 threads at the default level.
    let path = std::env::temp_dir().join(format!("aetrace-bench-{}.aet", std::process::id()));
    let header = Header::new("aetrace bench", 0).unwrap();
    let t = Instant::now();
    let mut w = TraceWriter::create(&path, &header).unwrap();
    for th in 0..4 {
        w.thread_start(&ThreadStart {
            thread: ThreadId(th),
            parent: th.checked_sub(1).map(|_| ThreadId(0)),
            os_tid: th,
            pid: 1,
            reason: if th == 0 {
                StartReason::Main
            } else {
                StartReason::Thread
            },
        })
        .unwrap();
    }
    for (i, c) in stream.chunks(CHUNK).enumerate() {
        w.chunk(ThreadId((i % 4) as u32), c, c.len() as u64)
            .unwrap();
    }
    for th in 0..4 {
        w.thread_end(ThreadId(th), EndReason::Exit).unwrap();
    }
    w.finish().unwrap();
    let wt = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let trace = TraceFile::open(&path).unwrap();
    let it = t.elapsed().as_secs_f64();
    let (rt, total) = best_of(3, || {
        let mut buf = Vec::new();
        let mut total = 0;
        for th in trace.threads() {
            for c in trace.chunks(th.start.thread) {
                c.decompress_into(&mut buf).unwrap();
                total += buf.len();
            }
        }
        total
    });
    assert_eq!(total, STREAM);
    // The index is `Sync`: threads (rayon workers, in the regenerator) decompress
    // chunks in parallel. Two threads here, as many as the development machine has.
    let (pt, ptotal) = best_of(3, || {
        let chunks: Vec<Chunk<'_>> = trace
            .threads()
            .flat_map(|th| trace.chunks(th.start.thread))
            .collect();
        let (a, b) = chunks.split_at(chunks.len() / 2);
        let work = |part: &[Chunk<'_>]| {
            let mut buf = Vec::new();
            part.iter()
                .map(|c| {
                    c.decompress_into(&mut buf).unwrap();
                    buf.len()
                })
                .sum::<usize>()
        };
        std::thread::scope(|s| {
            let other = s.spawn(|| work(b));
            work(a) + other.join().unwrap()
        })
    });
    assert_eq!(ptotal, STREAM);
    let s = trace.stats();
    println!(
        "trace file: {} chunks, {} raw bytes -> {} bytes on disk (level {DEFAULT_LEVEL})",
        s.chunks, s.raw_bytes, s.file_bytes
    );
    println!(
        "  write (compress + append): {:.0} MB/s raw",
        mb_s(STREAM, wt)
    );
    println!("  open + index: {:.3} ms", it * 1e3);
    println!(
        "  decompress all chunks, one thread: {:.2} GB/s raw",
        mb_s(total, rt) / 1e3
    );
    println!(
        "  decompress all chunks, two threads: {:.2} GB/s raw",
        mb_s(ptotal, pt) / 1e3
    );
    std::fs::remove_file(&path).unwrap();

    // Indexing cost per section: many small chunks, stored (no compression).
    const SMALL: u64 = 200_000;
    let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
    w.thread_start(&ThreadStart {
        thread: ThreadId(0),
        parent: None,
        os_tid: 1,
        pid: 1,
        reason: StartReason::Main,
    })
    .unwrap();
    let piece = &stream[..256];
    for seq in 0..SMALL {
        w.append_chunk(&EncodedChunk {
            thread: ThreadId(0),
            seq,
            raw_len: piece.len() as u64,
            witnesses: 0,
            codec: Codec::Stored,
            data: piece.to_vec(),
        })
        .unwrap();
    }
    let bytes = w.get_ref().clone();
    let (t, n) = best_of(3, || Trace::parse(&bytes[..]).unwrap().stats().chunks);
    assert_eq!(n, SMALL);
    println!(
        "index {SMALL} chunk sections ({} MB): {:.1} ms, {:.0} ns per section",
        bytes.len() >> 20,
        t * 1e3,
        t * 1e9 / SMALL as f64
    );
}
