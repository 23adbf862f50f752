//! `--model cachegrind`: the semantics of cachegrind's cache simulator
//! (valgrind's `cg_sim.c`), so our numbers can be set beside its numbers.
//!
//! - Instruction fetches go to I1, reads, writes and misc references to D1;
//!   a write behaves as a read and there is no dirty state (no write-back
//!   traffic).
//! - An access straddling two lines is one access; it misses if either line
//!   misses, and both lines are looked up (both update LRU state).  An
//!   access straddling more than two lines is refused (cachegrind aborts).
//! - The last level (LL) is looked up only on a first-level miss, with the
//!   same address and size; LL is unified.
//! - Replacement is LRU.
//! - A write right after a read of the same address and size, with no
//!   instruction fetch between them, is the write half of a
//!   read-modify-write (extended din writes one as `r` then `w`, lackey as
//!   `M`): cachegrind merges such a pair into one `Dm` event, which it
//!   simulates and counts as a read, so the write is dropped. Cachegrind
//!   merges by the IR's address expression, we by the address: an
//!   instruction that loads and stores one address through two operands
//!   (`movs` with `rsi == rdi`) is two references for cachegrind, one here.
//!
//! Geometry comes from `-l1-i*`, `-l1-d*` and `-l2-u*` (LL), as cachegrind's
//! `--I1=size,assoc,line --D1=... --LL=...`.

use crate::cache::{Repl, Rng, Store};
use crate::config::{CacheConfig, Side};
use crate::trace::Ref;
use crate::{AccessKind, Error, Result};

struct Level {
    store: Store,
    bshift: u32,
    set_mask: u64,
    /// The block looked up last: the most recent of its set (LRU), so
    /// looking it up again hits and changes nothing (consecutive
    /// instructions in one line, stack slots).
    last: Option<u64>,
}

impl Level {
    fn new(c: &CacheConfig) -> Self {
        Level {
            store: Store::new(c.sets() as usize, c.assoc as usize),
            bshift: c.bsize.trailing_zeros(),
            set_mask: c.sets() - 1,
            last: None,
        }
    }

    #[inline]
    fn block_is_miss(&mut self, block: u64, rng: &mut Rng) -> bool {
        if self.last == Some(block) {
            return false;
        }
        self.last = Some(block);
        let set = (block & self.set_mask) as usize;
        let ways = self.store.ways();
        // LRU with no dirty state: one pass that finds the line and moves
        // it (or the new one) to the top, instead of a search, then a move
        // or an insertion, each keeping dirty bits.
        if let Some(s) = self.store.small() {
            return s.lru_depth(set, block) == ways;
        }
        if (self.store).hit(set, block, true, false) {
            return false;
        }
        self.store.insert(set, block, Repl::Lru, rng);
        true
    }

    /// Whether `block` is present, made the most recent of its set if so
    /// (nothing changes otherwise).
    #[inline]
    fn hit(&mut self, block: u64) -> bool {
        if self.last == Some(block) {
            return true;
        }
        let hit = (self.store).hit((block & self.set_mask) as usize, block, true, false);
        if hit {
            self.last = Some(block);
        }
        hit
    }

    /// Whether `size` bytes at `addr` are in one line, the most recent of
    /// its set: a hit that changes nothing (LRU).
    #[inline(always)]
    fn top_hit(&self, addr: u64, size: u32) -> bool {
        let (b1, b2) = self.lines(addr, size);
        b1 == b2 && self.store.top((b1 & self.set_mask) as usize) == b1
    }

    /// The first and last line of `size` bytes at `addr` (`size` > 0).
    #[inline(always)]
    fn lines(&self, addr: u64, size: u32) -> (u64, u64) {
        (
            addr >> self.bshift,
            (addr + u64::from(size) - 1) >> self.bshift,
        )
    }

    /// cachegrind's `cachesim_ref_is_miss`; `None` if the access straddles
    /// more than two lines.
    #[inline]
    fn is_miss(&mut self, addr: u64, size: u32, rng: &mut Rng) -> Option<bool> {
        let (b1, b2) = self.lines(addr, size);
        if b1 == b2 {
            Some(self.block_is_miss(b1, rng))
        } else if b1 + 1 == b2 {
            let m1 = self.block_is_miss(b1, rng);
            let m2 = self.block_is_miss(b2, rng);
            Some(m1 || m2)
        } else {
            None
        }
    }
}

/// Counters in cachegrind's terms.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CgStats {
    /// Instruction fetches.
    pub i_refs: u64,
    /// First-level instruction cache misses.
    pub i1_misses: u64,
    /// Last-level misses of instruction fetches.
    pub lli_misses: u64,
    /// Data reads (misc references included).
    pub d_reads: u64,
    /// Data writes.
    pub d_writes: u64,
    /// First-level data cache misses of reads.
    pub d1_read_misses: u64,
    /// First-level data cache misses of writes.
    pub d1_write_misses: u64,
    /// Last-level misses of data reads.
    pub lld_read_misses: u64,
    /// Last-level misses of data writes.
    pub lld_write_misses: u64,
}

