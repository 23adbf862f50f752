//! Flat code against the compiled code it flattens ([`Exec::run_block`],
//! itself tested against the interpreter): random blocks of every form
//! but `rep` string instructions, entered with random known registers,
//! stale values in the unknown slots, and values that may run out; its
//! addresses put in place ([`FlatCode::run_into`]) as in a list; two
//! blocks chained ([`FlatCode::chain`]) as the one run after the other,
//! with `rsp` moved between them ([`FlatCode::move_rsp`]) or not.

use iced_x86::code_asm::*;
use iced_x86::{Instruction, InstructionInfoFactory};

use super::super::tests::{block, Rng};
use super::{FlatCode, Regs};
use crate::addr::exec::code::{BlockAddrs, BlockCode};
use crate::addr::exec::Exec;
use crate::addr::full::Recorded;
use crate::addr::tests::asm;
use crate::addr::{forms, Gpr, InsnProgram, RegSet};

/// The compiled code's test block without its `rep`s, and the register
/// functions it lacks.
fn pool() -> Vec<(Instruction, InsnProgram)> {
    let more = asm(|a| {
        a.movzx(eax, cl)?;
        a.movsxd(rdx, ecx)?;
        a.movsx(rsi, di)?;
        a.mov(ecx, edx)?;
        a.imul_3(rcx, rax, 12)?;
        a.imul_2(rdx, rcx)?;
        a.lea(esi, dword_ptr(rdi + rax * 4 + 1))?;
        a.add(eax, 7)?;
        a.shl(ecx, 2)?;
        a.sub(r8, rdx)?;
        a.mov(qword_ptr(r8 + rsi * 2 + 8), rcx)?;
        Ok(())
    });
    let mut info = InstructionInfoFactory::new();
    let more = more.iter().map(|i| (*i, forms::program(i, &mut info)));
    let all = block().into_iter().chain(more);
    all.filter(|b| {
        FlatCode::of(
            &BlockCode::compile(RegSet(0), std::slice::from_ref(b), 0, false),
            RegSet(0),
            0,
        )
        .is_some()
    })
    .collect()
}

/// Addresses (or the failing instruction), values taken, and the state
/// after, of one run.
type Outcome = (Result<Vec<u64>, (usize, String)>, Vec<Recorded>, Exec);

/// A take that gives `left` values from `seed`, then fails.
fn values(seed: u64, mut left: u64) -> impl FnMut(Recorded) -> Result<u64, String> {
    let mut rng = Rng(seed);
    move |_| match left {
        0 => Err("out of values".into()),
        _ => {
            left -= 1;
            Ok(rng.next() % 64)
        }
    }
}

fn compiled(code: &BlockCode, start: &Exec, seed: u64, left: u64) -> Outcome {
    let (mut e, mut out, mut taken) = (start.clone(), BlockAddrs::default(), Vec::new());
    let mut vals = values(seed, left);
    let r = e.run_block(
        code,
        code.insns.len(),
        &mut |w| {
            taken.push(w);
            vals(w)
        },
        &mut out,
    );
    assert!(out.reps.is_empty());
    (r.map(|()| out.addrs), taken, e)
}

fn flat(f: &FlatCode, start: &Exec, seed: u64, left: u64, stale: &mut Rng) -> Outcome {
    let mut regs = Regs::of(start);
    // The unknown slots hold whatever: no op may read them.
    for g in 0..16 {
        if start.regs[g].is_none() {
            regs.v[g] = stale.next();
        }
    }
    let mut placed_regs = regs.clone();
    let (mut addrs, mut taken, mut vals) = (Vec::new(), Vec::new(), values(seed, left));
    let r = f.run(
        &mut regs,
        &mut |w| {
            taken.push(w);
            vals(w)
        },
        &mut addrs,
    );
    // In place: address `n` at records 2n and 2n + 1, each given once.
    let (mut out, mut vals) = (vec![0u64; 2 * f.refs], values(seed, left));
    let placed = f.placed(|n| [2 * n as u32, 2 * n as u32 + 1]);
    let ran = placed.run_into(&mut placed_regs, &mut vals, &mut out, |w, a| *w += a);
    assert_eq!(ran, r);
    if r.is_ok() {
        let pairs: Vec<_> = out.chunks(2).map(|p| (p[0], p[1])).collect();
        assert_eq!(pairs, addrs.iter().map(|&a| (a, a)).collect::<Vec<_>>());
        assert_eq!(placed_regs, regs);
    }
    (r.map(|()| addrs), taken, regs.exec(start.bias))
}

