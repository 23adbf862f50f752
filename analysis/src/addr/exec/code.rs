//! Compiled address programs (issue 24, `docs/data.md` "Speed"): a
//! block's abstract execution specialised, once, to the registers known
//! at its start. Whether a register is known never depends on the values
//! (the invariant of [`super`]), so which references are static, derived
//! or recorded, which register a recorded address teaches, and which
//! updates keep a register known are fixed per (block, known registers at
//! its start): [`BlockCode::compile`] decides them with the same rules as
//! [`Exec::insn_into`], and [`Exec::run_code`] then only adds, shifts and
//! takes values, with no decoding, matching or allocation per execution.
//!
//! Invariant (tested against [`Exec::insn_into`] in `tests.rs`): running
//! a block's code from a state whose known registers are the ones it was
//! compiled for gives the same addresses, takes the same values in the
//! same order and leaves the same state as interpreting it.

use iced_x86::{Instruction, Mnemonic, OpKind, Register};

use super::{plain, Exec, InsnAddrs};
use crate::addr::full::{self, Recorded};
use crate::addr::{Access, AddrExpr, Dst, Gpr, InsnProgram, Op, RegSet, Repeat};

/// `disp (+ the load bias) (+ base) (+ index * scale)`, its registers known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Sum {
    disp: u64,
    bias: bool,
    base: Option<Gpr>,
    index: Option<(Gpr, u8)>,
}

type Regs = [Option<u64>; Gpr::COUNT];

/// A register the code knows to be known.
#[inline(always)]
fn reg(regs: &Regs, g: Gpr) -> u64 {
    debug_assert!(regs[g.index()].is_some(), "compiled for a known register");
    regs[g.index()].unwrap_or(0)
}

impl Sum {
    /// `a` when [`Exec::value`] would compute it from the registers in `k`.
    fn of(insn: &Instruction, a: &AddrExpr, k: RegSet) -> Option<Sum> {
        let known = |r: Option<Gpr>| r.map_or(true, |g| has(k, g));
        (plain(insn, a) && known(a.base) && known(a.index)).then(|| Sum {
            disp: a.disp,
            bias: a.base.is_none() && a.index.is_none() && insn.is_ip_rel_memory_operand(),
            base: a.base,
            index: a.index.map(|i| (i, a.scale)),
        })
    }

    #[inline(always)]
    fn eval(&self, regs: &Regs, bias: u64) -> u64 {
        let mut v = self.disp;
        if self.bias {
            v = v.wrapping_add(bias);
        }
        if let Some(b) = self.base {
            v = v.wrapping_add(reg(regs, b));
        }
        if let Some((i, s)) = self.index {
            v = v.wrapping_add(reg(regs, i).wrapping_mul(u64::from(s)));
        }
        v
    }

    fn reads(&self) -> RegSet {
        let mut s = RegSet::default();
        self.base.into_iter().for_each(|g| s.insert(g));
        self.index.into_iter().for_each(|(g, _)| s.insert(g));
        s
    }
}

/// `rax`, where a call's result is.
const RAX: Gpr = Gpr(0);

fn has(k: RegSet, g: Gpr) -> bool {
    k.0 & (1 << g.0) != 0
}

/// How a reference's address is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    /// From the instruction and known registers.
    Known(Sum),
    /// From the next value; `learn`: that value minus the sum is this
    /// register's ([`Exec::learn`]).
    Recorded { learn: Option<(Gpr, Sum)> },
}

/// One compiled reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefCode {
    /// Load, store or read-modify-write.
    pub access: Access,
    /// Bytes.
    pub size: u32,
    how: How,
}

/// An interpretable function of two operands (`x op y`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Func {
    Shl,
    Shr,
    Sar,
    And,
    Or,
    Xor,
    Add,
    Sub,
    Imul,
}

/// A function's second operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Src {
    Reg(Gpr),
    Imm(u64),
}

impl Src {
    #[inline(always)]
    fn eval(self, regs: &Regs) -> u64 {
        match self {
            Src::Reg(g) => reg(regs, g),
            Src::Imm(v) => v,
        }
    }
}

