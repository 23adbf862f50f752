//! The recorder behind `aetrace record`: runs a rewritten program with the
//! shared witness region (`docs/runtime.md`) and writes the trace file
//! (`docs/format.md`) while the program runs.
//!
//! Each thread's stream is Ball & Larus's `trace_record(EX, epl)` (paper 003,
//! section 4.1: the witnesses in the order the run crossed them); the
//! recorder adds nothing to it and drops nothing: the bytes of every slot
//! are copied into the trace exactly as drained, first THREAD/FORK record
//! included, and the regenerator parses them. Design decision 4: compress
//! in the recorder, not in the program; a program killed by any signal
//! leaves every witness it wrote.
//!
//! Invariants:
//! - Thread ids are dense, in order of each stream's first bytes; a
//!   stream's parent (from its THREAD/FORK record) has its id already: a
//!   parent claims its slot before it creates the child, and a first batch
//!   naming a slot whose stream has not started yet (a child in a lower
//!   slot, one a reclaim freed, than its creator's) waits for the end of
//!   the pass, which reaches the creator's slot ([`Recorder::take`]).
//! - Slot reuse: a slot whose thread has exited is reclaimed
//!   ([`Recorder::reclaim`], at most every [`RECLAIM_EVERY`]): its stream
//!   is drained to its end and its chunk closed, its thread keeps its id
//!   (THREAD_END at the end of the run, as for any thread that exited
//!   early), and the slot's next claim starts a new thread. A THREAD or
//!   FORK record names the creator's *slot*: it stands for the stream that
//!   held the slot last when the child's first bytes were read, which is
//!   the creator unless the creator exited and its slot was claimed again
//!   before the child ran its first traced code (then the parent given is
//!   that later thread of the same process, `docs/runtime.md` section 8).
//! - A chunk holds whole records only: batches end at record boundaries and
//!   a chunk's zstd frame is fed whole batches; its witness count is the
//!   sum of theirs (counted by the drainer in its validating pass).
//! - `Drainer::poll(true, ..)` runs only after `waitpid` said ECHILD: as
//!   child subreaper the recorder sees every descendant, so no process that
//!   could write to the region is left.
//! - The trace gets END only if every section was written; after any
//!   failure the file stays a valid, explicitly incomplete prefix.
//!
//! While `record` runs it owns every child of the calling process (it reaps
//! with `waitpid(-1)`) and the dispositions of SIGINT, SIGQUIT, SIGTERM, SIGXFSZ and
//! SIGHUP; it sets PR_SET_CHILD_SUBREAPER on the process for good.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use aetrace_format::{
    module_flags, Command, EncodedDatabase, EndReason, ExitStatus, Header, Image, Module, ModuleId,
    ProcessExit, StartReason, Stdin, ThreadId, ThreadStart, TraceWriter,
};
use aetrace_runtime::layout::ESCAPE;
use aetrace_runtime::{Batch, Geometry, RecordKind, Region};

use crate::encode::{Job, Pipeline, IN_FLIGHT};
use crate::execname::{self, ExecName};

use crate::error::RecordError;
use crate::{Error, Result};

/// One module of the traced program, as the rewriter describes it.
#[derive(Clone, Debug)]
pub struct ModuleSpec {
    /// The ORIGINAL module path (what the user named).
    pub path: PathBuf,
    /// The original module's GNU build-id (the trace's key for the program database).
    pub build_id: Vec<u8>,
    /// [`aetrace_format::module_flags`] bits (`MAIN | INSTRUMENTED`).
    pub flags: u32,
    /// Bytes of address space from vaddr 0 (the highest PT_LOAD end).
    pub size: u64,
    /// The program database, compressed (opaque here; copied into the trace).
    pub db: EncodedDatabase,
    /// Link-time vaddr of the runtime blob in the rewritten module.
    pub runtime_vaddr: u64,
    /// The rewritten module's image id (its runtime reports it in each
    /// slot's `S_IMAGE`); 0 for none.
    pub image_id: u64,
    /// Facts worth keeping with the trace, e.g. procedures left alone.
    pub notes: Vec<String>,
}

/// What to run and where to write its trace.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The rewritten executable to exec.
    pub program: PathBuf,
    /// `argv[0]` exactly as the user typed it.
    pub argv0: OsString,
    /// The path a native run execs (as `execvp` finds it): the copy is
    /// exec'd by a name of its length ([`crate::execname`]), so the stack
    /// is where a native run's is. `None`: by its own path.
    pub native_path: Option<PathBuf>,
    /// The arguments after `argv[0]`.
    pub args: Vec<OsString>,
    /// Variables ADDED to the inherited environment (e.g. `LD_LIBRARY_PATH`
    /// for rewritten libraries).
    pub env: Vec<(OsString, OsString)>,
    /// The trace file to write.
    pub trace: PathBuf,
    /// `modules[0]` is the main executable.
    pub modules: Vec<ModuleSpec>,
    /// Slot count and half size of the shared witness region.
    pub geometry: Geometry,
    /// How to rewrite a program a traced process execs, so that it is
    /// traced too ([`crate::follow`]); `None`: such a program runs
    /// untraced.
    pub follow: Option<crate::commands::Follow>,
}

impl Launch {
    /// 256 threads/processes alive at once (the slots of exited threads
    /// are reclaimed, `Recorder::reclaim`), 256 KiB halves: a writer
    /// flushes (and may wait for the recorder, which drains every 250 us) once
    /// per ~256 K witnesses, and untouched slots cost no memory (the memfd
    /// is sparse). Against 1 MiB halves (interleaved runs, load average
    /// 5.5-7.5, 100 runs each): xz on 20 kB (1.46 MB of witnesses) 19.0
    /// -> 17.7 ms minimum wall, 19.5 -> 18.1 ms median CPU; gzip and
    /// bzip2 on 20 kB unchanged; the 2 MB rows unchanged within the noise
    /// (6 runs each). Smaller halves flush more often, so more signals are
    /// delivered inside `flush`: `signal_entry` reports them at the check
    /// that called it (`aetrace_runtime::blob`).
    pub const DEFAULT_GEOMETRY: Geometry = Geometry {
        slot_count: 256,
        half_size: 256 << 10,
    };

    /// Testing knob, not a tuning option: `AETRACE_HALF_SIZE=BYTES` in the
    /// recorder's environment sets the half size (a multiple of 8 above
    /// 8 KiB), so that tests can make writers flush every few kB and hit
    /// what a flush coincides with (signals, threads) deterministically
    /// enough, and `bench/` can compare sizes without a rebuild.
    pub const HALF_SIZE_ENV: &'static str = "AETRACE_HALF_SIZE";

    /// [`Self::DEFAULT_GEOMETRY`], with the half size of
    /// [`Self::HALF_SIZE_ENV`] when it is set; a value that is not a
    /// number is an error (a geometry the region refuses is one later).
    pub fn geometry_from_env() -> Result<Geometry> {
        let Some(v) = std::env::var_os(Self::HALF_SIZE_ENV) else {
            return Ok(Self::DEFAULT_GEOMETRY);
        };
        let half_size =
            v.to_str()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| RecordError::HalfSize {
                    var: Self::HALF_SIZE_ENV,
                    value: v.to_string_lossy().into_owned(),
                })?;
        Ok(Geometry {
            half_size,
            ..Self::DEFAULT_GEOMETRY
        })
    }
}

/// How the main process of the traced program ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `exit(code)`.
    Exited(i32),
    /// Killed by this signal.
    Signaled(i32),
}

/// How a recording ended.
#[derive(Debug)]
pub struct Recorded {
    /// How the program's main process ended.
    pub outcome: Outcome,
    /// Why the trace is incomplete, when writing it failed while the
    /// program ran ([`RecordError::Incomplete`]): the program ran to its
    /// end all the same, and the file has no END (`aetrace info` says
    /// where it stops).
    pub incomplete: Option<Error>,
    /// The trace file written.
    pub trace: PathBuf,
}

/// Raw stream bytes a thread's open chunk takes before it is closed (a
/// chunk holds at most this plus one buffer half).
pub const CHUNK_BYTES: usize = 1 << 20;

