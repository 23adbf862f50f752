//! A data trace (`record --data`) against lackey, reference by reference,
//! with both streaming: `aetrace regen --format lackey` of the trace runs
//! as a child process whose lines are read as lackey's log arrives
//! (`lackey::run_streaming_data`), and nothing is kept. bzip2 on 20 kB is
//! 25 million instructions: holding both sides would need gigabytes.
//!
//! The rules are issue 21's: per executed instruction of the traced
//! modules (a `rep` once, its iterations' references all), the same
//! module and link-time address, then the same list of (kind, size);
//! addresses inside a traced module's image equal module-relative; stack
//! addresses (the recording must run with address randomisation off, so
//! the stack is the top 128 MiB) below the initial stack pointer equal up
//! to one delta for the whole stack, and above it (the argument and
//! environment area, where valgrind adds variables) up to one delta per
//! 64-byte line; every other address (heap, mmap, other libraries' data)
//! equal up
//! to one delta per page, fixed at the page's first touch and checked at
//! every later one. Lackey's references of a register bit test are
//! VEX's own (`Elf::is_register_bit_test`) and left out. One thread only, as in `exact.rs`.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, ExitStatus};

use super::elf::Elf;
use super::exact::spawn_regen;
use super::lackey::{self, addr_size, ModuleTrace};
use super::recorded::{info_json, instrumented_modules, left_alone_ranges};
use super::{FastMap, STACK_FLOOR};

/// What was compared.
pub struct DataCompared {
    pub instructions: u64,
    pub references: u64,
    /// Lackey's run of the program.
    pub status: ExitStatus,
}

/// A traced module: where our run loaded it and its image's link-time
/// span (allocated sections).
struct Image {
    load_base: u64,
    span: (u64, u64),
}

/// Our side: `aetrace regen --format lackey` read one instruction at a
/// time, the iterations of a `rep` merged into one.
struct Ours {
    regen: Child,
    out: BufReader<ChildStdout>,
    line: Vec<u8>,
    /// The next instruction's address, already read.
    peeked: Option<u64>,
    /// The current instruction's references (kind, address, size).
    refs: Vec<(u8, u64, u32)>,
}

impl Ours {
    fn start(trace: &Path) -> Ours {
        let (regen, out) = spawn_regen(
            Command::new(super::aetrace())
                .args(["regen", "--format", "lackey"])
                .arg(trace),
        );
        Ours {
            regen,
            out,
            line: Vec::new(),
            peeked: None,
            refs: Vec::new(),
        }
    }

    /// The next line, without its newline (`None` at the end).
    fn read(&mut self) -> Result<Option<&[u8]>, String> {
        self.line.clear();
        match self.out.read_until(b'\n', &mut self.line) {
            Ok(0) => Ok(None),
            Ok(_) => Ok(Some(self.line.strip_suffix(b"\n").unwrap_or(&self.line))),
            Err(e) => Err(format!("reading aetrace regen: {e}")),
        }
    }

    /// The next instruction's run-time address, its references in
    /// `self.refs` (`None` at the end of the stream).
    fn next(&mut self) -> Result<Option<u64>, String> {
        self.refs.clear();
        let addr = match self.peeked.take() {
            Some(a) => a,
            None => match self.read()? {
                None => return Ok(None),
                Some(l) => insn_line(l)?,
            },
        };
        while let Some(l) = self.read()? {
            if l.starts_with(b"I  ") {
                let next = insn_line(l)?;
                if next != addr {
                    self.peeked = Some(next);
                    break;
                }
            } else {
                let bad = || format!("aetrace regen: bad line {:?}", String::from_utf8_lossy(l));
                let kind = *l.get(1).ok_or_else(bad)?;
                let (a, n) = l.get(3..).and_then(addr_size).ok_or_else(bad)?;
                self.refs.push((kind, a, n));
            }
        }
        Ok(Some(addr))
    }

