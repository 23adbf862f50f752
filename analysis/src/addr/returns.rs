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
//! Invariant: [`Returns::of`] is the greatest set closed under that rule;
//! equivalently, `f` returns by `ret` iff every procedure `f` reaches by
//! tail calls (itself included) leaves only in those ways (the naive twin
//! of the tests).

use aetrace_format::progdb::{BlockDb, CallTarget, EdgeKindDb, ProcDb, ProgramDb};
use iced_x86::{Decoder, DecoderOptions, Mnemonic};

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
}

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
        }
    }

    /// [`Returns::of`] with the leaves of the module `image` named: what
    /// the rewriter, the regenerator, the census and the debugger use, so
    /// that they agree on every way in.
    pub fn of_module(db: &ProgramDb, image: &crate::elf::Module) -> Self {
        Self::of(db).with_leaves(db, |b| enters_kernel(b, block_bytes(image, b)))
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
