//! `aetrace profile` and `aetrace report`: optimal edge profiles of
//! unmodified binaries (paper 003 Section 3, QP).
//!
//! The program is rewritten in counting mode ([`crate::rewrite::counters`]),
//! run with its counters mapped from a memfd (so a killed program still
//! leaves them), and every block and edge count is recovered from the chord
//! counters by `graph::profile::recover_counts` on the counted graph (CFG +
//! `R0 -> root` + virtual exit edges). The [`Profile`] (JSON,
//! `docs/profile.md`) holds the CFGs, the placement, the raw counters and
//! the recovered counts, so reports and feedback weights need nothing else.
//! With `--libs`, the chosen shared libraries are rewritten the same way
//! (each maps its counters from a memfd of its own, in its first
//! constructor) and the profile has a section per library; the rewritten
//! copies are cached with their skeletons (`commands::cache_dir`).
//!
//! Invariants: recovered counts satisfy Kirchhoff's law at every vertex of
//! the counted graph (else the procedure carries an error instead of
//! counts); the profile is written to a temporary name and renamed.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};

use aetrace_format::progdb::{EdgeKindDb, ProcStatus};
use aetrace_graph::profile::{recover_counts, CounterPlacement};
use aetrace_graph::spanning::max_spanning_forest;
use aetrace_graph::{BlockId, EdgeId, EntityRef, SecondaryMap, VertexKind};
use serde::{Deserialize, Serialize};

use crate::launch::Outcome;
use crate::libs::LibSelection;
use crate::rewrite::counters::{self, CountPlacement, CountSpec, CountedEdge, Feedback, Virtual};
use crate::rewrite::{self, How};
use crate::{Error, Result};

/// Version of the profile format (`docs/profile.md`).
pub const VERSION: u32 = 1;

fn perr(what: impl Into<String>) -> Error {
    Error::Profile { what: what.into() }
}

/// A profile: one run of one program.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Profile {
    pub version: u32,
    /// The program profiled (absolute path) and its arguments.
    pub program: String,
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
    pub block: u32,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub target: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub import: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub tail: bool,
}

/// One procedure of the profile.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcProfile {
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
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BlockProfile {
    pub start: u64,
    pub insns: Vec<u32>,
}

/// Recovered counts of one procedure.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counts {
    pub invocations: u64,
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

/// Options of `aetrace profile`.
pub struct ProfileOptions {
    /// Profile file (default: PROGRAM's base name + `.aprof`).
    pub output: Option<PathBuf>,
    pub placement: CountPlacement,
    /// A previous profile whose counts weight the spanning trees.
    pub weights: Option<PathBuf>,
    /// Also write the text report / callgrind-format file here.
    pub report: Option<PathBuf>,
    pub callgrind: Option<PathBuf>,
    /// Shared libraries profiled too.
    pub libs: LibSelection,
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

/// Reads a profile file.
pub fn read(path: &Path) -> Result<Profile> {
    let bytes = std::fs::read(path).map_err(|e| Error::Io {
        path: path.to_owned(),
        source: e,
    })?;
    let p: Profile = serde_json::from_slice(&bytes)
        .map_err(|e| perr(format!("{}: not a profile: {e}", path.display())))?;
    if p.version != VERSION {
        return Err(perr(format!(
            "{}: profile version {} (this aetrace reads {VERSION})",
            path.display(),
            p.version
        )));
    }
    Ok(p)
}

/// Writes `bytes` to `path` through a temporary name.
///
/// A device or pipe at `path` is written in place, never replaced.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    if !aetrace_format::replaceable(path) {
        return std::fs::write(path, bytes).map_err(|e| Error::Io {
            path: path.to_owned(),
            source: e,
        });
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let io = |e| Error::Io {
        path: tmp.clone(),
        source: e,
    };
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| Error::Io {
        path: path.to_owned(),
        source: e,
    })
}

/// Feedback weights from a previous profile: the recovered edge counts of
/// each procedure, keyed by its entry address.
fn feedback(procs: &[ProcProfile]) -> Result<Feedback> {
    let mut f = Feedback::new();
    for pp in procs {
        let (Some(c), Some(entry)) = (&pp.counts, pp.blocks.get(pp.entry as usize)) else {
            continue;
        };
        let Some(edges) = &c.edges else {
            return Err(perr(
                "the weights profile has block counts only (every-block placement)",
            ));
        };
        f.insert(entry.start, (edges.clone(), c.invocations));
    }
    Ok(f)
}

/// A rewritten module ready to run and what its profile needs: the
/// procedures with their CFGs, placements and calls (no counter values
/// yet), which of them have counters, the size of its counter segment.
/// Cached with the rewritten file (JSON), so a cached run rewrites nothing.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Skeleton {
    procs: Vec<ProcProfile>,
    /// Indices of the procedures with counters.
    counted: Vec<usize>,
    /// Bytes of the counter segment (the memfd's size).
    bytes: u64,
    atomic: bool,
}

