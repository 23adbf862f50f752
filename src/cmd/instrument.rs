//! `aetrace instrument`: writes the rewritten program, which run without
//! the recorder writes its raw witness streams to `$AETRACE_OUT`.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    file: PathBuf,
    #[arg(short, long)]
    output: PathBuf,
    #[arg(long, value_enum, default_value = "optimal")]
    placement: super::Placement,
}

pub fn run(a: Args) -> super::Result {
    aetrace_record::commands::instrument_to(&a.file, &a.output, a.placement.into())?;
    Ok(ExitCode::SUCCESS)
}
