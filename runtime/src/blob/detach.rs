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
//! file offset, all page-aligned, and the `PROT_*` bits; after the last
//! possible segment the link-time vaddr of the library's new `.eh_frame`,
//! or 0; then the file offset and length of its patch table) is written
//! by the rewriter where an attached copy has its program header table.
//!
//! Patches made at init: the code ld.so runs in the library before this
//! `init` (IFUNC resolvers, libc's `__libc_early_init` and what they call)
//! is traced, but its springboards (and any other patch of its code) are
//! not in the file, so that ld.so's early calls run the original code and
//! write nothing. Once the library's segments are mapped, `map_one` makes
//! them from the table ([`PATCH_SIZE`] bytes an entry): `mprotect` to
//! write, then back. Nothing else runs meanwhile: one thread, signals
//! blocked, none of that code on the stack (ld.so calls `init` from
//! `_dl_init`).
//!
//! Unwinding through the copies: libgcc finds an FDE in the objects
//! registered with `__register_frame_info` before it asks
//! `_dl_find_object`, which knows only the library's original span. So
//! `register_frames`, after `map_all`, registers each mapped library's
//! `.eh_frame` (at most [`MAX_FRAMES`]; its `struct object` in this
//! blob's data page) with the first `__register_frame_info` of the link
//! map, looked up through each object's `DT_GNU_HASH`; none (no C++
//! unwinder loaded at start-up): nothing is registered.
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
/// Offset in a descriptor of the `.eh_frame` word.
pub const DESC_EH_FRAME: usize = 16 + 32 * MAX_SEGMENTS;
/// Offset in a descriptor of the patch table's file offset (0: none),
/// followed by its number of entries.
pub const DESC_PATCHES: usize = DESC_EH_FRAME + 8;
/// Bytes of a patch table's entry: link-time vaddr, length (at most 8),
/// the bytes (a little-endian word), the `PROT_*` bits to restore.
pub const PATCH_SIZE: usize = 32;
/// Bytes of a descriptor: two words, four per segment, the `.eh_frame`,
/// the patch table's two.
pub const DESC_SIZE: usize = DESC_PATCHES + 16;
/// The most libraries whose `.eh_frame` is registered (the detached tags).
pub const MAX_FRAMES: usize = 3;
/// Bytes the runtime keeps for libgcc's `struct object` (7 words in gcc 12).
pub const OBJECT_SIZE: usize = 128;
/// The data page's frame list: a count, [`MAX_FRAMES`] `.eh_frame`
/// addresses, then as many `struct object`s.
pub const FRAMES_SIZE: usize = 8 + 8 * MAX_FRAMES + OBJECT_SIZE * MAX_FRAMES;
/// The symbol registered with, and its GNU hash.
const REGISTER: &str = "__register_frame_info";
const DT_GNU_HASH: i32 = 0x6fff_fef5;
const DT_STRTAB: i32 = 5;
const DT_SYMTAB: i32 = 6;

const DT_DEBUG: i32 = 21;
const SYS_MPROTECT: u32 = 10;
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
    /// `register_frames()`, called by `init` after `map_all` (signals
    /// blocked). Clobbers what `map_all` does.
    pub register_frames: CodeLabel,
    map_one: CodeLabel,
    link_map: CodeLabel,
    m_failed: CodeLabel,
    name: CodeLabel,
}

impl Labels {
    pub fn new(a: &mut CodeAssembler) -> Labels {
        Labels {
            map_all: a.create_label(),
            register_frames: a.create_label(),
            map_one: a.create_label(),
            link_map: a.create_label(),
            m_failed: a.create_label(),
            name: a.create_label(),
        }
    }
}

/// Emits `map_all`, `map_one`, `register_frames` and the message.
pub(super) fn emit(a: &mut CodeAssembler, l: &mut super::Labels) -> Result<(), IcedError> {
    let mut each = a.create_label();
    let mut tags = a.create_label();
    let mut have = a.create_label();
    let mut next = a.create_label();
    let mut done = a.create_label();
    a.set_label(&mut l.detach.map_all)?;
    a.call(l.detach.link_map)?;
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
    emit_link_map(a, l)?;
    emit_map_one(a, l)?;
    emit_register_frames(a, l)?;
    a.set_label(&mut l.detach.name)?;
    a.db(format!("{REGISTER}\0").as_bytes())?;
    msg(
        a,
        &mut l.detach.m_failed,
        "aetrace: cannot map the added code of a --libs library at its fixed distance above it, or patch its code (the range is taken, or its file cannot be read)\n",
    )
}

