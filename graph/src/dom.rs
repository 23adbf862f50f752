//! Depth-first search, dominators, natural loops and irreducibility
//! (the loop structure the heuristic weighting of paper 003, Section 5.1,
//! and the back edges of path profiling, paper 001, are built on).
//!
//! - [`Dfs`]: one iterative DFS from the root: preorder, postorder, subtree
//!   intervals and the *retreating* edges (target is a DFS ancestor of the
//!   source, self loops included). Removing the retreating edges leaves a
//!   DAG on the reachable vertices, and DFS postorder is a reverse
//!   topological order of it.
//! - [`Dominators`]: Cooper, Harvey & Kennedy's iterative algorithm over
//!   reverse postorder.
//! - A retreating edge `t -> h` is a *back edge* when `h` dominates `t`; its
//!   natural loop is `h` plus every vertex reaching `t` without passing
//!   through `h`. A retreating edge that is not a back edge enters an
//!   irreducible region (a loop with several entries); [`LoopInfo`] lists them.
//!
//! Invariants: unreachable vertices have no preorder number, no dominator
//! and take part in no loop; `idom(root) == root`.

use crate::entity::EntityRef;
use crate::graph::{BlockId, EdgeId, Graph};

const NONE: u32 = u32::MAX;

/// The result of one depth-first search from the root.
#[derive(Clone, Debug)]
pub struct Dfs {
    /// Preorder number of each vertex, `u32::MAX` if unreachable.
    pub pre: Vec<u32>,
    /// Postorder number of each vertex, `u32::MAX` if unreachable.
    pub post: Vec<u32>,
    /// Largest preorder number in each vertex's DFS subtree.
    pub last: Vec<u32>,
    /// Vertices in postorder.
    pub postorder: Vec<BlockId>,
    /// `retreating[e]`: edge `e` goes to a DFS ancestor of its source (or is a self loop).
    pub retreating: Vec<bool>,
}

impl Dfs {
    /// Numbers the vertices reachable from the entry in one iterative depth-first search.
    pub fn new(g: &Graph) -> Dfs {
        let n = g.num_vertices();
        let mut pre = vec![NONE; n];
        let mut post = vec![NONE; n];
        let mut last = vec![NONE; n];
        let mut on_stack = vec![false; n];
        let mut retreating = vec![false; g.num_edges()];
        let mut postorder = Vec::with_capacity(n);
        let mut stack: Vec<(BlockId, usize)> = Vec::new();
        let (mut np, mut nq) = (0u32, 0u32);
        let root = g.entry();
        pre[root.index()] = 0;
        np += 1;
        on_stack[root.index()] = true;
        stack.push((root, 0));
        while let Some(&mut (v, ref mut i)) = stack.last_mut() {
            if let Some(&e) = g.succs(v).get(*i) {
                *i += 1;
                let w = g.edge(e).to;
                if pre[w.index()] == NONE {
                    pre[w.index()] = np;
                    np += 1;
                    on_stack[w.index()] = true;
                    stack.push((w, 0));
                } else if on_stack[w.index()] {
                    retreating[e.index()] = true;
                }
            } else {
                stack.pop();
                on_stack[v.index()] = false;
                post[v.index()] = nq;
                nq += 1;
                last[v.index()] = np - 1;
                postorder.push(v);
            }
        }
        Dfs {
            pre,
            post,
            last,
            postorder,
            retreating,
        }
    }
    /// Whether `v` is reachable from the entry (it has a preorder number).
    pub fn reachable(&self, v: BlockId) -> bool {
        self.pre[v.index()] != NONE
    }
    /// Is `d` an ancestor of (or equal to) `v` in the DFS tree?
    pub fn is_ancestor(&self, d: BlockId, v: BlockId) -> bool {
        let (pd, pv) = (self.pre[d.index()], self.pre[v.index()]);
        pd != NONE && pv != NONE && pd <= pv && pv <= self.last[d.index()]
    }
    /// Whether `e` is retreating: it goes to a DFS ancestor of its source, or is a self loop.
    pub fn is_retreating(&self, e: EdgeId) -> bool {
        self.retreating[e.index()]
    }
}

/// Immediate dominators of the reachable vertices.
#[derive(Clone, Debug)]
pub struct Dominators {
    idom: Vec<u32>,
    post: Vec<u32>,
}

impl Dominators {
    /// Cooper-Harvey-Kennedy: iterate `idom(v) = meet of processed preds`
    /// in reverse postorder until nothing changes.
    pub fn new(g: &Graph, dfs: &Dfs) -> Dominators {
        let n = g.num_vertices();
        let mut idom = vec![NONE; n];
        let root = g.entry();
        idom[root.index()] = root.index() as u32;
        let post = &dfs.post;
        let intersect = |idom: &[u32], mut a: usize, mut b: usize| {
            while a != b {
                while post[a] < post[b] {
                    a = idom[a] as usize;
                }
                while post[b] < post[a] {
                    b = idom[b] as usize;
                }
            }
            a
        };
        let mut changed = true;
        while changed {
            changed = false;
            for &v in dfs.postorder.iter().rev() {
                if v == root {
                    continue;
                }
                let mut new = NONE;
                for &e in g.preds(v) {
                    let p = g.edge(e).from.index();
                    if idom[p] == NONE {
                        continue;
                    }
                    new = if new == NONE {
                        p as u32
                    } else {
                        intersect(&idom, p, new as usize) as u32
                    };
                }
                if new != idom[v.index()] {
                    idom[v.index()] = new;
                    changed = true;
                }
            }
        }
        Dominators {
            idom,
            post: post.clone(),
        }
    }
    /// The immediate dominator (the root's is itself); `None` if unreachable.
    pub fn idom(&self, v: BlockId) -> Option<BlockId> {
        match self.idom[v.index()] {
            NONE => None,
            d => Some(BlockId::new(d as usize)),
        }
    }
    /// Does `d` dominate `v` (reflexively)?
    pub fn dominates(&self, d: BlockId, mut v: BlockId) -> bool {
        if self.idom[v.index()] == NONE || self.idom[d.index()] == NONE {
            return false;
        }
        loop {
            if v == d {
                return true;
            }
            let up = BlockId::new(self.idom[v.index()] as usize);
            if up == v || self.post[up.index()] > self.post[d.index()] {
                return false;
            }
            v = up;
        }
    }
}

