//! A recorded trace against lackey, or against the native run
//! single-stepped under ptrace (`against_stepped`), instruction by
//! instruction, with both streaming: `aetrace regen --format insn --relative --module M` of each
//! traced module runs as a child process whose output is read as lackey's
//! log arrives, and nothing is kept. Runs of billions of instructions (xz
//! on 2 MB: 4.65 billion) compare in constant memory, where holding both
//! sequences (the tests' whole-sequence comparison) would need more than
//! 24 GB.
//!
//! The rules are the whole-sequence comparison's: a `rep` instruction,
//! which lackey reports once per iteration, counts once; instructions of
//! procedures the rewriter left alone are taken out of lackey's side. One
//! thread only: the threads of a run interleave in lackey's log, and
//! matching them needs the whole sequences (a second thread is an error,
//! not a pass).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};

use super::elf::Elf;
use super::lackey;
use super::recorded::{
    early_procedures, image_modules, image_of, info_json, left_alone_procedures, link_base,
};
use super::singlestep;
use super::FastMap;

/// What was compared in one traced module.
#[derive(Debug)]
pub struct ModuleCount {
    pub path: PathBuf,
    /// Instructions equal on both sides.
    pub compared: u64,
    /// Lackey's instructions in procedures left alone (not traced).
    pub untraced: u64,
    /// Those instructions per procedure left alone that ran: its name and
    /// count.
    pub untraced_in: Vec<(String, u64)>,
    /// The oracle's instructions in the code ld.so runs before the
    /// runtime's init, run untraced then (`early_procedures`).
    pub before_init: u64,
}

/// A whole comparison: each module's counts and lackey's run of the
/// program (its status; its output is the caller's to check).
pub struct Compared {
    pub modules: Vec<ModuleCount>,
    pub status: ExitStatus,
}

/// A procedure left alone: its name, its ranges and the oracle's
/// instructions run in them.
#[derive(Clone)]
struct Alone {
    name: String,
    ranges: Vec<(u64, u64)>,
    ran: u64,
}

/// The oracle's side of one traced module: its instructions as offsets
/// from the module's base, a `rep` once, those of procedures left alone
/// counted and left out.
#[derive(Clone)]
struct Oracle {
    base: u64,
    alone: Vec<Alone>,
    /// The address ranges of the code ld.so runs before the runtime's
    /// init: traced only after it.
    early: Vec<(u64, u64)>,
    elf: Elf,
    is_rep: FastMap<u64, bool>,
    /// The oracle's previous address in this module (before normalising).
    prev: Option<u64>,
}

impl Oracle {
    /// The oracle of module `k` of `info`, at `path`.
    fn new(path: &Path, info: &serde_json::Value, k: usize) -> Oracle {
        Oracle {
            base: link_base(path),
            alone: left_alone_procedures(path, info, k)
                .into_iter()
                .map(|(name, ranges)| Alone {
                    name,
                    ranges,
                    ran: 0,
                })
                .collect(),
            early: (early_procedures(path, info).into_iter())
                .flat_map(|(_, ranges)| ranges)
                .collect(),
            elf: Elf::read(path),
            is_rep: FastMap::default(),
            prev: None,
        }
    }

    /// The offset the trace must show for the oracle's instruction at
    /// link-time address `a`, if any. `before_init`: no instruction of a
    /// traced module outside the code ld.so runs before the runtime's init
    /// (and outside the procedures left alone) has run yet in this task;
    /// the first one clears it.
    fn offset(&mut self, a: u64, before_init: &mut bool) -> Result<u64, Skip> {
        let repeat = self.prev == Some(a) && {
            let elf = &self.elf;
            *self.is_rep.entry(a).or_insert_with(|| elf.is_rep(a))
        };
        self.prev = Some(a);
        if repeat {
            return Err(Skip::Repeat);
        }
        let inside = |r: &[(u64, u64)]| r.iter().any(|&(lo, hi)| lo <= a && a < hi);
        if *before_init && inside(&self.early) {
            return Err(Skip::BeforeInit);
        }
        if let Some(p) = self.alone.iter_mut().find(|p| inside(&p.ranges)) {
            p.ran += 1;
            return Err(Skip::Alone);
        }
        *before_init = false;
        Ok(a - self.base)
    }
}

