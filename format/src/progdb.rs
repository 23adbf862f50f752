//! The program database of one instrumented module: everything the
//! regenerator needs to rebuild the module's block and instruction trace
//! without the binary (paper 003, Section 4.2: the CFG, the witness edges
//! and their numbers, and what each call vertex calls).
//!
//! Stored as the opaque payload of a PROGRAM_DATABASE section
//! ([`ProgramDb::encode`] / [`ProgramDb::decode`], version [`VERSION`]);
//! the byte layout is in `docs/format.md`.
//!
//! Invariants (checked by [`ProgramDb::check`], which `decode` runs):
//! - procedure `i` is the procedure numbered `i` in ENTER records;
//! - in each procedure, blocks are sorted by `start`, EXIT is the virtual
//!   block `blocks.len()`, `entry < blocks.len()`, edge endpoints are
//!   `<= blocks.len()` and edges leave real blocks only;
//! - witness numbers of a procedure are `0..n` without gaps or repeats;
//! - a block with `call: Some(_)` ends in a call (or tail call) instruction,
//!   and `CallTarget::Proc(q)` names a traced procedure;
//! - a signal map ([`SigMap`]) belongs to a traced procedure; its ranges
//!   start at strictly increasing offsets inside the copy, the first at 0,
//!   and every block, instruction and edge they name exists.

/// Version of the encoding written by [`ProgramDb::encode`] (2: signal maps;
/// 3: [`CallDb::plt`], the second call byte and [`CallDb::jmpbuf`]; 4: the
/// flags byte, [`ProgramDb::counts_returns`]; 5: [`ProgramDb::moved_tables`];
/// 6: [`EdgeKindDb::Resume`]; 7: [`ProgramDb::copy_dependent`]).
/// [`ProgramDb::decode`] reads versions 2 to 7.
pub const VERSION: u32 = 7;
/// Oldest version [`ProgramDb::decode`] reads.
const OLDEST_VERSION: u32 = 2;

/// One instrumented module.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ProgramDb {
    /// Link-time address of the module's lowest PT_LOAD (page-aligned down):
    /// `--relative` offsets are `vaddr - link_base`.
    pub link_base: u64,
    /// Link-time address where the rewriter placed the runtime blob: the
    /// recorder learns the blob's run-time address from each thread's slot,
    /// so the load bias is `runtime address - runtime_vaddr`.
    pub runtime_vaddr: u64,
    /// Every return (an edge of kind [`EdgeKindDb::Return`] taken) is a
    /// counted transfer too: the rewriter increments the thread's transfer
    /// count just before each `ret` (version 4; false in older databases,
    /// whose code did not).
    pub counts_returns: bool,
    /// Indexed by procedure number.
    pub procs: Vec<ProcDb>,
    /// The jump tables the rewriter copied, which the copies read instead
    /// of the originals (version 5; empty in older databases). A data
    /// address recorded in a copy is the original's in the trace
    /// ([`original_address`]).
    pub moved_tables: Vec<MovedTable>,
    /// Traced procedures whose path depends on the copies' addresses
    /// (version 7; empty in older databases): the unwinder's FDE search
    /// looks up return addresses, which are the copies' in the rewritten
    /// program. From the first instruction of one on, a thread's stream is
    /// the rewritten program's, not the native one's.
    pub copy_dependent: Vec<u32>,
}

/// A jump table the rewriter copied: entry `i` of the copy at `new` is
/// entry `i` of the table at `old`, in the same format (link-time
/// addresses, `size` bytes each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MovedTable {
    /// The original table.
    pub old: u64,
    /// The copy.
    pub new: u64,
    /// Bytes in each.
    pub size: u64,
}

/// Version 5's list of [`MovedTable`]s.
fn decode_moved_tables(r: &mut Reader<'_>) -> Result<Vec<MovedTable>, String> {
    let n = r.uleb("moved tables")?;
    // Three numbers of at least one byte each per table.
    if n > (r.bytes.len() - r.pos) as u64 / 3 {
        return Err(r.err(format_args!("{n} moved tables in too few bytes")));
    }
    (0..n)
        .map(|_| {
            Ok(MovedTable {
                old: r.uleb("moved table")?,
                new: r.uleb("moved table")?,
                size: r.uleb("moved table")?,
            })
        })
        .collect()
}

/// The original program's address for link-time address `link` of the
/// rewritten module: inside a copied table, the original table's entry;
/// elsewhere `link` itself.
pub fn original_address(tables: &[MovedTable], link: u64) -> u64 {
    tables
        .iter()
        .find(|t| link.wrapping_sub(t.new) < t.size)
        .map_or(link, |t| t.old + (link - t.new))
}

/// Whether a procedure's copy is instrumented.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcStatus {
    /// Relocated and instrumented: its blocks appear in the trace.
    Traced,
    /// Left as it was (it runs untraced, like library code); the reason.
    LeftAlone(String),
}

/// One procedure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcDb {
    /// The procedure's symbol name.
    pub name: String,
    /// Whether it is traced, and if not why it is left alone.
    pub status: ProcStatus,
    /// Entry block (meaningless for a procedure left alone with no blocks).
    pub entry: u32,
    /// The basic blocks, indexed by block number.
    pub blocks: Vec<BlockDb>,
    /// The CFG edges; a witness or choice number indexes the edges leaving a block.
    pub edges: Vec<EdgeDb>,
    /// Where each address of the instrumented copy stands in the original
    /// procedure (a signal's interrupted rip is one of them); `None` for a
    /// procedure left alone.
    pub sigmap: Option<SigMap>,
}

/// The instrumented copy of one procedure, address by address, as the
/// regenerator needs it to place a signal (docs/regen.md, "Signals"): a
/// list of ranges, each covering `[offset, next offset)` of the copy (the
/// last one up to `len`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SigMap {
    /// Link-time address of the copy's first byte (its outside-entry stub).
    pub start: u64,
    /// Bytes of the copy.
    pub len: u64,
    /// The ranges of the copy, ascending by offset, each with where a thread stopped in it stands.
    pub ranges: Vec<SigRange>,
}

/// One range of a [`SigMap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SigRange {
    /// Offset of the range's first byte from [`SigMap::start`].
    pub offset: u64,
    /// Where a thread interrupted in this range stands.
    pub point: SigPoint,
}

/// Where a thread interrupted inside a range of the copy stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SigPoint {
    /// Still in untraced code: the outside-entry stub before its ENTER
    /// record is written.
    Outside,
    /// Before instruction `insn` of block `block` of procedure `proc`, with
    /// everything the copy writes before that instruction written. `count`
    /// 0: the whole range is instrumentation standing there. `count` n:
    /// the range is exactly the copies of instructions `insn..insn + n`,
    /// each but the last as long as its original, and an address inside it
    /// is before the instruction that starts there.
    Insn {
        /// The procedure's number.
        proc: u32,
        /// The block's index in the procedure.
        block: u32,
        /// The instruction's index in the block.
        insn: u32,
        /// How many original instructions the range copies (see above).
        count: u32,
    },
    /// Block `edges[edge].from` has completed and control is on the edge,
    /// whose witness is not written yet (a witness written after the
    /// block's last instruction: fall-through, taken-edge stub, jump-table
    /// case, lazy-binding stub).
    Witness {
        /// Index of the edge in the procedure's edges.
        edge: u32,
    },
    /// Call block `block` returned from a call whose RETURN record (or
    /// FORKED) is not written yet.
    Returned {
        /// Index of the call block in the procedure.
        block: u32,
    },
}

