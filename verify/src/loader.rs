//! The dynamic loader's notification point, found the way gdb finds it
//! before the program's `r_debug` exists (`solib-svr4.c`, `enable_break`):
//! at the exec stop the kernel has mapped the executable and its
//! interpreter only; `AT_BASE` in the auxiliary vector is the
//! interpreter's load address, `/proc/PID/maps` names its file, and the
//! file's dynamic symbol `_dl_debug_state` is the function glibc's loader
//! calls (its `r_debug.r_brk`) each time its list of objects changes: with
//! `RT_ADD` before it maps the program's libraries and with
//! `RT_CONSISTENT` once they are mapped and relocated, before it runs
//! their initialisers (`DT_INIT`, `DT_INIT_ARRAY`). A breakpoint there lets
//! the follower arm a library's entry traps before any of its code runs.
//!
//! Invariants: only read-only inspection of the stopped process (auxv and
//! maps) and of the interpreter's file; `None` when the program has no
//! interpreter (static) or the interpreter exports no such symbol, and the
//! caller then arms libraries at the program's entry point instead.

use std::path::PathBuf;

use crate::sys::Pid;
use crate::{Error, Result};

/// `AT_BASE`: the interpreter's base address.
const AT_BASE: u64 = 7;
/// The symbol glibc's loader calls at each change of its object list.
const NOTIFY: &str = "_dl_debug_state";

/// The interpreter of the stopped process `pid` (its file and load base),
/// or `None` for a program without one.
fn interpreter(pid: Pid) -> Result<Option<(PathBuf, u64)>> {
    let sys = |what, source| Error::Sys {
        what,
        tid: pid,
        source,
    };
    let auxv =
        std::fs::read(format!("/proc/{pid}/auxv")).map_err(|e| sys("read /proc/PID/auxv", e))?;
    let word = |c: &[u8]| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]));
    let base = auxv
        .chunks_exact(16)
        .find(|kv| word(&kv[..8]) == AT_BASE)
        .map_or(0, |kv| word(&kv[8..]));
    if base == 0 {
        return Ok(None);
    }
    Ok(crate::sys::mappings(pid)?
        .into_iter()
        .find(|(start, _, path)| *start == base && path.starts_with('/'))
        .map(|(_, _, path)| (PathBuf::from(path), base)))
}

/// The runtime address of the loader's notification function in the
/// stopped process `pid`, if it has a loader that exports one.
pub(crate) fn notify_point(pid: Pid) -> Result<Option<u64>> {
    let Some((path, base)) = interpreter(pid)? else {
        return Ok(None);
    };
    let elf = aetrace_analysis::elf::Module::open(&path)?;
    Ok(elf
        .func_symbols
        .iter()
        .find(|s| s.name == NOTIFY)
        .map(|s| base + s.addr))
}
