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
//! Invariants: the name has exactly the native path's length, or there is
//! none (a native path one byte longer than its base name, `/NAME`, has
//! no relative twin; the loader would read the working directory before
//! `init` runs, [`loader_reads_cwd`]) and the copy is exec'd by its own
//! path as before;
//! the directory and its link are removed when the value is dropped (the
//! program has exec'd by then: `posix_spawn` returns after the `execve`).

use std::ffi::{CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// A private directory with a link to the copy, and the relative path to
/// exec from it.
pub struct ExecName {
    dir: PathBuf,
    link: PathBuf,
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
        let dir = private_dir()?;
        let link = dir.join(native.file_name()?);
        let made = std::os::unix::fs::symlink(&copy, &link);
        let name = ExecName {
            dir_c: CString::new(dir.as_os_str().as_bytes()).ok()?,
            dir,
            link,
            path,
        };
        made.ok().map(|()| name)
    }
}

impl Drop for ExecName {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.link);
        let _ = std::fs::remove_dir(&self.dir);
    }
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