impl Skeleton {
    fn of(ins: &rewrite::Instrumented) -> Result<Skeleton> {
        let layout = ins
            .counting
            .as_ref()
            .ok_or_else(|| perr("internal: no counter layout"))?;
        let mut procs = Vec::with_capacity(ins.db.procs.len());
        let mut counted = Vec::new();
        for (i, d) in ins.db.procs.iter().enumerate() {
            let mut pp = skeleton(d);
            if let Some(Some(pc)) = layout.procs.get(i) {
                place(&mut pp, pc)?;
                counted.push(i);
            }
            procs.push(pp);
        }
        Ok(Skeleton {
            procs,
            counted,
            bytes: layout.bytes,
            atomic: layout.atomic,
        })
    }

    /// The procedures with the counter values of a run and the counts
    /// recovered from them.
    fn fill(&self, values: &[u64]) -> Result<Vec<ProcProfile>> {
        let mut procs = self.procs.clone();
        for &i in &self.counted {
            let pp = procs
                .get_mut(i)
                .ok_or_else(|| perr("internal: counted procedure out of range"))?;
            take_counters(pp, values)?;
        }
        Ok(procs)
    }
}

/// The procedure as the profile shows it, without counters.
pub(crate) fn skeleton(d: &aetrace_format::progdb::ProcDb) -> ProcProfile {
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

/// Puts the placement `pc` (counters, counted graph, calls) into `pp`.
fn place(pp: &mut ProcProfile, pc: &counters::ProcCounters) -> Result<()> {
    pp.first_counter = pc.first;
    pp.every_block = pc.every_block;
    let index = |v: &[BlockId]| v.iter().map(|b| b.index() as u32).collect();
    pp.virtual_exits = index(&pc.virt.exits);
    pp.landing_pads = index(&pc.virt.pads);
    pp.setjmp_calls = index(&pc.virt.setjmps);
    let m = pp.edges.len();
    pp.chords = pc
        .chords
        .iter()
        .map(|&c| {
            pc.virt
                .edge_of(m, c)
                .map(|e| e.index() as u32)
                .ok_or_else(|| perr(format!("internal: {}: counter {c:?} has no edge", pp.name)))
        })
        .collect::<Result<_>>()?;
    pp.calls = pc
        .calls
        .iter()
        .map(|c| CallProfile {
            block: c.block.index() as u32,
            target: c.target,
            import: c.import.clone(),
            tail: c.tail,
        })
        .collect();
    Ok(())
}

/// Takes `pp`'s counter values from the run's counter words and recovers
/// its counts (or the error).
fn take_counters(pp: &mut ProcProfile, values: &[u64]) -> Result<()> {
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

/// [`place`] and [`take_counters`] for one procedure (path profiles keep
/// edge counters where a procedure has too many paths).
pub(crate) fn fill(
    pp: &mut ProcProfile,
    pc: &counters::ProcCounters,
    values: &[u64],
) -> Result<()> {
    place(pp, pc)?;
    take_counters(pp, values)
}

/// One module rewritten in counting mode, with its whole counter layout
/// (path profiles need the path numberings, which the cached skeletons of
/// [`prepare`] do not keep).
pub(crate) struct Rewritten {
    pub(crate) ins: rewrite::Instrumented,
    pub(crate) layout: rewrite::CountLayout,
}

fn rewrite_counting(path: &Path, spec: &CountSpec, tag: u32) -> Result<Rewritten> {
    let ins = rewrite::instrument_with(path, &How::Count(spec.clone()), tag)?;
    let layout = ins
        .counting
        .clone()
        .ok_or_else(|| perr("internal: no counter layout"))?;
    Ok(Rewritten { ins, layout })
}

/// A run of [`rewrite_and_run`]: each module's rewrite (the executable's
/// first, then the libraries with their DT_NEEDED names and paths), notes
/// on libraries left alone, how the program ended, each module's counter
/// words (in the same order), the wall time.
pub(crate) struct RewrittenRun {
    pub(crate) exe: Rewritten,
    pub(crate) libs: Vec<(crate::libs::Library, Rewritten)>,
    pub(crate) notes: Vec<String>,
    pub(crate) outcome: Outcome,
    pub(crate) values: Vec<Vec<u64>>,
    pub(crate) seconds: f64,
}

/// Rewrites `exe` and the `libs` in counting mode with `spec`, freshly
/// (no skeleton cache), and runs it (`program` as its `argv[0]`). The
/// executable is written to a private temporary directory; the libraries
/// under their cache names, so that the directory of links the loader
/// searches is the same from run to run.
pub(crate) fn rewrite_and_run(
    exe: &Path,
    program: &Path,
    args: &[OsString],
    libs: &LibSelection,
    spec: &CountSpec,
) -> Result<RewrittenRun> {
    let main = rewrite_counting(exe, spec, 0)?;
    let what = format!("paths threads={}", spec.threads);
    let (libs, notes, links) = crate::commands::prepare_libs(exe, libs, |path, tag| {
        let r = rewrite_counting(path, spec, tag)?;
        let bytes = std::fs::read(path).map_err(|e| Error::Io {
            path: path.to_owned(),
            source: e,
        })?;
        let dir = crate::commands::cache_dir();
        std::fs::create_dir_all(&dir).map_err(|e| Error::Io {
            path: dir.clone(),
            source: e,
        })?;
        let elf = dir.join(crate::commands::cache_key(path, &bytes, &what, tag));
        crate::commands::write_executable(&elf, &r.ins.elf)?;
        Ok((elf, r))
    })?;
    refuse_dlopened(exe, libs.iter().map(|(l, _)| l))?;
    let sizes: Vec<u64> = std::iter::once(main.layout.bytes)
        .chain(libs.iter().map(|(_, r)| r.layout.bytes))
        .collect();
    let env: Vec<(OsString, OsString)> = links.as_ref().map(|d| d.env()).into_iter().collect();
    let dir = tempdir()?;
    let elf = dir.join(exe.file_name().unwrap_or_else(|| "program".as_ref()));
    crate::commands::write_executable(&elf, &main.ins.elf)?;
    let ran = run(&elf, program, args, &sizes, env, 0);
    let _ = std::fs::remove_file(&elf);
    let _ = std::fs::remove_dir(&dir);
    let (outcome, values, seconds) = ran?;
    Ok(RewrittenRun {
        exe: main,
        libs,
        notes,
        outcome,
        values,
        seconds,
    })
}

/// Measured: a library dlclosed and opened again counted its first load
/// only, with nothing to say so.
fn refuse_dlopened<'l>(
    exe: &Path,
    mut libs: impl Iterator<Item = &'l crate::libs::Library>,
) -> Result<()> {
    match libs.find(|l| l.dlopened) {
        Some(l) => Err(Error::Record {
            what: format!(
                "--libs: {} is not a DT_NEEDED library of {}: libraries loaded by dlopen are traced by `aetrace record`, not profiled (a dlclose and a second dlopen would lose counts)",
                l.needed,
                exe.display()
            ),
        }),
        None => Ok(()),
    }
}

/// A private temporary directory for a rewritten program run once.
fn tempdir() -> Result<PathBuf> {
    let base = std::env::temp_dir();
    for i in 0..100u32 {
        let d = base.join(format!("aetrace-profile-{}-{i}", std::process::id()));
        match std::fs::create_dir(&d) {
            Ok(()) => return Ok(d),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::Io { path: d, source: e }),
        }
    }
    Err(perr("cannot create a temporary directory"))
}

