//! Writes the decompressed witness streams of a trace, thread after thread,
//! to one file: the raw bytes the traced program wrote, which
//! `bench/record.sh` compresses at other zstd levels than the recorder's to
//! show how the all-predicates / optimal size ratio depends on the
//! compressor (paper 003, Table 3 compares raw witness bytes).
//!
//! Usage: `witness_streams TRACE OUT`

use std::io::Write;
use std::process::ExitCode;

use aetrace_format::{ThreadId, TraceFile};

fn run(trace: &str, out: &str) -> Result<(), String> {
    let t = TraceFile::open(trace).map_err(|e| format!("{trace}: {e}"))?;
    t.require_complete().map_err(|e| format!("{trace}: {e}"))?;
    let mut w =
        std::io::BufWriter::new(std::fs::File::create(out).map_err(|e| format!("{out}: {e}"))?);
    for thread in 0..t.threads().len() as u32 {
        for chunk in t.chunks(ThreadId(thread)) {
            let bytes = chunk.decompress().map_err(|e| format!("{trace}: {e}"))?;
            w.write_all(&bytes).map_err(|e| format!("{out}: {e}"))?;
        }
    }
    w.flush().map_err(|e| format!("{out}: {e}"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [trace, out] = args.as_slice() else {
        eprintln!("usage: witness_streams TRACE OUT");
        return ExitCode::from(2);
    };
    match run(trace, out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("witness_streams: {e}");
            ExitCode::FAILURE
        }
    }
}
