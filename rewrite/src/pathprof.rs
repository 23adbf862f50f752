//! Path counters instead of edge counters: the instrumentation of
//! `aetrace paths` (paper 001, Ball & Larus, *Efficient Path Profiling*).
//!
//! Per traced procedure the path graph is the CFG plus one virtual edge
//! `c -> EXIT` for every call block `c` whose callee may end the process
//! (as for edge profiles, [`super::counters`]); `graph::paths` numbers its
//! acyclic paths and computes the chord increments. The code then does the
//! paper's `r = Inc(ENTRY -> root)` at the invocation label, `r += Inc(c)` on
//! chords, `count[r + Inc(t -> EXIT)]++; r = Inc(ENTRY -> h)` on a back edge
//! `t -> h` and `count[r + Inc(e)]++` on an edge `e` to EXIT. A virtual edge
//! is counted before its call and uncounted when the call returns, so a
//! frame left active by `exit` is counted as a path ending at its call
//! block, and a finished one is not.
//!
//! **Design: the path register.** `r` must be per activation (recursion,
//! callbacks, signal handlers, threads). It lives in memory, in a per-thread
//! *state block* that `%gs` points at (no other code of a counting rewrite
//! uses `%gs`): `gs:[R]` holds the *address* of the counter
//! `count[first + r]` (so `count[r + k]++` is one `add qword [reg + 8k], 1`
//! after one load, and no sequence needs two registers), followed by a
//! shadow stack of the callers' `R`, pushed at the invocation label and
//! popped on every edge to EXIT. The order of the stores makes every
//! sequence safe against a signal handler running in its middle (the handler
//! pushes and pops its own entry, above the slot in use). The main thread's
//! block is a static segment, made current by the preinit entry
//! (`arch_prctl(ARCH_SET_GS)`); a new thread inherits its creator's `%gs`,
//! and since its first traced code is always an outside entry (the start
//! routine, called by libc), the outside-entry stub of a program that can
//! start threads compares the block's owner with `fs:[0]` (glibc's TCB self
//! pointer, as the tracing runtime does) and maps a fresh block on a
//! mismatch. Fork children get copies. Counter increments are `lock add`
//! when the program can start threads. Frames abandoned by `longjmp` or C++
//! exceptions would leave the shadow stack out of step with the machine
//! stack, so the rewriter refuses programs that call setjmp/longjmp or have
//! landing pads, naming the procedure. A recursion deeper than [`DEPTH`]
//! stops the program with a message (exit status 125) instead of
//! overflowing; a thread whose block cannot be mapped likewise.
//!
//! **Counters.** Dense: a procedure with `NumPaths <= PATH_LIMIT` gets
//! `NumPaths` 8-byte counters in the memfd-mapped counter segment, like the
//! edge profile's (so the counts survive SIGKILL and are shared with fork
//! children). A procedure with more paths falls back to edge profiling
//! (QP counters on the chords of a maximum spanning tree), as
//! docs/algorithms.md documents; the profile names it. No hashing: a
//! hashed table either loses paths or needs a collision path in the
//! instrumented code, and the dense limit already covers every procedure
//! of our test programs and gzip.
//!
//! Invariants: each operation list is non-empty; `Enter` appears only at
//! an invocation label (the stack below `rsp` is free there; its scratch
//! register is one the entry's liveness calls dead, or saved); a
//! procedure's counters are `[first, first + num_paths)`.

use aetrace_graph::paths::{number_paths, PathNumbering};
use aetrace_graph::weights::heuristic;
use aetrace_graph::{BlockId, EdgeId, EntityRef, Graph, GraphBuilder, VertexKind};
use aetrace_runtime::Site;
use iced_x86::code_asm::{eax, edi, edx, esi, rax, rsi, CodeAssembler};
use iced_x86::{Code, Instruction, MemoryOperand, Register};

use crate::codegen::CodegenError;
use aetrace_analysis::cfg::{BlockKind, Cfg, EdgeKind};

/// Most acyclic paths a procedure may have for dense path counters; past
/// it the procedure is edge-profiled (module comment).
pub const PATH_LIMIT: u64 = 1 << 18;

/// Entries of the shadow stack of path registers.
pub const DEPTH: u64 = 1 << 20;

