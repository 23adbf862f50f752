//! Exec following (issue 23, point 4): a program a traced process execs
//! runs traced too, an ELF executable or a `#!` script's interpreter, as
//! valgrind's `--trace-children=yes` follows it.
//!
//! The runtime's `exec_request` (before a call of libc's exec family from
//! traced code, or an `execve`/`execveat` system call in traced code)
//! hands the call's registers to the recorder through its slot and waits
//! (`docs/runtime.md` section 7, "exec"). Here the recorder reads the
//! call's arguments from the process's memory (`process_vm_readv`: the
//! recorder is an ancestor of every recorded process), resolves the
//! program as the kernel and libc would (the `p` variants' `PATH` search
//! in the process's current environment, `#!` lines through
//! [`crate::script`], names relative to the process's working
//! directory), rewrites it with the run's options (cached per device,
//! inode and modification time for the run, and on disk as every
//! rewrite is), and writes into the stack bytes the request lends the
//! `execve` that runs the copy: the copy's path, the native argv (the
//! program's own array, or for a script the kernel's: interpreter,
//! optional argument, script path, the rest) and the native envp.
//!
//! A `posix_spawn(p)` call of an untraced libc is asked about the same
//! way before the call: its program is resolved where the child would
//! exec it (the file actions' `chdir`/`fchdir`, [`spawn_dir`]), and the
//! answer goes to the slot's spawn buffer, whence the runtime gives the
//! call the copy's path and argv. A traced libc's is not followed at
//! the call: its child asks at its own `execve`. The runtime's own
//! `posix_spawn` of the shell, in place of an untraced libc's `system`
//! or `popen` ([`ExecKind::Shell`]), is asked about the same way; its answer also
//! gives the process's current environment and the addresses of the
//! libc functions the runtime calls ([`Mem::functions`]).
//!
//! Invariants: every request is answered, also when nothing can be
//! followed (answer 0: the program's own call runs, failing with its
//! native errno or running the program untraced), so no process waits
//! for ever; an exec that runs a program untraced leaves a note saying
//! which process and why; the answer is written only inside the lent
//! bytes ([`EXEC_BUF_SIZE`], or [`SPAWN_BUF_SIZE`] for a spawn).

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use std::os::fd::{AsRawFd, OwnedFd};

use aetrace_runtime::layout::{
    ExecKind, EXEC_BUF_SIZE, H_EXEC_CWD, SHELL_FUNCTIONS, SPAWN_BACK_FLAGS, SPAWN_BUF_SIZE,
};
use aetrace_runtime::{Drainer, ExecRequest};

use crate::commands::{rewrite_program, Follow, Rewritten};
use crate::execname;
use crate::launch::ModuleSpec;
use crate::script::{follow_at, Invocation};

const SYS_EXECVE: u64 = 59;
const SYS_EXECVEAT: u64 = 322;
const AT_FDCWD: i32 = -100;
const AT_EMPTY_PATH: u64 = 0x1000;
/// The kernel's `MAX_ARG_STRLEN`: a longer argument fails natively.
const MAX_STRING: usize = 32 * 4096;
/// Arguments read at most (the kernel's limit is the stack's size).
const MAX_ARGS: usize = 1 << 20;
/// glibc's `PATH` when the variable is unset (`execvp`).
const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";

/// The recorder's side of exec following.
pub(crate) struct Follower {
    /// How programs are rewritten; `None`: nothing is followed.
    how: Option<Follow>,
    /// The run's rewrites by the executable's device, inode and
    /// modification time (a refusal kept as its reason).
    rewrites: HashMap<(u64, u64, i64, i64), Result<Rewritten, String>>,
    /// The modules of each rewritten program, by its image id.
    pub(crate) images: HashMap<u64, Vec<ModuleSpec>>,
    /// The spawns answered with a copy whose child's stream has not
    /// started yet: the copy's image id and the asking thread's slot.
    spawns: Vec<(u64, u32)>,
    /// The directories of the processes that exec a copy by a name of
    /// the native path's length, until their new image is back there:
    /// the header entry ([`EXEC_CWDS`]), the pid, the descriptor.
    cwds: Vec<(u32, u32, OwnedFd)>,
}

/// A followed exec run by a name of the native path's length
/// ([`execname::followed`]).
struct Renamed {
    /// The directory of names.
    dir: PathBuf,
    /// The name to exec there.
    twin: std::ffi::CString,
}

/// Why an exec runs as the program called it.
enum Native {
    /// Nothing to say: it fails with its native errno, or runs a copy
    /// the recorder made, traced already.
    AsCalled,
    /// It runs a program untraced: the trace says why.
    Untraced(String),
}