/// Raw bytes after which the open chunk's encoder is made to compress
/// what it holds (zstd keeps up to a 128 KiB block of input otherwise):
/// that work is then done while the program runs, not after it exits.
const FLUSH_BYTES: usize = 32 << 10;
/// A partial chunk is written after this long anyway, so a recorder that
/// dies loses at most about this much of a slow thread's stream.
const CHUNK_AGE: Duration = Duration::from_secs(1);
/// zstd level of the witness chunks. Level 1 rather than the format's
/// default 3: on gzip's and sort's real streams it compresses 10-40 %
/// faster for 2 % more bytes (`zstd -b`, 1 MiB blocks), and the recorder
/// must keep up with a program writing ~200 MB of witnesses per second.
const CHUNK_LEVEL: i32 = 1;
/// zstd window of the witness chunks (log2 bytes): a chunk (at most
/// [`CHUNK_BYTES`] plus a half) fits in it whole. With level 1's own
/// window (512 KiB) the streaming encoder's input buffer wraps inside
/// each chunk, and it compresses the rest with its slower external-
/// dictionary matcher (`ZSTD_compressBlock_fast_extDict_generic`, 26-31 %
/// of zstd's instructions recording gzip or bzip2; the recorder runs 8-10 %
/// fewer instructions without it, for about 1 MiB more of its memory). The chunks are
/// decompressed whole (`zstd::bulk`), so the window costs regen nothing.
const CHUNK_WINDOW_LOG: u32 = 21;
/// Drain interval while the program writes, and the first one after it
/// starts: the bytes are compressed as they come (on the other core), so
/// what is left to compress when the program exits is at most about this
/// long's worth of witnesses. Short enough that a short run is compressed
/// during it, not after its exit (gzip on 20 kB runs 1.5 ms and writes
/// 200 kB; the first wait used to be 2 ms, so all of it was compressed
/// after the exit); an empty pass costs a few microseconds.
const POLL_BUSY: Duration = Duration::from_micros(250);
/// Longest drain interval, reached by doubling after passes that found
/// nothing (a program waiting for input); bounds the delay in noticing
/// exits too (SIGCHLD wakes the drainer at once anyway).
const POLL: Duration = Duration::from_millis(10);
/// Empty passes start the doubling only once the program has written
/// something or this long after it started: its loader and startup code
/// write nothing, and doubling from the spawn grew the waits through that
/// silence (an empty `main()` under strace: 250, 500, 1000, 2000 us), so a
/// short program's first witnesses could wait 1-2 ms and more of them were
/// left to compress after its exit, on the run's critical path.
const POLL_WARMUP: Duration = Duration::from_millis(50);
/// How often the recorder looks for slots whose thread has exited
/// (one `tgkill` per slot that a pass found idle): a program can create
/// up to the slot count of threads in this time, alive or not, before
/// one is reused (a claim that finds none waits for the recorder). The
/// check runs at most once per drain pass, so an idle program (passes
/// 10 ms apart) pays one `tgkill` per live thread per 10 ms: measured
/// with 200 threads asleep for 2 s, the recorder's CPU time went from
/// 0.04 to 0.06-0.07 s (`docs/runtime.md` section 8).
const RECLAIM_EVERY: Duration = Duration::from_millis(2);
const CREATOR: &str = concat!("aetrace ", env!("CARGO_PKG_VERSION"));

/// How `/proc/self/maps` names the rewritten copy (its canonical path),
/// and how it names the original in a native run: `MAJOR:MINOR INODE`
/// (hexadecimal, at least two digits each, as the kernel prints them) and
/// the canonical path. None when either cannot be resolved.
fn exe_names(copy: &Path, original: &Path) -> Option<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt;
    let copy = std::fs::canonicalize(copy).ok()?;
    let original = std::fs::canonicalize(original).ok()?;
    let meta = std::fs::metadata(&original).ok()?;
    let dev = meta.dev();
    let dev_ino = format!(
        "{:02x}:{:02x} {}",
        libc::major(dev),
        libc::minor(dev),
        meta.ino()
    );
    Some((
        copy.into_os_string().into_vec(),
        dev_ino.into_bytes(),
        original.into_os_string().into_vec(),
    ))
}

/// Tells the program's runtime its executable's native names: the path a
/// native run is exec'd by, when the copy is exec'd by a name of its
/// length (`renamed`), and a link to the `original`'s canonical path for
/// its `readlink("/proc/self/exe")`.
fn show_names(region: &Region, l: &Launch, renamed: bool, original: Option<&[u8]>) {
    let execfn = l
        .native_path
        .as_deref()
        .filter(|_| renamed)
        .map_or(&[][..], |p| p.as_os_str().as_bytes());
    let link = original
        .and_then(|o| {
            execname::exe_link(
                &crate::commands::cache_dir(),
                Path::new(OsStr::from_bytes(o)),
            )
        })
        .map(|p| p.into_os_string().into_vec())
        .unwrap_or_default();
    region.show_names(execfn, &link);
}

/// Runs `l.program` under the recorder and writes `l.trace`; returns how
/// the main process ended. The program's own failure (a non-zero exit, a
/// crash) is an `Outcome`, not an error; nor is a trace that could not be
/// written whole once the program started ([`Recorded::incomplete`]).
pub fn record(l: &Launch) -> Result<Recorded> {
    check_launch(l)?;
    let region = Region::create(l.geometry).map_err(RecordError::WitnessRegion)?;
    // The program's runtime finds the region here, in this process
    // (`aetrace_runtime::layout::REGION_FD`): it inherits nothing of it.
    let _published = region.publish().map_err(RecordError::WitnessRegion)?;
    // The program sees its native environment (`init` undoes this change).
    if let Some((k, v)) = l.env.first() {
        let native = std::env::var_os(k);
        region.hide_env(
            k.as_bytes(),
            v.as_bytes(),
            native.as_deref().map(OsStrExt::as_bytes),
        );
    }
    // Its view of its own maps names the original executable.
    let names = exe_names(&l.program, &l.modules[0].path);
    if let Some((copy, dev_ino, original)) = &names {
        region.show_exe(copy, dev_ino, original);
    }
    // Before the program starts: orphans of its descendants must come to
    // us, or we could not know when the last writer is gone.
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(RecordError::Subreaper(std::io::Error::last_os_error()).into());
    }
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut header = Header::new(CREATOR, now).map_err(|e| trace_err(&l.trace, e))?;
    if records_values(l) {
        header.incompat_flags |= aetrace_format::header::INCOMPAT_SPLIT_CODEC;
    }
    // Nothing ran when these fail: leave no trace file behind.
    let abandon = |e: Error| {
        if aetrace_format::replaceable(&l.trace) {
            let _ = std::fs::remove_file(&l.trace);
        }
        e
    };
    let mut out =
        TraceWriter::create(&l.trace, &header).map_err(|e| abandon(trace_err(&l.trace, e)))?;
    out.set_level(CHUNK_LEVEL);
    // Before the program runs, so even a trace cut short says how to re-run it.
    out.command(&command(l))
        .map_err(|e| abandon(trace_err(&l.trace, e)))?;
    let name = l
        .native_path
        .as_deref()
        .filter(|_| !execname::loader_reads_cwd(&program_env(l)))
        .and_then(|n| ExecName::new(&l.program, n));
    if name.is_some() {
        region.chdir_back();
    }
    show_names(&region, l, name.is_some(), names.as_ref().map(|n| &n.2[..]));
    let blocked = Blocked::new()?;
    let main = spawn(l, name.as_ref(), &blocked.0).map_err(abandon)?;
    drop(name);
    let signals = Signals::install(main);
    drop(blocked);

    let mut rec = Recorder::new(l, out);
    let mut reaper = Reaper {
        main,
        main_status: None,
        exits: Vec::new(),
    };
    let mut drainer = region.drainer();
    WAKE.store(
        region.ready_word() as *const _ as *mut std::sync::atomic::AtomicU32,
        Ordering::Release,
    );
    rec.warm_encoder();
    // Empty passes in a row (counted once the program has written or
    // after POLL_WARMUP): the interval doubles with each, from POLL_BUSY.
    let mut idle = 0u32;
    let mut written = false;
    let started = Instant::now();
    let mut reclaimed = Instant::now();
    loop {
        let found = rec.drain(&mut drainer, false);
        rec.serve_execs(&drainer);
        rec.libraries(&region);
        if reclaimed.elapsed() >= RECLAIM_EVERY {
            rec.reclaim(&mut drainer, main);
            reclaimed = Instant::now();
        }
        rec.flush_aged();
        if reaper.reap()? {
            break;
        }
        written |= found;
        idle = if found || !(written || started.elapsed() >= POLL_WARMUP) {
            0
        } else {
            (idle + 1).min(8)
        };
        drainer.wait((POLL_BUSY * (1 << idle.saturating_sub(1))).min(POLL));
    }
    // No process is left that could write: every stream ends at its first
    // unwritten byte (an exact prefix for a killed writer).
    rec.drain(&mut drainer, true);
    rec.libraries(&region);
    drop(signals);
    let incomplete = rec.finish(&reaper.exits).err();
    let outcome = match reaper.main_status {
        Some(ExitStatus::Exited(c)) => Outcome::Exited(c),
        Some(ExitStatus::Signaled { signal, .. }) => Outcome::Signaled(signal),
        None => return Err(RecordError::NeverReaped(main).into()),
    };
    Ok(Recorded {
        outcome,
        incomplete,
        trace: l.trace.clone(),
    })
}

