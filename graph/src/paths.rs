//! Efficient path profiling (paper 001, Ball & Larus, MICRO'96).
//!
//! - Back edges: the DFS retreating edges ([`crate::dom::Dfs`]; in a
//!   reducible graph exactly the loop back edges, self loops included; in an
//!   irreducible one they still break every cycle). Each back edge `t -> h`
//!   is removed and replaced by dummy edges `ENTRY -> h` and `t -> EXIT`.
//!   ENTRY is a *virtual* vertex with a real edge `ENTRY -> root`, so a
//!   procedure whose root is a loop header needs no special case; a self
//!   loop `h -> h` gives the one-block path `[h]`, counted like any other.
//! - `NumPaths`/`Val` on the resulting DAG in reverse topological order
//!   (paper's first step); path ids are `0..NumPaths(ENTRY)`.
//! - Chord increments by event counting ([`crate::events`] on the DAG, with
//!   `Val(e)` as the events of edge `e` and a maximum spanning tree of the
//!   weighting; `EXIT -> ENTRY` seeded, no events), so the instrumentation is
//!   `r = Inc(ENTRY -> root)` at entry, `r += Inc(c)` on chords,
//!   `count[r + Inc(t -> EXIT)]++; r = Inc(ENTRY -> h)` on a back edge, and
//!   `count[r]++` at EXIT. Tree edges cost nothing.
//! - Regeneration: from ENTRY, repeatedly take the outgoing edge with the
//!   largest `Val <= R` and subtract it.
//!
//! Too many paths: ids must fit the counter array. [`number_paths`] fails
//! with [`Error::TooManyPaths`] when `NumPaths(ENTRY)` exceeds the limit
//! given; the documented rule (docs/algorithms.md) is that such a procedure
//! falls back to edge profiling (its paths are then not distinguished).
//!
//! Invariants: for every path `P` from ENTRY to EXIT in the DAG,
//! `sum Val(P) = sum Inc(P)`, the ids are exactly `0..NumPaths(ENTRY)`, and
//! distinct paths have distinct ids.

use crate::dom::Dfs;
use crate::entity::EntityRef;
use crate::error::{Error, Result};
use crate::events::potentials;
use crate::graph::{BlockId, EdgeId, Graph};
use crate::spanning::kruskal;
use crate::weights::Weights;

/// What a DAG edge stands for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DagEdge {
    /// `ENTRY -> root`.
    Enter,
    /// A real, non-back edge.
    Real(EdgeId),
    /// `ENTRY -> h` standing for the back edges into `h`.
    FromBack(BlockId),
    /// `t -> EXIT` standing for the back edges out of `t`.
    ToBack(BlockId),
}

/// One acyclic path as the profile counts it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Path {
    /// Whether it starts at a loop header after a back edge (else at the root).
    pub after_back_edge: bool,
    /// The blocks, ending with EXIT or with a back edge's tail.
    pub blocks: Vec<BlockId>,
    /// Whether it ends by taking a back edge (else at EXIT).
    pub at_back_edge: bool,
}

/// Path numbering and instrumentation of one procedure.
#[derive(Clone, Debug)]
pub struct PathNumbering {
    entry: usize,
    exit: usize,
    edges: Vec<(usize, usize, DagEdge)>,
    out: Vec<Vec<usize>>,
    /// `Val` of each DAG edge.
    val: Vec<u64>,
    /// Chord increment of each DAG edge (0 on tree edges).
    inc: Vec<i64>,
    num_paths: Vec<u64>,
    /// DAG edge of each real non-back edge.
    real: Vec<Option<usize>>,
    back: Vec<bool>,
    to_back: Vec<Option<usize>>,
    from_back: Vec<Option<usize>>,
}

