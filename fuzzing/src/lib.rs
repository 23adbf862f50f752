//! `aetrace-fuzzing`: the bodies of aetrace's fuzz targets, one per reader
//! of outside input (issue 25), callable on stable Rust.
//!
//! The cargo-fuzz project `fuzz/` (nightly, libFuzzer) calls each body from
//! a `fuzz_target!`; this crate's test `tests/corpus.rs` replays the
//! committed corpus `fuzz/corpus/TARGET/` and the findings
//! `fuzz/regressions/TARGET/` through the same bodies, plus a short
//! deterministic mutation loop ([`mutate`]), so CI (stable only) catches a
//! reader that panics again. `docs/fuzzing.md` lists the runs and findings.
//!
//! Invariant: a body feeds its bytes to the readers exactly as the binary
//! does and discards their errors, so a panic, an abort, a hang or an
//! unbounded allocation is the reader's (the one assertion of a body is
//! [`progdb`]'s: a decoded database encodes back to itself). Readers are
//! never made to see bytes through a file: only in-memory entry points.
//! Nothing depends on this crate (its arrows only point down).

pub mod mutate;
pub mod seal;

use std::io::sink;
use std::path::{Path, PathBuf};

use aetrace_cachesim::config::{CacheConfig, Side};
use aetrace_cachesim::dinero::Hierarchy;
use aetrace_cachesim::trace::{parse_chunk, InFormat, Reader, Ref};
use aetrace_format::addrtrace::{AddrStreamReader, AddrTrace};
use aetrace_format::progdb::ProgramDb;
use aetrace_format::Trace;
use aetrace_regen::compile::{Addressing, Module as Compiled};
use aetrace_regen::{Format, Options};

/// A fuzz target: its name (the directory of its corpus) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, in the order `bench/run fuzz` runs them.
pub const TARGETS: [Target; 6] = [
    ("elf_cfg", elf_cfg),
    ("trace_regen", trace_regen),
    ("progdb", progdb),
    ("addrtrace", addrtrace),
    ("din", din),
    ("profile", profile),
];

/// `aetrace cfg FILE` (summary and JSON) on `data` as an ELF file.
pub fn elf_cfg(data: &[u8]) {
    let path = PathBuf::from("fuzz.elf");
    let Ok(module) = aetrace_analysis::elf::Module::from_bytes(path, data.to_vec()) else {
        return;
    };
    let program = aetrace_analysis::analyze(module);
    for output in [
        aetrace_analysis::report::Output::Summary,
        aetrace_analysis::report::Output::Json,
    ] {
        let _ = aetrace_analysis::report::write_program(&program, output, &mut sink());
    }
}

/// `aetrace regen`, `regen --count` and `info` on `data` as a trace, after
/// [`seal::reseal`] has made its checksums right (the checksums themselves
/// are the format's proptests' business): what a corrupted-but-consistent
/// file reaches.
pub fn trace_regen(data: &[u8]) {
    let sealed = seal::reseal(data);
    let Ok(trace) = Trace::parse(&sealed[..]) else {
        return;
    };
    let _ = trace.require_complete();
    let _ = trace.stats();
    for t in trace.threads() {
        for c in trace.chunks(t.start.thread) {
            let _ = c.decompress();
        }
    }
    let opts = Options::default();
    let _ = aetrace_regen::regen_trace(&trace, &opts, &mut sink());
    let _ = aetrace_regen::info::info_of(&trace);
}

/// A program database as the regenerator reads it: decoded, re-encoded
/// (which must give the same bytes back) and compiled to tables.
pub fn progdb(data: &[u8]) {
    let Ok(db) = ProgramDb::decode(data) else {
        return;
    };
    let again = ProgramDb::decode(&db.encode());
    assert!(
        matches!(again, Ok(d) if d == db),
        "re-encoding changed the database"
    );
    for format in [Some(Format::Insn), None] {
        let _ = Compiled::compile("fuzz", 0, &db, format, Addressing::Runtime { load_base: 0 });
    }
}

/// The `bin` address-trace format, mapped and streamed, then simulated.
pub fn addrtrace(data: &[u8]) {
    if let Ok(t) = AddrTrace::parse(data) {
        let refs: Vec<Ref> = t
            .records()
            .map(|r| Ref {
                kind: r.kind,
                addr: r.addr,
                size: u32::from(r.size),
            })
            .collect();
        simulate(&refs);
    }
    if let Ok(mut r) = AddrStreamReader::new(data) {
        let mut block = Vec::new();
        while r.next_block_into(&mut block).is_ok() && !block.is_empty() {}
    }
}

/// cachesim's din and extended din parsers, in place and streamed, then
/// simulated.
pub fn din(data: &[u8]) {
    for format in [InFormat::Din, InFormat::XDin] {
        let mut refs = Vec::new();
        if parse_chunk(data, format, &mut refs).is_ok() {
            simulate(&refs);
        }
        let mut reader = Reader::text(Box::new(std::io::Cursor::new(data.to_vec())), format);
        while reader.next_batch(&mut refs).is_ok() && !refs.is_empty() {}
    }
}

/// Dinero's semantics on `refs` with a small two-level hierarchy.
fn simulate(refs: &[Ref]) {
    let caches = [
        CacheConfig::new(1, Side::Instr, 1024, 32, 2),
        CacheConfig::new(1, Side::Data, 1024, 32, 2),
        CacheConfig::new(2, Side::Unified, 8192, 64, 4),
    ];
    let caches: Vec<CacheConfig> = caches.into_iter().flatten().collect();
    let mut h = Hierarchy::new(caches, 1);
    h.run(refs);
    h.finish();
}

/// `aetrace report` (text, JSON, callgrind) on `data` as an edge profile,
/// and the path-profile reports on it as a path profile.
pub fn profile(data: &[u8]) {
    use aetrace_profile::report::{write, Format};
    let name = Path::new("fuzz.json");
    if let Ok(p) = aetrace_profile::parse(data, name) {
        for format in [Format::Text, Format::Json, Format::Callgrind] {
            let _ = write(&p, format, 20, &mut sink());
        }
    }
    if let Ok(p) = aetrace_profile::paths::parse(data, name) {
        let _ = aetrace_profile::paths::text_report(&p, 20, &mut sink());
        let _ = aetrace_profile::paths::json_report(&p, 20, &mut sink());
    }
}
