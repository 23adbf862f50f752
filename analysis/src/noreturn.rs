//! Which procedures never return, and the call edges that follows for.
//!
//! Seeds: imports and symbols with a known non-returning name (`exit`,
//! `abort`, `__stack_chk_fail`, ...). Then a least fixpoint: a procedure
//! returns if, from one of its entries, a path reaches a `ret` or a tail
//! call to a returning (or unknown) callee, crossing a call only when that
//! callee returns. Procedures we could not analyse, indirect callees and
//! unresolved indirect jumps count as returning, so an error here can only
//! add an edge, never drop a real one.
//!
//! Afterwards every call to a non-returning callee has its `CallReturn`
//! edge turned into a `NoReturn` edge to EXIT (same `EdgeId`).
//!
//! Invariant: `returns[p]` only ever goes from false to true during the
//! fixpoint, so the loop terminates.

use std::collections::HashMap;

use aetrace_graph::{BlockId, EntityRef, PrimaryMap, ProcId};

use crate::cfg::{CallKind, CallSite, Cfg, EdgeKind};
use crate::{ProcKind, Procedure};

/// Functions that never return to their caller.
pub const NORETURN_NAMES: &[&str] = &[
    "exit",
    "_exit",
    "_Exit",
    "quick_exit",
    "abort",
    "__stack_chk_fail",
    "__stack_chk_fail_local",
    "__chk_fail",
    "__fortify_fail",
    "__assert_fail",
    "__assert_perror_fail",
    "__assert",
    "__cxa_throw",
    "__cxa_rethrow",
    "__cxa_bad_cast",
    "__cxa_bad_typeid",
    "__cxa_call_unexpected",
    "__cxa_throw_bad_array_new_length",
    "_Unwind_Resume",
    "longjmp",
    "_longjmp",
    "siglongjmp",
    "__longjmp_chk",
    "pthread_exit",
    "err",
    "errx",
    "verr",
    "verrx",
    "__libc_start_main",
    "__libc_fatal",
    "_ZSt9terminatev",
];

/// Whether `name` (an import or symbol, without `@plt`) never returns.
pub fn is_noreturn_name(name: &str) -> bool {
    // libstdc++'s `std::__throw_*` helpers.
    NORETURN_NAMES.contains(&name) || (name.starts_with("_ZSt") && name.contains("__throw_"))
}

struct Facts<'a> {
    entry_of: HashMap<u64, ProcId>,
    procs: &'a PrimaryMap<ProcId, Procedure>,
}

impl Facts<'_> {
    fn callee_returns(&self, cs: &CallSite, returns: &[bool]) -> bool {
        if let Some(n) = &cs.name {
            if is_noreturn_name(n) {
                return false;
            }
        }
        match (cs.kind, cs.target) {
            (CallKind::Indirect, _) | (_, None) => true,
            (_, Some(t)) => self.entry_of.get(&t).map_or(true, |p| returns[p.index()]),
        }
    }

    fn proc_returns(&self, p: &Procedure, cfg: &Cfg, returns: &[bool]) -> bool {
        let call_at: HashMap<BlockId, &CallSite> = cfg.calls.iter().map(|c| (c.block, c)).collect();
        let mut succs: Vec<Vec<usize>> = vec![Vec::new(); cfg.blocks.len()];
        for (k, e) in cfg.edges.iter() {
            succs[e.from.index()].push(k.index());
        }
        let mut seen = vec![false; cfg.blocks.len()];
        let mut work: Vec<BlockId> = p.entries.iter().filter_map(|&a| cfg.block_at(a)).collect();
        while let Some(b) = work.pop() {
            if std::mem::replace(&mut seen[b.index()], true) {
                continue;
            }
            for &k in &succs[b.index()] {
                let e = cfg.edges.as_slice()[k];
                let follow = match e.kind {
                    EdgeKind::Return => return true,
                    EdgeKind::TailCall => {
                        if call_at
                            .get(&b)
                            .map_or(true, |c| self.callee_returns(c, returns))
                        {
                            return true;
                        }
                        false
                    }
                    EdgeKind::NoReturn | EdgeKind::Halt => false,
                    EdgeKind::CallReturn => call_at
                        .get(&b)
                        .map_or(true, |c| self.callee_returns(c, returns)),
                    EdgeKind::FallThrough
                    | EdgeKind::Taken
                    | EdgeKind::JumpTable
                    | EdgeKind::Resume => true,
                };
                if follow {
                    work.push(e.to);
                }
            }
        }
        false
    }
}

/// Decides `noreturn` for every procedure and fixes the call edges.
pub fn apply(procs: &mut PrimaryMap<ProcId, Procedure>) {
    let mut entry_of = HashMap::new();
    for (id, p) in procs.iter() {
        for &a in &p.entries {
            entry_of.entry(a).or_insert(id);
        }
    }
    let mut returns = vec![true; procs.len()];
    let mut open = Vec::new();
    for (id, p) in procs.iter() {
        let named = p.import.as_deref().or(p.symbol.as_deref());
        let r = &mut returns[id.index()];
        if named.is_some_and(is_noreturn_name) {
            *r = false;
        } else if p.kind == ProcKind::Function && p.cfg.is_ok() {
            *r = false;
            open.push(id);
        }
    }
    let facts = Facts { entry_of, procs };
    loop {
        let mut changed = false;
        for &id in &open {
            if returns[id.index()] {
                continue;
            }
            let p = &facts.procs[id];
            if let Ok(cfg) = &p.cfg {
                if facts.proc_returns(p, cfg, &returns) {
                    returns[id.index()] = true;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    // Call sites and edges follow the callee's verdict.
    let verdicts: Vec<Vec<bool>> = procs
        .values()
        .map(|p| match &p.cfg {
            Ok(cfg) => cfg
                .calls
                .iter()
                .map(|c| facts.callee_returns(c, &returns))
                .collect(),
            Err(_) => Vec::new(),
        })
        .collect();
    for (id, p) in procs.iter_mut() {
        p.noreturn = !returns[id.index()];
        let Ok(cfg) = &mut p.cfg else { continue };
        let exit = cfg.exit();
        for (c, &r) in cfg.calls.iter_mut().zip(&verdicts[id.index()]) {
            if c.tail || !c.returns || r {
                c.returns = c.returns && r;
                continue;
            }
            c.returns = false;
            for (_, e) in cfg.edges.iter_mut() {
                if e.from == c.block && e.kind == EdgeKind::CallReturn {
                    e.to = exit;
                    e.kind = EdgeKind::NoReturn;
                }
            }
        }
        debug_assert_eq!(cfg.check(), Ok(()));
    }
}
