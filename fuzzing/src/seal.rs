//! Traces the fuzzer can mutate: checksums recomputed after mutation
//! ([`reseal`]) and bulk data stored raw rather than zstd-compressed
//! ([`stored`]), so that a flipped byte reaches the index, the program
//! database decoder and the regenerator instead of a CRC or zstd error.
//!
//! The framing is `docs/format.md`'s: a 64-byte file header whose last
//! four bytes are the CRC-32 of the first 60, then sections of a 16-byte
//! header (kind u16, flags u16, length u32, payload CRC u32 over header
//! bytes 0..8 and the payload, header CRC u32 over bytes 0..12), the
//! payload and zero padding to a multiple of 8.

const FILE_HEADER: usize = 64;
const SECTION_HEADER: usize = 16;
const PROGRAM_DATABASE: u16 = 2;
const CHUNK: u16 = 4;
const END: u16 = 8;

/// One framed section of `bytes` at `at`: its kind and payload range, the
/// padded end clipped to the bytes there are. `None` past the last
/// complete section header.
fn section(bytes: &[u8], at: usize) -> Option<(u16, std::ops::Range<usize>, usize)> {
    let h = bytes.get(at..at.checked_add(SECTION_HEADER)?)?;
    let kind = u16::from_le_bytes([h[0], h[1]]);
    let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
    let start = at + SECTION_HEADER;
    let end = start.saturating_add(len).min(bytes.len());
    let padded = end.div_ceil(8).saturating_mul(8).min(bytes.len());
    Some((kind, start..end, padded.max(start)))
}

/// `bytes` with every checksum right and every padding byte zero, trusting
/// whatever lengths it holds: the header CRC, and each section's two CRCs
/// as far as sections can be framed (a section running past the end is
/// sealed over the payload bytes present, so its length still shows it
/// torn).
pub fn reseal(bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    if out.len() < FILE_HEADER {
        return out;
    }
    let crc = crc32fast::hash(&out[..FILE_HEADER - 4]);
    out[FILE_HEADER - 4..FILE_HEADER].copy_from_slice(&crc.to_le_bytes());
    let mut at = FILE_HEADER;
    while let Some((_, payload, padded)) = section(&out, at) {
        out[payload.end..padded].fill(0);
        let mut h = crc32fast::Hasher::new();
        h.update(&out[at..at + 8]);
        h.update(&out[payload]);
        out[at + 8..at + 12].copy_from_slice(&h.finalize().to_le_bytes());
        let hcrc = crc32fast::hash(&out[at..at + 12]);
        out[at + 12..at + 16].copy_from_slice(&hcrc.to_le_bytes());
        at = padded;
    }
    out
}

/// A well-formed trace with its zstd chunks and program databases stored
/// raw (codec 0) and END's compressed total adjusted, resealed; `None`
/// when `trace` does not frame or a zstd frame does not expand.
pub fn stored(trace: &[u8]) -> Option<Vec<u8>> {
    let mut out = trace.get(..FILE_HEADER)?.to_vec();
    let mut at = FILE_HEADER;
    let mut stored_chunk_bytes = 0u64;
    while let Some((kind, payload, padded)) = section(trace, at) {
        let mut p = trace[payload].to_vec();
        match kind {
            CHUNK => {
                expand(&mut p, 4, 16, 32)?;
                stored_chunk_bytes += (p.len() - 32) as u64;
            }
            PROGRAM_DATABASE => expand(&mut p, 8, 16, 24)?,
            END => p
                .get_mut(24..32)?
                .copy_from_slice(&stored_chunk_bytes.to_le_bytes()),
            _ => {}
        }
        out.extend_from_slice(&trace[at..at + 4]);
        out.extend_from_slice(&u32::try_from(p.len()).ok()?.to_le_bytes());
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&p);
        out.resize(out.len().div_ceil(8) * 8, 0);
        at = padded;
    }
    Some(reseal(&out))
}

/// Replaces the zstd data of a payload (codec u32 at `codec`, raw length
/// u64 at `raw_len`, data from `data`) by the bytes it expands to.
fn expand(p: &mut Vec<u8>, codec: usize, raw_len: usize, data: usize) -> Option<()> {
    if p.get(codec..codec + 4)? != 1u32.to_le_bytes() {
        return Some(());
    }
    let n = u64::from_le_bytes(p.get(raw_len..raw_len + 8)?.try_into().ok()?);
    let raw = zstd::bulk::decompress(p.get(data..)?, usize::try_from(n).ok()?).ok()?;
    p.truncate(data);
    p.extend_from_slice(&raw);
    p[codec..codec + 4].copy_from_slice(&0u32.to_le_bytes());
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aetrace_format::{
        Codec, EndReason, Error, Header, StartReason, ThreadId, ThreadStart, Trace, TraceWriter,
    };

    /// A complete trace of one thread with two zstd chunks.
    fn trace() -> Vec<u8> {
        let mut w = TraceWriter::new(Vec::new(), &Header::new("fuzz", 0).unwrap()).unwrap();
        w.thread_start(&ThreadStart {
            thread: ThreadId(0),
            parent: None,
            os_tid: 1,
            pid: 1,
            reason: StartReason::Main,
        })
        .unwrap();
        w.chunk(ThreadId(0), &[7; 300], 300).unwrap();
        w.chunk(ThreadId(0), b"witnesses", 9).unwrap();
        w.thread_end(ThreadId(0), EndReason::Exit).unwrap();
        w.finish().unwrap().0
    }

    #[test]
    fn stored_trace_reads_the_same_stream() {
        let zstd = trace();
        let raw = stored(&zstd).unwrap();
        let (a, b) = (
            Trace::parse(&zstd[..]).unwrap(),
            Trace::parse(&raw[..]).unwrap(),
        );
        assert_eq!(b.require_complete().unwrap().compressed_bytes, 309);
        let chunks = |t: &Trace<&[u8]>| -> Vec<(Codec, Vec<u8>)> {
            t.chunks(ThreadId(0))
                .map(|c| (c.meta.codec, c.decompress().unwrap()))
                .collect()
        };
        let (ca, cb) = (chunks(&a), chunks(&b));
        assert!(ca.iter().all(|c| c.0 == Codec::Zstd) && cb.iter().all(|c| c.0 == Codec::Stored));
        assert_eq!(
            ca.iter().map(|c| &c.1).collect::<Vec<_>>(),
            cb.iter().map(|c| &c.1).collect::<Vec<_>>()
        );
    }

    #[test]
    fn reseal_lets_a_damaged_payload_through_the_checksums() {
        let mut t = stored(&trace()).unwrap();
        // The last chunk's data "witnesses" ends 111 bytes before the end,
        // before THREAD_END (32 bytes), END (72) and its own padding (7).
        let in_last_chunk = t.len() - 115;
        t[in_last_chunk] ^= 0x40;
        assert!(matches!(
            Trace::parse(&t[..]),
            Err(Error::BadChecksum { .. })
        ));
        let sealed = reseal(&t);
        assert!(Trace::parse(&sealed[..]).is_ok());
        assert_eq!(reseal(&sealed), sealed);
    }
}
