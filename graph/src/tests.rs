//! The papers' worked figures, and property tests of every algorithm
//! against naive references on random CFGs and executions.

use crate::entity::{EntityRef, PrimaryMap, SecondaryMap};
use crate::graph::{BlockId, EdgeId, Graph, GraphBuilder, ProcId, VertexKind};
use crate::program::{self, End, Execution, Program, Record};
use crate::testgen::{self, Rng};
use crate::trace::{self, Sym, WitnessPlacement};
use crate::{dom, events, paths, profile, regen_ref, spanning, weights};
use proptest::prelude::*;

/// Builds a graph from named vertices; the last name is EXIT, the first the root.
fn named(
    names: &[&str],
    calls: &[&str],
    edges: &[(&str, &str)],
) -> (Graph, impl Fn(&str) -> BlockId) {
    let mut b = GraphBuilder::new();
    let last = names.len() - 1;
    for (i, n) in names.iter().enumerate() {
        b.add_vertex(if i == last {
            VertexKind::Exit
        } else if calls.contains(n) {
            VertexKind::Call
        } else {
            VertexKind::Plain
        });
    }
    let owned: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let id = move |n: &str| BlockId::new(owned.iter().position(|x| x == n).expect("name"));
    for &(x, y) in edges {
        b.add_edge(id(x), id(y));
    }
    (b.finish(BlockId::new(0), BlockId::new(last)), id)
}

fn edge_of(g: &Graph, id: &impl Fn(&str) -> BlockId, x: &str, y: &str) -> EdgeId {
    g.find_edge(id(x), id(y)).expect("edge")
}

/// Paper 003, Figure 1: `while (P) { if (Q) A else B; if (R) break; C }`.
fn figure1() -> (Graph, impl Fn(&str) -> BlockId) {
    named(
        &["P", "Q", "A", "B", "R", "C", "EXIT"],
        &[],
        &[
            ("P", "Q"),
            ("P", "EXIT"),
            ("Q", "A"),
            ("Q", "B"),
            ("A", "R"),
            ("B", "R"),
            ("R", "C"),
            ("R", "EXIT"),
            ("C", "P"),
        ],
    )
}

#[test]
fn figure1_heuristic_weighting() {
    let (g, id) = figure1();
    let w = weights::heuristic(&g);
    let expect = [
        ("P", "Q", 10.5),
        ("P", "EXIT", 0.5),
        ("Q", "A", 5.25),
        ("Q", "B", 5.25),
        ("A", "R", 5.25),
        ("B", "R", 5.25),
        ("R", "C", 10.0),
        ("R", "EXIT", 0.5),
        ("C", "P", 10.0),
    ];
    for (x, y, v) in expect {
        assert!(
            (w[edge_of(&g, &id, x, y)] - v).abs() < 1e-12,
            "{x}->{y}: {}",
            w[edge_of(&g, &id, x, y)]
        );
    }
    assert_eq!(w[g.exit_root()], 1.0);
    weights::check_kirchhoff(&g, &w).unwrap();
}

#[test]
fn figure3_placements_cost_16_75_and_11_5() {
    let (g, id) = figure1();
    let w = weights::heuristic(&g);
    let total: f64 = g.edge_ids().map(|e| w[e]).sum::<f64>() + w[g.exit_root()];
    // Case (a): counters on P->Q, Q->A, P->EXIT, R->EXIT.
    let a =
        [("P", "Q"), ("Q", "A"), ("P", "EXIT"), ("R", "EXIT")].map(|(x, y)| edge_of(&g, &id, x, y));
    let cost_a = spanning::cost(&w, a);
    assert!((cost_a - 16.75).abs() < 1e-12);
    assert!((total - cost_a - 36.75).abs() < 1e-12);
    // Case (b) is what the algorithm picks.
    let pl = profile::place_counters(&g, &w);
    assert_eq!(pl.chords.len(), g.num_edges() + 1 - (g.num_vertices() - 1));
    assert!((pl.cost(&w) - 11.5).abs() < 1e-12, "{}", pl.cost(&w));
    assert!((total - pl.cost(&w) - 42.0).abs() < 1e-12);
    assert!(pl.tree.contains(g.exit_root()));
    // Both placements recover the counts of an execution (P Q A R C P Q B R EXIT).
    let run = ["P", "Q", "A", "R", "C", "P", "Q", "B", "R", "EXIT"];
    let mut truth = SecondaryMap::filled(g.num_edges() + 1, 0u64);
    truth[g.exit_root()] = 1;
    for s in run.windows(2) {
        truth[edge_of(&g, &id, s[0], s[1])] += 1;
    }
    let got = profile::recover_counts(&g, &pl, &truth, &[]).unwrap();
    assert_eq!(got.edges, truth);
    assert_eq!(got.blocks[id("R")], 2);
    // Case (a) as a placement: its complement is a spanning tree too.
    let tree_a = spanning::max_spanning_forest(&g, &w, true, &|e| a.contains(&e));
    assert!(tree_a.is_spanning());
    let pl_a = profile::CounterPlacement {
        chords: tree_a.chords(&g),
        tree: tree_a,
    };
    assert_eq!(pl_a.chords.len(), 4);
    assert_eq!(
        profile::recover_counts(&g, &pl_a, &truth, &[])
            .unwrap()
            .edges,
        truth
    );
    // Baselines cost more: slow QP counts every block.
    assert!(profile::slow_cost(&g, &w) > 11.5);
    assert!(spanning::cost(&w, profile::predicate_edge_placement(&g)) > 11.5);
}

