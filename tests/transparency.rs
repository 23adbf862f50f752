//! Transparency (issue 23, point 4): a recorded program sees the process a
//! native run sees, and `#!` scripts are followed as the kernel follows
//! them. Oracles: the native run of the same command with the same
//! environment (its whole output and exit status: argv, environment,
//! descriptors, the descriptor `open` returns, auxv entries, as
//! `traces/procview.c`, `env` and `ls` print them; its memory map, as
//! `traces/mapsview.c` prints it; its executable's names, as
//! `traces/exename.c` prints them), the program's own
//! output for the regenerated trace (calls of `print_target` = descriptor
//! lines printed), and lackey for a traced program that execs a script.

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::build::{build, Link, Opt, Variant};

const DYNAMIC: Variant = Variant::new(Opt::O2, Link::Pie, false);
const STATIC: Variant = Variant::new(Opt::O2, Link::Static, false);

fn dir() -> PathBuf {
    common::scratch("transparency")
}

/// The environment of both runs (the recorder's own variable included:
/// the program inherits it from `aetrace` like any other).
fn env() -> Vec<(String, String)> {
    vec![
        (
            "AETRACE_CACHE".to_string(),
            dir().join("cache").display().to_string(),
        ),
        ("LC_ALL".to_string(), "C".to_string()),
        ("PATH".to_string(), "/usr/bin:/bin".to_string()),
    ]
}

/// `program args` natively, with exactly [`env`] and stdin from /dev/null.
fn native(program: &Path, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .env_clear()
        .envs(env())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()))
}

/// `aetrace record -o TRACE -- program args` with exactly [`env`]: its
/// output and the trace (named after `tag`).
fn recorded(tag: &str, program: &Path, args: &[&str]) -> (Output, PathBuf) {
    recorded_with(tag, &[], program, args, &env())
}

/// [`recorded`] with the record options `opts` and the environment `env`.
fn recorded_with(
    tag: &str,
    opts: &[&str],
    program: &Path,
    args: &[&str],
    env: &[(String, String)],
) -> (Output, PathBuf) {
    let trace = dir().join(format!("{tag}-{}.aet", std::process::id()));
    let _ = std::fs::remove_file(&trace);
    let mut a: Vec<&std::ffi::OsStr> = vec!["record".as_ref(), "-o".as_ref(), trace.as_os_str()];
    a.extend(opts.iter().map(std::ffi::OsStr::new));
    a.push("--".as_ref());
    a.push(program.as_os_str());
    a.extend(args.iter().map(std::ffi::OsStr::new));
    (common::aetrace_fixed(&a, env), trace)
}

/// The recorded run printed and ended as the native one.
fn same_as_native(tag: &str, program: &Path, args: &[&str]) -> PathBuf {
    same_as_native_by(tag, program, args, |s| s.to_string())
}

/// [`same_as_native`], both stdouts through `normal` first.
fn same_as_native_by(
    tag: &str,
    program: &Path,
    args: &[&str],
    normal: impl Fn(&str) -> String,
) -> PathBuf {
    let n = native(program, args);
    let (r, trace) = recorded(tag, program, args);
    let text = |o: &Output| normal(&String::from_utf8_lossy(&o.stdout));
    assert_eq!(
        text(&r),
        text(&n),
        "{tag}: stdout (recorder's stderr: {})",
        String::from_utf8_lossy(&r.stderr)
    );
    assert_eq!(r.status.code(), n.status.code(), "{tag}: exit status");
    trace
}

/// `aetrace regen --count TRACE`: it must succeed; the calls per
/// procedure of the executable.
/// The calls per procedure name `regen --count` reports, summed over
/// every module (each image's program's, each library's).
fn regen_calls(trace: &Path) -> HashMap<String, u64> {
    let text = common::regen::count(trace);
    let mut calls = HashMap::new();
    let lines = text
        .lines()
        .skip_while(|l| !l.starts_with("calls per procedure"));
    for l in lines.filter(|l| l.starts_with(' ')) {
        if let Some((n, name)) = l.trim().split_once(' ') {
            *calls.entry(name.to_string()).or_default() += n.parse::<u64>().unwrap();
        }
    }
    calls
}

/// Records `procview` (or a script it interprets) and checks the trace
/// against its output: one `print_target` call per descriptor printed.
fn procview_exact(tag: &str, program: &Path, args: &[&str]) -> String {
    let trace = same_as_native(tag, program, args);
    let out = native(program, args);
    let text = String::from_utf8(out.stdout).unwrap();
    let fds = text.lines().filter(|l| l.starts_with("fd ")).count() as u64;
    let calls = regen_calls(&trace);
    assert_eq!(calls.get("print_target"), Some(&fds), "{tag}: {calls:?}");
    let _ = std::fs::remove_file(&trace);
    text
}

