//! Random CFGs, programs and executions for tests (this crate's and, behind
//! the `testgen` feature, other crates').
//!
//! Two graph shapes:
//! - *spine* graphs ([`spine_proc`]): blocks `0..n` chained by fall-through
//!   edges `i -> i+1 -> ... -> EXIT`, plus random forward, backward (loops,
//!   self loops, often irreducible: a backward edge into the middle of
//!   another loop gives it a second entry) and early-exit edges;
//! - *structured* graphs ([`structured_proc`]): sequences, if/else, while
//!   and do-while loops with break/continue, switches, early returns and
//!   calls; always reducible.
//!
//! Both satisfy the papers' assumptions: every vertex is reachable from the
//! root and reaches EXIT. Call vertices normally have one successor; a
//! tail call's is EXIT; an `exit`-like call's is EXIT. A spine graph may
//! (rarely) make a call vertex a predicate. Every procedure can return
//! without recursion or an `exit` call (calls that could recurse, indirect
//! calls and `exit` calls sit on a branch with a bypass), so executions can
//! always be driven to completion.
//!
//! Generators are deterministic in their seed (SplitMix64); proptest
//! strategies draw seeds and sizes.

use crate::entity::{EntityRef, PrimaryMap, SecondaryMap};
use crate::graph::{BlockId, Graph, GraphBuilder, ProcId, VertexKind};
use crate::program::{Callee, End, Execution, Program};
use proptest::prelude::*;

/// SplitMix64.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (equal seeds give equal sequences).
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 >= 1.0 - p
    }
}

/// A procedure's graph and the callee of each call vertex.
pub type Proc = (Graph, SecondaryMap<BlockId, Option<Callee>>);

/// Picks a callee for procedure `me` of `nprocs`; `risky` allows callees
/// that may not return (recursion, indirect, exit).
fn pick_callee(rng: &mut Rng, me: usize, nprocs: usize, risky: bool) -> Callee {
    let safe_direct = me + 1 < nprocs;
    loop {
        let c = match rng.below(10) {
            0..=3 if safe_direct => {
                Callee::Direct(ProcId::new(me + 1 + rng.below(nprocs - me - 1)))
            }
            4..=5 => Callee::External,
            6..=7 if risky => Callee::Direct(ProcId::new(rng.below(me + 1))),
            8 if risky && nprocs > 1 => Callee::Indirect,
            9 if risky && rng.chance(0.3) => Callee::Exit,
            _ => continue,
        };
        return c;
    }
}

fn is_risky(c: Option<Callee>, me: usize) -> bool {
    match c {
        Some(Callee::Direct(q)) => q.index() <= me,
        Some(Callee::Indirect) | Some(Callee::Exit) => true,
        _ => false,
    }
}

/// How far a random jump of a spine graph reaches.
const WINDOW: usize = 48;

/// A spine graph with `n >= 1` blocks for procedure `me` of `nprocs`.
pub fn spine_proc(rng: &mut Rng, n: usize, me: usize, nprocs: usize, call_rate: f64) -> Proc {
    let n = n.max(1);
    let mut callee: Vec<Option<Callee>> = vec![None; n];
    for b in 0..n {
        if rng.chance(call_rate) {
            let risky_ok = b >= 1 && !is_risky(callee[b - 1], me);
            callee[b] = Some(pick_callee(rng, me, nprocs, risky_ok));
        }
    }
    let mut gb = GraphBuilder::new();
    let blocks: Vec<BlockId> = (0..n)
        .map(|b| {
            gb.add_vertex(if callee[b].is_some() {
                VertexKind::Call
            } else {
                VertexKind::Plain
            })
        })
        .collect();
    let exit = gb.add_vertex(VertexKind::Exit);
    let at = |i: usize| if i < n { blocks[i] } else { exit };
    for (b, &c) in callee.iter().enumerate() {
        if c == Some(Callee::Exit) {
            gb.add_edge(at(b), exit);
        } else {
            gb.add_edge(at(b), at(b + 1));
        }
        if is_risky(c, me) {
            gb.add_edge(at(b - 1), at(b + 1));
        }
        let extras = if c.is_none() {
            [0, 0, 1, 1, 2][rng.below(5)]
        } else if c != Some(Callee::Exit) && rng.chance(0.05) {
            1
        } else {
            0
        };
        for _ in 0..extras {
            let r = rng.below(100);
            // Jumps stay within a window, as in compiled code (loops and
            // branches are local); overlapping windows still give irreducible
            // multiple-entry loops.
            let t = if r < 45 {
                b + 1 + rng.below((n - b).min(WINDOW))
            } else if r < 85 {
                b - rng.below((b + 1).min(WINDOW))
            } else {
                n
            };
            gb.add_edge(at(b), at(t));
        }
    }
    let g = gb.finish(blocks[0], exit);
    let mut cm = SecondaryMap::filled(g.num_vertices(), None);
    for b in 0..n {
        cm[blocks[b]] = callee[b];
    }
    (g, cm)
}

