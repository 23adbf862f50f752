//! `aetrace`: the command-line front end.
//!
//! This file only parses arguments and calls library functions; every
//! subcommand's work lives in one of the workspace crates.
//!
//! Exit codes:
//! - `0`: success.
//! - `1`: the input was refused or the work failed (the one-line message on
//!   stderr says why).
//! - `2`: the command line itself was wrong (clap's usage error).
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
    /// Run the Dinero-compatible cache simulator (same options as `cachesim`).
    #[command(disable_help_flag = true)]
    Cachesim {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Cfg {
            file,
            function,
            dot,
            json,
        } => {
            let output = if json {
                aetrace_record::report::Output::Json
            } else if dot {
                aetrace_record::report::Output::Dot
            } else {
                aetrace_record::report::Output::Summary
            };
            aetrace_record::report::cfg_command(&file, function.as_deref(), output)
                .map_err(|e| e.to_string())
        }
        Command::Cachesim { args } => return aetrace_cachesim::cli::main(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("aetrace: error: {message}");
            ExitCode::from(1)
        }
    }
}
