//! The recorder side of the witness region: create it (memfd), publish it
//! where the program's runtime finds it (`layout::REGION_FD`), and drain every slot's bytes while the program runs and
//! after it has died (design decision 4: a killed program keeps every
//! witness it wrote, because the region is `MAP_SHARED` and we map it too).
//! Also reads standalone trace files the runtime wrote on its own.
//!
//! Invariants:
//! - The drainer yields, per slot, only complete witnesses and records, in
//!   write order, each byte exactly once; it stops at the first `0x00`
//!   (reserved, not yet written) or pending record, and resumes there.
//! - A half is zeroed and handed back (`HALF_EMPTY`, futex wake) only after
//!   every byte up to its sealed fill was yielded, or unread when its
//!   slot's stream is broken (an error was returned for it): a writer never
//!   blocks for ever on a stream the recorder cannot use.
//! - Slots ever claimed form a prefix of the slot array (the runtime's
//!   `claim` takes the lowest slot it may take, and a slot never claimed
//!   is `SLOT_FREE` for every process), so a pass stops at the first free
//!   slot past the longest prefix it has seen claimed; below it a free or
//!   released slot is a hole left by [`Drainer::reclaim`].
//! - Slot reuse ([`Drainer::reclaim`]): a slot is released only once its
//!   writer thread is gone (`tgkill(pid, tid, 0)` says ESRCH: its last
//!   store is done), after the rest of its stream was yielded; every
//!   header field `claim` does not set is reset and the data it left is
//!   zeroed *before* the state leaves `SLOT_ACTIVE` (a release store), so
//!   the `lock cmpxchg` that claims it again sees a clean slot. Its cursor
//!   starts again at half 0, offset 0: the next claim is a new stream.
//!   Races (`docs/runtime.md` section 8, "Slot reuse"): nothing else
//!   writes an active slot whose thread is gone; a thread still pointing
//!   `%gs` at it (not attached yet) only reads OWNER, TID, RUNTIME,
//!   REGION and SERIAL, and the reset keeps RUNTIME, IMAGE, SERIAL, REGION
//!   and PID, which
//!   belong to the process, and clears OWNER, which no TCB equals.
//! - Bytes read from a region or file are untrusted: every offset is bounds
//!   checked and bad layouts are errors, never panics.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use memmap2::{MmapMut, MmapOptions};

use crate::layout::*;
use crate::Error;

/// The shared region, created by the recorder before it starts the program.
pub struct Region {
    file: File,
    _map: MmapMut,
    base: *mut u8,
    geometry: Geometry,
}

// The region is shared memory written by other processes; all concurrent
// accesses go through atomics or volatile reads below.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

/// The region's copy at [`REGION_FD`] ([`Region::publish`]), closed on drop.
#[must_use = "the region stays published only while this lives"]
pub struct Published(());

impl Drop for Published {
    fn drop(&mut self) {
        // SAFETY: the descriptor `publish` made; nothing else uses it.
        unsafe { libc::close(REGION_FD) };
    }
}

fn io(what: &'static str) -> Error {
    Error::Io {
        what,
        source: std::io::Error::last_os_error(),
    }
}

/// Grows this process's descriptor table to hold [`REGION_FD`], for a
/// process that will publish a region later, once it runs threads: the
/// kernel grows a table that threads share only after an RCU grace period
/// (`expand_fdtable`), about 10 ms on the 2-core VM of `docs/runtime.md`
/// section 1, which was most of a recorded empty `main()`'s run; a table
/// never shrinks, so growing it while the process has one thread makes
/// [`Region::publish`]'s `dup3` cheap. Nothing is left open. An error
/// (a hard limit on open files below [`REGION_FD`]) changes nothing:
/// `publish` reports it.
pub fn reserve_region_fd() -> Result<(), Error> {
    // SAFETY: open/fcntl/close on a constant path and integers.
    unsafe {
        if libc::fcntl(REGION_FD, libc::F_GETFD) >= 0 {
            return Ok(());
        }
        let root = libc::open(c"/".as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
        if root < 0 {
            return Err(io("opening / to grow the descriptor table"));
        }
        let r = dup_at_region_fd(root);
        if r.is_ok() {
            libc::close(REGION_FD);
        }
        libc::close(root);
        r
    }
}

/// A close-on-exec copy of `fd` at [`REGION_FD`]. dup3 may not name a
/// descriptor at or above the soft limit on open files: it is raised for
/// the call only (an open descriptor stays valid above a lowered limit),
/// so the program inherits the limit it would have had.
fn dup_at_region_fd(fd: RawFd) -> Result<(), Error> {
    // SAFETY: getrlimit/setrlimit/dup3/close on integers and a local struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(io("reading RLIMIT_NOFILE"));
        }
        let need = REGION_FD as libc::rlim_t + 1;
        if lim.rlim_max < need {
            return Err(Error::BadRegion(format!(
                "the recorder keeps it at descriptor {REGION_FD}, above the hard limit on open files ({}): raise it to {need} (ulimit -Hn {need})",
                lim.rlim_max
            )));
        }
        let raise = lim.rlim_cur < need;
        if raise {
            let up = libc::rlimit {
                rlim_cur: need,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &up) != 0 {
                return Err(io("raising RLIMIT_NOFILE to publish the witness region"));
            }
        }
        let copy = libc::dup3(fd, REGION_FD, libc::O_CLOEXEC);
        let err = io("publishing the witness region at its descriptor");
        if raise && libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
            if copy >= 0 {
                libc::close(copy);
            }
            return Err(io("restoring RLIMIT_NOFILE"));
        }
        if copy < 0 {
            return Err(err);
        }
    }
    Ok(())
}

