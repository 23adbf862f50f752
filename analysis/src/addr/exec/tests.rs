//! Abstract execution on hand-written blocks: which references are
//! recorded, every address against a hand computation, knownness
//! independent of the values, and the cross-block fixpoint's roots.

use aetrace_format::progdb::{
    BlockDb, CallDb, CallTarget, EdgeDb, EdgeKindDb, ProcDb, ProcStatus, ProgramDb,
};
use iced_x86::code_asm::*;
use iced_x86::{Instruction, InstructionInfoFactory};

use super::{
    anchors_rsp, entry_knowledge, padding, passes_through, ways_in, Entered, Exec, RegSet, WayIn,
};
use crate::addr::full::Recorded;
use crate::addr::returns::Returns;
use crate::addr::{forms, Gpr, InsnProgram};

use crate::addr::tests::asm;

fn progs(insns: &[Instruction]) -> Vec<(Instruction, InsnProgram)> {
    let mut info = InstructionInfoFactory::new();
    insns
        .iter()
        .map(|i| (*i, forms::program(i, &mut info)))
        .collect()
}

/// Runs `block` from nothing known; `truth` gives the true address of
/// each reference in order. Returns each reference's address and whether
/// it was recorded.
fn run(block: &[(Instruction, InsnProgram)], truth: &[u64]) -> Vec<(u64, bool)> {
    let mut e = Exec::unknown(0);
    let mut k = 0;
    let mut out = Vec::new();
    for (i, p) in block {
        let got = e
            .insn(i, p, &mut |r| match r {
                Recorded::Addr(j) => Ok(truth[k + j]),
                _ => Err("no rep here".into()),
            })
            .unwrap();
        for (a, r) in got.addrs.iter().zip(&got.recorded) {
            out.push((*a, *r));
        }
        k += got.addrs.len();
    }
    out
}

fn block() -> Vec<(Instruction, InsnProgram)> {
    progs(&asm(|a| {
        a.push(rbx)?; // S rsp0-8: recorded, rsp learned
        a.push(rbp)?; // S rsp0-16
        a.sub(rsp, 24)?;
        a.mov(qword_ptr(rsp + 8), rdi)?; // S rsp0-32
        a.mov(rax, qword_ptr(rsp + 8))?; // L rsp0-32; rax loaded
        a.mov(ecx, dword_ptr(rax + 16))?; // recorded, rax learned
        a.mov(edx, dword_ptr(rax + 20))?; // derived
        a.mov(dword_ptr(rax + rcx * 4), edx)?; // recorded (scale 4)
        a.mov(rcx, rax)?;
        a.shl(rcx, 3)?;
        a.mov(dword_ptr(rcx + 4), edx)?; // derived: rax << 3
        a.and(rsp, -16)?;
        a.mov(qword_ptr(rsp), rax)?; // derived
        a.sub(rsp, rdx)?; // rdx loaded: rsp unknown after
        a.mov(qword_ptr(rsp), rdx)?; // recorded, rsp learned again
        a.mov(qword_ptr(rsp + 8), rdx)?; // derived
        Ok(())
    }))
}

#[test]
fn addresses_recorded_only_where_the_arithmetic_cannot_rebuild_them() {
    let rsp0: u64 = 0x7fff_1238;
    let (rax_v, rcx_v): (u64, u64) = (0x5000, 9);
    let aligned = (rsp0 - 40) & !15;
    let truth = [
        rsp0 - 8,
        rsp0 - 16,
        rsp0 - 32,
        rsp0 - 32,
        rax_v + 16,
        rax_v + 20,
        rax_v + rcx_v * 4,
        (rax_v << 3) + 4,
        aligned,
        aligned.wrapping_sub(0x30),
        aligned.wrapping_sub(0x30) + 8,
    ];
    let got = run(&block(), &truth);
    let addrs: Vec<u64> = got.iter().map(|g| g.0).collect();
    let recorded: Vec<bool> = got.iter().map(|g| g.1).collect();
    assert_eq!(addrs, truth);
    let yes = true;
    let no = false;
    assert_eq!(
        recorded,
        [yes, no, no, no, yes, no, yes, no, no, yes, no],
        "which references are recorded"
    );
}

#[test]
fn what_is_recorded_does_not_depend_on_the_values() {
    let b = block();
    let (plans, end) = Exec::plan_block(RegSet(0), &b, false);
    let shifted: Vec<u64> = [8u64, 16, 32, 32, 0, 0, 0, 0, 0, 0, 0]
        .iter()
        .map(|d| 0x1234_5678u64.wrapping_sub(*d))
        .collect();
    let got = run(&b, &shifted);
    let planned: usize = plans.iter().map(|p| p.as_ref().unwrap().len()).sum();
    assert_eq!(planned, got.iter().filter(|g| g.1).count());
    // rsp was learned last and survives; rax was loaded, rcx shifted.
    let known: Vec<Gpr> = end.iter().collect();
    assert!(known.contains(&Gpr::RSP) && known.contains(&Gpr(0)) && known.contains(&Gpr(1)));
}

fn call_db(target: CallTarget) -> CallDb {
    CallDb {
        target,
        marker: true,
        returns: true,
        tail: false,
        lazy: None,
        landing: None,
        jmpbuf: false,
        plt: false,
        indirect: false,
    }
}

