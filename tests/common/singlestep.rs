//! The native instruction stream of a program, by single-stepping it with
//! ptrace (the kernel's trap flag): the oracle for static executables,
//! whose whole libc is traced. Valgrind cannot be that oracle there: it
//! hides CPU features (AVX-512 on this kind of host), so glibc's
//! `init_cpu_features` and its IFUNC resolvers take other paths, and it
//! gives the program another environment and auxiliary vector. Shares no
//! code with aetrace.
//!
//! [`run`] and [`run_streaming`] follow one thread (a new thread would
//! run unstepped); [`run_tree`] (and [`run_streaming`] with `tree`) also
//! steps the threads a program starts and the processes it forks, each as
//! a stream of its own, a child up to its `execve` (the part that runs
//! the program's image: `posix_spawn`, `system`), the first process
//! across its own; [`run_streaming`] hands each instruction to a sink
//! instead of keeping it.
//!
//! A step's trap is a forced SIGTRAP, which the kernel unblocks when the
//! task blocks it: the stepper blocks it again at every stop while the
//! program's own mask (its `rt_sigprocmask` calls) has it blocked, so
//! that a program reading its mask finds it as natively (glibc's
//! `posix_spawn` blocks every signal, and its child's `__spawni_child`
//! loops over the blocked ones). A
//! `rep`-prefixed string instruction traps once per iteration: the caller
//! folds consecutive repeats, as for lackey.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What the stepped run did and executed.
pub struct Stepped {
    /// Run-time addresses of the executed instructions, in order.
    pub rips: Vec<u64>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Exit status, or 128 + signal.
    pub status: i32,
}

/// Runs `exe args` (`argv[0]`: `argv0`, else `exe`) with exactly `env`,
/// in its order ([`Environ`]) (stdin /dev/null, stdout and stderr pipes, address space randomisation
/// off) and steps it from its first instruction to its exit.
pub fn run(exe: &Path, argv0: Option<&Path>, args: &[&str], env: &[(String, String)]) -> Stepped {
    step(exe, argv0, args, env, false, None).0
}

/// Receives each instruction of the first process (with
/// [`run_streaming`]'s `tree`, of every task) once the next stop shows it ran:
/// (the stopped task's id, its run-time address); returns false to end
/// that task (it is killed).
pub type Sink<'s> = &'s mut dyn FnMut(libc::pid_t, u64) -> bool;

/// [`run`] handing each instruction to `sink` and keeping none (`rips`
/// stays empty): the run's length costs no memory. `tree`: following
/// every task, as [`run_tree`] does.
pub fn run_streaming(
    exe: &Path,
    argv0: Option<&Path>,
    (args, env): (&[&str], &[(String, String)]),
    tree: bool,
    sink: Sink,
) -> Stepped {
    step(exe, argv0, args, env, tree, Some(sink)).0
}

/// [`run`], following the threads it starts and the processes it forks
/// (`clone`, `clone3`, `fork`, `vfork`): the first thread's run, then
/// each other task's instruction stream, in the order the tracer saw
/// them created (a fork or clone event of their creator's). Threads run at once, stepped in turns.
pub fn run_tree(
    exe: &Path,
    argv0: Option<&Path>,
    args: &[&str],
    env: &[(String, String)],
) -> (Stepped, Vec<Vec<u64>>) {
    step(exe, argv0, args, env, true, None)
}

