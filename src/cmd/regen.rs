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
    /// Write here instead of stdout (`-`: stdout).
    #[arg(short, long, value_parser = to_file)]
    output: Option<Dest>,
    /// The state index to start pieces from (default: TRACE.idx if it
    /// exists; `aetrace index` writes it).
    #[arg(long, value_name = "FILE")]
    index: Option<PathBuf>,
    /// Cut streams with the fast pass even if an index exists.
    #[arg(long, conflicts_with = "index")]
    no_index: bool,
    /// With `--format xdin` or `bin`: data references too (`r`/`w` lines,
    /// read and write records) from a `record --data` trace; `--format
    /// lackey` always has them.
    #[arg(long)]
    data: bool,
}

/// `--format`: what each line (or record) is.
#[derive(Copy, Clone, clap::ValueEnum)]
enum Format {
    Insn,
    Block,
    Din,
    Xdin,
    Bin,
    /// valgrind lackey's `--trace-mem=yes` text (a data trace).
    Lackey,
}

impl From<Format> for aetrace_regen::Format {
    fn from(f: Format) -> Self {
        match f {
            Format::Insn => Self::Insn,
            Format::Block => Self::Block,
            Format::Din => Self::Din,
            Format::Xdin => Self::Xdin,
            Format::Bin => Self::Bin,
            Format::Lackey => Self::Xdin,
        }
    }
}

pub fn run(a: Args) -> super::Result {
    let data = match a.format {
        Format::Lackey => Some(super::dataout::DataFormat::Lackey),
        Format::Xdin if a.data => Some(super::dataout::DataFormat::Xdin),
        Format::Bin if a.data => Some(super::dataout::DataFormat::Bin),
        _ if a.data => return Err("--data needs --format xdin, bin or lackey".into()),
        _ => None,
    };
    if let Some(f) = data {
        return run_data(a, f);
    }
    let trace = aetrace_format::TraceFile::open(&a.trace)?;
    let index = (!a.no_index)
        .then(|| super::index::load(&a.trace, a.index.as_deref(), &trace))
        .flatten();
    let opts = aetrace_regen::Options {
        format: a.format.into(),
        module: a.module,
        relative: a.relative,
        thread: a.thread,
        jobs: a.jobs,
        count: a.count,
        piece_bytes: a.piece,
        index,
    };
    let count = opts.count;
    // The first regeneration of the whole trace keeps its states and
    // writes the index `-j N` starts pieces from (issue 24 item 4).
    let indexing = opts.index.is_none()
        && !a.no_index
        && a.index.is_none()
        && a.thread.is_none()
        && opts.module.is_none()
        && !count;
    let interval = indexing.then_some(aetrace_regen::index::DEFAULT_INTERVAL);
    let out = a.output.as_ref().and_then(Dest::file);
    let (endings, index) = aetrace_regen::regen_trace_indexing(&trace, &opts, out, interval)?;
    if let Some(index) = index {
        // Written under a temporary name and renamed; a directory we may
        // not write in only means the next run has no index either.
        let _ = index.save(&aetrace_regen::index::StateIndex::sidecar(&a.trace));
    }
    if !count {
        // --count prints them with the totals.
        for e in endings {
            eprintln!("aetrace: {e}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The data trace (`--format lackey`, `--format xdin|bin --data`): with
/// `-j N` from a state index that keeps the data walk's states, else one
/// walk, which (the whole trace, no index) writes that index.
fn run_data(a: Args, format: super::dataout::DataFormat) -> super::Result {
    if a.relative || a.count {
        return Err("--relative and --count do not apply to data traces yet".into());
    }
    let trace = aetrace_format::TraceFile::open(&a.trace)?;
    let index = (!a.no_index)
        .then(|| super::index::load(&a.trace, a.index.as_deref(), &trace))
        .flatten();
    let indexing = index.as_ref().map_or(true, |i| no_data_states(i))
        && !a.no_index
        && a.index.is_none()
        && a.thread.is_none()
        && a.module.is_none();
    let opts = aetrace_regen::Options {
        format: aetrace_regen::Format::Xdin,
        module: a.module,
        relative: false,
        thread: a.thread,
        jobs: a.jobs,
        count: false,
        piece_bytes: a.piece,
        index,
    };
    let mut out: Box<dyn std::io::Write> = match a.output.as_ref().and_then(Dest::file) {
        Some(p) => Box::new(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut out = std::io::BufWriter::with_capacity(1 << 16, &mut out);
    let interval = if indexing {
        aetrace_regen::index::DEFAULT_INTERVAL
    } else {
        0
    };
    let (_, index) = super::dataout::write_indexing(&trace, &opts, format, &mut out, interval)?;
    std::io::Write::flush(&mut out)?;
    if let Some(index) = index {
        // As for a control trace (`run`): no index is no error.
        let _ = index.save(&aetrace_regen::index::StateIndex::sidecar(&a.trace));
    }
    Ok(ExitCode::SUCCESS)
}

/// An index kept by a control walk alone (`regen` without `--data`, or
/// an older `aetrace index`): the data walk writes one with its states.
fn no_data_states(i: &aetrace_regen::index::StateIndex) -> bool {
    i.threads.values().flatten().all(|e| e.data.is_empty())
}

/// Where `-o` writes: a file, or stdout for `-` (as the other tools read
/// it; a file named `-` is `./-`).
#[derive(Clone, Debug)]
enum Dest {
    Stdout,
    File(PathBuf),
}

impl Dest {
    fn file(&self) -> Option<&std::path::Path> {
        match self {
            Dest::Stdout => None,
            Dest::File(p) => Some(p),
        }
    }
}

fn to_file(s: &str) -> Result<Dest, std::convert::Infallible> {
    Ok(match s {
        "-" => Dest::Stdout,
        _ => Dest::File(PathBuf::from(s)),
    })
}
