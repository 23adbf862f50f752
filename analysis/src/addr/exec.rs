//! Abstract execution of address programs (issue 21 points 2-3,
//! `docs/data.md`; Larus's Abstract Execution, paper 003 section 5.2): the
//! one interpreter that both the rewriter (to decide which values a block
//! records) and the regenerator (to rebuild every address from them) run,
//! so the two cannot disagree (drmemtrace's issue #4403).
//!
//! The state is a concrete register file where each register is known
//! (`Some`) or not. Per instruction ([`Exec::insn`]): a `rep` string
//! instruction records `rcx` and `rflags`; each reference, in order, is
//! static (the instruction gives it), computable from known registers, or
//! recorded in full; a recorded flat address `base + index*scale + disp`
//! with one unknown register (the base, or an index of scale 1) makes that
//! register known (its value before the instruction). Then the
//! instruction's updates ([`super::Update`]) are applied together from the
//! state before it: exact forms (constants, copies, `lea`-like sums, push,
//! pop, call, ret, leave, enter) and a few interpretable functions keep a
//! register known; loads, partial writes and opaque results forget it.
//!
//! Invariant: *whether* a register is known never depends on the values,
//! only on the instructions and on which registers were known before, so
//! the rewriter can run the interpreter on dummy values ([`Exec::plan_block`])
//! and know exactly which values the regenerator will read.
//!
//! Across blocks ([`entry_knowledge`]): a block inherits the registers known
//! at the end of every predecessor when control can reach it only by a
//! plain edge (fall-through, taken branch, jump-table case) from a block
//! that is not a call, or by the return of a direct call to a procedure
//! that returns by `ret` ([`super::returns`]), which carries `rsp` alone,
//! or by the return of a call whose callee never runs traced code or is a
//! leaf ([`back_call`]), which carries the registers SysV x86-64 has a
//! callee preserve ([`PRESERVED`]) as the call block left them.
//! A procedure's entry starts with `rsp` known ([`WayIn::Entry`]): a
//! direct call or tail jump from traced code carries the caller's (every
//! call's own `[rsp-8]` leaves it known; a block that may jump into an
//! entry records it first when unknown, [`anchors_rsp`]), and every way in
//! from untraced code passes an outside-entry stub, which records `rsp`
//! right after its ENTER ([`Entered`]). Landing pads, other return points
//! and blocks without such ways in start with nothing known (their first
//! stack reference is recorded, which anchors `rsp`: after a `setjmp`
//! return, at a landing pad, after a callback). The regenerator checks at
//! run time that the block it walked before is one of those ways in.

use iced_x86::{Instruction, Mnemonic};

use super::full::{self, Recorded};
use super::returns::Returns;
use super::{AddrExpr, Dst, Gpr, InsnProgram, Op, RegSet, Repeat, Seg};
use aetrace_format::progdb::{BlockDb, CallDb, CallTarget, EdgeKindDb, ProcDb};

/// Every register.
pub const ALL: RegSet = RegSet(0xffff);

/// The registers a SysV x86-64 callee leaves as it found them: `rsp`,
/// `rbx`, `rbp`, `r12`-`r15`.
pub const PRESERVED: RegSet = RegSet(1 << 3 | 1 << 4 | 1 << 5 | 0xf000);

/// The registers' values, known or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exec {
    /// Per register.
    pub regs: [Option<u64>; Gpr::COUNT],
    /// The module's load bias (rip-relative addresses are link-time).
    pub bias: u64,
}

/// What one instruction referenced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InsnAddrs {
    /// Each reference's address (a `rep`'s first iteration).
    pub addrs: Vec<u64>,
    /// For a `rep` string instruction: `rcx` and `rflags` before it.
    pub rep: Option<(u64, u64)>,
    /// Per reference: whether its address was recorded in full.
    pub recorded: Vec<bool>,
}

impl Exec {
    /// Nothing known.
    pub fn unknown(bias: u64) -> Self {
        Exec {
            regs: [None; Gpr::COUNT],
            bias,
        }
    }

    /// The known registers.
    pub fn known(&self) -> RegSet {
        let mut s = RegSet::default();
        for (g, v) in self.regs.iter().enumerate() {
            if v.is_some() {
                s.insert(Gpr(g as u8));
            }
        }
        s
    }

    /// Forgets every register not in `keep`.
    pub fn keep(&mut self, keep: RegSet) {
        for (g, v) in self.regs.iter_mut().enumerate() {
            if keep.0 & (1 << g) == 0 {
                *v = None;
            }
        }
    }

    /// The value of `a` (a `lea`'s or a reference's), if computable.
    fn value(&self, insn: &Instruction, a: &AddrExpr) -> Option<u64> {
        if !plain(insn, a) {
            return None;
        }
        let mut v = a.disp;
        match a.base {
            Some(b) => v = v.wrapping_add(self.regs[b.index()]?),
            None if a.index.is_none() && insn.is_ip_rel_memory_operand() => {
                v = v.wrapping_add(self.bias)
            }
            None => {}
        }
        if let Some(i) = a.index {
            v = v.wrapping_add(self.regs[i.index()]?.wrapping_mul(u64::from(a.scale)));
        }
        Some(v)
    }

