//! Packet-level tests of the stub on synthetic traces (`aetrace_regen`'s
//! testkit: random programs and executions, whose instruction addresses
//! come from the execution, not from the regenerator): gdb's packets in,
//! the stub's replies checked, over an in-memory connection.

use crate::untraced::is_untraced;
use crate::{serve, Options, Pipe};
use aetrace_format::Trace;
use aetrace_graph::testgen::{self, Rng};
use aetrace_regen::testkit::{random_case, trace_bytes};

/// A trace of one random execution of at most `budget` steps, and its
/// instruction addresses.
fn synthetic(seed: u64, budget: usize) -> (Vec<u8>, Vec<u64>) {
    let (bytes, mut addrs) = synthetic_threads(seed, budget, 1);
    (bytes, addrs.remove(0))
}

/// A trace of `n` threads of one process, each a random execution of the
/// same program, and each thread's instruction addresses.
fn synthetic_threads(seed: u64, budget: usize, n: u64) -> (Vec<u8>, Vec<Vec<u64>>) {
    let s = random_case(seed, 4, 20, true);
    let execs: Vec<_> = (0..n)
        .map(|i| {
            let mut rng = Rng::new(seed ^ 0x5eed ^ (i << 32));
            testgen::Executor::new(&s.prog).run(&mut rng, budget, false)
        })
        .collect();
    let streams: Vec<Vec<u8>> = execs.iter().map(|e| s.stream(e)).collect();
    let bytes = trace_bytes(&s.db, &streams, 4096);
    let addrs = execs
        .iter()
        .map(|e| {
            let text = s.expected_insns(e);
            text.lines()
                .map(|l| u64::from_str_radix(l, 16).unwrap())
                .collect()
        })
        .collect();
    (bytes, addrs)
}

fn packet(body: &str) -> String {
    let sum = body.bytes().fold(0u8, |a, b| a.wrapping_add(b));
    format!("${body}#{sum:02x}")
}

/// `monitor CMD` as gdb sends it.
fn monitor(cmd: &str) -> String {
    let hex: String = cmd.bytes().map(|b| format!("{b:02x}")).collect();
    format!("qRcmd,{hex}")
}

/// Instructions per timeline interval in these tests: small, so that
/// short executions cross many snapshots.
const INTERVAL: usize = 7;

/// Sends `packets` (after gdb's capabilities) and returns the replies, one
/// per packet sent (console output of `monitor` folded into its reply).
fn session(trace: &[u8], at: u64, packets: &[String]) -> Vec<String> {
    session_with(trace, at, INTERVAL, packets)
}

/// [`session`] with `interval` instructions per timeline interval.
fn session_with(trace: &[u8], at: u64, interval: usize, packets: &[String]) -> Vec<String> {
    let opts = Options {
        thread: None,
        at,
        interval,
        warn: None,
        rebuild: None,
        walk_back: false,
    };
    let t = Trace::parse(trace).unwrap();
    let mut input = packet("qSupported:swbreak+;hwbreak+");
    for p in packets {
        input.push('+');
        input.push_str(&packet(p));
    }
    input.push('+');
    let mut out = Vec::new();
    let conn = Pipe::new(input.as_bytes(), &mut out);
    serve(&t, opts, conn).unwrap();
    let text = String::from_utf8(out).unwrap();
    let mut replies: Vec<String> = Vec::new();
    let mut console = String::new();
    for p in text.split('$').skip(1) {
        let body = &unrle(&p[..p.rfind('#').unwrap()]);
        // `O` packets carry monitor output before the final reply.
        if body.starts_with('O') && body.len() > 1 && body != "OK" {
            console.push_str(&String::from_utf8(unhex(&body[1..])).unwrap());
            continue;
        }
        replies.push(format!("{console}{body}"));
        console.clear();
    }
    replies.remove(0); // qSupported
    replies
}

