//! The program's view of its own maps (`docs/runtime.md` section 5, "The
//! program's view of its maps"; issue 23, a process that looks like the
//! native one): `maps_opened_fd` and `maps_opened_file` at the return
//! point of a call that opens a file by name (`open`, `openat`, `fopen`,
//! ...: `analysis::imports::opens_by_name`), `maps_read` before a call to
//! `read`.
//!
//! When the descriptor a call returned is the process's own
//! `/proc/PID/maps` (`/proc/self/maps`, `/proc/thread-self/maps`,
//! `/proc/PID/task/TID/maps`), opened read-only, the runtime puts in its
//! place, at the same number and with the same close-on-exec flag, a
//! read-only descriptor of a memfd named [`VIEW_MEMFD_NAME`] holding the
//! maps as a native run would show them: without the witness region and
//! the rewritten module's added segments (the runtime, the copies, their
//! data), and with the executable's lines naming the original file, its
//! device and inode (the region header's [`H_VIEW`], from the recorder).
//! The kernel makes the text when it is read from offset 0; so is the
//! view made again when a `read` of such a descriptor starts at offset 0,
//! so a program that allocates its buffer between `open` and `read`, or
//! maps one, seeks back and reads again (gnulib's `rof_open`), sees that
//! buffer as natively. Once this process installed a view, every `read`
//! pays for one more entry (two `rt_sigprocmask` and a `readlink`);
//! before, a flag-free test of the blob's `D_VIEWS` and a `ret`.
//!
//! Invariants: the program's descriptor table is the native one when the
//! call returns (the temporary descriptors are closed); a line is dropped
//! only when its start address lies in the region or in the executable's
//! or the calling module's added range; every other line is the kernel's,
//! byte for byte, except the executable's names.

use super::*;

const SYS_DUP3: u32 = 292;
const SYS_MEMFD_CREATE: u32 = 319;
const F_GETFD: u32 = 1;
const F_GETFL: u32 = 3;
const O_ACCMODE: u32 = 3;
const O_NONBLOCK: u32 = 0o4000;
/// `O_CLOEXEC` is `FD_CLOEXEC` shifted by this.
const CLOEXEC_SHIFT: u32 = 19;
const O_WRONLY_TRUNC_CLOEXEC: u32 = 1 | 0o1000 | 0o2000000;
const SYS_LSEEK: u32 = 8;
const SEEK_CUR: u32 = 1;
const MFD_CLOEXEC: u32 = 1;
/// glibc's `FILE::_fileno` (the public `struct _IO_FILE`).
const FILE_FILENO: i32 = 0x70;
/// The width the kernel pads a maps line to before its path, which then
/// follows one more space (`show_vma_header_prefix`, `seq_pad`).
const PATH_COLUMN: i32 = 72;
/// Bytes of maps text read at a time: whole lines (a longer one, which
/// no path makes, is passed on as it is).
const CHUNK: i32 = 8192;
/// The rebuilt tail of an executable's line: `dev inode`, padding, path.
const TAIL: i32 = 512;
/// Path buffers of `install` and `refresh`: the descriptor's
/// `/proc/self/fd/N` at 0, its link at [`LINK`], `/proc/PID/` at [`OWN`].
const LINK: i32 = 64;
const OWN: i32 = LINK + BUF;
const PATHS: i32 = OWN + 64;

/// The labels of this module's code and strings.
pub(super) struct Labels {
    pub opened_fd: CodeLabel,
    pub opened_file: CodeLabel,
    pub read: CodeLabel,
    read_full: CodeLabel,
    pub put_dec: CodeLabel,
    put_hex: CodeLabel,
    install: CodeLabel,
    refresh: CodeLabel,
    fd_path: CodeLabel,
    write_view: CodeLabel,
    line: CodeLabel,
    write_out: CodeLabel,
    pub s_slash: CodeLabel,
    s_maps: CodeLabel,
    s_task: CodeLabel,
    s_slash_maps: CodeLabel,
    s_self_maps: CodeLabel,
    s_memfd_name: CodeLabel,
    s_memfd_link: CodeLabel,
}

