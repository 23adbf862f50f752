//! What is traced (docs/rewrite.md, steps 1-2): each procedure is either
//! traced, relocated with a springboard at its entry, or left alone with
//! the reason the program database records.
//!
//! Invariants:
//! - a procedure is left alone exactly when [`Traced::reasons`] has an
//!   entry for it, and then it has no plan, no copy, no springboard;
//! - a traced procedure has a CFG, room for the springboard at each entry
//!   point (a stub writing ENTER_AT at each secondary one),
//!   and only jump tables the copy can rewrite ([`Traced::tables`]);
//! - a libc's longjmp family runs untraced and is called like an import;
//!   a static libc's setjmp family is traced when tracing, its calls
//!   entering it by its springboard ([`Traced::setjmp_root_call`]), and
//!   left alone when counting (libc.so.6's is left alone); its fork
//!   family is traced (a child claims its slot at the system call);
//! - a procedure of [`Traced::early`] is no root of a setjmp family and,
//!   when [`Traced::late`], has no reason of the early code's: nothing
//!   in its code is patched in the file (the runtime patches it at init).

use std::collections::{BTreeSet, HashMap, HashSet};

use aetrace_analysis::cfg::{CallSite, Cfg, EdgeKind, IndirectJump, JumpResolution};
use aetrace_analysis::elf::Module;
use aetrace_analysis::{imports, ProcKind, Procedure, Program};
use aetrace_graph::{BlockId, ProcId};

use crate::codegen::Rel32Site;
use crate::liveness::{self, RegSet};
use crate::Rewrite;
use iced_x86::Register;

/// Length of the `jmp rel32` written over a traced procedure's entry.
pub(crate) const SPRINGBOARD: u64 = 5;

/// R_X86_64_IRELATIVE: its addend is an IFUNC resolver, run by ld.so
/// before the runtime is initialised.
const R_X86_64_IRELATIVE: u32 = 37;

/// A jump table a traced procedure's copy rewrites: its address, whether
/// its entries are 32-bit offsets from it (else absolute addresses), and
/// the jump.
pub(crate) type JumpTable = (u64, bool, IndirectJump);

/// The outcome of the phase: which procedures are traced.
pub(crate) struct Traced {
    /// Procedures left alone, and why (one line each).
    pub reasons: HashMap<ProcId, String>,
    /// The jump tables of traced procedures.
    pub tables: HashMap<ProcId, Vec<JumpTable>>,
    /// Every procedure by its entry address.
    pub by_start: HashMap<u64, ProcId>,
    /// A static libc's setjmp, longjmp and fork families.
    pub family: LibcFamily,
    /// The procedures of the setjmp and longjmp families left alone.
    pub family_procs: HashSet<ProcId>,
    /// A static executable without setjmp/longjmp symbols: `family` was
    /// recognised by code (`guarded_family`).
    pub stripped: bool,
    /// Tracing: per traced procedure whose outside-entry stub is not
    /// safe for the module's untraced direct callers, their calls and
    /// jumps to retarget to its preserving stub
    /// ([`Traced::retarget_direct_entries`]).
    pub direct: HashMap<ProcId, Vec<Rel32Site>>,
    /// Tracing: traced procedures without a springboard, too short for
    /// one and entered only by direct branches of analysable code
    /// ([`Traced::trace_unentered_short`]).
    pub boardless: HashSet<ProcId>,
    /// glibc is traced in this run (`Rewrite::glibc_traced`): an import
    /// named `fork` is libc.so.6's traced fork family.
    glibc_traced: bool,
    /// The code ld.so runs before the runtime's init (IFUNC resolvers,
    /// libc's `__libc_early_init`, with everything they call), when its
    /// springboards and other patches are installed by the runtime at
    /// init ([`Traced::late`]): traced, untraced until then.
    pub early: HashSet<ProcId>,
    /// A detached library's early code is traced: the executable's
    /// runtime installs its patches at init (`runtime::blob::detach`).
    /// Elsewhere it is left alone.
    pub late: bool,
}

/// The rel32 field of call site `c`'s branch, unless it is a rel8 form (or
/// no branch: a fall-through, a table case) or lies beside a springboard
/// (`boards`: the traced entries).
fn direct_site(
    prog: &Program,
    cfg: &Cfg,
    c: &CallSite,
    boards: &BTreeSet<u64>,
) -> Option<Rel32Site> {
    let b = &cfg.blocks[c.block];
    let at = b.last_insn();
    let clear = boards
        .range(at.saturating_sub(SPRINGBOARD - 1)..b.end)
        .next()
        .is_none();
    rel32_site(prog, (at, b.end), c.target?).filter(|_| clear)
}

/// The rel32 field of the `call`, `jmp` or `jcc` at `[at, end)` that
/// goes to `target`, if it has one (not a rel8 form).
fn rel32_site(prog: &Program, (at, end): (u64, u64), target: u64) -> Option<Rel32Site> {
    let bytes = prog.module.bytes_at(at, end - at)?;
    let i = iced_x86::Decoder::with_ip(64, bytes, at, iced_x86::DecoderOptions::NONE).decode();
    let rel32 = i.is_call_near() || i.is_jmp_near() || i.is_jcc_near();
    (rel32 && i.next_ip() == end && i.near_branch_target() == target).then(|| Rel32Site {
        field: i.next_ip() - 4,
        next: i.next_ip(),
    })
}

