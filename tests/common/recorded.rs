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
    let names: Vec<String> = info["programs"][k]["left_alone"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap().to_owned())
        .collect();
    let cfg = Command::new(super::aetrace())
        .args(["cfg", "--json"])
        .arg(exe)
        .output()
        .unwrap();
    let cfg: serde_json::Value = serde_json::from_slice(&cfg.stdout).unwrap();
    let mut ranges = Vec::new();
    for p in cfg["procedures"].as_array().unwrap() {
        if names.iter().any(|n| p["name"] == n.as_str()) {
            for r in p["ranges"].as_array().unwrap() {
                ranges.push((r[0].as_u64().unwrap(), r[1].as_u64().unwrap()));
            }
        }
    }
    ranges
}

/// What a test may change in a recording: buffer halves of `half` bytes
/// (`AETRACE_HALF_SIZE`, the recorder's testing knob) and the witness
/// placement (`--placement`; the default, optimal, when `None`).
#[derive(Clone, Copy)]
pub struct Knobs {
    pub half: Option<u64>,
    pub placement: Option<&'static str>,
}

impl Knobs {
    pub const DEFAULT: Knobs = Knobs {
        half: None,
        placement: None,
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
    if let Some(p) = knobs.placement {
        rec.args(["record", "--placement", p]);
    } else {
        rec.arg("record");
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
    assert_eq!(
        String::from_utf8_lossy(&recorded.stderr),
        String::from_utf8_lossy(&native.stderr),
        "{name}: stderr differs"
    );
    assert_eq!(recorded.stdout, native.stdout, "{name}: stdout differs");
    assert_eq!(
        recorded.status.code(),
        native.status.code(),
        "{name}: status differs"
    );
    (name, trace)
}

/// `n` lines of pseudo-random numbers for sort.
pub fn sort_lines(n: u64) -> String {
    (0..n)
        .map(|i| format!("{}\n", i.wrapping_mul(2_654_435_761) % 1_000_003))
        .collect()
}
