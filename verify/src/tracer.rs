//! The block tracer: the `waitpid` loop, breakpoints, and per-thread
//! position (paper 004, Sections 3.1, 3.2 and 4.1).
//!
//! Breakpoints (`int3`) stay in memory once written. Two kinds share one
//! table: *entry traps* on blocks that untraced code can reach (procedure
//! entries and blocks without a predecessor, such as landing pads, at
//! start-up; return points lazily, when a call or jump leaves the traced
//! modules), and *end traps*, written lazily on the last instruction of a
//! block the first time a thread enters it. A thread is either inside a
//! block of a traced module (`cur`) or outside (libc, the loader, the vDSO),
//! where it runs at native speed until an entry trap brings it back. A block
//! costs one stop at its end, or none when its successor is static (it
//! falls through or ends in a direct `jmp`: the chain is followed
//! statically, `pending`); at the stop a near
//! branch is emulated (`emulate`), anything else is single-stepped with the
//! original byte put back for that one step (step-over).
//!
//! Invariants: a thread in `Mode::Step` has exactly that breakpoint's
//! original byte in memory (or its copy in the scratch page), and the
//! `int3` is written back when the last thread stepping over it in place
//! is done (`stepping`), before that thread runs freely again; `cur` is `Some` only while the thread's `rip` is inside
//! that block or the static chain ending with it, whose blocks not
//! reported yet are `pending`, in execution order, without repeats; a signal delivered while a
//! thread is inside a block pushes that position, and it is resumed (not
//! reported again) when its chain's traps are reached with the thread
//! outside; if the signal stopped the thread past a block's start, the
//! rest of that block is reported then (`Arrival::Resumed`). The follower
//! and the program run on one CPU unless `Options::no_pin`, and the
//! program's `sched_getaffinity` then gets the mask it would have had.

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use iced_x86::{FlowControl, Mnemonic};

use crate::emulate::{self, Plan};
use crate::module::TracedModule;
use crate::scratch::{Displaced, Scratch};
use crate::sys::{self, Mem, Pid, Regs};
use crate::{Arrival, Error, Event, Exit, LoadedModule, Observer, Options, Outcome, Result, Stats};

const INT3: u8 = 0xcc;

/// A position: module index and block index.
type Pos = (usize, usize);

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Mode {
    /// Runs freely (or is stopped between two events).
    Run,
    /// Single-stepping the instruction under the breakpoint at `bp`:
    /// the block's last one (`end`), or the first one under an entry trap;
    /// in place, or a copy of it in the scratch page (`disp`).
    Step {
        bp: u64,
        end: bool,
        disp: Option<Displaced>,
    },
}

/// A position interrupted by a signal: the block, its pending chain, the
/// entry trap the thread stood on, if any, and the runtime address the
/// thread stopped at when that is inside a block it had begun (a handler
/// that returns resumes the rest of it there).
type Interrupted = (Pos, Vec<usize>, Option<u64>, Option<u64>);

struct Thread {
    cur: Option<Pos>,
    mode: Mode,
    /// Blocks of `cur`'s module entered by falling through after the
    /// block last reported and not reported yet, in order (the last one is
    /// `cur`): see `land`.
    pending: Vec<usize>,
    /// Positions interrupted by signals, innermost last.
    interrupted: Vec<Interrupted>,
    /// Awaiting the `SIGSTOP` every new thread starts with.
    fresh: bool,
    /// Return point of the thread's latest call from traced code.
    last_call: u64,
    /// The thread's slot in the scratch page, once it needed one.
    slot: Option<u64>,
    /// A SIGTRAP of the program's own was delivered with a single step:
    /// the next trap is at its handler's first instruction.
    trap_delivered: bool,
}

impl Thread {
    fn new(fresh: bool) -> Thread {
        Thread {
            cur: None,
            mode: Mode::Run,
            pending: Vec::new(),
            interrupted: Vec::new(),
            fresh,
            last_call: 0,
            slot: None,
            trap_delivered: false,
        }
    }
}

struct Tracer<'o> {
    pid: Pid,
    mem: Mem,
    modules: Vec<TracedModule>,
    /// Runtime address -> original byte, for every breakpoint in memory.
    bps: HashMap<u64, u8>,
    /// Runtime addresses of entry traps.
    entries: HashSet<u64>,
    /// Threads stepping in place over the breakpoint at each address: its
    /// original byte stays in memory until the last one is done (a thread
    /// that found it restored and stepped would else run the `int3` put
    /// back by another and resume one byte into the instruction).
    stepping: HashMap<u64, u32>,
    /// The program's entry point: traced libraries not mapped by then are
    /// an error.
    load_trap: Option<u64>,
    /// The loader's notification point (`loader.rs`), where traced
    /// libraries are armed before their initialisers run; removed once all
    /// are mapped.
    notify_trap: Option<u64>,
    threads: HashMap<Pid, Thread>,
    /// Forked children already given back their original bytes.
    released: HashSet<Pid>,
    observer: &'o mut dyn Observer,
    stats: Stats,
    /// Where non-branch instructions under a breakpoint are executed
    /// (`None`: in place, racy with threads).
    scratch: Option<Scratch>,
    next_slot: u64,
    /// When pinned: the affinity the program would have had unpinned, which
    /// its `sched_getaffinity` gets and released processes get back.
    unpinned: Option<sys::CpuMask>,
}