impl Region {
    /// Creates a zeroed memfd-backed region with `geometry` and writes its header.
    pub fn create(geometry: Geometry) -> Result<Region, Error> {
        if geometry.slot_count == 0
            || geometry.half_size <= 2 * HEADROOM
            || geometry.half_size & 7 != 0
        {
            return Err(Error::BadRegion(format!(
                "geometry {geometry:?}: need at least one slot and 8-aligned halves above {} bytes",
                2 * HEADROOM
            )));
        }
        // SAFETY: plain syscalls on a NUL-terminated name; the fd is owned by `file`.
        let name = std::ffi::CString::new(REGION_MEMFD_NAME).expect("no NUL in the name");
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io("memfd_create"));
        }
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(geometry.region_size())
            .map_err(|source| Error::Io {
                what: "sizing the witness region",
                source,
            })?;
        // SAFETY: the memfd is ours; the mapping lives as long as `Region`.
        let mut map = unsafe {
            MmapOptions::new()
                .len(geometry.region_size() as usize)
                .map_mut(&file)
        }
        .map_err(|source| Error::Io {
            what: "mapping the witness region",
            source,
        })?;
        let base = map.as_mut_ptr();
        let r = Region {
            file,
            _map: map,
            base,
            geometry,
        };
        r.put_u64(H_MAGIC, MAGIC);
        r.put_u32(H_VERSION, VERSION);
        r.put_u32(H_FLAGS, 0);
        r.put_u64(H_REGION_SIZE, geometry.region_size());
        r.put_u32(H_SLOT_COUNT, geometry.slot_count);
        r.put_u32(H_HEADROOM, HEADROOM as u32);
        r.put_u64(H_SLOT_SIZE, geometry.slot_size());
        r.put_u64(H_HALF_SIZE, geometry.half_size);
        r.put_u32(H_PID, std::process::id());
        Ok(r)
    }

    /// Tells `init` to give the program back its native `key` (section 1 of
    /// `docs/runtime.md`): the recorder sets `key=added` for the rewritten
    /// copy, where the native value was `native`. Possible when the variable
    /// was absent or empty, or when `added` ends with `:` and the native
    /// value (the loader's search path with a directory put first). Returns
    /// whether `init` will hide it.
    pub fn hide_env(&self, key: &[u8], added: &[u8], native: Option<&[u8]>) -> bool {
        let name = [key, b"="].concat();
        let (mode, prefix) = match native {
            None => (HIDE_REMOVE, [&name[..], added].concat()),
            Some([]) => (HIDE_EMPTY, [&name[..], added].concat()),
            Some(v) => match added.strip_suffix(v) {
                Some(head) if head.ends_with(b":") => (HIDE_SUFFIX, [&name[..], head].concat()),
                _ => return false,
            },
        };
        if prefix.len() as u64 > HIDE_MAX {
            return false;
        }
        // SAFETY: the header is ours and the program has not started.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(self.base.add(H_HIDE_BYTES as usize), prefix.len())
        };
        bytes.copy_from_slice(&prefix);
        self.put_u32(H_HIDE + 4, mode);
        self.put_u32(H_HIDE + 8, name.len() as u32);
        self.put_u32(H_HIDE, prefix.len() as u32);
        true
    }

    /// Tells the program's runtime how a native run's `/proc/self/maps`
    /// names the executable (`docs/runtime.md` section 5, "The program's
    /// view of its maps"): lines of the file at `copy` (the path as the
    /// kernel shows it) show `dev_ino` (`MAJOR:MINOR INODE`, as the kernel
    /// prints them) and `original` instead. Returns whether the texts fit
    /// the header ([`VIEW_MAX`]); if not, the view keeps the copy's names.
    pub fn show_exe(&self, copy: &[u8], dev_ino: &[u8], original: &[u8]) -> bool {
        let texts = [copy, dev_ino, original].concat();
        if texts.len() as u64 > VIEW_MAX || copy.is_empty() {
            return false;
        }
        // SAFETY: the header is ours and the program has not started.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(self.base.add(H_VIEW_BYTES as usize), texts.len())
        };
        bytes.copy_from_slice(&texts);
        self.put_u32(H_VIEW + 4, dev_ino.len() as u32);
        self.put_u32(H_VIEW + 8, original.len() as u32);
        self.put_u32(H_VIEW, copy.len() as u32);
        true
    }

    /// Tells the program's runtime its executable's native names
    /// (`docs/runtime.md` section 5, "The executable's names"): `execfn`,
    /// the path a native run is exec'd by, which the first `init` writes
    /// over `AT_EXECFN`'s string when it has that length (empty: none),
    /// and `link`, a symlink to the original's canonical path, which the
    /// program's `readlink` and `realpath` of its own `/proc/PID/exe` are
    /// given (empty: none). Returns whether they fit the header
    /// ([`EXE_MAX`]); if not, neither is given.
    pub fn show_names(&self, execfn: &[u8], link: &[u8]) -> bool {
        let texts = [execfn, b"\0", link, b"\0"].concat();
        let nul = |t: &[u8]| t.contains(&0);
        if texts.len() as u64 > EXE_MAX || nul(execfn) || nul(link) {
            return false;
        }
        // SAFETY: the header is ours and the program has not started.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(self.base.add(H_EXE_BYTES as usize), texts.len())
        };
        bytes.copy_from_slice(&texts);
        self.put_u32(H_EXE + 4, link.len() as u32);
        self.put_u32(H_EXE, execfn.len() as u32);
        true
    }

    /// Tells the program's first `init` to go to this process's working
    /// directory ([`FLAG_CHDIR`]): the program is exec'd from another.
    pub fn chdir_back(&self) {
        self.a32(H_FLAGS).fetch_or(FLAG_CHDIR, Ordering::AcqRel);
    }

    /// The region's file descriptor (close-on-exec).
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Makes the region findable by the programs this process starts next:
    /// a close-on-exec copy of its memfd at [`REGION_FD`], which their
    /// runtime's `init` opens through `/proc/<this pid>/fd` (the program
    /// inherits no descriptor). The copy is closed when the result is
    /// dropped. One region per process at a time: an fd already open at
    /// [`REGION_FD`] is an error (the caller's, or another region's).
    pub fn publish(&self) -> Result<Published, Error> {
        // SAFETY: fcntl on an integer.
        if unsafe { libc::fcntl(REGION_FD, libc::F_GETFD) } >= 0 {
            return Err(Error::BadRegion(format!(
                "descriptor {REGION_FD}, where the witness region is published, is already open"
            )));
        }
        dup_at_region_fd(self.fd())?;
        Ok(Published(()))
    }

    /// The environment variable that hands the region's fd to a runtime
    /// explicitly (`init` reads it before it looks for a recorder among its
    /// ancestors): for a process that creates the region and runs the
    /// runtime itself, as the runtime's tests do. The recorder does not
    /// set it.
    pub fn env(&self) -> (&'static str, String) {
        ("AETRACE_SHM_FD", self.fd().to_string())
    }

    /// The region's slot count and half size.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Header flags (`FLAG_SLOTS_EXHAUSTED`, ...).
    pub fn flags(&self) -> u32 {
        self.a32(H_FLAGS).load(Ordering::Acquire)
    }

    /// The run-time address of the runtime blob of the instrumented shared
    /// library with module tag `tag` (1..`MAX_MODULES`), once that library
    /// has attached (its first traced code ran); 0 before.
    pub fn module_runtime(&self, tag: u32) -> u64 {
        if tag == 0 || tag >= MAX_MODULES {
            return 0;
        }
        self.a64(H_MODULES + 8 * u64::from(tag))
            .load(Ordering::Acquire)
    }

    /// The libraries that attached in images other than image 0 (the
    /// image-library table, layout `H_IMAGE_LIBS`): (image serial, module
    /// tag, run-time address of the library's runtime blob), each entry
    /// once its address is written.
    pub fn image_libraries(&self) -> Vec<(u32, u32, u64)> {
        (0..u64::from(IMAGE_LIBS))
            .map(|i| H_IMAGE_LIBS + 16 * i)
            .map(|e| (self.a64(e).load(Ordering::Acquire), e))
            .take_while(|&(key, _)| key != 0)
            .map(|(key, e)| {
                (
                    (key >> 32) as u32,
                    key as u32,
                    self.a64(e + 8).load(Ordering::Acquire),
                )
            })
            .filter(|&(_, _, address)| address != 0)
            .collect()
    }

    /// A drainer over every slot, starting from the beginning.
    pub fn drainer(&self) -> Drainer<'_> {
        Drainer {
            region: self,
            slots: vec![SlotCursor::default(); self.geometry.slot_count as usize],
            claimed: 0,
            buf: Vec::new(),
            values: Vec::new(),
        }
    }

    fn put_u64(&self, off: u64, v: u64) {
        self.a64(off).store(v, Ordering::Release);
    }

    fn put_u32(&self, off: u64, v: u32) {
        self.a32(off).store(v, Ordering::Release);
    }

    /// The header's "data ready" futex word: bumping it and waking it makes
    /// a [`Drainer::wait`] return at once (the recorder does so when a child
    /// exits).
    pub fn ready_word(&self) -> &AtomicU32 {
        self.a32(H_FUTEX)
    }

    fn a32(&self, off: u64) -> &AtomicU32 {
        debug_assert!(off & 3 == 0 && off + 4 <= self.geometry.region_size());
        // SAFETY: in bounds (all offsets come from the layout), aligned, shared.
        unsafe { &*(self.base.add(off as usize) as *const AtomicU32) }
    }

    fn a64(&self, off: u64) -> &AtomicU64 {
        debug_assert!(off & 7 == 0 && off + 8 <= self.geometry.region_size());
        // SAFETY: as `a32`.
        unsafe { &*(self.base.add(off as usize) as *const AtomicU64) }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct SlotCursor {
    half: u32,
    off: u64,
    /// The writer is gone and the stream ended at a hole: nothing more comes.
    ended: bool,
    /// The stream could not be read (an unknown record, a bad fill): it
    /// yields nothing more, and its sealed halves are handed back unread.
    broken: bool,
    /// The last pass found no new bytes: its writer may have exited
    /// ([`Drainer::exited`] asks only about these).
    idle: bool,
}

/// One batch of a slot's stream.
#[derive(Debug)]
pub struct Batch<'a> {
    /// The slot the bytes were drained from.
    pub slot: u32,
    /// Kernel process id of the writer.
    pub pid: u32,
    /// Kernel thread id of the writer.
    pub tid: u32,
    /// Run-time address of the runtime blob in the writing process (the
    /// slot's `S_RUNTIME`): its load bias is `runtime - runtime_vaddr`.
    pub runtime: u64,
    /// The slot's `S_IMAGE`: which rewritten executable the writing
    /// process runs (0: a blob without an id).
    pub image: u64,
    /// The slot's `S_SERIAL`: the serial of the writing process image
    /// (0: the launched program's), under which its libraries attach.
    pub serial: u32,
    /// Complete witnesses and records, continuing the slot's previous batch.
    pub bytes: &'a [u8],
    /// The witness bytes among `bytes` (the rest are records).
    pub witnesses: u64,
    /// The offsets in `bytes` of its VALUE records, ascending: found by
    /// the drainer's own scan, so the recorder's `zstd+values` codec needs
    /// no second one.
    pub values: &'a [usize],
}

