//! A program database compiled for the regenerator's hot loop (DESIGN.md
//! decision 7; paper 003 Section 4.2).
//!
//! Every traced block of every procedure gets a module-wide index
//! ([`BlockIx`], numbered in procedure order; procedures are [`ProcIx`],
//! the database's numbers); per block a
//! dense successor list `(target, witness, kind)` and, for a predicate, the
//! sorted `(witness, successor)` pairs of its witness sets (Figure 7's
//! choice is one binary search); and the block's output bytes in the chosen
//! format, formatted once, so emitting a block is one copy.
//!
//! Invariants: the witness numbers stored in the database are exactly the
//! numbering `WitnessPlacement::from_edges` gives the witness edges of the
//! procedure's `Graph` (checked, else [`Error::Database`]); a witness that
//! is in the sets of two successors of one predicate (a placement that does
//! not solve `Trace(G, epl)`) is recorded as [`AMBIGUOUS`] and is an error
//! only if the stream ever uses it there.
//!
//! The signal map (docs/regen.md, "Signals"): every range of every copy's
//! [`SigMap`](aetrace_format::progdb::SigMap), sorted by link-time address,
//! its points resolved to global block indices, so a SIGNAL record's rip
//! is placed with one binary search ([`Module::locate`]).
//!
//! Typed indices (`aetrace_graph::entity`): [`BlockIx`] and [`ProcIx`] name
//! a module's blocks and procedures; the trace's and database's raw `u32`s
//! (a procedure-local block, an ENTER payload, `CallDb`'s procedure and
//! landing pad) are converted where they are read. Successor, choice,
//! text and length ranges stay raw offsets into their arrays.

use crate::error::{Error, Result};
use crate::output::Format;
use aetrace_format::addrtrace::{AccessKind, AddrRecord};
use aetrace_format::progdb::{CallDb, EdgeKindDb, ProgramDb, SigPoint};
use aetrace_graph::trace::{witness_sets, Sym, WitnessPlacement};
use aetrace_graph::{EdgeId, EntityRef, GraphBuilder, PrimaryMap, VertexKind};

aetrace_graph::entity!(
    /// A traced block of a module: its index in [`Module::blocks`].
    pub struct BlockIx,
    "block"
);
aetrace_graph::entity!(
    /// A procedure of a module: its index in [`Module::procs`] (the
    /// database's procedure number).
    pub struct ProcIx,
    "proc"
);

/// `Succ::to` of an edge to EXIT, `Block::next` of a block without a
/// fast path.
pub const EXIT: BlockIx = BlockIx(u32::MAX);
/// A block index no module has (`summary`'s "not computed yet").
pub const NO_BLOCK: BlockIx = BlockIx(u32::MAX - 1);
/// `Succ::witness` of an edge without a witness.
pub const NO_WITNESS: u32 = u32::MAX;
/// A choice whose witness is in two successors' sets.
pub const AMBIGUOUS: u32 = u32::MAX;

/// One successor edge of a block.
#[derive(Clone, Copy, Debug)]
pub struct Succ {
    /// The target, or [`EXIT`].
    pub to: BlockIx,
    /// The witness number written when control takes this edge.
    pub witness: u32,
    /// How control leaves along the edge.
    pub kind: EdgeKindDb,
    /// The witness is written before the block's last instruction (a
    /// `ret`, `jmp` or `hlt` leaves by this edge), not after it.
    pub early: bool,
}

/// Where a signal's interrupted rip stands (a resolved
/// [`SigPoint`]; blocks are global indices).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SigAt {
    /// In untraced code.
    Outside,
    /// Before instruction `insn` of `block`.
    Insn {
        /// The block.
        block: BlockIx,
        /// The instruction's index in the block.
        insn: u32,
    },
    /// Block `from` completed, the witness of its edge not written yet.
    Witness {
        /// The completed block.
        from: BlockIx,
    },
    /// Call block `block` returned; its RETURN record is not written yet.
    Returned {
        /// The call block.
        block: BlockIx,
    },
}

/// One range of the module's signal map.
#[derive(Clone, Copy, Debug)]
struct SigEntry {
    /// Link-time address of the range's first byte.
    start: u64,
    /// `None`: not in any copy (after a copy's end).
    point: Option<SigPoint>,
    /// Global index of the first block of the procedure the range's
    /// blocks and edges belong to.
    base: u32,
    /// For `Witness`: the edge's source block.
    from: BlockIx,
}

