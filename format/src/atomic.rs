//! Output files written whole or not at all: the bytes go to a temporary
//! sibling (`.NAME.partialPID`, same directory, so the rename stays on one
//! file system) that is renamed over `path` once complete.
//!
//! Invariants: a reader never sees a half-written file at `path`, and no
//! process has it open for writing once it is there (the temporary is
//! closed before the rename: `execve` of a file open for writing fails
//! with ETXTBSY, and a second recorder may exec a cached copy the moment
//! it appears); a failed or abandoned write leaves no temporary behind; a `path` that is not
//! [`replaceable`](crate::replaceable) (a device such as `/dev/null`, a
//! pipe) is written in place and never unlinked or renamed over.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A file that could not be written, created or renamed.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct Error {
    /// The file the failing call was about (the temporary or `path`).
    pub path: PathBuf,
    /// What the system reported.
    pub source: std::io::Error,
}

/// Mode of an executable output (`chmod 755`, not masked by the umask).
pub const EXECUTABLE: Option<u32> = Some(0o755);

/// Writes `bytes` to `path` through a temporary; `mode`, when given, is set
/// on it exactly (otherwise the usual creation mode under the umask).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: Option<u32>) -> Result<(), Error> {
    let mut f = AtomicFile::create(path, mode)?;
    f.write_all(bytes).map_err(|e| f.error(e))?;
    f.commit()
}

/// A streamed output: written through [`Write`], renamed into place by
/// [`commit`](AtomicFile::commit), removed when dropped uncommitted.
pub struct AtomicFile {
    /// Open until [`commit`](AtomicFile::commit) closes it.
    file: Option<File>,
    path: PathBuf,
    /// The temporary, until renamed; `None` when writing in place.
    tmp: Option<PathBuf>,
}

impl AtomicFile {
    /// Starts writing `path` (see [`write_atomic`] for `mode`).
    pub fn create(path: &Path, mode: Option<u32>) -> Result<AtomicFile, Error> {
        let err = |path: &Path| {
            let path = path.to_owned();
            move |source| Error { path, source }
        };
        if !crate::replaceable(path) {
            let file = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(err(path))?;
            return Ok(AtomicFile {
                file: Some(file),
                path: path.to_owned(),
                tmp: None,
            });
        }
        let name = path
            .file_name()
            .map_or_else(|| "out".into(), |n| n.to_string_lossy());
        let tmp = path.with_file_name(format!(".{name}.partial{}", std::process::id()));
        let file = File::create(&tmp).map_err(err(&tmp))?;
        let out = AtomicFile {
            file: Some(file),
            path: path.to_owned(),
            tmp: Some(tmp),
        };
        if let Some(m) = mode {
            out.file()
                .set_permissions(std::fs::Permissions::from_mode(m))
                .map_err(|e| out.error(e))?;
        }
        Ok(out)
    }

    /// Flushes the temporary to the disk (before a [`commit`] that must
    /// survive a crash); nothing for a file written in place (a pipe cannot
    /// be synced).
    ///
    /// [`commit`]: AtomicFile::commit
    pub fn sync_all(&self) -> Result<(), Error> {
        match self.tmp {
            Some(_) => self.file().sync_all().map_err(|e| self.error(e)),
            None => Ok(()),
        }
    }

    /// Closes the finished file and renames it over `path`.
    pub fn commit(mut self) -> Result<(), Error> {
        drop(self.file.take());
        match self.tmp.take() {
            Some(tmp) => std::fs::rename(&tmp, &self.path).map_err(|source| {
                let _ = std::fs::remove_file(&tmp);
                Error {
                    path: self.path.clone(),
                    source,
                }
            }),
            None => Ok(()),
        }
    }

    /// The file being written (`commit` consumes the value, so it is
    /// always open here).
    pub fn file(&self) -> &File {
        self.file.as_ref().expect("open until commit")
    }

    /// `e` as an error about the file being written.
    pub fn error(&self, source: std::io::Error) -> Error {
        Error {
            path: self.tmp.as_ref().unwrap_or(&self.path).clone(),
            source,
        }
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut f = self.file();
        f.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let mut f = self.file();
        f.flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if let Some(tmp) = &self.tmp {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("aetrace-atomic-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn entries(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn written_whole_with_its_mode_and_nothing_left_over() {
        let d = scratch("whole");
        let p = d.join("prog");
        write_atomic(&p, b"abc", EXECUTABLE).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"abc");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        write_atomic(&p, b"de", None).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"de");
        assert_eq!(entries(&d), ["prog"]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn an_uncommitted_file_leaves_the_old_one_and_no_temporary() {
        let d = scratch("dropped");
        let p = d.join("out.txt");
        std::fs::write(&p, b"old").unwrap();
        let mut f = AtomicFile::create(&p, None).unwrap();
        f.write_all(b"half").unwrap();
        drop(f);
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        assert_eq!(entries(&d), ["out.txt"]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_device_is_written_in_place() {
        let dev = Path::new("/dev/null");
        write_atomic(dev, b"x", None).unwrap();
        let mut f = AtomicFile::create(dev, None).unwrap();
        f.write_all(b"y").unwrap();
        f.commit().unwrap();
        assert!(std::fs::metadata(dev).unwrap().file_type().is_char_device());
    }
}
