//! `aetrace info TRACE [--json]`: what a trace holds (the container's
//! [`aetrace_format::Stats`]: modules, threads, chunks, witness bytes raw and
//! compressed), which procedures each instrumented module traced and which
//! it left alone and why (its program database), and, by regenerating every
//! thread, the executed instructions the witnesses stand for: bits per
//! executed instruction, the paper's measure of trace size (paper 003,
//! Table 3), and where a thread's trace stops being the native program's
//! ([`crate::departure`]).
//!
//! Invariant: every figure is measured from the file; an instruction count
//! is only reported when every thread regenerates without error (otherwise
//! the error is reported instead, and the sizes still are).

use std::io::Write;
use std::path::Path;

use aetrace_format::progdb::{ProcStatus, ProgramDb};
use aetrace_format::section::module_flags;
use aetrace_format::{Module, Stats, Trace, TraceFile};
use serde::Serialize;

use crate::output::{totals, Options};
use crate::{Error, Result};

/// A procedure an instrumented module left alone.
#[derive(Clone, Debug, Serialize)]
pub struct LeftAlone {
    /// The procedure's symbol name.
    pub name: String,
    /// Why the rewriter left it alone.
    pub reason: String,
}

/// One instrumented module's program database, summarised.
#[derive(Clone, Debug, Serialize)]
pub struct ModuleProcs {
    /// The module's path as recorded in the trace.
    pub path: String,
    /// Procedures in the program database.
    pub procedures: usize,
    /// Procedures traced.
    pub traced: usize,
    /// Witness edges of the traced procedures.
    pub witness_edges: usize,
    /// The procedures left alone, with reasons.
    pub left_alone: Vec<LeftAlone>,
}

/// Everything `aetrace info` reports.
#[derive(Clone, Debug, Serialize)]
pub struct Info {
    #[serde(flatten)]
    /// The trace's own figures (modules, threads, chunks, witness bytes).
    pub stats: Stats,
    /// One summary per instrumented module.
    pub programs: Vec<ModuleProcs>,
    /// Executed instructions regenerated per thread (thread order of
    /// `stats.threads`), when regeneration succeeded.
    pub instructions: Option<Vec<u64>>,
    /// How each thread a signal killed ends ([`crate::Ending`]).
    pub endings: Vec<String>,
    /// Where a thread's trace stops being the native program's
    /// ([`crate::Departure`]), when regeneration succeeded.
    pub departures: Vec<crate::Departure>,
    /// Why `instructions` is missing.
    pub regen_error: Option<String>,
    /// The trace's notes other than the procedures left alone (listed per
    /// program): libraries left alone or never loaded, fault injection,
    /// what a stripped static program's rewrite recognised.
    pub remarks: Vec<String>,
    /// Witness stream bits per executed instruction, uncompressed (when instructions are known).
    pub bits_per_instruction_raw: Option<f64>,
    /// Witness stream bits per executed instruction, as stored compressed.
    pub bits_per_instruction_compressed: Option<f64>,
    /// `record --data`: the VALUE records of all threads (each
    /// 10 bytes of witness stream), when a module was recorded with data.
    pub data_values: Option<u64>,
    /// Why a data trace's values could not be read (a SIGNAL: not
    /// supported yet, docs/data.md).
    pub data_error: Option<String>,
    /// A control-only trace of format 1.21 or later: each outside
    /// entry's `rsp` (`MINOR_ENTRY_RSP`), a VALUE record or repeated by
    /// an ENTER_SAME.
    pub entry_values: Option<u64>,
    /// Of [`Info::entry_values`], those ENTER_SAME records repeat (no
    /// VALUE written).
    pub entry_values_repeated: Option<u64>,
}

/// Executed instructions of each thread, in the order of `trace.threads()`
/// (the `--count` regeneration: no output is formatted).
fn instructions<B: AsRef<[u8]> + Sync>(trace: &Trace<B>) -> Result<(Vec<u64>, Vec<String>)> {
    let totals = totals(trace, &Options::default())?;
    let endings = totals.endings.iter().map(|e| e.to_string()).collect();
    let per_thread = trace
        .threads()
        .map(|t| {
            totals
                .threads
                .iter()
                .filter(|x| x.thread == t.start.thread)
                .map(|x| x.instructions)
                .sum()
        })
        .collect();
    Ok((per_thread, endings))
}

/// Gathers [`Info`] for the trace at `path`.
pub fn info(path: &Path) -> Result<Info> {
    info_of(&TraceFile::open(path)?)
}

