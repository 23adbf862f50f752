//! One-pass LRU miss ratios for many cache sizes and associativities
//! (`--sweep 4k..8m --assoc 1,2,4,8,full`), and the miss-ratio curve as SVG.
//!
//! - Fully associative: Mattson et al.'s stack distances.  The distance of a
//!   reference is the number of distinct blocks touched since the previous
//!   reference to its block; an LRU cache of C blocks hits iff distance < C.
//!   Distances are counted with a Fenwick tree over reference times (a live
//!   mark at each block's latest time), compacted when the time space fills,
//!   so each reference costs O(log n).
//! - Set associative: for each distinct number of sets S among the
//!   requested configurations, one array of per-set LRU stacks truncated at
//!   the largest associativity A wanted with S sets; a hit at depth p is a
//!   hit for every associativity > p (the inclusion property of LRU, as in
//!   Hill & Smith's all-associativity simulation), so one pass serves all
//!   (S, a <= A).
//!
//! Semantics: every reference is split at block boundaries like Dinero
//! does and each piece is one access; all kinds are treated alike
//! (a unified, write-allocate LRU cache), so each result equals Dinero's
//! total demand misses for `-l1-usize S -l1-ubsize B -l1-uassoc A`, which
//! the tests check by running every configuration separately.
//!
//! Invariant: `hist[d]` counts accesses of stack depth `d`; cold accesses are
//! counted apart, so hits(C) = sum of `hist[..C]` exactly.

use std::collections::BTreeMap;
use std::path::Path;

use crate::cache::{BlockMap, INVALID};
use crate::trace::Ref;
use crate::{Error, Result};

/// Associativity of one swept configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Assoc {
    /// Set-associative with this many ways.
    Ways(u64),
    /// Fully associative.
    Full,
}

/// JSON: the number of ways, or `"full"`.
impl serde::Serialize for Assoc {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Assoc::Ways(w) => s.serialize_u64(*w),
            Assoc::Full => s.serialize_str("full"),
        }
    }
}

/// The configurations one sweep covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweepSpec {
    /// Cache sizes in bytes, powers of two, increasing.
    pub sizes: Vec<u64>,
    /// Associativities, each swept at every size.
    pub assocs: Vec<Assoc>,
    /// Block size in bytes, a power of two.
    pub bsize: u64,
}

impl SweepSpec {
    /// Parses `LO..HI` (powers of two with k/m/g suffixes; every power of two
    /// between them) and `1,2,4,full`.
    pub fn parse(range: &str, assoc: &str, bsize: u64) -> Result<Self> {
        let (lo, hi) = range.split_once("..").ok_or_else(|| {
            Error::Usage(format!("--sweep {range}: expected LO..HI, e.g. 4k..8m"))
        })?;
        let lo = crate::config::parse_scaled("--sweep", lo)?;
        let hi = crate::config::parse_scaled("--sweep", hi)?;
        for v in [lo, hi, bsize] {
            if v == 0 || !v.is_power_of_two() {
                return Err(Error::Usage(format!("--sweep: {v} is not a power of two")));
            }
        }
        if lo > hi || lo < bsize {
            return Err(Error::Usage(format!(
                "--sweep {range}: need block size ({bsize}) <= LO <= HI"
            )));
        }
        if hi / bsize > crate::config::MAX_BLOCKS {
            return Err(Error::Usage(format!(
                "--sweep {range}: {} blocks is more than this simulator holds",
                hi / bsize
            )));
        }
        let sizes: Vec<u64> = (lo.trailing_zeros()..=hi.trailing_zeros())
            .map(|k| 1u64 << k)
            .collect();
        let mut assocs = Vec::new();
        for a in assoc.split(',') {
            let a = a.trim();
            assocs.push(if a == "full" {
                Assoc::Full
            } else {
                let n: u64 = a
                    .parse()
                    .map_err(|_| Error::Usage(format!("--assoc {a}: expected a number or full")))?;
                if n == 0 || !n.is_power_of_two() {
                    return Err(Error::Usage(format!("--assoc {n}: not a power of two")));
                }
                Assoc::Ways(n)
            });
        }
        assocs.sort();
        assocs.dedup();
        Ok(SweepSpec {
            sizes,
            assocs,
            bsize,
        })
    }

    /// (size, assoc) pairs that make a cache (associativity within the
    /// number of blocks), in output order.
    pub fn configs(&self) -> Vec<(u64, Assoc)> {
        let mut v = Vec::new();
        for &a in &self.assocs {
            for &s in &self.sizes {
                if let Assoc::Ways(w) = a {
                    if w > s / self.bsize {
                        continue;
                    }
                }
                v.push((s, a));
            }
        }
        v
    }
}

