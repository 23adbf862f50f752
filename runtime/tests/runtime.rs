//! End-to-end tests of the generated runtime and the buffer protocol: the
//! blob and generated witness routines run in this process (or a re-executed
//! child), the recorder-side drainer reads the region concurrently, and the
//! drained streams are compared with the sequences the routines were given.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use aetrace_runtime::emit::{
    emit_outside_entry, emit_record, emit_transfer, emit_witness, FlagsSave, Payload, Site,
};
use aetrace_runtime::layout::{RecordKind, FLAG_SLOTS_EXHAUSTED};
use aetrace_runtime::{read_standalone, Geometry, Region};
use common::*;
use iced_x86::code_asm::*;

/// Small halves force a flush every ~8 KiB.
const SMALL: Geometry = Geometry {
    slot_count: 8,
    half_size: 12288,
};

type Streams = BTreeMap<u32, (u32, Vec<u8>)>;

/// Runs `work` while another thread drains `region`; returns slot -> (pid, bytes).
/// Every batch must carry `runtime`, where the test mapped the blob (the
/// slot's `S_RUNTIME`, set by init and attach_thread).
fn drain_while(region: &Region, runtime: u64, work: impl FnOnce()) -> Streams {
    let (streams, errors) = drain_collecting_errors(region, runtime, work);
    assert!(errors.is_empty(), "drainer errors: {errors:?}");
    streams
}

