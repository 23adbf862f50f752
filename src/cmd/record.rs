//! `aetrace record`: runs the program with its trace recorded and ends
//! like it, also when the trace could not be written whole (then with one
//! error line first).

use aetrace_record::commands::RecordOptions;

use super::{exit_like, Libs, Output, Placement, Program};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    output: Output,
    #[command(flatten)]
    libs: Libs,
    #[arg(long, value_enum, default_value = "optimal")]
    placement: Placement,
    /// Also record data addresses (needs --check for now: docs/data.md).
    #[arg(long)]
    data: bool,
    /// With --data: record every non-static data address in full.
    #[arg(long, requires = "data")]
    check: bool,
    #[command(flatten)]
    program: Program,
}

pub fn run(a: Args) -> super::Result {
    if a.data && !a.check {
        return Err(
            "record --data records every address in full only for now: add --check (docs/data.md)"
                .into(),
        );
    }
    let (program, args) = a.program.split();
    let opts = RecordOptions {
        trace: a.output.output,
        libs: a.libs.selection()?,
        placement: a.placement.into(),
        data: a.data,
        program,
        args,
    };
    let recorded = aetrace_record::commands::record(&opts)?;
    // The program ran to its end: its status is ours, and the one line
    // says the trace is not whole (docs/faults.md).
    if let Some(e) = recorded.incomplete {
        eprintln!("aetrace: error: {e}");
    }
    Ok(exit_like(recorded.outcome))
}