/// `link_map`: r14 the first entry of the link map (`DT_DEBUG`'s
/// `r_debug`), or 0 (a static program, or no `DT_DEBUG`). Clobbers rax.
fn emit_link_map(a: &mut CodeAssembler, l: &mut super::Labels) -> Result<(), IcedError> {
    let mut scan = a.create_label();
    let mut found = a.create_label();
    let mut none = a.create_label();
    let mut done = a.create_label();
    a.set_label(&mut l.detach.link_map)?;
    // The executable's `.dynamic` (0: none, a static program).
    a.mov(rax, qword_ptr(l.d_dynamic))?;
    a.test(rax, rax)?;
    a.jz(none)?;
    a.lea(r14, ptr(l.init))?;
    a.add(r14, rax)?;
    a.set_label(&mut scan)?;
    a.mov(rax, qword_ptr(r14))?;
    a.test(rax, rax)?;
    a.jz(none)?;
    a.cmp(rax, DT_DEBUG)?;
    a.je(found)?;
    a.add(r14, 16)?;
    a.jmp(scan)?;
    a.set_label(&mut found)?;
    a.mov(r14, qword_ptr(r14 + 8))?;
    a.test(r14, r14)?;
    a.jz(done)?;
    a.mov(r14, qword_ptr(r14 + R_MAP))?;
    a.jmp(done)?;
    a.set_label(&mut none)?;
    a.xor(r14d, r14d)?;
    a.set_label(&mut done)?;
    a.ret()
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
    pread_r13(a, DESC_SIZE)?;
    a.mov(rcx, MAGIC)?;
    a.cmp(qword_ptr(rsp), rcx)?;
    a.jne(fail)?;
    a.mov(rbp, qword_ptr(rsp + 8))?;
    a.cmp(rbp, MAX_SEGMENTS as i32)?;
    a.ja(fail)?;
    // The read holds the whole descriptor (a failed read is negative).
    a.cmp(rax, DESC_SIZE as i32)?;
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
    // Its `.eh_frame`, to register once every library is mapped.
    a.set_label(&mut close)?;
    let mut close_fd = a.create_label();
    a.mov(rax, qword_ptr(rsp + DESC_EH_FRAME as i32))?;
    a.test(rax, rax)?;
    a.jz(close_fd)?;
    a.mov(rcx, qword_ptr(l.d_frames))?;
    a.cmp(rcx, MAX_FRAMES as i32)?;
    a.jae(close_fd)?;
    a.add(rax, qword_ptr(r14 + L_ADDR))?;
    a.lea(rdx, ptr(l.d_frames))?;
    a.mov(qword_ptr(rdx + rcx * 8 + 8), rax)?;
    a.inc(rcx)?;
    a.mov(qword_ptr(rdx), rcx)?;
    a.set_label(&mut close_fd)?;
    emit_patches(a, l)?;
    a.mov(rdi, r12)?;
    a.mov(eax, SYS_CLOSE)?;
    a.syscall()?;
    a.add(rsp, DESC_SIZE as i32)?;
    a.ret()?;
    a.set_label(&mut fail)?;
    a.lea(rsi, ptr(l.detach.m_failed))?;
    a.jmp(l.fatal)
}

/// `pread(r12, rsp, len, r13)`: `len` bytes of the file at offset r13
/// onto the stack. Clobbers rax, rcx, rdx, rsi, rdi, r10, r11.
fn pread_r13(a: &mut CodeAssembler, len: usize) -> Result<(), IcedError> {
    a.mov(rdi, r12)?;
    a.mov(rsi, rsp)?;
    a.mov(edx, len as u32)?;
    a.mov(r10, r13)?;
    a.mov(eax, SYS_PREAD64)?;
    a.syscall()
}