#[test]
fn a_recorded_program_sees_its_native_environment_descriptors_and_argv() {
    for v in [DYNAMIC, STATIC] {
        let exe = build("procview.c", v);
        let tag = format!("procview-{}", v.tag());
        let text = procview_exact(&tag, &exe, &["a", "b c"]);
        // What the comparison covers, in the native run's own words.
        assert!(text.contains("open returned 3\n"), "{tag}: {text}");
        assert!(text.contains("argv[2] = \"b c\""), "{tag}: {text}");
        assert!(!text.contains("AETRACE_SHM"), "{tag}: {text}");
    }
}

/// `program args` as [`native`], address randomisation off (as
/// [`recorded`] runs it).
fn native_fixed(program: &Path, args: &[&str]) -> Output {
    native_fixed_with(program, args, &env())
}

/// [`native_fixed`] with the environment `env`.
fn native_fixed_with(program: &Path, args: &[&str], env: &[(String, String)]) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(env.iter().cloned())
        .stdin(Stdio::null());
    common::no_aslr(&mut cmd);
    cmd.output()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()))
}

#[test]
fn a_recorded_program_sees_its_native_memory_map() {
    // docs/runtime.md section 5, "The program's view of its maps": no
    // witness region, no added segment, the executable's own name.
    for v in [DYNAMIC, STATIC] {
        let exe = build("mapsview.c", v);
        let tag = format!("mapsview-{}", v.tag());
        let trace = same_as_native(&tag, &exe, &[]);
        let text = String::from_utf8(native(&exe, &[]).stdout).unwrap();
        let real = exe.canonicalize().unwrap();
        assert!(
            text.contains(&format!("first file: {}\n", real.display())),
            "{tag}: {text}"
        );
        // One `print_line` call per mapping printed, in the trace too.
        let lines = text.lines().filter(|l| !l.contains(": ")).count() as u64;
        let calls = regen_calls(&trace);
        assert_eq!(calls.get("print_line"), Some(&lines), "{tag}: {calls:?}");
        let _ = std::fs::remove_file(&trace);
        // Address randomisation off: the text itself, addresses and all.
        let n = native_fixed(&exe, &["raw"]);
        let (r, trace) = recorded(&format!("{tag}-raw"), &exe, &["raw"]);
        assert_eq!(
            String::from_utf8_lossy(&r.stdout),
            String::from_utf8_lossy(&n.stdout),
            "{tag}: raw maps (recorder's stderr: {})",
            String::from_utf8_lossy(&r.stderr)
        );
        let _ = std::fs::remove_file(&trace);
    }
}

#[test]
fn a_recorded_program_sees_its_native_executable_names() {
    // docs/runtime.md section 5, "The executable's names": AT_EXECFN's
    // string and readlink and realpath of its own /proc/PID/exe name the
    // original, not the relative name the copy is exec'd by or the copy.
    for v in [DYNAMIC, STATIC] {
        let exe = build("exename.c", v);
        let tag = format!("exename-{}", v.tag());
        let trace = same_as_native(&tag, &exe, &[]);
        let text = String::from_utf8(native(&exe, &[]).stdout).unwrap();
        let real = exe.canonicalize().unwrap();
        let real = real.display();
        for line in [
            format!("AT_EXECFN: {}\n", exe.display()),
            format!("/proc/self/exe: {real} ("),
            format!("/proc/PID/exe: {real} ("),
            format!("/proc/thread-self/exe: {real} ("),
            "cut to 4: /".to_string(),
            "bad pointer: error Bad address\n".to_string(),
            format!("realpath: {real}\n"),
        ] {
            assert!(text.contains(&line), "{tag}: {line:?} in {text}");
        }
        let calls = regen_calls(&trace);
        // gcc may clone a function (`show_link.constprop.0`).
        let calls_of = |f: &str| -> u64 {
            let clone = format!("{f}.");
            let named = |k: &String| *k == f || k.starts_with(&clone);
            calls.iter().filter(|(k, _)| named(k)).map(|(_, n)| n).sum()
        };
        assert_eq!(calls_of("show_link"), 5, "{tag}: {calls:?}");
        assert_eq!(calls_of("show"), 2, "{tag}: {calls:?}");
        let _ = std::fs::remove_file(&trace);
    }
}

