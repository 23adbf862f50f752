//! The generated runtime: `init`, `attach_thread`, `flush`, `fork_child`,
//! `fork_prepare`, `fork_done`, `exec_request`, `dispositions_native`,
//! `dispositions_ours`, `maps_opened_fd`, `maps_opened_file`, `maps_read`
//! (the program's view of its maps, `view`), `exe_path` (its executable's
//! native names, `exe`), `signal_entry`, `fault`,
//! emitted with iced-x86 `code_asm` as one
//! position-independent blob (design decision 6: generated, not linked; raw
//! syscalls only, no libc).
//!
//! Layout of the blob: code (map it read+execute) padded to a page, then
//! one data page (map it read+write) at [`Blob::data_offset`]. The code
//! reaches the data and its own strings RIP-relatively only, so the blob
//! needs no relocation wherever it is placed, as long as the data page
//! stays at `data_offset` from the code.
//!
//! Every public entry point preserves all general registers and the flags
//! and uses no vector state: instrumented code calls them at arbitrary
//! points. They block all signals while they run, so they are never
//! re-entered on one thread (a handler's own buffer check would otherwise
//! flush a half in the middle of its sealing).
//!
//! Signals inside the entry points. Each blocks signals from one
//! `syscall` to another, but an asynchronous signal can still be delivered
//! before the `syscall` that blocks them (while the registers are saved)
//! and right after the one that restores the mask (a signal that became
//! pending meanwhile; then while the registers are restored). Where that
//! can happen, with a traced handler, and what the handler's SIGNAL says:
//! - `init`: never. It is the first code of its process image to run
//!   (the first DT_PREINIT_ARRAY entry, or a static executable's entry
//!   stub), and exec resets every caught signal to its default action,
//!   so no handler of this image exists yet. Its rip is left as it is.
//! - `flush` (a hot loop calls it again and again): reported at its return
//!   address, after the buffer check's `call`, which the module's signal
//!   map places at the check. `flush` reads no slot state before it blocks
//!   signals and writes none after it unblocks them, so a handler running
//!   in either window (and its own check, which may flush the same slot,
//!   nested) sees a consistent slot, and the interrupted `flush` seals
//!   whatever half is current when it resumes (possibly a short one:
//!   fills are arbitrary); the traced code wrote everything before its
//!   check and the check writes nothing, so the SIGNAL lands, in the
//!   stream, where a signal at the check would put it.
//! - `fork_child` (a child signalled right after fork; the child inherits
//!   its parent's handlers and mask): reported at its return address, the
//!   fork's return point, which the signal map places ("call returned,
//!   RETURN not reserved yet"). Until `fork_child` claims the child's
//!   slot, `%gs` and the TCB are the parent's: a handler running then (in
//!   libc's fork after the system call, or in `fork_child` before it
//!   blocks signals) would write into the parent's stream. So
//!   `signal_entry` first compares the slot's TID with the thread's
//!   (`gettid`) and, when they differ, claims the child's slot with its
//!   FORK record itself (signals blocked); `fork_child`, signals blocked,
//!   claims only when the slot is still not the thread's own.
//! - `dispositions_native`, `dispositions_ours` (around a call that may
//!   read or set a disposition), `maps_read` (before `read`; its
//!   flag-free prelude, reported there too),
//!   `maps_opened_fd` and `maps_opened_file` (at the return point of a
//!   call that opens a file), `exe_path` (before `readlink`,
//!   `realpath`, ...; its prelude, before it blocks signals, and the
//!   prelude's return, reported there too), `exec_request` (before an exec; also
//!   between the mask it puts back and its `execve`), `shell_call`
//!   (before `system`; also while it waits for the shell): as
//!   `fork_prepare` and `fork_done`.
//! - `fork_prepare`, `fork_done` (around a call to `fork`): reported at
//!   their return addresses, before the call (with the count before its
//!   increment) and at the fork's return point, which the signal map
//!   places; they write no slot state.
//! - `attach_thread` (a new thread, which inherits the process's
//!   handlers, starting while the process takes signals): reported at its
//!   return address, in the outside-entry stub before its ENTER, placed
//!   as untraced code (the thread has run no traced code yet, or is in a
//!   call to a library entered for the first time). The handler's own
//!   stub attaches the thread first, so `attach_thread`, once signals are
//!   blocked, claims a slot only if the thread still owns none.
//! - `signal_entry` (a second signal as a handler starts): it blocks
//!   signals for the fix-up and the SIGNAL record; after it restores the
//!   mask, a signal is reported at its return address in the stub, before
//!   the handler's ENTER, which regen places as untraced code nested in
//!   the handler.
//! - A second signal that arrives while the first handler's SIGNAL is not
//!   written, i.e. in `signal_entry` before it blocks signals, in a
//!   handler stub's `attach_thread`, or at the first instruction of a
//!   handler's stub (two signals delivered at once: the kernel sets up
//!   both frames, and the second handler starts where the first would):
//!   it stands where the first signal interrupted the thread. Its
//!   `signal_entry` runs the fix-up on the first context (the kernel's
//!   frame right above the stub's return address), completing the stores
//!   it left pending (or undoing its transfer count's increment) and
//!   stepping its saved rip (the first `signal_entry` then finds nothing
//!   left to do and reports the same rip), and maps that rip again. Every
//!   instruction of a stub before its `call signal_entry`
//!   ([`STUB_INSNS`]) is recognised: the stub starting that far before the
//!   rip holds `cmp dword [rip+ready], 1` naming a blob's `ready` word and
//!   `call signal_entry` naming that blob's, and the interrupted `[rsp]`
//!   the restorer's bytes (the first instruction also behind a
//!   springboard, `jmp rel32` at the procedure's original entry, where a
//!   handler's address usually points); a rip equal to the context's CR2
//!   (an instruction fetch fault) is never read. Bytes behind the rip are
//!   read only in this blob's or the executable's instrumented code.
//!
//! The return address is found from the interrupted rsp: in these windows
//! its depth is a static function of the rip ([`Depths`]), checked by tests
//! that single-step through every window. Nested signals and threads need
//! nothing more: each interrupted context is mapped on its own, with its
//! own stack. Any other rip in a runtime (where signals are blocked,
//! `init`) is reported as it is, and the regenerator refuses it naming it.

use iced_x86::code_asm::*;
use iced_x86::BlockEncoderOptions;

use crate::emit::{STUB_INSNS, TRANSFER_INC};
use crate::layout::*;
use crate::Error;

mod brk;
pub mod detach;
mod exe;
mod exec;
mod shell;
mod view;

// Linux x86-64 syscall numbers and constants.
const SYS_READ: u32 = 0;
const SYS_WRITE: u32 = 1;
const SYS_OPEN: u32 = 2;
const SYS_CLOSE: u32 = 3;
const SYS_FSTAT: u32 = 5;
const SYS_MMAP: u32 = 9;
const SYS_MUNMAP: u32 = 11;
const SYS_READLINK: u32 = 89;
const SYS_CHDIR: u32 = 80;
const SYS_GETCWD: u32 = 79;
const SYS_GETPPID: u32 = 110;
const SYS_RT_SIGPROCMASK: u32 = 14;
const SYS_RT_SIGRETURN: u32 = 15;
const SYS_PWRITE64: u32 = 18;
const SYS_GETPID: u32 = 39;
const SYS_EXIT_GROUP: u32 = 231;
const SYS_FTRUNCATE: u32 = 77;
const SYS_ARCH_PRCTL: u32 = 158;
const SYS_GETTID: u32 = 186;
const SYS_NANOSLEEP: u32 = 35;
const SYS_FUTEX: u32 = 202;
const SYS_KILL: u32 = 62;
const SYS_EXECVE: u32 = 59;
const SYS_RT_SIGACTION: u32 = 13;
const SYS_TGKILL: u32 = 234;
const SA_SIGINFO: u64 = 4;
const SA_RESTORER: u64 = 0x0400_0000;
const SA_RESETHAND: u64 = 0x8000_0000;
/// The signals an instruction raises by faulting (ILL BUS FPE SEGV), as
/// a bit set: such an instruction faults again when its handler returns.
const FAULTING: u32 = 1 << 4 | 1 << 7 | 1 << 8 | 1 << 11;
/// The signals a crash raises (ILL TRAP ABRT BUS FPE SEGV SYS: an
/// instruction's fault, `abort`, a breakpoint, a bad system call). `init`
/// gives each the runtime's `fault` handler when the program's image
/// starts with it at `SIG_DFL`, so a run they end writes FAULT
/// (docs/regen.md, "Killed runs"); the program's disposition calls see
/// its own dispositions instead (`emit_disposition_window`). Signals
/// sent to end a process (INT, TERM, HUP, ...) keep theirs untouched.
pub const FAULT_SIGNALS: [u32; 7] = [4, 5, 6, 7, 8, 11, 31];
const ETIMEDOUT: i32 = 110;
const ESRCH: i32 = 3;
const ARCH_SET_GS: u32 = 0x1001;
const ARCH_SET_FS: u32 = 0x1002;
const ARCH_GET_FS: u32 = 0x1003;
const ARCH_GET_GS: u32 = 0x1004;
const FUTEX_WAIT: u32 = 0;
const FUTEX_WAKE: u32 = 1;
const O_RDWR_CREAT_TRUNC_CLOEXEC: u32 = 0o2 | 0o100 | 0o1000 | 0o2000000;
const O_RDONLY_CLOEXEC: u32 = 0o2000000;
const O_RDWR_CLOEXEC: u32 = 0o2 | 0o2000000;
/// What `flush` writes to stderr, once per run, when it finds the
/// recorder gone: the program then runs on untraced ([`FLAG_RECORDER_GONE`]).
const GONE_MESSAGE: &str = "aetrace: the recorder is gone (killed?): the program runs on untraced; its trace ends at the last buffer the recorder took\n";
/// Exit status of a program the runtime has to stop (message on stderr).
pub const FATAL_STATUS: u32 = 125;
/// Seconds `flush` waits for the recorder to empty a half before it checks
/// that the recorder still exists (a live but busy recorder is waited for).
pub const RECORDER_CHECK_SECS: u64 = 1;
/// With a recorder, a claim that finds no slot it may take wakes the
/// recorder and sleeps this long, then looks again ([`SLOT_WAITS`] times
/// at most): the recorder reclaims the slots of exited threads every few
/// milliseconds (`record/src/launch.rs`, `RECLAIM_EVERY`), so a program
/// whose threads come and go faster than that waits for one instead of
/// stopping. Only more live threads than slots stop it.
pub const SLOT_WAIT_NS: u64 = 1_000_000;
/// Claim attempts a thread waits through before it gives up (about two
/// seconds).
pub const SLOT_WAITS: u32 = 2000;

/// Data page fields (offsets from the data page).
const D_READY: u64 = 0;
const D_REGION: u64 = 8;
const D_FD: u64 = 16;
/// Offsets (from the blob start) of the instrumented code range in which a
/// signal may interrupt a pending witness store; 0/0 = no fix-up. Written by
/// the rewriter into the blob's data page (position independent).
const D_WIN_LO: u64 = 24;
const D_WIN_HI: u64 = 32;
/// Number of interrupted witness stores completed at signal entry.
const D_FIXUPS: u64 = 40;
/// The module tag of the instrumented module this blob belongs to (0: the
/// executable; a shared library's is 1..`MAX_MODULES`), written by the
/// rewriter. A library's blob attaches to the executable's region.
const D_TAG: u64 = 48;
/// The pre-TLS word: a static executable enters `init` with FS base 0
/// (its libc sets up TLS later), so `init` points FS here and stores the
/// word's own address in it, as a TCB's self pointer: `fs:[0]` stays
/// readable and names the main thread until libc installs its TCB, and an
/// OWNER equal to this address marks a slot claimed before TLS existed.
const D_PRETLS: u64 = 56;
/// The program's dispositions (`emit_disposition_window`): a spin lock
/// (u32) and the number of disposition calls in progress (u32) at
/// `D_DISP_LOCK`; from `D_DISP`, per signal *s* at `D_DISP + 32 s`, the
/// kernel `sigaction` (handler, flags, restorer, mask) the program set
/// for a [`FAULT_SIGNALS`] signal while the kernel holds `fault` in its
/// place. Zeros: `SIG_DFL` as exec leaves it.
const D_DISP_LOCK: u64 = 64;
/// glibc's signal restorer (`__restore_rt`), the pretcode the kernel put
/// in the last traced handler's frame before `signal_entry` replaced it
/// with `sigreturn` (every glibc handler has the same one): `sigreturn`
/// gives it to `map_caller`, which recognises a rip there. In the
/// executable's blob.
const D_RESTORER: u64 = 72;
/// Offsets (from the blob start, as `D_WIN_LO`) of the range of the
/// module's added segments (the runtime, the copies, their data), written
/// by the rewriter; the program's view of its maps leaves their lines out
/// (`view`). 0/0: none.
const D_ADDED: u64 = 80;
/// Nonzero once a view of the maps was installed in this process through
/// this blob or, for the executable's, any blob (`view`).
const D_VIEWS: u64 = 96;
/// Offset (from the blob start, as `D_ADDED`) of the original image's end,
/// where the native heap starts, written by the rewriter into an
/// executable's blob; 0: leave the break alone (`brk`).
const D_NATIVE_BRK: u64 = 104;
/// Offset (from the blob start, as `D_ADDED`) of the executable's
/// `.dynamic`, written by the rewriter into an executable's blob; 0: none
/// (`detach`: `init` finds the link map through its `DT_DEBUG`).
const D_DYNAMIC: u64 = 112;
/// Offset (from the blob start, as `D_ADDED`) of the module's table of
/// instruction starts, copy to original and back (the rewriter's
/// `insnmap`), written by the rewriter; 0: none (`translate`).
const D_INSNS: u64 = 120;
const D_DISP: u64 = 128;
/// The image id (`layout::S_IMAGE`), written by the rewriter: which
/// rewritten module this blob belongs to, so the recorder can tell a
/// program that execs its own image from one that execs another. After
/// the dispositions (`D_DISP + 32 * 65`).
const D_IMAGE: u64 = 2208;
const _: () = assert!(D_DISP + 32 * 65 <= D_IMAGE);
/// The `.eh_frame`s to register and their `struct object`s
/// (`detach::FRAMES_SIZE` bytes), after the dispositions (`D_DISP + 32 *
/// 65`).
const D_FRAMES: u64 = 2304;
const _: () = assert!(D_FRAMES + detach::FRAMES_SIZE as u64 <= D_EXE_LINK);
/// A followed exec's link to its original's canonical path, which its
/// `readlink` and `realpath` of its own `/proc/PID/exe` are given (the
/// header's [`H_EXE`] link is the launch's), NUL-terminated, written by
/// its `init` (`exe::followed_exec`); empty: none. To the page's end.
const D_EXE_LINK: u64 = 3072;
const DATA_SIZE: u64 = 4096;

/// A generated runtime: bytes plus its symbol table.
#[derive(Debug, Clone)]
pub struct Blob {
    /// Code, padding and the zeroed data page.
    pub bytes: Vec<u8>,
    /// Offset of the read+write data page (page aligned); code before it.
    pub data_offset: u64,
    /// Entry points and data words: name -> offset in `bytes`.
    pub symbols: Vec<(&'static str, u64)>,
}

impl Blob {
    /// Offset of a symbol: `init`, `attach_thread`, `flush`, `fork_child`,
    /// `ready`, `module_tag`, ...
    pub fn symbol(&self, name: &str) -> Option<u64> {
        self.symbols
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, o)| *o)
    }
}

struct Labels {
    init: CodeLabel,
    attach: CodeLabel,
    flush: CodeLabel,
    fork_child: CodeLabel,
    fork_prepare: CodeLabel,
    fork_done: CodeLabel,
    exec_request: CodeLabel,
    disp_native: CodeLabel,
    disp_ours: CodeLabel,
    swap_native: CodeLabel,
    swap_ours: CodeLabel,
    claim: CodeLabel,
    prefix: CodeLabel,
    parse_dec: CodeLabel,
    proc_path: CodeLabel,
    map_fd: CodeLabel,
    find_region: CodeLabel,
    fatal: CodeLabel,
    slot_index: CodeLabel,
    d_ready: CodeLabel,
    d_region: CodeLabel,
    d_fd: CodeLabel,
    d_win_lo: CodeLabel,
    d_win_hi: CodeLabel,
    d_fixups: CodeLabel,
    d_tag: CodeLabel,
    d_pretls: CodeLabel,
    d_disp_lock: CodeLabel,
    d_added: CodeLabel,
    d_views: CodeLabel,
    d_native_brk: CodeLabel,
    d_dynamic: CodeLabel,
    d_insns: CodeLabel,
    /// `translate` (one blob's table) and `translate_any` (this blob's,
    /// then the executable's).
    translate: CodeLabel,
    translate_any: CodeLabel,
    d_disp: CodeLabel,
    d_image: CodeLabel,
    d_frames: CodeLabel,
    d_exe_link: CodeLabel,
    /// The program's view of its maps.
    view: view::Labels,
    exe: exe::Labels,
    /// The native break.
    brk: brk::Labels,
    /// A start-up library's detached additions.
    detach: detach::Labels,
    /// `shell_call`.
    shell: shell::Labels,
    signal_entry: CodeLabel,
    /// The handler of [`FAULT_SIGNALS`], and the restorer it returns through.
    fault: CodeLabel,
    fault_restorer: CodeLabel,
    restorer: CodeLabel,
    /// `sigreturn`, the restorer a traced handler returns through; the end
    /// of its prologue, where it has blocked signals; `sigret_record`.
    sigreturn: CodeLabel,
    sigret_blocked: CodeLabel,
    sigret_record: CodeLabel,
    /// A full signal set (8 bytes of ones).
    all_ones: CodeLabel,
    d_restorer: CodeLabel,
    regmap: CodeLabel,
    s_shm: CodeLabel,
    s_out: CodeLabel,
    s_fd_path: CodeLabel,
    s_stat: CodeLabel,
    s_cwd: CodeLabel,
    s_memfd: CodeLabel,
    m_noenv: CodeLabel,
    m_region: CodeLabel,
    m_notready: CodeLabel,
    m_early: CodeLabel,
    m_rebased: CodeLabel,
    m_images_full: CodeLabel,
    /// In `emit_attach`: the library's entry holds another address.
    rebased: CodeLabel,
    m_slots: CodeLabel,
    m_write: CodeLabel,
    m_gone: CodeLabel,
    /// `struct timespec` of [`RECORDER_CHECK_SECS`]: how long `flush` waits
    /// for a half before it checks that the recorder is alive.
    t_wait: CodeLabel,
    t_slot_wait: CodeLabel,
    /// `map_caller`: the interrupted rip -> its entry point's caller.
    map_caller: CodeLabel,
    /// `fixup`: completes the stores an interrupted context left pending.
    fixup: CodeLabel,
    /// [`STUB_INSNS`] as bytes, for `map_caller`.
    stub_insns: CodeLabel,
    /// Each entry point's [`Depths`] (all but `init`, module doc), in
    /// address order, and who calls it.
    windows: Vec<(Depths, Caller)>,
}