/// Fenwick tree of live marks over reference times.
struct StackDistance {
    last: BlockMap<u32>,
    tree: Vec<u32>,
    now: u32,
}

impl StackDistance {
    fn new() -> Self {
        StackDistance {
            last: BlockMap::default(),
            tree: vec![0; 1 << 16],
            now: 0,
        }
    }

    fn add(&mut self, t: u32, delta: i32) {
        let mut i = t as usize + 1;
        while i < self.tree.len() {
            self.tree[i] = self.tree[i].wrapping_add_signed(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// Live marks at times `< t`.
    fn prefix(&self, t: u32) -> u32 {
        let mut i = t as usize;
        let mut s = 0u32;
        while i > 0 {
            s = s.wrapping_add(self.tree[i]);
            i &= i - 1;
        }
        s
    }

    /// Renumbers the live marks 0..n and rebuilds the tree, with room to grow.
    fn compact(&mut self) {
        let mut live: Vec<(u32, u64)> = self.last.iter().map(|(&b, &t)| (t, b)).collect();
        live.sort_unstable();
        let n = live.len();
        let cap = (2 * n + 1).next_power_of_two().max(1 << 16) + 1;
        self.tree = vec![0; cap];
        for (new_t, (_, b)) in live.into_iter().enumerate() {
            self.last.insert(b, new_t as u32);
            self.add(new_t as u32, 1);
        }
        self.now = n as u32;
    }

    /// The stack distance of an access to `block` (`None` if cold).
    #[inline]
    fn access(&mut self, block: u64) -> Option<u64> {
        if self.now as usize + 2 >= self.tree.len() {
            self.compact();
        }
        let now = self.now;
        let d = match self.last.insert(block, now) {
            Some(t) => {
                let d = self.prefix(now) - self.prefix(t + 1);
                self.add(t, -1);
                Some(u64::from(d))
            }
            None => None,
        };
        self.add(now, 1);
        self.now += 1;
        d
    }
}

/// Per-set LRU stacks for one number of sets.
struct SetStacks {
    sets: u64,
    depth: usize,
    tags: Vec<u64>,
    /// hits at each depth
    hist: Vec<u64>,
}

impl SetStacks {
    #[inline]
    fn access(&mut self, block: u64) {
        let base = (block & (self.sets - 1)) as usize * self.depth;
        let stack = &mut self.tags[base..base + self.depth];
        match stack.iter().position(|&t| t == block) {
            Some(p) => {
                self.hist[p] += 1;
                stack[..=p].rotate_right(1);
            }
            None => {
                stack.rotate_right(1);
                stack[0] = block;
            }
        }
    }
}

/// One configuration's result.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Point {
    /// Cache size in bytes.
    pub size: u64,
    /// Associativity.
    pub assoc: Assoc,
    /// References simulated.
    pub accesses: u64,
    /// Misses.
    pub misses: u64,
    /// `misses / accesses`.
    pub miss_ratio: f64,
}

/// The one-pass simulator.
pub struct Sweep {
    spec: SweepSpec,
    bshift: u32,
    accesses: u64,
    /// The previous access's block, and how many accesses repeated the
    /// block just before them: such an access is at depth 0 of every stack
    /// and changes none, so it is counted here and skipped.
    last: Option<u64>,
    repeats: u64,
    full: Option<(StackDistance, Vec<u64>)>,
    per_sets: Vec<SetStacks>,
}

impl Sweep {
    /// A simulator for every configuration of `spec`, run in one pass.
    pub fn new(spec: SweepSpec) -> Self {
        let bshift = spec.bsize.trailing_zeros();
        let mut depth_for_sets: BTreeMap<u64, u64> = BTreeMap::new();
        let mut full = false;
        for (size, a) in spec.configs() {
            match a {
                Assoc::Full => full = true,
                Assoc::Ways(w) => {
                    let sets = size / spec.bsize / w;
                    let d = depth_for_sets.entry(sets).or_insert(0);
                    *d = (*d).max(w);
                }
            }
        }
        let per_sets = depth_for_sets
            .into_iter()
            .map(|(sets, depth)| SetStacks {
                sets,
                depth: depth as usize,
                tags: vec![INVALID; (sets * depth) as usize],
                hist: vec![0; depth as usize],
            })
            .collect();
        Sweep {
            bshift,
            accesses: 0,
            last: None,
            repeats: 0,
            // Histogram of stack distances by bit length (0 for distance 0):
            // enough because swept sizes are powers of two.
            full: full.then(|| (StackDistance::new(), vec![0; 66])),
            per_sets,
            spec,
        }
    }

    #[inline]
    fn block(&mut self, block: u64) {
        self.accesses += 1;
        if self.last == Some(block) {
            self.repeats += 1;
            return;
        }
        self.last = Some(block);
        if let Some((sd, hist)) = &mut self.full {
            if let Some(d) = sd.access(block) {
                hist[(64 - d.leading_zeros()) as usize] += 1;
            }
        }
        for s in &mut self.per_sets {
            s.access(block);
        }
    }

    /// Simulates references (split at block boundaries).
    pub fn run(&mut self, refs: &[Ref]) {
        for r in refs {
            let first = r.addr >> self.bshift;
            let last = (r.addr + u64::from(r.size) - 1) >> self.bshift;
            for b in first..=last {
                self.block(b);
            }
        }
    }

    /// Results for every configuration.
    pub fn results(&self) -> Vec<Point> {
        let mut out = Vec::new();
        for (size, assoc) in self.spec.configs() {
            let blocks = size / self.spec.bsize;
            let hits: u64 = match assoc {
                Assoc::Full => {
                    let (_, hist) = self.full.as_ref().expect("full requested");
                    // distance d < blocks = 2^k  <=>  bit length of d <= k
                    let k = blocks.trailing_zeros() as usize;
                    hist[..=k].iter().sum()
                }
                Assoc::Ways(w) => {
                    let sets = blocks / w;
                    let s = self
                        .per_sets
                        .iter()
                        .find(|s| s.sets == sets)
                        .expect("sets simulated");
                    s.hist[..w as usize].iter().sum()
                }
            };
            debug_assert!(hits + self.repeats <= self.accesses);
            let misses = self.accesses - hits - self.repeats;
            out.push(Point {
                size,
                assoc,
                accesses: self.accesses,
                misses,
                miss_ratio: if self.accesses == 0 {
                    0.0
                } else {
                    misses as f64 / self.accesses as f64
                },
            });
        }
        out
    }
}

fn assoc_name(a: Assoc) -> String {
    match a {
        Assoc::Full => "full".into(),
        Assoc::Ways(w) => format!("{w}-way"),
    }
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}g", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}m", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}k", b >> 10),
        b => b.to_string(),
    }
}

