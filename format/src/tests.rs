//! Tests of the trace container: round trips of every section kind, the reader's
//! rules, and properties over random traces (truncation, single damaged bytes,
//! random and re-checksummed garbage). The oracle for the properties is a model
//! folded from what the test *asked the writer to write*, not the reader's code.

use crate::header::{Header, HEADER_LEN};
use crate::section::{self, ChunkHeader, Codec, Record, SectionKind, Sections};
use crate::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn header() -> Header {
    Header::new("aetrace test", 1_700_000_000_000_000_000).unwrap()
}

fn module(id: u32) -> Module {
    Module {
        id: ModuleId(id),
        pid: 100,
        flags: module_flags::MAIN | module_flags::INSTRUMENTED,
        load_base: 0x5555_5555_4000 + u64::from(id) * 0x10_0000,
        size: 0x2_1000,
        build_id: vec![0xab, 0xcd, id as u8, 0x01],
        path: format!("/usr/lib/lib{id}.so").into_bytes(),
    }
}

fn start(thread: u32, parent: Option<u32>, reason: StartReason) -> ThreadStart {
    ThreadStart {
        thread: ThreadId(thread),
        parent: parent.map(ThreadId),
        os_tid: thread.wrapping_add(4000),
        pid: 4000,
        reason,
    }
}

/// Witness-like bytes: a loop pattern with some noise.
fn witness_bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if x & 15 == 0 {
                (x >> 8) as u8
            } else {
                [1u8, 1, 2, 1, 3][i % 5]
            }
        })
        .collect()
}

/// A thread as the tests see it: start, end, chunks (raw bytes, witness count).
type ThreadSummary = (ThreadStart, Option<ThreadEnd>, Vec<(Vec<u8>, u64)>);

/// What a trace holds, in a form both the model and a parsed trace produce.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Summary {
    modules: Vec<Module>,
    databases: BTreeMap<ModuleId, (u32, Vec<u8>)>,
    threads: BTreeMap<ThreadId, ThreadSummary>,
    exits: Vec<ProcessExit>,
    notes: Vec<Note>,
    complete: bool,
}

/// One section the test asked the writer for.
#[derive(Clone, Debug)]
enum Wrote {
    Module(Module),
    Db(ModuleId, u32, Vec<u8>),
    Start(ThreadStart),
    Chunk(ThreadId, Vec<u8>, u64),
    End(ThreadId, EndReason),
    Exit(ProcessExit),
    Note(Note),
    Finish,
}

/// The model: the summary of the first sections written.
fn model(wrote: &[Wrote]) -> Summary {
    let mut s = Summary::default();
    for w in wrote {
        match w {
            Wrote::Module(m) => s.modules.push(m.clone()),
            Wrote::Db(m, v, raw) => {
                s.databases.insert(*m, (*v, raw.clone()));
            }
            Wrote::Start(t) => {
                s.threads.insert(t.thread, (*t, None, Vec::new()));
            }
            Wrote::Chunk(t, raw, w) => s.threads.get_mut(t).unwrap().2.push((raw.clone(), *w)),
            Wrote::End(t, reason) => {
                let th = s.threads.get_mut(t).unwrap();
                th.1 = Some(ThreadEnd {
                    thread: *t,
                    reason: *reason,
                    chunks: th.2.len() as u64,
                });
            }
            Wrote::Exit(e) => s.exits.push(*e),
            Wrote::Note(n) => s.notes.push(n.clone()),
            Wrote::Finish => s.complete = true,
        }
    }
    s
}

fn summary<B: AsRef<[u8]>>(t: &Trace<B>) -> Summary {
    Summary {
        modules: t.modules().to_vec(),
        databases: t
            .modules()
            .iter()
            .filter_map(|m| {
                let db = t.program_database(m.id)?;
                Some((m.id, (db.version(), db.decompress().unwrap())))
            })
            .collect(),
        threads: t
            .threads()
            .map(|th| {
                let chunks = t
                    .chunks(th.start.thread)
                    .map(|c| (c.decompress().unwrap(), c.meta.witnesses))
                    .collect();
                (th.start.thread, (th.start, th.end, chunks))
            })
            .collect(),
        exits: t.process_exits().to_vec(),
        notes: t.notes().to_vec(),
        complete: t.is_complete(),
    }
}

/// Writes `wrote` with a `TraceWriter`; returns the bytes and the offset at which
/// each section starts (plus the file length last).
fn write(wrote: &[Wrote], level: i32) -> (Vec<u8>, Vec<u64>) {
    let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
    w.set_level(level);
    let mut offsets = Vec::new();
    for item in wrote {
        offsets.push(w.offset());
        match item {
            Wrote::Module(m) => w.module(m).unwrap(),
            Wrote::Db(m, v, raw) => w.program_database(*m, *v, raw).unwrap(),
            Wrote::Start(t) => w.thread_start(t).unwrap(),
            Wrote::Chunk(t, raw, n) => {
                w.chunk(*t, raw, *n).unwrap();
            }
            Wrote::End(t, r) => w.thread_end(*t, *r).unwrap(),
            Wrote::Exit(e) => w.process_exit(e).unwrap(),
            Wrote::Note(n) => w.note(n.module, &n.text).unwrap(),
            Wrote::Finish => {
                let (bytes, _) = w.finish().unwrap();
                offsets.push(bytes.len() as u64);
                return (bytes, offsets);
            }
        }
    }
    offsets.push(w.offset());
    let bytes = w.get_ref().clone();
    (bytes, offsets)
}

