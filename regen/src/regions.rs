//! Which pieces of one stream each `-j N` worker expands, when the
//! workers write their pieces at their offsets (`docs/regen.md` section
//! 4, "Writing"): each worker starts with a contiguous region of the
//! pieces and walks it as one walk (a piece after its own last one needs
//! no restore: its machine is already there), and a worker whose region
//! is done steals the back half of the largest region left.
//!
//! Invariants: every piece is handed out exactly once; a worker's pieces
//! come in runs of consecutive numbers, each run from its own start or
//! a steal; a steal never takes a piece a worker has started.

use std::sync::Mutex;

/// The pieces not started yet, per worker: `next..end` of its region
/// (the piece before `next` is the one it runs, if any).
pub(crate) struct Regions {
    left: Mutex<Vec<std::ops::Range<usize>>>,
}

impl Regions {
    /// `pieces` pieces cut into `workers` contiguous regions of as equal
    /// counts as can be.
    pub(crate) fn new(pieces: usize, workers: usize) -> Self {
        let workers = workers.max(1);
        let left = (0..workers)
            .map(|w| pieces * w / workers..pieces * (w + 1) / workers)
            .collect();
        Regions {
            left: Mutex::new(left),
        }
    }

    /// The next piece of worker `w`'s region, the one after the piece it
    /// has run (its first when it has run none); `None` when its region
    /// is done (or was stolen).
    pub(crate) fn next(&self, w: usize) -> Option<usize> {
        let mut left = self.left.lock().ok()?;
        let r = left.get_mut(w)?;
        let k = r.start;
        (k < r.end).then(|| {
            r.start += 1;
            k
        })
    }

    /// For worker `w`, whose region is done: the back half of the largest
    /// region left becomes its region; its first piece, `None` when no
    /// piece is left.
    pub(crate) fn steal(&self, w: usize) -> Option<usize> {
        let mut left = self.left.lock().ok()?;
        debug_assert!(left.get(w).is_some_and(|r| r.is_empty()));
        let (victim, len) = (left.iter().enumerate())
            .map(|(v, r)| (v, r.len()))
            .max_by_key(|&(v, n)| (n, std::cmp::Reverse(v)))?;
        if len == 0 {
            return None;
        }
        let r = &mut left[victim];
        let mid = r.start + len / 2;
        let taken = mid..r.end;
        r.end = mid;
        left[w] = taken.start + 1..taken.end;
        Some(taken.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// However the workers' calls interleave, every piece is handed
        /// out once, and each worker's pieces come in runs of consecutive
        /// numbers, each begun by its first call or a steal.
        #[test]
        fn every_piece_once_in_runs(
            pieces in 0usize..200,
            workers in 1usize..5,
            order in prop::collection::vec(any::<prop::sample::Index>(), 0..600),
        ) {
            let regions = Regions::new(pieces, workers);
            let mut seen = vec![0u32; pieces];
            let mut last: Vec<Option<usize>> = vec![None; workers];
            let mut done = vec![false; workers];
            let mut pick = order.into_iter();
            while done.iter().any(|d| !d) {
                let w = match pick.next() {
                    Some(i) => i.index(workers),
                    None => done.iter().position(|d| !d).unwrap(),
                };
                if done[w] {
                    continue;
                }
                let k = match regions.next(w) {
                    Some(k) => {
                        // A run goes on where it stopped.
                        prop_assert!(last[w].map_or(true, |l| l + 1 == k));
                        Some(k)
                    }
                    None => regions.steal(w),
                };
                match k {
                    Some(k) => {
                        seen[k] += 1;
                        last[w] = Some(k);
                    }
                    None => done[w] = true,
                }
            }
            prop_assert!(seen.iter().all(|&n| n == 1), "{:?}", seen);
        }
    }

    #[test]
    fn regions_split_evenly_and_a_steal_takes_the_back_half() {
        let r = Regions::new(10, 2);
        assert_eq!(r.next(0), Some(0));
        assert_eq!(r.next(1), Some(5));
        for k in 1..5 {
            assert_eq!(r.next(0), Some(k));
        }
        assert_eq!(r.next(0), None);
        // Worker 1 runs 5; 6..10 are left: worker 0 takes 8 and 9.
        assert_eq!(r.steal(0), Some(8));
        assert_eq!(r.next(0), Some(9));
        assert_eq!(r.next(1), Some(6));
        assert_eq!(r.next(1), Some(7));
        assert_eq!(r.next(1), None);
        assert_eq!(r.steal(1), None);
    }
}
