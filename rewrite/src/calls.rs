//! Call classification (docs/rewrite.md, "Calls"): for every call site of
//! a traced procedure, its target as the program database names it, and
//! what the copy adds around it (a RETURN record, a counted transfer, a
//! return-point check, `fork_child`, SETJMP/LONGJMP records, ...), from
//! properties of callees computed once over the whole call graph.
//!
//! Invariants:
//! - a call site has a RETURN record exactly when its callee may run
//!   traced code as a callback before control comes back;
//! - the properties that spread up the call graph (`may_tail`,
//!   `may_exit`, `may_fork`, `fork_wrappers`) are least fixpoints;
//! - the code's [`CallPlan`] and the database's [`CallDb`] of a site are
//!   made together, so the regenerator's view matches what runs.

use std::collections::{HashMap, HashSet};

use aetrace_analysis::cfg::{CallKind, CallSite, Cfg, EdgeKind};
use aetrace_analysis::{imports, ProcKind, Program};
use aetrace_format::progdb::{CallDb, CallTarget};
use aetrace_graph::{BlockId, EntityRef, ProcId};

use iced_x86::Instruction;

use crate::codegen::CallPlan;
use crate::liveness::Liveness;
use crate::traced::Traced;
use crate::{checks, How, Rewrite};

/// Properties of callees, and the per-site plans they decide.
pub(crate) struct Calls<'t> {
    /// What is traced, which this classification extends.
    pub traced: &'t Traced,
    /// The PLT's lazy-binding header, which jumps to ld.so's resolver.
    plt0: Option<ProcId>,
    /// PLT stubs traced without a witness (tracing only).
    pub lazy_stubs: HashMap<ProcId, RecordedStub>,
    /// Procedures that only tail-jump to a `fork`; the value: whether it
    /// runs `pthread_atfork` handlers.
    fork_tails: HashMap<ProcId, bool>,
    /// Procedures that call or tail-call a traced procedure directly (past
    /// its outside-entry stub): see `checks`.
    pub calls_traced: HashSet<ProcId>,
    /// Bounded procedures (see `checks`): calls to them need no
    /// return-point check.
    bounded: HashSet<ProcId>,
    /// A procedure may leave by a tail call into code that calls back.
    may_tail: HashMap<ProcId, bool>,
    /// Counting: a procedure may leave its frame abandoned.
    may_exit: HashMap<ProcId, bool>,
    /// Some procedure may, or the program has landing pads.
    any_may_exit: bool,
    /// Counting: a procedure may call a `fork`.
    may_fork: HashMap<ProcId, bool>,
    /// The system calls that create a task ([`creates_task`]), by
    /// procedure and block: the child goes on after each.
    task_syscalls: HashSet<(ProcId, BlockId)>,
    /// Every call-site range with a landing pad (`lsda::call_site_pads`).
    pads: Vec<(u64, u64, u64)>,
    /// Any import may run traced code: the module has a canonical PLT
    /// stub, or a glibc library is traced in this run (its functions write
    /// ENTER when called from here, so even `memcpy` needs a RETURN record).
    imports_call_back: bool,
}

/// An import that may run traced code before it returns. When the module
/// has a canonical PLT stub (`Module::canonical_plt`), any import may: the
/// stub is traced, and other modules call it (glibc's `setlocale`,
/// `strdup` and the like reach cc1's `free@plt` through libc's GOT).
/// `all`: every import may (`Calls::imports_call_back`).
fn callback_capable(all: bool, name: Option<&str>) -> bool {
    match name {
        Some(n) => !callback_free(all, n) && !imports::is_exit_like(n),
        None => true,
    }
}

/// An import that never runs traced code (see [`callback_capable`]).
fn callback_free(all: bool, name: &str) -> bool {
    !all && imports::is_callback_free(name)
}

