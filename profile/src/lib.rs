//! `aetrace-profile`: optimal edge profiles and Ball-Larus path profiles as
//! data (paper 003 Section 3, QP, with Figure 4's early-exit correction;
//! paper 001 for paths).
//!
//! A [`Profile`] (JSON, `docs/profile.md`) holds each procedure's CFG, its
//! counter placement, the raw counters and the counts recovered from them
//! ([`recover`], on the counted graph of `graph::counted`), so reports and
//! feedback weights need nothing else. Reports: [`report`] (text, JSON,
//! callgrind), [`inclusive`] (inclusive costs over the call graph),
//! [`notes`] (where counts may be inexact), [`paths`] (path profiles).
//!
//! Invariants: recovered counts satisfy Kirchhoff's law at every vertex of
//! the counted graph (else the procedure carries an error instead of
//! counts). This crate runs nothing: the counted runs that fill a profile
//! live in `aetrace-record`.

pub mod census;
pub mod error;
pub mod inclusive;
pub mod notes;
pub mod paths;
pub mod report;

#[cfg(test)]
mod tests;

use std::path::Path;

use aetrace_format::progdb::{EdgeKindDb, ProcStatus};
use aetrace_graph::counted::{CountedEdge, Virtual};
use aetrace_graph::profile::{recover_counts, CounterPlacement};
use aetrace_graph::spanning::max_spanning_forest;
use aetrace_graph::{BlockId, EdgeId, EntityRef, SecondaryMap, VertexKind};
use serde::{Deserialize, Serialize};

pub use error::{Error, Result};

/// Version of the profile format (`docs/profile.md`).
pub const VERSION: u32 = 1;

pub(crate) fn perr(what: impl Into<String>) -> Error {
    Error::Profile { what: what.into() }
}

/// A profile: one run of one program.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Profile {
    /// The profile format's version ([`VERSION`]).
    pub version: u32,
    /// The program profiled (absolute path) and its arguments.
    pub program: String,
    /// The arguments the program was run with, after its path.
    pub args: Vec<String>,
    /// `optimal` or `every-block`.
    pub placement: String,
    /// `heuristic` or the feedback profile's path.
    pub weights: String,
    /// Increments are `lock add`.
    pub atomic: bool,
    /// `exited N` or `killed by signal N`.
    pub status: String,
    /// Sum of all counters: the increments the run executed.
    pub increments: u64,
    /// Wall time of the run (spawn to the last descendant's end), seconds.
    #[serde(default)]
    pub run_seconds: f64,
    /// The executable's procedures.
    pub procs: Vec<ProcProfile>,
    /// The `--libs` libraries, one section each (module tags 1, 2, ...).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub libs: Vec<LibProfile>,
    /// Libraries left alone by `--libs all`, and why.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub notes: Vec<String>,
}

/// The profile of one `--libs` library.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LibProfile {
    /// The DT_NEEDED name that loaded it.
    pub name: String,
    /// The original file.
    pub path: String,
    /// Its procedures; addresses are link-time, as for the executable.
    pub procs: Vec<ProcProfile>,
}

/// One module of a profile, the executable first.
#[derive(Clone, Copy, Debug)]
pub struct ModuleRef<'a> {
    /// The executable's file name, or a library's DT_NEEDED name.
    pub name: &'a str,
    /// The original file.
    pub path: &'a str,
    /// Its procedures; addresses are link-time.
    pub procs: &'a [ProcProfile],
}

impl Profile {
    /// Every module: the executable, then the libraries.
    pub fn modules(&self) -> Vec<ModuleRef<'_>> {
        let exe = ModuleRef {
            name: self.program.rsplit('/').next().unwrap_or(&self.program),
            path: &self.program,
            procs: &self.procs,
        };
        std::iter::once(exe)
            .chain(self.libs.iter().map(|l| ModuleRef {
                name: &l.name,
                path: &l.path,
                procs: &l.procs,
            }))
            .collect()
    }
}

/// A call site of a procedure: its call block; the callee's link-time
/// address for a direct or PLT call; the import's name when known; a tail
/// call (`jmp`) or not.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CallProfile {
    /// The call block (index into the procedure's blocks).
    pub block: u32,
    /// The callee's link-time address, for a direct or PLT call.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub target: Option<u64>,
    /// The imported callee's name, for a PLT call whose import is known.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub import: Option<String>,
    /// A tail call (`jmp`) rather than a `call`.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub tail: bool,
}

