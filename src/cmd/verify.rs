//! `aetrace verify`: checks a trace (or a profile's counts) against the
//! program run again under ptrace; prints the report and exits 0 when
//! exact, 1 otherwise.

use std::ffi::OsString;
use std::fmt::Display;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use aetrace_verify::{ProfileOptions, VerifyOptions};

#[derive(clap::Args)]
pub struct Args {
    /// The trace to check (`aetrace record`).
    #[arg(required_unless_present = "profile", conflicts_with = "profile")]
    trace: Option<PathBuf>,
    /// Check this profile (`aetrace profile`) instead of a trace; the program and
    /// arguments default to the profile's.
    #[arg(long, value_name = "PROFILE", conflicts_with = "thread")]
    profile: Option<PathBuf>,
    /// The program's stdin instead of the recorded run's.
    #[arg(long)]
    stdin: Option<PathBuf>,
    /// Compare only this trace thread.
    #[arg(long)]
    thread: Option<u32>,
    /// Let the follower and the program run on any CPU (by default both are pinned
    /// to one: each ptrace stop is then a context switch, not a cross-CPU wake-up).
    #[arg(long)]
    no_pin: bool,
    /// PROGRAM ARGS for a trace that does not record its command (or to override it);
    /// with --profile, the command as profiled (argv[0] included).
    #[arg(last = true)]
    command: Vec<OsString>,
}

pub fn run(a: Args) -> super::Result {
    match (a.profile, a.trace) {
        (Some(profile), _) => {
            let opts = ProfileOptions {
                profile,
                stdin: a.stdin,
                command: a.command,
                no_pin: a.no_pin,
            };
            let report = aetrace_verify::verify_profile(&opts)?;
            print(&report, report.exact())
        }
        (None, Some(trace)) => {
            let opts = VerifyOptions {
                stdin: a.stdin,
                thread: a.thread,
                command: a.command,
                no_pin: a.no_pin,
            };
            let report = aetrace_verify::verify_trace(&trace, &opts)?;
            print(&report, report.exact())
        }
        // clap requires one of the two.
        (None, None) => Err("give a TRACE or --profile PROFILE".into()),
    }
}

/// Prints the report; the status says whether it is exact, also when the
/// reader stopped early.
fn print(report: &impl Display, exact: bool) -> super::Result {
    match write!(std::io::stdout().lock(), "{report}") {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    Ok(if exact {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