impl PathNumbering {
    /// The number of acyclic paths from the entry to EXIT (Ball–Larus path ids are `0..num_paths`).
    pub fn num_paths(&self) -> u64 {
        self.num_paths[self.entry]
    }
    /// Is `e` a back edge (instrumented with the record-and-restart code)?
    pub fn is_back_edge(&self, e: EdgeId) -> bool {
        self.back[e.index()]
    }
    /// `r`'s value at procedure entry.
    pub fn inc_enter(&self) -> i64 {
        self.inc[self.out[self.entry][0]]
    }
    /// `Inc` of a real non-back edge (0 for tree edges).
    pub fn inc_edge(&self, e: EdgeId) -> i64 {
        self.real[e.index()].map_or(0, |i| self.inc[i])
    }
    /// For a back edge `t -> h`: the increment before recording
    /// (`Inc(t -> EXIT)`) and the value `r` restarts with (`Inc(ENTRY -> h)`).
    pub fn back_edge_incs(&self, t: BlockId, h: BlockId) -> (i64, i64) {
        let te = self.to_back[t.index()].expect("tail of a back edge");
        let he = self.from_back[h.index()].expect("header of a back edge");
        (self.inc[te], self.inc[he])
    }
    /// Number of instrumented (chord) DAG edges.
    pub fn chords(&self) -> usize {
        self.inc.iter().filter(|&&i| i != 0).count()
    }
    /// The path with id `id`.
    pub fn regenerate(&self, mut id: u64) -> Result<Path> {
        if id >= self.num_paths() {
            return Err(Error::BadPath(format!("id {id} >= {}", self.num_paths())));
        }
        let mut v = self.entry;
        let mut path = Path {
            after_back_edge: false,
            blocks: Vec::new(),
            at_back_edge: false,
        };
        while v != self.exit {
            let e = *self.out[v]
                .iter()
                .rev()
                .find(|&&e| self.val[e] <= id && self.num_paths[self.edges[e].1] > 0)
                .ok_or_else(|| Error::BadPath(format!("no edge out of vertex {v}")))?;
            id -= self.val[e];
            match self.edges[e].2 {
                DagEdge::FromBack(_) => path.after_back_edge = true,
                DagEdge::ToBack(_) => path.at_back_edge = true,
                _ => {}
            }
            v = self.edges[e].1;
            if v != self.exit || !path.at_back_edge {
                path.blocks.push(BlockId::new(v));
            }
        }
        Ok(path)
    }
    /// The id of `path` (sum of `Val`), or an error if it is no DAG path.
    pub fn id_of(&self, path: &Path) -> Result<u64> {
        let mut v = self.entry;
        let mut sum = 0u64;
        let first = *path
            .blocks
            .first()
            .ok_or_else(|| Error::BadPath("empty".into()))?;
        let mut steps: Vec<(usize, Option<DagEdge>)> = Vec::new();
        steps.push((
            first.index(),
            Some(if path.after_back_edge {
                DagEdge::FromBack(first)
            } else {
                DagEdge::Enter
            }),
        ));
        for w in path.blocks.iter().skip(1) {
            steps.push((w.index(), None));
        }
        if path.at_back_edge {
            let last = *path.blocks.last().expect("nonempty");
            steps.push((self.exit, Some(DagEdge::ToBack(last))));
        }
        for (w, kind) in steps {
            let e = *self.out[v]
                .iter()
                .find(|&&e| {
                    self.edges[e].1 == w
                        && match kind {
                            Some(k) => self.edges[e].2 == k,
                            None => matches!(self.edges[e].2, DagEdge::Real(_)),
                        }
                })
                .ok_or_else(|| Error::BadPath(format!("no DAG edge {v} -> {w}")))?;
            sum += self.val[e];
            v = w;
        }
        if v != self.exit {
            return Err(Error::BadPath("does not end at EXIT".into()));
        }
        Ok(sum)
    }
}

