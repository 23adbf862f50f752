//! The abstract interpreter of address programs, in two domains run one
//! after the other (each a [`flow::Domain`](super::flow::Domain)):
//!
//! 1. [`Shapes`]: per register a [`Shape`] (a constant, `rsp` at entry plus
//!    an offset, the thread pointer plus an offset, or anything), and the
//!    8-byte stack slots whose contents are known by shape. It decides
//!    where stack addresses are and which loads reload a stack slot.
//! 2. [`Sources`]: per register the [`Srcs`] its value depends on: the
//!    registers' values at entry and the opaque definitions (loads,
//!    callees' results, ...) numbered as [`Sites`]. With the first
//!    domain's decisions fixed, it is a monotone union, so any fixpoint
//!    order reaches the same least solution.
//!
//! A join of two different known values stays computable (the regenerator
//! follows the path actually taken), so meeting only merges sources.
//!
//! Stack slots are followed only in procedures where no stack address
//! escapes into a register other than `rsp`/`rbp` or into memory
//! ([`Shapes::escapes`]): elsewhere a callee may write a slot through the
//! escaped pointer, and a reload is an opaque definition.

use std::collections::BTreeMap;

use aetrace_graph::{BlockId, EntityRef};

use super::flow::Domain;
use super::{Access, AddrExpr, Dst, Gpr, InsnProgram, Op, ProcProgram, Seg, Stored};

/// What is known of a register's value.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// This constant (a link-time address, for addresses in the module).
    Const(u64),
    /// `rsp` at procedure entry plus this offset.
    Stack(i64),
    /// The thread pointer (`fs` base) plus this offset.
    Tp(i64),
    /// Some value (possibly computable: see [`Srcs`]).
    Any,
}

impl Shape {
    fn meet(self, other: Shape) -> Shape {
        if self == other {
            self
        } else {
            Shape::Any
        }
    }

    fn add(self, other: Shape) -> Shape {
        match (self, other) {
            (Shape::Const(a), Shape::Const(b)) => Shape::Const(a.wrapping_add(b)),
            (Shape::Const(a), Shape::Stack(k)) | (Shape::Stack(k), Shape::Const(a)) => {
                Shape::Stack(k.wrapping_add(a as i64))
            }
            (Shape::Const(a), Shape::Tp(k)) | (Shape::Tp(k), Shape::Const(a)) => {
                Shape::Tp(k.wrapping_add(a as i64))
            }
            _ => Shape::Any,
        }
    }
}

/// The first domain's state before or after an instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeState {
    /// Per register.
    pub regs: [Shape; Gpr::COUNT],
    /// 8-byte stack slots (by entry-`rsp` offset) whose contents are known.
    pub slots: BTreeMap<i64, Shape>,
}

impl ShapeState {
    /// At a procedure entry: `rsp` is the entry's, nothing else is known.
    pub fn entry() -> Self {
        let mut regs = [Shape::Any; Gpr::COUNT];
        regs[Gpr::RSP.index()] = Shape::Stack(0);
        ShapeState {
            regs,
            slots: BTreeMap::new(),
        }
    }

    /// Where nothing is known (a landing pad).
    pub fn unknown() -> Self {
        ShapeState {
            regs: [Shape::Any; Gpr::COUNT],
            slots: BTreeMap::new(),
        }
    }

    /// The shape of an address.
    pub fn addr(&self, a: &AddrExpr) -> Shape {
        if a.vector_index || a.bit_offset.is_some() {
            return Shape::Any;
        }
        let mut v = Shape::Const(a.disp);
        if let Some(b) = a.base {
            v = v.add(self.regs[b.index()]);
        }
        if let Some(i) = a.index {
            v = v.add(match self.regs[i.index()] {
                Shape::Const(c) => Shape::Const(c.wrapping_mul(u64::from(a.scale))),
                _ => Shape::Any,
            });
        }
        match (a.seg, v) {
            (Seg::Flat, v) => v,
            (Seg::Fs, Shape::Const(c)) => Shape::Tp(c as i64),
            _ => Shape::Any,
        }
    }

    /// The stack slot a load reads, when slots are followed and it holds
    /// a known value.
    fn slot_of(&self, addr: &AddrExpr, size: u32, follow: bool) -> Option<i64> {
        match self.addr(addr) {
            Shape::Stack(k) if follow && size == 8 && self.slots.contains_key(&k) => Some(k),
            _ => None,
        }
    }
}

