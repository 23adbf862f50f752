//! `aetrace count --stop-at N` under gdb (paper 002's on-line queries):
//! the rewritten program, run by `gdb -batch`, must stop exactly at the
//! N-th event. The oracle shares no code with the counters: the N-th
//! instruction of the regenerated trace of a recording (witnesses, not
//! counters) for `insns`, the N-th block of the regenerated block trace for
//! `blocks`, and for `calls` the N-th entry into a function of the
//! instruction trace (function starts from `nm` and the PLT sections, an
//! entry being any arrival there but a jump from inside the function).
//! The N are chosen from the trace: the first and last events, main's
//! first instruction and its successor, the inside of a loop, of a callee,
//! the instruction right after a return.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};

use common::build::{build, run_checked, run_native, Link, Opt, Variant};
use common::elf::Elf;

const O2_PIE: Variant = Variant::new(Opt::O2, Link::Pie, false);
const O0_PIE: Variant = Variant::new(Opt::O0, Link::Pie, false);

/// Module-relative addresses of one regenerated trace (`--relative`).
fn regen(trace: &Path, format: &str) -> Vec<u64> {
    common::regen::addresses(trace, &["--relative", "--format", format])
}

/// The function ranges of `exe` (`nm -S`) and the 16-byte entries of its
/// PLT sections, sorted by start.
fn functions(exe: &Path, elf: &Elf) -> Vec<(u64, u64, String)> {
    let out = run_checked(
        Command::new("nm").args(["-S", "--defined-only"]).arg(exe),
        "nm",
    );
    let mut f: Vec<(u64, u64, String)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let (a, s, name) = match w[..] {
                // Weak ones too (C++ template instances).
                [a, s, "T" | "t" | "W" | "w", name] => (a, s, name),
                // No size (`_init`): its start still counts.
                [a, "T" | "t" | "W" | "w", name] => (a, "0", name),
                _ => return None,
            };
            Some((
                u64::from_str_radix(a, 16).unwrap(),
                u64::from_str_radix(s, 16).unwrap(),
                name.to_owned(),
            ))
        })
        .collect();
    for s in elf.sections.iter().filter(|s| s.name.starts_with(".plt")) {
        for (i, at) in (s.addr..s.addr + s.size).step_by(16).enumerate() {
            f.push((at, 16, format!("{}#{i}", s.name)));
        }
    }
    f.sort();
    f
}

/// What the instruction at `addr` is, from its bytes.
#[derive(PartialEq, Eq)]
enum Kind {
    Call,
    Ret,
    /// A direct jump or conditional branch.
    Jump,
    Other,
}

fn kind(elf: &Elf, addr: u64) -> Kind {
    let s = elf
        .sections
        .iter()
        .find(|s| s.exec && s.addr <= addr && addr < s.addr + s.size)
        .unwrap_or_else(|| panic!("{addr:#x} is in no code section"));
    let b = elf.bytes_of(s, addr, 16.min(s.addr + s.size - addr));
    let i = b
        .iter()
        .position(|&c| !matches!(c, 0x66 | 0xf2 | 0xf3 | 0x2e | 0x3e | 0x40..=0x4f))
        .unwrap();
    match b[i..] {
        [0xe8, ..] => Kind::Call,
        [0xff, m, ..] if (m >> 3) & 7 == 2 => Kind::Call,
        [0xc3 | 0xc2, ..] => Kind::Ret,
        [0xeb | 0xe9 | 0x70..=0x7f, ..] | [0x0f, 0x80..=0x8f, ..] => Kind::Jump,
        _ => Kind::Other,
    }
}

/// Positions in `insns` where a function is entered: an arrival at its
/// start other than by a jump from inside it, or from the function whose
/// `.cold` part it is (gcc's split: one procedure).
fn entries(insns: &[u64], funcs: &[(u64, u64, String)], elf: &Elf) -> Vec<usize> {
    let starts: BTreeSet<u64> = funcs.iter().map(|f| f.0).collect();
    let func_of = |a: u64| {
        let i = funcs.partition_point(|f| f.0 <= a);
        i.checked_sub(1)
            .map(|i| &funcs[i])
            .filter(|f| a < f.0 + f.1.max(1))
    };
    let same_procedure = |from: &(u64, u64, String), to: u64| {
        from.0 == to || func_of(to).is_some_and(|t| t.0 == to && t.2 == format!("{}.cold", from.2))
    };
    (0..insns.len())
        .filter(|&i| starts.contains(&insns[i]))
        .filter(|&i| {
            i == 0
                || !func_of(insns[i - 1]).is_some_and(|f| same_procedure(f, insns[i]))
                || kind(elf, insns[i - 1]) != Kind::Jump
        })
        .collect()
}

