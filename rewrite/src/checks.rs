//! Where the copies check the witness buffer (docs/runtime.md section 4,
//! docs/rewrite.md step 5): the blocks whose entry gets a buffer check.
//!
//! A check (`POS >= LIMIT` calls `flush`) is needed often enough that no
//! execution writes more than [`MAX_BYTES_BETWEEN_CHECKS`] bytes between two
//! of them: the procedure's entry is checked, every call's return point is
//! checked (`codegen`), and every cycle of the CFG must pass a checked block.
//! The targets of backward edges in address order are such a set (every
//! cycle has a backward edge), but often a redundant one: gzip's
//! `longest_match` inner loop has two of them on its hot cycle, and a loop
//! around a call is already cut by the call's return-point check. We keep a
//! smaller feedback vertex set: starting from the backward-edge targets, we
//! drop each one, hottest first (the heuristic block frequencies of paper
//! 003 section 5.1), whose cycles all pass another kept check or a call.
//! The witnesses written are the same; only where `flush` may be called
//! changes, so the trace is the same byte for byte.
//!
//! The entry check bounds chains of calls (recursion writes before each
//! call and checks only after it returns). A procedure whose direct calls
//! and tail calls reach only traced procedures that call no traced
//! procedure directly (other calls go to imports, or through springboards
//! whose outside-entry stubs check) ends every chain after at most two
//! procedures: it skips its entry check when at most [`LEAF_BYTES`] can be
//! written from its entry to its first check. PLT stubs (a bare GOT jump,
//! or a GOT compare and one witness; LAZY or a witness on the lazy-binding
//! path, which tail-jumps to `<plt0>`) are the hot case: their entry check
//! also saved the flags, live across the stub.
//!
//! A call to a *bounded* traced procedure (no cycle, no landing pad, every
//! reachable call a tail call to a callback-free import or to `<plt0>`,
//! at most [`LEAF_BYTES`]` / 2` witness bytes on all its edges: a PLT
//! stub of `memcmp` or `__errno_location`) needs no return-point check:
//! the caller's segment runs on through it, [`LEAF_BYTES`] counted for the
//! callee and `<plt0>` after it.
//!
//! Invariants (checked with `debug_assert!` and by [`longest_unchecked`]):
//! - every cycle of the CFG passes the entry of a checked block or the
//!   return point of a call block (the graph left by cutting there is a DAG);
//! - the chosen set is used only if its bound on the bytes written between
//!   two checks, plus two callees' unchecked entry segments ([`LEAF_BYTES`]),
//!   stays within [`MAX_BYTES_BETWEEN_CHECKS`]; otherwise the entry and all
//!   the backward-edge targets are checked (every cycle passes one), as
//!   before this reduction, and where an acyclic path would still write
//!   more (hundreds of branches in a row without a call), checks are added
//!   at the blocks where it would: the bound holds for every procedure
//!   the rewriter copies, and so a flush's headroom is never overrun.

use aetrace_graph::weights::heuristic;
use aetrace_graph::{BlockId, EntityRef};
use aetrace_runtime::layout::MAX_BYTES_BETWEEN_CHECKS;
use iced_x86::{FlowControl, Instruction};

use aetrace_analysis::cfg::{Cfg, EdgeKind};

/// Bytes allowed per witnessed edge: a WIDE witness (4) at most.
const EDGE_BYTES: u64 = 4;
/// Bytes allowed per block that may write records (calls, system calls,
/// indirect jumps, returns, landing pads): more than any two records
/// written in one block need (SETJMP/LONGJMP or INDIRECT 10, EXIT 6,
/// RETURN 2, LANDING 6, a PLT stub's LAZY 6).
const RECORD_BYTES: u64 = 32;
/// Allowance for the records that may start a segment (RETURN; ENTER and,
/// with `record --data`, the stub's VALUE of `rsp` after it: 6 + 10).
const START_BYTES: u64 = 16;
/// The most a procedure without an entry check may write before its first
/// check: its callers' segments run on into it.
pub const LEAF_BYTES: u64 = 64;
/// The most one procedure's path from a check may write: the rest of
/// [`MAX_BYTES_BETWEEN_CHECKS`] is its starting record and two callees'
/// unchecked entries.
const SEGMENT_BYTES: u64 = MAX_BYTES_BETWEEN_CHECKS - START_BYTES - 2 * LEAF_BYTES;

