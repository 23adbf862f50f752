//! Source lines of code addresses from DWARF `.debug_line` (gimli), for the
//! profile reports' and `aetrace verify`'s `file:line`, and the source
//! files of the callgrind output (`fl=`/`fi=`/`fe=`).
//!
//! Invariants: rows are sorted by address (program order among equal ones);
//! valgrind's rows (`vg_rows`) are a subsequence;
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
    /// The rows as valgrind keeps them: a row with the line of the row
    /// before it in its sequence does not start a range of its own (its
    /// file, if another, is not seen: code inlined from a header at the
    /// call's line number stays in the caller's file).
    vg_rows: Vec<(u64, u64, u32, u32)>,
    /// Per file index: the name as the line table gives it, and the full
    /// path as valgrind names it (the file's directory, itself under the
    /// compilation directory when relative, then the name).
    files: Vec<(String, String)>,
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
        out.vg_rows.sort_by_key(|r| r.0);
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
                    let mut last = None;
                    for (a, f, l) in seq.drain(..) {
                        self.rows.push((a, end, f, l));
                        if last != Some(l) {
                            self.vg_rows.push((a, end, f, l));
                            last = Some(l);
                        }
                    }
                    continue;
                }
                let Some(line) = row.line() else { continue };
                let file = match names.get(&row.file_index()) {
                    Some(&f) => f,
                    None => {
                        let string = |a| {
                            dwarf
                                .attr_string(&unit, a)
                                .ok()
                                .map(|s| s.to_string_lossy().into_owned())
                        };
                        let entry = row.file(h);
                        let name = entry
                            .and_then(|f| string(f.path_name()))
                            .unwrap_or_else(|| "???".into());
                        let dir = entry.and_then(|f| f.directory(h)).and_then(string);
                        let comp_dir = unit.comp_dir.map(|d| d.to_string_lossy().into_owned());
                        let full = full_path(comp_dir.as_deref(), dir.as_deref(), &name);
                        self.files.push((name, full));
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
        let (f, l) = row(&self.rows, addr)?;
        Some((self.files[f].0.as_str(), l))
    }

    /// The file's full path and line of the code at `addr` as valgrind
    /// (and so callgrind) gives them.
    pub fn path_at(&self, addr: u64) -> Option<(&str, u32)> {
        let (f, l) = row(&self.vg_rows, addr)?;
        Some((self.files[f].1.as_str(), l))
    }
}

/// The row of `rows` (sorted) covering `addr`: file index and line.
fn row(rows: &[(u64, u64, u32, u32)], addr: u64) -> Option<(usize, u32)> {
    let i = rows.partition_point(|r| r.0 <= addr).checked_sub(1)?;
    let (_, end, f, l) = rows[i];
    (addr < end).then_some((f as usize, l))
}

/// `name` under its directory `dir`, a relative `dir` under the
/// compilation directory: valgrind's (and so callgrind's) name of a source
/// file.
fn full_path(comp_dir: Option<&str>, dir: Option<&str>, name: &str) -> String {
    let join = |a: &str, b: &str| {
        if b.starts_with('/') || a.is_empty() {
            b.to_string()
        } else {
            format!("{}/{b}", a.trim_end_matches('/'))
        }
    };
    let dir = match (comp_dir, dir) {
        (Some(c), Some(d)) => join(c, d),
        (None, Some(d)) => d.to_string(),
        (c, None) => c.unwrap_or_default().to_string(),
    };
    join(&dir, name)
}