/// Who calls an entry point, for [`emit_map_caller`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// Its return address is placed by the signal map: `flush`'s (after a
    /// buffer check), `fork_child`'s (a fork's return point),
    /// `signal_entry`'s once the handler's SIGNAL is written (in the
    /// stub, before the handler's ENTER: untraced code).
    Placed,
    /// `attach_thread`'s: in an outside-entry stub before its ENTER
    /// (untraced code), unless the stub is a signal handler's, which has
    /// not written the handler's SIGNAL yet: then as [`Caller::Handler`].
    Stub,
    /// `signal_entry`'s before it blocks signals: a handler's stub, whose
    /// SIGNAL is not written. The second signal stands where the first
    /// one interrupted its thread: that context's rip, once its stores are
    /// completed (`fixup`, done here for the first `signal_entry`, which
    /// finds nothing left to do), and mapped again (it may be in a
    /// runtime's window too).
    Handler,
}

const SAVED: [AsmRegister64; 15] = [
    rax, rcx, rdx, rbx, rbp, rsi, rdi, r8, r9, r10, r11, r12, r13, r14, r15,
];

/// Bytes `save_all` puts on the stack: the flags, [`SAVED`] and the
/// 16-byte signal-mask area at the bottom.
const FRAME: u32 = 8 + 8 * SAVED.len() as u32 + 16;

/// Where `save_all` put register `r`, from rsp in the entry's frame.
fn saved(r: AsmRegister64) -> i32 {
    FRAME as i32 - 16 - 8 * SAVED.iter().position(|s| *s == r).unwrap() as i32
}

/// Where `save_all` put rdi (index 6 of [`SAVED`]).
const SAVED_RDI: i32 = FRAME as i32 - 16 - 8 * 6;
/// Where `save_all` put rdx (index 2 of [`SAVED`]).
const SAVED_RDX: i32 = FRAME as i32 - 16 - 8 * 2;

/// The stack depth of an entry point's return address along its code
/// ([`emit_map_caller`] reports a signal delivered there at the entry
/// point's caller). Each entry: from the instruction at the label on, up
/// to the next entry's label, the return address is at `[rsp + depth]`;
/// `None` where signals are blocked, after the `ret`, or where a signal
/// is left unmapped (module doc). `init` and the internal helpers
/// collect into a `Depths` they drop.
#[derive(Default)]
struct Depths(Vec<(CodeLabel, Option<u32>)>);

impl Depths {
    /// Labels the next instruction with `depth`.
    fn mark(&mut self, a: &mut CodeAssembler, depth: Option<u32>) -> Result<(), IcedError> {
        let mut l = a.create_label();
        a.set_label(&mut l)?;
        self.0.push((l, depth));
        Ok(())
    }
}

/// Saves the flags and every general register ([`FRAME`] bytes; signal
/// entry reads the interrupted context relative to this layout). `lea` and
/// `mov`s rather than 15 `push`es so that the depth changes only twice.
fn save_all(a: &mut CodeAssembler, d: &mut Depths) -> Result<(), IcedError> {
    a.pushfq()?;
    d.mark(a, Some(8))?;
    a.lea(rsp, ptr(rsp - (FRAME - 8) as i32))?;
    d.mark(a, Some(FRAME))?;
    for (i, r) in SAVED.into_iter().enumerate() {
        a.mov(qword_ptr(rsp + (FRAME - 16 - 8 * i as u32) as i32), r)?;
    }
    Ok(())
}

fn restore_all(a: &mut CodeAssembler, d: &mut Depths) -> Result<(), IcedError> {
    for (i, r) in SAVED.into_iter().enumerate() {
        a.mov(r, qword_ptr(rsp + (FRAME - 16 - 8 * i as u32) as i32))?;
    }
    a.lea(rsp, ptr(rsp + (FRAME - 8) as i32))?;
    d.mark(a, Some(8))?;
    a.popfq()?;
    d.mark(a, Some(0))?;
    a.ret()?;
    // A zero-length instruction to carry the end label.
    d.mark(a, None)?;
    a.zero_bytes()
}

/// An entry point's start at `label`: every register saved, then every
/// signal blocked; the windows before that are `Depths` from the entry.
fn enter_blocked(a: &mut CodeAssembler, label: &mut CodeLabel) -> Result<Depths, IcedError> {
    let mut d = Depths::default();
    a.set_label(label)?;
    d.0.push((*label, Some(0)));
    save_all(a, &mut d)?;
    block_signals(a)?;
    d.mark(a, None)?;
    Ok(d)
}

/// [`enter_blocked`], then r15 = the region, jumping to `native` when
/// there is none or no recorder answers (standalone, recorder gone): the
/// prelude of every entry point that asks the recorder.
fn enter_asking(
    a: &mut CodeAssembler,
    label: &mut CodeLabel,
    d_region: CodeLabel,
    native: CodeLabel,
) -> Result<Depths, IcedError> {
    let d = enter_blocked(a, label)?;
    a.mov(r15, qword_ptr(d_region))?;
    a.test(r15, r15)?;
    a.jz(native)?;
    a.test(
        dword_ptr(r15 + H_FLAGS),
        FLAG_STANDALONE | FLAG_RECORDER_GONE,
    )?;
    a.jnz(native)?;
    Ok(d)
}

/// An entry point's end: the mask restored, the registers restored and
/// `ret`; its unblocked windows from here on (`d`) are reported at
/// `caller`.
fn leave_blocked(
    a: &mut CodeAssembler,
    windows: &mut Vec<(Depths, Caller)>,
    mut d: Depths,
    caller: Caller,
) -> Result<(), IcedError> {
    restore_signals(a)?;
    d.mark(a, Some(FRAME))?;
    restore_all(a, &mut d)?;
    windows.push((d, caller));
    Ok(())
}

/// Blocks every signal, the old mask to the save area's first word (the
/// new one, all ones, in its second). Clobbers rax, rcx, rdx, rsi, rdi,
/// r10, r11. At `save_all`'s depth.
fn block_signals(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.mov(qword_ptr(rsp + 8), -1)?;
    a.xor(edi, edi)?; // SIG_BLOCK
    a.lea(rsi, ptr(rsp + 8))?;
    a.mov(rdx, rsp)?;
    a.mov(r10d, 8u32)?;
    a.mov(eax, SYS_RT_SIGPROCMASK)?;
    a.syscall()
}

/// Restores the mask `block_signals` saved: a signal that became pending
/// meanwhile is delivered right after this `syscall`. Clobbers as
/// `block_signals`.
fn restore_signals(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.mov(edi, 2u32)?; // SIG_SETMASK
    a.mov(rsi, rsp)?;
    a.xor(edx, edx)?;
    a.mov(r10d, 8u32)?;
    a.mov(eax, SYS_RT_SIGPROCMASK)?;
    a.syscall()
}

fn msg(a: &mut CodeAssembler, label: &mut CodeLabel, text: &str) -> Result<(), IcedError> {
    a.set_label(label)?;
    let mut bytes = text.as_bytes().to_vec();
    bytes.push(0);
    a.db(&bytes)
}

/// Generates the runtime.
pub fn generate() -> Result<Blob, Error> {
    // Pass 1 measures the code; pass 2 pads it to a page boundary.
    let (_, code_len) = assemble(0)?;
    let data_offset = code_len.div_ceil(4096) * 4096;
    let (blob, check) = assemble(data_offset - code_len)?;
    debug_assert_eq!(check, data_offset);
    Ok(blob)
}