#[test]
fn flat_code_runs_as_the_compiled_code_on_random_blocks() {
    let pool = pool();
    assert!(pool.len() > 40, "{} forms", pool.len());
    let mut rng = Rng(0x6a09_e667_f3bc_c909);
    let (mut short, mut whole) = (0, 0);
    for _ in 0..2000 {
        let n = 1 + rng.next() % 24;
        let b: Vec<_> = (0..n)
            .map(|_| pool[(rng.next() % pool.len() as u64) as usize].clone())
            .collect();
        let known = RegSet(rng.next() as u16);
        let code = BlockCode::compile(known, &b, 0, rng.next() % 2 == 0);
        let bias = 0x5555_0000 + (rng.next() % 16) * 0x1000;
        let f = FlatCode::of(&code, known, bias).expect("no rep and no refused form");
        let seed = rng.next() | 1;
        let mut start = Exec::unknown(bias);
        let mut init = Rng(seed ^ 0xff);
        known
            .iter()
            .for_each(|g| start.regs[g.index()] = Some(init.next() % 64));
        // A quarter of the runs run out of values somewhere.
        let left = match rng.next() % 4 {
            0 => rng.next() % 8,
            _ => u64::MAX,
        };
        let want = compiled(&code, &start, seed, left);
        let got = flat(&f, &start, seed, left, &mut rng);
        match &want.0 {
            Ok(_) => {
                whole += 1;
                assert_eq!(got, want, "known {:#x}", known.0);
                assert_eq!(f.exit, want.2.known());
            }
            // After a failure only the error and the values taken count.
            Err(_) => {
                short += 1;
                assert_eq!((&got.0, &got.1), (&want.0, &want.1));
            }
        }
    }
    assert!(short > 100 && whole > 1000, "{short} short, {whole} whole");
}

#[test]
fn a_rep_or_a_refused_form_has_no_flat_code() {
    let b = block();
    let code = BlockCode::compile(RegSet(0), &b, 0, false);
    assert_eq!(FlatCode::of(&code, RegSet(0), 0), None);
}

/// A random block of 1 to `most` of `pool`'s forms compiled for `known`,
/// flat.
fn random_flat(
    pool: &[(Instruction, InsnProgram)],
    rng: &mut Rng,
    known: RegSet,
    most: u64,
) -> (FlatCode, usize) {
    let n = 1 + rng.next() % most;
    let b: Vec<_> = (0..n)
        .map(|_| pool[(rng.next() % pool.len() as u64) as usize].clone())
        .collect();
    let code = BlockCode::compile(known, &b, 0, rng.next() % 2 == 0);
    let f = FlatCode::of(&code, known, 0x5555_0000).expect("no rep and no refused form");
    (f, b.len())
}

/// Records 2n and 2n + 1 of each address `n` of `f` put at `at` of
/// `out`; the values taken.
fn placed_run(
    f: &FlatCode,
    regs: &mut Regs,
    vals: &mut impl FnMut(Recorded) -> Result<u64, String>,
    out: &mut [u64],
) -> Result<(), (usize, String)> {
    let placed = f.placed(|n| [2 * n as u32, 2 * n as u32 + 1]);
    placed.run_into(regs, vals, out, |w, a| *w += a)
}