/// Structured (reducible) graph builder state.
struct Structured<'r> {
    rng: &'r mut Rng,
    gb: GraphBuilder,
    exit: BlockId,
    budget: usize,
    callee: Vec<(BlockId, Callee)>,
    me: usize,
    nprocs: usize,
    call_rate: f64,
}

impl Structured<'_> {
    fn block(&mut self) -> BlockId {
        self.budget = self.budget.saturating_sub(1);
        self.gb.add_vertex(VertexKind::Plain)
    }
    fn call(&mut self, c: Callee) -> BlockId {
        self.budget = self.budget.saturating_sub(1);
        let v = self.gb.add_vertex(VertexKind::Call);
        self.callee.push((v, c));
        v
    }
    /// Emits statements after the open block `cur`; returns the new open block.
    fn seq(&mut self, mut cur: BlockId, depth: u32, lp: Option<(BlockId, BlockId)>) -> BlockId {
        while self.budget > 0 && !self.rng.chance(0.15) {
            let nest = depth < 6;
            let k = if self.rng.chance(self.call_rate) {
                25
            } else {
                self.rng.below(100)
            };
            cur = match k {
                0..=24 => {
                    let nb = self.block();
                    self.gb.add_edge(cur, nb);
                    nb
                }
                25..=36 => {
                    // A call; a risky one only on a bypassable branch.
                    let risky = self.rng.chance(0.3);
                    let c = pick_callee(self.rng, self.me, self.nprocs, risky);
                    let cv = self.call(c);
                    let j = self.block();
                    self.gb.add_edge(cur, cv);
                    if risky {
                        self.gb.add_edge(cur, j);
                    }
                    if c == Callee::Exit {
                        self.gb.add_edge(cv, self.exit);
                    } else {
                        self.gb.add_edge(cv, j);
                    }
                    j
                }
                37..=54 if nest => {
                    let (t, e) = (self.block(), self.block());
                    self.gb.add_edge(cur, t);
                    self.gb.add_edge(cur, e);
                    let t2 = self.seq(t, depth + 1, lp);
                    let e2 = self.seq(e, depth + 1, lp);
                    let j = self.block();
                    self.gb.add_edge(t2, j);
                    self.gb.add_edge(e2, j);
                    j
                }
                55..=66 if nest => {
                    let h = self.block();
                    let x = self.block();
                    self.gb.add_edge(cur, h);
                    if self.rng.chance(0.15) {
                        self.gb.add_edge(h, h);
                    } else {
                        let body = self.block();
                        self.gb.add_edge(h, body);
                        let b2 = self.seq(body, depth + 1, Some((h, x)));
                        self.gb.add_edge(b2, h);
                    }
                    self.gb.add_edge(h, x);
                    x
                }
                67..=74 if nest => {
                    let b = self.block();
                    let x = self.block();
                    self.gb.add_edge(cur, b);
                    let b2 = self.seq(b, depth + 1, Some((b, x)));
                    self.gb.add_edge(b2, b);
                    self.gb.add_edge(b2, x);
                    x
                }
                75..=80 if lp.is_some() => {
                    let (h, x) = lp.expect("in a loop");
                    let nb = self.block();
                    self.gb
                        .add_edge(cur, if self.rng.chance(0.6) { x } else { h });
                    self.gb.add_edge(cur, nb);
                    nb
                }
                81..=85 => {
                    let nb = self.block();
                    self.gb.add_edge(cur, self.exit);
                    self.gb.add_edge(cur, nb);
                    nb
                }
                86..=92 if nest => {
                    let j_cases = 3 + self.rng.below(6);
                    let mut ends = Vec::new();
                    for _ in 0..j_cases {
                        let c = self.block();
                        self.gb.add_edge(cur, c);
                        ends.push(self.seq(c, depth + 1, lp));
                    }
                    let j = self.block();
                    for e in ends {
                        self.gb.add_edge(e, j);
                    }
                    j
                }
                _ => cur,
            };
        }
        cur
    }
}

