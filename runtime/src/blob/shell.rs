//! `shell_call`: an untraced libc's `system`, redone with libc's public
//! functions so that the shell it runs is a followed image
//! (`docs/runtime.md` section 7, "system and popen").
//!
//! glibc 2.36's `system` spawns `/bin/sh` from its own read-only data
//! through its hidden `__posix_spawn`: nothing at the program's call
//! names the shell, and the child's exec runs inside libc. The rewriter
//! calls this entry where it would ask about an exec (r11 = the
//! [`ShellCall`] and [`SHELL_COUNTED`]/[`SHELL_LAZY`] bits, every other
//! register the program's); it returns r11 = 0 when it made the call
//! (rax its result; the rewriter's code then skips the program's call),
//! else r11 = 1 with every register as it was (the program's call runs:
//! no recorder, a traced libc, a shell the recorder cannot follow).
//!
//! It does what glibc 2.36's `do_system` does: SIGINT and SIGQUIT
//! ignored (`sigaction`), SIGCHLD blocked while it waits, `posix_spawn`
//! of `/bin/sh` with `sh -c COMMAND`, the caller's mask and SIGINT and
//! SIGQUIT at their default (unless ignored before) in the child
//! (POSIX_SPAWN_SETSIGMASK, POSIX_SPAWN_SETSIGDEF), `waitpid` again on
//! EINTR, 127 << 8 when the spawn fails (errno set to its error), both
//! dispositions put back; `system(NULL)` runs `exit 0` and says whether
//! it returned 0. The spawn is asked as a `posix_spawn` is
//! (`exec_request` with [`ExecKind::Shell`]), whose answer also gives the
//! current environment and libc's functions ([`SHELL_FUNCTIONS`]).
//!
//! Invariants: signals are blocked except while it waits for the child
//! (a window reported at the caller, [`Caller::Placed`]) and inside
//! libc's functions, which it calls on a 16-byte aligned stack; the
//! answer in the slot's spawn buffer is read before anything else could
//! ask again.

use super::*;

/// The entry point and its strings.
pub(super) struct Labels {
    pub entry: CodeLabel,
    s_path: CodeLabel,
    s_name: CodeLabel,
    s_dash_c: CodeLabel,
    s_exit0: CodeLabel,
}

impl Labels {
    pub fn new(a: &mut CodeAssembler) -> Labels {
        Labels {
            entry: a.create_label(),
            s_path: a.create_label(),
            s_name: a.create_label(),
            s_dash_c: a.create_label(),
            s_exit0: a.create_label(),
        }
    }
}

// The entry's locals, below `save_all`'s frame.
/// The child's pid.
const L_PID: i32 = 0;
/// `{"sh", "-c", COMMAND, NULL}`.
const L_ARGV: i32 = 8;
/// glibc 2.36's `posix_spawnattr_t` (336 bytes): flags (i16) at 0, the
/// default set at 8, the mask at 136.
const L_ATTR: i32 = 48;
const ATTR_SIZE: i32 = 336;
const ATTR_SIGDEFAULT: i32 = 8;
const ATTR_SIGMASK: i32 = 136;
/// POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK.
const ATTR_FLAGS: u32 = 0x04 | 0x08;
/// glibc's `struct sigaction` (152 bytes, the handler at 0): SIG_IGN
/// with an empty mask and no flags, then SIGINT's and SIGQUIT's before.
const L_IGNORE: i32 = 384;
const L_INTR: i32 = 536;
const L_QUIT: i32 = 688;
const SIGACTION_SIZE: i32 = 152;
/// The child's wait status, then the mask it waits with, then the
/// mask that blocks everything again.
const L_STATUS: i32 = 840;
const L_WAIT_MASK: i32 = 848;
const L_ALL: i32 = 856;
const LOCALS: i32 = 864;

