//! `popen` and `pclose` of an untraced libc, made by `shell_call`
//! (r11 = [`Replaced::Popen`], [`Replaced::Pclose`]) with libc's public
//! functions, so that the shell and what it runs are followed images
//! (`docs/runtime.md` section 7, "system and popen").
//!
//! `popen` redoes glibc 2.36's `_IO_new_proc_open` (libio/iopopen.c):
//! the mode ("r" or "w", "e" for O_CLOEXEC; anything else is left to
//! libc's `popen`, which fails with EINVAL), `pipe2(O_CLOEXEC)`, the
//! child's end moved off the descriptor it is to become, spawn file
//! actions that `dup2` it to 0 or 1 and close the descriptors of the
//! other streams still open, then, when the answer runs the shell by a
//! name of the native path's length, the answer's way into its directory
//! of names and back (an `open` of `.` at its descriptor N, a `chdir`
//! there: the shell's `init` goes back, as a followed spawn child's),
//! `posix_spawn` of the followed shell (asked as `system`'s is,
//! [`ExecKind::Shell`]; its file actions are not known when it asks,
//! nor libc's functions to make them before the answer), the child's end
//! closed, the parent's end without FD_CLOEXEC unless "e", and a `FILE`
//! from `fdopen`. glibc's `pclose` finds its streams in its private
//! `proc_file_chain`, which a `FILE` from `fdopen` is not in, so the
//! runtime keeps its own list (`D_POPEN`, under a spin lock) of nodes
//! from libc's `malloc`: the stream, the child's pid, the descriptor,
//! and a copy of the answer's [`SHELL_FUNCTIONS`] (a `pclose` needs no
//! recorder). `pclose` of a listed stream unlinks it, `fclose`s it and
//! waits for the child (`wait4`, again on EINTR, the caller's mask
//! meanwhile); of any other stream the program's own call runs.
//!
//! Invariants: every signal is blocked except while `pclose` waits (a
//! window reported at the caller); the list's lock is held only with
//! signals blocked, so no handler on the same thread can wait for it.

use super::shell::{
    answered, call_libc, count_skipped, set_errno, wait_for, EINTR, LOCALS, L_PID, L_STATUS,
    SYS_WAIT4,
};
use super::*;

/// The entries of the two bodies and their strings.
pub(super) struct Labels {
    pub popen: CodeLabel,
    pub pclose: CodeLabel,
    s_read: CodeLabel,
    s_write: CodeLabel,
    s_dot: CodeLabel,
}

impl Labels {
    pub fn new(a: &mut CodeAssembler) -> Labels {
        Labels {
            popen: a.create_label(),
            pclose: a.create_label(),
            s_read: a.create_label(),
            s_write: a.create_label(),
            s_dot: a.create_label(),
        }
    }
}

// `popen`'s locals, where `system`'s spawn attributes go.
/// glibc 2.36's `posix_spawn_file_actions_t` (80 bytes).
const L_ACTIONS: i32 = 48;
/// `pipe2`'s two descriptors.
const L_FDS: i32 = 128;
/// The parent's end, the child's end (-1 once closed) and the
/// descriptor the child's end becomes (0 or 1).
const L_PARENT: i32 = 136;
const L_CHILD: i32 = 140;
const L_TARGET: i32 = 144;

/// A list node: the next node, the stream, the child's pid (i32), the
/// stream's descriptor (i32), then libc's [`SHELL_FUNCTIONS`].
const N_FILE: i32 = 8;
const N_PID: i32 = 16;
const N_FD: i32 = 20;
const N_FUNCTIONS: i32 = 24;
const NODE_SIZE: u32 = N_FUNCTIONS as u32 + 8 * SHELL_FUNCTIONS.len() as u32;

/// The mode's bits.
const READ: u32 = 1;
const WRITE: u32 = 2;
const CLOEXEC: u32 = 4;

const SYS_PIPE2: u32 = 293;
const O_CLOEXEC: u32 = 0o2000000;
const F_SETFD: u32 = 2;
const F_DUPFD_CLOEXEC: u32 = 1030;
const ENOMEM: u32 = 12;

/// Both bodies, entered from `shell_call` at `save_all`'s depth, signals
/// blocked; each ends at `result` (rax the call's result, the locals
/// below) or at `native` (the locals below: the program's call runs).
pub(super) fn emit(
    a: &mut CodeAssembler,
    l: &mut super::Labels,
    d: &mut Depths,
    (result, native): (CodeLabel, CodeLabel),
) -> Result<(), IcedError> {
    popen(a, l, result, native)?;
    pclose(a, l, d, result, native)
}

