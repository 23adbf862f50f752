//! Per-(block, witness) summaries: the regenerator's fast pass (issue 5,
//! item 3; DESIGN.md decision 7).
//!
//! Between two reads of the witness stream, Figure 7's walk is a function
//! of the block where the last witness was read and that witness: the
//! blocks it passes are forced (fall-through, a pending witness choosing at
//! the next predicates). A [`Seg`] records where such a walk stops and how
//! many blocks and instructions it passed, so counting (`--count`, the
//! fork pre-pass, and the pass that cuts one long stream into pieces for
//! parallel expansion) takes one step per witness instead of one per block.
//!
//! A segment starts at a *read point*: a block without a call, whose exit
//! is not a plain fall-through (`Block::next == EXIT`), reached with no
//! pending witness, where the next stream item is a one-byte witness `w`.
//! It ends at the first block `e` that the full machine would treat at its
//! loop head with something other than a forced move: a read point (no
//! witness pending, `e.next == EXIT`), a call block, an edge to EXIT, a
//! witness that does not fit, or [`MAX_BLOCKS`] blocks. `e` itself is not
//! in the segment: the machine handles it as it would without summaries.
//!
//! Invariants: a segment consumes exactly the witness `w` from the stream
//! and nothing else; following it leaves the machine in the state the
//! block-by-block walk reaches at `e` (same block, same pending witness),
//! having passed `blocks` blocks of `insns` instructions (checked against
//! the walk's output by `tests::random_executions_regenerate_exactly`).
//!
//! Output (`Summaries::with_text`) uses the same segments: each keeps the
//! output of its read point's block and of its blocks, concatenated, in an
//! arena, so a witness costs one `memcpy` and one step of the machine's
//! loop instead of one per block. Output chains segments, calls and
//! returns as counting does ([`Summaries::output_run`], below), copying
//! the output of each block a call or return passes (a call's block, a
//! PLT stub's, the fall-throughs after them): the machine's trail after
//! the chain is the last segment's and all output after it, none of
//! which a record can cut, since a byte witness is next.
//! The arena is bounded ([`TEXT_BYTES`]); past it, new segments are walked
//! block by block.
//!
//! Counting chains segments ([`Summaries::count_run`]): while a segment
//! ends, with nothing pending, at another read point whose next two items
//! are byte witnesses, the next one follows without going back to the
//! machine, through a memo of 16-byte entries that fits a level-1 data
//! cache ([`Hot`]) and already holds each step's totals and whether the
//! chain goes on (issue 24 item 3: one load per witness on the hot path).
//! The chain also goes through direct calls of traced procedures and
//! through the returns a read point's witness chooses ([`CallHot`]): a
//! call pushes its block on [`Summaries::frames`] (the machine moves what
//! is left there onto its stack), counts the callee's entry and transfer,
//! and falls through from the callee's entry to its next stop; a `ret`
//! pops a frame pushed in the same chain and falls through from the
//! caller's return point. It also takes a tail jump to a traced procedure
//! by a block's only, witness-free edge (no frame), and a call of a PLT
//! stub whose `jmp [GOT]` goes to untraced code that returns at once
//! ([`plt_through`]: the call, the stub's block and the fall-throughs
//! after the return, no frame). The next item is a byte witness at every
//! such call and return, so no record (SETJMP, SIGNAL, RETURN, LAZY) can
//! stand there.
//! A witness that an ENTER, ENTER_AT or RETURN follows is a chain's last
//! step ([`read_at_call`]): after it the chain makes only the direct calls
//! and plain returns that read no item; the machine reads the record.
//! Up to four steps (a read point's witness, then the calls and returns
//! to the next read point, then that one's, and so on), with the calls
//! after the last and the plain returns through frames the entry pushed
//! itself, are one entry of a wide memo ([`Wide`]),
//! keyed by the read point and the next four witness bytes: one dependent
//! load for up to four witnesses and the calls among them (sort's
//! comparisons make about one call per witness). An entry returns through
//! frames it pushed itself and through up to three frames below its read
//! point, which it then keeps and a lookup matches beside the key (a
//! comparison of sort ends in returns to calls made before its last read
//! points); it keeps the callees whose entries it counts and the frames
//! it pops and leaves pushed. A hit adds one to the entry's count of
//! hits; their callees' entries are counted when the entry is filled
//! again or the machine's run ends ([`Summaries::settle_entries`]), so
//! the machine's counts are whole whenever its run returns. Each memo
//! entry also keeps the [`hot_slot`] of where it ends, so no hash is
//! computed on the chain of dependent loads.

use crate::compile::{Block, BlockIx, Module, ProcIx, AMBIGUOUS, EXIT, NO_BLOCK, NO_WITNESS};
use crate::stream::{self, is_byte_witness, ESCAPE};
use aetrace_format::progdb::{CallTarget, EdgeKindDb};
use aetrace_graph::EntityRef;

/// Longest walk one segment summarises (keeps `insns` in a `u32`).
pub const MAX_BLOCKS: u32 = 1 << 12;
const _: () = assert!(MAX_BLOCKS < u16::MAX as u32, "Hot::blocks is a u16");

/// Most output bytes the segments of one module keep.
pub const TEXT_BYTES: usize = 64 << 20;

/// Entries of the memo of `Summaries::get` (a power of two).
const MEMO: usize = 1 << 12;

/// Entries of the counting memo (a power of two): 32 KiB.
const HOT: usize = 1 << 11;

/// A counting memo entry: the segment from read point `key >> 8` for
/// byte witness `key & 0xFF` (254 and 255 are no witness byte's, so
/// [`Hot::EMPTY`] matches no lookup); no blocks when that segment does not
/// end with nothing pending, which the machine then takes.
#[derive(Clone, Copy, Debug)]
struct Hot {
    key: u32,
    /// The segment's end, with [`Hot::AGAIN`] set when it is a read point.
    end: u32,
    /// Instructions of the read point's block and of the segment's.
    insns: u32,
    /// Blocks: the read point's and the segment's (at most
    /// [`MAX_BLOCKS`] + 1).
    blocks: u16,
    /// `hot_slot(end)`: the next lookup's index is this and the next
    /// witness byte, without a multiplication on the loop's chain of
    /// dependent loads.
    slot: u16,
}

impl Hot {
    /// `end`'s bit: the end is a read point (no call, no plain fall-through).
    const AGAIN: u32 = 1 << 31;
    /// `end`'s bit: the end is a call the chain makes ([`chain_call`]).
    const CALL: u32 = 1 << 30;
    /// `end`'s bit: the witness chooses a `ret` (the entry counts the read
    /// point's block alone; where control goes is the caller's).
    const RET: u32 = 1 << 29;
    /// `end`'s bit: the end is a block that returns with no witness
    /// ([`returns_plain`]; only where the chain stops, not for a witness).
    const RET0: u32 = 1 << 28;
    /// The kind bits of `end`.
    const KINDS: u32 = Hot::AGAIN | Hot::CALL | Hot::RET | Hot::RET0;
    const EMPTY: Hot = Hot {
        key: u32::MAX,
        end: 0,
        insns: 0,
        blocks: 0,
        slot: 0,
    };
}

/// A counting memo entry for a call block the chain goes through
/// ([`chain_call`]): what the call and the fall-throughs from the callee's
/// entry pass, and what the fall-throughs from the call's return point
/// pass once the callee returns.
#[derive(Clone, Copy, Debug)]
struct CallHot {
    /// The call block; `u32::MAX` for none.
    key: u32,
    /// The callee's procedure number.
    callee: u32,
    /// Where control stops in the callee, with [`Hot`]'s kind bits.
    land: u32,
    /// Where control stops after the return, with [`Hot`]'s kind bits;
    /// [`CallHot::NO_BACK`] when the machine must take the return.
    back: u32,
    /// Instructions of the call block and of the fall-throughs in the callee.
    insns: u32,
    /// Instructions of the fall-throughs after the return.
    back_insns: u32,
    /// Blocks of the call block and of the fall-throughs in the callee.
    blocks: u16,
    /// Blocks of the fall-throughs after the return.
    back_blocks: u16,
    /// `hot_slot` of `land`'s block and of `back`'s (the chain's next
    /// lookups, without a multiplication on its dependent loads).
    land_slot: u16,
    back_slot: u16,
    /// Counted transfers the call makes (`CallDb::counts_transfer`):
    /// its own, and through a PLT stub the stub's jump.
    xfers: u8,
    /// The chain pushes no frame: a tail jump (`back` is
    /// [`CallHot::NO_BACK`]), or a call of a PLT stub whose import
    /// returns at once ([`plt_through`]; `land` is then where control
    /// stops after the return, past the `back` fall-throughs).
    through: bool,
}

impl CallHot {
    const NO_BACK: u32 = u32::MAX;
    const EMPTY: CallHot = CallHot {
        key: u32::MAX,
        callee: 0,
        land: 0,
        back: CallHot::NO_BACK,
        insns: 0,
        back_insns: 0,
        blocks: 0,
        back_blocks: 0,
        land_slot: 0,
        back_slot: 0,
        xfers: 0,
        through: false,
    };
}

