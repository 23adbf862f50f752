//! C++ exceptions through the relocated code (`rewrite::unwind`, `lsda`):
//! `traces/cxx_exceptions.cpp` and `traces/cxx_unwind_deep.cpp` (throws
//! through many frames with destructors, catches at several depths,
//! rethrow, `catch (...)`, recursion, a throw from a handler, a
//! function-try-block, `std::exception_ptr`) built with g++ -O0 and -O2,
//! PIE and non-PIE, instrumented by the `aetrace` binary and run with
//! `AETRACE_OUT` set. Oracles: the program's own output (stdout, stderr and
//! exit status equal the native run's; without the new unwind tables the
//! first throw through a copy ends in `std::terminate`), and binutils:
//! `readelf --debug-dump=frames` reads the output without a warning and
//! finds a new FDE with an LSDA for every original one at -O0 (every
//! procedure with handlers runs as a traced copy) and for at least half of
//! them at -O2 (see `check`).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::build::{build, Link, Opt, Variant};

const VARIANTS: [Variant; 3] = [
    Variant::new(Opt::O0, Link::Pie, false),
    Variant::new(Opt::O2, Link::Pie, false),
    Variant::new(Opt::O2, Link::NoPie, false),
];

fn run(exe: &Path, trace: Option<&Path>) -> Output {
    let mut cmd = Command::new(exe);
    cmd.stdin(Stdio::null());
    if let Some(t) = trace {
        cmd.env("AETRACE_OUT", t);
    }
    cmd.output()
        .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()))
}

/// `(FDEs, FDEs with an LSDA)` as readelf lists them; panics on any
/// warning or error readelf prints.
fn readelf_fdes(path: &Path) -> (usize, usize) {
    let out = Command::new("readelf")
        .args(["--debug-dump=frames", "-W"])
        .arg(path)
        .output()
        .expect("running readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.trim().is_empty(),
        "readelf {}: {err}",
        path.display()
    );
    assert!(
        !text.to_lowercase().contains("warning"),
        "readelf {}: {}",
        path.display(),
        text.lines()
            .filter(|l| l.to_lowercase().contains("warning"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let (mut fdes, mut with_lsda, mut in_fde) = (0, 0, false);
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() >= 4 && words[0].len() == 8 && u64::from_str_radix(words[0], 16).is_ok() {
            in_fde = words[3] == "FDE";
            fdes += usize::from(in_fde);
        } else if let Some(d) = line.trim().strip_prefix("Augmentation data:") {
            if in_fde && !d.trim().is_empty() {
                with_lsda += 1;
            }
        }
    }
    (fdes, with_lsda)
}

/// `[start, end)` of each executable `PT_LOAD`, from `readelf -lW`.
fn readelf_exec_loads(path: &Path) -> Vec<(u64, u64)> {
    let out = Command::new("readelf")
        .arg("-lW")
        .arg(path)
        .output()
        .expect("running readelf");
    let hex = |w: &str| u64::from_str_radix(w.trim_start_matches("0x"), 16).unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.first() == Some(&"LOAD") && l.contains(" E "))
                .then(|| (hex(w[2]), hex(w[2]) + hex(w[5])))
        })
        .collect()
}

