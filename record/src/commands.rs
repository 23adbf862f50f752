//! What `aetrace instrument` and `aetrace record` do: rewrite a program
//! ([`aetrace_rewrite`]), then run it under the recorder ([`crate::launch`]).
//!
//! Invariants: the rewritten executable is written to a temporary name and
//! renamed into place ([`aetrace_format::atomic`]), so no half-written
//! program is ever run; the program
//! is found on `PATH` like a shell would, and its `argv[0]` is what the
//! user typed.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use aetrace_format::{atomic, progdb};
use aetrace_format::{compress_database, module_flags, Codec, EncodedDatabase};

use crate::error::RecordError;
use crate::launch::{self, Launch, ModuleSpec, Recorded};
use crate::libs::LibSelection;
use crate::{Error, Result};
use aetrace_rewrite::{self as rewrite, DataMode, Instrumented, Placement};

fn io_err(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `bytes` to `path` atomically with mode 0755.
pub(crate) fn write_executable(path: &Path, bytes: &[u8]) -> Result<()> {
    Ok(atomic::write_atomic(path, bytes, atomic::EXECUTABLE)?)
}

/// `aetrace instrument ELF -o OUT`: writes the rewritten program. Run
/// without the recorder, it writes its raw witness streams to the file
/// named by `AETRACE_OUT`.
pub fn instrument_to(elf: &Path, out: &Path, placement: Placement) -> Result<Instrumented> {
    let ins = rewrite::instrument(elf, placement)?;
    write_executable(out, &ins.elf)?;
    Ok(ins)
}

/// Finds `program` as `execvp` would: a name with a slash as is, else the
/// first executable file of that name on `PATH`.
pub fn find_program(program: &Path) -> Result<PathBuf> {
    let not_found = || Error::from(RecordError::ProgramNotFound(program.to_owned()));
    if program.as_os_str().is_empty() {
        return Err(not_found());
    }
    if program.components().count() > 1 || program.to_string_lossy().contains('/') {
        return if program.is_file() {
            Ok(program.to_owned())
        } else {
            Err(not_found())
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(not_found)
}

/// Options of `aetrace record`.
pub struct RecordOptions {
    /// Trace file (default: the program's base name + `.aet`).
    pub trace: Option<PathBuf>,
    /// Which witness placement the rewriter uses.
    pub placement: Placement,
    /// `--data` (and `--check`): which data values are recorded too
    /// (VALUE records, docs/data.md).
    pub data: DataMode,
    /// Shared libraries rewritten and traced with the program.
    pub libs: LibSelection,
    /// The program to run (a path, or a name looked up on `PATH`; for a
    /// `#!` script, its interpreter is recorded, run with the script).
    pub program: PathBuf,
    /// Its arguments after `argv[0]`.
    pub args: Vec<OsString>,
}

/// A rewritten module as the recorder needs it, ready to run.
struct Prepared {
    /// The rewritten executable.
    elf: PathBuf,
    module: ModuleSpec,
}

/// The cache of rewritten programs: `$AETRACE_CACHE`, else
/// `$XDG_CACHE_HOME/aetrace`, else `~/.cache/aetrace`, else a directory in
/// the temporary directory.
pub(crate) fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("AETRACE_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("aetrace");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache/aetrace"),
        None => std::env::temp_dir().join("aetrace-cache"),
    }
}

/// The cache key: what the rewrite depends on. The program's build-id
/// with its size and modification time (a stripped copy keeps the build-id
/// but not the size), or a hash of its bytes when it has no build-id; the
/// instrumentation (`what`: the placement, or `aetrace profile`'s counting
/// spec), the fault injection if any, and this aetrace executable (a
/// rebuilt rewriter must not reuse old copies).
pub(crate) fn cache_key(exe: &Path, bytes: &[u8], what: &str, tag: u32) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    match build_id(bytes) {
        Some(id) => {
            id.hash(&mut h);
            bytes.len().hash(&mut h);
            std::fs::metadata(exe)
                .and_then(|m| m.modified())
                .ok()
                .hash(&mut h);
        }
        None => bytes.hash(&mut h),
    }
    what.hash(&mut h);
    // A library's module tag is baked into its ENTER records.
    tag.hash(&mut h);
    // A fault-injected copy must never be taken for a correct one.
    std::env::var_os(rewrite::FAULT_ENV).hash(&mut h);
    std::env::var_os(rewrite::FAULT_DATA_ENV).hash(&mut h);
    env!("CARGO_PKG_VERSION").hash(&mut h);
    if let Ok(me) = std::env::current_exe().and_then(|p| p.metadata()) {
        me.len().hash(&mut h);
        me.modified().ok().hash(&mut h);
    }
    let name = exe
        .file_name()
        .map_or_else(|| "program".into(), |n| n.to_string_lossy().into_owned());
    format!("{name}-{:016x}", h.finish())
}

