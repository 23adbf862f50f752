//! Building one procedure's [`Cfg`] from its decoded ranges.
//!
//! Leaders are the entries, the range starts, the C++ landing pads (from
//! the LSDAs: the unwinder enters them), the targets of direct branches
//! inside the procedure, the targets of resolved jump tables, the labels
//! whose address the procedure takes (GNU `&&label`), and every
//! instruction after a block-ending one (branch, call, return, `hlt`, `ud2`).
//! A trap (`hlt`, `ud2`) that the procedure's own code follows has a
//! `Resume` edge to it (a handler may move rip past the trap), else a `Halt`
//! edge to EXIT. A call ends its block: the block is a call vertex whose
//! successor is the block after the call (`CallReturn`), or EXIT
//! (`NoReturn`) when the call's fall-through leaves the procedure. Which
//! callees never return is decided afterwards for the whole module
//! (`noreturn`), which turns `CallReturn` edges into `NoReturn` ones.
//!
//! Jump tables need blocks (for the slice) and make blocks (their targets
//! are leaders): resolution repeats on the refined blocks until the leaders
//! no longer change.
//!
//! Invariant: a procedure is either built exactly or refused with a reason
//! (`Err`): a branch or entry into the middle of an instruction, or bytes
//! that do not decode, never produce a CFG.

use std::collections::{BTreeSet, HashMap};

use aetrace_graph::{BlockId, EntityRef, PrimaryMap};
use iced_x86::{FlowControl, Instruction, Mnemonic, OpKind, Register};

use crate::cfg::{
    Block, BlockKind, CallKind, CallSite, Cfg, CfgEdge, EdgeKind, IndirectJump, JumpResolution,
};
use crate::jumptable::{self, EntryFact, TableReader};
use crate::procs::{direct_target, falls_through, is_straight, is_syscall};

/// What the builder needs to know about the rest of the module.
pub struct Context<'a> {
    /// Reads jump-table entries from the module's file bytes.
    pub reader: TableReader<'a>,
    /// PLT stub start -> import name (`None`: an unnamed stub).
    pub plt: &'a HashMap<u64, Option<String>>,
    /// GOT slot -> import name.
    pub got: &'a HashMap<u64, String>,
    /// Procedure entry -> name.
    pub names: &'a HashMap<u64, String>,
    /// Code addresses the module takes, sorted (`Discovery::taken`).
    pub taken: &'a [u64],
    /// Code addresses held by data words, `(value, word address)` sorted
    /// (`Discovery::data_words`).
    pub data_words: &'a [(u64, u64)],
}

/// The rounds of jump-table resolution before we give up on convergence.
const MAX_ROUNDS: usize = 16;
/// Single predecessors followed back from an indirect jump.
const MAX_CHAIN: usize = 8;
/// Paths followed back from one indirect jump.
const MAX_PATHS: usize = 32;

/// A block as a run `[first, last]` of instruction indices.
#[derive(Copy, Clone, Debug)]
struct Run {
    first: usize,
    last: usize,
}

struct Builder<'a> {
    insns: &'a [Instruction],
    ranges: &'a [(u64, u64)],
    ctx: &'a Context<'a>,
    is_plt: bool,
}

impl<'a> Builder<'a> {
    fn in_proc(&self, a: u64) -> bool {
        self.ranges.iter().any(|&(s, e)| a >= s && a < e)
    }

    fn index_of(&self, a: u64) -> Option<usize> {
        self.insns.binary_search_by_key(&a, Instruction::ip).ok()
    }

    /// Whether `insn` calls an import known by name never to return
    /// (`call exit@plt`, `call *exit@GOT`): its fall-through is no way to
    /// the next block. Module-internal callees are decided later
    /// (`noreturn`), once every CFG exists.
    fn calls_noreturn_import(&self, insn: &Instruction) -> bool {
        let name = match insn.flow_control() {
            FlowControl::Call => direct_target(insn)
                .and_then(|t| self.ctx.plt.get(&t))
                .cloned()
                .flatten(),
            FlowControl::IndirectCall if insn.memory_base() == Register::RIP => {
                self.ctx.got.get(&insn.ip_rel_memory_address()).cloned()
            }
            _ => None,
        };
        name.is_some_and(|n| crate::noreturn::is_noreturn_name(&n))
    }

    /// Alignment padding: nothing jumps to it, even an unresolved jump
    /// (compilers and assemblers only ever fall into it).
    fn is_padding(&self, run: Run) -> bool {
        self.insns[run.first..=run.last]
            .iter()
            .all(|i| i.mnemonic() == Mnemonic::Nop)
    }

    /// Alignment fill as linkers and compilers write it between
    /// procedures: `nop`s or `int3`s.
    fn is_fill(&self, run: Run) -> bool {
        self.insns[run.first..=run.last]
            .iter()
            .all(|i| matches!(i.mnemonic(), Mnemonic::Nop | Mnemonic::Int3))
    }

    /// The leaders implied by the instructions alone.
    fn static_leaders(&self, entries: &[u64]) -> Result<BTreeSet<u64>, BuildError> {
        let mut leaders: BTreeSet<u64> = entries.iter().copied().collect();
        leaders.extend(self.ranges.iter().map(|&(s, _)| s));
        for (k, insn) in self.insns.iter().enumerate() {
            let aliased = self
                .insns
                .get(k + 1)
                .is_some_and(|n| n.ip() < insn.next_ip());
            if !is_straight(insn) || is_syscall(insn) || aliased {
                leaders.insert(insn.next_ip());
            }
            if aliased {
                leaders.insert(self.insns[k + 1].ip());
            }
            if let Some(t) = direct_target(insn) {
                if insn.flow_control() != FlowControl::Call && self.in_proc(t) {
                    leaders.insert(t);
                }
            }
        }
        for &l in &leaders {
            if self.in_proc(l) && self.index_of(l).is_none() {
                return Err(BuildError::InsideInstruction(l));
            }
        }
        leaders.retain(|&l| self.in_proc(l));
        Ok(leaders)
    }

    fn partition(&self, leaders: &BTreeSet<u64>) -> Vec<Run> {
        let mut runs = Vec::new();
        let mut first = 0;
        for i in 0..self.insns.len() {
            let insn = &self.insns[i];
            let next = self.insns.get(i + 1);
            let ends = !is_straight(insn)
                || is_syscall(insn)
                || next.map_or(true, |n| {
                    n.ip() != insn.next_ip() || leaders.contains(&n.ip())
                });
            if ends {
                runs.push(Run { first, last: i });
                first = i + 1;
            }
        }
        runs
    }

    /// Predecessor runs of each run through direct transfers, plus the
    /// jump-table edges known so far. A call's successor counts, so that
    /// slices stop at calls.
    fn preds(
        &self,
        runs: &[Run],
        start_of: &HashMap<u64, usize>,
        tables: &HashMap<usize, Vec<u64>>,
    ) -> Vec<Vec<(usize, bool)>> {
        let mut preds = vec![Vec::new(); runs.len()];
        for (r, run) in runs.iter().enumerate() {
            let last = &self.insns[run.last];
            if falls_through(last) && !self.calls_noreturn_import(last) {
                if let Some(&s) = start_of.get(&last.next_ip()) {
                    preds[s].push((r, false));
                }
            }
            if last.flow_control() != FlowControl::Call {
                if let Some(t) = direct_target(last) {
                    if let Some(&s) = start_of.get(&t) {
                        preds[s].push((r, true));
                    }
                }
            }
            for t in tables.get(&r).into_iter().flatten() {
                if let Some(&s) = start_of.get(t) {
                    preds[s].push((r, true));
                }
            }
        }
        preds
    }

