//! The CFG as `aetrace cfg FILE --json` reports it (the contract in the
//! project brief), parsed with serde_json into plain structs, plus the
//! address indexes the oracle needs.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::{FastMap, FastSet};

#[derive(Clone, Debug)]
pub struct Block {
    pub id: u64,
    pub start: u64,
    pub end: u64,
    pub insns: Vec<u64>,
    pub kind: String,
}

/// `to == None` is the procedure's EXIT vertex.
#[derive(Clone, Debug)]
pub struct Edge {
    pub from: u64,
    pub to: Option<u64>,
    pub kind: String,
}

#[derive(Clone, Debug)]
pub struct Call {
    pub block: u64,
    pub kind: String,
    pub target: Option<u64>,
    pub tail: bool,
}

#[derive(Clone, Debug)]
pub struct IndirectJump {
    pub block: u64,
    pub addr: u64,
    pub resolved: bool,
    /// aetrace's classification when given ("jumptable", "tailcall",
    /// "unresolved", ...).
    pub class: Option<String>,
    /// The jump table's address and number of entries, when given.
    pub table: Option<(u64, u64)>,
    pub targets: Vec<u64>,
}

#[derive(Clone, Debug)]
pub struct Proc {
    pub name: String,
    pub start: u64,
    pub end: u64,
    pub kind: String,
    /// All address ranges (optional field; more than one when a `.cold`
    /// part was joined); defaults to `[start, end)`.
    pub ranges: Vec<(u64, u64)>,
    /// Where calls and tail calls may enter (optional field); defaults to
    /// `start`.
    pub entries: Vec<u64>,
    /// False when aetrace found the procedure but could not build its CFG
    /// (optional field, default true; such a procedure has no blocks).
    pub analysable: bool,
    pub blocks: Vec<Block>,
    pub edges: Vec<Edge>,
    pub calls: Vec<Call>,
    pub indirect_jumps: Vec<IndirectJump>,
}

#[derive(Clone, Debug)]
pub struct Cfg {
    pub summary: Value,
    pub procs: Vec<Proc>,
}

fn field<'a>(v: &'a Value, key: &str, ctx: &str) -> &'a Value {
    v.get(key)
        .unwrap_or_else(|| panic!("cfg json: {ctx}: no field `{key}`"))
}

fn num(v: &Value, key: &str, ctx: &str) -> u64 {
    field(v, key, ctx)
        .as_u64()
        .unwrap_or_else(|| panic!("cfg json: {ctx}: `{key}` is not a u64"))
}

fn text(v: &Value, key: &str, ctx: &str) -> String {
    field(v, key, ctx)
        .as_str()
        .unwrap_or_else(|| panic!("cfg json: {ctx}: `{key}` is not a string"))
        .to_owned()
}

fn array<'a>(v: &'a Value, key: &str, ctx: &str) -> &'a [Value] {
    field(v, key, ctx)
        .as_array()
        .unwrap_or_else(|| panic!("cfg json: {ctx}: `{key}` is not an array"))
}

impl Cfg {
    /// Runs `aetrace cfg FILE --json` and parses its output; panics with
    /// aetrace's stderr if it fails.
    pub fn load(file: &Path) -> Cfg {
        let out = Command::new(super::aetrace())
            .arg("cfg")
            .arg(file)
            .arg("--json")
            .output()
            .expect("running aetrace");
        assert!(
            out.status.success(),
            "aetrace cfg {} --json: {}: {}",
            file.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("aetrace cfg {} --json: bad JSON: {e}", file.display()));
        Cfg::from_json(&v)
    }

    pub fn from_json(v: &Value) -> Cfg {
        let procs = array(v, "procedures", "module")
            .iter()
            .map(Proc::from_json)
            .collect();
        Cfg {
            summary: field(v, "summary", "module").clone(),
            procs,
        }
    }
}

impl Proc {
    fn from_json(p: &Value) -> Proc {
        let name = text(p, "name", "procedure");
        let ctx = format!("procedure {name}");
        let ctx = ctx.as_str();
        let blocks = array(p, "blocks", ctx)
            .iter()
            .map(|b| Block {
                id: num(b, "id", ctx),
                start: num(b, "start", ctx),
                end: num(b, "end", ctx),
                insns: array(b, "insns", ctx)
                    .iter()
                    .map(|i| i.as_u64().expect("insn address is a u64"))
                    .collect(),
                kind: text(b, "kind", ctx),
            })
            .collect();
        let edges = array(p, "edges", ctx)
            .iter()
            .map(|e| Edge {
                from: num(e, "from", ctx),
                to: match field(e, "to", ctx) {
                    Value::String(s) if s == "exit" => None,
                    t => Some(t.as_u64().unwrap_or_else(|| {
                        panic!("cfg json: {ctx}: edge `to` is neither a block id nor \"exit\"")
                    })),
                },
                kind: text(e, "kind", ctx),
            })
            .collect();
        let calls = array(p, "calls", ctx)
            .iter()
            .map(|c| Call {
                block: num(c, "block", ctx),
                kind: text(c, "kind", ctx),
                target: field(c, "target", ctx).as_u64(),
                tail: field(c, "tail", ctx).as_bool().unwrap_or(false),
            })
            .collect();
        let indirect_jumps = array(p, "indirect_jumps", ctx)
            .iter()
            .map(|j| IndirectJump {
                block: num(j, "block", ctx),
                addr: num(j, "addr", ctx),
                resolved: field(j, "resolved", ctx).as_bool().unwrap_or(false),
                class: j.get("class").and_then(Value::as_str).map(str::to_owned),
                table: j
                    .get("table")
                    .and_then(Value::as_u64)
                    .zip(j.get("entries").and_then(Value::as_u64)),
                targets: array(j, "targets", ctx)
                    .iter()
                    .filter_map(Value::as_u64)
                    .collect(),
            })
            .collect();
        let (start, end) = (num(p, "start", ctx), num(p, "end", ctx));
        let ranges = match p.get("ranges").and_then(Value::as_array) {
            Some(rs) => rs
                .iter()
                .map(|r| match r.as_array().map(Vec::as_slice) {
                    Some([s, e]) => (s.as_u64().unwrap(), e.as_u64().unwrap()),
                    _ => (num(r, "start", ctx), num(r, "end", ctx)),
                })
                .collect(),
            None => vec![(start, end)],
        };
        let entries = match p.get("entries").and_then(Value::as_array) {
            Some(es) => es.iter().filter_map(Value::as_u64).collect(),
            None => vec![start],
        };
        Proc {
            start,
            end,
            ranges,
            entries,
            analysable: p.get("analysable").and_then(Value::as_bool).unwrap_or(true),
            kind: text(p, "kind", ctx),
            name,
            blocks,
            edges,
            calls,
            indirect_jumps,
        }
    }
}

