//! `exec_request`: an exec the traced code is about to make, handed to
//! the recorder, which rewrites the program it runs and answers with the
//! `execve` that runs the copy (`docs/runtime.md` section 7, "exec").
//!
//! The rewriter calls it just before a call of libc's exec family (r11 =
//! the [`ExecKind`]) and before a `syscall` whose rax is `execve` or
//! `execveat` (r11 = [`ExecKind::Syscall`]); every register is the
//! program's then. It fills the slot's request fields with the argument
//! registers, the caller's rsp and [`EXEC_BUF_SIZE`] bytes of its own
//! stack for the answer, wakes the recorder and waits for EXEC_ANSWERED
//! (checking each [`RECORDER_CHECK_SECS`] that the recorder lives). An
//! answer of 0 returns: the program's own call then runs as natively
//! (an error with its native errno, or an untraced program). Otherwise
//! the answer's first six words are the `execve`'s path, argv and envp,
//! two directories and the offset of the process's entry in the header's
//! table of them ([`H_EXEC_CWD`]; 0s: none; [`S_EXEC_ANSWER`]). With signals still blocked the process
//! goes to the first, the directory of names from which the path, as
//! long as the native one, names the copy (`record::execname`, the new
//! image's `init` goes back); the signal mask is put back (the new image
//! inherits it) and the answer's `execve` runs; should it fail, the
//! process goes to the second, its own directory (the recorder's
//! descriptor of it), frees the entry, and the program's call runs.
//!
//! A `posix_spawn` or `posix_spawnp` call ([`ExecKind::spawns`]) runs
//! its exec in the child, inside libc, after this returns: the answer
//! lies in the slot's [`S_SPAWN_BUF`] (the stack below the caller's rsp
//! is where `posix_spawn`'s frames go), and a nonzero answer replaces
//! the caller's `path` (rsi) and `argv` (r8) with the copy's path and,
//! for a script, the kernel's argv, and, when the copy runs by a name of
//! the native path's length, its `file_actions` (rdx) with the program's
//! followed by the way into the directory of names and back (the
//! answer's fourth word); then the call runs as the program made it. The buffer is the thread's until its next request: the
//! child's `execve` reads it while its parent waits in `posix_spawn`.
//!
//! Invariants: signals are blocked from the request to the answer (a
//! handler never sees a half-filled request); the recorder writes only
//! inside the lent bytes: the stack's, which `exec_request` touches
//! first, top down, so the kernel has grown the stack over them, or the
//! slot's spawn buffer.

use super::*;

/// `exec_request()`: see the module doc.
pub(super) fn emit(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut native = a.create_label();
    let mut answered = a.create_label();
    let mut probe = a.create_label();
    let mut drop = a.create_label();
    let mut d = enter_asking(a, &mut l.exec_request, l.d_region, native)?;
    a.mov(rbx, qword_ptr(S_BASE).gs())?;
    // The request: the argument registers as the caller left them.
    a.mov(eax, dword_ptr(rsp + saved(r11)))?;
    a.mov(dword_ptr(rbx + S_EXEC_KIND), eax)?;
    for (i, r) in [rdi, rsi, rdx, rcx, r8, r9, r10, rax]
        .into_iter()
        .enumerate()
    {
        a.mov(rax, qword_ptr(rsp + saved(r)))?;
        a.mov(qword_ptr(rbx + S_EXEC_ARGS as i32 + 8 * i as i32), rax)?;
    }
    // The caller's rsp before its call of this entry point.
    a.lea(rax, ptr(rsp + FRAME as i32 + 8))?;
    a.mov(qword_ptr(rbx + S_EXEC_SP), rax)?;
    let mut spawn = a.create_label();
    a.mov(eax, dword_ptr(rbx + S_EXEC_KIND))?;
    a.and(eax, !EXEC_ENTERED as i32)?;
    for kind in ExecKind::SPAWNS {
        a.cmp(eax, kind as i32)?;
        a.je(spawn)?;
    }
    // The answer's bytes, touched top down so the stack covers them.
    a.mov(rcx, rsp)?;
    a.sub(rsp, EXEC_BUF_SIZE as i32)?;
    a.set_label(&mut probe)?;
    a.sub(rcx, 4096)?;
    a.mov(byte_ptr(rcx), 0)?;
    a.cmp(rcx, rsp)?;
    a.ja(probe)?;
    a.mov(qword_ptr(rbx + S_EXEC_BUF), rsp)?;
    ask(a, l, drop, answered)?;
    a.set_label(&mut answered)?;
    a.test(r12, r12)?;
    a.jz(drop)?;
    // Into the directory of names, still blocked: the copy is exec'd by
    // a name of the native path's length from there.
    chdir_answer(a, 24)?;
    // The program's mask for the new image (the answer stays below rsp,
    // where a handler's frame cannot overwrite it), then its execve.
    a.mov(edi, 2u32)?; // SIG_SETMASK
    a.lea(rsi, ptr(rsp + EXEC_BUF_SIZE as i32))?;
    a.xor(edx, edx)?;
    a.mov(r10d, 8u32)?;
    a.mov(eax, SYS_RT_SIGPROCMASK)?;
    a.syscall()?;
    d.mark(a, Some(FRAME + EXEC_BUF_SIZE as u32))?;
    a.mov(rdi, qword_ptr(r12))?;
    a.mov(rsi, qword_ptr(r12 + 8))?;
    a.mov(rdx, qword_ptr(r12 + 16))?;
    a.mov(eax, SYS_EXECVE)?;
    a.syscall()?;
    // It failed (the copy vanished): back to the program's directory,
    // then its call, as natively.
    chdir_answer(a, 32)?;
    let mut kept = a.create_label();
    a.mov(rax, qword_ptr(r12 + 40))?;
    a.test(rax, rax)?;
    a.jz(kept)?;
    a.mov(rcx, qword_ptr(l.d_region))?;
    a.mov(dword_ptr(rcx + rax), 0)?;
    a.set_label(&mut kept)?;
    a.add(rsp, EXEC_BUF_SIZE as i32)?;
    d.mark(a, Some(FRAME))?;
    block_signals(a)?;
    d.mark(a, None)?;
    a.jmp(native)?;
    a.set_label(&mut spawn)?;
    spawn_answer(a, l, native)?;
    a.set_label(&mut drop)?;
    a.add(rsp, EXEC_BUF_SIZE as i32)?;
    a.set_label(&mut native)?;
    leave_blocked(a, &mut l.windows, d, Caller::Placed)
}

