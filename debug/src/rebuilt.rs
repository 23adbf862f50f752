//! A thread's data references as the abstract data walk rebuilt them, for
//! a trace recorded with `--data` but not `--check` (issue 22: the frames'
//! addresses, watchpoints; `docs/debug.md`, "Frames' addresses"). Such a
//! trace has no full addresses to read per instruction (`crate::data`):
//! the data walk of `aetrace regen --format lackey` (`src/cmd/dataout.rs`,
//! in the binary) runs the thread once when the session starts and fills
//! a [`Rebuilt`] through its sink's calls, position by position.
//!
//! Invariants: positions are counted by the walk's block runs, as the
//! regenerator's walk counts them (`crate::data`'s marks, the
//! timeline), so position `n`'s references are the `n`th instruction's;
//! a position is given once, in order (a later call for an earlier one is
//! an error); a `rep` string instruction is one position whose reference
//! spans every iteration's bytes, as `crate::data` gives it.

use aetrace_analysis::addr::Access;

/// The references of every position of a thread (see the module comment).
#[derive(Clone, Debug, Default)]
pub struct Rebuilt {
    /// Position `p`'s references are `refs[at[p]..at[p + 1]]` (the last
    /// position's run to the end of `refs`).
    at: Vec<usize>,
    refs: Vec<(u64, u64, Access)>,
    /// The positions counted by the runs so far.
    next: u64,
    /// The current run: its first position and its block's first
    /// instruction run.
    run: (u64, u32),
    /// The position given last and its references given so far (an
    /// iteration of a `rep` starts again at 0).
    last: Option<u64>,
    nth: usize,
}

impl Rebuilt {
    /// A run of a block starts at instruction `first`, up to `end`.
    pub fn run(&mut self, first: u32, end: u32) {
        debug_assert!(first < end);
        self.run = (self.next, first);
        self.next += u64::from(end - first);
    }

    /// The `k`th instruction of the run's block is executed (a `rep`
    /// string instruction once per iteration and once more).
    pub fn insn(&mut self, k: u32) -> Result<(), String> {
        let p = self.run.0 + u64::from(k.wrapping_sub(self.run.1));
        if p >= self.next || self.last.is_some_and(|l| p < l) {
            return Err(format!(
                "the data walk gave instruction {p} out of order (its run ends at {})",
                self.next
            ));
        }
        while (self.at.len() as u64) <= p {
            self.at.push(self.refs.len());
        }
        (self.last, self.nth) = (Some(p), 0);
        Ok(())
    }

    /// A reference of the instruction given last: `size` bytes at `addr`.
    pub fn data(&mut self, access: Access, addr: u64, size: u32) -> Result<(), String> {
        let Some(p) = self.last else {
            return Err("the data walk gave a reference before any instruction".into());
        };
        let (start, end) = (addr, addr.wrapping_add(u64::from(size)));
        let i = self.at[p as usize] + self.nth;
        self.nth += 1;
        match self.refs.get_mut(i) {
            // A later iteration of a `rep`: the reference spans both.
            Some(r) => *r = (r.0.min(start), r.1.max(end), access),
            None => self.refs.push((start, end, access)),
        }
        Ok(())
    }

    /// Position `p`'s references (start, end, access): none past the
    /// positions given.
    pub fn of(&self, p: u64) -> &[(u64, u64, Access)] {
        let Some(&from) = self.at.get(p as usize) else {
            return &[];
        };
        let to = self.at.get(p as usize + 1).copied();
        &self.refs[from..to.unwrap_or(self.refs.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_runs_and_a_rep_is_one_reference() {
        let mut r = Rebuilt::default();
        r.run(2, 4);
        r.insn(2).unwrap();
        r.data(Access::Store, 0x100, 8).unwrap();
        r.insn(3).unwrap();
        // A `rep movsb` of 3 bytes: three iterations and the final test.
        r.run(0, 1);
        for i in 0..3 {
            r.insn(0).unwrap();
            r.data(Access::Load, 0x200 + i, 1).unwrap();
            r.data(Access::Store, 0x300 + i, 1).unwrap();
        }
        r.insn(0).unwrap();
        assert_eq!(r.of(0), [(0x100, 0x108, Access::Store)]);
        assert_eq!(r.of(1), []);
        let rep = [(0x200, 0x203, Access::Load), (0x300, 0x303, Access::Store)];
        assert_eq!(r.of(2), rep);
        assert_eq!(r.of(3), []);
        assert!(r.insn(5).is_err(), "past the run");
    }
}
