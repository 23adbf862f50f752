//! Asynchronous signals while recursions unwind (issue 23 point 3;
//! `docs/regen.md` section 3a, "The transfer count"): a 20 us interval
//! timer interrupts `traces/unwind_signals.c`'s direct, mutual and
//! tail-calling recursions, a procedure run twice without a call between
//! (`call mix; jmp mix`) and a comparator that calls qsort again. Returns
//! wrote nothing before every `ret` became a counted transfer, so a signal
//! in a return chain's blocks could not be placed: every one of ten
//! recordings was refused ("the trace cannot tell which time was
//! interrupted"). Valgrind delivers timer signals at its own points, but
//! the handler changes nothing outside it, so the trace minus the
//! handler's instructions must equal lackey's run without the timer,
//! instruction for instruction; with the handler calling `mix` too (which
//! the interrupted code may be running), the program's own counts are the
//! oracle.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::build::{build, Link, Opt, Variant};
use common::lackey::{self, Capture, LogMode};
use common::recorded::{info_json, instrumented_modules, record_ok, Knobs};

/// Rounds of the program's workload: about 10,000 instructions each.
const ROUNDS: &str = "100";

/// The link-time offsets `[start, end)` of symbol `sym` of `exe`.
pub(crate) fn symbol_range(exe: &Path, sym: &str) -> (u64, u64) {
    let out = Command::new("nm").arg("-S").arg(exe).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let size = text
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[3] == sym).then(|| u64::from_str_radix(f[1], 16).unwrap())
        })
        .unwrap_or_else(|| panic!("no sized symbol {sym} in {}", exe.display()));
    let start = crate::trace_oracle::symbol(exe, sym);
    (start, start + size)
}

/// The value of `key=N` in a program's output.
fn field(stdout: &[u8], key: &str) -> u64 {
    let s = String::from_utf8_lossy(stdout);
    common::count_in(&s, key).unwrap_or_else(|| panic!("no {key} in {s:?}"))
}

/// SIGNAL records `aetrace regen --count` placed in `trace`.
fn signals_placed(trace: &Path) -> u64 {
    let text = common::regen::count(trace);
    let line = text.lines().next().unwrap_or_default();
    let at = line.find(" signals (").map_or(0, |i| i);
    let n = line[..at].rsplit(' ').next().unwrap_or_default();
    n.parse()
        .unwrap_or_else(|_| panic!("no signal count in {line:?}"))
}

/// `runs` recordings of `exe` under the timer, each equal to lackey's run
/// without it once `on_alarm`'s instructions are taken out.
fn exact_without_handler(exe: &Path, runs: usize) {
    let handler = symbol_range(exe, "on_alarm");
    let mut oracle = None;
    for _ in 0..runs {
        let (name, trace, rec) = record_ok(exe, &["20", "0", ROUNDS], &[], Knobs::DEFAULT);
        let info = info_json(&trace);
        let run = oracle.get_or_insert_with(|| {
            let modules = instrumented_modules(&info);
            let args = ["0", "0", ROUNDS];
            lackey::run_with(exe, &args, &modules, LogMode::Pipe, Capture::Sequences)
        });
        for key in ["s=", "mixes="] {
            assert_eq!(
                field(&rec.stdout, key),
                field(&run.stdout, key),
                "{name}: {key}"
            );
        }
        let handled = field(&rec.stdout, "handled=");
        assert!(handled > 0, "{name}: no signal");
        assert_eq!(
            signals_placed(&trace),
            handled,
            "{name}: SIGNAL records placed"
        );
        let (name, lk, mut rg) = crate::trace_oracle::module_sequences(
            &name,
            exe,
            &info,
            0,
            &run.modules[0],
            &trace,
            None,
        );
        rg[0].retain(|a| !(handler.0..handler.1).contains(a));
        if let Some(d) = crate::trace_oracle::first_difference(&lk[0], &rg[0]) {
            panic!("{name}: {d}");
        }
        eprintln!(
            "{name}: {handled} signals, {} instructions equal",
            lk[0].len()
        );
        let _ = std::fs::remove_file(&trace);
    }
}

/// Entries of procedure `sym` in `trace`'s blocks.
fn entries(exe: &Path, trace: &Path, sym: &str) -> u64 {
    let out = Command::new(common::aetrace())
        .args(["regen", "--format", "block", "--relative"])
        .arg(trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let at = format!("{:x} ", crate::trace_oracle::symbol(exe, sym));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with(&at))
        .count() as u64
}

#[test]
fn signals_in_unwinding_recursions_equal_lackey() {
    for (opt, runs) in [(Opt::O2, 3), (Opt::O0, 2), (Opt::O1, 2), (Opt::O3, 2)] {
        exact_without_handler(
            &build("unwind_signals.c", Variant::new(opt, Link::Pie, false)),
            runs,
        );
    }
}

/// The handler calls `mix`, which the code it interrupted may be running:
/// each run of `mix` and of the handler is in the trace, as the program
/// counted them.
#[test]
fn a_handler_calling_the_interrupted_procedure() {
    for opt in [Opt::O2, Opt::O0] {
        let exe = build("unwind_signals.c", Variant::new(opt, Link::Pie, false));
        let (name, trace, rec) = record_ok(&exe, &["20", "1", ROUNDS], &[], Knobs::DEFAULT);
        let handled = field(&rec.stdout, "handled=");
        assert!(handled > 0, "{name}: no signal");
        assert_eq!(
            entries(&exe, &trace, "on_alarm"),
            handled,
            "{name}: handler entries"
        );
        assert_eq!(
            entries(&exe, &trace, "mix"),
            field(&rec.stdout, "mixes="),
            "{name}: mix entries"
        );
        let _ = std::fs::remove_file(&trace);
    }
}