#[test]
fn figure4_early_exit_correction() {
    // root -> A (calls exit) ; A -> B -> EXIT ; root -> B. The run stops in A.
    let (g, id) = named(
        &["r", "A", "B", "EXIT"],
        &["A"],
        &[("r", "A"), ("r", "B"), ("A", "B"), ("B", "EXIT")],
    );
    let w = weights::heuristic(&g);
    let pl = profile::place_counters(&g, &w);
    let mut truth = SecondaryMap::filled(g.num_edges() + 1, 0u64);
    truth[g.exit_root()] = 1;
    truth[edge_of(&g, &id, "r", "A")] = 1;
    // Without the correction the counts are wrong or inconsistent.
    let wrong = profile::recover_counts(&g, &pl, &truth, &[]);
    assert!(wrong.map_or(true, |c| c.edges != truth));
    let right = profile::recover_counts(&g, &pl, &truth, &[id("A")]).unwrap();
    assert_eq!(right.edges, truth);
    assert_eq!(right.blocks[id("A")], 1);
    assert_eq!(right.blocks[id("B")], 0);
}

/// Paper 003, Figure 6, with witnesses t on P->A, u on B->A, v on B->C.
fn figure6() -> (Graph, impl Fn(&str) -> BlockId) {
    named(
        &["P", "A", "B", "C", "EXIT"],
        &[],
        &[
            ("P", "A"),
            ("P", "B"),
            ("A", "C"),
            ("B", "A"),
            ("B", "C"),
            ("C", "P"),
            ("C", "EXIT"),
        ],
    )
}

fn single(g: Graph) -> Program {
    let n = g.num_vertices();
    Program {
        procs: PrimaryMap::from_iter([g]),
        callees: PrimaryMap::from_iter([SecondaryMap::filled(n, None)]),
        main: ProcId::new(0),
    }
}

#[test]
fn figure6_trace_and_regeneration() {
    let (g, id) = figure6();
    let mut epl = vec![false; g.num_edges()];
    for (x, y) in [("P", "A"), ("B", "A"), ("B", "C")] {
        epl[edge_of(&g, &id, x, y).index()] = true;
    }
    let pl = WitnessPlacement::from_edges(&g, &epl, 0, true);
    let (t, u, v) = (0, 1, 2); // numbered in edge order: P->A, B->A, B->C
    assert_eq!(pl.witness(edge_of(&g, &id, "B", "A")), Some(u));
    let ws = trace::check_trace(&g, &pl).unwrap();
    trace::check_no_diamond_or_cycle(&g, &|e| pl.contains(e)).unwrap();
    assert_eq!(
        ws.set(edge_of(&g, &id, "C", "P")),
        &[Sym::W(t), Sym::W(u), Sym::W(v)]
    );
    assert_eq!(ws.set(edge_of(&g, &id, "C", "EXIT")), &[Sym::Eof]);
    let names = ["P", "A", "C", "P", "B", "A", "C", "P", "B", "C", "EXIT"];
    let exec = Execution {
        steps: names.iter().map(|n| (ProcId::new(0), id(n))).collect(),
        end: End::Returned,
    };
    let prog = single(g.clone());
    let pls = PrimaryMap::from_iter([pl.clone()]);
    let rec = program::record(&prog, &pls, &exec);
    assert_eq!(
        rec,
        vec![
            Record::Witness(t),
            Record::Witness(u),
            Record::Witness(v),
            Record::Eof
        ]
    );
    let sets = PrimaryMap::from_iter([ws]);
    let r = regen_ref::regenerate(&prog, &pls, &sets, &rec).unwrap();
    assert_eq!(r.steps, exec.steps);
    assert_eq!(r.end, End::Returned);
    // Without the witness on P->A the sets of P intersect (the paper's example).
    epl[edge_of(&g, &id, "P", "A").index()] = false;
    let bad = WitnessPlacement::from_edges(&g, &epl, 0, true);
    assert!(matches!(
        trace::check_trace(&g, &bad),
        Err(crate::Error::SharedWitness { .. })
    ));
    assert!(trace::check_no_diamond_or_cycle(&g, &|e| bad.contains(e)).is_err());
}

