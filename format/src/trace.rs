//! Reading a trace: [`Trace::parse`] over any bytes, [`TraceFile::open`] over a
//! memory map.
//!
//! Invariants: parsing is one pass over the sections (see [`crate::index`]) and
//! never panics on any input; bulk data (chunks, program databases) is not copied
//! but referenced by file range and decompressed on demand, so a `Trace` is `Sync`
//! and its chunks can be expanded in parallel. A trace without END is returned as
//! [`Status::Incomplete`]; damage at the tail (a torn last section) also gives an
//! incomplete trace, carrying the error; damage followed by more data is an `Err`.

use crate::error::{Error, Result};
use crate::header::{Header, HEADER_LEN, VERSION_MINOR};
use crate::index::{ChunkRef, DatabaseRef, Index, ThreadInfo};
use crate::section::SECTION_HEADER_LEN;
use crate::section::{
    self, Codec, Command, End, Image, Module, Note, ProcessExit, Section, Sections,
};
use crate::{values, ModuleId, ThreadId};
use std::cell::RefCell;
use std::path::Path;

/// Whether the trace is whole.
#[derive(Debug)]
pub enum Status {
    /// END was read and its totals match.
    Complete(End),
    /// No END: the recorder was still writing, or died. Everything indexed is
    /// exact; what came after is unknown.
    Incomplete {
        /// The torn last section, if the file does not end on a section boundary
        /// (or ends in a section whose checksum fails with nothing after it).
        tear: Option<Error>,
    },
}

/// A parsed trace over bytes `B` (a `Vec`, a slice, a memory map).
pub struct Trace<B> {
    pub(crate) bytes: B,
    header: Header,
    pub(crate) index: Index,
    status: Status,
}

/// A trace read through a read-only memory map.
pub type TraceFile = Trace<memmap2::Mmap>;

impl TraceFile {
    /// Maps and parses the trace at `path`.
    ///
    /// The file may still be growing (a recorder appending to it): the map covers
    /// the bytes present when it was made, and a section being written shows up as
    /// a torn tail. Truncating the file while it is mapped is not supported (the
    /// kernel would deliver SIGBUS); aetrace never truncates a trace.
    pub fn open(path: impl AsRef<Path>) -> Result<TraceFile> {
        let path = path.as_ref();
        let open_err = |source| Error::Open {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(open_err)?;
        // SAFETY: the map is read-only and aetrace only ever appends to traces, so
        // the mapped bytes do not change under us (see the note above on truncation).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(open_err)?;
        Trace::parse(map)
    }
}

impl<B: AsRef<[u8]>> Trace<B> {
    /// Parses a whole trace held in `bytes`.
    pub fn parse(bytes: B) -> Result<Self> {
        let data = bytes.as_ref();
        let header = Header::decode(data)?;
        let newer_minor = header.minor > VERSION_MINOR;
        let mut index = Index::default();
        let mut tear = None;
        for s in Sections::new(data, HEADER_LEN) {
            match s {
                Ok(Section {
                    offset,
                    kind,
                    payload,
                }) => {
                    let record = section::decode(kind, payload, offset, newer_minor)?;
                    let payload_at = offset as usize + SECTION_HEADER_LEN;
                    index.push(offset, payload_at, &record)?;
                }
                Err(b) if index.end.is_some() => {
                    return Err(Error::corrupt(b.offset, "data after END"))
                }
                Err(b) if b.torn => tear = Some(b.error),
                Err(b) => return Err(b.error),
            }
        }
        announced_codecs(&header, &index)?;
        let status = match index.end {
            Some(end) => Status::Complete(end),
            None => Status::Incomplete { tear },
        };
        Ok(Trace {
            bytes,
            header,
            index,
            status,
        })
    }

    /// The file header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Whether the trace is complete, and if not, how it ends.
    pub fn status(&self) -> &Status {
        &self.status
    }

    /// True when END was read.
    pub fn is_complete(&self) -> bool {
        matches!(self.status, Status::Complete(_))
    }

    /// The END totals, or [`Error::Incomplete`] describing where the trace stops.
    pub fn require_complete(&self) -> Result<&End> {
        match &self.status {
            Status::Complete(end) => Ok(end),
            Status::Incomplete { tear: None } => Err(Error::Incomplete(format!(
                "no END section; the file stops cleanly after {} bytes",
                self.bytes.as_ref().len()
            ))),
            Status::Incomplete { tear: Some(e) } => Err(Error::Incomplete(format!(
                "no END section; the file ends in a torn section: {e}"
            ))),
        }
    }

    /// Modules in file order.
    pub fn modules(&self) -> &[Module] {
        &self.index.modules
    }

    /// A module by id.
    pub fn module(&self, id: ModuleId) -> Option<&Module> {
        self.index.module(id)
    }

