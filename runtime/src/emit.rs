//! Emitters for the inline instrumentation the rewriter places in
//! relocated code: witness writes, escape records, buffer checks and the
//! outside-entry stub (paper 003 section 4: a witness is written when an
//! instrumented edge is traversed).
//!
//! Invariants of every emitted sequence:
//! - All registers and, when [`Site::flags_live`], all arithmetic flags are
//!   preserved; only the dead [`Site::scratch`] register may be clobbered.
//! - The slot is reserved with ONE instruction (`xadd gs:[POS], r`, atomic
//!   with respect to signals on the same thread) before anything is written,
//!   so a signal handler that interrupts the sequence and writes its own
//!   witnesses never shares a byte with it.
//! - Multi-byte records write their kind byte last; until then it reads as
//!   `KIND_PENDING`, which the drainer treats as the end of valid data.
//! - Stack use below `rsp` steps over the 128-byte red zone first when
//!   [`Site::red_zone_live`].

use iced_x86::code_asm::*;
use iced_x86::{Code, Instruction, MemoryOperand, Register};

use crate::layout::{RecordKind, ESCAPE, KIND_PENDING, S_LIMIT, S_ONCE, S_OWNER, S_POS, S_XFERS};
use crate::{Blob, Error};

/// How live arithmetic flags are saved around a sequence that clobbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagsSave {
    /// `lahf; seto al` ... `add al,0x7f; sahf` (needs `rax`).
    Lahf,
    /// `pushfq` ... `popfq`.
    Pushf,
}

/// What the rewriter knows at an instrumentation point (from liveness).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Site {
    /// A general register dead here, free to clobber.
    pub scratch: Option<AsmRegister64>,
    /// Arithmetic flags are live here and must be preserved.
    pub flags_live: bool,
    /// The 128 bytes below `rsp` may hold live data (a leaf using the red zone).
    pub red_zone_live: bool,
    /// How to save live flags (see `docs/runtime.md` for the measurement).
    pub flags_save: FlagsSave,
}

impl Site {
    /// The conservative site: no dead register, flags live, red zone live.
    pub const CONSERVATIVE: Site = Site {
        scratch: None,
        flags_live: true,
        red_zone_live: true,
        flags_save: FlagsSave::Lahf,
    };

    /// A site with a dead register and dead flags: the cheapest sequence.
    pub const fn with_scratch(r: AsmRegister64) -> Site {
        Site {
            scratch: Some(r),
            flags_live: false,
            red_zone_live: true,
            flags_save: FlagsSave::Lahf,
        }
    }
}

/// A record payload known to the rewriter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// The record kind has no payload.
    None,
    /// An immediate (procedure number, exit status known statically, ...).
    Imm32(u32),
    /// A 16-bit immediate (wide witness).
    Imm16(u16),
    /// The low 32 bits of a register (e.g. `edi`, the signal number).
    Reg32(AsmRegister32),
    /// A 64-bit register (indirect target, desync address).
    Reg64(AsmRegister64),
    /// Two immediates, in this order (procedure number and entry address).
    Imm32Pair(u32, u32),
    /// An immediate, a 64-bit register, an immediate, in this order
    /// (SETJMP_RESUME: procedure number, `rsp`, block).
    Around(u32, AsmRegister64, u32),
}

const RED_ZONE: i32 = 128;

/// The registers a sequence borrows and how it restores them.
struct Frame {
    reg: AsmRegister64,
    pushed: Vec<AsmRegister64>,
    flags: Option<FlagsSave>,
    stepped_red_zone: bool,
}

fn same(a: AsmRegister64, b: AsmRegister64) -> bool {
    a == b
}

fn pick_free(avoid: &[AsmRegister64]) -> AsmRegister64 {
    // Low registers first: shorter encodings (no REX.B).
    [rax, rcx, rdx, rsi, rdi, r8, r9, r10, r11]
        .into_iter()
        .find(|r| !avoid.iter().any(|x| same(*x, *r)))
        .expect("at most 3 registers are ever avoided")
}

/// Saves what the sequence needs; `avoid` lists registers the body reads
/// (payload registers) that must not be borrowed.
fn begin(
    a: &mut CodeAssembler,
    site: &Site,
    clobbers_flags: bool,
    avoid: &[AsmRegister64],
) -> Result<Frame, Error> {
    // `lahf; seto al` writes rax: with a payload in rax the flags are
    // pushed (live before a load into rax more often since an access that
    // may fault keeps its outputs live, rewrite's `liveness`).
    let save = match site.flags_save {
        FlagsSave::Lahf if avoid.iter().any(|x| same(*x, rax)) => FlagsSave::Pushf,
        s => s,
    };
    let flags = (clobbers_flags && site.flags_live).then_some(save);
    if site.scratch == Some(rsp) {
        return Err(Error::Emit("rsp cannot be a scratch register".into()));
    }
    // rbp/r12/r13 as base registers need other store encodings, which the
    // signal-entry fix-up does not recognise: borrow another register.
    let scratch = site
        .scratch
        .filter(|s| ![rbp, r12, r13].contains(s) && !avoid.iter().any(|x| same(*x, *s)));
    let mut pushed = Vec::new();
    let reg = match (flags, scratch) {
        (Some(FlagsSave::Lahf), Some(s)) if same(s, rax) => {
            let r = pick_free(&[&[rax][..], avoid].concat());
            pushed.push(r);
            r
        }
        (Some(FlagsSave::Lahf), Some(s)) => {
            pushed.push(rax);
            s
        }
        (Some(FlagsSave::Lahf), None) => {
            let r = pick_free(&[&[rax][..], avoid].concat());
            pushed.push(rax);
            pushed.push(r);
            r
        }
        (_, Some(s)) => s,
        (_, None) => {
            let r = pick_free(avoid);
            pushed.push(r);
            r
        }
    };
    let uses_stack = !pushed.is_empty() || flags == Some(FlagsSave::Pushf);
    let stepped_red_zone = uses_stack && site.red_zone_live;
    if stepped_red_zone {
        a.lea(rsp, ptr(rsp - RED_ZONE))?;
    }
    if flags == Some(FlagsSave::Pushf) {
        a.pushfq()?;
    }
    for r in &pushed {
        a.push(*r)?;
    }
    if flags == Some(FlagsSave::Lahf) {
        a.lahf()?;
        a.seto(al)?;
    }
    Ok(Frame {
        reg,
        pushed,
        flags,
        stepped_red_zone,
    })
}