impl Traced {
    /// Decides, in order: what cannot be traced at all, which jump tables
    /// cannot be rewritten, and a static libc's untraced families.
    pub fn decide(rw: &Rewrite<'_>) -> Traced {
        let prog = rw.prog;
        let tracing = matches!(rw.how, crate::How::Trace(_));
        let late = tracing && rw.detached;
        let resolvers: &[u64] = if late { &[] } else { &rw.ifuncs };
        let reasons: HashMap<ProcId, String> = prog
            .procs
            .keys()
            .filter_map(|id| Some((id, left_alone_reason(prog, id, resolvers, tracing)?)))
            .collect();
        let mut t = Traced {
            reasons,
            tables: HashMap::new(),
            by_start: prog.procs.iter().map(|(id, p)| (p.start, id)).collect(),
            family: libc_family(&prog.module),
            family_procs: HashSet::new(),
            stripped: false,
            direct: HashMap::new(),
            boardless: HashSet::new(),
            glibc_traced: rw.glibc_traced,
            early: HashSet::new(),
            late,
        };
        t.jump_tables(prog, matches!(rw.how, crate::How::Trace(_)));
        t.computed_jumps(prog);
        t.stripped =
            prog.module.is_static && t.family.setjmp.is_empty() && t.family.longjmp.is_empty();
        if t.stripped {
            guarded_family(prog, &mut t.family);
        }
        t.leave_families_alone(prog, &rw.ifuncs, tracing);
        if matches!(rw.how, crate::How::Trace(_)) {
            t.entry_point_scratch(prog);
            t.trace_unentered_short(prog);
            t.retarget_direct_entries(prog);
        }
        t
    }

    /// Whether a patch at `vaddr` lies in the code ld.so runs before the
    /// runtime's init, when the runtime makes those patches ([`Traced::late`]).
    pub fn patched_at_init(&self, prog: &Program, vaddr: u64) -> bool {
        let inside = |&(lo, hi): &(u64, u64)| lo <= vaddr && vaddr < hi;
        self.late && (self.early.iter()).any(|&id| prog.procs[id].ranges.iter().any(inside))
    }

    /// Whether procedure `id` is traced.
    pub fn is_traced(&self, id: ProcId) -> bool {
        !self.reasons.contains_key(&id)
    }

    /// The traced procedure that starts at `addr`, if any.
    pub fn traced_at(&self, addr: u64) -> Option<ProcId> {
        self.by_start
            .get(&addr)
            .copied()
            .filter(|&q| self.is_traced(q))
    }

    /// A call that saves a context (may return again, through `longjmp`).
    pub fn setjmp_call(&self, c: &CallSite) -> bool {
        !c.tail
            && (c.target.is_some_and(|t| self.family.setjmp.contains(&t))
                || c.name.as_deref().is_some_and(imports::is_setjmp_like))
    }

    /// A setjmp call to a traced procedure of a static libc's setjmp
    /// family: the copy calls its original entry, whose springboard
    /// writes ENTER, so that the regenerator takes the setjmp's
    /// instructions as callbacks of the marked call, between its SETJMP
    /// and its RETURN, as it took `__sigjmp_save`'s when the roots were
    /// left alone: the call site and its return point (SETJMP_RESUME after
    /// a longjmp) are unchanged, and so is what the regenerator sees
    /// around them.
    pub fn setjmp_root_call(&self, c: &CallSite) -> bool {
        self.setjmp_call(c)
            && c.target
                .is_some_and(|t| self.family.setjmp.contains(&t) && self.traced_at(t).is_some())
    }

    /// A call or jump to one of `entries` (of [`LibcFamily`]) that runs
    /// untraced: its call site stands for what it does (`fork_child` after
    /// a `fork`).
    pub fn untraced_in(&self, c: &CallSite, entries: &[u64]) -> bool {
        c.target
            .is_some_and(|t| entries.contains(&t) && self.traced_at(t).is_none())
    }

