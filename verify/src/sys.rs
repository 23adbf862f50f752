//! Thin wrappers over the Linux calls the tracer is made of: fork + execv
//! under `PTRACE_TRACEME`, `waitpid(__WALL)`, `PTRACE_CONT`/`SINGLESTEP`,
//! register access, and memory access through `/proc/PID/mem` (one `pread`
//! or `pwrite` per access instead of one `PEEKDATA` per word; writes work on
//! read-only text pages because the kernel forces them for a tracer), and
//! the CPU pinning of the follower and its program.
//!
//! Invariant: every `unsafe` block of the crate is in this module; each call
//! checks its return value and turns failures into [`Error::Sys`].

use std::ffi::CString;
use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::Error;

/// A Linux process or thread id.
pub type Pid = libc::pid_t;
pub type Regs = libc::user_regs_struct;

fn sys(what: &'static str, tid: Pid) -> Error {
    Error::Sys {
        what,
        tid,
        source: std::io::Error::last_os_error(),
    }
}

/// Forks; the child changes to `cwd` when given, asks to be traced and
/// `execve`s `path` with `argv` and `envp`, with `stdin`/`stdout` (already open) as its fd 0/1 when given and
/// its other streams untouched. Returns the child's pid; the child stops with
/// `SIGTRAP` right after the exec.
pub fn spawn(
    path: &CString,
    argv: &[CString],
    envp: &[CString],
    cwd: Option<&CString>,
    stdin: Option<&std::fs::File>,
    stdout: Option<&std::fs::File>,
    unpinned: Option<&CpuMask>,
) -> Result<Pid, Error> {
    use std::os::fd::AsRawFd;
    let unpinned = unpinned.map(mask_set);
    let filter = affinity_filter();
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    let stdin = stdin.map(|f| f.as_raw_fd());
    let stdout = stdout.map(|f| f.as_raw_fd());
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let mut envs: Vec<*const libc::c_char> = envp.iter().map(|a| a.as_ptr()).collect();
    envs.push(std::ptr::null());
    // SAFETY: between fork and execv the child only makes async-signal-safe
    // calls on memory prepared before the fork.
    unsafe {
        match libc::fork() {
            -1 => Err(sys("fork", 0)),
            0 => {
                // Give the program the environment a shell would: Rust
                // ignores SIGPIPE in its own process, and the ignored
                // disposition and the mask would be inherited otherwise
                // (gzip tests whether SIGPIPE is ignored: a different path).
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                if let Some(d) = cwd {
                    if libc::chdir(d.as_ptr()) != 0 {
                        libc::_exit(127);
                    }
                }
                if let Some(fd) = stdin {
                    libc::dup2(fd, 0);
                }
                if let Some(fd) = stdout {
                    libc::dup2(fd, 1);
                }
                libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0);
                if let Some(mask) = &unpinned {
                    // Pinned: the tracer answers `sched_getaffinity` with
                    // the mask the program would have had. Without the
                    // filter (refused), run unpinned instead.
                    let install = || {
                        libc::prctl(
                            libc::PR_SET_SECCOMP,
                            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
                            &prog as *const libc::sock_fprog as libc::c_ulong,
                            0,
                            0,
                        ) == 0
                    };
                    // Without CAP_SYS_ADMIN a filter needs no_new_privs,
                    // which a traced exec has in effect already.
                    if !install()
                        && (libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || !install())
                    {
                        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), mask);
                    }
                }
                libc::execve(path.as_ptr(), ptrs.as_ptr(), envs.as_ptr());
                libc::_exit(127)
            }
            pid => Ok(pid),
        }
    }
}

/// The seccomp filter of a pinned program: `sched_getaffinity` (x86-64)
/// stops for the tracer (`PTRACE_EVENT_SECCOMP`), everything else runs.
fn affinity_filter() -> [libc::sock_filter; 6] {
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    // AUDIT_ARCH_X86_64: EM_X86_64 | 64-bit | little-endian.
    const ARCH: u32 = 0xc000_003e;
    [
        op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 4),
        op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 2, ARCH),
        op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
        op(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            1,
            0,
            libc::SYS_sched_getaffinity as u32,
        ),
        op(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        op(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_TRACE),
    ]
}

/// An affinity mask as the system calls lay it out: a `cpu_set_t`'s bytes.
pub type CpuMask = [u8; std::mem::size_of::<libc::cpu_set_t>()];