/// The modes `fdopen` is given, the directory the way back opens.
pub(super) fn strings(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    msg(a, &mut l.s_read, "r")?;
    msg(a, &mut l.s_write, "w")?;
    msg(a, &mut l.s_dot, ".")
}

/// `popen(command, mode)`, as the module doc says; the phases of
/// glibc's `_IO_new_proc_open`.
fn popen(
    a: &mut CodeAssembler,
    l: &mut super::Labels,
    result: CodeLabel,
    native: CodeLabel,
) -> Result<(), IcedError> {
    let mut failed = a.create_label();
    let mut failed_locked = a.create_label();
    let mut close_native = a.create_label();
    a.set_label(&mut l.shell.popen.popen)?;
    a.sub(rsp, LOCALS)?;
    parse_mode(a, native)?;
    // pipe2(fds, O_CLOEXEC); when it fails, libc's popen fails alike.
    a.lea(rdi, ptr(rsp + L_FDS))?;
    a.mov(esi, O_CLOEXEC)?;
    a.mov(eax, SYS_PIPE2)?;
    a.syscall()?;
    a.test(eax, eax)?;
    a.jnz(native)?;
    a.mov(r12, qword_ptr(rsp + LOCALS + saved(rdi)))?;
    answered(a, l, Replaced::Popen, close_native)?;
    ends(a)?;
    a.lea(rdi, ptr(rsp + L_ACTIONS))?;
    call_libc(a, SHELL_FA_INIT)?;
    new_node(a)?;
    a.test(r15, r15)?;
    a.jz(failed)?;
    move_child_end(a, failed)?;
    // adddup2(&actions, child's end, 0 or 1).
    a.lea(rdi, ptr(rsp + L_ACTIONS))?;
    a.mov(esi, dword_ptr(rsp + L_CHILD))?;
    a.mov(edx, dword_ptr(rsp + L_TARGET))?;
    call_libc(a, SHELL_FA_DUP2)?;
    a.test(eax, eax)?;
    a.jnz(failed)?;
    lock(a, l)?;
    close_others(a, l, failed_locked)?;
    way_back(a, l, failed_locked)?;
    spawn(a, failed_locked)?;
    parent_end(a, l)?;
    a.mov(qword_ptr(r15 + N_FILE), rax)?;
    a.test(rax, rax)?;
    a.jz(failed_locked)?;
    // The node first in the list, as glibc's `proc_file_chain`.
    a.mov(rax, qword_ptr(l.d_popen))?;
    a.mov(qword_ptr(r15), rax)?;
    a.mov(qword_ptr(l.d_popen), r15)?;
    unlock(a, l)?;
    a.lea(rdi, ptr(rsp + L_ACTIONS))?;
    call_libc(a, SHELL_FA_DESTROY)?;
    a.mov(rax, qword_ptr(r15 + N_FILE))?;
    a.jmp(result)?;
    a.set_label(&mut failed_locked)?;
    unlock(a, l)?;
    a.set_label(&mut failed)?;
    failure(a)?;
    a.jmp(result)?;
    // No answer: nothing made, the pipe closed again.
    a.set_label(&mut close_native)?;
    for end in [L_FDS, L_FDS + 4] {
        a.mov(edi, dword_ptr(rsp + end))?;
        close(a)?;
    }
    a.jmp(native)
}

/// r13d = the mode's [`READ`], [`WRITE`], [`CLOEXEC`] bits; to `native`
/// unless it is one of "r" and "w" with any "e"s (glibc's EINVAL then
/// comes from libc's own `popen`, which spawns nothing).
fn parse_mode(a: &mut CodeAssembler, native: CodeLabel) -> Result<(), IcedError> {
    let mut next = a.create_label();
    let mut parsed = a.create_label();
    a.mov(rsi, qword_ptr(rsp + LOCALS + saved(rsi)))?;
    a.xor(r13d, r13d)?;
    a.set_label(&mut next)?;
    a.movzx(eax, byte_ptr(rsi))?;
    a.inc(rsi)?;
    a.test(eax, eax)?;
    a.jz(parsed)?;
    for (c, bit) in [(b'r', READ), (b'w', WRITE), (b'e', CLOEXEC)] {
        let mut other = a.create_label();
        a.cmp(eax, c as u32)?;
        a.jne(other)?;
        a.or(r13d, bit)?;
        a.jmp(next)?;
        a.set_label(&mut other)?;
    }
    a.jmp(native)?;
    a.set_label(&mut parsed)?;
    let mut valid = a.create_label();
    a.mov(eax, r13d)?;
    a.and(eax, READ | WRITE)?;
    a.cmp(eax, READ)?;
    a.je(valid)?;
    a.cmp(eax, WRITE)?;
    a.jne(native)?;
    a.set_label(&mut valid)?;
    Ok(())
}

