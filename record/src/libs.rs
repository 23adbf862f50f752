//! Finding the shared libraries `aetrace record --libs` instruments, as the
//! dynamic loader would find them (glibc `ld.so(8)`, "search order"): the
//! DT_NEEDED closure of the executable, breadth first; for each name
//! without a slash, the loading object's DT_RPATH (and its loaders', only
//! when it has no DT_RUNPATH), `LD_LIBRARY_PATH`, its DT_RUNPATH,
//! `/etc/ld.so.cache`, then the default directories. `$ORIGIN` (also
//! `${ORIGIN}`) is the loading object's directory.
//!
//! Invariants: a library is identified by the DT_NEEDED name that loaded it
//! first (what the loader matches later requests against), each is
//! resolved once, and a candidate is accepted only if it is a 64-bit
//! x86-64 ELF (the loader skips others too). The rewritten copies'
//! directory is put first in the rewritten executable's own DT_RUNPATH or
//! DT_RPATH where that reaches every library it must
//! ([`Selection::exe_path_first`]), else first in `LD_LIBRARY_PATH`; either
//! way a selected library that the loader finds through another object's
//! DT_RPATH (which precedes both) is refused: the rewritten copy would not
//! be the one loaded.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};

use crate::error::LibError;
use crate::{Error, Result};

/// Which libraries `--libs` selects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LibSelection {
    /// Only the executable.
    None,
    /// Every library of the DT_NEEDED closure except those of glibc's
    /// that [`GlibcPolicy`] refuses (the loader always), which are left
    /// alone with a note.
    All,
    /// These DT_NEEDED names (e.g. `libbz2.so.1.0`) or file names.
    Named(Vec<String>),
}

impl LibSelection {
    /// Parses `none`, `all` or `NAME,NAME,...`.
    pub fn parse(s: &str) -> Result<LibSelection> {
        match s {
            "none" => Ok(LibSelection::None),
            "all" => Ok(LibSelection::All),
            _ => {
                let names: Vec<String> = s.split(',').map(str::to_owned).collect();
                if names.iter().any(|n| n.is_empty()) {
                    return Err(LibError::EmptyName(s.to_owned()).into());
                }
                Ok(LibSelection::Named(names))
            }
        }
    }
}

/// A library of the executable's DT_NEEDED closure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Library {
    /// The DT_NEEDED name that loaded it (the loader's key; the name of
    /// its symlink in the per-run directory).
    pub needed: String,
    /// Where the loader finds it today.
    pub path: PathBuf,
    /// Found through a DT_RPATH, which `LD_LIBRARY_PATH` cannot override.
    pub via_rpath: bool,
    /// A directory put first in the executable's own search path (its
    /// DT_RUNPATH when it has one, else its DT_RPATH) is searched before
    /// the place this library was found: the first object to ask for it
    /// is the executable, or (without an executable DT_RUNPATH) one
    /// without DT_RUNPATH, whose search ends with the executable's DT_RPATH
    /// (glibc `_dl_map_object`), and it was not found earlier; or the
    /// copy is named by path ([`Library::by_path`]).
    pub exe_path_first: bool,
    /// The executable (with DT_RUNPATH) needs it itself and the native
    /// `LD_LIBRARY_PATH`, searched before DT_RUNPATH, finds it: the
    /// executable's copy names the rewritten copy by its path in the
    /// directory instead of by name (its DT_NEEDED), which the loader
    /// opens without a search. Only when its DT_SONAME is that name: later
    /// requests for the name then match the loaded copy, as they match
    /// the name natively.
    pub by_path: bool,
    /// The executable asks for it and the native search for it reads
    /// `/etc/ld.so.cache` (no search path before the cache finds it):
    /// ld.so maps the cache at the first such search and keeps it mapped
    /// until start-up ends.
    pub reads_cache: bool,
    /// Found in a directory relative to this object's `$ORIGIN`: once that
    /// object is a rewritten copy elsewhere, its `$ORIGIN` moves.
    pub origin: Option<PathBuf>,
    /// Not in the DT_NEEDED closure: named with `--libs` as the program
    /// opens it with `dlopen`.
    pub dlopened: bool,
}