/// A program a traced one execs sees its native `AT_EXECFN` and
/// `/proc/self/exe` too (docs/runtime.md section 7, "exec"): `execve` of
/// `traces/exename.c`'s program by its path and `execvp` of its name on
/// `PATH`, dynamic and static, print the native run's lines; an
/// `execve` whose copy's exec fails (a bad argv pointer: EFAULT) leaves
/// the process in its directory with the native errno. From a dynamic
/// program (libc's `execve` called) and a static one (its traced
/// `syscall`).
#[test]
fn a_followed_exec_sees_its_native_executable_names() {
    let pairs = [DYNAMIC, STATIC].map(|c| [(c, DYNAMIC), (c, STATIC)]);
    for (c, v) in pairs.into_iter().flatten() {
        let chain = build("exec_chain.c", c);
        let exe = build("exename.c", v);
        let path = exe.to_str().unwrap();
        let name = exe.file_name().unwrap().to_str().unwrap();
        for (how, args) in [("e", ["-e", path]), ("p", [name, "x"]), ("b", ["-b", path])] {
            let tag = format!("followed-exename-{}-{}-{how}", c.tag(), v.tag());
            let trace = same_as_native_on_path(&tag, &chain, &args);
            let _ = std::fs::remove_file(&trace);
        }
        let text = Command::new(&chain)
            .args(["-e", path])
            .env_clear()
            .envs(env_on_path())
            .output()
            .unwrap();
        let text = String::from_utf8(text.stdout).unwrap();
        let real = exe.canonicalize().unwrap();
        for line in [
            format!("AT_EXECFN: {path}\n"),
            format!("/proc/self/exe: {} (", real.display()),
        ] {
            assert!(text.contains(&line), "{line:?} in {text}");
        }
    }
}

/// A followed `posix_spawn`'s child sees its native names, working
/// directory, descriptors and stack addresses too (docs/runtime.md
/// section 7, "exec"): `traces/spawn_names.c` spawns `traces/exename.c`'s
/// program with `-a`, dynamic and static, with no file actions, with a
/// `chdir` action (and descriptors the actions make), with an `fchdir`
/// to a descriptor of the parent's (and a `close`), and through
/// `posix_spawnp` on `PATH`: every line of the native run, address
/// randomisation off in both.
#[test]
fn a_followed_spawn_child_sees_its_native_names_directory_and_stack() {
    let spawner = build("spawn_names.c", DYNAMIC);
    for v in [DYNAMIC, STATIC] {
        let exe = build("exename.c", v);
        let path = exe.to_str().unwrap();
        let name = exe.file_name().unwrap().to_str().unwrap();
        let mut env = env();
        env.retain(|(k, _)| k != "PATH");
        let on_path = exe.parent().unwrap().display();
        env.push(("PATH".into(), format!("{on_path}:/usr/bin:/bin")));
        for (how, program) in [("n", path), ("c", path), ("f", path), ("p", name)] {
            let tag = format!("spawned-exename-{}-{how}", v.tag());
            let text = fixed_as_native(&tag, &spawner, &[how, program, "-a"], &env);
            // What the comparison covers, in the native run's words.
            let cwd = match how {
                "c" => "/".to_string(),
                "f" => "/usr".to_string(),
                _ => std::env::current_dir().unwrap().display().to_string(),
            };
            let execfn = if how == "p" {
                exe.display().to_string()
            } else {
                path.to_string()
            };
            for line in [
                format!("AT_EXECFN: {execfn}\n"),
                format!("cwd: {cwd}\n"),
                "fd 0: /dev/null\n".to_string(),
                "stack: local 0x7fff".to_string(),
                "child: 0\n".to_string(),
            ] {
                assert!(text.contains(&line), "{tag}: {line:?} in {text}");
            }
            assert_eq!(
                text.contains("fd 3: /dev/null\n"),
                how != "f",
                "{tag}: {text}"
            );
            assert_eq!(
                text.contains("fd 6: /dev/null\n"),
                how == "c",
                "{tag}: {text}"
            );
        }
    }
}

/// `program args` recorded and run natively with the environment `env`,
/// address randomisation off in both: the same output and exit status;
/// the native output.
fn fixed_as_native(tag: &str, program: &Path, args: &[&str], env: &[(String, String)]) -> String {
    let n = native_fixed_with(program, args, env);
    let (r, trace) = recorded_with(tag, &[], program, args, env);
    let _ = std::fs::remove_file(&trace);
    same_output(tag, &r, &n);
    String::from_utf8(n.stdout).unwrap()
}

/// The recorded run `r` printed and ended as the native run `n`.
fn same_output(tag: &str, r: &Output, n: &Output) {
    assert_eq!(
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&n.stdout),
        "{tag}: stdout (recorder's stderr: {})",
        String::from_utf8_lossy(&r.stderr)
    );
    assert_eq!(r.status.code(), n.status.code(), "{tag}: exit status");
}

