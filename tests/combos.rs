//! The combinations real programs make (issue 23, point 3), each exact:
//! `traces/combo.c` (qsort and bsearch comparators, a SIGUSR1 handler for
//! signals raised inside a recursion, setjmp with longjmp out of that
//! recursion from the recursion and from the handler, an atexit handler,
//! exit() from deep recursion) at -O0 to -O3, dynamic against lackey
//! (`common::exact`), static against the native single-stepped run
//! (`trace_oracle::check_static`: valgrind changes static glibc's path).
//! Each program's own counts and status must equal the native run's
//! (`record_checked`).

use crate::common;

use common::build::{build, Link, Opt, Variant};
use common::recorded::{record_checked, Knobs};

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
