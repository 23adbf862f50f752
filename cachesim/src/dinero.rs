//! Dinero IV's reference semantics for a cache hierarchy (its `d4ref`,
//! restricted to demand fetch and no sub-blocks).
//!
//! For one reference at one cache:
//! 1. A reference crossing a block boundary is split: the part in the first
//!    block is simulated now, the rest afterwards as a new reference to the
//!    same cache ("Multi-block refs" counts the splits).  Each piece counts
//!    as one demand fetch, as in Dinero.
//! 2. A write miss without write-allocate leaves the cache unchanged.
//!    Otherwise a hit moves the line to the top (LRU only) and a miss
//!    inserts it, evicting per the policy; a write with write-back sets the
//!    dirty bit.
//! 3. References sent towards memory, in Dinero's order (its pending stack
//!    is LIFO): the miss fetch (a whole block; a write's fetch is a read;
//!    none for a write miss without allocation or one that writes the whole
//!    block), then the write-through of a write not written back, then the
//!    write-back of a dirty victim (a whole block).  Bytes of reads/fetches
//!    count as "Bytes From Memory" of this cache, bytes of writes as "Bytes
//!    To Memory".
//! 4. With `-ccc`, a fully associative cache of the same capacity and
//!    policy, and an infinite cache, classify each miss: conflict if the
//!    fully associative cache hits, else compulsory on the first miss to
//!    the block, else capacity.
//!
//! Instruction fetches enter at the first-level instruction (or unified)
//! cache, everything else at the first-level data (or unified) cache; a
//! split level with one side only passes the other kind to the level below.
//! Invariant: `fetch[k] >= miss[k] = comp[k] + cap[k] + conf[k]` (the last
//! only with `-ccc`).

use crate::cache::{BlockMap, Repl, Rng, SmallStore, Store, SMALL_ASSOC_MAX};
use crate::config::{CacheConfig, Side, WriteAlloc, WriteBack};
use crate::trace::Ref;
use crate::AccessKind;

/// Per-cache counters, indexed by [`AccessKind`] number.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// References per access kind.
    pub fetch: [u64; 4],
    /// Misses per access kind.
    pub miss: [u64; 4],
    /// Compulsory misses (first reference to the block) per access kind, with `-ccc`.
    pub compulsory: [u64; 4],
    /// Capacity misses (a fully associative cache of the same size misses too) per access kind, with `-ccc`.
    pub capacity: [u64; 4],
    /// Conflict misses (the rest) per access kind, with `-ccc`.
    pub conflict: [u64; 4],
    /// References split because they straddle a block boundary.
    pub multiblock: u64,
    /// Bytes fetched from the next level towards memory.
    pub bytes_from_memory: u64,
    /// Bytes written to the next level towards memory (write-through data and dirty victims).
    pub bytes_to_memory: u64,
}

/// The fully associative and infinite shadow caches of `-ccc`.
struct Ccc {
    full: Store,
    seen: BlockMap<()>,
}

/// One simulated cache.
pub struct Cache {
    /// The cache's checked geometry and policies.
    pub config: CacheConfig,
    bshift: u32,
    set_mask: u64,
    store: Store,
    ccc: Option<Ccc>,
    /// Index of the next cache towards memory, `None` = memory.
    next: Option<usize>,
    /// The counters so far.
    pub stats: Stats,
}

/// What one piece sends towards memory.
struct Down {
    fetch: Option<(AccessKind, u64)>,
    write_through: bool,
    victim: Option<u64>,
}

impl Cache {
    fn new(config: CacheConfig, next: Option<usize>) -> Self {
        let sets = config.sets() as usize;
        let blocks = (config.size / config.bsize) as usize;
        Cache {
            bshift: config.bsize.trailing_zeros(),
            set_mask: sets as u64 - 1,
            store: Store::new(sets, config.assoc as usize),
            ccc: config.ccc.then(|| Ccc {
                full: Store::new(1, blocks),
                seen: BlockMap::default(),
            }),
            next,
            stats: Stats::default(),
            config,
        }
    }

    /// Simulates one piece that lies within one block.
    #[inline]
    fn piece(&mut self, kind: AccessKind, addr: u64, size: u64, rng: &mut Rng) -> Down {
        debug_assert!(size >= 1 && (addr & (self.config.bsize - 1)) + size <= self.config.bsize);
        let block = addr >> self.bshift;
        let set = (block & self.set_mask) as usize;
        let is_write = kind == AccessKind::Write;
        let bsize = self.config.bsize;
        let walloc = is_write
            && match self.config.walloc {
                WriteAlloc::Always => true,
                WriteAlloc::Never => false,
                WriteAlloc::NoFetch => size == bsize,
            };
        let found = self.store.find(set, block);
        let miss = found.is_none();
        let mut wback = false;
        let mut victim = None;
        if !is_write || !miss || walloc {
            let slot = match found {
                Some(s) if self.config.repl == Repl::Lru => self.store.touch(set, s),
                Some(s) => s,
                None => {
                    let (s, v) = self.store.insert(set, block, self.config.repl, rng);
                    if let Some(v) = v {
                        if v.dirty {
                            victim = Some(v.block << self.bshift);
                        }
                    }
                    s
                }
            };
            // Without sub-blocks, "write back if no fetch is needed" always
            // holds once the line is valid.
            wback = is_write && self.config.wback != WriteBack::Never;
            self.store.set_dirty(slot, wback);
        }
        let fetch = (miss && (!is_write || (walloc && size != bsize))).then(|| {
            let k = if is_write { AccessKind::Read } else { kind };
            (k, block << self.bshift)
        });
        let k = kind as usize;
        if let Some(ccc) = &mut self.ccc {
            let ffound = ccc.full.find(0, block);
            let fullmiss = ffound.is_none();
            if !is_write || !fullmiss || walloc {
                match ffound {
                    Some(s) if self.config.repl == Repl::Lru => {
                        ccc.full.touch(0, s);
                    }
                    Some(_) => {}
                    None => {
                        ccc.full.insert(0, block, self.config.repl, rng);
                    }
                }
            }
            if miss {
                if !fullmiss {
                    self.stats.conflict[k] += 1;
                } else if ccc.seen.insert(block, ()).is_none() {
                    self.stats.compulsory[k] += 1;
                } else {
                    self.stats.capacity[k] += 1;
                }
            }
        }
        self.stats.fetch[k] += 1;
        self.stats.miss[k] += u64::from(miss);
        debug_assert!(
            !self.config.ccc
                || self.stats.miss[k]
                    == self.stats.compulsory[k] + self.stats.capacity[k] + self.stats.conflict[k]
        );
        Down {
            fetch,
            write_through: is_write && !wback,
            victim,
        }
    }
}