#[test]
fn figure8_blocking_far_from_calls() {
    // A predicate P whose branches reach call vertex C through plain chains.
    let (g, id) = named(
        &["P", "X", "Y", "C", "D", "EXIT"],
        &["C"],
        &[
            ("P", "X"),
            ("P", "Y"),
            ("X", "C"),
            ("Y", "D"),
            ("C", "D"),
            ("D", "EXIT"),
        ],
    );
    assert_eq!(
        trace::blockers(&g, id("C")),
        vec![edge_of(&g, &id, "P", "X")]
    );
    assert_eq!(
        trace::blockers(&g, id("EXIT")),
        vec![edge_of(&g, &id, "P", "X"), edge_of(&g, &id, "P", "Y")]
    );
    let w = weights::heuristic(&g);
    let pl = trace::place_witnesses(&g, &w);
    trace::check_blocking(&g, &pl).unwrap();
    trace::check_trace(&g, &pl).unwrap();
    assert_eq!(pl.len(), 2);
}

/// Paper 001's DAG example: paths 0..5.
#[test]
fn path_profiling_dag_example() {
    let (g, id) = named(
        &["A", "B", "C", "D", "E", "F"],
        &[],
        &[
            ("A", "C"),
            ("A", "B"),
            ("B", "C"),
            ("B", "D"),
            ("C", "D"),
            ("D", "F"),
            ("D", "E"),
            ("E", "F"),
        ],
    );
    let w = weights::heuristic(&g);
    let pn = paths::number_paths(&g, &w, 1 << 20).unwrap();
    assert_eq!(pn.num_paths(), 6);
    let expect = ["ACDF", "ACDEF", "ABCDF", "ABCDEF", "ABDF", "ABDEF"];
    for (i, s) in expect.iter().enumerate() {
        let p = pn.regenerate(i as u64).unwrap();
        let want: Vec<BlockId> = s.chars().map(|c| id(&c.to_string())).collect();
        assert_eq!(p.blocks, want, "{s}");
        assert_eq!(pn.id_of(&p).unwrap(), i as u64);
        // The instrumented sum along the path equals the id.
        let mut r = pn.inc_enter();
        for win in p.blocks.windows(2) {
            r += pn.inc_edge(g.find_edge(win[0], win[1]).unwrap());
        }
        assert_eq!(r, i as i64, "{s}");
    }
    assert!(pn.regenerate(6).is_err());
}

#[test]
fn too_many_paths_is_reported() {
    // A chain of 70 diamonds has 2^70 paths.
    let mut b = GraphBuilder::new();
    let mut cur = b.add_vertex(VertexKind::Plain);
    let root = cur;
    for _ in 0..70 {
        let (x, y, j) = (
            b.add_vertex(VertexKind::Plain),
            b.add_vertex(VertexKind::Plain),
            b.add_vertex(VertexKind::Plain),
        );
        b.add_edge(cur, x);
        b.add_edge(cur, y);
        b.add_edge(x, j);
        b.add_edge(y, j);
        cur = j;
    }
    let exit = b.add_vertex(VertexKind::Exit);
    b.add_edge(cur, exit);
    let g = b.finish(root, exit);
    let w = weights::heuristic(&g);
    assert!(matches!(
        paths::number_paths(&g, &w, u64::MAX),
        Err(crate::Error::TooManyPaths { .. })
    ));
}

// ---------------------------------------------------------------- properties

/// Placements and witness sets for every procedure of a program.
fn instrument(
    prog: &Program,
) -> (
    PrimaryMap<ProcId, WitnessPlacement>,
    PrimaryMap<ProcId, trace::WitnessSets>,
) {
    let pls: PrimaryMap<ProcId, WitnessPlacement> = prog
        .procs
        .values()
        .map(|g| trace::place_witnesses(g, &weights::heuristic(g)))
        .collect();
    let sets = prog
        .procs
        .iter()
        .map(|(p, g)| {
            trace::check_blocking(g, &pls[p]).unwrap();
            trace::check_trace(g, &pls[p]).unwrap()
        })
        .collect();
    (pls, sets)
}

/// `cases` cases, or `PROPTEST_CASES` (scaled for the heavy tests) when set.
fn config(cases: u32) -> ProptestConfig {
    let env = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok());
    ProptestConfig {
        cases: env.map_or(cases, |n| (n * cases / 128).max(1)),
        ..ProptestConfig::default()
    }
}

