//! The abstract control-flow graph every algorithm works on (paper 003,
//! Section 2).
//!
//! A `Graph` is one procedure: vertices are basic blocks, plus one virtual
//! `EXIT` vertex; edges are transfers of control. A vertex is a *call vertex*
//! when its block ends in a call (or a tail call, or a call that never
//! returns): the algorithms of Section 4.2 treat it specially.
//!
//! Invariants (checked by `Graph::check`, called in debug builds by
//! `GraphBuilder::finish`):
//! - `entry != exit`; `exit` has kind `Exit` and no outgoing edges; no other
//!   vertex has kind `Exit`.
//! - no two edges have the same `(from, to)` (parallel transfers, such as a
//!   `jcc` whose target is its own fall-through, are one edge).
//! - `succs`/`preds` list exactly the edges that leave/enter each vertex, in
//!   edge order.
//! - the `EXIT -> entry` edge of the paper is *not* stored: algorithms that
//!   need it (spanning trees, Kirchhoff flow) add it themselves, see
//!   [`Graph::exit_root`].
//!
//! Reachability (root reaches every vertex, every vertex reaches EXIT) is not
//! an invariant: real binaries have unreachable blocks and infinite loops.
//! Algorithms that need it say how they cope.

use crate::entity::{EntityRef, PrimaryMap, SecondaryMap};

crate::entity!(
    /// A procedure of a module (or of a random test program).
    pub struct ProcId, "proc"
);
crate::entity!(
    /// A vertex of one procedure's graph: a basic block or the EXIT vertex.
    pub struct BlockId, "block"
);
crate::entity!(
    /// An edge of one procedure's graph.
    pub struct EdgeId, "edge"
);

/// What a vertex is to the algorithms.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum VertexKind {
    /// A block that ends in a jump, a branch, a fall-through or a return.
    Plain,
    /// A block that ends in a call: control leaves the procedure and (maybe)
    /// comes back. Tail calls are call vertices whose only successor is EXIT.
    Call,
    /// The procedure's single virtual EXIT vertex.
    Exit,
}

/// A directed edge.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Edge {
    /// The source vertex.
    pub from: BlockId,
    /// The target vertex.
    pub to: BlockId,
}

/// One procedure's control-flow graph.
#[derive(Clone, Debug)]
pub struct Graph {
    kinds: PrimaryMap<BlockId, VertexKind>,
    edges: PrimaryMap<EdgeId, Edge>,
    succs: SecondaryMap<BlockId, Vec<EdgeId>>,
    preds: SecondaryMap<BlockId, Vec<EdgeId>>,
    entry: BlockId,
    exit: BlockId,
}

impl Graph {
    /// The procedure's entry vertex (its root).
    pub fn entry(&self) -> BlockId {
        self.entry
    }
    /// The procedure's single virtual EXIT vertex.
    pub fn exit(&self) -> BlockId {
        self.exit
    }
    /// The number of vertices, EXIT included.
    pub fn num_vertices(&self) -> usize {
        self.kinds.len()
    }
    /// The number of real edges (the virtual `EXIT -> entry` edge excluded).
    pub fn num_edges(&self) -> usize {
        self.edges.len()
    }
    /// Every vertex, in id order.
    pub fn vertices(&self) -> impl DoubleEndedIterator<Item = BlockId> + ExactSizeIterator {
        self.kinds.keys()
    }
    /// Every real edge, in id order.
    pub fn edge_ids(&self) -> impl DoubleEndedIterator<Item = EdgeId> + ExactSizeIterator {
        self.edges.keys()
    }
    /// What kind of vertex `v` is.
    pub fn kind(&self, v: BlockId) -> VertexKind {
        self.kinds[v]
    }
    /// The endpoints of edge `e`.
    pub fn edge(&self, e: EdgeId) -> Edge {
        self.edges[e]
    }
    /// All real edges, indexed by id.
    pub fn edges(&self) -> &PrimaryMap<EdgeId, Edge> {
        &self.edges
    }
    /// The edges out of `v`.
    pub fn succs(&self, v: BlockId) -> &[EdgeId] {
        &self.succs[v]
    }
    /// The edges into `v`.
    pub fn preds(&self, v: BlockId) -> &[EdgeId] {
        &self.preds[v]
    }
    /// A predicate has two or more distinct successors (paper 003, Section 2).
    pub fn is_predicate(&self, v: BlockId) -> bool {
        self.succs[v].len() >= 2
    }
    /// The id the virtual `EXIT -> entry` edge gets in algorithms that add it:
    /// one past the last real edge.
    pub fn exit_root(&self) -> EdgeId {
        EdgeId::new(self.edges.len())
    }
    /// The edge `from -> to`, if there is one.
    pub fn find_edge(&self, from: BlockId, to: BlockId) -> Option<EdgeId> {
        self.succs[from]
            .iter()
            .copied()
            .find(|&e| self.edges[e].to == to)
    }

