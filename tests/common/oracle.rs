//! The CFG oracle: does a module's CFG (from `aetrace cfg --json`) explain
//! everything valgrind saw the module execute?
//!
//! Rules (the contract of `aetrace cfg --json`):
//! - every executed address is an instruction of some block;
//! - inside a block, an instruction is followed by the next one of the block;
//! - after the last instruction a of block A (procedure P), b must be one of:
//!   - the start of a block B of P with an edge A -> B;
//!   - a procedure entry, when A is a call block whose call record targets
//!     b, or has no target and is indirect or PLT (a stub's `jmp *GOT`);
//!   - a return address (the start of a `callreturn` successor of some call
//!     block), when A has an edge to EXIT of kind `return`;
//!   - a procedure entry, when A has an edge to EXIT of kind `tailcall` (the
//!     target of A's tail-call record when it has one);
//!   - any block start, when a is an indirect jump the CFG says is
//!     unresolved (a resolved one must have the edge);
//! - an entry into the module from outside (the loader, libc, a callback
//!   from libc, a signal handler, a longjmp) lands on a procedure start or a
//!   return address;
//! - a new thread or forked child that starts inside the module (static
//!   binaries: it returns from the `clone`/`fork` system call) starts a
//!   block right after a 2-byte instruction (`syscall`) that ends its own.
//!
//! Legal transfers that are no CFG edge, and how they are treated:
//! - `a -> a`: valgrind runs each iteration of a `rep`-prefixed string
//!   instruction as its own instruction, so lackey repeats the address.
//!   Accepted for any instruction (a real self-loop would be an edge anyway).
//! - `longjmp` lands right after the `call setjmp` that saved the context
//!   (setjmp "returns twice"): that is a return address, so it is accepted as
//!   an entry, or, in a static binary where `__longjmp` is inside the module,
//!   as the target of `__longjmp`'s indirect jump (unresolved: any block
//!   start).
//! - C++ exceptions: the unwinder transfers to a landing pad, which is in the
//!   middle of a procedure and after no call (by a `ret` in a static binary,
//!   from libgcc_s otherwise). Such an entry (or return target) is accepted
//!   when it is a landing pad of the module's LSDAs (read independently, see
//!   `lsda.rs`) and a block start; the count is reported.
//! - Signals: a handler is entered from the kernel (via valgrind) at its
//!   procedure start, an entry (the log reducer breaks the chain at the
//!   delivery and resumes the interrupted chain at `rt_sigreturn`); the
//!   handler's return lands on the signal-return stub (`__restore_rt`, a
//!   procedure start but no return address), recognised by its bytes.
//! - Threads: pairs are taken in each thread's own stream (`lackey.rs`
//!   follows valgrind's scheduler log), so threaded programs are checked
//!   like the others.

use super::cfg::{Index, Loc};
use super::lackey::ModuleTrace;
use super::FastSet;

/// Addresses, found independently of aetrace, where control may arrive
/// from no edge: C++ landing pads (`lsda::landing_pads`) and signal-return
/// stubs (`Elf::sigreturn_stubs`).
#[derive(Default)]
pub struct Landmarks {
    pub landing_pads: FastSet<u64>,
    pub restorers: FastSet<u64>,
}

impl Landmarks {
    /// The landmarks of the ELF file at `path`.
    pub fn of(path: &std::path::Path) -> Landmarks {
        Landmarks {
            landing_pads: super::lsda::landing_pads(path),
            restorers: super::elf::Elf::read(path).sigreturn_stubs(),
        }
    }
}

/// What the check saw, by category, for the report.
#[derive(Default, Debug, Clone)]
pub struct Stats {
    pub executed: u64,
    pub addrs: usize,
    pub pairs: usize,
    pub in_block: usize,
    pub edges: usize,
    pub calls: usize,
    pub returns: usize,
    pub tailcalls: usize,
    pub indirect_resolved: usize,
    pub indirect_unresolved: usize,
    pub rep_self: usize,
    pub landing_pads: usize,
    pub signal_returns: usize,
    pub entries: usize,
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} insns executed, {} distinct addrs, {} distinct pairs (in-block {}, edges {}, calls {}, \
             returns {}, tail calls {}, jump-table {}, unresolved-indirect {}, rep {}, landing pads {}, \
             signal returns {}), {} entries",
            self.executed,
            self.addrs,
            self.pairs,
            self.in_block,
            self.edges,
            self.calls,
            self.returns,
            self.tailcalls,
            self.indirect_resolved,
            self.indirect_unresolved,
            self.rep_self,
            self.landing_pads,
            self.signal_returns,
            self.entries
        )
    }
}