fn exec_for(prog: &Program, seed: u64, budget: usize, cut: bool) -> Execution {
    let ex = testgen::random_execution(&mut Rng::new(seed), prog, budget, cut);
    program::check_execution(prog, &ex).unwrap();
    ex
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn spanning_forest_is_maximum(g in testgen::arb_graph(1..7), seed in any::<u64>(), seeded in any::<bool>()) {
        prop_assume!(g.num_edges() + seeded as usize <= 14);
        let mut rng = Rng::new(seed);
        let mut w = SecondaryMap::filled(g.num_edges() + 1, 0.0);
        for e in g.edge_ids().chain([g.exit_root()]) {
            w[e] = rng.below(4) as f64;
        }
        let excl: Vec<bool> = g.edge_ids().map(|_| rng.chance(0.2)).collect();
        let ex = |e: EdgeId| e.index() < excl.len() && excl[e.index()];
        let f = spanning::max_spanning_forest(&g, &w, seeded, &ex);
        let got: f64 = spanning::cost(&w, f.tree_edges());
        let best = spanning::reference::best_forest_weight(&g, &w, seeded, &ex);
        prop_assert!((got - best).abs() < 1e-9, "{got} vs {best}");
    }

    #[test]
    fn heuristic_weights_obey_kirchhoff(g in testgen::arb_graph(1..300)) {
        let w = weights::heuristic(&g);
        prop_assert_eq!(weights::check_kirchhoff(&g, &w), Ok(()));
        prop_assert_eq!(w[g.exit_root()], 1.0);
        // Reducible graphs: the loop regions are the natural loops.
        let dfs = dom::Dfs::new(&g);
        let d = dom::Dominators::new(&g, &dfs);
        let li = dom::LoopInfo::new(&g, &dfs, &d);
        if li.is_reducible() {
            prop_assert_eq!(weights::loop_regions(&g, &dfs, &d), li.loops);
        }
    }

    #[test]
    fn theorem_4_2_diamonds_iff_shared_witnesses(g in testgen::arb_graph(1..12), seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let epl: Vec<bool> = g.edge_ids().map(|_| rng.chance(0.5)).collect();
        let pl = WitnessPlacement::from_edges(&g, &epl, 0, true);
        let by_sets = trace::check_trace(&g, &pl).is_ok();
        let by_graph = trace::check_no_diamond_or_cycle(&g, &|e| pl.contains(e)).is_ok();
        prop_assert_eq!(by_sets, by_graph);
    }

    #[test]
    fn blockers_union_is_the_blocking_set(g in testgen::arb_graph(1..200)) {
        let fast = trace::blocking_edges(&g);
        let mut naive = vec![false; g.num_edges()];
        for v in g.vertices().filter(|&v| matches!(g.kind(v), VertexKind::Call | VertexKind::Exit)) {
            for e in trace::blockers(&g, v) {
                naive[e.index()] = true;
            }
        }
        prop_assert_eq!(fast, naive);
    }

    #[test]
    fn event_increments_match_fundamental_cycles(g in testgen::arb_graph(1..60), seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut ev = SecondaryMap::filled(g.num_edges() + 1, 0i64);
        for e in g.edge_ids() {
            ev[e] = rng.below(20) as i64 - 5;
        }
        let ec = events::place_event_counters(&g, &weights::heuristic(&g), &ev);
        for e in g.edge_ids().filter(|&e| !ec.tree.contains(e)) {
            prop_assert_eq!(ec.inc[e], events::reference::chord_increment(&g, &ec, &ev, e));
        }
    }

    /// (e) Under the same weighting the optimal placements never cost more
    /// than their baselines.
    #[test]
    fn optimal_placements_beat_baselines(g in testgen::arb_graph(1..400)) {
        let w = weights::heuristic(&g);
        let qp = profile::place_counters(&g, &w).cost(&w);
        let eps = 1e-9 * (1.0 + qp);
        prop_assert!(qp <= profile::slow_cost(&g, &w) + eps);
        prop_assert!(qp <= spanning::cost(&w, profile::predicate_edge_placement(&g)) + eps);
        let wp = trace::place_witnesses(&g, &w);
        prop_assert!(wp.cost(&w) <= trace::all_predicate_edges(&g).cost(&w) + eps);
        prop_assert!(wp.cost(&w) <= trace::naive_blocking(&g, &w).cost(&w) + eps,
            "blocking {} > naive {}", wp.cost(&w), trace::naive_blocking(&g, &w).cost(&w));
    }

    /// The rewriter's naive placement still has the blocking property and
    /// still solves `Trace(G, epl)` (by the naive checkers), at no more
    /// witnesses than the paper's.
    #[test]
    fn naive_blocking_needed_still_blocks(g in testgen::arb_graph(1..400)) {
        let w = weights::heuristic(&g);
        let pl = trace::naive_blocking_needed(&g, &w);
        prop_assert_eq!(trace::check_blocking(&g, &pl), Ok(()));
        prop_assert!(trace::check_trace(&g, &pl).is_ok());
        prop_assert!(pl.blocking() <= trace::naive_blocking(&g, &w).blocking());
    }
}