const SIGINT: u32 = 2;
const SIGQUIT: u32 = 3;
const SIGCHLD: u32 = 17;
const SIG_IGN: u64 = 1;
const SYS_WAIT4: u32 = 61;
const EINTR: i32 = 4;

/// `shell_call()`: see the module doc.
pub(super) fn emit(a: &mut CodeAssembler, l: &mut super::Labels) -> Result<(), IcedError> {
    let mut native = a.create_label();
    let mut made = a.create_label();
    let mut not_asked = a.create_label();
    let mut d = enter_asking(a, &mut l.shell.entry, l.d_region, native)?;
    a.movzx(eax, byte_ptr(rsp + saved(r11)))?;
    a.cmp(eax, ShellCall::System as i32)?;
    a.jne(native)?;
    a.sub(rsp, LOCALS)?;
    // r12 = the command, r13 = whether it was NULL.
    let mut given = a.create_label();
    a.mov(r12, qword_ptr(rsp + LOCALS + saved(rdi)))?;
    a.xor(r13d, r13d)?;
    a.test(r12, r12)?;
    a.jnz(given)?;
    a.lea(r12, ptr(l.shell.s_exit0))?;
    a.mov(r13d, 1u32)?;
    a.set_label(&mut given)?;
    ask(a, l)?;
    a.test(rax, rax)?;
    a.jz(not_asked)?;
    // rbx = the answer, r14 = libc's functions.
    a.mov(rbx, rax)?;
    a.mov(r14, qword_ptr(rbx + 40))?;
    count_skipped(a)?;
    ignore_int_quit(a)?;
    spawn_attributes(a)?;
    // posix_spawn(&pid, copy, NULL, &attr, argv, environ).
    a.lea(rdi, ptr(rsp + L_PID))?;
    a.mov(rsi, qword_ptr(rbx))?;
    a.xor(edx, edx)?;
    a.lea(rcx, ptr(rsp + L_ATTR))?;
    a.mov(r8, qword_ptr(rbx + 8))?;
    a.mov(r9, qword_ptr(rbx + 16))?;
    call_libc(a, SHELL_SPAWN)?;
    a.mov(r15d, eax)?;
    wait_child(a, &mut d)?;
    restore_int_quit(a)?;
    set_errno(a)?;
    // The result: the status, or for `system(NULL)` whether it was 0.
    let mut status = a.create_label();
    a.mov(eax, dword_ptr(rsp + L_STATUS))?;
    a.test(r13d, r13d)?;
    a.jz(status)?;
    a.test(eax, eax)?;
    a.sete(al)?;
    a.movzx(eax, al)?;
    a.set_label(&mut status)?;
    a.mov(qword_ptr(rsp + LOCALS + saved(rax)), rax)?;
    a.add(rsp, LOCALS)?;
    a.mov(qword_ptr(rsp + saved(r11)), 0)?;
    a.jmp(made)?;
    a.set_label(&mut not_asked)?;
    a.add(rsp, LOCALS)?;
    a.set_label(&mut native)?;
    a.mov(qword_ptr(rsp + saved(r11)), 1)?;
    a.set_label(&mut made)?;
    leave_blocked(a, &mut l.windows, d, Caller::Placed)?;
    msg(a, &mut l.shell.s_path, "/bin/sh")?;
    msg(a, &mut l.shell.s_name, "sh")?;
    msg(a, &mut l.shell.s_dash_c, "-c")?;
    msg(a, &mut l.shell.s_exit0, "exit 0")
}