/// [`drain_while`], also returning the errors `poll` reported.
fn drain_collecting_errors(
    region: &Region,
    runtime: u64,
    work: impl FnOnce(),
) -> (Streams, Vec<String>) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let mut d = region.drainer();
            let mut out = Streams::new();
            let mut errors = Vec::new();
            let mut sink = |b: aetrace_runtime::Batch<'_>| {
                assert_eq!(b.runtime, runtime, "slot {}: runtime address", b.slot);
                out.entry(b.slot)
                    .or_insert((b.pid, Vec::new()))
                    .1
                    .extend_from_slice(b.bytes)
            };
            while !stop.load(Ordering::Acquire) {
                if let Err(e) = d.poll(false, &mut sink) {
                    errors.push(e.to_string());
                }
                d.wait(Duration::from_millis(1));
            }
            if let Err(e) = d.poll(true, &mut sink) {
                errors.push(e.to_string());
            }
            (out, errors)
        });
        // A lost byte would leave the drainer waiting and the writer blocked
        // on a full half forever: fail loudly instead of hanging CI.
        s.spawn(|| {
            let t = Instant::now();
            while !stop.load(Ordering::Acquire) {
                if t.elapsed() > Duration::from_secs(120) {
                    eprintln!("runtime test stuck for 120 s: a reserved witness was never written");
                    std::process::abort();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        work();
        stop.store(true, Ordering::Release);
        h.join().unwrap()
    })
}

fn expected_main(proc_id: u32, seq: &[u8]) -> Vec<u8> {
    let mut e = thread_record(u32::MAX);
    e.extend(enter_record(proc_id));
    e.extend_from_slice(seq);
    e
}

fn check_variant(site: Site) {
    let mut m = Mapped::new();
    let region = Region::create(SMALL).unwrap();
    let run = runner(&mut m, 7, site);
    let seq = sequence(0x1234, 300_000, 1, 254);
    let saved_gs = get_gs();
    let streams = drain_while(&region, m.base as u64, || {
        m.init(&[region.env()]);
        assert_eq!(
            run(seq.as_ptr(), seq.len()),
            0,
            "a site clobbered a register or flag"
        );
        set_gs(saved_gs);
    });
    assert_eq!(streams.len(), 1, "one slot used");
    let (pid, got) = &streams[&0];
    assert_eq!(*pid, std::process::id());
    assert!(
        got.len() > 20 * SMALL.half_size as usize / 2,
        "many flushes happened"
    );
    assert!(
        *got == expected_main(7, &seq),
        "drained stream differs from the sequence"
    );
}

#[test]
fn scratch_register_sequence_is_exact_across_flushes() {
    check_variant(Site {
        scratch: Some(r11),
        flags_live: false,
        red_zone_live: false,
        flags_save: FlagsSave::Lahf,
    });
}

#[test]
fn no_scratch_red_zone_sequence_is_exact() {
    check_variant(Site {
        scratch: None,
        flags_live: false,
        red_zone_live: true,
        flags_save: FlagsSave::Lahf,
    });
}

#[test]
fn live_flags_lahf_and_pushf_are_preserved() {
    for flags_save in [FlagsSave::Lahf, FlagsSave::Pushf] {
        for scratch in [None, Some(r11), Some(rcx)] {
            check_variant(Site {
                scratch,
                flags_live: true,
                red_zone_live: true,
                flags_save,
            });
        }
    }
}

#[test]
fn threads_get_their_own_slots() {
    let mut m = Mapped::new();
    let region = Region::create(SMALL).unwrap();
    let site = Site::with_scratch(r10);
    let run = runner(&mut m, 3, site);
    let seqs: Vec<Vec<u8>> = (0..4).map(|t| sequence(100 + t, 120_000, 1, 254)).collect();
    let saved_gs = get_gs();
    let streams = drain_while(&region, m.base as u64, || {
        m.init(&[region.env()]);
        std::thread::scope(|s| {
            for seq in &seqs {
                // New threads inherit nothing: the outside-entry stub attaches them.
                s.spawn(move || assert_eq!(run(seq.as_ptr(), seq.len()), 0));
            }
        });
        set_gs(saved_gs);
    });
    // Slot 0: the initialising thread (THREAD record only).
    assert_eq!(streams[&0].1, thread_record(u32::MAX));
    let mut got: Vec<Vec<u8>> = (1..=4).map(|s| streams[&s].1.clone()).collect();
    let mut want: Vec<Vec<u8>> = seqs
        .iter()
        .map(|seq| {
            let mut e = thread_record(0);
            e.extend(enter_record(3));
            e.extend_from_slice(seq);
            e
        })
        .collect();
    got.sort();
    want.sort();
    assert!(got == want, "per-thread streams differ");
}

// --- signals -------------------------------------------------------------

static HANDLER_CALLS: AtomicU32 = AtomicU32::new(0);
const HANDLER_PROC: u32 = 9;
/// What each handler invocation writes after its SIGNAL and ENTER records.
const HANDLER_BLOCK: [u8; 4] = [0xF0, 0xF1, 0xF2, 0xF3];

/// An instrumented signal handler, installed directly (so the kernel's
/// trampoline calls it and its outside-entry stub sees `__restore_rt`):
/// counts itself, then writes `HANDLER_BLOCK`.
fn handler_routine(m: &mut Mapped) -> u64 {
    let mut a = CodeAssembler::new(64).unwrap();
    emit_outside_entry(&mut a, HANDLER_PROC, &m.addrs()).unwrap();
    a.mov(rax, &HANDLER_CALLS as *const AtomicU32 as u64)
        .unwrap();
    a.lock().inc(dword_ptr(rax)).unwrap();
    for w in HANDLER_BLOCK {
        emit_witness(&mut a, w, Site::with_scratch(r11)).unwrap();
    }
    a.ret().unwrap();
    let code = a.assemble(m.next_ip()).unwrap();
    m.place(&code)
}

#[test]
fn signal_handler_witnesses_are_inserted_whole() {
    // The no-scratch sequence (longest window between reserving and
    // writing; store through rcx) and a dead r9 (REX store form).
    let mut fixups = 0;
    for site in [Site::CONSERVATIVE, Site::with_scratch(r9)] {
        fixups += signal_case(site);
    }
    // Some signals landed between a reservation and its store: the runtime
    // completed those stores at the handler's entry (else the stream checks
    // above would still pass, but this path would be untested).
    assert!(fixups > 0, "no signal interrupted a pending witness store");
}

/// Runs 3 M witnesses under a 20 us timer signal whose handler runs its own
/// instrumented routine; checks the merged stream; returns the number of
/// pending stores completed at signal entry.
fn signal_case(main_site: Site) -> u64 {
    let mut m = Mapped::new();
    let region = Region::create(SMALL).unwrap();
    HANDLER_CALLS.store(0, Ordering::Relaxed);
    let main_lo = m.next_ip();
    let main_run = runner(&mut m, 7, main_site);
    let main_hi = m.next_ip();
    let handler = handler_routine(&mut m);
    let seq = sequence(77, 3_000_000, 1, 0xBF);
    let saved_gs = get_gs();
    let tid = unsafe { libc::gettid() };
    let streams = drain_while(&region, m.base as u64, || {
        m.init(&[region.env()]);
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as usize;
            sa.sa_flags = libc::SA_RESTART;
            assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
            // A timer aimed at this thread only (other tests run in parallel).
            let mut sev: libc::sigevent = std::mem::zeroed();
            sev.sigev_notify = libc::SIGEV_THREAD_ID;
            sev.sigev_signo = libc::SIGUSR2;
            sev.sigev_notify_thread_id = tid;
            let mut timer: libc::timer_t = std::mem::zeroed();
            assert_eq!(
                libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut timer),
                0
            );
            let it = libc::itimerspec {
                it_interval: libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 20_000,
                },
                it_value: libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 20_000,
                },
            };
            assert_eq!(libc::timer_settime(timer, 0, &it, std::ptr::null_mut()), 0);
            let r = main_run(seq.as_ptr(), seq.len());
            libc::timer_delete(timer);
            assert_eq!(r, 0, "main sites saw clobbered state");
        }
        set_gs(saved_gs);
    });
    let calls = HANDLER_CALLS.load(Ordering::Relaxed);
    assert!(
        calls > 10,
        "only {calls} signals landed; the test did not test anything"
    );
    let got = &streams[&0].1;
    let mut main = Vec::new();
    let mut k = 0u32; // handler occurrences
    let mut i = 0usize;
    // The stream: THREAD, then main's ENTER(7) and witnesses with whole
    // handler occurrences anywhere in between (a signal may even land
    // before main's ENTER record).
    let head = thread_record(u32::MAX);
    assert_eq!(got[..head.len()], head[..]);
    i += head.len();
    let main_enter = enter_record(7);
    let mut entered = false;
    let signal = [0xFF, 15, libc::SIGUSR2 as u8, 0, 0, 0]; // SIGNAL(SIGUSR2, ..)
    let handler_enter = enter_record(HANDLER_PROC);
    let boundaries = instruction_starts(main_lo, main_hi);
    let mut in_main = 0;
    while i < got.len() {
        if got[i..].starts_with(&main_enter) && !entered {
            entered = true;
            i += main_enter.len();
        } else if got[i] == 0xFF {
            assert_eq!(got[i..i + 6], signal[..], "byte {i}: unexpected record");
            let rip = u64::from_le_bytes(got[i + 6..i + 14].try_into().unwrap());
            if (main_lo..main_hi).contains(&rip) {
                // The handler returns to an instruction of the runner, never
                // to a witness store whose reservation it saw (the fix-up
                // completed those and stepped over them).
                in_main += 1;
                match boundaries.get(&rip) {
                    Some(prev_is_xadd) => {
                        assert!(
                            !prev_is_xadd,
                            "byte {i}: SIGNAL rip {rip:#x} at a pending store"
                        )
                    }
                    None => panic!("byte {i}: SIGNAL rip {rip:#x} inside an instruction"),
                }
            }
            // The runner makes no counted transfer.
            assert_eq!(
                got[i + 14..i + 18],
                [0, 0, 0, 0],
                "byte {i}: transfer count"
            );
            assert_eq!(got[i + 18..i + 24], handler_enter[..], "byte {i}");
            assert_eq!(
                got[i + 24..i + 28],
                HANDLER_BLOCK,
                "byte {i}: handler block {k} not whole"
            );
            k += 1;
            i += 28;
        } else {
            assert!(entered, "byte {i}: main witness before main's ENTER");
            assert!(
                got[i] < 0xF0,
                "byte {i}: handler witness outside a handler block"
            );
            main.push(got[i]);
            i += 1;
        }
    }
    assert_eq!(k, calls, "every handler invocation appears once");
    // The rest land in the runtime (delivered when flush unblocks signals)
    // or in libc around the timer calls.
    assert!(
        in_main * 4 > k,
        "only {in_main} of {k} SIGNAL records name an instruction of the runner"
    );
    assert!(main == seq, "main's witnesses differ from its sequence");
    eprintln!(
        "{main_site:?}: {calls} signals ({in_main} in the runner), {} stores completed at signal entry",
        m.fixups()
    );
    m.fixups()
}

