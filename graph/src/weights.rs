//! Weightings: the heuristic of paper 003, Section 5.1, and measured
//! weightings from a profile.
//!
//! A weighting is a `SecondaryMap<EdgeId, f64>` over the real edges plus the
//! virtual `EXIT -> root` edge ([`Graph::exit_root`]); it must satisfy
//! Kirchhoff's law at every vertex ([`check_kirchhoff`]).
//!
//! # The heuristic, and how it keeps Kirchhoff's law exact
//!
//! The paper's rules: (1) each loop iterates ten times, (2) a loop entered N
//! times with E exit edges gives each exit N/E, (3) a predicate's non-exit
//! branches are equally likely. We build the weighting as a *sum of flows*,
//! each of which conserves flow by construction, so the sum does too:
//!
//! - `F0`: one unit from the root to EXIT (the `EXIT -> root` edge gets 1).
//! - for each loop with header `h` (outer loops first): a circulation of
//!   `10 N` units around the loop, where `N` is the flow entering the loop
//!   from outside at that point; the retreating edges into `h` share the
//!   `10 N` equally.
//!
//! Each flow is routed on the DAG left by removing the DFS retreating edges
//! ([`crate::dom::Dfs`]), *backwards from its sinks*: a vertex's demand is
//! split equally among its incoming DAG edges from vertices that can pass it
//! on (for a loop, the loop's own vertices). Routing backwards never gets
//! stuck (every vertex with demand has a DFS parent that can take it), which
//! a forward split cannot promise in irreducible graphs.
//!
//! Consequences, in the paper's terms: a loop entered N times has header
//! weight 11 N and back-edge weight 10 N (rule 1); the N units that enter it
//! also leave it, split over its exit edges by the demand at their targets:
//! edges into one vertex share its demand equally, so a loop whose exit
//! edges all enter one vertex (a join, or EXIT) gives each N/E (rule 2, and
//! Figure 1 exactly); branches that lead to the same demand split it
//! equally (rule 3). Where the rules conflict (exits to different joins,
//! multi-level breaks) Kirchhoff's law wins and the rules are approximate.
//!
//! Loops ([`loop_regions`]): for a header `h` (target of retreating edges
//! `t_i -> h`), the natural loop of the back edges (`h` dominates `t_i`,
//! tested equal to [`crate::dom::LoopInfo`]) plus, for an irreducible
//! retreating edge (a multiple-entry loop), the DFS descendants of `h` that
//! reach `t_i` on the DAG. The irreducible region's header is its DFS-first
//! entry; its other entries simply bring flow in, which counts in its N.
//!
//! Unreachable vertices get weight 0; if EXIT is unreachable `F0` is 0.

use crate::dom::{Dfs, Dominators};
use crate::entity::{EntityRef, SecondaryMap};
use crate::error::{Error, Result};
use crate::graph::{BlockId, EdgeId, Graph};

/// Iterations per loop entry assumed by the heuristic (Section 5.1).
pub const LOOP_ITERATIONS: f64 = 10.0;

/// Upper bound of one loop's circulation, so that weights stay finite and
/// precise in graphs with hundreds of nested loops.
pub const MAX_CIRCULATION: f64 = 1e12;

/// A weighting over real edges plus `exit_root`.
pub type Weights = SecondaryMap<EdgeId, f64>;

