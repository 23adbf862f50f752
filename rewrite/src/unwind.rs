//! Unwind tables for the relocated code (design decision 2: "C++ unwinding
//! needs `.eh_frame` entries for the copy and LSDA landing pads remapped").
//!
//! Return addresses on the stack point into the procedure copies, so the
//! unwinder (libgcc's `_Unwind_Find_FDE`, gdb, perf) needs FDEs for them.
//! [`build`] produces one new read-only segment:
//!
//! ```text
//! [.eh_frame_hdr: one sorted search table over every FDE below]
//! [the copies' LSDAs]
//! [.eh_frame: every original FDE (same range, rows, LSDA), then one FDE
//!  per copied FDE part, then the zero terminator]
//! ```
//!
//! `elfout` repoints `PT_GNU_EH_FRAME` and the `.eh_frame_hdr` and
//! `.eh_frame` section headers at it, so the binary-search unwinder, the
//! linear one (`eh_frame_ptr`), readelf and gdb all see one complete,
//! consistent table; left-alone code and the old bodies keep their FDEs.
//! The original bytes stay in place, unreferenced.
//!
//! How an FDE is translated. The original CFA program is evaluated into
//! rows (our own evaluator over gimli's parsed instructions: it keeps an
//! explicit `DW_CFA_undefined` apart from "no rule", which gimli's
//! `UnwindTable` merges). Each copied instruction gets the row of its
//! original address; the bytes between two copied instructions (the
//! instrumentation) get the state after the preceding instruction, i.e. the
//! row at its original fall-through address (for a jump or return: the row
//! of the next copied instruction); the outside-entry stub gets the row at
//! the procedure's entry; the out-of-line stubs after the last block get
//! the row after the last instruction. Unwinding starts at call return
//! addresses (looked up at `pc - 1`, inside the call, whose row is exact)
//! and rarely in a signal frame. The rows are then written back as a
//! minimal program (`advance_loc` + the rules that change; `DW_CFA_restore`
//! when a rule returns to the CIE's). A procedure made of several FDEs
//! (a `.cold` part) gets one new FDE per part, over the part's contiguous
//! stretch of the copy.
//!
//! How an LSDA is translated (`aetrace_analysis::lsda`): a call-site range
//! `[s, s + len)` becomes `[new(first insn in it), new(last insn in it) +
//! its new length)`, a landing pad becomes the copy's LANDING stub for it,
//! actions, type filters and exception specifications are kept, type-table
//! entries are re-encoded for their new position.
//!
//! Invariants: every new FDE lies inside its procedure's copy; the
//! `insn_map` of each copy is ascending in original addresses and every
//! mapped instruction decodes to the same mnemonic at both addresses
//! (checked: a mismatch is an error naming the procedure); the header table
//! is sorted with no duplicate start; anything that cannot be translated
//! exactly (a landing pad without a LANDING stub, an unknown pointer
//! encoding, an AArch64-only CFA op) is an error naming the procedure, never
//! a guess.

use std::collections::{BTreeMap, BTreeSet};

use gimli::write::{
    Address, CallFrameInstruction as W, CommonInformationEntry, EndianVec, Expression,
    FrameDescriptionEntry, FrameTable,
};
use gimli::{
    BaseAddresses, CallFrameInstruction as R, CieOrFde, DwEhPe, EhFrame, Encoding, EndianSlice,
    Format, LittleEndian, Register, UnwindSection,
};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction};

use crate::codegen::ProcCopy;
use crate::error::{Error, Refusal, Result};
use crate::personality::{self, Shim, ShimRange};
use aetrace_analysis::elf::Module;
use aetrace_analysis::lsda::{self, Lsda};

type Res<T> = std::result::Result<T, UnwindError>;

