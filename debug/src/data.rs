//! The data references of one thread's instructions, for watchpoints and
//! `monitor last-write` (issue 22, point 5): a trace recorded with
//! `aetrace record --data --check` (`docs/data.md`) holds, in each
//! thread's stream, the values recorded before each instruction in
//! execution order; `addr::full` (the table the rewriter placed them by,
//! which `regen --format lackey` reads too) turns an instruction and its
//! values into its references.
//!
//! A module recorded by abstract execution (`DATA_ABS`) writes before
//! each instruction the values the abstract execution reads, then the
//! full ones; which abstract values an instruction has depends only on
//! the registers its procedure's analysis knows at the block's start
//! (`exec::entry_knowledge` over the module's `returns::Returns`,
//! `exec::plan_block`), so they are skipped without running it; and a
//! procedure entry that starts with `rsp` known has one value more when
//! an outside-entry stub entered it (`exec::Entered`), which the
//! position before it tells.
//!
//! Invariants: position `n`'s values start where position `n - 1`'s end,
//! so the values of an interval of the [`Timeline`] start at the sum of
//! the earlier intervals' counts, learnt in order and kept (`starts`); an
//! interval's references are computed from its first position on, for any
//! order of visits; a `rep` string instruction is one position whose
//! reference spans every iteration's bytes.

use crate::blocks::Blocks;
use crate::image::Image;
use crate::timeline::Timeline;
use aetrace_analysis::addr::exec::{self, Entered, Exec, WayIn};
use aetrace_analysis::addr::full::{Planned, Recorded, DF};
use aetrace_analysis::addr::returns::Returns;
use aetrace_analysis::addr::{forms, Access, InsnProgram, Repeat};
use aetrace_format::progdb::{CallDb, ProgramDb};
use aetrace_format::section::module_flags;
use aetrace_format::{ModuleId, ThreadId, Trace};
use aetrace_regen::compile::{BlockIx, Module as Compiled, ProcIx};
use iced_x86::{Decoder, DecoderOptions, Instruction, InstructionInfoFactory};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

/// One data reference: the bytes `start..end` an instruction touched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ref {
    /// The first byte.
    pub start: u64,
    /// Past the last byte.
    pub end: u64,
    /// Load, store or both.
    pub access: Access,
}

impl Ref {
    /// Whether it reads memory.
    pub fn reads(&self) -> bool {
        self.access != Access::Store
    }

    /// Whether it writes memory.
    pub fn writes(&self) -> bool {
        self.access != Access::Load
    }

    /// Whether it touches a byte of `start..end`.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start < end && start < self.end
    }
}

/// Where the code is: the bytes gdb reads and the traced blocks (for each
/// address's module and its load bias).
pub struct Code<'a, 'm> {
    /// The modules' read-only segments.
    pub image: &'a Image,
    /// The traced blocks.
    pub blocks: &'a Blocks<'m>,
    /// The regenerator's modules (load biases).
    pub modules: &'a [&'m Compiled],
}

/// A thread's recorded values, and per module (in the regenerator's
/// order) its program database when it was recorded by abstract execution.
pub struct Values {
    values: Vec<u64>,
    dbs: Vec<Option<(ProgramDb, Returns)>>,
}

/// The recorded values of `thread`, or why the trace has none for it
/// (every module the thread runs must have been recorded with every
/// address in full: `--data --check`).
pub fn values<B: AsRef<[u8]>>(
    trace: &Trace<B>,
    thread: u32,
    modules: &[&Compiled],
) -> Result<Values, String> {
    let mut dbs = Vec::new();
    for m in modules {
        let flags = trace.module(ModuleId(m.tag)).map_or(0, |r| r.flags);
        if flags & module_flags::DATA_CHECK == 0 {
            return Err(format!(
                "watchpoints need data addresses, each in full, and module {} was recorded without them (record with --data --check)",
                m.name
            ));
        }
        let db = match flags & module_flags::DATA_ABS {
            0 => None,
            _ => {
                let db = program_db(trace, m.tag).map_err(|e| format!("module {}: {e}", m.name))?;
                let returns = Returns::of(&db);
                Some((db, returns))
            }
        };
        dbs.push(db);
    }
    let (v, signal) =
        aetrace_regen::data_values_entered(trace, ThreadId(thread)).map_err(|e| e.to_string())?;
    if let Some(s) = signal {
        // The positions below count values in order; a handler's values
        // sit among the interrupted instruction's (docs/data.md).
        return Err(format!(
            "watchpoints do not follow the data of a thread that handled a signal yet: thread {thread} took signal {} (stream offset {})",
            s.signo, s.offset
        ));
    }
    Ok(Values {
        values: v.values,
        dbs,
    })
}

