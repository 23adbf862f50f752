//! A Dinero hierarchy simulated as two independent halves, one per core
//! (issue 24 item 4: "the simulator splits work by cache set").
//!
//! Every cache's set index is a run of address bits above its line
//! offset. When one address bit `b` is at or above every cache's line
//! offset and below the top of every cache's set index, the addresses
//! with `b` clear and those with `b` set reach disjoint sets of every
//! cache, and everything a reference sends towards memory (the miss
//! fetch of its line, a write-through of its piece, a dirty victim of
//! its set) stays on its side. So two hierarchies, each fed the
//! references of one side in trace order, end with the sets of one
//! hierarchy fed everything, and their counters add up to its counters.
//!
//! A reference crossing a boundary of `b`'s granules (`2^b` bytes) is
//! cut there and each piece sent to its side; the granule boundary is a
//! line boundary of the first cache too, which would split it there, so
//! the pieces and their counts are the same, except the split itself,
//! counted back in the first cache's multi-block references at the end.
//!
//! Not split (no bit qualifies, or [`Halves::new`] says `None`): random
//! replacement (one random sequence for the whole hierarchy, drawn in
//! trace order), `-ccc` (its fully associative shadow has one set), and
//! a cache whose sets cannot be split (one set, or line offsets and set
//! indices that share no bit). The end-of-run copy-back is per half in
//! the same set order, so each side's lower levels see their writes in
//! the order the whole would. Invariant: `splits[k]` counts the cuts of
//! references of kind `k` made so far.

use crate::cache::Repl;
use crate::dinero::Hierarchy;
use crate::trace::Ref;
use crate::AccessKind;

/// The split of one hierarchy's references into two halves.
#[derive(Clone, Debug)]
pub struct Halves {
    /// The address bit that picks the half.
    bit: u32,
    /// Cuts at granule boundaries, per access kind.
    splits: [u64; 4],
}

impl Halves {
    /// The split for `h`'s caches, if one exists (the module comment).
    pub fn new(h: &Hierarchy) -> Option<Self> {
        let cs = || h.caches.iter().map(|c| &c.config);
        if cs().any(|c| c.ccc || c.repl == Repl::Random) {
            return None;
        }
        let lo = cs().map(|c| c.bsize.trailing_zeros()).max()?;
        let hi = (cs().map(|c| c.bsize.trailing_zeros() + c.sets().trailing_zeros())).min()?;
        (lo < hi).then_some(Halves {
            bit: lo,
            splits: [0; 4],
        })
    }

    /// Appends each reference of `refs`, or its pieces, to the half it
    /// belongs to, in order.
    #[inline]
    pub fn split(&mut self, refs: &[Ref], out: &mut [Vec<Ref>; 2]) {
        for &r in refs {
            let first = r.addr >> self.bit;
            // No overflow: references never wrap the address space.
            let last = (r.addr + u64::from(r.size) - 1) >> self.bit;
            if first == last {
                out[(first & 1) as usize].push(r);
            } else {
                self.cut(r, out);
            }
        }
    }

    /// A reference crossing granule boundaries, as one piece per granule.
    #[cold]
    fn cut(&mut self, r: Ref, out: &mut [Vec<Ref>; 2]) {
        let end = r.addr + u64::from(r.size);
        let mut addr = r.addr;
        while addr < end {
            let granule = addr >> self.bit;
            let next = ((granule + 1) << self.bit).min(end);
            out[(granule & 1) as usize].push(Ref {
                kind: r.kind,
                addr,
                size: (next - addr) as u32,
            });
            addr = next;
        }
        self.splits[r.kind as usize] += (((end - 1) >> self.bit) - (r.addr >> self.bit)) as u64;
    }