/// Numbers the acyclic paths of `g` and computes chord increments under
/// weighting `w`. Fails if there are more than `limit` paths.
pub fn number_paths(g: &Graph, w: &Weights, limit: u64) -> Result<PathNumbering> {
    let dfs = Dfs::new(g);
    let n = g.num_vertices();
    let entry = n; // the virtual ENTRY
    let exit = g.exit().index();
    let mut edges: Vec<(usize, usize, DagEdge)> = vec![(entry, g.entry().index(), DagEdge::Enter)];
    let mut weight: Vec<f64> = vec![w[g.exit_root()]];
    let mut back = vec![false; g.num_edges()];
    let mut real = vec![None; g.num_edges()];
    let mut from_back: Vec<Option<usize>> = vec![None; n];
    let mut to_back: Vec<Option<usize>> = vec![None; n];
    for e in g.edge_ids() {
        let ed = g.edge(e);
        if !dfs.reachable(ed.from) {
            continue;
        }
        if dfs.is_retreating(e) {
            back[e.index()] = true;
            let (t, h) = (ed.from.index(), ed.to.index());
            let he = *from_back[h].get_or_insert_with(|| {
                edges.push((entry, h, DagEdge::FromBack(ed.to)));
                weight.push(0.0);
                edges.len() - 1
            });
            weight[he] += w[e];
            let te = *to_back[t].get_or_insert_with(|| {
                edges.push((t, exit, DagEdge::ToBack(ed.from)));
                weight.push(0.0);
                edges.len() - 1
            });
            weight[te] += w[e];
        } else {
            real[e.index()] = Some(edges.len());
            edges.push((ed.from.index(), ed.to.index(), DagEdge::Real(e)));
            weight.push(w[e]);
        }
    }
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); n + 1];
    for (i, &(a, _, _)) in edges.iter().enumerate() {
        out[a].push(i);
    }
    // NumPaths/Val in reverse topological order (DFS postorder of the DAG).
    let mut num_paths = vec![0u64; n + 1];
    let mut val = vec![0u64; edges.len()];
    let mut done = vec![false; n + 1];
    let mut stack = vec![(entry, 0usize)];
    done[entry] = true;
    while let Some(&mut (v, ref mut i)) = stack.last_mut() {
        if let Some(&e) = out[v].get(*i) {
            *i += 1;
            let t = edges[e].1;
            if !done[t] {
                done[t] = true;
                stack.push((t, 0));
            }
        } else {
            stack.pop();
            if v == exit {
                num_paths[v] = 1;
                continue;
            }
            let mut np: u128 = 0;
            for &e in &out[v] {
                val[e] = np as u64;
                np += num_paths[edges[e].1] as u128;
                if np > limit as u128 {
                    return Err(Error::TooManyPaths { paths: np, limit });
                }
            }
            num_paths[v] = np as u64;
        }
    }
    // Event counting on the DAG plus EXIT -> ENTRY (last, seeded, no events).
    let m = edges.len();
    let ends = |i: usize| {
        if i == m {
            (exit, entry)
        } else {
            (edges[i].0, edges[i].1)
        }
    };
    let (in_tree, _) = kruskal(
        n + 1,
        m + 1,
        &ends,
        &|i| if i == m { 0.0 } else { weight[i] },
        Some(m),
        &|_| false,
    );
    let forest: Vec<(usize, usize, i64)> = (0..=m)
        .filter(|&i| in_tree[i])
        .map(|i| {
            let (a, b) = ends(i);
            (a, b, if i == m { 0 } else { val[i] as i64 })
        })
        .collect();
    let phi = potentials(n + 1, entry, &forest);
    let inc = (0..m)
        .map(|i| {
            if in_tree[i] {
                0
            } else {
                val[i] as i64 + phi[edges[i].0] - phi[edges[i].1]
            }
        })
        .collect();
    Ok(PathNumbering {
        entry,
        exit,
        edges,
        out,
        val,
        inc,
        num_paths,
        real,
        back,
        to_back,
        from_back,
    })
}
