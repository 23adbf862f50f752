//! `aetrace timeline`: the whole run's call tree as Chrome/Perfetto trace
//! JSON (aetrace-debug's `calltree`), written whole or not at all.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    trace: PathBuf,
    /// The JSON file to write (open it in ui.perfetto.dev or chrome://tracing).
    #[arg(short, long)]
    output: PathBuf,
}

pub fn run(a: Args) -> super::Result {
    let trace = aetrace_format::TraceFile::open(&a.trace)?;
    let file = aetrace_format::atomic::AtomicFile::create(&a.output, None)?;
    let mut out = BufWriter::new(file);
    let threads = aetrace_debug::calltree::write_json(&trace, &mut out)?;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.commit()?;
    let events: u64 = threads.iter().map(|t| t.events).sum();
    let mut err = std::io::stderr().lock();
    writeln!(
        err,
        "wrote {events} calls of {} threads to {}",
        threads.len(),
        a.output.display()
    )?;
    Ok(ExitCode::SUCCESS)
}