/// Expands the protocol's run-length encoding (`c*N`: `N - 29` more `c`).
fn unrle(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '*' {
            let last = out.chars().last().unwrap();
            let n = chars.next().unwrap() as usize - 29;
            out.extend(std::iter::repeat(last).take(n));
        } else {
            out.push(c);
        }
    }
    out
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The rip of a `g` reply, checking that every other register is `xx`.
fn rip_of(g: &str) -> u64 {
    let (before, rest) = g.split_at(16 * 8 * 2);
    let (rip, after) = rest.split_at(16);
    assert!(before.bytes().all(|b| b == b'x'), "{g}");
    assert!(after.bytes().all(|b| b == b'x'), "{g}");
    assert_eq!(after.len(), 2 * (4 + 6 * 4 + 8 * 10 + 8 * 4 + 16 * 16 + 4));
    u64::from_le_bytes(unhex(rip).try_into().unwrap())
}

#[test]
fn registers_are_unavailable_but_rip() {
    let (trace, addrs) = synthetic(1, 50);
    let r = session(&trace, 0, &["g".into(), "vCont;s:1".into(), "g".into()]);
    assert_eq!(rip_of(&r[0]), addrs[0]);
    assert!(r[1].starts_with("T05thread:"), "{}", r[1]);
    assert_eq!(rip_of(&r[2]), addrs[1]);
}

#[test]
fn stepping_both_ways_follows_the_execution() {
    for seed in 0..8 {
        let (trace, addrs) = synthetic(seed, 40);
        let n = addrs.len();
        let mut ps = Vec::new();
        for _ in 1..n {
            ps.push("vCont;s:1".to_owned());
            ps.push("g".to_owned());
        }
        // One step past the last instruction (into untraced code), one
        // more (the end of the replay log: the position stays), then all
        // the way back and one more.
        ps.extend(["vCont;s:1", "g", "vCont;s:1"].map(String::from));
        for _ in 0..n {
            ps.push("bs".into());
            ps.push("g".into());
        }
        ps.push("bs".into());
        let r = session(&trace, 0, &ps);
        let mut it = r.iter();
        for &want in &addrs[1..] {
            assert!(it.next().unwrap().starts_with("T05thread:"));
            assert_eq!(rip_of(it.next().unwrap()), want, "seed {seed}");
        }
        assert!(it.next().unwrap().starts_with("T05thread:"));
        assert!(is_untraced(rip_of(it.next().unwrap())), "seed {seed}");
        let end = it.next().unwrap();
        assert!(end.starts_with("T05thread:01;") && end.contains("replaylog:end"));
        for &want in addrs.iter().rev() {
            it.next().unwrap();
            assert_eq!(rip_of(it.next().unwrap()), want, "seed {seed}");
        }
        assert!(it.next().unwrap().contains("replaylog:begin"));
    }
}

#[test]
fn breakpoint_on_the_first_instruction_both_ways() {
    // Long enough to span several timeline intervals.
    let (trace, addrs) = (0..200)
        .map(|seed| synthetic(seed, 400))
        .find(|(_, a)| a.len() > 8 * INTERVAL && a[1..].contains(&a[0]))
        .expect("a long random execution that comes back to its start");
    let first = addrs[0];
    let hits: Vec<usize> = (1..addrs.len()).filter(|&i| addrs[i] == first).collect();
    let last = addrs.len() as u64 - 1;
    let mut ps = vec![format!("Z0,{first:x},1")];
    for _ in &hits {
        ps.push("vCont;c".into());
        ps.push(monitor("when"));
    }
    ps.push("vCont;c".into());
    ps.push(monitor("when"));
    // Backwards from past the end: the same hits in reverse, then
    // position 0, the first instruction itself, a breakpoint too.
    let back: Vec<usize> = hits.iter().rev().chain([&0]).copied().collect();
    for _ in 0..=back.len() {
        ps.push("bc".into());
        ps.push(monitor("when"));
    }
    let r = session(&trace, 0, &ps);
    assert_eq!(r[0], "OK");
    let mut it = r[1..].iter();
    let when = |s: &String| -> u64 { s.split_whitespace().nth(1).unwrap().parse().unwrap() };
    for &h in &hits {
        assert!(it.next().unwrap().contains("swbreak"));
        assert_eq!(when(it.next().unwrap()), h as u64);
    }
    assert!(it.next().unwrap().contains("replaylog:end"));
    assert_eq!(when(it.next().unwrap()), last + 1);
    for &h in &back {
        assert!(it.next().unwrap().contains("swbreak"));
        assert_eq!(when(it.next().unwrap()), h as u64);
    }
    assert!(it.next().unwrap().contains("replaylog:begin"));
    assert_eq!(when(it.next().unwrap()), 0);
}