enum Verdict {
    InBlock,
    Edge,
    Call,
    Return,
    TailCall,
    IndirectResolved,
    IndirectUnresolved,
    LandingPad,
    SignalReturn,
}

struct Checker<'a, 'b> {
    ix: &'b Index<'a>,
    marks: &'b Landmarks,
    /// Starts of `callreturn` successors: where returns land.
    return_addrs: FastSet<u64>,
}

impl Checker<'_, '_> {
    fn is_block_start(&self, b: u64) -> bool {
        self.ix.block_start.contains_key(&b)
    }

    fn is_landing_pad(&self, b: u64) -> bool {
        self.marks.landing_pads.contains(&b) && self.is_block_start(b)
    }

    /// Why a -> b is legal when a is at `la`, or None.
    fn explain(&self, la: Loc, b: u64) -> Option<Verdict> {
        let ix = self.ix;
        let block = ix.block(la);
        if la.pos + 1 < block.insns.len() {
            return (block.insns[la.pos + 1] == b).then_some(Verdict::InBlock);
        }
        let key = (la.proc, la.block);
        if let Some(starts) = ix.block_start.get(&b) {
            if starts
                .iter()
                .any(|&(p, bi)| p == la.proc && ix.edges.contains(&(la.proc, la.block, bi)))
            {
                let ijump = ix.cfg.procs[la.proc]
                    .indirect_jumps
                    .iter()
                    .any(|j| j.addr == block.insns[la.pos]);
                return Some(if ijump {
                    Verdict::IndirectResolved
                } else {
                    Verdict::Edge
                });
            }
        }
        let is_proc_start = ix.proc_start.contains_key(&b);
        if block.kind == "call" && is_proc_start {
            if let Some(calls) = ix.calls.get(&key) {
                if let Some(c) = calls
                    .iter()
                    .find(|c| c.target == Some(b) || (c.target.is_none() && c.kind != "direct"))
                {
                    return Some(if c.tail {
                        Verdict::TailCall
                    } else {
                        Verdict::Call
                    });
                }
            }
        }
        let exits = ix.exit_kinds.get(&key);
        let has_exit = |k: &str| exits.is_some_and(|v| v.iter().any(|e| e == k));
        if has_exit("return") {
            if self.return_addrs.contains(&b) {
                return Some(Verdict::Return);
            }
            if self.is_landing_pad(b) {
                return Some(Verdict::LandingPad);
            }
            if self.marks.restorers.contains(&b) {
                return Some(Verdict::SignalReturn);
            }
        }
        if has_exit("tailcall") && is_proc_start {
            // A tail call with a known target must go there.
            let tails: Vec<_> = ix
                .calls
                .get(&key)
                .map(|cs| cs.iter().filter(|c| c.tail).collect())
                .unwrap_or_default();
            if tails.is_empty() || tails.iter().any(|c| c.target.map_or(true, |t| t == b)) {
                return Some(Verdict::TailCall);
            }
        }
        let a = block.insns[la.pos];
        if let Some(j) = ix.cfg.procs[la.proc]
            .indirect_jumps
            .iter()
            .find(|j| j.addr == a)
        {
            // A resolved jump's targets are edges (checked above); an
            // unresolved one may go to any block start.
            if !j.resolved && self.is_block_start(b) {
                return Some(Verdict::IndirectUnresolved);
            }
        }
        None
    }

    fn explain_block(&self, la: Loc) -> String {
        let ix = self.ix;
        let p = &ix.cfg.procs[la.proc];
        let blk = ix.block(la);
        let succ: Vec<String> = p
            .blocks
            .iter()
            .enumerate()
            .filter(|(bi, _)| ix.edges.contains(&(la.proc, la.block, *bi)))
            .map(|(_, s)| format!("{:#x}", s.start))
            .collect();
        let exits = ix
            .exit_kinds
            .get(&(la.proc, la.block))
            .cloned()
            .unwrap_or_default();
        format!(
            "block [{:#x},{:#x}) kind {} of {}: successors [{}], exits {:?}",
            blk.start,
            blk.end,
            blk.kind,
            p.name,
            succ.join(", "),
            exits
        )
    }
}

