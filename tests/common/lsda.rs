//! Landing pads of C++ exception handling, read without our code: FDEs and
//! their CIE augmentations come from `readelf --debug-dump=frames` (GNU
//! binutils), the LSDAs they point to are decoded here from
//! `.gcc_except_table` (format: the Itanium C++ ABI exception-handling
//! tables as gcc emits them: header, call-site table of uleb128 or udata4
//! records). The oracle accepts an entry "from nowhere" into the middle of
//! a procedure only when it is one of these addresses.

use std::path::Path;
use std::process::Command;

use super::elf::Elf;
use super::FastSet;

const DW_EH_PE_OMIT: u8 = 0xff;

fn uleb(b: &[u8], at: &mut usize) -> u64 {
    let (mut v, mut shift) = (0u64, 0);
    loop {
        let byte = b[*at];
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return v;
        }
    }
}

/// Reads a pointer in encoding `enc` at `b[*at]` (file offset) whose
/// address is `addr_of(*at)`. Only the encodings gcc uses in LSDAs and FDEs.
fn encoded(b: &[u8], at: &mut usize, enc: u8, addr: u64) -> u64 {
    let base = match enc & 0x70 {
        0x00 => 0,
        0x10 => addr,
        e => panic!("LSDA: unsupported pointer application {e:#x}"),
    };
    let v = match enc & 0x0f {
        0x01 => uleb(b, at),
        0x03 => {
            let v = u32::from_le_bytes(b[*at..*at + 4].try_into().unwrap());
            *at += 4;
            u64::from(v)
        }
        0x0b => {
            let v = i32::from_le_bytes(b[*at..*at + 4].try_into().unwrap());
            *at += 4;
            v as i64 as u64
        }
        e => panic!("LSDA: unsupported pointer format {e:#x}"),
    };
    base.wrapping_add(v)
}

fn hex_bytes(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|h| u8::from_str_radix(h, 16).expect("readelf augmentation byte"))
        .collect()
}

/// Size in bytes of a fixed-size pointer encoding.
fn enc_size(enc: u8) -> usize {
    match enc & 0x0f {
        0x03 | 0x0b => 4,
        0x04 | 0x0c | 0x00 => 8,
        0x02 | 0x0a => 2,
        e => panic!("eh_frame: unsupported pointer format {e:#x}"),
    }
}

/// Every landing pad of every function with an LSDA in `path`.
pub fn landing_pads(path: &Path) -> FastSet<u64> {
    let elf = Elf::read(path);
    let Some(eh) = elf.sections.iter().find(|s| s.name == ".eh_frame") else {
        return FastSet::default();
    };
    let out = Command::new("readelf")
        .args(["--debug-dump=frames", "-W"])
        .arg(path)
        .output()
        .expect("running readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    // CIE offset -> (augmentation string, augmentation data).
    let mut cies: std::collections::HashMap<u64, (String, Vec<u8>)> = Default::default();
    let mut pads = FastSet::default();
    let mut current: Option<(bool, u64, u64, u64)> = None; // (is_cie, offset, cie, pc_begin)
    let mut aug = String::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() >= 4 && words[0].len() == 8 && u64::from_str_radix(words[0], 16).is_ok() {
            let off = u64::from_str_radix(words[0], 16).unwrap();
            if words[3] == "CIE" {
                current = Some((true, off, off, 0));
                aug.clear();
            } else if words[3] == "FDE" {
                let cie = u64::from_str_radix(words[4].trim_start_matches("cie="), 16).unwrap();
                let pc = words[5].trim_start_matches("pc=");
                let begin = u64::from_str_radix(pc.split("..").next().unwrap(), 16).unwrap();
                current = Some((false, off, cie, begin));
            } else {
                current = None;
            }
        } else if let Some(a) = line.trim().strip_prefix("Augmentation:") {
            aug = a.trim().trim_matches('"').to_owned();
        } else if let Some(d) = line.trim().strip_prefix("Augmentation data:") {
            let data = hex_bytes(d);
            match current {
                Some((true, off, _, _)) => {
                    cies.insert(off, (aug.clone(), data));
                }
                Some((false, off, cie, begin)) => {
                    let (cie_aug, cie_data) = cies.get(&cie).expect("FDE before its CIE");
                    // Walk the CIE augmentation for the LSDA and FDE encodings.
                    let (mut lsda_enc, mut fde_enc, mut i) = (DW_EH_PE_OMIT, 0u8, 0usize);
                    for c in cie_aug.chars().skip(1) {
                        match c {
                            'P' => i += 1 + enc_size(cie_data[i]),
                            'L' => {
                                lsda_enc = cie_data[i];
                                i += 1;
                            }
                            'R' => {
                                fde_enc = cie_data[i];
                                i += 1;
                            }
                            _ => {}
                        }
                    }
                    if lsda_enc == DW_EH_PE_OMIT || data.is_empty() {
                        continue;
                    }
                    // The LSDA pointer is the FDE's augmentation data, after
                    // length (4), CIE pointer (4), pc_begin and pc_range
                    // (FDE encoding each) and the one-byte augmentation length.
                    let field = eh.addr + off + 8 + 2 * enc_size(fde_enc) as u64 + 1;
                    let mut at = 0;
                    let lsda = encoded(&data, &mut at, lsda_enc, field);
                    if lsda == field || lsda == 0 {
                        continue; // a null LSDA pointer
                    }
                    read_lsda(&elf, lsda, begin, &mut pads);
                }
                None => {}
            }
        }
    }
    pads
}

fn read_lsda(elf: &Elf, lsda: u64, func_start: u64, pads: &mut FastSet<u64>) {
    let sec = elf
        .sections
        .iter()
        .find(|s| !s.nobits && s.addr <= lsda && lsda < s.addr + s.size)
        .unwrap_or_else(|| panic!("LSDA at {lsda:#x} is in no section"));
    let b = elf.bytes_of(sec, sec.addr, sec.size);
    let addr_of = |at: usize| sec.addr + at as u64;
    let mut at = (lsda - sec.addr) as usize;
    let lpstart_enc = b[at];
    at += 1;
    let lpstart = if lpstart_enc == DW_EH_PE_OMIT {
        func_start
    } else {
        let a = addr_of(at);
        encoded(b, &mut at, lpstart_enc, a)
    };
    let ttype_enc = b[at];
    at += 1;
    if ttype_enc != DW_EH_PE_OMIT {
        uleb(b, &mut at);
    }
    let cs_enc = b[at];
    at += 1;
    let cs_len = uleb(b, &mut at) as usize;
    let end = at + cs_len;
    while at < end {
        let _start = encoded(b, &mut at, cs_enc, 0);
        let _len = encoded(b, &mut at, cs_enc, 0);
        let lp = encoded(b, &mut at, cs_enc, 0);
        uleb(b, &mut at); // action
        if lp != 0 {
            pads.insert(lpstart + lp);
        }
    }
}
