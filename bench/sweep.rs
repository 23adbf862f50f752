//! `bench/run sweep` (issue 23, point 5): thirty-odd Debian programs doing
//! small real work, each recorded and compared instruction by instruction,
//! module by module, with an oracle sharing none of our code (valgrind
//! lackey, or the native run single-stepped under ptrace where valgrind
//! changes the program's path): the list and the comparison are the test
//! harness's (`tests/common/sweep.rs`), whose fastest few are the `sweep`
//! test topic. Per program: each traced module's instructions (ours, the
//! oracle's), equal or the first difference, the procedures left alone
//! and why, record and oracle seconds. A program not installed is skipped
//! with a line. Exits 1 if any program is not exact (different, or with
//! instructions run in procedures left alone). `ONLY=a,b` runs the
//! programs whose names contain `a` or `b`.

#[path = "../tests/common/bench.rs"]
mod bench;
#[path = "../tests/common/mod.rs"]
#[allow(dead_code)]
mod common;

use std::io::Write;

use common::sweep::{programs, sweep_one, Oracle, Outcome, Program};

fn main() {
    let only = bench::only();
    println!(
        "The sweep: real programs against lackey or their single-stepped native run \
         ({}, {})",
        bench::machine(),
        String::from_utf8_lossy(
            &std::process::Command::new("date")
                .arg("-u")
                .output()
                .map(|o| o.stdout)
                .unwrap_or_default()
        )
        .trim()
    );
    let dir = common::scratch("sweep-bench");
    let (mut not_exact, mut swept) = (Vec::new(), 0);
    for prog in programs(&dir.join("inputs")) {
        if !bench::selected(&only, prog.name) {
            continue;
        }
        if let Some(why) = prog.missing() {
            println!("{:12} skipped: {why}", prog.name);
            continue;
        }
        let out = sweep_one(&prog, &dir);
        swept += 1;
        report(&prog, &out);
        if !out.exact() {
            not_exact.push(prog.name);
        }
        let _ = std::io::stdout().flush();
    }
    if swept == 0 {
        println!("no program selected and installed");
        std::process::exit(1);
    } else if not_exact.is_empty() {
        println!("every one of {swept} programs exact");
    } else {
        println!("not exact: {}", not_exact.join(", "));
        std::process::exit(1);
    }
}

fn report(prog: &Program, out: &Outcome) {
    let oracle = match prog.oracle {
        Oracle::Lackey => "lackey",
        Oracle::Stepped => "stepped",
    };
    let verdict = match (&out.verdict, out.exact()) {
        (Ok(()), true) => "exact".to_string(),
        (Ok(()), false) => "equal, but instructions ran in procedures left alone".to_string(),
        (Err(e), _) => format!("NOT EQUAL: {e}"),
    };
    println!(
        "{:12} {oracle:7} record {:6.1} s  oracle {:6.1} s  {verdict}",
        prog.name, out.record_seconds, out.oracle_seconds
    );
    for (m, ours) in &out.modules {
        println!(
            "{:12}   {:40} ours {:>11}  oracle {:>11}  equal {:>11}  in procedures left alone {}",
            "",
            m.path.display(),
            ours,
            m.compared + m.untraced,
            m.compared,
            m.untraced
        );
    }
    for line in out.left_alone_report() {
        println!("{:12}     {line}", "");
    }
}
