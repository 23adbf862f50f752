//! Bad input to `aetrace cfg`: a text file, an empty file, truncated ELFs,
//! an ARM (AArch64) ELF, a 32-bit ELF, a directory, a missing file and an
//! unknown `--function` must each give one line on stderr starting with
//! `aetrace: error:` that names the file, exit status 1, nothing on stdout,
//! and never a panic.
//! A mistyped option before the program of `record`, `profile`, `count`,
//! `paths` (and any option `verify` lacks) is clap's usage error, status 2,
//! while the program's own arguments reach it untouched. A closed stdout
//! pipe (`| head`) ends `cfg` and `report` quietly with status 0. `regen
//! -o -` writes to stdout.
//! The foreign ELFs are made without cross compilers: a copy of a real
//! x86-64 ELF with `e_machine` patched, and a hand-written ELF32 header.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn dir() -> PathBuf {
    common::scratch("cli-errors")
}

fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir().join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Runs `aetrace cfg FILE` (and `--json`) and checks the error contract;
/// returns the message (lowercased) for further checks.
fn expect_error(file: &Path) -> String {
    expect_error_with(file, &[&[], &["--json"]])
}

fn expect_error_with(file: &Path, variants: &[&[&str]]) -> String {
    let mut last = String::new();
    for &extra in variants {
        let out = Command::new(common::aetrace())
            .arg("cfg")
            .arg(file)
            .args(extra)
            .output()
            .expect("running aetrace");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let ctx = format!(
            "aetrace cfg {} {extra:?}: stderr {stderr:?}",
            file.display()
        );
        assert!(!out.status.success(), "{ctx}: exit status {}", out.status);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{ctx}: expected exit 1, got {}",
            out.status
        );
        assert!(!stderr.contains("panicked"), "{ctx}: panicked");
        assert!(
            out.stdout.is_empty(),
            "{ctx}: stdout not empty: {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert_eq!(stderr.lines().count(), 1, "{ctx}: not exactly one line");
        assert!(
            stderr.starts_with("aetrace: error: "),
            "{ctx}: wrong prefix"
        );
        assert!(
            stderr.contains(&file.display().to_string()),
            "{ctx}: the message does not name the file"
        );
        last = stderr.to_lowercase();
    }
    last
}

fn real_elf() -> Vec<u8> {
    std::fs::read("/usr/bin/true").expect("/usr/bin/true")
}

#[test]
fn text_file() {
    let f = write("notes.txt", b"this is a text file, not a program\n");
    let m = expect_error(&f);
    assert!(m.contains("not an elf"), "{m}");
}

#[test]
fn empty_file() {
    let f = write("empty", b"");
    expect_error(&f);
}

#[test]
fn missing_file() {
    let f = dir().join("does-not-exist");
    let m = expect_error(&f);
    assert!(m.contains("no such file"), "{m}");
}

#[test]
fn directory() {
    expect_error(&dir());
}

#[test]
fn truncated_elf() {
    let elf = real_elf();
    // Cut inside the ELF header, inside the program headers, and inside
    // the code (section headers, at the end of the file, are then missing).
    for len in [4, 20, 63, 100, 300, 4096, elf.len() / 2, elf.len() - 1] {
        let f = write(&format!("true-cut-{len}"), &elf[..len]);
        let m = expect_error(&f);
        assert!(
            m.contains("malformed") || m.contains("truncated") || m.contains("not an elf"),
            "cut at {len}: {m}"
        );
    }
}

#[test]
fn garbage_section_headers() {
    // A real header whose section-header table points far past the end.
    let mut elf = real_elf();
    elf[0x28..0x30].copy_from_slice(&0x7fff_ffff_0000u64.to_le_bytes());
    let f = write("true-bad-shoff", &elf);
    expect_error(&f);
    // And one whose section count is absurd.
    let mut elf = real_elf();
    elf[0x3c..0x3e].copy_from_slice(&0xffffu16.to_le_bytes());
    let f = write("true-bad-shnum", &elf);
    expect_error(&f);
}

#[test]
fn arm_elf() {
    // e_machine (offset 18) = EM_AARCH64 (183) on a copy of a real ELF.
    let mut elf = real_elf();
    elf[18..20].copy_from_slice(&183u16.to_le_bytes());
    let f = write("true-aarch64", &elf);
    let m = expect_error(&f);
    assert!(m.contains("unsupported"), "{m}");
    // And EM_ARM (40).
    elf[18..20].copy_from_slice(&40u16.to_le_bytes());
    let f = write("true-arm", &elf);
    let m = expect_error(&f);
    assert!(m.contains("unsupported"), "{m}");
}

