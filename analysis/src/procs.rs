//! Procedure discovery: which address ranges are procedures, and which
//! ranges form one procedure.
//!
//! Sources, strongest first: `.eh_frame` FDE ranges (parsed with gimli,
//! present in stripped binaries too), sized `.symtab`/`.dynsym` function
//! symbols, then start addresses without a known end: the entry point,
//! `DT_INIT`/`DT_FINI` and the init/fini arrays, unsized symbols, direct
//! call and jump targets found by decoding, code addresses taken by
//! RIP-relative `lea` or RELATIVE relocations (only where no other source
//! covers them), the address a range falls through to at its end, and,
//! last, clean code past the padding of a gap between ranges. A
//! start without an end gets the extent a recursive descent from it reaches
//! before the next known range. PLT stubs are ranges of their own.
//!
//! Decoding and scanning repeat until no source adds a range. Then ranges
//! are grouped: a direct jump from range A into the *middle* of range B
//! (gcc's `foo.cold` jumping back into `foo`, shared tails in hand-written
//! assembly) puts A and B in one procedure, whose primary range is one that
//! is not such a jumper. A call target or symbol in the middle of a range is
//! an extra entry of its procedure.
//!
//! Invariants: ranges are disjoint, non-empty, and lie inside one executable
//! section each; every range belongs to exactly one plan; a plan's entries
//! include its primary start.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register};
use rayon::prelude::*;

use crate::elf::{Module, R_X86_64_RELATIVE};
use crate::plt::PltStub;

/// Why an address is believed to start a procedure.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// An `.eh_frame` FDE starts there.
    Fde,
    /// A `.symtab` function symbol.
    Symtab,
    /// A `.dynsym` function symbol.
    Dynsym,
    /// The ELF entry point.
    Entry,
    /// An init or fini array entry, or `DT_INIT`/`DT_FINI`.
    InitFini,
    /// A PLT stub.
    Plt,
    /// The target of a direct call.
    CallTarget,
    /// The target of a direct jump from outside the range.
    JumpTarget,
    /// Where a preceding range's code falls through to.
    FallThrough,
    /// A code address taken by a RIP-relative `lea`.
    AddressTaken,
    /// Code in a gap between ranges that nothing found names (see
    /// `gap_starts`).
    Gap,
}

impl Source {
    /// The source's name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Fde => "fde",
            Source::Symtab => "symtab",
            Source::Dynsym => "dynsym",
            Source::Entry => "entry",
            Source::InitFini => "init-fini",
            Source::Plt => "plt",
            Source::CallTarget => "call-target",
            Source::JumpTarget => "jump-target",
            Source::FallThrough => "fall-through",
            Source::AddressTaken => "address-taken",
            Source::Gap => "gap",
        }
    }
}

/// A contiguous run of code belonging to one procedure.
#[derive(Clone, Debug)]
pub struct Range {
    /// Link-time address of the range's first byte.
    pub start: u64,
    /// Link-time address just past its last byte.
    pub end: u64,
    /// Every reason to believe the range starts a procedure.
    pub sources: BTreeSet<Source>,
    /// The PLT stub this range is, if it is one.
    pub stub: Option<usize>,
}

/// The linear-sweep decoding of one range.
#[derive(Clone, Debug, Default)]
pub struct Decoded {
    /// The instructions decoded, in address order.
    pub insns: Vec<Instruction>,
    /// Why the sweep failed (undecodable bytes, a range ending inside an
    /// instruction); `insns` then holds what decoded before.
    pub error: Option<String>,
}

/// What decoding a range tells discovery.
#[derive(Clone, Debug, Default)]
struct Scan {
    calls: Vec<u64>,
    /// Direct jump targets outside the range.
    jumps: Vec<u64>,
    /// The address control falls through to at the end of the range.
    falloff: Option<u64>,
    /// Code addresses formed by RIP-relative `lea`.
    refs: Vec<u64>,
}

/// One procedure to build: a group of ranges.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Indices into `Discovery::ranges`, in address order.
    pub ranges: Vec<usize>,
    /// Index (into `ranges`) of the primary range, which names the procedure.
    pub primary: usize,
    /// Addresses where control may enter from outside (primary start first).
    pub entries: Vec<u64>,
    /// The procedure's name.
    pub name: String,
}

