//! Trace input: Dinero IV's traditional din (`-informat d`), its extended din
//! (`-informat D`, Dinero's default) and aetrace's binary `bin` format
//! (`-informat b`, also chosen automatically when the input starts with the
//! `bin` magic).
//!
//! Text files are memory-mapped and parsed in place, `bin` files read in
//! 256 KiB pieces; pipes are read in 2 MiB (text) or 1 MiB (`bin`)
//! blocks.  Text is parsed by a hand-written byte loop with no per-line
//! allocation: the common extended-din line (`k hex hex\n`) takes a fast
//! path that decodes hex eight bytes at a time, anything else the general
//! path that follows Dinero's checks.  References come out in batches of
//! [`Ref`] so the simulator can run on another thread than the parser.
//!
//! Invariants:
//! - Each accepted reference has `1 <= size` and `addr + size` does not
//!   overflow `u64` (so block numbers never reach [`crate::cache::INVALID`]).
//! - Every malformed line is an [`Error::Line`] naming its 1-based line
//!   number, following Dinero's own checks (short line, unknown access
//!   type, non-hex digit, missing size); records Dinero accepts but this
//!   simulator cannot simulate exactly (copy-back `c`/label 4, invalidate
//!   `v`/label 5) are refused the same way.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use aetrace_format::addrtrace::{self, AccessKind, AddrRecord, AddrStreamReader, Header};

use crate::{Error, Result};

/// One memory reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ref {
    /// What kind of reference it is.
    pub kind: AccessKind,
    /// The referenced virtual address.
    pub addr: u64,
    /// Bytes referenced.
    pub size: u32,
}

/// Input trace format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InFormat {
    /// `-informat d`: Dinero III's `label addr` (label 0 read, 1 write,
    /// 2 instruction fetch, 3 misc); the address is rounded down to a
    /// multiple of 4 and the size is 4, as Dinero IV does.
    Din,
    /// `-informat D`: `r|w|i|m addr size`, hex address and size.
    XDin,
    /// `-informat b`: aetrace's binary format.
    Bin,
}

impl InFormat {
    /// The format named by `-informat`'s letter (`d`, `D` or `b`).
    pub fn from_letter(c: &str) -> Option<Self> {
        match c {
            "d" => Some(InFormat::Din),
            "D" => Some(InFormat::XDin),
            "b" => Some(InFormat::Bin),
            _ => None,
        }
    }
}

/// Where the trace comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// Standard input.
    Stdin,
    /// A file.
    File(PathBuf),
}

/// References per batch.
pub const BATCH: usize = 1 << 16;
/// References per batch decoded from a binary trace file.
const FILE_BATCH: usize = 1 << 13;
/// Bytes read at once from a binary trace file: large enough that the read
/// calls cost little, small enough to stay in the host's L2 until decoded.
const FILE_READ: usize = 1 << 18;

const TEXT_BLOCK: usize = 1 << 21;

/// A source of reference batches.
pub struct Reader {
    inner: Inner,
}

enum Inner {
    Text {
        src: Box<dyn Read + Send>,
        format: InFormat,
        buf: Vec<u8>,
        /// `buf[start..filled]` is the unparsed input.
        start: usize,
        filled: usize,
        line: u64,
        eof: bool,
    },
    /// A binary trace file, read in [`FILE_READ`] pieces rather than
    /// mapped: copying from the page cache costs less than mapping and
    /// unmapping every page, and the decoder then reads from the host's
    /// cache rather than memory.
    BinFile {
        file: File,
        buf: Vec<u8>,
        /// `buf[pos..filled]` is the undecoded input.
        pos: usize,
        filled: usize,
        /// Body bytes not read yet.
        left: u64,
    },
    /// A text file, parsed in place.
    MappedText {
        map: memmap2::Mmap,
        format: InFormat,
        /// Byte offset of the next line.
        pos: usize,
        line: u64,
    },
    Stream(AddrStreamReader<Box<dyn Read + Send>>, Vec<u64>),
}

fn open_err(path: &Path, source: io::Error) -> Error {
    Error::File {
        path: path.display().to_string(),
        source,
    }
}

