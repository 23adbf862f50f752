//! What aetrace knows about imported functions by name.
//!
//! A call into untraced code may call traced code back (`qsort`, `atexit`
//! handlers run by `exit`, `__libc_start_main` calling `main`); the traced
//! callee then announces itself with ENTER. To keep the regenerator from
//! attributing such an ENTER to the wrong external call, the return point of
//! every call that *may* call back carries a RETURN record (docs/rewrite.md).
//! Imports listed here never run application code except through signal
//! handlers (which have their own SIGNAL record), so their calls need no
//! RETURN record. Calls that deliver signals synchronously or wait for them
//! (`raise`, `kill`, `sigprocmask` and `pthread_sigmask`, which run a
//! pending handler as they unblock it, the sleeps) are left out on purpose:
//! with a RETURN after them, a handler run inside them is placed exactly
//! even when several such calls follow one another without a witness
//! (docs/regen.md, "Signals"). The list errs on the side of leaving a
//! function out: a missing name costs two bytes per call, a wrong name
//! would make traces ambiguous.

/// Imports that never call back into the program (other than by signals).
const CALLBACK_FREE: &[&str] = &[
    // memory and strings
    "memcpy",
    "memmove",
    "memset",
    "memcmp",
    "memchr",
    "memrchr",
    "rawmemchr",
    "mempcpy",
    "bcmp",
    "bzero",
    "strlen",
    "strnlen",
    "strcmp",
    "strncmp",
    "strcasecmp",
    "strncasecmp",
    "strcpy",
    "strncpy",
    "stpcpy",
    "stpncpy",
    "strcat",
    "strncat",
    "strchr",
    "strrchr",
    "strstr",
    "strspn",
    "strcspn",
    "strpbrk",
    "strdup",
    "strndup",
    "strtok",
    "strtok_r",
    "strcoll",
    "strxfrm",
    "strerror",
    "strsignal",
    "wcslen",
    "wcscmp",
    "wmemcpy",
    "wmemset",
    "__memcpy_chk",
    "__memmove_chk",
    "__memset_chk",
    "__strcpy_chk",
    "__strcat_chk",
    "__strncpy_chk",
    "__stpcpy_chk",
    "__mempcpy_chk",
    // allocation
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "free",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    // conversions and classification
    "strtol",
    "strtoul",
    "strtoll",
    "strtoull",
    "strtod",
    "strtof",
    "strtold",
    "strtoimax",
    "strtoumax",
    "atoi",
    "atol",
    "atoll",
    "atof",
    "__ctype_b_loc",
    "__ctype_tolower_loc",
    "__ctype_toupper_loc",
    "__ctype_get_mb_cur_max",
    "tolower",
    "toupper",
    "mbrtowc",
    "mbrlen",
    "mbsinit",
    "wcrtomb",
    "btowc",
    "iswprint",
    "iswspace",
    "iswalnum",
    "towlower",
    "towupper",
    "__isoc99_sscanf",
    "__isoc23_strtol",
    "__isoc23_strtoul",
    "__isoc23_strtoll",
    "__isoc23_strtoull",
    // formatted and stream output/input (no printf handlers are registered by
    // the programs we trace; `register_printf_function` is not in the list)
    "printf",
    "fprintf",
    "sprintf",
    "snprintf",
    "vprintf",
    "vfprintf",
    "vsprintf",
    "vsnprintf",
    "dprintf",
    "asprintf",
    "vasprintf",
    "__printf_chk",
    "__fprintf_chk",
    "__sprintf_chk",
    "__snprintf_chk",
    "__vfprintf_chk",
    "__vsnprintf_chk",
    "__vsprintf_chk",
    "__vprintf_chk",
    "__asprintf_chk",
    "__dprintf_chk",
    "puts",
    "fputs",
    "fputc",
    "putc",
    "putchar",
    "fwrite",
    "fread",
    "fgets",
    "fgetc",
    "getc",
    "getchar",
    "ungetc",
    "fflush",
    "fopen",
    "fopen64",
    "fdopen",
    "fclose",
    "fileno",
    "fseek",
    "fseeko",
    "fseeko64",
    "ftell",
    "ftello",
    "ftello64",
    "rewind",
    "feof",
    "ferror",
    "clearerr",
    "setvbuf",
    "setbuf",
    "perror",
    "putc_unlocked",
    "getc_unlocked",
    "fputc_unlocked",
    "fwrite_unlocked",
    "fflush_unlocked",
    "__overflow",
    "__uflow",
    "_IO_putc",
    "_IO_getc",
    "__fpending",
    "__freading",
    "__fwriting",
    "fputs_unlocked",
    "__getdelim",
    "getline",
    "getdelim",
    // system calls and their thin wrappers
    "read",
    "write",
    "pread",
    "pwrite",
    "pread64",
    "pwrite64",
    "readv",
    "writev",
    "open",
    "open64",
    "openat",
    "openat64",
    "__open_2",
    "__open64_2",
    "close",
    "lseek",
    "lseek64",
    "fstat",
    "fstat64",
    "stat",
    "stat64",
    "lstat",
    "lstat64",
    "fstatat",
    "fstatat64",
    "__fxstat",
    "__fxstat64",
    "__xstat",
    "__xstat64",
    "__lxstat",
    "__lxstat64",
    "statx",
    "unlink",
    "unlinkat",
    "rename",
    "renameat",
    "chmod",
    "fchmod",
    "fchown",
    "chown",
    "lchown",
    "fchmodat",
    "fchownat",
    "utimensat",
    "futimens",
    "utimes",
    "isatty",
    "ioctl",
    "fcntl",
    "fcntl64",
    "dup",
    "dup2",
    "dup3",
    "pipe",
    "pipe2",
    "getpid",
    "getppid",
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "umask",
    "access",
    "faccessat",
    "mkdir",
    "rmdir",
    "chdir",
    "fchdir",
    "getcwd",
    "readlink",
    "readlinkat",
    "sysconf",
    "getpagesize",
    "time",
    "clock_gettime",
    "gettimeofday",
    "clock",
    "localtime",
    "localtime_r",
    "gmtime",
    "gmtime_r",
    "mktime",
    "strftime",
    "ftruncate",
    "ftruncate64",
    "fsync",
    "fdatasync",
    "mmap",
    "mmap64",
    "munmap",
    "mprotect",
    "madvise",
    "posix_fadvise",
    "posix_fadvise64",
    "getrlimit",
    "setrlimit",
    "getrusage",
    "times",
    "sigemptyset",
    "sigaddset",
    "sigdelset",
    "sigismember",
    "sigaction",
    "signal",
    "__sysv_signal",
    "waitpid",
    "wait",
    "wait4",
    "getenv",
    "secure_getenv",
    "setenv",
    "unsetenv",
    "opendir",
    "fdopendir",
    "readdir",
    "readdir64",
    "closedir",
    "dirfd",
    "__errno_location",
    "__explicit_bzero_chk",
    "explicit_bzero",
    // locale and messages
    "setlocale",
    "bindtextdomain",
    "textdomain",
    "dcgettext",
    "gettext",
    "dgettext",
    "ngettext",
    "dcngettext",
    "nl_langinfo",
    "localeconv",
    // threads (the start routine of pthread_create runs in ANOTHER thread,
    // which announces itself; nothing runs on the calling thread)
    "pthread_create",
    "pthread_join",
    "pthread_detach",
    "pthread_self",
    "pthread_mutex_lock",
    "pthread_mutex_unlock",
    "pthread_mutex_trylock",
    "pthread_mutex_init",
    "pthread_mutex_destroy",
    "pthread_cond_wait",
    "pthread_cond_signal",
    "pthread_cond_broadcast",
    "pthread_cond_init",
    "pthread_cond_destroy",
    "pthread_attr_init",
    "pthread_attr_destroy",
    "pthread_attr_setstacksize",
    "pthread_equal",
    "sched_yield",
    // math
    "sqrt",
    "sqrtf",
    "sin",
    "cos",
    "tan",
    "exp",
    "log",
    "log2",
    "log10",
    "pow",
    "fabs",
    "floor",
    "ceil",
    "round",
    "fmod",
    "atan",
    "atan2",
    "sinf",
    "cosf",
    "expf",
    "logf",
    "powf",
    "lround",
    "lrint",
    // random numbers and the stack protector
    "rand",
    "srand",
    "random",
    "srandom",
    "rand_r",
    "drand48",
    "srand48",
    "lrand48",
    "getrandom",
    "__stack_chk_fail",
    "abort",
    // setjmp returns normally first; a later return through longjmp is
    // announced by the LONGJMP record written before the longjmp call
    "setjmp",
    "_setjmp",
    "__sigsetjmp",
    "sigsetjmp",
];

