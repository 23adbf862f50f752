//! `aetrace`: the command-line front end.
//!
//! This file only parses arguments and calls library functions; every
//! subcommand's work lives in one of the workspace crates.
//!
//! Exit codes:
//! - `0`: success (also when `regen`'s pipe reader stopped early, as in
//!   `aetrace regen TRACE | head`).
//! - `1`: the input was refused or the work failed (the one-line message on
//!   stderr says why).
//! - `2`: the command line itself was wrong (clap's usage error).
//! - `record`, `profile`, `paths`, `count`: the program's own exit status; when a signal killed
//!   it, the recorder re-raises that signal (or exits 128+signal).
//! - `verify`: 0 when the trace (or with `--profile`, every count of the
//!   profile) is exact, 1 when a thread diverges, a count differs or the
//!   check could not be made (the report or the message says which).
//! - `cachesim` keeps the exit codes documented in `aetrace-cachesim`.

use std::ffi::OsString;
use std::path::PathBuf;
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
    Cfg {
        /// The ELF executable or shared object.
        file: PathBuf,
        /// Show only the procedure with this name or start address (hex with 0x).
        #[arg(long)]
        function: Option<String>,
        /// Print each selected procedure's CFG as Graphviz DOT.
        #[arg(long, conflicts_with = "json")]
        dot: bool,
        /// Print the module and its procedures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Rewrite an executable so that it writes its witness trace (to the file named by
    /// AETRACE_OUT when run without `aetrace record`).
    Instrument {
        file: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        #[arg(long, value_enum, default_value = "optimal")]
        placement: PlacementArg,
    },
    /// Run a program with its trace recorded; exits with the program's status.
    Record {
        /// Trace file to write (default: PROGRAM's base name + .aet).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Shared libraries to trace too: `none`, `all` (but glibc's) or
        /// DT_NEEDED names such as `libbz2.so.1.0`, comma-separated.
        #[arg(long, default_value = "none")]
        libs: String,
        #[arg(long, value_enum, default_value = "optimal")]
        placement: PlacementArg,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
    /// Run a program with edge counters (optimal placement) and write its profile; exits
    /// with the program's status.
    Profile {
        /// Profile file to write (default: PROGRAM's base name + .aprof).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// optimal (counters on spanning-tree chords) or every-block.
        #[arg(long, value_enum, default_value = "optimal")]
        placement: CountPlacementArg,
        /// `heuristic`, or a previous profile whose counts weight the spanning trees.
        #[arg(long, default_value = "heuristic")]
        weights: String,
        /// Also write the text report here.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Also write the profile in callgrind format here (callgrind_annotate, KCachegrind).
        #[arg(long)]
        callgrind: Option<PathBuf>,
        /// Shared libraries to profile too: `none`, `all` (but glibc's) or
        /// DT_NEEDED names such as `libbz2.so.1.0`, comma-separated.
        #[arg(long, default_value = "none")]
        libs: String,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
    /// Count events of a run with one counter (chord increments, paper 002); prints the
    /// count on stderr (or to --output) and exits with the program's status.
    Count {
        /// insns, blocks or calls.
        #[arg(long, value_enum, default_value = "insns")]
        event: EventArg,
        /// Write the count here instead of stderr.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Shared libraries to count in too (`none`, `all`, or names): the
        /// count is the sum over the executable and these.
        #[arg(long, default_value = "none")]
        libs: String,
        /// Raise SIGTRAP at the N-th event (insns: before the N-th instruction runs;
        /// blocks: at the N-th block entry; calls: at the N-th callee's entry), so that a
        /// debugger running the same deterministic program stops exactly there.
        #[arg(long, value_name = "N")]
        stop_at: Option<u64>,
        /// With --stop-at: write the rewritten program here (run it under gdb) instead of
        /// running it.
        #[arg(long, value_name = "FILE", requires = "stop_at")]
        write_program: Option<PathBuf>,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
    /// Run a program with Ball-Larus path counters and write its path profile; prints the
    /// hottest paths on stderr (or to --report) and exits with the program's status.
    Paths {
        /// Path profile to write (default: PROGRAM's base name + .apath).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Procedures, and paths of each, the report lists.
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// Report as JSON.
        #[arg(long)]
        json: bool,
        /// Write the report here instead of stderr.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Shared libraries to profile too: `none`, `all` (but glibc's) or
        /// DT_NEEDED names such as `libbz2.so.1.0`, comma-separated.
        #[arg(long, default_value = "none")]
        libs: String,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
    /// Print a report of a profile written by `aetrace profile`.
    Report {
        profile: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        format: ReportFormatArg,
        /// Procedures and blocks listed by the text report.
        #[arg(long, default_value_t = 20)]
        top: usize,
    },
    /// Rebuild the instruction or block trace of a recorded run.
    Regen {
        trace: PathBuf,
        /// insn, block, din, xdin or bin.
        #[arg(long, default_value = "insn")]
        format: String,
        /// Keep only this module (file name or path).
        #[arg(long)]
        module: Option<String>,
        /// Offsets from the module's base instead of run-time addresses.
        #[arg(long)]
        relative: bool,
        /// Only this thread.
        #[arg(long)]
        thread: Option<u32>,
        /// Parallel workers (0: one per CPU): threads, and pieces of long streams.
        #[arg(short = 'j', long, default_value_t = 0)]
        jobs: usize,
        /// Print totals only.
        #[arg(long)]
        count: bool,
        /// Stream bytes per parallel piece of one thread (default: automatic).
        #[arg(long, value_name = "BYTES", default_value_t = 0)]
        piece: u64,
        /// Write here instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Summarise a trace: modules, threads, sizes, procedures left alone, bits per instruction.
    Info {
        trace: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Run the original program again under ptrace and check a trace block by block
    /// (exit 0: exact; 1: a divergence, or the check could not be made).
    ///
    /// With --profile PROFILE: count every block and edge of the run and compare them
    /// with the profile's (exit 0: every count equal).
    Verify {
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
    },
    /// Run the Dinero-compatible cache simulator (same options as `cachesim`).
    #[command(disable_help_flag = true)]
    Cachesim {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

#[derive(Copy, Clone, clap::ValueEnum)]
enum ReportFormatArg {
    Text,
    Json,
    Callgrind,
}

impl From<ReportFormatArg> for aetrace_profile::report::Format {
    fn from(f: ReportFormatArg) -> Self {
        use aetrace_profile::report::Format;
        match f {
            ReportFormatArg::Text => Format::Text,
            ReportFormatArg::Json => Format::Json,
            ReportFormatArg::Callgrind => Format::Callgrind,
        }
    }
}

#[derive(Copy, Clone, clap::ValueEnum)]
enum EventArg {
    Insns,
    Blocks,
    Calls,
}

#[derive(Copy, Clone, clap::ValueEnum)]
enum CountPlacementArg {
    Optimal,
    EveryBlock,
}

#[derive(Copy, Clone, clap::ValueEnum)]
enum PlacementArg {
    Optimal,
    AllPredicates,
    NaiveBlocking,
}

impl From<PlacementArg> for aetrace_rewrite::Placement {
    fn from(p: PlacementArg) -> Self {
        use aetrace_rewrite::Placement;
        match p {
            PlacementArg::Optimal => Placement::Optimal,
            PlacementArg::AllPredicates => Placement::AllPredicates,
            PlacementArg::NaiveBlocking => Placement::NaiveBlocking,
        }
    }
}

/// `--libs` as a library selection, or its one-line error and status 1.
fn libs_arg(s: &str) -> Result<aetrace_record::libs::LibSelection, ExitCode> {
    aetrace_record::libs::LibSelection::parse(s).map_err(|e| fail(&e.to_string()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    aetrace_record::quiet_workers();
    let result = match cli.command {
        Command::Cfg {
            file,
            function,
            dot,
            json,
        } => {
            let output = if json {
                aetrace_analysis::report::Output::Json
            } else if dot {
                aetrace_analysis::report::Output::Dot
            } else {
                aetrace_analysis::report::Output::Summary
            };
            aetrace_analysis::report::cfg_command(&file, function.as_deref(), output)
                .map_err(|e| e.to_string())
        }
        Command::Instrument {
            file,
            output,
            placement,
        } => aetrace_record::commands::instrument_command(&file, &output, placement.into())
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Command::Record {
            output,
            libs,
            placement,
            mut command,
        } => {
            let libs = match libs_arg(&libs) {
                Ok(l) => l,
                Err(code) => return code,
            };
            let program = PathBuf::from(command.remove(0));
            let opts = aetrace_record::commands::RecordOptions {
                trace: output,
                libs,
                placement: placement.into(),
                program,
                args: command,
            };
            return exit_like(aetrace_record::commands::record_command(&opts));
        }
        Command::Profile {
            output,
            placement,
            weights,
            report,
            callgrind,
            libs,
            mut command,
        } => {
            use aetrace_rewrite::counters::CountPlacement;
            let libs = match libs_arg(&libs) {
                Ok(l) => l,
                Err(code) => return code,
            };
            let opts = aetrace_record::counted::ProfileOptions {
                output,
                placement: match placement {
                    CountPlacementArg::Optimal => CountPlacement::Optimal,
                    CountPlacementArg::EveryBlock => CountPlacement::EveryBlock,
                },
                weights: (weights != "heuristic").then(|| PathBuf::from(weights)),
                report,
                callgrind,
                libs,
                program: PathBuf::from(command.remove(0)),
                args: command,
            };
            return exit_like(aetrace_record::counted::profile_command(&opts));
        }
        Command::Count {
            event,
            output,
            libs,
            stop_at,
            write_program,
            mut command,
        } => {
            let libs = match libs_arg(&libs) {
                Ok(l) => l,
                Err(code) => return code,
            };
            use aetrace_rewrite::counters::Event;
            let event = match event {
                EventArg::Insns => Event::Insns,
                EventArg::Blocks => Event::Blocks,
                EventArg::Calls => Event::Calls,
            };
            let program = PathBuf::from(command.remove(0));
            let stop = stop_at.map(|n| (n, write_program.as_deref()));
            match aetrace_record::counted::count_and_report(
                &program,
                &command,
                event,
                &libs,
                stop,
                output.as_deref(),
            ) {
                Ok(Some(outcome)) => return aetrace_record::commands::exit_like(outcome),
                Ok(None) => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        }
        Command::Paths {
            output,
            top,
            json,
            report,
            libs,
            mut command,
        } => {
            let libs = match libs_arg(&libs) {
                Ok(l) => l,
                Err(code) => return code,
            };
            let opts = aetrace_record::paths::PathsOptions {
                output,
                top,
                json,
                report,
                libs,
                program: PathBuf::from(command.remove(0)),
                args: command,
            };
            return exit_like(aetrace_record::paths::paths_command(&opts));
        }
        Command::Report {
            profile,
            format,
            top,
        } => aetrace_profile::read(&profile)
            .and_then(|p| {
                aetrace_profile::report::write(
                    &p,
                    format.into(),
                    top,
                    &mut std::io::stdout().lock(),
                )
            })
            .map_err(|e| e.to_string()),
        Command::Regen {
            trace,
            format,
            module,
            relative,
            thread,
            jobs,
            count,
            piece,
            output,
        } => format
            .parse()
            .and_then(|format| {
                let opts = aetrace_regen::Options {
                    format,
                    module,
                    relative,
                    thread,
                    jobs,
                    count,
                    piece_bytes: piece,
                };
                aetrace_regen::regen_to(&trace, &opts, output.as_deref())
            })
            .map_err(|e: aetrace_regen::Error| e.to_string()),
        Command::Info { trace, json } => {
            aetrace_regen::info::info_command(&trace, json, &mut std::io::stdout().lock())
                .map_err(|e| e.to_string())
        }
        Command::Verify {
            profile: Some(profile),
            stdin,
            command,
            no_pin,
            ..
        } => {
            let opts = aetrace_verify::ProfileOptions {
                profile,
                stdin,
                command,
                no_pin,
            };
            match aetrace_verify::verify_profile(&opts) {
                Ok(report) => {
                    print!("{report}");
                    return if report.exact() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    };
                }
                Err(e) => Err(e.to_string()),
            }
        }
        Command::Verify {
            trace: Some(trace),
            stdin,
            thread,
            command,
            no_pin,
            ..
        } => {
            let opts = aetrace_verify::VerifyOptions {
                stdin,
                thread,
                command,
                no_pin,
            };
            match aetrace_verify::verify_trace(&trace, &opts) {
                Ok(report) => {
                    print!("{report}");
                    return if report.exact() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    };
                }
                Err(e) => Err(e.to_string()),
            }
        }
        // clap requires one of the two.
        Command::Verify { trace: None, .. } => Err("give a TRACE or --profile PROFILE".into()),
        Command::Cachesim { args } => return aetrace_cachesim::cli::main(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => fail(&message),
    }
}

/// Status 1 after a one-line error.
fn fail(message: &str) -> ExitCode {
    eprintln!("aetrace: error: {message}");
    ExitCode::from(1)
}

/// The exit of a command that ran the program: the program's own status
/// (or signal), or status 1 after the error.
fn exit_like<E: std::fmt::Display>(r: Result<aetrace_record::launch::Outcome, E>) -> ExitCode {
    match r {
        Ok(outcome) => aetrace_record::commands::exit_like(outcome),
        Err(e) => fail(&e.to_string()),
    }
}
