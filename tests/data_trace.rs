//! `record --data` (abstract execution) and `record --data --check` (the
//! same, plus every address in full, which regen compares with the
//! recomputed ones and refuses at the first difference) + `regen --format
//! lackey` against valgrind lackey (`--trace-mem=yes
//! --vex-guest-chase=no`) on the original program, both modes: per executed instruction of the executable, the same address
//! and length, the same references (kind and size, in order) and the same
//! data addresses: inside the executable's image equal (non-PIE builds:
//! link-time addresses on both sides); elsewhere (stack, heap, libraries'
//! data) equal up to one delta per page, fixed at the page's first touch
//! and checked at every later one, and one delta for the whole stack
//! (relative to the initial stack pointer): valgrind lays memory out
//! differently.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use crate::common;
use crate::common::build::{build, run_checked, Link, Opt, Variant};

/// One instruction: address, length, references (kind, address, size).
type Insn = (u64, u64, Vec<(char, u64, u64)>);

/// The executable's instructions of a lackey-format text, in order.
fn parse(text: &str, image: (u64, u64)) -> Vec<Insn> {
    let mut out: Vec<Insn> = Vec::new();
    let mut keep = false;
    let num = |s: &str| -> (u64, u64) {
        let (a, n) = s.trim().split_once(',').expect("ADDR,SIZE");
        (u64::from_str_radix(a, 16).unwrap(), n.parse().unwrap())
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("I  ") {
            let (a, n) = num(rest);
            keep = (image.0..image.1).contains(&a);
            if keep {
                out.push((a, n, Vec::new()));
            }
        } else if keep && line.len() > 3 && line.starts_with(' ') {
            let kind = line.as_bytes()[1] as char;
            let (a, n) = num(&line[3..]);
            out.last_mut().unwrap().2.push((kind, a, n));
        }
    }
    out
}

/// The executable's allocated sections' span (non-PIE: run-time addresses).
fn image_of(exe: &Path) -> (u64, u64) {
    let m = aetrace_analysis::elf::Module::open(exe).unwrap();
    let alloc = m.sections.iter().filter(|s| s.alloc && s.addr != 0);
    let lo = alloc.clone().map(|s| s.addr).min().unwrap();
    let hi = alloc.map(|s| s.addr + s.size).max().unwrap();
    (lo, hi)
}

/// Ours and lackey's data addresses agree as the module doc says.
struct Deltas {
    image: (u64, u64),
    pages: HashMap<u64, u64>,
    stack: Option<u64>,
}

impl Deltas {
    fn check(&mut self, ours: u64, theirs: u64) -> Result<(), String> {
        if (self.image.0..self.image.1).contains(&ours) {
            return (ours == theirs)
                .then_some(())
                .ok_or_else(|| format!("image address {ours:#x}, lackey {theirs:#x}"));
        }
        let delta = theirs.wrapping_sub(ours);
        if ours >= 0x7ff0_0000_0000 {
            let d = *self.stack.get_or_insert(delta);
            if d != delta {
                return Err(format!(
                    "stack {ours:#x}: lackey {theirs:#x}, delta differs"
                ));
            }
        }
        let d = *self.pages.entry(ours >> 12).or_insert(delta);
        (d == delta)
            .then_some(())
            .ok_or_else(|| format!("{ours:#x}: lackey {theirs:#x}, its page's delta differs"))
    }
}

/// Our lackey text of `exe args` recorded with `record --data MODE`.
fn ours(exe: &Path, tag: &str, mode: &[&str], args: &[&str]) -> String {
    let trace = common::scratch("data_trace").join(format!("{tag}{}.aet", mode.concat()));
    run_checked(
        Command::new(common::aetrace())
            .args(["record", "--data"])
            .args(mode)
            .arg("-o")
            .arg(&trace)
            .arg("--")
            .arg(exe)
            .args(args),
        "aetrace record --data",
    );
    let out = run_checked(
        Command::new(common::aetrace())
            .args(["regen", "--format", "lackey"])
            .arg(&trace),
        "aetrace regen --format lackey",
    );
    String::from_utf8(out.stdout).unwrap()
}