/// Why the oracle's instruction has no counterpart in the trace.
enum Skip {
    /// A `rep`'s repeat.
    Repeat,
    /// In a procedure left alone.
    Alone,
    /// In the code ld.so runs before the runtime's init, before it.
    BeforeInit,
}

/// One traced module: its regenerated stream and lackey's side of it.
struct Side {
    count: ModuleCount,
    oracle: Oracle,
    /// The last instructions found equal, for the report of a difference.
    recent: VecDeque<u64>,
    regen: Child,
    out: BufReader<ChildStdout>,
    line: Vec<u8>,
    threads: u32,
}

impl Side {
    /// The next instruction of the regenerated stream (`Ok(None)` at its
    /// end).
    fn next(&mut self) -> Result<Option<u64>, String> {
        loop {
            self.line.clear();
            match self.out.read_until(b'\n', &mut self.line) {
                Ok(0) => return Ok(None),
                Ok(_) => {}
                Err(e) => return Err(format!("reading aetrace regen: {e}")),
            }
            let l = self.line.strip_suffix(b"\n").unwrap_or(&self.line);
            if l.starts_with(b"# thread ") {
                self.threads += 1;
            } else if !l.is_empty() && !l.starts_with(b"#") {
                if self.threads > 1 {
                    return Err(format!(
                        "{}: the trace has instructions in a second thread; \
                         the streaming comparison takes one",
                        self.count.path.display()
                    ));
                }
                let s = std::str::from_utf8(l).unwrap_or("");
                return u64::from_str_radix(s, 16)
                    .map(Some)
                    .map_err(|_| format!("aetrace regen printed {s:?}"));
            }
        }
    }

    /// The oracle's next instruction in this module, `a` at link time.
    /// `before_init`: see [`Oracle::offset`].
    fn instruction(&mut self, a: u64, before_init: &mut bool) -> Result<(), String> {
        let want = match self.oracle.offset(a, before_init) {
            Ok(want) => want,
            Err(Skip::Repeat) => return Ok(()),
            Err(Skip::Alone) => {
                self.count.untraced += 1;
                return Ok(());
            }
            Err(Skip::BeforeInit) => {
                self.count.before_init += 1;
                return Ok(());
            }
        };
        let got = self.next()?;
        if got == Some(want) {
            self.count.compared += 1;
            if self.recent.len() == 5 {
                self.recent.pop_front();
            }
            self.recent.push_back(want);
            return Ok(());
        }
        let hex = |v: &mut dyn Iterator<Item = u64>| {
            v.map(|a| format!("{a:x}")).collect::<Vec<_>>().join(" ")
        };
        let mut after = Vec::new();
        while after.len() < 4 {
            match self.next() {
                Ok(Some(a)) => after.push(a),
                _ => break,
            }
        }
        let got = match got {
            Some(g) => format!("{g:x} {}", hex(&mut after.into_iter())),
            None => "(end of the trace)".into(),
        };
        Err(format!(
            "{}: first difference at instruction {} after [{}]: oracle {want:x}, regen {got}",
            self.count.path.display(),
            self.count.compared,
            hex(&mut self.recent.iter().copied()),
        ))
    }

