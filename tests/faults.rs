//! Faults while recording and runs at the recorder's limits (issue 25,
//! points 2 to 4; `docs/faults.md`): the trace's file system full or its
//! size limit reached mid-run, the recorder SIGKILLed, Ctrl-C from a
//! terminal and SIGINT sent to the recorder alone, several recordings
//! filling one empty rewrite cache at once, a damaged cache entry, more
//! threads alive than the buffer has slots, 100 execs and 1,000 forks.
//! The oracle of each is the program's native run: its stdout, the file
//! it writes and its exit status (or signal) must be the same.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use common::build::{build, Link, Opt, Variant};

fn dir(sub: &str) -> PathBuf {
    let d = common::scratch("faults").join(format!("{sub}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn faults() -> PathBuf {
    build("faults.c", Variant::new(Opt::O2, Link::Pie, false))
}

/// `aetrace record -o TRACE -- faults ARGS` with address randomisation off
/// (the program inherits it, so two runs regenerate the same addresses).
fn record_cmd(trace: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(common::aetrace());
    c.arg("record").arg("-o").arg(trace).arg("--").arg(faults());
    c.args(args);
    common::no_aslr(&mut c);
    c
}

fn native_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(faults());
    c.args(args);
    common::no_aslr(&mut c);
    c
}

fn spawn_piped(mut c: Command) -> Child {
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads the first line the child prints (it then waits for us).
fn first_line(child: &mut Child) -> (String, BufReader<std::process::ChildStdout>) {
    let mut r = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    (line, r)
}

/// The `gate` run: phase 1, a line on stdin after `between` ran on the
/// process started, phase 2; the output with the first line put back.
fn gate(c: Command, between: impl FnOnce(&mut Child)) -> Output {
    let mut child = spawn_piped(c);
    let (first, mut rest) = first_line(&mut child);
    assert!(first.starts_with("phase1 "), "{first:?}");
    // Taken first: `Child::wait` (a killed recorder reaped) closes it.
    let mut stdin = child.stdin.take().unwrap();
    between(&mut child);
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    let mut tail = Vec::new();
    rest.read_to_end(&mut tail).unwrap();
    let mut out = child.wait_with_output().unwrap();
    out.stdout = [first.as_bytes(), &tail].concat();
    out
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `aetrace info --json TRACE`, which must succeed.
fn info(trace: &Path) -> serde_json::Value {
    common::recorded::info_json(trace)
}

/// `aetrace regen --format block TRACE`.
fn regen(trace: &Path) -> Output {
    Command::new(common::aetrace())
        .args(["regen", "--format", "block"])
        .arg(trace)
        .output()
        .unwrap()
}

/// A regenerated block trace without its `#` lines (they name pids).
fn blocks(regen: &Output) -> Vec<u8> {
    regen
        .stdout
        .split_inclusive(|&b| b == b'\n')
        .filter(|l| !l.starts_with(b"#"))
        .flatten()
        .copied()
        .collect()
}

/// The recording's one error line: the trace is incomplete and where its
/// whole sections end (returned), with `why`.
fn incomplete_line(o: &Output, trace: &Path, why: &str) -> u64 {
    let e = stderr(o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.starts_with("aetrace: error: "), "{e}");
    assert!(
        e.contains(&format!("{}: the trace is incomplete", trace.display())),
        "{e}"
    );
    assert!(e.contains(why), "{e}");
    let at = e.split("up to byte ").nth(1).expect("where it stops");
    at.split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// What the reader makes of a trace cut short: `info` says incomplete,
/// and `regen` writes the exact prefix then stops with one line.
fn assert_marked_incomplete(trace: &Path) -> Vec<u8> {
    let v = info(trace);
    assert_eq!(v["complete"], false, "{v}");
    assert!(v["incomplete"].as_str().is_some(), "{v}");
    let r = regen(trace);
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    assert_eq!(stderr(&r).lines().count(), 1, "{}", stderr(&r));
    r.stdout
}

/// The native run of `gate N1 N2 FILE` and its file.
fn native_gate(n1: &str, n2: &str, file: &Path) -> (Output, String) {
    let out = gate(
        native_cmd(&["gate", n1, n2, file.to_str().unwrap()]),
        |_| {},
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    (out, std::fs::read_to_string(file).unwrap())
}

/// The trace file outgrows the recorder's RLIMIT_FSIZE mid-run (set on
/// the running recorder alone with `prlimit`, so the program keeps its
/// own limit): the write fails with EFBIG (the recorder ignores
/// SIGXFSZ), the program runs on to its end as natively, and aetrace
/// ends like it, with one line saying where the trace stops.
#[test]
fn a_trace_past_the_file_size_limit_stops_and_the_program_runs_on() {
    let d = dir("fsize");
    let (native, native_file) = native_gate("100000", "3000000", &d.join("native.txt"));
    let trace = d.join("t.aet");
    let file = d.join("recorded.txt");
    let mut size = 0;
    let out = gate(
        record_cmd(
            &trace,
            &["gate", "100000", "3000000", file.to_str().unwrap()],
        ),
        |child| {
            size = std::fs::metadata(&trace).unwrap().len();
            let lim = libc::rlimit {
                rlim_cur: size + 100,
                rlim_max: libc::RLIM_INFINITY,
            };
            // SAFETY: prlimit on our child with a valid limit.
            let rc = unsafe {
                libc::prlimit(
                    child.id() as i32,
                    libc::RLIMIT_FSIZE,
                    &lim,
                    std::ptr::null_mut(),
                )
            };
            assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        },
    );
    assert_eq!(out.stdout, native.stdout);
    assert_eq!(out.status.code(), native.status.code(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), native_file);
    let at = incomplete_line(&out, &trace, "File too large");
    let len = std::fs::metadata(&trace).unwrap().len();
    assert!(size <= at && at <= len, "{size} <= {at} <= {len}");
    assert_marked_incomplete(&trace);
}

/// A full file system (a 128 KiB tmpfs; mounting needs root, so the test
/// says why it skips where that fails): the same as a size limit, with
/// ENOSPC.
#[test]
fn a_trace_on_a_full_file_system_stops_and_the_program_runs_on() {
    let d = dir("enospc");
    let mnt = d.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mount = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=128k", "tmpfs"])
        .arg(&mnt)
        .output();
    match mount {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            eprintln!(
                "faults: skipped the full-tmpfs check: mount: {}",
                stderr(&o).trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("faults: skipped the full-tmpfs check: mount: {e}");
            return;
        }
    }
    struct Unmount<'p>(&'p Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&mnt);
    let (native, native_file) = native_gate("1000", "3000000", &d.join("native.txt"));
    let trace = mnt.join("t.aet");
    let file = d.join("recorded.txt");
    let out = gate(
        record_cmd(&trace, &["gate", "1000", "3000000", file.to_str().unwrap()]),
        |_| {},
    );
    assert_eq!(out.stdout, native.stdout);
    assert_eq!(out.status.code(), native.status.code(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), native_file);
    incomplete_line(&out, &trace, "No space left on device");
    assert_marked_incomplete(&trace);
}

/// An output that cannot take even the header (`-o /dev/full`): refused
/// with one line before the program runs.
#[test]
fn an_output_that_takes_nothing_is_refused_before_the_program_runs() {
    let d = dir("devfull");
    let file = d.join("ran.txt");
    let out = gate_refused(&file);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(
        e.starts_with("aetrace: error:") && e.lines().count() == 1,
        "{e}"
    );
    assert!(
        e.contains("/dev/full") && e.contains("No space left"),
        "{e}"
    );
    assert!(!file.exists(), "the program ran");
}

fn gate_refused(file: &Path) -> Output {
    let mut c = record_cmd(
        Path::new("/dev/full"),
        &["gate", "1", "1", file.to_str().unwrap()],
    );
    c.stdin(Stdio::null()).output().unwrap()
}

/// The recorder SIGKILLed while the program runs: the program runs on
/// untraced (one line on stderr says so) and writes what it would, and
/// the trace keeps what was drained: its regeneration is an exact prefix
/// of a whole recording's. (The orphan's exit status goes to init, so its
/// file and output stand for it.)
#[test]
fn a_killed_recorder_leaves_a_readable_prefix_and_the_program_runs_on() {
    let d = dir("killed");
    let (native, native_file) = native_gate("50000", "400000", &d.join("native.txt"));
    // Small halves: phase 2 seals many, so a writer soon waits for the
    // recorder (a half is taken back only by the recorder).
    let small = |mut c: Command| {
        c.env("AETRACE_HALF_SIZE", "16384");
        c
    };
    let whole = d.join("whole.aet");
    let file = d.join("whole.txt");
    let out = gate(
        small(record_cmd(
            &whole,
            &["gate", "50000", "400000", file.to_str().unwrap()],
        )),
        |_| {},
    );
    assert!(out.stdout == native.stdout, "{}", stderr(&out));
    let full = regen(&whole);
    assert!(full.status.success(), "{}", stderr(&full));

    let trace = d.join("t.aet");
    let file = d.join("recorded.txt");
    let out = gate(
        small(record_cmd(
            &trace,
            &["gate", "50000", "400000", file.to_str().unwrap()],
        )),
        |child| {
            // Until phase 1's chunk is written (CHUNK_AGE, 1 s).
            let start = std::time::Instant::now();
            while info(&trace)["threads"][0]["chunks"].as_u64().unwrap_or(0) == 0 {
                assert!(start.elapsed().as_secs() < 10, "no chunk written");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            // Reaped at once, as a shell does: the program checks that
            // the recorder's pid is gone, and a zombie is not.
            child.kill().unwrap();
            child.wait().unwrap();
        },
    );
    assert_eq!(out.status.signal(), Some(libc::SIGKILL));
    assert_eq!(out.stdout, native.stdout);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), native_file);
    let e = stderr(&out);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("the recorder is gone") && e.contains("runs on untraced"),
        "{e}"
    );
    let prefix = assert_marked_incomplete(&trace);
    let (prefix, full) = (
        blocks(&Output {
            stdout: prefix,
            ..out
        }),
        blocks(&full),
    );
    assert!(prefix.len() > 10_000, "{} bytes", prefix.len());
    assert!(prefix.len() < full.len());
    assert!(full.starts_with(&prefix), "not a prefix");
}

/// How a SIGINT reaches a run.
#[derive(Clone, Copy, Debug)]
enum Interrupt {
    /// ^C typed on its controlling terminal (a pty): the terminal
    /// signals the whole foreground process group.
    Terminal,
    /// `kill -INT PID` of the process started (aetrace, or natively the
    /// program).
    Process,
}

/// Runs `c` (`faults sigint HOW`, natively or recorded), interrupts it
/// once it is ready, and returns its output.
fn interrupted(mut c: Command, how: Interrupt) -> Output {
    // A test binary started in the background of a shell without job
    // control inherits SIGINT ignored, and exec keeps SIG_IGN: the program
    // would spin its full 20 s, never interrupted.
    // SAFETY: signal is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut pty = None;
    if let Interrupt::Terminal = how {
        // SAFETY: pty calls on a descriptor we own; ptsname's buffer is
        // copied at once.
        let (master, slave) = unsafe {
            let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
            assert!(m >= 0 && libc::grantpt(m) == 0 && libc::unlockpt(m) == 0);
            let name = std::ffi::CStr::from_ptr(libc::ptsname(m)).to_owned();
            (m, name)
        };
        let tty = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(slave.to_str().unwrap())
            .unwrap();
        use std::os::fd::AsRawFd;
        let fd = tty.as_raw_fd();
        // SAFETY: setsid and ioctl are async-signal-safe.
        unsafe {
            c.pre_exec(move || {
                if libc::setsid() < 0 || libc::ioctl(fd, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        c.stdin(tty);
        pty = Some(master);
    } else {
        c.stdin(Stdio::null());
    }
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (first, mut rest) = first_line(&mut child);
    assert_eq!(first, "ready\n");
    match pty {
        // SAFETY: a one-byte write to our master, then close it.
        Some(m) => unsafe {
            assert_eq!(libc::write(m, b"\x03".as_ptr().cast(), 1), 1);
            let mut tail = Vec::new();
            rest.read_to_end(&mut tail).unwrap();
            let mut out = child.wait_with_output().unwrap();
            libc::close(m);
            out.stdout = [first.as_bytes(), &tail].concat();
            out
        },
        None => {
            // SAFETY: kill with integer arguments.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            let mut tail = Vec::new();
            rest.read_to_end(&mut tail).unwrap();
            let mut out = child.wait_with_output().unwrap();
            out.stdout = [first.as_bytes(), &tail].concat();
            out
        }
    }
}

/// Ctrl-C on the terminal and SIGINT to aetrace alone reach the program
/// once, as natively: a program with a handler handles it and exits its
/// own way; one without dies of SIGINT and aetrace dies like it. The
/// trace is kept: it regenerates whole for the first, and up to the
/// program's death for the second (PROCESS_EXIT says SIGINT).
#[test]
fn sigint_reaches_the_program_once_as_natively() {
    let d = dir("sigint");
    for how in [Interrupt::Terminal, Interrupt::Process] {
        for mode in ["handler", "default"] {
            let what = format!("{how:?} {mode}");
            let native = interrupted(native_cmd(&["sigint", mode]), how);
            let trace = d.join(format!("{how:?}-{mode}.aet"));
            let out = interrupted(record_cmd(&trace, &["sigint", mode]), how);
            assert_eq!(out.stdout, native.stdout, "{what}: {}", stderr(&out));
            assert_eq!(out.status.code(), native.status.code(), "{what}");
            assert_eq!(out.status.signal(), native.status.signal(), "{what}");
            let v = info(&trace);
            assert_eq!(v["complete"], true, "{what}: {v}");
            let r = regen(&trace);
            if mode == "handler" {
                assert_eq!(native.stdout, b"ready\ncaught 1\n", "{what}");
                assert!(r.status.success(), "{what}: {}", stderr(&r));
            } else {
                assert_eq!(native.status.signal(), Some(libc::SIGINT), "{what}");
                assert_eq!(v["process_exits"][0]["signal"], libc::SIGINT, "{what}: {v}");
                // regen ends the trace where the witnesses do and names the signal.
                assert!(r.status.success(), "{what}: {}", stderr(&r));
                assert!(stderr(&r).contains("(SIGINT)"), "{what}: {}", stderr(&r));
            }
            assert!(!r.stdout.is_empty(), "{what}");
        }
    }
}

/// `aetrace record --libs` with `AETRACE_CACHE` at `cache`.
fn record_libs(exe: &Path, cache: &Path, trace: &Path) -> Command {
    let mut c = Command::new(common::aetrace());
    c.env("AETRACE_CACHE", cache)
        .arg("record")
        .arg("-o")
        .arg(trace)
        .args(["--libs", "libaecb.so.1", "--"])
        .arg(exe)
        .arg("200")
        .stdin(Stdio::null());
    common::no_aslr(&mut c);
    c
}

/// Four recordings of one program and its library started at once on an
/// empty rewrite cache all succeed, print what the program prints, and
/// regenerate the same blocks.
#[test]
fn recordings_filling_one_empty_cache_at_once_agree() {
    let exe = common::build::build_with_lib("shlib_callback", "libaecb.so.1", false);
    let d = dir("concurrent");
    let cache = d.join("cache");
    let native = native_with(&exe);
    let runs: Vec<(PathBuf, Child)> = (0..4)
        .map(|i| {
            let t = d.join(format!("t{i}.aet"));
            let mut c = record_libs(&exe, &cache, &t);
            let child = c
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (t, child)
        })
        .collect();
    let mut blocks = Vec::new();
    for (t, child) in runs {
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), native.status.code(), "{}", stderr(&out));
        assert_eq!(out.stdout, native.stdout);
        let r = regen(&t);
        assert!(r.status.success(), "{}", stderr(&r));
        assert!(!r.stdout.is_empty());
        blocks.push(self::blocks(&r));
    }
    assert!(blocks.windows(2).all(|w| w[0] == w[1]), "traces differ");
}

/// Twenty rounds of three recordings of one small program started at once,
/// each round on an empty rewrite cache, all succeed. A recorder renamed its
/// cached copy into place before closing it, and another one exec'ing it in
/// that window failed with "Text file busy" (5 of 20 rounds, 2026-11-29).
#[test]
fn a_cached_copy_is_closed_before_another_recorder_execs_it() {
    let exe = build("loops.c", Variant::new(Opt::O2, Link::Pie, false));
    let d = dir("etxtbsy");
    for round in 0..20 {
        let cache = d.join(format!("cache{round}"));
        let runs: Vec<Child> = (0..3)
            .map(|i| {
                Command::new(common::aetrace())
                    .env("AETRACE_CACHE", &cache)
                    .arg("record")
                    .arg("-o")
                    .arg(d.join(format!("t{i}.aet")))
                    .arg("--")
                    .arg(&exe)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in runs {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "round {round}: {}", stderr(&out));
        }
    }
}

fn native_with(exe: &Path) -> Output {
    let mut c = Command::new(exe);
    c.arg("200").stdin(Stdio::null());
    common::no_aslr(&mut c);
    c.output().unwrap()
}

/// A cached rewritten module truncated, or with one byte flipped, is
/// detected and rewritten, never run: the run after the damage records
/// the same blocks and leaves the entry as it was first written.
#[test]
fn a_damaged_cache_entry_is_rebuilt_not_used() {
    let exe = common::build::build_with_lib("shlib_callback", "libaecb.so.1", false);
    let d = dir("damaged");
    let cache = d.join("cache");
    let native = native_with(&exe);
    let run = |name: &str| {
        let t = d.join(format!("{name}.aet"));
        let out = record_libs(&exe, &cache, &t).output().unwrap();
        assert_eq!(out.stdout, native.stdout, "{name}: {}", stderr(&out));
        assert_eq!(out.status.code(), native.status.code(), "{name}");
        let r = regen(&t);
        assert!(r.status.success(), "{name}: {}", stderr(&r));
        blocks(&r)
    };
    let first = run("first");
    let entries: Vec<PathBuf> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && !p.to_string_lossy().ends_with(".meta"))
        .collect();
    assert_eq!(entries.len(), 2, "{entries:?}");
    for damage in ["truncate", "flip"] {
        for entry in &entries {
            let good = std::fs::read(entry).unwrap();
            let mut bad = good.clone();
            if damage == "truncate" {
                bad.truncate(good.len() / 2);
            } else {
                let at = good.len() * 2 / 3;
                bad[at] ^= 0x10;
            }
            std::fs::write(entry, &bad).unwrap();
            let what = format!("{damage} {}", entry.display());
            assert!(run(damage) == first, "{what}: another trace");
            assert!(std::fs::read(entry).unwrap() == good, "{what}: not rebuilt");
        }
    }
}

/// More threads alive at once than the buffer has slots (256): the
/// program is stopped with one line, status 125, when its 257th thread
/// has waited about two seconds for a slot; 200 alive at once work.
#[test]
fn more_threads_alive_than_slots_are_refused_in_one_line() {
    let d = dir("threads");
    let ok = d.join("ok.aet");
    let native = native_cmd(&["threads", "200"]).output().unwrap();
    let out = record_cmd(&ok, &["threads", "200"]).output().unwrap();
    assert_eq!(out.stdout, native.stdout, "{}", stderr(&out));
    assert_eq!(out.status.code(), native.status.code());
    assert_eq!(info(&ok)["threads"].as_array().unwrap().len(), 201);
    let out = record_cmd(&d.join("many.aet"), &["threads", "300"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let e = stderr(&out);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("no free thread slot left"), "{e}");
}

/// A run that execs itself 100 times and one that forks 1,000 children
/// (more than the 256 slots: the slots of reaped processes are reused)
/// are recorded whole: native output and status, every image and child
/// its own thread, regenerated.
#[test]
fn a_hundred_execs_and_a_thousand_forks_are_recorded_whole() {
    let d = dir("limits");
    for (args, threads) in [(["exec", "100"], 101), (["fork", "1000"], 1001)] {
        let what = args.join(" ");
        let trace = d.join(format!("{}.aet", args[0]));
        let native = native_cmd(&args).output().unwrap();
        let out = record_cmd(&trace, &args).output().unwrap();
        assert_eq!(out.stdout, native.stdout, "{what}: {}", stderr(&out));
        assert_eq!(out.status.code(), native.status.code(), "{what}");
        let v = info(&trace);
        assert_eq!(v["complete"], true, "{what}");
        assert_eq!(v["threads"].as_array().unwrap().len(), threads, "{what}");
        let r = regen(&trace);
        assert!(r.status.success(), "{what}: {}", stderr(&r));
    }
}