/// The dynamic loader (`ld-linux-x86-64.so.2`): it relocates and
/// initialises everything before any runtime exists, so it is never
/// traced.
pub fn is_loader(needed: &str) -> bool {
    needed.starts_with("ld-linux")
}

/// glibc's own objects: the loader and the libraries that define the
/// thread starters. Counting leaves them all alone; recording traces them
/// but the loader ([`GlibcPolicy`]).
/// What of libc.so.6 runs before the executable's runtime init (IFUNC
/// resolvers, `__libc_early_init`, with everything they call) the
/// rewriter leaves alone (`docs/rewrite.md`, "glibc's libc.so.6").
pub fn is_glibc(needed: &str) -> bool {
    let stem = needed.split(".so").next().unwrap_or(needed);
    is_loader(needed)
        || matches!(
            stem,
            "libc"
                | "libm"
                | "libpthread"
                | "libdl"
                | "librt"
                | "libresolv"
                | "libutil"
                | "libanl"
                | "libmvec"
                | "libnsl"
                | "libBrokenLocale"
                | "libthread_db"
        )
}

/// Which of glibc's objects ([`is_glibc`]) `--libs` may select.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlibcPolicy {
    /// Every one but the loader (recording).
    AllButLoader,
    /// None, and why: counting (its counters are not set up before
    /// ld.so runs glibc's early code).
    Refused(&'static str),
}

impl GlibcPolicy {
    /// Why glibc's object `needed` cannot be selected, if it cannot.
    fn refuses(self, needed: &str) -> Option<&'static str> {
        if is_loader(needed) {
            return Some("the dynamic loader runs before the runtime's init");
        }
        match self {
            GlibcPolicy::Refused(why) if is_glibc(needed) => Some(why),
            _ => None,
        }
    }
}

/// DT_RPATH directories with the `$ORIGIN` they expand against, nearest
/// loader first.
type RpathChain = Vec<(PathBuf, Vec<String>)>;

/// The DT_NEEDED closure of `exe`, in the loader's breadth-first order.
pub fn closure(exe: &Path) -> Result<Vec<Library>> {
    let cache = LdCache::load();
    let exe_runpath = !DynInfo::read(exe)?.runpath.is_empty();
    let ld_library_path: Vec<String> = std::env::var("LD_LIBRARY_PATH")
        .map(|v| split_path(&v))
        .unwrap_or_default();
    let mut seen: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    // (object, the DT_RPATH chain of its loaders when it has no RUNPATH)
    let mut queue: VecDeque<(PathBuf, RpathChain)> = VecDeque::new();
    queue.push_back((exe.to_owned(), Vec::new()));
    while let Some((obj, loaders_rpath)) = queue.pop_front() {
        let info = DynInfo::read(&obj)?;
        let origin = obj.parent().map(Path::to_owned).unwrap_or_default();
        let mut rpaths = Vec::new();
        if info.runpath.is_empty() {
            rpaths.push((origin.clone(), info.rpath.clone()));
            rpaths.extend(loaders_rpath.iter().cloned());
        }
        for needed in &info.needed {
            if !seen.insert(needed.clone()) {
                continue;
            }
            let found = if needed.contains('/') {
                Some((PathBuf::from(needed), Via::Path, None))
            } else {
                search(
                    needed,
                    &rpaths,
                    &ld_library_path,
                    (&origin, &info.runpath),
                    &cache,
                )
            };
            let Some((path, via, origin_dir)) = found else {
                return Err(LibError::NotFound {
                    object: obj.to_owned(),
                    needed: needed.to_owned(),
                }
                .into());
            };
            let chain = if info.runpath.is_empty() {
                rpaths.clone()
            } else {
                Vec::new()
            };
            queue.push_back((path.clone(), chain));
            // Whose `$ORIGIN` found it (an RPATH may be a loader's).
            let origin = origin_dir.and_then(|d| {
                std::iter::once(&obj)
                    .chain(out.iter().map(|l: &Library| &l.path))
                    .find(|o| o.parent() == Some(d.as_path()))
                    .cloned()
            });
            let by_exe = obj == exe;
            let by_path = exe_runpath
                && by_exe
                && via == Via::LdLibraryPath
                && DynInfo::read(&path)?.soname.as_ref() == Some(needed);
            let exe_path_first = if exe_runpath {
                by_exe && (via.after_runpath_starts() || by_path)
            } else {
                info.runpath.is_empty() && (via != Via::Rpath || by_exe)
            };
            out.push(Library {
                needed: needed.clone(),
                path,
                via_rpath: via == Via::Rpath,
                exe_path_first,
                by_path,
                reads_cache: by_exe && via == Via::Cache,
                origin,
                dlopened: false,
            });
        }
    }
    Ok(out)
}

