//! The binary address-trace format (`bin`): what `aetrace regen --format bin`
//! writes and `cachesim` reads.
//!
//! Layout (all integers little-endian; `docs/addrtrace-format.md` gives it
//! byte by byte):
//!
//! ```text
//! offset size field
//!      0    8 magic   b"AETADDR\0"
//!      8    2 version 1
//!     10    2 flags   0 (no flag is defined; a reader refuses unknown flags)
//!     12    4 reserved, 0
//!     16    8 count   number of records, or u64::MAX = unknown (read to end)
//!     24  8*n records
//! ```
//!
//! A record is one `u64`: bits 0..=55 are the byte address, bits 56..=57 the
//! kind (0 read, 1 write, 2 instruction fetch, 3 misc: Dinero IV's access-type
//! numbering) and bits 58..=63 the size minus one (sizes 1..=64).  x86-64
//! user-space addresses are below 2^47 (4-level paging) or 2^56 (5-level
//! paging, LA57), so every user address fits; a writer refuses a larger
//! address ([`Error::AddressTooLarge`]) rather than truncating it.
//!
//! Invariants:
//! - Decoding a record cannot fail: every bit pattern is a valid record, so
//!   once the header and the length are checked, reading is a plain loop over
//!   `u64`s with no per-record error path.
//! - A reader never panics on any input bytes; every defect is an
//!   [`Error`].
//! - A known `count` is checked against the records actually present (too
//!   few or too many is [`Error::AddrCountMismatch`]); with the unknown
//!   count a trailing partial record is [`Error::AddrTraceTruncated`].

use std::io::{self, BufWriter, Read, Write};

use crate::{Error, Result};

/// The eight bytes every `bin` address trace starts with.
pub const MAGIC: [u8; 8] = *b"AETADDR\0";
/// The only version this code reads and writes.
pub const VERSION: u16 = 1;
/// Header length in bytes.
pub const HEADER_LEN: usize = 24;
/// Record length in bytes.
pub const RECORD_LEN: usize = 8;
/// The `count` value meaning "unknown: read to the end of the stream".
pub const COUNT_UNKNOWN: u64 = u64::MAX;
/// Addresses must be below this bound (56 address bits).
pub const ADDRESS_LIMIT: u64 = 1 << 56;
/// Largest size one record can carry.
pub const MAX_SIZE: u32 = 64;

const ADDR_MASK: u64 = ADDRESS_LIMIT - 1;

/// Access kind, numbered as Dinero IV numbers its access types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AccessKind {
    /// A data read (Dinero type 0).
    Read = 0,
    /// A data write (Dinero type 1).
    Write = 1,
    /// An instruction fetch (Dinero type 2).
    Instr = 2,
    /// Any other reference (Dinero type 3: misc).
    Misc = 3,
}

impl AccessKind {
    /// All kinds, indexed by their number.
    pub const ALL: [AccessKind; 4] = [Self::Read, Self::Write, Self::Instr, Self::Misc];

    /// The kind with number `n & 3`.
    #[inline]
    pub fn from_bits(n: u64) -> Self {
        Self::ALL[(n & 3) as usize]
    }
}

/// One memory reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrRecord {
    /// What kind of reference it is.
    pub kind: AccessKind,
    /// The referenced virtual address (below 2^56).
    pub addr: u64,
    /// Bytes referenced, 1..=64.
    pub size: u8,
}

impl AddrRecord {
    /// Decodes one record word; total (every word is a valid record).
    #[inline]
    pub fn decode(word: u64) -> Self {
        AddrRecord {
            kind: AccessKind::from_bits(word >> 56),
            addr: word & ADDR_MASK,
            size: ((word >> 58) as u8) + 1,
        }
    }

    /// Encodes the record, refusing what the format cannot hold.
    pub fn encode(kind: AccessKind, addr: u64, size: u32) -> Result<u64> {
        if addr >= ADDRESS_LIMIT {
            return Err(Error::AddressTooLarge(addr));
        }
        if size == 0 || size > MAX_SIZE {
            return Err(Error::SizeOutOfRange(size));
        }
        Ok(addr | (kind as u64) << 56 | u64::from(size - 1) << 58)
    }
}

/// A parsed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// `None` when the writer did not know the count.
    pub count: Option<u64>,
}