/// Spawns `cmd`, retrying for up to a second while its executable is
/// "Text file busy": a just-built test program can still be open for
/// writing in a process that has not exited or exec'd yet (seen once in a
/// loaded CI run, `fnptr-O0-static-stripped`, 2026-11-30).
fn spawn_when_not_busy(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

fn step(
    exe: &Path,
    argv0: Option<&Path>,
    args: &[&str],
    env: &[(String, String)],
    follow: bool,
    mut sink: Option<Sink>,
) -> (Stepped, Vec<Vec<u64>>) {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(exe);
    if let Some(a) = argv0 {
        cmd.arg0(a);
    }
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let environ = Environ::new(env);
    // SAFETY: async-signal-safe calls only, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong) == -1
                || libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == -1
            {
                return Err(std::io::Error::last_os_error());
            }
            environ.install();
            Ok(())
        });
    }
    let mut child =
        spawn_when_not_busy(&mut cmd).unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
    let pid = child.id() as libc::pid_t;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                r.read_to_end(&mut v).unwrap();
            }
            v
        })
    };
    let out = drain(child.stdout.take().map(|s| Box::new(s) as _));
    let err = drain(child.stderr.take().map(|s| Box::new(s) as _));
    // Per process: its stream (index 0: the first process).
    let mut streams: Vec<Vec<u64>> = vec![Vec::new()];
    // Per process: whether its first instruction was seen.
    let mut begun: Vec<bool> = vec![false];
    // Per process: the instruction the last trap reported, kept until the
    // next stop says whether it ran.
    let mut held: Vec<Option<u64>> = vec![None];
    // Per process: whether the signal delivered at its last stop was not
    // raised by an instruction: if it kills, the held instruction never ran.
    let mut asynchronous: Vec<bool> = vec![false];
    // Per process: whether the program's own signal mask blocks SIGTRAP.
    let mut trap_blocked: Vec<bool> = vec![false];
    let mut index: std::collections::HashMap<libc::pid_t, usize> = [(pid, 0)].into();
    // The tracees not yet ended. Each is waited for by its id: a
    // `waitpid(-1)` would also reap the children other tests of this
    // process spawn.
    let mut alive: Vec<libc::pid_t> = vec![pid];
    let mut st = 0;
    let mut status = None;
    // The first stop is the exec's SIGTRAP, at the entry point; a forked
    // child's is a SIGSTOP before its first instruction.
    let mut started = false;
    while !alive.is_empty() {
        let t = loop {
            // SAFETY: waiting for our own tracees.
            if !follow {
                break unsafe { libc::waitpid(pid, &mut st, libc::__WALL) };
            }
            let ready = alive.iter().find_map(|&q| {
                let r = unsafe { libc::waitpid(q, &mut st, libc::__WALL | libc::WNOHANG) };
                (r != 0).then_some(r)
            });
            match ready {
                Some(r) => break r,
                None => std::thread::yield_now(),
            }
        };
        assert!(t > 0, "waitpid: {}", std::io::Error::last_os_error());
        if libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
            alive.retain(|&q| q != t);
            let ran = |k: usize| !(libc::WIFSIGNALED(st) && asynchronous[k]);
            let last = index.get(&t).filter(|&&k| ran(k));
            if let Some((k, ran)) = last.and_then(|&k| Some((k, held[k].take()?))) {
                match sink.as_mut() {
                    Some(f) => {
                        f(t, ran);
                    }
                    _ => streams[k].push(ran),
                }
            }
            if t == pid {
                status = Some(if libc::WIFEXITED(st) {
                    libc::WEXITSTATUS(st)
                } else {
                    128 + libc::WTERMSIG(st)
                });
            }
            continue;
        }
        assert!(libc::WIFSTOPPED(st));
        let stop = libc::WSTOPSIG(st);
        let event = st >> 16;
        let k = index[&t];
        let mut sig = 0;
        if follow && !started && t == pid {
            let opts = libc::PTRACE_O_TRACEFORK
                | libc::PTRACE_O_TRACEVFORK
                | libc::PTRACE_O_TRACECLONE
                | libc::PTRACE_O_TRACEEXEC;
            // SAFETY: our stopped tracee.
            let r = unsafe { libc::ptrace(libc::PTRACE_SETOPTIONS, t, 0, opts) };
            assert_eq!(r, 0, "PTRACE_SETOPTIONS");
        }
        // SAFETY: regs is written by the kernel for our stopped tracee.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::ptrace(libc::PTRACE_GETREGS, t, 0, &mut regs) };
        assert_eq!(r, 0, "PTRACE_GETREGS");
        if event == libc::PTRACE_EVENT_EXEC && t != pid {
            // A child's `execve` ran: its stream ends there (it goes on
            // natively, unstepped).
            if let Some(ran) = held[k].take() {
                match sink.as_mut() {
                    Some(f) => {
                        f(t, ran);
                    }
                    _ => streams[k].push(ran),
                }
            }
            alive.retain(|&q| q != t);
            // SAFETY: detaching our own stopped tracee.
            let r = unsafe { libc::ptrace(libc::PTRACE_DETACH, t, 0, 0) };
            assert_eq!(r, 0, "PTRACE_DETACH");
            continue;
        }
        if trap_blocked[k] {
            block_trap(t);
        }
        if event != 0 && event != libc::PTRACE_EVENT_EXEC {
            // A fork or clone event: the new task, stopped, is ours too.
            let mut new: libc::c_ulong = 0;
            // SAFETY: our stopped tracee, a word for the message.
            let r = unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, t, 0, &mut new) };
            assert_eq!(r, 0, "PTRACE_GETEVENTMSG");
            let new = new as libc::pid_t;
            if let std::collections::hash_map::Entry::Vacant(e) = index.entry(new) {
                e.insert(streams.len());
                streams.push(Vec::new());
                begun.push(false);
                held.push(None);
                asynchronous.push(false);
                trap_blocked.push(trap_blocked[k]);
                alive.push(new);
            }
        } else if stop == libc::SIGTRAP && event == 0 && int3_trap(t) {
            // An `int3`'s trap (SI_KERNEL, not a step's TRAP_TRACE) is the
            // program's own SIGTRAP, raised once the `int3` ran (no step
            // trap follows an `int`): delivered. The rip it reports runs
            // only if a handler returns there, and is reported then.
            sig = stop;
        } else if stop == libc::SIGTRAP || (!begun[k] && t != pid) {
            // A trap stop reports the next instruction (the first stop: the
            // first one); another signal's stop comes before the
            // instruction the last trap reported runs.
            begun[k] = true;
            asynchronous[k] = false;
            match (held[k].replace(regs.rip), sink.as_mut()) {
                (None, _) => {}
                (Some(ran), Some(f)) => {
                    if !f(t, ran) {
                        // SAFETY: killing our own tracee (reaped above); it
                        // takes no more ptrace requests.
                        unsafe { libc::kill(t, libc::SIGKILL) };
                        continue;
                    }
                }
                (Some(ran), _) => streams[k].push(ran),
            }
        } else {
            // Deliver it: the program must see the signals it would. One
            // no instruction raised (sent by `kill`, `raise`, a POSIX
            // timer; or by the kernel: SIGCHLD, an interval timer's
            // SIGALRM), caught, runs its handler before the instruction
            // the last trap reported, which the handler's return reports
            // again (before 2026-11-30 the stream listed it twice: first
            // for a `raise` in traced static glibc, then for the kernel's).
            sig = stop;
            asynchronous[k] = !raised_by_instruction(t, stop);
            if asynchronous[k] && caught(t, stop) {
                held[k] = None;
            }
        }
        if t == pid {
            started = true;
        }
        if let Some(blocked) = sigprocmask_blocks_trap(t, &regs) {
            trap_blocked[k] = blocked;
        }
        let r = unsafe { libc::ptrace(libc::PTRACE_SINGLESTEP, t, 0, sig) };
        assert_eq!(r, 0, "PTRACE_SINGLESTEP");
    }
    // Each trap reported the instruction about to run; the last one ran
    // (it exited), so nothing is missing and nothing extra. Reaped above.
    drop(child);
    let mut streams = streams.into_iter();
    let first = streams.next().unwrap_or_default();
    (
        Stepped {
            rips: first,
            stdout: out.join().unwrap(),
            stderr: err.join().unwrap(),
            status: status.expect("the first process ended"),
        },
        streams.collect(),
    )
}