/// Checks one module's trace against its CFG. Returns the statistics and
/// the violations (empty when the CFG explains everything), each a line
/// naming procedure, block and addresses; sorted by address.
pub fn check(ix: &Index, trace: &ModuleTrace, marks: &Landmarks) -> (Stats, Vec<String>) {
    let return_addrs: FastSet<u64> = ix
        .cfg
        .procs
        .iter()
        .flat_map(|p| {
            let starts: super::FastMap<u64, u64> =
                p.blocks.iter().map(|b| (b.id, b.start)).collect();
            p.edges
                .iter()
                .filter(|e| e.kind == "callreturn")
                .filter_map(move |e| e.to.and_then(|t| starts.get(&t).copied()))
                .collect::<Vec<_>>()
        })
        .collect();
    let ck = Checker {
        ix,
        marks,
        return_addrs,
    };
    let mut stats = Stats {
        executed: trace.executed,
        pairs: trace.pairs.len(),
        entries: trace.entries.len(),
        ..Stats::default()
    };
    let mut bad: Vec<(u64, String)> = Vec::new();
    let addrs = trace.executed_addrs();
    stats.addrs = addrs.len();
    for &a in &addrs {
        if !ix.insn.contains_key(&a) {
            bad.push((
                a,
                format!(
                    "executed address {} is not an instruction of the CFG",
                    ix.describe(a)
                ),
            ));
        }
    }
    for &e in &trace.entries {
        if ix.insn.contains_key(&e)
            && !ix.proc_start.contains_key(&e)
            && !ck.return_addrs.contains(&e)
        {
            if ck.is_landing_pad(e) {
                stats.landing_pads += 1;
            } else {
                bad.push((
                    e,
                    format!(
                        "entry into the module from outside at {}: neither a procedure start nor a return address",
                        ix.describe(e)
                    ),
                ));
            }
        }
    }
    for &r in &trace.resumes {
        // The instruction before must be a 2-byte `syscall`: the last of
        // its block (a system call ends its block, docs/cfg.md), with `r`
        // starting the next one.
        let starts_block = ix
            .insn
            .get(&r)
            .is_some_and(|locs| locs.iter().any(|&l| l.pos == 0));
        let follows = starts_block
            && ix
                .insn
                .get(&r.wrapping_sub(2))
                .is_some_and(|locs| locs.iter().any(|&l| l.pos + 1 == ix.block(l).insns.len()));
        if ix.insn.contains_key(&r) && !follows {
            bad.push((
                r,
                format!(
                    "a new thread or process starts at {}, which does not follow a system call ending the block before",
                    ix.describe(r)
                ),
            ));
        }
    }
    for &(a, b) in &trace.pairs {
        if a == b {
            stats.rep_self += 1;
            continue;
        }
        let Some(locs) = ix.insn.get(&a) else {
            continue;
        };
        let verdict = locs.iter().find_map(|&la| ck.explain(la, b));
        match verdict {
            Some(Verdict::InBlock) => stats.in_block += 1,
            Some(Verdict::Edge) => stats.edges += 1,
            Some(Verdict::Call) => stats.calls += 1,
            Some(Verdict::Return) => stats.returns += 1,
            Some(Verdict::TailCall) => stats.tailcalls += 1,
            Some(Verdict::IndirectResolved) => stats.indirect_resolved += 1,
            Some(Verdict::IndirectUnresolved) => stats.indirect_unresolved += 1,
            Some(Verdict::LandingPad) => stats.landing_pads += 1,
            Some(Verdict::SignalReturn) => stats.signal_returns += 1,
            None => bad.push((
                a,
                format!(
                    "transfer {} -> {} is not in the CFG ({})",
                    ix.describe(a),
                    ix.describe(b),
                    ck.explain_block(locs[0])
                ),
            )),
        }
    }
    bad.sort();
    (stats, bad.into_iter().map(|(_, m)| m).collect())
}

/// Panics with the first `limit` violations of each module when any module
/// has some; `label` names the run.
pub fn assert_clean(label: &str, results: &[(String, Stats, Vec<String>)], limit: usize) {
    let mut msg = String::new();
    for (module, stats, bad) in results {
        eprintln!("{label}: {module}: {stats}");
        if !bad.is_empty() {
            msg.push_str(&format!(
                "\n{label}: {module}: {} violations, first {}:",
                bad.len(),
                limit.min(bad.len())
            ));
            for b in bad.iter().take(limit) {
                msg.push_str("\n  ");
                msg.push_str(b);
            }
        }
    }
    assert!(msg.is_empty(), "CFG oracle failed:{msg}");
}