/// A basic block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockDb {
    /// Link-time address of the first instruction.
    pub start: u64,
    /// Length in bytes of each instruction, in order.
    pub insn_lens: Vec<u8>,
    /// The call the block ends with, if it is a call vertex or a tail call.
    pub call: Option<CallDb>,
}

/// How control leaves along an edge (mirrors the CFG's edge kinds).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum EdgeKindDb {
    /// Control falls through to the next block.
    FallThrough = 0,
    /// A direct branch or jump is taken.
    Taken = 1,
    /// An indirect jump through a resolved jump table reaches one of its cases.
    JumpTable = 2,
    /// A call returns to the block after the call.
    CallReturn = 3,
    /// The procedure returns (to EXIT).
    Return = 4,
    /// The procedure leaves by a tail call (to EXIT).
    TailCall = 5,
    /// A call that does not return ends the procedure (to EXIT).
    NoReturn = 6,
    /// An instruction that stops the thread (`hlt`, `ud2`) ends the procedure (to EXIT).
    Halt = 7,
    /// From a trap (`hlt`, `ud2`) to the code right after it, where a
    /// signal handler that moves rip past the trap resumes (version 6).
    Resume = 8,
}

/// An edge of a procedure's CFG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EdgeDb {
    /// Index of the source block.
    pub from: u32,
    /// `blocks.len()` is EXIT.
    pub to: u32,
    /// How control leaves along it.
    pub kind: EdgeKindDb,
    /// The witness number written when the edge is taken (stream byte
    /// `n + 1` for `n < 254`, else a WIDE record).
    pub witness: Option<u16>,
}

/// What a call vertex calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallTarget {
    /// A traced procedure of this module, entered without an ENTER record.
    Proc(u32),
    /// Untraced code (an import, an indirect target, a procedure left
    /// alone): traced procedures it calls announce themselves with ENTER.
    External,
    /// `exit`-like: an EXIT(status) record is written just before the call.
    /// With `returns` and `marker` (a `syscall`): only when the system call
    /// ends the thread or the process (exit, exit_group); otherwise RETURN
    /// follows it.
    Exit,
}

/// The call a block ends with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallDb {
    /// The callee, as far as the rewriter knows it.
    pub target: CallTarget,
    /// A RETURN record is written when control comes back from the callee
    /// (after any callbacks), so callbacks are never ambiguous. False when
    /// the callee can never run traced code (or does not return).
    pub marker: bool,
    /// False for calls that never return.
    pub returns: bool,
    /// A tail call (`jmp`): the block's edge goes to EXIT.
    pub tail: bool,
    /// For a PLT stub's jump through its GOT slot: the procedure number of
    /// the lazy-binding entry the slot points to before the import is
    /// bound (its ENTER follows at most once per thread).
    pub lazy: Option<u32>,
    /// The block of this procedure where the unwinder lands when the call
    /// throws (C++ exceptions: its LSDA call-site entry), if any.
    pub landing: Option<u32>,
    /// A SETJMP or LONGJMP record (naming its jmp_buf) is written just
    /// before this call: its target is a setjmp- or longjmp-like import
    /// (version 3). The regenerator reads those records at these calls
    /// only: a procedure whose first record is its setjmp's SETJMP writes
    /// it right after its caller's call, which must not take it. Version-2
    /// databases read as true for every call that is not a tail call (the
    /// rule before).
    pub jmpbuf: bool,
    /// A PLT stub's import jump counted at the way into the stub (version
    /// 3). On the stub's `jmp [GOT]` (an external tail call): the jump is
    /// not a counted transfer, and a successor that is not EXIT (the
    /// stub's lazy-binding half) is taken exactly when the thread's next
    /// item is LAZY naming the stub (`docs/regen.md`, "PLT stubs"). On a
    /// call or tail jump to a stub whose jump has it (`Proc`): counted,
    /// a tail jump too. [`ProgramDb::check`] keeps the two sides agreeing.
    pub plt: bool,
    /// An unresolved indirect jump (`jmp reg`/`jmp [mem]` whose targets
    /// the analysis could not bound; version 3, second call byte): a tail
    /// call to `External` after which the thread's next item is
    /// INDIRECT(target). A target that starts a block of this procedure is
    /// where the copy went on (no pending witness, nothing counted); any
    /// other target is a counted jump into untraced code, preceded by
    /// DESYNC when it lies inside this procedure (`docs/regen.md` section
    /// 3, "Unresolved jumps").
    pub indirect: bool,
}

impl CallDb {
    /// Whether the call is a counted transfer (the thread's transfer count,
    /// carried by SIGNAL, is incremented just before it; `docs/runtime.md`
    /// section 2): every call and tail call into untraced code, and every
    /// call (not tail jump) to a traced procedure; not a system call or a
    /// call to an `exit`-like import (target `Exit`). A PLT stub's import
    /// jump with [`CallDb::plt`] is not counted, and a tail jump to such a
    /// stub is: every way into the stub is then counted (a call, a tail
    /// jump, or an outside entry, whose ENTER separates), so each entry
    /// into untraced code still follows exactly one counted transfer. The
    /// rewriter emits the increments and the regenerator mirrors them by
    /// this one rule.
    pub fn counts_transfer(&self) -> bool {
        match self.target {
            CallTarget::External => !self.plt && !self.indirect,
            CallTarget::Proc(_) => !self.tail || self.plt,
            CallTarget::Exit => false,
        }
    }
}

use crate::error::{Error, Result};

/// First bytes of an encoded database.
pub const MAGIC: [u8; 4] = *b"AEDB";

/// Longest x86-64 instruction.
const MAX_INSN_LEN: u8 = 15;

// Tags of `BlockDb::call` (low 2 bits of the call byte) and its flag bits.
const CALL_NONE: u8 = 0;
const CALL_PROC: u8 = 1;
const CALL_EXTERNAL: u8 = 2;
const CALL_EXIT: u8 = 3;
const CALL_MARKER: u8 = 0x10;
const CALL_RETURNS: u8 = 0x20;
const CALL_TAIL: u8 = 0x40;
const CALL_LAZY: u8 = 0x80;
const CALL_LANDING: u8 = 0x08;
/// Second call byte (version 3).
const CALL2_JMPBUF: u8 = 0x01;
const CALL2_INDIRECT: u8 = 0x02;
const CALL_PLT: u8 = 0x04;
/// Flags byte (version 4): [`ProgramDb::counts_returns`].
const DB_COUNTS_RETURNS: u8 = 0x01;
/// Edge byte: kind in the low 3 bits, this bit when a witness number follows.
const EDGE_WITNESS: u8 = 0x80;
// Tags of `SigPoint` (low 2 bits of the point byte); bit 7: `Insn` of
// another procedure (its number follows).
const SIG_OUTSIDE: u8 = 0;
const SIG_INSN: u8 = 1;
const SIG_WITNESS: u8 = 2;
const SIG_RETURNED: u8 = 3;
const SIG_OTHER_PROC: u8 = 0x80;

