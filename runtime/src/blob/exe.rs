//! The executable's native names (`docs/runtime.md` section 5, "The
//! executable's names"; issue 23, a process that looks like the native
//! one): `AT_EXECFN`'s string, which the first `init` writes back, and
//! `/proc/self/exe`, which `exe_path` answers for the program's
//! `readlink` and `realpath` with the original's path.
//!
//! `AT_EXECFN`: the recorder execs the copy by a relative name of the
//! native path's length (`record::execname`, [`FLAG_CHDIR`]); the kernel
//! copied that name to the top of the stack, so the native path's bytes
//! fit there exactly ([`H_EXE`]). The first `init` writes them before
//! any of the program's own code runs.
//!
//! `exe_path`: called just before a call that reads a link or resolves a
//! path by name (`readlink`, `readlinkat`, `realpath`, ...:
//! `analysis::imports::exe_path_arg`), r11 = 0 when the path is the first
//! argument (rdi), 1 when it is the second (rsi). When that path is
//! `/proc/self/exe`, `/proc/thread-self/exe` or `/proc/PID/exe` of this
//! process, and the process runs the copy the header names ([`H_VIEW`]),
//! the argument register is pointed at the header's symlink to the
//! original's canonical path: the kernel then answers as natively, with
//! its own truncation, errors and `realpath`'s walk.
//! A prelude, signals not blocked, returns at once unless the path's
//! first bytes are `/proc/` (two system calls, [`prelude`]).
//!
//! Invariants: the program's path is read with `process_vm_readv` (a bad
//! pointer stays the program's `EFAULT`, never a fault here); a name
//! matches only with its NUL among the bytes read; `AT_EXECFN` is
//! written only when its string has exactly the native path's length.

use super::*;

const SYS_PROCESS_VM_READV: u32 = 310;
const AT_EXECFN: i32 = 31;
/// Bytes of the program's path read: the longest name caught,
/// `/proc/thread-self/exe` or `/proc/PID/exe`, with its NUL, fits.
const NAME: i32 = 32;
/// `exe_path`'s stack: the path read at 0 (and a byte after it), the two
/// iovecs at `IOV`, `/proc/PID/exe` at `OWN`, the link of
/// `/proc/self/exe` at `LINK`.
const IOV: i32 = NAME + 16;
const OWN: i32 = IOV + 32;
const LINK: i32 = OWN + 32;
const LINK_MAX: i32 = 512;
/// What every name caught starts with: the prelude's test.
const PREFIX: &str = "/proc/";
const BYTES: i32 = LINK + LINK_MAX;

/// The labels of this module's code and strings.
pub(super) struct Labels {
    pub path: CodeLabel,
    equal: CodeLabel,
    s_proc: CodeLabel,
    s_self: CodeLabel,
    s_thread_self: CodeLabel,
    s_exe: CodeLabel,
    s_execfn: CodeLabel,
    s_fd: CodeLabel,
}

impl Labels {
    pub fn new(a: &mut CodeAssembler) -> Labels {
        Labels {
            path: a.create_label(),
            equal: a.create_label(),
            s_proc: a.create_label(),
            s_self: a.create_label(),
            s_thread_self: a.create_label(),
            s_exe: a.create_label(),
            s_execfn: a.create_label(),
            s_fd: a.create_label(),
        }
    }
}

/// Where `save_all` put register `r`.
fn saved(r: AsmRegister64) -> i32 {
    FRAME as i32 - 16 - 8 * SAVED.iter().position(|s| *s == r).unwrap_or(0) as i32
}

