//! `record --data` of Debian's gzip, bzip2 with libbz2, xz with liblzma
//! and sort against valgrind lackey (`--trace-mem=yes
//! --vex-guest-chase=no`), instruction by instruction and reference by
//! reference, streaming (`common::exact_data`): every module traced, the
//! same (kind, size) list per instruction, addresses in the modules'
//! images equal module-relative, the stack up to one delta, everything
//! else up to one delta per page. Issue 21's inputs: 20 kB, and sort on
//! 20,000 lines here (100,000 in `bench/run exactness`); sort with libc
//! traced in a UTF-8 locale by `--data --check`.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::common;
use crate::common::build::{build, Link, Opt, Variant};
use crate::common::recorded::{record_checked, sort_lines, Knobs};

/// `exe args` recorded with data equals lackey's run, every traced
/// instruction compared.
fn check(exe: &str, args: &[&str], libs: &[&str]) {
    let exe = Path::new(exe);
    let (_, trace) = record_checked(exe, args, libs, Knobs::DATA);
    let c = common::exact_data::against_lackey(&trace, exe, args)
        .unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
    assert!(
        c.status.success(),
        "{}: lackey's run {}",
        exe.display(),
        c.status
    );
    assert!(
        c.references > c.instructions / 4,
        "{}: {} references",
        exe.display(),
        c.references
    );
    let _ = std::fs::remove_file(&trace);
}

#[test]
fn debian_gzip() {
    check("/usr/bin/gzip", &["-c", common::text_20k()], &[]);
}

/// `record --data` encodes closed chunks on the rayon pool and writes
/// them in the order they closed: gzip on 20 kB (10 chunks) recorded with
/// one pool thread and with three regenerates to the same bytes
/// (`regen --format bin`, address randomisation off; the two values of
/// `RAYON_NUM_THREADS` are one character each, so the program's stack
/// is where it was).
#[test]
fn data_chunks_are_the_same_for_one_encoder_or_three() {
    let input = common::text_20k();
    let regen = |threads: &str| {
        let dir = common::scratch("data_real");
        let trace = dir.join(format!("gzip-pool-{threads}.aet"));
        let mut rec = Command::new(common::aetrace());
        rec.env("RAYON_NUM_THREADS", threads)
            .args(["record", "--data", "-o"])
            .arg(&trace)
            .args(["--", "/usr/bin/gzip", "-c", input])
            .stdout(Stdio::null());
        common::no_aslr(&mut rec);
        assert!(rec.status().unwrap().success(), "record, {threads} threads");
        let out = Command::new(common::aetrace())
            .args(["regen", "-j", "1", "--format", "bin"])
            .arg(&trace)
            .output()
            .unwrap();
        assert!(out.status.success(), "regen, {threads} threads");
        let _ = std::fs::remove_file(&trace);
        out.stdout
    };
    let one = regen("1");
    assert!(one.len() > 1 << 20, "{} bytes of regen output", one.len());
    assert!(one == regen("3"), "regen output differs with 3 encoders");
}

#[test]
fn debian_bzip2_with_libbz2() {
    check(
        "/usr/bin/bzip2",
        &["-c", common::text_20k()],
        &["libbz2.so.1.0"],
    );
}

#[test]
fn debian_xz_with_liblzma() {
    check(
        "/usr/bin/xz",
        &["-c", common::text_20k()],
        &["liblzma.so.5"],
    );
}

#[test]
fn debian_sort() {
    let p = common::scratch("inputs").join("data-real-sort");
    std::fs::write(&p, sort_lines(20_000)).unwrap();
    check(
        "/usr/bin/sort",
        &["-S", "64M", &p.display().to_string()],
        &[],
    );
}

/// Issue 21: sort in a UTF-8 locale with libc traced loads the locale's
/// data (`_nl_intern_locale_data`, whose switch the control analysis
/// leaves an unresolved jump into its own procedure): recorded with
/// `--data --check`, every address regenerates as the run computed it.
#[test]
fn debian_sort_with_libc_in_a_utf8_locale() {
    let input = common::scratch("inputs").join("data-real-sort-30");
    std::fs::write(&input, sort_lines(30)).unwrap();
    let trace = common::scratch("data_real").join("sort-libc.aet");
    let mut rec = Command::new(common::aetrace());
    rec.env("LANG", "C.UTF-8")
        .args(["record", "--data", "--check", "--libs", "libc.so.6", "-o"])
        .arg(&trace)
        .args(["--", "/usr/bin/sort"])
        .arg(&input)
        .stdout(Stdio::null());
    assert!(rec.status().unwrap().success(), "record");
    let out = Command::new(common::aetrace())
        .args(["regen", "-j", "1", "--format", "lackey"])
        .arg(&trace)
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "regen: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(&trace);
}

/// The comparison fails where only a data address differs: the trace of
/// `data_index 1` against lackey's run of `data_index 2` (the same
/// instructions, one store 256 bytes apart in the image).
#[test]
fn a_different_data_address_is_reported() {
    let exe = build("data_index.c", Variant::new(Opt::O2, Link::Pie, false));
    let (_, trace) = record_checked(&exe, &["1"], &[], Knobs::DATA);
    let e = match common::exact_data::against_lackey(&trace, &exe, &["2"]) {
        Ok(c) => panic!(
            "equal to lackey on another argument: {} instructions",
            c.instructions
        ),
        Err(e) => e,
    };
    assert!(e.contains("module 0 address"), "{e}");
    let _ = std::fs::remove_file(&trace);
}
