//! Executing a block's last instruction without single-stepping it, when it
//! is a near branch: `jcc`, `jmp`/`call` (direct, register, memory) and
//! `ret`. The tracer stops on the `int3` at the instruction, computes where
//! it goes from the registers (and, for `call`/`ret`/memory operands, one
//! memory access), and moves the thread there. The breakpoint byte never
//! leaves memory, so no other thread can run past it (the breakpoint race of
//! step-over), and each block costs one stop instead of two.
//!
//! Invariant: [`plan`] returns `None` for anything it does not model exactly
//! (far or segment-relative operands, `loop`/`jrcxz`, 32-bit addressing,
//! `int`, `syscall`, `rep`, non-branches); the tracer single-steps those.
//! The result is checked against the CPU by the tests: the emulated run's
//! block sequence must equal lackey's.

use iced_x86::{ConditionCode, FlowControl, Instruction, Mnemonic, OpKind, Register};

use crate::sys::{Mem, Regs};
use crate::Error;

/// What the emulation of one instruction needs from memory.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Conditional or direct jump; no memory.
    Jump,
    /// Direct call: push the return address.
    Call,
    /// `ret` / `ret imm16`.
    Ret,
    /// Indirect `jmp` through a register or memory.
    JumpIndirect,
    /// Indirect `call` through a register or memory.
    CallIndirect,
}

/// Whether (and how) `insn` can be emulated.
pub fn plan(insn: &Instruction) -> Option<Plan> {
    if insn.segment_prefix() != Register::None {
        return None;
    }
    match insn.flow_control() {
        FlowControl::ConditionalBranch if insn.is_jcc_short_or_near() => Some(Plan::Jump),
        FlowControl::UnconditionalBranch if insn.is_jmp_short_or_near() => Some(Plan::Jump),
        FlowControl::Call if insn.is_call_near() => Some(Plan::Call),
        FlowControl::Return if insn.mnemonic() == Mnemonic::Ret => Some(Plan::Ret),
        FlowControl::IndirectBranch if insn.is_jmp_near_indirect() && operand_ok(insn) => {
            Some(Plan::JumpIndirect)
        }
        FlowControl::IndirectCall if insn.is_call_near_indirect() && operand_ok(insn) => {
            Some(Plan::CallIndirect)
        }
        _ => None,
    }
}

fn operand_ok(insn: &Instruction) -> bool {
    match insn.op0_kind() {
        OpKind::Register => insn.op0_register().is_gpr64(),
        OpKind::Memory => {
            let gpr_or_none = |r: Register| r == Register::None || r.is_gpr64();
            insn.memory_size().size() == 8
                && (insn.is_ip_rel_memory_operand()
                    || (gpr_or_none(insn.memory_base()) && gpr_or_none(insn.memory_index())))
        }
        _ => false,
    }
}

fn gpr(regs: &Regs, r: Register) -> u64 {
    match r {
        Register::RAX => regs.rax,
        Register::RBX => regs.rbx,
        Register::RCX => regs.rcx,
        Register::RDX => regs.rdx,
        Register::RSI => regs.rsi,
        Register::RDI => regs.rdi,
        Register::RBP => regs.rbp,
        Register::RSP => regs.rsp,
        Register::R8 => regs.r8,
        Register::R9 => regs.r9,
        Register::R10 => regs.r10,
        Register::R11 => regs.r11,
        Register::R12 => regs.r12,
        Register::R13 => regs.r13,
        Register::R14 => regs.r14,
        Register::R15 => regs.r15,
        _ => 0,
    }
}

