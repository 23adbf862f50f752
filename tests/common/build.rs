//! Building `traces/` programs with the machine's gcc/g++ in the variants the
//! tests need (optimisation level x PIE / non-PIE / static, optionally
//! stripped). Builds are cached per test process (each variant is compiled
//! once even when several tests ask for it concurrently) and written
//! atomically (temporary name, then rename).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Opt {
    O0,
    O1,
    O2,
    O3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Link {
    Pie,
    NoPie,
    Static,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    pub opt: Opt,
    pub link: Link,
    pub stripped: bool,
}

impl Variant {
    pub const fn new(opt: Opt, link: Link, stripped: bool) -> Variant {
        Variant {
            opt,
            link,
            stripped,
        }
    }

    /// A short name used in file names and messages, e.g. `O2-pie-stripped`.
    pub fn tag(&self) -> String {
        let opt = match self.opt {
            Opt::O0 => "O0",
            Opt::O1 => "O1",
            Opt::O2 => "O2",
            Opt::O3 => "O3",
        };
        let link = match self.link {
            Link::Pie => "pie",
            Link::NoPie => "nopie",
            Link::Static => "static",
        };
        let strip = if self.stripped { "-stripped" } else { "" };
        format!("{opt}-{link}{strip}")
    }

    fn flags(&self) -> Vec<&'static str> {
        let mut f = vec![match self.opt {
            Opt::O0 => "-O0",
            Opt::O1 => "-O1",
            Opt::O2 => "-O2",
            Opt::O3 => "-O3",
        }];
        f.extend_from_slice(match self.link {
            Link::Pie => &["-fPIE", "-pie"][..],
            Link::NoPie => &["-fno-pie", "-no-pie"][..],
            Link::Static => &["-static"][..],
        });
        f
    }
}

type Slot = Arc<OnceLock<PathBuf>>;

fn cache() -> &'static Mutex<HashMap<String, Slot>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Slot>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The directory all test builds go to.
fn build_dir() -> PathBuf {
    super::scratch("traces-build")
}

/// Builds `traces/<source>` in `variant` (once per process) and returns the
/// path of the executable.
pub fn build(source: &str, variant: Variant) -> PathBuf {
    let key = format!("{source}/{}", variant.tag());
    let slot = cache().lock().unwrap().entry(key).or_default().clone();
    slot.get_or_init(|| compile(source, variant)).clone()
}

/// Runs `cmd`; panics with `what` and its stderr unless it succeeds.
pub fn run_checked(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn compile(source: &str, variant: Variant) -> PathBuf {
    let src = super::repo_root().join("traces").join(source);
    assert!(src.is_file(), "no test program {}", src.display());
    let (stem, ext) = source.rsplit_once('.').expect("source has an extension");
    let compiler = if ext == "c" { "gcc" } else { "g++" };
    let out = build_dir().join(format!("{stem}-{}", variant.tag()));
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let mut cmd = Command::new(compiler);
    cmd.args(variant.flags())
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .arg("-pthread");
    run_checked(
        &mut cmd,
        &format!("{compiler} {source} ({})", variant.tag()),
    );
    if variant.stripped {
        run_checked(
            Command::new("strip").arg("--strip-all").arg(&tmp),
            &format!("strip {}", tmp.display()),
        );
    }
    std::fs::rename(&tmp, &out).unwrap_or_else(|e| panic!("rename to {}: {e}", out.display()));
    out
}

/// Builds `traces/<source>` with `defines` as a whole program without libc
/// (`-O2 -static -nostdlib -fno-builtin -fno-stack-protector`: its own
/// `_start`, raw syscalls) into `dir`, named `name`.
pub fn build_nolibc(dir: &Path, source: &str, defines: &[&str], name: &str) -> PathBuf {
    let exe = dir.join(name);
    run_checked(
        Command::new("gcc")
            .args([
                "-O2",
                "-static",
                "-nostdlib",
                "-fno-builtin",
                "-fno-stack-protector",
            ])
            .args(defines)
            .arg("-o")
            .arg(&exe)
            .arg(super::repo_root().join("traces").join(source)),
        &format!("gcc {source} {defines:?}"),
    );
    exe
}

/// Runs a program natively (no valgrind; stdin from /dev/null) with `args`
/// and returns its output: the reference the valgrind run must equal.
pub fn run_native(exe: &Path, args: &[&str]) -> Output {
    Command::new(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()))
}

/// Builds `traces/<name>.c` against its own shared library
/// `traces/<name>_lib.c`, built as `soname` (found through an absolute
/// DT_RUNPATH, or with `origin` through `$ORIGIN`); the executable.
pub fn build_with_lib(name: &str, soname: &str, origin: bool) -> PathBuf {
    build_with_lib_flags(name, soname, origin, &["-O2"])
}

/// [`build_with_lib`] with the compiler's `flags` (optimisation, debug
/// information) for both the library and the executable.
pub fn build_with_lib_flags(name: &str, soname: &str, origin: bool, flags: &[&str]) -> PathBuf {
    // A directory per call: tests of several topics build the same library
    // at once in this process, and one replaces its library afterwards.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let dir =
        super::scratch("lib-builds").join(format!("{name}-{}-{call}-{origin}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let traces = super::repo_root().join("traces");
    // C++ sources (`NAME.cpp`, `NAME_lib.cpp`) are built with g++.
    let cpp = traces.join(format!("{name}.cpp")).exists();
    let (cc, ext) = if cpp { ("g++", "cpp") } else { ("gcc", "c") };
    let st = Command::new(cc)
        .args(flags)
        .args(["-shared", "-fPIC"])
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-o")
        .arg(dir.join(soname))
        .arg(traces.join(format!("{name}_lib.{ext}")))
        .status()
        .unwrap();
    assert!(st.success(), "{cc} {flags:?} -shared {name}_lib.{ext}");
    let exe = dir.join(name);
    let st = Command::new(cc)
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(traces.join(format!("{name}.{ext}")))
        .arg(format!("-L{}", dir.display()))
        .arg(format!("-l:{soname}"))
        .arg(if origin {
            "-Wl,-rpath,$ORIGIN".to_owned()
        } else {
            format!("-Wl,-rpath,{}", dir.display())
        })
        .status()
        .unwrap();
    assert!(st.success(), "{cc} {flags:?} {name}.{ext}");
    exe
}
