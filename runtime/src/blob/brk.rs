//! The native break (issue 23, a process that looks like the native one;
//! `docs/runtime.md` section 5): the kernel starts an executable's heap
//! after its highest `PT_LOAD`, in the rewritten copy one of the added
//! segments, which the rewriter puts a gap above the original image
//! (`rewrite::elfout::HEAP_GAP`, 1 GiB). `init` moves `start_brk` and `brk` down
//! by the distance between the copy's end and the original's (the
//! `native_brk` word the rewriter writes), so the heap starts where a native
//! run's does, with or without address randomisation (the kernel's random
//! offset is kept). It uses `prctl(PR_SET_MM, PR_SET_MM_MAP)`, which needs
//! no privilege (kernels with `CONFIG_CHECKPOINT_RESTORE`) but takes the
//! whole `mm` description: the other fields are the process's own, read
//! from `/proc/self/stat`, with `end_data` lowered to the new break (the
//! kernel's `brk` refuses to go below `end_data` under `CONFIG_COMPAT_BRK`).
//!
//! Invariants: nothing changes when the heap is in use already (`brk` past
//! `start_brk`), when the break is not within [`RANDOM_BRK`] above the
//! copy's end (a static PIE's randomised heap lies elsewhere), or when any
//! step fails: the program then runs with the kernel's heap.

use super::*;

const SYS_BRK: u32 = 12;
const SYS_PRCTL: u32 = 157;
const PR_SET_MM: u32 = 35;
const PR_SET_MM_MAP: u32 = 14;
/// `sizeof(struct prctl_mm_map)`.
const MM_MAP_SIZE: i32 = 104;
/// Offsets in `struct prctl_mm_map`.
const START_DATA: i32 = 16;
const END_DATA: i32 = 24;
const START_BRK: i32 = 32;
const BRK: i32 = 40;
const AUXV: i32 = 88;
const EXE_FD: i32 = 100;
/// The `/proc/self/stat` fields (1-based, `man 5 proc_pid_stat`) that
/// fill `struct prctl_mm_map`, with their offsets there.
const FIELDS: [(usize, u8); 10] = [
    (26, 0),  // startcode
    (27, 8),  // endcode
    (28, 48), // startstack
    (45, 16), // start_data
    (46, 24), // end_data
    (47, 32), // start_brk
    (48, 56), // arg_start
    (49, 64), // arg_end
    (50, 72), // env_start
    (51, 80), // env_end
];
const LAST_FIELD: usize = 51;
/// How far above the highest segment the break may lie to be moved:
/// `arch_randomize_brk` picks a page within 32 MiB, after a page of gap
/// (newer x86-64 kernels pick within more: on this 6.18 one a recorded
/// heap started 0x5d4882a0 above the image, 1 GiB gap included). A break
/// further up stays where the kernel put it, random either way, so that
/// the moved heap keeps most of the gap to grow in.
const RANDOM_BRK: i32 = (32 << 20) + 2 * 4096;
/// The stat text's buffer, after the map.
const TEXT: i32 = 128;
const TEXT_SIZE: i32 = 1024;

/// The labels of this module's code and data.
pub(super) struct Labels {
    /// `native_brk()`, called by `init` (signals blocked). Clobbers rax,
    /// rcx, rdx, rsi, rdi, rbp, r8-r14.
    pub native_brk: CodeLabel,
    s_self_stat: CodeLabel,
    /// Per stat field number, its offset in the map plus one (0: unused).
    fields: CodeLabel,
}

impl Labels {
    pub fn new(a: &mut CodeAssembler) -> Labels {
        Labels {
            native_brk: a.create_label(),
            s_self_stat: a.create_label(),
            fields: a.create_label(),
        }
    }
}

/// Emits `native_brk` and its data.
pub(super) fn emit(a: &mut CodeAssembler, l: &mut super::Labels) -> Result<(), IcedError> {
    let mut keep = a.create_label();
    let mut out = a.create_label();
    a.set_label(&mut l.brk.native_brk)?;
    a.mov(rax, qword_ptr(l.d_native_brk))?;
    a.test(rax, rax)?;
    a.jz(keep)?;
    a.sub(rsp, TEXT + TEXT_SIZE)?;
    read_stat(a, l, out)?;
    // r13: the copy's end, r14: the original's (absolute).
    a.lea(r14, ptr(l.init))?;
    a.lea(r10, ptr(l.d_added))?;
    a.mov(r13, qword_ptr(r10 + 8))?;
    a.add(r13, r14)?;
    a.add(r14, qword_ptr(l.d_native_brk))?;
    // The heap is unused and the break the kernel's.
    a.xor(edi, edi)?;
    a.mov(eax, SYS_BRK)?;
    a.syscall()?;
    a.mov(rcx, qword_ptr(rsp + START_BRK))?;
    a.cmp(rax, rcx)?;
    a.jne(out)?;
    a.sub(rcx, r13)?;
    a.jb(out)?;
    a.cmp(rcx, RANDOM_BRK)?;
    a.jae(out)?;
    a.add(rcx, r14)?;
    a.mov(qword_ptr(rsp + START_BRK), rcx)?;
    a.mov(qword_ptr(rsp + BRK), rcx)?;
    lower(a, END_DATA, rcx)?;
    a.mov(rcx, qword_ptr(rsp + END_DATA))?;
    lower(a, START_DATA, rcx)?;
    a.mov(qword_ptr(rsp + AUXV), 0)?;
    a.mov(dword_ptr(rsp + AUXV + 8), 0)?;
    a.mov(dword_ptr(rsp + EXE_FD), -1)?;
    a.mov(edi, PR_SET_MM)?;
    a.mov(esi, PR_SET_MM_MAP)?;
    a.mov(rdx, rsp)?;
    a.mov(r10d, MM_MAP_SIZE as u32)?;
    a.xor(r8d, r8d)?;
    a.mov(eax, SYS_PRCTL)?;
    a.syscall()?;
    a.set_label(&mut out)?;
    a.add(rsp, TEXT + TEXT_SIZE)?;
    a.set_label(&mut keep)?;
    a.ret()?;

    msg(a, &mut l.brk.s_self_stat, "/proc/self/stat")?;
    let mut table = [0u8; LAST_FIELD + 1];
    for (field, off) in FIELDS {
        table[field] = off + 1;
    }
    a.set_label(&mut l.brk.fields)?;
    a.db(&table)
}