/// Per block: does its entry get a buffer check? `insns` are the decoded
/// blocks, `witness` the witness number per edge, `landing_pads` the blocks
/// the unwinder enters; `chain_end`: the procedure calls no traced
/// procedure that calls a traced procedure directly, and is not the process
/// entry, so its entry check may be left out.
/// `extra`: the bytes each block also writes (`record --data`: the VALUE
/// records a path through the block writes between two checks; empty
/// without data).
pub fn check_blocks(
    cfg: &Cfg,
    insns: &[Vec<Instruction>],
    witness: &[Option<u32>],
    landing_pads: &[BlockId],
    chain_end: bool,
    unchecked_return: &[bool],
    extra: &[u64],
) -> Vec<bool> {
    let n = cfg.blocks.len();
    let entry = cfg.entry.index();
    let mut all = vec![false; n];
    all[entry] = true;
    for e in cfg.edges.values() {
        if e.to != cfg.exit() && cfg.blocks[e.to].start <= cfg.blocks[e.from].start {
            all[e.to.index()] = true;
        }
    }
    // Calls that return cut every cycle through them: their return point
    // is checked.
    let mut calls = vec![false; n];
    for e in cfg.edges.values() {
        if e.kind == EdgeKind::CallReturn
            && returns_through_check(insns, e.from)
            && !unchecked_return.get(e.from.index()).is_some_and(|&u| u)
        {
            calls[e.from.index()] = true;
        }
    }
    let succs = successors(cfg);
    let g = cfg.to_graph();
    let w = heuristic(&g);
    let mut freq = vec![0.0f64; n];
    for (e, ed) in cfg.edges.iter() {
        if ed.to != cfg.exit() {
            freq[ed.to.index()] += w[e];
        }
    }
    let mut keep = all.clone();
    keep[entry] = !chain_end;
    let mut order: Vec<usize> = (0..n).filter(|&b| keep[b] && b != entry).collect();
    // Hottest first; among equals the later block (usually the inner loop).
    order.sort_by(|&a, &b| freq[b].total_cmp(&freq[a]).then(b.cmp(&a)));
    if chain_end && all[entry] {
        // A loop back to the entry: try without its check last.
        order.push(entry);
        keep[entry] = true;
    }
    for &t in &order {
        keep[t] = false;
        if !calls[t] && on_cycle(&succs, t, |v| keep[v] || calls[v]) {
            keep[t] = true;
        }
    }
    let mut cost = block_costs(cfg, insns, landing_pads);
    for (c, &x) in cost.iter_mut().zip(extra) {
        *c += x;
    }
    for (c, &u) in cost.iter_mut().zip(unchecked_return) {
        if u {
            *c += LEAF_BYTES;
        }
    }
    let dist = longest_unchecked(&succs, witness, &cost, &mut keep, &calls, None);
    debug_assert!(dist.is_some(), "the kept checks cut every cycle");
    match dist {
        Some(d)
            if (keep[entry] || d[entry] <= LEAF_BYTES)
                && d.iter().max().map_or(0, |&m| m) <= SEGMENT_BYTES =>
        {
            keep
        }
        _ => {
            let mut all = all;
            let cut = longest_unchecked(
                &succs,
                witness,
                &cost,
                &mut all,
                &calls,
                Some(SEGMENT_BYTES),
            );
            debug_assert!(
                longest_unchecked(&succs, witness, &cost, &mut all.clone(), &calls, None)
                    .is_some_and(|d| d.iter().all(|&b| b <= SEGMENT_BYTES)),
                "the added checks bound every path"
            );
            debug_assert!(cut.is_some(), "the entry and loop headers cut every cycle");
            all
        }
    }
}

