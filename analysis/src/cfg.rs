//! The recovered control-flow graph of one procedure.
//!
//! A `Cfg` is a set of basic blocks over the procedure's address ranges plus
//! the virtual EXIT vertex, which is `BlockId(blocks.len())`, one past the
//! last block, so that the ids are the same in [`Cfg::to_graph`].
//!
//! Invariants (checked by [`Cfg::check`], called by the builder in debug
//! builds):
//! - blocks are sorted by start address, non-empty, and disjoint, except
//!   that a block may lie inside the previous one when both end at the same
//!   address (a branch that skips a `lock` prefix lands on a second
//!   decoding of the same bytes, see `build`); `insns` are the
//!   offsets (from `start`) of the block's instructions, strictly increasing,
//!   starting at 0, each inside `[start, end)`;
//! - `entry` is a block (never EXIT);
//! - edge endpoints are blocks or EXIT; EXIT has no outgoing edge; no two
//!   edges share `(from, to)` (parallel transfers are one edge);
//! - an edge to EXIT has an exit kind (`Return`, `TailCall`, `NoReturn`,
//!   `Halt`), an edge between blocks has a local kind (`Resume` among them);
//! - a block of kind `Call` is the `block` of exactly one call site; every
//!   call site's block has kind `Call` unless it is a conditional tail call
//!   (a `jcc` to another procedure, a predicate whose taken edge goes to
//!   EXIT);
//! - `CallReturn` edges leave `Call` blocks only.

use aetrace_graph::{BlockId, EdgeId, EntityRef, Graph, GraphBuilder, PrimaryMap, VertexKind};

/// What a block is to the algorithms.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BlockKind {
    /// Ends in a jump, a branch, a return, or falls through.
    Plain,
    /// Ends in a call (direct, PLT, indirect) or an unconditional tail call.
    Call,
}

/// A basic block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// Link-time address of the block's first instruction.
    pub start: u64,
    /// Link-time address just past its last instruction.
    pub end: u64,
    /// Offsets from `start` of the block's instructions.
    pub insns: Vec<u32>,
    /// Whether the block ends in a call.
    pub kind: BlockKind,
}

impl Block {
    /// Address of the block's last instruction.
    pub fn last_insn(&self) -> u64 {
        self.start + u64::from(*self.insns.last().expect("blocks are non-empty"))
    }
}

/// How control moves along an edge.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum EdgeKind {
    /// To the next instruction, without a branch.
    FallThrough,
    /// A taken direct branch (or the abort target of `xbegin`).
    Taken,
    /// One case of a resolved jump table.
    JumpTable,
    /// From a call block to the block after the call (the callee returned).
    CallReturn,
    /// To EXIT: a return instruction.
    Return,
    /// To EXIT: a tail call (direct or indirect jump, or a fall-through, to
    /// another procedure, or an indirect jump we could not resolve).
    TailCall,
    /// To EXIT: a call to a procedure that never returns.
    NoReturn,
    /// To EXIT: an instruction that stops the thread (`hlt`, `ud2`) with
    /// no code of the procedure after it.
    Halt,
    /// From a trap (`hlt`, `ud2`) to the procedure's code right after it:
    /// the thread goes on there only if a signal handler moves rip past
    /// the trap (`ucontext`'s `REG_RIP`), then as after a fall-through.
    Resume,
}

impl EdgeKind {
    /// The kind's name in reports and `aetrace cfg --json`.
    pub fn as_str(self) -> &'static str {
        match self {
            EdgeKind::FallThrough => "fallthrough",
            EdgeKind::Taken => "taken",
            EdgeKind::JumpTable => "jumptable",
            EdgeKind::CallReturn => "callreturn",
            EdgeKind::Return => "return",
            EdgeKind::TailCall => "tailcall",
            EdgeKind::NoReturn => "noreturn",
            EdgeKind::Halt => "halt",
            EdgeKind::Resume => "resume",
        }
    }
    /// Whether the edge goes to EXIT.
    pub fn is_exit(self) -> bool {
        matches!(
            self,
            EdgeKind::Return | EdgeKind::TailCall | EdgeKind::NoReturn | EdgeKind::Halt
        )
    }
}

/// An edge of the CFG.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CfgEdge {
    /// The source block.
    pub from: BlockId,
    /// The target block, or EXIT (`BlockId(blocks.len())`).
    pub to: BlockId,
    /// How control moves along the edge.
    pub kind: EdgeKind,
}

/// How a call site reaches its callee.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// `call rel32` / `jmp rel32` to a procedure of this module.
    Direct,
    /// A direct call or jump to a PLT stub (the callee is an import).
    Plt,
    /// Through a register or memory (GOT calls of `-fno-plt` included).
    Indirect,
    /// A `syscall` instruction: a call into the kernel that returns, unless
    /// it is `exit` or `exit_group` (the thread or the process ends inside
    /// it, so the instructions after it in the block never run).
    Syscall,
}

impl CallKind {
    /// The kind's name in reports and `aetrace cfg --json`.
    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Direct => "direct",
            CallKind::Plt => "plt",
            CallKind::Indirect => "indirect",
            CallKind::Syscall => "syscall",
        }
    }
}

/// A call (or tail call) leaving the procedure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallSite {
    /// The call block (the call is its last instruction).
    pub block: BlockId,
    /// How the call reaches its callee.
    pub kind: CallKind,
    /// The callee's address, for direct and PLT calls.
    pub target: Option<u64>,
    /// The callee's name when known (import name for PLT/GOT calls).
    pub name: Option<String>,
    /// Whether control may come back (false: the callee never returns).
    pub returns: bool,
    /// A tail call: the block leaves for EXIT instead of a call-return edge.
    pub tail: bool,
}