    /// Resolves the indirect jump ending run `r`.
    fn resolve(
        &self,
        runs: &[Run],
        r: usize,
        preds: &[Vec<(usize, bool)>],
        live: &[bool],
        entries: &BTreeSet<u64>,
        strict: bool,
    ) -> JumpResolution {
        // Every way back from the jump, up to MAX_CHAIN runs deep: a path
        // stops at an entry, a call, a loop, or when the budget is spent, so
        // the paths together cover every way the jump is reached.
        let mut paths: Vec<(Vec<usize>, Vec<bool>)> = Vec::new();
        // Whether a path from code without known predecessors was left out
        // (only outside strict mode): then "no path" proves nothing.
        let mut dropped_dead = false;
        let mut stack: Vec<(Vec<usize>, Vec<bool>)> = vec![(vec![r], Vec::new())];
        while let Some((chain, taken)) = stack.pop() {
            let cur = *chain.last().expect("paths are non-empty");
            let mut ps: Vec<(usize, bool)> = preds[cur].clone();
            ps.sort_unstable();
            ps.dedup();
            let stop = chain.len() >= MAX_CHAIN
                || entries.contains(&self.insns[runs[cur].first].ip())
                || ps.is_empty()
                || paths.len() + stack.len() + ps.len() > MAX_PATHS
                || ps.iter().any(|&(p, _)| {
                    chain.contains(&p)
                        || matches!(
                            self.insns[runs[p].last].flow_control(),
                            FlowControl::Call | FlowControl::IndirectCall
                        )
                });
            if stop {
                // Outside strict mode a path from code nothing known
                // reaches (the padding after a jump, or code reached only
                // through a table not resolved yet) is no way to the jump at
                // all: the next round, with that table's edges, decides.
                let dead = !live[cur];
                if !dead || (strict && !self.is_padding(runs[cur])) {
                    paths.push((chain, taken));
                } else if !self.is_padding(runs[cur]) {
                    dropped_dead = true;
                }
                continue;
            }
            for (p, t) in ps {
                let (mut c, mut tk) = (chain.clone(), taken.clone());
                c.push(p);
                tk.push(t);
                stack.push((c, tk));
            }
        }
        let mut result: Option<JumpResolution> = None;
        for (mut chain, mut taken) in paths {
            chain.reverse();
            taken.reverse();
            let slices: Vec<&[Instruction]> = chain
                .iter()
                .map(|&c| &self.insns[runs[c].first..=runs[c].last])
                .collect();
            let head = chain[0];
            let mut entry_value =
                |r: Register| self.reaching_fact(runs, preds, head, r, entries, strict);
            let in_proc = |a: u64| self.in_proc(a);
            let Some(res) = jumptable::resolve(
                &slices,
                &taken,
                &self.ctx.reader,
                &mut entry_value,
                &in_proc,
            ) else {
                continue;
            };
            result = Some(match (result, res) {
                (_, JumpResolution::Unresolved(why)) => return JumpResolution::Unresolved(why),
                (None, res) => res,
                (Some(JumpResolution::TailCall), JumpResolution::TailCall) => {
                    JumpResolution::TailCall
                }
                (Some(JumpResolution::Computed(mut a)), JumpResolution::Computed(b)) => {
                    a.extend(b);
                    a.sort_unstable();
                    a.dedup();
                    JumpResolution::Computed(a)
                }
                (
                    Some(JumpResolution::Table { table, targets }),
                    JumpResolution::Table {
                        table: t2,
                        targets: g2,
                    },
                ) if table == t2 => {
                    // Each path bounds the same table; together they reach
                    // its longest bound. The shorter list must be a prefix.
                    let (long, short) = if g2.len() > targets.len() {
                        (g2, targets)
                    } else {
                        (targets, g2)
                    };
                    if long[..short.len()] != short[..] {
                        return JumpResolution::Unresolved("paths read the table differently");
                    }
                    JumpResolution::Table {
                        table,
                        targets: long,
                    }
                }
                (
                    Some(JumpResolution::Table { table, targets }),
                    JumpResolution::Table {
                        table: t2,
                        targets: g2,
                    },
                ) => {
                    match jumptable::merge_tables(&self.ctx.reader, (table, &targets), (t2, &g2)) {
                        Some(t) => t,
                        None => {
                            return JumpResolution::Unresolved("paths read the table differently")
                        }
                    }
                }
                _ => return JumpResolution::Unresolved("paths disagree on the jump's shape"),
            });
        }
        match result {
            Some(r) => r,
            // Code nothing known reaches leads to the jump: the strict
            // redo decides.
            None if dropped_dead => {
                JumpResolution::Unresolved("reached only from unreachable code")
            }
            // Every path's guards compare constants the other way (like
            // `deregister_tm_clones`): the jump never executes.
            None => JumpResolution::Computed(Vec::new()),
        }
    }

    /// What `r` holds on entry to run `head` when every definition reaching
    /// it agrees: the same `lea r, [rip+X]` (a table base that the compiler
    /// hoisted out of a loop), a `pmovmskb` mask (a bit count), or, in PIC
    /// code, an 8-byte load from a pointer field or global (a code pointer). Paths that
    /// reach an entry of the procedure without a definition, or cross a call
    /// that may clobber `r`, give `None`.
    fn reaching_fact(
        &self,
        runs: &[Run],
        preds: &[Vec<(usize, bool)>],
        head: usize,
        r: Register,
        entries: &BTreeSet<u64>,
        strict: bool,
    ) -> Option<EntryFact> {
        self.fact_before(runs, preds, (head, runs[head].first), r, entries, strict, 0)
    }