    /// Learns the one unknown register of `a` from its recorded value `v`.
    fn learn(&mut self, insn: &Instruction, a: &AddrExpr, v: u64) {
        if !plain(insn, a) {
            return;
        }
        let get = |r: Option<Gpr>| r.map(|g| self.regs[g.index()]);
        let rest = v.wrapping_sub(a.disp);
        match (a.base, get(a.base), a.index, get(a.index)) {
            (Some(b), Some(None), i, iv) if i != Some(b) => {
                if let Some(x) = match (i, iv) {
                    (None, _) => Some(0),
                    (Some(_), Some(Some(x))) => Some(x.wrapping_mul(u64::from(a.scale))),
                    _ => None,
                } {
                    self.regs[b.index()] = Some(rest.wrapping_sub(x));
                }
            }
            (b, bv, Some(i), Some(None)) if a.scale == 1 && b != Some(i) => {
                if let Some(x) = match (b, bv) {
                    (None, _) => Some(0),
                    (Some(_), Some(Some(x))) => Some(x),
                    _ => None,
                } {
                    self.regs[i.index()] = Some(rest.wrapping_sub(x));
                }
            }
            _ => {}
        }
    }

    /// Runs `insn` (its program `prog`): `take` gives each recorded value,
    /// in order, and says which it is. Errors: the reference table refuses
    /// the instruction (`full`), or `take` failed.
    pub fn insn(
        &mut self,
        insn: &Instruction,
        prog: &InsnProgram,
        take: &mut dyn FnMut(Recorded) -> Result<u64, String>,
    ) -> Result<InsnAddrs, String> {
        let mut out = InsnAddrs::default();
        self.insn_into(insn, prog, take, &mut out)?;
        Ok(out)
    }

    /// [`Exec::insn`] into `out`, cleared first: the regenerator runs this
    /// once per executed instruction, so it reuses one `out` rather than
    /// allocating two vectors each time.
    pub fn insn_into(
        &mut self,
        insn: &Instruction,
        prog: &InsnProgram,
        take: &mut dyn FnMut(Recorded) -> Result<u64, String>,
        out: &mut InsnAddrs,
    ) -> Result<(), String> {
        out.addrs.clear();
        out.recorded.clear();
        out.rep = None;
        full::refusal(insn, prog)?;
        if let Some(k) = prog.once {
            let rax = &mut self.regs[0];
            if rax.is_none() {
                *rax = Some(take(Recorded::Once(k))?);
            }
        }
        for g in RegSet(prog.before.0 | prog.args.0).iter() {
            if self.regs[g.index()].is_none() {
                self.regs[g.index()] = Some(take(Recorded::Reg(g))?);
            }
        }
        if prog.refs.iter().any(|r| r.repeat == Repeat::Rcx) {
            out.rep = Some((take(Recorded::Rcx)?, take(Recorded::Flags)?));
        }
        for (k, r) in prog.refs.iter().enumerate() {
            let known = self.value(insn, &r.addr);
            let a = match known {
                Some(a) => a,
                None => {
                    let a = take(Recorded::Addr(k))?;
                    self.learn(insn, &r.addr, a);
                    a
                }
            };
            out.addrs.push(a);
            out.recorded.push(known.is_none());
        }
        self.update(insn, prog);
        Ok(())
    }

    /// Runs `insn`'s register updates alone, its references left out (no
    /// value is taken): the debugger follows `rsp` from an entry's
    /// recorded value through a caller's instructions where the static
    /// deltas do not know it (`and rsp, -16`).
    pub fn registers_only(&mut self, insn: &Instruction, prog: &InsnProgram) {
        self.update(insn, prog);
    }

    /// Applies the instruction's register updates, all read before it (a
    /// copy of the registers when there are several: no allocation on the
    /// regenerator's hot path); a call keeps its callee's argument
    /// registers ([`InsnProgram::args`]).
    fn update(&mut self, insn: &Instruction, prog: &InsnProgram) {
        match prog.updates.as_slice() {
            [] => {}
            [u] if !passed(prog, u.dst) => self.set(u.dst, self.eval(insn, u.dst, &u.op)),
            [_] => {}
            us => {
                let before = self.clone();
                for u in us.iter().filter(|u| !passed(prog, u.dst)) {
                    self.set(u.dst, before.eval(insn, u.dst, &u.op));
                }
            }
        }
    }

    fn set(&mut self, dst: Dst, v: Option<u64>) {
        match dst {
            Dst::Full(g) => self.regs[g.index()] = v,
            Dst::Partial(g) => self.regs[g.index()] = None,
            Dst::Flags => {}
        }
    }

    /// An update's new value ([`code::eval`], the one evaluator).
    fn eval(&self, insn: &Instruction, dst: Dst, op: &Op) -> Option<u64> {
        code::eval(insn, dst, op, self.known()).map(|v| v.eval(&self.regs, self.bias))
    }