/// A hierarchy of caches with Dinero IV semantics.
pub struct Hierarchy {
    /// The caches, first level first; each names the next towards memory.
    pub caches: Vec<Cache>,
    /// First cache for each access kind (instruction fetches to the
    /// instruction side, the rest to the data side; `None` when that side
    /// has no cache at all, as Dinero sends such references straight to
    /// memory): a table rather than a branch, which a mixed stream would
    /// mispredict.
    first: [Option<usize>; 4],
    /// Per access kind, what the fast path needs, in one place.
    hot: [Hot; 4],
    /// The first caches of the fast path with a small store, in index
    /// order (at most an instruction and a data one), for
    /// [`Hierarchy::hits`].
    fronts: [Option<usize>; 2],
    /// Per access kind, the index of its first cache in `fronts`, or
    /// [`NONE`] when it takes no fast path there.
    slot: [usize; 4],
    /// Per front, whether [`Hierarchy::hits`] takes its misses: what a
    /// miss sends to the next level then waits for the end of the run, so
    /// no front may be below it (an instruction-only or data-only first
    /// level above a unified one, which takes the other kind first), and
    /// it replaces without drawing a random number (LRU, FIFO): the levels
    /// below see the same references in the same order and draw the same
    /// numbers.
    fills: [bool; 2],
    /// What [`Hierarchy::hits`]' misses send to the next level, in order,
    /// until the run ends (empty between runs; kept for its capacity).
    pending: Vec<Sent>,
    rng: Rng,
}

/// [`Hierarchy::hits`]' index of no cache.
const NONE: usize = 2;

/// Per access kind number, whether it is a write.
const IS_WRITE: [bool; 4] = [false, true, false, false];

/// A reference a first cache's miss sends to cache `to`.
#[derive(Clone, Copy, Debug)]
struct Sent {
    to: usize,
    kind: AccessKind,
    addr: u64,
    size: u64,
}

/// [`Hierarchy::hits`]' view of a first cache of the fast path.
struct Front<'a> {
    store: &'a mut SmallStore,
    bshift: u32,
    set_mask: u64,
    bsize: u64,
    repl: Repl,
    lru: bool,
    /// A miss is taken in the loop ([`Hierarchy::fills`]).
    fills: bool,
    /// A write miss is taken in the loop too: writes allocate
    /// (`-lN-dwalloc a`; the other policies take the plain path).
    fills_writes: bool,
    next: Option<usize>,
    /// The cache's counters, for what [`Front::straddle`] and
    /// [`Front::fill`] count besides fetches and misses.
    stats: &'a mut Stats,
}

impl<'a> Front<'a> {
    /// The view of `c`, a cache with a small store; `fills` as
    /// [`Hierarchy::fills`] has it.
    fn of(c: &'a mut Cache, fills: bool) -> Option<Self> {
        let repl = c.config.repl;
        Some(Front {
            bshift: c.bshift,
            set_mask: c.set_mask,
            bsize: c.config.bsize,
            repl,
            lru: repl == Repl::Lru,
            fills,
            fills_writes: c.config.walloc == WriteAlloc::Always,
            next: c.next,
            stats: &mut c.stats,
            store: c.store.small()?,
        })
    }

    /// The set of `block`.
    #[inline(always)]
    fn set(&self, block: u64) -> usize {
        (block & self.set_mask) as usize
    }

    /// A reference across `block` and the next block whose two pieces both
    /// hit: takes them, in order, as [`Hierarchy::at`] does (two fetches,
    /// one multi-block ref) and returns true; otherwise changes nothing.
    #[inline(never)]
    fn straddle(&mut self, block: u64, write: bool) -> bool {
        let second = block + 1;
        // Whether the second piece hits first: taking the first piece
        // reorders its set but leaves every set's blocks as they were.
        if self.store.find(self.set(second), second).is_none()
            || !self.store.hit(self.set(block), block, self.lru, write)
        {
            return false;
        }
        let hit = self.store.hit(self.set(second), second, self.lru, write);
        debug_assert!(hit);
        self.stats.multiblock += 1;
        true
    }