impl Labels {
    pub fn new(a: &mut CodeAssembler) -> Labels {
        Labels {
            opened_fd: a.create_label(),
            opened_file: a.create_label(),
            read: a.create_label(),
            read_full: a.create_label(),
            put_dec: a.create_label(),
            put_hex: a.create_label(),
            install: a.create_label(),
            refresh: a.create_label(),
            fd_path: a.create_label(),
            write_view: a.create_label(),
            line: a.create_label(),
            write_out: a.create_label(),
            s_slash: a.create_label(),
            s_maps: a.create_label(),
            s_task: a.create_label(),
            s_slash_maps: a.create_label(),
            s_self_maps: a.create_label(),
            s_memfd_name: a.create_label(),
            s_memfd_link: a.create_label(),
        }
    }
}

/// Where `save_all` put rax.
const SAVED_RAX: i32 = FRAME as i32 - 16;

/// The three entry points, each an entry point as `dispositions_ours`:
/// signals blocked from one `syscall` to the other, reported at the
/// caller outside that. Nothing is done before `init` mapped the region.
/// `maps_read` first tests, without touching the flags, whether this
/// process installed a view through this blob (`D_VIEWS`): if not, it
/// returns at once.
pub(super) fn emit_entries(a: &mut CodeAssembler, l: &mut super::Labels) -> Result<(), IcedError> {
    emit_read_prelude(a, l)?;
    for which in 0..3 {
        let mut done = a.create_label();
        let label = match which {
            0 => &mut l.view.opened_fd,
            1 => &mut l.view.opened_file,
            _ => &mut l.view.read_full,
        };
        let d = enter_blocked(a, label)?;
        a.cmp(qword_ptr(l.d_region), 0)?;
        a.je(done)?;
        match which {
            0 => {
                // open(...) -> fd, or -1.
                a.mov(edi, dword_ptr(rsp + SAVED_RAX))?;
                a.test(edi, edi)?;
                a.js(done)?;
                a.call(l.view.install)?;
            }
            1 => {
                // fopen(...) -> FILE *, or NULL.
                a.mov(rax, qword_ptr(rsp + SAVED_RAX))?;
                a.test(rax, rax)?;
                a.jz(done)?;
                a.mov(edi, dword_ptr(rax + FILE_FILENO))?;
                a.test(edi, edi)?;
                a.js(done)?;
                a.call(l.view.install)?;
            }
            _ => {
                // read(fd, ...).
                a.mov(edi, dword_ptr(rsp + SAVED_RDI))?;
                a.call(l.view.refresh)?;
            }
        }
        a.set_label(&mut done)?;
        leave_blocked(a, &mut l.windows, d, Caller::Placed)?;
    }
    Ok(())
}

/// `maps_read`'s first instructions: `jrcxz` tests `D_VIEWS` without
/// the flags; at 0 it returns, else it goes on to the full entry.
fn emit_read_prelude(a: &mut CodeAssembler, l: &mut super::Labels) -> Result<(), IcedError> {
    let mut quick = a.create_label();
    let mut d = Depths::default();
    a.set_label(&mut l.view.read)?;
    d.0.push((l.view.read, Some(0)));
    a.push(rcx)?;
    d.mark(a, Some(8))?;
    a.mov(ecx, dword_ptr(l.d_views))?;
    a.jrcxz(quick)?;
    a.pop(rcx)?;
    d.mark(a, Some(0))?;
    a.jmp(l.view.read_full)?;
    a.set_label(&mut quick)?;
    d.0.push((quick, Some(8)));
    a.pop(rcx)?;
    d.mark(a, Some(0))?;
    a.ret()?;
    d.mark(a, None)?;
    a.zero_bytes()?;
    l.windows.push((d, Caller::Placed));
    Ok(())
}

