//! The byte layout of the shared witness region and the witness/record
//! encoding: the single source of truth for the generated runtime, the
//! emitters and the recorder-side [`crate::Drainer`]. `docs/runtime.md`
//! describes the same layout byte by byte.
//!
//! Invariants:
//! - All multi-byte fields are little-endian and naturally aligned.
//! - The region is `HEADER_SIZE + slot_count * slot_size` bytes; slot `i`
//!   starts at `HEADER_SIZE + i * slot_size`; its data area (two halves of
//!   `half_size` bytes) starts `SLOT_HEADER_SIZE` bytes into the slot.
//! - Witness bytes are `1..=0xFE`; `0x00` means "never written" and `0xFF`
//!   starts an escape record `[0xFF][kind][payload]` whose length is fixed by
//!   `kind`. A record's kind byte is written last: a kind with bit 7 set is a
//!   record still being written (or abandoned) and ends the valid data.

/// `b"AETRSHM1"` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"AETRSHM1");
/// Layout version in the header (2 since 2026-11-30: the header's second
/// page holds the libraries of exec'd images, [`H_IMAGE_LIBS`]; 3 since
/// 2026-12-01: a slot header is a page, its [`S_SPAWN_BUF`] lent for the
/// answers to `posix_spawn` requests; 4 the same day: the header's second
/// page ends with [`H_EXEC_CWD`], the image library table 16 entries
/// shorter).
pub const VERSION: u32 = 4;

/// Size of the region header; slots start here (page aligned).
pub const HEADER_SIZE: u64 = 8192;

// Region header field offsets.
/// Header offset: the magic (u64, [`MAGIC`]).
pub const H_MAGIC: u64 = 0;
/// Header offset: the layout version (u32, [`VERSION`]).
pub const H_VERSION: u64 = 8;
/// Header offset: the flags (u32, `FLAG_*`).
pub const H_FLAGS: u64 = 12;
/// Header offset: the region's size in bytes (u64).
pub const H_REGION_SIZE: u64 = 16;
/// Header offset: the number of slots (u32).
pub const H_SLOT_COUNT: u64 = 24;
/// Header offset: the headroom kept above the high-water mark (u32, [`HEADROOM`]).
pub const H_HEADROOM: u64 = 28;
/// Header offset: the size of one slot, header and both halves (u64).
pub const H_SLOT_SIZE: u64 = 32;
/// Header offset: the size of one data half (u64).
pub const H_HALF_SIZE: u64 = 40;
/// Header offset: the pid of the region's creator, the recorder or the standalone process (u32).
pub const H_PID: u64 = 48;
/// Futex word: incremented (and woken) by the runtime each time a half is sealed.
pub const H_FUTEX: u64 = 52;
/// Standalone mode: next free file offset for spilled chunks (`lock xadd`).
pub const H_FILE_END: u64 = 56;
/// Standalone mode: the trace file's descriptor (u64), for the runtime
/// copies of instrumented shared libraries, which attach to the region the
/// executable's `init` created instead of creating it again.
pub const H_FD: u64 = 64;
/// The next process image serial (u32, `lock xadd`): each image's first
/// slot takes one ([`S_SERIAL`]); the recorder's launch is image 0.
pub const H_IMAGES: u64 = 72;
/// The executable as a native run's `/proc/self/maps` names it (the
/// program's view of its maps, `docs/runtime.md` section 5): u32 length
/// of the rewritten copy's path as the kernel shows it (0: no view
/// given), u32 length of the original's `MAJOR:MINOR INODE` text, u32
/// length of the original's path, u32 0; then the three texts, in that
/// order, at [`H_VIEW_BYTES`] (at most [`VIEW_MAX`] bytes together).
pub const H_VIEW: u64 = 128;
/// Header offset of the view's texts.
pub const H_VIEW_BYTES: u64 = H_VIEW + 16;
/// The most bytes the view's texts take.
pub const VIEW_MAX: u64 = H_MODULES - H_VIEW_BYTES;
/// The highest address the runtime asks the kernel to map the region at
/// (a hint: elsewhere if taken), far below where the program's own
/// mappings go, so that every mapping of the program lands where a native
/// run's does and merges with the same neighbours (`docs/runtime.md`
/// section 1): 32 TiB, below a PIE's image and heap (0x55..., about 85
/// TiB) and the mmap area (0x7f...), above a fixed-address executable's
/// image and heap and ASan's shadow (up to 16 TiB).
pub const REGION_HINT: u64 = 0x2000_0000_0000;
/// The memfd a view of `/proc/self/maps` is given to the program in:
/// `readlink` of the program's descriptor says `/memfd:aetrace-maps (deleted)`.
pub const VIEW_MEMFD_NAME: &str = "aetrace-maps";
/// Module table: `u64` run-time address of each instrumented module's
/// runtime blob, indexed by its module tag (1..[`MAX_MODULES`]; tag 0, the
/// executable, reports its address in each slot's `S_RUNTIME`). Written
/// once (`lock cmpxchg` 0 -> address) by a library's runtime when it first
/// attaches; the recorder derives the library's load bias from it.
pub const H_MODULES: u64 = 512;
/// Module tags are `0..MAX_MODULES`; the table ends at `H_MODULES + 8 * MAX_MODULES`.
pub const MAX_MODULES: u32 = 256;
/// The variable the recorder changed for the rewritten copy (`--libs`'
/// `LD_LIBRARY_PATH`), which `init` gives back its native form before the
/// program's code runs: u32 length of the prefix that marks the changed
/// entry (0: none), u32 `HIDE_*` mode, u32 length of its `NAME=`, then the
/// prefix's bytes at [`H_HIDE_BYTES`] (at most [`HIDE_MAX`]).
pub const H_HIDE: u64 = H_MODULES + 8 * MAX_MODULES as u64;
/// Header offset of the hidden entry's prefix bytes.
pub const H_HIDE_BYTES: u64 = H_HIDE + 16;
/// The longest prefix the header holds.
pub const HIDE_MAX: u64 = H_EXE - H_HIDE_BYTES;
/// The executable's native names (`docs/runtime.md` section 5, "The
/// executable's names"): u32 length of the path a native run is exec'd
/// by, which the first `init` writes over `AT_EXECFN`'s string when the
/// recorder exec'd the copy by a name of that length ([`FLAG_CHDIR`]; 0:
/// none), u32 length of the path of a symlink to the original's canonical
/// path, which the program's `readlink` and `realpath` of its own
/// `/proc/PID/exe` are given instead (0: none); then the two paths, each
/// NUL-terminated, in that order, at [`H_EXE_BYTES`] (at most
/// [`EXE_MAX`] bytes together).
pub const H_EXE: u64 = 3584;
/// Header offset of the native names' bytes.
pub const H_EXE_BYTES: u64 = H_EXE + 8;
/// The most bytes the native names take, their NULs included.
pub const EXE_MAX: u64 = H_IMAGE_LIBS - H_EXE_BYTES;
/// The libraries of images other than image 0 (a program that exec'd
/// itself): [`IMAGE_LIBS`] entries of 16 bytes, u64 key `serial << 32 |
/// tag` (claimed by `lock cmpxchg` 0 -> key), then u64 the run-time
/// address of that library's runtime blob in that image (stored after
/// the key: 0 while the claim is being completed). Image 0's libraries
/// use the module table ([`H_MODULES`]).
pub const H_IMAGE_LIBS: u64 = 4096;
/// Entries of the exec'd images' library table.
pub const IMAGE_LIBS: u32 = 240;
/// The working directories of followed execs run by a name of the native
/// path's length (`docs/runtime.md` section 7, "exec"): [`EXEC_CWDS`]
/// entries of 8 bytes, u32 the pid whose new image goes back (0: free;
/// stored last by the recorder, cleared by that image's `init` once it
/// is back), u32 the recorder's descriptor of the directory the process
/// exec'd from (`/proc/H_PID/fd/N`).
pub const H_EXEC_CWD: u64 = H_IMAGE_LIBS + 16 * IMAGE_LIBS as u64;
/// Entries of the followed execs' directory table.
pub const EXEC_CWDS: u32 = 32;
const _: () = assert!(H_EXEC_CWD + 8 * EXEC_CWDS as u64 <= HEADER_SIZE);
/// Hide mode: the variable was absent; the entry equal to the prefix is removed.
pub const HIDE_REMOVE: u32 = 1;
/// Hide mode: the variable was empty; the entry equal to the prefix is cut after `NAME=`.
pub const HIDE_EMPTY: u32 = 2;
/// Hide mode: the entry is the prefix followed by the native value; it is
/// pointed at a `NAME=` written just before that value.
pub const HIDE_SUFFIX: u32 = 3;
/// ENTER and LANDING payloads carry the module tag in their top bits and
/// the procedure number (within the module) below `1 << TAG_SHIFT`.
pub const TAG_SHIFT: u32 = 24;