/// The parent's and the child's ends and the child's descriptor, as
/// glibc: reading, the parent reads fds[0] and the child's stdout is
/// fds[1]; writing, the parent writes fds[1], the child's stdin fds[0].
fn ends(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let mut reading = a.create_label();
    a.mov(eax, dword_ptr(rsp + L_FDS))?;
    a.mov(ecx, dword_ptr(rsp + L_FDS + 4))?;
    a.test(r13d, READ)?;
    a.jnz(reading)?;
    a.xchg(eax, ecx)?;
    a.set_label(&mut reading)?;
    a.mov(dword_ptr(rsp + L_PARENT), eax)?;
    a.mov(dword_ptr(rsp + L_CHILD), ecx)?;
    a.mov(eax, r13d)?;
    a.and(eax, READ)?;
    a.mov(dword_ptr(rsp + L_TARGET), eax)
}

/// r15 = a new node from libc's `malloc` (0: none), libc's functions
/// copied into it.
fn new_node(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let mut none = a.create_label();
    a.mov(edi, NODE_SIZE)?;
    call_libc(a, SHELL_MALLOC)?;
    a.mov(r15, rax)?;
    a.test(rax, rax)?;
    a.jz(none)?;
    a.lea(rdi, ptr(r15 + N_FUNCTIONS))?;
    a.mov(rsi, r14)?;
    a.mov(ecx, SHELL_FUNCTIONS.len() as u32)?;
    a.rep().movsq()?;
    a.set_label(&mut none)?;
    Ok(())
}

/// The child's end when it is already the descriptor it is to become:
/// moved to another (`F_DUPFD_CLOEXEC`), as glibc, so that the `dup2`
/// clears its FD_CLOEXEC in the child.
fn move_child_end(a: &mut CodeAssembler, failed: CodeLabel) -> Result<(), IcedError> {
    let mut apart = a.create_label();
    a.mov(edi, dword_ptr(rsp + L_CHILD))?;
    a.cmp(edi, dword_ptr(rsp + L_TARGET))?;
    a.jne(apart)?;
    a.mov(esi, F_DUPFD_CLOEXEC)?;
    a.xor(edx, edx)?;
    a.mov(eax, SYS_FCNTL)?;
    a.syscall()?;
    a.test(eax, eax)?;
    a.js(failed)?;
    a.xchg(dword_ptr(rsp + L_CHILD), eax)?;
    a.mov(edi, eax)?;
    close(a)?;
    a.set_label(&mut apart)?;
    Ok(())
}

