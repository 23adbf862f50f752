//! `record --data` (abstract execution) and `record --data --check` (the
//! same, plus every address in full, which regen compares with the
//! recomputed ones and refuses at the first difference) + `regen --format
//! lackey` against valgrind lackey (`--trace-mem=yes
//! --vex-guest-chase=no`) on the original program, both modes: per executed instruction of the executable, the same address
//! and length, the same references (kind and size, in order) and the same
//! data addresses: inside the executable's image equal (non-PIE builds:
//! link-time addresses on both sides); elsewhere (stack, heap, libraries'
//! data) equal up to one delta per page, fixed at the page's first touch
//! and checked at every later one, and one delta for the whole stack
//! (relative to the initial stack pointer): valgrind lays memory out
//! differently.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use crate::common;
use crate::common::build::{build, run_checked, Link, Opt, Variant};

/// One instruction: address, length, references (kind, address, size).
type Insn = (u64, u64, Vec<(char, u64, u64)>);

/// The executable's instructions of a lackey-format text, in order.
fn parse(text: &str, image: (u64, u64)) -> Vec<Insn> {
    let mut out: Vec<Insn> = Vec::new();
    let mut keep = false;
    let num = |s: &str| -> (u64, u64) {
        let (a, n) = s.trim().split_once(',').expect("ADDR,SIZE");
        (u64::from_str_radix(a, 16).unwrap(), n.parse().unwrap())
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("I  ") {
            let (a, n) = num(rest);
            keep = (image.0..image.1).contains(&a);
            if keep {
                out.push((a, n, Vec::new()));
            }
        } else if keep && line.len() > 3 && line.starts_with(' ') {
            let kind = line.as_bytes()[1] as char;
            let (a, n) = num(&line[3..]);
            out.last_mut().unwrap().2.push((kind, a, n));
        }
    }
    out
}

/// The executable's allocated sections' span (non-PIE: run-time addresses).
fn image_of(exe: &Path) -> (u64, u64) {
    let m = aetrace_analysis::elf::Module::open(exe).unwrap();
    let alloc = m.sections.iter().filter(|s| s.alloc && s.addr != 0);
    let lo = alloc.clone().map(|s| s.addr).min().unwrap();
    let hi = alloc.map(|s| s.addr + s.size).max().unwrap();
    (lo, hi)
}

/// Ours and lackey's data addresses agree as the module doc says.
struct Deltas {
    image: (u64, u64),
    pages: HashMap<u64, u64>,
    stack: Option<u64>,
}

impl Deltas {
    fn check(&mut self, ours: u64, theirs: u64) -> Result<(), String> {
        if (self.image.0..self.image.1).contains(&ours) {
            return (ours == theirs)
                .then_some(())
                .ok_or_else(|| format!("image address {ours:#x}, lackey {theirs:#x}"));
        }
        let delta = theirs.wrapping_sub(ours);
        if ours >= common::STACK_FLOOR {
            let d = *self.stack.get_or_insert(delta);
            if d != delta {
                return Err(format!(
                    "stack {ours:#x}: lackey {theirs:#x}, delta differs"
                ));
            }
        }
        let d = *self.pages.entry(ours >> 12).or_insert(delta);
        (d == delta)
            .then_some(())
            .ok_or_else(|| format!("{ours:#x}: lackey {theirs:#x}, its page's delta differs"))
    }
}