/// One traced block.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    /// The procedure the block belongs to.
    pub proc: ProcIx,
    /// Link-time address.
    pub start: u64,
    /// Length in bytes.
    pub size: u32,
    /// Number of instructions.
    pub ninsns: u32,
    /// The call the block ends with, if any.
    pub call: Option<CallDb>,
    /// `succs[succ_lo..succ_hi]`.
    pub succ_lo: u32,
    /// End (exclusive) of the block's successors in `succs`.
    pub succ_hi: u32,
    /// `choices[choice_lo..choice_hi]`, sorted by witness (predicates only).
    pub choice_lo: u32,
    /// End (exclusive) of the block's choices in `choices`.
    pub choice_hi: u32,
    /// `text[text_lo..text_hi]`: the block's output.
    pub text_lo: usize,
    /// End (exclusive) of the block's output in `text`.
    pub text_hi: usize,
    /// The only successor, when control always goes there without a call,
    /// a witness or EXIT (the regenerator's fast path); else [`EXIT`].
    pub next: BlockIx,
    /// `lens[lens_lo..lens_lo + ninsns]`: instruction lengths.
    pub lens_lo: u32,
}

/// One procedure.
#[derive(Clone, Debug)]
pub struct Proc {
    /// The procedure's symbol name.
    pub name: String,
    /// Whether the rewriter traced it (else it was left alone).
    pub traced: bool,
    /// Its path depends on the copies' addresses
    /// (`ProgramDb::copy_dependent`).
    pub copy_dependent: bool,
    /// The entry block ([`EXIT`] when not traced).
    pub entry: BlockIx,
    /// Its blocks' global indices (sorted by start; empty when not traced).
    pub blocks: std::ops::Range<u32>,
}

/// A compiled module.
#[derive(Debug, Default)]
pub struct Module {
    /// How messages name the module (its path).
    pub name: String,
    /// The procedures, in program database order.
    pub procs: PrimaryMap<ProcIx, Proc>,
    /// The traced blocks of all procedures.
    pub blocks: PrimaryMap<BlockIx, Block>,
    /// The successors of all blocks (each block owns a range).
    pub succs: Vec<Succ>,
    /// `(witness, index into succs)`, `AMBIGUOUS` for a shared witness.
    pub choices: Vec<(u32, u32)>,
    /// The preformatted output of all blocks (each block owns a range).
    pub text: Vec<u8>,
    /// The module tag ENTER and LANDING records name it by (0 for the
    /// executable, a library's module id).
    pub tag: u32,
    /// Its module id in the trace (an exec'd image's executable has
    /// another id than 0, its tag).
    pub id: u32,
    /// Its blocks are output and counted (`--module` hides the others).
    pub shown: bool,
    /// The instruction lengths of all blocks (each block owns a range).
    pub lens: Vec<u8>,
    format: Option<Format>,
    addressing: Option<Addressing>,
    /// Run-time address of link-time address 0 (SIGNAL rips are run-time).
    pub load_base: u64,
    /// The module's number in [`Format::Runs`] records.
    number: u32,
    sigmap: Vec<SigEntry>,
    /// Link-time addresses of the runtime blob and what the rewriter puts
    /// between it and the first copy (its data page, jump tables): from
    /// `runtime_vaddr` to the lowest copy. A SIGNAL's rip there is the
    /// runtime's own (the runtime reports a signal in an entry point's
    /// windows where signals are not blocked at the point that called it:
    /// a buffer check, a fork's return point, an outside-entry stub, or
    /// where the first of two signals struck, `docs/runtime.md` section
    /// 5), never untraced code of the program, which regen could
    /// otherwise take it for.
    runtime: std::ops::Range<u64>,
    /// Every return (a [`EdgeKindDb::Return`] edge taken) is a counted
    /// transfer (`ProgramDb::counts_returns`).
    pub counts_returns: bool,
    /// The jump tables the copies read in place of the originals
    /// (`ProgramDb::moved_tables`).
    pub moved_tables: Vec<aetrace_format::progdb::MovedTable>,
    /// Link-time addresses from the lowest copy to the end of the highest:
    /// the one comparison most recorded addresses (heap, stack) need.
    moved_span: std::ops::Range<u64>,
}

