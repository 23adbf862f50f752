//! Sections: the framing every record shares, and the payload of each kind.
//!
//! A section is a 16-byte header, the payload, then zero padding to a multiple of
//! 8 bytes (layout in `docs/format.md`). Invariants:
//! - the header carries two CRC-32s: one over its first 12 bytes (so a damaged
//!   length is never trusted), one over header bytes 0..8 and the payload;
//! - every section starts at a multiple of 8 from the file start;
//! - decoding a payload never panics and never trusts a length it has not bounded.

use crate::bytes::{le_u16, le_u32, Cursor, Put};
use crate::error::{Error, Result};
use crate::{ModuleId, ThreadId};
use std::fmt;

/// Size of a section header.
pub const SECTION_HEADER_LEN: usize = 16;
/// Largest raw (decompressed) size of a chunk or program database a reader accepts:
/// bounds the allocation a hostile file can ask for.
pub const MAX_RAW_LEN: u64 = 1 << 30;
/// Payload bytes before the stored data of a PROGRAM_DATABASE.
pub(crate) const DATABASE_FIXED_LEN: usize = 24;
/// Payload bytes before the stored data of a CHUNK.
pub(crate) const CHUNK_FIXED_LEN: usize = 32;

/// The kind field of a section. Bit 15 marks a *critical* kind: a reader that does
/// not know a critical kind must refuse the file; unknown other kinds are skipped.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SectionKind(pub u16);

impl SectionKind {
    /// Never stored: names the file header in checksum errors (and makes a zeroed
    /// section header invalid).
    pub const FILE_HEADER: SectionKind = SectionKind(0);
    /// MODULE: one loaded ELF object.
    pub const MODULE: SectionKind = SectionKind(1);
    /// PROGRAM_DATABASE: a rewritten module's static data.
    pub const PROGRAM_DATABASE: SectionKind = SectionKind(2);
    /// THREAD_START: opens a thread's witness stream.
    pub const THREAD_START: SectionKind = SectionKind(3);
    /// CHUNK: a piece of a thread's witness stream.
    pub const CHUNK: SectionKind = SectionKind(4);
    /// THREAD_END: closes a thread's witness stream.
    pub const THREAD_END: SectionKind = SectionKind(5);
    /// PROCESS_EXIT: one traced process ended.
    pub const PROCESS_EXIT: SectionKind = SectionKind(6);
    /// NOTE: free text.
    pub const NOTE: SectionKind = SectionKind(7);
    /// END: the totals; its presence means the trace is complete.
    pub const END: SectionKind = SectionKind(8);
    /// How to run the program again (`aetrace verify`); not critical: a
    /// reader that does not know it loses nothing else.
    pub const COMMAND: SectionKind = SectionKind(9);
    /// IMAGE (1.12): ties a module to the stream that starts its process
    /// image (a program exec'd by a traced process); not critical: a
    /// reader that does not know it keys modules by pid as before.
    pub const IMAGE: SectionKind = SectionKind(10);
    /// Bit that makes an unknown kind fatal rather than skippable.
    pub const CRITICAL: u16 = 0x8000;

    fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::FILE_HEADER => "file header",
            Self::MODULE => "MODULE",
            Self::PROGRAM_DATABASE => "PROGRAM_DATABASE",
            Self::THREAD_START => "THREAD_START",
            Self::CHUNK => "CHUNK",
            Self::THREAD_END => "THREAD_END",
            Self::PROCESS_EXIT => "PROCESS_EXIT",
            Self::NOTE => "NOTE",
            Self::END => "END",
            Self::COMMAND => "COMMAND",
            Self::IMAGE => "IMAGE",
            _ => return None,
        })
    }
}

impl fmt::Display for SectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "unknown kind {:#06x}", self.0),
        }
    }
}

impl fmt::Debug for SectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// How a chunk or program database payload is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// Raw bytes (used when compression does not pay, and by tests).
    Stored,
    /// One or more zstd frames.
    Zstd,
    /// zstd of a data trace's stream with its VALUE records as predicted
    /// differences (`values`, docs/format.md "Chunk codecs"; minor 7).
    ZstdValues,
    /// Codec 2's values and bytes in separate zstd frames, the deltas by
    /// byte plane (`values`, docs/format.md "CHUNK"; minor 9).
    ZstdSplit,
}

