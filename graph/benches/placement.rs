//! Placement benchmark: every algorithm of aetrace-graph on one CFG of
//! 100,000 blocks (structured: nested loops, if/else, switches, calls,
//! early returns; generated from a fixed seed), plus an irreducible one.
//! Prints one row per algorithm (blocks, edges, milliseconds) and the costs
//! of the optimal placements against their baselines under the heuristic
//! weighting. Run: `cargo bench -p aetrace-graph`.

use std::time::Instant;

use aetrace_graph::program::{edge_counts, Callee, Program};
use aetrace_graph::testgen::{spine_proc, structured_proc, Executor, Rng};
use aetrace_graph::{
    dom, events, paths, profile, spanning, trace, weights, EdgeId, EntityRef, Graph, PrimaryMap,
    ProcId, SecondaryMap, VertexKind,
};

const BLOCKS: usize = 100_000;

fn time<T>(rows: &mut Vec<(String, f64)>, name: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    let ms = t.elapsed().as_secs_f64() * 1e3;
    rows.push((name.to_string(), ms));
    r
}

fn run(label: &str, g: &Graph) {
    let mut rows = Vec::new();
    let dfs = time(&mut rows, "dfs", || dom::Dfs::new(g));
    let li = time(&mut rows, "dominators + natural loops", || {
        let d = dom::Dominators::new(g, &dfs);
        dom::LoopInfo::new(g, &dfs, &d)
    });
    let _regions = time(&mut rows, "loop regions (heuristic's)", || {
        let d = dom::Dominators::new(g, &dfs);
        weights::loop_regions(g, &dfs, &d)
    });
    let w = time(&mut rows, "heuristic weighting", || weights::heuristic(g));
    let qp = time(&mut rows, "QP counter placement", || {
        profile::place_counters(g, &w)
    });
    // Real runs (random walks, calls treated as external, driven to EXIT)
    // totalling a million steps; recover their counts from the chords.
    let prog = Program {
        procs: PrimaryMap::from_iter([g.clone()]),
        callees: PrimaryMap::from_iter([{
            let mut c = SecondaryMap::filled(g.num_vertices(), None);
            for v in g.vertices().filter(|&v| g.kind(v) == VertexKind::Call) {
                c[v] = Some(Callee::External);
            }
            c
        }]),
        main: ProcId::new(0),
    };
    let (mut truth, mut steps, mut seed) = (SecondaryMap::filled(g.num_edges() + 1, 0u64), 0, 0);
    let runner = Executor::new(&prog);
    while steps < 1_000_000 {
        seed += 1;
        let exec = runner.run(&mut Rng::new(seed), 1_000_000 - steps, false);
        steps += exec.steps.len();
        let c = &edge_counts(&prog, &exec)[ProcId::new(0)];
        for e in g.edge_ids().chain([g.exit_root()]) {
            truth[e] += c[e];
        }
    }
    let got = time(&mut rows, "count recovery (propagation)", || {
        profile::recover_counts(g, &qp, &truth, &[]).expect("consistent counts")
    });
    assert_eq!(got.edges, truth, "recovered counts differ");
    let wp = time(&mut rows, "witness placement (blocking + tree)", || {
        trace::place_witnesses(g, &w)
    });
    time(&mut rows, "witness sets", || trace::witness_sets(g, &wp));
    let old = time(&mut rows, "baseline: all predicate edges", || {
        trace::all_predicate_edges(g)
    });
    let naive = time(&mut rows, "baseline: naive blocking + tree", || {
        trace::naive_blocking(g, &w)
    });
    let ev: SecondaryMap<EdgeId, i64> = SecondaryMap::filled(g.num_edges() + 1, 1);
    time(&mut rows, "event counting increments", || {
        events::place_event_counters(g, &w, &ev)
    });
    let pn = time(&mut rows, "path numbering + increments", || {
        paths::number_paths(g, &w, u64::MAX)
    });

    println!(
        "\n## {label}: {} blocks, {} edges, {} natural loops, reducible: {}",
        g.num_vertices() - 1,
        g.num_edges(),
        li.loops.len(),
        li.is_reducible()
    );
    println!(
        "{:<40} {:>9} {:>9} {:>10}",
        "algorithm", "blocks", "edges", "time ms"
    );
    for (name, ms) in &rows {
        println!(
            "{:<40} {:>9} {:>9} {:>10.2}",
            name,
            g.num_vertices() - 1,
            g.num_edges(),
            ms
        );
    }
    println!("count recovery checked against {seed} runs, {steps} steps in all");
    match pn {
        Ok(pn) => println!(
            "paths: {} acyclic paths, {} chords with increments",
            pn.num_paths(),
            pn.chords()
        ),
        Err(e) => println!("paths: {e} (falls back to edge profiling)"),
    }
    let qc = qp.cost(&w);
    let slow = profile::slow_cost(g, &w);
    let pred = spanning::cost(&w, profile::predicate_edge_placement(g));
    println!("profiling cost: QP {qc:.4e} ({} counters), slow {slow:.4e} (x{:.2}), predicate edges {pred:.4e} (x{:.2})",
        qp.chords.len(), slow / qc, pred / qc);
    let wc = wp.cost(&w);
    println!("tracing cost: witnesses {wc:.4e} ({} edges, {} blocking, spanning {}), old AE {:.4e} (x{:.2}, {} edges), naive blocking {:.4e} (x{:.2}, {} edges)",
        wp.len(), wp.blocking(), wp.spanning(), old.cost(&w), old.cost(&w) / wc, old.len(), naive.cost(&w), naive.cost(&w) / wc, naive.len());
}