/// Where output addresses come from.
#[derive(Clone, Copy, Debug)]
pub enum Addressing {
    /// `load_base + vaddr`: the run's addresses.
    Runtime {
        /// Run-time address of link-time address 0.
        load_base: u64,
    },
    /// `vaddr - link_base`.
    Relative {
        /// The link-time address printed as 0.
        link_base: u64,
    },
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends `v` in lowercase hex without leading zeros.
pub fn push_hex(out: &mut Vec<u8>, v: u64) {
    push_hex_min(out, v, 1);
}

/// Appends `v` in lowercase hex, zero-padded to at least `min` digits
/// (`{v:0min$x}`).
pub fn push_hex_min(out: &mut Vec<u8>, v: u64, min: usize) {
    debug_assert!(min <= 16, "a u64 has 16 hex digits");
    let digits = (16 - (v | 1).leading_zeros() as usize / 4).max(min);
    for i in (0..digits).rev() {
        out.push(HEX[((v >> (i * 4)) & 15) as usize]);
    }
}

/// Appends `v` in decimal.
pub fn push_dec(out: &mut Vec<u8>, v: u64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    let mut v = v;
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[i..]);
}

impl Module {
    /// Compiles `db`. `format` `None` formats no text (counting);
    /// `number` names the module in [`Format::Runs`] records.
    pub fn compile(
        name: &str,
        number: u32,
        db: &ProgramDb,
        format: Option<Format>,
        addressing: Addressing,
    ) -> Result<Module> {
        let mut m = Module {
            name: name.to_owned(),
            number,
            shown: true,
            format,
            addressing: Some(addressing),
            counts_returns: db.counts_returns,
            moved_tables: db.moved_tables.clone(),
            moved_span: (db.moved_tables.iter().map(|t| t.new).min().unwrap_or(0))
                ..(db
                    .moved_tables
                    .iter()
                    .map(|t| t.new + t.size)
                    .max()
                    .unwrap_or(0)),
            ..Module::default()
        };
        // Global indices first: a call may name any procedure's entry.
        let mut first = Vec::with_capacity(db.procs.len());
        let mut total = 0u32;
        for p in &db.procs {
            first.push(total);
            if p.is_traced() {
                total = u32::try_from(p.blocks.len())
                    .ok()
                    .and_then(|n| total.checked_add(n))
                    .filter(|&t| t < EXIT.as_u32())
                    .ok_or_else(|| Error::Usage(format!("{name}: too many blocks")))?;
            }
        }
        for (pi, p) in db.procs.iter().enumerate() {
            m.procs.push(Proc {
                name: p.name.clone(),
                traced: p.is_traced(),
                copy_dependent: db.copy_dependent.contains(&(pi as u32)),
                // `check` bounds a traced entry; another one is never used.
                entry: if p.is_traced() {
                    BlockIx(first[pi] + p.entry)
                } else {
                    EXIT
                },
                blocks: if p.is_traced() {
                    first[pi]..first[pi] + p.blocks.len() as u32
                } else {
                    0..0
                },
            });
            if !p.is_traced() {
                continue;
            }
            let derr = |what: String| Error::Database {
                module: name.to_owned(),
                proc: p.name.clone(),
                what,
            };
            // The graph the rewriter placed witnesses on: call vertices are
            // the blocks that end in a call or an unconditional tail call (a
            // conditional tail call, like a PLT stub's jump with its lazy
            // binding alternative, is a predicate).
            let mut out_degree = vec![0u32; p.blocks.len()];
            for e in &p.edges {
                if let Some(d) = out_degree.get_mut(e.from as usize) {
                    *d += 1;
                }
            }
            let mut gb = GraphBuilder::new();
            for (b, d) in p.blocks.iter().zip(&out_degree) {
                gb.add_vertex(match b.call {
                    Some(c) if !c.tail || *d == 1 => VertexKind::Call,
                    _ => VertexKind::Plain,
                });
            }
            let exit = gb.add_vertex(VertexKind::Exit);
            for e in &p.edges {
                gb.add_edge(
                    aetrace_graph::BlockId::from_u32(e.from),
                    aetrace_graph::BlockId::from_u32(e.to),
                );
            }
            let g = gb.finish(aetrace_graph::BlockId::from_u32(p.entry), exit);
            let in_epl: Vec<bool> = p.edges.iter().map(|e| e.witness.is_some()).collect();
            let pl = WitnessPlacement::from_edges(&g, &in_epl, 0, true);
            for (ei, e) in p.edges.iter().enumerate() {
                let placed = pl.witness(EdgeId::new(ei));
                if placed != e.witness.map(u32::from) {
                    return Err(derr(format!(
                        "edge {ei} ({} -> {}) has witness {:?} but the placement numbering (witness edges numbered in edge order) gives it {placed:?}",
                        e.from, e.to, e.witness
                    )));
                }
            }
            let sets = witness_sets(&g, &pl);
            let base = first[pi];
            // A witness edge with no "witness not written yet" range in the
            // copy writes its witness before the block's last instruction.
            let mut late = vec![false; p.edges.len()];
            if let Some(map) = &p.sigmap {
                let end = map.start.wrapping_add(map.len);
                for r in &map.ranges {
                    let (point_base, from) = match r.point {
                        SigPoint::Insn { proc, .. } => (first[proc as usize], EXIT),
                        SigPoint::Witness { edge } => {
                            late[edge as usize] = true;
                            (base, BlockIx(base + p.edges[edge as usize].from))
                        }
                        _ => (base, EXIT),
                    };
                    m.sigmap.push(SigEntry {
                        start: map.start.wrapping_add(r.offset),
                        point: Some(r.point),
                        base: point_base,
                        from,
                    });
                }
                m.sigmap.push(SigEntry {
                    start: end,
                    point: None,
                    base,
                    from: EXIT,
                });
            }
            for (bi, b) in p.blocks.iter().enumerate() {
                let v = aetrace_graph::BlockId::new(bi);
                let succ_lo = m.succs.len() as u32;
                for &e in g.succs(v) {
                    let ed = &p.edges[e.index()];
                    m.succs.push(Succ {
                        to: if ed.to == p.exit() {
                            EXIT
                        } else {
                            BlockIx(base + ed.to)
                        },
                        witness: ed.witness.map_or(NO_WITNESS, u32::from),
                        kind: ed.kind,
                        early: p.sigmap.is_some() && ed.witness.is_some() && !late[e.index()],
                    });
                }
                let choice_lo = m.choices.len();
                if g.is_predicate(v) {
                    for (k, &e) in g.succs(v).iter().enumerate() {
                        for s in sets.set(e) {
                            if let Sym::W(w) = *s {
                                m.choices.push((w, succ_lo + k as u32));
                            }
                        }
                    }
                    let cs = &mut m.choices[choice_lo..];
                    cs.sort_unstable();
                    // A witness in two successors' sets: keep one entry, ambiguous.
                    let mut out = choice_lo;
                    for i in choice_lo..m.choices.len() {
                        let (w, s) = m.choices[i];
                        if out > choice_lo && m.choices[out - 1].0 == w {
                            m.choices[out - 1].1 = AMBIGUOUS;
                        } else {
                            m.choices[out] = (w, s);
                            out += 1;
                        }
                    }
                    m.choices.truncate(out);
                }
                let text_lo = m.text.len();
                let addr = match addressing {
                    Addressing::Runtime { load_base } => load_base.wrapping_add(b.start),
                    Addressing::Relative { link_base } => b.start.wrapping_sub(link_base),
                };
                match format {
                    Some(f) if f.runs() => {
                        let n = b.insn_lens.len() as u32;
                        run_record(&mut m.text, number, m.blocks.len() as u32, 0, n);
                    }
                    Some(f) => format_block(&mut m.text, f, addr, &b.insn_lens)
                        .map_err(|what| derr(format!("block {:#x}: {what}", b.start)))?,
                    None => {}
                }
                let only = &m.succs[succ_lo as usize..];
                let next = match only {
                    [s] if b.call.is_none() && s.witness == NO_WITNESS => s.to,
                    _ => EXIT,
                };
                let lens_lo = m.lens.len() as u32;
                m.lens.extend_from_slice(&b.insn_lens);
                m.blocks.push(Block {
                    lens_lo,
                    next,
                    proc: ProcIx::new(pi),
                    start: b.start,
                    size: b.size() as u32,
                    ninsns: b.insn_lens.len() as u32,
                    // Landing pads become global block indices like successors.
                    call: b.call.map(|c| aetrace_format::progdb::CallDb {
                        landing: c.landing.map(|l| base + l),
                        ..c
                    }),
                    succ_lo,
                    succ_hi: m.succs.len() as u32,
                    choice_lo: choice_lo as u32,
                    choice_hi: m.choices.len() as u32,
                    text_lo,
                    text_hi: m.text.len(),
                });
            }
        }
        debug_assert_eq!(m.blocks.len(), total as usize);
        // Copies do not overlap: sorted by address, a copy's end entry
        // comes before (or at) the next copy's first.
        m.sigmap.sort_by_key(|e| (e.start, e.point.is_some()));
        if db.runtime_vaddr != 0 {
            let copies = m.sigmap.first().map_or(db.runtime_vaddr, |e| e.start);
            m.runtime = db.runtime_vaddr..copies;
        }
        Ok(m)
    }