/// A structured (reducible) graph of about `n` blocks.
pub fn structured_proc(rng: &mut Rng, n: usize, me: usize, nprocs: usize, call_rate: f64) -> Proc {
    let mut gb = GraphBuilder::new();
    let entry = gb.add_vertex(VertexKind::Plain);
    let exit = gb.add_vertex(VertexKind::Exit);
    let mut s = Structured {
        rng,
        gb,
        exit,
        budget: n.saturating_sub(1),
        callee: Vec::new(),
        me,
        nprocs,
        call_rate,
    };
    let mut cur = entry;
    // Keep going until the budget is spent (seq may stop early by chance).
    while s.budget > 0 {
        cur = s.seq(cur, 0, None);
    }
    s.gb.add_edge(cur, exit);
    let callee = std::mem::take(&mut s.callee);
    let g = s.gb.finish(entry, exit);
    let mut cm = SecondaryMap::filled(g.num_vertices(), None);
    for (v, c) in callee {
        cm[v] = Some(c);
    }
    (g, cm)
}

/// A random program of `nprocs` procedures of up to `max_blocks` blocks.
pub fn random_program(
    rng: &mut Rng,
    nprocs: usize,
    max_blocks: usize,
    structured: bool,
) -> Program {
    let nprocs = nprocs.max(1);
    let mut procs = PrimaryMap::new();
    let mut callees = PrimaryMap::new();
    for me in 0..nprocs {
        let n = 1 + rng.below(max_blocks.max(1));
        let (g, c) = if structured {
            structured_proc(rng, n, me, nprocs, 0.1)
        } else {
            spine_proc(rng, n, me, nprocs, 0.1)
        };
        procs.push(g);
        callees.push(c);
    }
    Program {
        procs,
        callees,
        main: ProcId::new(0),
    }
}

const INF: u64 = u64::MAX / 4;

/// For every vertex, the length of the shortest way to its procedure's
/// EXIT that returns (calls included, `exit` calls excluded).
fn drain_distances(prog: &Program) -> PrimaryMap<ProcId, Vec<u64>> {
    let mut dist: PrimaryMap<ProcId, Vec<u64>> = prog
        .procs
        .values()
        .map(|g| {
            let mut d = vec![INF; g.num_vertices()];
            d[g.exit().index()] = 0;
            d
        })
        .collect();
    let mut changed = true;
    while changed {
        changed = false;
        for (p, g) in prog.procs.iter() {
            for v in g.vertices().rev() {
                if v == g.exit() {
                    continue;
                }
                let best_succ = g
                    .succs(v)
                    .iter()
                    .map(|&e| dist[p][g.edge(e).to.index()])
                    .min()
                    .unwrap_or(INF);
                let call = match prog.callees[p][v] {
                    None | Some(Callee::External) => 0,
                    Some(Callee::Direct(q)) => dist[q][prog.procs[q].entry().index()],
                    Some(Callee::Indirect) => prog
                        .procs
                        .iter()
                        .map(|(q, gq)| dist[q][gq.entry().index()])
                        .min()
                        .unwrap_or(INF),
                    Some(Callee::Exit) => INF,
                };
                let d = (1 + call + best_succ).min(INF);
                if d < dist[p][v.index()] {
                    dist[p][v.index()] = d;
                    changed = true;
                }
            }
        }
    }
    dist
}

/// A random execution of `prog`: a random walk of about `budget` steps,
/// then (unless `cut`) driven to completion along shortest returning
/// paths. May end early by calling an `exit`-like procedure.
pub fn random_execution(rng: &mut Rng, prog: &Program, budget: usize, cut: bool) -> Execution {
    Executor::new(prog).run(rng, budget, cut)
}

