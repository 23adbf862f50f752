//! End-to-end tests of the generated runtime and the buffer protocol: the
//! blob and generated witness routines run in this process (or a re-executed
//! child), the recorder-side drainer reads the region concurrently, and the
//! drained streams are compared with the sequences the routines were given.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use aetrace_runtime::emit::{
    emit_buffer_check, emit_outside_entry, emit_record, emit_rsp_record, emit_transfer, emit_value,
    emit_witness, emit_witness_checked, FlagsSave, Payload, Site, Value, STUB_INSNS,
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
    let mut out = Streams::new();
    let errors = drain_into(region, work, |b| {
        assert_eq!(b.runtime, runtime, "slot {}: runtime address", b.slot);
        out.entry(b.slot)
            .or_insert((b.pid, Vec::new()))
            .1
            .extend_from_slice(b.bytes)
    });
    (out, errors)
}

/// Runs `work` while another thread drains `region` into `sink`; returns
/// the errors `poll` reported.
fn drain_into(
    region: &Region,
    work: impl FnOnce(),
    mut sink: impl FnMut(aetrace_runtime::Batch<'_>) + Send,
) -> Vec<String> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let mut d = region.drainer();
            let mut errors = Vec::new();
            while !stop.load(Ordering::Acquire) {
                if let Err(e) = d.poll(false, &mut sink) {
                    errors.push(e.to_string());
                }
                d.wait(Duration::from_millis(1));
            }
            if let Err(e) = d.poll(true, &mut sink) {
                errors.push(e.to_string());
            }
            errors
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

/// The stream of a thread the main thread (slot 0) created, whose first
/// traced code is procedure `proc_id` writing `seq`.
fn expected_thread(proc_id: u32, seq: &[u8]) -> Vec<u8> {
    let mut e = thread_record(0);
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
    let mut want: Vec<Vec<u8>> = seqs.iter().map(|seq| expected_thread(3, seq)).collect();
    got.sort();
    want.sort();
    assert!(got == want, "per-thread streams differ");
}

/// Slot reuse: threads in waves, more of them than the region has slots
/// (8), while the drainer reclaims the slot of each thread that has
/// exited (`Drainer::exited`, `Drainer::reclaim`). Each thread writes
/// enough to seal halves, so a reclaimed slot has a sealed half, a
/// partial one, SEQ and fills to reset. Every stream, the ones ended by a
/// reclaim and the ones still open at the end, must be exactly one
/// thread's: THREAD(0), its ENTER, its sequence, nothing of a previous
/// owner of the slot; a thread that finds every slot taken waits for the
/// drainer (it would stop with "no free thread slot" without reuse).
#[test]
fn reclaimed_slots_start_clean_streams_for_new_threads() {
    const WAVES: u64 = 6;
    const WAVE: u64 = 3;
    let mut m = Mapped::new();
    let region = Region::create(SMALL).unwrap();
    let site = Site::with_scratch(r10);
    let run = runner(&mut m, 3, site);
    let seqs: Vec<Vec<u8>> = (0..WAVES * WAVE)
        .map(|t| sequence(500 + 2 * t, 20_000 + 997 * t as usize, 1, 254))
        .collect();
    let saved_gs = get_gs();
    let stop = AtomicBool::new(false);
    let (ended, open) = std::thread::scope(|s| {
        let drainer = s.spawn(|| {
            let mut d = region.drainer();
            let open = std::cell::RefCell::new(Streams::new());
            let mut ended: Vec<Vec<u8>> = Vec::new();
            let mut sink = |b: aetrace_runtime::Batch<'_>| {
                open.borrow_mut()
                    .entry(b.slot)
                    .or_insert((b.pid, Vec::new()))
                    .1
                    .extend_from_slice(b.bytes)
            };
            let start = Instant::now();
            while !stop.load(Ordering::Acquire) {
                assert!(start.elapsed() < Duration::from_secs(120), "stuck");
                d.poll(false, &mut sink).unwrap();
                for slot in d.exited(&mut || false) {
                    d.reclaim(slot, &mut sink).unwrap();
                    let (_, bytes) = open.borrow_mut().remove(&slot).expect("it had written");
                    ended.push(bytes);
                }
                d.free_released();
                d.wait(Duration::from_millis(1));
            }
            d.poll(true, &mut sink).unwrap();
            (ended, open.into_inner())
        });
        m.init(&[region.env()]);
        for wave in seqs.chunks(WAVE as usize) {
            std::thread::scope(|s| {
                for seq in wave {
                    s.spawn(move || assert_eq!(run(seq.as_ptr(), seq.len()), 0));
                }
            });
        }
        set_gs(saved_gs);
        stop.store(true, Ordering::Release);
        drainer.join().unwrap()
    });
    assert!(
        ended.len() as u64 >= WAVES * WAVE - u64::from(SMALL.slot_count),
        "only {} streams reclaimed",
        ended.len()
    );
    assert_eq!(
        open[&0].1,
        thread_record(u32::MAX),
        "the main thread's slot"
    );
    let mut got = ended;
    got.extend(
        open.into_iter()
            .filter(|(slot, _)| *slot != 0)
            .map(|(_, (_, b))| b),
    );
    // More streams than slots: some slot was claimed again.
    assert!(
        got.len() >= SMALL.slot_count as usize,
        "{} streams",
        got.len()
    );
    let mut want: Vec<Vec<u8>> = seqs.iter().map(|seq| expected_thread(3, seq)).collect();
    got.sort();
    want.sort();
    assert_eq!(got.len(), want.len(), "one stream per thread");
    assert!(got == want, "a stream differs from its thread's sequence");
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
            // The handler's return: SIGRETURN with the SIGNAL's rip.
            assert_eq!(got[i + 28..i + 30], [0xFF, 20], "byte {i}: SIGRETURN");
            assert_eq!(
                got[i + 30..i + 38],
                got[i + 6..i + 14],
                "byte {i}: SIGRETURN's rip"
            );
            k += 1;
            i += 38;
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
    emit_record(&mut a, RecordKind::Return, Payload::None, site).unwrap();
    emit_record(&mut a, RecordKind::Wide, Payload::Imm16(0x1234), site).unwrap();
    emit_witness(&mut a, 0x42, site).unwrap();
    // `rsp` as the code around sees it, whatever the sequence pushes.
    emit_rsp_record(&mut a, RecordKind::Setjmp, None, site).unwrap();
    let resume = Some((0x0100_0007, 3));
    emit_rsp_record(
        &mut a,
        RecordKind::SetjmpResume,
        resume,
        Site::with_scratch(r11),
    )
    .unwrap();
    a.ret().unwrap();
    assert!(emit_record(&mut a, RecordKind::SetjmpResume, Payload::None, site).is_err());
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
    want.extend([0xFF, 10]);
    want.extend([0xFF, 9, 0x34, 0x12]);
    want.push(0x42);
    let got = &streams[&0].1;
    assert_eq!(got[..want.len()], want[..]);
    let rest = &got[want.len()..];
    assert_eq!(rest.len(), 10 + 18);
    assert_eq!(
        (&rest[..2], &rest[10..16]),
        (&[0xFF, 13][..], &[0xFF, 4, 7, 0, 0, 1][..])
    );
    assert_eq!(&rest[24..], &[3, 0, 0, 0]);
    let stack = u64::from_le_bytes(rest[2..10].try_into().unwrap());
    assert_eq!(
        rest[16..24],
        stack.to_le_bytes(),
        "SETJMP_RESUME's rsp is SETJMP's"
    );
    // Inside `f`, called with the stack aligned: 8 below a multiple of 16,
    // on this thread's stack.
    let local = 0u8;
    let here = std::ptr::addr_of!(local) as u64;
    assert!(
        stack % 16 == 8 && here.abs_diff(stack) < 1 << 20,
        "rsp {stack:#x}, a local at {here:#x}"
    );
}

