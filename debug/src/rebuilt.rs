//! A thread's data references as the abstract data walk rebuilt them, for
//! a trace recorded with `--data` but not `--check` (issue 22: the frames'
//! addresses, watchpoints; `docs/debug.md`, "Frames' addresses"). Such a
//! trace has no full addresses to read per instruction (`crate::data`):
//! the data walk of `aetrace regen --format lackey` (`src/cmd/dataout.rs`,
//! in the binary) rebuilds them piece by piece, on demand ([`Lazy`]): a
//! [`Source`] walks the piece of the thread's stream that holds a position
//! asked for, from the data walk's state the trace's state index keeps at
//! the piece's start, and fills a [`Rebuilt`] through its sink's calls,
//! position by position. A session reads the pieces its stops and searches
//! reach, not the whole run.
//!
//! Invariants: positions are counted by the walk's block runs, as the
//! regenerator's walk counts them (`crate::data`'s marks, the
//! timeline), from the piece's first position on, so position `n`'s
//! references are the `n`th instruction's; a position is given once, in
//! order (a later call for an earlier one is an error); a `rep` string
//! instruction is one position whose reference spans every iteration's
//! bytes, as `crate::data` gives it; a piece holds the positions
//! `first..end` and nothing else.

use aetrace_analysis::addr::Access;

/// A piece's references (see the module comment).
#[derive(Clone, Debug, Default)]
pub struct Rebuilt {
    /// Its first position.
    first: u64,
    /// Position `first + p`'s references are `refs[at[p]..at[p + 1]]` (the
    /// last position's run to the end of `refs`).
    at: Vec<usize>,
    refs: Vec<(u64, u64, Access)>,
    /// The positions counted by the runs so far (absolute).
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
    /// A piece whose first position is `first`.
    pub fn starting_at(first: u64) -> Rebuilt {
        Rebuilt {
            first,
            next: first,
            ..Rebuilt::default()
        }
    }

    /// The positions it holds.
    pub fn positions(&self) -> std::ops::Range<u64> {
        self.first..self.next
    }

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
        while (self.at.len() as u64) <= p - self.first {
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
        let i = self.at[(p - self.first) as usize] + self.nth;
        self.nth += 1;
        match self.refs.get_mut(i) {
            // A later iteration of a `rep`: the reference spans both.
            Some(r) => *r = (r.0.min(start), r.1.max(end), access),
            None => self.refs.push((start, end, access)),
        }
        Ok(())
    }

    /// Position `p`'s references (start, end, access): none outside the
    /// positions given.
    pub fn of(&self, p: u64) -> &[(u64, u64, Access)] {
        let Some(k) = p.checked_sub(self.first) else {
            return &[];
        };
        let Some(&from) = self.at.get(k as usize) else {
            return &[];
        };
        let to = self.at.get(k as usize + 1).copied();
        &self.refs[from..to.unwrap_or(self.refs.len())]
    }
}

/// Rebuilds a thread's references piece by piece (the binary's data walk
/// from the state index's data states).
pub trait Source {
    /// The piece that holds position `p` (`None` past the thread's last).
    fn piece(&mut self, p: u64) -> Result<Option<Rebuilt>, String>;
}

/// Pieces kept at most: the stops' openers and a search's window
/// (a piece of gzip's 2 MB `--data` trace is about 330,000 positions and
/// 5 MB rebuilt; the whole run's, at once, cost 17.6 s CPU per session).
const KEPT: usize = 32;

/// A thread's references, rebuilt as they are asked for.
pub struct Lazy<'a> {
    source: Box<dyn Source + 'a>,
    /// The pieces rebuilt, the one used last at the end.
    kept: Vec<Rebuilt>,
}

impl<'a> Lazy<'a> {
    /// References rebuilt by `source`.
    pub fn new(source: Box<dyn Source + 'a>) -> Self {
        Lazy {
            source,
            kept: Vec::new(),
        }
    }

    /// Position `p`'s references (start, end, access): none past the
    /// thread's end.
    pub fn of(&mut self, p: u64) -> Result<&[(u64, u64, Access)], String> {
        let held = |r: &Rebuilt| r.positions().contains(&p);
        if !self.kept.last().is_some_and(held) {
            match self.kept.iter().position(held) {
                Some(i) => {
                    let r = self.kept.remove(i);
                    self.kept.push(r);
                }
                None => {
                    let Some(r) = self.source.piece(p)? else {
                        return Ok(&[]);
                    };
                    if !held(&r) {
                        return Err(format!(
                            "the data walk's piece for position {p} holds {:?}",
                            r.positions()
                        ));
                    }
                    if self.kept.len() == KEPT {
                        self.kept.remove(0);
                    }
                    self.kept.push(r);
                }
            }
        }
        Ok(self.kept.last().map_or(&[][..], |r| r.of(p)))
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

    /// Pieces of 10 positions, position `p` with one store at `p`; the
    /// pieces walked counted.
    struct Tens(std::rc::Rc<std::cell::RefCell<Vec<u64>>>);

    impl Source for Tens {
        fn piece(&mut self, p: u64) -> Result<Option<Rebuilt>, String> {
            if p >= 100 {
                return Ok(None);
            }
            let first = p / 10 * 10;
            self.0.borrow_mut().push(first);
            let mut r = Rebuilt::starting_at(first);
            r.run(0, 10);
            for k in 0..10 {
                r.insn(k)?;
                r.data(Access::Store, first + u64::from(k), 1)?;
            }
            Ok(Some(r))
        }
    }

    #[test]
    fn pieces_are_rebuilt_once_while_kept() {
        let walked = std::rc::Rc::default();
        let mut lazy = Lazy::new(Box::new(Tens(std::rc::Rc::clone(&walked))));
        // Forwards, backwards, and back to the first piece.
        let order: Vec<u64> = (0..100).chain((0..100).rev()).chain([5]).collect();
        for p in order {
            assert_eq!(lazy.of(p).unwrap(), [(p, p + 1, Access::Store)]);
        }
        assert_eq!(lazy.of(100).unwrap(), []);
        // Ten pieces fit: none walked twice.
        assert_eq!(
            *walked.borrow(),
            (0..10).map(|k| k * 10).collect::<Vec<_>>()
        );
    }
}