/// Runs many random executions of one program (the distances that drive
/// executions to completion are computed once).
pub struct Executor<'p> {
    prog: &'p Program,
    dist: PrimaryMap<ProcId, Vec<u64>>,
}

impl<'p> Executor<'p> {
    /// An executor for `prog`, with its distances to EXIT computed.
    pub fn new(prog: &'p Program) -> Self {
        Executor {
            prog,
            dist: drain_distances(prog),
        }
    }

    /// See [`random_execution`].
    pub fn run(&self, rng: &mut Rng, budget: usize, cut: bool) -> Execution {
        let (prog, dist) = (self.prog, &self.dist);
        let main = prog.main;
        let mut steps = vec![(main, prog.procs[main].entry())];
        let mut stack = vec![(main, prog.procs[main].entry())];
        let mut draining = false;
        let choose = |rng: &mut Rng, p: ProcId, v: BlockId, draining: bool| -> Option<BlockId> {
            let g = &prog.procs[p];
            let s = g.succs(v);
            if s.is_empty() {
                return None;
            }
            Some(if draining {
                let e = *s
                    .iter()
                    .min_by_key(|&&e| dist[p][g.edge(e).to.index()])
                    .expect("nonempty");
                g.edge(e).to
            } else {
                g.edge(s[rng.below(s.len())]).to
            })
        };
        loop {
            if steps.len() >= budget && !draining {
                if cut {
                    return Execution {
                        steps,
                        end: End::Cut,
                    };
                }
                draining = true;
            }
            let (p, v) = *stack.last().expect("frame");
            let g = &prog.procs[p];
            let next: (ProcId, BlockId);
            if v == g.exit() {
                stack.pop();
                let Some(&(cp, cv)) = stack.last() else {
                    return Execution {
                        steps,
                        end: End::Returned,
                    };
                };
                let w = choose(rng, cp, cv, draining)
                    .expect("a call vertex that returns has a successor");
                stack.last_mut().expect("frame").1 = w;
                next = (cp, w);
            } else {
                let callee = match prog.callees[p][v] {
                    Some(Callee::Direct(q)) => Some(q),
                    Some(Callee::Indirect) => Some(if draining {
                        prog.procs
                            .iter()
                            .min_by_key(|(q, gq)| dist[*q][gq.entry().index()])
                            .expect("a procedure")
                            .0
                    } else {
                        ProcId::new(rng.below(prog.procs.len()))
                    }),
                    Some(Callee::Exit) => {
                        return Execution {
                            steps,
                            end: End::Terminated,
                        }
                    }
                    Some(Callee::External) | None => None,
                };
                match callee {
                    Some(q) => {
                        let w = prog.procs[q].entry();
                        stack.push((q, w));
                        next = (q, w);
                    }
                    None => {
                        let Some(w) = choose(rng, p, v, draining) else {
                            // Unreachable in generated programs: every block has a successor.
                            return Execution {
                                steps,
                                end: End::Cut,
                            };
                        };
                        stack.last_mut().expect("frame").1 = w;
                        next = (p, w);
                    }
                }
            }
            steps.push(next);
        }
    }
}

/// Strategy: a random graph (spine or structured) with `n` blocks drawn from `sizes`.
pub fn arb_graph(sizes: std::ops::Range<usize>) -> impl Strategy<Value = Graph> {
    (sizes, any::<u64>(), any::<bool>()).prop_map(|(n, seed, structured)| {
        let mut rng = Rng::new(seed);
        let (g, _) = if structured {
            structured_proc(&mut rng, n, 0, 3, 0.1)
        } else {
            spine_proc(&mut rng, n, 0, 3, 0.1)
        };
        g
    })
}

/// Strategy: a random program and a seed for its executions.
pub fn arb_program(
    procs: std::ops::Range<usize>,
    max_blocks: usize,
) -> impl Strategy<Value = (Program, u64)> {
    (procs, 1..=max_blocks, any::<u64>(), any::<bool>()).prop_map(|(np, mb, seed, structured)| {
        let mut rng = Rng::new(seed);
        (random_program(&mut rng, np, mb, structured), rng.next_u64())
    })
}