/// An environment as the stepped program gets it: its `KEY=VALUE`
/// strings in the order given. std's `Command` sorts by name an
/// environment it is given (`env_clear` and `envs`), and the order is
/// the program's to see: `getenv` scans the array from its start, so a
/// variable's place decides how many entries it compares (sort's
/// `setlocale` finding `LANG` 10th in a shell's environment and 12th in
/// it sorted made `libc_so_traced_sort`, its test binary run from a
/// shell, differ in libc's `getenv`; cargo gives the tests a sorted
/// environment, where the two orders agree).
struct Environ {
    strings: Vec<std::ffi::CString>,
    /// The strings' addresses, then a null: `environ`'s array.
    array: Vec<usize>,
}

impl Environ {
    /// Built before the fork: the child allocates nothing.
    fn new(env: &[(String, String)]) -> Environ {
        let strings: Vec<std::ffi::CString> = (env.iter())
            .map(|(k, v)| std::ffi::CString::new(format!("{k}={v}")).expect("a NUL in env"))
            .collect();
        let array = (strings.iter().map(|s| s.as_ptr() as usize))
            .chain([0])
            .collect();
        Environ { strings, array }
    }

    /// Makes it the process's environment, which the `execvp` of an
    /// unchanged `Command` passes on (between fork and exec: a pointer
    /// written, nothing allocated).
    fn install(&self) {
        debug_assert_eq!(self.array.len(), self.strings.len() + 1);
        // SAFETY: the array is null-terminated and it and the strings
        // live in the closure that holds `self` until the exec.
        unsafe { libc::environ = self.array.as_ptr() as *mut *mut libc::c_char };
    }
}

