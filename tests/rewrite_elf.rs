//! The rewriter's ELF writer (`aetrace_rewrite::elfout`) on real
//! programs built with the machine's gcc: PIE, non-PIE, static, static-pie
//! and a shared object, each given new segments, patches, a preinit function
//! or a new entry point. The oracle is the kernel and `ld.so` themselves: the
//! rewritten program must print what our hand-encoded code prints, then
//! exactly what the original prints, with the original's exit status; and
//! binutils (`readelf`, `objdump`) and gdb must read every output without a
//! warning. The machine code we add is hand-encoded here (a few bytes), so
//! nothing but the ELF writer is under test.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use aetrace_rewrite::elfout::{self, Additions, NewSegment, Patch};
use common::build::run_checked;

const PF_R: u32 = 4;
const LD_SO: &str = "/lib64/ld-linux-x86-64.so.2";
const PF_X: u32 = 1;

fn dir() -> PathBuf {
    common::scratch("rewrite-elf")
}

/// Compiles C `source` (written to `<name>.c`) with `flags` into `<name>`.
fn gcc(name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let src = dir().join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let exe = dir().join(name);
    run_checked(
        Command::new("gcc")
            .args(flags)
            .arg("-o")
            .arg(&exe)
            .arg(&src),
        &format!("gcc {name}"),
    );
    exe
}

/// Runs the program natively with `env` and stdin from `input`.
fn run(exe: &Path, env: &[(&str, &Path)], args: &[&str], input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(exe)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()));
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let feeder = std::thread::spawn(move || {
        // The program may exit without reading all of it.
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    out
}

/// Rewrites `exe` into `<exe>.out` (or into `dest`) with `add`, makes it
/// executable, and checks that binutils and gdb read it cleanly.
fn rewrite(exe: &Path, dest: Option<&Path>, add: &Additions) -> PathBuf {
    let bytes = std::fs::read(exe).unwrap();
    let new = elfout::write(exe, &bytes, add)
        .unwrap_or_else(|e| panic!("rewriting {}: {e}", exe.display()));
    let out = dest.map_or_else(|| exe.with_extension("out"), Path::to_path_buf);
    std::fs::write(&out, &new).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
    tools_read_cleanly(&out);
    assert!(
        phdrs_where_old_kernels_look(&out),
        "{}: kernels before 5.18 would report a wrong AT_PHDR",
        out.display()
    );
    out
}

/// Whether the program header table is mapped at `base + e_phoff`, where
/// `base` is the first `PT_LOAD`'s `p_vaddr - p_offset`: what kernels before
/// 5.18 pass as `AT_PHDR` (newer ones translate `e_phoff` through the
/// `PT_LOAD` that contains it). Read from `readelf -lW`.
fn phdrs_where_old_kernels_look(file: &Path) -> bool {
    let out = run_checked(Command::new("readelf").arg("-lW").arg(file), "readelf -l");
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    let phoff: u64 = text
        .lines()
        .find_map(|l| l.split("starting at offset ").nth(1))
        .expect("readelf names e_phoff")
        .trim()
        .parse()
        .unwrap();
    // (offset, vaddr, filesz) of each PT_LOAD in table order.
    let loads: Vec<(u64, u64, u64)> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&"LOAD")).then(|| (hex(f[1]), hex(f[2]), hex(f[4])))
        })
        .collect();
    let base = loads[0].1 - loads[0].0;
    loads
        .iter()
        .any(|&(off, vaddr, size)| off <= phoff && phoff < off + size && vaddr - off == base)
}

