//! `aetrace regen --format lackey|xdin --data`: the instruction *and* data
//! trace of a `record --data` run (issue 21, points 3-5). The walk is
//! `regen::visit`'s (the executed blocks, per thread, identical for any
//! `-j`); each instruction's references come from `analysis::addr::forms`
//! (kind and size as lackey counts them) and their addresses from
//! `analysis::addr::exec`, the abstract execution the rewriter placed the
//! thread's VALUE records by: static ones from the instruction, the others
//! recomputed from known registers or read from the records in order.
//! With `--check` (MODULE flag `DATA_CHECK`) every non-static address was
//! also recorded in full after those: each recomputed address is compared
//! with it, and the first difference is an error naming the procedure,
//! block, instruction and both addresses.
//!
//! Output: `lackey` is valgrind lackey's text (`I  %08lx,%lu`, then ` L`,
//! ` S`, ` M` lines with `%08lx,%lu`); a `rep` string instruction is one
//! `I` per iteration plus one for the final `rcx == 0` test, as lackey
//! prints it. `xdin` is `i ADDR LEN`, `r ADDR SIZE`, `w ADDR SIZE` (hex; a
//! read-modify-write is `r` then `w`). Both are a [`Sink`] of the walk;
//! `aetrace cachesim TRACE` is another ([`walk`]).
//!
//! Invariants: every value of a thread is used exactly once (too few or
//! too many is an error naming the thread); a module rewritten without
//! `--data` is refused, never printed without its references; a block
//! that inherits known registers (`exec::entry_knowledge`) is entered only
//! by one of the ways the analysis assumed (`exec::WayIn`: right after a
//! plain predecessor, after a `ret` of the callee of the call it returns
//! from, after a call whose callee runs no traced code or is a leaf with
//! the state that call block left (only PLT stub blocks, `exec::
//! passes_through`, or the leaves' blocks ending with a `ret` ran
//! between), or at a procedure entry with `rsp` from the direct call or jump
//! before it, or from the outside-entry stub's VALUE right after its
//! ENTER, `exec::Entered`), else an error naming procedure and block.
//! Whether the run before is a plain way in is a fact of that run and the
//! block: each block keeps the last run before that passed
//! (`Entry::plain_after`), and a run after it again is not checked.
//! A signal handler's values sit among the interrupted instruction's
//! (`signals`). The control walk (`Visit::run`, with summarised segments:
//! one step per witness) runs on its own thread, a few batches ahead; the
//! data walk runs a segment's blocks whole, as the runs they stand for.
//! The data walk's error stops it and comes first. A whole run of a
//! block runs the block's flat code (`exec::code::flat`) on the thread's
//! plain registers ([`Regs`]), straight into the sink's records of the
//! run when it keeps them ([`Sink::whole`]: `bin`, `cachesim`; no list
//! of addresses between); a run from a block's middle, a block with
//! a `rep` or a refused instruction, and `--check` run the compiled code
//! on the interpreter's state made from them. A summarised segment whose
//! blocks after the first were each entered plainly from the one before
//! (a fact of the two blocks) runs, from its second run on, as one
//! program ([`Sink::segment_code`]): its blocks' records and flat code
//! chained, one way-in check (none after a run before that passed it),
//! one copy and one pass, the same records written at the same points.
//! The runs the control walk gives one by one right after a segment (the
//! calls, PLT stubs and returns a witness passes) join its program when
//! the same runs, entered the same ways, followed it twice in a row
//! ([`Chain`]); a run of the segment takes that program when the batch's
//! next records are those runs'.

// (A path the `cachesim` binary, which includes this file by its path, finds too.)
#[path = "dataout/pieces.rs"]
pub mod pieces;
#[path = "dataout/signals.rs"]
mod signals;
#[path = "dataout/state.rs"]
mod state;

use std::cell::Cell;
use std::io::Write;
use std::path::Path;
use std::rc::Rc;
use std::sync::mpsc;

use aetrace_analysis::addr::exec::code::flat::{FlatCode, Regs};
use aetrace_analysis::addr::exec::code::{BlockAddrs, BlockCode, InsnCode, RefCode};
use aetrace_analysis::addr::exec::{self, Entered, Exec, InsnAddrs, WayIn};
use aetrace_analysis::addr::full::{self, Recorded, DF};
use aetrace_analysis::addr::returns::Returns;
use aetrace_analysis::addr::{forms, Access, Gpr, InsnProgram, RegSet};
use aetrace_format::addrtrace::{AccessKind, AddrRecord, ADDRESS_LIMIT};
use aetrace_format::progdb::ProgramDb;
use aetrace_format::section::module_flags;
use aetrace_format::{ModuleId, ThreadId, Trace};
use aetrace_regen::compile::{push_dec, push_hex, push_hex_min, BlockIx, Module};
use aetrace_regen::index::StateIndex;
use aetrace_regen::visit::{BlockRun, Event, Runs, Segment, Step, Steps, Visit};
use aetrace_regen::DataItem;
use iced_x86::{Decoder, DecoderOptions, Instruction, InstructionInfoFactory};

/// The two data-trace formats.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DataFormat {
    /// valgrind lackey's `--trace-mem=yes` text.
    Lackey,
    /// Extended din with `r`/`w` lines.
    Xdin,
    /// The `bin` address trace (`format::addrtrace`): a fetch record per
    /// instruction, a read and a write record per read-modify-write.
    Bin,
}

type Error = Box<dyn std::error::Error>;

/// The walk's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where the walk's references go, in program order.
pub trait Sink {
    /// The trace's modules, which [`BlockRun::module`] indexes, before
    /// any reference.
    fn modules(&mut self, _: &[Module]) {}
    /// A run of a block starts: its instructions follow.
    fn run(&mut self, _: BlockRun) {}
    /// An executed instruction, the `k`-th of its block (each iteration
    /// of a `rep` string instruction, and its final `rcx == 0` test, is
    /// one).
    fn insn(&mut self, k: u32, addr: u64, len: u32) -> Result<(), Error>;
    /// A data reference of the instruction given last.
    fn data(&mut self, access: Access, addr: u64, size: u32) -> Result<(), Error>;
    /// The first `n` instructions of `code` ran, the run's instructions
    /// from `first` of its block, with `out`'s references: each
    /// instruction and its references in turn ([`Sink::insn`],
    /// [`Sink::data`]); `base`: the module's load bias.
    #[inline]
    fn block(
        &mut self,
        first: u32,
        code: (&BlockCode, usize),
        base: u64,
        out: &BlockAddrs,
    ) -> Result<(), Error> {
        each_insn(self, first, code, base, out)
    }
    /// A whole run `r` of a block with flat code (`code`, `flat`; load
    /// bias `base`): a sink with its own records of such a run runs
    /// the flat code into them itself ([`FlatCode::run_into`], on the
    /// thread's `regs`, values from `take`), no list of addresses between;
    /// [`Whole::Not`] (the default) leaves the run to the flat code and
    /// [`Sink::block`].
    #[inline]
    fn whole<T: FnMut(Recorded) -> Result<u64, String>>(
        &mut self,
        _r: BlockRun,
        _code: (&BlockCode, &FlatCode),
        _base: u64,
        _regs: &mut Regs,
        _take: &mut T,
    ) -> Result<Whole, Error> {
        Ok(Whole::Not)
    }
    /// Makes program `id` of a summarised segment: the whole runs of
    /// `links`' blocks (of module `m`, its index) one after the other,
    /// from the records and placed flat code this sink keeps of each
    /// ([`Sink::whole`]) chained into one list, each block's code after
    /// its link's move of `rsp` ([`Link`]), so that a run of the segment
    /// is one copy and one pass. Whether it did (the default: no, the walk
    /// runs the blocks one by one).
    #[cold]
    fn segment_code(&mut self, _id: usize, _m: (&Module, u32), _links: &[Link]) -> bool {
        false
    }
    /// Runs segment program `id` (made by [`Sink::segment_code`]) on the
    /// thread's `regs`, values from `take`, as the runs of its blocks one
    /// by one would: the same records, written at the same points;
    /// [`Segmented::Not`] when it cannot now (its records would cross the
    /// sink's next write), nothing taken.
    #[inline]
    fn run_segment<T: FnMut(Recorded) -> Result<u64, String>>(
        &mut self,
        _id: usize,
        _regs: &mut Regs,
        _take: &mut T,
    ) -> Result<Segmented, Error> {
        Ok(Segmented::Not)
    }
}

/// A block of a segment program ([`Sink::segment_code`]) and what the
/// way into it does to `rsp` beside the blocks' code (added, wrapping:
/// [`Edge::Call`]'s -8, the +8 of an [`Edge::Back`] past a PLT stub, else
/// 0).
#[derive(Copy, Clone, Debug)]
pub struct Link {
    /// The block.
    pub block: BlockIx,
    /// Added to `rsp` before it runs.
    pub rsp: u64,
}

/// What [`Sink::run_segment`] did.
pub enum Segmented {
    /// It ran the segment's blocks and took their references.
    Ran,
    /// The flat code stopped at instruction `k` of the segment's `block`-th
    /// block, and why; the records of the blocks before it taken, none of
    /// its own.
    Failed {
        /// The block, by its place in the segment.
        block: usize,
        /// The instruction, by its index in the block.
        k: usize,
        /// Why.
        why: String,
    },
    /// Nothing: the walk runs the blocks one by one.
    Not,
}

/// A summarised segment's whole runs chained into one program (a sink's
/// [`Sink::segment_code`]): the records of its blocks' runs in order,
/// each address left 0, and their placed flat code chained, each
/// address put in its records; where each block's instructions and
/// records start, for an error's block and the records kept before it.
pub struct SegCode<W> {
    /// The records of a whole run of the segment.
    pub recs: Vec<W>,
    /// The blocks' flat code, one after the other.
    pub flat: FlatCode,
    /// Per block: its first instruction and its first record.
    starts: Vec<(usize, usize)>,
    /// The instructions so far.
    insns: usize,
}

impl<W> Default for SegCode<W> {
    fn default() -> Self {
        SegCode {
            recs: Vec::new(),
            flat: FlatCode::empty(),
            starts: Vec::new(),
            insns: 0,
        }
    }
}

impl<W: Copy> SegCode<W> {
    /// Appends `link`'s block of `ninsns` instructions: `extra` (records
    /// its run sends before its own when it follows the block before),
    /// then its records from `from` on (the sink folded those before into
    /// `extra`; none has an address) and its flat code placed in them,
    /// after the link's move of `rsp`; `None` if the chain is too long for
    /// the flat code's numbers.
    pub fn push(
        &mut self,
        extra: &[W],
        (recs, flat): (&[W], &FlatCode),
        (from, link): (usize, Link),
        ninsns: u32,
    ) -> Option<()> {
        self.starts.push((self.insns, self.recs.len()));
        if link.rsp != 0 {
            self.flat.move_rsp(link.rsp);
        }
        self.recs.extend_from_slice(extra);
        let at = u32::try_from(self.recs.len().checked_sub(from)?).ok()?;
        self.flat.chain(flat, self.insns, at)?;
        self.recs.extend_from_slice(&recs[from..]);
        self.insns += ninsns as usize;
        Some(())
    }

    /// The block (its place in the segment) and the instruction in it of
    /// the chain's instruction `k`.
    pub fn insn(&self, k: usize) -> (usize, usize) {
        let b = self.starts.partition_point(|&(i, _)| i <= k) - 1;
        (b, k - self.starts[b].0)
    }

