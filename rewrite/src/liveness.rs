//! Register and flags liveness of one procedure, for cheap instrumentation
//! (design decision 5): a witness needs a dead scratch register, and must
//! save the arithmetic flags only when they are live and step over the red
//! zone only when it may hold data (`docs/runtime.md` sections 3-4).
//!
//! Classic backward data flow (Aho, Lam, Sethi & Ullman 9.2.5; no paper of
//! ours): `live_before(i) = gen(i) | (live_after(i) & !kill(i))`, each block
//! summarised as one `(gen, kill)` pair, iterated to a fixed point over the
//! blocks in post-order, then expanded once per instruction. Use:
//! [`decode_blocks`], [`analyze`], then [`Liveness::site`] of
//! [`Liveness::live_in`] (block start), [`Liveness::live_before`] (before an
//! instruction) or [`Liveness::live_on_edge`] (an edge's stub).
//!
//! Soundness comes first: a register wrongly called dead corrupts the
//! traced program, one wrongly called live only costs a push/pop. So:
//! - a write kills a register only when it writes all 64 bits (or 32 bits,
//!   which zero-extend); 8/16-bit and conditional writes never kill, nor
//!   do writes that depend on the CPU (`rdssp` is a NOP without shadow
//!   stacks, and libgcc's unwinder relies on it; `tzcnt`/`lzcnt` are
//!   `bsf`/`bsr` on older CPUs);
//! - an instruction that accesses memory through an operand (iced: a
//!   memory or string operand whose access is not `NoMemAccess`, so not
//!   `lea`, `nop [m]` or a prefetch) kills nothing, registers nor flags:
//!   it may fault, and a handler may skip it (`REG_RIP +=` its length,
//!   `traces/skip_fault.c`), so what it would write keeps its value
//!   natively, and instrumentation before it must not clobber it (a
//!   VALUE's `lahf; seto al` did, before a load into rax; a skipped `cmp
//!   [m], x` leaves the flags before it, so they are live there). Only
//!   outputs written without being read lose anything by this (one also
//!   read is live before anyway). Implicit stack accesses (`push`, `pop`,
//!   calls, returns) keep their kills: a handler skipping one would leave
//!   the stack pointer wrong, which no program does;
//! - a flag is killed only by an unconditional write (written, cleared, set,
//!   undefined), never by a shift or rotate whose count may be zero;
//! - `syscall`, `int`, `sysenter` use everything; an undecodable
//!   instruction or a far call makes the whole procedure live;
//! - calls use the argument registers, `r10` (static chain) and every
//!   callee-saved register (an exception thrown by the callee reaches a
//!   landing pad of this procedure with the callee-saved registers as they
//!   were at the call, and landing pads are not CFG successors); a call
//!   into this module kills nothing, because gcc's
//!   `-fipa-ra` (on at -O2) lets a caller keep values in caller-saved
//!   registers across a call to a local function known not to clobber them;
//!   calls through the PLT or a pointer follow the SysV ABI and kill the
//!   caller-saved registers, except TLS descriptor calls (`call [rax]`),
//!   which preserve all but rax;
//! - for the same reason a return keeps live, besides the SysV results and
//!   callee-saved registers, every GPR (and the flags) the procedure never writes
//!   ([`Liveness::may_write`]; this assumes a procedure is one compiled
//!   function, its `.cold` part included, which is how gcc computes the
//!   clobber set its callers rely on);
//! - a tail call, a fall-through into another procedure, an unresolved
//!   indirect jump and a block without edges keep everything live, flags
//!   included.
//!
//! Each of these rules is needed: the `tests::clobber` end-to-end test
//! (garbage in every register called dead, under ptrace) breaks real
//! programs (Debian's libbz2, libgcc's unwinder, gcc -O2 test programs)
//! when any one is dropped.
//!
//! Invariants: `before[b]` has one more entry than block `b` has
//! instructions, the last being the block's live-out; `before[b][0]` is its
//! live-in; every set is within [`RegSet::ALL`].

use aetrace_graph::{BlockId, EdgeId, EntityRef};
use aetrace_runtime::{FlagsSave, Site};
use iced_x86::code_asm::{self, AsmRegister64};
use iced_x86::{
    Code, Instruction, InstructionInfo, InstructionInfoFactory, Mnemonic, OpAccess, OpKind,
    Register, RflagsBits,
};

use crate::error::{Error, Refusal, Result};
use aetrace_analysis::cfg::{CallKind, Cfg, EdgeKind, JumpResolution};
use aetrace_analysis::elf::Module;

/// The 16 GPRs (bit i = `Register::RAX + i` in the 64-bit order rax rcx rdx
/// rbx rsp rbp rsi rdi r8..r15) plus the six arithmetic flags (bits 16..22:
/// CF PF AF ZF SF OF).
#[derive(Copy, Clone, PartialEq, Eq, Debug, Default)]
pub struct RegSet(pub u32);

const GPRS: u32 = 0xFFFF;
const FLAG_SHIFT: u32 = 16;
/// iced's flag bits in our order CF PF AF ZF SF OF.
const ICED_FLAGS: [u32; 6] = [
    RflagsBits::CF,
    RflagsBits::PF,
    RflagsBits::AF,
    RflagsBits::ZF,
    RflagsBits::SF,
    RflagsBits::OF,
];

impl RegSet {
    /// Nothing live.
    pub const EMPTY: RegSet = RegSet(0);
    /// Every GPR and every flag.
    pub const ALL: RegSet = RegSet((1 << 22) - 1);
    /// Every GPR, no flag.
    pub const ALL_GPRS: RegSet = RegSet(GPRS);
    /// All six arithmetic flags.
    pub const FLAGS: RegSet = RegSet(0x3F << FLAG_SHIFT);

    /// The set holding the full register of `r` (empty for non-GPRs).
    pub fn gpr(r: Register) -> RegSet {
        let f = r.full_register();
        if f.is_gpr64() {
            RegSet(1 << (f as u32 - Register::RAX as u32))
        } else {
            RegSet::EMPTY
        }
    }

    /// The set of the given registers.
    pub fn gprs(rs: &[Register]) -> RegSet {
        rs.iter().fold(RegSet::EMPTY, |s, &r| s | RegSet::gpr(r))
    }

    /// The flags of an iced `RflagsBits` mask (other bits are ignored).
    pub fn from_iced_flags(bits: u32) -> RegSet {
        let mut s = 0;
        for (i, f) in ICED_FLAGS.iter().enumerate() {
            if bits & f != 0 {
                s |= 1 << (FLAG_SHIFT + i as u32);
            }
        }
        RegSet(s)
    }

    /// Whether the full register of `r` is in the set.
    pub fn has_gpr(self, r: Register) -> bool {
        let g = RegSet::gpr(r);
        g.0 != 0 && self.0 & g.0 == g.0
    }

    /// Whether any arithmetic flag is in the set.
    pub fn flags_live(self) -> bool {
        self.0 & RegSet::FLAGS.0 != 0
    }

    /// Whether bit `i` (a GPR index 0..16 or a flag 16..22) is in the set.
    pub fn has_bit(self, i: u32) -> bool {
        self.0 & (1 << i) != 0
    }
}

impl std::ops::BitOr for RegSet {
    type Output = RegSet;
    fn bitor(self, o: RegSet) -> RegSet {
        RegSet(self.0 | o.0)
    }
}

impl std::ops::BitOrAssign for RegSet {
    fn bitor_assign(&mut self, o: RegSet) {
        self.0 |= o.0;
    }
}

impl std::ops::BitAnd for RegSet {
    type Output = RegSet;
    fn bitand(self, o: RegSet) -> RegSet {
        RegSet(self.0 & o.0)
    }
}

impl std::ops::Not for RegSet {
    type Output = RegSet;
    fn not(self) -> RegSet {
        RegSet(!self.0 & RegSet::ALL.0)
    }
}

impl std::fmt::Display for RegSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const NAMES: [&str; 22] = [
            "rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi", "r8", "r9", "r10", "r11",
            "r12", "r13", "r14", "r15", "cf", "pf", "af", "zf", "sf", "of",
        ];
        let names: Vec<&str> = (0..22)
            .filter(|&i| self.has_bit(i))
            .map(|i| NAMES[i as usize])
            .collect();
        write!(f, "{{{}}}", names.join(" "))
    }
}

use Register::{CL, R10, R11, R12, R13, R14, R15, R8, R9, RAX, RBP, RBX, RCX, RDI, RDX, RSI, RSP};

/// SysV argument registers, plus `r10` (static chain of nested functions)
/// and `rax` (vector-register count of variadic calls).
const ARGS: &[Register] = &[RDI, RSI, RDX, RCX, R8, R9, RAX, R10];
/// SysV callee-saved registers (and `rsp`).
const CALLEE_SAVED: &[Register] = &[RBX, RSP, RBP, R12, R13, R14, R15];
/// SysV caller-saved GPRs.
const CALLER_SAVED: &[Register] = &[RAX, RCX, RDX, RSI, RDI, R8, R9, R10, R11];
/// Scratch preference (`docs/runtime.md`: never rsp, rbp, r12, r13).
const SCRATCH_ORDER: &[(Register, AsmRegister64)] = &[
    (RAX, code_asm::rax),
    (RCX, code_asm::rcx),
    (RDX, code_asm::rdx),
    (RSI, code_asm::rsi),
    (RDI, code_asm::rdi),
    (R8, code_asm::r8),
    (R9, code_asm::r9),
    (R10, code_asm::r10),
    (R11, code_asm::r11),
    (RBX, code_asm::rbx),
    (R14, code_asm::r14),
    (R15, code_asm::r15),
];