    /// The program database of a module, if the trace has one: its own, or
    /// the one its IMAGE section says it shares.
    pub fn program_database(&self, module: ModuleId) -> Option<Database<'_>> {
        let own = self.index.shared(module).unwrap_or(module);
        let r = self.index.databases.get(&own)?;
        Some(Database {
            meta: r,
            data: self.bytes.as_ref().get(r.data.clone()).unwrap_or(&[]),
        })
    }

    /// The IMAGE sections (1.12): modules of process images started by an
    /// exec, each tied to the stream that starts its image.
    pub fn images(&self) -> &[Image] {
        &self.index.images
    }

    /// The stream whose image `module` belongs to, when an IMAGE says so
    /// (else the module is its pid's first image's).
    pub fn image_thread(&self, module: ModuleId) -> Option<ThreadId> {
        self.image_of(module).map(|i| i.thread)
    }

    /// The IMAGE section naming `module`, if any.
    pub fn image_of(&self, module: ModuleId) -> Option<&Image> {
        self.index.images.iter().find(|i| i.module == module)
    }

    /// The module tag the stream records of `module`'s image carry for it
    /// (docs/format.md, ENTER): 0 for an executable, else its IMAGE's
    /// (1.14), else its id (a library of the first image: id = tag).
    pub fn module_tag(&self, module: &Module) -> u32 {
        if module.flags & crate::module_flags::MAIN != 0 {
            return 0;
        }
        self.image_of(module.id).map_or(module.id.0, |i| i.tag)
    }

    /// Threads by id.
    pub fn threads(&self) -> impl ExactSizeIterator<Item = &ThreadInfo> + '_ {
        self.index.threads.values()
    }

    /// One thread.
    pub fn thread(&self, id: ThreadId) -> Option<&ThreadInfo> {
        self.index.threads.get(&id)
    }

    /// A thread's chunks in sequence order (empty for an unknown thread).
    pub fn chunks(&self, id: ThreadId) -> impl ExactSizeIterator<Item = Chunk<'_>> + '_ {
        let chunks = self
            .index
            .threads
            .get(&id)
            .map_or(&[][..], |t| &t.chunks[..]);
        chunks.iter().map(|c| self.chunk(c))
    }

    /// The chunk `meta` refers to (from this trace's index).
    pub fn chunk<'a>(&'a self, meta: &'a ChunkRef) -> Chunk<'a> {
        Chunk {
            meta,
            data: self.bytes.as_ref().get(meta.data.clone()).unwrap_or(&[]),
        }
    }

    /// PROCESS_EXIT records in file order.
    pub fn process_exits(&self) -> &[ProcessExit] {
        &self.index.exits
    }

    /// How the program was started (COMMAND), if the recorder wrote it.
    pub fn command(&self) -> Option<&Command> {
        self.index.command.as_ref()
    }

    /// NOTE records in file order.
    pub fn notes(&self) -> &[Note] {
        &self.index.notes
    }

    /// What identifies these exact bytes, cheaply: the file's length and a
    /// CRC-32 of its header and of every section header (each holds its
    /// payload's CRC, so a changed payload changes it). Files derived from
    /// a trace (the regenerator's state index) are keyed by it.
    pub fn fingerprint(&self) -> Fingerprint {
        let data = self.bytes.as_ref();
        let mut crc = crc32fast::Hasher::new();
        crc.update(data.get(..HEADER_LEN).unwrap_or(data));
        let mut at = HEADER_LEN;
        // Parsing checked the framing; a torn tail ends the walk.
        while let Some(h) = data.get(at..at + SECTION_HEADER_LEN) {
            crc.update(h);
            let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as u64;
            at += SECTION_HEADER_LEN + section::align8(len) as usize;
        }
        Fingerprint {
            len: data.len() as u64,
            crc: crc.finalize(),
        }
    }
}

/// [`Trace::fingerprint`]: a trace file's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    /// The file's length in bytes.
    pub len: u64,
    /// CRC-32 of the file header and every section header, in file order.
    pub crc: u32,
}

/// Refuses a chunk in a values codec (`zstd+values`, `zstd+split`) when
/// the header does not set its incompatible flag: a reader that predates
/// the codec must refuse the file at its header, so a file without the
/// flag cannot use it.
fn announced_codecs(header: &Header, index: &Index) -> Result<()> {
    use crate::header::{INCOMPAT_SPLIT_CODEC, INCOMPAT_VALUE_CODEC};
    let flag = |c: Codec| match c {
        Codec::ZstdValues => INCOMPAT_VALUE_CODEC,
        Codec::ZstdSplit => INCOMPAT_SPLIT_CODEC,
        Codec::Stored | Codec::Zstd => 0,
    };
    let mut chunks = index.threads.values().flat_map(|t| &t.chunks);
    match chunks.find(|c| flag(c.codec) & !header.incompat_flags != 0) {
        Some(c) => Err(Error::corrupt(
            c.section_offset,
            format!(
                "thread {} chunk {} uses codec {}, which the header does not announce",
                c.thread,
                c.seq,
                c.codec.name()
            ),
        )),
        None => Ok(()),
    }
}

