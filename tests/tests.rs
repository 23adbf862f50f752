//! The end-to-end tests of the `aetrace` binary, one test binary with a
//! module per topic (as ripgrep's `tests/tests.rs`): the shared harness in
//! `common/` (building `traces/`, the valgrind lackey, callgrind and
//! cachegrind oracles, the single-step oracle, the CFG oracle) is compiled
//! once, and the workspace linked once, instead of once per topic.
//!
//! Topics (each file's `//!` says what it checks and against what):
//! - `cachesim`: `aetrace cachesim` against Dinero IV's output, pycachesim
//!   and cachegrind;
//! - `cachesim_regen`: cachegrind's I1 figures for a stream from
//!   `aetrace record` + `aetrace regen`;
//! - `cfg_coverage`: `aetrace cfg` coverage of the machine's stripped
//!   binaries, checked against `objdump -d`;
//! - `cfg_oracle`: recovered CFGs against lackey's executed instructions;
//! - `data_real`: `record --data` of gzip, bzip2, xz and sort against
//!   lackey, reference by reference;
//! - `data_census`: `aetrace census`'s reference forms, weighted by
//!   profiled block counts, against lackey's data references;
//! - `cli_errors`, `record_errors`: bad input, one-line errors, no panic;
//! - `debug`: `aetrace debug` under `gdb -batch` against the regenerated
//!   instruction trace;
//! - `indirect`: procedures with unresolved indirect jumps, traced
//!   through INDIRECT records, against lackey and Debian's mawk
//!   single-stepped;
//! - `faults`: a full disk, a killed recorder, Ctrl-C, concurrent
//!   recordings on one rewrite cache, a damaged cache entry, and the
//!   recorder's limits (threads, execs, forks), against the native run;
//! - `crashes`: runs a signal ends (SIGSEGV, SIGFPE, SIGABRT, SIGKILL),
//!   regenerated to a prefix of lackey's run;
//! - `combos`: programs combining callbacks, signals, longjmp, atexit and
//!   exit, C++ exceptions, at -O0 to -O3, dynamic and static;
//! - `paths`: `aetrace paths` against paths rebuilt from lackey;
//! - `profile`: `aetrace profile` and `count` against callgrind;
//! - `rewrite_elf`: the ELF writer on gcc's programs, read by binutils and
//!   gdb;
//! - `rewrite_unwind`: C++ exceptions through relocated code;
//! - `state_index`: `aetrace index` and `regen -j N` from it, against
//!   `-j 1` without it; damaged and stale indexes ignored;
//! - `stop_at`: `aetrace count --stop-at N` under gdb;
//! - `sweep`: the fastest programs of `bench/run sweep` (Debian programs
//!   doing real work) against lackey and the single-stepped native run;
//! - `trace_oracle`: recorded traces against lackey, instruction by
//!   instruction;
//! - `transparency`: a recorded program sees its native argv, environment,
//!   descriptors and executable's names; `#!` scripts record their
//!   interpreter;
//! - `unwinding`: timer signals in unwinding recursions, against lackey's run
//!   without the timer and the program's counts;
//! - `verify`: `aetrace verify` on exact and broken traces.
//!
//! All topics run in one process, in libtest's threads (one per core, as
//! each topic's binary did): the harness's per-process state is keyed by
//! what it holds (one build of each `traces/` program and variant; one
//! lackey log of each program, arguments and input, `lackey_cache`, which
//! the tests of several topics read: gzip, bzip2 and xz take their 20 kB
//! from one file, `common::text_20k`, for that), and a program built with
//! its own library gets a directory per call (`build::build_with_lib`: one
//! test replaces its library).
//!
//! One topic: `cargo test --release --test tests cfg_oracle::` (a filter
//! is a substring of `topic::test`); one test: `cargo test --release
//! --test tests trace_oracle::loops -- --exact`; all of them: `cargo test
//! --release --test tests`.
//!
//! CI runs everything on 2 cores in under 20 minutes, build included: this
//! binary took 537 s of the suite's 609 s (2026-11-29, `cargo test
//! --workspace --release`, load 2-4). A new test costs seconds; heavier
//! checks go to `bench/`. Each test's time, without rebuilding: run the
//! binary cargo built (`target/*/release/deps/tests-*`) from the
//! repository root with `RUSTC_BOOTSTRAP=1` and `-Z unstable-options
//! --report-time` (libtest's flags; the variable given to cargo instead
//! rebuilds everything).

mod common;

mod cachesim;
mod cachesim_regen;
mod cfg_coverage;
mod cfg_oracle;
mod cli_errors;
mod combos;
mod crashes;
mod data_census;
mod data_real;
mod data_trace;
mod debug;
mod faults;
mod indirect;
mod paths;
mod profile;
mod record_errors;
mod rewrite_elf;
mod rewrite_unwind;
mod state_index;
mod stop_at;
mod sweep;
mod timeline;
mod trace_oracle;
mod transparency;
mod unwinding;
mod verify;