/// An `addclose` action for each listed stream's descriptor but the one
/// the `dup2` replaces (the lock held); to `failed` when one fails.
fn close_others(
    a: &mut CodeAssembler,
    l: &super::Labels,
    failed: CodeLabel,
) -> Result<(), IcedError> {
    let mut each = a.create_label();
    let mut skip = a.create_label();
    let mut done = a.create_label();
    a.mov(r12, qword_ptr(l.d_popen))?;
    a.set_label(&mut each)?;
    a.test(r12, r12)?;
    a.jz(done)?;
    a.mov(esi, dword_ptr(r12 + N_FD))?;
    a.cmp(esi, dword_ptr(rsp + L_TARGET))?;
    a.je(skip)?;
    a.lea(rdi, ptr(rsp + L_ACTIONS))?;
    call_libc(a, SHELL_FA_CLOSE)?;
    a.test(eax, eax)?;
    a.jnz(failed)?;
    a.set_label(&mut skip)?;
    a.mov(r12, qword_ptr(r12))?;
    a.jmp(each)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// When the answer (rbx) names a directory of names (its fifth word),
/// the actions its own end with: `addopen(&actions, N, ".",
/// SPAWN_BACK_FLAGS, 0)` (N its seventh word), `addchdir_np(&actions,
/// dir)`; last, as there: N was free at the request, and a child's end
/// moved there since is read by its `dup2` before the `open` replaces
/// it. To `failed` when one fails.
fn way_back(a: &mut CodeAssembler, l: &super::Labels, failed: CodeLabel) -> Result<(), IcedError> {
    let mut none = a.create_label();
    a.cmp(qword_ptr(rbx + 32), 0)?;
    a.je(none)?;
    a.lea(rdi, ptr(rsp + L_ACTIONS))?;
    a.mov(esi, dword_ptr(rbx + 48))?;
    a.lea(rdx, ptr(l.shell.popen.s_dot))?;
    a.mov(ecx, SPAWN_BACK_FLAGS as u32)?;
    a.xor(r8d, r8d)?;
    call_libc(a, SHELL_FA_OPEN)?;
    a.test(eax, eax)?;
    a.jnz(failed)?;
    a.lea(rdi, ptr(rsp + L_ACTIONS))?;
    a.mov(rsi, qword_ptr(rbx + 32))?;
    call_libc(a, SHELL_FA_CHDIR)?;
    a.test(eax, eax)?;
    a.jnz(failed)?;
    a.set_label(&mut none)?;
    Ok(())
}

/// `posix_spawn(&node.pid, path, &actions, NULL, argv, environ)` from
/// the answer (rbx: the copy's path, or its name of the native path's
/// length, which [`way_back`]'s `chdir` makes good); then the child's end
/// closed. To `failed` when the spawn fails.
fn spawn(a: &mut CodeAssembler, failed: CodeLabel) -> Result<(), IcedError> {
    a.lea(rdi, ptr(r15 + N_PID))?;
    a.mov(rsi, qword_ptr(rbx))?;
    a.lea(rdx, ptr(rsp + L_ACTIONS))?;
    a.xor(ecx, ecx)?;
    a.mov(r8, qword_ptr(rbx + 8))?;
    a.mov(r9, qword_ptr(rbx + 16))?;
    call_libc(a, SHELL_SPAWN)?;
    a.test(eax, eax)?;
    a.jnz(failed)?;
    a.mov(edi, dword_ptr(rsp + L_CHILD))?;
    a.mov(dword_ptr(rsp + L_CHILD), -1)?;
    close(a)
}

/// The parent's end: FD_CLOEXEC cleared unless "e", the node's
/// descriptor, rax = `fdopen(fd, "r" or "w")`.
fn parent_end(a: &mut CodeAssembler, l: &super::Labels) -> Result<(), IcedError> {
    let mut kept = a.create_label();
    a.mov(edi, dword_ptr(rsp + L_PARENT))?;
    a.mov(dword_ptr(r15 + N_FD), edi)?;
    a.test(r13d, CLOEXEC)?;
    a.jnz(kept)?;
    a.mov(esi, F_SETFD)?;
    a.xor(edx, edx)?;
    a.mov(eax, SYS_FCNTL)?;
    a.syscall()?;
    a.set_label(&mut kept)?;
    a.mov(edi, dword_ptr(rsp + L_PARENT))?;
    a.lea(rsi, ptr(l.shell.popen.s_read))?;
    a.lea(rax, ptr(l.shell.popen.s_write))?;
    a.test(r13d, READ)?;
    a.cmovz(rsi, rax)?;
    call_libc(a, SHELL_FDOPEN)
}

/// glibc's `spawn_failure`: the actions destroyed, the node freed, both
/// ends closed (a child that `fdopen` failed for, once spawned, waited
/// for with signals blocked), errno = ENOMEM, rax = NULL.
fn failure(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let mut unspawned = a.create_label();
    a.lea(rdi, ptr(rsp + L_ACTIONS))?;
    call_libc(a, SHELL_FA_DESTROY)?;
    a.cmp(dword_ptr(rsp + L_CHILD), -1)?;
    a.jne(unspawned)?;
    a.mov(edi, dword_ptr(rsp + L_PARENT))?;
    close(a)?;
    a.mov(dword_ptr(rsp + L_PARENT), -1)?;
    reap(a)?;
    a.set_label(&mut unspawned)?;
    a.mov(rdi, r15)?;
    call_libc(a, SHELL_FREE)?;
    for end in [L_CHILD, L_PARENT] {
        let mut closed = a.create_label();
        a.mov(edi, dword_ptr(rsp + end))?;
        a.test(edi, edi)?;
        a.js(closed)?;
        close(a)?;
        a.set_label(&mut closed)?;
    }
    a.mov(r12d, ENOMEM)?;
    set_errno(a, r12d)?;
    a.xor(eax, eax)
}

/// `wait4(node.pid, NULL, 0)` until it is not EINTR, signals blocked.
fn reap(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let mut again = a.create_label();
    a.set_label(&mut again)?;
    a.movsxd(rdi, dword_ptr(r15 + N_PID))?;
    a.xor(esi, esi)?;
    a.xor(edx, edx)?;
    a.xor(r10d, r10d)?;
    a.mov(eax, SYS_WAIT4)?;
    a.syscall()?;
    a.cmp(eax, -EINTR)?;
    a.je(again)
}

/// `pclose(stream)`: a listed stream unlinked, `fclose`d, its child
/// waited for (glibc's `_IO_new_proc_close`); any other to `native`.
fn pclose(
    a: &mut CodeAssembler,
    l: &mut super::Labels,
    d: &mut Depths,
    result: CodeLabel,
    native: CodeLabel,
) -> Result<(), IcedError> {
    let mut find = a.create_label();
    let mut found = a.create_label();
    let mut not_ours = a.create_label();
    let mut status = a.create_label();
    a.set_label(&mut l.shell.popen.pclose)?;
    a.sub(rsp, LOCALS)?;
    a.mov(rdi, qword_ptr(rsp + LOCALS + saved(rdi)))?;
    lock(a, l)?;
    // rdx = the link to the node (the head, or a node's `next` at 0).
    a.lea(rdx, ptr(l.d_popen))?;
    a.set_label(&mut find)?;
    a.mov(r15, qword_ptr(rdx))?;
    a.test(r15, r15)?;
    a.jz(not_ours)?;
    a.cmp(qword_ptr(r15 + N_FILE), rdi)?;
    a.je(found)?;
    a.mov(rdx, r15)?;
    a.jmp(find)?;
    a.set_label(&mut found)?;
    a.mov(rax, qword_ptr(r15))?;
    a.mov(qword_ptr(rdx), rax)?;
    unlock(a, l)?;
    a.lea(r14, ptr(r15 + N_FUNCTIONS))?;
    count_skipped(a, Replaced::Pclose)?;
    a.mov(rdi, qword_ptr(r15 + N_FILE))?;
    call_libc(a, SHELL_FCLOSE)?;
    a.mov(r13d, eax)?;
    a.mov(eax, dword_ptr(r15 + N_PID))?;
    a.mov(dword_ptr(rsp + L_PID), eax)?;
    wait_for(a, d, false)?;
    // errno = waitpid's error when it failed (r12d = -errno, else the
    // pid).
    a.xor(eax, eax)?;
    a.neg(r12d)?;
    a.cmovs(r12d, eax)?;
    set_errno(a, r12d)?;
    a.mov(rdi, r15)?;
    call_libc(a, SHELL_FREE)?;
    // The status, or -1 when it is 0 and `fclose` failed (glibc returns
    // the close's status unless 0, else the flush's).
    a.movsxd(rax, dword_ptr(rsp + L_STATUS))?;
    a.test(eax, eax)?;
    a.jnz(status)?;
    a.movsxd(rax, r13d)?;
    a.set_label(&mut status)?;
    a.jmp(result)?;
    a.set_label(&mut not_ours)?;
    unlock(a, l)?;
    a.jmp(native)
}

/// Takes the list's spin lock (signals are blocked). Clobbers eax.
fn lock(a: &mut CodeAssembler, l: &super::Labels) -> Result<(), IcedError> {
    let mut again = a.create_label();
    let mut taken = a.create_label();
    a.set_label(&mut again)?;
    a.mov(eax, 1u32)?;
    a.xchg(dword_ptr(l.d_popen_lock), eax)?;
    a.test(eax, eax)?;
    a.jz(taken)?;
    a.pause()?;
    a.jmp(again)?;
    a.set_label(&mut taken)?;
    Ok(())
}

fn unlock(a: &mut CodeAssembler, l: &super::Labels) -> Result<(), IcedError> {
    a.mov(dword_ptr(l.d_popen_lock), 0)
}

/// `close(edi)`. Clobbers what a system call does.
fn close(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.mov(eax, SYS_CLOSE)?;
    a.syscall()
}