    /// The block whose records hold record `p` of the chain.
    pub fn block_of(&self, p: usize) -> usize {
        self.starts.partition_point(|&(_, r)| r <= p) - 1
    }

    /// Where block `b`'s records start (its `extra` ones first).
    pub fn records_of(&self, b: usize) -> usize {
        self.starts[b].1
    }
}

/// What [`Sink::whole`] did with a run.
pub enum Whole {
    /// It ran the flat code and took the run's references.
    Ran,
    /// The flat code stopped at an instruction (its index in the block)
    /// and why; nothing of the run was taken.
    Failed(usize, String),
    /// Nothing: the walk runs the flat code and gives [`Sink::block`] the run.
    Not,
}

/// [`Sink::block`] an instruction at a time (its default, and the way
/// for runs a sink does not take whole).
#[inline(always)]
pub fn each_insn<S: Sink + ?Sized>(
    sink: &mut S,
    first: u32,
    (code, n): (&BlockCode, usize),
    base: u64,
    out: &BlockAddrs,
) -> Result<(), Error> {
    let (mut at, mut reps) = (0, out.reps.iter().peekable());
    for k in 0..n {
        let refs = code.refs(k);
        let addrs = &out.addrs[at..at + refs.len()];
        at += refs.len();
        let rep = reps.next_if(|r| r.0 as usize == k).map(|r| (r.1, r.2));
        feed(
            sink,
            first + k as u32,
            (&code.insns[k], base),
            (refs, addrs),
            rep,
        )?;
    }
    Ok(())
}

/// Gives instruction `c` (the `at`-th of its block; `base`: its module's
/// load bias) and its references to `sink`: a `rep` string instruction
/// (`rcx` and `rflags` before it) once per iteration, its pointers
/// advancing by the size each, and once more for the final test.
#[inline(always)]
fn feed<S: Sink + ?Sized>(
    sink: &mut S,
    at: u32,
    (c, base): (&InsnCode, u64),
    (refs, addrs): (&[RefCode], &[u64]),
    rep: Option<(u64, u64)>,
) -> Result<(), Error> {
    let ip = base.wrapping_add(c.ip);
    let Some(rep) = rep else {
        sink.insn(at, ip, c.len)?;
        for (r, &a) in refs.iter().zip(addrs) {
            sink.data(r.access, a, r.size)?;
        }
        return Ok(());
    };
    iterations(sink, at, (c, base), (refs, addrs), rep)?;
    sink.insn(at, ip, c.len)
}

/// The first `count` iterations of a `rep` string instruction (`flags`
/// its `rflags`: the direction), each its fetch and references, without
/// the final fetch that finds `rcx` zero.
fn iterations<S: Sink + ?Sized>(
    sink: &mut S,
    at: u32,
    (c, base): (&InsnCode, u64),
    (refs, addrs): (&[RefCode], &[u64]),
    (count, flags): (u64, u64),
) -> Result<(), Error> {
    let ip = base.wrapping_add(c.ip);
    let dir: i64 = if flags & DF != 0 { -1 } else { 1 };
    for n in 0..count {
        sink.insn(at, ip, c.len)?;
        for (r, &a) in refs.iter().zip(addrs) {
            let step = (n as i64).wrapping_mul(dir).wrapping_mul(i64::from(r.size)) as u64;
            sink.data(r.access, a.wrapping_add(step), r.size)?;
        }
    }
    Ok(())
}

/// The two text formats as a sink: lines formatted into `buf` by hand
/// and written to `out` in blocks ([`Text::flush`] at the end of a walk
/// or piece). A `writeln!` per line was about half of `regen --format
/// lackey`'s CPU time (perf, 2026-12-02).
struct Text<'o> {
    /// Lackey's text, else extended din.
    lackey: bool,
    buf: Vec<u8>,
    out: &'o mut dyn Write,
}

/// Bytes [`Text`] gathers before it writes them.
const TEXT_BUFFER: usize = 1 << 16;

impl<'o> Text<'o> {
    fn new(lackey: bool, out: &'o mut dyn Write) -> Self {
        let buf = Vec::with_capacity(TEXT_BUFFER + 128);
        Text { lackey, buf, out }
    }

    /// Writes the lines gathered so far.
    fn flush(&mut self) -> Result<(), Error> {
        self.out.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    /// Room for the next line: the buffer written out when full.
    #[inline]
    fn room(&mut self) -> Result<&mut Vec<u8>, Error> {
        if self.buf.len() >= TEXT_BUFFER {
            self.flush()?;
        }
        Ok(&mut self.buf)
    }
}

/// Appends `letter ADDR SIZE\n` in extended din (both in hex).
fn din_line(b: &mut Vec<u8>, letter: &[u8], addr: u64, size: u64) {
    b.extend_from_slice(letter);
    push_hex(b, addr);
    b.push(b' ');
    push_hex(b, size);
    b.push(b'\n');
}

/// Appends `prefix ADDR,SIZE\n` as lackey prints it (`%08lx,%lu`).
fn lackey_line(b: &mut Vec<u8>, prefix: &[u8], addr: u64, size: u64) {
    b.extend_from_slice(prefix);
    push_hex_min(b, addr, 8);
    b.push(b',');
    push_dec(b, size);
    b.push(b'\n');
}

impl Sink for Text<'_> {
    fn insn(&mut self, _: u32, ip: u64, len: u32) -> Result<(), Error> {
        let lackey = self.lackey;
        let b = self.room()?;
        match lackey {
            true => lackey_line(b, b"I  ", ip, len.into()),
            false => din_line(b, b"i ", ip, len.into()),
        }
        Ok(())
    }

    fn data(&mut self, access: Access, a: u64, s: u32) -> Result<(), Error> {
        let lackey = self.lackey;
        let b = self.room()?;
        let s = u64::from(s);
        match (lackey, access) {
            (true, acc) => lackey_line(b, &[b' ', acc.letter() as u8, b' '], a, s),
            (false, Access::Load) => din_line(b, b"r ", a, s),
            (false, Access::Store) => din_line(b, b"w ", a, s),
            (false, Access::Modify) => {
                din_line(b, b"r ", a, s);
                din_line(b, b"w ", a, s);
            }
        }
        Ok(())
    }
}

/// The `bin` format as a sink: records encoded straight into a buffer of
/// their bytes ([`Records`]); a whole run of a block with flat code by
/// the block's encoded records, copied, its flat code then putting each
/// data address into its records ([`Sink::whole`]).
struct Bin<'o> {
    records: Records<'o>,
    /// Per module, per block, built at its first whole run: its records,
    /// or `None` if one cannot be encoded (the per-instruction path then
    /// says why).
    words: Vec<Vec<Option<Option<Words>>>>,
    /// Per segment program number ([`Sink::segment_code`]).
    segs: Vec<Option<SegCode<[u8; 8]>>>,
}

/// Encoded records (little-endian) written a megabyte at a time.
struct Records<'o> {
    out: &'o mut dyn Write,
    /// The first `len` records are not written yet.
    buf: Vec<[u8; 8]>,
    len: usize,
}

/// A whole run's records ([`Bin`]): each encoded, a data record's
/// address bits 0, and the block's flat code placing each address in
/// its records (a read-modify-write's in its read and its write).
struct Words {
    words: Vec<[u8; 8]>,
    flat: FlatCode,
}

impl Words {
    /// The records of a whole run of `code` (load bias `base`) and its
    /// flat code `flat`.
    fn new(code: &BlockCode, flat: &FlatCode, base: u64) -> Option<Words> {
        let (mut words, mut at) = (Vec::new(), Vec::new());
        for (k, c) in code.insns.iter().enumerate() {
            let fetch = AddrRecord::encode(AccessKind::Instr, base.wrapping_add(c.ip), c.len);
            words.push(fetch.ok()?.to_le_bytes());
            for r in code.refs(k) {
                // A modify is a read then a write, as `Sink::data` gives it.
                let read = (r.access != Access::Store).then_some(AccessKind::Read);
                let write = (r.access != Access::Load).then_some(AccessKind::Write);
                let first = words.len() as u32;
                for kind in read.into_iter().chain(write) {
                    words.push(AddrRecord::encode(kind, 0, r.size).ok()?.to_le_bytes());
                }
                at.push([first, words.len() as u32 - 1]);
            }
        }
        debug_assert_eq!(
            at.len(),
            flat.refs,
            "the flat code's addresses are the block's"
        );
        let flat = flat.placed(|n| at[n]);
        Some(Words { words, flat })
    }
}

/// Records [`Bin`] buffers before writing them (a megabyte).
const BIN_BUFFER: usize = 1 << 17;

impl Records<'_> {
    /// The buffer's next `n` records, after writing what it holds if they
    /// do not fit.
    #[inline(always)]
    fn room(&mut self, n: usize) -> Result<&mut [[u8; 8]], Error> {
        if self.len + n > self.buf.len() {
            self.flush()?;
            if n > self.buf.len() {
                self.buf.resize(n, [0; 8]);
            }
        }
        let at = self.len;
        self.len += n;
        Ok(&mut self.buf[at..at + n])
    }

    #[cold]
    fn flush(&mut self) -> Result<(), Error> {
        self.out.write_all(self.buf[..self.len].as_flattened())?;
        self.len = 0;
        Ok(())
    }
}

impl Bin<'_> {
    #[inline(always)]
    fn put(&mut self, kind: AccessKind, addr: u64, size: u32) -> Result<(), Error> {
        let word = AddrRecord::encode(kind, addr, size)?;
        self.records.room(1)?[0] = word.to_le_bytes();
        Ok(())
    }
}

/// Puts address `a` into `bin` records `p` and `q` of a run's copied
/// records ([`FlatCode::go`]'s places): one record but for a
/// read-modify-write's read and write (rare: the second `or` is skipped
/// by a branch that is nearly always the same way).
#[inline(always)]
fn put_address(out: &mut [[u8; 8]], [p, q]: [u32; 2], a: u64) {
    let mut or = |w: u32| {
        let w = &mut out[w as usize];
        *w = (u64::from_le_bytes(*w) | a).to_le_bytes();
    };
    or(p);
    if q != p {
        or(q);
    }
}

/// Keeps `x` in `kept` unless it holds one: the first address too large
/// for a record, out of the runs' loop (never there in a valid trace).
#[cold]
#[inline(never)]
fn first<T>(kept: &mut Option<T>, x: T) {
    kept.get_or_insert(x);
}

/// Keeps `seg` as segment program `id` of `segs`.
pub fn put_segment<T>(segs: &mut Vec<Option<T>>, id: usize, seg: T) {
    if segs.len() <= id {
        segs.resize_with(id + 1, || None);
    }
    segs[id] = Some(seg);
}

/// Nothing yet for each block of each of `modules` (a sink's per-block
/// records, built at a block's first whole run).
pub fn per_block<T>(modules: &[Module]) -> Vec<Vec<Option<T>>> {
    (modules.iter())
        .map(|m| (0..m.blocks.len()).map(|_| None).collect())
        .collect()
}