/// Natural loops and irreducible edges of one graph.
#[derive(Clone, Debug)]
pub struct LoopInfo {
    /// One loop per header (back edges with the same header merged), headers
    /// in preorder; bodies sorted by block id and include the header.
    pub loops: Vec<(BlockId, Vec<BlockId>)>,
    /// Retreating edges whose target does not dominate their source.
    pub irreducible: Vec<EdgeId>,
}

impl LoopInfo {
    /// Finds the natural loops (one per header) and the irreducible retreating edges of `g`.
    pub fn new(g: &Graph, dfs: &Dfs, dom: &Dominators) -> LoopInfo {
        let mut by_header: Vec<Vec<BlockId>> = vec![Vec::new(); g.num_vertices()];
        let mut irreducible = Vec::new();
        for e in g.edge_ids() {
            if !dfs.is_retreating(e) {
                continue;
            }
            let ed = g.edge(e);
            if dom.dominates(ed.to, ed.from) {
                by_header[ed.to.index()].push(ed.from);
            } else {
                irreducible.push(e);
            }
        }
        let mut headers: Vec<BlockId> = g
            .vertices()
            .filter(|v| !by_header[v.index()].is_empty())
            .collect();
        headers.sort_by_key(|v| dfs.pre[v.index()]);
        let mut mark = vec![false; g.num_vertices()];
        let loops = headers
            .into_iter()
            .map(|h| {
                let mut body = vec![h];
                mark[h.index()] = true;
                let mut work: Vec<BlockId> = Vec::new();
                for &t in &by_header[h.index()] {
                    if !mark[t.index()] {
                        mark[t.index()] = true;
                        body.push(t);
                        work.push(t);
                    }
                }
                while let Some(v) = work.pop() {
                    for &e in g.preds(v) {
                        let u = g.edge(e).from;
                        if !mark[u.index()] && dfs.reachable(u) {
                            mark[u.index()] = true;
                            body.push(u);
                            work.push(u);
                        }
                    }
                }
                for &v in &body {
                    mark[v.index()] = false;
                }
                body.sort();
                (h, body)
            })
            .collect();
        LoopInfo { loops, irreducible }
    }
    /// Whether every retreating edge is a back edge (its target dominates its source).
    pub fn is_reducible(&self) -> bool {
        self.irreducible.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testgen;
    use proptest::prelude::*;

    /// Naive reference: `d` dominates `v` iff `v` is unreachable from the
    /// root once `d` is removed (or `d == v`).
    fn naive_dominates(g: &Graph, d: BlockId, v: BlockId) -> bool {
        if d == v {
            return true;
        }
        if d == g.entry() {
            return true;
        }
        let mut seen = vec![false; g.num_vertices()];
        seen[d.index()] = true;
        seen[g.entry().index()] = true;
        let mut work = vec![g.entry()];
        while let Some(u) = work.pop() {
            for &e in g.succs(u) {
                let w = g.edge(e).to;
                if !seen[w.index()] {
                    seen[w.index()] = true;
                    work.push(w);
                }
            }
        }
        !seen[v.index()]
    }

    proptest! {
        #[test]
        fn dominators_match_reference(g in testgen::arb_graph(2..40)) {
            let dfs = Dfs::new(&g);
            let dom = Dominators::new(&g, &dfs);
            for d in g.vertices() {
                for v in g.vertices() {
                    if dfs.reachable(v) {
                        prop_assert_eq!(dom.dominates(d, v), naive_dominates(&g, d, v), "{} dom {}", d, v);
                    }
                }
            }
        }

        #[test]
        fn retreating_edges_leave_a_dag(g in testgen::arb_graph(2..200)) {
            let dfs = Dfs::new(&g);
            for e in g.edge_ids() {
                let ed = g.edge(e);
                if dfs.reachable(ed.from) && !dfs.is_retreating(e) {
                    prop_assert!(dfs.post[ed.from.index()] > dfs.post[ed.to.index()]);
                }
            }
        }
    }

    #[test]
    fn irreducible_two_entry_loop() {
        // root -> a, root -> b, a <-> b: the loop {a, b} has two entries.
        let mut b = crate::GraphBuilder::new();
        let r = b.add_vertex(crate::VertexKind::Plain);
        let x = b.add_vertex(crate::VertexKind::Plain);
        let y = b.add_vertex(crate::VertexKind::Plain);
        let exit = b.add_vertex(crate::VertexKind::Exit);
        b.add_edge(r, x);
        b.add_edge(r, y);
        b.add_edge(x, y);
        b.add_edge(y, x);
        b.add_edge(y, exit);
        let g = b.finish(r, exit);
        let dfs = Dfs::new(&g);
        let dom = Dominators::new(&g, &dfs);
        let li = LoopInfo::new(&g, &dfs, &dom);
        assert!(!li.is_reducible());
        assert!(li.loops.is_empty());
        assert_eq!(li.irreducible.len(), 1);
    }
}