impl<'t> Calls<'t> {
    /// Computes the callee properties over the whole program.
    pub fn classify(rw: &Rewrite<'_>, traced: &'t Traced) -> Calls<'t> {
        let prog = rw.prog;
        let plt0 = prog
            .procs
            .iter()
            .find(|(_, p)| p.kind == ProcKind::Plt && p.name == "<plt0>")
            .map(|(id, _)| id);
        let family = &traced.family;
        let fork_tails = fork_wrappers(prog, &traced.by_start, |c| {
            let named = traced.fork_name(c);
            (traced.untraced_in(c, &family.fork) || named.is_some_and(imports::is_fork_like)).then(
                || {
                    traced.untraced_in(c, &family.atfork)
                        || named.is_some_and(imports::runs_atfork_handlers)
                },
            )
        });
        let mut calls = Calls {
            traced,
            plt0,
            lazy_stubs: match rw.how {
                // An early stub's slot, which ld.so binds before the
                // copies are mapped, keeps its original value: the copy
                // compares it (`Traced::early`).
                How::Trace(_) => recorded_stubs(
                    prog,
                    |q| traced.is_traced(q) && !traced.early.contains(&q),
                    plt0,
                ),
                How::Count(_) => HashMap::new(),
            },
            fork_tails,
            calls_traced: prog
                .procs
                .iter()
                .filter(|(_, p)| {
                    p.cfg.as_ref().is_ok_and(|cfg| {
                        checks::reaches_call(cfg, |t| traced.traced_at(t).is_some())
                    })
                })
                .map(|(id, _)| id)
                .collect(),
            bounded: HashSet::new(),
            may_tail: HashMap::new(),
            may_exit: HashMap::new(),
            any_may_exit: false,
            may_fork: HashMap::new(),
            task_syscalls: task_syscalls(prog, traced),
            pads: aetrace_analysis::lsda::call_site_pads(&prog.module),
            imports_call_back: rw.glibc_traced || !prog.module.canonical_plt.is_empty(),
        };
        // `--data`: callees write VALUE records, which a caller's budget
        // for a bounded callee does not count.
        if rw.data == crate::DataMode::Off {
            calls.bounded = calls.bounded_procs(prog);
        }
        calls.may_tail = calls.tail_callbacks(prog);
        calls.frame_exits(prog);
        let seeds = calls
            .task_syscalls
            .iter()
            .map(|&(id, _)| (id, true))
            .collect();
        calls.may_fork = spread_up_calls(prog, seeds, |may, c| calls.call_forks(may, c));
        calls
    }

    /// Bounded procedures (see `checks`). `<plt0>` jumps to ld.so's
    /// resolver.
    fn bounded_procs(&self, prog: &Program) -> HashSet<ProcId> {
        let plt0 = self.plt0;
        prog.procs
            .iter()
            .filter(|&(id, p)| {
                p.start != prog.module.entry
                    && p.cfg.as_ref().is_ok_and(|cfg| {
                        !cfg.indirect_jumps.iter().any(|j| j.is_unresolved())
                            && checks::bounded(cfg, !p.landing_pads.is_empty(), |c| {
                                match c.target.and_then(|t| self.traced.traced_at(t)) {
                                    Some(q) => Some(q) == plt0,
                                    None => {
                                        Some(id) == plt0
                                            || c.name.as_deref().is_some_and(|n| {
                                                callback_free(self.imports_call_back, n)
                                                    && !imports::is_exit_like(n)
                                            })
                                    }
                                }
                            })
                    })
            })
            .map(|(id, _)| id)
            .collect()
    }

    /// may_tail[p]: p may leave by a tail call into code that calls back.
    fn tail_callbacks(&self, prog: &Program) -> HashMap<ProcId, bool> {
        let mut may_tail: HashMap<ProcId, bool> = HashMap::new();
        for (id, p) in prog.procs.iter() {
            let Ok(cfg) = &p.cfg else { continue };
            // An unresolved jump may leave for any code.
            let unresolved = cfg.indirect_jumps.iter().any(|j| j.is_unresolved());
            let direct = unresolved
                || cfg.calls.iter().filter(|c| c.tail).any(|c| {
                    let to_traced = c.target.and_then(|t| self.traced.traced_at(t)).is_some();
                    !to_traced
                        && Some(id) != self.plt0
                        && callback_capable(self.imports_call_back, c.name.as_deref())
                });
            may_tail.insert(id, direct);
        }
        spread_up_calls(prog, may_tail, |may, c| {
            c.tail
                && c.target
                    .and_then(|t| self.traced.traced_at(t))
                    .is_some_and(|q| may[&q])
        })
    }

    /// Counting: which calls may leave their frame abandoned (virtual exit
    /// edges, `counters`: the process ends below them, a throw or a
    /// longjmp passes them): a call that does not return (`exit`,
    /// `__cxa_throw`, `_Unwind_Resume`, `longjmp`, ...), a call to a
    /// procedure that may, and calls that can run traced code or throw
    /// (indirect, external) once any procedure may.
    fn frame_exits(&mut self, prog: &Program) {
        let mut may: HashMap<ProcId, bool> = HashMap::new();
        for (id, p) in prog.procs.iter() {
            let m = match &p.cfg {
                Ok(cfg) => cfg.calls.iter().any(|c| self.jumps_away(c)),
                Err(_) => true,
            };
            may.insert(id, m);
        }
        // A program with landing pads catches or cleans up after
        // exceptions: any external call may throw through its caller.
        self.any_may_exit =
            may.values().any(|&m| m) || prog.procs.iter().any(|(_, p)| !p.landing_pads.is_empty());
        self.may_exit = spread_up_calls(prog, may, |may, c| self.call_may_exit(may, c));
    }

    /// A call that does not return. A static libc's longjmp ends in an
    /// indirect jump: the CFG cannot tell that it does not return.
    fn jumps_away(&self, c: &CallSite) -> bool {
        !c.returns || self.traced.to_longjmp(c)
    }

    fn call_may_exit(&self, may: &HashMap<ProcId, bool>, c: &CallSite) -> bool {
        if self.jumps_away(c) {
            return true;
        }
        match c.target.and_then(|t| self.traced.by_start.get(&t)) {
            Some(q) if Some(*q) != self.plt0 => may[q],
            _ => self.any_may_exit && callback_capable(self.imports_call_back, c.name.as_deref()),
        }
    }

    /// Counting: the call may leave its frame abandoned.
    pub fn may_exit_call(&self, c: &CallSite) -> bool {
        self.call_may_exit(&self.may_exit, c)
    }

    fn call_forks(&self, may: &HashMap<ProcId, bool>, c: &CallSite) -> bool {
        c.name.as_deref().is_some_and(imports::is_fork_like)
            || c.target
                .is_some_and(|t| self.traced.family.fork.contains(&t))
            || c.target
                .and_then(|t| self.traced.by_start.get(&t))
                .is_some_and(|q| may.get(q).copied().unwrap_or(false))
    }

    /// Counting: calls of procedure `id` after which the process may be
    /// two (`fork`, `vfork`, a system call that creates a task, or a traced
    /// procedure that may make one, a fixpoint over direct calls): each
    /// returns once per process (or thread: a new thread goes on after its
    /// `clone3`), as a `setjmp` call returns again per `longjmp`, so it gets
    /// the same split return edge (`R0 -> S` derived: the children's
    /// returns). A child's counts add to the parent's (shared counters,
    /// docs/profile.md). A tail call's frame is gone: its caller's call
    /// returns twice.
    pub fn may_fork_call(&self, id: ProcId, c: &CallSite) -> bool {
        !c.tail
            && (self.call_forks(&self.may_fork, c) || self.task_syscalls.contains(&(id, c.block)))
    }

    /// The plans of procedure `id`'s call sites, per block: what its copy
    /// adds around each and what the database says of each.
    pub fn plan_sites(
        &self,
        rw: &Rewrite<'_>,
        (id, cfg): (ProcId, &Cfg),
        insns: &[Vec<Instruction>],
        live: &Liveness,
    ) -> (Vec<CallPlan>, Vec<Option<CallDb>>) {
        let mut calls = vec![CallPlan::default(); cfg.blocks.len()];
        let mut call_db: Vec<Option<CallDb>> = vec![None; cfg.blocks.len()];
        for c in &cfg.calls {
            // A system call that creates a task: `fork_child` in the child
            // right after it (flags dead there: its test), in a static
            // libc's `_Fork` as in libc.so.6's.
            let line = || straight_line(cfg, c.block, |b| insns[b.index()].clone());
            let tracing = matches!(rw.how, How::Trace(_));
            let forks = c.kind == CallKind::Syscall
                && tracing
                && !live.live_out(c.block).flags_live()
                && creates_task(&line());
            let libc_task = (tracing && libc_syscall(rw.prog, self.traced, c))
                .then(|| syscall_call_task(&line()))
                .flatten();
            let (mut plan, db) = self.plan_site(rw, (id, cfg), c, forks || libc_task.is_some());
            plan.own_stack = libc_task.filter(|&n| n == SYS_CLONE || n == SYS_CLONE3);
            plan.task_paths = plan.syscall_exit && may_create_task(&line());
            calls[c.block.index()] = plan;
            call_db[c.block.index()] = Some(db);
        }
        for j in cfg.indirect_jumps.iter().filter(|j| j.is_unresolved()) {
            calls[j.block.index()].indirect = true;
            call_db[j.block.index()] = Some(CallDb {
                target: CallTarget::External,
                marker: false,
                returns: false,
                tail: true,
                lazy: None,
                landing: None,
                jmpbuf: false,
                plt: false,
                indirect: true,
            });
        }
        (calls, call_db)
    }

    /// `forks`: a system call that creates a task ([`creates_task`]), or
    /// a call of libc's `syscall()` that makes one ([`syscall_call_task`]).
    fn plan_site(
        &self,
        rw: &Rewrite<'_>,
        (id, cfg): (ProcId, &Cfg),
        c: &CallSite,
        forks: bool,
    ) -> (CallPlan, CallDb) {
        let family = &self.traced.family;
        let name = c.name.as_deref();
        // A traced setjmp root is entered by its springboard, as an
        // untraced one was (`Traced::setjmp_root_call`).
        let by_entry = self.traced.setjmp_root_call(c);
        let target_proc = (c.target.and_then(|t| self.traced.traced_at(t))).filter(|_| !by_entry);
        let got_jump = c.kind != CallKind::Direct && c.target.is_none();
        let (target, marker) = match target_proc {
            Some(q) => (CallTarget::Proc(q.index() as u32), self.may_tail[&q]),
            None => (
                CallTarget::External,
                callback_capable(self.imports_call_back, name) || c.kind == CallKind::Direct,
            ),
        };
        let exit_record = got_jump && name.is_some_and(imports::is_exit_like);
        // A system call writes EXIT before it when it is exit or
        // exit_group, and RETURN after it when it returned: the
        // regenerator cannot mistake the EXIT of a later one for it.
        let syscall = c.kind == CallKind::Syscall;
        let to_longjmp = c.target.is_some_and(|t| family.longjmp.contains(&t));
        // A static libc's `fork` left alone (for a reason of its own): a
        // traced one claims the child's slot at its own system call.
        let to_fork = self.traced.untraced_in(c, &family.fork);
        let fork_name = self.traced.fork_name(c);
        // A traced procedure that only tail-jumps to `fork`.
        let wrapper = target_proc.and_then(|q| self.fork_tails.get(&q).copied());
        // A longjmp never returns (its last jump is indirect, so the CFG
        // cannot tell). A static libc's setjmp is a direct call, so it is
        // marked: its callees are traced (`__sigjmp_save`).
        let returns = c.returns && !to_longjmp;
        let marker = (marker || syscall) && returns && !c.tail;
        let mut plan = CallPlan {
            count: false,
            lazy_record: false,
            lazy_entry: None,
            unchecked_return: returns
                && !c.tail
                && !marker
                && c.kind != CallKind::Syscall
                && target_proc.is_some_and(|q| self.bounded.contains(&q)),
            marker,
            exit_record,
            syscall_exit: syscall && !forks,
            fork: !c.tail
                && (forks
                    || to_fork
                    || fork_name.is_some_and(imports::is_fork_like)
                    || wrapper.is_some()),
            atfork: !c.tail
                && (self.traced.untraced_in(c, &family.atfork)
                    || fork_name.is_some_and(imports::runs_atfork_handlers)
                    || wrapper == Some(true)),
            dispositions: !c.tail && returns && name.is_some_and(imports::touches_dispositions),
            opens: name
                .filter(|_| !c.tail && returns)
                .and_then(imports::opens_by_name),
            reads: !c.tail && returns && name.is_some_and(imports::reads),
            exe_path: name
                .filter(|_| !c.tail && returns)
                .and_then(imports::exe_path_arg),
            exec: None,
            shell: None,
            fatal_longjmp: rw.fatal_longjmps
                && !c.tail
                && (to_longjmp || name.is_some_and(imports::is_longjmp_like)),
            jmpbuf: match name {
                _ if self.traced.setjmp_call(c) => Some(aetrace_runtime::RecordKind::Setjmp),
                _ if !c.tail && to_longjmp => Some(aetrace_runtime::RecordKind::Longjmp),
                Some(n) if !c.tail && imports::is_longjmp_like(n) => {
                    Some(aetrace_runtime::RecordKind::Longjmp)
                }
                _ => None,
            },
            indirect: false,
            own_stack: None,
            task_paths: false,
            by_entry,
        };
        let db = CallDb {
            indirect: false,
            jmpbuf: plan.jmpbuf == Some(aetrace_runtime::RecordKind::Setjmp),
            target: if (exit_record && !c.tail) || syscall {
                CallTarget::Exit
            } else {
                target
            },
            marker,
            returns,
            tail: c.tail,
            // IBT: the `.plt` entry the LAZY piece enters.
            lazy: self
                .lazy_stubs
                .get(&id)
                .and_then(|s| s.entry)
                .filter(|_| target_proc.is_none() && got_jump && c.tail)
                .map(|l| l.index() as u32),
            plt: match target_proc {
                Some(q) => self.lazy_stubs.contains_key(&q),
                None => got_jump && c.tail && self.lazy_stubs.contains_key(&id),
            },
            landing: self.landing_pad(cfg, c),
        };
        plan.count = db.counts_transfer();
        plan.lazy_record = db.plt && db.target == CallTarget::External;
        // A traced exec function (a static libc's) asks again at its
        // system call: harmless, an exec that runs does not return. A
        // lazily bound stub asks itself, once bound or after its LAZY
        // (the lazy-binding path ran as natively), not its callers.
        let to_lazy_stub = target_proc.is_some_and(|q| self.lazy_stubs.contains_key(&q));
        // `posix_spawn` is asked only untraced: a traced one's child asks
        // at its `execve`, and its code must see the program's arguments.
        let asked = name.filter(|_| plan.lazy_record || !(c.tail || to_lazy_stub));
        plan.exec = asked
            .and_then(aetrace_runtime::layout::ExecKind::of_function)
            .filter(|k| !k.spawns() || target_proc.is_none());
        // `system` is replaced where `posix_spawn` is asked.
        plan.shell = asked
            .and_then(aetrace_runtime::layout::ShellCall::of_function)
            .filter(|_| target_proc.is_none());
        plan.lazy_entry = db
            .lazy
            .map(|l| rw.prog.procs[ProcId::new(l as usize)].start);
        (plan, db)
    }

    /// The block of the landing pad covering call site `c`, if any.
    fn landing_pad(&self, cfg: &Cfg, c: &CallSite) -> Option<u32> {
        let pads = &self.pads;
        let at = cfg.blocks[c.block].last_insn();
        let i = pads.partition_point(|&(s, _, _)| s <= at);
        i.checked_sub(1)
            .map(|i| pads[i])
            .filter(|&(_, end, _)| at < end)
            .and_then(|(_, _, pad)| cfg.block_at(pad))
            .map(|b| b.index() as u32)
    }
}

