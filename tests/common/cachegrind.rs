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