impl Codec {
    /// The codec's name in docs/format.md.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Stored => "stored",
            Codec::Zstd => "zstd",
            Codec::ZstdValues => "zstd+values",
            Codec::ZstdSplit => "zstd+split",
        }
    }

    fn to_u32(self) -> u32 {
        match self {
            Codec::Stored => 0,
            Codec::Zstd => 1,
            Codec::ZstdValues => 2,
            Codec::ZstdSplit => 3,
        }
    }
    fn from_u32(v: u32, offset: u64) -> Result<Codec> {
        match v {
            0 => Ok(Codec::Stored),
            1 => Ok(Codec::Zstd),
            2 => Ok(Codec::ZstdValues),
            3 => Ok(Codec::ZstdSplit),
            _ => Err(Error::corrupt(offset, format!("unknown codec {v}"))),
        }
    }
}

/// Bits of [`Module::flags`].
pub mod module_flags {
    /// The program's main executable (as opposed to a shared library).
    pub const MAIN: u32 = 1;
    /// Rewritten by aetrace: its program database is in the trace.
    pub const INSTRUMENTED: u32 = 2;
    /// Rewritten by `record --data --check` (format 1.4): its traced
    /// procedures write every non-static data address in full as VALUE
    /// records (docs/data.md); with [`DATA_ABS`], after those.
    pub const DATA_CHECK: u32 = 4;
    /// Rewritten by `record --data` (format 1.4): its traced procedures
    /// write the VALUE records abstract execution cannot recompute
    /// (`analysis::addr::exec`, docs/data.md).
    pub const DATA_ABS: u32 = 8;
}

/// MODULE: one loaded ELF object of one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// Dense id assigned by the recorder, unique in the trace.
    pub id: ModuleId,
    /// OS process id the module was mapped in (fork children inherit their
    /// parent's modules; an exec'd image gets its own MODULE sections).
    pub pid: u32,
    /// [`module_flags`] bits.
    pub flags: u32,
    /// Address the module's vaddr 0 was loaded at in this run.
    pub load_base: u64,
    /// Bytes of address space the module spans from `load_base`.
    pub size: u64,
    /// Contents of the ELF `NT_GNU_BUILD_ID` note (empty when the binary has none).
    pub build_id: Vec<u8>,
    /// Path the loader opened, as bytes (Linux paths need not be UTF-8).
    pub path: Vec<u8>,
}

/// Why a thread stream starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartReason {
    /// The first thread of the traced program.
    Main,
    /// A new thread (clone with `CLONE_THREAD`).
    Thread,
    /// The only thread of a new process created by `fork`/`vfork`.
    Fork,
    /// The thread that continues in a new program image after `execve`.
    Exec,
}

/// THREAD_START: opens a thread's witness stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadStart {
    /// The thread the stream belongs to (dense id, unique in the trace).
    pub thread: ThreadId,
    /// The thread that created this one, `None` for the main thread.
    pub parent: Option<ThreadId>,
    /// Kernel thread id.
    pub os_tid: u32,
    /// Kernel process id.
    pub pid: u32,
    /// Why the stream starts.
    pub reason: StartReason,
}

/// Why a thread stream ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// The thread (or its whole process) exited.
    Exit,
    /// The process called `execve`; the image continues in a new stream.
    Exec,
    /// The thread died with its process from a signal.
    Killed,
}

/// THREAD_END: closes a thread's stream after `chunks` chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadEnd {
    /// The thread whose stream ends.
    pub thread: ThreadId,
    /// Why it ends.
    pub reason: EndReason,
    /// Number of chunks the thread wrote (lets a reader see a lost last chunk).
    pub chunks: u64,
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// `exit(code)` (the low 8 bits are what a parent sees).
    Exited(i32),
    /// Killed by this signal number.
    Signaled {
        /// The signal number.
        signal: i32,
        /// Whether the kernel wrote a core dump.
        core_dumped: bool,
    },
}

/// PROCESS_EXIT: the end of one traced process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessExit {
    /// Kernel process id of the process.
    pub pid: u32,
    /// How it ended.
    pub status: ExitStatus,
}

