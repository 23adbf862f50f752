//! The `zstd+values` chunk codec (docs/format.md, "Chunk codecs"): a data
//! trace's witness stream with its VALUE records taken out and their
//! values written as predicted differences, then zstd.
//!
//! Why: with `record --data` the 10-byte VALUE records are most of the
//! raw stream, and the recorder's time goes into scanning and compressing
//! those bytes (docs/data.md, "Where `record --data` spends its time").
//! A value is predicted by the last value recorded in the same context
//! (the stream byte before its run of VALUE records, and its place in the
//! run): a loop's address then differs from its prediction by its stride.
//!
//! Invariants: [`decode`] of [`Encoder`]'s frames gives back the raw bytes
//! exactly; the predictor state starts empty at each chunk, so chunks stay
//! independent; a malformed frame is an error, never a panic or an
//! unbounded allocation.

/// The first two bytes of a VALUE record (`[0xFF][kind]`, then the value
/// as u64 LE), as `runtime::layout` writes it.
pub const VALUE_PREFIX: [u8; 2] = [0xFF, 18];
/// A VALUE record's length.
pub const VALUE_LEN: usize = 10;
/// Places in a run of adjacent VALUE records told apart by the predictor.
const RUN: usize = 16;

/// The predictor both sides keep for one chunk.
struct Predictor {
    last: Vec<u64>,
    ctx: u8,
    run: usize,
}

impl Default for Predictor {
    fn default() -> Self {
        Predictor {
            last: vec![0; 256 * RUN],
            ctx: 0,
            run: 0,
        }
    }
}

impl Predictor {
    /// The table slot of a VALUE record `gap` bytes after the previous
    /// one (a run goes on across frames), `before` being the chunk's byte
    /// just before it.
    fn slot(&mut self, gap: usize, before: Option<u8>) -> usize {
        if gap == 0 && self.run > 0 {
            self.run = (self.run + 1).min(RUN - 1);
        } else {
            self.ctx = before.unwrap_or(0);
            self.run = 1;
        }
        usize::from(self.ctx) * RUN + self.run - 1
    }
}

/// The encoding side of one chunk: its frames one by one.
#[derive(Default)]
pub struct Encoder {
    p: Predictor,
    /// The chunk's last raw byte so far.
    before: Option<u8>,
    /// A frame's three parts, reused.
    gaps: Vec<u8>,
    deltas: Vec<u8>,
    body: Vec<u8>,
}

impl Encoder {
    /// Appends one frame for `raw` (the chunk's next bytes, whole records)
    /// to `out`; `values`: the offsets in `raw` of its VALUE records,
    /// ascending (a VALUE record left out stays in the frame's bytes).
    pub fn frame(&mut self, raw: &[u8], values: &[usize], out: &mut Vec<u8>) {
        let (gaps, deltas, body) = (&mut self.gaps, &mut self.deltas, &mut self.body);
        gaps.clear();
        deltas.clear();
        body.clear();
        let mut end = 0;
        for &at in values {
            let prev = if at == 0 {
                self.before
            } else {
                Some(raw[at - 1])
            };
            let s = self.p.slot(at - end, prev);
            let v = u64::from_le_bytes(raw[at + 2..at + VALUE_LEN].try_into().expect("8 bytes"));
            let d = v.wrapping_sub(self.p.last[s]) as i64;
            self.p.last[s] = v;
            leb(gaps, (at - end) as u64);
            leb(deltas, ((d << 1) ^ (d >> 63)) as u64);
            // Gaps are a few bytes: an inlined copy, not a memcpy call.
            body.extend(raw[end..at].iter().copied());
            end = at + VALUE_LEN;
        }
        body.extend_from_slice(&raw[end..]);
        leb(out, values.len() as u64);
        leb(out, body.len() as u64);
        out.extend_from_slice(gaps);
        out.extend_from_slice(deltas);
        out.extend_from_slice(body);
        self.before = raw.last().copied().or(self.before);
    }
}