/// SysV: live after a return (results and callee-saved registers).
const RETURNED: &[Register] = &[RAX, RDX, RSP, RBX, RBP, R12, R13, R14, R15];

/// Live at the end of an edge to EXIT, by the edge's kind; `may_write` are
/// the GPRs and flags the procedure may write (see [`Liveness::may_write`]).
fn exit_set(kind: EdgeKind, may_write: RegSet) -> RegSet {
    match kind {
        // A caller compiled with `-fipa-ra` may keep values in any register
        // this procedure (and what it calls) never writes, the flags too
        // (gcc's compare elimination reuses flags across such a call).
        EdgeKind::Return => RegSet::gprs(RETURNED) | (RegSet::ALL & !may_write),
        // Another procedure, or an unresolved indirect jump, takes over.
        // Flags too: a fall-through or a jump into hand-written code may
        // read them.
        EdgeKind::TailCall => RegSet::ALL,
        // After a call that never returns the unwinder may still restore
        // the callee-saved registers into a landing pad.
        EdgeKind::NoReturn => RegSet::gprs(CALLEE_SAVED),
        EdgeKind::Halt => RegSet::gpr(RSP),
        EdgeKind::FallThrough
        | EdgeKind::Taken
        | EdgeKind::JumpTable
        | EdgeKind::CallReturn
        | EdgeKind::Resume => {
            debug_assert!(false, "{kind:?} is not an exit kind");
            RegSet::ALL
        }
    }
}

/// What one instruction does to liveness:
/// `live_before = gen | (live_after & !kill)`; `writes` are the GPRs and
/// flags it may change in any way (partly, conditionally, or in a callee).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Effect {
    gen: RegSet,
    kill: RegSet,
    writes: RegSet,
}

/// The effect of `insn` as far as iced's instruction info tells: register
/// uses and full writes, flag reads and unconditional writes.
fn plain_effect(f: &mut InstructionInfoFactory, insn: &Instruction) -> Effect {
    let mut gen = RegSet::EMPTY;
    let mut kill = RegSet::EMPTY;
    let mut writes = RegSet::EMPTY;
    let info = f.info(insn);
    for u in info.used_registers() {
        let r = u.register();
        if matches!(
            u.access(),
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        ) {
            writes |= RegSet::gpr(r);
        }
        match u.access() {
            OpAccess::Read | OpAccess::CondRead => gen |= RegSet::gpr(r),
            OpAccess::ReadWrite | OpAccess::ReadCondWrite => gen |= RegSet::gpr(r),
            // A 32-bit write zero-extends: the whole register is new.
            OpAccess::Write if r.is_gpr64() || r.is_gpr32() => kill |= RegSet::gpr(r),
            OpAccess::Write | OpAccess::CondWrite | OpAccess::None | OpAccess::NoMemAccess => {}
        }
    }
    gen |= RegSet::from_iced_flags(insn.rflags_read());
    writes |= RegSet::from_iced_flags(insn.rflags_modified());
    if !count_may_be_zero(insn) {
        kill |= RegSet::from_iced_flags(insn.rflags_modified());
    }
    if may_be_nop(insn) || may_fault(info, insn) {
        kill = RegSet::EMPTY;
    }
    // A register both read and written is live before: gen wins.
    Effect { gen, kill, writes }
}

/// Instructions whose register write depends on the CPU: `rdssp` is a NOP
/// without shadow stacks (libgcc's unwinder relies on it: `rdsspq rax`
/// leaves rax alone), `tzcnt`/`lzcnt` run as `bsf`/`bsr` (destination
/// unchanged for a zero source) on CPUs without BMI1/LZCNT.
fn may_be_nop(insn: &Instruction) -> bool {
    matches!(
        insn.mnemonic(),
        Mnemonic::Rdsspd | Mnemonic::Rdsspq | Mnemonic::Tzcnt | Mnemonic::Lzcnt
    )
}

/// An operand that accesses memory (explicit, or a string instruction's),
/// which may fault where a handler skips the instruction; iced calls the
/// operand of `lea`, `nop [m]` and prefetches `NoMemAccess`.
fn may_fault(info: &InstructionInfo, insn: &Instruction) -> bool {
    use OpKind::*;
    (0..insn.op_count()).any(|k| {
        matches!(
            insn.op_kind(k),
            Memory
                | MemorySegSI
                | MemorySegESI
                | MemorySegRSI
                | MemorySegDI
                | MemorySegEDI
                | MemorySegRDI
                | MemoryESDI
                | MemoryESEDI
                | MemoryESRDI
        ) && info.op_access(k) != OpAccess::NoMemAccess
    })
}

/// Shifts and rotates leave the flags alone when the masked count is zero.
fn count_may_be_zero(insn: &Instruction) -> bool {
    use Mnemonic::*;
    if !matches!(
        insn.mnemonic(),
        Shl | Sal | Shr | Sar | Rol | Ror | Rcl | Rcr | Shld | Shrd
    ) {
        return false;
    }
    let last = insn.op_count() - 1;
    match insn.op_kind(last) {
        OpKind::Immediate8 => {
            let mask = if insn.op_register(0).size() == 8 || insn.memory_size().size() == 8 {
                63
            } else {
                31
            };
            u32::from(insn.immediate8()) & mask == 0
        }
        // A count in CL may be zero (so may `shl cl, 1` look: harmless).
        OpKind::Register if insn.op_register(last) == CL => true,
        _ => false,
    }
}

/// A TLS descriptor call (`lea rax, [rip+x@TLSDESC]; call [rax]`, gcc's
/// `-mtls-dialect=gnu2`): the resolver preserves every register but rax,
/// and gcc keeps values in caller-saved registers across it.
fn is_tlsdesc_call(insn: &Instruction) -> bool {
    insn.is_call_near_indirect()
        && insn.op0_kind() == OpKind::Memory
        && insn.memory_base() == RAX
        && insn.memory_index() == Register::None
        && insn.memory_displacement64() == 0
}

/// The effect of a `call` whose call site has kind `kind` (`None`: no call
/// site recorded, treated as a call into this module).
fn call_effect(insn: &Instruction, plain: Effect, kind: Option<CallKind>) -> Effect {
    let gen = plain.gen | RegSet::gprs(ARGS) | RegSet::gprs(CALLEE_SAVED);
    match kind {
        // (Also a virtual call through slot 0: only more conservative.)
        _ if is_tlsdesc_call(insn) => Effect {
            gen,
            kill: RegSet::gpr(RAX),
            writes: plain.writes | RegSet::gpr(RAX),
        },
        Some(CallKind::Plt) | Some(CallKind::Indirect) | Some(CallKind::Syscall) => Effect {
            gen,
            kill: RegSet::gprs(CALLER_SAVED),
            writes: plain.writes | RegSet::gprs(CALLER_SAVED) | RegSet::FLAGS,
        },
        // `-fipa-ra`: the caller may keep caller-saved values across, and
        // the callee's own writes are unknown here (so none are assumed,
        // which keeps more registers live at this procedure's returns).
        Some(CallKind::Direct) | None => Effect {
            gen,
            kill: RegSet::EMPTY,
            writes: plain.writes,
        },
    }
}

/// Whether `insn` cannot be modelled: it makes the whole procedure live.
fn unmodelled(insn: &Instruction) -> bool {
    insn.code() == Code::INVALID || insn.is_call_far() || insn.is_call_far_indirect()
}

/// A near call (iced's flow control also calls `syscall` a call).
fn is_call(insn: &Instruction) -> bool {
    insn.is_call_near() || insn.is_call_near_indirect()
}

/// The effect of instruction `insn`, the last of its block when `call_kind`
/// is given (the block's call site).
fn effect(
    f: &mut InstructionInfoFactory,
    insn: &Instruction,
    call_kind: Option<CallKind>,
) -> Effect {
    let plain = plain_effect(f, insn);
    if is_trap(insn) {
        // A signal handler sees (and may print) every register and the
        // flags in its `ucontext`, and may resume the thread after the trap.
        Effect {
            gen: RegSet::ALL,
            kill: RegSet::EMPTY,
            writes: plain.writes,
        }
    } else if matches!(
        insn.mnemonic(),
        Mnemonic::Syscall | Mnemonic::Sysenter | Mnemonic::Int | Mnemonic::Int1 | Mnemonic::Into
    ) {
        // The kernel returns in rax and clobbers rcx, r11.
        Effect {
            gen: RegSet::ALL,
            kill: RegSet::EMPTY,
            writes: plain.writes | RegSet::gprs(&[RAX, RCX, R11]),
        }
    } else if insn.is_call_near() && insn.near_branch_target() == insn.next_ip() {
        // `call next` (get the pc) is a push, not a call.
        plain
    } else if is_call(insn) {
        call_effect(insn, plain, call_kind)
    } else {
        plain
    }
}

/// Whether `insn` raises a signal by design (`int3`, `ud2`, `hlt` in user
/// mode, ...) after which a handler may let the thread go on.
fn is_trap(insn: &Instruction) -> bool {
    matches!(
        insn.mnemonic(),
        Mnemonic::Int3 | Mnemonic::Ud0 | Mnemonic::Ud1 | Mnemonic::Ud2 | Mnemonic::Hlt
    )
}

/// Liveness facts of one procedure.
#[derive(Debug)]
pub struct Liveness {
    /// Per block: live before each instruction, then the live-out.
    before: Vec<Vec<RegSet>>,
    red_zone: bool,
    may_write: RegSet,
}

