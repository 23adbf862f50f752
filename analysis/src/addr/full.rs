//! What the checking mode of issue 21 (`aetrace record --data --check`)
//! records before each instruction, and how those values give back every
//! reference lackey counts: the one table the rewriter (which places the
//! VALUE records) and the regenerator (which reads them) share, so the two
//! cannot disagree on what a value means (drmemtrace's issue #4403 came
//! from two such analyses).
//!
//! Per instruction, in order: for a `rep` string instruction its `rcx`
//! and `rflags` (the iteration count and the direction), then the address
//! of each reference that is not static, taken before the instruction
//! (for a `rep`: its first iteration's). A static reference (rip-relative
//! or absolute) is never recorded: the instruction gives it.
//!
//! Refused, never guessed: `gs:` references (the runtime's own segment),
//! `bt` with a register bit offset, gathers (a vector index), references
//! whose size depends on the CPU (`xsave`), `repe`/`repne` compares (their
//! count depends on the data), and `pop` into an `rsp`-relative operand
//! (its address is taken after the pop).

use iced_x86::{Instruction, InstructionInfoFactory, Mnemonic, OpKind, Register};

use super::{Gpr, InsnProgram, MemRef, Repeat, Seg};

/// One value recorded before an instruction.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// The effective address of reference `k` of the instruction's
    /// [`InsnProgram::refs`].
    Addr(usize),
    /// `rcx` (a `rep` string instruction's iteration count).
    Rcx,
    /// `rflags` (its direction flag, bit 10).
    Flags,
    /// `rsp` before the instruction (abstract execution's anchor before a
    /// jump into a procedure entry, `exec::anchors_rsp`).
    Rsp,
    /// A register before the instruction: the instruction before it
    /// defined it, unknown, and it feeds addresses (`InsnProgram::before`).
    Reg(Gpr),
    /// `rax` at a return point of a call to the thread constant `k`
    /// ([`super::returns::THREAD_CONSTANTS`], `InsnProgram::once`):
    /// recorded by the thread's first such return only (the runtime's
    /// slot word `ONCE`), the regenerator keeping it per thread.
    Once(u8),
}

/// The direction flag's bit in `rflags`.
pub const DF: u64 = 1 << 10;

/// A static reference's address: the link-time address of a rip-relative
/// one (`module` true: add the module's load bias), or an absolute one.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Static {
    /// The address the instruction names.
    pub addr: u64,
    /// Relative to the module (rip-relative).
    pub module: bool,
}

/// The address of `r` when the instruction alone gives it.
pub fn static_addr(insn: &Instruction, r: &MemRef) -> Option<Static> {
    let a = &r.addr;
    (a.seg == Seg::Flat && a.base.is_none() && a.index.is_none() && a.bit_offset.is_none()).then(
        || Static {
            addr: a.disp,
            module: insn.is_ip_rel_memory_operand(),
        },
    )
}

/// The values recorded before `insn` (whose program is `prog`), or why its
/// references cannot be recorded exactly.
pub fn plan(insn: &Instruction, prog: &InsnProgram) -> Result<Vec<Recorded>, String> {
    refusal(insn, prog)?;
    let mut out = Vec::new();
    if prog.refs.iter().any(|r| r.repeat == Repeat::Rcx) {
        out.extend([Recorded::Rcx, Recorded::Flags]);
    }
    for (k, r) in prog.refs.iter().enumerate() {
        if static_addr(insn, r).is_none() {
            out.push(Recorded::Addr(k));
        }
    }
    Ok(out)
}

/// Whether a fault `insn` (program `prog`) raised is followed by its
/// `rcx`, `rsi` and `rdi` at the fault (format 1.13, `--data`): a `rep`
/// string instruction that runs `rcx` times (`movs`, `stos`, `lods`,
/// `ins`, `outs`), which may fault after some of its iterations. The
/// runtime tells the same instructions by their bytes.
pub fn registers_at_fault(prog: &InsnProgram) -> bool {
    prog.refs.iter().any(|r| r.repeat == Repeat::Rcx)
}

/// One decoded instruction with its references and the values recorded
/// before it: what a reader of a data trace needs per instruction (the
/// data output, the debugger's watchpoints).
pub struct Planned {
    /// The instruction (its ip module-relative, as in the file).
    pub insn: Instruction,
    /// Its references.
    pub prog: InsnProgram,
    /// The values recorded before it.
    pub plan: Vec<Recorded>,
}

impl Planned {
    /// `insn` with its references and plan, or why they cannot be
    /// recorded (naming the instruction).
    pub fn new(insn: Instruction, info: &mut InstructionInfoFactory) -> Result<Planned, String> {
        let prog = super::forms::program(&insn, info);
        let plan = plan(&insn, &prog)
            .map_err(|why| format!("instruction at {:#x} ({insn}): {why}", insn.ip()))?;
        Ok(Planned { insn, prog, plan })
    }

    /// The run-time address of each reference (a `rep`'s first
    /// iteration), from the instruction or from its recorded values
    /// `vals`; `base` is the module's load bias.
    pub fn addresses(&self, vals: &[u64], base: u64) -> Vec<u64> {
        let mut out: Vec<u64> = self
            .prog
            .refs
            .iter()
            .map(|r| match static_addr(&self.insn, r) {
                Some(s) if s.module => base.wrapping_add(s.addr),
                Some(s) => s.addr,
                None => 0,
            })
            .collect();
        for (p, &v) in self.plan.iter().zip(vals) {
            if let Recorded::Addr(k) = *p {
                out[k] = v;
            }
        }
        out
    }
}

/// Why the references of `insn` (its program `prog`) cannot be recorded
/// exactly, if so: checked before any of its values is read, so a walk
/// refuses it the same way whatever was recorded around it.
pub fn refusal(insn: &Instruction, prog: &InsnProgram) -> Result<(), String> {
    if prog.refs.iter().any(|r| r.repeat == Repeat::UntilData) {
        return Err("a repe/repne compare stops on the data: its count is not recorded".into());
    }
    prog.refs.iter().try_for_each(|r| refuse(insn, r))
}

/// Why reference `r` of `insn` cannot be recorded exactly, if so.
pub fn refuse(insn: &Instruction, r: &MemRef) -> Result<(), String> {
    let why = if r.addr.seg == Seg::Gs {
        "a gs: reference (the runtime owns gs)"
    } else if r.addr.bit_offset.is_some() {
        "a bit offset in a register"
    } else if r.addr.vector_index {
        "a gather or scatter (vector index)"
    } else if r.size == 0 {
        "a reference whose size the CPU decides"
    } else if insn.mnemonic() == Mnemonic::Pop
        && insn.op0_kind() == OpKind::Memory
        && insn.memory_base() == Register::RSP
    {
        "a pop into an rsp-relative operand"
    } else {
        return Ok(());
    };
    Err(why.into())
}