fn end(a: &mut CodeAssembler, f: Frame) -> Result<(), Error> {
    if f.flags == Some(FlagsSave::Lahf) {
        a.add(al, 0x7f)?;
        a.sahf()?;
    }
    for r in f.pushed.iter().rev() {
        a.pop(*r)?;
    }
    if f.flags == Some(FlagsSave::Pushf) {
        a.popfq()?;
    }
    if f.stepped_red_zone {
        a.lea(rsp, ptr(rsp + RED_ZONE))?;
    }
    Ok(())
}

/// `gs:[off]` as an absolute (SIB, no base) operand.
fn gs_q(off: u64) -> AsmMemoryOperand {
    qword_ptr(off).gs()
}

/// Reserves `len` bytes: afterwards `r` holds the address of the first.
fn reserve(a: &mut CodeAssembler, r: AsmRegister64, len: u64) -> Result<(), Error> {
    a.mov(gpr32_of(r), len as u32)?;
    a.xadd(gs_q(S_POS), r)?;
    Ok(())
}

fn gpr32_of(r: AsmRegister64) -> AsmRegister32 {
    let all64 = [
        rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, r8, r9, r10, r11, r12, r13, r14, r15,
    ];
    let all32 = [
        eax, ecx, edx, ebx, esp, ebp, esi, edi, r8d, r9d, r10d, r11d, r12d, r13d, r14d, r15d,
    ];
    let i = all64
        .iter()
        .position(|x| same(*x, r))
        .expect("a general register");
    all32[i]
}

/// Emits one witness write of `byte` (1..=0xFE).
pub fn emit_witness(a: &mut CodeAssembler, byte: u8, site: Site) -> Result<(), Error> {
    check_witness_byte(byte)?;
    let f = begin(a, &site, true, &[])?;
    reserve(a, f.reg, 1)?;
    a.mov(byte_ptr(f.reg), byte as u32)?;
    end(a, f)
}

/// Emits a witness write of `byte` followed by a buffer check that reuses
/// the reserved address (`flush` when it is at or above `LIMIT`), then a
/// jump to `then`. Stands for a witnessed edge into a block whose check it
/// replaces (a loop's back edge; `then` is past that check): the check
/// needs no load of `POS`, which right after the `xadd` waits for its store
/// (docs/runtime.md section 3), and with nothing to restore the check's
/// branch goes to `then` itself. The address is the old `POS`, so the
/// check lets `POS` reach `LIMIT` itself, one byte past a separate check;
/// the witness byte is counted on the path before it (section 4), and the
/// headroom is not used up by one byte.
pub fn emit_witness_checked(
    a: &mut CodeAssembler,
    byte: u8,
    flush: u64,
    site: Site,
    then: u64,
) -> Result<(), Error> {
    check_witness_byte(byte)?;
    let f = begin(a, &site, true, &[])?;
    reserve(a, f.reg, 1)?;
    a.mov(byte_ptr(f.reg), byte as u32)?;
    if f.flags.is_none() && f.pushed.is_empty() && !f.stepped_red_zone {
        a.cmp(f.reg, gs_q(S_LIMIT))?;
        a.jb(then)?;
        call_flush(a, flush, site.red_zone_live)?;
    } else {
        flush_unless_below_limit(a, flush, site, f)?;
    }
    a.jmp(then)?;
    Ok(())
}

fn check_witness_byte(byte: u8) -> Result<(), Error> {
    if byte == 0 || byte == ESCAPE {
        return Err(Error::Emit(format!(
            "witness byte {byte:#04x} is reserved (0x00 = unwritten, 0xFF = escape)"
        )));
    }
    Ok(())
}