    /// What `r` holds just before instruction `at.1` of run `at.0`, from
    /// every definition reaching that point (see `reaching_fact`). A
    /// register copy `mov r, r2` asks the same of `r2` there.
    #[allow(clippy::too_many_arguments)]
    fn fact_before(
        &self,
        runs: &[Run],
        preds: &[Vec<(usize, bool)>],
        at: (usize, usize),
        r: Register,
        entries: &BTreeSet<u64>,
        strict: bool,
        depth: u32,
    ) -> Option<EntryFact> {
        const CALLEE_SAVED: [Register; 6] = [
            Register::RBX,
            Register::RBP,
            Register::R12,
            Register::R13,
            Register::R14,
            Register::R15,
        ];
        // An argument register unchanged since an entry holds what the
        // caller passed: for a jump target, a code pointer (a label of this
        // procedure cannot come from outside it).
        const ARGS: [Register; 6] = [
            Register::RDI,
            Register::RSI,
            Register::RDX,
            Register::RCX,
            Register::R8,
            Register::R9,
        ];
        if !r.is_gpr64() || r == Register::RSP || depth > 4 {
            return None;
        }
        let from_entry = (self.ctx.reader.pic && ARGS.contains(&r)).then_some(EntryFact::Pointer);
        let mut info = iced_x86::InstructionInfoFactory::new();
        let mut value: Option<EntryFact> = None;
        let merge = |value: &mut Option<EntryFact>, fact: EntryFact| -> Option<()> {
            *value = Some(match (*value, fact) {
                (None, f) => f,
                (Some(EntryFact::Bits(a)), EntryFact::Bits(b)) => EntryFact::Bits(a.max(b)),
                (Some(v), f) if v == f => f,
                _ => return None,
            });
            Some(())
        };
        let mut seen = vec![false; runs.len()];
        // (run, end): scan instructions [first, end) of the run backwards.
        let mut work: Vec<(usize, usize)> = vec![at];
        let mut budget = 4096;
        let mut first = true;
        while let Some((k, end)) = work.pop() {
            if !std::mem::take(&mut first) && std::mem::replace(&mut seen[k], true) {
                continue;
            }
            budget -= 1;
            if budget == 0 {
                return None;
            }
            let run = runs[k];
            let mut defined = false;
            for i in (run.first..end).rev() {
                let insn = &self.insns[i];
                let fc = insn.flow_control();
                if matches!(fc, FlowControl::Call | FlowControl::IndirectCall)
                    && !is_straight(insn)
                    && !CALLEE_SAVED.contains(&r)
                {
                    return None;
                }
                if !writes_gpr(&mut info, insn, r) {
                    continue;
                }
                let fact = match insn.mnemonic() {
                    Mnemonic::Lea
                        if insn.op0_register() == r && insn.memory_base() == Register::RIP =>
                    {
                        EntryFact::Const(insn.ip_rel_memory_address())
                    }
                    Mnemonic::Pmovmskb | Mnemonic::Vpmovmskb
                        if insn.op0_register().full_register() == r =>
                    {
                        EntryFact::Bits(insn.op1_register().size() as u32)
                    }
                    Mnemonic::Mov
                        if self.ctx.reader.pic
                            && insn.op0_register() == r
                            && insn.op1_kind() == OpKind::Memory
                            && insn.memory_index() == Register::None
                            && !matches!(insn.memory_base(), Register::RSP | Register::RBP)
                            && insn.segment_prefix() == Register::None =>
                    {
                        EntryFact::Pointer
                    }
                    Mnemonic::Mov
                        if insn.op0_register().full_register() == r
                            && insn.op0_register().size() >= 4
                            && matches!(
                                insn.op1_kind(),
                                OpKind::Immediate32 | OpKind::Immediate64 | OpKind::Immediate32to64
                            ) =>
                    {
                        // `mov $T, %r12d` (non-PIC table base); a 32-bit
                        // move zero-extends.
                        let v = insn.immediate(1);
                        EntryFact::Const(if insn.op0_register().size() == 4 {
                            v & 0xffff_ffff
                        } else {
                            v
                        })
                    }
                    // glibc's PTR_DEMANGLE (`ror $0x11, %rbp; xor
                    // %fs:0x30, %rbp`) of a code pointer is a code pointer.
                    Mnemonic::Ror | Mnemonic::Rol | Mnemonic::Xor
                        if insn.op0_kind() == OpKind::Register
                            && insn.op0_register() == r
                            && (insn.mnemonic() != Mnemonic::Xor
                                || insn.segment_prefix() == Register::FS) =>
                    {
                        match self.fact_before(
                            runs,
                            preds,
                            (k, i),
                            r,
                            entries,
                            strict,
                            depth + 1,
                        )? {
                            EntryFact::Pointer => EntryFact::Pointer,
                            _ => return None,
                        }
                    }
                    // A mask shifted right stays within its width.
                    Mnemonic::Shr
                        if insn.op0_kind() == OpKind::Register && insn.op0_register() == r =>
                    {
                        match self.fact_before(
                            runs,
                            preds,
                            (k, i),
                            r,
                            entries,
                            strict,
                            depth + 1,
                        )? {
                            EntryFact::Bits(b) => EntryFact::Bits(b),
                            _ => return None,
                        }
                    }
                    Mnemonic::Mov
                        if insn.op0_register() == r
                            && insn.op1_kind() == OpKind::Register
                            && insn.op1_register().is_gpr64() =>
                    {
                        self.fact_before(
                            runs,
                            preds,
                            (k, i),
                            insn.op1_register(),
                            entries,
                            strict,
                            depth + 1,
                        )?
                    }
                    _ => return None,
                };
                merge(&mut value, fact)?;
                defined = true;
                break;
            }
            if defined {
                continue;
            }
            if entries.contains(&self.insns[run.first].ip()) {
                merge(&mut value, from_entry?)?;
            } else if strict && preds[k].is_empty() && !self.is_padding(run) {
                return None;
            }
            work.extend(preds[k].iter().map(|&(p, _)| (p, runs[p].last + 1)));
        }
        value
    }

    /// `pads` are the landing pads: leaders, and roots with unknown
    /// register state like entries (the unwinder enters them).
    fn build(&self, entries: &[u64], pads: &[u64]) -> Result<Cfg, BuildError> {
        let primary = entries[0];
        let roots: Vec<u64> = entries.iter().chain(pads).copied().collect();
        let entries = &roots[..];
        let base = self.static_leaders(entries)?;
        let (mut leaders, mut resolutions) = self.resolve_tables(&base, entries, false)?;
        if resolutions
            .values()
            .any(|r| matches!(r, JumpResolution::Unresolved(_)))
        {
            // Code without known predecessors may be the target of the
            // unresolved jump: redo without ignoring it.
            (leaders, resolutions) = self.resolve_tables(&base, entries, true)?;
        }
        if resolutions
            .values()
            .any(|r| matches!(r, JumpResolution::Unresolved(_)))
        {
            // The jump may reach any instruction: each starts a block, so
            // that the rewriter's map from original to copy addresses and
            // the regenerator's tables agree on every place it can land
            // (docs/cfg.md, "Unresolved jumps").
            leaders.extend(self.insns.iter().map(Instruction::ip));
        }
        self.assemble(&leaders, &resolutions, primary)
    }

    /// The procedure's address-taken labels, sorted: instruction starts
    /// strictly inside it (not entries) whose address the module takes by
    /// RIP-relative `lea`, a RELATIVE relocation, an immediate (`ET_EXEC`),
    /// or an absolute data word (`ET_EXEC`); none unless one of them lies
    /// outside the resolved jump tables of `resolutions`.
    ///
    /// gcc materialises every `&&label` in one of these forms, so when a
    /// procedure has any, its pointer jumps can reach exactly these labels.
    /// The assumption fails for labels formed by arithmetic on other labels
    /// (`&&a - &&b` offset tables, as in glibc's printf): the set would then
    /// miss targets. gcc never emits such arithmetic for plain `goto *p`
    /// with `p = &&label`; sources that write it themselves defeat the rule,
    /// so a procedure whose `lea` of a label feeds arithmetic
    /// (`adds_to_labels`) gets `None`: its pointer jumps stay unresolved.
    fn labels(
        &self,
        entries: &BTreeSet<u64>,
        resolutions: &HashMap<u64, JumpResolution>,
    ) -> Option<Vec<u64>> {
        let tables: Vec<(u64, u64)> = resolutions
            .values()
            .filter_map(|r| match r {
                JumpResolution::Table { table, targets } => {
                    Some((*table, table.saturating_add(8 * targets.len() as u64)))
                }
                _ => None,
            })
            .collect();
        // Words of resolved tables are accounted for by their jumps: alone
        // they do not make the procedure one that takes its labels (a
        // non-PIC switch), but once it does, they are labels like any.
        let mut out = Vec::new();
        let mut outside_tables = false;
        for &(s, e) in self.ranges {
            let i = self.ctx.taken.partition_point(|&a| a < s);
            for &a in self.ctx.taken[i..].iter().take_while(|&&a| a < e) {
                out.push(a);
                outside_tables |= !entries.contains(&a) && self.index_of(a).is_some();
            }
            let j = self.ctx.data_words.partition_point(|&(v, _)| v < s);
            for &(v, at) in self.ctx.data_words[j..].iter().take_while(|&&(v, _)| v < e) {
                out.push(v);
                outside_tables |= !entries.contains(&v)
                    && self.index_of(v).is_some()
                    && !tables.iter().any(|&(ts, te)| at >= ts && at < te);
            }
        }
        if !outside_tables {
            return Some(Vec::new());
        }
        out.retain(|a| !entries.contains(a) && self.index_of(*a).is_some());
        out.sort_unstable();
        out.dedup();
        if self.adds_to_labels() {
            return None;
        }
        Some(out)
    }

