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
//! callbacks, signal handlers). It lives in memory: a word `R` holding the
//! *address* of the counter `count[first + r]` (so `count[r + k]++` is one
//! `add qword [reg + 8k], 1` after one load, and no code needs two
//! registers), and a shadow stack of the callers' `R`, pushed at the
//! invocation label and popped on every edge to EXIT. Ordering makes every
//! sequence safe against a signal handler running in its middle (the
//! handler pushes and pops its own entry, above the slot in use). `R` and
//! the stack pointer are process-wide words: the rewriter refuses programs
//! that can start threads (no per-thread area exists in counting mode) and
//! programs that can abandon frames (`longjmp`, C++ exceptions), whose
//! shadow stack would no longer match the machine stack. Both refusals name
//! their cause. A recursion deeper than [`DEPTH`] stops the program with a
//! message (exit status 125) instead of overflowing.
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
//! an invocation label (r11 and the flags are dead there, and the stack
//! below `rsp` is free); a procedure's counters are
//! `[first, first + num_paths)`.

use aetrace_graph::paths::{number_paths, PathNumbering};
use aetrace_graph::weights::heuristic;
use aetrace_graph::{BlockId, EdgeId, EntityRef, Graph, GraphBuilder, VertexKind};
use aetrace_runtime::Site;
use iced_x86::code_asm::{eax, edi, edx, rax, rsi, CodeAssembler};
use iced_x86::{Code, Instruction, MemoryOperand, Register};

use crate::cfg::{BlockKind, Cfg, EdgeKind};

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
    Enter { word: i64 },
    /// `r += inc`.
    Add { inc: i64 },
    /// `count[r + k] += amount`.
    Count { k: i64, amount: i8 },
    /// `r` restarts at counter `word` (after a back edge).
    Set { word: i64 },
    /// Back to the caller's `R` (the procedure is left).
    Pop,
    /// Edge-profile fallback: counter `word` += 1.
    Word { word: u32 },
}

/// The path numbering of one procedure.
#[derive(Clone, Debug)]
pub struct ProcPaths {
    /// First counter index.
    pub first: u32,
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
    pub edges: Vec<Vec<PathOp>>,
    pub entry: Vec<PathOp>,
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
    out
}

/// Addresses the path code uses.
#[derive(Copy, Clone, Debug, Default)]
pub struct PathState {
    /// Counter 0.
    pub base: u64,
    /// The state segment (`R`, stack pointer, limit, stack).
    pub state: u64,
    /// The shadow-stack overflow handler.
    pub overflow: u64,
}

type Res<T> = Result<T, String>;

fn err(e: iced_x86::IcedError) -> String {
    e.to_string()
}

fn rip(addr: u64) -> MemoryOperand {
    MemoryOperand::with_base_displ_size(Register::RIP, addr as i64, 8)
}

fn word_addr(st: &PathState, word: i64) -> u64 {
    st.base.wrapping_add_signed(word.wrapping_mul(8))
}

fn disp(k: i64) -> Res<i64> {
    k.checked_mul(8)
        .filter(|d| i32::try_from(*d).is_ok())
        .ok_or_else(|| format!("path increment {k} does not fit a displacement"))
}