/// Bit of SIGTRAP in a kernel signal mask.
const TRAP_BIT: u64 = 1 << (libc::SIGTRAP - 1);

/// The signal mask of stopped tracee `t`.
fn sigmask(t: libc::pid_t) -> u64 {
    let mut mask = 0u64;
    // SAFETY: our stopped tracee; the kernel writes 8 bytes.
    let r = unsafe { libc::ptrace(libc::PTRACE_GETSIGMASK, t, 8, &mut mask) };
    assert_eq!(r, 0, "PTRACE_GETSIGMASK");
    mask
}

/// Blocks SIGTRAP again in stopped tracee `t` (its last step's trap
/// unblocked it).
fn block_trap(t: libc::pid_t) {
    let mask = sigmask(t) | TRAP_BIT;
    // SAFETY: our stopped tracee; the kernel reads 8 bytes.
    let r = unsafe { libc::ptrace(libc::PTRACE_SETSIGMASK, t, 8, &mask) };
    assert_eq!(r, 0, "PTRACE_SETSIGMASK");
}

/// When stopped tracee `t` is about to run `rt_sigprocmask` (a `syscall`
/// at its rip with rax 14): whether the mask it sets blocks SIGTRAP.
fn sigprocmask_blocks_trap(t: libc::pid_t, regs: &libc::user_regs_struct) -> Option<bool> {
    const SYS_RT_SIGPROCMASK: u64 = 14;
    if regs.rax != SYS_RT_SIGPROCMASK {
        return None;
    }
    // SAFETY: reading our stopped tracee's memory (errno tells a failure).
    let word = unsafe { libc::ptrace(libc::PTRACE_PEEKTEXT, t, regs.rip, 0) };
    if word as u64 & 0xffff != 0x050f {
        return None;
    }
    let old = sigmask(t) & TRAP_BIT != 0;
    if regs.rsi == 0 {
        return Some(old);
    }
    // SAFETY: as above; a bad pointer makes the call fail, mask unchanged.
    let set = unsafe { libc::ptrace(libc::PTRACE_PEEKDATA, t, regs.rsi, 0) } as u64 & TRAP_BIT;
    Some(match regs.rdi as i32 {
        libc::SIG_BLOCK => old || set != 0,
        libc::SIG_UNBLOCK => old && set == 0,
        libc::SIG_SETMASK => set != 0,
        _ => old,
    })
}

/// The `si_code` of the signal stopped tracee `t` reports.
fn si_code(t: libc::pid_t) -> Option<i32> {
    // SAFETY: the kernel fills the siginfo of our stopped tracee.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::ptrace(libc::PTRACE_GETSIGINFO, t, 0, &mut info) };
    (r == 0).then_some(info.si_code)
}

/// Whether stopped tracee `t`'s SIGTRAP came from an `int3` (`si_code`
/// SI_KERNEL) rather than a single step or an exec.
fn int3_trap(t: libc::pid_t) -> bool {
    si_code(t) == Some(0x80)
}

/// Whether the signal `sig` stopped tracee `t` reports is a fault of the
/// instruction it stopped before (`si_code` > 0; SI_KERNEL for a
/// general-protection SIGSEGV), not one sent by a process, a timer or the
/// kernel (SIGCHLD's CLD_EXITED is > 0 too, hence the signal numbers).
fn raised_by_instruction(t: libc::pid_t, sig: i32) -> bool {
    matches!(
        sig,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL
    ) && si_code(t).is_some_and(|c| c > 0)
}

