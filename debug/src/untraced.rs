//! Passages through untraced code, as gdb is shown them. A trace has no
//! positions in untraced code (libc without `--libs`), yet where it calls
//! traced code back (qsort into a comparator, `raise` into a signal
//! handler, libc into `main`) gdb natively stops there: `finish` or `next`
//! out of the callback, `reverse-finish` out of it, and `step` at the call
//! steps over the untraced function because it has no line table. So the
//! stub stands one synthetic position for each such passage (two for
//! [`Passage::SigreturnedIntoUntraced`]), between the traced instruction
//! that left for untraced code and the next traced one (`crate::stack`
//! finds them), with the pc in a made-up function
//! `<untraced>` at [`UNTRACED`] whose symbol `aetrace.py` gives gdb:
//! [`Passage::Entered`] at its start (traced code called or jumped into
//! untraced code that called back), [`Passage::Returned`] one byte in (a
//! callback returned into the untraced code that called it). gdb's own
//! stepping logic then does what it does natively: a `step` into a
//! function without line table sets its step-resume breakpoint at the
//! caller, a reverse step over it runs back to the function's start, and
//! a callback's caller frame is the untraced code (`finish` stops there).
//!
//! Invariants: a passage is only ever placed where untraced code called
//! traced code back or a callback returned into it (a call into libc that
//! returns without calling back has no passage: `stepi` then goes from
//! the call's last traced instruction to its return address, as before);
//! the synthetic function lies in canonical user space, outside every
//! module a trace maps (checked by the stub's image), and no register or
//! memory byte is served for it.

/// The start of the made-up function `<untraced>`: the pc of
/// [`Passage::Entered`].
pub const UNTRACED: u64 = 0x7ae7_ace0_0000;
/// The pc of [`Passage::Returned`].
pub const RETURNED: u64 = UNTRACED + 1;
/// The pc of a signal handler's caller frame, the restorer (libc's
/// `__restore_rt`, natively): `aetrace.py` gives gdb CFI for it that marks
/// a signal frame ("S"), so gdb shows `<signal handler called>` there and
/// looks up the interrupted frame's function at its pc, not at pc - 1,
/// and a function symbol of its own, `<restorer>`, from here to the end
/// (`next` from there steps out of the restorer alone).
pub const SIGRETURN: u64 = UNTRACED + 8;
/// The function's size (gdb needs bounds to step out of it).
pub const UNTRACED_SIZE: u64 = 16;

/// Whether `pc` is in the made-up function.
pub fn is_untraced(pc: u64) -> bool {
    (UNTRACED..UNTRACED + UNTRACED_SIZE).contains(&pc)
}

/// A passage through untraced code, by how control got there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passage {
    /// Traced code called or jumped into untraced code.
    Entered,
    /// A callback returned into the untraced code that called it.
    Returned,
    /// A signal handler returned into the restorer: its pc is the
    /// handler's caller's ([`SIGRETURN`]), where gdb's `finish` and `next`
    /// out of the handler stop.
    Sigreturned,
    /// A signal handler returned into the restorer, which returned into
    /// the untraced code the signal interrupted (libc's `raise`), which
    /// returned to traced code: two positions, as natively two frames,
    /// the restorer's ([`SIGRETURN`], where `finish` out of the handler
    /// stops) and the untraced code's ([`RETURNED`], where `next` off the
    /// handler's end stops).
    SigreturnedIntoUntraced,
}

impl Passage {
    /// How many positions (stops of `stepi`) the passage has.
    pub fn positions(self) -> u8 {
        match self {
            Passage::SigreturnedIntoUntraced => 2,
            _ => 1,
        }
    }

    /// The synthetic pc of the passage's `i`th position (its last one's
    /// if it has fewer).
    pub fn pc(self, i: u8) -> u64 {
        match self {
            Passage::Entered => UNTRACED,
            Passage::Returned => RETURNED,
            Passage::Sigreturned => SIGRETURN,
            Passage::SigreturnedIntoUntraced if i == 0 => SIGRETURN,
            Passage::SigreturnedIntoUntraced => RETURNED,
        }
    }
}

/// Where a call or jump goes, as its encoding says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum To {
    /// A relative target.
    Direct(u64),
    /// Through a rip-relative pointer at this address: an import's GOT
    /// slot (PLT stubs, `-fno-plt` calls), or a function pointer in the
    /// module's data (gzip's `call *work(%rip)`), which the caller tells
    /// apart by the module's GOT sections.
    Got(u64),
    /// Through a register or other memory (function pointers, jump
    /// tables): the target is where control went.
    Other,
}

