//! The reference-form table and the classifier on hand-written
//! instruction sequences, and the worklist fixpoint against its naive twin
//! on random programs.

use aetrace_graph::{BlockId, EntityRef};
use iced_x86::code_asm::*;
use iced_x86::{Decoder, DecoderOptions, Instruction, InstructionInfoFactory};
use proptest::prelude::*;

use super::census::{Class, ProcCensus};
use super::flow::{solve, solve_naive};
use super::value::{Shapes, Sites, Sources};
use super::{forms, BlockProgram, ProcProgram, Repeat};

/// Assembles `f`'s instructions at 0x1000 and decodes them back (also
/// for `exec`'s tests).
pub(super) fn asm(
    f: impl FnOnce(&mut CodeAssembler) -> Result<(), iced_x86::IcedError>,
) -> Vec<Instruction> {
    let mut a = CodeAssembler::new(64).unwrap();
    f(&mut a).unwrap();
    let bytes = a.assemble(0x1000).unwrap();
    Decoder::with_ip(64, &bytes, 0x1000, DecoderOptions::NONE)
        .into_iter()
        .collect()
}

/// `(letter, size, rep)` of each reference of each instruction.
fn forms_of(insns: &[Instruction]) -> Vec<Vec<(char, u32, bool)>> {
    let mut info = InstructionInfoFactory::new();
    insns
        .iter()
        .map(|i| {
            forms::program(i, &mut info)
                .refs
                .iter()
                .map(|r| (r.access.letter(), r.size, r.repeat != Repeat::Once))
                .collect()
        })
        .collect()
}

#[test]
fn reference_forms_count_as_lackey_does() {
    let insns = asm(|a| {
        a.push(rbx)?;
        a.pop(rbx)?;
        a.call(0x1000u64)?;
        a.ret()?;
        a.leave()?;
        a.push(qword_ptr(rax + 8))?;
        a.add(dword_ptr(rax), ebx)?;
        a.lock().xadd(qword_ptr(rax), rbx)?;
        a.xchg(qword_ptr(rax), rbx)?;
        a.cmpxchg16b(xmmword_ptr(rax))?;
        a.lock().cmpxchg(qword_ptr(rax), rbx)?;
        a.lock().add(dword_ptr(rax), 1)?;
        a.lock().bts(qword_ptr(rax), rbx)?;
        a.movsb()?;
        a.cmpsq()?;
        a.rep().stosq()?;
        a.bt(dword_ptr(rax), ebx)?;
        a.bts(dword_ptr(rax), 3)?;
        a.lea(rax, ptr(rbx + rcx * 4 + 8))?;
        a.nop_1(dword_ptr(rax))?;
        a.prefetcht0(byte_ptr(rax))?;
        a.movaps(xmm0, xmmword_ptr(rax))?;
        a.vmovdqu(ymmword_ptr(rax), ymm1)?;
        a.vpgatherdd_3(xmm0, ptr(rax + xmm1 * 4), xmm2)?;
        a.fld(tword_ptr(rax))?;
        a.mov(rax, qword_ptr(0x28).fs())
    });
    let n = |c, s| (c, s, false);
    assert_eq!(
        forms_of(&insns),
        vec![
            vec![n('S', 8)],
            vec![n('L', 8)],
            vec![n('S', 8)],
            vec![n('L', 8)],
            vec![n('L', 8)],
            vec![n('L', 8), n('S', 8)],
            vec![n('M', 4)],
            // Locked: VEX loads, then compare-and-swaps (lackey 3.19).
            vec![n('L', 8), n('M', 8)],
            vec![n('L', 8), n('M', 8)],
            vec![n('M', 16)],
            vec![n('M', 8)],
            vec![n('L', 4), n('M', 4)],
            vec![n('L', 1), n('M', 1)],
            vec![n('L', 1), n('S', 1)],
            vec![n('L', 8), n('L', 8)],
            vec![('S', 8, true)],
            vec![n('L', 1)],
            vec![n('M', 4)],
            vec![],
            vec![],
            vec![],
            vec![n('L', 16)],
            vec![n('S', 32)],
            vec![n('L', 4); 4],
            vec![n('L', 10)],
            vec![n('L', 8)],
        ]
    );
}

/// A procedure of `blocks` (entered at the first) with successor lists.
fn proc_of(blocks: Vec<Vec<Instruction>>, succs: Vec<Vec<usize>>) -> ProcProgram {
    let mut info = InstructionInfoFactory::new();
    ProcProgram {
        blocks: blocks
            .iter()
            .map(|b| BlockProgram {
                insns: b.iter().map(|i| forms::program(i, &mut info)).collect(),
            })
            .collect(),
        succs: succs
            .into_iter()
            .map(|s| s.into_iter().map(BlockId::new).collect())
            .collect(),
        entries: vec![BlockId::new(0)],
        pads: Vec::new(),
    }
}