/// The helpers and strings, outside the entry points' windows.
pub(super) fn emit_helpers(a: &mut CodeAssembler, l: &mut super::Labels) -> Result<(), IcedError> {
    emit_install(a, l)?;
    emit_refresh(a, l)?;
    emit_fd_path(a, &mut l.view)?;
    emit_write_view(a, &mut l.view)?;
    emit_line(a, l)?;
    let v = &mut l.view;
    // write_out(rsi = bytes, rdx = length) to the view (r12d) -> rax, or
    // -1 when not all were written. Clobbers rcx, rdi, r11.
    let mut short = a.create_label();
    a.set_label(&mut v.write_out)?;
    a.mov(edi, r12d)?;
    a.mov(eax, SYS_WRITE)?;
    a.syscall()?;
    a.cmp(rax, rdx)?;
    a.jne(short)?;
    a.ret()?;
    a.set_label(&mut short)?;
    a.mov(rax, -1i64)?;
    a.ret()?;
    // put_dec(rdi = buffer, esi = value): its decimal digits, rdi past
    // them. Clobbers rax, rdx, r8, r9.
    let mut count = a.create_label();
    let mut digit = a.create_label();
    a.set_label(&mut v.put_dec)?;
    a.mov(r9d, 10u32)?;
    a.mov(eax, esi)?;
    a.set_label(&mut count)?;
    a.xor(edx, edx)?;
    a.div(r9d)?;
    a.inc(rdi)?;
    a.test(eax, eax)?;
    a.jnz(count)?;
    a.mov(r8, rdi)?;
    a.mov(eax, esi)?;
    a.set_label(&mut digit)?;
    a.xor(edx, edx)?;
    a.div(r9d)?;
    a.add(dl, b'0' as i32)?;
    a.dec(r8)?;
    a.mov(byte_ptr(r8), dl)?;
    a.test(eax, eax)?;
    a.jnz(digit)?;
    a.ret()?;
    // put_hex(rdi = buffer, rax = value): lowercase hex digits, at least
    // 8 (as the kernel prints addresses), rdi past them. Clobbers rax,
    // rcx, r9.
    let mut wide = a.create_label();
    let mut counted = a.create_label();
    let mut hex_digit = a.create_label();
    let mut store = a.create_label();
    a.set_label(&mut v.put_hex)?;
    a.mov(ecx, 8u32)?;
    a.mov(r9, rax)?;
    a.shr(r9, 32)?;
    a.set_label(&mut wide)?;
    a.test(r9, r9)?;
    a.jz(counted)?;
    a.inc(ecx)?;
    a.shr(r9, 4)?;
    a.jmp(wide)?;
    a.set_label(&mut counted)?;
    a.add(rdi, rcx)?;
    a.mov(r9, rdi)?;
    a.set_label(&mut hex_digit)?;
    a.dec(r9)?;
    a.push(rax)?;
    a.and(eax, 15)?;
    a.add(eax, b'0' as i32)?;
    a.cmp(eax, b'9' as i32)?;
    a.jbe(store)?;
    a.add(eax, (b'a' - b'9' - 1) as i32)?;
    a.set_label(&mut store)?;
    a.mov(byte_ptr(r9), al)?;
    a.pop(rax)?;
    a.shr(rax, 4)?;
    a.dec(ecx)?;
    a.jnz(hex_digit)?;
    a.ret()?;
    msg(a, &mut v.s_slash, "/")?;
    msg(a, &mut v.s_maps, "maps")?;
    msg(a, &mut v.s_task, "task/")?;
    msg(a, &mut v.s_slash_maps, "/maps")?;
    msg(a, &mut v.s_self_maps, "/proc/self/maps")?;
    msg(a, &mut v.s_memfd_name, VIEW_MEMFD_NAME)?;
    msg(
        a,
        &mut v.s_memfd_link,
        &format!("/memfd:{VIEW_MEMFD_NAME} (deleted)"),
    )
}

/// `fd_path(rdi = buffer, esi = fd)`: `/proc/self/fd/FD`, NUL-terminated.
/// Clobbers rax, rdx, rdi, r8, r9.
fn emit_fd_path(a: &mut CodeAssembler, v: &mut Labels) -> Result<(), IcedError> {
    a.set_label(&mut v.fd_path)?;
    a.mov(rax, u64::from_le_bytes(*b"/proc/se"))?;
    a.mov(qword_ptr(rdi), rax)?;
    a.mov(rax, u64::from_le_bytes(*b"lf/fd/\0\0"))?;
    a.mov(qword_ptr(rdi + 8), rax)?;
    a.add(rdi, 14)?;
    a.call(v.put_dec)?;
    a.mov(byte_ptr(rdi), 0)?;
    a.ret()
}