/// In `init` (r15 the region header, rsp as `save_all` left it), before
/// `hide_env` (which may move `envp`'s NULL): while [`FLAG_CHDIR`] is
/// still set, the native path over `AT_EXECFN`'s string when that has
/// its length. Clobbers rax, rcx, rdx, rsi, rdi.
pub(super) fn native_execfn(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let mut done = a.create_label();
    let mut length = a.create_label();
    let mut copy = a.create_label();
    a.bt(dword_ptr(r15 + H_FLAGS), FLAG_CHDIR.trailing_zeros())?;
    a.jnc(done)?;
    a.mov(ecx, dword_ptr(r15 + H_EXE))?;
    a.test(ecx, ecx)?;
    a.jz(done)?;
    find_execfn(a, done)?;
    a.xor(eax, eax)?;
    a.set_label(&mut length)?;
    a.cmp(byte_ptr(rsi + rax), 0)?;
    a.je(done)?;
    a.inc(eax)?;
    a.cmp(eax, ecx)?;
    a.jb(length)?;
    a.cmp(byte_ptr(rsi + rcx), 0)?;
    a.jne(done)?;
    a.xor(eax, eax)?;
    a.set_label(&mut copy)?;
    a.movzx(edx, byte_ptr(r15 + rax + H_EXE_BYTES))?;
    a.mov(byte_ptr(rsi + rax), dl)?;
    a.inc(eax)?;
    a.cmp(eax, ecx)?;
    a.jb(copy)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// rsi = `AT_EXECFN`'s string, found past the NULL of the `envp` `init`
/// was given (rsp as `save_all` left it), or to `none`. Clobbers rax, rdi.
fn find_execfn(a: &mut CodeAssembler, none: CodeLabel) -> Result<(), IcedError> {
    let mut env = a.create_label();
    let mut aux = a.create_label();
    let mut found = a.create_label();
    a.mov(rdi, qword_ptr(rsp + SAVED_RDX))?;
    a.test(rdi, rdi)?;
    a.jz(none)?;
    // The auxiliary vector follows envp's NULL.
    a.set_label(&mut env)?;
    a.add(rdi, 8)?;
    a.cmp(qword_ptr(rdi - 8), 0)?;
    a.jne(env)?;
    a.set_label(&mut aux)?;
    a.mov(rax, qword_ptr(rdi))?;
    a.test(rax, rax)?;
    a.jz(none)?;
    a.cmp(rax, AT_EXECFN)?;
    a.je(found)?;
    a.add(rdi, 16)?;
    a.jmp(aux)?;
    a.set_label(&mut found)?;
    a.mov(rsi, qword_ptr(rdi + 8))?;
    a.test(rsi, rsi)?;
    a.jz(none)
}

/// In `init` (r15 the region header, rsp as `save_all` left it), before
/// `hide_env`: a followed exec the recorder ran by a name of the native
/// path's length from a directory of names ([`H_EXEC_CWD`] has an entry
/// for this process) reads the native path into `AT_EXECFN`'s string
/// from the link `../e` there (the recorder made it exactly that long),
/// goes back to the directory the process exec'd from (the recorder's
/// descriptor of it, `/proc/H_PID/fd/N`) and frees the entry. Clobbers
/// rax, rcx, rdx, rsi, rdi, r8-r11, r13.
pub(super) fn followed_exec(a: &mut CodeAssembler, l: &super::Labels) -> Result<(), IcedError> {
    let mut done = a.create_label();
    let mut scan = a.create_label();
    let mut found = a.create_label();
    let mut length = a.create_label();
    let mut have = a.create_label();
    let mut back = a.create_label();
    a.mov(eax, SYS_GETPID)?;
    a.syscall()?;
    a.lea(r13, ptr(r15 + H_EXEC_CWD))?;
    a.lea(r8, ptr(r13 + 8 * EXEC_CWDS as i32))?;
    a.set_label(&mut scan)?;
    a.cmp(dword_ptr(r13), eax)?;
    a.je(found)?;
    a.add(r13, 8)?;
    a.cmp(r13, r8)?;
    a.jb(scan)?;
    a.jmp(done)?;
    a.set_label(&mut found)?;
    find_execfn(a, back)?;
    a.xor(edx, edx)?;
    a.set_label(&mut length)?;
    a.cmp(byte_ptr(rsi + rdx), 0)?;
    a.je(have)?;
    a.inc(rdx)?;
    a.jmp(length)?;
    a.set_label(&mut have)?;
    a.test(rdx, rdx)?;
    a.jz(back)?;
    // readlink("../e", string, its length): no NUL is written, and a
    // link of another length is never made.
    a.lea(rdi, ptr(l.exe.s_execfn))?;
    a.mov(eax, SYS_READLINK)?;
    a.syscall()?;
    own_link(a, l, back)?;
    a.set_label(&mut back)?;
    a.sub(rsp, 64)?;
    a.mov(rdi, rsp)?;
    a.mov(esi, dword_ptr(r15 + H_PID))?;
    a.lea(rdx, ptr(l.exe.s_fd))?;
    a.call(l.proc_path)?;
    a.dec(rdi)?;
    a.mov(esi, dword_ptr(r13 + 4))?;
    a.call(l.view.put_dec)?;
    a.mov(byte_ptr(rdi), 0)?;
    a.mov(rdi, rsp)?;
    a.mov(eax, SYS_CHDIR)?;
    a.syscall()?;
    a.add(rsp, 64)?;
    // Back: the recorder may close its descriptor.
    a.mov(dword_ptr(r13), 0)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// In `followed_exec`, the process in its directory of names: this
/// image's link to its original (`../x` there, made by the recorder) as
/// an absolute path at `D_EXE_LINK`, if its directory's path fits;
/// then on to `next`. Clobbers rax, rcx, rsi, rdi, r11.
fn own_link(a: &mut CodeAssembler, l: &super::Labels, next: CodeLabel) -> Result<(), IcedError> {
    a.lea(rdi, ptr(l.d_exe_link))?;
    a.mov(esi, (DATA_SIZE - D_EXE_LINK - 8) as u32)?;
    a.mov(eax, SYS_GETCWD)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jle(next)?;
    // rax counts the NUL: "/../x" goes over it.
    a.lea(rdi, ptr(l.d_exe_link))?;
    a.lea(rdi, ptr(rdi + rax - 1))?;
    a.mov(dword_ptr(rdi), u32::from_le_bytes(*b"/../"))?;
    a.mov(word_ptr(rdi + 4), u32::from(u16::from_le_bytes(*b"x\0")))?;
    Ok(())
}

/// `exe_path()`: see the module doc. An entry point as `maps_read`;
/// nothing is done before `init` mapped the region or when the recorder
/// gave no link.
pub(super) fn emit_entry(a: &mut CodeAssembler, l: &mut super::Labels) -> Result<(), IcedError> {
    let mut done = a.create_label();
    let mut exe = a.create_label();
    let mut same = a.create_label();
    let mut second = a.create_label();
    let mut out = a.create_label();
    let mut header = a.create_label();
    let mut given = a.create_label();
    let mut quick = a.create_label();
    // As `enter_blocked`, with the prelude between the registers' save
    // and the block.
    let mut d = Depths::default();
    a.set_label(&mut l.exe.path)?;
    d.0.push((l.exe.path, Some(0)));
    save_all(a, &mut d)?;
    prelude(a, l, quick)?;
    block_signals(a)?;
    d.mark(a, None)?;
    let e = &l.exe;
    a.sub(rsp, BYTES)?;
    // process_vm_readv(pid, {rsp, NAME}, 1, {path, NAME}, 1, 0): as many
    // bytes as lie in mapped memory.
    a.mov(qword_ptr(rsp + IOV), rsp)?;
    a.mov(qword_ptr(rsp + IOV + 8), NAME)?;
    a.mov(qword_ptr(rsp + IOV + 16), r12)?;
    a.mov(qword_ptr(rsp + IOV + 24), NAME)?;
    a.mov(edi, r13d)?;
    a.lea(rsi, ptr(rsp + IOV))?;
    a.mov(edx, 1u32)?;
    a.lea(r10, ptr(rsp + IOV + 16))?;
    a.mov(r8d, 1u32)?;
    a.xor(r9d, r9d)?;
    a.mov(eax, SYS_PROCESS_VM_READV)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jle(out)?;
    // The byte after those read is no NUL: a name matches only with its own.
    a.mov(byte_ptr(rsp + rax), 0xff)?;
    a.lea(rdi, ptr(e.s_self))?;
    a.mov(rsi, rsp)?;
    a.call(e.equal)?;
    a.je(exe)?;
    a.lea(rdi, ptr(e.s_thread_self))?;
    a.mov(rsi, rsp)?;
    a.call(e.equal)?;
    a.je(exe)?;
    a.lea(rdi, ptr(rsp + OWN))?;
    a.mov(esi, r13d)?;
    a.lea(rdx, ptr(e.s_exe))?;
    a.call(l.proc_path)?;
    a.lea(rdi, ptr(rsp + OWN))?;
    a.mov(rsi, rsp)?;
    a.call(e.equal)?;
    a.jne(out)?;
    // Only while this process runs the copy the header names (an exec'd
    // program has its own).
    a.set_label(&mut exe)?;
    a.lea(rax, ptr(l.d_exe_link))?;
    a.cmp(byte_ptr(rax), 0)?;
    a.je(header)?;
    a.add(rsp, BYTES)?;
    a.jmp(given)?;
    a.set_label(&mut header)?;
    a.lea(rdi, ptr(e.s_self))?;
    a.lea(rsi, ptr(rsp + LINK))?;
    a.mov(edx, LINK_MAX as u32)?;
    a.mov(eax, SYS_READLINK)?;
    a.syscall()?;
    a.mov(ecx, dword_ptr(r15 + H_VIEW))?;
    a.cmp(rax, rcx)?;
    a.jne(out)?;
    a.lea(rsi, ptr(rsp + LINK))?;
    a.lea(rdi, ptr(r15 + H_VIEW_BYTES))?;
    a.set_label(&mut same)?;
    a.mov(al, byte_ptr(rdi))?;
    a.cmp(al, byte_ptr(rsi))?;
    a.jne(out)?;
    a.inc(rdi)?;
    a.inc(rsi)?;
    a.dec(ecx)?;
    a.jnz(same)?;
    // The link follows the native exec path and its NUL.
    a.mov(eax, dword_ptr(r15 + H_EXE))?;
    a.lea(rax, ptr(r15 + rax + (H_EXE_BYTES + 1)))?;
    a.add(rsp, BYTES)?;
    a.set_label(&mut given)?;
    a.cmp(dword_ptr(rsp + saved(r11)), 0)?;
    a.jne(second)?;
    a.mov(qword_ptr(rsp + saved(rdi)), rax)?;
    a.jmp(done)?;
    a.set_label(&mut second)?;
    a.mov(qword_ptr(rsp + saved(rsi)), rax)?;
    a.jmp(done)?;
    a.set_label(&mut out)?;
    a.add(rsp, BYTES)?;
    a.set_label(&mut done)?;
    leave_blocked(a, &mut l.windows, d, Caller::Placed)?;
    // The prelude's way out: signals never blocked.
    let mut q = Depths::default();
    a.set_label(&mut quick)?;
    q.0.push((quick, Some(FRAME)));
    restore_all(a, &mut q)?;
    l.windows.push((q, Caller::Placed));
    Ok(())
}

/// `exe_path`'s prelude, registers saved, signals not blocked (at the
/// depth of `save_all`'s frame throughout, using its two scratch words
/// and the red zone below it, which a signal frame skips): to `quick`
/// when nothing is to be done: no region, no link to give, a NULL path,
/// a path `process_vm_readv` cannot read (the program's call fails with
/// `EFAULT` itself) or one whose first bytes are not `/proc/`. Else on
/// to the full entry with r15 = the region header, r12 = the path, r13 =
/// the pid. Two system calls (`getpid`, `process_vm_readv`): the
/// caller's pointer is read only through the kernel, since `readlink`'s
/// libc passes it to the kernel unread (a bad one is the program's
/// `EFAULT`, not a fault).
fn prelude(a: &mut CodeAssembler, l: &super::Labels, quick: CodeLabel) -> Result<(), IcedError> {
    let mut mine = a.create_label();
    let mut have = a.create_label();
    let mut byte = a.create_label();
    let mut full = a.create_label();
    a.mov(r15, qword_ptr(l.d_region))?;
    a.test(r15, r15)?;
    a.jz(quick)?;
    a.cmp(byte_ptr(l.d_exe_link), 0)?;
    a.jne(mine)?;
    a.cmp(dword_ptr(r15 + H_EXE + 4), 0)?;
    a.je(quick)?;
    a.cmp(dword_ptr(r15 + H_VIEW), 0)?;
    a.je(quick)?;
    a.set_label(&mut mine)?;
    a.mov(r12, qword_ptr(rsp + saved(rdi)))?;
    a.cmp(dword_ptr(rsp + saved(r11)), 0)?;
    a.je(have)?;
    a.mov(r12, qword_ptr(rsp + saved(rsi)))?;
    a.set_label(&mut have)?;
    a.test(r12, r12)?;
    a.jz(quick)?;
    a.mov(eax, SYS_GETPID)?;
    a.syscall()?;
    a.mov(r13d, eax)?;
    // process_vm_readv(pid, {rsp, 6}, 1, {path, 6}, 1, 0), the iovecs
    // in the red zone.
    a.mov(qword_ptr(rsp - 32), rsp)?;
    a.mov(qword_ptr(rsp - 24), PREFIX.len() as i32)?;
    a.mov(qword_ptr(rsp - 16), r12)?;
    a.mov(qword_ptr(rsp - 8), PREFIX.len() as i32)?;
    a.mov(edi, r13d)?;
    a.lea(rsi, ptr(rsp - 32))?;
    a.mov(edx, 1u32)?;
    a.lea(r10, ptr(rsp - 16))?;
    a.mov(r8d, 1u32)?;
    a.xor(r9d, r9d)?;
    a.mov(eax, SYS_PROCESS_VM_READV)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jle(quick)?;
    // The bytes read must be the prefix's first (all of them: the full
    // entry decides what a shorter readable string is).
    a.lea(rsi, ptr(l.exe.s_proc))?;
    a.xor(ecx, ecx)?;
    a.set_label(&mut byte)?;
    a.cmp(rcx, rax)?;
    a.jae(full)?;
    a.mov(dl, byte_ptr(rsp + rcx))?;
    a.cmp(dl, byte_ptr(rsi + rcx))?;
    a.jne(quick)?;
    a.inc(ecx)?;
    a.cmp(ecx, PREFIX.len() as u32)?;
    a.jb(byte)?;
    a.set_label(&mut full)?;
    Ok(())
}

/// The helper and strings, outside the entry point's window.
pub(super) fn emit_helpers(a: &mut CodeAssembler, e: &mut Labels) -> Result<(), IcedError> {
    // equal(rdi, rsi): ZF set when the NUL-terminated strings are the
    // same. Clobbers al, rdi, rsi.
    let mut differ = a.create_label();
    a.set_label(&mut e.equal)?;
    a.mov(al, byte_ptr(rdi))?;
    a.cmp(al, byte_ptr(rsi))?;
    a.jne(differ)?;
    a.inc(rdi)?;
    a.inc(rsi)?;
    a.test(al, al)?;
    a.jnz(e.equal)?;
    a.set_label(&mut differ)?;
    a.ret()?;
    msg(a, &mut e.s_proc, PREFIX)?;
    msg(a, &mut e.s_self, "/proc/self/exe")?;
    msg(a, &mut e.s_thread_self, "/proc/thread-self/exe")?;
    msg(a, &mut e.s_exe, "/exe")?;
    msg(a, &mut e.s_execfn, "../e")?;
    msg(a, &mut e.s_fd, "/fd/")
}