/// Runs `program` with `args` (stdin, stdout and stderr inherited) and
/// reports every block of the traced modules each thread enters to
/// `observer`, until the program exits.
pub fn follow(
    program: &Path,
    args: &[OsString],
    options: &Options,
    observer: &mut dyn Observer,
) -> Result<Outcome> {
    let started = Instant::now();
    let path = resolve(program)?;
    let mut modules = vec![TracedModule::open(&path)?];
    for lib in &options.libs {
        let lib = std::fs::canonicalize(lib).map_err(|source| Error::Sys {
            what: "canonicalize",
            tid: 0,
            source,
        })?;
        modules.push(TracedModule::open(&lib)?);
    }
    let cstr = |s: &OsStr| {
        CString::new(s.as_bytes()).map_err(|_| Error::Nul {
            arg: s.to_string_lossy().into_owned(),
        })
    };
    let mut argv = vec![cstr(
        options.argv0.as_deref().unwrap_or(program.as_os_str()),
    )?];
    for a in args {
        argv.push(cstr(a)?);
    }
    let mut envp = Vec::new();
    let overridden = |k: &[u8]| options.env.iter().any(|(o, _)| o.as_bytes() == k);
    match &options.environment {
        Some(all) => {
            for e in all {
                let b = e.as_bytes();
                let key = b.split(|&c| c == b'=').next().unwrap_or(b);
                if !overridden(key) {
                    envp.push(cstr(e)?);
                }
            }
        }
        None => {
            for (k, v) in std::env::vars_os() {
                if !overridden(k.as_bytes()) {
                    envp.push(kv(&k, &v)?);
                }
            }
        }
    }
    for (k, v) in &options.env {
        envp.push(kv(k, v)?);
    }
    let open = |p: &Path, write: bool| {
        std::fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .create(write)
            .truncate(write)
            .open(p)
            .map_err(|source| Error::Io {
                path: p.to_path_buf(),
                source,
            })
    };
    let stdin = options
        .stdin
        .as_deref()
        .map(|p| open(p, false))
        .transpose()?;
    let stdout = options
        .stdout
        .as_deref()
        .map(|p| open(p, true))
        .transpose()?;
    let cwd = match &options.cwd {
        Some(d) => {
            // Checked here: in the child a failed chdir could only exit.
            if !d.is_dir() {
                return Err(Error::Io {
                    path: d.clone(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                });
            }
            Some(cstr(d.as_os_str())?)
        }
        None => None,
    };
    // Every ptrace stop wakes the other side: across CPUs that is an
    // inter-processor interrupt (costly in a VM), on one CPU a plain context
    // switch. The program inherits the mask, its threads too; it would see
    // one CPU where the recorded run saw them all (`sort` then starts fewer
    // threads), so its `sched_getaffinity` is answered with the mask it
    // would have had (docs/verify.md, Speed).
    let mut pinned = if options.no_pin {
        None
    } else {
        sys::pin_here()
    };
    let pid = sys::spawn(
        &cstr(path.as_os_str())?,
        &argv,
        &envp,
        cwd.as_ref(),
        stdin.as_ref(),
        stdout.as_ref(),
        pinned.as_ref().map(|p| p.former()).as_ref(),
    )?;
    let (_, status) = sys::wait_any()?;
    if !libc::WIFSTOPPED(status) {
        return Err(Error::Launch {
            program: program.display().to_string(),
            status,
        });
    }
    // A program that could not get the filter runs unpinned: so do we.
    if sys::affinity_of(pid, 128).1 != sys::affinity_of(0, 128).1 {
        pinned = None;
    }
    sys::set_options(
        pid,
        libc::PTRACE_O_TRACECLONE
            | libc::PTRACE_O_TRACEFORK
            | libc::PTRACE_O_TRACEEXEC
            | libc::PTRACE_O_TRACEEXIT
            | libc::PTRACE_O_TRACESECCOMP
            | libc::PTRACE_O_EXITKILL,
    )?;
    let mut t = Tracer {
        pid,
        mem: Mem::open(pid)?,
        modules,
        bps: HashMap::new(),
        entries: HashSet::new(),
        stepping: HashMap::new(),
        load_trap: None,
        notify_trap: None,
        threads: HashMap::new(),
        released: HashSet::new(),
        observer,
        stats: Stats {
            threads: 1,
            ..Stats::default()
        },
        scratch: None,
        next_slot: 0,
        unpinned: pinned.as_ref().map(|p| p.former()),
    };
    t.threads.insert(pid, Thread::new(false));
    t.map_module(0)?;
    // Still one thread: the only moment the scratch page can be mapped
    // without a race.
    let main = &t.modules[0];
    t.scratch = Scratch::map(pid, &t.mem, main.lo + main.base, main.hi + main.base)?;
    if t.modules.len() > 1 {
        t.notify_trap = crate::loader::notify_point(pid)?;
        if let Some(a) = t.notify_trap {
            t.insert(a)?;
        }
        let entry = t.modules[0]
            .program
            .module
            .entry
            .wrapping_add(t.modules[0].base);
        t.load_trap = Some(entry);
        t.insert(entry)?;
    }
    let (exit, stopped) = t.run()?;
    Ok(Outcome {
        exit,
        modules: t
            .modules
            .iter()
            .map(|m| LoadedModule {
                path: m.path.clone(),
                base: m.base,
            })
            .collect(),
        stats: t.stats,
        elapsed: started.elapsed(),
        cpu: pinned.as_ref().map(|p| p.cpu),
        stopped,
    })
}

/// Longest fall-through chain followed without a stop.
const MAX_CHAIN: usize = 64;

/// The block that always follows block `b` of `module`, if its last
/// instruction decides it statically: one that goes on to the next
/// instruction (`rep` string instructions and system calls excluded: they
/// are where the paper's Section 4.1 cases live and may not come back), or
/// a direct `jmp` to a block of the module.
fn static_successor(module: &TracedModule, b: usize) -> Option<usize> {
    let blk = &module.blocks[b];
    let insn = &blk.insn;
    if insn.flow_control() == FlowControl::Next
        && !(insn.is_string_instruction() && (insn.has_rep_prefix() || insn.has_repne_prefix()))
        && !matches!(insn.mnemonic(), Mnemonic::Syscall | Mnemonic::Sysenter)
    {
        module.block_at(blk.end)
    } else if insn.is_jmp_short_or_near() {
        module.block_at(insn.near_branch_target())
    } else {
        None
    }
}

/// How a process ended, from its wait status.
fn exit_of(status: i32) -> Exit {
    if libc::WIFEXITED(status) {
        Exit::Code(libc::WEXITSTATUS(status))
    } else {
        Exit::Signal(libc::WTERMSIG(status))
    }
}

/// `KEY=VALUE` for `execve`.
fn kv(k: &OsStr, v: &OsStr) -> Result<CString> {
    let mut b = k.as_bytes().to_vec();
    b.push(b'=');
    b.extend_from_slice(v.as_bytes());
    CString::new(b).map_err(|_| Error::Nul {
        arg: k.to_string_lossy().into_owned(),
    })
}

/// `program` as a canonical path: as given when it contains a `/`, else
/// searched on `PATH` like `execvp`.
pub(crate) fn resolve(program: &Path) -> Result<PathBuf> {
    let not_found = || Error::NotFound {
        program: program.display().to_string(),
    };
    let candidate = if program.as_os_str().as_bytes().contains(&b'/') {
        Some(program.to_owned())
    } else {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(program))
                .find(|c| c.is_file())
        })
    };
    std::fs::canonicalize(candidate.ok_or_else(not_found)?).map_err(|_| not_found())
}

