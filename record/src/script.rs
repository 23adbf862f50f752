//! `#!` scripts, followed as the kernel follows them (`fs/binfmt_script.c`):
//! `aetrace record -- SCRIPT ARGS` records the interpreter, run with the
//! script, exactly as `execve(SCRIPT, ...)` would run it.
//!
//! Invariants (the kernel's rules, Linux 5.0 and later): the `#!` line is
//! read from the file's first 256 bytes; the interpreter is the first word
//! after `#!` (spaces and tabs skipped), taken as a path as it is (relative
//! to the working directory, no `PATH` search); everything after it on the
//! line, spaces inside kept and trailing ones trimmed, is one optional
//! argument; the new argv is `interpreter [argument] SCRIPT ARGS...`, where
//! SCRIPT is the path execve was given and the old `argv[0]` is dropped.
//! An interpreter may itself be a script, up to [`MAX_SCRIPTS`] in a
//! chain. A file whose first line is no such line is not a script.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Scripts in a chain the kernel follows; a sixth fails with ELOOP
/// (`exec_binprm`; measured on Linux 6.18: five nested scripts run, six
/// say "Too many levels of symbolic links").
pub const MAX_SCRIPTS: usize = 5;

/// `BINPRM_BUF_SIZE`: how much of the file the kernel looks at.
const HEAD: usize = 256;

/// What to run: the executable and its whole argv.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The file to exec (an ELF once [`follow`] returned).
    pub exe: PathBuf,
    /// Its `argv[0]`.
    pub argv0: OsString,
    /// The arguments after `argv[0]`.
    pub args: Vec<OsString>,
}

/// Follows `inv` through `#!` lines to the executable the kernel would
/// run. A file that cannot be read is left as it is (whoever reads it next
/// says why); a script without an execute bit is an error, as for execve;
/// an interpreter that cannot be executed, or a chain longer
/// than [`MAX_SCRIPTS`], is an [`Error::BadInterpreter`] naming the
/// script and its interpreter, as a shell does.
pub fn follow(inv: Invocation) -> Result<Invocation> {
    follow_at(inv, &|p| p.to_owned())
}

/// [`follow`] for another process: `at` gives the path by which this
/// process opens a file that process names (relative to its working
/// directory); the invocation keeps the names as that process gave them.
pub(crate) fn follow_at(mut inv: Invocation, at: &dyn Fn(&Path) -> PathBuf) -> Result<Invocation> {
    let script = inv.exe.clone();
    let mut first: Option<PathBuf> = None;
    for depth in 0..=MAX_SCRIPTS {
        let Some((name, arg)) = head(&at(&inv.exe)).as_deref().and_then(shebang) else {
            return Ok(inv);
        };
        if depth == 0 {
            // execve's own check of the file it was given.
            executable(&at(&inv.exe)).map_err(|source| Error::Io {
                path: inv.exe.clone(),
                source,
            })?;
        }
        let interp = PathBuf::from(OsString::from_vec(name));
        let named = first.get_or_insert_with(|| interp.clone()).clone();
        let bad = |reason: std::io::Error| Error::BadInterpreter {
            script: script.clone(),
            interp: named.clone(),
            reason: strerror(&reason),
        };
        if depth == MAX_SCRIPTS {
            return Err(bad(std::io::Error::from_raw_os_error(libc::ELOOP)));
        }
        executable(&at(&interp)).map_err(bad)?;
        let mut args: Vec<OsString> = arg.map(OsString::from_vec).into_iter().collect();
        args.push(std::mem::take(&mut inv.exe).into_os_string());
        args.append(&mut inv.args);
        inv = Invocation {
            exe: interp.clone(),
            argv0: interp.into_os_string(),
            args,
        };
    }
    unreachable!("the loop returns at depth MAX_SCRIPTS")
}

/// The file's first [`HEAD`] bytes, or `None` when it cannot be read.
fn head(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(HEAD);
    std::fs::File::open(path)
        .ok()?
        .take(HEAD as u64)
        .read_to_end(&mut buf)
        .ok()?;
    Some(buf)
}