    /// A miss of `r`, within `block`, taken as `Cache::piece` takes it
    /// (the line inserted, dirty for a write; a write's fetch is a read,
    /// none for a write of the whole block; a dirty victim written back),
    /// what it sends to the next level queued on `pending`. Returns false,
    /// changing nothing, where the plain path must take it.
    #[inline(never)]
    fn fill(&mut self, block: u64, r: &Ref, pending: &mut Vec<Sent>, rng: &mut Rng) -> bool {
        let write = r.kind == AccessKind::Write;
        if !self.fills || (write && !self.fills_writes) {
            return false;
        }
        let (slot, victim) = self.store.insert(self.set(block), block, self.repl, rng);
        self.store.set_dirty(slot, write);
        if !write || u64::from(r.size) != self.bsize {
            self.stats.bytes_from_memory += self.bsize;
            let kind = if write { AccessKind::Read } else { r.kind };
            self.send(pending, kind, block << self.bshift);
        }
        if let Some(v) = victim.filter(|v| v.dirty) {
            self.stats.bytes_to_memory += self.bsize;
            self.send(pending, AccessKind::Write, v.block << self.bshift);
        }
        true
    }

    /// Queues a whole-block reference for the next level, if any.
    fn send(&self, pending: &mut Vec<Sent>, kind: AccessKind, addr: u64) {
        if let Some(to) = self.next {
            pending.push(Sent {
                to,
                kind,
                addr,
                size: self.bsize,
            });
        }
    }
}

/// The fast path's view of the first cache of one access kind.
#[derive(Clone, Copy, Debug)]
struct Hot {
    /// A hit of this kind within one block needs nothing but the lookup:
    /// there is a first cache, without `-ccc`, and for writes it writes
    /// back (a write-through sends the write towards memory).
    fast: bool,
    lru: bool,
    /// Index of the first cache (0 when `fast` is false).
    cache: usize,
    bshift: u32,
    set_mask: u64,
}

impl Hierarchy {
    /// Builds the hierarchy from checked caches in Dinero's order (see
    /// [`crate::config::HierarchyBuilder::build`]), wired as Dinero's
    /// `initialize_caches` wires them.
    pub fn new(configs: Vec<CacheConfig>, seed: u64) -> Self {
        // Wire from the last level up, as Dinero does.
        let n = configs.len();
        let mut next_of = vec![None; n];
        let (mut ci, mut cd): (Option<usize>, Option<usize>) = (None, None);
        let max_level = configs.iter().map(|c| c.level).max().unwrap_or(0);
        for level in (1..=max_level).rev() {
            for (idx, c) in configs.iter().enumerate().filter(|(_, c)| c.level == level) {
                match c.side {
                    Side::Unified => {
                        next_of[idx] = ci;
                        ci = Some(idx);
                        cd = Some(idx);
                    }
                    Side::Instr => {
                        next_of[idx] = ci;
                        ci = Some(idx);
                    }
                    Side::Data => {
                        next_of[idx] = cd;
                        cd = Some(idx);
                    }
                }
            }
        }
        let caches: Vec<Cache> = configs
            .into_iter()
            .zip(next_of)
            .map(|(c, next)| Cache::new(c, next))
            .collect();
        let first = [cd, cd, ci, cd];
        let hot = std::array::from_fn(|k| {
            let off = Hot {
                fast: false,
                lru: false,
                cache: 0,
                bshift: 0,
                set_mask: 0,
            };
            let Some(idx) = first[k] else { return off };
            let c = &caches[idx];
            let fast = !c.config.ccc
                && (k != AccessKind::Write as usize || c.config.wback != WriteBack::Never);
            Hot {
                fast,
                lru: c.config.repl == Repl::Lru,
                cache: idx,
                bshift: c.bshift,
                set_mask: c.set_mask,
            }
        });
        debug_assert!(AccessKind::ALL
            .iter()
            .all(|&k| IS_WRITE[k as usize] == (k == AccessKind::Write)));
        let mut fronts = [None; 2];
        let mut slot = [NONE; 4];
        let mut n = 0;
        for (idx, c) in caches.iter().enumerate() {
            let takes = |k: usize| hot[k].fast && hot[k].cache == idx;
            if (0..4).any(takes) && c.config.assoc as usize <= SMALL_ASSOC_MAX {
                debug_assert!(n < NONE);
                fronts[n] = Some(idx);
                (0..4).filter(|&k| takes(k)).for_each(|k| slot[k] = n);
                n += 1;
            }
        }
        let fills = fronts.map(|f| {
            f.is_some_and(|idx| {
                let mut below = std::iter::successors(caches[idx].next, |&n| caches[n].next);
                caches[idx].config.repl != Repl::Random && !below.any(|n| fronts.contains(&Some(n)))
            })
        });
        Hierarchy {
            first,
            hot,
            fronts,
            slot,
            fills,
            caches,
            pending: Vec::new(),
            rng: Rng::new(seed),
        }
    }