/// The result of discovery.
#[derive(Debug)]
pub struct Discovery {
    /// Every range found, in address order.
    pub ranges: Vec<Range>,
    /// The linear-sweep decoding of each range (same indices).
    pub decoded: Vec<Decoded>,
    /// The procedures to build, one per group of ranges.
    pub plans: Vec<Plan>,
    /// The PLT stubs.
    pub stubs: Vec<PltStub>,
    /// Number of FDEs whose range lies in an executable section.
    pub fdes: usize,
    /// Every code address the module takes (RIP-relative `lea`, RELATIVE
    /// relocations), sorted: inside a procedure, other than at an entry,
    /// one is a label (GNU `&&label`), which a pointer jump may reach.
    pub taken: Vec<u64>,
    /// In position-dependent (`ET_EXEC`) files: every 8-byte aligned word
    /// of `.rodata*`/`.data*` that holds a code address, as `(value, word
    /// address)` sorted. Absolute code pointers there are function pointers,
    /// jump-table entries or labels (`static void *t[] = {&&a, ...}`); PIC
    /// files have RELATIVE relocations instead (in `taken`).
    pub data_words: Vec<(u64, u64)>,
    /// Code no range holds (see [`unowned_code`]), ascending.
    pub unowned: Vec<(u64, u64)>,
}

/// Decodes `[start, end)` linearly.
pub fn decode_range(module: &Module, start: u64, end: u64) -> Decoded {
    let Some(bytes) = module.bytes_at(start, end - start) else {
        return Decoded {
            insns: Vec::new(),
            error: Some(format!("no file bytes for [{start:#x}, {end:#x})")),
        };
    };
    let mut d = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
    let mut insns = Vec::with_capacity(bytes.len() / 4);
    let mut error = None;
    while d.can_decode() {
        let insn = d.decode();
        if insn.is_invalid() {
            error = Some(
                if insn.next_ip() >= end || d.last_error() == iced_x86::DecoderError::NoMoreBytes {
                    format!(
                        "the range [{start:#x}, {end:#x}) ends inside the instruction at {:#x}",
                        insn.ip()
                    )
                } else {
                    format!("undecodable bytes at {:#x}", insn.ip())
                },
            );
            break;
        }
        insns.push(insn);
    }
    Decoded { insns, error }
}

/// Whether `insn` is a system call instruction (`syscall`, `sysenter`).
pub fn is_syscall(insn: &Instruction) -> bool {
    matches!(insn.mnemonic(), Mnemonic::Syscall | Mnemonic::Sysenter)
}

/// Whether `insn` continues to the next instruction. A system call still
/// ends its basic block (`build`: a call vertex, `cfg::CallKind::Syscall`).
pub fn is_straight(insn: &Instruction) -> bool {
    match insn.flow_control() {
        // `hlt` faults in user mode: it ends the thread like `ud2`.
        FlowControl::Next | FlowControl::XbeginXabortXend => {
            !matches!(insn.mnemonic(), Mnemonic::Xbegin | Mnemonic::Hlt)
        }
        FlowControl::Call => is_syscall(insn),
        // A program's own `int3` raises SIGTRAP; a handler that returns
        // goes on after it, like after `int n`.
        FlowControl::Interrupt => matches!(insn.mnemonic(), Mnemonic::Int | Mnemonic::Int3),
        _ => false,
    }
}

/// Whether control can continue at `insn.next_ip()` after `insn`.
pub fn falls_through(insn: &Instruction) -> bool {
    is_straight(insn)
        || matches!(
            insn.flow_control(),
            FlowControl::ConditionalBranch | FlowControl::Call | FlowControl::IndirectCall
        )
        || insn.mnemonic() == Mnemonic::Xbegin
}

/// The direct target of a branch, call or `xbegin`.
pub fn direct_target(insn: &Instruction) -> Option<u64> {
    matches!(
        insn.op0_kind(),
        OpKind::NearBranch64 | OpKind::NearBranch32 | OpKind::NearBranch16
    )
    .then(|| insn.near_branch_target())
}