/// Emits one escape record of `kind` with `payload` (which must match the
/// kind's payload length). Payload registers must not be `rsp`.
pub fn emit_record(
    a: &mut CodeAssembler,
    kind: RecordKind,
    payload: Payload,
    site: Site,
) -> Result<(), Error> {
    let plen = match payload {
        Payload::None => 0,
        Payload::Imm16(_) => 2,
        Payload::Imm32(_) | Payload::Reg32(_) => 4,
        Payload::Reg64(_) | Payload::Imm32Pair(..) => 8,
        Payload::Around(..) => 16,
    };
    if plen != kind.payload_len() {
        return Err(Error::Emit(format!(
            "{kind:?} takes a {}-byte payload, got {payload:?}",
            kind.payload_len()
        )));
    }
    let avoid: Vec<AsmRegister64> = match payload {
        Payload::Reg64(r) | Payload::Around(_, r, _) => vec![r],
        Payload::Reg32(r) => vec![gpr64_of(r)],
        _ => vec![],
    };
    if avoid.iter().any(|r| same(*r, rsp)) {
        return Err(Error::Emit("record payload cannot be rsp".into()));
    }
    let f = begin(a, &site, true, &avoid)?;
    if f.pushed.iter().any(|p| avoid.iter().any(|x| same(*x, *p))) {
        return Err(Error::Emit(format!(
            "payload register of {kind:?} is needed by the sequence"
        )));
    }
    let r = f.reg;
    reserve(a, r, kind.encoded_len())?;
    let k = kind as u8 as u32;
    if plen == 0 {
        a.mov(word_ptr(r), ESCAPE as u32 | k << 8)?;
    } else {
        a.mov(word_ptr(r), ESCAPE as u32 | (k | KIND_PENDING as u32) << 8)?;
        match payload {
            Payload::None => unreachable!("plen == 0 handled above"),
            Payload::Imm16(v) => a.mov(word_ptr(r + 2), v as u32)?,
            Payload::Imm32(v) => a.mov(dword_ptr(r + 2), v)?,
            Payload::Reg32(v) => a.mov(dword_ptr(r + 2), v)?,
            Payload::Reg64(v) => a.mov(qword_ptr(r + 2), v)?,
            Payload::Imm32Pair(v, w) => {
                a.mov(dword_ptr(r + 2), v)?;
                a.mov(dword_ptr(r + 6), w)?
            }
            Payload::Around(v, x, w) => {
                a.mov(dword_ptr(r + 2), v)?;
                a.mov(qword_ptr(r + 6), x)?;
                a.mov(dword_ptr(r + 14), w)?
            }
        }
        a.mov(byte_ptr(r + 1), k)?;
    }
    end(a, f)
}

/// An effective address as the instruction computes it: `fs base (when
/// `fs`) + base + index * scale + disp`, wrapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrOperand {
    /// `fs:`-relative (the thread pointer is `fs:[0]`, the x86-64 TLS ABI).
    pub fs: bool,
    /// The base register, if any.
    pub base: Option<AsmRegister64>,
    /// The index register and its scale (1, 2, 4, 8), if any.
    pub index: Option<(AsmRegister64, u32)>,
    /// The displacement.
    pub disp: i64,
}

/// A value `record --data --check` writes in a VALUE record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// An effective address, as the instruction that follows sees it.
    Addr(AddrOperand),
    /// A register's 64 bits.
    Reg(AsmRegister64),
    /// `rflags` (a string instruction's direction flag).
    Flags,
    /// `rax`, thread constant `k` (`analysis::addr::returns::
    /// THREAD_CONSTANTS`): recorded only while bit `k` of the slot's
    /// [`S_ONCE`] word is clear, which the record then sets.
    Once(u8),
}

/// Bytes the VALUE sequence moves `rsp` down before it reads an
/// rsp-relative value: the red zone and the borrowed register.
const VALUE_SHIFT: i64 = RED_ZONE as i64 + 8;

/// Emits one VALUE record of `value`, taken in the state before the
/// sequence (an rsp-relative address is the one the next instruction
/// sees). A register other than `rsp` (or an address that is one) is
/// stored from itself by [`emit_record`]'s sequence; any other value is
/// computed into a borrowed register `v` first (saved below the red
/// zone).
pub fn emit_value(a: &mut CodeAssembler, value: Value, site: Site) -> Result<(), Error> {
    if let Value::Once(k) = value {
        return emit_once(a, k, site);
    }
    match in_register(value) {
        Some(r) => emit_record(a, RecordKind::Value, Payload::Reg64(r), site),
        None => emit_computed(a, RecordKind::Value, value, site, Payload::Reg64),
    }
}

/// The register other than `rsp` whose 64 bits are `value`, if any: a
/// register, or an address that is its base alone.
fn in_register(value: Value) -> Option<AsmRegister64> {
    let r = match value {
        Value::Reg(r) => r,
        Value::Addr(AddrOperand {
            fs: false,
            base: Some(b),
            index: None,
            disp: 0,
        }) => b,
        Value::Addr(_) | Value::Flags | Value::Once(_) => return None,
    };
    (!same(r, rsp)).then_some(r)
}

/// [`Value::Once`]: `test byte gs:[ONCE], 1 << k; jnz done`, a VALUE
/// record of `rax`, `or byte gs:[ONCE], 1 << k`. Not atomic with respect
/// to a signal, and need not be: a handler starts with the word clear and
/// returns to it as it was (`signal_entry`, `sigreturn`), so the
/// interrupted sequence records exactly when it would have without the
/// handler, and the regenerator runs the handler with no constant known.
fn emit_once(a: &mut CodeAssembler, k: u8, site: Site) -> Result<(), Error> {
    if u32::from(k) >= 8 {
        return Err(Error::Emit(format!(
            "thread constant {k}: 8 fit the ONCE byte"
        )));
    }
    let bit = 1u32 << k;
    let save = site.flags_live;
    if save {
        a.lea(rsp, ptr(rsp - RED_ZONE))?;
        a.pushfq()?;
    }
    let mut done = a.create_label();
    a.test(byte_ptr(S_ONCE).gs(), bit)?;
    a.jnz(done)?;
    let inner = Site {
        flags_live: false,
        red_zone_live: site.red_zone_live && !save,
        ..site
    };
    emit_record(a, RecordKind::Value, Payload::Reg64(rax), inner)?;
    a.or(byte_ptr(S_ONCE).gs(), bit)?;
    a.set_label(&mut done)?;
    if save {
        a.popfq()?;
        a.lea(rsp, ptr(rsp + RED_ZONE))?;
    } else {
        a.nop()?;
    }
    Ok(())
}