/// A PLT stub named `name`: one block, its jump through the GOT to
/// untraced code that runs no traced code (unmarked).
fn plt_stub(name: &str) -> ProcDb {
    ProcDb {
        name: name.into(),
        status: ProcStatus::Traced,
        entry: 0,
        blocks: vec![BlockDb {
            start: 0x2000,
            insn_lens: vec![6],
            call: Some(CallDb {
                tail: true,
                plt: true,
                marker: false,
                ..call_db(CallTarget::External)
            }),
        }],
        edges: vec![EdgeDb {
            from: 0,
            to: 1,
            kind: EdgeKindDb::TailCall,
            witness: None,
        }],
        sigmap: None,
    }
}

/// B0 entry: push; B1 loop: store to the stack, jumps to itself or falls
/// into B2, a call to `target`; B3 its return point.
fn caller(target: CallTarget) -> (ProcDb, Vec<Vec<(Instruction, InsnProgram)>>) {
    let blocks = vec![
        progs(&asm(|a| a.push(rbx))),
        progs(&asm(|a| a.mov(qword_ptr(rsp + 8), rax))),
        progs(&asm(|a| a.call(0x2000u64))),
        progs(&asm(|a| a.mov(qword_ptr(rsp), rax))),
    ];
    let edge = |from, to, kind| EdgeDb {
        from,
        to,
        kind,
        witness: None,
    };
    let p = ProcDb {
        name: "f".into(),
        status: ProcStatus::Traced,
        entry: 0,
        blocks: (0..4)
            .map(|b| BlockDb {
                start: 0x1000 + b,
                insn_lens: vec![1],
                call: (b == 2).then(|| call_db(target)),
            })
            .collect(),
        edges: vec![
            edge(0, 1, EdgeKindDb::FallThrough),
            edge(1, 1, EdgeKindDb::Taken),
            edge(1, 2, EdgeKindDb::FallThrough),
            edge(2, 3, EdgeKindDb::CallReturn),
            edge(3, 4, EdgeKindDb::Return),
        ],
        sigmap: None,
    };
    (p, blocks)
}

fn has_rsp(s: RegSet) -> bool {
    s.iter().any(|g| g == Gpr::RSP)
}

#[test]
fn blocks_inherit_only_along_plain_edges() {
    let (p, mut blocks) = caller(CallTarget::External);
    let known = entry_knowledge(&p, &Returns::default(), &mut blocks);
    assert_eq!(
        known[0].iter().collect::<Vec<_>>(),
        vec![Gpr::RSP],
        "the entry knows rsp"
    );
    let (plans, _) = Exec::plan_block(known[0], &blocks[0], false);
    assert_eq!(
        plans[0].as_ref().unwrap(),
        &Vec::<Recorded>::new(),
        "push derived"
    );
    assert!(
        has_rsp(known[1]) && has_rsp(known[2]),
        "the loop inherits rsp"
    );
    assert_eq!(known[3], RegSet(0), "a return point starts with nothing");
    let (plans, _) = Exec::plan_block(known[1], &blocks[1], false);
    assert_eq!(plans[0].as_ref().unwrap(), &Vec::<Recorded>::new());
    let (plans, _) = Exec::plan_block(known[3], &blocks[3], false);
    assert_eq!(plans[0].as_ref().unwrap(), &vec![Recorded::Addr(0)]);
}

/// A procedure of one block that returns by `ret` and calls nothing.
fn returning() -> ProcDb {
    let (mut p, _) = caller(CallTarget::Proc(0));
    p.blocks.truncate(1);
    p.blocks[0].call = None;
    p.edges = vec![EdgeDb {
        from: 0,
        to: 1,
        kind: EdgeKindDb::Return,
        witness: None,
    }];
    p
}

#[test]
fn a_call_to_a_procedure_that_returns_by_ret_keeps_rsp_only() {
    // Procedure 0 is the caller; procedure 1 returns by `ret` (the
    // caller itself does too: recursion is allowed).
    let (p, mut blocks) = caller(CallTarget::Proc(1));
    let db = ProgramDb {
        procs: vec![p.clone(), returning()],
        ..ProgramDb::default()
    };
    let returns = Returns::of(&db);
    assert!(returns.by_ret(0) && returns.by_ret(1));
    assert_eq!(ways_in(&p, &returns, &blocks)[3], vec![WayIn::Return(1)]);
    let known = entry_knowledge(&p, &returns, &mut blocks);
    assert_eq!(known[3].iter().collect::<Vec<_>>(), vec![Gpr::RSP]);
    let (plans, _) = Exec::plan_block(known[3], &blocks[3], false);
    assert_eq!(plans[0].as_ref().unwrap(), &Vec::<Recorded>::new());
    // A setjmp-like call returns a second time through longjmp.
    let mut sj = p.clone();
    sj.blocks[2].call.as_mut().unwrap().jmpbuf = true;
    assert_eq!(entry_knowledge(&sj, &returns, &mut blocks)[3], RegSet(0));
}

