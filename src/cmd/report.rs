//! `aetrace report`: a profile's report (text, JSON or callgrind) on stdout.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    profile: PathBuf,
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Procedures and blocks listed by the text report.
    #[arg(long, default_value_t = 20)]
    top: usize,
}

#[derive(Copy, Clone, clap::ValueEnum)]
enum Format {
    Text,
    Json,
    Callgrind,
}

impl From<Format> for aetrace_profile::report::Format {
    fn from(f: Format) -> Self {
        match f {
            Format::Text => Self::Text,
            Format::Json => Self::Json,
            Format::Callgrind => Self::Callgrind,
        }
    }
}

pub fn run(a: Args) -> super::Result {
    let p = aetrace_profile::read(&a.profile)?;
    // Rendered first: the JSON writer's errors carry no I/O kind, and a
    // closed pipe must be told from a failed report.
    let mut report = Vec::new();
    aetrace_profile::report::write(&p, a.format.into(), a.top, &mut report)?;
    std::io::stdout()
        .lock()
        .write_all(&report)
        .map_err(aetrace_profile::Error::Output)?;
    Ok(ExitCode::SUCCESS)
}
