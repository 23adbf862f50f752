//! Witness placement for tracing (paper 003, Section 4).
//!
//! - [`blockers`]`(G, v)`: the edges `p -> x0` with `p` a predicate and
//!   `x0 ... v` a chain of non-predicates (Section 4.2).
//! - [`place_witnesses`]: blocking witnesses on `blockers(G, v)` for every
//!   call vertex and EXIT, then a maximum spanning tree that may not use
//!   them; every edge outside the tree is a witness (footnote 3: when the
//!   blocking edges disconnect the graph, a maximum-weight maximal forest).
//!   The `EXIT -> root` edge takes no part (Section 4.1).
//! - [`WitnessPlacement`]: the witness edges numbered `0..len` per procedure
//!   in edge order (the real encoder maps numbers to bytes).
//! - [`WitnessSets`]: `witness(G, epl, p, q)` for every predicate `p` and
//!   successor `q`, as sorted symbol lists (the fast regenerator's
//!   per-(block, witness) summaries derive from them).
//! - Checkers: [`check_trace`] (`Trace(G, epl)` by witness-set
//!   disjointness), [`check_no_diamond_or_cycle`] (Theorem 4.2's graph
//!   condition, naive), [`check_blocking`] (the blocking property).
//! - Baselines: [`all_predicate_edges`] (old AE: one record per branch
//!   outcome) and [`naive_blocking`] (every edge into a call or EXIT vertex,
//!   then the tree; [`naive_blocking_needed`] leaves out the witnesses no
//!   path from a predicate needs).
//!
//! Invariants of `place_witnesses`' result: `E - epl` is a forest (so it has
//! no diamond or directed cycle and `Trace(G, epl)` holds, Theorem 4.2), and
//! every predicate's witness-free paths end before any call vertex or EXIT
//! (the blocking property). A call vertex that is also a predicate needs no
//! special case: its successor is decided after the callee returned, by a
//! witness of this procedure.

use std::collections::HashMap;

use crate::entity::{EntityRef, SecondaryMap};
use crate::error::{Error, Result};
use crate::graph::{BlockId, EdgeId, Graph, VertexKind};
use crate::spanning::max_spanning_forest;

const NONE: u32 = u32::MAX;

/// A set of witness edges, numbered per procedure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WitnessPlacement {
    number: Vec<u32>,
    edges: Vec<EdgeId>,
    blocking: usize,
    spanning: bool,
}

impl WitnessPlacement {
    /// Numbers the edges with `in_epl[e]` in edge order.
    pub fn from_edges(g: &Graph, in_epl: &[bool], blocking: usize, spanning: bool) -> Self {
        debug_assert_eq!(in_epl.len(), g.num_edges());
        let mut number = vec![NONE; g.num_edges()];
        let mut edges = Vec::new();
        for e in g.edge_ids() {
            if in_epl[e.index()] {
                number[e.index()] = edges.len() as u32;
                edges.push(e);
            }
        }
        WitnessPlacement {
            number,
            edges,
            blocking,
            spanning,
        }
    }
    /// The witness number edge `e` writes, if it is a witness edge.
    pub fn witness(&self, e: EdgeId) -> Option<u32> {
        match self.number.get(e.index()) {
            Some(&n) if n != NONE => Some(n),
            _ => None,
        }
    }
    /// Whether `e` is a witness edge.
    pub fn contains(&self, e: EdgeId) -> bool {
        self.witness(e).is_some()
    }
    /// The witness edges; index = witness number.
    pub fn edges(&self) -> &[EdgeId] {
        &self.edges
    }
    /// The number of witness edges (witnesses are numbered `0..len`).
    pub fn len(&self) -> usize {
        self.edges.len()
    }
    /// Whether the placement has no witness edge.
    pub fn is_empty(&self) -> bool {
        self.edges.is_empty()
    }
    /// How many witnesses were placed as blocking witnesses.
    pub fn blocking(&self) -> usize {
        self.blocking
    }
    /// Whether the completing forest was a spanning tree (footnote 3).
    pub fn spanning(&self) -> bool {
        self.spanning
    }
    /// Cost under a weighting.
    pub fn cost(&self, w: &SecondaryMap<EdgeId, f64>) -> f64 {
        crate::spanning::cost(w, self.edges.iter().copied())
    }
}

fn is_target(g: &Graph, v: BlockId) -> bool {
    matches!(g.kind(v), VertexKind::Call | VertexKind::Exit)
}