/// The COMMAND section: the ORIGINAL program, argv as the program gets it,
/// the environment it inherits (the recorder's: `l.env` changes only the
/// rewritten copy's, and its runtime gives the program the native one), the
/// working directory and where stdin comes from.
fn command(l: &Launch) -> Command {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let bytes = |s: &std::ffi::OsStr| s.as_bytes().to_vec();
    let env = std::env::vars_os()
        .map(|(k, v)| {
            let mut kv = bytes(&k);
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            kv
        })
        .collect();
    // fd 0 is inherited by the program unchanged.
    let link = std::fs::read_link("/proc/self/fd/0");
    let stdin = match std::fs::metadata("/proc/self/fd/0") {
        // Some sandboxes make /dev/null a regular file; it is still "no input".
        // (or replace it, leaving "/dev/null (deleted)").
        _ if link
            .as_deref()
            .is_ok_and(|p| p.as_os_str().as_bytes().starts_with(b"/dev/null")) =>
        {
            Stdin::Null
        }
        Ok(m) if m.is_file() => match link {
            Ok(p) => Stdin::File {
                path: bytes(p.as_os_str()),
                size: m.len(),
            },
            Err(_) => Stdin::Other,
        },
        Ok(m) if m.file_type().is_char_device() && m.rdev() == libc::makedev(1, 3) => Stdin::Null,
        _ => Stdin::Other,
    };
    Command {
        program: bytes(
            l.modules
                .first()
                .map_or(l.program.as_os_str(), |m| m.path.as_os_str()),
        ),
        argv: std::iter::once(&l.argv0)
            .chain(&l.args)
            .map(|a| bytes(a))
            .collect(),
        env,
        cwd: std::env::current_dir().map_or_else(|_| Vec::new(), |d| bytes(d.as_os_str())),
        stdin,
    }
}

fn incomplete(trace: &Path, at: u64, source: Error) -> Error {
    RecordError::Incomplete {
        path: trace.to_owned(),
        at,
        source: Box::new(source),
    }
    .into()
}

fn trace_err(trace: &Path, source: aetrace_format::Error) -> Error {
    RecordError::TraceFile {
        path: trace.to_owned(),
        source,
    }
    .into()
}

fn check_launch(l: &Launch) -> Result<()> {
    let Some(main) = l.modules.first() else {
        return Err(RecordError::NoMainModule.into());
    };
    if main.flags & module_flags::MAIN == 0 {
        return Err(RecordError::FirstNotMain(main.path.clone()).into());
    }
    // Libraries report their runtime's address in the region's module
    // table under their tag, which is their index here.
    for (i, lib) in l.modules.iter().enumerate().skip(1) {
        if lib.flags & module_flags::MAIN != 0 || lib.flags & module_flags::INSTRUMENTED == 0 {
            return Err(RecordError::BadLibraryModule(lib.path.clone()).into());
        }
        if i as u32 >= aetrace_runtime::layout::MAX_MODULES {
            return Err(RecordError::TooManyLibraries {
                path: lib.path.clone(),
                max: aetrace_runtime::layout::MAX_MODULES - 1,
            }
            .into());
        }
    }
    Ok(())
}

// --- the program ---------------------------------------------------------

/// Starts the program with `posix_spawn` (a vfork: no copy of the
/// recorder's page tables, which fork made on every run) and returns its
/// pid. It inherits what it would from a shell: the signal mask `mask`
/// (the recorder's own before `Blocked`), the recorder's signal
/// dispositions, not yet changed, but SIGPIPE's back to the default (as
/// std's spawn does: the Rust runtime ignores it), and nothing of the
/// region (its runtime finds it through `/proc`, `Region::publish`).
/// With a `name`, it is exec'd by that name from that name's directory.
fn spawn(l: &Launch, name: Option<&ExecName>, mask: &libc::sigset_t) -> Result<i32> {
    use std::ffi::CString;
    let io = |source| Error::Io {
        path: l.program.clone(),
        source,
    };
    let nul = || io(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    let cstr = |b: &[u8]| CString::new(b).map_err(|_| nul());
    let path = match name {
        Some(n) => n.path.clone(),
        None => cstr(l.program.as_os_str().as_bytes())?,
    };
    let argv = std::iter::once(&l.argv0)
        .chain(&l.args)
        .map(|a| cstr(a.as_bytes()))
        .collect::<Result<Vec<_>>>()?;
    let envp = program_env(l)
        .iter()
        .map(|(k, v)| cstr(&[k.as_slice(), b"=", v].concat()))
        .collect::<Result<Vec<_>>>()?;
    let ptrs = |v: &[CString]| {
        v.iter()
            .map(|c| c.as_ptr() as *mut libc::c_char)
            .chain(std::iter::once(std::ptr::null_mut()))
            .collect::<Vec<_>>()
    };
    let (argv, envp) = (ptrs(&argv), ptrs(&envp));
    let mut pid: libc::pid_t = 0;
    // SAFETY: every pointer is valid for the call (NUL-terminated strings,
    // null-terminated vectors); the attributes are initialised before use
    // and destroyed after.
    let rc = unsafe {
        let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
        let mut actions: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        let mut dfl: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut dfl);
        libc::sigaddset(&mut dfl, libc::SIGPIPE);
        // glibc's internal SIGCANCEL and SIGSETXID (32, 33), which its
        // sigaddset refuses: posix_spawn would otherwise leave them ignored
        // in the program when the recorder handles them (a fork and exec
        // leaves them at their default).
        let words = &mut *(&mut dfl as *mut libc::sigset_t as *mut [u64; 16]);
        words[0] |= 3 << 31;
        let mut rc = libc::posix_spawnattr_init(&mut attr);
        if rc == 0 {
            rc = libc::posix_spawn_file_actions_init(&mut actions);
        }
        if let (0, Some(n)) = (rc, name) {
            rc = libc::posix_spawn_file_actions_addchdir_np(&mut actions, n.dir_c.as_ptr());
        }
        if rc == 0 {
            rc = libc::posix_spawnattr_setsigmask(&mut attr, mask);
            if rc == 0 {
                rc = libc::posix_spawnattr_setsigdefault(&mut attr, &dfl);
            }
            if rc == 0 {
                let flags = libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF;
                rc = libc::posix_spawnattr_setflags(&mut attr, flags as libc::c_short);
            }
            if rc == 0 {
                rc = libc::posix_spawn(
                    &mut pid,
                    path.as_ptr(),
                    &actions,
                    &attr,
                    argv.as_ptr(),
                    envp.as_ptr(),
                );
            }
            libc::posix_spawn_file_actions_destroy(&mut actions);
            libc::posix_spawnattr_destroy(&mut attr);
        }
        rc
    };
    if rc != 0 {
        return Err(io(std::io::Error::from_raw_os_error(rc)));
    }
    // Reaped with waitpid(-1) like every other descendant.
    Ok(pid)
}

/// The program's environment: the recorder's own in its order (what a
/// shell would have given the program), each variable of `l.env` in place
/// of the one it overrides or after them all.
fn program_env(l: &Launch) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut env: Vec<(Vec<u8>, Vec<u8>)> = std::env::vars_os()
        .map(|(k, v)| (k.into_vec(), v.into_vec()))
        .collect();
    for (k, v) in &l.env {
        let (k, v) = (k.as_bytes().to_vec(), v.as_bytes().to_vec());
        match env.iter_mut().find(|(o, _)| *o == k) {
            Some(slot) => slot.1 = v,
            None => env.push((k, v)),
        }
    }
    env
}

/// The main child's pid for the forwarding handler (0: not started, or reaped).
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);
/// The region's "data ready" futex word, bumped and woken on SIGCHLD so the
/// drain loop notices an exit at once instead of at its next poll.
static WAKE: std::sync::atomic::AtomicPtr<std::sync::atomic::AtomicU32> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

extern "C" fn child_exited(_sig: libc::c_int) {
    let w = WAKE.load(Ordering::Acquire);
    if !w.is_null() {
        // SAFETY: the word lives in the region, which outlives the handler
        // (the pointer is cleared before the region is dropped); an atomic
        // add and a futex wake are async-signal-safe.
        unsafe {
            (*w).fetch_add(1, Ordering::AcqRel);
            libc::syscall(libc::SYS_futex, w, libc::FUTEX_WAKE, i32::MAX);
        }
    }
}

extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let pid = FORWARD_TO.load(Ordering::Acquire);
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, from) = unsafe { ((*info).si_code, (*info).si_pid()) };
    // A terminal's ^C or ^\ (SI_KERNEL) went to its whole foreground
    // process group, the program's included; and what the program sends
    // (`kill(0, SIGINT)`) reached it already.
    let reached =
        matches!(sig, libc::SIGINT | libc::SIGQUIT) && (code == libc::SI_KERNEL || from == pid);
    if pid > 0 && !reached {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// The recorder's own signal dispositions while the program runs:
/// SIGINT, SIGQUIT, SIGTERM and SIGHUP forwarded to the program's main
/// process until it is reaped (then its pid may be reused; orphaned
/// descendants the recorder still waits for get nothing), as valgrind's
/// and rr's users expect of `kill -INT RECORDER`; but a SIGINT or SIGQUIT
/// from a terminal is not, for the terminal sends it to the program too
/// (the same process group), nor one the program itself sent: the
/// program gets each once, as it would natively. A SIGINT that another
/// process sends to the whole process group with `kill(2)` reaches the
/// program twice (only a terminal's is told apart, by its `si_code`).
/// SIGXFSZ is ignored: a trace grown past `RLIMIT_FSIZE` is a write that
/// fails (EFBIG), which leaves the trace incomplete as a full disk does,
/// instead of killing the recorder under its running program.
/// Installed once the program runs, so it inherits the recorder's own
/// dispositions (`Blocked` holds the signals back until then).
/// Dropping it restores the previous dispositions.
struct Signals {
    saved: [(libc::c_int, libc::sigaction); MANAGED.len()],
}

impl Signals {
    /// For the program's main process `main`. sigaction with a valid
    /// signal number and handler cannot fail.
    fn install(main: i32) -> Signals {
        FORWARD_TO.store(main, Ordering::Release);
        // SAFETY: zeroed sigaction structs are valid; sigaction calls only.
        unsafe {
            let mut saved = [(0, std::mem::zeroed::<libc::sigaction>()); MANAGED.len()];
            for (i, sig) in MANAGED.into_iter().enumerate() {
                let mut act: libc::sigaction = std::mem::zeroed();
                type Action = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);
                (act.sa_sigaction, act.sa_flags) = match sig {
                    libc::SIGXFSZ => (libc::SIG_IGN, libc::SA_RESTART),
                    libc::SIGCHLD => (
                        child_exited as extern "C" fn(libc::c_int) as libc::sighandler_t,
                        libc::SA_RESTART,
                    ),
                    _ => (
                        forward as Action as libc::sighandler_t,
                        libc::SA_RESTART | libc::SA_SIGINFO,
                    ),
                };
                libc::sigemptyset(&mut act.sa_mask);
                saved[i].0 = sig;
                let r = libc::sigaction(sig, &act, &mut saved[i].1);
                debug_assert_eq!(r, 0);
            }
            Signals { saved }
        }
    }
}

/// The signals `Signals` handles, blocked (`Blocked`) from before the
/// program is spawned until their dispositions are in place: one that
/// arrives meanwhile is handled as if it came just after (forwarded, or
/// for SIGXFSZ discarded).
const MANAGED: [libc::c_int; 6] = [
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGCHLD,
    libc::SIGXFSZ,
];

/// `MANAGED` blocked in this thread; holds the previous mask, which the
/// program is spawned with and dropping it restores.
struct Blocked(libc::sigset_t);

impl Blocked {
    fn new() -> Result<Blocked> {
        // SAFETY: sigset operations on owned, initialised sets.
        unsafe {
            let mut set = std::mem::zeroed::<libc::sigset_t>();
            let mut old = std::mem::zeroed::<libc::sigset_t>();
            libc::sigemptyset(&mut set);
            for sig in MANAGED {
                libc::sigaddset(&mut set, sig);
            }
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) != 0 {
                return Err(RecordError::BlockSignals.into());
            }
            Ok(Blocked(old))
        }
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// Builds rayon's global pool (once, unless something built it before)
/// with workers that block `MANAGED` for good: `record` blocks them only in
/// its own thread while it spawns the program, and a worker taking one then
/// would apply the disposition of before (a ^C killing the recorder of a
/// run that had to rewrite its program first).
pub fn quiet_workers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rayon::ThreadPoolBuilder::new()
            .start_handler(|_| {
                let _ = Blocked::new().map(std::mem::forget);
            })
            .build_global();
    });
}

impl Drop for Signals {
    fn drop(&mut self) {
        // SAFETY: restoring dispositions saved by `install`.
        for (sig, act) in &self.saved {
            unsafe { libc::sigaction(*sig, act, std::ptr::null_mut()) };
        }
        FORWARD_TO.store(0, Ordering::Release);
        WAKE.store(std::ptr::null_mut(), Ordering::Release);
    }
}

/// Collects the exit status of every child (and, as subreaper, of every
/// orphaned descendant).
struct Reaper {
    main: i32,
    main_status: Option<ExitStatus>,
    exits: Vec<ProcessExit>,
}

impl Reaper {
    /// Reaps whatever has ended; true once no child is left.
    fn reap(&mut self) -> Result<bool> {
        loop {
            let mut st = 0;
            // SAFETY: waitpid with a valid status pointer.
            let pid = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG | libc::__WALL) };
            if pid == 0 {
                return Ok(false);
            }
            if pid < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::ECHILD) => return Ok(true),
                    _ => return Err(RecordError::Wait(e).into()),
                }
            }
            let status = if libc::WIFEXITED(st) {
                ExitStatus::Exited(libc::WEXITSTATUS(st))
            } else if libc::WIFSIGNALED(st) {
                ExitStatus::Signaled {
                    signal: libc::WTERMSIG(st),
                    core_dumped: libc::WCOREDUMP(st),
                }
            } else {
                continue; // stopped/continued: not asked for, not an end
            };
            if pid == self.main {
                self.main_status = Some(status);
                // Its pid may be reused from now on: forward nothing more.
                FORWARD_TO.store(0, Ordering::Release);
            }
            self.exits.push(ProcessExit {
                pid: pid as u32,
                status,
            });
        }
    }
}

/// Whether the recorder has no child but `main` (reaped or not): then no
/// orphan runs, for an orphaned descendant of the program is reparented
/// to the recorder, its subreaper (`Drainer::exited`). Not known (no
/// `/proc/PID/task/TID/children`) counts as no.
fn only_child(main: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return false;
    };
    tasks.into_iter().all(|t| {
        t.ok()
            .and_then(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .is_some_and(|c| c.split_whitespace().all(|p| p == main.to_string()))
    })
}

// --- the trace -------------------------------------------------------------

/// A slot that has written: its thread, the bytes drained but not yet
/// compressed, and its open chunk.
struct Slot {
    thread: ThreadId,
    /// Whole records, drained in the last pass.
    drained: Drained,
    open: Option<OpenChunk>,
}

/// A slot's bytes drained and not yet compressed, batch by batch.
#[derive(Default)]
struct Drained {
    buf: Vec<u8>,
    /// Each batch's VALUE offsets ([`Batch::values`]), relative to the batch.
    values: Vec<usize>,
    /// The drainer's batches in `buf` (each a half or less): where each
    /// ends in `buf` and in `values`, and its witness bytes. A chunk closes
    /// only between batches, so it holds whole records and at most
    /// [`CHUNK_BYTES`] plus one batch.
    batches: Vec<(usize, usize, u64)>,
}

impl Drained {
    fn of(b: &Batch<'_>) -> Drained {
        let mut d = Drained::default();
        d.push(b);
        d
    }

    fn push(&mut self, b: &Batch<'_>) {
        self.buf.extend_from_slice(b.bytes);
        self.values.extend_from_slice(b.values);
        self.batches
            .push((self.buf.len(), self.values.len(), b.witnesses));
    }

    fn clear(&mut self) {
        self.buf.clear();
        self.values.clear();
        self.batches.clear();
    }
}

/// A chunk being compressed as its bytes arrive. Control only: one zstd
/// frame, fed batch by batch during the run (the compression overlaps the
/// program instead of following its exit) and ended when the chunk
/// closes; the frame does not state its content size, the CHUNK header
/// does. With `--data`: the chunk's raw bytes, gathered and handed to
/// the rayon pool when the chunk closes (`crate::encode`: the
/// `zstd+split` codec is most of the recorder's CPU; every
/// [`CHUNK_BYTES`], so still during the run).
struct OpenChunk {
    sink: Sink,
    /// Control only: the frame so far.
    data: Vec<u8>,
    raw_len: u64,
    witnesses: u64,
    /// Bytes given to `enc` since its last flush.
    unflushed: usize,
    /// When its first bytes came.
    since: Instant,
}

/// Where an open chunk's bytes go.
enum Sink {
    Zstd(zstd::stream::raw::Encoder<'static>),
    /// `record --data`: the raw bytes and their VALUE offsets (relative
    /// to `raw`), for the `zstd+split` codec (`format::values`).
    Values {
        raw: Vec<u8>,
        values: Vec<usize>,
    },
}

struct Thread {
    pid: u32,
    /// Chunks closed so far (some may still be encoding): the next one's
    /// sequence number.
    chunks: u64,
    /// Its process called execve: the stream ended there.
    exec: bool,
}

/// The MODULE section of `m` as module `id`, whose runtime blob runs at
/// `runtime` in process `pid`: its load bias is `runtime - runtime_vaddr`.
fn module_section(m: &ModuleSpec, id: ModuleId, pid: u32, runtime: u64) -> Result<Module> {
    let bias = runtime
        .checked_sub(m.runtime_vaddr)
        .filter(|_| runtime != 0)
        .ok_or_else(|| {
            Error::from(RecordError::RuntimeAddress {
                path: m.path.clone(),
                pid,
                runtime,
                link: m.runtime_vaddr,
            })
        })?;
    Ok(Module {
        id,
        pid,
        flags: m.flags,
        load_base: bias,
        size: m.size,
        build_id: m.build_id.clone(),
        path: m.path.as_os_str().as_bytes().to_vec(),
    })
}

/// The modules of the program whose copy has image id `image`: the
/// launch's, or those of a program `follower` rewrote.
fn modules_in<'a>(
    launch: &'a Launch,
    follower: &'a crate::follow::Follower,
    image: u64,
) -> &'a [ModuleSpec] {
    match follower.images.get(&image) {
        Some(m) if image != launch.modules[0].image_id => m,
        _ => &launch.modules,
    }
}