/// Many procedures of realistic size (100,000 blocks in all): the path
/// profile is only meaningful per procedure of modest size.
fn run_program(nprocs: usize, blocks: usize) {
    let mut rng = Rng::new(0x0bad_cafe);
    let procs: Vec<Graph> = (0..nprocs)
        .map(|i| {
            let n = 1 + rng.below(2 * blocks);
            structured_proc(&mut rng, n, i, nprocs, 0.08).0
        })
        .collect();
    let (nb, ne): (usize, usize) = procs.iter().fold((0, 0), |(b, e), g| {
        (b + g.num_vertices() - 1, e + g.num_edges())
    });
    let mut rows = Vec::new();
    let ws: Vec<_> = time(&mut rows, "heuristic weighting", || {
        procs.iter().map(weights::heuristic).collect()
    });
    time(&mut rows, "QP counter placement", || {
        procs
            .iter()
            .zip(&ws)
            .map(|(g, w)| profile::place_counters(g, w))
            .collect::<Vec<_>>()
    });
    time(&mut rows, "witness placement + sets", || {
        procs
            .iter()
            .zip(&ws)
            .map(|(g, w)| trace::witness_sets(g, &trace::place_witnesses(g, w)))
            .collect::<Vec<_>>()
    });
    let limit = u32::MAX as u64;
    let pns: Vec<_> = time(&mut rows, "path numbering + increments", || {
        procs
            .iter()
            .zip(&ws)
            .map(|(g, w)| paths::number_paths(g, w, limit))
            .collect()
    });
    println!("\n## program: {nprocs} structured procedures, {nb} blocks, {ne} edges in all");
    println!(
        "{:<40} {:>9} {:>9} {:>10}",
        "algorithm", "blocks", "edges", "time ms"
    );
    for (name, ms) in &rows {
        println!("{:<40} {:>9} {:>9} {:>10.2}", name, nb, ne, ms);
    }
    let ok: Vec<u64> = pns
        .iter()
        .filter_map(|p| p.as_ref().ok())
        .map(|p| p.num_paths())
        .collect();
    println!(
        "paths: {} procedures numbered (max {} paths), {} over the limit {limit} fall back to edge profiling",
        ok.len(),
        ok.iter().max().copied().unwrap_or(0),
        pns.len() - ok.len()
    );
}

fn main() {
    let mut rng = Rng::new(0x00ae_7ace);
    let (g, _) = structured_proc(&mut rng, BLOCKS, 0, 8, 0.08);
    run("structured", &g);
    let (g, _) = spine_proc(&mut rng, BLOCKS, 0, 8, 0.08);
    run("spine (irreducible)", &g);
    run_program(1000, 100);
}