/// How a run under gdb went.
struct Stop {
    /// Where gdb stopped, relative to the module's base.
    at: u64,
    /// What the program wrote, stopped and continued (`$eflags` without
    /// the trap flag), and gdb's line on how it ended (with the whole
    /// transcript when it did not).
    stdout: Vec<u8>,
    ended: Result<String, String>,
}

/// One gdb session for many stops: before each `run`, gdb's `shell` has
/// `aetrace count --event E --stop-at N` write the program for that stop
/// to `prog` (the recorded program's path, so that `argv[0]` is the same).
/// gdb starting once, not once per stop, reads the libraries' symbols once:
/// most of the time of a stop. `commands` are gdb's for one stop (`{out}`
/// is replaced by a file for the program's stdout); returns each stop's
/// transcript, or the whole one where a stop is missing.
fn gdb_stops(
    exe: &Path,
    args: &[&str],
    prog: &Path,
    stops: &[(&str, usize)],
    setup: &[&str],
    commands: &[&str],
) -> Vec<Result<String, String>> {
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let target: Vec<String> = [exe.to_str().unwrap()]
        .into_iter()
        .chain(args.iter().copied())
        .map(quote)
        .collect();
    let mut gdb = Command::new("gdb");
    gdb.args(["-batch", "-nx"]);
    for c in setup {
        gdb.args(["-ex", c]);
    }
    for (k, &(event, n)) in stops.iter().enumerate() {
        // gdb rereads a program whose modification time changed, in whole
        // seconds: each written program gets a time of its own, or a
        // program written in the second of the one before keeps the old
        // one's unwind tables (gdb then failed an assertion on an FDE).
        let write = format!(
            "shell {aetrace} count --event {event} --stop-at {n} --write-program {prog} -- {} >/dev/null 2>&1 && touch -d @{} {prog} || echo '@@write failed'",
            target.join(" "),
            1_000_000_000 + k,
            aetrace = quote(common::aetrace().to_str().unwrap()),
            prog = quote(prog.to_str().unwrap()),
        );
        let out = prog.with_file_name(format!("{event}-{n}.out"));
        gdb.args(["-ex", &format!("echo @@stop {k}\\n"), "-ex", &write]);
        for c in commands {
            gdb.args(["-ex", &c.replace("{out}", out.to_str().unwrap())]);
        }
    }
    let out = gdb
        .arg("--args")
        .arg(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("gdb runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let whole = || format!("{text}{}", String::from_utf8_lossy(&out.stderr));
    let mut parts = text.split("@@stop ").skip(1);
    (0..stops.len())
        .map(|k| {
            let part = parts.next().ok_or_else(whole)?;
            let part = part.strip_prefix(&format!("{k}\n")).ok_or_else(whole)?;
            match part.contains("@@write failed") {
                true => Err(format!("aetrace count --write-program failed\n{}", whole())),
                false => Ok(part.to_owned()),
            }
        })
        .collect()
}

/// The value of gdb's first `p/x` in a transcript.
fn printed_hex(text: &str) -> Option<u64> {
    text.lines()
        .filter(|l| l.starts_with('$'))
        .find_map(|l| l.split_once(" = 0x"))
        .and_then(|(_, h)| u64::from_str_radix(h.trim(), 16).ok())
}

/// Runs the programs `aetrace count --stop-at n` writes for each of
/// `stops` under gdb, stops there and continues.
fn stops_under_gdb(exe: &Path, args: &[&str], stops: &[(&str, usize)], prog: &Path) -> Vec<Stop> {
    let commands = [
        // `run` with arguments replaces those of `--args`.
        &format!("run {} > {{out}}", args.join(" ")),
        "p/x $pc",
        "info proc mappings",
        "set $eflags &= ~0x100",
        "continue",
    ];
    let texts = gdb_stops(exe, args, prog, stops, &[], &commands);
    let name = prog.to_str().unwrap();
    (stops.iter().zip(texts))
        .map(|(&(event, n), text)| {
            let what = |t: &str| {
                format!(
                    "{}: --event {event} --stop-at {n}: gdb said\n{t}",
                    exe.display()
                )
            };
            let text = text.unwrap_or_else(|t| panic!("{}", what(&t)));
            assert!(
                text.contains("Program received signal SIGTRAP"),
                "no SIGTRAP: {}",
                what(&text)
            );
            let pc = printed_hex(&text).unwrap_or_else(|| panic!("no pc: {}", what(&text)));
            let base = text
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|w| w.len() >= 6 && w[3] == "0x0" && w[5] == name)
                .map(|w| u64::from_str_radix(w[0].trim_start_matches("0x"), 16).unwrap())
                .unwrap_or_else(|| panic!("no base mapping: {}", what(&text)));
            let ended = text
                .lines()
                .find(|l| l.starts_with("[Inferior 1"))
                .map(str::to_owned)
                .ok_or_else(|| what(&text));
            let out = prog.with_file_name(format!("{event}-{n}.out"));
            Stop {
                at: pc - base,
                stdout: std::fs::read(&out).unwrap_or_default(),
                ended,
            }
        })
        .collect()
}

/// Records `source`, regenerates its traces and checks every event kind at
/// the interesting N of each.
fn check(source: &str, v: Variant, args: &[&str]) {
    check_events(source, v, args, true);
}

/// [`check`], with `calls` or without.
fn check_events(source: &str, v: Variant, args: &[&str], calls: bool) {
    let exe = build(source, v);
    let tag = format!("{}-{}", source.replace('.', "_"), v.tag());
    check_exe(&exe, &tag, args, true, calls);
}

/// [`check`] of `exe`; without `symbols` (stripped), only insns and blocks
/// at the first, last and evenly spread N; `calls` also needs `symbols`.
fn check_exe(exe: &Path, tag: &str, args: &[&str], symbols: bool, calls_too: bool) {
    let dir = common::scratch("stop_at").join(tag);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.aet");
    // Recorded and stopped at the same path: gdb passes the full path as
    // argv[0], and programs may branch on it (gzip does).
    let prog = dir.join("program");
    std::fs::copy(exe, &prog).unwrap();
    let native = run_native(exe, args);
    let rec = Command::new(common::aetrace())
        .args(["record", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(rec.stdout, native.stdout, "{tag}: recorded run's stdout");
    let insns = regen(&trace, "insn");
    let blocks = regen(&trace, "block");
    let elf = Elf::read(exe);
    let funcs = functions(exe, &elf);
    let calls = entries(&insns, &funcs, &elf);

    // Instructions (1-based N).
    let mut ns: BTreeSet<usize> = [0, insns.len() / 2, insns.len() - 1].into();
    // Evenly spread ones, wherever the program is then.
    ns.extend((1..6).map(|k| k * insns.len() / 6 + k));
    let hottest = {
        let mut counts = std::collections::HashMap::new();
        for &a in &insns {
            *counts.entry(a).or_insert(0usize) += 1;
        }
        let (&a, _) = counts.iter().max_by_key(|&(a, n)| (n, a)).unwrap();
        let at: Vec<usize> = (0..insns.len()).filter(|&i| insns[i] == a).collect();
        at[at.len() / 2]
    };
    ns.insert(hottest);
    // main's first instructions, a callee's, the one after a return.
    let main = funcs.iter().find(|f| f.2 == "main");
    let first_main = main.map(|m| insns.iter().position(|&a| a == m.0).expect("main runs"));
    if let (Some(m), Some(first)) = (main, first_main) {
        let in_callee = (first..insns.len())
            .find(|&i| !(m.0..m.0 + m.1).contains(&insns[i]))
            .map(|i| (i + 2).min(insns.len() - 1))
            .expect("main calls something");
        let after_ret = (first + 1..insns.len())
            .find(|&i| kind(&elf, insns[i - 1]) == Kind::Ret)
            .expect("a return");
        ns.extend([first, first + 1, in_callee, after_ret]);
    }
    assert_eq!(first_main.is_some(), symbols, "{tag}: main");
    ns.retain(|&i| i < insns.len());
    // Stopped and continued, the program must end as it does natively
    // (nothing skipped or run twice before the stop), unless the stop is
    // under a springboard but for its first byte (docs/profile.md).
    let native_end = match native.status.code() {
        Some(0) => "exited normally]".to_owned(),
        Some(c) => format!("exited with code {c:02o}]"),
        None => panic!("{tag}: killed natively"),
    };
    let continued = |s: &Stop, what: &str| {
        let springboard = funcs
            .iter()
            .any(|f| (1..5).contains(&s.at.wrapping_sub(f.0)));
        if !springboard {
            let ended = s
                .ended
                .as_ref()
                .unwrap_or_else(|e| panic!("{tag}: {what}: {e}"));
            assert!(ended.ends_with(&native_end), "{tag}: {what}: {ended}");
            assert_eq!(s.stdout, native.stdout, "{tag}: {what}: continued stdout");
        }
    };
    // (event, N, the trace's address there)
    let mut wanted: Vec<(&str, usize, u64)> =
        ns.iter().map(|&i| ("insns", i + 1, insns[i])).collect();

    // Blocks.
    let mut ns: BTreeSet<usize> = [0, blocks.len() / 3, blocks.len() - 1].into();
    if let Some(m) = main {
        let first = blocks.iter().position(|&a| a == m.0).expect("main runs");
        ns.extend([first, first + 1]);
    }
    ns.retain(|&i| i < blocks.len());
    wanted.extend(ns.iter().map(|&i| ("blocks", i + 1, blocks[i])));

    // Calls.
    if symbols && calls_too {
        assert!(calls.len() >= 3, "{tag}: {} function entries", calls.len());
        let ns: BTreeSet<usize> = [0, 1, calls.len() / 2, calls.len() - 1].into();
        wanted.extend(ns.iter().map(|&i| ("calls", i + 1, insns[calls[i]])));
    }
    let stops: Vec<(&str, usize)> = wanted.iter().map(|&(e, n, _)| (e, n)).collect();
    let got = stops_under_gdb(exe, args, &stops, &prog);
    for (&(event, n, want), s) in wanted.iter().zip(&got) {
        continued(s, &format!("{event} {n}"));
        assert_eq!(
            s.at, want,
            "{tag}: --event {event} --stop-at {n}: gdb stopped at {:#x}, the trace's {event} {n} is at {want:#x}",
            s.at
        );
    }
    if !symbols || !calls_too {
        return;
    }

    // Without gdb: a stop is a death by SIGTRAP; a run that ends first says
    // so and keeps its exit status.
    let run = |n: usize| {
        Command::new(common::aetrace())
            .args(["count", "--stop-at", &n.to_string(), "--"])
            .arg(exe)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let past = run(insns.len() + 1);
    assert_eq!(past.status.code(), native.status.code(), "{tag}: status");
    assert_eq!(past.stdout, native.stdout, "{tag}: stdout");
    let err = String::from_utf8_lossy(&past.stderr);
    assert!(
        err.contains(&format!("ended before insns {}", insns.len() + 1))
            && err.contains(&format!("aetrace: {} insns", insns.len())),
        "{tag}: {err}"
    );
    let stopped = run(insns.len());
    use std::os::unix::process::ExitStatusExt;
    assert!(
        stopped.status.signal() == Some(5) || stopped.status.code() == Some(128 + 5),
        "{tag}: stopping at the last instruction: {:?} {}",
        stopped.status,
        String::from_utf8_lossy(&stopped.stderr)
    );
}

/// The instructions and block starts `aetrace count` counts in `exe`
/// (every procedure but those left alone), from the structure of its
/// profile (block starts and instruction offsets, not counts).
fn counted_code(exe: &Path, dir: &Path) -> (std::collections::HashSet<u64>, BTreeSet<u64>) {
    let prof = dir.join("structure.aprof");
    run_checked(
        Command::new(common::aetrace())
            .args(["profile", "-o"])
            .arg(&prof)
            .arg("--")
            .arg(exe)
            .stdout(Stdio::null()),
        "aetrace profile",
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&prof).unwrap()).unwrap();
    let (mut insns, mut starts) = (std::collections::HashSet::new(), BTreeSet::new());
    for p in v["procs"].as_array().unwrap() {
        for b in p["blocks"].as_array().into_iter().flatten() {
            let start = b["start"].as_u64().unwrap();
            starts.insert(start);
            for o in b["insns"].as_array().unwrap() {
                insns.insert(start + o.as_u64().unwrap());
            }
        }
    }
    (insns, starts)
}

/// `--stop-at` in a static executable (non-PIE). The recorded trace cannot
/// be the oracle: the libc's startup code is counted too, and it walks the
/// program headers and reads `/proc/self/exe`, which differ between the
/// recorded and the stopped programs. So the oracle is the stopped program
/// itself, at its path, with the original code and entry point put back,
/// single-stepped (`common::singlestep`) with the environment gdb gives it
/// (none): its N-th instruction of a counted procedure (a `rep` instruction
/// once per execution), its N-th entry into a counted block.
fn check_static(exe: &Path, tag: &str, args: &[&str]) {
    let dir = common::scratch("stop_at").join(tag);
    std::fs::create_dir_all(&dir).unwrap();
    let prog = dir.join("program");
    let elf = Elf::read(exe);
    let (counted, starts) = counted_code(exe, &dir);
    let write = |event: &str, n: usize| {
        run_checked(
            Command::new(common::aetrace())
                .args(["count", "--event", event, "--stop-at", &n.to_string()])
                .arg("--write-program")
                .arg(&prog)
                .arg("--")
                .arg(exe)
                .args(args),
            "aetrace count --write-program",
        );
    };
    write("insns", 1);
    common::singlestep::restore_original_code(exe, &prog);
    let stepped = common::singlestep::run(&prog, None, args, &[]);
    let native = run_native(exe, args);
    assert_eq!(
        stepped.stdout, native.stdout,
        "{tag}: the restored program's stdout"
    );
    let mut insns = Vec::new();
    for &a in &stepped.rips {
        if counted.contains(&a) && !(insns.last() == Some(&a) && elf.is_rep(a)) {
            insns.push(a);
        }
    }
    let blocks: Vec<u64> = {
        // A block is entered at its start (a `rep` at a start folded).
        let mut v = Vec::new();
        let mut prev = None;
        for &a in &stepped.rips {
            if starts.contains(&a) && !(prev == Some(a) && elf.is_rep(a)) {
                v.push(a);
            }
            prev = Some(a);
        }
        v
    };
    let main = functions(exe, &elf)
        .into_iter()
        .find(|f| f.2 == "main")
        .expect("main");
    let first_main = insns.iter().position(|&a| a == main.0).expect("main runs");
    let ns: BTreeSet<usize> = [
        0,
        insns.len() / 3,
        first_main,
        first_main + 1,
        insns.len() - 1,
    ]
    .into();
    // (event, N, the stepped run's address there)
    let mut wanted: Vec<(&str, usize, u64)> =
        ns.iter().map(|&i| ("insns", i + 1, insns[i])).collect();
    let bs: BTreeSet<usize> = [0, blocks.len() / 2, blocks.len() - 1].into();
    wanted.extend(bs.iter().map(|&i| ("blocks", i + 1, blocks[i])));
    let stops: Vec<(&str, usize)> = wanted.iter().map(|&(e, n, _)| (e, n)).collect();
    let setup = ["unset environment", "set startup-with-shell off"];
    // Killed before the next stop's program replaces it.
    let texts = gdb_stops(
        exe,
        args,
        &prog,
        &stops,
        &setup,
        &["run", "p/x $pc", "kill"],
    );
    for (&(event, n, want), text) in wanted.iter().zip(texts) {
        let text = text.unwrap_or_else(|t| panic!("{tag}: --event {event} --stop-at {n}: {t}"));
        assert!(
            text.contains("Program received signal SIGTRAP"),
            "{tag}: --event {event} --stop-at {n}: no SIGTRAP: {text}"
        );
        let got = printed_hex(&text).unwrap_or_else(|| panic!("{tag}: no pc: {text}"));
        assert_eq!(
            got, want,
            "{tag}: --event {event} --stop-at {n}: gdb stopped at {got:#x}, the stepped run's {event} {n} is at {want:#x}"
        );
    }
    eprintln!(
        "{tag}: {} instructions stepped, {} counted, {} blocks",
        stepped.rips.len(),
        insns.len(),
        blocks.len()
    );
}

/// A static glibc program (its libc's startup code and `exit` counted);
/// a longjmp in counted code ends the program with a message.
#[test]
fn static_executables() {
    check_static(
        &build("loops.c", Variant::new(Opt::O2, Link::Static, false)),
        "loops_c-O2-static",
        &[],
    );
    let stop_at = |source: &str, n: &str| {
        let exe = build(source, Variant::new(Opt::O2, Link::Static, false));
        let out = Command::new(common::aetrace())
            .args(["count", "--stop-at", n, "--"])
            .arg(&exe)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out, err)
    };
    let (out, err) = stop_at("setjmp.c", "1000000000");
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("calls longjmp at") && err.contains("cannot follow the frames it abandons"),
        "{err}"
    );
    // The first thread is not known at a static program's entry point
    // (no TLS yet): refused before running.
    let (out, err) = stop_at("threads.c", "10");
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        out.stdout.is_empty() && err.contains("static executable that can start threads"),
        "{err}"
    );
}

