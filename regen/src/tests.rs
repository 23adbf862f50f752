//! Tests of the regenerator on traces synthesised without the rewriter.
//!
//! Oracle: random programs and executions from `aetrace_graph::testgen`.
//! Each program becomes a program database (invented addresses and
//! instruction lengths; witnesses placed by `place_witnesses`); each
//! execution becomes the byte stream the rewritten program would write
//! (witness bytes as edges are traversed, ENTER where untraced code enters
//! traced code, RETURN after marked calls, EXIT before `exit`), written into
//! a real trace by `TraceWriter`. The expected output is formatted here from
//! the execution's steps, independently of the regenerator's tables.
//! Hand-written programs cover each rule of `docs/regen.md` that random
//! programs do not reach (callbacks, lazy binding, tail calls, exit with
//! frames active, signals) and each kind of damage.

use crate::testkit::*;
use crate::{regen_trace, Error, Format, Options};
use aetrace_format::progdb::{
    BlockDb, CallDb, CallTarget, EdgeDb, EdgeKindDb, ProcDb, ProcStatus, ProgramDb, SigMap,
    SigPoint, SigRange,
};
use aetrace_format::{ThreadId, Trace};
use aetrace_graph::program::Execution;
use aetrace_graph::testgen::{self, Rng};
use proptest::prelude::*;

fn run(bytes: &[u8], opts: &Options) -> (Vec<u8>, Result<(), Error>) {
    let mut out = Vec::new();
    let r = match Trace::parse(bytes) {
        Ok(t) => regen_trace(&t, opts, &mut out).map(|_| ()),
        Err(e) => Err(e.into()),
    };
    (out, r)
}

/// The instruction trace as `--format insn` prints it, rebuilt from the
/// events of [`crate::visit::Visit`] (thread lines name only the thread:
/// compare with [`insn_lines`]); `Visit::with_segments` must give the
/// same, its segments expanded, and the same error.
fn visited(bytes: &[u8], opts: &Options) -> (String, Result<(), Error>) {
    let (plain, r) = visited_as(bytes, opts, false);
    let (segs, rs) = visited_as(bytes, opts, true);
    assert_eq!(plain, segs, "segments expanded");
    assert_eq!(
        r.as_ref().map_err(ToString::to_string),
        rs.as_ref().map_err(ToString::to_string)
    );
    (plain, r)
}

thread_local! {
    /// Segment records [`visited_as`] expanded.
    static SEGMENTS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn visited_as(bytes: &[u8], opts: &Options, segments: bool) -> (String, Result<(), Error>) {
    use crate::visit::{Event, Step, Visit};
    let t = Trace::parse(bytes).unwrap();
    let v = match segments {
        false => Visit::new(&t, opts),
        true => Visit::with_segments(&t, opts),
    };
    let v = match v {
        Ok(v) => v,
        Err(e) => return (String::new(), Err(e)),
    };
    let mut out = String::new();
    // One number, one segment.
    let mut numbers = std::collections::HashMap::new();
    let insns = |out: &mut String, module: u32, block, first: u32, end: u32| {
        let m = &v.modules()[module as usize];
        let lens = m.insn_lens(block);
        let mut a = m.load_base + m.blocks[block].start;
        for (k, &l) in lens.iter().enumerate().take(end as usize) {
            if k >= first as usize {
                out.push_str(&format!("{a:x}\n"));
            }
            a += u64::from(l);
        }
    };
    let r = v.run(&mut |runs| {
        for step in runs.steps() {
            match step {
                Step::Event(Event::Thread(t)) => out.push_str(&format!("# thread {t}\n")),
                Step::Event(Event::Run(r)) => insns(&mut out, r.module, r.block, r.first, r.end),
                Step::Segment(s) => {
                    assert!(segments && s.blocks >= 2);
                    SEGMENTS.with(|n| n.set(n.get() + 1));
                    let m = &v.modules()[s.module as usize];
                    assert!((s.number as usize) < crate::visit::Segment::numbers(m));
                    assert_eq!(*numbers.entry((s.module, s.number)).or_insert(s), s);
                    for b in s.blocks(m) {
                        insns(&mut out, s.module, b, 0, m.blocks[b].ninsns);
                    }
                }
                Step::Event(
                    Event::Signal { .. } | Event::SigReturn { .. } | Event::Pause { .. },
                ) => {}
            }
        }
        true
    });
    (out, r)
}

/// `--format insn` output with thread lines cut to `# thread N` and other
/// comments dropped, as [`visited`] rebuilds it.
fn insn_lines(out: &[u8]) -> String {
    let mut s = String::new();
    for l in text(out).lines() {
        if let Some(rest) = l.strip_prefix("# thread ") {
            let n = rest.split(' ').next().unwrap();
            s.push_str(&format!("# thread {n}\n"));
        } else if !l.starts_with('#') {
            s.push_str(l);
            s.push('\n');
        }
    }
    s
}

fn opts(format: Format) -> Options {
    Options {
        format,
        ..Options::default()
    }
}

fn text(v: &[u8]) -> &str {
    std::str::from_utf8(v).unwrap()
}

/// [`run`] with no summaries: every block walked one by one.
fn run_walked(bytes: &[u8], opts: &Options) -> (Vec<u8>, Result<(), Error>) {
    crate::summary::WALK_ONLY.with(|w| w.set(true));
    let r = run(bytes, opts);
    crate::summary::WALK_ONLY.with(|w| w.set(false));
    r
}

// ---------------------------------------------------------------- hand-written programs

/// A procedure with blocks of 2 instructions (3 + 2 bytes) laid out from
/// `*addr`; `edges` as `(from, to, kind, witness)`.
fn proc(
    addr: &mut u64,
    name: &str,
    calls: Vec<Option<CallDb>>,
    edges: Vec<(u32, u32, EdgeKindDb, Option<u16>)>,
) -> ProcDb {
    let blocks = calls
        .into_iter()
        .map(|call| {
            let b = BlockDb {
                start: *addr,
                insn_lens: vec![3, 2],
                call,
            };
            *addr += 0x10;
            b
        })
        .collect();
    ProcDb {
        name: name.into(),
        status: ProcStatus::Traced,
        entry: 0,
        blocks,
        edges: edges
            .into_iter()
            .map(|(from, to, kind, witness)| EdgeDb {
                from,
                to,
                kind,
                witness,
            })
            .collect(),
        sigmap: None,
    }
}

/// A program database of `procs` at [`LINK_BASE`], without a runtime.
fn db_of(procs: Vec<ProcDb>) -> ProgramDb {
    ProgramDb {
        link_base: LINK_BASE,
        runtime_vaddr: 0,
        counts_returns: false,
        moved_tables: Vec::new(),
        copy_dependent: Vec::new(),
        procs,
    }
}

fn call(
    target: CallTarget,
    marker: bool,
    returns: bool,
    tail: bool,
    lazy: Option<u32>,
) -> Option<CallDb> {
    Some(CallDb {
        target,
        marker,
        returns,
        tail,
        lazy,
        landing: None,
        jmpbuf: false,
        plt: false,
        indirect: false,
    })
}

use EdgeKindDb::*;

/// Expected `block` lines for `(proc, block)` steps of a hand-written db.
fn blocks_of(db: &ProgramDb, steps: &[(usize, usize)]) -> String {
    steps
        .iter()
        .map(|&(p, b)| {
            let blk = &db.procs[p].blocks[b];
            format!(
                "{:x} {} {}\n",
                LOAD_BASE + blk.start,
                blk.size(),
                blk.insn_lens.len()
            )
        })
        .collect()
}

const HDR: &str = "# thread 0 pid 4242 tid 4242\n";

fn hand(db: &ProgramDb, stream: &[u8]) -> (String, Result<(), Error>) {
    // (The hand-made streams have no SIGRETURN after their handlers.)
    hand_of_minor(db, stream, aetrace_format::header::MINOR_SIGRETURN - 1)
}

/// [`hand`] for a trace of format minor `minor`.
fn hand_of_minor(db: &ProgramDb, stream: &[u8], minor: u16) -> (String, Result<(), Error>) {
    let bytes = trace_bytes_of_minor(db, &[stream.to_vec()], 3, minor);
    let (out, r) = run(&bytes, &opts(Format::Block));
    (String::from_utf8(out).unwrap(), r)
}

/// Regenerates `stream` against `db` and expects exactly the block lines
/// `lines` (from [`blocks_of`] or [`parts`]) after the thread header.
fn expect(db: &ProgramDb, stream: &[u8], lines: &str) {
    let (out, r) = hand(db, stream);
    r.unwrap();
    assert_eq!(out, HDR.to_owned() + lines);
}

/// main: b0 calls external code (marker), b1 returns. cb: one block.
fn callback_db() -> ProgramDb {
    let mut a = LINK_BASE + 0x1000;
    db_of(vec![
        proc(
            &mut a,
            "main",
            vec![call(CallTarget::External, true, true, false, None), None],
            vec![(0, 1, CallReturn, None), (1, 2, Return, None)],
        ),
        proc(&mut a, "cb", vec![None], vec![(0, 1, Return, None)]),
    ])
}

#[test]
fn external_call_with_marker_and_callbacks() {
    let db = callback_db();
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    enter(&mut s, 1);
    enter(&mut s, 1);
    ret(&mut s);
    expect(&db, &s, &blocks_of(&db, &[(0, 0), (1, 0), (1, 0), (0, 1)]));
    // Without RETURN the stream ends inside the external call: a clean end.
    expect(
        &db,
        &s[..s.len() - 2],
        &blocks_of(&db, &[(0, 0), (1, 0), (1, 0)]),
    );
    // RETURN with no marked call waiting is an error naming its offset.
    let mut bad = s.clone();
    ret(&mut bad);
    let (_, r) = hand(&db, &bad);
    let e = r.unwrap_err().to_string();
    assert!(e.contains("RETURN at stream byte offset 26"), "{e}");
}

#[test]
fn lazy_binding_path_is_followed_once_per_thread() {
    let mut a = LINK_BASE + 0x1000;
    let ext_tail = |lazy| call(CallTarget::External, false, true, true, lazy);
    let db = db_of(vec![
        proc(
            &mut a,
            "main",
            vec![
                call(CallTarget::Proc(1), false, true, false, None),
                None,
                call(CallTarget::Proc(1), false, true, false, None),
                None,
            ],
            vec![
                (0, 1, CallReturn, None),
                (1, 2, FallThrough, None),
                (2, 3, CallReturn, None),
                (3, 4, Return, None),
            ],
        ),
        proc(
            &mut a,
            "puts@plt",
            vec![ext_tail(Some(2))],
            vec![(0, 1, TailCall, None)],
        ),
        proc(
            &mut a,
            "plt0",
            vec![ext_tail(None)],
            vec![(0, 1, TailCall, None)],
        ),
    ]);
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    enter(&mut s, 2);
    let (out, r) = hand(&db, &s);
    r.unwrap();
    let want = [(0, 0), (1, 0), (2, 0), (0, 1), (0, 2), (1, 0), (0, 3)];
    assert_eq!(out, HDR.to_owned() + &blocks_of(&db, &want));
    // A second ENTER of the lazy path is not a lazy path any more: main has
    // returned, so it is an outside entry (a callback), and plt0 returns to
    // untraced code.
    enter(&mut s, 2);
    let (out, r) = hand(&db, &s);
    r.unwrap();
    let mut want = want.to_vec();
    want.push((2, 0));
    assert_eq!(out, HDR.to_owned() + &blocks_of(&db, &want));
}

/// main calls `f@plt` twice; the stub's jump (`CallDb::plt`) has no
/// witness: LAZY(1) names its lazy outcome (its second half, then `<plt0>`).
fn lazy_plt_db() -> ProgramDb {
    let mut a = LINK_BASE + 0x1000;
    let main = proc(
        &mut a,
        "main",
        vec![Some(to_plt_stub()), Some(to_plt_stub()), None],
        vec![
            (0, 1, CallReturn, None),
            (1, 2, CallReturn, None),
            (2, 3, Return, None),
        ],
    );
    let mut procs = vec![main];
    procs.extend(plt_stub_procs(&mut a));
    db_of(procs)
}

/// A call of `f@plt` (procedure 1), counted at the way into the stub.
fn to_plt_stub() -> CallDb {
    CallDb {
        plt: true,
        ..call(CallTarget::Proc(1), false, true, false, None).unwrap()
    }
}

/// `f@plt`, whose jump (`CallDb::plt`) has no witness, its second half
/// tail-jumping to `<plt0>`; then `<plt0>`; laid out from `*a`.
fn plt_stub_procs(a: &mut u64) -> [ProcDb; 2] {
    let jump = CallDb {
        plt: true,
        ..call(CallTarget::External, false, true, true, None).unwrap()
    };
    [
        proc(
            a,
            "f@plt",
            vec![
                Some(jump),
                call(CallTarget::Proc(2), false, true, true, None),
            ],
            vec![
                (0, 2, TailCall, None),
                (0, 1, Taken, None),
                (1, 2, TailCall, None),
            ],
        ),
        proc(
            a,
            "<plt0>",
            vec![call(CallTarget::External, false, true, true, None)],
            vec![(0, 1, TailCall, None)],
        ),
    ]
}

/// LAZY: 0xFF 16 u32.
fn lazy(out: &mut Vec<u8>, p: u32) {
    rec(out, 16, &p.to_le_bytes());
}

#[test]
fn plt_jump_is_bound_unless_lazy_names_its_stub() {
    let db = lazy_plt_db();
    let lazy_path = [(0, 0), (1, 0), (1, 1), (2, 0)];
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    // Both calls bound: no record at all.
    expect(
        &db,
        &s,
        &blocks_of(&db, &[(0, 0), (1, 0), (0, 1), (1, 0), (0, 2)]),
    );
    // The first call binds lazily, the second finds the slot bound.
    lazy(&mut s, 1);
    let mut want = lazy_path.to_vec();
    want.extend([(0, 1), (1, 0), (0, 2)]);
    expect(&db, &s, &blocks_of(&db, &want));
    // A slot left lazy (LD_BIND_NOT): both calls take the lazy path.
    lazy(&mut s, 1);
    let mut want = lazy_path.to_vec();
    want.push((0, 1));
    want.extend(&lazy_path[1..]);
    want.push((0, 2));
    expect(&db, &s, &blocks_of(&db, &want));
    // A third LAZY, after main returned: no stub's jump is being decided.
    let mut bad = s.clone();
    lazy(&mut bad, 1);
    let (_, r) = hand(&db, &bad);
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("LAZY(1) (lazy binding in PLT stub f@plt of")
            && e.contains("where no jump of that stub is being decided"),
        "{e}"
    );
    // LAZY naming another procedure is no lazy outcome of this stub: both
    // jumps are bound, and the record is refused once read.
    let mut other = Vec::new();
    thread_rec(&mut other);
    enter(&mut other, 0);
    lazy(&mut other, 2);
    let (out, r) = hand(&db, &other);
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("LAZY(2) (lazy binding in PLT stub <plt0> of"),
        "{e}"
    );
    assert!(
        !out.contains(&format!("{:x} ", LOAD_BASE + db.procs[1].blocks[1].start)),
        "{out}"
    );
}