impl Sink for Bin<'_> {
    fn modules(&mut self, modules: &[Module]) {
        self.words = per_block(modules);
    }

    /// The run's records copied, the flat code putting its addresses in
    /// them. An address too large for a record is the error its record
    /// gives (`AddrRecord::encode`), none of the run's records written.
    #[inline]
    fn whole<T: FnMut(Recorded) -> Result<u64, String>>(
        &mut self,
        r: BlockRun,
        (code, flat): (&BlockCode, &FlatCode),
        base: u64,
        regs: &mut Regs,
        take: &mut T,
    ) -> Result<Whole, Error> {
        let (m, b) = (r.module as usize, r.block.as_u32() as usize);
        let t = self.words[m][b].get_or_insert_with(|| Words::new(code, flat, base));
        let Some(t) = t else { return Ok(Whole::Not) };
        let n = t.words.len();
        let out = self.records.room(n)?;
        out.copy_from_slice(&t.words);
        let mut large = None;
        let ran = t.flat.go(regs, take, |at, a| {
            if a >= ADDRESS_LIMIT {
                first(&mut large, a);
            }
            put_address(out, at, a);
        });
        if ran.is_err() || large.is_some() {
            self.records.len -= n;
        }
        if let Err((k, why)) = ran {
            return Ok(Whole::Failed(k, why));
        }
        match large {
            Some(a) => Err(aetrace_format::Error::AddressTooLarge(a).into()),
            None => Ok(Whole::Ran),
        }
    }

    fn segment_code(&mut self, id: usize, (m, module): (&Module, u32), links: &[Link]) -> bool {
        let mut seg = SegCode::default();
        for &link in links {
            let b = link.block;
            let Some(Some(t)) = &self.words[module as usize][b.as_u32() as usize] else {
                return false;
            };
            if seg
                .push(&[], (&t.words, &t.flat), (0, link), m.blocks[b].ninsns)
                .is_none()
            {
                return false;
            }
        }
        put_segment(&mut self.segs, id, seg);
        true
    }

    /// The segment's records copied, its chained flat code putting the
    /// addresses in them; not when they would not fit in the buffer (the
    /// blocks' runs would write it). Errors as [`Sink::whole`]'s, the
    /// records of the blocks before the failing one kept.
    #[inline]
    fn run_segment<T: FnMut(Recorded) -> Result<u64, String>>(
        &mut self,
        id: usize,
        regs: &mut Regs,
        take: &mut T,
    ) -> Result<Segmented, Error> {
        let Some(Some(seg)) = self.segs.get(id) else {
            return Ok(Segmented::Not);
        };
        let (start, n) = (self.records.len, seg.recs.len());
        if start + n > self.records.buf.len() {
            return Ok(Segmented::Not);
        }
        let out = &mut self.records.buf[start..start + n];
        out.copy_from_slice(&seg.recs);
        let mut large = None;
        let ran = seg.flat.go(regs, take, |at, a| {
            if a >= ADDRESS_LIMIT {
                first(&mut large, (at[0] as usize, a));
            }
            put_address(out, at, a);
        });
        let failed = ran.err().map(|(k, why)| (seg.insn(k), why));
        let large = large.map(|(p, a)| (seg.block_of(p), a));
        self.records.len = match (&failed, large) {
            (_, Some((b, _))) => start + seg.records_of(b),
            (Some(((b, _), _)), None) => start + seg.records_of(*b),
            (None, None) => start + n,
        };
        match (failed, large) {
            (f, Some((b, a))) if f.as_ref().map_or(true, |((fb, _), _)| b < *fb) => {
                Err(aetrace_format::Error::AddressTooLarge(a).into())
            }
            (Some(((block, k), why)), _) => Ok(Segmented::Failed { block, k, why }),
            _ => Ok(Segmented::Ran),
        }
    }

    #[inline(always)]
    fn insn(&mut self, _: u32, ip: u64, len: u32) -> Result<(), Error> {
        self.put(AccessKind::Instr, ip, len)
    }

    #[inline(always)]
    fn data(&mut self, access: Access, a: u64, s: u32) -> Result<(), Error> {
        if access != Access::Store {
            self.put(AccessKind::Read, a, s)?;
        }
        if access != Access::Load {
            self.put(AccessKind::Write, a, s)?;
        }
        Ok(())
    }
}

/// Whether `trace` holds data addresses (`record --data`).
pub fn has_data(trace: &Path) -> Result<bool, Error> {
    let trace = Trace::open(trace)?;
    Ok(trace.modules().iter().any(has_data_flag))
}

pub(crate) fn has_data_flag(m: &aetrace_format::section::Module) -> bool {
    m.flags & module_flags::DATA_ABS != 0
}

/// One decoded instruction with its references and, with `--check`, the
/// full addresses recorded after the abstract execution's values.
struct Insn {
    insn: Instruction,
    prog: InsnProgram,
    full: Vec<Recorded>,
}

/// What a data trace holds, counted while it is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Data references (lackey's ` L`, ` S`, ` M` lines).
    pub refs: u64,
    /// Those whose address the instruction gives (never recorded).
    pub static_refs: u64,
    /// Those whose address was read from a VALUE record (the others are
    /// recomputed by abstract execution).
    pub recorded_refs: u64,
    /// References compared with their full address (`--check`).
    pub checked_refs: u64,
}

impl Counts {
    /// Counts a whole run of `code`, each `rep` once.
    #[inline(always)]
    fn add_block(&mut self, code: &BlockCode) {
        self.add(code.totals);
    }

    /// Counts references by their totals (`BlockCode::totals`).
    #[inline(always)]
    fn add(&mut self, [refs, statik, recorded]: [u64; 3]) {
        self.refs += refs;
        self.static_refs += statik;
        self.recorded_refs += recorded;
    }
}

/// How a module was recorded, its database for abstract execution, and
/// its blocks and procedures as decoded so far (by index: looked up once
/// per executed block).
struct ModData {
    image: aetrace_analysis::elf::Module,
    check: bool,
    db: ProgramDb,
    returns: Returns,
    blocks: Vec<Option<Rc<Vec<Insn>>>>,
    /// Per block, built at its first run.
    entries: Vec<Option<Entry>>,
    procs: Vec<Option<Rc<ProcFacts>>>,
}

/// What a run of a block needs at its start, in one place: the walk
/// looks it up once per run.
#[derive(Clone)]
struct Entry {
    /// The block's compiled address program from its first instruction
    /// (`exec::code`: the known registers at a block's start are fixed).
    code: Rc<BlockCode>,
    /// Its procedure's facts, and the block's index in them.
    facts: Rc<ProcFacts>,
    local: u32,
    /// Its procedure.
    proc: u32,
    /// The registers known at its start (`facts.known[local]`).
    known: RegSet,
    /// `code` as flat code, for a whole run (none with `--check`, or for
    /// a block with a `rep` or a refused instruction).
    flat: Option<FlatCode>,
    /// It ends with a call whose return carries the registers the ABI
    /// preserves (`exec::back_call`): the state at its end is kept.
    back: bool,
    /// It may run between such a call and its return
    /// (`exec::passes_through`).
    passes: bool,
    /// It is a block of a leaf (`Returns::leaf`): it may run between a
    /// call to its procedure and the return, and its `ret` returns there.
    leaf: bool,
    /// The run before (`ThreadExec::prev`) that [`Writer::came_by`] last
    /// found a plain way in: the check depends on that run and this block
    /// alone, so after the same run again it is not made (nor the
    /// procedure's facts read).
    plain_after: Cell<Option<(u32, BlockIx, bool, bool)>>,
}

/// A traced procedure's cross-block facts (`exec::entry_knowledge`), per
/// block.
struct ProcFacts {
    ways: Vec<Vec<WayIn>>,
    known: Vec<RegSet>,
    /// The block records `rsp` before its last instruction if unknown
    /// (`exec::anchors_rsp`).
    anchors: Vec<bool>,
    /// Per block, per instruction: the registers recorded before it when
    /// unknown (`exec::mark_definitions`), the thread constant `rax`
    /// holds there (`exec::mark_once`) and a call's argument registers
    /// (`exec::mark_calls`; the decoded programs leave all three empty,
    /// so `compile` sets them).
    before: Vec<Vec<(RegSet, Option<u8>, RegSet)>>,
}

/// A thread's abstract execution state.
#[derive(Clone, Default)]
struct ThreadExec {
    /// Its registers (the interpreter's state, `Regs::exec`, for the
    /// runs flat code does not run).
    regs: Regs,
    /// The run before: module, block, whether it ran to its end, and
    /// whether that end is a `ret`.
    prev: Option<(u32, BlockIx, bool, bool)>,
    /// The state at the end of the last run of a block that ends with a
    /// call whose return carries the preserved registers (`exec::WayIn::
    /// Back`), while only blocks that pass through it ran since.
    back: Option<Back>,
    /// How the last run was entered ([`Writer::enter`]).
    edge: Edge,
}

/// How [`Writer::enter`] entered a run: what a chain of runs after a
/// segment ([`Chain`]) does at that block beside the blocks' code.
#[derive(Copy, Clone, Default, Debug, PartialEq, Eq)]
enum Edge {
    /// With the state the run before left (or nothing known).
    Plain,
    /// At a procedure entry, by the call the run before ended with:
    /// `rsp` less the return address's 8 bytes.
    Call,
    /// At a procedure entry, by a jump: `rsp` as the jumper left it.
    Jump,
    /// At a call's return point, with the kept call state
    /// ([`ThreadExec::back`]).
    Back,
    /// Any other way (an outside entry, a signal handler's return).
    #[default]
    Other,
}

/// The state a call block left, for its return point ([`ThreadExec::back`]):
/// its 16 registers' slots alone (the others are the zero slot and
/// temporaries no block reads on entry), a fixed-size copy with no call
/// (the whole [`Regs`] was two `memcpy` calls per call and return, 1.7 %
/// of the instructions on sort).
#[derive(Clone)]
struct Back {
    module: u32,
    proc: u32,
    local: u32,
    v: [u64; 16],
    known: RegSet,
}

impl Back {
    /// The call block's state of `regs`.
    #[inline(always)]
    fn of(module: u32, e: &Entry, regs: &Regs) -> Back {
        let mut v = [0; 16];
        v.copy_from_slice(&regs.v[..16]);
        let (proc, local, known) = (e.proc, e.local, regs.known);
        Back {
            module,
            proc,
            local,
            v,
            known,
        }
    }

    /// Puts the kept state into `regs`.
    #[inline(always)]
    fn restore(&self, regs: &mut Regs) {
        regs.v[..16].copy_from_slice(&self.v);
        regs.known = self.known;
    }

    /// The kept register `g`'s value.
    fn get(&self, g: Gpr) -> Option<u64> {
        (self.known.0 >> g.0 & 1 != 0).then_some(self.v[g.index()])
    }

    /// Whether a handler that returned to `regs` (its context's 16
    /// registers; `at`: the interrupted code's state) left this kept state
    /// the one the call's return gets: `rsp` as the interrupted code had
    /// it, and each preserved register either as the call block left it
    /// or as the interrupted code had it (the handler did not change it:
    /// a leaf that had saved and changed one, as `rbp` at -O0, still
    /// restores it by the ABI's promise). A value that is neither may be
    /// the handler's, which that promise does not cover: the state is
    /// dropped, and the return point refuses the walk.
    fn unmoved(&self, at: &Regs, regs: &[u64]) -> bool {
        let rsp = at
            .get(Gpr::RSP)
            .map_or(true, |v| v == regs[Gpr::RSP.index()]);
        let kept = (self.known.iter())
            .filter(|&g| g != Gpr::RSP && exec::PRESERVED.0 >> g.0 & 1 != 0)
            .all(|g| {
                let v = Some(regs[g.index()]);
                self.get(g) == v || at.get(g) == v
            });
        rsp && kept
    }
}

/// How the run before a block's run is one of the ways in the analysis
/// assumed ([`Writer::came_by`]).
#[derive(Copy, Clone, PartialEq, Eq)]
enum Came {
    /// Not one of them.
    No,
    /// The run before left the state the block starts with.
    Plain,
    /// A call's return whose state is [`ThreadExec::back`]'s.
    Back,
}

