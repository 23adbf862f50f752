//! A reader of valgrind callgrind's output format (`--dump-instr=yes
//! --collect-jumps=yes`), written for the tests: per-instruction Ir and
//! per-conditional-jump taken counts of one object, and the per-function
//! totals `callgrind_annotate` prints. Shares nothing with aetrace.
//!
//! Format notes (callgrind 3.19): names are compressed as `(id) name` on
//! first use and `(id)` after; positions are `instr line`, each either
//! absolute (`0x...`), relative to the previous position (`+n`/`-n`,
//! decimal) or unchanged (`*`); the line after `calls=` holds the call's
//! inclusive cost (not the instruction's own); `jcnd=taken/executed target`
//! and `jump=` precede the position line of the jump instruction. A jump
//! into another function (a `.cold` part) is recorded as a call
//! (`calls=count target` before the jump's position line), not as `jcnd`.
//! Source files: `fl=` sets the file of the following positions, `fi=` and
//! `fe=` change it inside a function (inlined code); file names are
//! compressed in one table shared by `fl`, `fi`, `fe`, `cfi`, `cfl` and
//! `jfi`, function names by `fn`, `cfn` and `jfn`.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

#[derive(Default, Debug)]
pub struct Object {
    /// Ir per instruction address.
    pub ir: HashMap<u64, u64>,
    /// Taken count per conditional jump address.
    pub taken: HashMap<u64, u64>,
    /// Count of every `calls=` record per source address (a call, or a jump
    /// callgrind saw as one).
    pub calls: HashMap<u64, u64>,
    /// Source file and line of every instruction with a cost.
    pub source: HashMap<u64, (String, u64)>,
}

fn name(map: &mut HashMap<String, String>, s: &str) -> String {
    let s = s.trim();
    if let Some(rest) = s.strip_prefix('(') {
        let (id, tail) = rest.split_once(')').expect("compressed name");
        let tail = tail.trim();
        if !tail.is_empty() {
            map.insert(id.to_string(), tail.to_string());
        }
        return map.get(id).cloned().unwrap_or_default();
    }
    s.to_string()
}

fn position(tok: &str, cur: u64) -> u64 {
    if let Some(h) = tok.strip_prefix("0x") {
        u64::from_str_radix(h, 16).expect("hex position")
    } else if let Some(d) = tok.strip_prefix('+') {
        cur + d.parse::<u64>().expect("relative position")
    } else if let Some(d) = tok.strip_prefix('-') {
        cur - d.parse::<u64>().expect("relative position")
    } else if tok == "*" {
        cur
    } else {
        tok.parse().expect("position")
    }
}

/// The costs callgrind recorded for the object whose file name ends with
/// `module` (`ob=` lines).
pub fn parse(path: &Path, module: &str) -> Object {
    let text = std::fs::read_to_string(path).expect("callgrind output");
    let mut obs = HashMap::new();
    let mut fns = HashMap::new();
    let mut files = HashMap::new();
    let mut ob = String::new();
    let mut file = String::new();
    let (mut addr, mut line_no) = (0u64, 0u64);
    let mut skip_cost: Option<u64> = None;
    let mut pending_jcnd: Option<u64> = None;
    let mut out = Object::default();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("ob=") {
            ob = name(&mut obs, v);
        } else if let Some(v) = line.strip_prefix("cob=") {
            name(&mut obs, v);
        } else if let Some(v) = ["fl=", "fi=", "fe="]
            .iter()
            .find_map(|k| line.strip_prefix(k))
        {
            file = name(&mut files, v);
        } else if let Some(v) = ["cfi=", "cfl=", "jfi="]
            .iter()
            .find_map(|k| line.strip_prefix(k))
        {
            name(&mut files, v);
        } else if let Some(v) = ["fn=", "cfn=", "jfn="]
            .iter()
            .find_map(|k| line.strip_prefix(k))
        {
            name(&mut fns, v);
        } else if let Some(v) = line.strip_prefix("calls=") {
            let n = v.split_whitespace().next().unwrap().parse::<u64>().unwrap();
            skip_cost = Some(n);
        } else if let Some(v) = line.strip_prefix("jcnd=") {
            let taken = v.split('/').next().unwrap().parse::<u64>().unwrap();
            pending_jcnd = Some(taken);
        } else if line.starts_with("jump=") {
            pending_jcnd = None;
        } else if is_cost_line(line) {
            let mut parts = line.split_whitespace();
            addr = position(parts.next().unwrap(), addr);
            line_no = position(parts.next().unwrap_or("*"), line_no);
            let cost = parts.next().map(|c| c.parse::<u64>().unwrap());
            let ours = ob.ends_with(module);
            if let Some(t) = pending_jcnd.take() {
                if ours {
                    *out.taken.entry(addr).or_default() += t;
                }
                continue;
            }
            if let Some(n) = skip_cost.take() {
                if ours {
                    *out.calls.entry(addr).or_default() += n;
                }
                continue;
            }
            if let (Some(c), true) = (cost, ours) {
                *out.ir.entry(addr).or_default() += c;
                out.source.insert(addr, (file.clone(), line_no));
            }
        }
    }
    out
}