impl EdgeKindDb {
    /// Every kind, indexed by its `repr(u8)` value.
    pub const ALL: [EdgeKindDb; 9] = [
        EdgeKindDb::FallThrough,
        EdgeKindDb::Taken,
        EdgeKindDb::JumpTable,
        EdgeKindDb::CallReturn,
        EdgeKindDb::Return,
        EdgeKindDb::TailCall,
        EdgeKindDb::NoReturn,
        EdgeKindDb::Halt,
        EdgeKindDb::Resume,
    ];

    /// Kinds that leave the procedure (their edge goes to EXIT).
    pub fn is_exit(self) -> bool {
        matches!(
            self,
            EdgeKindDb::Return | EdgeKindDb::TailCall | EdgeKindDb::NoReturn | EdgeKindDb::Halt
        )
    }
}

impl BlockDb {
    /// Size of the block in bytes.
    pub fn size(&self) -> u64 {
        self.insn_lens.iter().map(|&l| u64::from(l)).sum()
    }
}

impl ProcDb {
    /// The virtual EXIT block.
    pub fn exit(&self) -> u32 {
        self.blocks.len() as u32
    }

    /// Whether the procedure's blocks appear in traces.
    pub fn is_traced(&self) -> bool {
        self.status == ProcStatus::Traced
    }
}