/// Byte offsets in the state segment: `R`, the shadow stack pointer, its
/// limit, then the stack.
const OFF_R: u64 = 0;
const OFF_SP: u64 = 8;
const OFF_LIMIT: u64 = 16;
const OFF_OWNER: u64 = 24;
const OFF_STACK: u64 = 64;

/// Bytes of the state segment (whole pages).
pub fn state_bytes() -> u64 {
    (OFF_STACK + 8 * DEPTH).next_multiple_of(4096)
}

/// One step of path instrumentation.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PathOp {
    /// Invocation label: push the caller's `R`, then `r = Inc(ENTRY -> root)`
    /// (`R` = address of counter `word`).
    Enter {
        /// Counter index of the procedure's path counters.
        word: i64,
    },
    /// `r += inc`.
    Add {
        /// The chord's Ball–Larus increment.
        inc: i64,
    },
    /// `count[r + k] += amount`.
    Count {
        /// Offset added to `r` to get the counter index.
        k: i64,
        /// What to add to that counter (+1, or -1 to undo).
        amount: i8,
    },
    /// `r` restarts at counter `word` (after a back edge).
    Set {
        /// Counter index `r` restarts at.
        word: i64,
    },
    /// Back to the caller's `R` (the procedure is left).
    Pop,
    /// Edge-profile fallback: counter `word` += 1.
    Word {
        /// The edge counter's index.
        word: u32,
    },
}

/// The path numbering of one procedure.
#[derive(Clone, Debug)]
pub struct ProcPaths {
    /// First counter index.
    pub first: u32,
    /// The procedure's Ball–Larus path numbering.
    pub numbering: PathNumbering,
    /// Call blocks with a virtual exit edge.
    pub virtual_exits: Vec<BlockId>,
    /// The back edges (CFG edges), instrumented to record and restart.
    pub back_edges: Vec<EdgeId>,
}

/// The path graph of `cfg` (module comment): CFG vertices and edges with
/// their ids, EXIT, then `c -> EXIT` for each of `virtual_exits`.
pub fn path_graph(cfg: &Cfg, virtual_exits: &[BlockId]) -> Graph {
    let mut b = GraphBuilder::new();
    for blk in cfg.blocks.values() {
        b.add_vertex(match blk.kind {
            BlockKind::Plain => VertexKind::Plain,
            BlockKind::Call => VertexKind::Call,
        });
    }
    let exit = b.add_vertex(VertexKind::Exit);
    for e in cfg.edges.values() {
        b.add_edge(e.from, e.to);
    }
    for &c in virtual_exits {
        b.add_edge(c, exit);
    }
    b.finish(cfg.entry, exit)
}

/// Numbers the paths of `cfg`; `Err` carries `graph`'s error (too many
/// paths: the caller falls back to edge profiling).
pub fn number(
    cfg: &Cfg,
    virtual_exits: Vec<BlockId>,
    first: u32,
    limit: u64,
) -> aetrace_graph::Result<ProcPaths> {
    let g = path_graph(cfg, &virtual_exits);
    let numbering = number_paths(&g, &heuristic(&g), limit)?;
    let back_edges = cfg
        .edges
        .keys()
        .filter(|&e| numbering.is_back_edge(e))
        .collect();
    Ok(ProcPaths {
        first,
        numbering,
        virtual_exits,
        back_edges,
    })
}

/// What one procedure's code does, as operation lists: per CFG edge (at
/// the place the edge's counter would go), at the invocation label, and
/// before the call of each block.
#[derive(Clone, Debug, Default)]
pub struct ProcOps {
    /// Per CFG edge, the operations on it.
    pub edges: Vec<Vec<PathOp>>,
    /// The operations at the procedure's entry.
    pub entry: Vec<PathOp>,
    /// Per block, the operations before its call.
    pub before_call: Vec<Vec<PathOp>>,
}

