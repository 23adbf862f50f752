//! The recorder end to end: `launch::record` runs this test binary again in
//! a child mode (below) that maps the generated runtime, attaches to the
//! region the recorder published exactly as a rewritten program's
//! DT_PREINIT_ARRAY `init` does, and writes known witness sequences. The
//! trace is read back with `aetrace_format::Trace` and every thread's
//! stream compared with the bytes the child was told to write (the oracle
//! shares only the record encoding with the recorder).
//!
//! The tests run one at a time: `record` reaps every child of the process
//! and owns some signal dispositions while it runs.

#[path = "../../runtime/tests/common/mod.rs"]
mod common;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use aetrace_format::{
    module_flags, EndReason, ExitStatus, ModuleId, StartReason, ThreadEnd, ThreadStart, Trace,
};
use aetrace_record::launch::{record, Launch, ModuleSpec, Outcome};
use aetrace_runtime::{Geometry, Site};
use common::*;

static SERIAL: Mutex<()> = Mutex::new(());

const MODE: &str = "AETRACE_LAUNCH_TEST_MODE";
/// File the child writes `base pid argv0` to (its fork child: `.fork`).
const REPORT: &str = "AETRACE_LAUNCH_TEST_REPORT";
const PROC: u32 = 21;
/// Where the tests pretend the runtime was linked in the "rewritten" module.
const RUNTIME_VADDR: u64 = 0x3000;

fn seq_a() -> Vec<u8> {
    sequence(501, 200_000, 1, 254)
}
fn seq_big() -> Vec<u8> {
    sequence(502, 1 << 20, 1, 254)
}
const BIG_RUNS: usize = 6;
fn seq_thread(t: u64) -> Vec<u8> {
    // `sequence` ignores the seed's lowest bit: even seeds, one per thread.
    sequence(600 + 2 * t, 150_000, 1, 254)
}
/// `churn`: waves of three threads; then threads X, X+1 and B, and C
/// (`CHURN_B + 1`) created by B.
const CHURN_WAVES: u64 = 4;
const CHURN_X: u64 = 3 * CHURN_WAVES;
const CHURN_B: u64 = CHURN_X + 2;
fn seq_fork() -> [Vec<u8>; 3] {
    [
        sequence(701, 40_000, 1, 254),
        sequence(702, 90_000, 1, 254),
        sequence(703, 30_000, 1, 254),
    ]
}

