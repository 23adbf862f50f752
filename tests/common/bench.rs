//! What the benches that reuse the test harness share: the `ONLY=a,b`
//! selection and the line that says on what machine a run was made.
//! Included by the benches only, so not a module of `common`.

/// The names `ONLY=a,b` selects (empty: every one).
pub fn only() -> Vec<String> {
    std::env::var("ONLY")
        .map(|s| s.split(',').map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Whether `name` is selected by `only` (see [`only`]).
pub fn selected(only: &[String], name: &str) -> bool {
    only.is_empty() || only.iter().any(|o| name.contains(o.as_str()))
}

/// "N cores, load A B C": timings read with it in mind.
pub fn machine() -> String {
    format!(
        "{} cores, load {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    )
}