    /// Simulates one reference from the trace.
    #[inline]
    pub fn reference(&mut self, r: Ref) {
        let k = r.kind as usize;
        let size = u64::from(r.size);
        let h = self.hot[k];
        // Fast path, the common case: a first-level hit within one block
        // that sends nothing towards memory (not a write-through).  It does
        // exactly what `Cache::piece` does for such a hit (the proptest
        // `fast_path_equals_the_plain_path` checks it), with what it needs
        // about the cache in one small record and without branching on the
        // kind of access (a write sets the dirty bit by arithmetic), which
        // a mixed stream would mispredict.
        if h.fast {
            let block = r.addr >> h.bshift;
            // No overflow: references never wrap the address space.
            let last = (r.addr + size - 1) >> h.bshift;
            let write = r.kind == AccessKind::Write;
            let set = (block & h.set_mask) as usize;
            let c = &mut self.caches[h.cache];
            if last == block {
                if c.store.hit(set, block, h.lru, write) {
                    c.stats.fetch[k] += 1;
                    return;
                }
            } else if last == block + 1 && c.store.hit(set, block, h.lru, write) {
                // A reference straddling two blocks whose first piece hits
                // (an instruction across a line boundary): that piece is
                // done as `at` does it, the second goes on from here.
                c.stats.fetch[k] += 1;
                c.stats.multiblock += 1;
                let set = (last & h.set_mask) as usize;
                if c.store.hit(set, last, h.lru, write) {
                    c.stats.fetch[k] += 1;
                } else {
                    let at = last << h.bshift;
                    self.at(h.cache, r.kind, at, r.addr + size - at);
                }
                return;
            }
        }
        if let Some(first) = self.first[k] {
            self.at(first, r.kind, r.addr, size);
        }
    }

    /// The first cache references of `kind` enter (`None`: they go
    /// straight to memory).
    pub fn first_cache(&self, kind: AccessKind) -> Option<&Cache> {
        self.first[kind as usize].map(|i| &self.caches[i])
    }

    /// Counts `n` references of `kind` that hit the first cache's line
    /// referenced last, within one block: such a hit changes nothing but
    /// the fetch count (see [`crate::fetch`]; not a write, which may write
    /// through).
    #[inline]
    pub fn count_hits(&mut self, kind: AccessKind, n: u64) {
        debug_assert!(kind != AccessKind::Write);
        if let Some(i) = self.first[kind as usize] {
            self.caches[i].stats.fetch[kind as usize] += n;
        }
    }

    /// Counts `n` instruction fetches that straddle two lines of the
    /// first instruction cache, both on top of their sets (a filter's
    /// hits, [`crate::fetch::Stripped`]): each is two pieces, two demand
    /// fetches that hit and change nothing, and one multi-block ref.
    pub fn count_straddling_hits(&mut self, n: u64) {
        if let Some(i) = self.first[AccessKind::Instr as usize] {
            let s = &mut self.caches[i].stats;
            s.fetch[AccessKind::Instr as usize] += 2 * n;
            s.multiblock += n;
        }
    }

    /// Simulates a block's instruction fetches from its leaders
    /// ([`crate::fetch`]): the fast path of [`Hierarchy::reference`] for
    /// instruction fetches, with the fetch counts of hits added once.
    #[inline]
    pub fn fetch_block(&mut self, leaders: &[crate::fetch::Leader]) {
        let k = AccessKind::Instr as usize;
        let h = self.hot[k];
        let Some(first) = self.first[k] else { return };
        let mut hits = 0;
        for l in leaders {
            let block = l.addr >> h.bshift;
            let end = (l.addr + u64::from(l.size) - 1) >> h.bshift;
            if h.fast && end == block {
                let set = (block & h.set_mask) as usize;
                if self.caches[h.cache].store.hit(set, block, h.lru, false) {
                    hits += 1 + u64::from(l.follow);
                    continue;
                }
                self.at(first, AccessKind::Instr, l.addr, u64::from(l.size));
            } else {
                // A straddling leader: the fast path's two-piece hit first.
                self.reference(Ref {
                    kind: AccessKind::Instr,
                    addr: l.addr,
                    size: l.size,
                });
            }
            hits += u64::from(l.follow);
        }
        self.caches[first].stats.fetch[k] += hits;
    }

    /// Simulates a batch of references: runs of first-level hits
    /// ([`Hierarchy::hits`]), each reference after one through
    /// [`Hierarchy::reference`], out of line.
    pub fn run(&mut self, mut refs: &[Ref]) {
        while !refs.is_empty() {
            let n = self.hits(refs);
            if let Some(&r) = refs.get(n) {
                self.off_top(r);
            }
            refs = refs.get(n + 1..).unwrap_or_default();
        }
    }

    /// [`Hierarchy::reference`], not inlined into [`Hierarchy::run`].
    #[inline(never)]
    fn off_top(&mut self, r: Ref) {
        self.reference(r);
    }