    /// Whether the indirect jump ending run `k` goes to an 8-byte pointer
    /// read from memory other than an import's GOT slot: `jmp *m`, or
    /// `jmp *r` where every last definition of `r` reaching the jump (in its
    /// block, or at the end of each predecessor, a few blocks back) is
    /// `mov r, m` (`goto *dispatch[*pc++]`, also with gcc -O0's shared
    /// `jmp *%rax` block). Not a jump to a table entry plus a base (`movslq;
    /// add; jmp`: a switch), nor to a value from a call or an entry.
    fn loads_pointer(
        &self,
        runs: &[Run],
        preds: &[Vec<(usize, bool)>],
        entries: &BTreeSet<u64>,
        k: usize,
    ) -> bool {
        let jmp = &self.insns[runs[k].last];
        if jmp.op0_kind() == OpKind::Memory {
            return self.reads_pointer(jmp, 0);
        }
        let mut info = iced_x86::InstructionInfoFactory::new();
        let mut seen = BTreeSet::new();
        let mut work = vec![(k, runs[k].last, 0u32)];
        while let Some((k, end, depth)) = work.pop() {
            if !seen.insert((k, end)) {
                continue;
            }
            let run = runs[k];
            let mut defined = false;
            for insn in self.insns[run.first..end].iter().rev() {
                if !is_straight(insn)
                    && insn.flow_control() != FlowControl::ConditionalBranch
                    && insn.flow_control() != FlowControl::UnconditionalBranch
                {
                    return false;
                }
                let r = jmp.op0_register();
                if writes_gpr(&mut info, insn, r) {
                    if !(insn.mnemonic() == Mnemonic::Mov
                        && insn.op0_register() == r
                        && self.reads_pointer(insn, 1))
                    {
                        return false;
                    }
                    defined = true;
                    break;
                }
            }
            if defined {
                continue;
            }
            if depth >= 4 || preds[k].is_empty() || entries.contains(&self.insns[run.first].ip()) {
                return false;
            }
            work.extend(
                preds[k]
                    .iter()
                    .map(|&(p, _)| (p, runs[p].last + 1, depth + 1)),
            );
        }
        true
    }

    /// Whether operand `op` of `insn` is an 8-byte load other than from an
    /// import's GOT slot.
    fn reads_pointer(&self, insn: &Instruction, op: u32) -> bool {
        insn.op_kind(op) == OpKind::Memory
            && insn.memory_size().size() == 8
            && !self.reads_got(insn)
    }

    /// Whether `insn` reads a fixed word (`[rip+X]`) that the file
    /// initialises with an address of code outside this procedure: a
    /// function pointer, never a label (cc1's `init_ttree` ends in `jmp
    /// *lang_hooks.init_ts`, a tail call, while its absolute switch tables
    /// make it a procedure that takes its labels). Position-dependent files
    /// only (`data_words`).
    fn reads_function_pointer(&self, insn: &Instruction) -> bool {
        if insn.op0_kind() != OpKind::Memory || insn.memory_base() != Register::RIP {
            return false;
        }
        let at = insn.ip_rel_memory_address();
        self.ctx
            .data_words
            .iter()
            .find(|&&(_, a)| a == at)
            .is_some_and(|&(v, _)| !self.in_proc(v))
    }

    /// Whether `insn` reads an import's GOT slot (which never holds a label).
    fn reads_got(&self, insn: &Instruction) -> bool {
        insn.memory_base() == Register::RIP
            && self.ctx.got.contains_key(&insn.ip_rel_memory_address())
    }

    /// Whether a label address formed by `lea r, [rip+L]` (L inside the
    /// procedure) feeds arithmetic before `r` is redefined in its block:
    /// glibc's `&&base + offset[i]` dispatch (`printf`) and hand-written
    /// `lea L(%rip), %r9; shl $6, %ecx; add %r9, %rcx; jmp *%rcx`
    /// (`memmove-ssse3`). The procedure's jump targets are then not the
    /// addresses it takes.
    fn adds_to_labels(&self) -> bool {
        let mut info = iced_x86::InstructionInfoFactory::new();
        for (k, insn) in self.insns.iter().enumerate() {
            if insn.mnemonic() != Mnemonic::Lea
                || insn.memory_base() != Register::RIP
                || !self.in_proc(insn.ip_rel_memory_address())
            {
                continue;
            }
            let r = insn.op0_register().full_register();
            for next in &self.insns[k + 1..] {
                let used = info.info(next).used_registers().to_vec();
                let reads = used.iter().any(|u| {
                    u.register().full_register() == r
                        && matches!(
                            u.access(),
                            iced_x86::OpAccess::Read | iced_x86::OpAccess::ReadWrite
                        )
                });
                let arith = matches!(
                    next.mnemonic(),
                    Mnemonic::Add
                        | Mnemonic::Sub
                        | Mnemonic::Adc
                        | Mnemonic::Sbb
                        | Mnemonic::Or
                        | Mnemonic::Xor
                        | Mnemonic::And
                        | Mnemonic::Lea
                        | Mnemonic::Shl
                        | Mnemonic::Shr
                        | Mnemonic::Sar
                        | Mnemonic::Imul
                );
                // A memory operand with the label as base and an index:
                // `movslq (%r9,%rax,4)` reads relative to a label.
                let indexed = next.op_count() > 0
                    && (0..next.op_count()).any(|o| next.op_kind(o) == OpKind::Memory)
                    && next.memory_base().full_register() == r
                    && next.memory_index() != Register::None;
                if reads && (arith || indexed) {
                    return true;
                }
                let writes = used.iter().any(|u| {
                    u.register().full_register() == r
                        && matches!(u.access(), iced_x86::OpAccess::Write)
                });
                if writes || !is_straight(next) {
                    break;
                }
            }
        }
        false
    }

