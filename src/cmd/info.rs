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
    let info = aetrace_regen::info::info(&a.trace)?;
    aetrace_regen::info::write_info(&info, a.json, &mut std::io::stdout().lock())?;
    if let (Some(values), false) = (info.data_values, a.json) {
        data_refs(&a.trace, values, info.stats.compressed_bytes)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A data trace's references, counted by regenerating them (lackey's
/// count), and the recorded bytes per reference.
fn data_refs(trace: &std::path::Path, values: u64, compressed: u64) -> super::Result {
    let opts = aetrace_regen::Options {
        format: aetrace_regen::Format::Xdin,
        ..Default::default()
    };
    let c = super::dataout::write(
        trace,
        &opts,
        super::dataout::DataFormat::Xdin,
        &mut std::io::sink(),
    )?;
    let per = |b: u64| b as f64 / c.refs.max(1) as f64;
    let share = |n: u64| 100.0 * n as f64 / c.refs.max(1) as f64;
    let derived = c.refs - c.static_refs - c.recorded_refs;
    println!(
        "data references: {} ({} static {:.1}%, {} derived {:.1}%, {} recorded {:.1}%); \
         value bytes per reference {:.3} raw; whole trace {:.3} compressed bytes per reference",
        c.refs,
        c.static_refs,
        share(c.static_refs),
        derived,
        share(derived),
        c.recorded_refs,
        share(c.recorded_refs),
        per(values * 8),
        per(compressed)
    );
    if c.checked_refs > 0 {
        println!(
            "data check: {} recomputed addresses equal to the full ones",
            c.checked_refs
        );
    }
    Ok(ExitCode::SUCCESS)
}