/// A register's new value, computable from known registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Val {
    Const(u64),
    Sum(Sum),
    /// A 32-bit `lea`: the sum's low half, zero-extended.
    Sum32(Sum),
    /// `f(x, y)` of the destination's old value `x`; `w32`: on the low
    /// halves, the result zero-extended (a 32-bit destination).
    Func {
        f: Func,
        x: Gpr,
        y: Src,
        w32: bool,
    },
    /// The low `bits` of a register, sign- or zero-extended to 64 bits
    /// (`movzx`, `movsx`, `movsxd`, a 32-bit `mov`), then cut to 32 bits
    /// when `w32`.
    Ext {
        src: Gpr,
        bits: u8,
        signed: bool,
        w32: bool,
    },
}

impl Val {
    #[inline(always)]
    pub(super) fn eval(&self, regs: &Regs, bias: u64) -> u64 {
        match *self {
            Val::Const(c) => c,
            Val::Sum(s) => s.eval(regs, bias),
            Val::Sum32(s) => s.eval(regs, bias) & LOW32,
            Val::Func { f, x, y, w32 } => apply(f, reg(regs, x), y.eval(regs), w32),
            Val::Ext {
                src,
                bits,
                signed,
                w32,
            } => extend_bits(reg(regs, src), bits, signed, w32),
        }
    }

    pub(super) fn reads(&self) -> RegSet {
        let mut s = RegSet::default();
        match *self {
            Val::Const(_) => {}
            Val::Sum(x) | Val::Sum32(x) => s = x.reads(),
            Val::Func { x, y, .. } => {
                s.insert(x);
                if let Src::Reg(g) = y {
                    s.insert(g);
                }
            }
            Val::Ext { src, .. } => s.insert(src),
        }
        s
    }
}

const LOW32: u64 = 0xffff_ffff;

/// [`Val::Ext`]'s value of `x`: its low `bits` sign- or zero-extended,
/// then cut to 32 bits when `w32`.
#[inline(always)]
fn extend_bits(x: u64, bits: u8, signed: bool, w32: bool) -> u64 {
    let shift = 64 - u32::from(bits);
    let v = match signed {
        true => (((x << shift) as i64) >> shift) as u64,
        false => (x << shift) >> shift,
    };
    if w32 {
        v & LOW32
    } else {
        v
    }
}

/// `f(x, y)` at 64 bits, or on the low halves zero-extended (`w32`: the
/// x86-64 rule for a 32-bit destination; a shift count is masked to 5
/// bits there, 6 at 64).
#[inline(always)]
fn apply(f: Func, x: u64, y: u64, w32: bool) -> u64 {
    if w32 {
        let (x, c) = (x as u32, (y & 31) as u32);
        let v = match f {
            Func::Shl => x << c,
            Func::Shr => x >> c,
            Func::Sar => ((x as i32) >> c) as u32,
            _ => apply(f, u64::from(x), y, false) as u32,
        };
        return u64::from(v);
    }
    match f {
        Func::Shl => x << (y & 63),
        Func::Shr => x >> (y & 63),
        Func::Sar => ((x as i64) >> (y & 63)) as u64,
        Func::And => x & y,
        Func::Or => x | y,
        Func::Xor => x ^ y,
        Func::Add => x.wrapping_add(y),
        Func::Sub => x.wrapping_sub(y),
        Func::Imul => x.wrapping_mul(y),
    }
}

/// A register update: its new value, or `None` (forgotten).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct UpCode {
    dst: Gpr,
    val: Option<Val>,
}

