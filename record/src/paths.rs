//! `aetrace paths`: Ball-Larus path profiles of unmodified binaries
//! (paper 001, *Efficient Path Profiling*).
//!
//! The program is rewritten in counting mode with path counters
//! ([`aetrace_rewrite::pathprof`]: the path register per activation, dense
//! counters per procedure, edge counters for procedures past
//! [`PATH_LIMIT`]), run with its counters on a memfd (so a killed program
//! leaves them, [`crate::counted`]), and every counted path id is
//! regenerated into its block sequence by `graph::paths`. The
//! [`PathProfile`] (JSON, `docs/profile.md`) holds each procedure's blocks,
//! edges, back edges and every executed path with its count; the report
//! lists the hottest paths with `file:line` from DWARF when present.
//!
//! Invariants: every path listed regenerates from its id and has a
//! non-zero count; `executed` is the number of listed paths; the profile
//! is written to a temporary name and renamed ([`aetrace_format::atomic`]).

use std::ffi::OsString;
use std::path::PathBuf;

use aetrace_format::progdb::ProcStatus;
use aetrace_graph::{BlockId, EntityRef};

use crate::launch::Outcome;
use crate::libs::LibSelection;
use aetrace_profile::paths::{
    json_report, text_report, LibPathProfile, PathCount, PathProfile, ProcPathProfile, VERSION,
};
use aetrace_profile::skeleton;

use crate::counted::{fill, layout_err, rewrite_and_run, Rewritten};
use crate::error::CountError;
use crate::Result;
use aetrace_format::atomic::write_atomic;
use aetrace_rewrite::counters::CountSpec;
use aetrace_rewrite::pathprof::{ProcPaths, PATH_LIMIT};

/// Options of `aetrace paths`.
pub struct PathsOptions {
    /// Profile file (default: PROGRAM's base name + `.apath`).
    pub output: Option<PathBuf>,
    /// Procedures, and paths of each, listed by the report.
    pub top: usize,
    /// Report as JSON instead of text.
    pub json: bool,
    /// Shared libraries profiled too.
    pub libs: LibSelection,
    /// The program to run (a path, or a name looked up on `PATH`).
    pub program: PathBuf,
    /// Its arguments after `argv[0]`.
    pub args: Vec<OsString>,
}

/// The executed paths of a procedure with path counters.
fn paths_of(pp: &ProcPaths, counts: &[u64], blocks: usize) -> Result<Vec<PathCount>> {
    let mut out = Vec::new();
    for (id, &count) in counts.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let id = id as u64;
        let p = pp
            .numbering
            .regenerate(id)
            .map_err(|source| CountError::Path { id, source })?;
        let mut bl: Vec<u32> = p
            .blocks
            .iter()
            .filter(|b| b.index() < blocks)
            .map(|b| b.index() as u32)
            .collect();
        let ends_at_exit = !p.at_back_edge && bl.len() < p.blocks.len();
        debug_assert!(p.at_back_edge || ends_at_exit);
        let last = bl.last().map(|&b| BlockId::new(b as usize));
        let active = ends_at_exit && last.is_some_and(|b| pp.virtual_exits.contains(&b));
        bl.shrink_to_fit();
        out.push(PathCount {
            id,
            count,
            start: if p.after_back_edge { "loop" } else { "entry" }.into(),
            end: if p.at_back_edge {
                "back"
            } else if active {
                "active"
            } else {
                "exit"
            }
            .into(),
            blocks: bl,
        });
    }
    out.sort_by(|a, b| b.count.cmp(&a.count).then(a.id.cmp(&b.id)));
    Ok(out)
}

