//! The combinations real programs make (issue 23, point 3), each exact:
//! `traces/combo.c` (qsort and bsearch comparators, a SIGUSR1 handler for
//! signals raised inside a recursion, setjmp with longjmp out of that
//! recursion from the recursion and from the handler, an atexit handler,
//! exit() from deep recursion) at -O0 to -O3, dynamic against lackey
//! (`common::exact`), static against the native single-stepped run
//! (`trace_oracle::check_static`: valgrind changes static glibc's path).
//! `traces/combo_cxx.cpp` adds C++ exceptions thrown from comparators
//! through libc's qsort and std::sort (dynamic only: single-stepping a
//! static libstdc++ program takes minutes); `traces/combo_async.c` interval
//! timer signals (setitimer, ualarm) with siglongjmp out of a recursion
//! calling qsort, checked against the program's own counts (valgrind
//! delivers timer signals at its own points). Each program's own counts
//! and status must equal the native run's (`record_checked`).

use crate::common;

use common::build::{build, Link, Opt, Variant};
use common::recorded::{record_checked, record_ok, Knobs};

/// `exe` recorded with its native output and status, then equal to lackey
/// instruction for instruction in every traced module.
fn exact_dynamic(exe: &std::path::Path, args: &[&str]) {
    let (name, trace) = record_checked(exe, args, &[], Knobs::DEFAULT);
    let compared =
        common::exact::against_lackey(&trace, exe, args).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(
        compared.modules.iter().all(|m| m.compared > 0),
        "{name}: {:?}",
        compared.modules
    );
    let _ = std::fs::remove_file(&trace);
}

/// gcc -O1 marks main's setjmp call (the program has callbacks), so a
/// longjmp lands where its RETURN is written again; before, regen refused
/// the trace ("RETURN ... cannot occur in procedure main after block ...").
#[test]
fn callbacks_signals_longjmp_atexit_exit_dynamic() {
    for opt in [Opt::O0, Opt::O1, Opt::O2, Opt::O3] {
        exact_dynamic(&build("combo.c", Variant::new(opt, Link::Pie, false)), &[]);
    }
}

#[test]
fn callbacks_signals_longjmp_atexit_exit_static() {
    for opt in [Opt::O1, Opt::O3] {
        crate::trace_oracle::check_static(
            &build("combo.c", Variant::new(opt, Link::Static, false)),
            &[],
        );
    }
}

#[test]
fn cxx_exceptions_through_callbacks_dynamic() {
    for opt in [Opt::O0, Opt::O2] {
        exact_dynamic(
            &build("combo_cxx.cpp", Variant::new(opt, Link::Pie, false)),
            &[],
        );
    }
}

/// Timer signals anywhere: the trace regenerates (`-j 1` and in pieces
/// alike) with one handler entry per signal the program counted; 20
/// recordings at -O2, 2 at each other level, 1 static (about 0.8 s of CPU
/// each).
///
/// Before every `ret` was a counted transfer, about one -O2 run in ten was
/// refused: a SIGALRM that lands while `work`'s recursion unwinds (`call
/// work` returning into `jmp` to the epilogue's `ret`, ten frames, no
/// witness and no counted transfer on the way) has a rip in a block the
/// thread ran up to ten times since its last item ("the trace cannot tell
/// which time was interrupted"; docs/regen.md section 3a, "The transfer
/// count"; `unwinding::` makes such signals land often).
#[test]
fn timer_signals_with_siglongjmp() {
    let runs = [
        (Opt::O2, Link::Pie, 20),
        (Opt::O0, Link::Pie, 2),
        (Opt::O1, Link::Pie, 2),
        (Opt::O3, Link::Pie, 2),
        (Opt::O0, Link::Static, 1),
    ];
    for (opt, link, n) in runs {
        let exe = build("combo_async.c", Variant::new(opt, link, false));
        for _ in 0..n {
            timer_run(&exe);
        }
    }
}

/// One recording of `traces/combo_async.c` against its own counts.
fn timer_run(exe: &std::path::Path) {
    let (name, trace, rec) = record_ok(exe, &[], &[], Knobs::DEFAULT);
    let stdout = String::from_utf8_lossy(&rec.stdout);
    let ticks = common::count_in(&stdout, "ticks=").expect("ticks=");
    assert!(
        stdout.starts_with("ticks>=60 1 jumps>0 1 handled_alarm 1\n"),
        "{name}: {stdout}"
    );
    let threads = crate::trace_oracle::regen_threads(&trace, None);
    let handler = crate::trace_oracle::symbol(exe, "on_alarm");
    let entries = threads[0].iter().filter(|&&a| a == handler).count() as u64;
    assert_eq!(
        entries,
        ticks + 1,
        "{name}: handler entries (ticks and the alarm)"
    );
    let _ = std::fs::remove_file(&trace);
}
