//! One cache's storage: sets of block numbers kept in replacement order, and
//! a dirty bit per line.
//!
//! Each set is a stack in Dinero IV's sense: position 0 is the top (most
//! recently used for LRU, most recently inserted for FIFO and random), the
//! bottom is the next victim for LRU and FIFO.  Small sets (the usual
//! associativities) are flat arrays scanned linearly and shifted on
//! insertion; sets wider than [`SMALL_ASSOC_MAX`] (fully associative caches)
//! use a hash map plus an intrusive doubly linked list so a reference costs
//! O(1).
//!
//! Invariants: a block number appears at most once in a set; the valid lines
//! of a small set are a prefix of its array (invalid lines hold
//! [`INVALID`]); `dirty` is false on every invalid line.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Marks an empty line.  Block numbers never reach it because addresses are
/// checked so that `addr + size` does not overflow.
pub const INVALID: u64 = u64::MAX;

/// Widest set stored as a flat array.
pub const SMALL_ASSOC_MAX: usize = 64;

/// Replacement policy (Dinero's `-lN-Trepl l|f|r`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Repl {
    /// Least recently used.
    Lru,
    /// First in, first out.
    Fifo,
    /// A pseudo-random line of the set (seeded, so runs repeat).
    Random,
}

/// A fast, deterministic hasher for block numbers (multiply-shift); block
/// numbers are not adversarial.
#[derive(Default, Clone, Copy)]
pub struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// `HashMap` keyed by block numbers.
pub type BlockMap<V> = HashMap<u64, V, BuildHasherDefault<BlockHasher>>;

/// splitmix64: the seeded generator behind random replacement.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (equal seeds give equal sequences).
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0; the modulo bias is below 2^-50 for n < 2^14).
    #[inline]
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Where a block lives: an index into the line arrays.
pub type Slot = usize;

/// A victim pushed out by an insertion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Victim {
    pub block: u64,
    pub dirty: bool,
}

/// Sets of lines in replacement order.
#[derive(Clone, Debug)]
pub(crate) enum Store {
    Small(SmallStore),
    Large(LargeStore),
}

impl Store {
    pub(crate) fn new(sets: usize, assoc: usize) -> Self {
        debug_assert!(sets.is_power_of_two() && assoc >= 1);
        debug_assert!(assoc > SMALL_ASSOC_MAX || assoc.is_power_of_two());
        if assoc <= SMALL_ASSOC_MAX {
            Store::Small(SmallStore::new(sets, assoc))
        } else {
            Store::Large(LargeStore::new(sets, assoc))
        }
    }

    /// Lines per set.
    pub(crate) fn ways(&self) -> usize {
        match self {
            Store::Small(s) => s.assoc,
            Store::Large(l) => l.assoc,
        }
    }

    /// The slot holding `block` in `set`, if any.
    #[inline(always)]
    pub fn find(&self, set: usize, block: u64) -> Option<Slot> {
        match self {
            Store::Small(s) => s.find(set, block),
            Store::Large(l) => l.map.get(&block).map(|&i| i as usize),
        }
    }

    /// The block at the top of `set` (for LRU, the most recent), or
    /// [`INVALID`] where that is more than one load away (a large set).
    #[inline(always)]
    pub fn top(&self, set: usize) -> u64 {
        match self {
            Store::Small(s) => s.top(set),
            Store::Large(_) => INVALID,
        }
    }

    /// The store as flat sets, `None` for a large one.
    #[inline]
    pub(crate) fn small(&mut self) -> Option<&mut SmallStore> {
        match self {
            Store::Small(s) => Some(s),
            Store::Large(_) => None,
        }
    }

    /// The hit of the fast path: when `block` is in `set`, moves it to the
    /// top if `lru`, marks it dirty if `write`, and returns true; otherwise
    /// changes nothing.  The same as [`Store::find`], then [`Store::touch`]
    /// (LRU), then [`Store::set_dirty`], in fewer steps.
    #[inline(always)]
    pub fn hit(&mut self, set: usize, block: u64, lru: bool, write: bool) -> bool {
        match self {
            Store::Small(s) => s.hit(set, block, lru, write),
            Store::Large(l) => match l.map.get(&block) {
                Some(&slot) => {
                    if lru {
                        l.move_to_top(set, slot as usize);
                    }
                    l.dirty[slot as usize] |= write;
                    true
                }
                None => false,
            },
        }
    }

    /// Moves a hit line to the top of its set (LRU); returns its new slot.
    #[inline(always)]
    pub fn touch(&mut self, set: usize, slot: Slot) -> Slot {
        match self {
            Store::Small(s) => s.touch(set, slot),
            Store::Large(l) => {
                l.move_to_top(set, slot);
                slot
            }
        }
    }

