//! Writing a trace, append-only, while the traced program runs.
//!
//! Flush policy: the writer keeps no buffer of its own. Each call frames one whole
//! section and hands it to the underlying writer in a single `write_all`, so with
//! `W = File` a section is visible to readers (and survives the death of the
//! recorder process) as soon as the call returns; it survives power loss once the
//! caller has called `File::sync_data` (the recorder's choice, e.g. every few
//! seconds). Wrapping `W` in a `BufWriter` trades that for fewer system calls.
//!
//! Invariants: every section passes the same [`Index`] rules the reader applies
//! *before* it is written, so the writer cannot produce a file its reader rejects;
//! after a failed write the file may end in a torn section, and the writer refuses
//! all further work ([`Error::Poisoned`]) rather than append after the tear.
//!
//! Chunks can be compressed anywhere ([`compress_chunk`] is a pure function, e.g. on
//! a thread pool) and appended in sequence order with [`TraceWriter::append_chunk`];
//! likewise a program database ([`compress_database`], [`TraceWriter::append_database`]).

use crate::error::{Error, Result};
use crate::header::{Header, HEADER_LEN};
use crate::index::Index;
use crate::section::{
    self, ChunkHeader, Codec, Command, DatabaseHeader, End, Image, Module, Note, ProcessExit,
    Record, ThreadEnd, ThreadStart, SECTION_HEADER_LEN,
};
use crate::{ModuleId, ThreadId};
use std::cell::RefCell;
use std::io::Write;

/// zstd level used when none is given. Chosen with `cargo bench -p aetrace-format
/// --bench chunks` (docs/format.md, "Compression level"): on witness-like streams
/// levels 1 and 3 compress about 400 MB/s per core at ratios 5 to 6, level 3 a few
/// percent smaller and faster to decompress; level 9 makes files 12-16% smaller at
/// an eighth of the speed, too slow for a recorder keeping up with a running program.
pub const DEFAULT_LEVEL: i32 = 3;

/// A chunk ready to append: compressed off the writer's thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedChunk {
    /// The thread whose stream the chunk continues.
    pub thread: ThreadId,
    /// The chunk's position in the thread's stream (0, 1, 2...).
    pub seq: u64,
    /// Bytes of witness stream before compression.
    pub raw_len: u64,
    /// How many of those bytes are witnesses (the rest are escape records).
    pub witnesses: u64,
    /// How `data` is stored.
    pub codec: Codec,
    /// The stored bytes.
    pub data: Vec<u8>,
}

/// Compresses one chunk of a thread's witness stream with zstd at `level`.
/// `witnesses` counts the witness bytes in `raw` (the rest being escape records).
pub fn compress_chunk(
    thread: ThreadId,
    seq: u64,
    raw: &[u8],
    witnesses: u64,
    level: i32,
) -> Result<EncodedChunk> {
    Ok(EncodedChunk {
        thread,
        seq,
        raw_len: raw.len() as u64,
        witnesses,
        codec: Codec::Zstd,
        data: compress(raw, level)?,
    })
}

/// A program database ready to append: compressed once (e.g. when the rewritten
/// module is cached) and copied into every trace of that module as is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedDatabase {
    /// Format version of the raw database.
    pub version: u32,
    /// Bytes of the database before compression.
    pub raw_len: u64,
    /// How `data` is stored.
    pub codec: Codec,
    /// The stored bytes.
    pub data: Vec<u8>,
}

/// Compresses a program database (format `version`) with zstd at `level`.
pub fn compress_database(version: u32, raw: &[u8], level: i32) -> Result<EncodedDatabase> {
    Ok(EncodedDatabase {
        version,
        raw_len: raw.len() as u64,
        codec: Codec::Zstd,
        data: compress(raw, level)?,
    })
}

thread_local! {
    /// One zstd compression context per thread, reused across chunks (a level-3
    /// context holds about a megabyte of tables).
    static CCTX: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
}