    /// The symbol a call or jump names (an import's, a PLT stub's), but
    /// none for a traced member of a libc's fork family (a static libc's,
    /// or libc.so.6's, which every `fork` name reaches when glibc is
    /// traced): that one claims the child's slot at its own system call.
    pub fn fork_name<'c>(&self, c: &'c CallSite) -> Option<&'c str> {
        let traced_fork = self.glibc_traced
            || c.target
                .is_some_and(|t| self.family.fork.contains(&t) && self.traced_at(t).is_some());
        c.name.as_deref().filter(|_| !traced_fork)
    }

    /// A call or jump to the longjmp family.
    pub fn to_longjmp(&self, c: &CallSite) -> bool {
        c.target.is_some_and(|t| self.family.longjmp.contains(&t))
            || c.name.as_deref().is_some_and(imports::is_longjmp_like)
    }

    /// Jump tables must be rewritable. A table that several jumps of the
    /// procedure read (gcc -O2 duplicates a `goto *labels[i & 3]`, with the
    /// table's address hoisted into a register; CPython's 228 jumps
    /// through `opcode_targets`) is not rewritten: the copy's table could
    /// hold the case stubs, and so the witnesses, of one jump only. When
    /// tracing, each such jump goes through a dispatch from the original
    /// table's targets (`plan::dispatches`), as a computed jump does;
    /// counting leaves the procedure alone.
    fn jump_tables(&mut self, prog: &Program, tracing: bool) {
        for (id, p) in prog.procs.iter() {
            let Ok(cfg) = &p.cfg else { continue };
            if self.reasons.contains_key(&id) {
                continue;
            }
            let mut named: Option<HashSet<u64>> = None;
            let shared = shared_tables(cfg);
            for j in &cfg.indirect_jumps {
                let JumpResolution::Table { table, targets } = &j.resolution else {
                    continue;
                };
                if let Some(why) = outside_cases(cfg, j.block, targets, &self.by_start) {
                    self.reasons
                        .insert(id, format!("jump table at {table:#x} {why}"));
                    continue;
                }
                if shared.contains(table) {
                    if !tracing {
                        self.reasons.insert(
                            id,
                            format!("jump table at {table:#x} is read by several jumps"),
                        );
                    }
                    continue;
                }
                let named = named.get_or_insert_with(|| named_addresses(prog, cfg));
                if !named.contains(table) {
                    // The copy would keep reading the original table and
                    // jump into the original, untraced code.
                    self.reasons.insert(
                        id,
                        format!("jump table at {table:#x} is not named by any instruction"),
                    );
                    continue;
                }
                match targets.first().and_then(|&t| table_format(prog, *table, t)) {
                    Some(rel) => self
                        .tables
                        .entry(id)
                        .or_default()
                        .push((*table, rel, j.clone())),
                    None => {
                        self.reasons.insert(
                            id,
                            format!("jump table at {table:#x}: unknown entry format"),
                        );
                    }
                }
            }
        }
    }

    /// Jumps to computed code addresses go through the copy's dispatch
    /// (`codegen::Dispatch`), which must have a case for every target
    /// they can take: its cases outside the procedure as a table's
    /// ([`outside_cases`]); none is a label of a `.cold` part that is
    /// another procedure ([`cold_labels`]); and no rewritten jump table
    /// of the procedure is what it reads (a table register the compiler
    /// hoisted serves both jumps, and the analysis resolved only one).
    fn computed_jumps(&mut self, prog: &Program) {
        let cold = cold_labels(prog);
        for (id, p) in prog.procs.iter() {
            let Ok(cfg) = &p.cfg else { continue };
            let tables: Vec<u64> = self
                .tables
                .get(&id)
                .into_iter()
                .flatten()
                .map(|t| t.0)
                .collect();
            for j in &cfg.indirect_jumps {
                let JumpResolution::Computed(targets) = &j.resolution else {
                    continue;
                };
                if targets.is_empty() || self.reasons.contains_key(&id) {
                    continue;
                }
                let why = if let Some(why) = outside_cases(cfg, j.block, targets, &self.by_start) {
                    why
                } else if cold.contains(p.name.as_str()) {
                    "may go to a label of its `.cold` part, another procedure".into()
                } else if !tables.is_empty() && may_read_table(prog, cfg, j.block, &tables) {
                    "may read a jump table the copy rewrites".into()
                } else {
                    continue;
                };
                let at = j.addr;
                self.reasons.insert(
                    id,
                    format!("jump at {at:#x} to computed code addresses {why}"),
                );
            }
        }
    }

    /// Leaves alone each traced procedure with a secondary entry point
    /// where no register is free for its outside-entry stub (every call
    /// to it goes through the stub, a `-fipa-ra` caller's too).
    fn entry_point_scratch(&mut self, prog: &Program) {
        for (id, p) in prog.procs.iter() {
            if p.entries.len() < 2 || !self.is_traced(id) {
                continue;
            }
            let Ok(cfg) = &p.cfg else { continue };
            let live = liveness::decode_blocks(&prog.module, cfg)
                .ok()
                .map(|insns| liveness::analyze(cfg, &insns));
            let busy = p.entries[1..].iter().find(|&&e| {
                let scratch = cfg
                    .block_at(e)
                    .zip(live.as_ref())
                    .and_then(|(b, l)| l.entry_scratch(b));
                scratch.is_none()
            });
            if let Some(e) = busy {
                let why = format!(
                    "{} entry points, no register free for the stub at {e:#x}",
                    p.entries.len()
                );
                self.reasons.insert(id, why);
            }
        }
    }

    /// Where springboards go: every entry point of a traced procedure.
    fn springboard_sites(&self, prog: &Program) -> BTreeSet<u64> {
        prog.procs
            .iter()
            .filter(|&(id, _)| self.is_traced(id))
            .flat_map(|(_, p)| p.entries.iter().copied())
            .collect()
    }

    /// Gives each traced procedure that untraced code of the module enters
    /// by a direct call or jump, and whose outside-entry stub could clobber
    /// a value such a caller keeps ([`EntryFacts::stub_safe`]), a
    /// preserving stub (`runtime::emit_direct_entry`), and retargets those
    /// calls and jumps to it ([`Traced::direct`]): gcc's `-fipa-ra` lets
    /// a caller keep values across the call in any register (or the flags)
    /// the callee never writes (cc1's untraced `pre_gcse` code keeps a
    /// pointer in r11 across its call of 0x90cda0 and frees it after). A
    /// `jmp rel8` or `jcc rel8` cannot reach the copy: its target is left
    /// alone, and is untraced code in turn (until a fixpoint). PLT stubs
    /// are entered under the SysV ABI (their callee is another module's).
    fn retarget_direct_entries(&mut self, prog: &Program) {
        let mut facts = EntryFacts::new(prog, &self.by_start);
        let mut safe: HashMap<ProcId, bool> = HashMap::new();
        // Springboards go at traced entries: no retargeted field may
        // overlap one. A procedure left alone here loses its own.
        let mut boards = self.springboard_sites(prog);
        let mut work: Vec<ProcId> = self.reasons.keys().copied().collect();
        while let Some(caller) = work.pop() {
            let Ok(cfg) = &prog.procs[caller].cfg else {
                continue;
            };
            for c in &cfg.calls {
                let Some(q) = c.target.and_then(|t| self.traced_at(t)) else {
                    continue;
                };
                let boardless = self.boardless.contains(&q);
                if prog.procs[q].kind == ProcKind::Plt
                    || !boardless && *safe.entry(q).or_insert_with(|| facts.stub_safe(q))
                {
                    continue;
                }
                match direct_site(prog, cfg, c, &boards) {
                    Some(site) => self.direct.entry(q).or_default().push(site),
                    None if boardless => {
                        self.boardless.remove(&q);
                        self.reasons.insert(q, SHORT.to_owned());
                        work.push(q);
                    }
                    None => {
                        let at = cfg.blocks[c.block].last_insn();
                        let why = format!(
                            "entered by a short jump (or one beside a springboard) at {at:#x} from \
                             untraced {}, which may keep values (gcc -fipa-ra) in every \
                             register and flag its entry stub could use",
                            prog.procs[caller].name
                        );
                        self.reasons.insert(q, why);
                        for e in &prog.procs[q].entries {
                            boards.remove(e);
                        }
                        work.push(q);
                    }
                }
            }
        }
        let reasons = &self.reasons;
        self.direct.retain(|q, _| !reasons.contains_key(q));
    }

    /// Traces the procedures left alone only for being shorter than a
    /// springboard ([`SHORT`]) that nothing but direct branches of
    /// analysable code enters ([`crate::unentered`]), each branch from
    /// untraced code a rel32 one that can be retargeted to the copy
    /// (until a fixpoint: a procedure that stays alone is untraced code in
    /// turn). They get no springboard; traced copies enter their copies
    /// directly.
    fn trace_unentered_short(&mut self, prog: &Program) {
        let mut cands: HashSet<u64> = self
            .reasons
            .iter()
            .filter(|&(id, r)| r == SHORT && !self.family_procs.contains(id))
            .filter(|&(&id, _)| prog.procs[id].entries.len() == 1)
            .map(|(&id, _)| prog.procs[id].start)
            .collect();
        if cands.is_empty() {
            return;
        }
        let taken = crate::unentered::taken(prog, &cands);
        cands.retain(|a| !taken.contains(a));
        let boards = self.springboard_sites(prog);
        loop {
            let stuck: HashSet<u64> = self
                .reasons
                .keys()
                .filter(|&&id| !cands.contains(&prog.procs[id].start))
                .filter_map(|&id| prog.procs[id].cfg.as_ref().ok())
                .flat_map(|cfg| cfg.calls.iter().map(move |c| (cfg, c)))
                .filter(|(_, c)| c.target.is_some_and(|t| cands.contains(&t)))
                .filter(|&(cfg, c)| direct_site(prog, cfg, c, &boards).is_none())
                .filter_map(|(_, c)| c.target)
                .collect();
            if stuck.is_empty() {
                break;
            }
            cands.retain(|a| !stuck.contains(a));
        }
        for a in cands {
            let id = self.by_start[&a];
            self.reasons.remove(&id);
            self.boardless.insert(id);
        }
    }

    /// A libc's longjmp family (static or libc.so.6) is left alone and
    /// called like the imports, whatever alias the call names; so is
    /// libc.so.6's setjmp family, and a static libc's when counting. When
    /// tracing, a static libc's setjmp family is traced, entered by its
    /// springboard ([`Traced::setjmp_root_call`]). Either way its call
    /// sites write SETJMP before the call and SETJMP_RESUME at the return
    /// point. What setjmp calls (`__sigjmp_save`) and what longjmp calls
    /// (`_exit`, `mmap`, `munmap` on its fortify error path) stays traced:
    /// entered from them, it is a callback from untraced code, as from an
    /// import, and returns before the setjmp call returns (its call is
    /// marked: RETURN after SETJMP and the callbacks) or before the context
    /// is resumed. The IRELATIVE PLT
    /// stubs they call stay traced: a stub's one `jmp [GOT]` goes to an
    /// implementation traced or not whoever calls the stub, so leaving the
    /// stub alone would keep no traced code out of the family; traced, its
    /// springboard's ENTER is one more callback beside the implementation's
    /// own. The fork family (static or libc.so.6) is traced and counted: a
    /// traced child claims its slot right after the system call
    /// (`calls::creates_task`; the `fork_child` at an executable's call of
    /// the `fork` import then finds the slot its own), and a counted one's
    /// system call gets a fork's split return edge
    /// (`Calls::may_fork_call`). In any shared object or dynamic
    /// executable, what ld.so runs before the executable's runtime exists
    /// (IFUNC resolvers, libc's `__libc_early_init`), with everything it
    /// calls, is [`Traced::early`]: in a detached library traced, its
    /// original entries intact in the file until the runtime's init
    /// installs their springboards (ld.so's early calls run the original
    /// code, and so nothing traced); elsewhere left alone.
    fn leave_families_alone(&mut self, prog: &Program, ifuncs: &[u64], tracing: bool) {
        let shared_libc = is_shared_libc(&prog.module);
        let f = &self.family;
        let setjmp_alone = !(tracing && prog.module.is_static);
        // (entry, why): only the early code's callees join it. What a
        // setjmp or longjmp calls is traced, entered from untraced code
        // like a callback (a setjmp call is marked: the regenerator takes
        // callbacks until its RETURN).
        let (setjmp, longjmp) = if shared_libc {
            (SETJMP_LIBC_SO, LONGJMP_LIBC_SO)
        } else {
            (SETJMP_STATIC, LONGJMP_STATIC)
        };
        let setjmps = (f.setjmp.iter())
            .filter(|_| setjmp_alone)
            .map(|&a| (a, setjmp));
        let mut work: Vec<(u64, &'static str)> = (f.longjmp.iter())
            .map(|&a| (a, longjmp))
            .chain(setjmps)
            .collect();
        // What ld.so runs before the executable's preinit (its runtime's
        // init) must not write a witness, nor may anything it calls. (A
        // static program's init comes first: its resolvers' callees are
        // traced.)
        let early = (prog.module.func_symbols.iter())
            .filter(|s| shared_libc && s.name == LIBC_EARLY_INIT)
            .map(|s| s.addr);
        let resolvers = ifuncs.iter().filter(|_| !prog.module.is_static);
        work.extend(resolvers.copied().chain(early).map(|a| (a, EARLY)));
        let roots: HashSet<u64> = work.iter().map(|&(a, _)| a).collect();
        while let Some((a, why)) = work.pop() {
            let Some(&id) = self.by_start.get(&a) else {
                continue;
            };
            // A PLT stub jumps to the same code whoever calls it, so it
            // stays traced (and shared), but not one ld.so's early calls
            // reach: its copy is not mapped then.
            let plt = prog.procs[id].kind == ProcKind::Plt;
            if plt && why != EARLY {
                continue;
            }
            // Traced, its patches installed at init: untraced until then.
            let late = why == EARLY && self.late;
            let first = if late {
                self.early.insert(id)
            } else {
                self.family_procs.insert(id)
            };
            if !first {
                continue;
            }
            if !late {
                let text = if roots.contains(&a) {
                    why.to_owned()
                } else {
                    format!("called by the {why}")
                };
                self.reasons.entry(id).or_insert(text);
            }
            if let (EARLY, Ok(cfg)) = (why, &prog.procs[id].cfg) {
                work.extend((cfg.calls.iter()).filter_map(|c| c.target.map(|t| (t, why))));
                // A callback it hands out runs early too (libc's
                // `__pthread_tunables_init` gives ld.so's
                // `__tunable_get_val` one).
                work.extend(lea_targets(prog, cfg).map(|t| (t, why)));
            }
        }
    }
}