/// A witness with its own buffer check (a loop's back edge into its
/// header, `emit_witness_checked`) flushes when the reserved address
/// reaches LIMIT and jumps to its target: 100,000 of them, eight times
/// SMALL's half, drain as the bytes written, with a dead scratch register
/// (the check's branch goes to the target) and with none (flags and red
/// zone live: everything restored first). Without the check the writer
/// would run past its half.
#[test]
fn a_witness_with_its_own_check_flushes_and_continues_at_its_target() {
    for site in [Site::with_scratch(r11), Site::CONSERVATIVE] {
        let mut m = Mapped::new();
        let region = Region::create(SMALL).unwrap();
        let mut a = CodeAssembler::new(64).unwrap();
        // The target first, at the placed code's start: `ret`.
        let then = m.next_ip();
        a.ret().unwrap();
        emit_witness_checked(&mut a, 0x42, m.addrs().flush, site, then).unwrap();
        let code = a.assemble(m.next_ip()).unwrap();
        let f: extern "C" fn() = unsafe { std::mem::transmute(m.place(&code) + 1) };
        let calls = 100_000;
        let saved_gs = get_gs();
        let streams = drain_while(&region, m.base as u64, || {
            m.init(&[region.env()]);
            for _ in 0..calls {
                f();
            }
            set_gs(saved_gs);
        });
        let mut want = thread_record(u32::MAX);
        want.extend(std::iter::repeat(0x42).take(calls));
        assert!(streams[&0].1 == want, "{site:?}: the stream differs");
    }
}