/// The arguments of the intercepted call.
struct Call {
    /// The file as the program named it.
    name: Vec<u8>,
    /// Where a relative name starts, as the recorder opens it.
    dir: PathBuf,
    /// `execvp` and its kin: a name without `/` is searched on `PATH`.
    search: bool,
    argv: Argv,
    /// The new program's environment (its address in the process).
    envp: u64,
    /// Bytes lent for the answer.
    room: u64,
    /// Whether the copy may be exec'd by a name of the native path's
    /// length from a directory of names: an exec in the process's own
    /// directory (not a spawn, not `execveat` from another directory,
    /// whose native `AT_EXECFN` is `/dev/fd/N/NAME`).
    renamable: bool,
    /// For the runtime's spawn of the shell: libc's
    /// [`SHELL_FUNCTIONS`], the answer's sixth word.
    functions: Option<Vec<u64>>,
    /// A spawn's file actions, as the child will run them (none for a
    /// NULL `file_actions`); `None`: not a spawn.
    actions: Option<Vec<Action>>,
}

/// A glibc file action (`struct __spawn_action`), its bytes.
type Action = [u8; SPAWN_ACTION_SIZE as usize];

enum Argv {
    /// An argv array in the process.
    Array(u64),
    /// `execl`'s arguments, the pointers themselves.
    List(Vec<u64>),
}

impl Follower {
    pub(crate) fn new(how: Option<Follow>) -> Follower {
        Follower {
            how,
            rewrites: HashMap::new(),
            images: HashMap::new(),
            spawns: Vec::new(),
            cwds: Vec::new(),
        }
    }

    /// The slot of the thread whose `posix_spawn` started a stream of a
    /// copy with image id `image` in a process the trace has not seen
    /// (the oldest such spawn), if one did.
    pub(crate) fn spawner(&mut self, image: u64) -> Option<u32> {
        let i = self.spawns.iter().position(|&(im, _)| im == image)?;
        Some(self.spawns.remove(i).1)
    }

    /// Answers every waiting exec request; returns the notes on processes
    /// that run a program untraced.
    pub(crate) fn serve(&mut self, drainer: &Drainer<'_>) -> Vec<String> {
        let mut notes = Vec::new();
        self.tidy(drainer);
        for req in drainer.exec_requests() {
            let answer = match self.answer(&req, drainer) {
                Ok((at, image)) => {
                    if ExecKind::from_u32(req.kind).is_some_and(ExecKind::spawns) {
                        self.spawns.push((image, req.slot));
                    }
                    at
                }
                Err(Native::AsCalled) => 0,
                Err(Native::Untraced(why)) => {
                    notes.push(format!("process {} execs untraced: {why}", req.pid));
                    0
                }
            };
            drainer.answer_exec(req.slot, answer);
        }
        notes
    }