/// The cachegrind-model simulator.
pub struct Cachegrind {
    /// D1 and I1 ([`I1`]), indexed by [`side`]: chosen by an index, not a branch on
    /// the kind, which a mixed stream would mispredict.
    l1: [Level; 2],
    ll: Option<Level>,
    /// Never used by LRU; the store interface takes one.
    rng: Rng,
    /// The counters so far.
    pub stats: CgStats,
    index: u64,
    /// The reference before, if it was a data read: (address, size);
    /// else [`NO_READ`].
    last_read: (u64, u32),
}

/// `last_read` when the reference before was no data read: no reference
/// has this address and size (`addr + size` would overflow).
const NO_READ: (u64, u32) = (u64::MAX, 1);

/// [`Cachegrind::l1`]'s index of I1 (D1's is 0).
const I1: usize = 1;

/// [`Cachegrind::l1`]'s index of the first-level cache `kind` goes to.
#[inline(always)]
fn side(kind: AccessKind) -> usize {
    usize::from(kind == AccessKind::Instr)
}

impl Cachegrind {
    /// Takes the caches from the Dinero-style options: level 1 split, and an
    /// optional unified level 2 as LL.
    pub fn new(caches: &[CacheConfig]) -> Result<Self> {
        let find = |l, s| caches.iter().find(|c| c.level == l && c.side == s);
        let shape_err = || {
            Error::Usage(
                "--model cachegrind needs -l1-i* and -l1-d* caches and optionally a unified -l2-u* (LL), nothing else"
                    .into(),
            )
        };
        let (Some(i1), Some(d1)) = (find(1, Side::Instr), find(1, Side::Data)) else {
            return Err(shape_err());
        };
        let ll = find(2, Side::Unified);
        if caches.len() != 2 + usize::from(ll.is_some()) {
            return Err(shape_err());
        }
        for c in caches {
            if c.repl != Repl::Lru || c.ccc {
                return Err(Error::Usage(format!(
                    "{}: cachegrind simulates LRU only and has no -ccc",
                    c.name
                )));
            }
        }
        Ok(Cachegrind {
            l1: [Level::new(d1), Level::new(i1)],
            ll: ll.map(Level::new),
            rng: Rng::new(0),
            stats: CgStats::default(),
            index: 0,
            last_read: NO_READ,
        })
    }

    /// Simulates one reference: here, without a call, a hit on the most
    /// recent line of its first-level set (7 data references in 10 of
    /// gzip's first 50 M records, `docs/data.md`), which changes nothing.
    /// Inlined into its callers' loops (a call per reference cost 12
    /// instructions of 96 on `bench/cachesim.sh`'s stream).
    #[inline(always)]
    pub fn reference(&mut self, r: Ref) -> Result<()> {
        self.reference_after(0, r)
    }

    /// [`Cachegrind::count_i1_hits`] of `followers` (none when 0), then
    /// [`Cachegrind::reference`] of `r`, without a branch on the count:
    /// for a stream whose references each carry the I1 hits before them.
    #[inline(always)]
    pub fn reference_after(&mut self, followers: u64, r: Ref) -> Result<()> {
        self.index += followers + 1;
        self.stats.i_refs += followers;
        // A fetch between a read and a write: no read-modify-write.
        let same = followers == 0 && self.last_read == (r.addr, r.size);
        self.last_read = if r.kind == AccessKind::Read {
            (r.addr, r.size)
        } else {
            NO_READ
        };
        if same && r.kind == AccessKind::Write {
            return Ok(());
        }
        if self.l1[side(r.kind)].top_hit(r.addr, r.size) {
            self.count(r.kind, false, false);
            return Ok(());
        }
        self.look_up(r)
    }

    /// [`Cachegrind::reference`] past the modify and the top line's hit.
    #[inline(never)]
    fn look_up(&mut self, r: Ref) -> Result<()> {
        let m1 = self.l1[side(r.kind)]
            .is_miss(r.addr, r.size, &mut self.rng)
            .ok_or_else(|| self.straddle(r))?;
        let mll = m1 && self.ll_is_miss(r)?;
        self.count(r.kind, m1, mll);
        Ok(())
    }

    /// Whether `r`, which missed its first-level cache, misses LL.
    #[inline]
    fn ll_is_miss(&mut self, r: Ref) -> Result<bool> {
        let Some(ll) = &mut self.ll else {
            return Ok(false);
        };
        ll.is_miss(r.addr, r.size, &mut self.rng)
            .ok_or_else(|| self.straddle(r))
    }