    /// The end of lackey's log: the regenerated stream must end too, and
    /// `aetrace regen` succeed.
    fn finish(mut self) -> Result<ModuleCount, String> {
        let ran = self.oracle.alone.iter().filter(|p| p.ran > 0);
        self.count.untraced_in = ran.map(|p| (p.name.clone(), p.ran)).collect();
        let mut more = 0u64;
        while self.next()?.is_some() {
            more += 1;
        }
        let out = self.regen.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "{}: aetrace regen failed after {} instructions: {}",
                self.count.path.display(),
                self.count.compared,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        if more > 0 {
            return Err(format!(
                "{}: regen has {more} instructions more than lackey's {}",
                self.count.path.display(),
                self.count.compared
            ));
        }
        Ok(self.count)
    }
}

/// Starts `aetrace regen ...` (`regen`) with its output read through a
/// large buffer as it streams.
pub(super) fn spawn_regen(regen: &mut Command) -> (Child, BufReader<ChildStdout>) {
    let mut child = regen
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning aetrace regen");
    let out = BufReader::with_capacity(1 << 20, child.stdout.take().unwrap());
    (child, out)
}

/// One comparison side per traced module of `trace`, each with its
/// `aetrace regen --module M` running (of thread `thread` only, if given).
/// One side per traced module of the image `thread` runs in (without a
/// thread, the launched program's): an exec'd image's modules may have
/// the paths and addresses of the launched one's.
fn sides(trace: &Path, info: &serde_json::Value, thread: Option<usize>) -> Vec<Side> {
    image_modules(info, thread.and_then(|t| image_of(info, t)))
        .into_iter()
        .map(|(k, path)| {
            let mut regen = Command::new(super::aetrace());
            regen.args(["regen", "--format", "insn", "--relative", "-j", "1"]);
            if let Some(t) = thread {
                regen.arg("--thread").arg(t.to_string());
            }
            let (regen, out) = spawn_regen(regen.arg("--module").arg(&path).arg(trace));
            Side {
                oracle: Oracle::new(&path, info, k),
                count: ModuleCount {
                    path,
                    compared: 0,
                    untraced: 0,
                    untraced_in: Vec::new(),
                    before_init: 0,
                },
                recent: VecDeque::new(),
                regen,
                out,
                line: Vec::new(),
                threads: 0,
            }
        })
        .collect()
}

/// The end of an oracle's run: the first difference if the sink found
/// one, else each side finished.
fn conclude(
    sides: Vec<Side>,
    error: Option<String>,
    status: ExitStatus,
) -> Result<Compared, String> {
    if let Some(e) = error {
        for mut s in sides {
            let _ = s.regen.kill();
            let _ = s.regen.wait();
        }
        return Err(e);
    }
    let modules = sides
        .into_iter()
        .map(Side::finish)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Compared { modules, status })
}

/// Runs `exe args` under lackey and compares every instruction it reports
/// in the traced modules of `trace` with `aetrace regen` of that trace.
/// `Err` names the module and the first difference (or a thread, regen or
/// count mismatch).
pub fn against_lackey(trace: &Path, exe: &Path, args: &[&str]) -> Result<Compared, String> {
    against_lackey_with(trace, exe, args, &lackey::Launch::default())
}

/// [`against_lackey`], the program given `with` (stdin, variables).
pub fn against_lackey_with(
    trace: &Path,
    exe: &Path,
    args: &[&str],
    with: &lackey::Launch,
) -> Result<Compared, String> {
    let info = info_json(trace);
    let paths: Vec<PathBuf> = image_modules(&info, None)
        .into_iter()
        .map(|m| m.1)
        .collect();
    let mut sides = sides(trace, &info, None);
    let mut error: Option<String> = None;
    let mut first_thread = None;
    let mut before_init = true;
    let mut sink = |m: usize, thread: usize, a: u64| {
        let r = if *first_thread.get_or_insert(thread) != thread {
            Err(format!(
                "lackey reports a second thread (in {}); the streaming comparison takes one",
                sides[m].count.path.display()
            ))
        } else {
            sides[m].instruction(a, &mut before_init)
        };
        keep_going(r, &mut error)
    };
    let run = lackey::run_streaming(exe, args, with, &paths, &mut sink);
    conclude(sides, error, run.status)
}

