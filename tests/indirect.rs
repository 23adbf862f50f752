//! Procedures with indirect jumps the analysis cannot resolve (issue 23,
//! docs/rewrite.md "Unresolved jumps"): traced, each such jump writing
//! INDIRECT(target) and going on in the copy, and regenerated exactly.
//! `traces/unresolved_jump.c` (label arithmetic in a computed goto; a jump
//! through a register to a later instruction, to a traced procedure's entry
//! and to libc) against lackey, with nothing left alone; its jump into the
//! middle of an instruction, and into code no procedure holds, regenerate
//! up to a clear error; and Debian's
//! mawk counting words against its native run single-stepped under ptrace
//! (`common::singlestep`: valgrind changes mawk's path, its `fclose` at exit
//! fails there), with no procedure left alone for an unresolved jump.
//! Jumps to computed code addresses (`traces/computed_jump.c`) go through
//! the copy's dispatch tables, exact against lackey, and a target none of
//! their cases has regenerates up to a clear error.

use crate::common;
use crate::trace_oracle::{check_libs, first_difference, left_alone, regen_threads};

use std::path::Path;
use std::process::Command;

use common::build::{build, Link, Opt, Variant};
use common::elf::Elf;
use common::lackey::LogMode;
use common::recorded::{info_json, left_alone_ranges, link_base, record_checked, Knobs};

/// The unresolved indirect jumps `aetrace cfg` finds in `exe`: procedure
/// name and link-time address.
fn unresolved(exe: &Path) -> Vec<(String, u64)> {
    jumps(exe, "unresolved")
}

/// The indirect jumps of `aetrace cfg` class `class` in `exe` (but those
/// no path reaches): procedure name and link-time address.
fn jumps(exe: &Path, class: &str) -> Vec<(String, u64)> {
    let cfg = common::recorded::cfg_json(exe);
    let mut names = Vec::new();
    for p in cfg["procedures"].as_array().unwrap() {
        for j in p["indirect_jumps"].as_array().unwrap() {
            let dead = class == "computed" && j["targets"].as_array().unwrap().is_empty();
            if j["class"] == class && !dead {
                let name = p["name"].as_str().unwrap().to_owned();
                names.push((name, j["addr"].as_u64().unwrap()));
            }
        }
    }
    names
}