impl Tracer<'_> {
    /// Finds module `m`'s load base in the process's mappings, checks the
    /// code there against the file, and writes its entry traps.
    fn map_module(&mut self, m: usize) -> Result<()> {
        let module = &mut self.modules[m];
        let base = match module.program.module.kind {
            aetrace_analysis::elf::ElfKind::Exec => 0,
            _ => sys::map_base(self.pid, &module.path)?.ok_or_else(|| Error::NotMapped {
                path: module.path.clone(),
            })?,
        };
        module.base = base;
        module.mapped = true;
        if let Some(b) = module.blocks.first() {
            let want = module.program.module.bytes_at(b.start, b.end - b.start);
            let mut got = vec![0u8; (b.end - b.start) as usize];
            self.mem.read(b.start + base, &mut got)?;
            if want != Some(&got[..]) {
                return Err(Error::CodeMismatch {
                    path: module.path.clone(),
                    addr: b.start + base,
                });
            }
        }
        let addrs: Vec<u64> = module
            .entries
            .iter()
            .map(|&i| module.blocks[i as usize].start + base)
            .collect();
        for a in addrs {
            self.entries.insert(a);
            self.insert(a)?;
        }
        Ok(())
    }

    /// Arms every traced library the process has mapped by now (with
    /// `required`, one it has not is an error); once all are, removes the
    /// notification trap and tells the observer. Returns whether all are.
    fn map_loaded(&mut self, tid: Pid, required: bool) -> Result<bool> {
        let (mut all, mut armed) = (true, false);
        for m in 1..self.modules.len() {
            if self.modules[m].mapped {
                continue;
            }
            if required || sys::map_base(self.pid, &self.modules[m].path)?.is_some() {
                self.map_module(m)?;
                armed = true;
            } else {
                all = false;
            }
        }
        if all {
            if let Some(a) = self.notify_trap.take() {
                let orig = self.bps.remove(&a).unwrap_or(INT3);
                self.mem.write(a, &[orig])?;
            }
            if armed {
                self.event(tid, Event::LibrariesMapped { at_entry: required });
            }
        }
        Ok(all)
    }

    /// Writes a breakpoint at runtime `addr` (once).
    fn insert(&mut self, addr: u64) -> Result<()> {
        if self.bps.contains_key(&addr) {
            return Ok(());
        }
        let mut orig = [0u8];
        self.mem.read(addr, &mut orig)?;
        self.mem.write(addr, &[INT3])?;
        self.bps.insert(addr, orig[0]);
        self.stats.breakpoints += 1;
        Ok(())
    }

    fn module_of(&self, rip: u64) -> Option<usize> {
        self.modules.iter().position(|m| m.covers(rip))
    }

    fn emit(&mut self, tid: Pid, (m, b): Pos, arrival: Arrival) {
        self.stats.blocks += 1;
        let start = self.modules[m].blocks[b].start;
        self.observer.block(tid, m, start, arrival);
    }

    /// Reports the rest of a block resumed at runtime `rip` of module `m`
    /// after a signal handler returned (the regenerator lists it so too).
    fn emit_resumed(&mut self, tid: Pid, m: usize, rip: u64) {
        let module = &self.modules[m];
        let a = rip - module.base;
        let Some(c) = module.block_containing(a) else {
            debug_assert!(false, "a resume point {a:#x} outside every block");
            return;
        };
        let block = module.blocks[c].start;
        self.stats.blocks += 1;
        self.observer.block(tid, m, a, Arrival::Resumed { block });
    }

    fn event(&mut self, tid: Pid, e: Event) {
        if matches!(e, Event::Resync { .. }) {
            self.stats.resyncs += 1;
        }
        self.observer.event(tid, &e);
    }

    fn thread(&mut self, tid: Pid) -> &mut Thread {
        self.threads
            .entry(tid)
            .or_insert_with(|| Thread::new(false))
    }

    /// The wait loop; returns how the program ended, and whether it was
    /// killed because the observer was done.
    fn run(&mut self) -> Result<(Exit, bool)> {
        // The first stop is after execve: a static program is at its first
        // instruction, a dynamic one in the loader.
        let regs = sys::get_regs(self.pid)?;
        self.land(self.pid, regs, None, Arrival::Entry)?;
        let mut exec_detached = false;
        loop {
            if self.observer.done() && !exec_detached {
                return self.kill().map(|e| (e, true));
            }
            let (tid, status) = sys::wait_any()?;
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                if self.threads.remove(&tid).is_some() && tid != self.pid {
                    self.event(tid, Event::ThreadExit { status });
                }
                if tid == self.pid {
                    return Ok((exit_of(status), false));
                }
                continue;
            }
            if !libc::WIFSTOPPED(status) || exec_detached {
                continue;
            }
            let sig = libc::WSTOPSIG(status);
            let ptrace_event = status >> 16;
            if !self.threads.contains_key(&tid) && !self.adopt(tid)? {
                continue;
            }
            match ptrace_event {
                0 => {}
                libc::PTRACE_EVENT_CLONE => {
                    let new = sys::event_msg(tid)? as Pid;
                    if let std::collections::hash_map::Entry::Vacant(e) = self.threads.entry(new) {
                        e.insert(Thread::new(true));
                        self.stats.threads += 1;
                        self.event(new, Event::ThreadStart);
                    }
                    self.continue_after_event(tid)?;
                    continue;
                }
                libc::PTRACE_EVENT_FORK => {
                    let child = sys::event_msg(tid)? as Pid;
                    self.release_child(child, false)?;
                    self.continue_after_event(tid)?;
                    continue;
                }
                libc::PTRACE_EVENT_EXIT => {
                    // The thread is leaving (exit, exit_group, or killed by
                    // another thread's exit): chain blocks it entered before
                    // the system call happened.
                    if let Ok(regs) = sys::get_regs(tid) {
                        let n = self.entered(tid, regs.rip);
                        self.flush(tid, n);
                    }
                    self.continue_after_event(tid)?;
                    continue;
                }
                libc::PTRACE_EVENT_SECCOMP => {
                    self.answer_affinity(tid)?;
                    self.continue_after_event(tid)?;
                    continue;
                }
                libc::PTRACE_EVENT_EXEC => {
                    // The new image has none of our breakpoints: let it run.
                    self.event(tid, Event::Exec);
                    if let Some(m) = &self.unpinned {
                        sys::set_affinity(tid, m);
                    }
                    sys::detach(tid, 0)?;
                    exec_detached = true;
                    continue;
                }
                _ => {
                    self.continue_after_event(tid)?;
                    continue;
                }
            }
            let th = self.thread(tid);
            if sig == libc::SIGSTOP && th.fresh {
                th.fresh = false;
                sys::cont(tid, 0)?;
            } else if sig == libc::SIGTRAP {
                self.trap(tid)?;
            } else {
                self.signal(tid, sig)?;
            }
        }
    }

    /// Kills the program (the observer is done) and reaps it. Its threads
    /// may still report stops on the way out (an exit event): they are let
    /// go, and a thread already gone is no error.
    fn kill(&mut self) -> Result<Exit> {
        sys::kill(self.pid)?;
        loop {
            let (tid, status) = sys::wait_any()?;
            if tid == self.pid && (libc::WIFEXITED(status) || libc::WIFSIGNALED(status)) {
                return Ok(exit_of(status));
            }
            if libc::WIFSTOPPED(status) {
                let _ = sys::cont(tid, 0);
            }
        }
    }

    /// Resumes a thread after a ptrace event stop: a thread in the middle of
    /// a step (a `clone` or `fork` syscall being stepped over) goes on
    /// stepping, so that the step still ends in a trap.
    fn continue_after_event(&mut self, tid: Pid) -> Result<()> {
        match self.thread(tid).mode {
            Mode::Step { .. } => sys::step(tid, 0),
            Mode::Run => sys::cont(tid, 0),
        }
    }

    /// A stop from a pid we do not know yet: a new thread whose `SIGSTOP`
    /// came before its parent's clone event, or a forked child. Returns
    /// whether it is a thread to follow.
    fn adopt(&mut self, tid: Pid) -> Result<bool> {
        let status = std::fs::read_to_string(format!("/proc/{tid}/status")).unwrap_or_default();
        let tgid = status
            .lines()
            .find_map(|l| l.strip_prefix("Tgid:"))
            .and_then(|v| v.trim().parse::<Pid>().ok());
        if tgid == Some(self.pid) {
            self.threads.insert(tid, Thread::new(true));
            self.stats.threads += 1;
            self.event(tid, Event::ThreadStart);
            Ok(true)
        } else {
            self.release_child(tid, true)?;
            Ok(false)
        }
    }

    /// A forked child inherits our breakpoints: put the original bytes back
    /// in its copy of memory and let it go untraced. Called twice per child
    /// (its first stop and its parent's fork event, in either order).
    fn release_child(&mut self, child: Pid, stopped: bool) -> Result<()> {
        if !self.released.insert(child) {
            return Ok(());
        }
        if !stopped {
            sys::wait_pid(child)?;
        }
        let mem = Mem::open(child)?;
        for (&addr, &orig) in &self.bps {
            mem.write(addr, &[orig])?;
        }
        if let Some(m) = &self.unpinned {
            sys::set_affinity(child, m);
        }
        sys::detach(child, 0)?;
        self.observer
            .event(self.pid, &Event::ForkDetached { child });
        Ok(())
    }

    /// A pinned program's `sched_getaffinity` (stopped by its seccomp
    /// filter, before the call): answer it as the kernel would for the
    /// unpinned program, and skip the call. Another process's affinity is
    /// the kernel's answer unchanged.
    fn answer_affinity(&mut self, tid: Pid) -> Result<()> {
        let mut regs = sys::get_regs(tid)?;
        let (pid, len, buf) = (regs.rdi as Pid, regs.rsi as usize, regs.rdx);
        let (mut r, mut mask) = sys::affinity_of(pid, len);
        let ours = pid == 0 || self.threads.contains_key(&pid);
        if let (true, Some(m)) = (ours, &self.unpinned) {
            mask = *m;
        }
        if let Some(bytes) = usize::try_from(r).ok().and_then(|n| mask.get(..n)) {
            if self.mem.write(buf, bytes).is_err() {
                r = -i64::from(libc::EFAULT);
            }
        }
        // Syscall number -1: the kernel skips the call and returns `rax`.
        regs.orig_rax = u64::MAX;
        regs.rax = r as u64;
        sys::set_regs(tid, &regs)
    }

    /// A `SIGTRAP` stop: a breakpoint, the end of a single step, or the
    /// program's own trap.
    fn trap(&mut self, tid: Pid) -> Result<()> {
        let mut regs = sys::get_regs(tid)?;
        let th = self
            .threads
            .entry(tid)
            .or_insert_with(|| Thread::new(false));
        if std::mem::take(&mut th.trap_delivered) {
            // At the first instruction of the program's SIGTRAP handler (or
            // one instruction further, when it ignores the signal). The
            // handler runs with SIGTRAP blocked, and a breakpoint of ours
            // hit then would make the kernel reset the program's handler
            // (`force_sig`): SIGTRAP stays unblocked while it runs; its
            // `sigreturn` restores the mask the program had.
            sys::unblock(tid, libc::SIGTRAP)?;
            return self.land(tid, regs, None, Arrival::Entry);
        }
        if let Mode::Step { bp, end, disp } = th.mode {
            if end && regs.rip == disp.map_or(bp, |d| d.at) {
                // A `rep` string instruction steps one iteration at a time
                // (paper, Section 4.1): keep stepping until it is done.
                self.stats.steps += 1;
                return sys::step(tid, 0);
            }
            th.mode = Mode::Run;
            let cur = th.cur;
            match disp {
                None => self.stepped(bp)?,
                Some(d) if regs.rip == d.done => {
                    regs.rip = d.back;
                    sys::set_rip(tid, regs.rip)?;
                }
                // The copy went elsewhere (`rt_sigreturn`, `execve`): so did
                // the original.
                Some(_) => {}
            }
            if end && self.signal_follows(tid, cur)? {
                // The system call made a signal pending for the thread (a
                // `kill` of itself): its handler runs before the next
                // block's first instruction, so that block is entered when
                // control comes back to it, through an entry trap.
                self.thread(tid).cur = None;
                self.arm_entry(regs.rip)?;
                return sys::cont(tid, 0);
            }
            if end {
                return self.land(tid, regs, cur, Arrival::Flow);
            }
            // Stepped the first instruction of a block under an entry trap;
            // the thread is inside that block now.
            return self.resume(tid, regs);
        }
        let x = regs.rip.wrapping_sub(1);
        if !self.bps.contains_key(&x) {
            // Not ours (`raise(SIGTRAP)`, an `int3` we did not place).
            return self.deliver(tid, libc::SIGTRAP, None);
        }
        self.stats.traps += 1;
        regs.rip = x;
        if self.notify_trap == Some(x) {
            // In the loader, one thread: step its instruction in place.
            sys::set_regs(tid, &regs)?;
            if self.map_loaded(tid, false)? {
                return sys::cont(tid, 0);
            }
            return self.step_over(tid, regs, self.bps[&x], false);
        }
        if self.load_trap == Some(x) {
            self.map_loaded(tid, true)?;
            self.load_trap = None;
            if !self.entries.contains(&x) {
                let orig = self.bps.remove(&x).unwrap_or(INT3);
                self.mem.write(x, &[orig])?;
                sys::set_regs(tid, &regs)?;
                return self.land(tid, regs, None, Arrival::Entry);
            }
        }
        let th = self
            .threads
            .entry(tid)
            .or_insert_with(|| Thread::new(false));
        let cur = th.cur;
        if let Some((m, b)) = cur {
            let base = self.modules[m].base;
            if self.modules[m].blocks[b].last + base == x {
                self.flush(tid, usize::MAX);
                return self.end(tid, regs, (m, b));
            }
            // An entry trap on a block of the chain, or a breakpoint on the
            // last instruction of one (armed when it ended another chain):
            // report the chain up to there and go on.
            let blocks = &self.modules[m].blocks;
            let hit = th.pending.iter().position(|&p| blocks[p].start + base == x);
            let hit = hit.or_else(|| th.pending.iter().position(|&p| blocks[p].last + base == x));
            if let Some(i) = hit {
                self.flush(tid, i + 1);
                sys::set_rip(tid, regs.rip)?;
                return self.resume(tid, regs);
            }
        }
        // Back from a signal handler into the chain it interrupted (at the
        // end of its last block, of a pending block, or the start of one)?
        let modules = &self.modules;
        let at_pending = |(m, _): Pos, pending: &[usize]| {
            let (blocks, base) = (&modules[m].blocks, modules[m].base);
            pending
                .iter()
                .position(|&p| blocks[p].start + base == x || blocks[p].last + base == x)
        };
        if let Some(i) = th
            .interrupted
            .iter()
            .rposition(|&((m, b), ref pending, at, _)| {
                modules[m].blocks[b].last + modules[m].base == x
                    || at == Some(x)
                    || at_pending((m, b), pending).is_some()
            })
        {
            let (pos, pending, _, mid) = th.interrupted.swap_remove(i);
            th.interrupted.truncate(i);
            let hit = at_pending(pos, &pending);
            th.cur = Some(pos);
            th.pending = pending;
            if let Some(r) = mid {
                // The handler returned into the middle of a block: the
                // rest of it runs now, after the handler's blocks.
                self.emit_resumed(tid, pos.0, r);
            }
            if self.modules[pos.0].blocks[pos.1].last + self.modules[pos.0].base == x {
                self.flush(tid, usize::MAX);
            } else if let Some(i) = hit {
                self.flush(tid, i + 1);
            }
            sys::set_rip(tid, regs.rip)?;
            return self.resume(tid, regs);
        }
        if self.entries.contains(&x) {
            if let Some((m, _)) = cur {
                self.event(
                    tid,
                    Event::Resync {
                        module: m,
                        at: x - self.modules[m].base,
                        reason: "entered a procedure or call-return block without a branch to it",
                    },
                );
            }
            sys::set_rip(tid, regs.rip)?;
            return self.land(tid, regs, None, Arrival::Entry);
        }
        // An end trap of a block whose start we did not see.
        let Some(m) = self.module_of(x) else {
            return self.deliver(tid, libc::SIGTRAP, None);
        };
        let module = &self.modules[m];
        let a = x - module.base;
        match module.block_containing(a) {
            Some(b) if module.blocks[b].last == a => {
                let start = module.blocks[b].start;
                self.event(
                    tid,
                    Event::Resync {
                        module: m,
                        at: start,
                        reason: "reached the end of a block whose start was not seen",
                    },
                );
                self.thread(tid).cur = Some((m, b));
                self.emit(tid, (m, b), Arrival::Unobserved);
                self.end(tid, regs, (m, b))
            }
            _ => self.deliver(tid, libc::SIGTRAP, None),
        }
    }

    /// The thread is at runtime `regs.rip`, just arrived from `from` (or
    /// from untraced code): report the block and let it run to the block's
    /// end.
    fn land(&mut self, tid: Pid, regs: Regs, from: Option<Pos>, arrival: Arrival) -> Result<()> {
        let rip = regs.rip;
        let Some(m) = self.module_of(rip) else {
            self.thread(tid).cur = None;
            if let Some(pos) = from {
                self.arm_return(tid, pos, &regs)?;
            }
            return sys::cont(tid, 0);
        };
        let module = &self.modules[m];
        let a = rip - module.base;
        let (b, problem) = match module.block_at(a) {
            Some(b) => {
                let mut problem = None;
                if let Some((_, fb)) = from.filter(|&(fm, _)| fm == m) {
                    let f = &module.blocks[fb];
                    let local = f.proc == module.blocks[b].proc
                        && !matches!(
                            emulate::plan(&f.insn),
                            Some(Plan::Call | Plan::CallIndirect | Plan::Ret)
                        );
                    if local && !f.unresolved && !f.succs.contains(&(b as u32)) {
                        problem = Some(Event::MissingEdge {
                            module: m,
                            from: f.start,
                            to: a,
                            proc: module.proc_name(b).to_owned(),
                        });
                    }
                }
                (b, problem)
            }
            None => match module.block_containing(a) {
                Some(b) => (
                    b,
                    Some(Event::MissingBlock {
                        module: m,
                        addr: a,
                        containing: module.blocks[b].start,
                        proc: module.proc_name(b).to_owned(),
                    }),
                ),
                None => {
                    self.event(tid, Event::Untraced { module: m, addr: a });
                    self.thread(tid).cur = None;
                    if let Some(pos) = from {
                        self.arm_return(tid, pos, &regs)?;
                    }
                    return sys::cont(tid, 0);
                }
            },
        };
        if let Some(e) = problem {
            self.event(tid, e);
        }
        // A missing block is reported at the address control reached.
        self.stats.blocks += 1;
        self.observer.block(tid, m, a, arrival);
        // Blocks that fall through into the next block need no stop of
        // their own: follow the chain statically and stop only at the end of
        // its last block. The chained blocks are reported when the thread
        // reaches that end (or an entry trap inside the chain, or a
        // signal), so the order stays exact.
        let module = &self.modules[m];
        let mut end = b;
        let mut pending = Vec::new();
        while let Some(next) = static_successor(module, end) {
            // Stop before a cycle (`jmp .`, a loop of jumps).
            if next == b || pending.contains(&next) || pending.len() >= MAX_CHAIN {
                break;
            }
            pending.push(next);
            end = next;
        }
        let last = module.blocks[end].last + module.base;
        let th = self.thread(tid);
        th.cur = Some((m, end));
        th.pending = pending;
        self.insert(last)?;
        self.resume(tid, regs)
    }

    /// Control left the traced modules from block `pos`: the place it comes
    /// back to must hold an entry trap. After a call that is the return
    /// point; after a jump (a tail call into a library) it is the return
    /// address on top of the stack. Return points are armed this lazily, so
    /// returns from traced callees, the common case, never stop there.
    /// A jump out can also be the PLT's lazy-binding path, which pushes two
    /// words first: the latest call's return point is armed as well (an
    /// extra entry trap is only ever a cost, never an error).
    fn arm_return(&mut self, tid: Pid, (m, b): Pos, regs: &Regs) -> Result<()> {
        let insn = self.modules[m].blocks[b].insn;
        match insn.flow_control() {
            FlowControl::Call | FlowControl::IndirectCall => {
                self.arm_entry(insn.next_ip() + self.modules[m].base)
            }
            FlowControl::UnconditionalBranch
            | FlowControl::IndirectBranch
            | FlowControl::ConditionalBranch => {
                // The top word (a tail call); the third (PLT0's lazy path
                // jumps out with the link map and the relocation index
                // pushed over the return address of a call, or of a tail
                // call's caller, which `last_call` may not be: found on
                // `sort`).
                let top = self.mem.read_u64(regs.rsp)?;
                self.arm_entry(top)?;
                // Above the top of a stack it may not be mapped.
                if let Ok(third) = self.mem.read_u64(regs.rsp + 16) {
                    self.arm_entry(third)?;
                }
                let last = self.thread(tid).last_call;
                self.arm_entry(last)
            }
            _ => Ok(()),
        }
    }

    /// Whether block `cur` ended in a system call that left an unblocked
    /// signal pending for thread `tid` (`/proc/TID/status`), which the
    /// kernel delivers before the thread runs another instruction.
    fn signal_follows(&self, tid: Pid, cur: Option<Pos>) -> Result<bool> {
        let Some((m, b)) = cur else { return Ok(false) };
        if self.modules[m].blocks[b].insn.mnemonic() != Mnemonic::Syscall {
            return Ok(false);
        }
        let status = std::fs::read_to_string(format!("/proc/{tid}/status")).map_err(|source| {
            Error::Sys {
                what: "read /proc/TID/status",
                tid,
                source,
            }
        })?;
        let mask = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .unwrap_or(0)
        };
        Ok((mask("SigPnd:") | mask("ShdPnd:")) & !mask("SigBlk:") != 0)
    }

    /// Makes the block start at runtime `back`, if it is one, an entry trap.
    fn arm_entry(&mut self, back: u64) -> Result<()> {
        if self.entries.contains(&back) {
            return Ok(());
        }
        let Some(rm) = self.module_of(back) else {
            return Ok(());
        };
        if self.modules[rm]
            .block_at(back - self.modules[rm].base)
            .is_some()
        {
            self.entries.insert(back);
            self.insert(back)?;
        }
        Ok(())
    }

    /// The thread is inside its current block at `regs.rip` (not yet
    /// executed): run it to the block's end, stepping over (or emulating)
    /// the instruction under an entry trap at `rip` first.
    fn resume(&mut self, tid: Pid, mut regs: Regs) -> Result<()> {
        let rip = regs.rip;
        let Some(&orig) = self.bps.get(&rip) else {
            return sys::cont(tid, 0);
        };
        if let Some((m, b)) = self.thread(tid).cur {
            let module = &self.modules[m];
            if module.blocks[b].last + module.base == rip {
                self.flush(tid, usize::MAX);
                return self.end(tid, regs, (m, b));
            }
            let here = module.block_at(rip.wrapping_sub(module.base));
            if let Some(first) = here
                .map(|h| module.blocks[h].first)
                .filter(emulate::first_ok)
            {
                emulate::run_first(&first, &mut regs, &self.mem)?;
                if first.mnemonic() == Mnemonic::Push {
                    sys::set_regs(tid, &regs)?;
                } else {
                    sys::set_rip(tid, regs.rip)?;
                }
                self.stats.emulated += 1;
                return self.resume(tid, regs);
            }
        }
        self.step_over(tid, regs, orig, false)
    }

    /// Executes the instruction under the breakpoint at `regs.rip` (whose
    /// original byte is `orig`) by one single step: from a copy in the
    /// scratch page when it can run there, else in place with the byte put
    /// back for that step.
    fn step_over(&mut self, tid: Pid, mut regs: Regs, orig: u8, end: bool) -> Result<()> {
        let bp = regs.rip;
        if orig == INT3 && !end {
            // The program's own `int3` under an entry breakpoint: stepping it
            // would raise the program's SIGTRAP inside our step, taken for
            // the step's end. Do what the CPU does (rip past it) and deliver.
            regs.rip = bp + 1;
            sys::set_rip(tid, regs.rip)?;
            return self.deliver(tid, libc::SIGTRAP, None);
        }
        let disp = self.displace(tid, bp)?;
        match disp {
            Some(d) => {
                regs.rip = d.at;
                sys::set_rip(tid, regs.rip)?;
                self.stats.displaced += 1;
            }
            None => {
                *self.stepping.entry(bp).or_insert(0) += 1;
                self.mem.write(bp, &[orig])?
            }
        }
        self.thread(tid).mode = Mode::Step { bp, end, disp };
        self.stats.steps += 1;
        sys::step(tid, 0)
    }

    /// A thread's in-place step over the breakpoint at `bp` is over (done or
    /// interrupted): the last one puts the `int3` back.
    fn stepped(&mut self, bp: u64) -> Result<()> {
        let n = self.stepping.get(&bp).copied().unwrap_or(1);
        debug_assert!(n > 0, "a step in place is counted");
        if n > 1 {
            self.stepping.insert(bp, n - 1);
            return Ok(());
        }
        self.stepping.remove(&bp);
        self.mem.write(bp, &[INT3])
    }

    /// Copies the instruction at runtime `rip` of a traced module into the
    /// thread's scratch slot, if it can run there.
    fn displace(&mut self, tid: Pid, rip: u64) -> Result<Option<Displaced>> {
        let (Some(scratch), Some(m)) = (&self.scratch, self.module_of(rip)) else {
            return Ok(None);
        };
        let module = &self.modules[m];
        let link = rip - module.base;
        let Some(b) = module.block_containing(link) else {
            return Ok(None);
        };
        let len = (module.blocks[b].end - link).min(15);
        let Some(bytes) = module.program.module.bytes_at(link, len) else {
            return Ok(None);
        };
        let th = self
            .threads
            .entry(tid)
            .or_insert_with(|| Thread::new(false));
        let slot = *th.slot.get_or_insert_with(|| {
            self.next_slot += 1;
            self.next_slot - 1
        });
        scratch.place(&self.mem, slot, rip, bytes)
    }

    /// The thread is at the last instruction of block `pos` (`regs.rip`,
    /// not yet executed): execute it and land on the next block.
    fn end(&mut self, tid: Pid, mut regs: Regs, pos: Pos) -> Result<()> {
        let (m, b) = pos;
        let base = self.modules[m].base;
        let insn = self.modules[m].blocks[b].insn;
        if let Some(plan) = emulate::plan(&insn) {
            if matches!(plan, Plan::Call | Plan::CallIndirect) {
                self.thread(tid).last_call = insn.next_ip() + base;
            }
            emulate::run(plan, &insn, base, &mut regs, &self.mem)?;
            match plan {
                // Only `rip` changed: the most common stop (a `jcc`).
                Plan::Jump | Plan::JumpIndirect => sys::set_rip(tid, regs.rip)?,
                Plan::Call | Plan::CallIndirect | Plan::Ret => sys::set_regs(tid, &regs)?,
            }
            self.stats.emulated += 1;
            return self.land(tid, regs, Some(pos), Arrival::Flow);
        }
        sys::set_rip(tid, regs.rip)?;
        if insn.mnemonic() == Mnemonic::Int3 {
            // The program's own breakpoint: what the CPU would do is raise
            // SIGTRAP with rip after the int3.
            regs.rip += 1;
            sys::set_rip(tid, regs.rip)?;
            self.thread(tid).cur = None;
            // A handler that returns goes on at the next block: make it an
            // entry, or the thread would be found again only at a later trap.
            self.arm_entry(regs.rip)?;
            return self.deliver(tid, libc::SIGTRAP, None);
        }
        let rip = regs.rip;
        debug_assert!(self.bps.contains_key(&rip), "end() runs at a breakpoint");
        let orig = self.bps[&rip];
        self.step_over(tid, regs, orig, true)
    }

    /// A signal stop: pass the signal on. A block it interrupts is resumed
    /// when its end trap is reached again.
    fn signal(&mut self, tid: Pid, sig: i32) -> Result<()> {
        let th = self.thread(tid);
        if let Mode::Step { bp, end, disp } = th.mode {
            // The stepped instruction did not complete (a fault, or a
            // signal that came first): it will run again later, under the
            // breakpoint.
            th.mode = Mode::Run;
            match disp {
                None => self.stepped(bp)?,
                Some(d) => {
                    // The handler must return to the program, not the copy.
                    let mut regs = sys::get_regs(tid)?;
                    if regs.rip == d.at || regs.rip == d.done {
                        regs.rip = if regs.rip == d.at { bp } else { d.back };
                        sys::set_rip(tid, regs.rip)?;
                    }
                }
            }
            // Stopped on a block's first instruction under an entry trap:
            // that trap fires again when the handler returns and must not
            // count as a new entry.
            return self.deliver(tid, sig, (!end).then_some(bp));
        }
        self.deliver(tid, sig, None)
    }

    /// Reports the first `n` pending chain blocks (the thread has entered
    /// them).
    fn flush(&mut self, tid: Pid, n: usize) {
        let th = self
            .threads
            .entry(tid)
            .or_insert_with(|| Thread::new(false));
        let Some((m, _)) = th.cur else { return };
        let done: Vec<usize> = th.pending.drain(..n.min(th.pending.len())).collect();
        for p in done {
            self.emit(tid, (m, p), Arrival::Flow);
        }
    }

    /// How many pending chain blocks a thread at runtime `rip` has entered:
    /// those before the one containing `rip`, and that one too when `rip`
    /// is past its first byte (none when `rip` is still in the first block).
    fn entered(&self, tid: Pid, rip: u64) -> usize {
        let Some(th) = self.threads.get(&tid) else {
            return 0;
        };
        let Some((m, _)) = th.cur else { return 0 };
        let (blocks, a) = (
            &self.modules[m].blocks,
            rip.wrapping_sub(self.modules[m].base),
        );
        th.pending
            .iter()
            .position(|&p| blocks[p].start <= a && a < blocks[p].end)
            .map_or(0, |i| i + usize::from(a > blocks[th.pending[i]].start))
    }

    /// Passes `sig` on. `at` is the entry trap the thread stands on (its
    /// instruction not executed yet), if any.
    fn deliver(&mut self, tid: Pid, sig: i32, at: Option<u64>) -> Result<()> {
        self.stats.signals += 1;
        let mut mid = None;
        if let Some((m, _)) = self.thread(tid).cur {
            // Chain blocks the thread has already entered (it is past their
            // first byte) happened before the signal.
            let rip = sys::get_regs(tid)?.rip;
            let n = self.entered(tid, rip);
            self.flush(tid, n);
            let module = &self.modules[m];
            let a = rip.wrapping_sub(module.base);
            mid = module
                .block_containing(a)
                .filter(|&c| module.blocks[c].start < a)
                .map(|_| rip);
        }
        let th = self.thread(tid);
        if let Some(pos) = th.cur.take() {
            let pending = std::mem::take(&mut th.pending);
            th.interrupted.push((pos, pending, at, mid));
        }
        self.event(tid, Event::Signal { sig });
        if sig == libc::SIGTRAP {
            // Stop again at the handler's first instruction (see `trap`).
            self.thread(tid).trap_delivered = true;
            return sys::step(tid, sig);
        }
        sys::cont(tid, sig)
    }
}
