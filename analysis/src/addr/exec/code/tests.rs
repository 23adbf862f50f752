//! Compiled code against the interpreter it specialises: every
//! instruction form the abstract execution treats differently, entered
//! with many sets of known registers and values.

use iced_x86::code_asm::*;
use iced_x86::{Instruction, InstructionInfoFactory};

use super::{BlockAddrs, BlockCode};
use crate::addr::exec::{Exec, InsnAddrs};
use crate::addr::full::Recorded;
use crate::addr::tests::asm;
use crate::addr::{forms, InsnProgram, RegSet};

pub(super) fn block() -> Vec<(Instruction, InsnProgram)> {
    let insns = asm(|a| {
        let mut here = a.create_label();
        a.set_label(&mut here)?;
        a.push(rbx)?;
        a.sub(rsp, 24)?;
        a.mov(qword_ptr(rsp + 8), rdi)?;
        a.mov(rax, qword_ptr(rsp + 8))?;
        a.mov(ecx, dword_ptr(rax + 16))?;
        a.mov(dword_ptr(rax + rcx * 4), edx)?;
        a.mov(dword_ptr(rdx + rsi), edx)?;
        a.add(qword_ptr(rdi + r8 * 8 + 0x40), 1)?;
        a.lea(rcx, qword_ptr(rax + rcx * 2 + 3))?;
        a.mov(rcx, rax)?;
        a.shl(rcx, 3)?;
        a.sar(rcx, 1)?;
        a.shr(rdx, 2)?;
        a.and(rsp, -16)?;
        a.or(r9, 0x10)?;
        a.xor(r10, 0x7)?;
        a.mov(qword_ptr(rsp), rax)?;
        a.xchg(rax, rcx)?;
        a.mov(qword_ptr(rcx + 8), rax)?;
        a.sub(rsp, rax)?;
        a.mov(qword_ptr(rsp), rdx)?;
        a.mov(al, byte_ptr(rbx))?;
        a.mov(qword_ptr(rax), rbx)?;
        a.mov(eax, 5)?;
        a.mov(rbx, 0x1234_5678_9abcu64)?;
        a.mov(dword_ptr(rbx + rax * 8), 1)?;
        a.rep().movsb()?;
        a.rep().stosq()?;
        a.lodsb()?;
        a.mov(rax, qword_ptr(0x4000u64))?;
        a.mov(rax, qword_ptr(here))?;
        a.lock().add(dword_ptr(rsi), 1)?;
        a.cmpxchg(qword_ptr(rdi + 8), rcx)?;
        a.mov(rax, qword_ptr(0x28).fs())?;
        a.leave()?;
        a.pop(rbp)?;
        a.push(qword_ptr(rsp + 16))?;
        a.pop(rcx)?;
        a.call(0x2000)?;
        a.ret()?;
        Ok(())
    });
    let mut info = InstructionInfoFactory::new();
    (insns.iter())
        .map(|i| (*i, forms::program(i, &mut info)))
        .collect()
}

/// A small deterministic generator (xorshift).
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A state with the registers of `known` set from `rng`.
fn state(known: RegSet, rng: &mut Rng) -> Exec {
    let mut e = Exec::unknown(0x5555_0000);
    for g in known.iter() {
        e.regs[g.index()] = Some(rng.next() % 64);
    }
    e
}

/// Each instruction's addresses, `rep` and the values taken (what, in
/// order), and the state after: interpreted, or run as compiled code.
type Steps = Vec<(Vec<u64>, Option<(u64, u64)>, Vec<Recorded>, Exec)>;

fn run(
    b: &[(Instruction, InsnProgram)],
    first: usize,
    mut e: Exec,
    seed: u64,
    compiled: Option<&BlockCode>,
) -> Steps {
    let mut rng = Rng(seed);
    let mut out = InsnAddrs::default();
    let mut steps = Vec::new();
    let last = b.len() - 1;
    for (k, (i, p)) in b.iter().enumerate().skip(first) {
        let mut taken = Vec::new();
        let mut take = |r| {
            taken.push(r);
            Ok(rng.next() % 64)
        };
        match compiled {
            Some(c) => e.run_code(c, k - first, &mut take, &mut out).unwrap(),
            None => {
                if k == last {
                    e.anchor(&mut take).unwrap();
                }
                e.insn_into(i, p, &mut take, &mut out).unwrap()
            }
        }
        steps.push((out.addrs.clone(), out.rep, taken, e.clone()));
    }
    steps
}

#[test]
fn compiled_code_runs_as_the_interpreter_for_any_known_registers() {
    let b = block();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..400 {
        let known = RegSet(rng.next() as u16);
        let first = if round % 4 == 0 {
            (rng.next() % 8) as usize
        } else {
            0
        };
        let code = BlockCode::compile(known, &b, first, true);
        let seed = rng.next() | 1;
        let start = state(known, &mut Rng(seed));
        let want = run(&b, first, start.clone(), seed, None);
        let got = run(&b, first, start, seed, Some(&code));
        assert_eq!(got, want, "known {:#x} from {first}", known.0);
        for (k, c) in code.insns.iter().enumerate() {
            let recorded = (want[k].2.iter())
                .filter(|r| matches!(r, Recorded::Addr(_)))
                .count();
            assert_eq!(c.recorded as usize, recorded, "instruction {k}");
        }
    }
}

#[test]
fn a_block_run_in_one_pass_is_its_instructions_run_one_by_one() {
    let b = block();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for _ in 0..200 {
        let known = RegSet(rng.next() as u16);
        let code = BlockCode::compile(known, &b, 0, true);
        let seed = rng.next() | 1;
        let start = state(known, &mut Rng(seed));
        let steps = run(&b, 0, start.clone(), seed, Some(&code));
        let (mut e, mut vals, mut out) = (start, Rng(seed), BlockAddrs::default());
        let n = code.insns.len();
        e.run_block(&code, n, &mut |_| Ok(vals.next() % 64), &mut out)
            .unwrap();
        let addrs: Vec<u64> = steps.iter().flat_map(|s| s.0.clone()).collect();
        let reps: Vec<_> = (steps.iter().enumerate())
            .filter_map(|(k, s)| s.1.map(|(c, f)| (k as u32, c, f)))
            .collect();
        assert_eq!((out.addrs, out.reps), (addrs, reps), "known {:#x}", known.0);
        assert_eq!(e, steps[n - 1].3);
        let refs: usize = (0..n).map(|k| code.refs(k).len()).sum();
        assert_eq!(code.totals[0], refs as u64);
    }
}