#[test]
fn tail_calls_external_and_traced() {
    let mut a = LINK_BASE + 0x1000;
    let db = db_of(vec![
        proc(
            &mut a,
            "main",
            vec![
                call(CallTarget::Proc(1), false, true, false, None),
                // A predicate: loop back (witness 0) or return (witness 1).
                None,
            ],
            vec![
                (0, 1, CallReturn, None),
                (1, 0, Taken, Some(0)),
                (1, 2, Return, Some(1)),
            ],
        ),
        // f: tail-calls g, whose edge carries a witness.
        proc(
            &mut a,
            "f",
            vec![call(CallTarget::Proc(2), false, true, true, None)],
            vec![(0, 1, TailCall, Some(0))],
        ),
        // g: jumps to untraced code (jmp puts), which returns to main.
        proc(
            &mut a,
            "g",
            vec![call(CallTarget::External, false, true, true, None)],
            vec![(0, 1, TailCall, None)],
        ),
    ]);
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    witness(&mut s, 0); // f -> g
    witness(&mut s, 0); // main loops
    witness(&mut s, 0); // f -> g
    witness(&mut s, 1); // main returns
    let (out, r) = hand(&db, &s);
    r.unwrap();
    let want = [
        (0, 0),
        (1, 0),
        (2, 0),
        (0, 1),
        (0, 0),
        (1, 0),
        (2, 0),
        (0, 1),
    ];
    assert_eq!(out, HDR.to_owned() + &blocks_of(&db, &want));
    // The tail edge's witness is checked.
    s[12] = 5;
    let (_, r) = hand(&db, &s);
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("procedure f block 0x401020") && e.contains("witness 4 (stream byte offset 12)"),
        "{e}"
    );
}

/// `main`: a loop whose head's witness 0 goes on to blocks 1 and 2 (with
/// the calls `first` and `second`, when given) and back, and witness 1
/// returns.
fn loop_main(a: &mut u64, first: Option<CallDb>, second: Option<CallDb>) -> ProcDb {
    let on = if first.is_some() {
        CallReturn
    } else {
        FallThrough
    };
    let back = if second.is_some() {
        CallReturn
    } else {
        FallThrough
    };
    proc(
        a,
        "main",
        vec![None, first, second, None, None],
        vec![
            (0, 1, Taken, Some(0)),
            (0, 4, Taken, Some(1)),
            (1, 2, on, None),
            (2, 3, back, None),
            (3, 0, Taken, None),
            (4, 5, Return, None),
        ],
    )
}

/// A procedure whose entry's witness (0 or 1) chooses one of two returns.
fn two_returns(a: &mut u64, name: &str) -> ProcDb {
    proc(
        a,
        name,
        vec![None, None, None],
        vec![
            (0, 1, Taken, Some(0)),
            (0, 2, Taken, Some(1)),
            (1, 3, Return, None),
            (2, 3, Return, None),
        ],
    )
}

/// Counting chains (`Summaries::count_run`) through a bound PLT stub's
/// call and a tail jump count what the block-by-block walk does: main's
/// loop calls `f@plt` (bound, or lazy once: LAZY) and `f`, which
/// tail-jumps to `g`, whose witness chooses one of two returns.
#[test]
fn counting_chains_pass_plt_calls_and_tail_jumps() {
    let mut a = LINK_BASE + 0x1000;
    let main = loop_main(
        &mut a,
        Some(to_plt_stub()),
        call(CallTarget::Proc(3), false, true, false, None),
    );
    let [stub, plt0] = plt_stub_procs(&mut a);
    let f = proc(
        &mut a,
        "f",
        vec![call(CallTarget::Proc(4), false, true, true, None)],
        vec![(0, 1, TailCall, None)],
    );
    let g = two_returns(&mut a, "g");
    let db = db_of(vec![main, stub, plt0, f, g]);
    for lazy_at in [None, Some(0), Some(7)] {
        let mut s = Vec::new();
        thread_rec(&mut s);
        enter(&mut s, 0);
        for i in 0..40u32 {
            witness(&mut s, 0);
            if lazy_at == Some(i) {
                lazy(&mut s, 1);
            }
            witness(&mut s, u32::from(i % 3 == 0));
        }
        witness(&mut s, 1);
        let bytes = trace_bytes(&db, &[s], 16);
        let (count, r) = run(
            &bytes,
            &Options {
                count: true,
                ..opts(Format::Block)
            },
        );
        r.unwrap();
        let (walked, rw) = run_walked(
            &bytes,
            &Options {
                count: true,
                ..opts(Format::Block)
            },
        );
        rw.unwrap();
        assert_eq!(text(&count), text(&walked), "LAZY at {lazy_at:?}");
        let (blocks, rb) = run(&bytes, &opts(Format::Block));
        rb.unwrap();
        let n = text(&blocks)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .count();
        assert!(text(&count).contains(&format!("total: {} instructions, {n} blocks", 2 * n)));
    }
}

/// A wide counting entry that returns through the frame below its read
/// point keeps that frame and is used only with it on top: the same loop
/// of `g`, with the same witness bytes, returns to two call sites of
/// `main` that pass different blocks back to its loop head (site A one,
/// site B two). `--count` equals the walk's; it does not when the lookup
/// ignores the kept frame.
#[test]
fn wide_entries_return_below_their_read_point_only_to_their_frame() {
    let mut a = LINK_BASE + 0x1000;
    let g_call = || call(CallTarget::Proc(1), false, true, false, None);
    let main = proc(
        &mut a,
        "main",
        vec![None, g_call(), None, g_call(), None, None, None],
        vec![
            (0, 1, Taken, Some(0)),
            (0, 3, Taken, Some(1)),
            (1, 2, CallReturn, None),
            (2, 0, Taken, None),
            (3, 4, CallReturn, None),
            (4, 5, Taken, None),
            (5, 0, Taken, None),
            (0, 6, Taken, Some(2)),
            (6, 7, Return, None),
        ],
    );
    let g = proc(
        &mut a,
        "g",
        vec![None, None, None],
        vec![
            (0, 1, Taken, Some(0)),
            (0, 2, Taken, Some(1)),
            (1, 0, Taken, None),
            (2, 3, Return, None),
        ],
    );
    let db = db_of(vec![main, g]);
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    let mut x = 7u32;
    for _ in 0..300 {
        let r = lcg(&mut x);
        let site_b = r >> 16 & 1;
        witness(&mut s, site_b);
        for _ in 0..r >> 20 & 3 {
            witness(&mut s, 0);
        }
        witness(&mut s, 1);
    }
    witness(&mut s, 2);
    assert_count_as_walked(&db, s);
}

/// A wide counting entry's callee entries are counted when the machine's
/// run ends, not at each hit: `main`'s loop calls `g` at each of 200
/// witnesses (four calls a wide hit). `--count` equals the walk's and
/// names 200 entries of `g`; it does not when the run's end leaves the
/// hits uncounted (`Summaries::settle_entries`).
#[test]
fn wide_hits_count_their_callees_when_the_run_ends() {
    let mut a = LINK_BASE + 0x1000;
    let main = loop_main(
        &mut a,
        call(CallTarget::Proc(1), false, true, false, None),
        None,
    );
    let g = proc(&mut a, "g", vec![None], vec![(0, 1, Return, None)]);
    let db = db_of(vec![main, g]);
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    for _ in 0..200 {
        witness(&mut s, 0);
    }
    witness(&mut s, 1);
    let counted = assert_count_as_walked(&db, s);
    assert!(counted.contains(" 200 g\n"), "{counted}");
}

/// A wide counting entry filled again counts its earlier hits' callee
/// entries first: `main`'s loop head chooses one of sixteen calls (of `g`
/// or `h`) by each of 20,000 pseudo-random witnesses, so the wide memo's
/// entries, keyed by four of them (65,536 keys, against 8,192 entries),
/// collide and are filled again after hits. `--count` equals the walk's; it does not when a fill drops the
/// hits of the entry it replaces.
#[test]
fn wide_entries_filled_again_count_their_hits_first() {
    const WAYS: u32 = 16;
    let mut a = LINK_BASE + 0x1000;
    // Block 0 chooses call block 1 + k; its return point 1 + WAYS + k
    // goes back to 0; witness WAYS leaves by the last block's return.
    let mut calls = vec![None];
    let mut edges = Vec::new();
    for k in 0..WAYS {
        calls.push(call(CallTarget::Proc(1 + k % 2), false, true, false, None));
        edges.push((0, 1 + k, Taken, Some(k as u16)));
        edges.push((1 + k, 1 + WAYS + k, CallReturn, None));
        edges.push((1 + WAYS + k, 0, Taken, None));
    }
    calls.extend((0..=WAYS).map(|_| None));
    edges.push((0, 1 + 2 * WAYS, Taken, Some(WAYS as u16)));
    edges.push((1 + 2 * WAYS, 2 + 2 * WAYS, Return, None));
    let main = proc(&mut a, "main", calls, edges);
    let g = proc(&mut a, "g", vec![None], vec![(0, 1, Return, None)]);
    let h = proc(&mut a, "h", vec![None], vec![(0, 1, Return, None)]);
    let db = db_of(vec![main, g, h]);
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    let mut x = 11u32;
    for _ in 0..20_000 {
        witness(&mut s, lcg(&mut x) >> 16 & (WAYS - 1));
    }
    witness(&mut s, WAYS);
    assert_count_as_walked(&db, s);
}

/// The next state of a linear congruential generator: the hand-made
/// tests' pseudo-random witnesses (its high bits).
fn lcg(x: &mut u32) -> u32 {
    *x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
    *x
}

/// Counts `stream` against `db` with summaries and block by block
/// ([`run_walked`]), expects the same totals and returns them.
fn assert_count_as_walked(db: &ProgramDb, stream: Vec<u8>) -> String {
    let bytes = trace_bytes(db, &[stream], 64);
    let count_opts = Options {
        count: true,
        ..opts(Format::Block)
    };
    let (count, r) = run(&bytes, &count_opts);
    r.unwrap();
    let (walked, rw) = run_walked(&bytes, &count_opts);
    rw.unwrap();
    assert_eq!(text(&count), text(&walked));
    text(&count).to_owned()
}

/// A counting chain takes a witness that an ENTER or a RETURN follows as
/// its last step: main's loop head chooses (ENTER next) an indirect call
/// of `cb`, whose witness chooses one of two returns (RETURN next) or the
/// loop's exit. `--count` equals the block-by-block walk's; it does not
/// when that last step is miscounted.
#[test]
fn counting_chains_stop_after_a_witness_an_enter_or_return_follows() {
    let mut a = LINK_BASE + 0x1000;
    let main = loop_main(
        &mut a,
        None,
        call(CallTarget::External, true, true, false, None),
    );
    let cb = two_returns(&mut a, "cb");
    let db = db_of(vec![main, cb]);
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    for i in 0..40u32 {
        witness(&mut s, 0);
        enter(&mut s, 1);
        witness(&mut s, i % 2);
        ret(&mut s);
    }
    witness(&mut s, 1);
    assert_count_as_walked(&db, s);
}

/// A chain's last step, before an ENTER, goes on through the direct
/// calls and plain returns that read no item (`Summaries::last_step`):
/// main's loop head chooses a direct call of `f`, which makes a marked
/// call of `cb` at once (ENTER next); or main calls `f`, whose witness
/// chooses one of two plain returns, then makes the marked call. `cb`'s
/// witness chooses one of two returns (RETURN next). `--count` equals the
/// block-by-block walk's.
#[test]
fn counting_chains_call_and_return_up_to_an_enter() {
    let marked = || call(CallTarget::External, true, true, false, None);
    let direct = || call(CallTarget::Proc(1), false, true, false, None);
    let mut a = LINK_BASE + 0x1000;
    let main = loop_main(&mut a, None, direct());
    let f = proc(
        &mut a,
        "f",
        vec![marked(), None],
        vec![(0, 1, CallReturn, None), (1, 2, Return, None)],
    );
    let cb = two_returns(&mut a, "cb");
    let calls_first = db_of(vec![main, f, cb]);
    let mut a = LINK_BASE + 0x1000;
    let main = loop_main(&mut a, direct(), marked());
    let f = two_returns(&mut a, "f");
    let cb = two_returns(&mut a, "cb");
    let returns_first = db_of(vec![main, f, cb]);
    for (db, f_chooses) in [(calls_first, false), (returns_first, true)] {
        let mut s = Vec::new();
        thread_rec(&mut s);
        enter(&mut s, 0);
        for i in 0..40u32 {
            witness(&mut s, 0);
            if f_chooses {
                witness(&mut s, i % 2);
            }
            enter(&mut s, 2);
            witness(&mut s, i / 2 % 2);
            ret(&mut s);
        }
        witness(&mut s, 1);
        assert_count_as_walked(&db, s);
    }
}