fn check(source: &str, v: Variant) {
    let exe = build(source, v);
    let name = format!("{source} ({})", v.tag());
    let dir = common::scratch("rewrite-unwind");
    let stem = exe.file_name().unwrap().to_string_lossy().into_owned();
    let ins = dir.join(format!("{stem}.ins"));
    let inst = Command::new(common::aetrace())
        .arg("instrument")
        .arg(&exe)
        .arg("-o")
        .arg(&ins)
        .output()
        .unwrap();
    assert!(
        inst.status.success(),
        "{name}: instrument failed: {}",
        String::from_utf8_lossy(&inst.stderr)
    );
    let native = run(&exe, None);
    assert!(native.status.success(), "{name}: the native run fails");
    let trace = dir.join(format!("{stem}-{}.raw", std::process::id()));
    let traced = run(&ins, Some(&trace));
    let _ = std::fs::remove_file(&trace);
    assert_eq!(
        String::from_utf8_lossy(&traced.stderr),
        String::from_utf8_lossy(&native.stderr),
        "{name}: stderr differs"
    );
    assert_eq!(
        String::from_utf8_lossy(&traced.stdout),
        String::from_utf8_lossy(&native.stdout),
        "{name}: stdout differs"
    );
    assert_eq!(
        traced.status.code(),
        native.status.code(),
        "{name}: status differs"
    );

    let (old_fdes, old_lsda) = readelf_fdes(&exe);
    let (all_fdes, all_lsda) = readelf_fdes(&ins);
    assert!(old_lsda > 0, "{name}: no LSDA in the original");
    assert!(all_fdes > old_fdes, "{name}: no FDE for the copies");
    // The landing pads readelf and an independent LSDA decoder find: the
    // original ones (re-emitted FDEs) plus new ones, all in the copies.
    let old_pads = common::lsda::landing_pads(&exe);
    let all_pads = common::lsda::landing_pads(&ins);
    let copies_start = readelf_exec_loads(&ins)
        .into_iter()
        .filter(|&(start, _)| start >= readelf_exec_loads(&exe).iter().map(|l| l.1).max().unwrap())
        .map(|l| l.0)
        .min()
        .expect("an executable segment above the original image");
    assert!(
        old_pads.iter().all(|p| all_pads.contains(p)),
        "{name}: original landing pads lost"
    );
    let new_pads: Vec<u64> = all_pads.difference(&old_pads).copied().collect();
    assert!(!new_pads.is_empty(), "{name}: no landing pad in the copies");
    assert!(
        new_pads.iter().all(|&p| p >= copies_start),
        "{name}: new landing pads outside the copies: {new_pads:x?}"
    );
    let new_lsda = all_lsda - old_lsda;
    eprintln!(
        "{name}: {} new FDEs, {new_lsda} of {old_lsda} LSDAs translated",
        all_fdes - old_fdes
    );
    if v.opt == Opt::O0 {
        assert_eq!(
            new_lsda, old_lsda,
            "{name}: procedures with handlers left alone"
        );
    } else {
        // At -O2 a function whose `.cold` part lies below it is discovered
        // as one procedure with two entries and left alone (docs/cfg.md);
        // the others must be translated.
        assert!(
            new_lsda * 2 >= old_lsda,
            "{name}: only {new_lsda} of {old_lsda} LSDAs translated"
        );
    }
}

/// Our LSDA reader (`aetrace_analysis::lsda`) finds exactly the landing pads
/// the independent one (`common::lsda`: readelf + a separate decoder) does,
/// on our programs and on the machine's libstdc++.
#[test]
fn landing_pads_match_an_independent_reader() {
    let mut files: Vec<PathBuf> = ["cxx_exceptions.cpp", "cxx_unwind_deep.cpp"]
        .iter()
        .flat_map(|s| VARIANTS.map(|v| build(s, v)))
        .collect();
    files.push(PathBuf::from("/usr/lib/x86_64-linux-gnu/libstdc++.so.6"));
    for file in files {
        let module = aetrace_analysis::elf::Module::open(&file).unwrap();
        let ours: std::collections::BTreeSet<u64> = aetrace_analysis::lsda::landing_pads(&module)
            .unwrap()
            .into_values()
            .flatten()
            .collect();
        let theirs: std::collections::BTreeSet<u64> =
            common::lsda::landing_pads(&file).into_iter().collect();
        assert!(!theirs.is_empty(), "{}: no landing pads", file.display());
        assert_eq!(ours, theirs, "{}", file.display());
    }
}

#[test]
fn cxx_exceptions_through_copies() {
    for v in VARIANTS {
        check("cxx_exceptions.cpp", v);
    }
}

#[test]
fn deep_unwinding_through_copies() {
    for v in VARIANTS {
        check("cxx_unwind_deep.cpp", v);
    }
}