/// The child side. Runs only when re-executed by a test with `MODE` set.
#[test]
fn launch_child_helper() {
    let Ok(mode) = std::env::var(MODE) else {
        return; // a normal test run: nothing to do
    };
    let report = PathBuf::from(std::env::var_os(REPORT).expect("report path"));
    let mut m = Mapped::new();
    let run = runner(&mut m, PROC, Site::CONSERVATIVE);
    // As a rewritten program's init: no variable names the region; the
    // runtime finds the recorder's through `/proc` (its parent's, or an
    // exec'd image's).
    m.init(&[]);
    let argv0 = std::env::args_os().next().unwrap_or_default();
    std::fs::write(
        &report,
        format!(
            "{} {} {}",
            m.base as u64,
            std::process::id(),
            argv0.to_string_lossy()
        ),
    )
    .unwrap();
    let go = |s: &[u8]| assert_eq!(run(s.as_ptr(), s.len()), 0, "a site clobbered state");
    match mode.as_str() {
        "exit3" => {
            go(&seq_a());
            std::process::exit(3);
        }
        "big" => {
            let s = seq_big();
            for _ in 0..BIG_RUNS {
                go(&s);
            }
            std::process::exit(0);
        }
        "threads" => {
            std::thread::scope(|sc| {
                for t in 0..2 {
                    sc.spawn(move || go(&seq_thread(t)));
                }
            });
            std::process::exit(0);
        }
        "churn" => {
            // More threads than the 8 slots, in waves of three (the
            // recorder reclaims the slots of exited ones); then B creates
            // C once the two threads started with it have exited and
            // their slots were reclaimed, so C may take a lower slot
            // than its creator's.
            for w in 0..CHURN_WAVES {
                std::thread::scope(|sc| {
                    for t in 0..3 {
                        sc.spawn(move || go(&seq_thread(3 * w + t)));
                    }
                });
            }
            std::thread::scope(|sc| {
                let x = sc.spawn(move || go(&seq_thread(CHURN_X)));
                let y = sc.spawn(move || go(&seq_thread(CHURN_X + 1)));
                sc.spawn(move || {
                    go(&seq_thread(CHURN_B));
                    x.join().unwrap();
                    y.join().unwrap();
                    std::thread::sleep(Duration::from_millis(100));
                    std::thread::scope(|s2| {
                        s2.spawn(move || go(&seq_thread(CHURN_B + 1)));
                    });
                });
            });
            std::process::exit(0);
        }
        "fork" => {
            // The parent exits without waiting: the recorder, as subreaper,
            // must still collect the orphaned child's whole stream.
            let [a, b, c] = seq_fork();
            go(&a);
            let fork_child: extern "C" fn() = unsafe { std::mem::transmute(m.sym("fork_child")) };
            // SAFETY: the child runs generated code, writes a file, _exits.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                fork_child();
                std::thread::sleep(Duration::from_millis(300));
                go(&b);
                let mut path = report.into_os_string();
                path.push(".fork");
                std::fs::write(path, std::process::id().to_string()).unwrap();
                unsafe { libc::_exit(7) };
            }
            go(&c);
            std::process::exit(0);
        }
        "exec" => {
            // The same process continues in a new instrumented image: it
            // attaches to the inherited region with a new slot.
            go(&seq_fork()[0]);
            use std::os::unix::process::CommandExt;
            let e = std::process::Command::new(std::env::current_exe().unwrap())
                .args(std::env::args_os().skip(1))
                .env(MODE, "exec2")
                .exec();
            panic!("exec failed: {e}");
        }
        "exec2" => {
            go(&seq_fork()[2]);
            std::process::exit(5);
        }
        "bad" => {
            // `[0xFF][0x42]` through the protocol: a record nobody knows,
            // then enough witnesses to fill many halves.
            use iced_x86::code_asm::*;
            let mut a = CodeAssembler::new(64).unwrap();
            a.mov(r11d, 2u32).unwrap();
            a.xadd(qword_ptr(0u64).gs(), r11).unwrap();
            a.mov(word_ptr(r11), 0x42FFu32).unwrap();
            a.ret().unwrap();
            let code = a.assemble(m.next_ip()).unwrap();
            let bad: extern "C" fn() = unsafe { std::mem::transmute(m.place(&code)) };
            go(&seq_a());
            bad();
            go(&seq_big());
            std::fs::write(report.with_extension("done"), "").unwrap();
            std::process::exit(0);
        }
        "dispositions" => {
            // What the program inherited: disposition and blocked state of
            // each signal the recorder handles for itself.
            let mut out = String::new();
            for sig in RECORDER_SIGNALS {
                // SAFETY: queries only.
                let (act, blocked) = unsafe {
                    let mut act: libc::sigaction = std::mem::zeroed();
                    libc::sigaction(sig, std::ptr::null(), &mut act);
                    let mut set: libc::sigset_t = std::mem::zeroed();
                    libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set);
                    (act.sa_sigaction, libc::sigismember(&set, sig) == 1)
                };
                let act = match act {
                    libc::SIG_IGN => "ign",
                    libc::SIG_DFL => "dfl",
                    _ => "handler",
                };
                out += &format!("{sig}:{act}:{blocked} ");
            }
            std::fs::write(report.with_extension("sig"), out).unwrap();
            go(&seq_a());
            std::process::exit(0);
        }
        "forever" => {
            let s = seq_big();
            loop {
                go(&s);
            }
        }
        other => panic!("unknown child mode {other}"),
    }
}

