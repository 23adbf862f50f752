//! This process's valgrind lackey logs, kept so that one run serves every
//! test that runs lackey on the same program and input: gzip on the 20 kB
//! text is read by eight (the CFG oracle, the data references and their
//! census, the paths, the traces of three placements), bzip2 with libbz2
//! by four, xz with liblzma by two. Each reader reduces the whole log its
//! own way (`lackey::Reducer`), so a kept log gives it what a new run
//! would.
//!
//! Found by content, never by name: the key covers valgrind's options,
//! the arguments and the bytes of those that name files (the program's
//! among them), stdin's bytes and the added variables, and a kept log
//! serves only a reader whose checked modules have the bytes it was made
//! with; a file rewritten between two runs is another run. A log of
//! `--trace-symtab-patt=*` serves a narrower pattern too (it holds the
//! same objects' dumps and more, which the reader skips), and one made for
//! bzip2 and libbz2 serves a reader of bzip2 alone. What the key leaves
//! out is taken as fixed while the test binary runs: valgrind, the
//! system's libraries, the environment (a program built with its own
//! library gets a directory per call, `build::build_with_lib`, so another
//! key). Logs are zstd-compressed (gzip's 56 MB log: 1.7 MB, 0.15 s) in
//! `lackey-cache/PID/`, whose dead processes' directories are removed at
//! the first use. A log whose reader stopped early (a failed comparison),
//! or longer than 4 GiB (the benches' 2 MB inputs), is not kept. Runs of
//! one key wait for each other, so a log is made once. A served run is
//! not run: what the program would write besides its stdout and stderr
//! is not written again.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// A kept run: its compressed log, the symbol-table pattern and checked
/// modules it was made with, the program's stdout and stderr, valgrind's
/// status.
pub struct Kept {
    pattern: String,
    modules: Vec<(PathBuf, u64)>,
    log: PathBuf,
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Kept {
    /// The log, decompressed as it is read.
    pub fn log(&self) -> impl Read {
        let f = std::fs::File::open(&self.log)
            .unwrap_or_else(|e| panic!("{}: {e}", self.log.display()));
        zstd::stream::read::Decoder::new(f).expect("a zstd decoder")
    }
}

/// The runs of one key (by symbol-table pattern and checked modules);
/// locked while one of them runs.
pub struct Slot {
    key: (u64, u64),
    kept: Vec<Kept>,
}

type Slots = Mutex<HashMap<(u64, u64), Arc<Mutex<Slot>>>>;

fn slots() -> &'static Slots {
    static SLOTS: OnceLock<Slots> = OnceLock::new();
    SLOTS.get_or_init(Default::default)
}

/// This process's directory, the dead processes' ones removed.
fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = super::scratch("lackey-cache");
        for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let pid = e.file_name().to_string_lossy().into_owned();
            if !Path::new("/proc").join(&pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let own = root.join(std::process::id().to_string());
        std::fs::create_dir_all(&own).unwrap();
        own
    })
}

fn content(f: &Path, h: &mut DefaultHasher) {
    let bytes = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    bytes.hash(h);
}

/// What makes a run: valgrind's command line but the symbol-table pattern
/// (`argv`, program and arguments included), stdin, the added variables,
/// and the modules checked (whose bytes a kept log must have been made
/// with).
pub struct Run<'a> {
    pub argv: &'a [String],
    pub stdin: Option<&'a Path>,
    pub env: &'a [(String, String)],
    pub modules: &'a [PathBuf],
}

impl Run<'_> {
    fn key(&self) -> (u64, u64) {
        let hash = |salt: u8| {
            let mut h = DefaultHasher::new();
            salt.hash(&mut h);
            self.argv.hash(&mut h);
            self.env.hash(&mut h);
            // stdin and the arguments that name files (the program's
            // among them), by content too.
            let named = self.argv.iter().map(Path::new).filter(|p| p.is_file());
            for f in self.stdin.into_iter().chain(named) {
                content(f, &mut h);
            }
            h.finish()
        };
        (hash(0), hash(1))
    }

    /// Each module checked, with a hash of its bytes.
    fn modules(&self) -> Vec<(PathBuf, u64)> {
        (self.modules.iter())
            .map(|m| {
                let mut h = DefaultHasher::new();
                content(m, &mut h);
                (m.clone(), h.finish())
            })
            .collect()
    }
}

/// The slot of `run`'s key, to [`lock`].
pub fn slot(run: &Run) -> Arc<Mutex<Slot>> {
    let key = run.key();
    let mut all = slots().lock().unwrap_or_else(|e| e.into_inner());
    let slot = all.entry(key).or_insert_with(|| {
        Arc::new(Mutex::new(Slot {
            key,
            kept: Vec::new(),
        }))
    });
    slot.clone()
}

/// Locks `slot` (a panicking holder leaves it usable: it kept nothing).
pub fn lock(slot: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

impl Slot {
    /// A kept log that serves `run` with `pattern`: made with that pattern
    /// or `*`, and with the same bytes of every module `run` checks.
    pub fn serving(&self, run: &Run, pattern: &str) -> Option<&Kept> {
        let modules = run.modules();
        self.kept.iter().find(|k| {
            (k.pattern == pattern || k.pattern == "*")
                && modules.iter().all(|m| k.modules.contains(m))
        })
    }

    /// A writer keeping the log of `run` with `pattern`, compressed.
    pub fn writer(&self, run: &Run, pattern: &str) -> Writer {
        let n = self.kept.len();
        let name = format!("{:016x}{:016x}-{n}.zst", self.key.0, self.key.1);
        let path = dir().join(name);
        let f = std::fs::File::create(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Writer {
            pattern: pattern.to_owned(),
            modules: run.modules(),
            out: zstd::stream::write::Encoder::new(f, 1).expect("a zstd encoder"),
            path,
            read: 0,
        }
    }

    /// Keeps the run `w` wrote, complete.
    pub fn keep(&mut self, w: Writer, status: ExitStatus, stdout: &[u8], stderr: &[u8]) {
        w.out.finish().expect("finishing a kept lackey log");
        self.kept.push(Kept {
            pattern: w.pattern,
            modules: w.modules,
            log: w.path,
            status,
            stdout: stdout.to_vec(),
            stderr: stderr.to_vec(),
        });
    }
}

/// The longest log kept, uncompressed (gzip's on 20 kB: 56 MB): the 2 MB
/// inputs of `bench/run exactness` (xz: 4.65 billion instructions) are
/// read once, and their logs would fill the disk.
const KEPT_BYTES: u64 = 4 << 30;

/// A log being kept (no longer, once it outgrows [`KEPT_BYTES`]).
pub struct Writer {
    pattern: String,
    modules: Vec<(PathBuf, u64)>,
    path: PathBuf,
    out: zstd::stream::write::Encoder<'static, std::fs::File>,
    read: u64,
}

impl Writer {
    /// Removes the unfinished log.
    pub fn discard(self) {
        let _ = std::fs::remove_file(&self.path);
    }

    /// Whether the whole log is in the file.
    pub fn whole(&self) -> bool {
        self.read <= KEPT_BYTES
    }
}

/// Reads `from`, writing what it reads to the kept log.
pub struct Tee<'w, R> {
    pub from: R,
    pub copy: &'w mut Writer,
}

impl<R: Read> Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.from.read(buf)?;
        self.copy.read += n as u64;
        if self.copy.whole() {
            self.copy.out.write_all(&buf[..n])?;
        }
        Ok(n)
    }
}