/// What `--libs` resolves to.
#[derive(Debug, Default)]
pub struct Selection {
    /// The libraries to rewrite, in module-tag order (tag = index + 1).
    pub traced: Vec<Library>,
    /// Untraced libraries found relative to the `$ORIGIN` of the
    /// executable or of a traced library: the rewritten copies live
    /// elsewhere, so these are linked into the per-run directory too
    /// (the same files under the same names: what the loader would load).
    pub origin_relative: Vec<Library>,
    /// Libraries skipped by `all`, and why.
    pub notes: Vec<String>,
    /// Every library of `traced` and `origin_relative` is found first in
    /// a directory put first in the executable's own search path
    /// ([`Library::exe_path_first`]): no environment variable is needed.
    pub exe_path_first: bool,
    /// The DT_NEEDED names the executable's copy names by their path in
    /// the directory ([`Library::by_path`]).
    pub by_path: Vec<String>,
    /// The library at whose search the native loader first reads its
    /// cache ([`Library::reads_cache`]), when it is linked in the
    /// directory, whose copy is found without reading it: the
    /// executable's copy has the loader read the cache there all the same
    /// (`rewrite::elfout::SearchFirst::cache_probe_before`).
    pub cache_probe_before: Option<String>,
}

/// The libraries of `exe`'s closure that `sel` names; glibc's that
/// `glibc` refuses, named explicitly, are refused; with `All` they are
/// skipped and described in the notes.
pub fn select(exe: &Path, sel: &LibSelection, glibc: GlibcPolicy) -> Result<Selection> {
    // With nothing to trace, only libraries found through the executable's
    // `$ORIGIN` need links: without `$ORIGIN` in its search paths there is
    // nothing to resolve (about 0.2 ms of every `--libs none` run).
    if *sel == LibSelection::None && DynInfo::read(exe).is_ok_and(|i| !i.names_origin()) {
        return Ok(Selection::default());
    }
    let all = match closure(exe) {
        Ok(all) => all,
        // Without libraries to trace a search failure is the loader's to
        // report, exactly as in a native run.
        Err(_) if *sel == LibSelection::None => return Ok(Selection::default()),
        Err(e) => return Err(e),
    };
    let (chosen, notes) = choose(exe, &all, sel, glibc)?;
    let rewritten: Vec<&Path> = std::iter::once(exe)
        .chain(chosen.iter().map(|l| l.path.as_path()))
        .collect();
    // The executable's names come first in the loader's breadth-first
    // order, so the first of them that reads the cache is the first
    // search that does.
    let first_cache_read = all.iter().find(|l| l.reads_cache).cloned();
    // A dlopened library's own dependencies are not in the executable's
    // closure; those it finds through its `$ORIGIN` must be linked too.
    let mut all = all;
    for l in chosen
        .iter()
        .filter(|l| !all.contains(l))
        .cloned()
        .collect::<Vec<_>>()
    {
        for dep in closure(&l.path)? {
            if !all.iter().any(|a| a.needed == dep.needed) {
                all.push(dep);
            }
        }
    }
    let origin_relative = all
        .iter()
        .filter(|l| !chosen.contains(l))
        .filter(|l| l.origin.as_deref().is_some_and(|o| rewritten.contains(&o)))
        .cloned()
        .collect();
    let linked = || chosen.iter().chain(&origin_relative);
    let exe_path_first = linked().all(|l| l.exe_path_first);
    let by_path = (linked().filter(|l| l.by_path))
        .map(|l| l.needed.clone())
        .collect();
    let cache_probe_before = first_cache_read
        .filter(|first| linked().any(|l| l.needed == first.needed))
        .map(|l| l.needed.clone());
    Ok(Selection {
        exe_path_first,
        by_path,
        cache_probe_before,
        traced: chosen,
        origin_relative,
        notes,
    })
}

