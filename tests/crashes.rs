//! Runs a signal ends (issue 23, point 2): `traces/crash.c` dying of
//! SIGSEGV, SIGFPE, SIGILL, SIGBUS (each raised by an instruction),
//! SIGABRT, and of SIGKILL at ten random moments. Each recording exits
//! with the native status (the same signal, the same core dump flag, core
//! dumps enabled) and output. The runtime's handler writes FAULT for the
//! first five: the trace regenerates, `-j 1` and cut into pieces alike,
//! to lackey's run of the same program, the faulting instruction
//! included, and `regen` and `info` name the signal and the instruction.
//! After SIGKILL the trace is a prefix of the full run without the kill,
//! reaching the last point the witnesses determine.

use crate::common;
use crate::trace_oracle::module_sequences;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use common::build::{build, Link, Opt, Variant};
use common::lackey;
use common::recorded::{info_json, record_run, Knobs};

const O2_PIE: Variant = Variant::new(Opt::O2, Link::Pie, false);

/// Lackey's instruction sequence of `exe args` in the executable and the
/// regenerated one of `trace` (link-time offsets, one thread).
fn sequences(exe: &Path, args: &[&str], trace: &Path) -> (Vec<u64>, Vec<u64>) {
    let run = lackey::executable_sequences(exe, args);
    let (_, mut lk, mut rg) = module_sequences(
        "crash",
        exe,
        &info_json(trace),
        0,
        &run.modules[0],
        trace,
        None,
    );
    (lk.swap_remove(0), rg.swap_remove(0))
}