/// Emits a record of `kind` whose payload holds `rsp` as the code before
/// the sequence sees it: SETJMP(rsp) with `around` none, SETJMP_RESUME
/// (procedure, rsp, block) with `around` the two immediates. Computed as
/// [`emit_value`]'s values are.
pub fn emit_rsp_record(
    a: &mut CodeAssembler,
    kind: RecordKind,
    around: Option<(u32, u32)>,
    site: Site,
) -> Result<(), Error> {
    let payload = |v| match around {
        Some((p, b)) => Payload::Around(p, v, b),
        None => Payload::Reg64(v),
    };
    emit_computed(a, kind, Value::Reg(rsp), site, payload)
}

/// A record of `kind` whose payload `payload(v)` holds `value`, computed
/// into a borrowed register `v` saved below the red zone.
fn emit_computed(
    a: &mut CodeAssembler,
    kind: RecordKind,
    value: Value,
    site: Site,
    payload: impl Fn(AsmRegister64) -> Payload,
) -> Result<(), Error> {
    if let Value::Once(k) = value {
        return Err(Error::Emit(format!(
            "thread constant {k}: recorded by `emit_value` alone"
        )));
    }
    let v = pick_free(&[&[rax][..], site.scratch.as_slice()].concat());
    a.lea(rsp, ptr(rsp - RED_ZONE))?;
    a.push(v)?;
    match value {
        Value::Addr(o) => load_address(a, v, o)?,
        Value::Reg(r) if same(r, rsp) => a.lea(v, ptr(rsp + VALUE_SHIFT as i32))?,
        Value::Reg(r) => {
            if !same(r, v) {
                a.mov(v, r)?;
            }
        }
        Value::Flags => {
            a.pushfq()?;
            a.pop(v)?;
        }
        Value::Once(_) => {}
    }
    let inner = Site {
        scratch: site.scratch.filter(|s| !same(*s, v)),
        red_zone_live: false,
        ..site
    };
    emit_record(a, kind, payload(v), inner)?;
    a.pop(v)?;
    a.lea(rsp, ptr(rsp + RED_ZONE))?;
    Ok(())
}

/// `v = o`, flags preserved; `v` was pushed (its old value is on the stack).
fn load_address(a: &mut CodeAssembler, v: AsmRegister64, o: AddrOperand) -> Result<(), Error> {
    let disp = match o.base {
        Some(b) if same(b, rsp) => o.disp.wrapping_add(VALUE_SHIFT),
        _ => o.disp,
    };
    if o.index.is_some_and(|(i, _)| same(i, rsp)) {
        return Err(Error::Emit("rsp cannot be an index".into()));
    }
    if o.fs && o.base.is_none() && o.index.is_none() {
        a.mov(v, qword_ptr(0).fs())?;
        return add_disp(a, v, disp);
    }
    if o.base.is_none() && o.index.is_none() {
        a.mov(v, disp as u64)?;
    } else {
        let d = i32::try_from(disp)
            .map_err(|_| Error::Emit(format!("displacement {disp:#x} does not fit 32 bits")))?;
        let m = match (o.base, o.index) {
            (Some(b), Some((i, s))) => ptr(b + i * s + d),
            (Some(b), None) => ptr(b + d),
            (None, Some((i, s))) => ptr(i * s + d),
            (None, None) => unreachable!("handled above"),
        };
        a.lea(v, m)?;
    }
    if o.fs {
        a.pushfq()?;
        a.add(v, qword_ptr(0).fs())?;
        a.popfq()?;
    }
    Ok(())
}

/// `v += disp` without touching the flags.
fn add_disp(a: &mut CodeAssembler, v: AsmRegister64, disp: i64) -> Result<(), Error> {
    match i32::try_from(disp) {
        Ok(d) => a.lea(v, ptr(v + d)).map_err(Error::from),
        Err(_) => Err(Error::Emit(format!(
            "displacement {disp:#x} does not fit 32 bits"
        ))),
    }
}

fn gpr64_of(r: AsmRegister32) -> AsmRegister64 {
    let all64 = [
        rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, r8, r9, r10, r11, r12, r13, r14, r15,
    ];
    let all32 = [
        eax, ecx, edx, ebx, esp, ebp, esi, edi, r8d, r9d, r10d, r11d, r12d, r13d, r14d, r15d,
    ];
    let i = all32
        .iter()
        .position(|x| *x == r)
        .expect("a general register");
    all64[i]
}

/// The bytes of `inc dword gs:[XFERS]` ([`emit_transfer`]), which
/// `signal_entry` recognises in the instrumented code.
pub const TRANSFER_INC: [u8; 8] = [0x65, 0xFF, 0x04, 0x25, S_XFERS as u8, 0, 0, 0];