/// Inline: `/proc/self/fd/FD` (fd in r12d) at rsp and its link at rsp +
/// [`LINK`], NUL-terminated; on to `none` when it cannot be read.
fn link_of(a: &mut CodeAssembler, v: &Labels, none: CodeLabel) -> Result<(), IcedError> {
    a.mov(rdi, rsp)?;
    a.mov(esi, r12d)?;
    a.call(v.fd_path)?;
    a.mov(rdi, rsp)?;
    a.lea(rsi, ptr(rsp + LINK))?;
    a.mov(edx, (BUF - 1) as u32)?;
    a.mov(eax, SYS_READLINK)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jle(none)?;
    a.mov(byte_ptr(rsp + rax + LINK), 0)
}

/// `install(edi = fd)`: when fd is this process's maps, opened
/// read-only, replaces it by the view (module doc). Clobbers every
/// register but rsp.
fn emit_install(a: &mut CodeAssembler, l: &mut super::Labels) -> Result<(), IcedError> {
    let mut out = a.create_label();
    let mut whole = a.create_label();
    let mut digits = a.create_label();
    let mut close_memfd = a.create_label();
    a.set_label(&mut l.view.install)?;
    let v = &l.view;
    a.sub(rsp, PATHS)?;
    a.mov(r12d, edi)?;
    link_of(a, v, out)?;
    // "/proc/PID/" then "maps" or "task/TID/maps".
    a.mov(eax, SYS_GETPID)?;
    a.syscall()?;
    a.lea(rdi, ptr(rsp + OWN))?;
    a.mov(esi, eax)?;
    a.lea(rdx, ptr(v.s_slash))?;
    a.call(l.proc_path)?;
    a.lea(rdi, ptr(rsp + OWN))?;
    a.lea(rsi, ptr(rsp + LINK))?;
    a.call(l.prefix)?;
    a.test(rax, rax)?;
    a.jz(out)?;
    a.mov(rbx, rax)?;
    a.lea(rdi, ptr(v.s_maps))?;
    a.mov(rsi, rbx)?;
    a.call(l.prefix)?;
    a.test(rax, rax)?;
    a.jnz(whole)?;
    a.lea(rdi, ptr(v.s_task))?;
    a.mov(rsi, rbx)?;
    a.call(l.prefix)?;
    a.test(rax, rax)?;
    a.jz(out)?;
    a.mov(rsi, rax)?;
    a.movzx(ecx, byte_ptr(rsi))?;
    a.sub(ecx, b'0' as i32)?;
    a.cmp(ecx, 9)?;
    a.ja(out)?;
    a.set_label(&mut digits)?;
    a.inc(rsi)?;
    a.movzx(ecx, byte_ptr(rsi))?;
    a.sub(ecx, b'0' as i32)?;
    a.cmp(ecx, 9)?;
    a.jbe(digits)?;
    a.lea(rdi, ptr(v.s_slash_maps))?;
    a.call(l.prefix)?;
    a.test(rax, rax)?;
    a.jz(out)?;
    a.set_label(&mut whole)?;
    a.cmp(byte_ptr(rax), 0)?;
    a.jne(out)?;
    // Read-only only (writing maps fails natively, as it will then).
    a.mov(edi, r12d)?;
    a.mov(esi, F_GETFL)?;
    a.mov(eax, SYS_FCNTL)?;
    a.syscall()?;
    a.test(eax, eax)?;
    a.js(out)?;
    a.test(eax, O_ACCMODE)?;
    a.jnz(out)?;
    a.and(eax, O_NONBLOCK)?;
    a.mov(r13d, eax)?;
    a.mov(edi, r12d)?;
    a.mov(esi, F_GETFD)?;
    a.mov(eax, SYS_FCNTL)?;
    a.syscall()?;
    a.test(eax, eax)?;
    a.js(out)?;
    a.and(eax, 1)?; // FD_CLOEXEC
    a.shl(eax, CLOEXEC_SHIFT)?;
    a.mov(r14d, eax)?;
    a.lea(rdi, ptr(v.s_memfd_name))?;
    a.mov(esi, MFD_CLOEXEC)?;
    a.mov(eax, SYS_MEMFD_CREATE)?;
    a.syscall()?;
    a.test(eax, eax)?;
    a.js(out)?;
    a.mov(r15d, eax)?;
    a.mov(edi, eax)?;
    a.call(v.write_view)?;
    a.test(rax, rax)?;
    a.jnz(close_memfd)?;
    // A read-only description of it at the program's number.
    a.mov(rdi, rsp)?;
    a.mov(esi, r15d)?;
    a.call(v.fd_path)?;
    a.mov(rdi, rsp)?;
    a.mov(esi, r13d)?;
    a.or(esi, O_RDONLY_CLOEXEC)?;
    a.xor(edx, edx)?;
    a.mov(eax, SYS_OPEN)?;
    a.syscall()?;
    a.test(eax, eax)?;
    a.js(close_memfd)?;
    a.mov(ebx, eax)?;
    a.mov(edi, ebx)?;
    a.mov(esi, r12d)?;
    a.mov(edx, r14d)?;
    a.mov(eax, SYS_DUP3)?;
    a.syscall()?;
    a.mov(dword_ptr(l.d_views), 1)?;
    a.mov(rax, qword_ptr(S_RUNTIME).gs())?;
    a.lea(rcx, ptr(l.d_views))?;
    a.lea(rdx, ptr(l.init))?;
    a.sub(rcx, rdx)?;
    a.mov(dword_ptr(rax + rcx), 1)?;
    a.mov(edi, ebx)?;
    a.mov(eax, SYS_CLOSE)?;
    a.syscall()?;
    a.set_label(&mut close_memfd)?;
    a.mov(edi, r15d)?;
    a.mov(eax, SYS_CLOSE)?;
    a.syscall()?;
    a.set_label(&mut out)?;
    a.add(rsp, PATHS)?;
    a.ret()
}