/// How many procedures `aetrace cfg` found in the gaps between others.
fn gap_procedures(exe: &Path) -> usize {
    let cfg = common::recorded::cfg_json(exe);
    let gap = |p: &&serde_json::Value| p["sources"].as_array().unwrap().iter().any(|s| s == "gap");
    cfg["procedures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(gap)
        .count()
}

/// Jumps to computed code addresses (docs/rewrite.md "Computed jumps"):
/// `traces/computed_jump.c`'s `&&label` interpreter, label chosen per path
/// and label plus a bounded multiple, traced through the copy's dispatch
/// and exact against lackey. Left alone: only `tiny`, whose second jump
/// reads the table the copy rewrites for its first (-O2). Stripped too:
/// there `scaled`'s jump is an unresolved one (its end is unknown), to
/// labels past it that nothing names, ranges of their own found in the gaps
/// between procedures (`analysis::procs`, source `gap`), so it enters them
/// through their springboards (their instructions were missing before).
#[test]
fn computed_jumps_are_followed_exactly() {
    for v in [
        Variant::new(Opt::O2, Link::Pie, false),
        Variant::new(Opt::O0, Link::NoPie, false),
        Variant::new(Opt::O0, Link::NoPie, true),
        Variant::new(Opt::O2, Link::NoPie, true),
    ] {
        let exe = build("computed_jump.c", v);
        let jumps = jumps(&exe, "computed");
        // -O0 shares one `jmp *%rax` among `vm`'s labels.
        let least = if v.opt == Opt::O0 { 2 } else { 5 };
        assert!(jumps.len() >= least, "{v:?}: {jumps:?}");
        for name in ["vm", "scaled"].iter().filter(|_| !v.stripped) {
            assert!(jumps.iter().any(|j| j.0 == *name), "{v:?}: {jumps:?}");
        }
        // Stripped, `scaled`'s jump is unresolved, to its three labels past
        // the first, in the gaps.
        if v.stripped {
            assert!(!unresolved(&exe).is_empty(), "{v:?}");
            assert_eq!(gap_procedures(&exe), 3, "{v:?}");
        }
        let info = check_libs(&exe, &[], &[], LogMode::Pipe);
        let alone = left_alone(&info, 0);
        let computed: Vec<_> = alone.iter().filter(|l| l.contains("computed")).collect();
        let allowed = |l: &&&String| l.contains("tiny") && l.contains("jump table");
        assert!(
            computed.len() <= 1 && computed.iter().all(|l| allowed(&l)),
            "{v:?}: {alone:?}"
        );
    }
}

/// Several jumps reading one jump table (`traces/shared_table.c`, gcc
/// -O2's duplicated `goto *ops[i & 3]`): the table stays as it is and each
/// jump dispatches from its targets, exact against lackey with nothing
/// left alone (regen stopped at the second jump before).
#[test]
fn jumps_sharing_a_table_are_followed_exactly() {
    for v in [
        Variant::new(Opt::O2, Link::Pie, false),
        Variant::new(Opt::O2, Link::NoPie, true),
    ] {
        let exe = build("shared_table.c", v);
        let tables = jumps(&exe, "jumptable");
        assert!(tables.len() >= 2, "{v:?}: {tables:?}");
        let info = check_libs(&exe, &[], &[], LogMode::Pipe);
        let alone = left_alone(&info, 0);
        assert!(alone.is_empty(), "{v:?}: {alone:?}");
    }
}

/// A computed jump to an address none of its cases has (`vm`'s array
/// given another procedure's entry): the original code runs on after
/// DESYNC (the program's output is native) and regen stops there.
#[test]
fn a_computed_jump_elsewhere_is_reported() {
    let err = desynchronised("computed_jump.c", "stray");
    assert!(
        err.contains("DESYNC(") && err.contains("in procedure vm"),
        "{err}"
    );
}

#[test]
fn unresolved_jumps_are_followed_exactly() {
    for v in [
        Variant::new(Opt::O2, Link::Pie, false),
        Variant::new(Opt::O0, Link::NoPie, true),
    ] {
        let exe = build("unresolved_jump.c", v);
        let jumps = unresolved(&exe);
        // Not a test of anything if the analysis resolved them (a stripped
        // program names its procedures by address).
        assert!(jumps.len() >= 2, "{v:?}: {jumps:?}");
        for name in ["hop", "interp"].iter().filter(|_| !v.stripped) {
            assert!(jumps.iter().any(|j| j.0 == *name), "{v:?}: {jumps:?}");
        }
        let info = check_libs(&exe, &[], &[], LogMode::Pipe);
        // (The stripped one has a 4-byte "procedure" at `hop_hidden`, an
        // address the program takes: too short for a springboard.)
        let alone = left_alone(&info, 0);
        assert!(
            alone.iter().all(|l| !l.contains("indirect jump")),
            "{v:?}: {alone:?}"
        );
    }
}

/// A target inside one of the procedure's instructions: the copy cannot go
/// on there, so the original code runs (the program's output is native)
/// after DESYNC, and regen stops there naming the jump and its target.
#[test]
fn a_jump_into_an_instruction_is_reported() {
    let err = desynchronised("unresolved_jump.c", "desync");
    assert!(
        err.contains("in procedure hop")
            && err.contains("starts no instruction the analysis decoded"),
        "{err}"
    );
}

/// A target in code no procedure holds (`leap`'s second label, named by
/// nothing, on no 16-byte boundary): the copy writes DESYNC, the original
/// code runs (native output), and regen stops there naming the jump, its
/// target and why, where it used to leave that code out unnoticed.
#[test]
fn a_jump_into_code_no_procedure_holds_is_reported() {
    let exe = build("unresolved_jump.c", Variant::new(Opt::O2, Link::Pie, false));
    let unowned = common::recorded::cfg_json(&exe)["summary"]["unowned"].clone();
    assert_eq!(
        unowned.as_array().map(Vec::len),
        Some(1),
        "the analysis found a procedure there: {unowned}"
    );
    let err = desynchronised("unresolved_jump.c", "nowhere");
    assert!(
        err.contains("in procedure leap") && err.contains("in code no procedure holds"),
        "{err}"
    );
}

/// Records `source` (-O2 PIE) run with `arg`, which makes it jump where
/// its copy cannot follow, and returns regen's one-line error; regen must
/// fail after writing everything before the jump.
fn desynchronised(source: &str, arg: &str) -> String {
    let exe = build(source, Variant::new(Opt::O2, Link::Pie, false));
    let (_, trace) = record_checked(&exe, &[arg], &[], Knobs::DEFAULT);
    let out = Command::new(common::aetrace())
        .args(["regen", "--format", "insn"])
        .arg(&trace)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "regen accepted a desynchronised trace"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        !out.stdout.is_empty(),
        "nothing before the jump was written"
    );
    let _ = std::fs::remove_file(&trace);
    err
}

