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
//! The same holds across blocks that always run one after the other (a
//! regenerator's summarised segment, handed over as one record): nothing
//! reaches the first cache between them, so an instruction lying wholly in
//! the line the one before it ended in is no leader there either.
//!
//! Invariant of [`BlockLines`]: for each entry (a block or a segment) and
//! each of its line sizes, its leaders in order, the first instruction
//! always one of them; the leaders' `follow` counts plus their number
//! equal the entry's instruction count.

use crate::cache::{SmallStore, SMALL_ASSOC_MAX};
use crate::cachegrind::Cachegrind;
use crate::config::Side;
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
    /// Instructions after it, in its entry, that need no simulation:
    /// they repeat the line accessed just before, or [`BlockLines`]
    /// stripped them.
    pub follow: u32,
}

/// Leaders for several line sizes, one entry per block or segment (a
/// sequence of blocks that always run one after the other), numbered in
/// the order they were added.
///
/// Per line size, leaders may also be stripped within an entry by a
/// number of sets `C` (a power of two, 1: not at all): an instruction
/// wholly in a line that the entry touched before, with no other line of
/// the same set modulo `C` touched since, is no leader either. Its line
/// is on top of its set in every cache of `C` sets or a multiple (as in
/// a [`Stripped`] filter, decided once when the entry is made), so the
/// fetch hits and changes nothing ([`InsnFetch::strip_sets`]).
#[derive(Clone, Debug)]
pub struct BlockLines {
    /// The line sizes, as shifts.
    shifts: Vec<u32>,
    /// Per line size, `C - 1`.
    strip_masks: Vec<u64>,
    leaders: Vec<Leader>,
    /// Per entry, its instruction count: apart, so that an entry counted
    /// at once ([`Stripped`]'s settled entries) reads one word.
    ninsns: Vec<u32>,
    /// Per entry, `shifts.len() + 1` words: where its leaders for each
    /// line size start in `leaders`, then where the last ones end.
    spans: Vec<u32>,
    /// Per entry, per line size, its [`Entry::settled`] shape: the number
    /// of its leaders that straddle two lines, with [`SETTLES`] when each
    /// set (modulo `C`) it touches holds one line of it and no leader
    /// spans more than two lines.
    shapes: Vec<u32>,
}

/// The bit of [`BlockLines::shapes`] marking an entry that leaves one
/// line of its own on top of each set it touches.
const SETTLES: u32 = 1 << 31;

/// One entry of [`BlockLines`].
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    leaders: &'a [Leader],
    bounds: &'a [u32],
    shapes: &'a [u32],
    /// Its number in the table.
    pub id: usize,
    /// The instructions it stands for.
    pub ninsns: u32,
}

impl<'a> Entry<'a> {
    /// The leaders for the `k`th line size of the table.
    #[inline]
    pub fn at(&self, k: usize) -> &'a [Leader] {
        &self.leaders[self.bounds[k] as usize..self.bounds[k + 1] as usize]
    }

    /// For the `k`th line size, when the entry *settles* (each set modulo
    /// the table's `C` that it touches, it touches in one line only, and
    /// no leader spans more than two lines): the number of its leaders
    /// that straddle two lines. After such an entry, the line each of its
    /// leaders touches is the one accessed last in its set; so while no
    /// other line is accessed in any of them, the entry again is nothing
    /// but hits that change nothing ([`Stripped`]'s filters use this).
    #[inline]
    pub fn settled(&self, k: usize) -> Option<u32> {
        let s = self.shapes[k];
        (s & SETTLES != 0).then_some(s & !SETTLES)
    }
}