/// A call whose callee never runs traced code (unmarked), to untraced code
/// or through a PLT stub, returns with the registers the ABI preserves as
/// the call block left them; a marked one (callbacks may run) with nothing.
#[test]
fn a_call_that_runs_no_traced_code_keeps_the_preserved_registers() {
    let (mut p, mut blocks) = caller(CallTarget::External);
    blocks[0] = progs(&asm(|a| {
        a.lea(rbx, qword_ptr(rsp + 16))?;
        a.lea(rcx, qword_ptr(rsp + 24))
    }));
    blocks[3] = progs(&asm(|a| {
        a.mov(qword_ptr(rbx), rax)?; // derived: rbx survives the call
        a.mov(qword_ptr(rcx), rax) // recorded: rcx is the callee's
    }));
    let stub = plt_stub("memcmp@plt");
    let db = ProgramDb {
        procs: vec![p.clone(), stub],
        ..ProgramDb::default()
    };
    let returns = Returns::of(&db);
    assert!(returns.stub(1) && !returns.stub(0) && !returns.by_ret(1));
    for target in [CallTarget::External, CallTarget::Proc(1)] {
        let c = p.blocks[2].call.as_mut().unwrap();
        (c.target, c.marker) = (target, true);
        assert_eq!(
            ways_in(&p, &returns, &blocks)[3],
            Vec::<WayIn>::new(),
            "{target:?}"
        );
        assert_eq!(entry_knowledge(&p, &returns, &mut blocks)[3], RegSet(0));
        p.blocks[2].call.as_mut().unwrap().marker = false;
        assert_eq!(ways_in(&p, &returns, &blocks)[3], vec![WayIn::Back(2)]);
        let known = entry_knowledge(&p, &returns, &mut blocks);
        assert_eq!(known[3], RegSet(1 << 3 | 1 << 4), "{target:?}: rsp and rbx");
        let (plans, _) = Exec::plan_block(known[3], &blocks[3], false);
        let recorded: Vec<_> = plans.iter().map(|p| p.as_ref().unwrap().len()).collect();
        assert_eq!(recorded, [0, 1]);
    }
    // A block a stub's way may run: a tail jump writing `rsp` alone.
    let jmp = progs(&asm(|a| {
        a.push(0x12)?;
        a.jmp(0x3000u64)
    }));
    let stub_block = &db.procs[1].blocks[0];
    assert!(passes_through(stub_block, jmp.iter().map(|(_, p)| p)));
    let writes = progs(&asm(|a| {
        a.mov(rbx, 1u64)?;
        a.jmp(0x3000u64)
    }));
    assert!(!passes_through(stub_block, writes.iter().map(|(_, p)| p)));
    assert!(
        !passes_through(&p.blocks[2], jmp.iter().map(|(_, p)| p)),
        "not a tail jump"
    );
}

/// A direct call to a leaf (returns by `ret`, calls nothing, enters no
/// kernel) returns with the registers the ABI preserves as the call block
/// left them; to a procedure that calls, or may enter the kernel, with
/// `rsp` alone.
#[test]
fn a_call_to_a_leaf_keeps_the_preserved_registers() {
    let (mut p, mut blocks) = caller(CallTarget::Proc(1));
    // A call to traced code writes no marker (no RETURN record).
    p.blocks[2].call.as_mut().unwrap().marker = false;
    blocks[0] = progs(&asm(|a| a.lea(rbx, qword_ptr(rsp + 16))));
    let db = ProgramDb {
        procs: vec![p.clone(), returning()],
        ..ProgramDb::default()
    };
    let leaves = Returns::of(&db).with_leaves(&db, |_| false);
    assert!(leaves.leaf(1) && !leaves.leaf(0), "procedure 0 calls");
    assert_eq!(ways_in(&p, &leaves, &blocks)[3], vec![WayIn::Back(2)]);
    let known = entry_knowledge(&p, &leaves, &mut blocks);
    assert_eq!(known[3], RegSet(1 << 3 | 1 << 4), "rsp and rbx");
    let kernel = Returns::of(&db).with_leaves(&db, |_| true);
    assert!(!kernel.leaf(1));
    assert_eq!(ways_in(&p, &kernel, &blocks)[3], vec![WayIn::Return(1)]);
    assert_eq!(entry_knowledge(&p, &kernel, &mut blocks)[3], RegSet(1 << 4));
    // Without leaves named (`Returns::of` alone) no procedure is one.
    assert!(!Returns::of(&db).leaf(1));
}

/// A `ret` always leaves `rsp` known, recorded or derived: what a return
/// point of a call that returns by `ret` relies on.
#[test]
fn a_ret_leaves_rsp_known() {
    for ret in [asm(|a| a.ret()), asm(|a| a.ret_1(16))] {
        let (_, end) = Exec::plan_block(RegSet(0), &progs(&ret), false);
        assert!(has_rsp(end), "{:?}", ret[0]);
    }
}

/// A landing pad at the entry (or any way in other than a plain edge)
/// makes it a root again: nothing known, its first stack reference recorded.
#[test]
fn an_entry_with_another_way_in_starts_with_nothing() {
    let (mut p, mut blocks) = caller(CallTarget::External);
    assert_eq!(
        ways_in(&p, &Returns::default(), &blocks)[0],
        vec![WayIn::Entry]
    );
    p.blocks[2].call.as_mut().unwrap().landing = Some(0);
    assert_eq!(
        entry_knowledge(&p, &Returns::default(), &mut blocks)[0],
        RegSet(0)
    );
}