/// A temporary directory for one test.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("aetrace-launch-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The bytes the test's MODULE carries as its (opaque) program database.
const DATABASE: &[u8] = b"opaque program database";

fn main_module() -> ModuleSpec {
    ModuleSpec {
        path: PathBuf::from("/original/prog"),
        build_id: vec![0xAB, 0xCD, 0xEF],
        flags: module_flags::MAIN | module_flags::INSTRUMENTED,
        size: 0x20_0000,
        db: aetrace_format::compress_database(9, DATABASE, 3).unwrap(),
        runtime_vaddr: RUNTIME_VADDR,
        image_id: 0,
        notes: vec!["procedure foo left alone: unresolved indirect jump".into()],
    }
}

fn launch(dir: &Dir, mode: &str, geometry: Geometry) -> Launch {
    Launch {
        program: std::env::current_exe().unwrap(),
        native_path: None,
        argv0: OsString::from("recorded-argv0"),
        args: [
            "--exact",
            "launch_child_helper",
            "--test-threads=1",
            "--nocapture",
            "-q",
        ]
        .map(OsString::from)
        .to_vec(),
        env: vec![
            (MODE.into(), mode.into()),
            (REPORT.into(), dir.0.join("report").into_os_string()),
        ],
        trace: dir.0.join("TRACE.aet"),
        modules: vec![main_module()],
        geometry,
        follow: None,
    }
}

/// Small halves: many flushes per test.
const SMALL: Geometry = Geometry {
    slot_count: 8,
    half_size: 64 * 1024,
};

/// What the child reported: runtime base, pid, argv[0].
fn report(path: &Path) -> (u64, u32, String) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut it = text.splitn(3, ' ');
    (
        it.next().unwrap().parse().unwrap(),
        it.next().unwrap().parse().unwrap(),
        it.next().unwrap().to_string(),
    )
}

struct Recorded {
    start: ThreadStart,
    end: ThreadEnd,
    chunks: usize,
    /// The largest chunk's raw bytes.
    largest: u64,
    witnesses: u64,
    stream: Vec<u8>,
}

/// Reads a complete trace back: every thread's start, end and stream.
fn read_trace(path: &Path) -> (Trace<Vec<u8>>, Vec<Recorded>) {
    let trace = Trace::parse(std::fs::read(path).unwrap()).unwrap();
    trace.require_complete().unwrap();
    let threads = trace
        .threads()
        .map(|t| {
            let mut stream = Vec::new();
            let (mut witnesses, mut largest) = (0, 0);
            for c in trace.chunks(t.start.thread) {
                witnesses += c.meta.witnesses;
                largest = largest.max(c.meta.raw_len);
                stream.extend(c.decompress().unwrap());
            }
            Recorded {
                start: t.start,
                end: t.end.expect("complete trace: every thread ended"),
                chunks: t.chunks.len(),
                largest,
                witnesses,
                stream,
            }
        })
        .collect();
    (trace, threads)
}

/// THREAD(parent) or FORK(parent), then ENTER and each sequence.
fn expected(first_kind: u8, parent: u32, seqs: &[&[u8]]) -> Vec<u8> {
    let mut v = vec![0xFF, first_kind];
    v.extend(parent.to_le_bytes());
    for s in seqs {
        v.extend(enter_record(PROC));
        v.extend_from_slice(s);
    }
    v
}