    /// Before the last instruction of a block that [`anchors_rsp`]: `rsp`
    /// from `take` ([`Recorded::Rsp`]) when it is not known, so that the
    /// entry the jump may lead to knows it.
    pub fn anchor(
        &mut self,
        take: &mut dyn FnMut(Recorded) -> Result<u64, String>,
    ) -> Result<(), String> {
        if self.regs[Gpr::RSP.index()].is_none() {
            self.regs[Gpr::RSP.index()] = Some(take(Recorded::Rsp)?);
        }
        Ok(())
    }

    /// The values a block records, per instruction, when the registers in
    /// `known` are known at its start (`anchor`: the block [`anchors_rsp`]);
    /// and the registers known at its end. An instruction the table refuses
    /// gives its error.
    pub fn plan_block(
        known: RegSet,
        insns: &[(Instruction, InsnProgram)],
        anchor: bool,
    ) -> (Vec<Result<Vec<Recorded>, String>>, RegSet) {
        let mut e = Exec::unknown(0);
        for g in known.iter() {
            e.regs[g.index()] = Some(0);
        }
        let last = insns.len().wrapping_sub(1);
        let plans = (insns.iter().enumerate())
            .map(|(k, (i, p))| {
                let mut plan = Vec::new();
                let mut take = |r| {
                    plan.push(r);
                    Ok(0)
                };
                let r = match anchor && k == last {
                    true => (full::refusal(i, p))
                        .and_then(|()| e.anchor(&mut take))
                        .and_then(|()| e.insn(i, p, &mut take)),
                    false => e.insn(i, p, &mut take),
                };
                if r.is_err() {
                    e.update(i, p);
                }
                r.map(|_| plan)
            })
            .collect();
        (plans, e.known())
    }
}

/// Whether `dst` is one of a call's argument registers, which the call
/// keeps known for its callee's entry ([`InsnProgram::args`]).
fn passed(prog: &InsnProgram, dst: Dst) -> bool {
    matches!(dst, Dst::Full(g) if prog.args.0 & (1 << g.0) != 0)
}

/// A flat 64-bit address of general-purpose registers (not `fs:`, no
/// vector index or bit offset, no 32-bit address size).
fn plain(insn: &Instruction, a: &AddrExpr) -> bool {
    a.seg == Seg::Flat
        && a.bit_offset.is_none()
        && !a.vector_index
        && !insn.memory_base().is_gpr32()
        && !insn.memory_index().is_gpr32()
}

/// Whether block `b` ends with a jump that may enter a traced procedure's
/// entry without an outside-entry stub (a direct tail jump; a PLT stub's
/// GOT jump whose lazy outcome enters its lazy-binding procedure past the
/// stub, LAZY): `rsp` is recorded before it when unknown ([`Exec::anchor`]).
pub fn anchors_rsp(b: &BlockDb) -> bool {
    b.call.is_some_and(|c| {
        c.tail && (matches!(c.target, CallTarget::Proc(_)) || (c.plt && c.lazy.is_some()))
    })
}

/// How a run of procedure `q`'s entry block (from its start, not along a
/// plain edge of `q`) was entered, from the call the run before it (to its
/// end, in the same thread and module) ended with, if any.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Entered {
    /// By a direct call: `rsp` is the caller's minus 8 (the return address).
    Call,
    /// By a jump (a direct tail jump, a PLT stub's lazy outcome): the
    /// jumper's `rsp`.
    Jump,
    /// Through an outside-entry stub (untraced code, an indirect call, a
    /// thread's or the process's first entry): its VALUE right after its
    /// ENTER holds `rsp`.
    Outside,
}

impl Entered {
    /// The way into `q`'s entry after a run that ended with `prev` (`None`:
    /// no run of the module before it in the thread, or not to its end).
    /// Exact because a direct call or jump to a traced procedure enters its
    /// copy past the stub (`CallTarget::Proc`: no ENTER), and a PLT stub's
    /// jump with `plt` enters its lazy procedure only by LAZY, never ENTER;
    /// every other way into an entry is a stub's.
    pub fn by(prev: Option<&CallDb>, q: u32) -> Entered {
        match prev {
            Some(c) if c.target == CallTarget::Proc(q) && !c.indirect => match c.tail {
                true => Entered::Jump,
                false => Entered::Call,
            },
            Some(c) if c.tail && c.plt && c.lazy == Some(q) => Entered::Jump,
            _ => Entered::Outside,
        }
    }
}