/// Values per window of a thread's [`Values`] (512 kB).
const WINDOW: usize = 1 << 16;

/// The current thread's values, read a window at a time beside the walk
/// (`regen::DataCursor`), so memory does not grow with the trace.
#[derive(Default)]
struct Values<'t> {
    cursor: Option<aetrace_regen::DataCursor<'t>>,
    thread: Option<ThreadId>,
    /// The window, and the next value of it to use.
    win: aetrace_regen::DataValues,
    next: usize,
    /// The first of `win.entered` not passed yet.
    entered: usize,
    /// Values used before the window.
    before: u64,
    /// The ENTER whose stub's value is the first of the next window (a
    /// handler ran between them, `signals`).
    carry: Option<u32>,
    /// Each handler's return is preceded by the context's 16 general
    /// registers as VALUEs (format 1.11, the runtime's `sigreturn`).
    registers: bool,
    /// A `rep` string instruction's fault is followed by its `rcx`, `rsi`
    /// and `rdi` as VALUEs (format 1.12, `signals`).
    rep_faults: bool,
    /// The thread constants taken so far (`Recorded::Once`), by number.
    once: Once,
    /// Where the window's values from the stream were read from (the
    /// cursor's mark before), at window index `mark_at`; the values
    /// before index `spliced` were put back from elsewhere (a handler's
    /// interrupted instruction's): the data walk's state (`state`).
    mark: Option<aetrace_regen::ValueMark>,
    mark_at: i64,
    spliced: usize,
    /// The ENTER [`Values::carry`] put before this window's first value.
    carried: Option<u32>,
}

/// The thread constants a thread (or a handler) has taken, by number
/// (`returns::THREAD_CONSTANTS`).
type Once = [Option<u64>; aetrace_analysis::addr::returns::THREAD_CONSTANTS.len()];

impl<'t> Values<'t> {
    /// The values of thread `t`, read through the chunks of `visit`'s walk.
    fn start<B: AsRef<[u8]> + Sync>(
        trace: &Trace<B>,
        visit: &'t Visit<'_, B>,
        t: ThreadId,
    ) -> Result<Self, Error> {
        Ok(Values {
            cursor: Some(visit.values(t)?),
            thread: Some(t),
            registers: trace.header().minor >= aetrace_format::header::MINOR_SIGRETURN,
            rep_faults: trace.header().minor >= aetrace_format::header::MINOR_REP_FAULT,
            ..Values::default()
        })
    }

    /// The next value, for `what`: a recorded address read in a copied
    /// jump table is the original table's.
    #[inline(always)]
    fn take_as(&mut self, what: Recorded, m: &Module) -> Result<u64, String> {
        let v = match what {
            Recorded::Once(k) => return self.constant(k),
            _ => self.take()?,
        };
        Ok(match what {
            Recorded::Addr(_) => m.original_data_address(v),
            _ => v,
        })
    }

    /// Thread constant `k`: the thread's first return from its import
    /// recorded it, as the runtime's slot word `ONCE` says (a handler
    /// starts without them, `signals`).
    #[cold]
    fn constant(&mut self, k: u8) -> Result<u64, String> {
        let k = usize::from(k);
        match self.once.get(k) {
            Some(&Some(v)) => Ok(v),
            Some(None) => {
                let v = self.take()?;
                self.once[k] = Some(v);
                Ok(v)
            }
            None => Err(format!("thread constant {k} is not one this aetrace knows")),
        }
    }

    /// The next value.
    #[inline(always)]
    fn take(&mut self) -> Result<u64, String> {
        if let Some(&v) = self.win.values.get(self.next) {
            self.next += 1;
            return Ok(v);
        }
        self.refill()?;
        let v = self.win.values[self.next];
        self.next += 1;
        Ok(v)
    }

    /// The next window, which must hold a value.
    #[cold]
    fn refill(&mut self) -> Result<(), String> {
        self.before += self.win.values.len() as u64;
        (self.next, self.entered) = (0, 0);
        (self.mark_at, self.spliced) = (0, 0);
        let n = match &mut self.cursor {
            Some(c) => {
                self.mark = c.mark();
                c.read(WINDOW, &mut self.win).map_err(|e| e.to_string())?
            }
            None => 0,
        };
        if n == 0 {
            return Err(self.short());
        }
        self.carried = self.carry.take();
        if let Some(raw) = self.carried {
            self.win.entered.insert(0, (0, raw));
        }
        Ok(())
    }

    /// Why the walk needs a value the thread has not: none is left, or
    /// the next is a signal handler's.
    #[cold]
    fn short(&self) -> String {
        match self.cursor.as_ref().and_then(|c| c.next_signal()) {
            Some(s) if !s.fault => format!(
                "thread {}: the walk needs data value {}, which comes after the SIGNAL({}) at stream offset {}, before the walk entered its handler",
                self.thread.map_or(0, |t| t.0),
                self.used(),
                s.signo,
                s.offset
            ),
            _ => short(self.thread, self.used()),
        }
    }

    fn used(&self) -> u64 {
        self.before + self.next as u64
    }

    /// The next value when an outside-entry stub of `raw` wrote it right
    /// after its ENTER.
    fn take_entered(&mut self, raw: u32) -> Result<Option<u64>, String> {
        if self.next == self.win.values.len() {
            self.refill()?;
        }
        let e = &self.win.entered;
        // Values after an ENTER that were not a stub's (an entry that
        // does not start with `rsp` known) were read as addresses.
        while e.get(self.entered).is_some_and(|&(n, _)| n < self.next) {
            self.entered += 1;
        }
        match e.get(self.entered) {
            Some(&(n, w)) if n == self.next && w == raw => self.take().map(Some),
            _ => Ok(None),
        }
    }

    /// Every value of the thread must have been used (but those an
    /// instruction wrote before the FAULT that ended the thread), and
    /// every SIGNAL delivered.
    fn finish(&mut self) -> Result<(), Error> {
        let (Some(t), Some(c)) = (self.thread, self.cursor.take()) else {
            return Ok(());
        };
        let mut left = (self.win.values.len() - self.next) as u64;
        // The records left, the first two kept; values after the first
        // (a FAULT in untraced code's `rep` has its three registers).
        let (mut sigs, mut after) = (Vec::new(), 0);
        c.rest(&mut |item| match item {
            DataItem::Value(..) if sigs.is_empty() => left += 1,
            DataItem::Value(..) => after += 1,
            DataItem::Signal(s) if sigs.len() < 2 => sigs.push(s),
            DataItem::Signal(_) => {}
        })?;
        match sigs[..] {
            [] if left == 0 => Ok(()),
            [f] if f.fault && after == if f.rep { 3 } else { 0 } => Ok(()),
            [s, ..] => Err(format!(
                "thread {}: its SIGNAL({}) at stream offset {} was not delivered by the walk",
                t.0, s.signo, s.offset
            )
            .into()),
            [] => Err(format!(
                "thread {}: {} data values recorded, {} used: the trace and the reference table disagree",
                t.0,
                self.used() + left,
                self.used()
            )
            .into()),
        }
    }
}

/// Writes the data trace of `trace` to `out`.
pub fn write(
    trace: &Path,
    opts: &aetrace_regen::Options,
    format: DataFormat,
    out: &mut dyn Write,
) -> Result<Counts, Error> {
    write_indexing(&Trace::open(trace)?, opts, format, out, 0).map(|r| r.0)
}

/// [`write`] of a trace open: with `-j N` (N > 1) from the state index
/// of `opts` when its entries keep data states (`pieces`), else one walk
/// keeping (`interval` > 0) a state index's states, the data walk's
/// among them ([`walk_indexing`]).
pub fn write_indexing<B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    opts: &aetrace_regen::Options,
    format: DataFormat,
    out: &mut dyn Write,
    interval: u64,
) -> Result<(Counts, Option<StateIndex>), Error> {
    let workers = match opts.jobs {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let with_data = (opts.index.as_deref())
        .is_some_and(|i| (i.threads.values().flatten()).any(|e| !e.data.is_empty()));
    if workers > 1 && with_data {
        return pieces::write(trace, opts, format, out, workers).map(|c| (c, None));
    }
    // One walk: the control walk runs on its own thread beside it.
    let opts = &aetrace_regen::Options {
        index: None,
        jobs: 1,
        ..opts.clone()
    };
    if format != DataFormat::Bin {
        let lackey = format == DataFormat::Lackey;
        let mut text = Text::new(lackey, out);
        let r = walk_indexing(trace, opts, &mut text, interval)?;
        text.flush()?;
        return Ok(r);
    }
    let header = aetrace_format::addrtrace::Header { count: None };
    out.write_all(&header.to_bytes())?;
    let mut bin = Bin {
        records: Records {
            out,
            buf: vec![[0; 8]; BIN_BUFFER],
            len: 0,
        },
        words: Vec::new(),
        segs: Vec::new(),
    };
    let r = walk_indexing(trace, opts, &mut bin, interval)?;
    bin.records.flush()?;
    Ok(r)
}

/// Gives every instruction and data reference of `trace` to `sink`.
pub fn walk(
    trace: &Path,
    opts: &aetrace_regen::Options,
    sink: &mut impl Sink,
) -> Result<Counts, Error> {
    let trace = Trace::open(trace)?;
    if !trace.modules().iter().any(has_data_flag) {
        return Err("the trace has no data addresses: record it with --data".into());
    }
    walk_indexing(&trace, opts, sink, 0).map(|r| r.0)
}

/// [`walk`] of a trace open, keeping (`interval` > 0) the states of a
/// state index every `interval` stream bytes, the data walk's with the
/// control walk's: the index, when every thread was walked whole.
pub fn walk_indexing<B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    opts: &aetrace_regen::Options,
    sink: &mut impl Sink,
    interval: u64,
) -> Result<(Counts, Option<StateIndex>), Error> {
    if !trace.modules().iter().any(has_data_flag) {
        return Err("the trace has no data addresses: record it with --data".into());
    }
    let visit = Visit::with_segments(trace, opts)?.sharing_values();
    let mut w = Writer::new(sink, Caches::of(trace, visit.modules())?);
    w.sink.modules(visit.modules());
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::sync_channel::<Runs>(RUNS_AHEAD);
        let (back_tx, back_rx) = mpsc::channel::<Runs>();
        let v = &visit;
        let control = std::thread::Builder::new()
            .name("aetrace-control".into())
            .spawn_scoped(s, move || {
                v.run_indexing(interval, &mut |runs| {
                    let spare = back_rx.try_recv().unwrap_or_default();
                    tx.send(std::mem::replace(runs, spare)).is_ok()
                })
            })?;
        // Its error first: the control walk stops at its next batch
        // (`rx` dropped), and had given the events before it.
        let walked = w.events(trace, &visit, rx, back_tx);
        let controlled = control
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        walked?;
        let index = controlled?;
        w.end_thread(&visit)?;
        let index = index.map(|i| with_data_states(i, &w.paused));
        Ok((w.counts, index))
    })
}