/// Rewrites module `tag` at `path` in counting mode, or takes the copy a
/// previous run cached (`commands::cache_dir`, keyed like `record`'s copies
/// plus the counting spec): the rewritten file and its skeleton.
fn prepare(path: &Path, spec: &CountSpec, tag: u32) -> Result<(PathBuf, Skeleton)> {
    use std::hash::{Hash, Hasher};
    let bytes = std::fs::read(path).map_err(|e| Error::Io {
        path: path.to_owned(),
        source: e,
    })?;
    // Feedback weights in a stable order (a HashMap's is not).
    let mut h = std::collections::hash_map::DefaultHasher::new();
    spec.feedback
        .as_ref()
        .map(|f| f.iter().collect::<BTreeMap<_, _>>())
        .hash(&mut h);
    let what = format!(
        "count {:?} {:?} threads={} stop={:?} feedback={:016x}",
        spec.placement,
        spec.events,
        spec.threads,
        spec.stop_at,
        h.finish()
    );
    let dir = crate::commands::cache_dir();
    let key = crate::commands::cache_key(path, &bytes, &what, tag);
    let (elf, meta) = (dir.join(&key), dir.join(format!("{key}.skeleton")));
    if let (Ok(m), true) = (std::fs::read(&meta), elf.is_file()) {
        // A damaged entry is rewritten.
        if let Ok(sk) = serde_json::from_slice::<Skeleton>(&m) {
            return Ok((elf, sk));
        }
    }
    let ins = rewrite::instrument_with(path, &How::Count(spec.clone()), tag)?;
    let sk = Skeleton::of(&ins)?;
    let json = serde_json::to_vec(&sk).map_err(|e| perr(e.to_string()))?;
    crate::commands::cache_store(&elf, &ins.elf, &meta, &json)?;
    Ok((elf, sk))
}