impl Header {
    /// Checks that a body of `len` bytes holds exactly the records the
    /// header declares; returns their number.
    pub fn check_body(&self, len: u64) -> Result<u64> {
        let whole = len / RECORD_LEN as u64;
        if len % RECORD_LEN as u64 != 0 {
            return Err(Error::AddrTraceTruncated(format!(
                "record {whole} has {} of its {RECORD_LEN} bytes",
                len % RECORD_LEN as u64
            )));
        }
        match self.count {
            Some(declared) if declared != whole => Err(Error::AddrCountMismatch {
                declared,
                actual: whole,
            }),
            _ => Ok(whole),
        }
    }

    /// Parses and checks the 24 header bytes.
    pub fn parse(bytes: &[u8]) -> Result<Header> {
        let Some(h) = bytes.get(..HEADER_LEN) else {
            let mut got = [0u8; 8];
            let n = bytes.len().min(8);
            got[..n].copy_from_slice(&bytes[..n]);
            if got[..n] != MAGIC[..n] {
                return Err(Error::NotAnAddrTrace(got));
            }
            return Err(Error::AddrTraceTruncated(format!(
                "header needs {HEADER_LEN} bytes, stream has {}",
                bytes.len()
            )));
        };
        let magic: [u8; 8] = h[0..8].try_into().expect("8-byte slice");
        if magic != MAGIC {
            return Err(Error::NotAnAddrTrace(magic));
        }
        let version = u16::from_le_bytes([h[8], h[9]]);
        if version != VERSION {
            return Err(Error::UnsupportedAddrTraceVersion(version));
        }
        let flags = u16::from_le_bytes([h[10], h[11]]);
        if flags != 0 {
            return Err(Error::UnsupportedAddrTraceFlags(flags));
        }
        let count = u64::from_le_bytes(h[16..24].try_into().expect("8-byte slice"));
        Ok(Header {
            count: (count != COUNT_UNKNOWN).then_some(count),
        })
    }

    /// The 24 header bytes.
    pub fn to_bytes(self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..10].copy_from_slice(&VERSION.to_le_bytes());
        h[16..24].copy_from_slice(&self.count.unwrap_or(COUNT_UNKNOWN).to_le_bytes());
        h
    }
}

/// True if `bytes` starts like a `bin` address trace (used to sniff input).
pub fn has_magic(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC)
}

/// A whole trace held in memory (typically a memory map): zero-copy access to
/// its records.
#[derive(Clone, Copy, Debug)]
pub struct AddrTrace<'a> {
    /// The decoded file header.
    pub header: Header,
    body: &'a [u8],
}

impl<'a> AddrTrace<'a> {
    /// Checks the header and that the body holds exactly the records it
    /// declares.
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        let header = Header::parse(bytes)?;
        let body = &bytes[HEADER_LEN..];
        header.check_body(body.len() as u64)?;
        Ok(AddrTrace { header, body })
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.body.len() / RECORD_LEN
    }

    /// True if the trace has no record.
    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }

    /// The raw record words, in order.
    #[inline]
    pub fn words(&self) -> impl Iterator<Item = u64> + 'a {
        self.body
            .chunks_exact(RECORD_LEN)
            .map(|c| u64::from_le_bytes(c.try_into().expect("chunks_exact(8)")))
    }

    /// The records, in order.
    pub fn records(&self) -> impl Iterator<Item = AddrRecord> + 'a {
        self.words().map(AddrRecord::decode)
    }
}

/// Streaming reader for pipes: reads large blocks and hands out record words.
pub struct AddrStreamReader<R: Read> {
    inner: R,
    header: Header,
    buf: Vec<u8>,
    /// Bytes of `buf` filled.
    filled: usize,
    records_seen: u64,
    done: bool,
}

const STREAM_BLOCK: usize = 1 << 20;

impl<R: Read> AddrStreamReader<R> {
    /// Reads and checks the header.
    pub fn new(mut inner: R) -> Result<Self> {
        let mut h = [0u8; HEADER_LEN];
        let got = read_full(&mut inner, &mut h)?;
        let header = Header::parse(&h[..got])?;
        Ok(AddrStreamReader {
            inner,
            header,
            buf: vec![0; STREAM_BLOCK],
            filled: 0,
            records_seen: 0,
            done: false,
        })
    }

    /// The header read by [`AddrStreamReader::new`].
    pub fn header(&self) -> Header {
        self.header
    }

    /// The next block of record words (empty at the end of a well-formed
    /// stream).  Checks the declared count and the trailing bytes at the end.
    pub fn next_block(&mut self) -> Result<Vec<u64>> {
        let mut words = Vec::new();
        self.next_block_into(&mut words)?;
        Ok(words)
    }