/// Whether the comparison goes on after `r`; the first error kept.
fn keep_going(r: Result<(), String>, error: &mut Option<String>) -> bool {
    match r {
        Ok(()) => true,
        Err(e) => {
            // The first only: the stepper reports the killed task's held
            // instruction once more at its exit, a second difference.
            error.get_or_insert(e);
            false
        }
    }
}

/// Single-steps `stepped` (`argv[0]`: `argv0`) natively with exactly
/// `env` and address randomisation off, and compares every instruction it
/// runs in the traced modules of `trace` with `aetrace regen` of that
/// trace. `stepped` stands for the trace's executable (it may be a copy
/// of it at another path); libraries are known by their paths. Modules
/// are found in `/proc/PID/maps`, read again whenever an instruction runs
/// outside every mapping known so far. The first process's first thread
/// only (the trace's thread 0; the trace's other streams are not read).
pub fn against_stepped(
    trace: &Path,
    stepped: &Path,
    argv0: &Path,
    args: &[&str],
    env: &[(String, String)],
) -> Result<(Compared, singlestep::Stepped), String> {
    thread_against_stepped(trace, 0, stepped, (argv0, args, env))
}

/// [`against_stepped`] for the trace's thread `thread`, in the modules of
/// its image: an image a followed exec started (`stepped`: the program
/// it runs) against that program stepped natively from its start.
pub fn thread_against_stepped(
    trace: &Path,
    thread: usize,
    stepped: &Path,
    (argv0, args, env): (&Path, &[&str], &[(String, String)]),
) -> Result<(Compared, singlestep::Stepped), String> {
    let info = info_json(trace);
    let mut sides = sides(trace, &info, Some(thread));
    let names: Vec<PathBuf> = std::iter::once(canonical(stepped))
        .chain(sides.iter().skip(1).map(|s| canonical(&s.count.path)))
        .collect();
    let mut maps = Maps::default();
    let mut error: Option<String> = None;
    let mut before_init = true;
    let mut sink = |pid: libc::pid_t, rip: u64| match maps.find(pid, rip, &names) {
        Some((m, bias)) => keep_going(
            sides[m].instruction(rip - bias, &mut before_init),
            &mut error,
        ),
        None => true,
    };
    let run = singlestep::run_streaming(stepped, Some(argv0), (args, env), false, &mut sink);
    let status = exit_status(run.status);
    conclude(sides, error, status).map(|c| (c, run))
}

/// [`against_stepped`] for a program that forks: the stepper follows
/// every process, and the `k`-th process to run an instruction is compared
/// with the trace's thread `k` (`processes` of them, each its own stream:
/// no threads). Returns each process's comparison, the first's first.
pub fn against_stepped_processes(
    trace: &Path,
    stepped: &Path,
    args: &[&str],
    env: &[(String, String)],
    processes: usize,
) -> Result<Vec<Compared>, String> {
    let info = info_json(trace);
    let mut sides: Vec<Vec<Side>> = (0..processes)
        .map(|k| sides(trace, &info, Some(k)))
        .collect();
    let names: Vec<PathBuf> = std::iter::once(canonical(stepped))
        .chain(sides[0].iter().skip(1).map(|s| canonical(&s.count.path)))
        .collect();
    let mut maps: Vec<(libc::pid_t, Maps)> = Vec::new();
    let mut error: Option<String> = None;
    // One for every process: a child starts after its parent's init.
    let mut before_init = true;
    let mut sink = |pid: libc::pid_t, rip: u64| {
        let k = match maps.iter().position(|(p, _)| *p == pid) {
            Some(k) => k,
            None => {
                maps.push((pid, Maps::default()));
                maps.len() - 1
            }
        };
        let Some(side) = sides.get_mut(k) else {
            error = Some(format!(
                "the stepped run has more than {processes} processes"
            ));
            return false;
        };
        match maps[k].1.find(pid, rip, &names) {
            Some((m, bias)) => keep_going(
                side[m].instruction(rip - bias, &mut before_init),
                &mut error,
            ),
            None => true,
        }
    };
    let run = singlestep::run_streaming(stepped, Some(stepped), (args, env), true, &mut sink);
    let status = exit_status(run.status);
    if let Some(e) = error {
        // Every side's regen killed.
        for s in sides {
            let _ = conclude(s, Some(e.clone()), status);
        }
        return Err(e);
    }
    let done = sides.into_iter().enumerate();
    done.map(|(k, s)| conclude(s, None, status).map_err(|e| format!("process {k}: {e}")))
        .collect()
}