/// One procedure of the profile.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcProfile {
    /// The procedure's name (its symbol, `import@plt`, or `sub_<hex>`).
    pub name: String,
    /// Why it was not profiled, when it was not (its code ran uncounted).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub left_alone: Option<String>,
    /// Entry block.
    pub entry: u32,
    /// Link-time start of each block and its instruction offsets.
    pub blocks: Vec<BlockProfile>,
    /// `[from, to, kind]`; `to == blocks.len()` is EXIT. Kinds: `fall`,
    /// `taken`, `table`, `return_from_call`, `return`, `tail`, `noreturn`,
    /// `halt`.
    pub edges: Vec<(u32, u32, String)>,
    /// Call blocks with a virtual exit edge (frames that may be abandoned
    /// there: exit, throw, longjmp).
    pub virtual_exits: Vec<u32>,
    /// Landing pads with a virtual entry edge `R0 -> pad`.
    #[serde(default)]
    pub landing_pads: Vec<u32>,
    /// Blocks calling `setjmp` (its return edge split by a vertex `S`).
    #[serde(default)]
    pub setjmp_calls: Vec<u32>,
    /// Counted edges in counter order, as edges of the counted graph
    /// (`counters::Virtual`): a CFG edge index, `edges.len()` for
    /// `R0 -> root` (invocations), a landing pad's `R0 -> pad` or a
    /// `setjmp` call's `S -> r`. Empty with every-block placement.
    pub chords: Vec<u32>,
    /// Every-block placement: one counter per block, block counts only.
    #[serde(default)]
    pub every_block: bool,
    /// First counter index.
    pub first_counter: u32,
    /// Raw counter values (chords, or blocks with every-block placement).
    pub counters: Vec<u64>,
    /// Its call sites (system calls excepted).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub calls: Vec<CallProfile>,
    /// Recovered counts (absent when recovery failed: see `error`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub counts: Option<Counts>,
    /// Why count recovery failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
}

/// One basic block of a procedure.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BlockProfile {
    /// The block's link-time start address.
    pub start: u64,
    /// Byte offsets of its instructions from `start`.
    pub insns: Vec<u32>,
}

/// Recovered counts of one procedure.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counts {
    /// How many times the procedure was entered.
    pub invocations: u64,
    /// Execution count of each block.
    pub blocks: Vec<u64>,
    /// Per CFG edge; absent with every-block placement (block counts only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub edges: Option<Vec<u64>>,
    /// `[block, frames]`: frames abandoned at a call block: left active
    /// when the program ended (Figure 4), unwound by a throw or a
    /// `longjmp`.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub active: Vec<(u32, u64)>,
    /// `[pad, entries]`: entries by the unwinder at a landing pad.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub landed: Vec<(u32, u64)>,
    /// `[block, returns]`: returns of the `setjmp` call at a block through
    /// `longjmp` (its first returns are its return edge's count).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub resumed: Vec<(u32, u64)>,
}

impl ProcProfile {
    /// Instructions executed in this procedure.
    pub fn instructions(&self) -> u64 {
        self.counts.as_ref().map_or(0, |c| {
            c.blocks
                .iter()
                .zip(&self.blocks)
                .map(|(n, b)| n * b.insns.len() as u64)
                .sum()
        })
    }
}

fn kind_name(k: EdgeKindDb) -> &'static str {
    match k {
        EdgeKindDb::FallThrough => "fall",
        EdgeKindDb::Taken => "taken",
        EdgeKindDb::JumpTable => "table",
        EdgeKindDb::CallReturn => "return_from_call",
        EdgeKindDb::Return => "return",
        EdgeKindDb::TailCall => "tail",
        EdgeKindDb::NoReturn => "noreturn",
        EdgeKindDb::Halt => "halt",
        EdgeKindDb::Resume => "resume",
    }
}

/// Derives every count of `p` from its counters.
pub fn recover(p: &ProcProfile) -> std::result::Result<Counts, String> {
    let n = p.blocks.len();
    if p.every_block {
        if p.counters.len() != n {
            return Err("block counter list has the wrong length".into());
        }
        return Ok(Counts {
            invocations: 0,
            blocks: p.counters.clone(),
            edges: None,
            active: Vec::new(),
            landed: Vec::new(),
            resumed: Vec::new(),
        });
    }
    let m = p.edges.len();
    let blocks = |v: &[u32]| v.iter().map(|&b| BlockId::new(b as usize)).collect();
    let virt = Virtual {
        exits: blocks(&p.virtual_exits),
        pads: blocks(&p.landing_pads),
        setjmps: blocks(&p.setjmp_calls),
    };
    let edges: Vec<(BlockId, BlockId, bool)> = p
        .edges
        .iter()
        .map(|(f, t, k)| {
            (
                BlockId::new(*f as usize),
                BlockId::new(*t as usize),
                k == "return_from_call",
            )
        })
        .collect();
    let kinds = vec![VertexKind::Plain; n];
    let g = virt.graph(&kinds, BlockId::new(p.entry as usize), &edges)?;
    if p.counters.len() != p.chords.len() {
        return Err("counter and chord lists differ in length".into());
    }
    let chords: Vec<EdgeId> = p.chords.iter().map(|&c| EdgeId::new(c as usize)).collect();
    if let Some(c) = chords.iter().find(|&&c| virt.counted(m, c).is_none()) {
        return Err(format!("the counted edge {c} is not countable"));
    }
    let zero = SecondaryMap::filled(g.num_edges() + 1, 0.0);
    let tree = max_spanning_forest(&g, &zero, true, &|e| chords.contains(&e));
    if tree.chords(&g) != chords {
        return Err("the counted edges are not the chords of a spanning tree".into());
    }
    let mut values = SecondaryMap::filled(g.num_edges() + 1, 0u64);
    for (&c, &v) in chords.iter().zip(&p.counters) {
        values[c] = v;
    }
    let pl = CounterPlacement { tree, chords };
    let counts = recover_counts(&g, &pl, &values, &[]).map_err(|e| e.to_string())?;
    let edges: Vec<u64> = (0..m).map(|i| counts.edges[EdgeId::new(i)]).collect();
    let blocks: Vec<u64> = (0..n).map(|i| counts.blocks[BlockId::new(i)]).collect();
    let (mut active, mut landed, mut resumed) = (Vec::new(), Vec::new(), Vec::new());
    for e in g.edge_ids() {
        let k = counts.edges[e];
        let list = match virt.classify(m, e) {
            _ if k == 0 => continue,
            Some(CountedEdge::Exit(c)) => (&mut active, c),
            Some(CountedEdge::Landing(b)) => (&mut landed, b),
            Some(CountedEdge::SecondReturn(c)) => (&mut resumed, c),
            _ => continue,
        };
        list.0.push((list.1.index() as u32, k));
    }
    Ok(Counts {
        invocations: counts.edges[EdgeId::new(m)],
        blocks,
        edges: Some(edges),
        active,
        landed,
        resumed,
    })
}

