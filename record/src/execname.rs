//! The name the rewritten copy is exec'd by (issue 23: the recorded
//! process's stack where the native one's is; `docs/runtime.md` section 1).
//! The kernel copies the path given to `execve` (`AT_EXECFN`) to the top
//! of the new stack, above the argument and environment strings, so the
//! copy's longer cache path moved every stack address of the program down.
//! The copy is exec'd instead by a relative path of the native path's
//! length, `.` and slashes then the native base name, from a private
//! directory holding a symlink of that name to the copy; the runtime's
//! `init` puts the process back into the recorder's working directory
//! (`FLAG_CHDIR`) before any of the program's own code runs. The kernel
//! names the process after that base name, as natively (`comm`).
//!
//! The directory is the cache's, one per copy (`names/COPY-FILE-NAME`),
//! made by the first run and kept: a run then neither makes nor removes
//! anything. Before (until 2026-11-30) each run made a private directory
//! under the temporary directory and removed it once the program had
//! exec'd; the program's `init` then dropped the last reference to it in
//! its `chdir` back, and the kernel evicted the inode there (ext4 with
//! `discard` on this VM: 0.9-23 ms, strace -T, on the program's critical
//! path). That private directory is still the fallback when the cache
//! cannot hold the link.
//!
//! The cache's `exe/` holds, per original executable, a symlink to its
//! canonical path ([`exe_link`]): the runtime gives it to the program's
//! `readlink("/proc/self/exe")` in place of that path, so the kernel
//! answers with the original's.
//!
//! Invariants: the name has exactly the native path's length, or there is
//! none (a native path one byte longer than its base name, `/NAME`, has
//! no relative twin; the loader would read the working directory before
//! `init` runs, [`loader_reads_cwd`]) and the copy is exec'd by its own
//! path as before; a kept link is used only when it names the copy's
//! canonical path; a private directory and its link are removed when the
//! value is dropped (the program has exec'd by then: `posix_spawn`
//! returns after the `execve`).

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// A directory with a link to the copy, and the relative path to exec
/// from it.
pub struct ExecName {
    /// A private directory and its link, removed on drop (`None`: the
    /// cache's, kept).
    made: Option<(PathBuf, PathBuf)>,
    /// The path to exec, relative to `dir`.
    pub path: CString,
    /// `dir`, for the spawn's `chdir`.
    pub dir_c: CString,
}

impl ExecName {
    /// The name for exec'ing `copy` where a native run execs `native`, or
    /// `None` when no name fits or the directory cannot be made.
    pub fn new(copy: &Path, native: &Path) -> Option<ExecName> {
        let path = relative_twin(native)?;
        let copy = copy.canonicalize().ok()?;
        let base = native.file_name()?;
        if let Some(dir) = kept_dir(&crate::commands::cache_dir(), &copy, base) {
            return Some(ExecName {
                dir_c: CString::new(dir.into_os_string().into_vec()).ok()?,
                made: None,
                path,
            });
        }
        let dir = private_dir()?;
        let link = dir.join(base);
        let made = std::os::unix::fs::symlink(&copy, &link);
        let name = ExecName {
            dir_c: CString::new(dir.as_os_str().as_bytes()).ok()?,
            made: Some((dir, link)),
            path,
        };
        made.ok().map(|()| name)
    }
}

