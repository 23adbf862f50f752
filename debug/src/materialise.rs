//! `monitor materialise`: the program run again, natively, to the current
//! instruction, with real registers and memory, handed over to gdb
//! (issue 22 point 4; `docs/debug.md`, "Materialising").
//!
//! The executable is rewritten as `aetrace count --stop-at N` rewrites it
//! (N = the position + 1: `--stop-at` numbers from 1) and run under ptrace
//! with the argv, environment, working directory and stdin of the trace's
//! COMMAND section (stdout goes to `/dev/null`, address randomisation is
//! off as under gdb). The stop is the counted run's single-step trap at the
//! original address of instruction N. There, with the process still ours:
//! its pc is checked against the trace's (module-relative: the load base
//! differs), the trap flag is cleared, the executable's original code
//! (springboards included) is written back over the rewritten bytes, so
//! `x/i $pc` and a `continue` read and run the original program; then the
//! process is detached stopped (SIGSTOP) for gdb to `attach`.
//!
//! Callers' return addresses still point into the copies: the reply lists,
//! per caller frame of the trace's procedure stack, the copy's return
//! address and the original's, and aetrace's gdb command rewrites each slot
//! gdb's unwinder (the copies' own CFI) finds, so `bt`, `up` and `info
//! locals` read as on the original program, and checks the frames.
//!
//! The rewritten programs are written to [`scratch_dir`], one directory
//! per stub process: gdb reads their symbols and the copies' unwind
//! tables while it debugs the re-runs, so they live as long as the stub
//! (the binary calls [`remove_scratch`] however the stub ends); a re-run
//! that is not handed over removes its program at once.
//!
//! Invariants: a process whose pc differs from the trace's is killed, never
//! handed over; every `unsafe` block of the crate is in this module.