fn scan(decoded: &Decoded, start: u64, end: u64, module: &Module) -> Scan {
    let mut s = Scan::default();
    for insn in &decoded.insns {
        match insn.flow_control() {
            FlowControl::Call => {
                if let Some(t) = direct_target(insn) {
                    s.calls.push(t);
                }
            }
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch => {
                if let Some(t) = direct_target(insn) {
                    if t < start || t >= end {
                        s.jumps.push(t);
                    }
                }
            }
            _ => {}
        }
        // Position-dependent code takes code addresses as immediates
        // (`mov $fn, %edi`).
        if module.kind == crate::elf::ElfKind::Exec {
            for op in 0..insn.op_count() {
                if matches!(
                    insn.op_kind(op),
                    OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate64
                ) {
                    let a = insn.immediate(op);
                    if module.is_exec(a) {
                        s.refs.push(a);
                    }
                }
            }
        }
        if insn.mnemonic() == Mnemonic::Lea && insn.memory_base() == Register::RIP {
            let a = insn.ip_rel_memory_address();
            if module.is_exec(a) {
                s.refs.push(a);
            }
        }
    }
    if decoded.error.is_none() {
        if let Some(last) = decoded.insns.last() {
            if last.next_ip() == end
                && (is_straight(last) || last.flow_control() == FlowControl::ConditionalBranch)
            {
                s.falloff = Some(end);
            }
        }
    }
    s
}

/// FDE ranges `[start, end)` from `.eh_frame` (signal trampolines'
/// ranges corrected to start at their first instruction).
pub fn fde_ranges(module: &Module) -> Vec<(u64, u64)> {
    let Some(sec) = module.section(".eh_frame") else {
        return Vec::new();
    };
    let Some(bytes) = module.section_bytes(sec) else {
        return Vec::new();
    };
    let eh = EhFrame::new(bytes, LittleEndian);
    let mut bases = BaseAddresses::default().set_eh_frame(sec.addr);
    if let Some(t) = module.section(".text") {
        bases = bases.set_text(t.addr);
    }
    if let Some(g) = module.section(".got") {
        bases = bases.set_got(g.addr);
    }
    let mut out = Vec::new();
    let mut entries = eh.entries(&bases);
    // A malformed entry ends the walk: later FDEs cannot be located without
    // the length of the bad one.
    while let Ok(Some(entry)) = entries.next() {
        if let CieOrFde::Fde(partial) = entry {
            if let Ok(fde) = partial.parse(EhFrame::cie_from_offset) {
                let s = fde.initial_address();
                let e = s.saturating_add(fde.len());
                // A signal trampoline's FDE (CIE augmentation "S") starts one
                // byte before the code, because unwinders look up the return
                // address minus one (glibc's `__restore_rt`).
                let s = if fde.cie().is_signal_trampoline() {
                    s + 1
                } else {
                    s
                };
                if e > s {
                    out.push((s, e));
                }
            }
        }
    }
    out
}

/// The 8-byte aligned words of the module's data sections (`.rodata*`,
/// `.data*`) whose value satisfies `is_code`, as `(value, address)` sorted.
fn code_words(module: &Module, is_code: impl Fn(u64) -> bool) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for sec in &module.sections {
        if !sec.alloc
            || sec.exec
            || !(sec.name.starts_with(".rodata") || sec.name.starts_with(".data"))
        {
            continue;
        }
        let Some(bytes) = module.section_bytes(sec) else {
            continue;
        };
        let skip = (sec.addr.wrapping_neg() % 8) as usize;
        let Some(aligned) = bytes.get(skip..) else {
            continue;
        };
        for (k, w) in aligned.chunks_exact(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            let v = u64::from_le_bytes(b);
            if is_code(v) {
                out.push((v, sec.addr + (skip + 8 * k) as u64));
            }
        }
    }
    out.sort_unstable();
    out
}