/// `mov r, fs:[0]`: the thread pointer (the TCB's pointer to itself).
fn is_thread_pointer(addr: &AddrExpr, size: u32) -> bool {
    addr.seg == Seg::Fs
        && addr.base.is_none()
        && addr.index.is_none()
        && addr.disp == 0
        && size == 8
}

/// The stack slots a store changes: `(offset, new contents)`; `None`
/// contents: only overlapping slots are forgotten.
fn slot_stores(
    pre: &ShapeState,
    insn: &InsnProgram,
    follow: bool,
) -> Vec<(i64, u32, Option<Stored>)> {
    insn.refs
        .iter()
        .filter(|r| r.access != Access::Load)
        .filter_map(|r| match pre.addr(&r.addr) {
            Shape::Stack(k) => Some((k, r.size, r.stored.filter(|_| follow && r.size == 8))),
            _ => None,
        })
        .collect()
}

/// Forgets the slots overlapping `[k, k + size)` (all above `k` when the
/// size is unknown).
fn forget<V>(slots: &mut BTreeMap<i64, V>, k: i64, size: u32) {
    let end = if size == 0 {
        i64::MAX
    } else {
        k + i64::from(size)
    };
    let dead: Vec<i64> = slots.range(k - 7..end).map(|(&s, _)| s).collect();
    for s in dead {
        slots.remove(&s);
    }
}

/// After a call the callee's frame was below `rsp`: slots there are gone.
fn forget_below_rsp<V>(slots: &mut BTreeMap<i64, V>, rsp: Shape) {
    match rsp {
        Shape::Stack(k) => slots.retain(|&s, _| s >= k),
        _ => slots.clear(),
    }
}

/// The first domain.
pub struct Shapes<'a> {
    /// The procedure.
    pub prog: &'a ProcProgram,
    /// Whether 8-byte stack slots are followed.
    pub follow: bool,
}

impl Shapes<'_> {
    /// The state after `insn`.
    pub fn step(&self, pre: &ShapeState, insn: &InsnProgram) -> ShapeState {
        let mut next = pre.clone();
        for (k, size, stored) in slot_stores(pre, insn, self.follow) {
            forget(&mut next.slots, k, size);
            if let Some(s) = stored {
                next.slots.insert(
                    k,
                    match s {
                        Stored::Reg(r) => pre.regs[r.index()],
                        Stored::Imm(v) => Shape::Const(v),
                    },
                );
            }
        }
        if insn.call {
            forget_below_rsp(&mut next.slots, pre.regs[Gpr::RSP.index()]);
        }
        for u in &insn.updates {
            let v = match u.op {
                Op::Const(c) => Shape::Const(c),
                Op::Copy(r) => pre.regs[r.index()],
                Op::Lea(a) => pre.addr(&a),
                Op::Load { addr, size } if is_thread_pointer(&addr, size) => Shape::Tp(0),
                Op::Load { addr, size } => pre
                    .slot_of(&addr, size, self.follow)
                    .map_or(Shape::Any, |k| pre.slots[&k]),
                Op::Func { .. } | Op::Opaque { .. } => Shape::Any,
            };
            match u.dst {
                Dst::Full(g) => next.regs[g.index()] = v,
                Dst::Partial(g) => next.regs[g.index()] = Shape::Any,
                Dst::Flags => {}
            }
        }
        next
    }

    /// Whether, with the in-states `ins`, a stack address reaches a
    /// register other than `rsp`/`rbp` or a store outside the stack.
    pub fn escapes(&self, ins: &[Option<ShapeState>]) -> bool {
        let stack = |s: Shape| matches!(s, Shape::Stack(_));
        self.prog.blocks.iter().zip(ins).any(|(b, s)| {
            let Some(mut s) = s.clone() else {
                return false;
            };
            b.insns.iter().any(|insn| {
                let stored_out = insn.refs.iter().any(|r| {
                    matches!(r.stored, Some(Stored::Reg(g)) if stack(s.regs[g.index()]))
                        && !stack(s.addr(&r.addr))
                });
                let next = self.step(&s, insn);
                let reg_out = (0..Gpr::COUNT)
                    .any(|g| g != Gpr::RSP.index() && g != Gpr::RBP.index() && stack(next.regs[g]));
                s = next;
                stored_out || reg_out
            })
        })
    }
}