    /// The regen child's end: its status and stderr if it failed.
    fn finish(self) -> Result<(), String> {
        drop(self.out);
        let out = self.regen.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "aetrace regen --format lackey: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn insn_line(l: &[u8]) -> Result<u64, String> {
    l.strip_prefix(b"I  ")
        .and_then(addr_size)
        .map(|(a, _)| a)
        .ok_or_else(|| {
            format!(
                "aetrace regen: expected an I line, got {:?}",
                String::from_utf8_lossy(l)
            )
        })
}

/// The deltas fixed so far between our addresses and lackey's.
#[derive(Default)]
struct Deltas {
    /// The initial stack pointer and the stack's delta.
    stack: Option<(u64, u64)>,
    /// Above it, per 64-byte line.
    args: FastMap<u64, u64>,
    pages: FastMap<u64, u64>,
}

/// The comparison's state, shared by lackey's two sinks.
struct State {
    ours: Ours,
    images: Vec<Image>,
    /// Each traced module's file, read by the oracle.
    elves: Vec<Elf>,
    /// Whether lackey's current instruction is a register bit test, whose
    /// references are VEX's, not the program's ([`Elf::is_register_bit_test`]).
    vex_spill: bool,
    /// Our current instruction (module, link-time address) and how many
    /// of its references lackey has matched.
    current: Option<(usize, u64)>,
    used: usize,
    /// Lackey's key of the one thread compared.
    thread: Option<usize>,
    instructions: u64,
    references: u64,
    deltas: Deltas,
    recent: VecDeque<(usize, u64)>,
    error: Option<String>,
}

impl State {
    fn here(&self) -> String {
        format!(
            "instruction {} (after {:x?})",
            self.instructions, self.recent
        )
    }

    /// The previous instruction has no reference lackey did not match.
    fn close(&mut self) -> Result<(), String> {
        match self.ours.refs.get(self.used) {
            Some(r) => Err(format!(
                "{}: ours has a reference lackey has not: {r:x?}",
                self.here()
            )),
            None => Ok(()),
        }
    }

    fn instruction(&mut self, module: usize, thread: usize, link: u64) -> Result<(), String> {
        if *self.thread.get_or_insert(thread) != thread {
            return Err("a second thread: the streaming comparison takes one".into());
        }
        self.close()?;
        let Some(addr) = self.ours.next()? else {
            return Err(format!(
                "{}: ours ends, lackey goes on at {link:#x} of module {module}",
                self.here()
            ));
        };
        let mine = self.module_link(addr);
        if mine != Some((module, link)) {
            return Err(format!(
                "{}: ours {mine:x?} ({addr:#x}), lackey {:x?}",
                self.here(),
                (module, link)
            ));
        }
        self.current = mine;
        self.vex_spill = self.elves[module].is_register_bit_test(link);
        self.used = 0;
        self.instructions += 1;
        if self.recent.len() == 5 {
            self.recent.pop_front();
        }
        self.recent.push_back((module, link));
        Ok(())
    }

    /// The traced module holding run-time address `a` of our run, and `a`
    /// there at link time.
    fn module_link(&self, a: u64) -> Option<(usize, u64)> {
        self.images.iter().enumerate().find_map(|(k, m)| {
            let link = a.wrapping_sub(m.load_base);
            (m.span.0..m.span.1).contains(&link).then_some((k, link))
        })
    }

    fn reference(
        &mut self,
        kind: u8,
        theirs: u64,
        size: u32,
        lackey: &[ModuleTrace],
    ) -> Result<(), String> {
        if self.vex_spill {
            return Ok(());
        }
        let Some(&(k, ours, n)) = self.ours.refs.get(self.used) else {
            return Err(format!(
                "{}: lackey has a reference ours has not: {} {theirs:#x},{size}",
                self.here(),
                kind as char
            ));
        };
        if (k, n) != (kind, size) {
            return Err(format!(
                "{}: reference {}: ours {}{n}, lackey {}{size}",
                self.here(),
                self.used,
                k as char,
                kind as char
            ));
        }
        self.address(ours, theirs, lackey)
            .map_err(|e| format!("{}: reference {}: {e}", self.here(), self.used))?;
        self.used += 1;
        self.references += 1;
        Ok(())
    }