/// `readelf` and `objdump` (two ELF parsers: binutils' own and BFD) read
/// the file without a warning. (gdb, BFD again, is not in CI's packages.)
fn tools_read_cleanly(file: &Path) {
    for args in [&["-lW"][..], &["-dW"], &["-SW"], &["-nW"], &["-rW"]] {
        let out = run_checked(
            Command::new("readelf").args(args).arg(file),
            &format!("readelf {args:?} {}", file.display()),
        );
        assert!(
            out.stderr.is_empty(),
            "readelf {args:?} {}:\n{}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for args in ["-h", "-p"] {
        let out = run_checked(
            Command::new("objdump").arg(args).arg(file),
            &format!("objdump {args} {}", file.display()),
        );
        assert!(
            out.stderr.is_empty(),
            "objdump {args} {}:\n{}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The vaddr of a defined symbol, from `nm` (`-D`: the dynamic table).
fn symbol(file: &Path, name: &str, dynamic: bool) -> u64 {
    let mut cmd = Command::new("nm");
    cmd.arg("--defined-only");
    if dynamic {
        cmd.arg("-D");
    }
    let out = run_checked(cmd.arg(file), &format!("nm {}", file.display()));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == name).then(|| u64::from_str_radix(f[0], 16).unwrap())
        })
        .unwrap_or_else(|| panic!("no symbol {name} in {}", file.display()))
}

/// `e_entry` read straight from the header.
fn entry_of(file: &Path) -> u64 {
    let b = std::fs::read(file).unwrap();
    u64::from_le_bytes(b[24..32].try_into().unwrap())
}

/// `jmp rel32` at `from` to `to`.
fn jmp(from: u64, to: u64) -> Vec<u8> {
    let rel = to.wrapping_sub(from + 5) as i64;
    let rel = i32::try_from(rel).expect("jmp within 2 GiB");
    let mut v = vec![0xe9];
    v.extend_from_slice(&rel.to_le_bytes());
    v
}

/// Code at `vaddr` that writes `msg` to fd 1 with a raw syscall, then either
/// returns (a preinit function) or, with `then_jmp`, restores `rdx` (the
/// rtld_fini argument of `_start`) and jumps there (an entry stub). The
/// message follows the code.
fn print_code(vaddr: u64, msg: &[u8], then_jmp: Option<u64>) -> Vec<u8> {
    let mut c = Vec::new();
    if then_jmp.is_some() {
        c.push(0x52); // push rdx
    }
    c.extend_from_slice(&[0xb8, 1, 0, 0, 0]); // mov eax, 1 (write)
    c.extend_from_slice(&[0xbf, 1, 0, 0, 0]); // mov edi, 1
    let lea_at = c.len();
    c.extend_from_slice(&[0x48, 0x8d, 0x35, 0, 0, 0, 0]); // lea rsi, [rip + msg]
    c.push(0xba); // mov edx, len
    c.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    c.extend_from_slice(&[0x0f, 0x05]); // syscall
    match then_jmp {
        Some(target) => {
            c.push(0x5a); // pop rdx
            let at = vaddr + c.len() as u64;
            c.extend_from_slice(&jmp(at, target));
        }
        None => c.push(0xc3), // ret
    }
    let msg_at = c.len() as i32;
    let rel = msg_at - (lea_at as i32 + 7);
    c[lea_at + 3..lea_at + 7].copy_from_slice(&rel.to_le_bytes());
    c.extend_from_slice(msg);
    c
}

fn rx_segment(vaddr: u64, bytes: Vec<u8>) -> NewSegment {
    NewSegment {
        vaddr,
        flags: PF_R | PF_X,
        mem_size: bytes.len() as u64,
        bytes,
    }
}

/// A program whose every output is a raw `write`, so the order on the pipe
/// is the order of execution: a constructor, optionally an old preinit
/// array entry, and main with exit status 3.
const CTOR_PROGRAM: &str = r#"
#include <unistd.h>
static void ctor(void) __attribute__((constructor));
static void ctor(void) { write(1, "ctor\n", 5); }
#ifdef OLD_PREINIT
static void old_pre(int argc, char **argv, char **envp) {
    (void)argv; (void)envp;
    if (argc > 0) write(1, "old preinit\n", 12);
}
static void old_pre2(int argc, char **argv, char **envp) {
    (void)argc; (void)argv; (void)envp;
    write(1, "old preinit 2\n", 14);
}
__attribute__((section(".preinit_array"), used))
static void (*pre[])(int, char **, char **) = { old_pre, old_pre2 };
#endif
int main(void) { write(1, "main\n", 5); return 3; }
"#;

/// Adds a preinit that prints "preinit\n" and checks the rewritten program
/// prints it first, then exactly the original's output, with its status.
fn check_preinit(name: &str, flags: &[&str], define_old: bool) {
    let mut all = vec!["-O2"];
    if define_old {
        all.push("-DOLD_PREINIT");
    }
    all.extend_from_slice(flags);
    let exe = gcc(name, CTOR_PROGRAM, &all);
    let bytes = std::fs::read(&exe).unwrap();
    let at = elfout::first_free_vaddr(&bytes, 0).unwrap();
    let add = Additions {
        segments: vec![rx_segment(at, print_code(at, b"preinit\n", None))],
        preinit: Some(at),
        ..Additions::default()
    };
    let new = rewrite(&exe, None, &add);
    let before = run(&exe, &[], &[], b"");
    let after = run(&new, &[], &[], b"");
    let mut expected = b"preinit\n".to_vec();
    expected.extend_from_slice(&before.stdout);
    assert_eq!(
        String::from_utf8_lossy(&after.stdout),
        String::from_utf8_lossy(&expected),
        "{name} {flags:?}: {}",
        String::from_utf8_lossy(&after.stderr)
    );
    assert_eq!(after.status.code(), Some(3), "{name}");
    assert_eq!(before.status.code(), Some(3), "{name}");
    assert_eq!(after.stderr, before.stderr, "{name}");
    // ld.so run as a command maps the program itself (its own loader path,
    // not the kernel's): same result.
    let ld_so = run(Path::new(LD_SO), &[], &[new.to_str().unwrap()], b"");
    assert_eq!(ld_so.stdout, expected, "{name} under {LD_SO}");
    assert_eq!(ld_so.status.code(), Some(3), "{name} under {LD_SO}");
    if define_old {
        assert!(before
            .stdout
            .starts_with(b"old preinit\nold preinit 2\nctor\n"));
    }
}

#[test]
fn preinit_pie() {
    check_preinit("preinit-pie", &["-fPIE", "-pie"], false);
}

#[test]
fn preinit_no_pie() {
    check_preinit("preinit-nopie", &["-fno-pie", "-no-pie"], false);
}

#[test]
fn preinit_before_an_existing_preinit_array() {
    check_preinit("preinit-old-pie", &["-fPIE", "-pie"], true);
    check_preinit("preinit-old-nopie", &["-fno-pie", "-no-pie"], true);
}

/// No spare `DT_NULL` slot (`=1`: just the terminator; `=0`: not even
/// that): `.dynamic` must move (and gdb/readelf follow).
#[test]
fn preinit_without_spare_dynamic_tags() {
    for (name, pie, spare) in [
        ("nospare0-pie", true, "0"),
        ("nospare1-pie", true, "1"),
        ("nospare0-nopie", false, "0"),
        ("nospare1-nopie", false, "1"),
    ] {
        let spare = format!("-Wl,--spare-dynamic-tags={spare}");
        let mut flags = vec![spare.as_str()];
        flags.extend_from_slice(if pie {
            &["-fPIE", "-pie"][..]
        } else {
            &["-fno-pie", "-no-pie"][..]
        });
        check_preinit(name, &flags, false);
        check_preinit(&format!("{name}-old"), &flags, true);
        let out = run_checked(
            Command::new("readelf")
                .arg("-dW")
                .arg(dir().join(format!("{name}.out"))),
            "readelf -d",
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("(PREINIT_ARRAY)"));
    }
}

/// `-z pack-relative-relocs` (DT_RELR): an old preinit entry relocated by
/// RELR is copied with a RELA relocation of its own.
#[test]
fn preinit_with_relr() {
    let flags = ["-fPIE", "-pie", "-Wl,-z,pack-relative-relocs"];
    check_preinit("relr", &flags, false);
    check_preinit("relr-old", &flags, true);
    let out = run_checked(
        Command::new("readelf").arg("-dW").arg(dir().join("relr")),
        "readelf -d",
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("(RELR)"),
        "the linker made no DT_RELR: the test checks nothing"
    );
}

/// CET property bits are cleared; the program still runs.
#[test]
fn cet_bits_are_cleared() {
    // Debian's crt files carry no CET property, so the linker is told to
    // mark the program anyway.
    check_preinit(
        "cet",
        &[
            "-fPIE",
            "-pie",
            "-fcf-protection=full",
            "-Wl,-z,ibt,-z,shstk",
        ],
        false,
    );
    let notes = |f: &Path| {
        String::from_utf8_lossy(
            &run_checked(Command::new("readelf").arg("-nW").arg(f), "readelf -n").stdout,
        )
        .into_owned()
    };
    let before = notes(&dir().join("cet"));
    assert!(
        before.contains("IBT") && before.contains("SHSTK"),
        "{before}"
    );
    let after = notes(&dir().join("cet.out"));
    assert!(
        !after.contains("IBT") && !after.contains("SHSTK"),
        "{after}"
    );
}

/// `main`'s first bytes become a jmp to `mov eax, 42; ret`.
#[test]
fn patch_main() {
    let src = "#include <stdio.h>\nint main(void) { puts(\"original\"); return 0; }\n";
    for (name, flags) in [
        ("patch-pie", &["-fPIE", "-pie"][..]),
        ("patch-nopie", &["-fno-pie", "-no-pie"][..]),
    ] {
        let exe = gcc(name, src, flags);
        let bytes = std::fs::read(&exe).unwrap();
        let at = elfout::first_free_vaddr(&bytes, 0).unwrap();
        let main = symbol(&exe, "main", false);
        let add = Additions {
            segments: vec![rx_segment(at, vec![0xb8, 42, 0, 0, 0, 0xc3])],
            patches: vec![Patch {
                vaddr: main,
                bytes: jmp(main, at),
            }],
            ..Additions::default()
        };
        let new = rewrite(&exe, None, &add);
        assert_eq!(run(&exe, &[], &[], b"").status.code(), Some(0));
        let out = run(&new, &[], &[], b"");
        assert_eq!(out.status.code(), Some(42), "{name}");
        assert!(out.stdout.is_empty(), "{name}");
        // The new code has a section: objdump shows it, and the springboard.
        let dis = run_checked(
            Command::new("objdump")
                .args(["-d", "--no-show-raw-insn"])
                .arg(&new),
            "objdump -d",
        );
        let dis = String::from_utf8_lossy(&dis.stdout);
        assert!(
            dis.contains("Disassembly of section .aetrace.text:"),
            "{dis}"
        );
        assert!(
            dis.contains(&format!("{at:x}:\tmov    $0x2a,%eax")),
            "{name}: {dis}"
        );
        assert!(
            dis.contains(&format!("{main:x}:\tjmp    {at:x}")),
            "{name}: {dis}"
        );
    }
}

/// Static executables: a new entry stub prints, then jumps to the old entry.
/// Asking them for a preinit is an error.
#[test]
fn static_entry_stub() {
    let src = "#include <stdio.h>\nint main(int c, char **v) { printf(\"static %d\\n\", c); return 5; }\n";
    for (name, flags) in [
        ("static", &["-static"][..]),
        ("static-pie", &["-static-pie", "-fPIE"][..]),
    ] {
        let exe = gcc(name, src, flags);
        let bytes = std::fs::read(&exe).unwrap();
        let at = elfout::first_free_vaddr(&bytes, 0).unwrap();
        let stub = print_code(at, b"entry\n", Some(entry_of(&exe)));
        let add = Additions {
            segments: vec![rx_segment(at, stub)],
            entry: Some(at),
            ..Additions::default()
        };
        let new = rewrite(&exe, None, &add);
        let before = run(&exe, &[], &["x"], b"");
        let after = run(&new, &[], &["x"], b"");
        assert_eq!(before.stdout, b"static 2\n");
        assert_eq!(
            String::from_utf8_lossy(&after.stdout),
            "entry\nstatic 2\n",
            "{name}: {}",
            String::from_utf8_lossy(&after.stderr)
        );
        assert_eq!(after.status.code(), Some(5), "{name}");

        let preinit = Additions {
            segments: add.segments.clone(),
            preinit: Some(at),
            ..Additions::default()
        };
        match elfout::write(&exe, &bytes, &preinit) {
            Err(aetrace_rewrite::Error::Rewrite {
                what: aetrace_rewrite::Refusal::PreinitStatic,
                ..
            }) => {}
            other => panic!("{name}: preinit on a static executable gave {other:?}"),
        }
    }
}

/// A shared object with a new RX segment and a patched exported function,
/// loaded by a program through `LD_LIBRARY_PATH`: the patch takes effect.
/// A preinit on a shared object is refused (ld.so would never call it).
#[test]
fn shared_object_patch() {
    let lib_dir = dir().join("so-orig");
    let new_dir = dir().join("so-new");
    std::fs::create_dir_all(&lib_dir).unwrap();
    std::fs::create_dir_all(&new_dir).unwrap();
    let lib = lib_dir.join("libanswer.so");
    let lib_src = dir().join("answer.c");
    std::fs::write(
        &lib_src,
        "int answer(int x) { return x + 1; }\nint other(void) { return 9; }\n",
    )
    .unwrap();
    run_checked(
        Command::new("gcc")
            .args(["-O2", "-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(&lib_src),
        "gcc -shared",
    );
    let prog = dir().join("use-answer");
    let prog_src = dir().join("use-answer.c");
    std::fs::write(
        &prog_src,
        "#include <stdio.h>\nint answer(int);\nint other(void);\n\
         int main(void) { printf(\"%d %d\\n\", answer(1), other()); return 0; }\n",
    )
    .unwrap();
    run_checked(
        Command::new("gcc")
            .arg("-O2")
            .arg("-o")
            .arg(&prog)
            .arg(&prog_src)
            .arg("-L")
            .arg(&lib_dir)
            .arg("-lanswer"),
        "gcc use-answer",
    );
    let before = run(&prog, &[("LD_LIBRARY_PATH", &lib_dir)], &[], b"");
    assert_eq!(String::from_utf8_lossy(&before.stdout), "2 9\n");

    let bytes = std::fs::read(&lib).unwrap();
    let at = elfout::first_free_vaddr(&bytes, 0).unwrap();
    let answer = symbol(&lib, "answer", true);
    // lea eax, [rdi + 100]; ret
    let code = vec![0x8d, 0x47, 100, 0xc3];
    let add = Additions {
        segments: vec![rx_segment(at, code)],
        patches: vec![Patch {
            vaddr: answer,
            bytes: jmp(answer, at),
        }],
        ..Additions::default()
    };
    rewrite(&lib, Some(&new_dir.join("libanswer.so")), &add);
    let after = run(&prog, &[("LD_LIBRARY_PATH", &new_dir)], &[], b"");
    assert_eq!(
        String::from_utf8_lossy(&after.stdout),
        "101 9\n",
        "{}",
        String::from_utf8_lossy(&after.stderr)
    );

    let preinit = Additions {
        preinit: Some(at),
        ..add
    };
    assert!(matches!(
        elfout::write(&lib, &bytes, &preinit),
        Err(aetrace_rewrite::Error::Rewrite { .. })
    ));
}

/// The machine's gzip (PIE, BIND_NOW, a large .bss) with a preinit:
/// it prints first, then compresses exactly as before.
#[test]
fn system_gzip_with_preinit() {
    let gzip = Path::new("/usr/bin/gzip");
    let bytes = std::fs::read(gzip).unwrap();
    let at = elfout::first_free_vaddr(&bytes, 0).unwrap();
    let add = Additions {
        segments: vec![rx_segment(at, print_code(at, b"preinit\n", None))],
        preinit: Some(at),
        ..Additions::default()
    };
    let new = rewrite(gzip, Some(&dir().join("gzip.out")), &add);
    let input = common::text_input(20_000);
    let before = run(gzip, &[], &["-c"], &input);
    let after = run(&new, &[], &["-c"], &input);
    assert!(before.status.success());
    assert_eq!(after.status.code(), Some(0));
    let mut expected = b"preinit\n".to_vec();
    expected.extend_from_slice(&before.stdout);
    assert!(after.stdout == expected, "gzip output differs");
}

/// A 64 MiB `.bss`: placing the program headers at `base + offset` would
/// need 64 MiB of zero padding, so they go above the image instead (a file
/// only kernels >= 5.18 load, which this test runs on). The file must not
/// grow by the size of the `.bss`.
#[test]
fn large_bss_does_not_bloat_the_file() {
    let src = "#include <stdio.h>\nstatic char big[64 << 20];\n\
               int main(void) { big[12345] = 7; printf(\"%d\\n\", big[12345] + big[1]); return 0; }\n";
    let exe = gcc("bigbss", src, &["-O2"]);
    let bytes = std::fs::read(&exe).unwrap();
    let at = elfout::first_free_vaddr(&bytes, 0).unwrap();
    let add = Additions {
        segments: vec![rx_segment(at, print_code(at, b"preinit\n", None))],
        preinit: Some(at),
        ..Additions::default()
    };
    let new = elfout::write(&exe, &bytes, &add).unwrap();
    assert!(new.len() < bytes.len() + (1 << 20), "{} bytes", new.len());
    let out = exe.with_extension("out");
    std::fs::write(&out, &new).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
    tools_read_cleanly(&out);
    assert!(!phdrs_where_old_kernels_look(&out));
    let after = run(&out, &[], &[], b"");
    assert_eq!(String::from_utf8_lossy(&after.stdout), "preinit\n7\n");
    assert_eq!(after.status.code(), Some(0));
}

/// A segment below `first_free_vaddr`, a misaligned one, and a patch outside
/// the file-backed image are refused with `Error::Rewrite`.
#[test]
fn bad_additions_are_refused() {
    let gzip = Path::new("/usr/bin/gzip");
    let bytes = std::fs::read(gzip).unwrap();
    let at = elfout::first_free_vaddr(&bytes, 0).unwrap();
    let bad = [
        Additions {
            segments: vec![rx_segment(at - 0x1000, vec![0xc3])],
            ..Additions::default()
        },
        Additions {
            segments: vec![rx_segment(at + 8, vec![0xc3])],
            ..Additions::default()
        },
        Additions {
            patches: vec![Patch {
                vaddr: at,
                bytes: vec![0x90],
            }],
            ..Additions::default()
        },
    ];
    for add in &bad {
        match elfout::write(gzip, &bytes, add) {
            Err(aetrace_rewrite::Error::Rewrite { .. }) => {}
            other => panic!("{add:?} gave {:?}", other.map(|v| v.len())),
        }
    }
}
