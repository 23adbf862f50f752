//! Count recovery on small counted graphs: paper 003 Figure 4 and its
//! extensions (landing pads, `setjmp`), damaged profiles, and random
//! procedures whose counters the rewriter places ([`aetrace_rewrite::counters`]).

use std::collections::BTreeMap;

use super::*;
use aetrace_rewrite::counters::{self, CountSpec};

/// Paper 003 Figure 4 in miniature: block 0 calls a procedure that may
/// exit, block 1 returns. Counted graph: e0 = 0->1, e1 = 1->EXIT,
/// e2 = R0->0 (invocations), e3 = 0->EXIT (virtual); counters on e0 and e2.
fn proc(returned: u64, invoked: u64) -> ProcProfile {
    ProcProfile {
        name: "p".into(),
        left_alone: None,
        entry: 0,
        blocks: vec![
            BlockProfile {
                start: 0x10,
                insns: vec![0, 5],
            },
            BlockProfile {
                start: 0x1a,
                insns: vec![0],
            },
        ],
        edges: vec![(0, 1, "return_from_call".into()), (1, 2, "return".into())],
        virtual_exits: vec![0],
        landing_pads: Vec::new(),
        setjmp_calls: Vec::new(),
        chords: vec![0, 2],
        every_block: false,
        first_counter: 0,
        counters: vec![returned, invoked],
        calls: Vec::new(),
        counts: None,
        error: None,
    }
}

/// A frame that catches: block 0 calls a procedure that may throw
/// (virtual exit), block 1 returns, block 2 is the landing pad and
/// returns. Counted graph: e0 = 0->1, e1 = 1->EXIT, e2 = 2->EXIT,
/// e3 = R0->0, e4 = 0->EXIT (virtual exit), e5 = R0->2 (landing);
/// counters on e0, e3, e5.
fn catcher(returned: u64, invoked: u64, landed: u64) -> ProcProfile {
    let mut p = proc(returned, invoked);
    p.blocks.push(BlockProfile {
        start: 0x20,
        insns: vec![0, 3],
    });
    p.edges = vec![
        (0, 1, "return_from_call".into()),
        (1, 3, "return".into()),
        (2, 3, "return".into()),
    ];
    p.landing_pads = vec![2];
    p.chords = vec![0, 3, 5];
    p.counters = vec![returned, invoked, landed];
    p
}

#[test]
fn landing_pads_are_entered_by_the_unwinder() {
    // Three calls: two return, one throws and lands in the pad.
    let c = recover(&catcher(2, 3, 1)).unwrap();
    assert_eq!(c.blocks, vec![3, 2, 1]);
    assert_eq!(c.edges, Some(vec![2, 2, 1]));
    assert_eq!(c.active, vec![(0, 1)]);
    assert_eq!(c.landed, vec![(2, 1)]);
    // Two unwound: one landed here, one passed through to a caller.
    let c = recover(&catcher(1, 3, 1)).unwrap();
    assert_eq!(c.blocks, vec![3, 1, 1]);
    assert_eq!(c.active, vec![(0, 2)]);
    // More returns than calls: impossible, landings or not.
    assert!(recover(&catcher(4, 3, 1)).is_err());
}

/// Block 0 calls setjmp (its return edge split: e0 = 0->S), block 1
/// calls a procedure that may longjmp (e1 = 1->2, virtual exit e4 =
/// 1->EXIT), block 2 returns (e2 = 2->EXIT). e3 = R0->0, e5 = R0->S,
/// e6 = S->1 (all returns of setjmp); counters on e1, e3, e6.
fn setjmp(invoked: u64, returns: u64, came_back: u64) -> ProcProfile {
    let mut p = catcher(0, 0, 0);
    p.edges = vec![
        (0, 1, "return_from_call".into()),
        (1, 2, "return_from_call".into()),
        (2, 3, "return".into()),
    ];
    p.virtual_exits = vec![1];
    p.landing_pads = Vec::new();
    p.setjmp_calls = vec![0];
    p.chords = vec![1, 3, 6];
    p.counters = vec![came_back, invoked, returns];
    p
}