impl Reader {
    /// Opens `input`; `format` `None` means "sniff: `bin` if the magic is
    /// there, else extended din" (Dinero's default).
    pub fn open(input: &Input, format: Option<InFormat>) -> Result<Self> {
        let (mut src, map): (Box<dyn Read + Send>, Option<memmap2::Mmap>) = match input {
            Input::Stdin => (Box::new(io::stdin()), None),
            Input::File(p) => {
                let mut f = File::open(p).map_err(|e| open_err(p, e))?;
                let len = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
                if let Some(len) = len.filter(|&l| l > 0) {
                    let mut head = [0u8; addrtrace::HEADER_LEN];
                    let got =
                        addrtrace::read_full(&mut f, &mut head).map_err(|e| open_err(p, e))?;
                    let head = &head[..got];
                    if format == Some(InFormat::Bin)
                        || (format.is_none() && addrtrace::has_magic(head))
                    {
                        return Self::bin_file(f, len, head);
                    }
                }
                // SAFETY: the map is read-only and only read as bytes; a
                // concurrent truncation of the file by another process is
                // outside what any reader can defend against.
                let map = if len.is_some_and(|l| l > 0) {
                    // `populate`: fault the pages in with one call rather
                    // than one fault per page during the run.
                    Some(
                        unsafe { memmap2::MmapOptions::new().populate().map(&f) }
                            .map_err(|e| open_err(p, e))?,
                    )
                } else {
                    None
                };
                (Box::new(f), map)
            }
        };
        if let Some(map) = map {
            // Text from a file: parse the mapped bytes in place.
            return Ok(Reader {
                inner: Inner::MappedText {
                    map,
                    format: format.unwrap_or(InFormat::XDin),
                    pos: 0,
                    line: 0,
                },
            });
        }
        let mut prefix = [0u8; 8];
        let mut got = 0;
        while got < prefix.len() {
            let n = match src.read(&mut prefix[got..]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::Io(e)),
            };
            if n == 0 {
                break;
            }
            got += n;
        }
        let prefix = prefix[..got].to_vec();
        let is_bin =
            format == Some(InFormat::Bin) || (format.is_none() && addrtrace::has_magic(&prefix));
        let chained: Box<dyn Read + Send> = Box::new(io::Cursor::new(prefix).chain(src));
        if is_bin {
            Ok(Reader {
                inner: Inner::Stream(AddrStreamReader::new(chained)?, Vec::new()),
            })
        } else {
            Ok(Reader::text(chained, format.unwrap_or(InFormat::XDin)))
        }
    }

    /// A binary trace file of `len` bytes whose first bytes, `head`, are
    /// read: checked whole (header, record count) before any record is
    /// simulated, as a mapped trace would be.
    fn bin_file(file: File, len: u64, head: &[u8]) -> Result<Self> {
        let header = Header::parse(head)?;
        header.check_body(len - addrtrace::HEADER_LEN as u64)?;
        Ok(Reader {
            inner: Inner::BinFile {
                file,
                buf: vec![0; FILE_READ],
                pos: 0,
                filled: 0,
                left: len - addrtrace::HEADER_LEN as u64,
            },
        })
    }

    /// A text reader over any byte source (used by tests and benches too).
    pub fn text(src: Box<dyn Read + Send>, format: InFormat) -> Self {
        Reader {
            inner: Inner::Text {
                src,
                format,
                buf: vec![0; TEXT_BLOCK],
                start: 0,
                filled: 0,
                line: 0,
                eof: false,
            },
        }
    }

    /// The bytes and format of a memory-mapped text file, which
    /// [`parse_chunk`] can parse in pieces on several threads.
    pub fn mapped_text(&self) -> Option<(&[u8], InFormat)> {
        match &self.inner {
            Inner::MappedText { map, format, .. } => Some((map, *format)),
            _ => None,
        }
    }

    /// Fills `out` (cleared first) with the next references; empty at the end.
    pub fn next_batch(&mut self, out: &mut Vec<Ref>) -> Result<()> {
        out.clear();
        match &mut self.inner {
            Inner::MappedText {
                map,
                format,
                pos,
                line,
            } => {
                let rest = map.get(*pos..).unwrap_or(&[]);
                let used = match format {
                    InFormat::XDin => parse_xdin(rest, line, out, BATCH)?,
                    InFormat::Din => parse_din(rest, line, out, BATCH)?,
                    InFormat::Bin => unreachable!("bin input is never parsed as text"),
                };
                *pos += used;
                Ok(())
            }
            Inner::BinFile {
                file,
                buf,
                pos,
                filled,
                left,
            } => {
                if *pos == *filled && *left > 0 {
                    let n = (*left).min(buf.len() as u64) as usize;
                    // The length was checked at open: a shorter read means
                    // the file shrank meanwhile, an I/O error.
                    file.read_exact(&mut buf[..n])?;
                    (*pos, *filled, *left) = (0, n, *left - n as u64);
                }
                let take = (*filled - *pos).min(FILE_BATCH * addrtrace::RECORD_LEN);
                out.extend(
                    buf[*pos..*pos + take]
                        .chunks_exact(addrtrace::RECORD_LEN)
                        .map(|c| {
                            decode(u64::from_le_bytes(c.try_into().expect("chunks_exact(8)")))
                        }),
                );
                *pos += take;
                Ok(())
            }
            Inner::Stream(r, words) => {
                r.next_block_into(words)?;
                out.extend(words.iter().map(|&w| decode(w)));
                Ok(())
            }
            Inner::Text {
                src,
                format,
                buf,
                start,
                filled,
                line,
                eof,
            } => loop {
                // Top the buffer up when little unparsed input is left.
                if !*eof && *filled - *start < buf.len() / 4 {
                    buf.copy_within(*start..*filled, 0);
                    *filled -= *start;
                    *start = 0;
                    while !*eof && *filled < buf.len() {
                        match src.read(&mut buf[*filled..]) {
                            Ok(0) => *eof = true,
                            Ok(n) => *filled += n,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(Error::Io(e)),
                        }
                    }
                }
                let pending = &buf[*start..*filled];
                let end = if *eof {
                    pending.len()
                } else {
                    match memrchr_newline(pending) {
                        Some(i) => i + 1,
                        None if *start == 0 && *filled == buf.len() => {
                            return Err(Error::Line {
                                line: *line + 1,
                                message: format!("line longer than {} bytes", buf.len()),
                            })
                        }
                        None => {
                            // Force a refill on the next round.
                            buf.copy_within(*start..*filled, 0);
                            *filled -= *start;
                            *start = 0;
                            match src.read(&mut buf[*filled..]) {
                                Ok(0) => *eof = true,
                                Ok(n) => *filled += n,
                                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                                Err(e) => return Err(Error::Io(e)),
                            }
                            continue;
                        }
                    }
                };
                let used = match format {
                    InFormat::XDin => parse_xdin(&pending[..end], line, out, BATCH)?,
                    InFormat::Din => parse_din(&pending[..end], line, out, BATCH)?,
                    InFormat::Bin => unreachable!("bin input never uses the text reader"),
                };
                *start += used;
                if !out.is_empty() || (*eof && *start == *filled) {
                    return Ok(());
                }
            },
        }
    }
}