/// `refresh(edi = fd)`: when fd is a view at offset 0, makes it again
/// from the kernel's maps. Clobbers every register but rsp.
fn emit_refresh(a: &mut CodeAssembler, l: &mut super::Labels) -> Result<(), IcedError> {
    let mut out = a.create_label();
    a.set_label(&mut l.view.refresh)?;
    let v = &l.view;
    a.sub(rsp, PATHS)?;
    a.mov(r12d, edi)?;
    a.test(edi, edi)?;
    a.js(out)?;
    link_of(a, v, out)?;
    a.lea(rdi, ptr(v.s_memfd_link))?;
    a.lea(rsi, ptr(rsp + LINK))?;
    a.call(l.prefix)?;
    a.test(rax, rax)?;
    a.jz(out)?;
    a.cmp(byte_ptr(rax), 0)?;
    a.jne(out)?;
    a.mov(edi, r12d)?;
    a.xor(esi, esi)?;
    a.mov(edx, SEEK_CUR)?;
    a.mov(eax, SYS_LSEEK)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jnz(out)?;
    a.mov(rdi, rsp)?;
    a.mov(esi, O_WRONLY_TRUNC_CLOEXEC)?;
    a.xor(edx, edx)?;
    a.mov(eax, SYS_OPEN)?;
    a.syscall()?;
    a.test(eax, eax)?;
    a.js(out)?;
    a.mov(ebx, eax)?;
    a.mov(edi, eax)?;
    a.call(v.write_view)?;
    a.mov(edi, ebx)?;
    a.mov(eax, SYS_CLOSE)?;
    a.syscall()?;
    a.set_label(&mut out)?;
    a.add(rsp, PATHS)?;
    a.ret()
}

