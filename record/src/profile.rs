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
//!
//! Invariants: recovered counts satisfy Kirchhoff's law at every vertex of
//! the counted graph (else the procedure carries an error instead of
//! counts); the profile is written to a temporary name and renamed.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};

use aetrace_format::progdb::{EdgeKindDb, ProcStatus};
use aetrace_graph::profile::{recover_counts, CounterPlacement};
use aetrace_graph::spanning::max_spanning_forest;
use aetrace_graph::{BlockId, EdgeId, EntityRef, GraphBuilder, SecondaryMap, VertexKind};
use serde::{Deserialize, Serialize};

use crate::launch::Outcome;
use crate::rewrite::counters::{self, CountPlacement, CountSpec, Counted, Feedback};
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
    pub procs: Vec<ProcProfile>,
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
    /// Call blocks with a virtual exit edge (frames that may stay active).
    pub virtual_exits: Vec<u32>,
    /// Counted edges in counter order: CFG edge index, or `edges.len()` for
    /// `R0 -> root` (invocations). Empty with every-block placement.
    pub chords: Vec<u32>,
    /// Every-block placement: one counter per block, block counts only.
    #[serde(default)]
    pub every_block: bool,
    /// First counter index.
    pub first_counter: u32,
    /// Raw counter values (chords, or blocks with every-block placement).
    pub counters: Vec<u64>,
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
    /// `[block, frames]`: frames left active at a call block when the
    /// program ended (Figure 4).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub active: Vec<(u32, u64)>,
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
        });
    }
    let m = p.edges.len();
    let mut b = GraphBuilder::new();
    for _ in 0..n {
        b.add_vertex(VertexKind::Plain);
    }
    let exit = b.add_vertex(VertexKind::Exit);
    let r0 = b.add_vertex(VertexKind::Plain);
    let block = |i: u32| -> std::result::Result<BlockId, String> {
        if (i as usize) <= n {
            Ok(BlockId::new(i as usize))
        } else {
            Err(format!("block {i} out of range"))
        }
    };
    // Only EXIT may have no successors.
    let source = |i: u32| {
        block(i).and_then(|v| {
            if v == exit {
                Err("an edge leaves EXIT".to_string())
            } else {
                Ok(v)
            }
        })
    };
    for &(f, t, _) in &p.edges {
        b.add_edge(source(f)?, block(t)?);
    }
    b.add_edge(r0, source(p.entry)?);
    for &c in &p.virtual_exits {
        b.add_edge(source(c)?, exit);
    }
    let g = b.finish(r0, exit);
    if g.num_edges() != m + 1 + p.virtual_exits.len() {
        return Err("duplicate edges".into());
    }
    if p.counters.len() != p.chords.len() {
        return Err("counter and chord lists differ in length".into());
    }
    let chords: Vec<EdgeId> = p.chords.iter().map(|&c| EdgeId::new(c as usize)).collect();
    if chords.iter().any(|c| c.index() > m) {
        return Err("a chord is not a CFG edge".into());
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
    let active = p
        .virtual_exits
        .iter()
        .enumerate()
        .map(|(i, &c)| (c, counts.edges[EdgeId::new(m + 1 + i)]))
        .filter(|&(_, k)| k > 0)
        .collect();
    Ok(Counts {
        invocations: counts.edges[EdgeId::new(m)],
        blocks,
        edges: Some(edges),
        active,
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
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
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
fn feedback(p: &Profile) -> Result<Feedback> {
    let mut f = Feedback::new();
    for pp in &p.procs {
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

/// `aetrace profile`: rewrites the program with counters, runs it with the
/// same stdio, environment and arguments, writes the profile (and the
/// reports asked for) and returns how the program ended.
pub fn profile_command(o: &ProfileOptions) -> Result<Outcome> {
    let exe = crate::commands::find_program(&o.program)?;
    let (feedback, weights) = match &o.weights {
        Some(w) => (Some(feedback(&read(w)?)?), w.display().to_string()),
        None => (None, "heuristic".to_string()),
    };
    let spec = CountSpec {
        placement: o.placement,
        feedback,
        events: None,
        paths: false,
    };
    let (ins, layout, (outcome, values, run_seconds)) =
        rewrite_and_run(&exe, &o.program, &o.args, spec)?;
    let mut procs = Vec::with_capacity(ins.db.procs.len());
    for (i, d) in ins.db.procs.iter().enumerate() {
        let mut pp = skeleton(d);
        if let Some(Some(pc)) = layout.procs.get(i) {
            fill(&mut pp, pc, &values)?;
        }
        procs.push(pp);
    }
    let profile = Profile {
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
        placement: match o.placement {
            CountPlacement::Optimal => "optimal",
            CountPlacement::EveryBlock => "every-block",
        }
        .into(),
        weights,
        atomic: layout.atomic,
        status: match outcome {
            Outcome::Exited(c) => format!("exited {c}"),
            Outcome::Signaled(s) => format!("killed by signal {s}"),
        },
        increments: values.iter().sum(),
        run_seconds,
        procs,
    };
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
        .procs
        .iter()
        .filter_map(|p| p.error.as_ref().map(|e| format!("{}: {e}", p.name)))
        .collect();
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
    Ok(outcome)
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
        chords: Vec::new(),
        every_block: false,
        first_counter: 0,
        counters: Vec::new(),
        counts: None,
        error: None,
    }
}

/// Puts the edge counters of `pc` (from the run's counter words) into `pp`
/// and recovers its counts (or the error).
pub(crate) fn fill(
    pp: &mut ProcProfile,
    pc: &counters::ProcCounters,
    values: &[u64],
) -> Result<()> {
    pp.first_counter = pc.first;
    pp.every_block = pc.every_block;
    pp.virtual_exits = pc.virtual_exits.iter().map(|b| b.index() as u32).collect();
    pp.chords = pc
        .chords
        .iter()
        .map(|c| match *c {
            Counted::Edge(e) => e.index() as u32,
            Counted::Entry => pp.edges.len() as u32,
        })
        .collect();
    let k = pc.len(pp.blocks.len()) as usize;
    let first = pc.first as usize;
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

/// How the program ended, the counter words, the run's wall time (seconds).
type Ran = (Outcome, Vec<u64>, f64);

/// Rewrites `exe` in counting mode and runs it (`program` as its
/// `argv[0]`): the rewrite, its counter layout, and what [`run`] returns.
pub(crate) fn rewrite_and_run(
    exe: &Path,
    program: &Path,
    args: &[OsString],
    spec: CountSpec,
) -> Result<(rewrite::Instrumented, rewrite::CountLayout, Ran)> {
    let ins = rewrite::instrument_with(exe, &How::Count(spec), 0)?;
    let layout = ins
        .counting
        .clone()
        .ok_or_else(|| perr("internal: no counter layout"))?;
    let dir = tempdir()?;
    let elf = dir.join(exe.file_name().unwrap_or_else(|| "program".as_ref()));
    crate::commands::write_executable(&elf, &ins.elf)?;
    let ran = run(&elf, program, args, layout.bytes);
    let _ = std::fs::remove_file(&elf);
    let _ = std::fs::remove_dir(&dir);
    Ok((ins, layout, ran?))
}

/// `aetrace count --event E -- PROGRAM ARGS` (paper 002): one counter, to
/// which each chord of the spanning tree adds its increment; after the run
/// it equals the number of events in the profiled procedures (the virtual
/// exit edges make it exact also for frames left active by `exit`).
/// Returns how the program ended and the count.
pub fn count_command(
    program: &Path,
    args: &[OsString],
    event: counters::Event,
) -> Result<(Outcome, i64)> {
    let exe = crate::commands::find_program(program)?;
    let spec = CountSpec {
        events: Some(event),
        ..CountSpec::default()
    };
    let (_, _, (outcome, values, _)) = rewrite_and_run(&exe, program, args, spec)?;
    let n = values.first().copied().unwrap_or(0) as i64;
    Ok((outcome, n))
}

/// A private temporary directory for the rewritten program.
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

/// Runs the counting program with its counters on a memfd; returns how it
/// ended and the counter values (read after every descendant ended).
fn run(elf: &Path, program: &Path, args: &[OsString], bytes: u64) -> Result<Ran> {
    let os = |what: &str| perr(format!("{what}: {}", std::io::Error::last_os_error()));
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
    // See every descendant (fork children share the counters).
    // SAFETY: prctl on ourselves.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let mut cmd = std::process::Command::new(elf);
    cmd.arg0(program)
        .args(args)
        .env(counters::ENV_FD, fd.to_string());
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
    // SAFETY: the memfd is ours and nobody writes it any more.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| perr(format!("memfd: {e}")))?;
    let values = map
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    Ok((outcome, values, seconds))
}

/// The text report: totals, the hottest procedures and blocks.
pub fn text_report(p: &Profile, top: usize, w: &mut dyn Write) -> Result<()> {
    let total: u64 = p.procs.iter().map(ProcProfile::instructions).sum();
    writeln!(w, "program: {} {}", p.program, p.args.join(" "))?;
    writeln!(
        w,
        "status: {}; placement: {}; weights: {}; {} counter increments; {} instructions in profiled procedures",
        p.status, p.placement, p.weights, p.increments, total
    )?;
    let mut procs: Vec<&ProcProfile> = p.procs.iter().filter(|q| q.counts.is_some()).collect();
    procs.sort_by_key(|q| std::cmp::Reverse(q.instructions()));
    writeln!(
        w,
        "\nhottest procedures:\n{:>14} {:>7} {:>12}  procedure",
        "instructions", "%", "calls"
    )?;
    for q in procs.iter().take(top) {
        let n = q.instructions();
        let calls = q.counts.as_ref().map_or(0, |c| c.invocations);
        writeln!(
            w,
            "{n:>14} {:>6.2}% {calls:>12}  {}",
            100.0 * n as f64 / total.max(1) as f64,
            q.name
        )?;
    }
    let mut blocks: Vec<(u64, u64, &str, u64)> = Vec::new();
    for q in &procs {
        let c = q.counts.as_ref().expect("filtered");
        for (b, &k) in q.blocks.iter().zip(&c.blocks) {
            blocks.push((k * b.insns.len() as u64, k, &q.name, b.start));
        }
    }
    blocks.sort_by(|a, b| b.0.cmp(&a.0).then(a.3.cmp(&b.3)));
    // Source lines from the program's DWARF, when it is still there.
    let lines = crate::elf::Module::open(std::path::Path::new(&p.program))
        .map(|m| crate::lines::Lines::load(&m))
        .unwrap_or_default();
    writeln!(
        w,
        "\nhottest blocks:\n{:>14} {:>12} {:>18}  procedure  source",
        "instructions", "count", "address"
    )?;
    for (n, k, name, at) in blocks.iter().take(top) {
        let src = lines
            .at(*at)
            .map(|(f, l)| format!("{f}:{l}"))
            .unwrap_or_default();
        writeln!(w, "{n:>14} {k:>12} {at:>#18x}  {name}  {src}")?;
    }
    let failed: Vec<&ProcProfile> = p.procs.iter().filter(|q| q.error.is_some()).collect();
    if !failed.is_empty() {
        writeln!(w, "\ncounts not recovered:")?;
        for q in failed {
            writeln!(w, "  {}: {}", q.name, q.error.as_deref().unwrap_or(""))?;
        }
    }
    Ok(())
}

/// The callgrind format (`positions: instr`, `events: Ir`): one `fn=` per
/// profiled procedure and one line per executed instruction, link-time
/// addresses. `callgrind_annotate` and KCachegrind read it.
pub fn callgrind(p: &Profile, w: &mut dyn Write) -> Result<()> {
    writeln!(w, "# callgrind format\nversion: 1\ncreator: aetrace")?;
    writeln!(w, "cmd: {} {}", p.program, p.args.join(" "))?;
    writeln!(w, "positions: instr\nevents: Ir")?;
    let mut total = 0u64;
    writeln!(w, "ob={}", p.program)?;
    writeln!(w, "fl=???")?;
    for q in &p.procs {
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
        writeln!(w, "fn={}", q.name)?;
        for (a, k) in ir {
            writeln!(w, "{a:#x} {k}")?;
            total += k;
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
                .procs
                .iter()
                .filter(|q| q.counts.is_some() || q.error.is_some())
                .map(|q| {
                    serde_json::json!({
                        "name": q.name,
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
            chords: vec![0, 2],
            every_block: false,
            first_counter: 0,
            counters: vec![returned, invoked],
            counts: None,
            error: None,
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
