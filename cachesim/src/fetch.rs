//! Block-level instruction fetch: a basic block's instructions are
//! consecutive, so the cache lines they touch are a run of consecutive
//! lines, each touched by consecutive instructions. Only an instruction
//! that touches a line the one before it did not (a *leader*) can miss or
//! change any state; the others are counted in bulk.
//!
//! Why that is exact: a non-leader lies in the line its predecessor ended
//! in, so at the first-level cache it is an access to the line accessed
//! just before. Under every policy this simulator has, such an access hits
//! and changes nothing: LRU finds the line on top of its set already (the
//! last access put it there, even in a single-set cache); FIFO and random
//! change nothing on a hit (random draws a number only to choose a victim,
//! on a miss); an instruction fetch is a read, so no dirty bit or write
//! policy is involved; `-ccc`'s fully associative shadow was accessed last
//! at the same line too, and a hit is not classified. Prefetching and
//! sub-blocks, which would act on hits, are refused by [`crate::config`].
//! A leader straddling from the previous line into a new one is simulated
//! whole (its piece in the old line is such a repeat), so Dinero's pieces
//! and "multi-block" count, and cachegrind's rule that a straddling access
//! is one access missing if either line misses, come out as they would
//! instruction by instruction.
//!
//! The claim needs the first-level cache to see nothing between two
//! fetches of one block: true while traces hold instruction fetches only
//! (a unified first level fed data references too must fall back to
//! [`InsnFetch::fetch`] per instruction). The tests check block-level
//! results against per-instruction results for every policy, `-ccc`,
//! multi-level hierarchies and the cachegrind model, on random blocks.
//!
//! Invariant of [`BlockLines`]: for each block, its leaders in order, the
//! first instruction always one of them; the leaders' `follow` counts plus
//! their number equal the block's instruction count.

use crate::cachegrind::Cachegrind;
use crate::dinero::Hierarchy;
use crate::trace::Ref;
use crate::{AccessKind, Result};

/// A block of code: where its first instruction is and how long each
/// instruction is.
#[derive(Clone, Copy, Debug)]
pub struct CodeBlock<'a> {
    /// Address of the first instruction.
    pub addr: u64,
    /// Instruction lengths, in order.
    pub lens: &'a [u8],
}

/// An instruction whose fetch is simulated, and how many after it are not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The instruction's address.
    pub addr: u64,
    /// Its length.
    pub size: u32,
    /// Instructions after it, in its block, that touch no new line.
    pub follow: u32,
}

/// Where a block's leaders are.
#[derive(Clone, Copy, Debug, Default)]
struct Span {
    lo: u32,
    hi: u32,
    ninsns: u32,
}

/// Every block's leaders for one line size, indexed by block number.
#[derive(Clone, Debug, Default)]
pub struct BlockLines {
    leaders: Vec<Leader>,
    /// Per block: its leaders' range in `leaders` and its instruction
    /// count (one entry: one cache line per block looked up).
    blocks: Vec<Span>,
}

impl BlockLines {
    /// The leaders of `blocks` (numbered in iteration order) for lines of
    /// `line` bytes (a power of two).
    pub fn new<'a>(blocks: impl IntoIterator<Item = CodeBlock<'a>>, line: u64) -> Self {
        debug_assert!(line.is_power_of_two());
        let shift = line.trailing_zeros();
        let mut t = BlockLines::default();
        for b in blocks {
            let lo = t.leaders.len() as u32;
            let mut addr = b.addr;
            let mut last_line = None;
            for &len in b.lens {
                let end_line = (addr + u64::from(len).max(1) - 1) >> shift;
                if last_line == Some(end_line) {
                    t.leaders.last_mut().expect("a leader before").follow += 1;
                } else {
                    t.leaders.push(Leader {
                        addr,
                        size: u32::from(len),
                        follow: 0,
                    });
                }
                last_line = Some(end_line);
                addr += u64::from(len);
            }
            t.blocks.push(Span {
                lo,
                hi: t.leaders.len() as u32,
                ninsns: b.lens.len() as u32,
            });
        }
        t
    }

    /// The leaders of block `id` and its instruction count.
    #[inline]
    pub fn block(&self, id: usize) -> (&[Leader], u32) {
        let s = self.blocks[id];
        (&self.leaders[s.lo as usize..s.hi as usize], s.ninsns)
    }
}

/// A simulator of instruction fetches, per instruction or block by block.
pub trait InsnFetch {
    /// The line size at which instruction fetches enter the first cache
    /// (where [`BlockLines`] are cut).
    fn fetch_line(&self) -> u64;
    /// Simulates one instruction fetch.
    fn fetch(&mut self, r: Ref) -> Result<()>;
    /// Counts `n` fetches that repeat the line fetched last (hits that
    /// change nothing).
    fn repeat(&mut self, n: u64);

    /// Simulates a whole block from its leaders.
    #[inline]
    fn block(&mut self, leaders: &[Leader]) -> Result<()> {
        for l in leaders {
            self.fetch(Ref {
                kind: AccessKind::Instr,
                addr: l.addr,
                size: l.size,
            })?;
            if l.follow > 0 {
                self.repeat(u64::from(l.follow));
            }
        }
        Ok(())
    }
}

