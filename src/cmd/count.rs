//! `aetrace count`: one counter per module (paper 002); says on stderr
//! what happened (the count unless `-o` takes it, the stop, how to stop
//! the written program) and ends like the program.

use std::path::PathBuf;
use std::process::ExitCode;

use aetrace_record::counted::Count;
use aetrace_rewrite::counters::Event;

use super::{exit_like, Libs, Output, Program};

#[derive(clap::Args)]
pub struct Args {
    /// insns, blocks or calls.
    #[arg(long, value_enum, default_value = "insns")]
    event: EventArg,
    #[command(flatten)]
    output: Output,
    #[command(flatten)]
    libs: Libs,
    /// Raise SIGTRAP at the N-th event (insns: before the N-th instruction runs;
    /// blocks: at the N-th block entry; calls: at the N-th callee's entry), so that a
    /// debugger running the same deterministic program stops exactly there.
    #[arg(long, value_name = "N")]
    stop_at: Option<u64>,
    /// With --stop-at: write the rewritten program here (run it under gdb) instead of
    /// running it.
    #[arg(long, value_name = "FILE", requires = "stop_at")]
    write_program: Option<PathBuf>,
    #[command(flatten)]
    program: Program,
}

#[derive(Copy, Clone, clap::ValueEnum)]
enum EventArg {
    Insns,
    Blocks,
    Calls,
}

pub fn run(a: Args) -> super::Result {
    let event = match a.event {
        EventArg::Insns => Event::Insns,
        EventArg::Blocks => Event::Blocks,
        EventArg::Calls => Event::Calls,
    };
    let name = event.name();
    let libs = a.libs.selection()?;
    let (program, args) = a.program.split();
    let stop = a.stop_at.map(|n| (n, a.write_program.as_deref()));
    let (outcome, count) = aetrace_record::counted::count(&program, &args, event, &libs, stop)?;
    match count {
        Count::Written(hint) => {
            eprintln!("aetrace: stops at {name} {hint}");
            return Ok(ExitCode::SUCCESS);
        }
        Count::Refused => {}
        Count::Stopped(n) => eprintln!("aetrace: stopped at {name} {n} (SIGTRAP)"),
        Count::Events(n) => {
            if let Some(at) = a.stop_at {
                eprintln!("aetrace: the program ended before {name} {at} (no stop)");
            }
            let line = format!("{n} {name}\n");
            match &a.output.output {
                Some(p) => std::fs::write(p, line)
                    .map_err(|e| aetrace_record::counted::output_error(p, e))?,
                None => eprint!("aetrace: {line}"),
            }
        }
    }
    Ok(exit_like(outcome))
}