/// The `NT_GNU_BUILD_ID` descriptor of the ELF in `bytes`, through its
/// PT_NOTE segments: the few pages they span are all that is read.
fn build_id(bytes: &[u8]) -> Option<&[u8]> {
    let (elf, _) = crate::libs::headers_only(bytes).ok()?;
    elf.iter_note_headers(bytes)?
        .filter_map(|n| n.ok())
        .find(|n| n.n_type == goblin::elf::note::NT_GNU_BUILD_ID && n.name == "GNU")
        .map(|n| n.desc)
        .filter(|d| !d.is_empty())
}

/// The directory the executable's loader searches first for libraries,
/// the DT_NEEDED names its copy names by their path in it, and where its
/// loader reads its cache.
pub(crate) type Search = rewrite::elfout::SearchFirst;

/// Rewrites `exe` (module tag 0; `search`: the directory its loader
/// searches first for libraries, [`Search`]) or a library (`tag` > 0; `startup`: the
/// loader maps it before the executable's preinit, so its additions are
/// detached), or takes the copy a previous run cached.
fn prepare(
    exe: &Path,
    placement: Placement,
    data: DataMode,
    (tag, startup, glibc_traced): (u32, bool, bool),
    search: Option<&Search>,
) -> Result<Prepared> {
    let file = std::fs::File::open(exe).map_err(|e| io_err(exe, e))?;
    // SAFETY: a private read-only mapping; only the pages the key needs
    // (headers and notes when there is a build-id) are read.
    let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io_err(exe, e))?;
    let dir = cache_dir();
    // A control-only copy keeps the key it always had.
    let what = format!(
        "{placement:?}{}{}{}{}",
        match data {
            DataMode::Off => "",
            DataMode::Abstract => "+data-abs",
            DataMode::Check => "+data-abs-check",
        },
        if startup { "+detached" } else { "" },
        if glibc_traced { "+glibc-traced" } else { "" },
        search.map_or_else(String::new, |s| {
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            format!(
                "+search={}{}{}",
                text(&s.dir),
                (s.by_path.iter())
                    .map(|n| format!("+by-path={}", text(n)))
                    .collect::<String>(),
                (s.cache_probe_before.as_deref())
                    .map(|n| format!("+cache-probe={}", text(n)))
                    .unwrap_or_default()
            )
        })
    );
    let key = cache_key(exe, &bytes, &what, tag);
    drop(bytes);
    let (elf, meta_path) = (dir.join(&key), dir.join(format!("{key}.meta")));
    // A library keeps the path the loader finds it by (its DT_NEEDED
    // name as the file name: `--module libbz2.so.1.0`).
    let path = if tag == 0 {
        exe.canonicalize().unwrap_or_else(|_| exe.to_owned())
    } else {
        exe.to_owned()
    };
    let mut flags = if tag == 0 {
        module_flags::MAIN | module_flags::INSTRUMENTED
    } else {
        module_flags::INSTRUMENTED
    };
    flags |= match data {
        DataMode::Off => 0,
        DataMode::Abstract => module_flags::DATA_ABS,
        DataMode::Check => module_flags::DATA_ABS | module_flags::DATA_CHECK,
    };
    if let Some(module) =
        cache_load(&elf, &meta_path).and_then(|m| decode_meta(&m, path.clone(), flags))
    {
        return Ok(Prepared { elf, module });
    }
    let how = (startup, glibc_traced);
    let ins = match rewrite::instrument_module_data(exe, placement, tag, data, how, search) {
        Err(e) if e.is_detach_refusal() => {
            let how = (false, glibc_traced);
            rewrite::instrument_module_data(exe, placement, tag, data, how, search)?
        }
        r => r?,
    };
    let db = compress_database(progdb::VERSION, &ins.db.encode(), DB_LEVEL).map_err(|source| {
        RecordError::Database {
            exe: exe.to_owned(),
            source,
        }
    })?;
    let module = ModuleSpec {
        path,
        build_id: ins.build_id.clone(),
        flags,
        size: ins.size,
        db,
        runtime_vaddr: ins.db.runtime_vaddr,
        image_id: ins.image_id,
        notes: ins.notes.clone(),
    };
    cache_store(&elf, &ins.elf, &meta_path, &encode_meta(&module))?;
    Ok(Prepared { elf, module })
}

