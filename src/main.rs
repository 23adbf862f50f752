//! `aetrace`: the command-line front end.
//!
//! This file parses arguments and dispatches to one module per subcommand
//! under [`cmd`]; those print, warn and choose exit codes, while the work
//! lives in the workspace crates (which return values and take writers).
//!
//! Exit codes:
//! - `0`: success (also when a pipe's reader stopped early, as in
//!   `aetrace regen TRACE | head`).
//! - `1`: the input was refused or the work failed (the one-line message on
//!   stderr says why).
//! - `2`: the command line itself was wrong (clap's usage error), including
//!   an unknown option before the program of `record`, `profile`, `count`
//!   and `paths`.
//! - `record`, `profile`, `paths`, `count`: the program's own exit status; when a signal killed
//!   it, the recorder re-raises that signal (or exits 128+signal).
//! - `verify`: 0 when the trace (or with `--profile`, every count of the
//!   profile) is exact, 1 when a thread diverges, a count differs or the
//!   check could not be made (the report or the message says which).
//! - `cachesim` keeps the exit codes documented in `aetrace-cachesim`.

mod cmd;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "aetrace",
    version,
    about = "Exact, compact control-flow tracing of x86-64 Linux programs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Recover procedures and control-flow graphs from an ELF file and summarise them.
    Cfg(cmd::cfg::Args),
    /// Rewrite an executable so that it writes its witness trace (to the file named by
    /// AETRACE_OUT when run without `aetrace record`).
    Instrument(cmd::instrument::Args),
    /// Run a program with its trace recorded; exits with the program's status.
    Record(cmd::record::Args),
    /// Run a program with edge counters (optimal placement) and write its profile; exits
    /// with the program's status.
    Profile(cmd::profile::Args),
    /// Count events of a run with one counter (chord increments, paper 002); prints the
    /// count on stderr (or to --output) and exits with the program's status.
    Count(cmd::count::Args),
    /// Run a program with Ball-Larus path counters and write its path profile; prints the
    /// hottest paths on stderr (or to --report) and exits with the program's status.
    Paths(cmd::paths::Args),
    /// Print a report of a profile written by `aetrace profile`.
    Report(cmd::report::Args),
    /// Classify every data reference of a profile's modules by how its address could be
    /// rebuilt, weighted by the profile's block counts (the data-trace census).
    Census(cmd::census::Args),
    /// Rebuild the instruction or block trace of a recorded run.
    Regen(cmd::regen::Args),
    /// Write the regenerator's state index beside a trace (TRACE.idx), so that
    /// `regen -j N` expands pieces of one stream in parallel at once.
    Index(cmd::index::Args),
    /// Summarise a trace: modules, threads, sizes, procedures left alone, bits per instruction.
    Info(cmd::info::Args),
    /// Debug a recorded run in gdb: step, break and run backwards through a thread's
    /// regenerated trace (`--server`: the gdb stub alone, on stdin/stdout).
    Debug(cmd::debug::Args),
    /// Write the whole run's call tree as Chrome/Perfetto trace JSON (time in
    /// instructions, one track per thread).
    Timeline(cmd::timeline::Args),
    /// Run the original program again under ptrace and check a trace block by block
    /// (exit 0: exact; 1: a divergence, or the check could not be made).
    ///
    /// With --profile PROFILE: count every block and edge of the run and compare them
    /// with the profile's (exit 0: every count equal).
    Verify(cmd::verify::Args),
    /// Run the Dinero-compatible cache simulator (same options as `cachesim`).
    #[command(disable_help_flag = true)]
    Cachesim {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before the thread pool starts: growing a shared descriptor table
    // waits for an RCU grace period (about 10 ms here), which `record`'s
    // publishing of its witness region paid on every run. Best effort: a
    // limit that forbids it is reported by that publishing, in a command
    // that needs it.
    let _ = aetrace_record::reserve_region_fd();
    aetrace_record::quiet_workers();
    let result = match cli.command {
        Command::Cfg(a) => cmd::cfg::run(a),
        Command::Instrument(a) => cmd::instrument::run(a),
        Command::Record(a) => cmd::record::run(a),
        Command::Profile(a) => cmd::profile::run(a),
        Command::Count(a) => cmd::count::run(a),
        Command::Paths(a) => cmd::paths::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Census(a) => cmd::census::run(a),
        Command::Regen(a) => cmd::regen::run(a),
        Command::Index(a) => cmd::index::run(a),
        Command::Info(a) => cmd::info::run(a),
        Command::Verify(a) => cmd::verify::run(a),
        Command::Debug(a) => cmd::debug::run(a),
        Command::Timeline(a) => cmd::timeline::run(a),
        Command::Cachesim { args } => return cmd::cachesim::main(args),
    };
    match result {
        Ok(code) => code,
        // A reader that stopped early (`| head`) is not an error.
        Err(e) if cmd::is_broken_pipe(&*e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aetrace: error: {e}");
            ExitCode::from(1)
        }
    }
}
