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
//! the signal mask is put back (the new image inherits it) and the
//! answer's `execve` runs; should it fail, the program's call runs.
//!
//! Invariants: signals are blocked from the request to the answer (a
//! handler never sees a half-filled request); the recorder writes only
//! inside the lent stack bytes, which `exec_request` touches first, top
//! down, so the kernel has grown the stack over them.

use super::*;

/// `exec_request()`: see the module doc.
pub(super) fn emit(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut native = a.create_label();
    let mut answered = a.create_label();
    let mut probe = a.create_label();
    let mut drop = a.create_label();
    let mut d = enter_blocked(a, &mut l.exec_request)?;
    a.mov(r15, qword_ptr(l.d_region))?;
    a.test(r15, r15)?;
    a.jz(native)?;
    a.test(
        dword_ptr(r15 + H_FLAGS),
        FLAG_STANDALONE | FLAG_RECORDER_GONE,
    )?;
    a.jnz(native)?;
    a.mov(rbx, qword_ptr(S_BASE).gs())?;
    // The request: the argument registers as the caller left them.
    let saved = |r| FRAME as i32 - 16 - 8 * SAVED.iter().position(|s| *s == r).unwrap() as i32;
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
    // The answer's bytes, touched top down so the stack covers them.
    a.mov(rcx, rsp)?;
    a.sub(rsp, EXEC_BUF_SIZE as i32)?;
    a.set_label(&mut probe)?;
    a.sub(rcx, 4096)?;
    a.mov(byte_ptr(rcx), 0)?;
    a.cmp(rcx, rsp)?;
    a.ja(probe)?;
    a.mov(qword_ptr(rbx + S_EXEC_BUF), rsp)?;
    a.mov(qword_ptr(rbx + S_EXEC_ANSWER), 0)?;
    // x86 stores are ordered: the fields are visible before the state.
    a.mov(dword_ptr(rbx + S_EXEC_STATE), EXEC_ASKED)?;
    wake_recorder(a)?;
    // A recorder that died never answers: run the program's own call.
    wait_for_recorder(a, l, ptr(rbx + S_EXEC_STATE), EXEC_ASKED, answered)?;
    a.mov(dword_ptr(rbx + S_EXEC_STATE), EXEC_IDLE)?;
    a.jmp(drop)?;
    a.set_label(&mut answered)?;
    a.mov(r12, qword_ptr(rbx + S_EXEC_ANSWER))?;
    a.mov(dword_ptr(rbx + S_EXEC_STATE), EXEC_IDLE)?;
    a.test(r12, r12)?;
    a.jz(drop)?;
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
    // It failed (the copy vanished): the program's call, as natively.
    a.add(rsp, EXEC_BUF_SIZE as i32)?;
    d.mark(a, Some(FRAME))?;
    block_signals(a)?;
    d.mark(a, None)?;
    a.jmp(native)?;
    a.set_label(&mut drop)?;
    a.add(rsp, EXEC_BUF_SIZE as i32)?;
    a.set_label(&mut native)?;
    leave_blocked(a, &mut l.windows, d, Caller::Placed)
}