/// Entries of the call memo (a power of two): 36 KiB.
const CALLS: usize = 1 << 10;

/// Witness steps one entry of the wide memo answers.
const WIDE_STEPS: usize = 4;
const _: () = assert!(
    WIDE_STEPS as u32 * (MAX_BLOCKS + 1) < u16::MAX as u32,
    "Wide::blocks is a u16"
);

const _: () = assert!(WIDE_STEPS == 4, "a Wide key holds four bytes");

/// Entries of the wide memo (a power of two): 192 KiB, in the level-2
/// cache. At 2048 entries (48 KiB) xz's 7,430 keys missed 2.26 M times
/// in 24.2 M lookups and bzip2's 63,299 0.74 M times; at 8192, 0.53 M and
/// 0.41 M, and `--count` took 4-13 % less time (docs/regen.md).
const WIDES: usize = 1 << 13;

/// A wide memo entry: up to [`WIDE_STEPS`] consecutive witness steps of
/// the counting chain, from read point `(key >> 32) & 0xFF_FFFF` for the
/// witness bytes of `key as u32` (the first in its low byte), with the
/// calls and returns between them and the calls after the last (issue 24
/// item 3): while each step has a [`Hot`] entry, every return pops a
/// frame the entry pushed itself or, when it has none of its own left,
/// the newest of `Summaries::frames` below its read point it has not
/// popped yet, up to [`BELOW`] of them (their number is in the key's
/// [`BELOW_BITS`] and their call blocks are kept in
/// `Summaries::wide_frames`: its result depends on no other part of the
/// stack), and what the calls leave fits [`WIDE_OPS`]. The bytes past those steps take no part in them but are
/// in the key all the same (a lookup cannot know how many count before
/// the load). No steps: the chain takes the first witness alone. One
/// dependent load for up to four witnesses and the calls among them.
/// 24 bytes: the frame below the read point, which few
/// entries keep, stands apart.
#[derive(Clone, Copy, Debug)]
struct Wide {
    key: u64,
    /// Where control stops after the steps and the calls after them,
    /// with [`Hot`]'s kind bits.
    end: u32,
    /// Instructions of all steps, calls and returns.
    insns: u32,
    /// Blocks of all steps, calls and returns.
    blocks: u16,
    /// `hot_slot(end)`.
    slot: u16,
    /// Witness bytes the steps consume.
    steps: u8,
    /// Counted transfers of the calls and returns.
    xfers: u8,
    /// What a hit does beside the counts: the number of callees whose
    /// entries it counts (the low byte), then the number of frames it
    /// leaves pushed (the next four bits), as `Summaries::wide_ops` lists
    /// them in that order; from [`POPS`] on, the number of frames below its
    /// read point it first pops. Zero for most entries of gzip and bzip2:
    /// one test.
    ops: u16,
}

impl Wide {
    const EMPTY: Wide = Wide {
        key: u64::MAX,
        end: 0,
        insns: 0,
        blocks: 0,
        slot: 0,
        steps: 0,
        xfers: 0,
        ops: 0,
    };
}

/// A [`Wide`] entry while `Summaries::fill_wide` builds it, with its ops.
/// Every field is a `u32` (the entry's narrower ones are checked as they
/// grow): a load of a field that a narrower store has just written waits
/// for that store (bzip2's fills stalled there).
#[derive(Clone, Copy, Debug)]
struct WideFill {
    end: u32,
    slot: u32,
    insns: u32,
    blocks: u32,
    steps: u32,
    xfers: u32,
    /// The frames below the read point popped (newest first), `nbelow`
    /// of them.
    below: [u32; BELOW],
    nbelow: u32,
    nops: u32,
    ops: [u32; WIDE_OPS],
}

impl WideFill {
    /// Adds instructions and blocks; false, nothing changed, when a count
    /// would overflow.
    fn add(&mut self, insns: u32, blocks: u32) -> bool {
        match (self.insns.checked_add(insns), self.blocks + blocks) {
            (Some(i), b) if i < u32::MAX / 2 && b <= u32::from(u16::MAX) => {
                (self.insns, self.blocks) = (i, b);
                true
            }
            _ => false,
        }
    }

    /// Appends an op (the caller checked the room).
    fn op(&mut self, op: u32) {
        self.ops[self.nops as usize] = op;
        self.nops += 1;
    }

    /// The entry with key `key` (for no frame below its read point) and
    /// its ops as `Summaries::wide_ops` keeps them: the frames pushed (in
    /// order), then the callees (their counts commute with the pushes and
    /// with the pops below the read point, which come before any push
    /// that stays: [`Summaries::wide_return`] takes them with none of the
    /// entry's own frames left).
    fn entry(&self, key: u64) -> (Wide, WideOps) {
        let ops = &self.ops[..self.nops as usize];
        let mut list = [0; WIDE_OPS];
        let callees = ops.iter().filter(|&&op| op & PUSH == 0);
        let pushes = ops.iter().filter(|&&op| op & PUSH != 0);
        let ncallees = callees.clone().count() as u16;
        for (to, &op) in list.iter_mut().zip(pushes.chain(callees)) {
            *to = op & !PUSH;
        }
        let npushes = self.nops as u16 - ncallees;
        debug_assert!(self.nbelow as usize <= BELOW);
        let wide = Wide {
            key: key | u64::from(self.nbelow) << BELOW_SHIFT,
            end: self.end,
            insns: self.insns,
            blocks: self.blocks as u16,
            slot: self.slot as u16,
            steps: self.steps as u8,
            xfers: self.xfers as u8,
            ops: ncallees | npushes << 8 | (self.nbelow as u16) << POPS,
        };
        (wide, WideOps { list, hits: 0 })
    }
}

/// Beside a [`Wide`] entry with ops: the frames it leaves pushed (in
/// order), then the callees whose entries it counts ([`Wide::ops`]), and
/// its hits whose callees' entries are not counted yet
/// ([`Summaries::count_hits`]). One cache line, which a hit with ops
/// loads anyway.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct WideOps {
    list: [u32; WIDE_OPS],
    /// Below `u32::MAX`: the hit that reaches it counts them at once.
    hits: u32,
}

/// Most callee entries and frames one [`Wide`] entry leaves: sort's
/// comparisons make about one call per witness, each a callee entry,
/// most with a frame pushed for a while.
const WIDE_OPS: usize = 15;

/// A `WideFill` op that pushes a frame (its call block in the low bits);
/// without it, an op counts an entry of the callee it names.
const PUSH: u32 = 1 << 31;

/// Where [`Wide::ops`] keeps the number of frames below the entry's read
/// point a hit first pops (the entry's `Summaries::wide_frames`).
const POPS: u16 = 12;
const _: () = assert!(WIDE_OPS < 16, "Wide::ops keeps the pushes in four bits");

/// Most frames below its read point one [`Wide`] entry returns through.
/// sort's comparisons return through three procedures (`sub_14550`, which
/// `sub_146b0` tail-jumps to, `sub_139c0`, `sub_9a00`) to the merge loop;
/// with one, about one plain return per comparison went one by one.
const BELOW: usize = 3;
const _: () = assert!(BELOW < 4, "Wide::ops keeps the pops in two bits");

/// Where a [`Wide`] key keeps the number of frames below its read point
/// that the entry pops (`Summaries::wide_frames` keeps them), so a
/// lookup's key (read points fit 24 bits, their key bits end at 56)
/// matches it only through [`Summaries::framed_hit`]. The common lookup,
/// of an entry without one, is one comparison.
const BELOW_SHIFT: u32 = 56;
const BELOW_BITS: u64 = 0xFF << BELOW_SHIFT;

/// Where the witness bytes `word` (little-endian) from the read point
/// whose [`hot_slot`] is `slot` stand in the wide memo. The bytes' hash
/// does not depend on the memo's last load, so only the XOR is on the
/// chain of dependent loads.
#[inline]
fn wide_slot(slot: u16, word: u32) -> usize {
    (usize::from(slot) ^ (word.wrapping_mul(0x9E37_79B1) >> (32 - WIDES.trailing_zeros())) as usize)
        & (WIDES - 1)
}

/// The [`WIDE_STEPS`] bytes from `bytes[at]` on (little-endian) when they
/// and the byte after them are all byte witnesses (`is_byte_witness`:
/// neither 0 nor 0xFF), tested in one word.
#[inline]
fn witness_word(bytes: &[u8], at: usize) -> Option<u32> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    const TESTED: u64 = (1 << (8 * (WIDE_STEPS + 1))) - 1;
    let x = u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?);
    // A byte's high bit is set where it is 0 (in `x`) or 0xFF (in `!x`);
    // a false one only above a true one, so "any" is exact.
    let zero = |y: u64| y.wrapping_sub(ONES) & !y & HIGHS;
    ((zero(x) | zero(!x)) & TESTED == 0).then_some(x as u32)
}

