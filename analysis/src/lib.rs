//! `aetrace-analysis`: what a module's machine code is, read without
//! running it. ELF loading ([`elf`]), PLT stubs ([`plt`]), procedure
//! discovery ([`procs`]), disassembly and CFG recovery ([`build`],
//! [`jumptable`], [`interval`], [`noreturn`]) into one [`cfg::Cfg`] per
//! procedure, C++ landing pads ([`lsda`]), DWARF line tables ([`lines`])
//! and the `aetrace cfg` summary as data ([`report`]). `docs/cfg.md`
//! explains how procedures, blocks and edges are found and where that can
//! fail.
//!
//! The rewriter, the profiler, the recorder and the verifier all read
//! programs through this crate; it depends on none of them.
//!
//! Invariants of a [`Program`]: procedures are in address order of their
//! primary start; their ranges are disjoint across the module; every
//! `Ok(cfg)` satisfies [`cfg::Cfg::check`] (checked in debug builds).

pub mod addr;
pub mod build;
pub mod cfg;
pub mod elf;
pub mod error;
pub mod imports;
pub mod interval;
pub mod jumptable;
pub mod lines;
pub mod lsda;
pub mod noreturn;
pub mod plt;
pub mod procs;
pub mod report;
pub mod signals;

use std::collections::HashMap;
use std::path::Path;

use aetrace_graph::{PrimaryMap, ProcId};
use rayon::prelude::*;

pub use error::{Error, Result};

use crate::cfg::Cfg;
use crate::elf::{Module, R_X86_64_RELATIVE};
use crate::procs::Source;

/// Whether a procedure is compiled code or a PLT stub.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ProcKind {
    /// Compiled code.
    Function,
    /// A PLT stub.
    Plt,
}

/// One recovered procedure.
#[derive(Clone, Debug)]
pub struct Procedure {
    /// Symbol name, `import@plt`, `<plt0>`, or `sub_<hex>`.
    pub name: String,
    /// The symbol naming the primary start, if any.
    pub symbol: Option<String>,
    /// For PLT stubs: the import they jump to.
    pub import: Option<String>,
    /// Compiled code or a PLT stub.
    pub kind: ProcKind,
    /// The primary range `[start, end)`.
    pub start: u64,
    /// End of the primary range (exclusive).
    pub end: u64,
    /// All ranges, sorted (more than one when a `.cold` part or a shared
    /// tail was joined to the primary range).
    pub ranges: Vec<(u64, u64)>,
    /// Where control may enter (the primary start first).
    pub entries: Vec<u64>,
    /// Where the unwinder may enter (C++ landing pads from the LSDAs of the
    /// procedure's FDEs), sorted; each one starts a block.
    pub landing_pads: Vec<u64>,
    /// Every reason to believe its ranges start a procedure, sorted.
    pub sources: Vec<Source>,
    /// The procedure never returns (every path ends in a non-returning call).
    pub noreturn: bool,
    /// The CFG, or why the procedure could not be analysed exactly.
    pub cfg: Result<Cfg, String>,
}

impl Procedure {
    /// Bytes of all ranges.
    pub fn size(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }
}

/// A module with its procedures.
#[derive(Debug)]
pub struct Program {
    /// The ELF module.
    pub module: Module,
    /// Its procedures.
    pub procs: PrimaryMap<ProcId, Procedure>,
    /// FDEs found in `.eh_frame` (for the report).
    pub fdes: usize,
    /// Code no procedure holds, `[start, end)` ascending
    /// (`procs::Discovery::unowned`).
    pub unowned: Vec<(u64, u64)>,
}

impl Program {
    /// Loads and analyses `path`.
    pub fn open(path: &Path) -> Result<Program> {
        Ok(analyze(Module::open(path)?))
    }

    /// The procedure named `name`, or starting at (or containing) the address
    /// `name` (hex with `0x`, or decimal).
    pub fn find(&self, name: &str) -> Option<ProcId> {
        if let Some((id, _)) = self.procs.iter().find(|(_, p)| p.name == name) {
            return Some(id);
        }
        let addr = match name.strip_prefix("0x").or_else(|| name.strip_prefix("0X")) {
            Some(h) => u64::from_str_radix(h, 16).ok()?,
            None => name.parse().ok()?,
        };
        self.procs
            .iter()
            .find(|(_, p)| p.ranges.iter().any(|&(s, e)| addr >= s && addr < e))
            .map(|(id, _)| id)
    }
}