/// Does a call site reachable from the entry call or tail-call an address
/// `to` accepts? (`<plt0>`'s padding, modelled as falling into the next
/// PLT stub, is unreachable.)
pub fn reaches_call(cfg: &Cfg, to: impl Fn(u64) -> bool) -> bool {
    let seen = reachable(cfg);
    cfg.calls
        .iter()
        .any(|c| seen[c.block.index()] && c.target.is_some_and(&to))
}

/// Per block: is it reachable from the entry?
fn reachable(cfg: &Cfg) -> Vec<bool> {
    let succs = successors(cfg);
    let mut seen = vec![false; cfg.blocks.len()];
    let mut stack = vec![cfg.entry.index()];
    seen[cfg.entry.index()] = true;
    while let Some(v) = stack.pop() {
        for &(s, _) in &succs[v] {
            if !seen[s] {
                seen[s] = true;
                stack.push(s);
            }
        }
    }
    seen
}

/// Is the procedure *bounded* (module comment)? `tail_ok` says whether a
/// reachable call site is a tail call to a callback-free import or to
/// `<plt0>`.
pub fn bounded(
    cfg: &Cfg,
    has_landing_pads: bool,
    tail_ok: impl Fn(&aetrace_analysis::cfg::CallSite) -> bool,
) -> bool {
    let acyclic = cfg
        .edges
        .values()
        .all(|e| e.to == cfg.exit() || cfg.blocks[e.to].start > cfg.blocks[e.from].start);
    let seen = reachable(cfg);
    acyclic
        && !has_landing_pads
        && cfg.indirect_jumps.is_empty()
        && cfg
            .calls
            .iter()
            .all(|c| !seen[c.block.index()] || (c.tail && tail_ok(c)))
        && EDGE_BYTES * cfg.edges.len() as u64 <= LEAF_BYTES / 2
}

/// Does the call ending block `b` return through the return-point check?
/// `codegen` checks after every `call` with a return edge; a `syscall`
/// (also a call vertex) is followed by no check.
fn returns_through_check(insns: &[Vec<Instruction>], b: BlockId) -> bool {
    insns
        .get(b.index())
        .and_then(|i| i.last())
        .is_some_and(|i| {
            matches!(
                i.flow_control(),
                FlowControl::Call | FlowControl::IndirectCall
            )
        })
}

/// Successor blocks of each block, EXIT left out.
fn successors(cfg: &Cfg) -> Vec<Vec<(usize, usize)>> {
    let mut s = vec![Vec::new(); cfg.blocks.len()];
    for (e, ed) in cfg.edges.iter() {
        if ed.to != cfg.exit() {
            s[ed.from.index()].push((ed.to.index(), e.index()));
        }
    }
    s
}

/// Is `t` on a cycle that avoids every `blocked` block (`t` itself aside)?
fn on_cycle(succs: &[Vec<(usize, usize)>], t: usize, blocked: impl Fn(usize) -> bool) -> bool {
    let mut seen = vec![false; succs.len()];
    let mut stack = vec![t];
    while let Some(v) = stack.pop() {
        for &(s, _) in &succs[v] {
            if s == t {
                return true;
            }
            if !seen[s] && !blocked(s) {
                seen[s] = true;
                stack.push(s);
            }
        }
    }
    false
}

/// Record bytes each block may write besides its witnesses.
fn block_costs(cfg: &Cfg, insns: &[Vec<Instruction>], landing_pads: &[BlockId]) -> Vec<u64> {
    let mut cost: Vec<u64> = (0..cfg.blocks.len())
        .map(|b| {
            match insns
                .get(b)
                .and_then(|i| i.last())
                .map(|i| i.flow_control())
            {
                Some(
                    FlowControl::Next
                    | FlowControl::ConditionalBranch
                    | FlowControl::UnconditionalBranch,
                ) => 0,
                _ => RECORD_BYTES,
            }
        })
        .collect();
    for &p in landing_pads {
        if let Some(c) = cost.get_mut(p.index()) {
            *c += RECORD_BYTES;
        }
    }
    cost
}

