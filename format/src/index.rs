//! The trace index: what a one-pass scan of the sections learns, and the rules
//! every sequence of sections must obey.
//!
//! The same [`Index`] checks the reader's input and the writer's output, so a
//! writer cannot produce a file its reader rejects. Invariants (each violation is
//! an error naming the section's byte offset):
//! - module and thread ids are not 0xffffffff (which means "none");
//! - module ids are unique; a PROGRAM_DATABASE or NOTE names a module already seen,
//!   and each module has at most one program database;
//! - an IMAGE names a module and a thread already seen, a module at most once,
//!   and a shared database one already given, of a module without its own;
//! - a thread id is started once; its CHUNKs come after its THREAD_START, before its
//!   THREAD_END, numbered 0, 1, 2... in file order (a gap is [`Error::MissingChunk`]);
//!   THREAD_END states how many chunks there were;
//! - END is last, every thread has ended before it, and its totals match the scan;
//! - raw lengths are at most [`MAX_RAW_LEN`]; a stored (uncompressed) payload has
//!   exactly its raw length; a chunk has no more witnesses than raw bytes.

use crate::error::{Error, Result};
use crate::section::{
    Codec, Command, DatabaseHeader, End, Image, Module, Note, ProcessExit, Record, ThreadEnd,
    ThreadStart, MAX_RAW_LEN,
};
use crate::{ModuleId, ThreadId};
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

/// Where a chunk lives and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkRef {
    /// The thread whose stream the chunk belongs to.
    pub thread: ThreadId,
    /// The chunk's position in the thread's stream (0, 1, 2...).
    pub seq: u64,
    /// How the data is stored.
    pub codec: Codec,
    /// Bytes of witness stream once decompressed.
    pub raw_len: u64,
    /// How many of those bytes are witnesses (the rest are escape records).
    pub witnesses: u64,
    /// File offset of the CHUNK section (for messages).
    pub section_offset: u64,
    /// File byte range of the stored data.
    pub data: Range<usize>,
}

/// Where a program database lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatabaseRef {
    /// The database's fixed fields.
    pub header: DatabaseHeader,
    /// File offset of the PROGRAM_DATABASE section (for messages).
    pub section_offset: u64,
    /// File byte range of the stored data.
    pub data: Range<usize>,
}

/// One thread's stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadInfo {
    /// The thread's THREAD_START.
    pub start: ThreadStart,
    /// `None` in an incomplete trace: the stream may have been cut.
    pub end: Option<ThreadEnd>,
    /// Chunks in sequence order (`chunks[i].seq == i`).
    pub chunks: Vec<ChunkRef>,
    /// Decompressed witness-stream bytes over the thread's chunks.
    pub raw_bytes: u64,
    /// Stored chunk bytes over the thread's chunks.
    pub compressed_bytes: u64,
    /// Witness bytes over the thread's chunks.
    pub witnesses: u64,
}

/// Everything known about a trace after scanning its sections.
#[derive(Clone, Debug, Default)]
pub struct Index {
    pub(crate) modules: Vec<Module>,
    module_pos: HashMap<ModuleId, usize>,
    pub(crate) databases: BTreeMap<ModuleId, DatabaseRef>,
    pub(crate) threads: BTreeMap<ThreadId, ThreadInfo>,
    pub(crate) exits: Vec<ProcessExit>,
    pub(crate) notes: Vec<Note>,
    pub(crate) command: Option<Command>,
    pub(crate) images: Vec<Image>,
    pub(crate) end: Option<End>,
    /// Sections accepted so far (END excluded), unknown kinds included.
    pub(crate) sections: u64,
    /// Running totals in END's shape.
    pub(crate) totals: End,
}

/// `what` names the section in errors; it is only built when there is one.
fn check_raw(
    offset: u64,
    what: &dyn Fn() -> String,
    codec: Codec,
    raw_len: u64,
    stored: usize,
) -> Result<()> {
    if raw_len > MAX_RAW_LEN {
        return Err(Error::corrupt(
            offset,
            format!(
                "{} claims {raw_len} raw bytes, over the {MAX_RAW_LEN}-byte limit",
                what()
            ),
        ));
    }
    if codec == Codec::Stored && stored as u64 != raw_len {
        return Err(Error::corrupt(
            offset,
            format!(
                "{} is stored uncompressed in {stored} bytes but claims {raw_len}",
                what()
            ),
        ));
    }
    Ok(())
}