/// Header flag: the region is a standalone file (no recorder); full halves
/// are appended to the file as chunks.
pub const FLAG_STANDALONE: u32 = 1;
/// Header flag: a thread or process found no free slot (the program was
/// stopped with a message; the trace is incomplete).
pub const FLAG_SLOTS_EXHAUSTED: u32 = 2;
/// Header flag: a writer found the recorder gone (killed); every `flush`
/// then writes its half over again and the program runs on untraced.
pub const FLAG_RECORDER_GONE: u32 = 4;
/// Header flag: the recorder exec'd the program from another working
/// directory (`record::execname`); the first `init` clears it and goes to
/// the recorder's (`/proc/H_PID/cwd`).
pub const FLAG_CHDIR: u32 = 8;
/// Header flag: the recorder answered a `posix_spawn` with a directory
/// of names (`record::execname::followed`); from then on each new
/// image's `init` that was not exec'd by a request of its own pid looks
/// for that directory's `.aetrace-fd` link in its working directory and,
/// when it names a descriptor, goes back there (`exe::followed_exec`).
pub const FLAG_SPAWN_NAMES: u32 = 16;

/// Size of a slot header; the data halves follow it.
pub const SLOT_HEADER_SIZE: u64 = 4096;

// Slot header field offsets (the %gs base points at the slot header).
/// Absolute address of the next byte to write (writer's address space).
pub const S_POS: u64 = 0;
/// Absolute address of the high-water mark: `POS >= LIMIT` calls `flush`.
pub const S_LIMIT: u64 = 8;
/// The owning thread's `fs:[0]` (glibc TCB self pointer).
pub const S_OWNER: u64 = 16;
/// Absolute address of this slot header in the writer's address space.
pub const S_BASE: u64 = 24;
/// `SLOT_FREE`, `SLOT_ACTIVE` or `SLOT_RELEASED`.
pub const S_STATE: u64 = 32;
/// Slot offset: the writing thread's kernel thread id (u32).
pub const S_TID: u64 = 36;
/// Slot offset: the writing thread's kernel process id (u32), kept while the slot is `SLOT_RELEASED`.
pub const S_PID: u64 = 40;
/// The half (0 or 1) the writer is filling.
pub const S_CUR_HALF: u64 = 44;
/// Per-half state words (u32 each): `HALF_EMPTY` or `HALF_FULL`.
pub const S_HALF_STATE: u64 = 48;
/// Per-half fill (u64 each): bytes reserved in the half when it was sealed.
pub const S_HALF_FILL: u64 = 56;
/// Number of halves sealed so far (standalone: chunk sequence number).
pub const S_SEQ: u64 = 72;
/// Slot index of the creating thread/process, `u32::MAX` for the first.
pub const S_PARENT: u64 = 80;
/// Run-time address of the runtime blob's start in the process owning the
/// slot (the recorder derives the module's load bias from it).
pub const S_RUNTIME: u64 = 88;
/// Absolute address of the region header in the writer's address space
/// (instrumented shared libraries find the region through their `%gs` slot).
pub const S_REGION: u64 = 96;
/// XFERS: u32 count of the thread's counted transfers (`emit_transfer`:
/// every call the regenerator cannot tell from its neighbours without it,
/// every jump into untraced code); starts at 0 in every slot (threads and
/// fork children alike) and wraps. `signal_entry` puts it in SIGNAL.
pub const S_XFERS: u64 = 104;
/// ONCE: u32, bit `k` set once the thread recorded thread constant `k`
/// (`record --data`: `analysis::addr::returns::THREAD_CONSTANTS`, the
/// rewriter's `Value::Once`); starts at 0 in every slot (threads and
/// fork children alike). `signal_entry` saves it in the handler's frame
/// and clears it, `sigreturn` puts it back, so a handler records its own
/// as the regenerator's walk expects (`docs/data.md`).
pub const S_ONCE: u64 = 108;
/// IMAGE: u64 id of the rewritten executable whose `init` claimed the
/// first slot of the process image (the rewriter's `image_id`, a hash of
/// the copy; 0 from a blob without one), inherited by the slots its
/// threads and fork children claim. The recorder tells by it which
/// image a process exec'd (`docs/runtime.md` section 1).
pub const S_IMAGE: u64 = 112;
/// SERIAL: u32 serial of the process image that claimed its first slot
/// ([`H_IMAGES`]), inherited like IMAGE: a library's runtime publishes
/// its address under it, in the module table for image 0, in
/// [`H_IMAGE_LIBS`] for the others.
pub const S_SERIAL: u64 = 120;

