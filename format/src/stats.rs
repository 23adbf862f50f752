//! What `aetrace info` prints: sizes per thread and in total, modules, process
//! exits, completeness. [`Stats`] serialises to JSON (`--json`) and displays as text.
//!
//! Invariant: every figure is counted from the index, none is taken from END, so an
//! incomplete trace reports exactly what it holds.

use crate::section::{module_flags, EndReason, ExitStatus, StartReason};
use crate::trace::Trace;
use crate::{ModuleId, ThreadId};
use serde::Serialize;
use std::fmt;

/// One module.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModuleStats {
    /// Dense id of the module in the trace.
    pub id: ModuleId,
    /// Process id the module was mapped in.
    pub pid: u32,
    /// The path, with bytes that are not UTF-8 replaced.
    pub path: String,
    /// Hex digits, empty when the module has no build-id.
    pub build_id: String,
    /// Address the module's vaddr 0 was loaded at.
    pub load_base: u64,
    /// Bytes of address space the module spans.
    pub size: u64,
    /// Whether it is the program's main executable.
    pub main: bool,
    /// Whether it was rewritten by aetrace (its program database is in the trace).
    pub instrumented: bool,
    /// Size of the program database once decompressed, and as stored.
    pub database_raw_bytes: Option<u64>,
    /// Stored (usually compressed) size of the program database.
    pub database_stored_bytes: Option<u64>,
    /// The module whose program database it shares (an exec'd image's
    /// executable: module 0's), from its IMAGE section.
    pub database_of: Option<ModuleId>,
    /// The stream that starts the process image it belongs to, when a
    /// traced process exec'd it (IMAGE); `None`: its pid's first image.
    pub image_thread: Option<ThreadId>,
}

/// One thread's stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ThreadStats {
    /// Dense id of the thread in the trace.
    pub thread: ThreadId,
    /// The thread that created this one, `None` for the main thread.
    pub parent: Option<ThreadId>,
    /// Kernel process id.
    pub pid: u32,
    /// Kernel thread id.
    pub os_tid: u32,
    /// `main`, `thread`, `fork` or `exec`.
    pub start: &'static str,
    /// `exit`, `exec`, `killed`, or `None` when the trace stops before the thread ends.
    pub end: Option<&'static str>,
    /// Chunks in the thread's stream.
    pub chunks: u64,
    /// Decompressed witness-stream bytes.
    pub raw_bytes: u64,
    /// Stored chunk bytes.
    pub compressed_bytes: u64,
    /// Witness bytes (the rest of the stream is escape records).
    pub witnesses: u64,
}

/// How one process ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExitStats {
    /// Kernel process id.
    pub pid: u32,
    /// The exit code, when the process called `exit`.
    pub exit_code: Option<i32>,
    /// The signal that killed the process, if one did.
    pub signal: Option<i32>,
    /// Whether the kernel wrote a core dump.
    pub core_dumped: bool,
}

/// Everything `aetrace info` reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// `major.minor` of the file format.
    pub version: String,
    /// The program and version that wrote the file (from the header).
    pub creator: String,
    /// Whether the trace is complete (it has an END section).
    pub complete: bool,
    /// Why the trace is incomplete (no END, torn tail), `None` when complete.
    pub incomplete: Option<String>,
    /// Size of the trace file.
    pub file_bytes: u64,
    /// Sections before END.
    pub sections: u64,
    /// Every module, in file order.
    pub modules: Vec<ModuleStats>,
    /// Every thread stream, in file order.
    pub threads: Vec<ThreadStats>,
    /// Every process exit, in file order.
    pub process_exits: Vec<ExitStats>,
    /// The number of NOTE sections.
    pub notes: u64,
    /// Totals over all threads.
    pub chunks: u64,
    /// Decompressed witness-stream bytes.
    pub raw_bytes: u64,
    /// Stored chunk bytes.
    pub compressed_bytes: u64,
    /// Witness bytes.
    pub witnesses: u64,
    /// Program database bytes once decompressed, over all modules.
    pub database_raw_bytes: u64,
    /// Program database bytes as stored, over all modules.
    pub database_stored_bytes: u64,
}

fn start_name(r: StartReason) -> &'static str {
    match r {
        StartReason::Main => "main",
        StartReason::Thread => "thread",
        StartReason::Fork => "fork",
        StartReason::Exec => "exec",
    }
}

fn end_name(r: EndReason) -> &'static str {
    match r {
        EndReason::Exit => "exit",
        EndReason::Exec => "exec",
        EndReason::Killed => "killed",
    }
}

