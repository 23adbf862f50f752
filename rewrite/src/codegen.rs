//! Code generation: the instrumented copies of the traced procedures, laid
//! out in one block of instructions and encoded by iced-x86's
//! `BlockEncoder` (paper 003 Section 4: a witness is written when its edge
//! is traversed; design decision 2).
//!
//! Layout of one procedure copy: its outside-entry stub (the springboard
//! target), then its blocks in address order, then the out-of-line stubs of
//! witnessed taken edges and jump-table cases. Within a block, a witness on
//! a fall-through edge is inline (no jump), one on a taken edge costs one
//! stub; witnesses on edges leaving by `ret`/`jmp` go just before that
//! instruction. Buffer checks sit at the entry block, loop headers and
//! every call's return point (docs/runtime.md section 4); a taken edge's
//! stub into a loop header writes its witness and the header's check in
//! one sequence and enters the header after its check. Counting with
//! `--stop-at`: every block (`calls`: every invocation) checks whether it
//! holds event N, and the out-of-line traps (`StopTrap`) after the stubs
//! stop the program there.
//!
//! Invariants:
//! - every emitted instruction's `ip` is 0 or a label from [`LABEL_BASE`]
//!   upwards (never an address), so `BlockEncoder` resolves exactly the
//!   branches we retargeted and encodes every other target as the absolute
//!   original address;
//! - original instructions are copied unchanged except for branch targets
//!   inside the copy and references to rewritten jump tables; RIP-relative
//!   operands keep their absolute targets (the encoder re-derives the
//!   displacement, the new segment lies within 2 GiB of the module);
//! - a PLT stub's jump with `CallPlan::lazy_record` writes nothing before
//!   it, and the piece its GOT slot's lazy value leads to writes LAZY
//!   first, before anything else of the lazy path runs (the regenerator's
//!   rule, `docs/regen.md` "PLT stubs");
//! - every instrumentation sequence comes from `aetrace_runtime::emit`
//!   unchanged (the signal fix-up recognises exactly those encodings);
//! - every emitted instruction carries the [`SigPoint`] a signal
//!   interrupting it stands at (docs/regen.md, "Signals"): a sequence that
//!   writes a witness or record is *before* up to and including its
//!   reserving `xadd` and *after* from the next instruction on (the
//!   runtime's fix-up completes the stores of a reserved write before the
//!   handler runs);
//! - when tracing, every transfer `CallDb::counts_transfer` names is preceded by exactly
//!   one `emit_transfer` (docs/runtime.md section 2, "The transfer
//!   count"), standing at the point before the transfer (before a call:
//!   after its SETJMP/LONGJMP record; before a tail jump: before its
//!   witness and EXIT; a PLT stub's `jmp [GOT]` without the PLT flag:
//!   after its GOT test, on the bound outcome (with it, the jump is not
//!   counted and the way into the stub is); a conditional tail call:
//!   first in its taken edge's stub), and so is every `ret` of a
//!   `Return` edge (`ProgramDb::counts_returns`: after its witness, right
//!   before the `ret`, standing before it); a
//!   transfer it cannot count stops the rewrite with an error naming its
//!   address (the regenerator counts every such transfer).

use std::collections::HashMap;

use aetrace_format::progdb::{SigPoint, SigRange};
use aetrace_graph::{BlockId, EdgeId, EntityRef};
use aetrace_runtime::layout::{RecordKind, S_OWNER};
use aetrace_runtime::{
    emit_buffer_check, emit_direct_entry, emit_outside_entry_at, emit_outside_entry_with,
    emit_record, emit_rsp_record, emit_static_entry, emit_transfer, emit_value, emit_witness,
    emit_witness_checked, Payload, RuntimeAddrs, Site, Value,
};
use iced_x86::code_asm::{eax, edi, r11, CodeAssembler};
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, FlowControl, Instruction, InstructionBlock,
    MemoryOperand, Mnemonic, OpKind, Register,
};

use crate::data;
use crate::liveness::Liveness;
use aetrace_analysis::cfg::{Cfg, EdgeKind};
use aetrace_analysis::imports;

/// First label id: non-canonical, so never a real code address.
pub const LABEL_BASE: u64 = 0xFFFF_8000_0000_0000;
/// Label ids a single emitter call may use (CodeAssembler numbers from 1).
const SEQ_LABELS: u64 = 0x100;

/// Linux x86-64 system calls that end the calling thread or process.
const SYS_EXIT: i32 = 60;
const SYS_EXIT_GROUP: i32 = 231;
/// execve, execveat: the recorder rewrites the program they run.
const SYS_EXECVE_EXECVEAT: [i32; 2] = [59, 322];
/// clone, clone3, fork, vfork: a new task that inherits the GS base.
const SYS_CLONE: i32 = 56;
const SYS_CLONE3: i32 = 435;
const SYS_FORK_VFORK: [i32; 2] = [57, 58];
/// The offset of `stack` in clone3's `struct clone_args`.
const CLONE_ARGS_STACK: i32 = 40;

/// How untraced code enters a procedure copy.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum EntryStub {
    /// The full outside-entry stub (callbacks, thread starts, handlers).
    Full,
    /// The process entry point: `[rsp]` is `argc`, not a return address,
    /// and the main thread already owns a slot (init ran from preinit).
    ProcessEntry,
    /// The process entry point of a static executable, which is also the
    /// new `e_entry`: calls the runtime's `init` first (no preinit array).
    StaticEntry,
}

/// The labels of a run-time-numbered `syscall`'s other copies
/// ([`ProcGen::syscall_exit`]): `task` for a task that returns where its
/// creator does ([`ProcGen::task_path`]), `own` for a clone on a stack of
/// the child's own ([`ProcGen::own_stack_path`]).
#[derive(Copy, Clone, Debug)]
struct TaskPaths {
    task: u64,
    own: Option<u64>,
}

/// What the rewriter adds around one call site.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CallPlan {
    /// A RETURN record at the return point (the callee may call back).
    pub marker: bool,
    /// A counted transfer (`docs/runtime.md` section 2, "The transfer
    /// count"): the thread's transfer count is incremented just before the
    /// call or jump (tracing only; the program database's call says which,
    /// `CallDb::counts_transfer`).
    pub count: bool,
    /// An EXIT(edi) record just before the call or GOT jump.
    pub exit_record: bool,
    /// A PLT stub's `jmp [GOT]` with `CallDb::plt`: copied alone (no
    /// compare, no witness); its lazy-binding outcome, where the GOT slot's
    /// initial value leads ([`Copies::lazy_slots`]), writes LAZY(stub) and
    /// goes on to the copy of the stub's lazy-binding half.
    pub lazy_record: bool,
    /// With `lazy_record`, when the lazy-binding half is a procedure of
    /// its own (IBT's `.plt` entry): its original start; the LAZY piece
    /// enters its copy past the outside-entry stub.
    pub lazy_entry: Option<u64>,
    /// A `syscall`: EXIT(edi) just before it when rax is exit or
    /// exit_group (the thread or process ends inside it); a number known
    /// only at run time that creates a task makes it on a path of its own
    /// with the fork's return point (`ProcGen::syscall_exit`).
    pub syscall_exit: bool,
    /// With `syscall_exit`, a number that may create a task
    /// (`calls::may_create_task`: not a constant, or a task-creating one
    /// with the flags live after it): the other copies of the `syscall`
    /// for the child ([`ProcGen::task_path`], [`ProcGen::own_stack_path`]).
    pub task_paths: bool,
    /// A call of libc's untraced `syscall()` for clone (56) or clone3
    /// (435) (`calls::syscall_call_task`): when the new task gets a stack
    /// of its own, on which it leaves `syscall()` for wherever the program
    /// pointed it, never this call's return point, still on its creator's
    /// slot, the slot is marked so that the child claims its own at its
    /// first outside entry ([`ProcGen::own_stack_mark`]).
    pub own_stack: Option<u64>,
    /// `call fork_child` in the child (the call returned 0) at the return
    /// point, FORKED(child's thread id) in the parent: after a call to a
    /// `fork`, or a system call that creates a task (`calls::creates_task`).
    pub fork: bool,
    /// A `fork` that runs `pthread_atfork` handlers: `call fork_prepare`
    /// just before it, `call fork_done` after it in both processes
    /// (docs/runtime.md section 7, "fork").
    pub atfork: bool,
    /// A call that may read or set a signal's disposition (`sigaction`,
    /// `signal`, ...): `call dispositions_native` just before it, `call
    /// dispositions_ours` at its return point (docs/runtime.md section 5,
    /// "Fatal signals").
    pub dispositions: bool,
    /// A call that opens a file by name (`open`, `fopen`, ...): `call
    /// maps_opened_fd` or `maps_opened_file` at its return point, which
    /// gives the program its view of its own maps (docs/runtime.md
    /// section 5, "The program's view of its maps").
    pub opens: Option<imports::Opened>,
    /// A call to `read`: `call maps_read` just before it.
    pub reads: bool,
    /// A call that reads a link or resolves a path (`readlink`,
    /// `realpath`, ...): `call exe_path` just before it, r11 the
    /// argument that names the path (docs/runtime.md section 5, "The
    /// executable's names").
    pub exe_path: Option<imports::PathArg>,
    /// A call of libc's untraced exec family: `call exec_request` just
    /// before it, r11 the kind (docs/runtime.md section 7, "exec"); on a
    /// lazily bound PLT stub's jump ([`CallPlan::lazy_record`]), before the
    /// jump when the slot is bound, else in its LAZY piece after LAZY.
    pub exec: Option<aetrace_runtime::layout::ExecKind>,
    /// A call of an untraced libc's `system`: `call shell_call` where an
    /// exec function's `exec_request` goes, r11 the kind; when it made
    /// the call (r11 = 0), the program's call is skipped: the code goes
    /// to the call's return point, or a PLT stub returns to its caller
    /// (docs/runtime.md section 7, "system and popen").
    pub shell: Option<aetrace_runtime::layout::ShellCall>,
    /// A setjmp-like call (`Some(Setjmp)`: SETJMP(rsp) just before it,
    /// SETJMP_RESUME at its return point when it returns again) or a
    /// longjmp-like one (`Some(Longjmp)`: nothing written since format
    /// 1.10, the setjmp's return point says where it went; `--stop-at`
    /// refuses both).
    pub jmpbuf: Option<RecordKind>,
    /// No buffer check at the return point: the callee is bounded
    /// (`checks`), the caller's check-free path runs on through it.
    pub unchecked_return: bool,
    /// Counting (path profiles, `--stop-at`) a static executable: the call
    /// is a `longjmp`, whose abandoned frames those cannot follow, so the
    /// program ends just before it with a message naming the call (a
    /// `setjmp` then returns only once; docs/profile.md, "Static
    /// executables").
    pub fatal_longjmp: bool,
    /// The call enters its traced callee by the original entry, whose
    /// springboard writes ENTER, not the copy's body: a setjmp call to a
    /// static libc's traced setjmp family (`Traced::setjmp_root_call`).
    pub by_entry: bool,
    /// An unresolved indirect jump: INDIRECT(target), then on through the
    /// procedure's map of original block starts to the copy
    /// ([`ProcPlan::map`]); elsewhere to the original target, counted, with
    /// DESYNC first when the target lies inside the procedure.
    pub indirect: bool,
}

/// Counting mode (`aetrace profile`, [`super::counters`]): counter
/// increments instead of witnesses, and no records, buffer checks or
/// outside-entry code.
#[derive(Clone, Debug)]
pub struct Counting {
    /// Address of counter 0 (8-byte counters).
    pub base: u64,
    /// `lock add` (the program can start threads).
    pub atomic: bool,
    /// Event counting: counter number `n` adds `amounts[n]` to counter 0;
    /// empty: counter `n` adds 1 to its own word.
    pub amounts: Vec<i32>,
    /// Path profiling (`aetrace paths`, [`super::pathprof`]): counter
    /// number `n` runs operation list `n` instead.
    pub paths: Option<PathCode>,
}

/// The path profiling code of a module: where its state is, and the
/// operation list of each counter number.
#[derive(Clone, Debug)]
pub struct PathCode {
    /// Link-time addresses of the path state the code reads and writes.
    pub state: super::pathprof::PathState,
    /// Per counter number, the path operations its instrumentation runs.
    pub ops: Vec<Vec<super::pathprof::PathOp>>,
    /// The unwinder's entry into a landing pad ends the program with a
    /// message (a static C program's libc has cleanup pads, which only a
    /// thread's cancellation or `pthread_exit` runs): the frames an unwind
    /// abandons are out of the shadow stack's reach.
    pub fatal_pads: bool,
}

/// The counters of one procedure in counting mode; edge counters are in
/// [`ProcPlan::witness`].
#[derive(Clone, Debug, Default)]
pub struct PlanCounters {
    /// Counter of invocations, at the copy's invocation label.
    pub entry: Option<u32>,
    /// Counter at the start of each block (every-block placement).
    pub blocks: Vec<Option<u32>>,
    /// Per block (empty: none): the counter of entries by the unwinder at
    /// this landing pad, in its LANDING stub.
    pub landing: Vec<Option<u32>>,
    /// Per `setjmp` call block (empty: none): the counter of all its
    /// returns, at the return point; its return edge's counter, if any,
    /// stands before the call (first returns only).
    pub resume: Vec<Option<u32>>,
    /// Per block (empty: none): the call's return edge is split by `S`
    /// (a `setjmp`, or a call after which the process may be two, `fork`):
    /// it may return more often than it is called.
    pub split_return: Vec<bool>,
    /// Path profiling: counter just before the call of each call block.
    pub before_call: Vec<Option<u32>>,
    /// `--stop-at`: the on-line queries (counter 0 starts at `-N`).
    pub stop: Option<super::counters::StopChecks>,
}

/// The out-of-line code that stops the program at event N (`--stop-at`,
/// docs/profile.md), entered from a check of block `block` that holds: it
/// runs the block's instructions before the one holding event N (a second
/// copy, comparing the counter before each), disables every later check
/// and jumps to that instruction's *original* address with the trap flag
/// set, so that the single-step trap reports exactly that address with the
/// program's registers, flags and stack.
struct StopTrap {
    label: u64,
    /// The check saved the flags (below the red zone) before comparing.
    flags_saved: bool,
    block: BlockId,
    /// insns: `phi(block)` (event N is instruction `k` when the counter is
    /// `-(phi + k + 1)`); blocks and calls: `None`, event N is the entry.
    phi: Option<i64>,
    point: SigPoint,
}

/// A resolved jump table rewritten to point into the copy.
#[derive(Clone, Debug)]
pub struct Table {
    /// Link-time address of the original table.
    pub old: u64,
    /// Link-time address of the rewritten table (in the new segment).
    pub new: u64,
    /// int32 entries relative to the table (else absolute 8-byte entries).
    pub rel32: bool,
    /// Absolute entries in a position-independent module: the original
    /// table's are moved by R_X86_64_RELATIVE relocations (glibc's
    /// `vfprintf` in a PIE, `&&label` tables), the copy's hold link-time
    /// addresses, and its jump adds the load bias ([`ProcGen::biased_jump`]).
    pub biased: bool,
    /// The case block of each entry, in table order.
    pub targets: Vec<BlockId>,
    /// The jump's block.
    pub block: BlockId,
}

impl ProcPlan<'_> {
    /// The `--stop-at` checks, in that mode.
    fn stop(&self) -> Option<&super::counters::StopChecks> {
        self.counters.as_ref().and_then(|c| c.stop.as_ref())
    }
}

impl Table {
    /// Size of the table in bytes: 4 per entry if `rel32`, else 8.
    pub fn size(&self) -> u64 {
        self.targets.len() as u64 * if self.rel32 { 4 } else { 8 }
    }
}