/// The operations of procedure `pp` (module comment).
pub fn ops(cfg: &Cfg, pp: &ProcPaths) -> ProcOps {
    let nb = &pp.numbering;
    let first = i64::from(pp.first);
    let m = cfg.edges.len();
    let mut out = ProcOps {
        edges: vec![Vec::new(); m],
        entry: vec![PathOp::Enter {
            word: first + nb.inc_enter(),
        }],
        before_call: vec![Vec::new(); cfg.blocks.len()],
    };
    // Virtual exit edges: counted before the call, uncounted after it.
    let mut virt: Vec<Option<i64>> = vec![None; cfg.blocks.len()];
    for (i, &c) in pp.virtual_exits.iter().enumerate() {
        let k = nb.inc_edge(EdgeId::new(m + i));
        virt[c.index()] = Some(k);
        out.before_call[c.index()].push(PathOp::Count { k, amount: 1 });
    }
    for (e, ed) in cfg.edges.iter() {
        let v = &mut out.edges[e.index()];
        if ed.kind == EdgeKind::CallReturn {
            if let Some(k) = virt[ed.from.index()] {
                v.push(PathOp::Count { k, amount: -1 });
            }
        }
        if nb.is_back_edge(e) {
            let (k, restart) = nb.back_edge_incs(ed.from, ed.to);
            v.push(PathOp::Count { k, amount: 1 });
            v.push(PathOp::Set {
                word: first + restart,
            });
        } else if ed.to == cfg.exit() {
            v.push(PathOp::Count {
                k: nb.inc_edge(e),
                amount: 1,
            });
            v.push(PathOp::Pop);
        } else if nb.inc_edge(e) != 0 {
            v.push(PathOp::Add {
                inc: nb.inc_edge(e),
            });
        }
    }
    debug_assert!(
        cfg.edges.iter().all(|(e, ed)| {
            let ops = &out.edges[e.index()];
            let ends = nb.is_back_edge(e) || ed.to == cfg.exit();
            !ends
                || ops
                    .iter()
                    .any(|o| matches!(o, PathOp::Count { amount: 1, .. }))
        }),
        "every back edge and edge to EXIT counts its path"
    );
    debug_assert!(
        out.edges
            .iter()
            .chain(&out.before_call)
            .flatten()
            .all(|o| !matches!(o, PathOp::Enter { .. })),
        "Enter only at the invocation label"
    );
    out
}

/// Addresses the path code uses.
#[derive(Copy, Clone, Debug, Default)]
pub struct PathState {
    /// Counter 0.
    pub base: u64,
    /// The shadow-stack overflow handler.
    pub overflow: u64,
    /// The routine giving a new thread its state block (`call`ed by the
    /// outside-entry stub when `gs:[OWNER]` is not this thread's).
    pub attach: u64,
    /// The program can start threads: `lock` on counter increments and an
    /// owner check at outside entries.
    pub threads: bool,
}

type Res<T> = Result<T, CodegenError>;

fn rip(addr: u64) -> MemoryOperand {
    MemoryOperand::with_base_displ_size(Register::RIP, addr as i64, 8)
}

/// `gs:[off]` of the thread's state block (absolute, no base).
fn gs(off: u64) -> MemoryOperand {
    MemoryOperand::new(
        Register::None,
        Register::None,
        1,
        off as i64,
        4,
        false,
        Register::GS,
    )
}

fn word_addr(st: &PathState, word: i64) -> u64 {
    st.base.wrapping_add_signed(word.wrapping_mul(8))
}

fn disp(k: i64) -> Res<i32> {
    k.checked_mul(8)
        .and_then(|d| i32::try_from(d).ok())
        .ok_or(CodegenError::PathIncrement(k))
}

fn add_imm(code8: Code, code32: Code, d: i32) -> Code {
    if i8::try_from(d).is_ok() {
        code8
    } else {
        code32
    }
}

/// The outside-entry stub's owner check (threads): a thread whose
/// `gs:[OWNER]` is not its own `fs:[0]` (glibc's TCB self pointer) is new
/// and gets its own state block; then the code goes on at label `owned`
/// (bound after these instructions). r11 and the flags are dead at a
/// procedure entry.
pub fn emit_owner_check(st: &PathState, owned: u64) -> Res<Vec<Instruction>> {
    let fs0 = MemoryOperand::new(Register::None, Register::None, 1, 0, 4, false, Register::FS);
    Ok(vec![
        Instruction::with2(Code::Mov_r64_rm64, Register::R11, fs0)?,
        Instruction::with2(Code::Cmp_r64_rm64, Register::R11, gs(OFF_OWNER))?,
        Instruction::with_branch(Code::Je_rel32_64, owned)?,
        Instruction::with_branch(Code::Call_rel32_64, st.attach)?,
    ])
}

