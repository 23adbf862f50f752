//! Ball-Larus path profiles as data (paper 001, *Efficient Path
//! Profiling*): the [`PathProfile`] (JSON, `docs/profile.md`) holds each
//! procedure's blocks, edges, back edges and every executed path with its
//! count; the reports list the hottest paths with `file:line` from DWARF
//! when present.
//!
//! Invariants: every path listed regenerates from its id and has a
//! non-zero count; `executed` is the number of listed paths.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{BlockProfile, Counts, Result};

/// Version of the path profile format (`docs/profile.md`).
pub const VERSION: u32 = 1;

/// A path profile: one run of one program.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PathProfile {
    /// The path profile format's version ([`VERSION`]).
    pub version: u32,
    /// The program profiled (absolute path) and its arguments.
    pub program: String,
    /// The arguments the program was run with, after its path.
    pub args: Vec<String>,
    /// `exited N` or `killed by signal N`.
    pub status: String,
    /// Most paths a procedure may have for path counters.
    pub path_limit: u64,
    /// Path counter increments the run executed (sum of path counts).
    pub path_increments: u64,
    /// Edge counter increments of the procedures profiled by edges.
    pub edge_increments: u64,
    /// Wall time of the run, seconds.
    pub run_seconds: f64,
    /// The executable's procedures.
    pub procs: Vec<ProcPathProfile>,
    /// The `--libs` libraries, one section each (absent: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub libs: Vec<LibPathProfile>,
    /// Libraries left alone by `--libs all`, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// The path profile of one `--libs` library.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LibPathProfile {
    /// Its DT_NEEDED name (`libbz2.so.1.0`).
    pub name: String,
    /// The file profiled (absolute path).
    pub path: String,
    /// Its procedures; addresses are link-time.
    pub procs: Vec<ProcPathProfile>,
}

/// One module's section of a path profile, for the reports.
struct Section<'p> {
    /// `None` for the executable; a library's DT_NEEDED name.
    lib: Option<&'p str>,
    path: &'p str,
    procs: &'p [ProcPathProfile],
}

impl PathProfile {
    /// The executable's section, then each library's.
    fn sections(&self) -> Vec<Section<'_>> {
        std::iter::once(Section {
            lib: None,
            path: &self.program,
            procs: &self.procs,
        })
        .chain(self.libs.iter().map(|l| Section {
            lib: Some(&l.name),
            path: &l.path,
            procs: &l.procs,
        }))
        .collect()
    }
}

/// One procedure of the path profile.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcPathProfile {
    /// The procedure's name (its symbol, `import@plt`, or `sub_<hex>`).
    pub name: String,
    /// Why it was not profiled, when it was not (its code ran uncounted).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub left_alone: Option<String>,
    /// `paths`, or `edges` (more than `path_limit` paths: edge profile).
    pub mode: String,
    /// Entry block.
    pub entry: u32,
    /// Link-time start of each block and its instruction offsets.
    pub blocks: Vec<BlockProfile>,
    /// `[from, to, kind]`; `to == blocks.len()` is EXIT (kinds as in the
    /// edge profile).
    pub edges: Vec<(u32, u32, String)>,
    /// Back edges `[from, to]` (blocks): paths end and restart there.
    pub back_edges: Vec<(u32, u32)>,
    /// Call blocks whose frame may be left active by `exit`.
    pub virtual_exits: Vec<u32>,
    /// Acyclic paths of the procedure (0 for an edge-profiled one: more
    /// than `path_limit`).
    pub num_paths: u64,
    /// Distinct paths executed.
    pub executed: u64,
    /// Path executions (sum of the counts).
    pub total: u64,
    /// Every executed path, hottest first (ties by id).
    pub paths: Vec<PathCount>,
    /// Edge-profiled procedures: the recovered edge profile.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub edge_counts: Option<Counts>,
    /// Why count recovery failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
}

/// One executed path.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PathCount {
    /// The Ball–Larus path id (`0..num_paths`).
    pub id: u64,
    /// How many times the path executed.
    pub count: u64,
    /// `entry` (starts at the entry block) or `loop` (after a back edge).
    pub start: String,
    /// `exit` (leaves the procedure), `back` (takes a back edge) or
    /// `active` (its frame was still active at a call when the process
    /// ended).
    pub end: String,
    /// Block indices.
    pub blocks: Vec<u32>,
}

/// Reads a path profile file.
pub fn read(path: &Path) -> Result<PathProfile> {
    crate::read_versioned(path, "path profile", VERSION, |p: &PathProfile| p.version)
}

/// Parses the bytes of a path profile file; `name` names it in errors.
pub fn parse(bytes: &[u8], name: &Path) -> Result<PathProfile> {
    crate::parse_versioned(bytes, name, "path profile", VERSION, |p: &PathProfile| {
        p.version
    })
}

