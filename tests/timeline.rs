//! `aetrace timeline`: the call tree as Chrome/Perfetto trace JSON, parsed
//! and checked against oracles that share none of its code. Per
//! procedure, its events are the instructions at its entry (its `nm`
//! symbol) that follow a call instruction (`objdump`) or an instruction
//! outside its symbol's range (a tail call, a callback), counted in the
//! regenerated instruction trace (itself checked against valgrind lackey
//! by `trace_oracle`); events nest per track; the top-level durations of
//! each thread sum to its instruction count by `aetrace regen --count`;
//! every thread (fork children too) has its track. A bad trace path: one
//! line, non-zero exit.

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::build::{build, run_checked, Link, Opt, Variant};
use common::recorded::{record_ok, Knobs};

/// Fixed addresses, so that `nm` and `objdump` name the traced ones.
const O2_NO_PIE: Variant = Variant::new(Opt::O2, Link::NoPie, false);

/// A complete event: (name, ts, dur, tid).
type Event = (String, u64, u64, u64);

fn output(cmd: &mut Command, what: &str) -> String {
    String::from_utf8(run_checked(cmd, what).stdout).unwrap()
}

/// `source` built and recorded: the executable, the trace and its timeline
/// (X events, and the tracks named).
fn timeline(source: &str) -> (PathBuf, PathBuf, Vec<Event>, HashSet<u64>) {
    let exe = build(source, O2_NO_PIE);
    let (_, trace, _) = record_ok(&exe, &[], &[], Knobs::DEFAULT);
    let json = trace.with_extension("timeline.json");
    run_checked(
        Command::new(common::aetrace())
            .args(["timeline", "-o"])
            .arg(&json)
            .arg(&trace),
        "aetrace timeline",
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let (mut events, mut tracks) = (Vec::new(), HashSet::new());
    for e in v["traceEvents"].as_array().unwrap() {
        let tid = e["tid"].as_u64().unwrap();
        match e["ph"].as_str().unwrap() {
            "X" => events.push((
                e["name"].as_str().unwrap().to_owned(),
                e["ts"].as_u64().unwrap(),
                e["dur"].as_u64().unwrap(),
                tid,
            )),
            "M" => assert!(tracks.insert(tid), "track {tid} named twice"),
            ph => panic!("unexpected event kind {ph}"),
        }
    }
    (exe, trace, events, tracks)
}

/// Instructions per thread by `aetrace regen --count` ("thread N ...: M
/// instructions" lines, one per thread and module).
fn counts(trace: &Path) -> BTreeMap<u64, u64> {
    let out = common::regen::count(trace);
    let mut n = BTreeMap::new();
    for l in out.lines().filter(|l| l.starts_with("thread ")) {
        let tid = l.split_whitespace().nth(1).unwrap().parse().unwrap();
        let insns = l.rsplit(": ").next().unwrap().split(' ').next().unwrap();
        *n.entry(tid).or_default() += insns.parse::<u64>().unwrap();
    }
    n
}

/// Checks that the events of each track nest (each within the one open
/// around it) and that its top-level events cover `counts` instructions.
fn check_tracks(events: &[Event], counts: &BTreeMap<u64, u64>) {
    let mut by_tid: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for e in events {
        by_tid.entry(e.3).or_default().push((e.1, e.1 + e.2));
    }
    let tracks: Vec<u64> = by_tid.keys().copied().collect();
    assert_eq!(tracks, counts.keys().copied().collect::<Vec<_>>());
    for (tid, mut spans) in by_tid {
        // Outer first: by start, then longest.
        spans.sort_by_key(|&(s, e)| (s, std::cmp::Reverse(e)));
        let (mut open, mut top): (Vec<u64>, u64) = (Vec::new(), 0);
        for (s, e) in spans {
            assert!(e > s, "thread {tid}: empty event at {s}");
            while open.last().is_some_and(|&end| end <= s) {
                open.pop();
            }
            match open.last() {
                Some(&end) => assert!(e <= end, "thread {tid}: [{s}, {e}) overlaps its parent"),
                None => top += e - s,
            }
            open.push(e);
        }
        assert_eq!(top, counts[&tid], "thread {tid}: top-level durations");
    }
}

/// Thread 0's instruction addresses, as `aetrace regen` writes them.
fn insns(trace: &Path) -> Vec<u64> {
    output(
        Command::new(common::aetrace())
            .args(["regen", "--thread", "0", "--format", "insn"])
            .arg(trace),
        "aetrace regen",
    )
    .lines()
    .filter(|l| !l.starts_with('#'))
    .map(|l| u64::from_str_radix(l, 16).unwrap())
    .collect()
}

/// The executable's functions by `nm -S`: (start, size, name).
fn symbols(exe: &Path) -> Vec<(u64, u64, String)> {
    let out = output(Command::new("nm").arg("-S").arg(exe), "nm");
    out.lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [a, s, "t" | "T", name] => Some((
                u64::from_str_radix(a, 16).unwrap(),
                u64::from_str_radix(s, 16).unwrap(),
                name.to_owned(),
            )),
            _ => None,
        })
        .collect()
}

/// The addresses of the executable's call instructions by `objdump -d`.
fn call_sites(exe: &Path) -> HashSet<u64> {
    let out = output(Command::new("objdump").arg("-d").arg(exe), "objdump");
    out.lines()
        .filter(|l| l.contains("\tcall"))
        .filter_map(|l| u64::from_str_radix(l.split(':').next()?.trim(), 16).ok())
        .collect()
}

#[test]
fn recursion_calls_nest_and_cover_the_run() {
    let (exe, trace, events, tracks) = timeline("recursion.c");
    let counts = counts(&trace);
    assert_eq!(tracks, counts.keys().copied().collect());
    check_tracks(&events, &counts);
    let addrs = insns(&trace);
    let (syms, calls) = (symbols(&exe), call_sites(&exe));
    let mut expected: HashMap<&str, u64> = HashMap::new();
    for (p, &b) in addrs.iter().enumerate() {
        let Some((start, size, name)) = syms.iter().find(|s| s.0 == b) else {
            continue;
        };
        let entered = match p.checked_sub(1).map(|q| addrs[q]) {
            None => true,
            Some(a) => calls.contains(&a) || !(*start..start + size).contains(&a),
        };
        if entered {
            *expected.entry(name.as_str()).or_default() += 1;
        }
    }
    let mut got: HashMap<&str, u64> = HashMap::new();
    for e in &events {
        *got.entry(e.0.as_str()).or_default() += 1;
    }
    for (name, n) in &expected {
        assert_eq!(got.get(name), Some(n), "events of {name}");
    }
    // The recursion is there: fib(18)'s calls, main among the events.
    assert!(expected["fib"] > 1000 && expected.contains_key("main"));
}

#[test]
fn fork_child_has_its_track() {
    let (_, trace, events, tracks) = timeline("fork.c");
    let counts = counts(&trace);
    assert!(counts.len() >= 2, "fork.c's trace has the child's thread");
    assert_eq!(tracks, counts.keys().copied().collect());
    check_tracks(&events, &counts);
}

#[test]
fn bad_trace_is_one_line() {
    let out = Command::new(common::aetrace())
        .args([
            "timeline",
            "/nonexistent/x.aet",
            "-o",
            "/tmp/aetrace-timeline-never.json",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!Path::new("/tmp/aetrace-timeline-never.json").exists());
}