    /// Resolves the jump tables until the leaders stop changing. With
    /// `strict` false, runs without predecessors (reachable only through an
    /// indirect jump, if at all) are ignored when looking for the reaching
    /// definitions of a table base; the caller redoes the work strictly
    /// when any jump stays unresolved.
    fn resolve_tables(
        &self,
        base: &BTreeSet<u64>,
        entries: &[u64],
        strict: bool,
    ) -> Result<(BTreeSet<u64>, HashMap<u64, JumpResolution>), BuildError> {
        let entry_set: BTreeSet<u64> = entries.iter().copied().collect();
        let mut leaders = base.clone();
        let mut resolutions: HashMap<u64, JumpResolution> = HashMap::new();
        let mut converged = false;
        // Jumps that lost their resolution once the edges of a table (often
        // their own) joined the paths: they stay unresolved, which keeps the
        // rounds from oscillating (`_nl_intern_locale_data`: bounded on the
        // paths from the entry, unbounded on the way back from its targets).
        let mut lost: HashMap<u64, JumpResolution> = HashMap::new();
        for _ in 0..MAX_ROUNDS {
            let labels = self.labels(&entry_set, &resolutions);
            let runs = self.partition(&leaders);
            let start_of: HashMap<u64, usize> = runs
                .iter()
                .enumerate()
                .map(|(k, r)| (self.insns[r.first].ip(), k))
                .collect();
            let tables: HashMap<usize, Vec<u64>> = runs
                .iter()
                .enumerate()
                .filter_map(|(k, r)| match resolutions.get(&self.insns[r.last].ip()) {
                    Some(
                        JumpResolution::Table { targets, .. } | JumpResolution::Computed(targets),
                    ) => Some((k, targets.clone())),
                    _ => None,
                })
                .collect();
            let preds = self.preds(&runs, &start_of, &tables);
            let live = live_runs(&runs, &preds, |k| {
                entry_set.contains(&self.insns[runs[k].first].ip())
            });
            let mut next = base.clone();
            next.extend(labels.iter().flatten());
            // The fixpoint is over the leaders AND the table edges: a table
            // resolved this round may give a block that was already a leader
            // (the code after a `ret`) its first predecessor, and a jump
            // reached from that block must be resolved again with that path
            // (`handle_amd` in static glibc: a table's target holds a second
            // table jump).
            let previous = std::mem::take(&mut resolutions);
            let mut found: Vec<(usize, JumpResolution)> = Vec::new();
            for (k, run) in runs.iter().enumerate() {
                let last = &self.insns[run.last];
                if last.flow_control() != FlowControl::IndirectBranch || self.is_plt {
                    continue;
                }
                found.push((k, self.resolve(&runs, k, &preds, &live, &entry_set, strict)));
            }
            // A procedure that takes the addresses of its own labels (GNU
            // `&&label`) jumps to them through pointers: such a pointer jump
            // (see `loads_pointer`) may go to any of them and only to them
            // (see `labels`). Not when the procedure adds variables to a
            // label: its targets are then no address it takes.
            let arithmetic = labels.is_none()
                || found.iter().any(|(_, r)| {
                    matches!(r, JumpResolution::Unresolved(why) if *why == jumptable::LABEL_ARITHMETIC)
                });
            let takes_labels = labels.as_ref().map_or(true, |l| !l.is_empty());
            let labels = labels.unwrap_or_default();
            for (k, mut res) in found {
                let last = &self.insns[runs[k].last];
                if matches!(
                    res,
                    JumpResolution::TailCall | JumpResolution::Unresolved(_)
                ) && takes_labels
                    && !self.reads_function_pointer(last)
                {
                    if !arithmetic && self.loads_pointer(&runs, &preds, &entry_set, k) {
                        res = JumpResolution::Computed(labels.clone());
                    } else if res == JumpResolution::TailCall && !self.reads_got(last) {
                        // Any pointer here may be a label: no tail call.
                        res = JumpResolution::Unresolved(
                            "the procedure takes the address of its own labels",
                        );
                    }
                }
                if let JumpResolution::Table { targets, .. } | JumpResolution::Computed(targets) =
                    &res
                {
                    // A target outside the procedure must be another
                    // procedure's entry (a `.cold` default that aborts).
                    let inside = |t: u64| self.in_proc(t) && self.index_of(t).is_some();
                    if targets.iter().any(|&t| {
                        !inside(t) && (self.in_proc(t) || !self.ctx.names.contains_key(&t))
                    }) {
                        res = JumpResolution::Unresolved(
                            "a table entry is outside the procedure or inside an instruction",
                        );
                    } else {
                        next.extend(targets.iter().copied().filter(|&t| inside(t)));
                    }
                }
                if let Some(u) = lost.get(&last.ip()) {
                    res = u.clone();
                } else if matches!(res, JumpResolution::Unresolved(_))
                    && previous
                        .get(&last.ip())
                        .is_some_and(|p| !matches!(p, JumpResolution::Unresolved(_)))
                {
                    lost.insert(last.ip(), res.clone());
                }
                resolutions.insert(last.ip(), res);
            }
            if next == leaders && resolutions == previous {
                converged = true;
                break;
            }
            leaders = next;
        }
        if !converged {
            return Err(BuildError::TablesDoNotConverge);
        }
        Ok((leaders, resolutions))
    }

    fn assemble(
        &self,
        leaders: &BTreeSet<u64>,
        resolutions: &HashMap<u64, JumpResolution>,
        entry: u64,
    ) -> Result<Cfg, BuildError> {
        let runs = self.partition(leaders);
        let mut blocks: PrimaryMap<BlockId, Block> = PrimaryMap::with_capacity(runs.len());
        for run in &runs {
            let start = self.insns[run.first].ip();
            let insns = self.insns[run.first..=run.last]
                .iter()
                .map(|i| (i.ip() - start) as u32)
                .collect();
            blocks.push(Block {
                start,
                end: self.insns[run.last].next_ip(),
                insns,
                kind: BlockKind::Plain,
            });
        }
        let exit = BlockId::new(blocks.len());
        let starts: Vec<u64> = blocks.values().map(|b| b.start).collect();
        let block_at =
            |a: u64| -> Option<BlockId> { starts.binary_search(&a).ok().map(BlockId::new) };
        let mut is_call = vec![false; blocks.len()];
        let mut edges: Vec<CfgEdge> = Vec::new();
        let mut calls = Vec::new();
        let mut jumps = Vec::new();
        for (k, run) in runs.iter().enumerate() {
            let b = BlockId::new(k);
            let last = &self.insns[run.last];
            let next = last.next_ip();
            let mut edge = |to: BlockId, kind: EdgeKind| edges.push(CfgEdge { from: b, to, kind });
            let mut call =
                |kind: CallKind, target: Option<u64>, name: Option<String>, tail: bool| {
                    calls.push(CallSite {
                        block: b,
                        kind,
                        target,
                        name,
                        returns: true,
                        tail,
                    })
                };
            let classify = |t: u64| -> (CallKind, Option<String>) {
                match self.ctx.plt.get(&t) {
                    Some(name) => (CallKind::Plt, name.clone()),
                    None => (CallKind::Direct, self.ctx.names.get(&t).cloned()),
                }
            };
            let got_name = |insn: &Instruction| -> Option<String> {
                (insn.op0_kind() == OpKind::Memory && insn.memory_base() == Register::RIP)
                    .then(|| self.ctx.got.get(&insn.ip_rel_memory_address()).cloned())
                    .flatten()
            };
            match last.flow_control() {
                // A call into the kernel: exit and exit_group never return.
                _ if is_syscall(last) => {
                    is_call[k] = true;
                    call(CallKind::Syscall, None, None, false);
                    let n = block_at(next)
                        .filter(|_| self.in_proc(next))
                        .ok_or(BuildError::SyscallFallsOff(last.ip()))?;
                    edge(n, EdgeKind::CallReturn);
                }
                _ if is_straight(last) => match block_at(next).filter(|_| self.in_proc(next)) {
                    Some(n) => edge(n, EdgeKind::FallThrough),
                    None => {
                        // Falls off the end of the procedure into the next one.
                        is_call[k] = true;
                        let (kind, name) = classify(next);
                        call(kind, Some(next), name, true);
                        edge(exit, EdgeKind::TailCall);
                    }
                },
                FlowControl::ConditionalBranch | FlowControl::XbeginXabortXend => {
                    let t = direct_target(last).ok_or(BuildError::NoBranchTarget)?;
                    let fall = block_at(next)
                        .filter(|_| self.in_proc(next))
                        .ok_or(BuildError::BranchFallsOff(last.ip()))?;
                    match block_at(t).filter(|_| self.in_proc(t)) {
                        Some(tb) if tb == fall => edge(fall, EdgeKind::FallThrough),
                        Some(tb) => {
                            edge(tb, EdgeKind::Taken);
                            edge(fall, EdgeKind::FallThrough);
                        }
                        None => {
                            // A conditional tail call.
                            let (kind, name) = classify(t);
                            call(kind, Some(t), name, true);
                            edge(exit, EdgeKind::TailCall);
                            edge(fall, EdgeKind::FallThrough);
                        }
                    }
                }
                FlowControl::UnconditionalBranch => {
                    let t = direct_target(last).ok_or(BuildError::NoJumpTarget)?;
                    match block_at(t).filter(|_| self.in_proc(t)) {
                        Some(tb) => edge(tb, EdgeKind::Taken),
                        None => {
                            is_call[k] = true;
                            let (kind, name) = classify(t);
                            call(kind, Some(t), name, true);
                            edge(exit, EdgeKind::TailCall);
                        }
                    }
                }
                FlowControl::IndirectBranch if self.is_plt => {
                    // The stub's `jmp *GOT`: a tail call to the import; in a
                    // lazily bound `.plt` entry it first lands on the `push`.
                    let name = got_name(last)
                        .or_else(|| self.ctx.plt.get(&self.ranges[0].0).cloned().flatten());
                    call(CallKind::Plt, None, name, true);
                    edge(exit, EdgeKind::TailCall);
                    if let Some(n) = block_at(next).filter(|_| self.in_proc(next)) {
                        if self.insns[runs[n.index()].first].mnemonic() == Mnemonic::Push {
                            edge(n, EdgeKind::Taken);
                        }
                    }
                }
                FlowControl::IndirectBranch => {
                    let res = resolutions
                        .get(&last.ip())
                        .cloned()
                        .unwrap_or(JumpResolution::Unresolved("not analysed"));
                    match &res {
                        JumpResolution::Table { targets, .. }
                        | JumpResolution::Computed(targets) => {
                            let mut seen = BTreeSet::new();
                            let mut outside = BTreeSet::new();
                            for &t in targets {
                                if !self.in_proc(t) {
                                    outside.insert(t);
                                    continue;
                                }
                                let tb = block_at(t).ok_or(BuildError::TableTargetNotBlock)?;
                                if seen.insert(tb) {
                                    edge(tb, EdgeKind::JumpTable);
                                }
                            }
                            // Cases that leave for another procedure's entry
                            // are tail calls.
                            for &t in &outside {
                                let (kind, name) = classify(t);
                                call(kind, Some(t), name, true);
                            }
                            if !outside.is_empty() {
                                edge(exit, EdgeKind::TailCall);
                            }
                        }
                        JumpResolution::TailCall | JumpResolution::Unresolved(_) => {
                            is_call[k] = true;
                            call(CallKind::Indirect, None, got_name(last), true);
                            edge(exit, EdgeKind::TailCall);
                        }
                    }
                    jumps.push(IndirectJump {
                        block: b,
                        addr: last.ip(),
                        resolution: res,
                    });
                }
                FlowControl::Call | FlowControl::IndirectCall => {
                    is_call[k] = true;
                    let (kind, target, name) = match direct_target(last) {
                        Some(t) => {
                            let (k, n) = classify(t);
                            (k, Some(t), n)
                        }
                        None => (CallKind::Indirect, None, got_name(last)),
                    };
                    let ret = block_at(next).filter(|_| self.in_proc(next));
                    calls.push(CallSite {
                        block: b,
                        kind,
                        target,
                        name,
                        returns: ret.is_some(),
                        tail: false,
                    });
                    match ret {
                        Some(n) => edge(n, EdgeKind::CallReturn),
                        None => edge(exit, EdgeKind::NoReturn),
                    }
                }
                FlowControl::Return => edge(exit, EdgeKind::Return),
                // A handler may move rip past the trap: control may resume
                // at the procedure's next code, never at another
                // procedure's or at padding (nothing resumes there).
                FlowControl::Interrupt | FlowControl::Exception | FlowControl::Next => {
                    match block_at(next).filter(|_| self.in_proc(next)) {
                        Some(n) if !self.is_fill(runs[n.index()]) => edge(n, EdgeKind::Resume),
                        _ => edge(exit, EdgeKind::Halt),
                    }
                }
            }
        }
        for (k, c) in is_call.into_iter().enumerate() {
            if c {
                blocks[BlockId::new(k)].kind = BlockKind::Call;
            }
        }
        let entry = block_at(entry).ok_or(BuildError::EntryNotBlock)?;
        let mut edge_map: PrimaryMap<aetrace_graph::EdgeId, CfgEdge> =
            PrimaryMap::with_capacity(edges.len());
        let mut seen = std::collections::HashSet::new();
        for e in edges {
            if seen.insert((e.from, e.to)) {
                edge_map.push(e);
            }
        }
        let cfg = Cfg {
            blocks,
            entry,
            edges: edge_map,
            calls,
            indirect_jumps: jumps,
        };
        debug_assert_eq!(cfg.check(), Ok(()), "CFG invariants at {entry:?}");
        Ok(cfg)
    }
}

