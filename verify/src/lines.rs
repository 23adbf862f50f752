//! Source lines for the reports of `aetrace verify`: the DWARF line tables
//! of a module (`.debug_line`, through gimli), flattened into one table
//! sorted by address.
//!
//! Invariants: `rows` is sorted by address; a row covers the addresses up
//! to the next row, and an end-of-sequence row (line 0) covers nothing, so
//! an address between two sequences has no line. A module without DWARF,
//! or with tables gimli refuses, simply has no lines: the reports then give
//! addresses only.

use aetrace_record::elf::Module;
use gimli::{EndianSlice, LittleEndian, SectionId};

/// Address to `file:line` for one module.
#[derive(Debug, Default)]
pub struct Lines {
    /// `(address, index into files, line)`; line 0 ends a sequence.
    rows: Vec<(u64, u32, u32)>,
    files: Vec<String>,
}

impl Lines {
    /// Reads the line tables of `module` (empty when it has none).
    pub fn load(module: &Module) -> Lines {
        let mut lines = Lines::default();
        // A broken table only costs its lines.
        let _ = lines.read(module);
        // At one address an end of sequence sorts before the next sequence's start.
        lines.rows.sort_by_key(|r| (r.0, r.2 != 0));
        lines
    }

    fn read(&mut self, module: &Module) -> gimli::Result<()> {
        let section = |id: SectionId| -> gimli::Result<EndianSlice<'_, LittleEndian>> {
            let bytes = module
                .section(id.name())
                .and_then(|s| module.section_bytes(s))
                .unwrap_or(&[]);
            Ok(EndianSlice::new(bytes, LittleEndian))
        };
        let dwarf = gimli::Dwarf::load(section)?;
        let mut units = dwarf.units();
        while let Some(header) = units.next()? {
            let unit = dwarf.unit(header)?;
            let Some(program) = unit.line_program.clone() else {
                continue;
            };
            let mut rows = program.rows();
            let mut file_of: std::collections::HashMap<u64, u32> = Default::default();
            while let Some((header, row)) = rows.next_row()? {
                if row.end_sequence() {
                    self.rows.push((row.address(), 0, 0));
                    continue;
                }
                let Some(line) = row.line() else { continue };
                let file = match file_of.get(&row.file_index()) {
                    Some(&f) => f,
                    None => {
                        let name = row
                            .file(header)
                            .and_then(|f| dwarf.attr_string(&unit, f.path_name()).ok())
                            .map(|s| s.to_string_lossy().into_owned())
                            .unwrap_or_else(|| "?".into());
                        self.files.push(name);
                        let f = (self.files.len() - 1) as u32;
                        file_of.insert(row.file_index(), f);
                        f
                    }
                };
                self.rows.push((
                    row.address(),
                    file,
                    u32::try_from(line.get()).unwrap_or(u32::MAX),
                ));
            }
        }
        Ok(())
    }

    /// `file:line` of link-time address `addr`, if the tables cover it.
    pub fn at(&self, addr: u64) -> Option<String> {
        let i = self.rows.partition_point(|r| r.0 <= addr).checked_sub(1)?;
        let &(_, file, line) = self.rows.get(i)?;
        if line == 0 {
            return None;
        }
        let name = self.files.get(file as usize)?;
        let short = name.rsplit('/').next().unwrap_or(name);
        Some(format!("{short}:{line}"))
    }
}
