//! Recording a program with `aetrace record` for the oracle tests: the run
//! checked against the native one (stdout, stderr, status), `aetrace info`
//! of the trace, and what the comparisons with lackey need from the
//! binaries (link base, ranges of procedures left alone).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::build::run_native;

/// Lowest PT_LOAD vaddr, page-aligned down: what `--relative` subtracts.
pub fn link_base(exe: &Path) -> u64 {
    let b = std::fs::read(exe).unwrap();
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    (0..phnum)
        .map(|i| phoff + i * phentsize)
        .filter(|&o| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) == 1)
        .map(|o| u64_at(o + 16))
        .min()
        .unwrap()
        & !0xfff
}

/// `aetrace info --json TRACE`.
pub fn info_json(trace: &Path) -> serde_json::Value {
    let info = Command::new(super::aetrace())
        .args(["info", "--json"])
        .arg(trace)
        .output()
        .unwrap();
    assert!(info.status.success(), "aetrace info failed");
    serde_json::from_slice(&info.stdout).unwrap()
}

/// Address ranges of the procedures of module `exe` (the `k`th program of
/// the trace) that `aetrace info` says were left alone.
pub fn left_alone_ranges(exe: &Path, info: &serde_json::Value, k: usize) -> Vec<(u64, u64)> {
    left_alone_procedures(exe, info, k)
        .into_iter()
        .flat_map(|(_, ranges)| ranges)
        .collect()
}

/// The procedures of module `exe` (the `k`th program of the trace) that
/// `aetrace info` says were left alone: each name with its address ranges
/// (from `aetrace cfg --json`).
pub fn left_alone_procedures(
    exe: &Path,
    info: &serde_json::Value,
    k: usize,
) -> Vec<(String, Vec<(u64, u64)>)> {
    let names: Vec<String> = info["programs"][k]["left_alone"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap().to_owned())
        .collect();
    procedure_ranges(exe, &names)
}

/// How the rewriter's note naming a module's early code starts.
const EARLY_NOTE: &str =
    "traced from the runtime's init on, untraced before it: the code ld.so runs first in ";

/// The procedures of module `exe` that ld.so runs before the runtime's
/// init, which run untraced until then and traced after (the rewriter's
/// note in `aetrace info`): each name with its address ranges.
pub fn early_procedures(exe: &Path, info: &serde_json::Value) -> Vec<(String, Vec<(u64, u64)>)> {
    let prefix = format!("{EARLY_NOTE}{}", exe.display());
    let remarks = info["remarks"].as_array().unwrap().iter();
    let note = remarks
        .filter_map(|r| r.as_str())
        .find_map(|r| r.strip_prefix(prefix.as_str()));
    let Some(names) = note.and_then(|n| n.split_once("): ")) else {
        return Vec::new();
    };
    let names: Vec<String> = names.1.split(", ").map(str::to_owned).collect();
    procedure_ranges(exe, &names)
}

/// Each of `names` that is a procedure of `exe`, with its address ranges
/// (from `aetrace cfg --json`).
fn procedure_ranges(exe: &Path, names: &[String]) -> Vec<(String, Vec<(u64, u64)>)> {
    let cfg = cfg_json(exe);
    let mut procs = Vec::new();
    for p in cfg["procedures"].as_array().unwrap() {
        if let Some(n) = names.iter().find(|n| p["name"] == n.as_str()) {
            let ranges = p["ranges"].as_array().unwrap().iter();
            let ranges = ranges.map(|r| (r[0].as_u64().unwrap(), r[1].as_u64().unwrap()));
            procs.push((n.clone(), ranges.collect()));
        }
    }
    procs
}

/// What a test may change in a recording: buffer halves of `half` bytes
/// (`AETRACE_HALF_SIZE`, the recorder's testing knob), the witness
/// placement (`--placement`; the default, optimal, when `None`) and data
/// addresses (`--data`, recorded with address randomisation off: the
/// data comparison finds the stack by its place).
#[derive(Clone, Copy)]
pub struct Knobs {
    pub half: Option<u64>,
    pub placement: Option<&'static str>,
    pub data: bool,
    /// Address randomisation off (as `--data` has it), as the stepped
    /// oracle runs: the stack pointer's offset in its page, which the
    /// kernel otherwise draws at random, decides paths of libc's string
    /// functions (their alignment and page-crossing checks on a buffer
    /// on the stack).
    pub fixed: bool,
}

