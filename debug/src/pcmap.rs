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
    /// (first address, flags from it on).
    spans: Vec<(u64, Vec<u8>)>,
}

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

    /// How many of `addrs`, from the first, have none of `mask`'s flags:
    /// the walks skip those at once.
    #[inline]
    pub fn quiet(&self, addrs: &[u64], mask: u8) -> usize {
        let loud = |&a: &u64| self.get(a) & mask != 0;
        addrs.iter().position(loud).unwrap_or(addrs.len())
    }
}
