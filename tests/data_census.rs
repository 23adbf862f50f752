//! `aetrace census` against valgrind lackey (`--trace-mem=yes
//! --vex-guest-chase=no`): each block's static references, weighted by
//! the exact block counts of `aetrace profile`, equal lackey's data
//! references inside the executable, form by form (kind and size). This
//! checks the reference-form table of `analysis::addr::forms` on what gcc
//! emits; the instruction counts must agree first (every executed
//! procedure counted). Programs without `rep` string instructions in the
//! executable: their references depend on iteration counts a profile does
//! not have.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::build::{build, run_checked, Link, Opt, Variant};
use crate::common::{self, lackey};

/// The executable's `(instructions, forms)` from `aetrace census --json`.
fn census(exe: &Path, args: &[&str], tag: &str) -> (u64, BTreeMap<String, u64>) {
    let prof = common::scratch("data_census").join(format!("{tag}.aprof"));
    run_checked(
        Command::new(common::aetrace())
            .arg("profile")
            .arg("-o")
            .arg(&prof)
            .arg("--")
            .arg(exe)
            .args(args),
        "aetrace profile",
    );
    let out = run_checked(
        Command::new(common::aetrace())
            .arg("census")
            .arg("--json")
            .arg(&prof),
        "aetrace census",
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let m = &v[0];
    let forms = m["forms"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, n)| (k.clone(), n.as_u64().unwrap()))
        .filter(|&(_, n)| n > 0)
        .collect();
    (m["instructions"].as_u64().unwrap(), forms)
}

fn check(source: &str, variant: Variant, args: &[&str]) {
    let exe = build(source, variant);
    let tag = format!("{source}-{}", variant.tag());
    let (instructions, ours) = census(&exe, args, &tag);
    let name = exe.file_name().unwrap().to_string_lossy().into_owned();
    let run =
        lackey::run_counting_data(&exe, args, &[exe.clone() as PathBuf], &format!("*{name}*"));
    assert!(run.status.success(), "{tag}: lackey run failed");
    let theirs = &run.modules[0];
    assert_eq!(instructions, theirs.executed, "{tag}: instructions");
    assert_eq!(&ours, &theirs.data, "{tag}: data references per form");
}

/// Register-only loops (O2), frame-heavy code (O0: `M4`, `S4`, `L1`),
/// read-modify-writes and indirect calls (`M4`), qsort's callbacks (`M8`,
/// 16-byte vector moves): each under a second under lackey.
#[test]
fn forms_equal_lackey() {
    let o2 = Variant::new(Opt::O2, Link::Pie, false);
    let o0 = Variant::new(Opt::O0, Link::Pie, false);
    check("loops.c", o2, &["30"]);
    check("calltree.c", o0, &[]);
    check("cache_mix.c", o2, &[]);
    check("qsort_callback.c", o2, &[]);
    check("switch.c", o0, &[]);
}
