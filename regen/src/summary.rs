//! Per-(block, witness) summaries: the regenerator's fast pass (issue 5,
//! item 3; DESIGN.md decision 7).
//!
//! Between two reads of the witness stream, Figure 7's walk is a function
//! of the block where the last witness was read and that witness: the
//! blocks it passes are forced (fall-through, a pending witness choosing at
//! the next predicates). A [`Seg`] records where such a walk stops and how
//! many blocks and instructions it passed, so counting (`--count`, the
//! fork pre-pass, and the pass that cuts one long stream into pieces for
//! parallel expansion) takes one step per witness instead of one per block.
//!
//! A segment starts at a *read point*: a block without a call, whose exit
//! is not a plain fall-through (`Block::next == EXIT`), reached with no
//! pending witness, where the next stream item is a one-byte witness `w`.
//! It ends at the first block `e` that the full machine would treat at its
//! loop head with something other than a forced move: a read point (no
//! witness pending, `e.next == EXIT`), a call block, an edge to EXIT, a
//! witness that does not fit, or [`MAX_BLOCKS`] blocks. `e` itself is not
//! in the segment: the machine handles it as it would without summaries.
//!
//! Invariants: a segment consumes exactly the witness `w` from the stream
//! and nothing else; following it leaves the machine in the state the
//! block-by-block walk reaches at `e` (same block, same pending witness),
//! having passed `blocks` blocks of `insns` instructions (checked against
//! the walk's output by `tests::random_executions_regenerate_exactly`).
//!
//! Output (`Summaries::with_text`) uses the same segments: each keeps the
//! output of its read point's block and of its blocks, concatenated, in an
//! arena, so a witness costs one `memcpy` and one step of the machine's
//! loop instead of one per block.
//! The arena is bounded ([`TEXT_BYTES`]); past it, new segments are walked
//! block by block.

use crate::compile::{Block, BlockIx, Module, AMBIGUOUS, EXIT, NO_BLOCK, NO_WITNESS};
use aetrace_graph::EntityRef;

/// Longest walk one segment summarises (keeps `insns` in a `u32`).
pub const MAX_BLOCKS: u32 = 1 << 12;

/// Most output bytes the segments of one module keep.
pub const TEXT_BYTES: usize = 64 << 20;

/// Entries of the memo of `Summaries::get` (a power of two).
const MEMO: usize = 1 << 12;

