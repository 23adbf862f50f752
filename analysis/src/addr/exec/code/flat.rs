//! A whole block's compiled code as one straight-line list of micro-ops
//! over a plain register file (issue 21/24, `docs/data.md` "Speed"): the
//! form the data walk runs for every run of a block from its first
//! instruction to its end when the block has no `rep` string instruction
//! and no refused one (the others keep [`Exec::run_block`]).
//!
//! Which registers are known is fixed per (block, known registers at its
//! start) (the invariant of [`super::super`]), so the register file is
//! plain `u64`s and one [`RegSet`] that changes only at a block's entry
//! ([`Regs::keep_exactly`]) and exit ([`FlatCode::exit`]): forgetting a
//! register costs nothing, an unknown register's slot holds a stale value
//! no op reads. A sum reads two slots and a scale with no branch (a
//! missing register is the [`ZERO`] slot), the load bias is folded into
//! the displacement, and an instruction whose updates read what another
//! of them writes computes them into temporary slots first.
//!
//! Invariant (tested against [`Exec::run_block`] in `tests.rs`): from a
//! state whose known registers are the block's compiled ones, [`FlatCode::run`]
//! gives the same addresses, takes the same values in the same order, and
//! leaves the same known registers with the same values; [`FlatCode::run_into`]
//! puts each address at its places in a consumer's records instead. The
//! codes of blocks that follow each other chained ([`FlatCode::chain`],
//! a summarised segment's program) run as the blocks one after the
//! other, each entered with the registers the one before left.

use super::{apply, extend_bits, BlockCode, Func, How, Src, Sum, Val, LOW32};
use crate::addr::exec::Exec;
use crate::addr::full::Recorded;
use crate::addr::{Gpr, RegSet};

/// A slot that is always 0 (a sum's missing base or index).
pub const ZERO: u8 = 16;
/// A slot written and never read (a recorded address that teaches nothing).
const DISCARD: u8 = 17;
/// The first temporary slot (updates that read each other's results).
const TEMP: u8 = 18;
/// Slots: the 16 registers, [`ZERO`], [`DISCARD`], temporaries.
pub const SLOTS: usize = 32;

/// The thread's registers for flat code: values, and which are known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Regs {
    /// Per slot; a register not in `known` holds a stale value.
    pub v: [u64; SLOTS],
    /// The known registers.
    pub known: RegSet,
}

impl Default for Regs {
    fn default() -> Self {
        Regs {
            v: [0; SLOTS],
            known: RegSet(0),
        }
    }
}

impl Regs {
    /// The known register `g`'s value.
    pub fn get(&self, g: Gpr) -> Option<u64> {
        (self.known.0 >> g.0 & 1 != 0).then_some(self.v[g.index()])
    }

    /// `g` known, with value `v`.
    pub fn set(&mut self, g: Gpr, v: u64) {
        self.v[g.index()] = v;
        self.known.insert(g);
    }

    /// Forgets every register not in `known`; whether every one in it
    /// was known.
    #[inline(always)]
    pub fn keep_exactly(&mut self, known: RegSet) -> bool {
        let all = self.known.0 & known.0 == known.0;
        self.known = RegSet(self.known.0 & known.0);
        all
    }

    /// The same state as the interpreter's, with load bias `bias`.
    pub fn exec(&self, bias: u64) -> Exec {
        let mut e = Exec::unknown(bias);
        for g in self.known.iter() {
            e.regs[g.index()] = Some(self.v[g.index()]);
        }
        e
    }

    /// The interpreter's state `e`.
    pub fn of(e: &Exec) -> Regs {
        let mut r = Regs::default();
        for (g, v) in e.regs.iter().enumerate() {
            if let Some(v) = *v {
                r.set(Gpr(g as u8), v);
            }
        }
        r
    }
}

/// `disp + v[base] + v[index] * scale` (the bias folded into `disp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FSum {
    disp: u64,
    base: u8,
    index: u8,
    scale: u8,
}

impl FSum {
    fn of(s: &Sum, bias: u64) -> FSum {
        let (index, scale) = s.index.map_or((ZERO, 0), |(g, sc)| (g.0, sc));
        FSum {
            disp: if s.bias {
                s.disp.wrapping_add(bias)
            } else {
                s.disp
            },
            base: s.base.map_or(ZERO, |g| g.0),
            index,
            scale,
        }
    }

