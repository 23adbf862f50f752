//! How the trace of a thread whose process a signal killed ends
//! (docs/regen.md, "Killed runs"): the run stopped somewhere after the
//! last point its witnesses determine, and the trace ends there instead of
//! being refused as truncated.
//!
//! Invariant: an [`Ending`] is made only for a thread the trace says was
//! killed (THREAD_END `killed`), at the end of its stream (a torn last
//! reservation counts as the end); every block before it was printed, and
//! only blocks something the thread wrote later proves ran.

use aetrace_format::ThreadId;

/// A killed thread's end in its trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ending {
    /// The thread.
    pub thread: ThreadId,
    /// Its process id.
    pub pid: u32,
    /// The signal that killed its process (PROCESS_EXIT), when the trace
    /// has it.
    pub signal: Option<i32>,
    /// Where regeneration needed the next item the thread never wrote
    /// ("in procedure f after block 0x401000", "inside the call of block
    /// 0x401000 in procedure f"): the run stopped there at the latest.
    pub needed: String,
}

/// The usual name of Linux signal `n` on x86-64.
pub fn signal_name(n: i32) -> &'static str {
    const NAMES: [&str; 32] = [
        "",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match usize::try_from(n).ok().and_then(|i| NAMES.get(i)) {
        Some(s) if !s.is_empty() => s,
        _ => "a real-time signal",
    }
}

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "thread {} (pid {}) was killed", self.thread, self.pid)?;
        if let Some(n) = self.signal {
            write!(f, " by signal {n} ({})", signal_name(n))?;
        }
        write!(
            f,
            ": its trace ends at the last point its witnesses determine; the run stopped there or later, at the latest {} (where the thread would have written its next item)",
            self.needed
        )
    }
}