/// Several simulators fed one stream (`--configs`): the leaders of the
/// smallest line size are given to all. That is exact for the larger lines
/// too: an instruction that touches no new small line touches no new large
/// line either (large lines are unions of small ones), so the extra leaders
/// a larger line sees are repeats of the line accessed last, which hit and
/// change nothing (the module comment).
impl<S: InsnFetch> InsnFetch for Vec<S> {
    fn fetch_line(&self) -> u64 {
        self.iter().map(S::fetch_line).min().unwrap_or(64)
    }
    fn fetch(&mut self, r: Ref) -> Result<()> {
        self.iter_mut().try_for_each(|s| s.fetch(r))
    }
    fn repeat(&mut self, n: u64) {
        self.iter_mut().for_each(|s| s.repeat(n));
    }
    #[inline]
    fn block(&mut self, leaders: &[Leader]) -> Result<()> {
        self.iter_mut().try_for_each(|s| s.block(leaders))
    }
}

impl InsnFetch for Hierarchy {
    fn fetch_line(&self) -> u64 {
        self.first_cache(AccessKind::Instr)
            .map_or(64, |c| c.config.bsize)
    }
    #[inline]
    fn fetch(&mut self, r: Ref) -> Result<()> {
        self.reference(r);
        Ok(())
    }
    #[inline]
    fn repeat(&mut self, n: u64) {
        self.count_hits(AccessKind::Instr, n);
    }
    #[inline]
    fn block(&mut self, leaders: &[Leader]) -> Result<()> {
        self.fetch_block(leaders);
        Ok(())
    }
}

