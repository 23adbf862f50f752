//! Per-block address programs: what each instruction of a recovered CFG
//! reads and writes in memory, and how the registers its addresses use are
//! updated, as data (issue 21; `docs/data-census.md`; the rule of
//! `DESIGN-data.md`: record only the values the address arithmetic cannot
//! recompute; paper 003 section 5.2, Larus's Abstract Execution).
//!
//! - [`forms`]: one instruction as an [`InsnProgram`]: its memory references
//!   ([`MemRef`]: kind L/S/M, size and address expression, counted as
//!   valgrind lackey counts them) and its register updates ([`Update`]:
//!   interpretable arithmetic, a load, or an opaque value the interpreter
//!   cannot compute).
//! - [`value`]: the abstract interpreter of those programs over two
//!   domains: the *shape* of each register (a constant, the entry stack
//!   pointer plus an offset, the thread pointer plus an offset, or anything)
//!   with 8-byte stack slots, and its *sources* (the opaque definitions and
//!   entry registers its value depends on).
//! - [`flow`]: the per-procedure forward dataflow (a worklist fixpoint in
//!   reverse post-order, and its naive twin, a round-robin fixpoint).
//! - [`full`]: what the checking mode records before each instruction.
//! - [`exec`]: the abstract execution `record --data` and the regenerator
//!   share: which values a block records, and every address from them.
//! - [`returns`]: which procedures of a module return only through a
//!   traced `ret`, so that their callers' return points keep `rsp`.
//! - [`why`]: why each recorded value is recorded (a measurement).
//! - [`census`]: each reference classified by how its address can be
//!   rebuilt ([`census::Class`]), and the values that would be recorded.
//!
//! Invariants: a [`BlockProgram`] has one [`InsnProgram`] per instruction
//! of its block, in order; within an instruction, every reference's address
//! and every update's inputs are read in the state *before* the
//! instruction, and the updates are applied together after it. The
//! abstract domains only describe what the regenerator will know; the
//! census is an estimate until the checking mode of issue 21 confirms it.

pub mod census;
pub mod exec;
pub mod flow;
pub mod forms;
pub mod full;
pub mod returns;
pub mod value;
pub mod why;

#[cfg(test)]
mod tests;

use aetrace_format::progdb::ProcDb;
use aetrace_graph::{BlockId, EntityRef};
use iced_x86::{Decoder, DecoderOptions, Instruction, InstructionInfoFactory, Mnemonic, Register};

use crate::cfg::Cfg;
use crate::elf::Module;

/// A general-purpose register by its number (`rax` = 0 ... `r15` = 15).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gpr(pub u8);

impl Gpr {
    /// `rsp`.
    pub const RSP: Gpr = Gpr(4);
    /// `rbp`.
    pub const RBP: Gpr = Gpr(5);
    /// The number of general-purpose registers.
    pub const COUNT: usize = 16;

    /// The 64-bit register containing `r`, if `r` is a general-purpose one
    /// (`al`, `ah`, `ax`, `eax` are all `rax`).
    pub fn of(r: Register) -> Option<Gpr> {
        let full = r.full_register();
        full.is_gpr64()
            .then(|| Gpr((full as u32 - Register::RAX as u32) as u8))
    }

    /// The register's position in a register file.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// A set of general-purpose registers, one bit each.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct RegSet(pub u16);

impl RegSet {
    /// Adds `r`.
    pub fn insert(&mut self, r: Gpr) {
        self.0 |= 1 << r.0;
    }
    /// The registers of the set, lowest first.
    pub fn iter(self) -> impl Iterator<Item = Gpr> {
        (0..16u8).filter(move |i| self.0 & (1 << i) != 0).map(Gpr)
    }
}

/// The segment an address is relative to: `fs` and `gs` add the thread's
/// base, the others are flat in 64-bit mode.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Seg {
    /// No base (`ds`, `ss`, `es`, `cs`).
    Flat,
    /// `fs:` (TLS and the stack canary on Linux).
    Fs,
    /// `gs:`.
    Gs,
}

/// An address: `seg + base + index * scale + disp (+ sar(bit_offset, 3))`,
/// wrapping. A rip-relative or absolute address has neither base nor index
/// and `disp` is the link-time address.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct AddrExpr {
    /// The segment base added.
    pub seg: Seg,
    /// The base register.
    pub base: Option<Gpr>,
    /// The index register.
    pub index: Option<Gpr>,
    /// The index's scale (1, 2, 4, 8).
    pub scale: u8,
    /// The displacement (two's complement).
    pub disp: u64,
    /// `bt`/`bts`/`btr`/`btc` with a register bit offset: the byte at
    /// `sar(offset, 3)` past the rest.
    pub bit_offset: Option<Gpr>,
    /// A gather's index is a vector register: the lanes' addresses are
    /// not computable from general-purpose registers.
    pub vector_index: bool,
}