/// EXEC_STATE: u32, an exec request of the slot's thread to the recorder
/// (`exec_request`, `docs/runtime.md` section 7, "exec"):
/// [`EXEC_IDLE`], [`EXEC_ASKED`] (the fields below are filled; the
/// thread waits on this word), [`EXEC_ANSWERED`] (the recorder wrote
/// EXEC_ANSWER and woke it).
pub const S_EXEC_STATE: u64 = 128;
/// EXEC_KIND: u32 [`ExecKind`] of the request.
pub const S_EXEC_KIND: u64 = 132;
/// EXEC_ARGS: 8 × u64, the caller's rdi, rsi, rdx, rcx, r8, r9, r10 and
/// rax at the exec call or system call.
pub const S_EXEC_ARGS: u64 = 136;
/// EXEC_SP: u64, the caller's rsp at the call (a variadic `execl`'s
/// arguments after the sixth are there).
pub const S_EXEC_SP: u64 = 200;
/// EXEC_BUF: u64, the address of [`EXEC_BUF_SIZE`] bytes of the thread's
/// stack the recorder may write its answer into.
pub const S_EXEC_BUF: u64 = 208;
/// EXEC_ANSWER: u64, 0 (run the exec as the program called it: natively,
/// untraced or failing as it would) or the address in EXEC_BUF of seven
/// u64 words. An exec's answer: the path, argv and envp of the `execve`
/// that runs the rewritten copy; then, for an exec by a name of the
/// native path's length, the directory of names to exec from, the
/// process's own directory to go back to should the `execve` fail, and
/// the header offset of the process's [`H_EXEC_CWD`] entry, freed then
/// (0s: none); the seventh 0. A spawn's answer: the first
/// three as an exec's; fourth, the file actions the child runs (0: the
/// program's own): a copy of the program's followed by an `open` of `.`
/// ([`SPAWN_BACK_FLAGS`]) at a descriptor N free in the child and a
/// `chdir` to the directory of names (`exe::followed_exec` goes back);
/// fifth, that directory (0: none); sixth, [`ExecKind::Shell`]'s
/// functions; seventh, N, for a caller that makes its own actions
/// (`popen`).
pub const S_EXEC_ANSWER: u64 = 216;
/// The flags of a followed spawn child's `open` of `.`, the directory its
/// new image goes back to (not close-on-exec: it outlives the exec).
pub const SPAWN_BACK_FLAGS: i32 = libc::O_PATH | libc::O_DIRECTORY;
/// ENTRY_RSP: u64, the `rsp` of the thread's last outside entry whose
/// stub wrote it as a VALUE in a control-only trace (format 1.21), or 0:
/// none. An outside-entry stub whose `rsp` equals it writes
/// [`RecordKind::EnterSame`] and no VALUE; a stub that writes the VALUE
/// stores its `rsp` here right after it. Starts at 0 in every slot
/// (threads and fork children alike); `signal_entry` saves it in the
/// handler's frame and clears it, `sigreturn` puts it back, as the
/// readers' stack of entry `rsp`s does at SIGNAL and SIGRETURN.
pub const S_ENTRY_RSP: u64 = 224;
/// Bytes of stack `exec_request` lends the recorder for its answer.
pub const EXEC_BUF_SIZE: u64 = 16384;
/// SPAWN_BUF: the slot's bytes lent to the recorder for its answer to a
/// `posix_spawn` request (EXEC_BUF then points here): the answer must
/// outlive the request, up to the child's `execve` inside libc, and the
/// stack below the caller's rsp is where `posix_spawn`'s frames go.
pub const S_SPAWN_BUF: u64 = 256;
/// Bytes of [`S_SPAWN_BUF`]: the rest of the slot header.
pub const SPAWN_BUF_SIZE: u64 = SLOT_HEADER_SIZE - S_SPAWN_BUF;
/// EXEC_STATE: no request.
pub const EXEC_IDLE: u32 = 0;
/// EXEC_STATE: a request waits for the recorder.
pub const EXEC_ASKED: u32 = 1;
/// EXEC_STATE: the recorder answered.
pub const EXEC_ANSWERED: u32 = 2;

/// EXEC_KIND bit: the request comes from inside the callee (a PLT stub's
/// `jmp [GOT]` or its lazy-binding piece), where the call's return
/// address is on the stack: the caller's stack arguments start 8 bytes
/// above the rsp the request saw.
pub const EXEC_ENTERED: u32 = 0x100;

/// What an exec request intercepted: libc's exec family at a call from
/// traced code to the untraced function (arguments as the function takes
/// them), or an `execve`/`execveat` system call in traced code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ExecKind {
    /// A `syscall` instruction; rax says `execve` (59) or `execveat` (322).
    Syscall = 0,
    /// `execve(path, argv, envp)`.
    Execve = 1,
    /// `execv(path, argv)`.
    Execv = 2,
    /// `execvp(file, argv)`.
    Execvp = 3,
    /// `execvpe(file, argv, envp)`.
    Execvpe = 4,
    /// `execl(path, arg, ..., NULL)`.
    Execl = 5,
    /// `execlp(file, arg, ..., NULL)`.
    Execlp = 6,
    /// `execle(path, arg, ..., NULL, envp)`.
    Execle = 7,
    /// `fexecve(fd, argv, envp)`.
    Fexecve = 8,
    /// `posix_spawn(pid, path, file_actions, attr, argv, envp)`: the
    /// answer replaces `path` and `argv` and the call runs.
    Spawn = 9,
    /// `posix_spawnp(pid, file, file_actions, attr, argv, envp)`.
    Spawnp = 10,
    /// The runtime's `posix_spawn` of the shell in place of an untraced
    /// libc's `system` or `popen` (`shell_call`, [`Replaced`]): asked as `Spawn`, in
    /// the process's current environment; the answer's third word is
    /// that environment, its sixth the address of the libc functions
    /// the replacement calls ([`SHELL_FUNCTIONS`]).
    Shell = 11,
}