/// A stream's first bytes, held until its creator's stream has started
/// (its THREAD/FORK record names a slot that has none yet).
struct Deferred {
    slot: u32,
    pid: u32,
    tid: u32,
    runtime: u64,
    image: u64,
    serial: u32,
    drained: Drained,
}

struct Recorder<'l> {
    launch: &'l Launch,
    /// `None` once something failed: the file stays an incomplete prefix.
    out: Option<TraceWriter<File>>,
    error: Option<Error>,
    /// The slots whose current stream has started.
    slots: HashMap<u32, Slot>,
    /// The thread that held each slot last (the current one, or the last
    /// before the slot was reclaimed): what a THREAD/FORK record naming
    /// the slot stands for.
    last: HashMap<u32, ThreadId>,
    deferred: Vec<Deferred>,
    threads: Vec<Thread>,
    /// Modules of new images written so far ([`Self::write_image`]).
    images: usize,
    /// The new images of known programs, by their serial (slot field
    /// SERIAL): the stream that starts each, and the image id.
    serials: HashMap<u32, (ThreadId, u64)>,
    /// Rewrites the programs traced processes exec.
    follower: crate::follow::Follower,
    /// The module whose program database a followed program's module
    /// shares, by (image id, tag): the first written.
    followed_dbs: HashMap<(u64, u32), ModuleId>,
    /// The (serial, tag) of the libraries of new images written so far.
    image_libs: Vec<(u32, u32)>,
    /// Libraries (module indices) whose MODULE is not written yet: their
    /// runtime has not attached (no traced code of theirs ran so far).
    libs_pending: Vec<usize>,
    /// Sinks of closed chunks, reset for the next (a zstd context holds
    /// about a megabyte of tables: allocated once, not per chunk).
    spare: Vec<Sink>,
    /// `--data`: the chunks being encoded off this thread.
    encoding: Pipeline,
}

impl<'l> Recorder<'l> {
    fn new(launch: &'l Launch, out: TraceWriter<File>) -> Self {
        Recorder {
            launch,
            out: Some(out),
            error: None,
            slots: HashMap::new(),
            last: HashMap::new(),
            deferred: Vec::new(),
            threads: Vec::new(),
            images: 0,
            serials: HashMap::new(),
            follower: crate::follow::Follower::new(launch.follow.clone()),
            followed_dbs: HashMap::new(),
            image_libs: Vec::new(),
            libs_pending: (1..launch.modules.len()).collect(),
            spare: Vec::new(),
            encoding: Pipeline::default(),
        }
    }

    /// Creates the encoder the first chunk takes, while the program execs
    /// and its loader runs (on the other core): a zstd context allocates
    /// its workspace at its first frame, here a one-byte one, discarded,
    /// instead of at the first drain.
    fn warm_encoder(&mut self) {
        if records_values(self.launch) {
            Pipeline::warm(CHUNK_LEVEL);
            return;
        }
        let Ok(mut enc) = chunk_encoder() else {
            return; // the first chunk reports the failure
        };
        let mut scratch = Vec::new();
        // `compress_into` first (not a one-shot end): a frame of unknown
        // size sizes the workspace for the real chunks.
        if compress_into(&mut enc, &[0], false, &mut scratch).is_ok()
            && end_frame(&mut enc, &mut scratch).is_ok()
        {
            self.spare.push(Sink::Zstd(enc));
        }
    }

    /// One pass of the drainer, then the drained bytes compressed; true if
    /// the pass found bytes. A slot it cannot read is lost (and the
    /// recording failed), but the drainer keeps its writer from blocking.
    fn drain(&mut self, drainer: &mut aetrace_runtime::Drainer<'_>, finished: bool) -> bool {
        let found = match drainer.poll(finished, &mut |b| self.batch(b)) {
            Ok(n) => n > 0,
            Err(e) => {
                self.fail(RecordError::Drain(e).into());
                true
            }
        };
        self.start_deferred();
        self.compress_drained();
        if let Err(e) = self.append_encoded(IN_FLIGHT) {
            self.fail(e);
        }
        found
    }

    /// Ends the streams of the slots whose thread has exited and hands the
    /// slots back for new threads (module doc, "Slot reuse"). After a
    /// failure the slots are still released (the program runs on).
    fn reclaim(&mut self, drainer: &mut aetrace_runtime::Drainer<'_>, main: i32) {
        for slot in drainer.exited(&mut || only_child(main)) {
            if let Err(e) = drainer.reclaim(slot, &mut |b| self.batch(b)) {
                self.fail(RecordError::Drain(e).into());
            }
            // Its first bytes may have come only now (it claimed, wrote
            // and exited between two passes).
            self.start_deferred();
            if let Err(e) = self.end_stream(slot) {
                self.fail(e);
            }
        }
        drainer.free_released();
    }

    /// The last chunk of `slot`'s stream, and the slot forgotten: its next
    /// bytes start a new thread. The thread's THREAD_END comes with every
    /// other at the end of the run ([`Self::finish`]).
    fn end_stream(&mut self, slot: u32) -> Result<()> {
        let r = if self.error.is_none() {
            self.feed(slot).and_then(|()| self.close(slot))
        } else {
            Ok(())
        };
        if let Some(s) = self.slots.remove(&slot) {
            debug_assert_eq!(self.last.get(&slot), Some(&s.thread));
            if let Some(c) = s.open {
                self.spare.push(c.sink);
            }
        }
        r
    }

    /// Starts the deferred streams whose creator's stream has started by
    /// now (in this pass, or in an earlier one and then reclaimed). One
    /// whose creator never wrote is the error it always was.
    fn start_deferred(&mut self) {
        while !self.deferred.is_empty() && self.error.is_none() {
            // A stream may name its own slot: a fork child that took the
            // slot of its parent, reclaimed (the parent process exited).
            let ready = self.deferred.iter().position(|d| {
                let parent = first_record(&d.drained.buf).map_or(u32::MAX, |(_, p)| p);
                self.slots.contains_key(&parent)
                    || (self.last.contains_key(&parent)
                        && (parent == d.slot || !self.deferred.iter().any(|o| o.slot == parent)))
            });
            let d = self.deferred.remove(ready.unwrap_or(0));
            let b = Batch {
                slot: d.slot,
                pid: d.pid,
                tid: d.tid,
                runtime: d.runtime,
                image: d.image,
                serial: d.serial,
                bytes: &d.drained.buf,
                witnesses: 0,
                values: &[],
            };
            let r = self.start_thread(&b).map(|thread| {
                self.slots.insert(
                    d.slot,
                    Slot {
                        thread,
                        drained: d.drained,
                        open: None,
                    },
                );
            });
            if let Err(e) = r {
                self.fail(e);
            }
        }
    }

    /// The first failure, as [`RecordError::Incomplete`]; nothing more is
    /// written after it.
    fn fail(&mut self, e: Error) {
        if self.error.is_none() {
            let at = self.out.take().map_or(0, |o| o.offset());
            self.error = Some(incomplete(&self.launch.trace, at, e));
        }
    }

    fn batch(&mut self, b: Batch<'_>) {
        // After a failure the program still runs to its end: keep draining
        // so it never blocks, but write nothing more.
        if self.error.is_none() {
            if let Err(e) = self.take(b) {
                self.fail(e);
            }
        }
    }

    fn take(&mut self, b: Batch<'_>) -> Result<()> {
        if let Some(d) = self.deferred.iter_mut().find(|d| d.slot == b.slot) {
            d.drained.push(&b);
            return Ok(());
        }
        if !self.slots.contains_key(&b.slot) {
            // Created by a slot whose stream has not started (yet): wait
            // for the end of the pass ([`Self::start_deferred`]).
            if let Some((_, parent)) = first_record(b.bytes) {
                if parent != u32::MAX && !self.slots.contains_key(&parent) {
                    self.deferred.push(Deferred {
                        slot: b.slot,
                        pid: b.pid,
                        tid: b.tid,
                        runtime: b.runtime,
                        image: b.image,
                        serial: b.serial,
                        drained: Drained::of(&b),
                    });
                    return Ok(());
                }
            }
            let thread = self.start_thread(&b)?;
            self.slots.insert(
                b.slot,
                Slot {
                    thread,
                    drained: Drained::default(),
                    open: None,
                },
            );
        }
        let s = self
            .slots
            .get_mut(&b.slot)
            .expect("slot inserted just above");
        if s.drained.buf.is_empty() && records_values(self.launch) {
            // Copied once, straight into the open chunk: closing it only
            // hands it to the pool (`crate::encode`), so there is no
            // compression to keep out of the pass.
            return self.feed_batch(b.slot, b.bytes, b.values, b.witnesses);
        }
        s.drained.push(&b);
        // Compressed after the pass ([`Self::compress_drained`]); this only
        // bounds the memory of a pass that keeps finding sealed halves.
        if s.drained.buf.len() >= 4 * CHUNK_BYTES {
            self.feed(b.slot)?;
        }
        Ok(())
    }