impl Index {
    /// Checks `record`, found in the section at `offset` whose payload starts at
    /// file offset `payload_at`, against everything before it, and adds it.
    pub(crate) fn push(
        &mut self,
        offset: u64,
        payload_at: usize,
        record: &Record<'_>,
    ) -> Result<()> {
        if self.end.is_some() {
            return Err(Error::corrupt(offset, "section after END"));
        }
        let span = |at: usize, len: usize| payload_at + at..payload_at + at + len;
        match record {
            Record::Module(m) => {
                if m.id.0 == u32::MAX {
                    return Err(Error::corrupt(
                        offset,
                        "module id 0xffffffff is reserved for none",
                    ));
                }
                if self.module_pos.contains_key(&m.id) {
                    return Err(Error::corrupt(
                        offset,
                        format!("module {} defined twice", m.id),
                    ));
                }
                self.module_pos.insert(m.id, self.modules.len());
                self.modules.push(m.clone());
                self.totals.modules += 1;
            }
            Record::ProgramDatabase {
                header,
                data,
                data_at,
            } => {
                let what = || format!("program database of module {}", header.module);
                if !self.module_pos.contains_key(&header.module) {
                    return Err(Error::corrupt(
                        offset,
                        format!("{}: no such module", what()),
                    ));
                }
                if self.databases.contains_key(&header.module)
                    || self.shared(header.module).is_some()
                {
                    return Err(Error::corrupt(offset, format!("{} given twice", what())));
                }
                check_raw(offset, &what, header.codec, header.raw_len, data.len())?;
                self.databases.insert(
                    header.module,
                    DatabaseRef {
                        header: *header,
                        section_offset: offset,
                        data: span(*data_at, data.len()),
                    },
                );
            }
            Record::ThreadStart(t) => {
                if t.thread.0 == u32::MAX {
                    return Err(Error::corrupt(
                        offset,
                        "thread id 0xffffffff is reserved for none",
                    ));
                }
                if self.threads.contains_key(&t.thread) {
                    return Err(Error::corrupt(
                        offset,
                        format!("thread {} started twice", t.thread),
                    ));
                }
                if let Some(p) = t.parent {
                    if !self.threads.contains_key(&p) {
                        return Err(Error::corrupt(
                            offset,
                            format!("thread {} has unknown parent thread {p}", t.thread),
                        ));
                    }
                }
                self.threads.insert(
                    t.thread,
                    ThreadInfo {
                        start: *t,
                        end: None,
                        chunks: Vec::new(),
                        raw_bytes: 0,
                        compressed_bytes: 0,
                        witnesses: 0,
                    },
                );
                self.totals.threads += 1;
            }
            Record::Chunk {
                header: h,
                data,
                data_at,
            } => {
                let th = self.open_thread(offset, h.thread, "CHUNK")?;
                let expected = th.chunks.len() as u64;
                if h.seq > expected {
                    return Err(Error::MissingChunk {
                        thread: h.thread,
                        seq: expected,
                        offset,
                        found: format!("chunk {}", h.seq),
                    });
                }
                if h.seq < expected {
                    return Err(Error::corrupt(
                        offset,
                        format!("thread {} chunk {} appears twice", h.thread, h.seq),
                    ));
                }
                let what = || format!("thread {} chunk {}", h.thread, h.seq);
                check_raw(offset, &what, h.codec, h.raw_len, data.len())?;
                if h.witnesses > h.raw_len {
                    return Err(Error::corrupt(
                        offset,
                        format!(
                            "{} claims {} witnesses in {} bytes",
                            what(),
                            h.witnesses,
                            h.raw_len
                        ),
                    ));
                }
                let stored = data.len() as u64;
                th.chunks.push(ChunkRef {
                    thread: h.thread,
                    seq: h.seq,
                    codec: h.codec,
                    raw_len: h.raw_len,
                    witnesses: h.witnesses,
                    section_offset: offset,
                    data: span(*data_at, data.len()),
                });
                th.raw_bytes += h.raw_len;
                th.compressed_bytes += stored;
                th.witnesses += h.witnesses;
                self.totals.chunks += 1;
                self.totals.raw_bytes += h.raw_len;
                self.totals.compressed_bytes += stored;
                self.totals.witnesses += h.witnesses;
            }
            Record::ThreadEnd(e) => {
                let th = self.open_thread(offset, e.thread, "THREAD_END")?;
                let written = th.chunks.len() as u64;
                if e.chunks > written {
                    return Err(Error::MissingChunk {
                        thread: e.thread,
                        seq: written,
                        offset,
                        found: format!("THREAD_END stating {} chunks", e.chunks),
                    });
                }
                if e.chunks < written {
                    return Err(Error::corrupt(
                        offset,
                        format!(
                            "THREAD_END of thread {} states {} chunks but {written} were written",
                            e.thread, e.chunks
                        ),
                    ));
                }
                th.end = Some(*e);
            }
            Record::ProcessExit(p) => {
                self.exits.push(*p);
                self.totals.process_exits += 1;
            }
            Record::Note(n) => {
                if let Some(m) = n.module {
                    if !self.module_pos.contains_key(&m) {
                        return Err(Error::corrupt(
                            offset,
                            format!("NOTE names unknown module {m}"),
                        ));
                    }
                }
                self.notes.push(n.clone());
            }
            Record::End(e) => {
                if let Some(t) = self.threads.values().find(|t| t.end.is_none()) {
                    return Err(Error::corrupt(
                        offset,
                        format!("END before THREAD_END of thread {}", t.start.thread),
                    ));
                }
                let mut counted = self.totals;
                counted.sections = self.sections;
                if *e != counted {
                    return Err(Error::corrupt(
                        offset,
                        format!("END totals {e:?} differ from the sections read {counted:?}"),
                    ));
                }
                self.end = Some(*e);
                return Ok(());
            }
            Record::Command(c) => {
                if self.command.is_some() {
                    return Err(Error::corrupt(offset, "a second COMMAND section"));
                }
                self.command = Some(c.clone());
            }
            Record::Image(i) => self.push_image(offset, i)?,
            Record::Unknown(_) => {}
        }
        self.sections += 1;
        Ok(())
    }