/// A child of the shell a followed `system` or `popen` runs sees its
/// native names, working directory, descriptors and stack, and the
/// shell's native name (docs/runtime.md section 7, "system and popen"):
/// `traces/shell_names.c` runs `traces/exename.c`'s program with `-a`,
/// dynamic and static, through `system`, `popen(..., "r")` (its output
/// read) and `posix_spawn`; every line of the native run, address
/// randomisation off in both. The shell forks the program, whose parent
/// is then the shell: its name (comm, the base name it was exec'd by) is
/// `sh` natively, the copy's file name when the shell runs by the copy's
/// path (`popen`'s shell until 2026-12-02).
#[test]
fn a_followed_shell_and_its_child_see_their_native_names() {
    let runner = build("shell_names.c", DYNAMIC);
    for v in [DYNAMIC, STATIC] {
        let exe = build("exename.c", v);
        let path = exe.to_str().unwrap();
        let tag = format!("shell-exename-{}", v.tag());
        let text = fixed_as_native(&tag, &runner, &[path], &env());
        // What the comparison covers, in the native run's words.
        let cwd = std::env::current_dir().unwrap();
        for (how, prefix, parent) in [
            ("system", "", "sh\n"),
            ("popen", "read: ", "sh\n"),
            ("posix_spawn", "", "shell_names-"),
        ] {
            let start = text.find(&format!("{how}:\n")).unwrap();
            let end = text.find(&format!("{how}: status")).unwrap();
            let out = &text[start..end];
            for line in [
                format!("AT_EXECFN: {path}\n"),
                format!(
                    "/proc/self/exe: {} (",
                    exe.canonicalize().unwrap().display()
                ),
                format!("cwd: {}\n", cwd.display()),
                "open: 3\n".to_string(),
                format!("parent: {parent}"),
                "stack: local 0x7fff".to_string(),
            ] {
                let line = format!("{prefix}{line}");
                assert!(out.contains(&line), "{tag} {how}: {line:?} in {text}");
            }
            assert!(
                text[end..].starts_with(&format!("{how}: status 0\n")),
                "{tag}: {text}"
            );
        }
    }
}

/// `ls -l`'s line of one descriptor: its number and target, digits of
/// the target dropped (pipe inodes, pids), the date and owner columns too.
fn fd_lines(text: &str) -> String {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let arrow = f.iter().position(|w| *w == "->")?;
            let target: String = f[arrow + 1..]
                .join(" ")
                .chars()
                .filter(|c| !c.is_ascii_digit())
                .collect();
            Some(format!("{} -> {target}\n", f[arrow - 1]))
        })
        .collect()
}

#[test]
fn env_and_ls_of_proc_self_fd_print_what_they_print_natively() {
    let trace = same_as_native("env", Path::new("/usr/bin/env"), &[]);
    regen_calls(&trace);
    let trace = same_as_native("ls", Path::new("/bin/ls"), &["/proc/self/fd"]);
    regen_calls(&trace);
    let trace = same_as_native_by(
        "ls-l",
        Path::new("/bin/ls"),
        &["-l", "/proc/self/fd"],
        fd_lines,
    );
    regen_calls(&trace);
}

#[test]
fn a_program_recorded_with_libs_sees_its_native_ld_library_path() {
    // `--libs` puts the rewritten copies' directory first in the
    // executable's own DT_RUNPATH, so the variable is the native one:
    // absent, empty, or a path of its own. When the native variable
    // finds the library (searched before DT_RUNPATH), the directory goes
    // first in it instead, and the runtime gives the program back the
    // native value.
    let exe = common::build::build_with_lib("envview", "libenvview.so", false);
    let own_dir = exe.parent().unwrap().display().to_string();
    let libs = ["--libs", "libenvview.so"];
    for (k, native) in [
        None,
        Some(""),
        Some("/nonexistent-a:/nonexistent-b"),
        Some(own_dir.as_str()),
    ]
    .into_iter()
    .enumerate()
    {
        let mut env = env();
        env.extend(native.map(|v| ("LD_LIBRARY_PATH".to_string(), v.to_string())));
        let n = Command::new(&exe)
            .env_clear()
            .envs(env.iter().cloned())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let tag = format!("envview-{k}");
        let (r, trace) = recorded_with(&tag, &libs, &exe, &[], &env);
        let (r_out, n_out) = (
            String::from_utf8_lossy(&r.stdout),
            String::from_utf8_lossy(&n.stdout),
        );
        assert_eq!(
            r_out,
            n_out,
            "{tag}: stdout (recorder: {})",
            String::from_utf8_lossy(&r.stderr)
        );
        assert!(r.status.success() && n.status.success(), "{tag}");
        // The library was traced, so its rewritten copy was loaded.
        let modules = common::recorded::instrumented_modules(&common::recorded::info_json(&trace));
        assert_eq!(modules.len(), 2, "{tag}: {modules:?}");
        let calls = regen_calls(&trace);
        assert_eq!(calls.get("main"), Some(&1), "{tag}: {calls:?}");
        let _ = std::fs::remove_file(&trace);
    }
}