/// Adds the second decodings that branches into the middle of an
/// instruction need, when they end where that instruction ends: glibc's
/// `je 1f; lock; 1: cmpxchg` skips a `lock` prefix. Returns `None` when no
/// branch needs one. Other mid-instruction targets stay and are refused by
/// the builder.
fn add_aliases(
    insns: &[Instruction],
    ranges: &[(u64, u64)],
    ctx: &Context,
) -> Option<Vec<Instruction>> {
    let in_proc = |a: u64| ranges.iter().any(|&(s, e)| a >= s && a < e);
    let mut extra: Vec<Instruction> = Vec::new();
    for insn in insns {
        let Some(t) = direct_target(insn) else {
            continue;
        };
        if insn.flow_control() == FlowControl::Call || !in_proc(t) {
            continue;
        }
        let i = insns.partition_point(|x| x.ip() <= t);
        if i == 0 || insns[i - 1].ip() == t || extra.iter().any(|x| x.ip() == t) {
            continue;
        }
        let host = &insns[i - 1];
        let Some(bytes) = ctx.reader.memory.bytes_at(t, host.next_ip() - t) else {
            continue;
        };
        let alias =
            iced_x86::Decoder::with_ip(64, bytes, t, iced_x86::DecoderOptions::NONE).decode();
        if !alias.is_invalid() && alias.next_ip() == host.next_ip() && is_straight(&alias) {
            extra.push(alias);
        }
    }
    if extra.is_empty() {
        return None;
    }
    let mut all = insns.to_vec();
    all.extend(extra);
    all.sort_by_key(Instruction::ip);
    Some(all)
}

/// Builds the CFG of a procedure made of `ranges` (sorted, disjoint) whose
/// instructions are `insns` (sorted by address), entered at `entries`
/// (primary entry first) and, by the unwinder, at the landing pads
/// `landing_pads` (each one starts a block).
pub fn build(
    insns: &[Instruction],
    ranges: &[(u64, u64)],
    entries: &[u64],
    landing_pads: &[u64],
    is_plt: bool,
    ctx: &Context,
) -> Result<Cfg, BuildError> {
    if insns.is_empty() {
        return Err(BuildError::NoInstructions);
    }
    let aliased;
    let insns = match add_aliases(insns, ranges, ctx) {
        Some(v) => {
            aliased = v;
            &aliased[..]
        }
        None => insns,
    };
    Builder {
        insns,
        ranges,
        ctx,
        is_plt,
    }
    .build(entries, landing_pads)
}

/// Why a procedure's CFG is refused (shown to users as
/// `Procedure::cfg`'s reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The procedure has no decoded instruction.
    #[error("no instructions")]
    NoInstructions,
    /// An entry, branch target or landing pad inside an instruction.
    #[error("control enters {0:#x}, inside an instruction")]
    InsideInstruction(u64),
    /// Jump tables kept making new leaders.
    #[error("jump-table resolution did not converge")]
    TablesDoNotConverge,
    /// A `syscall` is the procedure's last instruction.
    #[error("the syscall at {0:#x} falls off the procedure")]
    SyscallFallsOff(u64),
    /// A conditional branch is the procedure's last instruction.
    #[error("the branch at {0:#x} falls off the procedure")]
    BranchFallsOff(u64),
    #[error("conditional branch without a target")]
    /// A conditional branch whose target the decoder does not give.
    NoBranchTarget,
    #[error("jump without a target")]
    /// A direct jump whose target the decoder does not give.
    NoJumpTarget,
    #[error("table target is not a block")]
    /// A resolved jump table's target does not start a block (a bug).
    TableTargetNotBlock,
    #[error("the entry is not a block")]
    /// The procedure's entry does not start a block (a bug).
    EntryNotBlock,
}

/// Which runs the known edges (`preds`) reach from the runs `is_entry`
/// picks.
fn live_runs(
    runs: &[Run],
    preds: &[Vec<(usize, bool)>],
    is_entry: impl Fn(usize) -> bool,
) -> Vec<bool> {
    let mut succs = vec![Vec::new(); runs.len()];
    for (k, ps) in preds.iter().enumerate() {
        for &(p, _) in ps {
            succs[p].push(k);
        }
    }
    let mut live = vec![false; runs.len()];
    let mut work: Vec<usize> = (0..runs.len()).filter(|&k| is_entry(k)).collect();
    while let Some(k) = work.pop() {
        if !std::mem::replace(&mut live[k], true) {
            work.extend(succs[k].iter().copied().filter(|&s| !live[s]));
        }
    }
    live
}

