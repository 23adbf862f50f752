//! `aetrace record`: runs the program with its trace recorded and ends
//! like it.

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
    #[command(flatten)]
    program: Program,
}

pub fn run(a: Args) -> super::Result {
    let (program, args) = a.program.split();
    let opts = RecordOptions {
        trace: a.output.output,
        libs: a.libs.selection()?,
        placement: a.placement.into(),
        program,
        args,
    };
    Ok(exit_like(aetrace_record::commands::record(&opts)?))
}
