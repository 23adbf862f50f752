//! `aetrace regen` output: as addresses (the oracle side of the `debug`
//! and `stop_at` topics) and as the `--count` summary.

use std::path::Path;
use std::process::Command;

use super::build::run_checked;

/// The address of each line of `aetrace regen ARGS TRACE` (the first word,
/// in hex; `#` lines skipped): an instruction or block trace.
pub fn addresses(trace: &Path, args: &[&str]) -> Vec<u64> {
    text(trace, args)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let a = l.split_whitespace().next().unwrap();
            u64::from_str_radix(a, 16).unwrap_or_else(|_| panic!("regen line {l:?}"))
        })
        .collect()
}

/// The output of `aetrace regen ARGS TRACE`, which must succeed.
pub fn text(trace: &Path, args: &[&str]) -> String {
    let out = run_checked(
        Command::new(super::aetrace())
            .arg("regen")
            .args(args)
            .arg(trace),
        "aetrace regen",
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The text of `aetrace regen --count TRACE`, which must succeed.
pub fn count(trace: &Path) -> String {
    text(trace, &["--count"])
}