#[test]
fn setjmp_returns_again_after_longjmp() {
    // One call; the callee longjmps back twice, then returns.
    let c = recover(&setjmp(1, 3, 1)).unwrap();
    assert_eq!(c.blocks, vec![1, 3, 1]);
    assert_eq!(c.edges, Some(vec![1, 1, 1]));
    assert_eq!(c.active, vec![(1, 2)]);
    assert_eq!(c.resumed, vec![(0, 2)]);
    // Fewer returns of setjmp than calls: impossible.
    assert!(recover(&setjmp(2, 1, 1)).is_err());
    // The derived edges cannot be counted.
    let mut p = setjmp(1, 3, 1);
    p.chords = vec![1, 3, 5];
    assert!(recover(&p).unwrap_err().contains("not countable"));
}

/// A tiny deterministic generator (xorshift64*), for the property test.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// What a call block does in the random procedures.
#[derive(Clone, Copy, PartialEq)]
enum CallRole {
    Plain,
    MayAbandon,
    Setjmp,
}

/// A random procedure: block `i` falls through (or returns from its
/// call) to `i + 1`, the last one returns; plain blocks may also jump
/// anywhere; some call blocks may have their frame abandoned (virtual
/// exit), some call `setjmp`; some blocks are landing pads.
fn random_cfg(rng: &mut Rng) -> (aetrace_analysis::cfg::Cfg, Vec<CallRole>, Vec<BlockId>) {
    use aetrace_analysis::cfg::{Block, BlockKind, CallKind, CallSite, Cfg, CfgEdge, EdgeKind};
    let n = 2 + rng.below(9);
    let exit = BlockId::new(n);
    let mut blocks = aetrace_graph::PrimaryMap::new();
    let mut edges = aetrace_graph::PrimaryMap::new();
    let mut calls = Vec::new();
    let mut roles = Vec::new();
    for i in 0..n {
        let call = i + 1 < n && rng.chance(40);
        let b = BlockId::new(i);
        blocks.push(Block {
            start: 0x1000 + 16 * i as u64,
            end: 0x1008 + 16 * i as u64,
            insns: vec![0, 4],
            kind: if call {
                BlockKind::Call
            } else {
                BlockKind::Plain
            },
        });
        let next = BlockId::new(i + 1);
        if call {
            edges.push(CfgEdge {
                from: b,
                to: next,
                kind: EdgeKind::CallReturn,
            });
            calls.push(CallSite {
                block: b,
                kind: CallKind::Direct,
                target: None,
                name: None,
                returns: true,
                tail: false,
            });
            roles.push(match rng.below(3) {
                0 => CallRole::Plain,
                1 => CallRole::MayAbandon,
                _ => CallRole::Setjmp,
            });
            continue;
        }
        roles.push(CallRole::Plain);
        let spine = if i + 1 < n { next } else { exit };
        edges.push(CfgEdge {
            from: b,
            to: spine,
            kind: if spine == exit {
                EdgeKind::Return
            } else {
                EdgeKind::FallThrough
            },
        });
        if rng.chance(60) {
            let t = BlockId::new(rng.below(n + 1));
            if t != spine {
                edges.push(CfgEdge {
                    from: b,
                    to: t,
                    kind: if t == exit {
                        EdgeKind::TailCall
                    } else {
                        EdgeKind::Taken
                    },
                });
            }
        }
    }
    let pads = (1..n)
        .filter(|_| rng.chance(20))
        .map(BlockId::new)
        .collect();
    let cfg = Cfg {
        blocks,
        entry: BlockId::new(0),
        edges,
        calls,
        indirect_jumps: Vec::new(),
    };
    (cfg, roles, pads)
}