proptest! {
    #![proptest_config(config(96))]

    /// (a) Counts recovered from chord counters equal the true counts, also
    /// for executions cut off early or ended by `exit` (Figure 4).
    #[test]
    fn counts_recovered_from_chords((prog, seed) in testgen::arb_program(1..6, 80), budget in 1usize..1500, cut in any::<bool>()) {
        let ex = exec_for(&prog, seed, budget, cut);
        let truth = program::edge_counts(&prog, &ex);
        let active = ex.active_frames(&prog);
        for (p, g) in prog.procs.iter() {
            let w = weights::heuristic(g);
            let pl = profile::place_counters(g, &w);
            let here: Vec<BlockId> = active.iter().filter(|f| f.0 == p).map(|f| f.1).collect();
            let got = profile::recover_counts(g, &pl, &truth[p], &here).unwrap();
            for e in g.edge_ids().chain([g.exit_root()]) {
                prop_assert_eq!(got.edges[e], truth[p][e], "{} {}", p, e);
            }
            // Measured weights of a complete run obey Kirchhoff's law.
            prop_assert!(weights::measured(g, &truth[p], &here).is_ok());
        }
    }

    /// (b) The reference regenerator returns the execution from its trace,
    /// and a corrupted witness is an error naming procedure and block.
    #[test]
    fn regenerator_returns_the_execution((prog, seed) in testgen::arb_program(1..6, 80), budget in 1usize..1500, cut in any::<bool>()) {
        let (pls, sets) = instrument(&prog);
        let ex = exec_for(&prog, seed, budget, cut);
        let rec = program::record(&prog, &pls, &ex);
        let r = regen_ref::regenerate(&prog, &pls, &sets, &rec).unwrap();
        if ex.end == End::Cut {
            prop_assert_eq!(r.end.clone(), End::Cut);
            prop_assert!(r.certain <= ex.steps.len(), "{:?}\n{:?}\n{:?} {}", r.steps, ex.steps, rec, r.certain);
            prop_assert_eq!(&r.steps[..r.certain], &ex.steps[..r.certain]);
            let k = r.steps.len().min(ex.steps.len());
            prop_assert_eq!(&r.steps[..k], &ex.steps[..k]);
        } else {
            prop_assert_eq!(&r.steps, &ex.steps);
            prop_assert_eq!(r.end, ex.end.clone());
        }
        // Corrupt one witness.
        let wpos: Vec<usize> = (0..rec.len()).filter(|&i| matches!(rec[i], Record::Witness(_))).collect();
        if !wpos.is_empty() {
            let mut bad = rec.clone();
            let i = wpos[(seed as usize) % wpos.len()];
            bad[i] = Record::Witness(1_000_000);
            // The error names the step at which the good trace's record i is read.
            prop_assert_eq!(r.read_at.len(), rec.len());
            let at = (r.read_at[i].1, r.read_at[i].2);
            match regen_ref::regenerate(&prog, &pls, &sets, &bad) {
                Err(crate::Error::BadWitness { proc, block, witness }) => {
                    prop_assert_eq!(witness, "W(1000000)");
                    prop_assert_eq!((proc, block), at);
                }
                Err(crate::Error::WrongWitness { proc, block, found, .. }) => {
                    prop_assert_eq!(found, "W(1000000)");
                    prop_assert_eq!((proc, block), at);
                }
                other => prop_assert!(false, "corruption not caught: {:?}", other.map(|r| r.end)),
            }
        }
    }

    /// (d) Event counts are exact at every query point, across calls.
    #[test]
    fn event_counts_exact_at_every_query((prog, seed) in testgen::arb_program(1..6, 80), budget in 1usize..1500, cut in any::<bool>()) {
        let ex = exec_for(&prog, seed, budget, cut);
        let mut rng = Rng::new(seed ^ 0x5555);
        let ecs: PrimaryMap<ProcId, (SecondaryMap<EdgeId, i64>, events::EventCounting)> = prog.procs.values().map(|g| {
            let mut ev = SecondaryMap::filled(g.num_edges() + 1, 0i64);
            for e in g.edge_ids() { ev[e] = rng.below(10) as i64; }
            let ec = events::place_event_counters(g, &weights::heuristic(g), &ev);
            (ev, ec)
        }).collect();
        let (mut truth, mut counter) = (0i64, 0i64);
        let mut calls: Vec<i64> = Vec::new();
        let mut stack = Vec::new();
        let mut fail = None;
        program::walk(&prog, &ex, &mut stack, |i, t| {
            match t {
                program::Transfer::Start(_) => {}
                program::Transfer::Edge { proc, edge } => {
                    // Returning into the caller: undo its query flush.
                    if i > 0 && ex.steps[i - 1].1 == prog.procs[ex.steps[i - 1].0].exit() {
                        counter -= calls.pop().expect("a call");
                    }
                    truth += ecs[proc].0[edge];
                    counter += ecs[proc].1.inc[edge];
                }
                program::Transfer::Call { caller, at, .. } => {
                    let q = ecs[caller].1.query[at];
                    counter += q;
                    calls.push(q);
                }
            }
            let (p, v) = ex.steps[i];
            if fail.is_none() && counter + ecs[p].1.query[v] != truth {
                fail = Some(i);
            }
        }).unwrap();
        prop_assert_eq!(fail, None);
    }
}

