//! The counted runs behind `aetrace profile`, `aetrace count` and
//! `aetrace paths` (paper 003 Section 3, QP; paper 002).
//!
//! The program is rewritten in counting mode ([`aetrace_rewrite::counters`]),
//! run with its counters mapped from a memfd (so a killed program still
//! leaves them), and the counter values go into an
//! [`aetrace_profile::Profile`], whose counts are recovered there. With
//! `--libs`, the chosen shared libraries are rewritten the same way (each
//! maps its counters from a memfd of its own, in its first constructor) and
//! the profile has a section per library; the rewritten copies are cached
//! with their skeletons (`commands::cache_dir`).
//!
//! Invariants: the profile is written to a temporary name and renamed
//! ([`aetrace_format::atomic`]).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};

use aetrace_graph::{BlockId, EntityRef};
use aetrace_profile::notes::{exiting_handlers, longjmp_with_handlers};
use aetrace_profile::{
    read, skeleton, take_counters, CallProfile, LibProfile, ProcProfile, Profile, VERSION,
};
use serde::{Deserialize, Serialize};

use crate::error::{CountError, LibError};
use crate::launch::Outcome;
use crate::libs::LibSelection;
use crate::{Error, Result};
use aetrace_format::atomic::write_atomic;
use aetrace_rewrite::counters::{self, CountPlacement, CountSpec, Feedback};
use aetrace_rewrite::{self as rewrite, How};

/// An inconsistency of a rewrite's counter layout.
pub(crate) fn layout_err(what: impl Into<String>) -> Error {
    CountError::CounterLayout(what.into()).into()
}

/// Options of `aetrace profile`.
pub struct ProfileOptions {
    /// Profile file (default: PROGRAM's base name + `.aprof`).
    pub output: Option<PathBuf>,
    /// Where the counters go.
    pub placement: CountPlacement,
    /// A previous profile whose counts weight the spanning trees.
    pub weights: Option<PathBuf>,
    /// Also write the text report / callgrind-format file here.
    pub report: Option<PathBuf>,
    /// Also write a callgrind-format file here.
    pub callgrind: Option<PathBuf>,
    /// Shared libraries profiled too.
    pub libs: LibSelection,
    /// The program to run (a path, or a name looked up on `PATH`).
    pub program: PathBuf,
    /// Its arguments after `argv[0]`.
    pub args: Vec<OsString>,
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
            return Err(CountError::WeightsBlockCounts.into());
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
            .ok_or_else(|| layout_err("no counter layout"))?;
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
                .ok_or_else(|| layout_err("counted procedure out of range"))?;
            take_counters(pp, values)?;
        }
        Ok(procs)
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
                .ok_or_else(|| layout_err(format!("{}: counter {c:?} has no edge", pp.name)))
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

