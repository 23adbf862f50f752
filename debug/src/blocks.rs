//! The traced blocks of a thread's modules at their run-time addresses,
//! each with its procedure: which procedure an address is in (`monitor
//! info`, backtraces, the call tree's event names).
//!
//! Invariant: blocks are sorted by start and do not overlap (a program
//! database's blocks partition its traced code).

use crate::pcmap::PcSet;
use crate::timeline::Timeline;
use aetrace_regen::compile::Module as Compiled;

/// A traced block at its run-time address.
pub struct BlockAt<'m> {
    /// Its first byte.
    pub start: u64,
    /// Past its last byte.
    pub end: u64,
    /// Its module's index in the regenerator's list.
    pub module: usize,
    /// Its procedure's name.
    pub proc: &'m str,
    /// The run-time address of its procedure's entry (0: unknown).
    pub entry: u64,
}

/// The blocks of some modules, sorted by start.
pub struct Blocks<'m>(Vec<BlockAt<'m>>);

impl<'m> Blocks<'m> {
    /// The blocks of `modules` (the regenerator's).
    pub fn new(modules: &[&'m Compiled]) -> Blocks<'m> {
        let mut blocks = Vec::new();
        for (mi, m) in modules.iter().enumerate() {
            for b in m.blocks.values() {
                let start = m.load_base.wrapping_add(b.start);
                let p = &m.procs[b.proc];
                let entry = m
                    .blocks
                    .get(p.entry)
                    .map_or(0, |e| m.load_base.wrapping_add(e.start));
                blocks.push(BlockAt {
                    start,
                    end: start + u64::from(b.size),
                    module: mi,
                    proc: p.name.as_str(),
                    entry,
                });
            }
        }
        blocks.sort_unstable_by_key(|b| b.start);
        Blocks(blocks)
    }

    /// The block holding `addr`, if traced.
    pub fn at(&self, addr: u64) -> Option<&BlockAt<'m>> {
        let i = self.0.partition_point(|b| b.start <= addr).checked_sub(1)?;
        Some(&self.0[i]).filter(|b| addr < b.end)
    }

    /// All blocks, by start.
    pub fn iter(&self) -> impl Iterator<Item = &BlockAt<'m>> {
        self.0.iter()
    }
}

/// Block numbers along a timeline (`monitor when`): the blocks entered
/// before each interval, learnt in order and kept, so that a number costs
/// at most one interval's count after the first visit (the timeline's
/// snapshots already make the interval itself cheap to reach).
///
/// Invariant: `before[k]` counts the positions before interval `k` whose
/// address starts a block of a program database.
pub struct BlockIndex {
    starts: PcSet<u64>,
    before: Vec<u64>,
}

impl BlockIndex {
    /// The index of `blocks`' starts.
    pub fn new(blocks: &Blocks<'_>) -> BlockIndex {
        BlockIndex {
            starts: blocks.iter().map(|b| b.start).collect(),
            before: vec![0],
        }
    }

    /// The number of blocks entered up to and including position `n`
    /// (`None` past the end).
    pub fn number(&mut self, t: &mut Timeline<'_>, n: u64) -> Option<u64> {
        let k = t.interval_of(n)?;
        while self.before.len() <= k {
            let j = self.before.len() - 1;
            let here = self.count(t.interval(j).1);
            self.before.push(self.before[j] + here);
        }
        let (base, pcs) = t.interval(k);
        Some(self.before[k] + self.count(&pcs[..=(n - base) as usize]))
    }

    fn count(&self, pcs: &[u64]) -> u64 {
        pcs.iter().filter(|a| self.starts.contains(a)).count() as u64
    }
}