/// `(block, insn, class)` of every reference.
fn classes(c: &ProcCensus) -> Vec<(usize, u32, Class)> {
    c.blocks
        .iter()
        .enumerate()
        .flat_map(|(b, rs)| rs.iter().map(move |r| (b, r.insn, r.class)))
        .collect()
}

#[test]
fn straight_line_classes() {
    let b = asm(|a| {
        a.push(rbx)?; // stack
        a.mov(rax, qword_ptr(0x4000u64))?; // static (absolute)
        a.mov(rcx, qword_ptr(0x28).fs())?; // tls
        a.mov(rdx, qword_ptr(rdi + 8))?; // entry (rdi)
        a.mov(esi, dword_ptr(rdx))?; // recorded (rdx loaded)
        a.mov(rbx, qword_ptr(0).fs())?; // the thread pointer
        a.mov(qword_ptr(rbx + 16), rax)?; // tls (tp + 16)
        a.lea(r8, ptr(rsp + 32))?;
        a.xor(r9d, r9d)?;
        a.mov(qword_ptr(r8 + r9 * 8), rax)?; // stack, through lea and a zero
        a.pop(rbx)?; // stack
        a.ret() // stack
    });
    let c = ProcCensus::of(&proc_of(vec![b], vec![vec![]]));
    let want = [
        Class::Stack,
        Class::Static,
        Class::Tls,
        Class::Entry,
        Class::Recorded,
        Class::Tls,
        Class::Tls,
        Class::Stack,
        Class::Stack,
        Class::Stack,
    ];
    assert_eq!(
        classes(&c).iter().map(|x| x.2).collect::<Vec<_>>(),
        want.to_vec()
    );
    // Only `mov rdx, [rdi + 8]` feeds an address; rdi is an entry value.
    let feeding: Vec<u8> = c
        .sites
        .iter()
        .filter(|s| s.feeds_address)
        .map(|s| s.width)
        .collect();
    assert_eq!(feeding, vec![8]);
    assert_eq!(c.entry_values, 1);
}

#[test]
fn loop_index_is_derived_and_invariant_pointer_recorded_before_the_loop() {
    let head = asm(|a| {
        a.mov(rbx, qword_ptr(rdi))?; // loop-invariant pointer: a site in block 0
        a.lea(rsi, ptr(0x8000u64))?;
        a.xor(ecx, ecx)
    });
    let body = asm(|a| {
        a.mov(eax, dword_ptr(rsi + rcx * 4))?; // derived (static base, known index)
        a.mov(dword_ptr(rbx + rcx * 4), eax)?; // recorded (rbx)
        a.inc(rcx)?;
        a.cmp(rcx, 100)
    });
    let tail = asm(|a| a.ret());
    let c = ProcCensus::of(&proc_of(
        vec![head, body, tail],
        vec![vec![1], vec![1, 2], vec![]],
    ));
    assert_eq!(
        classes(&c),
        vec![
            (0, 0, Class::Entry),
            (1, 0, Class::Derived),
            (1, 1, Class::Recorded),
            (2, 0, Class::Stack),
        ]
    );
    let feeding: Vec<usize> = c
        .sites
        .iter()
        .filter(|s| s.feeds_address)
        .map(|s| s.block.index())
        .collect();
    assert_eq!(feeding, vec![0], "recorded once, before the loop");
}

/// A pointer spilled across a call and reloaded: the reload is free unless
/// a stack address escapes (then the callee could have changed the slot).
fn spill(escape: bool) -> ProcCensus {
    let b0 = asm(|a| {
        a.sub(rsp, 24)?;
        a.mov(rax, qword_ptr(rdi))?; // the pointer: site 0
        a.mov(qword_ptr(rsp + 8), rax)?;
        if escape {
            a.lea(rdi, ptr(rsp + 16))?;
        }
        a.call(0x2000u64)
    });
    let b1 = asm(|a| {
        a.mov(rbx, qword_ptr(rsp + 8))?; // the reload
        a.mov(ecx, dword_ptr(rbx + 4))?;
        a.add(rsp, 24)?;
        a.ret()
    });
    ProcCensus::of(&proc_of(vec![b0, b1], vec![vec![1], vec![]]))
}