/// One task's instructions in the traced modules: (module, offset from
/// its base), in the order they ran.
pub type TaskStream = Vec<(usize, u64)>;

/// The native run of `stepped` single-stepped with every task followed
/// (threads and forked processes), normalised as [`against_stepped`]
/// normalises it: each task's stream ([`TaskStream`]) in the order the
/// tasks were created in ([`super::creation_key`]). Held in memory, for short runs whose
/// threads are compared whole (where a stretch of one is to be taken out,
/// as the waits of `pthread_join`, which streaming cannot do).
pub fn stepped_tasks(
    trace: &Path,
    stepped: &Path,
    args: &[&str],
    env: &[(String, String)],
) -> (Vec<(libc::pid_t, TaskStream)>, ExitStatus) {
    let info = info_json(trace);
    // The stepper stops following a task at its exec.
    let modules = image_modules(&info, None);
    let names: Vec<PathBuf> = std::iter::once(canonical(stepped))
        .chain(modules.iter().skip(1).map(|(_, p)| canonical(p)))
        .collect();
    let fresh: Vec<Oracle> = (modules.iter())
        .map(|(k, p)| Oracle::new(p, &info, *k))
        .collect();
    // Each task's flag `before_init`: only the first task runs before
    // the runtime's init, the others start after it.
    let mut tasks: Vec<(libc::pid_t, Maps, Vec<Oracle>, TaskStream, bool)> = Vec::new();
    let mut sink = |pid: libc::pid_t, rip: u64| {
        let k = tasks.iter().position(|t| t.0 == pid).unwrap_or_else(|| {
            let first = tasks.is_empty();
            tasks.push((pid, Maps::default(), fresh.clone(), Vec::new(), first));
            tasks.len() - 1
        });
        let (_, maps, oracles, stream, before_init) = &mut tasks[k];
        if let Some((m, bias)) = maps.find(pid, rip, &names) {
            if let Ok(off) = oracles[m].offset(rip - bias, before_init) {
                stream.push((m, off));
            }
        }
        true
    };
    let run = singlestep::run_streaming(stepped, Some(stepped), (args, env), true, &mut sink);
    let mut streams: Vec<_> = tasks.into_iter().map(|t| (t.0, t.3)).collect();
    // The first task to run is the first created: the root.
    if let Some(&(root, _)) = streams.first() {
        let key = super::creation_key(root as u32);
        streams.sort_by_key(|t| key(t.0 as u32));
    }
    (streams, exit_status(run.status))
}