/// A trace with every section kind.
fn every_kind() -> Vec<Wrote> {
    vec![
        Wrote::Module(module(0)),
        Wrote::Module(Module {
            build_id: Vec::new(),
            path: b"/tmp/\xffnot-utf8".to_vec(),
            flags: 0,
            ..module(1)
        }),
        Wrote::Db(ModuleId(0), 7, witness_bytes(3000, 9)),
        Wrote::Note(Note {
            module: Some(ModuleId(0)),
            text: "procedure `weird` left alone: unresolved indirect jump at 0x1234".into(),
        }),
        Wrote::Start(start(0, None, StartReason::Main)),
        Wrote::Chunk(ThreadId(0), witness_bytes(5000, 1), 4900),
        Wrote::Start(start(1, Some(0), StartReason::Thread)),
        Wrote::Chunk(ThreadId(1), witness_bytes(100, 2), 90),
        Wrote::Chunk(ThreadId(0), Vec::new(), 0),
        Wrote::Chunk(ThreadId(0), witness_bytes(7, 3), 7),
        Wrote::Start(start(2, Some(0), StartReason::Fork)),
        Wrote::End(ThreadId(1), EndReason::Exit),
        Wrote::End(ThreadId(2), EndReason::Killed),
        Wrote::Exit(ProcessExit {
            pid: 4002,
            status: ExitStatus::Signaled {
                signal: 9,
                core_dumped: false,
            },
        }),
        Wrote::Start(start(3, Some(0), StartReason::Exec)),
        Wrote::End(ThreadId(0), EndReason::Exec),
        Wrote::Chunk(ThreadId(3), witness_bytes(64, 4), 60),
        Wrote::End(ThreadId(3), EndReason::Exit),
        Wrote::Note(Note {
            module: None,
            text: String::new(),
        }),
        Wrote::Exit(ProcessExit {
            pid: 4000,
            status: ExitStatus::Exited(-3),
        }),
        Wrote::Finish,
    ]
}

