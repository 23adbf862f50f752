//! Bad input to `aetrace record`, `aetrace regen` and `aetrace info`: a
//! missing program, a file that is not ELF, a trace that is not a trace, a
//! truncated or corrupted trace. Each gives one line on stderr starting with
//! `aetrace: error:`, exit status 1, never a panic, and `regen -o FILE`
//! leaves no file behind. A program killed by SIGKILL exits the recorder
//! the same way and still leaves a trace whose regeneration writes what ran
//! and says how the run ended.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::build::{build, Link, Opt, Variant};

fn dir() -> PathBuf {
    common::scratch("record-errors")
}

fn aetrace(args: &[&str]) -> Output {
    Command::new(common::aetrace()).args(args).output().unwrap()
}

fn one_line_error(out: &Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: status, stderr {stderr}"
    );
    assert!(
        stderr.starts_with("aetrace: error:") && stderr.lines().count() == 1,
        "{what}: {stderr:?}"
    );
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    stderr
}

/// A complete trace of a small program.
fn good_trace(name: &str) -> PathBuf {
    let exe = build("loops.c", Variant::new(Opt::O2, Link::Pie, false));
    let t = dir().join(format!("{name}.aet"));
    let out = Command::new(common::aetrace())
        .arg("record")
        .arg("-o")
        .arg(&t)
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(out.status.success());
    t
}

#[test]
fn record_refuses_what_it_cannot_run() {
    let e = one_line_error(
        &aetrace(&["record", "--", "/nonexistent/program"]),
        "missing",
    );
    assert!(e.contains("/nonexistent/program"), "{e}");
    let text = dir().join("text.txt");
    std::fs::write(&text, "echo hi\n").unwrap();
    let e = one_line_error(&aetrace(&["record", "--", text.to_str().unwrap()]), "text");
    assert!(e.contains("not an ELF"), "{e}");
    // A script runs its interpreter (`transparency`), if execve would run it.
    let script = dir().join("script.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    let e = one_line_error(
        &aetrace(&["record", "--", script.to_str().unwrap()]),
        "script without an execute bit",
    );
    assert!(e.contains("Permission denied"), "{e}");
}

/// The recorder's testing knob `AETRACE_HALF_SIZE` (buffer half size)
/// refuses a value that is not a number, or not a usable half size, with
/// one line naming it, and writes no trace.
#[test]
fn a_bad_half_size_is_refused_clearly() {
    let exe = build("loops.c", Variant::new(Opt::O2, Link::Pie, false));
    let t = dir().join("half.aet");
    for (v, want) in [
        ("lots", "AETRACE_HALF_SIZE=lots: not a number"),
        ("4096", "half_size: 4096"),
        ("8193", "8-aligned halves above 8192 bytes"),
    ] {
        let out = Command::new(common::aetrace())
            .env("AETRACE_HALF_SIZE", v)
            .args(["record", "-o", t.to_str().unwrap(), "--"])
            .arg(&exe)
            .output()
            .unwrap();
        let e = one_line_error(&out, v);
        assert!(e.contains(want), "{e}");
        assert!(!t.exists(), "{v}: a trace was written");
    }
}