/// A block that may jump into an entry records `rsp` before its jump
/// exactly when it does not know it, so every such jump carries it.
#[test]
fn a_tail_jump_into_an_entry_anchors_rsp() {
    let jmp = progs(&asm(|a| {
        a.sub(rsp, rax)?;
        a.jmp(0x2000u64)
    }));
    let (plans, end) = Exec::plan_block(RegSet(0), &jmp, true);
    assert_eq!(plans[1].as_ref().unwrap(), &vec![Recorded::Rsp]);
    assert!(has_rsp(end));
    let (plans, _) = Exec::plan_block(RegSet(0), &jmp, false);
    assert_eq!(plans[1].as_ref().unwrap(), &Vec::<Recorded>::new());
    let mut only = RegSet(0);
    only.insert(Gpr::RSP);
    let known = progs(&asm(|a| a.jmp(0x2000u64)));
    let (plans, _) = Exec::plan_block(only, &known, true);
    assert_eq!(plans[0].as_ref().unwrap(), &Vec::<Recorded>::new());
    // Which blocks anchor: direct tail jumps and lazy PLT jumps only.
    let blk = |c: CallDb| BlockDb {
        start: 0,
        insn_lens: vec![5],
        call: Some(c),
    };
    let tail = |target| CallDb {
        tail: true,
        ..call_db(target)
    };
    assert!(anchors_rsp(&blk(tail(CallTarget::Proc(3)))));
    assert!(!anchors_rsp(&blk(call_db(CallTarget::Proc(3)))));
    assert!(!anchors_rsp(&blk(tail(CallTarget::External))));
    let lazy = CallDb {
        plt: true,
        lazy: Some(4),
        ..tail(CallTarget::External)
    };
    assert!(anchors_rsp(&blk(lazy)));
}

/// How an entry was reached, from the call the run before ended with.
#[test]
fn entries_are_told_apart_by_the_call_before() {
    let call = call_db(CallTarget::Proc(7));
    let tail = CallDb { tail: true, ..call };
    assert_eq!(Entered::by(Some(&call), 7), Entered::Call);
    assert_eq!(Entered::by(Some(&tail), 7), Entered::Jump);
    assert_eq!(Entered::by(Some(&call), 8), Entered::Outside, "a callback");
    assert_eq!(Entered::by(None, 7), Entered::Outside, "a thread's first");
    let ext = call_db(CallTarget::External);
    assert_eq!(Entered::by(Some(&ext), 7), Entered::Outside);
    let lazy = CallDb {
        tail: true,
        plt: true,
        lazy: Some(7),
        ..ext
    };
    assert_eq!(Entered::by(Some(&lazy), 7), Entered::Jump, "LAZY, no ENTER");
    let unflagged = CallDb { plt: false, ..lazy };
    assert_eq!(
        Entered::by(Some(&unflagged), 7),
        Entered::Outside,
        "its ENTER"
    );
}

/// `jmp L; nop; L: loop`: the padding no edge reaches does not make the
/// loop head lose `rsp`, unless it is not only `nop`s or is reached; with
/// an unresolved indirect jump in the procedure it is no padding, and the
/// jump is a way into it.
#[test]
fn alignment_padding_is_no_way_in() {
    let (mut p, mut blocks) = caller(CallTarget::External);
    // Block 3 (the return point) becomes padding falling into block 1.
    blocks[3] = progs(&asm(|a| a.nop()));
    p.blocks[2].call = None;
    p.edges
        .retain(|e| e.kind != EdgeKindDb::CallReturn && e.from != 3);
    p.edges.push(EdgeDb {
        from: 3,
        to: 1,
        kind: EdgeKindDb::FallThrough,
        witness: None,
    });
    assert_eq!(padding(&p, &blocks), vec![false, false, false, true]);
    let known = entry_knowledge(&p, &Returns::default(), &mut blocks);
    assert!(has_rsp(known[1]), "the loop head keeps rsp");
    assert_eq!(known[3], RegSet(0), "the padding itself knows nothing");
    let mut wild = p.clone();
    wild.blocks[2].call = Some(CallDb {
        tail: true,
        indirect: true,
        ..call_db(CallTarget::External)
    });
    let mut wild_blocks = blocks.clone();
    wild_blocks[2] = progs(&asm(|a| a.jmp(rax)));
    // Not padding, but the jump, a way into every block, knows `rsp`:
    // block 3 inherits it and the loop head keeps it.
    let only_rsp = RegSet(1 << Gpr::RSP.0);
    assert!(!padding(&wild, &wild_blocks)[3]);
    let known = entry_knowledge(&wild, &Returns::default(), &mut wild_blocks);
    assert_eq!((known[1], known[3]), (only_rsp, only_rsp));
    let mut reached = p.clone();
    reached.edges.push(EdgeDb {
        from: 2,
        to: 3,
        kind: EdgeKindDb::Taken,
        witness: None,
    });
    assert!(!padding(&reached, &blocks)[3]);
    blocks[3] = progs(&asm(|a| a.mov(rax, rbx)));
    assert!(!padding(&p, &blocks)[3]);
    assert_eq!(
        entry_knowledge(&p, &Returns::default(), &mut blocks)[1],
        only_rsp
    );
    assert_eq!(blocks[3][0].1.before, only_rsp);
}

