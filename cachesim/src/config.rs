//! Cache geometry and policies: Dinero IV's `-lN-T<option>` family, with its
//! defaults, and the checks that refuse an impossible geometry.
//!
//! Defaults (Dinero IV's): associativity 1, replacement LRU, demand fetch,
//! write-allocate always, write-back always, no `-ccc`.  `-lN-Tsize` and
//! `-lN-Tbsize` have no default and must be given.
//!
//! Dinero's consistency rules hold for a checked hierarchy: no level is
//! missing below a given one; a level is unified or split, not both; a
//! level below a unified one is unified; an instruction cache has no write
//! policy.  A split level may have only one side (the other kind of
//! reference then goes straight to the level below).
//!
//! Invariants of a checked [`CacheConfig`]: size, block size and
//! associativity are powers of two; `bsize <= size`; `assoc * bsize <= size`;
//! so the number of sets is a power of two too.

use crate::cache::Repl;
use crate::{Error, Result};

/// Largest level number (`-l1-` .. `-l5-`), as in Dinero IV.
pub const MAX_LEVEL: usize = 5;

/// Most blocks one cache may have (its tags take 8 bytes each).
pub const MAX_BLOCKS: u64 = 1 << 28;

/// Which references a cache takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Side {
    /// Takes every reference.
    Unified,
    /// Takes instruction fetches only.
    Instr,
    /// Takes data references (reads, writes, misc) only.
    Data,
}

impl Side {
    /// The side's letter in Dinero's names and options (`u`, `i`, `d`).
    pub fn letter(self) -> char {
        match self {
            Side::Unified => 'u',
            Side::Instr => 'i',
            Side::Data => 'd',
        }
    }
    fn index(self) -> usize {
        match self {
            Side::Unified => 0,
            Side::Instr => 1,
            Side::Data => 2,
        }
    }
}

/// Write-allocate policy (`-lN-Twalloc a|n|f`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum WriteAlloc {
    /// Allocate a block on every write miss.
    Always,
    /// Never allocate on a write miss (write around).
    Never,
    /// Allocate only when the write covers whole blocks (no fetch needed).
    NoFetch,
}

/// Write-back policy (`-lN-Twback a|n|f`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum WriteBack {
    /// Write back: dirty blocks go to the next level when evicted.
    Always,
    /// Write through.
    Never,
    /// Write back when no fetch is needed; without sub-blocks this is always.
    NoFetch,
}

/// One checked cache.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CacheConfig {
    /// Dinero's name, e.g. `l1-icache`.
    pub name: String,
    /// 1-based level.
    pub level: usize,
    /// Which references the cache takes.
    pub side: Side,
    /// Capacity in bytes (a power of two).
    pub size: u64,
    /// Block size in bytes (a power of two).
    pub bsize: u64,
    /// Ways per set.
    pub assoc: u64,
    /// Replacement policy.
    pub repl: Repl,
    /// Write-allocate policy.
    pub walloc: WriteAlloc,
    /// Write-back policy.
    pub wback: WriteBack,
    /// Whether to classify misses into compulsory, capacity and conflict (`-ccc`).
    pub ccc: bool,
}

impl CacheConfig {
    /// A checked cache with Dinero's default policies.
    pub fn new(level: usize, side: Side, size: u64, bsize: u64, assoc: u64) -> Result<Self> {
        let c = CacheConfig {
            name: format!("l{level}-{}cache", side.letter()),
            level,
            side,
            size,
            bsize,
            assoc,
            repl: Repl::Lru,
            walloc: WriteAlloc::Always,
            wback: WriteBack::Always,
            ccc: false,
        };
        c.check()?;
        Ok(c)
    }

    /// The number of sets: size / (block size × ways).
    pub fn sets(&self) -> u64 {
        self.size / (self.bsize * self.assoc)
    }

    /// Refuses an impossible geometry.
    pub fn check(&self) -> Result<()> {
        let n = &self.name;
        let pow2 = |what: &str, v: u64| {
            if v == 0 || !v.is_power_of_two() {
                Err(Error::Usage(format!(
                    "{n}: {what} {v} is not a power of two"
                )))
            } else {
                Ok(())
            }
        };
        pow2("size", self.size)?;
        pow2("block size", self.bsize)?;
        pow2("associativity", self.assoc)?;
        if self.bsize > self.size {
            return Err(Error::Usage(format!(
                "{n}: block size {} is larger than the cache ({} bytes)",
                self.bsize, self.size
            )));
        }
        if self.assoc > self.size / self.bsize {
            return Err(Error::Usage(format!(
                "{n}: associativity {} exceeds the {} blocks of the cache",
                self.assoc,
                self.size / self.bsize
            )));
        }
        if self.size / self.bsize > MAX_BLOCKS {
            return Err(Error::Usage(format!(
                "{n}: {} blocks is more than this simulator holds ({MAX_BLOCKS})",
                self.size / self.bsize
            )));
        }
        Ok(())
    }
}

