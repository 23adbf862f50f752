//! Which addresses only a direct branch of analysable code can produce
//! (docs/rewrite.md, "Untraced direct callers and short procedures"): a
//! procedure shorter than a springboard, with no fill after it, can be
//! traced without one when nothing but such branches enters it (gcc's
//! `xor eax, eax; ret` fragments that other functions jump to); the
//! copies of traced callers enter its copy, untraced callers are
//! retargeted (`traced::Traced::trace_unentered_short`).
//!
//! Invariant: an address counts as taken, conservatively, when it is the
//! module's entry, an init/fini pointer, an exported (`.dynsym`) symbol,
//! a dynamic relocation's addend, an instruction's immediate, displacement
//! or RIP-relative address, the target of a branch outside every
//! analysable procedure, or, in a position-dependent executable (where
//! absolute pointers need no relocation), any 4 or 8 bytes of a loaded
//! section at any offset.

use std::collections::{BTreeMap, HashSet};

use aetrace_analysis::elf::{ElfKind, Module, SymSource};
use aetrace_analysis::Program;
use iced_x86::{Decoder, DecoderOptions, Instruction, OpKind};

/// The addresses of `cands` that something other than a direct branch of
/// an analysable procedure may produce.
pub(crate) fn taken(prog: &Program, cands: &HashSet<u64>) -> HashSet<u64> {
    let m = &prog.module;
    let mut taken: HashSet<u64> = m
        .func_symbols
        .iter()
        .filter(|s| s.source == SymSource::Dynsym)
        .map(|s| s.addr)
        .chain(m.init_fini.iter().copied())
        .chain([m.entry])
        .chain(
            m.dyn_relocs
                .iter()
                .chain(&m.plt_relocs)
                .map(|r| r.addend as u64),
        )
        .filter(|a| cands.contains(a))
        .collect();
    if m.kind == ElfKind::Exec {
        taken.extend(words(m, cands));
    }
    taken.extend(in_code(prog, cands));
    taken
}

/// The candidates equal to some 4 or 8 bytes, at any offset, of a loaded
/// section.
fn words<'a>(m: &'a Module, cands: &'a HashSet<u64>) -> impl Iterator<Item = u64> + 'a {
    m.sections
        .iter()
        .filter(|s| s.alloc)
        .filter_map(|s| m.section_bytes(s))
        .flat_map(|b| {
            (0..b.len().saturating_sub(3)).flat_map(move |o| {
                let w4 = u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
                let w8 = b
                    .get(o..o + 8)
                    .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
                [Some(u64::from(w4)), w8]
            })
        })
        .flatten()
        .filter(|w| cands.contains(w))
}

/// The candidates the code names other than by a direct branch of an
/// analysable procedure: decoded linearly, restarting at every procedure
/// range's start and end, so that each stretch lies wholly inside or
/// outside the analysable procedures.
fn in_code(prog: &Program, cands: &HashSet<u64>) -> HashSet<u64> {
    let m = &prog.module;
    // How many analysable procedure ranges hold each boundary onwards.
    let mut delta: BTreeMap<u64, i64> = BTreeMap::new();
    for p in prog.procs.values() {
        for &(s, e) in &p.ranges {
            let d = i64::from(p.cfg.is_ok());
            *delta.entry(s).or_default() += d;
            *delta.entry(e).or_default() -= d;
        }
    }
    let mut level = 0;
    let mut cover: BTreeMap<u64, i64> = delta
        .into_iter()
        .map(|(a, d)| {
            level += d;
            (a, level)
        })
        .collect();
    let mut out = HashSet::new();
    for sec in m.exec_sections() {
        let Some(bytes) = m.section_bytes(sec) else {
            continue;
        };
        for a in [sec.addr, sec.end()] {
            let at = cover.range(..=a).next_back().map_or(0, |(_, &c)| c);
            cover.entry(a).or_insert(at);
        }
        let cuts: Vec<(u64, i64)> = cover
            .range(sec.addr..=sec.end())
            .map(|(&a, &c)| (a, c))
            .collect();
        for w in cuts.windows(2) {
            let ((s, level), (e, _)) = (w[0], w[1]);
            let code = &bytes[(s - sec.addr) as usize..(e - sec.addr) as usize];
            for i in Decoder::with_ip(64, code, s, DecoderOptions::NONE) {
                named(&i, level > 0, &mut |a| {
                    if cands.contains(&a) {
                        out.insert(a);
                    }
                });
            }
        }
    }
    out
}

/// Hands `f` the addresses instruction `i` names: its immediates,
/// displacement or RIP-relative address, and its direct branch target
/// unless `covered` (inside an analysable procedure, whose CFG has the
/// branch).
fn named(i: &Instruction, covered: bool, f: &mut impl FnMut(u64)) {
    for k in 0..i.op_count() {
        match i.op_kind(k) {
            OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate64 => {
                f(i.immediate(k))
            }
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64 if !covered => {
                f(i.near_branch_target())
            }
            OpKind::Memory if i.is_ip_rel_memory_operand() => f(i.ip_rel_memory_address()),
            OpKind::Memory => f(i.memory_displacement64()),
            _ => {}
        }
    }
}
