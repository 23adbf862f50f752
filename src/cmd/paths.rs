//! `aetrace paths`: runs the program with Ball-Larus path counters, writes
//! its path profile, prints the report (stderr or `--report`) and ends
//! like the program.

use std::io::Write;
use std::path::PathBuf;

use aetrace_record::paths::PathsOptions;

use super::{exit_like, Libs, Output, Program};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    output: Output,
    /// Procedures, and paths of each, the report lists.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Report as JSON.
    #[arg(long)]
    json: bool,
    /// Write the report here instead of stderr.
    #[arg(long)]
    report: Option<PathBuf>,
    #[command(flatten)]
    libs: Libs,
    #[command(flatten)]
    program: Program,
}

pub fn run(a: Args) -> super::Result {
    let (program, args) = a.program.split();
    let opts = PathsOptions {
        output: a.output.output,
        top: a.top,
        json: a.json,
        libs: a.libs.selection()?,
        program,
        args,
    };
    let ran = aetrace_record::paths::paths(&opts)?;
    match &a.report {
        Some(r) => aetrace_format::atomic::write_atomic(r, &ran.report, None)?,
        None => std::io::stderr()
            .write_all(&ran.report)
            .map_err(aetrace_record::Error::Output)?,
    }
    Ok(exit_like(ran.outcome))
}