/// `write_view(edi = fd)` -> rax = 0, or -1 when the maps could not be
/// read or the view written: reads `/proc/self/maps` in chunks of whole
/// lines and writes each line through `line`. Clobbers rax, rcx, rdx,
/// rsi, rdi, r8-r11.
fn emit_write_view(a: &mut CodeAssembler, v: &mut Labels) -> Result<(), IcedError> {
    let saved = [rbx, rbp, r12, r13, r14, r15];
    let mut read_more = a.create_label();
    let mut next_line = a.create_label();
    let mut partial = a.create_label();
    let mut keep_front = a.create_label();
    let mut eof = a.create_label();
    let mut closed = a.create_label();
    let mut fail_close = a.create_label();
    let mut fail = a.create_label();
    let mut ret = a.create_label();
    a.set_label(&mut v.write_view)?;
    for r in saved {
        a.push(r)?;
    }
    a.sub(rsp, CHUNK + TAIL)?;
    a.mov(r12d, edi)?;
    a.lea(r15, ptr(rsp + CHUNK))?;
    a.lea(rdi, ptr(v.s_self_maps))?;
    a.mov(esi, O_RDONLY_CLOEXEC)?;
    a.xor(edx, edx)?;
    a.mov(eax, SYS_OPEN)?;
    a.syscall()?;
    a.test(eax, eax)?;
    a.js(fail)?;
    a.mov(r13d, eax)?;
    // r14: bytes held at rsp (a line's start, not yet complete).
    a.xor(r14d, r14d)?;
    a.set_label(&mut read_more)?;
    a.mov(edi, r13d)?;
    a.lea(rsi, ptr(rsp + r14))?;
    a.mov(edx, CHUNK as u32)?;
    a.sub(rdx, r14)?;
    a.mov(eax, SYS_READ)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.js(fail_close)?;
    a.jz(eof)?;
    a.add(r14, rax)?;
    // rbx: the next line's start.
    a.mov(rbx, rsp)?;
    a.set_label(&mut next_line)?;
    a.lea(rcx, ptr(rsp + r14))?;
    a.sub(rcx, rbx)?;
    a.jz(partial)?;
    a.mov(rdi, rbx)?;
    a.mov(al, b'\n' as u32)?;
    a.repne().scasb()?;
    a.jne(partial)?;
    a.mov(rbp, rdi)?;
    a.call(v.line)?;
    a.test(rax, rax)?;
    a.js(fail_close)?;
    a.mov(rbx, rbp)?;
    a.jmp(next_line)?;
    // The rest to the front; a full chunk without a line end as it is.
    a.set_label(&mut partial)?;
    a.lea(rcx, ptr(rsp + r14))?;
    a.sub(rcx, rbx)?;
    a.cmp(rcx, CHUNK)?;
    a.jb(keep_front)?;
    a.mov(rsi, rsp)?;
    a.mov(rdx, rcx)?;
    a.call(v.write_out)?;
    a.test(rax, rax)?;
    a.js(fail_close)?;
    a.xor(ecx, ecx)?;
    a.set_label(&mut keep_front)?;
    a.mov(rsi, rbx)?;
    a.mov(rdi, rsp)?;
    a.mov(r14, rcx)?;
    a.rep().movsb()?;
    a.jmp(read_more)?;
    // A last line without its end, as it is.
    a.set_label(&mut eof)?;
    a.mov(rsi, rsp)?;
    a.mov(rdx, r14)?;
    a.test(rdx, rdx)?;
    a.jz(closed)?;
    a.call(v.write_out)?;
    a.test(rax, rax)?;
    a.js(fail_close)?;
    a.set_label(&mut closed)?;
    a.mov(edi, r13d)?;
    a.mov(eax, SYS_CLOSE)?;
    a.syscall()?;
    a.xor(eax, eax)?;
    a.jmp(ret)?;
    a.set_label(&mut fail_close)?;
    a.mov(edi, r13d)?;
    a.mov(eax, SYS_CLOSE)?;
    a.syscall()?;
    a.set_label(&mut fail)?;
    a.mov(rax, -1i64)?;
    a.set_label(&mut ret)?;
    a.add(rsp, CHUNK + TAIL)?;
    for r in saved.into_iter().rev() {
        a.pop(r)?;
    }
    a.ret()
}