/// A minimal but well-formed ELF32 i386 executable header (52 bytes), no
/// program or section headers.
fn elf32_header() -> Vec<u8> {
    let mut h = vec![0u8; 52];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = 1; // ELFCLASS32
    h[5] = 1; // little endian
    h[6] = 1; // EV_CURRENT
    h[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    h[18..20].copy_from_slice(&3u16.to_le_bytes()); // EM_386
    h[20..24].copy_from_slice(&1u32.to_le_bytes()); // e_version
    h[24..28].copy_from_slice(&0x0804_8000u32.to_le_bytes()); // e_entry
    h[40..42].copy_from_slice(&52u16.to_le_bytes()); // e_ehsize
    h[42..44].copy_from_slice(&32u16.to_le_bytes()); // e_phentsize
    h[46..48].copy_from_slice(&40u16.to_le_bytes()); // e_shentsize
    h
}

#[test]
fn elf32() {
    let f = write("elf32-i386", &elf32_header());
    let m = expect_error(&f);
    assert!(m.contains("unsupported") && m.contains("32"), "{m}");
    // A 64-bit file relabelled as 32-bit: EI_CLASS patched.
    let mut elf = real_elf();
    elf[4] = 1;
    let f = write("true-class32", &elf);
    expect_error(&f);
}

#[test]
fn big_endian_and_object_files() {
    let mut elf = real_elf();
    elf[5] = 2; // ELFDATA2MSB
    let f = write("true-msb", &elf);
    expect_error(&f);
    let mut elf = real_elf();
    elf[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
    let f = write("true-rel", &elf);
    let m = expect_error(&f);
    assert!(m.contains("unsupported") || m.contains("malformed"), "{m}");
}

#[test]
fn unknown_function() {
    let m = expect_error_with(
        Path::new("/usr/bin/true"),
        &[
            &["--function", "no_such_function"],
            &["--function", "0x1", "--dot"],
        ],
    );
    assert!(m.contains("no procedure"), "{m}");
}

/// `aetrace ARGS`, in the scratch directory (outputs named after the
/// program land there).
fn run_aetrace(args: &[&str]) -> std::process::Output {
    Command::new(common::aetrace())
        .args(args)
        .current_dir(dir())
        .output()
        .expect("running aetrace")
}

#[test]
fn a_mistyped_option_before_the_program_is_a_usage_error() {
    for cmd in ["record", "profile", "count", "paths"] {
        for args in [
            &[cmd, "--lib", "all", "--", "true"][..],
            &[cmd, "--lib", "all", "true"],
            &[cmd, "--lib=all", "true", "x"],
        ] {
            let out = run_aetrace(args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(
                stderr.contains("unexpected argument '--lib") && stderr.contains("--libs"),
                "{args:?}: {stderr}"
            );
            assert!(!stderr.contains("not found"), "{args:?}: {stderr}");
        }
    }
    let out = run_aetrace(&["verify", "--bogus", "t.aet"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "verify: {stderr}");
    assert!(stderr.contains("unexpected argument '--bogus'"), "{stderr}");
}

#[test]
fn the_programs_own_options_reach_it_untouched() {
    let script = "test \"$*\" = \"--lib all -- -x\" && exit 7";
    for args in [
        &[
            "count", "sh", "-c", script, "sh", "--lib", "all", "--", "-x",
        ][..],
        &[
            "count", "--", "sh", "-c", script, "sh", "--lib", "all", "--", "-x",
        ],
    ] {
        let out = run_aetrace(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(7), "{args:?}: {stderr}");
        assert!(stderr.contains(" insns"), "{args:?}: {stderr}");
    }
}

/// Runs `aetrace ARGS` with its stdout a pipe closed before it writes (or
/// after `keep` bytes): status 0 and nothing on stderr.
fn quiet_on_a_closed_pipe(args: &[&str], keep: usize) {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = Command::new(common::aetrace())
        .args(args)
        .current_dir(dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running aetrace");
    let mut head = vec![0u8; keep];
    let mut stdout = child.stdout.take().unwrap();
    stdout.read_exact(&mut head).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{args:?}: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_closed_output_pipe_ends_quietly() {
    // Over a megabyte of JSON: far more than a pipe holds.
    quiet_on_a_closed_pipe(&["cfg", "--json", "/usr/bin/ls"], 4096);
    quiet_on_a_closed_pipe(&["cfg", "--dot", "/usr/bin/ls"], 0);
    let profile = dir().join("ls.aprof");
    let out = Command::new(common::aetrace())
        .args(["profile", "-o"])
        .arg(&profile)
        .args(["/usr/bin/ls", "/"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = profile.to_str().unwrap();
    for format in ["text", "json", "callgrind"] {
        quiet_on_a_closed_pipe(&["report", "--format", format, p], 0);
    }
}

/// `regen -o -` writes to stdout, as `-` means to the other tools, and
/// leaves no file named `-`.
#[test]
fn regen_to_dash_is_stdout() {
    let cwd = dir().join("dash");
    std::fs::create_dir_all(&cwd).unwrap();
    let trace = cwd.join("true.aet");
    common::build::run_checked(
        Command::new(common::aetrace())
            .args(["record", "-o"])
            .arg(&trace)
            .args(["--", "/bin/true"]),
        "aetrace record",
    );
    let regen = |extra: &[&str]| {
        let mut cmd = Command::new(common::aetrace());
        cmd.current_dir(&cwd).arg("regen").args(extra).arg(&trace);
        common::build::run_checked(&mut cmd, "aetrace regen").stdout
    };
    let plain = regen(&[]);
    assert!(!plain.is_empty());
    assert_eq!(regen(&["-o", "-"]), plain);
    assert!(!cwd.join("-").exists(), "regen -o - wrote a file named -");
}