fn mask_bytes(set: &libc::cpu_set_t) -> CpuMask {
    // SAFETY: cpu_set_t is plain old data of exactly this size.
    unsafe { std::mem::transmute_copy(set) }
}

fn mask_set(mask: &CpuMask) -> libc::cpu_set_t {
    // SAFETY: as in `mask_bytes`.
    unsafe { std::mem::transmute_copy(mask) }
}

/// `sched_getaffinity(pid, len)` as the system call answers it: the bytes
/// copied (at most `len`, at most a `cpu_set_t`) or `-errno`, and the mask.
pub fn affinity_of(pid: Pid, len: usize) -> (i64, CpuMask) {
    // SAFETY: the kernel writes at most `len` bytes, capped to the size of
    // the plain-old-data set it gets.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let len = len.min(std::mem::size_of::<libc::cpu_set_t>());
        let r = libc::syscall(libc::SYS_sched_getaffinity, pid, len, &mut set);
        let r = if r < 0 {
            -i64::from(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EINVAL),
            )
        } else {
            r
        };
        (r, mask_bytes(&set))
    }
}

/// Gives thread `tid` the affinity `mask` (a process we stop following).
pub fn set_affinity(tid: Pid, mask: &CpuMask) {
    let set = mask_set(mask);
    // SAFETY: a valid pointer to a set of the size given.
    unsafe {
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// `waitpid(-1, __WALL)`: any traced thread or child.
pub fn wait_any() -> Result<(Pid, i32), Error> {
    let mut status = 0;
    loop {
        // SAFETY: plain syscall with a valid out-pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL | libc::__WNOTHREAD) };
        if pid >= 0 {
            return Ok((pid, status));
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Err(sys("waitpid", -1));
        }
    }
}

fn ptrace(
    req: libc::c_uint,
    what: &'static str,
    tid: Pid,
    addr: usize,
    data: usize,
) -> Result<libc::c_long, Error> {
    // SAFETY: the requests used here take integers or pointers to owned,
    // properly sized buffers.
    let r = unsafe { libc::ptrace(req, tid, addr, data) };
    if r == -1 {
        Err(sys(what, tid))
    } else {
        Ok(r)
    }
}

pub fn set_options(tid: Pid, options: i32) -> Result<(), Error> {
    ptrace(
        libc::PTRACE_SETOPTIONS,
        "PTRACE_SETOPTIONS",
        tid,
        0,
        options as usize,
    )
    .map(drop)
}

pub fn cont(tid: Pid, sig: i32) -> Result<(), Error> {
    ptrace(libc::PTRACE_CONT, "PTRACE_CONT", tid, 0, sig as usize).map(drop)
}

pub fn step(tid: Pid, sig: i32) -> Result<(), Error> {
    ptrace(
        libc::PTRACE_SINGLESTEP,
        "PTRACE_SINGLESTEP",
        tid,
        0,
        sig as usize,
    )
    .map(drop)
}

/// Removes `sig` from the thread's blocked signals.
pub fn unblock(tid: Pid, sig: i32) -> Result<(), Error> {
    let mut mask: u64 = 0;
    let size = std::mem::size_of::<u64>();
    ptrace(
        libc::PTRACE_GETSIGMASK,
        "PTRACE_GETSIGMASK",
        tid,
        size,
        &mut mask as *mut u64 as usize,
    )?;
    let bit = 1u64 << (sig - 1);
    if mask & bit != 0 {
        mask &= !bit;
        ptrace(
            libc::PTRACE_SETSIGMASK,
            "PTRACE_SETSIGMASK",
            tid,
            size,
            &mask as *const u64 as usize,
        )?;
    }
    Ok(())
}

/// Kills the whole process (`SIGKILL` to the thread group).
pub fn kill(pid: Pid) -> Result<(), Error> {
    // SAFETY: plain syscall.
    if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
        return Err(sys("kill", pid));
    }
    Ok(())
}

pub fn detach(tid: Pid, sig: i32) -> Result<(), Error> {
    ptrace(libc::PTRACE_DETACH, "PTRACE_DETACH", tid, 0, sig as usize).map(drop)
}

pub fn event_msg(tid: Pid) -> Result<u64, Error> {
    let mut msg: libc::c_ulong = 0;
    ptrace(
        libc::PTRACE_GETEVENTMSG,
        "PTRACE_GETEVENTMSG",
        tid,
        0,
        &mut msg as *mut _ as usize,
    )?;
    Ok(msg)
}

pub fn get_regs(tid: Pid) -> Result<Regs, Error> {
    // SAFETY: user_regs_struct is plain old data.
    let mut regs: Regs = unsafe { std::mem::zeroed() };
    ptrace(
        libc::PTRACE_GETREGS,
        "PTRACE_GETREGS",
        tid,
        0,
        &mut regs as *mut _ as usize,
    )?;
    Ok(regs)
}

pub fn set_regs(tid: Pid, regs: &Regs) -> Result<(), Error> {
    ptrace(
        libc::PTRACE_SETREGS,
        "PTRACE_SETREGS",
        tid,
        0,
        regs as *const _ as usize,
    )
    .map(drop)
}

/// The calling thread pinned to the CPU it runs on; dropping it gives the
/// thread its former affinity back. A process forked while it lives inherits
/// the one-CPU mask, and so do that process's threads.
pub struct Pinned {
    former: libc::cpu_set_t,
    pub cpu: usize,
}

/// Pins the calling thread to its current CPU (`sched_getcpu` +
/// `sched_setaffinity`). `None` when the kernel refuses (a container's
/// seccomp policy, say): the follower then runs unpinned, only slower.
pub fn pin_here() -> Option<Pinned> {
    // SAFETY: cpu_set_t is plain old data; the calls get valid pointers of
    // its size and only act on the calling thread (pid 0).
    unsafe {
        let mut former: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if libc::sched_getaffinity(0, size, &mut former) != 0 {
            return None;
        }
        let cpu = usize::try_from(libc::sched_getcpu()).ok()?;
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        (libc::sched_setaffinity(0, size, &one) == 0).then_some(Pinned { former, cpu })
    }
}

impl Pinned {
    /// The affinity the thread had before.
    pub fn former(&self) -> CpuMask {
        mask_bytes(&self.former)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: as in `pin_here`.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.former);
        }
    }
}