impl InsnFetch for Cachegrind {
    fn fetch_line(&self) -> u64 {
        self.i1_line()
    }
    #[inline]
    fn fetch(&mut self, r: Ref) -> Result<()> {
        self.reference(r)
    }
    #[inline]
    fn repeat(&mut self, n: u64) {
        self.count_i1_hits(n);
    }
    #[inline]
    fn block(&mut self, leaders: &[Leader]) -> Result<()> {
        self.fetch_block(leaders)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{Repl, Rng};
    use crate::config::{CacheConfig, Side, WriteAlloc, WriteBack};
    use proptest::prelude::*;

    #[test]
    fn leaders_start_new_lines() {
        // 16-byte lines: 0x0c+4 ends line 0; 0x10+2 and 0x12+1 are in line
        // 1; 0x13+14 straddles into line 2; 0x21+3 stays there.
        let lens = [4u8, 2, 1, 14, 3];
        let t = BlockLines::new(
            [CodeBlock {
                addr: 0x0c,
                lens: &lens,
            }],
            16,
        );
        let l = |addr, size, follow| Leader { addr, size, follow };
        let want = [l(0x0c, 4, 0), l(0x10, 2, 1), l(0x13, 14, 1)];
        assert_eq!(t.block(0), (&want[..], 5));
    }

    /// Random blocks laid out in a small code region (so lines are shared
    /// between blocks and sets conflict), and a random walk over them.
    fn program(seed: u64, nblocks: usize, steps: usize) -> (Vec<(u64, Vec<u8>)>, Vec<usize>) {
        let mut rng = Rng::new(seed);
        let blocks = (0..nblocks)
            .map(|_| {
                let addr = 0x40_0000 + rng.below(4096) as u64;
                let n = 1 + rng.below(12);
                let lens = (0..n).map(|_| 1 + rng.below(15) as u8).collect();
                (addr, lens)
            })
            .collect();
        let walk = (0..steps).map(|_| rng.below(nblocks)).collect();
        (blocks, walk)
    }

    /// Runs `walk` through `sim` block by block and, on a clone, fetch by
    /// fetch.
    fn both<S: InsnFetch>(
        blocks: &[(u64, Vec<u8>)],
        walk: &[usize],
        bulk: &mut S,
        each: &mut S,
    ) -> (Result<()>, Result<()>) {
        let code = blocks
            .iter()
            .map(|(addr, lens)| CodeBlock { addr: *addr, lens });
        let t = BlockLines::new(code, bulk.fetch_line());
        let a = walk.iter().try_for_each(|&b| bulk.block(t.block(b).0));
        let b = walk.iter().try_for_each(|&b| {
            let (mut addr, lens) = (blocks[b].0, &blocks[b].1);
            lens.iter().try_for_each(|&len| {
                let r = each.fetch(Ref {
                    kind: AccessKind::Instr,
                    addr,
                    size: u32::from(len),
                });
                addr += u64::from(len);
                r
            })
        });
        (a, b)
    }

    fn cache(
        level: usize,
        side: Side,
        geom: (u64, u64, u64),
        repl: Repl,
        ccc: bool,
    ) -> CacheConfig {
        let mut c = CacheConfig::new(level, side, geom.0, geom.1, geom.2).unwrap();
        c.repl = repl;
        c.ccc = ccc;
        c
    }

    const REPLS: [Repl; 3] = [Repl::Lru, Repl::Fifo, Repl::Random];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Dinero semantics: every policy, `-ccc`, split or unified first
        /// level, one or two levels, line sizes from 4 (instructions span
        /// up to four lines) to 128, fully associative included.
        #[test]
        fn dinero_blocks_equal_fetch_by_fetch(
            seed in any::<u64>(),
            repl in 0usize..3,
            repl2 in 0usize..3,
            ccc in any::<bool>(),
            unified in any::<bool>(),
            two in any::<bool>(),
            bshift in 2u32..8,
            sets_shift in 0u32..5,
            assoc_shift in 0u32..4,
            walloc in 0usize..3,
        ) {
            let (blocks, walk) = program(seed, 40, 600);
            let bsize = 1u64 << bshift;
            let assoc = 1u64 << assoc_shift;
            let size = (bsize * assoc) << sets_shift;
            let side = if unified { Side::Unified } else { Side::Instr };
            let mut l1 = cache(1, side, (size, bsize, assoc), REPLS[repl], ccc);
            l1.walloc = [WriteAlloc::Always, WriteAlloc::Never, WriteAlloc::NoFetch][walloc];
            let mut configs = vec![l1];
            if !unified {
                configs.push(cache(1, Side::Data, (1024, 32, 2), Repl::Lru, false));
            }
            if two {
                let mut l2 = cache(2, Side::Unified, (4 * size, 2 * bsize, 2 * assoc), REPLS[repl2], ccc);
                l2.wback = WriteBack::Never;
                configs.push(l2);
            }
            let mut bulk = Hierarchy::new(configs.clone(), seed);
            let mut each = Hierarchy::new(configs, seed);
            let (a, b) = both(&blocks, &walk, &mut bulk, &mut each);
            prop_assert!(a.is_ok() && b.is_ok());
            bulk.finish();
            each.finish();
            for (x, y) in bulk.caches.iter().zip(&each.caches) {
                prop_assert_eq!(&x.stats, &y.stats, "{}", x.config.name);
            }
            // The walk really missed and straddled.
            let first = &each.caches[0].stats;
            prop_assert!(first.miss[AccessKind::Instr as usize] > 0);
        }

        /// The cachegrind model, LL with its own line size; lines of 4 and
        /// 8 bytes make three-line instructions, refused at the same
        /// reference either way.
        #[test]
        fn cachegrind_blocks_equal_fetch_by_fetch(
            seed in any::<u64>(),
            bshift in 2u32..8,
            llshift in 2u32..8,
            sets_shift in 0u32..5,
            assoc_shift in 0u32..4,
        ) {
            let (blocks, walk) = program(seed, 40, 600);
            let bsize = 1u64 << bshift;
            let assoc = 1u64 << assoc_shift;
            let size = (bsize * assoc) << sets_shift;
            let i1 = cache(1, Side::Instr, (size, bsize, assoc), Repl::Lru, false);
            let d1 = cache(1, Side::Data, (1024, 64, 2), Repl::Lru, false);
            let lbs = 1u64 << llshift;
            let ll = cache(2, Side::Unified, ((4 * size).max(4 * lbs), lbs, 4), Repl::Lru, false);
            let configs = [i1, d1, ll];
            let mut bulk = Cachegrind::new(&configs).unwrap();
            let mut each = Cachegrind::new(&configs).unwrap();
            let (a, b) = both(&blocks, &walk, &mut bulk, &mut each);
            prop_assert_eq!(a.map_err(|e| e.to_string()), b.map_err(|e| e.to_string()));
            prop_assert_eq!(&bulk.stats, &each.stats);
        }

        /// `--configs`: simulators of different line sizes fed the
        /// smallest line's leaders give what each gives fetch by fetch.
        #[test]
        fn several_line_sizes_share_the_smallest_leaders(
            seed in any::<u64>(),
            shifts in proptest::collection::vec((2u32..8, 0u32..5, 0u32..4, 0usize..3), 1..5),
        ) {
            let (blocks, walk) = program(seed, 40, 600);
            let hierarchy = |&(bshift, sets_shift, assoc_shift, repl): &(u32, u32, u32, usize)| {
                let (bsize, assoc) = (1u64 << bshift, 1u64 << assoc_shift);
                let l1 = cache(1, Side::Instr, ((bsize * assoc) << sets_shift, bsize, assoc), REPLS[repl], false);
                Hierarchy::new(vec![l1], seed)
            };
            let mut bulk: Vec<Hierarchy> = shifts.iter().map(hierarchy).collect();
            let mut each: Vec<Hierarchy> = shifts.iter().map(hierarchy).collect();
            let (a, b) = both(&blocks, &walk, &mut bulk, &mut each);
            prop_assert!(a.is_ok() && b.is_ok());
            for (x, y) in bulk.iter_mut().zip(&mut each) {
                x.finish();
                y.finish();
                prop_assert_eq!(&x.caches[0].stats, &y.caches[0].stats);
            }
        }
    }
}
