//! Output: Dinero IV's per-cache statistics layout (its `do1stats`, demand
//! fetch only) and the `--json` form.
//!
//! Columns are Total, Instrn, Data (read + write + misc), Read, Write, Misc;
//! a rate whose denominator is zero is computed against 1, as Dinero does,
//! so an unused column prints 0.0000.

use std::fmt::Write as _;

use crate::dinero::{Cache, Stats};

/// The six Dinero columns from per-kind counters `[read, write, instr, misc]`.
fn columns(a: &[u64; 4]) -> [f64; 6] {
    let [r, w, i, m] = a.map(|x| x as f64);
    let data = r + w + m;
    [data + i, i, data, r, w, m]
}

fn nonzero(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        x
    }
}

fn row(out: &mut String, label: &str, v: [f64; 6], decimals: usize) {
    out.push_str(label);
    for x in v {
        let _ = write!(out, "\t{x:12.decimals$}");
    }
    out.push('\n');
}

fn ratio(num: [f64; 6], den: [f64; 6]) -> [f64; 6] {
    let mut r = [0.0; 6];
    for k in 0..6 {
        r[k] = num[k] / nonzero(den[k]);
    }
    r
}

/// One cache's block, exactly in Dinero IV's layout.
pub fn dinero_block(name: &str, s: &Stats, ccc: bool) -> String {
    let mut o = String::new();
    o.push_str(name);
    o.push('\n');
    o.push_str(" Metrics\t\t      Total\t      Instrn\t       Data\t       Read\t      Write\t       Misc\n");
    o.push_str(" -----------------\t      ------\t      ------\t      ------\t      ------\t      ------\t      ------\n");
    let fetch = columns(&s.fetch);
    row(&mut o, " Demand Fetches\t", fetch, 0);
    let total = nonzero(fetch[0]);
    row(&mut o, "  Fraction of total", fetch.map(|x| x / total), 4);
    o.push('\n');
    let miss = columns(&s.miss);
    row(&mut o, " Demand Misses\t", miss, 0);
    row(&mut o, "  Demand miss rate", ratio(miss, fetch), 4);
    if ccc {
        let comp = columns(&s.compulsory);
        let cap = columns(&s.capacity);
        let conf = columns(&s.conflict);
        row(&mut o, "   Compulsory misses", comp, 0);
        row(&mut o, "   Capacity misses", cap, 0);
        row(&mut o, "   Conflict misses", conf, 0);
        row(&mut o, "   Compulsory fraction", ratio(comp, miss), 4);
        row(&mut o, "   Capacity fraction", ratio(cap, miss), 4);
        row(&mut o, "   Conflict fraction", ratio(conf, miss), 4);
    }
    o.push('\n');
    let from = s.bytes_from_memory as f64;
    let to = s.bytes_to_memory as f64;
    let _ = writeln!(o, " Multi-block refs      {:12.0}", s.multiblock as f64);
    let _ = writeln!(o, " Bytes From Memory\t{from:12.0}");
    let _ = writeln!(o, " ( / Demand Fetches)\t{:12.4}", from / total);
    let _ = writeln!(o, " Bytes To Memory\t{to:12.0}");
    let _ = writeln!(
        o,
        " ( / Demand Writes)\t{:12.4}",
        to / nonzero(s.fetch[1] as f64)
    );
    let _ = writeln!(o, " Total Bytes r/w Mem\t{:12.0}", from + to);
    let _ = writeln!(o, " ( / Demand Fetches)\t{:12.4}", (from + to) / total);
    o.push('\n');
    o
}

/// The whole report for a hierarchy, in Dinero's order.
pub fn dinero_report(caches: &[Cache], refs: u64) -> String {
    let mut o = String::new();
    o.push_str("---aetrace cachesim (Dinero IV semantics and statistics layout)\n");
    let _ = writeln!(o, "---References simulated: {refs}\n");
    for c in caches {
        o.push_str(&dinero_block(&c.config.name, &c.stats, c.config.ccc));
    }
    o.push_str("---Execution complete.\n");
    o
}

/// JSON for a hierarchy: each cache's configuration and counters.
pub fn dinero_json(caches: &[Cache], refs: u64) -> serde_json::Value {
    let kinds = |a: &[u64; 4]| {
        serde_json::json!({"read": a[0], "write": a[1], "instr": a[2], "misc": a[3],
                           "total": a.iter().sum::<u64>()})
    };
    serde_json::json!({
        "model": "dinero",
        "references": refs,
        "caches": caches.iter().map(|c| {
            let s = &c.stats;
            let mut v = serde_json::json!({
                "config": c.config,
                "fetches": kinds(&s.fetch),
                "misses": kinds(&s.miss),
                "multiblock_refs": s.multiblock,
                "bytes_from_memory": s.bytes_from_memory,
                "bytes_to_memory": s.bytes_to_memory,
            });
            if c.config.ccc {
                v["compulsory"] = kinds(&s.compulsory);
                v["capacity"] = kinds(&s.capacity);
                v["conflict"] = kinds(&s.conflict);
            }
            v
        }).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_matches_dinero_layout() {
        let s = Stats {
            fetch: [3, 1, 4, 0],
            miss: [1, 1, 2, 0],
            bytes_from_memory: 256,
            bytes_to_memory: 64,
            ..Stats::default()
        };
        let b = dinero_block("l1-ucache", &s, false);
        let lines: Vec<&str> = b.lines().collect();
        assert_eq!(lines[0], "l1-ucache");
        assert_eq!(
            lines[3],
            " Demand Fetches\t\t           8\t           4\t           4\t           3\t           1\t           0"
        );
        assert_eq!(
            lines[4],
            "  Fraction of total\t      1.0000\t      0.5000\t      0.5000\t      0.3750\t      0.1250\t      0.0000"
        );
        assert_eq!(
            lines[7],
            "  Demand miss rate\t      0.5000\t      0.5000\t      0.5000\t      0.3333\t      1.0000\t      0.0000"
        );
        assert_eq!(lines[9], " Multi-block refs                 0");
        assert_eq!(lines[10], " Bytes From Memory\t         256");
        assert_eq!(lines[14], " Total Bytes r/w Mem\t         320");
    }
}