/// A way into a block that carries known registers into it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum WayIn {
    /// A plain edge (fall-through, taken branch, jump-table case, an
    /// unresolved indirect jump) from this block of the procedure, not a
    /// call, run to its end: the registers known at its end.
    Plain(u32),
    /// The return of a direct call to procedure `q` of the module, which
    /// returns by `ret` ([`Returns`]): `rsp`, which the callee's `ret`
    /// (one of `q`'s or of a procedure it tail-calls) left known.
    Return(u32),
    /// The procedure's entry ([`Entered`]): `rsp`.
    Entry,
    /// The return of the call block `b` of this procedure ends with, whose
    /// callee never runs traced code ([`back_call`]): the registers the
    /// ABI preserves ([`PRESERVED`]) known at `b`'s end. The regenerator
    /// keeps them across the call: the run before is `b`, a PLT stub's
    /// block that writes no register but `rsp` ([`passes_through`]) run
    /// since `b`, or a `ret` of a leaf ([`Returns::leaf`]) whose blocks
    /// alone ran since `b`.
    Back(u32),
}

/// Whether the return of call `c` carries the registers the ABI preserves
/// ([`WayIn::Back`]): a call that returns, not `setjmp`-like, unmarked (its
/// callee never runs traced code: `CallDb::marker`), to untraced code
/// directly or through a PLT stub of the module ([`Returns::stub`]), or
/// to a traced leaf ([`Returns::leaf`]: only its own blocks run before it
/// returns). Assumed: untraced code, the linker's PLT and lazy-binding
/// path and the module's leaves keep `rsp`, `rbx`, `rbp` and `r12`-`r15`
/// (SysV x86-64).
pub fn back_call(c: &CallDb, returns: &Returns) -> bool {
    let to = match c.target {
        CallTarget::External => !c.indirect,
        CallTarget::Proc(q) => returns.stub(q) || returns.leaf(q) && !c.indirect,
        CallTarget::Exit => false,
    };
    to && !c.tail && !c.jmpbuf && c.returns && !c.marker
}

/// Whether a block may run between a [`back_call`] and its return point
/// without changing what [`WayIn::Back`] carries: it ends with a tail
/// jump and writes no register but `rsp` (a PLT stub's `jmp [GOT]`, the
/// lazy-binding path's `push; jmp`).
pub fn passes_through<'a>(b: &BlockDb, progs: impl IntoIterator<Item = &'a InsnProgram>) -> bool {
    let rsp_only = |p: &InsnProgram| {
        (p.updates.iter()).all(|u| matches!(u.dst, Dst::Full(Gpr::RSP) | Dst::Flags))
    };
    b.call.is_some_and(|c| c.tail) && progs.into_iter().all(rsp_only)
}

/// Per block of a traced procedure: the ways in that carry registers
/// (empty: it starts with nothing known). A block is a root when it is
/// a landing pad or has any other way in: a return from untraced code that
/// may run traced code, a `setjmp`-like call, ... The edge out of alignment padding ([`padding`])
/// is no way in: the block after it does not wait for the registers the
/// padding never knows. An unresolved indirect jump (`CallDb::indirect`)
/// may go on at any block of the procedure, with no edge listed: it is a
/// plain way into every block (glibc's `_nl_intern_locale_data`, whose
/// switch table the control analysis does not bound). `blocks`: the
/// procedure's decoded blocks.
pub fn ways_in(
    p: &ProcDb,
    returns: &Returns,
    blocks: &[Vec<(Instruction, InsnProgram)>],
) -> Vec<Vec<WayIn>> {
    let n = p.blocks.len();
    let pad = padding(p, blocks);
    let mut ways: Vec<Vec<WayIn>> = vec![Vec::new(); n];
    let mut root = vec![false; n];
    if let Some(w) = ways.get_mut(p.entry as usize) {
        w.push(WayIn::Entry);
    }
    for b in &p.blocks {
        if let Some(l) = b.call.and_then(|c| c.landing) {
            if let Some(r) = root.get_mut(l as usize) {
                *r = true;
            }
        }
    }
    for e in (p.edges.iter()).filter(|e| (e.to as usize) < n && !pad[e.from as usize]) {
        let call = p.blocks[e.from as usize].call;
        let way = match (e.kind, call) {
            (EdgeKindDb::FallThrough | EdgeKindDb::Taken | EdgeKindDb::JumpTable, None) => {
                Some(WayIn::Plain(e.from))
            }
            (EdgeKindDb::CallReturn, Some(c)) => match c.target {
                _ if back_call(&c, returns) => Some(WayIn::Back(e.from)),
                CallTarget::Proc(q) if !c.tail && !c.jmpbuf && returns.by_ret(q) => {
                    Some(WayIn::Return(q))
                }
                _ => None,
            },
            _ => None,
        };
        match way {
            Some(w) => ways[e.to as usize].push(w),
            None => root[e.to as usize] = true,
        }
    }
    for j in (0..n).filter(|&j| p.blocks[j].call.is_some_and(|c| c.indirect)) {
        ways.iter_mut().for_each(|w| w.push(WayIn::Plain(j as u32)));
    }
    for (ws, r) in ways.iter_mut().zip(root) {
        if r {
            ws.clear();
        }
    }
    ways
}