/// The spawn's request (r12 = the command): `exec_request` as before
/// `posix_spawn(&pid, "/bin/sh", NULL, &attr, argv, NULL)`, which
/// leaves rax = the answer (0: none).
fn ask(a: &mut CodeAssembler, l: &super::Labels) -> Result<(), IcedError> {
    a.lea(rax, ptr(l.shell.s_name))?;
    a.mov(qword_ptr(rsp + L_ARGV), rax)?;
    a.lea(rax, ptr(l.shell.s_dash_c))?;
    a.mov(qword_ptr(rsp + L_ARGV + 8), rax)?;
    a.mov(qword_ptr(rsp + L_ARGV + 16), r12)?;
    a.mov(qword_ptr(rsp + L_ARGV + 24), 0)?;
    a.lea(rdi, ptr(rsp + L_PID))?;
    a.lea(rsi, ptr(l.shell.s_path))?;
    a.xor(edx, edx)?;
    a.lea(rcx, ptr(rsp + L_ATTR))?;
    a.lea(r8, ptr(rsp + L_ARGV))?;
    a.xor(r9d, r9d)?;
    a.xor(eax, eax)?;
    a.mov(r11d, ExecKind::Shell as u32)?;
    a.call(l.exec_request)
}

/// The transfers the skipped call would have counted: the call site's
/// ([`SHELL_COUNTED`]) and, from an unbound PLT slot ([`SHELL_LAZY`]),
/// `<plt0>`'s jump into ld.so, after binding the slot (the caller's rax)
/// to libc's function as ld.so would. Clobbers rax, rcx, rdx.
fn count_skipped(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let mut counted = a.create_label();
    let mut bound = a.create_label();
    a.mov(ecx, dword_ptr(rsp + LOCALS + saved(r11)))?;
    a.test(ecx, SHELL_COUNTED)?;
    a.jz(counted)?;
    a.inc(dword_ptr(S_XFERS).gs())?;
    a.set_label(&mut counted)?;
    a.test(ecx, SHELL_LAZY)?;
    a.jz(bound)?;
    a.inc(dword_ptr(S_XFERS).gs())?;
    a.mov(
        rax,
        qword_ptr(r14 + 8 * ShellCall::System.function() as i32),
    )?;
    a.mov(rdx, qword_ptr(rsp + LOCALS + saved(rax)))?;
    a.mov(qword_ptr(rdx), rax)?;
    a.set_label(&mut bound)?;
    Ok(())
}

/// `sigaction(SIGINT, &ignore, &intr)`, the same for SIGQUIT.
fn ignore_int_quit(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.lea(rdi, ptr(rsp + L_IGNORE))?;
    zero(a, SIGACTION_SIZE)?;
    a.mov(qword_ptr(rsp + L_IGNORE), SIG_IGN as i32)?;
    for (sig, old) in [(SIGINT, L_INTR), (SIGQUIT, L_QUIT)] {
        a.mov(edi, sig)?;
        a.lea(rsi, ptr(rsp + L_IGNORE))?;
        a.lea(rdx, ptr(rsp + old))?;
        call_libc(a, SHELL_SIGACTION)?;
    }
    Ok(())
}

/// `sigaction(SIGINT, &intr, NULL)`, the same for SIGQUIT.
fn restore_int_quit(a: &mut CodeAssembler) -> Result<(), IcedError> {
    for (sig, old) in [(SIGINT, L_INTR), (SIGQUIT, L_QUIT)] {
        a.mov(edi, sig)?;
        a.lea(rsi, ptr(rsp + old))?;
        a.xor(edx, edx)?;
        call_libc(a, SHELL_SIGACTION)?;
    }
    Ok(())
}

/// The spawn's attributes: the caller's mask (the one `save_all` kept)
/// and, by default, SIGINT and SIGQUIT unless they were ignored.
fn spawn_attributes(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.lea(rdi, ptr(rsp + L_ATTR))?;
    zero(a, ATTR_SIZE)?;
    a.mov(word_ptr(rsp + L_ATTR), ATTR_FLAGS)?;
    a.mov(rax, qword_ptr(rsp + LOCALS))?;
    a.mov(qword_ptr(rsp + L_ATTR + ATTR_SIGMASK), rax)?;
    for (sig, old) in [(SIGINT, L_INTR), (SIGQUIT, L_QUIT)] {
        let mut ignored = a.create_label();
        a.cmp(qword_ptr(rsp + old), SIG_IGN as i32)?;
        a.je(ignored)?;
        a.or(qword_ptr(rsp + L_ATTR + ATTR_SIGDEFAULT), 1 << (sig - 1))?;
        a.set_label(&mut ignored)?;
    }
    Ok(())
}