/// Whether a data word holding `a` looks like a function pointer's slot
/// rather than a jump table's case: neither word beside it holds an
/// address of the same group (`own`). A `.cold` part's start is often a
/// case of its group's absolute table (`traces/cold_slot.c`); a type's
/// slot (python3's `tp_init`) sits among other functions' addresses.
fn slot_names(
    data_words: &[(u64, u64)],
    word_at: &HashMap<u64, u64>,
    a: u64,
    own: impl Fn(u64) -> bool,
) -> bool {
    let first = data_words.partition_point(|&(v, _)| v < a);
    let case = |at: u64| word_at.get(&at).is_some_and(|&v| own(v));
    data_words[first..]
        .iter()
        .take_while(|&&(v, _)| v == a)
        .any(|&(_, at)| !case(at.wrapping_sub(8)) && !case(at + 8))
}

/// How far a recursive descent from `start` gets before `limit`.
fn explore(module: &Module, start: u64, limit: u64) -> u64 {
    let Some(bytes) = module.bytes_at(start, limit - start) else {
        return start;
    };
    let mut end = start;
    let mut seen = BTreeSet::new();
    let mut work = vec![start];
    let mut budget = 200_000;
    while let Some(a) = work.pop() {
        if a < start || a >= limit || !seen.insert(a) || budget == 0 {
            continue;
        }
        budget -= 1;
        let off = (a - start) as usize;
        let mut d = Decoder::with_ip(64, &bytes[off..], a, DecoderOptions::NONE);
        let insn = d.decode();
        if insn.is_invalid() {
            continue;
        }
        end = end.max(insn.next_ip());
        if falls_through(&insn) {
            work.push(insn.next_ip());
        }
        if matches!(
            insn.flow_control(),
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
        ) || insn.mnemonic() == Mnemonic::Xbegin
        {
            if let Some(t) = direct_target(&insn) {
                work.push(t);
            }
        }
    }
    end
}

/// Code that no source names, in the gaps between known ranges: where
/// a gap's padding (nops, `int3`, zero bytes) ends at a 16-byte boundary
/// and a descent from there decodes cleanly and ends in no fall-through.
/// Only an indirect jump reaches such code (a stripped assembly function's
/// labels past its `jmp *%rcx`, `scaled` of `traces/computed_jump.c`);
/// a range of its own makes its start a traced procedure's springboard,
/// where it would otherwise run untraced with nothing in the trace to say
/// so. One start per gap and round: the rest of the gap comes next round.
fn gap_starts(st: &State, tried: &HashSet<u64>) -> Vec<u64> {
    (gaps(st).into_iter())
        .flat_map(|(a, b)| gap_code(st.module, a, b))
        .filter(|a| !tried.contains(a))
        .collect()
}

/// The stretches of the executable, non-PLT sections between the ranges
/// found so far, in address order.
fn gaps(st: &State) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(sec_start, sec_end) in &st.code {
        let mut cursor = sec_start;
        let bounds = st
            .by_start
            .range(sec_start..sec_end)
            .map(|(&s, &i)| (s, st.ranges[i].end));
        for (s, e) in bounds.chain(std::iter::once((sec_end, sec_end))) {
            if s > cursor {
                out.push((cursor, s));
            }
            cursor = cursor.max(e);
        }
    }
    out
}

/// Bytes of the executable, non-PLT sections that no range holds once
/// discovery is done, each gap from its first byte that is no padding
/// (nops, `int3`, zero bytes) to its end: code only a jump the analysis
/// cannot follow reaches (a label past the end of a stripped assembly
/// function, not on a 16-byte boundary), or data in a code section. An
/// unresolved jump into it would run it untraced, so the rewriter's
/// dispatch writes DESYNC there (`docs/rewrite.md`, "Code no procedure
/// holds").
fn unowned_code(st: &State) -> Vec<(u64, u64)> {
    (gaps(st).into_iter())
        .map(|(a, b)| (past_padding(st.module, a, b), b))
        .filter(|&(a, b)| a < b)
        .collect()
}