#[test]
fn launch_normal_exit_gives_status_and_exact_stream() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Dir::new("exit3");
    let l = launch(&dir, "exit3", Launch::DEFAULT_GEOMETRY);
    assert_eq!(whole(record(&l)), Outcome::Exited(3));
    let (base, pid, argv0) = report(&dir.0.join("report"));
    assert_eq!(argv0, "recorded-argv0");
    let (trace, threads) = read_trace(&l.trace);
    assert_eq!(threads.len(), 1);
    let t = &threads[0];
    assert_eq!(t.start.reason, StartReason::Main);
    assert_eq!(t.start.parent, None);
    assert_eq!(t.start.pid, pid);
    assert_eq!(t.end.reason, EndReason::Exit);
    let a = seq_a();
    assert!(
        t.stream == expected(8, u32::MAX, &[&a]),
        "stream differs from what the child wrote"
    );
    assert_eq!(t.witnesses, a.len() as u64, "witness count of the chunks");
    // The module: load bias from the runtime's address in the child.
    let spec = main_module();
    let m = trace.module(ModuleId(0)).expect("MODULE 0");
    assert_eq!(m.load_base, base - RUNTIME_VADDR);
    assert_eq!(m.pid, pid);
    assert_eq!(m.path, b"/original/prog");
    assert_eq!(
        (m.flags, m.size, &m.build_id),
        (spec.flags, spec.size, &spec.build_id)
    );
    let db = trace.program_database(ModuleId(0)).expect("database");
    assert_eq!(db.version(), 9);
    assert_eq!(db.decompress().unwrap(), DATABASE);
    assert!(trace
        .notes()
        .iter()
        .any(|n| n.module == Some(ModuleId(0)) && n.text == spec.notes[0]));
    let exits = trace.process_exits();
    assert_eq!(exits.len(), 1);
    assert_eq!(exits[0].pid, pid);
    assert_eq!(exits[0].status, ExitStatus::Exited(3));
}

/// Records child mode `mode` with small halves (one test at a time: the
/// guard), which must exit 0; its directory and its trace's threads.
fn record_exit0(mode: &str) -> (std::sync::MutexGuard<'static, ()>, Dir, Vec<Recorded>) {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Dir::new(mode);
    let l = launch(&dir, mode, SMALL);
    assert_eq!(whole(record(&l)), Outcome::Exited(0));
    let (_, threads) = read_trace(&l.trace);
    (serial, dir, threads)
}

#[test]
fn launch_megabytes_of_witnesses_become_several_chunks() {
    let (_serial, _dir, threads) = record_exit0("big");
    assert_eq!(threads.len(), 1);
    let s = seq_big();
    let want = expected(8, u32::MAX, &[&s[..]; BIG_RUNS]);
    let t = &threads[0];
    // A chunk closes between drained batches (a half at most) once it
    // holds CHUNK_BYTES, however the drain passes fall.
    let most = aetrace_record::launch::CHUNK_BYTES + SMALL.half_size as usize;
    assert!(
        t.largest <= most as u64 && t.chunks >= want.len().div_ceil(most),
        "{} chunks for {} bytes, the largest {} bytes",
        t.chunks,
        want.len(),
        t.largest
    );
    assert_eq!(t.stream.len(), want.len());
    assert!(t.stream == want, "stream differs from what the child wrote");
    assert_eq!(t.witnesses, (BIG_RUNS * s.len()) as u64);
}

#[test]
fn launch_two_threads_get_their_own_streams() {
    let (_serial, dir, threads) = record_exit0("threads");
    let (_, pid, _) = report(&dir.0.join("report"));
    assert_eq!(threads.len(), 3, "the initial thread and two workers");
    assert_eq!(threads[0].start.reason, StartReason::Main);
    assert!(threads[0].stream == expected(8, u32::MAX, &[]));
    let mut got: Vec<&Vec<u8>> = threads[1..]
        .iter()
        .map(|t| {
            assert_eq!(t.start.reason, StartReason::Thread);
            assert_eq!(t.start.parent, Some(threads[0].start.thread));
            assert_eq!(t.start.pid, pid);
            assert_ne!(t.start.os_tid, threads[0].start.os_tid);
            &t.stream
        })
        .collect();
    let want: Vec<Vec<u8>> = (0..2).map(|t| expected(8, 0, &[&seq_thread(t)])).collect();
    got.sort();
    let mut want: Vec<&Vec<u8>> = want.iter().collect();
    want.sort();
    assert!(got == want, "worker streams differ");
}