impl ExecKind {
    /// The libc function a call intercepts, by its name (a version
    /// after `@` ignored).
    pub fn of_function(name: &str) -> Option<ExecKind> {
        Some(match name.split('@').next().unwrap_or(name) {
            "execve" => ExecKind::Execve,
            "execv" => ExecKind::Execv,
            "execvp" => ExecKind::Execvp,
            "execvpe" => ExecKind::Execvpe,
            "execl" => ExecKind::Execl,
            "execlp" => ExecKind::Execlp,
            "execle" => ExecKind::Execle,
            "fexecve" => ExecKind::Fexecve,
            "posix_spawn" => ExecKind::Spawn,
            "posix_spawnp" => ExecKind::Spawnp,
            _ => return None,
        })
    }

    /// A `posix_spawn` call: the request's answer goes to
    /// [`S_SPAWN_BUF`] and the call runs with it, no `execve` in between.
    pub fn spawns(self) -> bool {
        ExecKind::SPAWNS.contains(&self)
    }

    /// The kinds that [`ExecKind::spawns`].
    pub const SPAWNS: [ExecKind; 3] = [ExecKind::Spawn, ExecKind::Spawnp, ExecKind::Shell];

    /// The kind of an EXEC_KIND word.
    pub fn from_u32(k: u32) -> Option<ExecKind> {
        use ExecKind::*;
        [
            Syscall, Execve, Execv, Execvp, Execvpe, Execl, Execlp, Execle, Fexecve, Spawn, Spawnp,
            Shell,
        ]
        .into_iter()
        .find(|e| *e as u32 == k)
    }
}

/// A libc function whose call from traced code to an untraced libc the
/// runtime replaces (`docs/runtime.md` section 7, "system and popen"):
/// r11's low byte at the call of its runtime entry point. One plan for
/// all of them ([`REPLACED`]): the rewriter places the call where an
/// untraced `posix_spawn` is asked, and skips the program's call when
/// the runtime made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Replaced {
    /// `system(command)`: the shell spawned ([`ExecKind::Shell`]).
    System = 1,
    /// `popen(command, mode)`: the shell spawned ([`ExecKind::Shell`])
    /// with a pipe; the stream kept in the runtime's list.
    Popen = 2,
    /// `pclose(stream)`: a stream of the runtime's `popen` closed and its
    /// child waited for; any other left to libc's `pclose`.
    Pclose = 3,
}

/// The replaced functions: libc's name, the replacement (each made by
/// the runtime entry point `shell_call`, [`Replaced`] in r11), the
/// function's index in [`SHELL_FUNCTIONS`] (what an unbound lazy PLT
/// slot of it is bound to).
pub const REPLACED: [(&str, Replaced, usize); 3] = [
    ("system", Replaced::System, SHELL_SYSTEM),
    ("popen", Replaced::Popen, SHELL_POPEN),
    ("pclose", Replaced::Pclose, SHELL_PCLOSE),
];

impl Replaced {
    /// The libc function a call intercepts, by its name (a version
    /// after `@` ignored).
    pub fn of_function(name: &str) -> Option<Replaced> {
        let name = name.split('@').next().unwrap_or(name);
        REPLACED.iter().find(|r| r.0 == name).map(|r| r.1)
    }

    /// Its index in [`SHELL_FUNCTIONS`] (the address an unbound lazy
    /// PLT slot is bound to).
    pub fn function(self) -> usize {
        REPLACED.iter().find(|r| r.1 == self).map_or(0, |r| r.2)
    }
}

/// `shell_call`'s r11 bit: the call site's counted transfer ([`S_XFERS`])
/// comes right before the call the replacement skips; it counts it.
pub const SHELL_COUNTED: u32 = 0x200;
/// `shell_call`'s r11 bit: from the LAZY piece of an unbound PLT slot,
/// rax its GOT slot. A replacement binds the slot as `_dl_fixup` would
/// and counts the lazy path's one counted transfer (`<plt0>`'s jump into
/// ld.so), which the regenerator walks after LAZY.
pub const SHELL_LAZY: u32 = 0x400;

/// The libc functions (default versions) whose addresses a [`ExecKind::Shell`]
/// answer gives, in this order.
pub const SHELL_FUNCTIONS: [&str; 16] = [
    "posix_spawn",
    "sigaction",
    "__errno_location",
    "system",
    "popen",
    "pclose",
    "fdopen",
    "fclose",
    "malloc",
    "free",
    "posix_spawn_file_actions_init",
    "posix_spawn_file_actions_adddup2",
    "posix_spawn_file_actions_addclose",
    "posix_spawn_file_actions_destroy",
    "posix_spawn_file_actions_addopen",
    "posix_spawn_file_actions_addchdir_np",
];
/// [`SHELL_FUNCTIONS`] index of `posix_spawn`.
pub const SHELL_SPAWN: usize = 0;
/// [`SHELL_FUNCTIONS`] index of `sigaction`.
pub const SHELL_SIGACTION: usize = 1;
/// [`SHELL_FUNCTIONS`] index of `__errno_location`.
pub const SHELL_ERRNO: usize = 2;
/// [`SHELL_FUNCTIONS`] index of `system`.
pub const SHELL_SYSTEM: usize = 3;
/// [`SHELL_FUNCTIONS`] index of `popen`.
pub const SHELL_POPEN: usize = 4;
/// [`SHELL_FUNCTIONS`] index of `pclose`.
pub const SHELL_PCLOSE: usize = 5;
/// [`SHELL_FUNCTIONS`] index of `fdopen`.
pub const SHELL_FDOPEN: usize = 6;
/// [`SHELL_FUNCTIONS`] index of `fclose`.
pub const SHELL_FCLOSE: usize = 7;
/// [`SHELL_FUNCTIONS`] index of `malloc`.
pub const SHELL_MALLOC: usize = 8;
/// [`SHELL_FUNCTIONS`] index of `free`.
pub const SHELL_FREE: usize = 9;
/// [`SHELL_FUNCTIONS`] index of `posix_spawn_file_actions_init`.
pub const SHELL_FA_INIT: usize = 10;
/// [`SHELL_FUNCTIONS`] index of `posix_spawn_file_actions_adddup2`.
pub const SHELL_FA_DUP2: usize = 11;
/// [`SHELL_FUNCTIONS`] index of `posix_spawn_file_actions_addclose`.
pub const SHELL_FA_CLOSE: usize = 12;
/// [`SHELL_FUNCTIONS`] index of `posix_spawn_file_actions_destroy`.
pub const SHELL_FA_DESTROY: usize = 13;
/// [`SHELL_FUNCTIONS`] index of `posix_spawn_file_actions_addopen`.
pub const SHELL_FA_OPEN: usize = 14;
/// [`SHELL_FUNCTIONS`] index of `posix_spawn_file_actions_addchdir_np`.
pub const SHELL_FA_CHDIR: usize = 15;

