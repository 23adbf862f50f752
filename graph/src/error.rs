//! The crate's one error type.
//!
//! Every variant names what went wrong precisely enough to find it: the
//! procedure, block, edge or witness involved.

use crate::graph::{BlockId, EdgeId, ProcId};

/// Errors of the graph algorithms.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A weighting breaks Kirchhoff's law at a vertex (inflow != outflow).
    #[error("weighting breaks Kirchhoff's law at {block}: in {inflow}, out {outflow}")]
    Kirchhoff {
        block: BlockId,
        inflow: f64,
        outflow: f64,
    },
    /// An active frame's vertex cannot reach EXIT (its flow cannot be completed).
    #[error("{block} cannot reach EXIT")]
    NoPathToExit { block: BlockId },
    /// A weighting has a negative or non-finite weight.
    #[error("weighting gives {edge} the invalid weight {weight}")]
    BadWeight { edge: EdgeId, weight: f64 },
    /// Counter values that no execution can produce (a derived count < 0).
    #[error("counter values are inconsistent: derived count of {edge} is {count}")]
    InconsistentCounts { edge: EdgeId, count: i128 },
    /// An active frame (Figure 4) at a vertex that is not a block of the graph.
    #[error("active frame at {block}, which is not a block of this procedure")]
    BadActiveFrame { block: BlockId },
    /// The witness-free part of a placement has a directed cycle through `block`.
    #[error("witness-free directed cycle through {block}")]
    WitnessFreeCycle { block: BlockId },
    /// Two successors of a predicate share a witness (`Trace(G, epl)` fails).
    #[error("predicate {block}: successors {a} and {b} share witness {witness}")]
    SharedWitness {
        block: BlockId,
        a: BlockId,
        b: BlockId,
        witness: String,
    },
    /// A diamond in E - epl (Theorem 4.2).
    #[error("diamond in the witness-free edges from {from} to {to}")]
    Diamond { from: BlockId, to: BlockId },
    /// A predicate sees a call vertex or EXIT through a witness-free path.
    #[error("blocking property fails: predicate {pred} reaches {target} without a witness")]
    NotBlocked { pred: BlockId, target: BlockId },
    /// The regenerator read a witness the current predicate cannot see.
    #[error("{proc} {block}: witness {witness} is in no witness set of this predicate")]
    BadWitness {
        proc: ProcId,
        block: BlockId,
        witness: String,
    },
    /// The regenerator traversed a witness edge but the trace holds another witness.
    #[error("{proc} {block}: edge to {to} writes witness {expected} but the trace holds {found}")]
    WrongWitness {
        proc: ProcId,
        block: BlockId,
        to: BlockId,
        expected: u32,
        found: String,
    },
    /// A trace record that cannot occur at this point.
    #[error("{proc} {block}: unexpected record {record} at trace position {pos}")]
    UnexpectedRecord {
        proc: ProcId,
        block: BlockId,
        record: String,
        pos: usize,
    },
    /// Records are left after the main procedure returned.
    #[error("{left} trace records left after the program returned")]
    TrailingRecords { left: usize },
    /// A non-predicate vertex other than EXIT without a successor was reached.
    #[error("{proc} {block}: no successor to continue with")]
    DeadEnd { proc: ProcId, block: BlockId },
    /// A path id out of range, or a path that is not in the numbering's DAG.
    #[error("path {0}")]
    BadPath(String),
    /// A procedure with too many acyclic paths for a path profile counter index.
    #[error("{paths} paths exceed the limit {limit}")]
    TooManyPaths { paths: u128, limit: u64 },
}

pub type Result<T> = std::result::Result<T, Error>;