/// The drainer hands over where each batch's VALUE records are (the
/// recorder's `zstd+values` codec takes them from there, scanning nothing
/// again): across flushes and batches, and with values whose bytes look
/// like a VALUE record's start.
#[test]
fn the_drainer_hands_over_the_value_offsets() {
    let mut m = Mapped::new();
    let region = Region::create(SMALL).unwrap();
    let mut a = CodeAssembler::new(64).unwrap();
    let site = Site::CONSERVATIVE;
    // Room for the 33 bytes below (the rewriter's checks do this).
    emit_buffer_check(&mut a, m.addrs().flush, site).unwrap();
    emit_witness(&mut a, 0x42, site).unwrap();
    emit_value(&mut a, Value::Reg(rdi), site).unwrap();
    emit_value(&mut a, Value::Reg(rsi), site).unwrap();
    emit_record(&mut a, RecordKind::Return, Payload::None, site).unwrap();
    emit_value(&mut a, Value::Reg(rdi), site).unwrap();
    a.ret().unwrap();
    let code = a.assemble(m.next_ip()).unwrap();
    let f: extern "C" fn(u64, u64) = unsafe { std::mem::transmute(m.place(&code)) };
    let saved_gs = get_gs();
    let (mut got, mut at) = (Vec::new(), Vec::new());
    let calls = 3000u64; // 99 kB: eight halves of SMALL
    let errors = drain_into(
        &region,
        || {
            m.init(&[region.env()]);
            for i in 0..calls {
                f(0xFF12_FF12_FF12_FF12 ^ i, i);
            }
            set_gs(saved_gs);
        },
        |b| {
            at.extend(b.values.iter().map(|&v| v + got.len()));
            got.extend_from_slice(b.bytes);
        },
    );
    assert!(errors.is_empty(), "drainer errors: {errors:?}");
    let mut want = thread_record(u32::MAX);
    let mut want_at = Vec::new();
    let value = |want: &mut Vec<u8>, want_at: &mut Vec<usize>, v: u64| {
        want_at.push(want.len());
        want.extend([0xFF, RecordKind::Value as u8]);
        want.extend(v.to_le_bytes());
    };
    for i in 0..calls {
        want.push(0x42);
        value(&mut want, &mut want_at, 0xFF12_FF12_FF12_FF12 ^ i);
        value(&mut want, &mut want_at, i);
        want.extend([0xFF, RecordKind::Return as u8]);
        value(&mut want, &mut want_at, 0xFF12_FF12_FF12_FF12 ^ i);
    }
    let differ = got.iter().zip(&want).position(|(g, w)| g != w);
    assert!(got == want, "the stream differs at {differ:?}");
    assert_eq!(at, want_at);
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
/// forever; `fork`: write, fork, write in both; `dispositions`: see
/// [`check_dispositions`]; `threads`: exceed the slots;
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
        "walk" => {
            // What the program sees: no variable, no descriptor of ours
            // (the harness's inherited ones aside), before or after init.
            let env = std::env::vars().any(|(k, _)| k.starts_with("AETRACE_SHM"));
            let fds: Vec<_> = std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            m.init(&[]);
            let after: Vec<_> = std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            let region_fd = aetrace_runtime::layout::REGION_FD.to_string();
            if !env && fds == after && !fds.contains(&region_fd) {
                println!("ENV_AND_FDS_NATIVE");
            } else {
                println!("env {env} fds {fds:?} after init {after:?}");
            }
            let seq = walk_sequence();
            assert_eq!(run(seq.as_ptr(), seq.len()), 0);
            std::process::exit(0);
        }
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
        "clone_thread" => {
            // A new thread calls fork_child first, as right after a traced
            // clone3: it claims a slot of its own with THREAD.
            let [a, b, c] = fork_sequences();
            assert_eq!(run(a.as_ptr(), a.len()), 0);
            let fork_child: extern "C" fn() = unsafe { std::mem::transmute(m.sym("fork_child")) };
            let ok = std::thread::spawn(move || {
                fork_child();
                run(b.as_ptr(), b.len()) == 0
            });
            assert!(ok.join().unwrap());
            assert_eq!(run(c.as_ptr(), c.len()), 0);
            std::process::exit(0);
        }
        "maps" => {
            check_maps_view(&m);
            println!("MAPS_OK");
            std::process::exit(0);
        }
        "dispositions" => {
            check_dispositions(&m);
            println!("DISPOSITIONS_OK");
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

/// Calls the entry point at `at` as the rewriter does: at a call's
/// return point (rax: what it returned) or before it (rdi: its first
/// argument). Entry points preserve every register.
fn call_entry(at: u64, returned: u64, first: u64) {
    // SAFETY: the entry point preserves every register and the flags and
    // touches only the stack below rsp.
    unsafe { std::arch::asm!("call {f}", f = in(reg) at, in("rax") returned, in("rdi") first) }
}

/// `readlink` of a descriptor.
fn fd_link(fd: i32) -> String {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .unwrap()
        .display()
        .to_string()
}

/// In a child after `init`: a descriptor of `/proc/self/maps` becomes a
/// read-only view at the same number, without the region, made again by
/// a read from offset 0 (a mapping made after the open is in it); other
/// files and `FILE`s of other files are left alone; no descriptor is
/// left behind.
fn check_maps_view(m: &Mapped) {
    let (opened_fd, opened_file, read) = (
        m.sym("maps_opened_fd"),
        m.sym("maps_opened_file"),
        m.sym("maps_read"),
    );
    let raw = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(raw.contains("aetrace-witnesses"), "{raw}");
    // SAFETY: plain libc calls on owned descriptors and a fresh mapping.
    unsafe {
        let fd = libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        assert!(fd >= 0);
        call_entry(opened_fd, fd as u64, 0);
        assert_eq!(fd_link(fd), "/memfd:aetrace-maps (deleted)");
        assert_eq!(libc::fcntl(fd, libc::F_GETFD), libc::FD_CLOEXEC);
        assert_eq!(
            libc::fcntl(fd, libc::F_GETFL) & libc::O_ACCMODE,
            libc::O_RDONLY
        );
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        call_entry(read, 0, fd as u64);
        let mut text = vec![0u8; 1 << 16];
        let n = libc::read(fd, text.as_mut_ptr().cast(), text.len());
        let text = String::from_utf8_lossy(&text[..n.max(0) as usize]).to_string();
        assert!(!text.contains("aetrace"), "{text}");
        assert!(text.contains(&format!("{:x}-", p as u64)), "{text}");
        // Not at offset 0: not made again.
        call_entry(read, 0, fd as u64);
        assert_eq!(libc::read(fd, text.as_ptr() as *mut _, 1), 0);
        libc::close(fd);
        // Another file, and a FILE of it: left alone.
        let other = libc::open(c"/proc/self/stat".as_ptr(), libc::O_RDONLY);
        call_entry(opened_fd, other as u64, 0);
        assert!(fd_link(other).ends_with("/stat"));
        let f = libc::fopen(c"/proc/self/maps".as_ptr(), c"r".as_ptr());
        call_entry(opened_file, f as u64, 0);
        assert_eq!(fd_link(libc::fileno(f)), "/memfd:aetrace-maps (deleted)");
        // The temporary descriptors are closed.
        let next = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        assert_eq!(next, libc::fileno(f) + 1);
        libc::fclose(f);
    }
}

/// The program's view of its maps (docs/runtime.md section 5), in a
/// child, since it replaces its descriptors.
#[test]
fn a_descriptor_of_the_maps_becomes_the_view() {
    let region = Region::create(SMALL).unwrap();
    let out = spawn_child(&region, "maps").wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("MAPS_OK"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A kernel `sigaction`, as `rt_sigaction` reads and writes it.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct KernelAction {
    handler: u64,
    flags: u64,
    restorer: u64,
    mask: u64,
}

/// The kernel's disposition of `sig`, read with the raw system call.
fn kernel_action(sig: i32) -> KernelAction {
    let mut k = KernelAction::default();
    let null = std::ptr::null::<KernelAction>();
    // SAFETY: the kernel writes one sigaction of 8-byte mask.
    let r = unsafe { libc::syscall(libc::SYS_rt_sigaction, sig, null, &mut k, 8) };
    assert_eq!(r, 0, "rt_sigaction({sig})");
    k
}

/// In a child after `init`: the runtime's `fault` holds SIGFPE (not
/// SIGSEGV, which Rust's runtime handles); between
/// `dispositions_native` and `dispositions_ours` the kernel holds what
/// the program set, a handler, `SIG_IGN` or `SIG_DFL` with its flags and
/// mask, and after them `fault` stands in for `SIG_DFL` only; nested
/// calls swap back at the last one.
fn check_dispositions(m: &Mapped) {
    let fault = m.sym("fault");
    // SAFETY: entry points that preserve every register.
    let native: extern "C" fn() = unsafe { std::mem::transmute(m.sym("dispositions_native")) };
    let ours: extern "C" fn() = unsafe { std::mem::transmute(m.sym("dispositions_ours")) };
    let dfl = KernelAction::default();
    assert_eq!(kernel_action(libc::SIGFPE).handler, fault, "after init");
    assert_eq!(kernel_action(libc::SIGINT), dfl, "SIGINT untouched");
    native();
    assert_eq!(kernel_action(libc::SIGFPE), dfl, "exec's SIG_DFL");
    // What the program sets, through libc as it would.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = libc::SIG_DFL;
        sa.sa_flags = libc::SA_NODEFER;
        libc::sigaddset(&mut sa.sa_mask, libc::SIGUSR1);
        assert_eq!(libc::sigaction(libc::SIGFPE, &sa, std::ptr::null_mut()), 0);
        libc::signal(libc::SIGSYS, libc::SIG_IGN);
    }
    let set = kernel_action(libc::SIGFPE);
    ours();
    assert_eq!(
        kernel_action(libc::SIGFPE).handler,
        fault,
        "SIG_DFL taken over"
    );
    assert_eq!(kernel_action(libc::SIGSYS).handler, libc::SIG_IGN as u64);
    native();
    native();
    ours();
    assert_eq!(
        kernel_action(libc::SIGFPE),
        set,
        "the program's flags and mask, nested"
    );
    ours();
    assert_eq!(
        kernel_action(libc::SIGFPE).handler,
        fault,
        "after the last call"
    );
    assert_eq!(set.flags & libc::SA_NODEFER as u64, libc::SA_NODEFER as u64);
    assert_eq!(set.mask, 1 << (libc::SIGUSR1 - 1));
}

/// The runtime's `fault` never shows to the program's disposition calls
/// (docs/runtime.md section 5, "Fatal signals"), in a child, since it
/// takes over SIGFPE.
#[test]
fn dispositions_are_the_programs_own_around_its_calls() {
    let region = Region::create(SMALL).unwrap();
    let out = spawn_child(&region, "dispositions")
        .wait_with_output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("DISPOSITIONS_OK"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn fork_sequences() -> [Vec<u8>; 3] {
    [
        sequence(31, 50_000, 1, 254),
        sequence(32, 70_000, 1, 254),
        sequence(33, 60_000, 1, 254),
    ]
}

/// Runs the child in `mode` on `region`, handing `sink` what it writes:
/// drained while it runs (the halves are small), then after it exits.
fn drain_child(
    region: &Region,
    mode: &str,
    sink: &mut dyn FnMut(aetrace_runtime::Batch<'_>),
) -> std::process::Output {
    let child = spawn_child(region, mode);
    let mut d = region.drainer();
    let out = std::thread::scope(|s| {
        let h = s.spawn(|| child.wait_with_output().unwrap());
        while !h.is_finished() {
            d.poll(false, &mut *sink).unwrap();
            d.wait(Duration::from_millis(1));
        }
        h.join().unwrap()
    });
    d.poll(true, sink).unwrap();
    out
}

/// `fork_child` called by a new thread (tid not its pid: a static
/// glibc's traced `clone3` for `pthread_create`) claims a slot with
/// THREAD(its creator's slot), and the creator's stream goes on in its
/// own.
#[test]
fn fork_child_in_a_new_thread_claims_a_thread_slot() {
    let region = Region::create(SMALL).unwrap();
    let mut streams = Streams::new();
    let out = drain_child(&region, "clone_thread", &mut |b| {
        streams
            .entry(b.slot)
            .or_insert((b.tid, Vec::new()))
            .1
            .extend_from_slice(b.bytes)
    });
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let [a, b, c] = fork_sequences();
    let mut main = expected_main(11, &a);
    main.extend(enter_record(11));
    main.extend_from_slice(&c);
    let mut thread = vec![0xFF, 8, 0, 0, 0, 0]; // THREAD(creator's slot 0)
    thread.extend(enter_record(11));
    thread.extend_from_slice(&b);
    assert_eq!(streams.len(), 2);
    assert_ne!(streams[&0].0, streams[&1].0, "two threads");
    assert!(streams[&0].1 == main, "the creator's stream differs");
    assert!(streams[&1].1 == thread, "the new thread's stream differs");
}

/// The descriptor at which [`spawn_child`] hands the child the region.
const CHILD_FD: i32 = 100;

/// Re-executes this test binary in child `mode`, with the region's fd at
/// [`CHILD_FD`] named by `AETRACE_SHM_FD` (the region is not published:
/// tests run in parallel, each with its own region).
fn spawn_child(region: &Region, mode: &str) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let fd = region.fd();
    let mut cmd = child_command(mode);
    cmd.env(region.env().0, CHILD_FD.to_string());
    // SAFETY: one async-signal-safe call between fork and exec; dup2's
    // copy is not close-on-exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(fd, CHILD_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

/// This test binary in child `mode`, its output piped, given no region.
fn child_command(mode: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_helper_writes_until_killed",
        "--test-threads=1",
        "--nocapture",
    ])
    .env(CHILD_ENV, mode)
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    cmd
}

/// Tests that publish a region (`Region::publish`: one per process) or
/// rely on none being published.
static PUBLISHED: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Without any variable, `init` finds the region its nearest publishing
/// ancestor holds: the parent (this process), and through an
/// intermediate process that holds none (`sh`, which the child's `init`
/// walks past); the child inherits no descriptor and sees no variable.
#[test]
fn init_finds_the_region_its_ancestor_published() {
    let _one = PUBLISHED.lock().unwrap_or_else(|e| e.into_inner());
    // Growing the descriptor table first, as `aetrace` does, leaves no
    // descriptor behind for `publish` to find.
    aetrace_runtime::region::reserve_region_fd().unwrap();
    let fd = aetrace_runtime::layout::REGION_FD;
    // SAFETY: fcntl on an integer.
    assert!(unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0);
    for via_sh in [false, true] {
        let region = Region::create(SMALL).unwrap();
        let _published = region.publish().unwrap();
        let mut cmd = child_command("walk");
        if via_sh {
            // `; exit` keeps sh from exec'ing the child in its place.
            let argv: Vec<String> = std::iter::once(cmd.get_program())
                .chain(cmd.get_args())
                .map(|a| format!("'{}'", a.to_str().unwrap()))
                .collect();
            let script = format!("{}; exit $?", argv.join(" "));
            let envs: Vec<_> = cmd
                .get_envs()
                .map(|(k, v)| (k.to_owned(), v.unwrap().to_owned()))
                .collect();
            cmd = std::process::Command::new("/bin/sh");
            cmd.args(["-c", &script])
                .envs(envs)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
        }
        let child = cmd.spawn().unwrap();
        let mut d = region.drainer();
        let mut bytes = Vec::new();
        let out = std::thread::scope(|s| {
            let h = s.spawn(|| child.wait_with_output().unwrap());
            while !h.is_finished() {
                d.poll(false, &mut |b| bytes.extend_from_slice(b.bytes))
                    .unwrap();
                d.wait(Duration::from_millis(1));
            }
            h.join().unwrap()
        });
        d.poll(true, &mut |b| bytes.extend_from_slice(b.bytes))
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "via sh {via_sh}: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("ENV_AND_FDS_NATIVE"),
            "via sh {via_sh}: {stdout}"
        );
        let expected = expected_main(11, &walk_sequence());
        assert!(bytes == expected, "via sh {via_sh}: the stream differs");
    }
}

fn walk_sequence() -> Vec<u8> {
    sequence(44, 30_000, 1, 254)
}

#[test]
fn fork_child_gets_its_own_stream() {
    let region = Region::create(SMALL).unwrap();
    let mut streams = Streams::new();
    let mut runtimes = BTreeMap::new();
    let out = drain_child(&region, "fork", &mut |b| {
        runtimes.insert(b.slot, b.runtime);
        streams
            .entry(b.slot)
            .or_insert((b.pid, Vec::new()))
            .1
            .extend_from_slice(b.bytes)
    });
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
    let _none = PUBLISHED.lock().unwrap_or_else(|e| e.into_inner());
    let region = Region::create(SMALL).unwrap();
    for (mode, msg) in [
        (
            "noenv",
            "no aetrace recorder among this process's ancestors",
        ),
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
    let res = assemble_labelled(&mut a, ip);
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
    // The runtime's `sigreturn`: where the thread resumes.
    v.extend([0xFF, 20]);
    v.extend(rip.to_le_bytes());
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

/// A signal at an instruction whose bytes read like a store through a
/// register holding a value near 2^64 (`movabs rax, imm64` whose first
/// immediate byte, 0x4F, reads as a modrm naming rdi, with rdi = -2):
/// the fix-up's bounds test of a pending record header must not wrap
/// (before, it read address -2 with signals blocked and the program died
/// of SIGSEGV: `traces/signal_stub.c`, whose `step` starts so with x = -2,
/// crashed in about 1 of 30 runs under load).
#[test]
fn signal_entry_is_not_fooled_by_a_wrapping_register() {
    let t = trap_case(|a, at, after| {
        a.mov(rdi, -2i64).unwrap();
        set_tf(a);
        a.set_label(at).unwrap();
        a.mov(rax, 0x1405_7b7e_f767_814fu64).unwrap();
        a.set_label(after).unwrap();
        a.mov(rax, 0x1405_7b7e_f767_814fu64).unwrap();
        emit_witness(a, 0x66, Site::with_scratch(rcx)).unwrap();
    });
    assert!((1..=2).contains(&t.calls), "{} traps", t.calls);
    let mut want = thread_record(u32::MAX);
    if t.calls == 2 {
        want.extend(trap_handler_bytes(t.at, 0));
    }
    want.extend(trap_handler_bytes(t.after, 0));
    want.push(0x66);
    assert_eq!(t.got, want);
    assert_eq!(t.fixups, 0);
}

/// A signal right after the transfer count's increment, before the
/// transfer it counts: `signal_entry` undoes the increment, so SIGNAL
/// stands before it with the count before it, and the handler returns to
/// the increment, which runs again (before, SIGNAL said the point after
/// it with the count after it, and a second signal in untraced code
/// before the next record could not be told from one in the callee).
/// Two traps, each right after (or, on CPUs that report the first
/// single-step trap early, right before) an increment: counts 2 and 3.
#[test]
fn signal_entry_undoes_an_increment_before_its_transfer() {
    let site = Site::with_scratch(rcx);
    let t = trap_case(|a, at, after| {
        // `at` is never a trap's rip: the handler clears the trap flag.
        a.set_label(at).unwrap();
        emit_transfer(a, site).unwrap();
        emit_transfer(a, site).unwrap();
        set_tf(a);
        a.set_label(after).unwrap();
        emit_transfer(a, site).unwrap();
        emit_witness(a, 0x66, site).unwrap();
        set_tf(a);
        emit_transfer(a, site).unwrap();
        emit_witness(a, 0x77, site).unwrap();
    });
    let mut a = CodeAssembler::new(64).unwrap();
    emit_transfer(&mut a, site).unwrap();
    emit_witness(&mut a, 0x66, site).unwrap();
    set_tf(&mut a);
    let second = t.after + a.assemble(0).unwrap().len() as u64;
    let mut want = thread_record(u32::MAX);
    want.extend(trap_handler_bytes(t.after, 2));
    want.push(0x66);
    want.extend(trap_handler_bytes(second, 3));
    want.push(0x77);
    assert_eq!(t.calls, 2);
    assert_eq!(t.got, want);
    assert_eq!(t.fixups, 0, "no store was pending");
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
    let res = assemble_labelled(&mut a, m.next_ip());
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
    want.extend(std::iter::repeat(0x21).take(n as usize));
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
        // The handler's return: SIGRETURN with the same rip.
        let mut back = vec![0xFF, 20];
        back.extend(rip.to_le_bytes());
        assert!(rest.starts_with(&back), "SIGRETURN after SIGNAL {signo}");
        rest = &rest[back.len()..];
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

// Signals inside the other entry points' unblocked windows. The probe
// handler (SIGTRAP, SIGUSR1) steps through a window with the trap flag:
// a trap in the runtime at the `syscall` that blocks signals (when
// `PROBE_ARM`) makes SIGUSR1 pending so that it is delivered right after
// the `syscall` that restores the mask, and clears TF; SIGUSR1 sets TF
// again, so the epilogue is stepped too; a trap at a `PROBE_STOPS`
// address clears TF. Each delivery writes SIGNAL and the stub's ENTER.

static PROBE_STOPS: [std::sync::atomic::AtomicU64; 2] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];
static PROBE_ARM: AtomicBool = AtomicBool::new(false);
static PROBE_RUNTIME: [std::sync::atomic::AtomicU64; 2] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];
/// Where the blocking `syscall` writes the old mask once the probe moved
/// its rdx here (the probe wrote the mask to restore into the runtime's
/// save area itself).
static mut PROBE_OLD_MASK: [u64; 2] = [0; 2];

extern "C" fn probe(sig: i32, _info: *mut libc::siginfo_t, uc: *mut libc::ucontext_t) {
    const TF: i64 = 0x100;
    let uc = unsafe { &mut *uc };
    let g = &mut uc.uc_mcontext.gregs;
    let rip = g[libc::REG_RIP as usize] as u64;
    let flags = libc::REG_EFL as usize;
    if sig == libc::SIGUSR1 {
        g[flags] |= TF;
        return;
    }
    if sig == libc::SIGSEGV {
        // Resume at the test's recovery point.
        g[libc::REG_RIP as usize] = PROBE_STOPS[1].load(Ordering::Relaxed) as i64;
        return;
    }
    if PROBE_STOPS.iter().any(|s| s.load(Ordering::Relaxed) == rip) {
        g[flags] &= !TF;
        return;
    }
    let runtime =
        PROBE_RUNTIME[0].load(Ordering::Relaxed)..PROBE_RUNTIME[1].load(Ordering::Relaxed);
    if PROBE_ARM.load(Ordering::Relaxed)
        && runtime.contains(&rip)
        && unsafe { (rip as *const u16).read_unaligned() } == 0x050F
    {
        g[flags] &= !TF;
        let save_area = g[libc::REG_RSP as usize] as *mut u64;
        unsafe {
            *save_area = *(&uc.uc_sigmask as *const libc::sigset_t as *const u64);
            g[libc::REG_RDX as usize] = std::ptr::addr_of_mut!(PROBE_OLD_MASK) as i64;
            libc::sigaddset(&mut uc.uc_sigmask, libc::SIGUSR1);
            libc::syscall(
                libc::SYS_tgkill,
                libc::getpid(),
                libc::gettid(),
                libc::SIGUSR1,
            );
        }
    }
}

/// The probe handler: (TF set first, when `tf_first`), the outside-entry
/// stub, then a jump to [`probe`]. Returns its address and the return
/// address of the stub's `call signal_entry`.
fn probe_handler(m: &mut Mapped, tf_first: bool) -> (u64, u64) {
    let rt = m.addrs();
    let mut a = CodeAssembler::new(64).unwrap();
    if tf_first {
        set_tf(&mut a);
    }
    emit_outside_entry(&mut a, HANDLER_PROC, &rt).unwrap();
    a.mov(rax, probe as *const () as u64).unwrap();
    a.jmp(rax).unwrap();
    let ip = m.next_ip();
    let code = a.assemble(ip).unwrap();
    let stub_ret = iced_x86::Decoder::with_ip(64, &code, ip, 0)
        .iter()
        .find(|i| i.mnemonic() == iced_x86::Mnemonic::Call && i.near_branch64() == rt.signal_entry)
        .map(|i| i.next_ip())
        .unwrap();
    (m.place(&code), stub_ret)
}

/// Installs `handler` for `sigs`, SIGUSR1 blocked while it runs when
/// `mask_usr1` (the probe's: the SIGUSR1 it sends stays pending).
fn install(handler: u64, sigs: &[i32], mask_usr1: bool) {
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        if mask_usr1 {
            libc::sigaddset(&mut sa.sa_mask, libc::SIGUSR1);
        }
        for &sig in sigs {
            assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
        }
    }
}

fn probe_setup(m: &Mapped, arm: bool, stops: [u64; 2]) {
    PROBE_ARM.store(arm, Ordering::Relaxed);
    for (s, v) in PROBE_STOPS.iter().zip(stops) {
        s.store(v, Ordering::Relaxed);
    }
    PROBE_RUNTIME[0].store(m.base as u64, Ordering::Relaxed);
    PROBE_RUNTIME[1].store(m.base as u64 + m.blob.data_offset, Ordering::Relaxed);
}

/// A stream after its first record: the (signo, rip) of each SIGNAL, each
/// followed by the probe handler's ENTER; then the rest.
fn probe_signals(mut rest: &[u8]) -> (Vec<(u32, u64)>, &[u8]) {
    let mut signals = Vec::new();
    let enter = enter_record(HANDLER_PROC);
    // SIGNAL(signo, rip, transfer count), then the handler's ENTER.
    // Each handler's return writes SIGRETURN (the runtime's `sigreturn`),
    // after any handler nested in it: one per SIGNAL.
    let n = RecordKind::Signal.encoded_len() as usize;
    let back = RecordKind::SigReturn.encoded_len() as usize;
    let mut returns = 0;
    loop {
        if rest.len() >= back && rest[..2] == [0xFF, RecordKind::SigReturn as u8] {
            returns += 1;
            rest = &rest[back..];
        } else if rest.len() >= n + enter.len()
            && rest[..2] == [0xFF, RecordKind::Signal as u8]
            && rest[n..n + enter.len()] == enter[..]
        {
            let signo = u32::from_le_bytes(rest[2..6].try_into().unwrap());
            let rip = u64::from_le_bytes(rest[6..14].try_into().unwrap());
            signals.push((signo, rip));
            rest = &rest[n + enter.len()..];
        } else {
            break;
        }
    }
    assert_eq!(returns, signals.len(), "one SIGRETURN per handler");
    (signals, rest)
}

/// Instructions executed from entry point `sym` up to and including the
/// first `syscall` (the one that blocks signals), taking the first
/// `taken` conditional jumps.
fn unblocked_prologue(m: &Mapped, sym: &str, mut taken: usize) -> usize {
    let code = &m.blob.bytes[..m.blob.data_offset as usize];
    let mut ip = m.blob.symbol(sym).unwrap();
    let mut n = 0;
    loop {
        let mut d = iced_x86::Decoder::with_ip(64, &code[ip as usize..], ip, 0);
        let i = d.decode();
        n += 1;
        if i.mnemonic() == iced_x86::Mnemonic::Syscall {
            return n;
        }
        ip = if i.flow_control() == iced_x86::FlowControl::ConditionalBranch && taken > 0 {
            taken -= 1;
            i.near_branch64()
        } else {
            i.next_ip()
        };
    }
}

/// Checks the SIGNALs of a stepped call of an entry point: (the first
/// trap, at the `call`, when the CPU reports it), one per prologue
/// instruction at the return address, SIGUSR1 there, one per epilogue
/// instruction (or one more) there; returns what follows.
fn check_stepped_call(
    signals: &[(u32, u64)],
    call_ip: u64,
    ret_ip: u64,
    before: usize,
    after: usize,
) {
    let trap = libc::SIGTRAP as u32;
    let mut signals = signals;
    if signals.first() == Some(&(trap, call_ip)) {
        signals = &signals[1..];
    }
    let usr1 = signals
        .iter()
        .position(|&s| s == (libc::SIGUSR1 as u32, ret_ip))
        .unwrap_or_else(|| panic!("no SIGUSR1 at the return address: {signals:x?}"));
    assert!(
        signals[..usr1] == vec![(trap, ret_ip); before],
        "{before} traps in the prologue, each at the return address {ret_ip:#x}: {signals:x?}"
    );
    let tail = &signals[usr1 + 1..];
    assert!(
        (tail.len() == after || tail.len() == after + 1) && tail.iter().all(|&s| s == (trap, ret_ip)),
        "{after} traps in the epilogue, the last back at the return address {ret_ip:#x}: {signals:x?}"
    );
}

/// A signal inside `attach_thread` while signals are not blocked (a new
/// thread entering traced code while the process takes signals) is
/// reported at its call, and the thread gets one slot: a new thread calls
/// `attach_thread` with the trap flag set, so every instruction up to the
/// `syscall` that blocks signals traps (the first trap's handler attaches
/// the thread itself, nested: its stub finds the thread without a slot),
/// then SIGUSR1, delivered as the mask is restored, steps the epilogue.
/// The word above the return address, which tells a handler's stub from
/// another, is also an unreadable address: a stub entered by a jump, as
/// `traces/outside_jump.c` does, may have anything there (reading it
/// killed the program).
#[test]
fn a_signal_inside_attach_thread_is_reported_at_its_call() {
    attach_thread_stepped(false);
    attach_thread_stepped(true);
}

fn attach_thread_stepped(garbage_above: bool) {
    let _serial = TRAP_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut m = Mapped::new();
    let region = Region::create(SMALL).unwrap();
    let rt = m.addrs();
    let mut a = CodeAssembler::new(64).unwrap();
    let mut call_at = a.create_label();
    let mut after = a.create_label();
    if garbage_above {
        a.push(0x10).unwrap(); // the first page: never mapped
    }
    set_tf(&mut a);
    a.set_label(&mut call_at).unwrap();
    a.call(rt.attach).unwrap();
    a.set_label(&mut after).unwrap();
    if garbage_above {
        a.pop(rcx).unwrap();
    }
    a.ret().unwrap();
    let res = assemble_labelled(&mut a, m.next_ip());
    let (call_ip, ret_ip) = (
        res.label_ip(&call_at).unwrap(),
        res.label_ip(&after).unwrap(),
    );
    let traced: extern "C" fn() = unsafe { std::mem::transmute(m.place(&res.inner.code_buffer)) };
    let (handler, _) = probe_handler(&mut m, false);
    probe_setup(&m, true, [ret_ip, 0]);
    let saved_gs = get_gs();
    let streams = drain_while(&region, m.base as u64, || {
        m.init(&[region.env()]);
        install(handler, &[libc::SIGTRAP, libc::SIGUSR1], true);
        std::thread::spawn(move || traced()).join().unwrap();
        set_gs(saved_gs);
    });
    assert_eq!(
        streams.len(),
        2,
        "the new thread claimed one slot: {streams:x?}"
    );
    let got = &streams[&1].1;
    assert!(got.starts_with(&thread_record(0)), "{got:x?}");
    let (signals, rest) = probe_signals(&got[6..]);
    assert!(rest.is_empty(), "after the signals: {rest:x?}");
    // save_all, the `ready` test and its jump, then the mask's setup.
    let before = unblocked_prologue(&m, "attach_thread", 1);
    let after = flush_unblocked_instructions(&m).1;
    check_stepped_call(&signals, call_ip, ret_ip, before, after);
}

/// A fork child signalled before its `fork_child` runs (libc's fork
/// returns with signals unblocked) or inside it while signals are not
/// blocked: the handler's `signal_entry` claims the child's slot (before,
/// the handler wrote into its parent's stream), `fork_child` keeps it,
/// and every such signal is in the child's stream, inside `fork_child`
/// reported at its call. The trap flag is set before a raw `fork`: the
/// child inherits it and traps from its first instruction on.
#[test]
fn a_signal_in_a_fork_child_before_and_inside_fork_child() {
    let _serial = TRAP_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut m = Mapped::new();
    let region = Region::create(SMALL).unwrap();
    let rt = m.addrs();
    let mut a = CodeAssembler::new(64).unwrap();
    let mut parent = a.create_label();
    let mut call_at = a.create_label();
    let mut after = a.create_label();
    let start = m.next_ip();
    set_tf(&mut a);
    a.mov(eax, libc::SYS_fork as u32).unwrap();
    a.syscall().unwrap();
    a.test(eax, eax).unwrap();
    a.jnz(parent).unwrap();
    a.set_label(&mut call_at).unwrap();
    a.call(rt.fork_child).unwrap();
    a.set_label(&mut after).unwrap();
    a.xor(edi, edi).unwrap();
    a.mov(eax, libc::SYS_exit_group as u32).unwrap();
    a.syscall().unwrap();
    a.set_label(&mut parent).unwrap();
    a.ret().unwrap();
    let res = assemble_labelled(&mut a, start);
    let (call_ip, ret_ip, parent_ip) = (
        res.label_ip(&call_at).unwrap(),
        res.label_ip(&after).unwrap(),
        res.label_ip(&parent).unwrap(),
    );
    let traced: extern "C" fn() -> i32 =
        unsafe { std::mem::transmute(m.place(&res.inner.code_buffer)) };
    let (handler, _) = probe_handler(&mut m, false);
    probe_setup(&m, true, [ret_ip, parent_ip]);
    let saved_gs = get_gs();
    let streams = drain_while(&region, m.base as u64, || {
        m.init(&[region.env()]);
        install(handler, &[libc::SIGTRAP, libc::SIGUSR1], true);
        let pid = traced();
        assert!(pid > 0, "fork failed");
        let mut st = 0;
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "child status {st:#x}"
        );
        set_gs(saved_gs);
    });
    assert_eq!(streams.len(), 2, "{streams:x?}");
    // The parent: its own traps only, up to its branch.
    let (signals, rest) = probe_signals(&streams[&0].1[6..]);
    assert!(rest.is_empty(), "parent: after the signals: {rest:x?}");
    assert!(
        signals
            .iter()
            .all(|&(_, rip)| (start..=parent_ip).contains(&rip)
                && rip != ret_ip
                && rip != call_ip + 5),
        "parent stream holds only its own traps: {signals:x?}"
    );
    let child = &streams[&1].1;
    let mut fork = vec![0xFF, RecordKind::Fork as u8];
    fork.extend(0u32.to_le_bytes());
    assert!(child.starts_with(&fork), "child: {child:x?}");
    let (signals, rest) = probe_signals(&child[6..]);
    assert!(rest.is_empty(), "child: after the signals: {rest:x?}");
    // Traps in the child's traced code before the call (after `test`,
    // after `jnz`), each reported where it struck.
    let trap = libc::SIGTRAP as u32;
    let early = signals
        .iter()
        .take_while(|&&(_, rip)| rip < call_ip)
        .count();
    assert!(
        early >= 1
            && signals[..early]
                .iter()
                .all(|&(s, rip)| s == trap && rip > start),
        "child: traps before fork_child: {signals:x?}"
    );
    let before = unblocked_prologue(&m, "fork_child", 0);
    let after = flush_unblocked_instructions(&m).1;
    check_stepped_call(&signals[early..], call_ip, ret_ip, before, after);
}

/// A second signal in a handler's outside-entry stub, or inside
/// `signal_entry` while it does not block signals: before the handler's
/// SIGNAL is written it is reported where the first signal interrupted
/// the thread (before, a trap in the stub after its first instruction
/// was reported in the stub, untraced code, ahead of the first SIGNAL),
/// after it at the stub's return point (before the handler's ENTER,
/// untraced code). A SIGURG handler sets the trap flag first, so its stub
/// and `signal_entry` up to the `syscall` that blocks signals are
/// stepped, each trap nested; SIGUSR1, pending for the blocked section,
/// steps the epilogue.
#[test]
fn a_signal_inside_signal_entry_is_reported_where_the_first_one_struck() {
    let _serial = TRAP_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut m = Mapped::new();
    let region = Region::create(SMALL).unwrap();
    let (probe_at, _) = probe_handler(&mut m, false);
    let (stepped, stub_ret) = probe_handler(&mut m, true);
    // The stepped handler stops trapping in `probe` (any rip outside the
    // generated code would do; `probe` is the first).
    probe_setup(&m, true, [probe as *const () as u64, 0]);
    let runtime = m.base as u64..m.base as u64 + m.blob.data_offset;
    let saved_gs = get_gs();
    let streams = drain_while(&region, m.base as u64, || {
        m.init(&[region.env()]);
        install(probe_at, &[libc::SIGTRAP, libc::SIGUSR1], true);
        install(stepped, &[libc::SIGURG], false);
        unsafe { libc::raise(libc::SIGURG) };
        set_gs(saved_gs);
    });
    assert_eq!(streams.len(), 1);
    // Before SIGURG's record: one trap per instruction of the stub before
    // its `call signal_entry` and of signal_entry up to its blocking
    // `syscall`, each where SIGURG struck (with its handler's ENTER).
    let (signals, rest) = probe_signals(&streams[&0].1[6..]);
    let (n, kind) = (
        RecordKind::Signal.encoded_len() as usize,
        RecordKind::Signal as u8,
    );
    assert!(
        rest.len() >= n && rest[..6] == [0xFF, kind, libc::SIGURG as u8, 0, 0, 0],
        "{rest:x?}"
    );
    let struck = u64::from_le_bytes(rest[6..14].try_into().unwrap());
    let trap = libc::SIGTRAP as u32;
    // The stub's instructions the trap flag steps: all but its first (a
    // trap there, when the CPU reports the first one before it, stands
    // where SIGURG struck too) and its `call attach_thread`, which it
    // jumps over.
    let stub = STUB_INSNS.len() - 2;
    let before = unblocked_prologue(&m, "signal_entry", 0);
    assert!(
        (signals.len() == stub + before || signals.len() == stub + before + 1)
            && signals.iter().all(|&s| s == (trap, struck)),
        "{stub} traps in the stub (or one more) and {before} in signal_entry's prologue, all at {struck:#x}: {signals:x?}"
    );
    // After it: SIGUSR1 and the traps of signal_entry's epilogue at the
    // stub's return point, then the stub; the stepped handler's own
    // ENTER among them.
    let mut rest = &rest[n..];
    let enter = enter_record(HANDLER_PROC);
    let (mut signals, mut enters) = (Vec::new(), 0);
    while !rest.is_empty() {
        if rest.starts_with(&enter) {
            enters += 1;
            rest = &rest[6..];
        } else if rest.starts_with(&[0xFF, RecordKind::SigReturn as u8]) {
            // A handler's return (the runtime's `sigreturn`).
            rest = &rest[RecordKind::SigReturn.encoded_len() as usize..];
        } else {
            assert!(rest.len() >= n && rest[..2] == [0xFF, kind], "{rest:x?}");
            let signo = u32::from_le_bytes(rest[2..6].try_into().unwrap());
            signals.push((signo, u64::from_le_bytes(rest[6..14].try_into().unwrap())));
            rest = &rest[n..];
        }
    }
    assert_eq!(
        enters,
        signals.len() + 1,
        "one ENTER per signal, and the stepped handler's"
    );
    let after = flush_unblocked_instructions(&m).1;
    assert_eq!(
        signals.first(),
        Some(&(libc::SIGUSR1 as u32, stub_ret)),
        "{signals:x?}"
    );
    assert!(
        signals.len() > after + 1 && signals[1..after + 1] == vec![(trap, stub_ret); after],
        "{after} traps in signal_entry's epilogue at the stub's return point {stub_ret:#x}: {signals:x?}"
    );
    assert!(
        signals[after + 1..].iter().all(|&(s, rip)| s == trap
            && (stub_ret..stepped + 0x1000).contains(&rip)
            || rip == probe as *const () as u64),
        "then the stub: {signals:x?}"
    );
    assert!(
        !signals.iter().any(|(_, r)| runtime.contains(r)),
        "{signals:x?}"
    );
}

/// Two signals delivered at once (both pending when traced code unblocks
/// them with a raw `rt_sigprocmask`): the kernel sets up both frames, so
/// the second handler runs at the first instruction of the first one's
/// stub, before that handler's SIGNAL exists. Both are reported where the
/// thread was, right after the `syscall` (before, the second one said the
/// stub, untraced code, ahead of the first SIGNAL). The handler installed
/// directly, and through a springboard (`jmp rel32` to the stub, as at
/// the original entry of a relocated procedure): the second handler then
/// starts at the springboard.
#[test]
fn two_signals_delivered_at_once_are_both_reported_where_the_thread_was() {
    two_signals_at_once(false);
    two_signals_at_once(true);
}

fn two_signals_at_once(springboard: bool) {
    let _serial = TRAP_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut m = Mapped::new();
    let region = Region::create(SMALL).unwrap();
    let mut a = CodeAssembler::new(64).unwrap();
    let mut after = a.create_label();
    a.mov(rsi, rdi).unwrap();
    a.mov(edi, 2u32).unwrap(); // SIG_SETMASK
    a.xor(edx, edx).unwrap();
    a.mov(r10d, 8u32).unwrap();
    a.mov(eax, libc::SYS_rt_sigprocmask as u32).unwrap();
    a.syscall().unwrap();
    a.set_label(&mut after).unwrap();
    a.ret().unwrap();
    let res = assemble_labelled(&mut a, m.next_ip());
    let after = res.label_ip(&after).unwrap();
    let unblock: extern "C" fn(*const u64) =
        unsafe { std::mem::transmute(m.place(&res.inner.code_buffer)) };
    let (mut handler, _) = probe_handler(&mut m, false);
    if springboard {
        let mut a = CodeAssembler::new(64).unwrap();
        a.jmp(handler).unwrap();
        handler = m.place(&a.assemble(m.next_ip()).unwrap());
    }
    probe_setup(&m, false, [0, 0]);
    let sigs = [libc::SIGURG, libc::SIGWINCH];
    let saved_gs = get_gs();
    let streams = drain_while(&region, m.base as u64, || {
        m.init(&[region.env()]);
        install(handler, &sigs, false);
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in sigs {
                libc::sigaddset(&mut set, s);
            }
            assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old), 0);
            for s in sigs {
                assert_eq!(libc::raise(s), 0);
            }
            unblock(&old as *const libc::sigset_t as *const u64);
        }
        set_gs(saved_gs);
    });
    let (signals, rest) = probe_signals(&streams[&0].1[6..]);
    assert!(rest.is_empty(), "{rest:x?}");
    let mut got: Vec<u32> = signals.iter().map(|s| s.0).collect();
    got.sort();
    assert_eq!(got, sigs.map(|s| s as u32), "{signals:x?}");
    assert!(
        signals.iter().all(|&(_, rip)| rip == after),
        "springboard {springboard}: both at {after:#x}: {signals:x?}"
    );
}