/// Reads a profile file.
pub fn read(path: &Path) -> Result<Profile> {
    read_versioned(path, "profile", VERSION, |p: &Profile| p.version)
}

/// Parses the bytes of a profile file; `name` names it in errors.
pub fn parse(bytes: &[u8], name: &Path) -> Result<Profile> {
    parse_versioned(bytes, name, "profile", VERSION, |p: &Profile| p.version)
}

/// Reads the JSON file at `path` as a `kind` (`profile`, `path profile`)
/// of format version `want`, the one this aetrace writes.
pub(crate) fn read_versioned<T: serde::de::DeserializeOwned>(
    path: &Path,
    kind: &str,
    want: u32,
    version: impl Fn(&T) -> u32,
) -> Result<T> {
    let bytes = std::fs::read(path).map_err(|e| Error::Io {
        path: path.to_owned(),
        source: e,
    })?;
    parse_versioned(&bytes, path, kind, want, version)
}

/// [`read_versioned`] on the bytes of the file `name`.
pub(crate) fn parse_versioned<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    name: &Path,
    kind: &str,
    want: u32,
    version: impl Fn(&T) -> u32,
) -> Result<T> {
    let p: T = serde_json::from_slice(bytes)
        .map_err(|e| perr(format!("{}: not a {kind}: {e}", name.display())))?;
    if version(&p) != want {
        return Err(perr(format!(
            "{}: {kind} version {} (this aetrace reads {want})",
            name.display(),
            version(&p)
        )));
    }
    Ok(p)
}

/// The procedure as the profile shows it, without counters.
pub fn skeleton(d: &aetrace_format::progdb::ProcDb) -> ProcProfile {
    let blocks = d
        .blocks
        .iter()
        .map(|b| {
            let mut off = 0u32;
            let insns = b
                .insn_lens
                .iter()
                .map(|&l| {
                    let at = off;
                    off += u32::from(l);
                    at
                })
                .collect();
            BlockProfile {
                start: b.start,
                insns,
            }
        })
        .collect();
    let edges = d
        .edges
        .iter()
        .map(|e| (e.from, e.to, kind_name(e.kind).to_string()))
        .collect();
    ProcProfile {
        name: d.name.clone(),
        left_alone: match &d.status {
            ProcStatus::Traced => None,
            ProcStatus::LeftAlone(r) => Some(r.clone()),
        },
        entry: d.entry,
        blocks,
        edges,
        virtual_exits: Vec::new(),
        landing_pads: Vec::new(),
        setjmp_calls: Vec::new(),
        chords: Vec::new(),
        every_block: false,
        first_counter: 0,
        counters: Vec::new(),
        calls: Vec::new(),
        counts: None,
        error: None,
    }
}

/// Takes `pp`'s counter values from the run's counter words and recovers
/// its counts (or the error).
pub fn take_counters(pp: &mut ProcProfile, values: &[u64]) -> Result<()> {
    let k = if pp.every_block {
        pp.blocks.len()
    } else {
        pp.chords.len()
    };
    let first = pp.first_counter as usize;
    pp.counters = values
        .get(first..first + k)
        .ok_or_else(|| perr("internal: counters out of range"))?
        .to_vec();
    match recover(pp) {
        Ok(c) => pp.counts = Some(c),
        Err(e) => pp.error = Some(e),
    }
    Ok(())
}
