//! Where a thread's trace stops being the native program's instruction
//! stream: the first instruction of a procedure whose path depends on the
//! copies' addresses (`ProgramDb::copy_dependent`: libgcc's FDE search in
//! a static image, which looks up return addresses, the copies' in the
//! rewritten program; docs/rewrite.md, "Static executables"). The trace
//! is exact for the rewritten program throughout; from there on the
//! native run may take other branches (or the same ones for a while:
//! where the search first compares a pc is not known statically).
//!
//! Found by one more walk of the regenerated blocks ([`crate::visit`]),
//! made only when a module's database names such a procedure.
//!
//! Invariant: a [`Departure`] names the 1-based number of that
//! instruction in its thread's stream (every module counted, as `--format
//! insn` prints it without `--module`), at most one per thread.

use crate::output::Options;
use crate::visit::{Event, Visit};
use crate::Result;
use aetrace_format::progdb::ProgramDb;
use aetrace_format::{ThreadId, Trace};

/// The first instruction of a thread in a copy-dependent procedure.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Departure {
    /// The thread.
    pub thread: ThreadId,
    /// Its 1-based number in the thread's instruction stream.
    pub instruction: u64,
    /// The procedure it starts.
    pub procedure: String,
    /// The procedure's module (its path).
    pub module: String,
}

impl std::fmt::Display for Departure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "warning: thread {}: from instruction {} on (entering {} of {}), the trace is the \
             rewritten program's and may differ from the native run's: the unwinder's FDE \
             search looks up return addresses, which are the copies'",
            self.thread, self.instruction, self.procedure, self.module
        )
    }
}

/// Whether a module of `trace` has a copy-dependent procedure.
fn any_copy_dependent<B: AsRef<[u8]>>(trace: &Trace<B>) -> Result<bool> {
    for m in trace.modules() {
        if let Some(db) = trace.program_database(m.id) {
            if !ProgramDb::decode(&db.decompress()?)?
                .copy_dependent
                .is_empty()
            {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// The departures of the threads `opts` chooses (its module choice and
/// format ignored), in thread order.
pub fn departures<B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    opts: &Options,
) -> Result<Vec<Departure>> {
    if !any_copy_dependent(trace)? {
        return Ok(Vec::new());
    }
    let opts = Options {
        module: None,
        ..opts.clone()
    };
    let visit = Visit::new(trace, &opts)?;
    let modules = visit.modules();
    let mut found = Vec::new();
    // The thread walked, its instructions so far, and whether it departed.
    let mut cur: Option<(ThreadId, u64, bool)> = None;
    visit.run(&mut |runs| {
        for e in runs.events() {
            match (e, &mut cur) {
                (Event::Thread(t), _) => cur = Some((t, 0, false)),
                (Event::Run(r), Some((t, n, departed @ false))) => {
                    let m = &modules[r.module as usize];
                    let p = &m.procs[m.blocks[r.block].proc];
                    if p.copy_dependent {
                        *departed = true;
                        found.push(Departure {
                            thread: *t,
                            instruction: *n + 1,
                            procedure: p.name.clone(),
                            module: m.name.clone(),
                        });
                    }
                    *n += u64::from(r.end - r.first);
                }
                _ => {}
            }
        }
        true
    })?;
    Ok(found)
}
