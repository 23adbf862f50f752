//! Native gdb as an oracle on any x86-64 CPU.
//!
//! Debian 12's gdb 13 writes the XSAVE area (`PTRACE_SETREGSET`,
//! `NT_X86_XSTATE`) from a buffer sized for the features it knows, AVX-512
//! and PKRU at most. On a CPU with AMX the kernel takes only the whole
//! area (11 kB) and answers EFAULT ("Couldn't write extended state status:
//! Bad address"), so `record full` cannot go back over an instruction that
//! changed an SSE register (libc's `memcpy`, `printf`). A seccomp filter
//! makes gdb's `NT_X86_XSTATE` requests fail with EIO; gdb then reads and
//! writes the FXSAVE area instead (`PTRACE_GETFPREGS`): x87 and SSE, all the
//! tests' native runs use with libc's AVX variants turned off. On a CPU
//! without AMX nothing else changes.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// `gdb` that never uses the XSAVE register set (see the module).
pub fn gdb() -> Command {
    let filter = xstate_filter();
    let mut cmd = Command::new("gdb");
    // SAFETY: between fork and exec the closure only makes two `prctl`
    // calls on data it owns (async-signal-safe).
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut libc::sock_filter,
            };
            let ok = libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
                && libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER as libc::c_ulong,
                    &prog as *const libc::sock_fprog as libc::c_ulong,
                    0,
                    0,
                ) == 0;
            if ok {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    cmd
}

/// `ptrace(PTRACE_GETREGSET or PTRACE_SETREGSET, _, NT_X86_XSTATE, _)`
/// fails with EIO; every other system call runs.
fn xstate_filter() -> [libc::sock_filter; 11] {
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    const ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
    const NT_X86_XSTATE: u32 = 0x202;
    let (ld, jeq, ret) = (
        libc::BPF_LD | libc::BPF_W | libc::BPF_ABS,
        libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
        libc::BPF_RET | libc::BPF_K,
    );
    // seccomp_data: nr at 0, arch at 4, args[i]'s low word at 16 + 8 * i.
    [
        op(ld, 0, 0, 4),
        op(jeq, 0, 7, ARCH),
        op(ld, 0, 0, 0),
        op(jeq, 0, 5, libc::SYS_ptrace as u32),
        op(ld, 0, 0, 16),
        op(jeq, 1, 0, libc::PTRACE_GETREGSET),
        op(jeq, 0, 2, libc::PTRACE_SETREGSET),
        op(ld, 0, 0, 32),
        op(jeq, 1, 0, NT_X86_XSTATE),
        op(ret, 0, 0, libc::SECCOMP_RET_ALLOW),
        op(ret, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EIO as u32),
    ]
}