/// A property that spreads up the call graph, to its least fixpoint: `may`
/// holds the seeds (a procedure missing from it: false); a procedure with
/// a CFG gains the property when one of its calls `spreads` under the
/// current map.
fn spread_up_calls(
    prog: &Program,
    mut may: HashMap<ProcId, bool>,
    spreads: impl Fn(&HashMap<ProcId, bool>, &aetrace_analysis::cfg::CallSite) -> bool,
) -> HashMap<ProcId, bool> {
    loop {
        let mut changed = false;
        for (id, p) in prog.procs.iter() {
            let Ok(cfg) = &p.cfg else { continue };
            if !may.get(&id).copied().unwrap_or(false) && cfg.calls.iter().any(|c| spreads(&may, c))
            {
                may.insert(id, true);
                changed = true;
            }
        }
        if !changed {
            return may;
        }
    }
}

/// Linux x86-64 system calls that create a task.
const SYS_CLONE: u64 = 56;
const SYS_FORK: u64 = 57;
const SYS_VFORK: u64 = 58;
const SYS_CLONE3: u64 = 435;

/// Whether the `syscall` ending a block (`insns`) creates a task (fork,
/// vfork, clone, clone3), by the constant the block loads into eax before
/// it. The child must claim its own slot right after it, before any
/// witness; `fork_child` tells a thread from a process at run time
/// (docs/rewrite.md, "Static executables"; docs/runtime.md). Any other
/// system call, or a number the block does not load, keeps the run-time
/// test, which makes a new task on a path of its own with the same
/// return point (`codegen`'s `syscall_exit`).
pub(crate) fn creates_task(insns: &[Instruction]) -> bool {
    task_number(insns, iced_x86::Register::RAX).is_some()
}

