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