    /// Puts `block` (absent from `set`) at the top, evicting per `repl` when
    /// the set is full.  Returns the new line's slot and the victim.
    #[inline]
    pub fn insert(
        &mut self,
        set: usize,
        block: u64,
        repl: Repl,
        rng: &mut Rng,
    ) -> (Slot, Option<Victim>) {
        match self {
            Store::Small(s) => s.insert(set, block, repl, rng),
            Store::Large(l) => l.insert(set, block, repl, rng),
        }
    }

    /// Marks the line at `slot` dirty when `dirty` is true (without a
    /// branch on it: writes and reads come mixed).
    #[inline]
    pub fn set_dirty(&mut self, slot: Slot, dirty: bool) {
        match self {
            Store::Small(s) => s.set_dirty(slot, dirty),
            Store::Large(l) => l.dirty[slot] |= dirty,
        }
    }

    /// The dirty blocks, set by set and from the top of each set down
    /// (the order in which Dinero's `d4copyback` visits them), leaving every
    /// line clean.
    pub fn take_dirty(&mut self) -> Vec<u64> {
        let mut out = Vec::new();
        match self {
            Store::Small(s) => {
                for (set, mask) in s.dirty.iter_mut().enumerate() {
                    let lines = &s.tags[set * s.assoc..(set + 1) * s.assoc];
                    for (p, &t) in lines.iter().enumerate() {
                        if (*mask >> p) & 1 != 0 {
                            debug_assert!(t != INVALID);
                            out.push(t);
                        }
                    }
                    *mask = 0;
                }
            }
            Store::Large(l) => {
                for set in 0..l.head.len() {
                    let mut at = l.head[set];
                    while at != NIL {
                        if std::mem::take(&mut l.dirty[at as usize]) {
                            out.push(l.tags[at as usize]);
                        }
                        at = l.next[at as usize];
                    }
                }
            }
        }
        out
    }
}

/// Flat sets: `tags[set * assoc ..][..assoc]`, top first; dirty bits as one
/// mask per set (bit `p` = line at position `p`), so moving lines costs a few
/// shifts instead of a second array copy.
#[derive(Clone, Debug)]
pub struct SmallStore {
    assoc: usize,
    /// log2(assoc)
    assoc_shift: u32,
    tags: Vec<u64>,
    dirty: Vec<u64>,
}

