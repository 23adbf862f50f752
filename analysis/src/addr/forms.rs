//! The reference-form table: one instruction as an [`InsnProgram`].
//!
//! References follow iced's `used_memory` (explicit operands and the
//! implicit ones of push/pop/call/ret/leave/enter and the string
//! instructions), adjusted to how valgrind lackey counts them
//! (`DESIGN-data.md`, "Counting as lackey does"; lackey instruments VEX's
//! IR: a load and a store of the same address temporary merge into `M`):
//! - a read-modify-write (`add [m], r`, `inc`, `xadd`, `cmpxchg`) is one
//!   `M`; a locked one (a `lock` prefix, or `xchg` with memory, always
//!   locked) other than `cmpxchg` is `L` + `M`: VEX loads the old value,
//!   then compare-and-swaps it (measured with valgrind 3.19's lackey and
//!   cachegrind, `traces/nolibc_data.c`); `movs` is `L` + `S`, `cmps`
//!   `L` + `L`;
//! - a `rep` string instruction's references happen once per iteration
//!   ([`Repeat`]: block counts weight them exactly only when `rcx` is a
//!   known constant);
//! - `bt`/`bts`/`btr`/`btc` with a register bit offset touch the one byte
//!   `sar(offset, 3)` past the operand (VEX's translation);
//! - a gather is one load per lane (the lanes' index is a vector register);
//! - `fxsave`/`fxrstor` are 18 references of their 512-byte area, as VEX
//!   splits them (x87 state, MXCSR, the XMM registers: `fx_refs`);
//! - `lea`, `nop` and prefetches touch nothing.
//!
//! Updates say how each general-purpose register (and the flags) written
//! is computed: copies, constants and address-like sums (`Lea`) exactly,
//! other arithmetic on registers as `Func`, loads as `Load`, and what reads
//! memory, vector or system state, or a callee's result, as `Opaque`.
//!
//! Not pinned by a test against lackey yet (issue 21's golden program):
//! `xsave` (one event of size 0: its size depends on XCR0 and the mask),
//! masked vector moves (one event of the vector's size), gathers.

use iced_x86::{
    FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register,
    RflagsBits, UsedMemory,
};

use super::{AddrExpr, Dst, Gpr, InsnProgram, MemRef, Op, RegSet, Repeat, Seg, Stored, Update};
use crate::addr::Access;

/// The flags a computation depends on (`DF` is fixed by the ABI).
const STATUS_FLAGS: u32 = RflagsBits::CF
    | RflagsBits::PF
    | RflagsBits::AF
    | RflagsBits::ZF
    | RflagsBits::SF
    | RflagsBits::OF;

/// Registers a call may change (SysV): every caller-saved one.
const CALLER_SAVED: [u8; 9] = [0, 1, 2, 6, 7, 8, 9, 10, 11];

/// The address program of `insn`.
pub fn program(insn: &Instruction, info: &mut InstructionInfoFactory) -> InsnProgram {
    let inf = info.info(insn);
    let mem: Vec<UsedMemory> = inf.used_memory().to_vec();
    let regs: Vec<(Register, OpAccess)> = inf
        .used_registers()
        .iter()
        .map(|u| (u.register(), u.access()))
        .collect();
    let refs = refs(insn, &mem);
    let call = matches!(
        insn.flow_control(),
        FlowControl::Call | FlowControl::IndirectCall
    ) && !crate::procs::is_syscall(insn);
    let updates = if call {
        call_updates()
    } else {
        updates(insn, &mem, &regs)
    };
    InsnProgram {
        refs,
        updates,
        call,
        before: RegSet::default(),
        once: None,
        args: RegSet::default(),
    }
}

fn gpr(r: Register) -> Option<Gpr> {
    Gpr::of(r)
}

fn addr_of(m: &UsedMemory) -> AddrExpr {
    let seg = match m.segment() {
        Register::FS => Seg::Fs,
        Register::GS => Seg::Gs,
        _ => Seg::Flat,
    };
    let index = gpr(m.index());
    AddrExpr {
        seg,
        base: gpr(m.base()),
        index,
        scale: if index.is_some() { m.scale() as u8 } else { 1 },
        disp: m.displacement(),
        bit_offset: None,
        vector_index: m.index().is_vector_register(),
    }
}