/// What `execve` needs of an interpreter: a regular file with an execute
/// bit (EACCES otherwise), that exists (the system's error otherwise).
fn executable(path: &Path) -> std::io::Result<()> {
    let m = std::fs::metadata(path)?;
    if m.is_file() && m.permissions().mode() & 0o111 != 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(libc::EACCES))
    }
}

/// The system's text for an error, without Rust's "(os error N)".
fn strerror(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// The interpreter and optional argument of a file starting with `head`,
/// or `None` when the kernel would not run it as a script: the parse of
/// `load_script`, index for index (the buffer is zero-filled past the
/// file's end, and its last byte is the end of a line with no newline).
fn shebang(head: &[u8]) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let mut buf = [0u8; HEAD];
    let n = head.len().min(HEAD);
    buf[..n].copy_from_slice(&head[..n]);
    if buf[..2] != *b"#!" {
        return None;
    }
    let spacetab = |c: u8| c == b' ' || c == b'\t';
    let buf_end = HEAD - 1;
    let non_spacetab =
        |b: &[u8; HEAD], from: usize, last: usize| (from..=last).find(|&i| !spacetab(b[i]));
    let terminator = |b: &[u8; HEAD], from: usize, last: usize| {
        (from..=last).find(|&i| spacetab(b[i]) || b[i] == 0)
    };
    let mut end = match buf.iter().position(|&c| c == b'\n') {
        Some(e) => e,
        None => {
            // No newline: the name must end inside the buffer.
            let first = non_spacetab(&buf, 2, buf_end)?;
            terminator(&buf, first, buf_end)?;
            buf_end
        }
    };
    while spacetab(buf[end - 1]) {
        end -= 1;
    }
    let name = non_spacetab(&buf, 2, end).filter(|&i| i != end)?;
    let sep = terminator(&buf, name, end);
    let arg = match sep {
        Some(s) if buf[s] != 0 => non_spacetab(&buf, s, end),
        _ => None,
    };
    buf[end] = 0;
    if let Some(s) = sep {
        buf[s] = 0;
    }
    let cstr = |from: usize| {
        buf[from..]
            .split(|&c| c == 0)
            .next()
            .unwrap_or(&[])
            .to_vec()
    };
    Some((cstr(name), arg.map(cstr)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &[u8]) -> Option<(String, Option<String>)> {
        shebang(s).map(|(n, a)| {
            (
                String::from_utf8(n).unwrap(),
                a.map(|a| String::from_utf8(a).unwrap()),
            )
        })
    }

    #[test]
    fn the_kernels_reading_of_a_hash_bang_line() {
        let some = |n: &str, a: Option<&str>| Some((n.to_string(), a.map(str::to_string)));
        assert_eq!(parse(b"#!/bin/sh\necho"), some("/bin/sh", None));
        assert_eq!(parse(b"#! \t/bin/sh  \t\n"), some("/bin/sh", None));
        // One argument, inner spaces kept, trailing ones trimmed.
        assert_eq!(
            parse(b"#!/usr/bin/env  -S a  b \t\nx"),
            some("/usr/bin/env", Some("-S a  b"))
        );
        assert_eq!(parse(b"#!interp"), some("interp", None));
        // A NUL ends the name, and then no argument follows.
        assert_eq!(parse(b"#!/bin/a\0 b\n"), some("/bin/a", None));
        assert_eq!(parse(b"#!\n"), None);
        assert_eq!(parse(b"#!   \n"), None);
        assert_eq!(parse(b"# !/bin/sh\n"), None);
        assert_eq!(parse(b"\x7fELF"), None);
        // A name running past the first 256 bytes is truncated: no script.
        let long = [b"#!/".as_slice(), &[b'x'; 300]].concat();
        assert_eq!(parse(&long), None);
        // A long line whose name ends early: the argument is cut at 255.
        let cut = [b"#!/bin/i ".as_slice(), &[b'a'; 300]].concat();
        let (_, arg) = parse(&cut).unwrap();
        assert_eq!(arg.unwrap().len(), 255 - 9);
    }
}