/// Sets the thread's `rip` alone (`PTRACE_POKEUSER`): cheaper than a whole
/// `SETREGS` when nothing else changed (docs/verify.md, Speed).
pub fn set_rip(tid: Pid, rip: u64) -> Result<(), Error> {
    let at = std::mem::offset_of!(libc::user, regs) + std::mem::offset_of!(Regs, rip);
    ptrace(
        libc::PTRACE_POKEUSER,
        "PTRACE_POKEUSER",
        tid,
        at,
        rip as usize,
    )
    .map(drop)
}

/// The memory of one process (all its threads share it).
pub struct Mem {
    file: File,
    pid: Pid,
}

impl Mem {
    pub fn open(pid: Pid) -> Result<Mem, Error> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|source| Error::Sys {
                what: "open /proc/PID/mem",
                tid: pid,
                source,
            })?;
        Ok(Mem { file, pid })
    }

    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.file
            .read_exact_at(buf, addr)
            .map_err(|source| Error::Memory {
                pid: self.pid,
                addr,
                source,
            })
    }

    pub fn read_u64(&self, addr: u64) -> Result<u64, Error> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    pub fn write(&self, addr: u64, buf: &[u8]) -> Result<(), Error> {
        self.file
            .write_all_at(buf, addr)
            .map_err(|source| Error::Memory {
                pid: self.pid,
                addr,
                source,
            })
    }
}

/// The file mappings of `pid` from `/proc/PID/maps`: start address, file
/// offset and path of each.
pub fn mappings(pid: Pid) -> Result<Vec<(u64, u64, String)>, Error> {
    let maps =
        std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|source| Error::Sys {
            what: "read /proc/PID/maps",
            tid: pid,
            source,
        })?;
    Ok(maps
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let start = f.next()?.split('-').next()?;
            let off = f.nth(1)?;
            let path = f.nth(2)?;
            Some((
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(off, 16).ok()?,
                path.to_string(),
            ))
        })
        .collect())
}

/// The runtime start of the lowest mapping of `path` (file offset 0) in
/// `/proc/PID/maps`.
pub fn map_base(pid: Pid, path: &std::path::Path) -> Result<Option<u64>, Error> {
    let want = path.to_string_lossy();
    Ok(mappings(pid)?
        .into_iter()
        .find(|(_, off, name)| *off == 0 && *name == want)
        .map(|(start, _, _)| start))
}

/// Waits for the next stop or exit of `tid` alone.
pub fn wait_pid(tid: Pid) -> Result<i32, Error> {
    let mut status = 0;
    loop {
        // SAFETY: plain syscall with a valid out-pointer.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::__WNOTHREAD) };
        if r == tid {
            return Ok(status);
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Err(sys("waitpid", tid));
        }
    }
}