/// More threads over the run than the region has slots (8), never more
/// than four alive with the initial thread: the recorder reclaims the
/// slot of each exited thread, and each claim of a slot is a new thread
/// in the trace with exactly that thread's stream (nothing of an earlier
/// owner of the slot). A thread created by a worker, after slots below
/// the worker's were freed, names the worker as its parent.
#[test]
fn launch_threads_beyond_the_slot_count_reuse_exited_threads_slots() {
    let (_serial, _dir, threads) = record_exit0("churn");
    let workers = CHURN_B + 2;
    assert_eq!(
        threads.len() as u64,
        1 + workers,
        "the initial thread and each worker"
    );
    assert!(threads.len() > SMALL.slot_count as usize);
    assert!(threads[0].stream == expected(8, u32::MAX, &[]));
    let find = |t: u64| {
        let seq = seq_thread(t);
        let tail = [enter_record(PROC), seq].concat();
        let found: Vec<&Recorded> = threads
            .iter()
            .filter(|r| r.stream[6..] == tail[..])
            .collect();
        assert_eq!(found.len(), 1, "worker {t}: one stream");
        found[0]
    };
    for t in 0..workers {
        let r = find(t);
        assert_eq!(r.start.reason, StartReason::Thread, "worker {t}");
        assert_eq!(r.end.reason, EndReason::Exit, "worker {t}");
        assert_eq!(r.stream[..2], [0xFF, 8], "worker {t}");
        let parent = if t == CHURN_B + 1 {
            find(CHURN_B).start.thread
        } else {
            threads[0].start.thread
        };
        assert_eq!(r.start.parent, Some(parent), "worker {t}");
    }
}

#[test]
fn launch_orphaned_fork_child_is_recorded_to_its_end() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Dir::new("fork");
    let l = launch(&dir, "fork", SMALL);
    assert_eq!(whole(record(&l)), Outcome::Exited(0));
    let (_, pid, _) = report(&dir.0.join("report"));
    let child: u32 = std::fs::read_to_string(dir.0.join("report.fork"))
        .expect("the fork child finished (after its parent)")
        .parse()
        .unwrap();
    let (trace, threads) = read_trace(&l.trace);
    let [a, b, c] = seq_fork();
    assert_eq!(threads.len(), 2);
    assert!(threads[0].stream == expected(8, u32::MAX, &[&a, &c]));
    let f = &threads[1];
    assert_eq!(f.start.reason, StartReason::Fork);
    assert_eq!(f.start.parent, Some(threads[0].start.thread));
    assert_eq!(f.start.pid, child);
    assert!(f.stream == expected(7, 0, &[&b]), "fork child's stream");
    let mut exits: Vec<(u32, ExitStatus)> = trace
        .process_exits()
        .iter()
        .map(|x| (x.pid, x.status))
        .collect();
    exits.sort_by_key(|x| x.0);
    let mut want = vec![(pid, ExitStatus::Exited(0)), (child, ExitStatus::Exited(7))];
    want.sort_by_key(|x| x.0);
    assert_eq!(exits, want, "both processes reaped");
}

#[test]
fn launch_exec_of_an_instrumented_image_continues_in_a_new_thread_stream() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Dir::new("exec");
    let l = launch(&dir, "exec", SMALL);
    assert_eq!(whole(record(&l)), Outcome::Exited(5));
    let (_, pid, _) = report(&dir.0.join("report"));
    let (trace, threads) = read_trace(&l.trace);
    let [a, _, c] = seq_fork();
    assert_eq!(threads.len(), 2);
    assert!(threads[0].stream == expected(8, u32::MAX, &[&a]));
    assert_eq!(threads[0].end.reason, EndReason::Exec);
    let t = &threads[1];
    assert_eq!(t.start.reason, StartReason::Exec);
    assert_eq!(t.start.parent, Some(threads[0].start.thread));
    assert_eq!((t.start.pid, threads[0].start.pid), (pid, pid));
    assert!(t.stream == expected(8, u32::MAX, &[&c]));
    assert_eq!(t.end.reason, EndReason::Exit);
    assert!(
        trace
            .notes()
            .iter()
            .any(|n| n.module.is_none() && n.text.contains("exec'd")),
        "a note says the new image's modules are unknown"
    );
    assert_eq!(trace.process_exits().len(), 1);
}

