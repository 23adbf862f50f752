//! The `aetrace instrument` and `aetrace record` commands: rewrite a program
//! ([`crate::rewrite`]), then run it under the recorder ([`crate::launch`]).
//!
//! Invariants: the rewritten executable is written to a temporary name and
//! renamed into place, so no half-written program is ever run; the program
//! is found on `PATH` like a shell would, and its `argv[0]` is what the
//! user typed.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use aetrace_format::module_flags;
use aetrace_format::progdb;

use crate::launch::{self, Launch, ModuleSpec, Outcome};
use crate::rewrite::{self, Instrumented, Placement};
use crate::{Error, Result};

fn io_err(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `bytes` to `path` atomically with mode 0755.
fn write_executable(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(|e| io_err(&tmp, e))?;
    f.write_all(bytes).map_err(|e| io_err(&tmp, e))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o755))
        .map_err(|e| io_err(&tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| io_err(path, e))
}

/// `aetrace instrument ELF -o OUT`: writes the rewritten program. Run
/// without the recorder, it writes its raw witness streams to the file
/// named by `AETRACE_OUT`.
pub fn instrument_command(elf: &Path, out: &Path, placement: Placement) -> Result<Instrumented> {
    let ins = rewrite::instrument(elf, placement)?;
    write_executable(out, &ins.elf)?;
    Ok(ins)
}

/// Finds `program` as `execvp` would: a name with a slash as is, else the
/// first executable file of that name on `PATH`.
pub fn find_program(program: &Path) -> Result<PathBuf> {
    let not_found = || Error::Record {
        what: format!("{}: program not found", program.display()),
    };
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
    pub trace: Option<PathBuf>,
    pub placement: Placement,
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

/// `aetrace record`: rewrites the program into a private directory, runs
/// it with the recorder, and returns how it ended.
pub fn record_command(o: &RecordOptions) -> Result<Outcome> {
    let exe = find_program(&o.program)?;
    let ins = rewrite::instrument(&exe, o.placement)?;
    let name = exe
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "program".into());
    let trace = o.trace.clone().unwrap_or_else(|| {
        let mut t = name.clone();
        t.push(".aet");
        PathBuf::from(t)
    });
    let dir = std::env::temp_dir().join(format!("aetrace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
    let rewritten = dir.join(&name);
    let result = write_executable(&rewritten, &ins.elf).and_then(|()| {
        launch::record(&Launch {
            program: rewritten.clone(),
            argv0: o.program.clone().into_os_string(),
            args: o.args.clone(),
            env: Vec::new(),
            trace,
            modules: vec![ModuleSpec {
                path: exe.canonicalize().unwrap_or(exe.clone()),
                build_id: ins.build_id.clone(),
                flags: module_flags::MAIN | module_flags::INSTRUMENTED,
                size: ins.size,
                db: ins.db.encode(),
                db_version: progdb::VERSION,
                runtime_vaddr: ins.db.runtime_vaddr,
                notes: ins.notes.clone(),
            }],
            geometry: Launch::DEFAULT_GEOMETRY,
        })
    });
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The exit code `aetrace record` ends with: the program's status, or for
/// a program killed by a signal the same signal (re-raised on ourselves
/// with its default action), else 128 + signal.
pub fn exit_like(outcome: Outcome) -> std::process::ExitCode {
    match outcome {
        Outcome::Exited(c) => std::process::ExitCode::from(c as u8),
        Outcome::Signaled(s) => {
            // SAFETY: resetting a disposition and raising a signal on ourselves.
            unsafe {
                libc::signal(s, libc::SIG_DFL);
                libc::raise(s);
            }
            std::process::ExitCode::from(128u8.wrapping_add(s as u8))
        }
    }
}
