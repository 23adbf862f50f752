//! `aetrace cfg`: the procedures and control-flow graphs of an ELF file, as
//! a summary, Graphviz DOT or JSON on stdout.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use aetrace_analysis::report::{write_cfg, Output};

#[derive(clap::Args)]
pub struct Args {
    /// The ELF executable or shared object.
    file: PathBuf,
    /// Show only the procedure with this name or start address (hex with 0x).
    #[arg(long)]
    function: Option<String>,
    /// Print each selected procedure's CFG as Graphviz DOT.
    #[arg(long, conflicts_with = "json")]
    dot: bool,
    /// Print the module and its procedures as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> super::Result {
    let output = if a.json {
        Output::Json
    } else if a.dot {
        Output::Dot
    } else {
        Output::Summary
    };
    let mut w = std::io::BufWriter::new(std::io::stdout().lock());
    write_cfg(&a.file, a.function.as_deref(), output, &mut w)?;
    w.flush().map_err(aetrace_analysis::Error::Output)?;
    Ok(ExitCode::SUCCESS)
}