    /// The module whose database `module` shares (IMAGE), if any.
    pub(crate) fn shared(&self, module: ModuleId) -> Option<ModuleId> {
        self.images
            .iter()
            .find(|i| i.module == module)
            .and_then(|i| i.database)
    }

    /// IMAGE: its module, thread and shared database must be known.
    fn push_image(&mut self, offset: u64, i: &Image) -> Result<()> {
        let bad = |what: String| Err(Error::corrupt(offset, format!("IMAGE: {what}")));
        if !self.module_pos.contains_key(&i.module) {
            return bad(format!("no module {}", i.module));
        }
        if !self.threads.contains_key(&i.thread) {
            return bad(format!("no thread {}", i.thread));
        }
        if self.images.iter().any(|o| o.module == i.module) {
            return bad(format!("module {} given twice", i.module));
        }
        if let Some(db) = i.database {
            if !self.databases.contains_key(&db) || self.databases.contains_key(&i.module) {
                return bad(format!(
                    "module {} cannot share the database of module {db}",
                    i.module
                ));
            }
        }
        self.images.push(*i);
        Ok(())
    }

    fn open_thread(
        &mut self,
        offset: u64,
        thread: ThreadId,
        what: &str,
    ) -> Result<&mut ThreadInfo> {
        match self.threads.get_mut(&thread) {
            None => Err(Error::corrupt(
                offset,
                format!("{what} of thread {thread} before its THREAD_START"),
            )),
            Some(t) if t.end.is_some() => Err(Error::corrupt(
                offset,
                format!("{what} of thread {thread} after its THREAD_END"),
            )),
            Some(t) => Ok(t),
        }
    }

    /// The END section to write now: the totals so far.
    pub(crate) fn end_record(&self) -> End {
        let mut e = self.totals;
        e.sections = self.sections;
        e
    }

    /// Looks a module up by id.
    pub(crate) fn module(&self, id: ModuleId) -> Option<&Module> {
        self.module_pos.get(&id).and_then(|&i| self.modules.get(i))
    }

    /// Threads that have not ended.
    pub(crate) fn open_threads(&self) -> impl Iterator<Item = ThreadId> + '_ {
        self.threads
            .values()
            .filter(|t| t.end.is_none())
            .map(|t| t.start.thread)
    }
}
