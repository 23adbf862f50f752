//! The reference regenerator: paper 003's Figure 7 with a procedure stack
//! (Section 4.2), written for clarity. The real, fast regenerator (regen
//! crate) is tested against it.
//!
//! Invariants (given placements that solve `Trace(G, epl)` and have the
//! blocking property in every procedure):
//! - a complete or terminated execution is returned exactly;
//! - for a cut trace, the output's first `certain` steps are a prefix of
//!   the execution, and output and execution are prefixes of one another
//!   (the regenerator follows forced moves until it needs a record the
//!   killed program never wrote; it cannot know where in that forced run
//!   the program died);
//! - a record that cannot occur is an error naming procedure and block.
//!
//! The pending witness (`wit` in Figure 7) is always empty at a call
//! vertex and at EXIT: the blocking property guarantees the witness read at
//! a predicate is consumed before either is reached, so the callee's (or
//! the caller's) records are never misread.

use crate::entity::PrimaryMap;
use crate::error::{Error, Result};
use crate::graph::{BlockId, ProcId, VertexKind};
use crate::program::{Callee, End, Program, Record};
use crate::trace::{Sym, WitnessPlacement, WitnessSets};

/// A regenerated execution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Regenerated {
    /// The (procedure, vertex) of each regenerated step, in order.
    pub steps: Vec<(ProcId, BlockId)>,
    /// How the regenerated execution ended.
    pub end: End,
    /// `steps[..certain]` certainly executed (all of them unless `end` is `Cut`).
    pub certain: usize,
    /// For each record consumed: how many steps had been output when it was
    /// read, and the regenerator's position (procedure, vertex) then, which
    /// is what an error about that record names (after a return the
    /// position is the caller's call vertex, not the last step output).
    pub read_at: Vec<(usize, ProcId, BlockId)>,
}

struct Reader<'a> {
    trace: &'a [Record],
    pos: usize,
    read_at: Vec<(usize, ProcId, BlockId)>,
}

impl Reader<'_> {
    /// The next record, read after `steps` steps at `(proc, pc)`.
    fn next(&mut self, steps: usize, proc: ProcId, pc: BlockId) -> Option<Record> {
        let r = self.trace.get(self.pos).copied();
        if r.is_some() {
            self.pos += 1;
            self.read_at.push((steps, proc, pc));
        }
        r
    }
}

fn done(
    steps: Vec<(ProcId, BlockId)>,
    end: End,
    certain: usize,
    rd: Reader<'_>,
) -> Result<Regenerated> {
    Ok(Regenerated {
        steps,
        end,
        certain,
        read_at: rd.read_at,
    })
}

