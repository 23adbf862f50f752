//! The multi-procedure model the tracing algorithms are tested on (paper
//! 003, Section 4.2): procedures, what each call vertex calls, executions,
//! and the trace an instrumented program writes for an execution.
//!
//! Trace model (mirrors the real product's records, see `docs/algorithms.md`):
//! - `Witness(n)`: witness number `n` of the *current* procedure (numbers are
//!   per procedure, `0..count`, see [`crate::trace::WitnessPlacement`]).
//! - `Enter(p)`: written by an indirect call's callee on entry (the real
//!   product's outside-entry stub), naming the procedure.
//! - `Terminate`: the program called an `exit`-like procedure; frames may
//!   still be active.
//! - `Eof`: the main procedure returned (the paper's EOF, always last).
//! - A trace that just stops (program killed) is *cut*.
//!
//! An execution is the sequence of `(procedure, vertex)` pairs visited,
//! EXIT vertices included: a call vertex is followed by the callee's root,
//! the callee's EXIT by the caller's next vertex (a successor of the call
//! vertex). External calls (untraced code that returns) write nothing.

use crate::entity::{PrimaryMap, SecondaryMap};
use crate::graph::{BlockId, EdgeId, Graph, ProcId, VertexKind};
use crate::trace::WitnessPlacement;

/// What a call vertex calls.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Callee {
    /// A known traced procedure.
    Direct(ProcId),
    /// A traced procedure known only at run time (it announces itself with `Enter`).
    Indirect,
    /// Untraced code that returns and writes nothing.
    External,
    /// An `exit`-like procedure: never returns, the trace ends with `Terminate`.
    Exit,
}

/// A program: one graph per procedure, and the callee of each call vertex.
#[derive(Clone, Debug)]
pub struct Program {
    /// One control-flow graph per procedure.
    pub procs: PrimaryMap<ProcId, Graph>,
    /// `callees[p][v]` is `Some` exactly for the call vertices of `p`.
    pub callees: PrimaryMap<ProcId, SecondaryMap<BlockId, Option<Callee>>>,
    /// The procedure executions start in.
    pub main: ProcId,
}

impl Program {
    /// The callee of call vertex `v` of procedure `p`; `None` for other vertices.
    pub fn callee(&self, p: ProcId, v: BlockId) -> Option<Callee> {
        debug_assert_eq!(
            self.procs[p].kind(v) == VertexKind::Call,
            self.callees[p][v].is_some()
        );
        self.callees[p][v]
    }
}

/// One trace record.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Record {
    /// A witness number written by a witness edge.
    Witness(u32),
    /// Entry into an indirectly called procedure, naming it.
    Enter(ProcId),
    /// An `exit`-like procedure was called: the execution ends here.
    Terminate,
    /// The paper's EOF: the main procedure returned.
    Eof,
}

/// How an execution (or its regeneration) ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// The main procedure reached its EXIT.
    Returned,
    /// An `exit`-like call at the last step; the other steps' frames were active.
    Terminated,
    /// Killed: the execution stops anywhere.
    Cut,
}

/// An execution of a program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Execution {
    /// The (procedure, vertex) visited at each step, in order.
    pub steps: Vec<(ProcId, BlockId)>,
    /// How the execution ended.
    pub end: End,
}

impl Execution {
    /// The vertex each procedure frame still active at the end is at
    /// (outermost first): the paper's Figure 4 adds one `v -> EXIT` edge per
    /// such frame. Empty when the execution returned.
    pub fn active_frames(&self, prog: &Program) -> Vec<(ProcId, BlockId)> {
        let mut stack = Vec::new();
        walk(prog, self, &mut stack, |_, _| {}).expect("a valid execution");
        stack
    }
}

/// One transfer of control in an execution.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Transfer {
    /// The execution starts at this procedure's root.
    Start(ProcId),
    /// An intraprocedural edge `from -> to` of `proc` (after a return, the
    /// edge out of the call vertex).
    Edge {
        /// The procedure the edge belongs to.
        proc: ProcId,
        /// The edge taken.
        edge: crate::EdgeId,
    },
    /// A call vertex transfers into `callee`'s root.
    Call {
        /// The procedure making the call.
        caller: ProcId,
        /// The call vertex.
        at: BlockId,
        /// The procedure called.
        callee: ProcId,
    },
}

/// Does the call vertex `v` of `p` transfer into a traced procedure?
fn is_call_into(prog: &Program, p: ProcId, v: BlockId) -> bool {
    matches!(
        prog.callees[p][v],
        Some(Callee::Direct(_)) | Some(Callee::Indirect)
    )
}

