//! Code emission (docs/rewrite.md, steps 5-6): the runtime placed at the
//! first free page, then the jump tables and the instrumented copies
//! (`codegen`), the signal maps of the copies into the program database,
//! the copies' unwind tables (`unwind`), and, when counting, the init code
//! and the counter segments.
//!
//! Invariants:
//! - addresses ascend: runtime, tables, code (64-byte aligned), unwind
//!   tables, then (counting) init code, counters and path state, each on
//!   pages of its own;
//! - counting encodes the copies twice, the second time with the
//!   counters' final address, and both encodings have the same size
//!   (increments are rip-relative with a 32-bit displacement).

use aetrace_format::progdb::{SigMap, SigPoint};
use aetrace_runtime::layout::TAG_SHIFT;
use aetrace_runtime::{Blob, RuntimeAddrs};

use crate::codegen::{self, Copies, Counting, PathCode};
use crate::elfout::NewSegment;
use crate::plan::Plans;
use crate::unwind::{self, Unwind};
use crate::{counters, pathprof, stop_start, How, Refusal, Result, Rewrite, PAGE};

/// The generated runtime and where it goes.
pub(crate) struct Runtime {
    pub blob: Blob,
    /// Link-time address of its first byte: the module's first free page.
    pub vaddr: u64,
    pub addrs: RuntimeAddrs,
    /// The page after it, where the jump tables and the code go.
    pub code_seg: u64,
}

impl Runtime {
    /// Generates the runtime and places it.
    pub fn place(rw: &Rewrite<'_>) -> Result<Runtime> {
        let vaddr = crate::elfout::first_free_vaddr(rw.prog.module.bytes(), rw.heap_gap())?;
        let blob = aetrace_runtime::generate().map_err(|e| rw.err(Refusal::Runtime(e)))?;
        let code_seg = vaddr + blob.bytes.len() as u64;
        debug_assert_eq!(code_seg % PAGE, 0);
        Ok(Runtime {
            addrs: RuntimeAddrs::new(&blob, vaddr),
            blob,
            vaddr,
            code_seg,
        })
    }
}

/// The outcome of the phase.
pub(crate) struct Emitted {
    /// The copies, at `code_vaddr`.
    pub code: Copies,
    pub code_vaddr: u64,
    /// The copies' unwind tables, when any copy has an FDE.
    pub unwind: Option<Unwind>,
    /// Counting: what it adds.
    pub counted: Option<Counted>,
}

/// What counting adds to the module.
pub(crate) struct Counted {
    /// The init code's entry (maps the counters), run first.
    pub preinit: u64,
    /// A static executable's new entry point (`emit_static_entry`).
    pub static_entry: Option<u64>,
    /// Init code, counters, path state.
    pub segments: Vec<NewSegment>,
}

/// Encodes the plans' copies after the jump tables, and what goes with
/// them.
pub(crate) fn emit(rw: &Rewrite<'_>, runtime: &Runtime, plans: &mut Plans<'_>) -> Result<Emitted> {
    let code_vaddr = plans.tables_end.next_multiple_of(64);
    let counting = counting(rw, plans);
    // The counters go after everything else: their address depends on the
    // code size, which does not depend on it (increments are rip-relative
    // with a 32-bit displacement whatever the target). Encode once to
    // learn the size, then again at the final address.
    let mut code = codegen::generate(&plans.plans, &runtime.addrs, code_vaddr, counting.clone())
        .map_err(|e| rw.err(Refusal::Codegen(e)))?;
    signal_maps(plans, &code);
    // Unwind tables for the copies, in a read-only segment on the page
    // after the code (see `unwind`).
    let unwind_vaddr = (code_vaddr + code.bytes.len() as u64).next_multiple_of(PAGE);
    let unwind = unwind::build(
        &rw.prog.module,
        &code.procs,
        &code.bytes,
        code_vaddr,
        unwind_vaddr,
        (runtime.addrs.sigreturn - 1, runtime.addrs.sigreturn_blocked),
    )?;
    let unwind = (unwind.fdes > 0).then_some(unwind);
    let counted = match counting {
        Some(c) => {
            // The init code on the page after the unwind tables (or the
            // code), then the counters.
            let init_vaddr = match &unwind {
                Some(u) => u.hdr_vaddr + u.bytes.len() as u64,
                None => code_vaddr + code.bytes.len() as u64,
            }
            .next_multiple_of(PAGE);
            Some(count(
                rw, runtime, plans, &mut code, code_vaddr, init_vaddr, c,
            )?)
        }
        None => None,
    };
    Ok(Emitted {
        code,
        code_vaddr,
        unwind,
        counted,
    })
}

/// What the code generator needs to count, but the counters' address.
fn counting(rw: &Rewrite<'_>, plans: &mut Plans<'_>) -> Option<Counting> {
    let How::Count(spec) = rw.how else {
        return None;
    };
    let layout = &mut plans.layout;
    Some(Counting {
        base: 0, // set once the layout is known (`count`)
        atomic: rw.atomic,
        amounts: if spec.events.is_some() {
            layout.amounts.clone()
        } else {
            Vec::new()
        },
        paths: spec.paths.then(|| PathCode {
            fatal_pads: rw.fatal_pads,
            state: pathprof::PathState {
                threads: rw.atomic,
                ..pathprof::PathState::default()
            },
            ops: std::mem::take(&mut layout.ops),
        }),
    })
}