/// Bits `0..n` set (n <= 64).
#[inline]
fn below(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// Moves the line at position `p` of `lines` to position 0, shifting the
/// ones above it down by one.
#[inline]
fn shift_down(lines: &mut [u64], p: usize) {
    let moved = lines[p];
    lines.copy_within(0..p, 1);
    lines[0] = moved;
}

impl SmallStore {
    /// `sets` empty sets of `assoc` lines (powers of two, `assoc` at most
    /// [`SMALL_ASSOC_MAX`]).
    pub(crate) fn new(sets: usize, assoc: usize) -> Self {
        debug_assert!(sets.is_power_of_two() && assoc.is_power_of_two());
        debug_assert!(assoc <= SMALL_ASSOC_MAX);
        SmallStore {
            assoc,
            assoc_shift: assoc.trailing_zeros(),
            tags: vec![INVALID; sets * assoc],
            dirty: vec![0; sets],
        }
    }

    /// The block on top of `set`.
    #[inline(always)]
    pub(crate) fn top(&self, set: usize) -> u64 {
        self.tags[set << self.assoc_shift]
    }

    /// An LRU access to `block` in `set`, no line dirty: returns how deep
    /// it was (0 on top, `assoc` when absent) and leaves it on top, the
    /// bottom line evicted when it was absent. Of LRU caches with these
    /// sets, one of `w` ways holds the `w` lines on top of each set (it
    /// saw the same accesses per set), so the access hits there exactly
    /// when that depth is below `w` (Mattson et al., 1970).
    #[inline]
    pub(crate) fn lru_depth(&mut self, set: usize, block: u64) -> usize {
        let base = set << self.assoc_shift;
        let lines = &mut self.tags[base..base + self.assoc];
        let depth = lines.iter().position(|&t| t == block).unwrap_or(self.assoc);
        shift_down(lines, depth.min(self.assoc - 1));
        lines[0] = block;
        depth
    }

    #[inline(always)]
    pub(crate) fn find(&self, set: usize, block: u64) -> Option<Slot> {
        let base = set << self.assoc_shift;
        // The top line first: most hits are there (one bounds check, no
        // slice arithmetic on the hot path).
        if self.tags[base] == block {
            return Some(base);
        }
        // A block is in a set at most once: keep the (only) match without
        // a data-dependent branch per way.
        let mut hit = usize::MAX;
        for (i, &t) in self.tags[base..base + self.assoc].iter().enumerate() {
            if t == block {
                hit = i;
            }
        }
        if hit == usize::MAX {
            None
        } else {
            Some(base + hit)
        }
    }

    /// [`Store::hit`] on flat sets.
    #[inline(always)]
    pub(crate) fn hit(&mut self, set: usize, block: u64, lru: bool, write: bool) -> bool {
        let base = set << self.assoc_shift;
        // The top line first: most hits are there, and it stays there.
        if self.tags[base] == block {
            self.dirty[set] |= u64::from(write);
            return true;
        }
        let Some(slot) = self.find(set, block) else {
            return false;
        };
        let p = if lru {
            self.touch(set, slot);
            0
        } else {
            slot - base
        };
        self.dirty[set] |= u64::from(write) << p;
        true
    }

    /// Moves bit `p` of the set's dirty mask to bit 0 and bits `0..p` up.
    #[inline]
    fn move_dirty_to_top(&mut self, set: usize, p: usize) {
        let m = self.dirty[set];
        let low = m & below(p);
        let bit = (m >> p) & 1;
        let high = m & !below(p + 1);
        self.dirty[set] = high | low << 1 | bit;
    }

    #[inline(always)]
    fn touch(&mut self, set: usize, slot: Slot) -> Slot {
        let base = set << self.assoc_shift;
        let p = slot - base;
        if p != 0 {
            shift_down(&mut self.tags[base..base + self.assoc], p);
            self.move_dirty_to_top(set, p);
        }
        base
    }

    #[inline]
    pub(crate) fn insert(
        &mut self,
        set: usize,
        block: u64,
        repl: Repl,
        rng: &mut Rng,
    ) -> (Slot, Option<Victim>) {
        let base = set * self.assoc;
        let lines = &mut self.tags[base..base + self.assoc];
        let last = self.assoc - 1;
        // The victim's position: the first invalid line, else per policy.
        let p = if lines[last] == INVALID {
            lines.iter().position(|&t| t == INVALID).unwrap_or(last)
        } else if repl == Repl::Random {
            rng.below(self.assoc)
        } else {
            last
        };
        let victim = (lines[p] != INVALID).then(|| Victim {
            block: lines[p],
            dirty: (self.dirty[set] >> p) & 1 != 0,
        });
        lines[p] = block;
        shift_down(lines, p);
        self.move_dirty_to_top(set, p);
        // The new line is clean.
        self.dirty[set] &= !1;
        (base, victim)
    }

    #[inline]
    pub(crate) fn set_dirty(&mut self, slot: Slot, dirty: bool) {
        let set = slot >> self.assoc_shift;
        self.dirty[set] |= u64::from(dirty) << (slot - (set << self.assoc_shift));
    }
}

/// Wide sets: a map from block to slot and, per set, a doubly linked list in
/// replacement order.
#[derive(Clone, Debug)]
pub struct LargeStore {
    assoc: usize,
    map: BlockMap<u32>,
    tags: Vec<u64>,
    dirty: Vec<bool>,
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Per set: top slot, or NIL.
    head: Vec<u32>,
    tail: Vec<u32>,
    /// Per set: lines in use (the free ones are `base + len ..`).
    len: Vec<u32>,
}

const NIL: u32 = u32::MAX;

impl LargeStore {
    fn new(sets: usize, assoc: usize) -> Self {
        let n = sets * assoc;
        LargeStore {
            assoc,
            map: BlockMap::default(),
            tags: vec![INVALID; n],
            dirty: vec![false; n],
            prev: vec![NIL; n],
            next: vec![NIL; n],
            head: vec![NIL; sets],
            tail: vec![NIL; sets],
            len: vec![0; sets],
        }
    }

    fn unlink(&mut self, set: usize, s: u32) {
        let (p, n) = (self.prev[s as usize], self.next[s as usize]);
        if p == NIL {
            self.head[set] = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail[set] = p;
        } else {
            self.prev[n as usize] = p;
        }
    }

    fn push_top(&mut self, set: usize, s: u32) {
        let h = self.head[set];
        self.prev[s as usize] = NIL;
        self.next[s as usize] = h;
        if h == NIL {
            self.tail[set] = s;
        } else {
            self.prev[h as usize] = s;
        }
        self.head[set] = s;
    }

    fn move_to_top(&mut self, set: usize, slot: Slot) {
        let s = slot as u32;
        if self.head[set] != s {
            self.unlink(set, s);
            self.push_top(set, s);
        }
    }

    fn insert(
        &mut self,
        set: usize,
        block: u64,
        repl: Repl,
        rng: &mut Rng,
    ) -> (Slot, Option<Victim>) {
        let base = set * self.assoc;
        let (slot, victim) = if (self.len[set] as usize) < self.assoc {
            let s = base + self.len[set] as usize;
            self.len[set] += 1;
            (s as u32, None)
        } else {
            let s = match repl {
                // Every line is valid, so any slot of the set is a line.
                Repl::Random => (base + rng.below(self.assoc)) as u32,
                Repl::Lru | Repl::Fifo => self.tail[set],
            };
            self.unlink(set, s);
            let v = Victim {
                block: self.tags[s as usize],
                dirty: self.dirty[s as usize],
            };
            self.map.remove(&v.block);
            (s, Some(v))
        };
        self.tags[slot as usize] = block;
        self.dirty[slot as usize] = false;
        self.map.insert(block, slot);
        self.push_top(set, slot);
        (slot as usize, victim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive reference: each set a Vec in order, top first.
    fn naive(assoc: usize, repl: Repl, blocks: &[u64]) -> Vec<bool> {
        let mut set: Vec<u64> = Vec::new();
        let mut out = Vec::new();
        for &b in blocks {
            if let Some(p) = set.iter().position(|&x| x == b) {
                out.push(true);
                if repl == Repl::Lru {
                    let x = set.remove(p);
                    set.insert(0, x);
                }
            } else {
                out.push(false);
                if set.len() == assoc {
                    set.pop();
                }
                set.insert(0, b);
            }
        }
        out
    }

    #[test]
    fn small_and_large_match_naive_lru_fifo() {
        let mut rng = Rng::new(7);
        let blocks: Vec<u64> = (0..4000).map(|_| rng.below(100) as u64).collect();
        for repl in [Repl::Lru, Repl::Fifo] {
            for assoc in [1, 2, 8, 64, 65, 96] {
                let want = naive(assoc, repl, &blocks);
                let mut st = Store::new(1, assoc);
                let mut r = Rng::new(1);
                let got: Vec<bool> = blocks
                    .iter()
                    .map(|&b| match st.find(0, b) {
                        Some(s) => {
                            if repl == Repl::Lru {
                                st.touch(0, s);
                            }
                            true
                        }
                        None => {
                            st.insert(0, b, repl, &mut r);
                            false
                        }
                    })
                    .collect();
                assert_eq!(got, want, "assoc {assoc} {repl:?}");
            }
        }
    }

    #[test]
    fn victims_and_dirty_bits_follow_lines() {
        let mut st = Store::new(1, 2);
        let mut r = Rng::new(1);
        let (s, v) = st.insert(0, 10, Repl::Lru, &mut r);
        assert_eq!(v, None);
        st.set_dirty(s, true);
        st.insert(0, 11, Repl::Lru, &mut r);
        // 10 is now at the bottom and dirty; touching 10 moves it up.
        let s10 = st.find(0, 10).unwrap();
        st.touch(0, s10);
        let (_, v) = st.insert(0, 12, Repl::Lru, &mut r);
        assert_eq!(
            v,
            Some(Victim {
                block: 11,
                dirty: false
            })
        );
        let (_, v) = st.insert(0, 13, Repl::Lru, &mut r);
        assert_eq!(
            v,
            Some(Victim {
                block: 10,
                dirty: true
            })
        );
    }

    #[test]
    fn take_dirty_walks_sets_top_down() {
        for assoc in [2, 80] {
            let mut st = Store::new(2, assoc);
            let mut r = Rng::new(1);
            // Set 0 gets blocks 0 then 2 (2 on top), set 1 gets 1 then 3.
            for b in [0u64, 2, 1, 3] {
                let (slot, _) = st.insert((b & 1) as usize, b, Repl::Lru, &mut r);
                if b != 3 {
                    st.set_dirty(slot, true);
                }
            }
            assert_eq!(st.take_dirty(), vec![2, 0, 1], "assoc {assoc}");
            assert!(st.take_dirty().is_empty());
        }
    }

    #[test]
    fn random_replacement_evicts_only_residents() {
        for assoc in [4, 80] {
            let mut st = Store::new(1, assoc);
            let mut r = Rng::new(3);
            for b in 0..assoc as u64 {
                assert_eq!(st.insert(0, b, Repl::Random, &mut r).1, None);
            }
            let mut resident: std::collections::HashSet<u64> = (0..assoc as u64).collect();
            for b in 100..400u64 {
                let v = st.insert(0, b, Repl::Random, &mut r).1.unwrap();
                assert!(resident.remove(&v.block));
                resident.insert(b);
                for &x in &resident {
                    assert!(st.find(0, x).is_some());
                }
            }
        }
    }
}