/// `rsp` less its value at the procedure's entry, before each instruction
/// of each block, where [`Shapes`] knows it (pushes, pops, calls that
/// return, `sub`/`add` with an immediate, `leave` with `rbp` set from
/// `rsp`): `None` where it moved by a value not known before the run
/// (`alloca`, `and` for alignment) or ways in disagree. The debugger's
/// frame addresses from an entry's recorded `rsp` (`docs/debug.md`).
pub fn rsp_offsets(prog: &ProcProgram) -> Vec<Vec<Option<i64>>> {
    let shapes = Shapes {
        prog,
        follow: false,
    };
    let ins = super::flow::solve(&shapes, &prog.succs);
    let offset = |s: &ShapeState| match s.regs[Gpr::RSP.index()] {
        Shape::Stack(k) => Some(k),
        _ => None,
    };
    (prog.blocks.iter().zip(ins))
        .map(|(b, input)| {
            let Some(mut s) = input else {
                return vec![None; b.insns.len()];
            };
            b.insns
                .iter()
                .map(|insn| {
                    let k = offset(&s);
                    s = shapes.step(&s, insn);
                    k
                })
                .collect()
        })
        .collect()
}

impl Domain for Shapes<'_> {
    type State = ShapeState;

    fn seed(&self, b: BlockId) -> Option<ShapeState> {
        if self.prog.pads.contains(&b) {
            Some(ShapeState::unknown())
        } else if self.prog.entries.contains(&b) {
            Some(ShapeState::entry())
        } else {
            None
        }
    }

    fn meet(&self, into: &mut ShapeState, other: &ShapeState) {
        for (a, b) in into.regs.iter_mut().zip(&other.regs) {
            *a = a.meet(*b);
        }
        into.slots.retain(|k, v| match other.slots.get(k) {
            Some(o) => {
                *v = v.meet(*o);
                true
            }
            None => false,
        });
    }

    fn transfer(&self, b: BlockId, input: &ShapeState) -> ShapeState {
        self.prog.blocks[b.index()]
            .insns
            .iter()
            .fold(input.clone(), |s, insn| self.step(&s, insn))
    }
}

/// The sources a value depends on, sorted: `0..16` are the registers at
/// entry (by number), `16 + i` is opaque definition `i` of [`Sites`].
pub type Srcs = Vec<u32>;

/// The first source number of the opaque definitions.
pub const FIRST_SITE: u32 = Gpr::COUNT as u32;

fn union(a: &[u32], b: &[u32]) -> Srcs {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let next = match (a.get(i), b.get(j)) {
            (Some(&x), Some(&y)) if x == y => {
                i += 1;
                j += 1;
                x
            }
            (Some(&x), Some(&y)) if x < y => {
                i += 1;
                x
            }
            (Some(&x), None) => {
                i += 1;
                x
            }
            (_, Some(&y)) => {
                j += 1;
                y
            }
            (None, None) => unreachable!(),
        };
        out.push(next);
    }
    out
}

/// The second domain's state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SrcState {
    /// Per register.
    pub regs: Vec<Srcs>,
    /// The arithmetic flags.
    pub flags: Srcs,
    /// Stack slots, as in the first domain.
    pub slots: BTreeMap<i64, Srcs>,
}

impl SrcState {
    fn entry(pad: bool) -> Self {
        let regs = (0..Gpr::COUNT as u32)
            .map(|r| {
                if r == Gpr::RSP.0 as u32 && !pad {
                    Vec::new()
                } else {
                    vec![r]
                }
            })
            .collect();
        SrcState {
            regs,
            flags: Vec::new(),
            slots: BTreeMap::new(),
        }
    }

    /// The sources of an address's registers.
    pub fn addr(&self, a: &AddrExpr) -> Srcs {
        a.regs()
            .iter()
            .fold(Vec::new(), |acc, r| union(&acc, &self.regs[r.index()]))
    }
}

/// The opaque definitions of a procedure, numbered in program order: each
/// update whose op is a `Load` or `Opaque` is one, whether or not a stack
/// slot later supplies its value.
#[derive(Clone, Debug)]
pub struct Sites {
    /// Per block, the number of its first site.
    pub first: Vec<u32>,
    /// Per site: its block and the bytes a record of it takes.
    pub sites: Vec<(BlockId, u8)>,
}

