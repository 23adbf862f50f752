//! Reports of an edge profile: text (the hottest procedures and blocks),
//! JSON, and callgrind's format with inclusive costs
//! ([`crate::inclusive`]). Source lines come from each module's DWARF line
//! table when it is still there.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

use crate::{Profile, Result};

/// The text report: totals, the hottest procedures and blocks, each with
/// its module (the executable's file name or a library's DT_NEEDED name).
pub fn text(p: &Profile, top: usize, w: &mut dyn Write) -> Result<()> {
    let mods = p.modules();
    let all = || {
        mods.iter()
            .flat_map(|m| m.procs.iter().map(move |q| (m, q)))
    };
    let total: u64 = all().map(|(_, q)| q.instructions()).sum();
    writeln!(w, "program: {} {}", p.program, p.args.join(" "))?;
    writeln!(
        w,
        "status: {}; placement: {}; weights: {}; {} counter increments; {} instructions in profiled procedures",
        p.status, p.placement, p.weights, p.increments, total
    )?;
    for n in &p.notes {
        writeln!(w, "note: {n}")?;
    }
    let mut procs: Vec<_> = all().filter(|(_, q)| q.counts.is_some()).collect();
    procs.sort_by_key(|(_, q)| std::cmp::Reverse(q.instructions()));
    writeln!(
        w,
        "\nhottest procedures:\n{:>14} {:>7} {:>12}  procedure  module",
        "instructions", "%", "calls"
    )?;
    for (m, q) in procs.iter().take(top) {
        let n = q.instructions();
        let calls = q.counts.as_ref().map_or(0, |c| c.invocations);
        writeln!(
            w,
            "{n:>14} {:>6.2}% {calls:>12}  {}  {}",
            100.0 * n as f64 / total.max(1) as f64,
            q.name,
            m.name
        )?;
    }
    // (instructions, count, module, procedure, address)
    let mut blocks: Vec<(u64, u64, usize, &str, u64)> = Vec::new();
    for (m, q) in &procs {
        let c = q.counts.as_ref().expect("filtered");
        let module = mods.iter().position(|x| x.path == m.path).unwrap_or(0);
        for (b, &k) in q.blocks.iter().zip(&c.blocks) {
            blocks.push((k * b.insns.len() as u64, k, module, &q.name, b.start));
        }
    }
    blocks.sort_by(|a, b| b.0.cmp(&a.0).then((a.2, a.4).cmp(&(b.2, b.4))));
    let blocks = &blocks[..blocks.len().min(top)];
    // Source lines from each module's DWARF, when it is still there.
    let mut lines: HashMap<usize, aetrace_analysis::lines::Lines> = HashMap::new();
    for &(_, _, m, _, _) in blocks {
        lines.entry(m).or_insert_with(|| {
            aetrace_analysis::elf::Module::open(Path::new(mods[m].path))
                .map(|x| aetrace_analysis::lines::Lines::load(&x))
                .unwrap_or_default()
        });
    }
    writeln!(
        w,
        "\nhottest blocks:\n{:>14} {:>12} {:>18}  procedure  module  source",
        "instructions", "count", "address"
    )?;
    for (n, k, m, name, at) in blocks {
        let src = lines[m]
            .at(*at)
            .map(|(f, l)| format!("{f}:{l}"))
            .unwrap_or_default();
        writeln!(
            w,
            "{n:>14} {k:>12} {at:>#18x}  {name}  {}  {src}",
            mods[*m].name
        )?;
    }
    let failed: Vec<_> = all().filter(|(_, q)| q.error.is_some()).collect();
    if !failed.is_empty() {
        writeln!(w, "\ncounts not recovered:")?;
        for (m, q) in failed {
            writeln!(
                w,
                "  {} ({}): {}",
                q.name,
                m.name,
                q.error.as_deref().unwrap_or("")
            )?;
        }
    }
    Ok(())
}

