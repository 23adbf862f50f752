//! `aetrace-graph`: the papers' graph algorithms over control-flow graphs.
//!
//! Pure and independent of binaries: the rewriter (record) and the
//! regenerator (regen) both use it. Typed indices and side tables live in
//! [`entity`]; the CFG abstraction every algorithm takes is [`graph::Graph`].

pub mod entity;
pub mod graph;

pub use entity::{EntityRef, PrimaryMap, SecondaryMap};
pub use graph::{BlockId, Edge, EdgeId, Graph, GraphBuilder, ProcId, VertexKind};