/// The task-creating system call (fork, vfork, clone, clone3) a call of
/// libc's `syscall(number, ...)` ending `insns` makes, by the constant
/// loaded into its first argument, rdi: the child returns from the call
/// (`fork_child` at its return point), or, on a stack of its own
/// (`CallPlan::own_stack`), goes where that stack says.
pub(crate) fn syscall_call_task(insns: &[Instruction]) -> Option<u64> {
    task_number(insns, iced_x86::Register::RDI)
}

/// Whether the `syscall` ending `insns` may create a task by a number
/// known only at run time: the number the block loads into eax is no
/// constant, or one of fork, vfork, clone, clone3 (where the flags live
/// after it kept it from [`creates_task`]). Only such a `syscall` gets
/// the other copies of `codegen`'s `syscall_exit` (a `write` or a
/// `futex` does not).
pub(crate) fn may_create_task(insns: &[Instruction]) -> bool {
    loaded_constant(insns, iced_x86::Register::RAX).map_or(true, is_task_number)
}

fn is_task_number(n: u64) -> bool {
    matches!(n, SYS_FORK | SYS_VFORK | SYS_CLONE | SYS_CLONE3)
}

/// The task-creating system call number the instructions before the last
/// of `insns` leave in `reg`, when they load a constant.
fn task_number(insns: &[Instruction], reg: iced_x86::Register) -> Option<u64> {
    loaded_constant(insns, reg).filter(|&n| is_task_number(n))
}

