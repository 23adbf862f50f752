//! Where a profile's counts may be inexact: signal handlers that leave
//! without returning abandon the frame they interrupted inside a block,
//! which no edge count describes. Each function returns a note for the
//! user, or `None`.

use std::collections::HashMap;
use std::path::Path;

use aetrace_analysis::elf::Module;
use aetrace_analysis::{imports, signals};

use crate::{ProcProfile, Profile};

/// Whether procedure `p`'s call to `import` installs a signal handler. A
/// static executable holds its libc: glibc's `profil` (linked into every
/// static program) installs a SIGPROF handler that only counts, and
/// `abort` sets SIGABRT's action to SIG_DFL, no handler.
fn installs_handlers(p: &ProcProfile, import: Option<&str>) -> bool {
    import.is_some_and(signals::is_installer)
        && !matches!(p.name.as_str(), "__profil" | "profil" | "abort")
        && !p.name.ends_with("@plt")
}

/// Signal handlers that may not return (they call `exit`, `abort`, ...):
/// such a handler abandons the frame it interrupted at whatever
/// instruction the signal struck, as one that `longjmp`s does (measured: a
/// SIGALRM handler calling `exit` while `main` loops recovered without
/// error, with `main`'s loop entry counted 0 and its frame left at an
/// earlier call). The handlers are found where they are installed: the
/// counted procedures whose address a procedure calling `sigaction`,
/// `signal`, ... takes (`lea` of a RIP-relative address, or an immediate)
/// in its code; one may not return when it or a procedure it calls
/// directly has an edge that does not return, and the note is made when
/// in this run it did not (it ran a call that does not return, or its
/// frame was left active at a call): most programs' cleanup handlers
/// (gzip's, sort's) never run. A handler installed elsewhere (its address
/// passed through data) or left alone is not seen.
pub fn exiting_handlers(profile: &Profile) -> Option<String> {
    let mut found = Vec::new();
    for m in profile.modules() {
        let installers: Vec<&ProcProfile> = m
            .procs
            .iter()
            .filter(|p| {
                p.calls
                    .iter()
                    .any(|c| installs_handlers(p, c.import.as_deref()))
            })
            .collect();
        if installers.is_empty() {
            continue;
        }
        let Ok(module) = Module::open(Path::new(m.path)) else {
            continue;
        };
        let start = |p: &ProcProfile| p.blocks.get(p.entry as usize).map(|b| b.start);
        let by_start: HashMap<u64, usize> = m
            .procs
            .iter()
            .enumerate()
            .filter_map(|(i, p)| start(p).map(|s| (s, i)))
            .collect();
        // Procedures that may not return: an edge that does not return,
        // or a direct call to one that may not (a fixpoint).
        let mut noret: Vec<bool> = m
            .procs
            .iter()
            .map(|p| p.edges.iter().any(|e| e.2 == "noreturn" || e.2 == "halt"))
            .collect();
        loop {
            let mut changed = false;
            for (i, p) in m.procs.iter().enumerate() {
                if !noret[i]
                    && p.calls.iter().any(|c| {
                        c.target
                            .and_then(|t| by_start.get(&t))
                            .is_some_and(|&q| noret[q])
                    })
                {
                    noret[i] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        for p in installers {
            let mut handlers: Vec<usize> = Vec::new();
            for b in &p.blocks {
                for &o in &b.insns {
                    let taken = signals::addresses_taken(&module, b.start + u64::from(o));
                    handlers.extend(taken.iter().filter_map(|t| by_start.get(t)));
                }
            }
            handlers.sort_unstable();
            handlers.dedup();
            // In this run: it was entered and left by a call that does not
            // return (its block ran, or its frame was left active at a
            // call); counts not recovered cannot say.
            let did_not_return = |q: &ProcProfile| match &q.counts {
                None => q.error.is_some(),
                Some(c) => {
                    c.invocations > 0
                        && (c.active.iter().any(|&(_, n)| n > 0)
                            || q.edges.iter().any(|e| {
                                (e.2 == "noreturn" || e.2 == "halt")
                                    && c.blocks.get(e.0 as usize).is_some_and(|&n| n > 0)
                            }))
                }
            };
            for h in handlers
                .into_iter()
                .filter(|&h| noret[h] && did_not_return(&m.procs[h]))
            {
                found.push(format!(
                    "{} ({}), installed by {}",
                    m.procs[h].name, m.name, p.name
                ));
            }
        }
    }
    found.dedup();
    (!found.is_empty()).then(|| {
        format!(
            "counts may be inexact: signal handlers ran and did not return: {}; a handler that does not return abandons the frame it interrupted inside a block, which no edge count describes",
            found.join(", ")
        )
    })
}

/// Signal handlers that may leave by `longjmp`: a handler that jumps out
/// abandons the interrupted frame at whatever instruction the signal
/// struck (a fault, a timer), not at a call, so the frame's last block ran
/// partly and no edge count describes it; recovery may still balance
/// (measured: `traces/signal_fault.c` recovered without error, with wrong
/// counts in `main` and the faulting procedures). Edge profiles cannot
/// say where a block stopped, so a program that both installs a handler
/// (a call to `sigaction`, `signal`, ...) and calls a `longjmp`-like
/// function gets a note naming the procedures calling `longjmp`, printed
/// as a warning: a note, since most such programs never jump out of a
/// handler.
pub fn longjmp_with_handlers(profile: &Profile) -> Option<String> {
    let calls = || {
        profile
            .modules()
            .into_iter()
            .flat_map(|m| m.procs.iter().map(move |p| (m.name, p)))
            .flat_map(|(m, p)| p.calls.iter().map(move |c| (m, p, c.import.as_deref())))
    };
    if !calls().any(|(_, p, i)| installs_handlers(p, i)) {
        return None;
    }
    let mut jumpers: Vec<String> = calls()
        // A PLT stub jumps to the import for its callers.
        .filter(|(_, p, i)| i.is_some_and(imports::is_longjmp_like) && !p.name.ends_with("@plt"))
        .map(|(m, p, _)| format!("{} ({m})", p.name))
        .collect();
    jumpers.dedup();
    if jumpers.is_empty() {
        return None;
    }
    Some(format!(
        "counts may be inexact: the program installs signal handlers, and longjmp is called by {}; a handler that longjmps abandons the interrupted frame inside a block, which no edge count describes",
        jumpers.join(", ")
    ))
}
