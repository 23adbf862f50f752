//! Runs a signal ends (issue 23, point 2): `traces/crash.c` dying of
//! SIGSEGV, SIGFPE, SIGABRT, and of SIGKILL at ten random moments. Each
//! recording exits with the native status (the same signal) and output;
//! each trace regenerates, `-j 1` and cut into pieces alike, to a prefix
//! of lackey's run of the same program (for SIGKILL, of the full run
//! without the kill), reaching the last point the witnesses determine;
//! `regen` and `info` say which signal ended the run.

use crate::common;
use crate::trace_oracle::module_sequences;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use common::build::{build, run_native, Link, Opt, Variant};
use common::lackey::{self, Capture, LogMode};
use common::recorded::{info_json, record_run, Knobs};

const O2_PIE: Variant = Variant::new(Opt::O2, Link::Pie, false);

/// Lackey's instruction sequence of `exe args` in the executable and the
/// regenerated one of `trace` (link-time offsets, one thread).
fn sequences(exe: &Path, args: &[&str], trace: &Path) -> (Vec<u64>, Vec<u64>) {
    let run = lackey::run_with(
        exe,
        args,
        &[exe.to_path_buf()],
        "*",
        LogMode::Pipe,
        Capture::Sequences,
    );
    let (_, mut lk, mut rg) = module_sequences(
        "crash",
        exe,
        &info_json(trace),
        0,
        &run.modules[0],
        trace,
        None,
    );
    (lk.swap_remove(0), rg.swap_remove(0))
}

/// Records `exe args`: the program's output and death by `signal` are the
/// native ones; `regen` and `info` name the signal. The trace.
fn record_killed(exe: &Path, args: &[&str], signal: i32) -> std::path::PathBuf {
    let native = run_native(exe, args);
    assert_eq!(
        native.status.signal(),
        Some(signal),
        "{args:?}: native status"
    );
    let (name, trace, rec) = record_run(exe, args, &[], Knobs::DEFAULT);
    assert_eq!(rec.status.signal(), Some(signal), "{name}: recorded status");
    assert_eq!(rec.stdout, native.stdout, "{name}: stdout");
    let said = format!("was killed by signal {signal} (");
    let regen = Command::new(common::aetrace())
        .args(["regen", "--format", "block"])
        .arg(&trace)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&regen.stderr);
    assert!(
        regen.status.success() && stderr.contains(&said),
        "{name}: regen: {stderr}"
    );
    let info = Command::new(common::aetrace())
        .arg("info")
        .arg(&trace)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(text.contains(&said), "{name}: info: {text}");
    trace
}

fn assert_prefix(name: &str, lk: &[u64], rg: &[u64]) {
    assert!(!rg.is_empty(), "{name}: empty trace");
    let d = lk.iter().zip(rg).position(|(a, b)| a != b);
    assert!(
        d.is_none() && rg.len() <= lk.len(),
        "{name}: not a prefix of lackey's run: first difference at {d:?} (lackey {}, regen {})",
        lk.len(),
        rg.len()
    );
}

#[test]
fn faults_and_abort_regenerate_to_a_prefix_of_the_run() {
    let exe = build("crash.c", O2_PIE);
    for (how, signal) in [("segv", 11), ("fpe", 8), ("abort", 6)] {
        let trace = record_killed(&exe, &[how], signal);
        let (lk, rg) = sequences(&exe, &[how], &trace);
        assert_prefix(how, &lk, &rg);
        eprintln!(
            "{how}: regenerated {} of lackey's {} instructions",
            rg.len(),
            lk.len()
        );
        let _ = std::fs::remove_file(&trace);
    }
}

/// The pid of `parent`'s first child, once it has one.
fn child_of(parent: u32) -> u32 {
    let path = format!("/proc/{parent}/task/{parent}/children");
    for _ in 0..2000 {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if let Some(pid) = text.split_whitespace().next() {
            return pid.parse().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
    panic!("aetrace record {parent} started no program");
}

/// The program killed from outside after a random delay within its
/// 100 ms run: it has no chance to write anything, and its trace ends at
/// the last point its witnesses determine, a prefix of the full run's.
#[test]
fn sigkill_at_ten_random_moments() {
    let exe = build("crash.c", O2_PIE);
    let full = record_run(&exe, &["sleep"], &[], Knobs::DEFAULT).1;
    let (lk, _) = sequences(&exe, &["sleep"], &full);
    let _ = std::fs::remove_file(&full);
    let mut x = u64::from(std::process::id()) | 1;
    let mut lengths = Vec::new();
    for k in 0..10 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let delay = std::time::Duration::from_micros(x % 110_000);
        let trace = common::scratch("crashes").join(format!("kill-{}-{k}.aet", std::process::id()));
        let mut rec = Command::new(common::aetrace())
            .arg("record")
            .arg("-o")
            .arg(&trace)
            .arg("--")
            .arg(&exe)
            .arg("sleep")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let child = child_of(rec.id());
        std::thread::sleep(delay);
        // SAFETY: a signal to a process this test started.
        unsafe { libc::kill(child as i32, libc::SIGKILL) };
        let status = rec.wait().unwrap();
        let name = format!("killed after {delay:?}");
        if status.success() {
            // The run ended first: nothing to check.
            continue;
        }
        assert_eq!(status.signal(), Some(9), "{name}: recorded status");
        let early = Command::new(common::aetrace())
            .args(["regen", "--format", "insn"])
            .arg(&trace)
            .output()
            .unwrap();
        if String::from_utf8_lossy(&early.stderr).contains("before its traced code started") {
            // Killed before the runtime registered a module: an empty prefix.
            lengths.push(0);
            let _ = std::fs::remove_file(&trace);
            continue;
        }
        let rg = crate::trace_oracle::regen_threads(&trace, None).swap_remove(0);
        assert_prefix(&name, &lk, &rg);
        lengths.push(rg.len());
        let _ = std::fs::remove_file(&trace);
    }
    eprintln!(
        "regenerated prefixes {lengths:?} of the full run's {}",
        lk.len()
    );
    assert!(
        lengths.len() >= 5,
        "most kills landed inside the run: {lengths:?}"
    );
}
