//! The native instruction stream of a program, by single-stepping it with
//! ptrace (the kernel's trap flag): the oracle for static executables,
//! whose whole libc is traced. Valgrind cannot be that oracle there: it
//! hides CPU features (AVX-512 on this kind of host), so glibc's
//! `init_cpu_features` and its IFUNC resolvers take other paths, and it
//! gives the program another environment and auxiliary vector. Shares no
//! code with aetrace.
//!
//! Single-threaded programs only (a new thread would run unstepped). A
//! `rep`-prefixed string instruction traps once per iteration: the caller
//! folds consecutive repeats, as for lackey.

use std::io::Read;
use std::path::Path;
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

/// Runs `exe args` (`argv[0]`: `argv0`, else `exe`) with exactly `env`
/// (stdin /dev/null, stdout and stderr pipes, address space randomisation
/// off) and steps it from its first instruction to its exit.
pub fn run(exe: &Path, argv0: Option<&Path>, args: &[&str], env: &[(String, String)]) -> Stepped {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(exe);
    if let Some(a) = argv0 {
        cmd.arg0(a);
    }
    cmd.args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: async-signal-safe calls only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong) == -1
                || libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == -1
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
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
    let mut rips = Vec::new();
    let mut st = 0;
    // The first stop is the exec's SIGTRAP, at the entry point.
    let mut sig = 0;
    let status = loop {
        // SAFETY: waiting for our own traced child.
        let r = unsafe { libc::waitpid(pid, &mut st, libc::__WALL) };
        assert_eq!(r, pid, "waitpid: {}", std::io::Error::last_os_error());
        if libc::WIFEXITED(st) {
            break libc::WEXITSTATUS(st);
        }
        if libc::WIFSIGNALED(st) {
            break 128 + libc::WTERMSIG(st);
        }
        assert!(libc::WIFSTOPPED(st));
        let stop = libc::WSTOPSIG(st);
        if stop != libc::SIGTRAP {
            // Deliver it: the program must see the signals it would.
            sig = stop;
        }
        // SAFETY: regs is written by the kernel for our stopped tracee.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::ptrace(libc::PTRACE_GETREGS, pid, 0, &mut regs) };
        assert_eq!(r, 0, "PTRACE_GETREGS");
        // A trap stop reports the next instruction; another signal's stop
        // comes before the instruction the last trap reported runs.
        if stop == libc::SIGTRAP {
            rips.push(regs.rip);
        }
        let r = unsafe { libc::ptrace(libc::PTRACE_SINGLESTEP, pid, 0, std::mem::take(&mut sig)) };
        assert_eq!(r, 0, "PTRACE_SINGLESTEP");
    };
    // Each trap reported the instruction about to run; the last one ran
    // (it exited), so nothing is missing and nothing extra. Reaped above.
    drop(child);
    Stepped {
        rips,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        status,
    }
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
