//! Wrapped intervals of 64-bit machine words, the value domain that bounds
//! jump-table indices in [`crate::jumptable`].
//!
//! A [`Range`] is the set `{lo, lo+1, ..., lo+len}` modulo 2^64: it may
//! wrap past `u64::MAX` to 0, so one type describes unsigned ranges,
//! signed ranges (`-0x20..=0x10`) and their translations exactly. This is
//! the "signedness-agnostic" interval domain of Navas et al. (2012), kept
//! to the operations glibc's string functions need: translation, negation,
//! addition of two ranges, scaling, and intersection.
//!
//! Invariant: every operation over-approximates: if `x` is in `a` (and `y`
//! in `b`), the result of the machine operation on `x` (and `y`) is in the
//! result range. `meet` returns the smallest wrapped interval covering the
//! true intersection (which may be two pieces), `None` when it is empty.
//! The tests check each operation against brute force on sample points.

/// `{lo, lo+1, ..., lo+len}` modulo 2^64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Range {
    /// The smallest value, in wrapping order.
    pub lo: u64,
    /// The number of further values: the range holds `len + 1` values.
    pub len: u64,
}

/// The sign bit: adding it maps signed order onto unsigned order.
const SIGN: u64 = 1 << 63;

impl Range {
    /// The range of all 2^64 values.
    pub const FULL: Range = Range {
        lo: 0,
        len: u64::MAX,
    };

    /// `{c}`.
    pub fn konst(c: u64) -> Range {
        Range { lo: c, len: 0 }
    }

    /// `0..=hi` (unsigned).
    pub fn upto(hi: u64) -> Range {
        Range { lo: 0, len: hi }
    }

    /// `lo..=hi` walking up from `lo` (wrapping when `hi < lo`).
    pub fn between(lo: u64, hi: u64) -> Range {
        Range {
            lo,
            len: hi.wrapping_sub(lo),
        }
    }

    /// Values that fit in `bits` bits, zero-extended.
    pub fn bits(bits: u32) -> Range {
        if bits >= 64 {
            Range::FULL
        } else {
            Range::upto((1u64 << bits) - 1)
        }
    }

    /// Values of `bits` bits sign-extended to 64.
    pub fn signed_bits(bits: u32) -> Range {
        if bits >= 64 {
            Range::FULL
        } else {
            let half = 1u64 << (bits - 1);
            Range::between(half.wrapping_neg(), half - 1)
        }
    }

    /// The largest value, in wrapping order (`lo + len` modulo 2^64).
    pub fn hi(self) -> u64 {
        self.lo.wrapping_add(self.len)
    }

    pub(crate) fn is_full(self) -> bool {
        self.len == u64::MAX
    }

    /// Whether `x` lies in the range.
    pub fn contains(self, x: u64) -> bool {
        x.wrapping_sub(self.lo) <= self.len
    }

    /// Whether the range runs past `u64::MAX` (as an unsigned interval it
    /// is two pieces).
    fn wraps(self) -> bool {
        self.lo.checked_add(self.len).is_none()
    }

    /// The largest member as an unsigned number.
    pub fn umax(self) -> u64 {
        if self.wraps() {
            u64::MAX
        } else {
            self.hi()
        }
    }

    /// The smallest member as an unsigned number.
    pub fn umin(self) -> u64 {
        if self.wraps() {
            0
        } else {
            self.lo
        }
    }

    /// `{x + c}`.
    pub fn add_const(self, c: u64) -> Range {
        Range {
            lo: self.lo.wrapping_add(c),
            len: self.len,
        }
    }

    /// `{-x}`.
    pub(crate) fn neg(self) -> Range {
        Range {
            lo: self.hi().wrapping_neg(),
            len: self.len,
        }
    }

    /// `{x + y}`.
    pub(crate) fn add(self, o: Range) -> Range {
        match self.len.checked_add(o.len) {
            Some(len) => Range {
                lo: self.lo.wrapping_add(o.lo),
                len,
            },
            None => Range::FULL,
        }
    }