/// Runs `cmd` in its own scratch directory with core dumps enabled (the
/// kernel's core pattern decides where they go; a plain `core` lands in
/// that directory, removed afterwards): its output.
fn with_cores(mut cmd: Command) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = common::scratch("crashes").join(format!("cores-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // SAFETY: setrlimit only, between fork and exec.
    let out = unsafe {
        cmd.current_dir(&dir)
            .stdin(std::process::Stdio::null())
            .pre_exec(|| {
                let lim = libc::rlimit {
                    rlim_cur: 64 << 20,
                    rlim_max: libc::RLIM_INFINITY,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &lim);
                Ok(())
            })
            .output()
            .unwrap()
    };
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// `(signal, core dumped)` of a status.
fn death(st: std::process::ExitStatus) -> (Option<i32>, bool) {
    (st.signal(), st.core_dumped())
}

/// Records `exe args`: the program's output and death by `signal` are the
/// native ones (its core dump flag too, in the trace); `regen` and `info`
/// say which signal killed it. The trace, and what both say.
fn record_killed(exe: &Path, args: &[&str], signal: i32) -> (std::path::PathBuf, String) {
    let mut native = Command::new(exe);
    native.args(args);
    let native = with_cores(native);
    let (sig, core) = death(native.status);
    assert_eq!(sig, Some(signal), "{args:?}: native status");
    let name = format!("{} {}", exe.display(), args.join(" "));
    let trace =
        common::scratch("crashes").join(format!("{}-{}.aet", args.join("-"), std::process::id()));
    let mut rec = Command::new(common::aetrace());
    rec.arg("record")
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(exe)
        .args(args);
    let rec = with_cores(rec);
    assert_eq!(rec.status.signal(), Some(signal), "{name}: recorded status");
    assert_eq!(rec.stdout, native.stdout, "{name}: stdout");
    let info = info_json(&trace);
    let exit = &info["process_exits"][0];
    assert_eq!(
        (exit["signal"].as_i64(), exit["core_dumped"].as_bool()),
        (Some(i64::from(signal)), Some(core)),
        "{name}: the program's death in the trace"
    );
    let regen = Command::new(common::aetrace())
        .args(["regen", "--format", "block"])
        .arg(&trace)
        .output()
        .unwrap();
    let said = format!("was killed by signal {signal} (");
    let stderr = String::from_utf8_lossy(&regen.stderr);
    assert!(
        regen.status.success() && stderr.contains(&said),
        "{name}: regen says {stderr}"
    );
    let info = Command::new(common::aetrace())
        .arg("info")
        .arg(&trace)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&info.stdout);
    let ending = text.lines().find(|l| l.contains(&said));
    assert_eq!(
        ending.map(str::trim),
        stderr
            .lines()
            .find(|l| l.contains(&said))
            .map(|l| l.trim_start_matches("aetrace: ")),
        "{name}: info and regen say the same"
    );
    (trace, stderr.into_owned())
}

/// The native run of `exe args` single-stepped (ASLR off): its
/// instructions in the executable, at link-time addresses (offsets from
/// the image's start in a PIE, absolute addresses in a non-PIE), a `rep`
/// counted once. The executable is the only module mapped below the libraries'
/// `0x7f...` range, and `_start` its first instruction run.
pub(crate) fn stepped(exe: &Path, args: &[&str]) -> Vec<u64> {
    let run = common::singlestep::run(exe, None, args, &[]);
    let elf = common::elf::Elf::read(exe);
    let entry = u64::from_le_bytes(elf.bytes[24..32].try_into().unwrap());
    let mut own = run.rips.iter().copied().filter(|&r| r < 0x7f00_0000_0000);
    let base = own.next().expect("the executable ran") - entry;
    assert_eq!(base % 4096, 0, "{}: load base {base:#x}", exe.display());
    let mut seq: Vec<u64> = Vec::new();
    for r in run.rips.iter().filter(|&&r| r < 0x7f00_0000_0000) {
        let a = r - base;
        if seq.last() != Some(&a) || !elf.is_rep(a) {
            seq.push(a);
        }
    }
    seq
}

fn assert_prefix(name: &str, lk: &[u64], rg: &[u64]) {
    assert!(!rg.is_empty(), "{name}: empty trace");
    let d = lk.iter().zip(rg).position(|(a, b)| a != b);
    assert!(
        d.is_none() && rg.len() <= lk.len(),
        "{name}: not a prefix of lackey's run: first difference at {d:?} (lackey {}, regen {})",
        lk.len(),
        rg.len()
    );
}

/// The procedure and mnemonic objdump shows at address `addr` of `exe`.
fn insn_at(exe: &Path, addr: u64) -> (String, String) {
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(exe)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut proc = String::new();
    for line in text.lines() {
        if let Some(name) = line.strip_suffix(">:") {
            proc = name.split('<').nth(1).unwrap_or_default().to_owned();
        }
        let mut words = line.split_whitespace();
        if words.next() == Some(&format!("{addr:x}:")) {
            return (proc, words.next().unwrap_or_default().to_owned());
        }
    }
    panic!("no instruction at {addr:#x} in {}", exe.display())
}

/// `exe how` dies of `signal` raised by its instruction `mnemonic` in
/// `proc`: the trace is the native run up to and including that
/// instruction, which `regen` and `info` name: as the faulting one, or,
/// for a trap (`int3`, whose signal the kernel raises once it ran), by
/// the instruction after it, where the signal interrupted the thread.
fn check_fault(how: &str, signal: i32, proc: &str, mnemonic: &str) {
    let exe = build("crash.c", O2_PIE);
    let trap = signal == libc::SIGTRAP;
    let (trace, said) = record_killed(&exe, &[how], signal);
    // Valgrind loses the instructions of the faulting superblock
    // before the fault (lackey's buffered events) and runs `idiv`
    // differently: the native run, single-stepped, is the oracle.
    let rg = crate::trace_oracle::regen_threads(&trace, None).swap_remove(0);
    let _ = std::fs::remove_file(&trace);
    let lk = stepped(&exe, &[how]);
    let tail = |v: &[u64]| format!("{:x?}", &v[v.len().saturating_sub(4)..]);
    assert_eq!(
        lk.len(),
        rg.len(),
        "{how}: regenerated {} of the stepped run's {} instructions, ending {} and {}",
        rg.len(),
        lk.len(),
        tail(&rg),
        tail(&lk)
    );
    assert_eq!(lk, rg, "{how}: the trace is the stepped run");
    let last = *rg.last().unwrap();
    assert_eq!(
        insn_at(&exe, last),
        (proc.to_owned(), mnemonic.to_owned()),
        "{how}: the last instruction, at {last:#x}"
    );
    let (at, what) = match trap {
        false => (last, "the faulting instruction"),
        true => (last + 1, "its trace ends there"),
    };
    let named = format!("at instruction {at:#x} in procedure ");
    assert!(
        said.contains(&named) && said.contains(what),
        "{how}: {said}"
    );
    eprintln!(
        "{how}: {} instructions, the last {last:#x}, equal the stepped run's",
        rg.len()
    );
}

#[test]
fn segv_null_store() {
    check_fault("segv", 11, "crash", "mov");
}

#[test]
fn fpe_divide_by_zero() {
    check_fault("fpe", 8, "crash", "idiv");
}

/// gcc -O2 puts `__builtin_trap`'s `ud2` in crash's cold part.
#[test]
fn ill_ud2() {
    check_fault("ill", 4, "crash.cold", "ud2");
}

/// `int3` not under a debugger: SIGTRAP with a core dump, as natively.
#[test]
fn trap_int3() {
    check_fault("trap", 5, "crash", "int3");
}

#[test]
fn bus_store_past_a_files_end() {
    check_fault("bus", 7, "crash", "mov");
}

/// abort() raises SIGABRT in libc: the trace ends inside the call, equal
/// to lackey's run of the executable (the PLT stub included).
#[test]
fn abort_ends_inside_its_call() {
    let exe = build("crash.c", O2_PIE);
    let (trace, said) = record_killed(&exe, &["abort"], 6);
    assert!(said.contains("(SIGABRT) in untraced code at 0x"), "{said}");
    let (lk, rg) = sequences(&exe, &["abort"], &trace);
    let _ = std::fs::remove_file(&trace);
    assert_eq!(
        lk,
        rg,
        "abort: regenerated {} of lackey's {}",
        rg.len(),
        lk.len()
    );
}

/// The pid of `parent`'s first child, once it has one (within 20 s: on a
/// loaded machine the recorder took over a second to start it).
fn child_of(parent: u32) -> u32 {
    let path = format!("/proc/{parent}/task/{parent}/children");
    for _ in 0..40_000 {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if let Some(pid) = text.split_whitespace().next() {
            return pid.parse().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
    panic!("aetrace record {parent} started no program");
}

/// The program killed from outside after a random delay within its
/// 100 ms run: it has no chance to write anything, and its trace ends at
/// the last point its witnesses determine, a prefix of the full run's.
#[test]
fn sigkill_at_ten_random_moments() {
    let exe = build("crash.c", O2_PIE);
    let full = record_run(&exe, &["sleep"], &[], Knobs::DEFAULT).1;
    let (lk, _) = sequences(&exe, &["sleep"], &full);
    let _ = std::fs::remove_file(&full);
    let mut x = u64::from(std::process::id()) | 1;
    let mut lengths = Vec::new();
    for k in 0..10 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let delay = std::time::Duration::from_micros(x % 110_000);
        let trace = common::scratch("crashes").join(format!("kill-{}-{k}.aet", std::process::id()));
        let mut rec = Command::new(common::aetrace())
            .arg("record")
            .arg("-o")
            .arg(&trace)
            .arg("--")
            .arg(&exe)
            .arg("sleep")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let child = child_of(rec.id());
        std::thread::sleep(delay);
        // SAFETY: a signal to a process this test started.
        unsafe { libc::kill(child as i32, libc::SIGKILL) };
        let status = rec.wait().unwrap();
        let name = format!("killed after {delay:?}");
        if status.success() {
            // The run ended first: nothing to check.
            continue;
        }
        assert_eq!(status.signal(), Some(9), "{name}: recorded status");
        let early = Command::new(common::aetrace())
            .args(["regen", "--format", "insn"])
            .arg(&trace)
            .output()
            .unwrap();
        if String::from_utf8_lossy(&early.stderr).contains("before its traced code started") {
            // Killed before the runtime registered a module: an empty prefix.
            lengths.push(0);
            let _ = std::fs::remove_file(&trace);
            continue;
        }
        let rg = crate::trace_oracle::regen_threads(&trace, None).swap_remove(0);
        assert_prefix(&name, &lk, &rg);
        lengths.push(rg.len());
        let _ = std::fs::remove_file(&trace);
    }
    eprintln!(
        "regenerated prefixes {lengths:?} of the full run's {}",
        lk.len()
    );
    assert!(
        lengths.len() >= 5,
        "most kills landed inside the run: {lengths:?}"
    );
}

/// A program with its own SIGSEGV handler (which siglongjmps back) is
/// not ended by the fault: its output, status and trace are the native
/// ones (the program's `sigaction` replaced the runtime's handler).
#[test]
fn own_handler_survives_the_fault() {
    let exe = build("crash.c", O2_PIE);
    let native = common::build::run_native(&exe, &["handler"]);
    let (name, trace, rec) = record_run(&exe, &["handler"], &[], Knobs::DEFAULT);
    assert!(native.status.success(), "{name}: native status");
    assert_eq!(rec.status.code(), native.status.code(), "{name}: status");
    assert_eq!(rec.stdout, native.stdout, "{name}: stdout");
    let rg = crate::trace_oracle::regen_threads(&trace, None).swap_remove(0);
    let _ = std::fs::remove_file(&trace);
    assert!(
        rg == stepped(&exe, &["handler"]),
        "{name}: the trace is not the stepped run"
    );
}

/// Static executables, whose whole libc is traced: each crash's trace is
/// the native run single-stepped (the rewritten binary with its original
/// code put back, `trace_oracle::check_static_streams`), the faulting
/// instruction included; `abort`'s raise in libc too. (Stepping the
/// original static binary is no oracle: its startup reads its own
/// program headers, path and environment, and on 2026-11-28 ran 18,336
/// instructions in the executable where the recorded run ran 59,039.)
/// One fault the handler returns to, one trap it sends again, one
/// signal raised in libc: the others take the same paths.
#[test]
fn static_crashes() {
    let exe = build("crash.c", Variant::new(Opt::O2, Link::Static, false));
    for how in ["segv", "trap", "abort"] {
        crate::trace_oracle::check_static(&exe, &[how]);
    }
}

/// `traces/sigdisp.c` queries, installs, restores and ignores the
/// dispositions of the signals a crash raises (sigaction, signal,
/// sysv_signal, a fork child's and an exec'd image's view), sets SIGSEGV
/// back to `SIG_DFL` after a handler of its own, then crashes: it prints
/// what a native run prints (the runtime's `fault` handler never shows)
/// and dies of the same signal, and its trace is the native run
/// single-stepped, ending with the faulting store, named by `regen`.
#[test]
fn the_program_sees_its_own_dispositions() {
    let exe = build("sigdisp.c", O2_PIE);
    let (trace, said) = record_killed(&exe, &["segv"], 11);
    let rg = crate::trace_oracle::regen_threads(&trace, None).swap_remove(0);
    let _ = std::fs::remove_file(&trace);
    let lk = stepped(&exe, &["segv"]);
    assert!(lk == rg, "sigdisp: the trace is not the stepped run");
    let last = *rg.last().unwrap();
    assert_eq!(insn_at(&exe, last), ("main".to_owned(), "movl".to_owned()));
    assert!(
        said.contains(&format!("at instruction {last:#x} in procedure main"))
            && said.contains("the faulting instruction"),
        "{said}"
    );
}

/// A SIGSEGV handler that skips a faulting load by its length
/// (`traces/skip_fault.c`; -O2 and -O0, dynamic and static): the handler
/// sees the native rip (`load+5`), `backtrace()` finds the native frames
/// through the runtime's `sigreturn` (whose FDE is the signal frame's),
/// and the thread resumes where the handler says: at the lead of the
/// `ret` after the load (the transfer count's increment before its
/// copy). The recorded program prints what the native one prints (and
/// its trace regenerates). Dynamic, with `--data --check` (the handler's
/// return records the registers; `emulate` sets rax) the program prints
/// the same and every recomputed address agrees with the recorded one,
/// and the control trace of `emulate` at -O2 is the native run
/// single-stepped (stepping the others too took 115 s). Static
/// (whose libc is traced), `emulate` at -O2 is the stepped run while
/// `run` runs ([`stepped_run_window`]); `bt` is not: libgcc's unwinder,
/// traced, looks up the copies' return addresses and its search takes
/// other branches (docs/runtime.md, "Unwinding"), and `info` names the
/// first instruction of it ([`check_departure`]). Before format 1.11 the
/// load was listed twice per fault, silently; before the leads, regen
/// refused these traces.
#[test]
fn a_handler_that_skips_a_faulting_load() {
    for v in [
        Variant::new(Opt::O2, Link::NoPie, false),
        Variant::new(Opt::O0, Link::NoPie, false),
        Variant::new(Opt::O2, Link::Static, false),
        Variant::new(Opt::O0, Link::Static, false),
    ] {
        let exe = build("skip_fault.c", v);
        for mode in ["skip", "emulate", "bt"] {
            let native = common::build::run_native(&exe, &[mode]);
            let name = format!("{} {mode}", exe.display());
            let (_, trace, out) = record_run(&exe, &[mode], &[], Knobs::DEFAULT);
            assert_eq!(out.stdout, native.stdout, "{name}: output");
            // regen's offsets from the image's start, the stepped run's
            // link-time addresses.
            let base = common::recorded::link_base(&exe);
            let rg: Vec<u64> = crate::trace_oracle::regen_threads(&trace, None)
                .swap_remove(0)
                .into_iter()
                .map(|a| a + base)
                .collect();
            if v.link == Link::Static || mode == "bt" {
                check_departure(&exe, &trace, &rg, v.link == Link::Static && mode == "bt");
            }
            match v.link {
                Link::Static if v.opt == Opt::O2 && mode == "emulate" => {
                    let (lk, rg) = stepped_run_window(&exe, &[mode], &info_json(&trace), &rg);
                    assert_same_steps(&name, &lk, &rg);
                }
                // Stepping every static run would take seconds each
                // (minutes for `bt`), and a static glibc has `xsave`,
                // which `--data` refuses.
                Link::Static => {}
                // Stepping a dynamic run steps ld.so and libc too: 11-41 s
                // each (load 2), 115 s for all six. One is stepped, the
                // mode that both moves the rip and changes a register.
                _ if v.opt == Opt::O2 && mode == "emulate" => {
                    assert_same_steps(&name, &stepped(&exe, &[mode]), &rg);
                    checked_data(&exe, mode, &native.stdout);
                }
                _ => checked_data(&exe, mode, &native.stdout),
            }
            let _ = std::fs::remove_file(&trace);
        }
    }
}

/// Where regenerated `rg` (link-time addresses) stops being the native
/// run's, as `info` names it: at the first instruction of
/// libgcc's `_Unwind_Find_FDE` (`nm`'s range) when `traced` (a static
/// `bt`, whose unwinder is traced), nowhere otherwise (a dynamic
/// program's unwinder is libgcc_s's, untraced).
fn check_departure(exe: &Path, trace: &Path, rg: &[u64], traced: bool) {
    let info = info_json(trace);
    let d = info["departures"].as_array().unwrap();
    if !traced {
        assert!(d.is_empty(), "{d:?}");
        return;
    }
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0]["procedure"], "_Unwind_Find_FDE", "{d:?}");
    let n = d[0]["instruction"].as_u64().unwrap();
    // nm's offsets from the image's start; `rg` has the link base added.
    let (lo, hi) = crate::unwinding::symbol_range(exe, "_Unwind_Find_FDE");
    let base = common::recorded::link_base(exe);
    let first = rg.iter().position(|a| (lo..hi).contains(&(a - base)));
    assert_eq!(first, Some(n as usize - 1), "{}", exe.display());
}

