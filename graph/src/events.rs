//! Event counting with on-line queries (paper 002, Ball 1994).
//!
//! Every edge carries a constant number of events (`events[e]`, vertex
//! events are moved onto the vertex's outgoing edges by
//! [`vertex_events_on_out_edges`]). Only the chords of a spanning tree
//! (seeded with `EXIT -> root`, which carries no events) are instrumented:
//! chord `c` adds `Inc(c)` to one counter, where `Inc(c)` is the signed sum
//! of the events around `c`'s fundamental cycle (edges along `c`'s direction
//! count positive, against it negative). By Knuth's theorem the counter
//! equals the event count after any complete execution.
//!
//! Linear time: one DFS over the tree computes the potential
//! `phi(v)` = signed sum of events on the tree path from the root to `v`;
//! then `Inc(c) = events(c) + phi(src c) - phi(tgt c)`, which is the
//! fundamental-cycle sum (the cycle is `c` followed by the tree path from
//! `tgt c` back to `src c`).
//!
//! Query increments: for an incomplete execution from the root that has
//! just reached `v`, `counter + phi(v)` is exact (the sum over the path of
//! `Inc(e) + phi(src) - phi(tgt)` telescopes), so `phi(v)` is `v`'s query
//! increment. `phi(root) = phi(EXIT) = 0`.
//!
//! Across calls (one counter for the whole program): at a call vertex `c`
//! the caller adds `phi(c)` before the call and subtracts it after the
//! return. The invariant `counter + phi(current vertex of the innermost
//! frame) = events so far` then holds everywhere, so a query anywhere needs
//! only the innermost frame's increment.

use crate::entity::{EntityRef, SecondaryMap};
use crate::graph::{BlockId, EdgeId, Graph};
use crate::spanning::{endpoints, max_spanning_forest, SpanningForest};
use crate::weights::Weights;

/// Chord increments and query increments for one procedure.
#[derive(Clone, Debug)]
pub struct EventCounting {
    /// The spanning forest whose chords carry the increments.
    pub tree: SpanningForest,
    /// `Inc(e)` for every edge (0 on tree edges).
    pub inc: SecondaryMap<EdgeId, i64>,
    /// Query increment `phi(v)` of every vertex.
    pub query: SecondaryMap<BlockId, i64>,
}

/// Moves vertex events onto the vertex's outgoing edges (each execution of
/// a vertex other than EXIT leaves it by exactly one edge).
pub fn vertex_events_on_out_edges(
    g: &Graph,
    vertex: &SecondaryMap<BlockId, i64>,
) -> SecondaryMap<EdgeId, i64> {
    let mut ev = SecondaryMap::filled(g.num_edges() + 1, 0);
    for e in g.edge_ids() {
        ev[e] = vertex[g.edge(e).from];
    }
    ev
}

/// Places event counters on the chords of a maximum spanning tree of `w`.
pub fn place_event_counters(
    g: &Graph,
    w: &Weights,
    events: &SecondaryMap<EdgeId, i64>,
) -> EventCounting {
    debug_assert_eq!(events[g.exit_root()], 0, "EXIT -> root carries no events");
    let tree = max_spanning_forest(g, w, true, &|_| false);
    let edges: Vec<(usize, usize, i64)> = tree
        .tree_edges()
        .map(|e| {
            let (a, b) = endpoints(g, e);
            (a.index(), b.index(), events[e])
        })
        .collect();
    let phi = potentials(g.num_vertices(), g.entry().index(), &edges);
    let mut query = SecondaryMap::filled(g.num_vertices(), 0i64);
    for v in g.vertices() {
        query[v] = phi[v.index()];
    }
    let mut inc = SecondaryMap::filled(g.num_edges() + 1, 0i64);
    for e in g.edge_ids().filter(|&e| !tree.contains(e)) {
        let ed = g.edge(e);
        inc[e] = events[e] + query[ed.from] - query[ed.to];
    }
    EventCounting { tree, inc, query }
}

/// The potential `phi` over a forest on vertices `0..n` given as
/// `(from, to, events)` edges: `phi(to) = phi(from) + events` along every
/// edge, 0 at `root` (and at an arbitrary vertex of each other tree). One
/// DFS, linear time.
pub(crate) fn potentials(n: usize, root: usize, forest: &[(usize, usize, i64)]) -> Vec<i64> {
    let mut adj: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, &(a, b, _)) in forest.iter().enumerate() {
        adj[a].push(i);
        adj[b].push(i);
    }
    let mut phi = vec![0i64; n];
    let mut seen = vec![false; n];
    for s in std::iter::once(root).chain(0..n) {
        if seen[s] {
            continue;
        }
        seen[s] = true;
        let mut stack = vec![s];
        while let Some(v) = stack.pop() {
            for &i in &adj[v] {
                let (a, b, ev) = forest[i];
                let (next, p) = if a == v {
                    (b, phi[v] + ev)
                } else {
                    (a, phi[v] - ev)
                };
                if !seen[next] {
                    seen[next] = true;
                    phi[next] = p;
                    stack.push(next);
                }
            }
        }
    }
    phi
}

#[cfg(test)]
pub(crate) mod reference {
    //! Naive reference: walk each chord's fundamental cycle explicitly.
    use super::*;

    pub fn chord_increment(
        g: &Graph,
        ec: &EventCounting,
        events: &SecondaryMap<EdgeId, i64>,
        c: EdgeId,
    ) -> i64 {
        // Tree path from tgt(c) to src(c): BFS over the tree recording parents.
        let n = g.num_vertices();
        let ed = g.edge(c);
        let mut parent: Vec<Option<EdgeId>> = vec![None; n];
        let mut seen = vec![false; n];
        seen[ed.to.index()] = true;
        let mut q = std::collections::VecDeque::from([ed.to]);
        while let Some(v) = q.pop_front() {
            for e in ec.tree.tree_edges() {
                let (a, b) = endpoints(g, e);
                let other = if a == v {
                    b
                } else if b == v {
                    a
                } else {
                    continue;
                };
                if !seen[other.index()] {
                    seen[other.index()] = true;
                    parent[other.index()] = Some(e);
                    q.push_back(other);
                }
            }
        }
        let mut sum = events[c];
        let mut v = ed.from;
        while v != ed.to {
            let e = parent[v.index()].expect("tree path");
            let (a, b) = endpoints(g, e);
            // Walking the cycle forward means going from `other` to `v` on e.
            if b == v {
                sum += events[e];
                v = a;
            } else {
                sum -= events[e];
                v = b;
            }
        }
        sum
    }
}
