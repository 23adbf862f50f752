//! What a second value stream (issue 21, DESIGN-data.md: values in their
//! own per-thread stream of the slot, not VALUE records among the
//! witnesses) would store, and what its encoding would cost the recorder
//! per value, measured on a `record --data` trace before building it
//! (docs/data.md, "A second value stream, measured before building").
//!
//! Splits each thread's raw stream into the witness stream without VALUE
//! records and the values, then encodes 1 MiB chunks in one thread:
//! today's path (the drain's scan for VALUE records, codec 3, zstd level
//! 1); the witness stream alone; the values alone by codec 3's encoder, by
//! the difference from the last value in eight byte planes, and by the
//! nearest of the last 16 values. Prints stored bytes and the least
//! thread CPU time per value of five rounds that alternate the methods. A
//! measurement tool: nothing here is read back.
//!
//! Usage: `value_stream TRACE`

use std::process::ExitCode;

use aetrace_format::values::Encoder;
use aetrace_format::{ThreadId, TraceFile};
use aetrace_runtime::layout::{valid_prefix_with, RecordKind, ESCAPE};

/// Values per chunk of the value stream (1 MiB).
const CHUNK: usize = 1 << 17;
/// Recent values the nearest-value predictor chooses from.
const RING: usize = 16;

/// A trace's raw streams (one per chunk), each chunk's VALUE records'
/// offsets, its witness stream without them, and all values in order.
struct Split {
    raw: Vec<Vec<u8>>,
    offsets: Vec<Vec<usize>>,
    witness: Vec<Vec<u8>>,
    values: Vec<u64>,
}

fn split(trace: &TraceFile) -> Result<Split, String> {
    const LEN: usize = RecordKind::Value.encoded_len() as usize;
    let mut s = Split {
        raw: Vec::new(),
        offsets: Vec::new(),
        witness: Vec::new(),
        values: Vec::new(),
    };
    for thread in 0..trace.threads().len() as u32 {
        for chunk in trace.chunks(ThreadId(thread)) {
            let raw = chunk.decompress().map_err(|e| e.to_string())?;
            let mut offs = Vec::new();
            valid_prefix_with(&raw, |at, k| {
                if k == RecordKind::Value {
                    offs.push(at)
                }
            })
            .map_err(|(at, k)| format!("record kind {k} at {at}"))?;
            let (mut wit, mut from) = (Vec::new(), 0);
            for &at in &offs {
                wit.extend_from_slice(&raw[from..at]);
                let v = raw[at + 2..at + LEN].try_into().expect("8 bytes");
                s.values.push(u64::from_le_bytes(v));
                from = at + LEN;
            }
            wit.extend_from_slice(&raw[from..]);
            s.raw.push(raw);
            s.offsets.push(offs);
            s.witness.push(wit);
        }
    }
    Ok(s)
}

fn zigzag(d: u64) -> u64 {
    let d = d as i64;
    ((d << 1) ^ (d >> 63)) as u64
}

/// LEB128 of `v` over three planes: its first byte, its second, the rest
/// (as codec 3 writes its deltas).
fn split_leb(planes: &mut [Vec<u8>], mut v: u64) {
    for p in 0.. {
        let more = v >= 0x80;
        planes[p.min(2)].push(v as u8 & 0x7f | u8::from(more) << 7);
        v >>= 7;
        if !more {
            break;
        }
    }
}

/// One chunk of values as planes: the difference from the last value,
/// zigzagged, in eight byte planes.
fn by_last(values: &[u64], planes: &mut Vec<Vec<u8>>) {
    planes.resize(8, Vec::new());
    let mut last = 0;
    for &v in values {
        let d = zigzag(v.wrapping_sub(last));
        last = v;
        for (p, b) in planes.iter_mut().zip(d.to_le_bytes()) {
            p.push(b);
        }
    }
}

/// One chunk of values as planes: the nearest of the last [`RING`]
/// distinct values (its age in a fourth plane) and the zigzagged
/// difference from it in codec 3's three LEB128 planes.
fn by_nearest(values: &[u64], planes: &mut Vec<Vec<u8>>) {
    planes.resize(4, Vec::new());
    let (mut ring, mut at) = ([0u64; RING], 0);
    for &v in values {
        let (mut best, mut age) = (u64::MAX, 0);
        for (i, &r) in ring.iter().enumerate() {
            let d = zigzag(v.wrapping_sub(r));
            if d < best {
                (best, age) = (d, (at + RING - i) % RING);
            }
        }
        planes[3].push(age as u8);
        split_leb(&mut planes[..3], best);
        if best != 0 {
            ring[at] = v;
            at = (at + 1) % RING;
        }
    }
}