    /// The error of reference `r` (the current one), which straddles more
    /// than two lines.
    #[cold]
    fn straddle(&self, r: Ref) -> Error {
        Error::Reference {
            index: self.index,
            message: format!(
                "{:?} at {:#x} size {} straddles more than two cache lines (cachegrind refuses it too)",
                r.kind, r.addr, r.size
            ),
        }
    }

    /// The fetch of leader `l`, then of its followers, where a stack of
    /// lines shared with other I1s of the same sets decided whether it
    /// misses I1 (`miss`; [`crate::fetch::Stripped`]): as
    /// [`Cachegrind::reference`] would count it, LL looked up on a miss,
    /// but I1 itself neither looked at nor changed.
    #[inline]
    pub fn fetch_decided(&mut self, l: crate::fetch::Leader, miss: bool) -> Result<()> {
        let r = Ref {
            kind: AccessKind::Instr,
            addr: l.addr,
            size: l.size,
        };
        self.index += 1;
        self.last_read = NO_READ;
        let (b1, b2) = self.l1[I1].lines(r.addr, r.size);
        if b2 > b1 + 1 {
            return Err(self.straddle(r));
        }
        let mll = miss && self.ll_is_miss(r)?;
        self.count(AccessKind::Instr, miss, mll);
        self.count_i1_hits(u64::from(l.follow));
        Ok(())
    }

    /// Counts a reference of `kind`, with its first-level and last-level
    /// misses. Without a branch on the kind: in a stream of data
    /// references and fetches it is not predictable (a jump table here
    /// mispredicted 63 % of its jumps on a gzip data trace, by
    /// `valgrind --tool=cachegrind --branch-sim=yes`).
    #[inline(always)]
    fn count(&mut self, kind: AccessKind, m1: bool, mll: bool) {
        let s = &mut self.stats;
        let (i, w) = (kind == AccessKind::Instr, kind == AccessKind::Write);
        // Misc counts as a read.
        let r = !i && !w;
        s.i_refs += u64::from(i);
        s.d_writes += u64::from(w);
        s.d_reads += u64::from(r);
        if m1 {
            s.i1_misses += u64::from(i);
            s.d1_write_misses += u64::from(w);
            s.d1_read_misses += u64::from(r);
        }
        if mll {
            s.lli_misses += u64::from(i);
            s.lld_write_misses += u64::from(w);
            s.lld_read_misses += u64::from(r);
        }
    }

    /// Simulates a block's instruction fetches from its leaders
    /// ([`crate::fetch`]): a leader whose one or two I1 lines hit is
    /// counted with its followers at once (LRU hits, as `block_is_miss`
    /// does them, in order); the others go through
    /// [`Cachegrind::reference`], which finds the lines that hit here on
    /// top of their sets, so looking them up again changes nothing.
    #[inline]
    pub fn fetch_block(&mut self, leaders: &[crate::fetch::Leader]) -> Result<()> {
        let shift = self.l1[I1].bshift;
        for l in leaders {
            let b = l.addr >> shift;
            let e = (l.addr + u64::from(l.size) - 1) >> shift;
            let i1 = &mut self.l1[I1];
            if i1.hit(b) && (e == b || (e == b + 1 && i1.hit(e))) {
                self.count_i1_hits(1 + u64::from(l.follow));
                continue;
            }
            self.reference(Ref {
                kind: AccessKind::Instr,
                addr: l.addr,
                size: l.size,
            })?;
            self.count_i1_hits(u64::from(l.follow));
        }
        Ok(())
    }

    /// I1's line size.
    pub fn i1_line(&self) -> u64 {
        1 << self.l1[I1].bshift
    }

    /// I1's number of sets.
    pub fn i1_sets(&self) -> u64 {
        self.l1[I1].set_mask + 1
    }

    /// I1's ways.
    pub fn i1_ways(&self) -> u64 {
        self.l1[I1].store.ways() as u64
    }

    /// Counts `n` instruction fetches that hit I1's line fetched last
    /// (they change no state, see [`crate::fetch`]).
    #[inline]
    pub fn count_i1_hits(&mut self, n: u64) {
        self.index += n;
        self.last_read = NO_READ;
        self.stats.i_refs += n;
    }

