//! Maximum spanning trees and forests of a CFG (paper 003, Sections 3.1 and
//! 4.2, footnote 3).
//!
//! Kruskal's algorithm with union-find: edges sorted by decreasing weight,
//! ties broken by increasing edge id so the result is deterministic. Edge
//! directions are ignored. Optionally the virtual `EXIT -> root` edge
//! ([`Graph::exit_root`]) takes part and is *seeded* first (profiling,
//! Section 3.1: this guarantees every root-to-EXIT path crosses a chord).
//! Edges in `excluded` never enter the forest (tracing, Section 4.2); when no
//! spanning tree avoids them the result is a maximum-weight maximal forest.
//!
//! Invariants: the chosen edges form a forest (no undirected cycle, so self
//! loops are never chosen); every excluded edge is outside it; among the
//! forests with those properties it has maximum weight (for the seeded
//! version: among those containing `EXIT -> root`).

use crate::entity::{EntityRef, SecondaryMap};
use crate::graph::{BlockId, EdgeId, Graph};

/// A forest over the edges of one graph, possibly including `EXIT -> root`.
#[derive(Clone, Debug)]
pub struct SpanningForest {
    /// `in_tree[e]` for every real edge and for `exit_root`.
    in_tree: Vec<bool>,
    components: usize,
}

impl SpanningForest {
    /// Is `e` (a real edge or `exit_root`) a tree edge?
    pub fn contains(&self, e: EdgeId) -> bool {
        self.in_tree.get(e.index()).copied().unwrap_or(false)
    }
    /// Number of connected components of (V, forest edges); 1 means a spanning tree.
    pub fn components(&self) -> usize {
        self.components
    }
    /// Whether the forest is a single tree spanning every vertex.
    pub fn is_spanning(&self) -> bool {
        self.components == 1
    }
    /// The real edges outside the forest (the chords), in edge order.
    pub fn chords(&self, g: &Graph) -> Vec<EdgeId> {
        g.edge_ids().filter(|&e| !self.in_tree[e.index()]).collect()
    }
    /// The tree edges (real ones, plus `exit_root` if chosen), in edge order.
    pub fn tree_edges(&self) -> impl Iterator<Item = EdgeId> + '_ {
        self.in_tree
            .iter()
            .enumerate()
            .filter(|(_, &t)| t)
            .map(|(i, _)| EdgeId::new(i))
    }
}

/// Disjoint sets with path halving and union by size.
pub(crate) struct UnionFind {
    parent: Vec<u32>,
    size: Vec<u32>,
}

impl UnionFind {
    pub(crate) fn new(n: usize) -> Self {
        UnionFind {
            parent: (0..n as u32).collect(),
            size: vec![1; n],
        }
    }
    pub(crate) fn find(&mut self, mut x: usize) -> usize {
        while self.parent[x] as usize != x {
            let gp = self.parent[self.parent[x] as usize];
            self.parent[x] = gp;
            x = gp as usize;
        }
        x
    }
    /// Joins the sets of `a` and `b`; false if they were already one set.
    pub(crate) fn union(&mut self, a: usize, b: usize) -> bool {
        let (mut a, mut b) = (self.find(a), self.find(b));
        if a == b {
            return false;
        }
        if self.size[a] < self.size[b] {
            std::mem::swap(&mut a, &mut b);
        }
        self.parent[b] = a as u32;
        self.size[a] += self.size[b];
        true
    }
}

/// The endpoints of a real edge or of the virtual `EXIT -> root`.
pub fn endpoints(g: &Graph, e: EdgeId) -> (BlockId, BlockId) {
    if e == g.exit_root() {
        (g.exit(), g.entry())
    } else {
        let ed = g.edge(e);
        (ed.from, ed.to)
    }
}