/// Never claimed, or released by the recorder for any process.
pub const SLOT_FREE: u32 = 0;
/// Claimed (`lock cmpxchg` from `SLOT_FREE`, or from `SLOT_RELEASED` by
/// the process in `S_PID`): one thread writes it.
pub const SLOT_ACTIVE: u32 = 1;
/// Released by the recorder after its thread exited, while the thread's
/// process still runs: only a thread of that process (`S_PID`, kept) may
/// claim it. A thread not attached yet may still have `%gs` on it (its
/// creator's slot), and the outside-entry stub recognises a slot's owner
/// by its TCB address only, which a thread of *another* process (a fork
/// child reusing a cached stack) may share; threads of one process never
/// share one. Once that process is gone the recorder makes it
/// `SLOT_FREE`.
pub const SLOT_RELEASED: u32 = 2;
/// Half state: the writer may fill it (the drainer has consumed it).
pub const HALF_EMPTY: u32 = 0;
/// Half state: sealed by the writer, waiting for the drainer.
pub const HALF_FULL: u32 = 1;

/// Bytes kept free above the high-water mark: the most any path between two
/// buffer checks may write (all nesting signal handlers included; see
/// `docs/runtime.md`). The rewriter must keep its per-path bound below
/// [`MAX_BYTES_BETWEEN_CHECKS`].
pub const HEADROOM: u64 = 4096;
/// Upper bound the rewriter must respect for the bytes one context writes
/// between two checks; the rest of the headroom is for signal handlers that
/// interrupt it before their own first check (they check first thing).
pub const MAX_BYTES_BETWEEN_CHECKS: u64 = 1024;

/// Standalone chunk header (appended to the file after the region).
pub const CHUNK_MAGIC: u32 = u32::from_le_bytes(*b"AECK");
/// Size of a standalone chunk header: `{magic, slot, seq, len, pid, tid}`.
pub const CHUNK_HEADER_SIZE: u64 = 32;
/// Chunk header offset: [`CHUNK_MAGIC`] (u32).
pub const C_MAGIC: u64 = 0;
/// Chunk header offset: the slot the chunk comes from (u32).
pub const C_SLOT: u64 = 4;
/// Chunk header offset: the chunk's sequence number within its slot (u64).
pub const C_SEQ: u64 = 8;
/// Chunk header offset: the data bytes following the header (u64).
pub const C_LEN: u64 = 16;
/// Chunk header offset: the writer's process id (u32).
pub const C_PID: u64 = 24;
/// Chunk header offset: the writer's thread id (u32).
pub const C_TID: u64 = 28;

/// Standalone defaults (the runtime creates the file itself).
pub const STANDALONE_SLOTS: u32 = 64;
/// Standalone default: bytes per data half.
pub const STANDALONE_HALF: u64 = 64 * 1024;

/// The "never written" byte.
pub const UNWRITTEN: u8 = 0x00;
/// First byte of every escape record.
pub const ESCAPE: u8 = 0xFF;
/// Set in the kind byte while the record's payload is being written.
pub const KIND_PENDING: u8 = 0x80;

/// Set in a SIGNAL's or FAULT's signal number (format 1.16) when the
/// interrupted rip is a `rep` string instruction's own (`movs`, `stos`,
/// `lods`, `ins`, `outs`) in a `--data` executable's trace: the context's
/// `rcx`, `rsi` and `rdi` follow as three VALUEs, which say how many of
/// its iterations ran before the signal (docs/data.md, "Signals with
/// data"). The regenerator's `stream::kind::SIGNAL_REP_REGISTERS`.
pub const SIGNAL_REP_REGISTERS: u32 = 1 << 8;