/// Writes an executable script.
fn script(name: &str, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir().join(format!("{name}-{}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The path of the executable module a trace recorded.
fn main_module(trace: &Path) -> PathBuf {
    common::recorded::instrumented_modules(&common::recorded::info_json(trace))
        .into_iter()
        .next()
        .expect("an instrumented executable")
}

#[test]
fn a_hash_bang_script_records_its_interpreter_with_the_script() {
    // A shell script: the shell is recorded, the script its argument.
    let sh = script("sh-script", "#!/bin/sh\necho \"$0 has $# arguments: $*\"\n");
    let trace = same_as_native("sh-script", &sh, &["x", "y z"]);
    let module = std::fs::canonicalize(main_module(&trace)).unwrap();
    assert_eq!(module, std::fs::canonicalize("/bin/sh").unwrap());
    regen_calls(&trace);
    let _ = std::fs::remove_file(&trace);

    // A C interpreter with one argument (inner spaces kept), then a
    // script whose interpreter is that script: argv as the kernel makes it.
    let pv = build("procview.c", DYNAMIC);
    let inner = script("pv-script", &format!("#!{} -x  y \t\n", pv.display()));
    let text = procview_exact("pv-script", &inner, &["a"]);
    let want = format!(
        "argv[0] = \"{}\"\nargv[1] = \"-x  y\"\nargv[2] = \"{}\"\nargv[3] = \"a\"\n",
        pv.display(),
        inner.display()
    );
    assert!(text.starts_with(&want), "{text}");
    let outer = script("pv-script2", &format!("#! {}\n", inner.display()));
    let text = procview_exact("pv-script2", &outer, &["a"]);
    assert!(
        text.contains(&format!("argv[3] = \"{}\"\n", outer.display())),
        "{text}"
    );
}

#[test]
fn a_traced_program_that_execs_a_script() {
    let pv = build("procview.c", DYNAMIC);
    let exe = build("exec_script.c", DYNAMIC);
    let s = script("exec-target", &format!("#!{} -z\n", pv.display()));
    let s = s.to_str().unwrap();
    let trace = same_as_native("exec-script", &exe, &[s, "q"]);
    // The exec'd interpreter saw what it sees natively (compared above).
    let text = String::from_utf8(native(&exe, &[s, "q"]).stdout).unwrap();
    assert!(text.contains("open returned 3\n"), "{text}");
    // The program against lackey's run of it; the interpreter, followed,
    // printed each of its descriptor lines through a traced call.
    image_equals_lackey("exec-script", &trace, &exe, &[s, "q"]);
    assert_eq!(image_thread(&trace, &pv), 1);
    let fds = text.lines().filter(|l| l.starts_with("fd ")).count() as u64;
    let calls = regen_calls(&trace);
    assert_eq!(calls.get("print_target"), Some(&fds), "{calls:?}");
    let _ = std::fs::remove_file(&trace);
}

#[test]
fn a_script_whose_interpreter_is_missing_is_one_clear_line() {
    let s = script("no-interp", "#!/nonexistent/interpreter -a\n");
    let (out, trace) = recorded("no-interp", &s, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.trim_end().ends_with(&format!(
            "{}: /nonexistent/interpreter: bad interpreter: No such file or directory",
            s.display()
        )),
        "{err}"
    );
    assert!(!trace.exists(), "a trace was left behind");
}

/// `traces/layout.c ARGS` recorded prints what it prints natively, both
/// with address randomisation off (its addresses, `common::aetrace_fixed`).
fn same_layout_as_native(tag: &str, args: &[&str]) {
    let exe = build("layout.c", DYNAMIC);
    let n = native_fixed(&exe, args);
    let (r, trace) = recorded(tag, &exe, args);
    assert!(n.status.success(), "native: {n:?}");
    assert_eq!(
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&n.stdout),
        "recorder: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let _ = std::fs::remove_file(&trace);
}

/// The heap starts where it does natively (the rewriter leaves a gap above
/// the image, `init` moves the break back: before, 0x9000 later for
/// `tclsh8.6`), and the stack lies below an `AT_EXECFN` of the native
/// length (the copy is exec'd by a relative name as long as the native
/// path: before, its cache path), so a program that hashes its own
/// pointers takes the native path: the sweep's tclsh (docs/sweep.md).
#[test]
fn a_recorded_program_finds_its_heap_and_stack_where_it_does_natively() {
    same_layout_as_native("layout", &[]);
}

/// An anonymous `mmap` and a block glibc's malloc maps land where they do
/// natively: nothing of ours lies in the mmap area above them (the witness
/// region is hinted at 32 TiB, far below).
#[test]
fn a_recorded_program_finds_its_mappings_where_it_does_natively() {
    same_layout_as_native("layout-mmap", &["mmap"]);
}

/// With `--libs`, the rewritten library, libc after it and a later `mmap`
/// land where they do natively (address randomisation off in both runs):
/// the copy's added segments are in no `PT_LOAD` (before, they lengthened
/// the span `ld.so` maps top-down, so the library and everything mapped
/// after it landed lower: tclsh's libtcl at 0x7ffff7800000 against
/// 0x7ffff7df2000 natively, docs/sweep.md "tclsh"); the executable's
/// runtime `init` maps them (`docs/runtime.md` section 5).
#[test]
fn a_program_recorded_with_libs_finds_its_libraries_where_it_does_natively() {
    let trace = libs_fixed_as_native("libmap", "liblibmap.so", false);
    let _ = std::fs::remove_file(&trace);
}

/// With `--libs` of a library the loader finds natively through
/// `/etc/ld.so.cache` (zlib), the library, libc, an `mmap`, a `malloc`
/// and every line of `/proc/self/maps` are where they are natively
/// (randomisation off), but for the copy's name and its detached
/// additions. Natively ld.so maps the cache (33,699 bytes here) while it
/// searches for zlib, so zlib lands below it; the copy is found first in
/// the executable copy's own search path and the cache was read only for
/// libc, after zlib was mapped: zlib 0x9000 bytes higher than natively.
/// The executable's copy now asks for an absent auxiliary object just
/// before zlib, whose failed search reads the cache there
/// (docs/rewrite.md, "Loading the rewritten copies").
#[test]
fn a_library_found_through_the_loader_cache_is_recorded_where_it_is_natively() {
    let exe = common::scratch("lib-builds").join(format!("libmap_cache-{}", std::process::id()));
    let src = common::repo_root().join("traces/libmap_cache.c");
    common::build::run_checked(
        Command::new("gcc")
            .args(["-O2", "-o"])
            .arg(&exe)
            .arg(&src)
            .arg("-l:libz.so.1"),
        "gcc libmap_cache.c -l:libz.so.1",
    );
    let n = native_fixed_with(&exe, &[], &env());
    let (r, trace) = recorded_with("libmap-cache", &["--libs", "libz.so.1"], &exe, &[], &env());
    let _ = std::fs::remove_file(&trace);
    let _ = std::fs::remove_file(&exe);
    let (n, r) = (
        String::from_utf8_lossy(&n.stdout),
        String::from_utf8_lossy(&r.stdout),
    );
    let head = |s: &str| s.lines().take(4).collect::<Vec<_>>().join("\n");
    assert_eq!(head(&r), head(&n), "recorded:\n{r}\nnative:\n{n}");
    // "START-END PERMS" of each line, and whether it names the cache.
    let cache = env()
        .into_iter()
        .find(|(k, _)| k == "AETRACE_CACHE")
        .unwrap()
        .1;
    let lines = |s: &str| -> Vec<(String, bool)> {
        let fields = |l: &str| l.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
        s.lines()
            .skip(4)
            .map(|l| (fields(l), l.contains(&cache)))
            .collect()
    };
    let (native, recorded) = (lines(&n), lines(&r));
    for (l, _) in &native {
        assert!(
            recorded.iter().any(|(m, _)| m == l),
            "native {l} not in\n{r}"
        );
    }
    for (l, copy) in &recorded {
        assert!(
            *copy || native.iter().any(|(m, _)| m == l),
            "recorded {l} not in\n{n}"
        );
    }
}

/// Builds `traces/NAME.c` with its library `SONAME` (`traces/NAME_lib.c`),
/// records it with `--libs SONAME`, address randomisation off, and checks
/// that it printed what its native run prints and that the library was
/// traced; returns the trace. `own_dir`: both runs with `LD_LIBRARY_PATH`
/// naming the library's directory.
fn libs_fixed_as_native(name: &str, soname: &str, own_dir: bool) -> PathBuf {
    let exe = common::build::build_with_lib(name, soname, false);
    let mut env = env();
    if own_dir {
        let dir = exe.parent().unwrap().display().to_string();
        env.push(("LD_LIBRARY_PATH".to_string(), dir));
    }
    let n = native_fixed_with(&exe, &[], &env);
    let tag = format!("{name}-{own_dir}");
    let (r, trace) = recorded_with(&tag, &["--libs", soname], &exe, &[], &env);
    assert!(n.status.success(), "native: {n:?}");
    assert_eq!(
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&n.stdout),
        "recorder: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let modules = common::recorded::instrumented_modules(&common::recorded::info_json(&trace));
    assert_eq!(modules.len(), 2, "the library was not traced: {modules:?}");
    trace
}

/// With `--libs`, the initial stack is the native one: argv, envp, the
/// end of the environment strings, `AT_EXECFN`, `AT_RANDOM` and a local
/// of main at their native addresses (randomisation off in both runs).
/// The rewritten executable's own search path (`DT_RUNPATH` here) names
/// the copies' directory, so nothing is added to the environment; with
/// the copies' directory in `LD_LIBRARY_PATH` instead, every address was
/// lower by that variable's length (tclsh's stack 64 bytes lower,
/// docs/sweep.md "tclsh"). Also when the native `LD_LIBRARY_PATH`, which
/// the loader searches before `DT_RUNPATH`, finds the library: the
/// executable's copy names the library's copy by path in its DT_NEEDED
/// (before 2026-11-30 the directory went first in `LD_LIBRARY_PATH`).
#[test]
fn a_program_recorded_with_libs_starts_on_its_native_stack() {
    for own_dir in [false, true] {
        let trace = libs_fixed_as_native("stackview", "libstackview.so", own_dir);
        let calls = regen_calls(&trace);
        assert_eq!(calls.get("stackview_lib_sum@plt"), Some(&1), "{calls:?}");
        let _ = std::fs::remove_file(&trace);
    }
}

/// The thread whose image runs `exe` in `trace` (the first such), from
/// the modules `aetrace info --json` lists: 0 for the launched program.
fn image_thread(trace: &Path, exe: &Path) -> u64 {
    let info = common::recorded::info_json(trace);
    let real = exe.canonicalize().unwrap();
    let m = (info["modules"].as_array().unwrap().iter())
        .find(|m| Path::new(m["path"].as_str().unwrap()) == real)
        .unwrap_or_else(|| panic!("{}: no module {}: {info}", trace.display(), real.display()));
    m["image_thread"].as_u64().unwrap_or(0)
}

/// The instructions `exe` ran in its image's stream of `trace` equal
/// lackey's run of `exe ARGS` with the variables `env`, one by one
/// (relative addresses). An image that execs through a lazily bound PLT
/// stub asks after the stub's LAZY (`docs/runtime.md` section 7,
/// "exec"): the binding's `push`, `jmp`, PLT0's `push` and `jmp` are in
/// both (before, 2026-12-01, they were lackey's alone).
fn image_equals_lackey_with(
    tag: &str,
    trace: &Path,
    (exe, args): (&Path, &[&str]),
    env: &[(String, String)],
) {
    use common::lackey;
    let thread = image_thread(trace, exe).to_string();
    let only = [
        "--format",
        "insn",
        "--relative",
        "--thread",
        &thread,
        "--module",
    ];
    let mut a: Vec<&str> = only.to_vec();
    a.push(exe.to_str().unwrap());
    let rg = common::regen::addresses(trace, &a);
    let with = lackey::Launch { stdin: None, env };
    let run = lackey::executable_sequences_with(exe, args, &with);
    let lk: Vec<u64> = run.modules[0]
        .sequences
        .values()
        .flatten()
        .copied()
        .collect();
    assert!(!rg.is_empty(), "{tag}: {} ran nothing", exe.display());
    assert!(
        lk == rg,
        "{tag}: {} in thread {thread} against lackey {args:?}: {} and {} instructions",
        exe.display(),
        lk.len(),
        rg.len()
    );
}

/// [`image_equals_lackey_with`] the tests' [`env`].
fn image_equals_lackey(tag: &str, trace: &Path, exe: &Path, args: &[&str]) {
    image_equals_lackey_with(tag, trace, (exe, args), &env());
}

/// `record -- SCRIPT` where the script runs `#!/usr/bin/env sh` (`env`
/// execs `sh` through `execvp`) and the shell execs a traces/ program:
/// `env`, the shell and the program are each traced in their own image
/// of the process, the output and exit status are native, and the last
/// program's stream equals lackey's run of it. 0.56 s, rewrite cache
/// warm, load 4-6 (2026-12-01 09:50).
#[test]
fn a_script_run_by_env_sh_is_followed_into_every_program_it_execs() {
    let loops = build("loops.c", DYNAMIC);
    let s = script(
        "env-sh",
        &format!(
            "#!/usr/bin/env sh\necho \"sh: $# $*\"\nexec {} \"$@\"\n",
            loops.display()
        ),
    );
    let trace = same_as_native("env-sh", &s, &["9"]);
    let modules = common::recorded::instrumented_modules(&common::recorded::info_json(&trace));
    let real = |p: &Path| p.canonicalize().unwrap();
    let want = [Path::new("/usr/bin/env"), Path::new("/bin/sh"), &loops].map(real);
    assert_eq!(modules.iter().map(|m| real(m)).collect::<Vec<_>>(), want);
    assert_eq!(image_thread(&trace, &loops), 2);
    regen_calls(&trace);
    image_equals_lackey("env-sh", &trace, &loops, &["9"]);
    let _ = std::fs::remove_file(&trace);
}

/// [`env`] with `PATH` starting with `dir()`.
fn env_on_path() -> Vec<(String, String)> {
    let mut env = env();
    env.retain(|(k, _)| k != "PATH");
    env.push(("PATH".into(), format!("{}:/usr/bin:/bin", dir().display())));
    env
}

/// [`recorded`] and the native run with [`env_on_path`]: the same output
/// and exit status; the trace.
fn same_as_native_on_path(tag: &str, program: &Path, args: &[&str]) -> PathBuf {
    let env = env_on_path();
    let n = Command::new(program)
        .args(args)
        .env_clear()
        .envs(env.iter().cloned())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (r, trace) = recorded_with(tag, &[], program, args, &env);
    same_output(tag, &r, &n);
    trace
}

/// A traced C program `execvp`s a `#!/bin/sh` script found on `PATH`,
/// which execs another traces/ program: each image traced, the first and
/// the last equal to lackey's runs. `execl` (arguments on the stack too)
/// and `execve` of the program itself too, both images equal to lackey's.
/// 1.48 s, rewrite cache warm, load 4-6 (2026-12-01 09:50).
#[test]
fn a_traced_program_execvps_a_script_that_execs_a_program() {
    let chain = build("exec_chain.c", DYNAMIC);
    let loops = build("loops.c", DYNAMIC);
    let s = script(
        "chain",
        &format!("#!/bin/sh\necho \"$0: $*\"\nexec {} 6\n", loops.display()),
    );
    let name = s.file_name().unwrap().to_str().unwrap();
    let trace = same_as_native_on_path("chain", &chain, &[name, "a b"]);
    regen_calls(&trace);
    assert_eq!(image_thread(&trace, &loops), 2);
    image_equals_lackey_with("chain", &trace, (&chain, &[name, "a b"]), &env_on_path());
    image_equals_lackey("chain", &trace, &loops, &["6"]);
    let _ = std::fs::remove_file(&trace);
    for how in ["-l", "-e"] {
        let tag = format!("chain{how}");
        let trace = same_as_native_on_path(&tag, &chain, &[how, loops.to_str().unwrap()]);
        assert_eq!(image_thread(&trace, &loops), 1, "{tag}");
        let args: &[&str] = if how == "-l" {
            &["l", "2", "3", "4", "5"]
        } else {
            &[]
        };
        image_equals_lackey(&tag, &trace, &loops, args);
        let first = [how, loops.to_str().unwrap()];
        image_equals_lackey_with(&tag, &trace, (&chain, &first), &env_on_path());
        let _ = std::fs::remove_file(&trace);
    }
    // `execl`'s last arguments are read from the caller's stack, above
    // the stub's return address: echo prints them as natively.
    let trace = same_as_native_on_path("chain-echo", &chain, &["-l", "/bin/echo"]);
    let first = ["-l", "/bin/echo"];
    image_equals_lackey_with("chain-echo", &trace, (&chain, &first), &env_on_path());
    let _ = std::fs::remove_file(&trace);
}

/// Execs that fail natively fail so when recorded, with the native
/// errno (the program prints its text): a name on no `PATH` directory, a
/// missing path, a file without an execute bit, through `execvp`,
/// `execl` and `execve`; the trace is the program's alone. 0.10 s,
/// rewrite cache warm, load 4-6 (2026-12-01 09:50).
#[test]
fn an_exec_that_fails_natively_fails_with_its_native_errno() {
    let chain = build("exec_chain.c", DYNAMIC);
    let nox = dir().join(format!("not-executable-{}", std::process::id()));
    std::fs::write(&nox, "#!/bin/sh\necho never\n").unwrap();
    let nox = nox.to_str().unwrap();
    let cases: [&[&str]; 5] = [
        &["no-such-program-on-path"],
        &["/nonexistent/program"],
        &[nox],
        &["-l", nox],
        &["-e", "/nonexistent/program"],
    ];
    for (k, args) in cases.into_iter().enumerate() {
        let tag = format!("exec-fails-{k}");
        let trace = same_as_native_on_path(&tag, &chain, args);
        let info = common::recorded::info_json(&trace);
        assert_eq!(
            info["threads"].as_array().unwrap().len(),
            1,
            "{tag}: {info}"
        );
        regen_calls(&trace);
        let _ = std::fs::remove_file(&trace);
    }
}

/// `record -- SCRIPT` whose `#!` names a traces/ program by its absolute
/// path, with an argument: the program is recorded with the kernel's
/// argv (interpreter, argument, script) and its stream equals lackey's
/// run with those arguments. 0.48 s, rewrite cache warm, load 4-6
/// (2026-12-01 09:50).
#[test]
fn a_script_whose_interpreter_is_a_traced_program_is_exact() {
    let loops = build("loops.c", DYNAMIC);
    let s = script("loops-interp", &format!("#!{} 8\n", loops.display()));
    let trace = same_as_native("loops-interp", &s, &["x"]);
    image_equals_lackey(
        "loops-interp",
        &trace,
        &loops,
        &["8", s.to_str().unwrap(), "x"],
    );
    let _ = std::fs::remove_file(&trace);
}