impl Knobs {
    pub const DEFAULT: Knobs = Knobs {
        half: None,
        placement: None,
        data: false,
        fixed: false,
    };
    pub const DATA: Knobs = Knobs {
        data: true,
        ..Knobs::DEFAULT
    };
    /// For a comparison with the native run single-stepped.
    pub const FIXED: Knobs = Knobs {
        fixed: true,
        ..Knobs::DEFAULT
    };
}

/// Records `exe args` with `--libs` of `libs` (`none` if empty) and
/// `knobs` into a trace file of its own (tests run in parallel in one
/// process); returns the run's name, the trace and what the recorded
/// program printed.
pub fn record_run(
    exe: &Path,
    args: &[&str],
    libs: &[&str],
    knobs: Knobs,
) -> (String, PathBuf, std::process::Output) {
    let name = exe.file_name().unwrap().to_string_lossy().into_owned();
    let name = format!("{name} {}", args.join(" "));
    let name = match knobs.half {
        Some(h) => format!("{name} half={h}"),
        None => name,
    };
    let name = match knobs.placement {
        Some(p) => format!("{name} placement={p}"),
        None => name,
    };
    let name = if knobs.data {
        format!("{name} data")
    } else {
        name
    };
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let trace = super::scratch("trace-oracle").join(format!(
        "{}-{}-{call}.aet",
        name.trim().replace(' ', "-").replace('/', "_"),
        std::process::id()
    ));
    let libs_arg = if libs.is_empty() {
        "none".to_owned()
    } else {
        libs.join(",")
    };
    let mut rec = Command::new(super::aetrace());
    if let Some(h) = knobs.half {
        rec.env("AETRACE_HALF_SIZE", h.to_string());
    }
    rec.arg("record");
    if let Some(p) = knobs.placement {
        rec.args(["--placement", p]);
    }
    if knobs.data {
        rec.arg("--data");
    }
    if knobs.data || knobs.fixed {
        super::no_aslr(&mut rec);
    }
    let out = rec
        .arg("-o")
        .arg(&trace)
        .args(["--libs", &libs_arg, "--"])
        .arg(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (name, trace, out)
}

/// [`record_run`], which must succeed.
pub fn record_ok(
    exe: &Path,
    args: &[&str],
    libs: &[&str],
    knobs: Knobs,
) -> (String, PathBuf, std::process::Output) {
    let (name, trace, rec) = record_run(exe, args, libs, knobs);
    assert!(
        rec.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&rec.stderr)
    );
    (name, trace, rec)
}

/// Records `exe args` ([`record_run`]) and checks the recorded run's
/// stdout, stderr and status against the native run's; the program's name
/// and the trace.
pub fn record_checked(exe: &Path, args: &[&str], libs: &[&str], knobs: Knobs) -> (String, PathBuf) {
    let native = run_native(exe, args);
    let (name, trace, recorded) = record_run(exe, args, libs, knobs);
    assert_same_run(
        &name,
        &recorded,
        &native.stdout,
        &native.stderr,
        native.status.code(),
    );
    (name, trace)
}

/// The recorded run printed `stdout` and `stderr` and exited with `code`,
/// as the native run did.
pub fn assert_same_run(
    name: &str,
    recorded: &std::process::Output,
    stdout: &[u8],
    stderr: &[u8],
    code: Option<i32>,
) {
    assert_eq!(
        String::from_utf8_lossy(&recorded.stderr),
        String::from_utf8_lossy(stderr),
        "{name}: stderr differs"
    );
    assert_eq!(recorded.stdout, stdout, "{name}: stdout differs");
    assert_eq!(recorded.status.code(), code, "{name}: status differs");
}