/// Debian's mawk (two switches on a class byte reloaded from memory, which
/// the analysis cannot bound) counting the words of a few kB of text,
/// recorded and single-stepped with address randomisation off and the same
/// environment: every instruction of mawk's module equal, and only a
/// procedure too short for a springboard left alone.
#[test]
fn debian_mawk_against_its_single_stepped_run() {
    let mawk = Path::new("/usr/bin/mawk");
    assert!(
        mawk.exists(),
        "mawk is not installed (.ci/deps installs it)"
    );
    let jumps = unresolved(mawk);
    assert_eq!(jumps.len(), 2, "mawk's unresolved jumps");
    let dir = common::scratch("indirect-mawk");
    let text = dir.join("words.txt");
    let words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta"];
    let mut s = String::new();
    let mut x = 7u32;
    for line in 0..10 {
        for _ in 0..6 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            s.push_str(words[(x >> 16) as usize % words.len()]);
            s.push(' ');
        }
        s.push_str(&format!("{line}\n"));
    }
    std::fs::write(&text, s).unwrap();
    // A `-W` option (its parser's switch is one jump) and regular
    // expressions (their scanner's switch on each character is the other).
    let script = "/^(al|be)[a-z]*$|et+a/ { n[$1]++ } { for (i = 1; i <= NF; i++) c[$i]++; \
                  gsub(/[aeiou]+/, \"_\") } END { for (w in c) print w, c[w], n[w] }";
    let args = ["-W", "sprintf=4000", script, text.to_str().unwrap()];
    let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string())];
    let stepped = common::singlestep::run(mawk, None, &args, &env);
    assert_eq!(stepped.status, 0);

    let trace = dir.join(format!("mawk-{}.aet", std::process::id()));
    let mut rec: Vec<&std::ffi::OsStr> = vec![
        "record".as_ref(),
        "-o".as_ref(),
        trace.as_os_str(),
        "--".as_ref(),
        mawk.as_os_str(),
    ];
    rec.extend(args.iter().map(std::ffi::OsStr::new));
    let recorded = common::aetrace_fixed(&rec, &env);
    assert!(recorded.status.success(), "{recorded:?}");
    assert_eq!(recorded.stdout, stepped.stdout, "mawk's output");

    let info = info_json(&trace);
    let alone = left_alone(&info, 0);
    assert!(
        alone.iter().all(|l| !l.contains("indirect jump")),
        "{alone:?}"
    );
    let alone = left_alone_ranges(mawk, &info, 0);
    let elf = Elf::read(mawk);
    let entry = u64::from_le_bytes(elf.bytes[0x18..0x20].try_into().unwrap());
    // Address randomisation off: mawk is loaded where the recorded run had
    // its rewritten copy (the kernel's fixed base for position-independent
    // executables).
    let bias = info["modules"][0]["load_base"].as_u64().unwrap();
    assert!(
        stepped.rips.contains(&(bias + entry)),
        "mawk's entry point at {:#x} was not stepped",
        bias + entry
    );
    let (base, size) = (link_base(mawk), std::fs::metadata(mawk).unwrap().len());
    let mut expected = Vec::new();
    let mut prev = None;
    for &rip in &stepped.rips {
        let a = rip.wrapping_sub(bias);
        if a < base || a >= base + size {
            continue;
        }
        let repeat = prev == Some(a) && elf.is_rep(a);
        prev = Some(a);
        if !repeat && !alone.iter().any(|&(lo, hi)| lo <= a && a < hi) {
            expected.push(a - base);
        }
    }
    let rg = regen_threads(&trace, None);
    let base_rel = |a: u64| a - base;
    for (name, at) in &jumps {
        let n = rg[0].iter().filter(|&&a| a == base_rel(*at)).count();
        assert!(n > 0, "{name}'s unresolved jump at {at:#x} never ran");
    }
    eprintln!(
        "mawk: {} instructions of its module stepped, equal",
        expected.len()
    );
    if let Some(d) = first_difference(&expected, &rg[0]) {
        panic!("mawk (expected: the stepped run): {d}");
    }
    let _ = std::fs::remove_file(&trace);
}