fn program_db<B: AsRef<[u8]>>(trace: &Trace<B>, tag: u32) -> Result<ProgramDb, String> {
    let db = trace
        .program_database(ModuleId(tag))
        .ok_or("no program database")?;
    let bytes = db.decompress().map_err(|e| e.to_string())?;
    ProgramDb::decode(&bytes).map_err(|e| e.to_string())
}

/// The last instruction of a block: where it is and the call it ends with.
struct BlockEnd {
    module: usize,
    proc: u32,
    block: u32,
    call: Option<CallDb>,
}

/// A procedure entry that starts with `rsp` known: where it is and its
/// plain predecessors (blocks of the procedure).
struct EntryFacts {
    module: usize,
    proc: u32,
    plain: Vec<u32>,
}

/// A decoded instruction, its module's load bias, and how many abstract
/// values come before its full ones.
struct Insn {
    planned: Planned,
    /// Its module, in the regenerator's order.
    module: usize,
    base: u64,
    skip: usize,
}

/// A hasher for instruction addresses (the cache is looked up once per
/// instruction walked: SipHash would dominate the walk).
#[derive(Default)]
struct PcHasher(u64);

impl Hasher for PcHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|&b| self.write_u64(u64::from(b)));
    }

    fn write_u64(&mut self, a: u64) {
        // Fibonacci hashing: the high bits mix every address bit.
        self.0 = (self.0 ^ a)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(32);
    }
}

/// A thread's data references (see the module comment).
pub struct Data {
    values: Vec<u64>,
    dbs: Vec<Option<(ProgramDb, Returns)>>,
    /// Abstract values before each instruction, by run-time address, for
    /// the procedures seen so far.
    skips: HashMap<u64, usize, BuildHasherDefault<PcHasher>>,
    /// The index of the first value of each interval learnt so far, and
    /// the address of the position before it.
    starts: Vec<(usize, Option<u64>)>,
    /// By address, for the procedures seen so far: each block's last
    /// instruction, and each entry that starts with `rsp` known.
    ends: HashMap<u64, BlockEnd, BuildHasherDefault<PcHasher>>,
    entries: HashMap<u64, EntryFacts, BuildHasherDefault<PcHasher>>,
    /// Decoded instructions by run-time address.
    insns: HashMap<u64, Rc<Insn>, BuildHasherDefault<PcHasher>>,
    info: InstructionInfoFactory,
}

impl Data {
    /// The references of a thread whose recorded values are `values`.
    pub fn new(v: Values) -> Data {
        Data {
            values: v.values,
            dbs: v.dbs,
            skips: HashMap::default(),
            starts: vec![(0, None)],
            ends: HashMap::default(),
            entries: HashMap::default(),
            insns: HashMap::default(),
            info: InstructionInfoFactory::new(),
        }
    }

    /// The first position at or after `from` (`forward`) or the last before
    /// it (exclusive) for which `f(position, pc, references)` says
    /// something, with what it said; `None` at the end of the timeline.
    pub fn scan<T>(
        &mut self,
        t: &mut Timeline<'_>,
        code: &Code<'_, '_>,
        from: u64,
        forward: bool,
        mut f: impl FnMut(u64, u64, &[Ref]) -> Option<T>,
    ) -> Result<Option<(u64, T)>, String> {
        let first = match forward {
            true => from,
            false => match from.checked_sub(1) {
                Some(p) => p,
                None => return Ok(None),
            },
        };
        let Some(mut k) = t.interval_of(first) else {
            return Ok(None);
        };
        loop {
            let (lo, hi) = match forward {
                true => (from, u64::MAX),
                false => (0, from),
            };
            let mut found = None;
            let end = self.walk(t, code, k, |p, pc, refs| {
                if (lo..hi).contains(&p) {
                    if let Some(x) = f(p, pc, refs) {
                        found = Some((p, x));
                        return forward;
                    }
                }
                false
            })?;
            if found.is_some() {
                return Ok(found);
            }
            k = match forward {
                true => match t.interval_of(end) {
                    Some(k2) => k2,
                    None => return Ok(None),
                },
                false => match k.checked_sub(1) {
                    Some(k2) => k2,
                    None => return Ok(None),
                },
            };
        }
    }

    /// Calls `f` on each position of interval `k` in order until it says
    /// stop; the position after the interval (or the one it stopped at).
    fn walk(
        &mut self,
        t: &mut Timeline<'_>,
        code: &Code<'_, '_>,
        k: usize,
        mut f: impl FnMut(u64, u64, &[Ref]) -> bool,
    ) -> Result<u64, String> {
        let (mut v, mut prev) = self.start_of(t, code, k)?;
        let (base, pcs) = t.interval(k);
        let mut refs = Vec::new();
        for (i, &pc) in pcs.iter().enumerate() {
            let insn = self.insn(code, pc)?;
            v = self.refs(code, &insn, pc, v + self.stub(prev, pc), &mut refs)?;
            prev = Some(pc);
            if f(base + i as u64, pc, &refs) {
                return Ok(base + i as u64);
            }
        }
        let end = base + pcs.len() as u64;
        if self.starts.len() == k + 1 {
            self.starts.push((v, prev));
        }
        Ok(end)
    }