/// Escape record kinds. Record layout: `[0xFF][kind][payload]`, payload
/// little-endian, total length [`RecordKind::encoded_len`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RecordKind {
    /// Outside entry into procedure `u32` (callback, thread start, handler, main).
    Enter = 1,
    /// Indirect branch to `u64` (absolute target in the original code).
    Indirect = 2,
    /// A signal handler starts: `u32` signal number, `u64` the interrupted
    /// RIP as saved in the kernel's ucontext (after the fix-up completed any
    /// pending witness stores and advanced it), then `u32` the thread's
    /// transfer count ([`S_XFERS`]) at the interruption. Kind 15 since
    /// format 1.2; kind 3 (format 1.1, no count) is no longer written.
    /// The signal number has [`SIGNAL_REP_REGISTERS`] set when three VALUEs
    /// follow (format 1.16).
    Signal = 15,
    /// A setjmp-like call returned again (a longjmp, traced or not, came
    /// back to it; written at its return point when `eax != 0`): `u32`
    /// `tag << 24 | procedure`, `u64` `rsp` there (the same as at the
    /// call, its SETJMP's), `u32` the call block's index in the procedure
    /// (format 1.10; reserved and never written before).
    SetjmpResume = 4,
    /// Control escaped to uninstrumented original code at `u64`.
    Desync = 5,
    /// `exit`/`_exit` called with status `u32` (frames may still be active).
    Exit = 6,
    /// First record of a fork child's stream: `u32` parent slot.
    Fork = 7,
    /// First record of a new thread's stream: `u32` slot of the creating thread.
    Thread = 8,
    /// A witness of a procedure with more than 254 witness edges: `u16`.
    Wide = 9,
    /// Control came back from an external (untraced) call, after any
    /// callbacks it made; no payload.
    Return = 10,
    /// The unwinder entered a landing pad of procedure `u32` (C++
    /// exceptions): frames above the one whose current call site has that
    /// landing pad were discarded.
    Landing = 11,
    /// In the parent, right after `fork`/`vfork` returned: `u32` child pid
    /// (the child's stream, FORK first, continues from this point).
    Forked = 12,
    /// Just before a call to `setjmp`-like functions: `u64` `rsp` at the
    /// call (format 1.10; before, the jmp_buf address).
    Setjmp = 13,
    /// Just before a call to `longjmp`-like functions: `u64` jmp_buf
    /// address. No longer written since format 1.10 (SETJMP_RESUME at the
    /// setjmp's return point says where a longjmp went, traced or not).
    Longjmp = 14,
    /// A PLT stub's `jmp [GOT]` found its slot not bound yet (lazy binding):
    /// `u32` `tag << 24 | procedure` of the stub, written first on the
    /// lazy-binding path (format 1.3). The bound outcome writes nothing.
    Lazy = 16,
    /// The runtime's handler for a signal whose default action ends the
    /// process (the program left it at `SIG_DFL`) ran: the same payload as
    /// [`RecordKind::Signal`] (`u32` signal number, `u64` the interrupted
    /// RIP after the fix-up, `u32` transfer count). The thread's last
    /// record: the signal then ends the process (format 1.5).
    Fault = 17,
    /// `aetrace record --data --check` (format 1.4): a value the
    /// regenerator needs for a data address, `u64`: an effective address
    /// in full, or for a `rep` string instruction its `rcx` and `rflags`
    /// (`analysis::addr::full` says which, per instruction).
    Value = 18,
    /// Outside entry into a secondary entry point of a procedure with
    /// several (glibc's `__mempcpy` falling into `__memmove`): `u32`
    /// `tag << 24 | procedure`, then `u32` the entry's link-time address,
    /// where its copy starts (format 1.6).
    EnterAt = 19,
    /// A traced signal handler returned (its restorer, the runtime's
    /// `sigreturn`, runs before `rt_sigreturn`): `u64` the rip the thread
    /// resumes at, mapped as SIGNAL's (format 1.11). Equal to its
    /// SIGNAL's rip unless the handler moved the rip.
    SigReturn = 20,
    /// Outside entry into procedure `u32` (`tag << 24 | procedure`), as
    /// ENTER, in a control-only trace whose stub found the entry's `rsp`
    /// equal to the one of the thread's last entry that wrote it
    /// ([`S_ENTRY_RSP`]): no VALUE follows, the readers repeat that `rsp`
    /// (format 1.21). Where the `rsp` differs the stub writes ENTER and
    /// the VALUE.
    EnterSame = 21,
}

impl RecordKind {
    /// Total encoded length (prefix and kind included).
    pub const fn encoded_len(self) -> u64 {
        2 + self.payload_len()
    }

    /// Payload length in bytes.
    pub const fn payload_len(self) -> u64 {
        match self {
            RecordKind::Return => 0,
            RecordKind::Wide => 2,
            RecordKind::Enter
            | RecordKind::EnterSame
            | RecordKind::Exit
            | RecordKind::Fork
            | RecordKind::Thread
            | RecordKind::Landing
            | RecordKind::Forked
            | RecordKind::Lazy => 4,
            RecordKind::Indirect
            | RecordKind::Desync
            | RecordKind::Setjmp
            | RecordKind::Longjmp
            | RecordKind::Value
            | RecordKind::EnterAt
            | RecordKind::SigReturn => 8,
            RecordKind::Signal | RecordKind::Fault | RecordKind::SetjmpResume => 16,
        }
    }

    /// Decodes a (final, not pending) kind byte.
    pub const fn from_byte(b: u8) -> Option<RecordKind> {
        Some(match b {
            1 => RecordKind::Enter,
            2 => RecordKind::Indirect,
            4 => RecordKind::SetjmpResume,
            5 => RecordKind::Desync,
            6 => RecordKind::Exit,
            7 => RecordKind::Fork,
            8 => RecordKind::Thread,
            9 => RecordKind::Wide,
            10 => RecordKind::Return,
            11 => RecordKind::Landing,
            12 => RecordKind::Forked,
            13 => RecordKind::Setjmp,
            14 => RecordKind::Longjmp,
            15 => RecordKind::Signal,
            16 => RecordKind::Lazy,
            17 => RecordKind::Fault,
            18 => RecordKind::Value,
            19 => RecordKind::EnterAt,
            20 => RecordKind::SigReturn,
            21 => RecordKind::EnterSame,
            _ => return None,
        })
    }
}

/// Region geometry, as written in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Number of slots (the most threads and processes writing at once).
    pub slot_count: u32,
    /// Bytes in each of a slot's two data halves.
    pub half_size: u64,
}

impl Geometry {
    /// Bytes per slot: header plus two halves.
    pub const fn slot_size(&self) -> u64 {
        SLOT_HEADER_SIZE + 2 * self.half_size
    }

    /// Bytes of the whole region.
    pub const fn region_size(&self) -> u64 {
        HEADER_SIZE + self.slot_count as u64 * self.slot_size()
    }

    /// Offset of slot `i` in the region.
    pub const fn slot_offset(&self, i: u32) -> u64 {
        HEADER_SIZE + i as u64 * self.slot_size()
    }

    /// Offset of half `h` of a slot, relative to the slot.
    pub const fn half_offset(&self, h: u32) -> u64 {
        SLOT_HEADER_SIZE + h as u64 * self.half_size
    }

    /// File bytes one standalone chunk occupies (header + a full half + headroom).
    pub const fn chunk_space(&self) -> u64 {
        CHUNK_HEADER_SIZE + self.half_size
    }
}

/// How far the bytes in `data` form complete witnesses and records.
/// Returns the length of the longest valid prefix and the number of
/// witness bytes in it (counted in the same pass: the recorder needs both
/// for every byte of every stream), or an error offset and byte for an
/// unknown record kind.
pub fn valid_prefix(data: &[u8]) -> Result<(usize, u64), (usize, u8)> {
    valid_prefix_with(data, |_, _| {})
}