const SETJMP_STATIC: &str =
    "setjmp family of a static libc, when counting (runs uncounted, called like an import)";
const LONGJMP_STATIC: &str =
    "longjmp family of a static libc (runs untraced, called like an import)";
const SETJMP_LIBC_SO: &str = "setjmp family of libc.so.6 (runs untraced, called like an import)";
const LONGJMP_LIBC_SO: &str = "longjmp family of libc.so.6 (runs untraced, called like an import)";
const EARLY: &str =
    "code ld.so runs before the runtime's init (IFUNC resolver, __libc_early_init): runs untraced";

/// The code addresses `cfg`'s blocks load with a RIP-relative `lea`:
/// callbacks it may hand to code it calls.
fn lea_targets<'p>(prog: &'p Program, cfg: &'p Cfg) -> impl Iterator<Item = u64> + 'p {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};
    cfg.blocks.values().flat_map(move |b| {
        let bytes = prog
            .module
            .bytes_at(b.start, b.end - b.start)
            .unwrap_or(&[]);
        Decoder::with_ip(64, bytes, b.start, DecoderOptions::NONE)
            .into_iter()
            .filter(|i| i.mnemonic() == Mnemonic::Lea && i.is_ip_rel_memory_operand())
            .map(|i| i.ip_rel_memory_address())
            .collect::<Vec<_>>()
    })
}