/// Instruction starts of the generated code in `lo..hi` (decoded linearly
/// from `lo`), each with whether the instruction before it is an
/// `xadd gs:[0], r` (a witness reservation).
fn instruction_starts(lo: u64, hi: u64) -> std::collections::HashMap<u64, bool> {
    // SAFETY: the range was placed by `Mapped::place` and is mapped readable.
    let code = unsafe { std::slice::from_raw_parts(lo as *const u8, (hi - lo) as usize) };
    let mut d = iced_x86::Decoder::with_ip(64, code, lo, iced_x86::DecoderOptions::NONE);
    let mut out = std::collections::HashMap::new();
    let mut prev_xadd = false;
    for ins in &mut d {
        out.insert(ins.ip(), prev_xadd);
        prev_xadd = ins.mnemonic() == iced_x86::Mnemonic::Xadd
            && ins.segment_prefix() == iced_x86::Register::GS;
    }
    out
}

// --- records ---------------------------------------------------------------

#[test]
fn records_are_written_with_their_payloads() {
    let mut m = Mapped::new();
    let region = Region::create(SMALL).unwrap();
    let mut a = CodeAssembler::new(64).unwrap();
    let site = Site::CONSERVATIVE;
    emit_record(&mut a, RecordKind::Indirect, Payload::Reg64(rdi), site).unwrap();
    emit_record(&mut a, RecordKind::Exit, Payload::Reg32(esi), site).unwrap();
    emit_record(&mut a, RecordKind::SetjmpResume, Payload::None, site).unwrap();
    emit_record(&mut a, RecordKind::Return, Payload::None, site).unwrap();
    emit_record(&mut a, RecordKind::Wide, Payload::Imm16(0x1234), site).unwrap();
    emit_witness(&mut a, 0x42, site).unwrap();
    a.ret().unwrap();
    assert!(emit_record(&mut a, RecordKind::Enter, Payload::Reg64(rdi), site).is_err());
    // SIGNAL (12-byte payload) is written by the runtime's signal_entry only.
    assert!(emit_record(&mut a, RecordKind::Signal, Payload::Reg32(esi), site).is_err());
    assert!(emit_witness(&mut a, 0, site).is_err() && emit_witness(&mut a, 0xFF, site).is_err());
    let code = a.assemble(m.next_ip()).unwrap();
    let f: extern "C" fn(u64, u32) = unsafe { std::mem::transmute(m.place(&code)) };
    let saved_gs = get_gs();
    let streams = drain_while(&region, m.base as u64, || {
        m.init(&[region.env()]);
        f(0x1122_3344_5566_7788, 11);
        set_gs(saved_gs);
    });
    let mut want = thread_record(u32::MAX);
    want.extend([0xFF, 2, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
    want.extend([0xFF, 6, 11, 0, 0, 0]);
    want.extend([0xFF, 4]);
    want.extend([0xFF, 10]);
    want.extend([0xFF, 9, 0x34, 0x12]);
    want.push(0x42);
    assert_eq!(streams[&0].1, want);
}

/// An unknown record kind in a stream is an error for that slot only: the
/// drainer reports it once, yields nothing of that slot after it, keeps
/// handing its halves back so the writer runs to its end, and drains the
/// other slots as before.
#[test]
fn a_broken_stream_is_reported_once_and_never_blocks_its_writer() {
    let mut m = Mapped::new();
    let region = Region::create(SMALL).unwrap();
    let run = runner(&mut m, 4, Site::with_scratch(r11));
    // `[0xFF][0x42]` written through the protocol: a record kind nobody knows.
    let mut a = CodeAssembler::new(64).unwrap();
    a.mov(r11d, 2u32).unwrap();
    a.xadd(qword_ptr(0u64).gs(), r11).unwrap();
    a.mov(word_ptr(r11), 0x42FFu32).unwrap();
    a.ret().unwrap();
    let code = a.assemble(m.next_ip()).unwrap();
    let bad: extern "C" fn() = unsafe { std::mem::transmute(m.place(&code)) };
    let head = sequence(5, 1000, 1, 254);
    let rest = sequence(6, 300_000, 1, 254); // ~25 flushes after the bad record
    let other = sequence(7, 50_000, 1, 254);
    let saved_gs = get_gs();
    let (streams, errors) = drain_collecting_errors(&region, m.base as u64, || {
        m.init(&[region.env()]);
        assert_eq!(run(head.as_ptr(), head.len()), 0);
        bad();
        assert_eq!(run(rest.as_ptr(), rest.len()), 0);
        // Another thread (slot 1) is drained as usual.
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(run(other.as_ptr(), other.len()), 0));
        });
        set_gs(saved_gs);
    });
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("slot 0: unknown record kind 0x42"),
        "{errors:?}"
    );
    let good = expected_main(4, &head);
    let got = &streams.get(&0).map_or(&[][..], |s| &s.1[..]);
    assert!(
        good.starts_with(got),
        "slot 0 yielded bytes beyond the bad record"
    );
    let mut want = thread_record(0);
    want.extend(enter_record(4));
    want.extend_from_slice(&other);
    assert!(streams[&1].1 == want, "slot 1 differs");
}