    /// The original program's run-time address for run-time data address
    /// `a` of the rewritten one: a copied jump table's entry is the
    /// original table's (`progdb::original_address`).
    #[inline]
    pub fn original_data_address(&self, a: u64) -> u64 {
        let link = a.wrapping_sub(self.load_base);
        if !self.moved_span.contains(&link) {
            return a;
        }
        let orig = aetrace_format::progdb::original_address(&self.moved_tables, link);
        orig.wrapping_add(self.load_base)
    }

    /// Where run-time address `rip` stands, by the signal map, and whether
    /// it is inside instrumentation (not a copied instruction): untraced
    /// code outside every copy; an error for an address inside a copy that
    /// is no instruction boundary an interrupted thread can stand at, or
    /// inside the runtime.
    pub fn locate(&self, rip: u64) -> std::result::Result<(SigAt, bool), String> {
        let a = rip.wrapping_sub(self.load_base);
        if self.runtime.contains(&a) {
            return Err(format!(
                "address {a:#x} is in the aetrace runtime (offset {:#x}), where the runtime blocks signals (it reports one at an entry point's edges where its caller or the first handler's signal stands)",
                a - self.runtime.start
            ));
        }
        let i = self.sigmap.partition_point(|e| e.start <= a);
        let Some(e) = i.checked_sub(1).map(|i| self.sigmap[i]) else {
            return Ok((SigAt::Outside, false));
        };
        let Some(point) = e.point else {
            return Ok((SigAt::Outside, false));
        };
        let instrumentation = !matches!(point, SigPoint::Insn { count: 1.., .. });
        let at = match point {
            SigPoint::Outside => SigAt::Outside,
            SigPoint::Insn {
                block, insn, count, ..
            } => {
                let block = BlockIx(e.base + block);
                let mut at = e.start;
                let mut k = insn;
                if count > 0 {
                    let lens = self.insn_lens(block);
                    while at < a && k < insn + count {
                        at += u64::from(lens[k as usize]);
                        k += 1;
                    }
                    if at != a || k == insn + count {
                        return Err(format!(
                            "address {a:#x} is inside the copy of an instruction of block {}",
                            self.block_name(block)
                        ));
                    }
                }
                SigAt::Insn { block, insn: k }
            }
            SigPoint::Witness { .. } => SigAt::Witness { from: e.from },
            SigPoint::Returned { block } => SigAt::Returned {
                block: BlockIx(e.base + block),
            },
        };
        Ok((at, instrumentation))
    }