/// `exit`-like imports: the program ends inside them after running exit
/// handlers (callbacks). The rewriter writes EXIT(status) before the call.
const EXIT_LIKE: &[&str] = &["exit", "_exit", "_Exit", "quick_exit"];

/// Imports after which a new process may run the next instruction (the
/// child must claim its own slot before writing anything).
const FORK_LIKE: &[&str] = &["fork", "vfork", "__libc_fork", "_Fork"];

/// Imports that save a context `longjmp` can return to (jmp_buf in rdi).
const SETJMP_LIKE: &[&str] = &["setjmp", "_setjmp", "__sigsetjmp", "sigsetjmp"];

/// Imports that return to a saved context (jmp_buf in rdi).
const LONGJMP_LIKE: &[&str] = &["longjmp", "_longjmp", "siglongjmp", "__longjmp_chk"];

/// Calls that may read or set a signal's disposition (the signal in rdi),
/// a static libc's internal names too. `syscall(SYS_rt_sigaction, ...)`
/// is not among them (docs/regen.md section 3b).
const DISPOSITION_CALLS: &[&str] = &[
    "sigaction",
    "__sigaction",
    "__libc_sigaction",
    "signal",
    "bsd_signal",
    "__bsd_signal",
    "sysv_signal",
    "__sysv_signal",
    "sigset",
    "sigignore",
    "siginterrupt",
    "sigvec",
];