/// How the program ended, the trace being whole.
fn whole(r: aetrace_record::Result<aetrace_record::launch::Recorded>) -> Outcome {
    let r = r.unwrap();
    assert!(r.incomplete.is_none(), "{:?}", r.incomplete);
    r.outcome
}

/// Starts `mode` under `record` on another thread, waits until the child
/// has written `min_trace` bytes of trace, runs `act(child pid)`, and
/// returns the outcome with the child's report.
fn interrupt(dir: &Dir, mode: &str, min_trace: u64, act: impl FnOnce(i32)) -> (Outcome, u64, u32) {
    let l = launch(dir, mode, SMALL);
    let report_path = dir.0.join("report");
    std::thread::scope(|s| {
        let h = s.spawn(|| record(&l));
        let t = Instant::now();
        let size = || std::fs::metadata(&l.trace).map_or(0, |m| m.len());
        while !(report_path.exists() && size() >= min_trace) {
            assert!(
                t.elapsed() < Duration::from_secs(60) && !h.is_finished(),
                "the child did not write {min_trace} bytes of trace"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let (_, pid, _) = report(&report_path);
        act(pid as i32);
        let outcome = whole(h.join().unwrap());
        let (base, pid, _) = report(&report_path);
        (outcome, base, pid)
    })
}

#[test]
fn launch_sigkilled_program_leaves_a_complete_trace_of_an_exact_prefix() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Dir::new("kill");
    let (outcome, _, pid) = interrupt(&dir, "forever", 3 << 20, |pid| unsafe {
        libc::kill(pid, libc::SIGKILL);
    });
    assert_eq!(outcome, Outcome::Signaled(libc::SIGKILL));
    let (trace, threads) = read_trace(&dir.0.join("TRACE.aet"));
    assert_eq!(threads.len(), 1);
    let t = &threads[0];
    assert_eq!(t.end.reason, EndReason::Killed);
    let s = seq_big();
    let mut want = expected(8, u32::MAX, &[]);
    while want.len() < t.stream.len() {
        want.extend(enter_record(PROC));
        want.extend_from_slice(&s);
    }
    assert!(t.stream.len() >= 2 << 20, "{} bytes", t.stream.len());
    assert!(
        t.stream[..] == want[..t.stream.len()],
        "the stream is not a prefix of what the child wrote"
    );
    assert_eq!(
        trace.process_exits()[0].status,
        ExitStatus::Signaled {
            signal: libc::SIGKILL,
            core_dumped: false
        }
    );
    assert_eq!(trace.process_exits()[0].pid, pid);
}

/// The signals whose dispositions the recorder changes while it runs.
const RECORDER_SIGNALS: [libc::c_int; 5] = [
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGCHLD,
];

/// The program inherits the dispositions the recorder was started with
/// (an ignored SIGQUIT or SIGHUP stays ignored, as under `nohup`), none
/// of the recorder's own, and none of these signals blocked; the
/// recorder's are restored when it returns.
#[test]
fn launch_program_inherits_the_dispositions_the_recorder_had() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Dir::new("disp");
    let set = |sig, act| unsafe {
        let mut a: libc::sigaction = std::mem::zeroed();
        a.sa_sigaction = act;
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, &a, &mut old);
        old.sa_sigaction
    };
    let quit = set(libc::SIGQUIT, libc::SIG_IGN);
    let hup = set(libc::SIGHUP, libc::SIG_IGN);
    let outcome = whole(record(&launch(&dir, "dispositions", SMALL)));
    let after = (set(libc::SIGQUIT, quit), set(libc::SIGHUP, hup));
    assert_eq!(outcome, Outcome::Exited(0));
    assert_eq!(after, (libc::SIG_IGN, libc::SIG_IGN));
    let seen = std::fs::read_to_string(dir.0.join("report.sig")).unwrap();
    let want: String = RECORDER_SIGNALS
        .iter()
        .map(|&sig| {
            let act = if sig == libc::SIGQUIT || sig == libc::SIGHUP {
                "ign"
            } else {
                "dfl"
            };
            format!("{sig}:{act}:false ")
        })
        .collect();
    assert_eq!(seen, want);
}