/// What a run of the procedure really did, and what its counters read.
#[derive(Default)]
struct Truth {
    blocks: Vec<u64>,
    edges: Vec<u64>,
    invocations: u64,
    abandoned: BTreeMap<u32, u64>,
    landed: BTreeMap<u32, u64>,
    resumed: BTreeMap<u32, u64>,
    /// All returns of each setjmp call (its `S -> r` counter).
    returns: BTreeMap<u32, u64>,
}

/// Runs frames of the procedure: from the entry, or (after a frame was
/// abandoned at a call that may abandon it) from a landing pad or a
/// `setjmp` the frame had called; within `budget` steps, then straight
/// down the fall-through spine to EXIT.
fn simulate(
    rng: &mut Rng,
    cfg: &aetrace_analysis::cfg::Cfg,
    roles: &[CallRole],
    pads: &[BlockId],
) -> Truth {
    let n = cfg.blocks.len();
    let exit = cfg.exit();
    let mut t = Truth {
        blocks: vec![0; n],
        edges: vec![0; cfg.edges.len()],
        ..Truth::default()
    };
    let out = |b: BlockId| -> Vec<EdgeId> {
        cfg.edges
            .iter()
            .filter(|(_, e)| e.from == b)
            .map(|(id, _)| id)
            .collect()
    };
    for _ in 0..1 + rng.below(4) {
        t.invocations += 1;
        let mut at = cfg.entry;
        let mut budget = 40;
        // setjmp calls this frame made (a longjmp may come back to one).
        let mut saved: Vec<BlockId> = Vec::new();
        while at != exit {
            t.blocks[at.index()] += 1;
            budget -= 1;
            let succ = out(at);
            let role = roles[at.index()];
            let mut e = if budget > 0 {
                succ[rng.below(succ.len())]
            } else {
                succ[0]
            };
            if role == CallRole::Setjmp {
                saved.push(at);
                *t.returns.entry(at.index() as u32).or_default() += 1;
            }
            if role == CallRole::MayAbandon && budget > 0 && rng.chance(40) {
                *t.abandoned.entry(at.index() as u32).or_default() += 1;
                // Unwound through, caught here, or longjmp'd back.
                match rng.below(3) {
                    1 if !pads.is_empty() => {
                        let p = pads[rng.below(pads.len())];
                        *t.landed.entry(p.index() as u32).or_default() += 1;
                        at = p;
                        continue;
                    }
                    2 if !saved.is_empty() => {
                        let c = saved[rng.below(saved.len())];
                        *t.resumed.entry(c.index() as u32).or_default() += 1;
                        *t.returns.entry(c.index() as u32).or_default() += 1;
                        at = cfg.edges[out(c)[0]].to;
                        continue;
                    }
                    _ => break,
                }
            }
            if role != CallRole::Plain {
                e = succ[0];
            }
            t.edges[e.index()] += 1;
            at = cfg.edges[e].to;
        }
    }
    t
}

