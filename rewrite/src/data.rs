//! `record --data` (issue 21 points 2-3): the VALUE records placed before
//! the instructions of a traced procedure, as `analysis::addr::exec`
//! decides them from the procedure's program database entry (the input
//! the regenerator decides them from again), followed with `--check` by
//! every non-static address in full (`analysis::addr::full`); and the
//! bytes they add between two buffer checks.
//!
//! Invariants: an instruction whose references the table refuses
//! (`xsave`, a gather, ...) records no value, so a run that executes it
//! is refused by the regenerator's walk, which refuses the same
//! instruction at the same point (never a guessed address), and a module
//! that holds one but does not run it records; a block writes at most [`GROUP`] VALUE records
//! between two checks (codegen checks before each group), and the
//! bytes of one group are added to the block's cost in `checks`, so the
//! headroom bound of `docs/runtime.md` section 4 still holds.

use aetrace_analysis::addr::exec::{self, Exec};
use aetrace_analysis::addr::full::{self, Recorded};
use aetrace_analysis::addr::returns::Returns;
use aetrace_analysis::addr::{forms, AddrExpr, Gpr, InsnProgram, Seg};
use aetrace_format::progdb::ProcDb;
use aetrace_runtime::{layout::RecordKind, AddrOperand, Value};
use iced_x86::code_asm::{get_gpr64, rcx, rsp, AsmRegister64};
use iced_x86::{Instruction, InstructionInfoFactory, Register};

use crate::{DataMode, Refusal, Result, Rewrite};

/// VALUE records one buffer check covers.
pub(crate) const GROUP: usize = 32;

/// Fault injection for the checking mode's test: the first address
/// abstract execution records in the procedure this names (its outside
/// entry's `rsp`, when it has one) is recorded 8 bytes off, so `regen` of
/// a `--data --check` trace must stop there.
pub const FAULT_DATA_ENV: &str = "AETRACE_FAULT_DATA_ADDR";

/// Per block, per instruction: the values recorded before it.
pub(crate) type BlockValues = Vec<Vec<Vec<Value>>>;

/// The values of every instruction of `insns` (procedure `proc`, whose
/// database entry is `db`; `returns`: the module's, `addr::returns`), and
/// when its entry starts with `rsp` known, the value its outside-entry
/// stubs record right after their ENTER (`exec::Entered::Outside`).
pub(crate) fn values(
    rw: &Rewrite<'_>,
    proc: &str,
    db: &ProcDb,
    returns: &Returns,
    insns: &[Vec<Instruction>],
) -> Result<(BlockValues, Option<Value>)> {
    let mut info = InstructionInfoFactory::new();
    let mut progs: Vec<Vec<(Instruction, InsnProgram)>> = insns
        .iter()
        .map(|b| {
            b.iter()
                .map(|i| (*i, forms::program(i, &mut info)))
                .collect()
        })
        .collect();
    let known = exec::entry_knowledge(db, returns, &mut progs);
    let entry_rsp = known
        .get(db.entry as usize)
        .is_some_and(|k| k.iter().any(|g| g == Gpr::RSP));
    let mut fault = std::env::var(FAULT_DATA_ENV).is_ok_and(|p| p == proc);
    let entry = entry_rsp.then(|| entry_value(if std::mem::take(&mut fault) { 8 } else { 0 }));
    let values = (progs.iter().zip(known).zip(&db.blocks))
        .map(|((b, k), blk)| {
            let (plans, _) = Exec::plan_block(k, b, exec::anchors_rsp(blk));
            b.iter()
                .zip(plans)
                .map(|((i, prog), plan)| insn_values(rw, proc, (i, prog), plan, &mut fault))
                .collect()
        })
        .collect::<Result<_>>()?;
    Ok((values, entry))
}

/// The value an outside-entry stub records right after its ENTER: the
/// entry's `rsp` (plus `disp`, the checking mode's injected fault). The
/// control-only recording writes it too (format 1.21), so that the
/// debugger has every frame's address (`docs/debug.md`, "Frames' addresses").
pub(crate) fn entry_value(disp: i64) -> Value {
    Value::Addr(AddrOperand {
        fs: false,
        base: Some(rsp),
        index: None,
        disp,
    })
}

/// The values before `insn`: its abstract plan, then with `--check` its
/// full one; `fault`: shift the first abstract address (and clear it).
fn insn_values(
    rw: &Rewrite<'_>,
    proc: &str,
    (insn, prog): (&Instruction, &InsnProgram),
    plan: std::result::Result<Vec<Recorded>, String>,
    fault: &mut bool,
) -> Result<Vec<Value>> {
    let refuse = |why: String| {
        rw.err(Refusal::DataForm {
            at: format!("procedure {proc}: instruction at {:#x} ({insn})", insn.ip()),
            why,
        })
    };
    // An instruction the table cannot model records nothing: the
    // regenerator's walk refuses it when (only if) a run executes it, and
    // the abstract walk fails before the full values would be read
    // (`full::plan` refuses exactly what `Exec::insn` refuses).
    let Ok(mut plan) = plan else {
        return Ok(Vec::new());
    };
    let abstract_len = plan.len();
    if rw.data == DataMode::Check {
        plan.extend(full::plan(insn, prog).map_err(refuse)?);
    }
    plan.into_iter()
        .enumerate()
        .map(|(n, r)| match r {
            Recorded::Rcx => Ok(Value::Reg(rcx)),
            Recorded::Flags => Ok(Value::Flags),
            Recorded::Rsp => Ok(Value::Reg(rsp)),
            Recorded::Once(k) => Ok(Value::Once(k)),
            Recorded::Reg(g) => reg(g)
                .map(Value::Reg)
                .ok_or_else(|| refuse("a register the sequence cannot read".into())),
            Recorded::Addr(k) => {
                let mut op = operand(&prog.refs[k].addr)
                    .ok_or_else(|| refuse("an address the sequence cannot compute".into()))?;
                if *fault && n < abstract_len {
                    op.disp += 8;
                    *fault = false;
                }
                Ok(Value::Addr(op))
            }
        })
        .collect()
}

fn reg(g: Gpr) -> Option<AsmRegister64> {
    let r = Register::RAX as u32 + u32::from(g.0);
    let r = Register::values().find(|x| *x as u32 == r)?;
    get_gpr64(r)
}

fn operand(a: &AddrExpr) -> Option<AddrOperand> {
    Some(AddrOperand {
        fs: match a.seg {
            Seg::Flat => false,
            Seg::Fs => true,
            Seg::Gs => return None,
        },
        base: match a.base {
            Some(b) => Some(reg(b)?),
            None => None,
        },
        index: match a.index {
            Some(i) => Some((reg(i)?, u32::from(a.scale))),
            None => None,
        },
        disp: a.disp as i64,
    })
}

/// Per block: the VALUE bytes a path through it writes between two
/// checks (one group at most, [`GROUP`]).
pub(crate) fn extra_costs(values: &BlockValues) -> Vec<u64> {
    values
        .iter()
        .map(|b| {
            let n = b.iter().map(Vec::len).sum::<usize>().min(GROUP);
            n as u64 * RecordKind::Value.encoded_len()
        })
        .collect()
}
