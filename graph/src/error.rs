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
        /// The vertex where inflow and outflow differ.
        block: BlockId,
        /// Total weight of the edges into `block`.
        inflow: f64,
        /// Total weight of the edges out of `block`.
        outflow: f64,
    },
    /// An active frame's vertex cannot reach EXIT (its flow cannot be completed).
    #[error("{block} cannot reach EXIT")]
    NoPathToExit {
        /// The vertex EXIT is unreachable from.
        block: BlockId,
    },
    /// A weighting has a negative or non-finite weight.
    #[error("weighting gives {edge} the invalid weight {weight}")]
    BadWeight {
        /// The edge with the bad weight.
        edge: EdgeId,
        /// The weight given (negative, NaN or infinite).
        weight: f64,
    },
    /// Counter values that no execution can produce (a derived count < 0).
    #[error("counter values are inconsistent: derived count of {edge} is {count}")]
    InconsistentCounts {
        /// The edge whose derived count is negative.
        edge: EdgeId,
        /// The derived count (below zero).
        count: i128,
    },
    /// An active frame (Figure 4) at a vertex that is not a block of the graph.
    #[error("active frame at {block}, which is not a block of this procedure")]
    BadActiveFrame {
        /// The vertex named by the frame.
        block: BlockId,
    },
    /// The witness-free part of a placement has a directed cycle through `block`.
    #[error("witness-free directed cycle through {block}")]
    WitnessFreeCycle {
        /// A vertex on the cycle.
        block: BlockId,
    },
    /// Two successors of a predicate share a witness (`Trace(G, epl)` fails).
    #[error("predicate {block}: successors {a} and {b} share witness {witness}")]
    SharedWitness {
        /// The predicate.
        block: BlockId,
        /// One successor.
        a: BlockId,
        /// Another successor.
        b: BlockId,
        /// The witness (or EOF) both successors' witness sets hold.
        witness: String,
    },
    /// A diamond in E - epl (Theorem 4.2).
    #[error("diamond in the witness-free edges from {from} to {to}")]
    Diamond {
        /// The diamond's source vertex.
        from: BlockId,
        /// The diamond's sink vertex.
        to: BlockId,
    },
    /// A predicate sees a call vertex or EXIT through a witness-free path.
    #[error("blocking property fails: predicate {pred} reaches {target} without a witness")]
    NotBlocked {
        /// The predicate.
        pred: BlockId,
        /// The call vertex or EXIT it reaches without a witness.
        target: BlockId,
    },
    /// The regenerator read a witness the current predicate cannot see.
    #[error("{proc} {block}: witness {witness} is in no witness set of this predicate")]
    BadWitness {
        /// The procedure being regenerated.
        proc: ProcId,
        /// The predicate the regenerator is at.
        block: BlockId,
        /// The witness read from the trace.
        witness: String,
    },
    /// The regenerator traversed a witness edge but the trace holds another witness.
    #[error("{proc} {block}: edge to {to} writes witness {expected} but the trace holds {found}")]
    WrongWitness {
        /// The procedure being regenerated.
        proc: ProcId,
        /// The predicate the regenerator is at.
        block: BlockId,
        /// The successor whose edge writes `expected`.
        to: BlockId,
        /// The witness number the edge writes.
        expected: u32,
        /// The record the trace holds instead.
        found: String,
    },
    /// A trace record that cannot occur at this point.
    #[error("{proc} {block}: unexpected record {record} at trace position {pos}")]
    UnexpectedRecord {
        /// The procedure being regenerated.
        proc: ProcId,
        /// The vertex the regenerator is at.
        block: BlockId,
        /// The unexpected record.
        record: String,
        /// Its index in the trace's record sequence.
        pos: usize,
    },
    /// Records are left after the main procedure returned.
    #[error("{left} trace records left after the program returned")]
    TrailingRecords {
        /// How many records remain.
        left: usize,
    },
    /// A non-predicate vertex other than EXIT without a successor was reached.
    #[error("{proc} {block}: no successor to continue with")]
    DeadEnd {
        /// The procedure being regenerated.
        proc: ProcId,
        /// The vertex without a successor.
        block: BlockId,
    },
    /// A path id out of range, or a path that is not in the numbering's DAG.
    #[error("path {0}")]
    BadPath(String),
    /// A procedure with too many acyclic paths for a path profile counter index.
    #[error("{paths} paths exceed the limit {limit}")]
    TooManyPaths {
        /// The procedure's number of acyclic (Ball–Larus) paths.
        paths: u128,
        /// The largest number of paths a counter index can address.
        limit: u64,
    },
}

/// The graph algorithms' result type.
pub type Result<T> = std::result::Result<T, Error>;