#[test]
fn regen_and_info_refuse_bad_traces_and_leave_no_output_file() {
    let good = good_trace("good");
    let bytes = std::fs::read(&good).unwrap();
    let not_trace = dir().join("not-a-trace");
    std::fs::write(&not_trace, b"hello, world\n").unwrap();
    let truncated = dir().join("truncated.aet");
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    let flipped = dir().join("flipped.aet");
    let mut f = bytes.clone();
    let mid = f.len() / 2;
    f[mid] ^= 0x40;
    std::fs::write(&flipped, &f).unwrap();
    for (what, t) in [
        ("not a trace", &not_trace),
        ("truncated", &truncated),
        ("corrupted", &flipped),
    ] {
        let out_file = dir().join(format!("{}.insn", what.replace(' ', "-")));
        let _ = std::fs::remove_file(&out_file);
        let o = aetrace(&[
            "regen",
            t.to_str().unwrap(),
            "-o",
            out_file.to_str().unwrap(),
        ]);
        one_line_error(&o, what);
        assert!(
            !out_file.exists(),
            "{what}: regen left {}",
            out_file.display()
        );
        let leftovers: Vec<_> = std::fs::read_dir(dir())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".partial"))
            .collect();
        assert!(leftovers.is_empty(), "{what}: temporary output left behind");
        if what != "truncated" {
            one_line_error(&aetrace(&["info", t.to_str().unwrap()]), what);
        }
    }
    // The good trace regenerates into the file.
    let out_file = dir().join("good.insn");
    let o = aetrace(&[
        "regen",
        good.to_str().unwrap(),
        "-o",
        out_file.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    assert!(std::fs::metadata(&out_file).unwrap().len() > 1000);
}

#[test]
fn a_killed_program_leaves_a_trace_up_to_its_death() {
    let t = dir().join("killed.aet");
    let out = Command::new(common::aetrace())
        .arg("record")
        .arg("-o")
        .arg(&t)
        .args(["--", "/bin/sh", "-c", "echo before; kill -9 $$; echo after"])
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert!(
        out.status.code() == Some(137) || out.status.signal() == Some(9),
        "{:?}",
        out.status
    );
    assert_eq!(out.stdout, b"before\n");
    let info = aetrace(&["info", "--json", t.to_str().unwrap()]);
    assert!(
        info.status.success(),
        "{}",
        String::from_utf8_lossy(&info.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(v["process_exits"][0]["signal"], 9, "{v}");
    // Regeneration writes the exact prefix, up to where the killed
    // program wrote nothing more, and says so (docs/regen.md, "Killed
    // runs"): one line on stderr, exit 0.
    let r = aetrace(&["regen", "--format", "insn", t.to_str().unwrap()]);
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{e}");
    assert!(
        e.starts_with("aetrace: thread 0 (pid ")
            && e.contains("was killed by signal 9 (SIGKILL)")
            && e.lines().count() == 1,
        "{e}"
    );
    let lines = r.stdout.split(|&c| c == b'\n').count();
    assert!(lines > 1000, "{lines} instructions before the kill");
    assert!(Path::new(&t).exists());
}

/// A recorder killed while the program runs: the program notices at its
/// next full buffer half (the runtime's `flush` checks the recorder's pid
/// every second while it waits), says so in one line and runs on
/// untraced, instead of waiting for ever for a half that nobody will
/// empty (`docs/faults.md`; `faults::` compares such a run with the
/// native one).
#[test]
fn a_program_whose_recorder_is_killed_runs_on_with_a_message() {
    use std::io::BufRead;
    let t = dir().join("orphan.aet");
    let mut rec = Command::new(common::aetrace())
        .arg("record")
        .arg("-o")
        .arg(&t)
        .args(["--", "/bin/sh", "-c", "echo $$; while :; do :; done"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut pid = String::new();
    std::io::BufReader::new(rec.stdout.take().unwrap())
        .read_line(&mut pid)
        .unwrap();
    let pid: i32 = pid.trim().parse().unwrap();
    let stderr = rec.stderr.take().unwrap();
    rec.kill().unwrap();
    rec.wait().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let _ = tx.send(line.unwrap_or_default());
        }
    });
    let said = rx.recv_timeout(std::time::Duration::from_secs(30));
    // SAFETY: kill with integer arguments; signal 0 only checks.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    // SAFETY: as above; a no-op once it exited.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let said = said.expect("no message 30 s after the recorder was killed");
    assert!(said.contains("the recorder is gone"), "{said:?}");
    assert!(alive, "the program stopped");
}

/// Static executables are traced from a new entry stub that runs inside
/// the entry procedure's copy: one whose entry procedure cannot be traced
/// (here a one-byte `_start`, shorter than a springboard) is refused with
/// a message naming it, and leaves no trace file.
#[test]
fn static_executable_with_untraceable_entry_is_refused_clearly() {
    let src = dir().join("tiny_start.c");
    std::fs::write(
        &src,
        "__asm__(\".globl _start\\n_start: hlt\\n\");\n\
         void f(void) { for (volatile int i = 0; i < 3; i++) {} }\n",
    )
    .unwrap();
    let exe = dir().join("tiny_start");
    let cc = Command::new("gcc")
        .args(["-O1", "-static", "-nostdlib", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let t = dir().join("tiny_start.aet");
    let _ = std::fs::remove_file(&t);
    let e = one_line_error(
        &aetrace(&[
            "record",
            "-o",
            t.to_str().unwrap(),
            "--",
            exe.to_str().unwrap(),
        ]),
        "static",
    );
    assert!(e.contains("static executable: the entry point"), "{e}");
    assert!(
        e.contains("is left alone: shorter than a springboard"),
        "{e}"
    );
    assert!(!t.exists(), "a refused program leaves no trace file");
}

#[test]
fn libraries_that_cannot_be_traced_are_refused_clearly() {
    let exe = build("loops.c", Variant::new(Opt::O2, Link::Pie, false));
    let exe = exe.to_str().unwrap();
    let t = dir().join("libs-refused.aet");
    let t = t.to_str().unwrap();
    let ld = "ld-linux-x86-64.so.2";
    let e = one_line_error(
        &aetrace(&["record", "-o", t, "--libs", ld, "--", exe]),
        "--libs of the dynamic loader",
    );
    assert!(e.contains(ld) && e.contains("dynamic loader"), "{e}");
    let e = one_line_error(
        &aetrace(&["record", "-o", t, "--libs", "libnothere.so.7", "--", exe]),
        "--libs of a library the program does not load",
    );
    assert!(
        e.contains("libnothere.so.7") && e.contains("libc.so.6"),
        "{e}"
    );
    let e = one_line_error(
        &aetrace(&["record", "-o", t, "--libs", "a.so,", "--", exe]),
        "--libs with an empty name",
    );
    assert!(e.contains("empty"), "{e}");
    assert!(!Path::new(t).exists(), "a refused recording left {t}");
}

/// An output that is not a regular file (a pipe here; `/dev/null` in
/// scripts) is written in place: never unlinked nor renamed over, which as
/// root would replace `/dev/null` with a file.
#[test]
fn outputs_that_are_not_regular_files_are_written_in_place() {
    use std::os::unix::fs::FileTypeExt;
    let exe = build("loops.c", Variant::new(Opt::O2, Link::Pie, false));
    let trace = good_trace("fifo-source");
    let fifo = dir().join("out.fifo");
    let _ = std::fs::remove_file(&fifo);
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let (exe, trace) = (exe.to_str().unwrap(), trace.to_str().unwrap());
    let f = fifo.to_str().unwrap();
    for args in [
        vec!["record", "-o", f, "--", exe],
        vec!["profile", "-o", f, "--", exe],
        vec!["instrument", exe, "-o", f],
        vec!["regen", trace, "--format", "block", "-o", f],
    ] {
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        let out = aetrace(&args);
        let bytes = reader.join().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!bytes.is_empty(), "{args:?}: nothing written to the pipe");
        let kind = std::fs::symlink_metadata(&fifo).unwrap().file_type();
        assert!(kind.is_fifo(), "{args:?} replaced the pipe: {kind:?}");
    }
}

/// A reader that stops early (`aetrace regen | head`) ends `regen` quietly
/// with status 0, as it ends `cat`, sequential and parallel alike; the
/// bytes it read are the start of the whole trace.
#[test]
fn regen_into_a_pipe_closed_early_exits_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    let trace = good_trace("closed-pipe");
    let t = trace.to_str().unwrap();
    let whole = aetrace(&["regen", "--format", "insn", t]);
    assert!(whole.status.success());
    // Twice what a pipe holds (64 KiB), so the writer meets the closed pipe.
    assert!(
        whole.stdout.len() > 128 << 10,
        "{} bytes",
        whole.stdout.len()
    );
    for jobs in ["1", "2"] {
        let mut child = Command::new(common::aetrace())
            .args(["regen", "--format", "insn", "-j", jobs, "--piece", "64", t])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut head = vec![0u8; 4096];
        child.stdout.take().unwrap().read_exact(&mut head).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(head[..], whole.stdout[..4096], "-j {jobs}");
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "-j {jobs}: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `profile --libs` and `count --libs` refuse the same libraries, with one
/// line each, and leave no profile.
#[test]
fn libraries_that_cannot_be_profiled_are_refused_clearly() {
    let exe = build("loops.c", Variant::new(Opt::O2, Link::Pie, false));
    let exe = exe.to_str().unwrap();
    let p = dir().join("libs-refused.aprof");
    let p = p.to_str().unwrap();
    for (cmd, out) in [("profile", p), ("count", "/dev/null")] {
        let e = one_line_error(
            &aetrace(&[cmd, "-o", out, "--libs", "libc.so.6", "--", exe]),
            &format!("{cmd} --libs libc.so.6"),
        );
        assert!(e.contains("libc.so.6") && e.contains("glibc"), "{e}");
        let e = one_line_error(
            &aetrace(&[cmd, "-o", out, "--libs", "libnothere.so.7", "--", exe]),
            &format!("{cmd} --libs of a library the program does not load"),
        );
        assert!(e.contains("libnothere.so.7"), "{e}");
        let e = one_line_error(
            &aetrace(&[cmd, "-o", out, "--libs", ",", "--", exe]),
            &format!("{cmd} --libs with an empty name"),
        );
        assert!(e.contains("empty"), "{e}");
    }
    assert!(!Path::new(p).exists(), "a refused profile left {p}");
}