/// Recovers the procedures and CFGs of `module`.
pub fn analyze(module: Module) -> Program {
    let stubs = plt::find_stubs(&module);
    let disc = procs::discover(&module, stubs);
    let relative: HashMap<u64, u64> = module
        .dyn_relocs
        .iter()
        .filter(|r| r.r_type == R_X86_64_RELATIVE)
        .map(|r| (r.offset, r.addend as u64))
        .collect();
    let got = plt::got_names(&module);
    let plt_names: HashMap<u64, Option<String>> = disc
        .stubs
        .iter()
        .map(|s| (s.start, s.import.clone()))
        .collect();
    let names: HashMap<u64, String> = disc
        .plans
        .iter()
        .map(|p| (disc.ranges[p.primary].start, p.name.clone()))
        .collect();
    let ctx = build::Context {
        reader: jumptable::TableReader {
            memory: &module,
            pic: module.kind != elf::ElfKind::Exec,
            relative: &relative,
        },
        plt: &plt_names,
        got: &got,
        names: &names,
        taken: &disc.taken,
        data_words: &disc.data_words,
    };
    // Landing pads, and the FDEs whose LSDA cannot be read exactly: a
    // procedure containing one is not analysed (its unwinder entries are
    // unknown).
    let mut pads: Vec<u64> = Vec::new();
    let mut bad_lsda: Vec<(u64, String)> = Vec::new();
    for (fde, r) in lsda::landing_pads_by_fde(&module) {
        match r {
            Ok(p) => pads.extend(p),
            Err(e) => bad_lsda.push((fde, e.to_string())),
        }
    }
    pads.sort_unstable();
    pads.dedup();
    let symbols: HashMap<u64, &str> = module
        .func_symbols
        .iter()
        .filter(|s| !s.name.is_empty())
        .map(|s| (s.addr, s.name.as_str()))
        .collect();
    let built: Vec<Procedure> = disc
        .plans
        .par_iter()
        .map(|plan| {
            let primary = &disc.ranges[plan.primary];
            let ranges: Vec<(u64, u64)> = plan
                .ranges
                .iter()
                .map(|&i| (disc.ranges[i].start, disc.ranges[i].end))
                .collect();
            let stub = primary.stub.map(|k| &disc.stubs[k]);
            let mut sources: Vec<Source> = plan
                .ranges
                .iter()
                .flat_map(|&i| disc.ranges[i].sources.iter().copied())
                .collect();
            sources.sort_unstable();
            sources.dedup();
            let inside = |a: u64| ranges.iter().any(|&(s, e)| a >= s && a < e);
            let landing_pads: Vec<u64> = pads.iter().copied().filter(|&a| inside(a)).collect();
            let lsda_error = bad_lsda
                .iter()
                .find(|(fde, _)| inside(*fde))
                .map(|(_, e)| e.clone());
            let cfg = match plan
                .ranges
                .iter()
                .find_map(|&i| disc.decoded[i].error.clone())
                .or(lsda_error)
            {
                Some(e) => Err(e),
                None => {
                    let insns: Vec<iced_x86::Instruction> = plan
                        .ranges
                        .iter()
                        .flat_map(|&i| disc.decoded[i].insns.iter().copied())
                        .collect();
                    build::build(
                        &insns,
                        &ranges,
                        &plan.entries,
                        &landing_pads,
                        stub.is_some(),
                        &ctx,
                    )
                    .map_err(|e| e.to_string())
                }
            };
            Procedure {
                name: plan.name.clone(),
                symbol: symbols.get(&primary.start).map(|s| s.to_string()),
                import: stub.and_then(|s| s.import.clone()),
                kind: if stub.is_some() {
                    ProcKind::Plt
                } else {
                    ProcKind::Function
                },
                start: primary.start,
                end: primary.end,
                ranges,
                entries: plan.entries.clone(),
                landing_pads,
                sources,
                noreturn: false,
                cfg,
            }
        })
        .collect();
    let mut procs: PrimaryMap<ProcId, Procedure> = built.into_iter().collect();
    noreturn::apply(&mut procs);
    Program {
        module,
        procs,
        fdes: disc.fdes,
        unowned: disc.unowned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cfg::{CallKind, EdgeKind};

    /// The machine's own stripped binaries: every CFG passes its checks
    /// (debug builds assert them while building) and converts to a `Graph`.
    #[test]
    fn system_binaries_build_checked_cfgs() {
        for path in ["/usr/bin/gzip", "/lib/x86_64-linux-gnu/libbz2.so.1.0"] {
            let p = Program::open(Path::new(path)).unwrap();
            assert!(p.fdes > 0, "{path}");
            for proc in p.procs.values() {
                let cfg = proc
                    .cfg
                    .as_ref()
                    .unwrap_or_else(|e| panic!("{path} {}: {e}", proc.name));
                assert_eq!(cfg.check(), Ok(()), "{path} {}", proc.name);
                let g = cfg.to_graph();
                assert_eq!(g.num_edges(), cfg.edges.len());
                assert_eq!(g.exit(), cfg.exit());
            }
            let s = report::Summary::of(&p);
            assert!(s.code_coverage() >= 99.0, "{path}: {}", s.code_coverage());
        }
    }

    #[test]
    fn gzip_calls_to_exit_do_not_return() {
        let p = Program::open(Path::new("/usr/bin/gzip")).unwrap();
        let exit_plt = p
            .procs
            .values()
            .find(|q| q.name == "exit@plt")
            .expect("exit@plt");
        assert!(exit_plt.noreturn);
        let mut calls_to_exit = 0;
        for q in p.procs.values() {
            let Ok(cfg) = &q.cfg else { continue };
            for c in &cfg.calls {
                if c.kind == CallKind::Plt && c.name.as_deref() == Some("exit") {
                    calls_to_exit += 1;
                    assert!(!c.returns);
                    let out: Vec<EdgeKind> = cfg
                        .edges
                        .values()
                        .filter(|e| e.from == c.block)
                        .map(|e| e.kind)
                        .collect();
                    assert!(
                        out == [EdgeKind::NoReturn]
                            || (c.tail && out.contains(&EdgeKind::TailCall)),
                        "{}: {out:?}",
                        q.name
                    );
                }
            }
        }
        assert!(calls_to_exit > 0);
    }
}