/// Everything code generation needs about one traced procedure.
pub struct ProcPlan<'a> {
    /// The procedure's number in ENTER records.
    pub number: u32,
    /// The procedure's symbol name (for messages).
    pub name: &'a str,
    /// Original link-time start address.
    pub start: u64,
    /// How untraced code enters the copy.
    pub stub: EntryStub,
    /// The recovered control-flow graph.
    pub cfg: &'a Cfg,
    /// The decoded instructions of each block, in CFG block order.
    pub insns: Vec<Vec<Instruction>>,
    /// Which flags and registers are free at each instruction (for the instrumentation).
    pub live: Liveness,
    /// Witness number per edge.
    pub witness: Vec<Option<u32>>,
    /// Per block: the call plan of its call site (call blocks and PLT-style
    /// GOT jumps).
    pub calls: Vec<CallPlan>,
    /// The procedure's resolved jump tables, rewritten to point into the copy.
    pub tables: Vec<Table>,
    /// Blocks that get a buffer check at their entry (`checks`): the entry
    /// block (unless the procedure ends every call chain), enough loop
    /// headers to cut every cycle, and blocks that cut long acyclic paths.
    pub loop_header: Vec<bool>,
    /// Landing pads (C++ exceptions): each gets a stub that writes
    /// LANDING(number) before entering the block; the copy's LSDA points
    /// there, so normal control flow into the block writes nothing.
    pub landing_pads: Vec<BlockId>,
    /// Counting mode: the procedure's entry and block counters.
    pub counters: Option<PlanCounters>,
    /// `--data --check`: per block and instruction, the values recorded
    /// before it (`data`).
    pub values: Option<crate::data::BlockValues>,
    /// The value (`rsp`) every outside-entry stub of the entry records
    /// right after its ENTER: with `record --data` when the entry starts
    /// with `rsp` known (`addr::exec::Entered::Outside`), in the
    /// control-only recording always (format 1.21, the debugger's frame
    /// addresses).
    pub entry_value: Option<Value>,
    /// With an unresolved jump: where its map from original addresses to
    /// the copy goes.
    pub map: Option<Map>,
    /// The module's code no procedure holds (`Program::unowned`): an
    /// unresolved jump there writes DESYNC.
    pub unowned: &'a [(u64, u64)],
    /// Tracing: the jumps to computed code addresses, each through its
    /// dense tables.
    pub dispatches: Vec<Dispatch>,
    /// Tracing: the secondary entry points of a procedure with several
    /// (`traced::entry_points_unfit`), their link-time address and block.
    /// Each gets an outside-entry stub that writes ENTER_AT and a
    /// springboard; every call or jump to one goes through it.
    pub entry_points: Vec<(u64, BlockId)>,
    /// Tracing: the module's untraced calls and jumps that enter the copy
    /// through its preserving stub (`runtime::emit_direct_entry`), which
    /// they are retargeted to, for their callers may keep values in
    /// registers the outside-entry stub would clobber
    /// (`traced::Traced::retarget_direct_entries`).
    pub direct_entries: Vec<Rel32Site>,
    /// A springboard at the entry leads to the outside-entry stub; none
    /// for a procedure too short for one that only direct branches enter
    /// (`traced::Traced::trace_unentered_short`).
    pub springboard: bool,
}

/// A direct call's or jump's rel32 field in the original code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rel32Site {
    /// The field's link-time address.
    pub field: u64,
    /// The next instruction's: the field holds `target - next`.
    pub next: u64,
}

/// The map an unresolved jump goes on through ([`CallPlan::indirect`]):
/// one int32 entry per byte of the procedure's primary range, relative to
/// the map, the copy of the block starting there (the analysis makes every
/// instruction of such a procedure start a block) or, for a byte inside an
/// instruction, 0 (the way out with DESYNC: a label is never the map itself).
#[derive(Clone, Copy, Debug)]
pub struct Map {
    /// Link-time address of the map (in the new segment, with the tables).
    pub new: u64,
    /// The procedure's start: entry 0.
    pub start: u64,
    /// Entries (bytes of the primary range).
    pub len: u64,
}

/// Per byte of a [`Map`]: the label of the block copy starting there.
type MapLabels = Vec<Option<u64>>;

/// A jump to computed code addresses (`JumpResolution::Computed`: a label
/// formed in another block, a `&&label` pointer loaded from a writable
/// array): traced as a jump table is, its cases through their witness
/// stubs. The copy finds the case from the original target the jump's
/// operand holds ([`ProcGen::computed`], docs/rewrite.md "Computed jumps").
#[derive(Clone, Debug)]
pub struct Dispatch {
    /// The jump's block.
    pub block: BlockId,
    /// Its targets in clusters, by address.
    pub chunks: Vec<Chunk>,
}

/// One cluster of a [`Dispatch`]'s targets: an int32 entry per byte from
/// the first target to the last, relative to the chunk's table, the copy's
/// case there or 0 (no target of the jump: the way out with DESYNC).
#[derive(Clone, Debug)]
pub struct Chunk {
    /// Link-time address of the first target: entry 0.
    pub start: u64,
    /// Link-time address of the table (in the new segment, with the
    /// jump tables).
    pub new: u64,
    /// Per byte from `start`: the case block a target starts there (EXIT:
    /// the jump's tail call into another procedure).
    pub cases: Vec<Option<BlockId>>,
}

/// Bytes the unresolved jump's dispatch keeps below the red zone: the
/// destination, rax, rcx and the flags.
const DISPATCH_FRAME: i64 = 32;

/// Where one procedure's copy ended up (for unwind tables).
#[derive(Clone, Debug, Default)]
pub struct ProcCopy {
    /// Original start.
    pub start: u64,
    /// `[new_start, new_end)`: stub, blocks and out-of-line stubs.
    pub new_start: u64,
    /// End of the copy (exclusive).
    pub new_end: u64,
    /// `(original address, copy address)` of every copied instruction, in
    /// layout order (original addresses ascending within a procedure).
    pub insn_map: Vec<(u64, u64)>,
    /// Per `insn_map` entry: where the instrumentation that stands before
    /// that copy starts (the copy itself when there is none): where
    /// control arriving at the original instruction enters the copy.
    pub leads: Vec<u64>,
    /// `(original landing pad, its LANDING stub in the copy)`.
    pub landing: Vec<(u64, u64)>,
    /// `[new_start, new_end)` range by range: where a signal interrupting
    /// the copy stands (offsets from `new_start`).
    pub sigmap: Vec<SigRange>,
}

/// The encoded copies.
pub struct Copies {
    /// The encoded code of all procedure copies, from the code segment's start.
    pub bytes: Vec<u8>,
    /// `(original entry, outside-entry stub address)` for the springboards.
    pub springboards: Vec<(u64, u64)>,
    /// Table bytes to place at each table's `new` address.
    pub tables: Vec<(u64, Vec<u8>)>,
    /// One per plan, in order.
    pub procs: Vec<ProcCopy>,
    /// `(GOT slot, address of its stub's LAZY piece)` for every stub
    /// copied with [`CallPlan::lazy_record`]: the slot's new initial value.
    pub lazy_slots: Vec<(u64, u64)>,
    /// Every [`ProcPlan::direct_entries`] site with its preserving stub's
    /// address: the field's new target.
    pub retargets: Vec<(Rel32Site, u64)>,
}

/// The result of code generation.
pub type GenResult<T> = std::result::Result<T, CodegenError>;