/// Whether any module of the process can start threads: the executable or
/// a library of its closure (glibc's own excepted: they define the
/// starters) imports a thread starter. Then every module counts with
/// `lock add`, whichever of them starts the threads.
pub(crate) fn process_starts_threads(exe: &Path) -> Result<bool> {
    let starts = |p: &Path| crate::elf::Module::open(p).map(|m| rewrite::starts_threads(&m));
    if starts(exe)? {
        return Ok(true);
    }
    // A closure the loader cannot complete fails the run later, natively.
    let libs = crate::libs::closure(exe).unwrap_or_default();
    Ok(libs
        .iter()
        .filter(|l| !crate::libs::is_glibc(&l.needed))
        .any(|l| starts(&l.path).unwrap_or(false)))
}

/// A counted run of every module: the executable's skeleton, the
/// libraries' (with their DT_NEEDED names and paths), notes on libraries
/// left alone, how the program ended, each module's counter words (the
/// executable's first), the wall time.
struct CountedRun {
    exe: Skeleton,
    libs: Vec<(crate::libs::Library, Skeleton)>,
    notes: Vec<String>,
    outcome: Outcome,
    values: Vec<Vec<u64>>,
    seconds: f64,
}

/// Rewrites the program and the `libs` (each with the spec `spec(path)`
/// gives), runs it with one counter memfd per module (the executable's
/// counter 0 starting at `first`), and reads them.
fn count_run(
    exe: &Path,
    program: &Path,
    args: &[OsString],
    libs: &LibSelection,
    spec: &dyn Fn(&Path) -> Result<CountSpec>,
    first: i64,
) -> Result<CountedRun> {
    let (elf, exe_sk) = prepare(exe, &spec(exe)?, 0)?;
    let (libs, notes, dir) =
        crate::commands::prepare_libs(exe, libs, |path, tag| prepare(path, &spec(path)?, tag))?;
    refuse_dlopened(exe, libs.iter().map(|(l, _)| l))?;
    let sizes: Vec<u64> = std::iter::once(exe_sk.bytes)
        .chain(libs.iter().map(|(_, s)| s.bytes))
        .collect();
    let env: Vec<(OsString, OsString)> = dir.as_ref().map(|d| d.env()).into_iter().collect();
    let (outcome, values, seconds) = run(&elf, program, args, &sizes, env, first)?;
    Ok(CountedRun {
        exe: exe_sk,
        libs,
        notes,
        outcome,
        values,
        seconds,
    })
}

/// The file a path names, symlinks resolved (callgrind's name for it).
fn canonical(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_owned())
}

/// `aetrace profile`: rewrites the program (and the `--libs` libraries)
/// with counters, runs it with the same stdio, environment and arguments,
/// writes the profile (and the reports asked for) and returns how the
/// program ended.
pub fn profile_command(o: &ProfileOptions) -> Result<Outcome> {
    let exe = crate::commands::find_program(&o.program)?;
    let (old, weights) = match &o.weights {
        Some(w) => (Some(read(w)?), w.display().to_string()),
        None => (None, "heuristic".to_string()),
    };
    let threads = process_starts_threads(&exe)?;
    let exe_path = canonical(&exe);
    let spec = |path: &Path| -> Result<CountSpec> {
        // Each module's weights come from its own section of the profile.
        let feedback = match &old {
            None => None,
            Some(p) if path == exe => Some(feedback(&p.procs)?),
            Some(p) => match p
                .libs
                .iter()
                .find(|l| Path::new(&l.path) == canonical(path))
            {
                Some(l) => Some(feedback(&l.procs)?),
                None => None,
            },
        };
        Ok(CountSpec {
            placement: o.placement,
            feedback,
            events: None,
            threads,
            stop_at: None,
            paths: false,
        })
    };
    let ran = count_run(&exe, &o.program, &o.args, &o.libs, &spec, 0)?;
    let procs = ran.exe.fill(&ran.values[0])?;
    let mut libs = Vec::new();
    for ((lib, sk), values) in ran.libs.iter().zip(&ran.values[1..]) {
        libs.push(LibProfile {
            name: lib.needed.clone(),
            path: canonical(&lib.path).display().to_string(),
            procs: sk.fill(values)?,
        });
    }
    let profile = Profile {
        version: VERSION,
        program: exe_path.display().to_string(),
        args: o
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        placement: match o.placement {
            CountPlacement::Optimal => "optimal",
            CountPlacement::EveryBlock => "every-block",
        }
        .into(),
        weights,
        atomic: ran.exe.atomic,
        status: match ran.outcome {
            Outcome::Exited(c) => format!("exited {c}"),
            Outcome::Signaled(s) => format!("killed by signal {s}"),
        },
        increments: ran.values.iter().flatten().sum(),
        run_seconds: ran.seconds,
        procs,
        libs,
        notes: ran.notes,
    };
    let mut profile = profile;
    let handler_notes: Vec<String> = longjmp_with_handlers(&profile)
        .into_iter()
        .chain(exiting_handlers(&profile))
        .collect();
    profile.notes.extend(handler_notes.iter().cloned());
    let out = o.output.clone().unwrap_or_else(|| {
        let mut t = exe
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_else(|| "program".into());
        t.push(".aprof");
        PathBuf::from(t)
    });
    let json = serde_json::to_vec(&profile).map_err(|e| perr(e.to_string()))?;
    write_atomic(&out, &json)?;
    if let Some(r) = &o.report {
        let mut buf = Vec::new();
        text_report(&profile, 20, &mut buf)?;
        write_atomic(r, &buf)?;
    }
    if let Some(c) = &o.callgrind {
        let mut buf = Vec::new();
        callgrind(&profile, &mut buf)?;
        write_atomic(c, &buf)?;
    }
    let failed: Vec<String> = profile
        .modules()
        .iter()
        .flat_map(|m| m.procs.iter().map(move |p| (m, p)))
        .filter_map(|(m, p)| {
            p.error
                .as_ref()
                .map(|e| format!("{} ({}): {e}", p.name, m.name))
        })
        .collect();
    for note in handler_notes {
        eprintln!("aetrace: warning: {note}; see {}", out.display());
    }
    if !failed.is_empty() {
        // The program's own status stays the exit status; the profile
        // marks these procedures and this says so.
        eprintln!(
            "aetrace: warning: counts not recovered for {} procedure(s), e.g. {} ({}); see {}",
            failed.len(),
            failed[0],
            profile.status,
            out.display()
        );
    }
    Ok(ran.outcome)
}

