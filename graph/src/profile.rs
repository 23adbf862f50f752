//! Counter placement for edge profiling ("QP", paper 003, Section 3) and
//! recovery of every edge and block count from the chord counters.
//!
//! - [`place_counters`]: a maximum spanning tree seeded with `EXIT -> root`
//!   (Section 3.1, problem (1)); a counter on every chord. `EXIT -> root` is
//!   never instrumented, so every root-to-EXIT path increments some counter
//!   unless the procedure has no chord at all (a single path).
//! - [`recover_counts`]: propagation over the tree, peeling leaves (a vertex
//!   with one unknown incident tree edge gets it from its flow equation).
//!   The early-exit correction of Figure 4: one `v -> EXIT` edge with count 1
//!   for each frame of this procedure still active at termination, at the
//!   vertex `v` it was executing.
//! - Baselines: [`slow_cost`] (a counter in every block, pixie and slow QP)
//!   and [`predicate_edge_placement`] (a counter on every edge out of a
//!   predicate).
//!
//! Invariants: `chords` are exactly the real edges outside the tree; for
//! counts produced by any execution (with its active frames reported), the
//! recovered counts equal the true ones; counts no execution can produce
//! are rejected with [`Error::InconsistentCounts`].

use crate::entity::{EntityRef, SecondaryMap};
use crate::error::{Error, Result};
use crate::graph::{BlockId, EdgeId, Graph};
use crate::spanning::{endpoints, max_spanning_forest, SpanningForest};
use crate::weights::{vertex_weight, Weights};

/// Where the counters go.
#[derive(Clone, Debug)]
pub struct CounterPlacement {
    /// The spanning tree seeded with `EXIT -> root`; its chords get the counters.
    pub tree: SpanningForest,
    /// The instrumented edges (counter index = position), in edge order.
    pub chords: Vec<EdgeId>,
}

impl CounterPlacement {
    /// The placement's cost: the total weight of the instrumented chords.
    pub fn cost(&self, w: &Weights) -> f64 {
        crate::spanning::cost(w, self.chords.iter().copied())
    }
}

/// QP's placement: counters on the chords of a maximum spanning tree
/// seeded with `EXIT -> root`.
pub fn place_counters(g: &Graph, w: &Weights) -> CounterPlacement {
    let tree = max_spanning_forest(g, w, true, &|_| false);
    let chords = tree.chords(g);
    CounterPlacement { tree, chords }
}

/// Recovered counts: every real edge, `exit_root` (= invocations), and every
/// vertex.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Execution count of every real edge, and of `exit_root` (the invocations).
    pub edges: SecondaryMap<EdgeId, u64>,
    /// Execution count of every vertex.
    pub blocks: SecondaryMap<BlockId, u64>,
}

/// Derives all counts from the chord counters (`chord_counts[c]` for each
/// chord `c`; other entries ignored). `active` lists, for each frame of this
/// procedure still active when the program terminated, the vertex it was at
/// (Figure 4; a frame at EXIT has completed and adds nothing; a vertex out
/// of range is [`Error::BadActiveFrame`]). Unreachable parts of the graph get count 0 when their chords
/// read 0.
pub fn recover_counts(
    g: &Graph,
    pl: &CounterPlacement,
    chord_counts: &SecondaryMap<EdgeId, u64>,
    active: &[BlockId],
) -> Result<Counts> {
    let n = g.num_vertices();
    let m = g.num_edges();
    // net[v] = known inflow - known outflow.
    let mut net = vec![0i128; n];
    let mut unknown = vec![0u32; n];
    let mut known: Vec<Option<i128>> = vec![None; m + 1];
    for &v in active {
        if v.index() >= n {
            return Err(Error::BadActiveFrame { block: v });
        }
        net[v.index()] -= 1;
        net[g.exit().index()] += 1;
    }
    let all = (0..=m).map(EdgeId::new);
    for e in all.clone() {
        let (a, b) = endpoints(g, e);
        if pl.tree.contains(e) {
            unknown[a.index()] += 1;
            unknown[b.index()] += 1;
        } else {
            let c = chord_counts[e] as i128;
            known[e.index()] = Some(c);
            net[a.index()] -= c;
            net[b.index()] += c;
        }
    }
    // Tree edges incident to each vertex, for leaf peeling.
    let mut incident: Vec<Vec<EdgeId>> = vec![Vec::new(); n];
    for e in all.clone().filter(|&e| pl.tree.contains(e)) {
        let (a, b) = endpoints(g, e);
        incident[a.index()].push(e);
        if a != b {
            incident[b.index()].push(e);
        }
    }
    let mut work: Vec<BlockId> = g.vertices().filter(|v| unknown[v.index()] == 1).collect();
    while let Some(v) = work.pop() {
        if unknown[v.index()] != 1 {
            continue;
        }
        let e = *incident[v.index()]
            .iter()
            .find(|e| known[e.index()].is_none())
            .expect("one unknown edge");
        let (a, b) = endpoints(g, e);
        // The flow equation of v fixes e: inflow == outflow.
        let c = if b == v {
            -net[v.index()]
        } else {
            net[v.index()]
        };
        if c < 0 {
            return Err(Error::InconsistentCounts { edge: e, count: c });
        }
        known[e.index()] = Some(c);
        net[a.index()] -= c;
        net[b.index()] += c;
        for x in [a, b] {
            unknown[x.index()] -= 1;
            if unknown[x.index()] == 1 {
                work.push(x);
            }
        }
    }
    if let Some(v) = g.vertices().find(|v| net[v.index()] != 0) {
        // A tree's last equation is redundant for consistent counts.
        return Err(Error::InconsistentCounts {
            edge: g.preds(v).first().copied().unwrap_or(g.exit_root()),
            count: net[v.index()],
        });
    }
    let mut edges = SecondaryMap::filled(m + 1, 0u64);
    for e in all {
        edges[e] = known[e.index()].expect("every edge solved") as u64;
    }
    let mut blocks = SecondaryMap::filled(n, 0u64);
    for v in g.vertices() {
        let mut s: u64 = g.preds(v).iter().map(|&e| edges[e]).sum();
        if v == g.entry() {
            s += edges[g.exit_root()];
        }
        blocks[v] = s;
    }
    Ok(Counts { edges, blocks })
}

/// Baseline cost: a counter in every basic block (EXIT is virtual).
pub fn slow_cost(g: &Graph, w: &Weights) -> f64 {
    g.vertices()
        .filter(|&v| v != g.exit())
        .map(|v| vertex_weight(g, w, v))
        .sum()
}

/// Baseline placement: a counter on every edge out of a predicate, plus
/// one counting invocations (modelled as `EXIT -> root`, whose weight is the
/// invocation count: the paper's single-procedure setting knows it is 1,
/// a multi-procedure profile must count it).
pub fn predicate_edge_placement(g: &Graph) -> Vec<EdgeId> {
    g.edge_ids()
        .filter(|&e| g.is_predicate(g.edge(e).from))
        .chain(std::iter::once(g.exit_root()))
        .collect()
}
