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