/// Why the new `.eh_frame` or `.eh_frame_hdr` could not be built.
#[derive(Debug, thiserror::Error)]
pub enum UnwindError {
    /// gimli could not read a CFA program, expression or entry (`what`).
    #[error("{what}: {source}")]
    Read {
        /// What was being read.
        what: &'static str,
        /// gimli's error.
        source: gimli::Error,
    },
    /// gimli could not write the new `.eh_frame`.
    #[error("writing .eh_frame: {0}")]
    Write(#[source] gimli::write::Error),
    /// An LSDA could not be parsed.
    #[error(transparent)]
    Lsda(#[from] lsda::LsdaError),
    /// The failure concerns the CIE, FDE, procedure or LSDA at `at`.
    #[error("{what} {at:#x}: {source}")]
    At {
        /// "CIE at", "FDE of", "procedure at", "LSDA for" or "FDE for".
        what: &'static str,
        /// Its address.
        at: u64,
        /// Why.
        source: Box<UnwindError>,
    },
    /// A value (named) overflows while evaluating a CFA program.
    #[error("{0} overflow")]
    Overflow(&'static str),
    /// A CFA program or entry the rewriter does not follow.
    #[error("{0}")]
    Unsupported(&'static str),
    /// The tables do not agree with the copies or with themselves (a bug).
    #[error("{0}")]
    Inconsistent(&'static str),
    /// A CFA program moves its location backwards.
    #[error("location moves back from {from:#x} to {to:#x}")]
    LocationBack {
        /// The location before.
        from: u64,
        /// The location after.
        to: u64,
    },
    /// An offset does not fit the 32 bits the writer takes.
    #[error("offset {0} does not fit 32 bits")]
    Offset(i64),
    /// A register loses its rule, which no instruction can say (the return address).
    #[error("register {0} loses its rule")]
    LosesRule(u16),
    /// A pointer encoding's application is neither absolute nor pc-relative.
    #[error("pointer application {0:#x} is not supported")]
    PointerApplication(u8),
    /// A CFA expression reads rip in a way the rewriter cannot relocate.
    #[error("the CFA expression at {0:#x} depends on rip beyond rsp + c")]
    CfaRip(u64),
    /// A CFA expression has an operation the rewriter does not know.
    #[error("the CFA expression at {0:#x} has an unknown operation")]
    CfaUnknown(u64),
    /// A register's rule is an expression that may read rip.
    #[error("the rule of register {reg} at {at:#x} is an expression that may read rip")]
    RuleRip {
        /// The DWARF register.
        reg: u16,
        /// The instruction address.
        at: u64,
    },
    /// An original (`what` "original") or copied instruction does not decode.
    #[error("{what} instruction at {at:#x} does not decode")]
    NoDecode {
        /// "original" or "copied".
        what: &'static str,
        /// Its address.
        at: u64,
    },
    /// A copied instruction is another instruction than its original.
    #[error("instruction at {old:#x} ({was:?}) is a {is:?} in the copy at {new:#x}")]
    CopyDiffers {
        /// The original's address.
        old: u64,
        /// The original's mnemonic.
        was: iced_x86::Mnemonic,
        /// The copy's mnemonic.
        is: iced_x86::Mnemonic,
        /// The copy's address.
        new: u64,
    },
    /// A copied instruction overlaps the next one.
    #[error("copied instruction at {0:#x} overlaps what follows")]
    CopyOverlaps(u64),
    /// A landing pad has no LANDING stub in the copy.
    #[error("landing pad {0:#x} has no LANDING stub")]
    NoLandingStub(u64),
    /// A row of a new FDE lies outside it.
    #[error("row at {0:#x} outside the FDE")]
    RowOutside(u64),
    /// Two new FDEs start at the same address.
    #[error("two FDEs start at {0:#x}")]
    TwoFdes(u64),
    /// The wrapper personality could not be assembled.
    #[error("the wrapper personality: {0}")]
    Wrapper(#[source] iced_x86::IcedError),
    /// A shim's offset is out of reach.
    #[error(transparent)]
    Shim(#[from] ShimRange),
    /// An address is out of the header's 32-bit reach.
    #[error("{0:#x} is more than 2 GiB from the header")]
    HeaderRange(u64),
}

impl UnwindError {
    /// This error, its message prefixed with `what` and address `at`.
    fn at(self, what: &'static str, at: u64) -> UnwindError {
        UnwindError::At {
            what,
            at,
            source: Box::new(self),
        }
    }
}
type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// The new unwind segment.
#[derive(Clone, Debug)]
pub struct Unwind {
    /// Placed at the `vaddr` given to [`build`] (read-only).
    pub bytes: Vec<u8>,
    /// The new `.eh_frame_hdr` (for `PT_GNU_EH_FRAME`).
    pub hdr_vaddr: u64,
    /// Size of the new `.eh_frame_hdr` in bytes.
    pub hdr_size: u64,
    /// The new `.eh_frame` `[start, end)` (for its section header).
    pub eh_frame: (u64, u64),
    /// FDEs written for the copies (0: no copied code has an FDE, and the
    /// segment is not needed).
    pub fdes: usize,
    /// The wrapper personality (`personality`), whose code makes the
    /// segment executable.
    pub wrapper: Option<u64>,
}

const PE_ABSPTR: u8 = 0x00;
const PE_PCREL: u8 = 0x10;
const PE_INDIRECT: u8 = 0x80;
/// How a CIE names the wrapper personality: pc-relative, signed 4 bytes.
const PE_PCREL_SDATA4: u8 = 0x1b;
/// `DW_EH_PE_pcrel | DW_EH_PE_sdata4`, `DW_EH_PE_udata4`,
/// `DW_EH_PE_datarel | DW_EH_PE_sdata4`: the header encodings ld writes.
const HDR_ENCODINGS: [u8; 3] = [0x1b, 0x03, 0x3b];

/// A register rule. `Undefined` is explicit (`DW_CFA_undefined`), unlike a
/// register without a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Rule {
    Undefined,
    SameValue,
    Offset(i64),
    ValOffset(i64),
    Register(u16),
    Expression(Vec<u8>),
    ValExpression(Vec<u8>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Cfa {
    Unset,
    RegOff(u16, i64),
    Expr(Vec<u8>),
}

/// One row of the unwind table: offsets unfactored.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Row {
    cfa: Cfa,
    regs: BTreeMap<u16, Rule>,
    args_size: u64,
}

impl Row {
    fn empty() -> Row {
        Row {
            cfa: Cfa::Unset,
            regs: BTreeMap::new(),
            args_size: 0,
        }
    }
}

/// What a CIE contributes to its FDEs.
#[derive(Clone, Debug)]
struct CieInfo {
    code_align: u64,
    data_align: i64,
    ra: u16,
    personality: Option<(u8, u64)>,
    lsda_enc: Option<u8>,
    fde_enc: Option<u8>,
    signal: bool,
    initial: Row,
}

/// An original FDE, evaluated.
struct OrigFde {
    start: u64,
    end: u64,
    cie: CieInfo,
    /// `(from, row)` ascending, the first at `start`.
    rows: Vec<(u64, Row)>,
    lsda: Option<u64>,
}

impl OrigFde {
    fn contains(&self, a: u64) -> bool {
        a >= self.start && a < self.end
    }

    fn row_at(&self, a: u64) -> &Row {
        let i = self.rows.partition_point(|(from, _)| *from <= a);
        &self.rows[i.saturating_sub(1)].1
    }
}

/// Evaluates a CFA program from `initial` at `start` (the CIE's initial
/// instructions: `initial` empty, no location changes).
fn eval(
    eh: &EhFrame<Slice<'_>>,
    mut insns: gimli::CallFrameInstructionIter<'_, Slice<'_>>,
    start: u64,
    code_align: u64,
    data_align: i64,
    initial: &Row,
) -> Res<Vec<(u64, Row)>> {
    let mut rows: Vec<(u64, Row)> = Vec::new();
    let mut row = initial.clone();
    let mut loc = start;
    let mut stack: Vec<(Cfa, BTreeMap<u16, Rule>)> = Vec::new();
    let expr = |e: gimli::UnwindExpression<usize>| -> Res<Vec<u8>> {
        e.get(eh)
            .map(|x| x.0.slice().to_vec())
            .map_err(|source| UnwindError::Read {
                what: "CFA expression",
                source,
            })
    };
    let factored = |f: i64| -> Res<i64> {
        f.checked_mul(data_align)
            .ok_or(UnwindError::Overflow("factored offset"))
    };
    while let Some(i) = insns.next().map_err(|source| UnwindError::Read {
        what: "CFA program",
        source,
    })? {
        let mut set = |r: Register, rule: Rule| {
            row.regs.insert(r.0, rule);
        };
        let new_loc = match i {
            R::SetLoc { address } => Some(address),
            R::AdvanceLoc { delta } => Some(
                u64::from(delta)
                    .checked_mul(code_align)
                    .and_then(|d| loc.checked_add(d))
                    .ok_or(UnwindError::Overflow("advance_loc"))?,
            ),
            _ => None,
        };
        if let Some(to) = new_loc {
            if to < loc {
                return Err(UnwindError::LocationBack { from: loc, to });
            }
            if to > loc {
                rows.push((loc, row.clone()));
            }
            loc = to;
            continue;
        }
        match i {
            R::SetLoc { .. } | R::AdvanceLoc { .. } | R::Nop => {}
            R::DefCfa { register, offset } => {
                let o = i64::try_from(offset).map_err(|_| UnwindError::Overflow("CFA offset"))?;
                row.cfa = Cfa::RegOff(register.0, o);
            }
            R::DefCfaSf {
                register,
                factored_offset,
            } => row.cfa = Cfa::RegOff(register.0, factored(factored_offset)?),
            R::DefCfaRegister { register } => match row.cfa {
                Cfa::RegOff(_, o) => row.cfa = Cfa::RegOff(register.0, o),
                _ => {
                    return Err(UnwindError::Unsupported(
                        "def_cfa_register without a register CFA",
                    ))
                }
            },
            R::DefCfaOffset { offset } => match row.cfa {
                Cfa::RegOff(r, _) => {
                    let o =
                        i64::try_from(offset).map_err(|_| UnwindError::Overflow("CFA offset"))?;
                    row.cfa = Cfa::RegOff(r, o);
                }
                _ => {
                    return Err(UnwindError::Unsupported(
                        "def_cfa_offset without a register CFA",
                    ))
                }
            },
            R::DefCfaOffsetSf { factored_offset } => match row.cfa {
                Cfa::RegOff(r, _) => row.cfa = Cfa::RegOff(r, factored(factored_offset)?),
                _ => {
                    return Err(UnwindError::Unsupported(
                        "def_cfa_offset_sf without a register CFA",
                    ))
                }
            },
            R::DefCfaExpression { expression } => row.cfa = Cfa::Expr(expr(expression)?),
            R::Undefined { register } => set(register, Rule::Undefined),
            R::SameValue { register } => set(register, Rule::SameValue),
            R::Offset {
                register,
                factored_offset,
            } => {
                let f =
                    i64::try_from(factored_offset).map_err(|_| UnwindError::Overflow("offset"))?;
                set(register, Rule::Offset(factored(f)?))
            }
            R::OffsetExtendedSf {
                register,
                factored_offset,
            } => set(register, Rule::Offset(factored(factored_offset)?)),
            R::ValOffset {
                register,
                factored_offset,
            } => {
                let f =
                    i64::try_from(factored_offset).map_err(|_| UnwindError::Overflow("offset"))?;
                set(register, Rule::ValOffset(factored(f)?))
            }
            R::ValOffsetSf {
                register,
                factored_offset,
            } => set(register, Rule::ValOffset(factored(factored_offset)?)),
            R::Register {
                dest_register,
                src_register,
            } => set(dest_register, Rule::Register(src_register.0)),
            R::Expression {
                register,
                expression,
            } => set(register, Rule::Expression(expr(expression)?)),
            R::ValExpression {
                register,
                expression,
            } => set(register, Rule::ValExpression(expr(expression)?)),
            R::Restore { register } => match initial.regs.get(&register.0) {
                Some(r) => {
                    row.regs.insert(register.0, r.clone());
                }
                None => {
                    row.regs.remove(&register.0);
                }
            },
            // libgcc saves the CFA with the register rules, not args_size.
            R::RememberState => stack.push((row.cfa.clone(), row.regs.clone())),
            R::RestoreState => {
                let (cfa, regs) = stack.pop().ok_or(UnwindError::Unsupported(
                    "restore_state with nothing remembered",
                ))?;
                row.cfa = cfa;
                row.regs = regs;
            }
            R::ArgsSize { size } => row.args_size = size,
            R::NegateRaState => {
                return Err(UnwindError::Unsupported(
                    "DW_CFA_AARCH64_negate_ra_state on x86-64",
                ))
            }
        }
    }
    rows.push((loc, row));
    rows.dedup_by(|b, a| a.1 == b.1);
    Ok(rows)
}

/// The x86-64 psABI's DWARF return-address column (rip).
const RETURN_ADDRESS: u16 = 16;

fn i32_of(v: i64) -> Res<i32> {
    i32::try_from(v).map_err(|_| UnwindError::Offset(v))
}

/// Appends the instructions that turn row `from` into row `to`; `initial`
/// is the CIE's row (what `DW_CFA_restore` returns to).
fn transition(from: &Row, to: &Row, initial: &Row, out: &mut Vec<W>) -> Res<()> {
    if from.cfa != to.cfa {
        out.push(match (&from.cfa, &to.cfa) {
            (_, Cfa::Unset) => return Err(UnwindError::Unsupported("the CFA becomes undefined")),
            (Cfa::RegOff(r0, _), Cfa::RegOff(r, o)) if r0 == r => W::CfaOffset(i32_of(*o)?),
            (Cfa::RegOff(_, o0), Cfa::RegOff(r, o)) if o0 == o => W::CfaRegister(Register(*r)),
            (_, Cfa::RegOff(r, o)) => W::Cfa(Register(*r), i32_of(*o)?),
            (_, Cfa::Expr(b)) => W::CfaExpression(Expression::raw(b.clone())),
        });
    }
    let regs: BTreeSet<u16> = from.regs.keys().chain(to.regs.keys()).copied().collect();
    for r in regs {
        let b = to.regs.get(&r);
        if from.regs.get(&r) == b {
            continue;
        }
        let reg = Register(r);
        if b == initial.regs.get(&r) {
            out.push(W::Restore(reg));
            continue;
        }
        out.push(match b {
            // Only `restore` removes a rule, and it restores the CIE's: a
            // rule the CIE has but the row does not (a `.cold` part's CIE
            // starts from its hot part's saves; the stubs after the copy's
            // last block take the row after its `ret`) is written as
            // `same_value`, which is what "no rule" means to the unwinders
            // (libgcc's REG_UNSAVED, gdb's unspecified callee-saved
            // register). Not for the return address: that has no such
            // meaning.
            None if r != RETURN_ADDRESS => W::SameValue(reg),
            None => return Err(UnwindError::LosesRule(r)),
            Some(Rule::Undefined) => W::Undefined(reg),
            Some(Rule::SameValue) => W::SameValue(reg),
            Some(Rule::Offset(o)) => W::Offset(reg, i32_of(*o)?),
            Some(Rule::ValOffset(o)) => W::ValOffset(reg, i32_of(*o)?),
            Some(Rule::Register(s)) => W::Register(reg, Register(*s)),
            Some(Rule::Expression(e)) => W::Expression(reg, Expression::raw(e.clone())),
            Some(Rule::ValExpression(e)) => W::ValExpression(reg, Expression::raw(e.clone())),
        });
    }
    if from.args_size != to.args_size {
        let s = u32::try_from(to.args_size).map_err(|_| UnwindError::Overflow("args_size"))?;
        out.push(W::ArgsSize(s));
    }
    Ok(())
}

/// The write-side address of `target` in pointer encoding `enc`, for an
/// `.eh_frame` written from offset 0 at `eh_vaddr` (gimli subtracts the
/// field's offset in the buffer for pc-relative encodings).
fn eh_address(enc: u8, target: u64, eh_vaddr: u64) -> Res<Address> {
    match enc & 0x70 {
        PE_ABSPTR => Ok(Address::Constant(target)),
        PE_PCREL => Ok(Address::Constant(target.wrapping_sub(eh_vaddr))),
        a => Err(UnwindError::PointerApplication(a)),
    }
}

/// Reads the original `.eh_frame`: every FDE evaluated, sorted by start.
fn original_fdes(module: &Module) -> Res<Vec<OrigFde>> {
    let Some((eh, bases, sec_addr)) = lsda::eh_frame(module) else {
        return Ok(Vec::new());
    };
    let mut cies: BTreeMap<usize, CieInfo> = BTreeMap::new();
    let mut out = Vec::new();
    let mut entries = eh.entries(&bases);
    loop {
        let entry = match entries.next() {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(source) => {
                return Err(UnwindError::Read {
                    what: ".eh_frame",
                    source,
                })
            }
        };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial
            .parse(EhFrame::cie_from_offset)
            .map_err(|source| UnwindError::Read {
                what: ".eh_frame: FDE",
                source,
            })?;
        let cie = fde.cie();
        let info = match cies.get(&cie.offset()) {
            Some(i) => i.clone(),
            None => {
                let code_align = cie.code_alignment_factor();
                let data_align = cie.data_alignment_factor();
                let initial = eval(
                    &eh,
                    cie.instructions(&eh, &bases),
                    0,
                    code_align,
                    data_align,
                    &Row::empty(),
                )
                .map_err(|e| e.at("CIE at", sec_addr + cie.offset() as u64))?;
                let [(0, initial)] = &initial[..] else {
                    return Err(UnwindError::Unsupported(
                        "initial instructions advance the location",
                    )
                    .at("CIE at", sec_addr + cie.offset() as u64));
                };
                let info = CieInfo {
                    code_align,
                    data_align,
                    ra: cie.return_address_register().0,
                    personality: cie.personality_with_encoding().map(|(enc, p)| match p {
                        gimli::Pointer::Direct(a) | gimli::Pointer::Indirect(a) => (enc.0, a),
                    }),
                    lsda_enc: cie.lsda_encoding().map(|e| e.0),
                    fde_enc: cie.fde_address_encoding().map(|e| e.0),
                    signal: cie.is_signal_trampoline(),
                    initial: initial.clone(),
                };
                cies.insert(cie.offset(), info.clone());
                info
            }
        };
        let start = fde.initial_address();
        let end = start.saturating_add(fde.len());
        let rows = eval(
            &eh,
            fde.instructions(&eh, &bases),
            start,
            info.code_align,
            info.data_align,
            &info.initial,
        )
        .map_err(|e| e.at("FDE of", start))?;
        let lsda = match fde.lsda() {
            None => None,
            Some(gimli::Pointer::Direct(a)) => Some(a),
            Some(gimli::Pointer::Indirect(_)) => {
                return Err(UnwindError::Unsupported("indirect LSDA pointer").at("FDE of", start))
            }
        };
        out.push(OrigFde {
            start,
            end,
            cie: info,
            rows,
            lsda,
        });
    }
    out.sort_by_key(|f| f.start);
    Ok(out)
}

/// DWARF register numbers (x86-64 psABI): `rsp` and the return address
/// column, which holds `rip` while a frame executes.
const DW_RSP: u16 = 7;
const DW_RIP: u16 = 16;

/// A value of the partial evaluator: known, or `rsp + c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Val {
    Known(u64),
    RspPlus(i64),
}

/// Reads a uleb128 or sleb128 at `ops[*at]` (gimli's decoder), moving
/// `at` past it.
fn leb(ops: &[u8], at: &mut usize, signed: bool) -> Option<u64> {
    use gimli::leb128::read;
    let mut r = gimli::EndianSlice::new(ops.get(*at..)?, gimli::LittleEndian);
    let v = if signed {
        read::signed(&mut r).ok()? as u64
    } else {
        read::unsigned(&mut r).ok()?
    };
    *at = ops.len() - r.len();
    Some(v)
}

/// Whether a DWARF expression reads `rip` (`DW_OP_breg16`, `DW_OP_reg16`,
/// `DW_OP_bregx`/`regx 16`); `None` when it holds an operation we cannot
/// step over.
fn uses_rip(ops: &[u8]) -> Option<bool> {
    let mut at = 0;
    let mut rip = false;
    while at < ops.len() {
        let op = ops[at];
        at += 1;
        match op {
            0x60 => rip = true,
            0x80 => {
                rip = true;
                leb(ops, &mut at, true)?;
            }
            0x70..=0x8f | 0x91 | 0x11 => {
                leb(ops, &mut at, true)?;
            }
            0x90 | 0x92 => {
                rip |= leb(ops, &mut at, false)? == u64::from(DW_RIP);
                if op == 0x92 {
                    leb(ops, &mut at, true)?;
                }
            }
            0x10 | 0x23 => {
                leb(ops, &mut at, false)?;
            }
            0x08 | 0x09 | 0x15 | 0x94 => at += 1,
            0x0a | 0x0b | 0x28 | 0x2f => at += 2,
            0x0c | 0x0d => at += 4,
            0x03 | 0x0e | 0x0f => at += 8,
            0x06 | 0x12..=0x14 | 0x16..=0x27 | 0x29..=0x2e | 0x30..=0x6f | 0x96 => {}
            _ => return None,
        }
    }
    (at == ops.len()).then_some(rip)
}

/// Evaluates a CFA expression for the instruction at original address
/// `rip`, leaving `rsp` symbolic: `Some(c)` when the CFA is `rsp + c`.
/// Covers the arithmetic of ld's `.plt` FDE (`rsp + 8 + (((rip & 15) >=
/// 11) << 3)`); anything else is `None`.
fn eval_at(ops: &[u8], rip: u64) -> Option<i64> {
    let mut st: Vec<Val> = Vec::new();
    let mut at = 0;
    while at < ops.len() {
        let op = ops[at];
        at += 1;
        let v = match op {
            0x96 => continue,
            0x30..=0x4f => Val::Known(u64::from(op - 0x30)),
            0x77 => Val::RspPlus(leb(ops, &mut at, true)? as i64),
            0x80 => Val::Known(rip.wrapping_add(leb(ops, &mut at, true)?)),
            0x10 => Val::Known(leb(ops, &mut at, false)?),
            0x11 => Val::Known(leb(ops, &mut at, true)?),
            0x23 => {
                let k = leb(ops, &mut at, false)?;
                match st.pop()? {
                    Val::Known(a) => Val::Known(a.wrapping_add(k)),
                    Val::RspPlus(c) => Val::RspPlus(c.wrapping_add(k as i64)),
                }
            }
            0x1a | 0x1c | 0x1e | 0x21 | 0x22 | 0x24 | 0x25 | 0x27 | 0x29..=0x2e => {
                let b = st.pop()?;
                let a = st.pop()?;
                match (a, b) {
                    (Val::RspPlus(c), Val::Known(k)) | (Val::Known(k), Val::RspPlus(c))
                        if op == 0x22 =>
                    {
                        Val::RspPlus(c.wrapping_add(k as i64))
                    }
                    (Val::RspPlus(c), Val::Known(k)) if op == 0x1c => {
                        Val::RspPlus(c.wrapping_sub(k as i64))
                    }
                    (Val::Known(a), Val::Known(b)) => Val::Known(match op {
                        0x1a => a & b,
                        0x1c => a.wrapping_sub(b),
                        0x1e => a.wrapping_mul(b),
                        0x21 => a | b,
                        0x22 => a.wrapping_add(b),
                        0x24 => a.checked_shl(u32::try_from(b).ok()?).unwrap_or(0),
                        0x25 => a.checked_shr(u32::try_from(b).ok()?).unwrap_or(0),
                        0x27 => a ^ b,
                        // Comparisons are signed (DWARF 5 section 2.5.1.4).
                        0x29 => u64::from(a == b),
                        0x2a => u64::from(a as i64 >= b as i64),
                        0x2b => u64::from(a as i64 > b as i64),
                        0x2c => u64::from(a as i64 <= b as i64),
                        0x2d => u64::from((a as i64) < b as i64),
                        _ => u64::from(a != b),
                    }),
                    _ => return None,
                }
            }
            _ => return None,
        };
        st.push(v);
    }
    match st[..] {
        [Val::RspPlus(c)] => Some(c),
        _ => None,
    }
}

/// The row of original address `old` as the copy must describe it: a CFA
/// expression reading `rip` (it assumes the code's own address, like the
/// `.plt` FDE) is evaluated for `old` into `rsp + c`; a register rule
/// reading `rip` cannot be moved and is an error.
fn relocated_row(row: &Row, old: u64) -> Res<Row> {
    let mut r = row.clone();
    if let Cfa::Expr(ops) = &row.cfa {
        match uses_rip(ops) {
            Some(false) => {}
            Some(true) => {
                let c = eval_at(ops, old).ok_or(UnwindError::CfaRip(old))?;
                r.cfa = Cfa::RegOff(DW_RSP, c);
            }
            None => return Err(UnwindError::CfaUnknown(old)),
        }
    }
    for (reg, rule) in &row.regs {
        if let Rule::Expression(ops) | Rule::ValExpression(ops) = rule {
            if uses_rip(ops) != Some(false) {
                return Err(UnwindError::RuleRip { reg: *reg, at: old });
            }
        }
    }
    Ok(r)
}

/// Decodes the instruction at `addr` in `bytes` (which start at `base`).
fn decode(bytes: &[u8], base: u64, addr: u64) -> Option<Instruction> {
    let off = usize::try_from(addr.checked_sub(base)?).ok()?;
    let end = bytes.len().min(off.checked_add(15)?);
    let mut d = Decoder::with_ip(64, bytes.get(off..end)?, addr, DecoderOptions::NONE);
    let i = d.decode();
    (!i.is_invalid()).then_some(i)
}

/// One new FDE: a stretch of a copy covered by one original FDE.
struct NewFde {
    orig: usize,
    start: u64,
    end: u64,
    rows: Vec<(u64, Row)>,
    lsda: Option<Lsda>,
    /// What the wrapper personality needs (`personality`), when the
    /// original CIE names a personality.
    shim: Option<Shim>,
}

/// One FDE to write: an original one or a copy's.
struct FdeOut<'a> {
    cie: &'a CieInfo,
    start: u64,
    end: u64,
    rows: &'a [(u64, Row)],
    lsda: Option<u64>,
    /// The wrapper personality, which replaces the CIE's.
    wrapper: Option<u64>,
}

/// Plans the new FDEs of one copy.
fn plan_copy(
    module: &Module,
    relocs: &lsda::LoadRelocs,
    fdes: &[OrigFde],
    copy: &ProcCopy,
    code: &[u8],
    code_vaddr: u64,
    out: &mut Vec<NewFde>,
) -> Res<()> {
    let map = &copy.insn_map;
    if map.windows(2).any(|w| w[1].0 <= w[0].0 || w[1].1 <= w[0].1) {
        return Err(UnwindError::Inconsistent(
            "instruction map is not ascending",
        ));
    }
    let find = |a: u64| -> Option<usize> {
        let i = fdes.partition_point(|f| f.start <= a).checked_sub(1)?;
        fdes[i].contains(a).then_some(i)
    };
    // Lengths and kinds, checked against each other.
    let mut old_insns = Vec::with_capacity(map.len());
    let mut new_lens = Vec::with_capacity(map.len());
    for &(old, new) in map {
        let o = module
            .sections
            .iter()
            .find(|s| s.exec && s.contains(old))
            .and_then(|s| module.bytes_at(old, (s.end() - old).min(15)))
            .and_then(|b| decode(b, old, old))
            .ok_or(UnwindError::NoDecode {
                what: "original",
                at: old,
            })?;
        let n = decode(code, code_vaddr, new).ok_or(UnwindError::NoDecode {
            what: "copied",
            at: new,
        })?;
        if o.mnemonic() != n.mnemonic() {
            return Err(UnwindError::CopyDiffers {
                old,
                was: o.mnemonic(),
                is: n.mnemonic(),
                new,
            });
        }
        old_insns.push(o);
        new_lens.push(n.len() as u64);
    }
    let owner: Vec<Option<usize>> = map.iter().map(|&(old, _)| find(old)).collect();
    let entry_row = find(copy.start).map(|f| fdes[f].row_at(copy.start).clone());
    let mut k = 0;
    while k < map.len() {
        let mut j = k;
        while j + 1 < map.len() && owner[j + 1] == owner[k] {
            j += 1;
        }
        let Some(fi) = owner[k] else {
            // Code without an FDE stays without one, as in the original.
            k = j + 1;
            continue;
        };
        let f = &fdes[fi];
        let start = if k == 0 { copy.new_start } else { map[k].1 };
        let end = if j + 1 == map.len() {
            copy.new_end
        } else {
            map[j + 1].1
        };
        let mut rows: Vec<(u64, Row)> = Vec::new();
        if start < map[k].1 {
            let r = match &entry_row {
                Some(r) => relocated_row(r, copy.start)?,
                None => relocated_row(f.row_at(map[k].0), map[k].0)?,
            };
            rows.push((start, r));
        }
        for m in k..=j {
            let (old, new) = map[m];
            rows.push((new, relocated_row(f.row_at(old), old)?));
            let after = new + new_lens[m];
            let next = if m < j { map[m + 1].1 } else { end };
            if after > next {
                return Err(UnwindError::CopyOverlaps(new));
            }
            if after < next {
                let i = &old_insns[m];
                let falls = matches!(
                    i.flow_control(),
                    FlowControl::Next
                        | FlowControl::Call
                        | FlowControl::IndirectCall
                        | FlowControl::ConditionalBranch
                        | FlowControl::Interrupt
                        | FlowControl::XbeginXabortXend
                );
                let at = if falls && f.contains(i.next_ip()) {
                    i.next_ip()
                } else if m < j {
                    map[m + 1].0
                } else {
                    old
                };
                rows.push((after, relocated_row(f.row_at(at), at)?));
            }
        }
        let lsda = match f.lsda {
            None => None,
            Some(at) => {
                let mut l = Lsda::parse(module, relocs, at, f.start)?;
                let part = &map[k..=j];
                let mut sites = Vec::with_capacity(l.call_sites.len());
                for cs in &l.call_sites {
                    let lo = part.partition_point(|&(o, _)| o < cs.start);
                    let hi = part.partition_point(|&(o, _)| o < cs.start.saturating_add(cs.len));
                    if lo == hi {
                        continue;
                    }
                    let landing_pad = match cs.landing_pad {
                        None => None,
                        Some(lp) => Some(
                            copy.landing
                                .iter()
                                .find(|&&(o, _)| o == lp)
                                .map(|&(_, stub)| stub)
                                .ok_or(UnwindError::NoLandingStub(lp))?,
                        ),
                    };
                    let s = part[lo].1;
                    let e = part[hi - 1].1 + new_lens[k + hi - 1];
                    sites.push(lsda::CallSite {
                        start: s,
                        len: e - s,
                        landing_pad,
                        action: cs.action,
                    });
                }
                l.call_sites = sites;
                Some(l)
            }
        };
        let shim = match (f.lsda, f.cie.personality) {
            (Some(lsda), Some((enc, personality))) => Some(Shim {
                personality,
                indirect: enc & PE_INDIRECT != 0,
                lsda,
                func: f.start,
                rets: (k..=j)
                    .filter(|&m| {
                        matches!(
                            old_insns[m].flow_control(),
                            FlowControl::Call | FlowControl::IndirectCall
                        )
                    })
                    .map(|m| (map[m].1 + new_lens[m], old_insns[m].next_ip()))
                    .collect(),
                pads: copy.landing.clone(),
            }),
            _ => None,
        };
        debug_assert!(copy.new_start <= start && start < end && end <= copy.new_end);
        debug_assert!(rows.windows(2).all(|w| w[0].0 < w[1].0) && rows[0].0 == start);
        out.push(NewFde {
            orig: fi,
            start,
            end,
            rows,
            lsda,
            shim,
        });
        k = j + 1;
    }
    Ok(())
}

/// The CIE of a new FDE: the original's parameters, augmentation and
/// initial row; the personality `wrapper` instead of the original's when
/// given.
fn new_cie(
    cie: &CieInfo,
    with_lsda: bool,
    wrapper: Option<u64>,
    eh_vaddr: u64,
) -> Res<CommonInformationEntry> {
    let encoding = Encoding {
        format: Format::Dwarf32,
        version: 1,
        address_size: 8,
    };
    let code = u8::try_from(cie.code_align)
        .map_err(|_| UnwindError::Unsupported("code alignment factor > 255"))?;
    let data = i8::try_from(cie.data_align)
        .map_err(|_| UnwindError::Unsupported("data alignment factor out of i8"))?;
    let mut c = CommonInformationEntry::new(encoding, code, data, Register(cie.ra));
    let personality = match wrapper {
        Some(w) => Some((PE_PCREL_SDATA4, w)),
        None => cie.personality,
    };
    c.personality = match personality {
        Some((enc, a)) => Some((DwEhPe(enc), eh_address(enc, a, eh_vaddr)?)),
        None => None,
    };
    if with_lsda {
        c.lsda_encoding = Some(DwEhPe(cie.lsda_enc.ok_or(UnwindError::Unsupported(
            "an LSDA without an L augmentation",
        ))?));
    }
    c.fde_address_encoding = DwEhPe(cie.fde_enc.unwrap_or(PE_ABSPTR));
    c.signal_trampoline = cie.signal;
    let mut ins = Vec::new();
    transition(&Row::empty(), &cie.initial, &Row::empty(), &mut ins)?;
    for i in ins {
        c.add_instruction(i);
    }
    Ok(c)
}

/// The ucontext's `gregs` index of each DWARF register 0..=16 (rax, rdx,
/// rcx, rbx, rsi, rdi, rbp, rsp, r8-r15, rip).
const GREGS_OF_DWARF: [i64; 17] = [13, 12, 14, 11, 9, 8, 10, 15, 0, 1, 2, 3, 4, 5, 6, 7, 16];

/// The CIE and FDE of the runtime's `sigreturn` over `[start, end)` (`start`
/// one byte before it: unwinders look up a return address minus one), as
/// glibc describes its `__restore_rt`: a signal frame (augmentation `S`)
/// whose CFA is the interrupted rsp and whose every register, rip
/// included, is in the ucontext at rsp (its gregs 40 bytes in). libgcc
/// recognises glibc's restorer by its bytes only where no FDE covers the
/// pc, so without this entry `backtrace()` in a handler and C++
/// exceptions leaving one would stop there.
fn sigreturn_fde(
    start: u64,
    end: u64,
    eh_vaddr: u64,
) -> Res<(CommonInformationEntry, FrameDescriptionEntry)> {
    let encoding = Encoding {
        format: Format::Dwarf32,
        version: 1,
        address_size: 8,
    };
    let mut cie = CommonInformationEntry::new(encoding, 1, -8, Register(16));
    cie.fde_address_encoding = DwEhPe(PE_PCREL_SDATA4);
    cie.signal_trampoline = true;
    let len = u32::try_from(end - start).map_err(|_| UnwindError::Unsupported("sigreturn span"))?;
    let mut fde = FrameDescriptionEntry::new(eh_address(PE_PCREL_SDATA4, start, eh_vaddr)?, len);
    let greg = |r: usize| 40 + 8 * GREGS_OF_DWARF[r];
    let mut cfa = Expression::new();
    cfa.op_breg(Register(7), greg(7));
    cfa.op_deref();
    fde.add_instruction(0, W::CfaExpression(cfa));
    for r in 0..GREGS_OF_DWARF.len() {
        let mut at = Expression::new();
        at.op_breg(Register(7), greg(r));
        fde.add_instruction(0, W::Expression(Register(r as u16), at));
    }
    Ok((cie, fde))
}

/// Builds the unwind segment for `copies`, whose code (`code`, as encoded)
/// starts at `code_vaddr`; the segment goes at `vaddr`. `sigreturn`: the
/// runtime's `sigreturn` span, which gets its own entry
/// ([`sigreturn_fde`]).
pub fn build(
    module: &Module,
    copies: &[ProcCopy],
    code: &[u8],
    code_vaddr: u64,
    vaddr: u64,
    sigreturn: (u64, u64),
) -> Result<Unwind> {
    build_inner(module, copies, code, code_vaddr, vaddr, sigreturn).map_err(|what| Error::Rewrite {
        path: module.path.clone(),
        what: Refusal::Unwind(what),
    })
}

fn build_inner(
    module: &Module,
    copies: &[ProcCopy],
    code: &[u8],
    code_vaddr: u64,
    vaddr: u64,
    sigreturn: (u64, u64),
) -> Res<Unwind> {
    let fdes = original_fdes(module)?;
    let relocs = lsda::LoadRelocs::of(module);
    let mut news = Vec::new();
    for c in copies {
        plan_copy(module, &relocs, &fdes, c, code, code_vaddr, &mut news)
            .map_err(|e| e.at("procedure at", c.start))?;
    }
    let count = fdes.len() + news.len() + 1;
    let hdr_size = 12 + 8 * count as u64;

    // The new LSDAs after the header.
    let mut bytes = vec![0u8; hdr_size as usize];
    let mut outs: Vec<FdeOut<'_>> = fdes
        .iter()
        .map(|f| FdeOut {
            cie: &f.cie,
            start: f.start,
            end: f.end,
            rows: &f.rows,
            lsda: f.lsda,
            wrapper: None,
        })
        .collect();
    // The wrapper personality, when a copy's FDE has a shim.
    let wrapper = if news.iter().any(|n| n.lsda.is_some() && n.shim.is_some()) {
        bytes.resize(bytes.len().next_multiple_of(16), 0);
        let at = vaddr + bytes.len() as u64;
        bytes.extend_from_slice(&personality::wrapper(at).map_err(UnwindError::Wrapper)?);
        Some(at)
    } else {
        None
    };
    for n in &news {
        let lsda = match &n.lsda {
            None => None,
            Some(l) => {
                bytes.resize(bytes.len().next_multiple_of(8), 0);
                let what = |e: UnwindError| e.at("LSDA for", n.start);
                if let Some(shim) = &n.shim {
                    let len = 8 * (shim.rets.len() + shim.pads.len()) + personality::SHIM_HEAD;
                    let at = vaddr + (bytes.len() + len) as u64;
                    let b = shim.encode(at).map_err(|e| what(UnwindError::Shim(e)))?;
                    debug_assert_eq!(b.len(), len);
                    bytes.extend_from_slice(&b);
                }
                let at = vaddr + bytes.len() as u64;
                let enc = l
                    .encode(at, n.start)
                    .map_err(|e| what(UnwindError::from(e)))?;
                bytes.extend_from_slice(&enc);
                Some(at)
            }
        };
        outs.push(FdeOut {
            cie: &fdes[n.orig].cie,
            start: n.start,
            end: n.end,
            rows: &n.rows,
            lsda,
            wrapper: wrapper.filter(|_| lsda.is_some() && n.shim.is_some()),
        });
    }
    bytes.resize(bytes.len().next_multiple_of(8), 0);
    let eh_vaddr = vaddr + bytes.len() as u64;

    // The new .eh_frame: the original FDEs (same ranges, rows and LSDAs)
    // then the copies'.
    let mut frames = FrameTable::default();
    for o in &outs {
        let what = |e: UnwindError| e.at("FDE for", o.start);
        let cie = new_cie(o.cie, o.lsda.is_some(), o.wrapper, eh_vaddr).map_err(what)?;
        let fde_enc = o.cie.fde_enc.unwrap_or(PE_ABSPTR);
        let len = u32::try_from(o.end - o.start)
            .map_err(|_| what(UnwindError::Unsupported("longer than 4 GiB")))?;
        let mut fde =
            FrameDescriptionEntry::new(eh_address(fde_enc, o.start, eh_vaddr).map_err(what)?, len);
        if let Some(at) = o.lsda {
            let enc = o.cie.lsda_enc.unwrap_or(PE_ABSPTR);
            fde.lsda = Some(eh_address(enc, at, eh_vaddr).map_err(what)?);
        }
        let mut cur = o.cie.initial.clone();
        for (a, row) in o.rows {
            if *row == cur {
                continue;
            }
            let mut ins = Vec::new();
            transition(&cur, row, &o.cie.initial, &mut ins).map_err(what)?;
            let off = a
                .checked_sub(o.start)
                .and_then(|d| u32::try_from(d).ok())
                .ok_or_else(|| what(UnwindError::RowOutside(*a)))?;
            for i in ins {
                fde.add_instruction(off, i);
            }
            cur = row.clone();
        }
        let id = frames.add_cie(cie);
        frames.add_fde(id, fde);
    }
    let (cie, fde) = sigreturn_fde(sigreturn.0, sigreturn.1, eh_vaddr)
        .map_err(|e| e.at("FDE for sigreturn at", sigreturn.0))?;
    let id = frames.add_cie(cie);
    frames.add_fde(id, fde);
    let mut spans: Vec<(u64, u64)> = outs.iter().map(|o| (o.start, o.end - o.start)).collect();
    spans.push((sigreturn.0, sigreturn.1 - sigreturn.0));
    let mut eh = gimli::write::EhFrame(EndianVec::new(LittleEndian));
    frames.write_eh_frame(&mut eh).map_err(UnwindError::Write)?;
    let mut eh_bytes = eh.0.into_vec();
    eh_bytes.extend_from_slice(&[0; 4]);

    // Read it back: the FDE addresses for the table, and a check that what
    // we wrote parses and covers what we planned.
    let bases = BaseAddresses::default().set_eh_frame(eh_vaddr);
    let back = EhFrame::new(&eh_bytes, LittleEndian);
    let mut entries = back.entries(&bases);
    let mut table = Vec::with_capacity(count);
    while let Some(e) = entries.next().map_err(|source| UnwindError::Read {
        what: "new .eh_frame",
        source,
    })? {
        if let CieOrFde::Fde(p) = e {
            let fde = p
                .parse(EhFrame::cie_from_offset)
                .map_err(|source| UnwindError::Read {
                    what: "new .eh_frame FDE",
                    source,
                })?;
            let &(start, _) = spans
                .get(table.len())
                .filter(|&&(start, len)| start == fde.initial_address() && len == fde.len())
                .ok_or(UnwindError::Inconsistent(
                    "the new .eh_frame does not read back as written",
                ))?;
            table.push((start, eh_vaddr + fde.offset() as u64));
        }
    }
    if table.len() != count {
        return Err(UnwindError::Inconsistent(
            "the new .eh_frame does not read back as written",
        ));
    }
    table.sort_unstable();
    if let Some(w) = table.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(UnwindError::TwoFdes(w[0].0));
    }
    bytes.extend_from_slice(&eh_bytes);

    // The header.
    let rel = |a: u64, from: u64| -> Res<[u8; 4]> {
        i32::try_from(a.wrapping_sub(from) as i64)
            .map(i32::to_le_bytes)
            .map_err(|_| UnwindError::HeaderRange(a))
    };
    let mut hdr = vec![1u8];
    hdr.extend_from_slice(&HDR_ENCODINGS);
    hdr.extend_from_slice(&rel(eh_vaddr, vaddr + 4)?);
    hdr.extend_from_slice(&(count as u32).to_le_bytes());
    for &(loc, fde) in &table {
        hdr.extend_from_slice(&rel(loc, vaddr)?);
        hdr.extend_from_slice(&rel(fde, vaddr)?);
    }
    debug_assert_eq!(hdr.len() as u64, hdr_size);
    bytes[..hdr.len()].copy_from_slice(&hdr);
    Ok(Unwind {
        eh_frame: (eh_vaddr, vaddr + bytes.len() as u64),
        bytes,
        hdr_vaddr: vaddr,
        hdr_size,
        fdes: news.len(),
        wrapper,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use aetrace_analysis::{ProcKind, Program};
    use gimli::{CfaRule, EhFrameHdr, FrameDescriptionEntry as Fde, RegisterRule, UnwindContext};
    use std::path::Path;

    /// Where the shifted copies go: far from the module, like the real ones.
    const DELTA: u64 = 0x40_0000;

    fn fdes<'a>(eh: &EhFrame<Slice<'a>>, bases: &BaseAddresses) -> Vec<Fde<Slice<'a>>> {
        let mut out = Vec::new();
        let mut it = eh.entries(bases);
        while let Some(e) = it.next().unwrap() {
            if let CieOrFde::Fde(p) = e {
                out.push(p.parse(EhFrame::cie_from_offset).unwrap());
            }
        }
        out.sort_by_key(|f| f.initial_address());
        out
    }

    fn find<'f, 'a>(fdes: &'f [Fde<Slice<'a>>], a: u64) -> Option<&'f Fde<Slice<'a>>> {
        let i = fdes
            .partition_point(|f| f.initial_address() <= a)
            .checked_sub(1)?;
        fdes[i].contains(a).then(|| &fdes[i])
    }

    /// The row at `a` as gimli's own evaluator computes it, expressions as
    /// their bytes (their section offsets differ between the tables).
    fn row(eh: &EhFrame<Slice<'_>>, bases: &BaseAddresses, fde: &Fde<Slice<'_>>, a: u64) -> String {
        let mut ctx = UnwindContext::new();
        let r = fde.unwind_info_for_address(eh, bases, &mut ctx, a).unwrap();
        let bytes = |e: &gimli::UnwindExpression<usize>| e.get(eh).unwrap().0.slice().to_vec();
        let cfa = match r.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => format!("{}{offset:+}", register.0),
            CfaRule::Expression(e) => format!("{:?}", bytes(e)),
        };
        let mut regs: Vec<String> = r
            .registers()
            .map(|(reg, rule)| match rule {
                RegisterRule::Expression(e) => format!("{}=expr{:?}", reg.0, bytes(e)),
                RegisterRule::ValExpression(e) => format!("{}=val{:?}", reg.0, bytes(e)),
                other => format!("{}={other:?}", reg.0),
            })
            .collect();
        regs.sort();
        format!("cfa={cfa} {} args={}", regs.join(" "), r.saved_args_size())
    }

    /// The single-range procedures of `.text` "copied" `DELTA` higher
    /// (same bytes, landing stubs at the shifted pads): `.text`, its bytes,
    /// the copies.
    fn shifted(prog: &Program) -> (&aetrace_analysis::elf::Section, &[u8], Vec<ProcCopy>) {
        let m = &prog.module;
        let text = m.section(".text").unwrap();
        let code = m.section_bytes(text).unwrap();
        let copies = prog
            .procs
            .values()
            .filter(|p| p.kind == ProcKind::Function && p.ranges.len() == 1)
            .filter(|p| text.contains(p.start) && p.end <= text.end())
            .filter_map(|p| {
                let cfg = p.cfg.as_ref().ok()?;
                let mut insn_map: Vec<(u64, u64)> = cfg
                    .blocks
                    .values()
                    .flat_map(|b| b.insns.iter().map(move |&o| b.start + u64::from(o)))
                    .map(|a| (a, a + DELTA))
                    .collect();
                insn_map.sort_unstable();
                Some(ProcCopy {
                    start: p.start,
                    new_start: p.start + DELTA,
                    new_end: p.end + DELTA,
                    leads: insn_map.iter().map(|&(_, c)| c).collect(),
                    insn_map,
                    landing: p.landing_pads.iter().map(|&a| (a, a + DELTA)).collect(),
                    sigmap: Vec::new(),
                })
            })
            .collect();
        (text, code, copies)
    }

    /// The unwind segment of `copies` of `prog`'s `text` (`shifted`), at
    /// the first page after the moved text (`sigreturn` below it), and
    /// its address.
    fn built(
        prog: &Program,
        copies: &[ProcCopy],
        text: &aetrace_analysis::elf::Section,
        code: &[u8],
    ) -> (Unwind, u64) {
        let vaddr = (text.end() + DELTA).next_multiple_of(4096);
        let sigreturn = (vaddr - 32, vaddr - 16);
        let u = build(
            &prog.module,
            copies,
            code,
            text.addr + DELTA,
            vaddr,
            sigreturn,
        )
        .unwrap();
        (u, vaddr)
    }

    /// With shifted copies, every new LSDA is its original moved by
    /// `DELTA`: same call sites (minus those covering no instruction), same
    /// landing pads, actions and type entries (re-encoded where they now
    /// are), read back by the parser that matches an independent reader
    /// (`tests/rewrite_unwind.rs`).
    #[test]
    fn shifted_lsdas_keep_their_handlers() {
        let prog = Program::open(Path::new("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")).unwrap();
        let m = &prog.module;
        let (text, code, copies) = shifted(&prog);
        let (u, vaddr) = built(&prog, &copies, text, code);
        let module_fdes = original_fdes(m).unwrap();
        let relocs = lsda::LoadRelocs::of(m);
        let (new_eh, new_bases) = (
            EhFrame::new(&u.bytes[(u.eh_frame.0 - vaddr) as usize..], LittleEndian),
            BaseAddresses::default().set_eh_frame(u.eh_frame.0),
        );
        let (mut translated, mut typed) = (0, 0);
        for f in fdes(&new_eh, &new_bases) {
            let start = f.initial_address();
            let Some(gimli::Pointer::Direct(at)) = f.lsda() else {
                continue;
            };
            if start < text.end() {
                continue; // a re-emitted original: its LSDA is the original
            }
            let orig = module_fdes
                .iter()
                .find(|o| o.start + DELTA == start)
                .expect("a copy's FDE starts where its original moved");
            let old = Lsda::parse(m, &relocs, orig.lsda.unwrap(), orig.start).unwrap();
            let off = (at - vaddr) as usize;
            let new = Lsda::parse_bytes(&u.bytes[off..], at, start, &|_, _| false).unwrap();
            let c = copies
                .iter()
                .find(|c| c.new_start <= start && start < c.new_end)
                .unwrap();
            let moved: Vec<lsda::CallSite> = old
                .call_sites
                .iter()
                .filter(|cs| {
                    c.insn_map
                        .iter()
                        .any(|&(o, _)| o >= cs.start && o < cs.start + cs.len)
                })
                .map(|cs| lsda::CallSite {
                    start: cs.start + DELTA,
                    landing_pad: cs.landing_pad.map(|p| p + DELTA),
                    ..cs.clone()
                })
                .collect();
            assert_eq!(new.call_sites, moved, "FDE {start:#x}");
            assert_eq!((&new.actions, &new.types), (&old.actions, &old.types));
            translated += 1;
            typed += usize::from(new.types.as_ref().is_some_and(|t| !t.entries.is_empty()));
        }
        assert!(
            translated > 100 && typed > 10,
            "{translated} LSDAs, {typed} typed"
        );
    }

    /// Copies that are the originals moved by `DELTA`: at every
    /// instruction, gimli's evaluation of the copy's FDE and of the
    /// re-emitted original equal its evaluation of the original FDE, and
    /// the new header finds every FDE.
    #[test]
    fn shifted_copies_unwind_like_the_originals() {
        let prog = Program::open(Path::new("/usr/bin/gzip")).unwrap();
        let m = &prog.module;
        let (text, code, copies) = shifted(&prog);
        assert!(copies.len() > 100);
        let (u, vaddr) = built(&prog, &copies, text, code);
        assert!(
            u.fdes * 10 >= copies.len() * 9,
            "{} FDEs for {} copies",
            u.fdes,
            copies.len()
        );

        let (old_eh, old_bases, _) = lsda::eh_frame(m).unwrap();
        let new_bytes = &u.bytes[(u.eh_frame.0 - vaddr) as usize..];
        let new_eh = EhFrame::new(new_bytes, LittleEndian);
        let new_bases = BaseAddresses::default().set_eh_frame(u.eh_frame.0);
        let (olds, news) = (fdes(&old_eh, &old_bases), fdes(&new_eh, &new_bases));
        // (And `sigreturn`'s.)
        assert_eq!(news.len(), olds.len() + u.fdes + 1);
        let mut checked = 0;
        for c in &copies {
            for &(old, new) in &c.insn_map {
                // The copy, and the original re-emitted in the new table.
                for (at, what) in [(new, "copy"), (old, "re-emitted original")] {
                    match (find(&olds, old), find(&news, at)) {
                        (None, None) => {}
                        (Some(o), Some(n)) => {
                            assert_eq!(
                                row(&old_eh, &old_bases, o, old),
                                row(&new_eh, &new_bases, n, at),
                                "instruction {old:#x} ({what})"
                            );
                            checked += 1;
                        }
                        (o, n) => panic!(
                            "{old:#x} ({what}): FDE {} originally, {} now",
                            o.is_some(),
                            n.is_some()
                        ),
                    }
                }
            }
        }
        assert!(checked > 10000, "{checked}");
        for o in &olds {
            let n = find(&news, o.initial_address()).unwrap();
            assert_eq!(
                (n.initial_address(), n.len()),
                (o.initial_address(), o.len())
            );
        }

        // The header: a sorted table finding every FDE of the new table.
        let hdr_bytes = &u.bytes[..u.hdr_size as usize];
        let hbases = BaseAddresses::default()
            .set_eh_frame_hdr(vaddr)
            .set_eh_frame(u.eh_frame.0);
        let hdr = EhFrameHdr::new(hdr_bytes, LittleEndian)
            .parse(&hbases, 8)
            .unwrap();
        assert_eq!(hdr.eh_frame_ptr(), gimli::Pointer::Direct(u.eh_frame.0));
        let table = hdr.table().unwrap();
        for f in &news {
            let p = table.lookup(f.initial_address(), &hbases).unwrap();
            assert_eq!(p, gimli::Pointer::Direct(u.eh_frame.0 + f.offset() as u64));
        }
    }

    /// ld's `.plt` CFA expression, `rsp + 8 + (((rip & 15) >= 11) << 3)`,
    /// is evaluated for each original address; other expressions reading
    /// rip are refused, expressions not reading it are kept.
    #[test]
    fn rip_relative_cfa_expressions_are_evaluated_where_they_were() {
        let plt = [0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
        assert_eq!(uses_rip(&plt), Some(true));
        let mut row = Row::empty();
        row.cfa = Cfa::Expr(plt.to_vec());
        for (rip, cfa) in [(0x1030, 8), (0x103a, 8), (0x103b, 16), (0x103f, 16)] {
            let r = relocated_row(&row, rip).unwrap();
            assert_eq!(r.cfa, Cfa::RegOff(DW_RSP, cfa), "rip {rip:#x}");
        }
        // deref of rip: not rsp + c.
        row.cfa = Cfa::Expr(vec![0x80, 0, 0x06]);
        assert!(relocated_row(&row, 0x1000).is_err());
        // rsp + 16, deref: no rip, kept as is.
        row.cfa = Cfa::Expr(vec![0x77, 16, 0x06]);
        assert_eq!(relocated_row(&row, 0x1000).unwrap(), row);
        // An unknown operation cannot be scanned.
        row.cfa = Cfa::Expr(vec![0xe0]);
        assert!(relocated_row(&row, 0x1000).is_err());
    }

    /// Explicit `DW_CFA_undefined` survives (it marks the outermost frame,
    /// `_start`), remember/restore is resolved into plain rules, and
    /// returning to the CIE's rule is a `restore`.
    #[test]
    fn transitions_keep_undefined_and_restore() {
        let mut initial = Row::empty();
        initial.cfa = Cfa::RegOff(7, 8);
        initial.regs.insert(16, Rule::Offset(-8));
        let mut a = initial.clone();
        a.regs.insert(16, Rule::Undefined);
        a.cfa = Cfa::RegOff(7, 16);
        let mut out = Vec::new();
        transition(&initial, &a, &initial, &mut out).unwrap();
        assert_eq!(out, vec![W::CfaOffset(16), W::Undefined(Register(16))]);
        out.clear();
        transition(&a, &initial, &initial, &mut out).unwrap();
        assert_eq!(out, vec![W::CfaOffset(8), W::Restore(Register(16))]);
        let mut lost = a.clone();
        lost.regs.clear();
        assert!(transition(&a, &lost, &initial, &mut Vec::new()).is_err());
        // A callee-saved register the CIE saves, with no rule in the row
        // (a `.cold` part's CIE): unchanged, `same_value`.
        let mut cold = initial.clone();
        cold.regs.insert(3, Rule::Offset(-40));
        let mut after = cold.clone();
        after.regs.remove(&3);
        out.clear();
        transition(&cold, &after, &cold, &mut out).unwrap();
        assert_eq!(out, vec![W::SameValue(Register(3))]);
    }
}
