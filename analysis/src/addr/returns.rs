//! Which calls come back through a traced `ret` (issue 21, `docs/data.md`
//! "Across calls"): a module-level greatest fixpoint over the program
//! database, shared by the rewriter, the regenerator and the debugger, so
//! the three agree on which return points start with `rsp` known.
//!
//! Every `ret` reads `[rsp]`, derived or recorded, so after a traced `ret`
//! abstract execution knows `rsp` exactly, whatever the ABI. A procedure
//! *returns by `ret`* when it is traced and every way it leaves is a `ret`,
//! a call or instruction that does not come back (`NoReturn`, `Halt`), or a
//! tail call to a procedure that returns by `ret` (a tail call to untraced
//! code, `jmp free@plt`, would return unseen). The return point of a
//! direct call to such a procedure can then start with `rsp` known, the
//! regenerator checking that the run before it was a `ret` of the callee or
//! of a procedure it reaches by tail calls ([`Returns::tail_reaches`]).
//!
//! It also names the module's PLT stubs ([`Returns::stub`]): a procedure
//! whose entry block ends with the stub's jump through its GOT slot, so
//! that a call to one whose import never runs traced code returns with
//! the registers the ABI preserves (`exec::WayIn::Back`), and its leaves
//! ([`Returns::leaf`]): procedures that return by `ret`, call nothing and
//! never enter the kernel, so that between a call to one and its return
//! only the leaf's own blocks run in the thread (a signal handler's runs
//! aside, which the regenerator saves the state around) and the return
//! point keeps the caller's preserved registers too (`exec::WayIn::Back`).
//! No thread starts inside a leaf: a fork or clone child starts after a
//! system call.
//!
//! And the stubs of imports whose result is a thread constant
//! ([`THREAD_CONSTANTS`], [`Returns::thread_constant`]): glibc's
//! `__errno_location` returns the thread's `errno` address, the same at
//! every call of one thread (a fork child's equals its parent's, and its
//! slot starts afresh anyway), so a data trace records it once per thread
//! (`exec::mark_once`).
//!
//! And the argument registers each procedure's entry takes from its
//! callers ([`Returns::args`]; issue 21, the census's `entry` class): a
//! procedure entered only by direct calls from traced code of its module
//! starts with the argument registers its entry block would otherwise pay
//! for; each such call records the ones it does not know and keeps them
//! across the call instruction (`exec::mark_calls`), and the regenerator
//! passes the caller's values into the entry (`Entered::Call`). Proof that
//! no other way in exists, from the module alone: no tail jump, indirect
//! call, lazy PLT outcome or other direct branch reaches the entry, no
//! instruction of the module's traced code computes its address
//! (rip-relative), and no 4 bytes of the file hold its address (a
//! relocation's addend, a pointer in data, an exported symbol's value,
//! the ELF entry point, an immediate operand). A way in the proof misses
//! (code the analysis did not recover) passes an outside-entry stub and is
//! refused by the regenerator: an error, never a wrong address.
//!
//! Invariant: [`Returns::of`] is the greatest set closed under that rule;
//! equivalently, `f` returns by `ret` iff every procedure `f` reaches by
//! tail calls (itself included) leaves only in those ways (the naive twin
//! of the tests).

use std::collections::HashMap;

use aetrace_format::progdb::{BlockDb, CallTarget, EdgeKindDb, ProcDb, ProgramDb};
use iced_x86::{Decoder, DecoderOptions, Instruction, InstructionInfoFactory, Mnemonic};

use super::exec::Exec;
use super::{forms, Gpr, InsnProgram, RegSet};

/// Per procedure of a module: whether it returns by `ret` (module doc), and
/// the procedures it reaches by direct tail calls (computed once: the
/// regenerator asks at every return point that keeps `rsp`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Returns {
    by_ret: Vec<bool>,
    /// Per procedure: the others it reaches by direct tail calls, sorted.
    reach: Vec<Box<[u32]>>,
    /// Per procedure: a PLT stub ([`Returns::stub`]).
    stubs: Vec<bool>,
    /// Per procedure: a leaf ([`Returns::leaf`]); none until
    /// [`Returns::with_leaves`].
    leaves: Vec<bool>,
    /// Per procedure: the thread constant a PLT stub's import returns
    /// ([`Returns::thread_constant`]).
    consts: Vec<Option<u8>>,
    /// Per procedure: the argument registers its entry takes from its
    /// callers ([`Returns::args`]); none until [`Returns::with_args`].
    args: Vec<RegSet>,
    /// The entry addresses of the procedures with arguments, sorted, with
    /// them ([`Returns::entry_args`]).
    entry_args: Vec<(u64, RegSet)>,
}

