//! Regeneration benchmark: one synthetic run (40 random structured
//! procedures, executions driven to completion, ~3 M steps per thread, each thread running the program
//! repeatedly,
//! 256 KiB zstd chunks; fixed seeds), regenerated in every output format.
//! Baselines measured in the same run: the reference regenerator
//! `aetrace_graph::regen_ref` on the same execution (steps only), and the
//! obvious printer (`writeln!("{:x}")` per instruction over its steps).
//! Prints blocks/s, instructions/s, output MB/s and the ratios; best of 3.
//! Run: `cargo bench -p aetrace-regen`.

use aetrace_format::Trace;
use aetrace_graph::program::{record, Execution};
use aetrace_graph::regen_ref::regenerate;
use aetrace_graph::testgen::{self, Rng};
use aetrace_graph::trace::witness_sets;
use aetrace_graph::{PrimaryMap, ProcId};
use aetrace_regen::testkit::{random_case, trace_bytes, LOAD_BASE};
use aetrace_regen::{regen_trace, Format, Options};
use std::io::Write;
use std::time::Instant;

/// Blocks (EXIT steps included) per thread.
const TARGET_STEPS: usize = 3_000_000;
/// Times each distinct execution is replayed.
const REPLAYS: usize = 10;

/// Counts bytes written, discards them.
#[derive(Debug)]
struct Counter(u64);
impl Write for Counter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn best<T>(f: &mut dyn FnMut() -> T) -> (f64, T) {
    let mut best = f64::INFINITY;
    let mut last = None;
    for _ in 0..3 {
        let t = Instant::now();
        let r = f();
        best = best.min(t.elapsed().as_secs_f64());
        last = Some(r);
    }
    (best, last.expect("three runs"))
}

fn main() {
    let s = random_case(2026, 40, 60, true);
    let ex = testgen::Executor::new(&s.prog);
    let mut rng = Rng::new(7);
    // Each thread runs the program again and again (main is re-entered from
    // untraced code, as a loop in a driver would): one stream, many executions.
    // Each thread runs the program again and again (main is re-entered from
    // untraced code, as a loop in a driver would): one stream, many
    // executions. Most random walks return from main within a few blocks:
    // keep the long ones, which look like programs, and replay them.
    let (mut distinct, mut steps) = (Vec::new(), 0);
    while steps < TARGET_STEPS / REPLAYS {
        let e = ex.run(&mut rng, 20_000, false);
        if e.steps.len() >= 1000 {
            steps += e.steps.len();
            distinct.push(e);
        }
    }
    let execs: Vec<&Execution> = (0..REPLAYS).flat_map(|_| distinct.iter()).collect();
    let thread = |execs: &[&Execution]| {
        let mut stream = Vec::new();
        for (i, e) in execs.iter().enumerate() {
            // Every execution's stream starts with the THREAD record: keep the first.
            stream.extend_from_slice(&s.stream(e)[if i == 0 { 0 } else { 6 }..]);
        }
        stream
    };
    let stream = thread(&execs);
    let reversed: Vec<&Execution> = execs.iter().rev().copied().collect();
    let stream2 = thread(&reversed);
    let blocks = execs.iter().map(|e| s.executed(e).count()).sum::<usize>() as f64;
    let insns = execs
        .iter()
        .flat_map(|e| s.executed(e))
        .map(|b| b.insn_lens.len())
        .sum::<usize>() as f64;
    let one = trace_bytes(&s.db, std::slice::from_ref(&stream), 256 << 10);
    let two = trace_bytes(&s.db, &[stream.clone(), stream2], 256 << 10);
    let one = Trace::parse(&one[..]).expect("trace");
    let two = Trace::parse(&two[..]).expect("trace");
    println!(
        "thread 0: {} executions, {blocks} blocks, {insns} instructions, {} stream bytes ({:.2} bytes/block)",
        execs.len(),
        stream.len(),
        stream.len() as f64 / blocks
    );
    println!(
        "{:<34} {:>9} {:>12} {:>12} {:>10}",
        "", "ms", "Mblocks/s", "Minsns/s", "out MB/s"
    );
    let row = |name: &str, secs: f64, out: u64| {
        println!(
            "{name:<34} {:>9.1} {:>12.1} {:>12.1} {:>10.1}",
            secs * 1e3,
            blocks / secs / 1e6,
            insns / secs / 1e6,
            out as f64 / secs / 1e6
        );
    };
    let ours = |t: &Trace<&[u8]>, o: Options| {
        let mut c = Counter(0);
        regen_trace(t, &o, &mut c).expect("regeneration");
        c.0
    };

    // Baseline 1: the reference regenerator (steps only).
    let placements: PrimaryMap<ProcId, _> = s.placements.clone();
    let sets: PrimaryMap<ProcId, _> = s
        .prog
        .procs
        .iter()
        .map(|(p, g)| witness_sets(g, &placements[p]))
        .collect();
    let records: Vec<_> = execs
        .iter()
        .map(|e| record(&s.prog, &placements, e))
        .collect();
    let (t_ref, steps) = best(&mut || {
        records
            .iter()
            .map(|r| {
                regenerate(&s.prog, &placements, &sets, r)
                    .expect("ref")
                    .steps
            })
            .collect::<Vec<_>>()
    });
    for (got, e) in steps.iter().zip(&execs) {
        assert_eq!(got, &e.steps);
    }
    row("reference regen_ref (steps only)", t_ref, 0);
    // Baseline 2: reference steps + the obvious printer.
    let (t_print, n) = best(&mut || {
        let mut w = std::io::BufWriter::with_capacity(1 << 20, Counter(0));
        for b in execs.iter().flat_map(|e| s.executed(e)) {
            let mut a = LOAD_BASE + b.start;
            for &l in &b.insn_lens {
                writeln!(w, "{a:x}").expect("write");
                a += u64::from(l);
            }
        }
        w.into_inner().expect("flush").0
    });
    row("obvious insn printer (no regen)", t_print, n);

    let count = Options {
        count: true,
        ..Options::default()
    };
    let (t_count, _) = best(&mut || ours(&one, count.clone()));
    row("aetrace --count", t_count, 0);
    let mut t_insn = 0.0;
    for (name, f) in aetrace_regen::Format::NAMES {
        let (t, n) = best(&mut || {
            ours(
                &one,
                Options {
                    format: f,
                    ..Options::default()
                },
            )
        });
        if f == Format::Insn {
            t_insn = t;
        }
        row(&format!("aetrace --format {name}"), t, n);
    }
    let two_threads = |jobs| Options {
        format: Format::Xdin,
        jobs,
        ..Options::default()
    };
    let (t_j1, n1) = best(&mut || ours(&two, two_threads(1)));
    let (t_j2, n2) = best(&mut || ours(&two, two_threads(2)));
    assert_eq!(n1, n2);
    println!(
        "two threads, xdin: -j 1 {:.1} ms, -j 2 {:.1} ms",
        t_j1 * 1e3,
        t_j2 * 1e3
    );
    println!();
    println!(
        "--count vs regen_ref:                  {:.2}x faster",
        t_ref / t_count
    );
    println!(
        "--format insn vs regen_ref + printer:  {:.2}x faster",
        (t_ref + t_print) / t_insn
    );
    println!(
        "-j 2 vs -j 1 on two threads:           {:.2}x faster",
        t_j1 / t_j2
    );
}