fn choose(
    exe: &Path,
    all: &[Library],
    sel: &LibSelection,
    glibc: GlibcPolicy,
) -> Result<(Vec<Library>, Vec<String>)> {
    let names = match sel {
        LibSelection::None => return Ok((Vec::new(), Vec::new())),
        LibSelection::All => None,
        LibSelection::Named(n) => Some(n),
    };
    let mut chosen = Vec::new();
    let mut notes = Vec::new();
    match names {
        None => {
            for l in all.iter().cloned() {
                if let Some(why) = glibc.refuses(&l.needed) {
                    notes.push(format!("library {} left alone: {why}", l.needed));
                } else {
                    chosen.push(l);
                }
            }
        }
        Some(names) => {
            for n in names {
                let found = all.iter().find(|l| {
                    &l.needed == n || l.path.file_name().is_some_and(|f| f == n.as_str())
                });
                let dlopened;
                let l = match found {
                    Some(l) => l,
                    None => {
                        dlopened = dlopen_library(exe, n, all)?;
                        &dlopened
                    }
                };
                if let Some(why) = glibc.refuses(&l.needed) {
                    return Err(LibError::Glibc(n.to_owned(), why).into());
                }
                if !chosen.contains(l) {
                    chosen.push(l.clone());
                }
            }
        }
    }
    if let Some(l) = chosen.iter().find(|l| l.via_rpath) {
        return Err(LibError::ViaRpath {
            needed: l.needed.clone(),
            path: l.path.clone(),
        }
        .into());
    }
    Ok((chosen, notes))
}