/// [`valid_prefix`], calling `on_record` with each complete record's
/// offset and kind (the drainer finds VALUE records this way, for the
/// recorder's `zstd+values` codec: [`crate::Batch::values`]).
pub fn valid_prefix_with(
    data: &[u8],
    mut on_record: impl FnMut(usize, RecordKind),
) -> Result<(usize, u64), (usize, u8)> {
    const VALUE: u8 = RecordKind::Value as u8;
    const VALUE_LEN: usize = RecordKind::Value.encoded_len() as usize;
    let mut i = 0usize;
    let mut witnesses = 0u64;
    loop {
        // One word finds the next record (or the end) whether witnesses
        // come first or not: no branch on which, the one a data trace's
        // mix of VALUE records and witnesses mispredicts.
        let run = skip_witnesses(data, i);
        witnesses += (run - i) as u64;
        i = run;
        let Some(&[b, k]) = data.get(i..i + 2) else {
            break;
        };
        if b != ESCAPE || k == UNWRITTEN || k & KIND_PENDING != 0 {
            break;
        }
        // VALUE records are most of a data trace's stream, often several
        // in a row (bzip2's): taken without the kind and length tables,
        // a run of them without looking for witnesses between.
        if k == VALUE {
            if i + VALUE_LEN > data.len() {
                break;
            }
            on_record(i, RecordKind::Value);
            i += VALUE_LEN;
            while let Some([ESCAPE, VALUE, ..]) = data.get(i..i + VALUE_LEN) {
                on_record(i, RecordKind::Value);
                i += VALUE_LEN;
            }
            continue;
        }
        let kind = RecordKind::from_byte(k).ok_or((i + 1, k))?;
        let end = i + kind.encoded_len() as usize;
        if end > data.len() {
            break;
        }
        on_record(i, kind);
        i = end;
    }
    Ok((i, witnesses))
}

/// The index of the first byte at or after `from` that is not a witness
/// (`0x00` or `0xFF`), or `data.len()`. Eight bytes at a time: the
/// recorder scans every stream byte this way, and witnesses are most of
/// a control trace's bytes.
#[inline]
pub fn skip_witnesses(data: &[u8], from: usize) -> usize {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    // The high bit of each zero byte of `v`, and possibly of bytes above
    // the lowest zero byte (the borrow runs upwards): the lowest bit set is
    // exactly the first zero byte.
    let zeros = |v: u64| v.wrapping_sub(LO) & !v & HI;
    let mut i = from;
    while let Some(w) = data.get(i..i + 8) {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        let stops = zeros(w) | zeros(!w);
        if stops != 0 {
            // Records come every few bytes in real streams: the stop is
            // found in the word, not byte by byte.
            let i = i + (stops.trailing_zeros() / 8) as usize;
            debug_assert!(data[from..i].iter().all(|&b| b != UNWRITTEN && b != ESCAPE));
            return i;
        }
        i += 8;
    }
    while data.get(i).is_some_and(|&b| b != UNWRITTEN && b != ESCAPE) {
        i += 1;
    }
    debug_assert!(data
        .get(from..i)
        .map_or(true, |s| s.iter().all(|&b| b != UNWRITTEN && b != ESCAPE)));
    i
}

/// The descriptor number at which the recorder keeps the region's memfd
/// open, in its own process only (close-on-exec: the program never
/// inherits it). A runtime's `init` finds the region by walking up its
/// ancestors (`/proc/PID/stat`) to the first whose `/proc/PID/fd/REGION_FD`
/// is the memfd [`REGION_MEMFD_LINK`] and whose region header names PID as
/// its creator ([`H_PID`]): the recorder is an ancestor of every process it
/// records (it is their subreaper), so an exec'd image finds it too, and
/// the program's environment and descriptors stay its own
/// (`docs/runtime.md` section 1).
pub const REGION_FD: i32 = 1023;
/// The memfd's name, as `memfd_create` is given it.
pub const REGION_MEMFD_NAME: &str = "aetrace-witnesses";
/// What `readlink("/proc/PID/fd/REGION_FD")` says for the region's memfd.
pub const REGION_MEMFD_LINK: &str = "/memfd:aetrace-witnesses (deleted)";
/// How many ancestors `init` looks at before it gives up.
pub const MAX_ANCESTORS: u32 = 64;

#[cfg(test)]
mod tests {
    use super::*;

    /// The kinds and total lengths of the table in `docs/runtime.md` section 2.
    const TABLE: [(u8, u64); 20] = [
        (1, 6),
        (2, 10),
        (4, 18),
        (5, 10),
        (6, 6),
        (7, 6),
        (8, 6),
        (9, 4),
        (10, 2),
        (11, 6),
        (12, 6),
        (13, 10),
        (14, 10),
        (15, 18),
        (16, 6),
        (17, 18),
        (18, 10),
        (19, 10),
        (20, 10),
        (21, 6),
    ];

    #[test]
    fn every_kind_decodes_with_its_documented_length() {
        for (byte, len) in TABLE {
            let k = RecordKind::from_byte(byte).expect("documented kind decodes");
            assert_eq!(k as u8, byte);
            assert_eq!(k.encoded_len(), len, "{k:?}");
        }
        // 3: the format 1.1 SIGNAL, never written by this runtime.
        for b in [0u8, 3, 22, 0x7F, 0x80, 0xFF] {
            assert_eq!(RecordKind::from_byte(b), None, "{b:#x}");
        }
    }

    #[test]
    fn skip_witnesses_stops_at_the_first_hole_or_escape() {
        let mut d = vec![0x11u8; 40];
        assert_eq!(skip_witnesses(&d, 0), 40);
        assert_eq!(skip_witnesses(&d, 39), 40);
        assert_eq!(skip_witnesses(&d, 41), 41);
        for at in 0..40 {
            for stop in [UNWRITTEN, ESCAPE] {
                d[at] = stop;
                for from in 0..=at {
                    assert_eq!(
                        skip_witnesses(&d, from),
                        at,
                        "stop {stop:#x} at {at} from {from}"
                    );
                }
                d[at] = 0x11;
            }
        }
        // Bytes next to the stop values are witnesses.
        assert_eq!(
            skip_witnesses(&[0x01, 0xFE, 0x80, 0x7F, 0x01, 0xFE, 0x80, 0x7F, 0xFF], 0),
            8
        );
    }