impl Sites {
    /// Numbers the sites of `prog`.
    pub fn of(prog: &ProcProgram) -> Self {
        let mut first = Vec::with_capacity(prog.blocks.len());
        let mut sites = Vec::new();
        for (b, block) in prog.blocks.iter().enumerate() {
            first.push(sites.len() as u32);
            for u in block.insns.iter().flat_map(|i| &i.updates) {
                if let Some(w) = site_width(&u.op) {
                    sites.push((BlockId::new(b), w));
                }
            }
        }
        Sites { first, sites }
    }
}

fn site_width(op: &Op) -> Option<u8> {
    match *op {
        Op::Load { size, .. } => Some(size.clamp(1, 8) as u8),
        Op::Opaque { width } => Some(width),
        _ => None,
    }
}

/// The second domain; its transfer replays the first domain's in-states.
pub struct Sources<'a> {
    /// The first domain, for its decisions.
    pub shapes: &'a Shapes<'a>,
    /// Its in-states.
    pub shape_ins: &'a [Option<ShapeState>],
    /// The numbering of opaque definitions.
    pub sites: &'a Sites,
}

impl Sources<'_> {
    /// The state after `insn`, whose first site is number `site` (advanced
    /// past its sites), given the first domain's state `shape` before it.
    pub fn step(
        &self,
        shape: &ShapeState,
        pre: &SrcState,
        insn: &InsnProgram,
        site: &mut u32,
    ) -> SrcState {
        let mut next = pre.clone();
        let follow = self.shapes.follow;
        for (k, size, stored) in slot_stores(shape, insn, follow) {
            forget(&mut next.slots, k, size);
            if let Some(s) = stored {
                let v = match s {
                    Stored::Reg(r) => pre.regs[r.index()].clone(),
                    Stored::Imm(_) => Vec::new(),
                };
                next.slots.insert(k, v);
            }
        }
        if insn.call {
            forget_below_rsp(&mut next.slots, shape.regs[Gpr::RSP.index()]);
        }
        for u in &insn.updates {
            let own = if site_width(&u.op).is_some() {
                *site += 1;
                vec![FIRST_SITE + *site - 1]
            } else {
                Vec::new()
            };
            let v = match u.op {
                Op::Const(_) => Vec::new(),
                Op::Copy(r) => pre.regs[r.index()].clone(),
                Op::Lea(a) => pre.addr(&a),
                Op::Load { addr, size } if is_thread_pointer(&addr, size) => Vec::new(),
                Op::Load { addr, size } => match shape.slot_of(&addr, size, follow) {
                    Some(k) => pre.slots.get(&k).cloned().unwrap_or_default(),
                    None => own,
                },
                Op::Func { inputs, flags, .. } => {
                    let v = inputs
                        .iter()
                        .fold(Vec::new(), |acc, r| union(&acc, &pre.regs[r.index()]));
                    if flags {
                        union(&v, &pre.flags)
                    } else {
                        v
                    }
                }
                Op::Opaque { .. } => own,
            };
            match u.dst {
                Dst::Full(g) => next.regs[g.index()] = v,
                Dst::Partial(g) => next.regs[g.index()] = union(&pre.regs[g.index()], &v),
                Dst::Flags => next.flags = v,
            }
        }
        next
    }
}

impl Domain for Sources<'_> {
    type State = SrcState;

    fn seed(&self, b: BlockId) -> Option<SrcState> {
        if self.shapes.prog.pads.contains(&b) {
            Some(SrcState::entry(true))
        } else if self.shapes.prog.entries.contains(&b) {
            Some(SrcState::entry(false))
        } else {
            None
        }
    }

    fn meet(&self, into: &mut SrcState, other: &SrcState) {
        for (a, b) in into.regs.iter_mut().zip(&other.regs) {
            *a = union(a, b);
        }
        into.flags = union(&into.flags, &other.flags);
        for (k, v) in &other.slots {
            let e = into.slots.entry(*k).or_default();
            *e = union(e, v);
        }
    }

    fn transfer(&self, b: BlockId, input: &SrcState) -> SrcState {
        let Some(mut shape) = self.shape_ins[b.index()].clone() else {
            return input.clone();
        };
        let mut site = self.sites.first[b.index()];
        let mut s = input.clone();
        for insn in &self.shapes.prog.blocks[b.index()].insns {
            s = self.step(&shape, &s, insn, &mut site);
            shape = self.shapes.step(&shape, insn);
        }
        s
    }
}