    /// Every slot's drained bytes into its open chunk. Called after a
    /// drain pass, not from inside it: the pass hands each sealed half
    /// back as soon as it is copied, so the program fills it again while
    /// we compress (compressing inside the pass kept the half FULL and
    /// could block the writer for the whole compression).
    fn compress_drained(&mut self) {
        if self.error.is_some() {
            return;
        }
        let drained: Vec<u32> = self
            .slots
            .iter()
            .filter(|(_, s)| !s.drained.buf.is_empty())
            .map(|(k, _)| *k)
            .collect();
        for slot in drained {
            if let Err(e) = self.feed(slot) {
                self.fail(e);
                return;
            }
        }
    }

    /// THREAD_START for a slot's first bytes (and the modules, for the very
    /// first). The first record names the creator: THREAD(0xFFFFFFFF) is a
    /// program's initial thread, THREAD(slot) a new thread, FORK(slot) a
    /// new process.
    fn start_thread(&mut self, b: &Batch<'_>) -> Result<ThreadId> {
        let first = first_record(b.bytes);
        let bad = || {
            Error::from(RecordError::StreamStart {
                slot: b.slot,
                pid: b.pid,
                tid: b.tid,
                start: b.bytes[..b.bytes.len().min(6)].to_vec(),
            })
        };
        let (kind, parent_slot) = first.ok_or_else(bad)?;
        let thread = ThreadId(self.threads.len() as u32);
        let mut notes = Vec::new();
        // A new image of the traced executable: its modules follow the
        // stream's THREAD_START.
        let mut known_image = false;
        let (reason, parent) = match RecordKind::from_byte(kind) {
            Some(RecordKind::Thread) if parent_slot == u32::MAX => {
                if self.threads.is_empty() {
                    self.write_modules(b)?;
                    (StartReason::Main, None)
                } else {
                    known_image = self.is_executable(b);
                    let prev = self.threads.iter().rposition(|t| t.pid == b.pid);
                    let how = match prev {
                        Some(_) => "process exec'd an instrumented program",
                        None => "an instrumented program started by an untraced process",
                    };
                    if !known_image {
                        notes.push(format!(
                            "thread {thread} (pid {}): {how} (runtime at {:#x}) whose modules the recorder does not know",
                            b.pid, b.runtime
                        ));
                    }
                    match prev {
                        Some(prev) => {
                            // The same process initialised a runtime
                            // again: it exec'd an instrumented program.
                            for t in self.threads.iter_mut().filter(|t| t.pid == b.pid) {
                                t.exec = true;
                            }
                            (StartReason::Exec, Some(ThreadId(prev as u32)))
                        }
                        None => self.spawned(b),
                    }
                }
            }
            Some(k @ (RecordKind::Thread | RecordKind::Fork)) => {
                let p = self.last.get(&parent_slot).copied().ok_or_else(|| {
                    Error::from(RecordError::UnknownParent {
                        slot: b.slot,
                        pid: b.pid,
                        tid: b.tid,
                        parent: parent_slot,
                    })
                })?;
                let reason = if k == RecordKind::Fork {
                    StartReason::Fork
                } else {
                    StartReason::Thread
                };
                (reason, Some(p))
            }
            _ => return Err(bad()),
        };
        let out = self.writer()?;
        out.thread_start(&ThreadStart {
            thread,
            parent,
            os_tid: b.tid,
            pid: b.pid,
            reason,
        })
        .map_err(|e| trace_err(&self.launch.trace, e))?;
        if known_image {
            self.serials.insert(b.serial, (thread, b.image));
            self.write_image(thread, b.image, 0, (b.pid, b.runtime))?;
        }
        for n in notes {
            self.writer()?
                .note(None, &n)
                .map_err(|e| trace_err(&self.launch.trace, e))?;
        }
        self.threads.push(Thread {
            pid: b.pid,
            chunks: 0,
            exec: false,
        });
        self.last.insert(b.slot, thread);
        Ok(thread)
    }

    /// MODULE, PROGRAM_DATABASE and NOTE sections of the main executable,
    /// once the main process's runtime address gives the load bias.
    fn write_modules(&mut self, b: &Batch<'_>) -> Result<()> {
        self.write_module(0, b.pid, b.runtime)
    }

    /// The libraries whose runtime attached since the last call: their
    /// address in the region's module table gives their load bias.
    fn libraries(&mut self, region: &Region) {
        let Some(pid) = self.threads.first().map(|t| t.pid) else {
            return;
        };
        if self.error.is_some() {
            return;
        }
        let ready: Vec<(usize, u64)> = self
            .libs_pending
            .iter()
            .map(|&i| (i, region.module_runtime(i as u32)))
            .filter(|&(_, rt)| rt != 0)
            .collect();
        for (i, rt) in ready {
            self.libs_pending.retain(|&j| j != i);
            if let Err(e) = self.write_module(i, pid, rt) {
                self.fail(e);
                return;
            }
        }
        if let Err(e) = self.image_libraries(region) {
            self.fail(e);
        }
    }

    /// The libraries that attached in the new images of the executable
    /// since the last call (the region's image library table): each a
    /// module of its image. Those of images the recorder does not know
    /// (another program) are left out, as their executables are.
    fn image_libraries(&mut self, region: &Region) -> Result<()> {
        for (serial, tag, rt) in region.image_libraries() {
            let Some(&(thread, image)) = self.serials.get(&serial) else {
                continue;
            };
            let lib = self.modules_of(image).get(tag as usize);
            let instrumented = lib.is_some_and(|m| {
                m.flags & module_flags::MAIN == 0 && m.flags & module_flags::INSTRUMENTED != 0
            });
            if !instrumented || self.image_libs.contains(&(serial, tag)) {
                continue;
            }
            self.image_libs.push((serial, tag));
            let pid = self.threads[thread.0 as usize].pid;
            self.write_image(thread, image, tag as usize, (pid, rt))?;
        }
        Ok(())
    }

    /// How stream `b` of a process the trace has not seen starts: an
    /// exec whose creator is the thread whose `posix_spawn` of an
    /// untraced libc the recorder answered with its copy (the child ran
    /// no traced code before its exec), else a main thread.
    fn spawned(&mut self, b: &Batch<'_>) -> (StartReason, Option<ThreadId>) {
        let spawner = (b.image != 0)
            .then(|| self.follower.spawner(b.image))
            .flatten()
            .and_then(|slot| self.last.get(&slot).copied());
        match spawner {
            Some(t) => (StartReason::Exec, Some(t)),
            None => (StartReason::Main, None),
        }
    }

    /// Whether the stream `b` starts runs a rewritten copy the recorder
    /// made (its runtime reports the copy's image id): the traced
    /// executable's (a program that execs itself, `/proc/self/exe`,
    /// `fexecve`), or one it made for an exec it followed.
    fn is_executable(&self, b: &Batch<'_>) -> bool {
        b.image != 0
            && (b.image == self.launch.modules[0].image_id
                || self.follower.images.contains_key(&b.image))
    }

    /// The modules of the program whose copy has image id `image`.
    fn modules_of(&self, image: u64) -> &[ModuleSpec] {
        modules_in(self.launch, &self.follower, image)
    }

    /// Answers the exec requests waiting, and notes the processes that
    /// run a program untraced.
    fn serve_execs(&mut self, drainer: &aetrace_runtime::Drainer<'_>) {
        for n in self.follower.serve(drainer) {
            let trace = &self.launch.trace;
            let r = self
                .writer()
                .and_then(|w| w.note(None, &n).map_err(|e| trace_err(trace, e)));
            if let Err(e) = r {
                self.fail(e);
            }
        }
    }

