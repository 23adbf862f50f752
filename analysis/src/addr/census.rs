//! The census: every memory reference of a procedure classified by how the
//! regenerator could rebuild its address, and the opaque definitions whose
//! values would have to be recorded (issue 21 point 1,
//! `docs/data-census.md`).
//!
//! A reference's class comes from its address's sources and shape in the
//! state before its instruction ([`value`](super::value)): an address
//! depending on an opaque definition is [`Class::Recorded`] (that
//! definition is then recorded, once per execution of its block, in the
//! bytes its value takes: a loop-invariant pointer defined before the loop
//! is paid before it); on a register's value at procedure entry,
//! [`Class::Entry`] (one 8-byte value per invocation and register, unless
//! the callers know it: an interprocedural question left open); otherwise
//! it is computable, and the shape says [`Class::Static`], [`Class::Stack`],
//! [`Class::Tls`] or, for any other computation, [`Class::Derived`].

use aetrace_graph::BlockId;

use super::flow::solve;
use super::value::{Shape, ShapeState, Shapes, Sites, Sources, SrcState, FIRST_SITE};
use super::{Access, ProcProgram, Repeat, Seg};

/// `rcx`, a `rep` instruction's count.
const RCX: usize = 1;

/// How a reference's address can be rebuilt.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// A constant: rip-relative or absolute.
    Static,
    /// Relative to the thread's `fs` (or `gs`) base.
    Tls,
    /// `rsp` at entry plus a constant.
    Stack,
    /// Computed from known values by interpretable arithmetic.
    Derived,
    /// Depends on a register's value at procedure entry.
    Entry,
    /// Depends on an opaque definition (or a gather's index vector).
    Recorded,
}

impl Class {
    /// All classes, in report order.
    pub const ALL: [Class; 6] = [
        Class::Static,
        Class::Tls,
        Class::Stack,
        Class::Derived,
        Class::Entry,
        Class::Recorded,
    ];

    /// The class's name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Static => "static",
            Class::Tls => "tls",
            Class::Stack => "stack",
            Class::Derived => "derived",
            Class::Entry => "entry",
            Class::Recorded => "recorded",
        }
    }
}

/// One classified reference.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RefClass {
    /// Its instruction's index in the block.
    pub insn: u32,
    /// L, S or M.
    pub access: Access,
    /// Bytes (0: depends on the CPU).
    pub size: u32,
    /// Times it happens per execution of its instruction: 1, or a `rep`
    /// instruction's constant count; `None` when that count is not known
    /// statically.
    pub times: Option<u64>,
    /// How its address is rebuilt.
    pub class: Class,
    /// Bytes recorded with the reference itself at each execution (a
    /// gather lane's index); 0 for the others.
    pub own_bytes: u8,
}

/// One opaque definition.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// Its block.
    pub block: BlockId,
    /// Bytes a record takes.
    pub width: u8,
    /// Some address depends on it: it would be recorded.
    pub feeds_address: bool,
}

/// The census of one procedure.
#[derive(Clone, Debug)]
pub struct ProcCensus {
    /// Per block: its references.
    pub blocks: Vec<Vec<RefClass>>,
    /// Its opaque definitions.
    pub sites: Vec<Site>,
    /// Registers whose entry value some address depends on.
    pub entry_values: u32,
    /// Whether stack slots were followed (no stack address escapes).
    pub slots_followed: bool,
}

impl ProcCensus {
    /// Runs both dataflows on `prog` and classifies its references.
    pub fn of(prog: &ProcProgram) -> Self {
        let mut shapes = Shapes { prog, follow: true };
        let mut shape_ins = solve(&shapes, &prog.succs);
        if shapes.escapes(&shape_ins) {
            shapes.follow = false;
            shape_ins = solve(&shapes, &prog.succs);
        }
        let sites = Sites::of(prog);
        let sources = Sources {
            shapes: &shapes,
            shape_ins: &shape_ins,
            sites: &sites,
        };
        let src_ins = solve(&sources, &prog.succs);
        let mut census = ProcCensus {
            blocks: Vec::with_capacity(prog.blocks.len()),
            sites: sites
                .sites
                .iter()
                .map(|&(block, width)| Site {
                    block,
                    width,
                    feeds_address: false,
                })
                .collect(),
            entry_values: 0,
            slots_followed: shapes.follow,
        };
        let mut entry_used = 0u32;
        for b in 0..prog.blocks.len() {
            let refs =
                census.classify_block(&sources, b, &shape_ins[b], &src_ins[b], &mut entry_used);
            census.blocks.push(refs);
        }
        census.entry_values = entry_used.count_ones();
        census
    }

    /// Classifies the references of block `b` from its in-states (a block
    /// no entry reaches is classified as if entered with nothing known).
    fn classify_block(
        &mut self,
        sources: &Sources<'_>,
        b: usize,
        shape_in: &Option<ShapeState>,
        src_in: &Option<SrcState>,
        entry_used: &mut u32,
    ) -> Vec<RefClass> {
        let prog = sources.shapes.prog;
        let mut shape = shape_in.clone().unwrap_or_else(ShapeState::unknown);
        let mut src = src_in.clone().unwrap_or_else(unknown_sources);
        let mut site = sources.sites.first[b];
        let mut out = Vec::new();
        for (k, insn) in prog.blocks[b].insns.iter().enumerate() {
            for r in &insn.refs {
                let srcs = src.addr(&r.addr);
                let class = if r.addr.vector_index || srcs.iter().any(|&s| s >= FIRST_SITE) {
                    Class::Recorded
                } else if !srcs.is_empty() {
                    Class::Entry
                } else if r.addr.seg != Seg::Flat {
                    Class::Tls
                } else {
                    match shape.addr(&r.addr) {
                        Shape::Const(_) => Class::Static,
                        Shape::Stack(_) => Class::Stack,
                        Shape::Tp(_) => Class::Tls,
                        Shape::Any => Class::Derived,
                    }
                };
                for &s in &srcs {
                    match s.checked_sub(FIRST_SITE) {
                        Some(i) => self.sites[i as usize].feeds_address = true,
                        None => *entry_used |= 1 << s,
                    }
                }
                out.push(RefClass {
                    insn: k as u32,
                    access: r.access,
                    size: r.size,
                    times: match (r.repeat, shape.regs[RCX]) {
                        (Repeat::Once, _) => Some(1),
                        (Repeat::Rcx, Shape::Const(n)) => Some(n),
                        _ => None,
                    },
                    class,
                    own_bytes: if r.addr.vector_index { 8 } else { 0 },
                });
            }
            src = sources.step(&shape, &src, insn, &mut site);
            shape = sources.shapes.step(&shape, insn);
        }
        out
    }
}

/// Every register an entry value: what a block no entry reaches starts with.
fn unknown_sources() -> SrcState {
    SrcState {
        regs: (0..16).map(|r| vec![r]).collect(),
        ..SrcState::default()
    }
}