/// Emits the transfer count's increment (`inc dword gs:[XFERS]`, one
/// instruction where the flags are dead, as at every call and at a jump to
/// another function's entry), placed just before a counted transfer (see
/// `docs/runtime.md` section 2, "The transfer count"). It is one
/// instruction, so a signal sees it done or not; the rewriter gives it the
/// signal-map point of the transfer it precedes. Live flags are saved as
/// the site says: with `lahf; seto al` (rax pushed unless it is the dead
/// scratch) or `pushfq`, below the red zone when it is live and the stack
/// is used. `popfq` is microcoded: on sort's comparison calls, whose flags
/// a `-fipa-ra` caller may keep, it was the copy's hottest instruction.
///
/// The increment is [`TRANSFER_INC`]: `signal_entry` undoes one it finds
/// right before an interrupted rip (docs/runtime.md section 5); what
/// follows it (`add al, 0x7f`, `popfq`) never ends with those bytes.
pub fn emit_transfer(a: &mut CodeAssembler, site: Site) -> Result<(), Error> {
    let inc = |a: &mut CodeAssembler| a.inc(dword_ptr(S_XFERS).gs());
    if !site.flags_live {
        inc(a)?;
        return Ok(());
    }
    let lahf = site.flags_save == FlagsSave::Lahf;
    let push_rax = lahf && site.scratch != Some(rax);
    let step = site.red_zone_live && (push_rax || !lahf);
    if step {
        a.lea(rsp, ptr(rsp - RED_ZONE))?;
    }
    if !lahf {
        a.pushfq()?;
        inc(a)?;
        a.popfq()?;
    } else {
        if push_rax {
            a.push(rax)?;
        }
        a.lahf()?;
        a.seto(al)?;
        inc(a)?;
        a.add(al, 0x7f)?;
        a.sahf()?;
        if push_rax {
            a.pop(rax)?;
        }
    }
    if step {
        a.lea(rsp, ptr(rsp + RED_ZONE))?;
    }
    Ok(())
}

/// Emits the buffer check placed at procedure entries, loop headers and
/// call return points: when `POS >= LIMIT`, call the runtime's `flush`
/// (absolute address `flush`; it preserves every register and the flags).
pub fn emit_buffer_check(a: &mut CodeAssembler, flush: u64, site: Site) -> Result<(), Error> {
    let f = begin(a, &site, true, &[])?;
    a.mov(f.reg, gs_q(S_POS))?;
    flush_unless_below_limit(a, flush, site, f)
}

/// The end of a buffer check: `flush` unless `f.reg` is below `LIMIT`, then
/// what `f` borrowed restored.
fn flush_unless_below_limit(
    a: &mut CodeAssembler,
    flush: u64,
    site: Site,
    f: Frame,
) -> Result<(), Error> {
    let mut done = a.create_label();
    a.cmp(f.reg, gs_q(S_LIMIT))?;
    a.jb(done)?;
    call_flush(a, flush, site.red_zone_live && !f.stepped_red_zone)?;
    a.set_label(&mut done)?;
    end_with_label_target(a, f)
}

/// `call flush`, stepping over the red zone first when `step` (`call`
/// pushes below rsp).
fn call_flush(a: &mut CodeAssembler, flush: u64, step: bool) -> Result<(), Error> {
    if step {
        a.lea(rsp, ptr(rsp - RED_ZONE))?;
    }
    a.call(flush)?;
    if step {
        a.lea(rsp, ptr(rsp + RED_ZONE))?;
    }
    Ok(())
}

/// `end` after a label: a label needs an instruction to attach to.
fn end_with_label_target(a: &mut CodeAssembler, f: Frame) -> Result<(), Error> {
    if f.flags.is_none() && f.pushed.is_empty() && !f.stepped_red_zone {
        a.nop()?;
        Ok(())
    } else {
        end(a, f)
    }
}

/// Absolute addresses of the runtime's entry points and words once the
/// blob is placed at `base`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeAddrs {
    /// Address of `init`: creates or attaches to the region and claims the main thread's slot.
    pub init: u64,
    /// Address of the `ready` word: 1 once `init` has run (outside-entry stubs check it).
    pub ready: u64,
    /// Address of `attach_thread`: claims a slot for a thread that owns none.
    pub attach: u64,
    /// Address of `flush`: seals the current half when a buffer check finds it full.
    pub flush: u64,
    /// Address of `fork_child`: claims the child's slot after a fork, with its FORK record.
    pub fork_child: u64,
    /// Address of `fork_prepare`, called before a call to `fork`.
    pub fork_prepare: u64,
    /// Address of `fork_done`, called at the fork's return point.
    pub fork_done: u64,
    /// Address of `exec_request`, called before an exec (r11 = the
    /// [`crate::layout::ExecKind`]).
    pub exec_request: u64,
    /// Address of `shell_call`, called before a call of an untraced
    /// libc's `system` (r11 = the [`crate::layout::ShellCall`] and its
    /// bits); r11 = 0 when it made the call.
    pub shell_call: u64,
    /// Address of `dispositions_native`, called before a call that may
    /// read or set a signal's disposition (`sigaction`, `signal`, ...).
    pub dispositions_native: u64,
    /// Address of `dispositions_ours`, called at that call's return point.
    pub dispositions_ours: u64,
    /// Address of `maps_opened_fd`, called at the return point of a call
    /// that opens a file by name and returns its descriptor (`open`, ...).
    pub maps_opened_fd: u64,
    /// Address of `maps_opened_file`, the same for a `FILE *` (`fopen`, ...).
    pub maps_opened_file: u64,
    /// Address of `maps_read`, called before `read`.
    pub maps_read: u64,
    /// Address of `exe_path`, called before a call that reads a link or
    /// resolves a path (`readlink`, `realpath`, ...; r11 = 0: the path is
    /// in rdi, 1: in rsi).
    pub exe_path: u64,
    /// Address of `signal_entry`: the fix-up and SIGNAL record at a signal handler's entry.
    pub signal_entry: u64,
    /// Address of the signal restorer's bytes the stubs compare a handler's return address with.
    pub restorer_bytes: u64,
    /// Address of `sigreturn`, the restorer a traced handler returns
    /// through (SIGRETURN, then `rt_sigreturn`; its unwind entry starts a
    /// byte before it).
    pub sigreturn: u64,
    /// The end of `sigreturn`'s prologue, up to which its rsp is the
    /// kernel's ucontext.
    pub sigreturn_blocked: u64,
}

