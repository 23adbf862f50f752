//! Shared harness of the end-to-end tests: building the `traces/` programs in
//! their variants, running `aetrace cfg --json`, running programs under
//! valgrind lackey, and the CFG oracle that compares the two.
//!
//! Nothing here uses the aetrace crates: the oracle must share no code with
//! what it checks. All topics of `tests/tests.rs` share one process, so
//! what is kept here per process (the build cache) is keyed by what it
//! holds, and files that tests of several topics write are named per call
//! (`build::build_with_lib`, `recorded::record_run`), not per process.

pub mod build;
pub mod cachegrind;
pub mod callgrind;
pub mod cfg;
pub mod elf;
pub mod exact;
pub mod exact_data;
pub mod lackey;
pub mod lackey_cache;
pub mod lsda;
pub mod native_gdb;
pub mod oracle;
pub mod recorded;
pub mod regen;
pub mod singlestep;
pub mod sweep;

use std::hash::{BuildHasherDefault, Hasher};

/// A small multiplicative hasher for the u64 keys of the oracle's sets: the
/// lackey streams have tens of millions of lines and SipHash in a debug build
/// would dominate the test time.
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

pub type FastMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FastHasher>>;
pub type FastSet<K> = std::collections::HashSet<K, BuildHasherDefault<FastHasher>>;

/// Sort key putting task ids in the order the kernel created them, given
/// the first task's id `root`: ids are handed out cyclically up to
/// `pid_max` (32768 here), so a run straddling the wrap has a child id
/// below its parent's, and sorting by id then pairs the stepped run's
/// tasks with the wrong threads of the trace (issue 23, seen once under
/// load: `raw_clone` clone3-fork). A run spans far fewer than `pid_max`
/// creations, so the distance from `root` is the creation order.
pub fn creation_key(root: u32) -> impl Fn(u32) -> u32 {
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("/proc/sys/kernel/pid_max")
        .trim()
        .parse()
        .expect("pid_max is a number");
    move |id| {
        debug_assert!(id < max && root < max);
        (id + max - root) % max
    }
}

/// The `aetrace` binary of this build.
pub fn aetrace() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_aetrace"))
}

/// `aetrace ARGS` with exactly `env` and address randomisation off (the
/// traced program inherits both).
pub fn aetrace_fixed(args: &[&std::ffi::OsStr], env: &[(String, String)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(aetrace());
    cmd.args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null());
    no_aslr(&mut cmd);
    cmd.output().unwrap()
}

/// With address randomisation off the kernel puts the stack below
/// 0x7ffffffff000 and mappings below 0x7ffff7fff000 (128 MiB lower): an
/// address at or above this is on the stack. With it on, mappings can
/// land anywhere up there.
pub const STACK_FLOOR: u64 = 0x7fff_f800_0000;

/// Runs `cmd` with address randomisation off (`setarch -R`).
pub fn no_aslr(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: one async-signal-safe call between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The number of the `KEY=N` word (`key` is `"KEY="`) in a test program's
/// output: the programs count what they did (handler runs, iterations),
/// the oracle where valgrind cannot be one (asynchronous signals).
pub fn count_in(stdout: &str, key: &str) -> Option<u64> {
    stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.parse().ok())
}

/// A scratch directory for the tests' artifacts, `sub` naming its topic.
pub fn scratch(sub: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(sub);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// The directory holding the workspace (where `traces/` lives).
pub fn repo_root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// [`text_input`]'s 20 kB in a file, written once per process: the input
/// of every test that runs gzip, bzip2 or xz on 20 kB under lackey, one
/// path for all, so that one lackey run serves them (`lackey_cache` keys
/// on the arguments).
pub fn text_20k() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let p = scratch("inputs").join("text-20000");
        // Renamed into place: a concurrent test binary may be reading it.
        let tmp = p.with_extension(std::process::id().to_string());
        std::fs::write(&tmp, text_input(20_000)).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        p.display().to_string()
    })
}

/// A deterministic, compressible 20 kB text-like input for gzip/bzip2
/// (words drawn by an LCG), the same in every run.
pub fn text_input(len: usize) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "the",
        "trace",
        "witness",
        "edge",
        "block",
        "procedure",
        "regenerate",
        "abstract",
        "execution",
        "of",
        "a",
        "program",
        "cache",
        "miss",
        "branch",
        "predicate",
        "loop",
        "call",
        "return",
        "stack",
        "x86-64",
        "elf",
        "0x4010",
        "42",
        "\n",
    ];
    let mut out = Vec::with_capacity(len + 16);
    let mut state: u32 = 12345;
    while out.len() < len {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let w = WORDS[(state >> 16) as usize % WORDS.len()];
        out.extend_from_slice(w.as_bytes());
        out.push(b' ');
    }
    out.truncate(len);
    out
}