use aetrace_format::progdb::{ProgramDb, SigPoint};
use aetrace_format::{module_flags, Command, StartReason, Stdin, Trace};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// Why materialising failed or was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not something `count --stop-at` can stop at.
    #[error("cannot materialise here: {0}")]
    Refused(String),
    /// Rewriting the program failed.
    #[error("cannot rewrite the program: {0}")]
    Rewrite(#[from] aetrace_record::Error),
    /// A file or system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The re-run did not reach the trace's instruction N, or reached
    /// another address.
    #[error(
        "the re-run diverged from the trace: {0} (a re-run must see the same argv, \
         environment, working directory, stdin and files as the recorded run; programs that \
         read /proc/self/maps, the time or their pid, or write to a terminal, diverge)"
    )]
    Diverged(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

fn last_os(what: &str) -> Error {
    io(what)(std::io::Error::last_os_error())
}

/// What the trace says about re-running the thread a stub serves: the
/// command, the executable and its recorded load base, or why a re-run
/// cannot stop in that thread.
pub type Plan = Result<Recorded, String>;

/// The recorded run's command and executable.
#[derive(Clone, Debug)]
pub struct Recorded {
    command: Command,
    exe: PathBuf,
    load_base: u64,
}

/// The plan for thread `thread` of `trace`.
pub fn plan<B: AsRef<[u8]>>(trace: &Trace<B>, thread: u32) -> Plan {
    let first = trace.threads().next().map(|t| t.start);
    let Some(first) = first.filter(|s| s.thread.0 == thread && s.reason == StartReason::Main)
    else {
        return Err(
            "only the first thread of the traced program can be re-run to an \
             instruction (count --stop-at counts one thread of one process)"
                .into(),
        );
    };
    let command = trace.command().cloned().ok_or(
        "the trace does not say how the program was run (no COMMAND section: recorded \
         before format 1.1)",
    )?;
    let modules: Vec<_> = trace
        .modules()
        .iter()
        // The first image's: a module an IMAGE ties to a later stream
        // is an image the process exec'd.
        .filter(|m| m.pid == first.pid && trace.image_thread(m.id).is_none())
        .collect();
    if modules.len() > 1 {
        return Err(
            "the trace has traced libraries (--libs): count --stop-at counts the \
             executable's instructions only"
                .into(),
        );
    }
    let main = modules
        .iter()
        .find(|m| m.flags & module_flags::MAIN != 0)
        .ok_or("the trace names no executable")?;
    Ok(Recorded {
        command,
        exe: PathBuf::from(OsStr::from_bytes(&main.path)),
        load_base: main.load_base,
    })
}

/// Where to stop and what to check: the instruction's number from 1, its
/// address and the callers' return addresses (innermost first), as the
/// trace has them (absolute, at the recorded load base).
pub struct Target {
    /// `--stop-at`'s N.
    pub n: u64,
    /// The instruction's address.
    pub pc: u64,
    /// The return addresses of the procedure stack.
    pub returns: Vec<u64>,
}

/// The process gdb can attach to.
#[derive(Debug)]
pub struct Materialised {
    /// Its pid (stopped by SIGSTOP, not traced).
    pub pid: i32,
    /// The program it runs (the rewritten executable).
    pub file: PathBuf,
    /// The executable's load base in it.
    pub base: u64,
    /// Its pc (the trace's, relocated).
    pub pc: u64,
    /// Where it spins until gdb has attached (its pc now) and the two
    /// bytes of code there.
    pub park: (u64, [u8; 2]),
    /// The copies' address range in it (start, end).
    pub copies: (u64, u64),
    /// Per caller frame of the trace, innermost first: the copy's return
    /// address and the original's, in the process.
    pub frames: Vec<(u64, u64)>,
}

impl Materialised {
    /// The reply to `monitor materialise` aetrace's gdb command reads.
    pub fn reply(&self, n: u64) -> String {
        let mut s = format!(
            "materialise pid {} base {:#x} pc {:#x} park {:#x} {:#x} copies {:#x} {:#x} insn {n} file {}",
            self.pid,
            self.base,
            self.pc,
            self.park.0,
            u16::from_le_bytes(self.park.1),
            self.copies.0,
            self.copies.1,
            self.file.display()
        );
        for (copy, orig) in &self.frames {
            s.push_str(&format!("\nframe {copy:#x} {orig:#x}"));
        }
        s
    }
}

/// The directory this process writes its rewritten programs in.
pub fn scratch_dir() -> PathBuf {
    std::env::temp_dir().join(format!("aetrace-materialise-{}", std::process::id()))
}

/// Removes [`scratch_dir`] with what it holds, if it exists. A process
/// gdb debugs runs on unharmed: its program stays mapped.
pub fn remove_scratch() -> std::io::Result<()> {
    match std::fs::remove_dir_all(scratch_dir()) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Re-runs the recorded program to `t` and detaches it stopped there.
pub fn materialise(r: &Recorded, t: &Target) -> Result<Materialised, Error> {
    let ins = aetrace_record::counted::stop_program(&r.exe, t.n)?;
    let dir = scratch_dir();
    std::fs::create_dir_all(&dir).map_err(io(format!("cannot create {}", dir.display())))?;
    let file = dir.join(format!(
        "{}.{}",
        r.exe
            .file_name()
            .map_or("program".into(), |f| f.to_string_lossy()),
        t.n
    ));
    aetrace_format::atomic::write_atomic(&file, &ins.elf, aetrace_format::atomic::EXECUTABLE)
        .map_err(|e| io("cannot write the rewritten program")(e.source))?;
    // Nobody will debug the program if the re-run is not handed over.
    let written = Written {
        path: file,
        kept: false,
    };
    let returns = copy_returns(&ins.db);
    let mut frames = Vec::new();
    for &ret in &t.returns {
        let orig = ret.wrapping_sub(r.load_base);
        let copy = returns.get(&orig).ok_or_else(|| {
            Error::Refused(format!(
                "no copy of the call returning to {ret:#x} in the rewritten program"
            ))
        })?;
        frames.push((*copy, orig));
    }
    let entry = goblin::elf::Elf::parse(&ins.elf).map_or(0, |e| e.header.e_entry);
    let pid = spawn(&written.path, &r.command)?;
    let stopped = Stopped(pid);
    stopped.run_to_trap(t.n)?;
    let base = stopped.entry()?.wrapping_sub(entry);
    let want = t.pc.wrapping_sub(r.load_base);
    let mut regs = stopped.regs()?;
    if regs.rip.wrapping_sub(base) != want {
        return Err(Error::Diverged(format!(
            "instruction {} is at {:#x} in the trace but the re-run stopped at {:#x} \
             (offsets in the executable)",
            t.n - 1,
            want,
            regs.rip.wrapping_sub(base)
        )));
    }
    let pc = regs.rip;
    regs.eflags &= !0x100;
    let code = stopped.write_original_code(&r.exe, base)?;
    // Parked at the executable's entry point (`_start`, never run again)
    // on a `jmp .` until gdb attaches and puts pc and the bytes back: a
    // process left in a job-control stop would stop gdb's every `continue`
    // with SIGSTOP.
    regs.rip = code.entry;
    stopped.write(code.entry, &[0xeb, 0xfe])?;
    stopped.set_regs(&regs)?;
    let pid = stopped.detach()?;
    let file = written.keep();
    let rel = |(c, o): (u64, u64)| (c.wrapping_add(base), o.wrapping_add(base));
    Ok(Materialised {
        pid,
        file,
        base,
        pc,
        park: (code.entry, code.entry_bytes),
        copies: (base + ins.size, base + elf_end(&ins.elf)),
        frames: frames.into_iter().map(rel).collect(),
    })
}

/// Where each call of a copy returns to, original return address (link
/// time) -> the copy's: a range of the copy that ends with a call block's
/// last instruction ends where the call returns to.
fn copy_returns(db: &ProgramDb) -> HashMap<u64, u64> {
    let mut map = HashMap::new();
    for p in &db.procs {
        let Some(sig) = &p.sigmap else { continue };
        for (i, range) in sig.ranges.iter().enumerate() {
            let SigPoint::Insn {
                block, insn, count, ..
            } = range.point
            else {
                continue;
            };
            let Some(b) = p.blocks.get(block as usize) else {
                continue;
            };
            let ends_call = b.call.as_ref().is_some_and(|c| !c.tail);
            if !ends_call || (insn + count) as usize != b.insn_lens.len() || count == 0 {
                continue;
            }
            let end = sig.ranges.get(i + 1).map_or(sig.len, |r| r.offset);
            let orig = b.start + b.insn_lens.iter().map(|&l| u64::from(l)).sum::<u64>();
            map.insert(orig, sig.start + end);
        }
    }
    map
}

/// A rewritten program, removed on drop unless kept.
struct Written {
    path: PathBuf,
    kept: bool,
}

impl Written {
    fn keep(mut self) -> PathBuf {
        self.kept = true;
        self.path.clone()
    }
}

impl Drop for Written {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The end of the highest load segment of an ELF file (0 if unreadable).
fn elf_end(elf: &[u8]) -> u64 {
    goblin::elf::Elf::parse(elf).map_or(0, |e| {
        e.program_headers
            .iter()
            .filter(|p| p.p_type == goblin::elf::program_header::PT_LOAD)
            .map(|p| p.p_vaddr + p.p_memsz)
            .max()
            .unwrap_or(0)
    })
}

/// Starts `file` as the recorded command ran, traced (it stops with
/// SIGTRAP at its exec) and with address randomisation off.
fn spawn(file: &Path, c: &Command) -> Result<i32, Error> {
    let os = |b: &Vec<u8>| OsStr::from_bytes(b).to_owned();
    let mut cmd = std::process::Command::new(file);
    if let Some(a0) = c.argv.first() {
        cmd.arg0(os(a0));
    }
    cmd.args(c.argv.iter().skip(1).map(os));
    cmd.env_clear();
    for kv in &c.env {
        if let Some(i) = kv.iter().position(|&b| b == b'=') {
            cmd.env(OsStr::from_bytes(&kv[..i]), OsStr::from_bytes(&kv[i + 1..]));
        }
    }
    cmd.current_dir(os(&c.cwd));
    cmd.stdin(stdin(&c.stdin)?);
    cmd.stdout(std::process::Stdio::null());
    // SAFETY: between fork and exec the child only makes two system calls.
    unsafe {
        cmd.pre_exec(|| {
            libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(io(format!("cannot run {}", file.display())))?;
    Ok(child.id() as i32)
}

/// The recorded stdin, if it can be given again.
fn stdin(s: &Stdin) -> Result<std::process::Stdio, Error> {
    match s {
        Stdin::Null => Ok(std::process::Stdio::null()),
        Stdin::File { path, size } => {
            let p = Path::new(OsStr::from_bytes(path));
            let f =
                std::fs::File::open(p).map_err(io(format!("cannot open stdin {}", p.display())))?;
            let now = f.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
            if now != *size {
                return Err(Error::Refused(format!(
                    "the recorded run read stdin from {} ({size} bytes), which is now {now} bytes",
                    p.display()
                )));
            }
            Ok(f.into())
        }
        Stdin::Other => Err(Error::Refused(
            "the recorded run's stdin was a terminal or a pipe, which cannot be given again \
             (record with stdin from a file or /dev/null)"
                .into(),
        )),
    }
}

/// The executable's entry point in the process and its first two bytes.
struct Code {
    entry: u64,
    entry_bytes: [u8; 2],
}

/// A traced child; killed on drop unless detached.
struct Stopped(i32);

impl Stopped {
    /// Runs until the counted run's trap (a single-step SIGTRAP), passing
    /// every other signal on.
    fn run_to_trap(&self, n: u64) -> Result<(), Error> {
        const TRAP_TRACE: i32 = 2;
        let mut exec_stop = true;
        loop {
            let mut status = 0;
            // SAFETY: plain system calls on our child.
            unsafe {
                if libc::waitpid(self.0, &mut status, 0) == -1 {
                    return Err(last_os("waitpid"));
                }
                if libc::WIFEXITED(status) {
                    return Err(ended(libc::WEXITSTATUS(status), n));
                }
                if libc::WIFSIGNALED(status) {
                    return Err(Error::Diverged(format!(
                        "the re-run was killed by signal {} before instruction {}",
                        libc::WTERMSIG(status),
                        n - 1
                    )));
                }
                let mut sig = libc::WSTOPSIG(status);
                if sig == libc::SIGTRAP && exec_stop {
                    exec_stop = false;
                    libc::ptrace(libc::PTRACE_SETOPTIONS, self.0, 0, libc::PTRACE_O_EXITKILL);
                    sig = 0;
                } else if sig == libc::SIGTRAP {
                    let mut si: libc::siginfo_t = std::mem::zeroed();
                    libc::ptrace(libc::PTRACE_GETSIGINFO, self.0, 0, &mut si);
                    if si.si_code == TRAP_TRACE {
                        return Ok(());
                    }
                }
                if libc::ptrace(libc::PTRACE_CONT, self.0, 0, sig as libc::c_long) == -1 {
                    return Err(last_os("ptrace(PTRACE_CONT)"));
                }
            }
        }
    }

    fn regs(&self) -> Result<libc::user_regs_struct, Error> {
        // SAFETY: the kernel fills the struct of a stopped tracee.
        unsafe {
            let mut r: libc::user_regs_struct = std::mem::zeroed();
            if libc::ptrace(libc::PTRACE_GETREGS, self.0, 0, &mut r) == -1 {
                return Err(last_os("ptrace(PTRACE_GETREGS)"));
            }
            Ok(r)
        }
    }

    fn set_regs(&self, r: &libc::user_regs_struct) -> Result<(), Error> {
        // SAFETY: the kernel reads the struct.
        if unsafe { libc::ptrace(libc::PTRACE_SETREGS, self.0, 0, r) } == -1 {
            return Err(last_os("ptrace(PTRACE_SETREGS)"));
        }
        Ok(())
    }

    /// The process's entry point (`AT_ENTRY`).
    fn entry(&self) -> Result<u64, Error> {
        let path = format!("/proc/{}/auxv", self.0);
        let auxv = std::fs::read(&path).map_err(io(format!("cannot read {path}")))?;
        let words: Vec<u64> = auxv
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
            .collect();
        const AT_ENTRY: u64 = 9;
        Ok(words
            .chunks_exact(2)
            .find(|kv| kv[0] == AT_ENTRY)
            .map_or(0, |kv| kv[1]))
    }

    /// Writes the executable's original code (its executable load
    /// segments, from `exe`) over the process's, at load base `base`.
    fn write_original_code(&self, exe: &Path, base: u64) -> Result<Code, Error> {
        use goblin::elf::program_header::{PF_X, PT_LOAD};
        let bytes = std::fs::read(exe).map_err(io(format!("cannot read {}", exe.display())))?;
        let elf = goblin::elf::Elf::parse(&bytes)
            .map_err(|e| Error::Refused(format!("{}: {e}", exe.display())))?;
        let mut entry_bytes = None;
        for ph in elf.program_headers.iter() {
            if ph.p_type == PT_LOAD && ph.p_flags & PF_X != 0 {
                let code = bytes.get(ph.file_range()).unwrap_or_default();
                self.write(base + ph.p_vaddr, code)?;
                let at = elf.header.e_entry.wrapping_sub(ph.p_vaddr) as usize;
                if let Some(b) = code.get(at..at + 2) {
                    entry_bytes = Some([b[0], b[1]]);
                }
            }
        }
        let entry_bytes = entry_bytes.ok_or_else(|| {
            Error::Refused(format!("{}: no code at the entry point", exe.display()))
        })?;
        Ok(Code {
            entry: base + elf.header.e_entry,
            entry_bytes,
        })
    }

    /// Writes `bytes` at `addr` of the process (code pages too: the
    /// kernel lets its tracer).
    fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), Error> {
        let path = format!("/proc/{}/mem", self.0);
        let mem = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io(format!("cannot open {path}")))?;
        mem.write_all_at(bytes, addr)
            .map_err(io(format!("cannot write {path}")))
    }

    /// Detaches, letting the process run (parked): its pid.
    fn detach(self) -> Result<i32, Error> {
        let pid = self.0;
        // SAFETY: plain system call on our stopped tracee.
        if unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0) } == -1 {
            return Err(last_os("ptrace(PTRACE_DETACH)"));
        }
        std::mem::forget(self);
        Ok(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: killing and reaping our own child.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

/// The re-run ended (status `code`) before instruction `n`.
fn ended(code: i32, n: u64) -> Error {
    match code {
        125 => Error::Refused(
            "the re-run ended with status 125: a second thread or a signal handler ran counted \
             code (count --stop-at cannot stop there exactly)"
                .into(),
        ),
        _ => Error::Diverged(format!(
            "the re-run ended (status {code}) before instruction {}",
            n - 1
        )),
    }
}