/// A text table of the results.
pub fn table(points: &[Point], bsize: u64) -> String {
    let mut o = format!(
        "---aetrace cachesim one-pass LRU sweep (block size {bsize}, unified, write-allocate)\n"
    );
    o += &format!(
        "{:>8} {:>8} {:>14} {:>14} {:>10}\n",
        "size", "assoc", "accesses", "misses", "miss ratio"
    );
    for p in points {
        o += &format!(
            "{:>8} {:>8} {:>14} {:>14} {:>10.6}\n",
            human(p.size),
            assoc_name(p.assoc),
            p.accesses,
            p.misses,
            p.miss_ratio
        );
    }
    o
}

/// Draws the miss-ratio curves (one per associativity) as SVG.
pub fn svg(points: &[Point], bsize: u64, path: &Path) -> Result<()> {
    use plotters::prelude::*;
    let perr = |e: &dyn std::fmt::Display| Error::Plot(e.to_string());
    let (lo, hi) = points.iter().fold((u64::MAX, 0), |(lo, hi), p| {
        (lo.min(p.size), hi.max(p.size))
    });
    if points.is_empty() {
        return Err(Error::Plot("no configuration to plot".into()));
    }
    let ymax = points
        .iter()
        .map(|p| p.miss_ratio)
        .fold(0.0f64, f64::max)
        .max(1e-6)
        * 1.05;
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| perr(&e))?;
    let hi_x = if hi > lo { hi as f64 } else { lo as f64 * 2.0 };
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("LRU miss ratio, {bsize}-byte blocks"),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((lo as f64..hi_x).log_scale(), 0.0..ymax)
        .map_err(|e| perr(&e))?;
    chart
        .configure_mesh()
        .x_desc("cache size (bytes)")
        .y_desc("miss ratio")
        .x_label_formatter(&|x| human(x.round() as u64))
        .draw()
        .map_err(|e| perr(&e))?;
    let mut assocs: Vec<Assoc> = points.iter().map(|p| p.assoc).collect();
    assocs.dedup();
    for (k, a) in assocs.into_iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let series: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.assoc == a)
            .map(|p| (p.size as f64, p.miss_ratio))
            .collect();
        chart
            .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))
            .map_err(|e| perr(&e))?
            .label(assoc_name(a))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                series
                    .into_iter()
                    .map(|(x, y)| Circle::new((x, y), 3, color.filled())),
            )
            .map_err(|e| perr(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| perr(&e))?;
    root.present().map_err(|e| perr(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Rng;
    use crate::config::{CacheConfig, Side};
    use crate::dinero::Hierarchy;
    use crate::AccessKind;

    fn random_trace(n: usize, seed: u64) -> Vec<Ref> {
        let mut rng = Rng::new(seed);
        let kinds = AccessKind::ALL;
        (0..n)
            .map(|_| {
                // A mix of a hot region, a sweep-like region and far accesses.
                let region = rng.below(10);
                let addr = match region {
                    0..=5 => rng.below(4096) as u64,
                    6..=8 => 0x10000 + rng.below(64 * 1024) as u64,
                    _ => 0x100_0000 + rng.below(1 << 20) as u64,
                };
                Ref {
                    kind: kinds[rng.below(4)],
                    addr,
                    size: 1 + rng.below(16) as u32,
                }
            })
            .collect()
    }

    #[test]
    fn one_pass_equals_separate_runs_of_every_configuration() {
        let trace = random_trace(20_000, 11);
        let spec = SweepSpec::parse("256..64k", "1,2,4,8,full", 32).unwrap();
        let mut sw = Sweep::new(spec.clone());
        sw.run(&trace);
        let points = sw.results();
        assert_eq!(points.len(), spec.configs().len());
        for p in &points {
            let assoc = match p.assoc {
                Assoc::Ways(w) => w,
                Assoc::Full => p.size / 32,
            };
            let c = CacheConfig::new(1, Side::Unified, p.size, 32, assoc).unwrap();
            let mut h = Hierarchy::new(vec![c], 1);
            h.run(&trace);
            let s = &h.caches[0].stats;
            assert_eq!(p.accesses, s.fetch.iter().sum::<u64>(), "{p:?}");
            assert_eq!(p.misses, s.miss.iter().sum::<u64>(), "{p:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Random small traces and sweeps: the one pass equals a separate
        /// Dinero-semantics run of every configuration it covers.
        #[test]
        fn one_pass_equals_separate_runs_on_random_traces(
            refs in proptest::collection::vec((0u8..4, 0u64..4096, 1u32..40), 1..400),
            bsize_log in 2u32..6,
            lo_log in 0u32..3,
        ) {
            let bsize = 1u64 << bsize_log;
            let lo = bsize << lo_log;
            let trace: Vec<Ref> = refs.iter().map(|&(k, a, s)| Ref {
                kind: AccessKind::ALL[k as usize], addr: a, size: s,
            }).collect();
            let spec = SweepSpec {
                sizes: vec![lo, lo * 2, lo * 4, lo * 8],
                assocs: vec![Assoc::Ways(1), Assoc::Ways(2), Assoc::Ways(4), Assoc::Full],
                bsize,
            };
            let mut sw = Sweep::new(spec);
            sw.run(&trace);
            for p in sw.results() {
                let assoc = match p.assoc { Assoc::Ways(w) => w, Assoc::Full => p.size / bsize };
                let c = CacheConfig::new(1, Side::Unified, p.size, bsize, assoc).unwrap();
                let mut h = Hierarchy::new(vec![c], 1);
                h.run(&trace);
                proptest::prop_assert_eq!(p.misses, h.caches[0].stats.miss.iter().sum::<u64>());
                proptest::prop_assert_eq!(p.accesses, h.caches[0].stats.fetch.iter().sum::<u64>());
            }
        }
    }

    #[test]
    fn stack_distance_by_hand_and_across_compaction() {
        let mut sd = StackDistance::new();
        // a b c a : distance of the second a is 2 (b, c).
        assert_eq!(sd.access(1), None);
        assert_eq!(sd.access(2), None);
        assert_eq!(sd.access(3), None);
        assert_eq!(sd.access(1), Some(2));
        assert_eq!(sd.access(1), Some(0));
        assert_eq!(sd.access(3), Some(1));
        // Force several compactions; a cyclic walk over 5 blocks always has
        // distance 4.
        for k in 0..200_000u64 {
            let d = sd.access(100 + k % 5);
            if k >= 5 {
                assert_eq!(d, Some(4));
            }
        }
    }

    #[test]
    fn spec_parsing() {
        let s = SweepSpec::parse("4k..32k", "8,1,full,2", 64).unwrap();
        assert_eq!(s.sizes, vec![4096, 8192, 16384, 32768]);
        assert_eq!(
            s.assocs,
            vec![Assoc::Ways(1), Assoc::Ways(2), Assoc::Ways(8), Assoc::Full]
        );
        assert!(SweepSpec::parse("4k-8k", "1", 64).is_err());
        assert!(SweepSpec::parse("3k..8k", "1", 64).is_err());
        assert!(SweepSpec::parse("4k..8k", "3", 64).is_err());
    }

    #[test]
    fn svg_is_written() {
        let mut sw = Sweep::new(SweepSpec::parse("1k..8k", "1,full", 64).unwrap());
        sw.run(&random_trace(2000, 3));
        let dir = std::env::temp_dir().join(format!("cachesim-svg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mrc.svg");
        svg(&sw.results(), 64, &path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("<svg") && text.contains("full") && text.contains("polyline"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