/// Every acyclic path the path profile distinguishes, by brute-force DFS:
/// from the root or a back edge's header, along non-back edges, to EXIT or
/// to a back edge's tail.
fn enumerate_paths(g: &Graph, pn: &paths::PathNumbering) -> std::collections::HashSet<paths::Path> {
    let dfs = dom::Dfs::new(g);
    let back = |e: EdgeId| pn.is_back_edge(e);
    let is_tail = |v: BlockId| g.succs(v).iter().any(|&e| back(e));
    let mut starts = vec![(g.entry(), false)];
    let mut headers: Vec<BlockId> = g
        .edge_ids()
        .filter(|&e| back(e))
        .map(|e| g.edge(e).to)
        .collect();
    headers.sort();
    headers.dedup();
    starts.extend(headers.into_iter().map(|h| (h, true)));
    let mut out = std::collections::HashSet::new();
    for (s, after) in starts {
        if !dfs.reachable(s) {
            continue;
        }
        let mut stack = vec![vec![s]];
        while let Some(p) = stack.pop() {
            let v = *p.last().unwrap();
            if v == g.exit() {
                out.insert(paths::Path {
                    after_back_edge: after,
                    blocks: p.clone(),
                    at_back_edge: false,
                });
            }
            if is_tail(v) {
                out.insert(paths::Path {
                    after_back_edge: after,
                    blocks: p.clone(),
                    at_back_edge: true,
                });
            }
            for &e in g.succs(v) {
                if !back(e) {
                    let mut q = p.clone();
                    q.push(g.edge(e).to);
                    stack.push(q);
                }
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(config(128))]

    /// (c) Every path id regenerates its path, ids are distinct, and the
    /// instrumentation's register equals the id of every path a random
    /// walk takes.
    #[test]
    fn path_ids_regenerate(g in testgen::arb_graph(1..120), seed in any::<u64>()) {
        let w = weights::heuristic(&g);
        let pn = match paths::number_paths(&g, &w, 1 << 40) {
            Ok(pn) => pn,
            Err(crate::Error::TooManyPaths { .. }) => return Ok(()),
            Err(e) => return Err(TestCaseError::fail(e.to_string())),
        };
        if pn.num_paths() <= 3000 {
            let mut seen = std::collections::HashSet::new();
            for id in 0..pn.num_paths() {
                let p = pn.regenerate(id).unwrap();
                prop_assert_eq!(pn.id_of(&p).unwrap(), id);
                prop_assert!(seen.insert(p));
            }
            // Naive reference: list every path by brute force on the graph.
            prop_assert_eq!(seen, enumerate_paths(&g, &pn));
        }
        // Random walk root -> EXIT with the instrumentation simulated.
        let mut rng = Rng::new(seed);
        let mut v = g.entry();
        let mut r = pn.inc_enter();
        let mut cur = paths::Path { after_back_edge: false, blocks: vec![v], at_back_edge: false };
        for _ in 0..2000 {
            if v == g.exit() { break; }
            let s = g.succs(v);
            let e = s[rng.below(s.len())];
            let to = g.edge(e).to;
            if pn.is_back_edge(e) {
                let (t_inc, h_inc) = pn.back_edge_incs(v, to);
                cur.at_back_edge = true;
                let id = (r + t_inc) as u64;
                prop_assert_eq!(pn.id_of(&cur).unwrap(), id);
                prop_assert_eq!(&pn.regenerate(id).unwrap(), &cur);
                r = h_inc;
                cur = paths::Path { after_back_edge: true, blocks: vec![to], at_back_edge: false };
            } else {
                r += pn.inc_edge(e);
                cur.blocks.push(to);
            }
            v = to;
        }
        if v == g.exit() {
            prop_assert_eq!(pn.id_of(&cur).unwrap(), r as u64);
            prop_assert_eq!(&pn.regenerate(r as u64).unwrap(), &cur);
        }
    }
}

proptest! {
    #![proptest_config(config(6))]

    /// Large programs (thousands of blocks): regeneration and count recovery.
    #[test]
    fn large_programs((prog, seed) in testgen::arb_program(2..4, 2500), budget in 2000usize..20000) {
        let (pls, sets) = instrument(&prog);
        let ex = exec_for(&prog, seed, budget, false);
        let rec = program::record(&prog, &pls, &ex);
        let r = regen_ref::regenerate(&prog, &pls, &sets, &rec).unwrap();
        prop_assert_eq!(&r.steps, &ex.steps);
        let truth = program::edge_counts(&prog, &ex);
        let active = ex.active_frames(&prog);
        for (p, g) in prog.procs.iter() {
            let pl = profile::place_counters(g, &weights::heuristic(g));
            let here: Vec<BlockId> = active.iter().filter(|f| f.0 == p).map(|f| f.1).collect();
            prop_assert_eq!(profile::recover_counts(g, &pl, &truth[p], &here).unwrap().edges, truth[p].clone());
        }
    }
}

#[test]
fn generators_cover_the_shapes() {
    // Irreducible graphs, self loops, call predicates, all callee kinds occur.
    let mut rng = Rng::new(7);
    let (mut irreducible, mut self_loops, mut call_preds) = (0, 0, 0);
    let mut kinds = std::collections::HashSet::new();
    for _ in 0..200 {
        let prog = testgen::random_program(&mut rng, 4, 60, false);
        for (p, g) in prog.procs.iter() {
            let dfs = dom::Dfs::new(g);
            let li = dom::LoopInfo::new(g, &dfs, &dom::Dominators::new(g, &dfs));
            irreducible += !li.is_reducible() as usize;
            self_loops += g.edge_ids().any(|e| g.edge(e).from == g.edge(e).to) as usize;
            for v in g.vertices() {
                if let Some(c) = prog.callees[p][v] {
                    call_preds += g.is_predicate(v) as usize;
                    kinds.insert(std::mem::discriminant(&c));
                }
                assert!(dfs.reachable(v));
            }
        }
    }
    assert!(
        irreducible > 10 && self_loops > 10 && call_preds > 0,
        "{irreducible} {self_loops} {call_preds}"
    );
    assert_eq!(kinds.len(), 4);
}

#[test]
fn nested_loops_iterate_ten_times_per_entry() {
    // while (a) { while (b) { c } }
    let (g, id) = named(
        &["a", "b", "c", "EXIT"],
        &[],
        &[
            ("a", "b"),
            ("a", "EXIT"),
            ("b", "c"),
            ("b", "a"),
            ("c", "b"),
        ],
    );
    let w = weights::heuristic(&g);
    weights::check_kirchhoff(&g, &w).unwrap();
    // Outer loop entered once: header 11, back edge 10, exit 1.
    assert!((weights::vertex_weight(&g, &w, id("a")) - 11.0).abs() < 1e-9);
    assert!((w[edge_of(&g, &id, "b", "a")] - 10.0).abs() < 1e-9);
    assert!((w[edge_of(&g, &id, "a", "EXIT")] - 1.0).abs() < 1e-9);
    // Inner loop entered 10 times: header 110, back edge 100.
    assert!((weights::vertex_weight(&g, &w, id("b")) - 110.0).abs() < 1e-9);
    assert!((w[edge_of(&g, &id, "c", "b")] - 100.0).abs() < 1e-9);
}

#[test]
fn executions_cover_every_ending_and_call_kind() {
    let mut rng = Rng::new(11);
    let mut ends = std::collections::HashSet::new();
    let (mut enters, mut max_depth, mut recursive) = (0, 0, 0);
    for _ in 0..300 {
        let structured = rng.chance(0.5);
        let prog = testgen::random_program(&mut rng, 5, 40, structured);
        let (pls, _) = instrument(&prog);
        let cut = rng.chance(0.5);
        let ex = exec_for(&prog, rng.next_u64(), 1 + rng.below(800), cut);
        ends.insert(format!("{:?}", ex.end));
        let rec = program::record(&prog, &pls, &ex);
        enters += rec.iter().filter(|r| matches!(r, Record::Enter(_))).count();
        let mut stack = Vec::new();
        let mut depth = 0usize;
        program::walk(&prog, &ex, &mut stack, |_, t| {
            if let program::Transfer::Call { caller, callee, .. } = t {
                depth += 1;
                recursive += (callee <= caller) as usize;
            }
        })
        .unwrap();
        max_depth = max_depth.max(depth);
    }
    assert_eq!(ends.len(), 3, "{ends:?}");
    assert!(
        enters > 0 && recursive > 0 && max_depth > 3,
        "{enters} {recursive} {max_depth}"
    );
}

proptest! {
    #![proptest_config(config(64))]

    /// Feedback profiling: a measured weighting from one run places counters
    /// that recover another run's counts, and costs no more than the
    /// baselines under that weighting.
    #[test]
    fn measured_weighting_places_counters((prog, seed) in testgen::arb_program(1..4, 80), budget in 1usize..1000) {
        let ex1 = exec_for(&prog, seed, budget, false);
        let ex2 = exec_for(&prog, seed ^ 1, budget, false);
        let (c1, c2) = (program::edge_counts(&prog, &ex1), program::edge_counts(&prog, &ex2));
        let (a1, a2) = (ex1.active_frames(&prog), ex2.active_frames(&prog));
        for (p, g) in prog.procs.iter() {
            let here = |a: &[(ProcId, BlockId)]| a.iter().filter(|f| f.0 == p).map(|f| f.1).collect::<Vec<_>>();
            let w = weights::measured(g, &c1[p], &here(&a1)).unwrap();
            let pl = profile::place_counters(g, &w);
            prop_assert_eq!(&profile::recover_counts(g, &pl, &c2[p], &here(&a2)).unwrap().edges, &c2[p]);
            prop_assert!(pl.cost(&w) <= spanning::cost(&w, profile::predicate_edge_placement(g)) + 1e-9);
            prop_assert!(pl.cost(&w) <= profile::slow_cost(g, &w) + 1e-9);
        }
    }
}

#[test]
fn vertex_events_count_at_query_points() {
    // a -> b -> EXIT, a -> EXIT; events: a = 3, b = 5.
    let (g, id) = named(
        &["a", "b", "EXIT"],
        &[],
        &[("a", "b"), ("b", "EXIT"), ("a", "EXIT")],
    );
    let mut ve = SecondaryMap::filled(g.num_vertices(), 0i64);
    ve[id("a")] = 3;
    ve[id("b")] = 5;
    let ev = events::vertex_events_on_out_edges(&g, &ve);
    let ec = events::place_event_counters(&g, &weights::heuristic(&g), &ev);
    let run = |path: &[&str]| -> i64 {
        path.windows(2)
            .map(|s| ec.inc[edge_of(&g, &id, s[0], s[1])])
            .sum()
    };
    // Complete runs count every vertex's events; a query at b counts a's.
    assert_eq!(run(&["a", "b", "EXIT"]), 8);
    assert_eq!(run(&["a", "EXIT"]), 3);
    assert_eq!(run(&["a", "b"]) + ec.query[id("b")], 3);
    assert_eq!(ec.query[id("a")], 0);
    assert_eq!(ec.query[g.exit()], 0);
}

/// Real CFGs break the papers' assumptions: unreachable blocks, dead ends,
/// an EXIT nobody reaches. Every algorithm must still work.
#[test]
fn degenerate_graphs_do_not_break_anything() {
    let cases = [
        named(&["a", "EXIT"], &[], &[("a", "EXIT")]),
        // b is unreachable; c is a dead end (noreturn call without successor).
        named(
            &["a", "b", "c", "EXIT"],
            &["c"],
            &[("a", "c"), ("a", "EXIT"), ("b", "EXIT")],
        ),
        // An infinite loop: EXIT unreachable.
        named(&["a", "b", "EXIT"], &[], &[("a", "b"), ("b", "a")]),
        // The root is a loop header with a self loop.
        named(&["a", "EXIT"], &[], &[("a", "a"), ("a", "EXIT")]),
    ];
    for (g, _) in cases {
        let w = weights::heuristic(&g);
        weights::check_kirchhoff(&g, &w).unwrap();
        let qp = profile::place_counters(&g, &w);
        let zero = SecondaryMap::filled(g.num_edges() + 1, 0u64);
        assert_eq!(
            profile::recover_counts(&g, &qp, &zero, &[]).unwrap().edges,
            zero
        );
        let wp = trace::place_witnesses(&g, &w);
        trace::check_trace(&g, &wp).unwrap();
        trace::check_blocking(&g, &wp).unwrap();
        let pn = paths::number_paths(&g, &w, 1 << 20).unwrap();
        for id in 0..pn.num_paths() {
            assert_eq!(pn.id_of(&pn.regenerate(id).unwrap()).unwrap(), id);
        }
        let mut ev = SecondaryMap::filled(g.num_edges() + 1, 1i64);
        ev[g.exit_root()] = 0;
        let ec = events::place_event_counters(&g, &w, &ev);
        assert_eq!(ec.query[g.entry()], 0);
    }
}