    /// Slot `slot` alone (a move).
    fn slot(slot: u8) -> FSum {
        FSum {
            disp: 0,
            base: slot,
            index: ZERO,
            scale: 0,
        }
    }

    #[inline(always)]
    fn eval(&self, v: &[u64; SLOTS]) -> u64 {
        let b = v[self.base as usize & (SLOTS - 1)];
        let i = v[self.index as usize & (SLOTS - 1)];
        (self.disp)
            .wrapping_add(b)
            .wrapping_add(i.wrapping_mul(u64::from(self.scale)))
    }
}

/// One micro-op; `k`: its instruction's index in the block (for errors).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// `v[dst]` = the next value (`what`: `Rsp` or `Reg`).
    Take { k: u16, dst: u8, what: Recorded },
    /// The next address: a sum; `at`: where [`FlatCode::run_into`] puts
    /// it ([`FlatCode::placed`]).
    Addr { s: FSum, at: [u32; 2] },
    /// The next address: the next value (reference `j` of its
    /// instruction), which teaches `v[dst]` = value - `s`.
    Rec {
        k: u16,
        j: u8,
        dst: u8,
        s: FSum,
        at: [u32; 2],
    },
    /// `v[dst]` = the sum, masked (a 32-bit `lea`).
    Set { dst: u8, s: FSum, mask: u64 },
    /// `v[dst]` = `f(v[x], v[y] + imm)`.
    Func {
        dst: u8,
        f: Func,
        x: u8,
        y: u8,
        imm: u64,
        w32: bool,
    },
    /// `v[dst]` = the low `bits` of `v[src]`, extended.
    Ext {
        dst: u8,
        src: u8,
        bits: u8,
        signed: bool,
        w32: bool,
    },
}

impl Op {
    /// The op's instruction number, if it has one (it may fail).
    fn insn_mut(&mut self) -> Option<&mut u16> {
        match self {
            Op::Take { k, .. } | Op::Rec { k, .. } => Some(k),
            _ => None,
        }
    }

    /// The op's places in a consumer's records, if it gives an address.
    fn at_mut(&mut self) -> Option<&mut [u32; 2]> {
        match self {
            Op::Addr { at, .. } | Op::Rec { at, .. } => Some(at),
            _ => None,
        }
    }
}

/// A whole block's flat code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlatCode {
    ops: Vec<Op>,
    /// The block's references (each run's addresses).
    pub refs: usize,
    /// The registers known at the block's end.
    pub exit: RegSet,
}

impl FlatCode {
    /// The flat form of `code` (compiled from a block's first
    /// instruction for the registers in `known`), for load bias `bias`;
    /// `None` for a block with a `rep` string instruction or one the
    /// reference table refuses.
    pub fn of(code: &BlockCode, known: RegSet, bias: u64) -> Option<FlatCode> {
        let mut f = FlatCode {
            ops: Vec::new(),
            refs: code.refs.len(),
            exit: known,
        };
        for (k, c) in code.insns.iter().enumerate() {
            if c.rep || c.fail.is_some() {
                return None;
            }
            let k = u16::try_from(k).ok()?;
            if c.anchor {
                f.take(k, Gpr::RSP, Recorded::Rsp);
            }
            if let Some(once) = c.once {
                f.take(k, Gpr(0), Recorded::Once(once));
            }
            c.before.iter().for_each(|g| f.take(k, g, Recorded::Reg(g)));
            let refs = &code.refs[c.refs.0 as usize..c.refs.1 as usize];
            for (j, r) in refs.iter().enumerate() {
                f.reference(k, j, &r.how, bias)?;
            }
            f.updates(
                &code.ups[c.ups.0 as usize..c.ups.1 as usize],
                c.snapshot,
                bias,
            )?;
        }
        f.place(|n| [n as u32; 2]);
        Some(f)
    }

    /// The same code, its `n`-th address put at `at(n)` by
    /// [`FlatCode::run_into`] (both places for a read-modify-write's
    /// read and write, the same place twice for the others): a
    /// consumer's records of a whole run, filled in place.
    pub fn placed(&self, at: impl Fn(usize) -> [u32; 2]) -> FlatCode {
        let mut f = self.clone();
        f.place(at);
        f
    }