    /// The answer's address and the copy's image id.
    fn answer(&mut self, req: &ExecRequest, drainer: &Drainer<'_>) -> Result<(u64, u64), Native> {
        let Some(how) = self.how.clone() else {
            return Err(Native::AsCalled);
        };
        let mem = Mem(req.pid as libc::pid_t);
        let call = Call::decode(req, &mem)?;
        let own = PathBuf::from(format!("/proc/{}", req.pid));
        // The process's `/proc/self` is not ours.
        let at = |p: &Path| match p.strip_prefix("/proc/self") {
            Ok(rest) => own.join(rest),
            Err(_) => call.dir.join(p),
        };
        let (name, opened) = locate(&call, &mem, &at)?;
        let script = head(&opened).starts_with(b"#!");
        let inv = if script {
            let argv = mem.strings(&call.argv)?;
            let (argv0, args) = argv.split_first().ok_or(Native::AsCalled)?;
            let inv = Invocation {
                exe: PathBuf::from(OsString::from_vec(name.clone())),
                argv0: argv0.clone(),
                args: args.to_vec(),
            };
            // A bad interpreter fails natively (ENOENT, EACCES, ELOOP).
            Some(follow_at(inv, &at).map_err(|_| Native::AsCalled)?)
        } else {
            None
        };
        let exe = inv.as_ref().map_or_else(|| opened.clone(), |i| at(&i.exe));
        if !head(&exe).starts_with(b"\x7fELF") {
            return Err(Native::Untraced(format!(
                "{} is neither an ELF executable nor a #! script",
                exe.display()
            )));
        }
        // A copy the recorder made (`/proc/self/exe`, the copy's own
        // path) is traced as it is.
        let real = std::fs::canonicalize(&exe).map_err(|_| Native::AsCalled)?;
        if std::fs::canonicalize(crate::commands::cache_dir()).is_ok_and(|c| real.starts_with(c)) {
            return Err(Native::AsCalled);
        }
        let copy = self.rewrite(&real, how)?;
        let kept = (call.renamable)
            .then(|| rename(&mem, &call, &name, &copy.elf, &real, None))
            .flatten()
            .and_then(|r| Some((r, self.cwd_entry(req.pid, drainer)?)));
        // Actions that leave room for the rest of the answer; a name
        // `posix_spawnp` would not search.
        let spawned = (call.actions.as_ref())
            .filter(|acts| acts.len() <= RENAMED_ACTIONS)
            .filter(|_| !call.search || name.contains(&b'/'))
            .and_then(|acts| {
                let fd = free_fd(req.pid, acts)?;
                let r = rename(&mem, &call, &name, &copy.elf, &real, Some(fd))?;
                Some((r, fd, acts))
            });
        let mut w = Answer::new(req.buf);
        let twin = (kept.as_ref().map(|k| &k.0)).or(spawned.as_ref().map(|s| &s.0));
        let path = match twin {
            Some(r) => w.string(r.twin.as_bytes()),
            None => w.string(copy.elf.as_os_str().as_bytes()),
        };
        let argv = match (&inv, &call.argv) {
            (None, Argv::Array(p)) => *p,
            (None, Argv::List(list)) => w.pointers(list),
            (Some(inv), _) => {
                let list: Vec<u64> = std::iter::once(&inv.argv0)
                    .chain(&inv.args)
                    .map(|a| w.string(a.as_bytes()))
                    .collect();
                w.pointers(&list)
            }
        };
        let [dir, back, entry, fd] = match (&kept, &spawned) {
            (Some((r, (i, fd))), _) => {
                let back = format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd());
                [
                    w.string(r.dir.as_os_str().as_bytes()),
                    w.string(back.as_bytes()),
                    H_EXEC_CWD + 8 * u64::from(*i),
                    0,
                ]
            }
            // The directory and N too, for a caller whose own actions the
            // request does not carry (`popen`): it adds the way back.
            (None, Some((r, fd, acts))) => {
                let dir = w.string(r.dir.as_os_str().as_bytes());
                [w.actions(acts, *fd, dir), dir, 0, u64::from(*fd)]
            }
            (None, None) => [0; 4],
        };
        let entry = call.functions.as_ref().map_or(entry, |f| w.pointers(f));
        w.head([path, argv, call.envp, dir, back, entry, fd]);
        if w.bytes.len() as u64 > call.room {
            return Err(Native::Untraced(format!(
                "the exec of {} needs {} bytes of arguments, more than the {} the runtime lends",
                exe.display(),
                w.bytes.len(),
                call.room
            )));
        }
        if spawned.is_some() {
            // Before the answer: the child's `init` looks for the link.
            drainer.spawn_names();
        }
        mem.write(req.buf, &w.bytes)
            .ok_or_else(|| Native::Untraced("its memory cannot be written".into()))?;
        if let Some((_, (i, fd))) = kept {
            drainer.set_exec_cwd(i, req.pid, fd.as_raw_fd() as u32);
            // The process's earlier entry, if any, is this one: its
            // descriptor is closed.
            self.cwds.retain(|c| c.0 != i);
            self.cwds.push((i, req.pid, fd));
        }
        Ok((req.buf, copy.modules[0].image_id))
    }

    /// A free entry of the directory table for process `pid` (its own if
    /// it has one) and a descriptor of its working directory; None when
    /// the table is full or the directory cannot be opened.
    fn cwd_entry(&self, pid: u32, drainer: &Drainer<'_>) -> Option<(u32, OwnedFd)> {
        let (i, _, _) = drainer
            .exec_cwds()
            .into_iter()
            .find(|&(i, p, _)| p == pid || (p == 0 && !self.cwds.iter().any(|c| c.0 == i)))?;
        let cwd = std::fs::File::open(format!("/proc/{pid}/cwd")).ok()?;
        Some((i, OwnedFd::from(cwd)))
    }

    /// Closes the descriptors of the directories the new images went
    /// back to (their entry cleared) or whose process is gone (its entry
    /// cleared here).
    fn tidy(&mut self, drainer: &Drainer<'_>) {
        if self.cwds.is_empty() {
            return;
        }
        let table = drainer.exec_cwds();
        self.cwds.retain(|&(i, pid, _)| {
            let back = table[i as usize].1 != pid;
            let gone = !Path::new(&format!("/proc/{pid}")).exists();
            if gone && !back {
                drainer.set_exec_cwd(i, 0, 0);
            }
            !(back || gone)
        });
    }

    /// The rewritten copy of `exe`, a canonical path (from the run's
    /// cache, or made now).
    fn rewrite(&mut self, exe: &Path, how: Follow) -> Result<Rewritten, Native> {
        let meta = std::fs::metadata(exe).map_err(|_| Native::AsCalled)?;
        let key = (meta.dev(), meta.ino(), meta.mtime(), meta.mtime_nsec());
        let made = (self.rewrites.entry(key))
            .or_insert_with(|| rewrite_program(exe, &how).map_err(|e| e.to_string()));
        match made {
            Ok(r) => {
                self.images
                    .entry(r.modules[0].image_id)
                    .or_insert_with(|| r.modules.clone());
                Ok(r.clone())
            }
            Err(why) => Err(Native::Untraced(format!("{}: {why}", exe.display()))),
        }
    }
}

