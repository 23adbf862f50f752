//! Hash maps and sets keyed by instruction addresses (or a few of them),
//! with a hasher for such keys. The procedure stack, its passages and the
//! data walk look one up per instruction: with std's SipHash, hashing
//! took half of the stub's CPU time in a session's first `continue` over
//! gzip's trace (perf, 2026-12-01). Invariant: keys are addresses the
//! trace gives, not chosen to collide (no flooding defence needed).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Fibonacci hashing of each word written.
#[derive(Default)]
pub struct PcHasher(u64);

impl Hasher for PcHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|&b| self.write_u64(u64::from(b)));
    }

    fn write_u64(&mut self, a: u64) {
        // The high bits of the product mix every address bit; the rotation
        // brings them down to the bucket index's.
        self.0 = (self.0 ^ a)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(32);
    }

    fn write_usize(&mut self, a: usize) {
        self.write_u64(a as u64);
    }
}

/// A map keyed by addresses.
pub type PcMap<K, V> = HashMap<K, V, BuildHasherDefault<PcHasher>>;

/// A set of addresses.
pub type PcSet<K> = HashSet<K, BuildHasherDefault<PcHasher>>;

/// Flags of addresses inside a few spans (the modules' code), a byte per
/// address: a look-up is a bounds check and a load, for the procedure
/// stack's walk, which looks up every instruction ([`crate::stack`]).
/// Invariant: an address outside every span has no flags.
#[derive(Clone, Debug, Default)]
pub struct PcFlags {
    spans: Vec<Span>,
}

/// A span of [`PcFlags`]: its first address, the flags from it on.
type Span = (u64, Vec<u8>);

impl PcFlags {
    /// No flags, over `spans` (start, end).
    pub fn over(spans: impl IntoIterator<Item = (u64, u64)>) -> PcFlags {
        let spans = spans
            .into_iter()
            .filter(|&(s, e)| s < e)
            .map(|(s, e)| (s, vec![0; (e - s) as usize]))
            .collect();
        PcFlags { spans }
    }

    /// Sets `flags` on `a`: whether it is in a span (else it cannot be).
    pub fn set(&mut self, a: u64, flags: u8) -> bool {
        let slot = self.spans.iter_mut().find_map(|(s, f)| {
            let off = usize::try_from(a.checked_sub(*s)?).ok()?;
            f.get_mut(off)
        });
        slot.map(|f| *f |= flags).is_some()
    }

    /// The flags of `a` (0 outside the spans).
    #[inline]
    pub fn get(&self, a: u64) -> u8 {
        for (s, f) in &self.spans {
            if let Some(&x) = f.get(a.wrapping_sub(*s) as usize) {
                return x;
            }
        }
        0
    }

    /// `self`'s flags or'ed with `other`'s, both over the same spans (the
    /// procedure stack's and the openers' flags, disjoint bits, for one
    /// scan of the addresses that both walks read: [`PcFlags::flagged`]).
    pub fn union(&self, other: &PcFlags) -> PcFlags {
        let same = |(a, b): (&Span, &Span)| a.0 == b.0 && a.1.len() == b.1.len();
        debug_assert!(self.spans.len() == other.spans.len());
        debug_assert!(self.spans.iter().zip(&other.spans).all(same));
        let spans = (self.spans.iter().zip(&other.spans))
            .map(|((s, a), (_, b))| (*s, a.iter().zip(b).map(|(x, y)| x | y).collect()))
            .collect();
        PcFlags { spans }
    }

    /// The indices of `addrs` whose addresses have flags, each with them,
    /// in order, into `into` (cleared first): the positions a walk may
    /// have to stop at ([`Flagged`]). Each stretch of addresses in one
    /// span (one module's code, where a thread runs for long) is scanned
    /// against that span alone: a subtraction, a compare and a load each
    /// (a look-up per span per address, in each walk, was 12 instructions
    /// per address, 2026-12-02).
    pub fn flagged(&self, addrs: &[u64], into: &mut Vec<(u32, u8)>) {
        debug_assert!(u32::try_from(addrs.len()).is_ok());
        into.clear();
        let mut i = 0;
        while let Some(&a) = addrs.get(i) {
            let span = self
                .spans
                .iter()
                .find(|(s, f)| a.wrapping_sub(*s) < f.len() as u64);
            match span {
                Some((s, f)) => i += stretch(*s, f, &addrs[i..], i, into),
                // In no span: no flags.
                None => i += 1,
            }
        }
    }
}

/// Scans `addrs` (the first at index `first`) while they are in the span
/// from `base` whose flags are `table`, into `into` as
/// [`PcFlags::flagged`]: how many were in it.
fn stretch(
    base: u64,
    table: &[u8],
    addrs: &[u64],
    first: usize,
    into: &mut Vec<(u32, u8)>,
) -> usize {
    for (i, &a) in addrs.iter().enumerate() {
        match table.get(a.wrapping_sub(base) as usize) {
            Some(0) => {}
            Some(&x) => into.push(((first + i) as u32, x)),
            None => return i,
        }
    }
    addrs.len()
}

/// The flagged positions of a run of addresses ([`PcFlags::flagged`]) as
/// a walk over them reads them: front to back.
pub struct Flagged<'a> {
    at: &'a [(u32, u8)],
    /// The first of `at` not before the last position asked about.
    next: usize,
}

impl<'a> Flagged<'a> {
    /// The positions `at`, in order.
    pub fn new(at: &'a [(u32, u8)]) -> Flagged<'a> {
        Flagged { at, next: 0 }
    }

    /// How many positions from `i` on (before `end`) have none of
    /// `mask`'s flags: the walks skip those at once. `i` must not be less
    /// than at the previous call.
    #[inline]
    pub fn quiet(&mut self, i: usize, end: usize, mask: u8) -> usize {
        let mut k = self.next;
        while let Some(&(j, x)) = self.at.get(k) {
            let j = j as usize;
            if j >= end {
                break;
            }
            if j >= i && x & mask != 0 {
                self.next = k;
                return j - i;
            }
            k += 1;
        }
        self.next = k;
        end.saturating_sub(i)
    }
}

#[cfg(test)]
mod tests {
    use super::{Flagged, PcFlags};

    /// [`Flagged::quiet`] over [`PcFlags::flagged`] equals the plain
    /// scan, one look-up per address, over addresses that wander between
    /// two spans, their gap and past them, asked from positions going
    /// forwards as a walk asks.
    #[test]
    fn flagged_positions_skip_as_a_plain_scan() {
        let mut flags = PcFlags::over([(100, 140), (1000, 1010)]);
        let mut x = 12345u64;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            x >> 33
        };
        for _ in 0..12 {
            let a = [100 + next() % 40, 1000 + next() % 10][(next() % 2) as usize];
            flags.set(a, 1 << (next() % 3));
        }
        let mut at = Vec::new();
        for _ in 0..2000 {
            let len = (next() % 40) as usize;
            let addrs: Vec<u64> = (0..len)
                .map(|_| match next() % 5 {
                    0 => 1000 + next() % 12,
                    1 => next() % 2000,
                    _ => 98 + next() % 44,
                })
                .collect();
            flags.flagged(&addrs, &mut at);
            for mask in 1..8 {
                let mut loud = Flagged::new(&at);
                let mut i = 0;
                while i < len {
                    let end = len - (next() % 3) as usize % (len - i);
                    let plain = addrs[i..end].iter().position(|&a| flags.get(a) & mask != 0);
                    let n = loud.quiet(i, end, mask);
                    assert_eq!(n, plain.unwrap_or(end - i), "{addrs:?} from {i}");
                    i += n + 1;
                }
            }
        }
    }
}