impl Drop for ExecName {
    fn drop(&mut self) {
        if let Some((dir, link)) = &self.made {
            let _ = std::fs::remove_file(link);
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The directory of names for `copy` (canonical) in the cache at
/// `cache`, holding a link named `base` to it: made if missing (only this
/// user may enter it), kept for later runs. None when it cannot be made,
/// or a link of that name points elsewhere (another cache's copy of the
/// same name).
fn kept_dir(cache: &Path, copy: &Path, base: &OsStr) -> Option<PathBuf> {
    let dir = cache.join("names").join(copy.file_name()?);
    make_dir(&dir)?;
    keep_link(&dir.join(base), copy).then_some(dir)
}

/// `dir` and its parents made if missing, only this user may enter it.
fn make_dir(dir: &Path) -> Option<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .ok()
}

/// Whether `link` is a symlink to `to`, made if missing (a concurrent
/// run may make the same link first: then it is checked).
fn keep_link(link: &Path, to: &Path) -> bool {
    let _ = std::os::unix::fs::symlink(to, link);
    std::fs::read_link(link).is_ok_and(|t| t == to)
}

/// `CRC32-LENGTH` of `bytes`: a file name for a path.
fn path_name(bytes: &[u8]) -> String {
    format!("{:08x}-{}", crc32fast::hash(bytes), bytes.len())
}

/// The directory a followed exec runs `copy` (canonical) from where a
/// native run execs `native` (`docs/runtime.md` section 7, "exec"), and
/// the relative name of `native`'s length to exec there: the cache's
/// `names-exec/COPY-FILE-NAME/CRC32-LENGTH/d` of the native path, holding
/// the link named as `native`'s base name to the copy, next to `e`, a
/// link whose target is `native` itself, which the new image's `init`
/// reads into its `AT_EXECFN` string (`../e`), and `x`, a link to
/// `original` (canonical), which its `readlink` and `realpath` of its
/// own `/proc/PID/exe` are given (`../x`). A spawn's child, whose file
/// actions left descriptor `spawn_fd` open on the directory to go back
/// to, runs from `sN` (N that number) beside `d`, which also holds
/// [`SPAWN_FD`], a link whose target is N. Made if missing, kept.
/// None when no name fits, they cannot be made, or a link of their name
/// points elsewhere (a base name equal to [`SPAWN_FD`] among them).
pub fn followed(
    cache: &Path,
    copy: &Path,
    original: &Path,
    native: &[u8],
    spawn_fd: Option<u32>,
) -> Option<(PathBuf, CString)> {
    let native = Path::new(OsStr::from_bytes(native));
    let twin = relative_twin(native)?;
    let top = (cache.join("names-exec").join(copy.file_name()?))
        .join(path_name(native.as_os_str().as_bytes()));
    let fd = spawn_fd.map(|n| n.to_string());
    let dir = top.join(fd.as_ref().map_or("d".into(), |n| format!("s{n}")));
    make_dir(&dir)?;
    let mut links = vec![
        (top.join("e"), native),
        (top.join("x"), original),
        (dir.join(native.file_name()?), copy),
    ];
    links.extend(fd.as_ref().map(|n| (dir.join(SPAWN_FD), Path::new(n))));
    let kept = links.iter().all(|(link, to)| keep_link(link, to));
    kept.then_some((dir, twin))
}

/// The link in a spawn's directory of names whose target is the number of
/// the descriptor the child goes back through (the runtime's
/// `exe::spawn_fd` reads it).
pub const SPAWN_FD: &str = ".aetrace-fd";

/// A symlink to `original` (canonical) in the cache at `cache`, which the
/// program's `readlink` and `realpath` of its own `/proc/PID/exe` are
/// given, so that the kernel answers with the original's path
/// (`docs/runtime.md` section 5, "The executable's names"):
/// `exe/CRC-LENGTH` of the path, made if missing, kept. None when it
/// cannot be made or a link of that name points elsewhere.
pub fn exe_link(cache: &Path, original: &Path) -> Option<PathBuf> {
    let dir = cache.join("exe");
    make_dir(&dir)?;
    let link = dir.join(path_name(original.as_os_str().as_bytes()));
    keep_link(&link, original).then_some(link)
}

/// Whether the loader, which runs before `init` puts the working
/// directory back, would search it: a relative or empty directory in a
/// non-empty `LD_LIBRARY_PATH`, or a relative path with a slash in
/// `LD_PRELOAD` or `LD_AUDIT` (a bare name is searched as a library) of
/// `env`.
pub fn loader_reads_cwd(env: &[(Vec<u8>, Vec<u8>)]) -> bool {
    let relative = |e: &[u8]| !e.starts_with(b"/");
    env.iter().any(|(k, v)| match k.as_slice() {
        b"LD_LIBRARY_PATH" => !v.is_empty() && v.split(|&b| b == b':' || b == b';').any(relative),
        b"LD_PRELOAD" | b"LD_AUDIT" => v
            .split(|&b| b == b':' || b == b' ')
            .any(|e| e.contains(&b'/') && relative(e)),
        _ => false,
    })
}

/// `.` and slashes, then `native`'s base name, as long as `native`.
fn relative_twin(native: &Path) -> Option<CString> {
    let base = native.file_name()?.as_bytes();
    let len = native.as_os_str().len();
    let mut path = match len.checked_sub(base.len())? {
        0 => Vec::new(),
        1 => return None,
        pad => [&b"."[..], &vec![b'/'; pad - 1]].concat(),
    };
    path.extend_from_slice(base);
    CString::new(path).ok()
}

/// A new directory only this user can enter, under the temporary directory.
fn private_dir() -> Option<PathBuf> {
    let mut template = std::env::temp_dir()
        .join("aetrace-exec-XXXXXX")
        .into_os_string()
        .into_vec();
    template.push(0);
    // SAFETY: a NUL-terminated, writable template, as mkdtemp wants.
    let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    if made.is_null() {
        return None;
    }
    template.pop();
    Some(PathBuf::from(OsString::from_vec(template)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relative_twin_has_the_native_length_and_base_name() {
        for native in ["/usr/bin/tclsh8.6", "./layout", "layout", "a/b"] {
            let twin = relative_twin(Path::new(native)).unwrap();
            let twin = twin.to_str().unwrap();
            assert_eq!(twin.len(), native.len(), "{native} -> {twin}");
            assert!(twin.ends_with(Path::new(native).file_name().unwrap().to_str().unwrap()));
            assert!(!twin.starts_with('/'));
        }
        assert!(relative_twin(Path::new("/true")).is_none());
    }

    #[test]
    fn a_kept_name_is_made_once_reused_and_never_points_elsewhere() {
        let root = std::env::temp_dir().join(format!("aetrace-kept-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (a, b) = (root.join("a/prog-1234"), root.join("b/prog-1234"));
        let cache = root.join("cache");
        let base = OsStr::new("prog");
        let dir = kept_dir(&cache, &a, base).unwrap();
        assert_eq!(std::fs::read_link(dir.join("prog")).unwrap(), a);
        assert_eq!(kept_dir(&cache, &a, base), Some(dir.clone()));
        // Another copy of the same file name: not this link.
        assert_eq!(kept_dir(&cache, &b, base), None);
        assert_eq!(std::fs::read_link(dir.join("prog")).unwrap(), a);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_followed_exec_directory_holds_the_native_path_and_the_copy() {
        let root = std::env::temp_dir().join(format!("aetrace-fol-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let copy = Path::new("/usr/bin/true");
        let (dir, twin) = followed(&root, copy, copy, b"./tools/exename", None).unwrap();
        assert_eq!(twin.as_bytes(), b".///////exename");
        assert_eq!(std::fs::read_link(dir.join("exename")).unwrap(), copy);
        let e = std::fs::read_link(dir.join("../e")).unwrap();
        assert_eq!(e.as_os_str().as_bytes(), b"./tools/exename");
        assert_eq!(std::fs::read_link(dir.join("../x")).unwrap(), copy);
        assert_eq!(
            followed(&root, copy, copy, b"./tools/exename", None)
                .unwrap()
                .0,
            dir
        );
        // A spawn's: beside it, with the descriptor's number.
        let (s7, twin7) = followed(&root, copy, copy, b"./tools/exename", Some(7)).unwrap();
        assert_eq!((s7.parent(), twin7), (dir.parent(), twin));
        assert_eq!(
            std::fs::read_link(s7.join(SPAWN_FD)).unwrap(),
            Path::new("7")
        );
        assert_eq!(std::fs::read_link(s7.join("exename")).unwrap(), copy);
        assert!(followed(&root, copy, copy, b"./tools/.aetrace-fd", Some(7)).is_none());
        // Another copy of the same file name: not these links.
        let other = Path::new("/bin/true");
        assert!(followed(&root, other, copy, b"./tools/exename", None).is_none());
        assert!(followed(&root, copy, copy, b"/true", None).is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_exe_link_names_the_original_and_is_kept() {
        let root = std::env::temp_dir().join(format!("aetrace-exe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let original = Path::new("/usr/bin/true");
        let link = exe_link(&root, original).unwrap();
        assert_eq!(std::fs::read_link(&link).unwrap(), original);
        assert_eq!(exe_link(&root, original), Some(link.clone()));
        // A link of that name pointing elsewhere is not used.
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink("/usr/bin/false", &link).unwrap();
        assert_eq!(exe_link(&root, original), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn relative_or_empty_loader_paths_read_the_working_directory() {
        let var = |k: &str, v: &str| vec![(k.as_bytes().to_vec(), v.as_bytes().to_vec())];
        assert!(!loader_reads_cwd(&var("LD_LIBRARY_PATH", "/a:/b")));
        assert!(!loader_reads_cwd(&var("PATH", ".:bin")));
        assert!(loader_reads_cwd(&var("LD_LIBRARY_PATH", "/a::/b")));
        assert!(!loader_reads_cwd(&var("LD_LIBRARY_PATH", "")));
        assert!(loader_reads_cwd(&var("LD_LIBRARY_PATH", "lib")));
        assert!(loader_reads_cwd(&var("LD_PRELOAD", "lib/x.so")));
        assert!(!loader_reads_cwd(&var("LD_PRELOAD", "libx.so /a/y.so")));
    }
}