impl Call {
    fn decode(req: &ExecRequest, mem: &Mem) -> Result<Call, Native> {
        let [rdi, rsi, rdx, rcx, r8, r9, r10, rax] = req.args;
        let cwd = cwd_of(req.pid);
        let kind = ExecKind::from_u32(req.kind).ok_or(Native::AsCalled)?;
        let environ = || {
            mem.environ()
                .ok_or_else(|| Native::Untraced("its environment cannot be found".into()))
        };
        let list = |envp: bool| -> Result<(Argv, Option<u64>), Native> {
            let mut words = vec![rsi, rdx, rcx, r8, r9]
                .into_iter()
                .chain((0..MAX_ARGS as u64).map_while(|i| mem.u64(req.sp + 8 * i)));
            let list: Vec<u64> = words.by_ref().take_while(|&p| p != 0).collect();
            let env = if envp {
                Some(words.next().ok_or(Native::AsCalled)?)
            } else {
                None
            };
            Ok((Argv::List(list), env))
        };
        let (name, argv, envp, search, dir) = match kind {
            ExecKind::Syscall if rax == SYS_EXECVE => (rdi, Argv::Array(rsi), rdx, false, cwd),
            ExecKind::Syscall if rax == SYS_EXECVEAT => {
                let dir = match rdi as i32 {
                    AT_FDCWD => cwd,
                    fd => PathBuf::from(format!("/proc/{}/fd/{fd}", req.pid)),
                };
                if r8 & AT_EMPTY_PATH != 0 && mem.string(rsi).is_some_and(|n| n.is_empty()) {
                    return Err(Native::Untraced(
                        "execveat of a descriptor is not followed".into(),
                    ));
                }
                (rsi, Argv::Array(rdx), r10, false, dir)
            }
            ExecKind::Syscall => return Err(Native::AsCalled),
            ExecKind::Execve => (rdi, Argv::Array(rsi), rdx, false, cwd),
            ExecKind::Execv => (rdi, Argv::Array(rsi), environ()?, false, cwd),
            ExecKind::Execvp => (rdi, Argv::Array(rsi), environ()?, true, cwd),
            ExecKind::Execvpe => (rdi, Argv::Array(rsi), rdx, true, cwd),
            ExecKind::Execl | ExecKind::Execlp => {
                let (argv, _) = list(false)?;
                (rdi, argv, environ()?, kind == ExecKind::Execlp, cwd)
            }
            ExecKind::Execle => {
                let (argv, envp) = list(true)?;
                (rdi, argv, envp.unwrap_or(0), false, cwd)
            }
            ExecKind::Fexecve => {
                return Err(Native::Untraced("fexecve is not followed".into()));
            }
            ExecKind::Spawn | ExecKind::Spawnp => return Call::spawn(req, mem, kind),
            ExecKind::Shell => return Call::shell(req, mem),
        };
        Ok(Call {
            name: mem.string(name).ok_or(Native::AsCalled)?,
            renamable: dir == cwd_of(req.pid),
            dir,
            search,
            argv,
            envp,
            room: EXEC_BUF_SIZE,
            functions: None,
            actions: None,
        })
    }

    /// `posix_spawn(pid, path, file_actions, attr, argv, envp)` of an
    /// untraced libc (a traced one's child asks at its `execve`).
    fn spawn(req: &ExecRequest, mem: &Mem, kind: ExecKind) -> Result<Call, Native> {
        let [_, path, actions, _, argv, envp, _, _] = req.args;
        if mem.libc_traced() {
            return Err(Native::AsCalled);
        }
        let actions = spawn_actions(actions, mem)?;
        Ok(Call {
            name: mem.string(path).ok_or(Native::AsCalled)?,
            dir: spawn_dir(req.pid, &actions, mem)?,
            search: kind == ExecKind::Spawnp,
            argv: Argv::Array(argv),
            envp,
            room: SPAWN_BUF_SIZE,
            renamable: false,
            functions: None,
            actions: Some(actions),
        })
    }