/// Why code generation (here, in `counters` and in `pathprof`) failed.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// iced could not build or assemble an instruction.
    #[error(transparent)]
    Iced(#[from] iced_x86::IcedError),
    /// A runtime record sequence could not be assembled.
    #[error(transparent)]
    Runtime(#[from] aetrace_runtime::Error),
    /// The block encoder could not encode the copies.
    #[error("encoding the copies: {0}")]
    Encode(#[source] iced_x86::IcedError),
    /// Generating the copy of procedure `name` failed.
    #[error("procedure {name}: {source}")]
    Procedure {
        /// The procedure.
        name: String,
        /// Why.
        source: Box<CodegenError>,
    },
    /// An internal inconsistency (a bug).
    #[error("internal: {0}")]
    Internal(&'static str),
    /// A path operation the plan numbers is missing (a bug).
    #[error("internal: path operation {0} missing")]
    MissingPathOp(u32),
    /// A counter the plan numbers has no increment (a bug).
    #[error("internal: counter {0} has no increment")]
    NoIncrement(u32),
    /// A counter the placement asked for is not in the code (a bug).
    #[error("counter {0} has no increment in the code")]
    NotEmitted(u32),
    /// The lazy-binding entry at this address is not traced (a bug).
    #[error("internal: the lazy-binding entry {0:#x} is not traced")]
    LazyEntryUntraced(u64),
    /// The call-return edge of a call carries a witness (a bug).
    #[error("internal: the call-return edge of the call at {at:#x} carries witness {witness:?}")]
    CallReturnWitness {
        /// Address of the call.
        at: u64,
        /// The witness it carries.
        witness: Option<u32>,
    },
    /// A PLT jump decided by LAZY is counted, records EXIT or has a witness (a bug).
    #[error(
        "internal: the PLT jump at {at:#x} decided by LAZY has a count ({count}), EXIT ({exit}) \
         or witness ({witness:?})"
    )]
    LazyPltCounted {
        /// Address of the jump.
        at: u64,
        /// Whether it is counted.
        count: bool,
        /// Whether it records EXIT.
        exit: bool,
        /// Its witness.
        witness: Option<u32>,
    },
    /// A value does not fit the 32-bit immediate it goes in.
    #[error("{0} exceeds 32 bits")]
    Exceeds32(&'static str),
    /// A witness number does not fit 16 bits.
    #[error("witness number {0} exceeds 16 bits")]
    WitnessNumber(u32),
    /// A relative jump-table entry cannot reach its case.
    #[error("jump table case out of int32 range")]
    CaseRange,
    /// A jump-table case has no edge in the CFG.
    #[error("jump table case without an edge")]
    CaseWithoutEdge,
    /// The encoder rewrote the copy of the instruction at this address.
    #[error("instruction at {0:#x} was rewritten by the encoder")]
    CopyRewritten(u64),
    /// `xbegin` cannot be relocated (its abort target is relative).
    #[error("transactional memory (xbegin) is not relocated")]
    Xbegin,
    /// A call, tail call or return that must be counted is not a transfer the rewriter counts.
    #[error("the call, tail call or return at {0:#x} is not a transfer the rewriter can count")]
    UncountedTransfer(u64),
    /// A conditional tail call has no witness, so its transfer cannot be counted.
    #[error("conditional tail call at {0:#x} without a witness: its transfer cannot be counted")]
    UnwitnessedTailCall(u64),
    /// An indirect jump with this many successors cannot be relocated.
    #[error("indirect jump at {at:#x} with {successors} successors is not relocatable")]
    IndirectJump {
        /// Address of the jump.
        at: u64,
        /// How many successors it has.
        successors: usize,
    },
    /// A path increment does not fit a displacement (`pathprof`).
    #[error("path increment {0} does not fit a displacement")]
    PathIncrement(i64),
    /// The init code's data does not fit its layout (`counters`, `pathprof`).
    #[error("{0}")]
    InitLayout(&'static str),
}

impl CodegenError {
    /// This error, its message prefixed with procedure `name`.
    fn in_procedure(self, name: &str) -> CodegenError {
        CodegenError::Procedure {
            name: name.to_owned(),
            source: Box::new(self),
        }
    }
}

struct Emitter {
    out: Vec<Instruction>,
    next_label: u64,
    /// label -> index of the instruction carrying it.
    at: HashMap<u64, usize>,
    /// Label to put on the next emitted instruction.
    pending: Option<u64>,
    /// Labels bound while another was pending (nothing was emitted between
    /// them, e.g. an event counter whose increment is 0): label -> the
    /// label its instruction carries. Resolved before encoding.
    alias: HashMap<u64, u64>,
    /// `(index in out of its lead, of the copy, original address)` of
    /// copied instructions ([`ProcCopy::leads`]).
    origin: Vec<(usize, usize, u64)>,
    /// Where the next copied instruction's lead starts: after the last
    /// copy, or at the block's head.
    lead: usize,
    counting: Option<Counting>,
    /// Counters emitted so far (each must be, at least once).
    emitted: std::collections::HashSet<u32>,
    /// The signal point of the instructions pushed next.
    point: SigPoint,
    /// Per instruction in `out`: its signal point, and the original length
    /// of a copied instruction (0 for instrumentation).
    points: Vec<(SigPoint, u8)>,
    /// Original length of the next instruction pushed (a copy).
    copy_len: u8,
    /// Transfer-count increments emitted so far.
    transfers: u32,
    /// `(GOT slot, label of the LAZY piece)` (see [`Copies::lazy_slots`]).
    lazy: Vec<(u64, u64)>,
}

/// The address `insn`'s memory operand names, if it names one
/// (RIP-relative, or an absolute displacement without a base register):
/// the copy retargets such an operand naming a jump table to the
/// rewritten table.
pub(crate) fn named_address(insn: &Instruction) -> Option<u64> {
    let refs = (0..insn.op_count()).any(|k| insn.op_kind(k) == OpKind::Memory);
    if !refs {
        None
    } else if insn.is_ip_rel_memory_operand() {
        Some(insn.ip_rel_memory_address())
    } else if insn.memory_base() == Register::None {
        Some(insn.memory_displacement64())
    } else {
        None
    }
}

fn near_branch(i: &Instruction) -> bool {
    (0..i.op_count()).any(|k| {
        matches!(
            i.op_kind(k),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
        )
    })
}

impl Emitter {
    fn label(&mut self) -> u64 {
        self.next_label += 1;
        self.next_label
    }

    fn bind(&mut self, label: u64) {
        match self.pending {
            Some(p) => {
                self.alias.insert(label, p);
            }
            None => self.pending = Some(label),
        }
    }

    /// Points every branch to an aliased label at the label its
    /// instruction carries (`alias`).
    fn resolve_aliases(&mut self) {
        if self.alias.is_empty() {
            return;
        }
        for insn in &mut self.out {
            if near_branch(insn) {
                if let Some(&p) = self.alias.get(&insn.near_branch_target()) {
                    insn.set_near_branch64(p);
                }
            }
        }
        for (&a, p) in &self.alias {
            if let Some(&i) = self.at.get(p) {
                self.at.insert(a, i);
            }
        }
    }

    fn push(&mut self, mut insn: Instruction) {
        self.points
            .push((self.point, std::mem::take(&mut self.copy_len)));
        match self.pending.take() {
            Some(l) => {
                insn.set_ip(l);
                self.at.insert(l, self.out.len());
            }
            None => insn.set_ip(0),
        }
        self.out.push(insn);
    }

    /// Pushes the copy of the original instruction at `orig`; what is
    /// pushed next, up to the next copy, is the next one's lead.
    fn push_copy(&mut self, insn: Instruction, orig: u64) {
        self.origin.push((self.lead, self.out.len(), orig));
        self.push(insn);
        self.lead = self.out.len();
    }

    /// Appends what `f` emits, its local labels renamed into ours.
    fn seq(
        &mut self,
        f: impl FnOnce(&mut CodeAssembler) -> Result<(), aetrace_runtime::Error>,
    ) -> GenResult<()> {
        let mut a = CodeAssembler::new(64)?;
        f(&mut a)?;
        let base = self.next_label;
        self.next_label += SEQ_LABELS;
        for mut insn in a.take_instructions() {
            let local = insn.ip();
            if near_branch(&insn) && insn.near_branch_target() < SEQ_LABELS {
                insn.set_near_branch64(base + insn.near_branch_target());
            }
            if local != 0 {
                debug_assert!(local < SEQ_LABELS);
                if self.pending.is_some() {
                    // The sequence starts with its own label: carry ours on a nop.
                    self.push(Instruction::with(Code::Nopd));
                }
                self.bind(base + local);
            }
            self.push(insn);
        }
        Ok(())
    }

    fn jmp(&mut self, target: u64) -> GenResult<()> {
        let i = Instruction::with_branch(Code::Jmp_rel32_64, target)?;
        self.push(i);
        Ok(())
    }

    /// The program-wide event counter (counter 0).
    fn count_word(&self) -> GenResult<MemoryOperand> {
        let c = self
            .counting
            .as_ref()
            .ok_or(CodegenError::Internal("a counter outside counting mode"))?;
        Ok(MemoryOperand::with_base_displ_size(
            Register::RIP,
            c.base as i64,
            8,
        ))
    }

    /// Adds `amount` to the event counter (a query increment).
    fn add_to_count(&mut self, amount: i64, site: Site) -> GenResult<()> {
        let c = self
            .counting
            .as_ref()
            .ok_or(CodegenError::Internal("a counter outside counting mode"))?;
        let amount =
            i32::try_from(amount).map_err(|_| CodegenError::Exceeds32("query increment"))?;
        for i in super::counters::increment(c.base, amount, c.atomic, site)? {
            self.push(i);
        }
        Ok(())
    }

    /// `--stop-at` check: jumps to `trap` once `counter + t >= 0`. When the
    /// flags are live they are saved below the red zone first (and restored
    /// on the way on); returns whether they were.
    fn stop_check(&mut self, t: i64, site: Site, trap: u64) -> GenResult<bool> {
        let mem = self.count_word()?;
        let save = site.flags_live;
        if save {
            self.push(rsp_step(-128)?);
            self.push(Instruction::with(Code::Pushfq));
        }
        let neg = i32::try_from(-t).map_err(|_| CodegenError::Exceeds32("stop-at query"))?;
        self.push(Instruction::with2(Code::Cmp_rm64_imm32, mem, neg)?);
        self.push(Instruction::with_branch(Code::Jge_rel32_64, trap)?);
        if save {
            self.push(Instruction::with(Code::Popfq));
            self.push(rsp_step(128)?);
        }
        Ok(save)
    }

    /// `--stop-at`, at an outside entry (r11 and the flags are dead): a
    /// signal handler in counted code would start from the interrupted
    /// block's count, and a second thread's events would go to the same
    /// counter, so the entry of a handler (return address at the C
    /// library's restorer, `mov rax, 15; syscall`) or of a thread other
    /// than the first (`fs:[0]`, glibc's TCB self pointer, is not the one
    /// the preinit stored at [`super::counters::STOP_OWNER`]; a new
    /// thread's first counted code is always an outside entry: its start
    /// routine or a callback) ends the program with a message and status
    /// 125 instead (the counter's top bits set to 101), unless the program
    /// already stopped.
    fn signal_guard(&mut self) -> GenResult<()> {
        let mem = self.count_word()?;
        let (owner, refusing) = {
            let c = self
                .counting
                .as_ref()
                .ok_or(CodegenError::Internal("a counter outside counting mode"))?;
            let word = |off: u64| {
                MemoryOperand::with_base_displ_size(Register::RIP, (c.base + off) as i64, 8)
            };
            (
                word(super::counters::STOP_OWNER),
                word(super::counters::STOP_REFUSED),
            )
        };
        let signal: &[u8] =
            b"aetrace: a signal handler ran in counted code: --stop-at cannot stop exactly\n";
        let thread: &[u8] =
            b"aetrace: a second thread ran counted code: --stop-at cannot stop exactly\n";
        let (check, ok, first) = (self.label(), self.label(), self.label());
        let (second, refused) = (self.label(), self.label());
        let (signal_text, thread_text) = (self.label(), self.label());
        // Stopped: the counter's top bits are 110 (`stop_jump`); before,
        // 111 (negative) or 000.
        self.push(Instruction::with2(Code::Bt_rm64_imm8, mem, 61)?);
        self.push(Instruction::with_branch(Code::Jb_rel32_64, check)?);
        self.push(Instruction::with2(Code::Bt_rm64_imm8, mem, 62)?);
        self.push(Instruction::with_branch(Code::Jb_rel32_64, ok)?);
        self.bind(check);
        // The owner is 0 before the preinit ran (IFUNC resolvers): only
        // the first thread exists then.
        let fs0 = MemoryOperand::new(Register::None, Register::None, 1, 0, 4, false, Register::FS);
        self.push(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::R11,
            owner,
        )?);
        self.push(Instruction::with2(
            Code::Test_rm64_r64,
            Register::R11,
            Register::R11,
        )?);
        self.push(Instruction::with_branch(Code::Je_rel32_64, first)?);
        self.push(Instruction::with2(Code::Cmp_r64_rm64, Register::R11, fs0)?);
        self.push(Instruction::with_branch(Code::Jne_rel32_64, second)?);
        self.bind(first);
        let at_r11 = |d: i64| MemoryOperand::with_base_displ(Register::R11, d);
        // Only the kernel's frame has rdx = rsp + 8 (its ucontext, right
        // above the restorer address): otherwise `[rsp]` need not point
        // anywhere readable (untraced code may enter by a jump).
        self.push(Instruction::with2(
            Code::Lea_r64_m,
            Register::R11,
            rsp_at(8),
        )?);
        self.push(Instruction::with2(
            Code::Cmp_r64_rm64,
            Register::R11,
            Register::RDX,
        )?);
        self.push(Instruction::with_branch(Code::Jne_rel32_64, ok)?);
        self.push(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::R11,
            rsp_at(0),
        )?);
        for (d, bytes) in [(0, 0x0fc0_c748u32), (4, 0x0f00_0000)] {
            self.push(Instruction::with2(Code::Cmp_rm32_imm32, at_r11(d), bytes)?);
            self.push(Instruction::with_branch(Code::Jne_rel32_64, ok)?);
        }
        // Refused: the program ends here, so any register may go.
        let mov = |r: Register, v: u32| Instruction::with2(Code::Mov_r32_imm32, r, v);
        let lea_rsi = |at: u64| {
            Instruction::with2(
                Code::Lea_r64_m,
                Register::RSI,
                MemoryOperand::with_base_displ(Register::RIP, at as i64),
            )
        };
        self.push(lea_rsi(signal_text)?);
        self.push(mov(Register::EDX, signal.len() as u32)?);
        self.push(Instruction::with_branch(Code::Jmp_rel32_64, refused)?);
        self.bind(second);
        self.push(lea_rsi(thread_text)?);
        self.push(mov(Register::EDX, thread.len() as u32)?);
        self.bind(refused);
        // One message: a thread refusing after another waits for that
        // one's exit_group (exiting itself could cut the message short).
        let (wait, mine) = (self.label(), self.label());
        let mut bts = Instruction::with2(Code::Bts_rm64_imm8, refusing, 0)?;
        bts.set_has_lock_prefix(true);
        self.push(bts);
        self.push(Instruction::with_branch(Code::Jae_rel32_64, mine)?);
        self.bind(wait);
        self.push(mov(Register::EAX, 34)?); // pause()
        self.push(Instruction::with(Code::Syscall));
        self.push(Instruction::with_branch(Code::Jmp_rel32_64, wait)?);
        self.bind(mine);
        // The counter's top bits become 101: aetrace knows why it ended.
        for (code, bit) in [
            (Code::Bts_rm64_imm8, 63),
            (Code::Btr_rm64_imm8, 62),
            (Code::Bts_rm64_imm8, 61),
        ] {
            self.push(Instruction::with2(code, mem, bit)?);
        }
        self.push(mov(Register::EAX, 1)?);
        self.push(mov(Register::EDI, 2)?);
        self.push(Instruction::with(Code::Syscall));
        self.push(mov(Register::EAX, 231)?);
        self.push(mov(Register::EDI, 125)?);
        self.push(Instruction::with(Code::Syscall));
        for (label, text) in [(signal_text, signal), (thread_text, thread)] {
            self.bind(label);
            for chunk in text.chunks(16) {
                self.push(Instruction::with_declare_byte(chunk)?);
            }
        }
        self.bind(ok);
        self.push(Instruction::with(Code::Nopd));
        Ok(())
    }

    /// The end of every [`StopTrap`]: disables the checks and jumps to
    /// original address `orig` with the trap flag set. With `flags_saved`,
    /// the flags to stop with are at `[rsp]`, 136 bytes below the
    /// program's stack pointer; else the current ones are.
    fn stop_jump(&mut self, orig: u64, flags_saved: bool) -> GenResult<()> {
        let mem = self.count_word()?;
        if !flags_saved {
            self.push(rsp_step(-128)?);
            self.push(Instruction::with(Code::Pushfq));
        }
        let rsp = |d: i64| MemoryOperand::with_base_displ(Register::RSP, d);
        // [original - 144] = flags | TF, [original - 136] = the target.
        self.push(rsp_step(-8)?);
        self.push(Instruction::with1(Code::Push_r64, Register::RAX)?);
        self.push(Instruction::with2(
            Code::Mov_r64_rm64,
            Register::RAX,
            rsp(16),
        )?);
        self.push(Instruction::with2(Code::Bts_rm64_imm8, Register::RAX, 8)?);
        self.push(Instruction::with2(
            Code::Mov_rm64_r64,
            rsp(8),
            Register::RAX,
        )?);
        self.push(Instruction::with2(
            Code::Lea_r64_m,
            Register::RAX,
            MemoryOperand::with_base_displ(Register::RIP, orig as i64),
        )?);
        self.push(Instruction::with2(
            Code::Mov_rm64_r64,
            rsp(16),
            Register::RAX,
        )?);
        // No check holds again: the counter's top bits become 110, which
        // puts it in [-2^62, -2^61), 2^61 events away from 0 and from
        // wrapping around either way (`profile::count_command`).
        for (code, bit) in [
            (Code::Bts_rm64_imm8, 63),
            (Code::Bts_rm64_imm8, 62),
            (Code::Btr_rm64_imm8, 61),
        ] {
            self.push(Instruction::with2(code, mem, bit)?);
        }
        self.push(Instruction::with1(Code::Pop_r64, Register::RAX)?);
        // TF set by popfq traps after the next instruction, the return: at
        // `orig`, before it runs, with rsp back to the program's.
        self.push(Instruction::with(Code::Popfq));
        self.push(Instruction::with1(Code::Retnq_imm16, 128u32)?);
        Ok(())
    }

    fn counter(&mut self, n: u32, site: Site) -> GenResult<()> {
        let c = self
            .counting
            .as_ref()
            .ok_or(CodegenError::Internal("a counter outside counting mode"))?;
        self.emitted.insert(n);
        if let Some(pc) = &c.paths {
            let ops = pc
                .ops
                .get(n as usize)
                .ok_or(CodegenError::MissingPathOp(n))?;
            for i in super::pathprof::emit(ops, &pc.state, site)? {
                self.push(i);
            }
            return Ok(());
        }
        let (addr, amount) = match c.amounts.get(n as usize) {
            None if c.amounts.is_empty() => (c.base + 8 * u64::from(n), 1),
            None => return Err(CodegenError::NoIncrement(n)),
            Some(0) => {
                // No code, but a label waiting for this increment (the
                // invocation label) must still land here.
                if self.pending.is_some() {
                    self.push(Instruction::with(Code::Nopd));
                }
                return Ok(());
            }
            Some(&a) => (c.base, a),
        };
        for i in super::counters::increment(addr, amount, c.atomic, site)? {
            self.push(i);
        }
        Ok(())
    }

    /// [`Emitter::seq`] for a sequence that writes one witness or record:
    /// its instructions up to and including the reserving `xadd` stand at
    /// `before`, the rest (and what follows) at `after`.
    fn seq_write(
        &mut self,
        before: SigPoint,
        after: SigPoint,
        f: impl FnOnce(&mut CodeAssembler) -> Result<(), aetrace_runtime::Error>,
    ) -> GenResult<()> {
        self.point = before;
        let first = self.out.len();
        self.seq(f)?;
        let xadd = (first..self.out.len())
            .rev()
            .find(|&i| {
                let i = &self.out[i];
                i.mnemonic() == Mnemonic::Xadd && i.segment_prefix() == Register::GS
            })
            .ok_or(CodegenError::Internal(
                "a write sequence without its reserving xadd",
            ))?;
        for p in &mut self.points[xadd + 1..] {
            p.0 = after;
        }
        self.point = after;
        Ok(())
    }

    /// The transfer count's increment, at the current point (tracing only:
    /// counting mode writes no SIGNAL that would need it).
    fn transfer(&mut self, site: Site) -> GenResult<()> {
        if self.counting.is_some() {
            return Ok(());
        }
        self.transfers += 1;
        self.seq(|a| emit_transfer(a, site))
    }

    /// A VALUE record (`--data --check`), at the current point: the
    /// instruction it stands before has not run.
    fn value(&mut self, value: Value, site: Site) -> GenResult<()> {
        let at = self.point;
        self.seq_write(at, at, |a| emit_value(a, value, site))
    }

    /// Witness `n`, standing at `before` until it is reserved; in counting
    /// mode counter `n`.
    fn witness(&mut self, n: u32, site: Site, before: SigPoint, after: SigPoint) -> GenResult<()> {
        if self.counting.is_some() {
            return self.counter(n, site);
        }
        if n < 254 {
            self.seq_write(before, after, |a| emit_witness(a, n as u8 + 1, site))
        } else {
            let n = u16::try_from(n).map_err(|_| CodegenError::WitnessNumber(n))?;
            self.seq_write(before, after, |a| {
                emit_record(a, RecordKind::Wide, Payload::Imm16(n), site)
            })
        }
    }
}

/// The site of instrumentation in a PLT stub: r11 is free there (SysV: the
/// linker's scratch register), the flags are dead.
fn plt_site() -> Site {
    Site {
        scratch: Some(r11),
        flags_live: false,
        red_zone_live: true,
        flags_save: aetrace_runtime::FlagsSave::Lahf,
    }
}

/// The site of a jump to another function's entry: the flags are dead
/// there (SysV: no function receives them), whatever the procedure's
/// conservative liveness keeps live at a tail call.
fn entry_site(s: Site) -> Site {
    Site {
        flags_live: false,
        ..s
    }
}

/// `mov rax, OP` for the operand of `jmp OP` (`jmp r64` or `jmp [m64]`),
/// read with `rsp` lowered by `down` bytes (rax itself still holds the
/// program's value).
fn target_into_rax(jmp: &Instruction, down: i64) -> GenResult<Instruction> {
    let rax = Register::RAX;
    let insn = match jmp.op0_kind() {
        OpKind::Register if jmp.op0_register() == Register::RSP => {
            Instruction::with2(Code::Lea_r64_m, rax, rsp_at(down))?
        }
        OpKind::Register => Instruction::with2(Code::Mov_r64_rm64, rax, jmp.op0_register())?,
        OpKind::Memory => {
            let base = jmp.memory_base();
            let mut displ = jmp.memory_displacement64() as i64;
            if base == Register::RSP {
                displ += down;
            }
            let size = match base {
                Register::RIP => 8,
                _ if displ == 0 && !matches!(base, Register::RBP | Register::R13) => 0,
                _ if i8::try_from(displ).is_ok() => 1,
                // iced's size of a 64-bit mode disp32.
                _ => 8,
            };
            let mem = MemoryOperand::new(
                base,
                jmp.memory_index(),
                jmp.memory_index_scale(),
                displ,
                size,
                false,
                jmp.segment_prefix(),
            );
            Instruction::with2(Code::Mov_r64_rm64, rax, mem)?
        }
        _ => {
            return Err(CodegenError::Internal(
                "an unresolved jump without an operand",
            ))
        }
    };
    Ok(insn)
}

/// `[rsp + d]`.
fn rsp_at(d: i64) -> MemoryOperand {
    MemoryOperand::with_base_displ(Register::RSP, d)
}

/// `lea rsp, [rsp + d]`: moves the stack pointer without touching the flags.
pub(super) fn rsp_step(d: i64) -> GenResult<Instruction> {
    Instruction::with2(
        Code::Lea_r64_m,
        Register::RSP,
        MemoryOperand::with_base_displ(Register::RSP, d),
    )
    .map_err(CodegenError::from)
}

/// The signal map of instructions `first..end` of `points` laid out at
/// `offsets` (`u32::MAX`: rewritten by the encoder), the copy starting at
/// offset `base` and ending at `stop`: consecutive instructions at the same
/// point merge, and copies as long as their originals merge into runs;
/// a range starts at each of `leads` (ascending indices: where a handler's
/// return to an instruction enters, which regen tells by a range start).
fn sig_ranges(
    points: &[(SigPoint, u8)],
    offsets: &[u32],
    (first, end): (usize, usize),
    (base, stop): (u32, u32),
    leads: &[usize],
) -> GenResult<Vec<SigRange>> {
    let mut ranges: Vec<SigRange> = Vec::new();
    // The last range is a run of copies whose last one is as long as its
    // original (so the run can go on: offsets inside a run come from the
    // original lengths).
    let mut open = false;
    let mut i = first;
    while i < end {
        let off = offsets[i];
        // An instruction the encoder rewrote has no offset of its own: it
        // belongs to the range before, which must stand at the same point.
        let mut j = i + 1;
        while j < end && offsets[j] == u32::MAX {
            if points[j].0 != points[i].0 {
                return Err(CodegenError::Internal(
                    "a rewritten instruction changes the signal point",
                ));
            }
            j += 1;
        }
        let next = if j < end { offsets[j] } else { stop };
        if off == u32::MAX || next < off {
            return Err(CodegenError::Internal("instruction offsets out of order"));
        }
        let (point, orig_len) = points[i];
        let lead = leads.binary_search(&i).is_ok();
        let copy = j == i + 1 && orig_len > 0;
        let same_len = copy && u32::from(orig_len) == next - off;
        let offset = u64::from(off - base);
        i = j;
        if let SigPoint::Insn {
            proc, block, insn, ..
        } = point
        {
            if copy {
                if let Some(SigRange {
                    point:
                        SigPoint::Insn {
                            proc: p,
                            block: b,
                            insn: k,
                            count: n,
                        },
                    ..
                }) = ranges.last_mut()
                {
                    if open && *p == proc && *b == block && *k + *n == insn {
                        *n += 1;
                        open = same_len;
                        continue;
                    }
                }
                ranges.push(SigRange {
                    offset,
                    point: SigPoint::Insn {
                        proc,
                        block,
                        insn,
                        count: 1,
                    },
                });
                open = same_len;
                continue;
            }
        }
        open = false;
        if !lead && ranges.last().is_some_and(|r| r.point == point) {
            continue;
        }
        ranges.push(SigRange { offset, point });
    }
    Ok(ranges)
}

/// Generates the copies of `plans`, their code starting at `rip`.
/// `bodies` maps the original start of every traced procedure to the label
/// of its body (direct calls skip the outside-entry stub). `counting`
/// selects counting mode.
pub fn generate(
    plans: &[ProcPlan<'_>],
    rt: &RuntimeAddrs,
    rip: u64,
    counting: Option<Counting>,
) -> GenResult<Copies> {
    let mut em = Emitter {
        out: Vec::new(),
        next_label: LABEL_BASE,
        at: HashMap::new(),
        pending: None,
        alias: HashMap::new(),
        origin: Vec::new(),
        lead: 0,
        counting,
        emitted: Default::default(),
        point: SigPoint::Outside,
        points: Vec::new(),
        copy_len: 0,
        transfers: 0,
        lazy: Vec::new(),
    };
    let mut bodies: HashMap<u64, u64> = HashMap::new();
    // Original start -> (procedure number, entry block) of every traced procedure.
    let mut entries: HashMap<u64, (u32, u32)> = HashMap::new();
    let mut block_labels: Vec<Vec<u64>> = Vec::with_capacity(plans.len());
    let mut stub_labels: Vec<StubLabels> = Vec::with_capacity(plans.len());
    let mut invoke_labels = Vec::with_capacity(plans.len());
    for p in plans {
        let labels: Vec<u64> = (0..p.cfg.blocks.len()).map(|_| em.label()).collect();
        // Counting the invocations: calls enter before the entry block,
        // loops back to it do not.
        let invoke = p
            .counters
            .as_ref()
            .filter(|c| c.entry.is_some() || c.stop.as_ref().is_some_and(|s| s.entry.is_some()))
            .map(|_| em.label());
        bodies.insert(p.start, invoke.unwrap_or(labels[p.cfg.entry.index()]));
        invoke_labels.push(invoke);
        entries.insert(p.start, (p.number, p.cfg.entry.index() as u32));
        block_labels.push(labels);
        stub_labels.push(StubLabels {
            outside: em.label(),
            entry_points: p.entry_points.iter().map(|_| em.label()).collect(),
            direct: (!p.direct_entries.is_empty()).then(|| em.label()),
        });
    }
    // Table entries: (table index in plan, entry index) -> label.
    let mut entries_of: Vec<TableLabels> = Vec::with_capacity(plans.len());
    // Per plan: out-index range, origin range, landing stub labels.
    let mut spans = Vec::with_capacity(plans.len());
    for (k, p) in plans.iter().enumerate() {
        let (first, first_origin) = (em.out.len(), em.origin.len());
        let landing: Vec<(u64, u64)> = p
            .landing_pads
            .iter()
            .map(|&b| (p.cfg.blocks[b].start, em.label()))
            .collect();
        let checked = (0..p.cfg.blocks.len()).map(|_| em.label()).collect();
        let entries = ProcGen {
            em: &mut em,
            p,
            labels: &block_labels[k],
            checked,
            bodies: &bodies,
            entries: &entries,
            rt,
            traps: Vec::new(),
        }
        .emit(&stub_labels[k], invoke_labels[k], &landing)
        .map_err(|e| e.in_procedure(p.name))?;
        entries_of.push(entries);
        if em.counting.is_some() {
            // Exactness: every counter the placement asked for is in the code.
            let c = p.counters.clone().unwrap_or_default();
            let wanted = p
                .witness
                .iter()
                .chain(&c.blocks)
                .chain(&c.landing)
                .chain(&c.resume)
                .chain(&c.before_call)
                .chain(std::iter::once(&c.entry));
            if let Some(n) = wanted.flatten().find(|n| !em.emitted.contains(n)) {
                return Err(CodegenError::NotEmitted(*n).in_procedure(p.name));
            }
        }
        spans.push((first, em.out.len(), first_origin, em.origin.len(), landing));
    }
    em.resolve_aliases();
    let block = InstructionBlock::new(&em.out, rip);
    let res = BlockEncoder::encode(
        64,
        block,
        BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
    )
    .map_err(CodegenError::Encode)?;
    let addr = |label: u64| -> GenResult<u64> {
        let i = *em
            .at
            .get(&label)
            .ok_or(CodegenError::Internal("unbound label"))?;
        match res.new_instruction_offsets[i] {
            u32::MAX => Err(CodegenError::Internal(
                "a labelled instruction was rewritten",
            )),
            off => Ok(rip + u64::from(off)),
        }
    };
    let at_index = |i: usize| -> u64 {
        res.new_instruction_offsets
            .get(i)
            .map_or(rip + res.code_buffer.len() as u64, |&o| rip + u64::from(o))
    };
    let mut springboards = Vec::with_capacity(plans.len());
    let mut retargets = Vec::new();
    let mut tables = Vec::new();
    let mut procs = Vec::with_capacity(plans.len());
    for (k, p) in plans.iter().enumerate() {
        let labels = &stub_labels[k];
        if p.springboard {
            springboards.push((p.start, addr(labels.outside)?));
        }
        for (&(at, _), &l) in p.entry_points.iter().zip(&labels.entry_points) {
            springboards.push((at, addr(l)?));
        }
        if let Some(l) = labels.direct {
            let stub = addr(l)?;
            retargets.extend(p.direct_entries.iter().map(|&site| (site, stub)));
        }
        let (first, end, o0, o1, landing) = &spans[k];
        let (mut insn_map, mut leads) = (Vec::with_capacity(o1 - o0), Vec::with_capacity(o1 - o0));
        for &(lead, i, old) in &em.origin[*o0..*o1] {
            let at = |i: usize| match res.new_instruction_offsets[i] {
                u32::MAX => Err(CodegenError::CopyRewritten(old).in_procedure(p.name)),
                off => Ok(rip + u64::from(off)),
            };
            insn_map.push((old, at(i)?));
            leads.push(at(lead)?);
        }
        let (new_start, new_end) = (at_index(*first), at_index(*end));
        let lead_at: Vec<usize> = em.origin[*o0..*o1].iter().map(|o| o.0).collect();
        let sigmap = sig_ranges(
            &em.points,
            &res.new_instruction_offsets,
            (*first, *end),
            ((new_start - rip) as u32, (new_end - rip) as u32),
            &lead_at,
        )
        .map_err(|e| e.in_procedure(p.name))?;
        procs.push(ProcCopy {
            start: p.start,
            new_start,
            new_end,
            sigmap,
            insn_map,
            leads,
            landing: landing
                .iter()
                .map(|&(old, l)| Ok((old, addr(l)?)))
                .collect::<GenResult<_>>()?,
        });
        let labels = &entries_of[k];
        for (t, entries) in p.tables.iter().zip(&labels.tables) {
            let mut bytes = Vec::with_capacity(t.size() as usize);
            for &l in entries {
                let target = addr(l)?;
                if t.rel32 {
                    let d = i32::try_from(target as i64 - t.new as i64)
                        .map_err(|_| CodegenError::CaseRange)?;
                    bytes.extend_from_slice(&d.to_le_bytes());
                } else {
                    bytes.extend_from_slice(&target.to_le_bytes());
                }
            }
            tables.push((t.new, bytes));
        }
        if let (Some(m), Some(entries)) = (p.map, &labels.map) {
            tables.push((m.new, relative_entries(m.new, entries, &addr)?));
        }
        let chunks = p.dispatches.iter().flat_map(|d| &d.chunks);
        for (c, entries) in chunks.zip(&labels.chunks) {
            tables.push((c.new, relative_entries(c.new, entries, &addr)?));
        }
    }
    let lazy_slots = em
        .lazy
        .iter()
        .map(|&(slot, l)| Ok((slot, addr(l)?)))
        .collect::<GenResult<_>>()?;
    Ok(Copies {
        bytes: res.code_buffer,
        springboards,
        tables,
        procs,
        lazy_slots,
        retargets,
    })
}

/// The labels of one copy's stubs for untraced code: its outside-entry
/// stub, its secondary entry points' and its preserving stub
/// ([`ProcPlan::direct_entries`]).
struct StubLabels {
    outside: u64,
    entry_points: Vec<u64>,
    direct: Option<u64>,
}

/// The int32 entries of a map or dispatch table at `new`: each label
/// relative to the table, 0 for none.
fn relative_entries(
    new: u64,
    entries: &[Option<u64>],
    addr: &impl Fn(u64) -> GenResult<u64>,
) -> GenResult<Vec<u8>> {
    let mut bytes = Vec::with_capacity(4 * entries.len());
    for l in entries {
        let d = match *l {
            Some(l) => {
                i32::try_from(addr(l)? as i64 - new as i64).map_err(|_| CodegenError::CaseRange)?
            }
            None => 0,
        };
        bytes.extend_from_slice(&d.to_le_bytes());
    }
    Ok(bytes)
}

/// The labels a procedure's copy puts in its tables.
struct TableLabels {
    /// Per jump table, per entry.
    tables: Vec<Vec<u64>>,
    /// The unresolved jumps' map.
    map: Option<MapLabels>,
    /// Per chunk of each dispatch, in plan order.
    chunks: Vec<MapLabels>,
}

struct ProcGen<'e, 'p> {
    em: &'e mut Emitter,
    /// `--stop-at` traps, emitted after the stubs.
    traps: Vec<StopTrap>,
    p: &'p ProcPlan<'p>,
    labels: &'p [u64],
    /// Per block, the label after a loop header's buffer check (bound only
    /// there, `block_head`).
    checked: Vec<u64>,
    bodies: &'p HashMap<u64, u64>,
    entries: &'p HashMap<u64, (u32, u32)>,
    rt: &'p RuntimeAddrs,
}

/// A block's last instruction and what stands around it.
struct BlockEnd {
    b: BlockId,
    /// The block laid out after it.
    next: Option<BlockId>,
    last_i: usize,
    last: Instruction,
    edges: Vec<EdgeId>,
    /// The point before the last instruction.
    before: SigPoint,
    /// The site before the last instruction.
    before_last: Site,
    cp: CallPlan,
}

/// A stub emitted after the procedure's blocks.
struct Stub {
    label: u64,
    /// The edge whose witness the stub writes, and where control stands
    /// once it is written.
    edge: EdgeId,
    after: SigPoint,
    witness: Option<u32>,
    site: Site,
    /// A counted tail call (a `jcc` to another function): the transfer
    /// count's increment first, standing on the edge before its witness.
    count: bool,
    exit_record: bool,
    /// LAZY(this procedure) instead of a witness (a PLT stub's lazy piece).
    lazy: bool,
    /// An exec request after LAZY (the stub of an exec function).
    exec: Option<aetrace_runtime::layout::ExecKind>,
    /// `shell_call` after LAZY, and the GOT slot it binds (the stub of
    /// `system`).
    shell: Option<(aetrace_runtime::layout::ShellCall, u64)>,
    target: u64,
}

impl ProcGen<'_, '_> {
    /// The label after the buffer check of the loop header a stub jumps
    /// to, when the stub is only a one-byte witness: it then checks the
    /// buffer itself, with the address its witness reserved.
    fn fused_check(&self, s: &Stub) -> Option<u64> {
        let to = self.p.cfg.edges[s.edge].to;
        let plain = s.witness.is_some_and(|w| w < 254) && !(s.count || s.lazy || s.exit_record);
        (plain
            && self.em.counting.is_none()
            && to != self.p.cfg.exit()
            && self.p.loop_header[to.index()]
            && s.target == self.labels[to.index()])
        .then(|| self.checked[to.index()])
    }

    fn site(&self, live: crate::liveness::RegSet) -> Site {
        self.p.live.site(live)
    }

    /// Before instruction `k` of block `b`.
    fn at(&self, b: BlockId, k: usize) -> SigPoint {
        SigPoint::Insn {
            proc: self.p.number,
            block: b.index() as u32,
            insn: k as u32,
            count: 0,
        }
    }

    /// Where control stands once it has taken edge `e` (its witness
    /// written): the target block, or for an edge to EXIT that jumps to
    /// original address `orig`, that traced procedure's entry, else
    /// untraced code.
    fn after_edge(&self, e: EdgeId, orig: u64) -> SigPoint {
        let to = self.p.cfg.edges[e].to;
        if to != self.p.cfg.exit() {
            return self.at(to, 0);
        }
        match self.entries.get(&orig) {
            Some(&(proc, block)) => SigPoint::Insn {
                proc,
                block,
                insn: 0,
                count: 0,
            },
            None => SigPoint::Outside,
        }
    }

    /// Copies instruction `k` of block `b`.
    fn copy_at(&mut self, b: BlockId, k: usize, insn: Instruction) {
        self.place_copy(b, k, self.relocated(insn));
    }

    /// Places `copy` (relocated or not) as instruction `k` of block `b`.
    fn place_copy(&mut self, b: BlockId, k: usize, copy: Instruction) {
        self.em.point = self.at(b, k);
        self.em.copy_len = copy.len() as u8;
        self.em.push_copy(copy, copy.ip());
    }

    /// Where a branch to original address `t` goes in the copy.
    fn retarget(&self, t: u64) -> u64 {
        if let Some(b) = self.p.cfg.block_at(t) {
            return self.labels[b.index()];
        }
        self.bodies.get(&t).copied().unwrap_or(t)
    }

    /// The code of one [`StopTrap`].
    fn stop_trap(&mut self, t: &StopTrap) -> GenResult<()> {
        let mem = self.em.count_word()?;
        let insns = &self.p.insns[t.block.index()];
        self.em.point = t.point;
        self.em.bind(t.label);
        let Some(phi) = t.phi else {
            return self.em.stop_jump(insns[0].ip(), t.flags_saved);
        };
        if t.flags_saved {
            self.em.push(Instruction::with(Code::Popfq));
            self.em.push(rsp_step(128)?);
        }
        // The program's state at the block's entry: run its instructions
        // up to the one holding event N.
        let mut found = Vec::new();
        for (k, &insn) in insns.iter().enumerate() {
            if k + 1 == insns.len() {
                self.em.stop_jump(insn.ip(), false)?;
                break;
            }
            // Runs once: keep even dead flags, for the debugger's eyes.
            self.em.push(rsp_step(-128)?);
            self.em.push(Instruction::with(Code::Pushfq));
            let l = self.em.label();
            let value = i32::try_from(-(phi + k as i64 + 1))
                .map_err(|_| CodegenError::Exceeds32("stop-at query"))?;
            self.em
                .push(Instruction::with2(Code::Cmp_rm64_imm32, mem, value)?);
            self.em
                .push(Instruction::with_branch(Code::Je_rel32_64, l)?);
            self.em.push(Instruction::with(Code::Popfq));
            self.em.push(rsp_step(128)?);
            let copy = self.relocated(insn);
            self.em.push(copy);
            found.push((l, insn.ip()));
        }
        for (l, orig) in found {
            self.em.bind(l);
            self.em.stop_jump(orig, true)?;
        }
        Ok(())
    }

    /// `insn` with a direct branch retargeted and references to rewritten
    /// tables redirected.
    fn relocated(&self, mut insn: Instruction) -> Instruction {
        if near_branch(&insn) {
            let t = insn.near_branch_target();
            // A call (recursion included) enters the callee's body, which
            // in counting mode counts the invocation first.
            let t = match self.bodies.get(&t) {
                Some(&body) if insn.flow_control() == FlowControl::Call => body,
                _ => self.retarget(t),
            };
            insn.set_near_branch64(t);
        }
        let named = named_address(&insn);
        if let Some(t) = self.p.tables.iter().find(|t| named == Some(t.old)) {
            insn.set_memory_displacement64(t.new);
        }
        insn
    }

    fn edges_from(&self, b: BlockId) -> Vec<EdgeId> {
        self.p
            .cfg
            .edges
            .iter()
            .filter(|(_, e)| e.from == b)
            .map(|(id, _)| id)
            .collect()
    }

    fn emit(
        mut self,
        outside: &StubLabels,
        invoke_label: Option<u64>,
        landing: &[(u64, u64)],
    ) -> GenResult<TableLabels> {
        let p = self.p;
        let cfg = p.cfg;
        let order: Vec<BlockId> = cfg.blocks.keys().collect();
        // Outside-entry stub: untraced code until its ENTER is reserved.
        self.em.bind(outside.outside);
        let entered = self.at(cfg.entry, 0);
        match p.stub {
            _ if self.em.counting.is_some() => {
                self.em.push(Instruction::with(Code::Nopd));
                if p.stop().is_some() && p.stub == EntryStub::Full {
                    self.em.signal_guard()?;
                }
                let paths = self.em.counting.as_ref().and_then(|c| c.paths.as_ref());
                if let Some(st) = paths.map(|pc| pc.state).filter(|st| st.threads) {
                    // A thread's first traced code is an outside entry.
                    let owned = self.em.label();
                    for i in super::pathprof::emit_owner_check(&st, owned)? {
                        self.em.push(i);
                    }
                    self.em.bind(owned);
                    self.em.push(Instruction::with(Code::Nopd));
                }
                if let Some(l) = invoke_label {
                    self.em.bind(l);
                    // Not r11 by the ABI: with gcc's -fipa-ra a local
                    // caller keeps values in caller-saved registers this
                    // procedure never writes (r11 across libbz2's
                    // `add_pair_to_block`); liveness knows which.
                    let site = self.site(p.live.live_in(cfg.entry));
                    if let Some(n) = p.counters.as_ref().and_then(|c| c.entry) {
                        self.em.counter(n, site)?;
                    }
                    if let Some(t) = p.stop().and_then(|s| s.entry) {
                        let trap = self.em.label();
                        let flags_saved = self.em.stop_check(t, site, trap)?;
                        self.traps.push(StopTrap {
                            label: trap,
                            flags_saved,
                            block: cfg.entry,
                            phi: None,
                            point: entered,
                        });
                    }
                }
            }
            EntryStub::Full => {
                let (n, rt) = (p.number, *self.rt);
                // r11 when nothing is free: then only entries under the
                // SysV ABI reach the stub, the module's untraced direct
                // callers go to the preserving one
                // (`Traced::retarget_direct_entries`).
                let scratch = p.live.entry_scratch(cfg.entry).unwrap_or(r11);
                self.em.seq_write(SigPoint::Outside, entered, |a| {
                    emit_outside_entry_with(a, n, &rt, scratch)
                })?
            }
            EntryStub::ProcessEntry => {
                let (n, flush) = (p.number, self.rt.flush);
                let site = Site {
                    scratch: Some(r11),
                    flags_live: false,
                    red_zone_live: false,
                    flags_save: aetrace_runtime::FlagsSave::Lahf,
                };
                self.em.seq_write(SigPoint::Outside, entered, |a| {
                    emit_buffer_check(a, flush, site)?;
                    emit_record(a, RecordKind::Enter, Payload::Imm32(n), site)
                })?
            }
            EntryStub::StaticEntry => {
                let (n, rt) = (p.number, *self.rt);
                self.em.seq(|a| emit_static_entry(a, n, &rt))?
            }
        }
        self.entry_rsp()?;
        if order.first() != Some(&cfg.entry) {
            self.em.jmp(self.labels[cfg.entry.index()])?;
        }

        let mut stubs: Vec<Stub> = Vec::new();
        let mut case_labels: HashMap<EdgeId, u64> = HashMap::new();
        for (pos, &b) in order.iter().enumerate() {
            let next = order.get(pos + 1).copied();
            self.block(b, next, &mut stubs, &mut case_labels)?;
        }
        for s in stubs {
            self.em.bind(s.label);
            let after = s.after;
            self.em.point = SigPoint::Witness {
                edge: s.edge.index() as u32,
            };
            if s.count {
                self.em.transfer(entry_site(s.site))?;
            }
            if let (Some(checked), Some(w)) = (self.fused_check(&s), s.witness) {
                let (before, flush) = (self.em.point, self.rt.flush);
                self.em.seq_write(before, after, |a| {
                    emit_witness_checked(a, w as u8 + 1, flush, s.site, checked)
                })?;
                continue;
            }
            if let Some(w) = s.witness {
                let before = self.em.point;
                self.em.witness(w, s.site, before, after)?;
            }
            if s.lazy {
                let (before, n) = (self.em.point, p.number);
                self.em.seq_write(before, after, |a| {
                    emit_record(a, RecordKind::Lazy, Payload::Imm32(n), s.site)
                })?;
            }
            if let Some(kind) = s.exec {
                self.exec_request_entered(kind)?;
            }
            if let Some((kind, got)) = s.shell {
                self.shell_call_entered(kind, Some(got))?;
            }
            if s.exit_record {
                self.exit_record(s.site)?;
            }
            self.em.jmp(s.target)?;
        }
        for t in std::mem::take(&mut self.traps) {
            self.stop_trap(&t)?;
        }
        for (&b, &(_, label)) in p.landing_pads.iter().zip(landing) {
            // The unwinder (untraced) runs until LANDING is reserved.
            self.em.bind(label);
            if self.em.counting.is_none() {
                self.em.point = SigPoint::Outside;
                let site = self.site(p.live.live_in(b));
                self.check(site)?;
                let n = p.number;
                let after = self.at(b, 0);
                self.em.seq_write(SigPoint::Outside, after, |a| {
                    emit_record(a, RecordKind::Landing, Payload::Imm32(n), site)
                })?;
            } else if self
                .em
                .counting
                .as_ref()
                .and_then(|c| c.paths.as_ref())
                .is_some_and(|pc| pc.fatal_pads)
            {
                self.fatal(format!(
                    "aetrace: the unwinder entered {}'s landing pad at {:#x}: path profiles \
                     cannot follow the frames an unwind abandons\n",
                    p.name, cfg.blocks[b].start
                ))?;
            } else if let Some(n) = p
                .counters
                .as_ref()
                .and_then(|c| c.landing.get(b.index()).copied().flatten())
            {
                let site = self.site(p.live.live_in(b));
                self.em.counter(n, site)?;
            }
            self.em.jmp(self.labels[b.index()])?;
        }
        self.entry_point_stubs(&outside.entry_points)?;
        if let Some(l) = outside.direct {
            self.direct_entry_stub(l)?;
        }
        let map = p.map.map(|m| self.map_entries(m));
        let tables = p
            .tables
            .iter()
            .map(|t| {
                let case = |&to: &BlockId| self.case_label(t.block, to, &case_labels);
                t.targets.iter().map(case).collect()
            })
            .collect::<GenResult<_>>()?;
        let mut chunks = Vec::new();
        for d in &p.dispatches {
            for c in &d.chunks {
                let case = |to: &Option<BlockId>| {
                    to.map(|to| self.case_label(d.block, to, &case_labels))
                        .transpose()
                };
                chunks.push(c.cases.iter().map(case).collect::<GenResult<_>>()?);
            }
        }
        Ok(TableLabels {
            tables,
            map,
            chunks,
        })
    }

    /// Where a table's or dispatch's case `to` of the jump ending block
    /// `b` goes: a case with a witness (or to EXIT) through its stub.
    fn case_label(
        &self,
        b: BlockId,
        to: BlockId,
        case_labels: &HashMap<EdgeId, u64>,
    ) -> GenResult<u64> {
        let e = self
            .p
            .cfg
            .edges
            .iter()
            .find(|(_, e)| e.from == b && e.to == to)
            .map(|(id, _)| id)
            .ok_or(CodegenError::CaseWithoutEdge)?;
        Ok(case_labels
            .get(&e)
            .copied()
            .unwrap_or_else(|| self.labels[to.index()]))
    }

    /// The outside-entry stubs of the secondary entry points, at
    /// `labels`: untraced code until ENTER_AT is reserved, then the
    /// block. The scratch register is free at the entry point
    /// (`traced::entry_points_unfit` makes sure one is).
    fn entry_point_stubs(&mut self, labels: &[u64]) -> GenResult<()> {
        let p = self.p;
        for (&(at, b), &label) in p.entry_points.iter().zip(labels) {
            self.em.bind(label);
            self.em.point = SigPoint::Outside;
            let (n, rt) = (p.number, *self.rt);
            let scratch = p.live.entry_scratch(b).unwrap_or(r11);
            let entry = u32::try_from(at)
                .map_err(|_| CodegenError::Internal("an entry point above 4 GiB"))?;
            let after = self.at(b, 0);
            self.em.seq_write(SigPoint::Outside, after, |a| {
                emit_outside_entry_at(a, n, entry, &rt, scratch)
            })?;
            self.em.jmp(self.labels[b.index()])?;
        }
        Ok(())
    }

    /// The preserving stub at `label` ([`ProcPlan::direct_entries`]):
    /// untraced code until its ENTER is reserved, then the entry block.
    fn direct_entry_stub(&mut self, label: u64) -> GenResult<()> {
        let p = self.p;
        self.em.bind(label);
        self.em.point = SigPoint::Outside;
        let (n, rt) = (p.number, *self.rt);
        let entered = self.at(p.cfg.entry, 0);
        self.em
            .seq_write(SigPoint::Outside, entered, |a| emit_direct_entry(a, n, &rt))?;
        self.entry_rsp()?;
        self.em.jmp(self.labels[p.cfg.entry.index()])
    }

    /// After an outside-entry stub's ENTER: the entry's `rsp`
    /// ([`ProcPlan::entry_value`]), standing before the entry's first
    /// instruction. Every register and the flags are kept (the preserving
    /// stub's callers may keep values in any).
    fn entry_rsp(&mut self) -> GenResult<()> {
        let Some(v) = self.p.entry_value.filter(|_| self.em.counting.is_none()) else {
            return Ok(());
        };
        self.em.point = self.at(self.p.cfg.entry, 0);
        self.em.value(v, Site::CONSERVATIVE)
    }

    /// The labels of map `m`: each original byte's block copy, if a block
    /// starts there.
    fn map_entries(&self, m: Map) -> MapLabels {
        (m.start..m.start + m.len)
            .map(|a| self.p.cfg.block_at(a).map(|b| self.labels[b.index()]))
            .collect()
    }

    /// An unresolved jump ([`CallPlan::indirect`], docs/rewrite.md
    /// "Unresolved jumps"). Its witness first, as before any jump. Then,
    /// below the red zone, with a slot for the destination and rax, rcx and
    /// the flags saved: the target into the slot, a buffer check (the jump
    /// may close a cycle no check of the CFG cuts), INDIRECT(target). A
    /// target inside the primary range goes on where the map says; any
    /// other goes to the original target, counted (a jump into untraced
    /// code; a traced procedure's entry is its springboard), with DESYNC
    /// first for a map entry that is no block (0). `ret 128` jumps to the slot
    /// and gives the stack back in one instruction: no register, flag or
    /// byte the program can see changes.
    fn unresolved(
        &mut self,
        last: Instruction,
        edges: &[EdgeId],
        before_last: Site,
    ) -> GenResult<()> {
        let p = self.p;
        let m = p
            .map
            .ok_or(CodegenError::Internal("an unresolved jump without a map"))?;
        if let Some(w) = edges.first().and_then(|&e| p.witness[e.index()]) {
            let at = self.em.point;
            self.em.witness(w, before_last, at, at)?;
        }
        let at = self.em.point;
        let (rax, rcx) = (Register::RAX, Register::RCX);
        let rip = |a: u64| MemoryOperand::with_base_displ(Register::RIP, a as i64);
        self.enter_dispatch(&last)?;
        let site = self.record_target(RecordKind::Indirect, at)?;
        let reg = iced_x86::code_asm::rax;
        let out = self.em.label();
        self.em
            .push(Instruction::with2(Code::Lea_r64_m, rcx, rip(m.start))?);
        self.em
            .push(Instruction::with2(Code::Sub_r64_rm64, rax, rcx)?);
        let len = i32::try_from(m.len).map_err(|_| CodegenError::Internal("a map over 2 GiB"))?;
        self.em
            .push(Instruction::with2(Code::Cmp_rm64_imm32, rax, len)?);
        let outside = if p.unowned.is_empty() {
            out
        } else {
            self.em.label()
        };
        self.em
            .push(Instruction::with_branch(Code::Jae_rel32_64, outside)?);
        self.em
            .push(Instruction::with2(Code::Lea_r64_m, rcx, rip(m.new))?);
        let entry = MemoryOperand::with_base_index_scale(rcx, rax, 4);
        self.em
            .push(Instruction::with2(Code::Movsxd_r64_rm32, rax, entry)?);
        self.em
            .push(Instruction::with2(Code::Test_rm64_r64, rax, rax)?);
        let desync = self.em.label();
        self.em
            .push(Instruction::with_branch(Code::Je_rel32_64, desync)?);
        self.em
            .push(Instruction::with2(Code::Add_r64_rm64, rax, rcx)?);
        self.em
            .push(Instruction::with2(Code::Mov_rm64_r64, rsp_at(24), rax)?);
        self.leave_dispatch()?;
        self.em.bind(desync);
        self.em
            .push(Instruction::with2(Code::Mov_r64_rm64, rax, rsp_at(24))?);
        self.em.seq_write(at, at, |a| {
            emit_record(a, RecordKind::Desync, Payload::Reg64(reg), site)
        })?;
        self.em.bind(out);
        self.em.transfer(site)?;
        self.leave_dispatch()?;
        if outside != out {
            self.em.bind(outside);
            self.unowned_checks(desync, out)?;
        }
        Ok(())
    }

    /// A target outside the procedure (in the slot) that lies in code no
    /// procedure holds (`ProcPlan::unowned`) goes to `desync`, any other
    /// to `out`: such code would otherwise run untraced unnoticed
    /// (docs/rewrite.md, "Code no procedure holds"). rax, rcx and the flags
    /// are free inside the dispatch.
    fn unowned_checks(&mut self, desync: u64, out: u64) -> GenResult<()> {
        let (rax, rcx) = (Register::RAX, Register::RCX);
        for &(start, end) in self.p.unowned {
            let len = i32::try_from(end - start)
                .map_err(|_| CodegenError::Internal("unowned code over 2 GiB"))?;
            let at = MemoryOperand::with_base_displ(Register::RIP, start as i64);
            self.em.push(Instruction::with2(Code::Lea_r64_m, rcx, at)?);
            self.em
                .push(Instruction::with2(Code::Mov_r64_rm64, rax, rsp_at(24))?);
            self.em
                .push(Instruction::with2(Code::Sub_r64_rm64, rax, rcx)?);
            self.em
                .push(Instruction::with2(Code::Cmp_rm64_imm32, rax, len)?);
            self.em
                .push(Instruction::with_branch(Code::Jb_rel32_64, desync)?);
        }
        self.em
            .push(Instruction::with_branch(Code::Jmp_rel32_64, out)?);
        Ok(())
    }

    /// The jump of a [`Table::biased`] table, the `k`th instruction of
    /// block `b`: its target (read from the copy's table: a link-time
    /// address) plus the load bias (`lea rcx, [rip + (0 - next)]` is the
    /// bias: where link-time address 0 is) into a slot below the red zone,
    /// then the dispatch's end jumps there. Nothing is written to the
    /// stream (the case stubs write the witnesses); no register, flag or
    /// byte the program can see changes but a register the entry was
    /// loaded into (`mov rax, [rcx+rax*8]; jmp rax`), which holds the
    /// case's link-time copy address, as any rewritten table's entry
    /// leaves a copy address there.
    fn biased_jump(&mut self, b: BlockId, k: usize, last: Instruction) -> GenResult<()> {
        self.em.point = self.at(b, k);
        let last = self.relocated(last);
        let (rax, rcx) = (Register::RAX, Register::RCX);
        self.em.push(rsp_step(-128)?);
        for r in [rax, rax, rcx] {
            self.em.push(Instruction::with1(Code::Push_r64, r)?);
        }
        self.em.push(Instruction::with(Code::Pushfq));
        self.em.push(target_into_rax(&last, 128 + DISPATCH_FRAME)?);
        let zero = MemoryOperand::with_base_displ(Register::RIP, 0);
        self.em
            .push(Instruction::with2(Code::Lea_r64_m, rcx, zero)?);
        self.em
            .push(Instruction::with2(Code::Add_r64_rm64, rax, rcx)?);
        self.em
            .push(Instruction::with2(Code::Mov_rm64_r64, rsp_at(24), rax)?);
        self.leave_dispatch()
    }

    /// The jump of a [`Dispatch`], the `k`th instruction of block `b`
    /// (docs/rewrite.md, "Computed jumps"). As for an unresolved jump,
    /// below the red zone a slot for the destination, rax, rcx and the
    /// flags saved, and the original target (the jump's own operand, `rsp`
    /// corrected) into the slot. Each chunk in turn: a target in its span
    /// puts the entry's case (its stub writes the edge's witness) into the
    /// slot. Nothing is written on the way: the stubs write what a jump
    /// table's would. A target no entry has (the analysis was wrong)
    /// writes DESYNC(target) and goes on at the original target, where the
    /// regenerator stops with an error; no register, flag or byte the
    /// program can see changes.
    fn computed(&mut self, b: BlockId, k: usize, last: Instruction, d: &Dispatch) -> GenResult<()> {
        self.em.point = self.at(b, k);
        let at = self.em.point;
        let (rax, rcx) = (Register::RAX, Register::RCX);
        let rip = |a: u64| MemoryOperand::with_base_displ(Register::RIP, a as i64);
        self.enter_dispatch(&last)?;
        let out = self.em.label();
        for c in &d.chunks {
            let next = self.em.label();
            let len = i32::try_from(c.cases.len())
                .map_err(|_| CodegenError::Internal("a dispatch table over 2 GiB"))?;
            self.em
                .push(Instruction::with2(Code::Lea_r64_m, rcx, rip(c.start))?);
            self.em
                .push(Instruction::with2(Code::Sub_r64_rm64, rax, rcx)?);
            self.em
                .push(Instruction::with2(Code::Cmp_rm64_imm32, rax, len)?);
            self.em
                .push(Instruction::with_branch(Code::Jae_rel32_64, next)?);
            self.em
                .push(Instruction::with2(Code::Lea_r64_m, rcx, rip(c.new))?);
            let entry = MemoryOperand::with_base_index_scale(rcx, rax, 4);
            self.em
                .push(Instruction::with2(Code::Movsxd_r64_rm32, rax, entry)?);
            self.em
                .push(Instruction::with2(Code::Test_rm64_r64, rax, rax)?);
            self.em
                .push(Instruction::with_branch(Code::Je_rel32_64, out)?);
            self.em
                .push(Instruction::with2(Code::Add_r64_rm64, rax, rcx)?);
            self.em
                .push(Instruction::with2(Code::Mov_rm64_r64, rsp_at(24), rax)?);
            self.leave_dispatch()?;
            self.em.bind(next);
            self.em
                .push(Instruction::with2(Code::Add_r64_rm64, rax, rcx)?);
        }
        self.em.bind(out);
        self.em
            .push(Instruction::with2(Code::Mov_r64_rm64, rax, rsp_at(24))?);
        self.record_target(RecordKind::Desync, at)?;
        self.leave_dispatch()
    }

    /// The dispatch's start: below the red zone, rax twice (the second
    /// becomes the destination slot), rcx and the flags saved; the jump's
    /// original target in rax and in the slot.
    fn enter_dispatch(&mut self, last: &Instruction) -> GenResult<()> {
        let (rax, rcx) = (Register::RAX, Register::RCX);
        self.em.push(rsp_step(-128)?);
        for r in [rax, rax, rcx] {
            self.em.push(Instruction::with1(Code::Push_r64, r)?);
        }
        self.em.push(Instruction::with(Code::Pushfq));
        self.em.push(target_into_rax(last, 128 + DISPATCH_FRAME)?);
        self.em
            .push(Instruction::with2(Code::Mov_rm64_r64, rsp_at(24), rax)?);
        Ok(())
    }

    /// A `kind` record of the target in rax, at signal point `at` (rcx
    /// and the flags are free inside the dispatch); the site it used.
    fn record_target(&mut self, kind: RecordKind, at: SigPoint) -> GenResult<Site> {
        let site = Site {
            scratch: Some(iced_x86::code_asm::rcx),
            flags_live: false,
            red_zone_live: false,
            flags_save: aetrace_runtime::FlagsSave::Lahf,
        };
        let flush = self.rt.flush;
        self.em.seq(|a| emit_buffer_check(a, flush, site))?;
        let reg = iced_x86::code_asm::rax;
        self.em
            .seq_write(at, at, |a| emit_record(a, kind, Payload::Reg64(reg), site))?;
        Ok(site)
    }

    /// The dispatch's end: the saved registers back, then `ret 128` to
    /// the destination slot.
    fn leave_dispatch(&mut self) -> GenResult<()> {
        self.em.push(Instruction::with(Code::Popfq));
        for r in [Register::RCX, Register::RAX] {
            self.em.push(Instruction::with1(Code::Pop_r64, r)?);
        }
        self.em.push(Instruction::with1(Code::Retnq_imm16, 128u32)?);
        Ok(())
    }

    /// EXIT(edi), before the instruction the current point stands at.
    /// Ends the program with status 125 and the message `text` (a
    /// `longjmp` call, [`CallPlan::fatal_longjmp`]; a landing pad's entry,
    /// [`PathCode::fatal_pads`]); any register may go.
    fn fatal(&mut self, text: String) -> GenResult<()> {
        let label = self.em.label();
        let mov = |r: Register, v: u32| Instruction::with2(Code::Mov_r32_imm32, r, v);
        self.em.push(Instruction::with2(
            Code::Lea_r64_m,
            Register::RSI,
            MemoryOperand::with_base_displ(Register::RIP, label as i64),
        )?);
        self.em.push(mov(Register::EDX, text.len() as u32)?);
        self.em.push(mov(Register::EAX, 1)?);
        self.em.push(mov(Register::EDI, 2)?);
        self.em.push(Instruction::with(Code::Syscall));
        self.em.push(mov(Register::EAX, 231)?);
        self.em.push(mov(Register::EDI, 125)?);
        self.em.push(Instruction::with(Code::Syscall));
        self.em.bind(label);
        for chunk in text.as_bytes().chunks(16) {
            self.em.push(Instruction::with_declare_byte(chunk)?);
        }
        Ok(())
    }

    fn exit_record(&mut self, site: Site) -> GenResult<()> {
        if self.em.counting.is_some() {
            return Ok(());
        }
        let at = self.em.point;
        self.em.seq_write(at, at, |a| {
            emit_record(a, RecordKind::Exit, Payload::Reg32(edi), site)
        })
    }

    /// Before a `syscall` (at `orig`): EXIT(edi) when rax is exit (60) or
    /// exit_group (231). When it creates a task, fork or vfork, or clone
    /// or clone3 without a stack of its own (clone's rsi, clone3's
    /// `clone_args.stack`, 0: the child returns where its creator does),
    /// and the system call returns (`task`): on to label `task`, where a
    /// second copy of the `syscall` has the fork's return point
    /// ([`ProcGen::task_path`]), so the child claims its own slot as at a
    /// system call known to create a task (glibc's `syscall()` traced);
    /// clone or clone3 on a stack of their own go on to label `own`,
    /// where a third copy lets the child claim its slot and enter this
    /// procedure anew ([`ProcGen::own_stack_path`]): no frame of its
    /// creator's is on that stack. Without those paths, DESYNC(orig): the
    /// child would go on writing into this thread's slot (the regenerator
    /// stops there with a message; the program runs on).
    /// rcx and r11 are dead (the kernel overwrites them) and the tests
    /// (`lea rcx`, `mov rcx`, `jrcxz`) leave the flags alone, which the
    /// kernel preserves across the call and may be live. (clone3's
    /// arguments are read here: a pointer the kernel would refuse with
    /// EFAULT faults instead.)
    fn syscall_exit(&mut self, before: Site, orig: u64, paths: Option<TaskPaths>) -> GenResult<()> {
        if self.em.counting.is_some() {
            return Ok(());
        }
        let site = Site {
            scratch: Some(r11),
            flags_live: true,
            red_zone_live: before.red_zone_live,
            flags_save: aetrace_runtime::FlagsSave::Pushf,
        };
        let request = self.rt.exec_request;
        self.em.seq(|a| {
            use aetrace_runtime::layout::ExecKind;
            use iced_x86::code_asm::{ptr, qword_ptr, r11d, rax, rcx, rdi, rsi, rsp};
            let mut exit = a.create_label();
            let mut exec = a.create_label();
            let mut desync = a.create_label();
            let mut done = a.create_label();
            let mut clone = a.create_label();
            let mut clone3 = a.create_label();
            let mut new_task = a.create_label();
            let mut own_stack = a.create_label();
            for nr in [SYS_EXIT_GROUP, SYS_EXIT] {
                a.lea(rcx, ptr(rax - nr))?;
                a.jrcxz(exit)?;
            }
            for nr in SYS_EXECVE_EXECVEAT {
                a.lea(rcx, ptr(rax - nr))?;
                a.jrcxz(exec)?;
            }
            a.lea(rcx, ptr(rax - SYS_CLONE))?;
            a.jrcxz(clone)?;
            a.lea(rcx, ptr(rax - SYS_CLONE3))?;
            a.jrcxz(clone3)?;
            for nr in SYS_FORK_VFORK {
                a.lea(rcx, ptr(rax - nr))?;
                a.jrcxz(new_task)?;
            }
            a.jmp(done)?;
            // The recorder rewrites what it runs (docs/runtime.md section
            // 7, "exec"); r11 is the syscall's to clobber.
            a.set_label(&mut exec)?;
            if site.red_zone_live {
                a.lea(rsp, ptr(rsp - 128))?;
            }
            a.mov(r11d, ExecKind::Syscall as u32)?;
            a.call(request)?;
            if site.red_zone_live {
                a.lea(rsp, ptr(rsp + 128))?;
            }
            a.jmp(done)?;
            a.set_label(&mut clone)?;
            a.mov(rcx, rsi)?;
            a.jrcxz(new_task)?;
            a.jmp(own_stack)?;
            a.set_label(&mut clone3)?;
            a.mov(rcx, qword_ptr(rdi + CLONE_ARGS_STACK))?;
            a.jrcxz(new_task)?;
            a.set_label(&mut own_stack)?;
            match paths.and_then(|p| p.own) {
                Some(o) => a.add_instruction(Instruction::with_branch(Code::Jmp_rel32_64, o)?)?,
                None => a.jmp(desync)?,
            }
            a.set_label(&mut new_task)?;
            match paths {
                Some(p) => {
                    a.add_instruction(Instruction::with_branch(Code::Jmp_rel32_64, p.task)?)?
                }
                None => a.jmp(desync)?,
            }
            a.set_label(&mut exit)?;
            emit_record(a, RecordKind::Exit, Payload::Reg32(edi), site)?;
            a.jmp(done)?;
            a.set_label(&mut desync)?;
            a.mov(rcx, orig)?;
            emit_record(a, RecordKind::Desync, Payload::Reg64(rcx), site)?;
            a.set_label(&mut done)?;
            a.nop()?;
            Ok(())
        })
    }

    /// The second copy of a `syscall` whose number, known only at run time,
    /// creates a task ([`ProcGen::syscall_exit`] jumps to label `task`):
    /// the fork's return point after it (`fork_child` in the child,
    /// FORKED in the parent), at `returned` as at a call's, then on to
    /// `joined`, the first return point's code after where its own
    /// `fork_return` would stand. The regenerator's `call_system` takes
    /// FORKED there as after a system call known to create a task.
    fn task_path(
        &mut self,
        end: &BlockEnd,
        live: crate::liveness::RegSet,
        (task, joined): (u64, u64),
        returned: SigPoint,
    ) -> GenResult<()> {
        self.em.bind(task);
        self.em.point = self.at(end.b, end.last_i);
        self.em.push(Instruction::with(Code::Syscall));
        self.em.point = returned;
        self.fork_return(live, false)?;
        self.em.jmp(joined)
    }

    /// The third copy of a `syscall` whose number, known only at run time,
    /// is clone or clone3 with a stack of the child's own
    /// ([`ProcGen::syscall_exit`] jumps to label `own`). The parent goes
    /// on to `joined`, the first copy's return point (nothing for the
    /// child there: it wrote no FORKED). The child (rax 0) calls
    /// `fork_child` (its own slot: THREAD, or FORK for a process), then
    /// writes ENTER_AT(procedure, the return point's address) and goes on
    /// at the return point's block, past the RETURN the first copy writes:
    /// its stream starts as a callback's of untraced code would, this
    /// procedure alone on it, since below its frame the child's stack
    /// holds what its creator put there, no frame of the creator's (it
    /// returns into whatever function that is, through its outside entry).
    /// Until ENTER_AT is reserved the child runs, for the regenerator,
    /// untraced code.
    fn own_stack_path(
        &mut self,
        end: &BlockEnd,
        to: BlockId,
        (own, joined): (u64, u64),
        returned: SigPoint,
    ) -> GenResult<()> {
        let p = self.p;
        let entry = u32::try_from(p.cfg.blocks[to].start)
            .map_err(|_| CodegenError::Internal("a return point above 4 GiB"))?;
        let (n, fork_child) = (p.number, self.rt.fork_child);
        let site = self.site(p.live.live_in(to) | crate::liveness::RegSet::gpr(Register::RAX));
        self.em.bind(own);
        self.em.point = self.at(end.b, end.last_i);
        self.em.push(Instruction::with(Code::Syscall));
        self.em.point = returned;
        self.em.seq(|a| {
            a.test(eax, eax)?;
            a.add_instruction(Instruction::with_branch(Code::Jne_rel32_64, joined)?)?;
            Ok(())
        })?;
        self.em.point = SigPoint::Outside;
        self.em.seq(|a| Ok(a.call(fork_child)?))?;
        self.em.seq_write(SigPoint::Outside, self.at(to, 0), |a| {
            emit_record(a, RecordKind::EnterAt, Payload::Imm32Pair(n, entry), site)
        })?;
        self.em.jmp(self.labels[to.index()])
    }

    /// Before a call of libc's untraced `syscall()` for clone or clone3
    /// (`CallPlan::own_stack`, `number`) that gives the new task a stack
    /// of its own (`syscall(SYS_clone, flags, stack, ...)`'s rdx, or
    /// `syscall(SYS_clone3, args, size)`'s `args->stack` through rsi,
    /// non-zero): OWNER of this thread's slot becomes `fs:[0] | 1`. The
    /// child leaves `syscall()` on that stack for wherever the program
    /// pointed it, still on this slot with this TCB, and claims its own
    /// slot at its first outside entry, where `attach_thread` tells it
    /// from this thread by its TID (docs/runtime.md section 7, "clone").
    /// The mark stays: this thread's outside entries take that slower
    /// path from then on. At a call the flags, r10 and r11 are dead (no
    /// argument of `syscall()`).
    fn own_stack_mark(&mut self, number: u64) -> GenResult<()> {
        self.em.seq(|a| {
            use iced_x86::code_asm::{qword_ptr, rdx, rsi};
            let mut shared = a.create_label();
            if number == SYS_CLONE as u64 {
                a.test(rdx, rdx)?;
            } else {
                a.cmp(qword_ptr(rsi + CLONE_ARGS_STACK), 0)?;
            }
            a.je(shared)?;
            a.mov(r11, qword_ptr(0u64).fs())?;
            a.or(r11, 1)?;
            a.mov(qword_ptr(S_OWNER).gs(), r11)?;
            a.set_label(&mut shared)?;
            a.nop()?;
            Ok(())
        })
    }

    /// `--data --check`: the VALUE records before instruction `k` of block
    /// `b`, with a buffer check before each [`data::GROUP`] of them after
    /// the block's first.
    fn values_before(&mut self, b: BlockId, k: usize) -> GenResult<()> {
        let p = self.p;
        let Some(values) = p.values.as_ref() else {
            return Ok(());
        };
        let block = &values[b.index()];
        let first: usize = block[..k].iter().map(Vec::len).sum();
        let site = self.site(p.live.live_before(b, k));
        self.em.point = self.at(b, k);
        for (n, &v) in (first..).zip(&block[k]) {
            if n > 0 && n % data::GROUP == 0 {
                self.check(site)?;
            }
            self.em.value(v, site)?;
        }
        Ok(())
    }

    fn check(&mut self, site: Site) -> GenResult<()> {
        if self.em.counting.is_some() {
            return Ok(());
        }
        let flush = self.rt.flush;
        self.em.seq(|a| emit_buffer_check(a, flush, site))
    }

    /// Continues at block `to` (or the tail-call target `orig`) after the
    /// current block when it is not laid out next.
    fn goto(&mut self, to: BlockId, next: Option<BlockId>, orig: u64) -> GenResult<()> {
        if to == self.p.cfg.exit() {
            let t = self.retarget(orig);
            return self.em.jmp(t);
        }
        if Some(to) != next {
            self.em.jmp(self.labels[to.index()])?;
        }
        Ok(())
    }

    fn block(
        &mut self,
        b: BlockId,
        next: Option<BlockId>,
        stubs: &mut Vec<Stub>,
        case_labels: &mut HashMap<EdgeId, u64>,
    ) -> GenResult<()> {
        let p = self.p;
        let cfg = p.cfg;
        let blk = &cfg.blocks[b];
        let insns = &p.insns[b.index()];
        let last_i = insns.len() - 1;
        let last = insns[last_i];
        let exit = cfg.exit();
        let counts_before = (self.em.transfers, stubs.len());
        self.block_head(b)?;
        for (k, &i) in insns[..last_i].iter().enumerate() {
            self.values_before(b, k)?;
            self.copy_at(b, k, i);
        }
        // Instrumentation before the last instruction stands before it.
        // Its values come first: the call plan may move rsp.
        self.values_before(b, last_i)?;
        let before = self.at(b, last_i);
        self.em.point = before;
        let end = BlockEnd {
            b,
            next,
            last_i,
            last,
            edges: self.edges_from(b),
            before,
            before_last: self.site(p.live.live_before(b, last_i)),
            cp: p.calls[b.index()],
        };
        let (edges, before_last, cp) = (&end.edges, end.before_last, end.cp);
        let fc = last.flow_control();
        // Every return is a counted transfer (`ProgramDb::counts_returns`).
        let returns = edges.iter().any(|&e| cfg.edges[e].kind == EdgeKind::Return);
        match fc {
            FlowControl::Call | FlowControl::IndirectCall => self.call(&end)?,
            FlowControl::ConditionalBranch => self.conditional(&end, stubs)?,
            FlowControl::UnconditionalBranch => {
                if cp.count {
                    self.em.transfer(entry_site(before_last))?;
                }
                if let Some(w) = edges.first().and_then(|&e| p.witness[e.index()]) {
                    self.em.witness(w, before_last, before, before)?;
                }
                self.copy_at(b, last_i, last);
            }
            FlowControl::IndirectBranch => {
                self.indirect(b, last, edges, before_last, stubs, case_labels)?
            }
            FlowControl::Return | FlowControl::Exception | FlowControl::Interrupt => {
                if edges.iter().any(|&e| cfg.edges[e].to != exit) {
                    // `syscall`, `int n`: execution continues; after `ud2`
                    // where a handler resumes (`Resume`), so its witness
                    // stands after the trap.
                    self.copy_at(b, last_i, last);
                    self.fallthrough(edges, next, blk.end)?;
                } else {
                    for w in edges.iter().filter_map(|&e| p.witness[e.index()]) {
                        self.em.witness(w, before_last, before, before)?;
                    }
                    // A return is counted after its witness, right before
                    // the `ret`, by one instruction: regen tells a rip
                    // before it from one after it. The flags are saved
                    // around it where a `-fipa-ra` caller may keep them
                    // (the procedure never writes them, liveness says).
                    if returns {
                        self.em.transfer(before_last)?;
                    }
                    self.copy_at(b, last_i, last);
                    if !returns {
                        // A trap with no code of the procedure after it: a
                        // handler that moves rip past it goes where the
                        // native program goes (`docs/cfg.md`, "Traps that
                        // resume"), not into the next block of the copy.
                        self.em.jmp(self.retarget(blk.end))?;
                    }
                }
            }
            FlowControl::Next => {
                // A fall-through into another function: counted before
                // the last instruction (its flags saved if it reads them).
                if cp.count {
                    self.em.transfer(before_last)?;
                }
                self.copy_at(b, last_i, last);
                self.fallthrough(edges, next, blk.end)?;
            }
            FlowControl::XbeginXabortXend => return Err(CodegenError::Xbegin),
        }
        // The regenerator counts every transfer `counted` names: one the
        // code above could not count would misplace signals.
        let counted_here =
            self.em.transfers > counts_before.0 || stubs[counts_before.1..].iter().any(|s| s.count);
        if (cp.count || returns) && self.em.counting.is_none() && !counted_here {
            return Err(CodegenError::UncountedTransfer(last.ip()));
        }
        Ok(())
    }

    /// What stands at a block's entry: its buffer check, its block
    /// counter, its `--stop-at` check.
    fn block_head(&mut self, b: BlockId) -> GenResult<()> {
        let p = self.p;
        self.em.bind(self.labels[b.index()]);
        self.em.lead = self.em.out.len();
        self.em.point = self.at(b, 0);
        if p.loop_header[b.index()] {
            let s = self.site(p.live.live_in(b));
            self.check(s)?;
            self.em.bind(self.checked[b.index()]);
        }
        if let Some(n) = p
            .counters
            .as_ref()
            .and_then(|c| c.blocks.get(b.index()).copied().flatten())
        {
            let s = self.site(p.live.live_in(b));
            self.em.counter(n, s)?;
        }
        if let Some((t, phi)) = p
            .stop()
            .and_then(|s| Some((s.block[b.index()]?, s.phi[b.index()])))
        {
            let site = self.site(p.live.live_in(b));
            let trap = self.em.label();
            let flags_saved = self.em.stop_check(t, site, trap)?;
            // A block event stands at the block's first instruction.
            let insn_events = t - phi == p.insns[b.index()].len() as i64;
            self.traps.push(StopTrap {
                label: trap,
                flags_saved,
                block: b,
                phi: insn_events.then_some(phi),
                point: self.at(b, 0),
            });
        }
        Ok(())
    }

    /// A block ending in a call: what the call plan adds before it, the
    /// call, and what stands at its return point.
    fn call(&mut self, end: &BlockEnd) -> GenResult<()> {
        let p = self.p;
        let b = end.b;
        // setjmp returns again after a longjmp, through the same
        // return point: its return edge (first returns) is counted
        // before the call, all returns after it.
        let setjmp = end.cp.jmpbuf == Some(RecordKind::Setjmp)
            || p.counters
                .as_ref()
                .is_some_and(|c| c.split_return.get(b.index()).copied().unwrap_or(false));
        let ret = end
            .edges
            .iter()
            .find(|&&e| p.cfg.edges[e].kind == EdgeKind::CallReturn)
            .copied();
        // A system call that may create a task at run time, and returns.
        let tracing = self.em.counting.is_none();
        let task = (end.cp.task_paths && tracing && ret.is_some()).then(|| TaskPaths {
            task: self.em.label(),
            // With data values an outside entry writes `rsp` after its
            // ENTER, which this path does not: DESYNC there.
            // (`test eax` after the system call: the flags must be dead.)
            own: (p.values.is_none() && !p.live.live_out(b).flags_live()).then(|| self.em.label()),
        });
        let made = (end.cp.shell.is_some() && tracing).then(|| self.em.label());
        let query = self.before_call(end, setjmp, task, made)?;
        match end.cp.by_entry {
            true => self.place_copy(b, end.last_i, end.last),
            false => self.copy_at(b, end.last_i, end.last),
        }
        if let Some(made) = made {
            self.em.bind(made);
        }
        match ret {
            Some(e) => self.call_return(end, e, query, setjmp, task),
            None => Ok(()),
        }
    }

    /// Before a call: EXIT records, counters of edges counted before it,
    /// SETJMP/LONGJMP records, the `--stop-at` query, `fork_prepare` and
    /// the counted transfer. Returns the query increment the callee's
    /// frame starts with.
    /// Before a lazily bound PLT stub's `jmp [GOT]` (`last`) of an exec
    /// function: the exec request, when the slot is bound (it no longer
    /// holds `lazy`, its LAZY piece's address). Unbound, the piece asks
    /// after its LAZY, so that the lazy-binding path the exec would run
    /// natively is in the trace ([`CallPlan::exec`]). r11 and the flags
    /// are the stub's to clobber.
    fn bound_exec_request(
        &mut self,
        cp: &CallPlan,
        last: &Instruction,
        lazy: u64,
    ) -> GenResult<()> {
        if cp.exec.is_none() && cp.shell.is_none() {
            return Ok(());
        }
        let rip = |a: u64| MemoryOperand::with_base_displ(Register::RIP, a as i64);
        let unbound = self.em.label();
        let lea = Instruction::with2(Code::Lea_r64_m, Register::R11, rip(lazy))?;
        self.em.push(lea);
        let got = rip(last.ip_rel_memory_address());
        self.em
            .push(Instruction::with2(Code::Cmp_rm64_r64, got, Register::R11)?);
        self.em
            .push(Instruction::with_branch(Code::Je_rel32_64, unbound)?);
        if let Some(kind) = cp.exec {
            self.exec_request_entered(kind)?;
        }
        if let Some(kind) = cp.shell {
            self.shell_call_entered(kind, None)?;
        }
        self.em.bind(unbound);
        Ok(())
    }

    /// `shell_call` from inside a PLT stub (its caller's return address
    /// on the stack), from its LAZY piece when `got` is the slot it would
    /// bind: when it made the call, the stub returns to its caller as
    /// the function would have; else on to the jump.
    fn shell_call_entered(
        &mut self,
        kind: aetrace_runtime::layout::ShellCall,
        got: Option<u64>,
    ) -> GenResult<()> {
        use aetrace_runtime::layout::SHELL_LAZY;
        use iced_x86::code_asm::r11d;
        let entry = self.rt.shell_call;
        let mut bits = kind as u32;
        if let Some(got) = got {
            let slot = MemoryOperand::with_base_displ(Register::RIP, got as i64);
            self.em
                .push(Instruction::with2(Code::Lea_r64_m, Register::RAX, slot)?);
            bits |= SHELL_LAZY;
        }
        self.em.seq(|a| {
            let mut go_on = a.create_label();
            a.mov(r11d, bits)?;
            a.call(entry)?;
            a.test(r11d, r11d)?;
            a.jnz(go_on)?;
            a.ret()?;
            a.set_label(&mut go_on)?;
            Ok(a.zero_bytes()?)
        })
    }

    /// `exec_request` from inside the callee (a PLT stub, its return
    /// address on the stack, so that the request's rsp plus 8 is the
    /// caller's). No red zone is live there: the stub has no data, and
    /// a function that tail-jumps to it has left its frame.
    fn exec_request_entered(&mut self, kind: aetrace_runtime::layout::ExecKind) -> GenResult<()> {
        use aetrace_runtime::layout::EXEC_ENTERED;
        let request = self.rt.exec_request;
        self.em.seq(|a| {
            a.mov(iced_x86::code_asm::r11d, kind as u32 | EXEC_ENTERED)?;
            Ok(a.call(request)?)
        })
    }

    fn before_call(
        &mut self,
        end: &BlockEnd,
        setjmp: bool,
        task: Option<TaskPaths>,
        made: Option<u64>,
    ) -> GenResult<i64> {
        let p = self.p;
        let (b, cp, before, before_last) = (end.b, end.cp, end.before, end.before_last);
        if cp.exit_record {
            self.exit_record(before_last)?;
        }
        if cp.syscall_exit {
            self.syscall_exit(before_last, end.last.ip(), task)?;
        }
        if let Some(number) = cp.own_stack.filter(|_| self.em.counting.is_none()) {
            self.em.point = before;
            self.own_stack_mark(number)?;
        }
        if self.em.counting.is_some() {
            // A call that never returns: its edge to EXIT is
            // counted before the call.
            for &e in &end.edges {
                let kind = p.cfg.edges[e].kind;
                let before = kind == EdgeKind::NoReturn || (setjmp && kind == EdgeKind::CallReturn);
                if let (Some(n), true) = (p.witness[e.index()], before) {
                    self.em.counter(n, before_last)?;
                }
            }
            if let Some(n) = p
                .counters
                .as_ref()
                .and_then(|c| c.before_call.get(b.index()).copied().flatten())
            {
                self.em.counter(n, before_last)?;
            }
        }
        if cp.fatal_longjmp && self.em.counting.is_some() {
            self.fatal(format!(
                "aetrace: {} calls longjmp at {:#x}: path profiles and --stop-at cannot \
                 follow the frames it abandons\n",
                p.name,
                end.last.ip()
            ))?;
        }
        if cp.jmpbuf == Some(RecordKind::Setjmp) && self.em.counting.is_none() {
            self.em.seq_write(before, before, |a| {
                emit_rsp_record(a, RecordKind::Setjmp, None, before_last)
            })?;
        }
        // The callee's frame starts with the count exact.
        let query = p.stop().map_or(0, |s| s.call[b.index()]);
        if query != 0 {
            self.em.add_to_count(query, before_last)?;
        }
        if cp.atfork && self.em.counting.is_none() {
            // Before the increment: a signal inside it stands
            // before the call with the count before it.
            self.em.point = before;
            let prepare = self.rt.fork_prepare;
            self.em.seq(|a| Ok(a.call(prepare)?))?;
        }
        if cp.dispositions && self.em.counting.is_none() {
            // Before the increment, as `fork_prepare`.
            self.em.point = before;
            let native = self.rt.dispositions_native;
            self.em.seq(|a| Ok(a.call(native)?))?;
        }
        if cp.reads && self.em.counting.is_none() {
            self.em.point = before;
            let read = self.rt.maps_read;
            self.em.seq(|a| Ok(a.call(read)?))?;
        }
        if let Some(arg) = cp.exe_path.filter(|_| self.em.counting.is_none()) {
            self.em.point = before;
            self.call_with_r11(self.rt.exe_path, arg as u32)?;
        }
        if let Some(kind) = cp.exec.filter(|_| self.em.counting.is_none()) {
            self.em.point = before;
            self.call_with_r11(self.rt.exec_request, kind as u32)?;
        }
        if let (Some(kind), Some(made)) = (cp.shell, made) {
            self.em.point = before;
            self.shell_call(kind, cp.count, made)?;
        }
        if cp.count {
            // Last, so that a signal sees the count and the point
            // (before the call) agree whether or not it ran.
            self.em.point = before;
            self.em.transfer(before_last)?;
        }
        Ok(query)
    }

    /// `shell_call` at a call site: when it made the call (r11 = 0), on
    /// to `made`, the call's return point, the call's transfer counted by
    /// the runtime when `counted`.
    fn shell_call(
        &mut self,
        kind: aetrace_runtime::layout::ShellCall,
        counted: bool,
        made: u64,
    ) -> GenResult<()> {
        use aetrace_runtime::layout::SHELL_COUNTED;
        let bits = kind as u32 | if counted { SHELL_COUNTED } else { 0 };
        self.call_with_r11(self.rt.shell_call, bits)?;
        let test = Instruction::with2(Code::Test_rm32_r32, Register::R11D, Register::R11D)?;
        self.em.push(test);
        self.em
            .push(Instruction::with_branch(Code::Je_rel32_64, made)?);
        Ok(())
    }

    /// `call entry` with r11 = `value` (an entry point's one parameter:
    /// r11 is no argument of any call).
    fn call_with_r11(&mut self, entry: u64, value: u32) -> GenResult<()> {
        self.em.seq(|a| {
            a.mov(iced_x86::code_asm::r11d, value)?;
            Ok(a.call(entry)?)
        })
    }

    /// At a call's return point (edge `e`): the query taken back, the
    /// return edge's counter, `fork_child`, the return-point check, the
    /// RETURN record.
    fn call_return(
        &mut self,
        end: &BlockEnd,
        e: EdgeId,
        query: i64,
        setjmp: bool,
        task: Option<TaskPaths>,
    ) -> GenResult<()> {
        let p = self.p;
        let (b, cp) = (end.b, end.cp);
        let wit = p.witness[e.index()];
        // No code could write it where the regenerator reads it
        // (after the callee's records, and a call may not return).
        if wit.is_some() && self.em.counting.is_none() {
            return Err(CodegenError::CallReturnWitness {
                at: end.last.ip(),
                witness: wit,
            });
        }
        let to = p.cfg.edges[e].to;
        let site = self.site(p.live.live_in(to));
        if query != 0 {
            self.em.add_to_count(-query, site)?;
        }
        let resume = p
            .counters
            .as_ref()
            .and_then(|c| c.resume.get(b.index()).copied().flatten());
        let after = if setjmp { resume } else { wit };
        if let Some(n) = after.filter(|_| self.em.counting.is_some()) {
            self.em.counter(n, site)?;
        }
        let tracing = self.em.counting.is_none();
        let returned = self.at(to, 0);
        // Until a marked call's RETURN is reserved, the
        // regenerator still waits for the callee.
        self.em.point = if cp.marker && tracing {
            SigPoint::Returned {
                block: b.index() as u32,
            }
        } else {
            returned
        };
        if cp.jmpbuf == Some(RecordKind::Setjmp) && tracing {
            let after = self.em.point;
            self.resume_record(b, site, after)?;
        }
        let returned_at = self.em.point;
        if cp.fork && tracing {
            self.fork_return(p.live.live_in(to), cp.atfork)?;
        }
        let joined = task.map(|t| (t, self.em.label()));
        if let Some((_, j)) = joined {
            debug_assert!(query == 0 && !cp.fork, "a task path joins no count or fork");
            self.em.bind(j);
        }
        if cp.dispositions && tracing {
            let ours = self.rt.dispositions_ours;
            self.em.seq(|a| Ok(a.call(ours)?))?;
        }
        if let Some(opened) = cp.opens.filter(|_| tracing) {
            let view = match opened {
                imports::Opened::Fd => self.rt.maps_opened_fd,
                imports::Opened::File => self.rt.maps_opened_file,
            };
            self.em.seq(|a| Ok(a.call(view)?))?;
        }
        if !cp.unchecked_return {
            self.check(site)?;
        }
        if cp.marker && tracing {
            let waiting = self.em.point;
            self.em.seq_write(waiting, returned, |a| {
                emit_record(a, RecordKind::Return, Payload::None, site)
            })?;
        }
        let Some((paths, joined)) = joined else {
            return self.goto(to, end.next, 0);
        };
        // The task paths follow: never fall through into them.
        self.goto(to, None, 0)?;
        self.task_path(end, p.live.live_in(to), (paths.task, joined), returned_at)?;
        match paths.own {
            Some(own) => self.own_stack_path(end, to, (own, joined), returned_at),
            None => Ok(()),
        }
    }

    /// At setjmp-like call block `b`'s return point: when the call returns
    /// again (`eax != 0`: a longjmp, traced or not, came back to it),
    /// SETJMP_RESUME(procedure, rsp, block); the first return only tests
    /// `eax`. Until the record is reserved the regenerator has the thread
    /// in untraced code (the longjmp's), so the test stands there too: on
    /// the first return, untraced code (the setjmp) has just run as well,
    /// and a signal there is placed the same (docs/regen.md section 3).
    fn resume_record(&mut self, b: BlockId, site: Site, after: SigPoint) -> GenResult<()> {
        let first = self.em.label();
        self.em.point = SigPoint::Outside;
        self.em.seq(|a| Ok(a.test(eax, eax)?))?;
        self.em
            .push(Instruction::with_branch(Code::Je_rel32_64, first)?);
        let (flush, n) = (self.rt.flush, self.p.number);
        self.em.seq_write(SigPoint::Outside, after, |a| {
            emit_buffer_check(a, flush, site)?;
            emit_rsp_record(
                a,
                RecordKind::SetjmpResume,
                Some((n, b.index() as u32)),
                site,
            )
        })?;
        self.em.bind(first);
        Ok(())
    }

    /// A block ending in a conditional branch: the taken edge's witness in
    /// a stub, the fall-through's inline.
    fn conditional(&mut self, end: &BlockEnd, stubs: &mut Vec<Stub>) -> GenResult<()> {
        let p = self.p;
        let cfg = p.cfg;
        let exit = cfg.exit();
        let blk = &cfg.blocks[end.b];
        let (last, before, cp) = (end.last, end.before, end.cp);
        let wit = |e: EdgeId| p.witness[e.index()];
        let target = last.near_branch_target();
        let taken = end.edges.iter().copied().find(|&e| {
            let ed = cfg.edges[e];
            ed.kind == EdgeKind::Taken || (ed.to == exit && ed.kind == EdgeKind::TailCall)
        });
        let fall = end
            .edges
            .iter()
            .copied()
            .find(|&e| cfg.edges[e].kind == EdgeKind::FallThrough);
        let mut insn = last;
        let dest = self.retarget(target);
        // Where the branch goes, and the point once it went there.
        let (t, taken_point) = match taken {
            Some(e) if wit(e).is_some() => {
                let to = cfg.edges[e].to;
                let live = p.live.live_on_edge(cfg, e);
                let label = self.em.label();
                stubs.push(Stub {
                    label,
                    edge: e,
                    after: self.after_edge(e, target),
                    witness: wit(e),
                    site: self.site(live),
                    count: to == exit && cp.count,
                    exit_record: false,
                    lazy: false,
                    exec: None,
                    shell: None,
                    target: if to == exit {
                        dest
                    } else {
                        self.labels[to.index()]
                    },
                });
                let point = SigPoint::Witness {
                    edge: e.index() as u32,
                };
                (label, point)
            }
            Some(e) if cp.count && cfg.edges[e].to == exit => {
                // The blocking property puts a witness on every
                // predicate's edge to EXIT: its stub counts.
                return Err(CodegenError::UnwitnessedTailCall(last.ip()));
            }
            _ => (dest, taken.map_or(before, |e| self.after_edge(e, target))),
        };
        // `jrcxz` and `loop*` reach 127 bytes only, which
        // instrumentation between them and their target can exceed
        // (glibc's `__mpn_sub_n` under `--stop-at`): they jump to a
        // `jmp` right after them instead.
        let short_only = matches!(
            insn.code(),
            Code::Jrcxz_rel8_64
                | Code::Jecxz_rel8_64
                | Code::Loop_rel8_64_RCX
                | Code::Loop_rel8_64_ECX
                | Code::Loope_rel8_64_RCX
                | Code::Loope_rel8_64_ECX
                | Code::Loopne_rel8_64_RCX
                | Code::Loopne_rel8_64_ECX
        );
        let near = short_only.then(|| self.em.label());
        insn.set_near_branch64(near.unwrap_or(t));
        self.em.copy_len = last.len() as u8;
        self.em.push_copy(insn, last.ip());
        if let Some(near) = near {
            let over = self.em.label();
            self.em.point = match fall {
                Some(e) if wit(e).is_some() => SigPoint::Witness {
                    edge: e.index() as u32,
                },
                Some(e) => self.after_edge(e, blk.end),
                None => before,
            };
            self.em.jmp(over)?;
            self.em.bind(near);
            self.em.point = taken_point;
            self.em.jmp(t)?;
            self.em.bind(over);
            self.em.point = before;
        }
        if let Some(e) = fall {
            let to = cfg.edges[e].to;
            let after = self.after_edge(e, blk.end);
            if let Some(w) = wit(e) {
                let s = self.site(p.live.live_on_edge(cfg, e));
                let before = SigPoint::Witness {
                    edge: e.index() as u32,
                };
                self.em.witness(w, s, before, after)?;
            }
            self.em.point = after;
            self.goto(to, end.next, blk.end)?;
        } else if let Some(to) = cfg.block_at(blk.end) {
            // Both outcomes reach the same block (one edge).
            self.em.point = self.at(to, 0);
            self.goto(to, end.next, blk.end)?;
        }
        Ok(())
    }

    /// The single fall-through successor of a block ending without a branch
    /// (or into another procedure: a tail call).
    fn fallthrough(&mut self, edges: &[EdgeId], next: Option<BlockId>, end: u64) -> GenResult<()> {
        let cfg = self.p.cfg;
        let Some(&e) = edges.first() else {
            return Ok(());
        };
        let to = cfg.edges[e].to;
        let after = self.after_edge(e, end);
        if let Some(w) = self.p.witness[e.index()] {
            let s = self.site(self.p.live.live_on_edge(cfg, e));
            let before = SigPoint::Witness {
                edge: e.index() as u32,
            };
            self.em.witness(w, s, before, after)?;
        }
        self.em.point = after;
        self.goto(to, next, end)
    }

    /// At a fork's return point: the parent (result > 0) writes
    /// FORKED(child pid), the child (result 0) claims its own slot before
    /// anything else; a failed fork (< 0) writes nothing. `live` is what is
    /// live there (flags are dead: the callee clobbered them). After an
    /// `atfork` fork each process calls `fork_done` (the parent before
    /// FORKED, where a signal in it stands).
    fn fork_return(&mut self, live: crate::liveness::RegSet, atfork: bool) -> GenResult<()> {
        let fork_child = self.rt.fork_child;
        let fork_done = atfork.then_some(self.rt.fork_done);
        // The payload is eax: never pick rax as the scratch register.
        let site = self.site(live | crate::liveness::RegSet::gpr(Register::RAX));
        self.em.seq(|a| {
            use iced_x86::code_asm::eax;
            let mut child = a.create_label();
            let mut done = a.create_label();
            a.test(eax, eax)?;
            a.je(child)?;
            if let Some(fork_done) = fork_done {
                let mut parent = a.create_label();
                a.jg(parent)?;
                a.call(fork_done)?;
                a.jmp(done)?;
                a.set_label(&mut parent)?;
                a.call(fork_done)?;
            } else {
                a.jl(done)?;
            }
            emit_record(a, RecordKind::Forked, Payload::Reg32(eax), site)?;
            a.jmp(done)?;
            a.set_label(&mut child)?;
            a.call(fork_child)?;
            if let Some(fork_done) = fork_done {
                a.call(fork_done)?;
            }
            a.set_label(&mut done)?;
            a.nop()?;
            Ok(())
        })
    }

    /// The cases of a jump table that leave for another procedure's entry
    /// (`traced::outside_cases`): a stub, as for a conditional tail call's
    /// taken edge, counts the transfer, writes the edge's witness (when
    /// tracing) and jumps to the callee (its copy's body when it is
    /// traced). Always a stub: a table entry is a label of the copy.
    fn table_tail_call(
        &mut self,
        b: BlockId,
        e: EdgeId,
        stubs: &mut Vec<Stub>,
        case_labels: &mut HashMap<EdgeId, u64>,
    ) -> GenResult<()> {
        let p = self.p;
        let last = *p.insns[b.index()].last().expect("blocks are non-empty");
        let cp = p.calls[b.index()];
        let target = p
            .cfg
            .calls
            .iter()
            .find(|c| c.block == b && c.tail)
            .and_then(|c| c.target)
            .ok_or(CodegenError::CaseWithoutEdge)?;
        let witness = p.witness[e.index()];
        if witness.is_none() && cp.count {
            // As for a conditional tail call: the blocking property puts
            // a witness on a predicate's edge to EXIT.
            return Err(CodegenError::UnwitnessedTailCall(last.ip()));
        }
        let label = self.em.label();
        stubs.push(Stub {
            label,
            edge: e,
            after: self.after_edge(e, target),
            witness,
            site: self.site(p.live.live_on_edge(p.cfg, e)),
            count: cp.count,
            exit_record: false,
            lazy: false,
            exec: None,
            shell: None,
            target: self.retarget(target),
        });
        case_labels.insert(e, label);
        Ok(())
    }

    fn indirect(
        &mut self,
        b: BlockId,
        last: Instruction,
        edges: &[EdgeId],
        before_last: Site,
        stubs: &mut Vec<Stub>,
        case_labels: &mut HashMap<EdgeId, u64>,
    ) -> GenResult<()> {
        let p = self.p;
        let cfg = p.cfg;
        let exit = cfg.exit();
        let dispatch = p.dispatches.iter().find(|d| d.block == b);
        let is_table = dispatch.is_some() || p.tables.iter().any(|t| t.block == b);
        if p.calls[b.index()].indirect && self.em.counting.is_none() {
            return self.unresolved(last, edges, before_last);
        }
        let last_i = p.insns[b.index()].len() - 1;
        if is_table {
            for &e in edges {
                let to = cfg.edges[e].to;
                if to == exit {
                    self.table_tail_call(b, e, stubs, case_labels)?;
                } else if let Some(w) = p.witness[e.index()] {
                    let label = self.em.label();
                    stubs.push(Stub {
                        label,
                        edge: e,
                        after: self.after_edge(e, 0),
                        witness: Some(w),
                        site: self.site(p.live.live_in(to)),
                        count: false,
                        exit_record: false,
                        lazy: false,
                        exec: None,
                        shell: None,
                        target: self.labels[to.index()],
                    });
                    case_labels.insert(e, label);
                }
            }
            if let Some(d) = dispatch {
                return self.computed(b, last_i, last, d);
            }
            if p.tables.iter().any(|t| t.block == b && t.biased) {
                return self.biased_jump(b, last_i, last);
            }
            self.copy_at(b, last_i, last);
            return Ok(());
        }
        let cp = p.calls[b.index()];
        let tail = edges.iter().copied().find(|&e| cfg.edges[e].to == exit);
        let lazy = edges.iter().copied().find(|&e| cfg.edges[e].to != exit);
        match (tail, lazy, edges.len()) {
            // Unreachable (the CFG proved no path gets here): copied as is; if
            // it ever ran, the regenerator would stop at a block without
            // successors.
            (None, None, 0) => {
                self.copy_at(b, last_i, last);
                Ok(())
            }
            (Some(e), None, 1) => {
                // A jump's count first, before the records that precede
                // it (the regenerator reads an EXIT here after counting).
                if cp.count {
                    self.em.transfer(entry_site(before_last))?;
                }
                if let Some(w) = p.witness[e.index()] {
                    let at = self.em.point;
                    self.em.witness(w, before_last, at, at)?;
                }
                if cp.exit_record {
                    self.exit_record(before_last)?;
                }
                // IBT: the slot's lazy value leads to a LAZY piece that
                // enters the `.plt` entry's copy (see the two-edge case).
                let lazy = cp.lazy_entry.filter(|_| self.em.counting.is_none());
                let label = self.em.label();
                if lazy.is_some() {
                    self.bound_exec_request(&cp, &last, label)?;
                }
                self.copy_at(b, last_i, last);
                if let Some(entry) = lazy {
                    let target = *self
                        .bodies
                        .get(&entry)
                        .ok_or(CodegenError::LazyEntryUntraced(entry))?;
                    self.em.lazy.push((last.ip_rel_memory_address(), label));
                    stubs.push(Stub {
                        label,
                        edge: e,
                        after: self.after_edge(e, entry),
                        witness: None,
                        site: plt_site(),
                        count: false,
                        exit_record: false,
                        lazy: true,
                        exec: cp.exec,
                        shell: cp.shell.map(|k| (k, last.ip_rel_memory_address())),
                        target,
                    });
                }
                Ok(())
            }
            (Some(t), Some(l), 2)
                if last.is_ip_rel_memory_operand()
                    && cp.lazy_record
                    && self.em.counting.is_none() =>
            {
                // A PLT stub's `jmp [GOT]` decided by LAZY (`CallDb::plt`):
                // copied alone. The bound outcome writes nothing and is not
                // counted (the way into the stub was); the GOT slot's lazy
                // value leads to the piece after the blocks, which writes
                // LAZY(stub) before anything else of the lazy path runs,
                // then goes on to the copy of the stub's second half.
                if cp.count || cp.exit_record || p.witness[t.index()].is_some() {
                    return Err(CodegenError::LazyPltCounted {
                        at: last.ip(),
                        count: cp.count,
                        exit: cp.exit_record,
                        witness: p.witness[t.index()],
                    });
                }
                let to = cfg.edges[l].to;
                let label = self.em.label();
                self.bound_exec_request(&cp, &last, label)?;
                self.copy_at(b, last_i, last);
                self.em.lazy.push((last.ip_rel_memory_address(), label));
                stubs.push(Stub {
                    label,
                    edge: l,
                    after: self.after_edge(l, 0),
                    witness: None,
                    site: plt_site(),
                    count: false,
                    exit_record: false,
                    lazy: true,
                    exec: cp.exec,
                    shell: cp.shell.map(|k| (k, last.ip_rel_memory_address())),
                    target: self.labels[to.index()],
                });
                Ok(())
            }
            (Some(t), Some(l), 2) if last.is_ip_rel_memory_operand() => {
                // A PLT stub's `jmp [GOT]`: the slot holds the lazy-binding
                // path (the stub's own second half) until the import is
                // bound. Compare and witness the outcome.
                let to = cfg.edges[l].to;
                let lazy_addr = cfg.blocks[to].start;
                let got = last.ip_rel_memory_address();
                let label = self.em.label();
                let site = plt_site();
                let lea = Instruction::with2(
                    Code::Lea_r64_m,
                    Register::R11,
                    MemoryOperand::with_base_displ(Register::RIP, lazy_addr as i64),
                )?;
                self.em.push(lea);
                let cmp = Instruction::with2(
                    Code::Cmp_rm64_r64,
                    MemoryOperand::with_base_displ(Register::RIP, got as i64),
                    Register::R11,
                )?;
                self.em.push(cmp);
                let je = Instruction::with_branch(Code::Je_rel32_64, label)?;
                self.em.push(je);
                // The bound outcome only: the lazy one goes on in traced
                // code (the stub's second half, then `<plt0>`, whose own
                // jump into ld.so is counted), as the regenerator follows
                // it. Before the witness and EXIT, as at every tail jump.
                if cp.count {
                    self.em.transfer(site)?;
                }
                if let Some(w) = p.witness[t.index()] {
                    let at = self.em.point;
                    self.em.witness(w, site, at, at)?;
                }
                if cp.exit_record {
                    self.exit_record(site)?;
                }
                self.copy_at(b, last_i, last);
                stubs.push(Stub {
                    label,
                    edge: l,
                    after: self.after_edge(l, 0),
                    witness: p.witness[l.index()],
                    site,
                    count: false,
                    exit_record: cp.exit_record,
                    lazy: false,
                    exec: None,
                    shell: None,
                    target: self.labels[to.index()],
                });
                Ok(())
            }
            _ => Err(CodegenError::IndirectJump {
                at: last.ip(),
                successors: edges.len(),
            }),
        }
    }
}