/// Gives the entries of `index` (of `trace`, a data trace) the data
/// walk's states there: a whole data walk (to nowhere) keeps them at the
/// same pause points, since it pauses as the index's walk did (same
/// interval, from the stream's start).
pub fn add_data_states<B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    index: &mut StateIndex,
) -> Result<(), Error> {
    let opts = aetrace_regen::Options::default();
    let sink = &mut std::io::sink();
    let (_, walked) = write_indexing(trace, &opts, DataFormat::Bin, sink, index.interval)?;
    let Some(walked) = walked else {
        return Ok(());
    };
    for (t, entries) in &mut index.threads {
        let Some(w) = walked.threads.get(t) else {
            continue;
        };
        for e in entries.iter_mut() {
            if let Ok(k) = w.binary_search_by_key(&e.offset, |w| w.offset) {
                debug_assert_eq!(w[k].state, e.state, "the same pause point");
                e.data.clone_from(&w[k].data);
            }
        }
    }
    Ok(())
}

/// Index `index` with the data walk's states kept at its pauses
/// (`paused`), each in the entry of the same thread and offset.
fn with_data_states(mut index: StateIndex, paused: &[(ThreadId, u64, Vec<u8>)]) -> StateIndex {
    for (t, offset, data) in paused {
        let entries = index
            .threads
            .get_mut(&t.0)
            .map_or(&mut [][..], |e| &mut e[..]);
        if let Ok(k) = entries.binary_search_by_key(offset, |e| e.offset) {
            entries[k].data.clone_from(data);
        }
    }
    index
}

impl<'o, S: Sink> Writer<'o, '_, S> {
    /// A walk into `sink` knowing `caches`, at no thread yet.
    fn new(sink: &'o mut S, caches: Caches) -> Self {
        Writer {
            sink,
            mods: caches.mods,
            values: Values::default(),
            state: ThreadExec::default(),
            sig: signals::Signals::default(),
            info: InstructionInfoFactory::new(),
            addrs: InsnAddrs::default(),
            block: BlockAddrs::default(),
            counts: Counts::default(),
            segments: caches.segments,
            paused: Vec::new(),
        }
    }

    /// What it learned of the code, for the next walk.
    fn caches(self) -> Caches {
        Caches {
            mods: self.mods,
            segments: self.segments,
        }
    }
}

/// Batches of runs (`regen::output::BATCH` bytes each) the control walk,
/// on its own thread, may be ahead of the data walk: the control walk
/// was a fifth of the data walk's thread (gzip 2 MB, `perf record`).
const RUNS_AHEAD: usize = 4;

/// A module's bytes and database, checked to be the one recorded with data.
fn mod_data<B: AsRef<[u8]>>(trace: &Trace<B>, m: &Module) -> Result<ModData, Error> {
    let Some(rec) = trace.module(ModuleId(m.id)) else {
        return Err(format!("module {} is not in the trace", m.name).into());
    };
    if rec.flags & module_flags::DATA_ABS == 0 {
        return Err(format!(
            "module {} was recorded without data addresses: record with --data",
            m.name
        )
        .into());
    }
    let path = std::str::from_utf8(&rec.path)?;
    let image = aetrace_analysis::elf::Module::open(Path::new(path))?;
    if image.build_id() != rec.build_id {
        return Err(format!("{path} is not the file that was recorded (build-id differs)").into());
    }
    let db = trace
        .program_database(ModuleId(m.id))
        .ok_or_else(|| format!("module {} has no program database", m.name))?;
    let db = ProgramDb::decode(&db.decompress()?)?;
    Ok(ModData {
        check: rec.flags & module_flags::DATA_CHECK != 0,
        returns: Returns::of_module(&db, &image),
        image,
        db,
        blocks: vec![None; m.blocks.len()],
        entries: vec![None; m.blocks.len()],
        procs: vec![None; m.procs.len()],
    })
}

/// The walk's state; generic over the sink so that its calls, one per
/// reference, are inlined.
struct Writer<'o, 't, S> {
    sink: &'o mut S,
    mods: Vec<ModData>,
    /// The current thread's values.
    values: Values<'t>,
    state: ThreadExec,
    /// The thread's signal handlers, entered and returned (`signals`).
    sig: signals::Signals,
    info: InstructionInfoFactory,
    /// The addresses of the instruction walked last (reused).
    addrs: InsnAddrs,
    /// The addresses of the block walked last (reused).
    block: BlockAddrs,
    counts: Counts,
    segments: Segments,
    /// The states kept at the walk's [`Event::Pause`]s: thread, stream
    /// offset, the encoded state (`state`).
    paused: Vec<(ThreadId, u64, Vec<u8>)>,
}

/// What a walk learns of a trace's code, carried from one piece to the
/// next of the same worker.
struct Caches {
    mods: Vec<ModData>,
    segments: Segments,
}

impl Caches {
    fn of<B: AsRef<[u8]>>(trace: &Trace<B>, modules: &[Module]) -> Result<Caches> {
        let mut c = Caches {
            mods: Vec::new(),
            segments: Segments::default(),
        };
        for m in modules {
            c.mods.push(mod_data(trace, m)?);
            c.segments.of.push(vec![Segments::NEW; Segment::numbers(m)]);
        }
        Ok(c)
    }
}

/// Why a piece cannot go on: the index's data states do not describe
/// the trace.
const INDEX_STALE: &str = "a data state of the index does not describe this trace (delete TRACE.idx; `aetrace index` rebuilds it)";

/// The blocks of each summarised segment the control walk gave
/// ([`Step::Segment`]), listed at its first sight: the control walk
/// then takes one step per witness instead of one per block, and the
/// data walk runs the listed blocks whole, as the runs it would have
/// been given.
#[derive(Default)]
struct Segments {
    /// Per module, per segment number: where its blocks are in `blocks`
    /// and how many ([`Segments::NEW`]: not listed yet).
    of: Vec<Vec<(u32, u32)>>,
    blocks: Vec<BlockIx>,
    /// Per listed block: it was entered from the block listed before it
    /// by a way in the analysis assumed (`Writer::came_by`). The check
    /// depends on the two blocks alone, so once passed it holds for
    /// every run of the segment and is not made again.
    plain: Vec<bool>,
    /// Per listed block, at a segment's first: its program.
    code: Vec<Program>,
    /// Per listed block, at a segment's first: the runs that follow it.
    chain: Vec<Chain>,
    /// The records of the chains' runs ([`Chain::Yes`]).
    records: Vec<u8>,
}

/// The whole runs the control walk gives one by one right after a listed
/// segment, up to its next step of another kind: the calls and returns a
/// witness passes on the counting chain (`summary::Summaries::output_run`:
/// a call block, a PLT stub's block, the return point's blocks, ...),
/// which sort makes about once per witness. When the same runs, entered
/// the same ways, followed the segment twice in a row, the segment and
/// they are listed as one more segment whose program runs them whole, its
/// ways in as [`Link`]s; a later run of the segment takes it when the
/// steps after it are those runs (a look ahead in the batch), else runs
/// as before.
#[derive(Clone, Default)]
enum Chain {
    /// Not seen yet.
    #[default]
    Untried,
    /// The runs seen after the segment last time, how each was entered,
    /// and how many times a chain was seen.
    Seen {
        blocks: Vec<BlockIx>,
        edges: Vec<Edge>,
        tries: u8,
    },
    /// The segment and its runs listed at `at` (`n` blocks), with their
    /// program; the runs' records are `Segments::records[recs.0..recs.1]`.
    Yes { at: u32, n: u32, recs: (u32, u32) },
    /// None made.
    No,
}

/// Times a segment's runs after it are looked at before giving up on a
/// chain.
const CHAIN_TRIES: u8 = 8;

/// Most runs in a chain.
const CHAIN_RUNS: usize = 256;

/// What the kept call state ([`ThreadExec::back`]) is after a list of runs.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Kept {
    /// The one before the list (each run passes through or is a leaf's).
    Before,
    /// None.
    Dropped,
    /// The last call block's in the list.
    Call,
}

impl Kept {
    /// After `e`'s whole run too ([`Writer::keep_back`]).
    fn then(self, e: &Entry) -> Kept {
        match (e.back, e.passes || e.leaf) {
            (true, _) => Kept::Call,
            (false, true) => self,
            (false, false) => Kept::Dropped,
        }
    }
}

/// A listed segment's program ([`Sink::segment_code`]), made after a run
/// of its blocks one by one that found every block after the first
/// entered plainly from the one before: then every run of it enters
/// them so (the check depends on the two blocks alone), and what the
/// runs one by one decide per block is decided once.
#[derive(Copy, Clone, Default)]
enum Program {
    /// Not made yet.
    #[default]
    Untried,
    /// The sink has none, or a block has no whole run or ends with a
    /// call whose return carries the state (kept per run).
    No,
    /// The sink's program `id` (its segment's first listed block).
    Yes(Program1),
}

/// What a run of a segment's program does beside the sink's records.
#[derive(Copy, Clone)]
struct Program1 {
    /// The blocks' references ([`Counts::add`]).
    totals: [u64; 3],
    /// Every block passes through or is a leaf's: the kept call state
    /// stays ([`Writer::keep_back`]); else it is dropped.
    keeps_back: bool,
    /// The last block ends with `ret`.
    ret: bool,
    /// The whole run of the last block (the sink's and the thread's run
    /// before once the program ran).
    last: BlockRun,
    /// The registers known at the first block's start.
    known: RegSet,
    /// A run before (`ThreadExec::prev`) after which the first block was
    /// entered plainly: after it again, so it is (the check depends on
    /// the two blocks alone), and only the registers are kept.
    after: Option<(u32, BlockIx, bool, bool)>,
}

impl Segments {
    const NEW: (u32, u32) = (u32::MAX, 0);

    /// Where segment `s`'s blocks are in `blocks`.
    #[inline]
    fn range(&mut self, m: &Module, s: Segment) -> std::ops::Range<usize> {
        let (at, n) = self.of[s.module as usize][s.number as usize];
        match (at, n) {
            // A number is one (read point, witness); `s.blocks` is
            // checked all the same, and a new list made if it differs.
            (at, n) if n == s.blocks && at != u32::MAX => at as usize..(at + n) as usize,
            _ => self.list(m, s),
        }
    }

    #[cold]
    fn list(&mut self, m: &Module, s: Segment) -> std::ops::Range<usize> {
        let at = self.add(s.blocks(m));
        self.of[s.module as usize][s.number as usize] = (at.start as u32, s.blocks);
        at
    }

    /// Lists `blocks`: where they are.
    fn add(&mut self, blocks: impl IntoIterator<Item = BlockIx>) -> std::ops::Range<usize> {
        let at = self.blocks.len();
        self.blocks.extend(blocks);
        self.plain.resize(self.blocks.len(), false);
        self.code.resize(self.blocks.len(), Program::Untried);
        self.chain.resize(self.blocks.len(), Chain::Untried);
        at..self.blocks.len()
    }
}