/// Whether `bytes[at..]` starts with a record the machine reads only at
/// a call or a return: ENTER, ENTER_SAME or ENTER_AT (an indirectly called procedure
/// announces itself) or RETURN (a marked call came back). A step that
/// reads no item and makes no call may go before it, as the block-by-block
/// walk passes those blocks before it reads the record; a SIGNAL (which
/// needs the passed blocks to place it), a LAZY (which decides a PLT
/// stub's jump) or any other record stops the chain before the step.
/// xz's 2 MB trace has a witness before an ENTER or a RETURN about 8 M
/// times.
#[inline]
fn read_at_call(bytes: &[u8], at: usize) -> bool {
    bytes[at] == ESCAPE
        && matches!(
            bytes.get(at + 1),
            Some(
                &(stream::kind::ENTER
                    | stream::kind::ENTER_SAME
                    | stream::kind::ENTER_AT
                    | stream::kind::RETURN)
            )
        )
}

/// Entries of the output memo (a power of two): 32 KiB.
const OUT: usize = 1 << 11;

/// An output memo entry ([`Summaries::output_run`]): the segment from
/// read point `key >> 8` for byte witness `key & 0xFF`, when it ends with
/// nothing pending; its output is `text[lo..hi]`.
#[derive(Clone, Copy, Debug)]
struct OutHot {
    key: u32,
    /// The segment's end, with [`Hot`]'s kind bits ([`Hot::RET`] alone
    /// when the witness chooses a `ret` and there is no segment);
    /// [`OutHot::NONE`] when the machine takes the witness.
    end: u32,
    lo: u32,
    hi: u32,
}

impl OutHot {
    const NONE: u32 = u32::MAX;
    const EMPTY: OutHot = OutHot {
        key: u32::MAX,
        end: OutHot::NONE,
        lo: 0,
        hi: 0,
    };
}

/// Where read point `b`'s entries start in the counting memo (the index
/// is this XOR the witness byte).
#[inline]
fn hot_slot(b: u32) -> u16 {
    (b.wrapping_mul(0x9E37_79B9) >> 21) as u16 & (HOT as u16 - 1)
}

/// A memo of `N` entries `empty` on the heap, its length in its type: an
/// index masked to `N - 1` needs no bounds check on the chain's loop.
fn memo<T: Clone, const N: usize>(empty: T) -> Box<[T; N]> {
    match vec![empty; N].into_boxed_slice().try_into() {
        Ok(memo) => memo,
        Err(_) => unreachable!("a vector of N entries"),
    }
}

/// What [`Summaries::count_run`] passed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Run {
    /// Witness bytes consumed: one per segment.
    pub witnesses: usize,
    /// The block the last segment ends at (nothing pending there).
    pub end: u32,
    /// Instructions and blocks passed, read points' blocks included.
    pub insns: u64,
    /// Blocks passed.
    pub blocks: u64,
    /// Counted transfers made (calls and `ret`s, `Machine::counted`).
    pub xfers: u32,
}

/// Where an output chain ([`Summaries::output_run`]) stopped.
#[derive(Clone, Copy, Debug, Default)]
pub struct OutRun {
    /// Witness bytes consumed.
    pub witnesses: usize,
    /// The block control stopped at (nothing pending there).
    pub end: u32,
    /// Counted transfers made (calls and `ret`s, `Machine::counted`).
    pub xfers: u32,
    /// The last bytes of output a later record could still cut (the
    /// machine's trail): the last segment's trail and all output after it.
    pub trail: usize,
}