    /// MODULE and IMAGE sections of module `i` (its tag) in a new image
    /// of the program whose copy has image id `image`, whose first
    /// stream is `thread`, in process `pid`, at the load bias its runtime
    /// address `runtime` gives. It shares the program database of the
    /// launch's module `i` when that one is written (the executable's
    /// always is), or of the first module written for the same followed
    /// program and tag, else has its own (a library the first image never
    /// ran). Its id follows every module the launch may write.
    fn write_image(
        &mut self,
        thread: ThreadId,
        image: u64,
        i: usize,
        (pid, runtime): (u32, u64),
    ) -> Result<()> {
        let first = image == self.launch.modules[0].image_id;
        let m = &modules_in(self.launch, &self.follower, image)[i];
        let id = ModuleId((self.launch.modules.len() + self.images) as u32);
        let module = module_section(m, id, pid, runtime)?;
        let shared = if first {
            (!self.libs_pending.contains(&i)).then_some(ModuleId(i as u32))
        } else {
            self.followed_dbs.get(&(image, i as u32)).copied()
        };
        let trace = &self.launch.trace;
        let out = self
            .out
            .as_mut()
            .ok_or_else(|| Error::from(RecordError::TraceClosed))?;
        let w = |e| trace_err(trace, e);
        out.module(&module).map_err(w)?;
        if shared.is_none() {
            out.append_database(id, &m.db).map_err(w)?;
            if !first {
                self.followed_dbs.insert((image, i as u32), id);
                for n in &m.notes {
                    out.note(Some(id), n).map_err(w)?;
                }
            }
        }
        out.image(&Image {
            module: id,
            thread,
            database: shared,
            tag: i as u32,
        })
        .map_err(w)?;
        self.images += 1;
        Ok(())
    }

    /// MODULE, PROGRAM_DATABASE and NOTE sections of module `i`, whose
    /// runtime blob runs at `runtime` in process `pid`.
    fn write_module(&mut self, i: usize, pid: u32, runtime: u64) -> Result<()> {
        let trace = &self.launch.trace;
        let out = self
            .out
            .as_mut()
            .ok_or_else(|| Error::from(RecordError::TraceClosed))?;
        {
            let m = &self.launch.modules[i];
            let id = ModuleId(i as u32);
            let w = |e| trace_err(trace, e);
            out.module(&module_section(m, id, pid, runtime)?)
                .map_err(w)?;
            if m.flags & module_flags::INSTRUMENTED != 0 {
                out.append_database(id, &m.db).map_err(w)?;
            }
            for n in &m.notes {
                out.note(Some(id), n).map_err(w)?;
            }
        }
        Ok(())
    }

    fn writer(&mut self) -> Result<&mut TraceWriter<File>> {
        self.out
            .as_mut()
            .ok_or_else(|| Error::from(RecordError::TraceClosedAfterFailure))
    }

    /// A slot's drained bytes into its open chunks, batch by batch.
    fn feed(&mut self, slot: u32) -> Result<()> {
        let Some(s) = self.slots.get_mut(&slot) else {
            return Ok(());
        };
        let mut d = std::mem::take(&mut s.drained);
        let (mut from, mut vfrom) = (0, 0);
        let mut r = Ok(());
        for &(end, vend, witnesses) in &d.batches {
            r = d
                .buf
                .get(from..end)
                .zip(d.values.get(vfrom..vend))
                .ok_or_else(|| Error::from(RecordError::BatchOrder))
                .and_then(|(bytes, values)| self.feed_batch(slot, bytes, values, witnesses));
            if r.is_err() {
                break;
            }
            (from, vfrom) = (end, vend);
        }
        d.clear();
        if let Some(s) = self.slots.get_mut(&slot) {
            s.drained = d;
        }
        r
    }

    /// One batch into the slot's open chunk (opened if need be); the chunk
    /// is closed once it holds [`CHUNK_BYTES`]. `values`: the batch's
    /// VALUE offsets.
    fn feed_batch(
        &mut self,
        slot: u32,
        bytes: &[u8],
        values: &[usize],
        witnesses: u64,
    ) -> Result<()> {
        let Some(s) = self.slots.get_mut(&slot) else {
            return Ok(());
        };
        let thread = s.thread;
        let open = match &mut s.open {
            Some(c) => c,
            None => {
                let sink = match self.spare.pop() {
                    Some(e) => e,
                    None => new_sink(records_values(self.launch))?,
                };
                s.open.insert(OpenChunk {
                    sink,
                    data: Vec::new(),
                    raw_len: 0,
                    witnesses: 0,
                    unflushed: 0,
                    since: Instant::now(),
                })
            }
        };
        match &mut open.sink {
            Sink::Values { raw, values: at } => {
                at.extend(values.iter().map(|v| v + raw.len()));
                raw.extend_from_slice(bytes);
            }
            Sink::Zstd(enc) => {
                open.unflushed += bytes.len();
                let flush = open.unflushed >= FLUSH_BYTES;
                if flush {
                    open.unflushed = 0;
                }
                compress_into(enc, bytes, flush, &mut open.data).map_err(|source| {
                    RecordError::Zstd {
                        thread: Some(thread),
                        source,
                    }
                })?;
            }
        }
        open.raw_len += bytes.len() as u64;
        open.witnesses += witnesses;
        if open.raw_len >= CHUNK_BYTES as u64 {
            self.close(slot)?;
        }
        Ok(())
    }

    /// Ends a slot's open chunk and writes it as its thread's next CHUNK
    /// (with `--data`: hands it to the pool, and writes what the pool has
    /// done).
    fn close(&mut self, slot: u32) -> Result<()> {
        let Some(s) = self.slots.get_mut(&slot) else {
            return Ok(());
        };
        let Some(mut c) = s.open.take() else {
            return Ok(());
        };
        let thread = s.thread;
        let t = &mut self.threads[thread.0 as usize];
        let seq = t.chunks;
        t.chunks += 1;
        let data = match c.sink {
            Sink::Zstd(mut enc) => {
                // A finished frame leaves the encoder ready for the next one.
                let r = end_frame(&mut enc, &mut c.data);
                self.spare.push(Sink::Zstd(enc));
                r.map_err(|source| RecordError::Zstd {
                    thread: Some(thread),
                    source,
                })?;
                c.data
            }
            Sink::Values { raw, values } => {
                let job = Job {
                    thread,
                    seq,
                    witnesses: c.witnesses,
                    raw,
                    values,
                };
                self.encoding.submit(job, CHUNK_LEVEL);
                return self.append_encoded(IN_FLIGHT);
            }
        };
        self.append_chunk(&aetrace_format::EncodedChunk {
            thread,
            seq,
            raw_len: c.raw_len,
            witnesses: c.witnesses,
            codec: aetrace_format::Codec::Zstd,
            data,
        })
    }

    /// Writes the chunks the pool has encoded, in the order they closed;
    /// waits until at most `keep` are left to it.
    fn append_encoded(&mut self, keep: usize) -> Result<()> {
        for d in self.encoding.take(keep) {
            let (mut raw, mut values) = (d.raw, d.values);
            raw.clear();
            values.clear();
            self.spare.push(Sink::Values { raw, values });
            let chunk = d.chunk.map_err(|(thread, source)| RecordError::Zstd {
                thread: Some(thread),
                source,
            })?;
            if self.error.is_none() {
                self.append_chunk(&chunk)?;
            }
        }
        Ok(())
    }

    fn append_chunk(&mut self, chunk: &aetrace_format::EncodedChunk) -> Result<()> {
        let trace = &self.launch.trace;
        let out = self
            .out
            .as_mut()
            .ok_or_else(|| Error::from(RecordError::TraceClosed))?;
        out.append_chunk(chunk).map_err(|e| trace_err(trace, e))
    }

    /// Closes the chunks opened longer than [`CHUNK_AGE`] ago.
    fn flush_aged(&mut self) {
        if self.error.is_some() {
            return;
        }
        let old: Vec<u32> = self
            .slots
            .iter()
            .filter(|(_, s)| {
                s.open
                    .as_ref()
                    .is_some_and(|c| c.since.elapsed() >= CHUNK_AGE)
            })
            .map(|(k, _)| *k)
            .collect();
        for slot in old {
            if let Err(e) = self.close(slot) {
                self.fail(e);
                return;
            }
        }
    }

    /// Last chunks, THREAD_END for every thread, PROCESS_EXIT for every
    /// reaped process, END; after a failure, the failure
    /// ([`RecordError::Incomplete`]).
    fn finish(mut self, exits: &[ProcessExit]) -> Result<()> {
        let mut slots: Vec<u32> = self.slots.keys().copied().collect();
        slots.sort_unstable();
        for &slot in &slots {
            if self.error.is_some() {
                break;
            }
            if let Err(e) = self.feed(slot).and_then(|()| self.close(slot)) {
                self.fail(e);
            }
        }
        if self.error.is_none() {
            if let Err(e) = self.append_encoded(0) {
                self.fail(e);
            }
        }
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let trace = self.launch.trace.clone();
        let mut out = self
            .out
            .take()
            .ok_or_else(|| Error::from(RecordError::TraceClosed))?;
        let ends = self.write_ends(&mut out, exits);
        let at = out.offset();
        // No fsync: the trace is complete in the page cache, which the death
        // of any process leaves intact (as `perf record` and `rr` do); waiting
        // for the disk cost 0.4 to 5 ms per run, more than a short program.
        ends.and_then(|()| out.finish().map_err(|e| trace_err(&trace, e)))
            .map(drop)
            .map_err(|e| incomplete(&trace, at, e))
    }