/// One block of procedure `f` (no edges): its database entry.
fn one_block(n: usize) -> ProcDb {
    ProcDb {
        name: "f".into(),
        status: ProcStatus::Traced,
        entry: 0,
        blocks: vec![BlockDb {
            start: 0x1000,
            insn_lens: vec![1; n],
            call: None,
        }],
        edges: Vec::new(),
        sigmap: None,
    }
}

#[test]
fn thirty_two_bit_arithmetic_is_evaluated_as_the_cpu_does() {
    // Expected values from the x86-64 rules by hand: a 32-bit write
    // zero-extends, shift counts are masked to 5 bits, movsxd/movsx
    // sign-extend.
    let b = progs(&asm(|a| {
        a.mov(eax, edx)?;
        a.and(edx, 0x7fff)?;
        a.movsxd(rsi, r8d)?;
        a.imul_3(ecx, edx, 3)?;
        a.lea(edi, dword_ptr(r9 + rdx * 2 + 1))?;
        a.shl(eax, 36)?;
        a.movzx(r10d, dl)?;
        a.movsx(r11, r8w)?;
        a.sub(r9d, esi)?;
        a.add(r12d, 0x7fff_ffff)?;
        Ok(())
    }));
    let mut e = Exec::unknown(0);
    for (g, v) in [
        (2, 0xffff_ffff_1234_8765u64),
        (8, 0x0000_0001_8000_fff1),
        (9, 0x0000_0000_0010_0000),
        (12, 0x0000_0002_9000_0003),
    ] {
        e.regs[g] = Some(v);
    }
    for (i, p) in &b {
        e.insn(i, p, &mut |_| Err("nothing is recorded".into()))
            .unwrap();
    }
    let want = [
        (0, 0x2348_7650u64),         // (0x12348765 << (36 & 31)), low half
        (2, 0x0765),                 // edx & 0x7fff
        (6, 0xffff_ffff_8000_fff1),  // movsxd of r8d
        (1, 0x162f),                 // 0x765 * 3
        (7, 0x0010_0ecb),            // 0x100000 + 0x765 * 2 + 1
        (10, 0x65),                  // dl
        (11, 0xffff_ffff_ffff_fff1), // movsx of r8w
        (9, 0x800f_000f),            // 0x100000 - 0x8000fff1, low half
        (12, 0x1000_0002),           // 0x90000003 + 0x7fffffff, low half
    ];
    for (g, v) in want {
        assert_eq!(e.regs[g], Some(v), "register {g}");
    }
}

#[test]
fn a_load_that_feeds_two_scaled_addresses_is_recorded_once_at_its_definition() {
    let mut b = vec![progs(&asm(|a| {
        a.mov(r8, 0x5000u64)?; // known: a constant
        a.movzx(eax, word_ptr(r8))?; // derived; rax loaded
        a.mov(ecx, dword_ptr(r8 + rax * 4))?; // scale 4: at its use, rax not taught
        a.mov(edx, dword_ptr(r8 + rax * 4 + 4))?;
        a.ret()
    }))];
    let before = Exec::plan_block(RegSet(0), &b[0], false).0;
    let count = |plans: &[Result<Vec<Recorded>, String>]| -> usize {
        plans.iter().map(|p| p.as_ref().unwrap().len()).sum()
    };
    // Unmarked, nothing known: both scaled addresses and the `ret`'s `[rsp]`.
    assert_eq!(count(&before), 3);
    let known = entry_knowledge(&one_block(5), &Returns::default(), &mut b);
    let mut loaded = RegSet::default();
    loaded.insert(Gpr(0));
    let marks: Vec<RegSet> = b[0].iter().map(|(_, p)| p.before).collect();
    assert_eq!(marks, [RegSet(0), RegSet(0), loaded, RegSet(0), RegSet(0)]);
    let (plans, _) = Exec::plan_block(known[0], &b[0], false);
    assert_eq!(plans[2].as_ref().unwrap(), &[Recorded::Reg(Gpr(0))]);
    // The entry knows `rsp` (the `ret`'s `[rsp]` is derived): one value.
    assert_eq!(count(&plans), 1);
    // The same block where the load feeds one address: not marked.
    let mut one = vec![b[0][..3].to_vec()];
    one[0].push(b[0][4].clone());
    entry_knowledge(&one_block(4), &Returns::default(), &mut one);
    assert!(one[0].iter().all(|(_, p)| p.before == RegSet(0)));
}

/// Procedure `f` of `blocks`, entry B0, with plain `edges` (from, to).
fn plain_proc(blocks: &[Vec<(Instruction, InsnProgram)>], edges: &[(u32, u32)]) -> ProcDb {
    ProcDb {
        name: "f".into(),
        status: ProcStatus::Traced,
        entry: 0,
        blocks: (blocks.iter().enumerate())
            .map(|(b, insns)| BlockDb {
                start: 0x1000 + 0x100 * b as u64,
                insn_lens: vec![1; insns.len()],
                call: None,
            })
            .collect(),
        edges: (edges.iter())
            .map(|&(from, to)| EdgeDb {
                from,
                to,
                kind: EdgeKindDb::Taken,
                witness: None,
            })
            .collect(),
        sigmap: None,
    }
}