/// Per block: whether it is alignment padding no edge reaches (only
/// `nop`s, not the entry, no edge or landing into it, in a procedure
/// without unresolved indirect jumps): control gets there only by a way
/// the database does not list, so a walk that comes from it is refused
/// by the regenerator's check of the ways in (an error, never a wrong
/// address), and the block it falls into need not lose every register
/// for it (`jmp L; nop; L:` before each aligned loop head).
pub fn padding(p: &ProcDb, blocks: &[Vec<(Instruction, InsnProgram)>]) -> Vec<bool> {
    let n = p.blocks.len();
    let mut reached = vec![false; n];
    for b in p.edges.iter().map(|e| e.to).chain(Some(p.entry)) {
        if let Some(r) = reached.get_mut(b as usize) {
            *r = true;
        }
    }
    for l in p
        .blocks
        .iter()
        .filter_map(|b| b.call.and_then(|c| c.landing))
    {
        if let Some(r) = reached.get_mut(l as usize) {
            *r = true;
        }
    }
    let wild = p.blocks.iter().any(|b| b.call.is_some_and(|c| c.indirect));
    (0..n)
        .map(|b| {
            let nops = blocks.get(b).is_some_and(|i| {
                !i.is_empty() && i.iter().all(|(x, _)| x.mnemonic() == Mnemonic::Nop)
            });
            !wild && !reached[b] && nops
        })
        .collect()
}

/// `rsp` alone: what a return by `ret` carries.
fn rsp_only() -> RegSet {
    let mut s = RegSet::default();
    s.insert(Gpr::RSP);
    s
}

/// Per block: the registers known at its start (a greatest fixpoint over
/// [`ways_in`]: sound because every walk starts at a block without them,
/// and each step follows one of them). `blocks` are the procedure's
/// decoded blocks in database order, marked first
/// ([`mark_definitions`]: whoever plans or runs them after this call
/// records the same values); `returns` is the module's.
pub fn entry_knowledge(
    p: &ProcDb,
    returns: &Returns,
    blocks: &mut [Vec<(Instruction, InsnProgram)>],
) -> Vec<RegSet> {
    mark_once(p, returns, blocks);
    mark_calls(p, returns, blocks);
    mark_definitions(p, returns, blocks);
    knowledge(p, returns, blocks)
}

/// Sets [`InsnProgram::once`] on the first instruction of each block
/// whose every way in is the return of a call ([`WayIn::Back`]) to the
/// PLT stub of one thread constant's import
/// ([`Returns::thread_constant`]): `rax` there is that constant, taken
/// once per thread.
pub fn mark_once(p: &ProcDb, returns: &Returns, blocks: &mut [Vec<(Instruction, InsnProgram)>]) {
    let ways = ways_in(p, returns, blocks);
    let constant = |w: &WayIn| match *w {
        WayIn::Back(b) => match p.blocks.get(b as usize)?.call?.target {
            CallTarget::Proc(q) => returns.thread_constant(q),
            _ => None,
        },
        _ => None,
    };
    for (ws, insns) in ways.iter().zip(blocks.iter_mut()) {
        let mut ks = ws.iter().map(constant);
        let Some(Some(k)) = ks.next() else { continue };
        if ks.all(|c| c == Some(k)) {
            if let Some((_, prog)) = insns.first_mut() {
                prog.once = Some(k);
            }
        }
    }
}

/// Sets [`InsnProgram::args`] on the call of each block that calls a
/// procedure of the module directly (not a tail jump): the registers its
/// entry takes from its callers ([`Returns::args`]). The call records
/// those it does not know and keeps them known, so that the callee's
/// entry knows them ([`WayIn::Entry`]; the regenerator carries them
/// across the call, `Entered::Call`).
pub fn mark_calls(p: &ProcDb, returns: &Returns, blocks: &mut [Vec<(Instruction, InsnProgram)>]) {
    for (b, insns) in p.blocks.iter().zip(blocks.iter_mut()) {
        let Some(c) = b.call.filter(|c| !c.tail && !c.indirect) else {
            continue;
        };
        if let (CallTarget::Proc(q), Some((insn, prog))) = (c.target, insns.last_mut()) {
            if insn.is_call_near() {
                prog.args = returns.args(q);
            }
        }
    }
}

/// [`entry_knowledge`] of blocks as they are marked.
fn knowledge(
    p: &ProcDb,
    returns: &Returns,
    blocks: &[Vec<(Instruction, InsnProgram)>],
) -> Vec<RegSet> {
    let ways = ways_in(p, returns, blocks);
    let meet = |out: &[RegSet], ws: &[WayIn]| {
        RegSet(ws.iter().fold(ALL.0, |s, w| match *w {
            WayIn::Plain(q) => s & out[q as usize].0,
            WayIn::Back(q) => s & out[q as usize].0 & PRESERVED.0,
            WayIn::Return(_) => s & rsp_only().0,
            WayIn::Entry => s & (rsp_only().0 | returns.entry_args(p).0),
        }))
    };
    let mut known: Vec<RegSet> = ways
        .iter()
        .map(|ws| if ws.is_empty() { RegSet(0) } else { ALL })
        .collect();
    let anchor = |b: usize| p.blocks.get(b).is_some_and(anchors_rsp);
    let mut out: Vec<RegSet> = (blocks.iter().zip(&known).enumerate())
        .map(|(b, (insns, &k))| Exec::plan_block(k, insns, anchor(b)).1)
        .collect();
    let mut changed = true;
    while changed {
        changed = false;
        for b in 0..blocks.len() {
            if ways[b].is_empty() {
                continue;
            }
            let k = meet(&out, &ways[b]);
            if k != known[b] {
                debug_assert!(k.0 & !known[b].0 == 0, "the fixpoint only shrinks");
                known[b] = k;
                out[b] = Exec::plan_block(k, &blocks[b], anchor(b)).1;
                changed = true;
            }
        }
    }
    known
}

