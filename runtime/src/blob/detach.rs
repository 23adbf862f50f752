//! Detached additions (issue 23, a `--libs` library where it is natively;
//! `docs/runtime.md` section 5, `init`): a library loaded at start-up is
//! rewritten with its added segments (this runtime, the copies, their
//! tables) in no `PT_LOAD`, so that `ld.so` reserves and places exactly
//! the original's span, and every later mapping lands where it does
//! natively. The additions lie at a fixed distance above the library
//! (`rewrite::elfout::DETACH_GAP`), in the room between `mmap_base` and
//! the stack that no unhinted `mmap` takes, and the executable's `init`
//! (after relocation, before any library constructor) maps them from the
//! library's file: it walks the link map (`DT_DEBUG`'s `r_debug`) and,
//! for each object whose `.dynamic` holds [`DT_ADDITIONS`], reads the
//! descriptor at that file offset and maps each segment it lists at
//! `l_addr + vaddr` (`MAP_FIXED_NOREPLACE`).
//!
//! The descriptor ([`MAGIC`], then the number of segments, at most
//! [`MAX_SEGMENTS`], then per segment four words: link-time vaddr, length,
//! file offset, all page-aligned, and the `PROT_*` bits) is written by the
//! rewriter where an attached copy has its program header table.
//!
//! Invariants: only objects with the tag are touched; every segment is
//! mapped where the rewriter linked it or the program stops with a
//! message (exit 125) before any of the library's code runs: its
//! springboards lead into the additions.

use super::*;

/// The `.dynamic` tag naming the descriptor's file offset (in the
/// OS-specific range, which `ld.so` ignores).
pub const DT_ADDITIONS: u64 = 0x6ae7_0001;
/// The descriptor's first word: "AETDETA1".
pub const MAGIC: u64 = u64::from_le_bytes(*b"AETDETA1");
/// The most segments a descriptor lists.
pub const MAX_SEGMENTS: usize = 8;
/// Bytes of a descriptor: two words, then four per segment.
pub const DESC_SIZE: usize = 16 + 32 * MAX_SEGMENTS;

const DT_DEBUG: i32 = 21;
const SYS_PREAD64: u32 = 17;
/// `MAP_PRIVATE | MAP_FIXED_NOREPLACE` (a kernel before 4.17 takes the
/// address as a hint: the result is compared).
const MAP_PRIVATE_FIXED_NOREPLACE: u32 = 0x02 | 0x10_0000;
/// `struct r_debug`'s `r_map`; `struct link_map`'s `l_addr`, `l_name`,
/// `l_ld`, `l_next`.
const R_MAP: i32 = 8;
const L_ADDR: i32 = 0;
const L_NAME: i32 = 8;
const L_LD: i32 = 16;
const L_NEXT: i32 = 24;

/// The labels of this module's code and data.
pub(super) struct Labels {
    /// `map_all()`, called by `init` (signals blocked). Clobbers rax,
    /// rcx, rdx, rsi, rdi, rbp, r8-r14.
    pub map_all: CodeLabel,
    map_one: CodeLabel,
    m_failed: CodeLabel,
}

impl Labels {
    pub fn new(a: &mut CodeAssembler) -> Labels {
        Labels {
            map_all: a.create_label(),
            map_one: a.create_label(),
            m_failed: a.create_label(),
        }
    }
}

