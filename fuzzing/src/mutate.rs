//! A small deterministic mutator for the stable replay (`tests/corpus.rs`):
//! libFuzzer's basic moves (bit flips, interesting integers, inserted,
//! erased and copied ranges, splices with another input) driven by a
//! seeded xorshift generator, so a CI failure replays exactly.

/// A xorshift64* generator (Vigna 2016); never zero.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value).
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

/// Integers that sit on readers' boundaries.
const INTERESTING: [u64; 8] = [0, 1, 0x7f, 0x80, 0xff, 0xffff, 0xffff_ffff, u64::MAX];

/// Applies one to four random moves to `data`; `other` is the splice donor.
pub fn mutate(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    for _ in 0..1 + rng.below(4) {
        one(rng, data, other);
    }
}

fn one(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    let at = rng.below(data.len());
    match rng.below(6) {
        0 if !data.is_empty() => data[at] ^= 1 << rng.below(8),
        1 if !data.is_empty() => {
            let v = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
            let n = [1, 2, 4, 8][rng.below(4)].min(data.len() - at);
            data[at..at + n].copy_from_slice(&v[..n]);
        }
        2 => {
            let n = 1 + rng.below(16);
            let fill = rng.next_u64() as u8;
            data.splice(at..at, std::iter::repeat(fill).take(n));
        }
        3 => {
            let end = at + rng.below(data.len() - at + 1).min(64);
            data.drain(at..end);
        }
        4 if !data.is_empty() => {
            let from = rng.below(data.len());
            let n = rng.below(data.len() - from).min(64) + 1;
            let copy = data[from..from + n].to_vec();
            data.splice(at..at, copy);
        }
        _ if !other.is_empty() => {
            let from = rng.below(other.len());
            let n = (rng.below(other.len() - from) + 1).min(256);
            let end = (at + n).min(data.len());
            data.splice(at..end, other[from..from + n].iter().copied());
        }
        _ => data.push(rng.next_u64() as u8),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Same seed, same mutants; and the moves do change the input.
    #[test]
    fn deterministic_and_effective() {
        let base: Vec<u8> = (0..200u8).collect();
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..50)
                .map(|_| {
                    let mut d = base.clone();
                    mutate(&mut rng, &mut d, b"donor bytes");
                    d
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert!(run(7).iter().filter(|d| **d != base).count() > 40);
    }
}