#[cfg(test)]
thread_local! {
    /// Tests: output and counting walk block by block (the reference for
    /// summaries and counting chains).
    pub static WALK_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A summarised walk from a read point, for one witness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seg {
    /// The block the walk stops at (not part of the segment), or
    /// [`Seg::NONE`]`.end` when the read point must take the slow path.
    pub end: BlockIx,
    /// The witness still pending at `end`, or [`NO_WITNESS`].
    pub pending: u32,
    /// Blocks the segment walks through.
    pub blocks: u32,
    /// Instructions in those blocks.
    pub insns: u32,
    /// Output bytes, up to `end`, that the block-by-block walk keeps in
    /// its trail (`machine`): those after its last decision, with the
    /// deciding block's when its witness was written before its last
    /// instruction (`Succ::early`); the read point's own block included.
    pub trail: u32,
    /// `text[text_lo..text_hi]` of [`Summaries`]: the output of the read
    /// point's block, then of the segment's blocks.
    pub text_lo: u32,
    /// End (exclusive) of the segment's output in `text`.
    pub text_hi: u32,
}

impl Seg {
    /// Whether this is a summary, not [`Seg::NONE`]. Only `NONE` ends at
    /// EXIT (a walk stops at a block), so `end` alone decides; comparing
    /// the whole struct made the compiler reload it with one wide load
    /// after narrow stores, which stalls in the regenerator's hottest loop.
    #[inline]
    pub fn is_some(&self) -> bool {
        debug_assert!((self.end == Seg::NONE.end) == (*self == Seg::NONE));
        self.end != Seg::NONE.end
    }

    /// No summary: the machine walks this one block by block.
    pub const NONE: Seg = Seg {
        end: EXIT,
        pending: NO_WITNESS,
        blocks: 0,
        insns: 0,
        trail: 0,
        text_lo: 0,
        text_hi: 0,
    };
    /// Not computed yet.
    const UNKNOWN: Seg = Seg {
        end: NO_BLOCK,
        pending: NO_WITNESS,
        blocks: 0,
        insns: 0,
        trail: 0,
        text_lo: 0,
        text_hi: 0,
    };
}

/// The segments of one module, computed on first use: one per witness
/// choice of each predicate (`Module::choices`) and one per block whose only
/// successor carries a witness.
#[derive(Clone, Debug)]
pub struct Summaries {
    choice: Vec<Seg>,
    single: Vec<Seg>,
    /// A direct-mapped memo of `get`, keyed by `block << 32 | witness`
    /// (the binary search over a predicate's choices is a chain of
    /// dependent loads; hot loops ask for few pairs).
    memo: Box<[(u64, Seg)]>,
    /// The segments' output (with `with_text` only).
    text: Option<Vec<u8>>,
    /// The counting memo (`count_run`); empty for output, and for a module
    /// whose block numbers do not fit a [`Hot`] key's 24 bits.
    hot: Box<[Hot]>,
    /// The output memo (`output_run`); empty for counting, and for a
    /// module whose block numbers do not fit an [`OutHot`] key's 24 bits.
    out: Box<[OutHot]>,
    /// The call memo of `count_run`, direct-mapped by call block: the
    /// blocks of `frames` and of the calls it makes.
    calls: Box<[CallHot; CALLS]>,
    /// The wide memo of `count_run` ([`WIDE_STEPS`] steps in one).
    wides: Box<[Wide; WIDES]>,
    /// Beside each entry of `wides`: the frames it leaves pushed, the
    /// callees whose entries it counts and its hits not counted yet.
    wide_ops: Box<[WideOps; WIDES]>,
    /// Per procedure: entries of the hits [`Summaries::count_hits`] took
    /// off `wide_ops`, not in the machine's counts yet.
    pending: Vec<u64>,
    /// Beside each entry of `wides` with [`BELOW_BITS`] set: the call
    /// blocks of the frames below its read point that it returns through
    /// (the newest of `frames` at its lookup, newest first). sort's
    /// comparisons end in returns to the frames of calls made before the
    /// entry's read point.
    wide_frames: Box<[[u32; BELOW]; WIDES]>,
    /// The call blocks of the traced callers on top of the machine's
    /// stack (oldest first) while `count_run` runs: the machine moves
    /// its newest ones here before a run and back after it, so a chain
    /// returns through them as well as through the calls it made.
    pub frames: Vec<u32>,
}

impl Summaries {
    /// Summaries for counting.
    pub fn new(m: &Module) -> Summaries {
        #[allow(unused_mut)]
        let mut s = Summaries::unwalked(m);
        #[cfg(test)]
        if WALK_ONLY.with(|w| w.get()) {
            s.choice.fill(Seg::NONE);
            s.single.fill(Seg::NONE);
            s.hot = Box::default();
        }
        s
    }

    /// Summaries none of which is computed yet.
    fn unwalked(m: &Module) -> Summaries {
        Summaries {
            choice: vec![Seg::UNKNOWN; m.choices.len()],
            single: vec![Seg::UNKNOWN; m.blocks.len()],
            memo: vec![(u64::MAX, Seg::NONE); MEMO].into_boxed_slice(),
            text: None,
            hot: if m.blocks.len() < 1 << 24 {
                vec![Hot::EMPTY; HOT].into_boxed_slice()
            } else {
                Box::default()
            },
            out: Box::default(),
            calls: memo(CallHot::EMPTY),
            wides: memo(Wide::EMPTY),
            wide_ops: memo(WideOps {
                list: [0; WIDE_OPS],
                hits: 0,
            }),
            pending: vec![0; m.procs.len()],
            wide_frames: memo([0; BELOW]),
            frames: Vec::new(),
        }
    }

    /// Summaries that also keep each segment's output.
    pub fn with_text(m: &Module) -> Summaries {
        #[allow(unused_mut)]
        let mut s = Summaries {
            text: Some(Vec::new()),
            hot: Box::default(),
            out: if m.blocks.len() < 1 << 24 {
                vec![OutHot::EMPTY; OUT].into_boxed_slice()
            } else {
                Box::default()
            },
            ..Summaries::unwalked(m)
        };
        #[cfg(test)]
        if WALK_ONLY.with(|w| w.get()) {
            s.choice.fill(Seg::NONE);
            s.single.fill(Seg::NONE);
        }
        s
    }

    /// The output of segment `seg`.
    #[inline]
    pub fn text(&self, seg: Seg) -> &[u8] {
        match &self.text {
            Some(t) => &t[seg.text_lo as usize..seg.text_hi as usize],
            None => &[],
        }
    }

    /// The segment from read point `l` for witness `w`.
    #[inline]
    pub fn get(&mut self, m: &Module, l: BlockIx, w: u32) -> Seg {
        let key = u64::from(l.as_u32()) << 32 | u64::from(w);
        let h = (l.as_u32().wrapping_mul(0x9E37_79B9) ^ w) as usize & (MEMO - 1);
        if self.memo[h].0 == key {
            return self.memo[h].1;
        }
        let seg = self.lookup(m, l, w);
        self.memo[h] = (key, seg);
        seg
    }

    /// Counts consecutive segments from read point `l`, whose witness is
    /// `bytes[0]`, taking at most `max` of them: each while the next
    /// two bytes are byte witnesses, through the calls and returns the
    /// module comment lists (counting `entries` of each callee); the chain
    /// stops at a block that is neither a read point nor such a call, or
    /// before a read point with no segment ending with nothing pending
    /// (the machine takes it from there).
    /// With `skip_values` (a data trace whose values are not read), a
    /// single step also passes the VALUE records before its witness and
    /// takes one after which, past VALUE records, a witness comes.
    /// Out of line: the loop keeps its state in registers.
    #[inline(never)]
    pub fn count_run(
        &mut self,
        m: &Module,
        l: BlockIx,
        bytes: &[u8],
        max: usize,
        skip_values: bool,
        entries: &mut [u64],
    ) -> Run {
        let mut run = Run {
            end: l.as_u32(),
            ..Run::default()
        };
        if self.hot.is_empty() {
            return run;
        }
        let max = max.min(bytes.len().saturating_sub(1));
        // The wide memo's lookups stop before `at`: taking four steps at
        // `at` needs `at + WIDE_STEPS < max` (an entry's trailing plain
        // returns pass blocks where the loop pauses at `max`) and the
        // eight bytes `witness_word` loads.
        let wide_end = max
            .saturating_sub(WIDE_STEPS)
            .min((bytes.len() + 1).saturating_sub(8));
        let mut slot = hot_slot(run.end);
        let mut kind = kind(m, l);
        loop {
            debug_assert_eq!(slot, hot_slot(run.end));
            // Up to four steps and the calls among them at once when the
            // fifth byte is a witness too (so are the first two, which a
            // single step tests below). Most of gzip's, bzip2's and sort's
            // witnesses go here; a miss falls to the single steps below.
            while kind == Hot::AGAIN && run.witnesses < wide_end {
                let Some(word) = witness_word(bytes, run.witnesses) else {
                    break;
                };
                let i = wide_slot(slot, word);
                let key = u64::from(run.end) << 32 | u64::from(word);
                let held = self.wides[i].key;
                if held != key && !self.framed_hit(i, held, key) {
                    self.fill_wide(m, i, run.end, slot, word);
                }
                // Read after the fill, field by field as used: a copy of
                // the entry loaded all of it up front, into registers the
                // loop needs.
                let e = &self.wides[i];
                if e.steps == 0 {
                    break;
                }
                run.witnesses += usize::from(e.steps);
                run.insns += u64::from(e.insns);
                run.blocks += u64::from(e.blocks);
                run.xfers = run.xfers.wrapping_add(u32::from(e.xfers));
                let (ops, to, to_slot) = (e.ops, e.end, e.slot);
                if ops != 0 {
                    self.apply_ops(i, ops);
                }
                (run.end, kind, slot) = (to & !Hot::KINDS, to & Hot::KINDS, to_slot);
            }
            if kind == Hot::CALL {
                let c = self.call_hot(m, run.end, slot);
                let (to, to_slot) = self.make_call(&mut run, &c, entries);
                (run.end, kind, slot) = (to & !Hot::KINDS, to & Hot::KINDS, to_slot);
                continue;
            }
            // The machine's read points (where it pauses for `max`).
            if kind & (Hot::AGAIN | Hot::RET0) == 0 || run.witnesses >= max {
                break;
            }
            if kind == Hot::RET0 {
                let Some((to, to_slot)) = self.plain_return(m, &mut run) else {
                    break;
                };
                (run.end, kind, slot) = (to & !Hot::KINDS, to & Hot::KINDS, to_slot);
                continue;
            }
            // A data trace's values before the witness, passed over where
            // the machine would pass them (after the pause check above);
            // given back when no step follows, so the machine pauses
            // where it would have.
            let at = run.witnesses;
            if skip_values {
                run.witnesses += stream::values_before_witness(bytes, at).unwrap_or(0);
            }
            let (v, next) = (bytes[run.witnesses], bytes[run.witnesses + 1]);
            let next_ok = is_byte_witness(next)
                || skip_values && stream::values_before_witness(bytes, run.witnesses + 1).is_some();
            if !is_byte_witness(v) || !next_ok {
                if run.witnesses == at && is_byte_witness(v) && read_at_call(bytes, at + 1) {
                    self.last_step(m, &mut run, (slot, v), entries);
                } else {
                    run.witnesses = at;
                }
                break;
            }
            let Some((to, to_slot)) = self.step(m, &mut run, slot, v) else {
                run.witnesses = at;
                break;
            };
            (run.end, kind, slot) = (to & !Hot::KINDS, to & Hot::KINDS, to_slot);
        }
        run
    }

    /// Takes witness byte `v` at read point `run.end` (its [`hot_slot`] is
    /// `slot`) as one step of `count_run`'s chain, returning through a
    /// frame when the witness chooses a `ret`: where control stops, with
    /// [`Hot`]'s kind bits, and its `hot_slot`; `None`, `run` unchanged,
    /// where the machine must take the witness.
    #[inline(always)]
    fn step(&mut self, m: &Module, run: &mut Run, slot: u16, v: u8) -> Option<(u32, u16)> {
        let e = self.hot_entry(m, run.end, slot, v);
        if e.blocks == 0 {
            return None;
        }
        let to = if e.end & Hot::RET != 0 {
            self.chain_return(m, run)?
        } else {
            (e.end, e.slot)
        };
        run.witnesses += 1;
        run.insns += u64::from(e.insns);
        run.blocks += u64::from(e.blocks);
        Some(to)
    }

    /// The chain's last step, witness byte `v` at read point `run.end`,
    /// before an ENTER, ENTER_AT or RETURN ([`read_at_call`]): it reads no
    /// item, and the machine reads the record where the step ends (a call
    /// that is not the chain's, or a `ret` through a frame that is not).
    /// Then the direct calls that push a frame and the plain returns
    /// through the chain's frames up to the block where the machine reads
    /// the record: moves that read no item, as the machine's `call` and
    /// `step_from` make them with a record next. Not a call through a PLT
    /// stub or a tail jump (`CallHot::through`): a stub's lazy-binding
    /// rule reads an ENTER.
    /// Off the loop's path: a record next is rare but in xz's liblzma,
    /// which calls its match finder and coders through pointers; most of
    /// those steps end at a direct call or a plain return.
    #[inline(never)]
    fn last_step(&mut self, m: &Module, run: &mut Run, (slot, v): (u16, u8), entries: &mut [u64]) {
        let Some((mut to, _)) = self.step(m, run, slot, v) else {
            return;
        };
        loop {
            run.end = to & !Hot::KINDS;
            to = match to & Hot::KINDS {
                Hot::CALL => {
                    let c = self.call_hot(m, run.end, hot_slot(run.end));
                    if c.through {
                        return;
                    }
                    self.make_call(run, &c, entries).0
                }
                Hot::RET0 => match self.plain_return(m, run) {
                    Some((to, _)) => to,
                    None => return,
                },
                _ => return,
            };
        }
    }

    /// Makes call `c` of block `run.end` as a step of the chain (see
    /// [`CallHot`]): where control stops then, with [`Hot`]'s kind bits,
    /// and its `hot_slot`.
    #[inline(always)]
    fn make_call(&mut self, run: &mut Run, c: &CallHot, entries: &mut [u64]) -> (u32, u16) {
        if c.through {
            run.insns += u64::from(c.back_insns);
            run.blocks += u64::from(c.back_blocks);
        } else {
            self.frames.push(run.end);
        }
        entries[c.callee as usize] += 1;
        run.xfers = run.xfers.wrapping_add(u32::from(c.xfers));
        run.insns += u64::from(c.insns);
        run.blocks += u64::from(c.blocks);
        (c.land, c.land_slot)
    }

    /// A `ret` no witness chose, at block `run.end`: the block, then the
    /// caller's fall-throughs ([`Summaries::chain_return`]); `None`, `run`
    /// unchanged, when the machine must return.
    #[inline(always)]
    fn plain_return(&mut self, m: &Module, run: &mut Run) -> Option<(u32, u16)> {
        let ninsns = m.blocks[BlockIx::new(run.end as usize)].ninsns;
        let to = self.chain_return(m, run)?;
        run.insns += u64::from(ninsns);
        run.blocks += 1;
        Some(to)
    }

    /// Outputs the chain of steps from read point `l`, whose witness is
    /// `bytes[0]`, as [`Summaries::count_run`] counts it: consecutive
    /// segments while the next two bytes are byte witnesses and the
    /// segment before ends, with nothing pending, at another read point;
    /// through the calls and returns the counting chain makes (their
    /// blocks' output, the frames on [`Summaries::frames`], the callees'
    /// entries in `entries`); taking at most `max` witnesses and stopping
    /// once `out` holds `limit` bytes. `run.witnesses == 0`: none taken,
    /// the machine takes the witness itself.
    /// Out of line: the loop keeps its state in registers.
    #[inline(never)]
    pub fn output_run(
        &mut self,
        m: &Module,
        l: BlockIx,
        bytes: &[u8],
        (max, limit): (usize, usize),
        out: &mut Vec<u8>,
        entries: &mut [u64],
    ) -> OutRun {
        let mut run = OutRun {
            end: l.as_u32(),
            ..OutRun::default()
        };
        if self.out.is_empty() {
            return run;
        }
        let max = max.min(bytes.len().saturating_sub(1));
        // The last witness step: a segment's read point and witness, or
        // `None` for a witness choosing a `ret`; where its output ends.
        let mut last = (None, out.len());
        let mut kind = Hot::AGAIN;
        loop {
            if kind == Hot::CALL {
                let c = self.call_hot(m, run.end, hot_slot(run.end));
                self.call_text(m, run.end, &c, out);
                if !c.through {
                    self.frames.push(run.end);
                }
                entries[c.callee as usize] += 1;
                run.xfers = run.xfers.wrapping_add(u32::from(c.xfers));
                (run.end, kind) = (c.land & !Hot::KINDS, c.land & Hot::KINDS);
                continue;
            }
            if kind & (Hot::AGAIN | Hot::RET0) == 0 || run.witnesses >= max || out.len() >= limit {
                break;
            }
            if kind == Hot::RET0 {
                // A `ret` no witness chose: the block, then the caller's.
                let Some(to) = self.output_return(m, run.end, &mut run.xfers, out) else {
                    break;
                };
                (run.end, kind) = (to & !Hot::KINDS, to & Hot::KINDS);
                continue;
            }
            let (v, next) = (bytes[run.witnesses], bytes[run.witnesses + 1]);
            if !is_byte_witness(v) || !is_byte_witness(next) {
                break;
            }
            let w = u32::from(v - 1);
            let h = usize::from(hot_slot(run.end) ^ u16::from(v)) & (OUT - 1);
            if self.out[h].key != run.end << 8 | w {
                self.fill_out(m, h, run.end, w);
            }
            let e = self.out[h];
            if e.end == OutHot::NONE {
                break;
            }
            let to = if e.end & Hot::RET != 0 {
                // The witness chooses a `ret`: all output after the read
                // point's block is kept as the trail.
                let at = out.len();
                let Some(to) = self.output_return(m, run.end, &mut run.xfers, out) else {
                    break;
                };
                last = (None, at);
                to
            } else {
                let text = self.text.as_deref().unwrap_or_default();
                out.extend_from_slice(&text[e.lo as usize..e.hi as usize]);
                last = (Some((BlockIx::new(run.end as usize), w)), out.len());
                e.end
            };
            run.witnesses += 1;
            (run.end, kind) = (to & !Hot::KINDS, to & Hot::KINDS);
        }
        // The trail: the last segment's (as the machine keeps it after
        // one), then everything output after it.
        let from = match last {
            (Some((read, w)), after) => after - self.get(m, read, w).trail as usize,
            (None, at) => at,
        };
        run.trail = out.len() - from;
        run
    }

    /// Outputs the return from block `b` (no call) to the newest frame of
    /// [`Summaries::frames`] as `chain_return` takes it: `b`'s block and
    /// the caller's fall-throughs after the call. Where control stops
    /// then, with [`Hot`]'s kind bits; `None`, with nothing changed, when
    /// the machine must return.
    #[inline]
    fn output_return(
        &mut self,
        m: &Module,
        b: u32,
        xfers: &mut u32,
        out: &mut Vec<u8>,
    ) -> Option<u32> {
        let c = *self.frames.last()?;
        let back = self.call_hot(m, c, hot_slot(c));
        if back.back == CallHot::NO_BACK {
            return None;
        }
        self.frames.pop();
        *xfers = xfers.wrapping_add(u32::from(m.counts_returns));
        out.extend_from_slice(m.text(&m.blocks[BlockIx::new(b as usize)]));
        falls_text(m, return_point(m, c), back.back_blocks, out);
        Some(back.back)
    }

    /// Outputs what call block `c`, with memo entry `call`, passes when
    /// the chain makes the call: its block, the callee's fall-throughs
    /// (a PLT stub's block), and through a PLT stub the fall-throughs
    /// after the return.
    #[inline]
    fn call_text(&self, m: &Module, c: u32, call: &CallHot, out: &mut Vec<u8>) {
        out.extend_from_slice(m.text(&m.blocks[BlockIx::new(c as usize)]));
        let entry = m.procs[ProcIx::from_u32(call.callee)].entry;
        falls_text(m, entry, call.blocks - 1, out);
        if call.through && call.back != CallHot::NO_BACK {
            falls_text(m, return_point(m, c), call.back_blocks, out);
        }
    }

    /// Fills output memo entry `h` for read point `l` and witness `w`.
    #[inline(never)]
    fn fill_out(&mut self, m: &Module, h: usize, l: u32, w: u32) {
        let read = BlockIx::new(l as usize);
        let seg = self.get(m, read, w);
        let end = if seg.is_some() && seg.pending == NO_WITNESS {
            seg.end.as_u32() | kind(m, seg.end)
        } else if !seg.is_some() && returns_by(m, &m.blocks[read], w) {
            Hot::RET
        } else {
            OutHot::NONE
        };
        let (lo, hi) = (seg.text_lo, seg.text_hi);
        self.out[h] = OutHot {
            key: l << 8 | w,
            end,
            lo,
            hi,
        };
    }

    /// Returns from the newest frame of `frames` (adding the fall-throughs
    /// after it to `run`): where control stops then, with [`Hot`]'s kind
    /// bits, and its block's [`hot_slot`]; `None`, with nothing changed,
    /// when the machine must return.
    #[inline]
    fn chain_return(&mut self, m: &Module, run: &mut Run) -> Option<(u32, u16)> {
        let c = *self.frames.last()?;
        let back = self.call_hot(m, c, hot_slot(c));
        if back.back == CallHot::NO_BACK {
            return None;
        }
        self.frames.pop();
        run.xfers = run.xfers.wrapping_add(u32::from(m.counts_returns));
        run.insns += u64::from(back.back_insns);
        run.blocks += u64::from(back.back_blocks);
        Some((back.back, back.back_slot))
    }

    /// The call memo's entry for call block `c` (one the chain makes),
    /// whose [`hot_slot`] is `slot`.
    /// Inlined, its hit path is a load and a compare on the chain's loop
    /// (out of line it was 11 % of `--count`'s time, mostly the call and
    /// the 32-byte copy of its result).
    #[inline(always)]
    fn call_hot(&mut self, m: &Module, c: u32, slot: u16) -> CallHot {
        debug_assert_eq!(slot, hot_slot(c));
        let h = usize::from(slot) & (CALLS - 1);
        if self.calls[h].key != c {
            self.fill_call_hot(m, h, c);
        }
        self.calls[h]
    }

    /// Fills call memo entry `h` for call block `c` (off the hot path).
    #[cold]
    #[inline(never)]
    fn fill_call_hot(&mut self, m: &Module, h: usize, c: u32) {
        self.calls[h] = fill_call(m, c);
    }

    /// The counting memo's entry for read point `l`, whose [`hot_slot`]
    /// is `slot`, and witness byte `v` (inlined: the chain's hot path).
    #[inline(always)]
    fn hot_entry(&mut self, m: &Module, l: u32, slot: u16, v: u8) -> Hot {
        let h = usize::from(slot ^ u16::from(v)) & (HOT - 1);
        if self.hot[h].key != l << 8 | u32::from(v - 1) {
            self.fill_hot(m, h, l, u32::from(v - 1));
        }
        self.hot[h]
    }

    /// Pops the frames below wide memo entry `i`'s read point, pushes the
    /// frames it leaves and counts one more hit of its callees, as its
    /// `ops` ([`Wide::ops`]) say. The callees' entries are counted when
    /// the entry is filled again or the machine's run ends
    /// ([`Summaries::count_hits`], [`Summaries::settle_entries`]), not at
    /// each hit (sort: 4.3 callees a hit, 7 instructions each), nor at
    /// each chain's end (xz's chains are short: they stop at each ENTER
    /// and RETURN). The frames are pushed as one copy of the whole list,
    /// cut to their number: a loop over them took about 45 instructions a
    /// hit on sort.
    #[inline(always)]
    fn apply_ops(&mut self, i: usize, ops: u16) {
        let pops = usize::from(ops >> POPS & 3);
        if pops != 0 {
            debug_assert!(self.frames_below(i, pops));
            self.frames.truncate(self.frames.len() - pops);
        }
        let p = usize::from(ops >> 8 & 0xF);
        if p != 0 {
            let len = self.frames.len();
            self.frames.extend_from_slice(&self.wide_ops[i].list);
            self.frames.truncate(len + p);
        }
        if ops & 0xFF != 0 {
            let hits = &mut self.wide_ops[i].hits;
            *hits += 1;
            if *hits == u32::MAX {
                self.count_hits(i);
            }
        }
    }

    /// Moves wide memo entry `i`'s hits not counted yet to its callees'
    /// counts in `pending`.
    #[cold]
    #[inline(never)]
    fn count_hits(&mut self, i: usize) {
        let ops = self.wides[i].ops;
        let (n, p) = (usize::from(ops & 0xFF), usize::from(ops >> 8 & 0xF));
        let w = &mut self.wide_ops[i];
        let hits = u64::from(std::mem::take(&mut w.hits));
        for &q in &w.list[p..p + n] {
            self.pending[q as usize] += hits;
        }
    }

    /// Adds the callee entries of every wide memo entry's hits not
    /// counted yet to `entries` (the machine's, for this module), as the
    /// machine's run ends: its counts are then whole, and these summaries
    /// may go to another machine.
    pub fn settle_entries(&mut self, entries: &mut [u64]) {
        debug_assert_eq!(entries.len(), self.pending.len());
        for i in 0..WIDES {
            if self.wide_ops[i].hits != 0 {
                self.count_hits(i);
            }
        }
        for (e, p) in entries.iter_mut().zip(&mut self.pending) {
            *e += std::mem::take(p);
        }
    }

    /// Whether no wide memo entry has hits whose callees' entries are not
    /// counted yet.
    pub fn settled(&self) -> bool {
        self.wide_ops.iter().all(|w| w.hits == 0) && self.pending.iter().all(|&p| p == 0)
    }

    /// Whether wide memo entry `i`, keyed `held`, is the one for `key`
    /// but for [`BELOW_BITS`] and pops frames on top of `frames` below its
    /// read point: a hit, off the path of the entries that pop none.
    #[inline(always)]
    fn framed_hit(&self, i: usize, held: u64, key: u64) -> bool {
        let n = (held >> BELOW_SHIFT) as usize;
        held & !BELOW_BITS == key && n != 0 && self.frames_below(i, n)
    }

    /// Whether the newest `n` frames of `frames` are wide memo entry
    /// `i`'s frames below its read point (`n` at most [`BELOW`]).
    #[inline(always)]
    fn frames_below(&self, i: usize, n: usize) -> bool {
        let kept = &self.wide_frames[i];
        n <= BELOW
            && self.frames.len() >= n
            && (0..n).all(|k| self.frames[self.frames.len() - 1 - k] == kept[k])
    }

    /// Fills wide memo entry `i` for read point `l` (its [`hot_slot`] is
    /// `slot`) and the witness bytes of `word`, from single steps, calls
    /// and returns as `count_run` takes them, with `frames` as they stand
    /// (returns below the read point may pop up to [`BELOW`] of their
    /// newest, kept in `wide_frames`).
    /// After each step it also makes the calls that follow (the loop makes
    /// those without looking at `max`); after the last, the plain returns
    /// through frames it pushed itself too ([`Summaries::trailing_returns`];
    /// the lookup's bound keeps them before `max`, where the loop pauses).
    /// Taking the returns below its read point too cost gzip 3 % and bzip2
    /// 12 % more instructions: an entry that returns below its read point
    /// matches only with those frames, so more entries were filled.
    /// A failed step leaves `f` as it was (`wide_step`, `wide_return` and
    /// `wide_call` change nothing when they fail), so only the calls and
    /// returns before a step need undoing: the fill copies its state only
    /// there (a copy per step stalled on store forwarding, 46 % of bzip2's
    /// fill samples).
    /// The callee entries of the replaced entry's hits are counted first.
    #[cold]
    #[inline(never)]
    fn fill_wide(&mut self, m: &Module, i: usize, l: u32, slot: u16, word: u32) {
        let mut f = WideFill {
            end: l | Hot::AGAIN,
            slot: u32::from(slot),
            insns: 0,
            blocks: 0,
            steps: 0,
            xfers: 0,
            below: [0; BELOW],
            nbelow: 0,
            nops: 0,
            ops: [0; WIDE_OPS],
        };
        for v in word.to_le_bytes() {
            let undo = (f.end & (Hot::CALL | Hot::RET0) != 0).then_some(f);
            if !self.reach_read_point(m, &mut f) || !self.wide_step(m, &mut f, v) {
                if let Some(u) = undo {
                    f = u;
                }
                break;
            }
            while f.end & Hot::KINDS == Hot::CALL && self.wide_call(m, &mut f) {}
        }
        if f.steps != 0 {
            self.trailing_returns(m, &mut f);
        }
        debug_assert!(f.steps != 0 || f.end == l | Hot::AGAIN);
        debug_assert!(l < 1 << 24, "a Wide key's read point is below BELOW_BITS");
        if self.wides[i].ops & 0xFF != 0 && self.wide_ops[i].hits != 0 {
            self.count_hits(i);
        }
        let (wide, ops) = f.entry(u64::from(l) << 32 | u64::from(word));
        self.wides[i] = wide;
        self.wide_frames[i] = f.below;
        if f.nops != 0 {
            self.wide_ops[i] = ops;
        }
    }

    /// After an entry's last step: the plain returns through frames the
    /// entry pushed itself, and the calls after them (moves that read no
    /// item). Not through frames below its read point: an entry that pops
    /// one matches only with it on top, so more entries would be filled.
    fn trailing_returns(&mut self, m: &Module, f: &mut WideFill) {
        let own = |f: &WideFill| f.ops[..f.nops as usize].iter().any(|&op| op & PUSH != 0);
        while f.end & Hot::KINDS == Hot::RET0 && own(f) {
            if !self.wide_plain_return(m, f) {
                return;
            }
            while f.end & Hot::KINDS == Hot::CALL && self.wide_call(m, f) {}
        }
    }

    /// Moves `f` through calls and plain returns to a read point; false
    /// where `f` cannot go on.
    fn reach_read_point(&mut self, m: &Module, f: &mut WideFill) -> bool {
        loop {
            let ok = match f.end & Hot::KINDS {
                Hot::AGAIN => return true,
                Hot::CALL => self.wide_call(m, f),
                Hot::RET0 => self.wide_plain_return(m, f),
                _ => false,
            };
            if !ok {
                return false;
            }
        }
    }

    /// The `ret` no witness chose at `f`'s end (its block, then the
    /// caller's fall-throughs), as `count_run`'s `plain_return` takes it;
    /// false, `f` unchanged, where the entry cannot follow.
    fn wide_plain_return(&mut self, m: &Module, f: &mut WideFill) -> bool {
        let b = &m.blocks[BlockIx::new((f.end & !Hot::KINDS) as usize)];
        self.wide_return(m, f, b.ninsns, 1)
    }

    /// Takes witness byte `v` at `f`'s read point; false, `f` unchanged,
    /// where `count_run`'s single step would stop or the entry could not
    /// follow.
    fn wide_step(&mut self, m: &Module, f: &mut WideFill, v: u8) -> bool {
        let e = self.hot_entry(m, f.end & !Hot::KINDS, f.slot as u16, v);
        let (insns, blocks) = (e.insns, u32::from(e.blocks));
        let ok = blocks != 0
            && if e.end & Hot::RET != 0 {
                self.wide_return(m, f, insns, blocks)
            } else {
                f.add(insns, blocks) && {
                    (f.end, f.slot) = (e.end, u32::from(e.slot));
                    true
                }
            };
        f.steps += u32::from(ok);
        ok
    }

    /// Makes the call at `f`'s end as `count_run` does; false, `f`
    /// unchanged, when its ops would not fit.
    fn wide_call(&mut self, m: &Module, f: &mut WideFill) -> bool {
        let c = f.end & !Hot::KINDS;
        let call = self.call_hot(m, c, f.slot as u16);
        let back = u32::from(call.through);
        let xfers = f.xfers + u32::from(call.xfers);
        if f.nops as usize + 2 - back as usize > WIDE_OPS
            || xfers > u32::from(u8::MAX)
            || !f.add(
                call.insns.saturating_add(call.back_insns * back),
                u32::from(call.blocks) + u32::from(call.back_blocks) * back,
            )
        {
            return false;
        }
        f.xfers = xfers;
        debug_assert!(call.callee & PUSH == 0);
        f.op(call.callee);
        if !call.through {
            f.op(PUSH | c);
        }
        (f.end, f.slot) = (call.land, u32::from(call.land_slot));
        true
    }

    /// Passes `insns` instructions in `blocks` blocks, then returns as
    /// `chain_return` does: through the newest frame `f` pushed itself,
    /// or when it has none left, through the newest of `frames` it has not
    /// popped, up to [`BELOW`] of them (kept in `wide_frames`, which the
    /// lookup then matches); false,
    /// `f` unchanged, when there is no such frame, the machine must take
    /// the return, or a count would overflow.
    fn wide_return(&mut self, m: &Module, f: &mut WideFill, insns: u32, blocks: u32) -> bool {
        let n = f.nops as usize;
        let own = f.ops[..n].iter().rposition(|&op| op & PUSH != 0);
        let c = match own {
            Some(k) => f.ops[k] & !PUSH,
            None => match self.frames.len().checked_sub(1 + f.nbelow as usize) {
                Some(j) if (f.nbelow as usize) < BELOW => self.frames[j],
                _ => return false,
            },
        };
        let back = self.call_hot(m, c, hot_slot(c));
        let xfers = f.xfers + u32::from(m.counts_returns);
        if back.back == CallHot::NO_BACK
            || xfers > u32::from(u8::MAX)
            || !f.add(
                back.back_insns.saturating_add(insns),
                u32::from(back.back_blocks) + blocks,
            )
        {
            return false;
        }
        f.xfers = xfers;
        match own {
            Some(k) => {
                f.ops.copy_within(k + 1..n, k);
                f.nops -= 1;
            }
            None => {
                f.below[f.nbelow as usize] = c;
                f.nbelow += 1;
            }
        }
        (f.end, f.slot) = (back.back, u32::from(back.back_slot));
        true
    }

    /// Fills counting memo entry `h` for read point `l` and witness `w`:
    /// no blocks when its segment does not end with nothing pending and
    /// the witness chooses no `ret` either.
    #[inline(never)]
    fn fill_hot(&mut self, m: &Module, h: usize, l: u32, w: u32) {
        let key = l << 8 | w;
        let l = BlockIx::new(l as usize);
        let seg = self.get(m, l, w);
        let b = &m.blocks[l];
        self.hot[h] = if !seg.is_some() {
            match returns_by(m, b, w) {
                true => Hot {
                    key,
                    end: Hot::RET,
                    insns: b.ninsns,
                    blocks: 1,
                    slot: 0,
                },
                false => Hot { key, ..Hot::EMPTY },
            }
        } else if seg.pending != NO_WITNESS {
            Hot { key, ..Hot::EMPTY }
        } else {
            Hot {
                key,
                end: seg.end.as_u32() | kind(m, seg.end),
                insns: b.ninsns + seg.insns,
                blocks: 1 + seg.blocks as u16,
                slot: hot_slot(seg.end.as_u32()),
            }
        };
    }

    #[inline(never)]
    fn lookup(&mut self, m: &Module, l: BlockIx, w: u32) -> Seg {
        let b = &m.blocks[l];
        // The segment's number in the module: its choice, or after the
        // choices, its block.
        let number = if b.choice_hi > b.choice_lo {
            let cs = &m.choices[b.choice_lo as usize..b.choice_hi as usize];
            match cs.binary_search_by_key(&w, |&(cw, _)| cw) {
                Ok(i) => b.choice_lo as usize + i,
                Err(_) => return Seg::NONE,
            }
        } else {
            // One slot per block: only its successor's own witness fits.
            if b.succ_hi - b.succ_lo != 1 || m.succs[b.succ_lo as usize].witness != w {
                return Seg::NONE;
            }
            m.choices.len() + l.index()
        };
        let slot = match number.checked_sub(m.choices.len()) {
            None => &mut self.choice[number],
            Some(k) => &mut self.single[k],
        };
        if *slot == Seg::UNKNOWN {
            *slot = walk(m, l, w, self.text.as_mut());
            if let Some(text) = self.text.as_mut().filter(|_| m.segment_records()) {
                compact(m, (l, w, number as u32), slot, text);
            }
        }
        *slot
    }
}

/// How many segments module `m` can have: the numbers of
/// [`crate::visit::Segment`] records are below this.
pub fn segment_numbers(m: &Module) -> usize {
    m.choices.len() + m.blocks.len()
}

/// With segment records: replaces the output of segment `seg`, just
/// walked from read point `key.0` for witness `key.1` (number `key.2`),
/// by one segment record for its blocks before the trail, then the
/// trail's block records. Those blocks certainly ran once the segment's
/// witness was read (the trail is what may still be cut), so what is
/// certain, and `seg.trail`, are unchanged. Fewer than two blocks stay
/// as they are.
fn compact(m: &Module, key: (BlockIx, u32, u32), seg: &mut Seg, text: &mut Vec<u8>) {
    let (lo, hi) = (seg.text_lo as usize, seg.text_hi as usize);
    if !seg.is_some() || hi != text.len() {
        return;
    }
    let record = crate::visit::RECORD;
    let before = hi - lo - seg.trail as usize;
    debug_assert_eq!(before % record, 0, "whole block records");
    if before < 2 * record {
        return;
    }
    let trail = text.split_off(lo + before);
    text.truncate(lo);
    m.segment_record(text, key.0, key.2, key.1, (before / record) as u32);
    text.extend_from_slice(&trail);
    seg.text_hi = text.len() as u32;
}

/// The first `n` blocks of the segment from read point `l` for witness
/// `w`, the read point's first: the blocks a segment record stands for.
pub fn segment_blocks(m: &Module, l: BlockIx, w: u32, n: u32) -> Vec<BlockIx> {
    let mut blocks = vec![l];
    let mut step = forced(m, &m.blocks[l], w);
    while blocks.len() < n as usize {
        let (si, pending) = step.expect("a segment record's blocks are forced moves");
        let to = m.succs[si as usize].to;
        blocks.push(to);
        step = forced(m, &m.blocks[to], pending);
    }
    blocks
}

/// What the counting chain does at block `e`, reached with nothing
/// pending: [`Hot::AGAIN`] at a read point, [`Hot::RET0`] at a `ret` no
/// witness chooses, [`Hot::CALL`] at a call it makes ([`chain_call`]),
/// else nothing (the machine takes `e`).
fn kind(m: &Module, e: BlockIx) -> u32 {
    let b = &m.blocks[e];
    if b.next != EXIT {
        0
    } else if b.call.is_none() {
        if returns_plain(m, b) {
            Hot::RET0
        } else {
            Hot::AGAIN
        }
    } else if chain_call(m, b).is_some() {
        Hot::CALL
    } else {
        0
    }
}

/// The callee of call block `b` when the counting chain makes the call as
/// `Machine::call` would with a byte witness next: a direct, unmarked
/// call of a traced procedure (no record stands at it, and its return
/// needs none), or a tail jump to one by the block's only edge, which no
/// witness chooses (`Machine::step_from` then makes the call).
fn chain_call(m: &Module, b: &Block) -> Option<u32> {
    let c = b.call?;
    let plain_tail = || match &m.succs[b.succ_lo as usize..b.succ_hi as usize] {
        [s] => s.witness == NO_WITNESS && s.to == EXIT && s.kind == EdgeKindDb::TailCall,
        _ => false,
    };
    match c.target {
        CallTarget::Proc(q) if !c.marker && (!c.tail || plain_tail()) => m
            .procs
            .get(ProcIx::from_u32(q))
            .is_some_and(|p| p.traced)
            .then_some(q),
        _ => None,
    }
}

/// Whether witness `w` at read point `b` chooses a `ret` edge and leaves
/// nothing pending (as `Machine::choose_succ` and `step_from` take it).
fn returns_by(m: &Module, b: &Block, w: u32) -> bool {
    let s = match b.succ_hi - b.succ_lo {
        0 => return false,
        1 => m.succs[b.succ_lo as usize],
        _ => match m.choose(b, w) {
            Some(si) if si != AMBIGUOUS => m.succs[si as usize],
            _ => return false,
        },
    };
    // One successor: its own witness; several: a witness edge, not one
    // that leaves the witness pending (an error at EXIT).
    let fits = match b.succ_hi - b.succ_lo {
        1 => s.witness == w,
        _ => s.witness != NO_WITNESS,
    };
    fits && s.to == EXIT && s.kind == EdgeKindDb::Return
}

/// Whether block `b` (no call) leaves by a `ret` that no witness chooses:
/// the machine takes it without reading the stream.
fn returns_plain(m: &Module, b: &Block) -> bool {
    b.succ_hi - b.succ_lo == 1 && {
        let s = m.succs[b.succ_lo as usize];
        s.witness == NO_WITNESS && s.to == EXIT && s.kind == EdgeKindDb::Return
    }
}

/// Follows plain fall-throughs from `x` (as the machine's fast path does)
/// to the first block that is not one: that block with its [`kind`], and
/// the blocks and instructions passed; `None` past [`MAX_BLOCKS`].
fn fall_through(m: &Module, mut x: BlockIx) -> Option<(u32, u32, u16)> {
    let (mut insns, mut blocks) = (0u32, 0u32);
    while m.blocks[x].next != EXIT {
        insns = insns.checked_add(m.blocks[x].ninsns)?;
        blocks += 1;
        if blocks > MAX_BLOCKS {
            return None;
        }
        x = m.blocks[x].next;
    }
    Some((x.as_u32() | kind(m, x), insns, blocks as u16))
}

/// The return point of call block `c`: its only successor.
fn return_point(m: &Module, c: u32) -> BlockIx {
    m.succs[m.blocks[BlockIx::new(c as usize)].succ_lo as usize].to
}

/// Appends the output of `n` blocks from `x` on, each falling into the
/// next (as [`fall_through`] passes them).
fn falls_text(m: &Module, mut x: BlockIx, n: u16, out: &mut Vec<u8>) {
    for _ in 0..n {
        let b = &m.blocks[x];
        out.extend_from_slice(m.text(b));
        x = b.next;
    }
}

/// The call memo entry for call block `c`: what the call passes when
/// [`chain_call`] makes it, and its return in any case.
fn fill_call(m: &Module, c: u32) -> CallHot {
    let b = &m.blocks[BlockIx::new(c as usize)];
    // A frame the machine pushed for another call: its return is the
    // machine's.
    let Some(callee) = chain_call(m, b) else {
        return CallHot {
            key: c,
            ..CallHot::EMPTY
        };
    };
    let entry = m.procs[ProcIx::from_u32(callee)].entry;
    let (land, insns, blocks) = fall_through(m, entry).unwrap_or((entry.as_u32(), 0, 0));
    let tail = b.call.is_some_and(|c| c.tail);
    // The return point: one successor, no witness (`choose_succ`); a
    // tail jump returns where its procedure does.
    let back = (b.succ_hi - b.succ_lo == 1 && !tail)
        .then(|| m.succs[b.succ_lo as usize])
        .filter(|r| r.witness == NO_WITNESS && r.to != EXIT)
        .and_then(|r| fall_through(m, r.to));
    let xfers = u8::from(b.call.is_some_and(|c| c.counts_transfer()));
    let mut hot = CallHot {
        key: c,
        callee,
        land,
        back: back.map_or(CallHot::NO_BACK, |t| t.0),
        insns: b.ninsns + insns,
        back_insns: back.map_or(0, |t| t.1),
        blocks: 1 + blocks,
        back_blocks: back.map_or(0, |t| t.2),
        land_slot: hot_slot(land & !Hot::KINDS),
        back_slot: back.map_or(0, |t| hot_slot(t.0 & !Hot::KINDS)),
        xfers,
        through: tail,
    };
    // A call of a PLT stub whose import returns at once: its return too.
    let stub = &m.blocks[BlockIx::new((land & !Hot::KINDS) as usize)];
    let returns = b.call.is_some_and(|c| c.returns);
    if let (Some(jump), Some(insns)) = (plt_through(m, stub), hot.insns.checked_add(stub.ninsns)) {
        if returns && !tail && hot.back != CallHot::NO_BACK && land & Hot::KINDS == 0 {
            (hot.land, hot.land_slot) = (hot.back, hot.back_slot);
            hot.insns = insns;
            hot.blocks += 1;
            hot.xfers += jump;
            hot.through = true;
        }
    }
    hot
}

/// For block `b` reached with nothing pending and a byte witness next:
/// the counted transfers (0 or 1) of its jump into untraced code that
/// returns, with no item read, to the caller on top of the machine's
/// stack; `None` for any other block. That is a PLT stub's `jmp [GOT]`
/// (or any external tail jump that is not an unresolved one) as
/// `Machine::step_from` takes it: its bound edge (LAZY would be next for
/// the lazy one), then `Machine::jump_external` and `jump_untraced`, whose
/// untraced code returns to the caller's frame (`Machine::leave`).
fn plt_through(m: &Module, b: &Block) -> Option<u8> {
    let c = b
        .call
        .filter(|c| c.tail && !c.indirect && c.target == CallTarget::External)?;
    let succs = &m.succs[b.succ_lo as usize..b.succ_hi as usize];
    let bound = match succs {
        [s] if s.witness == NO_WITNESS => s,
        // `Machine::plt_outcome`: one edge to EXIT, one to the lazy half.
        [s, t] if c.plt && (s.to == EXIT) != (t.to == EXIT) => {
            if s.to == EXIT {
                s
            } else {
                t
            }
        }
        _ => return None,
    };
    let fits = b.next == EXIT && bound.to == EXIT && bound.kind == EdgeKindDb::TailCall;
    fits.then_some(u8::from(c.counts_transfer()))
}

/// The successor `b` leaves by with `pending`, and the witness pending
/// after it; `None` where the full machine must decide (a call, EXIT, no
/// successor, a witness needed or not fitting).
#[inline]
fn forced(m: &Module, b: &Block, pending: u32) -> Option<(u32, u32)> {
    if b.call.is_some() {
        return None;
    }
    let si = match b.succ_hi - b.succ_lo {
        0 => return None,
        1 => {
            let s = m.succs[b.succ_lo as usize];
            if s.witness == NO_WITNESS {
                (b.succ_lo, pending)
            } else if s.witness == pending {
                (b.succ_lo, NO_WITNESS)
            } else {
                return None;
            }
        }
        _ => {
            if pending == NO_WITNESS {
                return None;
            }
            match m.choose(b, pending) {
                Some(si) if si != AMBIGUOUS => {
                    let p = if m.succs[si as usize].witness == NO_WITNESS {
                        pending
                    } else {
                        NO_WITNESS
                    };
                    (si, p)
                }
                _ => return None,
            }
        }
    };
    (m.succs[si.0 as usize].to != EXIT).then_some(si)
}

/// Walks from read point `l` having read `w` (see the module comment),
/// appending the segment's output to `text` when given.
fn walk(m: &Module, l: BlockIx, w: u32, mut text: Option<&mut Vec<u8>>) -> Seg {
    let Some((si, mut pending)) = forced(m, &m.blocks[l], w) else {
        return Seg::NONE;
    };
    // Every step that takes a witness (pending or read) ends the trail.
    let decided = |b: &Block, si: u32| -> Option<u32> {
        let s = m.succs[si as usize];
        (b.succ_hi - b.succ_lo > 1 || s.witness != NO_WITNESS).then(|| {
            if s.early {
                m.text(b).len() as u32
            } else {
                0
            }
        })
    };
    let Some(mut trail) = decided(&m.blocks[l], si) else {
        return Seg::NONE;
    };
    let mut to = m.succs[si as usize].to;
    let (mut blocks, mut insns) = (0u32, 0u32);
    let text_lo = text.as_ref().map_or(0, |t| t.len());
    if let Some(t) = text.as_deref_mut() {
        if t.len() + m.text(&m.blocks[l]).len() > TEXT_BYTES {
            return Seg::NONE;
        }
        t.extend_from_slice(m.text(&m.blocks[l]));
    }
    loop {
        let b = &m.blocks[to];
        let text_hi = text.as_ref().map_or(0, |t| t.len());
        let stop = Seg {
            end: to,
            pending,
            blocks,
            insns,
            trail,
            text_lo: text_lo as u32,
            text_hi: text_hi as u32,
        };
        if (b.next == EXIT && pending == NO_WITNESS) || blocks >= MAX_BLOCKS {
            return stop;
        }
        let Some((si, p)) = forced(m, b, pending) else {
            return stop;
        };
        let Some(n) = insns.checked_add(b.ninsns).filter(|&n| n < u32::MAX / 2) else {
            return stop;
        };
        if let Some(t) = text.as_deref_mut() {
            let bt = m.text(b);
            if t.len() + bt.len() > TEXT_BYTES {
                // The arena is full: this walk is not kept.
                t.truncate(text_lo);
                return Seg::NONE;
            }
            t.extend_from_slice(bt);
        }
        trail = decided(b, si).unwrap_or(trail + m.text(b).len() as u32);
        insns = n;
        blocks += 1;
        pending = p;
        to = m.succs[si as usize].to;
    }
}