/// What ld.so calls in libc.so.6 after relocating it and before the
/// executable's preinit (glibc 2.32 on).
const LIBC_EARLY_INIT: &str = "__libc_early_init";

/// glibc's libc.so.6: a shared object defining [`LIBC_EARLY_INIT`]. Its
/// setjmp, longjmp and fork families are found by name, as a static
/// libc's are.
fn is_shared_libc(module: &Module) -> bool {
    !module.is_static
        && module
            .func_symbols
            .iter()
            .any(|s| s.name == LIBC_EARLY_INIT)
}

/// The jump tables that more than one jump of `cfg` reads.
pub(crate) fn shared_tables(cfg: &Cfg) -> HashSet<u64> {
    let mut seen = HashSet::new();
    cfg.indirect_jumps
        .iter()
        .filter_map(|j| match &j.resolution {
            JumpResolution::Table { table, .. } => Some(*table),
            _ => None,
        })
        .filter(|&t| !seen.insert(t))
        .collect()
}

/// Whether the jump ending block `b` may read one of the jump tables at
/// `tables` (the copy rewrites them): yes unless its target is loaded, in
/// its block or those falling through into it alone, from an absolute or RIP-relative address that is no such
/// table (CPython's `jmp *opcode_targets(,%rax,8)`), for a register may hold
/// a rewritten table's address.
fn may_read_table(prog: &Program, cfg: &Cfg, b: BlockId, tables: &[u64]) -> bool {
    use iced_x86::{Decoder, DecoderOptions, InstructionInfoFactory, Mnemonic, OpAccess, OpKind};
    // The block, after those falling through into it alone (a procedure
    // with an unresolved jump has a block per instruction).
    let mut start = b;
    for _ in 0..8 {
        let mut preds = cfg.edges.values().filter(|e| e.to == start);
        match (preds.next(), preds.next()) {
            (Some(e), None) if e.kind == EdgeKind::FallThrough => start = e.from,
            _ => break,
        }
    }
    let (from, to) = (cfg.blocks[start].start, cfg.blocks[b].end);
    let Some(bytes) = prog.module.bytes_at(from, to - from) else {
        return true;
    };
    let insns: Vec<_> = Decoder::with_ip(64, bytes, from, DecoderOptions::NONE)
        .into_iter()
        .collect();
    let Some((jmp, body)) = insns.split_last() else {
        return true;
    };
    let load = match jmp.op0_kind() {
        OpKind::Memory => Some(jmp),
        OpKind::Register => {
            let r = jmp.op0_register();
            let mut info = InstructionInfoFactory::new();
            body.iter()
                .rev()
                .find(|i| {
                    info.info(i).used_registers().iter().any(|u| {
                        u.register().full_register() == r
                            && !matches!(u.access(), OpAccess::Read | OpAccess::CondRead)
                    })
                })
                .filter(|i| {
                    i.mnemonic() == Mnemonic::Mov
                        && i.op0_register() == r
                        && i.op1_kind() == OpKind::Memory
                })
        }
        _ => None,
    };
    !load.is_some_and(|l| {
        matches!(l.memory_base(), Register::None | Register::RIP)
            && !tables.contains(&l.memory_displacement64())
    })
}