/// Our lackey text of `exe args` recorded with `record --data MODE`,
/// address randomisation off (so the stack is told by its address).
fn ours(exe: &Path, tag: &str, mode: &[&str], args: &[&str]) -> String {
    let trace = common::scratch("data_trace").join(format!("{tag}{}.aet", mode.concat()));
    let mut rec = Command::new(common::aetrace());
    rec.args(["record", "--data"])
        .args(mode)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(exe)
        .args(args);
    common::no_aslr(&mut rec);
    run_checked(&mut rec, "aetrace record --data");
    let out = run_checked(
        Command::new(common::aetrace())
            .args(["regen", "--format", "lackey"])
            .arg(&trace),
        "aetrace regen --format lackey",
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `aetrace regen --format lackey TRACE`, whatever its status.
fn regen_lackey(trace: &Path) -> std::process::Output {
    Command::new(common::aetrace())
        .args(["regen", "--format", "lackey"])
        .arg(trace)
        .output()
        .unwrap()
}

fn check(source: &str, variant: Variant, args: &[&str]) {
    let exe = build(source, variant);
    let tag = format!("{source}-{}", variant.tag());
    let dir = common::scratch("data_trace");
    let abs = ours(&exe, &tag, &[], args);
    let checked = ours(&exe, &tag, &["--check"], args);
    let log = common::lackey::memory_log(&exe, args, &dir.join(format!("{tag}.lackey")));
    let image = image_of(&exe);
    let theirs = parse(&log, image);
    for (mode, text) in [("--data", &abs), ("--data --check", &checked)] {
        compare(&format!("{tag} {mode}"), parse(text, image), &theirs, image);
    }
}

/// Ours and lackey's instructions agree as the module doc says.
fn compare(tag: &str, ours: Vec<Insn>, theirs: &[Insn], image: (u64, u64)) {
    assert!(!ours.is_empty(), "{tag}: no instructions");
    let mut deltas = Deltas {
        image,
        pages: HashMap::new(),
        stack: None,
    };
    let mut refs = 0;
    for (i, (o, t)) in ours.iter().zip(theirs).enumerate() {
        let form = |x: &Insn| x.2.iter().map(|r| (r.0, r.2)).collect::<Vec<_>>();
        assert_eq!(
            (o.0, o.1, form(o)),
            (t.0, t.1, form(t)),
            "{tag}: instruction {i}: (address, length, references)"
        );
        for (a, b) in o.2.iter().zip(&t.2) {
            if let Err(e) = deltas.check(a.1, b.1) {
                panic!("{tag}: instruction {i} at {:#x}: {e}", o.0);
            }
            refs += 1;
        }
    }
    assert_eq!(ours.len(), theirs.len(), "{tag}: instructions");
    assert!(refs > 0, "{tag}: no data references");
}

/// The programs the census checks, and `rep movsb`/`rep stosq` with
/// counts 0, 1 and many, recursion, return points that keep `rsp`
/// (data_calls.c: recursion, alloca in a callee, tail calls to traced
/// code and to `free`): each under a second under lackey.
#[test]
fn data_addresses_equal_lackey() {
    let o2 = Variant::new(Opt::O2, Link::NoPie, false);
    let o0 = Variant::new(Opt::O0, Link::NoPie, false);
    check("loops.c", o2, &["30"]);
    check("calltree.c", o0, &[]);
    check("cache_mix.c", o2, &[]);
    check("qsort_callback.c", o2, &[]);
    check("switch.c", o0, &[]);
    check("recursion.c", o0, &[]);
    check("rep_string.c", o2, &[]);
    check("data_calls.c", o2, &[]);
}

/// Data after a setjmp call returned again through a longjmp made inside
/// untraced code (SETJMP_RESUME; the return point's first stack reference
/// is an `rsp` anchor): out of `qsort`'s comparator to one level of a
/// recursion, and glibc's forced unwind through C cleanup handlers
/// (`pthread_exit`, a cancellation), whose threads run one after the
/// other: their functions alone are compared, in lackey's order (gcc -O1
/// inlines the handlers).
#[test]
fn data_after_a_setjmp_resumed_from_untraced_code() {
    let o1 = Variant::new(Opt::O1, Link::NoPie, false);
    check("longjmp_untraced.c", o1, &[]);
    let exe = build("pthread_cleanup.c", o1);
    let tag = format!("pthread_cleanup.c-{}", o1.tag());
    let log = common::scratch("data_trace").join(format!("{tag}.lackey"));
    let log = common::lackey::memory_log(&exe, &[], &log);
    let image = image_of(&exe);
    let kept = functions(&exe, &["exiting", "depth", "waiting", "wait_here"]);
    let keep = |text: &str| -> Vec<Insn> {
        (parse(text, image).into_iter())
            .filter(|i| inside(&kept, i.0))
            .collect()
    };
    let theirs = keep(&log);
    for mode in [&[][..], &["--check"][..]] {
        let text = ours(&exe, &tag, mode, &[]);
        compare(
            &format!("{tag} --data {}", mode.concat()),
            keep(&text),
            &theirs,
            image,
        );
    }
}

/// Asking for data where there is none: one line and a non-zero exit.
#[test]
fn data_requests_without_data_are_one_line_errors() {
    let exe = build("loops.c", Variant::new(Opt::O2, Link::NoPie, false));
    let trace = common::scratch("data_trace").join("control-only.aet");
    run_checked(
        Command::new(common::aetrace())
            .arg("record")
            .arg("-o")
            .arg(&trace)
            .arg("--")
            .arg(&exe)
            .arg("3"),
        "aetrace record",
    );
    let asks: [Vec<std::ffi::OsString>; 2] = [
        vec![
            "regen".into(),
            "--format".into(),
            "lackey".into(),
            trace.clone().into(),
        ],
        vec![
            "regen".into(),
            "--format".into(),
            "xdin".into(),
            "--data".into(),
            trace.into(),
        ],
    ];
    for args in asks {
        let out = Command::new(common::aetrace())
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("record it with --data"), "{err}");
    }
}

/// The address ranges (`nm -S`) of the named functions of `exe`.
fn functions(exe: &Path, names: &[&str]) -> Vec<(u64, u64)> {
    let out = run_checked(Command::new("nm").arg("-S").arg(exe), "nm -S");
    let text = String::from_utf8(out.stdout).unwrap();
    let found: Vec<(u64, u64)> = (text.lines())
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [a, n, _, name] if names.contains(&name) => {
                let a = u64::from_str_radix(a, 16).unwrap();
                Some((a, a + u64::from_str_radix(n, 16).unwrap()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(found.len(), names.len(), "{names:?} in {}", exe.display());
    found
}

fn inside(ranges: &[(u64, u64)], a: u64) -> bool {
    ranges.iter().any(|&(lo, hi)| (lo..hi).contains(&a))
}

/// Ours and lackey's instructions of a program with signal handlers
/// agree as `compare` says, but for where the kernel and valgrind put a
/// handler's signal frame: each handler run (from an instruction at a
/// `handlers` entry, in the functions `handling` and the PLT stubs they
/// call) has its own deltas.
fn compare_handled(
    exe: &Path,
    tag: &str,
    ours: &[Insn],
    theirs: &[Insn],
    image: (u64, u64),
    handlers: &[(u64, u64)],
    handling: &[(u64, u64)],
) -> usize {
    let fresh = || Deltas {
        image,
        pages: HashMap::new(),
        stack: None,
    };
    let (mut main, mut handler) = (fresh(), fresh());
    let plt = &common::elf::Elf::read(exe).plt_spans();
    let (mut in_handlers, mut in_handler) = (0, false);
    for (i, (o, t)) in ours.iter().zip(theirs).enumerate() {
        let form = |x: &Insn| x.2.iter().map(|r| (r.0, r.2)).collect::<Vec<_>>();
        assert_eq!(
            (o.0, o.1, form(o)),
            (t.0, t.1, form(t)),
            "{tag}: instruction {i}: (address, length, references)"
        );
        if handlers.iter().any(|h| h.0 == o.0) {
            handler = fresh();
        }
        // PLT stubs run in whichever context calls them.
        if !inside(plt, o.0) {
            in_handler = inside(handling, o.0);
        }
        in_handlers += usize::from(in_handler);
        let d = if in_handler { &mut handler } else { &mut main };
        for (a, b) in o.2.iter().zip(&t.2) {
            if let Err(e) = d.check(a.1, b.1) {
                panic!("{tag}: instruction {i} at {:#x}: {e}", o.0);
            }
        }
    }
    assert_eq!(ours.len(), theirs.len(), "{tag}: instructions");
    in_handlers
}

/// Ours without its faults' instructions: a fault's instruction had no
/// effect, and ours lists it without references right before its handler
/// (and again with them if the handler returns); lackey, one instruction
/// per superblock (`lackey::AT_FAULTS`), never lists it.
fn faults_left_out(tag: &str, ours: Vec<Insn>, handlers: &[(u64, u64)]) -> Vec<Insn> {
    let entry = |x: &Insn| handlers.iter().any(|h| h.0 == x.0);
    let faulting: Vec<bool> = (0..ours.len())
        .map(|k| ours.get(k + 1).is_some_and(entry))
        .collect();
    (ours.into_iter().zip(faulting))
        .filter(|(o, f)| {
            assert!(
                !f || o.2.is_empty(),
                "{tag}: a fault's instruction has references: {o:?}"
            );
            !f
        })
        .map(|(o, _)| o)
        .collect()
}

/// A program whose traced handlers run (raised, in a second thread, a
/// fault left by `siglongjmp` or returned from), recorded with `--data`
/// and `--data --check`, against lackey (`compare_handled`); `only`:
/// compare the instructions of these functions alone (one thread's, when
/// valgrind interleaves threads); `faults`: the handlers are of faults.
fn check_handled(source: &str, handlers: &[&str], called: &[&str], only: &[&str], faults: bool) {
    let variant = Variant::new(Opt::O2, Link::NoPie, false);
    let exe = build(source, variant);
    let tag = format!("{source}-{}", variant.tag());
    let log = common::scratch("data_trace").join(format!("{tag}.lackey"));
    let opts = if faults {
        common::lackey::AT_FAULTS
    } else {
        &[]
    };
    let log = common::lackey::memory_log_with(&exe, &[], &log, opts);
    let image = image_of(&exe);
    let entries = functions(&exe, handlers);
    let handling: Vec<_> = entries
        .iter()
        .copied()
        .chain(functions(&exe, called))
        .collect();
    let kept = functions(&exe, only);
    let keep = |v: Vec<Insn>| -> Vec<Insn> {
        v.into_iter()
            .filter(|i| kept.is_empty() || inside(&kept, i.0))
            .collect()
    };
    let theirs = keep(parse(&log, image));
    for mode in [&[][..], &["--check"][..]] {
        let text = ours(&exe, &format!("{tag}-handled"), mode, &[]);
        let name = format!("{tag} --data {}", mode.concat());
        let mut listed = keep(parse(&text, image));
        if faults {
            listed = faults_left_out(&name, listed, &entries);
        }
        let n = compare_handled(&exe, &name, &listed, &theirs, image, &entries, &handling);
        assert!(n > 0, "{name}: no handler instructions");
    }
}

/// Signals with data (docs/data.md, "Signals with data"): a SIGNAL's
/// place among the values is where its handler's start, and the
/// interrupted instruction's values come after the handler. Against
/// lackey: raise() in a loop (signal.c), a handler in a second thread
/// calling traced code (signal_thread.c), SIGSEGV handlers that
/// `siglongjmp` out (signal_fault.c) and one that returns, so the
/// faulting store runs again with its values (fault_resume.c), and handlers
/// that move rip past `ud2` or return after `int3` (trap_resume.c). Timer signals, which valgrind
/// delivers only between its blocks, land anywhere in the real run:
/// the checking mode compares every recomputed address of that run
/// (signal_alarm.c: SIGALRM every 20 us; signal_stub.c: signals nested
/// in another handler's stub, and between an ENTER and its `rsp` value).
#[test]
fn data_traces_with_signals_equal_lackey_and_the_full_addresses() {
    check_handled("signal.c", &["on_usr1", "on_usr2"], &[], &[], false);
    check_handled(
        "signal_thread.c",
        &["on_usr1"],
        &["bump"],
        &["worker", "on_usr1", "bump"],
        false,
    );
    check_handled(
        "signal_fault.c",
        &["on_fault"],
        &["record_fault"],
        &[],
        true,
    );
    check_handled("fault_resume.c", &["on_segv"], &[], &[], true);
    // A trap is listed by lackey as by ours (VEX raises SIGILL for `ud2`
    // after its instruction mark), so nothing is left out.
    check_handled("trap_resume.c", &["on_ill", "on_trap"], &[], &[], false);
    for source in ["signal_alarm.c", "signal_stub.c"] {
        check_timer_signals(source);
    }
}

/// Thread constants (docs/data.md, "Thread constants"): `__errno_location`'s
/// result, recorded once per thread and per handler, read in a main loop,
/// a second thread's, a fork child's and in nested SIGALRM handlers that
/// interrupt them anywhere (errno_signal.c): every recomputed address
/// equals the full one.
#[test]
fn thread_constants_are_recorded_once_per_thread_and_handler() {
    check_timer_signals("errno_signal.c");
}

/// `source`, whose traced handlers a timer runs anywhere, recorded with
/// `--data --check`: `regen --format lackey` succeeds, `info` checked
/// more than 1000 addresses, and more than 10 signals were handled.
fn check_timer_signals(source: &str) {
    let exe = build(source, Variant::new(Opt::O2, Link::NoPie, false));
    let trace = common::scratch("data_trace").join(format!("{source}-signals.aet"));
    common::recorded::record_data_checked(&exe, &trace);
    let out = regen_lackey(&trace);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{source}: {err}");
    let info = run_checked(
        Command::new(common::aetrace()).arg("info").arg(&trace),
        "aetrace info",
    );
    let info = String::from_utf8_lossy(&info.stdout);
    let checked = (info.lines())
        .find_map(|l| l.strip_prefix("data check: "))
        .and_then(|l| l.split(' ').next()?.parse::<u64>().ok());
    assert!(checked.is_some_and(|n| n > 1000), "{source}: {info}");
    let insns = run_checked(
        Command::new(common::aetrace()).arg("regen").arg(&trace),
        "aetrace regen",
    );
    let handled = String::from_utf8_lossy(&insns.stdout)
        .matches("# signal ")
        .count();
    assert!(handled > 10, "{source}: {handled} signals handled");
}

/// A data trace whose header says format 1.20 (values at other places:
/// every procedure's entry learned its argument registers itself) is
/// refused in one line, not misread.
#[test]
fn data_values_of_an_older_format_are_refused() {
    let exe = build("loops.c", Variant::new(Opt::O2, Link::NoPie, false));
    let trace = common::scratch("data_trace").join("minor20.aet");
    run_checked(
        Command::new(common::aetrace())
            .args(["record", "--data", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&exe)
            .arg("3"),
        "aetrace record --data",
    );
    let mut bytes = std::fs::read(&trace).unwrap();
    bytes[10..12].copy_from_slice(&20u16.to_le_bytes());
    let crc = crc32fast::hash(&bytes[..60]);
    bytes[60..64].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&trace, bytes).unwrap();
    let out = regen_lackey(&trace);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty(), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("format 1.20") && err.contains("record the trace again"),
        "{err}"
    );
}

/// The checking mode catches a wrong recorded address: with the first
/// address of `main` recorded 8 bytes off (fault injection), regen stops
/// with one line naming the procedure and both addresses; without the
/// fault the same trace regenerates.
#[test]
fn data_check_names_the_first_wrong_address() {
    let exe = build("calltree.c", Variant::new(Opt::O0, Link::NoPie, false));
    let trace = common::scratch("data_trace").join("fault.aet");
    let regen = |fault: bool| {
        let mut rec = Command::new(common::aetrace());
        rec.args(["record", "--data", "--check", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&exe);
        if fault {
            rec.env("AETRACE_FAULT_DATA_ADDR", "main");
        }
        run_checked(&mut rec, "aetrace record --data --check");
        regen_lackey(&trace)
    };
    assert!(regen(false).status.success(), "without the fault");
    let out = regen(true);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the faulty trace regenerated");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("data check: procedure main ") && err.contains("expected 0x"),
        "{err}"
    );
}

/// `traces/nolibc_data.c` (read-modify-writes plain and locked, `rep
/// movsb`/`rep stosq`, line-straddling loads and stores, push/pop of
/// memory, SSE, and with `FX_STATE` `fxsave`/`fxrstor` (18 references
/// each); without libc, its stack a static array, so every address is
/// a link-time one): our lackey text, from `--data` and from `--data
/// --check`, equals valgrind lackey's line for line.
#[test]
fn nolibc_data_equals_lackey_line_for_line() {
    let dir = common::scratch("data_trace");
    let exe = common::build::build_nolibc(&dir, "nolibc_data.c", &["-DFX_STATE"], "nolibc_data_fx");
    let theirs = common::lackey::memory_log(&exe, &[], &dir.join("nolibc_data_fx.lackey"));
    let theirs: Vec<&str> = theirs.lines().filter(|l| !l.starts_with("==")).collect();
    for mode in [&[][..], &["--check"][..]] {
        let text = ours(&exe, "nolibc_data_fx", mode, &[]);
        let ours: Vec<&str> = text.lines().collect();
        let first = ours.iter().zip(&theirs).position(|(a, b)| a != b);
        assert_eq!(first, None, "{mode:?}: first different line");
        assert_eq!(ours.len(), theirs.len(), "{mode:?}: lines");
        // Locked read-modify-writes are `L` + `M` (VEX's load, then its
        // compare-and-swap): the test sees them.
        let lm = ours
            .windows(2)
            .filter(|w| w[0].starts_with(" L ") && w[1].starts_with(" M "));
        assert!(lm.count() >= 2000, "{mode:?}: the locked forms ran");
        let fx = ours.iter().filter(|l| l.ends_with(",160"));
        assert_eq!(
            fx.count(),
            8 * 3,
            "{mode:?}: the fxsave and fxrstor forms ran"
        );
    }
}

/// Issue 21: cachegrind's statistics (`valgrind --tool=cachegrind
/// --cache-sim=yes`) equal `aetrace cachesim --model cachegrind` of a
/// `record --data` trace, in the process and through `regen --format xdin
/// --data` and `--format bin --data`: I refs, I1 and LLi misses, and D refs, D1 and LLd misses each
/// split into reads and writes. Programs: traces/demo.c's naive and blocked
/// matrix multiply and traces/nolibc_data.c, each a whole program without
/// libc (every reference of the process traced) whose data addresses are
/// all link-time ones (matrices and stack in page-aligned static arrays),
/// so both runs touch the same lines. nolibc_data.c's read-modify-writes
/// (one read for cachegrind, two references in extended din), locked forms
/// (two reads), rep iterations and straddling references make a wrong
/// count in any of them fail.
#[test]
fn cachegrind_equals_cachesim_on_data_traces() {
    let dir = common::scratch("data_cachegrind");
    let programs = [
        ("demo.c", &["-DNOLIBC"][..], "demo_naive"),
        ("demo.c", &["-DNOLIBC", "-DBLOCKED"][..], "demo_blocked"),
        ("nolibc_data.c", &[][..], "nolibc_data"),
    ];
    // (I1, D1, LL) as cachegrind's size,assoc,line.
    let geometries = [
        ((32768, 8, 64), (32768, 8, 64), (262144, 8, 64)),
        ((1024, 1, 32), (4096, 2, 64), (16384, 4, 64)),
    ];
    for (source, defines, name) in programs {
        let exe = common::build::build_nolibc(&dir, source, defines, name);
        let native = common::build::run_native(&exe, &[]);
        let trace = dir.join(format!("{name}.aet"));
        let rec = run_checked(
            Command::new(common::aetrace())
                .args(["record", "--data", "-o"])
                .arg(&trace)
                .arg("--")
                .arg(&exe),
            "aetrace record --data",
        );
        assert_eq!(rec.stdout, native.stdout, "{name}: stdout");
        let info = common::recorded::info_json(&trace);
        let left = &info["programs"][0]["left_alone"];
        assert_eq!(left.as_array().map(Vec::len), Some(0), "{name}: {left}");
        let [xdin, bin] = ["xdin", "bin"].map(|format| {
            let out = dir.join(format!("{name}.{format}"));
            run_checked(
                Command::new(common::aetrace())
                    .args(["regen", "--format", format, "--data", "-o"])
                    .arg(&out)
                    .arg(&trace),
                "aetrace regen --data",
            );
            out
        });
        for (i1, d1, ll) in geometries {
            let ctx = format!("{name}: I1 {i1:?} D1 {d1:?} LL {ll:?}");
            let theirs = cachegrind(&exe, i1, d1, ll);
            let stats = |input: &Path| {
                let args = common::cachegrind::model_args(i1, d1, ll, input);
                let out = run_checked(
                    Command::new(common::aetrace()).arg("cachesim").args(&args),
                    "aetrace cachesim --model cachegrind",
                );
                serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["stats"].clone()
            };
            let ours = stats(&trace);
            assert_eq!(ours, stats(&xdin), "{ctx}: in the process against the pipe");
            assert_eq!(ours, stats(&bin), "{ctx}: in the process against bin");
            let get = |k: &str| ours[k].as_u64().unwrap();
            let num = |label| common::cachegrind::number(&theirs, label);
            let rw = |label| common::cachegrind::read_write(&theirs, label);
            assert_eq!(get("i_refs"), num("I   refs:"), "{ctx}: I refs");
            assert_eq!(get("i1_misses"), num("I1  misses:"), "{ctx}: I1 misses");
            assert_eq!(get("lli_misses"), num("LLi misses:"), "{ctx}: LLi misses");
            assert_eq!(
                (get("d_reads"), get("d_writes")),
                rw("D   refs:"),
                "{ctx}: D refs (rd, wr)"
            );
            assert_eq!(
                (get("d1_read_misses"), get("d1_write_misses")),
                rw("D1  misses:"),
                "{ctx}: D1 misses (rd, wr)"
            );
            assert_eq!(
                (get("lld_read_misses"), get("lld_write_misses")),
                rw("LLd misses:"),
                "{ctx}: LLd misses (rd, wr)"
            );
            assert!(get("d1_read_misses") > 50, "{ctx}: D1 exercised");
            eprintln!(
                "{ctx}: D refs {:?}, D1 misses {:?}, LLd misses {:?} (cachegrind = aetrace)",
                rw("D   refs:"),
                rw("D1  misses:"),
                rw("LLd misses:")
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Cachegrind's summary (stderr) of `exe` with these caches.
fn cachegrind(
    exe: &Path,
    i1: common::cachegrind::Geometry,
    d1: common::cachegrind::Geometry,
    ll: common::cachegrind::Geometry,
) -> String {
    let (status, summary) =
        common::cachegrind::run(exe, &[], (i1, d1, ll), std::process::Stdio::null());
    assert!(status.success(), "cachegrind run of {}", exe.display());
    summary
}

/// A `rep` string instruction faulting after some of its iterations
/// (`traces/rep_fault.c`: `rep movsb`/`stosb`/`movsl`/`stosq` into a PROT_NONE page, a
/// handler that makes it writable and returns, and a crash variant), format
/// 1.13: the runtime records `rcx`, `rsi`, `rdi` at the fault, and `regen
/// --format lackey` lists the iterations before the fault, the faulting
/// one's fetch alone, the handler, then the iterations left, in `--data`
/// and `--data --check`. Oracles: the crash against lackey, reference by
/// reference (valgrind crashes there too); the handled run against the
/// registers its handler read from each fault's context, which the program
/// prints (lackey's resumed `rep` runs one iteration fewer than the native
/// one: valgrind's run prints another sum), and its instructions against
/// lackey's (a `rep` once per execution).
#[test]
fn a_rep_faulting_mid_way_lists_its_iterations_around_the_handler() {
    let exe = build("rep_fault.c", Variant::new(Opt::O2, Link::NoPie, false));
    let image = image_of(&exe);
    let dir = common::scratch("data_trace");
    let lackey = common::lackey::AT_FAULTS;
    let log = dir.join("rep_fault_crash.lackey");
    let crash = parse(
        &common::lackey::crash_memory_log(&exe, &["crash"], &log, lackey),
        image,
    );
    let log = common::lackey::memory_log_with(&exe, &[], &dir.join("rep_fault.lackey"), lackey);
    let once = |v: &[Insn]| -> Vec<u64> {
        let mut v: Vec<u64> = v.iter().map(|i| i.0).collect();
        v.dedup();
        v
    };
    let handled = once(&parse(&log, image));
    let on_segv = functions(&exe, &["on_segv"])[0].0;
    for mode in ["", "--check"] {
        let trace = dir.join(format!("rep_fault_crash{mode}.aet"));
        let st = record_rep_fault(&exe, mode, &["crash"], &trace).status;
        assert!(!st.success(), "{mode} crash: {st}");
        let out = regen_lackey(&trace);
        assert!(
            out.status.success(),
            "{mode} crash: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ours = parse(&String::from_utf8_lossy(&out.stdout), image);
        compare(&format!("rep_fault crash {mode}"), ours, &crash, image);

        let trace = dir.join(format!("rep_fault{mode}.aet"));
        let rec = record_rep_fault(&exe, mode, &[], &trace);
        assert!(rec.status.success(), "{mode}: {}", rec.status);
        let faults: Vec<[u64; 3]> = String::from_utf8_lossy(&rec.stdout)
            .lines()
            .filter_map(|l| {
                let w: Vec<&str> = l.strip_prefix("fault ")?.split(' ').collect();
                let num = |k: usize, radix| u64::from_str_radix(w[k], radix).unwrap();
                Some([num(1, 10), num(3, 16), num(5, 16)])
            })
            .collect();
        assert_eq!(faults.len(), 12, "{mode}: the program's faults");
        let out = regen_lackey(&trace);
        assert!(
            out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ours = parse(&String::from_utf8_lossy(&out.stdout), image);
        assert_eq!(once(&ours), handled, "{mode}: instructions");
        let entries: Vec<usize> = (0..ours.len()).filter(|&k| ours[k].0 == on_segv).collect();
        assert_eq!(entries.len(), faults.len(), "{mode}: handler runs");
        for (&h, f) in entries.iter().zip(&faults) {
            check_rep_fault(&format!("{mode} fault at {h}"), &ours, h, *f);
        }
    }
}

/// `traces/rep_signal.c`: a 20 us timer stops `rep stosq` and `rep
/// movsb` between iterations (at the page faults of fresh pages); its
/// handler prints each delivery's context (at a `rep`: rcx, rsi, rdi).
/// `--data` and `--data --check`: before each such handler run, the `rep`
/// iterations that ran before the signal, their last store ending at the
/// printed `rdi`; after it the `rep` resumes at the printed `rdi` (and
/// `rsi`) with at most the printed `rcx` iterations (exactly, unless
/// another signal stops it again). Before format 1.16 all the
/// iterations came after the handler. About 3 s.
#[test]
fn a_rep_stopped_by_a_timer_lists_its_iterations_around_the_handler() {
    let exe = build("rep_signal.c", Variant::new(Opt::O2, Link::NoPie, false));
    let image = image_of(&exe);
    let dir = common::scratch("data_trace");
    let on_alarm = functions(&exe, &["on_alarm"])[0].0;
    for mode in ["", "--check"] {
        let trace = dir.join(format!("rep_signal{mode}.aet"));
        let rec = record_rep_fault(&exe, mode, &[], &trace);
        assert!(rec.status.success(), "{mode}: {}", rec.status);
        let stdout = String::from_utf8_lossy(&rec.stdout);
        let words = |p: &str| -> Vec<Vec<String>> {
            (stdout.lines())
                .filter_map(|l| l.strip_prefix(p))
                .map(|l| l.split(' ').map(String::from).collect())
                .collect()
        };
        let hex = |w: &str| u64::from_str_radix(w, 16).unwrap();
        let sites = &words("sites ")[0];
        let sites = [hex(&sites[0]), hex(&sites[1])];
        let deliveries: Vec<(usize, [u64; 3])> = (words("signal ").iter())
            .map(|w| {
                (
                    w[0].parse().unwrap(),
                    [w[2].parse().unwrap(), hex(&w[4]), hex(&w[6])],
                )
            })
            .collect();
        let out = regen_lackey(&trace);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode}: {err}");
        let ours = parse(&String::from_utf8_lossy(&out.stdout), image);
        let entries: Vec<usize> = (0..ours.len()).filter(|&k| ours[k].0 == on_alarm).collect();
        assert_eq!(entries.len(), deliveries.len(), "{mode}: handler runs");
        let mut mid_way = 0;
        for (&h, &(at, regs)) in entries.iter().zip(&deliveries) {
            if at > 0 {
                let tag = format!("{mode} signal at {h}");
                mid_way += usize::from(check_rep_signal(&tag, &ours, h, sites[at - 1], regs));
            }
        }
        assert!(
            mid_way > 0,
            "{mode}: no signal stopped a `rep` after some of its iterations"
        );
    }
}

/// Around the handler run entered at `ours[h]`, for a signal that stopped
/// the `rep` at `rep` with `[rcx, rsi, rdi]` in its context: the
/// iterations right before the handler (if any: whether there were) end
/// their store at `rdi`; after the handler the `rep` resumes at `rdi` (and
/// `rsi`, a `movs`) for `rcx` iterations, fewer when another handler
/// stops it again first.
fn check_rep_signal(
    tag: &str,
    ours: &[Insn],
    h: usize,
    rep: u64,
    [rcx, rsi, rdi]: [u64; 3],
) -> bool {
    let store = |i: &Insn| i.2.iter().find(|r| r.0 == 'S').map(|r| (r.1, r.2));
    let before = ours[..h].last().filter(|i| i.0 == rep && !i.2.is_empty());
    if let Some(last) = before {
        let end = store(last).map(|(a, size)| a + size);
        assert_eq!(end, Some(rdi), "{tag}: the store before the signal");
    }
    let resumed = h + ours[h..]
        .iter()
        .position(|i| i.0 == rep)
        .expect("the rep resumes");
    let after = ours[resumed..]
        .iter()
        .take_while(|i| i.0 == rep && !i.2.is_empty());
    let n = after.clone().count() as u64;
    let stopped_again = ours.get(resumed + n as usize).is_some_and(|i| i.0 != rep);
    match stopped_again {
        true => assert!(
            n <= rcx,
            "{tag}: {n} iterations after the handler, {rcx} left"
        ),
        false => assert_eq!(n, rcx, "{tag}: iterations after the handler"),
    }
    if let Some(first) = after.clone().next() {
        assert_eq!(
            store(first).map(|(a, _)| a),
            Some(rdi),
            "{tag}: the first store after"
        );
        if first.2.len() == 2 {
            assert_eq!(first.2[0].1, rsi, "{tag}: the first load after the handler");
        }
    }
    before.is_some()
}

/// `aetrace record --data [MODE] -o TRACE -- EXE ARGS`, whatever its status.
fn record_rep_fault(exe: &Path, mode: &str, args: &[&str], trace: &Path) -> std::process::Output {
    let mut rec = Command::new(common::aetrace());
    rec.args(["record", "--data"])
        .args((!mode.is_empty()).then_some(mode));
    rec.arg("-o").arg(trace).arg("--").arg(exe).args(args);
    rec.output().unwrap()
}

/// Around the handler run entered at `ours[h]`: the faulting `rep` right
/// before it (its fetch alone), after the iterations that wrote up to the
/// `rdi` its context held (`[rcx, rsi, rdi]` at the fault); after the
/// handler, the same `rep` resumes at that `rdi` (and `rsi`, a `movs`) for
/// `rcx` iterations.
fn check_rep_fault(tag: &str, ours: &[Insn], h: usize, [rcx, rsi, rdi]: [u64; 3]) {
    let rep = ours[h - 1].0;
    assert!(
        ours[h - 1].2.is_empty(),
        "{tag}: the faulting fetch has references"
    );
    let store = |i: &Insn| i.2.iter().find(|r| r.0 == 'S').map(|r| (r.1, r.2));
    // A wide element straddling the guard page may fault before any ran.
    let before = ours[..h - 1]
        .iter()
        .rev()
        .take_while(|i| i.0 == rep && !i.2.is_empty());
    if let Some(last) = before.into_iter().next() {
        assert_eq!(
            store(last).map(|(a, size)| a + size),
            Some(rdi),
            "{tag}: the store before the fault"
        );
    }
    let resumed = h + ours[h..]
        .iter()
        .position(|i| i.0 == rep)
        .expect("the rep resumes");
    let after: Vec<&Insn> = ours[resumed..]
        .iter()
        .take_while(|i| !i.2.is_empty())
        .collect();
    assert_eq!(
        after.len() as u64,
        rcx,
        "{tag}: iterations after the handler"
    );
    assert_eq!(
        store(after[0]).map(|(a, _)| a),
        Some(rdi),
        "{tag}: the first store after the handler"
    );
    if after[0].2.len() == 2 {
        assert_eq!(
            after[0].2[0].1, rsi,
            "{tag}: the first load after the handler"
        );
    }
}

/// `traces/xsave.c`: a module holding an instruction the data walk cannot
/// model (`xsave`, whose size the CPU decides) records with `--data` and
/// `--data --check` (before, the rewrite was refused: static glibc's
/// `_dl_runtime_resolve_xsave` kept every static program from `--data`).
/// A run that does not execute it regenerates its data; one that does is
/// refused in one line naming procedure, block and instruction, and its
/// control trace still regenerates. Oracle: the program's own output.
#[test]
fn an_unmodelled_instruction_refuses_only_the_runs_that_execute_it() {
    let exe = build("xsave.c", Variant::new(Opt::O2, Link::Pie, false));
    let dir = common::scratch("data_trace");
    for (mode, args) in [("", &[][..]), ("--check", &["run"][..]), ("", &["run"])] {
        let trace = dir.join(format!("xsave{mode}{}.aet", args.concat()));
        let native = Command::new(&exe).args(args).output().unwrap();
        let mut rec = Command::new(common::aetrace());
        rec.args(["record", "--data"])
            .args((!mode.is_empty()).then_some(mode));
        rec.arg("-o").arg(&trace).arg("--").arg(&exe).args(args);
        let recorded = run_checked(&mut rec, "aetrace record --data");
        assert_eq!(recorded.stdout, native.stdout, "{mode} {args:?}");
        let out = regen_lackey(&trace);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.success(),
            args.is_empty(),
            "{mode} {args:?}: {err}"
        );
        if !args.is_empty() {
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(
                err.contains("procedure save block 0x") && err.contains("(xsave "),
                "{err}"
            );
        }
        let control = Command::new(common::aetrace())
            .arg("regen")
            .arg(&trace)
            .output()
            .unwrap();
        assert!(control.status.success(), "{mode} {args:?}: control regen");
        let _ = std::fs::remove_file(&trace);
    }
}