    /// `{x * k}` (wrapping).
    pub(crate) fn mul(self, k: u64) -> Range {
        if k > SIGN {
            return self.neg().mul(k.wrapping_neg());
        }
        match self.len.checked_mul(k) {
            Some(len) => Range {
                lo: self.lo.wrapping_mul(k),
                len,
            },
            None => Range::FULL,
        }
    }

    /// The same set seen with signed order mapped onto unsigned order (and
    /// back: the map is its own inverse).
    pub fn flip_sign(self) -> Range {
        self.add_const(SIGN)
    }

    /// As at most two ordinary intervals `(a, b)`, `a <= b`.
    fn pieces(self) -> [Option<(u64, u64)>; 2] {
        if self.wraps() {
            [Some((self.lo, u64::MAX)), Some((0, self.hi()))]
        } else {
            [Some((self.lo, self.hi())), None]
        }
    }

    /// The smallest range covering both sets' intersection; `None` when it
    /// is empty.
    pub fn meet(self, o: Range) -> Option<Range> {
        let mut parts: Vec<(u64, u64)> = Vec::with_capacity(4);
        for (a, b) in self.pieces().into_iter().flatten() {
            for (c, d) in o.pieces().into_iter().flatten() {
                let (lo, hi) = (a.max(c), b.min(d));
                if lo <= hi {
                    parts.push((lo, hi));
                }
            }
        }
        parts.sort_unstable();
        // Merge touching pieces; the pieces of one range never overlap, so
        // neither do their intersections with another's.
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(parts.len());
        for (lo, hi) in parts {
            match merged.last_mut() {
                Some(last) if last.1.checked_add(1) == Some(lo) => last.1 = hi,
                _ => merged.push((lo, hi)),
            }
        }
        let (&first, &last) = (merged.first()?, merged.last()?);
        // The smallest cover leaves out the largest gap between pieces,
        // the gap from the last piece round to the first included.
        // (Its size wraps to 0 when the pieces reach both 0 and MAX.)
        let mut best = (
            first.0.wrapping_sub(last.1).wrapping_sub(1),
            Range::between(first.0, last.1),
        );
        for w in merged.windows(2) {
            let gap = w[1].0 - w[0].1 - 1;
            if gap > best.0 {
                best = (gap, Range::between(w[1].0, w[0].1));
            }
        }
        // The cover lies within both operands (the complement of each is
        // inside one gap of the intersection).
        debug_assert!(best.1.len <= self.len && best.1.len <= o.len);
        Some(best.1)
    }

    /// The members `x` with `x <= bound` for some `bound` in `b`
    /// (unsigned): `self ∩ 0..=umax(b)`.
    pub fn le(self, b: Range) -> Option<Range> {
        self.meet(Range::upto(b.umax()))
    }

    /// The members `x` with `x < bound` for some `bound` in `b`.
    pub fn lt(self, b: Range) -> Option<Range> {
        self.meet(Range::upto(b.umax().checked_sub(1)?))
    }

    /// The members `x` with `x >= bound` for some `bound` in `b`.
    pub fn ge(self, b: Range) -> Option<Range> {
        self.meet(Range::between(b.umin(), u64::MAX))
    }

    /// The members `x` with `x > bound` for some `bound` in `b`.
    pub fn gt(self, b: Range) -> Option<Range> {
        self.meet(Range::between(b.umin().checked_add(1)?, u64::MAX))
    }