/// The instructions of `ops` at a site where `site` holds.
pub fn emit(ops: &[PathOp], st: &PathState, site: Site, atomic: bool) -> Res<Vec<Instruction>> {
    let r_addr = st.state + OFF_R;
    let sp_addr = st.state + OFF_SP;
    match ops {
        [] => return Ok(Vec::new()),
        [PathOp::Word { word }] => {
            return super::counters::increment(st.base + 8 * u64::from(*word), 1, atomic, site)
        }
        [PathOp::Add { inc }] => {
            let d = i32::try_from(disp(*inc)?).expect("checked");
            return super::counters::increment(r_addr, d, false, site);
        }
        [PathOp::Enter { word }] => {
            // At the invocation label: r11 and the flags are dead, the
            // stack below rsp is free.
            let r11 = Register::R11;
            let mem11 = MemoryOperand::with_base_displ_size(r11, 0, 8);
            return Ok(vec![
                Instruction::with2(Code::Mov_r64_rm64, r11, rip(sp_addr)).map_err(err)?,
                Instruction::with2(Code::Lea_r64_m, r11, MemoryOperand::with_base_displ(r11, 8))
                    .map_err(err)?,
                Instruction::with2(Code::Cmp_r64_rm64, r11, rip(st.state + OFF_LIMIT))
                    .map_err(err)?,
                Instruction::with_branch(Code::Jae_rel32_64, st.overflow).map_err(err)?,
                Instruction::with2(Code::Mov_rm64_r64, rip(sp_addr), r11).map_err(err)?,
                Instruction::with1(Code::Push_rm64, rip(r_addr)).map_err(err)?,
                Instruction::with1(Code::Pop_rm64, mem11).map_err(err)?,
                Instruction::with2(
                    Code::Lea_r64_m,
                    r11,
                    MemoryOperand::with_base_displ(Register::RIP, word_addr(st, *word) as i64),
                )
                .map_err(err)?,
                Instruction::with2(Code::Mov_rm64_r64, rip(r_addr), r11).map_err(err)?,
            ]);
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
    let rsp_by = |d: i64| {
        Instruction::with2(
            Code::Lea_r64_m,
            Register::RSP,
            MemoryOperand::with_base_displ(Register::RSP, d),
        )
        .map_err(err)
    };
    let mut v = Vec::new();
    if step {
        v.push(rsp_by(-128)?);
    }
    if save_flags {
        v.push(Instruction::with(Code::Pushfq));
    }
    if push_reg {
        v.push(Instruction::with1(Code::Push_r64, reg).map_err(err)?);
    }
    let at_reg = |d: i64| MemoryOperand::with_base_displ_size(reg, d, 8);
    for op in ops {
        match *op {
            PathOp::Add { inc } => {
                let d = disp(inc)?;
                let code = if i8::try_from(d).is_ok() {
                    Code::Add_rm64_imm8
                } else {
                    Code::Add_rm64_imm32
                };
                v.push(Instruction::with2(code, rip(r_addr), d as i32).map_err(err)?);
            }
            PathOp::Count { k, amount } => {
                v.push(Instruction::with2(Code::Mov_r64_rm64, reg, rip(r_addr)).map_err(err)?);
                v.push(
                    Instruction::with2(Code::Add_rm64_imm8, at_reg(disp(k)?), i32::from(amount))
                        .map_err(err)?,
                );
            }
            PathOp::Set { word } => {
                v.push(
                    Instruction::with2(
                        Code::Lea_r64_m,
                        reg,
                        MemoryOperand::with_base_displ(Register::RIP, word_addr(st, word) as i64),
                    )
                    .map_err(err)?,
                );
                v.push(Instruction::with2(Code::Mov_rm64_r64, rip(r_addr), reg).map_err(err)?);
            }
            PathOp::Pop => {
                // Read the caller's R before releasing its slot: a signal
                // handler may push into the slot once it is released.
                for i in [
                    Instruction::with2(Code::Mov_r64_rm64, reg, rip(sp_addr)),
                    Instruction::with2(Code::Mov_r64_rm64, reg, at_reg(0)),
                    Instruction::with2(Code::Mov_rm64_r64, rip(r_addr), reg),
                    Instruction::with2(Code::Mov_r64_rm64, reg, rip(sp_addr)),
                    Instruction::with2(
                        Code::Lea_r64_m,
                        reg,
                        MemoryOperand::with_base_displ(reg, -8),
                    ),
                    Instruction::with2(Code::Mov_rm64_r64, rip(sp_addr), reg),
                ] {
                    v.push(i.map_err(err)?);
                }
            }
            PathOp::Word { word } => {
                v.push(
                    Instruction::with2(Code::Add_rm64_imm8, rip(st.base + 8 * u64::from(word)), 1)
                        .map_err(err)?,
                );
            }
            PathOp::Enter { .. } => {
                return Err("internal: a path entry outside an invocation label".into())
            }
        }
    }
    if push_reg {
        v.push(Instruction::with1(Code::Pop_r64, reg).map_err(err)?);
    }
    if save_flags {
        v.push(Instruction::with(Code::Popfq));
    }
    if step {
        v.push(rsp_by(128)?);
    }
    Ok(v)
}

/// The state initialiser and the overflow handler, assembled at `rip`:
/// `(bytes, offset of the initialiser, offset of the handler)`. The
/// initialiser sets the shadow stack pointer and limit, then jumps to
/// `next` (the counters' preinit entry, which returns to ld.so).
pub fn emit_init(rip: u64, state: u64, next: u64) -> Res<(Vec<u8>, u64, u64)> {
    let delta = |to: u64| -> Res<i32> {
        i32::try_from(to as i64 - rip as i64).map_err(|_| "path state out of reach".to_string())
    };
    let (d_sp, d_limit, d_stack, d_end) = (
        delta(state + OFF_SP)?,
        delta(state + OFF_LIMIT)?,
        delta(state + OFF_STACK)?,
        delta(state + OFF_STACK + 8 * DEPTH)?,
    );
    let text = format!(
        "aetrace paths: more than {DEPTH} active procedure calls (path register stack overflow)\n"
    );
    let asm = || -> Result<(Vec<u8>, u64), iced_x86::IcedError> {
        use iced_x86::code_asm::{ptr, qword_ptr, rdi};
        use iced_x86::BlockEncoderOptions;
        let mut a = CodeAssembler::new(64)?;
        let mut start = a.create_label();
        let mut handler = a.create_label();
        let mut message = a.create_label();
        a.set_label(&mut start)?;
        // Only rax is clobbered: preinit gets (argc, argv, envp) in rdi,
        // rsi, rdx and passes them on to `next`.
        a.push(rdi)?;
        a.lea(rax, ptr(start))?;
        a.add(rax, d_stack)?;
        a.lea(rdi, ptr(start))?;
        a.add(rdi, d_sp)?;
        a.mov(qword_ptr(rdi), rax)?;
        a.lea(rax, ptr(start))?;
        a.add(rax, d_end)?;
        a.lea(rdi, ptr(start))?;
        a.add(rdi, d_limit)?;
        a.mov(qword_ptr(rdi), rax)?;
        a.pop(rdi)?;
        a.jmp(next)?;
        a.set_label(&mut handler)?;
        a.mov(eax, 1)?;
        a.mov(edi, 2)?;
        a.lea(rsi, ptr(message))?;
        a.mov(edx, text.len() as u32)?;
        a.syscall()?;
        a.mov(eax, 231)?;
        a.mov(edi, 125)?;
        a.syscall()?;
        a.set_label(&mut message)?;
        a.db(text.as_bytes())?;
        let res = a.assemble_options(rip, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
        let at = res.label_ip(&handler)?;
        Ok((res.inner.code_buffer, at - rip))
    };
    let (bytes, handler) = asm().map_err(err)?;
    Ok((bytes, 0, handler))
}