/// Whether `insn` writes (any part of) the general-purpose register whose
/// full form is `r`.
fn writes_gpr(
    info: &mut iced_x86::InstructionInfoFactory,
    insn: &iced_x86::Instruction,
    r: iced_x86::Register,
) -> bool {
    info.info(insn).used_registers().iter().any(|u| {
        u.register().is_gpr()
            && u.register().full_register() == r
            && !matches!(
                u.access(),
                iced_x86::OpAccess::Read
                    | iced_x86::OpAccess::CondRead
                    | iced_x86::OpAccess::NoMemAccess
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jumptable::Memory;
    use iced_x86::{Decoder, DecoderOptions};

    struct Code(Vec<u8>);

    impl Memory for Code {
        fn bytes_at(&self, addr: u64, len: u64) -> Option<&[u8]> {
            let off = usize::try_from(addr.checked_sub(0x1000)?).ok()?;
            self.0.get(off..off + usize::try_from(len).ok()?)
        }
    }

    /// Builds the procedure `[0x1000, 0x1000 + code.len())` with entry 0x1000.
    fn cfg_of(code: &[u8]) -> Result<Cfg, BuildError> {
        cfg_taking(code, &[])
    }

    /// `cfg_of` in a module that takes the code addresses `taken` (`lea`,
    /// RELATIVE relocations).
    fn cfg_taking(code: &[u8], taken: &[u64]) -> Result<Cfg, BuildError> {
        cfg_with_data(code, &[], taken)
    }

    /// `cfg_taking` with `data` (jump tables) placed right after the code,
    /// outside the procedure.
    fn cfg_with_data(code: &[u8], data: &[u8], taken: &[u64]) -> Result<Cfg, BuildError> {
        cfg_full(code, data, taken, &[])
    }

    /// `cfg_with_data` with landing pads `pads`.
    fn cfg_full(code: &[u8], data: &[u8], taken: &[u64], pads: &[u64]) -> Result<Cfg, BuildError> {
        let mem = Code([code, data].concat());
        let relative = HashMap::new();
        let (plt, got, names) = (HashMap::new(), HashMap::new(), HashMap::new());
        let ctx = Context {
            reader: TableReader {
                memory: &mem,
                pic: true,
                relative: &relative,
            },
            plt: &plt,
            got: &got,
            names: &names,
            taken,
            data_words: &[],
        };
        let insns: Vec<Instruction> = Decoder::with_ip(64, code, 0x1000, DecoderOptions::NONE)
            .into_iter()
            .collect();
        build(
            &insns,
            &[(0x1000, 0x1000 + code.len() as u64)],
            &[0x1000],
            pads,
            false,
            &ctx,
        )
    }

    #[test]
    fn landing_pads_start_blocks() {
        // call +0; mov eax, 1; mov edx, 2; ret: a pad at the second mov
        // (reached only by the unwinder) splits straight-line code.
        let code = [0xe8, 0, 0, 0, 0, 0xb8, 1, 0, 0, 0, 0xba, 2, 0, 0, 0, 0xc3];
        let plain = cfg_of(&code).unwrap();
        let with = cfg_full(&code, &[], &[], &[0x100a]).unwrap();
        assert_eq!(with.blocks.len(), plain.blocks.len() + 1);
        assert!(with.block_at(0x100a).is_some() && plain.block_at(0x100a).is_none());
        // A pad inside an instruction is refused, never rounded.
        let e = cfg_full(&code, &[], &[], &[0x100b]).unwrap_err();
        assert_eq!(e, BuildError::InsideInstruction(0x100b), "{e}");
    }

    fn edges(cfg: &Cfg) -> Vec<(u64, Option<u64>, EdgeKind)> {
        cfg.edges
            .values()
            .map(|e| {
                let to = (e.to != cfg.exit()).then(|| cfg.blocks[e.to].start);
                (cfg.blocks[e.from].start, to, e.kind)
            })
            .collect()
    }

    #[test]
    fn branch_over_a_lock_prefix_gets_a_second_decoding() {
        // je 1f; lock; 1: cmpxchg [rdi], esi; ret
        let cfg = cfg_of(&[0x74, 0x01, 0xf0, 0x0f, 0xb1, 0x37, 0xc3]).unwrap();
        let starts: Vec<u64> = cfg.blocks.values().map(|b| b.start).collect();
        assert_eq!(starts, [0x1000, 0x1002, 0x1003, 0x1006]);
        let mut e = edges(&cfg);
        e.sort_by_key(|&(f, t, _)| (f, t));
        assert_eq!(
            e,
            [
                (0x1000, Some(0x1002), EdgeKind::FallThrough),
                (0x1000, Some(0x1003), EdgeKind::Taken),
                (0x1002, Some(0x1006), EdgeKind::FallThrough),
                (0x1003, Some(0x1006), EdgeKind::FallThrough),
                (0x1006, None, EdgeKind::Return),
            ]
        );
        assert_eq!(cfg.to_graph().check(), Ok(()));
    }

    /// A table target that was already a leader (code after `jmp *%rax`)
    /// and holds a second table jump: `handle_amd` in static glibc. The
    /// second jump is reached from that target (index masked to 0..=3) and
    /// from a guard bounding it to 0..=1; the fixpoint must include the
    /// first table's edge, or the second table loses entries 2 and 3.
    #[test]
    fn a_table_target_reaching_another_table_is_a_path_to_it() {
        let code: Vec<u8> = [
            &[0x83, 0xff, 0x01][..],            // 1000: cmp edi, 1
            &[0x77, 0x16],                      // 1003: ja 101b
            &[0x48, 0x8d, 0x15, 0x2c, 0, 0, 0], // 1005: lea rdx, [rip+0x2c] (T1 = 1038)
            &[0x48, 0x63, 0x04, 0xba],          // 100c: movsxd rax, [rdx+rdi*4]
            &[0x48, 0x01, 0xd0],                // 1010: add rax, rdx
            &[0xff, 0xe0],                      // 1013: jmp rax (T1: 1015, 101a)
            &[0x83, 0xe6, 0x03],                // 1015: and esi, 3
            &[0xeb, 0x06],                      // 1018: jmp 1020
            &[0xc3],                            // 101a: ret
            &[0x83, 0xfe, 0x01],                // 101b: cmp esi, 1
            &[0x77, 0xfa],                      // 101e: ja 101a
            &[0x48, 0x8d, 0x15, 0x19, 0, 0, 0], // 1020: lea rdx, [rip+0x19] (T2 = 1040)
            &[0x48, 0x63, 0x04, 0xb2],          // 1027: movsxd rax, [rdx+rsi*4]
            &[0x48, 0x01, 0xd0],                // 102b: add rax, rdx
            &[0xff, 0xe0],                      // 102e: jmp rax (T2: 1030..=1033)
            &[0xc3, 0xc3, 0xc3, 0xc3],          // 1030: ret x4
            &[0xcc; 4],                         // 1034: int3 (padding)
        ]
        .concat();
        assert_eq!(code.len(), 0x38);
        let data: Vec<u8> = [-0x23i32, -0x1e, -0x10, -0xf, -0xe, -0xd]
            .iter()
            .flat_map(|e| e.to_le_bytes())
            .collect();
        let cfg = cfg_with_data(&code, &data, &[]).unwrap();
        let jumps: Vec<(u64, JumpResolution)> = cfg
            .indirect_jumps
            .iter()
            .map(|j| (j.addr, j.resolution.clone()))
            .collect();
        assert_eq!(
            jumps,
            [
                (
                    0x1013,
                    JumpResolution::Table {
                        table: 0x1038,
                        targets: vec![0x1015, 0x101a]
                    }
                ),
                (
                    0x102e,
                    JumpResolution::Table {
                        table: 0x1040,
                        targets: vec![0x1030, 0x1031, 0x1032, 0x1033]
                    }
                ),
            ]
        );
        assert_eq!(cfg.to_graph().check(), Ok(()));
    }

    /// `btowc`: `mov 0x30(%rax), %rbp; ror $0x11, %rbp; xor %fs:0x30,
    /// %rbp` (PTR_DEMANGLE of a function pointer), a call, then `mov %rbp,
    /// %rax; jmp *%rax`: an indirect tail call. The same from a stack slot
    /// (no pointer) stays unresolved.
    #[test]
    fn a_demangled_pointer_kept_across_a_call_is_a_tail_call() {
        let code = |load: &[u8]| -> Vec<u8> {
            let mut c = load.to_vec();
            c.extend_from_slice(&[0x48, 0xc1, 0xcd, 0x11]); // ror rbp, 0x11
            c.extend_from_slice(&[0x64, 0x48, 0x33, 0x2c, 0x25, 0x30, 0, 0, 0]); // xor rbp, fs:[0x30]
            c.extend_from_slice(&[0x48, 0x89, 0xef]); // mov rdi, rbp
            let next = 0x1000 + c.len() as i64 + 5;
            c.push(0xe8); // call 0x2000
            c.extend_from_slice(&((0x2000 - next) as i32).to_le_bytes());
            c.extend_from_slice(&[0x48, 0x89, 0xe8, 0xff, 0xe0]); // mov rax, rbp; jmp rax
            c
        };
        let cfg = cfg_of(&code(&[0x48, 0x8b, 0x6f, 0x30])).unwrap(); // mov rbp, [rdi+0x30]
        assert_eq!(cfg.indirect_jumps[0].resolution, JumpResolution::TailCall);
        let cfg = cfg_of(&code(&[0x48, 0x8b, 0x6c, 0x24, 0x08])).unwrap(); // mov rbp, [rsp+8]
        assert!(matches!(
            cfg.indirect_jumps[0].resolution,
            JumpResolution::Unresolved(_)
        ));
    }

    #[test]
    fn a_branch_into_an_instruction_is_refused() {
        // jmp 1f+1 (into the middle of the mov); 1: mov eax, 1; ret
        let e = cfg_of(&[0xeb, 0x01, 0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3]).unwrap_err();
        assert!(matches!(e, BuildError::InsideInstruction(_)), "{e}");
    }

    #[test]
    fn parallel_transfers_are_one_edge() {
        // je +0 (target = fall-through); ret
        let cfg = cfg_of(&[0x74, 0x00, 0xc3]).unwrap();
        assert_eq!(
            edges(&cfg),
            [
                (0x1000, Some(0x1002), EdgeKind::FallThrough),
                (0x1002, None, EdgeKind::Return),
            ]
        );
        assert_eq!(cfg.num_predicates(), 0);
    }

    #[test]
    fn a_trap_resumes_at_its_procedures_next_code_only() {
        // ud2; hlt; ret; ud2; nop; nop (fill to the procedure's end)
        let cfg = cfg_of(&[0x0f, 0x0b, 0xf4, 0xc3, 0x0f, 0x0b, 0x90, 0x90]).unwrap();
        assert_eq!(
            edges(&cfg)[..4],
            [
                (0x1000, Some(0x1002), EdgeKind::Resume),
                (0x1002, Some(0x1003), EdgeKind::Resume),
                (0x1003, None, EdgeKind::Return),
                (0x1004, None, EdgeKind::Halt),
            ]
        );
    }

    #[test]
    fn calls_tail_calls_and_halts() {
        // call 0x2000; jne 0x3000 (conditional tail call); jmp 0x4000 (tail call)
        let mut code = vec![0xe8];
        code.extend((0x2000i32 - 0x1005).to_le_bytes());
        code.extend([0x0f, 0x85]);
        code.extend((0x3000i32 - 0x100b).to_le_bytes());
        code.push(0xe9);
        code.extend((0x4000i32 - 0x1010).to_le_bytes());
        code.extend([0x0f, 0x0b]); // ud2 (unreachable)
        let cfg = cfg_of(&code).unwrap();
        assert_eq!(
            edges(&cfg),
            [
                (0x1000, Some(0x1005), EdgeKind::CallReturn),
                (0x1005, None, EdgeKind::TailCall),
                (0x1005, Some(0x100b), EdgeKind::FallThrough),
                (0x100b, None, EdgeKind::TailCall),
                (0x1010, None, EdgeKind::Halt),
            ]
        );
        let kinds: Vec<BlockKind> = cfg.blocks.values().map(|b| b.kind).collect();
        assert_eq!(
            kinds,
            [
                BlockKind::Call,
                BlockKind::Plain,
                BlockKind::Call,
                BlockKind::Plain
            ]
        );
        let targets: Vec<(Option<u64>, bool)> =
            cfg.calls.iter().map(|c| (c.target, c.tail)).collect();
        assert_eq!(
            targets,
            [
                (Some(0x2000), false),
                (Some(0x3000), true),
                (Some(0x4000), true)
            ]
        );
        let g = cfg.to_graph();
        assert_eq!(g.num_vertices(), 5);
        assert!(g.is_predicate(aetrace_graph::BlockId::new(1)));
    }

    #[test]
    fn a_call_at_the_end_never_returns() {
        // push rbx; call 0x2000 (the procedure ends after it)
        let mut code = vec![0x53, 0xe8];
        code.extend((0x2000i32 - 0x1006).to_le_bytes());
        let cfg = cfg_of(&code).unwrap();
        assert_eq!(edges(&cfg), [(0x1000, None, EdgeKind::NoReturn)]);
        assert!(!cfg.calls[0].returns);
    }

    /// `mov rax, [rdi]; jmp rax` then two labels (`mov eax, n; ret`).
    const POINTER_JUMP: [u8; 17] = [
        0x48, 0x8b, 0x07, 0xff, 0xe0, 0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3, 0xb8, 0x02, 0x00, 0x00,
        0x00, 0xc3,
    ];

    #[test]
    fn a_pointer_jump_goes_to_every_address_taken_label() {
        let cfg = cfg_taking(&POINTER_JUMP, &[0x1005, 0x100b]).unwrap();
        assert_eq!(
            cfg.indirect_jumps[0].resolution,
            JumpResolution::Computed(vec![0x1005, 0x100b])
        );
        let mut e = edges(&cfg);
        e.sort_by_key(|&(f, t, _)| (f, t));
        assert_eq!(
            e,
            [
                (0x1000, Some(0x1005), EdgeKind::JumpTable),
                (0x1000, Some(0x100b), EdgeKind::JumpTable),
                (0x1005, None, EdgeKind::Return),
                (0x100b, None, EdgeKind::Return),
            ]
        );
        assert_eq!(cfg.blocks[cfg.entry].kind, BlockKind::Plain);
        // Without labels the same jump is an indirect tail call.
        let cfg = cfg_of(&POINTER_JUMP).unwrap();
        assert_eq!(cfg.indirect_jumps[0].resolution, JumpResolution::TailCall);
    }

    #[test]
    fn arithmetic_on_a_label_leaves_the_jump_unresolved() {
        // lea r9, [rip+6] (= 0x100d); add rcx, r9; jmp rcx; ret; ret
        let code = [
            0x4c, 0x8d, 0x0d, 0x06, 0x00, 0x00, 0x00, 0x4c, 0x01, 0xc9, 0xff, 0xe1, 0xc3, 0xc3,
        ];
        let cfg = cfg_taking(&code, &[0x100d]).unwrap();
        assert!(
            matches!(
                cfg.indirect_jumps[0].resolution,
                JumpResolution::Unresolved(_)
            ),
            "{:?}",
            cfg.indirect_jumps[0].resolution
        );
    }
}