impl<'t, S: Sink> Writer<'_, 't, S> {
    /// Walks the events of the batches `rx` gives until it closes or an
    /// event fails (dropping `rx`, which stops the control walk), each
    /// batch sent `back` to be reused.
    fn events<B: AsRef<[u8]> + Sync>(
        &mut self,
        trace: &Trace<B>,
        visit: &'t Visit<'_, B>,
        rx: mpsc::Receiver<Runs>,
        back: mpsc::Sender<Runs>,
    ) -> Result<(), Error> {
        for runs in rx {
            self.batch(trace, visit, &runs)?;
            let _ = back.send(runs);
        }
        Ok(())
    }

    /// Walks the events of one batch.
    fn batch<B: AsRef<[u8]> + Sync>(
        &mut self,
        trace: &Trace<B>,
        visit: &'t Visit<'_, B>,
        runs: &Runs,
    ) -> Result<(), Error> {
        let mut steps = runs.steps();
        while let Some(step) = steps.next() {
            match step {
                Step::Event(e) => self.event(trace, visit, e)?,
                Step::Segment(s) => self.segment(visit, s, &mut steps)?,
            }
        }
        Ok(())
    }

    /// The blocks of segment `s`, each run whole: with the runs `steps`
    /// gives next by its chain's program if they are its chain's
    /// ([`Chain`]), else by its program if it has one, else one by one
    /// (and then its program made, once); its chain looked for after its
    /// program.
    fn segment<B: AsRef<[u8]> + Sync>(
        &mut self,
        visit: &Visit<'_, B>,
        s: Segment,
        steps: &mut Steps,
    ) -> Result<()> {
        let m = &visit.modules()[s.module as usize];
        let range = self.segments.range(m, s);
        if let Chain::Yes { at, n, recs } = self.segments.chain[range.start] {
            let (at, n) = (at as usize, n as usize);
            let want = &self.segments.records[recs.0 as usize..recs.1 as usize];
            if let (Program::Yes(p), false) = (self.segments.code[at], self.sig.resumed) {
                if steps.ahead().starts_with(want) {
                    steps.pass(want.len());
                    return self.program(m, s.module, at..at + n, p);
                }
            }
        }
        match self.segments.code[range.start] {
            Program::Yes(p) if !self.sig.resumed => self.program(m, s.module, range.clone(), p)?,
            Program::Untried => {
                self.each_block(m, s.module, range.clone(), false)?;
                self.make_program(m, s.module, range);
                return Ok(());
            }
            _ => return self.each_block(m, s.module, range, false),
        }
        match self.segments.chain[range.start] {
            Chain::Untried | Chain::Seen { .. } if !self.sig.resumed => {
                self.learn(m, s.module, range, steps)
            }
            _ => Ok(()),
        }
    }

    /// Runs the whole runs `steps` gives next after the segment listed at
    /// `range`, which ran by its program, as the event loop would, and
    /// makes its chain's program when they and their ways in are those
    /// seen the time before ([`Chain`]).
    fn learn(
        &mut self,
        m: &Module,
        module: u32,
        range: std::ops::Range<usize>,
        steps: &mut Steps,
    ) -> Result<()> {
        let (mut blocks, mut edges, from) = (Vec::new(), Vec::new(), steps.ahead());
        while blocks.len() < CHAIN_RUNS {
            let mut ahead = steps.clone();
            let Some(Step::Event(Event::Run(r))) = ahead.next() else {
                break;
            };
            if r != Self::whole_run(m, module, r.block) {
                break;
            }
            *steps = ahead;
            self.run(m, r, &mut false)?;
            blocks.push(r.block);
            edges.push(self.state.edge);
        }
        let at = range.start;
        self.segments.chain[at] = match std::mem::take(&mut self.segments.chain[at]) {
            Chain::Seen {
                blocks: b,
                edges: e,
                ..
            } if !blocks.is_empty() && b == blocks && e == edges => {
                let recs = &from[..from.len() - steps.ahead().len()];
                self.make_chain(m, module, range, (&blocks, &edges), recs)
            }
            Chain::Seen { tries, .. } if tries >= CHAIN_TRIES => Chain::No,
            c => Chain::Seen {
                blocks,
                edges,
                tries: match c {
                    Chain::Seen { tries, .. } => tries + 1,
                    _ => 1,
                },
            },
        };
        Ok(())
    }

    /// The chain of the segment listed at `range` (which has a program):
    /// it and the runs of `blocks` after it, entered by `edges` (the steps'
    /// records `recs`), listed as one program, if each block runs whole by flat code, each way in is
    /// one a [`Link`] makes, and the kept call state after them is not a
    /// call's among them (that state would have to be made).
    #[cold]
    fn make_chain(
        &mut self,
        m: &Module,
        module: u32,
        range: std::ops::Range<usize>,
        (blocks, edges): (&[BlockIx], &[Edge]),
        recs: &[u8],
    ) -> Chain {
        let Program::Yes(mut p) = self.segments.code[range.start] else {
            return Chain::No;
        };
        let entries = &self.mods[module as usize].entries;
        let entry = |b: BlockIx| entries[b.as_u32() as usize].as_ref();
        let mut links: Vec<Link> = (self.segments.blocks[range.clone()].iter())
            .map(|&block| Link { block, rsp: 0 })
            .collect();
        let mut ways = vec![Edge::Plain; links.len()];
        let mut kept = if p.keeps_back {
            Kept::Before
        } else {
            Kept::Dropped
        };
        for (&block, &edge) in blocks.iter().zip(edges) {
            let Some(e) = entry(block).filter(|e| e.flat.is_some()) else {
                return Chain::No;
            };
            let rsp = match edge {
                Edge::Plain | Edge::Jump => 0,
                Edge::Call => 8u64.wrapping_neg(),
                Edge::Back if back_past_stub(&links, &ways, entry) => 8,
                Edge::Back | Edge::Other => return Chain::No,
            };
            for (t, n) in p.totals.iter_mut().zip(e.code.totals) {
                *t += n;
            }
            kept = kept.then(e);
            p.ret = e.code.ret;
            links.push(Link { block, rsp });
            ways.push(edge);
        }
        if kept == Kept::Call {
            return Chain::No;
        }
        p.keeps_back = kept == Kept::Before;
        p.last = Self::whole_run(m, module, *blocks.last().unwrap_or(&p.last.block));
        p.after = None;
        let n = links.len() as u32;
        let at = self.segments.add(links.iter().map(|l| l.block)).start;
        if !self.sink.segment_code(at, (m, module), &links) {
            return Chain::No;
        }
        self.segments.code[at] = Program::Yes(p);
        let lo = self.segments.records.len() as u32;
        self.segments.records.extend_from_slice(recs);
        Chain::Yes {
            at: at as u32,
            n,
            recs: (lo, self.segments.records.len() as u32),
        }
    }

    /// The whole run of `block` of module `module`.
    fn whole_run(m: &Module, module: u32, block: BlockIx) -> BlockRun {
        BlockRun {
            module,
            block,
            first: 0,
            end: m.blocks[block].ninsns,
            faults: false,
        }
    }

    /// The listed blocks `range` of module `module` run whole one by one;
    /// `entered`: the first one's [`Writer::enter`] was made.
    fn each_block(
        &mut self,
        m: &Module,
        module: u32,
        range: std::ops::Range<usize>,
        entered: bool,
    ) -> Result<()> {
        let first = range.start;
        for k in range {
            let r = Self::whole_run(m, module, self.segments.blocks[k]);
            if k == first && entered {
                self.run_entered(m, r, None)?;
                continue;
            }
            // The segment's first block follows whatever ran before it.
            let mut plain = k > first && self.segments.plain[k];
            self.run(m, r, &mut plain)?;
            self.segments.plain[k] = k > first && plain;
        }
        Ok(())
    }

    /// Makes the program of the segment listed at `range` after a run of
    /// it one by one, if every block after the first was entered plainly
    /// (or knows nothing at its start: nothing to check) and runs whole
    /// by flat code, and none keeps a call's state for its return.
    #[cold]
    fn make_program(&mut self, m: &Module, module: u32, range: std::ops::Range<usize>) {
        let at = range.start;
        self.segments.code[at] = Program::No;
        let entries = &self.mods[module as usize].entries;
        let mut p = Program1 {
            totals: [0; 3],
            keeps_back: true,
            ret: false,
            last: Self::whole_run(m, module, self.segments.blocks[range.end - 1]),
            known: RegSet(0),
            after: None,
        };
        for k in range.clone() {
            let Some(e) = &entries[self.segments.blocks[k].as_u32() as usize] else {
                return;
            };
            let plain = k == at || self.segments.plain[k] || e.known.0 == 0;
            if !plain || e.flat.is_none() || e.back || !m.shown {
                return;
            }
            for (t, n) in p.totals.iter_mut().zip(e.code.totals) {
                *t += n;
            }
            p.keeps_back &= e.passes || e.leaf;
            p.ret = e.code.ret;
            if k == at {
                p.known = e.known;
            }
        }
        let links: Vec<Link> = (self.segments.blocks[range].iter())
            .map(|&block| Link { block, rsp: 0 })
            .collect();
        if self.sink.segment_code(at, (m, module), &links) {
            self.segments.code[at] = Program::Yes(p);
        }
    }

    /// Runs the segment listed at `range` by its program `p`: the first
    /// block entered as any run, the others as the program says.
    fn program(
        &mut self,
        m: &Module,
        module: u32,
        range: std::ops::Range<usize>,
        p: Program1,
    ) -> Result<()> {
        let prev = self.state.prev;
        // (Knowing nothing at its start, it has nothing to check.)
        if p.known.0 == 0 || p.after.is_some() && p.after == prev {
            self.keep(p.known)?;
        } else {
            let first = Self::whole_run(m, module, self.segments.blocks[range.start]);
            let mut plain = false;
            let from = self.enter(m, first, &mut plain)?;
            debug_assert!(from.is_none(), "a whole run, not after a handler");
            if plain {
                let p = Program1 { after: prev, ..p };
                self.segments.code[range.start] = Program::Yes(p);
            }
        }
        let values = &mut self.values;
        let take = &mut |what| values.take_as(what, m);
        match (self.sink).run_segment(range.start, &mut self.state.regs, take)? {
            Segmented::Ran => {}
            Segmented::Not => return self.each_block(m, module, range, true),
            Segmented::Failed { block, k, why } => {
                let b = self.segments.blocks[range.start + block];
                return Err(self.failed(m, Self::whole_run(m, module, b), k, why));
            }
        }
        // The sink's state after the runs one by one is its last run's.
        self.sink.run(p.last);
        self.counts.add(p.totals);
        self.state.prev = Some((module, p.last.block, true, p.ret));
        if !p.keeps_back {
            self.state.back = None;
        }
        Ok(())
    }

    fn event<B: AsRef<[u8]> + Sync>(
        &mut self,
        trace: &Trace<B>,
        visit: &'t Visit<'_, B>,
        e: Event,
    ) -> Result<(), Error> {
        match e {
            Event::Thread(t) => {
                self.end_thread(visit)?;
                self.values = Values::start(trace, visit, t)?;
                self.sig = signals::Signals::default();
                self.state = ThreadExec::default();
                Ok(())
            }
            Event::Run(r) if r.faults => self.faulting(visit, r),
            Event::Run(r) => self.run(&visit.modules()[r.module as usize], r, &mut false),
            Event::Signal { signo, offset } => self.deliver(visit, signo, offset),
            Event::SigReturn { offset, moved } => self.sigreturn(offset, moved),
            Event::Pause { offset } => {
                if let (Some(t), Some(d)) = (self.values.thread, self.data_state()) {
                    self.paused.push((t, offset, d));
                }
                Ok(())
            }
        }
    }

    /// The decoded instructions of `block` (decoded at its first run).
    #[inline]
    fn decoded(&mut self, m: &Module, module: u32, block: BlockIx) -> Result<Rc<Vec<Insn>>, Error> {
        match &self.mods[module as usize].blocks[block.as_u32() as usize] {
            Some(b) => Ok(b.clone()),
            None => self.decode(m, module, block),
        }
    }

    #[cold]
    fn decode(&mut self, m: &Module, module: u32, block: BlockIx) -> Result<Rc<Vec<Insn>>, Error> {
        let md = &self.mods[module as usize];
        let blk = &m.blocks[block];
        let bytes = md
            .image
            .bytes_at(blk.start, u64::from(blk.size))
            .ok_or_else(|| format!("block {:#x}: no bytes in {}", blk.start, m.name))?;
        let mut d = Decoder::with_ip(64, bytes, blk.start, DecoderOptions::NONE);
        let mut insns = Vec::with_capacity(blk.ninsns as usize);
        for _ in 0..blk.ninsns {
            let insn = d.decode();
            let prog = forms::program(&insn, &mut self.info);
            // An instruction the table refuses has no values: the abstract
            // walk refuses it if it runs, before these would be read.
            let full = match md.check {
                true => full::plan(&insn, &prog).unwrap_or_default(),
                false => Vec::new(),
            };
            insns.push(Insn { insn, prog, full });
        }
        let insns = Rc::new(insns);
        self.mods[module as usize].blocks[block.as_u32() as usize] = Some(insns.clone());
        Ok(insns)
    }

    /// The cross-block facts of the procedure of `block`.
    fn proc_facts(
        &mut self,
        m: &Module,
        module: u32,
        block: BlockIx,
    ) -> Result<Rc<ProcFacts>, Error> {
        let pi = m.blocks[block].proc;
        if let Some(f) = &self.mods[module as usize].procs[pi.as_u32() as usize] {
            return Ok(f.clone());
        }
        let range = m.procs[pi].blocks.clone();
        let mut blocks: Vec<Vec<_>> = Vec::with_capacity(range.len());
        for b in range {
            let insns = self.decoded(m, module, BlockIx::from_u32(b))?;
            blocks.push(
                insns
                    .iter()
                    .map(|i| (i.insn, i.prog.clone()))
                    .collect::<Vec<_>>(),
            );
        }
        let md = &self.mods[module as usize];
        let p = &md.db.procs[pi.as_u32() as usize];
        let facts = Rc::new(ProcFacts {
            ways: exec::ways_in(p, &md.returns, &blocks),
            known: exec::entry_knowledge(p, &md.returns, &mut blocks),
            anchors: p.blocks.iter().map(exec::anchors_rsp).collect(),
            before: (blocks.iter())
                .map(|b| (b.iter().map(|(_, p)| (p.before, p.once, p.args))).collect())
                .collect(),
        });
        self.mods[module as usize].procs[pi.as_u32() as usize] = Some(facts.clone());
        Ok(facts)
    }

    /// Sets the thread's state for the start of run `r`: the registers
    /// the analysis says are known there, carried from the run before.
    /// The code of its instructions from `r.first`, compiled for them, or
    /// `None` when it is its block's entry's (`r.first` 0). `plain`: in,
    /// the run before is known to be a way in the analysis assumed (an
    /// edge of a segment that passed the check before); out, whether it
    /// is.
    #[inline(always)]
    fn enter(
        &mut self,
        m: &Module,
        r: BlockRun,
        plain: &mut bool,
    ) -> Result<Option<Rc<BlockCode>>, Error> {
        if self.sig.resumed {
            self.state.edge = Edge::Other;
            if let Some(code) = self.resumed_run(m, r)? {
                return Ok(Some(code));
            }
        }
        let Some(e) = &self.mods[r.module as usize].entries[r.block.as_u32() as usize] else {
            self.new_entry(m, r)?;
            return self.enter(m, r, plain);
        };
        let known = e.known;
        if r.first != 0 && known.0 != 0 {
            return Err(format!(
                "block {:#x} of {} entered in its middle",
                m.blocks[r.block].start, m.name
            )
            .into());
        }
        let mut came = Came::No;
        if known.0 != 0 && !*plain {
            let prev = self.state.prev;
            *plain = prev.is_some() && e.plain_after.get() == prev;
            if !*plain {
                came = self.came_by(r.module, e);
                *plain = came == Came::Plain;
                if *plain {
                    e.plain_after.set(prev);
                }
            }
        }
        self.state.edge = Edge::Plain;
        if came == Came::Back {
            // (Not cached as plain: the stub's run says nothing of the
            // state without the call's before it.)
            if let Some(b) = &self.state.back {
                b.restore(&mut self.state.regs);
                self.state.edge = Edge::Back;
            }
        } else if known.0 != 0 && !*plain {
            match e.facts.ways[e.local as usize].contains(&WayIn::Entry) {
                true => {
                    self.state.edge = match self.entry_rsp(m, r)? {
                        Entered::Call => Edge::Call,
                        Entered::Jump => Edge::Jump,
                        Entered::Outside => Edge::Other,
                    }
                }
                false => {
                    return Err(format!(
                        "block {:#x} of {} entered from a block the data analysis did not assume",
                        m.blocks[r.block].start, m.name
                    )
                    .into())
                }
            }
        }
        self.keep(known)?;
        match r.first {
            0 => Ok(None),
            // A run from the middle starts with nothing known.
            _ => Ok(Some(Rc::new(self.compile(m, r, known)?))),
        }
    }

    /// The thread's state keeps the registers `known` alone, which it
    /// must know.
    #[inline(always)]
    fn keep(&mut self, known: RegSet) -> Result<(), Error> {
        let kept = self.state.regs.keep_exactly(known);
        debug_assert!(kept, "a predecessor's end state covers the block's");
        match kept {
            true => Ok(()),
            false => Err("the data walk lost a register the analysis knows".into()),
        }
    }

    /// The entry of run `r`'s block, at its first run.
    #[cold]
    fn new_entry(&mut self, m: &Module, r: BlockRun) -> Result<(), Error> {
        let facts = self.proc_facts(m, r.module, r.block)?;
        let proc = m.blocks[r.block].proc;
        let local = r.block.as_u32() - m.procs[proc].blocks.start;
        let known = facts.known[local as usize];
        let code = self.compile(m, BlockRun { first: 0, ..r }, known)?;
        let md = &mut self.mods[r.module as usize];
        let flat = match md.check {
            true => None,
            false => FlatCode::of(&code, known, m.load_base),
        };
        let blk = &md.db.procs[proc.as_u32() as usize].blocks[local as usize];
        let back = blk.call.is_some_and(|c| exec::back_call(&c, &md.returns));
        let passes = (md.blocks[r.block.as_u32() as usize].as_ref())
            .is_some_and(|i| exec::passes_through(blk, i.iter().map(|i| &i.prog)));
        md.entries[r.block.as_u32() as usize] = Some(Entry {
            code: Rc::new(code),
            facts,
            local,
            proc: proc.as_u32(),
            known,
            flat,
            back,
            passes,
            leaf: md.returns.leaf(proc.as_u32()),
            plain_after: Cell::new(None),
        });
        Ok(())
    }

    /// Compiles run `r`'s block from `r.first` for `known`.
    fn compile(&mut self, m: &Module, r: BlockRun, known: RegSet) -> Result<BlockCode, Error> {
        let facts = self.proc_facts(m, r.module, r.block)?;
        let local = r.block.as_u32() - m.procs[m.blocks[r.block].proc].blocks.start;
        let insns = self.decoded(m, r.module, r.block)?;
        let mut progs: Vec<_> = (insns.iter()).map(|i| (i.insn, i.prog.clone())).collect();
        for ((_, prog), &(b, once, args)) in progs.iter_mut().zip(&facts.before[local as usize]) {
            (prog.before, prog.once, prog.args) = (b, once, args);
        }
        let anchor = facts.anchors[local as usize];
        Ok(BlockCode::compile(known, &progs, r.first as usize, anchor))
    }

    /// At a procedure's entry not reached along a plain edge: the thread's
    /// state becomes the entry's `rsp`, from the call or jump the run
    /// before ended with, or the outside-entry stub's VALUE (`Entered`),
    /// and the argument registers the entry takes from a direct call,
    /// which the call kept (`Returns::args`; only a direct call enters a
    /// procedure that takes them, else an error). How it was entered.
    fn entry_rsp(&mut self, m: &Module, r: BlockRun) -> Result<Entered, Error> {
        let pi = m.blocks[r.block].proc;
        let prev = match self.state.prev {
            Some((pm, pb, true, _)) if pm == r.module => {
                let pp = m.blocks[pb].proc;
                let local = pb.as_u32() - m.procs[pp].blocks.start;
                let db = &self.mods[pm as usize].db;
                db.procs[pp.as_u32() as usize].blocks[local as usize].call
            }
            _ => None,
        };
        let here = || {
            format!(
                "procedure {} block {:#x}",
                m.procs[pi].name, m.blocks[r.block].start
            )
        };
        let carried = self.state.regs.get(Gpr::RSP);
        let args = self.mods[r.module as usize].returns.args(pi.as_u32());
        let entered = Entered::by(prev.as_ref(), pi.as_u32());
        if args.0 != 0 && entered != Entered::Call {
            return Err(format!(
                "{}: entered by a way other than a direct call, but its entry takes its callers' argument registers",
                here()
            )
            .into());
        }
        let rsp = match entered {
            Entered::Call => carried.map(|v| v.wrapping_sub(8)),
            Entered::Jump => carried,
            Entered::Outside => Some(self.stub_rsp(m, pi.as_u32(), &here)?),
        };
        let rsp = rsp.ok_or_else(|| {
            format!(
                "{}: entered by a call or jump whose rsp the data walk does not know",
                here()
            )
        })?;
        let st = &mut self.state.regs;
        if !st.keep_exactly(args) {
            return Err(format!("{}: the call did not keep its arguments", here()).into());
        }
        st.set(Gpr::RSP, rsp);
        Ok(entered)
    }

    /// The VALUE the outside-entry stub of procedure `q` wrote right after
    /// its ENTER: it must be the thread's next value.
    fn stub_rsp(&mut self, m: &Module, q: u32, here: &dyn Fn() -> String) -> Result<u64, Error> {
        let raw = (m.tag << 24) | q;
        match self.values.take_entered(raw)? {
            Some(v) => Ok(v),
            None => Err(format!(
                "{}: entered from outside, but the thread's next data value is not its stub's rsp",
                here()
            )
            .into()),
        }
    }

    /// Whether the run before the one of `e`'s block (in module
    /// `module`, in its thread, to its end) is one of the ways in the
    /// analysis assumed that carry the state: a plain predecessor in the
    /// same procedure, a `ret` of the callee or of a procedure it
    /// reaches by tail calls, or a call whose callee runs no traced code,
    /// itself or with only blocks that pass through run since it, or a
    /// call to a leaf with a `ret` of a leaf last and only leaves' blocks
    /// run since it.
    fn came_by(&self, module: u32, e: &Entry) -> Came {
        let Some((pm, pb, true, by_ret)) = self.state.prev else {
            return Came::No;
        };
        if pm != module {
            return Came::No;
        }
        let md = &self.mods[pm as usize];
        let Some(p) = &md.entries[pb.as_u32() as usize] else {
            return Came::No;
        };
        let call = |b: u32| {
            (self.state.back.as_ref())
                .is_some_and(|c| c.module == module && c.proc == e.proc && c.local == b)
        };
        let mut came = Came::No;
        for w in &e.facts.ways[e.local as usize] {
            match *w {
                WayIn::Plain(b) if p.proc == e.proc && p.local == b => return Came::Plain,
                WayIn::Return(f) if by_ret && md.returns.tail_reaches(f, p.proc) => {
                    return Came::Plain
                }
                WayIn::Back(b) if p.proc == e.proc && p.local == b => return Came::Plain,
                WayIn::Back(b) if (p.passes || p.leaf && by_ret) && call(b) => came = Came::Back,
                _ => {}
            }
        }
        came
    }

    /// Run `r`; `plain` as [`Writer::enter`]'s. Inlined with `enter` and
    /// `run_entered` into the event loop: sort's runs come mostly one by
    /// one (a call per witness ends the control walk's segments), and the
    /// two calls' prologues and epilogues were about 3 % of its instructions.
    #[inline(always)]
    fn run(&mut self, m: &Module, r: BlockRun, plain: &mut bool) -> Result<(), Error> {
        let from = self.enter(m, r, plain)?;
        self.run_entered(m, r, from)
    }

    /// Run `r` after its [`Writer::enter`], which gave `from`.
    #[inline(always)]
    fn run_entered(
        &mut self,
        m: &Module,
        r: BlockRun,
        from: Option<Rc<BlockCode>>,
    ) -> Result<(), Error> {
        if m.shown {
            self.sink.run(r);
        }
        let ret = match from {
            None => self.run_entry(m, r)?,
            Some(code) => {
                self.run_code(m, r, &code)?;
                code.ret
            }
        };
        let to_end = r.end == m.blocks[r.block].ninsns;
        self.state.prev = Some((r.module, r.block, to_end, ret));
        self.keep_back(r, to_end);
        Ok(())
    }

    /// After run `r`: the state at the end of a call block whose return
    /// carries the preserved registers is kept; any other run but one
    /// that passes through or of a leaf drops it.
    #[inline]
    fn keep_back(&mut self, r: BlockRun, to_end: bool) {
        let e = self.mods[r.module as usize].entries[r.block.as_u32() as usize].as_ref();
        match e {
            Some(e) if e.back && to_end => {
                self.state.back = Some(Back::of(r.module, e, &self.state.regs))
            }
            // A leaf's or pass-through block's run that stops early (a
            // fault, a signal: the rest of it runs when the handler
            // returns) keeps it too.
            Some(e) if e.passes || e.leaf => {}
            _ => self.state.back = None,
        }
    }

    /// Run `r` of its block's entry code (entered at its start), by the
    /// flat code when it is whole; whether the block ends with `ret`.
    #[inline]
    fn run_entry(&mut self, m: &Module, r: BlockRun) -> Result<bool, Error> {
        let Writer {
            mods,
            values,
            state,
            sink,
            block,
            counts,
            ..
        } = self;
        let e = (mods[r.module as usize].entries[r.block.as_u32() as usize].as_ref())
            .ok_or("a block run before its entry")?;
        let (code, n) = (&*e.code, (r.end - r.first) as usize);
        let Some(flat) = e.flat.as_ref().filter(|_| n == code.insns.len()) else {
            let code = e.code.clone();
            self.run_code(m, r, &code)?;
            return Ok(code.ret);
        };
        let take = &mut |what| values.take_as(what, m);
        if m.shown {
            match sink.whole(r, (code, flat), m.load_base, &mut state.regs, take)? {
                Whole::Ran => {
                    counts.add_block(code);
                    return Ok(code.ret);
                }
                Whole::Failed(k, why) => return Err(self.failed(m, r, k, why)),
                Whole::Not => {}
            }
        }
        if let Err((k, why)) = flat.run(&mut state.regs, take, &mut block.addrs) {
            return Err(self.failed(m, r, k, why));
        }
        block.reps.clear();
        counts.add_block(code);
        if m.shown {
            sink.block(0, (code, n), m.load_base, block)?;
        }
        Ok(code.ret)
    }

    /// Run `r` of `code` (`r.first` onwards, compiled for the state).
    fn run_code(&mut self, m: &Module, r: BlockRun, code: &BlockCode) -> Result<(), Error> {
        match self.mods[r.module as usize].check {
            true => self.run_checked(m, r, code),
            false => self.run_block(m, r, code),
        }
    }

    /// The error of instruction `k` of run `r`.
    #[cold]
    fn failed(&mut self, m: &Module, r: BlockRun, k: usize, why: String) -> Error {
        match self.decoded(m, r.module, r.block) {
            Ok(insns) => refused(m, r, &insns[r.first as usize + k].insn, why),
            Err(e) => e,
        }
    }

    /// Run `r` of `code` in one pass by the interpreter's state, its
    /// references to the sink per block.
    fn run_block(&mut self, m: &Module, r: BlockRun, code: &BlockCode) -> Result<(), Error> {
        let n = (r.end - r.first) as usize;
        let mut out = std::mem::take(&mut self.block);
        let values = &mut self.values;
        let take = &mut |what| values.take_as(what, m);
        let mut exec = self.state.regs.exec(m.load_base);
        if let Err((k, why)) = exec.run_block(code, n, take, &mut out) {
            return Err(self.failed(m, r, k, why));
        }
        self.state.regs = Regs::of(&exec);
        self.count_block(code, n, &out);
        let fed = match m.shown {
            true => (self.sink).block(r.first, (code, n), m.load_base, &out),
            false => Ok(()),
        };
        self.block = out;
        fed
    }

    /// Run `r` of `code` an instruction at a time, each address compared
    /// with the full one recorded after the block's values (`--check`).
    fn run_checked(&mut self, m: &Module, r: BlockRun, code: &BlockCode) -> Result<(), Error> {
        let insns = self.decoded(m, r.module, r.block)?;
        // The reused addresses, out of `self` while `self` is borrowed.
        let mut got = std::mem::take(&mut self.addrs);
        let mut exec = self.state.regs.exec(m.load_base);
        let walked =
            (insns[r.first as usize..r.end as usize].iter().enumerate()).try_for_each(|(k, i)| {
                self.abstract_insn((m, r), (i, &mut exec), code, k, &mut got)?;
                let vals = self.take(i.full.len())?;
                self.compare(m, r, r.first as usize + k, i, &got, &vals)?;
                self.count(code, k, got.rep.map_or(1, |(count, _)| count));
                match m.shown {
                    true => {
                        let c = (&code.insns[k], m.load_base);
                        let at = r.first + k as u32;
                        feed(self.sink, at, c, (code.refs(k), &got.addrs), got.rep)
                    }
                    false => Ok(()),
                }
            });
        self.addrs = got;
        self.state.regs = Regs::of(&exec);
        walked
    }

    /// Runs `i`, instruction `k` of `code`, in the thread's abstract
    /// execution, reading its values; its addresses into `got`. A
    /// recorded address is the original program's: the copies read
    /// copied jump tables (`Module::original_data_address`).
    #[inline]
    fn abstract_insn(
        &mut self,
        (m, r): (&Module, BlockRun),
        (i, exec): (&Insn, &mut Exec),
        code: &BlockCode,
        k: usize,
        got: &mut InsnAddrs,
    ) -> Result<(), Error> {
        let values = &mut self.values;
        let take = &mut |what| values.take_as(what, m);
        let run = exec.run_code(code, k, take, got);
        run.map_err(|why| refused(m, r, &i.insn, why))
    }

    /// `--check`: every rebuilt address (and a `rep`'s count) against the
    /// one recorded in full.
    fn compare(
        &mut self,
        m: &Module,
        r: BlockRun,
        k: usize,
        i: &Insn,
        got: &InsnAddrs,
        vals: &[u64],
    ) -> Result<(), Error> {
        let full = addresses(i, vals, m);
        let rep_full = i
            .full
            .iter()
            .zip(vals)
            .find(|(p, _)| **p == Recorded::Rcx)
            .map(|(_, &v)| v);
        let rep_got = got.rep.map(|(c, _)| c);
        let bad = (0..full.len()).find(|&j| full[j] != got.addrs[j]);
        self.counts.checked_refs += full.len() as u64;
        if bad.is_none() && rep_full == rep_got {
            return Ok(());
        }
        let pi = m.blocks[r.block].proc;
        let (expected, rebuilt) = bad.map_or((rep_full.unwrap_or(0), rep_got.unwrap_or(0)), |j| {
            (full[j], got.addrs[j])
        });
        Err(format!(
            "data check: procedure {} block {:#x} instruction {k} at {:#x} ({}), reference {}: expected {expected:#x}, rebuilt {rebuilt:#x}",
            m.procs[pi].name,
            m.blocks[r.block].start,
            i.insn.ip(),
            i.insn,
            bad.map_or("rcx".to_owned(), |j| j.to_string()),
        )
        .into())
    }

    /// The next `n` values of the thread.
    fn take(&mut self, n: usize) -> Result<Vec<u64>, Error> {
        Ok((0..n)
            .map(|_| self.values.take())
            .collect::<Result<_, _>>()?)
    }

    /// Counts the references of instructions `0..n` of `code`, every
    /// iteration of a `rep` (`out`'s).
    #[inline]
    fn count_block(&mut self, code: &BlockCode, n: usize, out: &BlockAddrs) {
        match n == code.insns.len() {
            true => self.counts.add_block(code),
            false => (0..n).for_each(|k| self.count(code, k, 1)),
        }
        // A `rep` counted once above runs `count` times.
        for &(k, count, _) in &out.reps {
            self.count(code, k as usize, count.wrapping_sub(1));
        }
    }

    /// Counts the references of instruction `k` of `code`, `times` times.
    #[inline]
    fn count(&mut self, code: &BlockCode, k: usize, times: u64) {
        let c = &code.insns[k];
        let n = &mut self.counts;
        n.refs = n
            .refs
            .wrapping_add(times.wrapping_mul(code.refs(k).len() as u64));
        n.static_refs = (n.static_refs).wrapping_add(times.wrapping_mul(u64::from(c.statik)));
        n.recorded_refs = (n.recorded_refs).wrapping_add(times.wrapping_mul(u64::from(c.recorded)));
    }
}