    /// The index of interval `k`'s first value, counting earlier
    /// intervals' values if not yet known.
    fn start_of(
        &mut self,
        t: &mut Timeline<'_>,
        code: &Code<'_, '_>,
        k: usize,
    ) -> Result<(usize, Option<u64>), String> {
        while self.starts.len() <= k {
            let j = self.starts.len() - 1;
            let (mut v, mut prev) = self.starts[j];
            let (_, pcs) = t.interval(j);
            let pcs = pcs.to_vec();
            for pc in pcs {
                let i = self.insn(code, pc)?;
                v += self.stub(prev, pc) + i.skip + i.planned.plan.len();
                prev = Some(pc);
            }
            self.starts.push((v, prev));
        }
        Ok(self.starts[k])
    }

    /// The values an outside-entry stub wrote before the instruction at
    /// `pc` when the one before was at `prev` (`exec::Entered`, as the
    /// regenerator decides it): 1 at an entry that starts with `rsp`
    /// known, not reached along a plain edge of its procedure nor by a
    /// direct call or jump; else 0. Both were decoded before.
    /// `src/cmd/dataout.rs` decides the same by block runs (`came_by`, then
    /// `entry_rsp`): what the two share is `Entered::by`; the rest is how
    /// each finds the run before (here by the previous pc).
    fn stub(&self, prev: Option<u64>, pc: u64) -> usize {
        let Some(e) = self.entries.get(&pc) else {
            return 0;
        };
        let Some(p) = prev
            .and_then(|a| self.ends.get(&a))
            .filter(|p| p.module == e.module)
        else {
            return 1;
        };
        if p.proc == e.proc && e.plain.contains(&p.block) {
            return 0;
        }
        usize::from(Entered::by(p.call.as_ref(), e.proc) == Entered::Outside)
    }

    /// The instruction at run-time address `pc`, decoded once.
    fn insn(&mut self, code: &Code<'_, '_>, pc: u64) -> Result<Rc<Insn>, String> {
        if let Some(i) = self.insns.get(&pc) {
            return Ok(i.clone());
        }
        let b = code
            .blocks
            .at(pc)
            .ok_or_else(|| format!("{pc:#x} is in no traced block"))?;
        let base = code.modules[b.module].load_base;
        let mut bytes = [0u8; 15];
        let n = code.image.read(pc, &mut bytes);
        let mut d = Decoder::with_ip(64, &bytes[..n], pc.wrapping_sub(base), DecoderOptions::NONE);
        let insn = d.decode();
        if insn.is_invalid() {
            return Err(format!("no instruction can be read at {pc:#x}"));
        }
        let planned = Planned::new(insn, &mut self.info)?;
        let skip = self.skip(code, b.module, pc)?;
        let i = Rc::new(Insn {
            module: b.module,
            planned,
            base,
            skip,
        });
        self.insns.insert(pc, i.clone());
        Ok(i)
    }

    /// The abstract values before the instruction at `pc` of module
    /// `module` (0 when it was recorded without abstract execution),
    /// planned for its whole procedure at once ([`Data::learn_proc`]).
    fn skip(&mut self, code: &Code<'_, '_>, module: usize, pc: u64) -> Result<usize, String> {
        let Some(Some(_)) = self.dbs.get(module) else {
            return Ok(0);
        };
        if let Some(&n) = self.skips.get(&pc) {
            return Ok(n);
        }
        let m = code.modules[module];
        let (pi, _) = m
            .traced_at(pc.wrapping_sub(m.load_base))
            .ok_or_else(|| format!("{pc:#x} is in no block of {}", m.name))?;
        self.learn_proc(code, module, pi)?;
        self.skips
            .get(&pc)
            .copied()
            .ok_or_else(|| format!("{pc:#x} starts no instruction of its procedure"))
    }