    /// Our address `ours` and lackey's `theirs` agree by the module doc's
    /// rules.
    fn address(&mut self, ours: u64, theirs: u64, lackey: &[ModuleTrace]) -> Result<(), String> {
        if let Some((k, link)) = self.module_link(ours) {
            let bias = lackey[k].bias.unwrap_or(0);
            return (theirs == bias.wrapping_add(link))
                .then_some(())
                .ok_or_else(|| {
                    format!("module {k} address {link:#x} (ours {ours:#x}), lackey {theirs:#x}")
                });
        }
        let delta = theirs.wrapping_sub(ours);
        if ours >= STACK_FLOOR {
            // The first stack reference is `_start`'s read of argc, at the
            // initial stack pointer: frames lie below it, and above it the
            // argument and environment area, which valgrind lays out
            // differently (it adds variables, so every string after them
            // moves): there a delta holds per 64-byte line.
            let (top, d) = *self.deltas.stack.get_or_insert((ours, delta));
            if ours > top {
                let d = *self.deltas.args.entry(ours >> 6).or_insert(delta);
                return (d == delta).then_some(()).ok_or_else(|| {
                    format!("argument area {ours:#x}: lackey {theirs:#x}, its line's delta differs")
                });
            }
            if d != delta {
                return Err(format!(
                    "stack {ours:#x}: lackey {theirs:#x}, the stack's delta differs"
                ));
            }
        }
        let d = *self.deltas.pages.entry(ours >> 12).or_insert(delta);
        (d == delta)
            .then_some(())
            .ok_or_else(|| format!("{ours:#x}: lackey {theirs:#x}, its page's delta differs"))
    }
}

/// Runs `exe args` under lackey and compares every instruction and data
/// reference it reports in the traced modules of `trace` (recorded with
/// `--data` and address randomisation off) with `aetrace regen --format
/// lackey`, and that every traced instruction was compared. `Err` names
/// the first difference.
pub fn against_lackey(trace: &Path, exe: &Path, args: &[&str]) -> Result<DataCompared, String> {
    let info = info_json(trace);
    let paths = instrumented_modules(&info);
    let images = images(&info);
    let excluded = (paths.iter().enumerate())
        .map(|(k, p)| left_alone_ranges(p, &info, k))
        .collect();
    let state = RefCell::new(State {
        ours: Ours::start(trace),
        images,
        elves: paths.iter().map(|p| Elf::read(p)).collect(),
        vex_spill: false,
        current: None,
        used: 0,
        thread: None,
        instructions: 0,
        references: 0,
        deltas: Deltas::default(),
        recent: VecDeque::new(),
        error: None,
    });
    let keep = |r: Result<(), String>, s: &mut State| match r {
        Ok(()) => true,
        Err(e) => {
            s.error = Some(e);
            false
        }
    };
    let mut insn = |m: usize, t: usize, a: u64| {
        let s = &mut *state.borrow_mut();
        keep(s.instruction(m, t, a), s)
    };
    let mut data = |kind: u8, a: u64, n: u32, lackey: &[ModuleTrace]| {
        let s = &mut *state.borrow_mut();
        keep(s.reference(kind, a, n, lackey), s)
    };
    let run = lackey::run_streaming_data(
        exe,
        args,
        &lackey::Launch::default(),
        &paths,
        excluded,
        (&mut insn, &mut data),
    );
    let mut s = state.into_inner();
    if let Some(e) = s.error.take() {
        let _ = s.ours.regen.kill();
        return Err(e);
    }
    s.close()?;
    if let Some(a) = s.ours.next()? {
        return Err(format!("{}: lackey ends, ours goes on at {a:#x}", s.here()));
    }
    let (instructions, references) = (s.instructions, s.references);
    s.ours.finish()?;
    let traced: u64 = (info["instructions"].as_array().unwrap().iter())
        .map(|n| n.as_u64().unwrap())
        .sum();
    if instructions != traced {
        return Err(format!(
            "{instructions} instructions compared, the trace has {traced}"
        ));
    }
    Ok(DataCompared {
        instructions,
        references,
        status: run.status,
    })
}

/// Each instrumented module's load base in our run (`aetrace info`) and
/// its image's span from its section headers.
fn images(info: &serde_json::Value) -> Vec<Image> {
    (info["modules"].as_array().unwrap().iter())
        .filter(|m| m["instrumented"] == true)
        .map(|m| {
            let elf = Elf::read(Path::new(m["path"].as_str().unwrap()));
            let alloc = elf.sections.iter().filter(|s| s.addr != 0);
            let lo = alloc.clone().map(|s| s.addr).min().unwrap();
            let hi = alloc.map(|s| s.addr + s.size).max().unwrap();
            Image {
                load_base: m["load_base"].as_u64().unwrap(),
                span: (lo & !0xfff, hi),
            }
        })
        .collect()
}
