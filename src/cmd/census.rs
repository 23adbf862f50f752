//! `aetrace census PROFILE`: per module of a profile, the dynamic share of
//! data references whose address is static, TLS, stack-derived, derived,
//! an entry value's, or needs a recorded value, and the bytes a data trace
//! would record (`docs/data-census.md`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use aetrace_analysis::addr::census::Class;
use aetrace_profile::census::{weigh, ModuleCensus};

#[derive(clap::Args)]
pub struct Args {
    /// A profile written by `aetrace profile`.
    profile: PathBuf,
    /// Print the census as JSON (per module: classes, lackey forms, bytes).
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> super::Result {
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