    /// The same placed code, each place `p` moved to `to(p)`: a
    /// consumer that drops records of a run which hold no address (the
    /// `cachesim` sink's fetches that change nothing) keeps each address
    /// in its records.
    pub fn moved(&self, to: impl Fn(u32) -> u32) -> FlatCode {
        let mut f = self.clone();
        for [p, q] in f.ops.iter_mut().filter_map(Op::at_mut) {
            (*p, *q) = (to(*p), to(*q));
        }
        f
    }

    /// Code with no ops, nothing known at its end: the start of a chain
    /// ([`FlatCode::chain`]).
    pub fn empty() -> FlatCode {
        FlatCode {
            ops: Vec::new(),
            refs: 0,
            exit: RegSet(0),
        }
    }

    /// Appends `next`, the placed code of a block run right after this
    /// code's (whose end state covers `next`'s known registers, as the
    /// walk checked once for the pair): its instructions numbered from
    /// `insns` (errors name the chain's instruction), its places moved by
    /// `at`. `None` if the numbers do not fit.
    pub fn chain(&mut self, next: &FlatCode, insns: usize, at: u32) -> Option<()> {
        let insns = u16::try_from(insns).ok()?;
        for &op in &next.ops {
            let mut op = op;
            if let Some(k) = op.insn_mut() {
                *k = k.checked_add(insns)?;
            }
            if let Some([p, q]) = op.at_mut() {
                (*p, *q) = (p.checked_add(at)?, q.checked_add(at)?);
            }
            self.ops.push(op);
        }
        self.refs += next.refs;
        self.exit = next.exit;
        Some(())
    }

    /// Appends `rsp += by` (wrapping): what the data walk's way into
    /// the next block chained does to the state beside the blocks' code
    /// (a call's push, -8, at a procedure entered by it; +8 at the return
    /// point after a PLT stub, whose kept call state differs from the
    /// stub's by that push alone, [`FlatCode::writes_no_slot`]).
    pub fn move_rsp(&mut self, by: u64) {
        let rsp = Gpr::RSP.0;
        let s = FSum {
            disp: by,
            ..FSum::slot(rsp)
        };
        self.ops.push(Op::Set {
            dst: rsp,
            s,
            mask: !0,
        });
    }

    /// Whether the code leaves every register's slot as it found it (a
    /// PLT stub's `jmp [GOT]`: its one reference static or recorded); it
    /// may still forget registers ([`FlatCode::exit`]).
    pub fn writes_no_slot(&self) -> bool {
        self.ops.iter().all(|op| match *op {
            Op::Addr { .. } => true,
            Op::Rec { dst, .. } => dst == DISCARD,
            Op::Take { .. } | Op::Set { .. } | Op::Func { .. } | Op::Ext { .. } => false,
        })
    }

    fn place(&mut self, at: impl Fn(usize) -> [u32; 2]) {
        for (n, a) in self.ops.iter_mut().filter_map(Op::at_mut).enumerate() {
            *a = at(n);
        }
    }

    fn take(&mut self, k: u16, g: Gpr, what: Recorded) {
        self.ops.push(Op::Take { k, dst: g.0, what });
        self.exit.insert(g);
    }

    fn reference(&mut self, k: u16, j: usize, how: &How, bias: u64) -> Option<()> {
        let op = match *how {
            How::Known(s) => Op::Addr {
                s: FSum::of(&s, bias),
                at: [0; 2],
            },
            How::Recorded { learn } => {
                let (dst, s) = match learn {
                    Some((g, s)) => {
                        self.exit.insert(g);
                        (g.0, FSum::of(&s, bias))
                    }
                    None => (DISCARD, FSum::slot(ZERO)),
                };
                let j = u8::try_from(j).ok()?;
                Op::Rec {
                    k,
                    j,
                    dst,
                    s,
                    at: [0; 2],
                }
            }
        };
        self.ops.push(op);
        Some(())
    }

    /// The instruction's updates, all read before any is written: into
    /// temporaries and then moved when one reads another's result.
    fn updates(&mut self, ups: &[super::UpCode], snapshot: bool, bias: u64) -> Option<()> {
        let mut moves = Vec::new();
        for u in ups {
            let Some(val) = u.val else {
                // Forgetting is the exit set's business alone.
                self.exit.0 &= !(1 << u.dst.0);
                continue;
            };
            self.exit.insert(u.dst);
            let dst = match snapshot {
                true => {
                    let t = TEMP + u8::try_from(moves.len()).ok()?;
                    (usize::from(t) < SLOTS).then_some(())?;
                    moves.push((u.dst.0, t));
                    t
                }
                false => u.dst.0,
            };
            self.ops.push(op(dst, &val, bias));
        }
        for (dst, t) in moves {
            let s = FSum::slot(t);
            self.ops.push(Op::Set { dst, s, mask: !0 });
        }
        Some(())
    }

