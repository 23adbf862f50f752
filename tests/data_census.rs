//! `aetrace census` against valgrind lackey (`--trace-mem=yes
//! --vex-guest-chase=no`): each block's static references, weighted by
//! the exact block counts of `aetrace profile`, equal lackey's data
//! references inside the executable, form by form (kind and size). This
//! checks the reference-form table of `analysis::addr::forms` on what gcc
//! emits, and `rep` counts taken from a constant `rcx`. The instruction
//! counts must agree first: every executed procedure counted (the few the
//! rewriter leaves alone, which the profile cannot count, are left out of
//! lackey's stream too), a `rep` instruction counted once. Every `rep` of
//! the programs checked has a constant count; one whose count is unknown
//! makes the comparison impossible and fails the test. Debian's gzip on
//! 20 kB checks the table on a real program.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::build::{build, run_checked, Link, Opt, Variant};
use crate::common::{self, lackey};

/// The executable's census: instructions, forms, and the ranges of the
/// procedures it could not count (the rewriter left them alone).
struct Census {
    instructions: u64,
    forms: BTreeMap<String, u64>,
    uncounted: Vec<(u64, u64)>,
    rep_unknown: u64,
}

/// The executable's census from `aetrace census --json`.
fn census(exe: &Path, args: &[&str], tag: &str) -> Census {
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
    let uncounted = m["uncounted"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p[1].as_array().unwrap().clone())
        .map(|r| (r[0].as_u64().unwrap(), r[1].as_u64().unwrap()))
        .collect();
    Census {
        instructions: m["instructions"].as_u64().unwrap(),
        forms,
        uncounted,
        rep_unknown: m["rep_unknown"].as_u64().unwrap(),
    }
}

fn check(source: &str, variant: Variant, args: &[&str]) {
    let exe = build(source, variant);
    check_exe(&exe, args, &format!("{source}-{}", variant.tag()));
}

fn check_exe(exe: &Path, args: &[&str], tag: &str) {
    let exe = exe.to_path_buf();
    let ours = census(&exe, args, tag);
    let modules = [exe.clone() as PathBuf];
    let run = lackey::run_counting_data(
        &exe,
        args,
        &modules,
        &lackey::symtab_pattern(&modules),
        vec![ours.uncounted],
    );
    assert!(run.status.success(), "{tag}: lackey run failed");
    let theirs = &run.modules[0];
    assert_eq!(
        ours.rep_unknown, 0,
        "{tag}: rep instructions of unknown count"
    );
    assert_eq!(ours.instructions, theirs.executed, "{tag}: instructions");
    assert_eq!(ours.forms, theirs.data, "{tag}: data references per form");
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

/// Debian's gzip on a 20 kB text: what gcc made of a real program.
#[test]
fn gzip_forms_equal_lackey() {
    check_exe(
        Path::new("/usr/bin/gzip"),
        &["-c", common::text_20k()],
        "gzip-20k",
    );
}