/// Each thread of `trace` that runs the launched program regenerated
/// (`aetrace regen`, every module), in the order the threads were
/// created ([`super::creation_key`]): its instructions as (module, offset
/// from the module's run-time base), as [`stepped_tasks`] gives the
/// oracle's. Threads of images that followed execs started are left out,
/// as the stepper leaves them.
pub fn regen_tasks(trace: &Path) -> Vec<(u32, TaskStream)> {
    let info = info_json(trace);
    let modules: Vec<(u64, u64)> = (info["modules"].as_array().unwrap().iter())
        .filter(|m| m["instrumented"] == true && m["image_thread"].is_null())
        .map(|m| {
            let base = m["load_base"].as_u64().unwrap();
            (base, base + m["size"].as_u64().unwrap())
        })
        .collect();
    let out = Command::new(super::aetrace())
        .args(["regen", "--format", "insn", "-j", "1"])
        .arg(trace)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "aetrace regen failed: {err}");
    let mut threads: Vec<(u32, TaskStream)> = Vec::new();
    let mut launched = true;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(head) = line.strip_prefix("# thread ") {
            // "N pid P tid T"
            let n: usize = head.split(' ').next().unwrap().parse().unwrap();
            launched = image_of(&info, n).is_none();
            let tid = head.rsplit(' ').next().unwrap().parse().unwrap();
            if launched {
                threads.push((tid, Vec::new()));
            }
        } else if launched && !line.is_empty() && !line.starts_with('#') {
            let a = u64::from_str_radix(line, 16).unwrap();
            let m = modules.iter().position(|&(lo, hi)| lo <= a && a < hi);
            let m = m.unwrap_or_else(|| panic!("regen's {a:x} is in no traced module"));
            threads.last_mut().unwrap().1.push((m, a - modules[m].0));
        }
    }
    // Thread 0, the first, is the main thread: the root.
    if let Some(&(root, _)) = threads.first() {
        let key = super::creation_key(root);
        threads.sort_by_key(|t| key(t.0));
    }
    threads
}

/// The stepper's status (exit code, or 128 + signal) as an `ExitStatus`.
fn exit_status(s: i32) -> ExitStatus {
    std::os::unix::process::ExitStatusExt::from_raw(match s {
        s if s > 128 => s - 128,
        s => s << 8,
    })
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The executable mappings of a stepped process.
#[derive(Default)]
struct Maps {
    ranges: Vec<Mapping>,
    last: usize,
}

/// One executable mapping: its run-time range, and the traced module it
/// belongs to with that module's load bias, if any.
struct Mapping {
    lo: u64,
    hi: u64,
    traced: Option<(usize, u64)>,
}

impl Maps {
    /// The traced module holding run-time address `rip` and its bias.
    fn find(&mut self, pid: libc::pid_t, rip: u64, names: &[PathBuf]) -> Option<(usize, u64)> {
        let hit = |r: &Mapping| r.lo <= rip && rip < r.hi;
        if !self.ranges.get(self.last).is_some_and(hit) {
            match self.ranges.iter().position(hit) {
                Some(i) => self.last = i,
                None => {
                    self.read(pid, names);
                    self.last = self.ranges.iter().position(hit)?;
                }
            }
        }
        self.ranges[self.last].traced
    }

    /// Reads `/proc/PID/maps`: each file's bias is where its offset-0
    /// mapping starts minus its link base.
    fn read(&mut self, pid: libc::pid_t, names: &[PathBuf]) {
        let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        let mut starts: FastMap<String, u64> = FastMap::default();
        let mut execs = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(range), Some(perms), Some(off), Some(path)) =
                (f.first(), f.get(1), f.get(2), f.get(5))
            else {
                continue;
            };
            let (lo, hi) = range.split_once('-').unwrap();
            let (lo, hi) = (
                u64::from_str_radix(lo, 16).unwrap(),
                u64::from_str_radix(hi, 16).unwrap(),
            );
            if u64::from_str_radix(off, 16) == Ok(0) {
                starts.entry(path.to_string()).or_insert(lo);
            }
            if perms.contains('x') {
                execs.push((lo, hi, path.to_string()));
            }
        }
        self.ranges = execs
            .into_iter()
            .map(|(lo, hi, path)| {
                let module = names.iter().position(|n| n == Path::new(&path));
                let traced = module.and_then(|m| {
                    let start = starts.get(&path)?;
                    Some((m, start - link_base(Path::new(&path))))
                });
                Mapping { lo, hi, traced }
            })
            .collect();
        self.last = 0;
    }
}
