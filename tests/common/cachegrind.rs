//! Reading valgrind cachegrind's summary (`--cache-sim=yes`, printed on
//! stderr): the oracle of the cache-simulator tests.

/// Cachegrind's summary figure after `label` (`I   refs:`, `I1  misses:`, ...),
/// thousands separators removed.
pub fn number(summary: &str, label: &str) -> u64 {
    let line = summary
        .lines()
        .find(|l| l.contains(label))
        .unwrap_or_else(|| panic!("no {label:?} in cachegrind output:\n{summary}"));
    let after = &line[line.find(label).unwrap() + label.len()..];
    after
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("nothing after {label:?} in {line:?}"))
        .replace(',', "")
        .parse()
        .unwrap_or_else(|e| panic!("{label:?} in {line:?}: {e}"))
}

/// Cachegrind's split figure after `label` (`D   refs:`, `D1  misses:`,
/// `LLd misses:`): (reads, writes), from its `(R rd + W wr)`.
pub fn read_write(summary: &str, label: &str) -> (u64, u64) {
    let line = summary
        .lines()
        .find(|l| l.contains(label))
        .unwrap_or_else(|| panic!("no {label:?} in cachegrind output:\n{summary}"));
    let inner = line
        .split_once('(')
        .and_then(|(_, r)| r.split_once(')'))
        .unwrap_or_else(|| panic!("no (rd + wr) in {line:?}"))
        .0;
    let n: Vec<u64> = inner
        .split_whitespace()
        .filter_map(|w| w.replace(',', "").parse().ok())
        .collect();
    assert_eq!(n.len(), 2, "two figures in {line:?}");
    (n[0], n[1])
}

/// A cache level's geometry as cachegrind's `--I1`/`--D1`/`--LL` take it:
/// size in bytes, associativity, line size.
pub type Geometry = (u64, u64, u64);

/// `exe args` under `valgrind --tool=cachegrind --cache-sim=yes` with
/// these caches, its stdout to `stdout` (glibc's stdio takes another path
/// for a regular file than for a pipe or `/dev/null`): the run's status
/// and its summary (stderr).
pub fn run(
    exe: &std::path::Path,
    args: &[&str],
    (i1, d1, ll): (Geometry, Geometry, Geometry),
    stdout: std::process::Stdio,
) -> (std::process::ExitStatus, String) {
    let out = std::process::Command::new("valgrind")
        .args([
            "--tool=cachegrind",
            "--cache-sim=yes",
            "--cachegrind-out-file=/dev/null",
        ])
        .arg(format!("--I1={},{},{}", i1.0, i1.1, i1.2))
        .arg(format!("--D1={},{},{}", d1.0, d1.1, d1.2))
        .arg(format!("--LL={},{},{}", ll.0, ll.1, ll.2))
        .arg(exe)
        .args(args)
        .stdout(stdout)
        .output()
        .expect("valgrind (cachegrind)");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `aetrace cachesim` options that simulate cachegrind's model with
/// the same I1, D1 and LL as a cachegrind run, JSON output, on `input`.
pub fn model_args(
    i1: Geometry,
    d1: Geometry,
    ll: Geometry,
    input: &std::path::Path,
) -> Vec<String> {
    let mut v: Vec<String> = ["--model", "cachegrind", "--json"].map(String::from).into();
    for (level, (size, assoc, line)) in [("l1-i", i1), ("l1-d", d1), ("l2-u", ll)] {
        v.extend([
            format!("-{level}size"),
            size.to_string(),
            format!("-{level}assoc"),
            assoc.to_string(),
            format!("-{level}bsize"),
            line.to_string(),
        ]);
    }
    v.push(input.to_str().expect("a UTF-8 path").to_string());
    v
}
