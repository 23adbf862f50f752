//! The state index: the regenerator's states at intervals of each
//! thread's stream, kept in a file beside the trace (`TRACE.idx`), so that
//! `-j N` expands pieces of one stream in parallel without the serial
//! fast pass that finds where pieces start (`docs/regen.md` section 4,
//! "The state index"; the file layout is in `docs/format.md`, "The state
//! index file").
//!
//! An entry is a machine's state at a pause point (`machine::snapshot`):
//! the first read point outside a signal handler at or past a multiple of
//! the interval from the previous entry. Any subset of the entries cuts a
//! stream into pieces whose expansions join exactly: a piece started from
//! an entry pauses at the next entry it was given, and checks that its own
//! state there equals that entry's, so an index that does not describe
//! the trace stops the regeneration with an error after exact output, it
//! never changes a byte.
//!
//! An entry also counts the output before it (instructions, `block`
//! bytes), so that `-j N` writes each piece at its offset in a file; the
//! writer checks that pieces join, so wrong counts stop it the same way.
//!
//! Invariants: the file is keyed by the trace's fingerprint (its length
//! and the CRC of its file and section headers) and checked by a CRC-32 of
//! all its bytes; entries of a thread are in increasing stream order.

use crate::error::{Error, Result};
use aetrace_format::{Fingerprint, Trace};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// First bytes of an index file.
pub const MAGIC: [u8; 8] = *b"AETRIDX\0";
/// Version of the file layout and of the machine state it holds (block,
/// procedure and module numbers as `compile` assigns them): any change of
/// either makes older files stale (2: states no longer hold how many
/// chunks were read; 3: setjmp bindings by call block and `rsp`, no
/// longjmp in progress; 4: each entry's instruction count and `block`
/// output bytes, so pieces are written at their offsets; 5: each entry's
/// data walk state, for `regen --data -j N`).
pub const VERSION: u16 = 5;
/// Stream bytes between entries unless asked otherwise: small enough that
/// pieces of any size `-j` chooses start close to where it wants them.
pub const DEFAULT_INTERVAL: u64 = 256 << 10;

/// Bytes before the threads.
const HEADER_LEN: usize = 40;
/// An entry's instruction count when it was not counted.
const UNCOUNTED: u64 = u64::MAX;

/// One entry: a machine state at stream offset `offset` (its first 8 bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Stream offset of the pause point (the witness read next).
    pub offset: u64,
    /// Instructions the thread executed before it, in every module of its
    /// process image (`None`: not counted, as by the output walk of a
    /// format other than `bin`).
    pub instructions: Option<u64>,
    /// Bytes of the thread's `--format block` output (run-time addresses)
    /// before it, its comment lines included (`None`: not counted, as by
    /// the output walk of another format).
    pub block_bytes: Option<u64>,
    /// The encoded state (`Machine::snapshot`).
    pub state: Vec<u8>,
    /// The data walk's state there (`aetrace regen --data`), opaque to
    /// the regenerator; empty when not kept (a control-only trace, or a
    /// point where the data walk keeps none).
    pub data: Vec<u8>,
}

/// The states of every thread of one trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateIndex {
    /// The trace it was built from.
    pub fingerprint: Fingerprint,
    /// Stream bytes asked between entries.
    pub interval: u64,
    /// Per thread id, its entries in stream order.
    pub threads: BTreeMap<u32, Vec<Entry>>,
}

impl StateIndex {
    /// Runs every thread of `trace` once (counting, with summaries) and
    /// keeps its state every `interval` stream bytes. A thread whose
    /// regeneration fails is indexed up to there (its regeneration
    /// reports the error). Beside it, a walk writing `--format block`
    /// (to nowhere) gives each entry its output bytes before it, when the
    /// whole trace regenerates.
    pub fn build<B: AsRef<[u8]> + Sync>(trace: &Trace<B>, interval: u64) -> Result<StateIndex> {
        if interval == 0 {
            return Err(Error::Usage(
                "the index interval must be at least 1 byte".into(),
            ));
        }
        let opts = crate::Options {
            count: true,
            jobs: 0,
            ..crate::Options::default()
        };
        let block = crate::Options {
            format: crate::Format::Block,
            ..crate::Options::default()
        };
        let (counted, walked) = rayon::join(
            || crate::output::index_states(trace, &opts, interval),
            || {
                let sink = &mut std::io::sink();
                let ahead = crate::output::AHEAD_BYTES;
                crate::output::regen_trace_ahead(trace, &block, sink, ahead, Some(interval), None)
            },
        );
        let mut threads = counted?;
        if let Ok((_, Some(walked))) = walked {
            add_block_bytes(&mut threads, &walked.threads);
        }
        Ok(StateIndex {
            fingerprint: trace.fingerprint(),
            interval,
            threads,
        })
    }

    /// Where the index of the trace at `trace` is kept: `TRACE.idx`.
    pub fn sidecar(trace: &Path) -> PathBuf {
        let mut p = trace.as_os_str().to_owned();
        p.push(".idx");
        PathBuf::from(p)
    }

    /// The entries of thread `thread` (none when it has none).
    pub fn entries(&self, thread: u32) -> &[Entry] {
        self.threads.get(&thread).map_or(&[], Vec::as_slice)
    }