/// Calls that open a file by name and return its descriptor (the
/// runtime gives the program its view of its own maps there,
/// `docs/runtime.md` section 5), a static libc's names too.
const OPEN_FD_CALLS: &[&str] = &[
    "open",
    "open64",
    "__open",
    "__open64",
    "__libc_open",
    "__libc_open64",
    "openat",
    "openat64",
    "__open_2",
    "__open64_2",
    "__openat_2",
    "__openat64_2",
];

/// Calls that open a file by name and return a `FILE *`.
const OPEN_FILE_CALLS: &[&str] = &["fopen", "fopen64", "_IO_new_fopen", "freopen", "freopen64"];

/// Calls that read a descriptor at its offset (a read from offset 0
/// makes a view of the maps again, as the kernel makes the text again).
const READ_CALLS: &[&str] = &["read", "__read", "__libc_read", "__read_chk"];

/// Calls that read a symbolic link or resolve a path, the path their
/// first argument (the runtime answers the program's own
/// `/proc/PID/exe` with the original executable there,
/// `docs/runtime.md` section 5, "The executable's names"), a static
/// libc's names too.
const PATH_FIRST_CALLS: &[&str] = &[
    "readlink",
    "__readlink",
    "__readlink_chk",
    "realpath",
    "__realpath",
    "__realpath_chk",
    "canonicalize_file_name",
];

/// The same, the path their second argument (after a directory's
/// descriptor).
const PATH_SECOND_CALLS: &[&str] = &["readlinkat", "__readlinkat", "__readlinkat_chk"];

/// Which argument of a call that reads a link names the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathArg {
    /// The first (rdi): `readlink`, `realpath`.
    First = 0,
    /// The second (rsi): `readlinkat`.
    Second = 1,
}

/// What a call that opens a file by name returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opened {
    /// A descriptor (`open`, `openat`, ...).
    Fd,
    /// A `FILE *` (`fopen`, ...).
    File,
}