/// Appends `v` in uleb128 (gimli's encoder).
fn put_uleb(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(gimli::leb128::write::Leb128::unsigned(v).bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_uleb(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// A read cursor over database bytes; every failure names the byte position.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, what: impl std::fmt::Display) -> String {
        format!("at database byte {}: {what}", self.pos)
    }
    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], String> {
        match self
            .pos
            .checked_add(n)
            .and_then(|end| self.bytes.get(self.pos..end))
        {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(self.err(format_args!(
                "{field} ({n} bytes) runs past the end ({} bytes)",
                self.bytes.len()
            ))),
        }
    }
    fn u8(&mut self, field: &str) -> Result<u8, String> {
        Ok(self.take(1, field)?[0])
    }
    fn u32(&mut self, field: &str) -> Result<u32, String> {
        let s = self.take(4, field)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self, field: &str) -> Result<u64, String> {
        let s = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn uleb(&mut self, field: &str) -> Result<u64, String> {
        let start = self.pos;
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8(field)?;
            let bits = u64::from(b & 0x7f);
            if shift == 63 && bits > 1 {
                self.pos = start;
                return Err(self.err(format_args!("{field} overflows 64 bits")));
            }
            v |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        self.pos = start;
        Err(self.err(format_args!("{field} overflows 64 bits")))
    }
    fn u32_leb(&mut self, field: &str) -> Result<u32, String> {
        let at = self.pos;
        let v = self.uleb(field)?;
        u32::try_from(v).map_err(|_| {
            self.pos = at;
            self.err(format_args!("{field} {v} does not fit 32 bits"))
        })
    }
    /// A count of items that each take at least `min_bytes`: bounded by what is
    /// left, so a hostile count cannot make us allocate.
    fn count(&mut self, field: &str, min_bytes: usize) -> Result<usize, String> {
        let at = self.pos;
        let n = self.uleb(field)?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n.saturating_mul(min_bytes as u64) > left {
            self.pos = at;
            return Err(self.err(format_args!(
                "{field} {n} needs more than the {left} bytes left"
            )));
        }
        Ok(n as usize)
    }
    fn string(&mut self, field: &str) -> Result<String, String> {
        let n = self.count(field, 1)?;
        let at = self.pos;
        let s = self.take(n, field)?;
        String::from_utf8(s.to_vec()).map_err(|_| {
            self.pos = at;
            self.err(format_args!("{field} is not UTF-8"))
        })
    }
}

impl ProgramDb {
    /// The compact encoding (layout in `docs/format.md`, "The program
    /// database"): little-endian, counts and numbers in unsigned LEB128,
    /// block starts as deltas from the previous block, instruction lengths
    /// as raw bytes.
    pub fn encode(&self) -> Vec<u8> {
        debug_assert_eq!(self.check().map_err(|e| e.to_string()), Ok(()));
        self.encode_raw(VERSION)
    }

    /// [`ProgramDb::encode`] in encoding `version` (tests write version 2
    /// too), without its debug check (tests build invalid inputs).
    fn encode_raw(&self, version: u32) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&self.link_base.to_le_bytes());
        out.extend_from_slice(&self.runtime_vaddr.to_le_bytes());
        if version >= 4 {
            out.push(if self.counts_returns {
                DB_COUNTS_RETURNS
            } else {
                0
            });
        }
        put_uleb(&mut out, self.procs.len() as u64);
        for (pi, p) in self.procs.iter().enumerate() {
            put_str(&mut out, &p.name);
            match &p.status {
                ProcStatus::Traced => out.push(0),
                ProcStatus::LeftAlone(why) => {
                    out.push(1);
                    put_str(&mut out, why);
                }
            }
            put_uleb(&mut out, u64::from(p.entry));
            put_uleb(&mut out, p.blocks.len() as u64);
            // Deltas are taken modulo 2^64 so that encoding is total; `check`
            // (run by `decode`) rejects unsorted blocks.
            let mut prev = 0u64;
            for b in &p.blocks {
                put_uleb(&mut out, b.start.wrapping_sub(prev));
                prev = b.start;
                put_uleb(&mut out, b.insn_lens.len() as u64);
                out.extend_from_slice(&b.insn_lens);
                match b.call {
                    None => out.push(CALL_NONE),
                    Some(c) => {
                        let (tag, proc) = match c.target {
                            CallTarget::Proc(q) => (CALL_PROC, Some(q)),
                            CallTarget::External => (CALL_EXTERNAL, None),
                            CallTarget::Exit => (CALL_EXIT, None),
                        };
                        let mut byte = tag;
                        for (flag, bit) in [
                            (c.marker, CALL_MARKER),
                            (c.returns, CALL_RETURNS),
                            (c.tail, CALL_TAIL),
                            (c.lazy.is_some(), CALL_LAZY),
                            (c.landing.is_some(), CALL_LANDING),
                            (c.plt, CALL_PLT),
                        ] {
                            if flag {
                                byte |= bit;
                            }
                        }
                        out.push(byte);
                        if version >= 3 {
                            let mut byte2 = if c.jmpbuf { CALL2_JMPBUF } else { 0 };
                            if c.indirect {
                                byte2 |= CALL2_INDIRECT;
                            }
                            out.push(byte2);
                        }
                        if let Some(q) = proc {
                            put_uleb(&mut out, u64::from(q));
                        }
                        if let Some(l) = c.lazy {
                            put_uleb(&mut out, u64::from(l));
                        }
                        if let Some(l) = c.landing {
                            put_uleb(&mut out, u64::from(l));
                        }
                    }
                }
            }
            put_uleb(&mut out, p.edges.len() as u64);
            for e in &p.edges {
                put_uleb(&mut out, u64::from(e.from));
                put_uleb(&mut out, u64::from(e.to));
                let mut byte = e.kind as u8;
                if e.witness.is_some() {
                    byte |= EDGE_WITNESS;
                }
                out.push(byte);
                if let Some(w) = e.witness {
                    put_uleb(&mut out, u64::from(w));
                }
            }
            match &p.sigmap {
                None => out.push(0),
                Some(m) => {
                    out.push(1);
                    put_uleb(&mut out, m.start);
                    put_uleb(&mut out, m.len);
                    put_uleb(&mut out, m.ranges.len() as u64);
                    let mut prev = 0u64;
                    for r in &m.ranges {
                        put_uleb(&mut out, r.offset.wrapping_sub(prev));
                        prev = r.offset;
                        match r.point {
                            SigPoint::Outside => out.push(SIG_OUTSIDE),
                            SigPoint::Insn {
                                proc,
                                block,
                                insn,
                                count,
                            } => {
                                let other = proc as usize != pi;
                                out.push(SIG_INSN | if other { SIG_OTHER_PROC } else { 0 });
                                if other {
                                    put_uleb(&mut out, u64::from(proc));
                                }
                                put_uleb(&mut out, u64::from(block));
                                put_uleb(&mut out, u64::from(insn));
                                put_uleb(&mut out, u64::from(count));
                            }
                            SigPoint::Witness { edge } => {
                                out.push(SIG_WITNESS);
                                put_uleb(&mut out, u64::from(edge));
                            }
                            SigPoint::Returned { block } => {
                                out.push(SIG_RETURNED);
                                put_uleb(&mut out, u64::from(block));
                            }
                        }
                    }
                }
            }
        }
        if version >= 5 {
            put_uleb(&mut out, self.moved_tables.len() as u64);
            for t in &self.moved_tables {
                for v in [t.old, t.new, t.size] {
                    put_uleb(&mut out, v);
                }
            }
        }
        if version >= 7 {
            put_uleb(&mut out, self.copy_dependent.len() as u64);
            for &q in &self.copy_dependent {
                put_uleb(&mut out, u64::from(q));
            }
        }
        out
    }

    /// Decodes and checks a database (see [`ProgramDb::decode_at`]).
    pub fn decode(bytes: &[u8]) -> Result<ProgramDb> {
        Self::decode_at(bytes, 0)
    }

    /// Decodes and [`check`](ProgramDb::check)s a database found in the
    /// PROGRAM_DATABASE section at file offset `offset` (named in errors).
    /// Never panics; every count is bounded by the bytes left.
    pub fn decode_at(bytes: &[u8], offset: u64) -> Result<ProgramDb> {
        let fail = |what: String| Error::corrupt(offset, format!("program database: {what}"));
        let db = Self::decode_inner(bytes).map_err(fail)?;
        db.violation().map_or(Ok(db), |v| Err(fail(v)))
    }

    fn decode_inner(bytes: &[u8]) -> Result<ProgramDb, String> {
        let mut r = Reader { bytes, pos: 0 };
        if r.take(4, "magic")? != MAGIC {
            return Err("bad magic (not a program database)".into());
        }
        let version = r.u32("version")?;
        if !(OLDEST_VERSION..=VERSION).contains(&version) {
            return Err(format!(
                "unsupported version {version} (this reader reads {OLDEST_VERSION} to {VERSION})"
            ));
        }
        let link_base = r.u64("link base")?;
        let runtime_vaddr = r.u64("runtime address")?;
        let flags = if version >= 4 { r.u8("flags")? } else { 0 };
        if flags & !DB_COUNTS_RETURNS != 0 {
            return Err(r.err(format_args!("flags {flags:#04x}: reserved bits set")));
        }
        // A procedure takes at least 6 bytes (name length, status, entry, two
        // counts, the signal map flag).
        let nprocs = r.count("procedure count", 6)?;
        let mut procs = Vec::with_capacity(nprocs);
        for _ in 0..nprocs {
            let name = r.string("procedure name")?;
            let status = match r.u8("procedure status")? {
                0 => ProcStatus::Traced,
                1 => ProcStatus::LeftAlone(r.string("reason")?),
                s => return Err(r.err(format_args!("unknown procedure status {s}"))),
            };
            let entry = r.u32_leb("entry block")?;
            // A block takes at least 4 bytes (delta, count, one length, call).
            let nblocks = r.count("block count", 4)?;
            let mut blocks = Vec::with_capacity(nblocks);
            let mut prev = 0u64;
            for _ in 0..nblocks {
                let start = prev.wrapping_add(r.uleb("block start")?);
                prev = start;
                let n = r.count("instruction count", 1)?;
                let insn_lens = r.take(n, "instruction lengths")?.to_vec();
                let byte = r.u8("call")?;
                let call = if byte & 3 == CALL_NONE {
                    if byte != CALL_NONE {
                        return Err(
                            r.err(format_args!("call byte {byte:#04x}: flags without a call"))
                        );
                    }
                    None
                } else {
                    if byte & CALL_PLT != 0 && version < 3 {
                        return Err(r.err(format_args!(
                            "call byte {byte:#04x}: reserved bits set (version {version})"
                        )));
                    }
                    let (jmpbuf, indirect) = if version >= 3 {
                        let byte2 = r.u8("second call byte")?;
                        if byte2 & !(CALL2_JMPBUF | CALL2_INDIRECT) != 0 {
                            return Err(r.err(format_args!(
                                "second call byte {byte2:#04x}: reserved bits set"
                            )));
                        }
                        (byte2 & CALL2_JMPBUF != 0, byte2 & CALL2_INDIRECT != 0)
                    } else {
                        (byte & CALL_TAIL == 0, false)
                    };
                    let target = match byte & 3 {
                        CALL_PROC => CallTarget::Proc(r.u32_leb("callee")?),
                        CALL_EXTERNAL => CallTarget::External,
                        _ => CallTarget::Exit,
                    };
                    let lazy = if byte & CALL_LAZY != 0 {
                        Some(r.u32_leb("lazy-binding procedure")?)
                    } else {
                        None
                    };
                    let landing = if byte & CALL_LANDING != 0 {
                        Some(r.u32_leb("landing pad")?)
                    } else {
                        None
                    };
                    Some(CallDb {
                        target,
                        marker: byte & CALL_MARKER != 0,
                        returns: byte & CALL_RETURNS != 0,
                        tail: byte & CALL_TAIL != 0,
                        lazy,
                        landing,
                        jmpbuf,
                        plt: byte & CALL_PLT != 0,
                        indirect,
                    })
                };
                blocks.push(BlockDb {
                    start,
                    insn_lens,
                    call,
                });
            }
            let nedges = r.count("edge count", 3)?;
            let mut edges = Vec::with_capacity(nedges);
            for _ in 0..nedges {
                let from = r.u32_leb("edge source")?;
                let to = r.u32_leb("edge target")?;
                let byte = r.u8("edge kind")?;
                let kinds = if version >= 6 { 9 } else { 8 };
                let Some(&kind) = EdgeKindDb::ALL[..kinds].get(usize::from(byte & !EDGE_WITNESS))
                else {
                    return Err(r.err(format_args!("unknown edge kind byte {byte:#04x}")));
                };
                let witness = if byte & EDGE_WITNESS != 0 {
                    let at = r.pos;
                    let w = r.uleb("witness number")?;
                    Some(u16::try_from(w).map_err(|_| {
                        r.pos = at;
                        r.err(format_args!("witness number {w} does not fit 16 bits"))
                    })?)
                } else {
                    None
                };
                edges.push(EdgeDb {
                    from,
                    to,
                    kind,
                    witness,
                });
            }
            let sigmap = match r.u8("signal map flag")? {
                0 => None,
                1 => {
                    let start = r.uleb("copy start")?;
                    let len = r.uleb("copy length")?;
                    // A range takes at least 2 bytes (offset delta, tag).
                    let n = r.count("signal range count", 2)?;
                    let mut ranges = Vec::with_capacity(n);
                    let mut offset = 0u64;
                    for _ in 0..n {
                        offset = offset.wrapping_add(r.uleb("range offset")?);
                        let tag = r.u8("signal point")?;
                        let point = match tag & !SIG_OTHER_PROC {
                            SIG_OUTSIDE if tag == SIG_OUTSIDE => SigPoint::Outside,
                            SIG_INSN => SigPoint::Insn {
                                proc: if tag & SIG_OTHER_PROC != 0 {
                                    r.u32_leb("procedure")?
                                } else {
                                    procs.len() as u32
                                },
                                block: r.u32_leb("block")?,
                                insn: r.u32_leb("instruction")?,
                                count: r.u32_leb("instruction count")?,
                            },
                            SIG_WITNESS if tag == SIG_WITNESS => SigPoint::Witness {
                                edge: r.u32_leb("edge")?,
                            },
                            SIG_RETURNED if tag == SIG_RETURNED => SigPoint::Returned {
                                block: r.u32_leb("block")?,
                            },
                            _ => {
                                return Err(
                                    r.err(format_args!("unknown signal point byte {tag:#04x}"))
                                )
                            }
                        };
                        ranges.push(SigRange { offset, point });
                    }
                    Some(SigMap { start, len, ranges })
                }
                f => return Err(r.err(format_args!("signal map flag {f}"))),
            };
            procs.push(ProcDb {
                name,
                status,
                entry,
                blocks,
                edges,
                sigmap,
            });
        }
        let moved_tables = if version >= 5 {
            decode_moved_tables(&mut r)?
        } else {
            Vec::new()
        };
        let copy_dependent = if version >= 7 {
            let n = r.count("copy-dependent procedures", 1)?;
            (0..n)
                .map(|_| r.u32_leb("copy-dependent procedure"))
                .collect::<Result<_, _>>()?
        } else {
            Vec::new()
        };
        if r.pos != bytes.len() {
            return Err(r.err(format_args!("{} trailing bytes", bytes.len() - r.pos)));
        }
        Ok(ProgramDb {
            link_base,
            runtime_vaddr,
            counts_returns: flags & DB_COUNTS_RETURNS != 0,
            procs,
            moved_tables,
            copy_dependent,
        })
    }

    /// Checks the invariants listed at the top of this module.
    pub fn check(&self) -> Result<()> {
        match self.violation() {
            None => Ok(()),
            Some(v) => Err(Error::corrupt(0, format!("program database: {v}"))),
        }
    }

    /// The first broken invariant, described.
    fn violation(&self) -> Option<String> {
        let nprocs = self.procs.len();
        for (pi, p) in self.procs.iter().enumerate() {
            if let Some(v) = p.violation(nprocs, &self.procs) {
                return Some(format!("procedure {pi} ({}): {v}", p.name));
            }
        }
        self.copy_dependent
            .iter()
            .find(|&&q| !self.procs.get(q as usize).is_some_and(ProcDb::is_traced))
            .map(|q| format!("copy-dependent procedure {q} is not a traced procedure"))
    }
}