/// The raw stream of a chunk's decompressed frames, appended to `out`;
/// `Err` names what is wrong. At most `limit` bytes are produced.
pub fn decode(mut enc: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<(), String> {
    let mut p = Predictor::default();
    let start = out.len();
    while !enc.is_empty() {
        let n = read_leb(&mut enc)? as usize;
        let rest = read_leb(&mut enc)? as usize;
        let raw = n
            .checked_mul(VALUE_LEN)
            .and_then(|v| v.checked_add(rest))
            .filter(|r| *r <= limit - (out.len() - start))
            .ok_or("a frame longer than the chunk")?;
        let (gaps, tail) = leb_run(enc, n)?;
        let (deltas, tail) = leb_run(tail, n)?;
        let body = tail.get(..rest).ok_or("a frame cut short")?;
        enc = &tail[rest..];
        frame(&mut p, (gaps, deltas, body), (n, raw, start), out)?;
    }
    Ok(())
}

/// One frame's raw bytes: `n` values, `raw` bytes in all; the chunk's
/// raw bytes start at `out[start]`.
fn frame(
    p: &mut Predictor,
    (mut gaps, mut deltas, mut body): (&[u8], &[u8], &[u8]),
    (n, raw, start): (usize, usize, usize),
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let frame_start = out.len();
    out.reserve(raw);
    for _ in 0..n {
        let gap = read_leb(&mut gaps)? as usize;
        let copied = body.get(..gap).ok_or("a gap past the frame")?;
        out.extend_from_slice(copied);
        body = &body[gap..];
        let s = p.slot(gap, out[start..].last().copied());
        let z = read_leb(&mut deltas)?;
        let d = (z >> 1) as i64 ^ -((z & 1) as i64);
        let v = p.last[s].wrapping_add(d as u64);
        p.last[s] = v;
        out.extend_from_slice(&VALUE_PREFIX);
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(body);
    debug_assert_eq!(out.len() - frame_start, raw);
    Ok(())
}

/// The first `n` LEB128 numbers of `b` as one slice, and what follows.
fn leb_run(b: &[u8], n: usize) -> Result<(&[u8], &[u8]), String> {
    let mut rest = b;
    for _ in 0..n {
        read_leb(&mut rest)?;
    }
    Ok(b.split_at(b.len() - rest.len()))
}

#[inline]
fn leb(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn read_leb(b: &mut &[u8]) -> Result<u64, String> {
    let mut v = 0u64;
    for (i, &x) in b.iter().enumerate().take(10) {
        v |= u64::from(x & 0x7f) << (7 * i);
        if x & 0x80 == 0 {
            *b = &b[i + 1..];
            return Ok(v);
        }
    }
    Err("a number cut short".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(v: u64) -> Vec<u8> {
        let mut r = VALUE_PREFIX.to_vec();
        r.extend(v.to_le_bytes());
        r
    }

    /// Frames of `batches` (each: raw bytes and VALUE offsets) decode to
    /// their concatenation.
    fn round_trip(batches: &[(Vec<u8>, Vec<usize>)]) -> usize {
        let mut e = Encoder::default();
        let (mut enc, mut raw) = (Vec::new(), Vec::new());
        for (b, at) in batches {
            e.frame(b, at, &mut enc);
            raw.extend_from_slice(b);
        }
        let mut out = vec![7];
        decode(&enc, raw.len(), &mut out).unwrap();
        assert_eq!(out[1..], raw[..]);
        assert!(decode(&enc, raw.len() - 1, &mut Vec::new()).is_err());
        enc.len()
    }

    #[test]
    fn frames_give_back_the_stream() {
        let mut a = vec![3, 4];
        a.extend(value(0x7ffd_0000_1000));
        a.extend(value(u64::MAX));
        a.push(5);
        a.extend(value(0x5555_0000_0010));
        let mut b = value(0x5555_0000_0018);
        b.extend([0xFF, 0x80 | 18, 9]);
        round_trip(&[(a, vec![2, 12, 23]), (b, vec![0]), (vec![1, 2], vec![])]);
    }

    #[test]
    fn a_strided_loop_costs_about_two_bytes_a_value() {
        let mut raw = Vec::new();
        let mut at = Vec::new();
        for i in 0..1000u64 {
            raw.push(0x21);
            at.push(raw.len());
            raw.extend(value(0x5555_1234_0000 + 8 * i));
            at.push(raw.len());
            raw.extend(value(0x7ffd_8000_0000 - 16 * i));
        }
        let n = round_trip(&[(raw, at)]);
        assert!(n < 1000 * 6, "{n} bytes for 2000 values");
    }

    #[test]
    fn malformed_frames_are_errors() {
        for bad in [
            &[1u8][..],
            &[0x80],
            &[1, 0, 0],
            &[0, 5, 1, 2],
            &[2, 0, 0, 0, 0],
        ] {
            assert!(decode(bad, 100, &mut Vec::new()).is_err(), "{bad:?}");
        }
    }
}