/// The paths of the instrumented modules of a trace (`aetrace info
/// --json`), the executable first.
pub fn instrumented_modules(info: &serde_json::Value) -> Vec<PathBuf> {
    info["modules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["instrumented"] == true)
        .map(|m| PathBuf::from(m["path"].as_str().unwrap()))
        .collect()
}

/// The process image thread `t` of a trace (`aetrace info --json`) runs
/// in: the thread whose exec started it (`start` "exec"), inherited
/// from the creator; `None` for the launched program's.
pub fn image_of(info: &serde_json::Value, t: usize) -> Option<u64> {
    let thread = &info["threads"][t];
    if thread["start"] == "exec" {
        return Some(t as u64);
    }
    let parent = thread["parent"].as_u64()?;
    image_of(info, parent as usize)
}

/// [`instrumented_modules`] of one process image ([`image_of`]), each
/// with its `programs` entry: one per program database, in the order of
/// the modules that hold one (a module of a program an earlier image ran
/// shares that module's, `database_of`).
pub fn image_modules(info: &serde_json::Value, image: Option<u64>) -> Vec<(usize, PathBuf)> {
    let modules = info["modules"].as_array().unwrap().iter();
    let instrumented: Vec<_> = modules.filter(|m| m["instrumented"] == true).collect();
    let id = |m: &serde_json::Value| m["id"].as_u64().unwrap();
    let owners: Vec<u64> = (instrumented.iter())
        .filter(|m| m["database_of"].is_null())
        .map(|m| id(m))
        .collect();
    (instrumented.iter())
        .filter(|m| m["image_thread"].as_u64() == image)
        .map(|m| {
            let own = m["database_of"].as_u64().unwrap_or_else(|| id(m));
            let k = owners.iter().position(|&o| o == own).unwrap();
            (k, PathBuf::from(m["path"].as_str().unwrap()))
        })
        .collect()
}

/// `n` lines of pseudo-random numbers for sort.
pub fn sort_lines(n: u64) -> String {
    (0..n)
        .map(|i| format!("{}\n", i.wrapping_mul(2_654_435_761) % 1_000_003))
        .collect()
}

/// One workload of issue 4 and `bench/record.sh`.
pub struct Workload {
    /// Named in the bench's report (`bench/exactness.rs`); the tests run
    /// every workload.
    #[allow(dead_code)]
    pub name: &'static str,
    pub exe: &'static str,
    pub args: Vec<String>,
    /// `--libs`: bzip2 and xz do their work in libbz2 and liblzma.
    pub libs: &'static [&'static str],
}

/// The workloads of issue 4 at their sizes, their inputs written: gzip and
/// bzip2 (with libbz2) on 20 kB and 2 MB, xz with liblzma on 20 kB and 2
/// MB, sort on 100,000 lines (`-S`: sort sizes its buffer from the free
/// memory of the moment otherwise, a branch that differs between runs).
pub fn issue_workloads() -> Vec<Workload> {
    let dir = super::scratch("workloads");
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p.display().to_string()
    };
    let small = write("text-20000", &super::text_input(20_000));
    let large = write("text-2000000", &super::text_input(2_000_000));
    let lines = write("lines-100k", sort_lines(100_000).as_bytes());
    let w = |name, exe, args: &[&str], libs| Workload {
        name,
        exe,
        args: args.iter().map(|a| a.to_string()).collect(),
        libs,
    };
    vec![
        w("gzip 20kB", "/usr/bin/gzip", &["-c", &small], &[]),
        w("gzip 2MB", "/usr/bin/gzip", &["-c", &large], &[]),
        w(
            "bzip2 20kB",
            "/usr/bin/bzip2",
            &["-c", &small],
            &["libbz2.so.1.0"],
        ),
        w(
            "bzip2 2MB",
            "/usr/bin/bzip2",
            &["-c", &large],
            &["libbz2.so.1.0"],
        ),
        w("xz 20kB", "/usr/bin/xz", &["-c", &small], &["liblzma.so.5"]),
        w("xz 2MB", "/usr/bin/xz", &["-c", &large], &["liblzma.so.5"]),
        w(
            "sort 100k lines",
            "/usr/bin/sort",
            &["-S", "64M", &lines],
            &[],
        ),
    ]
}

impl Workload {
    pub fn args(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }
}

/// `aetrace cfg --json EXE`, parsed.
pub fn cfg_json(exe: &Path) -> serde_json::Value {
    let out = Command::new(super::aetrace())
        .args(["cfg", "--json"])
        .arg(exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `aetrace record --data --check -o TRACE -- EXE`, which must succeed:
/// the program's output (it writes to the recorder's stdout).
pub fn record_data_checked(exe: &Path, trace: &Path) -> std::process::Output {
    record_with(exe, trace, &["--data", "--check"])
}

/// `aetrace record FLAGS -o TRACE -- EXE`, which must succeed: the
/// program's output.
pub fn record_with(exe: &Path, trace: &Path, flags: &[&str]) -> std::process::Output {
    super::build::run_checked(
        Command::new(super::aetrace())
            .arg("record")
            .args(flags)
            .arg("-o")
            .arg(trace)
            .arg("--")
            .arg(exe),
        &format!("aetrace record {}", flags.join(" ")),
    )
}
