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
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    aetrace_profile::report::write(&p, a.format.into(), a.top, &mut out)?;
    out.flush().map_err(aetrace_profile::Error::Output)?;
    Ok(ExitCode::SUCCESS)
}
