//! Exactness at the sizes of issues 4 and 21: each of their workloads
//! (gzip, and bzip2 with libbz2, on 20 kB and 2 MB; xz with liblzma on
//! 20 kB and 2 MB; sort on 100,000 lines) is recorded twice, control only
//! and with `--data`, each recorded run's stdout, stderr and status
//! checked against the native run's, and each trace compared with
//! valgrind lackey by the tests' streaming comparisons: instruction by
//! instruction, module by module (`tests/common/exact.rs`), and for the
//! data trace reference by reference (`tests/common/exact_data.rs`).
//! Prints the counts compared and lackey's time; exits 1 at the first
//! difference, naming it. `DATA=0` skips the data traces.
//!
//! Lackey writes one log line per instruction and per data access with a
//! system call of its own (about 1.7 million lines a second here): xz's
//! 4.65 billion instructions took 72 minutes, which is why this is a bench
//! (`bench/run exactness`) and not a CI test; with `--trace-mem=yes` it
//! writes a line per data reference too. `ONLY=a,b` runs the
//! workloads whose names contain `a` or `b` (e.g. `ONLY=20kB,sort`).

// The tests' harness, of which the bench needs the recording and the
// streaming comparison only.
#[path = "../tests/common/bench.rs"]
mod bench;
#[path = "../tests/common/mod.rs"]
#[allow(dead_code)]
mod common;

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use common::recorded::{issue_workloads, record_checked, Knobs, Workload};

fn main() {
    let only = bench::only();
    let data = std::env::var("DATA").map_or(true, |v| v != "0");
    println!(
        "Traces against valgrind lackey, instruction by instruction, and data traces reference by reference ({})",
        bench::machine()
    );
    println!(
        "{:16} {:44} {:>15} {:>15} {:>9} {:>9}",
        "workload", "module", "equal insns", "equal refs", "untraced", "lackey s"
    );
    let (mut insns, mut refs) = (0u64, 0u64);
    for w in issue_workloads() {
        if !bench::selected(&only, w.name) {
            continue;
        }
        insns += control(&w);
        if data {
            let (i, r) = with_data(&w);
            insns += i;
            refs += r;
        }
        let _ = std::io::stdout().flush();
    }
    println!("all equal: {insns} instructions, {refs} data references");
}

/// The control-only trace of `w` against lackey; the instructions compared.
fn control(w: &Workload) -> u64 {
    let (exe, args) = (Path::new(w.exe), w.args());
    let (_, trace) = record_checked(exe, &args, w.libs, Knobs::DEFAULT);
    let start = Instant::now();
    let compared = common::exact::against_lackey(&trace, exe, &args);
    let seconds = start.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&trace);
    let c = compared.unwrap_or_else(|e| fail(w, &format!("DIFFERENT: {e}")));
    if !c.status.success() {
        fail(
            w,
            &format!("the program under lackey ended with {}", c.status),
        );
    }
    for m in &c.modules {
        println!(
            "{:16} {:44} {:>15} {:>15} {:>9} {seconds:>9.1}",
            w.name,
            m.path.display(),
            m.compared,
            "",
            m.untraced
        );
    }
    c.modules.iter().map(|m| m.compared).sum()
}

/// The `--data` trace of `w` against lackey with `--trace-mem=yes`; the
/// instructions and references compared.
fn with_data(w: &Workload) -> (u64, u64) {
    let (exe, args) = (Path::new(w.exe), w.args());
    let (_, trace) = record_checked(exe, &args, w.libs, Knobs::DATA);
    let start = Instant::now();
    let compared = common::exact_data::against_lackey(&trace, exe, &args);
    let seconds = start.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&trace);
    let c = compared.unwrap_or_else(|e| fail(w, &format!("data DIFFERENT: {e}")));
    if !c.status.success() {
        fail(
            w,
            &format!("the program under lackey ended with {}", c.status),
        );
    }
    println!(
        "{:16} {:44} {:>15} {:>15} {:>9} {seconds:>9.1}",
        w.name, "(data trace: every traced module)", c.instructions, c.references, ""
    );
    (c.instructions, c.references)
}

fn fail(w: &Workload, why: &str) -> ! {
    println!("{}: {why}", w.name);
    std::process::exit(1);
}