    /// Simulates the references at the start of `refs` that a first cache
    /// of the fast path ([`Hot::fast`]) with a small store takes without
    /// the plain path: all of `bench/cachesim.sh`'s stream but for a few
    /// references across two blocks. A hit within one block (93 % of that
    /// stream on the top line of its set) is [`Hierarchy::reference`]'s
    /// fast path: the line moves to the top (LRU), a write sets its dirty
    /// bit, the fetch is counted. A hit of both pieces of a reference
    /// across two blocks is [`Front::straddle`], a miss within one block
    /// [`Front::fill`], which queues what it sends to the next level; the
    /// queue is simulated, in order, before this returns. Returns how many
    /// references it took; the first one it did not take changed nothing.
    ///
    /// Why a loop of its own: each first cache is found once per run
    /// rather than through the hierarchy per reference, and the loop holds
    /// nothing else, so its values stay in registers.
    fn hits(&mut self, refs: &[Ref]) -> usize {
        let (mut pair, mut single);
        let lanes: &mut [Front<'_>] = match self.fronts {
            [Some(a), Some(b)] => {
                debug_assert!(a < b);
                let (x, y) = self.caches.split_at_mut(b);
                let (Some(x), Some(y)) = (
                    Front::of(&mut x[a], self.fills[0]),
                    Front::of(&mut y[0], self.fills[1]),
                ) else {
                    return 0;
                };
                pair = [x, y];
                &mut pair
            }
            [Some(a), None] => {
                let Some(x) = Front::of(&mut self.caches[a], self.fills[0]) else {
                    return 0;
                };
                single = [x];
                &mut single
            }
            _ => return 0,
        };
        let slot = self.slot;
        let pending = &mut self.pending;
        let rng = &mut self.rng;
        let mut fetches = [0u64; 4];
        let mut misses = [0u64; 4];
        // The loop keeps no index: `rest` starts at the reference it stopped at.
        let mut rest = refs;
        while let [r, tail @ ..] = rest {
            let k = r.kind as usize;
            // A kind without a front takes the plain path.
            let Some(f) = lanes.get_mut(slot[k]) else {
                break;
            };
            let block = r.addr >> f.bshift;
            // No overflow: references never wrap the address space.
            let last = (r.addr + u64::from(r.size) - 1) >> f.bshift;
            // A load rather than a comparison with its flag set.
            let write = IS_WRITE[k];
            if last == block {
                if !f.store.hit(f.set(block), block, f.lru, write) {
                    if !f.fill(block, r, pending, rng) {
                        break;
                    }
                    misses[k] += 1;
                }
            } else if last == block + 1 && f.straddle(block, write) {
                fetches[k] += 1;
            } else {
                break;
            }
            fetches[k] += 1;
            rest = tail;
        }
        // Without a branch per kind (which runs end unpredictably): a kind
        // without a front has no fetches, and its `cache` is 0, a cache.
        for k in 0..4 {
            let s = &mut self.caches[self.hot[k].cache].stats;
            s.fetch[k] += fetches[k];
            s.miss[k] += misses[k];
        }
        let mut queue = std::mem::take(&mut self.pending);
        for s in queue.drain(..) {
            self.at(s.to, s.kind, s.addr, s.size);
        }
        self.pending = queue;
        refs.len() - rest.len()
    }

    /// [`Hierarchy::run`] without the fast path: every reference goes
    /// through `Cache::piece`, the plain statement of the semantics that
    /// tests hold the fast path against.
    #[cfg(test)]
    fn run_plain(&mut self, refs: &[Ref]) {
        for &r in refs {
            if let Some(first) = self.first[r.kind as usize] {
                self.at(first, r.kind, r.addr, u64::from(r.size));
            }
        }
    }

    /// Ends the simulation as Dinero's `main` does ("copy everything back
    /// at the end"): a copy-back of the whole data-side hierarchy.  Level by
    /// level from the first data cache down, every dirty line is written to
    /// the next level as a whole-block write, in the order Dinero's pending
    /// stack gives (`d4copyback` pushes them set by set from the top of each
    /// set; they are processed last pushed first), and only then does the
    /// next level copy back its own dirty lines.
    pub fn finish(&mut self) {
        let mut at = self.first[AccessKind::Read as usize];
        while let Some(idx) = at {
            let c = &mut self.caches[idx];
            let (bsize, bshift, next) = (c.config.bsize, c.bshift, c.next);
            let dirty = c.store.take_dirty();
            c.stats.bytes_to_memory += bsize * dirty.len() as u64;
            for &block in dirty.iter().rev() {
                self.below(next, AccessKind::Write, block << bshift, bsize);
            }
            at = next;
        }
    }

    /// Simulates a reference at cache `idx`, piece by piece.  From
    /// [`Hierarchy::reference`] only first-level misses and block-crossing
    /// references come here (a few percent): `cold` keeps the fast path's
    /// loop tight (3 % less CPU time on `bench/cachesim.sh`'s `bin`).
    #[cold]
    fn at(&mut self, idx: usize, kind: AccessKind, addr: u64, size: u64) {
        let c = &mut self.caches[idx];
        let bsize = c.config.bsize;
        let mut a = addr;
        let mut left = size;
        loop {
            let piece = left.min(bsize - (a & (bsize - 1)));
            let c = &mut self.caches[idx];
            if piece < left {
                c.stats.multiblock += 1;
            }
            let down = c.piece(kind, a, piece, &mut self.rng);
            let next = c.next;
            if let Some((k, block_addr)) = down.fetch {
                c.stats.bytes_from_memory += bsize;
                self.below(next, k, block_addr, bsize);
            }
            if down.write_through {
                self.caches[idx].stats.bytes_to_memory += piece;
                self.below(next, AccessKind::Write, a, piece);
            }
            if let Some(v) = down.victim {
                self.caches[idx].stats.bytes_to_memory += bsize;
                self.below(next, AccessKind::Write, v, bsize);
            }
            left -= piece;
            if left == 0 {
                break;
            }
            a += piece;
        }
    }