/// Pulls newly written bytes out of every slot, in order.
pub struct Drainer<'r> {
    region: &'r Region,
    slots: Vec<SlotCursor>,
    /// Slots `0..claimed` have been seen claimed: every slot above is
    /// still free and never claimed.
    claimed: u32,
    buf: Vec<u8>,
    /// The VALUE offsets of `buf`'s batch ([`Batch::values`]).
    values: Vec<usize>,
}

/// `kill(pid, 0)` (`tid` 0) or `tgkill(pid, tid, 0)` said ESRCH: no such
/// process, or no such thread in it. A zombie still exists; any other
/// error (none is expected) counts as existing, which only delays reuse.
fn gone(pid: u32, tid: u32) -> bool {
    // SAFETY: signal 0 sends nothing; it only checks existence.
    let r = unsafe {
        if tid == 0 {
            libc::kill(pid as libc::pid_t, 0) as libc::c_long
        } else {
            libc::syscall(libc::SYS_tgkill, pid, tid, 0)
        }
    };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Wakes every writer waiting on `word`, a word of the shared mapping.
fn wake(word: &AtomicU32) {
    // SAFETY: futex wake on a word of the shared mapping.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const AtomicU32,
            libc::FUTEX_WAKE,
            i32::MAX,
        );
    }
}