// --- standalone --------------------------------------------------------------

#[test]
fn standalone_file_holds_the_sequence() {
    let mut m = Mapped::new();
    let run = runner(&mut m, 5, Site::with_scratch(rax));
    let seq = sequence(9, 400_000, 1, 254); // ~6 chunks of 64 KiB
    let dir = std::env::temp_dir().join(format!("aetrace-rt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("standalone.raw");
    let saved_gs = get_gs();
    m.init(&[("AETRACE_OUT", path.display().to_string())]);
    assert_eq!(run(seq.as_ptr(), seq.len()), 0);
    set_gs(saved_gs);
    let bytes = std::fs::read(&path).unwrap();
    let streams = read_standalone(&bytes).unwrap();
    assert_eq!(streams.len(), 1);
    assert_eq!(streams[0].pid, std::process::id());
    assert_eq!(streams[0].runtime, m.base as u64, "runtime address");
    assert!(
        streams[0].bytes == expected_main(5, &seq),
        "standalone stream differs"
    );
    // Damaged files are errors, not panics.
    assert!(read_standalone(&bytes[..100]).is_err());
    let mut bad = bytes.clone();
    bad[0] ^= 1;
    assert!(read_standalone(&bad).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

// --- SIGKILL ------------------------------------------------------------------

const CHILD_ENV: &str = "AETRACE_RT_TEST_CHILD";
const CHILD_SEQ: usize = 1 << 20;

/// Runs only in a re-executed child (modes: `kill`: write a sequence
/// forever; `fork`: write, fork, write in both; `threads`: exceed the slots;
/// `noenv`: init without the variables; `early`: traced code before init).
#[test]
fn child_helper_writes_until_killed() {
    if std::env::var(CHILD_ENV).is_err() {
        return; // parent run: the child mode is driven by the SIGKILL test
    }
    let mode = std::env::var(CHILD_ENV).unwrap();
    let mut m = Mapped::new();
    let run = runner(&mut m, 11, Site::CONSERVATIVE);
    match mode.as_str() {
        "noenv" => m.init(&[]), // must not return
        "early" => {
            run([1u8].as_ptr(), 1); // traced code before init: must not return
        }
        _ => m.init(&[("AETRACE_SHM_FD", std::env::var("AETRACE_SHM_FD").unwrap())]),
    }
    println!("RUNTIME {}", m.base as u64);
    match mode.as_str() {
        "kill" => {
            let seq = sequence(4242, CHILD_SEQ, 1, 254);
            loop {
                assert_eq!(run(seq.as_ptr(), seq.len()), 0);
            }
        }
        "fork" => {
            let [a, b, c] = fork_sequences();
            assert_eq!(run(a.as_ptr(), a.len()), 0);
            let fork_child: extern "C" fn() = unsafe { std::mem::transmute(m.sym("fork_child")) };
            // SAFETY: the child only runs generated code and _exit.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                fork_child();
                let ok = run(b.as_ptr(), b.len()) == 0;
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            let mut st = 0;
            assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
            assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0);
            println!("GRANDCHILD {pid}");
            assert_eq!(run(c.as_ptr(), c.len()), 0);
            std::process::exit(0);
        }
        "threads" => {
            // More threads than slots: the runtime must stop the program loudly.
            let seq = sequence(1, 1000, 1, 254);
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| run(seq.as_ptr(), seq.len()));
                }
            });
            std::process::exit(0); // not reached if the runtime stops us
        }
        other => panic!("unknown child mode {other}"),
    }
}

fn fork_sequences() -> [Vec<u8>; 3] {
    [
        sequence(31, 50_000, 1, 254),
        sequence(32, 70_000, 1, 254),
        sequence(33, 60_000, 1, 254),
    ]
}