#[test]
fn seek_and_start_position() {
    let (trace, addrs) = synthetic(3, 60);
    let k = addrs.len() as u64 / 2;
    let r = session(&trace, k, &["g".into(), monitor("seek 1"), "g".into()]);
    assert_eq!(rip_of(&r[0]), addrs[k as usize]);
    assert!(r[1].starts_with("at instruction 1"), "{}", r[1]);
    assert_eq!(rip_of(&r[2]), addrs[1]);
    let far = format!("seek {}", addrs.len());
    let r = session(&trace, 0, &[monitor(&far)]);
    assert!(r[0].starts_with("no instruction"), "{}", r[0]);
}

/// `monitor when`'s block number, from the per-interval index over many
/// small intervals, equals the count over one interval holding the whole
/// execution (a plain scan from the first instruction), at every position
/// and after seeks backwards.
#[test]
fn block_numbers_by_index_equal_a_scan() {
    let (trace, addrs) = (0..200)
        .map(|seed| synthetic(seed, 400))
        .find(|(_, a)| a.len() > 8 * INTERVAL)
        .expect("a long random execution");
    let mut order: Vec<usize> = (0..addrs.len()).rev().collect();
    order.extend((0..addrs.len()).step_by(5));
    let ps: Vec<String> = order
        .iter()
        .flat_map(|p| [monitor(&format!("seek {p}")), monitor("when")])
        .collect();
    let indexed = session_with(&trace, 0, INTERVAL, &ps);
    let scanned = session_with(&trace, 0, 1 << 20, &ps);
    assert_eq!(indexed, scanned);
    assert!(
        indexed.iter().any(|r| r.contains(" block 5")),
        "{indexed:?}"
    );
}

/// Thread ids: `qfThreadInfo` lists gdb threads 1 and 2 (the trace's
/// threads 0 and 1, `qThreadExtraInfo` says which, with pid and tid);
/// `Hg` selects whose registers `g` reads; `vCont;s:2` steps thread 2
/// alone and its stop names it; `Hc2` makes `bc` move thread 2 even after
/// `Hg1` (gdb names the thread of a reverse command with `Hc`), and after
/// `Hc0` (any thread) `bs` moves the thread last read.
#[test]
fn thread_ids() {
    let (trace, addrs) = (0..50)
        .map(|seed| synthetic_threads(seed, 40, 2))
        .find(|(_, a)| a.iter().all(|t| t.len() > 3) && a[0][..3] != a[1][..3])
        .expect("two executions that differ");
    let (one, two) = (&addrs[0], &addrs[1]);
    let ps: Vec<String> = [
        "qfThreadInfo",
        "qsThreadInfo",
        "qThreadExtraInfo,2",
        "T2",
        "T3",
        "Hg2",
        "g",
        "vCont;s:2",
        "g",
        "vCont;s:2",
        "Hg1",
        "g",
        "Hc2",
        "bc",
        "Hg2",
        "g",
        "Hg1",
        "vCont;s:1",
        "Hc0",
        "bs",
        "g",
    ]
    .iter()
    .map(|p| p.to_string())
    .collect();
    let r = session(&trace, 0, &ps);
    assert_eq!(r[0], "m01,02");
    assert_eq!(r[1], "l");
    let extra = String::from_utf8(unhex(&r[2])).unwrap();
    assert_eq!(extra, "trace thread 1 pid 4242 tid 4243 at instruction 0");
    assert_eq!((r[3].as_str(), &r[4][..1]), ("OK", "E"));
    assert_eq!(rip_of(&r[6]), two[0]);
    assert!(r[7].starts_with("T05thread:02;"), "{}", r[7]);
    assert_eq!(rip_of(&r[8]), two[1]);
    assert_eq!(rip_of(&r[11]), one[0], "thread 1 did not move");
    assert!(
        r[13].contains("thread:02;") && r[13].contains("replaylog:begin"),
        "{}",
        r[13]
    );
    assert_eq!(rip_of(&r[15]), two[0], "bc moved thread 2");
    assert!(r[17].starts_with("T05thread:01;"), "{}", r[17]);
    assert!(r[19].contains("thread:01;"), "{}", r[19]);
    assert_eq!(rip_of(&r[20]), one[0], "bs moved thread 1 back");
}