#[test]
fn chained_flat_code_runs_as_its_blocks_one_after_the_other() {
    let pool = pool();
    let mut rng = Rng(0xbb67_ae85_84ca_a73b);
    let (mut short, mut whole) = (0, 0);
    for _ in 0..1000 {
        let ka = RegSet(rng.next() as u16);
        let (a, na) = random_flat(&pool, &mut rng, ka, 12);
        // The second block knows some of what the first leaves.
        let kb = RegSet(a.exit.0 & rng.next() as u16);
        let (b, _) = random_flat(&pool, &mut rng, kb, 12);
        let mut chain = FlatCode::empty();
        let at = 2 * a.refs as u32;
        let pairs = |f: &FlatCode| f.placed(|n| [2 * n as u32, 2 * n as u32 + 1]);
        chain.chain(&pairs(&a), 0, 0).expect("fits");
        // A call's push, a return past a PLT stub, or a plain edge.
        let by = [0, 8u64.wrapping_neg(), 8][(rng.next() % 3) as usize];
        if by != 0 {
            chain.move_rsp(by);
        }
        chain.chain(&pairs(&b), na, at).expect("fits");
        let mut start = Regs::default();
        (0..16).for_each(|g| start.v[g] = rng.next() % 64);
        start.known = RegSet(0xffff);
        let seed = rng.next() | 1;
        // A quarter of the runs run out of values somewhere.
        let left = match rng.next() % 4 {
            0 => rng.next() % 12,
            _ => u64::MAX,
        };
        // One by one.
        let (mut regs, mut vals) = (start.clone(), values(seed, left));
        let mut want = vec![0u64; 2 * (a.refs + b.refs)];
        let (ra, rb) = want.split_at_mut(2 * a.refs);
        let one = placed_run(&a, &mut regs, &mut vals, ra).and_then(|()| {
            assert!(
                regs.keep_exactly(kb),
                "the first block leaves what the second knows"
            );
            let top = Gpr::RSP.index();
            regs.v[top] = regs.v[top].wrapping_add(by);
            placed_run(&b, &mut regs, &mut vals, rb).map_err(|(k, e)| (na + k, e))
        });
        // Chained.
        let (mut got_regs, mut got) = (start.clone(), vec![0u64; want.len()]);
        let ran = chain.run_into(&mut got_regs, &mut values(seed, left), &mut got, |w, x| {
            *w += x
        });
        assert_eq!(ran, one);
        match one {
            Ok(()) => {
                whole += 1;
                assert_eq!(got, want);
                assert_eq!(got_regs.known, b.exit);
                for g in b.exit.iter() {
                    assert_eq!(got_regs.v[g.index()], regs.v[g.index()]);
                }
            }
            Err(_) => short += 1,
        }
    }
    assert!(short > 50 && whole > 500, "{short} short, {whole} whole");
}

#[test]
fn code_that_writes_no_slot_leaves_the_registers_as_they_were() {
    let (pool, mut rng) = (pool(), Rng(0x3c6e_f372_fe94_f82b));
    // Per outcome of `writes_no_slot`: how many blocks.
    let mut blocks = [0u32; 2];
    for _ in 0..2000 {
        // Short blocks, so that some write nothing.
        let known = RegSet(rng.next() as u16);
        let (f, _) = random_flat(&pool, &mut rng, known, 2);
        let mut regs = Regs::default();
        (0..16).for_each(|g| regs.v[g] = rng.next());
        regs.known = RegSet(0xffff);
        let before = regs.v;
        let ran = f.run(
            &mut regs,
            &mut values(rng.next() | 1, u64::MAX),
            &mut Vec::new(),
        );
        assert!(ran.is_ok());
        let none = f.writes_no_slot();
        if none {
            assert_eq!(regs.v[..16], before[..16]);
        }
        blocks[usize::from(none)] += 1;
    }
    assert!(blocks[1] > 20 && blocks[0] > 1000, "{blocks:?}");
}

#[test]
fn moved_code_puts_each_address_where_its_records_went() {
    let (pool, mut rng) = (pool(), Rng(0x3c6e_f372_fe94_f82b));
    let codes = (0..40).map(|_| {
        let known = RegSet(rng.next() as u16);
        random_flat(&pool, &mut rng, known, 12).0
    });
    for (f, gap) in codes.collect::<Vec<_>>().iter().zip((0..5u32).cycle()) {
        let pairs = f.placed(|n| [2 * n as u32, 2 * n as u32 + 1]);
        let spread = f.placed(|n| [(2 + gap) * n as u32, (2 + gap) * n as u32 + 1]);
        // Record p of pair n is 2n or 2n + 1: gap records more per pair.
        assert_eq!(pairs.moved(|p| p / 2 * (2 + gap) + p % 2), spread);
        assert_eq!(pairs.moved(|p| p), pairs, "moved nowhere, the same code");
    }
}