/// Splits `text` into pieces of about `target` bytes that end just after a
/// newline (the last one at the end of `text`).
pub fn chunk_bounds(text: &[u8], target: usize) -> Vec<(usize, usize)> {
    let mut bounds = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let probe = (start + target).min(text.len());
        let end = match text[probe..].iter().position(|&c| c == b'\n') {
            Some(p) => probe + p + 1,
            None => text.len(),
        };
        bounds.push((start, end));
        start = end;
    }
    bounds
}

/// Parses a piece of text made of whole lines into `out` (cleared first);
/// returns its number of lines.  Line numbers in errors count from the
/// start of the piece.
pub fn parse_chunk(text: &[u8], format: InFormat, out: &mut Vec<Ref>) -> Result<u64> {
    out.clear();
    let mut line = 0;
    let mut pos = 0;
    while pos < text.len() {
        let rest = &text[pos..];
        pos += match format {
            InFormat::XDin => parse_xdin(rest, &mut line, out, usize::MAX)?,
            InFormat::Din => parse_din(rest, &mut line, out, usize::MAX)?,
            InFormat::Bin => unreachable!("bin input is never parsed as text"),
        };
    }
    Ok(line)
}

#[inline]
fn decode(w: u64) -> Ref {
    let r = AddrRecord::decode(w);
    Ref {
        kind: r.kind,
        addr: r.addr,
        size: u32::from(r.size),
    }
}