fn access_of(a: OpAccess) -> Option<Access> {
    match a {
        OpAccess::Read | OpAccess::CondRead => Some(Access::Load),
        OpAccess::Write | OpAccess::CondWrite => Some(Access::Store),
        OpAccess::ReadWrite | OpAccess::ReadCondWrite => Some(Access::Modify),
        _ => None,
    }
}

/// What an 8-byte store of `insn` writes, when it is a register or a
/// constant.
fn stored(insn: &Instruction) -> Option<Stored> {
    match insn.mnemonic() {
        Mnemonic::Call => Some(Stored::Imm(insn.next_ip())),
        Mnemonic::Push | Mnemonic::Mov => {
            let k = if insn.mnemonic() == Mnemonic::Push {
                0
            } else {
                1
            };
            match insn.op_kind(k) {
                OpKind::Register => gpr(insn.op_register(k))
                    .filter(|_| insn.op_register(k).size() == 8)
                    .map(Stored::Reg),
                OpKind::Immediate32to64 | OpKind::Immediate8to64 => {
                    Some(Stored::Imm(insn.immediate(k)))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

fn refs(insn: &Instruction, mem: &[UsedMemory]) -> Vec<MemRef> {
    let string = insn.is_string_instruction();
    let repeat = match (string, insn.has_rep_prefix() || insn.has_repne_prefix()) {
        (true, true) if stops_on_data(insn) => Repeat::UntilData,
        (true, true) => Repeat::Rcx,
        _ => Repeat::Once,
    };
    if let (Some(access), [m]) = (fx_access(insn), mem) {
        return fx_refs(access, addr_of(m));
    }
    let mut out = Vec::with_capacity(mem.len());
    for m in mem {
        let Some(access) = access_of(m.access()) else {
            continue;
        };
        let mut r = MemRef {
            access,
            size: m.memory_size().size() as u32,
            addr: addr_of(m),
            repeat,
            stored: None,
        };
        if string && r.size == 0 {
            r.size = insn.memory_size().size() as u32;
        }
        if r.size == 8 && access == Access::Store {
            r.stored = stored(insn);
        }
        if let Some(off) = bit_offset(insn) {
            r.size = 1;
            r.addr.bit_offset = Some(off);
        }
        if access == Access::Modify && load_before_cas(insn) {
            out.push(MemRef {
                access: Access::Load,
                stored: None,
                ..r
            });
        }
        let lanes = if r.addr.vector_index { lanes(insn) } else { 1 };
        out.extend(std::iter::repeat(r).take(lanes));
    }
    // Lackey's order: VEX loads before it stores (`movs`: L then S).
    out.sort_by_key(|r| r.access == Access::Store);
    out
}

/// `fxsave` (a store) or `fxrstor` (a load), with or without REX.W.
fn fx_access(insn: &Instruction) -> Option<Access> {
    match insn.mnemonic() {
        Mnemonic::Fxsave | Mnemonic::Fxsave64 => Some(Access::Store),
        Mnemonic::Fxrstor | Mnemonic::Fxrstor64 => Some(Access::Load),
        _ => None,
    }
}

/// The 512-byte area at `addr` as VEX's `fxsave`/`fxrstor` touch it
/// (measured with valgrind 3.19's lackey, `traces/nolibc_data.c`): the
/// first 160 bytes (the x87 state), 8 at +24 (MXCSR and its mask), then
/// each of the 16 XMM registers, 16 bytes from +160.
fn fx_refs(access: Access, addr: AddrExpr) -> Vec<MemRef> {
    let at = |off: u64, size: u32| MemRef {
        access,
        size,
        addr: AddrExpr {
            disp: addr.disp.wrapping_add(off),
            ..addr
        },
        repeat: Repeat::Once,
        stored: None,
    };
    let xmm = (0..16).map(|k| at(160 + 16 * k, 16));
    [at(0, 160), at(24, 8)].into_iter().chain(xmm).collect()
}

/// Whether VEX translates `insn`'s read-modify-write as a load and then a
/// compare-and-swap of the value loaded (lackey's `L` + `M`): a locked
/// one, except `cmpxchg`, whose compare-and-swap is the instruction itself.
fn load_before_cas(insn: &Instruction) -> bool {
    let cmpxchg = matches!(
        insn.mnemonic(),
        Mnemonic::Cmpxchg | Mnemonic::Cmpxchg8b | Mnemonic::Cmpxchg16b
    );
    (insn.has_lock_prefix() || insn.mnemonic() == Mnemonic::Xchg) && !cmpxchg
}

/// A string compare (`cmps`, `scas`): with `repe`/`repne` it stops on
/// the data.
fn stops_on_data(insn: &Instruction) -> bool {
    matches!(
        insn.mnemonic(),
        Mnemonic::Cmpsb
            | Mnemonic::Cmpsw
            | Mnemonic::Cmpsd
            | Mnemonic::Cmpsq
            | Mnemonic::Scasb
            | Mnemonic::Scasw
            | Mnemonic::Scasd
            | Mnemonic::Scasq
    )
}

/// The bit-offset register of `bt`-family instructions on memory.
fn bit_offset(insn: &Instruction) -> Option<Gpr> {
    let bt = matches!(
        insn.mnemonic(),
        Mnemonic::Bt | Mnemonic::Bts | Mnemonic::Btr | Mnemonic::Btc
    );
    (bt && insn.op0_kind() == OpKind::Memory && insn.op1_kind() == OpKind::Register)
        .then(|| gpr(insn.op1_register()))
        .flatten()
}

/// A gather's lanes: the destination's elements, or the index vector's
/// when it has fewer.
fn lanes(insn: &Instruction) -> usize {
    let elem = insn.memory_size().size().max(1);
    let dst = insn.op0_register().size() / elem;
    let idx = insn.memory_index().size() / if insn.is_vsib32() { 4 } else { 8 };
    dst.min(idx).max(1)
}

fn full(g: Gpr, op: Op) -> Update {
    Update {
        dst: Dst::Full(g),
        op,
    }
}

fn lea(base: Gpr, disp: i64) -> Op {
    Op::Lea(AddrExpr {
        disp: disp as u64,
        ..lea_expr(base)
    })
}

/// After a call returns: `rsp` and the callee-saved registers are as
/// before, the caller-saved ones and the flags are the callee's.
fn call_updates() -> Vec<Update> {
    let mut u: Vec<Update> = CALLER_SAVED
        .iter()
        .map(|&r| full(Gpr(r), Op::Opaque { width: 8 }))
        .collect();
    u.push(Update {
        dst: Dst::Flags,
        op: Op::Opaque { width: 1 },
    });
    u
}

/// The updates of the stack instructions, whose `rsp` change is implicit.
fn stack_updates(insn: &Instruction) -> Option<Vec<Update>> {
    let rsp = Gpr::RSP;
    let at = lea_expr;
    // `push ax` moves rsp by 2: iced knows each form's increment.
    let moved = || full(rsp, lea(rsp, i64::from(insn.stack_pointer_increment())));
    Some(match insn.mnemonic() {
        Mnemonic::Push | Mnemonic::Pushf | Mnemonic::Pushfq => vec![moved()],
        Mnemonic::Pop => {
            let mut u = vec![moved()];
            if insn.op0_kind() == OpKind::Register {
                let r = insn.op0_register();
                let g = gpr(r)?;
                let op = Op::Load {
                    addr: at(rsp),
                    size: r.size() as u32,
                };
                u.push(if r.size() == 8 {
                    full(g, op)
                } else {
                    partial(g, op)
                });
            }
            u
        }
        Mnemonic::Popf | Mnemonic::Popfq => vec![
            moved(),
            Update {
                dst: Dst::Flags,
                op: Op::Opaque { width: 1 },
            },
        ],
        Mnemonic::Leave => vec![
            full(rsp, lea(Gpr::RBP, 8)),
            full(
                Gpr::RBP,
                Op::Load {
                    addr: at(Gpr::RBP),
                    size: 8,
                },
            ),
        ],
        Mnemonic::Enter => vec![
            full(Gpr::RBP, lea(rsp, -8)),
            full(rsp, lea(rsp, -8 - i64::from(insn.immediate16()))),
        ],
        Mnemonic::Ret => vec![full(
            rsp,
            lea(rsp, i64::from(insn.stack_pointer_increment())),
        )],
        Mnemonic::Syscall => vec![
            full(Gpr(0), Op::Opaque { width: 8 }),
            full(Gpr(1), Op::Const(insn.next_ip())),
            full(Gpr(11), Op::Opaque { width: 8 }),
        ],
        _ => return None,
    })
}

fn partial(g: Gpr, op: Op) -> Update {
    Update {
        dst: Dst::Partial(g),
        op,
    }
}

/// Instructions whose result depends on machine state the interpreter
/// does not have, though they read no memory and no vector register.
fn reads_machine_state(m: Mnemonic) -> bool {
    use Mnemonic::*;
    matches!(
        m,
        Rdtsc
            | Rdtscp
            | Rdrand
            | Rdseed
            | Cpuid
            | Xgetbv
            | Rdpid
            | Rdpkru
            | Rdsspd
            | Rdsspq
            | Rdfsbase
            | Rdgsbase
            | Lar
            | Lsl
            | Str
            | Sldt
            | Smsw
            | In
            | Xbegin
            | Rdpmc
            | Rdmsr
    )
}

/// Whether an access writes the register (a conditional write too).
fn writes(a: OpAccess) -> bool {
    matches!(
        a,
        OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
    )
}

/// Whether an access reads the register (a conditional write keeps the
/// old value, so it reads it too).
fn reads(a: OpAccess) -> bool {
    a == OpAccess::Read || a == OpAccess::CondRead || writes(a) && a != OpAccess::Write
}

fn updates(insn: &Instruction, mem: &[UsedMemory], regs: &[(Register, OpAccess)]) -> Vec<Update> {
    if let Some(u) = stack_updates(insn) {
        return u;
    }
    let m = insn.mnemonic();
    let reads_data = m != Mnemonic::Lea
        && mem.iter().any(|u| {
            matches!(
                u.access(),
                OpAccess::Read | OpAccess::CondRead | OpAccess::ReadWrite | OpAccess::ReadCondWrite
            )
        });
    // A repeated compare stops on the data: its counters and pointers
    // after it depend on memory.
    let data_stop = insn.is_string_instruction()
        && (insn.has_repe_prefix() || insn.has_repne_prefix())
        && stops_on_data(insn);
    // A string instruction's pointers and counter advance by its size,
    // whatever the data (the accumulator `lods` loads excepted).
    let string_reg = |g: Gpr| insn.is_string_instruction() && matches!(g.0, 1 | 6 | 7);
    let opaque_always = data_stop
        || reads_machine_state(m)
        || regs
            .iter()
            .any(|&(r, a)| reads(a) && gpr(r).is_none() && !r.is_segment_register());
    let mut inputs = RegSet::default();
    for &(r, a) in regs {
        if let Some(g) = gpr(r).filter(|_| reads(a)) {
            inputs.insert(g);
        }
    }
    let flags_in = insn.rflags_read() & STATUS_FLAGS != 0;
    let mut out = Vec::new();
    let mut seen = RegSet::default();
    for &(r, a) in regs {
        let Some(g) = gpr(r).filter(|_| writes(a)) else {
            continue;
        };
        if seen.0 & (1 << g.0) != 0 {
            continue;
        }
        seen.insert(g);
        let op = if opaque_always || (reads_data && !string_reg(g)) {
            opaque_op(insn, r, mem, data_stop)
        } else if string_reg(g) {
            string_op(insn, g)
        } else {
            exact_op(insn, r).unwrap_or(Op::Func {
                mnemonic: m,
                inputs,
                flags: flags_in,
            })
        };
        out.push(if r.size() >= 4 {
            full(g, op)
        } else {
            partial(g, op)
        });
    }
    if insn.rflags_modified() & STATUS_FLAGS != 0 {
        let op = if opaque_always || reads_data {
            Op::Opaque { width: 1 }
        } else {
            Op::Func {
                mnemonic: m,
                inputs,
                flags: flags_in,
            }
        };
        out.push(Update {
            dst: Dst::Flags,
            op,
        });
    }
    out
}

/// A string instruction's pointer or counter: a `rep` ends with `rcx`
/// zero, and each pointer advanced by a function of itself and `rcx`
/// (its size and the direction flag, set by `cld`/`std`).
fn string_op(insn: &Instruction, g: Gpr) -> Op {
    let rep = insn.has_rep_prefix() || insn.has_repne_prefix();
    let mut inputs = RegSet::default();
    inputs.insert(g);
    match g.0 {
        1 if rep => Op::Const(0),
        _ => {
            if rep {
                inputs.insert(Gpr(1));
            }
            Op::Func {
                mnemonic: insn.mnemonic(),
                inputs,
                flags: false,
            }
        }
    }
}

/// A register written from memory or machine state: a load when the
/// instruction only moves memory into it, else its result is opaque.
fn opaque_op(insn: &Instruction, r: Register, mem: &[UsedMemory], data_stop: bool) -> Op {
    let moves = matches!(
        insn.mnemonic(),
        Mnemonic::Mov | Mnemonic::Movzx | Mnemonic::Movsx | Mnemonic::Movsxd | Mnemonic::Xchg
    );
    let loaded = mem.iter().find(|u| access_of(u.access()).is_some());
    match loaded {
        Some(u) if moves && !data_stop && insn.op0_register() == r => Op::Load {
            addr: addr_of(u),
            size: u.memory_size().size() as u32,
        },
        _ => Op::Opaque {
            width: r.size() as u8,
        },
    }
}

/// The exact forms of register arithmetic (copies, constants, sums);
/// `None` for the other interpretable operations.
fn exact_op(insn: &Instruction, written: Register) -> Option<Op> {
    let dst = gpr(written)?;
    // iced names a 32-bit destination by its 64-bit register (the write
    // zero-extends); the operand says the width.
    let r = match insn.op0_kind() {
        OpKind::Register if gpr(insn.op0_register()) == Some(dst) => insn.op0_register(),
        _ => written,
    };
    let wide = r.size() == 8;
    let same_regs = insn.op_count() == 2
        && insn.op0_kind() == OpKind::Register
        && insn.op1_kind() == OpKind::Register
        && insn.op0_register() == insn.op1_register();
    let src = (insn.op_count() == 2 && insn.op1_kind() == OpKind::Register)
        .then(|| insn.op1_register())
        .filter(|s| s.size() == 8)
        .and_then(gpr);
    let imm = match insn.op_count() {
        2 if insn.op1_kind() != OpKind::Register && insn.op1_kind() != OpKind::Memory => {
            Some(insn.immediate(1))
        }
        _ => None,
    };
    let op0_is_dst = insn.op0_kind() == OpKind::Register && insn.op0_register() == r;
    match insn.mnemonic() {
        Mnemonic::Xor | Mnemonic::Sub if same_regs && r.size() >= 4 => Some(Op::Const(0)),
        Mnemonic::Mov if op0_is_dst && r.size() >= 4 => match (imm, src) {
            (Some(v), _) if wide => Some(Op::Const(v)),
            (Some(v), _) => Some(Op::Const(v & 0xffff_ffff)),
            (None, Some(s)) if wide => Some(Op::Copy(s)),
            _ => None,
        },
        Mnemonic::Xchg if wide && insn.op0_kind() == OpKind::Register => {
            let other = if op0_is_dst {
                insn.op1_register()
            } else {
                insn.op0_register()
            };
            gpr(other).filter(|_| other.size() == 8).map(Op::Copy)
        }
        Mnemonic::Lea if wide => Some(Op::Lea(lea_addr(insn))),
        Mnemonic::Add | Mnemonic::Sub if wide && op0_is_dst => {
            let neg = insn.mnemonic() == Mnemonic::Sub;
            match (imm, src) {
                (Some(v), _) => Some(lea(
                    dst,
                    if neg {
                        (v as i64).wrapping_neg()
                    } else {
                        v as i64
                    },
                )),
                (None, Some(s)) if !neg => Some(Op::Lea(AddrExpr {
                    index: Some(s),
                    ..lea_expr(dst)
                })),
                _ => None,
            }
        }
        Mnemonic::Inc if wide => Some(lea(dst, 1)),
        Mnemonic::Dec if wide => Some(lea(dst, -1)),
        _ => None,
    }
}

/// `[base]`.
fn lea_expr(base: Gpr) -> AddrExpr {
    AddrExpr {
        seg: Seg::Flat,
        base: Some(base),
        index: None,
        scale: 1,
        disp: 0,
        bit_offset: None,
        vector_index: false,
    }
}

/// A 64-bit `lea`'s address, without segment (a `lea` adds none).
pub(crate) fn lea_addr(insn: &Instruction) -> AddrExpr {
    let rip = insn.memory_base() == Register::RIP;
    let index = gpr(insn.memory_index());
    AddrExpr {
        seg: Seg::Flat,
        base: if rip { None } else { gpr(insn.memory_base()) },
        index,
        scale: if index.is_some() {
            insn.memory_index_scale() as u8
        } else {
            1
        },
        disp: if rip {
            insn.ip_rel_memory_address()
        } else {
            insn.memory_displacement64()
        },
        bit_offset: None,
        vector_index: false,
    }
}