/// One compiled instruction: index ranges into its block's tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InsnCode {
    /// The instruction's link-time address and length (the walk's fetch,
    /// without touching the decoded instruction).
    pub ip: u64,
    /// Its length in bytes.
    pub len: u32,
    /// Why the reference table refuses the instruction (an error when run):
    /// an index into [`BlockCode`]'s reasons.
    fail: Option<u32>,
    /// `rsp` is taken first when unknown ([`Exec::anchor`]): it is unknown.
    anchor: bool,
    /// Then `rax`, thread constant `k` ([`InsnProgram::once`], when `rax`
    /// is unknown here).
    once: Option<u8>,
    /// Then these registers, lowest first ([`InsnProgram::before`], the
    /// ones unknown here).
    before: RegSet,
    /// A `rep` string instruction: `rcx` and `rflags` are taken first.
    rep: bool,
    refs: (u32, u32),
    ups: (u32, u32),
    /// The updates read a register an earlier one of them writes, so they
    /// read a copy of the registers before the instruction.
    snapshot: bool,
    /// References whose address the instruction gives (`full::static_addr`).
    pub statik: u32,
    /// References whose address is a value.
    pub recorded: u32,
}

/// The compiled instructions `first..` of a block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockCode {
    /// Per instruction from `first`.
    pub insns: Vec<InsnCode>,
    /// The instructions that do something (take a value, reference,
    /// update a register or fail), in order: [`Exec::run_block`] skips
    /// the others.
    busy: Vec<u32>,
    refs: Vec<RefCode>,
    ups: Vec<UpCode>,
    fails: Vec<String>,
    /// The block ends with a `ret`.
    pub ret: bool,
    /// All instructions' references, static ones and recorded ones
    /// ([`InsnCode::statik`], [`InsnCode::recorded`]), each `rep` once.
    pub totals: [u64; 3],
}

/// What a run of a block referenced ([`Exec::run_block`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockAddrs {
    /// Every reference's address, instruction after instruction, in the
    /// order of [`BlockCode::refs`] (a `rep`'s first iteration).
    pub addrs: Vec<u64>,
    /// Per `rep` string instruction run: its index in the run, and `rcx`
    /// and `rflags` before it.
    pub reps: Vec<(u32, u64, u64)>,
}

impl BlockCode {
    /// The code of instructions `first..` of a block (`insns` all of
    /// them) entered there with the registers in `known` known; `anchor`:
    /// the block [`super::anchors_rsp`].
    pub fn compile(
        known: RegSet,
        insns: &[(Instruction, InsnProgram)],
        first: usize,
        anchor: bool,
    ) -> BlockCode {
        let mut code = BlockCode::default();
        let mut k = known;
        let last = insns.len().wrapping_sub(1);
        for (at, (insn, prog)) in insns.iter().enumerate().skip(first) {
            let anchor = anchor && at == last && !has(k, Gpr::RSP);
            if anchor {
                k.insert(Gpr::RSP);
            }
            let once = prog.once.filter(|_| !has(k, RAX));
            if once.is_some() {
                k.insert(RAX);
            }
            let before = RegSet((prog.before.0 | prog.args.0) & !k.0);
            k.0 |= before.0;
            let c = code.insn(insn, prog, &mut k, (anchor, once), before);
            let n = (c.refs.1 - c.refs.0) as u64;
            code.totals[0] += n;
            code.totals[1] += u64::from(c.statik);
            code.totals[2] += u64::from(c.recorded);
            if c.anchor
                || c.once.is_some()
                || c.before.0 != 0
                || c.fail.is_some()
                || c.rep
                || n != 0
                || c.ups.0 != c.ups.1
            {
                code.busy.push(code.insns.len() as u32);
            }
            code.insns.push(c);
        }
        code.ret = insns
            .last()
            .is_some_and(|(i, _)| i.mnemonic() == Mnemonic::Ret);
        code
    }