/// Decodes the instructions of every block of `cfg` from `module`, in the
/// form [`analyze`] takes.
pub fn decode_blocks(module: &Module, cfg: &Cfg) -> Result<Vec<Vec<Instruction>>> {
    use aetrace_analysis::addr::DecodeError;
    aetrace_analysis::addr::decode_blocks(module, cfg).map_err(|e| Error::Rewrite {
        path: module.path.clone(),
        what: match e {
            DecodeError::NoBytes { block, start } => Refusal::BlockBytes { block, start },
            DecodeError::Mismatch { block, at } => Refusal::BlockDecode { block, at },
        },
    })
}

/// Blocks in post-order of a depth-first search from the entry, then from
/// any block it did not reach (secondary entries), successors first.
fn post_order(cfg: &Cfg, succs: &[Vec<BlockId>]) -> Vec<usize> {
    let n = cfg.blocks.len();
    let mut seen = vec![false; n];
    let mut order = Vec::with_capacity(n);
    let roots = std::iter::once(cfg.entry.index()).chain(0..n);
    for root in roots {
        if seen[root] {
            continue;
        }
        seen[root] = true;
        let mut stack = vec![(root, 0usize)];
        while let Some(top) = stack.last_mut() {
            let (b, next) = *top;
            if let Some(s) = succs[b].get(next) {
                top.1 += 1;
                let s = s.index();
                if s < n && !seen[s] {
                    seen[s] = true;
                    stack.push((s, 0));
                }
            } else {
                order.push(b);
                stack.pop();
            }
        }
    }
    debug_assert_eq!(order.len(), n);
    order
}

/// The call-site kind of each block's last instruction, if it has one.
fn call_kinds(cfg: &Cfg) -> Vec<Option<CallKind>> {
    let mut kinds = vec![None; cfg.blocks.len()];
    for c in cfg.calls.iter().filter(|c| !c.tail) {
        kinds[c.block.index()] = Some(c.kind);
    }
    kinds
}

/// The effect of every instruction; a block's call site belongs to its
/// last instruction.
fn effects(cfg: &Cfg, insns: &[Vec<Instruction>]) -> Vec<Vec<Effect>> {
    let mut factory = InstructionInfoFactory::new();
    let kinds = call_kinds(cfg);
    insns
        .iter()
        .zip(kinds)
        .map(|(is, kind)| {
            is.iter()
                .enumerate()
                .map(|(i, insn)| {
                    let kind = if i + 1 == is.len() { kind } else { None };
                    effect(&mut factory, insn, kind)
                })
                .collect()
        })
        .collect()
}

/// What is live after each block's last instruction because control may
/// leave the procedure there: the exit sets of its edges to EXIT, and
/// everything when control goes somewhere the CFG does not know (an
/// unresolved indirect jump, or a block without any edge).
fn exit_outs(cfg: &Cfg, may_write: RegSet) -> Vec<RegSet> {
    let mut out = vec![RegSet::EMPTY; cfg.blocks.len()];
    let mut has_edge = vec![false; cfg.blocks.len()];
    for e in cfg.edges.values() {
        has_edge[e.from.index()] = true;
        if e.to == cfg.exit() {
            out[e.from.index()] |= exit_set(e.kind, may_write);
        }
    }
    for (o, has) in out.iter_mut().zip(has_edge) {
        if !has {
            *o = RegSet::ALL;
        }
    }
    for j in &cfg.indirect_jumps {
        if matches!(j.resolution, JumpResolution::Unresolved(_)) {
            out[j.block.index()] = RegSet::ALL;
        }
    }
    out
}