/// A cost line: its first position is a number, relative (`+`/`-`) or
/// the same as before (`*`).
fn is_cost_line(line: &str) -> bool {
    line.chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || "+-*".contains(c))
}

/// The name aetrace gives a function callgrind names `name`: recursion
/// levels (`fib'2`, callgrind's --separate-recs) are one function;
/// functions without a symbol, which callgrind names by address, are
/// `sub_<hex>`.
pub fn normal_name(name: &str) -> String {
    let func = name.split_once('\'').map_or(name, |(f, _)| f);
    match func.strip_prefix("0x") {
        Some(h) => format!("sub_{:x}", u64::from_str_radix(h, 16).unwrap_or(0)),
        None => func.to_string(),
    }
}

/// A function as callgrind names it: (object, name).
pub type Func = (String, String);

/// One `calls=` line: caller, call position, callee, count, inclusive cost.
#[derive(Debug, Clone)]
pub struct Call {
    pub caller: Func,
    pub site: u64,
    pub callee: Func,
    pub count: u64,
    pub inclusive: u64,
}

/// Every `calls=` line of a callgrind-format file.
pub fn calls(path: &Path) -> Vec<Call> {
    let text = std::fs::read_to_string(path).expect("callgrind output");
    let (mut obs, mut fns) = (HashMap::new(), HashMap::new());
    let (mut ob, mut func, mut cob, mut cfn) = (String::new(), String::new(), None, String::new());
    let mut pending: Option<u64> = None;
    let mut addr = 0u64;
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("ob=") {
            ob = name(&mut obs, v);
        } else if let Some(v) = line.strip_prefix("cob=") {
            cob = Some(name(&mut obs, v));
        } else if let Some(v) = line.strip_prefix("fn=") {
            func = name(&mut fns, v);
        } else if let Some(v) = line.strip_prefix("cfn=") {
            cfn = name(&mut fns, v);
        } else if let Some(v) = line.strip_prefix("calls=") {
            pending = Some(v.split_whitespace().next().unwrap().parse().unwrap());
        } else if is_cost_line(line) {
            let mut parts = line.split_whitespace();
            addr = position(parts.next().unwrap(), addr);
            if let Some(count) = pending.take() {
                // `instr line cost` in callgrind's files, `instr cost` in
                // files with `positions: instr`.
                let inclusive = parts.last().unwrap().parse().unwrap();
                out.push(Call {
                    caller: (ob.clone(), func.clone()),
                    site: addr,
                    callee: (cob.take().unwrap_or_else(|| ob.clone()), cfn.clone()),
                    count,
                    inclusive,
                });
            }
        }
    }
    out
}

/// `valgrind --tool=callgrind` with every instruction and jump dumped,
/// PLT stubs apart, `extra` options, writing `out` (`%p` allowed).
pub fn command(extra: &[&str], out: &Path) -> Command {
    let mut c = Command::new("valgrind");
    c.args([
        "--tool=callgrind",
        "--dump-instr=yes",
        "--collect-jumps=yes",
        "--skip-plt=no",
    ])
    .args(extra)
    .arg(format!("--callgrind-out-file={}", out.display()));
    c
}