/// A `--libs` name outside the DT_NEEDED closure: a library the program
/// loads with `dlopen(name)`, found as ld.so finds a name without a slash
/// for a `dlopen` called from the executable (its DT_RPATH when it has no
/// DT_RUNPATH, `LD_LIBRARY_PATH`, its DT_RUNPATH, the cache, the default
/// directories). The loader is asked for `name` at run time and finds the
/// per-run directory's link of that name first. A path is refused: a
/// `dlopen` of a path does not search, so no copy can be substituted.
fn dlopen_library(exe: &Path, name: &str, all: &[Library]) -> Result<Library> {
    let listed = || {
        all.iter()
            .map(|l| l.needed.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if name.contains('/') {
        return Err(LibError::DlopenPath {
            name: name.to_owned(),
            exe: exe.to_owned(),
            listed: listed(),
        }
        .into());
    }
    let info = DynInfo::read(exe)?;
    let origin = exe.parent().map(Path::to_owned).unwrap_or_default();
    let rpaths = if info.runpath.is_empty() {
        vec![(origin.clone(), info.rpath.clone())]
    } else {
        Vec::new()
    };
    let ld_library_path: Vec<String> = std::env::var("LD_LIBRARY_PATH")
        .map(|v| split_path(&v))
        .unwrap_or_default();
    let cache = LdCache::load();
    let (path, via, origin_dir) = search(
        name,
        &rpaths,
        &ld_library_path,
        (&origin, &info.runpath),
        &cache,
    )
    .ok_or_else(|| {
        Error::from(LibError::DlopenNotFound {
            name: name.to_owned(),
            exe: exe.to_owned(),
            listed: listed(),
        })
    })?;
    Ok(Library {
        needed: name.to_owned(),
        path,
        via_rpath: via == Via::Rpath,
        // Asked for by the executable, if it calls `dlopen` itself.
        exe_path_first: info.runpath.is_empty() || via.after_runpath_starts(),
        by_path: false,
        reads_cache: false,
        origin: origin_dir.map(|_| exe.to_owned()),
        dlopened: true,
    })
}

fn split_path(v: &str) -> Vec<String> {
    // An empty element means the current directory to ld.so.
    v.split([':', ';'])
        .map(|s| {
            if s.is_empty() {
                ".".into()
            } else {
                s.to_owned()
            }
        })
        .collect()
}

fn expand(dir: &str, origin: &Path) -> PathBuf {
    let o = origin.to_string_lossy();
    PathBuf::from(dir.replace("${ORIGIN}", &o).replace("$ORIGIN", &o))
}

/// Which part of the search found a library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    /// A DT_RPATH.
    Rpath,
    /// `LD_LIBRARY_PATH`.
    LdLibraryPath,
    /// DT_RUNPATH.
    Runpath,
    /// The cache or a default directory: the search read the cache.
    Cache,
    /// A name with a slash: no search.
    Path,
}

impl Via {
    /// Found by DT_RUNPATH or later: a directory put first in the
    /// executable's DT_RUNPATH is searched before.
    fn after_runpath_starts(self) -> bool {
        matches!(self, Via::Runpath | Via::Cache | Via::Path)
    }
}

/// `(path, what found it, the $ORIGIN directory the directory that found
/// it was relative to)`.
type Found = (PathBuf, Via, Option<PathBuf>);

/// The search for one name.
fn search(
    name: &str,
    rpaths: &[(PathBuf, Vec<String>)],
    ld_library_path: &[String],
    runpath: (&Path, &[String]),
    cache: &LdCache,
) -> Option<Found> {
    let try_dir = |d: PathBuf| Some(d.join(name)).filter(|p| is_x86_64_elf(p));
    let origin_of = |d: &str, o: &Path| d.contains("ORIGIN").then(|| o.to_owned());
    for (origin, dirs) in rpaths {
        for d in dirs {
            if let Some(p) = try_dir(expand(d, origin)) {
                return Some((p, Via::Rpath, origin_of(d, origin)));
            }
        }
    }
    let here = PathBuf::from(".");
    for d in ld_library_path {
        if let Some(p) = try_dir(expand(d, &here)) {
            return Some((p, Via::LdLibraryPath, None));
        }
    }
    for d in runpath.1 {
        if let Some(p) = try_dir(expand(d, runpath.0)) {
            return Some((p, Via::Runpath, origin_of(d, runpath.0)));
        }
    }
    if let Some(p) = cache.lookup(name).filter(|p| is_x86_64_elf(p)) {
        return Some((p, Via::Cache, None));
    }
    [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib64",
        "/usr/lib64",
        "/lib",
        "/usr/lib",
    ]
    .into_iter()
    .find_map(|d| try_dir(PathBuf::from(d)))
    .map(|p| (p, Via::Cache, None))
}

fn is_x86_64_elf(p: &Path) -> bool {
    use std::io::Read;
    let mut h = [0u8; 20];
    std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut h))
        .is_ok()
        && h[..4] == *b"\x7fELF"
        && h[4] == 2
        && h[5] == 1
        && u16::from_le_bytes([h[18], h[19]]) == goblin::elf::header::EM_X86_64
}

/// The dynamic-section facts the search needs.
struct DynInfo {
    needed: Vec<String>,
    rpath: Vec<String>,
    runpath: Vec<String>,
    soname: Option<String>,
}