/// Computes the liveness of `cfg`; `insns[b.index()]` are the decoded
/// instructions of block `b`, in order (see [`decode_blocks`]).
pub fn analyze(cfg: &Cfg, insns: &[Vec<Instruction>]) -> Liveness {
    assert_eq!(
        insns.len(),
        cfg.blocks.len(),
        "one instruction list per block"
    );
    debug_assert!(
        cfg.blocks
            .values()
            .zip(insns)
            .all(|(b, is)| b.insns.len() == is.len()
                && is
                    .iter()
                    .zip(&b.insns)
                    .all(|(i, &o)| i.ip() == b.start + u64::from(o))),
        "instructions as the CFG's blocks list them"
    );
    let n = cfg.blocks.len();
    let red_zone = red_zone_live(insns);
    if insns.iter().flatten().any(unmodelled) {
        return Liveness {
            before: insns
                .iter()
                .map(|b| vec![RegSet::ALL; b.len() + 1])
                .collect(),
            red_zone: true,
            may_write: RegSet::EMPTY,
        };
    }
    let effects = effects(cfg, insns);
    // Block summaries, composed backwards.
    let summary: Vec<Effect> = effects
        .iter()
        .map(|es| {
            es.iter().rev().fold(
                Effect {
                    gen: RegSet::EMPTY,
                    kill: RegSet::EMPTY,
                    writes: RegSet::EMPTY,
                },
                |acc, e| Effect {
                    gen: e.gen | (acc.gen & !e.kill),
                    kill: acc.kill | e.kill,
                    writes: acc.writes | e.writes,
                },
            )
        })
        .collect();
    let may_write = summary.iter().fold(RegSet::EMPTY, |acc, e| acc | e.writes);
    let mut succs: Vec<Vec<BlockId>> = vec![Vec::new(); n];
    for e in cfg.edges.values().filter(|e| e.to != cfg.exit()) {
        succs[e.from.index()].push(e.to);
    }
    let exit_out = exit_outs(cfg, may_write);
    let order = post_order(cfg, &succs);
    let mut live_in = vec![RegSet::EMPTY; n];
    let mut out = exit_out.clone();
    loop {
        let mut changed = false;
        for &b in &order {
            let o = succs[b]
                .iter()
                .fold(exit_out[b], |acc, s| acc | live_in[s.index()]);
            out[b] = o;
            let li = summary[b].gen | (o & !summary[b].kill);
            if li != live_in[b] {
                debug_assert_eq!(li.0 & live_in[b].0, live_in[b].0, "monotone");
                live_in[b] = li;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let before = effects
        .iter()
        .zip(&out)
        .map(|(es, &o)| {
            let mut v = vec![RegSet::EMPTY; es.len() + 1];
            v[es.len()] = o;
            for (i, e) in es.iter().enumerate().rev() {
                v[i] = e.gen | (v[i + 1] & !e.kill);
            }
            v
        })
        .collect::<Vec<_>>();
    debug_assert!(before.iter().zip(&live_in).all(|(v, &li)| v[0] == li));
    debug_assert!(before.iter().flatten().all(|s| s.0 & !RegSet::ALL.0 == 0));
    Liveness {
        before,
        red_zone,
        may_write,
    }
}

/// Whether an instruction sets up a stack frame by moving `rsp` down by an
/// immediate (`sub rsp, imm`, `add rsp, -imm`, `lea rsp, [rsp-imm]`).
fn allocates_frame(insn: &Instruction) -> bool {
    if insn.op_count() < 1 || insn.op0_kind() != OpKind::Register || insn.op0_register() != RSP {
        return false;
    }
    let imm = || {
        (insn.op_count() == 2
            && insn.op1_kind() != OpKind::Register
            && insn.op1_kind() != OpKind::Memory)
            .then(|| insn.immediate(1) as i64)
    };
    match insn.mnemonic() {
        Mnemonic::Sub => imm().is_some_and(|v| v > 0),
        Mnemonic::Add => imm().is_some_and(|v| v < 0),
        Mnemonic::Lea => insn.memory_base() == RSP && (insn.memory_displacement64() as i64) < 0,
        _ => false,
    }
}

/// Red zone rule (conservative): live when the procedure makes no call, or
/// addresses below `rsp`, or addresses below `rbp` without ever moving
/// `rsp` down by an immediate (gcc -O0 leaf frames).
fn red_zone_live(insns: &[Vec<Instruction>]) -> bool {
    let all = || insns.iter().flatten();
    let below = |base: Register| {
        all().any(|i| {
            (0..i.op_count()).any(|k| i.op_kind(k) == OpKind::Memory)
                && i.memory_base() == base
                && (i.memory_displacement64() as i64) < 0
        })
    };
    let calls = all().any(is_call);
    !calls || below(RSP) || (below(RBP) && !all().any(allocates_frame))
}

impl Liveness {
    /// The register the outside-entry stub may clobber at entry block
    /// `entry` (`aetrace_runtime::ENTRY_SCRATCH`, r11 first): one not live
    /// there, with the flags dead too. `None` when every candidate may
    /// carry a value a `-fipa-ra` caller keeps across its direct call.
    pub fn entry_scratch(&self, entry: BlockId) -> Option<AsmRegister64> {
        let live = self.live_in(entry);
        if live.flags_live() {
            return None;
        }
        aetrace_runtime::ENTRY_SCRATCH
            .into_iter()
            .find(|&r| !live.has_gpr(Register::from(r)))
    }

    /// Live at the start of block `b`.
    pub fn live_in(&self, b: BlockId) -> RegSet {
        self.before[b.index()][0]
    }

    /// Live at the end of block `b` (after its last instruction).
    pub fn live_out(&self, b: BlockId) -> RegSet {
        *self.before[b.index()]
            .last()
            .expect("one entry past the block")
    }

    /// Live on edge `e`. Between blocks: the target's live-in. To EXIT: the
    /// exit set of the edge's kind joined with what is live before the
    /// block's last instruction, so the answer holds both where the edge
    /// leaves (before a `ret`, `jmp` or `call`) and where it arrives.
    pub fn live_on_edge(&self, cfg: &Cfg, e: EdgeId) -> RegSet {
        let edge = cfg.edges[e];
        if edge.to == cfg.exit() {
            let v = &self.before[edge.from.index()];
            exit_set(edge.kind, self.may_write) | v[v.len() - 2]
        } else {
            self.live_in(edge.to)
        }
    }

    /// Live just before instruction `i` of block `b`; `i` may be the
    /// block's instruction count (then: its live-out).
    pub fn live_before(&self, b: BlockId, i: usize) -> RegSet {
        self.before[b.index()][i]
    }

    /// The GPRs and flags some instruction of the procedure may write
    /// (partly, conditionally, or by a call through the PLT or a pointer);
    /// a caller compiled with `-fipa-ra` may rely on all others (and on
    /// those its direct callees never write) being preserved.
    pub fn may_write(&self) -> RegSet {
        self.may_write
    }

    /// Whether the procedure may keep live data below `rsp` (the 128-byte
    /// red zone).
    pub fn red_zone_live(&self) -> bool {
        self.red_zone
    }

    /// The instrumentation site for a point where `live` holds.
    pub fn site(&self, live: RegSet) -> Site {
        Site {
            scratch: SCRATCH_ORDER
                .iter()
                .find(|(r, _)| !live.has_gpr(*r))
                .map(|&(_, a)| a),
            flags_live: live.flags_live(),
            red_zone_live: self.red_zone,
            flags_save: FlagsSave::Lahf,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aetrace_analysis::cfg::{Block, BlockKind, CallSite, CfgEdge, IndirectJump};
    use aetrace_graph::PrimaryMap;
    use iced_x86::code_asm::*;
    use iced_x86::{Decoder, DecoderOptions};
    use std::collections::HashSet;

    /// Assembles one block at `base` and decodes it back (correct `ip`s).
    fn asm(
        base: u64,
        f: impl FnOnce(&mut CodeAssembler) -> std::result::Result<(), IcedError>,
    ) -> Vec<Instruction> {
        let mut a = CodeAssembler::new(64).unwrap();
        f(&mut a).unwrap();
        let bytes = a.assemble(base).unwrap();
        Decoder::with_ip(64, &bytes, base, DecoderOptions::NONE)
            .into_iter()
            .collect()
    }

    /// `None` as an edge target is EXIT.
    type E = (usize, Option<usize>, EdgeKind);

    fn mk_cfg(
        blocks: &[Vec<Instruction>],
        kinds: &[BlockKind],
        edges: &[E],
        calls: &[(usize, CallKind, bool)],
    ) -> Cfg {
        let blks: PrimaryMap<BlockId, Block> = blocks
            .iter()
            .zip(kinds)
            .map(|(is, &kind)| {
                let start = is[0].ip();
                Block {
                    start,
                    end: is.last().unwrap().next_ip(),
                    insns: is.iter().map(|i| (i.ip() - start) as u32).collect(),
                    kind,
                }
            })
            .collect();
        let exit = BlockId::new(blocks.len());
        let cfg = Cfg {
            blocks: blks,
            entry: BlockId::new(0),
            edges: edges
                .iter()
                .map(|&(f, t, kind)| CfgEdge {
                    from: BlockId::new(f),
                    to: t.map_or(exit, BlockId::new),
                    kind,
                })
                .collect(),
            calls: calls
                .iter()
                .map(|&(b, kind, tail)| CallSite {
                    block: BlockId::new(b),
                    kind,
                    target: None,
                    name: None,
                    returns: true,
                    tail,
                })
                .collect(),
            indirect_jumps: Vec::new(),
        };
        cfg.check().unwrap();
        cfg
    }

    /// One block ending in `ret`.
    fn single(
        f: impl FnOnce(&mut CodeAssembler) -> std::result::Result<(), IcedError>,
    ) -> (Cfg, Vec<Vec<Instruction>>) {
        let b = asm(0x1000, |a| {
            f(a)?;
            a.ret()
        });
        let cfg = mk_cfg(
            std::slice::from_ref(&b),
            &[BlockKind::Plain],
            &[(0, None, EdgeKind::Return)],
            &[],
        );
        (cfg, vec![b])
    }

    fn b(i: usize) -> BlockId {
        BlockId::new(i)
    }

    #[test]
    fn overwritten_register_is_dead_before_the_write() {
        let (cfg, is) = single(|a| {
            a.mov(eax, 5)?;
            a.mov(rcx, rax)?;
            a.xor(edx, edx)
        });
        let l = analyze(&cfg, &is);
        assert!(
            !l.live_before(b(0), 0).has_gpr(RAX),
            "{}",
            l.live_before(b(0), 0)
        );
        assert!(l.live_before(b(0), 1).has_gpr(RAX));
        assert!(
            !l.live_before(b(0), 1).has_gpr(RCX),
            "mov rcx, rax writes all of rcx"
        );
        assert!(
            !l.live_before(b(0), 2).has_gpr(RDX),
            "xor edx, edx is a write only"
        );
        // At the return: rax, rdx (results), callee-saved, and whatever the
        // procedure never writes; rcx is written, so dead.
        assert_eq!(
            l.may_write() & RegSet::ALL_GPRS,
            RegSet::gprs(&[RAX, RCX, RDX, RSP]),
            "ret moves rsp"
        );
        assert_eq!(
            l.may_write() & RegSet::FLAGS,
            RegSet::FLAGS,
            "xor writes every flag"
        );
        assert_eq!(l.live_before(b(0), 3), !RegSet::gpr(RCX) & RegSet::ALL_GPRS);
        // The first free register in preference order is rax, then rcx.
        assert_eq!(l.site(l.live_before(b(0), 0)).scratch, Some(rax));
        assert_eq!(l.site(l.live_before(b(0), 1)).scratch, Some(rcx));
        assert_eq!(l.site(l.live_before(b(0), 2)).scratch, Some(rcx));
        let (cfg, is) = single(|a| a.mov(rax, rdi));
        let at_ret = analyze(&cfg, &is).live_before(b(0), 1);
        assert_eq!(at_ret, RegSet::ALL, "nothing written but rax: flags too");
    }

    #[test]
    fn partial_writes_do_not_kill() {
        for (name, f) in [
            (
                "al",
                (|a: &mut CodeAssembler| a.mov(al, 1)) as fn(&mut CodeAssembler) -> _,
            ),
            ("ah", |a| a.mov(ah, 1)),
            ("ax", |a| a.mov(ax, 1)),
            ("cmov", |a| a.cmovne(eax, ecx)),
            ("r8w", |a| a.mov(r8w, 1)),
        ] {
            // The partial write, then a read of the full register.
            let (cfg, is) = single(|a| {
                f(a)?;
                a.mov(rbx, rax)?;
                a.mov(rbx, r8)
            });
            let l = analyze(&cfg, &is);
            let reg = if name == "r8w" { R8 } else { RAX };
            assert!(l.live_in(b(0)).has_gpr(reg), "{name}: {}", l.live_in(b(0)));
        }
        let (cfg, is) = single(|a| {
            a.mov(r8d, 1)?;
            a.mov(rbx, r8)
        });
        assert!(
            !analyze(&cfg, &is).live_in(b(0)).has_gpr(R8),
            "32-bit writes zero-extend"
        );
    }

    #[test]
    fn cpu_dependent_writes_do_not_kill() {
        for f in [
            (|a: &mut CodeAssembler| a.rdsspq(rax)) as fn(&mut CodeAssembler) -> _,
            |a| a.tzcnt(eax, ecx),
            |a| a.lzcnt(rax, rcx),
            |a| a.bsf(eax, ecx),
            |a| a.bsr(eax, ecx),
        ] {
            let (cfg, is) = single(|a| {
                f(a)?;
                a.mov(rbx, rax)
            });
            let l = analyze(&cfg, &is);
            assert!(
                l.live_in(b(0)).has_gpr(RAX),
                "{}: {}",
                is[0][0],
                l.live_in(b(0))
            );
        }
    }

    #[test]
    fn read_and_write_is_a_use() {
        let (cfg, is) = single(|a| {
            a.add(eax, 1)?;
            a.lea(rbx, qword_ptr(rsi + rdi * 8 - 8))?;
            a.add(rdx, qword_ptr(rbx))?;
            a.movzx(ecx, cl)
        });
        let li = analyze(&cfg, &is).live_in(b(0));
        for r in [RAX, RSI, RDI, RCX, RDX] {
            assert!(li.has_gpr(r), "{r:?} in {li}");
        }
        assert!(!li.has_gpr(RBX));
    }

    /// A handler may skip an instruction whose memory access faults
    /// (`traces/skip_fault.c`): what it writes without reading keeps its
    /// value, so it is live before it; `lea` accesses nothing.
    #[test]
    fn a_possibly_faulting_access_kills_nothing() {
        let (cfg, is) = single(|a| {
            a.mov(rax, qword_ptr(rdi))?;
            a.lea(rcx, qword_ptr(rsi + 8))?;
            a.cmp(qword_ptr(rcx), 1)?;
            a.sete(al)?;
            a.cmp(rdx, 1)?;
            a.sete(ah)?;
            a.lodsq()?;
            a.add(rax, rcx)
        });
        let l = analyze(&cfg, &is);
        let at = |i| l.live_before(b(0), i);
        assert!(at(0).has_gpr(RAX), "a load may be skipped: {}", at(0));
        assert!(!at(1).has_gpr(RCX), "lea kills: {}", at(1));
        assert!(at(2).has_bit(16 + 3), "cmp [m] may be skipped: {}", at(2));
        assert!(!at(4).flags_live(), "cmp reg kills the flags: {}", at(4));
        assert!(at(6).has_gpr(RAX), "lodsq may be skipped: {}", at(6));
    }

    #[test]
    fn flags_live_between_cmp_and_jcc_only() {
        // b0: cmp; jne b2 / b1: add (rewrites the flags); ret / b2: ret
        let b0 = asm(0x1000, |a| {
            a.cmp(rdi, rsi)?;
            a.jne(0x1200)
        });
        let b1 = asm(0x1100, |a| {
            a.add(rax, 1)?;
            a.ret()
        });
        let b2 = asm(0x1200, |a| a.ret());
        let edges = [
            (0, Some(1), EdgeKind::FallThrough),
            (0, Some(2), EdgeKind::Taken),
            (1, None, EdgeKind::Return),
            (2, None, EdgeKind::Return),
        ];
        let cfg = mk_cfg(
            &[b0.clone(), b1.clone(), b2.clone()],
            &[BlockKind::Plain; 3],
            &edges,
            &[],
        );
        let l = analyze(&cfg, &[b0, b1, b2]);
        let at_jcc = l.live_before(b(0), 1);
        assert!(
            at_jcc.flags_live() && at_jcc.has_bit(16 + 3),
            "ZF live at jne: {at_jcc}"
        );
        assert!(!at_jcc.has_bit(16), "jne reads ZF only: {at_jcc}");
        assert!(!l.live_before(b(0), 0).flags_live(), "cmp writes them");
        assert!(!l.live_in(b(1)).flags_live(), "add rewrites them");
        assert!(
            !l.live_in(b(2)).flags_live(),
            "a return does not keep flags"
        );
        assert!(l.site(at_jcc).flags_live);
        for e in cfg.edges.keys() {
            assert!(
                !l.live_on_edge(&cfg, e).flags_live() || cfg.edges[e].kind == EdgeKind::TailCall
            );
        }
    }

    #[test]
    fn flag_readers_and_count_zero_shifts() {
        // setne reads ZF; shl by cl may leave the flags alone; shl by 3 not.
        let (cfg, is) = single(|a| {
            a.shl(eax, cl)?;
            a.shl(edx, 3)?;
            a.shl(esi, cl)?;
            a.setne(bl)
        });
        let l = analyze(&cfg, &is);
        assert!(l.live_before(b(0), 3).has_bit(16 + 3), "setne reads ZF");
        assert!(
            l.live_before(b(0), 2).has_bit(16 + 3),
            "shl by cl may not write"
        );
        assert!(!l.live_before(b(0), 1).flags_live(), "shl by 3 writes them");
        let (cfg, is) = single(|a| {
            a.adc(eax, 0)?;
            a.shl(edx, 0)
        });
        let li = analyze(&cfg, &is).live_in(b(0));
        assert!(li.has_bit(16), "adc reads CF: {li}");
    }

    #[test]
    fn calls_clobber_caller_saved_unless_local() {
        // b0: mov r11, 5; xor ebx, ebx; call f / b1: mov rax, r11; ret
        for (kind, r11_live) in [
            (CallKind::Plt, false),
            (CallKind::Indirect, false),
            (CallKind::Direct, true),
        ] {
            let b0 = asm(0x1000, |a| {
                a.mov(r11, 5u64)?;
                a.xor(ebx, ebx)?;
                if kind == CallKind::Indirect {
                    a.call(qword_ptr(r12 + 8))
                } else {
                    a.call(0x5000u64)
                }
            });
            let b1 = asm(0x1100, |a| {
                a.mov(rax, r11)?;
                a.ret()
            });
            let cfg = mk_cfg(
                &[b0.clone(), b1.clone()],
                &[BlockKind::Call, BlockKind::Plain],
                &[
                    (0, Some(1), EdgeKind::CallReturn),
                    (1, None, EdgeKind::Return),
                ],
                &[(0, kind, false)],
            );
            let l = analyze(&cfg, &[b0, b1]);
            let at_call = l.live_before(b(0), 2);
            assert_eq!(at_call.has_gpr(R11), r11_live, "{kind:?}: {at_call}");
            for r in [
                RDI, RSI, RDX, RCX, R8, R9, RAX, R10, RSP, RBX, RBP, R12, R13, R14, R15,
            ] {
                assert!(at_call.has_gpr(r), "{kind:?}: {r:?} not in {at_call}");
            }
            assert!(!l.live_before(b(0), 1).has_gpr(RBX), "xor ebx, ebx kills");
            assert!(!l.live_in(b(0)).has_gpr(R11));
            assert_eq!(l.site(at_call).scratch, (!r11_live).then_some(r11));
        }
    }

    #[test]
    fn exits() {
        let (cfg, is) = single(|_| Ok(()));
        let l = analyze(&cfg, &is);
        assert_eq!(l.live_in(b(0)), RegSet::ALL, "-fipa-ra: nothing written");
        assert_eq!(l.site(l.live_in(b(0))).scratch, None);
        // A tail call keeps everything, flags too; a halt only rsp.
        for (kind, want) in [
            (EdgeKind::TailCall, RegSet::ALL),
            (EdgeKind::Halt, RegSet::gpr(RSP)),
        ] {
            let b0 = asm(0x1000, |a| a.nop());
            let cfg = mk_cfg(
                std::slice::from_ref(&b0),
                &[BlockKind::Plain],
                &[(0, None, kind)],
                &[],
            );
            let l = analyze(&cfg, &[b0]);
            assert_eq!(l.live_in(b(0)), want, "{kind:?}");
            assert_eq!(l.live_on_edge(&cfg, EdgeId::new(0)), want, "{kind:?}");
        }
        // A call that never returns: its arguments and callee-saved registers.
        let b0 = asm(0x1000, |a| {
            a.mov(r11, 1u64)?;
            a.call(0x5000u64)
        });
        let cfg = mk_cfg(
            std::slice::from_ref(&b0),
            &[BlockKind::Call],
            &[(0, None, EdgeKind::NoReturn)],
            &[(0, CallKind::Plt, false)],
        );
        let l = analyze(&cfg, &[b0]);
        let want = RegSet::gprs(ARGS) | RegSet::gprs(CALLEE_SAVED);
        assert_eq!(l.live_before(b(0), 1), want);
        assert_eq!(
            l.live_on_edge(&cfg, EdgeId::new(0)),
            want,
            "edge = before the call"
        );
    }

    #[test]
    fn indirect_tail_jump_uses_its_operand() {
        // An unconditional indirect tail call keeps everything live, and
        // the edge's set holds before the `jmp rax` too.
        let b0 = asm(0x1000, |a| {
            a.lea(rax, qword_ptr(rdi + 8))?;
            a.jmp(rax)
        });
        let mut cfg = mk_cfg(
            std::slice::from_ref(&b0),
            &[BlockKind::Plain],
            &[(0, None, EdgeKind::TailCall)],
            &[],
        );
        cfg.indirect_jumps.push(IndirectJump {
            block: b(0),
            addr: b0[1].ip(),
            resolution: JumpResolution::Unresolved("test"),
        });
        let l = analyze(&cfg, std::slice::from_ref(&b0));
        assert_eq!(l.live_on_edge(&cfg, EdgeId::new(0)), RegSet::ALL);
        assert!(!l.live_in(b(0)).has_gpr(RAX));
        // Unresolved, even with a (partial) local edge; or no edge at all:
        // everything is live after the jump.
        let b1 = asm(0x1100, |a| a.ret());
        let is = [b0, b1];
        for edges in [&[(0, Some(1), EdgeKind::Taken)][..], &[]] {
            let mut cfg = mk_cfg(&is, &[BlockKind::Plain; 2], edges, &[]);
            cfg.indirect_jumps.push(IndirectJump {
                block: b(0),
                addr: is[0][1].ip(),
                resolution: JumpResolution::Unresolved("test"),
            });
            assert_eq!(analyze(&cfg, &is).live_out(b(0)), RegSet::ALL, "{edges:?}");
            cfg.indirect_jumps.clear();
            let l = analyze(&cfg, &is);
            let want = if edges.is_empty() {
                RegSet::ALL
            } else {
                l.live_in(b(1))
            };
            assert_eq!(l.live_out(b(0)), want, "{edges:?}");
        }
    }

    #[test]
    fn syscalls_and_undecodable_bytes_use_everything() {
        let (cfg, is) = single(|a| {
            a.mov(eax, 60)?;
            a.syscall()
        });
        let l = analyze(&cfg, &is);
        assert_eq!(l.live_before(b(0), 1), RegSet::ALL);
        assert!(!l.live_in(b(0)).has_gpr(RAX));
        let (cfg, mut is) = single(|a| a.mov(eax, 60));
        let ip = is[0][0].ip();
        is[0][0] = Instruction::default();
        is[0][0].set_ip(ip);
        assert_eq!(is[0][0].code(), Code::INVALID);
        let l = analyze(&cfg, &is);
        assert_eq!(l.live_before(b(0), 1), RegSet::ALL);
        assert!(l.red_zone_live());
    }

    #[test]
    fn red_zone() {
        let rz = |f: fn(&mut CodeAssembler) -> std::result::Result<(), IcedError>| {
            let (cfg, is) = single(f);
            analyze(&cfg, &is).red_zone_live()
        };
        assert!(rz(|a| a.nop()), "a leaf");
        assert!(
            !rz(|a| {
                a.sub(rsp, 24)?;
                a.mov(dword_ptr(rbp - 4), 1)?;
                a.call(0x5000u64)
            }),
            "a frame below rsp"
        );
        assert!(
            rz(|a| {
                a.mov(qword_ptr(rsp - 8), rdi)?;
                a.call(0x5000u64)
            }),
            "stores below rsp"
        );
        assert!(
            rz(|a| {
                a.mov(dword_ptr(rbp - 4), edi)?;
                a.call(0x5000u64)
            }),
            "rbp frame without sub rsp"
        );
        assert!(
            !rz(|a| {
                a.push(rbx)?;
                a.call(0x5000u64)
            }),
            "non-leaf without red zone use"
        );
    }

    #[test]
    fn site_never_picks_reserved_registers() {
        let l = Liveness {
            before: Vec::new(),
            red_zone: false,
            may_write: RegSet::EMPTY,
        };
        let live = !(RegSet::gprs(&[RBP, RSP, R12, R13]));
        let s = l.site(live);
        assert_eq!(s.scratch, None);
        assert!(s.flags_live && !s.red_zone_live);
        let s = l.site(live & !RegSet::gpr(R15));
        assert_eq!(s.scratch, Some(r15));
        assert_eq!(l.site(RegSet::EMPTY).scratch, Some(rax));
        assert!(!l.site(RegSet::EMPTY).flags_live);
    }

    /// Reference liveness: is `bit` live before instruction `i` of block
    /// `blk`? Walks forward over every path, one instruction at a time,
    /// until a use (live) or a kill (this path says dead).
    fn naive_live(
        cfg: &Cfg,
        insns: &[Vec<Instruction>],
        effects: &[Vec<Effect>],
        blk: usize,
        i: usize,
        bit: u32,
    ) -> bool {
        let may_write = effects
            .iter()
            .flatten()
            .fold(RegSet::EMPTY, |acc, e| acc | e.writes);
        let mut seen = HashSet::new();
        let mut work = vec![(blk, i)];
        while let Some((b, i)) = work.pop() {
            if !seen.insert((b, i)) {
                continue;
            }
            if i < insns[b].len() {
                let e = effects[b][i];
                if e.gen.has_bit(bit) {
                    return true;
                }
                if !e.kill.has_bit(bit) {
                    work.push((b, i + 1));
                }
                continue;
            }
            // Leaving the procedure: `exit_outs` is the specification.
            if exit_outs(cfg, may_write)[b].has_bit(bit) {
                return true;
            }
            for e in cfg.edges.values().filter(|e| e.from.index() == b) {
                if e.to != cfg.exit() {
                    work.push((e.to.index(), 0));
                }
            }
        }
        false
    }

    /// Deterministic xorshift, so failures reproduce.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    const POINTS_PER_PROC: usize = 40;

    fn compare_with_reference(path: &str) {
        let prog = crate::Program::open(std::path::Path::new(path)).unwrap();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let (mut procs, mut points) = (0, 0);
        for p in prog.procs.values() {
            let Ok(cfg) = &p.cfg else { continue };
            let insns = decode_blocks(&prog.module, cfg).unwrap();
            let l = analyze(cfg, &insns);
            let effects = effects(cfg, &insns);
            if insns.iter().flatten().any(unmodelled) {
                continue;
            }
            procs += 1;
            for _ in 0..POINTS_PER_PROC {
                let blk = rng.below(insns.len());
                let i = rng.below(insns[blk].len() + 1);
                points += 1;
                for bit in 0..22 {
                    let want = naive_live(cfg, &insns, &effects, blk, i, bit);
                    assert_eq!(
                        l.live_before(b(blk), i).has_bit(bit),
                        want,
                        "{path}: {} block {blk} instruction {i} bit {bit}",
                        p.name
                    );
                }
            }
        }
        eprintln!("{path}: {procs} procedures, {points} points x 22 bits agree");
        assert!(
            procs > 50 && points > 50 * POINTS_PER_PROC,
            "{path}: only {procs} procedures"
        );
    }

    /// Precision floor on gzip (measured 2026-11-30: 4789 of 5489 edges,
    /// 87.2%, have a dead scratch register and 784, 14.3%, live flags;
    /// 5292 and 61 when an access that may fault killed its outputs):
    /// catches an analysis that turns needlessly conservative.
    #[test]
    fn most_gzip_edges_get_a_scratch_register() {
        let prog = crate::Program::open(std::path::Path::new("/usr/bin/gzip")).unwrap();
        let (mut edges, mut scratch, mut flags) = (0usize, 0usize, 0usize);
        for p in prog.procs.values() {
            let Ok(cfg) = &p.cfg else { continue };
            if p.kind == aetrace_analysis::ProcKind::Plt {
                continue;
            }
            let l = analyze(cfg, &decode_blocks(&prog.module, cfg).unwrap());
            for e in cfg.edges.keys() {
                let s = l.site(l.live_on_edge(cfg, e));
                edges += 1;
                scratch += usize::from(s.scratch.is_some());
                flags += usize::from(s.flags_live);
            }
        }
        eprintln!("gzip: scratch on {scratch} of {edges} edges, flags live on {flags}");
        assert!(edges > 3000, "{edges} edges");
        assert!(
            scratch * 100 >= edges * 87,
            "scratch on {scratch} of {edges} edges"
        );
        assert!(
            flags * 100 <= edges * 15,
            "flags live on {flags} of {edges} edges"
        );
    }

    #[test]
    fn equals_reference_on_gzip() {
        compare_with_reference("/usr/bin/gzip");
    }

    #[test]
    fn equals_reference_on_libbz2() {
        compare_with_reference("/lib/x86_64-linux-gnu/libbz2.so.1.0");
    }

    /// A fresh temporary directory, removed when dropped (even by a panic).
    struct TempDir(std::path::PathBuf);
    impl TempDir {
        fn new(what: &str) -> TempDir {
            let dir = std::env::temp_dir()
                .join(format!("aetrace-liveness-{what}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Builds `src` with gcc -O2 `flags` into a fresh temporary directory.
    fn gcc(name: &str, src: &str, flags: &[&str]) -> crate::Program {
        let tmp = TempDir::new(name);
        let dir = &tmp.0;
        let c = dir.join(format!("{name}.c"));
        let exe = dir.join(name);
        std::fs::write(&c, src).unwrap();
        let st = std::process::Command::new("gcc")
            .args(["-O2", "-fno-inline"])
            .args(flags)
            .arg("-o")
            .arg(&exe)
            .arg(&c)
            .status()
            .expect("gcc runs");
        assert!(st.success(), "gcc failed on {name}.c");
        crate::Program::open(&exe).unwrap()
    }

    /// With `-mtls-dialect=gnu2`, gcc keeps a value in r11 (the one
    /// caller-saved register that never passes an argument) across the TLS
    /// descriptor call (`call [rax]`), which preserves all but rax.
    #[test]
    fn caller_saved_registers_survive_tls_descriptor_calls() {
        let prog = gcc(
            "libtlsdesc.so",
            "__thread long t;\n\
             long get(long a) {\n\
                 register long k asm(\"r11\") = a * 3;\n\
                 asm volatile(\"\" : \"+r\"(k));\n\
                 long r = t;\n\
                 asm volatile(\"\" : \"+r\"(k));\n\
                 return r + k;\n\
             }\n",
            &["-fPIC", "-shared", "-mtls-dialect=gnu2"],
        );
        let p = &prog.procs[prog.find("get").unwrap()];
        let cfg = p.cfg.as_ref().unwrap();
        let insns = decode_blocks(&prog.module, cfg).unwrap();
        let l = analyze(cfg, &insns);
        let call = cfg.calls.first().expect("get calls the TLS resolver");
        let call_i = insns[call.block.index()].len() - 1;
        assert!(is_tlsdesc_call(&insns[call.block.index()][call_i]));
        let mut f = InstructionInfoFactory::new();
        let after = cfg
            .edges
            .values()
            .find(|e| e.from == call.block)
            .unwrap()
            .to;
        // The premise: the return block reads r11 before writing it.
        let reads = insns[after.index()].iter().find_map(|x| {
            let e = effect(&mut f, x, None);
            (e.gen.has_gpr(R11) || e.kill.has_gpr(R11)).then_some(e.gen.has_gpr(R11))
        });
        assert_eq!(reads, Some(true), "the premise: {:?}", insns[after.index()]);
        let kept = RegSet::gpr(R11);
        let at_call = l.live_before(call.block, call_i);
        assert_eq!(
            at_call & kept,
            kept,
            "kept {kept} live at the call: {at_call}"
        );
    }

    /// gcc's `-fipa-ra` (on at -O2) keeps `f`'s arguments in rsi, rdx, rcx
    /// across its call of `leaf`, which it knows leaves them alone: neither
    /// `leaf` nor the call may treat them as dead.
    #[test]
    fn caller_saved_registers_survive_local_calls() {
        let prog = gcc(
            "ipa_ra",
            "__attribute__((noinline)) int leaf(int x) { return x * 3 + 1; }\n\
             __attribute__((noinline)) int f(int a, int b, int c, int d) { return leaf(a) + b * c + d; }\n\
             int main(int argc, char **argv) { return f(argc, argc + 1, argc + 2, argc + 3); }\n",
            &[],
        );
        let get = |name: &str| {
            let p = &prog.procs[prog.find(name).unwrap()];
            let cfg = p.cfg.clone().unwrap();
            let insns = decode_blocks(&prog.module, &cfg).unwrap();
            (analyze(&cfg, &insns), cfg, insns)
        };
        let (l, cfg, insns) = get("f");
        let call = cfg.calls.iter().find(|c| !c.tail).expect("f calls leaf");
        // The premise: after the call, f reads a caller-saved argument
        // register it did not write (the code gcc 12 emits).
        let mut f = InstructionInfoFactory::new();
        let after = cfg
            .edges
            .values()
            .find(|e| e.from == call.block)
            .unwrap()
            .to;
        let first = effect(&mut f, &insns[after.index()][0], None);
        let kept = first.gen & RegSet::gprs(&[RSI, RDX, RCX]);
        assert!(
            kept != RegSet::EMPTY,
            "gcc did not keep a value across the call: {:?}",
            insns[after.index()]
        );
        let at_call = l.live_before(call.block, insns[call.block.index()].len() - 1);
        assert_eq!(
            at_call & kept,
            kept,
            "kept {kept} live at the call: {at_call}"
        );
        let (l, cfg, insns) = get("leaf");
        for (blk, is) in cfg.blocks.keys().zip(&insns) {
            for i in 0..=is.len() {
                let live = l.live_before(blk, i);
                assert_eq!(live & kept, kept, "leaf {blk} instruction {i}: {live}");
            }
        }
    }

    /// End-to-end safety: run a program under ptrace and, at the first
    /// `HITS` executions of every analysed instruction (of the executable
    /// and of chosen shared libraries), overwrite every GPR and flag the
    /// analysis calls dead there, and the red zone when it is called free,
    /// with garbage; the program's own output and exit status must not
    /// change. The oracle is the program, not our code.
    mod clobber {
        use super::*;
        use std::collections::HashMap;
        use std::ffi::CString;
        use std::path::{Path, PathBuf};

        const HITS: u32 = 4;
        /// Non-canonical: any use as an address faults.
        const GARBAGE: u64 = 0xDEAD_BEEF_0000_0000;
        /// Our flag bits CF PF AF ZF SF OF in `eflags`.
        const EFLAGS: [u64; 6] = [0x1, 0x4, 0x10, 0x40, 0x80, 0x800];

        struct Point {
            dead: RegSet,
            red_zone_free: bool,
            orig: u8,
            hits: u32,
        }

        /// A module to instrument, with its claims by link-time address.
        struct Claims {
            path: PathBuf,
            pie: bool,
            entry: u64,
            points: HashMap<u64, Point>,
        }

        /// The claims to test: `live_before` every instruction of every
        /// analysed procedure, minus instructions overlapping another
        /// decoding (a breakpoint there would corrupt the other).
        fn claims(path: &Path) -> Claims {
            let prog = crate::Program::open(path).unwrap();
            let mut all = Vec::new();
            for p in prog.procs.values() {
                let Ok(cfg) = &p.cfg else { continue };
                if p.kind == aetrace_analysis::ProcKind::Plt {
                    continue;
                }
                let insns = decode_blocks(&prog.module, cfg).unwrap();
                let l = analyze(cfg, &insns);
                for (blk, is) in cfg.blocks.keys().zip(&insns) {
                    for (i, insn) in is.iter().enumerate() {
                        let dead = !l.live_before(blk, i);
                        all.push((insn.ip(), insn.next_ip(), dead, !l.red_zone_live()));
                    }
                }
            }
            all.sort_by_key(|c| c.0);
            let mut points = HashMap::new();
            for (k, &(ip, end, dead, free)) in all.iter().enumerate() {
                let overlaps = all[..k]
                    .iter()
                    .rev()
                    .take(16)
                    .any(|c| c.0 != ip && c.1 > ip)
                    || all[k + 1..].iter().take(16).any(|c| c.0 != ip && c.0 < end);
                if !overlaps {
                    // The same address in two procedures: keep both claims' meet.
                    let e = points.entry(ip).or_insert(Point {
                        dead,
                        red_zone_free: free,
                        orig: 0,
                        hits: 0,
                    });
                    e.dead = e.dead & dead;
                    e.red_zone_free &= free;
                }
            }
            Claims {
                path: std::fs::canonicalize(path).unwrap(),
                pie: prog.module.kind != aetrace_analysis::elf::ElfKind::Exec,
                entry: prog.module.entry,
                points,
            }
        }

        /// The tracee's memory (writable by its tracer, text included).
        struct Mem(std::fs::File);
        impl Mem {
            fn open(pid: i32) -> Mem {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(format!("/proc/{pid}/mem"))
                    .unwrap();
                Mem(f)
            }
            fn read(&self, addr: u64, buf: &mut [u8]) {
                std::os::unix::fs::FileExt::read_exact_at(&self.0, buf, addr)
                    .unwrap_or_else(|e| panic!("read {addr:#x}: {e}"));
            }
            fn write(&self, addr: u64, buf: &[u8]) {
                std::os::unix::fs::FileExt::write_all_at(&self.0, buf, addr)
                    .unwrap_or_else(|e| panic!("write {addr:#x}: {e}"));
            }
            fn set_byte(&self, addr: u64, b: u8) -> u8 {
                let mut old = [0];
                self.read(addr, &mut old);
                self.write(addr, &[b]);
                old[0]
            }
            /// Puts `int3` at every address of `points` (sorted by the
            /// caller into runs), returning the bytes it replaced.
            fn arm(&self, addrs: &[u64]) -> Vec<u8> {
                let mut orig = Vec::with_capacity(addrs.len());
                let mut k = 0;
                while k < addrs.len() {
                    let mut end = k + 1;
                    while end < addrs.len() && addrs[end] - addrs[end - 1] < 4096 {
                        end += 1;
                    }
                    let (lo, hi) = (addrs[k], addrs[end - 1] + 1);
                    let mut buf = vec![0; (hi - lo) as usize];
                    self.read(lo, &mut buf);
                    for &a in &addrs[k..end] {
                        orig.push(std::mem::replace(&mut buf[(a - lo) as usize], 0xCC));
                    }
                    self.write(lo, &buf);
                    k = end;
                }
                orig
            }
        }
        fn wait(pid: i32) -> i32 {
            let mut st = 0;
            let r = unsafe { libc::waitpid(pid, &mut st, 0) };
            assert_eq!(r, pid, "waitpid");
            st
        }
        fn resume(pid: i32, req: libc::c_uint, sig: i32) {
            let null = std::ptr::null_mut::<libc::c_void>();
            let r = unsafe { libc::ptrace(req, pid, null, sig as usize as *mut libc::c_void) };
            assert_eq!(r, 0, "ptrace resume");
        }
        fn regs(pid: i32) -> libc::user_regs_struct {
            let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
            let null = std::ptr::null_mut::<libc::c_void>();
            let p = &mut r as *mut _ as *mut libc::c_void;
            assert_eq!(
                unsafe { libc::ptrace(libc::PTRACE_GETREGS, pid, null, p) },
                0
            );
            r
        }
        fn set_regs(pid: i32, mut r: libc::user_regs_struct) {
            let null = std::ptr::null_mut::<libc::c_void>();
            let p = &mut r as *mut _ as *mut libc::c_void;
            assert_eq!(
                unsafe { libc::ptrace(libc::PTRACE_SETREGS, pid, null, p) },
                0
            );
        }
        fn exited(st: i32) -> bool {
            libc::WIFEXITED(st) || libc::WIFSIGNALED(st)
        }

        fn gpr(regs: &mut libc::user_regs_struct, i: u32) -> &mut u64 {
            match i {
                0 => &mut regs.rax,
                1 => &mut regs.rcx,
                2 => &mut regs.rdx,
                3 => &mut regs.rbx,
                4 => &mut regs.rsp,
                5 => &mut regs.rbp,
                6 => &mut regs.rsi,
                7 => &mut regs.rdi,
                8 => &mut regs.r8,
                9 => &mut regs.r9,
                10 => &mut regs.r10,
                11 => &mut regs.r11,
                12 => &mut regs.r12,
                13 => &mut regs.r13,
                14 => &mut regs.r14,
                _ => &mut regs.r15,
            }
        }

        /// Where `path` is mapped in `pid`: the start of its offset-0 mapping.
        fn mapped_at(pid: i32, path: &Path) -> u64 {
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
            let path = path.to_str().unwrap();
            maps.lines()
                .find(|l| l.ends_with(path) && l.split_whitespace().nth(2) == Some("00000000"))
                .and_then(|l| u64::from_str_radix(l.split('-').next()?, 16).ok())
                .unwrap_or_else(|| panic!("{path} is not mapped"))
        }

        /// A program run: `exe args < stdin`, stdout and stderr to `out`.
        struct Run<'a> {
            exe: &'a Path,
            args: &'a [&'a str],
            stdin: Option<&'a Path>,
            out: &'a Path,
        }

        /// Runs `r`, clobbering at the claims of `modules` (the executable
        /// first); returns the wait status and how many claims ran.
        fn run(r: &Run, modules: &mut [&mut Claims]) -> (i32, usize) {
            let cstr = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            let (cexe, cout) = (cstr(r.exe), cstr(r.out));
            let cin = cstr(r.stdin.unwrap_or(Path::new("/dev/null")));
            let cargs: Vec<CString> = r.args.iter().map(|a| CString::new(*a).unwrap()).collect();
            let mut argv = vec![cexe.as_ptr()];
            argv.extend(cargs.iter().map(|a| a.as_ptr()));
            argv.push(std::ptr::null());
            let traced = !modules.is_empty();
            // Only async-signal-safe calls between fork and exec.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork");
            if pid == 0 {
                unsafe {
                    let fd = libc::open(
                        cout.as_ptr(),
                        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
                        0o644,
                    );
                    libc::dup2(fd, 1);
                    libc::dup2(fd, 2);
                    libc::dup2(libc::open(cin.as_ptr(), libc::O_RDONLY), 0);
                    if traced {
                        let null = std::ptr::null_mut::<libc::c_void>();
                        libc::ptrace(libc::PTRACE_TRACEME, 0, null, null);
                    }
                    libc::execv(cexe.as_ptr(), argv.as_ptr());
                    libc::_exit(127);
                }
            }
            if !traced {
                return (wait(pid), 0);
            }
            let st = wait(pid);
            assert!(
                libc::WIFSTOPPED(st) && libc::WSTOPSIG(st) == libc::SIGTRAP,
                "exec stop"
            );
            let null = std::ptr::null_mut::<libc::c_void>();
            let opt = libc::PTRACE_O_EXITKILL as usize as *mut libc::c_void;
            unsafe { libc::ptrace(libc::PTRACE_SETOPTIONS, pid, null, opt) };
            // Run to the executable's entry: the libraries are mapped then.
            let exe_bias = if modules[0].pie {
                mapped_at(pid, &modules[0].path)
            } else {
                0
            };
            let entry = modules[0].entry + exe_bias;
            let mem = Mem::open(pid);
            let orig = mem.set_byte(entry, 0xCC);
            resume(pid, libc::PTRACE_CONT, 0);
            let st = wait(pid);
            assert!(
                libc::WIFSTOPPED(st) && libc::WSTOPSIG(st) == libc::SIGTRAP,
                "entry stop"
            );
            mem.set_byte(entry, orig);
            let mut rg = regs(pid);
            rg.rip = entry;
            set_regs(pid, rg);
            let mut points: HashMap<u64, &mut Point> = HashMap::new();
            for m in modules.iter_mut() {
                let bias = if m.pie { mapped_at(pid, &m.path) } else { 0 };
                let mut ps: Vec<(u64, &mut Point)> =
                    m.points.iter_mut().map(|(&a, p)| (a + bias, p)).collect();
                ps.sort_by_key(|p| p.0);
                let addrs: Vec<u64> = ps.iter().map(|p| p.0).collect();
                for ((a, p), orig) in ps.into_iter().zip(mem.arm(&addrs)) {
                    p.hits = 0;
                    p.orig = orig;
                    points.insert(a, p);
                }
            }
            let used =
                |points: &HashMap<u64, &mut Point>| points.values().filter(|p| p.hits > 0).count();
            let mut sig = 0;
            loop {
                resume(pid, libc::PTRACE_CONT, sig);
                let st = wait(pid);
                if exited(st) {
                    return (st, used(&points));
                }
                sig = libc::WSTOPSIG(st);
                if sig != libc::SIGTRAP {
                    continue;
                }
                let mut rg = regs(pid);
                let addr = rg.rip - 1;
                let Some(p) = points.get_mut(&addr) else {
                    continue;
                };
                sig = 0;
                p.hits += 1;
                rg.rip = addr;
                // (Before `leave`, rsp itself is dead and may be garbage.)
                if p.red_zone_free && !p.dead.has_gpr(RSP) {
                    mem.write(rg.rsp - 128, &[0xAA; 128]);
                }
                for i in 0..16 {
                    if p.dead.has_bit(i) {
                        *gpr(&mut rg, i) = GARBAGE | u64::from(i) << 8 | u64::from(p.hits);
                    }
                }
                for (i, f) in EFLAGS.iter().enumerate() {
                    if p.dead.has_bit(16 + i as u32) {
                        rg.eflags ^= f;
                    }
                }
                set_regs(pid, rg);
                mem.set_byte(addr, p.orig);
                if p.hits < HITS {
                    // Step over the original instruction, then re-arm.
                    let mut ssig = 0;
                    loop {
                        resume(pid, libc::PTRACE_SINGLESTEP, ssig);
                        let st = wait(pid);
                        if exited(st) {
                            return (st, used(&points));
                        }
                        ssig = libc::WSTOPSIG(st);
                        if ssig == libc::SIGTRAP {
                            break;
                        }
                    }
                    mem.set_byte(addr, 0xCC);
                }
            }
        }

        /// Runs `exe args < stdin` plainly, then with clobbering in the
        /// executable and `libs`; both runs must agree.
        fn check(
            dir: &Path,
            tag: &str,
            exe: &Path,
            args: &[&str],
            stdin: Option<&Path>,
            libs: &mut [Claims],
        ) {
            let mut exe_claims = claims(exe);
            let mut modules: Vec<&mut Claims> = std::iter::once(&mut exe_claims)
                .chain(libs.iter_mut())
                .collect();
            let n: usize = modules.iter().map(|m| m.points.len()).sum();
            let (want_out, got_out) = (
                dir.join(format!("{tag}.want")),
                dir.join(format!("{tag}.got")),
            );
            let run_to = |out| Run {
                exe,
                args,
                stdin,
                out,
            };
            let (want, _) = run(&run_to(&want_out), &mut []);
            let (got, used) = run(&run_to(&got_out), &mut modules);
            let (w, g) = (
                std::fs::read(&want_out).unwrap(),
                std::fs::read(&got_out).unwrap(),
            );
            assert!(
                want == got && w == g,
                "{tag}: clobbering dead registers changed the run: status {want:#x} -> {got:#x}\n\
                 --- want\n{}\n--- got\n{}",
                String::from_utf8_lossy(&w[..w.len().min(2000)]),
                String::from_utf8_lossy(&g[..g.len().min(2000)])
            );
            assert!(used > 20, "{tag}: only {used} of {n} claims were executed");
            eprintln!("{tag}: {used} of {n} instruction claims exercised, output unchanged");
        }

        const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

        #[test]
        fn clobbering_dead_registers_changes_nothing_in_traces() {
            let tmp = TempDir::new("traces");
            let dir = tmp.0.as_path();
            // The -O2 (PIE) builds also clobber in the C and C++ runtimes.
            let mut libc = [claims(Path::new(LIBC))];
            let mut cxx: Vec<Claims> = [
                LIBC,
                "/lib/x86_64-linux-gnu/libstdc++.so.6",
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
            ]
            .into_iter()
            .map(|l| claims(Path::new(l)))
            .collect();
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
            for src in [
                "loops.c",
                "nested_if.c",
                "switch.c",
                "recursion.c",
                "fnptr.c",
                "tailcall.c",
                "qsort_callback.c",
                "exit_nested.c",
                "noreturn.c",
                "setjmp.c",
                "signal.c",
                "computed_goto.c",
                "demo.c",
                "cache_mix.c",
                "cxx_exceptions.cpp",
            ] {
                for flags in [&["-O2"][..], &["-O0", "-no-pie"], &["-O3", "-no-pie"]] {
                    let name = Path::new(src).file_stem().unwrap().to_str().unwrap();
                    let tag = format!("{name}{}", flags.concat());
                    let exe = dir.join(&tag);
                    let cc = if src.ends_with(".cpp") { "g++" } else { "gcc" };
                    let st = std::process::Command::new(cc)
                        .args(flags)
                        .arg("-o")
                        .arg(&exe)
                        .arg(root.join("traces").join(src))
                        .status()
                        .expect("gcc runs");
                    assert!(st.success(), "{cc} failed on {src}");
                    let libs: &mut [Claims] = match (flags[0], src.ends_with(".cpp")) {
                        ("-O2", false) => &mut libc,
                        ("-O2", true) => &mut cxx,
                        _ => &mut [],
                    };
                    check(dir, &tag, &exe, &[], None, libs);
                }
            }
        }

        /// Debian's own -O2 builds: gzip, bzip2 with libbz2, xz with liblzma.
        #[test]
        fn clobbering_dead_registers_changes_nothing_in_debian_binaries() {
            let tmp = TempDir::new("system");
            let dir = tmp.0.as_path();
            // Compressible but not trivial input: this file's source.
            let input = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/liveness.rs");
            let gz = dir.join("in.gz");
            check(
                dir,
                "gzip-c",
                Path::new("/usr/bin/gzip"),
                &["-c"],
                Some(&input),
                &mut [],
            );
            let st = std::process::Command::new("gzip")
                .arg("-c")
                .stdin(std::fs::File::open(&input).unwrap())
                .stdout(std::fs::File::create(&gz).unwrap())
                .status()
                .unwrap();
            assert!(st.success());
            check(
                dir,
                "gzip-dc",
                Path::new("/usr/bin/gzip"),
                &["-dc"],
                Some(&gz),
                &mut [],
            );
            let mut bz2 = [claims(Path::new("/lib/x86_64-linux-gnu/libbz2.so.1.0"))];
            check(
                dir,
                "bzip2-c",
                Path::new("/usr/bin/bzip2"),
                &["-c"],
                Some(&input),
                &mut bz2,
            );
            let xz = dir.join("in.xz");
            let st = std::process::Command::new("xz")
                .args(["-c", "-T1"])
                .stdin(std::fs::File::open(&input).unwrap())
                .stdout(std::fs::File::create(&xz).unwrap())
                .status()
                .unwrap();
            assert!(st.success());
            let mut lzma = [claims(Path::new("/lib/x86_64-linux-gnu/liblzma.so.5"))];
            for (tag, args, stdin) in [
                ("xz-c", ["-c", "-T1"], &input),
                ("xz-dc", ["-dc", "-T1"], &xz),
            ] {
                check(
                    dir,
                    tag,
                    Path::new("/usr/bin/xz"),
                    &args,
                    Some(stdin),
                    &mut lzma,
                );
            }
        }
    }
}