/// `blockers(G, v)` of Section 4.2, in edge order.
pub fn blockers(g: &Graph, v: BlockId) -> Vec<EdgeId> {
    let mut out = Vec::new();
    let mut seen = vec![false; g.num_vertices()];
    let mut work = vec![v];
    seen[v.index()] = true;
    while let Some(x) = work.pop() {
        for &e in g.preds(x) {
            let p = g.edge(e).from;
            if g.is_predicate(p) {
                out.push(e);
            } else if !seen[p.index()] {
                seen[p.index()] = true;
                work.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The union of `blockers(G, v)` over every call vertex and EXIT, in one
/// linear pass: `p -> x` is blocking iff `p` is a predicate and the chain of
/// non-predicates from `x` reaches a call vertex or EXIT.
pub fn blocking_edges(g: &Graph) -> Vec<bool> {
    // 0 unknown, 1 on the current chain, 2 sees a target, 3 does not.
    let mut state = vec![0u8; g.num_vertices()];
    let mut chain = Vec::new();
    for start in g.vertices() {
        let mut x = start;
        let verdict = loop {
            match state[x.index()] {
                2 => break 2,
                3 | 1 => break 3,
                _ => {}
            }
            if is_target(g, x) {
                break 2;
            }
            if g.is_predicate(x) || g.succs(x).is_empty() {
                break 3;
            }
            state[x.index()] = 1;
            chain.push(x);
            x = g.edge(g.succs(x)[0]).to;
        };
        if state[x.index()] == 0 {
            state[x.index()] = verdict;
        }
        for v in chain.drain(..) {
            state[v.index()] = verdict;
        }
    }
    g.edge_ids()
        .map(|e| {
            let ed = g.edge(e);
            g.is_predicate(ed.from) && state[ed.to.index()] == 2
        })
        .collect()
}

/// Completes a set of forced witness edges with the chords of a maximum
/// spanning forest that avoids them.
fn complete(g: &Graph, w: &SecondaryMap<EdgeId, f64>, mut forced: Vec<bool>) -> WitnessPlacement {
    let blocking = forced.iter().filter(|&&b| b).count();
    let excl = forced.clone();
    let forest = max_spanning_forest(g, w, false, &|e| excl[e.index()]);
    for e in forest.chords(g) {
        forced[e.index()] = true;
    }
    WitnessPlacement::from_edges(g, &forced, blocking, forest.is_spanning())
}

/// The placement of Section 4.2: blocking witnesses, then the constrained
/// maximum spanning tree.
pub fn place_witnesses(g: &Graph, w: &SecondaryMap<EdgeId, f64>) -> WitnessPlacement {
    let pl = complete(g, w, blocking_edges(g));
    debug_assert_eq!(check_blocking(g, &pl), Ok(()));
    pl
}

/// Baseline (old AE): a witness on every edge out of a predicate.
pub fn all_predicate_edges(g: &Graph) -> WitnessPlacement {
    let epl: Vec<bool> = g
        .edge_ids()
        .map(|e| g.is_predicate(g.edge(e).from))
        .collect();
    WitnessPlacement::from_edges(g, &epl, 0, true)
}

/// Baseline (Section 4.2, Figure 8): a blocking witness on every edge into
/// a call vertex or EXIT, then the constrained tree.
pub fn naive_blocking(g: &Graph, w: &SecondaryMap<EdgeId, f64>) -> WitnessPlacement {
    let forced = g.edge_ids().map(|e| is_target(g, g.edge(e).to)).collect();
    let pl = complete(g, w, forced);
    debug_assert_eq!(check_blocking(g, &pl), Ok(()));
    pl
}

/// [`naive_blocking`] restricted to the blocking witnesses a path from a
/// predicate can need: none on an edge out of a call vertex that is not a
/// predicate (every path into that vertex passes a blocking witness
/// already: the witness Figure 8 calls "not needed"; a rewriter would have
/// to write it after the callee's records), and none in the part of the
/// graph no predicate reaches (a procedure without predicates needs no
/// witness at all). What the rewriter's `--placement naive-blocking` uses.
pub fn naive_blocking_needed(g: &Graph, w: &SecondaryMap<EdgeId, f64>) -> WitnessPlacement {
    let mut reached = vec![false; g.num_vertices()];
    let mut work: Vec<BlockId> = g.vertices().filter(|&v| g.is_predicate(v)).collect();
    for v in &work {
        reached[v.index()] = true;
    }
    while let Some(v) = work.pop() {
        for &e in g.succs(v) {
            let t = g.edge(e).to;
            if !reached[t.index()] {
                reached[t.index()] = true;
                work.push(t);
            }
        }
    }
    let forced = g
        .edge_ids()
        .map(|e| {
            let ed = g.edge(e);
            let after_call = g.kind(ed.from) == VertexKind::Call && !g.is_predicate(ed.from);
            is_target(g, ed.to) && reached[ed.from.index()] && !after_call
        })
        .collect();
    let pl = complete(g, w, forced);
    debug_assert_eq!(check_blocking(g, &pl), Ok(()));
    pl
}

/// A symbol of a witness set: a witness number, or EOF (a witness-free path
/// reaches EXIT).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Sym {
    /// Witness number `n`.
    W(u32),
    /// EOF: a witness-free path reaches EXIT.
    Eof,
}

/// `witness(G, epl, p, q)` for every edge `p -> q` out of a predicate.
#[derive(Clone, Debug)]
pub struct WitnessSets {
    /// Indexed by edge id; empty for edges out of non-predicates.
    sets: Vec<Vec<Sym>>,
}

impl WitnessSets {
    /// The sorted witness set of the predicate edge `e`.
    pub fn set(&self, e: EdgeId) -> &[Sym] {
        &self.sets[e.index()]
    }
    /// The successor edge of predicate `p` whose set holds `s`.
    pub fn choose(&self, g: &Graph, p: BlockId, s: Sym) -> Option<EdgeId> {
        g.succs(p)
            .iter()
            .copied()
            .find(|&e| self.sets[e.index()].binary_search(&s).is_ok())
    }
}

/// Computes the witness sets. When `E - epl` has no directed cycle (every
/// placement that solves `Trace(G, epl)`) one memoised DFS does it;
/// otherwise each vertex's set is found by its own search.
pub fn witness_sets(g: &Graph, pl: &WitnessPlacement) -> WitnessSets {
    let first = first_syms_acyclic(g, pl).unwrap_or_else(|| first_syms_naive(g, pl));
    let sets = g
        .edge_ids()
        .map(|e| {
            if !g.is_predicate(g.edge(e).from) {
                Vec::new()
            } else if let Some(w) = pl.witness(e) {
                vec![Sym::W(w)]
            } else {
                first[g.edge(e).to.index()].clone()
            }
        })
        .collect();
    WitnessSets { sets }
}

/// The first symbols of the witness-free paths from each vertex, by one
/// memoised DFS; `None` if `E - epl` has a directed cycle.
fn first_syms_acyclic(g: &Graph, pl: &WitnessPlacement) -> Option<Vec<Vec<Sym>>> {
    let n = g.num_vertices();
    let mut first: Vec<Option<Vec<Sym>>> = vec![None; n];
    let mut on_path = vec![false; n];
    for root in g.vertices() {
        if first[root.index()].is_some() {
            continue;
        }
        let mut stack = vec![(root, 0usize)];
        on_path[root.index()] = true;
        while let Some(&mut (v, ref mut i)) = stack.last_mut() {
            let succs = g.succs(v);
            if let Some(&e) = succs.get(*i) {
                *i += 1;
                let t = g.edge(e).to;
                if pl.contains(e) || first[t.index()].is_some() {
                    continue;
                }
                if on_path[t.index()] {
                    return None;
                }
                on_path[t.index()] = true;
                stack.push((t, 0));
            } else {
                let mut set: Vec<Sym> = if v == g.exit() {
                    vec![Sym::Eof]
                } else {
                    Vec::new()
                };
                for &e in succs {
                    match pl.witness(e) {
                        Some(w) => set.push(Sym::W(w)),
                        None => set.extend_from_slice(
                            first[g.edge(e).to.index()].as_deref().unwrap_or(&[]),
                        ),
                    }
                }
                set.sort_unstable();
                set.dedup();
                first[v.index()] = Some(set);
                on_path[v.index()] = false;
                stack.pop();
            }
        }
    }
    Some(first.into_iter().map(|s| s.unwrap_or_default()).collect())
}

/// The same by one search per vertex (any placement; quadratic).
fn first_syms_naive(g: &Graph, pl: &WitnessPlacement) -> Vec<Vec<Sym>> {
    g.vertices()
        .map(|v| {
            let mut seen = vec![false; g.num_vertices()];
            let mut set = Vec::new();
            let mut work = vec![v];
            seen[v.index()] = true;
            while let Some(x) = work.pop() {
                if x == g.exit() {
                    set.push(Sym::Eof);
                }
                for &e in g.succs(x) {
                    match pl.witness(e) {
                        Some(w) => set.push(Sym::W(w)),
                        None => {
                            let t = g.edge(e).to;
                            if !seen[t.index()] {
                                seen[t.index()] = true;
                                work.push(t);
                            }
                        }
                    }
                }
            }
            set.sort_unstable();
            set.dedup();
            set
        })
        .collect()
}

/// `Trace(G, epl)` by definition: for every predicate, the witness sets of
/// distinct successors are disjoint.
pub fn check_trace(g: &Graph, pl: &WitnessPlacement) -> Result<WitnessSets> {
    let ws = witness_sets(g, pl);
    let mut owner: HashMap<Sym, BlockId> = HashMap::new();
    for p in g.vertices().filter(|&p| g.is_predicate(p)) {
        owner.clear();
        for &e in g.succs(p) {
            let q = g.edge(e).to;
            for &s in ws.set(e) {
                if let Some(&a) = owner.get(&s) {
                    return Err(Error::SharedWitness {
                        block: p,
                        a,
                        b: q,
                        witness: format!("{s:?}"),
                    });
                }
                owner.insert(s, q);
            }
        }
    }
    Ok(ws)
}

/// Theorem 4.2's condition, checked naively in O(V E) (for tests and
/// diagnostics): `E - epl` has no directed cycle and no diamond. In a graph without directed cycles, a diamond
/// exists iff two distinct successors of some vertex reach a common vertex.
pub fn check_no_diamond_or_cycle(g: &Graph, in_epl: &dyn Fn(EdgeId) -> bool) -> Result<()> {
    let n = g.num_vertices();
    // Directed cycle: DFS with colours over E - epl.
    let mut colour = vec![0u8; n];
    for root in g.vertices() {
        if colour[root.index()] != 0 {
            continue;
        }
        let mut stack = vec![(root, 0usize)];
        colour[root.index()] = 1;
        while let Some(&mut (v, ref mut i)) = stack.last_mut() {
            if let Some(&e) = g.succs(v).get(*i) {
                *i += 1;
                if in_epl(e) {
                    continue;
                }
                let t = g.edge(e).to;
                match colour[t.index()] {
                    0 => {
                        colour[t.index()] = 1;
                        stack.push((t, 0));
                    }
                    1 => return Err(Error::WitnessFreeCycle { block: t }),
                    _ => {}
                }
            } else {
                colour[v.index()] = 2;
                stack.pop();
            }
        }
    }
    let mut reached_from = vec![NONE; n];
    for p in g.vertices() {
        reached_from.iter_mut().for_each(|r| *r = NONE);
        for &e in g.succs(p) {
            if in_epl(e) {
                continue;
            }
            let a = g.edge(e).to;
            let mut work = vec![a];
            let mut local = vec![false; n];
            local[a.index()] = true;
            while let Some(v) = work.pop() {
                match reached_from[v.index()] {
                    NONE => reached_from[v.index()] = a.as_u32(),
                    other if other != a.as_u32() => return Err(Error::Diamond { from: p, to: v }),
                    _ => {}
                }
                for &f in g.succs(v) {
                    let t = g.edge(f).to;
                    if !in_epl(f) && !local[t.index()] {
                        local[t.index()] = true;
                        work.push(t);
                    }
                }
            }
        }
    }
    Ok(())
}

/// The blocking property: no predicate reaches a call vertex or EXIT by a
/// witness-free path.
pub fn check_blocking(g: &Graph, pl: &WitnessPlacement) -> Result<()> {
    // sees[v]: v reaches a call vertex or EXIT witness-free (v itself counts).
    let n = g.num_vertices();
    let mut sees = vec![NONE; n];
    let mut work: Vec<BlockId> = Vec::new();
    for v in g.vertices().filter(|&v| is_target(g, v)) {
        sees[v.index()] = v.as_u32();
        work.push(v);
    }
    while let Some(v) = work.pop() {
        for &e in g.preds(v) {
            let u = g.edge(e).from;
            if !pl.contains(e) && sees[u.index()] == NONE {
                sees[u.index()] = sees[v.index()];
                work.push(u);
            }
        }
    }
    for p in g.vertices().filter(|&p| g.is_predicate(p)) {
        for &e in g.succs(p) {
            let t = g.edge(e).to;
            if !pl.contains(e) && sees[t.index()] != NONE {
                return Err(Error::NotBlocked {
                    pred: p,
                    target: BlockId::from_u32(sees[t.index()]),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testgen;
    use proptest::prelude::*;

    proptest! {
        /// The memoised witness sets equal the per-vertex searches.
        #[test]
        fn witness_sets_match_naive_search(g in testgen::arb_graph(1..150)) {
            let pl = place_witnesses(&g, &crate::weights::heuristic(&g));
            let fast = first_syms_acyclic(&g, &pl).expect("E - epl is a forest");
            prop_assert_eq!(fast, first_syms_naive(&g, &pl));
        }
    }
}