/// Names whose gcc `.cold` part is a procedure of its own with its
/// address taken: a `&&label` of the function there (`traces/computed_jump.c`)
/// is no label of the procedure the analysis gives its computed jumps.
fn cold_labels(prog: &Program) -> HashSet<&str> {
    prog.procs
        .iter()
        .filter(|(_, p)| {
            p.sources
                .contains(&aetrace_analysis::procs::Source::AddressTaken)
        })
        .filter_map(|(_, p)| p.name.split_once(".cold").map(|(base, _)| base))
        .collect()
}

/// Why the cases of a jump table (of the jump ending `block`) outside the
/// procedure cannot be rewritten, if they cannot. They can when they all go
/// to one other procedure's entry (gcc's `.cold` part of the same function,
/// `call abort`, has no symbol in a stripped program and is a procedure of
/// its own) and some case stays inside: the CFG has that case as the
/// block's tail call site and its edge to EXIT, a witnessed predicate edge,
/// which the copy's table entry takes through a stub as a conditional tail
/// call's taken edge does (docs/rewrite.md, "Jump tables").
fn outside_cases(
    cfg: &Cfg,
    block: BlockId,
    targets: &[u64],
    by_start: &HashMap<u64, ProcId>,
) -> Option<String> {
    let mut outside: Vec<u64> = targets
        .iter()
        .copied()
        .filter(|&t| cfg.block_at(t).is_none())
        .collect();
    outside.sort_unstable();
    outside.dedup();
    let first = *outside.first()?;
    let inside = targets.iter().any(|&t| cfg.block_at(t).is_some());
    let site = cfg
        .calls
        .iter()
        .find(|c| c.block == block && c.tail && c.target == Some(first));
    if outside.len() > 1 {
        return Some(format!(
            "has cases in {} other procedures ({first:#x}, ...)",
            outside.len()
        ));
    }
    if !inside {
        return Some(format!(
            "has no case inside the procedure (one is {first:#x})"
        ));
    }
    if site.is_none() || !by_start.contains_key(&first) {
        return Some(format!(
            "has a case outside the procedure ({first:#x}) that is no other procedure's entry"
        ));
    }
    None
}

/// What each procedure's original code writes, for
/// [`Traced::leave_unstubbable_alone`], computed on demand.
struct EntryFacts<'p> {
    prog: &'p Program,
    by_start: &'p HashMap<u64, ProcId>,
    /// Per procedure: a register and the flags free at its entry; what it
    /// may write itself (`Liveness::may_write`, ABI calls included); the
    /// procedures it calls or jumps to directly. `None`: not analysable.
    own: HashMap<ProcId, Option<(bool, RegSet, Vec<ProcId>)>>,
}

impl<'p> EntryFacts<'p> {
    fn new(prog: &'p Program, by_start: &'p HashMap<u64, ProcId>) -> Self {
        EntryFacts {
            prog,
            by_start,
            own: HashMap::new(),
        }
    }

    fn own(&mut self, q: ProcId) -> Option<&(bool, RegSet, Vec<ProcId>)> {
        let (prog, by_start) = (self.prog, self.by_start);
        self.own
            .entry(q)
            .or_insert_with(|| {
                let cfg = prog.procs[q].cfg.as_ref().ok()?;
                let insns = liveness::decode_blocks(&prog.module, cfg).ok()?;
                let live = liveness::analyze(cfg, &insns);
                let callees = cfg
                    .calls
                    .iter()
                    .filter_map(|c| by_start.get(&c.target?).copied())
                    .collect();
                Some((
                    live.entry_scratch(cfg.entry).is_some(),
                    live.may_write(),
                    callees,
                ))
            })
            .as_ref()
    }

    /// Whether q's outside-entry stub clobbers nothing a direct caller
    /// compiled with `-fipa-ra` keeps: a register and the flags are free at
    /// q's entry (the stub uses that register), or q and what it calls in
    /// the module may write r11 and the flags, so gcc counts both clobbered
    /// by the call (the stub uses r11). Not analysable: not safe.
    fn stub_safe(&mut self, q: ProcId) -> bool {
        let need = RegSet::gpr(Register::R11) | RegSet::FLAGS;
        match self.own(q) {
            None => return false,
            Some(&(free, ..)) if free => return true,
            Some(_) => {}
        }
        let mut written = RegSet::EMPTY;
        let mut seen = HashSet::from([q]);
        let mut work = vec![q];
        while let Some(p) = work.pop() {
            // A PLT stub jumps to another module: the SysV ABI's clobbers.
            if self.prog.procs[p].kind == ProcKind::Plt {
                return true;
            }
            let Some((_, writes, callees)) = self.own(p) else {
                return false;
            };
            written |= *writes;
            if written & need == need {
                return true;
            }
            work.extend(callees.clone().into_iter().filter(|&c| seen.insert(c)));
        }
        false
    }
}

/// The IFUNC resolvers that run before the runtime is initialised.
pub(crate) fn ifunc_resolvers(module: &Module, elf: &goblin::elf::Elf<'_>) -> Vec<u64> {
    // In a static executable the runtime's init runs at the entry point,
    // before the libc's startup code applies IRELATIVE relocations: its
    // IFUNC resolvers are ordinary callbacks there.
    let mut ifuncs: Vec<u64> = module
        .dyn_relocs
        .iter()
        .chain(&module.plt_relocs)
        .filter(|r| r.r_type == R_X86_64_IRELATIVE && !module.is_static)
        .map(|r| r.addend as u64)
        .collect();
    // An exported IFUNC's resolver runs when ld.so relocates the objects
    // that import it, before the executable's preinit: a library's too.
    ifuncs.extend(
        elf.syms
            .iter()
            .chain(elf.dynsyms.iter())
            .filter(|s| s.st_type() == goblin::elf::sym::STT_GNU_IFUNC && s.st_shndx != 0)
            .map(|s| s.st_value),
    );
    ifuncs
}