#[cfg(test)]
thread_local! {
    /// Tests: output walks block by block (the reference for summaries).
    pub static WALK_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A summarised walk from a read point, for one witness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seg {
    /// The block the walk stops at (not part of the segment), or
    /// [`Seg::NONE`]`.end` when the read point must take the slow path.
    pub end: BlockIx,
    /// The witness still pending at `end`, or [`NO_WITNESS`].
    pub pending: u32,
    /// Blocks the segment walks through.
    pub blocks: u32,
    /// Instructions in those blocks.
    pub insns: u32,
    /// Output bytes, up to `end`, that the block-by-block walk keeps in
    /// its trail (`machine`): those after its last decision, with the
    /// deciding block's when its witness was written before its last
    /// instruction (`Succ::early`); the read point's own block included.
    pub trail: u32,
    /// `text[text_lo..text_hi]` of [`Summaries`]: the output of the read
    /// point's block, then of the segment's blocks.
    pub text_lo: u32,
    /// End (exclusive) of the segment's output in `text`.
    pub text_hi: u32,
}

impl Seg {
    /// Whether this is a summary, not [`Seg::NONE`]. Only `NONE` ends at
    /// EXIT (a walk stops at a block), so `end` alone decides; comparing
    /// the whole struct made the compiler reload it with one wide load
    /// after narrow stores, which stalls in the regenerator's hottest loop.
    #[inline]
    pub fn is_some(&self) -> bool {
        debug_assert!((self.end == Seg::NONE.end) == (*self == Seg::NONE));
        self.end != Seg::NONE.end
    }

    /// No summary: the machine walks this one block by block.
    pub const NONE: Seg = Seg {
        end: EXIT,
        pending: NO_WITNESS,
        blocks: 0,
        insns: 0,
        trail: 0,
        text_lo: 0,
        text_hi: 0,
    };
    /// Not computed yet.
    const UNKNOWN: Seg = Seg {
        end: NO_BLOCK,
        pending: NO_WITNESS,
        blocks: 0,
        insns: 0,
        trail: 0,
        text_lo: 0,
        text_hi: 0,
    };
}

/// The segments of one module, computed on first use: one per witness
/// choice of each predicate (`Module::choices`) and one per block whose only
/// successor carries a witness.
#[derive(Clone, Debug)]
pub struct Summaries {
    choice: Vec<Seg>,
    single: Vec<Seg>,
    /// A direct-mapped memo of `get`, keyed by `block << 32 | witness`
    /// (the binary search over a predicate's choices is a chain of
    /// dependent loads; hot loops ask for few pairs).
    memo: Box<[(u64, Seg)]>,
    /// The segments' output (with `with_text` only).
    text: Option<Vec<u8>>,
}

impl Summaries {
    /// Summaries for counting.
    pub fn new(m: &Module) -> Summaries {
        Summaries {
            choice: vec![Seg::UNKNOWN; m.choices.len()],
            single: vec![Seg::UNKNOWN; m.blocks.len()],
            memo: vec![(u64::MAX, Seg::NONE); MEMO].into_boxed_slice(),
            text: None,
        }
    }

    /// Summaries that also keep each segment's output.
    pub fn with_text(m: &Module) -> Summaries {
        #[allow(unused_mut)]
        let mut s = Summaries {
            text: Some(Vec::new()),
            ..Summaries::new(m)
        };
        #[cfg(test)]
        if WALK_ONLY.with(|w| w.get()) {
            s.choice.fill(Seg::NONE);
            s.single.fill(Seg::NONE);
        }
        s
    }

    /// The output of segment `seg`.
    #[inline]
    pub fn text(&self, seg: Seg) -> &[u8] {
        match &self.text {
            Some(t) => &t[seg.text_lo as usize..seg.text_hi as usize],
            None => &[],
        }
    }

    /// The segment from read point `l` for witness `w`.
    #[inline]
    pub fn get(&mut self, m: &Module, l: BlockIx, w: u32) -> Seg {
        let key = u64::from(l.as_u32()) << 32 | u64::from(w);
        let h = (l.as_u32().wrapping_mul(0x9E37_79B9) ^ w) as usize & (MEMO - 1);
        if self.memo[h].0 == key {
            return self.memo[h].1;
        }
        let seg = self.lookup(m, l, w);
        self.memo[h] = (key, seg);
        seg
    }

    #[inline(never)]
    fn lookup(&mut self, m: &Module, l: BlockIx, w: u32) -> Seg {
        let b = &m.blocks[l];
        let slot = if b.choice_hi > b.choice_lo {
            let cs = &m.choices[b.choice_lo as usize..b.choice_hi as usize];
            match cs.binary_search_by_key(&w, |&(cw, _)| cw) {
                Ok(i) => &mut self.choice[b.choice_lo as usize + i],
                Err(_) => return Seg::NONE,
            }
        } else {
            // One slot per block: only its successor's own witness fits.
            if b.succ_hi - b.succ_lo != 1 || m.succs[b.succ_lo as usize].witness != w {
                return Seg::NONE;
            }
            &mut self.single[l.index()]
        };
        if *slot == Seg::UNKNOWN {
            *slot = walk(m, l, w, self.text.as_mut());
        }
        *slot
    }
}

/// The successor `b` leaves by with `pending`, and the witness pending
/// after it; `None` where the full machine must decide (a call, EXIT, no
/// successor, a witness needed or not fitting).
#[inline]
fn forced(m: &Module, b: &Block, pending: u32) -> Option<(u32, u32)> {
    if b.call.is_some() {
        return None;
    }
    let si = match b.succ_hi - b.succ_lo {
        0 => return None,
        1 => {
            let s = m.succs[b.succ_lo as usize];
            if s.witness == NO_WITNESS {
                (b.succ_lo, pending)
            } else if s.witness == pending {
                (b.succ_lo, NO_WITNESS)
            } else {
                return None;
            }
        }
        _ => {
            if pending == NO_WITNESS {
                return None;
            }
            match m.choose(b, pending) {
                Some(si) if si != AMBIGUOUS => {
                    let p = if m.succs[si as usize].witness == NO_WITNESS {
                        pending
                    } else {
                        NO_WITNESS
                    };
                    (si, p)
                }
                _ => return None,
            }
        }
    };
    (m.succs[si.0 as usize].to != EXIT).then_some(si)
}

/// Walks from read point `l` having read `w` (see the module comment),
/// appending the segment's output to `text` when given.
fn walk(m: &Module, l: BlockIx, w: u32, mut text: Option<&mut Vec<u8>>) -> Seg {
    let Some((si, mut pending)) = forced(m, &m.blocks[l], w) else {
        return Seg::NONE;
    };
    // Every step that takes a witness (pending or read) ends the trail.
    let decided = |b: &Block, si: u32| -> Option<u32> {
        let s = m.succs[si as usize];
        (b.succ_hi - b.succ_lo > 1 || s.witness != NO_WITNESS).then(|| {
            if s.early {
                m.text(b).len() as u32
            } else {
                0
            }
        })
    };
    let Some(mut trail) = decided(&m.blocks[l], si) else {
        return Seg::NONE;
    };
    let mut to = m.succs[si as usize].to;
    let (mut blocks, mut insns) = (0u32, 0u32);
    let text_lo = text.as_ref().map_or(0, |t| t.len());
    if let Some(t) = text.as_deref_mut() {
        if t.len() + m.text(&m.blocks[l]).len() > TEXT_BYTES {
            return Seg::NONE;
        }
        t.extend_from_slice(m.text(&m.blocks[l]));
    }
    loop {
        let b = &m.blocks[to];
        let text_hi = text.as_ref().map_or(0, |t| t.len());
        let stop = Seg {
            end: to,
            pending,
            blocks,
            insns,
            trail,
            text_lo: text_lo as u32,
            text_hi: text_hi as u32,
        };
        if (b.next == EXIT && pending == NO_WITNESS) || blocks >= MAX_BLOCKS {
            return stop;
        }
        let Some((si, p)) = forced(m, b, pending) else {
            return stop;
        };
        let Some(n) = insns.checked_add(b.ninsns).filter(|&n| n < u32::MAX / 2) else {
            return stop;
        };
        if let Some(t) = text.as_deref_mut() {
            let bt = m.text(b);
            if t.len() + bt.len() > TEXT_BYTES {
                // The arena is full: this walk is not kept.
                t.truncate(text_lo);
                return Seg::NONE;
            }
            t.extend_from_slice(bt);
        }
        trail = decided(b, si).unwrap_or(trail + m.text(b).len() as u32);
        insns = n;
        blocks += 1;
        pending = p;
        to = m.succs[si as usize].to;
    }
}
