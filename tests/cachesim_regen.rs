//! Issue 6: cachegrind's I1 numbers for an instruction stream that comes
//! from `aetrace regen`. Cachegrind simulates every instruction of the
//! process, so the comparison is exact only when the trace covers the whole
//! stream: `traces/nolibc_icache.c` is a static program without libc (its
//! own `_start`, raw syscalls, no rep-string instruction, whose iterations
//! cachegrind would count one by one), and every one of its procedures must
//! be traced. The recorded run's stream, `aetrace regen --format xdin`
//! into `aetrace cachesim --model cachegrind`, must give cachegrind's
//! `I refs`, `I1 misses` and `LLi misses` for the native program, for
//! several geometries, and so must `aetrace cachesim TRACE` (regenerated
//! and simulated block by block in one process); `aetrace regen --count`
//! must give its `I refs` too. Cachegrind shares no code with aetrace.
//! `in_process_simulation_equals_the_pipe` holds the in-process path to
//! the pipe on other programs and options.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::build::run_checked;

#[test]
fn cachegrind_i1_equals_cachesim_on_the_regenerated_stream() {
    let dir = common::scratch("cachesim-regen");
    let exe = common::build::build_nolibc(&dir, "nolibc_icache.c", &[], "nolibc_icache");
    let args = ["2500"];

    // No rep-string instruction anywhere (objdump, not our decoder).
    let dis = run_checked(Command::new("objdump").arg("-d").arg(&exe), "objdump -d");
    let dis = String::from_utf8_lossy(&dis.stdout);
    assert!(
        !dis.lines()
            .any(|l| l.contains("\trep") || l.contains(" rep ")),
        "the program must have no rep-string instruction"
    );

    // Record it: same behaviour as the native run, nothing left alone.
    let native = Command::new(&exe).args(args).output().unwrap();
    let trace = dir.join("nolibc.aet");
    let rec = Command::new(common::aetrace())
        .args(["record", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&exe)
        .args(args)
        .output()
        .unwrap();
    assert_eq!(rec.stdout, native.stdout, "stdout differs");
    assert_eq!(rec.stderr, native.stderr, "stderr differs");
    assert_eq!(rec.status.code(), native.status.code(), "status differs");
    let info = common::recorded::info_json(&trace);
    let left = &info["programs"][0]["left_alone"];
    assert_eq!(
        left.as_array().map(Vec::len),
        Some(0),
        "every procedure must be traced: {left}"
    );

    let xdin = dir.join("nolibc.xdin");
    run_checked(
        Command::new(common::aetrace())
            .args(["regen", "--format", "xdin", "-o"])
            .arg(&xdin)
            .arg(&trace),
        "aetrace regen --format xdin",
    );
    let count = common::regen::count(&trace);

    // (I1, D1, LL) as cachegrind's size,assoc,line.
    let geometries = [
        ((1024, 2, 64), (1024, 2, 64), (8192, 4, 64)),
        ((512, 1, 32), (2048, 4, 64), (16384, 8, 64)),
        ((2048, 4, 64), (4096, 2, 64), (4096, 4, 64)),
        // An LL smaller than the code: LLi misses beyond the compulsory ones.
        ((1024, 1, 64), (4096, 2, 64), (2048, 2, 64)),
        ((4096, 1, 64), (4096, 2, 64), (65536, 16, 64)),
    ];
    // Each geometry's in-process JSON report and its `--configs` line.
    let mut singles = Vec::new();
    let mut lines = String::new();
    for (k, (i1, d1, ll)) in geometries.into_iter().enumerate() {
        let (status, summary) = common::cachegrind::run(&exe, &args, (i1, d1, ll), Stdio::null());
        assert_eq!(status.code(), native.status.code(), "cachegrind run");
        let mut opts = vec!["cachesim".to_string()];
        opts.extend(common::cachegrind::model_args(i1, d1, ll, &xdin));
        let out = run_checked(
            Command::new(common::aetrace()).args(&opts),
            "aetrace cachesim",
        );
        // In the process, block by block: the same figures.
        let mut in_process = vec!["cachesim".to_string()];
        in_process.extend(common::cachegrind::model_args(i1, d1, ll, &trace));
        let direct = run_checked(
            Command::new(common::aetrace()).args(&in_process),
            "aetrace cachesim TRACE",
        );
        singles.push(serde_json::from_slice::<serde_json::Value>(&direct.stdout).unwrap());
        lines += &(in_process[4..in_process.len() - 1].join(" ") + "\n");
        assert_eq!(
            String::from_utf8_lossy(&direct.stdout),
            String::from_utf8_lossy(&out.stdout),
            "in-process against the xdin file"
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let get = |key: &str| v["stats"][key].as_u64().unwrap();
        let ctx = format!("I1 {i1:?} D1 {d1:?} LL {ll:?}");
        let irefs = common::cachegrind::number(&summary, "I   refs:");
        let i1_misses = common::cachegrind::number(&summary, "I1  misses:");
        assert_eq!(get("i_refs"), irefs, "I refs, {ctx}");
        assert_eq!(get("i1_misses"), i1_misses, "I1 misses, {ctx}");
        assert_eq!(
            get("lli_misses"),
            common::cachegrind::number(&summary, "LLi misses:"),
            "LLi misses, {ctx}"
        );
        if k == 0 {
            // A small I1 must really be exercised.
            assert!(i1_misses > 1000, "only {i1_misses} I1 misses, {ctx}");
            assert!(
                count.contains(&format!("{irefs} instructions")),
                "aetrace regen --count says {count:?}, cachegrind's Ir is {irefs}"
            );
        }
        eprintln!(
            "{ctx}: I refs {irefs}, I1 misses {i1_misses} (cachegrind = aetrace regen | cachesim)"
        );
    }
    // All five geometries (lines of 32 and 64 bytes) in one pass.
    let configs = dir.join("geometries");
    std::fs::write(&configs, &lines).unwrap();
    let all = run_checked(
        Command::new(common::aetrace())
            .args(["cachesim", "--model", "cachegrind", "--json", "--configs"])
            .arg(&configs)
            .arg(&trace),
        "aetrace cachesim --configs",
    );
    let all: serde_json::Value = serde_json::from_slice(&all.stdout).unwrap();
    let all = all["configurations"]
        .as_array()
        .expect("a report per configuration");
    assert_eq!(all.len(), singles.len());
    for ((one, single), line) in all.iter().zip(&singles).zip(lines.lines()) {
        assert_eq!(one["options"], line, "configurations in file order");
        assert_eq!(
            one["stats"], single["stats"],
            "--configs against one run, {line}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `aetrace cachesim ARGS` on `input` (exit 0 expected), its stdout.
fn cachesim(args: &[&str], input: &Path) -> String {
    let out = run_checked(
        Command::new(common::aetrace())
            .arg("cachesim")
            .args(args)
            .arg(input),
        "aetrace cachesim",
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `aetrace regen --format bin [REGEN..] TRACE | aetrace cachesim ARGS`.
fn piped(regen: &[&str], args: &[&str], trace: &Path) -> String {
    let mut producer = Command::new(common::aetrace())
        .args(["regen", "--format", "bin"])
        .args(regen)
        .arg(trace)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = Command::new(common::aetrace())
        .arg("cachesim")
        .args(args)
        .stdin(Stdio::from(producer.stdout.take().unwrap()))
        .output()
        .unwrap();
    assert!(producer.wait().unwrap().success(), "aetrace regen failed");
    assert!(
        out.status.success(),
        "cachesim: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Issue 24: `aetrace cachesim TRACE` (regenerated in the process, block by
/// block) prints exactly what the pipe from `aetrace regen --format bin`
/// gives, for every replacement policy, `-ccc`, split and unified first
/// levels, small lines (instructions straddling two lines, or three of 4
/// bytes), windows, the cachegrind model and the sweep, on threads,
/// signals, a fork and gzip;
/// `--modules` counts what `regen --module M` pipes for each module.
#[test]
fn in_process_simulation_equals_the_pipe() {
    let dir = common::scratch("cachesim-inproc");
    let l1 = "-l1-isize 4k -l1-ibsize 64 -l1-iassoc 2 -l1-dsize 4k -l1-dbsize 64 -l1-dassoc 2";
    let option_sets: Vec<String> = vec![
        format!("{l1} -l2-usize 64k -l2-ubsize 64 -l2-uassoc 8"),
        format!("{l1} -l1-irepl f -l1-iccc -l2-usize 16k -l2-ubsize 128 -l2-urepl r"),
        "-l1-usize 2k -l1-ubsize 16 -l1-uassoc 4 -l1-urepl r --seed 7 -l1-uccc".into(),
        "-l1-isize 1k -l1-ibsize 8 -l1-iassoc 1 -skipcount 1003 -maxcount 54321".into(),
        "-l1-isize 64 -l1-ibsize 4 -l1-iassoc 1 -l1-dsize 1k -l1-dbsize 16 -l1-dassoc 1".into(),
        format!("{l1} --model cachegrind --json -l2-usize 64k -l2-ubsize 64 -l2-uassoc 8"),
        "--sweep 1k..64k --assoc 1,4,full --bsize 32".into(),
    ];
    let gzip_input = dir.join("text");
    std::fs::write(&gzip_input, common::text_input(20_000)).unwrap();
    let mut traces = Vec::new();
    for (name, args) in [
        ("threads", vec![]),
        ("signal_threads", vec![]),
        ("fork", vec![]),
    ] {
        let exe = common::build::build(
            &format!("{name}.c"),
            common::build::Variant::new(common::build::Opt::O2, common::build::Link::Pie, false),
        );
        traces.push(record(&dir, name, &exe, &args));
    }
    let gzip_args = ["-c".to_string(), gzip_input.display().to_string()];
    traces.push(record(&dir, "gzip", Path::new("/usr/bin/gzip"), &gzip_args));
    for trace in &traces {
        for opts in &option_sets {
            let args: Vec<&str> = opts.split(' ').collect();
            assert_eq!(
                cachesim(&args, trace),
                piped(&[], &args, trace),
                "{} with {opts}",
                trace.display()
            );
        }
        // Per module: what `regen --module M` pipes into the cachegrind model.
        let cg = format!("{l1} --model cachegrind --json");
        let cg: Vec<&str> = cg.split(' ').collect();
        let with_modules = [&cg[..], &["--modules"]].concat();
        let json: serde_json::Value =
            serde_json::from_str(&cachesim(&with_modules, trace)).unwrap();
        let modules = json["modules"].as_array().unwrap();
        assert!(!modules.is_empty());
        for m in modules {
            let name = m["module"].as_str().unwrap();
            let alone = piped(&["--module", name], &cg, trace);
            let alone: serde_json::Value = serde_json::from_str(&alone).unwrap();
            assert_eq!(m["instructions"], alone["stats"]["i_refs"], "{name}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `aetrace record -o DIR/NAME.aet -- EXE ARGS`.
fn record(dir: &Path, name: &str, exe: &Path, args: &[String]) -> PathBuf {
    let trace = dir.join(format!("{name}.aet"));
    run_checked(
        Command::new(common::aetrace())
            .args(["record", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(exe)
            .args(args)
            .stdout(Stdio::null()),
        "aetrace record",
    );
    trace
}
