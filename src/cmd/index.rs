//! `aetrace index`: writes the regenerator's state index beside a trace
//! (`TRACE.idx`, `docs/regen.md` section 4), from which `regen -j N`
//! expands pieces of one stream in parallel without a serial pass first;
//! for a `record --data` trace with the data walk's states too
//! (`regen --data -j N`, `docs/data.md`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use aetrace_regen::index::{StateIndex, DEFAULT_INTERVAL};

#[derive(clap::Args)]
pub struct Args {
    trace: PathBuf,
    /// Stream bytes between two states kept (the pieces `-j` makes start
    /// at kept states).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_INTERVAL)]
    interval: u64,
    /// Write here instead of TRACE.idx.
    #[arg(short, long)]
    output: Option<PathBuf>,
}

pub fn run(a: Args) -> super::Result {
    let trace = aetrace_format::TraceFile::open(&a.trace)?;
    let index = build(&trace, a.interval)?;
    let path = a.output.unwrap_or_else(|| StateIndex::sidecar(&a.trace));
    index.save(&path)?;
    let entries: usize = index.threads.values().map(Vec::len).sum();
    eprintln!(
        "aetrace: {}: {entries} states of {} threads, one per {} stream bytes",
        path.display(),
        index.threads.len(),
        a.interval
    );
    Ok(ExitCode::SUCCESS)
}

/// The state index of `trace`, an entry every `interval` stream bytes,
/// with the data walk's states where the trace has data addresses.
pub fn build<B: AsRef<[u8]> + Sync>(
    trace: &aetrace_format::Trace<B>,
    interval: u64,
) -> Result<StateIndex, Box<dyn std::error::Error>> {
    let mut index = StateIndex::build(trace, interval)?;
    if trace.modules().iter().any(super::dataout::has_data_flag) {
        super::dataout::add_data_states(trace, &mut index)?;
    }
    Ok(index)
}

/// The state index for the trace at `path` (`TRACE.idx`, or `explicit`),
/// checked against `trace`; a missing one is `None`, and so is one that
/// is damaged or another trace's, said in one line on stderr.
pub fn load<B: AsRef<[u8]>>(
    path: &Path,
    explicit: Option<&Path>,
    trace: &aetrace_format::Trace<B>,
) -> Option<std::sync::Arc<StateIndex>> {
    let file = explicit.map_or_else(|| StateIndex::sidecar(path), Path::to_path_buf);
    match StateIndex::load(&file, trace) {
        Ok(index) => index.map(std::sync::Arc::new),
        Err(e) => {
            super::warn(&format!(
                "ignoring {}: {e} (`aetrace index` rebuilds it)",
                file.display()
            ));
            None
        }
    }
}