    /// Whether run-time address `rip` starts the instrumentation standing
    /// before instruction `insn` of a block (its lead: where the runtime's
    /// `sigreturn` sends a handler's return to that instruction, and a
    /// run arriving there passes): the first byte of a signal-map range
    /// standing before that instruction.
    pub fn starts_lead(&self, rip: u64) -> bool {
        let a = rip.wrapping_sub(self.load_base);
        let i = self.sigmap.partition_point(|e| e.start <= a);
        i.checked_sub(1).is_some_and(|i| {
            let e = self.sigmap[i];
            e.start == a && matches!(e.point, Some(SigPoint::Insn { count: 0, .. }))
        })
    }

    /// The block of traced procedure `p` that starts at link-time
    /// address `a` (where an unresolved jump's copy goes on).
    pub fn block_starting(&self, p: ProcIx, a: u64) -> Option<BlockIx> {
        let r = self.procs[p].blocks.clone();
        let blocks = &self.blocks.as_slice()[r.start as usize..r.end as usize];
        let i = blocks.binary_search_by_key(&a, |b| b.start).ok()?;
        Some(BlockIx(r.start + i as u32))
    }

    /// The traced procedure whose blocks hold link-time address `a`, and
    /// whether `a` is its entry (an unresolved jump's target outside its
    /// procedure: an entry is a springboard, elsewhere the original code
    /// runs untraced).
    pub fn traced_at(&self, a: u64) -> Option<(ProcIx, bool)> {
        self.procs.iter().find_map(|(pi, p)| {
            let blocks = &self.blocks.as_slice()[p.blocks.start as usize..p.blocks.end as usize];
            let inside = blocks
                .iter()
                .any(|b| a >= b.start && a < b.start + u64::from(b.size));
            inside.then(|| (pi, p.entry != EXIT && self.blocks[p.entry].start == a))
        })
    }

