//! Exactness at the sizes of issue 4: each of its workloads (gzip, and
//! bzip2 with libbz2, on 20 kB and 2 MB; xz with liblzma on 20 kB and
//! 2 MB; sort on 100,000 lines) is recorded, the recorded run's stdout,
//! stderr and status checked against the native run's, and the trace
//! compared with valgrind lackey instruction by instruction, module by
//! module, by the tests' streaming comparison (`tests/common/exact.rs`).
//! Prints each module's count of equal instructions and lackey's time;
//! exits 1 at the first difference, naming it.
//!
//! Lackey writes one log line per instruction and per data access with a
//! system call of its own (about 1.7 million lines a second here): xz's
//! 4.65 billion instructions took 72 minutes, which is why this is a bench
//! (`bench/run exactness`) and not a CI test. `ONLY=a,b` runs the
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

use common::recorded::{issue_workloads, record_checked, Knobs};

fn main() {
    let only = bench::only();
    println!(
        "Traces against valgrind lackey, instruction by instruction ({})",
        bench::machine()
    );
    println!(
        "{:16} {:44} {:>15} {:>9} {:>9}",
        "workload", "module", "equal insns", "untraced", "lackey s"
    );
    let mut total = 0u64;
    for w in issue_workloads() {
        let name = w.name;
        if !bench::selected(&only, name) {
            continue;
        }
        let (exe, args) = (Path::new(w.exe), w.args());
        let (_, trace) = record_checked(exe, &args, w.libs, Knobs::DEFAULT);
        let start = Instant::now();
        let compared = common::exact::against_lackey(&trace, exe, &args);
        let seconds = start.elapsed().as_secs_f64();
        let _ = std::fs::remove_file(&trace);
        match compared {
            Ok(c) if c.status.success() => {
                for m in &c.modules {
                    println!(
                        "{name:16} {:44} {:>15} {:>9} {seconds:>9.1}",
                        m.path.display(),
                        m.compared,
                        m.untraced
                    );
                    total += m.compared;
                }
            }
            Ok(c) => {
                println!("{name}: the program under lackey ended with {}", c.status);
                std::process::exit(1);
            }
            Err(e) => {
                println!("{name}: DIFFERENT: {e}");
                std::process::exit(1);
            }
        }
        let _ = std::io::stdout().flush();
    }
    println!("all equal: {total} instructions");
}