/// Walks `exec`, calling `f` for every transfer with the step index, and
/// leaves in `stack` the frames active at the end. Fails on a step that is
/// no transfer of `prog`.
pub fn walk(
    prog: &Program,
    exec: &Execution,
    stack: &mut Vec<(ProcId, BlockId)>,
    mut f: impl FnMut(usize, Transfer),
) -> Result<(), String> {
    stack.clear();
    for (i, &(p, v)) in exec.steps.iter().enumerate() {
        let t = match stack.last().copied() {
            None if i == 0 => {
                if p != prog.main || v != prog.procs[p].entry() {
                    return Err("execution does not start at main's root".into());
                }
                stack.push((p, v));
                Transfer::Start(p)
            }
            None => return Err(format!("step {i}: {p} {v} after main returned")),
            Some((pp, pv)) if pv == prog.procs[pp].exit() => {
                stack.pop();
                let Some(&(cp, cv)) = stack.last() else {
                    return Err(format!("step {i}: return from main"));
                };
                match prog.procs[cp].find_edge(cv, v) {
                    Some(edge) if cp == p => Transfer::Edge { proc: p, edge },
                    _ => return Err(format!("step {i}: return to {p} {v}, not after {cp} {cv}")),
                }
            }
            Some((pp, pv)) if is_call_into(prog, pp, pv) => {
                let c = prog.callees[pp][pv];
                if v != prog.procs[p].entry()
                    || (c != Some(Callee::Indirect) && c != Some(Callee::Direct(p)))
                {
                    return Err(format!("step {i}: {pp} {pv} cannot call {p} {v}"));
                }
                stack.push((p, v));
                Transfer::Call {
                    caller: pp,
                    at: pv,
                    callee: p,
                }
            }
            Some((pp, pv)) => match prog.procs[pp].find_edge(pv, v) {
                Some(edge) if pp == p => Transfer::Edge { proc: p, edge },
                _ => return Err(format!("step {i}: {pp} {pv} -> {p} {v} is no edge")),
            },
        };
        stack.last_mut().expect("a frame is active").1 = v;
        f(i, t);
    }
    let ok = match exec.end {
        End::Returned => stack.len() == 1 && stack[0].1 == prog.procs[stack[0].0].exit(),
        End::Terminated => stack
            .last()
            .is_some_and(|&(p, v)| prog.callees[p][v] == Some(Callee::Exit)),
        End::Cut => true,
    };
    if exec.end == End::Returned {
        stack.clear();
    }
    if ok {
        Ok(())
    } else {
        Err(format!("end {:?} does not match the last step", exec.end))
    }
}

/// Checks that `exec` is a valid execution of `prog`.
pub fn check_execution(prog: &Program, exec: &Execution) -> Result<(), String> {
    walk(prog, exec, &mut Vec::new(), |_, _| {})
}

/// The trace the instrumented program writes for `exec` under `placements`.
pub fn record(
    prog: &Program,
    placements: &PrimaryMap<ProcId, WitnessPlacement>,
    exec: &Execution,
) -> Vec<Record> {
    let mut out = Vec::new();
    walk(prog, exec, &mut Vec::new(), |_, t| match t {
        Transfer::Start(_) => {}
        Transfer::Edge { proc, edge } => {
            if let Some(w) = placements[proc].witness(edge) {
                out.push(Record::Witness(w));
            }
        }
        Transfer::Call { caller, at, callee } => {
            if prog.callees[caller][at] == Some(Callee::Indirect) {
                out.push(Record::Enter(callee));
            }
        }
    })
    .expect("a valid execution");
    match exec.end {
        End::Terminated => out.push(Record::Terminate),
        End::Returned => out.push(Record::Eof),
        End::Cut => {}
    }
    out
}

/// Per-procedure edge counts of an execution; `exit_root` counts entries
/// into the procedure (the profiling tests' ground truth).
pub fn edge_counts(
    prog: &Program,
    exec: &Execution,
) -> PrimaryMap<ProcId, SecondaryMap<EdgeId, u64>> {
    let mut counts: PrimaryMap<ProcId, SecondaryMap<EdgeId, u64>> = prog
        .procs
        .values()
        .map(|g| SecondaryMap::filled(g.num_edges() + 1, 0))
        .collect();
    walk(prog, exec, &mut Vec::new(), |_, t| match t {
        Transfer::Start(p) | Transfer::Call { callee: p, .. } => {
            counts[p][prog.procs[p].exit_root()] += 1
        }
        Transfer::Edge { proc, edge } => counts[proc][edge] += 1,
    })
    .expect("a valid execution");
    counts
}