    /// Checks the invariants listed at the top of this module.
    pub fn check(&self) -> Result<(), String> {
        if self.entry == self.exit {
            return Err("entry is EXIT".into());
        }
        for (v, &k) in self.kinds.iter() {
            if (k == VertexKind::Exit) != (v == self.exit) {
                return Err(format!("{v} has kind {k:?}"));
            }
        }
        if !self.succs[self.exit].is_empty() {
            return Err("EXIT has successors".into());
        }
        let mut seen = std::collections::HashSet::new();
        for (e, edge) in self.edges.iter() {
            if !self.kinds.is_valid(edge.from) || !self.kinds.is_valid(edge.to) {
                return Err(format!("{e} has an endpoint out of range"));
            }
            if !seen.insert((edge.from, edge.to)) {
                return Err(format!("{e} duplicates {} -> {}", edge.from, edge.to));
            }
            if !self.succs[edge.from].contains(&e) || !self.preds[edge.to].contains(&e) {
                return Err(format!("{e} missing from adjacency"));
            }
        }
        let total: usize = self.kinds.keys().map(|v| self.succs[v].len()).sum();
        if total != self.edges.len() {
            return Err("adjacency lists hold extra edges".into());
        }
        Ok(())
    }
}

/// Builds a `Graph`: add vertices, then edges; `finish` checks invariants.
#[derive(Debug, Default)]
pub struct GraphBuilder {
    kinds: PrimaryMap<BlockId, VertexKind>,
    edges: PrimaryMap<EdgeId, Edge>,
    index: std::collections::HashMap<(BlockId, BlockId), EdgeId>,
}

impl GraphBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds a vertex of kind `kind` and returns its id.
    pub fn add_vertex(&mut self, kind: VertexKind) -> BlockId {
        self.kinds.push(kind)
    }
    /// Adds `from -> to` and returns its id; adding an existing edge again
    /// returns the existing id (parallel transfers are one edge).
    pub fn add_edge(&mut self, from: BlockId, to: BlockId) -> EdgeId {
        let edges = &mut self.edges;
        *self
            .index
            .entry((from, to))
            .or_insert_with(|| edges.push(Edge { from, to }))
    }
    /// Finishes the graph. `exit` must be the one vertex of kind `Exit`.
    pub fn finish(self, entry: BlockId, exit: BlockId) -> Graph {
        let n = self.kinds.len();
        let mut succs = SecondaryMap::filled(n, Vec::new());
        let mut preds = SecondaryMap::filled(n, Vec::new());
        for (e, edge) in self.edges.iter() {
            succs[edge.from].push(e);
            preds[edge.to].push(e);
        }
        let g = Graph {
            kinds: self.kinds,
            edges: self.edges,
            succs,
            preds,
            entry,
            exit,
        };
        debug_assert_eq!(g.check(), Ok(()));
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_merges_parallel_edges() {
        let mut b = GraphBuilder::new();
        let a = b.add_vertex(VertexKind::Plain);
        let x = b.add_vertex(VertexKind::Exit);
        let e1 = b.add_edge(a, x);
        let e2 = b.add_edge(a, x);
        assert_eq!(e1, e2);
        let g = b.finish(a, x);
        assert_eq!(g.num_edges(), 1);
        assert!(!g.is_predicate(a));
        assert_eq!(g.check(), Ok(()));
    }
}
