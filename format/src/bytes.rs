//! Little-endian field access over untrusted bytes.
//!
//! Invariant: nothing here indexes or slices unchecked; every read goes through
//! `get`, and running past the end is a [`Error::Corrupt`] naming the field and the
//! absolute file offset of the structure being decoded.

use crate::error::{Error, Result};

/// A read cursor over one section payload.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Absolute file offset of the section (for messages).
    offset: u64,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8], offset: u64) -> Self {
        Cursor {
            bytes,
            pos: 0,
            offset,
        }
    }

    pub(crate) fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n);
        match end.and_then(|end| self.bytes.get(self.pos..end)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(Error::corrupt(
                self.offset,
                format!(
                    "payload too short for {field} ({n} bytes at payload byte {}, payload is {} bytes)",
                    self.pos,
                    self.bytes.len()
                ),
            )),
        }
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N]> {
        let s = self.take(N, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u32(&mut self, field: &str) -> Result<u32> {
        self.array(field).map(u32::from_le_bytes)
    }

    pub(crate) fn i32(&mut self, field: &str) -> Result<i32> {
        self.array(field).map(i32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, field: &str) -> Result<u64> {
        self.array(field).map(u64::from_le_bytes)
    }

    /// A byte string preceded by its u32 length.
    pub(crate) fn bytes32(&mut self, field: &str) -> Result<&'a [u8]> {
        let n = self.u32(field)?;
        let n = usize::try_from(n).map_err(|_| Error::corrupt(self.offset, "length overflow"))?;
        self.take(n, field)
    }

    /// Everything not read yet.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let rest = self.bytes.get(self.pos..).unwrap_or(&[]);
        self.pos = self.bytes.len();
        rest
    }

    /// Position inside the payload (for spans of zero-copy fields).
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Ends decoding: leftover bytes are corruption unless the file was written by a
    /// newer minor version, which may append fields readers of older minors skip.
    pub(crate) fn finish(self, kind: &str, allow_trailing: bool) -> Result<()> {
        if self.pos == self.bytes.len() || allow_trailing {
            Ok(())
        } else {
            Err(Error::corrupt(
                self.offset,
                format!(
                    "{kind} payload has {} unexpected trailing bytes",
                    self.bytes.len() - self.pos
                ),
            ))
        }
    }
}

/// Appends little-endian fields to a buffer (the writer side of [`Cursor`]).
pub(crate) trait Put {
    fn put_u32(&mut self, v: u32);
    fn put_i32(&mut self, v: i32);
    fn put_u64(&mut self, v: u64);
    fn put_bytes32(&mut self, v: &[u8]) -> Result<()>;
}

impl Put for Vec<u8> {
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_i32(&mut self, v: i32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_bytes32(&mut self, v: &[u8]) -> Result<()> {
        let n = u32::try_from(v.len())
            .map_err(|_| Error::Misuse(format!("field of {} bytes exceeds 4 GiB", v.len())))?;
        self.put_u32(n);
        self.extend_from_slice(v);
        Ok(())
    }
}

/// Reads a little-endian u32 at `at`, `None` past the end.
pub(crate) fn le_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let s = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(s.try_into().ok()?))
}

/// Reads a little-endian u16 at `at`, `None` past the end.
pub(crate) fn le_u16(bytes: &[u8], at: usize) -> Option<u16> {
    let s = bytes.get(at..at.checked_add(2)?)?;
    Some(u16::from_le_bytes(s.try_into().ok()?))
}

/// Reads a little-endian u64 at `at`, `None` past the end.
pub(crate) fn le_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let s = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(s.try_into().ok()?))
}