/// The registers SysV x86-64 passes integer arguments in: `rdi`, `rsi`,
/// `rdx`, `rcx`, `r8`, `r9`.
pub const ARGS: RegSet = RegSet(1 << 7 | 1 << 6 | 1 << 2 | 1 << 1 | 1 << 8 | 1 << 9);

/// Imports whose result is the same at every call of one thread (glibc:
/// the addresses of the thread's `errno` and locale tables, the thread's
/// descriptor), by number: bit `k` of the runtime's slot word `ONCE` says
/// whether the thread recorded constant `k` yet.
pub const THREAD_CONSTANTS: [&str; 5] = [
    "__errno_location",
    "__ctype_b_loc",
    "__ctype_tolower_loc",
    "__ctype_toupper_loc",
    "pthread_self",
];

impl Returns {
    /// The greatest fixpoint over `db`: start from the procedures whose own
    /// exits qualify, then drop every one that tail-calls a dropped one.
    pub fn of(db: &ProgramDb) -> Self {
        let n = db.procs.len();
        let mut ok = vec![false; n];
        let mut callers: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (f, p) in db.procs.iter().enumerate() {
            let targets = exits(p);
            ok[f] = targets.is_some();
            for q in targets.into_iter().flatten() {
                if let Some(c) = callers.get_mut(q as usize) {
                    c.push(f as u32);
                } else {
                    ok[f] = false;
                }
            }
        }
        let mut drop: Vec<u32> = (0..n as u32).filter(|&f| !ok[f as usize]).collect();
        while let Some(q) = drop.pop() {
            for &f in &callers[q as usize] {
                if std::mem::take(&mut ok[f as usize]) {
                    drop.push(f);
                }
            }
        }
        Returns {
            by_ret: ok,
            reach: (0..n as u32).map(|f| reach_of(db, f)).collect(),
            stubs: db.procs.iter().map(is_stub).collect(),
            leaves: Vec::new(),
            consts: (db.procs.iter())
                .map(|p| constant_of(&p.name).filter(|_| is_stub(p)))
                .collect(),
            args: Vec::new(),
            entry_args: Vec::new(),
        }
    }

    /// [`Returns::of`] with the leaves of the module `image` named: what
    /// the rewriter, the regenerator, the census and the debugger use, so
    /// that they agree on every way in.
    pub fn of_module(db: &ProgramDb, image: &crate::elf::Module) -> Self {
        Self::of(db)
            .with_leaves(db, |b| enters_kernel(b, block_bytes(image, b)))
            .with_args(db, |b| decode(b, block_bytes(image, b)), image.bytes())
    }

    /// With the argument registers each procedure's entry takes from its
    /// callers named ([`Returns::args`]): those its entry block pays a
    /// value for when it alone is unknown, of a procedure whose every way
    /// in is a direct call from the module's traced code (module doc).
    /// `code` decodes a block's instructions (`None`: not readable);
    /// `file` is the module's file.
    pub fn with_args(
        mut self,
        db: &ProgramDb,
        code: impl Fn(&BlockDb) -> Option<Vec<Instruction>>,
        file: &[u8],
    ) -> Self {
        let mut info = InstructionInfoFactory::new();
        let mut programs = |is: Vec<Instruction>| -> Vec<(Instruction, InsnProgram)> {
            (is.into_iter())
                .map(|i| (i, forms::program(&i, &mut info)))
                .collect()
        };
        self.args = (db.procs.iter().enumerate())
            .map(|(q, p)| match p.is_traced() && !self.stub(q as u32) {
                true => (p.blocks.get(p.entry as usize))
                    .and_then(&code)
                    .map_or(RegSet(0), |is| needs(&programs(is))),
                false => RegSet(0),
            })
            .collect();
        let entry = |p: &ProcDb| p.blocks.get(p.entry as usize).map(|b| b.start);
        let mut at: HashMap<u64, u32> = (db.procs.iter().enumerate())
            .filter(|&(q, _)| self.args[q].0 != 0)
            .filter_map(|(q, p)| Some((entry(p)?, q as u32)))
            .collect();
        for q in other_ways_in(db, &code, file, &at) {
            self.args[q as usize] = RegSet(0);
        }
        at.retain(|_, q| self.args[*q as usize].0 != 0);
        self.entry_args = at
            .iter()
            .map(|(&a, &q)| (a, self.args[q as usize]))
            .collect();
        self.entry_args.sort_unstable_by_key(|&(a, _)| a);
        self
    }