    /// A summary in cachegrind's terms.
    pub fn report(&self) -> String {
        let s = &self.stats;
        let pct = |m: u64, n: u64| {
            if n == 0 {
                0.0
            } else {
                100.0 * m as f64 / n as f64
            }
        };
        let d = s.d_reads + s.d_writes;
        let d1 = s.d1_read_misses + s.d1_write_misses;
        let lld = s.lld_read_misses + s.lld_write_misses;
        let mut o = String::from("---aetrace cachesim --model cachegrind\n");
        o += &format!("I refs:        {}\n", s.i_refs);
        o += &format!("I1  misses:    {}\n", s.i1_misses);
        o += &format!("LLi misses:    {}\n", s.lli_misses);
        o += &format!("I1  miss rate: {:.2}%\n", pct(s.i1_misses, s.i_refs));
        o += &format!("LLi miss rate: {:.2}%\n\n", pct(s.lli_misses, s.i_refs));
        o += &format!(
            "D refs:        {} ({} rd + {} wr)\n",
            d, s.d_reads, s.d_writes
        );
        o += &format!(
            "D1  misses:    {} ({} rd + {} wr)\n",
            d1, s.d1_read_misses, s.d1_write_misses
        );
        o += &format!(
            "LLd misses:    {} ({} rd + {} wr)\n",
            lld, s.lld_read_misses, s.lld_write_misses
        );
        o += &format!("D1  miss rate: {:.1}%\n", pct(d1, d));
        o += &format!("LLd miss rate: {:.1}%\n\n", pct(lld, d));
        o += &format!("LL refs:       {}\n", s.i1_misses + d1);
        o += &format!("LL misses:     {}\n", s.lli_misses + lld);
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cg(refs: &[Ref]) -> CgStats {
        let i1 = CacheConfig::new(1, Side::Instr, 64, 16, 1).unwrap();
        let d1 = CacheConfig::new(1, Side::Data, 64, 16, 2).unwrap();
        let ll = CacheConfig::new(2, Side::Unified, 256, 16, 4).unwrap();
        let mut c = Cachegrind::new(&[i1, d1, ll]).unwrap();
        for &r in refs {
            c.reference(r).unwrap();
        }
        c.stats
    }

    fn rf(kind: AccessKind, addr: u64, size: u32) -> Ref {
        Ref { kind, addr, size }
    }

    #[test]
    fn straddle_is_one_access_missing_if_either_line_misses() {
        // I1: 4 blocks of 16.  0xe+4 straddles blocks 0 and 1: one ref, miss.
        // Then 0x10+2: hit (block 1 was loaded by the straddle).
        // Then 0x4e+4 straddles 4 (set 0, evicts 0) and 5 (set 1, evicts 1).
        // Then 0xe+4 again: both lines miss, still one miss.
        let s = cg(&[
            rf(AccessKind::Instr, 0xe, 4),
            rf(AccessKind::Instr, 0x10, 2),
            rf(AccessKind::Instr, 0x4e, 4),
            rf(AccessKind::Instr, 0xe, 4),
        ]);
        assert_eq!((s.i_refs, s.i1_misses), (4, 3));
        // LL (16 blocks, 4-way) holds everything: only the first two LL
        // lookups miss... the last access hits LL.
        assert_eq!(s.lli_misses, 2);
    }

    #[test]
    fn writes_behave_as_reads_and_ll_only_on_l1_miss() {
        let s = cg(&[
            rf(AccessKind::Write, 0x100, 8),
            rf(AccessKind::Read, 0x100, 8),
            rf(AccessKind::Write, 0x100, 4),
        ]);
        assert_eq!((s.d_writes, s.d_reads), (2, 1));
        assert_eq!((s.d1_write_misses, s.d1_read_misses), (1, 0));
        assert_eq!(s.lld_write_misses, 1);
    }

    #[test]
    fn a_write_after_a_read_of_it_is_one_modify() {
        let s = cg(&[
            rf(AccessKind::Instr, 0, 4),
            rf(AccessKind::Read, 0x100, 8),
            rf(AccessKind::Write, 0x100, 8),
            // Another size, another address, or an instruction between: a
            // write of its own.
            rf(AccessKind::Read, 0x200, 8),
            rf(AccessKind::Write, 0x200, 4),
            rf(AccessKind::Read, 0x300, 8),
            rf(AccessKind::Write, 0x308, 8),
            rf(AccessKind::Read, 0x400, 8),
            rf(AccessKind::Instr, 4, 4),
            rf(AccessKind::Write, 0x400, 8),
            // `r r w` (xchg as VEX translates it): two reads.
            rf(AccessKind::Instr, 8, 4),
            rf(AccessKind::Read, 0x500, 8),
            rf(AccessKind::Read, 0x500, 8),
            rf(AccessKind::Write, 0x500, 8),
        ]);
        assert_eq!((s.d_reads, s.d_writes), (6, 3));
        assert_eq!((s.d1_read_misses, s.d1_write_misses), (5, 0));
    }

    #[test]
    fn three_line_access_is_refused() {
        let i1 = CacheConfig::new(1, Side::Instr, 64, 16, 1).unwrap();
        let d1 = CacheConfig::new(1, Side::Data, 64, 16, 1).unwrap();
        let mut c = Cachegrind::new(&[i1, d1]).unwrap();
        let e = c.reference(rf(AccessKind::Read, 0xf, 20)).unwrap_err();
        assert!(e.to_string().contains("straddles more than two"));
    }
}
