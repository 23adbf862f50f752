//! `aetrace census --values TRACE`: the values a `record --data` trace
//! holds, by why abstract execution records them
//! (`analysis::addr::why`), each block's values weighted by the runs of
//! the block from its start that the control walk finds (`regen::visit`).
//! Outside-entry stubs' `rsp` values are not counted (they stand before
//! no instruction), nor thread constants (`Recorded::Once`: one per
//! thread and handler, not per run).

use std::collections::BTreeMap;
use std::path::Path;

use aetrace_analysis::addr::returns::Returns;
use aetrace_analysis::addr::why::{self, Why};
use aetrace_analysis::addr::{forms, InsnProgram};
use aetrace_format::progdb::ProgramDb;
use aetrace_format::{ModuleId, Trace};
use aetrace_regen::compile::Module;
use aetrace_regen::visit::{Event, Visit};
use iced_x86::{Decoder, DecoderOptions, Instruction, InstructionInfoFactory};

type Error = Box<dyn std::error::Error>;

/// Sites listed per module.
const SITES: usize = 12;

/// One module's values by reason.
pub struct ModuleValues {
    pub name: String,
    pub reasons: BTreeMap<Why, u64>,
    /// The most frequent sites: values, instruction address and text, reason.
    pub sites: Vec<(u64, u64, String, Why)>,
    /// Runs that started in a block's middle (after a signal): not counted.
    pub partial_runs: u64,
}

/// Per module of `trace`, its values by reason.
pub fn by_reason(trace: &Path) -> Result<Vec<ModuleValues>, Error> {
    let trace = Trace::open(trace)?;
    let opts = aetrace_regen::Options {
        format: aetrace_regen::Format::Insn,
        module: None,
        relative: false,
        thread: None,
        jobs: 0,
        count: false,
        piece_bytes: 0,
        index: None,
    };
    let visit = Visit::new(&trace, &opts)?;
    let mods = visit.modules();
    let mut runs: Vec<Vec<u64>> = mods.iter().map(|m| vec![0; m.blocks.len()]).collect();
    let mut partial = vec![0u64; mods.len()];
    visit.run(&mut |batch| {
        for e in batch.events() {
            if let Event::Run(r) = e {
                match r.first {
                    0 => runs[r.module as usize][r.block.as_u32() as usize] += 1,
                    _ => partial[r.module as usize] += 1,
                }
            }
        }
        true
    })?;
    (mods.iter().zip(&runs).zip(partial))
        .map(|((m, n), p)| weigh(&trace, m, n, p))
        .collect()
}

fn weigh(
    trace: &Trace<impl AsRef<[u8]>>,
    m: &Module,
    runs: &[u64],
    partial: u64,
) -> Result<ModuleValues, Error> {
    let rec = trace
        .module(ModuleId(m.id))
        .ok_or_else(|| format!("module {} is not in the trace", m.name))?;
    let image = aetrace_analysis::elf::Module::open(Path::new(std::str::from_utf8(&rec.path)?))?;
    let db = trace
        .program_database(ModuleId(m.id))
        .ok_or_else(|| format!("module {} has no program database", m.name))?;
    let db = ProgramDb::decode(&db.decompress()?)?;
    let returns = Returns::of_module(&db, &image);
    let mut info = InstructionInfoFactory::new();
    let mut reasons = BTreeMap::new();
    let mut sites = Vec::new();
    for (pi, p) in m.procs.iter() {
        let range = p.blocks.clone();
        let dbp = &db.procs[pi.as_u32() as usize];
        if !dbp.is_traced() || range.clone().all(|b| runs[b as usize] == 0) {
            continue;
        }
        let mut blocks = range
            .clone()
            .map(|b| decode(&image, m, b, &mut info))
            .collect::<Result<Vec<_>, _>>()?;
        let why = why::reasons(
            dbp,
            &returns,
            &mut blocks,
            &runs[range.start as usize..range.end as usize],
        );
        for ((b, insns), code) in range.clone().zip(why).zip(&blocks) {
            let n = runs[b as usize];
            for (ws, (i, _)) in insns.into_iter().zip(code) {
                for &w in &ws {
                    *reasons.entry(w).or_default() += n;
                }
                if let Some(&w) = ws.first().filter(|_| n != 0) {
                    sites.push((n * ws.len() as u64, i.ip(), i.to_string(), w));
                }
            }
        }
    }
    sites.sort_by_key(|s| std::cmp::Reverse(s.0));
    sites.truncate(SITES);
    Ok(ModuleValues {
        name: m.name.clone(),
        reasons,
        sites,
        partial_runs: partial,
    })
}

fn decode(
    image: &aetrace_analysis::elf::Module,
    m: &Module,
    b: u32,
    info: &mut InstructionInfoFactory,
) -> Result<Vec<(Instruction, InsnProgram)>, Error> {
    let blk = &m.blocks.as_slice()[b as usize];
    let bytes = image
        .bytes_at(blk.start, u64::from(blk.size))
        .ok_or_else(|| format!("block {:#x}: no bytes in {}", blk.start, m.name))?;
    let mut d = Decoder::with_ip(64, bytes, blk.start, DecoderOptions::NONE);
    Ok((0..blk.ninsns)
        .map(|_| {
            let i = d.decode();
            (i, forms::program(&i, info))
        })
        .collect())
}