    /// The runtime's `posix_spawn(pid, "/bin/sh", NULL, attr, argv, _)`
    /// in place of `system` or `popen`: in the current environment
    /// (`environ`, as glibc's `system` and `popen` pass it), with libc's
    /// functions.
    fn shell(req: &ExecRequest, mem: &Mem) -> Result<Call, Native> {
        let mut call = Call::spawn(req, mem, ExecKind::Spawn)?;
        call.envp = mem
            .environ()
            .ok_or_else(|| Native::Untraced("its environment cannot be found".into()))?;
        call.functions = Some(mem.functions(&SHELL_FUNCTIONS).ok_or_else(|| {
            Native::Untraced(format!("its libc lacks one of {SHELL_FUNCTIONS:?}"))
        })?);
        Ok(call)
    }
}

/// Process `pid`'s working directory, as the recorder opens it.
fn cwd_of(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/cwd"))
}

/// The directory of names and the name by which the exec of `name` (as
/// execve gets it, the native `AT_EXECFN`) runs `copy` of `original`
/// (canonical), for a spawn's child going back through descriptor
/// `spawn_fd`, unless the
/// loader of the new image would read its working directory (the exec's
/// own environment, [`execname::loader_reads_cwd`]) or no name fits.
fn rename(
    mem: &Mem,
    call: &Call,
    name: &[u8],
    copy: &Path,
    original: &Path,
    spawn_fd: Option<u32>,
) -> Option<Renamed> {
    let env = mem.array(call.envp)?.into_iter().map(|p| {
        let s = mem.string(p)?;
        let eq = s.iter().position(|&b| b == b'=').unwrap_or(s.len());
        let (k, v) = s.split_at(eq);
        Some((k.to_vec(), v.get(1..).unwrap_or_default().to_vec()))
    });
    if execname::loader_reads_cwd(&env.collect::<Option<Vec<_>>>()?) {
        return None;
    }
    let copy = copy.canonicalize().ok()?;
    let cache = crate::commands::cache_dir();
    let (dir, twin) = execname::followed(&cache, &copy, original, name, spawn_fd)?;
    Some(Renamed { dir, twin })
}

/// glibc's file action tags (`posix/spawn_int.h`, `struct
/// __spawn_action`: a u32 tag, the union at 8, 32 bytes each).
const SPAWN_DO_CLOSE: u32 = 0;
const SPAWN_DO_DUP2: u32 = 1;
const SPAWN_DO_OPEN: u32 = 2;
const SPAWN_DO_CHDIR: u32 = 3;
const SPAWN_DO_FCHDIR: u32 = 4;
const SPAWN_DO_CLOSEFROM: u32 = 5;
const SPAWN_DO_TCSETPGRP: u32 = 6;
const SPAWN_ACTION_SIZE: u64 = 32;
/// File actions read at most (more: the spawn runs untraced).
const MAX_ACTIONS: u64 = 1 << 16;
/// File actions of a spawn whose child runs by a name of the native
/// path's length at most (their copy, 2 KiB, goes into the answer).
const RENAMED_ACTIONS: usize = 64;

/// The file actions at `actions` (a `posix_spawn_file_actions_t`: i32
/// allocated, i32 used, the actions' address at 8; NULL: none), each
/// action's bytes.
fn spawn_actions(actions: u64, mem: &Mem) -> Result<Vec<Action>, Native> {
    if actions == 0 {
        return Ok(Vec::new());
    }
    let unreadable = || Native::Untraced("its spawn file actions cannot be read".into());
    let used = mem.u64(actions).ok_or_else(unreadable)? >> 32;
    let list = mem.u64(actions + 8).ok_or_else(unreadable)?;
    let len = (used <= MAX_ACTIONS).then_some(used * SPAWN_ACTION_SIZE);
    let bytes = mem.read(list, len.ok_or_else(unreadable)? as usize);
    let bytes = bytes.ok_or_else(unreadable)?;
    let each = bytes.chunks_exact(SPAWN_ACTION_SIZE as usize);
    Ok(each
        .map(|a| a.try_into().expect("chunks of the size"))
        .collect())
}

/// An action's tag and its union's first two i32s (a descriptor, and a
/// `dup2`'s second).
fn action_fields(a: &Action) -> (u32, i32, i32) {
    let word = |at: usize| u32::from_le_bytes(a[at..at + 4].try_into().expect("four bytes"));
    (word(0), word(8) as i32, word(12) as i32)
}