    /// Whether it was built from `trace`'s bytes.
    pub fn check<B: AsRef<[u8]>>(&self, trace: &Trace<B>) -> Result<()> {
        let t = trace.fingerprint();
        if t != self.fingerprint {
            return Err(Error::Index(format!(
                "built for another trace (length {}, header CRC {:#010x}; this one: {}, {:#010x})",
                self.fingerprint.len, self.fingerprint.crc, t.len, t.crc
            )));
        }
        Ok(())
    }

    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + 64);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&(self.threads.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.fingerprint.len.to_le_bytes());
        out.extend_from_slice(&self.fingerprint.crc.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.interval.to_le_bytes());
        for (&t, entries) in &self.threads {
            out.extend_from_slice(&t.to_le_bytes());
            out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
            for e in entries {
                for n in [e.instructions, e.block_bytes] {
                    out.extend_from_slice(&n.unwrap_or(UNCOUNTED).to_le_bytes());
                }
                out.extend_from_slice(&(e.state.len() as u32).to_le_bytes());
                out.extend_from_slice(&e.state);
                out.extend_from_slice(&(e.data.len() as u32).to_le_bytes());
                out.extend_from_slice(&e.data);
            }
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads an index file's bytes, checking its CRC, version and layout.
    pub fn decode(bytes: &[u8]) -> Result<StateIndex> {
        let bad = |what: &str| Err(Error::Index(what.to_owned()));
        if bytes.get(..8) != Some(&MAGIC[..]) {
            return bad("not a state index file (bad magic)");
        }
        let Some((body, crc)) = bytes.len().checked_sub(4).map(|n| bytes.split_at(n)) else {
            return bad("cut short");
        };
        if body.len() < HEADER_LEN {
            return bad("cut short");
        }
        let mut r = Fields(&body[8..]);
        let version = r.u16();
        if version != Some(VERSION) {
            return Err(Error::Index(format!(
                "version {} (this aetrace reads version {VERSION}); rebuild it",
                version.unwrap_or(0)
            )));
        }
        if crc32fast::hash(body).to_le_bytes() != crc {
            return bad("bad checksum (the file is damaged)");
        }
        Self::decode_body(&mut r).ok_or_else(|| Error::Index("malformed (checksum correct)".into()))
    }

    fn decode_body(r: &mut Fields<'_>) -> Option<StateIndex> {
        r.u16()?;
        let nthreads = r.u32()?;
        let fingerprint = Fingerprint {
            len: r.u64()?,
            crc: r.u32()?,
        };
        r.u32()?;
        let interval = r.u64()?;
        let mut threads = BTreeMap::new();
        for _ in 0..nthreads {
            let t = r.u32()?;
            let n = r.u32()? as usize;
            let mut entries: Vec<Entry> = Vec::with_capacity(n.min(r.0.len() / 28));
            for _ in 0..n {
                let instructions = Some(r.u64()?).filter(|&n| n != UNCOUNTED);
                let block_bytes = Some(r.u64()?).filter(|&n| n != UNCOUNTED);
                let len = r.u32()? as usize;
                let state = r.bytes(len)?.to_vec();
                let len = r.u32()? as usize;
                let data = r.bytes(len)?.to_vec();
                let offset = u64::from_le_bytes(state.get(..8)?.try_into().ok()?);
                // Strictly increasing: each entry is a later pause point.
                if entries.last().is_some_and(|p| p.offset >= offset) {
                    return None;
                }
                entries.push(Entry {
                    offset,
                    instructions,
                    block_bytes,
                    state,
                    data,
                });
            }
            if threads.insert(t, entries).is_some() {
                return None;
            }
        }
        r.0.is_empty().then_some(StateIndex {
            fingerprint,
            interval,
            threads,
        })
    }

    /// The index at `path` if there is one, checked against `trace`:
    /// `Ok(None)` when there is no such file, an error when it is
    /// unreadable, damaged or another trace's.
    pub fn load<B: AsRef<[u8]>>(path: &Path, trace: &Trace<B>) -> Result<Option<StateIndex>> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::Index(format!("{}: {e}", path.display()))),
        };
        let index = Self::decode(&bytes)?;
        index.check(trace)?;
        Ok(Some(index))
    }

    /// Writes the index to `path` (under a temporary name, then renamed:
    /// a reader never sees half a file).
    pub fn save(&self, path: &Path) -> Result<()> {
        let io = |e: aetrace_format::atomic::Error| Error::Output(e.source);
        let mut f = aetrace_format::atomic::AtomicFile::create(path, None).map_err(io)?;
        std::io::Write::write_all(&mut f, &self.encode()).map_err(Error::Output)?;
        f.commit().map_err(io)
    }
}

/// Gives `threads`' entries the `block` output bytes of the same entries
/// kept by a `block` output walk (the same pause points: both walks
/// visit the same ones).
fn add_block_bytes(threads: &mut BTreeMap<u32, Vec<Entry>>, walked: &BTreeMap<u32, Vec<Entry>>) {
    for (t, entries) in threads {
        let Some(w) = walked.get(t).filter(|w| w.len() == entries.len()) else {
            continue;
        };
        for (e, w) in entries.iter_mut().zip(w) {
            debug_assert!(e.offset == w.offset && e.state == w.state);
            e.block_bytes = w.block_bytes;
        }
    }
}

/// Little-endian fields from the front of a byte slice; `None` past its
/// end (also reads machine states, `machine::snapshot`).
pub(crate) struct Fields<'b>(pub(crate) &'b [u8]);

impl<'b> Fields<'b> {
    pub(crate) fn bytes(&mut self, n: usize) -> Option<&'b [u8]> {
        let head = self.0.get(..n)?;
        self.0 = &self.0[n..];
        Some(head)
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        Some(self.bytes(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.bytes(2)?.try_into().ok()?))
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }
}