/// NOTE: free text, e.g. a procedure left uninstrumented and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// The module the note is about, if any.
    pub module: Option<ModuleId>,
    /// The note's text.
    pub text: String,
}

/// IMAGE (since 1.12): `module` belongs to the process image whose first
/// stream is `thread` (a program a traced process exec'd), not to the
/// image its pid ran first; `database` is the module whose program
/// database it shares (the same rewritten file), `None` for its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Image {
    /// The module (a MODULE earlier in the file).
    pub module: ModuleId,
    /// The stream that starts the image (a THREAD_START earlier in the file).
    pub thread: ThreadId,
    /// The module whose PROGRAM_DATABASE serves this one, if not its own.
    pub database: Option<ModuleId>,
    /// The module tag the image's ENTER and LANDING records carry for
    /// this module (since 1.14): 0 for the executable, the library's for
    /// a `--libs` library; 0 in older traces, whose IMAGEs are
    /// executables'.
    pub tag: u32,
}

/// END: totals over the whole trace; its presence means the trace is complete.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct End {
    /// Sections before END.
    pub sections: u64,
    /// Chunks over all threads.
    pub chunks: u64,
    /// Uncompressed witness-stream bytes over all chunks.
    pub raw_bytes: u64,
    /// Stored chunk bytes over all chunks.
    pub compressed_bytes: u64,
    /// Witness bytes over all chunks.
    pub witnesses: u64,
    /// THREAD_START sections in the trace.
    pub threads: u32,
    /// MODULE sections in the trace.
    pub modules: u32,
    /// PROCESS_EXIT sections in the trace.
    pub process_exits: u32,
}

/// Where the traced program's standard input came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stdin {
    /// A regular file: its path (as `/proc/self/fd/0` named it) and size
    /// when the program started.
    File {
        /// The file's path, as bytes.
        path: Vec<u8>,
        /// The file's size in bytes.
        size: u64,
    },
    /// `/dev/null`.
    Null,
    /// Anything else (a terminal, a pipe, a socket): cannot be replayed.
    Other,
}

/// COMMAND: how the traced program was started, written before it ran, so
/// that `aetrace verify` can run the original program the same way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    /// The original (not rewritten) executable that was run, as bytes.
    pub program: Vec<u8>,
    /// `argv`, `argv[0]` first, exactly as the program received it.
    pub argv: Vec<Vec<u8>>,
    /// The environment as `KEY=VALUE`, without the recorder's own variables.
    pub env: Vec<Vec<u8>>,
    /// Working directory.
    pub cwd: Vec<u8>,
    /// Where standard input came from, and whether it can be replayed.
    pub stdin: Stdin,
}

/// The fixed fields of a CHUNK (the data follows them in the payload).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    /// The thread whose stream the chunk continues.
    pub thread: ThreadId,
    /// How the data is stored.
    pub codec: Codec,
    /// 0, 1, 2... within the thread.
    pub seq: u64,
    /// Length of the witness stream bytes once decompressed.
    pub raw_len: u64,
    /// How many of those bytes are witnesses (the rest are escape records).
    pub witnesses: u64,
}

/// The fixed fields of a PROGRAM_DATABASE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatabaseHeader {
    /// The module whose database this is.
    pub module: ModuleId,
    /// Version of the database encoding (defined by the rewriter, opaque here).
    pub version: u32,
    /// How the data is stored.
    pub codec: Codec,
    /// Bytes of the database once decompressed.
    pub raw_len: u64,
}

/// A decoded section payload. Bulk data borrows from the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// A MODULE section: one loaded ELF object.
    Module(Module),
    /// A PROGRAM_DATABASE section: a rewritten module's static data.
    ProgramDatabase {
        /// The section's fixed fields.
        header: DatabaseHeader,
        /// Stored bytes and their offset inside the payload.
        data: &'a [u8],
        /// Offset of `data` inside the payload.
        data_at: usize,
    },
    /// A THREAD_START section: a thread's stream opens.
    ThreadStart(ThreadStart),
    /// A CHUNK section: a piece of a thread's witness stream.
    Chunk {
        /// The section's fixed fields.
        header: ChunkHeader,
        /// The stored (usually compressed) witness-stream bytes.
        data: &'a [u8],
        /// Offset of `data` inside the payload.
        data_at: usize,
    },
    /// A THREAD_END section: a thread's stream closes.
    ThreadEnd(ThreadEnd),
    /// A PROCESS_EXIT section: a traced process ended.
    ProcessExit(ProcessExit),
    /// A NOTE section: free text.
    Note(Note),
    /// The END section: the totals of a complete trace.
    End(End),
    /// The COMMAND section: how the program was started.
    Command(Command),
    /// An IMAGE section: a module's process image.
    Image(Image),
    /// A non-critical kind this reader does not know; skipped.
    Unknown(SectionKind),
}