/// The directory a spawn child resolves a relative name in when it
/// execs: the parent's, changed by the file actions `actions` as the
/// child runs them. An `fchdir` to a descriptor an earlier action made
/// or closed is not followed (the child's descriptor is not the
/// parent's), nor is an action glibc 2.36 does not have. (A name is
/// resolved before the child runs its actions: an `open` that creates
/// the program is not seen.)
fn spawn_dir(pid: u32, actions: &[Action], mem: &Mem) -> Result<PathBuf, Native> {
    let mut dir = PathBuf::from(format!("/proc/{pid}/cwd"));
    let unreadable = || Native::Untraced("its spawn file actions cannot be read".into());
    // Descriptors an earlier action made or closed, and those from a
    // `closefrom`'s on.
    let (mut touched, mut from) = (Vec::new(), i32::MAX);
    for (i, a) in actions.iter().enumerate() {
        let (tag, fd, newfd) = action_fields(a);
        match tag {
            SPAWN_DO_CLOSE | SPAWN_DO_OPEN => touched.push(fd),
            SPAWN_DO_CLOSEFROM => from = from.min(fd),
            SPAWN_DO_DUP2 => touched.push(newfd),
            SPAWN_DO_TCSETPGRP => {}
            SPAWN_DO_CHDIR => {
                let at = u64::from_le_bytes(a[8..16].try_into().expect("eight bytes"));
                let to = mem.string(at).ok_or_else(unreadable)?;
                dir = dir.join(std::ffi::OsStr::from_bytes(&to));
            }
            SPAWN_DO_FCHDIR if !touched.contains(&fd) && fd < from => {
                dir = PathBuf::from(format!("/proc/{pid}/fd/{fd}"));
            }
            _ => {
                return Err(Native::Untraced(format!(
                    "its spawn file action {i} (tag {tag}) is not followed"
                )))
            }
        }
    }
    Ok(dir)
}

/// A descriptor number free in the child of a spawn by process `pid`
/// with file actions `actions` once they ran, for the `open` of the
/// directory to go back to: above every descriptor open in the process
/// and every one an action names, below its `RLIMIT_NOFILE` (the child's
/// `dup2` fails at or above it). None when there is none. (Another
/// thread may open that number between this look and the spawn: the
/// child then loses that descriptor.)
fn free_fd(pid: u32, actions: &[Action]) -> Option<u32> {
    let open = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    let open = open.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok());
    let named = actions.iter().flat_map(|a| {
        let (tag, fd, newfd) = action_fields(a);
        match tag {
            SPAWN_DO_DUP2 => vec![fd, newfd],
            SPAWN_DO_CHDIR => vec![],
            _ => vec![fd],
        }
    });
    let top = open.chain(named).max().unwrap_or(-1);
    let n = u32::try_from(top.checked_add(1)?).ok()?;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reads the limit into `limit`, sets nothing.
    let got = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            std::ptr::null(),
            &mut limit,
        )
    };
    (got == 0 && u64::from(n) < limit.rlim_cur).then_some(n)
}

/// The file the call runs: its name as execve gets it, and the path by
/// which the recorder opens it. A name that names nothing executable
/// fails natively.
fn locate(
    call: &Call,
    mem: &Mem,
    at: &dyn Fn(&Path) -> PathBuf,
) -> Result<(Vec<u8>, PathBuf), Native> {
    let runnable = |name: &[u8]| {
        let p = at(Path::new(std::ffi::OsStr::from_bytes(name)));
        std::fs::metadata(&p)
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .then_some(p)
    };
    if call.name.is_empty() {
        return Err(Native::AsCalled);
    }
    if !call.search || call.name.contains(&b'/') {
        let p = runnable(&call.name).ok_or(Native::AsCalled)?;
        return Ok((call.name.clone(), p));
    }
    // glibc's `execvp` reads PATH from the current environment.
    let path = mem
        .environ()
        .and_then(|env| mem.variable(env, b"PATH"))
        .unwrap_or_else(|| DEFAULT_PATH.to_vec());
    path.split(|&c| c == b':')
        .map(|dir| match dir {
            b"" => call.name.clone(),
            d => [d, b"/", &call.name].concat(),
        })
        .find_map(|name| runnable(&name).map(|p| (name, p)))
        .ok_or(Native::AsCalled)
}

/// The first bytes of a file (empty when it cannot be read).
fn head(path: &Path) -> Vec<u8> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(4);
    let _ = std::fs::File::open(path).and_then(|f| f.take(4).read_to_end(&mut buf));
    buf
}

/// The words before an answer's strings and arrays.
const ANSWER_WORDS: usize = 7;