fn condition(cc: ConditionCode, flags: u64) -> bool {
    let f = |bit: u32| flags >> bit & 1 == 1;
    let (cf, pf, zf, sf, of) = (f(0), f(2), f(6), f(7), f(11));
    match cc {
        ConditionCode::o => of,
        ConditionCode::no => !of,
        ConditionCode::b => cf,
        ConditionCode::ae => !cf,
        ConditionCode::e => zf,
        ConditionCode::ne => !zf,
        ConditionCode::be => cf || zf,
        ConditionCode::a => !cf && !zf,
        ConditionCode::s => sf,
        ConditionCode::ns => !sf,
        ConditionCode::p => pf,
        ConditionCode::np => !pf,
        ConditionCode::l => sf != of,
        ConditionCode::ge => sf == of,
        ConditionCode::le => zf || sf != of,
        ConditionCode::g => !zf && sf == of,
        ConditionCode::None => true,
    }
}

/// The indirect target of `insn` (decoded at link time, `base` added to
/// module-relative addresses).
fn indirect_target(insn: &Instruction, base: u64, regs: &Regs, mem: &Mem) -> Result<u64, Error> {
    if insn.op0_kind() == OpKind::Register {
        return Ok(gpr(regs, insn.op0_register()));
    }
    let addr = if insn.is_ip_rel_memory_operand() {
        insn.ip_rel_memory_address().wrapping_add(base)
    } else {
        gpr(regs, insn.memory_base())
            .wrapping_add(
                gpr(regs, insn.memory_index()).wrapping_mul(u64::from(insn.memory_index_scale())),
            )
            .wrapping_add(insn.memory_displacement64())
    };
    mem.read_u64(addr)
}

/// Executes `insn` (at runtime address `insn.ip() + base`) on `regs` and
/// `mem`: afterwards `regs.rip` is where the thread goes next.
pub fn run(
    p: Plan,
    insn: &Instruction,
    base: u64,
    regs: &mut Regs,
    mem: &Mem,
) -> Result<(), Error> {
    let next = insn.next_ip().wrapping_add(base);
    let push = |regs: &mut Regs, v: u64| -> Result<(), Error> {
        let sp = regs.rsp.wrapping_sub(8);
        mem.write(sp, &v.to_le_bytes())?;
        regs.rsp = sp;
        Ok(())
    };
    regs.rip = match p {
        Plan::Jump => {
            if condition(insn.condition_code(), regs.eflags) {
                insn.near_branch_target().wrapping_add(base)
            } else {
                next
            }
        }
        Plan::Call => {
            push(regs, next)?;
            insn.near_branch_target().wrapping_add(base)
        }
        Plan::Ret => {
            let to = mem.read_u64(regs.rsp)?;
            let extra = if insn.op_count() == 1 {
                u64::from(insn.immediate16())
            } else {
                0
            };
            regs.rsp = regs.rsp.wrapping_add(8 + extra);
            to
        }
        Plan::JumpIndirect => indirect_target(insn, base, regs, mem)?,
        Plan::CallIndirect => {
            // The operand is read before the push (`call [rsp+8]` sees the
            // old stack pointer).
            let to = indirect_target(insn, base, regs, mem)?;
            push(regs, next)?;
            to
        }
    };
    Ok(())
}

/// Whether the first instruction of a block under an entry trap can be
/// executed by emulation (`push r64`, `endbr64`, `nop`): the common
/// procedure prologues, which saves the single step at each call from
/// traced code into traced code. None of them reads or writes flags.
pub fn first_ok(insn: &Instruction) -> bool {
    match insn.mnemonic() {
        Mnemonic::Push => insn.op0_kind() == OpKind::Register && insn.op0_register().is_gpr64(),
        Mnemonic::Endbr64 | Mnemonic::Nop => true,
        _ => false,
    }
}

/// Executes a `first_ok` instruction at runtime `regs.rip`.
pub fn run_first(insn: &Instruction, regs: &mut Regs, mem: &Mem) -> Result<(), Error> {
    if insn.mnemonic() == Mnemonic::Push {
        let sp = regs.rsp.wrapping_sub(8);
        mem.write(sp, &gpr(regs, insn.op0_register()).to_le_bytes())?;
        regs.rsp = sp;
    }
    regs.rip = regs.rip.wrapping_add(insn.len() as u64);
    Ok(())
}