impl<B: AsRef<[u8]>> Trace<B> {
    /// Sizes and contents for `aetrace info`.
    pub fn stats(&self) -> Stats {
        let index = &self.index;
        let modules = self
            .modules()
            .iter()
            .map(|m| {
                let db = index.databases.get(&m.id);
                ModuleStats {
                    id: m.id,
                    pid: m.pid,
                    path: String::from_utf8_lossy(&m.path).into_owned(),
                    build_id: m.build_id.iter().map(|b| format!("{b:02x}")).collect(),
                    load_base: m.load_base,
                    size: m.size,
                    main: m.flags & module_flags::MAIN != 0,
                    instrumented: m.flags & module_flags::INSTRUMENTED != 0,
                    database_raw_bytes: db.map(|d| d.header.raw_len),
                    database_stored_bytes: db.map(|d| d.data.len() as u64),
                    database_of: index.shared(m.id),
                    image_thread: self.image_thread(m.id),
                }
            })
            .collect::<Vec<_>>();
        let threads = self
            .threads()
            .map(|t| ThreadStats {
                thread: t.start.thread,
                parent: t.start.parent,
                pid: t.start.pid,
                os_tid: t.start.os_tid,
                start: start_name(t.start.reason),
                end: t.end.map(|e| end_name(e.reason)),
                chunks: t.chunks.len() as u64,
                raw_bytes: t.raw_bytes,
                compressed_bytes: t.compressed_bytes,
                witnesses: t.witnesses,
            })
            .collect();
        let process_exits = self
            .process_exits()
            .iter()
            .map(|e| match e.status {
                ExitStatus::Exited(code) => ExitStats {
                    pid: e.pid,
                    exit_code: Some(code),
                    signal: None,
                    core_dumped: false,
                },
                ExitStatus::Signaled {
                    signal,
                    core_dumped,
                } => ExitStats {
                    pid: e.pid,
                    exit_code: None,
                    signal: Some(signal),
                    core_dumped,
                },
            })
            .collect();
        let t = &index.totals;
        let header = self.header();
        Stats {
            version: format!("{}.{}", header.major, header.minor),
            creator: header.creator.clone(),
            complete: self.is_complete(),
            incomplete: self.require_complete().err().map(|e| e.to_string()),
            file_bytes: self.bytes.as_ref().len() as u64,
            sections: index.sections,
            database_raw_bytes: modules.iter().filter_map(|m| m.database_raw_bytes).sum(),
            database_stored_bytes: modules.iter().filter_map(|m| m.database_stored_bytes).sum(),
            modules,
            threads,
            process_exits,
            notes: self.notes().len() as u64,
            chunks: t.chunks,
            raw_bytes: t.raw_bytes,
            compressed_bytes: t.compressed_bytes,
            witnesses: t.witnesses,
        }
    }
}

/// `raw / stored` with one decimal, `-` when nothing is stored.
struct Ratio(u64, u64);

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.1 == 0 {
            f.pad("-")
        } else {
            f.pad(&format!("{:.1}", self.0 as f64 / self.1 as f64))
        }
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "trace format {} written by {:?}: {}",
            self.version,
            self.creator,
            match &self.incomplete {
                None => "complete".to_owned(),
                Some(why) => why.clone(),
            }
        )?;
        writeln!(
            f,
            "file: {} bytes in {} sections",
            self.file_bytes, self.sections
        )?;
        writeln!(f, "modules: {}", self.modules.len())?;
        for m in &self.modules {
            let db = match (m.database_raw_bytes, m.database_stored_bytes, m.database_of) {
                (Some(raw), Some(stored), _) => format!("database {raw} -> {stored} bytes"),
                (_, _, Some(of)) => format!("database of module {of}"),
                _ => "no database".to_owned(),
            };
            let db = match m.image_thread {
                Some(t) => format!("image of thread {t}, {db}"),
                None => db,
            };
            let build_id = if m.build_id.is_empty() {
                "-"
            } else {
                &m.build_id
            };
            writeln!(
                f,
                "  {:>3} pid {} base {:#x} size {:#x}{}{} build-id {build_id} {db} {}",
                m.id,
                m.pid,
                m.load_base,
                m.size,
                if m.main { " main" } else { "" },
                if m.instrumented { " instrumented" } else { "" },
                m.path
            )?;
        }
        writeln!(f, "threads: {}", self.threads.len())?;
        if !self.threads.is_empty() {
            writeln!(
                f,
                "  {:>6} {:>6} {:>8} {:>8} {:>6} {:>7} {:>7} {:>12} {:>12} {:>6} {:>12}",
                "thread",
                "parent",
                "pid",
                "tid",
                "start",
                "end",
                "chunks",
                "raw bytes",
                "stored",
                "ratio",
                "witnesses"
            )?;
        }
        for t in &self.threads {
            let parent = t.parent.map_or("-".to_owned(), |p| p.to_string());
            writeln!(
                f,
                "  {:>6} {:>6} {:>8} {:>8} {:>6} {:>7} {:>7} {:>12} {:>12} {:>6} {:>12}",
                t.thread,
                parent,
                t.pid,
                t.os_tid,
                t.start,
                t.end.unwrap_or("(open)"),
                t.chunks,
                t.raw_bytes,
                t.compressed_bytes,
                Ratio(t.raw_bytes, t.compressed_bytes),
                t.witnesses
            )?;
        }
        writeln!(
            f,
            "witness streams: {} chunks, {} raw bytes, {} stored bytes (ratio {}), {} witnesses",
            self.chunks,
            self.raw_bytes,
            self.compressed_bytes,
            Ratio(self.raw_bytes, self.compressed_bytes),
            self.witnesses
        )?;
        writeln!(
            f,
            "program databases: {} raw bytes, {} stored bytes",
            self.database_raw_bytes, self.database_stored_bytes
        )?;
        for e in &self.process_exits {
            match (e.exit_code, e.signal) {
                (Some(code), _) => writeln!(f, "process {} exited with status {code}", e.pid)?,
                (_, Some(sig)) => writeln!(
                    f,
                    "process {} killed by signal {sig}{}",
                    e.pid,
                    if e.core_dumped { " (core dumped)" } else { "" }
                )?,
                _ => {}
            }
        }
        writeln!(f, "notes: {}", self.notes)
    }
}