/// The constant the instructions before the last of `insns` leave in
/// `reg`, when the last of them to write it loads one.
fn loaded_constant(insns: &[Instruction], reg: iced_x86::Register) -> Option<u64> {
    let (_, body) = insns.split_last()?;
    let mut info = iced_x86::InstructionInfoFactory::new();
    (body.iter().rev())
        .find(|i| writes(&mut info, i, reg))
        .and_then(constant)
}

/// A call of an untraced `syscall()` (libc's, libc.so.6 not traced),
/// through its PLT stub or GOT: its system call runs where no traced code
/// follows the child. (A static libc's traced `syscall()` makes the child
/// claim its slot itself, `codegen`'s `syscall_exit`.)
fn libc_syscall(prog: &Program, traced: &Traced, c: &CallSite) -> bool {
    let traced_body = |q: ProcId| prog.procs[q].kind != ProcKind::Plt;
    c.kind != CallKind::Syscall
        && !c.tail
        && !c
            .target
            .and_then(|t| traced.traced_at(t))
            .is_some_and(traced_body)
        && traced
            .fork_name(c)
            .is_some_and(imports::is_syscall_function)
}

/// The blocks of `prog` ending in a system call that creates a task
/// ([`creates_task`]) or in a call of libc's `syscall()` that makes one
/// ([`syscall_call_task`]).
fn task_syscalls(prog: &Program, traced: &Traced) -> HashSet<(ProcId, BlockId)> {
    let mut found = HashSet::new();
    for (id, p) in prog.procs.iter() {
        let Ok(cfg) = &p.cfg else { continue };
        let decoded = |b: BlockId| {
            let b = &cfg.blocks[b];
            let bytes = prog
                .module
                .bytes_at(b.start, b.end - b.start)
                .unwrap_or_default();
            iced_x86::Decoder::with_ip(64, bytes, b.start, Default::default())
                .into_iter()
                .collect()
        };
        for c in &cfg.calls {
            let line = || straight_line(cfg, c.block, decoded);
            let task = match c.kind {
                CallKind::Syscall => creates_task(&line()),
                _ => libc_syscall(prog, traced, c) && syscall_call_task(&line()).is_some(),
            };
            if task {
                found.insert((id, c.block));
            }
        }
    }
    found
}