/// The loop regions the heuristic uses: `(header, sorted body)`, headers in
/// DFS preorder. For the back edges into a header (the header dominates
/// the tail) the region holds their natural loop; for the irreducible
/// retreating edges into it, the DFS descendants of the header that reach
/// the tail on the DAG (without retreating edges), which keeps the search
/// inside the header's subtree and linear in the region's size.
pub fn loop_regions(g: &Graph, dfs: &Dfs, dom: &Dominators) -> Vec<(BlockId, Vec<BlockId>)> {
    let mut tails: Vec<Vec<(BlockId, bool)>> = vec![Vec::new(); g.num_vertices()];
    for e in g.edge_ids() {
        if dfs.is_retreating(e) {
            let ed = g.edge(e);
            tails[ed.to.index()].push((ed.from, dom.dominates(ed.to, ed.from)));
        }
    }
    let mut headers: Vec<BlockId> = g
        .vertices()
        .filter(|v| !tails[v.index()].is_empty())
        .collect();
    headers.sort_by_key(|v| dfs.pre[v.index()]);
    // 0: not in the region; 1: natural-loop search (all edges); 2: DAG search.
    let mut mark = vec![0u8; g.num_vertices()];
    headers
        .into_iter()
        .map(|h| {
            let mut body = vec![h];
            mark[h.index()] = 1;
            for natural in [true, false] {
                let level = if natural { 1 } else { 2 };
                let mut work = Vec::new();
                for &(t, dominated) in &tails[h.index()] {
                    if dominated != natural {
                        continue;
                    }
                    if mark[t.index()] == 0 {
                        mark[t.index()] = level;
                        body.push(t);
                        work.push(t);
                    }
                }
                while let Some(v) = work.pop() {
                    for &e in g.preds(v) {
                        let u = g.edge(e).from;
                        let ok = if natural {
                            dfs.reachable(u)
                        } else {
                            !dfs.is_retreating(e) && dfs.is_ancestor(h, u)
                        };
                        if ok && mark[u.index()] == 0 {
                            mark[u.index()] = level;
                            body.push(u);
                            work.push(u);
                        }
                    }
                }
            }
            for &v in &body {
                mark[v.index()] = 0;
            }
            body.sort();
            (h, body)
        })
        .collect()
}

/// Routes `demand` (pre-loaded per vertex) backwards to `source` over DAG
/// edges among `allowed` vertices, adding it to `w`. `order` lists the
/// vertices with possible demand in DFS postorder (sinks first).
fn route_back(
    g: &Graph,
    dfs: &Dfs,
    order: &[BlockId],
    allowed: &dyn Fn(BlockId) -> bool,
    source: BlockId,
    demand: &mut [f64],
    w: &mut Weights,
) {
    let mut ins: Vec<EdgeId> = Vec::new();
    for &v in order {
        let d = std::mem::take(&mut demand[v.index()]);
        if d == 0.0 || v == source {
            continue;
        }
        ins.clear();
        ins.extend(g.preds(v).iter().copied().filter(|&e| {
            let u = g.edge(e).from;
            !dfs.is_retreating(e) && dfs.reachable(u) && allowed(u)
        }));
        debug_assert!(!ins.is_empty(), "demand stuck at {v}");
        let share = d / ins.len() as f64;
        for &e in &ins {
            w[e] += share;
            demand[g.edge(e).from.index()] += share;
        }
    }
}

/// The heuristic weighting of Section 5.1 (see the module comment).
pub fn heuristic(g: &Graph) -> Weights {
    let dfs = Dfs::new(g);
    let mut w: Weights = SecondaryMap::filled(g.num_edges() + 1, 0.0);
    let mut demand = vec![0.0f64; g.num_vertices()];
    if dfs.reachable(g.exit()) {
        w[g.exit_root()] = 1.0;
        demand[g.exit().index()] = 1.0;
        route_back(
            g,
            &dfs,
            &dfs.postorder,
            &|_| true,
            g.entry(),
            &mut demand,
            &mut w,
        );
    }
    let mut inside = vec![false; g.num_vertices()];
    let dom = Dominators::new(g, &dfs);
    for (h, mut body) in loop_regions(g, &dfs, &dom) {
        for &v in &body {
            inside[v.index()] = true;
        }
        let mut entering = 0.0;
        let mut back: Vec<EdgeId> = Vec::new();
        for &v in &body {
            for &e in g.preds(v) {
                let u = g.edge(e).from;
                if !inside[u.index()] {
                    entering += w[e];
                } else if v == h && dfs.is_retreating(e) {
                    back.push(e);
                }
            }
        }
        if h == g.entry() {
            entering += w[g.exit_root()];
        }
        if entering > 0.0 && !back.is_empty() {
            // Deeply nested retreating regions (random irreducible graphs)
            // would overflow 11^depth; any circulation keeps Kirchhoff's law.
            let share = (LOOP_ITERATIONS * entering).min(MAX_CIRCULATION) / back.len() as f64;
            for &e in &back {
                w[e] += share;
                demand[g.edge(e).from.index()] += share;
            }
            body.sort_by_key(|v| dfs.post[v.index()]);
            route_back(
                g,
                &dfs,
                &body,
                &|u| inside[u.index()],
                h,
                &mut demand,
                &mut w,
            );
        }
        for &v in &body {
            inside[v.index()] = false;
        }
    }
    debug_assert!(check_kirchhoff(g, &w).is_ok());
    w
}