#[test]
fn loops() {
    check("loops.c", O2_PIE, &[]);
}

#[test]
fn recursion() {
    check("recursion.c", O2_PIE, &[]);
    // -O0 prologues: main's second instruction lies under the springboard.
    check("recursion.c", O0_PIE, &[]);
}

#[test]
fn switch() {
    check("switch.c", O2_PIE, &[]);
}

#[test]
fn qsort_callback() {
    check("qsort_callback.c", O2_PIE, &[]);
}

/// A real program (stripped: insns and blocks only).
#[test]
fn debian_gzip() {
    let dir = common::scratch("stop_at");
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("gzip-input.txt");
    std::fs::write(&input, common::text_input(20_000)).unwrap();
    check_exe(
        Path::new("/usr/bin/gzip"),
        "gzip",
        &["-c", input.to_str().unwrap()],
        false,
        false,
    );
}

/// A C++ program (std::vector, std::sort): libstdc++ imports
/// `pthread_create`, and its procedures have landing pads; it starts no
/// thread and throws nothing.
#[test]
fn cxx_without_threads() {
    check("cxx_sort.cpp", O2_PIE, &["30"]);
}

/// Exceptions thrown through counted frames (caught in the thrower,
/// several frames up, rethrown, cleanups): the frames a throw leaves stand
/// at calls whose query increment is 0, the unwinder's entries at landing
/// pads add theirs. Instructions and blocks only: `--event calls` stopped
/// one entry off after the lazy binding of a PLT entry reached from a
/// catch handler (docs/profile.md, not resolved), so it is refused for
/// programs that throw (`refusals`).
#[test]
fn cxx_exceptions() {
    check_events("cxx_exceptions.cpp", O2_PIE, &[], false);
}