/// [`place`] and [`take_counters`] for one procedure (path profiles keep
/// edge counters where a procedure has too many paths).
pub(crate) fn fill(
    pp: &mut ProcProfile,
    pc: &counters::ProcCounters,
    values: &[u64],
) -> Result<()> {
    place(pp, pc)?;
    Ok(take_counters(pp, values)?)
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
        .ok_or_else(|| layout_err("no counter layout"))?;
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
    let (libs, notes, links) =
        crate::commands::prepare_libs(exe, (libs, COUNTED_GLIBC), |lib, tag, _| {
            let path = lib.path.as_path();
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
        Some(l) => Err(LibError::Dlopened {
            needed: l.needed.clone(),
            exe: exe.to_owned(),
        }
        .into()),
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
    Err(CountError::TempDir.into())
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
    // A damaged entry is rewritten.
    if let Some(sk) = crate::commands::cache_load(&elf, &meta)
        .and_then(|m| serde_json::from_slice::<Skeleton>(&m).ok())
    {
        return Ok((elf, sk));
    }
    let ins = rewrite::instrument_with(path, &How::Count(spec.clone()), tag)?;
    let sk = Skeleton::of(&ins)?;
    let json = serde_json::to_vec(&sk).map_err(CountError::Json)?;
    crate::commands::cache_store(&elf, &ins.elf, &meta, &json)?;
    Ok((elf, sk))
}

/// Counting leaves glibc's libraries alone: their code that ld.so runs
/// before the executable's init would count into counters not yet mapped.
const COUNTED_GLIBC: crate::libs::GlibcPolicy = crate::libs::GlibcPolicy::Refused(
    "glibc's libraries are traced by `aetrace record`, not counted",
);

/// Whether any module of the process can start threads: the executable or
/// a library of its closure (glibc's own excepted: they define the
/// starters) imports a thread starter. Then every module counts with
/// `lock add`, whichever of them starts the threads.
pub(crate) fn process_starts_threads(exe: &Path) -> Result<bool> {
    let starts =
        |p: &Path| aetrace_analysis::elf::Module::open(p).map(|m| rewrite::starts_threads(&m));
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
        crate::commands::prepare_libs(exe, (libs, COUNTED_GLIBC), |lib, tag, _| {
            prepare(&lib.path, &spec(&lib.path)?, tag)
        })?;
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

/// What [`profile`] did: how the program ended, and what the command line
/// warns about (also in the profile).
pub struct Profiled {
    /// How the program ended.
    pub outcome: Outcome,
    /// The profile file written.
    pub output: PathBuf,
    /// How the program ended, as the profile says it.
    pub status: String,
    /// Signal handlers whose counts may be wrong (longjmp out of, or exit
    /// in, a handler).
    pub handler_notes: Vec<String>,
    /// Procedures whose counts were not recovered: `NAME (MODULE): why`.
    pub unrecovered: Vec<String>,
}

/// `aetrace profile`: rewrites the program (and the `--libs` libraries)
/// with counters, runs it with the same stdio, environment and arguments,
/// writes the profile (and the reports asked for) and returns how the
/// program ended.
pub fn profile(o: &ProfileOptions) -> Result<Profiled> {
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
    let mut profile = Profile {
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
    let handler_notes: Vec<String> = longjmp_with_handlers(&profile)
        .into_iter()
        .chain(exiting_handlers(&profile))
        .collect();
    profile.notes.extend(handler_notes.iter().cloned());
    let out = o
        .output
        .clone()
        .unwrap_or_else(|| crate::commands::default_output(&exe, ".aprof"));
    write_profile(o, &profile, &out)?;
    Ok(Profiled {
        outcome: ran.outcome,
        output: out,
        unrecovered: unrecovered(&profile),
        status: profile.status,
        handler_notes,
    })
}

/// Writes the profile to `out`, and the reports `o` asks for.
fn write_profile(o: &ProfileOptions, profile: &Profile, out: &Path) -> Result<()> {
    let json = serde_json::to_vec(profile).map_err(CountError::Json)?;
    write_atomic(out, &json, None)?;
    if let Some(r) = &o.report {
        let mut buf = Vec::new();
        aetrace_profile::report::text(profile, 20, &mut buf)?;
        write_atomic(r, &buf, None)?;
    }
    if let Some(c) = &o.callgrind {
        let mut buf = Vec::new();
        aetrace_profile::report::callgrind(profile, &mut buf)?;
        write_atomic(c, &buf, None)?;
    }
    Ok(())
}

/// The procedures whose counts were not recovered: `NAME (MODULE): why`.
fn unrecovered(profile: &Profile) -> Vec<String> {
    profile
        .modules()
        .iter()
        .flat_map(|m| m.procs.iter().map(move |p| (m, p)))
        .filter_map(|(m, p)| {
            p.error
                .as_ref()
                .map(|e| format!("{} ({}): {e}", p.name, m.name))
        })
        .collect()
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
pub fn count(
    program: &Path,
    args: &[OsString],
    event: counters::Event,
    libs: &LibSelection,
    stop: Option<(u64, Option<&Path>)>,
) -> Result<(Outcome, Count)> {
    let exe = crate::commands::find_program(program)?;
    let stop_at = stop.map(|(n, _)| n);
    if let Some(n) = stop_at.filter(|&n| n == 0 || n > 1 << 60) {
        return Err(CountError::StopAtRange(n).into());
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
        return Err(CountError::StopAtWithLibs.into());
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

/// The executable `exe` rewritten to raise SIGTRAP just before its `n`th
/// instruction (`count --event insns --stop-at n --write-program`, as
/// `aetrace debug`'s `monitor materialise` runs it): the ELF file and its
/// program database (where each address of a copy stands in the original).
pub fn stop_program(exe: &Path, n: u64) -> Result<rewrite::Instrumented> {
    if n == 0 || n > 1 << 60 {
        return Err(CountError::StopAtRange(n).into());
    }
    let spec = CountSpec {
        events: Some(counters::Event::Insns),
        threads: process_starts_threads(exe)?,
        stop_at: Some(n),
        ..CountSpec::default()
    };
    Ok(rewrite::instrument_with(exe, &How::Count(spec), 0)?)
}

/// The error of writing the count to `-o FILE`.
pub fn output_error(path: &Path, source: std::io::Error) -> Error {
    CountError::Output {
        path: path.to_owned(),
        source,
    }
    .into()
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
    let memfd = |source| CountError::Counters {
        what: "memfd",
        source,
    };
    let mut cmd = std::process::Command::new(elf);
    cmd.arg0(program).args(args).envs(env);
    let mut files = Vec::with_capacity(sizes.len());
    for (tag, &bytes) in sizes.iter().enumerate() {
        // SAFETY: plain system calls; the fd is owned right away.
        let fd = unsafe { libc::memfd_create(c"aetrace-counters".as_ptr(), 0) };
        if fd < 0 {
            return Err(CountError::Counters {
                what: "memfd_create",
                source: std::io::Error::last_os_error(),
            }
            .into());
        }
        // SAFETY: fd is a fresh, valid descriptor we own.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let file = std::fs::File::from(owned);
        file.set_len(bytes).map_err(memfd)?;
        if tag == 0 && first != 0 {
            use std::os::unix::fs::FileExt;
            file.write_all_at(&first.to_le_bytes(), 0).map_err(memfd)?;
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
    let status = status.map_err(|source| CountError::Child {
        program: program.to_owned(),
        source,
    })?;
    let outcome = match (status.code(), status.signal()) {
        (Some(c), _) => Outcome::Exited(c),
        (None, Some(s)) => Outcome::Signaled(s),
        _ => return Err(CountError::UnknownEnd.into()),
    };
    let mut values = Vec::with_capacity(files.len());
    for file in &files {
        // SAFETY: the memfd is ours and nobody writes it any more.
        let map = unsafe { memmap2::Mmap::map(file) }.map_err(memfd)?;
        values.push(
            map.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
        );
    }
    Ok((outcome, values, seconds))
}