    /// Compiles one instruction entered with `k` known; `k` becomes the
    /// registers known after it.
    fn insn(
        &mut self,
        insn: &Instruction,
        prog: &InsnProgram,
        k: &mut RegSet,
        (anchor, once): (bool, Option<u8>),
        before: RegSet,
    ) -> InsnCode {
        let refs0 = self.refs.len() as u32;
        let fail = full::refusal(insn, prog).err();
        let (mut statik, mut recorded) = (0, 0);
        for r in &prog.refs {
            statik += u32::from(full::static_addr(insn, r).is_some());
            let how = match Sum::of(insn, &r.addr, *k) {
                Some(s) => How::Known(s),
                None => {
                    recorded += 1;
                    How::Recorded {
                        learn: learn(insn, &r.addr, k),
                    }
                }
            };
            self.refs.push(RefCode {
                access: r.access,
                size: r.size,
                how,
            });
        }
        let (ups0, snapshot) = (self.ups.len() as u32, self.updates(insn, prog, k));
        let fail = fail.map(|why| {
            self.fails.push(why);
            self.fails.len() as u32 - 1
        });
        InsnCode {
            ip: insn.ip(),
            len: insn.len() as u32,
            fail,
            anchor,
            once,
            before,
            rep: prog.refs.iter().any(|r| r.repeat == Repeat::Rcx),
            refs: (refs0, self.refs.len() as u32),
            ups: (ups0, self.ups.len() as u32),
            snapshot,
            statik,
            recorded,
        }
    }

    /// Compiles the instruction's updates ([`Exec::update`]), all read in
    /// `k`; whether they need a copy of the registers before them.
    fn updates(&mut self, insn: &Instruction, prog: &InsnProgram, k: &mut RegSet) -> bool {
        let before = *k;
        let (mut written, mut snapshot) = (RegSet::default(), false);
        for u in prog.updates.iter().filter(|u| !super::passed(prog, u.dst)) {
            let (dst, val) = match u.dst {
                Dst::Full(g) => (g, eval(insn, u.dst, &u.op, before)),
                Dst::Partial(g) => (g, None),
                Dst::Flags => continue,
            };
            // Forgetting a register unknown here changes nothing: the
            // known registers at run time are `k` (the module invariant),
            // and no later update of the instruction reads it.
            if val.is_none() && !has(*k, dst) {
                continue;
            }
            snapshot |= val.is_some_and(|v| v.reads().0 & written.0 != 0);
            written.insert(dst);
            match val {
                Some(_) => k.insert(dst),
                None => k.0 &= !(1 << dst.0),
            }
            self.ups.push(UpCode { dst, val });
        }
        snapshot
    }

    /// Instruction `k`'s references.
    #[inline]
    pub fn refs(&self, k: usize) -> &[RefCode] {
        let (a, b) = self.insns[k].refs;
        &self.refs[a as usize..b as usize]
    }
}

/// What [`Exec::learn`] would teach from a recorded `a` with `k` known:
/// the register and the sum to take from the value; `k` gains it.
fn learn(insn: &Instruction, a: &AddrExpr, k: &mut RegSet) -> Option<(Gpr, Sum)> {
    if !plain(insn, a) {
        return None;
    }
    let get = |r: Option<Gpr>| r.map(|g| has(*k, g));
    let rest = |other: Option<(Gpr, u8)>| Sum {
        disp: a.disp,
        bias: false,
        base: None,
        index: other,
    };
    let learned = match (a.base, get(a.base), a.index, get(a.index)) {
        (Some(b), Some(false), i, iv) if i != Some(b) => match (i, iv) {
            (None, _) => Some((b, rest(None))),
            (Some(i), Some(true)) => Some((b, rest(Some((i, a.scale))))),
            _ => None,
        },
        (b, bv, Some(i), Some(false)) if a.scale == 1 && b != Some(i) => match (b, bv) {
            (None, _) => Some((i, rest(None))),
            (Some(b), Some(true)) => Some((i, rest(Some((b, 1))))),
            _ => None,
        },
        _ => None,
    };
    if let Some((g, _)) = learned {
        k.insert(g);
    }
    learned
}

/// A register update's new value from the registers in `k`, `None` when
/// the interpreter cannot compute it (the one evaluator: [`Exec::eval`]
/// runs it too).
pub(super) fn eval(insn: &Instruction, dst: Dst, op: &Op, k: RegSet) -> Option<Val> {
    match *op {
        Op::Const(c) => Some(Val::Const(c)),
        Op::Copy(r) => has(k, r).then_some(Val::Sum(Sum {
            disp: 0,
            bias: false,
            base: Some(r),
            index: None,
        })),
        Op::Lea(a) => Sum::of(insn, &a, k).map(Val::Sum),
        Op::Func { mnemonic, .. } => func(insn, dst, mnemonic, k),
        Op::Load { .. } | Op::Opaque { .. } => None,
    }
}