/// Whether thread `t` has a handler for signal `sig` (`SigCgt` in its
/// `/proc` status).
fn caught(t: libc::pid_t, sig: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{t}/status")).unwrap_or_default();
    let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:"));
    let mask = mask.and_then(|m| u64::from_str_radix(m.trim(), 16).ok());
    mask.is_some_and(|m| m >> (sig - 1) & 1 == 1)
}

/// The rewritten copy of `exe` in the aetrace cache directory `cache`
/// (not its `.skeleton` or `.meta` beside it).
pub fn cached_rewrite(cache: &Path, exe: &Path) -> PathBuf {
    let name = exe.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(&format!("{name}-")) && !n.ends_with(".skeleton") && !n.ends_with(".meta")
        })
        .unwrap_or_else(|| panic!("aetrace caches no rewritten {name} in {}", cache.display()))
}

/// A symlink to a stand-in for a program (the restored rewritten copy),
/// named by an absolute path as long as the program's own and ending in
/// its base name: stepped by that name, the stand-in runs with the stack
/// of the program exec'd by its own path. The kernel copies the path
/// given to `execve` (`AT_EXECFN`) to the top of the new stack, so its
/// length moves every stack address, and with them the alignment that
/// the string functions branch on; the base name is the process's `comm`.
/// (aetrace execs its copy by a name of the native length too; this is
/// the oracle's own way, which keeps the working directory.) The link
/// and its directory go when the value is dropped.
pub struct NativeName {
    dir: PathBuf,
    /// The name to step: the directory, slashes, the base name.
    pub path: PathBuf,
}

impl NativeName {
    /// A name for stepping `stand_in` as `native`; panics when the
    /// temporary directory's path leaves no room for one.
    pub fn new(stand_in: &Path, native: &Path) -> NativeName {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        let base = native.file_name().unwrap();
        let dir = short_dir();
        let pad = (native.as_os_str().len()).checked_sub(dir.as_os_str().len() + base.len());
        let Some(pad) = pad.filter(|&p| p > 0) else {
            let _ = std::fs::remove_dir(&dir);
            panic!(
                "no path as short as {} in {}",
                native.display(),
                dir.display()
            );
        };
        let target = std::fs::canonicalize(stand_in).unwrap();
        std::os::unix::fs::symlink(target, dir.join(base)).unwrap();
        let mut path = dir.clone().into_os_string().into_vec();
        path.extend(std::iter::repeat(b'/').take(pad));
        path.extend_from_slice(base.as_bytes());
        let path = PathBuf::from(std::ffi::OsString::from_vec(path));
        NativeName { dir, path }
    }
}

impl Drop for NativeName {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A new directory with a short name in the temporary directory (short,
/// so that it fits in short program paths as `/usr/sbin/ldconfig`).
fn short_dir() -> PathBuf {
    let tmp = std::env::temp_dir();
    (0u32..)
        .map(|n| tmp.join(format!(".s{n:x}")))
        .find(|d| match std::fs::create_dir(d) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) => panic!("{}: {e}", d.display()),
        })
        .unwrap()
}

/// Puts the original program's file bytes and entry point back into the
/// rewritten executable at `instrumented`: its added segments stay, never
/// run.
pub fn restore_original_code(original: &Path, instrumented: &Path) {
    let o = std::fs::read(original).unwrap();
    let mut n = std::fs::read(instrumented).unwrap();
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as usize;
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (
        u64_at(&o, 0x20) as usize,
        u16_at(&o, 0x36),
        u16_at(&o, 0x38),
    );
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        if u32::from_le_bytes(o[ph..ph + 4].try_into().unwrap()) != 1 {
            continue;
        }
        // The ELF header stays the rewritten one (its program headers).
        let off = (u64_at(&o, ph + 8) as usize).max(64);
        let end = u64_at(&o, ph + 8) as usize + u64_at(&o, ph + 32) as usize;
        if off < end {
            n[off..end].copy_from_slice(&o[off..end]);
        }
    }
    n[0x18..0x20].copy_from_slice(&o[0x18..0x20]);
    // A new file at the same path (the old one may still be mapped).
    let tmp = instrumented.with_extension("restored");
    std::fs::write(&tmp, &n).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&tmp, instrumented).unwrap();
}