/// zstd-compresses `raw` at `level` with this thread's reused context.
fn compress(raw: &[u8], level: i32) -> Result<Vec<u8>> {
    CCTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        let (l, z) = match &mut *slot {
            Some(entry) => entry,
            None => slot.insert((level, zstd::bulk::Compressor::new(level)?)),
        };
        if *l != level {
            z.set_compression_level(level)?;
            *l = level;
        }
        Ok(z.compress(raw)?)
    })
}

/// Appends sections to a trace.
pub struct TraceWriter<W: Write> {
    out: W,
    /// Bytes written so far = file offset of the next section.
    offset: u64,
    index: Index,
    level: i32,
    /// Scratch for framing one section.
    buf: Vec<u8>,
    payload: Vec<u8>,
    poisoned: bool,
}

/// Whether an output at `path` may be unlinked, or renamed over, to be
/// replaced: it does not exist or is a regular file. Anything else (a
/// device such as `/dev/null`, a pipe) must be written in place, never
/// removed (as root, removing `/dev/null` breaks the whole machine).
pub fn replaceable(path: &std::path::Path) -> bool {
    std::fs::metadata(path).map_or(true, |m| m.is_file())
}

impl TraceWriter<std::fs::File> {
    /// Creates the file at `path` and writes the header. An existing file there is
    /// unlinked first, never truncated: a reader that has the old trace mapped keeps
    /// its bytes (truncating a mapped file would kill that reader with SIGBUS).
    /// A path that is not a regular file (`/dev/null`, a pipe) is opened
    /// and written as it is: unlinking a device would replace it.
    pub fn create(path: impl AsRef<std::path::Path>, header: &Header) -> Result<Self> {
        let path = path.as_ref();
        let open_err = |source| Error::Open {
            path: path.to_owned(),
            source,
        };
        if !replaceable(path) {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(open_err)?;
            return TraceWriter::new(file, header);
        }
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(open_err(e)),
            _ => {}
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(open_err)?;
        TraceWriter::new(file, header)
    }
}

impl<W: Write> TraceWriter<W> {
    /// Writes `header` to `out` and returns a writer appending after it.
    pub fn new(mut out: W, header: &Header) -> Result<Self> {
        out.write_all(&header.encode())?;
        Ok(TraceWriter {
            out,
            offset: HEADER_LEN as u64,
            index: Index::default(),
            level: DEFAULT_LEVEL,
            buf: Vec::new(),
            payload: Vec::new(),
            poisoned: false,
        })
    }

    /// Sets the zstd level for [`Self::chunk`] and [`Self::program_database`].
    pub fn set_level(&mut self, level: i32) {
        self.level = level;
    }

    /// Bytes written so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The underlying writer (e.g. to `sync_data` a file).
    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// Checks `record` against the trace so far, then writes it as one section.
    fn append(&mut self, record: &Record<'_>) -> Result<()> {
        if self.poisoned {
            return Err(Error::Poisoned);
        }
        self.payload.clear();
        record.encode(&mut self.payload)?;
        let payload_at = usize::try_from(self.offset)
            .map_err(|_| Error::Misuse("trace larger than the address space".into()))?
            + SECTION_HEADER_LEN;
        self.buf.clear();
        section::frame(record.kind(), &self.payload, &mut self.buf)?;
        // The reader's rules, reported as misuse: nothing is written yet.
        self.index
            .push(self.offset, payload_at, record)
            .map_err(|e| match e {
                Error::Corrupt { what, .. } => Error::Misuse(what),
                e => Error::Misuse(e.to_string()),
            })?;
        if let Err(e) = self.out.write_all(&self.buf) {
            self.poisoned = true;
            return Err(e.into());
        }
        self.offset += self.buf.len() as u64;
        Ok(())
    }

    /// MODULE: a loaded object.
    pub fn module(&mut self, module: &Module) -> Result<()> {
        self.append(&Record::Module(module.clone()))
    }