/// The instructions that run, on every path, up to the end of block `b`:
/// its own, after those of its predecessor while a block has only one,
/// which is not a call (a few blocks at most). glibc's `__clone3` in
/// libc.so.6 ends its FDE right before its `syscall` (`cfi_endproc`: the
/// child's unwind info would be wrong), which splits the block there and
/// leaves the number loaded in the block before.
fn straight_line(
    cfg: &Cfg,
    b: BlockId,
    insns: impl Fn(BlockId) -> Vec<Instruction>,
) -> Vec<Instruction> {
    const LOOKBACK: usize = 4;
    let mut chain = vec![b];
    while chain.len() < LOOKBACK {
        let at = chain[chain.len() - 1];
        let mut preds = cfg.edges.values().filter(|e| e.to == at).map(|e| e.from);
        let (Some(p), None) = (preds.next(), preds.next()) else {
            break;
        };
        let plain = cfg.blocks[p].kind == aetrace_analysis::cfg::BlockKind::Plain;
        if at == cfg.entry || !plain || chain.contains(&p) {
            break;
        }
        chain.push(p);
    }
    chain.iter().rev().flat_map(|&b| insns(b)).collect()
}

/// Whether `i` writes (part of) the full register `reg`.
fn writes(
    info: &mut iced_x86::InstructionInfoFactory,
    i: &Instruction,
    reg: iced_x86::Register,
) -> bool {
    use iced_x86::OpAccess::{CondWrite, ReadCondWrite, ReadWrite, Write};
    info.info(i).used_registers().iter().any(|u| {
        u.register().full_register() == reg
            && matches!(u.access(), Write | ReadWrite | CondWrite | ReadCondWrite)
    })
}