/// Whether the springboard fits at `p`'s entry: inside its primary range,
/// or, for a shorter procedure (liblzma's 4-byte `mov 0x18(%rdi), %eax;
/// ret`), running on into the alignment fill after it, when everything from
/// its end to the next procedure's range (or the section's end) is fill
/// (`nop`, `int3`, zero bytes) that belongs to no procedure: no code runs
/// or reads those bytes, so overwriting them changes nothing else.
pub(crate) fn springboard_fits(prog: &Program, p: &Procedure) -> bool {
    fits_at(prog, p.start, p.end)
}

/// Whether a springboard fits at `start`, in a range ending at `end`
/// ([`springboard_fits`]).
fn fits_at(prog: &Program, start: u64, end: u64) -> bool {
    let need = start + SPRINGBOARD;
    if end >= need {
        return true;
    }
    let Some(section) = prog.module.exec_sections().find(|s| s.contains(start)) else {
        return false;
    };
    let next = prog
        .procs
        .values()
        .flat_map(|q| q.ranges.iter().map(|&(s, _)| s))
        .filter(|&s| s >= end)
        .fold(section.end(), u64::min);
    next >= need && aetrace_analysis::report::is_fill(&prog.module, end, next)
}

/// Why a procedure's secondary entry points (glibc's `__mempcpy` and
/// `__memmove_chk` running into `__memmove`) cannot each get a
/// springboard and an outside-entry stub writing ENTER_AT, if they cannot:
/// each must start a block and have room for its springboard, no
/// springboard may cover another entry point, and the procedure must not
/// call one of its own blocks (the copy would call the block's copy, past
/// the stub, where the database has a call into untraced code).
fn entry_points_unfit(prog: &Program, p: &Procedure, cfg: &Cfg) -> Option<String> {
    let mut sorted = p.entries.clone();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[1] - w[0] < SPRINGBOARD) {
        return Some(format!(
            "entry points {:#x} and {:#x} closer than a springboard",
            w[0], w[1]
        ));
    }
    for &e in &p.entries[1..] {
        let end = p.ranges.iter().find(|&&(s, en)| s <= e && e < en);
        if cfg.block_at(e).is_none() || !end.is_some_and(|&(_, en)| fits_at(prog, e, en)) {
            return Some(format!(
                "{} entry points: no block or no room for a springboard at {e:#x}",
                p.entries.len()
            ));
        }
    }
    let own = cfg
        .calls
        .iter()
        .filter(|c| !c.tail)
        .find_map(|c| c.target.filter(|&t| cfg.block_at(t).is_some()));
    own.map(|t| {
        format!(
            "{} entry points, one called from inside ({t:#x})",
            p.entries.len()
        )
    })
}

/// Why procedure `proc` cannot be traced, if it cannot. `tracing`: an
/// unresolved jump writes INDIRECT and goes on through the copy's map
/// (`codegen`, "Unresolved jumps"); counters cannot follow it (its edges
/// are not in the graph whose flow the counts recover).
fn left_alone_reason(prog: &Program, id: ProcId, ifuncs: &[u64], tracing: bool) -> Option<String> {
    let p = &prog.procs[id];
    let cfg = match &p.cfg {
        Err(e) => return Some(format!("not analysable: {e}")),
        Ok(c) => c,
    };
    if ifuncs.contains(&p.start) {
        return Some("IFUNC resolver (runs before the runtime)".into());
    }
    // PLT stubs keep their own handling (`calls::recorded_stubs`); counters
    // count entries at the entry vertex only.
    if p.entries.len() > 1 && (!tracing || p.kind == ProcKind::Plt) {
        return Some(format!("{} entry points", p.entries.len()));
    }
    if p.entries.len() > 1 {
        if let Some(why) = entry_points_unfit(prog, p, cfg) {
            return Some(why);
        }
    }
    // `xbegin` ends its block; its abort path is not relocated (a witness
    // inside a transaction would abort it anyway).
    for b in cfg.blocks.values() {
        let at = b.last_insn();
        let insn = prog.module.bytes_at(at, b.end - at).map(|bytes| {
            iced_x86::Decoder::with_ip(64, bytes, at, iced_x86::DecoderOptions::NONE).decode()
        });
        if insn.is_some_and(|i| i.mnemonic() == iced_x86::Mnemonic::Xbegin) {
            return Some(format!("transactional memory (xbegin at {at:#x})"));
        }
    }
    for j in &cfg.indirect_jumps {
        match &j.resolution {
            JumpResolution::Unresolved(_) if tracing => {}
            JumpResolution::Unresolved(why) => {
                return Some(format!(
                    "unresolved indirect jump at {:#x}: {why} (counting mode)",
                    j.addr
                ))
            }
            // No path reaches the jump (its guards compare constants); a
            // traced one dispatches on its target (`codegen::Dispatch`).
            JumpResolution::Computed(t) if t.is_empty() || tracing => {}
            JumpResolution::Computed(_) => {
                return Some(format!(
                    "indirect jump at {:#x} to computed code addresses (counting mode)",
                    j.addr
                ))
            }
            JumpResolution::Table { .. } | JumpResolution::TailCall => {}
        }
    }
    // Last: `Traced::trace_unentered_short` may trace it still.
    (!springboard_fits(prog, p)).then(|| SHORT.to_owned())
}