/// Blocks one definition's walk visits at most ([`feeds`]): bounds the
/// rewriter's and regenerator's work on large procedures.
const WALK_BLOCKS: usize = 64;

/// Sets each instruction's [`InsnProgram::before`]: register `g` is
/// recorded right after an instruction `D` that writes all of it (not a
/// constant, not `rsp`, not a block's last instruction), when it is
/// unknown there, if `g` *feeds* at least two memory references that
/// recording at their use would each pay a value for ([`feeds`]).
/// Recorded there once, every address computed from it is derived, where
/// recording at each use costs a value per reference that cannot teach
/// the register back (a scale, a register computed from it, a loop head
/// that loses it). Whether a reference's other registers are known is
/// read from the knowledge with every candidate marked, then with the
/// marks that chose (three rounds: a definition often pays only when
/// another does, `rax = window + edx` with `rsi` loaded). Joins are closed
/// too ([`join_candidates`]), offered again with the marks chosen and
/// chosen again if any is new (the knowledge of the marks kept is not that
/// of every candidate: marks chosen are not monotone in it). The rule depends
/// only on the instructions and the edges, so the rewriter and the
/// regenerator mark the same instructions.
pub fn mark_definitions(
    p: &ProcDb,
    returns: &Returns,
    blocks: &mut [Vec<(Instruction, InsnProgram)>],
) {
    let ways = ways_in(p, returns, blocks);
    let mut succs = vec![Vec::new(); blocks.len()];
    for (s, ws) in ways.iter().enumerate() {
        for w in ws {
            if let WayIn::Plain(b) = *w {
                succs[b as usize].push(s);
            }
        }
    }
    let mut candidates = definition_candidates(blocks);
    let defs = candidates.len();
    candidates.extend(join_candidates(p, returns, blocks, &ways, &candidates));
    let all = candidates.clone();
    let mut marks = choose_marks(
        p,
        returns,
        blocks,
        (&succs, &ways),
        (&candidates, defs),
        all,
    );
    // A join every way into which knew a register with every definition
    // marked may lose it once a definition that taught it is dropped
    // (gzip's hash loop 0x4b88 lost `rbp`, learnt at 0x4857 only while
    // `r15` was marked): offered again with the marks chosen.
    let again: Vec<_> = (join_candidates(p, returns, blocks, &ways, &marks).into_iter())
        .filter(|c| !candidates.contains(c))
        .collect();
    if !again.is_empty() {
        marks.extend(&again);
        candidates.extend(again);
        marks = choose_marks(
            p,
            returns,
            blocks,
            (&succs, &ways),
            (&candidates, defs),
            marks,
        );
    }
    set_marks(blocks, &marks);
}

/// Definition candidates ([`mark_definitions`]): after each instruction
/// but a block's last that writes all of a register other than `rsp`
/// with something other than a constant (not a call's).
fn definition_candidates(blocks: &[Vec<(Instruction, InsnProgram)>]) -> Vec<(usize, usize, Gpr)> {
    let mut candidates = Vec::new();
    for (b, insns) in blocks.iter().enumerate() {
        let body = insns.len().saturating_sub(1);
        for (i, (insn, prog)) in insns.iter().enumerate().take(body) {
            for u in prog.updates.iter().filter(|_| !insn.is_call_near()) {
                match (u.dst, u.op) {
                    (Dst::Full(g), op) if g != Gpr::RSP && !matches!(op, Op::Const(_)) => {
                        candidates.push((b, i + 1, g))
                    }
                    _ => {}
                }
            }
        }
    }
    candidates
}

/// The marks [`mark_definitions`] keeps of `candidates` (the first `defs`
/// definitions, then joins), starting from `marks`: three rounds, each
/// keeping the candidates that pay with the knowledge the previous
/// round's marks give ([`Walk::feeds`], [`Walk::closes`]).
fn choose_marks(
    p: &ProcDb,
    returns: &Returns,
    blocks: &mut [Vec<(Instruction, InsnProgram)>],
    (succs, ways): (&[Vec<usize>], &[Vec<WayIn>]),
    (candidates, defs): (&[(usize, usize, Gpr)], usize),
    mut marks: Vec<(usize, usize, Gpr)>,
) -> Vec<(usize, usize, Gpr)> {
    for _round in 0..3 {
        set_marks(blocks, &marks);
        let known = knowledge(p, returns, blocks);
        let at = known_before(blocks, &known);
        let walk = Walk {
            blocks,
            succs,
            at: &at,
        };
        marks = (candidates.iter().enumerate())
            .filter(|&(n, &(b, i, g))| {
                walk.feeds((b, i), g) || (n >= defs && walk.closes(b, g, ways))
            })
            .map(|(_, &c)| c)
            .collect();
    }
    marks
}

