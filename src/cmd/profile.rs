//! `aetrace profile`: runs the program with edge counters, writes its
//! profile, warns about counts it may lack, and ends like the program.

use std::path::PathBuf;

use aetrace_record::counted::ProfileOptions;
use aetrace_rewrite::counters::CountPlacement;

use super::{exit_like, warn, Libs, Output, Program};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    output: Output,
    /// optimal (counters on spanning-tree chords) or every-block.
    #[arg(long, value_enum, default_value = "optimal")]
    placement: Placement,
    /// `heuristic`, or a previous profile whose counts weight the spanning trees.
    #[arg(long, default_value = "heuristic", value_parser = weights)]
    weights: Weights,
    /// Also write the text report here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Also write the profile in callgrind format here (callgrind_annotate, KCachegrind).
    #[arg(long)]
    callgrind: Option<PathBuf>,
    #[command(flatten)]
    libs: Libs,
    #[command(flatten)]
    program: Program,
}

#[derive(Copy, Clone, clap::ValueEnum)]
enum Placement {
    Optimal,
    EveryBlock,
}

/// `--weights`: the static heuristic or a previous profile.
#[derive(Clone)]
enum Weights {
    Heuristic,
    Profile(PathBuf),
}

fn weights(s: &str) -> Result<Weights, std::convert::Infallible> {
    Ok(match s {
        "heuristic" => Weights::Heuristic,
        path => Weights::Profile(path.into()),
    })
}

pub fn run(a: Args) -> super::Result {
    let (program, args) = a.program.split();
    let opts = ProfileOptions {
        output: a.output.output,
        placement: match a.placement {
            Placement::Optimal => CountPlacement::Optimal,
            Placement::EveryBlock => CountPlacement::EveryBlock,
        },
        weights: match a.weights {
            Weights::Heuristic => None,
            Weights::Profile(p) => Some(p),
        },
        report: a.report,
        callgrind: a.callgrind,
        libs: a.libs.selection()?,
        program,
        args,
    };
    let p = aetrace_record::counted::profile(&opts)?;
    let see = p.output.display();
    for note in &p.handler_notes {
        warn(&format!("{note}; see {see}"));
    }
    if let Some(first) = p.unrecovered.first() {
        // The program's own status stays the exit status; the profile
        // marks these procedures and this says so.
        warn(&format!(
            "counts not recovered for {} procedure(s), e.g. {first} ({}); see {see}",
            p.unrecovered.len(),
            p.status,
        ));
    }
    Ok(exit_like(p.outcome))
}