/// `[lo, hi)` of the added range of the blob at r9 (its start) into r8
/// and r11: the offsets the rewriter wrote (`added_start`, `added_end`)
/// plus the blob's address. Clobbers r10.
fn added_range(a: &mut CodeAssembler, l: &super::Labels) -> Result<(), IcedError> {
    a.lea(r10, ptr(l.d_added))?;
    a.lea(r8, ptr(l.init))?;
    a.sub(r10, r8)?;
    a.add(r10, r9)?;
    a.mov(r8, qword_ptr(r10))?;
    a.add(r8, r9)?;
    a.mov(r11, qword_ptr(r10 + 8))?;
    a.add(r11, r9)
}

/// `line()`: the line from rbx to rbp (past its '\n'), r12d the view,
/// r15 the tail buffer: drops the line of a mapping of ours, rewrites the
/// names of an executable's line, writes the rest as they are (the heap's
/// too: `init` put it where a native run's is, `brk`). -> rax < 0
/// when a write failed. Clobbers rax, rcx, rdx, rsi, rdi, r8-r11.
fn emit_line(a: &mut CodeAssembler, l: &mut super::Labels) -> Result<(), IcedError> {
    let mut hex = a.create_label();
    let mut digit = a.create_label();
    let mut parsed = a.create_label();
    let mut own = a.create_label();
    let mut fields = a.create_label();
    let mut field_end = a.create_label();
    let mut next = a.create_label();
    let mut skip = a.create_label();
    let mut named = a.create_label();
    let mut pad = a.create_label();
    let mut padded = a.create_label();
    let mut keep = a.create_label();
    let mut drop = a.create_label();
    let mut failed = a.create_label();
    let mut end_hex = a.create_label();
    let mut end_digit = a.create_label();
    let mut ranged = a.create_label();
    a.set_label(&mut l.view.line)?;
    // rax: the mapping's start (hex up to '-').
    a.xor(eax, eax)?;
    a.mov(rdi, rbx)?;
    a.set_label(&mut hex)?;
    a.cmp(rdi, rbp)?;
    a.jae(keep)?;
    a.movzx(ecx, byte_ptr(rdi))?;
    a.cmp(ecx, b'-' as i32)?;
    a.je(parsed)?;
    a.sub(ecx, b'0' as i32)?;
    a.cmp(ecx, 9)?;
    a.jbe(digit)?;
    a.sub(ecx, (b'a' - b'0' - 10) as i32)?;
    a.set_label(&mut digit)?;
    a.shl(rax, 4)?;
    a.or(rax, rcx)?;
    a.inc(rdi)?;
    a.jmp(hex)?;
    // rdx: its end (hex from after the '-' up to ' ').
    a.set_label(&mut parsed)?;
    a.xor(edx, edx)?;
    a.set_label(&mut end_hex)?;
    a.inc(rdi)?;
    a.cmp(rdi, rbp)?;
    a.jae(keep)?;
    a.movzx(ecx, byte_ptr(rdi))?;
    a.cmp(ecx, b' ' as i32)?;
    a.je(ranged)?;
    a.sub(ecx, b'0' as i32)?;
    a.cmp(ecx, 9)?;
    a.jbe(end_digit)?;
    a.sub(ecx, (b'a' - b'0' - 10) as i32)?;
    a.set_label(&mut end_digit)?;
    a.shl(rdx, 4)?;
    a.or(rdx, rcx)?;
    a.jmp(end_hex)?;
    a.set_label(&mut ranged)?;
    // The region.
    a.mov(rcx, qword_ptr(l.d_region))?;
    a.mov(r8, rax)?;
    a.sub(r8, rcx)?;
    a.cmp(r8, qword_ptr(rcx + H_REGION_SIZE))?;
    a.jb(drop)?;
    // The executable's added range, then this module's.
    a.mov(r9, qword_ptr(S_RUNTIME).gs())?;
    added_range(a, l)?;
    a.cmp(rax, r8)?;
    a.jb(own)?;
    a.cmp(rax, r11)?;
    a.jb(drop)?;
    a.set_label(&mut own)?;
    a.lea(r9, ptr(l.init))?;
    added_range(a, l)?;
    a.cmp(rax, r8)?;
    a.jb(fields)?;
    a.cmp(rax, r11)?;
    a.jb(drop)?;
    // r8: past the third space (the offset's), where `dev inode` start;
    // rdi: past the fifth (the inode's).
    a.set_label(&mut fields)?;
    a.mov(rdi, rbx)?;
    a.xor(ecx, ecx)?;
    a.set_label(&mut field_end)?;
    a.cmp(rdi, rbp)?;
    a.jae(keep)?;
    a.cmp(byte_ptr(rdi), b' ' as i32)?;
    a.jne(next)?;
    a.inc(ecx)?;
    a.cmp(ecx, 3)?;
    a.jne(next)?;
    a.lea(r8, ptr(rdi + 1))?;
    a.set_label(&mut next)?;
    a.inc(rdi)?;
    a.cmp(ecx, 5)?;
    a.jb(field_end)?;
    // The path, after the padding, up to the '\n'.
    a.set_label(&mut skip)?;
    a.cmp(rdi, rbp)?;
    a.jae(keep)?;
    a.cmp(byte_ptr(rdi), b' ' as i32)?;
    a.jne(named)?;
    a.inc(rdi)?;
    a.jmp(skip)?;
    // The copy's path? (r10: the region header.)
    a.set_label(&mut named)?;
    a.mov(r10, qword_ptr(l.d_region))?;
    a.mov(ecx, dword_ptr(r10 + H_VIEW))?;
    a.test(ecx, ecx)?;
    a.jz(keep)?;
    a.lea(r9, ptr(rbp - 1))?;
    a.sub(r9, rdi)?;
    a.cmp(r9, rcx)?;
    a.jne(keep)?;
    a.lea(rsi, ptr(r10 + H_VIEW_BYTES))?;
    a.repe().cmpsb()?;
    a.jne(keep)?;
    // The line up to `dev` as it is, then the native tail built at r15.
    a.mov(rsi, rbx)?;
    a.mov(rdx, r8)?;
    a.sub(rdx, rbx)?;
    a.push(rdx)?;
    a.call(l.view.write_out)?;
    a.pop(rdx)?;
    a.test(rax, rax)?;
    a.js(failed)?;
    a.mov(rdi, r15)?;
    a.mov(ecx, dword_ptr(r10 + H_VIEW))?;
    a.lea(rsi, ptr(r10 + rcx + H_VIEW_BYTES))?;
    a.mov(ecx, dword_ptr(r10 + H_VIEW + 4))?;
    a.rep().movsb()?;
    a.mov(byte_ptr(rdi), b' ' as u32)?;
    a.inc(rdi)?;
    // Spaces up to the column (rdx: the line's bytes before the tail),
    // then one more.
    a.set_label(&mut pad)?;
    a.lea(rax, ptr(rdi + rdx))?;
    a.sub(rax, r15)?;
    a.cmp(rax, PATH_COLUMN)?;
    a.jae(padded)?;
    a.mov(byte_ptr(rdi), b' ' as u32)?;
    a.inc(rdi)?;
    a.jmp(pad)?;
    a.set_label(&mut padded)?;
    a.mov(byte_ptr(rdi), b' ' as u32)?;
    a.inc(rdi)?;
    // rsi is at the original's path, after `dev inode`.
    a.mov(ecx, dword_ptr(r10 + H_VIEW + 8))?;
    a.rep().movsb()?;
    a.mov(byte_ptr(rdi), b'\n' as u32)?;
    a.inc(rdi)?;
    a.mov(rsi, r15)?;
    a.mov(rdx, rdi)?;
    a.sub(rdx, r15)?;
    a.jmp(l.view.write_out)?;
    a.set_label(&mut keep)?;
    a.mov(rsi, rbx)?;
    a.mov(rdx, rbp)?;
    a.sub(rdx, rbx)?;
    a.jmp(l.view.write_out)?;
    a.set_label(&mut drop)?;
    a.xor(eax, eax)?;
    a.set_label(&mut failed)?;
    a.ret()
}
