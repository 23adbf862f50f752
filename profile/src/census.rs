//! The data-reference census weighted by a profile's block counts (issue
//! 21 point 1, `docs/data-census.md`): each module of the profile is
//! analysed again ([`aetrace_analysis::addr::census`]), and every
//! reference, opaque definition and entry value is weighted by the count
//! of its block (its procedure's invocations for entry values).
//!
//! Invariants: blocks are matched by link-time start address; a procedure
//! whose entry block has no count (left alone by the profiler, or a CFG
//! that differs) is listed in `uncounted` and weighs nothing, so
//! `instructions` equals the profile's own count of the matched
//! procedures. A `rep` instruction's references are weighted by its
//! count when `rcx` is a known constant, else once per execution of its
//! block (`rep_unknown`: the iteration counts are not in a profile).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use aetrace_analysis::addr::census::{Class, ProcCensus};
use aetrace_analysis::addr::{decode_blocks, ProcProgram};
use aetrace_analysis::{Procedure, Program};
use aetrace_graph::EntityRef;
use serde::Serialize;

use crate::{ModuleRef, Profile, Result};

/// One module's weighted census.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ModuleCensus {
    /// The executable's file name or the library's DT_NEEDED name.
    pub name: String,
    /// Instructions executed in counted procedures.
    pub instructions: u64,
    /// References executed, per class (`Class::ALL` order).
    pub classes: BTreeMap<&'static str, u64>,
    /// References executed per lackey form (`L8`, `S4`, `M16`, ...).
    pub forms: BTreeMap<String, u64>,
    /// Of them, references of `rep` instructions whose count is not known
    /// statically, weighted once per execution.
    pub rep_unknown: u64,
    /// Bytes of the opaque definitions that feed addresses, each counted
    /// at every execution of its block.
    pub recorded_bytes: u64,
    /// Bytes of entry values addresses depend on (8 per invocation and
    /// register), if no caller supplies them.
    pub entry_bytes: u64,
    /// Procedures whose stack slots were not followed (a stack address
    /// escapes), weighted by invocations.
    pub escaped_invocations: u64,
    /// All invocations of counted procedures.
    pub invocations: u64,
    /// Procedures of the module without counts: name and address ranges.
    pub uncounted: Vec<(String, Vec<(u64, u64)>)>,
}

impl ModuleCensus {
    /// All references executed.
    pub fn refs(&self) -> u64 {
        self.classes.values().sum()
    }
}

/// The census of every module of `profile`.
pub fn weigh(profile: &Profile) -> Result<Vec<ModuleCensus>> {
    profile.modules().iter().map(weigh_module).collect()
}

/// Block counts of a module: block start -> count, and procedure entry ->
/// invocations.
fn counts_of(m: &ModuleRef<'_>) -> (HashMap<u64, u64>, HashMap<u64, u64>) {
    let mut blocks = HashMap::new();
    let mut invocations = HashMap::new();
    for p in m.procs {
        let Some(c) = &p.counts else { continue };
        for (b, n) in p.blocks.iter().zip(&c.blocks) {
            blocks.insert(b.start, *n);
        }
        if let Some(e) = p.blocks.get(p.entry as usize) {
            invocations.insert(e.start, c.invocations);
        }
    }
    (blocks, invocations)
}

fn weigh_module(m: &ModuleRef<'_>) -> Result<ModuleCensus> {
    let path = Path::new(m.path);
    let prog = Program::open(path).map_err(|source| crate::Error::Analysis {
        path: path.to_path_buf(),
        source,
    })?;
    let (blocks, invocations) = counts_of(m);
    let mut out = ModuleCensus {
        name: m.name.to_string(),
        classes: Class::ALL.iter().map(|c| (c.as_str(), 0)).collect(),
        ..ModuleCensus::default()
    };
    for p in prog.procs.values() {
        let Some(&calls) = invocations.get(&p.start) else {
            if p.cfg.is_ok() {
                out.uncounted.push((p.name.clone(), p.ranges.clone()));
            }
            continue;
        };
        match census_of(&prog, p) {
            Some(c) => add_proc(&mut out, p, &c, &blocks, calls),
            None => out.uncounted.push((p.name.clone(), p.ranges.clone())),
        }
    }
    Ok(out)
}

/// The census of one procedure (none when its CFG was not recovered or
/// does not decode).
fn census_of(prog: &Program, p: &Procedure) -> Option<ProcCensus> {
    let cfg = p.cfg.as_ref().ok()?;
    let insns = decode_blocks(&prog.module, cfg).ok()?;
    let program = ProcProgram::new(cfg, &insns, &p.entries, &p.landing_pads);
    Some(ProcCensus::of(&program))
}

fn add_proc(
    out: &mut ModuleCensus,
    p: &Procedure,
    c: &ProcCensus,
    blocks: &HashMap<u64, u64>,
    calls: u64,
) {
    let Ok(cfg) = &p.cfg else { return };
    let count = |b: usize| {
        blocks
            .get(&cfg.blocks.as_slice()[b].start)
            .copied()
            .unwrap_or(0)
    };
    for (b, refs) in c.blocks.iter().enumerate() {
        let n = count(b);
        out.instructions += n * cfg.blocks.as_slice()[b].insns.len() as u64;
        for r in refs {
            let k = n * r.times.unwrap_or(1);
            *out.classes.entry(r.class.as_str()).or_default() += k;
            *out.forms
                .entry(format!("{}{}", r.access.letter(), r.size))
                .or_default() += k;
            out.rep_unknown += if r.times.is_none() { n } else { 0 };
            out.recorded_bytes += k * u64::from(r.own_bytes);
        }
    }
    for s in c.sites.iter().filter(|s| s.feeds_address) {
        out.recorded_bytes += count(s.block.index()) * u64::from(s.width);
    }
    out.entry_bytes += calls * 8 * u64::from(c.entry_values);
    out.invocations += calls;
    if !c.slots_followed {
        out.escaped_invocations += calls;
    }
}