/// Signals to the recorder's own process (`kill -INT RECORDER`, not a
/// terminal's ^C, which reaches the program itself) are forwarded to the
/// program, which dies of them as it would.
#[test]
fn launch_forwards_sigint_and_sigterm_sent_to_the_recorder() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A shell's background job starts with SIGINT ignored, and the child
    // inherits what the recorder inherited (transparency): it would then
    // run forever. The test is about the default action.
    for sig in [libc::SIGINT, libc::SIGTERM] {
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
    for (sig, name) in [(libc::SIGINT, "int"), (libc::SIGTERM, "term")] {
        let dir = Dir::new(name);
        let (outcome, _, _) = interrupt(&dir, "forever", 1 << 20, |_| unsafe {
            libc::kill(libc::getpid(), sig);
        });
        assert_eq!(outcome, Outcome::Signaled(sig), "{name}");
        let (_, threads) = read_trace(&dir.0.join("TRACE.aet"));
        assert_eq!(threads[0].end.reason, EndReason::Killed, "{name}");
    }
}

#[test]
fn launch_unreadable_stream_fails_loudly_after_the_program_ran() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Dir::new("bad");
    let l = launch(&dir, "bad", SMALL);
    // The program's end is still the outcome; the failure comes with it.
    let e = record(&l)
        .unwrap()
        .incomplete
        .expect("a failure")
        .to_string();
    assert!(
        e.contains("recording failed")
            && e.contains("the trace is incomplete")
            && e.contains("unknown record kind 0x42"),
        "{e}"
    );
    assert!(
        dir.0.join("report.done").exists(),
        "the program was not blocked: it ran to its end"
    );
    let trace = Trace::parse(std::fs::read(&l.trace).unwrap()).unwrap();
    assert!(!trace.is_complete(), "no END after a failed recording");
}

#[test]
fn launch_missing_program_is_a_clear_error() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Dir::new("missing");
    let mut l = launch(&dir, "exit3", SMALL);
    l.program = dir.0.join("no-such-program");
    let e = record(&l).unwrap_err().to_string();
    assert!(
        e.contains("no-such-program") && e.contains("No such file"),
        "message: {e}"
    );
    assert!(!e.contains('\n'), "one line: {e}");
    assert!(
        !l.trace.exists(),
        "no trace is left for a program that never ran"
    );
    // Not executable: also an error naming it.
    let script = dir.0.join("not-executable");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    l.program = script;
    let e = record(&l).unwrap_err().to_string();
    assert!(
        e.contains("not-executable") && e.contains("ermission"),
        "message: {e}"
    );
}

#[test]
fn launch_without_a_main_module_or_with_a_bad_library_module_is_refused() {
    let dir = Dir::new("modules");
    let mut l = launch(&dir, "exit3", SMALL);
    l.modules.clear();
    assert!(record(&l)
        .unwrap_err()
        .to_string()
        .contains("main executable"));
    // A second main executable, and an uninstrumented library, cannot be
    // library modules (a library is found by its tag in the region).
    let mut lib = main_module();
    lib.path = "/lib/libfoo.so".into();
    l.modules = vec![main_module(), lib.clone()];
    let e = record(&l).unwrap_err().to_string();
    assert!(e.contains("/lib/libfoo.so"), "{e}");
    lib.flags = 0;
    l.modules = vec![main_module(), lib];
    let e = record(&l).unwrap_err().to_string();
    assert!(e.contains("/lib/libfoo.so"), "{e}");
    assert!(!l.trace.exists());
}
