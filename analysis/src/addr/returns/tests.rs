//! The fixpoint of [`Returns::of`] and [`Returns::tail_reaches`] against a naive
//! twin on random modules: the reachability of tail calls as a matrix
//! iterated to its closure, and the definition read literally (a procedure
//! returns by `ret` iff everything it reaches by tail calls leaves only by
//! `ret`, `NoReturn`, `Halt` or a direct tail call).

use aetrace_format::progdb::{
    BlockDb, CallDb, CallTarget, EdgeDb, EdgeKindDb, ProcDb, ProcStatus, ProgramDb,
};
use proptest::prelude::*;

use super::Returns;

/// How one block of a random procedure leaves it.
#[derive(Clone, Debug)]
enum Exit {
    Ret,
    NoReturn,
    Halt,
    /// A tail call to procedure `q` (maybe past the module's end),
    /// through an unresolved indirect jump or not.
    Tail(u32, bool),
    /// A tail call into untraced code.
    TailExternal,
    /// A call that returns to the next block (not an exit).
    Call(u32),
}

fn call(target: CallTarget, tail: bool, indirect: bool) -> CallDb {
    CallDb {
        target,
        marker: false,
        returns: !tail,
        tail,
        lazy: None,
        landing: None,
        jmpbuf: false,
        plt: false,
        indirect,
    }
}

/// A procedure whose block `b` leaves by `exits[b]`.
fn proc_of(traced: bool, exits: &[Exit]) -> ProcDb {
    let n = exits.len() as u32;
    let mut blocks = Vec::new();
    let mut edges = Vec::new();
    for (b, x) in exits.iter().enumerate() {
        let b = b as u32;
        let (kind, to, c) = match *x {
            Exit::Ret => (EdgeKindDb::Return, n, None),
            Exit::NoReturn => (EdgeKindDb::NoReturn, n, None),
            Exit::Halt => (EdgeKindDb::Halt, n, None),
            Exit::Tail(q, ind) => (
                EdgeKindDb::TailCall,
                n,
                Some(call(CallTarget::Proc(q), true, ind)),
            ),
            Exit::TailExternal => (
                EdgeKindDb::TailCall,
                n,
                Some(call(CallTarget::External, true, false)),
            ),
            Exit::Call(q) => (
                EdgeKindDb::CallReturn,
                (b + 1).min(n - 1),
                Some(call(CallTarget::Proc(q), false, false)),
            ),
        };
        blocks.push(BlockDb {
            start: 0x1000 + u64::from(b),
            insn_lens: vec![1],
            call: c,
        });
        edges.push(EdgeDb {
            from: b,
            to,
            kind,
            witness: None,
        });
    }
    ProcDb {
        name: "p".into(),
        status: if traced {
            ProcStatus::Traced
        } else {
            ProcStatus::LeftAlone("test".into())
        },
        entry: 0,
        blocks,
        edges,
        sigmap: None,
    }
}

fn exit(n: u32) -> impl Strategy<Value = Exit> {
    prop_oneof![
        3 => Just(Exit::Ret),
        1 => Just(Exit::NoReturn),
        1 => Just(Exit::Halt),
        3 => (0..n + 1, prop::bool::weighted(0.1)).prop_map(|(q, i)| Exit::Tail(q, i)),
        1 => Just(Exit::TailExternal),
        1 => (0..n).prop_map(Exit::Call),
    ]
}

fn module() -> impl Strategy<Value = ProgramDb> {
    (1u32..9).prop_flat_map(|n| {
        let p = (
            prop::bool::weighted(0.9),
            prop::collection::vec(exit(n), 1..5),
        );
        prop::collection::vec(p, n as usize).prop_map(|ps| ProgramDb {
            procs: ps.iter().map(|(t, xs)| proc_of(*t, xs)).collect(),
            ..ProgramDb::default()
        })
    })
}

/// `reach[f][q]`: `q` is `f` or reached from it by direct tail calls
/// (closure by iterating the one-step relation until nothing changes).
fn naive_reach(db: &ProgramDb) -> Vec<Vec<bool>> {
    let n = db.procs.len();
    let step = |f: usize| -> Vec<usize> {
        let p = &db.procs[f];
        p.blocks
            .iter()
            .filter_map(|b| b.call)
            .filter(|c| c.tail && !c.indirect)
            .filter_map(|c| match c.target {
                CallTarget::Proc(q) if (q as usize) < n => Some(q as usize),
                _ => None,
            })
            .collect()
    };
    let mut reach: Vec<Vec<bool>> = (0..n).map(|f| (0..n).map(|q| q == f).collect()).collect();
    loop {
        let mut next = reach.clone();
        for (f, row) in next.iter_mut().enumerate() {
            for g in step(f) {
                for (x, &y) in row.iter_mut().zip(&reach[g]) {
                    *x |= y;
                }
            }
        }
        if next == reach {
            return reach;
        }
        reach = next;
    }
}

/// Procedure `p` leaves only by `ret`, a way that never comes back, or a
/// direct tail call to a procedure of the module (`n` of them).
fn leaves_well(p: &ProcDb, n: usize) -> bool {
    p.is_traced()
        && p.edges.iter().all(|e| match e.kind {
            EdgeKindDb::TailCall => {
                let c = p.blocks[e.from as usize].call.unwrap();
                matches!(c.target, CallTarget::Proc(q) if (q as usize) < n) && !c.indirect
            }
            _ => true,
        })
}

proptest! {
    #[test]
    fn returns_equal_the_naive_definition(db in module()) {
        let n = db.procs.len();
        let reach = naive_reach(&db);
        let r = Returns::of(&db);
        for (f, row) in reach.iter().enumerate() {
            let naive = row.iter().zip(&db.procs).all(|(&t, p)| !t || leaves_well(p, n));
            prop_assert_eq!(r.by_ret(f as u32), naive, "procedure {}", f);
            for (q, &t) in row.iter().enumerate() {
                prop_assert_eq!(r.tail_reaches(f as u32, q as u32), t);
            }
        }
        prop_assert!(!r.by_ret(n as u32), "past the module's end");
    }
}

#[test]
fn a_tail_call_into_untraced_code_spoils_its_callers_only() {
    // 0 -> 1 -> 2 by tail calls, 2 jumps to `free@plt`; 3 <-> 4 tail-call
    // each other and return; 5 is left alone.
    let db = ProgramDb {
        procs: vec![
            proc_of(true, &[Exit::Ret, Exit::Tail(1, false)]),
            proc_of(true, &[Exit::Tail(2, false)]),
            proc_of(true, &[Exit::Ret, Exit::TailExternal]),
            proc_of(true, &[Exit::Tail(4, false), Exit::Ret]),
            proc_of(true, &[Exit::Tail(3, false), Exit::Halt]),
            proc_of(false, &[Exit::Ret]),
            proc_of(true, &[Exit::Call(5), Exit::NoReturn, Exit::Ret]),
        ],
        ..ProgramDb::default()
    };
    let r = Returns::of(&db);
    let got: Vec<bool> = (0..7).map(|f| r.by_ret(f)).collect();
    assert_eq!(got, [false, false, false, true, true, false, true]);
    assert!(r.tail_reaches(0, 2) && !r.tail_reaches(2, 0));
    assert!(r.tail_reaches(3, 4) && r.tail_reaches(4, 3));
}
