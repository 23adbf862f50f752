//! The recorder side of the witness region: create it (memfd), hand its fd
//! to the program, and drain every slot's bytes while the program runs and
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
//! - Claimed slots form a prefix of the slot array (the runtime's `claim`
//!   takes the lowest free slot with `lock cmpxchg` and no slot returns to
//!   free), so a pass stops at the first free slot.
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

fn io(what: &'static str) -> Error {
    Error::Io {
        what,
        source: std::io::Error::last_os_error(),
    }
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
        let fd = unsafe { libc::memfd_create(c"aetrace-witnesses".as_ptr(), libc::MFD_CLOEXEC) };
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

    /// The region's file descriptor (close-on-exec until [`Region::set_inherited`]).
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Clears (`on`) or sets FD_CLOEXEC on the region's fd, and only it,
    /// so the program started next inherits it (and nothing started later).
    pub fn set_inherited(&self, on: bool) -> Result<(), Error> {
        let flags = if on { 0 } else { libc::FD_CLOEXEC };
        // SAFETY: fcntl on an fd we own.
        if unsafe { libc::fcntl(self.fd(), libc::F_SETFD, flags) } < 0 {
            return Err(io("changing FD_CLOEXEC on the witness region"));
        }
        Ok(())
    }

    /// The environment variable telling the runtime where the region is.
    pub fn env(&self) -> (&'static str, String) {
        ("AETRACE_SHM_FD", self.fd().to_string())
    }

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

    /// A drainer over every slot, starting from the beginning.
    pub fn drainer(&self) -> Drainer<'_> {
        Drainer {
            region: self,
            slots: vec![SlotCursor::default(); self.geometry.slot_count as usize],
            buf: Vec::new(),
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
}

/// One batch of a slot's stream.
#[derive(Debug)]
pub struct Batch<'a> {
    pub slot: u32,
    pub pid: u32,
    pub tid: u32,
    /// Run-time address of the runtime blob in the writing process (the
    /// slot's `S_RUNTIME`): its load bias is `runtime - runtime_vaddr`.
    pub runtime: u64,
    /// Complete witnesses and records, continuing the slot's previous batch.
    pub bytes: &'a [u8],
    /// The witness bytes among `bytes` (the rest are records).
    pub witnesses: u64,
}

/// Pulls newly written bytes out of every slot, in order.
pub struct Drainer<'r> {
    region: &'r Region,
    slots: Vec<SlotCursor>,
    buf: Vec<u8>,
}

impl Drainer<'_> {
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
            // Claimed slots are a prefix (the runtime claims the lowest
            // free slot and a slot is never freed): stop at the first free
            // one rather than fault in the header page of every slot.
            if self
                .region
                .a32(g.slot_offset(slot) + S_STATE)
                .load(Ordering::Acquire)
                == SLOT_FREE
            {
                debug_assert!(self.slots[slot as usize..]
                    .iter()
                    .all(|c| c.off == 0 && c.half == 0 && !c.ended));
                break;
            }
            match self.poll_slot(slot, finished, sink) {
                Ok(n) => total += n,
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
        // SAFETY: futex wake on a word of the shared mapping.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                state as *const AtomicU32,
                libc::FUTEX_WAKE,
                i32::MAX,
            );
        }
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
            if cur.ended || r.a32(s + S_STATE).load(Ordering::Acquire) == SLOT_FREE {
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
            let (n, witnesses) =
                valid_prefix(&self.buf).map_err(|(at, kind)| Error::BadRecord {
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
                    bytes: &self.buf[..n],
                    witnesses,
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
    while i < len && !(src as usize + i).is_multiple_of(8) {
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
    pub slot: u32,
    pub pid: u32,
    pub tid: u32,
    /// Run-time address of the runtime blob in the writing process.
    pub runtime: u64,
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