#[test]
fn spilled_pointers_are_followed_through_stack_slots() {
    let c = spill(false);
    assert!(c.slots_followed);
    let fed: Vec<(usize, u8)> = c
        .sites
        .iter()
        .enumerate()
        .filter(|(_, s)| s.feeds_address)
        .map(|(i, s)| (i, s.width))
        .collect();
    assert_eq!(fed, vec![(0, 8)], "the original load, not the reload");
    let c = spill(true);
    assert!(!c.slots_followed);
    let fed: Vec<usize> = c
        .sites
        .iter()
        .enumerate()
        .filter(|(_, s)| s.feeds_address)
        .map(|(i, _)| i)
        .collect();
    // Site 0 feeds the `[rdi]`-derived nothing now; the reload (after the
    // call's nine caller-saved results and its flags) does.
    assert_eq!(fed, vec![1 + 10]);
    assert_eq!(c.blocks[1][1].class, Class::Recorded);
}

#[test]
fn alloca_makes_the_stack_derived() {
    let b = asm(|a| {
        a.mov(rax, rdi)?;
        a.and(rax, -16)?;
        a.sub(rsp, rax)?;
        a.push(rbx)
    });
    let c = ProcCensus::of(&proc_of(vec![b], vec![vec![]]));
    assert_eq!(classes(&c), vec![(0, 3, Class::Entry)]);
}

/// One random instruction (registers among the first eight).
fn random_insn(a: &mut CodeAssembler, op: u8, x: u8, y: u8, imm: i32) {
    const R: [AsmRegister64; 8] = [rax, rbx, rcx, rdx, rsi, rdi, rbp, r8];
    let (r, s) = (R[x as usize % 8], R[y as usize % 8]);
    let k = i64::from(imm & 0x38);
    match op % 12 {
        0 => a.mov(r, s),
        1 => a.mov(r, qword_ptr(s + k)),
        2 => a.mov(qword_ptr(rsp + k), r),
        3 => a.mov(r, qword_ptr(rsp + k)),
        4 => a.add(r, imm),
        5 => a.lea(r, ptr(r + s * 4 + k)),
        6 => a.push(r),
        7 => a.pop(r),
        8 => a.xor(r, r),
        9 => a.imul_2(r, s),
        10 => a.mov(dword_ptr(r + s * 8), 1),
        _ => a.lea(r, ptr(rsp + k)),
    }
    .unwrap();
}

prop_compose! {
    fn random_proc()(
        shape in prop::collection::vec(
            (prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), any::<i32>()), 0..8),
             prop::collection::vec(0usize..16, 0..3)),
            1..10)
    ) -> ProcProgram {
        let n = shape.len();
        let blocks: Vec<Vec<Instruction>> = shape
            .iter()
            .map(|(insns, _)| {
                asm(|a| {
                    for &(op, x, y, imm) in insns {
                        random_insn(a, op, x, y, imm);
                    }
                    a.nop()
                })
            })
            .collect();
        let succs = shape
            .iter()
            .map(|(_, s)| s.iter().map(|t| t % n).collect())
            .collect();
        proc_of(blocks, succs)
    }
}

proptest! {
    /// Both fixpoints give the same in-states in both domains.
    #[test]
    fn worklist_equals_round_robin(prog in random_proc(), follow in any::<bool>()) {
        let shapes = Shapes { prog: &prog, follow };
        let ins = solve(&shapes, &prog.succs);
        prop_assert_eq!(&ins, &solve_naive(&shapes, &prog.succs));
        let sites = Sites::of(&prog);
        let sources = Sources { shapes: &shapes, shape_ins: &ins, sites: &sites };
        prop_assert_eq!(solve(&sources, &prog.succs), solve_naive(&sources, &prog.succs));
    }
}

/// A `rep` instruction's count is known when `rcx` is a constant (gzip
/// copies a 128-byte table so); its pointers stay computable.
#[test]
fn rep_count_from_a_constant() {
    let b = asm(|a| {
        a.lea(rdi, ptr(rsp + 0x28))?;
        a.mov(ecx, 0x20)?;
        a.mov(rsi, r12)?;
        a.rep().movsd()?;
        a.mov(qword_ptr(rdi), rax)?; // stack + 0x28 + 4 * 0x20, not followed
        a.rep().stosq()
    });
    let c = ProcCensus::of(&proc_of(vec![b], vec![vec![]]));
    let got: Vec<(u32, Option<u64>, Class)> = c.blocks[0]
        .iter()
        .map(|r| (r.insn, r.times, r.class))
        .collect();
    assert_eq!(
        got,
        vec![
            (3, Some(32), Class::Entry),
            (3, Some(32), Class::Stack),
            (4, Some(1), Class::Derived),
            (5, Some(0), Class::Derived),
        ]
    );
}