/// Gathers [`Info`] for a parsed trace.
pub fn info_of<B: AsRef<[u8]> + Sync>(trace: &Trace<B>) -> Result<Info> {
    let stats = trace.stats();
    let mut programs = Vec::new();
    // A database shared by an exec'd image (IMAGE) is its first module's.
    let shared = |m: &&Module| {
        trace
            .images()
            .iter()
            .any(|i| i.module == m.id && i.database.is_some())
    };
    for m in trace.modules().iter().filter(|m| !shared(m)) {
        let Some(db) = trace.program_database(m.id) else {
            continue;
        };
        let db = ProgramDb::decode(&db.decompress()?)?;
        let left_alone: Vec<LeftAlone> = db
            .procs
            .iter()
            .filter_map(|p| match &p.status {
                ProcStatus::LeftAlone(r) => Some(LeftAlone {
                    name: p.name.clone(),
                    reason: r.clone(),
                }),
                ProcStatus::Traced => None,
            })
            .collect();
        programs.push(ModuleProcs {
            path: String::from_utf8_lossy(&m.path).into_owned(),
            procedures: db.procs.len(),
            traced: db.procs.len() - left_alone.len(),
            witness_edges: db
                .procs
                .iter()
                .map(|p| p.edges.iter().filter(|e| e.witness.is_some()).count())
                .sum(),
            left_alone,
        });
    }
    let (instructions, endings, regen_error) = match instructions(trace) {
        Ok((v, e)) => (Some(v), e, None),
        Err(e) => (None, Vec::new(), Some(e.to_string())),
    };
    let departures = match instructions {
        Some(_) => crate::departures(trace, &Options::default())?,
        None => Vec::new(),
    };
    let total: Option<u64> = instructions.as_ref().map(|v| v.iter().sum());
    let per = |bytes: u64| {
        total
            .filter(|&n| n > 0)
            .map(|n| bytes as f64 * 8.0 / n as f64)
    };
    // "procedure NAME at ADDR left alone: ..." repeats `left_alone`.
    let data = trace
        .modules()
        .iter()
        .any(|m| m.flags & (module_flags::DATA_CHECK | module_flags::DATA_ABS) != 0);
    let entry_rsp = trace.header().minor >= aetrace_format::header::MINOR_ENTRY_RSP;
    // A stream the values cannot be read from (an older format) reports why.
    let (values, data_error) = match (data || entry_rsp).then(|| {
        trace
            .threads()
            .map(|t| crate::DataCursor::new(trace, t.start.thread)?.count())
            .try_fold((0, 0), |(n, r), c| c.map(|(m, s)| (n + m, r + s)))
    }) {
        Some(Ok(n)) => (Some(n), None),
        Some(Err(e)) => (None, Some(e.to_string())),
        None => (None, None),
    };
    let (data_values, entry_values) = match data {
        true => (values.map(|v| v.0), None),
        false => (None, values),
    };
    let remarks = trace
        .notes()
        .iter()
        .filter(|n| !(n.text.starts_with("procedure ") && n.text.contains(" left alone: ")))
        .map(|n| n.text.clone())
        .collect();
    Ok(Info {
        remarks,
        bits_per_instruction_raw: per(stats.raw_bytes),
        bits_per_instruction_compressed: per(stats.compressed_bytes),
        data_values,
        data_error,
        entry_values: entry_values.map(|v| v.0),
        entry_values_repeated: entry_values.map(|v| v.1),
        stats,
        programs,
        instructions,
        endings,
        departures,
        regen_error,
    })
}

/// `aetrace info`: prints [`Info`] as text or JSON.
pub fn info_command(path: &Path, json: bool, out: &mut dyn Write) -> Result<()> {
    write_info(&info(path)?, json, out)
}

/// Prints `i` as text or JSON.
pub fn write_info(i: &Info, json: bool, out: &mut dyn Write) -> Result<()> {
    let text = if json {
        serde_json::to_string_pretty(i).map_err(|e| Error::Usage(e.to_string()))? + "\n"
    } else {
        let mut s = i.stats.to_string();
        for r in &i.remarks {
            s += &format!("  note: {r}\n");
        }
        for p in &i.programs {
            s += &format!(
                "program {}: {} procedures, {} traced ({} witness edges), {} left alone\n",
                p.path,
                p.procedures,
                p.traced,
                p.witness_edges,
                p.left_alone.len()
            );
            for l in &p.left_alone {
                s += &format!("  left alone: {}: {}\n", l.name, l.reason);
            }
        }
        match (&i.instructions, &i.regen_error) {
            (Some(v), _) => {
                s += &format!(
                    "executed instructions: {} ({})\n",
                    v.iter().sum::<u64>(),
                    v.iter()
                        .enumerate()
                        .map(|(t, n)| format!("thread {t}: {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                if let (Some(r), Some(c)) = (
                    i.bits_per_instruction_raw,
                    i.bits_per_instruction_compressed,
                ) {
                    s += &format!("bits per executed instruction: {r:.4} raw, {c:.4} compressed\n");
                }
            }
            (None, Some(e)) => s += &format!("regeneration failed: {e}\n"),
            (None, None) => {}
        }
        if let Some(n) = i.data_values {
            s += &format!(
                "data values: {n} ({} bytes of witness stream, raw)\n",
                n * 10
            );
        }
        if let (Some(n), Some(r)) = (i.entry_values, i.entry_values_repeated) {
            s += &format!(
                "entry values (each outside entry's rsp): {n}, {r} repeating the last \
                 (ENTER_SAME) ({} bytes of witness stream, raw)\n",
                (n - r) * 10
            );
        }
        if let Some(e) = &i.data_error {
            s += &format!("data values not read: {e}\n");
        }
        for e in &i.endings {
            s += &format!("{e}\n");
        }
        for d in &i.departures {
            s += &format!("{d}\n");
        }
        s
    };
    out.write_all(text.as_bytes()).map_err(Error::Output)
}