/// The values each block records per run, planned from `known`.
fn values_per_block(known: &[RegSet], blocks: &[Vec<(Instruction, InsnProgram)>]) -> Vec<usize> {
    (blocks.iter().zip(known))
        .map(|(b, &k)| {
            let (plans, _) = Exec::plan_block(k, b, false);
            plans.iter().map(|p| p.as_ref().unwrap().len()).sum()
        })
        .collect()
}

/// gzip's `longest_match` in small: `r8` loaded once, `rsi = movsxd r8d`
/// at the entry (taught back by its first use) and again at the loop's
/// latch. The definition's walk reaches the loop head a second time with
/// `rsi` tainted, so `r8` is recorded once instead of the head's address
/// every iteration.
#[test]
fn a_loop_that_recomputes_an_index_from_a_definition_marks_it() {
    let mut blocks = vec![
        progs(&asm(|a| {
            a.mov(r8d, dword_ptr(0x5000))?;
            a.movsxd(rsi, r8d)?;
            a.mov(r9, 0x6000u64)?;
            a.movzx(ebp, byte_ptr(r9 + rsi))?;
            a.nop()
        })),
        progs(&asm(|a| {
            a.movzx(ecx, byte_ptr(r9 + rsi))?;
            a.nop()
        })),
        progs(&asm(|a| {
            a.movsxd(rsi, r8d)?;
            a.nop()
        })),
    ];
    let p = plain_proc(&blocks, &[(0, 1), (1, 2), (2, 1)]);
    let known = entry_knowledge(&p, &Returns::default(), &mut blocks);
    let mut want = RegSet::default();
    want.insert(Gpr(8));
    assert_eq!(blocks[0][1].1.before, want, "r8 recorded after its load");
    assert_eq!(values_per_block(&known, &blocks), [1, 0, 0]);
}

/// An unresolved indirect jump (block 2) may go on at any block of its
/// procedure with no edge listed: it is a plain way into each, so block
/// 1, also reached from block 0 that knows `r9`, learns `r9` only when
/// the jump's block records it (glibc's `_nl_intern_locale_data`).
#[test]
fn an_unresolved_jump_is_a_way_into_every_block() {
    let mut blocks = vec![
        progs(&asm(|a| {
            a.mov(r9, 0x6000u64)?;
            a.cmp(eax, 12)?;
            a.ja(0x1100u64)
        })),
        progs(&asm(|a| {
            a.mov(ecx, dword_ptr(r9 + 8))?;
            a.nop()
        })),
        progs(&asm(|a| {
            a.mov(r9, qword_ptr(r9))?;
            a.jmp(r9)
        })),
    ];
    let mut p = plain_proc(&blocks, &[(0, 1), (0, 2)]);
    p.blocks[2].call = Some(CallDb {
        tail: true,
        indirect: true,
        ..call_db(CallTarget::External)
    });
    let ways = ways_in(&p, &Returns::default(), &blocks);
    assert_eq!(ways[0], [WayIn::Entry, WayIn::Plain(2)]);
    assert_eq!(ways[1], [WayIn::Plain(0), WayIn::Plain(2)]);
    assert_eq!(ways[2], [WayIn::Plain(0), WayIn::Plain(2)]);
    let known = entry_knowledge(&p, &Returns::default(), &mut blocks);
    let has_r9 = |s: RegSet| s.iter().any(|g| g == Gpr(9));
    assert!(
        !has_r9(known[1]) || has_r9(blocks[2][1].1.before),
        "block 1 knows r9 only if the jump's block records it"
    );
}

/// A loop head whose index comes from the entry (an argument) on one
/// way in and from a load at the latch on the other: the entry's way
/// records the argument before its last instruction, so the head knows
/// it and its two scaled addresses are derived; the latch's load is
/// recorded once per iteration instead of both addresses.
#[test]
fn a_join_is_closed_on_the_way_that_loses_the_register() {
    let mut blocks = vec![
        progs(&asm(|a| {
            a.mov(r9, 0x6000u64)?;
            a.nop()
        })),
        progs(&asm(|a| {
            a.movzx(ecx, byte_ptr(r9 + rdx * 2))?;
            a.movzx(ecx, byte_ptr(r9 + rdx * 2 + 1))?;
            a.nop()
        })),
        progs(&asm(|a| {
            a.movzx(edx, word_ptr(r9))?;
            a.nop()
        })),
    ];
    let p = plain_proc(&blocks, &[(0, 1), (1, 2), (2, 1)]);
    let ways = ways_in(&p, &Returns::default(), &blocks);
    assert_eq!(ways[1], [WayIn::Plain(0), WayIn::Plain(2)]);
    // Unmarked, the head records both addresses every iteration.
    let head = Exec::plan_block(RegSet(0), &blocks[1], false).0;
    assert_eq!(head[0].as_ref().unwrap(), &[Recorded::Addr(0)]);
    assert_eq!(head[1].as_ref().unwrap(), &[Recorded::Addr(0)]);
    let known = entry_knowledge(&p, &Returns::default(), &mut blocks);
    let mut want = RegSet::default();
    want.insert(Gpr(2));
    assert_eq!(blocks[0][1].1.before, want, "the entry's way records rdx");
    assert_eq!(blocks[2][1].1.before, want, "the latch records its load");
    assert_eq!(values_per_block(&known, &blocks), [1, 0, 1]);
}

