//! Why abstract execution records a value (issue 21, `docs/data.md`
//! "Which values are recorded, and why"): per recorded value of a traced
//! procedure, the reason the register its address needs is unknown there,
//! traced back to where it was lost (a load, a call, the procedure's
//! entry, ...). A measurement, not a decision: the rewriter and the
//! regenerator never read it.
//!
//! Invariant: the values it lists are exactly [`Exec::plan_block`]'s for
//! the registers [`exec::entry_knowledge`] gives (it runs the same
//! interpreter alongside); only the reasons are its own, a forward pass
//! over the same ways in (the first way that loses a register names it).

use iced_x86::Instruction;

use super::exec::{self, Exec, WayIn};
use super::full::Recorded;
use super::returns::Returns;
use super::{AddrExpr, Dst, Gpr, InsnProgram, Op};
use aetrace_format::progdb::{EdgeKindDb, ProcDb};

/// Why a register is unknown (or a value recorded).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Why {
    /// Known.
    Known,
    /// `rsp` itself (a root block's first stack reference, an `alloca`).
    Rsp,
    /// An argument register at the procedure's entry.
    Entry,
    /// Loaded from memory that is not the stack.
    Load,
    /// Loaded from an `rsp`- or `rbp`-based address (a spill reload, a
    /// saved register, a local).
    StackLoad,
    /// A callee-saved register known before a call to a traced procedure
    /// that returns by `ret` (the return point keeps only `rsp`).
    CalleeSaved,
    /// A callee-saved register known before a call whose return point
    /// starts with nothing known (an untraced callee that may run traced
    /// code, an indirect call, ...).
    SavedUntraced,
    /// A caller-saved register after a call (its result, or clobbered).
    CallResult,
    /// A block with a way in that carries nothing (a landing pad, a
    /// `setjmp` return, a return from untraced code), not after a call.
    Root,
    /// An opaque result (arithmetic with memory, `syscall`, vector moves).
    Opaque,
    /// A partial (8- or 16-bit) write.
    Partial,
    /// Register arithmetic the interpreter does not evaluate (32-bit
    /// arithmetic, `imul`, `neg`, ...), its inputs known.
    Arith,
    /// A `rep` string instruction's `rcx` and `rflags`.
    Rep,
    /// `rsp` before a tail jump that may enter a traced entry.
    Anchor,
    /// An address form abstract execution never computes (`fs:`, ...).
    Form,
}

impl Why {
    /// Every reason but `Known`, in the order reports list them.
    pub const ALL: [Why; 14] = [
        Why::Load,
        Why::StackLoad,
        Why::Entry,
        Why::CalleeSaved,
        Why::SavedUntraced,
        Why::CallResult,
        Why::Arith,
        Why::Partial,
        Why::Opaque,
        Why::Rsp,
        Why::Root,
        Why::Rep,
        Why::Anchor,
        Why::Form,
    ];

    /// A short name.
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Known => "known",
            Why::Rsp => "rsp",
            Why::Entry => "entry",
            Why::Load => "load",
            Why::StackLoad => "stack-load",
            Why::CalleeSaved => "callee-saved",
            Why::SavedUntraced => "saved-untraced",
            Why::CallResult => "call-result",
            Why::Root => "root",
            Why::Opaque => "opaque",
            Why::Partial => "partial",
            Why::Arith => "arith",
            Why::Rep => "rep",
            Why::Anchor => "anchor",
            Why::Form => "form",
        }
    }
}

type Regs = [Why; 16];