const NONE_ID: u32 = u32::MAX;

fn opt_id(v: u32) -> Option<u32> {
    (v != NONE_ID).then_some(v)
}

impl Record<'_> {
    /// The kind this record is stored as.
    pub fn kind(&self) -> SectionKind {
        match self {
            Record::Module(_) => SectionKind::MODULE,
            Record::ProgramDatabase { .. } => SectionKind::PROGRAM_DATABASE,
            Record::ThreadStart(_) => SectionKind::THREAD_START,
            Record::Chunk { .. } => SectionKind::CHUNK,
            Record::ThreadEnd(_) => SectionKind::THREAD_END,
            Record::ProcessExit(_) => SectionKind::PROCESS_EXIT,
            Record::Note(_) => SectionKind::NOTE,
            Record::End(_) => SectionKind::END,
            Record::Command(_) => SectionKind::COMMAND,
            Record::Image(_) => SectionKind::IMAGE,
            Record::Unknown(k) => *k,
        }
    }

    /// Appends the payload to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) -> Result<()> {
        match self {
            Record::Module(m) => {
                out.put_u32(m.id.0);
                out.put_u32(m.pid);
                out.put_u32(m.flags);
                out.put_u32(0);
                out.put_u64(m.load_base);
                out.put_u64(m.size);
                out.put_bytes32(&m.build_id)?;
                out.put_bytes32(&m.path)?;
            }
            Record::ProgramDatabase {
                header: h, data, ..
            } => {
                out.put_u32(h.module.0);
                out.put_u32(h.version);
                out.put_u32(h.codec.to_u32());
                out.put_u32(0);
                out.put_u64(h.raw_len);
                out.extend_from_slice(data);
            }
            Record::ThreadStart(t) => {
                out.put_u32(t.thread.0);
                out.put_u32(t.parent.map_or(NONE_ID, |p| p.0));
                out.put_u32(t.os_tid);
                out.put_u32(t.pid);
                out.put_u32(match t.reason {
                    StartReason::Main => 0,
                    StartReason::Thread => 1,
                    StartReason::Fork => 2,
                    StartReason::Exec => 3,
                });
                out.put_u32(0);
            }
            Record::Chunk {
                header: h, data, ..
            } => {
                out.put_u32(h.thread.0);
                out.put_u32(h.codec.to_u32());
                out.put_u64(h.seq);
                out.put_u64(h.raw_len);
                out.put_u64(h.witnesses);
                out.extend_from_slice(data);
            }
            Record::ThreadEnd(t) => {
                out.put_u32(t.thread.0);
                out.put_u32(match t.reason {
                    EndReason::Exit => 0,
                    EndReason::Exec => 1,
                    EndReason::Killed => 2,
                });
                out.put_u64(t.chunks);
            }
            Record::ProcessExit(p) => {
                out.put_u32(p.pid);
                let (how, status, core) = match p.status {
                    ExitStatus::Exited(code) => (0, code, 0),
                    ExitStatus::Signaled {
                        signal,
                        core_dumped,
                    } => (1, signal, u32::from(core_dumped)),
                };
                out.put_u32(how);
                out.put_i32(status);
                out.put_u32(core);
            }
            Record::Image(i) => {
                out.put_u32(i.module.0);
                out.put_u32(i.thread.0);
                out.put_u32(i.database.map_or(NONE_ID, |m| m.0));
                out.put_u32(i.tag);
            }
            Record::Note(n) => {
                out.put_u32(n.module.map_or(NONE_ID, |m| m.0));
                out.put_u32(0);
                out.extend_from_slice(n.text.as_bytes());
            }
            Record::End(e) => {
                out.put_u64(e.sections);
                out.put_u64(e.chunks);
                out.put_u64(e.raw_bytes);
                out.put_u64(e.compressed_bytes);
                out.put_u64(e.witnesses);
                out.put_u32(e.threads);
                out.put_u32(e.modules);
                out.put_u32(e.process_exits);
                out.put_u32(0);
            }
            Record::Command(c) => {
                let (kind, size, path): (u32, u64, &[u8]) = match &c.stdin {
                    Stdin::Other => (0, 0, &[]),
                    Stdin::File { path, size } => (1, *size, path),
                    Stdin::Null => (2, 0, &[]),
                };
                out.put_u32(kind);
                out.put_u32(0);
                out.put_u64(size);
                out.put_bytes32(&c.program)?;
                out.put_bytes32(&c.cwd)?;
                out.put_bytes32(path)?;
                for list in [&c.argv, &c.env] {
                    let n = u32::try_from(list.len())
                        .map_err(|_| Error::Misuse("more than 2^32 arguments".into()))?;
                    out.put_u32(n);
                    for a in list.iter() {
                        out.put_bytes32(a)?;
                    }
                }
            }
            Record::Unknown(k) => {
                return Err(Error::Misuse(format!("cannot write a section of {k}")))
            }
        }
        Ok(())
    }
}