/// The procedures with executed paths over all sections (by section
/// index), hottest (most path executions) first.
fn hottest<'p>(secs: &[Section<'p>]) -> Vec<(usize, &'p ProcPathProfile)> {
    let mut v: Vec<(usize, &ProcPathProfile)> = secs
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.procs.iter().map(move |q| (i, q)))
        .filter(|(_, q)| q.total > 0)
        .collect();
    v.sort_by(|a, b| b.1.total.cmp(&a.1.total).then(a.1.name.cmp(&b.1.name)));
    v
}

/// A procedure's name in the reports; a library's carries its name.
fn shown(s: &Section<'_>, q: &ProcPathProfile) -> String {
    match s.lib {
        None => q.name.clone(),
        Some(l) => format!("{} ({l})", q.name),
    }
}

/// Each section's line table (empty without DWARF).
fn lines_of(secs: &[Section<'_>]) -> Vec<aetrace_analysis::lines::Lines> {
    secs.iter()
        .map(|s| {
            aetrace_analysis::elf::Module::open(Path::new(s.path))
                .map(|m| aetrace_analysis::lines::Lines::load(&m))
                .unwrap_or_default()
        })
        .collect()
}

/// The procedures profiled by edges instead of paths.
fn edge_profiled(secs: &[Section<'_>]) -> Vec<String> {
    secs.iter()
        .flat_map(|s| {
            s.procs
                .iter()
                .filter(|q| q.mode == "edges")
                .map(move |q| shown(s, q))
        })
        .collect()
}

/// The text report: per hot procedure, its hottest paths as block
/// sequences with source lines.
pub fn text_report(p: &PathProfile, top: usize, w: &mut dyn Write) -> Result<()> {
    writeln!(w, "program: {} {}", p.program, p.args.join(" "))?;
    writeln!(
        w,
        "status: {}; {} path counter increments, {} edge counter increments",
        p.status, p.path_increments, p.edge_increments
    )?;
    for n in &p.notes {
        writeln!(w, "note: {n}")?;
    }
    let secs = p.sections();
    let edges = edge_profiled(&secs);
    if !edges.is_empty() {
        writeln!(
            w,
            "edge-profiled (more than {} paths): {}",
            p.path_limit,
            edges.join(", ")
        )?;
    }
    let lines = lines_of(&secs);
    for (i, q) in hottest(&secs).into_iter().take(top) {
        writeln!(
            w,
            "\n{}: {} of {} paths executed, {} path executions",
            shown(&secs[i], q),
            q.executed,
            q.num_paths,
            q.total
        )?;
        for path in q.paths.iter().take(top) {
            let blocks: Vec<String> = path
                .blocks
                .iter()
                .map(|&b| {
                    let at = q.blocks.get(b as usize).map_or(0, |b| b.start);
                    match lines[i].at(at) {
                        Some((f, l)) => {
                            let f = f.rsplit('/').next().unwrap_or(f);
                            format!("{at:#x} ({f}:{l})")
                        }
                        None => format!("{at:#x}"),
                    }
                })
                .collect();
            writeln!(
                w,
                "{:>12}  [{}] {} [{}]",
                path.count,
                path.start,
                blocks.join(" -> "),
                path.end
            )?;
        }
    }
    let failed: Vec<String> = secs
        .iter()
        .flat_map(|s| {
            s.procs.iter().filter_map(move |q| {
                q.error
                    .as_deref()
                    .map(|e| format!("  {}: {e}", shown(s, q)))
            })
        })
        .collect();
    if !failed.is_empty() {
        writeln!(w, "\ncounts not recovered:")?;
        for f in failed {
            writeln!(w, "{f}")?;
        }
    }
    Ok(())
}

/// The JSON report: the text report's content with addresses and lines.
pub fn json_report(p: &PathProfile, top: usize, w: &mut dyn Write) -> Result<()> {
    let secs = p.sections();
    let lines = lines_of(&secs);
    let procs: Vec<_> = hottest(&secs)
        .into_iter()
        .take(top)
        .map(|(i, q)| {
            let paths: Vec<_> = q
                .paths
                .iter()
                .take(top)
                .map(|path| {
                    let blocks: Vec<_> = path
                        .blocks
                        .iter()
                        .map(|&b| {
                            let at = q.blocks.get(b as usize).map_or(0, |b| b.start);
                            let src = lines[i].at(at).map(|(f, l)| format!("{f}:{l}"));
                            serde_json::json!({ "address": at, "source": src })
                        })
                        .collect();
                    serde_json::json!({
                        "id": path.id, "count": path.count, "start": path.start,
                        "end": path.end, "blocks": blocks,
                    })
                })
                .collect();
            serde_json::json!({
                "name": q.name, "module": secs[i].lib, "num_paths": q.num_paths,
                "executed": q.executed, "total": q.total, "paths": paths,
            })
        })
        .collect();
    let v = serde_json::json!({
        "program": p.program, "status": p.status,
        "path_increments": p.path_increments, "edge_increments": p.edge_increments,
        "edge_profiled": edge_profiled(&secs), "procedures": procs,
    });
    serde_json::to_writer(&mut *w, &v).map_err(std::io::Error::from)?;
    writeln!(w)?;
    Ok(())
}