    /// Plans procedure `pi` of module `module` as the recorder did: each
    /// instruction's abstract values (`skips`), each block's end (`ends`)
    /// and its entry if it starts with `rsp` known (`entries`).
    fn learn_proc(&mut self, code: &Code<'_, '_>, module: usize, pi: ProcIx) -> Result<(), String> {
        let m = code.modules[module];
        let mut progs = decode_proc(code.image, m, pi, &mut self.info);
        let Some(Some((db, returns))) = self.dbs.get(module) else {
            return Ok(());
        };
        let p = db
            .procs
            .get(pi.as_u32() as usize)
            .ok_or_else(|| format!("procedure {pi:?} of {} is not in its database", m.name))?;
        let known = exec::entry_knowledge(p, returns, &mut progs);
        let ways = exec::ways_in(p, returns, &progs);
        let proc = pi.as_u32();
        let at = |i: &Instruction| m.load_base.wrapping_add(i.ip());
        for (b, ((insns, k), blk)) in progs.iter().zip(known).zip(&p.blocks).enumerate() {
            let (plans, _) = Exec::plan_block(k, insns, exec::anchors_rsp(blk));
            for ((i, _), plan) in insns.iter().zip(plans) {
                self.skips.insert(at(i), plan.map_or(0, |p| p.len()));
            }
            if let Some((last, _)) = insns.last() {
                let (block, call) = (b as u32, blk.call);
                let end = BlockEnd {
                    module,
                    proc,
                    block,
                    call,
                };
                self.ends.insert(at(last), end);
            }
            // Only an entry that starts with `rsp` known has a stub's value.
            if let (Some((first, _)), true) = (insns.first(), k.0 != 0) {
                if let Some(plain) = entry_plain(&ways[b]) {
                    let facts = EntryFacts {
                        module,
                        proc,
                        plain,
                    };
                    self.entries.insert(at(first), facts);
                }
            }
        }
        Ok(())
    }
    /// Fills `out` with the references of `insn` at `pc`, whose values
    /// start at index `v`; the index after them.
    fn refs(
        &self,
        code: &Code<'_, '_>,
        i: &Insn,
        pc: u64,
        v: usize,
        out: &mut Vec<Ref>,
    ) -> Result<usize, String> {
        let insn = &i.planned;
        out.clear();
        let v = v + i.skip;
        let end = v + insn.plan.len();
        if insn.prog.refs.is_empty() {
            return Ok(end);
        }
        let vals = self.values.get(v..end).ok_or_else(|| {
            format!(
                "the thread's {} data values end before the instruction at {pc:#x}",
                self.values.len()
            )
        })?;
        let mut addrs = insn.addresses(vals, i.base);
        // The copies read copied jump tables: a recorded address there is
        // the original table's as gdb knows the program
        // (`Module::original_data_address`, as `regen --format lackey`).
        let m = code.modules[i.module];
        for p in &insn.plan {
            if let Recorded::Addr(k) = *p {
                addrs[k] = m.original_data_address(addrs[k]);
            }
        }
        // A `rep`'s values start with rcx and rflags (`full::plan`).
        let rep = match insn.plan.first() {
            Some(Recorded::Rcx) => Some((vals[0], vals[1] & DF != 0)),
            _ => None,
        };
        for (r, &a) in insn.prog.refs.iter().zip(&addrs) {
            let size = u64::from(r.size);
            let (start, end) = match rep {
                Some((n, down)) if r.repeat == Repeat::Rcx => match (n, down) {
                    (0, _) => continue,
                    (n, false) => (a, a.wrapping_add(n.wrapping_mul(size))),
                    (n, true) => (a.wrapping_sub((n - 1).wrapping_mul(size)), a + size),
                },
                _ => (a, a.wrapping_add(size)),
            };
            out.push(Ref {
                start,
                end,
                access: r.access,
            });
        }
        Ok(end)
    }
}

/// The instructions of procedure `pi`'s blocks, decoded from `image`,
/// with their address programs.
fn decode_proc(
    image: &Image,
    m: &Compiled,
    pi: ProcIx,
    info: &mut InstructionInfoFactory,
) -> Vec<Vec<(Instruction, InsnProgram)>> {
    let blocks = m.procs[pi].blocks.clone().map(BlockIx::from_u32);
    blocks
        .map(|k| {
            let blk = &m.blocks[k];
            let mut bytes = vec![0u8; blk.size as usize];
            image.read(m.load_base.wrapping_add(blk.start), &mut bytes);
            let mut d = Decoder::with_ip(64, &bytes, blk.start, DecoderOptions::NONE);
            (0..blk.ninsns)
                .map(|_| {
                    let i = d.decode();
                    (i, forms::program(&i, info))
                })
                .collect()
        })
        .collect()
}

/// A block's plain predecessors if it is its procedure's entry (`ways`:
/// its ways in), else `None`.
fn entry_plain(ways: &[WayIn]) -> Option<Vec<u32>> {
    if !ways.contains(&WayIn::Entry) {
        return None;
    }
    let plain = ways.iter().filter_map(|w| match *w {
        WayIn::Plain(q) => Some(q),
        _ => None,
    });
    Some(plain.collect())
}