/// Why a procedure is left alone that is too short for its springboard
/// and entered by more than direct branches of analysable code.
const SHORT: &str = "shorter than a springboard (5 bytes), not followed by enough fill, and \
                     its address may be taken";

/// Entry addresses of a static libc's functions that must run untraced,
/// like the imports of a dynamic program, by any of their symbol names
/// (glibc's `longjmp`, `siglongjmp` and `__libc_siglongjmp` are one
/// function).
#[derive(Default)]
pub(crate) struct LibcFamily {
    /// Save a context (`setjmp`).
    pub setjmp: Vec<u64>,
    /// Resume one (`longjmp`): never return.
    pub longjmp: Vec<u64>,
    /// Create a process (`fork`): the child must get its own slot before
    /// it runs traced code.
    pub fork: Vec<u64>,
    /// Those of `fork` that run `pthread_atfork` handlers.
    pub atfork: Vec<u64>,
}

fn libc_family(module: &Module) -> LibcFamily {
    let mut f = LibcFamily::default();
    if !module.is_static && !is_shared_libc(module) {
        return f;
    }
    for s in &module.func_symbols {
        let n = s.name.as_str();
        if imports::is_setjmp_like(n) {
            f.setjmp.push(s.addr);
        } else if imports::is_longjmp_like(n) || matches!(n, "__libc_siglongjmp" | "__libc_longjmp")
        {
            f.longjmp.push(s.addr);
        } else if imports::is_fork_like(n) || n == "__fork" {
            f.fork.push(s.addr);
            if imports::runs_atfork_handlers(n) {
                f.atfork.push(s.addr);
            }
        }
    }
    f
}

/// A stripped static libc's setjmp and longjmp (no names to go by),
/// recognised by what they do with glibc's pointer guard `fs:[0x30]`: a
/// setjmp mangles its caller's stack pointer (`lea R, [rsp+8]`, then
/// `xor R, fs:[0x30]`), a longjmp demangles one and switches to it
/// (`xor R, fs:[0x30]`, then `mov rsp, R`). The wrappers that tail-jump
/// to a setjmp (`_setjmp`, `setjmp`) save a context too.
fn guarded_family(prog: &Program, f: &mut LibcFamily) {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};
    for (_, p) in prog.procs.iter() {
        let Ok(cfg) = &p.cfg else { continue };
        let mut blocks: Vec<_> = cfg.blocks.values().collect();
        blocks.sort_by_key(|b| b.start);
        let (mut rsp8, mut demangled) = (Vec::new(), Vec::new());
        let (mut saves, mut switches) = (false, false);
        for b in blocks {
            let Some(bytes) = prog.module.bytes_at(b.start, b.end - b.start) else {
                continue;
            };
            for i in Decoder::with_ip(64, bytes, b.start, DecoderOptions::NONE) {
                let reg0 = (i.op_count() == 2 && i.op0_kind() == OpKind::Register)
                    .then(|| i.op0_register());
                let mem = i.op_count() == 2 && i.op1_kind() == OpKind::Memory;
                match (i.mnemonic(), reg0) {
                    (Mnemonic::Lea, Some(r))
                        if mem
                            && i.memory_base() == Register::RSP
                            && i.memory_index() == Register::None
                            && i.memory_displacement64() == 8 =>
                    {
                        rsp8.push(r)
                    }
                    (Mnemonic::Xor, Some(r))
                        if mem
                            && i.memory_segment() == Register::FS
                            && i.memory_base() == Register::None
                            && i.memory_index() == Register::None
                            && i.memory_displacement64() == 0x30 =>
                    {
                        saves |= rsp8.contains(&r);
                        demangled.push(r);
                    }
                    (Mnemonic::Mov, Some(Register::RSP))
                        if i.op1_kind() == OpKind::Register
                            && demangled.contains(&i.op1_register()) =>
                    {
                        switches = true
                    }
                    _ => {}
                }
            }
        }
        if switches {
            f.longjmp.push(p.start);
        } else if saves {
            f.setjmp.push(p.start);
        }
    }
    loop {
        let wrappers: Vec<u64> = prog
            .procs
            .values()
            .filter(|p| !f.setjmp.contains(&p.start))
            .filter(|p| {
                p.cfg.as_ref().is_ok_and(|cfg| {
                    cfg.calls
                        .iter()
                        .any(|c| c.tail && c.target.is_some_and(|t| f.setjmp.contains(&t)))
                })
            })
            .map(|p| p.start)
            .collect();
        if wrappers.is_empty() {
            return;
        }
        f.setjmp.extend(wrappers);
    }
}

/// Decodes the entry format of a jump table from its first entry.
/// The addresses the procedure's instructions name in memory operands
/// (`codegen::named_address`): the copy retargets a jump table only where
/// the code names it, so a table the analysis reads from another address
/// (from an entry past the one the code names) cannot be rewritten.
fn named_addresses(prog: &Program, cfg: &Cfg) -> HashSet<u64> {
    let blocks = liveness::decode_blocks(&prog.module, cfg).unwrap_or_default();
    blocks
        .iter()
        .flatten()
        .filter_map(crate::codegen::named_address)
        .collect()
}

fn table_format(prog: &Program, table: u64, first: u64) -> Option<bool> {
    let rel = prog.module.bytes_at(table, 4)?;
    let rel = i32::from_le_bytes(rel.try_into().ok()?);
    if table.wrapping_add(rel as i64 as u64) == first {
        return Some(true);
    }
    let abs = prog.module.bytes_at(table, 8)?;
    (u64::from_le_bytes(abs.try_into().ok()?) == first).then_some(false)
}