/// One case of the property below: a random procedure and run from
/// `seed`.
fn random_frames_case(seed: u64) {
    use aetrace_analysis::cfg::{BlockKind, EdgeKind};
    use aetrace_rewrite::counters::Counted;
    let mut rng = Rng(seed);
    let (cfg, roles, pads) = random_cfg(&mut rng);
    let of = |r: CallRole| -> Vec<BlockId> {
        (0..roles.len())
            .filter(|&i| roles[i] == r && cfg.blocks[BlockId::new(i)].kind == BlockKind::Call)
            .map(BlockId::new)
            .collect()
    };
    let virt = Virtual {
        exits: of(CallRole::MayAbandon),
        pads: pads.clone(),
        setjmps: of(CallRole::Setjmp),
    };
    let pc = counters::place(&cfg, &CountSpec::default(), 0x1000, virt, 0).unwrap();
    let t = simulate(&mut rng, &cfg, &roles, &pads);
    let m = cfg.edges.len();
    let get = |map: &BTreeMap<u32, u64>, b: BlockId| map.get(&(b.index() as u32)).copied();
    let counters: Vec<u64> = pc
        .chords
        .iter()
        .map(|&c| match c {
            Counted::Edge(e) => t.edges[e.index()],
            Counted::Entry => t.invocations,
            Counted::Landing(b) => get(&t.landed, b).unwrap_or(0),
            Counted::Resume(b) => get(&t.returns, b).unwrap_or(0),
        })
        .collect();
    let index = |v: &[BlockId]| v.iter().map(|b| b.index() as u32).collect();
    let p = ProcProfile {
        name: "p".into(),
        left_alone: None,
        entry: 0,
        blocks: cfg
            .blocks
            .values()
            .map(|b| BlockProfile {
                start: b.start,
                insns: b.insns.clone(),
            })
            .collect(),
        edges: cfg
            .edges
            .values()
            .map(|e| {
                let kind = match e.kind {
                    EdgeKind::CallReturn => "return_from_call",
                    k => k.as_str(),
                };
                (e.from.index() as u32, e.to.index() as u32, kind.into())
            })
            .collect(),
        virtual_exits: index(&pc.virt.exits),
        landing_pads: index(&pc.virt.pads),
        setjmp_calls: index(&pc.virt.setjmps),
        chords: pc
            .chords
            .iter()
            .map(|&c| pc.virt.edge_of(m, c).unwrap().index() as u32)
            .collect(),
        every_block: false,
        first_counter: 0,
        counters,
        calls: Vec::new(),
        counts: None,
        error: None,
    };
    let c = recover(&p).unwrap();
    let list =
        |m: &BTreeMap<u32, u64>| -> Vec<(u32, u64)> { m.iter().map(|(&k, &v)| (k, v)).collect() };
    assert_eq!(c.invocations, t.invocations);
    assert_eq!(c.blocks, t.blocks);
    assert_eq!(c.edges, Some(t.edges));
    assert_eq!(c.active, list(&t.abandoned));
    assert_eq!(c.landed, list(&t.landed));
    assert_eq!(c.resumed, list(&t.resumed));
}

proptest::proptest! {
    /// Frames abandoned by throws and longjmps, landing pads and setjmp
    /// returns: placing counters on a random procedure, reading them as
    /// the code would (a setjmp's return edge before the call, its
    /// `S -> r` at the return point, a pad's entries in its stub) and
    /// recovering gives back every true count.
    #[test]
    fn random_frames_with_throws_and_longjmps_recover_exactly(seed in 1u64..u64::MAX) {
        random_frames_case(seed);
    }
}

#[test]
fn complete_run() {
    let c = recover(&proc(3, 3)).unwrap();
    assert_eq!(c.invocations, 3);
    assert_eq!(c.blocks, vec![3, 3]);
    assert_eq!(c.edges, Some(vec![3, 3]));
    assert!(c.active.is_empty());
}

#[test]
fn exit_with_a_frame_active_at_the_call() {
    let c = recover(&proc(2, 3)).unwrap();
    assert_eq!(c.blocks, vec![3, 2]);
    assert_eq!(c.edges, Some(vec![2, 2]));
    assert_eq!(c.active, vec![(0, 1)]);
}

#[test]
fn impossible_counters_are_an_error() {
    assert!(recover(&proc(4, 3)).is_err());
}

#[test]
fn counted_edges_that_are_not_chords_are_refused() {
    let mut p = proc(1, 1);
    p.chords = vec![0, 1];
    assert!(recover(&p).unwrap_err().contains("chords"));
    p.chords = vec![0, 9];
    assert!(recover(&p).is_err());
}

#[test]
fn damaged_graphs_are_errors_not_panics() {
    let mut p = proc(1, 1);
    p.edges.push((2, 0, "fall".into()));
    assert!(recover(&p).is_err());
    let mut p = proc(1, 1);
    p.entry = 7;
    assert!(recover(&p).is_err());
    let mut p = proc(1, 1);
    p.edges.push((0, 1, "fall".into()));
    assert!(recover(&p).is_err());
}
