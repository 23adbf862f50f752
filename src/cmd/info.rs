//! `aetrace info`: a trace's summary (text or JSON) on stdout.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    trace: PathBuf,
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> super::Result {
    aetrace_regen::info::info_command(&a.trace, a.json, &mut std::io::stdout().lock())?;
    Ok(ExitCode::SUCCESS)
}