/// Decodes the payload of a section of `kind` at file offset `offset`.
/// `newer_minor`: the file was written by a newer minor version, whose payloads may
/// carry trailing fields this reader skips.
pub(crate) fn decode(
    kind: SectionKind,
    payload: &[u8],
    offset: u64,
    newer_minor: bool,
) -> Result<Record<'_>> {
    let mut c = Cursor::new(payload, offset);
    let bad = |what: String| Error::corrupt(offset, what);
    let record = match kind {
        SectionKind::MODULE => {
            let id = ModuleId(c.u32("module id")?);
            let pid = c.u32("pid")?;
            let flags = c.u32("flags")?;
            c.u32("reserved")?;
            let load_base = c.u64("load base")?;
            let size = c.u64("size")?;
            let build_id = c.bytes32("build-id")?.to_vec();
            let path = c.bytes32("path")?.to_vec();
            Record::Module(Module {
                id,
                pid,
                flags,
                load_base,
                size,
                build_id,
                path,
            })
        }
        SectionKind::PROGRAM_DATABASE => {
            let module = ModuleId(c.u32("module id")?);
            let version = c.u32("database version")?;
            let codec = Codec::from_u32(c.u32("codec")?, offset)?;
            c.u32("reserved")?;
            let raw_len = c.u64("raw length")?;
            let data_at = c.pos();
            debug_assert_eq!(data_at, DATABASE_FIXED_LEN);
            // The data runs to the end of the payload: no trailing fields possible.
            let data = c.rest();
            Record::ProgramDatabase {
                header: DatabaseHeader {
                    module,
                    version,
                    codec,
                    raw_len,
                },
                data,
                data_at,
            }
        }
        SectionKind::THREAD_START => {
            let thread = ThreadId(c.u32("thread id")?);
            let parent = opt_id(c.u32("parent thread id")?).map(ThreadId);
            let os_tid = c.u32("os tid")?;
            let pid = c.u32("pid")?;
            let reason = match c.u32("start reason")? {
                0 => StartReason::Main,
                1 => StartReason::Thread,
                2 => StartReason::Fork,
                3 => StartReason::Exec,
                r => return Err(bad(format!("unknown thread start reason {r}"))),
            };
            c.u32("reserved")?;
            Record::ThreadStart(ThreadStart {
                thread,
                parent,
                os_tid,
                pid,
                reason,
            })
        }
        SectionKind::CHUNK => {
            let thread = ThreadId(c.u32("thread id")?);
            let codec = Codec::from_u32(c.u32("codec")?, offset)?;
            let seq = c.u64("sequence number")?;
            let raw_len = c.u64("raw length")?;
            let witnesses = c.u64("witness count")?;
            let data_at = c.pos();
            debug_assert_eq!(data_at, CHUNK_FIXED_LEN);
            let data = c.rest();
            Record::Chunk {
                header: ChunkHeader {
                    thread,
                    codec,
                    seq,
                    raw_len,
                    witnesses,
                },
                data,
                data_at,
            }
        }
        SectionKind::THREAD_END => {
            let thread = ThreadId(c.u32("thread id")?);
            let reason = match c.u32("end reason")? {
                0 => EndReason::Exit,
                1 => EndReason::Exec,
                2 => EndReason::Killed,
                r => return Err(bad(format!("unknown thread end reason {r}"))),
            };
            let chunks = c.u64("chunk count")?;
            Record::ThreadEnd(ThreadEnd {
                thread,
                reason,
                chunks,
            })
        }
        SectionKind::PROCESS_EXIT => {
            let pid = c.u32("pid")?;
            let how = c.u32("exit kind")?;
            let value = c.i32("exit status")?;
            let core = c.u32("core flag")?;
            let status = match how {
                0 => ExitStatus::Exited(value),
                1 => ExitStatus::Signaled {
                    signal: value,
                    core_dumped: core & 1 != 0,
                },
                h => return Err(bad(format!("unknown process exit kind {h}"))),
            };
            Record::ProcessExit(ProcessExit { pid, status })
        }
        SectionKind::NOTE => {
            let module = opt_id(c.u32("module id")?).map(ModuleId);
            c.u32("reserved")?;
            let text = std::str::from_utf8(c.rest())
                .map_err(|e| bad(format!("NOTE text is not UTF-8: {e}")))?
                .to_owned();
            Record::Note(Note { module, text })
        }
        SectionKind::END => {
            let end = End {
                sections: c.u64("section count")?,
                chunks: c.u64("chunk count")?,
                raw_bytes: c.u64("raw bytes")?,
                compressed_bytes: c.u64("compressed bytes")?,
                witnesses: c.u64("witness count")?,
                threads: c.u32("thread count")?,
                modules: c.u32("module count")?,
                process_exits: c.u32("process exit count")?,
            };
            c.u32("reserved")?;
            Record::End(end)
        }
        SectionKind::COMMAND => {
            let kind = c.u32("stdin kind")?;
            c.u32("reserved")?;
            let size = c.u64("stdin size")?;
            let program = c.bytes32("program")?.to_vec();
            let cwd = c.bytes32("working directory")?.to_vec();
            let path = c.bytes32("stdin path")?.to_vec();
            let stdin = match kind {
                0 => Stdin::Other,
                1 => Stdin::File { path, size },
                2 => Stdin::Null,
                k => return Err(bad(format!("unknown stdin kind {k}"))),
            };
            // No capacity from the counts: each string is bounded by the payload.
            let mut lists = [Vec::new(), Vec::new()];
            for (list, what) in lists.iter_mut().zip(["argument", "environment variable"]) {
                let n = c.u32("count")?;
                for _ in 0..n {
                    list.push(c.bytes32(what)?.to_vec());
                }
            }
            let [argv, env] = lists;
            Record::Command(Command {
                program,
                argv,
                env,
                cwd,
                stdin,
            })
        }
        SectionKind::IMAGE => {
            let module = ModuleId(c.u32("module id")?);
            let thread = ThreadId(c.u32("thread id")?);
            let database = opt_id(c.u32("database module id")?).map(ModuleId);
            let tag = c.u32("module tag")?;
            Record::Image(Image {
                module,
                thread,
                database,
                tag,
            })
        }
        SectionKind::FILE_HEADER => return Err(bad("section of kind 0".into())),
        k if k.0 & SectionKind::CRITICAL != 0 => {
            return Err(Error::UnsupportedSection { offset, kind: k })
        }
        k => {
            c.rest();
            Record::Unknown(k)
        }
    };
    c.finish(&kind.to_string(), newer_minor)?;
    Ok(record)
}