/// r15d = `posix_spawn`'s error: 0, or the status is 127 << 8. Else
/// `waitpid(pid, &status, 0)` with the caller's mask and SIGCHLD
/// blocked, again on EINTR; status -1 when it fails otherwise.
fn wait_child(a: &mut CodeAssembler, d: &mut Depths) -> Result<(), IcedError> {
    let mut failed = a.create_label();
    let mut again = a.create_label();
    let mut done = a.create_label();
    let mut reaped = a.create_label();
    a.test(r15d, r15d)?;
    a.jnz(failed)?;
    a.mov(rax, qword_ptr(rsp + LOCALS))?;
    a.bts(rax, SIGCHLD - 1)?;
    a.mov(qword_ptr(rsp + L_WAIT_MASK), rax)?;
    a.mov(qword_ptr(rsp + L_ALL), -1)?;
    set_mask(a, L_WAIT_MASK)?;
    // Signals other than SIGCHLD may come while it waits: the caller's.
    d.mark(a, Some(FRAME + LOCALS as u32))?;
    a.movsxd(rdi, dword_ptr(rsp + L_PID))?;
    a.set_label(&mut again)?;
    a.lea(rsi, ptr(rsp + L_STATUS))?;
    a.xor(edx, edx)?;
    a.xor(r10d, r10d)?;
    a.mov(eax, SYS_WAIT4)?;
    a.syscall()?;
    a.cmp(eax, -EINTR)?;
    a.je(again)?;
    a.cmp(eax, dword_ptr(rsp + L_PID))?;
    a.je(reaped)?;
    a.mov(dword_ptr(rsp + L_STATUS), -1)?;
    a.set_label(&mut reaped)?;
    set_mask(a, L_ALL)?;
    d.mark(a, None)?;
    a.jmp(done)?;
    a.set_label(&mut failed)?;
    a.mov(dword_ptr(rsp + L_STATUS), 127 << 8)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// `rt_sigprocmask(SIG_SETMASK, &local, NULL)`.
fn set_mask(a: &mut CodeAssembler, local: i32) -> Result<(), IcedError> {
    a.mov(edi, 2u32)?; // SIG_SETMASK
    a.lea(rsi, ptr(rsp + local))?;
    a.xor(edx, edx)?;
    a.mov(r10d, 8u32)?;
    a.mov(eax, SYS_RT_SIGPROCMASK)?;
    a.syscall()
}

/// errno = r15d unless it is 0 (the spawn's error, as glibc sets it).
fn set_errno(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let mut none = a.create_label();
    a.test(r15d, r15d)?;
    a.jz(none)?;
    call_libc(a, SHELL_ERRNO)?;
    a.mov(dword_ptr(rax), r15d)?;
    a.set_label(&mut none)?;
    Ok(())
}

/// Calls libc's function `index` of [`SHELL_FUNCTIONS`] (r14 = their
/// addresses) on a 16-byte aligned stack. Clobbers what a call does and
/// rbp.
fn call_libc(a: &mut CodeAssembler, index: usize) -> Result<(), IcedError> {
    a.mov(rbp, rsp)?;
    a.and(rsp, -16)?;
    a.call(qword_ptr(r14 + 8 * index as i32))?;
    a.mov(rsp, rbp)
}

/// Zeroes `len` bytes (a multiple of 8) at rdi. Clobbers rax, rcx, rdi.
fn zero(a: &mut CodeAssembler, len: i32) -> Result<(), IcedError> {
    debug_assert!(len % 8 == 0);
    a.xor(eax, eax)?;
    a.mov(ecx, (len / 8) as u32)?;
    a.rep().stosq()
}