/// The instructions of `ops` at a site where `site` holds.
pub fn emit(ops: &[PathOp], st: &PathState, site: Site) -> Res<Vec<Instruction>> {
    match ops {
        [] => return Ok(Vec::new()),
        [PathOp::Word { word }] => {
            return super::counters::increment(st.base + 8 * u64::from(*word), 1, st.threads, site)
        }
        [PathOp::Add { inc }] if !site.flags_live => {
            let d = disp(*inc)?;
            let code = add_imm(Code::Add_rm64_imm8, Code::Add_rm64_imm32, d);
            return Ok(vec![Instruction::with2(code, gs(OFF_R), d)?]);
        }
        [PathOp::Add { inc }] if site.scratch.is_some() => {
            // Flags live: through the dead register, without touching them.
            let r: Register = site.scratch.expect("checked").into();
            return Ok(vec![
                Instruction::with2(Code::Mov_r64_rm64, r, gs(OFF_R))?,
                Instruction::with2(
                    Code::Lea_r64_m,
                    r,
                    MemoryOperand::with_base_displ(r, i64::from(disp(*inc)?)),
                )?,
                Instruction::with2(Code::Mov_rm64_r64, gs(OFF_R), r)?,
            ]);
        }
        [PathOp::Enter { word }] => {
            // At the invocation label the stack below rsp is free; the
            // register is one the entry's liveness calls dead (a local
            // caller may keep values in the caller-saved registers this
            // procedure never writes, gcc's -fipa-ra), else saved.
            let reg: Register = site.scratch.map_or(Register::R11, Into::into);
            let mem = MemoryOperand::with_base_displ_size(reg, 0, 8);
            let mut v = Vec::new();
            if site.flags_live {
                v.push(Instruction::with(Code::Pushfq));
            }
            if site.scratch.is_none() {
                v.push(Instruction::with1(Code::Push_r64, reg)?);
            }
            for i in [
                Instruction::with2(Code::Mov_r64_rm64, reg, gs(OFF_SP)),
                Instruction::with2(Code::Lea_r64_m, reg, MemoryOperand::with_base_displ(reg, 8)),
                Instruction::with2(Code::Cmp_r64_rm64, reg, gs(OFF_LIMIT)),
                Instruction::with_branch(Code::Jae_rel32_64, st.overflow),
                Instruction::with2(Code::Mov_rm64_r64, gs(OFF_SP), reg),
                Instruction::with1(Code::Push_rm64, gs(OFF_R)),
                Instruction::with1(Code::Pop_rm64, mem),
                Instruction::with2(Code::Lea_r64_m, reg, rip(word_addr(st, *word))),
                Instruction::with2(Code::Mov_rm64_r64, gs(OFF_R), reg),
            ] {
                v.push(i?);
            }
            if site.scratch.is_none() {
                v.push(Instruction::with1(Code::Pop_r64, reg)?);
            }
            if site.flags_live {
                v.push(Instruction::with(Code::Popfq));
            }
            return Ok(v);
        }
        _ => {}
    }
    let clobbers = ops.iter().any(|o| {
        matches!(
            o,
            PathOp::Add { .. } | PathOp::Count { .. } | PathOp::Word { .. }
        )
    });
    let save_flags = clobbers && site.flags_live;
    let push_reg = site.scratch.is_none();
    let step = site.red_zone_live && (save_flags || push_reg);
    let reg: Register = site.scratch.map_or(Register::RAX, Into::into);
    let rsp_by = super::codegen::rsp_step;
    let mut v = Vec::new();
    if step {
        v.push(rsp_by(-128)?);
    }
    if save_flags {
        v.push(Instruction::with(Code::Pushfq));
    }
    if push_reg {
        v.push(Instruction::with1(Code::Push_r64, reg)?);
    }
    let at_reg = |d: i32| MemoryOperand::with_base_displ_size(reg, i64::from(d), 8);
    for op in ops {
        match *op {
            PathOp::Add { inc } => {
                let d = disp(inc)?;
                let code = add_imm(Code::Add_rm64_imm8, Code::Add_rm64_imm32, d);
                v.push(Instruction::with2(code, gs(OFF_R), d)?);
            }
            PathOp::Count { k, amount } => {
                v.push(Instruction::with2(Code::Mov_r64_rm64, reg, gs(OFF_R))?);
                let mut add =
                    Instruction::with2(Code::Add_rm64_imm8, at_reg(disp(k)?), i32::from(amount))?;
                add.set_has_lock_prefix(st.threads);
                v.push(add);
            }
            PathOp::Set { word } => {
                v.push(Instruction::with2(
                    Code::Lea_r64_m,
                    reg,
                    rip(word_addr(st, word)),
                )?);
                v.push(Instruction::with2(Code::Mov_rm64_r64, gs(OFF_R), reg)?);
            }
            PathOp::Pop => {
                // Read the caller's R before releasing its slot: a signal
                // handler may push into the slot once it is released.
                for i in [
                    Instruction::with2(Code::Mov_r64_rm64, reg, gs(OFF_SP)),
                    Instruction::with2(Code::Mov_r64_rm64, reg, at_reg(0)),
                    Instruction::with2(Code::Mov_rm64_r64, gs(OFF_R), reg),
                    Instruction::with2(Code::Mov_r64_rm64, reg, gs(OFF_SP)),
                    Instruction::with2(
                        Code::Lea_r64_m,
                        reg,
                        MemoryOperand::with_base_displ(reg, -8),
                    ),
                    Instruction::with2(Code::Mov_rm64_r64, gs(OFF_SP), reg),
                ] {
                    v.push(i?);
                }
            }
            PathOp::Word { word } => {
                let mut add =
                    Instruction::with2(Code::Add_rm64_imm8, rip(st.base + 8 * u64::from(word)), 1)?;
                add.set_has_lock_prefix(st.threads);
                v.push(add);
            }
            PathOp::Enter { .. } => {
                return Err(CodegenError::Internal(
                    "a path entry outside an invocation label",
                ))
            }
        }
    }
    if push_reg {
        v.push(Instruction::with1(Code::Pop_r64, reg)?);
    }
    if save_flags {
        v.push(Instruction::with(Code::Popfq));
    }
    if step {
        v.push(rsp_by(128)?);
    }
    Ok(v)
}

