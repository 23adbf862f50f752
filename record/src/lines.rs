//! Source lines of code addresses from DWARF `.debug_line` (gimli), for the
//! profile reports' and `aetrace verify`'s `file:line`.
//!
//! Invariants: rows are sorted by address (program order among equal ones);
//! a lookup gives the last row with the greatest address not above the
//! query inside the same sequence, or
//! nothing (no debug information, or an address outside every sequence).
//! Damaged DWARF gives no lines, never a panic.

use gimli::{EndianSlice, LittleEndian, SectionId};

/// Address -> `file:line` of one module.
#[derive(Default)]
pub struct Lines {
    /// `(address, end of its sequence, file index, line)`.
    rows: Vec<(u64, u64, u32, u32)>,
    files: Vec<String>,
}

impl Lines {
    /// The line table of `module` (empty without `.debug_line`).
    pub fn load(module: &crate::elf::Module) -> Lines {
        let section = |id: SectionId| -> Result<EndianSlice<'_, LittleEndian>, ()> {
            let data = module
                .section(id.name())
                .and_then(|s| module.section_bytes(s))
                .unwrap_or(&[]);
            Ok(EndianSlice::new(data, LittleEndian))
        };
        let Ok(dwarf) = gimli::Dwarf::load(section) else {
            return Lines::default();
        };
        let mut out = Lines::default();
        let _ = out.read(&dwarf);
        // Stable: of several rows at one address the last one counts, as
        // for addr2line.
        out.rows.sort_by_key(|r| r.0);
        out
    }

    fn read(&mut self, dwarf: &gimli::Dwarf<EndianSlice<'_, LittleEndian>>) -> gimli::Result<()> {
        let mut units = dwarf.units();
        while let Some(header) = units.next()? {
            let unit = dwarf.unit(header)?;
            let Some(program) = unit.line_program.clone() else {
                continue;
            };
            let mut rows = program.rows();
            let mut seq: Vec<(u64, u32, u32)> = Vec::new();
            let mut names: std::collections::HashMap<u64, u32> = Default::default();
            while let Some((h, row)) = rows.next_row()? {
                if row.end_sequence() {
                    let end = row.address();
                    self.rows
                        .extend(seq.drain(..).map(|(a, f, l)| (a, end, f, l)));
                    continue;
                }
                let Some(line) = row.line() else { continue };
                let file = match names.get(&row.file_index()) {
                    Some(&f) => f,
                    None => {
                        let name = row
                            .file(h)
                            .and_then(|f| dwarf.attr_string(&unit, f.path_name()).ok())
                            .map(|s| s.to_string_lossy().into_owned())
                            .unwrap_or_else(|| "???".into());
                        self.files.push(name);
                        let f = (self.files.len() - 1) as u32;
                        names.insert(row.file_index(), f);
                        f
                    }
                };
                seq.push((row.address(), file, line.get() as u32));
            }
        }
        Ok(())
    }

    /// The file (as the line table names it) and line of the code at `addr`.
    pub fn at(&self, addr: u64) -> Option<(&str, u32)> {
        let i = self.rows.partition_point(|r| r.0 <= addr).checked_sub(1)?;
        let (_, end, f, l) = self.rows[i];
        (addr < end).then(|| (self.files[f as usize].as_str(), l))
    }
}