/// Per block of `p`, per instruction: the reason of each value it records
/// (`blocks`: its decoded blocks in database order, `returns`: the
/// module's; `weights`: per block, how often it ran: where several ways
/// into a block lose a register, the most frequent one names it).
pub fn reasons(
    p: &ProcDb,
    returns: &Returns,
    blocks: &mut [Vec<(Instruction, InsnProgram)>],
    weights: &[u64],
) -> Vec<Vec<Vec<Why>>> {
    let known = exec::entry_knowledge(p, returns, blocks);
    let blocks = &*blocks;
    let ways = exec::ways_in(p, returns, blocks);
    let anchor = |b: usize| p.blocks.get(b).is_some_and(exec::anchors_rsp);
    let n = blocks.len();
    // `Known` at first: no reason yet (a way that has none loses nothing).
    let mut ins: Vec<Regs> = vec![[Why::Known; 16]; n];
    let mut outs: Vec<(Regs, Regs)> = vec![([Why::Known; 16], [Why::Known; 16]); n];
    // Rounds until the reasons settle (bounded: a reason cycle in a loop
    // keeps whichever came first).
    for _ in 0..16 {
        let mut changed = false;
        for b in 0..n {
            let i = block_in(p, b, (&known, &ways, weights), &outs);
            let (_, out) = run(known[b], &i, &blocks[b], anchor(b));
            changed |= i != ins[b] || out != outs[b].1;
            ins[b] = i;
            outs[b] = (end_before_call(known[b], &i, &blocks[b]), out);
        }
        if !changed {
            break;
        }
    }
    (0..n)
        .map(|b| run(known[b], &ins[b], &blocks[b], anchor(b)).0)
        .collect()
}

/// The reasons at the start of block `b`: per register not known there,
/// the most frequent way in that loses it.
fn block_in(
    p: &ProcDb,
    b: usize,
    (known, ways, weights): (&[super::RegSet], &[Vec<WayIn>], &[u64]),
    outs: &[(Regs, Regs)],
) -> Regs {
    let weight = |w: &WayIn| match *w {
        WayIn::Plain(q) | WayIn::Back(q) => weights.get(q as usize).copied().unwrap_or(0),
        _ => weights.get(b).copied().unwrap_or(0),
    };
    let mut r = [Why::Root; 16];
    let is_known = |g: usize| known[b].0 & (1 << g) != 0;
    let callers: Vec<usize> = (p.edges.iter())
        .filter(|e| e.to as usize == b && e.kind == EdgeKindDb::CallReturn)
        .map(|e| e.from as usize)
        .collect();
    for (g, w) in r.iter_mut().enumerate() {
        if is_known(g) {
            *w = Why::Known;
            continue;
        }
        let from = ways[b].iter().filter_map(|way| match *way {
            WayIn::Entry => Some((weight(way), Why::Entry)),
            // A call's result, or what the call block did not know.
            WayIn::Plain(q) | WayIn::Back(q) => Some((weight(way), outs[q as usize].1[g])),
            WayIn::Return(_) => None,
        });
        let best = from
            .filter(|&(_, x)| x != Why::Known)
            .max_by_key(|&(n, _)| n);
        let plain = ways[b].iter().any(|w| matches!(w, WayIn::Plain(_)));
        *w = match best.map(|(_, x)| x) {
            Some(x) => x,
            // Its plain predecessors have no reason yet (a later round).
            None if plain && callers.is_empty() => Why::Known,
            None => match callers.first() {
                Some(&c) => after_call(g, &outs[c].0, ways[b].is_empty()),
                None => Why::Root,
            },
        };
    }
    r
}

/// Register `g` at a call's return point, from its reasons before the call.
fn after_call(g: usize, before: &Regs, root: bool) -> Why {
    const SAVED: [usize; 7] = [3, 4, 5, 12, 13, 14, 15];
    if !SAVED.contains(&g) {
        return Why::CallResult;
    }
    match (before[g], root) {
        (Why::Known, false) => Why::CalleeSaved,
        (Why::Known, true) => Why::SavedUntraced,
        (x, _) => x,
    }
}

/// The reasons before the block's last instruction (its call, if any).
fn end_before_call(known: super::RegSet, i: &Regs, insns: &[(Instruction, InsnProgram)]) -> Regs {
    let n = insns.len().saturating_sub(1);
    run(known, i, &insns[..n], false).1
}