/// Emits `map_all`, `map_one` and the message.
pub(super) fn emit(a: &mut CodeAssembler, l: &mut super::Labels) -> Result<(), IcedError> {
    let mut scan = a.create_label();
    let mut found = a.create_label();
    let mut each = a.create_label();
    let mut tags = a.create_label();
    let mut have = a.create_label();
    let mut next = a.create_label();
    let mut done = a.create_label();
    a.set_label(&mut l.detach.map_all)?;
    // The executable's `.dynamic` (0: none, a static program).
    a.mov(rax, qword_ptr(l.d_dynamic))?;
    a.test(rax, rax)?;
    a.jz(done)?;
    a.lea(r14, ptr(l.init))?;
    a.add(r14, rax)?;
    a.set_label(&mut scan)?;
    a.mov(rax, qword_ptr(r14))?;
    a.test(rax, rax)?;
    a.jz(done)?;
    a.cmp(rax, DT_DEBUG)?;
    a.je(found)?;
    a.add(r14, 16)?;
    a.jmp(scan)?;
    a.set_label(&mut found)?;
    a.mov(r14, qword_ptr(r14 + 8))?;
    a.test(r14, r14)?;
    a.jz(done)?;
    a.mov(r14, qword_ptr(r14 + R_MAP))?;
    // Each object of the link map: its `.dynamic`'s tags.
    a.set_label(&mut each)?;
    a.test(r14, r14)?;
    a.jz(done)?;
    a.mov(rdi, qword_ptr(r14 + L_LD))?;
    a.test(rdi, rdi)?;
    a.jz(next)?;
    a.set_label(&mut tags)?;
    a.mov(rax, qword_ptr(rdi))?;
    a.test(rax, rax)?;
    a.jz(next)?;
    a.cmp(rax, DT_ADDITIONS as i32)?;
    a.je(have)?;
    a.add(rdi, 16)?;
    a.jmp(tags)?;
    a.set_label(&mut have)?;
    a.mov(r13, qword_ptr(rdi + 8))?;
    a.call(l.detach.map_one)?;
    a.set_label(&mut next)?;
    a.mov(r14, qword_ptr(r14 + L_NEXT))?;
    a.jmp(each)?;
    a.set_label(&mut done)?;
    a.ret()?;
    emit_map_one(a, l)?;
    msg(
        a,
        &mut l.detach.m_failed,
        "aetrace: cannot map the added code of a --libs library at its fixed distance above it (the range is taken, or its file cannot be read)\n",
    )
}

/// `map_one`: r14 the object's link map entry, r13 its descriptor's file
/// offset. Maps every segment the descriptor lists, or stops the program.
fn emit_map_one(a: &mut CodeAssembler, l: &mut super::Labels) -> Result<(), IcedError> {
    let mut seg = a.create_label();
    let mut close = a.create_label();
    let mut fail = a.create_label();
    a.set_label(&mut l.detach.map_one)?;
    a.sub(rsp, DESC_SIZE as i32)?;
    a.mov(rdi, qword_ptr(r14 + L_NAME))?;
    a.mov(esi, O_RDONLY_CLOEXEC)?;
    a.xor(edx, edx)?;
    a.mov(eax, SYS_OPEN)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.js(fail)?;
    a.mov(r12, rax)?;
    a.mov(rdi, r12)?;
    a.mov(rsi, rsp)?;
    a.mov(edx, DESC_SIZE as u32)?;
    a.mov(r10, r13)?;
    a.mov(eax, SYS_PREAD64)?;
    a.syscall()?;
    a.mov(rcx, MAGIC)?;
    a.cmp(qword_ptr(rsp), rcx)?;
    a.jne(fail)?;
    a.mov(rbp, qword_ptr(rsp + 8))?;
    a.cmp(rbp, MAX_SEGMENTS as i32)?;
    a.ja(fail)?;
    // The read holds the whole descriptor (a failed read is negative).
    a.mov(rcx, rbp)?;
    a.shl(rcx, 5)?;
    a.add(rcx, 16)?;
    a.cmp(rax, rcx)?;
    a.jl(fail)?;
    a.lea(r13, ptr(rsp + 16))?;
    a.set_label(&mut seg)?;
    a.test(rbp, rbp)?;
    a.jz(close)?;
    a.mov(rdi, qword_ptr(r13))?;
    a.add(rdi, qword_ptr(r14 + L_ADDR))?;
    a.mov(rsi, qword_ptr(r13 + 8))?;
    a.mov(rdx, qword_ptr(r13 + 24))?;
    a.mov(r10d, MAP_PRIVATE_FIXED_NOREPLACE)?;
    a.mov(r8, r12)?;
    a.mov(r9, qword_ptr(r13 + 16))?;
    a.mov(eax, SYS_MMAP)?;
    a.syscall()?;
    // `syscall` keeps rdi: the address asked for.
    a.cmp(rax, rdi)?;
    a.jne(fail)?;
    a.add(r13, 32)?;
    a.dec(rbp)?;
    a.jmp(seg)?;
    a.set_label(&mut close)?;
    a.mov(rdi, r12)?;
    a.mov(eax, SYS_CLOSE)?;
    a.syscall()?;
    a.add(rsp, DESC_SIZE as i32)?;
    a.ret()?;
    a.set_label(&mut fail)?;
    a.lea(rsi, ptr(l.detach.m_failed))?;
    a.jmp(l.fatal)
}