    /// PROGRAM_DATABASE: the opaque database (format `version`) of `module`, zstd-compressed.
    pub fn program_database(&mut self, module: ModuleId, version: u32, raw: &[u8]) -> Result<()> {
        self.append_database(module, &compress_database(version, raw, self.level)?)
    }

    /// PROGRAM_DATABASE: the database of `module`, compressed elsewhere.
    pub fn append_database(&mut self, module: ModuleId, db: &EncodedDatabase) -> Result<()> {
        self.append(&Record::ProgramDatabase {
            header: DatabaseHeader {
                module,
                version: db.version,
                codec: db.codec,
                raw_len: db.raw_len,
            },
            data: &db.data,
            data_at: section::DATABASE_FIXED_LEN,
        })
    }

    /// THREAD_START.
    pub fn thread_start(&mut self, start: &ThreadStart) -> Result<()> {
        self.append(&Record::ThreadStart(*start))
    }

    /// CHUNK: compresses `raw` (the thread's next piece of witness stream, holding
    /// `witnesses` witness bytes) and appends it; returns its sequence number.
    pub fn chunk(&mut self, thread: ThreadId, raw: &[u8], witnesses: u64) -> Result<u64> {
        let seq = self.next_seq(thread).unwrap_or(0);
        let chunk = compress_chunk(thread, seq, raw, witnesses, self.level)?;
        self.append_chunk(&chunk)?;
        Ok(seq)
    }

    /// CHUNK: appends a chunk compressed elsewhere; it must be its thread's next.
    pub fn append_chunk(&mut self, chunk: &EncodedChunk) -> Result<()> {
        self.append(&Record::Chunk {
            header: ChunkHeader {
                thread: chunk.thread,
                codec: chunk.codec,
                seq: chunk.seq,
                raw_len: chunk.raw_len,
                witnesses: chunk.witnesses,
            },
            data: &chunk.data,
            data_at: section::CHUNK_FIXED_LEN,
        })
    }

    /// THREAD_END, stating the number of chunks the thread wrote.
    pub fn thread_end(&mut self, thread: ThreadId, reason: section::EndReason) -> Result<()> {
        let chunks = self
            .index
            .threads
            .get(&thread)
            .map_or(0, |t| t.chunks.len() as u64);
        self.append(&Record::ThreadEnd(ThreadEnd {
            thread,
            reason,
            chunks,
        }))
    }

    /// PROCESS_EXIT.
    pub fn process_exit(&mut self, exit: &ProcessExit) -> Result<()> {
        self.append(&Record::ProcessExit(*exit))
    }

    /// COMMAND: how the program is started (at most once).
    pub fn command(&mut self, command: &Command) -> Result<()> {
        self.append(&Record::Command(command.clone()))
    }

    /// IMAGE: `image.module` belongs to the image `image.thread` starts.
    pub fn image(&mut self, image: &Image) -> Result<()> {
        self.append(&Record::Image(*image))
    }

    /// NOTE.
    pub fn note(&mut self, module: Option<ModuleId>, text: &str) -> Result<()> {
        self.append(&Record::Note(Note {
            module,
            text: text.to_owned(),
        }))
    }

    /// The sequence number the thread's next chunk must carry (`None` for a thread
    /// not started, or ended): what a recorder compressing in parallel numbers with.
    pub fn next_seq(&self, thread: ThreadId) -> Option<u64> {
        let t = self.index.threads.get(&thread)?;
        t.end.is_none().then_some(t.chunks.len() as u64)
    }

    /// Threads started and not yet ended (they must end before [`Self::finish`]).
    pub fn open_threads(&self) -> Vec<ThreadId> {
        self.index.open_threads().collect()
    }

    /// END: writes the totals, flushes, and returns the underlying writer.
    pub fn finish(mut self) -> Result<(W, End)> {
        let end = self.index.end_record();
        self.append(&Record::End(end))?;
        self.out.flush()?;
        Ok((self.out, end))
    }
}