/// The first byte of `[a, b)` past its padding (nops, `int3`, zero
/// bytes); `b` when it is all padding (or unreadable).
fn past_padding(module: &Module, a: u64, b: u64) -> u64 {
    let Some(bytes) = module.bytes_at(a, b - a) else {
        return b;
    };
    let mut d = Decoder::with_ip(64, bytes, a, DecoderOptions::NONE);
    let mut p = a;
    while p < b {
        if bytes[(p - a) as usize] == 0 {
            p += 1;
            continue;
        }
        if d.set_position((p - a) as usize).is_err() {
            return b;
        }
        d.set_ip(p);
        let insn = d.decode();
        if insn.is_invalid() || !matches!(insn.mnemonic(), Mnemonic::Nop | Mnemonic::Int3) {
            break;
        }
        p = insn.next_ip();
    }
    p.min(b)
}

/// The start of clean code past the padding of gap `[a, b)`, if any (see
/// [`gap_starts`]).
fn gap_code(module: &Module, a: u64, b: u64) -> Option<u64> {
    let p = past_padding(module, a, b);
    if p >= b || p % 16 != 0 {
        return None;
    }
    let end = explore(module, p, b);
    let code = decode_range(module, p, end);
    let last = code.insns.last()?;
    (code.error.is_none() && last.next_ip() == end && !falls_through(last)).then_some(p)
}

/// Union-find over range indices.
fn find(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

struct State<'m> {
    module: &'m Module,
    ranges: Vec<Range>,
    /// start -> index into `ranges`.
    by_start: BTreeMap<u64, usize>,
    /// Executable, non-PLT sections `[addr, end)` where new ranges may start.
    code: Vec<(u64, u64)>,
}

impl State<'_> {
    /// The range containing `a`.
    fn containing(&self, a: u64) -> Option<usize> {
        let (_, &i) = self.by_start.range(..=a).next_back()?;
        (a < self.ranges[i].end).then_some(i)
    }

    fn add(
        &mut self,
        start: u64,
        end: u64,
        sources: BTreeSet<Source>,
        stub: Option<usize>,
    ) -> usize {
        let i = self.ranges.len();
        self.ranges.push(Range {
            start,
            end,
            sources,
            stub,
        });
        self.by_start.insert(start, i);
        i
    }

    /// Adds ranges for `starts` (sorted) not inside any range, each up to
    /// where a descent from it reaches before the next known start.
    fn add_open_starts(&mut self, starts: &BTreeMap<u64, BTreeSet<Source>>) -> bool {
        let mut added = false;
        let keys: Vec<u64> = starts.keys().copied().collect();
        for (k, &a) in keys.iter().enumerate() {
            if self.containing(a).is_some() {
                continue;
            }
            let Some(&(_, sec_end)) = self.code.iter().find(|(s, e)| a >= *s && a < *e) else {
                continue;
            };
            let next_range = self
                .by_start
                .range(a..)
                .next()
                .map_or(u64::MAX, |(&s, _)| s);
            let next_start = keys.get(k + 1).copied().unwrap_or(u64::MAX);
            let limit = sec_end.min(next_range).min(next_start);
            let end = explore(self.module, a, limit);
            if end > a {
                self.add(a, end, starts[&a].clone(), None);
                added = true;
            }
        }
        added
    }
}

