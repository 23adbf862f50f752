//! The values chunk codecs (docs/format.md, "CHUNK"): a data trace's
//! witness stream with its VALUE records taken out and their values
//! written as predicted differences, then zstd. Codec 3, `zstd+split`
//! (format 1.9), is written; codec 2, `zstd+values` (1.8), is still read.
//!
//! Why: with `record --data` the 10-byte VALUE records are most of the
//! raw stream, and the recorder's time goes into scanning and compressing
//! those bytes (docs/data.md, "Where `record --data` spends its time").
//! A value is predicted by the last value recorded in the same context
//! (the stream byte before its run of VALUE records, and its place in the
//! run): a loop's address then differs from its prediction by its stride.
//! Codec 3 compresses the gaps, the deltas' byte planes and the other
//! bytes as separate zstd frames (docs/data.md, "Values by plane", has
//! the alternatives measured).
//!
//! Invariants: [`decode_split`] of [`Encoder`]'s chunk gives back the raw bytes
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
    at: Place,
}

impl Default for Predictor {
    fn default() -> Self {
        Predictor {
            last: vec![0; 256 * RUN],
            at: Place::default(),
        }
    }
}

/// Where the predictor is: the context byte of the current run of
/// values and the place in it. Copied into the encoder's loop (locals
/// stay in registers; fields behind `&mut self` are reloaded after every
/// byte written).
#[derive(Clone, Copy, Default)]
struct Place {
    ctx: u8,
    run: usize,
}

impl Place {
    /// The table slot of a VALUE record `gap` bytes after the previous
    /// one (a run goes on across frames), `before` being the chunk's byte
    /// just before it.
    fn slot(&mut self, gap: usize, before: u8) -> usize {
        // Selects, not branches: whether a value continues a run is data.
        let cont = gap == 0 && self.run > 0;
        self.run = if cont { (self.run + 1).min(RUN - 1) } else { 1 };
        self.ctx = if cont { self.ctx } else { before };
        usize::from(self.ctx) * RUN + self.run - 1
    }
}

/// Codec 3's parts, in their stored order: the gaps, the three planes of
/// the deltas (each delta's first LEB128 byte, its second, the rest), the
/// bytes between values.
pub const PARTS: usize = 5;
const GAPS: usize = 0;
const PLANES: usize = 1;
const BODY: usize = 4;

/// The encoding side of one codec-3 chunk: batches in, then the chunk.
#[derive(Default)]
pub struct Encoder {
    p: Predictor,
    /// The chunk's last raw byte so far (0 before its first).
    before: u8,
    /// Raw bytes since the chunk's last value (or its start): the next
    /// value's gap begins with them.
    since: usize,
    values: u64,
    /// Each part's buffer, zero-filled once to the most a batch can add
    /// and reused from chunk to chunk; the first `used` bytes are the
    /// chunk's. The loop writes at cursors held in registers: pushing to
    /// a `Vec` stores and reloads its length for every byte.
    parts: [Vec<u8>; PARTS],
    used: [usize; PARTS],
}

impl Encoder {
    /// Takes the chunk's next bytes `raw` (whole records); `values`: the
    /// offsets in `raw` of its VALUE records, ascending (a VALUE record
    /// left out stays in the body).
    pub fn push(&mut self, raw: &[u8], values: &[usize]) {
        let n = values.len();
        // The most each part can take: a gap's 10 LEB128 bytes, a delta's
        // first and second byte and its rest (at most 8), the bytes
        // between values (+ 8: a gap's copy writes 8).
        let other = raw.len().saturating_sub(n * VALUE_LEN);
        let room = [10 * n, n, n, 8 * n, other + 8];
        for ((b, u), r) in self.parts.iter_mut().zip(self.used).zip(room) {
            if b.len() < u + r {
                b.resize(u + r, 0);
            }
        }
        // Slices, not the `Vec`s: a byte stored through a `Vec`'s buffer
        // might be its own pointer or length to the compiler, which then
        // reloads both after every byte (8-9% of this function's thread
        // CPU, docs/data.md "Where `record --data` spends its time").
        let [gaps, p0, p1, p2, body] = self.parts.each_mut().map(|b| &mut b[..]);
        let [mut ig, mut i0, mut i1, mut i2, mut ib] = self.used;
        let (last, mut place) = (&mut self.p.last[..], self.p.at);
        let (mut end, mut since, before) = (0, self.since, self.before);
        for &at in values {
            let prev = if at == 0 { before } else { raw[at - 1] };
            let gap = since + at - end;
            since = 0;
            let s = place.slot(gap, prev);
            let v = u64::from_le_bytes(raw[at + 2..at + VALUE_LEN].try_into().expect("8 bytes"));
            let d = v.wrapping_sub(last[s]) as i64;
            last[s] = v;
            ig = put_leb_short(gaps, ig, gap as u64);
            let z = ((d << 1) ^ (d >> 63)) as u64;
            [i0, i1, i2] = split_leb([p0, p1, p2], [i0, i1, i2], z);
            ib = copy_gap(body, ib, &raw[end..], at - end);
            end = at + VALUE_LEN;
        }
        let tail = &raw[end..];
        body[ib..ib + tail.len()].copy_from_slice(tail);
        self.used = [ig, i0, i1, i2, ib + tail.len()];
        self.p.at = place;
        self.since = since + tail.len();
        self.values += n as u64;
        self.before = raw.last().copied().unwrap_or(self.before);
    }