    /// Instruction lengths of block `b`.
    pub fn insn_lens(&self, b: BlockIx) -> &[u8] {
        let b = &self.blocks[b];
        &self.lens[b.lens_lo as usize..(b.lens_lo + b.ninsns) as usize]
    }

    /// Appends the output of instructions `from..to` of block `b` (a part
    /// of a block split by a signal; nothing when counting).
    pub fn part(&self, b: BlockIx, from: u32, to: u32, out: &mut Vec<u8>) {
        let (Some(f), Some(addressing)) = (self.format, self.addressing) else {
            return;
        };
        if from >= to {
            return;
        }
        if f.runs() {
            return run_record(out, self.number, b.as_u32(), from, to);
        }
        let lens = self.insn_lens(b);
        let skip: u64 = lens[..from as usize].iter().map(|&l| u64::from(l)).sum();
        let start = self.blocks[b].start + skip;
        let addr = match addressing {
            Addressing::Runtime { load_base } => load_base.wrapping_add(start),
            Addressing::Relative { link_base } => start.wrapping_sub(link_base),
        };
        // Formatting succeeded for the whole block at compile time.
        let _ = format_block(out, f, addr, &lens[from as usize..to as usize]);
    }

    /// Appends the output of instructions `from..at` of block `b`, cut by
    /// a signal before instruction `at`, and of instruction `at` too when
    /// it `raised` the signal (a fault): the runs formats give that one a
    /// record of its own, marked [`crate::visit::BlockRun::faults`].
    pub fn part_before_signal(
        &self,
        b: BlockIx,
        from: u32,
        at: u32,
        raised: bool,
        out: &mut Vec<u8>,
    ) {
        if !(raised && self.format.is_some_and(Format::runs) && self.addressing.is_some()) {
            return self.part(b, from, at + u32::from(raised), out);
        }
        self.part(b, from, at, out);
        let module = self.number | crate::visit::FAULTS;
        run_record(out, module, b.as_u32(), at, at + 1);
    }

    /// Appends `# signal SIGNO`, where the recorded run took an
    /// asynchronous signal, to the text formats that carry comments
    /// (`insn`, `block`; nothing when counting or for `din`, `xdin`,
    /// `bin`); the in-process formats ([`Format::Runs`],
    /// [`Format::RunSegments`]) get its delivery record (the SIGNAL
    /// record's stream `offset`).
    pub fn signal_note(&self, signo: u32, offset: u64, out: &mut Vec<u8>) {
        if self.format.is_some_and(Format::comments) {
            out.extend_from_slice(b"# signal ");
            push_dec(out, u64::from(signo));
            out.push(b'\n');
        } else if self.format.is_some_and(Format::runs) {
            crate::visit::signal_record(signo, offset, out);
        }
    }

    /// Appends the in-process formats' record of the return of the handler
    /// the SIGNAL record at stream `offset` entered, which `moved` the rip
    /// or not (nothing for the other formats); its length.
    pub fn return_note(&self, offset: u64, moved: bool, out: &mut Vec<u8>) -> usize {
        let at = out.len();
        if self.format.is_some_and(Format::runs) {
            crate::visit::sigreturn_record(offset, moved, out);
        }
        out.len() - at
    }