fn check(source: &str, variant: Variant, args: &[&str]) {
    let exe = build(source, variant);
    let tag = format!("{source}-{}", variant.tag());
    let dir = common::scratch("data_trace");
    let abs = ours(&exe, &tag, &[], args);
    let checked = ours(&exe, &tag, &["--check"], args);
    let log = dir.join(format!("{tag}.lackey"));
    let status = Command::new("valgrind")
        .args(["--tool=lackey", "--trace-mem=yes", "--vex-guest-chase=no"])
        .arg(format!("--log-file={}", log.display()))
        .arg(&exe)
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{tag}: lackey run failed");
    let image = image_of(&exe);
    let theirs = parse(&std::fs::read_to_string(&log).unwrap(), image);
    for (mode, text) in [("--data", &abs), ("--data --check", &checked)] {
        compare(&format!("{tag} {mode}"), parse(text, image), &theirs, image);
    }
}

/// Ours and lackey's instructions agree as the module doc says.
fn compare(tag: &str, ours: Vec<Insn>, theirs: &[Insn], image: (u64, u64)) {
    assert!(!ours.is_empty(), "{tag}: no instructions");
    let mut deltas = Deltas {
        image,
        pages: HashMap::new(),
        stack: None,
    };
    let mut refs = 0;
    for (i, (o, t)) in ours.iter().zip(theirs).enumerate() {
        let form = |x: &Insn| x.2.iter().map(|r| (r.0, r.2)).collect::<Vec<_>>();
        assert_eq!(
            (o.0, o.1, form(o)),
            (t.0, t.1, form(t)),
            "{tag}: instruction {i}: (address, length, references)"
        );
        for (a, b) in o.2.iter().zip(&t.2) {
            if let Err(e) = deltas.check(a.1, b.1) {
                panic!("{tag}: instruction {i} at {:#x}: {e}", o.0);
            }
            refs += 1;
        }
    }
    assert_eq!(ours.len(), theirs.len(), "{tag}: instructions");
    assert!(refs > 0, "{tag}: no data references");
}

/// The programs the census checks, and `rep movsb`/`rep stosq` with
/// counts 0, 1 and many, recursion: each under a second under lackey.
#[test]
fn data_addresses_equal_lackey() {
    let o2 = Variant::new(Opt::O2, Link::NoPie, false);
    let o0 = Variant::new(Opt::O0, Link::NoPie, false);
    check("loops.c", o2, &["30"]);
    check("calltree.c", o0, &[]);
    check("cache_mix.c", o2, &[]);
    check("qsort_callback.c", o2, &[]);
    check("switch.c", o0, &[]);
    check("recursion.c", o0, &[]);
    check("rep_string.c", o2, &[]);
}

/// Asking for data where there is none: one line and a non-zero exit.
#[test]
fn data_requests_without_data_are_one_line_errors() {
    let exe = build("loops.c", Variant::new(Opt::O2, Link::NoPie, false));
    let trace = common::scratch("data_trace").join("control-only.aet");
    run_checked(
        Command::new(common::aetrace())
            .arg("record")
            .arg("-o")
            .arg(&trace)
            .arg("--")
            .arg(&exe)
            .arg("3"),
        "aetrace record",
    );
    let asks: [Vec<std::ffi::OsString>; 2] = [
        vec![
            "regen".into(),
            "--format".into(),
            "lackey".into(),
            trace.clone().into(),
        ],
        vec![
            "regen".into(),
            "--format".into(),
            "xdin".into(),
            "--data".into(),
            trace.into(),
        ],
    ];
    for args in asks {
        let out = Command::new(common::aetrace())
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("record it with --data"), "{err}");
    }
}

/// The checking mode catches a wrong recorded address: with the first
/// address of `main` recorded 8 bytes off (fault injection), regen stops
/// with one line naming the procedure and both addresses; without the
/// fault the same trace regenerates.
#[test]
fn data_check_names_the_first_wrong_address() {
    let exe = build("calltree.c", Variant::new(Opt::O0, Link::NoPie, false));
    let trace = common::scratch("data_trace").join("fault.aet");
    let regen = |fault: bool| {
        let mut rec = Command::new(common::aetrace());
        rec.args(["record", "--data", "--check", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&exe);
        if fault {
            rec.env("AETRACE_FAULT_DATA_ADDR", "main");
        }
        run_checked(&mut rec, "aetrace record --data --check");
        Command::new(common::aetrace())
            .args(["regen", "--format", "lackey"])
            .arg(&trace)
            .output()
            .unwrap()
    };
    assert!(regen(false).status.success(), "without the fault");
    let out = regen(true);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the faulty trace regenerated");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("data check: procedure main ") && err.contains("expected 0x"),
        "{err}"
    );
}