impl ProcDb {
    /// Whether this is a PLT stub whose import jump has [`CallDb::plt`].
    pub fn plt_stub(&self) -> bool {
        self.blocks.iter().any(|b| {
            b.call
                .is_some_and(|c| c.plt && c.tail && c.target == CallTarget::External)
        })
    }

    fn violation(&self, nprocs: usize, procs: &[ProcDb]) -> Option<String> {
        let n = self.blocks.len();
        if n > u32::MAX as usize - 1 {
            return Some(format!("{n} blocks"));
        }
        let exit = n as u32;
        if self.is_traced() && self.entry >= exit {
            return Some(format!("entry block {} of {n} blocks", self.entry));
        }
        let mut end = 0u64;
        for (bi, b) in self.blocks.iter().enumerate() {
            // A block may lie inside the previous one when both end at the
            // same address: a branch over a `lock` prefix decodes the same
            // bytes a second time (glibc's `je 1f; lock; 1: cmpxchg`).
            let aliased = b.start.checked_add(b.size()) == Some(end);
            if bi > 0 && b.start < end && !aliased {
                return Some(format!(
                    "block {bi} at {:#x} starts before the end of the previous block ({end:#x})",
                    b.start
                ));
            }
            if b.insn_lens.is_empty() {
                return Some(format!("block {bi} at {:#x} has no instruction", b.start));
            }
            if let Some(&l) = b.insn_lens.iter().find(|&&l| l == 0 || l > MAX_INSN_LEN) {
                return Some(format!(
                    "block {bi} at {:#x} has an instruction of {l} bytes",
                    b.start
                ));
            }
            end = match b.start.checked_add(b.size()) {
                Some(e) => e,
                None => return Some(format!("block {bi} at {:#x} wraps around", b.start)),
            };
            if let Some(c) = b.call {
                for (what, q) in [
                    (
                        "callee",
                        match c.target {
                            CallTarget::Proc(q) => Some(q),
                            _ => None,
                        },
                    ),
                    ("lazy-binding procedure", c.lazy),
                ] {
                    let Some(q) = q else { continue };
                    match procs.get(q as usize) {
                        Some(t) if t.is_traced() => {}
                        Some(_) => {
                            return Some(format!(
                                "block {bi} at {:#x}: {what} {q} is not traced",
                                b.start
                            ))
                        }
                        None => {
                            return Some(format!(
                                "block {bi} at {:#x}: {what} {q} of {nprocs} procedures",
                                b.start
                            ))
                        }
                    }
                }
                if c.landing.is_some_and(|l| l as usize >= n) {
                    return Some(format!(
                        "block {bi} at {:#x}: landing pad {:?} is not a block",
                        b.start, c.landing
                    ));
                }
                if c.lazy.is_some() && !(c.tail && c.target == CallTarget::External) {
                    return Some(format!(
                        "block {bi} at {:#x}: a lazy-binding path on a call that is not an external tail call",
                        b.start
                    ));
                }
                let unmarked_external_tail =
                    c.tail && c.target == CallTarget::External && !c.plt && !c.marker;
                if c.indirect && !unmarked_external_tail {
                    return Some(format!(
                        "block {bi} at {:#x}: an unresolved jump that is not an unmarked external tail call",
                        b.start
                    ));
                }
                // Counted at the way into a stub, or at its jump: never
                // both, never neither (`CallDb::counts_transfer`).
                let to_stub = match c.target {
                    CallTarget::Proc(q) => procs.get(q as usize).is_some_and(ProcDb::plt_stub),
                    _ => false,
                };
                let jump = c.tail && c.target == CallTarget::External;
                if c.plt != to_stub && !(c.plt && jump) {
                    return Some(format!(
                        "block {bi} at {:#x}: {} ({:?})",
                        b.start,
                        if c.plt {
                            "the PLT flag on a call that is neither a stub's import jump nor a way into such a stub"
                        } else {
                            "a call to a PLT stub whose import jump has the PLT flag, without it"
                        },
                        c.target
                    ));
                }
            }
        }
        let mut witnesses = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut to_exit = vec![false; n];
        for (ei, e) in self.edges.iter().enumerate() {
            if e.from >= exit || e.to > exit {
                return Some(format!(
                    "edge {ei} {} -> {} leaves {} blocks",
                    e.from, e.to, n
                ));
            }
            if !seen.insert((e.from, e.to)) {
                return Some(format!("edge {ei} repeats {} -> {}", e.from, e.to));
            }
            if e.kind.is_exit() != (e.to == exit) {
                return Some(format!(
                    "edge {ei} {} -> {} has kind {:?}",
                    e.from, e.to, e.kind
                ));
            }
            let call = self.blocks[e.from as usize].call;
            if matches!(e.kind, EdgeKindDb::CallReturn | EdgeKindDb::NoReturn) && call.is_none() {
                return Some(format!(
                    "edge {ei} of kind {:?} leaves block {} which makes no call",
                    e.kind, e.from
                ));
            }
            to_exit[e.from as usize] |= e.to == exit;
            if e.witness.is_some()
                && call.is_some_and(|c| c.plt && c.target == CallTarget::External)
            {
                return Some(format!(
                    "edge {ei} {} -> {} carries a witness, but leaves a PLT stub's import jump (decided by LAZY)",
                    e.from, e.to
                ));
            }
            if let Some(w) = e.witness {
                witnesses.push(w);
            }
        }
        for (bi, b) in self.blocks.iter().enumerate() {
            // A tail call applies when its edge to EXIT is taken; other
            // successors are allowed (a conditional tail call, or a PLT
            // stub's jump that goes to its lazy-binding half until bound).
            if let Some(c) = b.call.filter(|c| c.tail) {
                if !to_exit[bi] {
                    return Some(format!(
                        "block {bi} at {:#x} is a tail call ({:?}) but has no edge to EXIT",
                        b.start, c.target
                    ));
                }
            }
        }
        witnesses.sort_unstable();
        if let Some((i, &w)) = witnesses
            .iter()
            .enumerate()
            .find(|&(i, &w)| usize::from(w) != i)
        {
            return Some(format!(
                "witness numbers are not 0..{}: {w} found where {i} belongs",
                witnesses.len()
            ));
        }
        if !self.is_traced() && !witnesses.is_empty() {
            return Some("a procedure left alone has witness edges".into());
        }
        if let Some(m) = &self.sigmap {
            if !self.is_traced() {
                return Some("a procedure left alone has a signal map".into());
            }
            if m.start.checked_add(m.len).is_none() {
                return Some(format!("signal map at {:#x} wraps around", m.start));
            }
            for (i, r) in m.ranges.iter().enumerate() {
                let ok_offset = if i == 0 {
                    r.offset == 0
                } else {
                    r.offset > m.ranges[i - 1].offset
                };
                if !ok_offset || r.offset >= m.len {
                    return Some(format!(
                        "signal range {i} at offset {:#x} (copy of {:#x} bytes)",
                        r.offset, m.len
                    ));
                }
                let bad = match r.point {
                    SigPoint::Outside => None,
                    SigPoint::Insn {
                        proc,
                        block,
                        insn,
                        count,
                    } => match procs.get(proc as usize) {
                        Some(p) if p.is_traced() => match p.blocks.get(block as usize) {
                            Some(b)
                                if u64::from(insn) + u64::from(count.max(1))
                                    <= b.insn_lens.len() as u64 =>
                            {
                                None
                            }
                            _ => Some("an instruction that is not in the procedure"),
                        },
                        _ => Some("a procedure that is not traced"),
                    },
                    // Or an edge of a PLT jump decided by LAZY: the LAZY
                    // piece before its record is reserved.
                    SigPoint::Witness { edge } => match self.edges.get(edge as usize) {
                        Some(e) if e.witness.is_some() => None,
                        Some(e)
                            if self.blocks.get(e.from as usize).is_some_and(|b| {
                                b.call.is_some_and(|c| {
                                    c.plt && c.tail && c.target == CallTarget::External
                                })
                            }) =>
                        {
                            None
                        }
                        _ => Some("an edge without a witness"),
                    },
                    SigPoint::Returned { block } => match self.blocks.get(block as usize) {
                        Some(b) if b.call.is_some_and(|c| c.marker || !c.tail) => None,
                        _ => Some("a block that makes no call"),
                    },
                };
                if let Some(what) = bad {
                    return Some(format!("signal range {i} ({:?}) names {what}", r.point));
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A valid random database built from a seed (SplitMix64), so shrinking
    /// and reproduction are by seed.
    fn random_db(seed: u64, nprocs: usize) -> ProgramDb {
        let mut x = seed;
        let mut rnd = move |n: u64| {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) % n.max(1)
        };
        let nprocs = nprocs.max(1);
        let mut addr = 0x40_1000 + rnd(1 << 40);
        let mut procs = Vec::new();
        for pi in 0..nprocs {
            let left_alone = pi > 0 && rnd(5) == 0;
            let n = if left_alone { rnd(3) } else { 1 + rnd(12) } as usize;
            let mut blocks = Vec::new();
            for _ in 0..n {
                let lens: Vec<u8> = (0..1 + rnd(6)).map(|_| 1 + rnd(15) as u8).collect();
                let start = addr;
                addr += lens.iter().map(|&l| u64::from(l)).sum::<u64>() + rnd(3);
                blocks.push(BlockDb {
                    start,
                    insn_lens: lens,
                    call: None,
                });
            }
            let exit = n as u32;
            let mut edges = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for b in 0..n as u32 {
                let kind_call = rnd(4);
                if !left_alone && kind_call == 0 {
                    // A call block: one edge, to the next block or EXIT.
                    let tail = rnd(3) == 0;
                    let target = match rnd(3) {
                        0 if pi > 0 => CallTarget::Proc(0),
                        1 => CallTarget::Exit,
                        _ => CallTarget::External,
                    };
                    let lazy = (tail && target == CallTarget::External && rnd(2) == 0).then_some(0);
                    let landing = (!tail && rnd(3) == 0).then(|| rnd(u64::from(exit)) as u32);
                    blocks[b as usize].call = Some(CallDb {
                        target,
                        marker: rnd(2) == 0,
                        returns: rnd(2) == 0,
                        tail,
                        lazy,
                        landing,
                        jmpbuf: !tail && rnd(4) == 0,
                        plt: false,
                        indirect: false,
                    });
                    let (to, kind) = if tail {
                        (exit, EdgeKindDb::TailCall)
                    } else if b + 1 < exit && rnd(4) != 0 {
                        (b + 1, EdgeKindDb::CallReturn)
                    } else {
                        (exit, EdgeKindDb::NoReturn)
                    };
                    seen.insert((b, to));
                    edges.push(EdgeDb {
                        from: b,
                        to,
                        kind,
                        witness: None,
                    });
                    continue;
                }
                for _ in 0..1 + rnd(3) {
                    let to = rnd(u64::from(exit) + 1) as u32;
                    if !seen.insert((b, to)) {
                        continue;
                    }
                    let kind = if to == exit {
                        [EdgeKindDb::Return, EdgeKindDb::TailCall, EdgeKindDb::Halt]
                            [rnd(3) as usize]
                    } else {
                        [
                            EdgeKindDb::FallThrough,
                            EdgeKindDb::Taken,
                            EdgeKindDb::JumpTable,
                        ][rnd(3) as usize]
                    };
                    edges.push(EdgeDb {
                        from: b,
                        to,
                        kind,
                        witness: None,
                    });
                }
            }
            if !left_alone {
                let mut w = 0u16;
                for e in &mut edges {
                    if rnd(3) == 0 {
                        e.witness = Some(w);
                        w += 1;
                    }
                }
            }
            let sigmap = (!left_alone && rnd(4) != 0).then(|| {
                let mut ranges = Vec::new();
                let mut offset = 0;
                for _ in 0..1 + rnd(8) {
                    let b = rnd(n as u64) as u32;
                    let point = match rnd(4) {
                        0 => SigPoint::Outside,
                        1 => {
                            let len = blocks[b as usize].insn_lens.len() as u64;
                            let insn = rnd(len) as u32;
                            SigPoint::Insn {
                                proc: pi as u32,
                                block: b,
                                insn,
                                count: rnd(len - u64::from(insn) + 1) as u32,
                            }
                        }
                        2 => match edges.iter().position(|e| e.witness.is_some()) {
                            Some(e) => SigPoint::Witness { edge: e as u32 },
                            None => SigPoint::Outside,
                        },
                        _ => match blocks.iter().position(|b| b.call.is_some_and(|c| !c.tail)) {
                            Some(b) => SigPoint::Returned { block: b as u32 },
                            None => SigPoint::Outside,
                        },
                    };
                    ranges.push(SigRange { offset, point });
                    offset += 1 + rnd(40);
                }
                SigMap {
                    start: 0x90_0000 + rnd(1 << 20),
                    len: offset + rnd(3),
                    ranges,
                }
            });
            procs.push(ProcDb {
                name: format!("proc_{pi}_\u{e9}"),
                status: if left_alone {
                    ProcStatus::LeftAlone("indirect jump".into())
                } else {
                    ProcStatus::Traced
                },
                entry: if n == 0 { 0 } else { rnd(n as u64) as u32 },
                blocks,
                edges,
                sigmap,
            });
        }
        let copy_dependent = (0..procs.len() as u32)
            .filter(|&q| procs[q as usize].is_traced() && rnd(3) == 0)
            .collect();
        ProgramDb {
            link_base: 0x40_0000,
            runtime_vaddr: 0x80_0000 + rnd(1 << 20),
            counts_returns: rnd(2) == 1,
            procs,
            moved_tables: (0..rnd(3))
                .map(|_| MovedTable {
                    old: 0x40_0000 + rnd(1 << 20),
                    new: 0x80_0000 + rnd(1 << 20),
                    size: 4 * rnd(64),
                })
                .collect(),
            copy_dependent,
        }
    }

    fn err_text(bytes: &[u8]) -> String {
        match ProgramDb::decode(bytes) {
            Ok(_) => "ok".into(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn empty_database_round_trips() {
        let db = ProgramDb::default();
        let bytes = db.encode();
        // Magic, version, two addresses, flags, and three empty lists.
        assert_eq!(bytes.len(), 4 + 4 + 8 + 8 + 1 + 1 + 1 + 1);
        assert_eq!(ProgramDb::decode(&bytes).unwrap(), db);
    }

    #[test]
    fn layout_of_a_small_database_is_as_documented() {
        let db = ProgramDb {
            link_base: 0x40_0000,
            runtime_vaddr: 0x50_0000,
            counts_returns: true,
            moved_tables: Vec::new(),
            copy_dependent: vec![0],
            procs: vec![ProcDb {
                name: "f".into(),
                status: ProcStatus::Traced,
                entry: 0,
                blocks: vec![
                    BlockDb {
                        start: 0x40_1000,
                        insn_lens: vec![4, 5],
                        call: Some(CallDb {
                            target: CallTarget::External,
                            marker: true,
                            returns: true,
                            tail: false,
                            lazy: None,
                            landing: None,
                            jmpbuf: false,
                            plt: false,
                            indirect: false,
                        }),
                    },
                    BlockDb {
                        start: 0x40_1009,
                        insn_lens: vec![1],
                        call: None,
                    },
                ],
                edges: vec![
                    EdgeDb {
                        from: 0,
                        to: 1,
                        kind: EdgeKindDb::CallReturn,
                        witness: None,
                    },
                    EdgeDb {
                        from: 1,
                        to: 2,
                        kind: EdgeKindDb::Return,
                        witness: Some(0),
                    },
                ],
                sigmap: Some(SigMap {
                    start: 0x60_0000,
                    len: 0x30,
                    ranges: vec![
                        SigRange {
                            offset: 0,
                            point: SigPoint::Outside,
                        },
                        SigRange {
                            offset: 0x20,
                            point: SigPoint::Insn {
                                proc: 0,
                                block: 1,
                                insn: 0,
                                count: 1,
                            },
                        },
                        SigRange {
                            offset: 0x21,
                            point: SigPoint::Witness { edge: 1 },
                        },
                    ],
                }),
            }],
        };
        let bytes = db.encode();
        let mut want = b"AEDB".to_vec();
        want.extend_from_slice(&7u32.to_le_bytes());
        want.extend_from_slice(&0x40_0000u64.to_le_bytes());
        want.extend_from_slice(&0x50_0000u64.to_le_bytes());
        // Flags: returns counted.
        want.push(1);
        want.extend_from_slice(&[1, 1, b'f', 0, 0, 2]);
        // Call byte (External, MARKER, RETURNS), second call byte (no jmpbuf).
        want.extend_from_slice(&[0x80, 0xa0, 0x80, 0x02, 2, 4, 5, 0x32, 0]);
        want.extend_from_slice(&[9, 1, 1, 0]);
        want.extend_from_slice(&[2, 0, 1, 3, 1, 2, 0x84, 0]);
        // Signal map: present, start, length, 3 ranges (delta, tag, payload).
        want.extend_from_slice(&[1, 0x80, 0x80, 0x80, 0x03, 0x30, 3]);
        want.extend_from_slice(&[0, 0, 0x20, 1, 1, 0, 1, 1, 2, 1]);
        // No moved tables; one copy-dependent procedure, 0.
        want.extend_from_slice(&[0, 1, 0]);
        assert_eq!(bytes, want);
        assert_eq!(ProgramDb::decode(&bytes).unwrap(), db);
    }

    /// main calls `f@plt`, whose jump has the PLT flag (its lazy half,
    /// block 1, tail-jumps to `<plt0>`).
    fn plt_db() -> ProgramDb {
        let call = |target, tail, plt| {
            Some(CallDb {
                target,
                marker: false,
                returns: true,
                tail,
                lazy: None,
                landing: None,
                plt,
                jmpbuf: false,
                indirect: false,
            })
        };
        let block = |start, call| BlockDb {
            start,
            insn_lens: vec![5],
            call,
        };
        let edge = |from, to, kind| EdgeDb {
            from,
            to,
            kind,
            witness: None,
        };
        let proc = |name: &str, blocks, edges| ProcDb {
            name: name.into(),
            status: ProcStatus::Traced,
            entry: 0,
            blocks,
            edges,
            sigmap: None,
        };
        let mut stub = proc(
            "f@plt",
            vec![
                block(0x40_1000, call(CallTarget::External, true, true)),
                block(0x40_1006, call(CallTarget::Proc(2), true, false)),
            ],
            vec![
                edge(0, 2, EdgeKindDb::TailCall),
                edge(0, 1, EdgeKindDb::Taken),
                edge(1, 2, EdgeKindDb::TailCall),
            ],
        );
        // The LAZY piece stands on the lazy edge until LAZY is reserved.
        stub.sigmap = Some(SigMap {
            start: 0x60_0000,
            len: 0x20,
            ranges: vec![
                SigRange {
                    offset: 0,
                    point: SigPoint::Outside,
                },
                SigRange {
                    offset: 0x10,
                    point: SigPoint::Witness { edge: 1 },
                },
            ],
        });
        ProgramDb {
            link_base: 0x40_0000,
            runtime_vaddr: 0x50_0000,
            counts_returns: false,
            moved_tables: Vec::new(),
            copy_dependent: Vec::new(),
            procs: vec![
                proc(
                    "main",
                    vec![
                        block(0x40_2000, call(CallTarget::Proc(1), false, true)),
                        block(0x40_2005, None),
                    ],
                    vec![
                        edge(0, 1, EdgeKindDb::CallReturn),
                        edge(1, 2, EdgeKindDb::Return),
                    ],
                ),
                stub,
                proc(
                    "<plt0>",
                    vec![block(0x40_0ff0, call(CallTarget::External, true, false))],
                    vec![edge(0, 1, EdgeKindDb::TailCall)],
                ),
            ],
        }
    }

    #[test]
    fn plt_flags_round_trip_and_agree_between_stub_and_callers() {
        let db = plt_db();
        let bytes = db.encode();
        assert_eq!(ProgramDb::decode(&bytes).unwrap(), db);
        let jump = db.procs[1].blocks[0].call.unwrap();
        assert!(!jump.counts_transfer() && db.procs[0].blocks[0].call.unwrap().counts_transfer());
        assert!(db.procs[1].plt_stub() && !db.procs[2].plt_stub());
        // Version 2 had no PLT flag: its bit is refused there.
        let e = ProgramDb::decode(&db.encode_raw(2))
            .unwrap_err()
            .to_string();
        assert!(e.contains("reserved bits set (version 2)"), "{e}");
        // A version 2 database without it still reads (and has no second
        // call byte: every call but a tail call reads as a `jmpbuf` one).
        let mut old = db.clone();
        for p in &mut old.procs {
            for b in &mut p.blocks {
                if let Some(c) = &mut b.call {
                    c.plt = false;
                    c.jmpbuf = !c.tail;
                }
            }
            p.sigmap = None;
        }
        assert_eq!(ProgramDb::decode(&old.encode_raw(2)).unwrap(), old);
        // The way into the stub must be counted when its jump is not ...
        let mut bad = db.clone();
        bad.procs[0].blocks[0].call.as_mut().unwrap().plt = false;
        let e = bad.check().unwrap_err().to_string();
        assert!(
            e.contains("procedure 0 (main)") && e.contains("without it"),
            "{e}"
        );
        // ... and only then.
        let mut bad = db.clone();
        bad.procs[1].blocks[1].call.as_mut().unwrap().plt = true;
        let e = bad.check().unwrap_err().to_string();
        assert!(e.contains("f@plt") && e.contains("neither"), "{e}");
        // LAZY decides the jump: no witness on its edges.
        let mut bad = db.clone();
        bad.procs[1].edges[0].witness = Some(0);
        let e = bad.check().unwrap_err().to_string();
        assert!(e.contains("carries a witness"), "{e}");
        // Without the flag, the lazy edge's signal range names an edge
        // without a witness.
        let mut bad = db;
        bad.procs[1].blocks[0].call.as_mut().unwrap().plt = false;
        bad.procs[0].blocks[0].call.as_mut().unwrap().plt = false;
        let e = bad.check().unwrap_err().to_string();
        assert!(e.contains("an edge without a witness"), "{e}");
    }

    #[test]
    fn invariant_violations_are_named() {
        let mut db = random_db(7, 3);
        db.procs[0].blocks[0].insn_lens.push(16);
        let e = ProgramDb::decode(&db.encode_raw(VERSION))
            .unwrap_err()
            .to_string();
        assert!(e.contains("procedure 0") && e.contains("16 bytes"), "{e}");

        let mut db = random_db(7, 3);
        let w = db.procs[0]
            .edges
            .iter()
            .filter(|e| e.witness.is_some())
            .count() as u16;
        db.procs[0].edges[0].witness = Some(w + 3);
        let e = db.check().unwrap_err().to_string();
        assert!(e.contains("witness numbers are not"), "{e}");

        let mut db = random_db(9, 2);
        db.procs[0].entry = 99;
        assert!(db
            .check()
            .unwrap_err()
            .to_string()
            .contains("entry block 99"));

        let mut db = random_db(9, 2);
        db.copy_dependent = vec![2];
        let e = ProgramDb::decode(&db.encode_raw(VERSION))
            .unwrap_err()
            .to_string();
        assert!(e.contains("copy-dependent procedure 2"), "{e}");
    }

    proptest! {
        #[test]
        fn round_trip(seed in any::<u64>(), n in 1usize..8) {
            let db = random_db(seed, n);
            prop_assert_eq!(db.check().map_err(|e| e.to_string()), Ok(()));
            let bytes = db.encode();
            prop_assert_eq!(ProgramDb::decode(&bytes).unwrap(), db.clone());
            // Version 4 had no moved tables (nor, before 7, copy-dependent
            // procedures).
            let mut v4 = db.clone();
            v4.moved_tables.clear();
            v4.copy_dependent.clear();
            prop_assert_eq!(ProgramDb::decode(&db.encode_raw(4)).unwrap(), v4.clone());
            // Version 3 had no flags: returns were not counted.
            let mut v3 = v4.clone();
            v3.counts_returns = false;
            prop_assert_eq!(ProgramDb::decode(&db.encode_raw(3)).unwrap(), v3);
            // Version 2 had no `jmpbuf`: every call but a tail call reads as one.
            let mut old = v4;
            old.counts_returns = false;
            for p in &mut old.procs {
                for c in p.blocks.iter_mut().filter_map(|b| b.call.as_mut()) {
                    c.jmpbuf = !c.tail;
                }
            }
            prop_assert_eq!(ProgramDb::decode(&db.encode_raw(2)).unwrap(), old);
        }

        /// Every strict prefix is an error (never a panic, never a shorter database).
        #[test]
        fn truncations_are_errors(seed in any::<u64>(), n in 1usize..5) {
            let bytes = random_db(seed, n).encode();
            for len in 0..bytes.len() {
                prop_assert!(ProgramDb::decode(&bytes[..len]).is_err(), "prefix {}", len);
            }
        }

        /// Any damaged byte decodes to an error or to a database that passes
        /// its own check; never a panic.
        #[test]
        fn damaged_bytes_never_panic(seed in any::<u64>(), at in any::<usize>(), x in 1u8..) {
            let mut bytes = random_db(seed, 4).encode();
            let i = at % bytes.len();
            bytes[i] ^= x;
            if let Ok(db) = ProgramDb::decode(&bytes) {
                prop_assert_eq!(db.check().map_err(|e| e.to_string()), Ok(()));
            }
            let _ = err_text(&bytes);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut with_magic = MAGIC.to_vec();
            with_magic.extend_from_slice(&VERSION.to_le_bytes());
            with_magic.extend_from_slice(&bytes);
            let _ = ProgramDb::decode(&bytes);
            let _ = ProgramDb::decode(&with_magic);
        }
    }
}