/// One framed section as found in the file.
#[derive(Clone, Copy, Debug)]
pub struct Section<'a> {
    /// File offset of the section header.
    pub offset: u64,
    /// The section's kind field.
    pub kind: SectionKind,
    /// The payload, without header or padding.
    pub payload: &'a [u8],
}

/// Rounds up to the section alignment.
pub(crate) fn align8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

/// Frames `payload` as a section of `kind` into `out` (header, payload, padding).
pub(crate) fn frame(kind: SectionKind, payload: &[u8], out: &mut Vec<u8>) -> Result<()> {
    let len = u32::try_from(payload.len()).map_err(|_| {
        Error::Misuse(format!(
            "{kind} payload of {} bytes exceeds 4 GiB",
            payload.len()
        ))
    })?;
    let mut h = [0u8; SECTION_HEADER_LEN];
    h[0..2].copy_from_slice(&kind.0.to_le_bytes());
    // h[2..4]: section flags, none defined.
    h[4..8].copy_from_slice(&len.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&h[0..8]);
    crc.update(payload);
    h[8..12].copy_from_slice(&crc.finalize().to_le_bytes());
    let hcrc = crc32fast::hash(&h[0..12]);
    h[12..16].copy_from_slice(&hcrc.to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(payload);
    let padded = align8(out.len() as u64) as usize;
    out.resize(padded, 0);
    Ok(())
}

/// Why a section scan stopped early.
#[derive(Debug)]
pub struct Break {
    /// File offset of the damaged section.
    pub offset: u64,
    /// What is wrong with it.
    pub error: Error,
    /// True when the damage is a torn tail: the last section was cut short (or its
    /// bytes never reached the disk) and nothing follows it. The sections before it
    /// are intact. False means damage with more data after it.
    pub torn: bool,
}

/// Iterates over the framed sections of a trace body, checking both checksums and
/// the padding of each; stops (fused) at the end or at the first damage.
pub struct Sections<'a> {
    bytes: &'a [u8],
    pos: usize,
    done: bool,
}