/// The path profile of one module from its counter words: its procedures,
/// and its path and edge counter increments.
fn module_paths(r: &Rewritten, values: &[u64]) -> Result<(Vec<ProcPathProfile>, u64, u64)> {
    let (ins, layout) = (&r.ins, &r.layout);
    let mut procs = Vec::with_capacity(ins.db.procs.len());
    let (mut path_increments, mut edge_increments) = (0u64, 0u64);
    for (i, d) in ins.db.procs.iter().enumerate() {
        let mut sk = skeleton(d);
        let mut q = ProcPathProfile {
            name: d.name.clone(),
            left_alone: match &d.status {
                ProcStatus::Traced => None,
                ProcStatus::LeftAlone(r) => Some(r.clone()),
            },
            mode: String::new(),
            entry: d.entry,
            blocks: std::mem::take(&mut sk.blocks),
            edges: std::mem::take(&mut sk.edges),
            back_edges: Vec::new(),
            virtual_exits: Vec::new(),
            num_paths: 0,
            executed: 0,
            total: 0,
            paths: Vec::new(),
            edge_counts: None,
            error: None,
        };
        if let Some(Some(pp)) = layout.paths.get(i) {
            q.mode = "paths".into();
            q.num_paths = pp.numbering.num_paths();
            q.virtual_exits = pp.virtual_exits.iter().map(|b| b.index() as u32).collect();
            q.back_edges = pp
                .back_edges
                .iter()
                .map(|&e| {
                    let (f, t, _) = &q.edges[e.index()];
                    (*f, *t)
                })
                .collect();
            let first = pp.first as usize;
            let counts = values
                .get(first..first + q.num_paths as usize)
                .ok_or_else(|| layout_err("path counters out of range"))?;
            q.paths = paths_of(pp, counts, q.blocks.len())?;
            q.executed = q.paths.len() as u64;
            q.total = q.paths.iter().map(|p| p.count).sum();
            path_increments += q.total;
        } else if let Some(Some(pc)) = layout.procs.get(i) {
            q.mode = "edges".into();
            sk.blocks.clone_from(&q.blocks);
            sk.edges.clone_from(&q.edges);
            fill(&mut sk, pc, values)?;
            edge_increments += sk.counters.iter().sum::<u64>();
            q.virtual_exits = sk.virtual_exits;
            q.edge_counts = sk.counts;
            q.error = sk.error;
        }
        procs.push(q);
    }
    Ok((procs, path_increments, edge_increments))
}

/// What [`paths`] did: how the program ended, and its report.
pub struct PathsRun {
    /// How the program ended.
    pub outcome: Outcome,
    /// The report (text or JSON) on the hottest paths.
    pub report: Vec<u8>,
}

/// `aetrace paths`: rewrites the program (and the `--libs` libraries) with
/// path counters, runs it with the same stdio, environment and arguments,
/// writes the path profile, and returns how the program ended with the
/// report.
pub fn paths(o: &PathsOptions) -> Result<PathsRun> {
    let exe = crate::commands::find_program(&o.program)?;
    let spec = CountSpec {
        paths: true,
        // The shadow stack of path registers is shared by the modules.
        threads: crate::counted::process_starts_threads(&exe)?,
        ..CountSpec::default()
    };
    let ran = rewrite_and_run(&exe, &o.program, &o.args, &o.libs, &spec)?;
    let empty = Vec::new();
    let values = |m: usize| ran.values.get(m).unwrap_or(&empty);
    let (procs, mut path_increments, mut edge_increments) = module_paths(&ran.exe, values(0))?;
    let mut libs = Vec::with_capacity(ran.libs.len());
    for (m, (lib, r)) in ran.libs.iter().enumerate() {
        let (procs, p, e) = module_paths(r, values(m + 1))?;
        path_increments += p;
        edge_increments += e;
        libs.push(LibPathProfile {
            name: lib.needed.clone(),
            path: lib
                .path
                .canonicalize()
                .unwrap_or_else(|_| lib.path.clone())
                .display()
                .to_string(),
            procs,
        });
    }
    let profile = PathProfile {
        version: VERSION,
        program: exe
            .canonicalize()
            .unwrap_or_else(|_| exe.clone())
            .display()
            .to_string(),
        args: o
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        status: match ran.outcome {
            Outcome::Exited(c) => format!("exited {c}"),
            Outcome::Signaled(s) => format!("killed by signal {s}"),
        },
        path_limit: PATH_LIMIT,
        path_increments,
        edge_increments,
        run_seconds: ran.seconds,
        procs,
        libs,
        notes: ran.notes,
    };
    let out = o
        .output
        .clone()
        .unwrap_or_else(|| crate::commands::default_output(&exe, ".apath"));
    let json = serde_json::to_vec(&profile).map_err(CountError::Json)?;
    write_atomic(&out, &json, None)?;
    let mut report = Vec::new();
    if o.json {
        json_report(&profile, o.top, &mut report)?;
    } else {
        text_report(&profile, o.top, &mut report)?;
    }
    Ok(PathsRun {
        outcome: ran.outcome,
        report,
    })
}