/// gzip's `updcrc` in small: a loop over a pointer argument, `rdi`,
/// which the entry does not know. The head's first use would teach it
/// back, so the join's walk counts one use and the head used to record
/// `[rdi]` every iteration (the loop's own edge knows it); closing the
/// join records `rdi` once, at the entry's way.
#[test]
fn a_join_whose_head_uses_the_register_is_closed_though_it_would_teach_it() {
    let mut blocks = vec![
        progs(&asm(|a| {
            a.mov(rcx, 0x7000u64)?;
            a.nop()
        })),
        progs(&asm(|a| {
            a.movzx(eax, byte_ptr(rdi))?;
            a.add(rdi, 1)?;
            a.nop()
        })),
    ];
    let p = plain_proc(&blocks, &[(0, 1), (1, 1)]);
    let head = Exec::plan_block(RegSet(0), &blocks[1], false).0;
    assert_eq!(head[0].as_ref().unwrap(), &[Recorded::Addr(0)]);
    let known = entry_knowledge(&p, &Returns::default(), &mut blocks);
    let mut want = RegSet::default();
    want.insert(Gpr(7));
    assert_eq!(blocks[0][1].1.before, want, "the entry's way records rdi");
    assert_eq!(values_per_block(&known, &blocks), [1, 0]);
}

/// gzip's deflate in small: `rbp` is learnt at B0 from an address whose
/// other register comes from a load (`r15`) only while that load is
/// marked, and the load's mark does not pay (its one use teaches `rbp`
/// instead of being derived). With every definition marked the loop head
/// B1 knows `rbp` on both ways in, so the join looked closed; once the
/// mark is dropped the entry's way loses `rbp`, and the join, offered
/// again, records it once there instead of the head's address every
/// iteration.
#[test]
fn a_join_is_closed_again_when_a_dropped_mark_loses_its_register() {
    let mut blocks = vec![
        progs(&asm(|a| {
            a.mov(r15d, dword_ptr(0x5000))?;
            a.lea(eax, ptr(r15 + 2))?;
            a.movzx(eax, byte_ptr(rbp + rax))?;
            a.mov(ecx, 0)?;
            a.nop()
        })),
        progs(&asm(|a| {
            a.movzx(edx, byte_ptr(rbp + rcx))?;
            a.add(ecx, 1)?;
            a.nop()
        })),
    ];
    let p = plain_proc(&blocks, &[(0, 1), (1, 1)]);
    let known = entry_knowledge(&p, &Returns::default(), &mut blocks);
    assert_eq!(blocks[0][1].1.before, RegSet(0), "r15's mark does not pay");
    let mut want = RegSet::default();
    want.insert(Gpr::RBP);
    assert_eq!(blocks[0][4].1.before, want, "the entry's way records rbp");
    assert_eq!(values_per_block(&known, &blocks), [2, 0]);
}

/// The return point of an unmarked call to `__errno_location@plt` takes
/// `rax` once (`Recorded::Once`), before its first instruction, and then
/// knows it; a return point that a plain edge reaches too, or a call to
/// another import's stub, does not.
#[test]
fn a_return_from_a_thread_constant_takes_rax_once() {
    let (mut p, _) = caller(CallTarget::Proc(1));
    p.blocks[2].call.as_mut().unwrap().marker = false;
    let blocks3 = || {
        progs(&asm(|a| {
            a.mov(dword_ptr(rax), 0)?; // the errno address: taken once
            a.mov(dword_ptr(rax + 4), 1) // then derived
        }))
    };
    let db = ProgramDb {
        procs: vec![
            p.clone(),
            plt_stub("__errno_location@plt"),
            plt_stub("memcmp@plt"),
        ],
        ..ProgramDb::default()
    };
    let returns = Returns::of(&db);
    assert_eq!(returns.thread_constant(1), Some(0));
    assert_eq!(returns.thread_constant(2), None);
    let plan = |p: &ProcDb| {
        let (_, mut blocks) = caller(CallTarget::Proc(1));
        blocks[3] = blocks3();
        let known = entry_knowledge(p, &returns, &mut blocks);
        let (plans, _) = Exec::plan_block(known[3], &blocks[3], false);
        plans.into_iter().map(|p| p.unwrap()).collect::<Vec<_>>()
    };
    assert_eq!(plan(&p), [vec![Recorded::Once(0)], vec![]]);
    let mut other = p.clone();
    other.blocks[2].call.as_mut().unwrap().target = CallTarget::Proc(2);
    assert_eq!(plan(&other), [vec![Recorded::Addr(0)], vec![]]);
    let mut joined = p.clone();
    joined.edges.push(EdgeDb {
        from: 1,
        to: 3,
        kind: EdgeKindDb::Taken,
        witness: None,
    });
    assert_eq!(plan(&joined)[0], vec![Recorded::Addr(0)]);
}