    /// Appends the chunk's stored bytes to `out`, each part compressed by
    /// `z`, and starts the next chunk.
    pub fn finish(
        &mut self,
        z: &mut zstd::bulk::Compressor<'_>,
        out: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        let mut packed: [Vec<u8>; PARTS] = Default::default();
        for ((part, p), u) in packed.iter_mut().zip(&self.parts).zip(self.used) {
            *part = z.compress(&p[..u])?;
        }
        leb(out, self.values);
        for p in &packed {
            leb(out, p.len() as u64);
        }
        for p in &packed {
            out.extend_from_slice(p);
        }
        self.p = Predictor::default();
        self.before = 0;
        self.since = 0;
        self.values = 0;
        self.used = [0; PARTS];
        Ok(())
    }
}

/// Copies `raw[..n]` to `body[at..]`, where `raw` has at least `n + 8`
/// bytes (a VALUE record follows) and `body` room for `n + 8`; returns
/// the cursor after it. Gaps are short (gzip 2 MB: 32 MB of its 611 MB
/// raw stream lie between its 57.9 M values): one 8-byte copy, no loop
/// whose length is data.
#[inline]
fn copy_gap(body: &mut [u8], at: usize, raw: &[u8], n: usize) -> usize {
    if n <= 8 {
        body[at..at + 8].copy_from_slice(&raw[..8]);
    } else {
        body[at..at + n].copy_from_slice(&raw[..n]);
    }
    at + n
}

/// Writes `v` as LEB128 spread over three planes at their cursors: its
/// first byte, its second, the rest (the planes differ in statistics, so
/// zstd codes them apart better: 5-9% smaller on gzip's and bzip2's
/// values); returns the cursors after it. The second byte is written
/// always and kept by moving its cursor or not: one branch fewer.
#[inline]
fn split_leb([p0, p1, p2]: [&mut [u8]; 3], [i0, i1, i2]: [usize; 3], v: u64) -> [usize; 3] {
    let more = |bits: u32| u8::from(v >> bits != 0) << 7;
    p0[i0] = v as u8 & 0x7f | more(7);
    p1[i1] = (v >> 7) as u8 & 0x7f | more(14);
    let i2 = if v >> 14 != 0 {
        put_leb(p2, i2, v >> 14)
    } else {
        i2
    };
    [i0 + 1, i1 + usize::from(v >> 7 != 0), i2]
}

/// [`put_leb`] with the one-byte case first: nearly every gap (gzip
/// 2 MB: 34,518,591 gap bytes for 34,518,392 values), which the loop
/// otherwise enters and leaves by a second test.
#[inline]
fn put_leb_short(out: &mut [u8], at: usize, v: u64) -> usize {
    if v < 0x80 {
        out[at] = v as u8;
        return at + 1;
    }
    put_leb(out, at, v)
}

/// Writes `v` as LEB128 at `out[at..]`; returns the cursor after it.
#[inline]
fn put_leb(out: &mut [u8], mut at: usize, mut v: u64) -> usize {
    while v >= 0x80 {
        out[at] = v as u8 | 0x80;
        v >>= 7;
        at += 1;
    }
    out[at] = v as u8;
    at + 1
}