/// A measured weighting: the edge counts of a profile (`counts[exit_root]`
/// = number of invocations). `active` lists, for each frame of this
/// procedure still active when the program terminated, the vertex it was at
/// (the Figure 4 situation): each such frame's flow is completed by one unit
/// along a shortest path from that vertex to EXIT, so the result is a
/// weighting again. Fails unless the (completed) counts satisfy Kirchhoff's
/// law, or if an active vertex cannot reach EXIT.
pub fn measured(
    g: &Graph,
    counts: &SecondaryMap<EdgeId, u64>,
    active: &[BlockId],
) -> Result<Weights> {
    let mut w: Weights = SecondaryMap::filled(g.num_edges() + 1, 0.0);
    for e in g.edge_ids().chain(std::iter::once(g.exit_root())) {
        w[e] = counts[e] as f64;
    }
    if !active.is_empty() {
        // Next edge on a shortest path to EXIT, by BFS backwards from EXIT.
        let mut next: Vec<Option<EdgeId>> = vec![None; g.num_vertices()];
        let mut seen = vec![false; g.num_vertices()];
        seen[g.exit().index()] = true;
        let mut queue = std::collections::VecDeque::from([g.exit()]);
        while let Some(v) = queue.pop_front() {
            for &e in g.preds(v) {
                let u = g.edge(e).from;
                if !seen[u.index()] {
                    seen[u.index()] = true;
                    next[u.index()] = Some(e);
                    queue.push_back(u);
                }
            }
        }
        for &a in active {
            if a.index() >= g.num_vertices() {
                return Err(Error::BadActiveFrame { block: a });
            }
            let mut v = a;
            while v != g.exit() {
                let e = next[v.index()].ok_or(Error::NoPathToExit { block: v })?;
                w[e] += 1.0;
                v = g.edge(e).to;
            }
        }
    }
    check_kirchhoff(g, &w)?;
    Ok(w)
}

/// Checks nonnegativity and Kirchhoff's law (relative tolerance 1e-9).
pub fn check_kirchhoff(g: &Graph, w: &Weights) -> Result<()> {
    let n = g.num_vertices();
    let mut inflow = vec![0.0f64; n];
    let mut outflow = vec![0.0f64; n];
    for e in g.edge_ids().chain(std::iter::once(g.exit_root())) {
        let x = w[e];
        if !(x.is_finite() && x >= 0.0) {
            return Err(Error::BadWeight { edge: e, weight: x });
        }
        let (a, b) = crate::spanning::endpoints(g, e);
        outflow[a.index()] += x;
        inflow[b.index()] += x;
    }
    for v in g.vertices() {
        let (i, o) = (inflow[v.index()], outflow[v.index()]);
        if (i - o).abs() > 1e-9 * i.max(o).max(1.0) {
            return Err(Error::Kirchhoff {
                block: v,
                inflow: i,
                outflow: o,
            });
        }
    }
    Ok(())
}

/// The weight of a vertex: the sum of its incoming edges (with `EXIT ->
/// root` for the root).
pub fn vertex_weight(g: &Graph, w: &Weights, v: BlockId) -> f64 {
    let mut s: f64 = g.preds(v).iter().map(|&e| w[e]).sum();
    if v == g.entry() {
        s += w[g.exit_root()];
    }
    s
}