fn memrchr_newline(b: &[u8]) -> Option<usize> {
    b.iter().rposition(|&c| c == b'\n')
}

/// Hex digit values; 0xff for non-digits.
static HEX: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

#[inline]
fn is_blank(c: u8) -> bool {
    c == b' ' || c == b'\t' || c == b'\r'
}

fn line_err(line: u64, message: impl Into<String>) -> Error {
    Error::Line {
        line,
        message: message.into(),
    }
}

fn show(c: u8) -> String {
    if c.is_ascii_graphic() {
        format!("'{}'", c as char)
    } else {
        format!("byte {c:#04x}")
    }
}

/// Parses a hex number at `s[*i..]` the way Dinero does (an optional `0x`
/// after a leading zero); stops at a blank or end of line.
#[inline]
fn hex(s: &[u8], i: &mut usize, line: u64, what: &str) -> Result<u64> {
    let at = |k: usize| s.get(k).copied().unwrap_or(b'\n');
    let mut c = at(*i);
    let mut v = u64::from(HEX[c as usize]);
    if v > 15 {
        return Err(line_err(
            line,
            format!("{} in {what} (expected a hex digit)", show(c)),
        ));
    }
    *i += 1;
    c = at(*i);
    if v == 0 && (c == b'x' || c == b'X') {
        *i += 1;
        c = at(*i);
    }
    loop {
        let d = HEX[c as usize];
        if d > 15 {
            break;
        }
        if v >> 60 != 0 {
            return Err(line_err(line, format!("{what} does not fit 64 bits")));
        }
        v = v << 4 | u64::from(d);
        *i += 1;
        c = at(*i);
    }
    if !(is_blank(c) || c == b'\n') {
        return Err(line_err(
            line,
            format!("{} in {what} (expected a hex digit)", show(c)),
        ));
    }
    Ok(v)
}

/// Skips blanks.
#[inline]
fn blanks(s: &[u8], i: &mut usize) {
    while let Some(&c) = s.get(*i) {
        if !is_blank(c) {
            break;
        }
        *i += 1;
    }
}

/// Skips to just past the end of the line.
#[inline]
fn end_line(s: &[u8], i: &mut usize) {
    match s.get(*i..).and_then(|r| r.iter().position(|&c| c == b'\n')) {
        Some(p) => *i += p + 1,
        None => *i = s.len(),
    }
}