/// The interpretable register functions (`docs/data.md`, abstract
/// execution): of the destination, a 64- or 32-bit register (a 32-bit
/// write zero-extends), and an immediate or a known register: shifts,
/// logic, `add`, `sub`, `imul` (two or three operands); extensions of a
/// known register (`movzx`, `movsx`, `movsxd`, a 32-bit `mov`); a 32-bit
/// `lea`. Whether one is computable depends only on the instruction and
/// on `k`.
fn func(insn: &Instruction, dst: Dst, m: Mnemonic, k: RegSet) -> Option<Val> {
    let (Dst::Full(g), OpKind::Register) = (dst, insn.op0_kind()) else {
        return None;
    };
    let r = insn.op0_register();
    let w32 = match r.size() {
        8 => false,
        4 => true,
        _ => return None,
    };
    if Gpr::of(r) != Some(g) {
        return None;
    }
    let known = |x: Gpr| has(k, x).then_some(x);
    let src = |n: u32| match insn.op_kind(n) {
        OpKind::Register => source(insn.op_register(n))
            .and_then(|(x, _)| known(x))
            .map(Src::Reg),
        OpKind::Immediate8
        | OpKind::Immediate8to32
        | OpKind::Immediate8to64
        | OpKind::Immediate32
        | OpKind::Immediate32to64 => Some(Src::Imm(insn.immediate(n))),
        _ => None,
    };
    let f = match m {
        Mnemonic::Mov | Mnemonic::Movzx | Mnemonic::Movsx | Mnemonic::Movsxd => {
            return extend(insn, m, w32, &known)
        }
        Mnemonic::Lea if w32 => return Sum::of(insn, &lea_addr(insn), k).map(Val::Sum32),
        Mnemonic::Imul if insn.op_count() == 3 => {
            let x = source(insn.op1_register()).and_then(|(x, _)| known(x))?;
            let y = src(2).filter(|y| matches!(y, Src::Imm(_)))?;
            return Some(Val::Func {
                f: Func::Imul,
                x,
                y,
                w32,
            });
        }
        Mnemonic::Shl => Func::Shl,
        Mnemonic::Shr => Func::Shr,
        Mnemonic::Sar => Func::Sar,
        Mnemonic::And => Func::And,
        Mnemonic::Or => Func::Or,
        Mnemonic::Xor => Func::Xor,
        Mnemonic::Add => Func::Add,
        Mnemonic::Sub => Func::Sub,
        Mnemonic::Imul => Func::Imul,
        _ => return None,
    };
    let y = src(1)?;
    // A shift by `cl` is not a form here (its count is a register).
    let shift = matches!(f, Func::Shl | Func::Shr | Func::Sar);
    if insn.op_count() != 2 || (shift && !matches!(y, Src::Imm(_))) {
        return None;
    }
    Some(Val::Func {
        f,
        x: known(g)?,
        y,
        w32,
    })
}

/// `movzx`, `movsx`, `movsxd` and `mov` of a known register into a
/// 64- or 32-bit one.
fn extend(
    insn: &Instruction,
    m: Mnemonic,
    w32: bool,
    known: &dyn Fn(Gpr) -> Option<Gpr>,
) -> Option<Val> {
    if insn.op_count() != 2 || insn.op1_kind() != OpKind::Register {
        return None;
    }
    let (x, bits) = source(insn.op1_register())?;
    let signed = matches!(m, Mnemonic::Movsx | Mnemonic::Movsxd);
    // A 64-bit `mov` of a register is a copy (`Op::Copy`), not a function.
    (bits < 64).then_some(Val::Ext {
        src: known(x)?,
        bits,
        signed,
        w32,
    })
}

/// The general-purpose register holding `r` and the width of `r` in
/// bits, when `r` is its low part (not `ah`, `bh`, `ch`, `dh`).
fn source(r: Register) -> Option<(Gpr, u8)> {
    let high = matches!(r, Register::AH | Register::BH | Register::CH | Register::DH);
    Gpr::of(r)
        .filter(|_| !high)
        .map(|g| (g, (r.size() * 8) as u8))
}