    /// Runs the block on `regs` (its known registers the compiled ones),
    /// its addresses into `addrs` (cleared first); an error names the
    /// instruction (its index in the block) whose value was missing.
    #[inline]
    pub fn run(
        &self,
        regs: &mut Regs,
        take: &mut impl FnMut(Recorded) -> Result<u64, String>,
        addrs: &mut Vec<u64>,
    ) -> Result<(), (usize, String)> {
        addrs.clear();
        addrs.reserve(self.refs);
        self.go(regs, take, |_, a| addrs.push(a))
    }

    /// [`FlatCode::run`] with each address given to `patch` with the
    /// records of `out` at its places ([`FlatCode::placed`]) instead of
    /// into a list: a consumer's template of the run, copied into `out`
    /// before, is completed with no intermediate list of addresses.
    #[inline]
    pub fn run_into<W>(
        &self,
        regs: &mut Regs,
        take: &mut impl FnMut(Recorded) -> Result<u64, String>,
        out: &mut [W],
        mut patch: impl FnMut(&mut W, u64),
    ) -> Result<(), (usize, String)> {
        self.go(regs, take, |[p, q], a| {
            patch(&mut out[p as usize], a);
            patch(&mut out[q as usize], a);
        })
    }

    /// [`FlatCode::run`] with each address given to `put` with its places
    /// ([`FlatCode::placed`]): a consumer that needs to know where an
    /// address went.
    #[inline(always)]
    pub fn go(
        &self,
        regs: &mut Regs,
        take: &mut impl FnMut(Recorded) -> Result<u64, String>,
        mut put: impl FnMut([u32; 2], u64),
    ) -> Result<(), (usize, String)> {
        let v = &mut regs.v;
        for op in &self.ops {
            match *op {
                Op::Take { k, dst, what } => {
                    v[dst as usize & (SLOTS - 1)] = take(what).map_err(|e| (k as usize, e))?;
                }
                Op::Addr { s, at } => put(at, s.eval(v)),
                Op::Rec { k, j, dst, s, at } => {
                    let a = take(Recorded::Addr(j as usize)).map_err(|e| (k as usize, e))?;
                    put(at, a);
                    v[dst as usize & (SLOTS - 1)] = a.wrapping_sub(s.eval(v));
                }
                Op::Set { dst, s, mask } => v[dst as usize & (SLOTS - 1)] = s.eval(v) & mask,
                Op::Func {
                    dst,
                    f,
                    x,
                    y,
                    imm,
                    w32,
                } => {
                    let (x, y) = (v[x as usize & (SLOTS - 1)], v[y as usize & (SLOTS - 1)]);
                    v[dst as usize & (SLOTS - 1)] = apply(f, x, y.wrapping_add(imm), w32);
                }
                Op::Ext {
                    dst,
                    src,
                    bits,
                    signed,
                    w32,
                } => {
                    v[dst as usize & (SLOTS - 1)] =
                        extend_bits(v[src as usize & (SLOTS - 1)], bits, signed, w32)
                }
            }
        }
        regs.known = self.exit;
        Ok(())
    }
}

/// The op computing `val` into slot `dst`.
fn op(dst: u8, val: &Val, bias: u64) -> Op {
    let set = |s: &Sum, mask| Op::Set {
        dst,
        s: FSum::of(s, bias),
        mask,
    };
    match *val {
        Val::Const(c) => Op::Set {
            dst,
            s: FSum {
                disp: c,
                ..FSum::slot(ZERO)
            },
            mask: !0,
        },
        Val::Sum(s) => set(&s, !0),
        Val::Sum32(s) => set(&s, LOW32),
        Val::Func { f, x, y, w32 } => {
            let (y, imm) = match y {
                Src::Reg(g) => (g.0, 0),
                Src::Imm(i) => (ZERO, i),
            };
            Op::Func {
                dst,
                f,
                x: x.0,
                y,
                imm,
                w32,
            }
        }
        Val::Ext {
            src,
            bits,
            signed,
            w32,
        } => Op::Ext {
            dst,
            src: src.0,
            bits,
            signed,
            w32,
        },
    }
}

#[cfg(test)]
mod tests;