impl RuntimeAddrs {
    /// The addresses of `blob`'s symbols when its first byte is at `base`.
    pub fn new(blob: &Blob, base: u64) -> RuntimeAddrs {
        let at = |name| {
            base + blob
                .symbol(name)
                .expect("the blob defines every runtime symbol")
        };
        RuntimeAddrs {
            init: at("init"),
            ready: at("ready"),
            attach: at("attach_thread"),
            flush: at("flush"),
            fork_child: at("fork_child"),
            fork_prepare: at("fork_prepare"),
            fork_done: at("fork_done"),
            exec_request: at("exec_request"),
            shell_call: at("shell_call"),
            dispositions_native: at("dispositions_native"),
            dispositions_ours: at("dispositions_ours"),
            maps_opened_fd: at("maps_opened_fd"),
            maps_opened_file: at("maps_opened_file"),
            maps_read: at("maps_read"),
            exe_path: at("exe_path"),
            signal_entry: at("signal_entry"),
            restorer_bytes: at("restorer_bytes"),
            sigreturn: at("sigreturn"),
            sigreturn_blocked: at("sigreturn_blocked"),
        }
    }
}

fn rip_rel(addr: u64) -> MemoryOperand {
    MemoryOperand::with_base_displ_size(Register::RIP, addr as i64, 8)
}

/// Offsets, from the stub's start, of the instructions of
/// [`emit_outside_entry`] up to and including its `call signal_entry`
/// (the last): `cmp [rip+ready], 1`, `jne`, `mov r11, fs:[0]`, `cmp r11,
/// gs:[OWNER]`, `je`, `call attach_thread`, `lea r11, [rsp+8]`, `cmp r11,
/// rdx`, `jne`, `mov r11, [rsp]`, `mov r11, [r11]`, `cmp r11,
/// [rip+restorer]`, `jne`, `call signal_entry`. None of
/// them moves rsp, so a signal handler's stub has the kernel's frame at
/// `[rsp]` all along. `signal_entry` recognises a second signal at any of
/// them (before the first handler's SIGNAL is written) by these offsets;
/// `tests::outside_entry_layout` checks them against the emitter.
pub const STUB_INSNS: [u32; 14] = [0, 7, 9, 18, 27, 29, 34, 39, 42, 44, 48, 51, 58, 60];

/// Emits the outside-entry stub placed at the head of every procedure copy
/// reached from untraced code (its springboard target): make sure this
/// thread owns a slot; at a signal handler's entry let the runtime complete
/// an interrupted witness store and write `SIGNAL`; check the buffer; then
/// record `ENTER(proc)`.
///
/// Runs at a procedure entry, so (SysV ABI) flags are dead, the red zone
/// holds nothing and `r11` is dead. The runtime's words are reached
/// RIP-relatively (within 2 GiB of the stub).
pub fn emit_outside_entry(
    a: &mut CodeAssembler,
    proc_id: u32,
    rt: &RuntimeAddrs,
) -> Result<(), Error> {
    emit_outside_entry_with(a, proc_id, rt, r11)
}

/// The registers [`emit_outside_entry_with`] may clobber: each encodes
/// the stub's instructions in the same lengths ([`STUB_INSNS`]; not rsp,
/// rbp, r12 or r13, whose bases take a SIB or displacement byte, nor rax,
/// whose `mov rax, fs:[0]` takes the longer moffs form), and none is rdx,
/// which the stub compares with. r11 first: dead at every entry the SysV
/// ABI governs.
pub const ENTRY_SCRATCH: [AsmRegister64; 10] = [r11, rcx, rsi, rdi, r8, r9, r10, rbx, r14, r15];

/// [`emit_outside_entry`] clobbering `scratch` (one of [`ENTRY_SCRATCH`])
/// instead of r11: gcc's `-fipa-ra` lets a caller in the same module keep
/// values across a direct call in any register the callee never writes,
/// r11 included, and such a caller may be untraced code entering through
/// the springboard. The flags must be dead at the entry.
pub fn emit_outside_entry_with(
    a: &mut CodeAssembler,
    proc_id: u32,
    rt: &RuntimeAddrs,
    scratch: AsmRegister64,
) -> Result<(), Error> {
    outside_entry(a, Payload::Imm32(proc_id), rt, scratch)
}