    #[inline]
    fn below(&mut self, next: Option<usize>, kind: AccessKind, addr: u64, size: u64) {
        if let Some(n) = next {
            self.at(n, kind, addr, size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CacheConfig;
    use AccessKind::{Instr, Misc, Read, Write};

    fn rf(kind: AccessKind, addr: u64, size: u32) -> Ref {
        Ref { kind, addr, size }
    }

    fn one(c: CacheConfig, refs: &[Ref]) -> Stats {
        let mut h = Hierarchy::new(vec![c], 1);
        h.run(refs);
        h.finish();
        h.caches.remove(0).stats
    }

    fn total(a: [u64; 4]) -> u64 {
        a.iter().sum()
    }

    #[test]
    fn direct_mapped_conflicts_by_hand() {
        // 4 blocks of 16 bytes, direct mapped: 0x00 and 0x40 share set 0.
        let c = CacheConfig::new(1, Side::Unified, 64, 16, 1).unwrap();
        let s = one(
            c,
            &[
                rf(Read, 0, 4),
                rf(Read, 0x40, 4),
                rf(Read, 0, 4),
                rf(Read, 0x10, 4),
                rf(Read, 0x14, 4),
            ],
        );
        assert_eq!(s.fetch[0], 5);
        assert_eq!(s.miss[0], 4); // 0 miss, 40 miss, 0 miss (evicted), 10 miss, 14 hit
        assert_eq!(s.bytes_from_memory, 64);
    }

    #[test]
    fn lru_fifo_random_by_hand() {
        // One set of 2 ways: A B A C A.  LRU: C evicts B, A hits -> 3 misses.
        // FIFO: C evicts A (oldest), A misses -> 4 misses.
        let trace = [
            rf(Read, 0, 1),
            rf(Read, 16, 1),
            rf(Read, 0, 1),
            rf(Read, 32, 1),
            rf(Read, 0, 1),
        ];
        let mut c = CacheConfig::new(1, Side::Unified, 32, 16, 2).unwrap();
        assert_eq!(total(one(c.clone(), &trace).miss), 3);
        c.repl = Repl::Fifo;
        assert_eq!(total(one(c.clone(), &trace).miss), 4);
        // Random: the last A hits or misses depending on the victim; 3 or 4,
        // and the same seed gives the same answer.
        c.repl = Repl::Random;
        let m = total(one(c.clone(), &trace).miss);
        assert!(m == 3 || m == 4);
        assert_eq!(m, total(one(c, &trace).miss));
    }

    #[test]
    fn split_references_count_each_piece() {
        // 16-byte blocks: an 8-byte read at 0xc covers blocks 0 and 1.
        let c = CacheConfig::new(1, Side::Unified, 64, 16, 1).unwrap();
        let s = one(c, &[rf(Read, 0xc, 8), rf(Read, 0x10, 4), rf(Read, 0x8, 40)]);
        assert_eq!(s.multiblock, 1 + 2);
        // pieces: c..10 miss, 10..14 miss; 10 hit; 8..10 hit, 10..20 hit, 20..30 miss
        assert_eq!(s.fetch[0], 2 + 1 + 3);
        assert_eq!(s.miss[0], 3);
    }

    #[test]
    fn write_back_allocate_by_hand() {
        // Direct mapped 2 blocks of 16: write 0 (miss, fetch block as read,
        // dirty), write 0x20 (same set: miss, fetch, dirty victim 0 written
        // back).
        let c = CacheConfig::new(1, Side::Unified, 32, 16, 1).unwrap();
        let s = one(c, &[rf(Write, 0, 4), rf(Write, 0x20, 4), rf(Read, 0x20, 4)]);
        assert_eq!((s.fetch[1], s.miss[1], s.fetch[0], s.miss[0]), (2, 2, 1, 0));
        assert_eq!(s.bytes_from_memory, 32);
        // The dirty victim, and the dirty 0x20 copied back at the end.
        assert_eq!(s.bytes_to_memory, 16 + 16);
        // A write of a whole block allocates without fetching.
        let c = CacheConfig::new(1, Side::Unified, 32, 16, 1).unwrap();
        let s = one(c, &[rf(Write, 0, 16)]);
        assert_eq!((s.miss[1], s.bytes_from_memory), (1, 0));
    }

    #[test]
    fn write_through_no_allocate_by_hand() {
        let mut c = CacheConfig::new(1, Side::Unified, 32, 16, 1).unwrap();
        c.wback = WriteBack::Never;
        c.walloc = WriteAlloc::Never;
        // Write miss: not allocated, written through; read then misses.
        let s = one(
            c.clone(),
            &[
                rf(Write, 0, 4),
                rf(Read, 0, 4),
                rf(Write, 4, 2),
                rf(Read, 8, 4),
            ],
        );
        assert_eq!((s.miss[1], s.fetch[1]), (1, 2));
        assert_eq!((s.miss[0], s.fetch[0]), (1, 2));
        assert_eq!(s.bytes_to_memory, 4 + 2);
        assert_eq!(s.bytes_from_memory, 16);
        // nofetch allocation: only whole-block writes allocate.
        c.walloc = WriteAlloc::NoFetch;
        let s = one(
            c,
            &[
                rf(Write, 0, 4),
                rf(Write, 0x10, 16),
                rf(Read, 0, 1),
                rf(Read, 0x10, 1),
            ],
        );
        assert_eq!((s.miss[1], s.miss[0]), (2, 1));
    }

    #[test]
    fn write_back_nofetch_equals_always_without_sub_blocks() {
        let mut rng = Rng::new(9);
        let trace: Vec<Ref> = (0..5000)
            .map(|_| {
                rf(
                    AccessKind::ALL[rng.below(4)],
                    rng.below(2048) as u64,
                    1 + rng.below(24) as u32,
                )
            })
            .collect();
        let mut a = CacheConfig::new(1, Side::Unified, 256, 16, 2).unwrap();
        let mut f = a.clone();
        f.wback = WriteBack::NoFetch;
        assert_eq!(one(a.clone(), &trace), one(f.clone(), &trace));
        a.walloc = WriteAlloc::NoFetch;
        f.walloc = WriteAlloc::NoFetch;
        assert_eq!(one(a, &trace), one(f, &trace));
    }

    #[test]
    fn final_copy_back_order_matches_dinero() {
        // L1d: 4 direct-mapped blocks; L2: one set of 2 blocks.  A, B, C are
        // written (dirty in L1d), D read; L2 ends holding D, C.  The copy-back
        // visits sets last to first: C (L2 hit), B (miss, evicts D), A (miss,
        // evicts dirty C: 16 bytes).  L2 then copies back A and B: 32 bytes.
        // The opposite order would give 3 write misses.  Dinero IV 7 prints
        // exactly these L2 numbers for this trace.
        let l1i = CacheConfig::new(1, Side::Instr, 64, 16, 1).unwrap();
        let l1d = CacheConfig::new(1, Side::Data, 64, 16, 1).unwrap();
        let l2 = CacheConfig::new(2, Side::Unified, 32, 16, 2).unwrap();
        let mut h = Hierarchy::new(vec![l1i, l1d, l2], 1);
        h.run(&[
            rf(Write, 0, 4),
            rf(Write, 0x10, 4),
            rf(Write, 0x20, 4),
            rf(Read, 0x30, 4),
        ]);
        h.finish();
        let u = &h.caches[2].stats;
        assert_eq!((u.fetch[0], u.fetch[1]), (4, 3));
        assert_eq!((u.miss[0], u.miss[1]), (4, 2));
        assert_eq!((u.bytes_from_memory, u.bytes_to_memory), (64, 48));
        assert_eq!(h.caches[1].stats.bytes_to_memory, 48);
    }

    #[test]
    fn three_cs_by_hand() {
        // 2 blocks of 16, direct mapped: 0, 0x20, 0 -> compulsory, compulsory,
        // conflict (a 2-block fully associative cache holds both).  Then
        // 0x40, 0x60, 0 with a full cache: capacity for 0.
        let mut c = CacheConfig::new(1, Side::Unified, 32, 16, 1).unwrap();
        c.ccc = true;
        let s = one(
            c,
            &[
                rf(Read, 0, 1),
                rf(Read, 0x20, 1),
                rf(Read, 0, 1),
                rf(Read, 0x40, 1),
                rf(Read, 0x60, 1),
                rf(Read, 0, 1),
            ],
        );
        assert_eq!(s.compulsory[0], 4);
        assert_eq!(s.conflict[0], 1);
        assert_eq!(s.capacity[0], 1);
        assert_eq!(s.miss[0], 6);
    }

    #[test]
    fn one_sided_split_level_passes_the_other_kind_down() {
        // Only an L1 data cache above a unified L2: instruction fetches go
        // straight to L2; with no L2 they are not simulated at all.
        let l1d = CacheConfig::new(1, Side::Data, 32, 16, 1).unwrap();
        let l2 = CacheConfig::new(2, Side::Unified, 256, 16, 2).unwrap();
        let mut h = Hierarchy::new(vec![l1d.clone(), l2], 1);
        h.run(&[rf(Instr, 0, 4), rf(Read, 0x100, 4), rf(Instr, 0, 4)]);
        assert_eq!(h.caches[0].stats.fetch, [1, 0, 0, 0]);
        assert_eq!(
            (h.caches[1].stats.fetch[2], h.caches[1].stats.miss[2]),
            (2, 1)
        );
        let mut h = Hierarchy::new(vec![l1d], 1);
        h.run(&[rf(Instr, 0, 4), rf(Read, 0x100, 4)]);
        assert_eq!(h.caches[0].stats.fetch, [1, 0, 0, 0]);
    }

    #[test]
    fn split_l1_unified_l2_routing_and_order() {
        let l1i = CacheConfig::new(1, Side::Instr, 32, 16, 1).unwrap();
        let l1d = CacheConfig::new(1, Side::Data, 32, 16, 1).unwrap();
        let l2 = CacheConfig::new(2, Side::Unified, 256, 16, 2).unwrap();
        let mut h = Hierarchy::new(vec![l1i, l1d, l2], 1);
        h.run(&[
            rf(Instr, 0, 4),
            rf(Read, 0x100, 4),
            rf(Write, 0x120, 4),
            rf(Misc, 0x200, 1),
            rf(Instr, 0, 4),
        ]);
        h.finish();
        let (i, d, u) = (&h.caches[0].stats, &h.caches[1].stats, &h.caches[2].stats);
        assert_eq!((i.fetch[2], i.miss[2]), (2, 1));
        assert_eq!((d.fetch[0], d.fetch[1], d.fetch[3]), (1, 1, 1));
        // L2 sees: i-fetch 0, read 0x100, read (write-allocate fetch) 0x120,
        // misc 0x200 (its fetch), then the dirty victim 0x120 written back
        // (set 0 of L1d): order fetch first, write-back after.
        assert_eq!(u.fetch, [2, 1, 1, 1]);
        assert_eq!(u.miss, [2, 0, 1, 1]);
        assert_eq!(d.bytes_to_memory, 16);
        // L2 holds 0x120 dirty (the write-back) and copies it back at the end.
        assert_eq!(u.bytes_to_memory, 16);
    }

    /// Misses taken in the hit loop (LRU and FIFO first caches) queue what
    /// they send to a random-replacement L2 while the other side's misses
    /// (random, so the plain path's) reach it at once: the L2 must still
    /// see, and draw for, every reference in the stream's order.
    #[test]
    fn queued_misses_keep_the_next_level_in_order() {
        for (i_repl, d_repl) in [(Repl::Lru, Repl::Random), (Repl::Fifo, Repl::Lru)] {
            let mut l1i = CacheConfig::new(1, Side::Instr, 64, 16, 2).unwrap();
            let mut l1d = CacheConfig::new(1, Side::Data, 64, 16, 2).unwrap();
            let mut l2 = CacheConfig::new(2, Side::Unified, 256, 16, 4).unwrap();
            (l1i.repl, l1d.repl, l2.repl) = (i_repl, d_repl, Repl::Random);
            let configs = vec![l1i, l1d, l2];
            let mut rng = Rng::new(11);
            let refs: Vec<Ref> = (0..20_000)
                .map(|_| {
                    let kind = AccessKind::ALL[rng.below(4)];
                    rf(kind, rng.below(1024) as u64 & !3, 4)
                })
                .collect();
            let mut fast = Hierarchy::new(configs.clone(), 3);
            fast.run(&refs);
            fast.finish();
            let mut plain = Hierarchy::new(configs, 3);
            plain.run_plain(&refs);
            plain.finish();
            for (f, p) in fast.caches.iter().zip(&plain.caches) {
                assert_eq!(f.stats, p.stats, "{:?}", f.config);
            }
            assert!(fast.caches[2].stats.miss.iter().sum::<u64>() > 1000);
        }
    }

    /// A random cache for level `level` on `side`: 64..4096 bytes, blocks
    /// 4..64 bytes, any associativity up to fully associative (wide sets
    /// use the hash-map store), any policy.
    fn random_cache(level: usize, side: Side, g: [u64; 7]) -> CacheConfig {
        let bsize = 4u64 << (g[0] % 5);
        let size = (bsize << (g[1] % 7)).max(64);
        let blocks = size / bsize;
        let assoc = if g[2] % 4 == 0 {
            blocks
        } else {
            1u64 << (g[2] % (blocks.trailing_zeros() as u64 + 1))
        };
        let mut c = CacheConfig::new(level, side, size, bsize, assoc).unwrap();
        c.repl = [Repl::Lru, Repl::Fifo, Repl::Random][(g[3] % 3) as usize];
        if side != Side::Instr {
            c.walloc =
                [WriteAlloc::Always, WriteAlloc::Never, WriteAlloc::NoFetch][(g[4] % 3) as usize];
            c.wback =
                [WriteBack::Always, WriteBack::Never, WriteBack::NoFetch][(g[5] % 3) as usize];
        }
        c.ccc = g[6] % 4 == 0;
        c
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// The fast path of `Hierarchy::reference` (a first-level hit) and
        /// the hit loop of `Hierarchy::run` (hits, references across two
        /// blocks, misses whose next-level references wait for the end of
        /// the run) give exactly the statistics of the plain path, on random
        /// hierarchies (a unified, split, data-only or instruction-only L1,
        /// up to two unified levels below, every policy, `-ccc`) and random
        /// streams with the locality that makes them fire (hits at the top
        /// and below it, block-crossing references).
        #[test]
        fn fast_path_equals_the_plain_path(
            gens in proptest::collection::vec(proptest::prelude::any::<[u64; 7]>(), 4),
            shape in 0usize..4,
            below in 0usize..3,
            seed in 0u64..1000,
            steps in proptest::collection::vec((0usize..4, 0u64..8, 0u64..2048, 1u32..24), 1..600),
        ) {
            let mut configs = match shape {
                0 => vec![random_cache(1, Side::Unified, gens[0])],
                1 => vec![random_cache(1, Side::Instr, gens[0]), random_cache(1, Side::Data, gens[1])],
                2 => vec![random_cache(1, Side::Data, gens[1])],
                _ => vec![random_cache(1, Side::Instr, gens[0])],
            };
            for (level, &g) in gens.iter().enumerate().skip(2).take(below) {
                let mut c = random_cache(level, Side::Unified, g);
                c.size = c.size.max(configs.last().unwrap().size);
                c.assoc = c.assoc.min(c.size / c.bsize);
                configs.push(c);
            }
            // Mostly short strides from the previous address (a new block
            // now and then), sometimes a jump.
            let mut addr = 0u64;
            let refs: Vec<Ref> = steps
                .iter()
                .map(|&(kind, step, jump, size)| {
                    addr = if step == 0 { jump } else { addr + step };
                    rf(AccessKind::ALL[kind], addr, size)
                })
                .collect();
            let mut fast = Hierarchy::new(configs.clone(), seed);
            fast.run(&refs);
            fast.finish();
            let mut plain = Hierarchy::new(configs, seed);
            plain.run_plain(&refs);
            plain.finish();
            for (f, p) in fast.caches.iter().zip(&plain.caches) {
                proptest::prop_assert_eq!(&f.stats, &p.stats, "{:?}", f.config);
            }
        }
    }
}