impl AddrExpr {
    /// The registers the address reads.
    pub fn regs(&self) -> RegSet {
        let mut s = RegSet::default();
        for r in [self.base, self.index, self.bit_offset]
            .into_iter()
            .flatten()
        {
            s.insert(r);
        }
        s
    }
}

/// How a reference touches memory, as lackey names it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Access {
    /// `L`: a load.
    Load,
    /// `S`: a store.
    Store,
    /// `M`: a load and a store of the same address and size (a
    /// read-modify-write).
    Modify,
}

impl Access {
    /// Lackey's letter.
    pub fn letter(self) -> char {
        match self {
            Access::Load => 'L',
            Access::Store => 'S',
            Access::Modify => 'M',
        }
    }
}

/// What an 8-byte store writes, when the interpreter can follow it into a
/// stack slot.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Stored {
    /// The full value of a register.
    Reg(Gpr),
    /// A constant.
    Imm(u64),
}

/// How many times a reference happens per execution of its instruction.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Repeat {
    /// Once.
    Once,
    /// `rep movs`/`stos`/`lods`: `rcx` times (lackey: one `I` per
    /// iteration, plus one when `rcx` reaches zero).
    Rcx,
    /// `repe`/`repne` `cmps`/`scas`: at most `rcx` times, stopping on the
    /// data.
    UntilData,
}

/// One memory reference of an instruction.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MemRef {
    /// Load, store or read-modify-write.
    pub access: Access,
    /// Bytes (lackey's size); 0 when the size depends on the CPU (`xsave`).
    pub size: u32,
    /// The address.
    pub addr: AddrExpr,
    /// How many times it happens per execution.
    pub repeat: Repeat,
    /// For an 8-byte store: the value written.
    pub stored: Option<Stored>,
}

/// What a register update writes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Dst {
    /// All 64 bits of a register (a 32-bit write zero-extends).
    Full(Gpr),
    /// Its low 8 or 16 bits (or `ah`): the rest keeps its old value.
    Partial(Gpr),
    /// The arithmetic flags.
    Flags,
}

/// How an update's new value is computed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A constant.
    Const(u64),
    /// A copy of a register's 64 bits.
    Copy(Gpr),
    /// The value of an address expression (`lea`, `add r, imm`, `push`'s
    /// `rsp - 8`, `add r, r`).
    Lea(AddrExpr),
    /// A value loaded from memory, zero- or sign-extended: an opaque value
    /// of `size` bytes unless an 8-byte stack slot holds it.
    Load {
        /// Where it is loaded from.
        addr: AddrExpr,
        /// Bytes loaded.
        size: u32,
    },
    /// Interpretable arithmetic on these registers (and the flags): the
    /// instruction itself says which (`mnemonic`).
    Func {
        /// The operation.
        mnemonic: Mnemonic,
        /// The registers it reads.
        inputs: RegSet,
        /// Whether it reads the flags (`cmov`, `setcc`, `adc`, ...).
        flags: bool,
    },
    /// A value the interpreter cannot compute (a call's result, `rdtsc`,
    /// a vector register moved out, arithmetic with a memory operand):
    /// `width` bytes would be recorded.
    Opaque {
        /// Bytes that determine it.
        width: u8,
    },
}

/// One register update.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Update {
    /// What is written.
    pub dst: Dst,
    /// How.
    pub op: Op,
}

/// What an instruction does to memory and to the address registers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InsnProgram {
    /// Its memory references, as lackey counts them.
    pub refs: Vec<MemRef>,
    /// Its register updates (for a call: the state after the callee
    /// returns).
    pub updates: Vec<Update>,
    /// A call (not a system call): the callee may write the stack below
    /// `rsp`.
    pub call: bool,
    /// Registers recorded right before it when unknown: the instruction
    /// before it defines them and they feed addresses
    /// (`exec::mark_definitions`; empty as `forms` decodes it).
    pub before: RegSet,
    /// `rax` holds thread constant `k` here, taken first when unknown
    /// ([`full::Recorded::Once`]): the instruction starts a return point
    /// whose every way in is the return of a call to that constant's
    /// import (`exec::mark_once`; `None` as `forms` decodes it).
    pub once: Option<u8>,
    /// For a direct call to a procedure whose entry takes argument
    /// registers from its callers (`returns::Returns::args`): those
    /// registers, recorded right before the call when unknown (as
    /// `before`'s) and kept known across it, so that the callee's entry
    /// starts with them (`exec::mark_calls`; empty as `forms` decodes it).
    /// The call's return point never keeps them (its ways carry only
    /// `rsp` or the registers the ABI preserves).
    pub args: RegSet,
}