impl DynInfo {
    /// `$ORIGIN` (or `${ORIGIN}`) in DT_RPATH or DT_RUNPATH.
    fn names_origin(&self) -> bool {
        self.rpath
            .iter()
            .chain(&self.runpath)
            .any(|d| d.contains("ORIGIN"))
    }

    /// Parses only the ELF header, the program headers and the dynamic
    /// section with its string table, from a read-only mapping: a library
    /// is megabytes (libc 1.9 MB), of which this touches a few pages. The
    /// recorder resolves the whole closure on every run, even `--libs none`.
    fn read(path: &Path) -> Result<DynInfo> {
        use goblin::elf::dynamic::Dynamic;
        let file = std::fs::File::open(path).map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
        // SAFETY: a private read-only mapping; goblin bounds-checks every read.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
        let bytes: &[u8] = &map;
        let malformed = |e: goblin::error::Error| {
            Error::Analysis(aetrace_analysis::Error::Malformed {
                path: path.to_owned(),
                what: format!("dynamic section: {e}"),
            })
        };
        let (elf, ctx) = headers_only(bytes).map_err(malformed)?;
        let phdrs = elf.program_headers;
        let mut info = DynInfo {
            needed: Vec::new(),
            rpath: Vec::new(),
            runpath: Vec::new(),
            soname: None,
        };
        let Some(dynamic) = Dynamic::parse(bytes, &phdrs, ctx).map_err(malformed)? else {
            return Ok(info);
        };
        // Only the few strings the dynamic entries name are read (goblin's
        // `Strtab::parse` would validate all of libc's 25 kB).
        let strtab = bytes
            .get(dynamic.info.strtab..)
            .and_then(|t| t.get(..dynamic.info.strsz))
            .ok_or_else(|| {
                Error::Analysis(aetrace_analysis::Error::Malformed {
                    path: path.to_owned(),
                    what: format!(
                        "dynamic section: string table at {:#x} ({} bytes) outside the file",
                        dynamic.info.strtab, dynamic.info.strsz
                    ),
                })
            })?;
        let string = |d: &goblin::elf::dynamic::Dyn| {
            usize::try_from(d.d_val)
                .ok()
                .and_then(|at| strtab.get(at..))
                .and_then(|t| t.iter().position(|&b| b == 0).map(|n| &t[..n]))
                .and_then(|t| std::str::from_utf8(t).ok())
                .ok_or_else(|| Error::Analysis(aetrace_analysis::Error::Malformed {
                    path: path.to_owned(),
                    what: format!(
                        "dynamic section: tag {:#x} names string {:#x}, not a NUL-terminated UTF-8 string of its string table",
                        d.d_tag, d.d_val
                    ),
                }))
        };
        use goblin::elf::dynamic::{DT_NEEDED, DT_RPATH, DT_RUNPATH, DT_SONAME};
        for d in &dynamic.dyns {
            match d.d_tag {
                DT_NEEDED => info.needed.push(string(d)?.to_owned()),
                DT_SONAME => info.soname = Some(string(d)?.to_owned()),
                DT_RPATH => info.rpath.extend(split_path(string(d)?)),
                DT_RUNPATH => info.runpath.extend(split_path(string(d)?)),
                _ => {}
            }
        }
        Ok(info)
    }
}

/// The ELF header and program headers of `bytes` (nothing else parsed),
/// with the container context to parse more.
pub(crate) fn headers_only(
    bytes: &[u8],
) -> goblin::error::Result<(goblin::elf::Elf<'_>, goblin::container::Ctx)> {
    use goblin::container::{Container, Ctx, Endian};
    use goblin::elf::{program_header::ProgramHeader, Elf};
    let header = Elf::parse_header(bytes)?;
    let mut elf = Elf::lazy_parse(header)?;
    let container = if elf.is_64 {
        Container::Big
    } else {
        Container::Little
    };
    let ctx = Ctx::new(container, Endian::from(elf.little_endian));
    elf.program_headers =
        ProgramHeader::parse(bytes, header.e_phoff as usize, header.e_phnum as usize, ctx)?;
    Ok((elf, ctx))
}