/// This thread's CPU time in seconds (not wall time: other processes
/// load the machine).
fn cpu() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Rounds; each runs every method once, in turn, so that a burst of
/// other load falls on all of them alike; the least time of each counts.
const ROUNDS: usize = 5;

/// Codec 3 of `chunks` (raw stream, VALUE offsets), stored bytes;
/// `scan`: the offsets found again by the drain's scan (today's path).
fn codec3(
    enc: &mut Encoder,
    z: &mut zstd::bulk::Compressor<'_>,
    chunks: &[(&[u8], &[usize])],
    scan: bool,
) -> Result<usize, String> {
    let (mut found, mut out) = (Vec::new(), Vec::new());
    for &(raw, mut offs) in chunks {
        if scan {
            found.clear();
            valid_prefix_with(raw, |at, k| {
                if k == RecordKind::Value {
                    found.push(at)
                }
            })
            .map_err(|(at, k)| format!("record kind {k} at {at}"))?;
            offs = &found;
        }
        enc.push(raw, offs);
        enc.finish(z, &mut out).map_err(|e| e.to_string())?;
    }
    Ok(out.len())
}

/// Each part of `parts` compressed alone: stored bytes.
fn zsum(z: &mut zstd::bulk::Compressor<'_>, parts: &[Vec<u8>]) -> Result<usize, String> {
    parts.iter().try_fold(0, |sum, p| {
        Ok(sum + z.compress(p).map_err(|e| e.to_string())?.len())
    })
}

/// The methods measured, in the order printed.
const METHODS: [&str; 5] = [
    "today: the drain's scan, codec 3, zstd 1",
    "value stream: codec 3's encoder, zstd 1",
    "witness stream without VALUE records, zstd 1",
    "value stream: last value, 8 byte planes, zstd 1",
    "value stream: nearest of the last 16, zstd 1",
];

fn run(path: &str) -> Result<(), String> {
    let trace = TraceFile::open(path).map_err(|e| format!("{path}: {e}"))?;
    let s = split(&trace)?;
    let n = s.values.len();
    let stored: usize = (0..trace.threads().len() as u32)
        .flat_map(|t| trace.chunks(ThreadId(t)))
        .map(|c| c.data.len())
        .sum();
    let raw: usize = s.raw.iter().map(Vec::len).sum();
    println!("{path}: {n} values, raw stream {raw} B, stored {stored} B");
    let today: Vec<(&[u8], &[usize])> = (s.raw.iter().zip(&s.offsets))
        .map(|(r, o)| (&r[..], &o[..]))
        .collect();
    // The values alone as back-to-back VALUE records: codec 3's encoder
    // without the scan and without witness bytes.
    let len = RecordKind::Value.encoded_len() as usize;
    let records: Vec<Vec<u8>> = (s.values.chunks(CHUNK))
        .map(|c| {
            c.iter()
                .flat_map(|v| [&[ESCAPE, RecordKind::Value as u8][..], &v.to_le_bytes()].concat())
                .collect()
        })
        .collect();
    let offsets: Vec<usize> = (0..CHUNK).map(|i| i * len).collect();
    let alone: Vec<(&[u8], &[usize])> = (records.iter())
        .map(|r| (&r[..], &offsets[..r.len() / len]))
        .collect();
    let mut z = zstd::bulk::Compressor::new(1).map_err(|e| e.to_string())?;
    let (mut enc, mut planes) = (Encoder::default(), Vec::new());
    let mut by = |f: fn(&[u64], &mut Vec<Vec<u8>>), z: &mut zstd::bulk::Compressor<'_>| {
        s.values.chunks(CHUNK).try_fold(0, |sum, c| {
            planes.iter_mut().for_each(Vec::clear);
            f(c, &mut planes);
            Ok::<_, String>(sum + zsum(z, &planes)?)
        })
    };
    let mut best = [(0usize, f64::MAX); METHODS.len()];
    for _ in 0..ROUNDS {
        for (m, b) in best.iter_mut().enumerate() {
            let t = cpu();
            let bytes = match m {
                0 => codec3(&mut enc, &mut z, &today, true)?,
                1 => codec3(&mut enc, &mut z, &alone, false)?,
                2 => zsum(&mut z, &s.witness)?,
                3 => by(by_last, &mut z)?,
                _ => by(by_nearest, &mut z)?,
            };
            *b = (bytes, b.1.min(cpu() - t));
        }
    }
    for (what, (bytes, secs)) in METHODS.iter().zip(best) {
        println!(
            "  {what:<52} {bytes:>11} B {:>5.2} B/value {:>6.1} ns/value",
            bytes as f64 / n as f64,
            secs * 1e9 / n as f64
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [trace] = args.as_slice() else {
        eprintln!("usage: value_stream TRACE");
        return ExitCode::from(2);
    };
    match run(trace) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("value_stream: {e}");
            ExitCode::FAILURE
        }
    }
}