/// The address program of one block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockProgram {
    /// One per instruction, in order.
    pub insns: Vec<InsnProgram>,
}

/// The address programs of one procedure, with where control enters it.
#[derive(Clone, Debug)]
pub struct ProcProgram {
    /// One per block of the CFG.
    pub blocks: Vec<BlockProgram>,
    /// Successor blocks of each block (EXIT left out).
    pub succs: Vec<Vec<BlockId>>,
    /// Blocks entered from a caller (the entry, secondary entries).
    pub entries: Vec<BlockId>,
    /// Blocks the unwinder enters (C++ landing pads): no register is known
    /// there, `rsp` included.
    pub pads: Vec<BlockId>,
}

impl ProcProgram {
    /// The program of a procedure of a program database whose blocks,
    /// decoded, are `blocks` (no landing pad is seeded: nothing is known
    /// there).
    pub fn of_db(p: &ProcDb, blocks: &[Vec<(Instruction, InsnProgram)>]) -> Self {
        let n = blocks.len();
        let mut succs = vec![Vec::new(); n];
        for e in p.edges.iter().filter(|e| (e.to as usize) < n) {
            if let Some(s) = succs.get_mut(e.from as usize) {
                s.push(BlockId::new(e.to as usize));
            }
        }
        ProcProgram {
            blocks: (blocks.iter())
                .map(|b| BlockProgram {
                    insns: b.iter().map(|(_, prog)| prog.clone()).collect(),
                })
                .collect(),
            succs,
            entries: vec![BlockId::new(p.entry as usize)],
            pads: Vec::new(),
        }
    }

    /// The program of a CFG whose blocks' instructions are `insns`.
    pub fn new(cfg: &Cfg, insns: &[Vec<Instruction>], entries: &[u64], pads: &[u64]) -> Self {
        let mut info = InstructionInfoFactory::new();
        let blocks = insns
            .iter()
            .map(|b| BlockProgram {
                insns: b.iter().map(|i| forms::program(i, &mut info)).collect(),
            })
            .collect();
        let mut succs = vec![Vec::new(); cfg.blocks.len()];
        for e in cfg.edges.values() {
            if e.to != cfg.exit() {
                succs[e.from.index()].push(e.to);
            }
        }
        let at = |a: &u64| cfg.block_at(*a);
        let mut entries: Vec<BlockId> = entries.iter().filter_map(at).collect();
        if !entries.contains(&cfg.entry) {
            entries.insert(0, cfg.entry);
        }
        ProcProgram {
            blocks,
            succs,
            entries,
            pads: pads.iter().filter_map(at).collect(),
        }
    }
}

/// A block whose bytes are missing or decode differently from the CFG.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The module has no file bytes for the block.
    #[error("block {block:?} at {start:#x} has no file bytes")]
    NoBytes {
        /// The block.
        block: BlockId,
        /// Its start.
        start: u64,
    },
    /// An instruction does not decode where the CFG says one starts.
    #[error("block {block:?}: no instruction decodes at {at:#x}")]
    Mismatch {
        /// The block.
        block: BlockId,
        /// The instruction address.
        at: u64,
    },
}

/// Decodes the instructions of every block of `cfg` from `module`.
pub fn decode_blocks(module: &Module, cfg: &Cfg) -> Result<Vec<Vec<Instruction>>, DecodeError> {
    let mut out = Vec::with_capacity(cfg.blocks.len());
    for (id, b) in cfg.blocks.iter() {
        let bytes = module
            .bytes_at(b.start, b.end - b.start)
            .ok_or(DecodeError::NoBytes {
                block: id,
                start: b.start,
            })?;
        let mut d = Decoder::with_ip(64, bytes, b.start, DecoderOptions::NONE);
        let mut insns = Vec::with_capacity(b.insns.len());
        for &off in &b.insns {
            let insn = d.decode();
            let at = b.start + u64::from(off);
            if insn.ip() != at || insn.is_invalid() {
                return Err(DecodeError::Mismatch { block: id, at });
            }
            insns.push(insn);
        }
        out.push(insns);
    }
    Ok(out)
}