/// The map at [rsp] gets the `FIELDS` of `/proc/self/stat` (text at
/// [rsp + TEXT]); to `fail` when it cannot be read whole. Clobbers rax,
/// rcx, rdx, rsi, rdi, rbp, r8, r9, r11, r12.
fn read_stat(a: &mut CodeAssembler, l: &super::Labels, fail: CodeLabel) -> Result<(), IcedError> {
    let mut scan = a.create_label();
    let mut field = a.create_label();
    let mut digit = a.create_label();
    let mut other = a.create_label();
    let mut ended = a.create_label();
    let mut skip = a.create_label();
    let mut done = a.create_label();
    a.lea(rdi, ptr(l.brk.s_self_stat))?;
    a.mov(esi, O_RDONLY_CLOEXEC)?;
    a.xor(edx, edx)?;
    a.mov(eax, SYS_OPEN)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.js(fail)?;
    a.mov(r12, rax)?;
    a.mov(rdi, rax)?;
    a.lea(rsi, ptr(rsp + TEXT))?;
    a.mov(edx, (TEXT_SIZE - 1) as u32)?;
    a.mov(eax, SYS_READ)?;
    a.syscall()?;
    a.mov(rbp, rax)?;
    a.mov(rdi, r12)?;
    a.mov(eax, SYS_CLOSE)?;
    a.syscall()?;
    a.test(rbp, rbp)?;
    a.jle(fail)?;
    a.mov(byte_ptr(rsp + rbp + TEXT), 0)?;
    // After the last ')' (a command name may hold one) and its space:
    // field 3.
    a.lea(rsi, ptr(rsp + rbp + TEXT))?;
    a.lea(rdx, ptr(rsp + TEXT))?;
    a.set_label(&mut scan)?;
    a.dec(rsi)?;
    a.cmp(rsi, rdx)?;
    a.jb(fail)?;
    a.cmp(byte_ptr(rsi), b')' as i32)?;
    a.jne(scan)?;
    a.add(rsi, 2)?;
    a.mov(r8d, 3u32)?;
    a.lea(r9, ptr(l.brk.fields))?;
    // Each field: its decimal digits into rax (a sign or anything else
    // skipped: the fields wanted are addresses), stored where the table
    // says.
    a.set_label(&mut field)?;
    a.xor(eax, eax)?;
    a.set_label(&mut digit)?;
    a.movzx(ecx, byte_ptr(rsi))?;
    a.cmp(ecx, b' ' as i32)?;
    a.je(ended)?;
    a.test(ecx, ecx)?;
    a.jz(ended)?;
    a.inc(rsi)?;
    a.sub(ecx, b'0' as i32)?;
    a.cmp(ecx, 9)?;
    a.ja(other)?;
    a.imul_3(rax, rax, 10)?;
    a.add(rax, rcx)?;
    a.set_label(&mut other)?;
    a.jmp(digit)?;
    a.set_label(&mut ended)?;
    a.movzx(edx, byte_ptr(r9 + r8))?;
    a.test(edx, edx)?;
    a.jz(skip)?;
    a.mov(qword_ptr(rsp + rdx - 1), rax)?;
    a.set_label(&mut skip)?;
    a.cmp(r8d, LAST_FIELD as u32)?;
    a.jae(done)?;
    a.cmp(byte_ptr(rsi), 0)?;
    a.je(fail)?;
    a.inc(rsi)?;
    a.inc(r8d)?;
    a.jmp(field)?;
    a.set_label(&mut done)
}

/// The map's field at `at` becomes `limit` when above it (`cmova`).
fn lower(a: &mut CodeAssembler, at: i32, limit: AsmRegister64) -> Result<(), IcedError> {
    a.mov(rax, qword_ptr(rsp + at))?;
    a.cmp(rax, limit)?;
    a.cmova(rax, limit)?;
    a.mov(qword_ptr(rsp + at), rax)
}