/// Strips a symbol version (`memcpy@GLIBC_2.14`).
fn base(name: &str) -> &str {
    name.split('@').next().unwrap_or(name)
}

/// Whether a call to `name` can never run traced code on this thread.
pub fn is_callback_free(name: &str) -> bool {
    CALLBACK_FREE.contains(&base(name))
}

/// Whether a call to `name` ends the program after running exit handlers (`exit`, `_exit`, ...).
pub fn is_exit_like(name: &str) -> bool {
    EXIT_LIKE.contains(&base(name))
}

/// Whether a new process may run the instruction after a call to `name` (`fork`, `vfork`, ...).
pub fn is_fork_like(name: &str) -> bool {
    FORK_LIKE.contains(&base(name))
}

/// Whether `name` is libc's `syscall(number, ...)`, which creates a task
/// when its number is fork, vfork, clone or clone3.
pub fn is_syscall_function(name: &str) -> bool {
    base(name) == "syscall"
}

/// Whether a call to `name` may read or set a signal's disposition
/// (`sigaction`, `signal`, `sigset`, ...).
pub fn touches_dispositions(name: &str) -> bool {
    DISPOSITION_CALLS.contains(&base(name))
}

/// Whether a call to `name` opens a file by name, and what it returns.
pub fn opens_by_name(name: &str) -> Option<Opened> {
    class_of(
        name,
        &[(OPEN_FD_CALLS, Opened::Fd), (OPEN_FILE_CALLS, Opened::File)],
    )
}

/// The class of the first list that holds `name` (without its version).
fn class_of<T: Copy>(name: &str, classes: &[(&[&str], T)]) -> Option<T> {
    let name = base(name);
    classes
        .iter()
        .find(|(names, _)| names.contains(&name))
        .map(|&(_, class)| class)
}

/// Whether a call to `name` reads a symbolic link or resolves a path
/// (`readlink`, `realpath`, ...), and which argument names it.
pub fn exe_path_arg(name: &str) -> Option<PathArg> {
    class_of(
        name,
        &[
            (PATH_FIRST_CALLS, PathArg::First),
            (PATH_SECOND_CALLS, PathArg::Second),
        ],
    )
}

/// Whether a call to `name` reads a descriptor at its offset (`read`).
pub fn reads(name: &str) -> bool {
    READ_CALLS.contains(&base(name))
}

/// A fork-like call that runs `pthread_atfork` handlers (`vfork` and
/// `_Fork` run none).
pub fn runs_atfork_handlers(name: &str) -> bool {
    matches!(base(name), "fork" | "__libc_fork" | "__fork")
}

/// Whether `name` saves a context `longjmp` can return to (`setjmp`, `sigsetjmp`, ...).
pub fn is_setjmp_like(name: &str) -> bool {
    SETJMP_LIKE.contains(&base(name))
}

/// Whether `name` returns to a saved context (`longjmp`, `siglongjmp`, ...).
pub fn is_longjmp_like(name: &str) -> bool {
    LONGJMP_LIKE.contains(&base(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_matched_without_versions() {
        assert!(is_callback_free("memcpy@GLIBC_2.14"));
        assert!(!is_callback_free("qsort"));
        assert!(!is_callback_free("__libc_start_main"));
        assert!(is_exit_like("exit"));
        assert!(is_fork_like("fork"));
        assert!(!is_fork_like("forkpty"));
        assert!(runs_atfork_handlers("fork@GLIBC_2.2.5"));
        assert!(!runs_atfork_handlers("vfork"));
        assert_eq!(exe_path_arg("readlink@GLIBC_2.2.5"), Some(PathArg::First));
        assert_eq!(exe_path_arg("readlinkat"), Some(PathArg::Second));
        assert_eq!(exe_path_arg("symlink"), None);
        assert_eq!(opens_by_name("fopen64@GLIBC_2.2.5"), Some(Opened::File));
        assert_eq!(opens_by_name("__openat_2"), Some(Opened::Fd));
    }
}