/// Where a signal can interrupt each copy, into the database (tracing:
/// the code is final; counting does not change the layout). The database
/// numbers procedures within the module, without its tag.
fn signal_maps(plans: &mut Plans<'_>, code: &Copies) {
    let local = |n: u32| n & ((1 << TAG_SHIFT) - 1);
    for (plan, copy) in plans.plans.iter().zip(&code.procs) {
        let ranges = copy
            .sigmap
            .iter()
            .cloned()
            .map(|mut r| {
                if let SigPoint::Insn { proc, .. } = &mut r.point {
                    *proc = local(*proc);
                }
                r
            })
            .collect();
        plans.db.procs[local(plan.number) as usize].sigmap = Some(SigMap {
            start: copy.new_start,
            len: copy.new_end - copy.new_start,
            ranges,
        });
    }
}

/// Counting: the init code at `init_vaddr` (and a static executable's new
/// entry after it), the counters on the next page, the path state after
/// them; the copies encoded again with the counters' address.
fn count(
    rw: &Rewrite<'_>,
    runtime: &Runtime,
    plans: &mut Plans<'_>,
    code: &mut Copies,
    code_vaddr: u64,
    init_vaddr: u64,
    mut c: Counting,
) -> Result<Counted> {
    let module = &rw.prog.module;
    let layout = &mut plans.layout;
    layout.vaddr = init_vaddr + PAGE;
    // Event counting: the counter; `--stop-at`: then the first
    // thread's `fs:[0]` (`counters::STOP_OWNER`).
    let words = if c.amounts.is_empty() {
        u64::from(layout.len)
    } else if rw.stop_at.is_some() {
        // The event counter, `STOP_OWNER`, `STOP_REFUSED`.
        3
    } else {
        1
    };
    layout.bytes = (words * 8).max(1).next_multiple_of(PAGE);
    let mut init_code = counters::emit_init(
        init_vaddr,
        layout.vaddr,
        layout.bytes,
        &counters::env_fd(rw.tag),
        // A static executable has no TLS at its entry point: the owner
        // stays 0 (only one thread: see the refusal in `limits`).
        rw.stop_at
            .filter(|_| !module.is_static)
            .map(|_| layout.vaddr + counters::STOP_OWNER),
    )
    .map_err(|e| rw.err(Refusal::Codegen(e)))?;
    let mut entry = init_vaddr;
    if let Some(pc) = c.paths.as_mut() {
        // The path state after the counters; its initialiser after the
        // counters' (which it ends by jumping to).
        layout.path_state = layout.vaddr + layout.bytes;
        let at = init_vaddr + (init_code.len() as u64).next_multiple_of(16);
        let (bytes, ic) = pathprof::emit_init(at, layout.path_state, init_vaddr, !module.is_static)
            .map_err(|e| rw.err(Refusal::Codegen(e)))?;
        init_code.resize((at - init_vaddr) as usize, 0xCC);
        init_code.extend_from_slice(&bytes);
        entry = at + ic.init;
        pc.state = pathprof::PathState {
            base: layout.vaddr,
            overflow: at + ic.overflow,
            attach: at + ic.attach,
            threads: rw.atomic,
        };
    }
    c.base = layout.vaddr;
    let again = codegen::generate(&plans.plans, &runtime.addrs, code_vaddr, Some(c))
        .map_err(|e| rw.err(Refusal::Codegen(e)))?;
    if again.bytes.len() != code.bytes.len() {
        return Err(rw.err(Refusal::CounterSizeChanged));
    }
    *code = again;
    let mut static_entry = None;
    if module.is_static {
        // No preinit array: a new entry point calls `entry` first.
        let copy = code
            .springboards
            .iter()
            .find(|&&(from, _)| from == module.entry)
            .map(|&(_, to)| to)
            .ok_or_else(|| rw.err(Refusal::NoEntrySpringboard))?;
        let at = init_vaddr + (init_code.len() as u64).next_multiple_of(16);
        let bytes = counters::emit_static_entry(at, entry, copy)
            .map_err(|e| rw.err(Refusal::Codegen(e)))?;
        init_code.resize((at - init_vaddr) as usize, 0xCC);
        init_code.extend_from_slice(&bytes);
        static_entry = Some(at);
    }
    debug_assert!(init_code.len() as u64 <= PAGE);
    let mut segments = vec![
        NewSegment {
            vaddr: init_vaddr,
            flags: 5,
            mem_size: init_code.len() as u64,
            bytes: init_code,
        },
        NewSegment {
            vaddr: layout.vaddr,
            flags: 6,
            mem_size: layout.bytes,
            // `--stop-at N`: the counter starts at -N (`counters::StopChecks`).
            bytes: rw
                .stop_at
                .map(|n| stop_start(n).to_le_bytes().to_vec())
                .unwrap_or_default(),
        },
    ];
    if layout.path_state != 0 {
        segments.push(NewSegment {
            vaddr: layout.path_state,
            flags: 6,
            mem_size: pathprof::state_bytes(),
            bytes: Vec::new(),
        });
    }
    Ok(Counted {
        preinit: entry,
        static_entry,
        segments,
    })
}