/// How an indirect jump was classified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JumpResolution {
    /// A jump table: these are its (possibly repeated) targets, in table order.
    Table {
        /// Link-time address of the table.
        table: u64,
        /// The targets, one per table entry.
        targets: Vec<u64>,
    },
    /// The target is a constant on every path (a code address formed with
    /// `lea` in another block, glibc's printf): the distinct targets. Empty
    /// when no path can reach the jump (its guards compare constants).
    Computed(Vec<u64>),
    /// Jumps to a pointer loaded from memory without a table index (GOT slot,
    /// function pointer field): an indirect tail call, see `docs/cfg.md`.
    TailCall,
    /// Not resolved (the reason says which part of the pattern is missing).
    Unresolved(&'static str),
}

/// An indirect `jmp`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndirectJump {
    /// The block the jump ends.
    pub block: BlockId,
    /// Link-time address of the jump instruction.
    pub addr: u64,
    /// What the jump was found to be.
    pub resolution: JumpResolution,
}

impl IndirectJump {
    /// Whether the analysis could not bound the jump's targets.
    pub fn is_unresolved(&self) -> bool {
        matches!(self.resolution, JumpResolution::Unresolved(_))
    }
}

/// One procedure's CFG.
#[derive(Clone, Debug)]
pub struct Cfg {
    /// The basic blocks; EXIT is the id one past the last.
    pub blocks: PrimaryMap<BlockId, Block>,
    /// The block control enters at (the procedure's primary start).
    pub entry: BlockId,
    /// The edges, between blocks and to EXIT.
    pub edges: PrimaryMap<EdgeId, CfgEdge>,
    /// Every call and tail call leaving the procedure.
    pub calls: Vec<CallSite>,
    /// Every indirect jump, resolved or not.
    pub indirect_jumps: Vec<IndirectJump>,
}

impl Cfg {
    /// The EXIT vertex.
    pub fn exit(&self) -> BlockId {
        BlockId::new(self.blocks.len())
    }

    /// The block starting at `addr`.
    pub fn block_at(&self, addr: u64) -> Option<BlockId> {
        let s = self.blocks.as_slice();
        s.binary_search_by_key(&addr, |b| b.start)
            .ok()
            .map(BlockId::new)
    }

    /// Blocks with two or more distinct successors.
    pub fn num_predicates(&self) -> usize {
        let mut outs = vec![0u32; self.blocks.len() + 1];
        for e in self.edges.values() {
            outs[e.from.index()] += 1;
        }
        outs.iter().filter(|&&n| n >= 2).count()
    }

    /// The abstract graph the placement algorithms run on: the same
    /// `BlockId`s, EXIT last, `Call` blocks as call vertices.
    pub fn to_graph(&self) -> Graph {
        let mut b = GraphBuilder::new();
        for blk in self.blocks.values() {
            b.add_vertex(match blk.kind {
                BlockKind::Plain => VertexKind::Plain,
                BlockKind::Call => VertexKind::Call,
            });
        }
        let exit = b.add_vertex(VertexKind::Exit);
        debug_assert_eq!(exit, self.exit());
        for e in self.edges.values() {
            let id = b.add_edge(e.from, e.to);
            debug_assert_eq!(self.edges[id].from, e.from, "edge ids agree");
        }
        b.finish(self.entry, exit)
    }

    /// Checks the invariants listed at the top of this module.
    pub fn check(&self) -> Result<(), String> {
        let exit = self.exit();
        let (mut prev_start, mut prev_end) = (0, 0);
        for (id, b) in self.blocks.iter() {
            let alias = b.start > prev_start && b.end == prev_end;
            if b.start >= b.end || (b.start < prev_end && !alias) {
                return Err(format!(
                    "{id} [{:#x}, {:#x}) is empty or overlaps",
                    b.start, b.end
                ));
            }
            (prev_start, prev_end) = (b.start, b.end);
            if b.insns.first() != Some(&0)
                || b.insns.windows(2).any(|w| w[0] >= w[1])
                || b.start + u64::from(*b.insns.last().unwrap_or(&0)) >= b.end
            {
                return Err(format!(
                    "{id} at {:#x} has bad instruction offsets",
                    b.start
                ));
            }
        }
        if self.entry.index() >= self.blocks.len() {
            return Err("entry is not a block".into());
        }
        let mut seen = std::collections::HashSet::new();
        for (id, e) in self.edges.iter() {
            if e.from.index() >= self.blocks.len() || e.to.index() > self.blocks.len() {
                return Err(format!("{id} has an endpoint out of range"));
            }
            if e.kind.is_exit() != (e.to == exit) {
                return Err(format!("{id} {} -> {} has kind {:?}", e.from, e.to, e.kind));
            }
            if e.kind == EdgeKind::CallReturn && self.blocks[e.from].kind != BlockKind::Call {
                return Err(format!("{id}: call-return edge from non-call {}", e.from));
            }
            if !seen.insert((e.from, e.to)) {
                return Err(format!("{id} duplicates {} -> {}", e.from, e.to));
            }
        }
        let mut call_blocks = std::collections::HashSet::new();
        for c in &self.calls {
            if !self.blocks.is_valid(c.block) {
                return Err(format!("call site at {} out of range", c.block));
            }
            let is_call = self.blocks[c.block].kind == BlockKind::Call;
            if is_call && !call_blocks.insert(c.block) {
                return Err(format!("{} has two call sites", c.block));
            }
            if !is_call && !c.tail {
                return Err(format!("{} is not a call block", c.block));
            }
        }
        for (id, b) in self.blocks.iter() {
            if b.kind == BlockKind::Call && !call_blocks.contains(&id) {
                return Err(format!("call block {id} has no call site"));
            }
        }
        Ok(())
    }
}