/// What `--stop-at` cannot do exactly it refuses, in one line naming why,
/// without running the program.
#[test]
fn refusals() {
    let cases: [(&str, &str, &str, &str); 3] = [
        ("setjmp.c", "insns", "10", "setjmp or longjmp"),
        ("loops.c", "insns", "0", "numbered from 1"),
        ("cxx_exceptions.cpp", "calls", "10", "throws C++ exceptions"),
    ];
    for (source, event, n, why) in cases {
        let exe = build(source, O2_PIE);
        let out = Command::new(common::aetrace())
            .args(["count", "--event", event, "--stop-at", n, "--"])
            .arg(&exe)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{source}: {err}");
        assert!(out.stdout.is_empty(), "{source}: the program ran");
        assert!(
            err.starts_with("aetrace: error: ") && err.lines().count() == 1 && err.contains(why),
            "{source}: {err}"
        );
    }
    // A signal handler or a second thread in counted code is only seen
    // when it runs: the program ends there with status 125 and says why.
    for (source, why) in [
        ("signal.c", "a signal handler ran in counted code"),
        ("threads.c", "a second thread ran counted code"),
    ] {
        let exe = build(source, O2_PIE);
        let out = Command::new(common::aetrace())
            .args(["count", "--stop-at", "1000000000", "--"])
            .arg(&exe)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{source}: {err}");
        assert_eq!(
            err,
            format!("aetrace: {why}: --stop-at cannot stop exactly\n"),
            "{source}"
        );
    }
}