/// Stores a rewritten module and its metadata `meta` in the cache. The
/// metadata file goes last (its presence marks a complete entry) and is
/// `[u32 crc32 of the rest][u64 ELF length][u32 ELF crc32]` then `meta`:
/// [`cache_load`] checks both files against it, so an entry truncated or
/// damaged on disk, or whose two files come from two runs that stored it
/// at once and differ, is rewritten, never run (docs/faults.md).
pub(crate) fn cache_store(elf: &Path, bytes: &[u8], meta_path: &Path, meta: &[u8]) -> Result<()> {
    if let Some(dir) = elf.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    }
    write_executable(elf, bytes)?;
    let mut side = vec![0; 4];
    side.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    side.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
    side.extend_from_slice(meta);
    let crc = crc32fast::hash(&side[4..]);
    side[..4].copy_from_slice(&crc.to_le_bytes());
    Ok(atomic::write_atomic(meta_path, &side, None)?)
}

/// The metadata [`cache_store`] stored with the rewritten module `elf`,
/// if both files are whole and sound. Reading and checking the ELF costs
/// a crc32 of its bytes per run (crc32fast: several GB/s).
pub(crate) fn cache_load(elf: &Path, meta_path: &Path) -> Option<Vec<u8>> {
    let side = std::fs::read(meta_path).ok()?;
    let u32_at = |o: usize| Some(u32::from_le_bytes(side.get(o..o + 4)?.try_into().ok()?));
    if u32_at(0)? != crc32fast::hash(side.get(4..)?) {
        return None;
    }
    let len = u64::from_le_bytes(side.get(4..12)?.try_into().ok()?);
    let bytes = std::fs::read(elf).ok()?;
    (bytes.len() as u64 == len && crc32fast::hash(&bytes) == u32_at(12)?)
        .then(|| side[16..].to_vec())
}

/// zstd level of the program database, compressed once per rewrite and
/// copied into every trace: the rewrite takes far longer than level 19
/// does, and the database is most of a short run's trace.
const DB_LEVEL: i32 = 19;