/// `chdir` to the answer's path at `r12 + at` unless it is NULL (the
/// copy is exec'd by its own path). Clobbers rax, rcx, rdi, r11.
fn chdir_answer(a: &mut CodeAssembler, at: i32) -> Result<(), IcedError> {
    let mut none = a.create_label();
    a.mov(rdi, qword_ptr(r12 + at))?;
    a.test(rdi, rdi)?;
    a.jz(none)?;
    a.mov(eax, SYS_CHDIR)?;
    a.syscall()?;
    a.set_label(&mut none)?;
    Ok(())
}

/// The request's common end (rbx = the slot, EXEC_BUF set): asks the
/// recorder and waits. Jumps to `answered` with r12 = the answer, or to
/// `gone` when the recorder died (it never answers: the program's own
/// call runs).
fn ask(
    a: &mut CodeAssembler,
    l: &Labels,
    gone: CodeLabel,
    answered: CodeLabel,
) -> Result<(), IcedError> {
    let mut got = a.create_label();
    a.mov(qword_ptr(rbx + S_EXEC_ANSWER), 0)?;
    // x86 stores are ordered: the fields are visible before the state.
    a.mov(dword_ptr(rbx + S_EXEC_STATE), EXEC_ASKED)?;
    wake_recorder(a)?;
    wait_for_recorder(a, l, ptr(rbx + S_EXEC_STATE), EXEC_ASKED, got)?;
    a.mov(dword_ptr(rbx + S_EXEC_STATE), EXEC_IDLE)?;
    a.jmp(gone)?;
    a.set_label(&mut got)?;
    a.mov(r12, qword_ptr(rbx + S_EXEC_ANSWER))?;
    a.mov(dword_ptr(rbx + S_EXEC_STATE), EXEC_IDLE)?;
    a.jmp(answered)
}

/// A `posix_spawn` request (rbx = the slot, signals blocked, the frame
/// of `save_all` at rsp): the answer in the slot's spawn buffer, its
/// path and argv put in the caller's rsi and r8 and its file actions,
/// if any, in rdx, its address in rax (0:
/// none; dead at the call, read by `shell_call`); then to `done`, which
/// returns to the call.
fn spawn_answer(a: &mut CodeAssembler, l: &Labels, done: CodeLabel) -> Result<(), IcedError> {
    let mut answered = a.create_label();
    a.lea(rax, ptr(rbx + S_SPAWN_BUF))?;
    a.mov(qword_ptr(rbx + S_EXEC_BUF), rax)?;
    ask(a, l, done, answered)?;
    a.set_label(&mut answered)?;
    a.mov(qword_ptr(rsp + saved(rax)), r12)?;
    a.test(r12, r12)?;
    a.jz(done)?;
    a.mov(rax, qword_ptr(r12))?;
    a.mov(qword_ptr(rsp + saved(rsi)), rax)?;
    a.mov(rax, qword_ptr(r12 + 8))?;
    a.mov(qword_ptr(rsp + saved(r8)), rax)?;
    a.mov(rax, qword_ptr(r12 + 24))?;
    a.test(rax, rax)?;
    a.jz(done)?;
    a.mov(qword_ptr(rsp + saved(rdx)), rax)?;
    a.jmp(done)
}
