//! `aetrace-graph`: the papers' graph algorithms over control-flow graphs.
//!
//! Pure and independent of binaries: the rewriter (record) and the
//! regenerator (regen) both use it. Typed indices and side tables live in
//! [`entity`]; the CFG abstraction every algorithm takes is [`graph::Graph`].
//!
//! | module | paper | what |
//! |---|---|---|
//! | [`dom`] | 003 §5.1, 001 | DFS, dominators, natural loops, irreducibility |
//! | [`weights`] | 003 §2, §5.1 | heuristic and measured weightings (Kirchhoff) |
//! | [`spanning`] | 003 §3.1, §4.2 | maximum spanning trees / forests |
//! | [`counted`] | 003 §3, Fig. 4 | the counted graph: virtual root, exits, pads, `setjmp` splits |
//! | [`profile`] | 003 §3, Fig. 4 | counter placement (QP), count recovery |
//! | [`trace`] | 003 §4 | blocking + witness placement, witness sets, checkers |
//! | [`program`] | 003 §4.2 | multi-procedure programs, executions, trace records |
//! | [`regen_ref`] | 003 Fig. 7 | reference regenerator with a procedure stack |
//! | [`paths`] | 001 | path numbering, chord increments, path regeneration |
//! | [`events`] | 002 | event counting with query increments |
//!
//! `docs/algorithms.md` describes each algorithm, its invariants and where
//! the code departs from the papers.

pub mod counted;
pub mod dom;
pub mod entity;
pub mod error;
pub mod events;
pub mod graph;
pub mod paths;
pub mod profile;

pub mod program;
pub mod regen_ref;
pub mod spanning;
pub mod trace;
pub mod weights;

#[cfg(any(test, feature = "testgen"))]
pub mod testgen;

#[cfg(test)]
mod tests;

pub use entity::{EntityRef, PrimaryMap, SecondaryMap};
pub use error::{Error, Result};
pub use graph::{BlockId, Edge, EdgeId, Graph, GraphBuilder, ProcId, VertexKind};