/// Functions that install a signal handler.
const INSTALLERS: &[&str] = &[
    "sigaction",
    "signal",
    "sigset",
    "bsd_signal",
    "__sysv_signal",
    "sysv_signal",
];

/// Whether procedure `p`'s call to `import` installs a signal handler. A
/// static executable holds its libc: glibc's `profil` (linked into every
/// static program) installs a SIGPROF handler that only counts.
fn installs_handlers(p: &ProcProfile, import: Option<&str>) -> bool {
    import.is_some_and(|n| INSTALLERS.contains(&n.split('@').next().unwrap_or(n)))
        && !matches!(p.name.as_str(), "__profil" | "profil")
        && !p.name.ends_with("@plt")
}

/// Signal handlers that may not return (they call `exit`, `abort`, ...):
/// such a handler abandons the frame it interrupted at whatever
/// instruction the signal struck, as one that `longjmp`s does (measured: a
/// SIGALRM handler calling `exit` while `main` loops recovered without
/// error, with `main`'s loop entry counted 0 and its frame left at an
/// earlier call). The handlers are found where they are installed: the
/// counted procedures whose address a procedure calling `sigaction`,
/// `signal`, ... takes (`lea` of a RIP-relative address, or an immediate)
/// in its code; one may not return when it or a procedure it calls
/// directly has an edge that does not return, and the note is made when
/// in this run it did not (it ran a call that does not return, or its
/// frame was left active at a call): most programs' cleanup handlers
/// (gzip's, sort's) never run. A handler installed elsewhere (its address
/// passed through data) or left alone is not seen.
fn exiting_handlers(profile: &Profile) -> Option<String> {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind};
    let mut found = Vec::new();
    for m in profile.modules() {
        let installers: Vec<&ProcProfile> = m
            .procs
            .iter()
            .filter(|p| {
                p.calls
                    .iter()
                    .any(|c| installs_handlers(p, c.import.as_deref()))
            })
            .collect();
        if installers.is_empty() {
            continue;
        }
        let Ok(module) = crate::elf::Module::open(Path::new(m.path)) else {
            continue;
        };
        let start = |p: &ProcProfile| p.blocks.get(p.entry as usize).map(|b| b.start);
        let by_start: HashMap<u64, usize> = m
            .procs
            .iter()
            .enumerate()
            .filter_map(|(i, p)| start(p).map(|s| (s, i)))
            .collect();
        // Procedures that may not return: an edge that does not return,
        // or a direct call to one that may not (a fixpoint).
        let mut noret: Vec<bool> = m
            .procs
            .iter()
            .map(|p| p.edges.iter().any(|e| e.2 == "noreturn" || e.2 == "halt"))
            .collect();
        loop {
            let mut changed = false;
            for (i, p) in m.procs.iter().enumerate() {
                if !noret[i]
                    && p.calls.iter().any(|c| {
                        c.target
                            .and_then(|t| by_start.get(&t))
                            .is_some_and(|&q| noret[q])
                    })
                {
                    noret[i] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        for p in installers {
            let mut handlers: Vec<usize> = Vec::new();
            for b in &p.blocks {
                for &o in &b.insns {
                    let at = b.start + u64::from(o);
                    let Some(bytes) = (1..=15u64).rev().find_map(|n| module.bytes_at(at, n)) else {
                        continue;
                    };
                    let i = Decoder::with_ip(64, bytes, at, DecoderOptions::NONE).decode();
                    let mut taken = Vec::new();
                    if i.mnemonic() == Mnemonic::Lea && i.is_ip_rel_memory_operand() {
                        taken.push(i.ip_rel_memory_address());
                    }
                    for k in 0..i.op_count() {
                        if matches!(
                            i.op_kind(k),
                            OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate64
                        ) {
                            taken.push(i.immediate(k));
                        }
                    }
                    handlers.extend(taken.iter().filter_map(|t| by_start.get(t)));
                }
            }
            handlers.sort_unstable();
            handlers.dedup();
            // In this run: it was entered and left by a call that does not
            // return (its block ran, or its frame was left active at a
            // call); counts not recovered cannot say.
            let did_not_return = |q: &ProcProfile| match &q.counts {
                None => q.error.is_some(),
                Some(c) => {
                    c.invocations > 0
                        && (c.active.iter().any(|&(_, n)| n > 0)
                            || q.edges.iter().any(|e| {
                                (e.2 == "noreturn" || e.2 == "halt")
                                    && c.blocks.get(e.0 as usize).is_some_and(|&n| n > 0)
                            }))
                }
            };
            for h in handlers
                .into_iter()
                .filter(|&h| noret[h] && did_not_return(&m.procs[h]))
            {
                found.push(format!(
                    "{} ({}), installed by {}",
                    m.procs[h].name, m.name, p.name
                ));
            }
        }
    }
    found.dedup();
    (!found.is_empty()).then(|| {
        format!(
            "counts may be inexact: signal handlers ran and did not return: {}; a handler that does not return abandons the frame it interrupted inside a block, which no edge count describes",
            found.join(", ")
        )
    })
}

/// Signal handlers that may leave by `longjmp`: a handler that jumps out
/// abandons the interrupted frame at whatever instruction the signal
/// struck (a fault, a timer), not at a call, so the frame's last block ran
/// partly and no edge count describes it; recovery may still balance
/// (measured: `traces/signal_fault.c` recovered without error, with wrong
/// counts in `main` and the faulting procedures). Edge profiles cannot
/// say where a block stopped, so a program that both installs a handler
/// (a call to `sigaction`, `signal`, ...) and calls a `longjmp`-like
/// function gets a note naming the procedures calling `longjmp`, printed
/// as a warning: a note, since most such programs never jump out of a
/// handler.
fn longjmp_with_handlers(profile: &Profile) -> Option<String> {
    let calls = || {
        profile
            .modules()
            .into_iter()
            .flat_map(|m| m.procs.iter().map(move |p| (m.name, p)))
            .flat_map(|(m, p)| p.calls.iter().map(move |c| (m, p, c.import.as_deref())))
    };
    if !calls().any(|(_, p, i)| installs_handlers(p, i)) {
        return None;
    }
    let mut jumpers: Vec<String> = calls()
        // A PLT stub jumps to the import for its callers.
        .filter(|(_, p, i)| {
            i.is_some_and(rewrite::imports::is_longjmp_like) && !p.name.ends_with("@plt")
        })
        .map(|(m, p, _)| format!("{} ({m})", p.name))
        .collect();
    jumpers.dedup();
    if jumpers.is_empty() {
        return None;
    }
    Some(format!(
        "counts may be inexact: the program installs signal handlers, and longjmp is called by {}; a handler that longjmps abandons the interrupted frame inside a block, which no edge count describes",
        jumpers.join(", ")
    ))
}

/// `aetrace count --event E [--libs L] -- PROGRAM ARGS` (paper 002): one
/// counter per module, to which each chord of the spanning tree adds its
/// increment; after the run their sum is the number of events in the
/// profiled procedures of the executable and the libraries (the virtual
/// exit edges make it exact also for frames left active by `exit`).
/// With `stop = Some((n, write))` the program raises SIGTRAP at event `n`
/// (`counters::StopChecks`); with `write = Some(out)` it is written to
/// `out` to be run under a debugger instead of being run. Returns how the
/// program ended and what was counted.
pub fn count_command(
    program: &Path,
    args: &[OsString],
    event: counters::Event,
    libs: &LibSelection,
    stop: Option<(u64, Option<&Path>)>,
) -> Result<(Outcome, Count)> {
    let exe = crate::commands::find_program(program)?;
    let stop_at = stop.map(|(n, _)| n);
    if let Some(n) = stop_at.filter(|&n| n == 0 || n > 1 << 60) {
        return Err(perr(format!(
            "--stop-at {n}: events are numbered from 1 to 2^60"
        )));
    }
    let spec = CountSpec {
        events: Some(event),
        threads: process_starts_threads(&exe)?,
        stop_at,
        ..CountSpec::default()
    };
    if stop_at.is_some() && *libs != LibSelection::None {
        // The checks read the executable's counter; a library's events are
        // on counters of their own.
        return Err(perr("--stop-at counts the executable only (no --libs)"));
    }
    if let Some((n, Some(out))) = stop {
        let ins = rewrite::instrument_with(&exe, &How::Count(spec), 0)?;
        crate::commands::write_executable(out, &ins.elf)?;
        let args: String = args
            .iter()
            .map(|a| format!(" {}", a.to_string_lossy()))
            .collect();
        let hint = format!(
            "{n} when run; stop there with: gdb -ex run --args {}{args}",
            out.display()
        );
        return Ok((Outcome::Exited(0), Count::Written(hint)));
    }
    let start = stop_at.map_or(0, rewrite::stop_start);
    let ran = count_run(&exe, program, args, libs, &|_| Ok(spec.clone()), start)?;
    let word = |v: &Vec<u64>| v.first().copied().unwrap_or(0) as i64;
    let first = ran.values.first().map_or(0, word);
    // The counter's top three bits: 110 once a trap stopped the program
    // (`codegen`'s `stop_jump`), 101 once a signal handler or a second
    // thread in counted code ended it (`signal_guard`); a run without
    // either leaves -N + count >= -2^60.
    let count = match (stop_at, first >> 61) {
        (Some(n), -2) => Count::Stopped(n),
        (Some(_), -3) => Count::Refused,
        _ => Count::Events(ran.values.iter().map(word).sum::<i64>() - start),
    };
    Ok((ran.outcome, count))
}

/// `aetrace count` whole: runs [`count_command`] and says on stderr what
/// happened (the stop, how to stop the written program, the count unless
/// `output` takes it, or that the program ended before the stop). How the
/// program ended, or `None` when the program was written, not run.
pub fn count_and_report(
    program: &Path,
    args: &[OsString],
    event: counters::Event,
    libs: &LibSelection,
    stop: Option<(u64, Option<&Path>)>,
    output: Option<&Path>,
) -> Result<Option<Outcome>> {
    let name = event.name();
    Ok(match count_command(program, args, event, libs, stop)? {
        (_, Count::Written(hint)) => {
            eprintln!("aetrace: stops at {name} {hint}");
            None
        }
        (outcome, Count::Refused) => Some(outcome),
        (outcome, Count::Stopped(n)) => {
            eprintln!("aetrace: stopped at {name} {n} (SIGTRAP)");
            Some(outcome)
        }
        (outcome, Count::Events(n)) => {
            if let Some((at, _)) = stop {
                eprintln!("aetrace: the program ended before {name} {at} (no stop)");
            }
            let line = format!("{n} {name}\n");
            match output {
                Some(p) => {
                    std::fs::write(p, line).map_err(|e| perr(format!("{}: {e}", p.display())))?
                }
                None => eprint!("aetrace: {line}"),
            }
            Some(outcome)
        }
    })
}

/// What `aetrace count` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Count {
    /// This many events (the run ended before any stop).
    Events(i64),
    /// `--stop-at n`: the program reached event `n` and trapped.
    Stopped(u64),
    /// `--stop-at`: a signal handler or a second thread ran counted code,
    /// and the program ended with status 125 and a message (the count would
    /// no longer be exact).
    Refused,
    /// `--write-program`: written, not run; how to stop it under gdb.
    Written(String),
}

/// How the program ended, each module's counter words, the run's wall
/// time (seconds).
type Ran = (Outcome, Vec<Vec<u64>>, f64);

/// Runs the counting program with each module's counters on a memfd of
/// `sizes[tag]` bytes (named by `counters::env_fd(tag)`) and `env` added
/// to the environment, the executable's counter 0 starting at `first`;
/// returns how it ended, each module's counter values
/// (read after every descendant ended) and the wall time.
fn run(
    elf: &Path,
    program: &Path,
    args: &[OsString],
    sizes: &[u64],
    env: Vec<(OsString, OsString)>,
    first: i64,
) -> Result<Ran> {
    let os = |what: &str| perr(format!("{what}: {}", std::io::Error::last_os_error()));
    let mut cmd = std::process::Command::new(elf);
    cmd.arg0(program).args(args).envs(env);
    let mut files = Vec::with_capacity(sizes.len());
    for (tag, &bytes) in sizes.iter().enumerate() {
        // SAFETY: plain system calls; the fd is owned right away.
        let fd = unsafe { libc::memfd_create(c"aetrace-counters".as_ptr(), 0) };
        if fd < 0 {
            return Err(os("memfd_create"));
        }
        // SAFETY: fd is a fresh, valid descriptor we own.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let file = std::fs::File::from(owned);
        file.set_len(bytes)
            .map_err(|e| perr(format!("memfd: {e}")))?;
        if tag == 0 && first != 0 {
            use std::os::unix::fs::FileExt;
            file.write_all_at(&first.to_le_bytes(), 0)
                .map_err(|e| perr(format!("memfd: {e}")))?;
        }
        cmd.env(counters::env_fd(tag as u32), fd.to_string());
        files.push(file);
    }
    // See every descendant (fork children share the counters).
    // SAFETY: prctl on ourselves.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    // The terminal sends SIGINT/SIGQUIT to the whole process group: let the
    // program decide, and keep reading the counters.
    // SAFETY: changing our own signal dispositions.
    let old = unsafe {
        (
            libc::signal(libc::SIGINT, libc::SIG_IGN),
            libc::signal(libc::SIGQUIT, libc::SIG_IGN),
        )
    };
    // The program gets the dispositions we had (a background job's
    // SIGINT/SIGQUIT stay ignored, as in the native run).
    // SAFETY: async-signal-safe calls only, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(libc::SIGINT, old.0);
            libc::signal(libc::SIGQUIT, old.1);
            Ok(())
        });
    }
    let started = std::time::Instant::now();
    let status = cmd.spawn().and_then(|mut c| c.wait());
    // Orphaned descendants may still count.
    loop {
        let mut st = 0;
        // SAFETY: waiting for our children.
        let r = unsafe { libc::waitpid(-1, &mut st, libc::__WALL) };
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    // SAFETY: restoring our own dispositions.
    unsafe {
        libc::signal(libc::SIGINT, old.0);
        libc::signal(libc::SIGQUIT, old.1);
    }
    let status = status.map_err(|e| perr(format!("{}: {e}", program.display())))?;
    let outcome = match (status.code(), status.signal()) {
        (Some(c), _) => Outcome::Exited(c),
        (None, Some(s)) => Outcome::Signaled(s),
        _ => return Err(perr("the program ended in an unknown way")),
    };
    let mut values = Vec::with_capacity(files.len());
    for file in &files {
        // SAFETY: the memfd is ours and nobody writes it any more.
        let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| perr(format!("memfd: {e}")))?;
        values.push(
            map.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
        );
    }
    Ok((outcome, values, seconds))
}