/// [`emit_outside_entry_with`] at a secondary entry point of a procedure
/// with several, link-time address `entry`: records `ENTER_AT(proc,
/// entry)` instead of `ENTER(proc)`. The same instructions up to the
/// record ([`STUB_INSNS`]).
pub fn emit_outside_entry_at(
    a: &mut CodeAssembler,
    proc_id: u32,
    entry: u32,
    rt: &RuntimeAddrs,
    scratch: AsmRegister64,
) -> Result<(), Error> {
    outside_entry(a, Payload::Imm32Pair(proc_id, entry), rt, scratch)
}

/// The outside-entry stub for direct calls and jumps from the module's own
/// untraced code (the rewriter retargets their rel32 here): like
/// [`emit_outside_entry`], but every register and the flags are preserved,
/// for a caller compiled with gcc's `-fipa-ra` may keep values across the
/// call in any register or flag the callee never writes. Such a caller is
/// never the kernel's signal trampoline, so there is no SIGNAL check, and
/// `signal_entry` has nothing to recognise here. It steps over the red
/// zone (a `.cold` part entered by a jump may share its function's), then
/// saves r11 and the flags (`pushfq` last: a signal in `attach_thread`
/// reads the stub's `[rsp]` as its return address, which is never a
/// pointer to glibc's restorer then).
pub fn emit_direct_entry(
    a: &mut CodeAssembler,
    proc_id: u32,
    rt: &RuntimeAddrs,
) -> Result<(), Error> {
    a.lea(rsp, ptr(rsp - RED_ZONE))?;
    a.push(r11)?;
    a.pushfq()?;
    let site = Site {
        scratch: Some(r11),
        flags_live: false,
        red_zone_live: false,
        flags_save: FlagsSave::Lahf,
    };
    attach_unless_owned(a, rt, r11)?;
    emit_buffer_check(a, rt.flush, site)?;
    emit_record(a, RecordKind::Enter, Payload::Imm32(proc_id), site)?;
    a.popfq()?;
    a.pop(r11)?;
    a.lea(rsp, ptr(rsp + RED_ZONE))?;
    Ok(())
}

/// Calls `attach_thread` unless the runtime is ready and this thread owns
/// a slot, clobbering `s` and the flags. Before init the GS base is 0:
/// `ready` is tested first so gs:[..] never faults. Above 1 while a fork
/// is in progress (`fork_prepare`): the runtime tells a fork child from
/// its parent then.
fn attach_unless_owned(
    a: &mut CodeAssembler,
    rt: &RuntimeAddrs,
    s: AsmRegister64,
) -> Result<(), Error> {
    let mut attach_l = a.create_label();
    let mut owned = a.create_label();
    a.add_instruction(Instruction::with2(
        Code::Cmp_rm32_imm8,
        rip_rel(rt.ready),
        1i32,
    )?)?;
    a.jne(attach_l)?;
    a.mov(s, qword_ptr(0u64).fs())?;
    a.cmp(s, gs_q(S_OWNER))?;
    a.je(owned)?;
    a.set_label(&mut attach_l)?;
    a.call(rt.attach)?;
    a.set_label(&mut owned)?;
    Ok(())
}

/// The outside-entry stub, recording ENTER (an `Imm32` payload) or
/// ENTER_AT (an `Imm32Pair`).
fn outside_entry(
    a: &mut CodeAssembler,
    record: Payload,
    rt: &RuntimeAddrs,
    scratch: AsmRegister64,
) -> Result<(), Error> {
    debug_assert!(ENTRY_SCRATCH.contains(&scratch));
    let s = scratch;
    let site = Site {
        scratch: Some(s),
        flags_live: false,
        red_zone_live: false,
        flags_save: FlagsSave::Lahf,
    };
    let mut not_signal = a.create_label();
    attach_unless_owned(a, rt, s)?;
    // Called from the kernel's signal trampoline? The return address then
    // points at glibc's `__restore_rt` (`mov rax, 15; syscall`), and rdx
    // at the ucontext right above it. Untraced code may enter by a jump,
    // with anything at `[rsp]` (gcc's `.cold` parts jump back into their
    // function's epilogue): read through `[rsp]` only when rdx says the
    // kernel's frame is there.
    a.lea(s, ptr(rsp + 8))?;
    a.cmp(s, rdx)?;
    a.jne(not_signal)?;
    a.mov(s, qword_ptr(rsp))?;
    a.mov(s, qword_ptr(s))?;
    a.add_instruction(Instruction::with2(
        Code::Cmp_r64_rm64,
        Register::from(s),
        rip_rel(rt.restorer_bytes),
    )?)?;
    a.jne(not_signal)?;
    a.call(rt.signal_entry)?;
    a.set_label(&mut not_signal)?;
    emit_buffer_check(a, rt.flush, site)?;
    let kind = match record {
        Payload::Imm32Pair(..) => RecordKind::EnterAt,
        _ => RecordKind::Enter,
    };
    emit_record(a, kind, record, site)
}