/// The callgrind format (`positions: instr line`, `events: Ir`), link-time
/// addresses: one `ob=` per module, one `fn=` per profiled procedure with
/// one line per executed instruction, a `jcnd=taken/executed` line per
/// executed conditional jump, and `calls=` lines with each call site's
/// count and inclusive cost ([`crate::inclusive`]; the calls no known site
/// explains come from a function `(outside the profiled code)`). Source
/// files and lines come from each module's DWARF line table, as callgrind
/// writes them: `fl=` the file of the procedure's entry, `fi=`/`fe=` where
/// an instruction's file differs (inlined code), `cfi=` the callee's.
/// `callgrind_annotate` (also `--inclusive=yes`, `--auto=yes`) and
/// KCachegrind read it.
pub fn callgrind(p: &Profile, w: &mut dyn Write) -> Result<()> {
    const OUTSIDE: &str = "(outside the profiled code)";
    writeln!(w, "# callgrind format\nversion: 1\ncreator: aetrace")?;
    writeln!(w, "cmd: {} {}", p.program, p.args.join(" "))?;
    writeln!(w, "positions: instr line\nevents: Ir")?;
    let mods = p.modules();
    let graph = crate::inclusive::build(p);
    let mut calls_of: HashMap<crate::inclusive::Node, Vec<&crate::inclusive::CallLine>> =
        HashMap::new();
    for c in &graph.calls {
        calls_of.entry(c.caller).or_default().push(c);
    }
    let lines: Vec<aetrace_analysis::lines::Lines> = mods
        .iter()
        .map(|m| {
            aetrace_analysis::elf::Module::open(Path::new(m.path))
                .map(|x| aetrace_analysis::lines::Lines::load(&x))
                .unwrap_or_default()
        })
        .collect();
    // Code without line information is in `???`, as for callgrind; a
    // library's is named apart from the executable's, so that
    // callgrind_annotate (which names a function `file:name`) does not
    // merge procedures of two modules.
    let unknown: Vec<String> = (0..mods.len())
        .map(|m| match m {
            0 => "???".to_string(),
            _ => format!("??? ({})", mods[m].name),
        })
        .collect();
    let source = |m: usize, addr: u64| -> (&str, u32) {
        lines[m].path_at(addr).unwrap_or((unknown[m].as_str(), 0))
    };
    let entry = |(m, i): crate::inclusive::Node| {
        let q = &mods[m].procs[i];
        (
            q.name.as_str(),
            q.blocks.get(q.entry as usize).map_or(0, |b| b.start),
        )
    };
    // The called function (`cob=` when its object differs, its file),
    // `calls=` and the position line holding the calls' inclusive cost.
    let call = |w: &mut dyn Write,
                from: usize,
                to: crate::inclusive::Node,
                n: u64,
                (at, line): (u64, u32),
                cost: u64| {
        if to.0 != from {
            writeln!(w, "cob={}", mods[to.0].path)?;
        }
        let (name, start) = entry(to);
        writeln!(w, "cfi={}", source(to.0, start).0)?;
        writeln!(w, "cfn={name}\ncalls={n} {start:#x}\n{at:#x} {line} {cost}")
    };
    let mut total = 0u64;
    for (m, module) in mods.iter().enumerate() {
        writeln!(w, "ob={}", module.path)?;
        for (i, q) in module.procs.iter().enumerate() {
            let Some(c) = &q.counts else { continue };
            // Blocks may share instructions (a jump into a block's middle):
            // each address once, with the sum.
            let mut ir: BTreeMap<u64, u64> = BTreeMap::new();
            for (b, &k) in q.blocks.iter().zip(&c.blocks) {
                if k == 0 {
                    continue;
                }
                for &off in &b.insns {
                    *ir.entry(b.start + u64::from(off)).or_default() += k;
                }
            }
            if ir.is_empty() {
                continue;
            }
            let fl = source(m, entry((m, i)).1).0;
            writeln!(w, "fl={fl}\nfn={}", q.name)?;
            // The file of the position lines written since the last `fl=`,
            // `fi=` or `fe=`; `fi=` enters another one, `fe=` comes back.
            let mut current = fl;
            let mut position = |w: &mut dyn Write, at: u64| -> Result<(u64, u32)> {
                let (file, line) = source(m, at);
                if file != current {
                    let key = if file == fl { "fe" } else { "fi" };
                    writeln!(w, "{key}={file}")?;
                    current = file;
                }
                Ok((at, line))
            };
            for (a, k) in ir {
                let (_, line) = position(w, a)?;
                writeln!(w, "{a:#x} {line} {k}")?;
                total += k;
            }
            // Conditional jumps: blocks with a taken and a fall-through edge.
            if let Some(edges) = &c.edges {
                for (e, &(from, to, ref kind)) in q.edges.iter().enumerate() {
                    // `get`: a profile read from disk may have fewer counts
                    // than edges (fuzzing found one).
                    let (Some(b), Some(&n), Some(&taken)) = (
                        q.blocks.get(from as usize),
                        c.blocks.get(from as usize),
                        edges.get(e),
                    ) else {
                        continue;
                    };
                    let conditional =
                        kind == "taken" && q.edges.iter().any(|x| x.0 == from && x.2 == "fall");
                    let Some(target) = q.blocks.get(to as usize).filter(|_| conditional && n > 0)
                    else {
                        continue;
                    };
                    let at = b.start + u64::from(b.insns.last().copied().unwrap_or(0));
                    let (_, line) = position(w, at)?;
                    writeln!(w, "jcnd={taken}/{n} {:#x}\n{at:#x} {line}", target.start)?;
                }
            }
            for c in calls_of.get(&(m, i)).into_iter().flatten() {
                let site = position(w, c.site)?;
                call(w, m, c.callee, c.count, site, c.inclusive)?;
            }
        }
    }
    if !graph.outside.is_empty() {
        writeln!(w, "ob=???\nfl=???\nfn={OUTSIDE}")?;
        for &(to, n, cost) in &graph.outside {
            call(w, usize::MAX, to, n, (0, 0), cost)?;
        }
    }
    writeln!(w, "totals: {total}")?;
    Ok(())
}