#[test]
fn exit_with_frames_active_then_an_exit_handler() {
    let mut a = LINK_BASE + 0x1000;
    let db = db_of(vec![
        proc(
            &mut a,
            "main",
            vec![call(CallTarget::Proc(1), false, true, false, None), None],
            vec![(0, 1, CallReturn, None), (1, 2, Return, None)],
        ),
        proc(
            &mut a,
            "die",
            vec![call(CallTarget::Exit, false, false, false, None)],
            vec![(0, 1, NoReturn, None)],
        ),
        proc(&mut a, "handler", vec![None], vec![(0, 1, Return, None)]),
    ]);
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    exit_rec(&mut s, 3);
    enter(&mut s, 2);
    expect(&db, &s, &blocks_of(&db, &[(0, 0), (1, 0), (2, 0)]));
    // The EXIT record must be there.
    let (out, r) = hand(&db, &s[..12]);
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("ends at byte offset 12 in procedure die after block 0x401020"),
        "{e}"
    );
    // Nothing the program wrote after ENTER(main) shows how far it got: the
    // forced moves since are not output (`Sink::certain`).
    assert_eq!(out, HDR);
}

#[test]
fn marked_traced_call_needs_its_return_record() {
    let mut a = LINK_BASE + 0x1000;
    let db = db_of(vec![
        proc(
            &mut a,
            "main",
            vec![call(CallTarget::Proc(1), true, true, false, None), None],
            vec![(0, 1, CallReturn, None), (1, 2, Return, None)],
        ),
        proc(&mut a, "f", vec![None], vec![(0, 1, Return, None)]),
    ]);
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    ret(&mut s);
    expect(&db, &s, &blocks_of(&db, &[(0, 0), (1, 0), (0, 1)]));
    let mut bad = s[..12].to_vec();
    witness(&mut bad, 0);
    let (_, r) = hand(&db, &bad);
    let e = r.unwrap_err().to_string();
    assert!(e.contains("witness 0 at stream byte offset 12 cannot occur in procedure main after block 0x401000"), "{e}");
}

#[test]
fn a_signal_in_untraced_code_and_a_desync() {
    let db = callback_db();
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    enter(&mut s, 1);
    // Without a signal map every rip is untraced code: a handler run by
    // the external call after its callback returned (the stream ends
    // before the handler's ENTER).
    let mut s1 = s.clone();
    signal(&mut s1, 11, 0x1234);
    expect(
        &db,
        &s1,
        &(blocks_of(&db, &[(0, 0), (1, 0)]) + "# signal 11\n"),
    );
    let mut s2 = s[..18].to_vec();
    rec(&mut s2, 5, &0x401000u64.to_le_bytes());
    let e = hand(&db, &s2).1.unwrap_err().to_string();
    assert!(
        e.contains("DESYNC(0x401000) at stream byte offset 18"),
        "{e}"
    );
}

#[test]
fn malformed_streams_are_named_errors() {
    let db = callback_db();
    let cases: [(&[u8], &str); 6] = [
        (
            &[0xFF, 8, 0, 0, 0, 0, 0xFF, 1, 0],
            "ends at byte offset 9 inside a record",
        ),
        (&[0xFF, 8, 0, 0, 0, 0, 0xFF], "ends at byte offset 7"),
        (&[0xFF, 8, 0, 0, 0, 0, 0x00], "byte 0x00"),
        (&[0xFF, 8, 0, 0, 0, 0, 0xFF, 0x42], "unknown record kind 66"),
        (
            &[0xFF, 8, 0, 0, 0, 0, 0xFF, 0x81, 0, 0, 0, 0],
            "still being written",
        ),
        (&[0xFF, 1, 0, 0, 0, 0], "THREAD or FORK must come first"),
    ];
    for (s, want) in cases {
        let e = hand(&db, s).1.unwrap_err().to_string();
        assert!(e.contains(want), "{s:?}: {e}");
    }
    // A witness while untraced code runs.
    let e = hand(&db, &[0xFF, 8, 0, 0, 0, 0, 3])
        .1
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("witness 2 at stream byte offset 6 cannot occur while untraced code runs"),
        "{e}"
    );
    // ENTER of a procedure that does not exist.
    let e = hand(&db, &[0xFF, 8, 0, 0, 0, 0, 0xFF, 1, 9, 0, 0, 0])
        .1
        .unwrap_err()
        .to_string();
    assert!(e.contains("ENTER(9)") && e.contains("2 procedures"), "{e}");
}

/// main loops on witness 0 (stream byte 1) and leaves on witness 1.
fn loop_db() -> ProgramDb {
    let mut a = LINK_BASE + 0x1000;
    db_of(vec![proc(
        &mut a,
        "main",
        vec![None, None, None],
        vec![
            (0, 1, FallThrough, None),
            (1, 1, Taken, Some(0)),
            (1, 2, FallThrough, Some(1)),
            (2, 3, Return, None),
        ],
    )])
}

fn loop_stream(n: usize) -> Vec<u8> {
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    s.extend(std::iter::repeat(1u8).take(n));
    s.push(2);
    s
}

/// Chunks of 64 KiB are decompressed ahead on a helper thread, chunks of
/// 4 KiB by the walk itself (`stream::AHEAD_MIN`): the same output, and
/// the same error after the same bytes when a later chunk is damaged.
#[test]
fn chunks_decompressed_ahead_read_the_same() {
    let db = loop_db();
    let mut bad = loop_stream(300_000);
    bad[200_000] = 0xF0;
    for s in [loop_stream(300_000), bad] {
        let streams = std::slice::from_ref(&s);
        let (small, big) = (
            trace_bytes(&db, streams, 4096),
            trace_bytes(&db, streams, 64 << 10),
        );
        for o in [
            opts(Format::Insn),
            Options {
                count: true,
                ..opts(Format::Insn)
            },
        ] {
            let (want, rw) = run(&small, &o);
            let (got, rg) = run(&big, &o);
            assert_eq!(got, want);
            assert_eq!(rg.map_err(|e| e.to_string()), rw.map_err(|e| e.to_string()));
        }
    }
}

/// The pieces of `-j N` share decompressed chunks (`stream::Chunks`):
/// a chunk's shared bytes are what it decompresses to, asking again
/// gives the same buffer (decompressed once), and the oldest go when the
/// budget is spent, counted from their claims.
#[test]
fn shared_chunks_are_each_chunk_decompressed_once() {
    use crate::stream::Chunks;
    use std::sync::Arc;
    let db = loop_db();
    let bytes = trace_bytes(&db, &[loop_stream(300_000)], 64 << 10);
    let t = Trace::parse(&bytes[..]).unwrap();
    let chunks: Vec<_> = t.chunks(ThreadId(0)).collect();
    assert!(chunks.len() > 3);
    let shared = Chunks::keeping(2 * (64 << 10));
    let got: Vec<_> = chunks.iter().map(|c| shared.get(*c).unwrap()).collect();
    for (c, a) in chunks.iter().zip(&got) {
        assert_eq!(**a, c.decompress().unwrap());
    }
    // Two chunks fit the budget: the last two are kept, the first is not.
    let n = chunks.len();
    for k in [n - 2, n - 1] {
        assert!(Arc::ptr_eq(&got[k], &shared.get(chunks[k]).unwrap()));
    }
    let again = shared.get(chunks[0]).unwrap();
    assert!(!Arc::ptr_eq(&got[0], &again) && got[0] == again);
    // A claim counts its raw length before its claimer fills it (before
    // 2026-11-30 an unfilled slot counted 0 bytes, so claims alone kept
    // any number of slots): claims alone evict the oldest.
    let claims = Chunks::keeping(2 * (64 << 10));
    assert!(
        chunks.iter().all(|c| claims.claim(*c).1.is_some()),
        "first claims"
    );
    assert!(claims.claim(chunks[n - 2]).1.is_none() && claims.claim(chunks[n - 1]).1.is_none());
    assert!(
        claims.claim(chunks[0]).1.is_some(),
        "the oldest claim was evicted"
    );
}

/// A data walk's control walk and value cursor read a thread's chunks
/// through one `stream::Chunks::from_start`, each decompressing ahead
/// into the chunks' slots or waiting for the other's: two streams read at
/// once on two threads give the items one stream alone gives (and the
/// same error at the same offset when a chunk holds a 0x00 byte), and the
/// chunks stay shared (asking again gives the same buffer).
#[test]
fn streams_from_the_start_share_their_chunks() {
    use crate::stream::{Chunks, Item, Stream};
    let db = loop_db();
    let mut bad = loop_stream(300_000);
    bad[200_000] = 0;
    for s in [loop_stream(300_000), bad] {
        let bytes = trace_bytes(&db, std::slice::from_ref(&s), 64 << 10);
        let t = Trace::parse(&bytes[..]).unwrap();
        let chunks = || t.chunks(ThreadId(0)).collect::<Vec<_>>();
        let items = |mut s: Stream<'_>| {
            let mut out = Vec::new();
            loop {
                match s.peek() {
                    Ok((Item::End, ..)) => return (out, None),
                    Ok((item, offset, len)) => {
                        out.push((offset, item));
                        s.advance(len);
                    }
                    Err(e) => return (out, Some(e.to_string())),
                }
            }
        };
        let want = items(Stream::new(ThreadId(0), chunks()));
        assert!(want.0.len() > 100_000);
        let shared = Chunks::from_start();
        let sharing = || Stream::new(ThreadId(0), chunks()).sharing(&shared);
        let (a, b) = std::thread::scope(|sc| {
            let a = sc.spawn(|| items(sharing()));
            let b = items(sharing());
            (a.join().unwrap(), b)
        });
        assert_eq!(a, want);
        assert_eq!(b, want);
        let c = chunks()[1];
        assert!(std::sync::Arc::ptr_eq(
            &shared.get(c).unwrap(),
            &shared.get(c).unwrap()
        ));
    }
}