/// Offsets (from `rip`) of the routines [`emit_init`] assembles.
#[derive(Copy, Clone, Debug)]
pub struct InitCode {
    /// The preinit entry: the main thread's state block, then `next`.
    pub init: u64,
    /// [`PathState::attach`].
    pub attach: u64,
    /// [`PathState::overflow`].
    pub overflow: u64,
}

/// The path state routines, assembled at `rip` (module comment): `init`
/// makes the static segment at `state` the main thread's state block and
/// jumps to `next` (the counters' preinit entry, which returns to ld.so);
/// `attach` maps a new block for a new thread (all registers but r11
/// preserved; the flags are dead at an entry); `overflow` stops the
/// program with a message. Each block: `R`, stack pointer, limit, owner
/// (`fs:[0]`), then the stack; `gs` points at it (`arch_prctl`). Without
/// `tls` (a static executable's entry point, before its libc sets up
/// `fs`), the main thread's owner is 0: only a program without threads
/// runs there (`PathState::threads` false, no owner check).
pub fn emit_init(rip: u64, state: u64, next: u64, tls: bool) -> Res<(Vec<u8>, InitCode)> {
    let d_state = i32::try_from(state as i64 - rip as i64)
        .map_err(|_| CodegenError::InitLayout("path state out of reach"))?;
    let len = u32::try_from(state_bytes())
        .map_err(|_| CodegenError::InitLayout("path state too large"))?;
    let end = i32::try_from(OFF_STACK + 8 * DEPTH)
        .map_err(|_| CodegenError::InitLayout("path stack too large"))?;
    let over = format!(
        "aetrace paths: more than {DEPTH} active procedure calls (path register stack overflow)\n"
    );
    let nomem = "aetrace paths: cannot map a thread's path register stack\n";
    let asm = || -> Result<(Vec<u8>, InitCode), iced_x86::IcedError> {
        use iced_x86::code_asm::{
            ptr, qword_ptr, r10, r10d, r8, r9, r9d, rcx, rdi, rdx, AsmRegister64,
        };
        use iced_x86::BlockEncoderOptions;
        let mut a = CodeAssembler::new(64)?;
        let mut start = a.create_label();
        let mut setup = a.create_label();
        let mut attach = a.create_label();
        let mut overflow = a.create_label();
        let mut fail = a.create_label();
        let mut over_text = a.create_label();
        let mut nomem_text = a.create_label();
        let mut die = a.create_label();
        let gs_bits = |a: &mut CodeAssembler, tls: bool| -> Result<(), iced_x86::IcedError> {
            // rdi = the block: stack pointer, limit, owner, then GS.
            a.lea(rsi, qword_ptr(rdi + OFF_STACK as i32))?;
            a.mov(qword_ptr(rdi + OFF_SP as i32), rsi)?;
            a.mov(rsi, rdi)?;
            a.add(rsi, end)?;
            a.mov(qword_ptr(rdi + OFF_LIMIT as i32), rsi)?;
            if tls {
                a.mov(rsi, qword_ptr(0u64).fs())?;
            } else {
                a.xor(esi, esi)?;
            }
            a.mov(qword_ptr(rdi + OFF_OWNER as i32), rsi)?;
            a.mov(rsi, rdi)?;
            a.mov(edi, 0x1001)?; // arch_prctl(ARCH_SET_GS, block)
            a.mov(eax, 158)?;
            a.syscall()?;
            a.cmp(rax, -4095)?;
            a.jae(fail)
        };
        // init(argc, argv, envp): keeps rdi, rsi, rdx for `next`.
        a.set_label(&mut start)?;
        a.push(rdi)?;
        a.push(rsi)?;
        a.push(rdx)?;
        a.lea(rdi, ptr(start))?;
        a.add(rdi, d_state)?;
        if tls {
            a.call(setup)?;
        } else {
            gs_bits(&mut a, false)?;
        }
        a.pop(rdx)?;
        a.pop(rsi)?;
        a.pop(rdi)?;
        a.jmp(next)?;
        a.set_label(&mut setup)?;
        gs_bits(&mut a, true)?;
        a.ret()?;
        // attach(): at an outside entry, argument registers live.
        let saved: [AsmRegister64; 8] = [rax, rdi, rsi, rdx, rcx, r8, r9, r10];
        a.set_label(&mut attach)?;
        for r in saved {
            a.push(r)?;
        }
        a.mov(eax, 9)?; // mmap(0, len, RW, PRIVATE|ANONYMOUS|NORESERVE, -1, 0)
        a.xor(edi, edi)?;
        a.mov(esi, len)?;
        a.mov(edx, 3)?;
        a.mov(r10d, 0x4022)?;
        a.mov(r8, -1i64)?;
        a.xor(r9d, r9d)?;
        a.syscall()?;
        a.cmp(rax, -4095)?;
        a.jae(fail)?;
        a.mov(rdi, rax)?;
        a.call(setup)?;
        for r in saved.iter().rev() {
            a.pop(*r)?;
        }
        a.ret()?;
        a.set_label(&mut overflow)?;
        a.lea(rsi, ptr(over_text))?;
        a.mov(edx, over.len() as u32)?;
        a.jmp(die)?;
        a.set_label(&mut fail)?;
        a.lea(rsi, ptr(nomem_text))?;
        a.mov(edx, nomem.len() as u32)?;
        a.set_label(&mut die)?;
        a.mov(eax, 1)?;
        a.mov(edi, 2)?;
        a.syscall()?;
        a.mov(eax, 231)?;
        a.mov(edi, 125)?;
        a.syscall()?;
        a.set_label(&mut over_text)?;
        a.db(over.as_bytes())?;
        a.set_label(&mut nomem_text)?;
        a.db(nomem.as_bytes())?;
        let res = a.assemble_options(rip, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
        let code = InitCode {
            init: res.label_ip(&start)? - rip,
            attach: res.label_ip(&attach)? - rip,
            overflow: res.label_ip(&overflow)? - rip,
        };
        Ok((res.inner.code_buffer, code))
    };
    Ok(asm()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Encoder};

    /// `gs:[off]` encodes as an absolute GS-relative operand, not RIP-relative.
    #[test]
    fn gs_operands_are_absolute() {
        let st = PathState::default();
        let site = Site::with_scratch(iced_x86::code_asm::rax);
        for op in [PathOp::Add { inc: 3 }, PathOp::Pop] {
            for insn in emit(&[op, PathOp::Count { k: 1, amount: 1 }], &st, site).unwrap() {
                let mut enc = Encoder::new(64);
                enc.encode(&insn, 0x1000).unwrap();
                let bytes = enc.take_buffer();
                let back = Decoder::with_ip(64, &bytes, 0x1000, DecoderOptions::NONE).decode();
                if insn.segment_prefix() == Register::GS {
                    assert_eq!(back.memory_base(), Register::None, "{back}");
                    assert_eq!(back.segment_prefix(), Register::GS, "{back}");
                    assert!(back.memory_displacement64() < 64, "{back}");
                }
            }
        }
    }

    /// The operation lists against the numbering: on random walks through
    /// every CFG of gzip (every call treated as one that may exit), the
    /// counter each `Count` touches is the id `graph::paths` gives the path
    /// walked so far, and an uncount undoes exactly the count before its
    /// call.
    #[test]
    fn operations_count_the_walked_paths() {
        use aetrace_graph::paths::Path;
        let prog = crate::Program::open(std::path::Path::new("/usr/bin/gzip")).unwrap();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rand = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let (mut procs, mut counted) = (0, 0);
        for (_, p) in prog.procs.iter() {
            let Ok(cfg) = &p.cfg else { continue };
            let virt = super::super::counters::virtual_exits(cfg, &|_| true);
            let Ok(pp) = number(cfg, virt, 0, PATH_LIMIT) else {
                continue;
            };
            procs += 1;
            let o = ops(cfg, &pp);
            let nb = &pp.numbering;
            let exit = cfg.exit();
            for _ in 0..20 {
                let [PathOp::Enter { word }] = o.entry[..] else {
                    panic!("{}: entry {:?}", p.name, o.entry)
                };
                let mut r = word;
                let mut path = Path {
                    after_back_edge: false,
                    blocks: vec![cfg.entry],
                    at_back_edge: false,
                };
                let mut pending: Option<i64> = None;
                for _ in 0..300 {
                    let v = *path.blocks.last().unwrap();
                    for op in &o.before_call[v.index()] {
                        let PathOp::Count { k, amount: 1 } = *op else {
                            panic!("{}: before call {op:?}", p.name)
                        };
                        let mut ended = path.clone();
                        ended.blocks.push(exit);
                        assert_eq!(r + k, nb.id_of(&ended).unwrap() as i64, "{}", p.name);
                        pending = Some(r + k);
                        counted += 1;
                    }
                    let out: Vec<_> = cfg.edges.iter().filter(|(_, e)| e.from == v).collect();
                    if out.is_empty() {
                        break;
                    }
                    let (e, ed) = out[rand(out.len())];
                    let back = nb.is_back_edge(e);
                    let mut done = false;
                    for op in &o.edges[e.index()] {
                        match *op {
                            PathOp::Add { inc } => r += inc,
                            PathOp::Count { k, amount: -1 } => {
                                assert_eq!(pending.take(), Some(r + k), "{}: uncount", p.name)
                            }
                            PathOp::Count { k, amount: 1 } => {
                                let mut ended = path.clone();
                                if back {
                                    ended.at_back_edge = true;
                                } else {
                                    ended.blocks.push(exit);
                                }
                                assert_eq!(r + k, nb.id_of(&ended).unwrap() as i64, "{}", p.name);
                                counted += 1;
                            }
                            PathOp::Set { word } => r = word,
                            PathOp::Pop => done = true,
                            other => panic!("{}: {other:?} on an edge", p.name),
                        }
                    }
                    if done || ed.to == exit {
                        assert!(done && !back, "{}: an exit edge pops", p.name);
                        break;
                    }
                    if back {
                        path = Path {
                            after_back_edge: true,
                            blocks: vec![ed.to],
                            at_back_edge: false,
                        };
                    } else {
                        path.blocks.push(ed.to);
                    }
                }
            }
        }
        assert!(
            procs > 150 && counted > 1000,
            "{procs} procedures, {counted} counts"
        );
    }

    #[test]
    fn init_routines_assemble() {
        let (bytes, c) = emit_init(0x10000, 0x20000, 0x10000 - 0x100, true).unwrap();
        assert!(c.init == 0 && c.attach < c.overflow && (c.overflow as usize) < bytes.len());
    }
}