/// Finds the module's procedures.
pub fn discover(module: &Module, stubs: Vec<PltStub>) -> Discovery {
    let plt_secs: Vec<(u64, u64)> = module
        .exec_sections()
        .filter(|s| s.name.starts_with(".plt"))
        .map(|s| (s.addr, s.end()))
        .collect();
    let in_plt = |a: u64| plt_secs.iter().any(|&(s, e)| a >= s && a < e);
    let code: Vec<(u64, u64)> = module
        .exec_sections()
        .filter(|s| !s.name.starts_with(".plt"))
        .map(|s| (s.addr, s.end()))
        .collect();
    let section_of = |a: u64| code.iter().position(|&(s, e)| a >= s && a < e);
    let mut st = State {
        module,
        ranges: Vec::new(),
        by_start: BTreeMap::new(),
        code: code.clone(),
    };
    for (i, s) in stubs.iter().enumerate() {
        st.add(s.start, s.end, BTreeSet::from([Source::Plt]), Some(i));
    }

    // Sized candidates: FDEs, then symbols. Overlapping candidates merge into
    // the first; a start inside another range becomes an entry.
    let fdes = fde_ranges(module);
    let mut sized: Vec<(u64, u64, Source)> = Vec::new();
    let mut fde_count = 0;
    for &(s, e) in &fdes {
        if let Some(k) = section_of(s) {
            if e <= code[k].1 {
                sized.push((s, e, Source::Fde));
                fde_count += 1;
            }
        }
    }
    let mut open: BTreeMap<u64, BTreeSet<Source>> = BTreeMap::new();
    for sym in &module.func_symbols {
        if in_plt(sym.addr) {
            continue;
        }
        let src = match sym.source {
            crate::elf::SymSource::Symtab => Source::Symtab,
            crate::elf::SymSource::Dynsym => Source::Dynsym,
        };
        match section_of(sym.addr) {
            Some(k) if sym.size > 0 && sym.addr.saturating_add(sym.size) <= code[k].1 => {
                sized.push((sym.addr, sym.addr + sym.size, src))
            }
            Some(_) => {
                open.entry(sym.addr).or_default().insert(src);
            }
            None => {}
        }
    }
    sized.sort_by_key(|&(s, e, src)| (s, std::cmp::Reverse(e), src));
    let mut entry_facts: Vec<(u64, Source)> = Vec::new();
    for (s, e, src) in sized {
        match st.containing(s) {
            Some(i) if st.ranges[i].start == s => {
                st.ranges[i].sources.insert(src);
            }
            Some(_) => entry_facts.push((s, src)),
            None => {
                // A sized candidate overlapping the next range is cut short:
                // the earlier-starting, stronger source wins its bytes.
                let next = st.by_start.range(s..).next().map_or(u64::MAX, |(&a, _)| a);
                st.add(s, e.min(next), BTreeSet::from([src]), None);
            }
        }
    }
    for &a in std::iter::once(&module.entry).chain(&module.init_fini) {
        let src = if a == module.entry {
            Source::Entry
        } else {
            Source::InitFini
        };
        open.entry(a).or_default().insert(src);
    }
    let open_facts: Vec<(u64, Source)> = open
        .iter()
        .flat_map(|(&a, ss)| ss.iter().map(move |&s| (a, s)))
        .collect();
    entry_facts.extend(open_facts);
    let mut pending = open;

    // Pointers to code in relocated data (function pointer tables).
    let mut ref_facts: Vec<u64> = module
        .dyn_relocs
        .iter()
        .filter(|r| r.r_type == R_X86_64_RELATIVE)
        .map(|r| r.addend as u64)
        .filter(|&a| section_of(a).is_some())
        .collect();

    let mut decoded: Vec<Option<Decoded>> = Vec::new();
    let mut scans: Vec<Scan> = Vec::new();
    let mut jump_facts: Vec<(usize, u64)> = Vec::new();
    let mut call_facts: Vec<u64> = Vec::new();
    let mut falloff_facts: Vec<(usize, u64)> = Vec::new();
    // Starts already tried: one that gave no range (nothing decodable there)
    // would give none again, and must not keep the loop going.
    let mut tried: HashSet<u64> = HashSet::new();
    loop {
        st.add_open_starts(&pending);
        tried.extend(pending.keys().copied());
        pending.clear();
        // Decode and scan the ranges added since the last round.
        let first_new = decoded.len();
        let fresh: Vec<(Decoded, Scan)> = st.ranges[first_new..]
            .par_iter()
            .map(|r| {
                let d = decode_range(module, r.start, r.end);
                let s = if r.stub.is_some() {
                    Scan::default()
                } else {
                    scan(&d, r.start, r.end, module)
                };
                (d, s)
            })
            .collect();
        for (k, (d, s)) in fresh.into_iter().enumerate() {
            let i = first_new + k;
            jump_facts.extend(s.jumps.iter().map(|&t| (i, t)));
            call_facts.extend(&s.calls);
            falloff_facts.extend(s.falloff.map(|t| (i, t)));
            ref_facts.extend(&s.refs);
            decoded.push(Some(d));
            scans.push(s);
        }
        // Facts whose address no range holds start new ranges.
        let mut add = |a: u64, src: Source, st: &State| {
            if st.containing(a).is_none() && section_of(a).is_some() && !tried.contains(&a) {
                pending.entry(a).or_default().insert(src);
            }
        };
        for &a in &call_facts {
            add(a, Source::CallTarget, &st);
        }
        for &(_, a) in &jump_facts {
            add(a, Source::JumpTarget, &st);
        }
        for &(_, a) in &falloff_facts {
            add(a, Source::FallThrough, &st);
        }
        for &a in &ref_facts {
            add(a, Source::AddressTaken, &st);
        }
        if pending.is_empty() {
            for a in gap_starts(&st, &tried) {
                pending.entry(a).or_default().insert(Source::Gap);
            }
        }
        if pending.is_empty() {
            break;
        }
    }
    drop(scans);

    // Sources on range starts, extra entries in range middles.
    let mut extra: HashMap<usize, BTreeSet<u64>> = HashMap::new();
    let mut note = |a: u64, src: Source, st: &mut State| {
        if let Some(i) = st.containing(a) {
            if st.ranges[i].start == a {
                st.ranges[i].sources.insert(src);
            } else if src != Source::JumpTarget && src != Source::FallThrough {
                extra.entry(i).or_default().insert(a);
            }
        }
    };
    for &(a, src) in &entry_facts {
        note(a, src, &mut st);
    }
    for &a in &call_facts {
        note(a, Source::CallTarget, &mut st);
    }
    // A code address taken at a range start (an ifunc resolver returning
    // `lea impl(%rip)`, a callback) makes that start an entry; inside a
    // range it is a label, not an entry.
    for &a in &ref_facts {
        if let Some(i) = st.containing(a) {
            if st.ranges[i].start == a {
                st.ranges[i].sources.insert(Source::AddressTaken);
            }
        }
    }

    // Group ranges joined by jumps into the middle.
    let n = st.ranges.len();
    let mut parent: Vec<usize> = (0..n).collect();
    let mut jumper = vec![false; n];
    for &(from, t) in &jump_facts {
        let Some(to) = st.containing(t) else { continue };
        if st.ranges[to].start == t {
            st.ranges[to].sources.insert(Source::JumpTarget);
            continue;
        }
        if to == from || st.ranges[to].stub.is_some() || st.ranges[from].stub.is_some() {
            continue;
        }
        jumper[from] = true;
        let (a, b) = (find(&mut parent, from), find(&mut parent, to));
        parent[a] = b;
    }
    // A range that runs into the next one (hand-written assembly such as
    // `__memcpy_chk` followed by `memmove`) forms one procedure with it: the
    // transfer is an ordinary fall-through.
    for &(from, t) in &falloff_facts {
        if let Some(to) = st.containing(t) {
            if st.ranges[to].start == t && st.ranges[to].stub.is_none() {
                st.ranges[to].sources.insert(Source::FallThrough);
                let (a, b) = (find(&mut parent, from), find(&mut parent, to));
                parent[a] = b;
            }
        }
    }
    // Ranges whose start another range of their group jumps to.
    let mut jumped_to = vec![false; n];
    for &(from, t) in &jump_facts {
        if let Some(to) = st.containing(t).filter(|&to| to != from) {
            if st.ranges[to].start == t && find(&mut parent, from) == find(&mut parent, to) {
                jumped_to[to] = true;
            }
        }
    }
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| st.ranges[i].start);
    for i in order {
        let root = find(&mut parent, i);
        groups.entry(root).or_default().push(i);
    }
    let symbol_names: HashMap<u64, &str> = {
        let mut m = HashMap::new();
        // .symtab names win over .dynsym ones (they come first).
        for s in &module.func_symbols {
            if !s.name.is_empty() {
                m.entry(s.addr).or_insert(s.name.as_str());
            }
        }
        m
    };
    let data_words = if module.kind == crate::elf::ElfKind::Exec {
        code_words(module, |a| section_of(a).is_some())
    } else {
        Vec::new()
    };
    let word_at: HashMap<u64, u64> = data_words.iter().map(|&(v, at)| (at, v)).collect();
    let mut plans: Vec<Plan> = groups
        .into_values()
        .map(|members| {
            // Where control enters the group from outside: a range start
            // that something outside names (a call, a symbol that is not a
            // `.cold` part, the ELF entry, init/fini arrays, an address taken,
            // or a jump from another group: a tail call). A `.cold` part is
            // entered only by jumps of its own group.
            let outside_jump: BTreeSet<u64> = jump_facts
                .iter()
                .filter(|&&(from, _)| !members.contains(&from))
                .map(|&(_, t)| t)
                .collect();
            let called = |i: usize| {
                let r = &st.ranges[i];
                let cold_symbol = symbol_names
                    .get(&r.start)
                    .is_some_and(|n| n.contains(".cold"));
                r.sources.iter().any(|s| {
                    matches!(
                        s,
                        Source::CallTarget
                            | Source::Entry
                            | Source::InitFini
                            | Source::AddressTaken
                            | Source::Dynsym
                    ) || (*s == Source::Symtab && !cold_symbol)
                })
            };
            let named = |i: usize| called(i) || outside_jump.contains(&st.ranges[i].start);
            // The primary range: the largest named by something but a
            // jump; without any, of those whose start no member jumps to
            // (a `.cold` part is entered by its group's jumps; cc1's
            // `output_*` functions, named only by a data table, jump into
            // their `.cold` part's middle, which never comes back), the
            // largest a data slot names (python3's `member_get`, named
            // only by a type's slot, while its `.cold` part's start is a
            // case of its switch table; python3's 0x56a100, whose `.cold`
            // start another function's jump names: as a secondary entry
            // the hot part had no register free for its stub), then the
            // largest an outside jump names, else the first; else the
            // first that does not jump into another member's middle.
            let size = |i: usize| st.ranges[i].end - st.ranges[i].start;
            let largest = |keep: &dyn Fn(usize) -> bool| {
                let m = members.iter().copied().filter(|&i| keep(i));
                m.max_by_key(|&i| (size(i), std::cmp::Reverse(st.ranges[i].start)))
            };
            let data_named = |i: usize| {
                let own = |v: u64| st.containing(v).is_some_and(|k| members.contains(&k));
                !jumped_to[i] && slot_names(&data_words, &word_at, st.ranges[i].start, own)
            };
            let primary = largest(&|i| called(i))
                .or_else(|| largest(&data_named))
                .or_else(|| largest(&|i| named(i)))
                .or_else(|| members.iter().copied().find(|&i| !jumped_to[i]))
                .or_else(|| members.iter().copied().find(|&i| !jumper[i]))
                .unwrap_or(members[0]);
            // Every other range entered from outside is an entry too, a
            // data word's included: python3's `dict_init`-like 0x56a100,
            // named only by a type's slot, shares its group with a `.cold`
            // part that another function's `ja` (to an unreachable
            // default) names, and got no springboard.
            let mut entries = vec![st.ranges[primary].start];
            for &i in &members {
                if i != primary && (named(i) || data_named(i)) {
                    entries.push(st.ranges[i].start);
                }
                entries.extend(extra.get(&i).into_iter().flatten());
            }
            entries[1..].sort_unstable();
            entries.dedup();
            let p = &st.ranges[primary];
            let name = match p.stub {
                Some(k) => stubs[k].name(),
                None => symbol_names
                    .get(&p.start)
                    .map_or_else(|| format!("sub_{:x}", p.start), |s| s.to_string()),
            };
            Plan {
                ranges: members,
                primary,
                entries,
                name,
            }
        })
        .collect();
    plans.sort_by_key(|p| st.ranges[p.primary].start);
    ref_facts.sort_unstable();
    ref_facts.dedup();
    let unowned = unowned_code(&st);
    Discovery {
        taken: ref_facts,
        data_words,
        unowned,
        ranges: st.ranges,
        decoded: decoded.into_iter().map(Option::unwrap_or_default).collect(),
        plans,
        stubs,
        fdes: fde_count,
    }
}