/// A `lea`'s address (no segment: a `lea` adds none).
fn lea_addr(insn: &Instruction) -> AddrExpr {
    crate::addr::forms::lea_addr(insn)
}

impl Exec {
    /// Runs instruction `k` of `code` (compiled for the registers known
    /// now): [`Exec::insn_into`]'s addresses into `out` (`out.recorded`
    /// left empty: [`InsnCode::recorded`] counts them), the same values
    /// taken, in the same order, the same state after.
    #[inline]
    pub fn run_code(
        &mut self,
        code: &BlockCode,
        k: usize,
        take: &mut impl FnMut(Recorded) -> Result<u64, String>,
        out: &mut InsnAddrs,
    ) -> Result<(), String> {
        out.addrs.clear();
        out.recorded.clear();
        out.rep = self.step(code, k, take, &mut out.addrs)?;
        Ok(())
    }

    /// Runs instructions `0..n` of `code` as [`Exec::run_code`] does, one
    /// after the other, their addresses into `out` (cleared first): one
    /// pass over the block, for a walk that feeds its consumer per block.
    /// An error names the instruction that failed.
    #[inline]
    pub fn run_block(
        &mut self,
        code: &BlockCode,
        n: usize,
        take: &mut impl FnMut(Recorded) -> Result<u64, String>,
        out: &mut BlockAddrs,
    ) -> Result<(), (usize, String)> {
        out.addrs.clear();
        out.reps.clear();
        let busy = code.busy.iter().map(|&k| k as usize);
        for k in busy.take_while(|&k| k < n) {
            match self.step(code, k, take, &mut out.addrs) {
                Ok(None) => {}
                Ok(Some((rcx, flags))) => out.reps.push((k as u32, rcx, flags)),
                Err(why) => return Err((k, why)),
            }
        }
        Ok(())
    }

    /// Instruction `k` of `code`: its addresses appended to `addrs`, its
    /// `rep`'s `rcx` and `rflags`.
    #[inline(always)]
    fn step(
        &mut self,
        code: &BlockCode,
        k: usize,
        take: &mut impl FnMut(Recorded) -> Result<u64, String>,
        addrs: &mut Vec<u64>,
    ) -> Result<Option<(u64, u64)>, String> {
        let c = &code.insns[k];
        // Before any value is read: the rewriter recorded none for it.
        if let Some(why) = c.fail {
            return Err(code.fails[why as usize].clone());
        }
        if c.anchor {
            self.regs[Gpr::RSP.index()] = Some(take(Recorded::Rsp)?);
        }
        if let Some(once) = c.once {
            self.regs[RAX.index()] = Some(take(Recorded::Once(once))?);
        }
        let mut before = c.before.0;
        while before != 0 {
            let g = Gpr(before.trailing_zeros() as u8);
            self.regs[g.index()] = Some(take(Recorded::Reg(g))?);
            before &= before - 1;
        }
        let rep = match c.rep {
            true => Some((take(Recorded::Rcx)?, take(Recorded::Flags)?)),
            false => None,
        };
        for (j, r) in code.refs(k).iter().enumerate() {
            let a = match r.how {
                How::Known(s) => s.eval(&self.regs, self.bias),
                How::Recorded { learn } => {
                    let a = take(Recorded::Addr(j))?;
                    if let Some((g, s)) = learn {
                        self.regs[g.index()] = Some(a.wrapping_sub(s.eval(&self.regs, self.bias)));
                    }
                    a
                }
            };
            addrs.push(a);
        }
        let ups = &code.ups[c.ups.0 as usize..c.ups.1 as usize];
        let before = if c.snapshot { Some(self.regs) } else { None };
        for u in ups {
            let regs = before.as_ref().unwrap_or(&self.regs);
            let v = u.val.map(|v| v.eval(regs, self.bias));
            self.regs[u.dst.index()] = v;
        }
        Ok(rep)
    }
}

pub mod flat;

#[cfg(test)]
mod tests;