    /// The argument registers procedure `q`'s entry takes from its direct
    /// callers: each call to it records those it does not know.
    pub fn args(&self, q: u32) -> RegSet {
        self.args.get(q as usize).copied().unwrap_or_default()
    }

    /// [`Returns::args`] of procedure `p` (by its entry's address).
    pub fn entry_args(&self, p: &ProcDb) -> RegSet {
        let Some(a) = p.blocks.get(p.entry as usize).map(|b| b.start) else {
            return RegSet(0);
        };
        match self.entry_args.binary_search_by_key(&a, |&(a, _)| a) {
            Ok(k) => self.entry_args[k].1,
            Err(_) => RegSet(0),
        }
    }

    /// With the module's leaves ([`Returns::leaf`]) named: `kernel` says
    /// whether a block may enter the kernel ([`enters_kernel`]).
    pub fn with_leaves(mut self, db: &ProgramDb, kernel: impl Fn(&BlockDb) -> bool) -> Self {
        self.leaves = (db.procs.iter().enumerate())
            .map(|(f, p)| self.by_ret[f] && p.blocks.iter().all(|b| b.call.is_none() && !kernel(b)))
            .collect();
        self
    }

    /// Whether procedure `q` is a leaf: it returns by `ret`, and no block
    /// of it calls, jumps to another procedure or enters the kernel.
    pub fn leaf(&self, q: u32) -> bool {
        self.leaves.get(q as usize).copied().unwrap_or(false)
    }

    /// Whether procedure `q` is a PLT stub: traced, its entry block ends
    /// with a jump through a GOT slot (`CallDb::plt`, to untraced code).
    pub fn stub(&self, q: u32) -> bool {
        self.stubs.get(q as usize).copied().unwrap_or(false)
    }

    /// The thread constant ([`THREAD_CONSTANTS`]) procedure `q` returns:
    /// a PLT stub of one of those imports.
    pub fn thread_constant(&self, q: u32) -> Option<u8> {
        self.consts.get(q as usize).copied().flatten()
    }

    /// Whether procedure `q` returns by `ret`.
    pub fn by_ret(&self, q: u32) -> bool {
        self.by_ret.get(q as usize).copied().unwrap_or(false)
    }

    /// Whether `q` is `f` or a procedure `f` reaches by direct tail calls:
    /// a `ret` of `q` may end a call to `f`.
    pub fn tail_reaches(&self, f: u32, q: u32) -> bool {
        f == q
            || self
                .reach
                .get(f as usize)
                .is_some_and(|r| r.binary_search(&q).is_ok())
    }
}

/// Whether block `b`, whose bytes are `code` (`None`: not readable), may
/// enter the kernel: a `syscall`, `sysenter` or `int`, or bytes that do
/// not decode as its instructions.
fn enters_kernel(b: &BlockDb, code: Option<&[u8]>) -> bool {
    let Some(code) = code else { return true };
    let mut d = Decoder::with_ip(64, code, b.start, DecoderOptions::NONE);
    b.insn_lens.iter().any(|&len| {
        let i = d.decode();
        i.is_invalid()
            || i.len() != usize::from(len)
            || matches!(
                i.mnemonic(),
                Mnemonic::Syscall | Mnemonic::Sysenter | Mnemonic::Int
            )
    })
}

/// The argument registers whose being unknown alone makes an entry block
/// (`insns`) pay at least one value more: a call that does not know one
/// pays one value for it, so the callee's entry saves at least as many.
fn needs(insns: &[(Instruction, InsnProgram)]) -> RegSet {
    let values = |known: RegSet| -> usize {
        let (plans, _) = Exec::plan_block(known, insns, false);
        plans.iter().map(|p| p.as_ref().map_or(0, Vec::len)).sum()
    };
    let all = RegSet(ARGS.0 | 1 << Gpr::RSP.0);
    let base = values(all);
    let mut out = RegSet(0);
    for g in ARGS.iter() {
        if values(RegSet(all.0 & !(1 << g.0))) > base {
            out.insert(g);
        }
    }
    out
}

