//! A traced module as the tracer sees it: every block of every analysable
//! procedure, flattened and sorted by start address, each with its last
//! instruction decoded once (the paper's cache of "end address and kind",
//! Section 3.2), its procedure, and its successors inside the procedure (to
//! report missing edges, the paper's case (c)).
//!
//! Invariants: `blocks` is sorted by `start` and starts are unique (a block
//! may lie inside the previous one when both end at the same address, the
//! `lock`-prefix alias of `aetrace_analysis::cfg`); `entries` holds the blocks
//! control can reach from code we do not follow that are known statically
//! (procedure entries, blocks without a predecessor such as landing pads);
//! return points are added at run time when a call leaves the module.
//! Addresses are link-time; `base` turns them into runtime addresses.

use std::path::{Path, PathBuf};

use aetrace_analysis::Program;
use aetrace_graph::EntityRef;
use iced_x86::{Decoder, DecoderOptions, Instruction};

use crate::Error;

/// One block, with what the tracer needs at its end.
#[derive(Clone, Debug)]
pub struct Blk {
    /// Link-time address of the block's first instruction.
    pub start: u64,
    /// Link-time address just past the block's last instruction.
    pub end: u64,
    /// Address of the last instruction.
    pub last: u64,
    /// The last instruction, decoded at its link-time address.
    pub insn: Instruction,
    /// The first instruction (executed by emulation under an entry trap
    /// when it is simple, see `emulate::plan_first`).
    pub first: Instruction,
    /// Index of the procedure in the `Program`.
    pub proc: usize,
    /// Indices (into `blocks`) of the successors inside the procedure.
    pub succs: Vec<u32>,
    /// It ends in an unresolved indirect jump, which may reach any block of
    /// its procedure (the trace's INDIRECT record says which).
    pub unresolved: bool,
}

/// A module whose blocks are followed.
pub struct TracedModule {
    /// The module's file.
    pub path: PathBuf,
    /// Its procedures and their CFGs, recovered statically.
    pub program: Program,
    /// Runtime address minus link-time address (0 until mapped).
    pub base: u64,
    /// Found in the process's mappings, its entry traps written.
    pub mapped: bool,
    /// Every block of every procedure with a CFG.
    pub blocks: Vec<Blk>,
    /// Indices of blocks reachable from untraced code.
    pub entries: Vec<u32>,
    /// `[lo, hi)` link-time range covered by blocks.
    pub lo: u64,
    /// End of the range (exclusive).
    pub hi: u64,
}

impl TracedModule {
    /// Loads `path` and recovers its CFGs; procedures without a CFG are left
    /// out (their code counts as untraced).
    pub fn open(path: &Path) -> Result<TracedModule, Error> {
        let program = Program::open(path)?;
        let mut blocks: Vec<Blk> = Vec::new();
        let mut entry_addrs: Vec<u64> = Vec::new();
        let mut edges: Vec<(u64, u64)> = Vec::new();
        for (pid, proc) in program.procs.iter() {
            let Ok(cfg) = &proc.cfg else { continue };
            let mut has_pred = vec![false; cfg.blocks.len()];
            for e in cfg.edges.values() {
                if e.to != cfg.exit() {
                    has_pred[e.to.index()] = true;
                    edges.push((cfg.blocks[e.from].start, cfg.blocks[e.to].start));
                }
            }
            entry_addrs.extend(proc.entries.iter().copied());
            entry_addrs.push(cfg.blocks[cfg.entry].start);
            let unresolved: Vec<_> = cfg
                .indirect_jumps
                .iter()
                .filter(|j| j.is_unresolved())
                .map(|j| j.block)
                .collect();
            for (bid, b) in cfg.blocks.iter() {
                if !has_pred[bid.index()] {
                    entry_addrs.push(b.start);
                }
                let last = b.last_insn();
                let bytes = program
                    .module
                    .bytes_at(last, (b.end - last).min(15))
                    .ok_or(Error::Cfg {
                        path: path.to_owned(),
                        what: format!("no bytes for the block at {:#x}", b.start),
                    })?;
                let insn = Decoder::with_ip(64, bytes, last, DecoderOptions::NONE).decode();
                let head = program
                    .module
                    .bytes_at(b.start, (b.end - b.start).min(15))
                    .unwrap_or_default();
                let first = Decoder::with_ip(64, head, b.start, DecoderOptions::NONE).decode();
                blocks.push(Blk {
                    start: b.start,
                    end: b.end,
                    last,
                    insn,
                    first,
                    proc: pid.index(),
                    succs: Vec::new(),
                    unresolved: unresolved.contains(&bid),
                });
            }
        }
        blocks.sort_by_key(|b| b.start);
        if let Some(w) = blocks.windows(2).find(|w| w[0].start == w[1].start) {
            return Err(Error::Cfg {
                path: path.to_owned(),
                what: format!("two blocks start at {:#x}", w[0].start),
            });
        }
        let mut m = TracedModule {
            path: path.to_owned(),
            program,
            base: 0,
            mapped: false,
            lo: blocks.first().map_or(0, |b| b.start),
            hi: blocks.iter().map(|b| b.end).max().unwrap_or(0),
            blocks,
            entries: Vec::new(),
        };
        for (from, to) in edges {
            if let (Some(f), Some(t)) = (m.block_at(from), m.block_at(to)) {
                m.blocks[f].succs.push(t as u32);
            }
        }
        let mut entries: Vec<u32> = entry_addrs
            .into_iter()
            .filter_map(|a| m.block_at(a).map(|i| i as u32))
            .collect();
        entries.sort_unstable();
        entries.dedup();
        m.entries = entries;
        Ok(m)
    }

    /// The block starting at link-time `addr`.
    pub fn block_at(&self, addr: u64) -> Option<usize> {
        self.blocks.binary_search_by_key(&addr, |b| b.start).ok()
    }

    /// The innermost block containing link-time `addr`.
    pub fn block_containing(&self, addr: u64) -> Option<usize> {
        let n = self.blocks.partition_point(|b| b.start <= addr);
        (0..n).rev().take(4).find(|&i| self.blocks[i].end > addr)
    }

    /// Whether runtime `rip` lies in the code this module's blocks cover
    /// (never before the module is mapped).
    pub fn covers(&self, rip: u64) -> bool {
        let a = rip.wrapping_sub(self.base);
        self.mapped && a >= self.lo && a < self.hi
    }

    /// The name of the procedure of block `b`.
    pub fn proc_name(&self, b: usize) -> &str {
        let id = aetrace_graph::ProcId::new(self.blocks[b].proc);
        &self.program.procs[id].name
    }
}