/// Per block: the most bytes a path can write from its entry up to the next
/// check (the entry of a `checked` block, the return point of one of the
/// `calls`, or leaving the procedure), or `None` if some cycle passes no
/// check. With `cut_above`, a successor through which a path from a
/// block's entry would write more than that many bytes gets a check
/// (added to `checked`), so every block's result stays within it (a block
/// and one edge write far less: [`RECORD_BYTES`] and [`LEAF_BYTES`]).
fn longest_unchecked(
    succs: &[Vec<(usize, usize)>],
    witness: &[Option<u32>],
    cost: &[u64],
    checked: &mut [bool],
    calls: &[bool],
    cut_above: Option<u64>,
) -> Option<Vec<u64>> {
    const NEW: u8 = 0;
    const OPEN: u8 = 1;
    const DONE: u8 = 2;
    let n = succs.len();
    let mut state = vec![NEW; n];
    let mut dist = vec![0u64; n];
    let edge = |e: usize| witness.get(e).copied().flatten().map_or(0, |_| EDGE_BYTES);
    // Iterative DFS; `dist` is final when a block is closed.
    for root in 0..n {
        if state[root] != NEW {
            continue;
        }
        let mut stack = vec![(root, 0usize)];
        state[root] = OPEN;
        while let Some(&mut (v, ref mut i)) = stack.last_mut() {
            if let Some(&(s, _)) = succs[v].get(*i) {
                *i += 1;
                // Bytes after a check or a call's return belong to the
                // next segment.
                if checked[s] || calls[v] {
                    continue;
                }
                match state[s] {
                    NEW => {
                        state[s] = OPEN;
                        stack.push((s, 0));
                    }
                    OPEN => return None,
                    _ => {}
                }
            } else {
                let mut best = 0;
                for &(s, e) in &succs[v] {
                    let mut after = if checked[s] || calls[v] { 0 } else { dist[s] };
                    // `s` is done: its own segment stays as computed, and a
                    // block that went through it before only overestimates.
                    if cut_above.is_some_and(|b| cost[v] + edge(e) + after > b) {
                        checked[s] = true;
                        after = 0;
                    }
                    best = best.max(edge(e) + after);
                }
                dist[v] = cost[v] + best;
                state[v] = DONE;
                stack.pop();
            }
        }
    }
    Some(dist)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aetrace_analysis::cfg::{Block, BlockKind, CfgEdge};
    use aetrace_graph::{EdgeId, PrimaryMap};
    use iced_x86::Code;
    use proptest::prelude::*;

    /// A CFG of `n` blocks 16 bytes apart: block `i` falls through to
    /// `i + 1` (the last one returns), `jumps[i]` adds a conditional branch
    /// to that block (any direction: irreducible graphs too), `call[i]`
    /// makes it a call block whose return edge is the fall-through.
    fn cfg(n: usize, jumps: &[Option<usize>], call: &[bool]) -> (Cfg, Vec<Vec<Instruction>>) {
        let mut blocks = PrimaryMap::new();
        let mut edges = PrimaryMap::new();
        let mut calls = Vec::new();
        let mut insns = Vec::new();
        let exit = BlockId::new(n);
        let at = |i: usize| 0x1000 + 16 * i as u64;
        for i in 0..n {
            let is_call = call[i] && i + 1 < n;
            blocks.push(Block {
                start: at(i),
                end: at(i + 1),
                insns: vec![0],
                kind: if is_call {
                    BlockKind::Call
                } else {
                    BlockKind::Plain
                },
            });
            let (b, next) = (BlockId::new(i), BlockId::new(i + 1));
            let insn = if is_call {
                calls.push(aetrace_analysis::cfg::CallSite {
                    block: b,
                    kind: aetrace_analysis::cfg::CallKind::Plt,
                    target: Some(0x9000),
                    name: Some("f".into()),
                    returns: true,
                    tail: false,
                });
                edges.push(CfgEdge {
                    from: b,
                    to: next,
                    kind: EdgeKind::CallReturn,
                });
                Instruction::with_branch(Code::Call_rel32_64, 0x9000).unwrap()
            } else if let Some(t) = jumps[i].filter(|&t| t != i + 1) {
                edges.push(CfgEdge {
                    from: b,
                    to: BlockId::new(t),
                    kind: EdgeKind::Taken,
                });
                let to = if i + 1 < n { next } else { exit };
                let kind = if i + 1 < n {
                    EdgeKind::FallThrough
                } else {
                    EdgeKind::Return
                };
                edges.push(CfgEdge { from: b, to, kind });
                Instruction::with_branch(Code::Jne_rel32_64, at(t)).unwrap()
            } else if i + 1 < n {
                edges.push(CfgEdge {
                    from: b,
                    to: next,
                    kind: EdgeKind::FallThrough,
                });
                Instruction::with(Code::Nopd)
            } else {
                edges.push(CfgEdge {
                    from: b,
                    to: exit,
                    kind: EdgeKind::Return,
                });
                Instruction::with(Code::Retnq)
            };
            insns.push(vec![insn]);
        }
        let cfg = Cfg {
            blocks,
            entry: BlockId::new(0),
            edges,
            calls,
            indirect_jumps: Vec::new(),
        };
        (cfg, insns)
    }

    /// Naive reference: is the graph left after removing the checked
    /// blocks' incoming edges and the calls' return edges acyclic (Kahn)?
    fn every_cycle_checked(cfg: &Cfg, checked: &[bool]) -> bool {
        let n = cfg.blocks.len();
        let kept: Vec<&CfgEdge> = cfg
            .edges
            .values()
            .filter(|e| e.to != cfg.exit() && !checked[e.to.index()])
            .filter(|e| e.kind != EdgeKind::CallReturn)
            .collect();
        let mut indeg = vec![0; n];
        for e in &kept {
            indeg[e.to.index()] += 1;
        }
        let mut ready: Vec<usize> = (0..n).filter(|&v| indeg[v] == 0).collect();
        let mut done = 0;
        while let Some(v) = ready.pop() {
            done += 1;
            for e in kept.iter().filter(|e| e.from.index() == v) {
                indeg[e.to.index()] -= 1;
                if indeg[e.to.index()] == 0 {
                    ready.push(e.to.index());
                }
            }
        }
        done == n
    }

    fn arb() -> impl Strategy<Value = (usize, Vec<Option<usize>>, Vec<bool>, bool)> {
        (2usize..24).prop_flat_map(|n| {
            (
                Just(n),
                proptest::collection::vec(proptest::option::weighted(0.5, 0..n), n),
                proptest::collection::vec(proptest::bool::weighted(0.15), n),
                any::<bool>(),
            )
        })
    }

    proptest! {
        #[test]
        fn kept_checks_cut_every_cycle((n, jumps, call, chain_end) in arb()) {
            let (cfg, insns) = cfg(n, &jumps, &call);
            prop_assert!(cfg.check().is_ok());
            let witness: Vec<Option<u32>> = cfg.edges.keys().map(|e: EdgeId| Some(e.index() as u32)).collect();
            let checked = check_blocks(&cfg, &insns, &witness, &[], chain_end, &[], &[]);
            prop_assert!(every_cycle_checked(&cfg, &checked));
            // Only the entry and targets of backward edges are candidates.
            for (b, &c) in checked.iter().enumerate() {
                let back = cfg.edges.values().any(|e| e.to.index() == b && e.to != cfg.exit()
                    && cfg.blocks[e.to].start <= cfg.blocks[e.from].start);
                prop_assert!(!c || b == 0 || back, "block {b} checked but no loop header");
            }
            prop_assert!(chain_end || checked[0], "the entry is checked unless it ends every chain");
        }
    }

    /// Naive reference for the bound: the longest bytes from each block's
    /// entry to the next check, by relaxing every edge `n` times (the graph
    /// left by the checks is a DAG).
    fn naive_longest(cfg: &Cfg, insns: &[Vec<Instruction>], checked: &[bool]) -> Vec<u64> {
        let cost = block_costs(cfg, insns, &[]);
        let mut d = cost.clone();
        for _ in 0..=cfg.blocks.len() {
            for e in cfg.edges.values().filter(|e| e.to != cfg.exit()) {
                let (v, s) = (e.from.index(), e.to.index());
                let after = if checked[s] || e.kind == EdgeKind::CallReturn {
                    0
                } else {
                    d[s]
                };
                d[v] = d[v].max(cost[v] + EDGE_BYTES + after);
            }
        }
        d
    }

    /// Long, mostly forward graphs: short forward branches, a few
    /// backward ones (irreducible too), rare calls.
    fn arb_long() -> impl Strategy<Value = (usize, Vec<Option<usize>>, Vec<bool>)> {
        (150usize..400).prop_flat_map(|n| {
            (
                Just(n),
                proptest::collection::vec(proptest::option::weighted(0.6, 2usize..8), n),
                proptest::collection::vec(proptest::option::weighted(0.02, 0..n), n),
                proptest::collection::vec(proptest::bool::weighted(0.01), n),
            )
                .prop_map(|(n, fwd, back, call)| {
                    let jumps = (0..n)
                        .map(|i| back[i].or(fwd[i].map(|o| i + o)).filter(|&t| t < n))
                        .collect();
                    (n, jumps, call)
                })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Hundreds of branches in a row: the reduced set cannot be used,
        /// and the fallback must still bound every path (before, it had no
        /// bound: a 4 KiB headroom could be overrun).
        #[test]
        fn every_path_between_checks_is_bounded((n, jumps, call) in arb_long()) {
            let (cfg, insns) = cfg(n, &jumps, &call);
            let witness: Vec<Option<u32>> = cfg.edges.keys().map(|e: EdgeId| Some(e.index() as u32)).collect();
            let checked = check_blocks(&cfg, &insns, &witness, &[], false, &[], &[]);
            prop_assert!(every_cycle_checked(&cfg, &checked));
            let worst = naive_longest(&cfg, &insns, &checked).into_iter().max().unwrap_or(0);
            prop_assert!(worst <= SEGMENT_BYTES, "{worst} bytes between two checks");
        }
    }

    /// A chain of 400 diamonds, one witness each, no loop: checks are added
    /// inside it, not only at the entry.
    #[test]
    fn a_long_chain_of_branches_gets_checks_inside() {
        let n = 800;
        let jumps: Vec<Option<usize>> = (0..n)
            .map(|i| (i % 2 == 0 && i + 2 < n).then_some(i + 2))
            .collect();
        let (cfg, insns) = cfg(n, &jumps, &vec![false; n]);
        let witness: Vec<Option<u32>> = cfg
            .edges
            .keys()
            .map(|e: EdgeId| Some(e.index() as u32))
            .collect();
        let checked = check_blocks(&cfg, &insns, &witness, &[], false, &[], &[]);
        let worst = naive_longest(&cfg, &insns, &checked)
            .into_iter()
            .max()
            .unwrap_or(0);
        assert!(worst <= SEGMENT_BYTES, "{worst}");
        assert!(checked.iter().filter(|&&c| c).count() > 1, "{checked:?}");
    }

    /// gzip's `longest_match` shape: one hot cycle through two backward-
    /// edge targets needs one check, at the colder of the two.
    #[test]
    fn one_check_on_a_cycle_through_two_headers() {
        // 0 -> 1; 1: jne 3 (inner) ; 2: jne 1 (back) ; 3: jne 2 (back, outer) ; 4 ret
        let jumps = [None, Some(3), Some(1), Some(2), None];
        let (cfg, insns) = cfg(5, &jumps, &[false; 5]);
        let witness = vec![None; cfg.edges.len()];
        let checked = check_blocks(&cfg, &insns, &witness, &[], false, &[], &[]);
        assert!(every_cycle_checked(&cfg, &checked));
        assert_eq!(
            checked.iter().filter(|&&c| c).count(),
            2,
            "{checked:?}: entry and one header"
        );
    }
}