fn checked(line: u64, kind: AccessKind, addr: u64, size: u64) -> Result<Ref> {
    if size == 0 {
        return Err(line_err(line, "size 0"));
    }
    if size > u64::from(u16::MAX) {
        return Err(line_err(
            line,
            format!("size {size:#x} is larger than Dinero's limit 0xffff"),
        ));
    }
    if addr.checked_add(size).is_none() {
        return Err(line_err(
            line,
            format!("reference {addr:#x}+{size:#x} wraps past the end of the address space"),
        ));
    }
    Ok(Ref {
        kind,
        addr,
        size: size as u32,
    })
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// Bytes of `t` (all below 0x80) within `lo..=hi`: their high bit set.
#[inline(always)]
fn in_range(t: u64, lo: u8, hi: u8) -> u64 {
    let ge_lo = (t + ONES * u64::from(0x80 - lo)) & HIGH;
    let gt_hi = (t + ONES * u64::from(0x7f - hi)) & HIGH;
    ge_lo & !gt_hi
}

/// The leading hex digits of the 8 bytes of `w` (first byte in the low
/// bits, most significant digit first): their value and how many there are.
/// Eight bytes at a time instead of a branch per digit.
#[inline(always)]
fn hex8(w: u64) -> (u64, usize) {
    let t = w & !HIGH;
    let digit = in_range(t, b'0', b'9');
    let alpha = in_range(t | (ONES * 0x20), b'a', b'f');
    let is_hex = (digit | alpha) & !w & HIGH;
    let non_hex = !is_hex & HIGH;
    let n = (non_hex.trailing_zeros() / 8) as usize;
    let keep = if n == 8 {
        u64::MAX
    } else {
        (1u64 << (8 * n)) - 1
    };
    // Digit values: low nibble, plus 9 for letters (bit 6 set).
    let mut x = ((w & (ONES * 0x0f)) + 9 * ((w >> 6) & ONES)) & keep;
    x = (x & 0x000F_000F_000F_000F) << 4 | (x & 0x0F00_0F00_0F00_0F00) >> 8;
    x = (x & 0x0000_00FF_0000_00FF) << 8 | (x & 0x00FF_0000_00FF_0000) >> 16;
    x = (x & 0x0000_0000_0000_FFFF) << 16 | (x & 0x0000_FFFF_0000_0000) >> 32;
    (x >> (4 * (8 - n)), n)
}

/// Up to 15 hex digits at `s[j..]`; `None` if fewer than 16 bytes remain
/// or there are 16 digits or more (the general path handles those).
#[inline(always)]
fn hex_digits(s: &[u8], j: usize) -> Option<(u64, usize)> {
    let w0 = u64::from_le_bytes(s.get(j..j + 8)?.try_into().ok()?);
    let (v0, n0) = hex8(w0);
    if n0 < 8 {
        return Some((v0, n0));
    }
    let w1 = u64::from_le_bytes(s.get(j + 8..j + 16)?.try_into().ok()?);
    let (v1, n1) = hex8(w1);
    if n1 == 8 {
        return None;
    }
    Some((v0 << (4 * n1) | v1, 8 + n1))
}

/// Extended-din access types by first byte, in the fast path's lower-case
/// form; 4 for anything else.
static FAST_KIND: [u8; 256] = {
    let mut t = [4u8; 256];
    t[b'r' as usize] = AccessKind::Read as u8;
    t[b'w' as usize] = AccessKind::Write as u8;
    t[b'i' as usize] = AccessKind::Instr as u8;
    t[b'm' as usize] = AccessKind::Misc as u8;
    t
};

/// The common extended-din line, `k hex hex\n` with single spaces and no
/// `0x`, parsed without the general path's checks; `None` sends the line to
/// the general path (which also reports every error).
#[inline(always)]
fn fast_xdin(s: &[u8], i: usize) -> Option<(Ref, usize)> {
    // A table, not a `match`: the kind changes from line to line.
    let k = FAST_KIND[*s.get(i)? as usize];
    if k > 3 || *s.get(i + 1)? != b' ' {
        return None;
    }
    let kind = AccessKind::ALL[k as usize];
    let (addr, na) = hex_digits(s, i + 2)?;
    let j = i + 2 + na;
    if na == 0 || *s.get(j)? != b' ' {
        return None;
    }
    // Sizes are nearly always one digit: decode that case with one lookup.
    let d = HEX[*s.get(j + 1)? as usize];
    let (size, j) = if d <= 15 && *s.get(j + 2)? == b'\n' {
        (u64::from(d), j + 2)
    } else {
        let (size, ns) = hex_digits(s, j + 1)?;
        if ns == 0 || ns > 4 {
            return None;
        }
        (size, j + 1 + ns)
    };
    if size == 0 || *s.get(j)? != b'\n' || addr.checked_add(size).is_none() {
        return None;
    }
    Some((
        Ref {
            kind,
            addr,
            size: size as u32,
        },
        j + 1,
    ))
}

/// Parses complete extended-din lines from `s` into `out` until `out`
/// holds `limit` references; returns the bytes consumed.
fn parse_xdin(s: &[u8], line: &mut u64, out: &mut Vec<Ref>, limit: usize) -> Result<usize> {
    let mut i = 0;
    while i < s.len() && out.len() < limit {
        *line += 1;
        if let Some((r, next)) = fast_xdin(s, i) {
            out.push(r);
            i = next;
            continue;
        }
        let ln = *line;
        blanks(s, &mut i);
        let c = s.get(i).copied().unwrap_or(b'\n');
        let kind = match c {
            b'r' | b'R' => AccessKind::Read,
            b'w' | b'W' => AccessKind::Write,
            b'i' | b'I' => AccessKind::Instr,
            b'm' | b'M' => AccessKind::Misc,
            b'\n' => return Err(line_err(ln, "short line")),
            b'c' | b'C' | b'v' | b'V' => {
                return Err(line_err(
                    ln,
                    format!("access type '{}' (copy-back/invalidate) is not supported", c as char),
                ))
            }
            _ => {
                return Err(line_err(
                    ln,
                    format!(
                        "unknown access type {} (expected r, w, i or m; use -informat d for traditional din)",
                        show(c)
                    ),
                ))
            }
        };
        i += 1;
        match s.get(i).copied().unwrap_or(b'\n') {
            b'\n' => return Err(line_err(ln, "short line")),
            c if is_blank(c) => {}
            c => {
                return Err(line_err(
                    ln,
                    format!("unknown access type (got {} after it)", show(c)),
                ))
            }
        }
        blanks(s, &mut i);
        if s.get(i).map_or(true, |&c| c == b'\n') {
            return Err(line_err(ln, "short line"));
        }
        let addr = hex(s, &mut i, ln, "address")?;
        blanks(s, &mut i);
        if s.get(i).map_or(true, |&c| c == b'\n') {
            return Err(line_err(ln, "missing size"));
        }
        let size = hex(s, &mut i, ln, "size")?;
        end_line(s, &mut i);
        out.push(checked(ln, kind, addr, size)?);
    }
    Ok(i)
}

/// The common traditional-din line, `label hex\n` with a label 0..=3 and a
/// single space; `None` sends the line to the general path.
#[inline(always)]
fn fast_din(s: &[u8], i: usize) -> Option<(Ref, usize)> {
    let label = s.get(i)?.wrapping_sub(b'0');
    if label > 3 || *s.get(i + 1)? != b' ' {
        return None;
    }
    let (addr, na) = hex_digits(s, i + 2)?;
    let j = i + 2 + na;
    if na == 0 || *s.get(j)? != b'\n' {
        return None;
    }
    // At most 15 digits, so `addr + 4` cannot overflow.
    Some((
        Ref {
            kind: AccessKind::ALL[label as usize],
            addr: addr & !3,
            size: 4,
        },
        j + 1,
    ))
}

/// Parses complete traditional-din lines (see [`parse_xdin`]).
fn parse_din(s: &[u8], line: &mut u64, out: &mut Vec<Ref>, limit: usize) -> Result<usize> {
    let mut i = 0;
    while i < s.len() && out.len() < limit {
        *line += 1;
        if let Some((r, next)) = fast_din(s, i) {
            out.push(r);
            i = next;
            continue;
        }
        let ln = *line;
        blanks(s, &mut i);
        if s.get(i).map_or(true, |&c| c == b'\n') {
            return Err(line_err(ln, "short line"));
        }
        let label = hex(s, &mut i, ln, "label")?;
        let kind = match label {
            0 => AccessKind::Read,
            1 => AccessKind::Write,
            2 => AccessKind::Instr,
            3 => AccessKind::Misc,
            4 | 5 => {
                return Err(line_err(
                    ln,
                    format!("label {label} (copy-back/invalidate) is not supported"),
                ))
            }
            _ => {
                return Err(line_err(
                    ln,
                    format!("unknown label {label:#x} (expected 0..3)"),
                ))
            }
        };
        blanks(s, &mut i);
        if s.get(i).map_or(true, |&c| c == b'\n') {
            return Err(line_err(ln, "short line"));
        }
        let addr = hex(s, &mut i, ln, "address")?;
        end_line(s, &mut i);
        // Dinero III is word-oriented: Dinero IV aligns to 4 and uses size 4.
        out.push(checked(ln, kind, addr & !3, 4)?);
    }
    Ok(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A binary trace file is read in pieces: more records than one piece
    /// holds come back in order, and a file whose length disagrees with its
    /// header is refused before any record, as from a pipe.
    #[test]
    fn binary_file_reads_across_pieces_and_checks_its_length() {
        let n = FILE_READ / addrtrace::RECORD_LEN * 2 + 5;
        let want: Vec<Ref> = (0..n as u64)
            .map(|i| {
                r(
                    AccessKind::ALL[(i % 4) as usize],
                    i * 12,
                    (i % 64) as u32 + 1,
                )
            })
            .collect();
        let mut w = addrtrace::AddrWriter::new(Vec::new(), Some(n as u64)).unwrap();
        for x in &want {
            w.push(x.kind, x.addr, x.size).unwrap();
        }
        let bytes = w.finish().unwrap();
        let path = std::env::temp_dir().join(format!("cachesim-binfile-{}", std::process::id()));
        let read = |b: &[u8]| -> Result<Vec<Ref>> {
            std::fs::write(&path, b).unwrap();
            let mut rd = Reader::open(&Input::File(path.clone()), None)?;
            let (mut all, mut batch) = (Vec::new(), Vec::new());
            loop {
                rd.next_batch(&mut batch)?;
                if batch.is_empty() {
                    return Ok(all);
                }
                all.extend_from_slice(&batch);
            }
        };
        assert_eq!(read(&bytes).unwrap(), want);
        for cut in [3, 8] {
            let e = read(&bytes[..bytes.len() - cut]).unwrap_err().to_string();
            assert!(e.contains("truncated") || e.contains("declares"), "{e}");
        }
        std::fs::remove_file(&path).unwrap();
    }

    fn read_all(text: &str, f: InFormat) -> Result<Vec<Ref>> {
        let mut r = Reader::text(Box::new(io::Cursor::new(text.as_bytes().to_vec())), f);
        let mut all = Vec::new();
        let mut b = Vec::new();
        loop {
            r.next_batch(&mut b)?;
            if b.is_empty() {
                return Ok(all);
            }
            all.extend_from_slice(&b);
        }
    }

    fn r(kind: AccessKind, addr: u64, size: u32) -> Ref {
        Ref { kind, addr, size }
    }

    #[test]
    fn xdin_accepts_dinero_syntax() {
        let got = read_all(
            "r 10 4\n  W\t0x1F 2 comment\nI 0X400000 0x8\nm 0 1",
            InFormat::XDin,
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                r(AccessKind::Read, 0x10, 4),
                r(AccessKind::Write, 0x1f, 2),
                r(AccessKind::Instr, 0x400000, 8),
                r(AccessKind::Misc, 0, 1)
            ]
        );
    }

    #[test]
    fn din_labels_align_and_size_four() {
        let got = read_all("0 13\n1 0x22\n2 400001 extra\n3 8\n", InFormat::Din).unwrap();
        assert_eq!(
            got,
            vec![
                r(AccessKind::Read, 0x10, 4),
                r(AccessKind::Write, 0x20, 4),
                r(AccessKind::Instr, 0x400000, 4),
                r(AccessKind::Misc, 8, 4)
            ]
        );
    }

    fn err_line(text: &str, f: InFormat) -> (u64, String) {
        match read_all(text, f) {
            Err(Error::Line { line, message }) => (line, message),
            other => panic!("expected a line error, got {other:?}"),
        }
    }

    #[test]
    fn malformed_lines_name_their_line() {
        let cases = [
            ("r 10 4\nx 10 4\n", 2, "unknown access type"),
            ("r 10 4\nr 10 4\nr 1g 4\n", 3, "address"),
            ("r 10\n", 1, "missing size"),
            ("r 10 4\n\nr 1 1\n", 2, "short line"),
            ("r 10 0\n", 1, "size 0"),
            ("c 10 4\n", 1, "not supported"),
            ("rr 10 4\n", 1, "unknown access type"),
            ("r 10 4z\n", 1, "size"),
            ("r fffffffffffffffff 4\n", 1, "64 bits"),
            ("r ffffffffffffffff 4\n", 1, "wraps"),
        ];
        for (text, line, needle) in cases {
            let (l, m) = err_line(text, InFormat::XDin);
            assert_eq!(l, line, "{text:?}: {m}");
            assert!(m.contains(needle), "{text:?}: {m}");
        }
        let (l, m) = err_line("0 10\n7 10\n", InFormat::Din);
        assert_eq!((l, m.contains("unknown label")), (2, true));
        let (l, m) = err_line("0 10\n4 10\n", InFormat::Din);
        assert_eq!((l, m.contains("not supported")), (2, true));
    }

    #[test]
    fn swar_hex_matches_the_general_parser() {
        let mut rng = crate::cache::Rng::new(5);
        let alphabet = b"0123456789abcdefABCDEFxX g\n\t\xff";
        for _ in 0..20_000 {
            let len = rng.below(20);
            let mut b: Vec<u8> = (0..len)
                .map(|_| {
                    if rng.below(4) == 0 {
                        alphabet[rng.below(alphabet.len())]
                    } else {
                        b"0123456789abcdefABCDEF"[rng.below(22)]
                    }
                })
                .collect();
            b.extend_from_slice(b" \n                ");
            let naive_n = b.iter().take_while(|c| c.is_ascii_hexdigit()).count();
            let naive_v = (naive_n <= 15).then(|| {
                b[..naive_n].iter().fold(0u64, |v, &c| {
                    v << 4 | u64::from((c as char).to_digit(16).unwrap())
                })
            });
            match hex_digits(&b, 0) {
                Some((v, n)) => assert_eq!((Some(v), n), (naive_v, naive_n), "{b:?}"),
                None => assert!(naive_n >= 16, "{b:?}"),
            }
        }
    }

    proptest::proptest! {
        /// Arbitrary bytes never panic the text parsers: references or a
        /// line-numbered error.
        #[test]
        fn text_parsers_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            for f in [InFormat::XDin, InFormat::Din] {
                let mut r = Reader::text(Box::new(io::Cursor::new(bytes.clone())), f);
                let mut b = Vec::new();
                loop {
                    match r.next_batch(&mut b) {
                        Ok(()) if b.is_empty() => break,
                        Ok(()) => proptest::prop_assert!(b.iter().all(|x| x.size >= 1
                            && x.addr.checked_add(u64::from(x.size)).is_some())),
                        Err(Error::Line { .. }) => break,
                        Err(e) => proptest::prop_assert!(false, "unexpected error {e}"),
                    }
                }
            }
        }

        /// Near-valid lines (the alphabet of the format) exercise the fast
        /// path and the general path on the same input.
        #[test]
        fn xdin_fast_and_general_paths_agree(
            lines in proptest::collection::vec((0usize..4, 0u64..u64::MAX / 2, 1u64..0x100, proptest::prelude::any::<bool>()), 1..50)
        ) {
            let kinds = ["r", "w", "i", "m"];
            let mut fast = String::new();
            let mut general = String::new();
            for &(k, a, s, prefix) in &lines {
                fast.push_str(&format!("{} {a:x} {s:x}\n", kinds[k]));
                // Tabs, a 0x prefix and a comment force the general path.
                let p = if prefix { "0x" } else { "" };
                general.push_str(&format!("{}\t{p}{a:X}  {s:x} comment\n", kinds[k].to_uppercase()));
            }
            let a = read_all(&fast, InFormat::XDin).unwrap();
            let b = read_all(&general, InFormat::XDin).unwrap();
            proptest::prop_assert_eq!(a.len(), lines.len());
            proptest::prop_assert_eq!(a, b);
            // The same for traditional din (labels 0..3).
            let mut fast = String::new();
            let mut general = String::new();
            for &(k, a, _, prefix) in &lines {
                fast.push_str(&format!("{k} {a:x}\n"));
                let p = if prefix { "0x" } else { "" };
                general.push_str(&format!(" {k}\t{p}{a:X} comment\n"));
            }
            let a = read_all(&fast, InFormat::Din).unwrap();
            let b = read_all(&general, InFormat::Din).unwrap();
            proptest::prop_assert_eq!(a.len(), lines.len());
            proptest::prop_assert_eq!(a, b);
        }
    }

    #[test]
    fn chunks_cover_the_text_at_line_ends() {
        let text = b"r 1 1\nw 2 2\ni 3 3\nm 4 4";
        for target in 1..text.len() + 2 {
            let b = chunk_bounds(text, target);
            assert_eq!(b.first().unwrap().0, 0);
            assert_eq!(b.last().unwrap().1, text.len());
            for w in b.windows(2) {
                assert_eq!(w[0].1, w[1].0);
                assert_eq!(text[w[0].1 - 1], b'\n');
            }
            let mut all = Vec::new();
            let mut lines = 0;
            let mut out = Vec::new();
            for (a, e) in b {
                lines += parse_chunk(&text[a..e], InFormat::XDin, &mut out).unwrap();
                all.extend_from_slice(&out);
            }
            assert_eq!((all.len(), lines), (4, 4));
        }
    }

    #[test]
    fn lines_split_across_blocks() {
        // More than one text block and one batch, to cross both boundaries.
        let mut text = String::new();
        let n = BATCH * 2 + 123;
        for k in 0..n {
            text.push_str(&format!("r {:x} 4\n", k * 4));
        }
        let got = read_all(&text, InFormat::XDin).unwrap();
        assert_eq!(got.len(), n);
        assert!(got.iter().enumerate().all(|(k, x)| x.addr == k as u64 * 4));
    }
}
