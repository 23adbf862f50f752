//! `aetrace census PROFILE`: per module of a profile, the dynamic share of
//! data references whose address is static, TLS, stack-derived, derived,
//! an entry value's, or needs a recorded value, and the bytes a data trace
//! would record (`docs/data-census.md`). With `--values TRACE`: the
//! values a `record --data` trace holds, by why they are recorded
//! (`analysis::addr::why`), weighted by the blocks the trace ran.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use aetrace_analysis::addr::census::Class;
use aetrace_analysis::addr::why::Why;
use aetrace_profile::census::{weigh, ModuleCensus};

#[derive(clap::Args)]
pub struct Args {
    /// A profile written by `aetrace profile` (with `--values`: a trace).
    profile: PathBuf,
    /// The argument is a trace: its recorded values by reason.
    #[arg(long)]
    values: bool,
    /// Print the census as JSON (per module: classes, lackey forms, bytes).
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> super::Result {
    if a.values {
        return run_values(&a.profile);
    }
    let p = aetrace_profile::read(&a.profile)?;
    let modules = weigh(&p)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if a.json {
        serde_json::to_writer_pretty(&mut out, &modules)?;
        writeln!(out)?;
    } else {
        write_table(&mut out, &modules)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

fn write_table(out: &mut impl Write, modules: &[ModuleCensus]) -> std::io::Result<()> {
    write!(
        out,
        "{:<16} {:>13} {:>13} {:>6}",
        "module", "instructions", "references", "ref/I"
    )?;
    for c in Class::ALL {
        write!(out, " {:>8}", c.as_str())?;
    }
    writeln!(out, " {:>9} {:>9} {:>9}", "B/ref", "B/ref+ent", "B/I+ent")?;
    for m in modules {
        let refs = m.refs();
        write!(
            out,
            "{:<16} {:>13} {:>13} {:>6.2}",
            m.name,
            m.instructions,
            refs,
            ratio(refs, m.instructions)
        )?;
        for c in Class::ALL {
            write!(out, " {:>7.1}%", 100.0 * ratio(m.classes[c.as_str()], refs))?;
        }
        let with_entry = m.recorded_bytes + m.entry_bytes;
        writeln!(
            out,
            " {:>9.3} {:>9.3} {:>9.3}",
            ratio(m.recorded_bytes, refs),
            ratio(with_entry, refs),
            ratio(with_entry, m.instructions)
        )?;
    }
    for m in modules {
        writeln!(
            out,
            "{}: rep references of unknown count {:.1}% (once per execution); stack slots not followed in {:.1}% of invocations (a stack address escapes); {} procedure(s) without counts",
            m.name,
            100.0 * ratio(m.rep_unknown, m.refs()),
            100.0 * ratio(m.escaped_invocations, m.invocations),
            m.uncounted.len()
        )?;
    }
    Ok(())
}

/// `--values`: per module of the trace, its values by reason.
fn run_values(trace: &std::path::Path) -> super::Result {
    let mods = values::by_reason(trace)?;
    let mut out = std::io::stdout().lock();
    for m in &mods {
        let total: u64 = m.reasons.values().sum();
        writeln!(
            out,
            "{}: {} values in whole runs ({} runs from a block's middle not counted)",
            m.name, total, m.partial_runs
        )?;
        for w in Why::ALL {
            let n = m.reasons.get(&w).copied().unwrap_or(0);
            if n != 0 {
                writeln!(
                    out,
                    "  {:<15} {:>12} {:>6.1}%",
                    w.as_str(),
                    n,
                    100.0 * ratio(n, total)
                )?;
            }
        }
        for (n, ip, insn, w) in &m.sites {
            writeln!(out, "  site {ip:#x} {n:>12} {:<15} {insn}", w.as_str())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

mod values;