/// The value `i` leaves in its destination register when it is a
/// constant: `mov r, imm` (zero- or sign-extended as the CPU does) or
/// `xor r, r`.
fn constant(i: &Instruction) -> Option<u64> {
    use iced_x86::{Mnemonic, OpKind};
    let to_reg = i.op_count() == 2 && i.op0_kind() == OpKind::Register;
    match (i.mnemonic(), i.op1_kind()) {
        (Mnemonic::Mov, OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate64)
            if to_reg =>
        {
            Some(i.immediate(1))
        }
        (Mnemonic::Xor, OpKind::Register) if to_reg && i.op0_register() == i.op1_register() => {
            Some(0)
        }
        _ => None,
    }
}

/// Procedures whose every way out is a tail jump to a `fork`-like callee
/// (an import by name, a static libc's `fork`, or another such
/// procedure), as perl's `Perl_my_fork` is (`jmp fork@plt`): a call to one
/// returns twice, in the parent and in the child, like a call to `fork`,
/// so it gets `fork_child` at its return point (a tail jump has none: the
/// child ran on in its parent's slot). The value: whether that `fork` runs
/// `pthread_atfork` handlers. A procedure that can also return by itself
/// is not one (its return point would take any 0 it returns for a child).
fn fork_wrappers(
    prog: &Program,
    by_start: &HashMap<u64, ProcId>,
    fork_like: impl Fn(&aetrace_analysis::cfg::CallSite) -> Option<bool>,
) -> HashMap<ProcId, bool> {
    let mut found: HashMap<ProcId, bool> = HashMap::new();
    loop {
        let mut changed = false;
        for (id, p) in prog.procs.iter() {
            let Ok(cfg) = &p.cfg else { continue };
            if found.contains_key(&id) {
                continue;
            }
            let mut atfork = false;
            let mut tails = 0;
            let all = cfg.edges.values().all(|e| match e.kind {
                EdgeKind::Return | EdgeKind::Halt => false,
                EdgeKind::TailCall => {
                    tails += 1;
                    let site = cfg.calls.iter().find(|c| c.block == e.from && c.tail);
                    let forks = site.and_then(|c| {
                        fork_like(c).or_else(|| {
                            c.target
                                .and_then(|t| by_start.get(&t))
                                .and_then(|q| found.get(q).copied())
                        })
                    });
                    atfork |= forks == Some(true);
                    forks.is_some()
                }
                _ => true,
            });
            if all && tails > 0 {
                found.insert(id, atfork);
                changed = true;
            }
        }
        if !changed {
            return found;
        }
    }
}

/// The PLT stubs whose import jump is traced without a witness
/// (docs/rewrite.md step 5, "PLT stubs"; `CallDb::plt`): the bound
/// outcome writes nothing, the lazy one a LAZY record first, and the way
/// into the stub is the counted transfer. A stub qualifies when its
/// `jmp [GOT]` either has one outcome (a slot bound at load time, e.g.
/// `.plt.got`'s GLOB_DAT: no lazy binding ever) or falls back to its own
/// lazy-binding half, where its JUMP_SLOT's initial value points (that
/// value is then redirected to the copy's LAZY piece, `Copies::lazy_slots`;
/// ld.so relocates it like the original), the half being the stub's own
/// second block or, in the IBT layout (`.plt.sec`), a `.plt` entry of its
/// own. `exit`-like imports keep the GOT compare: their EXIT record would
/// precede LAZY.
fn recorded_stubs(
    prog: &Program,
    traced: impl Fn(ProcId) -> bool,
    plt0: Option<ProcId>,
) -> HashMap<ProcId, RecordedStub> {
    let module = &prog.module;
    let by_start: HashMap<u64, ProcId> = prog.procs.iter().map(|(id, p)| (p.start, id)).collect();
    let mut out = HashMap::new();
    for (id, p) in prog.procs.iter() {
        let Ok(cfg) = &p.cfg else { continue };
        if p.kind != ProcKind::Plt || Some(id) == plt0 || !traced(id) {
            continue;
        }
        let mut jumps = cfg
            .calls
            .iter()
            .filter(|c| c.kind == CallKind::Plt && c.target.is_none() && c.tail);
        let (Some(c), None) = (jumps.next(), jumps.next()) else {
            continue;
        };
        if c.name.as_deref().is_some_and(imports::is_exit_like) {
            continue;
        }
        let blk = &cfg.blocks[c.block];
        let at = blk.last_insn();
        let Some(bytes) = module.bytes_at(at, blk.end - at) else {
            continue;
        };
        let insn =
            iced_x86::Decoder::with_ip(64, bytes, at, iced_x86::DecoderOptions::NONE).decode();
        if !insn.is_ip_rel_memory_operand() {
            continue;
        }
        let slot = insn.ip_rel_memory_address();
        let jump_slot = module
            .plt_relocs
            .iter()
            .any(|r| r.offset == slot && r.r_type == aetrace_analysis::elf::R_X86_64_JUMP_SLOT);
        let initial = module
            .bytes_at(slot, 8)
            .and_then(|v| v.try_into().ok())
            .map(u64::from_le_bytes);
        let out_edges: Vec<_> = cfg.edges.values().filter(|e| e.from == c.block).collect();
        match out_edges[..] {
            [e] if e.to == cfg.exit() && !jump_slot => {
                out.insert(id, RecordedStub::default());
            }
            // IBT (`.plt.sec`): the lazy half is a `.plt` entry of its own
            // (`endbr64; push n; jmp <plt0>`), where the slot points.
            [e] if e.to == cfg.exit() => {
                let entry = initial
                    .and_then(|a| by_start.get(&a).copied())
                    .filter(|&l| {
                        l != id
                            && Some(l) != plt0
                            && traced(l)
                            && prog.procs[l].kind == ProcKind::Plt
                    });
                if let Some(l) = entry {
                    out.insert(
                        id,
                        RecordedStub {
                            slot: Some(slot),
                            entry: Some(l),
                        },
                    );
                }
            }
            [a, b] if jump_slot => {
                let Some(lazy) = [a, b].into_iter().find(|e| e.to != cfg.exit()) else {
                    continue;
                };
                if initial == Some(cfg.blocks[lazy.to].start) {
                    out.insert(
                        id,
                        RecordedStub {
                            slot: Some(slot),
                            entry: None,
                        },
                    );
                }
            }
            _ => {}
        }
    }
    out
}

