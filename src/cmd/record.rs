//! `aetrace record`: runs the program with its trace recorded and ends
//! like it, also when the trace could not be written whole (then with one
//! error line first).

use aetrace_record::commands::RecordOptions;
use aetrace_regen::index::StateIndex;
use aetrace_rewrite::DataMode;

use super::{exit_like, Libs, Output, Placement, Program};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    output: Output,
    #[command(flatten)]
    libs: Libs,
    #[arg(long, value_enum, default_value = "optimal")]
    placement: Placement,
    /// Also record data addresses: the values abstract execution cannot
    /// recompute (docs/data.md).
    #[arg(long)]
    data: bool,
    /// With --data: also record every non-static data address in full,
    /// for regen to compare with the recomputed ones.
    #[arg(long, requires = "data")]
    check: bool,
    #[command(flatten)]
    program: Program,
}

pub fn run(a: Args) -> super::Result {
    let (program, args) = a.program.split();
    let opts = RecordOptions {
        trace: a.output.output,
        libs: a.libs.selection()?,
        placement: a.placement.into(),
        data: match (a.data, a.check) {
            (false, _) => DataMode::Off,
            (true, false) => DataMode::Abstract,
            (true, true) => DataMode::Check,
        },
        program,
        args,
    };
    let recorded = aetrace_record::commands::record(&opts)?;
    // A state index kept beside an earlier trace of the same name
    // describes that trace: regen would only warn and rebuild it.
    let _ = std::fs::remove_file(StateIndex::sidecar(&recorded.trace));
    // The program ran to its end: its status is ours, and the one line
    // says the trace is not whole (docs/faults.md).
    if let Some(e) = recorded.incomplete {
        eprintln!("aetrace: error: {e}");
    }
    Ok(exit_like(recorded.outcome))
}