/// `[u64 size][u64 runtime_vaddr][u64 image id][u64 database raw
/// length][u32 n][n x
/// (u32 len, bytes)]` for the build-id, the notes, then the
/// zstd-compressed database to the end. [`cache_store`]'s checksum stands
/// in for decoding the database on every run.
fn encode_meta(m: &ModuleSpec) -> Vec<u8> {
    debug_assert!(m.db.codec == Codec::Zstd && m.db.version == progdb::VERSION);
    let mut out = Vec::new();
    out.extend_from_slice(&m.size.to_le_bytes());
    out.extend_from_slice(&m.runtime_vaddr.to_le_bytes());
    out.extend_from_slice(&m.image_id.to_le_bytes());
    out.extend_from_slice(&m.db.raw_len.to_le_bytes());
    let fields: Vec<&[u8]> = std::iter::once(m.build_id.as_slice())
        .chain(m.notes.iter().map(|n| n.as_bytes()))
        .collect();
    out.extend_from_slice(&(fields.len() as u32).to_le_bytes());
    for f in fields {
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    out.extend_from_slice(&m.db.data);
    out
}

/// The inverse of [`encode_meta`]; `None` for a damaged entry (it is then
/// rewritten).
fn decode_meta(b: &[u8], path: PathBuf, flags: u32) -> Option<ModuleSpec> {
    let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?) as usize);
    let (size, runtime_vaddr, image_id) = (u64_at(0)?, u64_at(8)?, u64_at(16)?);
    let (raw_len, n) = (u64_at(24)?, u32_at(32)?);
    let mut at = 36;
    let mut fields = Vec::new();
    for _ in 0..n {
        let len = u32_at(at)?;
        fields.push(b.get(at + 4..at + 4 + len)?.to_vec());
        at += 4 + len;
    }
    let db = EncodedDatabase {
        version: progdb::VERSION,
        raw_len,
        codec: Codec::Zstd,
        data: b.get(at..)?.to_vec(),
    };
    let mut fields = fields.into_iter();
    Some(ModuleSpec {
        path,
        build_id: fields.next()?,
        flags,
        size,
        db,
        runtime_vaddr,
        image_id,
        notes: fields
            .map(|f| String::from_utf8_lossy(&f).into_owned())
            .collect(),
    })
}

/// What [`prepare_libs`] makes: each traced library with what `prepare`
/// made of it, the notes on libraries left alone, and the per-run directory
/// through which the loader finds the rewritten copies.
type PreparedLibs<T> = (Vec<(crate::libs::Library, T)>, Vec<String>, Option<LibDir>);

/// The `--libs` libraries of `exe`, each rewritten by `prepare(lib, tag,
/// glibc_traced)` (which returns the rewritten file and what else it made)
/// with dense module tags from 1 (`glibc_traced`: one of glibc's libraries
/// is selected, so every module's imports may run traced code); the notes
/// on libraries left alone; the per-run directory through which the
/// loader finds the rewritten copies.
pub(crate) fn prepare_libs<T>(
    exe: &Path,
    (libs, glibc): (&LibSelection, crate::libs::GlibcPolicy),
    mut prepare: impl FnMut(&crate::libs::Library, u32, bool) -> Result<(PathBuf, T)>,
) -> Result<PreparedLibs<T>> {
    let sel = crate::libs::select(exe, libs, glibc)?;
    let glibc_traced = sel.traced.iter().any(|l| crate::libs::is_glibc(&l.needed));
    let mut notes = sel.notes;
    let mut links = Vec::new();
    let mut out = Vec::new();
    for lib in &sel.traced {
        // Tags stay dense: the next library gets the next module id.
        let (elf, made) = match prepare(lib, out.len() as u32 + 1, glibc_traced) {
            Ok(p) => p,
            // `all` means every library that can be traced: one the
            // rewriter refuses runs untraced, like libc, and the trace
            // says why. A library named explicitly must be traced.
            Err(e) if *libs == LibSelection::All => {
                notes.push(format!("library {} left alone: {e}", lib.needed));
                // Its `$ORIGIN` dependents, linked below, are the same
                // files under the same names: harmless.
                continue;
            }
            Err(e) => return Err(e),
        };
        links.push((lib.needed.clone(), elf));
        out.push((lib.clone(), made));
    }
    // The rewritten copies live in the cache: what their `$ORIGIN` found
    // must still be found.
    for lib in &sel.origin_relative {
        links.push((lib.needed.clone(), lib.path.clone()));
    }
    // A library left alone above has no link to name.
    let linked = |n: &String| links.iter().any(|(l, _)| l == n);
    let by_path = sel.by_path.into_iter().filter(linked).collect();
    let cache_probe_before = sel.cache_probe_before.filter(linked);
    let dir = LibDir::create(&links, sel.exe_path_first)?;
    let dir = dir.map(|d| LibDir {
        by_path,
        cache_probe_before,
        ..d
    });
    Ok((out, notes, dir))
}