/// `/etc/ld.so.cache` in glibc's format 1.1 (`glibc-ld.so.cache1.1`: a
/// 48-byte header, 24-byte entries whose key and value are offsets of
/// NUL-terminated strings from the file start). An absent or unreadable
/// cache is empty, as for ld.so.
struct LdCache {
    bytes: Vec<u8>,
}

impl LdCache {
    const MAGIC: &'static [u8] = b"glibc-ld.so.cache1.1";
    /// FLAG_ELF_LIBC6 | FLAG_X8664_LIB64.
    const X86_64_LIBC6: i32 = 0x0303;

    fn load() -> LdCache {
        let bytes = std::fs::read("/etc/ld.so.cache").unwrap_or_default();
        LdCache {
            bytes: if bytes.starts_with(Self::MAGIC) {
                bytes
            } else {
                Vec::new()
            },
        }
    }

    fn u32_at(&self, o: usize) -> Option<u32> {
        Some(u32::from_le_bytes(
            self.bytes.get(o..o + 4)?.try_into().ok()?,
        ))
    }

    fn str_at(&self, o: usize) -> Option<&str> {
        let rest = self.bytes.get(o..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&rest[..end]).ok()
    }

    fn lookup(&self, name: &str) -> Option<PathBuf> {
        let n = self.u32_at(20)? as usize;
        (0..n).find_map(|i| {
            let e = 48 + 24 * i;
            let flags = self.u32_at(e)? as i32;
            if flags != Self::X86_64_LIBC6 {
                return None;
            }
            (self.str_at(self.u32_at(e + 4)? as usize)? == name)
                .then(|| self.str_at(self.u32_at(e + 8)? as usize).map(PathBuf::from))
                .flatten()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_parses() {
        assert_eq!(LibSelection::parse("none").unwrap(), LibSelection::None);
        assert_eq!(LibSelection::parse("all").unwrap(), LibSelection::All);
        assert_eq!(
            LibSelection::parse("a.so.1,b.so").unwrap(),
            LibSelection::Named(vec!["a.so.1".into(), "b.so".into()])
        );
        assert!(LibSelection::parse("a.so,").is_err());
    }

    #[test]
    fn glibc_is_recognised() {
        for n in [
            "libc.so.6",
            "ld-linux-x86-64.so.2",
            "libm.so.6",
            "libpthread.so.0",
        ] {
            assert!(is_glibc(n), "{n}");
        }
        for n in [
            "libbz2.so.1.0",
            "liblzma.so.5",
            "libcrypt.so.2",
            "libcore.so",
        ] {
            assert!(!is_glibc(n), "{n}");
        }
        let refused = GlibcPolicy::Refused("why");
        assert_eq!(refused.refuses("libc.so.6"), Some("why"));
        assert_eq!(GlibcPolicy::AllButLoader.refuses("libc.so.6"), None);
        assert_eq!(GlibcPolicy::AllButLoader.refuses("libbz2.so.1.0"), None);
        assert!(GlibcPolicy::AllButLoader
            .refuses("ld-linux-x86-64.so.2")
            .is_some());
    }

    /// The cache agrees with `ldconfig -p` on the machine's libc (both are
    /// the loader's view; ldconfig is an independent reader).
    #[test]
    fn ld_cache_finds_libc_like_ldconfig() {
        let Ok(out) = std::process::Command::new("/sbin/ldconfig")
            .arg("-p")
            .output()
        else {
            return;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("libc.so.6 (libc6,x86-64)"))
            .expect("ldconfig -p lists libc.so.6");
        let want = line.rsplit("=> ").next().unwrap().trim();
        assert_eq!(
            LdCache::load().lookup("libc.so.6"),
            Some(PathBuf::from(want))
        );
    }
}