/// The report formats of `aetrace report`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Format {
    /// Totals, the hottest procedures and blocks ([`text`]).
    Text,
    /// One object per procedure with its counts ([`json`]).
    Json,
    /// callgrind's format, for callgrind_annotate and KCachegrind ([`callgrind`]).
    Callgrind,
}

/// Writes the report of `p` in `format` (`top`: how many procedures and
/// blocks the text report shows).
pub fn write(p: &Profile, format: Format, top: usize, w: &mut dyn Write) -> Result<()> {
    match format {
        Format::Text => text(p, top, w),
        Format::Callgrind => callgrind(p, w),
        Format::Json => json(p, w),
    }
}

/// The JSON report: per procedure its module, instructions, counts or
/// error, and block starts.
pub fn json(p: &Profile, w: &mut dyn Write) -> Result<()> {
    let by_proc: Vec<_> = p
        .modules()
        .iter()
        .flat_map(|m| m.procs.iter().map(move |q| (m.name, q)))
        .filter(|(_, q)| q.counts.is_some() || q.error.is_some())
        .map(|(module, q)| {
            serde_json::json!({
                "name": q.name,
                "module": module,
                "instructions": q.instructions(),
                "counts": q.counts,
                "error": q.error,
                "blocks": q.blocks.iter().map(|b| b.start).collect::<Vec<_>>(),
            })
        })
        .collect();
    let v = serde_json::json!({
        "program": p.program, "status": p.status, "increments": p.increments,
        "placement": p.placement, "weights": p.weights, "procedures": by_proc,
    });
    serde_json::to_writer(&mut *w, &v).map_err(std::io::Error::from)?;
    writeln!(w)?;
    Ok(())
}