/// A traced SIGSEGV handler for a jump to an unmapped address (the rip is
/// the fault address, CR2): `signal_entry` must not read the bytes there
/// while it looks for a stub (it would fault with signals blocked and the
/// kernel would kill the process); SIGNAL names that rip.
#[test]
fn a_fetch_fault_is_reported_without_reading_its_rip() {
    let _serial = TRAP_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut m = Mapped::new();
    let region = Region::create(SMALL).unwrap();
    let mut a = CodeAssembler::new(64).unwrap();
    let mut recover = a.create_label();
    a.mov(eax, 0x10u32).unwrap();
    a.call(rax).unwrap();
    a.set_label(&mut recover).unwrap();
    a.add(rsp, 8).unwrap(); // the return address `call rax` pushed
    a.ret().unwrap();
    let res = assemble_labelled(&mut a, m.next_ip());
    let recover = res.label_ip(&recover).unwrap();
    let jump: extern "C" fn() = unsafe { std::mem::transmute(m.place(&res.inner.code_buffer)) };
    let (handler, _) = probe_handler(&mut m, false);
    probe_setup(&m, false, [0, recover]);
    let saved_gs = get_gs();
    let streams = drain_while(&region, m.base as u64, || {
        m.init(&[region.env()]);
        // Rust's own SIGSEGV handler (stack overflows) comes back after.
        let mut rust: libc::sigaction = unsafe { std::mem::zeroed() };
        unsafe { libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut rust) };
        install(handler, &[libc::SIGSEGV], false);
        jump();
        unsafe { libc::sigaction(libc::SIGSEGV, &rust, std::ptr::null_mut()) };
        set_gs(saved_gs);
    });
    let (signals, rest) = probe_signals(&streams[&0].1[6..]);
    assert!(rest.is_empty(), "{rest:x?}");
    assert_eq!(signals, [(libc::SIGSEGV as u32, 0x10)]);
}

