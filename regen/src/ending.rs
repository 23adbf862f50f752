//! How the trace of a thread whose process a signal killed ends
//! (docs/regen.md, "Killed runs"): the run stopped somewhere after the
//! last point its witnesses determine, and the trace ends there instead of
//! being refused as truncated.
//!
//! A thread whose FAULT record the runtime's handler wrote (a signal the
//! program left at its default action, docs/regen.md "Killed runs") ends
//! exactly there instead: its trace ends with the faulting instruction
//! (or, for a signal sent to it, before the instruction it interrupted),
//! which the ending names.
//!
//! Invariant: an [`Ending`] is made only for a thread the trace says was
//! killed (THREAD_END `killed`) at the end of its stream (a torn last
//! reservation counts as the end), or for one that wrote FAULT; every
//! block before it was printed, and only blocks something the thread wrote
//! later (or the FAULT) proves ran.

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
    /// How the trace ends.
    pub end: End,
}

/// How a killed thread's trace ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// Where regeneration needed the next item the thread never wrote
    /// ("in procedure f after block 0x401000", "inside the call of block
    /// 0x401000 in procedure f"): the run stopped there at the latest.
    Stopped(String),
    /// The runtime's handler wrote FAULT: signal `signo` struck `at`
    /// ("at instruction 0x401234 in procedure f of crash", or "in
    /// untraced code at 0x7f..., inside the call of block ...").
    Fault {
        /// The signal the FAULT names.
        signo: u32,
        /// Where it struck.
        at: String,
        /// The instruction at the rip raised it (SIGSEGV, SIGBUS, SIGFPE,
        /// SIGILL in traced code): it is the trace's last.
        raised: bool,
    },
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
        let fault = match &self.end {
            End::Fault { signo, .. } => Some(*signo as i32),
            End::Stopped(_) => None,
        };
        if let Some(n) = self.signal.or(fault) {
            write!(f, " by signal {n} ({})", signal_name(n))?;
        }
        match &self.end {
            End::Stopped(needed) => write!(
                f,
                ": its trace ends at the last point its witnesses determine; the run stopped there or later, at the latest {needed} (where the thread would have written its next item)",
            ),
            End::Fault { signo, at, .. } if Some(*signo as i32) != self.signal => write!(
                f,
                "; its trace ends where the runtime's handler took signal {signo} ({}) {at}",
                signal_name(*signo as i32)
            ),
            End::Fault { at, raised: true, .. } => {
                write!(f, " {at}, the faulting instruction, the trace's last")
            }
            End::Fault { at, .. } => write!(f, " {at}; its trace ends there"),
        }
    }
}