/// `rg` (regenerated) is `lk` (stepped), or the first difference is shown.
fn assert_same_steps(name: &str, lk: &[u64], rg: &[u64]) {
    let d = lk.iter().zip(rg).position(|(a, b)| a != b);
    assert!(
        rg == lk,
        "{name}: not the stepped run: first difference at {d:?} ({:x?} against {:x?}), lengths {} and {}",
        d.map(|d| &lk[d.saturating_sub(3)..(d + 3).min(lk.len())]),
        d.map(|d| &rg[d.saturating_sub(3)..(d + 3).min(rg.len())]),
        lk.len(),
        rg.len()
    );
}

/// The stepped run of static `exe args` and the regenerated `rg`, both
/// from `run`'s first instruction to the first one of `main` after it:
/// the loads, the faults, the handlers and their returns. Outside it the
/// runs differ by where the stack is (the recorded program is another
/// file, with other program headers, in another environment), which
/// glibc's string functions test (`strcmp` checks its operands' page
/// offsets). The stepped run without the procedures `info` says were
/// left alone, and without glibc's restorer (`__restore_rt`, two
/// instructions), which the rewritten program does not run: its handlers
/// return through the runtime's `sigreturn`.
fn stepped_run_window(
    exe: &Path,
    args: &[&str],
    info: &serde_json::Value,
    rg: &[u64],
) -> (Vec<u64>, Vec<u64>) {
    let nm = Command::new("nm").arg("-S").arg(exe).output().unwrap();
    let nm = String::from_utf8_lossy(&nm.stdout);
    let sym = |name: &str| {
        nm.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.len() == 4 && f[3].split('.').next() == Some(name))
            .map(|f| {
                let lo = u64::from_str_radix(f[0], 16).unwrap();
                (lo, lo + u64::from_str_radix(f[1], 16).unwrap())
            })
            .unwrap_or_else(|| panic!("nm lists {name}"))
    };
    let (run, main) = (sym("run").0, sym("main"));
    let alone = common::recorded::left_alone_ranges(exe, info, 0);
    let restorers = common::elf::Elf::read(exe).sigreturn_stubs();
    let kept = |&a: &u64| {
        !alone.iter().any(|&(lo, hi)| lo <= a && a < hi)
            && !restorers.contains(&a)
            && !restorers.contains(&a.wrapping_sub(7))
    };
    let lk: Vec<u64> = stepped(exe, args).into_iter().filter(kept).collect();
    let window = |s: &[u64]| {
        let from = s.iter().position(|&a| a == run).expect("run ran");
        let len = s[from..].iter().position(|&a| main.0 <= a && a < main.1);
        s[from..from + len.expect("run returned")].to_vec()
    };
    (window(&lk), window(rg))
}

/// `exe mode` recorded with `--data --check` prints `native` and its
/// data trace regenerates (every recomputed address is the recorded one).
fn checked_data(exe: &Path, mode: &str, native: &[u8]) {
    let name = format!("{} {mode} --data --check", exe.display());
    let trace = common::scratch("crashes").join(format!(
        "{}-{mode}-{}.aet",
        exe.file_name().unwrap().to_string_lossy(),
        std::process::id()
    ));
    let mut rec = Command::new(common::aetrace());
    rec.args(["record", "--data", "--check", "-o"])
        .arg(&trace)
        .args(["--libs", "none", "--"])
        .arg(exe)
        .arg(mode);
    common::no_aslr(&mut rec);
    let out = rec.output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(native),
        "{name}: output"
    );
    let rg = Command::new(common::aetrace())
        .args(["regen", "--format", "lackey", "-o", "/dev/null"])
        .arg(&trace)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&trace);
    assert!(
        rg.status.success(),
        "{name}: regen: {}",
        String::from_utf8_lossy(&rg.stderr)
    );
}
