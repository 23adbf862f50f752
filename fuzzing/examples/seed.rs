//! Turns recorded traces into fuzz seeds (`fuzz/seed.sh`):
//! `seed stored IN OUT` writes IN with raw chunks and databases
//! ([`aetrace_fuzzing::seal::stored`]); `seed databases IN PREFIX` writes
//! each program database of IN, decompressed, to `PREFIX.N`.

use std::process::ExitCode;

use aetrace_format::Trace;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("seed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let [cmd, input, out] = args else {
        return Err("usage: seed stored|databases IN OUT".into());
    };
    let bytes = std::fs::read(input).map_err(|e| format!("{input}: {e}"))?;
    match cmd.as_str() {
        "stored" => {
            let s = aetrace_fuzzing::seal::stored(&bytes).ok_or("not a well-formed trace")?;
            std::fs::write(out, s).map_err(|e| format!("{out}: {e}"))
        }
        "databases" => {
            let t = Trace::parse(&bytes[..]).map_err(|e| e.to_string())?;
            for (n, m) in t.modules().iter().enumerate() {
                if let Some(db) = t.program_database(m.id) {
                    let raw = db.decompress().map_err(|e| e.to_string())?;
                    let path = format!("{out}.{n}");
                    std::fs::write(&path, raw).map_err(|e| format!("{path}: {e}"))?;
                }
            }
            Ok(())
        }
        _ => Err(format!("unknown command {cmd}")),
    }
}