#[test]
fn round_trip_every_kind() {
    let wrote = every_kind();
    let (bytes, _) = write(&wrote, DEFAULT_LEVEL);
    let t = Trace::parse(&bytes[..]).unwrap();
    assert_eq!(t.header(), &header());
    assert_eq!(summary(&t), model(&wrote));
    let end = t.require_complete().unwrap();
    assert_eq!(end.chunks, 5);
    assert_eq!(end.raw_bytes, 5000 + 100 + 7 + 64);
    assert_eq!(end.witnesses, 4900 + 90 + 7 + 60);
    assert_eq!((end.threads, end.modules, end.process_exits), (4, 2, 2));
    assert_eq!(end.sections, wrote.len() as u64 - 1);
    let stats = t.stats();
    assert_eq!(stats.file_bytes, bytes.len() as u64);
    assert_eq!(stats.threads.len(), 4);
    assert_eq!(stats.threads[0].chunks, 3);
    assert_eq!(stats.threads[0].raw_bytes, 5007);
    assert_eq!(stats.compressed_bytes, end.compressed_bytes);
    assert!(stats.compressed_bytes < stats.raw_bytes / 2, "{stats:?}");
    assert_eq!(stats.database_raw_bytes, 3000);
    assert!(stats.complete);
    let text = stats.to_string();
    let version = format!(
        "trace format 1.{} written by \"aetrace test\": complete",
        crate::header::VERSION_MINOR
    );
    for want in [
        version.as_str(),
        "build-id abcd0001 database 3000 ->",
        "/tmp/\u{fffd}not-utf8",
        "process 4002 killed by signal 9",
        "process 4000 exited with status -3",
        "witness streams: 5 chunks, 5171 raw bytes",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    let (torn, _) = write(&wrote[..6], 1);
    let torn = Trace::parse(&torn[..torn.len() - 3]).unwrap().stats();
    assert!(!torn.complete);
    assert_eq!(torn.threads[0].end, None);
    assert_eq!(torn.chunks, 0, "the torn chunk is not counted");
    assert!(torn
        .to_string()
        .contains("incomplete trace: no END section; the file ends in a torn section"));
    // Sections are 8-aligned and the chunk data is where the index says.
    for s in Sections::new(&bytes, HEADER_LEN) {
        assert_eq!(s.unwrap().offset % 8, 0);
    }
    let c = t.chunks(ThreadId(0)).next().unwrap();
    assert_eq!(c.meta.data.start % 8, 0);
    assert_eq!(
        zstd::bulk::decompress(c.data, 5000).unwrap(),
        witness_bytes(5000, 1)
    );
}

#[test]
fn open_mapped_file_while_it_grows() {
    let dir = std::env::temp_dir().join(format!("aetrace-format-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("grow.aet");
    let mut w = TraceWriter::create(&path, &header()).unwrap();
    w.module(&module(0)).unwrap();
    w.thread_start(&start(0, None, StartReason::Main)).unwrap();
    w.chunk(ThreadId(0), &witness_bytes(1000, 5), 1000).unwrap();
    // A reader in the middle of the run sees an exact, incomplete trace.
    let t = TraceFile::open(&path).unwrap();
    assert!(matches!(t.status(), Status::Incomplete { tear: None }));
    assert!(t
        .require_complete()
        .unwrap_err()
        .to_string()
        .contains("incomplete trace"));
    assert_eq!(
        t.chunks(ThreadId(0)).next().unwrap().decompress().unwrap(),
        witness_bytes(1000, 5)
    );
    w.thread_end(ThreadId(0), EndReason::Exit).unwrap();
    w.finish().unwrap();
    let t = TraceFile::open(&path).unwrap();
    assert!(t.is_complete());
    // Recording again over a trace someone has mapped leaves their bytes alone.
    let mut again = TraceWriter::create(&path, &header()).unwrap();
    again.note(None, "second run").unwrap();
    assert!(t.is_complete());
    assert_eq!(
        t.chunks(ThreadId(0)).next().unwrap().decompress().unwrap(),
        witness_bytes(1000, 5)
    );
    drop(again);
    assert_eq!(TraceFile::open(&path).unwrap().notes().len(), 1);
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(
        TraceFile::open(&path),
        Err(Error::NotATrace | Error::Truncated { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
    let e = TraceFile::open(dir.join("missing.aet")).err().unwrap();
    assert!(e.to_string().contains("missing.aet"), "{e}");
}

/// The recorder process dies by SIGKILL while appending: what it left is an exact,
/// incomplete trace. The test binary runs itself as the writer child.
#[test]
fn writer_killed_by_sigkill_leaves_exact_prefix() {
    const CHILD: &str = "AETRACE_FORMAT_TEST_WRITER";
    const CHUNKS: u32 = 20_000;
    let raw = |i: u32| witness_bytes(4000 + (i as usize % 7) * 1000, i);
    if let Ok(path) = std::env::var(CHILD) {
        let mut w = TraceWriter::create(&path, &header()).unwrap();
        w.thread_start(&start(0, None, StartReason::Main)).unwrap();
        for i in 0..CHUNKS {
            w.chunk(ThreadId(0), &raw(i), 0).unwrap();
        }
        return; // Never finishes: the parent kills it first, or the trace stays open.
    }
    let dir = std::env::temp_dir().join(format!("aetrace-format-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("killed.aet");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tests::writer_killed_by_sigkill_leaves_exact_prefix",
        ])
        .args(["--test-threads=1", "--quiet"])
        .env(CHILD, &path)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::fs::metadata(&path).map_or(0, |m| m.len()) < 64 << 10 {
        assert!(
            std::time::Instant::now() < deadline,
            "writer child made no progress"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let t = TraceFile::open(&path).unwrap();
    assert!(!t.is_complete());
    let chunks: Vec<Chunk<'_>> = t.chunks(ThreadId(0)).collect();
    assert!(
        !chunks.is_empty() && chunks.len() < CHUNKS as usize,
        "killed mid-run"
    );
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(c.decompress().unwrap(), raw(i as u32), "chunk {i}");
    }
    drop(chunks);
    drop(t);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Frames raw sections after a valid header (to build what the writer refuses to).
fn raw_trace(minor: u16, records: &[Record<'_>]) -> Vec<u8> {
    let mut h = header();
    h.minor = minor;
    let mut out = h.encode().to_vec();
    for r in records {
        let mut p = Vec::new();
        r.encode(&mut p).unwrap();
        section::frame(r.kind(), &p, &mut out).unwrap();
    }
    out
}

fn chunk_record(thread: u32, seq: u64, data: &[u8]) -> Record<'_> {
    Record::Chunk {
        header: ChunkHeader {
            thread: ThreadId(thread),
            codec: Codec::Stored,
            seq,
            raw_len: data.len() as u64,
            witnesses: 0,
        },
        data,
        data_at: section::CHUNK_FIXED_LEN,
    }
}

#[test]
fn chunk_gap_names_thread_and_missing_number() {
    let s = Record::ThreadStart(start(5, None, StartReason::Main));
    let bytes = raw_trace(
        0,
        &[
            s.clone(),
            chunk_record(5, 0, b"ab"),
            chunk_record(5, 2, b"c"),
        ],
    );
    match Trace::parse(&bytes[..]) {
        Err(Error::MissingChunk { thread, seq, .. }) => assert_eq!((thread, seq), (ThreadId(5), 1)),
        other => panic!("{:?}", other.err()),
    }
    let end = Record::ThreadEnd(ThreadEnd {
        thread: ThreadId(5),
        reason: EndReason::Exit,
        chunks: 3,
    });
    let bytes = raw_trace(0, &[s, chunk_record(5, 0, b"ab"), end]);
    let e = Trace::parse(&bytes[..]).err().unwrap();
    assert!(matches!(e, Error::MissingChunk { seq: 1, .. }), "{e}");
    assert!(
        e.to_string().contains("thread 5: chunk 1 is missing"),
        "{e}"
    );
}

#[test]
fn ordering_rules() {
    let cases: Vec<(Vec<Record<'_>>, &str)> = vec![
        (vec![chunk_record(0, 0, b"x")], "before its THREAD_START"),
        (
            vec![Record::ThreadStart(start(
                u32::MAX,
                None,
                StartReason::Main,
            ))],
            "reserved for none",
        ),
        (vec![Record::Module(module(u32::MAX))], "reserved for none"),
        (
            vec![Record::Module(module(1)), Record::Module(module(1))],
            "module 1 defined twice",
        ),
        (
            vec![Record::ThreadStart(start(1, Some(0), StartReason::Thread))],
            "unknown parent thread 0",
        ),
        (
            vec![Record::Note(Note {
                module: Some(ModuleId(3)),
                text: "x".into(),
            })],
            "unknown module 3",
        ),
        (
            vec![
                Record::ThreadStart(start(0, None, StartReason::Main)),
                Record::End(section::End::default()),
            ],
            "END before THREAD_END of thread 0",
        ),
        (
            vec![
                Record::End(section::End::default()),
                Record::Module(module(0)),
            ],
            "section after END",
        ),
        (
            vec![Record::End(section::End {
                chunks: 1,
                ..Default::default()
            })],
            "END totals",
        ),
    ];
    for (records, want) in cases {
        let e = Trace::parse(raw_trace(0, &records)).err().unwrap();
        assert!(e.to_string().contains(want), "{e} lacks {want}");
    }
}

#[test]
fn writer_refuses_what_the_reader_rejects() {
    let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
    let e = w.chunk(ThreadId(0), b"abc", 3).unwrap_err();
    assert!(matches!(e, Error::Misuse(_)), "{e}");
    w.thread_start(&start(0, None, StartReason::Main)).unwrap();
    let c = compress_chunk(ThreadId(0), 1, b"abc", 3, 1).unwrap();
    assert!(w
        .append_chunk(&c)
        .unwrap_err()
        .to_string()
        .contains("chunk 0 is missing"));
    let before = w.offset();
    assert!(matches!(
        w.note(Some(ModuleId(0)), "x"),
        Err(Error::Misuse(_))
    ));
    assert_eq!(w.offset(), before, "a refused section writes nothing");
    // Parallel compression, appended in order.
    for seq in 0..3 {
        let c = compress_chunk(ThreadId(0), seq, &witness_bytes(50, seq as u32), 50, 1).unwrap();
        w.append_chunk(&c).unwrap();
    }
    // A chunk the recorder chose to store uncompressed.
    let stored = EncodedChunk {
        thread: ThreadId(0),
        seq: 3,
        raw_len: 5,
        witnesses: 5,
        codec: Codec::Stored,
        data: b"\x01\x02\x01\x02\x01".to_vec(),
    };
    w.append_chunk(&stored).unwrap();
    let bad = EncodedChunk {
        seq: 4,
        raw_len: 6,
        ..stored.clone()
    };
    assert!(w
        .append_chunk(&bad)
        .unwrap_err()
        .to_string()
        .contains("stored uncompressed"));
    assert_eq!(w.open_threads(), vec![ThreadId(0)]);
    assert_eq!(
        (w.next_seq(ThreadId(0)), w.next_seq(ThreadId(9))),
        (Some(4), None)
    );
    assert!(w.get_ref().len() as u64 == w.offset());
    let t = Trace::parse(w.get_ref().as_slice()).unwrap();
    let chunks: Vec<Vec<u8>> = t
        .chunks(ThreadId(0))
        .map(|c| c.decompress().unwrap())
        .collect();
    assert_eq!(chunks.len(), 4);
    assert_eq!(chunks[2], witness_bytes(50, 2));
    assert_eq!(chunks[3], stored.data);
    let mut w2 = TraceWriter::new(Vec::new(), &header()).unwrap();
    w2.thread_start(&start(0, None, StartReason::Main)).unwrap();
    assert!(w2
        .finish()
        .unwrap_err()
        .to_string()
        .contains("END before THREAD_END"));
    assert!(Header::new("a creator name longer than 24 bytes", 0).is_err());
}

/// A writer whose output fails after `budget` bytes (a full disk).
struct FailAfter {
    written: Vec<u8>,
    budget: usize,
}

impl std::io::Write for FailAfter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.budget == 0 {
            return Err(std::io::Error::other("disk full"));
        }
        let n = buf.len().min(self.budget);
        self.budget -= n;
        self.written.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn failed_write_poisons_writer_and_leaves_a_readable_torn_trace() {
    let out = FailAfter {
        written: Vec::new(),
        budget: 300,
    };
    let mut w = TraceWriter::new(out, &header()).unwrap();
    w.module(&module(0)).unwrap();
    w.thread_start(&start(0, None, StartReason::Main)).unwrap();
    assert!(w.chunk(ThreadId(0), &witness_bytes(4000, 1), 10).is_err());
    assert!(matches!(w.note(None, "x"), Err(Error::Poisoned)));
    let bytes = &w.get_ref().written;
    let t = Trace::parse(&bytes[..]).unwrap();
    assert_eq!(t.modules().len(), 1);
    assert_eq!(t.chunks(ThreadId(0)).len(), 0);
    match t.status() {
        Status::Incomplete {
            tear: Some(Error::Truncated { offset, .. }),
        } => assert!(*offset > HEADER_LEN as u64),
        s => panic!("{s:?}"),
    }
}

#[test]
fn versions_and_unknown_kinds() {
    let unknown = |kind: u16| {
        let mut out = raw_trace(0, &[Record::Module(module(0))]);
        section::frame(SectionKind(kind), b"future payload", &mut out).unwrap();
        let mut p = Vec::new();
        Record::Module(module(1)).encode(&mut p).unwrap();
        section::frame(SectionKind::MODULE, &p, &mut out).unwrap();
        out
    };
    let t = Trace::parse(unknown(0x0042)).unwrap();
    assert_eq!(
        t.modules().len(),
        2,
        "a non-critical unknown kind is skipped"
    );
    let e = Trace::parse(unknown(0x8042)).err().unwrap();
    assert!(
        matches!(
            e,
            Error::UnsupportedSection {
                kind: SectionKind(0x8042),
                ..
            }
        ),
        "{e}"
    );
    // Another major is refused; a newer minor's extra trailing fields are skipped.
    let mut bytes = raw_trace(0, &[]);
    bytes[8] = 2;
    let e = Trace::parse(&bytes[..]).err().unwrap();
    assert!(
        matches!(e, Error::UnsupportedVersion { major: 2, minor: 0 }),
        "{e}"
    );
    let with_trailing = |minor| {
        let mut out = raw_trace(minor, &[]);
        let mut p = Vec::new();
        Record::ThreadStart(start(0, None, StartReason::Main))
            .encode(&mut p)
            .unwrap();
        p.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        section::frame(SectionKind::THREAD_START, &p, &mut out).unwrap();
        out
    };
    let newer = crate::header::VERSION_MINOR + 1;
    assert_eq!(
        Trace::parse(with_trailing(newer)).unwrap().threads().len(),
        1
    );
    let e = Trace::parse(with_trailing(crate::header::VERSION_MINOR))
        .err()
        .unwrap();
    assert!(e.to_string().contains("trailing"), "{e}");
    assert!(matches!(
        Trace::parse(&b"ELF\x7f..."[..]),
        Err(Error::NotATrace)
    ));
    assert!(matches!(
        Trace::parse(&b"AETR"[..]),
        Err(Error::Truncated { offset: 0, .. })
    ));
}

#[test]
fn chunk_contents_are_checked_on_decompression() {
    let good = zstd::bulk::compress(b"hello hello hello", 3).unwrap();
    let bad_len = Record::Chunk {
        header: ChunkHeader {
            thread: ThreadId(0),
            codec: Codec::Zstd,
            seq: 0,
            raw_len: 16,
            witnesses: 0,
        },
        data: &good,
        data_at: section::CHUNK_FIXED_LEN,
    };
    let junk = [0x28u8, 0xb5, 0x2f, 0xfd, 1, 2, 3];
    let mut bad_frame = bad_len.clone();
    if let Record::Chunk { header, data, .. } = &mut bad_frame {
        header.seq = 1;
        *data = &junk;
    }
    let bytes = raw_trace(
        0,
        &[
            Record::ThreadStart(start(0, None, StartReason::Main)),
            bad_len,
            bad_frame,
        ],
    );
    let t = Trace::parse(&bytes[..]).unwrap();
    let mut chunks = t.chunks(ThreadId(0));
    let e = chunks.next().unwrap().decompress().unwrap_err();
    assert!(e.to_string().contains("thread 0 chunk 0"), "{e}");
    let e = chunks.next().unwrap().decompress().unwrap_err();
    assert!(e.to_string().contains("thread 0 chunk 1: zstd"), "{e}");
    let huge = Record::Chunk {
        header: ChunkHeader {
            thread: ThreadId(0),
            codec: Codec::Zstd,
            seq: 0,
            raw_len: 1 << 40,
            witnesses: 0,
        },
        data: &good,
        data_at: section::CHUNK_FIXED_LEN,
    };
    let bytes = raw_trace(
        0,
        &[Record::ThreadStart(start(0, None, StartReason::Main)), huge],
    );
    assert!(Trace::parse(&bytes[..])
        .err()
        .unwrap()
        .to_string()
        .contains("limit"));
}

#[test]
fn zero_filled_tail_is_a_tear() {
    let (mut bytes, _) = write(&every_kind()[..6], 1);
    let len = bytes.len();
    bytes.resize(len + 4096, 0);
    let t = Trace::parse(&bytes[..]).unwrap();
    assert!(matches!(
        t.status(),
        Status::Incomplete {
            tear: Some(Error::Truncated { .. })
        }
    ));
    assert_eq!(summary(&t), model(&every_kind()[..6]));
}

#[test]
fn every_byte_of_a_trace_is_protected() {
    let wrote = every_kind();
    let (bytes, offsets) = write(&wrote, 1);
    for at in 0..bytes.len() {
        for xor in [0x01, 0x80, 0xff] {
            let mut bad = bytes.clone();
            bad[at] ^= xor;
            if let Ok(t) = Trace::parse(&bad[..]) {
                // Only damage to the last section can leave a (torn) readable trace.
                let j = section_at(&offsets, at as u64);
                assert_eq!(j, wrote.len() - 1, "damage at byte {at} unnoticed");
                assert!(matches!(t.status(), Status::Incomplete { tear: Some(_) }));
                assert_eq!(summary(&t), model(&wrote[..j]));
            }
        }
    }
}

#[test]
fn trace_is_sync_for_parallel_regeneration() {
    fn sync<T: Sync + Send>() {}
    sync::<TraceFile>();
    sync::<Trace<Vec<u8>>>();
}

// ---- properties over random traces ----

/// Random operations; [`build`] turns them into a valid sequence of sections.
fn ops() -> impl Strategy<Value = (Vec<(u8, u8, u16)>, bool)> {
    (
        prop::collection::vec((0u8..8, any::<u8>(), 0u16..300), 0..24),
        any::<bool>(),
    )
}

fn build(ops: &[(u8, u8, u16)], finish: bool) -> Vec<Wrote> {
    let mut wrote = Vec::new();
    let (mut modules, mut dbs, mut open, mut threads) = (0u32, 0u32, Vec::new(), 0u32);
    for &(op, pick, n) in ops {
        match op {
            0 => {
                wrote.push(Wrote::Module(module(modules)));
                modules += 1;
            }
            1 if dbs < modules => {
                wrote.push(Wrote::Db(
                    ModuleId(dbs),
                    u32::from(pick),
                    witness_bytes(n.into(), 7),
                ));
                dbs += 1;
            }
            2 => {
                let parent = (threads > 0).then(|| u32::from(pick) % threads);
                let reason = if parent.is_none() {
                    StartReason::Main
                } else {
                    StartReason::Thread
                };
                wrote.push(Wrote::Start(start(threads, parent, reason)));
                open.push(threads);
                threads += 1;
            }
            3 | 4 if !open.is_empty() => {
                let t = open[usize::from(pick) % open.len()];
                let raw = witness_bytes(n.into(), u32::from(pick));
                let w = u64::from(pick).min(raw.len() as u64);
                wrote.push(Wrote::Chunk(ThreadId(t), raw, w));
            }
            5 if !open.is_empty() => {
                let t = open.swap_remove(usize::from(pick) % open.len());
                wrote.push(Wrote::End(ThreadId(t), EndReason::Exit));
            }
            6 => wrote.push(Wrote::Exit(ProcessExit {
                pid: u32::from(n),
                status: ExitStatus::Exited(i32::from(pick)),
            })),
            7 => wrote.push(Wrote::Note(Note {
                module: None,
                text: "é".repeat(usize::from(pick % 5)),
            })),
            _ => {}
        }
    }
    if finish {
        for t in open {
            wrote.push(Wrote::End(ThreadId(t), EndReason::Killed));
        }
        wrote.push(Wrote::Finish);
    }
    wrote
}

/// Index of the section containing byte `at` (`offsets` ends with the file length).
fn section_at(offsets: &[u64], at: u64) -> usize {
    offsets.iter().rposition(|&o| o <= at).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn any_valid_trace_round_trips((ops, finish) in ops()) {
        let wrote = build(&ops, finish);
        let (bytes, _) = write(&wrote, 1);
        let t = Trace::parse(&bytes[..]).unwrap();
        prop_assert_eq!(summary(&t), model(&wrote));
        let clean_incomplete = matches!(t.status(), Status::Incomplete { tear: None });
        prop_assert_eq!(clean_incomplete, !finish);
    }

    /// Any truncation gives the exact prefix of whole sections, flagged incomplete
    /// (with the tear reported when the cut is inside a section), or a clean error
    /// when the cut is inside the file header.
    #[test]
    fn truncation_gives_exact_prefix((ops, finish) in ops(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 8)) {
        let wrote = build(&ops, finish);
        let (bytes, offsets) = write(&wrote, 1);
        for cut in cuts {
            let cut = cut.index(bytes.len());
            match Trace::parse(&bytes[..cut]) {
                Err(e) => {
                    prop_assert!(cut < HEADER_LEN);
                    prop_assert!(matches!(e, Error::Truncated { offset: 0, .. }), "{}", e);
                }
                Ok(t) => {
                    let j = section_at(&offsets, cut as u64);
                    prop_assert_eq!(summary(&t), model(&wrote[..j]));
                    match t.status() {
                        Status::Incomplete { tear: None } => prop_assert_eq!(offsets[j], cut as u64),
                        Status::Incomplete { tear: Some(Error::Truncated { offset, .. }) } => {
                            prop_assert_eq!(*offset, offsets[j]);
                        }
                        s => prop_assert!(false, "unexpected status {:?}", s),
                    }
                }
            }
        }
    }

    /// Any single damaged byte is caught: an error, or (damage in the last section)
    /// the exact prefix before it flagged as torn. Never a complete trace, never a
    /// wrong record.
    #[test]
    fn any_damaged_byte_is_detected((ops, finish) in ops(), hits in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 8)) {
        let wrote = build(&ops, finish);
        let (bytes, offsets) = write(&wrote, 1);
        for (at, xor) in hits {
            let at = at.index(bytes.len());
            let mut bad = bytes.clone();
            bad[at] ^= xor;
            if let Ok(t) = Trace::parse(&bad[..]) {
                let j = section_at(&offsets, at as u64);
                prop_assert!(matches!(t.status(), Status::Incomplete { tear: Some(_) }), "damage at {} unnoticed", at);
                prop_assert_eq!(summary(&t), model(&wrote[..j]));
            }
        }
    }

    /// Random bytes, with and without a valid header in front: never a panic.
    #[test]
    fn random_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..400), with_header in any::<bool>()) {
        let mut bytes = if with_header { header().encode().to_vec() } else { Vec::new() };
        bytes.extend_from_slice(&body);
        if let Ok(t) = Trace::parse(&bytes[..]) {
            let _ = summary_lenient(&t);
        }
    }

    /// Sections with random payloads and *valid* checksums, so the payload decoders
    /// and the index rules (not the CRC) face the garbage: never a panic.
    #[test]
    fn resealed_garbage_never_panics(sections in prop::collection::vec((1u16..10, prop::collection::vec(any::<u8>(), 0..80)), 0..12)) {
        let mut bytes = header().encode().to_vec();
        for (kind, payload) in &sections {
            section::frame(SectionKind(*kind), payload, &mut bytes).unwrap();
        }
        if let Ok(t) = Trace::parse(&bytes[..]) {
            let _ = summary_lenient(&t);
            let _ = t.stats();
        }
    }

    /// Valid framing around mutated real payloads (fields near their valid values).
    #[test]
    fn resealed_mutations_never_panic((ops, finish) in ops(), hits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let wrote = build(&ops, finish);
        let (bytes, _) = write(&wrote, 1);
        let mut sections: Vec<(SectionKind, Vec<u8>)> = Sections::new(&bytes, HEADER_LEN)
            .map(|s| s.map(|s| (s.kind, s.payload.to_vec())).unwrap())
            .collect();
        if sections.is_empty() {
            return Ok(());
        }
        for (which, value) in hits {
            let s = which.index(sections.len());
            let p = &mut sections[s].1;
            if !p.is_empty() {
                let i = usize::from(value) % p.len();
                p[i] = value;
            }
        }
        let mut out = header().encode().to_vec();
        for (kind, p) in &sections {
            section::frame(*kind, p, &mut out).unwrap();
        }
        if let Ok(t) = Trace::parse(&out[..]) {
            let _ = summary_lenient(&t);
        }
    }
}

/// Touches everything a consumer would, tolerating decompression errors.
fn summary_lenient<B: AsRef<[u8]>>(t: &Trace<B>) -> usize {
    let mut n = 0;
    for th in t.threads() {
        for c in t.chunks(th.start.thread) {
            n += c.decompress().map_or(0, |v| v.len());
        }
    }
    for m in t.modules() {
        if let Some(db) = t.program_database(m.id) {
            n += db.decompress().map_or(0, |v| v.len());
        }
    }
    n
}

#[test]
fn command_round_trip_and_rules() {
    let cmd = Command {
        program: b"/usr/bin/gzip".to_vec(),
        argv: vec![b"gzip".to_vec(), b"-c".to_vec(), Vec::new()],
        env: vec![b"LANG=C".to_vec(), b"EMPTY=".to_vec()],
        cwd: b"/tmp/\xffdir".to_vec(),
        stdin: Stdin::File {
            path: b"/tmp/in".to_vec(),
            size: 20_000,
        },
    };
    let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
    w.command(&cmd).unwrap();
    assert!(w.command(&cmd).is_err(), "a second COMMAND is refused");
    let (bytes, _) = w.finish().unwrap();
    let t = Trace::parse(&bytes[..]).unwrap();
    assert_eq!(t.command(), Some(&cmd));
    for stdin in [Stdin::Null, Stdin::Other] {
        let c = Command {
            stdin: stdin.clone(),
            ..cmd.clone()
        };
        let t = Trace::parse(raw_trace(0, &[Record::Command(c)])).unwrap();
        assert_eq!(t.command().map(|c| &c.stdin), Some(&stdin));
    }
    // A count larger than the payload is corruption, not an allocation.
    let mut p = Vec::new();
    Record::Command(cmd.clone()).encode(&mut p).unwrap();
    // Fixed 16 bytes, then program, cwd and stdin path, each after its length.
    let argc_at = 16 + (4 + 13) + (4 + cmd.cwd.len()) + (4 + 7);
    assert_eq!(p[argc_at..argc_at + 4], 3u32.to_le_bytes());
    p[argc_at..argc_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut out = raw_trace(0, &[]);
    section::frame(SectionKind::COMMAND, &p, &mut out).unwrap();
    let e = Trace::parse(out).err().unwrap();
    assert!(e.to_string().contains("payload too short"), "{e}");
}

/// A thread's stream past 4 GiB (issue 25, limits): five chunks of 2^30
/// raw bytes each (zeros, a few kB once compressed, so the test writes no
/// gigabytes) are written, indexed and totalled in u64 without wrapping:
/// the thread's and the END's raw bytes are 5 GiB, and the last chunk's
/// frame decodes to exactly its raw length (streamed, not held). The
/// regenerator's stream offsets are u64 too (`regen/src/stream.rs`).
#[test]
fn a_stream_larger_than_4_gib_is_indexed_without_wrapping() {
    use std::io::Write;
    const RAW: u64 = 1 << 30;
    let mut enc = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..RAW >> 20 {
        enc.write_all(&zeros).unwrap();
    }
    let data = enc.finish().unwrap();
    let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
    w.module(&module(0)).unwrap();
    w.thread_start(&start(0, None, StartReason::Main)).unwrap();
    for seq in 0..5 {
        w.append_chunk(&EncodedChunk {
            thread: ThreadId(0),
            seq,
            raw_len: RAW,
            witnesses: RAW,
            codec: Codec::Zstd,
            data: data.clone(),
        })
        .unwrap();
    }
    w.thread_end(ThreadId(0), EndReason::Exit).unwrap();
    let (bytes, end) = w.finish().unwrap();
    assert_eq!(end.raw_bytes, 5 * RAW);
    let t = Trace::parse(bytes).unwrap();
    assert_eq!(t.require_complete().unwrap().raw_bytes, 5 * RAW);
    assert_eq!(t.stats().raw_bytes, 5 * RAW);
    // The five share their bytes: one decoded stands for all.
    let c = t.chunks(ThreadId(0)).nth(4).unwrap();
    let mut dec = zstd::stream::Decoder::new(c.data).unwrap();
    let n = std::io::copy(&mut dec, &mut std::io::sink()).unwrap();
    assert_eq!((c.meta.seq, n), (4, c.meta.raw_len));
}

/// A chunk in codec `zstd+values` is refused unless the header announces
/// the codec: a reader that predates it must have refused the header.
#[test]
fn value_codec_needs_its_header_flag() {
    let trace = |flags: u32| {
        let mut h = header();
        h.incompat_flags = flags;
        let mut w = TraceWriter::new(Vec::new(), &h).unwrap();
        w.thread_start(&start(0, None, StartReason::Main)).unwrap();
        let mut c = compress_chunk(ThreadId(0), 0, b"abc", 3, 1).unwrap();
        c.codec = Codec::ZstdValues;
        w.append_chunk(&c).unwrap();
        w.thread_end(ThreadId(0), section::EndReason::Exit).unwrap();
        w.finish().unwrap().0
    };
    let e = Trace::parse(trace(0)).err().expect("an unannounced codec");
    assert!(e.to_string().contains("does not announce"), "{e}");
    assert!(Trace::parse(trace(crate::header::INCOMPAT_VALUE_CODEC)).is_ok());
}

/// IMAGE (1.12): a module tied to the stream an exec started, sharing
/// module 0's database, reads back with its thread and that database;
/// an IMAGE naming what is not there, twice, or sharing a database the
/// module has of its own is corruption.
#[test]
fn image_sections_tie_a_module_to_its_stream() {
    let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
    w.module(&module(0)).unwrap();
    w.program_database(ModuleId(0), 1, b"database").unwrap();
    w.thread_start(&start(0, None, StartReason::Main)).unwrap();
    w.thread_start(&start(1, Some(0), StartReason::Exec))
        .unwrap();
    w.module(&module(1)).unwrap();
    // A tag other than 0 reads back (since 1.14, a library's).
    let image = Image {
        module: ModuleId(1),
        thread: ThreadId(1),
        database: Some(ModuleId(0)),
        tag: 7,
    };
    w.image(&image).unwrap();
    for t in 0..2 {
        w.thread_end(ThreadId(t), EndReason::Exit).unwrap();
    }
    let (bytes, _) = w.finish().unwrap();
    let t = Trace::parse(bytes).unwrap();
    assert_eq!(t.images(), [image]);
    assert_eq!(t.image_thread(ModuleId(1)), Some(ThreadId(1)));
    assert_eq!(t.image_thread(ModuleId(0)), None);
    let db = |m| {
        t.program_database(ModuleId(m))
            .unwrap()
            .decompress()
            .unwrap()
    };
    assert_eq!(db(1), db(0));
    let m1 = &t.stats().modules[1];
    assert_eq!(
        (m1.database_of, m1.image_thread),
        (Some(ModuleId(0)), Some(ThreadId(1)))
    );

    let img = |module, thread, database: Option<u32>| {
        Record::Image(Image {
            module: ModuleId(module),
            thread: ThreadId(thread),
            database: database.map(ModuleId),
            tag: 0,
        })
    };
    let main = || Record::ThreadStart(start(0, None, StartReason::Main));
    let cases: Vec<(Vec<Record<'_>>, &str)> = vec![
        (vec![main(), img(0, 0, None)], "IMAGE: no module 0"),
        (
            vec![Record::Module(module(0)), img(0, 0, None)],
            "IMAGE: no thread 0",
        ),
        (
            vec![
                Record::Module(module(0)),
                main(),
                img(0, 0, None),
                img(0, 0, None),
            ],
            "module 0 given twice",
        ),
        (
            vec![Record::Module(module(0)), main(), img(0, 0, Some(0))],
            "cannot share the database of module 0",
        ),
    ];
    for (records, want) in cases {
        let e = Trace::parse(raw_trace(12, &records)).err().unwrap();
        assert!(e.to_string().contains(want), "{e} lacks {want}");
    }
}