/// In `map_one`, its segments mapped: makes each patch of the table the
/// descriptor at rsp names (read from the file at r12, one entry at a
/// time into the descriptor's first bytes), each page made writable for
/// the write and given back its protection. Clobbers what `map_one` does.
fn emit_patches(a: &mut CodeAssembler, l: &mut super::Labels) -> Result<(), IcedError> {
    let mut each = a.create_label();
    let mut byte = a.create_label();
    let mut done = a.create_label();
    let mut fail = a.create_label();
    a.mov(rbp, qword_ptr(rsp + (DESC_PATCHES + 8) as i32))?;
    a.mov(r13, qword_ptr(rsp + DESC_PATCHES as i32))?;
    a.set_label(&mut each)?;
    a.test(rbp, rbp)?;
    a.jz(done)?;
    pread_r13(a, PATCH_SIZE)?;
    a.cmp(rax, PATCH_SIZE as i32)?;
    a.jne(fail)?;
    // r8 the patch's address; rdi its page, rsi the length to its end
    // (`syscall` keeps both).
    a.mov(r8, qword_ptr(rsp))?;
    a.add(r8, qword_ptr(r14 + L_ADDR))?;
    a.mov(rsi, r8)?;
    a.and(esi, 0xfff)?;
    a.add(rsi, qword_ptr(rsp + 8))?;
    a.mov(rdi, r8)?;
    a.and(rdi, -0x1000)?;
    a.mov(edx, 3u32)?; // PROT_READ|PROT_WRITE
    a.mov(eax, SYS_MPROTECT)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jnz(fail)?;
    a.mov(rcx, qword_ptr(rsp + 8))?;
    a.mov(rax, qword_ptr(rsp + 16))?;
    a.set_label(&mut byte)?;
    a.mov(byte_ptr(r8), al)?;
    a.shr(rax, 8)?;
    a.inc(r8)?;
    a.dec(rcx)?;
    a.jnz(byte)?;
    a.mov(rdx, qword_ptr(rsp + 24))?;
    a.mov(eax, SYS_MPROTECT)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jnz(fail)?;
    a.add(r13, PATCH_SIZE as i32)?;
    a.dec(rbp)?;
    a.jmp(each)?;
    a.set_label(&mut fail)?;
    a.lea(rsi, ptr(l.detach.m_failed))?;
    a.jmp(l.fatal)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// The GNU hash (`DT_GNU_HASH`) of `name`.
fn gnu_hash(name: &str) -> u32 {
    name.bytes().fold(5381u32, |h, c| {
        h.wrapping_mul(33).wrapping_add(u32::from(c))
    })
}

/// `register_frames`: calls `__register_frame_info(eh_frame, object)` for
/// each `.eh_frame` `map_one` noted.
fn emit_register_frames(a: &mut CodeAssembler, l: &mut super::Labels) -> Result<(), IcedError> {
    let mut each = a.create_label();
    let mut register = a.create_label();
    let mut done = a.create_label();
    a.set_label(&mut l.detach.register_frames)?;
    a.cmp(qword_ptr(l.d_frames), 0)?;
    a.je(done)?;
    a.call(l.detach.link_map)?;
    a.set_label(&mut each)?;
    a.test(r14, r14)?;
    a.jz(done)?;
    emit_lookup(a, l, register)?;
    a.mov(r14, qword_ptr(r14 + L_NEXT))?;
    a.jmp(each)?;
    // rax: the function. The list's objects follow its addresses.
    a.set_label(&mut register)?;
    a.mov(r12, rax)?;
    a.lea(r13, ptr(l.d_frames))?;
    a.xor(r14d, r14d)?;
    let mut call = a.create_label();
    a.set_label(&mut call)?;
    a.cmp(r14, qword_ptr(r13))?;
    a.jae(done)?;
    a.mov(rdi, qword_ptr(r13 + r14 * 8 + 8))?;
    a.mov(rsi, r14)?;
    a.shl(rsi, OBJECT_SIZE.trailing_zeros())?;
    a.lea(rsi, qword_ptr(r13 + rsi + (8 + 8 * MAX_FRAMES) as i32))?;
    // A C function: rsp 16-aligned at the call; rbp is preserved.
    a.mov(rbp, rsp)?;
    a.and(rsp, -16)?;
    a.call(r12)?;
    a.mov(rsp, rbp)?;
    a.inc(r14)?;
    a.jmp(call)?;
    a.set_label(&mut done)?;
    a.ret()
}

/// Looks `REGISTER` up in the object at r14 (its `DT_GNU_HASH`, a defined
/// symbol): found, rax = its address and a jump to `found`; else falls
/// through. A `.dynamic` pointer below `l_addr` is one `ld.so` did not
/// relocate (a read-only `.dynamic`): `l_addr` is added.
fn emit_lookup(
    a: &mut CodeAssembler,
    l: &mut super::Labels,
    found: CodeLabel,
) -> Result<(), IcedError> {
    let hash = gnu_hash(REGISTER);
    let mut tags = a.create_label();
    let mut end = a.create_label();
    let mut chain = a.create_label();
    let mut compare = a.create_label();
    let mut differs = a.create_label();
    let mut matched = a.create_label();
    let mut absent = a.create_label();
    a.mov(rdi, qword_ptr(r14 + L_LD))?;
    a.test(rdi, rdi)?;
    a.jz(absent)?;
    a.xor(r8d, r8d)?;
    a.xor(r9d, r9d)?;
    a.xor(r10d, r10d)?;
    a.set_label(&mut tags)?;
    a.mov(rax, qword_ptr(rdi))?;
    a.test(rax, rax)?;
    a.jz(end)?;
    for (tag, reg) in [(DT_GNU_HASH, r8), (DT_SYMTAB, r9), (DT_STRTAB, r10)] {
        let mut other = a.create_label();
        a.cmp(rax, tag)?;
        a.jne(other)?;
        a.mov(reg, qword_ptr(rdi + 8))?;
        a.set_label(&mut other)?;
    }
    a.add(rdi, 16)?;
    a.jmp(tags)?;
    a.set_label(&mut end)?;
    a.mov(r11, qword_ptr(r14 + L_ADDR))?;
    for reg in [r8, r9, r10] {
        let mut kept = a.create_label();
        a.test(reg, reg)?;
        a.jz(absent)?;
        a.cmp(reg, r11)?;
        a.jae(kept)?;
        a.add(reg, r11)?;
        a.set_label(&mut kept)?;
    }
    // The bucket of the hash, then its chain.
    a.mov(ecx, dword_ptr(r8))?;
    a.test(ecx, ecx)?;
    a.jz(absent)?;
    a.mov(eax, hash)?;
    a.xor(edx, edx)?;
    a.div(ecx)?;
    a.mov(esi, dword_ptr(r8 + 8))?;
    a.lea(rbp, qword_ptr(r8 + rsi * 8 + 16))?;
    a.mov(eax, dword_ptr(rbp + rdx * 4))?;
    a.lea(r12, qword_ptr(rbp + rcx * 4))?;
    a.mov(esi, dword_ptr(r8 + 4))?;
    a.cmp(eax, esi)?;
    a.jb(absent)?;
    a.set_label(&mut chain)?;
    a.mov(edx, eax)?;
    a.sub(edx, esi)?;
    a.mov(edx, dword_ptr(r12 + rdx * 4))?;
    a.mov(ecx, edx)?;
    a.or(ecx, 1)?;
    a.cmp(ecx, (hash | 1) as i32)?;
    a.jne(differs)?;
    a.lea(rcx, qword_ptr(rax + rax * 2))?;
    a.lea(rcx, qword_ptr(r9 + rcx * 8))?;
    a.cmp(word_ptr(rcx + 6), 0)?;
    a.je(differs)?;
    a.mov(edi, dword_ptr(rcx))?;
    a.add(rdi, r10)?;
    a.lea(r13, ptr(l.detach.name))?;
    a.set_label(&mut compare)?;
    a.mov(bpl, byte_ptr(rdi))?;
    a.cmp(bpl, byte_ptr(r13))?;
    a.jne(differs)?;
    a.test(bpl, bpl)?;
    a.jz(matched)?;
    a.inc(rdi)?;
    a.inc(r13)?;
    a.jmp(compare)?;
    a.set_label(&mut differs)?;
    a.test(edx, 1)?;
    a.jnz(absent)?;
    a.inc(eax)?;
    a.jmp(chain)?;
    a.set_label(&mut matched)?;
    a.mov(rax, qword_ptr(rcx + 8))?;
    a.add(rax, r11)?;
    a.jmp(found)?;
    a.set_label(&mut absent)?;
    Ok(())
}