    /// THREAD_END for every thread, PROCESS_EXIT for every reaped process,
    /// and the run's closing notes.
    fn write_ends(&self, out: &mut TraceWriter<File>, exits: &[ProcessExit]) -> Result<()> {
        let w = |e| trace_err(&self.launch.trace, e);
        for (i, t) in self.threads.iter().enumerate() {
            let killed = exits
                .iter()
                .any(|x| x.pid == t.pid && matches!(x.status, ExitStatus::Signaled { .. }));
            let reason = if t.exec {
                EndReason::Exec
            } else if killed {
                EndReason::Killed
            } else {
                EndReason::Exit
            };
            out.thread_end(ThreadId(i as u32), reason).map_err(w)?;
        }
        for x in exits {
            out.process_exit(x).map_err(w)?;
        }
        let in_images = |i: &usize| self.image_libs.iter().any(|&(_, t)| t as usize == *i);
        for &i in self.libs_pending.iter().filter(|i| !in_images(i)) {
            out.note(
                None,
                &format!(
                    "library {} (module {i}) ran no traced code in this run: its load address is unknown and the trace has no MODULE for it",
                    self.launch.modules[i].path.display()
                ),
            )
            .map_err(w)?;
        }
        if self.threads.is_empty() {
            out.note(
                None,
                "the program wrote no witnesses: it ran no instrumented code (is it a rewritten executable?)",
            )
            .map_err(w)?;
        }
        Ok(())
    }
}

/// The kind and the u32 payload of the record a stream starts with (a
/// THREAD or FORK record, if the stream is sound).
fn first_record(bytes: &[u8]) -> Option<(u8, u32)> {
    bytes
        .get(..6)
        .filter(|r| r[0] == ESCAPE)
        .map(|r| (r[1], u32::from_le_bytes([r[2], r[3], r[4], r[5]])))
}

/// A module records values (`--data`): the trace's chunks use the
/// `zstd+values` codec (`format::values`).
fn records_values(l: &Launch) -> bool {
    l.modules
        .iter()
        .any(|m| m.flags & module_flags::DATA_ABS != 0)
}

/// Compresses all of `raw` into the frame `enc` is writing, appending to `out`.
fn compress_into(
    enc: &mut zstd::stream::raw::Encoder<'static>,
    raw: &[u8],
    flush: bool,
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
    let mut input = InBuffer::around(raw);
    while input.pos() < raw.len() {
        out.reserve(zstd::zstd_safe::CCtx::out_size());
        let pos = out.len();
        enc.run(&mut input, &mut OutBuffer::around_pos(out, pos))?;
    }
    if flush {
        loop {
            out.reserve(zstd::zstd_safe::CCtx::out_size());
            let pos = out.len();
            if enc.flush(&mut OutBuffer::around_pos(out, pos))? == 0 {
                break;
            }
        }
    }
    Ok(())
}

/// A sink for a new chunk: the `zstd+split` codec's when values are
/// recorded, else a zstd frame.
fn new_sink(values: bool) -> Result<Sink> {
    if values {
        return Ok(Sink::Values {
            raw: Vec::new(),
            values: Vec::new(),
        });
    }
    chunk_encoder().map(Sink::Zstd).map_err(|source| {
        RecordError::Zstd {
            thread: None,
            source,
        }
        .into()
    })
}

/// A zstd frame encoder for control-only chunks.
fn chunk_encoder() -> std::io::Result<zstd::stream::raw::Encoder<'static>> {
    use zstd::zstd_safe::CParameter;
    let mut enc = zstd::stream::raw::Encoder::new(CHUNK_LEVEL)?;
    enc.set_parameter(CParameter::WindowLog(CHUNK_WINDOW_LOG))?;
    Ok(enc)
}

/// Ends the frame `enc` is writing, appending to `out`.
fn end_frame(
    enc: &mut zstd::stream::raw::Encoder<'static>,
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    use zstd::stream::raw::{Operation, OutBuffer};
    loop {
        out.reserve(zstd::zstd_safe::CCtx::out_size());
        let pos = out.len();
        if enc.finish(&mut OutBuffer::around_pos(out, pos), true)? == 0 {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_values_codec_knows_the_value_record() {
        use aetrace_format::values::{VALUE_LEN, VALUE_PREFIX};
        assert_eq!(VALUE_PREFIX, [ESCAPE, RecordKind::Value as u8]);
        assert_eq!(VALUE_LEN as u64, RecordKind::Value.encoded_len());
    }

    /// A batch of `slot` starting with record `kind` naming `parent`, then
    /// one witness.
    fn first(slot: u32, kind: RecordKind, parent: u32) -> Vec<u8> {
        let mut v = vec![ESCAPE, kind as u8];
        v.extend(parent.to_le_bytes());
        v.push(1 + slot as u8);
        v
    }

    /// The recorder's side of slot reuse, batch by batch: a stream that
    /// names a creator's slot whose stream starts later in the same pass
    /// (a lower slot, freed by a reclaim) waits for it; a slot whose
    /// thread was reclaimed starts a new thread at its next batch; a
    /// record naming a reclaimed slot stands for its last thread. Checked
    /// on the trace read back: parents, and each stream whole in its own
    /// thread.
    #[test]
    fn reused_slots_start_new_threads_with_their_creators_as_parents() {
        let dir = std::env::temp_dir().join(format!("aetrace-reuse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let trace = dir.join("t.aet");
        let launch = Launch {
            program: PathBuf::from("/bin/true"),
            native_path: None,
            argv0: "true".into(),
            args: Vec::new(),
            env: Vec::new(),
            trace: trace.clone(),
            modules: vec![ModuleSpec {
                path: PathBuf::from("/original/prog"),
                build_id: vec![1],
                flags: module_flags::MAIN | module_flags::INSTRUMENTED,
                size: 0x10000,
                db: aetrace_format::compress_database(9, b"db", 3).unwrap(),
                runtime_vaddr: 0x3000,
                image_id: 0,
                notes: Vec::new(),
            }],
            geometry: Launch::DEFAULT_GEOMETRY,
            follow: None,
        };
        let out = TraceWriter::create(&trace, &Header::new(CREATOR, 0).unwrap()).unwrap();
        let mut rec = Recorder::new(&launch, out);
        let pass = |rec: &mut Recorder<'_>, batches: &[(u32, Vec<u8>)]| {
            for (slot, bytes) in batches {
                rec.take(Batch {
                    slot: *slot,
                    pid: 100,
                    tid: 100 + bytes[6] as u32,
                    runtime: 0x7000,
                    image: 0,
                    serial: 0,
                    bytes,
                    witnesses: 1,
                    values: &[],
                })
                .unwrap();
            }
            rec.start_deferred();
        };
        let (t, max) = (RecordKind::Thread, u32::MAX);
        // Threads 0 (main, slot 0), 1 (A, slot 1), 2 (B, slot 2).
        pass(
            &mut rec,
            &[
                (0, first(0, t, max)),
                (1, first(1, t, 0)),
                (2, first(2, t, 0)),
            ],
        );
        rec.end_stream(1).unwrap(); // A exited: slot 1 reclaimed
                                    // D (slot 1) created by E (slot 3, created by B), read first.
        pass(&mut rec, &[(1, first(1, t, 3)), (3, first(3, t, 2))]);
        rec.end_stream(2).unwrap(); // B exited
                                    // F names slot 2, free since B exited: B. G, a fork child of X
                                    // (slot 6, created by D), is read before X.
        let f = RecordKind::Fork;
        pass(
            &mut rec,
            &[
                (4, first(4, t, 2)),
                (5, first(5, f, 6)),
                (6, first(6, t, 1)),
            ],
        );
        rec.end_stream(6).unwrap(); // X exited
        rec.end_stream(1).unwrap(); // D's process exited
                                    // H, a fork child of D that took D's slot, names its own slot: D;
                                    // it starts first, though I (a fork child of X) waits with it.
        pass(&mut rec, &[(1, first(1, f, 1)), (7, first(7, f, 6))]);
        assert!(rec.deferred.is_empty());
        assert!(rec.error.is_none());
        rec.finish(&[]).unwrap();
        let read = aetrace_format::Trace::parse(std::fs::read(&trace).unwrap()).unwrap();
        read.require_complete().unwrap();
        let got: Vec<(Option<u32>, Vec<u8>)> = read
            .threads()
            .map(|th| {
                let stream: Vec<u8> = read
                    .chunks(th.start.thread)
                    .flat_map(|c| c.decompress().unwrap())
                    .collect();
                (th.start.parent.map(|p| p.0), stream)
            })
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            got,
            vec![
                (None, first(0, t, max)),
                (Some(0), first(1, t, 0)),
                (Some(0), first(2, t, 0)),
                (Some(2), first(3, t, 2)), // E, started before D
                (Some(3), first(1, t, 3)), // D
                (Some(4), first(6, t, 1)), // X
                (Some(2), first(4, t, 2)), // F
                (Some(5), first(5, f, 6)), // G
                (Some(4), first(1, f, 1)), // H
                (Some(5), first(7, f, 6)), // I
            ]
        );
    }
}