fn assemble(pad: u64) -> Result<(Blob, u64), Error> {
    let mut a = CodeAssembler::new(64)?;
    let mut l = Labels {
        init: a.create_label(),
        attach: a.create_label(),
        flush: a.create_label(),
        fork_child: a.create_label(),
        fork_prepare: a.create_label(),
        fork_done: a.create_label(),
        exec_request: a.create_label(),
        disp_native: a.create_label(),
        disp_ours: a.create_label(),
        swap_native: a.create_label(),
        swap_ours: a.create_label(),
        claim: a.create_label(),
        prefix: a.create_label(),
        parse_dec: a.create_label(),
        proc_path: a.create_label(),
        map_fd: a.create_label(),
        find_region: a.create_label(),
        fatal: a.create_label(),
        slot_index: a.create_label(),
        d_ready: a.create_label(),
        d_region: a.create_label(),
        d_fd: a.create_label(),
        d_win_lo: a.create_label(),
        d_win_hi: a.create_label(),
        d_fixups: a.create_label(),
        d_tag: a.create_label(),
        d_pretls: a.create_label(),
        d_disp_lock: a.create_label(),
        d_added: a.create_label(),
        d_views: a.create_label(),
        d_native_brk: a.create_label(),
        d_dynamic: a.create_label(),
        d_insns: a.create_label(),
        translate: a.create_label(),
        translate_any: a.create_label(),
        d_disp: a.create_label(),
        d_image: a.create_label(),
        d_frames: a.create_label(),
        d_exe_link: a.create_label(),
        view: view::Labels::new(&mut a),
        exe: exe::Labels::new(&mut a),
        brk: brk::Labels::new(&mut a),
        detach: detach::Labels::new(&mut a),
        shell: shell::Labels::new(&mut a),
        signal_entry: a.create_label(),
        fault: a.create_label(),
        fault_restorer: a.create_label(),
        restorer: a.create_label(),
        sigreturn: a.create_label(),
        sigret_blocked: a.create_label(),
        sigret_record: a.create_label(),
        all_ones: a.create_label(),
        d_restorer: a.create_label(),
        regmap: a.create_label(),
        s_shm: a.create_label(),
        s_out: a.create_label(),
        s_fd_path: a.create_label(),
        s_stat: a.create_label(),
        s_cwd: a.create_label(),
        s_memfd: a.create_label(),
        m_noenv: a.create_label(),
        m_region: a.create_label(),
        m_notready: a.create_label(),
        m_early: a.create_label(),
        m_rebased: a.create_label(),
        m_images_full: a.create_label(),
        rebased: a.create_label(),
        m_slots: a.create_label(),
        m_write: a.create_label(),
        m_gone: a.create_label(),
        t_wait: a.create_label(),
        t_slot_wait: a.create_label(),
        map_caller: a.create_label(),
        fixup: a.create_label(),
        stub_insns: a.create_label(),
        windows: Vec::new(),
    };
    emit_init(&mut a, &mut l)?;
    emit_attach(&mut a, &mut l)?;
    emit_fork_child(&mut a, &mut l)?;
    emit_flush(&mut a, &mut l)?;
    emit_fork_window(&mut a, &mut l, 1)?;
    emit_fork_window(&mut a, &mut l, -1)?;
    exec::emit(&mut a, &mut l)?;
    shell::emit(&mut a, &mut l)?;
    emit_disposition_window(&mut a, &mut l, true)?;
    emit_disposition_window(&mut a, &mut l, false)?;
    view::emit_entries(&mut a, &mut l)?;
    exe::emit_entry(&mut a, &mut l)?;
    // Entry, after pushfq, after the lea (registers saved, then signals
    // blocked), after the mask is restored, popfq, ret, after the ret.
    debug_assert_eq!(
        l.windows[2].0 .0.iter().map(|d| d.1).collect::<Vec<_>>(),
        [
            Some(0),
            Some(8),
            Some(FRAME),
            None,
            Some(FRAME),
            Some(8),
            Some(0),
            None
        ]
    );
    emit_claim(&mut a, &mut l)?;
    emit_helpers(&mut a, &mut l)?;
    view::emit_helpers(&mut a, &mut l)?;
    exe::emit_helpers(&mut a, &mut l.exe)?;
    brk::emit(&mut a, &mut l)?;
    detach::emit(&mut a, &mut l)?;
    emit_find_region(&mut a, &mut l)?;
    emit_swap(&mut a, &mut l, true)?;
    emit_swap(&mut a, &mut l, false)?;
    emit_signal_entry(&mut a, &mut l)?;
    // Each entry point's windows: entry, after pushfq, after the lea,
    // blocked from its `syscall` on; `signal_entry`'s unblocked prologue
    // is mapped to the first signal's context, the rest to the caller.
    debug_assert!(l.windows.iter().all(|(d, c)| {
        let depths: Vec<_> = d.0.iter().map(|e| e.1).collect();
        depths[..] == [Some(0), Some(8), Some(FRAME), None][..] && *c == Caller::Handler
            || depths.starts_with(&[Some(0), Some(8), Some(FRAME), None])
                && depths.ends_with(&[Some(FRAME), Some(8), Some(0), None])
            || depths[..] == [Some(FRAME), Some(8), Some(0), None][..]
            || depths[..] == [Some(0), Some(8), Some(0), Some(8), Some(0), None][..]
    }));
    emit_map_caller(&mut a, &mut l)?;
    emit_fault(&mut a, &mut l)?;
    emit_sigreturn(&mut a, &mut l)?;
    emit_translate(&mut a, &mut l)?;
    a.set_label(&mut l.all_ones)?;
    a.dq(&[u64::MAX])?;
    // glibc's __restore_rt: `mov rax, 15` + first byte of `syscall`.
    a.set_label(&mut l.restorer)?;
    a.db(&[0x48, 0xC7, 0xC0, 0x0F, 0x00, 0x00, 0x00, 0x0F])?;
    a.set_label(&mut l.stub_insns)?;
    a.db(&STUB_INSNS.map(|o| o as u8))?;
    // x86 register number -> index in the signal frame's gregs.
    a.set_label(&mut l.regmap)?;
    a.db(&[13, 14, 12, 11, 15, 10, 9, 8, 0, 1, 2, 3, 4, 5, 6, 7])?;
    msg(&mut a, &mut l.s_shm, "AETRACE_SHM_FD=")?;
    msg(&mut a, &mut l.s_out, "AETRACE_OUT=")?;
    msg(&mut a, &mut l.s_fd_path, &format!("/fd/{REGION_FD}"))?;
    msg(&mut a, &mut l.s_stat, "/stat")?;
    msg(&mut a, &mut l.s_cwd, "/cwd")?;
    msg(&mut a, &mut l.s_memfd, REGION_MEMFD_LINK)?;
    msg(
        &mut a,
        &mut l.m_noenv,
        "aetrace: no witness region: no aetrace recorder among this process's ancestors, and neither AETRACE_SHM_FD nor AETRACE_OUT is set; cannot trace\n",
    )?;
    msg(
        &mut a,
        &mut l.m_region,
        "aetrace: cannot map the witness region (bad fd, file or layout version)\n",
    )?;
    msg(&mut a, &mut l.m_notready, "aetrace: instrumented code ran before the runtime's init (init must be the first DT_PREINIT_ARRAY entry)\n")?;
    msg(&mut a, &mut l.m_early, "aetrace: an instrumented shared library ran before the executable's runtime init (an IFUNC resolver, or a process whose executable is not instrumented)\n")?;
    msg(&mut a, &mut l.m_images_full, "aetrace: the witness region's table of exec'd images' libraries is full (256 entries); stopped\n")?;
    msg(&mut a, &mut l.m_rebased, "aetrace: an instrumented shared library was loaded again at another address (dlclose, then dlopen): the trace has one load address per module; stopped\n")?;
    msg(
        &mut a,
        &mut l.m_slots,
        "aetrace: no free thread slot left in the witness region (too many threads/processes)\n",
    )?;
    msg(
        &mut a,
        &mut l.m_write,
        "aetrace: cannot write the standalone trace file\n",
    )?;
    msg(&mut a, &mut l.m_gone, GONE_MESSAGE)?;
    a.set_label(&mut l.t_wait)?;
    a.dq(&[RECORDER_CHECK_SECS, 0])?;
    a.set_label(&mut l.t_slot_wait)?;
    a.dq(&[0, SLOT_WAIT_NS])?;
    if pad > 0 {
        a.db(&vec![0xCC; pad as usize])?;
    }
    // The data page: one label per field (a label plus a displacement
    // would name another label), then zeros to the end of the page.
    a.set_label(&mut l.d_ready)?;
    a.db(&[0u8; 8])?;
    a.set_label(&mut l.d_region)?;
    a.db(&[0u8; 8])?;
    a.set_label(&mut l.d_fd)?;
    a.db(&[0u8; 8])?;
    a.set_label(&mut l.d_win_lo)?;
    a.db(&[0u8; 8])?;
    a.set_label(&mut l.d_win_hi)?;
    a.db(&[0u8; 8])?;
    a.set_label(&mut l.d_fixups)?;
    a.db(&[0u8; 8])?;
    a.set_label(&mut l.d_tag)?;
    a.db(&[0u8; 8])?;
    a.set_label(&mut l.d_pretls)?;
    a.db(&[0u8; 8])?;
    a.set_label(&mut l.d_disp_lock)?;
    a.db(&[0u8; (D_RESTORER - D_DISP_LOCK) as usize])?;
    a.set_label(&mut l.d_restorer)?;
    a.db(&[0u8; (D_ADDED - D_RESTORER) as usize])?;
    a.set_label(&mut l.d_added)?;
    a.db(&[0u8; (D_VIEWS - D_ADDED) as usize])?;
    a.set_label(&mut l.d_views)?;
    a.db(&[0u8; (D_NATIVE_BRK - D_VIEWS) as usize])?;
    a.set_label(&mut l.d_native_brk)?;
    a.db(&[0u8; (D_DYNAMIC - D_NATIVE_BRK) as usize])?;
    a.set_label(&mut l.d_dynamic)?;
    a.db(&[0u8; (D_INSNS - D_DYNAMIC) as usize])?;
    a.set_label(&mut l.d_insns)?;
    a.db(&[0u8; (D_DISP - D_INSNS) as usize])?;
    a.set_label(&mut l.d_disp)?;
    a.db(&vec![0u8; (D_IMAGE - D_DISP) as usize])?;
    a.set_label(&mut l.d_image)?;
    a.db(&[0u8; (D_FRAMES - D_IMAGE) as usize])?;
    a.set_label(&mut l.d_frames)?;
    a.db(&vec![0u8; (D_EXE_LINK - D_FRAMES) as usize])?;
    a.set_label(&mut l.d_exe_link)?;
    a.db(&vec![0u8; (DATA_SIZE - D_EXE_LINK) as usize])?;
    let res = a.assemble_options(0, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
    let data_offset = res.label_ip(&l.d_ready)?;
    debug_assert_eq!(res.label_ip(&l.d_region)?, data_offset + D_REGION);
    debug_assert_eq!(res.label_ip(&l.d_fd)?, data_offset + D_FD);
    debug_assert_eq!(res.label_ip(&l.d_fixups)?, data_offset + D_FIXUPS);
    debug_assert_eq!(res.label_ip(&l.d_tag)?, data_offset + D_TAG);
    debug_assert_eq!(res.label_ip(&l.d_pretls)?, data_offset + D_PRETLS);
    debug_assert_eq!(res.label_ip(&l.d_disp_lock)?, data_offset + D_DISP_LOCK);
    debug_assert_eq!(res.label_ip(&l.d_restorer)?, data_offset + D_RESTORER);
    debug_assert_eq!(res.label_ip(&l.d_added)?, data_offset + D_ADDED);
    debug_assert_eq!(res.label_ip(&l.d_views)?, data_offset + D_VIEWS);
    debug_assert_eq!(res.label_ip(&l.d_native_brk)?, data_offset + D_NATIVE_BRK);
    debug_assert_eq!(res.label_ip(&l.d_dynamic)?, data_offset + D_DYNAMIC);
    debug_assert_eq!(res.label_ip(&l.d_insns)?, data_offset + D_INSNS);
    debug_assert_eq!(res.label_ip(&l.d_disp)?, data_offset + D_DISP);
    debug_assert_eq!(res.label_ip(&l.d_image)?, data_offset + D_IMAGE);
    debug_assert_eq!(res.label_ip(&l.d_frames)?, data_offset + D_FRAMES);
    debug_assert_eq!(res.label_ip(&l.d_exe_link)?, data_offset + D_EXE_LINK);
    let symbols = vec![
        ("init", res.label_ip(&l.init)?),
        ("attach_thread", res.label_ip(&l.attach)?),
        ("flush", res.label_ip(&l.flush)?),
        ("fork_child", res.label_ip(&l.fork_child)?),
        ("fork_prepare", res.label_ip(&l.fork_prepare)?),
        ("fork_done", res.label_ip(&l.fork_done)?),
        ("exec_request", res.label_ip(&l.exec_request)?),
        ("shell_call", res.label_ip(&l.shell.entry)?),
        ("dispositions_native", res.label_ip(&l.disp_native)?),
        ("dispositions_ours", res.label_ip(&l.disp_ours)?),
        ("signal_entry", res.label_ip(&l.signal_entry)?),
        ("restorer_bytes", res.label_ip(&l.restorer)?),
        ("fault", res.label_ip(&l.fault)?),
        ("sigreturn", res.label_ip(&l.sigreturn)?),
        ("sigreturn_blocked", res.label_ip(&l.sigret_blocked)?),
        ("maps_opened_fd", res.label_ip(&l.view.opened_fd)?),
        ("maps_opened_file", res.label_ip(&l.view.opened_file)?),
        ("maps_read", res.label_ip(&l.view.read)?),
        ("exe_path", res.label_ip(&l.exe.path)?),
        ("ready", data_offset + D_READY),
        ("witness_code_start", data_offset + D_WIN_LO),
        ("witness_code_end", data_offset + D_WIN_HI),
        ("signal_fixups", data_offset + D_FIXUPS),
        ("module_tag", data_offset + D_TAG),
        ("pretls", data_offset + D_PRETLS),
        ("added_start", data_offset + D_ADDED),
        ("added_end", data_offset + D_ADDED + 8),
        ("native_brk", data_offset + D_NATIVE_BRK),
        ("dynamic", data_offset + D_DYNAMIC),
        ("insn_table", data_offset + D_INSNS),
        ("image_id", data_offset + D_IMAGE),
    ];
    debug_assert_eq!(res.label_ip(&l.init)?, 0, "init is the blob's base label");
    let bytes = res.inner.code_buffer;
    Ok((
        Blob {
            bytes,
            data_offset,
            symbols,
        },
        data_offset,
    ))
}

/// `init(argc, argv, envp)`: the DT_PREINIT_ARRAY calling convention (a
/// static executable's entry stub passes the same from its initial stack).
/// Maps the region (the fd named by `AETRACE_SHM_FD`, else the recorder's
/// found among the ancestors, [`emit_find_region`]; else standalone: creates
/// the file `AETRACE_OUT`), gives FS the pre-TLS word when its base is 0
/// (see [`D_PRETLS`]), then attaches the calling thread. Idempotent.
fn emit_init(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut env_loop = a.create_label();
    let mut try_out = a.create_label();
    let mut next = a.create_label();
    let mut env_done = a.create_label();
    let mut shm = a.create_label();
    let mut out_mode = a.create_label();
    let mut mapped = a.create_label();
    let mut done = a.create_label();
    let mut bad_region = a.create_label();
    a.set_label(&mut l.init)?;
    save_all(a, &mut Depths::default())?;
    a.cmp(dword_ptr(l.d_ready), 0)?;
    a.jne(done)?;
    a.mov(rbx, rdx)?; // envp (block_signals clobbers rdx)
    block_signals(a)?;
    a.mov(r12, -1i64)?;
    a.xor(r13d, r13d)?;
    a.test(rbx, rbx)?;
    a.jz(env_done)?;
    a.set_label(&mut env_loop)?;
    a.mov(rsi, qword_ptr(rbx))?;
    a.test(rsi, rsi)?;
    a.jz(env_done)?;
    a.lea(rdi, ptr(l.s_shm))?;
    a.call(l.prefix)?;
    a.test(rax, rax)?;
    a.jz(try_out)?;
    a.call(l.parse_dec)?;
    a.mov(r12, rax)?;
    a.jmp(next)?;
    a.set_label(&mut try_out)?;
    a.mov(rsi, qword_ptr(rbx))?;
    a.lea(rdi, ptr(l.s_out))?;
    a.call(l.prefix)?;
    a.test(rax, rax)?;
    a.jz(next)?;
    a.mov(r13, rax)?;
    a.set_label(&mut next)?;
    a.add(rbx, 8)?;
    a.jmp(env_loop)?;
    a.set_label(&mut env_done)?;
    a.cmp(r12, -1)?;
    a.jne(shm)?;
    a.call(l.find_region)?;
    a.mov(r15, rax)?;
    a.mov(r12, -1i64)?; // no descriptor kept
    a.test(rax, rax)?;
    a.jnz(mapped)?;
    a.test(r13, r13)?;
    a.jnz(out_mode)?;
    a.lea(rsi, ptr(l.m_noenv))?;
    a.jmp(l.fatal)?;

    // A descriptor named by AETRACE_SHM_FD.
    a.set_label(&mut shm)?;
    a.mov(rdi, r12)?;
    a.call(l.map_fd)?;
    a.mov(r15, rax)?;
    a.test(rax, rax)?;
    a.jnz(mapped)?;
    a.set_label(&mut bad_region)?;
    a.lea(rsi, ptr(l.m_region))?;
    a.jmp(l.fatal)?;

    // Standalone: create the file with the same layout.
    let g = Geometry {
        slot_count: STANDALONE_SLOTS,
        half_size: STANDALONE_HALF,
    };
    a.set_label(&mut out_mode)?;
    a.mov(rdi, r13)?;
    a.mov(esi, O_RDWR_CREAT_TRUNC_CLOEXEC)?;
    a.mov(edx, 0o644u32)?;
    a.mov(eax, SYS_OPEN)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.js(bad_region)?;
    a.mov(r12, rax)?;
    a.mov(rdi, r12)?;
    a.mov(rsi, g.region_size())?;
    a.mov(eax, SYS_FTRUNCATE)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jnz(bad_region)?;
    a.mov(rdi, REGION_HINT)?;
    a.mov(rsi, g.region_size())?;
    a.mov(edx, 3u32)?;
    a.mov(r10d, 1u32)?;
    a.mov(r8, r12)?;
    a.xor(r9d, r9d)?;
    a.mov(eax, SYS_MMAP)?;
    a.syscall()?;
    a.cmp(rax, -4096)?;
    a.ja(bad_region)?;
    a.mov(r15, rax)?;
    a.mov(rax, MAGIC)?;
    a.mov(qword_ptr(r15 + H_MAGIC), rax)?;
    a.mov(dword_ptr(r15 + H_VERSION), VERSION)?;
    a.mov(dword_ptr(r15 + H_FLAGS), FLAG_STANDALONE)?;
    a.mov(rax, g.region_size())?;
    a.mov(qword_ptr(r15 + H_REGION_SIZE), rax)?;
    a.mov(qword_ptr(r15 + H_FILE_END), rax)?;
    a.mov(dword_ptr(r15 + H_SLOT_COUNT), g.slot_count)?;
    a.mov(dword_ptr(r15 + H_HEADROOM), HEADROOM as u32)?;
    a.mov(rax, g.slot_size())?;
    a.mov(qword_ptr(r15 + H_SLOT_SIZE), rax)?;
    a.mov(rax, g.half_size)?;
    a.mov(qword_ptr(r15 + H_HALF_SIZE), rax)?;
    a.mov(eax, SYS_GETPID)?;
    a.syscall()?;
    a.mov(dword_ptr(r15 + H_PID), eax)?;
    a.mov(qword_ptr(r15 + H_FD), r12)?;

    a.set_label(&mut mapped)?;
    a.mov(qword_ptr(l.d_region), r15)?;
    a.mov(qword_ptr(l.d_fd), r12)?;
    exe::native_execfn(a)?;
    exe::followed_exec(a, l)?;
    hide_env(a)?;
    a.call(l.brk.native_brk)?;
    a.call(l.detach.map_all)?;
    a.call(l.detach.register_frames)?;
    chdir_back(a, l)?;
    // FS base 0: a static executable before its libc's TLS setup.
    let mut have_fs = a.create_label();
    a.sub(rsp, 8)?;
    a.mov(edi, ARCH_GET_FS)?;
    a.mov(rsi, rsp)?;
    a.mov(eax, SYS_ARCH_PRCTL)?;
    a.syscall()?;
    a.pop(rax)?;
    a.test(rax, rax)?;
    a.jnz(have_fs)?;
    a.lea(rsi, ptr(l.d_pretls))?;
    a.mov(qword_ptr(l.d_pretls), rsi)?;
    a.mov(edi, ARCH_SET_FS)?;
    a.mov(eax, SYS_ARCH_PRCTL)?;
    a.syscall()?;
    a.set_label(&mut have_fs)?;
    a.mov(dword_ptr(l.d_ready), 1)?;
    a.mov(ebx, RecordKind::Thread as u32)?;
    a.mov(ebp, u32::MAX)?;
    a.call(l.claim)?;
    a.call(l.swap_ours)?;
    restore_signals(a)?;
    a.set_label(&mut done)?;
    restore_all(a, &mut Depths::default())
}

/// In `init` (r15 the region header, rsp as `save_all` left it): gives
/// the program back the native form of the variable the recorder changed
/// for the rewritten copy ([`H_HIDE`]), in the `envp` `init` was given,
/// which is libc's `environ`: the loader has read it already. Clobbers
/// rax, rcx, rdx, rsi, rdi, r8.
fn hide_env(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let mut scan = a.create_label();
    let mut compare = a.create_label();
    let mut next = a.create_label();
    let mut shift = a.create_label();
    let mut empty = a.create_label();
    let mut suffix = a.create_label();
    let mut copy = a.create_label();
    let mut done = a.create_label();
    a.mov(ecx, dword_ptr(r15 + H_HIDE))?;
    a.test(ecx, ecx)?;
    a.jz(done)?;
    a.mov(rdi, qword_ptr(rsp + SAVED_RDX))?;
    a.test(rdi, rdi)?;
    a.jz(done)?;
    a.set_label(&mut scan)?;
    a.mov(rsi, qword_ptr(rdi))?;
    a.test(rsi, rsi)?;
    a.jz(done)?;
    a.xor(eax, eax)?;
    a.set_label(&mut compare)?;
    a.movzx(edx, byte_ptr(r15 + rax + H_HIDE_BYTES))?;
    a.cmp(dl, byte_ptr(rsi + rax))?;
    a.jne(next)?;
    a.inc(eax)?;
    a.cmp(eax, ecx)?;
    a.jb(compare)?;
    a.mov(edx, dword_ptr(r15 + H_HIDE + 4))?;
    a.cmp(edx, HIDE_SUFFIX)?;
    a.je(suffix)?;
    // Absent or empty natively: the entry is the prefix exactly.
    a.cmp(byte_ptr(rsi + rcx), 0)?;
    a.jne(next)?;
    a.cmp(edx, HIDE_EMPTY)?;
    a.je(empty)?;
    // Absent: the later entries, and the NULL, move down over it.
    a.set_label(&mut shift)?;
    a.mov(rax, qword_ptr(rdi + 8))?;
    a.mov(qword_ptr(rdi), rax)?;
    a.add(rdi, 8)?;
    a.test(rax, rax)?;
    a.jnz(shift)?;
    a.jmp(done)?;
    a.set_label(&mut empty)?;
    a.mov(eax, dword_ptr(r15 + H_HIDE + 8))?;
    a.mov(byte_ptr(rsi + rax), 0)?;
    a.jmp(done)?;
    // The native value follows the prefix: `NAME=` goes just before it
    // (over the prefix's tail) and the entry points there.
    a.set_label(&mut suffix)?;
    a.mov(eax, dword_ptr(r15 + H_HIDE + 8))?;
    a.lea(r8, ptr(rsi + rcx))?;
    a.sub(r8, rax)?;
    a.mov(qword_ptr(rdi), r8)?;
    a.xor(edx, edx)?;
    a.set_label(&mut copy)?;
    a.movzx(ecx, byte_ptr(r15 + rdx + H_HIDE_BYTES))?;
    a.mov(byte_ptr(r8 + rdx), cl)?;
    a.inc(edx)?;
    a.cmp(edx, eax)?;
    a.jb(copy)?;
    a.jmp(done)?;
    a.set_label(&mut next)?;
    a.add(rdi, 8)?;
    a.jmp(scan)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// In `init` (r15 the region header): the first `init` after the
/// recorder exec'd the program from another directory ([`FLAG_CHDIR`],
/// `record::execname`) goes to the recorder's, `/proc/H_PID/cwd`.
/// Clobbers rax, rcx, rdx, rsi, rdi, r8-r11.
fn chdir_back(a: &mut CodeAssembler, l: &Labels) -> Result<(), IcedError> {
    let mut done = a.create_label();
    a.lock()
        .btr(dword_ptr(r15 + H_FLAGS), FLAG_CHDIR.trailing_zeros())?;
    a.jnc(done)?;
    a.sub(rsp, 64)?;
    a.mov(rdi, rsp)?;
    a.mov(esi, dword_ptr(r15 + H_PID))?;
    a.lea(rdx, ptr(l.s_cwd))?;
    a.call(l.proc_path)?;
    a.mov(rdi, rsp)?;
    a.mov(eax, SYS_CHDIR)?;
    a.syscall()?;
    a.add(rsp, 64)?;
    a.set_label(&mut done)?;
    Ok(())
}

/// `swap_native` (`native`) and `swap_ours`, signals blocked, from an
/// entry point: for each of [`FAULT_SIGNALS`], native: where the kernel
/// holds the `fault` handler, puts back the disposition the program set
/// (`D_DISP`); ours: where the kernel holds `SIG_DFL` (exec's, or the
/// program's), keeps it in `D_DISP` and installs `fault` there, every
/// signal blocked while it runs, reset to `SIG_DFL` as it starts
/// (`SA_RESETHAND`), so the signal that ends the run ends it natively.
/// An ignored signal or a handler of the program is left as it is (exec
/// keeps an ignored signal ignored). The table and the handler are the
/// executable's blob's (the slot's RUNTIME), whichever module calls.
/// Clobbers rax, rbx, rcx, rdx, rsi, rdi, rbp, r10-r14.
fn emit_swap(a: &mut CodeAssembler, l: &mut Labels, native: bool) -> Result<(), IcedError> {
    let mut lp = a.create_label();
    let mut next = a.create_label();
    let mask = FAULT_SIGNALS.iter().fold(0u64, |m, &s| m | 1 << s);
    a.set_label(if native {
        &mut l.swap_native
    } else {
        &mut l.swap_ours
    })?;
    // r12: the executable's blob minus this one.
    a.mov(r12, qword_ptr(S_RUNTIME).gs())?;
    a.lea(rax, ptr(l.init))?;
    a.sub(r12, rax)?;
    a.lea(r13, ptr(l.fault))?;
    a.add(r13, r12)?;
    a.lea(r14, ptr(l.fault_restorer))?;
    a.add(r14, r12)?;
    // [rsp]: the kernel's current sigaction, [rsp+32]: `fault`'s.
    a.sub(rsp, 64)?;
    a.mov(qword_ptr(rsp + 32), r13)?;
    a.mov(rax, SA_SIGINFO | SA_RESTORER | SA_RESETHAND)?;
    a.mov(qword_ptr(rsp + 40), rax)?;
    a.mov(qword_ptr(rsp + 48), r14)?;
    a.mov(qword_ptr(rsp + 56), -1)?;
    a.mov(ebx, 1u32)?;
    a.set_label(&mut lp)?;
    a.mov(rax, mask)?;
    a.bt(rax, rbx)?;
    a.jae(next)?;
    a.mov(edi, ebx)?;
    a.xor(esi, esi)?;
    a.mov(rdx, rsp)?;
    a.mov(r10d, 8u32)?;
    a.mov(eax, SYS_RT_SIGACTION)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jnz(next)?;
    // rbp: the signal's entry in the table.
    a.mov(rbp, rbx)?;
    a.shl(rbp, 5)?;
    a.lea(rax, ptr(l.d_disp))?;
    a.add(rbp, rax)?;
    a.add(rbp, r12)?;
    if native {
        a.cmp(qword_ptr(rsp), r13)?;
        a.jne(next)?;
        a.mov(rsi, rbp)?;
    } else {
        a.cmp(qword_ptr(rsp), 0)?; // SIG_DFL
        a.jne(next)?;
        for off in [0, 8, 16, 24] {
            a.mov(rax, qword_ptr(rsp + off))?;
            a.mov(qword_ptr(rbp + off), rax)?;
        }
        a.lea(rsi, ptr(rsp + 32))?;
    }
    a.mov(edi, ebx)?;
    a.xor(edx, edx)?;
    a.mov(r10d, 8u32)?;
    a.mov(eax, SYS_RT_SIGACTION)?;
    a.syscall()?;
    a.set_label(&mut next)?;
    a.inc(ebx)?;
    a.cmp(ebx, 32)?;
    a.jb(lp)?;
    a.add(rsp, 64)?;
    a.ret()
}

/// `dispositions_native()` (`native`) and `dispositions_ours()`: the
/// rewriter calls them around each call that may read or change a
/// signal's disposition (`sigaction`, `signal`, ..., named by
/// `analysis::imports::touches_dispositions`), so that the call finds and
/// leaves the kernel holding exactly the program's own dispositions, as a
/// native run's, and the `fault` handler stands in for `SIG_DFL` again
/// afterwards (`docs/runtime.md` section 5, "Fatal signals"). They count
/// the calls in progress (nested: a handler's call inside another's;
/// several threads): the first swaps the program's dispositions in, the
/// last swaps `fault` back, under a spin lock (signals blocked, a few
/// system calls; `fork_child` releases it in a child, whose other threads
/// are gone). Between them a crash ends the run natively, without FAULT.
/// Signals are blocked from one `syscall` to the other, as in every entry
/// point (a signal outside that is reported at the caller).
fn emit_disposition_window(
    a: &mut CodeAssembler,
    l: &mut Labels,
    native: bool,
) -> Result<(), IcedError> {
    let mut spin = a.create_label();
    let mut locked = a.create_label();
    let mut unlock = a.create_label();
    let label = if native {
        &mut l.disp_native
    } else {
        &mut l.disp_ours
    };
    let d = enter_blocked(a, label)?;
    // r15: the executable's lock word (the count follows it).
    a.mov(r15, qword_ptr(S_RUNTIME).gs())?;
    a.lea(rax, ptr(l.init))?;
    a.sub(r15, rax)?;
    a.lea(rax, ptr(l.d_disp_lock))?;
    a.add(r15, rax)?;
    a.set_label(&mut spin)?;
    a.mov(eax, 1u32)?;
    a.xchg(dword_ptr(r15), eax)?;
    a.test(eax, eax)?;
    a.jz(locked)?;
    a.pause()?;
    a.jmp(spin)?;
    a.set_label(&mut locked)?;
    if native {
        a.add(dword_ptr(r15 + 4), 1)?;
        a.cmp(dword_ptr(r15 + 4), 1)?;
        a.jne(unlock)?;
        a.call(l.swap_native)?;
    } else {
        // Never below 0 (a call left by a longjmp keeps the count up:
        // the program's dispositions then simply stay in the kernel).
        a.cmp(dword_ptr(r15 + 4), 0)?;
        a.je(unlock)?;
        a.sub(dword_ptr(r15 + 4), 1)?;
        a.jnz(unlock)?;
        a.call(l.swap_ours)?;
    }
    a.set_label(&mut unlock)?;
    a.mov(dword_ptr(r15), 0)?;
    leave_blocked(a, &mut l.windows, d, Caller::Placed)
}

/// `attach_thread()`: claim a slot for the calling thread (a new thread,
/// detected by an outside-entry stub) and point %gs at it.
///
/// In a shared library's blob (`module_tag` != 0) the first call, before
/// `ready` is set, attaches the blob to the region the executable's `init`
/// mapped: its address comes from the slot `%gs` points at (the thread's
/// slot, claimed by the executable's runtime), the standalone fd from the
/// header; the blob's own run-time address goes to the header's module
/// table. Then a thread that already owns its slot keeps it.
///
/// A thread whose own slot was claimed before libc set up TLS (a static
/// executable's: OWNER is the pre-TLS word, same tid) keeps that slot and
/// takes its TCB as the new OWNER: its stream goes on.
fn emit_attach(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut ready = a.create_label();
    let mut library = a.create_label();
    let mut has_gs = a.create_label();
    let mut mapped = a.create_label();
    let mut published = a.create_label();
    let mut claim = a.create_label();
    let mut kept = a.create_label();
    let mut done = a.create_label();
    let mut d = Depths::default();
    a.set_label(&mut l.attach)?;
    d.0.push((l.attach, Some(0)));
    save_all(a, &mut d)?;
    a.cmp(dword_ptr(l.d_ready), 0)?;
    a.jne(ready)?;
    a.cmp(qword_ptr(l.d_tag), 0)?;
    a.jne(library)?;
    a.lea(rsi, ptr(l.m_notready))?;
    a.jmp(l.fatal)?;

    a.set_label(&mut library)?;
    block_signals(a)?;
    d.mark(a, None)?;
    a.sub(rsp, 8)?;
    a.mov(edi, ARCH_GET_GS)?;
    a.mov(rsi, rsp)?;
    a.mov(eax, SYS_ARCH_PRCTL)?;
    a.syscall()?;
    a.pop(rax)?;
    a.test(rax, rax)?;
    a.jnz(has_gs)?;
    a.lea(rsi, ptr(l.m_early))?;
    a.jmp(l.fatal)?;
    a.set_label(&mut has_gs)?;
    a.mov(r15, qword_ptr(rax + S_REGION))?;
    a.mov(rcx, MAGIC)?;
    a.cmp(qword_ptr(r15 + H_MAGIC), rcx)?;
    a.je(mapped)?;
    a.lea(rsi, ptr(l.m_region))?;
    a.jmp(l.fatal)?;
    a.set_label(&mut mapped)?;
    a.mov(qword_ptr(l.d_region), r15)?;
    a.mov(rax, qword_ptr(r15 + H_FD))?;
    a.mov(qword_ptr(l.d_fd), rax)?;
    // Publish this blob's address under its image and tag (first writer
    // wins: a fork child has the same mappings): image 0's in the module
    // table, another image's (a program that exec'd) in the image
    // library table. A library dlclosed and opened again finds its entry
    // set: at the same address it goes on; at another one the trace
    // could not tell its two loads apart, so the program stops here,
    // before any of the second load's records.
    let mut table = a.create_label();
    a.mov(rdx, qword_ptr(l.d_tag))?;
    a.and(edx, (MAX_MODULES - 1) as i32)?;
    a.lea(rcx, ptr(l.init))?;
    a.mov(eax, dword_ptr(S_SERIAL).gs())?;
    a.test(eax, eax)?;
    a.jnz(table)?;
    a.lock()
        .cmpxchg(qword_ptr(r15 + rdx * 8 + H_MODULES as i32), rcx)?;
    a.je(published)?;
    a.cmp(rax, rcx)?;
    a.je(published)?;
    a.set_label(&mut l.rebased)?;
    a.lea(rsi, ptr(l.m_rebased))?;
    a.jmp(l.fatal)?;
    a.set_label(&mut table)?;
    emit_publish_image(a, l, published)?;
    a.set_label(&mut published)?;
    a.mov(dword_ptr(l.d_ready), 1)?;
    // A thread that owns its slot already (the usual case) keeps it (a
    // fork child still on its parent's slot claims its own).
    let (mut lib_owner, mut lib_claim) = (a.create_label(), a.create_label());
    a.mov(rax, qword_ptr(0u64).fs())?;
    a.cmp(rax, qword_ptr(S_OWNER).gs())?;
    a.je(lib_owner)?;
    emit_keep_if_clone_marked(a, lib_claim, done)?;
    a.set_label(&mut lib_claim)?;
    a.call(l.slot_index)?;
    a.mov(ebp, eax)?;
    a.mov(ebx, RecordKind::Thread as u32)?;
    a.call(l.claim)?;
    a.jmp(done)?;
    a.set_label(&mut lib_owner)?;
    emit_claim_fork_unless_owned(a, l, done)?;
    a.set_label(&mut done)?;
    restore_signals(a)?;
    d.mark(a, Some(FRAME))?;
    restore_all(a, &mut d)?;

    a.set_label(&mut ready)?;
    d.0.push((ready, Some(FRAME)));
    block_signals(a)?;
    d.mark(a, None)?;
    a.call(l.slot_index)?;
    a.mov(ebp, eax)?;
    a.cmp(ebp, u32::MAX)?;
    a.je(claim)?;
    // A handler that ran before signals were blocked here (or between
    // the stub's owner test and its call) attached this thread already;
    // or this is a fork child still on its parent's slot (the same TCB),
    // in a `pthread_atfork` child handler (the stub calls here while a
    // fork is in progress, `fork_prepare`).
    let mut owner = a.create_label();
    a.mov(rax, qword_ptr(0u64).fs())?;
    a.cmp(rax, qword_ptr(S_OWNER).gs())?;
    a.je(owner)?;
    let mut pretls = a.create_label();
    a.lea(rcx, ptr(l.d_pretls))?;
    a.cmp(qword_ptr(S_OWNER).gs(), rcx)?;
    a.je(pretls)?;
    emit_keep_if_clone_marked(a, claim, kept)?;
    a.set_label(&mut pretls)?;
    a.mov(eax, SYS_GETTID)?;
    a.syscall()?;
    a.cmp(dword_ptr(S_TID).gs(), eax)?;
    a.jne(claim)?;
    a.mov(rax, qword_ptr(0u64).fs())?;
    a.mov(qword_ptr(S_OWNER).gs(), rax)?;
    a.jmp(kept)?;
    a.set_label(&mut claim)?;
    a.mov(ebx, RecordKind::Thread as u32)?;
    a.call(l.claim)?;
    a.jmp(kept)?;
    a.set_label(&mut owner)?;
    emit_claim_fork_unless_owned(a, l, kept)?;
    a.set_label(&mut kept)?;
    leave_blocked(a, &mut l.windows, d, Caller::Stub)
}

/// Signals blocked, `fs:[0]` not the slot's OWNER: when OWNER is this
/// TCB's address with bit 0 set, the slot's thread has made a clone on a
/// stack of the child's own through untraced code (the rewriter marks it
/// so before libc's `syscall()`, `codegen`'s `own_stack_mark`), and the
/// child, on the same TCB (no CLONE_SETTLS) and still on this slot,
/// claims its own here at its first outside entry (THREAD, its stream
/// starting in untraced code) while the slot's own thread (its TID)
/// keeps the slot, mark and all: any of its clones' children may still
/// come. Jumps to `keep` for the slot's own thread, to `claim` otherwise.
/// Clobbers rax, rcx, r11.
fn emit_keep_if_clone_marked(
    a: &mut CodeAssembler,
    claim: CodeLabel,
    keep: CodeLabel,
) -> Result<(), IcedError> {
    a.mov(rax, qword_ptr(0u64).fs())?;
    a.or(rax, 1)?;
    a.cmp(rax, qword_ptr(S_OWNER).gs())?;
    a.jne(claim)?;
    a.mov(eax, SYS_GETTID)?;
    a.syscall()?;
    a.cmp(dword_ptr(S_TID).gs(), eax)?;
    a.jne(claim)?;
    a.jmp(keep)
}

/// The image library table's entry of this library in the image whose
/// serial is eax (not 0), tag in edx, this blob's address in rcx, the
/// region in r15 (layout, `H_IMAGE_LIBS`): the first free entry is claimed
/// with the key `serial << 32 | tag`, then given the address; an entry
/// with the key already must hold this address (waited for while its
/// claimer completes it), else the library was loaded again elsewhere.
/// Jumps to `published`; a full table stops the program.
fn emit_publish_image(
    a: &mut CodeAssembler,
    l: &mut Labels,
    published: CodeLabel,
) -> Result<(), IcedError> {
    let (mut next, mut mine, mut wait, mut lp) = (
        a.create_label(),
        a.create_label(),
        a.create_label(),
        a.create_label(),
    );
    a.shl(rax, 32)?;
    a.or(rdx, rax)?; // the key
    a.lea(r8, qword_ptr(r15 + H_IMAGE_LIBS))?;
    a.lea(r9, qword_ptr(r8 + (16 * IMAGE_LIBS) as i32))?;
    a.set_label(&mut lp)?;
    a.xor(eax, eax)?;
    a.lock().cmpxchg(qword_ptr(r8), rdx)?;
    a.jne(mine)?;
    a.mov(qword_ptr(r8 + 8), rcx)?;
    a.jmp(published)?;
    a.set_label(&mut mine)?;
    a.cmp(rax, rdx)?;
    a.jne(next)?;
    a.set_label(&mut wait)?;
    a.pause()?;
    a.mov(rax, qword_ptr(r8 + 8))?;
    a.test(rax, rax)?;
    a.jz(wait)?;
    a.cmp(rax, rcx)?;
    a.je(published)?;
    a.jmp(l.rebased)?;
    a.set_label(&mut next)?;
    a.add(r8, 16)?;
    a.cmp(r8, r9)?;
    a.jb(lp)?;
    a.lea(rsi, ptr(l.m_images_full))?;
    a.jmp(l.fatal)
}

/// `fork_child()`: called in a new task right after the call or system
/// call that created it returned 0; gives it its own slot: a process (a
/// fork or vfork child, or a `clone`/`clone3` child without CLONE_THREAD:
/// its thread id is its process id) with a FORK record, a thread (a
/// static libc's `clone3` for `pthread_create`) with a THREAD record.
///
/// A traced handler can run in a fork child before this call (libc's fork
/// returns with signals unblocked) or before it blocks signals:
/// `signal_entry` claims the child's slot then, and this call keeps it.
/// (glibc starts a thread with every signal blocked.)
fn emit_fork_child(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut process = a.create_label();
    let mut owned = a.create_label();
    let mut kept = a.create_label();
    let d = enter_blocked(a, &mut l.fork_child)?;
    a.mov(eax, SYS_GETPID)?;
    a.syscall()?;
    a.mov(ebx, eax)?;
    a.mov(eax, SYS_GETTID)?;
    a.syscall()?;
    a.cmp(eax, ebx)?;
    a.je(process)?;
    // A new thread: the slot `%gs` points at is its creator's.
    emit_claim_unless_owned(a, l, RecordKind::Thread, kept)?;
    a.set_label(&mut process)?;
    emit_claim_unless_owned(a, l, RecordKind::Fork, owned)?;
    a.set_label(&mut owned)?;
    // The child's only thread: a disposition lock another thread of the
    // parent held at the fork is nobody's here. (A vfork child clears its
    // parent's: at worst two swaps then overlap, never a hang.)
    a.mov(rax, qword_ptr(S_RUNTIME).gs())?;
    a.lea(rcx, ptr(l.init))?;
    a.sub(rax, rcx)?;
    a.lea(rcx, ptr(l.d_disp_lock))?;
    a.mov(dword_ptr(rax + rcx), 0)?;
    a.set_label(&mut kept)?;
    leave_blocked(a, &mut l.windows, d, Caller::Placed)
}

/// `fork_prepare()` (`delta` 1) and `fork_done()` (-1): the rewriter calls
/// them around each call to `fork` (not `vfork`: no atfork handlers, and
/// the child shares the parent's memory), `fork_done` in the parent, in
/// the child after `fork_child`, and after a failed fork. Between them
/// `ready` is above 1 in this blob and in the executable's (the slot's
/// RUNTIME), so the outside-entry stubs of those modules call
/// `attach_thread`, whose test of the thread id lets a `pthread_atfork`
/// child handler, which runs in the child before the fork returns (the
/// same TCB and `%gs` as its parent's thread), claim the child's slot
/// instead of writing into its parent's stream. `ready` is private to
/// each process (the blob's data page), so the child's copy and the
/// parent's are counted down apart; several threads may fork at once.
/// Signals are blocked from one `syscall` to the other, as in every
/// entry point (a signal outside that is reported at the caller).
fn emit_fork_window(a: &mut CodeAssembler, l: &mut Labels, delta: i32) -> Result<(), IcedError> {
    let mut exe = a.create_label();
    let label = if delta > 0 {
        &mut l.fork_prepare
    } else {
        &mut l.fork_done
    };
    let d = enter_blocked(a, label)?;
    a.lea(rax, ptr(l.d_ready))?;
    a.lock().add(dword_ptr(rax), delta)?;
    // The executable's blob too, when this is a library's (its data page
    // is mapped in this image, unlike a module table entry's may be).
    a.lea(rcx, ptr(l.init))?;
    a.mov(rdx, qword_ptr(S_RUNTIME).gs())?;
    a.cmp(rdx, rcx)?;
    a.je(exe)?;
    a.sub(rax, rcx)?;
    a.add(rax, rdx)?;
    a.lock().add(dword_ptr(rax), delta)?;
    a.set_label(&mut exe)?;
    leave_blocked(a, &mut l.windows, d, Caller::Placed)
}

/// Signals blocked: unless the slot `%gs` points at is this thread's own
/// (its TID), claims a new slot with a FORK record naming it (a fork or
/// vfork child still on its parent's slot), then jumps to `done`.
fn emit_claim_fork_unless_owned(
    a: &mut CodeAssembler,
    l: &mut Labels,
    done: CodeLabel,
) -> Result<(), IcedError> {
    a.mov(eax, SYS_GETTID)?;
    a.syscall()?;
    emit_claim_unless_owned(a, l, RecordKind::Fork, done)
}

/// [`emit_claim_fork_unless_owned`] with this thread's TID already in
/// eax, and the record `kind` (FORK, or THREAD for a thread a traced
/// clone started).
fn emit_claim_unless_owned(
    a: &mut CodeAssembler,
    l: &mut Labels,
    kind: RecordKind,
    done: CodeLabel,
) -> Result<(), IcedError> {
    a.cmp(dword_ptr(S_TID).gs(), eax)?;
    a.je(done)?;
    a.call(l.slot_index)?;
    a.mov(ebp, eax)?;
    a.mov(ebx, kind as u32)?;
    a.call(l.claim)?;
    a.jmp(done)
}

/// Bumps the header's "data ready" futex word (r15 = the region) and
/// wakes the recorder's drain loop sleeping on it. Clobbers rax, rcx,
/// rdx, rsi, rdi, r11.
fn wake_recorder(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.lock().add(dword_ptr(r15 + H_FUTEX), 1)?;
    a.lea(rdi, ptr(r15 + H_FUTEX))?;
    a.mov(esi, FUTEX_WAKE)?;
    a.mov(edx, i32::MAX as u32)?;
    a.mov(eax, SYS_FUTEX)?;
    a.syscall()?;
    Ok(())
}

/// Waits while the u32 at `word` holds `value`, r15 = the region:
/// futex waits of [`RECORDER_CHECK_SECS`], each followed by a check that
/// the recorder still exists (its pid is in the header; signal 0 only
/// checks). Jumps to `changed` once the word changed; falls through when
/// the recorder is gone. Clobbers rax, rcx, rdx, rsi, rdi, r10, r11.
fn wait_for_recorder(
    a: &mut CodeAssembler,
    l: &Labels,
    word: AsmMemoryOperand,
    value: u32,
    changed: CodeLabel,
) -> Result<(), IcedError> {
    let mut wait = a.create_label();
    a.set_label(&mut wait)?;
    a.cmp(dword_ptr(word), value)?;
    a.jne(changed)?;
    a.lea(rdi, word)?;
    a.mov(esi, FUTEX_WAIT)?;
    a.mov(edx, value)?;
    a.lea(r10, ptr(l.t_wait))?;
    a.mov(eax, SYS_FUTEX)?;
    a.syscall()?;
    a.cmp(eax, -ETIMEDOUT)?;
    a.jne(wait)?;
    a.mov(edi, dword_ptr(r15 + H_PID))?;
    a.xor(esi, esi)?;
    a.mov(eax, SYS_KILL)?;
    a.syscall()?;
    a.cmp(eax, -ESRCH)?;
    a.jne(wait)
}

/// `flush()`: the buffer check found `POS >= LIMIT`. Signals are blocked
/// from its first `syscall` to its last; its [`Depths`] mark where its
/// return address is before and after (module doc).
fn emit_flush(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut standalone = a.create_label();
    let mut free = a.create_label();
    let mut done = a.create_label();
    let mut bad_write = a.create_label();
    let mut orphan = a.create_label();
    let d = enter_blocked(a, &mut l.flush)?;
    a.mov(rbx, qword_ptr(S_BASE).gs())?;
    a.mov(r15, qword_ptr(l.d_region))?;
    a.mov(r12, qword_ptr(r15 + H_HALF_SIZE))?;
    a.test(dword_ptr(r15 + H_FLAGS), FLAG_STANDALONE)?;
    a.jnz(standalone)?;

    a.test(dword_ptr(r15 + H_FLAGS), FLAG_RECORDER_GONE)?;
    a.jnz(orphan)?;

    // Recorder: seal the current half, wake the recorder, take the other.
    a.mov(r13d, dword_ptr(rbx + S_CUR_HALF))?;
    a.mov(rax, r13)?;
    a.imul_2(rax, r12)?;
    a.lea(rdx, qword_ptr(rbx + rax + SLOT_HEADER_SIZE as i32))?;
    a.mov(rax, qword_ptr(rbx + S_POS))?;
    a.sub(rax, rdx)?;
    a.mov(qword_ptr(rbx + r13 * 8 + S_HALF_FILL as i32), rax)?;
    // x86 stores are ordered: the fill is visible before the state.
    a.mov(dword_ptr(rbx + r13 * 4 + S_HALF_STATE as i32), HALF_FULL)?;
    a.add(qword_ptr(rbx + S_SEQ), 1)?;
    wake_recorder(a)?;
    a.xor(r13d, 1)?;
    // A recorder that died never empties the half: stop rather than wait
    // for ever. (The half is FULL or EMPTY.)
    let half = ptr(rbx + r13 * 4 + S_HALF_STATE as i32);
    wait_for_recorder(a, l, half, HALF_FULL, free)?;
    // Gone: the program runs on as it would, its witnesses dropped from
    // here on. The first thread to find out says so (bts: CF = old bit).
    a.lock().bts(
        dword_ptr(r15 + H_FLAGS),
        FLAG_RECORDER_GONE.trailing_zeros(),
    )?;
    a.jc(orphan)?;
    a.mov(edi, 2u32)?;
    a.lea(rsi, ptr(l.m_gone))?;
    a.mov(edx, GONE_MESSAGE.len() as u32)?;
    a.mov(eax, SYS_WRITE)?;
    a.syscall()?;
    // Without a recorder the current half is written over from its start.
    a.set_label(&mut orphan)?;
    a.mov(r13d, dword_ptr(rbx + S_CUR_HALF))?;
    a.set_label(&mut free)?;
    a.mov(dword_ptr(rbx + S_CUR_HALF), r13d)?;
    a.mov(rax, r13)?;
    a.imul_2(rax, r12)?;
    a.lea(rdx, qword_ptr(rbx + rax + SLOT_HEADER_SIZE as i32))?;
    a.lea(rax, qword_ptr(rdx + r12 - HEADROOM as i32))?;
    a.mov(qword_ptr(rbx + S_LIMIT), rax)?;
    a.mov(qword_ptr(rbx + S_POS), rdx)?;
    a.jmp(done)?;

    // Standalone: append the half to the file as a chunk, zero it, reuse it.
    a.set_label(&mut standalone)?;
    a.lea(r14, qword_ptr(rbx + SLOT_HEADER_SIZE))?; // half start
    a.mov(r13, qword_ptr(rbx + S_POS))?;
    a.sub(r13, r14)?; // fill
    a.lea(rbp, qword_ptr(r12 + CHUNK_HEADER_SIZE))?;
    a.lock().xadd(qword_ptr(r15 + H_FILE_END), rbp)?; // rbp = chunk offset
                                                      // Data first, header last: the header marks the chunk complete.
    a.mov(rdi, qword_ptr(l.d_fd))?;
    a.mov(rsi, r14)?;
    a.mov(rdx, r13)?;
    a.lea(r10, qword_ptr(rbp + CHUNK_HEADER_SIZE))?;
    a.mov(eax, SYS_PWRITE64)?;
    a.syscall()?;
    a.cmp(rax, r13)?;
    a.jne(bad_write)?;
    a.sub(rsp, CHUNK_HEADER_SIZE as i32)?;
    a.mov(dword_ptr(rsp + C_MAGIC), CHUNK_MAGIC)?;
    a.call(l.slot_index)?;
    a.mov(dword_ptr(rsp + C_SLOT), eax)?;
    a.mov(rax, qword_ptr(rbx + S_SEQ))?;
    a.mov(qword_ptr(rsp + C_SEQ), rax)?;
    a.mov(qword_ptr(rsp + C_LEN), r13)?;
    a.mov(eax, dword_ptr(rbx + S_PID))?;
    a.mov(dword_ptr(rsp + C_PID), eax)?;
    a.mov(eax, dword_ptr(rbx + S_TID))?;
    a.mov(dword_ptr(rsp + C_TID), eax)?;
    a.mov(rdi, qword_ptr(l.d_fd))?;
    a.mov(rsi, rsp)?;
    a.mov(edx, CHUNK_HEADER_SIZE as u32)?;
    a.mov(r10, rbp)?;
    a.mov(eax, SYS_PWRITE64)?;
    a.syscall()?;
    a.add(rsp, CHUNK_HEADER_SIZE as i32)?;
    a.cmp(rax, CHUNK_HEADER_SIZE as i32)?;
    a.jne(bad_write)?;
    // Zero and rewind before bumping SEQ: a reader that finds a chunk
    // numbered SEQ knows the half in the region is stale.
    a.mov(rdi, r14)?;
    a.mov(rcx, r13)?;
    a.xor(eax, eax)?;
    a.rep().stosb()?;
    a.mov(qword_ptr(rbx + S_POS), r14)?;
    a.add(qword_ptr(rbx + S_SEQ), 1)?;
    a.jmp(done)?;
    a.set_label(&mut bad_write)?;
    a.lea(rsi, ptr(l.m_write))?;
    a.jmp(l.fatal)?;
    a.set_label(&mut done)?;
    leave_blocked(a, &mut l.windows, d, Caller::Placed)
}

/// Internal `claim`: ebx = record kind (THREAD/FORK), ebp = parent slot.
/// Claims the first free slot (CAS FREE->ACTIVE, or RELEASED->ACTIVE when
/// the slot's kept `S_PID` is this process), fills it, sets %gs and
/// writes `[0xFF][kind][parent u32]` as the stream's first record.
/// It sets OWNER, BASE, REGION, PARENT, TID, PID, CUR_HALF, RUNTIME,
/// LIMIT and POS; the rest (the halves' state and fill, SEQ, XFERS, the
/// data) it takes as the recorder left them: zero in a slot never
/// claimed, and reset by `Drainer::reclaim` before it releases one.
/// Clobbers everything but rsp; signals must be blocked.
fn emit_claim(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut lp = a.create_label();
    let mut got = a.create_label();
    let mut exhausted = a.create_label();
    let mut next = a.create_label();
    let mut scan = a.create_label();
    let mut stop = a.create_label();
    let mut quiet = a.create_label();
    a.set_label(&mut l.claim)?;
    // The pid first (the syscall clobbers rcx): a slot the recorder
    // released while its process runs is this process's only (layout,
    // `SLOT_RELEASED`).
    a.mov(eax, SYS_GETPID)?;
    a.syscall()?;
    a.mov(r9d, eax)?;
    a.xor(r12d, r12d)?; // waits so far
    a.set_label(&mut scan)?;
    a.mov(r15, qword_ptr(l.d_region))?;
    a.mov(ecx, dword_ptr(r15 + H_SLOT_COUNT))?;
    a.mov(rsi, qword_ptr(r15 + H_SLOT_SIZE))?;
    a.lea(r14, qword_ptr(r15 + HEADER_SIZE))?;
    a.xor(edx, edx)?;
    a.mov(r8d, SLOT_ACTIVE)?;
    a.set_label(&mut lp)?;
    a.cmp(edx, ecx)?;
    a.jae(exhausted)?;
    a.xor(eax, eax)?;
    a.lock().cmpxchg(dword_ptr(r14 + S_STATE), r8d)?;
    a.je(got)?;
    // eax = the state seen. The recorder keeps S_PID while the slot is
    // RELEASED, and a claim changes it only after its own cmpxchg.
    a.cmp(eax, SLOT_RELEASED)?;
    a.jne(next)?;
    a.cmp(dword_ptr(r14 + S_PID), r9d)?;
    a.jne(next)?;
    a.lock().cmpxchg(dword_ptr(r14 + S_STATE), r8d)?;
    a.je(got)?;
    a.set_label(&mut next)?;
    a.add(r14, rsi)?;
    a.inc(edx)?;
    a.jmp(lp)?;
    // None: with a recorder, wake it (it drains and reclaims at once
    // when a pass is due), sleep a millisecond and look again.
    a.set_label(&mut exhausted)?;
    a.test(dword_ptr(r15 + H_FLAGS), FLAG_STANDALONE)?;
    a.jnz(stop)?;
    a.inc(r12d)?;
    a.cmp(r12d, SLOT_WAITS)?;
    a.ja(stop)?;
    wake_recorder(a)?;
    a.lea(rdi, ptr(l.t_slot_wait))?;
    a.xor(esi, esi)?;
    a.mov(eax, SYS_NANOSLEEP)?;
    a.syscall()?;
    a.jmp(scan)?;
    a.set_label(&mut stop)?;
    // The first thread to give up says so and stops the process; others
    // that give up at the same time sleep until it has (one line).
    const { assert!(FLAG_SLOTS_EXHAUSTED == 1 << 1) };
    a.lock().bts(dword_ptr(r15 + H_FLAGS), 1)?;
    a.jc(quiet)?;
    a.lea(rsi, ptr(l.m_slots))?;
    a.jmp(l.fatal)?;
    a.set_label(&mut quiet)?;
    a.lea(rdi, ptr(l.t_wait))?;
    a.xor(esi, esi)?;
    a.mov(eax, SYS_NANOSLEEP)?;
    a.syscall()?;
    a.jmp(quiet)?;
    a.set_label(&mut got)?;
    a.mov(rax, qword_ptr(0u64).fs())?;
    a.mov(qword_ptr(r14 + S_OWNER), rax)?;
    a.mov(qword_ptr(r14 + S_BASE), r14)?;
    a.mov(qword_ptr(r14 + S_REGION), r15)?;
    a.mov(dword_ptr(r14 + S_PARENT), ebp)?;
    a.mov(eax, SYS_GETTID)?;
    a.syscall()?;
    a.mov(dword_ptr(r14 + S_TID), eax)?;
    a.mov(dword_ptr(r14 + S_PID), r9d)?;
    a.mov(dword_ptr(r14 + S_CUR_HALF), 0)?;
    // The blob's run-time start (init is at offset 0): the recorder learns
    // this process's load bias from it. Stored before POS, which the
    // drainer reads first.
    // A slot claimed from another slot (a thread, a fork child) inherits
    // its RUNTIME and IMAGE: a library's runtime can claim one, and
    // `signal_entry` looks for the executable's there.
    // The first slot of a process image takes the image's SERIAL.
    let (mut own, mut image) = (a.create_label(), a.create_label());
    a.cmp(ebp, u32::MAX)?;
    a.je(own)?;
    a.mov(rax, qword_ptr(S_RUNTIME).gs())?;
    a.mov(qword_ptr(r14 + S_RUNTIME), rax)?;
    a.mov(eax, dword_ptr(S_SERIAL).gs())?;
    a.mov(dword_ptr(r14 + S_SERIAL), eax)?;
    a.mov(rax, qword_ptr(S_IMAGE).gs())?;
    a.jmp(image)?;
    a.set_label(&mut own)?;
    a.lea(rax, ptr(l.init))?;
    a.mov(qword_ptr(r14 + S_RUNTIME), rax)?;
    a.mov(eax, 1)?;
    a.lock().xadd(dword_ptr(r15 + H_IMAGES), eax)?;
    a.mov(dword_ptr(r14 + S_SERIAL), eax)?;
    a.mov(rax, qword_ptr(l.d_image))?;
    a.set_label(&mut image)?;
    a.mov(qword_ptr(r14 + S_IMAGE), rax)?;
    a.mov(rax, qword_ptr(r15 + H_HALF_SIZE))?;
    a.lea(rdx, qword_ptr(r14 + SLOT_HEADER_SIZE))?;
    a.lea(rax, qword_ptr(rdx + rax - HEADROOM as i32))?;
    a.mov(qword_ptr(r14 + S_LIMIT), rax)?;
    a.mov(qword_ptr(r14 + S_POS), rdx)?;
    a.mov(edi, ARCH_SET_GS)?;
    a.mov(rsi, r14)?;
    a.mov(eax, SYS_ARCH_PRCTL)?;
    a.syscall()?;
    // First record: payload, then kind last (same protocol as emit_record).
    a.mov(eax, RecordKind::Thread.encoded_len() as u32)?;
    a.xadd(qword_ptr(S_POS).gs(), rax)?;
    a.mov(word_ptr(rax), ESCAPE as u32 | (KIND_PENDING as u32) << 8)?;
    a.mov(dword_ptr(rax + 2), ebp)?;
    a.mov(byte_ptr(rax + 1), bl)?;
    a.ret()
}

/// `find_region`'s buffers: a path at [rsp], a link's or stat's text at
/// [rsp + BUF], each this long.
const BUF: i32 = 256;

/// `find_region() -> rax` (r14 its size), or 0: the region of the nearest
/// ancestor that publishes one (`layout::REGION_FD`): walks up from the
/// parent through `/proc/PID/stat`, and at each ancestor maps
/// `/proc/PID/fd/REGION_FD` when that is the region's memfd (`readlink`,
/// so nothing else an ancestor holds is ever opened), has the layout
/// (`map_fd`) and names PID as its creator. The mapping
/// keeps no descriptor. Clobbers every register but r13.
///
/// `map_fd(rdi = fd) -> rax` (r14 its size), or 0: the fd's file mapped
/// shared when it holds a region of this layout version.
///
/// `proc_path(rdi = buffer, esi = pid, rdx = suffix)`: writes
/// `/proc/<pid><suffix>` NUL-terminated. Clobbers rax, rcx, rdx, rdi, r8-r10.
fn emit_find_region(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut walk = a.create_label();
    let mut parent = a.create_label();
    let mut found = a.create_label();
    let mut none = a.create_label();
    a.set_label(&mut l.find_region)?;
    // Path at [rsp], link or stat text at [rsp+BUF], slack for the scan.
    a.sub(rsp, 2 * BUF + 32)?;
    a.mov(eax, SYS_GETPPID)?;
    a.syscall()?;
    a.mov(ebp, eax)?;
    a.mov(ebx, MAX_ANCESTORS)?;
    a.set_label(&mut walk)?;
    a.test(ebp, ebp)?;
    a.jle(none)?;
    a.dec(ebx)?;
    a.js(none)?;
    proc_path(a, l, l.s_fd_path)?;
    a.mov(rdi, rsp)?;
    a.lea(rsi, ptr(rsp + BUF))?;
    a.mov(edx, (BUF - 1) as u32)?;
    a.mov(eax, SYS_READLINK)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jle(parent)?;
    a.mov(byte_ptr(rsp + rax + BUF), 0)?;
    a.lea(rdi, ptr(l.s_memfd))?;
    a.lea(rsi, ptr(rsp + BUF))?;
    a.call(l.prefix)?;
    a.test(rax, rax)?;
    a.jz(parent)?;
    a.cmp(byte_ptr(rax), 0)?;
    a.jne(parent)?;
    a.mov(rdi, rsp)?;
    a.mov(esi, O_RDWR_CLOEXEC)?;
    a.xor(edx, edx)?;
    a.mov(eax, SYS_OPEN)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.js(parent)?;
    a.mov(r12, rax)?;
    a.mov(rdi, rax)?;
    a.call(l.map_fd)?;
    a.mov(r15, rax)?;
    a.mov(rdi, r12)?;
    a.mov(eax, SYS_CLOSE)?;
    a.syscall()?;
    a.test(r15, r15)?;
    a.jz(parent)?;
    a.cmp(dword_ptr(r15 + H_PID), ebp)?;
    a.je(found)?;
    a.mov(rdi, r15)?;
    a.mov(rsi, r14)?;
    a.mov(eax, SYS_MUNMAP)?;
    a.syscall()?;

    a.set_label(&mut parent)?;
    next_ancestor(a, l, walk, none)?;

    a.set_label(&mut found)?;
    a.mov(rax, r15)?;
    a.add(rsp, 2 * BUF + 32)?;
    a.ret()?;
    a.set_label(&mut none)?;
    a.xor(eax, eax)?;
    a.add(rsp, 2 * BUF + 32)?;
    a.ret()?;

    emit_map_fd(a, l)?;
    emit_proc_path(a, l)
}

/// `find_region`'s step to the parent of the pid in ebp: the number after
/// the last `)` of `/proc/PID/stat` (`pid (comm) S ppid ...`; a command
/// name may hold `)`), then on to `walk`; `none` when it cannot be read.
fn next_ancestor(
    a: &mut CodeAssembler,
    l: &Labels,
    walk: CodeLabel,
    none: CodeLabel,
) -> Result<(), IcedError> {
    let mut scan = a.create_label();
    let mut digits = a.create_label();
    proc_path(a, l, l.s_stat)?;
    a.mov(rdi, rsp)?;
    a.mov(esi, O_RDONLY_CLOEXEC)?;
    a.xor(edx, edx)?;
    a.mov(eax, SYS_OPEN)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.js(none)?;
    a.mov(r12, rax)?;
    a.mov(rdi, rax)?;
    a.lea(rsi, ptr(rsp + BUF))?;
    a.mov(edx, (BUF - 1) as u32)?;
    a.mov(eax, SYS_READ)?;
    a.syscall()?;
    a.mov(r15, rax)?;
    a.mov(rdi, r12)?;
    a.mov(eax, SYS_CLOSE)?;
    a.syscall()?;
    a.test(r15, r15)?;
    a.jle(none)?;
    a.mov(byte_ptr(rsp + r15 + BUF), 0)?;
    a.lea(rsi, ptr(rsp + r15 + BUF))?;
    a.lea(rdx, ptr(rsp + BUF))?;
    a.set_label(&mut scan)?;
    a.dec(rsi)?;
    a.cmp(rsi, rdx)?;
    a.jb(none)?;
    a.cmp(byte_ptr(rsi), b')' as i32)?;
    a.jne(scan)?;
    a.add(rsi, 4)?; // past ") S "
    a.xor(ebp, ebp)?;
    a.set_label(&mut digits)?;
    a.movzx(ecx, byte_ptr(rsi))?;
    a.sub(ecx, b'0' as i32)?;
    a.cmp(ecx, 9)?;
    a.ja(walk)?;
    a.imul_3(ebp, ebp, 10)?;
    a.add(ebp, ecx)?;
    a.inc(rsi)?;
    a.jmp(digits)
}

/// `proc_path(buffer at rsp, pid in ebp, suffix)`, in `find_region`.
fn proc_path(a: &mut CodeAssembler, l: &Labels, suffix: CodeLabel) -> Result<(), IcedError> {
    a.mov(rdi, rsp)?;
    a.mov(esi, ebp)?;
    a.lea(rdx, ptr(suffix))?;
    a.call(l.proc_path)
}

fn emit_proc_path(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut copy = a.create_label();
    a.set_label(&mut l.proc_path)?;
    a.mov(dword_ptr(rdi), u32::from_le_bytes(*b"/pro"))?;
    a.mov(word_ptr(rdi + 4), u32::from(u16::from_le_bytes(*b"c/")))?;
    a.add(rdi, 6)?;
    a.mov(r10, rdx)?;
    a.call(l.view.put_dec)?;
    a.set_label(&mut copy)?;
    a.mov(al, byte_ptr(r10))?;
    a.mov(byte_ptr(rdi), al)?;
    a.inc(rdi)?;
    a.inc(r10)?;
    a.test(al, al)?;
    a.jnz(copy)?;
    a.ret()
}

fn emit_map_fd(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut unmap = a.create_label();
    let mut fail = a.create_label();
    a.set_label(&mut l.map_fd)?;
    a.mov(r8, rdi)?;
    a.sub(rsp, 144)?; // struct stat
    a.mov(rsi, rsp)?;
    a.mov(eax, SYS_FSTAT)?;
    a.syscall()?;
    a.mov(r14, qword_ptr(rsp + 48))?; // st_size
    a.add(rsp, 144)?;
    a.test(rax, rax)?;
    a.jnz(fail)?;
    a.cmp(r14, HEADER_SIZE as i32)?;
    a.jb(fail)?;
    a.mov(rdi, REGION_HINT)?;
    a.mov(rsi, r14)?;
    a.mov(edx, 3u32)?; // PROT_READ|PROT_WRITE
    a.mov(r10d, 1u32)?; // MAP_SHARED
    a.xor(r9d, r9d)?;
    a.mov(eax, SYS_MMAP)?;
    a.syscall()?;
    a.cmp(rax, -4096)?;
    a.ja(fail)?;
    a.mov(rcx, MAGIC)?;
    a.cmp(qword_ptr(rax + H_MAGIC), rcx)?;
    a.jne(unmap)?;
    a.cmp(dword_ptr(rax + H_VERSION), VERSION)?;
    a.jne(unmap)?;
    a.cmp(qword_ptr(rax + H_REGION_SIZE), r14)?;
    a.ja(unmap)?;
    a.ret()?;
    a.set_label(&mut unmap)?;
    a.mov(rdi, rax)?;
    a.mov(rsi, r14)?;
    a.mov(eax, SYS_MUNMAP)?;
    a.syscall()?;
    a.set_label(&mut fail)?;
    a.xor(eax, eax)?;
    a.ret()
}

fn emit_helpers(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    // prefix(rdi = NUL-terminated needle, rsi = string) -> rax = string
    // after the needle, or 0. Clobbers rcx, rdx.
    let mut matched = a.create_label();
    let mut nomatch = a.create_label();
    a.set_label(&mut l.prefix)?;
    a.movzx(ecx, byte_ptr(rdi))?;
    a.test(cl, cl)?;
    a.jz(matched)?;
    a.cmp(cl, byte_ptr(rsi))?;
    a.jne(nomatch)?;
    a.inc(rdi)?;
    a.inc(rsi)?;
    a.jmp(l.prefix)?;
    a.set_label(&mut matched)?;
    a.mov(rax, rsi)?;
    a.ret()?;
    a.set_label(&mut nomatch)?;
    a.xor(eax, eax)?;
    a.ret()?;

    // parse_dec(rax = string) -> rax = value, or -1 if not all decimal digits.
    let mut dloop = a.create_label();
    let mut ddone = a.create_label();
    let mut dbad = a.create_label();
    a.set_label(&mut l.parse_dec)?;
    a.mov(rsi, rax)?;
    a.xor(eax, eax)?;
    a.cmp(byte_ptr(rsi), 0)?;
    a.je(dbad)?;
    a.set_label(&mut dloop)?;
    a.movzx(ecx, byte_ptr(rsi))?;
    a.test(ecx, ecx)?;
    a.jz(ddone)?;
    a.sub(ecx, b'0' as i32)?;
    a.cmp(ecx, 9)?;
    a.ja(dbad)?;
    a.imul_3(rax, rax, 10)?;
    a.add(rax, rcx)?;
    a.inc(rsi)?;
    a.jmp(dloop)?;
    a.set_label(&mut dbad)?;
    a.mov(rax, -1i64)?;
    a.set_label(&mut ddone)?;
    a.ret()?;

    // fatal(rsi = NUL-terminated message): write it to stderr, exit_group.
    let mut fl = a.create_label();
    let mut fdone = a.create_label();
    a.set_label(&mut l.fatal)?;
    a.xor(edx, edx)?;
    a.set_label(&mut fl)?;
    a.cmp(byte_ptr(rsi + rdx), 0)?;
    a.je(fdone)?;
    a.inc(rdx)?;
    a.jmp(fl)?;
    a.set_label(&mut fdone)?;
    a.mov(edi, 2u32)?;
    a.mov(eax, SYS_WRITE)?;
    a.syscall()?;
    a.mov(edi, FATAL_STATUS)?;
    a.mov(eax, SYS_EXIT_GROUP)?;
    a.syscall()?;
    a.ud2()?;

    // slot_index() -> eax = index of the slot %gs points at, or u32::MAX
    // when %gs is not inside the region. Clobbers rcx, rdx, rdi, rsi, r11.
    let mut none = a.create_label();
    a.set_label(&mut l.slot_index)?;
    a.sub(rsp, 8)?;
    a.mov(edi, ARCH_GET_GS)?;
    a.mov(rsi, rsp)?;
    a.mov(eax, SYS_ARCH_PRCTL)?;
    a.syscall()?;
    a.pop(rax)?;
    a.mov(rcx, qword_ptr(l.d_region))?;
    a.lea(rdx, qword_ptr(rcx + HEADER_SIZE))?;
    a.sub(rax, rdx)?;
    a.jb(none)?;
    a.xor(edx, edx)?;
    a.div(qword_ptr(rcx + H_SLOT_SIZE))?;
    a.cmp(eax, dword_ptr(rcx + H_SLOT_COUNT))?;
    a.jae(none)?;
    a.ret()?;
    a.set_label(&mut none)?;
    a.mov(eax, u32::MAX)?;
    a.ret()
}

/// `map_caller`, called by `signal_entry` (signals blocked): first, a rip
/// in glibc's restorer is replaced by the context that restorer returns
/// to, and that context's stores are completed (`fixup`). Then, when the
/// interrupted rip (r14) is in a runtime blob of this process, in an entry
/// point where signals are not blocked ([`Labels::windows`]), replaces it
/// with that entry point's return address, its caller: the point right
/// after a buffer check's `call flush` or a fork's `call fork_child` (the
/// module's signal map places both), or in an outside-entry stub before
/// its ENTER (untraced). A stub that is a signal handler's (its own return
/// address is glibc's restorer) has not written that handler's SIGNAL yet
/// when it calls `attach_thread` or while `signal_entry` has not blocked
/// signals: the second signal is then reported where the first one
/// interrupted the thread ([`Caller::Handler`]), which is resolved,
/// completed and mapped in turn.
/// The handler still returns into the runtime; only the reported rip
/// changes.
///
/// Every blob is the same code (only its data page differs), so the rip
/// is tried against this blob's labels after moving it by the distance
/// between this blob and each blob of the process: this one, the one that
/// claimed the slot (`S_RUNTIME`, the executable's) and the libraries'
/// (the region's module table), since a handler of one module can
/// interrupt another module's runtime. The code bytes at the rip must
/// equal this blob's at the moved address (a module table entry left by
/// an image before an exec, or a blob of another aetrace version, is not
/// taken for this code). r13 = the saved gregs. Clobbers every register
/// but r12 and rsp.
///
/// r14 is the rip of a context about to execute its instruction, so the
/// bytes of that instruction are readable (unless an instruction fetch
/// there faulted: not read then), and so is the first instruction a `jmp
/// rel32` there leads to.
fn emit_map_caller(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let windows = &l.windows;
    debug_assert!(windows.iter().all(|(d, _)| d.0.len() >= 2));
    let last = &windows[windows.len() - 1].0 .0;
    let (first, end) = (windows[0].0 .0[0].0, last[last.len() - 1].0);
    let mut try_base = a.create_label();
    let mut next_base = a.create_label();
    let mut table = a.create_label();
    let mut done = a.create_label();
    let mut outer = a.create_label();
    a.set_label(&mut l.map_caller)?;
    in_sigreturn_prologue(a, l)?;
    // A signal in glibc's restorer (`mov rax, 15` at +0, `syscall` at +7:
    // signal_entry's pretcode, [rsp+152] there, the restorer every glibc
    // handler returns through) came after an earlier handler had returned
    // and before its `rt_sigreturn`: the thread is, for the trace, where
    // that handler returns to. Report that context (its ucontext is at
    // the restorer's rsp) instead of an untraced rip that regen cannot
    // tell from other untraced code (docs/regen.md section 3a); as often
    // as restorers interrupted restorers.
    // The same for the executable's `fault_restorer` (glibc's bytes),
    // where a handler's context is sent when `sigreturn` is interrupted
    // before it blocked signals (below).
    let mut restored = a.create_label();
    let mut not_restorer = a.create_label();
    a.mov(rax, qword_ptr(rsp + 152 + 8))?;
    a.cmp(r14, rax)?;
    a.je(restored)?;
    a.add(rax, 7)?;
    a.cmp(r14, rax)?;
    a.je(restored)?;
    runtime_addr(a, l, l.fault_restorer, rax)?;
    a.cmp(r14, rax)?;
    a.je(restored)?;
    a.add(rax, 7)?;
    a.cmp(r14, rax)?;
    a.jne(not_restorer)?;
    a.set_label(&mut restored)?;
    a.mov(rax, qword_ptr(r13 + 15 * 8))?;
    a.lea(r13, ptr(rax + 40))?;
    a.mov(r14, qword_ptr(r13 + 16 * 8))?;
    a.jmp(l.map_caller)?;
    a.set_label(&mut not_restorer)?;
    a.call(l.fixup)?;
    // r9: the rip, as an instruction of a handler's stub. A handler's
    // address is often its procedure's original entry, whose springboard
    // (`jmp rel32`) leads to the stub: its target then.
    // 0: no stub to look for. A rip equal to the context's CR2 (the
    // address of the last fault that raised a signal in the thread) may
    // be unmapped: an instruction fetch fault. Its bytes are not read.
    let mut direct = a.create_label();
    a.xor(r9d, r9d)?;
    a.cmp(r14, qword_ptr(r13 + 22 * 8))?;
    a.je(direct)?;
    a.mov(r9, r14)?;
    a.cmp(byte_ptr(r14), 0xE9)?;
    a.jne(direct)?;
    a.movsxd(rax, dword_ptr(r14 + 1))?;
    a.lea(r9, ptr(r14 + rax + 5))?;
    a.set_label(&mut direct)?;
    a.lea(rdi, ptr(l.init))?; // this blob
    a.mov(rbx, rdi)?;
    a.mov(r8, qword_ptr(l.d_region))?;
    a.xor(ecx, ecx)?; // 0: this blob, 1: S_RUNTIME, 2..: module table entries 1..
    a.set_label(&mut try_base)?;
    // An instruction of an outside-entry stub of base rbx's module before
    // its `call signal_entry` ([`STUB_INSNS`]; at the first one, also the
    // springboard to it), running as a signal handler ([rsp] points at
    // the restorer): two signals delivered at once, or a second one while
    // the first handler's stub runs. That handler's SIGNAL is not written.
    // A stub is recognised by its first instruction, `cmp dword
    // [rip+ready], 1` (83 3D disp32 01) naming rbx's `ready`, and its
    // `call signal_entry` naming rbx's. At the first instruction that is
    // the rip's own (readable); at a later one the stub's start is read
    // only inside rbx's instrumented code (its `witness_code_start..end`),
    // and only for this blob and the slot's `RUNTIME` (the executable's),
    // whose data pages are mapped in this image: a module table entry
    // may be left by an image before an exec.
    let mut not_stub = a.create_label();
    let mut stub_k = a.create_label();
    let mut check_k = a.create_label();
    let mut next_k = a.create_label();
    let mut stub_found = a.create_label();
    let call = STUB_INSNS[STUB_INSNS.len() - 1] as i32;
    a.test(r9, r9)?;
    a.jz(not_stub)?;
    a.xor(ebp, ebp)?; // k: the rip is the stub's instruction k
    a.mov(rsi, r9)?;
    a.jmp(check_k)?;
    a.set_label(&mut stub_k)?;
    a.cmp(ecx, 1)?;
    a.ja(not_stub)?;
    a.lea(rdx, ptr(l.d_win_lo))?;
    a.sub(rdx, rdi)?;
    a.add(rdx, rbx)?;
    a.mov(r10, qword_ptr(rdx))?;
    a.test(r10, r10)?;
    a.jz(not_stub)?;
    a.mov(r11, qword_ptr(rdx + (D_WIN_HI - D_WIN_LO) as i32))?;
    a.add(r10, rbx)?;
    a.add(r11, rbx)?;
    a.sub(r11, call + 5)?; // the last address a whole stub prefix fits at
    a.lea(rax, ptr(l.stub_insns))?;
    a.movzx(eax, byte_ptr(rax + rbp))?;
    a.mov(rsi, r9)?;
    a.sub(rsi, rax)?; // where the stub would start
    a.cmp(rsi, r10)?;
    a.jb(next_k)?;
    a.cmp(rsi, r11)?;
    a.ja(next_k)?;
    a.set_label(&mut check_k)?;
    a.cmp(word_ptr(rsi), 0x3D83)?;
    a.jne(next_k)?;
    a.cmp(byte_ptr(rsi + 6), 1)?;
    a.jne(next_k)?;
    a.movsxd(rax, dword_ptr(rsi + 2))?;
    a.lea(rax, ptr(rsi + rax + 7))?;
    a.lea(rdx, ptr(l.d_ready))?;
    a.sub(rdx, rdi)?;
    a.add(rdx, rbx)?;
    a.cmp(rax, rdx)?;
    a.jne(next_k)?;
    // A stub of rbx's module: its whole prefix is mapped.
    a.cmp(byte_ptr(rsi + call), 0xE8)?;
    a.jne(next_k)?;
    a.movsxd(rax, dword_ptr(rsi + call + 1))?;
    a.lea(rax, ptr(rsi + rax + (call + 5)))?;
    a.lea(rdx, ptr(l.signal_entry))?;
    a.sub(rdx, rdi)?;
    a.add(rdx, rbx)?;
    a.cmp(rax, rdx)?;
    a.je(stub_found)?;
    a.set_label(&mut next_k)?;
    a.inc(ebp)?;
    a.cmp(ebp, STUB_INSNS.len() as u32)?;
    a.jb(stub_k)?;
    a.jmp(not_stub)?;
    a.set_label(&mut stub_found)?;
    // A handler's stub runs with the kernel's rdx = &uc = rsp + 8; a stub
    // entered by a jump may have anything at [rsp]: read through it only
    // then (as the stub itself does). rax: the interrupted rsp.
    a.mov(rax, qword_ptr(r13 + 15 * 8))?;
    a.lea(rdx, ptr(rax + 8))?;
    a.cmp(rdx, qword_ptr(r13 + 12 * 8))?; // the interrupted rdx
    a.jne(not_stub)?;
    a.mov(rdx, qword_ptr(rax))?;
    a.mov(rdx, qword_ptr(rdx))?;
    a.cmp(rdx, qword_ptr(l.restorer))?;
    a.jne(not_stub)?;
    a.sub(rax, 8)?; // as if a call into the stub had pushed a return address
    a.jmp(outer)?;
    a.set_label(&mut not_stub)?;
    a.mov(rsi, r14)?;
    a.sub(rsi, rbx)?;
    a.add(rsi, rdi)?;
    a.lea(rax, ptr(first))?;
    a.cmp(rsi, rax)?;
    a.jb(next_base)?;
    a.lea(rax, ptr(end))?;
    a.cmp(rsi, rax)?;
    a.jae(next_base)?;
    a.mov(rax, qword_ptr(r14))?;
    a.cmp(rax, qword_ptr(rsi))?;
    a.jne(next_base)?;
    // In this runtime: the window holding rsi gives the return address's
    // depth below the interrupted rsp.
    for (depths, caller) in windows {
        for w in depths.0.windows(2) {
            let ((lo, depth), (hi, _)) = (w[0], w[1]);
            let Some(depth) = depth else { continue };
            let mut skip = a.create_label();
            a.lea(rax, ptr(lo))?;
            a.cmp(rsi, rax)?;
            a.jb(skip)?;
            a.lea(rax, ptr(hi))?;
            a.cmp(rsi, rax)?;
            a.jae(skip)?;
            a.mov(rax, qword_ptr(r13 + 15 * 8))?; // the interrupted rsp
            a.lea(rax, ptr(rax + depth as i32))?; // where the return address is
            match caller {
                Caller::Placed => {}
                Caller::Stub => {
                    // The stub's own return address: glibc's restorer? A
                    // stub entered by a jump may have anything at its
                    // [rsp], and its rdx (which the stub itself tests) is
                    // not kept everywhere in these windows: the kernel
                    // reads the 8 bytes first, as a set to add to the
                    // mask, which is already full here (EFAULT: not a
                    // readable pointer, so no restorer).
                    let mut no_restorer = a.create_label();
                    a.mov(r15, rax)?;
                    a.mov(rsi, qword_ptr(rax + 8))?;
                    a.xor(edi, edi)?; // SIG_BLOCK
                    a.xor(edx, edx)?;
                    a.mov(r10d, 8u32)?;
                    a.mov(eax, SYS_RT_SIGPROCMASK)?;
                    a.syscall()?;
                    a.test(rax, rax)?;
                    a.mov(rax, r15)?;
                    a.jnz(no_restorer)?;
                    a.mov(rdx, qword_ptr(rsi))?;
                    a.cmp(rdx, qword_ptr(l.restorer))?;
                    a.je(outer)?;
                    a.set_label(&mut no_restorer)?;
                }
                Caller::Handler => {
                    a.jmp(outer)?;
                }
            }
            a.mov(r14, qword_ptr(rax))?;
            a.jmp(done)?;
            a.set_label(&mut skip)?;
            a.zero_bytes()?;
        }
    }
    // Signals blocked there: left as it is.
    a.jmp(done)?;
    // The stub is a handler's that has not written its SIGNAL: above the
    // return address into it, the kernel's frame (pretcode, then the
    // ucontext, its gregs 40 bytes in). Complete that context's stores,
    // then map its rip.
    a.set_label(&mut outer)?;
    a.lea(r13, ptr(rax + 56))?;
    a.mov(r14, qword_ptr(r13 + 16 * 8))?;
    a.jmp(l.map_caller)?;
    a.set_label(&mut next_base)?;
    a.inc(ecx)?;
    a.cmp(ecx, 1)?;
    a.jne(table)?;
    a.mov(rbx, qword_ptr(S_RUNTIME).gs())?;
    a.jmp(try_base)?;
    a.set_label(&mut table)?;
    a.cmp(ecx, MAX_MODULES)?;
    a.ja(done)?;
    a.mov(rbx, qword_ptr(r8 + rcx * 8 + (H_MODULES - 8) as i32))?;
    a.test(rbx, rbx)?;
    a.jz(next_base)?;
    a.jmp(try_base)?;
    a.set_label(&mut done)?;
    a.ret()
}

/// `signal_entry()`: called by the outside-entry stub when its return
/// address is glibc's `__restore_rt`, i.e. at the start of a signal handler
/// (edi = signal number, the kernel's signal frame right above the return
/// address). If the interrupted code had reserved witness or record bytes
/// (its `xadd gs:[0], r` done) but not finished storing them, perform the
/// remaining stores now and step the saved RIP over them, so no reserved
/// byte stays unwritten even if the handler never returns (longjmp) or
/// fills the buffer. Then write `SIGNAL(signo, rip)` with the saved RIP
/// as the handler will return to it.
///
/// The interrupted context is in a reservation window when (A) the 10
/// bytes before its RIP are `xadd gs:[0], r` and RIP is at a store through
/// `r`, or (B) RIP is at a store through `r` and `[r]` holds a record
/// header still marked pending. Stores through `r` are then emulated one by
/// one (the forms `emit.rs` produces: `mov byte/word/dword [r+d8], imm`,
/// `mov word/dword/qword [r+d8], reg`) until the next instruction is not
/// one; every target must lie in this thread's slot.
fn emit_signal_entry(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut owned = a.create_label();
    let d = enter_blocked(a, &mut l.signal_entry)?;
    l.windows.push((d, Caller::Handler));
    // A fork (or vfork) child whose handler runs before its `fork_child`
    // claimed a slot (or before it blocked signals) is still on its
    // parent's slot: the same TCB, another TID. Claim its own here.
    emit_claim_fork_unless_owned(a, l, owned)?;
    a.set_label(&mut owned)?;
    // [rsp+144] return into the stub, [rsp+152] pretcode, [rsp+160] ucontext;
    // uc_mcontext (the gregs) starts 40 bytes into the ucontext.
    a.mov(r12d, dword_ptr(rsp + SAVED_RDI))?;
    a.lea(r13, ptr(rsp + 200))?;
    a.mov(r14, qword_ptr(r13 + 16 * 8))?; // interrupted rip = committed cursor
    a.call(l.map_caller)?;
    // SIGNAL(signo, rip, xfers): r14 is the saved RIP, advanced past any
    // stores completed (the instruction the handler returns to), or the
    // caller of the entry point it interrupted, or where the restorer it
    // interrupted returns; xfers the thread's
    // transfer count (no transfer completes inside this stub).
    rep_flag(a, l, false)?;
    write_signal_record(a, RecordKind::Signal)?;
    rep_registers(a)?;
    // The handler sees the native rip: its interrupted rip, when that is
    // the copy of an instruction, becomes the instruction's original
    // address (`sigreturn` maps it back).
    // The copy's rip and the original shown (0: none) are kept in the
    // frame's `uc_mcontext.__reserved1` (the kernel neither reads nor
    // writes it) for `sigret_record`.
    let mut as_is = a.create_label();
    a.mov(rdi, qword_ptr(rsp + 200 + 16 * 8))?;
    a.mov(qword_ptr(rsp + 200 + KEPT_COPY), rdi)?;
    a.xor(esi, esi)?;
    a.call(l.translate_any)?;
    a.mov(qword_ptr(rsp + 200 + KEPT_ORIG), rax)?;
    a.test(rax, rax)?;
    a.jz(as_is)?;
    a.mov(qword_ptr(rsp + 200 + 16 * 8), rax)?;
    a.set_label(&mut as_is)?;
    // The handler starts with no thread constant recorded (`S_ONCE`, as
    // the regenerator's walk starts it); `sigret_record` puts the
    // interrupted code's word back.
    a.mov(eax, dword_ptr(S_ONCE).gs())?;
    a.mov(qword_ptr(rsp + 200 + KEPT_ONCE), rax)?;
    a.mov(dword_ptr(S_ONCE).gs(), 0)?;
    // The handler returns through the executable's `sigreturn`, which
    // says where the thread resumes (the handler may move the rip); the
    // pretcode it replaces, glibc's restorer, is kept for `map_caller`.
    a.mov(rax, qword_ptr(rsp + 152))?;
    runtime_addr(a, l, l.d_restorer, rcx)?;
    a.mov(qword_ptr(rcx), rax)?;
    runtime_addr(a, l, l.sigreturn, rcx)?;
    a.mov(qword_ptr(rsp + 152), rcx)?;
    // SIGNAL written: a second signal from here on is reported in the
    // stub, before the handler's ENTER.
    leave_blocked(a, &mut l.windows, Depths::default(), Caller::Placed)?;
    emit_fixup(a, l)
}

/// Where `signal_entry` keeps, from a frame's gregs, the copy's rip it
/// interrupted and the original address it showed the handler (0: none):
/// `uc_mcontext.__reserved1[0..2]`, after the gregs and the fpregs pointer.
const KEPT_COPY: i32 = 192;
const KEPT_ORIG: i32 = 200;
/// And the slot's `S_ONCE` word of the interrupted code: `__reserved1[2]`.
const KEPT_ONCE: i32 = 208;

/// `dst` = the address of `label` in the executable's blob (the slot's
/// `RUNTIME`): every blob is the same code. Clobbers rdx.
fn runtime_addr(
    a: &mut CodeAssembler,
    l: &Labels,
    label: CodeLabel,
    dst: AsmRegister64,
) -> Result<(), IcedError> {
    a.lea(dst, ptr(label))?;
    a.lea(rdx, ptr(l.init))?;
    a.sub(dst, rdx)?;
    a.add(dst, qword_ptr(S_RUNTIME).gs())
}

/// `sigreturn`: the return address (pretcode) `signal_entry` gives a
/// traced handler, in place of glibc's restorer; the executable's for
/// every module. At its entry rsp points at the kernel's ucontext, as at
/// glibc's restorer, and every register is dead (`rt_sigreturn` restores
/// the context). It blocks every signal (the context's own mask comes
/// back with `rt_sigreturn`), writes SIGRETURN with the context's rip
/// mapped as `signal_entry` maps it (`sigret_record`), checks the buffer
/// and calls `rt_sigreturn`. A signal before its mask is blocked (up to
/// `sigret_blocked`) is handled by `map_caller` (`in_sigreturn_prologue`).
/// Its unwind entry (`docs/runtime.md` section 5, the rewriter's
/// `unwind::sigreturn_fde`) starts one byte before it, at a `nop`, since
/// an unwinder looks up a return address minus one.
fn emit_sigreturn(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut room = a.create_label();
    a.nop()?;
    a.set_label(&mut l.sigreturn)?;
    a.mov(eax, SYS_RT_SIGPROCMASK)?;
    a.xor(edi, edi)?; // SIG_BLOCK
    a.lea(rsi, ptr(l.all_ones))?;
    a.xor(edx, edx)?;
    a.mov(r10d, 8u32)?;
    a.syscall()?;
    a.set_label(&mut l.sigret_blocked)?;
    a.lea(r13, ptr(rsp + 40))?;
    a.call(l.sigret_record)?;
    a.mov(rax, qword_ptr(S_POS).gs())?;
    a.cmp(rax, qword_ptr(S_LIMIT).gs())?;
    a.jb(room)?;
    a.call(l.flush)?;
    a.set_label(&mut room)?;
    a.mov(eax, SYS_RT_SIGRETURN)?;
    a.syscall()?;
    // `sigret_record`, signals blocked: r13 = the gregs of a context a
    // handler returns to. Maps its rip with `map_caller`, whose frame
    // check wants glibc's restorer where `signal_entry` has its pretcode,
    // and writes SIGRETURN(rip). Clobbers every register but r12.
    a.set_label(&mut l.sigret_record)?;
    // The interrupted code's thread constants come back with it (the
    // regenerator's walk restores its state at this SIGRETURN).
    a.mov(eax, dword_ptr(r13 + KEPT_ONCE))?;
    a.mov(dword_ptr(S_ONCE).gs(), eax)?;
    // An original instruction's address (`signal_entry` showed the
    // handler one; the handler may have moved it to another) goes back to
    // its copy.
    // The rip shown unchanged: the copy's, as it was. Moved to no listed
    // instruction: the copy's moved as far (as before 1.11; regen then
    // refuses the trace unless a trap's `Resume` edge explains it).
    let (mut as_is, mut moved, mut store) = (a.create_label(), a.create_label(), a.create_label());
    a.mov(rdi, qword_ptr(r13 + 16 * 8))?;
    a.mov(rax, qword_ptr(r13 + KEPT_ORIG))?;
    a.test(rax, rax)?;
    a.jz(as_is)?;
    a.cmp(rdi, rax)?;
    a.jne(moved)?;
    a.mov(rax, qword_ptr(r13 + KEPT_COPY))?;
    a.jmp(store)?;
    a.set_label(&mut moved)?;
    // Moved: the signal stood at an instruction's copy (the original was
    // shown), so the context's registers are the program's.
    sigret_registers(a, l)?;
    a.mov(esi, 1u32)?;
    a.call(l.translate_any)?;
    a.test(rax, rax)?;
    a.jnz(store)?;
    a.mov(rax, qword_ptr(r13 + 16 * 8))?;
    a.sub(rax, qword_ptr(r13 + KEPT_ORIG))?;
    a.add(rax, qword_ptr(r13 + KEPT_COPY))?;
    a.set_label(&mut store)?;
    a.mov(qword_ptr(r13 + 16 * 8), rax)?;
    a.set_label(&mut as_is)?;
    a.sub(rsp, 168)?;
    runtime_addr(a, l, l.d_restorer, rax)?;
    a.mov(rax, qword_ptr(rax))?;
    a.mov(qword_ptr(rsp + 152), rax)?;
    a.mov(r14, qword_ptr(r13 + 16 * 8))?;
    a.call(l.map_caller)?;
    let kind = RecordKind::SigReturn;
    reserve_record(a, kind)?;
    a.mov(qword_ptr(rax + 2), r14)?;
    a.mov(byte_ptr(rax + 1), kind as u32)?;
    a.add(rsp, 168)?;
    a.ret()
}

/// Bytes before the table's rows: `u32` rows, `u32` flags
/// ([`TABLE_REGISTERS`]).
const TABLE_HEAD: i32 = 8;
/// Table flag: the executable was rewritten with `--data`, so `sigreturn`
/// writes the context's general registers as VALUEs (the data walk's
/// known registers take them: a handler may have changed them).
pub const TABLE_REGISTERS: u32 = 1;
/// `uc_mcontext.gregs` index of each general register in the data walk's
/// order (`rax rcx rdx rbx rsp rbp rsi rdi r8`..`r15`).
const GREGS: [i32; 16] = [13, 14, 12, 11, 15, 10, 9, 8, 0, 1, 2, 3, 4, 5, 6, 7];

/// r8 = the offset of the executable's instruction table from the runtime
/// (rbx), read from its data word; to `none` when it has no table.
/// Clobbers rcx, rdx.
fn insn_table(a: &mut CodeAssembler, l: &Labels, none: CodeLabel) -> Result<(), IcedError> {
    a.lea(rdx, ptr(l.d_insns))?;
    a.lea(rcx, ptr(l.init))?;
    a.sub(rdx, rcx)?;
    a.mov(r8, qword_ptr(rbx + rdx))?;
    a.test(r8, r8)?;
    a.jz(none)
}

/// To `none` unless the executable's table (the slot's `RUNTIME`, into
/// rbx) says [`TABLE_REGISTERS`]: a `--data` executable. Clobbers rcx,
/// rdx, r8.
fn unless_registers(a: &mut CodeAssembler, l: &Labels, none: CodeLabel) -> Result<(), IcedError> {
    a.mov(rbx, qword_ptr(S_RUNTIME).gs())?;
    insn_table(a, l, none)?;
    a.test(byte_ptr(rbx + r8 + 4), TABLE_REGISTERS as i32)?;
    a.jz(none)
}

/// In `sigret_record` (r13 = the gregs, signals blocked), for a handler
/// that moved the rip: when the executable's table says
/// [`TABLE_REGISTERS`], 16 VALUE records, the context's general registers
/// in [`GREGS`] order, before SIGRETURN (a return unmoved may stand
/// inside instrumentation, whose registers are not the program's).
/// Clobbers rax, rbx, rcx, rdx, r8.
fn sigret_registers(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut none = a.create_label();
    unless_registers(a, l, none)?;
    gregs_values(a, &GREGS)?;
    a.set_label(&mut none)
}

/// VALUE records of the general registers `gregs` (`uc_mcontext.gregs`
/// indices) of the context at r13, in that order. Clobbers rax, rcx.
fn gregs_values(a: &mut CodeAssembler, gregs: &[i32]) -> Result<(), IcedError> {
    let kind = RecordKind::Value;
    let len = kind.encoded_len() as i32;
    a.mov(eax, (len * gregs.len() as i32) as u32)?;
    a.xadd(qword_ptr(S_POS).gs(), rax)?;
    for (i, &g) in (0..).zip(gregs) {
        let at = i * len;
        pending_word(a, kind, at)?;
        a.mov(rcx, qword_ptr(r13 + 8 * g))?;
        a.mov(qword_ptr(rax + at + 2), rcx)?;
        a.mov(byte_ptr(rax + at + 1), kind as u32)?;
    }
    Ok(())
}

/// Before a SIGNAL or FAULT record (r12d the signal number, r13 the
/// gregs, r14 the rip to write): when the context's rip is a `rep` string
/// instruction's own (`movs`, `stos`, `lods`, `ins`, `outs` with a
/// `rep`/`repne` prefix; r14 at it, no window) in a `--data` executable,
/// sets [`SIGNAL_REP_REGISTERS`] in r12d, so that the record says
/// [`rep_registers`] follow (format 1.16; from 1.13 to 1.15 only a fault's,
/// unflagged). A FAULT's (`faults_only`) only for a fault ([`FAULTING`]):
/// the walk reads them where the instruction's fault ends the thread.
/// The same test as the walk's (`addr::full::registers_at_fault`), by the
/// bytes: prefixes, then the opcode. Clobbers rax, rbx, rcx, rdx, rsi, r8.
fn rep_flag(a: &mut CodeAssembler, l: &mut Labels, faults_only: bool) -> Result<(), IcedError> {
    let mut none = a.create_label();
    let (mut lp, mut rep, mut next) = (a.create_label(), a.create_label(), a.create_label());
    let (mut opcode, mut string) = (a.create_label(), a.create_label());
    if faults_only {
        // `bt` takes the bit number modulo 32: a real-time signal is no fault.
        a.cmp(r12d, 31)?;
        a.ja(none)?;
        a.mov(eax, FAULTING)?;
        a.bt(eax, r12d)?;
        a.jae(none)?;
    }
    a.cmp(r14, qword_ptr(r13 + 16 * 8))?;
    a.jne(none)?;
    unless_registers(a, l, none)?;
    // edx: a rep or repne prefix seen; at most 15 bytes.
    a.mov(rsi, r14)?;
    a.xor(edx, edx)?;
    a.mov(ecx, 15u32)?;
    a.set_label(&mut lp)?;
    a.movzx(eax, byte_ptr(rsi))?;
    // (byte & mask) == value: F2/F3; 66/67; 26/2E/36/3E; 64/65; REX.
    let prefix = |a: &mut CodeAssembler, mask: u32, value: u32, to: CodeLabel| {
        a.mov(r8d, eax)?;
        a.and(r8d, mask)?;
        a.cmp(r8d, value)?;
        a.je(to)
    };
    prefix(a, 0xFE, 0xF2, rep)?;
    for (mask, value) in [(0xFE, 0x66), (0xE7, 0x26), (0xFE, 0x64), (0xF0, 0x40)] {
        prefix(a, mask, value, next)?;
    }
    a.jmp(opcode)?;
    a.set_label(&mut rep)?;
    a.mov(edx, 1u32)?;
    a.set_label(&mut next)?;
    a.inc(rsi)?;
    a.dec(ecx)?;
    a.jnz(lp)?;
    a.jmp(none)?;
    // ins/outs 6C-6F, movs A4/A5, stos AA/AB, lods AC/AD.
    a.set_label(&mut opcode)?;
    a.test(edx, edx)?;
    a.jz(none)?;
    prefix(a, 0xFC, 0x6C, string)?;
    prefix(a, 0xFE, 0xA4, string)?;
    a.sub(eax, 0xAA)?;
    a.cmp(eax, 4)?;
    a.jae(none)?;
    a.set_label(&mut string)?;
    a.or(r12d, SIGNAL_REP_REGISTERS)?;
    a.set_label(&mut none)
}

/// After the SIGNAL or FAULT record [`rep_flag`] flagged: the context's
/// `rcx`, `rsi` and `rdi` (r13 the gregs) as three VALUEs, and r12d the
/// signal number again. Clobbers rax, rcx.
fn rep_registers(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let mut none = a.create_label();
    a.btr(r12d, SIGNAL_REP_REGISTERS.trailing_zeros())?;
    a.jae(none)?;
    gregs_values(a, &[GREGS[1], GREGS[6], GREGS[7]])?;
    a.set_label(&mut none)
}

/// `translate_any(rdi = address, esi = 0: copy to original, 1: original
/// to copy)`: rax = the instruction's address on the other side (an
/// original's: where its lead starts in the copy), by this blob's table,
/// else the executable's (the slot's `RUNTIME`); 0 when neither has the
/// address as an instruction start (instrumentation, untraced code, a
/// library's code when the handler is another module's).
/// `translate` does one blob's (rbx): a linear scan of the rows whose
/// span holds the address, then of their entries (the rewriter's
/// `insnmap` has the layout). Both clobber rcx, rdx, r8-r11.
fn emit_translate(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut out = a.create_label();
    a.set_label(&mut l.translate_any)?;
    a.push(rbx)?;
    a.lea(rbx, ptr(l.init))?;
    a.call(l.translate)?;
    a.test(rax, rax)?;
    a.jnz(out)?;
    a.mov(rbx, qword_ptr(S_RUNTIME).gs())?;
    a.call(l.translate)?;
    a.set_label(&mut out)?;
    a.pop(rbx)?;
    a.ret()?;

    let (mut row, mut copy_key, mut have_key, mut entry) = (
        a.create_label(),
        a.create_label(),
        a.create_label(),
        a.create_label(),
    );
    let (mut by_copy, mut next_entry, mut next_row, mut none, mut done) = (
        a.create_label(),
        a.create_label(),
        a.create_label(),
        a.create_label(),
        a.create_label(),
    );
    a.set_label(&mut l.translate)?;
    a.push(rbp)?;
    a.push(r15)?;
    insn_table(a, l, none)?;
    a.add(r8, rbx)?; // the table
    a.mov(ecx, dword_ptr(r8))?; // rows
    a.lea(r9, ptr(r8 + TABLE_HEAD))?;
    a.mov(eax, ecx)?;
    a.shl(rax, 4)?;
    a.lea(r10, ptr(r9 + rax))?; // the entries
    a.set_label(&mut row)?;
    a.test(ecx, ecx)?;
    a.jz(none)?;
    a.mov(eax, dword_ptr(r9))?;
    a.add(rax, rbx)?; // the row's copy start
    a.movsxd(rdx, dword_ptr(r9 + 4))?;
    a.add(rdx, rbx)?; // its original start
    a.mov(r11, rdi)?;
    a.test(esi, esi)?;
    a.jz(copy_key)?;
    a.sub(r11, rdx)?;
    a.jmp(have_key)?;
    a.set_label(&mut copy_key)?;
    a.sub(r11, rax)?;
    a.set_label(&mut have_key)?;
    a.cmp(r11, 0xFFFF)?;
    a.ja(next_row)?;
    a.mov(ebp, dword_ptr(r9 + 8))?;
    a.mov(r15d, dword_ptr(r9 + 12))?;
    a.lea(rbp, ptr(rbp + rbp * 2))?;
    a.lea(rbp, ptr(r10 + rbp * 2))?; // 6-byte entries
    a.set_label(&mut entry)?;
    a.test(r15d, r15d)?;
    a.jz(next_row)?;
    a.test(esi, esi)?;
    a.jz(by_copy)?;
    a.movzx(r8d, word_ptr(rbp))?;
    a.cmp(r8, r11)?;
    a.jne(next_entry)?;
    a.movzx(r8d, word_ptr(rbp + 2))?;
    a.add(rax, r8)?;
    a.movzx(r8d, word_ptr(rbp + 4))?;
    a.sub(rax, r8)?; // its lead
    a.jmp(done)?;
    a.set_label(&mut by_copy)?;
    a.movzx(r8d, word_ptr(rbp + 2))?;
    a.cmp(r8, r11)?;
    a.jne(next_entry)?;
    a.movzx(r8d, word_ptr(rbp))?;
    a.lea(rax, ptr(rdx + r8))?;
    a.jmp(done)?;
    a.set_label(&mut next_entry)?;
    a.add(rbp, 6)?;
    a.dec(r15d)?;
    a.jmp(entry)?;
    a.set_label(&mut next_row)?;
    a.add(r9, 16)?;
    a.dec(ecx)?;
    a.jmp(row)?;
    a.set_label(&mut none)?;
    a.xor(eax, eax)?;
    a.set_label(&mut done)?;
    a.pop(r15)?;
    a.pop(rbp)?;
    a.ret()
}

/// In `map_caller`: a rip in the executable's `sigreturn` before it
/// blocked signals belongs to a handler that has returned. Its context
/// (the ucontext at `sigreturn`'s rsp) is where the thread is: its
/// SIGRETURN is written now (`sigret_record`), the interrupted
/// `sigreturn` is sent to `fault_restorer` (a bare `rt_sigreturn`, so it
/// writes nothing more), and that context is mapped instead.
fn in_sigreturn_prologue(a: &mut CodeAssembler, l: &Labels) -> Result<(), IcedError> {
    let mut not_in = a.create_label();
    runtime_addr(a, l, l.sigreturn, rax)?;
    a.cmp(r14, rax)?;
    a.jb(not_in)?;
    runtime_addr(a, l, l.sigret_blocked, rax)?;
    a.cmp(r14, rax)?;
    a.jae(not_in)?;
    a.push(r13)?;
    a.mov(rax, qword_ptr(r13 + 15 * 8))?;
    a.lea(r13, ptr(rax + 40))?;
    a.call(l.sigret_record)?;
    a.pop(r13)?;
    runtime_addr(a, l, l.fault_restorer, rax)?;
    a.mov(qword_ptr(r13 + 16 * 8), rax)?;
    a.mov(rax, qword_ptr(r13 + 15 * 8))?;
    a.lea(r13, ptr(rax + 40))?;
    a.mov(r14, qword_ptr(r13 + 16 * 8))?;
    a.jmp(l.map_caller)?;
    a.set_label(&mut not_in)?;
    a.zero_bytes()
}

/// Takes a `kind` record's bytes at the stream's position (rax: their
/// address) and writes its escape word marked pending: a reader stops
/// there until the kind byte is written, last. Clobbers rax.
fn reserve_record(a: &mut CodeAssembler, kind: RecordKind) -> Result<(), IcedError> {
    a.mov(eax, kind.encoded_len() as u32)?;
    a.xadd(qword_ptr(S_POS).gs(), rax)?;
    pending_word(a, kind, 0)
}

/// The escape word of a pending `kind` record at `rax + at`.
fn pending_word(a: &mut CodeAssembler, kind: RecordKind, at: i32) -> Result<(), IcedError> {
    a.mov(
        word_ptr(rax + at),
        ESCAPE as u32 | (KIND_PENDING as u32 | kind as u32) << 8,
    )
}

/// Writes `kind(signo, rip, xfers)` (SIGNAL or FAULT): r12d the signal
/// number, r14 the rip. Clobbers rax, rcx.
fn write_signal_record(a: &mut CodeAssembler, kind: RecordKind) -> Result<(), IcedError> {
    reserve_record(a, kind)?;
    a.mov(dword_ptr(rax + 2), r12d)?;
    a.mov(qword_ptr(rax + 6), r14)?;
    a.mov(ecx, dword_ptr(S_XFERS).gs())?;
    a.mov(dword_ptr(rax + 14), ecx)?;
    a.mov(byte_ptr(rax + 1), kind as u32)
}

/// `fault(signo, info, uc)`: the handler of a [`FAULT_SIGNALS`] signal the
/// program left at `SIG_DFL` (now `SIG_DFL` again, every signal blocked).
/// Writes FAULT(signo, rip, xfers) with the interrupted rip mapped as
/// `signal_entry` maps it (stores completed, a runtime's window reported
/// at its caller), then lets the signal end the process natively: a fault
/// the instruction raised ([`FAULTING`], `si_code > 0`) by returning to
/// it, so it faults again
/// with the default action (the native status, core dump and siginfo);
/// any other signal by sending it again to the thread, unblocked. The
/// witness region is shared memory (or a shared file mapping), so the
/// record needs no flush: the recorder drains the slot after the process
/// dies.
fn emit_fault(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut again = a.create_label();
    a.set_label(&mut l.fault)?;
    // Below the kernel's frame ([rsp]: its pretcode, [rsp+8]: the
    // ucontext, whose gregs start 40 bytes in), at the depth
    // `map_caller` expects of `signal_entry`'s (pretcode at its rsp+160):
    // [rsp] si_code, [rsp+8] signo, [rsp+16] the interrupted rip.
    a.sub(rsp, 152)?;
    a.mov(eax, dword_ptr(rsi + 8))?;
    a.mov(qword_ptr(rsp), rax)?;
    a.mov(qword_ptr(rsp + 8), rdi)?;
    // A thread on its parent's slot (a fork child, a new thread that ran
    // no traced code yet) takes its own first.
    a.call(l.attach)?;
    a.mov(r12d, edi)?;
    a.lea(r13, ptr(rdx + 40))?;
    a.mov(r14, qword_ptr(r13 + 16 * 8))?;
    a.mov(qword_ptr(rsp + 16), r14)?;
    a.call(l.map_caller)?;
    rep_flag(a, l, true)?;
    write_signal_record(a, RecordKind::Fault)?;
    rep_registers(a)?;
    // SIGILL, SIGBUS, SIGFPE or SIGSEGV the kernel raised (si_code > 0:
    // a fault, or SI_KERNEL for a general protection fault) at a rip the
    // fix-up left as it was: return to the instruction. (Any other
    // signal, SIGTRAP included, whose trap instruction is passed, and a
    // tty's SIGINT, also SI_KERNEL, is sent again.)
    a.mov(edi, dword_ptr(rsp + 8))?;
    a.cmp(dword_ptr(rsp), 0)?;
    a.jle(again)?;
    a.mov(eax, FAULTING)?;
    a.bt(eax, edi)?;
    a.jae(again)?;
    a.mov(rax, qword_ptr(rsp + 16))?;
    a.cmp(rax, qword_ptr(rsp + 152 + 8 + 40 + 16 * 8))?;
    a.jne(again)?;
    a.add(rsp, 152)?;
    a.ret()?;
    a.set_label(&mut again)?;
    // Unblock the signal, then send it to this thread.
    a.lea(ecx, ptr(rdi - 1))?;
    a.mov(eax, 1u32)?;
    a.shl(rax, cl)?;
    a.mov(qword_ptr(rsp + 24), rax)?;
    a.mov(edi, 1u32)?; // SIG_UNBLOCK
    a.lea(rsi, ptr(rsp + 24))?;
    a.xor(edx, edx)?;
    a.mov(r10d, 8u32)?;
    a.mov(eax, SYS_RT_SIGPROCMASK)?;
    a.syscall()?;
    a.mov(eax, SYS_GETPID)?;
    a.syscall()?;
    a.mov(r12, rax)?;
    a.mov(eax, SYS_GETTID)?;
    a.syscall()?;
    a.mov(rdi, r12)?;
    a.mov(rsi, rax)?;
    a.mov(edx, dword_ptr(rsp + 8))?;
    a.mov(eax, SYS_TGKILL)?;
    a.syscall()?;
    // Not reached unless the signal was caught again meanwhile.
    a.add(rsp, 152)?;
    a.ret()?;
    // `rt_sigreturn`, glibc's `__restore_rt` byte for byte.
    a.set_label(&mut l.fault_restorer)?;
    a.db(&[0x48, 0xC7, 0xC0, 0x0F, 0x00, 0x00, 0x00, 0x0F, 0x05])
}

/// `fixup`, signals blocked: r13 = the saved gregs of an interrupted
/// context of this thread, r14 = its rip. Completes the witness or
/// record stores it interrupted (`signal_entry`'s doc) and steps its
/// saved rip, and r14, over them. Running it again on the same context
/// changes nothing (the rip is past the stores). Clobbers every register
/// but r12, r13 and rsp.
fn emit_fixup(a: &mut CodeAssembler, l: &mut Labels) -> Result<(), IcedError> {
    let mut record = a.create_label();
    let mut hi_reg = a.create_label();
    let mut decode = a.create_label();
    let mut lp = a.create_label();
    let mut no66 = a.create_label();
    let mut norex = a.create_label();
    let mut rm_ok = a.create_label();
    let mut have_b = a.create_label();
    let mut nodisp = a.create_label();
    let mut nr = a.create_label();
    let mut op_c6 = a.create_label();
    let mut op_c7 = a.create_label();
    let mut c7d = a.create_label();
    let mut op_89 = a.create_label();
    let mut st_w = a.create_label();
    let mut st_q = a.create_label();
    let mut one = a.create_label();
    let mut stop = a.create_label();
    a.set_label(&mut l.fixup)?;
    a.lea(rax, ptr(l.init))?; // blob base
    a.mov(rcx, qword_ptr(l.d_win_lo))?;
    a.test(rcx, rcx)?;
    a.jz(record)?;
    a.add(rcx, rax)?;
    a.add(rcx, 10)?;
    a.cmp(r14, rcx)?;
    a.jb(record)?;
    a.mov(rdx, qword_ptr(l.d_win_hi))?;
    a.add(rdx, rax)?;
    a.sub(rdx, 64)?; // room to decode a few stores
    a.cmp(r14, rdx)?;
    a.ja(record)?;
    // The transfer count's increment right before the rip (the counted
    // transfer it precedes not made yet): undo it, so that the signal
    // stands before the increment with the count before it, and the
    // handler returns to the increment (docs/regen.md, "The transfer
    // count": otherwise a second signal in untraced code before the next
    // record could not tell the restorer from the callee).
    let mut not_inc = a.create_label();
    a.mov(rax, u64::from_le_bytes(TRANSFER_INC))?;
    a.cmp(qword_ptr(r14 - TRANSFER_INC.len() as i32), rax)?;
    a.jne(not_inc)?;
    a.dec(dword_ptr(S_XFERS).gs())?;
    a.sub(r14, TRANSFER_INC.len() as i32)?;
    a.mov(qword_ptr(r13 + 16 * 8), r14)?;
    a.ret()?;
    a.set_label(&mut not_inc)?;
    // This thread's slot: every emulated store must land inside it.
    a.mov(r15, qword_ptr(S_BASE).gs())?;
    a.mov(rax, qword_ptr(l.d_region))?;
    a.mov(rbx, qword_ptr(rax + H_SLOT_SIZE))?;
    a.add(rbx, r15)?;
    // Case A: `xadd gs:[0], r` right before RIP (65 48|4C 0F C1 modrm 25 0).
    a.mov(ebp, u32::MAX)?;
    a.cmp(byte_ptr(r14 - 10), 0x65)?;
    a.jne(decode)?;
    a.xor(r8d, r8d)?;
    a.movzx(eax, byte_ptr(r14 - 9))?;
    a.cmp(eax, 0x48)?;
    a.je(hi_reg)?;
    a.cmp(eax, 0x4C)?;
    a.jne(decode)?;
    a.mov(r8d, 8u32)?;
    a.set_label(&mut hi_reg)?;
    a.cmp(word_ptr(r14 - 8), 0xC10F)?;
    a.jne(decode)?;
    a.cmp(byte_ptr(r14 - 5), 0x25)?;
    a.jne(decode)?;
    a.cmp(dword_ptr(r14 - 4), S_POS as i32)?;
    a.jne(decode)?;
    a.movzx(ecx, byte_ptr(r14 - 6))?;
    a.mov(edx, ecx)?;
    a.and(edx, 0xC7)?;
    a.cmp(edx, 0x04)?;
    a.jne(decode)?;
    a.shr(ecx, 3)?;
    a.and(ecx, 7)?;
    a.add(ecx, r8d)?;
    a.mov(ebp, ecx)?; // b = the reserving register
    a.set_label(&mut decode)?;
    a.xor(r9d, r9d)?; // stores emulated
    a.mov(rsi, r14)?;
    // Decode one store at rsi: [66] [REX] op modrm [disp8] [imm].
    a.set_label(&mut lp)?;
    a.xor(r10d, r10d)?; // operand-size prefix
    a.xor(r11d, r11d)?; // REX
    a.movzx(eax, byte_ptr(rsi))?;
    a.cmp(eax, 0x66)?;
    a.jne(no66)?;
    a.mov(r10d, 1u32)?;
    a.inc(rsi)?;
    a.movzx(eax, byte_ptr(rsi))?;
    a.set_label(&mut no66)?;
    a.mov(edx, eax)?;
    a.and(edx, 0xF0)?;
    a.cmp(edx, 0x40)?;
    a.jne(norex)?;
    a.mov(r11d, eax)?;
    a.inc(rsi)?;
    a.movzx(eax, byte_ptr(rsi))?;
    a.set_label(&mut norex)?;
    a.movzx(ecx, byte_ptr(rsi + 1))?; // modrm
    a.add(rsi, 2)?;
    a.mov(edx, ecx)?;
    a.shr(edx, 6)?; // mod
    a.cmp(edx, 1)?;
    a.ja(stop)?;
    a.mov(r8d, ecx)?;
    a.and(r8d, 7)?; // rm
    a.cmp(r8d, 4)?; // SIB / rip-relative / rbp forms: never ours
    a.je(stop)?;
    a.cmp(r8d, 5)?;
    a.je(stop)?;
    a.test(r11d, 1)?;
    a.jz(rm_ok)?;
    a.add(r8d, 8)?;
    a.set_label(&mut rm_ok)?;
    a.cmp(ebp, u32::MAX)?;
    a.jne(have_b)?;
    // Case B: the base register must point at a pending record header.
    a.lea(rdi, ptr(l.regmap))?;
    a.movzx(edi, byte_ptr(rdi + r8))?;
    a.mov(rdi, qword_ptr(r13 + rdi * 8))?;
    // Inside the slot, bounds tested before the pointer is moved (a value
    // near 2^64 must not wrap into it).
    a.cmp(rdi, r15)?;
    a.jb(stop)?;
    a.cmp(rdi, rbx)?;
    a.jae(stop)?;
    a.lea(rdi, ptr(rdi + 2))?;
    a.cmp(rdi, rbx)?;
    a.ja(stop)?;
    a.cmp(byte_ptr(rdi - 2), ESCAPE as i32)?;
    a.jne(stop)?;
    a.test(byte_ptr(rdi - 1), KIND_PENDING as i32)?;
    a.jz(stop)?;
    a.mov(ebp, r8d)?;
    a.set_label(&mut have_b)?;
    a.cmp(r8d, ebp)?;
    a.jne(stop)?;
    a.lea(rdi, ptr(l.regmap))?;
    a.movzx(edi, byte_ptr(rdi + r8))?;
    a.mov(r8, qword_ptr(r13 + rdi * 8))?; // value of the base register
    a.test(edx, edx)?;
    a.jz(nodisp)?;
    a.movsx(rdx, byte_ptr(rsi))?;
    a.inc(rsi)?;
    a.add(r8, rdx)?;
    a.set_label(&mut nodisp)?;
    // r8 = target: inside the slot, 8 bytes to spare (no wrap, as above).
    a.cmp(r8, r15)?;
    a.jb(stop)?;
    a.cmp(r8, rbx)?;
    a.jae(stop)?;
    a.lea(rdx, ptr(r8 + 8))?;
    a.cmp(rdx, rbx)?;
    a.ja(stop)?;
    a.shr(ecx, 3)?;
    a.and(ecx, 7)?; // modrm.reg
    a.test(r11d, 4)?;
    a.jz(nr)?;
    a.add(ecx, 8)?;
    a.set_label(&mut nr)?;
    a.cmp(eax, 0xC6)?;
    a.je(op_c6)?;
    a.cmp(eax, 0xC7)?;
    a.je(op_c7)?;
    a.cmp(eax, 0x89)?;
    a.je(op_89)?;
    a.jmp(stop)?;
    a.set_label(&mut op_c6)?;
    a.test(ecx, ecx)?;
    a.jnz(stop)?;
    a.movzx(eax, byte_ptr(rsi))?;
    a.inc(rsi)?;
    a.mov(byte_ptr(r8), al)?;
    a.jmp(one)?;
    a.set_label(&mut op_c7)?;
    a.test(ecx, ecx)?;
    a.jnz(stop)?;
    a.test(r11d, 8)?; // REX.W imm32 sign-extended: never emitted
    a.jnz(stop)?;
    a.test(r10d, r10d)?;
    a.jz(c7d)?;
    a.movzx(eax, word_ptr(rsi))?;
    a.add(rsi, 2)?;
    a.mov(word_ptr(r8), ax)?;
    a.jmp(one)?;
    a.set_label(&mut c7d)?;
    a.mov(eax, dword_ptr(rsi))?;
    a.add(rsi, 4)?;
    a.mov(dword_ptr(r8), eax)?;
    a.jmp(one)?;
    a.set_label(&mut op_89)?;
    a.lea(rdi, ptr(l.regmap))?;
    a.movzx(ecx, byte_ptr(rdi + rcx))?;
    a.mov(rax, qword_ptr(r13 + rcx * 8))?;
    a.test(r10d, r10d)?;
    a.jnz(st_w)?;
    a.test(r11d, 8)?;
    a.jnz(st_q)?;
    a.mov(dword_ptr(r8), eax)?;
    a.jmp(one)?;
    a.set_label(&mut st_w)?;
    a.mov(word_ptr(r8), ax)?;
    a.jmp(one)?;
    a.set_label(&mut st_q)?;
    a.mov(qword_ptr(r8), rax)?;
    a.set_label(&mut one)?;
    a.mov(r14, rsi)?; // commit: this store is done
    a.inc(r9d)?;
    a.cmp(r9d, 8)?; // a record is at most 3 stores; bound the loop anyway
    a.jb(lp)?;
    a.set_label(&mut stop)?;
    a.test(r9d, r9d)?;
    a.jz(record)?;
    a.mov(qword_ptr(r13 + 16 * 8), r14)?;
    a.add(qword_ptr(l.d_fixups), 1)?;
    a.set_label(&mut record)?;
    a.ret()
}
