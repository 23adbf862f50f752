//! What the rewriter refuses (docs/rewrite.md, "Counting mode"; docs/profile.md):
//! modules it cannot number, and programs whose counts the chosen mode
//! could not keep exact. A refusal is an error naming the reason; the
//! rewriter never writes a module it knows would record wrongly.
//!
//! Invariants: the checks here read only the module, the options and the
//! earlier phases' decisions (what is traced, call classification); the
//! per-procedure refusals are made where the plans are (`plan`).

use aetrace_analysis::cfg::CallSite;
use aetrace_analysis::imports;
use aetrace_runtime::layout::{MAX_MODULES, TAG_SHIFT};

use crate::calls::Calls;
use crate::{counters, imports_any, starts_threads, How, Result, Rewrite, THREAD_STARTERS};
use crate::{PathLimit, Refusal};

/// The module and the options, before any analysis of its code.
pub(crate) fn check_module(rw: &Rewrite<'_>) -> Result<()> {
    let module = &rw.prog.module;
    if let How::Count(spec) = rw.how {
        // A static executable's counters are mapped at its entry point,
        // before its libc sets up `fs` (TLS): the thread owner of
        // `--stop-at` and of path profiles cannot be read there.
        if module.is_static && (spec.stop_at.is_some() || spec.paths) && starts_threads(module) {
            return Err(rw.err(Refusal::StaticThreads {
                what: if spec.paths {
                    "path profiles"
                } else {
                    "--stop-at"
                },
                starter: THREAD_STARTERS
                    .iter()
                    .find(|n| module.func_symbols.iter().any(|s| s.name == **n))
                    .unwrap_or(&"a thread starter"),
            }));
        }
    }
    if rw.library != (rw.tag != 0) || rw.tag >= MAX_MODULES {
        return Err(rw.err(if rw.library {
            Refusal::SharedObject
        } else {
            Refusal::ExecutableAsLibrary
        }));
    }
    let procs = rw.prog.procs.len();
    if procs >= 1 << TAG_SHIFT {
        return Err(rw.err(Refusal::TooManyProcedures {
            procs,
            max: 1 << TAG_SHIFT,
        }));
    }
    Ok(())
}

/// Counting: what `--stop-at` and path profiles cannot follow.
pub(crate) fn check_counting(rw: &Rewrite<'_>, calls: &Calls<'_>) -> Result<()> {
    // With `--event calls`, a stop after a rethrow from a `.cold` catch
    // handler came one entry off the trace's (tests/stop_at.rs), not
    // understood yet: refused rather than a plausible wrong stop.
    if rw.stop_at.is_some()
        && rw.stop_events == Some(counters::Event::Calls)
        && imports_any(&rw.prog.module, &["__cxa_throw", "__cxa_rethrow"])
    {
        return Err(rw.err(Refusal::StopAtCallsThrows));
    }
    if rw.fatal_longjmps {
        untraced_longjmps(rw, calls)?;
    }
    if matches!(rw.how, How::Count(s) if s.paths) {
        path_limits(rw, calls)?;
    }
    Ok(())
}

/// Path profiles and `--stop-at` cannot follow frames a `longjmp`
/// abandons: with `fatal_longjmps` each call to the longjmp family from
/// counted code ends the program with a message instead
/// (`CallPlan::fatal_longjmp`). A longjmp by a tail jump, or from a
/// procedure left alone (outside the family, which runs untraced with what
/// it calls), could not be stopped: refused.
fn untraced_longjmps(rw: &Rewrite<'_>, calls: &Calls<'_>) -> Result<()> {
    let traced = calls.traced;
    for (id, p) in rw.prog.procs.iter() {
        let Ok(cfg) = p.cfg.as_ref() else { continue };
        let untraced = !traced.is_traced(id) && !traced.family_procs.contains(&id);
        if let Some(c) = cfg
            .calls
            .iter()
            .find(|c| traced.to_longjmp(c) && (c.tail || untraced))
        {
            return Err(rw.err(Refusal::UnfollowedLongjmp {
                proc: p.name.clone(),
                left_alone: untraced,
                tail: c.tail,
                at: cfg.blocks[c.block].last_insn(),
            }));
        }
    }
    Ok(())
}

/// The shadow stacks of path profiles must follow the machine stacks
/// (`pathprof`).
fn path_limits(rw: &Rewrite<'_>, calls: &Calls<'_>) -> Result<()> {
    let module = &rw.prog.module;
    let traced = calls.traced;
    let vforks: Vec<u64> = module
        .func_symbols
        .iter()
        .filter(|s| module.is_static && matches!(s.name.as_str(), "vfork" | "__vfork"))
        .map(|s| s.addr)
        .collect();
    for (id, p) in rw.prog.procs.iter() {
        let Ok(cfg) = p.cfg.as_ref() else { continue };
        if !traced.is_traced(id) {
            continue;
        }
        let jumps = cfg.calls.iter().find(|c| {
            !rw.fatal_longjmps
                && (c.target.is_some_and(|t| traced.family.setjmp.contains(&t))
                    || c.name.as_deref().is_some_and(imports::is_setjmp_like)
                    || traced.to_longjmp(c))
        });
        // A vfork child runs in its parent's memory: its pops would
        // be the parent's.
        let vfork = cfg.calls.iter().find(|c| {
            c.target.is_some_and(|t| vforks.contains(&t))
                || c.name
                    .as_deref()
                    .is_some_and(|n| n.split('@').next() == Some("vfork"))
        });
        let at = |c: &CallSite| cfg.blocks[c.block].last_insn();
        let pad = p.landing_pads.first().filter(|_| !rw.fatal_pads);
        let why = match (jumps, vfork, pad) {
            (Some(c), _, _) => PathLimit::Setjmp {
                proc: p.name.clone(),
                at: at(c),
            },
            (None, Some(c), _) => PathLimit::Vfork {
                proc: p.name.clone(),
                at: at(c),
            },
            (None, None, Some(&pad)) => PathLimit::LandingPad {
                proc: p.name.clone(),
                pad,
            },
            // Each process takes back the paths its inherited frames
            // counted as active once (shared counters): measured, a
            // fork caller's active path at -1.
            (None, None, None) => match cfg.calls.iter().find(|c| calls.may_fork_call(id, c)) {
                Some(c) => PathLimit::Fork {
                    proc: p.name.clone(),
                    at: at(c),
                },
                None => continue,
            },
        };
        return Err(rw.err(Refusal::PathProfiles(why)));
    }
    Ok(())
}