    /// The successor of predicate `b` whose witness set holds `w`
    /// (`Some(AMBIGUOUS)` if two do).
    #[inline]
    pub fn choose(&self, b: &Block, w: u32) -> Option<u32> {
        let cs = &self.choices[b.choice_lo as usize..b.choice_hi as usize];
        cs.binary_search_by_key(&w, |&(cw, _)| cw)
            .ok()
            .map(|i| cs[i].1)
    }

    /// How messages name a block: `0x401000`.
    pub fn block_name(&self, b: BlockIx) -> String {
        format!("{:#x}", self.blocks[b].start)
    }

    /// How messages name an edge target.
    pub fn target_name(&self, to: BlockIx) -> String {
        if to == EXIT {
            "EXIT".into()
        } else {
            format!("block {}", self.block_name(to))
        }
    }

    /// The block's output bytes.
    #[inline]
    pub fn text(&self, b: &Block) -> &[u8] {
        &self.text[b.text_lo..b.text_hi]
    }

    /// Whether summarised segments are output as segment records
    /// ([`Format::RunSegments`]).
    pub(crate) fn segment_records(&self) -> bool {
        self.format == Some(Format::RunSegments)
    }

    /// Appends a segment record ([`crate::visit::Segment`]): the first
    /// `blocks` blocks of segment `number` of this module, from read point
    /// `read` for witness `witness`.
    pub(crate) fn segment_record(
        &self,
        out: &mut Vec<u8>,
        read: BlockIx,
        number: u32,
        witness: u32,
        blocks: u32,
    ) {
        debug_assert!(witness <= 0xFFFF && blocks <= 0xFFFF);
        let words = [
            self.number | crate::visit::SEGMENT,
            read.as_u32(),
            number,
            witness << 16 | blocks,
        ];
        out.extend(words.iter().flat_map(|v| v.to_le_bytes()));
    }
}

/// Appends a [`Format::Runs`] record: instructions `from..to` of block
/// `block` of module `module` (`crate::visit` reads them).
fn run_record(out: &mut Vec<u8>, module: u32, block: u32, from: u32, to: u32) {
    for v in [module, block, from, to] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Appends the output of one block at run-time address `addr`.
fn format_block(out: &mut Vec<u8>, f: Format, addr: u64, lens: &[u8]) -> Result<(), String> {
    if f == Format::Block {
        push_hex(out, addr);
        out.push(b' ');
        push_dec(out, lens.iter().map(|&l| u64::from(l)).sum());
        out.push(b' ');
        push_dec(out, lens.len() as u64);
        out.push(b'\n');
        return Ok(());
    }
    let mut a = addr;
    for &len in lens {
        match f {
            Format::Insn => {
                push_hex(out, a);
                out.push(b'\n');
            }
            Format::Din => {
                out.extend_from_slice(b"2 ");
                push_hex(out, a);
                out.push(b'\n');
            }
            Format::Xdin => {
                out.extend_from_slice(b"i ");
                push_hex(out, a);
                out.push(b' ');
                push_hex(out, u64::from(len));
                out.push(b'\n');
            }
            Format::Bin => {
                let w = AddrRecord::encode(AccessKind::Instr, a, u32::from(len))
                    .map_err(|e| e.to_string())?;
                out.extend_from_slice(&w.to_le_bytes());
            }
            // Formatted per block above; runs by `run_record`.
            Format::Block | Format::Runs | Format::RunSegments => {}
        }
        a = a.wrapping_add(u64::from(len));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_decimal() {
        for (v, h) in [
            (0u64, "0"),
            (1, "1"),
            (0xf, "f"),
            (0x10, "10"),
            (0x40_1000, "401000"),
            (u64::MAX, "ffffffffffffffff"),
        ] {
            let mut out = Vec::new();
            push_hex(&mut out, v);
            assert_eq!(out, h.as_bytes());
            let mut out = Vec::new();
            push_hex_min(&mut out, v, 8);
            assert_eq!(out, format!("{v:08x}").as_bytes());
        }
        for v in [0u64, 9, 10, 12345, u64::MAX] {
            let mut out = Vec::new();
            push_dec(&mut out, v);
            assert_eq!(out, v.to_string().as_bytes());
        }
    }
}