/// Whether a return point entered with the kept call state after the
/// blocks of `links` (entered by `ways`) gets the state the blocks' code
/// leaves there but for `rsp`'s 8: the last block is a PLT stub's (it
/// passes through) that writes no register's slot, entered by a call
/// from the block before it, a call block whose state is the one kept.
fn back_past_stub<'e>(
    links: &[Link],
    ways: &[Edge],
    entry: impl Fn(BlockIx) -> Option<&'e Entry>,
) -> bool {
    let [.., call, stub] = links else {
        return false;
    };
    let stub_ok = entry(stub.block)
        .is_some_and(|e| e.passes && e.flat.as_ref().is_some_and(FlatCode::writes_no_slot));
    ways.last() == Some(&Edge::Call) && stub_ok && entry(call.block).is_some_and(|e| e.back)
}

/// The error of `insn`, an instruction of run `r`, that the data walk
/// could not run: one line naming its procedure, block and instruction.
fn refused(m: &Module, r: BlockRun, insn: &Instruction, why: String) -> Error {
    let pi = m.blocks[r.block].proc;
    format!(
        "the data walk stopped in procedure {} block {:#x} at instruction {:#x} ({insn}): {why}",
        m.procs[pi].name,
        m.blocks[r.block].start,
        insn.ip(),
    )
    .into()
}

fn short(thread: Option<ThreadId>, n: u64) -> String {
    format!(
        "thread {}: the data values end after {n} (the trace is short of values)",
        thread.map_or(0, |t| t.0)
    )
}

/// The run-time address of each reference of `i` (a `rep`'s first
/// iteration), from the instruction or from its full values `vals` (the
/// original program's, as in `Writer::abstract_insn`).
fn addresses(i: &Insn, vals: &[u64], m: &Module) -> Vec<u64> {
    let base = m.load_base;
    let mut out: Vec<u64> = i
        .prog
        .refs
        .iter()
        .map(|r| match full::static_addr(&i.insn, r) {
            Some(s) if s.module => base.wrapping_add(s.addr),
            Some(s) => s.addr,
            None => 0,
        })
        .collect();
    for (p, &v) in i.full.iter().zip(vals) {
        if let Recorded::Addr(k) = *p {
            out[k] = m.original_data_address(v);
        }
    }
    out
}