thread_local! {
    /// One zstd decompression context per thread (rayon workers included): creating
    /// one per chunk costs an allocation of ~100 KiB and its initialisation.
    static DCTX: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    /// The decompressed frames of a `ZstdValues` chunk, reused.
    static VALUE_FRAMES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// The decompressed parts of a `ZstdSplit` chunk, reused.
    static VALUE_PARTS: RefCell<[Vec<u8>; values::PARTS]> = RefCell::new(Default::default());
}

/// Decompresses `data` into `out` (cleared first), checking it yields exactly
/// `raw_len` bytes. `what` and `offset` name the section in errors.
fn expand(
    codec: Codec,
    data: &[u8],
    raw_len: u64,
    out: &mut Vec<u8>,
    what: &dyn Fn() -> String,
    offset: u64,
) -> Result<()> {
    out.clear();
    // raw_len <= MAX_RAW_LEN was checked by the index.
    let raw = usize::try_from(raw_len).map_err(|_| Error::corrupt(offset, what()))?;
    match codec {
        Codec::Stored => out.extend_from_slice(data),
        Codec::Zstd => unzstd(data, raw, out, what, offset)?,
        Codec::ZstdValues => VALUE_FRAMES.with(|cell| {
            let mut frames = cell.borrow_mut();
            // A value's frame bytes: at most 15 for its 10 raw; any other
            // raw byte, 1; each frame's two counts, 10 per raw byte or more.
            let bound = raw.saturating_mul(3).saturating_add(64);
            frames.clear();
            unzstd(data, bound, &mut frames, what, offset)?;
            values::decode(&frames, raw, out)
                .map_err(|e| Error::corrupt(offset, format!("{}: values: {e}", what())))
        })?,
        Codec::ZstdSplit => VALUE_PARTS.with(|cell| {
            let mut part = |stored: &[u8], cap: usize, into: &mut Vec<u8>| {
                into.clear();
                unzstd(stored, cap, into, what, offset).map_err(|e| e.to_string())
            };
            values::decode_split(data, raw, out, &mut cell.borrow_mut(), &mut part)
                .map_err(|e| Error::corrupt(offset, format!("{}: values: {e}", what())))
        })?,
    }
    if out.len() != raw {
        return Err(Error::corrupt(
            offset,
            format!(
                "{} decompresses to {} bytes, not the {raw} stated",
                what(),
                out.len()
            ),
        ));
    }
    Ok(())
}

/// zstd frames `data` into `out`, at most `cap` bytes.
fn unzstd(
    data: &[u8],
    cap: usize,
    out: &mut Vec<u8>,
    what: &dyn Fn() -> String,
    offset: u64,
) -> Result<()> {
    out.reserve_exact(cap);
    DCTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        let z = match &mut *slot {
            Some(z) => z,
            None => slot.insert(zstd::bulk::Decompressor::new()?),
        };
        // The capacity bounds the output: a frame claiming more fails here.
        z.decompress_to_buffer(data, out)
            .map_err(|e| Error::corrupt(offset, format!("{}: zstd: {e}", what())))
    })?;
    Ok(())
}

/// A chunk of a thread's witness stream, borrowed from the trace.
#[derive(Clone, Copy, Debug)]
pub struct Chunk<'a> {
    /// Where the chunk is and what it holds.
    pub meta: &'a ChunkRef,
    /// The stored (usually compressed) bytes.
    pub data: &'a [u8],
}

impl Chunk<'_> {
    /// The raw witness bytes.
    pub fn decompress(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.decompress_into(&mut out)?;
        Ok(out)
    }

    /// The raw witness bytes into a reused buffer.
    pub fn decompress_into(&self, out: &mut Vec<u8>) -> Result<()> {
        let m = self.meta;
        let what = || format!("thread {} chunk {}", m.thread, m.seq);
        expand(m.codec, self.data, m.raw_len, out, &what, m.section_offset)
    }
}

/// A module's program database, borrowed from the trace.
#[derive(Clone, Copy, Debug)]
pub struct Database<'a> {
    /// Where the database is and its fixed fields.
    pub meta: &'a DatabaseRef,
    /// The stored (usually compressed) bytes.
    pub data: &'a [u8],
}

impl Database<'_> {
    /// The version of the database encoding (the rewriter's business).
    pub fn version(&self) -> u32 {
        self.meta.header.version
    }

    /// The raw database bytes.
    pub fn decompress(&self) -> Result<Vec<u8>> {
        let m = self.meta;
        let what = || format!("program database of module {}", m.header.module);
        let mut out = Vec::new();
        expand(
            m.header.codec,
            self.data,
            m.header.raw_len,
            &mut out,
            &what,
            m.section_offset,
        )?;
        Ok(out)
    }
}