/// Regenerates the execution that wrote `trace`.
pub fn regenerate(
    prog: &Program,
    placements: &PrimaryMap<ProcId, WitnessPlacement>,
    sets: &PrimaryMap<ProcId, WitnessSets>,
    trace: &[Record],
) -> Result<Regenerated> {
    let mut rd = Reader {
        trace,
        pos: 0,
        read_at: Vec::new(),
    };
    let mut stack: Vec<(ProcId, BlockId)> = Vec::new();
    let (mut p, mut pc) = (prog.main, prog.procs[prog.main].entry());
    let mut out = vec![(p, pc)];
    let mut certain = 1;
    // The pending witness of Figure 7 (EOF included).
    let mut wit: Option<Sym> = None;
    let unexpected = |p, pc, r: Record, pos: usize| Error::UnexpectedRecord {
        proc: p,
        block: pc,
        record: format!("{r:?}"),
        pos: pos - 1,
    };
    loop {
        let g = &prog.procs[p];
        if pc == g.exit() {
            match stack.pop() {
                Some((cp, cv)) => {
                    if let Some(s) = wit {
                        return Err(Error::UnexpectedRecord {
                            proc: p,
                            block: pc,
                            record: format!("pending {s:?} at a return"),
                            pos: rd.pos.saturating_sub(1),
                        });
                    }
                    (p, pc) = (cp, cv)
                }
                None => {
                    if wit != Some(Sym::Eof) {
                        match rd.next(out.len(), p, pc) {
                            None => return done(out, End::Cut, certain, rd),
                            Some(Record::Eof) => {}
                            Some(r) => return Err(unexpected(p, pc, r, rd.pos)),
                        }
                    }
                    if rd.pos < trace.len() {
                        return Err(Error::TrailingRecords {
                            left: trace.len() - rd.pos,
                        });
                    }
                    let certain = out.len();
                    return done(out, End::Returned, certain, rd);
                }
            }
        } else if g.kind(pc) == VertexKind::Call {
            if let Some(s) = wit {
                return Err(Error::UnexpectedRecord {
                    proc: p,
                    block: pc,
                    record: format!("pending {s:?} at a call"),
                    pos: rd.pos.saturating_sub(1),
                });
            }
            let callee = match prog.callee(p, pc) {
                Some(Callee::Direct(q)) => Some(q),
                Some(Callee::Indirect) => match rd.next(out.len(), p, pc) {
                    None => return done(out, End::Cut, certain, rd),
                    Some(Record::Enter(q)) if prog.procs.is_valid(q) => Some(q),
                    Some(r) => return Err(unexpected(p, pc, r, rd.pos)),
                },
                Some(Callee::Exit) => match rd.next(out.len(), p, pc) {
                    None => return done(out, End::Cut, certain, rd),
                    Some(Record::Terminate) if rd.pos == trace.len() => {
                        let certain = out.len();
                        return done(out, End::Terminated, certain, rd);
                    }
                    Some(r) => return Err(unexpected(p, pc, r, rd.pos)),
                },
                Some(Callee::External) | None => None,
            };
            if let Some(q) = callee {
                stack.push((p, pc));
                (p, pc) = (q, prog.procs[q].entry());
                out.push((p, pc));
                if prog.callee(stack[stack.len() - 1].0, stack[stack.len() - 1].1)
                    == Some(Callee::Indirect)
                {
                    // The Enter record proves the callee was entered.
                    certain = out.len();
                }
                continue;
            }
        }
        // Choose pc's successor in procedure p (after a return, pc is the call vertex).
        let g = &prog.procs[p];
        let pl = &placements[p];
        let e = if !g.is_predicate(pc) {
            let Some(&e) = g.succs(pc).first() else {
                return Err(Error::DeadEnd { proc: p, block: pc });
            };
            if let Some(expected) = pl.witness(e) {
                let found = match wit.take() {
                    Some(s) => s,
                    None => match rd.next(out.len(), p, pc) {
                        None => return done(out, End::Cut, certain, rd),
                        Some(Record::Witness(w)) => Sym::W(w),
                        Some(Record::Eof) => Sym::Eof,
                        Some(r) => return Err(unexpected(p, pc, r, rd.pos)),
                    },
                };
                if found != Sym::W(expected) {
                    return Err(Error::WrongWitness {
                        proc: p,
                        block: pc,
                        to: g.edge(e).to,
                        expected,
                        found: format!("{found:?}"),
                    });
                }
            }
            e
        } else {
            let s = match wit {
                Some(s) => s,
                None => match rd.next(out.len(), p, pc) {
                    None => return done(out, End::Cut, certain, rd),
                    Some(Record::Witness(w)) => Sym::W(w),
                    Some(Record::Eof) => Sym::Eof,
                    Some(r) => return Err(unexpected(p, pc, r, rd.pos)),
                },
            };
            let Some(e) = sets[p].choose(g, pc, s) else {
                return Err(Error::BadWitness {
                    proc: p,
                    block: pc,
                    witness: format!("{s:?}"),
                });
            };
            wit = if pl.contains(e) { None } else { Some(s) };
            e
        };
        pc = g.edge(e).to;
        out.push((p, pc));
        if wit.is_none() && pl.contains(e) {
            certain = out.len();
        }
    }
}