/// `aetrace record`: rewrites the program (or reuses the cached copy), runs
/// it with the recorder, and returns how it ended.
pub fn record(o: &RecordOptions) -> Result<Recorded> {
    let exe = find_program(&o.program)?;
    // A script: its interpreter, run with the script (the trace is still
    // named after what the user ran).
    let run = crate::script::follow(crate::script::Invocation {
        exe: exe.clone(),
        argv0: o.program.clone().into_os_string(),
        args: o.args.clone(),
    })?;
    let follow = Follow {
        placement: o.placement,
        data: o.data,
        libs: o.libs.clone(),
    };
    let rewritten = rewrite_program(&run.exe, &follow)?;
    let trace = o
        .trace
        .clone()
        .unwrap_or_else(|| default_output(&exe, ".aet"));
    launch::record(&Launch {
        program: rewritten.elf,
        argv0: run.argv0,
        native_path: Some(exe),
        args: run.args,
        env: rewritten.env,
        trace,
        modules: rewritten.modules,
        geometry: Launch::geometry_from_env()?,
        follow: Some(follow),
    })
}

/// How `aetrace record` rewrites a program: its own, and each one a
/// traced process execs ([`crate::follow`]).
#[derive(Clone, Debug)]
pub struct Follow {
    /// Which witness placement the rewriter uses.
    pub placement: Placement,
    /// `--data`.
    pub data: DataMode,
    /// `--libs`, as given.
    pub libs: LibSelection,
}

/// A program rewritten with its `--libs` libraries, ready to run.
#[derive(Clone, Debug)]
pub(crate) struct Rewritten {
    /// The rewritten executable.
    pub elf: PathBuf,
    /// The executable's module, then its traced libraries'.
    pub modules: Vec<ModuleSpec>,
    /// Variables the copy needs added (the loader's search path, where
    /// the executable's own does not reach the libraries' copies).
    pub env: Vec<(OsString, OsString)>,
}

/// Rewrites the ELF executable `exe` and the libraries `f.libs` selects
/// (or takes them from the cache).
pub(crate) fn rewrite_program(exe: &Path, f: &Follow) -> Result<Rewritten> {
    let glibc = crate::libs::GlibcPolicy::AllButLoader;
    let (libs, notes, dir) = prepare_libs(exe, (&f.libs, glibc), |lib, tag, glibc_traced| {
        let flags = (tag, !lib.dlopened, glibc_traced);
        prepare(&lib.path, f.placement, f.data, flags, None).map(|p| (p.elf, p.module))
    })?;
    // The copies are found through the executable's own search path
    // where that reaches them all, so the program's environment (and
    // its initial stack) is the native one; else through LD_LIBRARY_PATH.
    let search = dir.as_ref().and_then(LibDir::exe_search);
    let glibc_traced = libs.iter().any(|(l, _)| crate::libs::is_glibc(&l.needed));
    let flags = (0, false, glibc_traced);
    let prepared = prepare(exe, f.placement, f.data, flags, search.as_ref())?;
    let mut modules = vec![prepared.module];
    modules[0].notes.extend(notes);
    modules.extend(libs.into_iter().map(|(_, m)| m));
    let env = dir
        .as_ref()
        .filter(|d| !d.exe_path_first)
        .map(LibDir::env)
        .into_iter()
        .collect();
    Ok(Rewritten {
        elf: prepared.elf,
        modules,
        env,
    })
}

/// The default output of a run of `exe`: its base name with `ext` added,
/// in the current directory.
pub(crate) fn default_output(exe: &Path, ext: &str) -> PathBuf {
    let mut t = exe
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "program".into());
    t.push(ext);
    PathBuf::from(t)
}