/// Emits the entry stub of a static executable (its new `e_entry`; there
/// is no DT_PREINIT_ARRAY to run `init` from): calls the runtime's `init`
/// with `(argc, argv, envp)` read from the initial stack (`[rsp]` = argc,
/// argv from `rsp+8`, envp after argv's NULL), then records `ENTER(proc)`
/// for the process entry procedure. Every register and flag the kernel
/// (or a loader) handed to the entry point is preserved, `rdx` (the
/// `atexit` function of the ELF ABI) and `rsp` included: only memory
/// below `rsp` is used. The copy of the entry procedure follows.
pub fn emit_static_entry(
    a: &mut CodeAssembler,
    proc_id: u32,
    rt: &RuntimeAddrs,
) -> Result<(), Error> {
    a.push(rdi)?;
    a.push(rsi)?;
    a.push(rdx)?;
    a.mov(rdi, qword_ptr(rsp + 24))?;
    a.lea(rsi, ptr(rsp + 32))?;
    a.lea(rdx, ptr(rsi + rdi * 8 + 8))?;
    a.call(rt.init)?;
    a.pop(rdx)?;
    a.pop(rsi)?;
    a.pop(rdi)?;
    // Nothing is dead at a process entry: save what the sequence needs.
    let site = Site {
        scratch: None,
        flags_live: true,
        red_zone_live: false,
        flags_save: FlagsSave::Pushf,
    };
    emit_buffer_check(a, rt.flush, site)?;
    emit_record(a, RecordKind::Enter, Payload::Imm32(proc_id), site)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(f: impl Fn(&mut CodeAssembler)) -> usize {
        let mut a = CodeAssembler::new(64).unwrap();
        f(&mut a);
        a.assemble(0x40_0000).unwrap().len()
    }

    /// The byte sizes quoted in docs/runtime.md.
    #[test]
    fn sequence_sizes_match_the_documentation() {
        let s = |scratch, flags_live, red_zone_live, flags_save| Site {
            scratch,
            flags_live,
            red_zone_live,
            flags_save,
        };
        let w = |site: Site| size(|a| emit_witness(a, 7, site).unwrap());
        assert_eq!(w(s(Some(rax), false, true, FlagsSave::Lahf)), 18);
        assert_eq!(w(s(Some(r11), false, true, FlagsSave::Lahf)), 20);
        assert_eq!(w(s(None, false, false, FlagsSave::Lahf)), 20);
        assert_eq!(w(s(None, false, true, FlagsSave::Lahf)), 33);
        assert_eq!(w(s(Some(r11), true, true, FlagsSave::Lahf)), 42);
        assert_eq!(w(s(Some(r11), true, true, FlagsSave::Pushf)), 35);
        assert_eq!(w(Site::CONSERVATIVE), 42);
        let check = size(|a| emit_buffer_check(a, 0x40_1000, Site::with_scratch(r11)).unwrap());
        assert_eq!(check, 39);
        let enter = size(|a| {
            emit_record(
                a,
                RecordKind::Enter,
                Payload::Imm32(5),
                Site::with_scratch(r11),
            )
            .unwrap()
        });
        assert_eq!(enter, 35);
    }

    /// [`TRANSFER_INC`] is what [`emit_transfer`] emits, flags dead or
    /// live, once; sizes: 8 bytes with dead flags; with live flags 15
    /// (rax dead, `lahf`), 17 (rax pushed), 10 (`pushfq`), 13 more when
    /// the red zone is stepped over.
    #[test]
    fn transfer_increment_bytes() {
        let cases = [
            (Some(r11), false, false, FlagsSave::Lahf, 8),
            (Some(rax), true, true, FlagsSave::Lahf, 15),
            (Some(r11), true, false, FlagsSave::Lahf, 17),
            (None, true, true, FlagsSave::Lahf, 30),
            (Some(r11), true, false, FlagsSave::Pushf, 10),
            (Some(r11), true, true, FlagsSave::Pushf, 23),
        ];
        for (scratch, flags_live, red_zone_live, flags_save, len) in cases {
            let site = Site {
                scratch,
                flags_live,
                red_zone_live,
                flags_save,
            };
            let mut a = CodeAssembler::new(64).unwrap();
            emit_transfer(&mut a, site).unwrap();
            let code = a.assemble(0x40_0000).unwrap();
            let incs = code.windows(8).filter(|w| *w == TRANSFER_INC).count();
            assert_eq!((incs, code.len()), (1, len), "{site:?}: {code:x?}");
            if !flags_live {
                assert_eq!(code, TRANSFER_INC);
            }
        }
    }

    /// [`STUB_INSNS`] are the stub's instructions, the last one its `call
    /// signal_entry`, whichever distance separates it from the runtime.
    #[test]
    fn outside_entry_layout() {
        let blob = crate::generate().unwrap();
        let places = [(0x40_0000u64, 0x7000_0000u64), (0x7100_0000, 0x40_1000)];
        for ((at, base), s) in places.iter().flat_map(|&p| ENTRY_SCRATCH.map(|s| (p, s))) {
            let rt = RuntimeAddrs::new(&blob, base);
            let mut a = CodeAssembler::new(64).unwrap();
            emit_outside_entry_with(&mut a, 3, &rt, s).unwrap();
            let code = a.assemble(at).unwrap();
            let starts: Vec<u32> = iced_x86::Decoder::with_ip(64, &code, at, 0)
                .iter()
                .map(|i| (i.ip() - at) as u32)
                .take(STUB_INSNS.len())
                .collect();
            assert_eq!(starts, STUB_INSNS);
            let last = STUB_INSNS[STUB_INSNS.len() - 1] as usize;
            let call = iced_x86::Decoder::with_ip(64, &code[last..], at + last as u64, 0).decode();
            assert_eq!(call.mnemonic(), iced_x86::Mnemonic::Call);
            assert_eq!(call.near_branch64(), rt.signal_entry);
            assert_eq!(call.len(), 5);
        }
    }
}