/// Runs the program under callgrind; returns the output file. PLT stubs
/// are kept apart (`--skip-plt=no`): by default callgrind charges them to
/// the calling instruction.
pub fn run(exe: &Path, args: &[&str], out: &Path) -> std::process::Output {
    let o = command(&[], out)
        .arg(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("valgrind");
    assert!(
        out.is_file(),
        "callgrind wrote nothing: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// `callgrind_annotate --threshold=100 FILE`: Ir per function of the object
/// whose name ends with `module`, recursion levels merged.
pub fn annotate(file: &Path, module: &str) -> HashMap<String, u64> {
    annotate_with(file, module, false)
}

/// [`annotate`], with `--inclusive=yes` when `inclusive`.
pub fn annotate_with(file: &Path, module: &str, inclusive: bool) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for ((_, func), n) in annotate_files(file, module, inclusive) {
        *out.entry(func).or_default() += n;
    }
    out
}

/// `callgrind_annotate`'s per-function totals as it names functions,
/// `file:function`: Ir per (source file, function), recursion levels
/// merged.
pub fn annotate_files(
    file: &Path,
    module: &str,
    inclusive: bool,
) -> HashMap<(String, String), u64> {
    // Without source annotation: only the function table.
    let o = Command::new("callgrind_annotate")
        .args(["--threshold=100", "--auto=no"])
        .arg(format!(
            "--inclusive={}",
            if inclusive { "yes" } else { "no" }
        ))
        .arg(file)
        .output()
        .expect("callgrind_annotate");
    assert!(
        o.status.success(),
        "callgrind_annotate {}: {}",
        file.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    // `55,374 (29.53%)  file.c:main [/path/prog]`: (cost, file, function,
    // object). callgrind_annotate names the object only of a function
    // entered by `fn=`, not of the `file:function` parts `fi=`/`fe=` add
    // (inlined code): those take the object of the same function's part
    // that has one.
    let mut rows = Vec::new();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let Some((cost, rest)) = line.trim_start().split_once(' ') else {
            continue;
        };
        let Ok(n) = cost.replace(',', "").parse::<u64>() else {
            continue;
        };
        let (func, obj) = match rest.rsplit_once(" [") {
            // Not a C++ clone's `[clone .isra.0]`.
            Some((f, o)) if o.ends_with(']') && !o.starts_with("clone ") => {
                (f, Some(o.trim_end_matches(']').to_string()))
            }
            _ => (rest, None),
        };
        // After the share; file names have no `:`, C++ function names may.
        let func = match func.trim_start().strip_prefix('(') {
            Some(r) => r.split_once(')').map_or(r, |x| x.1),
            None => func,
        };
        let Some((src, func)) = func.trim().split_once(':') else {
            continue;
        };
        rows.push((n, src.to_string(), normal_name(func.trim()), obj));
    }
    let obj_of: HashMap<String, String> = rows
        .iter()
        .filter_map(|(_, _, f, o)| Some((f.clone(), o.clone()?)))
        .collect();
    let mut out = HashMap::new();
    for (n, src, func, obj) in rows {
        if obj
            .or_else(|| obj_of.get(&func).cloned())
            .is_some_and(|o| o.ends_with(module))
        {
            *out.entry((src, func)).or_default() += n;
        }
    }
    out
}

/// `callgrind_annotate --auto=yes FILE`'s annotated source files: per file
/// (as it names them), its text (every shown line with its cost).
pub fn annotated_sources(file: &Path) -> HashMap<String, String> {
    // Every function's file (by default only those of the functions making
    // up 99% of the total: the C library's shift that in callgrind's files).
    let o = Command::new("callgrind_annotate")
        .args(["--auto=yes", "--threshold=100"])
        .arg(file)
        .output()
        .expect("callgrind_annotate");
    assert!(o.status.success(), "callgrind_annotate --auto=yes");
    let mut out = HashMap::new();
    let text = String::from_utf8_lossy(&o.stdout);
    for part in text.split("-- Auto-annotated source: ").skip(1) {
        let (name, body) = part.split_once('\n').unwrap_or((part, ""));
        // The part ends at the next dashed line (the next banner, or the
        // summary).
        let body = body
            .split(&format!("\n{}\n", "-".repeat(80)))
            .next()
            .unwrap_or("");
        out.insert(name.trim().to_string(), body.to_string());
    }
    out
}