/// Where one instruction lives: procedure, block (indices into the vectors)
/// and position inside the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub proc: usize,
    pub block: usize,
    pub pos: usize,
}

/// Address indexes over a [`Cfg`]. An address may belong to several
/// procedures (shared tails, overlapping ranges): every lookup returns all.
pub struct Index<'a> {
    pub cfg: &'a Cfg,
    pub insn: FastMap<u64, Vec<Loc>>,
    pub block_start: FastMap<u64, Vec<(usize, usize)>>,
    pub proc_start: FastMap<u64, usize>,
    /// Addresses right after a call block's last instruction: where a return
    /// (or a longjmp to a setjmp call) lands.
    pub return_addrs: FastSet<u64>,
    /// Intra-procedure edges as (procedure, from block index, to block index).
    pub edges: FastSet<(usize, usize, usize)>,
    /// Kinds of the edges to EXIT, per (procedure, block index).
    pub exit_kinds: FastMap<(usize, usize), Vec<String>>,
    /// Call records per (procedure, block index).
    pub calls: FastMap<(usize, usize), Vec<Call>>,
}

impl<'a> Index<'a> {
    pub fn new(cfg: &'a Cfg) -> Index<'a> {
        let mut ix = Index {
            cfg,
            insn: FastMap::default(),
            block_start: FastMap::default(),
            proc_start: FastMap::default(),
            return_addrs: FastSet::default(),
            edges: FastSet::default(),
            exit_kinds: FastMap::default(),
            calls: FastMap::default(),
        };
        for (pi, p) in cfg.procs.iter().enumerate() {
            ix.proc_start.entry(p.start).or_insert(pi);
            for &e in &p.entries {
                ix.proc_start.entry(e).or_insert(pi);
            }
            let by_id: FastMap<u64, usize> = p
                .blocks
                .iter()
                .enumerate()
                .map(|(bi, b)| (b.id, bi))
                .collect();
            for (bi, b) in p.blocks.iter().enumerate() {
                ix.block_start.entry(b.start).or_default().push((pi, bi));
                for (pos, &a) in b.insns.iter().enumerate() {
                    ix.insn.entry(a).or_default().push(Loc {
                        proc: pi,
                        block: bi,
                        pos,
                    });
                }
                if b.kind == "call" {
                    ix.return_addrs.insert(b.end);
                }
            }
            let lookup = |id: u64| {
                *by_id.get(&id).unwrap_or_else(|| {
                    panic!(
                        "cfg json: procedure {}: edge names unknown block {id}",
                        p.name
                    )
                })
            };
            for e in &p.edges {
                let from = lookup(e.from);
                match e.to {
                    Some(to) => {
                        ix.edges.insert((pi, from, lookup(to)));
                    }
                    None => ix
                        .exit_kinds
                        .entry((pi, from))
                        .or_default()
                        .push(e.kind.clone()),
                }
            }
            for c in &p.calls {
                ix.calls
                    .entry((pi, lookup(c.block)))
                    .or_default()
                    .push(c.clone());
            }
        }
        ix
    }

    pub fn block(&self, l: Loc) -> &'a Block {
        &self.cfg.procs[l.proc].blocks[l.block]
    }

    /// "name+0xoff" for an address, using the first procedure holding it,
    /// the procedure whose ranges contain it, or the nearest procedure
    /// start below it.
    pub fn describe(&self, addr: u64) -> String {
        if let Some(locs) = self.insn.get(&addr) {
            let p = &self.cfg.procs[locs[0].proc];
            // A joined `.cold` part may lie below the primary start.
            return if addr >= p.start {
                format!("{addr:#x} ({}+{:#x})", p.name, addr - p.start)
            } else {
                format!("{addr:#x} ({}-{:#x})", p.name, p.start - addr)
            };
        }
        // Procedures own their `ranges` (joined `.cold` parts included),
        // not only [start, end).
        if let Some(p) = self
            .cfg
            .procs
            .iter()
            .find(|p| p.ranges.iter().any(|&(s, e)| s <= addr && addr < e))
        {
            return format!("{addr:#x} (inside {} but not an instruction of it)", p.name);
        }
        let below = self
            .cfg
            .procs
            .iter()
            .filter(|p| p.start <= addr)
            .max_by_key(|p| p.start);
        match below {
            Some(p) => format!(
                "{addr:#x} (no procedure; after {} which ends at {:#x})",
                p.name, p.end
            ),
            None => format!("{addr:#x} (no procedure)"),
        }
    }
}
