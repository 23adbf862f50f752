//! The counted graph of one procedure (paper 003 Section 3 with Figure 4's
//! early-exit correction): the CFG plus a virtual root `R0`, virtual exits
//! at call blocks whose frames may be abandoned, virtual entries at landing
//! pads, and a split vertex per `setjmp` call.
//!
//! The rewriter's counter placement and the profile's count recovery both
//! number its edges through [`Virtual`], so the two agree by construction.

use crate::{BlockId, EdgeId, EntityRef, Graph, GraphBuilder, VertexKind};

/// A counted edge of the counted graph (see the module comment): what a
/// counter counts.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Counted {
    /// A CFG edge (a `setjmp` call's return edge: counted before the call,
    /// so only the first returns).
    Edge(EdgeId),
    /// `R0 -> root`: the invocations.
    Entry,
    /// `R0 -> pad`: entries by the unwinder at this landing pad.
    Landing(BlockId),
    /// `S -> r` of the `setjmp` call at this block: every return of it,
    /// counted at the return point.
    Resume(BlockId),
}

/// What one edge of a counted graph is (see [`Virtual`] for the order).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CountedEdge {
    /// A CFG edge (same index).
    Cfg(EdgeId),
    /// `R0 -> root`.
    Entry,
    /// `c -> EXIT` of this call block: derived, never counted.
    Exit(BlockId),
    /// `R0 -> pad` of this landing pad.
    Landing(BlockId),
    /// `R0 -> S` of the `setjmp` call at this block (its returns through
    /// `longjmp`): derived, never counted.
    SecondReturn(BlockId),
    /// `S -> r` of the `setjmp` call at this block.
    Resume(BlockId),
}

/// The virtual parts of one procedure's counted graph. With `n` blocks,
/// EXIT is vertex `n`, `R0` is `n + 1` and the split vertex `S` of the
/// i-th `setjmp` call is `n + 2 + i`. With `m` CFG edges, the edges are:
/// the CFG edges `0..m` (a `setjmp` call's return edge `c -> r` ends at
/// its `S` instead), `R0 -> root` (`m`), `c -> EXIT` for each of `exits`,
/// `R0 -> pad` for each of `pads`, then `R0 -> S`, `S -> r` for each of
/// `setjmps`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Virtual {
    /// Call blocks where frames may be abandoned: the process ends below
    /// them, or a throw or `longjmp` unwinds through them.
    pub exits: Vec<BlockId>,
    /// Landing pads the unwinder may enter.
    pub pads: Vec<BlockId>,
    /// Blocks calling `setjmp` (it may return again, through `longjmp`).
    pub setjmps: Vec<BlockId>,
}

impl Virtual {
    /// What edge `e` of the counted graph of a procedure with `m` CFG edges
    /// is (None: out of range).
    pub fn classify(&self, m: usize, e: EdgeId) -> Option<CountedEdge> {
        let i = e.index();
        let (x, p) = (self.exits.len(), self.pads.len());
        Some(match i {
            _ if i < m => CountedEdge::Cfg(e),
            _ if i == m => CountedEdge::Entry,
            _ if i <= m + x => CountedEdge::Exit(self.exits[i - m - 1]),
            _ if i <= m + x + p => CountedEdge::Landing(self.pads[i - m - x - 1]),
            _ => {
                let k = i - m - x - p - 1;
                let c = *self.setjmps.get(k / 2)?;
                if k % 2 == 0 {
                    CountedEdge::SecondReturn(c)
                } else {
                    CountedEdge::Resume(c)
                }
            }
        })
    }

    /// The counted-graph edge a counter counts.
    pub fn edge_of(&self, m: usize, c: Counted) -> Option<EdgeId> {
        let (x, p) = (self.exits.len(), self.pads.len());
        let at = |v: &[BlockId], b: BlockId| v.iter().position(|&y| y == b);
        Some(EdgeId::new(match c {
            Counted::Edge(e) => e.index(),
            Counted::Entry => m,
            Counted::Landing(b) => m + x + 1 + at(&self.pads, b)?,
            Counted::Resume(b) => m + x + p + 2 + 2 * at(&self.setjmps, b)?,
        }))
    }

    /// The counter of counted-graph edge `e`, if it can have one.
    pub fn counted(&self, m: usize, e: EdgeId) -> Option<Counted> {
        match self.classify(m, e)? {
            CountedEdge::Cfg(e) => Some(Counted::Edge(e)),
            CountedEdge::Entry => Some(Counted::Entry),
            CountedEdge::Landing(b) => Some(Counted::Landing(b)),
            CountedEdge::Resume(b) => Some(Counted::Resume(b)),
            CountedEdge::Exit(_) | CountedEdge::SecondReturn(_) => None,
        }
    }

    /// The counted graph (order in the type's comment): `n` blocks of
    /// `kinds`, `edges` as `(from, to, is a call's return edge)` with EXIT
    /// as `n`. Errors name what does not fit: a block out of range, an edge
    /// leaving EXIT, duplicate edges, a `setjmp` call without exactly one
    /// return edge.
    pub fn graph(
        &self,
        kinds: &[VertexKind],
        entry: BlockId,
        edges: &[(BlockId, BlockId, bool)],
    ) -> Result<Graph, String> {
        let n = kinds.len();
        let mut b = GraphBuilder::new();
        for &k in kinds {
            b.add_vertex(k);
        }
        let exit = b.add_vertex(VertexKind::Exit);
        let r0 = b.add_vertex(VertexKind::Plain);
        let split: Vec<BlockId> = self
            .setjmps
            .iter()
            .map(|_| b.add_vertex(VertexKind::Plain))
            .collect();
        let source = |v: BlockId| {
            if v.index() < n {
                Ok(v)
            } else {
                Err(format!("an edge leaves {v}, which is not a block"))
            }
        };
        let target = |v: BlockId| {
            if v.index() <= n {
                Ok(v)
            } else {
                Err(format!("an edge enters {v}, which is not a block"))
            }
        };
        let mut resume = vec![None; self.setjmps.len()];
        for &(f, t, ret) in edges {
            let s = self.setjmps.iter().position(|&c| ret && c == f);
            let to = match s {
                Some(i) if resume[i].is_none() => {
                    resume[i] = Some(target(t)?);
                    split[i]
                }
                Some(_) => return Err(format!("the setjmp call {f} has two return edges")),
                None => target(t)?,
            };
            b.add_edge(source(f)?, to);
        }
        b.add_edge(r0, source(entry)?);
        for &c in &self.exits {
            b.add_edge(source(c)?, exit);
        }
        for &p in &self.pads {
            b.add_edge(r0, source(p)?);
        }
        for (i, &s) in split.iter().enumerate() {
            let r = resume[i]
                .ok_or_else(|| format!("the setjmp call {} has no return edge", self.setjmps[i]))?;
            b.add_edge(r0, s);
            b.add_edge(s, r);
        }
        let g = b.finish(r0, exit);
        let want = edges.len() + 1 + self.exits.len() + self.pads.len() + 2 * self.setjmps.len();
        if g.num_edges() != want {
            return Err("duplicate edges in the counted graph".into());
        }
        Ok(g)
    }
}