/// Reads one number written by [`split_leb`].
fn read_split_leb(planes: &mut [&[u8]; 3]) -> Result<u64, String> {
    let mut v = 0u64;
    for i in 0..10 {
        let plane = &mut planes[i.min(2)];
        let (&x, rest) = plane.split_first().ok_or("a delta cut short")?;
        *plane = rest;
        v |= u64::from(x & 0x7f) << (7 * i);
        if x & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("a delta too long".into())
}

/// Decompresses one stored part (at most the given size) into a buffer.
pub type Unzstd<'a> = dyn FnMut(&[u8], usize, &mut Vec<u8>) -> Result<(), String> + 'a;

/// The raw stream of a codec-3 chunk, appended to `out`, at most `limit`
/// bytes; `parts`: reused buffers; `unzstd(stored, cap, into)`
/// decompresses one part (at most `cap` bytes) into a cleared buffer.
/// `Err` names what is wrong.
pub fn decode_split(
    mut enc: &[u8],
    limit: usize,
    out: &mut Vec<u8>,
    parts: &mut [Vec<u8>; PARTS],
    unzstd: &mut Unzstd<'_>,
) -> Result<(), String> {
    let n = read_leb(&mut enc)? as usize;
    let valued = n
        .checked_mul(VALUE_LEN)
        .filter(|v| *v <= limit)
        .ok_or("more values than the chunk holds")?;
    let mut lens = [0usize; PARTS];
    for l in &mut lens {
        *l = read_leb(&mut enc)? as usize;
    }
    if lens.iter().try_fold(0usize, |a, l| a.checked_add(*l)) != Some(enc.len()) {
        return Err("part lengths do not add up to the chunk".into());
    }
    // Each part's largest decompressed size: a gap or a delta takes at
    // most 10 LEB128 bytes; the body is what the values leave.
    let caps = [10 * n, n, n, 8 * n, limit - valued];
    for ((part, len), cap) in parts.iter_mut().zip(lens).zip(caps) {
        let (stored, rest) = enc.split_at(len);
        unzstd(stored, cap, part)?;
        enc = rest;
    }
    let mut gaps = &parts[GAPS][..];
    let mut planes = [
        &parts[PLANES][..],
        &parts[PLANES + 1][..],
        &parts[PLANES + 2][..],
    ];
    let next = || Ok((read_leb(&mut gaps)? as usize, read_split_leb(&mut planes)?));
    let start = out.len();
    expand(
        &mut Predictor::default(),
        n,
        next,
        &parts[BODY],
        (start, out),
    )?;
    if !gaps.is_empty() || planes.iter().any(|p| !p.is_empty()) {
        return Err("gaps or deltas left over".into());
    }
    Ok(())
}

/// The raw stream of a codec-2 chunk's decompressed frames (format 1.8),
/// appended to `out`; `Err` names what is wrong. At most `limit` bytes
/// are produced.
pub fn decode(mut enc: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<(), String> {
    let mut p = Predictor::default();
    let start = out.len();
    while !enc.is_empty() {
        let n = read_leb(&mut enc)? as usize;
        let rest = read_leb(&mut enc)? as usize;
        n.checked_mul(VALUE_LEN)
            .and_then(|v| v.checked_add(rest))
            .filter(|r| *r <= limit - (out.len() - start))
            .ok_or("a frame longer than the chunk")?;
        let (mut gaps, tail) = leb_run(enc, n)?;
        let (mut deltas, tail) = leb_run(tail, n)?;
        let body = tail.get(..rest).ok_or("a frame cut short")?;
        enc = &tail[rest..];
        let next = || Ok((read_leb(&mut gaps)? as usize, read_leb(&mut deltas)?));
        expand(&mut p, n, next, body, (start, out))?;
    }
    Ok(())
}

/// `n` values and the bytes around them, appended to `out`: `next`
/// gives each value's gap and zigzag delta, `body` the other bytes; the
/// chunk's raw bytes start at `out[start]` (a value's context may be a
/// byte of an earlier frame).
fn expand(
    p: &mut Predictor,
    n: usize,
    mut next: impl FnMut() -> Result<(usize, u64), String>,
    mut body: &[u8],
    (start, out): (usize, &mut Vec<u8>),
) -> Result<(), String> {
    out.reserve(n * VALUE_LEN + body.len());
    for _ in 0..n {
        let (gap, z) = next()?;
        let copied = body.get(..gap).ok_or("a gap past the body")?;
        out.extend_from_slice(copied);
        body = &body[gap..];
        let s = p.at.slot(gap, out[start..].last().copied().unwrap_or(0));
        let d = (z >> 1) as i64 ^ -((z & 1) as i64);
        let v = p.last[s].wrapping_add(d as u64);
        p.last[s] = v;
        out.extend_from_slice(&VALUE_PREFIX);
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(body);
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

/// Appends `v` as LEB128 to `out`.
fn leb(out: &mut Vec<u8>, v: u64) {
    let mut b = [0; 10];
    let n = put_leb(&mut b, 0, v);
    out.extend_from_slice(&b[..n]);
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
    use proptest::prelude::*;

    fn value(v: u64) -> Vec<u8> {
        let mut r = VALUE_PREFIX.to_vec();
        r.extend(v.to_le_bytes());
        r
    }

    fn unzstd(stored: &[u8], cap: usize, out: &mut Vec<u8>) -> Result<(), String> {
        *out = zstd::bulk::decompress(stored, cap).map_err(|e| e.to_string())?;
        Ok(())
    }

    fn decode_split(enc: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<(), String> {
        super::decode_split(enc, limit, out, &mut Default::default(), &mut unzstd)
    }

    /// The stored chunks of `chunks` (each: batches of raw bytes and
    /// VALUE offsets), one encoder for all, each decoded and checked
    /// against its batches' concatenation; the stored sizes.
    fn round_trip(chunks: &[Vec<(Vec<u8>, Vec<usize>)>]) -> Vec<usize> {
        let mut e = Encoder::default();
        let mut z = zstd::bulk::Compressor::new(1).unwrap();
        let mut sizes = Vec::new();
        for batches in chunks {
            let (mut enc, mut raw) = (Vec::new(), Vec::new());
            for (b, at) in batches {
                e.push(b, at);
                raw.extend_from_slice(b);
            }
            e.finish(&mut z, &mut enc).unwrap();
            let mut out = vec![7];
            decode_split(&enc, raw.len(), &mut out).unwrap();
            assert_eq!(out[1..], raw[..]);
            if !raw.is_empty() {
                let short = decode_split(&enc, raw.len() - 1, &mut Vec::new());
                assert!(short.is_err());
            }
            sizes.push(enc.len());
        }
        sizes
    }

    #[test]
    fn chunks_give_back_the_stream() {
        let mut a = vec![3, 4];
        a.extend(value(0x7ffd_0000_1000));
        a.extend(value(u64::MAX));
        a.push(5);
        a.extend(value(0x5555_0000_0010));
        let mut b = value(0x5555_0000_0018);
        b.extend([0xFF, 0x80 | 18, 9]);
        let one = vec![(a, vec![2, 12, 23]), (b, vec![0]), (vec![1, 2], vec![])];
        round_trip(&[one.clone(), vec![], one]);
    }

    #[test]
    fn a_strided_loop_costs_about_a_byte_a_value() {
        let mut raw = Vec::new();
        let mut at = Vec::new();
        for i in 0..1000u64 {
            raw.push(0x21);
            at.push(raw.len());
            raw.extend(value(0x5555_1234_0000 + 8 * i));
            at.push(raw.len());
            raw.extend(value(0x7ffd_8000_0000 - 16 * i));
        }
        let n = round_trip(&[vec![(raw, at)]])[0];
        assert!(n < 2000, "{n} bytes for 2000 values");
    }

    /// A codec-2 frame (format 1.8) written by hand: one witness, then a
    /// run of two values, each the first of its context (predicted 0).
    #[test]
    fn codec_2_frames_still_decode() {
        let frame = [2, 1, 1, 0, 10, 6, 0x21];
        let mut want = vec![0x21];
        want.extend(value(5));
        want.extend(value(3));
        let mut out = Vec::new();
        decode(&frame, want.len(), &mut out).unwrap();
        assert_eq!(out, want);
        assert!(decode(&frame, want.len() - 1, &mut Vec::new()).is_err());
    }

    #[test]
    fn malformed_chunks_are_errors() {
        for bad in [
            &[1u8][..],
            &[0x80],
            &[1, 0, 0],
            &[0, 5, 1, 2],
            &[2, 0, 0, 0, 0],
        ] {
            assert!(decode(bad, 100, &mut Vec::new()).is_err(), "{bad:?}");
            let split = decode_split(bad, 100, &mut Vec::new());
            assert!(split.is_err(), "{bad:?}");
        }
        // Lengths that add up, parts that are not zstd.
        let bad = [1, 1, 1, 1, 1, 1, 9, 9, 9, 9, 9];
        assert!(decode_split(&bad, 100, &mut Vec::new()).is_err());
    }

    /// A stream item: a witness, a VALUE record, or another record (RETURN).
    fn item() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            (1u8..=0xFE).prop_map(|w| vec![w]),
            any::<u64>().prop_map(value),
            // Values near a few sites' last values: small deltas.
            (0u64..4, -300i64..300).prop_map(|(site, d)| value(
                (0x5555_0000_0000 + site * 0x1000).wrapping_add(d as u64)
            )),
            Just(vec![0xFF, 10]),
        ]
    }

    proptest! {
        /// Any stream of witnesses, records and values, cut into batches
        /// at any record boundaries and into chunks, comes back exactly.
        #[test]
        fn any_stream_round_trips(
            chunks in prop::collection::vec(
                prop::collection::vec(prop::collection::vec(item(), 0..40), 0..6),
                1..4,
            )
        ) {
            let chunks: Vec<Vec<(Vec<u8>, Vec<usize>)>> = chunks
                .into_iter()
                .map(|batches| {
                    batches
                        .into_iter()
                        .map(|items| {
                            let (mut raw, mut at) = (Vec::new(), Vec::new());
                            for it in items {
                                if it.len() == VALUE_LEN {
                                    at.push(raw.len());
                                }
                                raw.extend(it);
                            }
                            (raw, at)
                        })
                        .collect()
                })
                .collect();
            round_trip(&chunks);
        }
    }
}