/// Candidates that close a join ([`mark_definitions`]): register `g`
/// (`rsp` too) recorded before the last instruction of a predecessor that
/// does not know it at its end, where every other way into a block knows
/// it, with `marks` marked (every definition candidate, then the marks
/// chosen); kept when `g` feeds
/// two references ([`Walk::feeds`]) or the join block uses it
/// ([`Walk::closes`]). Without it the join forgets
/// `g` on every run (gzip's `longest_match`: the chain loop's head learns
/// its index again by recording an address per iteration, though the
/// loop's own edge knows it from a value recorded once per iteration);
/// with it the predecessor, usually outside the loop, pays once. `ways`:
/// the procedure's [`ways_in`].
fn join_candidates(
    p: &ProcDb,
    returns: &Returns,
    blocks: &mut [Vec<(Instruction, InsnProgram)>],
    ways: &[Vec<WayIn>],
    marks: &[(usize, usize, Gpr)],
) -> Vec<(usize, usize, Gpr)> {
    set_marks(blocks, marks);
    let known = knowledge(p, returns, blocks);
    let anchor = |b: usize| p.blocks.get(b).is_some_and(anchors_rsp);
    let out: Vec<RegSet> = (blocks.iter().zip(&known).enumerate())
        .map(|(b, (insns, &k))| Exec::plan_block(k, insns, anchor(b)).1)
        .collect();
    let mut joins = Vec::new();
    for ws in ways.iter().filter(|ws| ws.len() > 1) {
        let preds: Option<Vec<usize>> = (ws.iter())
            .map(|w| match *w {
                WayIn::Plain(q) => Some(q as usize),
                WayIn::Return(_) | WayIn::Entry | WayIn::Back(_) => None,
            })
            .collect();
        let Some(preds) = preds else { continue };
        let some = preds.iter().fold(0, |s, &q| s | out[q].0);
        let all = preds.iter().fold(ALL.0, |s, &q| s & out[q].0);
        let lost = RegSet(some & !all);
        for &q in &preds {
            let Some(last) = blocks[q].len().checked_sub(1) else {
                continue;
            };
            let written = writes(&blocks[q][last].1);
            (lost.iter())
                .filter(|g| (out[q].0 | written.0) & (1 << g.0) == 0)
                .for_each(|g| joins.push((q, last, g)));
        }
    }
    joins
}

/// The registers an instruction's updates write, in full or in part.
fn writes(prog: &InsnProgram) -> RegSet {
    let mut s = RegSet::default();
    for u in &prog.updates {
        if let Dst::Full(g) | Dst::Partial(g) = u.dst {
            s.insert(g);
        }
    }
    s
}

fn set_marks(blocks: &mut [Vec<(Instruction, InsnProgram)>], marks: &[(usize, usize, Gpr)]) {
    for (_, prog) in blocks.iter_mut().flatten() {
        prog.before = RegSet::default();
    }
    for &(b, i, g) in marks {
        blocks[b][i].1.before.insert(g);
    }
}

/// Per block, per instruction: the registers known before it (after its
/// `before` values), the block starting with `known`.
fn known_before(blocks: &[Vec<(Instruction, InsnProgram)>], known: &[RegSet]) -> Vec<Vec<RegSet>> {
    (blocks.iter().zip(known))
        .map(|(insns, &k)| {
            let mut e = Exec::unknown(0);
            k.iter().for_each(|g| e.regs[g.index()] = Some(0));
            (insns.iter())
                .map(|(insn, prog)| {
                    let k = RegSet(e.known().0 | prog.before.0 | prog.args.0);
                    if e.insn(insn, prog, &mut |_| Ok(0)).is_err() {
                        e.update(insn, prog);
                    }
                    k
                })
                .collect()
        })
        .collect()
}

/// A procedure's marked blocks, their plain successors and the registers
/// known before each instruction: where [`Walk::feeds`] looks.
struct Walk<'a> {
    blocks: &'a [Vec<(Instruction, InsnProgram)>],
    succs: &'a [Vec<usize>],
    at: &'a [Vec<RegSet>],
}

