//! `aetrace regen`: the instruction or block trace of a recorded run, on
//! stdout or into `-o FILE`.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    trace: PathBuf,
    #[arg(long, value_enum, default_value = "insn")]
    format: Format,
    /// Keep only this module (file name or path).
    #[arg(long)]
    module: Option<String>,
    /// Offsets from the module's base instead of run-time addresses.
    #[arg(long)]
    relative: bool,
    /// Only this thread.
    #[arg(long)]
    thread: Option<u32>,
    /// Parallel workers (0: one per CPU): threads, and pieces of long streams.
    #[arg(short = 'j', long, default_value_t = 0)]
    jobs: usize,
    /// Print totals only.
    #[arg(long)]
    count: bool,
    /// Stream bytes per parallel piece of one thread (default: automatic).
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    piece: u64,
    /// Write here instead of stdout.
    #[arg(short, long)]
    output: Option<PathBuf>,
}

/// `--format`: what each line (or record) is.
#[derive(Copy, Clone, clap::ValueEnum)]
enum Format {
    Insn,
    Block,
    Din,
    Xdin,
    Bin,
}

impl From<Format> for aetrace_regen::Format {
    fn from(f: Format) -> Self {
        match f {
            Format::Insn => Self::Insn,
            Format::Block => Self::Block,
            Format::Din => Self::Din,
            Format::Xdin => Self::Xdin,
            Format::Bin => Self::Bin,
        }
    }
}

pub fn run(a: Args) -> super::Result {
    let opts = aetrace_regen::Options {
        format: a.format.into(),
        module: a.module,
        relative: a.relative,
        thread: a.thread,
        jobs: a.jobs,
        count: a.count,
        piece_bytes: a.piece,
    };
    let count = opts.count;
    let endings = aetrace_regen::regen_to(&a.trace, &opts, a.output.as_deref())?;
    if !count {
        // --count prints them with the totals.
        for e in endings {
            eprintln!("aetrace: {e}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