#[test]
fn damaged_traces_give_clear_errors() {
    let db = loop_db();
    let s = loop_stream(2000);
    let bytes = trace_bytes(&db, std::slice::from_ref(&s), 1000);
    let (full, r) = run(&bytes, &opts(Format::Insn));
    r.unwrap();
    assert_eq!(full.iter().filter(|&&b| b == b'\n').count(), 1 + 2 * 2003);

    // A changed witness byte: 0xFE is witness 253, which main does not have.
    let mut s2 = s.clone();
    s2[700] = 0xFE;
    let (out, r) = run(&trace_bytes(&db, &[s2], 1000), &opts(Format::Insn));
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("procedure main block 0x401010: witness 253 (stream byte offset 700) is not in any successor's witness set"),
        "{e}"
    );
    assert!(full.starts_with(&out) && !out.is_empty());

    // A wrong checksum: one byte of the first chunk's compressed data.
    let t = Trace::parse(&bytes[..]).unwrap();
    let c = t.chunks(ThreadId(0)).next().unwrap().meta.data.clone();
    let mut bad = bytes.clone();
    bad[c.start + 3] ^= 0x40;
    let e = run(&bad, &opts(Format::Insn)).1.unwrap_err().to_string();
    assert!(e.contains("bad checksum"), "{e}");

    // A truncated chunk (the recorder died writing it): an incomplete trace
    // whose stream stops where a witness is needed.
    let last = t.chunks(ThreadId(0)).last().unwrap().meta.data.clone();
    let cut = &bytes[..last.start + 5];
    let (out, r) = run(cut, &opts(Format::Insn));
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("ends at byte offset 2000 in procedure main after block 0x401010")
            && e.contains("the trace is incomplete"),
        "{e}"
    );
    assert!(full.starts_with(&out) && out.len() > 1000);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Complete and terminated executions come back exactly, for every
    /// thread, with any chunking, and `-j 2` writes the same bytes as `-j 1`.
    #[test]
    fn random_executions_regenerate_exactly(
        seed in any::<u64>(),
        nprocs in 1usize..6,
        max_blocks in 1usize..40,
        structured in any::<bool>(),
        nthreads in 1usize..4,
        chunk in 1usize..64,
        piece in 1u64..24,
    ) {
        let s = random_case(seed, nprocs, max_blocks, structured);
        let mut rng = Rng::new(seed ^ 0x5eed);
        let ex = testgen::Executor::new(&s.prog);
        let execs: Vec<Execution> = (0..nthreads)
            .map(|_| {
                let budget = 1 + rng.below(300);
                ex.run(&mut rng, budget, false)
            })
            .collect();
        let streams: Vec<Vec<u8>> = execs.iter().map(|e| s.stream(e)).collect();
        let bytes = trace_bytes(&s.db, &streams, chunk);
        let mut want = String::new();
        for (i, e) in execs.iter().enumerate() {
            want.push_str(&format!("# thread {i} pid {PID} tid {}\n", PID + i as u32));
            want.push_str(&s.expected_insns(e));
        }
        let (out, r) = run(&bytes, &opts(Format::Insn));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
        prop_assert_eq!(text(&out), want.as_str());
        let (out2, r2) = run(&bytes, &Options { jobs: 2, ..opts(Format::Insn) });
        prop_assert!(r2.is_ok());
        prop_assert_eq!(&out2, &out);
        // Streams cut into pieces of a few bytes by the summarised fast pass.
        let (out3, r3) = run(&bytes, &Options { jobs: 3, piece_bytes: piece, ..opts(Format::Insn) });
        prop_assert!(r3.is_ok());
        prop_assert_eq!(&out3, &out);
        // The in-process events are the same blocks, also in pieces.
        for o in [opts(Format::Insn), Options { jobs: 3, piece_bytes: piece, ..opts(Format::Insn) }] {
            let (v, rv) = visited(&bytes, &o);
            prop_assert!(rv.is_ok());
            prop_assert_eq!(&v, &insn_lines(&out));
        }
        // Counting with summaries (chains through calls and returns)
        // counts the instructions and blocks the walk outputs.
        let (count, rc) = run(&bytes, &Options { count: true, ..opts(Format::Insn) });
        prop_assert!(rc.is_ok());
        let (blocks, rb) = run(&bytes, &opts(Format::Block));
        prop_assert!(rb.is_ok());
        let lines = |t: &str| t.lines().filter(|l| !l.starts_with('#')).count();
        let want_total = format!("total: {} instructions, {} blocks", lines(&want), lines(text(&blocks)));
        prop_assert!(text(&count).contains(&want_total), "{}\n{}", text(&count), want_total);
        // Chains count each procedure's entries as the walk does.
        let (walked, rw) = run_walked(&bytes, &Options { count: true, ..opts(Format::Insn) });
        prop_assert!(rw.is_ok());
        prop_assert_eq!(text(&count), text(&walked));
        // One thread alone, relative addresses.
        let last = nthreads as u32 - 1;
        let (one, r3) = run(&bytes, &Options { thread: Some(last), relative: true, ..opts(Format::Insn) });
        prop_assert!(r3.is_ok());
        let mut want_one = format!("# thread {last} pid {PID} tid {}\n", PID + last);
        for line in s.expected_insns(&execs[last as usize]).lines() {
            let a = u64::from_str_radix(line, 16).unwrap() - LOAD_BASE - LINK_BASE;
            want_one.push_str(&format!("{a:x}\n"));
        }
        prop_assert_eq!(text(&one), want_one.as_str());
    }

    /// A cut stream (the program was killed): the output and the execution
    /// are prefixes of one another, and a stream stopping where a record is
    /// needed is a `Truncated` error.
    #[test]
    fn cut_executions_give_prefixes(
        seed in any::<u64>(),
        nprocs in 1usize..5,
        max_blocks in 1usize..30,
        structured in any::<bool>(),
    ) {
        let s = random_case(seed, nprocs, max_blocks, structured);
        let mut rng = Rng::new(seed ^ 0xc07);
        let budget = 1 + rng.below(200);
        let e = testgen::Executor::new(&s.prog).run(&mut rng, budget, true);
        let bytes = trace_bytes(&s.db, &[s.stream(&e)], 7);
        let (out, r) = run(&bytes, &opts(Format::Insn));
        if let Err(err) = &r {
            prop_assert!(matches!(err, Error::Truncated { .. }), "{}", err);
        }
        let want = format!("# thread 0 pid {PID} tid {PID}\n{}", s.expected_insns(&e));
        // Pieces end where the whole walk ends, with the same error.
        let (cut, rcut) = run(&bytes, &Options { jobs: 2, piece_bytes: 3, ..opts(Format::Insn) });
        prop_assert_eq!(&cut, &out);
        prop_assert_eq!(rcut.err().map(|e| e.to_string()), r.as_ref().err().map(|e| e.to_string()));
        let out = text(&out);
        prop_assert!(out.starts_with(&want) || want.starts_with(out), "{out}\n---\n{want}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A killed run's cut stream ends its trace without an error (the
    /// thread's ending says where the next item was needed), with the
    /// output a cut stream of a normal run has before its error; the same
    /// with a torn last reservation (a byte still 0, a record still marked
    /// pending) and in pieces.
    #[test]
    fn killed_runs_end_where_their_witnesses_do(
        seed in any::<u64>(),
        nprocs in 1usize..5,
        max_blocks in 1usize..30,
        structured in any::<bool>(),
    ) {
        let s = random_case(seed, nprocs, max_blocks, structured);
        let mut rng = Rng::new(seed ^ 0x5e9);
        let budget = 1 + rng.below(200);
        let e = testgen::Executor::new(&s.prog).run(&mut rng, budget, true);
        let stream = s.stream(&e);
        let (normal, r) = run(&trace_bytes(&s.db, std::slice::from_ref(&stream), 7), &opts(Format::Insn));
        let cut = r.is_err();
        for tail in [&[][..], &[0, 0, 0][..], &[0xFF, 0x81, 5][..]] {
            let mut torn = stream.clone();
            torn.extend_from_slice(tail);
            let bytes = killed_trace_bytes(&s.db, &[torn], 7);
            for o in [opts(Format::Insn), Options { jobs: 2, piece_bytes: 3, ..opts(Format::Insn) }] {
                let (out, r) = run(&bytes, &o);
                prop_assert!(r.is_ok(), "{:?}", r);
                if cut {
                    prop_assert_eq!(text(&out), text(&normal));
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Output through summarised segments (`summary`) equals the
    /// block-by-block walk byte for byte, error included, on streams with
    /// a witness byte changed, or cut, at every position: what is certain
    /// (output before an error) does not depend on the summaries.
    #[test]
    fn summarised_output_equals_the_walk_on_damaged_streams(
        seed in any::<u64>(),
        nprocs in 1usize..5,
        max_blocks in 1usize..30,
        structured in any::<bool>(),
        to in 1u8..0xFF,
    ) {
        let s = random_case(seed, nprocs, max_blocks, structured);
        let mut rng = Rng::new(seed ^ 0xda3);
        let budget = 1 + rng.below(200);
        let e = testgen::Executor::new(&s.prog).run(&mut rng, budget, false);
        let stream = s.stream(&e);
        for i in 1..stream.len().min(160) {
            for cut in [false, true] {
                let mut damaged = stream.clone();
                if cut {
                    damaged.truncate(i);
                } else if (1..0xFF).contains(&damaged[i]) {
                    damaged[i] = to;
                } else {
                    continue;
                }
                let bytes = trace_bytes(&s.db, &[damaged], 64);
                let (out, r) = run(&bytes, &opts(Format::Block));
                let (walk, rw) = run_walked(&bytes, &opts(Format::Block));
                prop_assert_eq!(text(&out), text(&walk), "byte {} (cut {})", i, cut);
                prop_assert_eq!(r.err().map(|e| e.to_string()), rw.err().map(|e| e.to_string()));
            }
        }
    }
}

#[test]
fn every_format_and_count_agree_with_the_execution() {
    let s = random_case(11, 4, 30, true);
    let mut rng = Rng::new(3);
    let e = testgen::Executor::new(&s.prog).run(&mut rng, 400, false);
    let bytes = trace_bytes(&s.db, &[s.stream(&e)], 100);
    let insns: Vec<u64> = s
        .expected_insns(&e)
        .lines()
        .map(|l| u64::from_str_radix(l, 16).unwrap())
        .collect();
    let steps: Vec<_> = s.executed(&e).collect();
    let lens: Vec<u8> = steps
        .iter()
        .flat_map(|b| b.insn_lens.iter().copied())
        .collect();

    let din = run(&bytes, &opts(Format::Din)).0;
    let want: String = insns.iter().map(|a| format!("2 {a:x}\n")).collect();
    assert_eq!(text(&din), want);

    let xdin = run(&bytes, &opts(Format::Xdin)).0;
    let want: String = insns
        .iter()
        .zip(&lens)
        .map(|(a, l)| format!("i {a:x} {l:x}\n"))
        .collect();
    assert_eq!(text(&xdin), want);

    let block = run(&bytes, &opts(Format::Block)).0;
    let want: String = HDR.to_owned()
        + &steps
            .iter()
            .map(|b| {
                format!(
                    "{:x} {} {}\n",
                    LOAD_BASE + b.start,
                    b.size(),
                    b.insn_lens.len()
                )
            })
            .collect::<String>();
    assert_eq!(text(&block), want);

    let bin = run(&bytes, &opts(Format::Bin)).0;
    let t = aetrace_format::addrtrace::AddrTrace::parse(&bin).unwrap();
    let recs: Vec<(u64, u8)> = t.records().map(|r| (r.addr, r.size)).collect();
    let want: Vec<(u64, u8)> = insns.iter().copied().zip(lens.iter().copied()).collect();
    assert_eq!(recs, want);
    assert!(t
        .records()
        .all(|r| r.kind == aetrace_format::addrtrace::AccessKind::Instr));

    let count = run(
        &bytes,
        &Options {
            count: true,
            ..opts(Format::Insn)
        },
    )
    .0;
    let count = text(&count);
    let first = format!(
        "thread 0 pid {PID} tid {PID} module /tmp/prog: {} instructions, {} blocks\n",
        insns.len(),
        steps.len()
    );
    assert!(count.starts_with(&first), "{count}");
    let main_entries = format!("{:>12} p0\n", 1);
    assert!(count.contains(&main_entries), "{count}");

    // --module by file name and by path; an unknown or uninstrumented name fails.
    for name in ["prog", "/tmp/prog"] {
        let o = Options {
            module: Some(name.into()),
            ..opts(Format::Din)
        };
        assert_eq!(run(&bytes, &o).0, din);
    }
    let e = run(
        &bytes,
        &Options {
            module: Some("libc.so.6".into()),
            ..opts(Format::Din)
        },
    )
    .1;
    assert!(e
        .unwrap_err()
        .to_string()
        .contains("no module named libc.so.6"));
    let e = run(
        &bytes,
        &Options {
            thread: Some(7),
            ..opts(Format::Din)
        },
    )
    .1;
    assert!(e.unwrap_err().to_string().contains("no thread 7"));
}

#[test]
fn regen_command_reads_a_file() {
    let db = loop_db();
    let bytes = trace_bytes(&db, &[loop_stream(3)], 4);
    let path = std::env::temp_dir().join(format!("aetrace-regen-test-{}.aet", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let mut out = Vec::new();
    crate::regen_command(&path, &opts(Format::Block), &mut out).unwrap();
    std::fs::remove_file(&path).unwrap();
    let b = |i: usize| {
        format!(
            "{:x} 5 2\n",
            LOAD_BASE + LINK_BASE + 0x1000 + 0x10 * i as u64
        )
    };
    assert_eq!(
        text(&out),
        HDR.to_owned() + &b(0) + &b(1) + &b(1) + &b(1) + &b(1) + &b(2)
    );
}

/// Segment records come (the comparison in [`visited`] is not vacuous)
/// and stand for their blocks, threads and pieces included.
#[test]
fn segment_records_stand_for_their_blocks() {
    SEGMENTS.with(|n| n.set(0));
    for seed in 0..8 {
        let s = random_case(seed, 4, 30, seed % 2 == 0);
        let mut rng = Rng::new(seed);
        let ex = testgen::Executor::new(&s.prog);
        let streams: Vec<Vec<u8>> = (0..2)
            .map(|_| s.stream(&ex.run(&mut rng, 2000, false)))
            .collect();
        let bytes = trace_bytes(&s.db, &streams, 64);
        for o in [
            opts(Format::Insn),
            Options {
                jobs: 2,
                piece_bytes: 32,
                ..opts(Format::Insn)
            },
        ] {
            let (v, r) = visited(&bytes, &o);
            assert!(r.is_ok());
            assert_eq!(v, insn_lines(&run(&bytes, &o).0));
        }
    }
    assert!(SEGMENTS.with(|n| n.get()) > 0, "no segment record");
}

#[test]
fn witness_numbering_must_match_the_placement() {
    let mut db = loop_db();
    db.procs[0].edges[1].witness = Some(1);
    db.procs[0].edges[2].witness = Some(0);
    let bytes = trace_bytes(&db, &[loop_stream(3)], 4);
    let e = run(&bytes, &opts(Format::Insn)).1.unwrap_err().to_string();
    assert!(
        e.contains("procedure main: edge 1 (1 -> 1) has witness Some(1)"),
        "{e}"
    );
}

#[test]
fn an_error_in_one_thread_stops_parallel_output_at_the_same_byte() {
    let db = loop_db();
    let mut bad = loop_stream(3000);
    bad[2500] = 0xF0;
    let streams = [
        loop_stream(300_000),
        bad,
        loop_stream(5),
        loop_stream(70_000),
    ];
    let bytes = trace_bytes(&db, &streams, 4096);
    let (out1, r1) = run(&bytes, &opts(Format::Xdin));
    let e1 = r1.unwrap_err().to_string();
    assert!(
        e1.starts_with(
            "thread 1: procedure main block 0x401010: witness 239 (stream byte offset 2500)"
        ),
        "{e1}"
    );
    for (jobs, piece_bytes) in [(2, 0), (3, 0), (8, 0), (2, 1000), (3, 777)] {
        let (out, r) = run(
            &bytes,
            &Options {
                jobs,
                piece_bytes,
                ..opts(Format::Xdin)
            },
        );
        assert_eq!(r.unwrap_err().to_string(), e1);
        assert!(
            out == out1,
            "-j {jobs}: {} bytes, -j 1: {}",
            out.len(),
            out1.len()
        );
        // The in-process events stop at the same instruction, same error.
        let o = Options {
            jobs,
            piece_bytes,
            ..opts(Format::Insn)
        };
        let (v, rv) = visited(&bytes, &o);
        assert_eq!(rv.unwrap_err().to_string(), e1);
        assert_eq!(v, insn_lines(&run(&bytes, &o).0));
    }
    // Thread 0's output is longer than a batch: it came in several.
    assert!(out1.len() > 2 * crate::output::BATCH);
}

/// The rewriter's PLT stub: `jmp [GOT]` becomes a predicate whose outcomes
/// are the bound import (a tail-call edge to EXIT, witness 0) and the
/// unbound path `push n; jmp plt0` (block 1, witness 1).
fn plt_db(marked: bool) -> ProgramDb {
    let mut a = LINK_BASE + 0x1000;
    db_of(vec![
        proc(
            &mut a,
            "main",
            vec![call(CallTarget::Proc(1), marked, true, false, None), None],
            vec![(0, 1, CallReturn, None), (1, 2, Return, None)],
        ),
        proc(
            &mut a,
            "qsort@plt",
            vec![None, call(CallTarget::Proc(2), false, true, true, None)],
            vec![
                (0, 2, TailCall, Some(0)),
                (0, 1, Taken, Some(1)),
                (1, 2, TailCall, None),
            ],
        ),
        proc(
            &mut a,
            "plt0",
            vec![call(CallTarget::External, false, true, true, None)],
            vec![(0, 1, TailCall, None)],
        ),
        proc(&mut a, "cmp", vec![None], vec![(0, 1, Return, None)]),
    ])
}

#[test]
fn plt_stub_predicate_with_callbacks_before_return() {
    let db = plt_db(true);
    for (bound, want) in [
        (
            false,
            vec![(0, 0), (1, 0), (1, 1), (2, 0), (3, 0), (3, 0), (0, 1)],
        ),
        (true, vec![(0, 0), (1, 0), (3, 0), (3, 0), (0, 1)]),
    ] {
        let mut s = Vec::new();
        thread_rec(&mut s);
        enter(&mut s, 0);
        witness(&mut s, if bound { 0 } else { 1 });
        enter(&mut s, 3);
        enter(&mut s, 3);
        ret(&mut s);
        let (out, r) = hand(&db, &s);
        r.unwrap();
        assert_eq!(
            out,
            HDR.to_owned() + &blocks_of(&db, &want),
            "bound {bound}"
        );
    }
}

#[test]
fn exit_reached_through_a_plt_jump_stops_the_frames() {
    let db = plt_db(false);
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    witness(&mut s, 0);
    exit_rec(&mut s, 0);
    let (out, r) = hand(&db, &s);
    r.unwrap();
    // main's return point never runs.
    assert_eq!(out, HDR.to_owned() + &blocks_of(&db, &[(0, 0), (1, 0)]));
}

#[test]
fn fork_children_without_a_parent_and_misplaced_landings_are_refused_clearly() {
    let db = callback_db();
    let mut fork = vec![0xFF, 7, 0, 0, 0, 0];
    let (out, r) = hand(&db, &fork);
    r.unwrap();
    assert_eq!(out, HDR);
    witness(&mut fork, 0);
    let e = hand(&db, &fork).1.unwrap_err().to_string();
    assert!(
        e.contains("FORK(0) at stream byte offset 0") && e.contains("parent's state"),
        "{e}"
    );
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    rec(&mut s, 11, &1u32.to_le_bytes());
    let e = hand(&db, &s).1.unwrap_err().to_string();
    assert!(
        e.contains("LANDING(1) at stream byte offset 12")
            && e.contains("no active frame of that procedure"),
        "{e}"
    );
}

#[test]
fn wide_witnesses_of_big_procedures() {
    // A 300-way jump table: witnesses 254.. need WIDE records.
    let mut a = LINK_BASE + 0x1000;
    let n = 300u32;
    let mut edges: Vec<(u32, u32, EdgeKindDb, Option<u16>)> = (1..=n)
        .map(|t| (0, t, JumpTable, Some(t as u16 - 1)))
        .collect();
    edges.extend((1..=n).map(|t| (t, n + 1, Return, None)));
    let db = db_of(vec![proc(&mut a, "big", vec![None; n as usize + 1], edges)]);
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    witness(&mut s, 280);
    enter(&mut s, 0);
    witness(&mut s, 5);
    enter(&mut s, 0);
    witness(&mut s, 253);
    let (out, r) = hand(&db, &s);
    r.unwrap();
    let want = [(0, 0), (0, 281), (0, 0), (0, 6), (0, 0), (0, 254)];
    assert_eq!(out, HDR.to_owned() + &blocks_of(&db, &want));
    assert_eq!(s[12..16], [0xFF, 9, 24, 1]);
    assert_eq!(s[22], 6);
}

#[test]
fn workers_that_block_on_a_full_channel_still_write_every_thread_in_order() {
    // 4 batches of lookahead per thread (the minimum); threads 0 and 2 need
    // about 10 each, so workers block while the writer is behind them.
    let db = loop_db();
    let streams = [loop_stream(300_000), loop_stream(5), loop_stream(300_000)];
    let bytes = trace_bytes(&db, &streams, 4096);
    let t = Trace::parse(&bytes[..]).unwrap();
    let o = |jobs| Options {
        jobs,
        ..opts(Format::Xdin)
    };
    let mut seq = Vec::new();
    crate::output::regen_trace_ahead(&t, &o(1), &mut seq, 0, None, None).unwrap();
    assert!(seq.len() > 16 * crate::output::BATCH);
    assert_eq!(
        seq.iter().filter(|&&b| b == b'\n').count(),
        // Blocks b0, b1 (n + 1 times), b2: 2 instructions each.
        2 * 2 * (300_000 + 3) + 2 * (5 + 3)
    );
    for jobs in [2, 3] {
        let mut par = Vec::new();
        crate::output::regen_trace_ahead(&t, &o(jobs), &mut par, 0, None, None).unwrap();
        assert!(par == seq, "-j {jobs} differs with blocking workers");
    }
}

// ---------------------------------------------------------------- several modules

const LIB_LOAD: u64 = 0x7f00_0000_0000;

/// A trace of one thread running the executable `exe` (module 0) and an
/// instrumented library `lib` (module 1, `/lib/libx.so.1`), whose MODULE
/// comes after the chunks, as the recorder writes it when the library's
/// runtime first reports its address.
fn two_module_trace(exe: &ProgramDb, lib: &ProgramDb, stream: &[u8]) -> Vec<u8> {
    use aetrace_format::{
        module_flags, EndReason, Header, Module, ModuleId, StartReason, ThreadStart, TraceWriter,
    };
    let mut w = TraceWriter::new(Vec::new(), &Header::new("regen test", 0).unwrap()).unwrap();
    let module = |id, flags, load_base, path: &str| Module {
        id: ModuleId(id),
        pid: PID,
        flags,
        load_base,
        size: 0x10_0000,
        build_id: vec![],
        path: path.as_bytes().to_vec(),
    };
    w.module(&module(
        0,
        module_flags::MAIN | module_flags::INSTRUMENTED,
        LOAD_BASE,
        "/tmp/prog",
    ))
    .unwrap();
    w.program_database(ModuleId(0), aetrace_format::progdb::VERSION, &exe.encode())
        .unwrap();
    w.thread_start(&ThreadStart {
        thread: ThreadId(0),
        parent: None,
        os_tid: PID,
        pid: PID,
        reason: StartReason::Main,
    })
    .unwrap();
    for c in stream.chunks(5) {
        w.chunk(ThreadId(0), c, 0).unwrap();
    }
    w.module(&module(
        1,
        module_flags::INSTRUMENTED,
        LIB_LOAD,
        "/lib/libx.so.1",
    ))
    .unwrap();
    w.program_database(ModuleId(1), aetrace_format::progdb::VERSION, &lib.encode())
        .unwrap();
    w.thread_end(ThreadId(0), EndReason::Exit).unwrap();
    w.finish().unwrap().0
}

/// bzip2 and libbz2 in miniature: the program calls an exported library
/// function (ENTER with tag 1), which calls back into the program (ENTER
/// with tag 0) before both calls return; one stack across both modules.
#[test]
fn calls_and_callbacks_across_modules_share_one_stack() {
    let exe = callback_db();
    let mut a = 0x2000;
    let lib = ProgramDb {
        link_base: 0,
        runtime_vaddr: 0,
        counts_returns: false,
        moved_tables: Vec::new(),
        copy_dependent: Vec::new(),
        procs: vec![proc(
            &mut a,
            "lib_f",
            vec![call(CallTarget::External, true, true, false, None), None],
            vec![(0, 1, CallReturn, None), (1, 2, Return, None)],
        )],
    };
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0); // main
    enter(&mut s, 1 << crate::machine::TAG_SHIFT); // lib_f, from main's external call
    enter(&mut s, 1); // cb, called back by lib_f
    ret(&mut s); // lib_f's external call returns
    ret(&mut s); // main's external call returns
    let bytes = two_module_trace(&exe, &lib, &s);
    let line = |base: u64, b: &BlockDb| format!("{:x} 5 2\n", base + b.start);
    let (m, c) = (&exe.procs[0].blocks, &exe.procs[1].blocks);
    let l = &lib.procs[0].blocks;
    let (out, r) = run(&bytes, &opts(Format::Block));
    r.unwrap();
    assert_eq!(
        text(&out),
        HDR.to_owned()
            + &line(LOAD_BASE, &m[0])
            + &line(LIB_LOAD, &l[0])
            + &line(LOAD_BASE, &c[0])
            + &line(LIB_LOAD, &l[1])
            + &line(LOAD_BASE, &m[1])
    );
    // One module: the other's blocks are walked but not printed.
    let only_lib = Options {
        module: Some("libx.so.1".into()),
        relative: true,
        ..opts(Format::Block)
    };
    let (out, r) = run(&bytes, &only_lib);
    r.unwrap();
    assert_eq!(
        text(&out),
        HDR.to_owned() + &line(0, &l[0]) + &line(0, &l[1])
    );
    let counts = Options {
        count: true,
        ..Options::default()
    };
    let (out, r) = run(&bytes, &counts);
    r.unwrap();
    let out = text(&out);
    assert!(
        out.contains("module /tmp/prog: 6 instructions, 3 blocks"),
        "{out}"
    );
    assert!(
        out.contains("module /lib/libx.so.1: 4 instructions, 2 blocks"),
        "{out}"
    );
    // A tag no module of the process has is an error naming it.
    let mut bad = s.clone();
    bad.truncate(s.len() - 4);
    enter(&mut bad, 2 << crate::machine::TAG_SHIFT);
    let (_, r) = run(&two_module_trace(&exe, &lib, &bad), &opts(Format::Block));
    let e = r.unwrap_err().to_string();
    assert!(e.contains("module tag 2"), "{e}");
}

// ---------------------------------------------------------------- signals

fn signal(out: &mut Vec<u8>, signo: u32, rip: u64) {
    let mut p = signo.to_le_bytes().to_vec();
    p.extend_from_slice(&rip.to_le_bytes());
    rec(out, 3, &p);
}

/// Copy of `main` at link-time 0x500000, of the handlers from 0x500100.
const COPY: u64 = 0x50_0000;

fn insn(proc: u32, block: u32, insn: u32, count: u32) -> SigPoint {
    SigPoint::Insn {
        proc,
        block,
        insn,
        count,
    }
}

/// A signal map of a copy at `start`: `(offset, point)` ranges.
fn map(start: u64, len: u64, r: Vec<(u64, SigPoint)>) -> Option<SigMap> {
    Some(SigMap {
        start,
        len,
        ranges: r
            .into_iter()
            .map(|(offset, point)| SigRange { offset, point })
            .collect(),
    })
}

/// main: b0 falls into b1, a loop (taken edge: witness 0, written in a
/// stub; fall-through to b2: witness 1, written inline); b2 returns.
/// h: one block, returns. h_exit: calls `exit`. The signal maps lay the
/// copies out as the rewriter does (stub, copied instructions, witness
/// sequences), with addresses chosen here.
fn signal_db() -> ProgramDb {
    let mut a = LINK_BASE + 0x1000;
    let mut main = proc(
        &mut a,
        "main",
        vec![None, None, None],
        vec![
            (0, 1, FallThrough, None),
            (1, 1, Taken, Some(0)),
            (1, 2, FallThrough, Some(1)),
            (2, 3, Return, None),
        ],
    );
    main.sigmap = map(
        COPY,
        0x30,
        vec![
            (0x00, SigPoint::Outside),
            (0x10, insn(0, 0, 0, 2)),
            (0x15, insn(0, 1, 0, 2)),
            (0x1a, SigPoint::Witness { edge: 2 }),
            (0x20, insn(0, 2, 0, 2)),
            (0x25, SigPoint::Witness { edge: 1 }),
            (0x2b, insn(0, 1, 0, 0)),
        ],
    );
    let mut h = proc(&mut a, "h", vec![None], vec![(0, 1, Return, None)]);
    h.sigmap = map(
        COPY + 0x100,
        0x15,
        vec![(0, SigPoint::Outside), (0x10, insn(1, 0, 0, 2))],
    );
    let mut h_exit = proc(
        &mut a,
        "h_exit",
        vec![call(CallTarget::Exit, false, false, false, None)],
        vec![(0, 1, NoReturn, None)],
    );
    h_exit.sigmap = map(
        COPY + 0x200,
        0x15,
        vec![(0, SigPoint::Outside), (0x10, insn(2, 0, 0, 2))],
    );
    db_of(vec![main, h, h_exit])
}

/// Block lines: `(proc, block)` whole, or `(proc, block, from, to)` a part.
fn parts(db: &ProgramDb, steps: &[(usize, usize, u32, u32)]) -> String {
    steps
        .iter()
        .map(|&(p, b, from, to)| {
            if p == SIG {
                return format!("# signal {b}\n");
            }
            let blk = &db.procs[p].blocks[b];
            let lens = &blk.insn_lens[from as usize..to as usize];
            let skip: u64 = blk.insn_lens[..from as usize]
                .iter()
                .map(|&l| u64::from(l))
                .sum();
            format!(
                "{:x} {} {}\n",
                LOAD_BASE + blk.start + skip,
                lens.iter().map(|&l| u64::from(l)).sum::<u64>(),
                lens.len()
            )
        })
        .collect()
}

/// The procedure index of a [`parts`] step that is the `# signal N` line
/// (`N` in the block index).
const SIG: usize = usize::MAX;

/// The `# signal signo` line, for [`parts`].
fn sig(signo: usize) -> (usize, usize, u32, u32) {
    (SIG, signo, 0, 0)
}

/// A whole two-instruction block of [`signal_db`], for [`parts`].
fn full(p: usize, b: usize) -> (usize, usize, u32, u32) {
    (p, b, 0, 2)
}

/// main's stream up to its loop: THREAD, ENTER(main).
fn main_start() -> Vec<u8> {
    let mut s = Vec::new();
    thread_rec(&mut s);
    enter(&mut s, 0);
    s
}

const W: u32 = 4;

#[test]
fn a_handler_splits_the_interrupted_block() {
    let db = signal_db();
    // Inside b1 before its second instruction, on the first iteration (the
    // signal comes before the loop's witness).
    let mut s = main_start();
    signal(&mut s, 14, LOAD_BASE + COPY + 0x18);
    enter(&mut s, 1);
    witness(&mut s, 0);
    witness(&mut s, 1);
    expect(
        &db,
        &s,
        &parts(
            &db,
            &[
                full(0, 0),
                (0, 1, 0, 1),
                sig(14),
                full(1, 0),
                (0, 1, 1, 2),
                full(0, 1),
                full(0, 2),
            ],
        ),
    );
    // Every format splits the same way; the instruction stream is the
    // block stream's instructions.
    // (A hand-made stream: no SIGRETURN after its handler.)
    let minor = aetrace_format::header::MINOR_SIGRETURN - 1;
    let bytes = trace_bytes_of_minor(&db, &[s.clone()], W as usize, minor);
    let insns = run(&bytes, &opts(Format::Insn)).0;
    let mut want: Vec<String> = [
        0x401000u64,
        0x401003,
        0x401010,
        0x401030,
        0x401033,
        0x401013,
        0x401010,
        0x401013,
        0x401020,
        0x401023,
    ]
    .iter()
    .map(|a| format!("{:x}", LOAD_BASE + a))
    .collect();
    want.insert(3, "# signal 14".into());
    let got: Vec<&str> = text(&insns).lines().skip(1).collect();
    assert_eq!(got, want);
    // The in-process events carry the parts of the split block.
    let (v, r) = visited(&bytes, &opts(Format::Insn));
    r.unwrap();
    assert_eq!(v, insn_lines(&insns));
}

#[test]
fn a_signal_before_a_witness_is_written_stands_after_the_predicate() {
    let db = signal_db();
    // (interrupted rip, witnesses after the handler, blocks): all in the
    // second iteration of main's loop.
    type Case<'a> = (u64, &'a [u32], &'a [(usize, usize, u32, u32)]);
    let cases: [Case; 3] = [
        // In the inline fall-through witness before it is reserved: b1
        // completed, b2 not started.
        (
            0x1c,
            &[1],
            &[
                full(0, 0),
                full(0, 1),
                full(0, 1),
                sig(14),
                full(1, 0),
                full(0, 2),
            ],
        ),
        // After the taken edge's witness is written (the stub's jump
        // back): the second b1 has not started.
        (
            0x2b,
            &[1],
            &[
                full(0, 0),
                full(0, 1),
                sig(14),
                full(1, 0),
                full(0, 1),
                full(0, 2),
            ],
        ),
        // In the taken edge's stub before its witness, where the same block
        // was entered once already: after b1, before the loop's edge.
        (
            0x26,
            &[0, 1],
            &[
                full(0, 0),
                full(0, 1),
                full(0, 1),
                sig(14),
                full(1, 0),
                full(0, 1),
                full(0, 2),
            ],
        ),
    ];
    for (rip, after, want) in cases {
        let mut s = main_start();
        witness(&mut s, 0);
        signal(&mut s, 14, LOAD_BASE + COPY + rip);
        enter(&mut s, 1);
        for &w in after {
            witness(&mut s, w);
        }
        expect(&db, &s, &parts(&db, want));
    }
}

#[test]
fn nested_handlers_untraced_interruptions_and_handlers_that_never_return() {
    let db = signal_db();
    // Before main: untraced code interrupted (a callback of nothing).
    let mut s = Vec::new();
    thread_rec(&mut s);
    signal(&mut s, 10, 0x7f00_0000_1234);
    enter(&mut s, 1);
    enter(&mut s, 0);
    witness(&mut s, 1);
    expect(
        &db,
        &s,
        &parts(
            &db,
            &[sig(10), full(1, 0), full(0, 0), full(0, 1), full(0, 2)],
        ),
    );
    // A handler interrupted by a second signal between its instructions,
    // after its last record: the second handler runs inside the first.
    let mut s = main_start();
    signal(&mut s, 14, LOAD_BASE + COPY + 0x18);
    enter(&mut s, 1);
    signal(&mut s, 10, LOAD_BASE + COPY + 0x113);
    enter(&mut s, 1);
    witness(&mut s, 1);
    expect(
        &db,
        &s,
        &parts(
            &db,
            &[
                full(0, 0),
                (0, 1, 0, 1),
                sig(14),
                (1, 0, 0, 1),
                sig(10),
                full(1, 0),
                (1, 0, 1, 2),
                (0, 1, 1, 2),
                full(0, 2),
            ],
        ),
    );
    // A handler that calls exit: the interrupted block never completes.
    // A fault (SIGSEGV) at that instruction lists it: it was started.
    for (signo, upto) in [(15, 1), (11, 2)] {
        let mut s = main_start();
        signal(&mut s, signo, LOAD_BASE + COPY + 0x18);
        enter(&mut s, 2);
        exit_rec(&mut s, 0);
        let (out, r) = hand(&db, &s);
        r.unwrap();
        assert_eq!(
            out,
            HDR.to_owned()
                + &parts(
                    &db,
                    &[full(0, 0), (0, 1, 0, upto), sig(signo as usize), full(2, 0)]
                ),
            "signal {signo}"
        );
    }
}

/// main: b0 calls external code (marker), b1 returns; h: a signal
/// handler. Both with signal maps of their copies.
fn main_calling_out_and_handler(a: &mut u64) -> (ProcDb, ProcDb) {
    let mut main = proc(
        a,
        "main",
        vec![call(CallTarget::External, true, true, false, None), None],
        vec![(0, 1, CallReturn, None), (1, 2, Return, None)],
    );
    main.sigmap = map(
        COPY,
        0x20,
        vec![
            (0, SigPoint::Outside),
            (0x10, insn(0, 0, 0, 2)),
            (0x15, insn(0, 1, 0, 2)),
        ],
    );
    let mut h = proc(a, "h", vec![None], vec![(0, 1, Return, None)]);
    h.sigmap = map(
        COPY + 0x100,
        0x15,
        vec![(0, SigPoint::Outside), (0x10, insn(1, 0, 0, 2))],
    );
    (main, h)
}

/// A second signal where the code the first one interrupted, back from
/// its handler through the restorer, waits for an external call. Before
/// format 1.4 a rip in untraced code could be glibc's restorer: a rip at
/// a traced procedure's entry (springboard or outside-entry stub) is not,
/// since the restorer returns into an instrumented copy; any other
/// untraced rip could be either, and is refused. From 1.4 on the runtime
/// never reports the restorer (it reports where the restorer returns), so
/// every untraced rip is the external call.
#[test]
fn a_signal_at_a_procedure_entry_after_a_handler_returned() {
    let mut a = LINK_BASE + 0x1000;
    let (main, h) = main_calling_out_and_handler(&mut a);
    // cb: called back by the external code.
    let mut cb = proc(&mut a, "cb", vec![None], vec![(0, 1, Return, None)]);
    cb.sigmap = map(
        COPY + 0x200,
        0x15,
        vec![(0, SigPoint::Outside), (0x10, insn(2, 0, 0, 2))],
    );
    let springboard = LOAD_BASE + cb.blocks[0].start;
    let db = db_of(vec![main, h, cb]);
    let stream = |second: u64| {
        let mut s = main_start();
        // Inside b0, before its second instruction.
        signal(&mut s, 14, LOAD_BASE + COPY + 0x13);
        enter(&mut s, 1);
        signal(&mut s, 14, second);
        enter(&mut s, 1);
        enter(&mut s, 2);
        ret(&mut s);
        s
    };
    let placed = parts(
        &db,
        &[
            (0, 0, 0, 1),
            sig(14),
            full(1, 0),
            (0, 0, 1, 2),
            sig(14),
            full(1, 0),
            full(2, 0),
            full(0, 1),
        ],
    );
    let libc = 0x7f00_0000_1234;
    for minor in [3, 4] {
        for rip in [springboard, LOAD_BASE + COPY + 0x204, libc] {
            let (out, r) = hand_of_minor(&db, &stream(rip), minor);
            if minor == 3 && rip == libc {
                let e = r.unwrap_err().to_string();
                assert!(
                    e.contains("which the thread entered at 2 places since its last record"),
                    "{e}"
                );
            } else {
                r.unwrap();
                assert_eq!(out, HDR.to_owned() + &placed, "1.{minor}, rip {rip:#x}");
            }
        }
    }
}

/// A rip in the runtime blob (below the copies, from `runtime_vaddr`) is
/// refused by name even where a rip in untraced code would be placed: here
/// the thread waits for an external call's RETURN, so untraced code is
/// running, and a handler entered from there stands at the call.
#[test]
fn a_rip_in_the_runtime_is_refused_by_name() {
    let mut a = LINK_BASE + 0x1000;
    let (main, h) = main_calling_out_and_handler(&mut a);
    let mut db = db_of(vec![main, h]);
    db.runtime_vaddr = COPY - 0x3000;
    let stream = |rip: u64| {
        let mut s = main_start();
        signal(&mut s, 14, rip);
        enter(&mut s, 1);
        ret(&mut s);
        s
    };
    let placed = parts(&db, &[full(0, 0), sig(14), full(1, 0), full(0, 1)]);
    for rip in [0x7f00_0000_1234, LOAD_BASE + COPY - 0x3000 - 1] {
        expect(&db, &stream(rip), &placed);
    }
    for off in [0, 0x897, 0x2fff] {
        let rip = LOAD_BASE + COPY - 0x3000 + off;
        let e = hand(&db, &stream(rip)).1.unwrap_err().to_string();
        assert!(
            e.contains(&format!("interrupted rip {rip:#x}"))
                && e.contains(&format!("is in the aetrace runtime (offset {off:#x})")),
            "{e}"
        );
    }
}

#[test]
fn signals_that_cannot_be_placed_are_errors() {
    let db = signal_db();
    // Inside a copied instruction.
    let mut s = main_start();
    signal(&mut s, 14, LOAD_BASE + COPY + 0x16);
    let e = hand(&db, &s).1.unwrap_err().to_string();
    assert!(
        e.contains("SIGNAL(14, interrupted rip 0x")
            && e.contains("stream byte offset 12 in procedure main after block 0x401010")
            && e.contains("inside the copy of an instruction of block 0x401010"),
        "{e}"
    );
    // Before b2, which the thread cannot have reached without witness 1.
    let mut s = main_start();
    signal(&mut s, 14, LOAD_BASE + COPY + 0x20);
    let e = hand(&db, &s).1.unwrap_err().to_string();
    assert!(e.contains("no witness-free path leads there"), "{e}");
    // In untraced code while the thread ran traced code only.
    let mut s = main_start();
    signal(&mut s, 14, 0x1234);
    let (out, r) = hand(&db, &s);
    let e = r.unwrap_err().to_string();
    assert_eq!(
        e,
        "thread 0: SIGNAL(14, interrupted rip 0x1234) at stream byte offset 12 in procedure main after block 0x401010: the rip is in untraced code, but the thread ran no untraced code since its last record"
    );
    // Nothing after the last record is certain.
    assert_eq!(out, HDR);
}

/// SIGNAL with the thread's transfer count (format 1.2, kind 15).
fn signal_at(out: &mut Vec<u8>, signo: u32, rip: u64, count: u32) {
    let mut p = signo.to_le_bytes().to_vec();
    p.extend_from_slice(&rip.to_le_bytes());
    p.extend_from_slice(&count.to_le_bytes());
    rec(out, 15, &p);
}

/// main: b0 and b1 call f, b2 returns; f: one block without a witness
/// (copy at COPY + 0x100, instructions at +0x10 and +0x13); h: a handler.
fn twice_db() -> ProgramDb {
    let mut a = LINK_BASE + 0x1000;
    let to_f = || call(CallTarget::Proc(1), false, true, false, None);
    let main = proc(
        &mut a,
        "main",
        vec![to_f(), to_f(), None],
        vec![
            (0, 1, CallReturn, None),
            (1, 2, CallReturn, None),
            (2, 3, Return, None),
        ],
    );
    let mut f = proc(&mut a, "f", vec![None], vec![(0, 1, Return, None)]);
    f.sigmap = map(
        COPY + 0x100,
        0x15,
        vec![(0, SigPoint::Outside), (0x10, insn(1, 0, 0, 2))],
    );
    let h = proc(&mut a, "h", vec![None], vec![(0, 1, Return, None)]);
    db_of(vec![main, f, h])
}

/// A signal in one of two runs of a procedure that writes nothing, read
/// after both: the transfer count (one per call) says which run; a count
/// no run has is an error.
#[test]
fn the_transfer_count_chooses_the_interrupted_run() {
    let db = twice_db();
    let rip = LOAD_BASE + COPY + 0x113; // before f's second instruction
    let stream = |count: Option<u32>| {
        let mut s = main_start();
        match count {
            Some(n) => signal_at(&mut s, 14, rip, n),
            None => signal(&mut s, 14, rip),
        }
        enter(&mut s, 2);
        s
    };
    let (f0, f1) = ((1, 0, 0, 1), (1, 0, 1, 2));
    let second = [
        full(0, 0),
        full(1, 0),
        full(0, 1),
        f0,
        sig(14),
        full(2, 0),
        f1,
        full(0, 2),
    ];
    expect(&db, &stream(Some(2)), &parts(&db, &second));
    let first = [
        full(0, 0),
        f0,
        sig(14),
        full(2, 0),
        f1,
        full(0, 1),
        full(1, 0),
        full(0, 2),
    ];
    expect(&db, &stream(Some(1)), &parts(&db, &first));
    let e = hand(&db, &stream(Some(3))).1.unwrap_err().to_string();
    assert!(
        e.contains("with transfer count 3, but the thread ran that block since its last record only with transfer counts [1, 2]"),
        "{e}"
    );
}

/// main: b0 calls an import without RETURN (`getpid`), b1 one with RETURN
/// (`kill`), b2 returns; h: a handler.
fn gaps_db() -> ProgramDb {
    let mut a = LINK_BASE + 0x1000;
    let main = proc(
        &mut a,
        "main",
        vec![
            call(CallTarget::External, false, true, false, None),
            call(CallTarget::External, true, true, false, None),
            None,
        ],
        vec![
            (0, 1, CallReturn, None),
            (1, 2, CallReturn, None),
            (2, 3, Return, None),
        ],
    );
    let h = proc(&mut a, "h", vec![None], vec![(0, 1, Return, None)]);
    db_of(vec![main, h])
}

/// A signal in untraced code while the thread waits for `kill`'s RETURN,
/// after `getpid`'s call wrote nothing: the count says whether it landed
/// in `getpid` (1) or `kill` (2).
#[test]
fn the_transfer_count_chooses_the_interrupted_gap() {
    let db = gaps_db();
    let stream = |count: Option<u32>| {
        let mut s = main_start();
        match count {
            Some(n) => signal_at(&mut s, 10, 0x7f00_0000_1234, n),
            None => signal(&mut s, 10, 0x7f00_0000_1234),
        }
        enter(&mut s, 1);
        ret(&mut s);
        s
    };
    expect(
        &db,
        &stream(Some(1)),
        &parts(
            &db,
            &[full(0, 0), sig(10), full(1, 0), full(0, 1), full(0, 2)],
        ),
    );
    expect(
        &db,
        &stream(Some(2)),
        &parts(
            &db,
            &[full(0, 0), full(0, 1), sig(10), full(1, 0), full(0, 2)],
        ),
    );
    let e = hand(&db, &stream(Some(0))).1.unwrap_err().to_string();
    assert!(
        e.contains("the rip is in untraced code with transfer count 0, but the thread entered untraced code since its last record only with transfer counts [1, 2]"),
        "{e}"
    );
    let e = hand(&db, &stream(None)).1.unwrap_err().to_string();
    assert!(e.contains("entered at 2 places"), "{e}");
}

/// main: b0 calls r, b1 returns. r: b0 recurses (witness 0, to b1's call)
/// or not (witness 1, to b3); b2 runs after the recursive call and
/// returns, b3 returns; its copy has b2's first instruction at COPY +
/// 0x140, the return's increment at 0x143, the `ret` at 0x14b. h: a
/// handler. Returns counted (a version 4 database) when `counted`.
fn unwind_db(counted: bool) -> ProgramDb {
    let mut a = LINK_BASE + 0x1000;
    let main = proc(
        &mut a,
        "main",
        vec![call(CallTarget::Proc(1), false, true, false, None), None],
        vec![(0, 1, CallReturn, None), (1, 2, Return, None)],
    );
    let mut r = proc(
        &mut a,
        "r",
        vec![
            None,
            call(CallTarget::Proc(1), false, true, false, None),
            None,
            None,
        ],
        vec![
            (0, 1, Taken, Some(0)),
            (0, 3, FallThrough, Some(1)),
            (1, 2, CallReturn, None),
            (2, 4, Return, None),
            (3, 4, Return, None),
        ],
    );
    r.sigmap = map(
        COPY + 0x100,
        0x50,
        vec![
            (0, SigPoint::Outside),
            (0x10, insn(1, 0, 0, 2)),
            (0x40, insn(1, 2, 0, 1)),
            (0x43, insn(1, 2, 1, 0)),
            (0x4b, insn(1, 2, 1, 1)),
        ],
    );
    let h = proc(&mut a, "h", vec![None], vec![(0, 1, Return, None)]);
    let mut db = db_of(vec![main, r, h]);
    db.counts_returns = counted;
    db
}

/// A signal in the return chain of a recursion three frames deep, which
/// writes nothing after its last witness: r's b2 runs in two frames, with
/// transfer counts 4 and 5 once returns count. Before the `ret` (its
/// increment not run: the rip in the instrumentation) the count is the
/// run's own, at the `ret`'s copy one more; so each (rip, count) names one
/// run. Without counted returns both runs have count 3: refused.
#[test]
fn counted_returns_choose_the_frame_of_an_unwinding_recursion() {
    let stream = |off: u64, count: u32| {
        let mut s = main_start();
        for w in [0, 0, 1] {
            witness(&mut s, w);
        }
        signal_at(&mut s, 14, LOAD_BASE + COPY + 0x100 + off, count);
        enter(&mut s, 2);
        s
    };
    let db = unwind_db(true);
    let down = [
        full(0, 0),
        full(1, 0),
        full(1, 1),
        full(1, 0),
        full(1, 1),
        full(1, 0),
        full(1, 3),
    ];
    let (head, tail) = ((1, 2, 0, 1), (1, 2, 1, 2));
    let inner = [head, sig(14), full(2, 0), tail, full(1, 2), full(0, 1)];
    let outer = [full(1, 2), head, sig(14), full(2, 0), tail, full(0, 1)];
    for (off, count, after) in [
        (0x43, 4, &inner),
        (0x4b, 5, &inner),
        (0x43, 5, &outer),
        (0x4b, 6, &outer),
    ] {
        let steps: Vec<_> = down.iter().chain(after.iter()).copied().collect();
        expect(&db, &stream(off, count), &parts(&db, &steps));
    }
    let e = hand(&db, &stream(0x43, 6)).1.unwrap_err().to_string();
    assert!(e.contains("only with transfer counts [4, 5]"), "{e}");
    let old = unwind_db(false);
    let e = hand(&old, &stream(0x43, 3)).1.unwrap_err().to_string();
    assert!(e.contains("ran 2 times since its last record"), "{e}");
}

// ---------------------------------------------------------------- the state index

/// A random case's trace (1-3 threads, complete or cut executions) and
/// its output at `-j 1`.
fn index_case(seed: u64, nthreads: usize, chunk: usize, cut: bool) -> (Vec<u8>, Vec<u8>, String) {
    let s = random_case(
        seed,
        1 + (seed % 5) as usize,
        1 + (seed % 37) as usize,
        seed % 2 == 0,
    );
    let mut rng = Rng::new(seed ^ 0x1de);
    let ex = testgen::Executor::new(&s.prog);
    let streams: Vec<Vec<u8>> = (0..nthreads)
        .map(|_| {
            let budget = 1 + rng.below(400);
            s.stream(&ex.run(&mut rng, budget, cut))
        })
        .collect();
    let bytes = trace_bytes(&s.db, &streams, chunk);
    let (out, r) = run(&bytes, &opts(Format::Insn));
    (
        bytes,
        out,
        r.err().map(|e| e.to_string()).unwrap_or_default(),
    )
}

/// [`run`] into a file that holds 3 bytes before (the output's file for
/// workers writing at offsets): the bytes after them, and the result. The
/// file is left positioned after the output.
fn run_into_file(bytes: &[u8], opts: &Options) -> (Vec<u8>, Result<(), Error>) {
    use std::io::{Read, Seek, Write};
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let path = std::env::temp_dir().join(format!("aetrace-regen-at-{}-{n}", std::process::id()));
    let mut file = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    file.write_all(b"xyz").unwrap();
    let t = Trace::parse(bytes).unwrap();
    let r = crate::output::regen_trace_ahead(
        &t,
        opts,
        &mut &file,
        crate::output::AHEAD_BYTES,
        None,
        Some(&file),
    );
    let end = file.stream_position().unwrap();
    let mut all = Vec::new();
    file.rewind().unwrap();
    file.read_to_end(&mut all).unwrap();
    assert_eq!(
        end,
        all.len() as u64,
        "the file is left at the output's end"
    );
    assert_eq!(&all[..3], b"xyz");
    (all.split_off(3), r.map(|_| ()))
}

/// `opts` with the state index of `bytes` built every `interval` bytes.
fn with_index(bytes: &[u8], interval: u64, o: Options) -> Options {
    let t = Trace::parse(bytes).unwrap();
    let index = crate::index::StateIndex::build(&t, interval).unwrap();
    Options {
        index: Some(std::sync::Arc::new(index)),
        ..o
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Pieces started from a state index built at any interval, cut at any
    /// piece size, write the bytes `-j 1` writes, error included (cut
    /// executions end in `Truncated`); `--count` from pieces counts what
    /// the whole walk counts; the index survives its file encoding.
    #[test]
    fn an_index_at_any_interval_gives_identical_output(
        seed in any::<u64>(),
        nthreads in 1usize..4,
        chunk in 1usize..48,
        interval in 1u64..40,
        piece in 1u64..30,
        cut in any::<bool>(),
    ) {
        let (bytes, want, want_err) = index_case(seed, nthreads, chunk, cut);
        let o = with_index(&bytes, interval, opts(Format::Insn));
        let index = o.index.clone().unwrap();
        let file = index.encode();
        prop_assert_eq!(&crate::index::StateIndex::decode(&file).unwrap(), &*index);
        for jobs in [1, 2, 3] {
            let (out, r) = run(&bytes, &Options { jobs, piece_bytes: piece, ..o.clone() });
            prop_assert_eq!(text(&out), text(&want));
            prop_assert_eq!(r.err().map(|e| e.to_string()).unwrap_or_default(), want_err.clone());
        }
        let count = |o: &Options| run(&bytes, &Options { count: true, jobs: 2, piece_bytes: piece, ..o.clone() });
        let (c1, r1) = count(&opts(Format::Insn));
        let (c2, r2) = count(&o);
        prop_assert_eq!(text(&c2), text(&c1));
        prop_assert_eq!(r2.err().map(|e| e.to_string()), r1.err().map(|e| e.to_string()));
    }

    /// `bin` or `block` into a file, whose pieces the workers write at
    /// the offsets the index's counts give, holds the bytes `-j 1` writes
    /// after what the file held before, error included, and is left
    /// positioned after them; with an entry's count changed, the
    /// regeneration stops with an index error after a prefix of them.
    #[test]
    fn pieces_written_at_their_offsets_give_identical_output(
        seed in any::<u64>(),
        nthreads in 1usize..3,
        chunk in 1usize..48,
        interval in 1u64..40,
        piece in 1u64..30,
        cut in any::<bool>(),
        block in any::<bool>(),
        damage in any::<prop::sample::Index>(),
    ) {
        let (bytes, _, _) = index_case(seed, nthreads, chunk, cut);
        let format = if block { Format::Block } else { Format::Bin };
        let (want, want_err) = run(&bytes, &opts(format));
        let want_err = want_err.err().map(|e| e.to_string());
        let o = with_index(&bytes, interval, opts(format));
        for jobs in [2, 3] {
            let (got, r) = run_into_file(&bytes, &Options { jobs, piece_bytes: piece, ..o.clone() });
            prop_assert!(got == want, "{} bytes against {}", got.len(), want.len());
            prop_assert_eq!(r.err().map(|e| e.to_string()), want_err.clone());
        }
        let mut index = (**o.index.as_ref().unwrap()).clone();
        let mut entries: Vec<_> = index.threads.values_mut().flatten().collect();
        prop_assume!(!entries.is_empty());
        let n = damage.index(entries.len());
        let e = &mut entries[n];
        let count = if block { &mut e.block_bytes } else { &mut e.instructions };
        *count = count.map(|c| c + 1);
        let damaged = Options { jobs: 2, piece_bytes: 1, index: Some(std::sync::Arc::new(index)), ..o };
        let (got, r) = run_into_file(&bytes, &damaged);
        prop_assert!(want.starts_with(&got), "{} bytes, not a prefix", got.len());
        if let Err(e) = r {
            prop_assert!(
                matches!(e, Error::Index(_)) || Some(e.to_string()) == want_err,
                "{}", e
            );
        }
    }

    /// A regeneration that keeps states as it goes (the first one of a
    /// trace, which writes its index) keeps the index `aetrace index`
    /// builds, at any interval, and writes the bytes, error included, of
    /// one that keeps none; one that fails returns no index. With two
    /// jobs its streams may be cut into pieces (then it keeps none).
    /// Instructions are counted by `bin`'s walk (a record each), `block`
    /// bytes by `block`'s, neither by `insn`'s.
    #[test]
    fn a_regeneration_keeps_the_index_aetrace_index_builds(
        seed in any::<u64>(),
        nthreads in 1usize..4,
        chunk in 1usize..48,
        interval in 1u64..40,
        cut in any::<bool>(),
        jobs in 1usize..3,
        format in prop::sample::select(vec![Format::Insn, Format::Bin, Format::Block]),
    ) {
        let (bytes, _, want_err) = index_case(seed, nthreads, chunk, cut);
        let t = Trace::parse(&bytes).unwrap();
        let o = Options { jobs, ..opts(format) };
        let want = run(&bytes, &opts(format)).0;
        let mut out = Vec::new();
        let r = crate::output::regen_trace_ahead(&t, &o, &mut out, crate::output::AHEAD_BYTES, Some(interval), None);
        prop_assert!(out == want, "{} bytes against {}", out.len(), want.len());
        match r {
            Ok((_, kept)) => {
                prop_assert!(want_err.is_empty());
                let mut built = crate::index::StateIndex::build(&t, interval).unwrap();
                for e in built.threads.values_mut().flatten() {
                    e.instructions = e.instructions.filter(|_| format == Format::Bin);
                    e.block_bytes = e.block_bytes.filter(|_| format == Format::Block);
                }
                if jobs == 1 || kept.is_some() {
                    prop_assert_eq!(kept, Some(built));
                }
            }
            Err(e) => prop_assert_eq!(e.to_string(), want_err),
        }
    }

    /// An index file with any byte changed is refused by its checksum; with
    /// the checksum made to fit, it is refused as malformed, or each piece
    /// finds that it does not pause in the state the next entry holds: the
    /// regeneration stops with an index error after output that is a
    /// prefix of the true one, or (an unused entry) writes it all. Never
    /// another byte.
    #[test]
    fn a_damaged_index_is_refused_and_never_trusted(
        seed in any::<u64>(),
        interval in 1u64..12,
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let (bytes, want, want_err) = index_case(seed, 2, 16, false);
        prop_assume!(want_err.is_empty());
        let index = with_index(&bytes, interval, opts(Format::Insn)).index.unwrap();
        let mut file = index.encode();
        let n = file.len();
        // The header's fingerprint and the entries, not the magic or version.
        let i = 16 + at.index(n - 20);
        file[i] ^= flip;
        let refused = crate::index::StateIndex::decode(&file).unwrap_err().to_string();
        prop_assert!(refused.contains("bad checksum"), "{}", refused);
        let crc = crc32fast::hash(&file[..n - 4]).to_le_bytes();
        file[n - 4..].copy_from_slice(&crc);
        let Ok(damaged) = crate::index::StateIndex::decode(&file) else {
            return Ok(());
        };
        let o = Options {
            index: Some(std::sync::Arc::new(damaged)),
            ..opts(Format::Insn)
        };
        for jobs in [2, 3] {
            let (out, r) = run(&bytes, &Options { jobs, piece_bytes: 1, ..o.clone() });
            match r {
                Ok(()) => prop_assert_eq!(text(&out), text(&want)),
                Err(e) => {
                    prop_assert!(matches!(e, Error::Index(_)), "{}", e);
                    prop_assert!(want.starts_with(&out));
                }
            }
        }
    }
}

/// An index is another trace's when any section differs: refused by name.
#[test]
fn an_index_of_another_trace_is_refused() {
    let (a, ..) = index_case(7, 1, 16, false);
    let (b, ..) = index_case(8, 1, 16, false);
    let o = with_index(&a, 4, opts(Format::Insn));
    let (out, r) = run(&b, &Options { jobs: 2, ..o });
    let e = r.unwrap_err().to_string();
    assert!(e.contains("state index: built for another trace"), "{e}");
    assert!(out.is_empty());
}

/// An entry whose state is another entry's block (a well-formed state the
/// walk does not reach there): the piece before it does not pause in it,
/// so the regeneration stops with an index error before the piece
/// started from it writes anything.
#[test]
fn an_index_entry_in_another_state_stops_before_its_piece() {
    let mut tried = 0;
    for seed in 0..200u64 {
        let (bytes, want, want_err) = index_case(seed, 1, 16, false);
        if !want_err.is_empty() {
            continue;
        }
        let o = with_index(&bytes, 1, opts(Format::Insn));
        let mut index = (*o.index.unwrap()).clone();
        let entries = index.threads.get_mut(&0).unwrap();
        // The current block: module and block at state bytes 12..20.
        let cur = |e: &crate::index::Entry| e.state[12..20].to_vec();
        let Some(k) = (1..entries.len()).find(|&k| cur(&entries[k]) != cur(&entries[0])) else {
            continue;
        };
        let other = cur(&entries[0]);
        entries[k].state[12..20].copy_from_slice(&other);
        let o = Options {
            index: Some(std::sync::Arc::new(index)),
            jobs: 2,
            piece_bytes: 1,
            ..opts(Format::Insn)
        };
        let (out, r) = run(&bytes, &o);
        let e = r.unwrap_err().to_string();
        assert!(e.contains("in another state than the index's entry"), "{e}");
        assert!(want.starts_with(&out) && out.len() < want.len());
        tried += 1;
    }
    assert!(
        tried > 20,
        "{tried} cases with two entries at different blocks"
    );
}

/// Cases `an_index_at_any_interval_gives_identical_output` found: pieces
/// of one stream byte from an index every 13 or 15 bytes, in chunks of 7
/// or 31 bytes. A piece that read one chunk more than the walk that built
/// the index paused in "another state" (the state held how many chunks
/// were read), and `-j 2` stopped with an index error after 9 of 40
/// instructions.
#[test]
fn pieces_pause_where_the_index_did_whatever_they_read_ahead() {
    for (seed, chunk, interval) in [(4573853664269315326, 7, 13), (9671981814302924207, 31, 15)] {
        let (bytes, want, want_err) = index_case(seed, 1, chunk, false);
        let o = with_index(&bytes, interval, opts(Format::Insn));
        for jobs in [1, 2, 3] {
            let o = Options {
                jobs,
                piece_bytes: 1,
                ..o.clone()
            };
            let (out, r) = run(&bytes, &o);
            assert_eq!(text(&out), text(&want), "seed {seed}, jobs {jobs}");
            assert_eq!(r.err().map(|e| e.to_string()).unwrap_or_default(), want_err);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// VALUE records before witnesses (a data trace's: a block writes its
    /// values before the witness of its exit) change no count: `--count`,
    /// at `-j 1` and in pieces, equals the count of the same execution's
    /// stream without them and the block-by-block walk's. It fails when
    /// counting passes values over without checking what follows them.
    #[test]
    fn values_before_witnesses_change_no_count(
        seed in any::<u64>(),
        nprocs in 1usize..6,
        max_blocks in 1usize..40,
        structured in any::<bool>(),
        small_chunks in any::<bool>(),
        piece in 1u64..24,
    ) {
        // Values are passed over where they and the witness after them
        // are buffered, which small chunks seldom are.
        let chunk = if small_chunks { 1 + seed as usize % 64 } else { 1 << 16 };
        let s = random_case(seed, nprocs, max_blocks, structured);
        let mut rng = Rng::new(seed ^ 0x7a1e);
        let budget = 1 + rng.below(300);
        let e = testgen::Executor::new(&s.prog).run(&mut rng, budget, false);
        let plain = trace_bytes(&s.db, &[s.stream(&e)], chunk);
        let with_values = s.stream_with(&e, |out| {
            for _ in 0..rng.below(3) {
                crate::testkit::rec(out, crate::stream::kind::VALUE, &rng.next_u64().to_le_bytes());
            }
        });
        let valued = trace_bytes(&s.db, &[with_values], chunk);
        let count = Options { count: true, ..opts(Format::Insn) };
        let (want, rw) = run(&plain, &count);
        prop_assert!(rw.is_ok());
        for o in [count.clone(), Options { jobs: 3, piece_bytes: piece, ..count.clone() }] {
            let (got, r) = run(&valued, &o);
            prop_assert!(r.is_ok(), "{}", r.unwrap_err());
            prop_assert_eq!(text(&got), text(&want));
        }
        let (walked, rk) = run_walked(&valued, &count);
        prop_assert!(rk.is_ok());
        prop_assert_eq!(text(&walked), text(&want));
    }
}

/// A random data stream of one-byte witnesses, VALUE, ENTER,
/// ENTER_SAME (only where a VALUE since the start or the last SIGNAL
/// gives it an `rsp`) and SIGNAL records, cut into stored chunks at
/// random places (records straddle them), and its raw bytes' chunk
/// references.
fn data_stream(rng: &mut Rng) -> (Vec<Vec<u8>>, Vec<aetrace_format::ChunkRef>) {
    let (mut raw, mut last) = (Vec::new(), false);
    for _ in 0..rng.below(3000) {
        let k = rng.below(21);
        let v = rng.next_u64();
        match k {
            0..=9 => raw.push(1 + rng.below(0xFE) as u8),
            10..=16 => {
                raw.extend([&[0xFF, 18][..], &v.to_le_bytes()].concat());
                last = true;
            }
            17..=18 => raw.extend([&[0xFF, 1][..], &(v as u32).to_le_bytes()].concat()),
            19 if last => raw.extend([&[0xFF, 21][..], &(v as u32).to_le_bytes()].concat()),
            _ => {
                raw.extend([&[0xFF, 15][..], &[7; 16][..]].concat());
                last = false;
            }
        }
    }
    cut_into_chunks(rng, &raw)
}

/// `raw` cut into stored chunks at random places, and their references.
fn cut_into_chunks(rng: &mut Rng, raw: &[u8]) -> (Vec<Vec<u8>>, Vec<aetrace_format::ChunkRef>) {
    let (mut chunks, mut refs, mut at) = (Vec::new(), Vec::new(), 0);
    while at < raw.len() {
        let end = (at + 1 + rng.below(300)).min(raw.len());
        chunks.push(raw[at..end].to_vec());
        refs.push(aetrace_format::ChunkRef {
            thread: ThreadId(0),
            seq: refs.len() as u64,
            codec: aetrace_format::section::Codec::Stored,
            raw_len: (end - at) as u64,
            witnesses: 0,
            section_offset: 0,
            data: 0..0,
        });
        at = end;
    }
    (chunks, refs)
}

/// ENTER_SAME (format 1.21) reads as ENTER followed by the VALUE of the
/// last `rsp` recorded, which a handler (SIGNAL) starts without and gives
/// back at its SIGRETURN; a handler that never returns leaves its own.
/// Whatever the chunks' cuts.
#[test]
fn enter_same_repeats_the_last_rsp_and_handlers_keep_theirs() {
    let rec = |kind: u8, payload: &[u8]| [&[0xFF, kind][..], payload].concat();
    let enter = |same: bool, p: u32| rec(if same { 21 } else { 1 }, &p.to_le_bytes());
    let value = |v: u64| rec(18, &v.to_le_bytes());
    let signal = rec(15, &[7; 16]);
    let sigreturn = rec(20, &[0; 8]);
    let (a, b, c, d) = (
        0x7ff0_0000_1000,
        0x7ff0_0000_0f00,
        0x7ff0_0000_0800,
        0x7ff0_0000_0700,
    );
    let raw = [
        enter(false, 1),
        value(a),
        vec![3, 4],
        enter(true, 1),
        enter(false, 2),
        value(b),
        enter(true, 1),
        signal.clone(),
        enter(false, 3),
        value(c),
        vec![5],
        enter(true, 3),
        sigreturn,
        enter(true, 1),
        signal.clone(),
        enter(false, 3),
        value(d),
        // No SIGRETURN: the handler left by `siglongjmp`.
        enter(true, 1),
    ]
    .concat();
    let want = crate::DataValues {
        values: vec![a, a, b, b, c, c, b, d, d],
        entered: [1, 1, 2, 1, 3, 3, 1, 3, 1]
            .into_iter()
            .enumerate()
            .collect(),
    };
    for seed in 0..50 {
        let (bytes, refs) = cut_into_chunks(&mut Rng::new(seed), &raw);
        let chunks = (refs.iter().zip(&bytes))
            .map(|(meta, data)| aetrace_format::Chunk { meta, data })
            .collect();
        let mut c = crate::DataCursor {
            stream: crate::stream::Stream::new(ThreadId(0), chunks),
            given: 0,
            peeked: None,
        };
        let mut got = crate::DataValues::default();
        while c.append(usize::MAX, &mut got).unwrap() > 0 || c.signal().unwrap().is_some() {}
        assert_eq!(got, want, "seed {seed}");
        assert_eq!(c.stream.entries_same(), 5, "seed {seed}");
    }
    // A handler's ENTER_SAME before any VALUE of its own: no `rsp` to repeat.
    let raw = [enter(false, 1), value(a), signal, enter(true, 3)].concat();
    let (bytes, refs) = cut_into_chunks(&mut Rng::new(1), &raw);
    let chunks = (refs.iter().zip(&bytes))
        .map(|(meta, data)| aetrace_format::Chunk { meta, data })
        .collect();
    let c = crate::DataCursor {
        stream: crate::stream::Stream::new(ThreadId(0), chunks),
        given: 0,
        peeked: None,
    };
    let e = c.count().unwrap_err().to_string();
    assert!(
        e.contains("ENTER_SAME with no entry's rsp before it"),
        "{e}"
    );
}

/// The value cursor's windows (`DataCursor::append` with its scan of
/// buffered VALUE records, `DataCursor::signal`) give the values, the
/// ENTER marks and the SIGNAL records that reading item by item gives.
#[test]
fn value_cursor_windows_equal_the_items() {
    for seed in 0..200 {
        let mut rng = Rng::new(seed);
        let (bytes, refs) = data_stream(&mut rng);
        let cursor = || crate::DataCursor {
            stream: crate::stream::Stream::new(
                ThreadId(0),
                (refs.iter().zip(&bytes))
                    .map(|(meta, data)| aetrace_format::Chunk { meta, data })
                    .collect(),
            ),
            given: 0,
            peeked: None,
        };
        let (mut want, mut want_sigs) = (crate::DataValues::default(), Vec::new());
        cursor()
            .rest(&mut |item| match item {
                crate::DataItem::Value(v, enter) => {
                    if let Some(raw) = enter {
                        want.entered.push((want.values.len(), raw));
                    }
                    want.values.push(v);
                }
                crate::DataItem::Signal(s) => want_sigs.push(s),
            })
            .unwrap();
        let (mut c, mut got, mut sigs) = (cursor(), crate::DataValues::default(), Vec::new());
        loop {
            let n = c.append(1 + rng.below(40), &mut got).unwrap();
            match c.signal().unwrap() {
                Some(s) => sigs.push(s),
                None if n == 0 => break,
                None => {}
            }
        }
        assert_eq!((got, sigs), (want, want_sigs), "seed {seed}");
    }
}

/// The machine's read points in a data trace (`Stream::skip_values_to_witness`,
/// `Stream::second_is_witness_past_values`, each one scan of the buffer)
/// against reading item by item (`Stream::peek`, which skips VALUE
/// records): a witness either gives is the one the items give, and the
/// values skipped are the ones `peek` skips (a SIGNAL or ENTER is not
/// passed over: the item after it is not a witness then).
#[test]
fn witnesses_past_values_equal_the_items() {
    use crate::stream::{Item, Stream};
    let (mut firsts, mut seconds) = (0, 0);
    for seed in 0..200 {
        let mut rng = Rng::new(seed);
        let (bytes, refs) = data_stream(&mut rng);
        let chunks = (refs.iter().zip(&bytes))
            .map(|(meta, data)| aetrace_format::Chunk { meta, data })
            .collect();
        let mut s = Stream::new(ThreadId(0), chunks);
        loop {
            let got = s.skip_values_to_witness();
            let (item, offset, len) = s.peek().unwrap();
            if let Some(w) = got {
                assert_eq!(
                    (item, offset),
                    (Item::Witness(w), s.offset()),
                    "seed {seed}"
                );
                firsts += 1;
            }
            // Asked, as the machine asks it, only with a witness next.
            let second = match item {
                Item::End => break,
                Item::Witness(_) => s.second_is_witness_past_values(),
                _ => false,
            };
            s.advance(len);
            if second {
                let (after, ..) = s.peek().unwrap();
                assert!(matches!(after, Item::Witness(_)), "seed {seed}: {after:?}");
                seconds += 1;
            }
        }
    }
    assert!(firsts > 1000 && seconds > 1000, "{firsts} {seconds}");
}