    /// The counters of the whole from its two finished halves: their sums,
    /// with the cuts counted back.
    pub fn join(&self, mut a: Hierarchy, b: &Hierarchy) -> Hierarchy {
        a.absorb(b);
        for k in AccessKind::ALL {
            a.count_splits(k, self.splits[k as usize]);
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Rng;
    use crate::config::{CacheConfig, Side, WriteAlloc, WriteBack};
    use proptest::prelude::*;

    /// A cache of `2^bshift`-byte lines, `2^sets` sets and `2^assoc` ways.
    fn cache(level: usize, side: Side, bshift: u32, sets: u32, assoc: u32) -> CacheConfig {
        let (bsize, assoc) = (1u64 << bshift, 1u64 << assoc);
        CacheConfig::new(level, side, (bsize * assoc) << sets, bsize, assoc).unwrap()
    }

    #[test]
    fn no_split_without_a_shared_bit_nor_with_random_or_ccc() {
        let h = |cs| Hierarchy::new(cs, 1);
        let l1 = cache(1, Side::Unified, 6, 4, 2);
        assert_eq!(Halves::new(&h(vec![l1.clone()])).map(|s| s.bit), Some(6));
        // A fully associative cache has one set.
        assert!(Halves::new(&h(vec![cache(1, Side::Unified, 6, 0, 3)])).is_none());
        // L2's lines are above L1's set index.
        let l2 = cache(2, Side::Unified, 11, 4, 2);
        assert!(Halves::new(&h(vec![l1.clone(), l2])).is_none());
        let (mut r, mut c) = (l1.clone(), l1);
        r.repl = Repl::Random;
        c.ccc = true;
        assert!(Halves::new(&h(vec![r])).is_none());
        assert!(Halves::new(&h(vec![c])).is_none());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Two halves joined give exactly the statistics of the whole
        /// hierarchy fed everything, after the final copy-back: LRU and
        /// FIFO, every write policy, split or unified first level, one
        /// or two levels of other line sizes, and references of every
        /// kind crossing lines and granules.
        #[test]
        fn halves_equal_the_whole(
            bshift in 2u32..7,
            sets in 1u32..6,
            assoc in 0u32..4,
            l2 in proptest::option::of((0u32..3, 1u32..7, 0u32..4)),
            split in any::<bool>(),
            fifo in any::<bool>(),
            walloc in 0usize..3,
            wback in 0usize..3,
            seed in any::<u64>(),
            n in 1usize..3000,
        ) {
            let side = if split { Side::Data } else { Side::Unified };
            let mut l1 = cache(1, side, bshift, sets, assoc);
            l1.repl = if fifo { Repl::Fifo } else { Repl::Lru };
            l1.walloc = [WriteAlloc::Always, WriteAlloc::Never, WriteAlloc::NoFetch][walloc];
            l1.wback = [WriteBack::Always, WriteBack::Never, WriteBack::NoFetch][wback];
            let mut configs = vec![l1];
            if split {
                configs.push(cache(1, Side::Instr, bshift, sets, assoc));
            }
            if let Some((up, sets2, assoc2)) = l2 {
                configs.push(cache(2, Side::Unified, bshift + up, sets2 + 2, assoc2));
            }
            let whole = Hierarchy::new(configs.clone(), seed);
            let Some(mut halves) = Halves::new(&whole) else {
                return Ok(());
            };
            // A small region, so sets conflict and lines are written back.
            let mut rng = Rng::new(seed);
            let refs: Vec<Ref> = (0..n)
                .map(|_| Ref {
                    kind: AccessKind::ALL[rng.below(4)],
                    addr: rng.below(1 << 13) as u64,
                    size: 1 + rng.below(40) as u32,
                })
                .collect();
            let mut whole = whole;
            whole.run(&refs);
            whole.finish();
            let mut out = [Vec::new(), Vec::new()];
            halves.split(&refs, &mut out);
            let [a, b] = out.map(|refs| {
                let mut h = Hierarchy::new(configs.clone(), seed);
                h.run(&refs);
                h.finish();
                h
            });
            let joined = halves.join(a, &b);
            for (j, w) in joined.caches.iter().zip(&whole.caches) {
                prop_assert_eq!(&j.stats, &w.stats, "{}", w.config.name);
            }
        }
    }
}