/// Re-executes this test binary in child `mode` with the region's fd.
fn spawn_child(region: &Region, mode: &str) -> std::process::Child {
    region.inherit().unwrap();
    let (k, v) = region.env();
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_helper_writes_until_killed",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(CHILD_ENV, mode)
        .env(k, v)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn fork_child_gets_its_own_stream() {
    let region = Region::create(SMALL).unwrap();
    let child = spawn_child(&region, "fork");
    let mut d = region.drainer();
    let mut streams = Streams::new();
    let mut runtimes = BTreeMap::new();
    let mut sink = |b: aetrace_runtime::Batch<'_>| {
        runtimes.insert(b.slot, b.runtime);
        streams
            .entry(b.slot)
            .or_insert((b.pid, Vec::new()))
            .1
            .extend_from_slice(b.bytes)
    };
    // Drain while it runs (the halves are small), then after it exits.
    let out = std::thread::scope(|s| {
        let h = s.spawn(|| child.wait_with_output().unwrap());
        while !h.is_finished() {
            d.poll(false, &mut sink).unwrap();
            d.wait(Duration::from_millis(1));
        }
        h.join().unwrap()
    });
    d.poll(true, &mut sink).unwrap();
    assert!(
        out.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let grandchild: u32 = stdout
        .lines()
        .find_map(|l| l.split("GRANDCHILD ").nth(1))
        .unwrap_or_else(|| panic!("no grandchild pid in child stdout: {stdout}"))
        .parse()
        .unwrap();
    let runtime: u64 = stdout
        .lines()
        .find_map(|l| l.split("RUNTIME ").nth(1))
        .unwrap_or_else(|| panic!("no runtime address in child stdout: {stdout}"))
        .parse()
        .unwrap();
    // fork_child records the child's own (inherited) runtime address.
    assert_eq!(runtimes, BTreeMap::from([(0, runtime), (1, runtime)]));
    let [a, b, c] = fork_sequences();
    let mut parent = expected_main(11, &a);
    parent.extend(enter_record(11));
    parent.extend_from_slice(&c);
    let mut forked = vec![0xFF, 7, 0, 0, 0, 0]; // FORK(parent slot 0)
    forked.extend(enter_record(11));
    forked.extend_from_slice(&b);
    assert_eq!(streams.len(), 2);
    assert!(streams[&0].1 == parent, "parent stream differs");
    assert_eq!(
        streams[&1].0, grandchild,
        "slot 1 belongs to the fork child"
    );
    assert!(streams[&1].1 == forked, "fork child's stream differs");
}

#[test]
fn missing_environment_and_early_entry_stop_the_program_loudly() {
    let region = Region::create(SMALL).unwrap();
    for (mode, msg) in [
        ("noenv", "neither AETRACE_SHM_FD nor AETRACE_OUT is set"),
        ("early", "ran before the runtime's init"),
    ] {
        let out = spawn_child(&region, mode).wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{mode}: {err}");
        assert!(err.contains(msg), "{mode}: stderr: {err}");
    }
}

#[test]
fn running_out_of_slots_stops_the_program_loudly() {
    let region = Region::create(Geometry {
        slot_count: 2,
        half_size: 12288,
    })
    .unwrap();
    let out = spawn_child(&region, "threads").wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no free thread slot"), "stderr: {err}");
    assert_ne!(region.flags() & FLAG_SLOTS_EXHAUSTED, 0);
}

#[test]
fn sigkilled_child_leaves_an_exact_prefix() {
    let region = Region::create(SMALL).unwrap();
    let mut child = spawn_child(&region, "kill");
    let mut d = region.drainer();
    let got = std::cell::RefCell::new(Vec::new());
    let pid = std::cell::Cell::new(0);
    let start = Instant::now();
    let mut sink = |b: aetrace_runtime::Batch<'_>| {
        pid.set(b.pid);
        got.borrow_mut().extend_from_slice(b.bytes)
    };
    // Let it write a few sequences' worth, then kill it mid-stream.
    while got.borrow().len() < 3 * CHILD_SEQ && start.elapsed() < Duration::from_secs(60) {
        d.poll(false, &mut sink).unwrap();
        d.wait(Duration::from_millis(1));
        if let Ok(Some(st)) = child.try_wait() {
            panic!("child exited early: {st}");
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    d.poll(true, &mut sink).unwrap();
    let got = got.into_inner();
    assert_eq!(pid.get(), child.id());
    assert!(
        got.len() >= 3 * CHILD_SEQ,
        "child wrote too little before the deadline"
    );
    let seq = sequence(4242, CHILD_SEQ, 1, 254);
    let mut want = thread_record(u32::MAX);
    while want.len() < got.len() {
        want.extend(enter_record(11));
        want.extend_from_slice(&seq);
    }
    assert!(
        got[..] == want[..got.len()],
        "drained data is not a prefix of what the child wrote"
    );
    assert_eq!(region.flags() & FLAG_SLOTS_EXHAUSTED, 0);
}

static TRAP_CALLS: AtomicU32 = AtomicU32::new(0);
/// The trap tests share `TRAP_CALLS`: run them one at a time.
static TRAP_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Sets TF with `pushfq; or [rsp],0x100; popfq`; the first single-step trap
/// lands before or after the next instruction (CPUs differ), which the
/// handler below tolerates.
fn set_tf(a: &mut CodeAssembler) {
    a.pushfq().unwrap();
    a.or(qword_ptr(rsp), 0x100).unwrap();
    a.popfq().unwrap();
}

/// Runs `body` (which sets TF just before the instruction it labels `at`)
/// under an instrumented SIGTRAP handler that writes `HANDLER_BLOCK` and
/// clears TF unless the (possibly fixed-up) RIP is still `at`. `body` also
/// labels `after`, where the fix-up must resume, and gets
/// 0x1122334455667788 in rdi.
fn trap_case(body: impl Fn(&mut CodeAssembler, &mut CodeLabel, &mut CodeLabel)) -> TrapRun {
    let _serial = TRAP_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut m = Mapped::new();
    let region = Region::create(SMALL).unwrap();
    TRAP_CALLS.store(0, Ordering::Relaxed);
    let mut a = CodeAssembler::new(64).unwrap();
    let mut at = a.create_label();
    let mut after = a.create_label();
    body(&mut a, &mut at, &mut after);
    a.ret().unwrap();
    let ip = m.next_ip();
    let res = a
        .assemble_options(
            ip,
            iced_x86::BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
        )
        .unwrap();
    let at_ip = res.label_ip(&at).unwrap();
    let after_ip = res.label_ip(&after).unwrap();
    let traced: extern "C" fn(u64) =
        unsafe { std::mem::transmute(m.place(&res.inner.code_buffer)) };
    let rt = m.addrs();
    let mut a = CodeAssembler::new(64).unwrap();
    let mut keep = a.create_label();
    emit_outside_entry(&mut a, HANDLER_PROC, &rt).unwrap();
    a.mov(rax, &TRAP_CALLS as *const AtomicU32 as u64).unwrap();
    a.lock().inc(dword_ptr(rax)).unwrap();
    // rsp -> pretcode; gregs at +48: rip is gregs[16], eflags gregs[17].
    a.mov(rax, at_ip).unwrap();
    a.cmp(qword_ptr(rsp + (48 + 16 * 8)), rax).unwrap();
    a.je(keep).unwrap();
    a.and(qword_ptr(rsp + (48 + 17 * 8)), !0x100i32).unwrap();
    a.set_label(&mut keep).unwrap();
    for w in HANDLER_BLOCK {
        emit_witness(&mut a, w, Site::with_scratch(r11)).unwrap();
    }
    a.ret().unwrap();
    let code = a.assemble(m.next_ip()).unwrap();
    let handler = m.place(&code);
    let saved_gs = get_gs();
    let streams = drain_while(&region, m.base as u64, || {
        m.init(&[region.env()]);
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as usize;
            assert_eq!(libc::sigaction(libc::SIGTRAP, &sa, std::ptr::null_mut()), 0);
        }
        traced(0x1122_3344_5566_7788);
        set_gs(saved_gs);
    });
    TrapRun {
        got: streams[&0].1.clone(),
        calls: TRAP_CALLS.load(Ordering::Relaxed),
        fixups: m.fixups(),
        at: at_ip,
        after: after_ip,
    }
}

/// What a [`trap_case`] observed.
struct TrapRun {
    /// Slot 0's stream.
    got: Vec<u8>,
    /// SIGTRAP deliveries.
    calls: u32,
    /// Pending stores completed at signal entry.
    fixups: u64,
    /// Addresses of the `at` and `after` labels.
    at: u64,
    after: u64,
}

/// SIGNAL(SIGTRAP, rip, xfers) and the handler's ENTER and witnesses.
fn trap_handler_bytes(rip: u64, xfers: u32) -> Vec<u8> {
    let mut v = vec![0xFF, 15, libc::SIGTRAP as u8, 0, 0, 0];
    v.extend(rip.to_le_bytes());
    v.extend(xfers.to_le_bytes());
    v.extend(enter_record(HANDLER_PROC));
    v.extend(HANDLER_BLOCK);
    v
}

const INDIRECT_RECORD: [u8; 10] = [0xFF, 2, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11];

/// `emit_record(INDIRECT(rdi))` with scratch rcx, as the individual
/// instructions a test can interleave with a TF trick; checked against the
/// emitter so the tests exercise the real encoding.
fn indirect_parts(a: &mut CodeAssembler, step: usize, at: &mut CodeLabel) {
    let parts: [&dyn Fn(&mut CodeAssembler); 5] = [
        &|a| a.mov(ecx, 10u32).unwrap(),
        &|a| a.xadd(qword_ptr(0u64).gs(), rcx).unwrap(),
        &|a| a.mov(word_ptr(rcx), 0x82FFu32).unwrap(),
        &|a| a.mov(qword_ptr(rcx + 2), rdi).unwrap(),
        &|a| a.mov(byte_ptr(rcx + 1), 2u32).unwrap(),
    ];
    for (i, p) in parts.iter().enumerate() {
        if i == step {
            set_tf(a);
            a.set_label(at).unwrap();
        }
        p(a);
    }
}

#[test]
fn indirect_parts_match_the_emitter() {
    let mut a = CodeAssembler::new(64).unwrap();
    emit_record(
        &mut a,
        RecordKind::Indirect,
        Payload::Reg64(rdi),
        Site::with_scratch(rcx),
    )
    .unwrap();
    let mut b = CodeAssembler::new(64).unwrap();
    let mut unused = b.create_label();
    indirect_parts(&mut b, usize::MAX, &mut unused);
    assert_eq!(a.assemble(0x1000).unwrap(), b.assemble(0x1000).unwrap());
}

/// A single-step trap lands between a witness's `xadd` and its store: the
/// instrumented SIGTRAP handler's entry must complete the store and step
/// RIP over it: witness, SIGNAL(SIGTRAP, after the store), handler, next
/// witness. Three transfer-count increments ran before: SIGNAL carries 3.
#[test]
fn signal_entry_completes_an_interrupted_witness_store() {
    let t = trap_case(|a, at, after| {
        for _ in 0..3 {
            emit_transfer(a, Site::with_scratch(rcx)).unwrap();
        }
        emit_witness(a, 0x21, Site::with_scratch(rcx)).unwrap();
        a.mov(ecx, 1u32).unwrap();
        set_tf(a);
        a.set_label(at).unwrap();
        a.xadd(qword_ptr(0u64).gs(), rcx).unwrap();
        a.mov(byte_ptr(rcx), 0x55u32).unwrap();
        a.set_label(after).unwrap();
        emit_witness(a, 0x66, Site::with_scratch(rcx)).unwrap();
    });
    assert!((1..=2).contains(&t.calls), "{} traps", t.calls);
    let mut want = thread_record(u32::MAX);
    want.push(0x21);
    if t.calls == 2 {
        want.extend(trap_handler_bytes(t.at, 3)); // the trap before the xadd
    }
    want.push(0x55);
    want.extend(trap_handler_bytes(t.after, 3));
    want.push(0x66);
    assert_eq!(t.got, want);
    assert_eq!(
        t.fixups, 1,
        "the pending store was not completed at signal entry"
    );
}

/// The same for a 10-byte INDIRECT record, trapped right after its `xadd`
/// (case A: header, payload and kind emulated) and after its header
/// (case B: found by the pending header; payload/kind emulated).
#[test]
fn signal_entry_completes_an_interrupted_record() {
    for step in [1usize, 3] {
        let t = trap_case(|a, at, after| {
            indirect_parts(a, step, at);
            a.set_label(after).unwrap();
            emit_witness(a, 0x66, Site::with_scratch(rcx)).unwrap();
        });
        let mut want = thread_record(u32::MAX);
        if step == 1 && t.calls == 2 {
            want.extend(trap_handler_bytes(t.at, 0)); // the trap before the xadd
        } else {
            assert_eq!(t.calls, 1, "step {step}");
        }
        want.extend(INDIRECT_RECORD);
        want.extend(trap_handler_bytes(t.after, 0));
        want.push(0x66);
        assert_eq!(t.got, want, "step {step}");
        assert_eq!(
            t.fixups, 1,
            "step {step}: the pending record was not completed"
        );
    }
}

/// An instrumented shared library's runtime copy (`module_tag` != 0, no
/// init of its own) entered by a thread that owns a slot through the
/// executable's runtime: it attaches to the same region, writes into the
/// thread's own stream, claims no slot, and publishes its address in the
/// header's module table under its tag.
#[test]
fn a_library_runtime_attaches_to_the_executables_region() {
    use aetrace_runtime::layout::TAG_SHIFT;
    let mut exe = Mapped::new();
    let mut lib = Mapped::new();
    unsafe { *(lib.sym("module_tag") as *mut u64) = 3 };
    let region = Region::create(SMALL).unwrap();
    let site = Site::with_scratch(r11);
    let run_exe = runner(&mut exe, 7, site);
    let lib_proc = 3 << TAG_SHIFT | 5;
    let run_lib = runner(&mut lib, lib_proc, site);
    let a = sequence(0x51, 20_000, 1, 254);
    let b = sequence(0x52, 30_000, 1, 254);
    let saved_gs = get_gs();
    assert_eq!(region.module_runtime(3), 0);
    let streams = drain_while(&region, exe.base as u64, || {
        exe.init(&[region.env()]);
        assert_eq!(run_exe(a.as_ptr(), a.len()), 0);
        assert_eq!(run_lib(b.as_ptr(), b.len()), 0);
        assert_eq!(run_exe(a.as_ptr(), 10), 0);
        set_gs(saved_gs);
    });
    assert_eq!(streams.len(), 1, "the library claimed no slot of its own");
    let mut want = expected_main(7, &a);
    want.extend(enter_record(lib_proc));
    want.extend_from_slice(&b);
    want.extend(enter_record(7));
    want.extend_from_slice(&a[..10]);
    assert!(streams[&0].1 == want, "stream differs");
    assert_eq!(region.module_runtime(3), lib.base as u64);
    assert_eq!(region.module_runtime(2), 0);
}

/// Instructions of `flush` a signal can interrupt (signals unblocked),
/// decoded from the blob: `(before, after)` = from its entry up to and
/// including the `syscall` that blocks signals, and from after the one
/// that restores the mask up to and including the `ret`.
fn flush_unblocked_instructions(m: &Mapped) -> (usize, usize) {
    let start = m.blob.symbol("flush").unwrap();
    let code = &m.blob.bytes[start as usize..m.blob.data_offset as usize];
    let mut d = iced_x86::Decoder::with_ip(64, code, start, 0);
    let insns: Vec<iced_x86::Instruction> = d.iter().collect();
    let ret = insns
        .iter()
        .position(|i| i.mnemonic() == iced_x86::Mnemonic::Ret)
        .unwrap();
    let syscalls: Vec<usize> = insns[..ret]
        .iter()
        .enumerate()
        .filter(|(_, i)| i.mnemonic() == iced_x86::Mnemonic::Syscall)
        .map(|(k, _)| k)
        .collect();
    (syscalls[0] + 1, ret - syscalls[syscalls.len() - 1])
}

/// A signal delivered inside `flush` while signals are not blocked is
/// reported at the `call flush` that the buffer check made: SIGNAL's rip
/// is flush's return address, never an address in the runtime.
///
/// The writer thread fills half 0 to its limit and calls `flush` with the
/// trap flag set, so every instruction of flush's prologue traps until
/// the handler clears TF at the `syscall` that blocks signals (the first
/// handler's own check flushes half 0, nested). The outer `flush` then
/// seals half 1 and waits for half 0; meanwhile this thread sends the
/// writer SIGUSR1, which becomes pending and is delivered right after the
/// `syscall` that restores the mask, once half 0 is drained; its handler
/// sets TF, so every instruction of the epilogue traps too.
#[test]
fn a_signal_inside_flush_is_reported_at_its_call() {
    signal_inside_flush(false);
}

/// The same where the `flush` is a library runtime's (module tag 3,
/// attached to the region first) and the handler's outside-entry stub the
/// executable's: its `signal_entry` finds the library's blob in the
/// region's module table.
#[test]
fn a_signal_inside_another_modules_flush_is_reported_at_its_call() {
    signal_inside_flush(true);
}

fn signal_inside_flush(library: bool) {
    use aetrace_runtime::layout::TAG_SHIFT;
    let _serial = TRAP_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut m = Mapped::new();
    let mut lib = Mapped::new();
    unsafe { *(lib.sym("module_tag") as *mut u64) = 3 };
    let lib_proc = 3 << TAG_SHIFT | 5;
    let attach_lib = runner(&mut lib, lib_proc, Site::with_scratch(r11));
    let region = Region::create(SMALL).unwrap();
    let rt = m.addrs();
    let flush = if library { lib.addrs().flush } else { rt.flush };
    // Stream bytes before the call: THREAD, (the library's ENTER and
    // witness), ENTER, then witnesses up to LIMIT.
    let n = (SMALL.half_size - 4096 - 12 - if library { 7 } else { 0 }) as u32;
    let mut a = CodeAssembler::new(64).unwrap();
    let mut lp = a.create_label();
    let mut call_at = a.create_label();
    let mut after = a.create_label();
    emit_outside_entry(&mut a, 7, &rt).unwrap();
    a.push(rbx).unwrap();
    a.mov(ebx, n).unwrap();
    a.set_label(&mut lp).unwrap();
    emit_witness(&mut a, 0x21, Site::with_scratch(rcx)).unwrap();
    a.dec(ebx).unwrap();
    a.jnz(lp).unwrap();
    set_tf(&mut a);
    a.set_label(&mut call_at).unwrap();
    a.call(flush).unwrap();
    a.set_label(&mut after).unwrap();
    emit_witness(&mut a, 0x66, Site::with_scratch(rcx)).unwrap();
    a.pop(rbx).unwrap();
    a.ret().unwrap();
    let res = a
        .assemble_options(
            m.next_ip(),
            iced_x86::BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
        )
        .unwrap();
    let (call_ip, ret_ip) = (
        res.label_ip(&call_at).unwrap(),
        res.label_ip(&after).unwrap(),
    );
    let traced: extern "C" fn() = unsafe { std::mem::transmute(m.place(&res.inner.code_buffer)) };

    // The handler (SIGTRAP and SIGUSR1): SIGUSR1 sets TF; a trap clears it
    // at a `syscall` or back at the return address, else keeps it.
    let mut a = CodeAssembler::new(64).unwrap();
    let mut set = a.create_label();
    let mut clear = a.create_label();
    let mut keep = a.create_label();
    emit_outside_entry(&mut a, HANDLER_PROC, &rt).unwrap();
    // rsp -> pretcode; gregs at +48: rip is gregs[16], eflags gregs[17].
    a.mov(rax, qword_ptr(rsp + (48 + 16 * 8))).unwrap();
    a.cmp(edi, libc::SIGUSR1).unwrap();
    a.je(set).unwrap();
    a.mov(rcx, ret_ip).unwrap();
    a.cmp(rax, rcx).unwrap();
    a.je(clear).unwrap();
    a.cmp(word_ptr(rax), 0x050F).unwrap();
    a.je(clear).unwrap();
    a.jmp(keep).unwrap();
    a.set_label(&mut set).unwrap();
    a.or(qword_ptr(rsp + (48 + 17 * 8)), 0x100).unwrap();
    a.jmp(keep).unwrap();
    a.set_label(&mut clear).unwrap();
    a.and(qword_ptr(rsp + (48 + 17 * 8)), !0x100i32).unwrap();
    a.set_label(&mut keep).unwrap();
    for w in HANDLER_BLOCK {
        emit_witness(&mut a, w, Site::with_scratch(r11)).unwrap();
    }
    a.ret().unwrap();
    let handler = m.place(&a.assemble(m.next_ip()).unwrap());

    let tid = std::sync::atomic::AtomicI32::new(0);
    let stop = AtomicBool::new(false);
    let mut got = Vec::new();
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            tid.store(unsafe { libc::gettid() }, Ordering::Release);
            let saved_gs = get_gs();
            m.init(&[region.env()]);
            if library {
                assert_eq!(attach_lib([0x42].as_ptr(), 1), 0);
            }
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = handler as usize;
                for sig in [libc::SIGTRAP, libc::SIGUSR1] {
                    assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
                }
            }
            traced();
            set_gs(saved_gs);
            stop.store(true, Ordering::Release);
        });
        // Both halves sealed: the writer waits inside flush, signals blocked.
        let t = Instant::now();
        while region.ready_word().load(Ordering::Acquire) < 2 {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "flush never sealed half 1"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let tid = tid.load(Ordering::Acquire);
        let pid = std::process::id() as i32;
        assert_eq!(
            unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGUSR1) },
            0
        );
        let mut d = region.drainer();
        let mut sink = |b: aetrace_runtime::Batch<'_>| got.extend_from_slice(b.bytes);
        while !stop.load(Ordering::Acquire) {
            d.poll(false, &mut sink).unwrap();
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the writer never finished"
            );
            d.wait(Duration::from_millis(1));
        }
        writer.join().unwrap();
        d.poll(true, &mut sink).unwrap();
    });

    let mut want = thread_record(u32::MAX);
    if library {
        want.extend(enter_record(lib_proc));
        want.push(0x42);
        assert_eq!(region.module_runtime(3), lib.base as u64);
    }
    want.extend(enter_record(7));
    want.extend(std::iter::repeat_n(0x21, n as usize));
    assert!(got.starts_with(&want), "the stream before the call differs");
    let mut rest = &got[want.len()..];
    let mut signals = Vec::new();
    while rest.len() >= 18 && rest[..2] == [0xFF, 15] {
        let signo = u32::from_le_bytes(rest[2..6].try_into().unwrap());
        let rip = u64::from_le_bytes(rest[6..14].try_into().unwrap());
        let mut group = enter_record(HANDLER_PROC);
        group.extend(HANDLER_BLOCK);
        assert!(
            rest[18..].starts_with(&group),
            "handler bytes after SIGNAL {signo}"
        );
        signals.push((signo, rip));
        rest = &rest[18 + group.len()..];
    }
    assert_eq!(rest, [0x66], "the stream after the call differs");
    let trap = libc::SIGTRAP as u32;
    // The first trap lands before or after the `call` (CPUs differ).
    if signals.first() == Some(&(trap, call_ip)) {
        signals.remove(0);
    }
    let (before, after) = flush_unblocked_instructions(&m);
    let usr1 = signals
        .iter()
        .position(|&s| s == (libc::SIGUSR1 as u32, ret_ip))
        .unwrap_or_else(|| panic!("no SIGUSR1 at the return address: {signals:x?}"));
    assert!(
        signals[..usr1] == vec![(trap, ret_ip); before],
        "{before} traps in flush's prologue, each at the return address {ret_ip:#x}: {signals:x?}"
    );
    // The first trap after sigreturn comes after one instruction (or before it).
    let tail = &signals[usr1 + 1..];
    assert!(
        (tail.len() == after || tail.len() == after + 1) && tail.iter().all(|&s| s == (trap, ret_ip)),
        "{after} traps in flush's epilogue, the last back at the return address {ret_ip:#x}: {signals:x?}"
    );
}