/// The answer being built: seven words (`layout::S_EXEC_ANSWER`), then
/// strings and arrays, at their addresses in the process (`base` is
/// where it will lie).
struct Answer {
    base: u64,
    bytes: Vec<u8>,
}

impl Answer {
    fn new(base: u64) -> Answer {
        Answer {
            base,
            bytes: vec![0; 8 * ANSWER_WORDS],
        }
    }

    fn head(&mut self, words: [u64; ANSWER_WORDS]) {
        for (i, w) in words.into_iter().enumerate() {
            self.bytes[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
    }

    /// A NUL-terminated copy of `s`; its address.
    fn string(&mut self, s: &[u8]) -> u64 {
        let at = self.base + self.bytes.len() as u64;
        self.bytes.extend_from_slice(s);
        self.bytes.push(0);
        at
    }

    /// A `posix_spawn_file_actions_t` running `program`'s actions, then an
    /// `open` of `.` ([`SPAWN_BACK_FLAGS`]) at descriptor `fd` and a
    /// `chdir` to the string at `dir`; its address.
    fn actions(&mut self, program: &[Action], fd: u32, dir: u64) -> u64 {
        let dot = self.string(b".");
        let mut open = [0u8; SPAWN_ACTION_SIZE as usize];
        open[..4].copy_from_slice(&SPAWN_DO_OPEN.to_le_bytes());
        open[8..12].copy_from_slice(&fd.to_le_bytes());
        open[16..24].copy_from_slice(&dot.to_le_bytes());
        open[24..28].copy_from_slice(&SPAWN_BACK_FLAGS.to_le_bytes());
        let mut chdir = [0u8; SPAWN_ACTION_SIZE as usize];
        chdir[..4].copy_from_slice(&SPAWN_DO_CHDIR.to_le_bytes());
        chdir[8..16].copy_from_slice(&dir.to_le_bytes());
        self.bytes.resize(self.bytes.len().next_multiple_of(8), 0);
        let list = self.base + self.bytes.len() as u64;
        for a in program.iter().chain([&open, &chdir]) {
            self.bytes.extend_from_slice(a);
        }
        let n = (program.len() + 2) as u32;
        let at = self.base + self.bytes.len() as u64;
        // allocated, used, the list, then glibc's 16 i32s of padding.
        for word in [u64::from(n) | u64::from(n) << 32, list] {
            self.bytes.extend_from_slice(&word.to_le_bytes());
        }
        self.bytes.extend_from_slice(&[0; 64]);
        at
    }

    /// A NULL-terminated, aligned array of `ptrs`; its address.
    fn pointers(&mut self, ptrs: &[u64]) -> u64 {
        self.bytes.resize(self.bytes.len().next_multiple_of(8), 0);
        let at = self.base + self.bytes.len() as u64;
        for p in ptrs.iter().chain(&[0]) {
            self.bytes.extend_from_slice(&p.to_le_bytes());
        }
        at
    }
}

/// Another process's memory.
struct Mem(libc::pid_t);

impl Mem {
    /// `len` bytes at `addr`, all or nothing.
    fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: `local` is our buffer of `len` bytes.
        let n = unsafe { libc::process_vm_readv(self.0, &local, 1, &remote, 1, 0) };
        (n == len as isize).then_some(buf)
    }

    fn write(&self, addr: u64, bytes: &[u8]) -> Option<()> {
        let local = libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: bytes.len(),
        };
        // SAFETY: the kernel only reads `local`.
        let n = unsafe { libc::process_vm_writev(self.0, &local, 1, &remote, 1, 0) };
        (n == bytes.len() as isize).then_some(())
    }

    fn u64(&self, addr: u64) -> Option<u64> {
        let b = self.read(addr, 8)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }

    /// The NUL-terminated string at `addr`, read page by page.
    fn string(&self, addr: u64) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let mut at = addr;
        while out.len() <= MAX_STRING {
            let chunk = self.read(at, (4096 - at % 4096) as usize)?;
            match chunk.iter().position(|&c| c == 0) {
                Some(end) => {
                    out.extend_from_slice(&chunk[..end]);
                    return Some(out);
                }
                None => out.extend_from_slice(&chunk),
            }
            at += chunk.len() as u64;
        }
        None
    }

    /// The pointers of the NULL-terminated array at `addr`.
    fn array(&self, addr: u64) -> Option<Vec<u64>> {
        (0..MAX_ARGS as u64)
            .map(|i| self.u64(addr + 8 * i))
            .take_while(|p| *p != Some(0))
            .collect()
    }

    /// The strings of an argv.
    fn strings(&self, argv: &Argv) -> Result<Vec<OsString>, Native> {
        let list = match argv {
            Argv::Array(p) => self.array(*p).ok_or(Native::AsCalled)?,
            Argv::List(l) => l.clone(),
        };
        list.into_iter()
            .map(|p| {
                self.string(p)
                    .map(OsString::from_vec)
                    .ok_or(Native::AsCalled)
            })
            .collect()
    }

    /// The value of variable `name` in the environment array `env`.
    fn variable(&self, env: u64, name: &[u8]) -> Option<Vec<u8>> {
        self.array(env)?.into_iter().find_map(|p| {
            let s = self.string(p)?;
            let v = s.strip_prefix(name)?.strip_prefix(b"=")?;
            Some(v.to_vec())
        })
    }

    /// Whether the process's libc is a rewritten copy (`--libs`): its
    /// code is traced, its system calls follow their execs.
    fn libc_traced(&self) -> bool {
        let Ok(cache) = std::fs::canonicalize(crate::commands::cache_dir()) else {
            return false;
        };
        self.objects()
            .is_some_and(|o| o.iter().any(|(exe, _, p)| !exe && p.starts_with(&cache)))
    }

    /// The process's current environment (libc's `__environ`): found
    /// as the loader binds it, in the executable first (a copy
    /// relocation moves it there when the program names `environ`), then
    /// in libc, each where `/proc/PID/maps` says it is loaded.
    fn environ(&self) -> Option<u64> {
        let objects = self.objects()?;
        let names = ["__environ", "environ", "_environ"];
        let at = (objects.iter()).find_map(|(_, start, path)| defined(path, *start, &[&names]))?;
        self.u64(at[0])
    }

    /// The addresses of libc's functions `names` (each its default
    /// version, as the loader binds a call of it), in that order.
    fn functions(&self, names: &[&str]) -> Option<Vec<u64>> {
        let objects = self.objects()?;
        let (_, start, libc) = objects.iter().find(|o| !o.0)?;
        let each: Vec<[&str; 1]> = names.iter().map(|n| [*n]).collect();
        let each: Vec<&[&str]> = each.iter().map(|n| &n[..]).collect();
        defined(libc, *start, &each)
    }

    /// The executable and libc as `/proc/PID/maps` names them: whether it
    /// is the executable, its first mapping's start and its path; the
    /// executable first.
    fn objects(&self) -> Option<Vec<(bool, u64, PathBuf)>> {
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.0)).ok()?;
        let exe = std::fs::read_link(format!("/proc/{}/exe", self.0)).ok()?;
        let is_libc = |p: &Path| {
            p.file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.starts_with("libc.so") || f.starts_with("libc-"))
        };
        let objects = maps.lines().filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let path = Path::new(*f.get(5)?);
            let start = u64::from_str_radix(f[0].split('-').next()?, 16).ok()?;
            (f[2] == "00000000" && (path == exe || is_libc(path)))
                .then(|| (path == exe, start, path.to_owned()))
        });
        let mut objects: Vec<_> = objects.collect();
        objects.sort_by_key(|o| !o.0);
        objects.dedup_by(|a, b| a.2 == b.2);
        Some(objects)
    }
}

/// For each list of names in `wanted`, the address of the first of them
/// the ELF file at `path`, loaded at `start` (its first mapping), defines
/// in its dynamic symbol table in its default version (not a hidden
/// compatibility one, such as glibc's `posix_spawn@GLIBC_2.2.5`); None
/// unless it defines one of each.
fn defined(path: &Path, start: u64, wanted: &[&[&str]]) -> Option<Vec<u64>> {
    let bytes = std::fs::read(path).ok()?;
    let elf = goblin::elf::Elf::parse(&bytes).ok()?;
    let hidden = |i: usize| {
        (elf.versym.as_ref())
            .and_then(|v| v.get_at(i))
            .is_some_and(|v| v.is_hidden())
    };
    let find = |names: &[&str]| {
        elf.dynsyms.iter().enumerate().find_map(|(i, s)| {
            let named = (elf.dynstrtab.get_at(s.st_name)).is_some_and(|n| names.contains(&n));
            (s.st_shndx != 0 && s.st_value != 0 && named && !hidden(i)).then_some(s.st_value)
        })
    };
    let bias = match elf.header.e_type {
        goblin::elf::header::ET_EXEC => 0,
        _ => {
            let first = (elf.program_headers.iter())
                .filter(|h| h.p_type == goblin::elf::program_header::PT_LOAD)
                .map(|h| h.p_vaddr & !0xfff)
                .min()?;
            start - first
        }
    };
    wanted.iter().map(|n| Some(bias + find(n)?)).collect()
}