/// Runs a block: per instruction the reasons of its values, and the
/// reasons at its end.
fn run(
    known: super::RegSet,
    i: &Regs,
    insns: &[(Instruction, InsnProgram)],
    anchor: bool,
) -> (Vec<Vec<Why>>, Regs) {
    let mut e = Exec::unknown(0);
    for g in known.iter() {
        e.regs[g.index()] = Some(0);
    }
    let mut why = *i;
    let last = insns.len().wrapping_sub(1);
    let out = (insns.iter().enumerate())
        .map(|(k, (insn, prog))| {
            let before = why;
            let mut plan = Vec::new();
            let mut take = |r| {
                plan.push(r);
                Ok(0)
            };
            if anchor && k == last {
                let _ = e.anchor(&mut take);
            }
            if e.insn(insn, prog, &mut take).is_err() {
                plan.clear();
            }
            for (g, w) in why.iter_mut().enumerate() {
                if e.regs[g].is_some() {
                    *w = Why::Known;
                }
            }
            for u in &prog.updates {
                let (g, partial) = match u.dst {
                    Dst::Full(g) => (g, false),
                    Dst::Partial(g) => (g, true),
                    Dst::Flags => continue,
                };
                why[g.index()] = match (e.regs[g.index()], partial) {
                    (Some(_), _) => Why::Known,
                    (None, true) => Why::Partial,
                    (None, false) => op_why(&before, &u.op, (insn, prog)),
                };
            }
            // A thread constant's value is not one per run (at most one
            // per thread): not counted.
            (plan.iter())
                .filter(|r| !matches!(r, Recorded::Once(_)))
                .map(|r| value_why(&before, prog, *r))
                .collect()
        })
        .collect();
    (out, why)
}

/// The reason of recorded value `r` of an instruction.
fn value_why(before: &Regs, prog: &InsnProgram, r: Recorded) -> Why {
    match r {
        Recorded::Rcx | Recorded::Flags => Why::Rep,
        Recorded::Rsp => Why::Anchor,
        Recorded::Once(_) => Why::CallResult,
        // Recorded at its definition: why it is unknown there.
        Recorded::Reg(g) => before[g.index()],
        Recorded::Addr(k) => match &prog.refs[k].addr {
            a if a.seg != super::Seg::Flat || a.vector_index || a.bit_offset.is_some() => Why::Form,
            a => first_unknown(before, a).unwrap_or(Why::Form),
        },
    }
}

fn first_unknown(before: &Regs, a: &AddrExpr) -> Option<Why> {
    [a.base, a.index]
        .into_iter()
        .flatten()
        .map(|g| match g {
            Gpr::RSP if before[g.index()] != Why::Known => Why::Rsp,
            g => before[g.index()],
        })
        .find(|&w| w != Why::Known)
}

/// Why an update's result is unknown (its inputs' reasons before it).
fn op_why(before: &Regs, op: &Op, (insn, prog): (&Instruction, &InsnProgram)) -> Why {
    match *op {
        Op::Const(_) => Why::Known,
        Op::Copy(r) => before[r.index()],
        Op::Lea(a) => first_unknown(before, &a).unwrap_or(Why::Arith),
        Op::Func { inputs, .. } => (inputs.iter())
            .map(|g| before[g.index()])
            .find(|&w| w != Why::Known)
            .unwrap_or(Why::Arith),
        Op::Load { addr, .. } if matches!(addr.base, Some(Gpr::RSP | Gpr::RBP)) => Why::StackLoad,
        Op::Load { .. } => Why::Load,
        Op::Opaque { .. } if prog.call => Why::CallResult,
        // `forms` calls a 32-bit or narrower load opaque: a load all the same.
        Op::Opaque { .. } if moves(insn) && prog.refs.len() == 1 => op_why(
            before,
            &Op::Load {
                addr: prog.refs[0].addr,
                size: 0,
            },
            (insn, prog),
        ),
        Op::Opaque { .. } => Why::Opaque,
    }
}

fn moves(insn: &Instruction) -> bool {
    use iced_x86::Mnemonic::*;
    matches!(insn.mnemonic(), Mov | Movzx | Movsx | Movsxd)
}