impl Walk<'_> {
    /// Whether `g`, from instruction `at` on, feeds at least two memory
    /// references recording at the use would pay for: an address with a
    /// register *tainted* by it (`g`, or one an interpretable update
    /// computes from a tainted one; any other write clears it) whose other
    /// registers are known, along the plain edges, each block visited
    /// once; a block reached again while a register is tainted (a loop
    /// the definition is not in, or a join) counts its references again.
    /// A reference that would teach a tainted register back (its one
    /// unknown register, [`Exec::learn`]) untaints it: later uses of it
    /// are free either way. A register a successor's start does not know
    /// (a join where another way loses it) is untainted there. A block
    /// reached again with registers tainted that its walk did not taint
    /// is walked again with them (within [`WALK_BLOCKS`]): a loop that
    /// computes an index from `g` anew each iteration (gzip's
    /// `longest_match`: `movsxd rsi,r8d` at the latch, after the first
    /// use taught `rsi` back at the entry).
    fn feeds(&self, at: (usize, usize), g: Gpr) -> bool {
        // Per block: the taint its walks had, and the references counted.
        let mut fed = vec![None::<(RegSet, u32)>; self.blocks.len()];
        fed[at.0] = Some((ALL, 0));
        let (mut sites, mut visited) = (0u32, 0usize);
        let mut stack = vec![(at.0, at.1, RegSet(1 << g.0))];
        while let Some((b, from, t)) = stack.pop() {
            let (here, t) = self.block(b, from, t);
            sites += here;
            if from == 0 {
                fed[b] = fed[b].map(|(w, _)| (w, here));
            }
            for &s in &self.succs[b] {
                // What a join does not know everywhere is lost there.
                let t = RegSet(t.0 & self.at[s].first().map_or(0, |k| k.0));
                let walked = fed[s].map_or(0, |(w, _)| w.0);
                match fed[s] {
                    _ if t.0 == 0 => {}
                    Some((_, n)) if t.0 & !walked == 0 => sites += n,
                    _ if visited < WALK_BLOCKS => {
                        visited += 1;
                        fed[s] = Some((RegSet(walked | t.0), 0));
                        stack.push((s, 0, t));
                    }
                    _ => {}
                }
            }
            if sites >= 2 {
                return true;
            }
        }
        false
    }

    /// Whether recording `g` at the end of block `q` closes a join that
    /// pays for it: a successor with several ways in that knows `g` at its
    /// start (every other way knows it at its end) and whose own
    /// references `g` feeds. Left open, every run of the join pays a value
    /// there, whichever way it came (a loop head: every iteration, though
    /// only the entry's way lost it, gzip's `updcrc` pointer); closed, only
    /// the runs of `q` do, and those are no more than the join's runs that
    /// come from `q` plus those of `q`'s other successors.
    fn closes(&self, q: usize, g: Gpr, ways: &[Vec<WayIn>]) -> bool {
        let t = RegSet(1 << g.0);
        self.succs[q].iter().any(|&s| {
            ways[s].len() > 1
                && self.at[s].first().is_some_and(|k| k.0 & t.0 != 0)
                && self.block(s, 0, t).0 > 0
        })
    }

    /// The references of block `b` from instruction `from` that `t` feeds,
    /// and the tainted registers at its end.
    fn block(&self, b: usize, from: usize, mut t: RegSet) -> (u32, RegSet) {
        let mut here = 0;
        for (i, (insn, prog)) in self.blocks[b].iter().enumerate().skip(from) {
            let k = self.at[b][i];
            let mut taught = RegSet(0);
            for r in &prog.refs {
                let regs = reads(&r.addr);
                if regs.0 & t.0 & !taught.0 != 0 && regs.0 & !t.0 & !k.0 == 0 {
                    here += 1;
                    taught.0 |= teaches(&r.addr, t).0;
                }
            }
            t = taint(insn, prog, RegSet(t.0 & !taught.0));
            if t.0 == 0 {
                break;
            }
        }
        (here, t)
    }
}

/// The register a recorded `a` teaches back at its use ([`Exec::learn`]),
/// if any: its one tainted register, as its base or its index of scale 1.
fn teaches(a: &AddrExpr, t: RegSet) -> RegSet {
    let tainted = RegSet(reads(a).0 & t.0);
    match tainted.iter().collect::<Vec<_>>()[..] {
        [x] if a.base == Some(x) && a.index != Some(x) => tainted,
        [x] if a.index == Some(x) && a.scale == 1 && a.base != Some(x) => tainted,
        _ => RegSet(0),
    }
}

/// The registers of a flat address.
fn reads(a: &AddrExpr) -> RegSet {
    let mut s = RegSet::default();
    if a.seg == Seg::Flat {
        a.base.into_iter().chain(a.index).for_each(|g| s.insert(g));
    }
    s
}

/// The tainted registers after `insn` (all its updates read `t` before it).
fn taint(insn: &Instruction, prog: &InsnProgram, t: RegSet) -> RegSet {
    let mut out = t;
    for u in &prog.updates {
        let (g, v) = match u.dst {
            Dst::Full(g) => (g, code::eval(insn, u.dst, &u.op, ALL)),
            Dst::Partial(g) => (g, None),
            Dst::Flags => continue,
        };
        match v {
            Some(v) if v.reads().0 & t.0 != 0 => out.insert(g),
            _ => out.0 &= !(1 << g.0),
        }
    }
    out
}

pub mod code;

#[cfg(test)]
mod tests;