/// An exec a thread asked the recorder about (`exec_request`, the slot's
/// EXEC fields): it waits until [`Drainer::answer_exec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecRequest {
    /// The asking thread's slot.
    pub slot: u32,
    /// Its process.
    pub pid: u32,
    /// What it was about to call ([`crate::layout::ExecKind`] as a word).
    pub kind: u32,
    /// rdi, rsi, rdx, rcx, r8, r9, r10, rax at the call.
    pub args: [u64; 8],
    /// The caller's rsp at the call.
    pub sp: u64,
    /// The [`EXEC_BUF_SIZE`] bytes the answer may be written to.
    pub buf: u64,
}

impl Drainer<'_> {
    /// The exec requests waiting for an answer, in the slots seen claimed.
    pub fn exec_requests(&self) -> Vec<ExecRequest> {
        let r = self.region;
        let g = r.geometry;
        (0..self.claimed)
            .map(|slot| (slot, g.slot_offset(slot)))
            .filter(|&(_, s)| r.a32(s + S_EXEC_STATE).load(Ordering::Acquire) == EXEC_ASKED)
            .map(|(slot, s)| {
                let kind = r.a32(s + S_EXEC_KIND).load(Ordering::Acquire);
                let sp = r.a64(s + S_EXEC_SP).load(Ordering::Acquire);
                // Inside the callee: its return address lies below the
                // caller's stack arguments.
                let entered = kind & EXEC_ENTERED != 0;
                ExecRequest {
                    slot,
                    pid: r.a32(s + S_PID).load(Ordering::Acquire),
                    kind: kind & !EXEC_ENTERED,
                    args: std::array::from_fn(|i| {
                        r.a64(s + S_EXEC_ARGS + 8 * i as u64)
                            .load(Ordering::Acquire)
                    }),
                    sp: sp + if entered { 8 } else { 0 },
                    buf: r.a64(s + S_EXEC_BUF).load(Ordering::Acquire),
                }
            })
            .collect()
    }

    /// Answers `slot`'s exec request and wakes its thread: `answer` 0
    /// (run the program's own call) or the address of the `execve`
    /// arguments the recorder wrote into the request's buffer.
    pub fn answer_exec(&self, slot: u32, answer: u64) {
        let r = self.region;
        let s = r.geometry.slot_offset(slot);
        r.a64(s + S_EXEC_ANSWER).store(answer, Ordering::Release);
        let state = r.a32(s + S_EXEC_STATE);
        state.store(EXEC_ANSWERED, Ordering::Release);
        wake(state);
    }

    /// The directory table's entries ([`H_EXEC_CWD`]): (index, pid, the
    /// recorder's descriptor), pid 0 for a free or released one.
    pub fn exec_cwds(&self) -> Vec<(u32, u32, u32)> {
        let r = self.region;
        (0..EXEC_CWDS)
            .map(|i| {
                let at = H_EXEC_CWD + 8 * u64::from(i);
                let pid = r.a32(at).load(Ordering::Acquire);
                (i, pid, r.a32(at + 4).load(Ordering::Acquire))
            })
            .collect()
    }

    /// Tells each new image to look for a spawn's directory of names
    /// ([`FLAG_SPAWN_NAMES`]): set before the first answer that uses one.
    pub fn spawn_names(&self) {
        (self.region.a32(H_FLAGS)).fetch_or(FLAG_SPAWN_NAMES, Ordering::AcqRel);
    }

    /// Entry `i` of the directory table: the new image of process `pid`
    /// goes to `/proc/H_PID/fd/FD` (pid 0: the entry is free).
    pub fn set_exec_cwd(&self, i: u32, pid: u32, fd: u32) {
        debug_assert!(i < EXEC_CWDS);
        let at = H_EXEC_CWD + 8 * u64::from(i);
        self.region.put_u32(at + 4, fd);
        // The pid last: the entry is whole when the new image finds it.
        self.region.put_u32(at, pid);
    }

    /// Yields every slot's new complete bytes to `sink`. `finished` says no
    /// process can write any more (all have exited or been killed): then a
    /// `0x00` ends the slot's stream for good instead of being waited for.
    /// Returns the number of bytes yielded, or the first error of this
    /// pass. A slot that fails is broken from then on: it yields nothing
    /// more, but its writer never blocks (its sealed halves are handed
    /// back unread), and the other slots go on as before.
    pub fn poll(&mut self, finished: bool, sink: &mut dyn FnMut(Batch<'_>)) -> Result<u64, Error> {
        let mut total = 0;
        let mut first_error = None;
        let g = self.region.geometry;
        for slot in 0..g.slot_count {
            // Slots ever claimed are a prefix (the runtime claims the
            // lowest slot it may): stop at the first free one past it
            // rather than fault in the header page of every slot.
            match self
                .region
                .a32(g.slot_offset(slot) + S_STATE)
                .load(Ordering::Acquire)
            {
                SLOT_ACTIVE => self.claimed = self.claimed.max(slot + 1),
                SLOT_FREE if slot >= self.claimed => {
                    debug_assert!(self.slots[slot as usize..]
                        .iter()
                        .all(|c| c.off == 0 && c.half == 0 && !c.ended));
                    break;
                }
                // Released by `reclaim`, not claimed again yet.
                _ => continue,
            }
            match self.poll_slot(slot, finished, sink) {
                Ok(n) => {
                    total += n;
                    self.slots[slot as usize].idle = n == 0;
                }
                Err(e) => {
                    self.slots[slot as usize].broken = true;
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(total), Err)
    }

    /// Sleeps until a half is sealed somewhere or `timeout` passes.
    pub fn wait(&self, timeout: Duration) {
        let word = self.region.a32(H_FUTEX);
        let seen = word.load(Ordering::Acquire);
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: futex wait on a word of our mapping; spurious returns are fine.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word as *const AtomicU32,
                libc::FUTEX_WAIT,
                seen,
                &ts,
            );
        }
    }

    /// The active slots that the last pass found idle and whose writer
    /// is gone: ready for [`Drainer::reclaim`]. One `tgkill` per idle
    /// slot: call it at a bounded rate, not after every pass.
    ///
    /// A thread gone from a process that still runs always qualifies.
    /// A slot of a process that is gone (its main thread's, a fork
    /// child's) only when `no_orphans()` says that no orphaned descendant
    /// runs: a child forked outside traced code (libc's `daemon`, whose
    /// parent exits at once) runs on its parent thread's slot without a
    /// `fork_child`, and would write through a reset POS (address 0) if
    /// that slot were reclaimed (`traces/daemon.c`). Such a child outlives
    /// its parent, so the recorder, as subreaper, has it as a child of
    /// its own: while it has none but the program's main process, no
    /// process that a dead one forked is left. `no_orphans` is called at
    /// most once, and only if a gone process holds a slot.
    pub fn exited(&self, no_orphans: &mut dyn FnMut() -> bool) -> Vec<u32> {
        let r = self.region;
        let g = r.geometry;
        let mut orphans_checked: Option<bool> = None;
        let mut no_orphans = || *orphans_checked.get_or_insert_with(&mut *no_orphans);
        (0..self.claimed)
            .filter(|&slot| {
                let s = g.slot_offset(slot);
                // TID and PID are stored before POS, which a claim that
                // is still filling the slot has not set yet (0 since the
                // reset, or never written).
                self.slots[slot as usize].idle
                    && r.a32(s + S_STATE).load(Ordering::Acquire) == SLOT_ACTIVE
                    && r.a64(s + S_POS).load(Ordering::Acquire) != 0
                    && {
                        let tid = r.a32(s + S_TID).load(Ordering::Acquire);
                        let pid = r.a32(s + S_PID).load(Ordering::Acquire);
                        tid != 0
                            && if gone(pid, 0) {
                                no_orphans()
                            } else {
                                tid != pid && gone(pid, tid)
                            }
                    }
            })
            .collect()
    }

    /// Ends the stream of `slot`, whose writer thread is gone
    /// ([`Drainer::exited`]), and releases the slot for a new thread: yields
    /// the rest of its bytes (both halves; it ends at its first unwritten
    /// byte, as after the program's death), resets the header fields
    /// `claim` does not set and zeroes the data, then stores
    /// `SLOT_RELEASED` (its process still runs: only that process may claim
    /// it, `layout::SLOT_RELEASED`) or `SLOT_FREE`, last. The slot is
    /// released even when its rest cannot be read (the error is returned,
    /// as `poll` would): a broken stream must not keep a slot.
    pub fn reclaim(&mut self, slot: u32, sink: &mut dyn FnMut(Batch<'_>)) -> Result<u64, Error> {
        let r = self.region;
        let g = r.geometry;
        let s = g.slot_offset(slot);
        let state = r.a32(s + S_STATE);
        debug_assert_eq!(state.load(Ordering::Acquire), SLOT_ACTIVE);
        // The writer is gone: this is its stream's end, as `poll(true)`.
        let rest = self.poll_slot(slot, true, sink);
        // The data it left: a sealed half not handed back (the stream
        // ended at a hole in it) up to its fill, the live half up to POS.
        // Halves handed back are zero already; untouched pages stay so.
        let pos = r.a64(s + S_POS).load(Ordering::Acquire);
        let wbase = r.a64(s + S_BASE).load(Ordering::Acquire);
        for h in 0..2u32 {
            let sealed = r
                .a32(s + S_HALF_STATE + 4 * u64::from(h))
                .load(Ordering::Acquire)
                == HALF_FULL;
            let fill = if sealed {
                r.a64(s + S_HALF_FILL + 8 * u64::from(h))
                    .load(Ordering::Acquire)
            } else {
                0
            };
            let live = pos
                .checked_sub(wbase.wrapping_add(g.half_offset(h)))
                .filter(|&e| e <= g.half_size)
                .unwrap_or(0);
            let len = fill.max(live).min(g.half_size);
            // SAFETY: the first `len <= half_size` bytes of half `h` of
            // this slot; its writer is gone and no one else writes it.
            unsafe {
                std::ptr::write_bytes(r.base.add((s + g.half_offset(h)) as usize), 0, len as usize)
            };
        }
        for off in [
            S_POS,
            S_LIMIT,
            S_OWNER,
            S_BASE,
            S_HALF_FILL,
            S_HALF_FILL + 8,
            S_SEQ,
            S_ENTRY_RSP,
        ] {
            r.a64(s + off).store(0, Ordering::Relaxed);
        }
        for off in [
            S_TID,
            S_CUR_HALF,
            S_HALF_STATE,
            S_HALF_STATE + 4,
            S_PARENT,
            S_XFERS,
            S_ONCE,
        ] {
            r.a32(s + off).store(0, Ordering::Relaxed);
        }
        debug_assert_eq!(HALF_EMPTY, 0);
        self.slots[slot as usize] = SlotCursor::default();
        let free = if gone(r.a32(s + S_PID).load(Ordering::Relaxed), 0) {
            SLOT_FREE
        } else {
            SLOT_RELEASED
        };
        // Last, with release ordering: a claim's `lock cmpxchg` that sees
        // it sees every reset above.
        state.store(free, Ordering::Release);
        rest
    }

    /// Frees (for any process) the released slots whose process is gone:
    /// no thread that could still point `%gs` at one is left. A
    /// compare-exchange, because a thread of that process may be claiming
    /// it meanwhile. One `kill` per process, however many slots it
    /// released (a burst of threads can leave most slots released).
    pub fn free_released(&self) {
        let r = self.region;
        let g = r.geometry;
        let mut seen: Vec<(u32, bool)> = Vec::new();
        for slot in 0..self.claimed {
            let s = g.slot_offset(slot);
            let state = r.a32(s + S_STATE);
            if state.load(Ordering::Acquire) != SLOT_RELEASED {
                continue;
            }
            let pid = r.a32(s + S_PID).load(Ordering::Acquire);
            let dead = match seen.iter().find(|&&(p, _)| p == pid) {
                Some(&(_, dead)) => dead,
                None => {
                    let dead = gone(pid, 0);
                    seen.push((pid, dead));
                    dead
                }
            };
            if dead {
                let _ = state.compare_exchange(
                    SLOT_RELEASED,
                    SLOT_FREE,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            }
        }
    }

    /// Zeroes sealed half `h` of `slot`, marks it EMPTY, wakes its
    /// writer, and moves the slot's cursor to the other half.
    fn hand_back(&mut self, slot: u32, h: u32) {
        let r = self.region;
        let g = r.geometry;
        let s = g.slot_offset(slot);
        let data = s + g.half_offset(h);
        // SAFETY: in bounds; the writer does not touch a FULL half.
        unsafe { std::ptr::write_bytes(r.base.add(data as usize), 0, g.half_size as usize) };
        r.a64(s + S_HALF_FILL + 8 * h as u64)
            .store(0, Ordering::Release);
        let state = r.a32(s + S_HALF_STATE + 4 * h as u64);
        state.store(HALF_EMPTY, Ordering::Release);
        wake(state);
        let c = &mut self.slots[slot as usize];
        c.half = h ^ 1;
        c.off = 0;
    }

    fn poll_slot(
        &mut self,
        slot: u32,
        finished: bool,
        sink: &mut dyn FnMut(Batch<'_>),
    ) -> Result<u64, Error> {
        let r = self.region;
        let g = r.geometry;
        let s = g.slot_offset(slot);
        let mut yielded = 0;
        loop {
            let cur = self.slots[slot as usize];
            if cur.ended || r.a32(s + S_STATE).load(Ordering::Acquire) != SLOT_ACTIVE {
                return Ok(yielded);
            }
            let h = cur.half;
            let state = r.a32(s + S_HALF_STATE + 4 * h as u64);
            if cur.broken {
                if state.load(Ordering::Acquire) != HALF_FULL {
                    return Ok(yielded);
                }
                self.hand_back(slot, h);
                continue;
            }
            let (end, sealed) = if state.load(Ordering::Acquire) == HALF_FULL {
                (
                    r.a64(s + S_HALF_FILL + 8 * h as u64)
                        .load(Ordering::Acquire),
                    true,
                )
            } else {
                // The writer is in half `h`: its position bounds what is reserved.
                let pos = r.a64(s + S_POS).load(Ordering::Acquire);
                let wbase = r.a64(s + S_BASE).load(Ordering::Acquire);
                if state.load(Ordering::Acquire) == HALF_FULL {
                    continue; // sealed meanwhile: read the fill instead
                }
                let start = wbase.wrapping_add(g.half_offset(h));
                match pos.checked_sub(start) {
                    Some(e) if e <= g.half_size => (e, false),
                    // Claimed but not yet initialised, or mid-switch: next poll.
                    _ => return Ok(yielded),
                }
            };
            if end > g.half_size || end < cur.off {
                return Err(Error::BadRegion(format!(
                    "slot {slot} half {h}: fill {end} outside 0..={} (cursor {})",
                    g.half_size, cur.off
                )));
            }
            let data = s + g.half_offset(h);
            // SAFETY: `data + cur.off .. data + end` lies in this slot's half.
            unsafe {
                copy_volatile(
                    &mut self.buf,
                    r.base.add((data + cur.off) as usize),
                    end - cur.off,
                )
            };
            fence(Ordering::Acquire);
            let values = &mut self.values;
            values.clear();
            let (n, witnesses) = valid_prefix_with(&self.buf, |i, k| {
                if k == RecordKind::Value {
                    values.push(i);
                }
            })
            .map_err(|(at, kind)| Error::BadRecord {
                slot,
                half: h,
                offset: cur.off + at as u64,
                kind,
            })?;
            if n > 0 {
                sink(Batch {
                    slot,
                    pid: r.a32(s + S_PID).load(Ordering::Acquire),
                    tid: r.a32(s + S_TID).load(Ordering::Acquire),
                    runtime: r.a64(s + S_RUNTIME).load(Ordering::Acquire),
                    image: r.a64(s + S_IMAGE).load(Ordering::Acquire),
                    serial: r.a32(s + S_SERIAL).load(Ordering::Acquire),
                    bytes: &self.buf[..n],
                    witnesses,
                    values: &self.values,
                });
                yielded += n as u64;
            }
            let off = cur.off + n as u64;
            self.slots[slot as usize].off = off;
            if sealed && off == end {
                self.hand_back(slot, h);
                continue;
            }
            if finished && off < end {
                self.slots[slot as usize].ended = true;
            }
            return Ok(yielded);
        }
    }
}

/// Replaces `out` with `len` bytes read from `src`, which another process
/// may be writing: volatile loads in increasing address order, whole
/// aligned words where possible (8 times fewer loads than bytes). Each
/// load is one instant's view of its bytes and the loads are not
/// reordered (x86-TSO; volatile for the compiler), so a record whose
/// final kind byte is seen also shows the payload stored before it.
///
/// # Safety
/// `src .. src + len` must be mapped and readable.
unsafe fn copy_volatile(out: &mut Vec<u8>, src: *const u8, len: u64) {
    let len = len as usize;
    out.clear();
    out.reserve(len);
    // Written through a raw pointer into the reserved capacity, then
    // `set_len` once: no per-word length bookkeeping (a 1 MiB half is
    // 128 Ki words, copied at every seal).
    let dst = out.as_mut_ptr();
    let mut i = 0usize;
    while i < len && (src as usize + i) % 8 != 0 {
        dst.add(i).write(std::ptr::read_volatile(src.add(i)));
        i += 1;
    }
    while i + 8 <= len {
        let w = std::ptr::read_volatile(src.add(i) as *const u64);
        (dst.add(i) as *mut u64).write_unaligned(w);
        i += 8;
    }
    while i < len {
        dst.add(i).write(std::ptr::read_volatile(src.add(i)));
        i += 1;
    }
    // SAFETY: all `len` bytes were written above, within the reserved capacity.
    out.set_len(len);
}

/// One slot's stream read from a standalone file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    /// The slot the stream was written in.
    pub slot: u32,
    /// Kernel process id of the writer.
    pub pid: u32,
    /// Kernel thread id of the writer.
    pub tid: u32,
    /// Run-time address of the runtime blob in the writing process.
    pub runtime: u64,
    /// The stream's witnesses and records, in order.
    pub bytes: Vec<u8>,
}

fn rd<const N: usize>(b: &[u8], off: u64) -> Result<[u8; N], Error> {
    usize::try_from(off)
        .ok()
        .and_then(|o| b.get(o..o.checked_add(N)?))
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| Error::BadRegion(format!("file truncated: {N} bytes at offset {off}")))
}
fn rd32(b: &[u8], off: u64) -> Result<u32, Error> {
    Ok(u32::from_le_bytes(rd(b, off)?))
}
fn rd64(b: &[u8], off: u64) -> Result<u64, Error> {
    Ok(u64::from_le_bytes(rd(b, off)?))
}

/// Reads a standalone trace file (the region the runtime created itself,
/// followed by the chunks its `flush` appended) into per-slot streams.
/// Each stream is the longest exact prefix of what its thread wrote.
pub fn read_standalone(b: &[u8]) -> Result<Vec<Stream>, Error> {
    if rd64(b, H_MAGIC)? != MAGIC || rd32(b, H_VERSION)? != VERSION {
        return Err(Error::BadRegion(
            "not an aetrace witness file (magic/version)".into(),
        ));
    }
    if rd32(b, H_FLAGS)? & FLAG_STANDALONE == 0 {
        return Err(Error::BadRegion(
            "region was not written in standalone mode".into(),
        ));
    }
    let g = Geometry {
        slot_count: rd32(b, H_SLOT_COUNT)?,
        half_size: rd64(b, H_HALF_SIZE)?,
    };
    let size = rd64(b, H_REGION_SIZE)?;
    if g.half_size == 0
        || g.half_size > 1 << 32
        || g.slot_count > 1 << 16
        || rd64(b, H_SLOT_SIZE)? != g.slot_size()
        || size != g.region_size()
        || size > b.len() as u64
    {
        return Err(Error::BadRegion(format!(
            "inconsistent geometry {g:?}, region size {size}"
        )));
    }
    // Chunks: fixed-size cells after the region; an all-zero header is a
    // cell reserved by a process that died before writing it.
    let mut chunks: Vec<(u32, u64, u64, u64)> = Vec::new(); // slot, seq, data offset, len
    let mut off = size;
    while off + CHUNK_HEADER_SIZE <= b.len() as u64 {
        let magic = rd32(b, off + C_MAGIC)?;
        if magic == CHUNK_MAGIC {
            let slot = rd32(b, off + C_SLOT)?;
            let len = rd64(b, off + C_LEN)?;
            if slot >= g.slot_count
                || len > g.half_size
                || off + CHUNK_HEADER_SIZE + len > b.len() as u64
            {
                return Err(Error::BadRegion(format!(
                    "bad chunk header at file offset {off}"
                )));
            }
            chunks.push((slot, rd64(b, off + C_SEQ)?, off + CHUNK_HEADER_SIZE, len));
        } else if magic != 0 {
            return Err(Error::BadRegion(format!(
                "bad chunk magic at file offset {off}"
            )));
        }
        off += g.chunk_space();
    }
    chunks.sort_unstable_by_key(|c| (c.0, c.1));
    let mut out = Vec::new();
    for slot in 0..g.slot_count {
        let s = g.slot_offset(slot);
        if rd32(b, s + S_STATE)? == SLOT_FREE {
            continue;
        }
        let seq = rd64(b, s + S_SEQ)?;
        let mut bytes = Vec::new();
        let mut complete = true;
        let mut next = 0u64;
        for &(_, cseq, coff, len) in chunks.iter().filter(|c| c.0 == slot) {
            if cseq != next || !complete {
                complete = false;
                break;
            }
            complete = append_valid(&mut bytes, b, coff, len, slot)? == len;
            next += 1;
        }
        // The live half holds what came after the last chunk, unless the
        // writer died inside flush after writing chunk `seq` (stale half).
        if complete && next == seq {
            let pos = rd64(b, s + S_POS)?;
            let start = rd64(b, s + S_BASE)?.wrapping_add(g.half_offset(0));
            let end = pos
                .checked_sub(start)
                .filter(|e| *e <= g.half_size)
                .ok_or_else(|| {
                    Error::BadRegion(format!("slot {slot}: write position outside its buffer"))
                })?;
            append_valid(&mut bytes, b, s + g.half_offset(0), end, slot)?;
        }
        out.push(Stream {
            slot,
            pid: rd32(b, s + S_PID)?,
            tid: rd32(b, s + S_TID)?,
            runtime: rd64(b, s + S_RUNTIME)?,
            bytes,
        });
    }
    Ok(out)
}

/// Appends the complete witnesses and records of `b[off..off + len]` to
/// `out` and returns how many bytes that was (less than `len` when the data
/// stops at a never-written byte or an unfinished record).
fn append_valid(out: &mut Vec<u8>, b: &[u8], off: u64, len: u64, slot: u32) -> Result<u64, Error> {
    let data = usize::try_from(off)
        .ok()
        .zip(usize::try_from(off.saturating_add(len)).ok())
        .and_then(|(start, end)| b.get(start..end))
        .ok_or_else(|| Error::BadRegion(format!("slot {slot}: data outside the file")))?;
    let (n, _) = valid_prefix(data).map_err(|(at, kind)| Error::BadRecord {
        slot,
        half: 0,
        offset: at as u64,
        kind,
    })?;
    out.extend_from_slice(&data[..n]);
    Ok(n as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id of a thread that has exited (joined).
    fn dead_tid() -> u32 {
        let tid = std::thread::spawn(|| unsafe { libc::gettid() } as u32)
            .join()
            .unwrap();
        // `join` returns when the kernel clears the thread's TID word,
        // before the thread is released: `tgkill` can still find it.
        let pid = std::process::id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !gone(pid, tid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        tid
    }

    /// Fills slot `slot` as a claim would, with `tid`, and writes `bytes`
    /// at its start, reserving `reserved` more that it never writes.
    fn claim(r: &Region, slot: u32, tid: u32, bytes: &[u8], reserved: u64) {
        let g = r.geometry;
        let s = g.slot_offset(slot);
        let start = r.base as u64 + s + g.half_offset(0);
        // SAFETY: the first bytes of half 0 of an in-bounds slot.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), start as *mut u8, bytes.len());
        }
        r.put_u64(s + S_BASE, r.base as u64 + s);
        r.put_u32(s + S_TID, tid);
        r.put_u32(s + S_PID, std::process::id());
        r.put_u64(s + S_LIMIT, start + g.half_size - HEADROOM);
        r.put_u64(s + S_POS, start + bytes.len() as u64 + reserved);
        r.put_u32(s + S_STATE, SLOT_ACTIVE);
    }

    /// A region of `slots` slots with the smallest halves.
    fn small(slots: u32) -> Region {
        Region::create(Geometry {
            slot_count: slots,
            half_size: 3 * HEADROOM,
        })
        .unwrap()
    }

    /// A slot released while its process lives stays that process's
    /// until the process is gone, then `free_released` frees it.
    #[test]
    fn a_released_slot_is_freed_once_its_process_is_gone() {
        let r = small(2);
        let g = r.geometry;
        let mut d = r.drainer();
        let mut other = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        claim(&r, 0, dead_tid(), &[0xFF, 8, 0xFF, 0xFF, 0xFF, 0xFF, 1], 0);
        // A thread of the other process, gone (no such thread in it).
        r.put_u32(g.slot_offset(0) + S_PID, other.id());
        let mut sink = |_: Batch<'_>| {};
        d.poll(false, &mut sink).unwrap();
        d.poll(false, &mut sink).unwrap();
        assert_eq!(d.exited(&mut || false), vec![0]);
        d.reclaim(0, &mut sink).unwrap();
        let state = r.a32(g.slot_offset(0) + S_STATE);
        d.free_released();
        assert_eq!(state.load(Ordering::Acquire), SLOT_RELEASED);
        other.kill().unwrap();
        other.wait().unwrap();
        d.free_released();
        assert_eq!(state.load(Ordering::Acquire), SLOT_FREE);
    }

    /// A process's main thread (TID = PID) and every thread of a process
    /// that is gone keep their slots (`Drainer::exited`) while an orphan
    /// runs (a child forked outside traced code may still be writing
    /// there); a gone process's slots come back once none does, and a
    /// live main thread's never.
    #[test]
    fn main_threads_and_threads_of_gone_processes_keep_their_slots() {
        let r = small(2);
        let g = r.geometry;
        let mut d = r.drainer();
        let mut gone_process = std::process::Command::new("true").spawn().unwrap();
        gone_process.wait().unwrap();
        let pid = gone_process.id();
        claim(&r, 0, dead_tid(), &[0xFF, 8, 0xFF, 0xFF, 0xFF, 0xFF, 1], 0);
        r.put_u32(g.slot_offset(0) + S_PID, pid);
        claim(&r, 1, pid, &[0xFF, 8, 0xFF, 0xFF, 0xFF, 0xFF, 1], 0);
        r.put_u32(g.slot_offset(1) + S_PID, pid);
        let mut sink = |_: Batch<'_>| {};
        d.poll(false, &mut sink).unwrap();
        d.poll(false, &mut sink).unwrap();
        assert!(d.exited(&mut || false).is_empty());
        assert_eq!(d.exited(&mut || true), vec![0, 1]);
        let me = std::process::id();
        r.put_u32(g.slot_offset(1) + S_PID, me);
        r.put_u32(g.slot_offset(1) + S_TID, me);
        assert_eq!(d.exited(&mut || true), vec![0]);
    }

    /// A reclaimed slot claimed again is a clean stream: every header
    /// field the runtime's `claim` does not set is zero, the data its
    /// last thread left too (a byte the new thread reserved but has not
    /// written yet reads as "unwritten", not as the old thread's), its
    /// cursor starts over, and the slot is released for this process only
    /// while it lives. A slot below the highest claimed one that is free
    /// does not end a pass.
    #[test]
    fn a_reclaimed_slot_claimed_again_starts_a_clean_stream() {
        let r = small(4);
        let g = r.geometry;
        let mut d = r.drainer();
        let mut got: Vec<(u32, Vec<u8>)> = Vec::new();
        let old = [0xFF, 8, 0xFF, 0xFF, 0xFF, 0xFF, 1, 2, 3, 4, 5, 6, 7, 8];
        claim(&r, 0, dead_tid(), &old, 0);
        claim(
            &r,
            1,
            unsafe { libc::gettid() } as u32,
            &[0xFF, 8, 0, 0, 0, 0, 9],
            0,
        );
        let s0 = g.slot_offset(0);
        // What a thread leaves: a sealed half's fill, a transfer count.
        r.put_u64(s0 + S_SEQ, 3);
        r.put_u64(s0 + S_HALF_FILL + 8, 77);
        r.put_u32(s0 + S_XFERS, 5);
        let mut sink = |b: Batch<'_>| got.push((b.slot, b.bytes.to_vec()));
        d.poll(false, &mut sink).unwrap();
        d.poll(false, &mut sink).unwrap();
        // Idle and its thread gone: slot 0 only (slot 1 is this thread).
        assert_eq!(d.exited(&mut || false), vec![0]);
        assert_eq!(d.reclaim(0, &mut sink).unwrap(), 0);
        assert_eq!(r.a32(s0 + S_STATE).load(Ordering::Acquire), SLOT_RELEASED);
        for off in (0..SLOT_HEADER_SIZE).step_by(4) {
            let kept = [
                S_PID,
                S_RUNTIME,
                S_RUNTIME + 4,
                S_IMAGE,
                S_IMAGE + 4,
                S_SERIAL,
                S_REGION,
                S_REGION + 4,
                S_STATE,
            ];
            if !kept.contains(&off) {
                assert_eq!(r.a32(s0 + off).load(Ordering::Acquire), 0, "offset {off}");
            }
        }
        for h in 0..2 {
            for off in (0..g.half_size).step_by(8) {
                assert_eq!(
                    r.a64(s0 + g.half_offset(h) + off).load(Ordering::Acquire),
                    0
                );
            }
        }
        // Slot 1 still drains with slot 0 released below it.
        claim(
            &r,
            2,
            unsafe { libc::gettid() } as u32,
            &[0xFF, 8, 1, 0, 0, 0, 11],
            0,
        );
        d.poll(false, &mut sink).unwrap();
        // Claimed again (by this process): a new stream from offset 0; the
        // bytes reserved but not written are not the old thread's.
        let new = [0xFF, 8, 1, 0, 0, 0, 42];
        claim(&r, 0, unsafe { libc::gettid() } as u32, &new, 5);
        d.poll(false, &mut sink).unwrap();
        d.free_released();
        assert_eq!(
            got,
            vec![
                (0, old.to_vec()),
                (1, vec![0xFF, 8, 0, 0, 0, 0, 9]),
                (2, vec![0xFF, 8, 1, 0, 0, 0, 11]),
                (0, new.to_vec()),
            ]
        );
    }
}