    /// Without the value `c`.
    pub fn without(self, c: u64) -> Option<Range> {
        self.meet(Range {
            lo: c.wrapping_add(1),
            len: u64::MAX - 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Ranges near the interesting points (0, the sign bit, `u64::MAX`),
    /// short or long.
    fn range() -> impl Strategy<Value = Range> {
        let point = prop_oneof![
            any::<u64>(),
            (0u64..64).prop_map(|d| d.wrapping_sub(32)),
            (0u64..64).prop_map(|d| SIGN.wrapping_add(d).wrapping_sub(32)),
        ];
        let len = prop_oneof![0u64..80, any::<u64>(), Just(u64::MAX)];
        (point, len).prop_map(|(lo, len)| Range { lo, len })
    }

    /// A member of `r` picked by `k`.
    fn member(r: Range, k: u64) -> u64 {
        r.lo.wrapping_add(if r.len == u64::MAX {
            k
        } else {
            k % (r.len + 1)
        })
    }

    /// Naive reference: the members of the intersection among the ends and
    /// neighbours of both ranges, plus `x`.
    fn naive_meet_members(a: Range, b: Range, x: u64) -> Vec<u64> {
        let mut v = vec![x];
        for r in [a, b] {
            for e in [r.lo, r.hi()] {
                for d in [0u64, 1, u64::MAX] {
                    v.push(e.wrapping_add(d));
                }
            }
        }
        v.into_iter()
            .filter(|&y| a.contains(y) && b.contains(y))
            .collect()
    }

    proptest! {
        #[test]
        fn meet_covers_the_intersection(a in range(), b in range(), k in any::<u64>()) {
            let members = naive_meet_members(a, b, member(a, k));
            match a.meet(b) {
                Some(m) => {
                    for y in members {
                        prop_assert!(m.contains(y), "{a:?} ^ {b:?} = {m:?} misses {y:#x}");
                    }
                    // No larger than either operand.
                    prop_assert!(m.len <= a.len && m.len <= b.len);
                }
                None => prop_assert!(members.is_empty(), "{a:?} ^ {b:?} empty but {members:?}"),
            }
        }

        #[test]
        fn arithmetic_covers_its_results(a in range(), b in range(), k in any::<u64>(),
                                         j in any::<u64>(), c in any::<u64>(), s in 0u64..9) {
            let (x, y) = (member(a, k), member(b, j));
            prop_assert!(a.add(b).contains(x.wrapping_add(y)));
            prop_assert!(a.add_const(c).contains(x.wrapping_add(c)));
            prop_assert!(a.neg().contains(x.wrapping_neg()));
            prop_assert!(a.mul(s).contains(x.wrapping_mul(s)));
            prop_assert!(a.mul(s.wrapping_neg()).contains(x.wrapping_mul(s.wrapping_neg())));
            prop_assert!(a.flip_sign().flip_sign() == a);
            if x <= y { prop_assert!(a.le(b).is_some_and(|r| r.contains(x))); }
            if x < y { prop_assert!(a.lt(b).is_some_and(|r| r.contains(x))); }
            if x >= y { prop_assert!(a.ge(b).is_some_and(|r| r.contains(x))); }
            if x > y { prop_assert!(a.gt(b).is_some_and(|r| r.contains(x))); }
            if x != y { prop_assert!(a.without(y).is_some_and(|r| r.contains(x))); }
        }
    }

    #[test]
    fn two_piece_intersections_keep_the_smaller_cover() {
        // -0x20..=0x10 meets 0..=MAX/2 (signed >= 0): 0..=0x10.
        let r = Range::between(0u64.wrapping_sub(0x20), 0x10);
        assert_eq!(r.meet(Range::upto(SIGN - 1)), Some(Range::upto(0x10)));
        // 0..=15 without 0.
        assert_eq!(Range::upto(15).without(0), Some(Range::between(1, 15)));
        // Disjoint.
        assert_eq!(Range::upto(5).meet(Range::between(6, 9)), None);
        assert_eq!(Range::FULL.meet(Range::FULL), Some(Range::FULL));
        assert_eq!(
            Range::signed_bits(8),
            Range::between(0xffff_ffff_ffff_ff80, 0x7f)
        );
    }
}
