//! The CI smoke of the fuzz targets on stable Rust: every committed corpus
//! input and every past finding (`fuzz/corpus/TARGET/`,
//! `fuzz/regressions/TARGET/`) through its target's body, then a fixed
//! number of deterministic mutants of them. A reader that panics fails the
//! test; one that aborts, hangs or exhausts memory fails it too (the test
//! process dies or times out), which is why the readers must bound their
//! work rather than rely on `catch_unwind`.

use std::path::{Path, PathBuf};

use aetrace_fuzzing::mutate::{mutate, Rng};
use aetrace_fuzzing::TARGETS;

/// Mutants per target: a few seconds in all in a release build.
const MUTANTS: usize = 1500;

fn dir(kind: &str, target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(kind)
        .join(target)
}

/// The files of `dir`, sorted by name (empty if it does not exist).
fn inputs(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
    paths.sort();
    paths
        .iter()
        .filter(|p| p.is_file())
        .map(|p| std::fs::read(p).unwrap())
        .collect()
}

#[test]
fn corpus_and_regressions_replay() {
    for (name, body) in TARGETS {
        let corpus = inputs(&dir("corpus", name));
        assert!(
            corpus.len() >= 5,
            "{name}: corpus has {} inputs",
            corpus.len()
        );
        for input in corpus.iter().chain(&inputs(&dir("regressions", name))) {
            body(input);
        }
    }
}

#[test]
fn mutants_of_the_corpus() {
    for (t, (name, body)) in TARGETS.iter().enumerate() {
        let corpus = inputs(&dir("corpus", name));
        let mut rng = Rng::new(0x5eed + t as u64);
        for _ in 0..MUTANTS {
            let mut data = corpus[rng.below(corpus.len())].clone();
            let other = &corpus[rng.below(corpus.len())];
            mutate(&mut rng, &mut data, other);
            body(&data);
        }
    }
}