/// The directory of symlinks, named by DT_NEEDED names, to the cached
/// rewritten libraries; first in the rewritten executable's own search
/// path (`record`, where that reaches them all: [`Self::exe_search`]) or
/// in `LD_LIBRARY_PATH`, so the loader loads them instead of the
/// originals. It lives in the cache, named by a hash
/// of its links, and is made once (in a temporary directory renamed into
/// place, so no run sees it half made) then reused as it is: making and
/// removing a directory on every run cost about 0.15 ms. Its links point
/// at cache entries whose names change with their contents, so a reused
/// directory never points at another rewrite.
pub(crate) struct LibDir {
    dir: PathBuf,
    /// [`crate::libs::Selection::exe_path_first`].
    exe_path_first: bool,
    /// [`crate::libs::Selection::by_path`], of the libraries linked here.
    by_path: Vec<String>,
    /// [`crate::libs::Selection::cache_probe_before`], when linked here.
    cache_probe_before: Option<String>,
}

impl LibDir {
    pub(crate) fn create(
        links: &[(String, PathBuf)],
        exe_path_first: bool,
    ) -> Result<Option<LibDir>> {
        use std::hash::{Hash, Hasher};
        if links.is_empty() {
            return Ok(None);
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        links.hash(&mut h);
        // Relative targets name other files from another directory.
        if links.iter().any(|(_, t)| t.is_relative()) {
            std::env::current_dir().ok().hash(&mut h);
        }
        // Absolute: the program may change its directory before it loads
        // a library.
        let cache = cache_dir();
        let cache = std::path::absolute(&cache).map_err(|e| io_err(&cache, e))?;
        let dir = cache.join(format!("libs-{:016x}", h.finish()));
        let made_dir = |dir| {
            Some(LibDir {
                dir,
                exe_path_first,
                by_path: Vec::new(),
                cache_probe_before: None,
            })
        };
        if dir.is_dir() {
            return Ok(made_dir(dir));
        }
        std::fs::create_dir_all(&cache).map_err(|e| io_err(&cache, e))?;
        let tmp = cache.join(format!(
            "libs-{:016x}.tmp{}",
            h.finish(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir(&tmp).map_err(|e| io_err(&tmp, e))?;
        let made = links.iter().try_for_each(|(name, target)| {
            let link = tmp.join(name);
            let target = target.canonicalize().unwrap_or_else(|_| target.clone());
            std::os::unix::fs::symlink(&target, &link).map_err(|e| io_err(&link, e))
        });
        // Another run may have made it meanwhile: theirs is the same.
        let made = made.and_then(|()| match std::fs::rename(&tmp, &dir) {
            Err(_) if dir.is_dir() => Ok(()),
            r => r.map_err(|e| io_err(&dir, e)),
        });
        let _ = std::fs::remove_dir_all(&tmp);
        made.map(|()| made_dir(dir))
    }

    /// The directory, when a search path of the executable's own reaches
    /// every library through it ([`crate::libs::Library::exe_path_first`]),
    /// with the DT_NEEDED names the executable's copy names by their path
    /// in it ([`crate::libs::Library::by_path`]) and the one before which
    /// its loader reads its cache.
    pub(crate) fn exe_search(&self) -> Option<Search> {
        use std::os::unix::ffi::OsStrExt;
        let bytes = |n: &String| n.as_bytes().to_vec();
        (self.exe_path_first).then(|| Search {
            dir: self.dir.as_os_str().as_bytes().to_vec(),
            by_path: self.by_path.iter().map(bytes).collect(),
            cache_probe_before: self.cache_probe_before.as_ref().map(bytes),
        })
    }

    /// `LD_LIBRARY_PATH` with this directory first.
    pub(crate) fn env(&self) -> (OsString, OsString) {
        let mut v = self.dir.clone().into_os_string();
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
            v.push(":");
            v.push(old);
        }
        ("LD_LIBRARY_PATH".into(), v)
    }
}