/// A signal in glibc's restorer, after a traced handler returned and
/// before its `rt_sigreturn`, is reported where that handler returns to
/// (docs/regen.md section 3a), not at the restorer, which regen could not
/// tell from other untraced code: SIGUSR2's handler returns with the trap
/// flag set, so SIGTRAP strikes at the restorer's `syscall` (and at its
/// first instruction, on CPUs whose first trap comes after one more
/// instruction), and every such SIGNAL names the point after the `syscall`
/// that raised SIGUSR2.
#[test]
fn a_signal_in_glibcs_restorer_is_reported_where_the_handler_returns() {
    let _serial = TRAP_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut m = Mapped::new();
    let region = Region::create(SMALL).unwrap();
    // raise_usr2(pid, tid): tgkill with a raw `syscall`.
    let mut a = CodeAssembler::new(64).unwrap();
    let mut after = a.create_label();
    a.mov(edx, libc::SIGUSR2 as u32).unwrap();
    a.mov(eax, libc::SYS_tgkill as u32).unwrap();
    a.syscall().unwrap();
    a.set_label(&mut after).unwrap();
    a.ret().unwrap();
    let res = assemble_labelled(&mut a, m.next_ip());
    let after = res.label_ip(&after).unwrap();
    let raise_usr2: extern "C" fn(i64, i64) =
        unsafe { std::mem::transmute(m.place(&res.inner.code_buffer)) };
    // SIGUSR2's handler: the stub, then TF set just before its `ret`.
    let mut a = CodeAssembler::new(64).unwrap();
    emit_outside_entry(&mut a, HANDLER_PROC, &m.addrs()).unwrap();
    set_tf(&mut a);
    let mut ret_at = a.create_label();
    a.set_label(&mut ret_at).unwrap();
    a.ret().unwrap();
    let res = assemble_labelled(&mut a, m.next_ip());
    let ret_at = res.label_ip(&ret_at).unwrap();
    let usr2 = m.place(&res.inner.code_buffer);
    let (trap, _) = probe_handler(&mut m, false);
    probe_setup(&m, false, [0, 0]);
    let saved_gs = get_gs();
    let streams = drain_while(&region, m.base as u64, || {
        m.init(&[region.env()]);
        install(usr2, &[libc::SIGUSR2], false);
        install(trap, &[libc::SIGTRAP], false);
        unsafe { raise_usr2(libc::getpid().into(), libc::gettid().into()) };
        set_gs(saved_gs);
    });
    let (signals, rest) = probe_signals(&streams[&0].1[6..]);
    assert!(rest.is_empty(), "{rest:x?}");
    assert_eq!(
        signals.first(),
        Some(&(libc::SIGUSR2 as u32, after)),
        "{signals:x?}"
    );
    // A first trap at the handler's own `ret` (before it ran) stands there.
    let traps: Vec<u64> = signals[1..]
        .iter()
        .filter(|&&(s, rip)| s == libc::SIGTRAP as u32 && rip != ret_at)
        .map(|s| s.1)
        .collect();
    assert!(
        !traps.is_empty() && traps.len() + 1 >= signals.len() - 1,
        "traps in the restorer: {signals:x?}"
    );
    assert!(
        traps.iter().all(|&rip| rip == after),
        "each where the handler returns, {after:#x}: {signals:x?}"
    );
}