impl<'a> Sections<'a> {
    /// Sections of `file` from byte `start` on (the end of the file header); offsets
    /// in sections and errors are positions in `file`.
    pub fn new(file: &'a [u8], start: usize) -> Self {
        Sections {
            bytes: file,
            pos: start,
            done: false,
        }
    }

    fn next_section(&mut self) -> Result<Option<Section<'a>>, Break> {
        let at = self.pos;
        let offset = at as u64;
        let rest = self.bytes.get(at..).unwrap_or(&[]);
        if rest.is_empty() {
            return Ok(None);
        }
        let torn = |what| Break {
            offset,
            error: Error::Truncated { offset, what },
            torn: true,
        };
        let Some(h) = rest.get(..SECTION_HEADER_LEN) else {
            return Err(torn("section header"));
        };
        let kind = SectionKind(le_u16(h, 0).unwrap_or(0));
        let len = le_u32(h, 4).unwrap_or(0);
        let crc = le_u32(h, 8).unwrap_or(0);
        let hcrc = le_u32(h, 12).unwrap_or(0);
        if crc32fast::hash(h.get(..12).unwrap_or(&[])) != hcrc {
            // A zero-filled tail is what a crash leaves when the file size reached the
            // disk before its data: a tear, not damage.
            if rest.iter().all(|&b| b == 0) {
                return Err(torn("section header (zero-filled tail)"));
            }
            return Err(Break {
                offset,
                error: Error::BadChecksum {
                    offset,
                    kind,
                    part: "header",
                },
                torn: false,
            });
        }
        let end = SECTION_HEADER_LEN + len as usize;
        let padded = align8(end as u64) as usize;
        let Some(section) = rest.get(..padded) else {
            return Err(torn("section payload"));
        };
        let payload = section.get(SECTION_HEADER_LEN..end).unwrap_or(&[]);
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(h.get(..8).unwrap_or(&[]));
        hasher.update(payload);
        if hasher.finalize() != crc {
            return Err(Break {
                offset,
                error: Error::BadChecksum {
                    offset,
                    kind,
                    part: "payload",
                },
                // Only zeros after it: nothing was written after this section.
                torn: rest.get(padded..).unwrap_or(&[]).iter().all(|&b| b == 0),
            });
        }
        if section.get(end..).unwrap_or(&[]).iter().any(|&b| b != 0) {
            return Err(Break {
                offset,
                error: Error::corrupt(offset, format!("{kind} section has non-zero padding")),
                torn: false,
            });
        }
        self.pos = at + padded;
        Ok(Some(Section {
            offset,
            kind,
            payload,
        }))
    }
}

impl<'a> Iterator for Sections<'a> {
    type Item = Result<Section<'a>, Break>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_section() {
            Ok(Some(s)) => Some(Ok(s)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(b) => {
                self.done = true;
                Some(Err(b))
            }
        }
    }
}