/// A PLT stub of [`recorded_stubs`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RecordedStub {
    /// The GOT slot whose initial value becomes the LAZY piece (`None`:
    /// bound at load time, no lazy outcome).
    pub slot: Option<u64>,
    /// The lazy-binding half when it is a procedure of its own (IBT's
    /// `.plt` entry), entered from the LAZY piece past its outside-entry
    /// stub (`CallDb::lazy`).
    entry: Option<ProcId>,
}

#[cfg(test)]
mod tests {
    use super::creates_task;
    use iced_x86::{Decoder, DecoderOptions, Instruction};

    fn block(bytes: &[u8]) -> Vec<Instruction> {
        Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE)
            .into_iter()
            .collect()
    }

    /// glibc 2.36's `_Fork`, `__libc_vfork`, a thread's clone, `__clone`'s
    /// (flags from a register) and `__clone3`'s create a task; another
    /// system call, or a number not loaded as a constant in the block,
    /// nothing.
    #[test]
    fn task_creating_system_calls() {
        const SYSCALL: [u8; 2] = [0x0f, 0x05];
        let fork_clone = [
            &[0xbf, 0x11, 0x00, 0x20, 0x01][..], // mov edi, 0x1200011
            &[0xb8, 0x38, 0, 0, 0],              // mov eax, 56
            &SYSCALL,
        ]
        .concat();
        assert!(creates_task(&block(&fork_clone)));
        let vfork = [&[0x5f][..], &[0xb8, 0x3a, 0, 0, 0], &SYSCALL].concat(); // pop rdi; mov eax, 58
        assert!(creates_task(&block(&vfork)));
        let thread = [
            &[0xbf, 0x00, 0x0f, 0x3d, 0x00][..], // mov edi, 0x3d0f00 (CLONE_VM|CLONE_THREAD|...)
            &[0xb8, 0x38, 0, 0, 0],
            &SYSCALL,
        ]
        .concat();
        assert!(creates_task(&block(&thread)));
        // __clone: mov rdi, rdx; mov eax, 56.
        let clone = [&[0x48, 0x89, 0xd7][..], &[0xb8, 0x38, 0, 0, 0], &SYSCALL].concat();
        assert!(creates_task(&block(&clone)));
        // __clone3: mov r8, rcx; mov eax, 435.
        let clone3 = [&[0x49, 0x89, 0xc8][..], &[0xb8, 0xb3, 0x01, 0, 0], &SYSCALL].concat();
        assert!(creates_task(&block(&clone3)));
        let write = [&[0xb8, 0x01, 0, 0, 0][..], &SYSCALL].concat();
        assert!(!creates_task(&block(&write)));
        // mov eax, 57; mov eax, edx: the number is not a constant.
        let computed = [&[0xb8, 0x39, 0, 0, 0][..], &[0x89, 0xd0], &SYSCALL].concat();
        assert!(!creates_task(&block(&computed)));
    }
}