/// Of the procedures whose entries are in `at` (address to procedure),
/// those with a way in other than a direct call from the module's traced
/// code (module doc): a tail jump, an indirect call or jump to it, a lazy
/// PLT outcome; a branch that is no such call, or a rip-relative operand,
/// to its entry; its address in 4 bytes of the file.
fn other_ways_in(
    db: &ProgramDb,
    code: impl Fn(&BlockDb) -> Option<Vec<Instruction>>,
    file: &[u8],
    at: &HashMap<u64, u32>,
) -> Vec<u32> {
    let mut out = Vec::new();
    for (f, p) in (db.procs.iter().enumerate()).filter(|(_, p)| p.is_traced()) {
        for b in &p.blocks {
            let call = b.call.filter(|c| !c.tail && !c.indirect);
            if let Some(c) = b.call {
                if let (CallTarget::Proc(q), true) = (c.target, c.tail || c.indirect) {
                    out.push(q);
                }
                out.extend(c.lazy);
            }
            for i in code(b).unwrap_or_default() {
                if i.is_ip_rel_memory_operand() {
                    out.extend(at.get(&i.ip_rel_memory_address()));
                }
                let Some(&q) = at.get(&i.near_branch_target()) else {
                    continue;
                };
                let called =
                    i.is_call_near() && call.is_some_and(|c| c.target == CallTarget::Proc(q));
                if !called && (f as u32 != q || i.is_call_near()) {
                    out.push(q);
                }
            }
        }
    }
    let low: HashMap<u32, u32> = at.iter().map(|(&a, &q)| (a as u32, q)).collect();
    for w in file.windows(4) {
        out.extend(low.get(&u32::from_le_bytes([w[0], w[1], w[2], w[3]])));
    }
    out
}

/// Block `b`'s instructions, decoded from `code` (`None`: not readable, or
/// not its instructions).
fn decode(b: &BlockDb, code: Option<&[u8]>) -> Option<Vec<Instruction>> {
    let mut d = Decoder::with_ip(64, code?, b.start, DecoderOptions::NONE);
    (b.insn_lens.iter())
        .map(|&len| {
            let i = d.decode();
            (!i.is_invalid() && i.len() == usize::from(len)).then_some(i)
        })
        .collect()
}

/// The bytes of block `b` in `image`.
fn block_bytes<'a>(image: &'a crate::elf::Module, b: &BlockDb) -> Option<&'a [u8]> {
    let len = b.insn_lens.iter().map(|&l| u64::from(l)).sum();
    image.bytes_at(b.start, len)
}

/// The number of the thread constant a stub named `name` (`import@plt`)
/// returns.
fn constant_of(name: &str) -> Option<u8> {
    let import = name.strip_suffix("@plt")?;
    (THREAD_CONSTANTS.iter().position(|c| *c == import)).map(|k| k as u8)
}

/// Whether `p` is a PLT stub ([`Returns::stub`]).
fn is_stub(p: &ProcDb) -> bool {
    let jump = p.blocks.get(p.entry as usize).and_then(|b| b.call);
    p.is_traced()
        && jump.is_some_and(|c| c.tail && c.plt && !c.indirect && c.target == CallTarget::External)
}

/// The procedures `p` tail-calls, when its own exits qualify (traced, and
/// every exit a `ret`, a way out that never comes back, or a direct tail
/// call to a procedure of the module); else `None`.
fn exits(p: &ProcDb) -> Option<Vec<u32>> {
    if !p.is_traced() {
        return None;
    }
    let mut targets = Vec::new();
    for e in &p.edges {
        match e.kind {
            EdgeKindDb::Return | EdgeKindDb::NoReturn | EdgeKindDb::Halt => {}
            EdgeKindDb::TailCall => targets.push(tail_target(p, e.from)?),
            _ => {}
        }
    }
    Some(targets)
}

/// The traced procedure block `b` of `p` tail-calls directly, if any.
fn tail_target(p: &ProcDb, b: u32) -> Option<u32> {
    let c = p.blocks.get(b as usize)?.call?;
    match c.target {
        CallTarget::Proc(q) if c.tail && !c.indirect => Some(q),
        _ => None,
    }
}

/// The procedures of the module other than `f` that `f` reaches by direct
/// tail calls, sorted.
fn reach_of(db: &ProgramDb, f: u32) -> Box<[u32]> {
    let mut seen = vec![f];
    let mut todo = vec![f];
    while let Some(g) = todo.pop() {
        let Some(p) = db.procs.get(g as usize) else {
            continue;
        };
        let tails = p.edges.iter().filter(|e| e.kind == EdgeKindDb::TailCall);
        for q in tails.filter_map(|e| tail_target(p, e.from)) {
            if (q as usize) < db.procs.len() && !seen.contains(&q) {
                seen.push(q);
                todo.push(q);
            }
        }
    }
    seen.retain(|&q| q != f);
    seen.sort_unstable();
    seen.into_boxed_slice()
}

#[cfg(test)]
mod tests;