    /// Fills `out` (cleared first) with the next block of record words.
    pub fn next_block_into(&mut self, out: &mut Vec<u64>) -> Result<()> {
        out.clear();
        if self.done {
            return Ok(());
        }
        // Keep a partial record from the previous block at the front.
        while self.filled < self.buf.len() {
            let n = read_retry(&mut self.inner, &mut self.buf[self.filled..])?;
            if n == 0 {
                break;
            }
            self.filled += n;
            if self.filled >= RECORD_LEN * 4096 {
                break;
            }
        }
        let whole = self.filled / RECORD_LEN * RECORD_LEN;
        out.extend(
            self.buf[..whole]
                .chunks_exact(RECORD_LEN)
                .map(|c| u64::from_le_bytes(c.try_into().expect("chunks_exact(8)"))),
        );
        self.records_seen += (whole / RECORD_LEN) as u64;
        self.buf.copy_within(whole..self.filled, 0);
        self.filled -= whole;
        if whole == 0 {
            // Nothing more arrived: this is the end of the stream.
            self.done = true;
            if self.filled != 0 {
                return Err(Error::AddrTraceTruncated(format!(
                    "record {} has {} of its {RECORD_LEN} bytes",
                    self.records_seen, self.filled
                )));
            }
            if let Some(declared) = self.header.count {
                if declared != self.records_seen {
                    return Err(Error::AddrCountMismatch {
                        declared,
                        actual: self.records_seen,
                    });
                }
            }
        } else if let Some(declared) = self.header.count {
            if self.records_seen > declared {
                self.done = true;
                return Err(Error::AddrCountMismatch {
                    declared,
                    actual: self.records_seen,
                });
            }
        }
        Ok(())
    }
}

fn read_retry<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Reads until `buf` is full or the stream ends; returns the bytes read.
/// Reads until `buf` is full or the input ends; returns the bytes read.
pub fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let n = read_retry(r, &mut buf[got..])?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

/// Buffered writer of a `bin` address trace.
pub struct AddrWriter<W: Write> {
    out: BufWriter<W>,
    declared: Option<u64>,
    written: u64,
}

impl<W: Write> AddrWriter<W> {
    /// Writes the header.  `count` is the number of records that will follow,
    /// or `None` when it is not known (a writer on a pipe).
    pub fn new(inner: W, count: Option<u64>) -> Result<Self> {
        if count == Some(COUNT_UNKNOWN) {
            return Err(Error::AddrCountMismatch {
                declared: COUNT_UNKNOWN,
                actual: 0,
            });
        }
        let mut out = BufWriter::with_capacity(1 << 20, inner);
        out.write_all(&Header { count }.to_bytes())?;
        Ok(AddrWriter {
            out,
            declared: count,
            written: 0,
        })
    }

    /// Appends one reference.
    #[inline]
    pub fn push(&mut self, kind: AccessKind, addr: u64, size: u32) -> Result<()> {
        let word = AddrRecord::encode(kind, addr, size)?;
        self.out.write_all(&word.to_le_bytes())?;
        self.written += 1;
        Ok(())
    }