    #[test]
    fn valid_prefix_stops_at_holes_and_pending_records() {
        let mut d = vec![0x11, 0xFF, 10, 0x22, 0xFF, 15];
        d.extend(7u32.to_le_bytes());
        d.extend(0x4000_1234u64.to_le_bytes());
        d.extend(42u32.to_le_bytes());
        assert_eq!(valid_prefix(&d), Ok((d.len(), 2)));
        assert_eq!(
            valid_prefix(&d[..d.len() - 1]),
            Ok((4, 2)),
            "truncated SIGNAL"
        );
        assert_eq!(valid_prefix(&[0x11, 0xFF, 0x80 | 10]), Ok((1, 1)));
        assert_eq!(valid_prefix(&[0x11, 0x00, 0x22]), Ok((1, 1)));
        assert_eq!(valid_prefix(&[0x11, 0xFF, 0x42]), Err((2, 0x42)));
    }

    #[test]
    fn valid_prefix_counts_the_witnesses_around_records() {
        // w w [SIGNAL, 18 bytes] w [RETURN, 2 bytes] w w w, then a long
        // run that the eight-byte scan crosses: 6 + 20 witnesses.
        let mut s = vec![
            1, 2, 0xFF, 15, 11, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0,
        ];
        s.extend([9, 0xFF, 10, 4, 5, 6]);
        s.extend([0x33; 20]);
        assert_eq!(valid_prefix(&s), Ok((s.len(), 26)));
        for end in 0..=s.len() {
            let (n, w) = valid_prefix(&s[..end]).unwrap();
            // A naive count over the valid prefix: its bytes outside records.
            let mut naive = 0u64;
            let mut i = 0;
            while i < n {
                if s[i] == ESCAPE {
                    i += RecordKind::from_byte(s[i + 1]).unwrap().encoded_len() as usize;
                } else {
                    naive += 1;
                    i += 1;
                }
            }
            assert_eq!(w, naive, "prefix of {end} bytes");
        }
    }

    /// [`valid_prefix_with`]'s naive twin: byte by byte, each record's
    /// length from the kind table.
    type Scan = Result<(usize, u64, Vec<(usize, RecordKind)>), (usize, u8)>;
    fn naive_prefix(data: &[u8]) -> Scan {
        let (mut i, mut witnesses, mut records) = (0, 0, Vec::new());
        while let Some(&b) = data.get(i) {
            if b == UNWRITTEN {
                break;
            }
            if b != ESCAPE {
                witnesses += 1;
                i += 1;
                continue;
            }
            let Some(&k) = data.get(i + 1) else { break };
            if k == UNWRITTEN || k & KIND_PENDING != 0 {
                break;
            }
            let kind = RecordKind::from_byte(k).ok_or((i + 1, k))?;
            if i + kind.encoded_len() as usize > data.len() {
                break;
            }
            records.push((i, kind));
            i += kind.encoded_len() as usize;
        }
        Ok((i, witnesses, records))
    }

    /// Random streams of witnesses and records (payloads rich in `0x00` and
    /// `0xFF`, runs of VALUE records, long runs of witnesses that the
    /// eight-byte scan crosses, a hole, a pending or unknown kind now and
    /// then), cut at many lengths (every one in one round of eight, those
    /// near a multiple of 64 in the others): the scan finds the same
    /// prefix, witnesses and records as its naive twin, or the same error.
    #[test]
    fn valid_prefix_agrees_with_its_naive_twin() {
        let kinds: Vec<RecordKind> = (1..0x80).filter_map(RecordKind::from_byte).collect();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut rand = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for round in 0..400 {
            let mut s = Vec::new();
            while s.len() < 300 {
                match rand(100) {
                    0..=39 => s.push(1 + rand(0xFE) as u8),
                    40..=79 => {
                        let kind = match rand(3) {
                            0 => kinds[rand(kinds.len() as u64) as usize],
                            _ => RecordKind::Value,
                        };
                        s.extend([ESCAPE, kind as u8]);
                        for _ in 2..kind.encoded_len() {
                            s.push([0x00, 0xFF, rand(256) as u8][rand(3) as usize]);
                        }
                    }
                    80..=97 => s.extend(std::iter::repeat(0x11).take(rand(80) as usize)),
                    _ => s.extend(
                        [[UNWRITTEN, 1], [ESCAPE, KIND_PENDING | 18], [ESCAPE, 0x42]]
                            [rand(3) as usize],
                    ),
                }
            }
            for end in (0..=s.len()).filter(|e| round % 8 == 0 || e % 64 < 12 || e % 64 > 52) {
                let mut seen = Vec::new();
                let got = valid_prefix_with(&s[..end], |i, k| seen.push((i, k)))
                    .map(|(n, w)| (n, w, std::mem::take(&mut seen)));
                let want = naive_prefix(&s[..end]);
                assert_eq!(got, want, "round {round}, prefix of {end} bytes");
            }
        }
    }

    #[test]
    fn value_runs_are_taken_whole_or_not_at_all() {
        // w [VALUE] [VALUE] w [VALUE], the payloads full of 0x00 and 0xFF
        // bytes that only the record's length tells from a hole or an escape.
        let value = |v: u64| {
            let mut r = vec![ESCAPE, RecordKind::Value as u8];
            r.extend(v.to_le_bytes());
            r
        };
        let mut s = vec![7];
        s.extend(value(0x00FF_0000_FFFF_0000));
        s.extend(value(u64::MAX));
        s.push(9);
        s.extend(value(0));
        let bounds = [0, 1, 11, 21, 22, 32];
        for end in 0..=s.len() {
            let mut seen = Vec::new();
            let (n, w) = valid_prefix_with(&s[..end], |i, k| seen.push((i, k))).unwrap();
            let want = bounds.iter().copied().filter(|&b| b <= end).max().unwrap();
            assert_eq!(n, want, "prefix of {end} bytes");
            assert_eq!(
                w,
                u64::from(n >= 1) + u64::from(n >= 22),
                "prefix of {end} bytes"
            );
            let values: Vec<_> = [1, 11, 22]
                .into_iter()
                .filter(|&i| i + 10 <= n)
                .map(|i| (i, RecordKind::Value))
                .collect();
            assert_eq!(seen, values, "prefix of {end} bytes");
        }
    }
}