/// How an instruction that ends a block transfers control.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// A call, returning to `ret`.
    Call {
        /// The return address (the next instruction).
        ret: u64,
        /// The callee.
        to: To,
    },
    /// An unconditional jump.
    Jump(To),
    /// A return.
    Ret,
}

/// Decodes `insn`, the bytes of the whole instruction at `addr`: how it
/// transfers control, if it is a call, an unconditional jump or a return.
pub fn decode(addr: u64, insn: &[u8]) -> Option<Exit> {
    // Legacy prefixes a branch may carry (bnd, notrack, rep for `repz
    // ret`, a segment override) and REX.
    let skip = insn
        .iter()
        .position(|b| !matches!(b, 0xf2 | 0xf3 | 0x2e | 0x3e | 0x40..=0x4f))?;
    let end = addr + insn.len() as u64;
    let rel = |n: usize| -> Option<u64> {
        let b = insn.get(skip + 1..skip + 1 + n)?;
        let v = match n {
            1 => i64::from(b[0] as i8),
            _ => i64::from(i32::from_le_bytes(b.try_into().ok()?)),
        };
        Some(end.wrapping_add(v as u64))
    };
    // A rip-relative operand (mod 00, r/m 101): its disp32 follows ModRM.
    let via = |modrm: u8| -> Option<To> {
        match modrm & 0xc7 {
            0x05 => {
                let d = insn.get(skip + 2..skip + 6)?;
                let d = i64::from(i32::from_le_bytes(d.try_into().ok()?));
                Some(To::Got(end.wrapping_add(d as u64)))
            }
            _ => Some(To::Other),
        }
    };
    match insn[skip] {
        0xe8 => Some(Exit::Call {
            ret: end,
            to: To::Direct(rel(4)?),
        }),
        0xe9 => Some(Exit::Jump(To::Direct(rel(4)?))),
        0xeb => Some(Exit::Jump(To::Direct(rel(1)?))),
        0xc2 | 0xc3 => Some(Exit::Ret),
        0xff => {
            let modrm = *insn.get(skip + 1)?;
            match (modrm >> 3) & 7 {
                2 => Some(Exit::Call {
                    ret: end,
                    to: via(modrm)?,
                }),
                4 => Some(Exit::Jump(via(modrm)?)),
                _ => None,
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{decode, Exit, To};

    /// The encodings compilers and linkers emit for calls, jumps and
    /// returns, with their targets.
    #[test]
    fn decodes_calls_jumps_and_returns() {
        let at = 0x1000;
        let cases: &[(&[u8], Option<Exit>)] = &[
            // call rel32 (-0x10)
            (
                &[0xe8, 0xf0, 0xff, 0xff, 0xff],
                Some(Exit::Call {
                    ret: 0x1005,
                    to: To::Direct(0xff5),
                }),
            ),
            // call *0x2fca(%rip): a -fno-plt call
            (
                &[0xff, 0x15, 0xca, 0x2f, 0, 0],
                Some(Exit::Call {
                    ret: 0x1006,
                    to: To::Got(0x3fd0),
                }),
            ),
            // call *%r11, call *0x8(%rax)
            (
                &[0x41, 0xff, 0xd3],
                Some(Exit::Call {
                    ret: 0x1003,
                    to: To::Other,
                }),
            ),
            (
                &[0xff, 0x50, 0x08],
                Some(Exit::Call {
                    ret: 0x1003,
                    to: To::Other,
                }),
            ),
            // a PLT stub's jmp *GOT(%rip), with IBT's bnd prefix
            (
                &[0xf2, 0xff, 0x25, 0xca, 0x2f, 0, 0],
                Some(Exit::Jump(To::Got(0x3fd1))),
            ),
            // jmp rel32, jmp rel8, notrack jmp *%rax
            (&[0xe9, 0x0b, 0, 0, 0], Some(Exit::Jump(To::Direct(0x1010)))),
            (&[0xeb, 0xfe], Some(Exit::Jump(To::Direct(0x1000)))),
            (&[0x3e, 0xff, 0xe0], Some(Exit::Jump(To::Other))),
            // ret, repz ret, ret $8
            (&[0xc3], Some(Exit::Ret)),
            (&[0xf3, 0xc3], Some(Exit::Ret)),
            (&[0xc2, 0x08, 0x00], Some(Exit::Ret)),
            // jne rel8, push *(%rax), a truncated call
            (&[0x75, 0x02], None),
            (&[0xff, 0x30], None),
            (&[0xe8, 0x00], None),
        ];
        for (insn, want) in cases {
            assert_eq!(decode(at, insn), *want, "{insn:02x?}");
        }
    }
}
