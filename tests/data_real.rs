//! `record --data` of Debian's gzip, bzip2 with libbz2, xz with liblzma
//! and sort against valgrind lackey (`--trace-mem=yes
//! --vex-guest-chase=no`), instruction by instruction and reference by
//! reference, streaming (`common::exact_data`): every module traced, the
//! same (kind, size) list per instruction, addresses in the modules'
//! images equal module-relative, the stack up to one delta, everything
//! else up to one delta per page. Issue 21's inputs: 20 kB, and sort on
//! 20,000 lines here (100,000 in `bench/run exactness`).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common;
use crate::common::build::{build, run_native, Link, Opt, Variant};
use crate::common::recorded::{info_json, sort_lines};

/// Records `exe args` with `--data` and `--libs libs`, address
/// randomisation off (the comparison finds the stack by its place), and
/// checks the recorded run's output against the native one's.
fn record_data(exe: &Path, args: &[&str], libs: &[&str]) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = exe.file_name().unwrap().to_string_lossy().into_owned();
    let trace =
        common::scratch("data_real").join(format!("{name}-{}-{call}.aet", std::process::id()));
    let libs = if libs.is_empty() {
        "none".to_owned()
    } else {
        libs.join(",")
    };
    let mut cmd = Command::new(common::aetrace());
    cmd.args(["record", "--data", "--libs", &libs, "-o"])
        .arg(&trace)
        .arg("--")
        .arg(exe)
        .args(args)
        .stdin(std::process::Stdio::null());
    // SAFETY: one async-signal-safe call between fork and exec.
    unsafe {
        cmd.pre_exec(
            || match libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong) {
                -1 => Err(std::io::Error::last_os_error()),
                _ => Ok(()),
            },
        );
    }
    let recorded = cmd.output().unwrap();
    let native = run_native(exe, args);
    assert!(
        recorded.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&recorded.stderr)
    );
    assert_eq!(recorded.stdout, native.stdout, "{name}: stdout differs");
    trace
}

/// `exe args` recorded with data equals lackey's run; every traced
/// module's instructions compared (their sum is `aetrace info`'s).
fn check(exe: &str, args: &[&str], libs: &[&str]) {
    let exe = Path::new(exe);
    let trace = record_data(exe, args, libs);
    let c = common::exact_data::against_lackey(&trace, exe, args)
        .unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
    assert!(
        c.status.success(),
        "{}: lackey's run {}",
        exe.display(),
        c.status
    );
    let info = info_json(&trace);
    let traced: u64 = (info["instructions"].as_array().unwrap().iter())
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(
        c.instructions,
        traced,
        "{}: instructions compared",
        exe.display()
    );
    assert!(
        c.references > c.instructions / 4,
        "{}: {} references",
        exe.display(),
        c.references
    );
    let _ = std::fs::remove_file(&trace);
}

fn input(name: &str) -> String {
    let p = common::scratch("inputs").join(format!("data-real-{name}"));
    std::fs::write(&p, common::text_input(20_000)).unwrap();
    p.display().to_string()
}

#[test]
fn debian_gzip() {
    check("/usr/bin/gzip", &["-c", &input("gzip")], &[]);
}

#[test]
fn debian_bzip2_with_libbz2() {
    check(
        "/usr/bin/bzip2",
        &["-c", &input("bzip2")],
        &["libbz2.so.1.0"],
    );
}

#[test]
fn debian_xz_with_liblzma() {
    check("/usr/bin/xz", &["-c", &input("xz")], &["liblzma.so.5"]);
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

/// The comparison fails where only a data address differs: the trace of
/// `data_index 1` against lackey's run of `data_index 2` (the same
/// instructions, one store 256 bytes apart in the image).
#[test]
fn a_different_data_address_is_reported() {
    let exe = build("data_index.c", Variant::new(Opt::O2, Link::Pie, false));
    let trace = record_data(&exe, &["1"], &[]);
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