/// The text report: totals, the hottest procedures and blocks, each with
/// its module (the executable's file name or a library's DT_NEEDED name).
pub fn text_report(p: &Profile, top: usize, w: &mut dyn Write) -> Result<()> {
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
    let mut lines: HashMap<usize, crate::lines::Lines> = HashMap::new();
    for &(_, _, m, _, _) in blocks {
        lines.entry(m).or_insert_with(|| {
            crate::elf::Module::open(Path::new(mods[m].path))
                .map(|x| crate::lines::Lines::load(&x))
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
    let lines: Vec<crate::lines::Lines> = mods
        .iter()
        .map(|m| {
            crate::elf::Module::open(Path::new(m.path))
                .map(|x| crate::lines::Lines::load(&x))
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
                    let (Some(b), Some(&n)) =
                        (q.blocks.get(from as usize), c.blocks.get(from as usize))
                    else {
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
                    writeln!(
                        w,
                        "jcnd={}/{n} {:#x}\n{at:#x} {line}",
                        edges[e], target.start
                    )?;
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

/// `aetrace report PROFILE [--format text|json|callgrind]`.
pub fn report_command(profile: &Path, format: &str, top: usize, w: &mut dyn Write) -> Result<()> {
    let p = read(profile)?;
    match format {
        "text" => text_report(&p, top, w),
        "callgrind" => callgrind(&p, w),
        "json" => {
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
            serde_json::to_writer(&mut *w, &v).map_err(|e| perr(e.to_string()))?;
            writeln!(w)?;
            Ok(())
        }
        other => Err(perr(format!(
            "unknown report format `{other}` (text, json, callgrind)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn random_cfg(rng: &mut Rng) -> (crate::cfg::Cfg, Vec<CallRole>, Vec<BlockId>) {
        use crate::cfg::{Block, BlockKind, CallKind, CallSite, Cfg, CfgEdge, EdgeKind};
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
        cfg: &crate::cfg::Cfg,
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
        use crate::cfg::{BlockKind, EdgeKind};
        use crate::rewrite::counters::Counted;
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
        let list = |m: &BTreeMap<u32, u64>| -> Vec<(u32, u64)> {
            m.iter().map(|(&k, &v)| (k, v)).collect()
        };
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
}