    /// Records written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Flushes and checks the declared count; returns the inner writer.
    pub fn finish(self) -> Result<W> {
        if let Some(declared) = self.declared {
            if declared != self.written {
                return Err(Error::AddrCountMismatch {
                    declared,
                    actual: self.written,
                });
            }
        }
        self.out.into_inner().map_err(|e| Error::Io(e.into_error()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<AddrRecord> {
        vec![
            AddrRecord {
                kind: AccessKind::Instr,
                addr: 0x401000,
                size: 4,
            },
            AddrRecord {
                kind: AccessKind::Read,
                addr: 0x7ffd_1234_5678,
                size: 8,
            },
            AddrRecord {
                kind: AccessKind::Write,
                addr: ADDRESS_LIMIT - 1,
                size: 64,
            },
            AddrRecord {
                kind: AccessKind::Misc,
                addr: 0,
                size: 1,
            },
        ]
    }

    fn write(records: &[AddrRecord], count: Option<u64>) -> Vec<u8> {
        let mut w = AddrWriter::new(Vec::new(), count).unwrap();
        for r in records {
            w.push(r.kind, r.addr, u32::from(r.size)).unwrap();
        }
        w.finish().unwrap()
    }

    #[test]
    fn round_trip_known_and_unknown_count() {
        for count in [Some(4), None] {
            let bytes = write(&sample(), count);
            assert_eq!(bytes.len(), HEADER_LEN + 4 * RECORD_LEN);
            let t = AddrTrace::parse(&bytes).unwrap();
            assert_eq!(t.header.count, count);
            assert_eq!(t.records().collect::<Vec<_>>(), sample());
            let mut s = AddrStreamReader::new(&bytes[..]).unwrap();
            let mut all = Vec::new();
            loop {
                let b = s.next_block().unwrap();
                if b.is_empty() {
                    break;
                }
                all.extend(b.into_iter().map(AddrRecord::decode));
            }
            assert_eq!(all, sample());
        }
    }

    #[test]
    fn record_layout_is_documented_one() {
        // kind 2 (instr), size 4 -> top byte (4-1)<<2 | 2 = 0x0e.
        let w = AddrRecord::encode(AccessKind::Instr, 0x401000, 4).unwrap();
        assert_eq!(w, 0x0e00_0000_0040_1000);
    }

    #[test]
    fn refuses_what_does_not_fit() {
        assert!(matches!(
            AddrRecord::encode(AccessKind::Read, ADDRESS_LIMIT, 1),
            Err(Error::AddressTooLarge(_))
        ));
        assert!(matches!(
            AddrRecord::encode(AccessKind::Read, 0, 65),
            Err(Error::SizeOutOfRange(65))
        ));
        assert!(matches!(
            AddrRecord::encode(AccessKind::Read, 0, 0),
            Err(Error::SizeOutOfRange(0))
        ));
    }

    #[test]
    fn truncated_record_and_header() {
        let bytes = write(&sample(), None);
        let cut = &bytes[..bytes.len() - 3];
        assert!(matches!(
            AddrTrace::parse(cut),
            Err(Error::AddrTraceTruncated(_))
        ));
        let mut s = AddrStreamReader::new(cut).unwrap();
        let mut result = Ok(());
        for _ in 0..3 {
            result = s.next_block().map(|_| ());
            if result.is_err() {
                break;
            }
        }
        assert!(matches!(result, Err(Error::AddrTraceTruncated(_))));
        assert!(matches!(
            AddrTrace::parse(&bytes[..10]),
            Err(Error::AddrTraceTruncated(_))
        ));
        assert!(matches!(
            AddrStreamReader::new(&bytes[..10]),
            Err(Error::AddrTraceTruncated(_))
        ));
    }

    #[test]
    fn bad_magic_version_flags() {
        let mut bytes = write(&sample(), None);
        bytes[0] = b'X';
        assert!(matches!(
            AddrTrace::parse(&bytes),
            Err(Error::NotAnAddrTrace(_))
        ));
        assert!(matches!(
            AddrTrace::parse(b"r 10 4\n"),
            Err(Error::NotAnAddrTrace(_))
        ));
        let mut bytes = write(&sample(), None);
        bytes[8] = 2;
        assert!(matches!(
            AddrTrace::parse(&bytes),
            Err(Error::UnsupportedAddrTraceVersion(2))
        ));
        let mut bytes = write(&sample(), None);
        bytes[10] = 1;
        assert!(matches!(
            AddrTrace::parse(&bytes),
            Err(Error::UnsupportedAddrTraceFlags(1))
        ));
    }

    #[test]
    fn count_mismatch() {
        let mut bytes = write(&sample(), Some(4));
        bytes[16] = 5;
        assert!(matches!(
            AddrTrace::parse(&bytes),
            Err(Error::AddrCountMismatch {
                declared: 5,
                actual: 4
            })
        ));
        let mut s = AddrStreamReader::new(&bytes[..]).unwrap();
        assert_eq!(s.next_block().unwrap().len(), 4);
        assert!(matches!(
            s.next_block(),
            Err(Error::AddrCountMismatch {
                declared: 5,
                actual: 4
            })
        ));
        bytes[16] = 3;
        let mut s = AddrStreamReader::new(&bytes[..]).unwrap();
        assert!(matches!(
            s.next_block(),
            Err(Error::AddrCountMismatch {
                declared: 3,
                actual: 4
            })
        ));
        let mut w = AddrWriter::new(Vec::new(), Some(2)).unwrap();
        w.push(AccessKind::Read, 0, 1).unwrap();
        assert!(matches!(
            w.finish(),
            Err(Error::AddrCountMismatch {
                declared: 2,
                actual: 1
            })
        ));
    }

    #[test]
    fn any_bytes_never_panic() {
        // Every prefix of a valid trace and of a mangled one: an error or
        // records, never a panic.
        let bytes = write(&sample(), Some(4));
        for n in 0..=bytes.len() {
            let _ = AddrTrace::parse(&bytes[..n]).map(|t| t.records().count());
            if let Ok(mut s) = AddrStreamReader::new(&bytes[..n]) {
                while let Ok(b) = s.next_block() {
                    if b.is_empty() {
                        break;
                    }
                }
            }
        }
    }
}