/// Kruskal over an abstract edge list: `ends(i)` gives edge `i`'s
/// endpoints (vertices `0..n`), `weight(i)` its weight. Edge `seed`, if
/// given, is taken first; `excluded` edges never. Returns the membership of
/// each edge and the number of components.
pub fn kruskal(
    n: usize,
    m: usize,
    ends: &dyn Fn(usize) -> (usize, usize),
    weight: &dyn Fn(usize) -> f64,
    seed: Option<usize>,
    excluded: &dyn Fn(usize) -> bool,
) -> (Vec<bool>, usize) {
    let mut in_tree = vec![false; m];
    let mut uf = UnionFind::new(n);
    let mut components = n;
    if let Some(s) = seed {
        let (a, b) = ends(s);
        if uf.union(a, b) {
            in_tree[s] = true;
            components -= 1;
        }
    }
    let mut order: Vec<usize> = (0..m)
        .filter(|&i| Some(i) != seed && !excluded(i) && ends(i).0 != ends(i).1)
        .collect();
    order.sort_unstable_by(|&a, &b| weight(b).total_cmp(&weight(a)).then(a.cmp(&b)));
    for i in order {
        if components == 1 {
            break;
        }
        let (a, b) = ends(i);
        if uf.union(a, b) {
            in_tree[i] = true;
            components -= 1;
        }
    }
    (in_tree, components)
}

/// Maximum spanning forest of `g` under `weights` (indexed by edge id,
/// `exit_root` included). With `seed_exit_root`, `EXIT -> root` is taken
/// first; without it, it takes no part. `excluded(e)` edges are never taken.
pub fn max_spanning_forest(
    g: &Graph,
    weights: &SecondaryMap<EdgeId, f64>,
    seed_exit_root: bool,
    excluded: &dyn Fn(EdgeId) -> bool,
) -> SpanningForest {
    let m = g.num_edges();
    let (in_tree, components) = kruskal(
        g.num_vertices(),
        m + 1,
        &|i| {
            let (a, b) = endpoints(g, EdgeId::new(i));
            (a.index(), b.index())
        },
        &|i| weights[EdgeId::new(i)],
        seed_exit_root.then_some(m),
        &|i| i == m && !seed_exit_root || i < m && excluded(EdgeId::new(i)),
    );
    let f = SpanningForest {
        in_tree,
        components,
    };
    debug_assert!(g.edge_ids().all(|e| !(excluded(e) && f.contains(e))));
    f
}

/// Sum of `weights` over `edges`.
pub fn cost(weights: &SecondaryMap<EdgeId, f64>, edges: impl IntoIterator<Item = EdgeId>) -> f64 {
    edges.into_iter().map(|e| weights[e]).sum()
}

#[cfg(test)]
pub(crate) mod reference {
    //! Naive reference: the maximum-weight forest by exhaustive search over
    //! edge subsets (tiny graphs only).
    use super::*;

    /// The largest forest weight over all subsets of allowed edges whose
    /// size equals `rank` (a maximal forest), seeded edge forced in.
    pub fn best_forest_weight(
        g: &Graph,
        w: &SecondaryMap<EdgeId, f64>,
        seed: bool,
        excluded: &dyn Fn(EdgeId) -> bool,
    ) -> f64 {
        let mut cand: Vec<EdgeId> = g.edge_ids().filter(|&e| !excluded(e)).collect();
        if seed {
            cand.push(g.exit_root());
        }
        assert!(cand.len() <= 16);
        let mut best = f64::NEG_INFINITY;
        let mut best_size = 0;
        for mask in 0u32..(1 << cand.len()) {
            if seed && mask & (1 << (cand.len() - 1)) == 0 {
                continue;
            }
            let mut uf = UnionFind::new(g.num_vertices());
            let mut ok = true;
            let mut wt = 0.0;
            let mut size = 0;
            for (i, &e) in cand.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    let (a, b) = endpoints(g, e);
                    if !uf.union(a.index(), b.index()) {
                        ok = false;
                        break;
                    }
                    wt += w[e];
                    size += 1;
                }
            }
            if ok && (size > best_size || (size == best_size && wt > best)) {
                best_size = size;
                best = wt;
            }
        }
        best
    }
}