/// Procedure 0 calls procedure 1 (at 0x2000) from block 2, block 1
/// being `set_rdi`; procedure 1's entry block reads `[rdx+rdi]` and
/// returns; `call` changes the call's database entry. The module's
/// `Returns`, its argument registers named with the module's file `file`.
fn args_module(
    set_rdi: &[Instruction],
    file: &[u8],
    call: fn(&mut CallDb),
) -> (ProgramDb, Returns, Vec<Vec<(Instruction, InsnProgram)>>) {
    let (mut p, mut blocks) = caller(CallTarget::Proc(1));
    blocks[1] = progs(set_rdi);
    call(p.blocks[2].call.as_mut().unwrap());
    let mut q = returning();
    q.blocks[0].start = 0x2000;
    let db = ProgramDb {
        procs: vec![p, q],
        ..ProgramDb::default()
    };
    let callee = asm(|a| {
        a.movzx(eax, byte_ptr(rdx + rdi))?;
        a.ret()
    });
    let code = |b: &BlockDb| match b.start {
        0x2000 => Some(callee.clone()),
        s => (blocks.get((s - 0x1000) as usize)).map(|b| b.iter().map(|(i, _)| *i).collect()),
    };
    let returns = Returns::of(&db).with_args(&db, code, file);
    (db, returns, blocks)
}

/// `rdx` and `rdi` (`Returns::args` of the tests' callee).
const RDX_RDI: RegSet = RegSet(1 << 2 | 1 << 7);

/// A procedure entered only by a direct call starts with the argument
/// registers its entry block uses; the call records the one its caller
/// does not know (`rdx`), not the one it knows (`rdi`), and keeps both
/// across the call for the callee's entry.
#[test]
fn a_direct_call_passes_its_arguments_to_the_entry() {
    let knows_rdi = asm(|a| a.lea(rdi, qword_ptr(rsp + 8)));
    let (db, returns, mut blocks) = args_module(&knows_rdi, &[], |_| {});
    assert_eq!(returns.args(1), RDX_RDI);
    assert_eq!(returns.args(0), RegSet(0), "its entry block uses none");
    assert_eq!(returns.entry_args(&db.procs[1]), RDX_RDI);
    let known = entry_knowledge(&db.procs[0], &returns, &mut blocks);
    assert_eq!(blocks[2][0].1.args, RDX_RDI);
    let (plans, _) = Exec::plan_block(known[2], &blocks[2], false);
    assert_eq!(plans[0].as_ref().unwrap(), &vec![Recorded::Reg(Gpr(2))]);
    // The call keeps the arguments (their values before it) and forgets
    // the other caller-saved registers.
    let mut e = Exec::unknown(0);
    e.regs[4] = Some(0x7000);
    e.regs[7] = Some(0x7008);
    e.regs[0] = Some(5);
    let (call, prog) = &blocks[2][0];
    e.insn(call, prog, &mut |r| match r {
        Recorded::Reg(Gpr(2)) => Ok(0x5000),
        _ => Err("only rdx".into()),
    })
    .unwrap();
    assert_eq!(
        (e.regs[2], e.regs[7], e.regs[0]),
        (Some(0x5000), Some(0x7008), None)
    );
    // The return point keeps neither (it knows `rsp` alone).
    assert_eq!(known[3], RegSet(1 << 4));
    // The callee's entry knows them: its reference is derived.
    let mut callee = vec![progs(&asm(|a| {
        a.movzx(eax, byte_ptr(rdx + rdi))?;
        a.ret()
    }))];
    let entry = entry_knowledge(&db.procs[1], &returns, &mut callee)[0];
    assert_eq!(entry, RegSet(RDX_RDI.0 | 1 << 4));
    let (plans, _) = Exec::plan_block(entry, &callee[0], false);
    assert!(plans.iter().all(|p| p.as_ref().unwrap().is_empty()));
}

/// A caller that knows none of the arguments records each before the
/// call (one value per register, lowest first).
#[test]
fn a_caller_that_does_not_know_an_argument_records_it() {
    let loads_rdi = asm(|a| a.mov(rdi, qword_ptr(rsp + 8)));
    let (db, returns, mut blocks) = args_module(&loads_rdi, &[], |_| {});
    let known = entry_knowledge(&db.procs[0], &returns, &mut blocks);
    let (plans, _) = Exec::plan_block(known[2], &blocks[2], false);
    let want = vec![Recorded::Reg(Gpr(2)), Recorded::Reg(Gpr(7))];
    assert_eq!(plans[0].as_ref().unwrap(), &want);
}

/// No arguments for a procedure another way may enter: its address in
/// the file (a pointer, a relocation, an exported symbol), a tail jump,
/// an indirect call.
#[test]
fn a_procedure_entered_otherwise_takes_no_arguments() {
    let knows_rdi = asm(|a| a.lea(rdi, qword_ptr(rsp + 8)));
    let pointer = [0u8, 0, 0, 0x20, 0, 0, 0, 0, 0];
    let (_, returns, _) = args_module(&knows_rdi, &pointer, |_| {});
    assert_eq!(returns.args(1), RegSet(0), "its address in the file");
    let ways: [fn(&mut CallDb); 2] = [|c| c.tail = true, |c| c.indirect = true];
    for way in ways {
        assert_eq!(args_module(&knows_rdi, &[], way).1.args(1), RegSet(0));
    }
}