/// Options given for one (level, side) before checking.
#[derive(Clone, Debug, Default)]
struct Pending {
    size: Option<u64>,
    bsize: Option<u64>,
    sbsize: Option<u64>,
    assoc: Option<u64>,
    repl: Option<Repl>,
    walloc: Option<WriteAlloc>,
    wback: Option<WriteBack>,
    ccc: bool,
    /// Some option mentioned this cache.
    mentioned: bool,
}

/// Collects `-lN-T...` options, then builds the checked hierarchy.
#[derive(Clone, Debug, Default)]
pub struct HierarchyBuilder {
    levels: [[Pending; 3]; MAX_LEVEL],
}

/// Parses Dinero's scaled power-of-two value: decimal with an optional
/// `k`/`m`/`g` suffix (either case).
pub fn parse_scaled(opt: &str, v: &str) -> Result<u64> {
    let (digits, shift) = match v.as_bytes().last() {
        Some(b'k' | b'K') => (&v[..v.len() - 1], 10),
        Some(b'm' | b'M') => (&v[..v.len() - 1], 20),
        Some(b'g' | b'G') => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    let bad = || {
        Error::Usage(format!(
            "{opt} {v}: expected a decimal number with an optional k, m or g suffix"
        ))
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift).ok_or_else(bad)
}

impl HierarchyBuilder {
    /// Tries to take `opt` (with its value `arg`, when it needs one).
    /// Returns `Ok(None)` if `opt` is not a `-lN-T...` option, else how many
    /// arguments it used.
    pub fn take(&mut self, opt: &str, arg: Option<&str>) -> Result<Option<usize>> {
        let Some(rest) = opt.strip_prefix("-l") else {
            return Ok(None);
        };
        let Some((level, rest)) = rest.split_once('-') else {
            return Ok(None);
        };
        let Ok(level) = level.parse::<usize>() else {
            return Ok(None);
        };
        if level == 0 || level > MAX_LEVEL {
            return Err(Error::Usage(format!("{opt}: level must be 1..{MAX_LEVEL}")));
        }
        let mut chars = rest.chars();
        let side = match chars.next() {
            Some('u') => Side::Unified,
            Some('i') => Side::Instr,
            Some('d') => Side::Data,
            _ => return Err(Error::Usage(format!("{opt}: cache type must be u, i or d"))),
        };
        let name = chars.as_str();
        let p = &mut self.levels[level - 1][side.index()];
        p.mentioned = true;
        if name == "ccc" {
            p.ccc = true;
            return Ok(Some(1));
        }
        let known = [
            "size", "bsize", "sbsize", "assoc", "repl", "fetch", "walloc", "wback", "pfdist",
            "pfabort",
        ];
        if !known.contains(&name) {
            return Err(Error::Usage(format!("\"{opt}\" option not recognized")));
        }
        let Some(v) = arg else {
            return Err(Error::Usage(format!(
                "\"{opt}\" option requires an argument"
            )));
        };
        let letter = |choices: &str| -> Result<char> {
            let mut cs = v.chars();
            match (cs.next(), cs.next()) {
                (Some(c), None) if choices.contains(c) => Ok(c),
                _ => Err(Error::Usage(format!(
                    "{opt} {v}: expected one of {choices}"
                ))),
            }
        };
        match name {
            "size" => p.size = Some(parse_scaled(opt, v)?),
            "bsize" => p.bsize = Some(parse_scaled(opt, v)?),
            "sbsize" => p.sbsize = Some(parse_scaled(opt, v)?),
            "assoc" => {
                p.assoc =
                    Some(v.parse().map_err(|_| {
                        Error::Usage(format!("{opt} {v}: expected a decimal number"))
                    })?)
            }
            "repl" => {
                p.repl = Some(match letter("lfr")? {
                    'l' => Repl::Lru,
                    'f' => Repl::Fifo,
                    _ => Repl::Random,
                })
            }
            "walloc" => {
                p.walloc = Some(match letter("anf")? {
                    'a' => WriteAlloc::Always,
                    'n' => WriteAlloc::Never,
                    _ => WriteAlloc::NoFetch,
                })
            }
            "wback" => {
                p.wback = Some(match letter("anf")? {
                    'a' => WriteBack::Always,
                    'n' => WriteBack::Never,
                    _ => WriteBack::NoFetch,
                })
            }
            "fetch" => {
                if letter("damtls")? != 'd' {
                    return Err(Error::Usage(format!(
                        "{opt} {v}: only demand fetch (d) is implemented; prefetching is not"
                    )));
                }
            }
            _ => {
                return Err(Error::Usage(format!(
                    "{opt}: prefetch options are not implemented (only demand fetch is)"
                )))
            }
        }
        Ok(Some(2))
    }

    /// True if no cache option was given.
    pub fn is_empty(&self) -> bool {
        self.levels.iter().flatten().all(|p| !p.mentioned)
    }

    /// Checks and returns the caches in Dinero's order (level 1 first; per
    /// level unified, instruction, data).
    pub fn build(&self) -> Result<Vec<CacheConfig>> {
        let max = self
            .levels
            .iter()
            .rposition(|l| l.iter().any(|p| p.mentioned))
            .ok_or_else(|| {
                Error::Usage("no cache given (e.g. -l1-usize 32k -l1-ubsize 64)".into())
            })?;
        let mut out = Vec::new();
        for (li, level) in self.levels[..=max].iter().enumerate() {
            let lv = li + 1;
            let [u, i, d] = level;
            if !u.mentioned && !i.mentioned && !d.mentioned {
                return Err(Error::Usage(format!(
                    "level {lv} has no cache but level {} does",
                    max + 1
                )));
            }
            if u.mentioned && (i.mentioned || d.mentioned) {
                return Err(Error::Usage(format!(
                    "level {lv} cannot have both a unified and a split cache"
                )));
            }
            if li > 0 && self.levels[li - 1][0].mentioned && !u.mentioned {
                return Err(Error::Usage(format!(
                    "level {li} cache is unified, level {lv} is not"
                )));
            }
            if i.walloc.is_some() || i.wback.is_some() {
                return Err(Error::Usage(format!(
                    "level {lv} icache cannot have a write-allocate or write-back policy"
                )));
            }
            for (side, p) in [(Side::Unified, u), (Side::Instr, i), (Side::Data, d)] {
                if !p.mentioned {
                    continue;
                }
                let o = |what: &str| format!("-l{lv}-{}{what}", side.letter());
                let size = p
                    .size
                    .ok_or_else(|| Error::Usage(format!("{} must be given", o("size"))))?;
                let bsize = p
                    .bsize
                    .ok_or_else(|| Error::Usage(format!("{} must be given", o("bsize"))))?;
                if let Some(sb) = p.sbsize {
                    if sb != bsize {
                        return Err(Error::Usage(format!(
                            "{} {sb}: sub-blocks smaller than the block are not implemented",
                            o("sbsize")
                        )));
                    }
                }
                let mut c = CacheConfig::new(lv, side, size, bsize, p.assoc.unwrap_or(1))?;
                c.repl = p.repl.unwrap_or(Repl::Lru);
                c.walloc = p.walloc.unwrap_or(WriteAlloc::Always);
                c.wback = p.wback.unwrap_or(WriteBack::Always);
                c.ccc = p.ccc;
                out.push(c);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(args: &[&str]) -> Result<Vec<CacheConfig>> {
        let mut b = HierarchyBuilder::default();
        let mut k = 0;
        while k < args.len() {
            let used = b
                .take(args[k], args.get(k + 1).copied())?
                .expect("cache option");
            k += used;
        }
        b.build()
    }

    #[test]
    fn defaults_and_suffixes() {
        let c = build(&[
            "-l1-dsize",
            "16k",
            "-l1-dbsize",
            "32",
            "-l1-isize",
            "1M",
            "-l1-ibsize",
            "64",
        ])
        .unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(
            (c[0].name.as_str(), c[0].size, c[0].assoc),
            ("l1-icache", 1 << 20, 1)
        );
        assert_eq!(
            (c[1].name.as_str(), c[1].size, c[1].bsize),
            ("l1-dcache", 16384, 32)
        );
        assert_eq!(
            (c[1].repl, c[1].walloc, c[1].wback, c[1].ccc),
            (Repl::Lru, WriteAlloc::Always, WriteBack::Always, false)
        );
    }

    #[test]
    fn impossible_geometries_are_refused() {
        let msg = |a: &[&str]| build(a).unwrap_err().to_string();
        assert!(msg(&["-l1-usize", "3000", "-l1-ubsize", "64"]).contains("not a power of two"));
        assert!(msg(&["-l1-usize", "64", "-l1-ubsize", "128"]).contains("larger than the cache"));
        assert!(
            msg(&["-l1-usize", "1k", "-l1-ubsize", "64", "-l1-uassoc", "3"])
                .contains("power of two")
        );
        assert!(
            msg(&["-l1-usize", "1k", "-l1-ubsize", "64", "-l1-uassoc", "32"]).contains("exceeds")
        );
        assert!(msg(&["-l1-usize", "1k"]).contains("-l1-ubsize must be given"));
        assert!(
            msg(&["-l1-usize", "1g", "-l1-ubsize", "2"]).contains("more than this simulator holds")
        );
        assert!(msg(&[
            "-l1-usize",
            "1k",
            "-l1-ubsize",
            "64",
            "-l2-isize",
            "4k",
            "-l2-ibsize",
            "64"
        ])
        .contains("level 1 cache is unified, level 2 is not"));
        assert!(
            msg(&["-l1-isize", "1k", "-l1-ibsize", "64", "-l1-iwback", "n"])
                .contains("icache cannot")
        );
        assert!(msg(&["-l2-usize", "1k", "-l2-ubsize", "64"]).contains("level 1 has no cache"));
        assert!(msg(&["-l1-usize", "1x", "-l1-ubsize", "64"]).contains("suffix"));
        assert!(msg(&["-l1-ufetch", "a"]).contains("only demand"));
        assert!(msg(&["-l1-urepl", "x"]).contains("one of"));
        assert!(msg(&["-l6-usize", "1k"]).contains("level must be"));
        assert!(msg(&["-l1-ufoo", "1k"]).contains("not recognized"));
    }
}