impl BlockLines {
    /// The leaders of `blocks` (numbered in iteration order) for lines of
    /// `line` bytes (a power of two).
    pub fn new<'a>(blocks: impl IntoIterator<Item = CodeBlock<'a>>, line: u64) -> Self {
        let mut t = BlockLines::for_lines(&[line]);
        for b in blocks {
            t.push([b]);
        }
        t
    }

    /// An empty table for lines of each of `lines` bytes (powers of two),
    /// leaders not stripped within entries.
    pub fn for_lines(lines: &[u64]) -> Self {
        Self::stripped(lines.iter().map(|&l| (l, 1)))
    }

    /// An empty table for `sim`: its line sizes, each stripped by
    /// [`InsnFetch::strip_sets`].
    pub fn for_sim(sim: &impl InsnFetch) -> Self {
        Self::stripped(
            sim.fetch_lines()
                .into_iter()
                .map(|l| (l, sim.strip_sets(l))),
        )
    }

    /// An empty table for `(line, C)` pairs: lines of that many bytes,
    /// leaders stripped within entries by `C` sets (powers of two).
    fn stripped(lines: impl Iterator<Item = (u64, u64)>) -> Self {
        let (shifts, strip_masks) = lines
            .map(|(line, sets)| {
                debug_assert!(line.is_power_of_two() && sets.is_power_of_two());
                (line.trailing_zeros(), sets - 1)
            })
            .unzip();
        BlockLines {
            shifts,
            strip_masks,
            leaders: Vec::new(),
            ninsns: Vec::new(),
            spans: Vec::new(),
            shapes: Vec::new(),
        }
    }

    /// Appends one entry for `blocks` run one after the other; returns
    /// its number. For each line size, an instruction lying wholly in the
    /// line the one before it ended in is no leader, also across blocks
    /// (nothing else reaches the first cache between two blocks that
    /// always run together), nor one stripped (the type's comment).
    pub fn push<'a>(&mut self, blocks: impl IntoIterator<Item = CodeBlock<'a>>) -> usize {
        let blocks: Vec<CodeBlock<'a>> = blocks.into_iter().collect();
        self.ninsns
            .push(blocks.iter().map(|b| b.lens.len() as u32).sum());
        for k in 0..self.shifts.len() {
            self.spans.push(self.leaders.len() as u32);
            let shape = self.push_leaders(&blocks, self.shifts[k], self.strip_masks[k]);
            self.shapes.push(shape);
        }
        self.spans.push(self.leaders.len() as u32);
        debug_assert_eq!(
            self.spans.len(),
            self.ninsns.len() * (self.shifts.len() + 1)
        );
        self.ninsns.len() - 1
    }

    /// Pushes the leaders of `blocks` for one line size; returns the
    /// entry's shape ([`BlockLines::shapes`]).
    fn push_leaders(&mut self, blocks: &[CodeBlock<'_>], shift: u32, mask: u64) -> u32 {
        // Per set (modulo C) the entry touched, the line it touched last
        // there: few, so a list.
        let mut touched: Vec<(u64, u64)> = Vec::new();
        let (mut settles, mut straddles) = (true, 0);
        for b in blocks {
            let mut addr = b.addr;
            for &len in b.lens {
                let first_line = addr >> shift;
                let end_line = (addr + u64::from(len).max(1) - 1) >> shift;
                if first_line == end_line && touched.contains(&(end_line & mask, end_line)) {
                    self.leaders.last_mut().expect("a leader before").follow += 1;
                } else {
                    self.leaders.push(Leader {
                        addr,
                        size: u32::from(len),
                        follow: 0,
                    });
                    settles &= end_line <= first_line + 1;
                    straddles += u32::from(end_line != first_line);
                    for line in first_line..=end_line {
                        match touched.iter_mut().find(|t| t.0 == line & mask) {
                            Some(t) => {
                                settles &= t.1 == line;
                                t.1 = line;
                            }
                            None => touched.push((line & mask, line)),
                        }
                    }
                }
                addr += u64::from(len);
            }
        }
        if settles {
            straddles | SETTLES
        } else {
            straddles
        }
    }

    /// Entry `id`.
    #[inline]
    pub fn entry(&self, id: usize) -> Entry<'_> {
        let k = self.shifts.len();
        Entry {
            leaders: &self.leaders,
            bounds: &self.spans[id * (k + 1)..(id + 1) * (k + 1)],
            shapes: &self.shapes[id * k..id * k + k],
            id,
            ninsns: self.ninsns[id],
        }
    }

    /// The instructions entry `id` stands for.
    #[inline]
    pub fn ninsns(&self, id: usize) -> u32 {
        self.ninsns[id]
    }

    /// The leaders of entry `id` for the first line size, and its
    /// instruction count.
    #[inline]
    pub fn block(&self, id: usize) -> (&[Leader], u32) {
        let e = self.entry(id);
        (e.at(0), e.ninsns)
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
    /// Counts `n` fetches that each straddle two lines, both on top of
    /// their sets in the first cache (a [`Stripped`] filter's hits, so
    /// only called when [`InsnFetch::strippable`]): hits that change
    /// nothing, counted as the model counts a straddling access.
    fn repeat_straddles(&mut self, n: u64);

    /// The line size and number of sets of the first cache that sees the
    /// instruction fetches, when a [`Stripped`] filter may stand before it:
    /// it sees every instruction fetch and nothing else, and a read of a
    /// resident line changes nothing but moving it on top of its set.
    fn strippable(&self) -> Option<(u64, u64)> {
        None
    }

    /// The ways of the first cache that sees the instruction fetches when,
    /// besides [`InsnFetch::strippable`], it is LRU: then a stack of lines
    /// per set, shared with the other such caches of its line size and
    /// sets, may decide its hits ([`Stripped`]), and every fetch comes
    /// through [`InsnFetch::decided`] or as a hit that changes nothing.
    fn lru_ways(&self) -> Option<u64> {
        None
    }

    /// Leader `l`'s fetch, then its followers', where a shared stack
    /// decided whether it misses the first cache (`miss`): counted, a miss
    /// passed on to the levels below, the first cache itself neither looked
    /// at nor changed. Only called when [`InsnFetch::lru_ways`] is given.
    fn decided(&mut self, l: Leader, miss: bool) -> Result<()> {
        let _ = (l, miss);
        unreachable!("no lru_ways, no shared stack")
    }

    /// The line sizes of the entries [`InsnFetch::entry`] takes.
    fn fetch_lines(&self) -> Vec<u64> {
        vec![self.fetch_line()]
    }

    /// The sets `C` by which the entries' leaders for lines of `line`
    /// bytes may be stripped ([`BlockLines`]): a fetch of a line on top of
    /// its set modulo `C` hits and changes nothing. 1 (not at all) unless
    /// [`InsnFetch::strippable`].
    fn strip_sets(&self, line: u64) -> u64 {
        match self.strippable() {
            Some((l, sets)) if l == line => sets,
            _ => 1,
        }
    }

    /// Simulates entry `id` of `lines`, a [`BlockLines`] made for
    /// [`InsnFetch::fetch_lines`], whole. Given by number, so that an
    /// entry decided at once ([`Stripped`]'s settled entries) is not
    /// looked at.
    #[inline]
    fn entry(&mut self, lines: &BlockLines, id: usize) -> Result<()> {
        self.block(lines.entry(id).at(0))
    }

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

/// Several simulators fed one stream (`--configs`), with trace stripping
/// (Puzak, 1985) before those whose first instruction cache allows it.
///
/// Entries carry leaders for each line size among the simulators' first
/// instruction caches, and each simulator or filter takes those of its
/// own (with a per-instruction fetch, a larger line sees the extra
/// leaders of a smaller one as repeats of the line it accessed last,
/// which hit and change nothing: the module comment).
///
/// Stripping: the simulators whose first-level instruction caches have one
/// line size share a *filter*, a direct-mapped table of the line accessed
/// last in each of `C` sets, `C` the fewest sets among those caches (all
/// powers of two, so each cache's sets refine the filter's). A fetch of a
/// line the filter holds is a hit in every one of those caches and changes
/// none: since that line's last access, no access went to its filter set,
/// so none to its set in any of the caches; it is still resident (reads
/// always allocate), and on top of its set under LRU. So it is counted, not
/// simulated, and the misses, and what lower levels see, are the same.
/// A fetch straddling two lines the filter both holds is such a hit in
/// both of its lines (consecutive lines fall in two sets of every cache
/// with two sets or more; with one, the filter cannot hold both): it is
/// counted too, as a straddling hit ([`InsnFetch::repeat_straddles`]).
/// A filter also takes a whole entry at once when the entry settled
/// ([`Entry::settled`]) the last time it went through and no leader went
/// through the filter since (a version number per filter, stamped per
/// entry): its lines are still the last accessed in their sets, so every
/// leader would be a filter hit. In a loop whose code maps to distinct
/// sets that is every entry, so a lone strippable cache gets a filter
/// too.
///
/// A filter is a chain of *levels*, one per number of sets among its
/// caches, fewest first; each cache stands behind the level of its own
/// sets, and a level sees only the leaders the level before it missed.
/// That is exact: a hit at a level of `C` sets is a line accessed last
/// in its set modulo `C`, so also modulo any multiple of `C`: a hit in
/// every cache behind the later levels too, and one that changes none of
/// their tables. So each level's table is still the line accessed last
/// in each of its sets, and a cache of 256 sets is no longer fed the
/// conflicts of a filter of 32.
///
/// When the caches behind a level are all LRU ([`InsnFetch::lru_ways`]:
/// the cachegrind model's I1s), the level keeps per set a stack of the
/// lines accessed there, as deep as their most ways, and a leader it
/// misses is looked up once in that stack: a cache of `w` ways holds the
/// `w` lines on top of each set, so the leader's depth decides its hit or
/// miss in each of them ([`SmallStore::lru_depth`]), and a cache is told
/// the result ([`InsnFetch::decided`]) instead of searching its own sets
/// (four searches become one at the bench's level of 64 sets).
///
/// Invariant: a level's `pending` fetches and `straddles` are counted in
/// no simulator behind it or behind a later level yet; a miss moves them
/// on, [`Stripped::finish`] adds them.
pub struct Stripped<S> {
    sims: Vec<S>,
    filters: Vec<Filter>,
    /// Simulators fed without a filter, each with its line size's index
    /// in `lines`.
    direct: Vec<(usize, usize)>,
    /// The simulators' line sizes, smallest first: entries carry leaders
    /// for each.
    lines: Vec<u64>,
}

/// What a [`Filter`] keeps of an entry that settled through it: enough
/// to count it at once, without its leaders.
#[derive(Clone, Copy, Debug, Default)]
struct Settled {
    /// The filter's `version` when the entry last went through; 0, never.
    version: u64,
    /// [`Entry::ninsns`].
    ninsns: u32,
    /// Its leaders that straddle two lines ([`Entry::settled`]).
    straddles: u32,
}

/// One filter: its levels, and the entries that settled through it.
struct Filter {
    shift: u32,
    /// Its line size's index in [`Stripped::lines`].
    at: usize,
    /// Fewest sets first, each a multiple of the one before.
    levels: Vec<Level>,
    /// Changes of the first level's table so far (a leader through the
    /// filter counts as one).
    version: u64,
    /// Per entry (by number): when it last went through and settled
    /// ([`Entry::settled`]).
    settled: Vec<Settled>,
}

/// A number of sets and the simulators whose first instruction caches
/// have it: one [`Level`].
type Members = (u64, Vec<usize>);

/// One level of a [`Filter`] and the simulators behind it.
struct Level {
    mask: u64,
    /// Per set, the lines accessed there, the last on top. One deep, or,
    /// on a *stack level* (every simulator behind it gives
    /// [`InsnFetch::lru_ways`]), as deep as the most ways among them: then
    /// the stack decides their hits ([`SmallStore::lru_depth`]) and one
    /// search of it stands for one per cache.
    lines: SmallStore,
    sims: Vec<usize>,
    /// On a stack level, the ways of each of `sims`; else empty.
    ways: Vec<u64>,
    /// Fetches within one line found at this level or before and not yet
    /// counted in `sims` (nor in a later level's).
    pending: u64,
    /// Straddling fetches found likewise, not yet counted.
    straddles: u64,
}

impl<S: InsnFetch> Stripped<S> {
    /// Groups `sims` by their first instruction cache's line size.
    pub fn new(sims: Vec<S>) -> Self {
        let mut lines: Vec<u64> = sims.iter().map(S::fetch_line).collect();
        lines.sort_unstable();
        lines.dedup();
        let at = |line: u64| lines.iter().position(|&l| l == line).expect("a line size");
        // Per line size (as a shift): its levels.
        let mut groups: Vec<(u32, Vec<Members>)> = Vec::new();
        let mut direct = Vec::new();
        for (k, s) in sims.iter().enumerate() {
            let Some((line, sets)) = s.strippable() else {
                direct.push((k, at(s.fetch_line())));
                continue;
            };
            let shift = line.trailing_zeros();
            let g = match groups.iter().position(|g| g.0 == shift) {
                Some(g) => g,
                None => {
                    groups.push((shift, Vec::new()));
                    groups.len() - 1
                }
            };
            match groups[g].1.iter_mut().find(|l| l.0 == sets) {
                Some(l) => l.1.push(k),
                None => groups[g].1.push((sets, vec![k])),
            }
        }
        let filters = (groups.into_iter())
            .map(|(shift, mut levels)| {
                levels.sort_unstable_by_key(|l| l.0);
                Filter {
                    shift,
                    at: at(1 << shift),
                    levels: (levels.into_iter()).map(|m| Level::new(m, &sims)).collect(),
                    version: 1,
                    settled: Vec::new(),
                }
            })
            .collect();
        Stripped {
            sims,
            filters,
            direct,
            lines,
        }
    }

    /// The simulators, for input that does not go through [`InsnFetch`]
    /// (a text or `bin` file: data references too, no filter). Feeding
    /// one `Stripped` both ways would leave its filters stale.
    pub fn sims_mut(&mut self) -> &mut [S] {
        &mut self.sims
    }

    /// The simulators, every fetch counted.
    pub fn finish(mut self) -> Vec<S> {
        for f in &mut self.filters {
            f.finish(&mut self.sims);
        }
        self.sims
    }

    /// Entry `id` of `lines` to the simulators fed without a filter. Out
    /// of line, as [`Filter::walk`].
    #[inline(never)]
    fn direct_entry(&mut self, lines: &BlockLines, id: usize) -> Result<()> {
        let e = lines.entry(id);
        for &(k, at) in &self.direct {
            self.sims[k].block(e.at(at))?;
        }
        Ok(())
    }
}

impl Filter {
    /// Its first level's sets: the fewest.
    fn sets(&self) -> u64 {
        self.levels[0].mask + 1
    }

    /// Counts `n` fetches that hit the first level.
    fn repeat(&mut self, n: u64) {
        self.levels[0].pending += n;
    }

    /// Counts `n` straddling fetches that hit the first level.
    fn repeat_straddles(&mut self, n: u64) {
        self.levels[0].straddles += n;
    }

    /// Entry `e` through the filter. One that settled when it last went
    /// through, with the first level unchanged since, is all filter hits:
    /// counted at once (the lines of its leaders are still the last
    /// accessed in their sets, [`Entry::settled`]).
    #[inline(always)]
    fn entry<S: InsnFetch>(&mut self, lines: &BlockLines, id: usize, sims: &mut [S]) -> Result<()> {
        if let Some(s) = self.settled.get(id) {
            if s.version == self.version {
                let first = &mut self.levels[0];
                first.straddles += u64::from(s.straddles);
                first.pending += u64::from(s.ninsns - s.straddles);
                return Ok(());
            }
        }
        self.walk(lines, id, sims)
    }

    /// Entry `id` of `lines` through the filter leader by leader, stamped
    /// if it settles. Out of line, the entry looked at only here: the
    /// entries counted at once keep the caller's loop small.
    #[inline(never)]
    fn walk<S: InsnFetch>(&mut self, lines: &BlockLines, id: usize, sims: &mut [S]) -> Result<()> {
        let e = lines.entry(id);
        (e.at(self.at).iter()).try_for_each(|&l| self.leader(l, sims))?;
        if let Some(straddles) = e.settled(self.at) {
            if self.settled.len() <= e.id {
                self.settled.resize(e.id + 1, Settled::default());
            }
            self.settled[e.id] = Settled {
                version: self.version,
                ninsns: e.ninsns,
                straddles,
            };
        }
        Ok(())
    }

    /// Leader `l` through the filter: counted at the first level that
    /// holds its line, simulated in the simulators behind every level
    /// before. Inlined into [`Filter::walk`]'s loop: a call per leader
    /// cost a third of the walk.
    #[inline(always)]
    fn leader<S: InsnFetch>(&mut self, l: Leader, sims: &mut [S]) -> Result<()> {
        let first = l.addr >> self.shift;
        let last = (l.addr + u64::from(l.size).max(1) - 1) >> self.shift;
        if self.levels[0].hit(first, last, l.follow) {
            return Ok(());
        }
        self.version += 1;
        self.miss(0, l, (first, last), sims)?;
        for j in 1..self.levels.len() {
            if self.levels[j].hit(first, last, l.follow) {
                break;
            }
            self.miss(j, l, (first, last), sims)?;
        }
        Ok(())
    }

    /// Leader `l`, spanning `lines`, missed level `j`: its pending counts
    /// go to its simulators and on to the next level, then `l` to its
    /// simulators.
    #[inline(never)]
    fn miss<S: InsnFetch>(
        &mut self,
        j: usize,
        l: Leader,
        (first, last): (u64, u64),
        sims: &mut [S],
    ) -> Result<()> {
        let (pending, straddles) = self.levels[j].flush(sims);
        if let Some(next) = self.levels.get_mut(j + 1) {
            next.pending += pending;
            next.straddles += straddles;
        }
        self.levels[j].take(l, (first, last), sims)
    }

    /// Counts every pending fetch in the simulators, level after level.
    fn finish<S: InsnFetch>(&mut self, sims: &mut [S]) {
        let (mut pending, mut straddles) = (0, 0);
        for level in &mut self.levels {
            level.pending += pending;
            level.straddles += straddles;
            (pending, straddles) = level.flush(sims);
        }
    }
}

impl Level {
    /// The level of `sets` sets before simulators `members` of `all`: a
    /// stack level when each gives its ways, none more than a small store
    /// takes.
    fn new<S: InsnFetch>((sets, members): Members, all: &[S]) -> Self {
        debug_assert!(sets.is_power_of_two());
        let ways: Option<Vec<u64>> = members.iter().map(|&k| all[k].lru_ways()).collect();
        let ways = ways.unwrap_or_default();
        let depth = ways.iter().copied().max().unwrap_or(1);
        let (depth, ways) = if depth as usize <= SMALL_ASSOC_MAX {
            (depth, ways)
        } else {
            (1, Vec::new())
        };
        Level {
            mask: sets - 1,
            lines: SmallStore::new(sets as usize, depth as usize),
            sims: members,
            ways,
            pending: 0,
            straddles: 0,
        }
    }

    /// Leader `l`, spanning `lines`, which missed this level: each of its
    /// lines goes on top of its set, and `l` to the simulators behind the
    /// level, decided by the stack on a stack level.
    #[inline(always)]
    fn take<S: InsnFetch>(
        &mut self,
        l: Leader,
        (first, last): (u64, u64),
        sims: &mut [S],
    ) -> Result<()> {
        // Every line it spans: with lines of 4 or 8 bytes an instruction
        // may span three, and the middle one's set saw an access too. The
        // deepest line decides (a miss if any line misses).
        let mut depth = 0;
        for line in first..=last {
            depth = depth.max(self.lines.lru_depth((line & self.mask) as usize, line) as u64);
        }
        if self.ways.is_empty() {
            for &k in &self.sims {
                sims[k].block(std::slice::from_ref(&l))?;
            }
        } else {
            for (&k, &w) in self.sims.iter().zip(&self.ways) {
                sims[k].decided(l, depth >= w)?;
            }
        }
        Ok(())
    }

    /// Whether a leader on lines `first..=last`, with `follow`
    /// instructions after it, is a hit here (then counted): its line
    /// accessed last in its set, or both of its two lines in theirs.
    #[inline(always)]
    fn hit(&mut self, first: u64, last: u64, follow: u32) -> bool {
        if self.lines.top((first & self.mask) as usize) != first {
            return false;
        }
        if first == last {
            self.pending += 1 + u64::from(follow);
            return true;
        }
        if last == first + 1 && self.lines.top((last & self.mask) as usize) == last {
            self.straddles += 1;
            self.pending += u64::from(follow);
            return true;
        }
        false
    }

    /// Counts the pending fetches in the level's simulators (before one
    /// goes through, so their reference numbers stay right); returns
    /// them, for the next level.
    fn flush<S: InsnFetch>(&mut self, sims: &mut [S]) -> (u64, u64) {
        let (pending, straddles) = (self.pending, self.straddles);
        if pending > 0 {
            for &k in &self.sims {
                sims[k].repeat(pending);
            }
            self.pending = 0;
        }
        if straddles > 0 {
            for &k in &self.sims {
                sims[k].repeat_straddles(straddles);
            }
            self.straddles = 0;
        }
        (pending, straddles)
    }
}

impl<S: InsnFetch> InsnFetch for Stripped<S> {
    fn fetch_line(&self) -> u64 {
        self.lines.first().copied().unwrap_or(64)
    }
    fn fetch_lines(&self) -> Vec<u64> {
        self.lines.clone()
    }
    /// The fewest sets among the filters and the directly fed simulators
    /// that take leaders for `line`.
    fn strip_sets(&self, line: u64) -> u64 {
        let filters = (self.filters.iter())
            .filter(|f| 1 << f.shift == line)
            .map(Filter::sets);
        let direct = (self.direct.iter())
            .filter(|&&(_, at)| self.lines[at] == line)
            .map(|&(k, _)| self.sims[k].strip_sets(line));
        filters.chain(direct).min().unwrap_or(1)
    }
    fn fetch(&mut self, r: Ref) -> Result<()> {
        for &(k, _) in &self.direct {
            self.sims[k].fetch(r)?;
        }
        let l = Leader {
            addr: r.addr,
            size: r.size,
            follow: 0,
        };
        (self.filters.iter_mut()).try_for_each(|f| f.leader(l, &mut self.sims))
    }
    fn repeat(&mut self, n: u64) {
        for f in &mut self.filters {
            f.repeat(n);
        }
        for &(k, _) in &self.direct {
            self.sims[k].repeat(n);
        }
    }
    fn repeat_straddles(&mut self, n: u64) {
        for f in &mut self.filters {
            f.repeat_straddles(n);
        }
        for &(k, _) in &self.direct {
            self.sims[k].repeat_straddles(n);
        }
    }
    #[inline(always)]
    fn entry(&mut self, lines: &BlockLines, id: usize) -> Result<()> {
        if !self.direct.is_empty() {
            self.direct_entry(lines, id)?;
        }
        // One filter (a geometry alone, or of one line size): no loop.
        match &mut self.filters[..] {
            [f] => f.entry(lines, id, &mut self.sims),
            filters => (filters.iter_mut()).try_for_each(|f| f.entry(lines, id, &mut self.sims)),
        }
    }
}

impl InsnFetch for Hierarchy {
    fn fetch_line(&self) -> u64 {
        self.first_cache(AccessKind::Instr)
            .map_or(64, |c| c.config.bsize)
    }
    /// A split first-level instruction cache without `-ccc` (whose fully
    /// associative shadow reorders on hits). Every policy qualifies: a
    /// filtered line had no access to its set since it was last read.
    fn strippable(&self) -> Option<(u64, u64)> {
        let c = &self.first_cache(AccessKind::Instr)?.config;
        (c.side == Side::Instr && !c.ccc).then(|| (c.bsize, c.sets()))
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
    /// Dinero's two pieces, each a demand fetch, and one multi-block ref.
    fn repeat_straddles(&mut self, n: u64) {
        self.count_straddling_hits(n);
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
    /// I1 is split and LRU.
    fn strippable(&self) -> Option<(u64, u64)> {
        Some((self.i1_line(), self.i1_sets()))
    }
    #[inline]
    fn fetch(&mut self, r: Ref) -> Result<()> {
        self.reference(r)
    }
    /// I1 is LRU.
    fn lru_ways(&self) -> Option<u64> {
        Some(self.i1_ways())
    }
    #[inline]
    fn decided(&mut self, l: Leader, miss: bool) -> Result<()> {
        self.fetch_decided(l, miss)
    }
    #[inline]
    fn repeat(&mut self, n: u64) {
        self.count_i1_hits(n);
    }
    /// Cachegrind's straddling access is one reference.
    fn repeat_straddles(&mut self, n: u64) {
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

    #[test]
    fn leaders_merge_across_blocks_per_line_size() {
        // 0x10+2, 0x12+2 in line 1 (16-byte lines); 0x14+3 too, in the
        // next block; 0x0e+4 straddles back from line 0; 0x18+1 repeats
        // line 1. With 32-byte lines all five are in line 0.
        let blocks = [
            (0x10, &[2u8, 2][..]),
            (0x14, &[3]),
            (0x0e, &[4]),
            (0x18, &[1]),
        ];
        let mut t = BlockLines::for_lines(&[16, 32]);
        let code = blocks.iter().map(|&(addr, lens)| CodeBlock { addr, lens });
        let id = t.push(code);
        let l = |addr, size, follow| Leader { addr, size, follow };
        let e = t.entry(id);
        assert_eq!(e.ninsns, 5);
        assert_eq!(e.at(0), [l(0x10, 2, 2), l(0x0e, 4, 1)]);
        assert_eq!(e.at(1), [l(0x10, 2, 4)]);
    }

    #[test]
    fn leaders_stripped_by_sets_within_an_entry() {
        // 16-byte lines, two sets: 0x10 (line 1, set 1), a call to 0x40
        // (line 4, set 0), back at 0x12: line 1 is still on top of set 1,
        // no leader. After 0x30 (line 3, set 1) it is one again; and 0x2e
        // straddles lines 2 and 3, touching both sets.
        let blocks = [
            (0x10, &[2u8][..]),
            (0x40, &[2]),
            (0x12, &[2]),
            (0x30, &[1]),
            (0x14, &[1]),
            (0x2e, &[4]),
            (0x32, &[1]),
            (0x16, &[1]),
        ];
        let mut t = BlockLines::stripped([(16, 2), (16, 1)].into_iter());
        let id = t.push(blocks.iter().map(|&(addr, lens)| CodeBlock { addr, lens }));
        let l = |addr, size, follow| Leader { addr, size, follow };
        let e = t.entry(id);
        assert_eq!(e.ninsns, 8);
        let want = [
            l(0x10, 2, 0),
            l(0x40, 2, 1),
            l(0x30, 1, 0),
            l(0x14, 1, 0),
            l(0x2e, 4, 1),
            l(0x16, 1, 0),
        ];
        assert_eq!(e.at(0), want);
        // One set: only the line touched just before.
        assert_eq!(e.at(1).len(), 7);
    }

    #[test]
    fn entries_settle_with_one_line_per_set() {
        // 0x10+2, then 0x2e+8 (16-byte lines: straddling lines 2 and 3),
        // back at 0x14+2. Four sets: lines 1, 2, 3 in sets of their own,
        // one straddle. Two sets: lines 1 and 3 share one. 4-byte lines:
        // 0x2e+8 spans three. 64-byte lines: one line.
        let blocks = [(0x10, &[2u8][..]), (0x2e, &[8]), (0x14, &[2])];
        let sizes = [(16, 4), (16, 2), (4, 64), (64, 1)];
        let mut t = BlockLines::stripped(sizes.into_iter());
        let id = t.push(blocks.iter().map(|&(addr, lens)| CodeBlock { addr, lens }));
        let e = t.entry(id);
        assert_eq!(e.id, id);
        let settled: Vec<_> = (0..4).map(|k| e.settled(k)).collect();
        assert_eq!(settled, [Some(1), None, None, Some(0)]);
    }

    /// Random blocks laid out in a small code region (so lines are shared
    /// between blocks and sets conflict), and a random walk over them
    /// that loops: a body of one to three blocks, run one to four times
    /// (so entries recur with nothing between them).
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
        let mut walk = Vec::with_capacity(steps + 12);
        while walk.len() < steps {
            let body: Vec<usize> = (0..1 + rng.below(3)).map(|_| rng.below(nblocks)).collect();
            for _ in 0..1 + rng.below(4) {
                walk.extend(&body);
            }
        }
        walk.truncate(steps);
        (blocks, walk)
    }

    /// Runs `walk` through `bulk` entry by entry (`by_entries`) and
    /// through `each` fetch by fetch.
    fn both<S: InsnFetch>(
        blocks: &[(u64, Vec<u8>)],
        walk: &[usize],
        cut: &[usize],
        bulk: &mut S,
        each: &mut S,
    ) -> (Result<()>, Result<()>) {
        (
            by_entries(blocks, walk, cut, bulk),
            by_fetches(blocks, walk, each),
        )
    }

    /// Runs `walk` entry by entry: its blocks alone, or with `cut`,
    /// consecutive blocks (as many as the walk's next `cut` value says)
    /// as one entry, as a regenerator's segment would come (one entry
    /// per sequence of blocks, so entries repeat).
    fn by_entries(
        blocks: &[(u64, Vec<u8>)],
        walk: &[usize],
        cut: &[usize],
        sim: &mut impl InsnFetch,
    ) -> Result<()> {
        let code = |b: usize| CodeBlock {
            addr: blocks[b].0,
            lens: &blocks[b].1,
        };
        let mut t = BlockLines::for_sim(sim);
        let mut ids = std::collections::HashMap::new();
        let (mut at, mut k) = (0, 0);
        while at < walk.len() {
            let n = cut.get(k).map_or(1, |&n| n.clamp(1, walk.len() - at));
            let seq = &walk[at..at + n];
            let id = *(ids.entry(seq)).or_insert_with(|| t.push(seq.iter().map(|&b| code(b))));
            sim.entry(&t, id)?;
            (at, k) = (at + n, k + 1);
        }
        Ok(())
    }

    fn by_fetches(
        blocks: &[(u64, Vec<u8>)],
        walk: &[usize],
        sim: &mut impl InsnFetch,
    ) -> Result<()> {
        walk.iter().try_for_each(|&b| {
            let (mut addr, lens) = (blocks[b].0, &blocks[b].1);
            lens.iter().try_for_each(|&len| {
                let r = sim.fetch(Ref {
                    kind: AccessKind::Instr,
                    addr,
                    size: u32::from(len),
                });
                addr += u64::from(len);
                r
            })
        })
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
        /// up to four lines) to 128, fully associative included; entries
        /// of one block or of up to five (`cut`), as segments come.
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
            cut in proptest::collection::vec(1usize..6, 0..300),
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
            let (a, b) = both(&blocks, &walk, &cut, &mut bulk, &mut each);
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
            cut in proptest::collection::vec(1usize..6, 0..300),
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
            let (a, b) = both(&blocks, &walk, &cut, &mut bulk, &mut each);
            prop_assert_eq!(a.map_err(|e| e.to_string()), b.map_err(|e| e.to_string()));
            prop_assert_eq!(&bulk.stats, &each.stats);
        }

        /// `--configs`: Dinero hierarchies of lines of 4 to 64 bytes (an
        /// instruction may span three lines of 4 or 8), every policy,
        /// with and without `-ccc`, split or unified, one or two levels,
        /// behind shared filters (entry by entry, each with leaders for
        /// every line size), each give what it gives alone, fetch by
        /// fetch.
        #[test]
        fn stripped_dinero_equals_each_alone(
            seed in any::<u64>(),
            geoms in proptest::collection::vec(
                (2u32..7, 0u32..5, 0u32..4, 0usize..3, 0u8..8, any::<bool>()), 1..7),
            cut in proptest::collection::vec(1usize..6, 0..300),
        ) {
            let (blocks, walk) = program(seed, 40, 600);
            let hierarchy = |&(bshift, sets_shift, assoc_shift, repl, flags, two): &(u32, u32, u32, usize, u8, bool)| {
                let (bsize, assoc) = (1u64 << bshift, 1u64 << assoc_shift);
                let size = (bsize * assoc) << sets_shift;
                // Mostly split: the filters' case; sometimes unified or -ccc.
                let side = if flags == 0 { Side::Unified } else { Side::Instr };
                let mut configs = vec![cache(1, side, (size, bsize, assoc), REPLS[repl], flags == 1)];
                if two {
                    configs.push(cache(2, Side::Unified, (8 * size, bsize, 2 * assoc), Repl::Lru, false));
                }
                Hierarchy::new(configs, seed)
            };
            let mut stripped = Stripped::new(geoms.iter().map(hierarchy).collect());
            prop_assert!(by_entries(&blocks, &walk, &cut, &mut stripped).is_ok());
            for (mut x, g) in stripped.finish().into_iter().zip(&geoms) {
                let mut alone = hierarchy(g);
                prop_assert!(by_fetches(&blocks, &walk, &mut alone).is_ok());
                x.finish();
                alone.finish();
                for (a, b) in x.caches.iter().zip(&alone.caches) {
                    prop_assert_eq!(&a.stats, &b.stats, "{}", a.config.name);
                }
            }
        }

        /// The same for the cachegrind model (I1 and LL of one line size;
        /// shared stacks where I1s have one line size and sets). With
        /// lines of 8 bytes an instruction may span three: refused, at the
        /// same reference as alone.
        #[test]
        fn stripped_cachegrind_equals_each_alone(
            seed in any::<u64>(),
            geoms in proptest::collection::vec((3u32..7, 0u32..5, 0u32..4), 1..7),
            cut in proptest::collection::vec(1usize..6, 0..300),
        ) {
            let (blocks, walk) = program(seed, 40, 600);
            let model = |&(bshift, sets_shift, assoc_shift): &(u32, u32, u32)| {
                let (bsize, assoc) = (1u64 << bshift, 1u64 << assoc_shift);
                let size = (bsize * assoc) << sets_shift;
                let i1 = cache(1, Side::Instr, (size, bsize, assoc), Repl::Lru, false);
                let d1 = cache(1, Side::Data, (1024, bsize, 2), Repl::Lru, false);
                let ll = cache(2, Side::Unified, (4 * size, bsize, 4), Repl::Lru, false);
                Cachegrind::new(&[i1, d1, ll]).unwrap()
            };
            let mut stripped = Stripped::new(geoms.iter().map(model).collect());
            let run = by_entries(&blocks, &walk, &cut, &mut stripped).map_err(|e| e.to_string());
            let mut alone: Vec<_> = geoms.iter().map(model).collect();
            let runs = alone.iter_mut().map(|a| by_fetches(&blocks, &walk, a).map_err(|e| e.to_string()));
            // Only lines of 8 bytes refuse, all at one reference.
            let refused = runs.collect::<std::result::Result<Vec<()>, String>>();
            prop_assert_eq!(&run, &refused.map(|_| ()));
            if run.is_ok() {
                for (x, a) in stripped.finish().iter().zip(&alone) {
                    prop_assert_eq!(&x.stats, &a.stats);
                }
            }
        }
    }
}
