//! Jump-table recognition by a small forward symbolic evaluation of the
//! instructions that lead to an indirect `jmp`.
//!
//! The slice is one path of blocks back from the jump (no calls in
//! between). Each register and each stack slot (`[rsp+d]`, `[rbp+d]`, for
//! `-O0` code) holds a symbolic value: a linear form `sym*scale + off` over
//! opaque symbols, a load from such an address, or a loaded entry plus a
//! constant. A symbol may carry a range ([`crate::interval::Range`], a
//! wrapped interval) from how it was made (`and` masks, `movzx`,
//! `pmovmskb`, `bsf`, sums of ranged values) and from the branches the path
//! takes on compares (`cmp i, N; ja default` on the fall-through path gives
//! `i <= N`; `cmp %r8, %rdx; jb` not taken gives `r8 <= max(rdx)`; signed
//! conditions after `sub`/`add` when no overflow is possible); the
//! difference of two symbols may carry one too (`cmp %eax, %ecx; ja`). A
//! contradiction drops the path. The recognised shapes are those of gcc and
//! clang at -O0 to -O3, PIC or not, and glibc's hand-written string
//! functions (docs/cfg.md, section 5):
//!
//! - `jmp [T + i*8]`, `mov r, [T + i*8]; jmp r` (absolute 8-byte entries,
//!   RELATIVE-relocated in PIE/shared objects);
//! - `movsxd r, [T + i*4]; add r, B; jmp r` (int32 entries relative to B,
//!   usually B = T), in any register arrangement, including the `-O0`
//!   `mov eax, [rdx+rax]; cdqe` form;
//! - an index that is itself a byte loaded from a bounded table
//!   (`movzx i, byte [T2 + j]`, glibc's printf), bounded by that table's
//!   largest entry;
//! - an index `i + c` compared as a whole 64-bit register (`sub $4, %rax;
//!   cmp $0x16, %rax; ja`): the table starts `scale * c` before the
//!   address's constant part;
//! - an index with a proven range `lo..=lo+n` (`bsf(mask) + 16 - (p & 15)`
//!   in glibc's `strcpy`): entries `lo..=lo+n`, described from the table's
//!   base when the entries below `lo` are labels too;
//! - a label plus a bounded multiple of a variable (`memmove-ssse3`):
//!   `Computed` with every value the bound allows.
//!
//! Invariant: a table is returned only with a proven bound; anything else is
//! `Unresolved` (with the missing piece named) or, for a jump through a
//! pointer loaded without an index, `TailCall`. Nothing is guessed.

use std::collections::HashMap;

use iced_x86::{
    ConditionCode, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register,
};

use crate::cfg::JumpResolution;
use crate::elf::Module;
use crate::interval::Range;

/// The reason given for a jump to a label of the procedure plus a variable
/// (glibc's `lea L(%rip), %r9; shl $6, %ecx; add %r9, %rcx; jmp *%rcx`):
/// such a procedure's targets are not its address-taken labels.
pub const LABEL_ARITHMETIC: &str = "target is a label plus a variable";

/// The largest table we accept (a bound above this is not a switch).
const MAX_ENTRIES: u64 = 1 << 16;

/// `sym * scale + off`, or the constant `off` when `sym` is `None`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Lin {
    sym: Option<(u32, u64)>,
    off: u64,
}

impl Lin {
    fn konst(c: u64) -> Lin {
        Lin { sym: None, off: c }
    }
    fn add(self, o: Lin) -> Option<Lin> {
        let sym = match (self.sym, o.sym) {
            (None, s) | (s, None) => s,
            (Some((a, x)), Some((b, y))) if a == b => Some((a, x.wrapping_add(y))),
            _ => return None,
        };
        Some(Lin {
            sym,
            off: self.off.wrapping_add(o.off),
        })
    }
    fn mul(self, k: u64) -> Lin {
        Lin {
            sym: self.sym.map(|(s, x)| (s, x.wrapping_mul(k))),
            off: self.off.wrapping_mul(k),
        }
    }
    fn plain_sym(self) -> Option<u32> {
        match self {
            Lin {
                sym: Some((s, 1)),
                off: 0,
            } => Some(s),
            _ => None,
        }
    }
}

/// An address `a*x + b*y + off` of two distinct symbols, `x < y`.
type PairAddr = ((u32, u64), (u32, u64), u64);

/// What the flags say: those of `a - b` compared at `width` bytes (`cmp
/// a, b`; `sub r, imm` with `a` the old value; `test r, r` as `r - 0`), or,
/// after an `add` that cannot overflow as a signed number, ZF, SF and OF of
/// `a - 0` but not CF (`carry: false`).
#[derive(Clone, Copy, Debug)]
struct Flags {
    a: Val,
    b: Val,
    width: usize,
    carry: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Val {
    Lin(Lin),
    /// `size` bytes loaded from `addr`, zero- or sign-extended.
    Load {
        addr: Lin,
        size: u8,
        signed: bool,
    },
    /// A loaded entry plus a constant.
    Rel {
        addr: Lin,
        size: u8,
        signed: bool,
        add: u64,
    },
}

/// What is known about a register on entry to the slice, from all the
/// definitions that reach it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryFact {
    /// It holds this constant.
    Const(u64),
    /// It is a `pmovmskb` mask of this many bits.
    Bits(u32),
    /// It was loaded as 8 bytes from a pointer field or a global (no index,
    /// not the stack): in PIC code, a code pointer.
    Pointer,
}

/// Bytes of the module's image by virtual address.
pub trait Memory: Sync {
    /// The `len` bytes at link-time address `addr`, or `None` if they are not all in the image.
    fn bytes_at(&self, addr: u64, len: u64) -> Option<&[u8]>;
}

impl Memory for Module {
    fn bytes_at(&self, addr: u64, len: u64) -> Option<&[u8]> {
        Module::bytes_at(self, addr, len)
    }
}

/// The machine needs of the evaluation: table bytes and relocations.
pub struct TableReader<'a> {
    /// The module's image, to read the tables from.
    pub memory: &'a dyn Memory,
    /// Position-independent code (PIE, shared object): its jump tables hold
    /// 32-bit offsets, never 8-byte addresses loaded through a register
    /// base, so such a load is a code pointer.
    pub pic: bool,
    /// RELATIVE relocations: slot -> value (absolute tables of PIE/shared
    /// objects are zero in the file).
    pub relative: &'a HashMap<u64, u64>,
}

impl TableReader<'_> {
    fn u64_at(&self, a: u64) -> Option<u64> {
        match self.relative.get(&a) {
            Some(&v) => Some(v),
            None => Some(u64::from_le_bytes(
                self.memory.bytes_at(a, 8)?.try_into().ok()?,
            )),
        }
    }
    fn u32_at(&self, a: u64) -> Option<u32> {
        Some(u32::from_le_bytes(
            self.memory.bytes_at(a, 4)?.try_into().ok()?,
        ))
    }
    fn u16_at(&self, a: u64) -> Option<u16> {
        Some(u16::from_le_bytes(
            self.memory.bytes_at(a, 2)?.try_into().ok()?,
        ))
    }
    fn u8_at(&self, a: u64) -> Option<u8> {
        self.memory.bytes_at(a, 1).map(|b| b[0])
    }
}

struct Sim<'o> {
    regs: HashMap<Register, Val>,
    /// Values of registers at the start of the slice, when every definition
    /// reaching it loads the same constant (a table base hoisted out of a
    /// loop).
    entry_value: &'o mut dyn FnMut(Register) -> Option<EntryFact>,
    /// Narrow views (`al`, `eax` of a non-plain value) and loads through a
    /// symbolic pointer, memoised so that re-reading gives the same symbol.
    memo: HashMap<(Val, u8), Val>,
    /// Loads from an address of two symbols, `a*x + b*y + off` (terms in
    /// symbol order), memoised like `memo` until memory is written: the
    /// range encoder of liblzma compares `0x30(%rax,%rdx,4)` and then
    /// loads the same word as `(%rax,%rcx,4)` with `rcx = rdx + 12`.
    pair_loads: HashMap<(PairAddr, u8), Val>,
    /// Symbols that are values loaded from memory without an index (or
    /// demangled from one with `ror`/`xor %fs:`).
    pointers: std::collections::HashSet<u32>,
    /// 32-bit `value + constant` and sign extensions, memoised so that the
    /// compare and the index computed separately meet in one symbol.
    arith: HashMap<(Val, u64, u8), Val>,
    /// `sym -> s` when `sym` is the sign extension of the 32-bit `s`.
    sext_of: HashMap<u32, u32>,
    slots: HashMap<(Register, u64), Val>,
    next_sym: u32,
    /// The values a symbol can hold on this path (absent: any), from how
    /// it was made (`and` masks, `bsf`, `pmovmskb`, `movzx`, sums of
    /// ranges) and the branches taken on it (`cmp i, N; ja` not taken:
    /// `i <= N`; `sub $4, %rax; cmp $0x16, %rax; ja`: `rax - 4 <= 0x16`).
    ranges: HashMap<u32, Range>,
    /// `s -> (x, y, c)`: the symbol `s` is `x - y + c` (glibc's strcmp:
    /// `lea 0xf(%rax), %r9; sub %rcx, %r9`).
    sums: HashMap<u32, (u32, u32, u64)>,
    /// `(x, y) -> ` the values `x - y` can hold, from the branches taken
    /// on compares of `x` and `y` (`cmp %eax, %ecx; ja` taken: `ecx - eax
    /// >= 1`). Symbols are values, so these facts never go stale.
    diffs: HashMap<(u32, u32), Range>,
    /// `pmovmskb` masks (and masks shifted right): see `Bsf` in `step`.
    masks: std::collections::HashSet<u32>,
    /// Symbols defined by `movzx r, byte/word [addr]`.
    small_loads: HashMap<u32, (Lin, u8)>,
    flags: Option<Flags>,
    /// Whether the last `test r, r` or `cmp` of constants set ZF.
    last_zero: Option<bool>,
    /// A branch on the path went the way its constant flags forbid.
    infeasible: bool,
    info: InstructionInfoFactory,
}

impl Sim<'_> {
    fn fresh(&mut self) -> Val {
        self.next_sym += 1;
        Val::Lin(Lin {
            sym: Some((self.next_sym, 1)),
            off: 0,
        })
    }

    fn read_full(&mut self, full: Register) -> Val {
        if let Some(&v) = self.regs.get(&full) {
            return v;
        }
        let v = match (self.entry_value)(full) {
            Some(EntryFact::Const(c)) => Val::Lin(Lin::konst(c)),
            Some(EntryFact::Bits(b)) => {
                let v = self.fresh_in(Range::bits(b));
                if let Some(s) = Self::sym_of(v) {
                    self.masks.insert(s);
                }
                v
            }
            Some(EntryFact::Pointer) => {
                let v = self.fresh();
                if let Some(s) = Self::sym_of(v) {
                    self.pointers.insert(s);
                }
                v
            }
            None => self.fresh(),
        };
        self.regs.insert(full, v);
        v
    }

    /// A fresh symbol holding a value of `range`.
    fn fresh_in(&mut self, range: Range) -> Val {
        let v = self.fresh();
        if let (Some(s), false) = (Self::sym_of(v), range.is_full()) {
            self.ranges.insert(s, range);
        }
        v
    }

    /// The values `v` can hold.
    fn range_of(&self, v: Val) -> Range {
        match v {
            Val::Lin(Lin { sym: None, off }) => Range::konst(off),
            Val::Lin(Lin {
                sym: Some((s, k)),
                off,
            }) => self
                .ranges
                .get(&s)
                .copied()
                .unwrap_or(Range::FULL)
                .mul(k)
                .add_const(off),
            Val::Load {
                size, signed: true, ..
            } => Range::signed_bits(8 * u32::from(size)),
            Val::Load { size, .. } => Range::bits(8 * u32::from(size)),
            Val::Rel { .. } => Range::FULL,
        }
    }

    /// Narrows what `v` can hold to `r` (when `v` is `±sym + c`, through
    /// its symbol). When the two contradict after a 64-bit compare, the path
    /// cannot run: like a branch on constant flags, it is dropped.
    fn refine(&mut self, v: Val, r: Range, strict: bool) {
        let Val::Lin(Lin {
            sym: Some((s, k)),
            off,
        }) = v
        else {
            return;
        };
        let r = r.add_const(off.wrapping_neg());
        let r = match k {
            1 => r,
            u64::MAX => r.neg(),
            _ => return,
        };
        let old = self.ranges.get(&s).copied().unwrap_or(Range::FULL);
        match old.meet(r) {
            Some(m) => {
                self.ranges.insert(s, m);
            }
            None if strict => self.infeasible = true,
            // See `branch`: the branch's range wins.
            None => {
                self.ranges.insert(s, r);
            }
        }
    }

    fn arith(&mut self, v: Val, c: u64, op: u8) -> Val {
        if let Some(&r) = self.arith.get(&(v, c, op)) {
            return r;
        }
        let r = self.fresh();
        self.arith.insert((v, c, op), r);
        // A 32-bit `v + c` that does not cross 2^32 keeps `v`'s range.
        let vr = self.range_of(v);
        if op == 1 && vr.umax() <= u64::from(u32::MAX) && c <= u64::from(u32::MAX) {
            // Both below 2^32: the 64-bit sum lies in [0, 2^33) and does
            // not wrap; the 32-bit result is it, or it minus 2^32.
            let sum = vr.add_const(c);
            let sum = if sum.hi() <= u64::from(u32::MAX) {
                Some(sum)
            } else {
                (sum.lo > u64::from(u32::MAX)).then(|| sum.add_const(0u64.wrapping_sub(1 << 32)))
            };
            if let (Some(sum), Some(s)) = (sum, Self::sym_of(r)) {
                self.ranges.insert(s, sum);
            }
        }
        r
    }

    fn sym_of(v: Val) -> Option<u32> {
        match v {
            Val::Lin(l) => l.plain_sym(),
            _ => None,
        }
    }

    fn memoised(&mut self, key: (Val, u8)) -> Val {
        if let Some(&v) = self.memo.get(&key) {
            return v;
        }
        // A narrow view or a narrow load is zero-extended.
        let v = self.fresh_in(Range::bits(8 * u32::from(key.1)));
        self.memo.insert(key, v);
        v
    }

    /// The value of `r` as its width reads it.
    fn read(&mut self, r: Register) -> Val {
        let v = self.read_full(r.full_register());
        self.narrow(v, r.size())
    }

    /// The zero-extended low `size` bytes of `v`.
    fn narrow(&mut self, v: Val, size: usize) -> Val {
        match v {
            _ if size >= 8 => v,
            Val::Lin(Lin { sym: None, off }) => {
                Val::Lin(Lin::konst(off & ((1u64 << (8 * size)) - 1)))
            }
            // A value whose range fits the width is its own narrow view.
            Val::Lin(l)
                if l.sym.is_some()
                    && self.range_of(v).umax() <= Range::bits(8 * size as u32).hi() =>
            {
                v
            }
            // A 32-bit view of a symbol of unknown range is the symbol:
            // compilers compare and index with the same width, and `mov eI,
            // eI` zero-extends.
            Val::Lin(l) if size == 4 && l.plain_sym().is_some() && self.range_of(v).is_full() => v,
            Val::Load { addr, size: n, .. } if usize::from(n) <= size => Val::Load {
                addr,
                size: n,
                signed: false,
            },
            _ => self.memoised((v, size as u8)),
        }
    }

    fn write(&mut self, r: Register, v: Val) {
        let v = match r.size() {
            8 => v,
            4 => self.narrow(v, 4),
            _ => self.fresh(),
        };
        let full = r.full_register();
        self.regs.insert(full, v);
        if full == Register::RSP || full == Register::RBP {
            self.slots.retain(|(b, _), _| *b != full);
        }
    }

    fn slot_key(insn: &Instruction) -> Option<(Register, u64)> {
        let b = insn.memory_base();
        ((b == Register::RSP || b == Register::RBP)
            && insn.memory_index() == Register::None
            && insn.segment_prefix() == Register::None)
            .then(|| (b, insn.memory_displacement64()))
    }

    fn addr_of(&mut self, insn: &Instruction) -> Option<Lin> {
        if insn.segment_prefix() == Register::FS || insn.segment_prefix() == Register::GS {
            return None;
        }
        if insn.memory_base() == Register::RIP {
            return Some(Lin::konst(insn.ip_rel_memory_address()));
        }
        let mut a = Lin::konst(insn.memory_displacement64());
        for (r, scale) in [
            (insn.memory_base(), 1),
            (insn.memory_index(), u64::from(insn.memory_index_scale())),
        ] {
            if r == Register::None {
                continue;
            }
            if r.size() != 8 {
                return None;
            }
            let Val::Lin(l) = self.read_full(r) else {
                return None;
            };
            a = a.add(l.mul(scale))?;
        }
        Some(a)
    }

    /// The address of a memory operand that is a sum of two symbols
    /// (`disp(%base,%index,scale)` with both registers symbolic, each
    /// possibly `sym*k + c`), in a canonical form, so that two operands
    /// naming one address however the code formed it (`0x30(%rax,%rdx,4)`
    /// and `(%rax,%rcx,4)` with `rcx = rdx + 12`) give the same key.
    fn pair_addr_of(&mut self, insn: &Instruction) -> Option<PairAddr> {
        let (base, index) = (insn.memory_base(), insn.memory_index());
        if insn.segment_prefix() == Register::FS
            || insn.segment_prefix() == Register::GS
            || !base.is_gpr64()
            || !index.is_gpr64()
        {
            return None;
        }
        let (Val::Lin(b), Val::Lin(i)) = (self.read_full(base), self.read_full(index)) else {
            return None;
        };
        let i = i.mul(u64::from(insn.memory_index_scale()));
        let (Some(x), Some(y)) = (b.sym, i.sym) else {
            return None;
        };
        let off = insn
            .memory_displacement64()
            .wrapping_add(b.off)
            .wrapping_add(i.off);
        match x.0.cmp(&y.0) {
            std::cmp::Ordering::Less => Some((x, y, off)),
            std::cmp::Ordering::Greater => Some((y, x, off)),
            // One symbol: `addr_of` handles it.
            std::cmp::Ordering::Equal => None,
        }
    }

    /// Memory was written: loads read again may differ.
    fn forget_loads(&mut self) {
        self.memo.retain(|(v, _), _| !matches!(v, Val::Load { .. }));
        self.pair_loads.clear();
    }

    /// The value of a memory operand read as `size` bytes.
    fn load(&mut self, insn: &Instruction, size: u8, signed: bool) -> Val {
        if let Some(k) = Self::slot_key(insn) {
            if let Some(&v) = self.slots.get(&k) {
                return v;
            }
            let v = self.fresh();
            if let Some(p) = Self::sym_of(v) {
                self.pointers.insert(p);
            }
            self.slots.insert(k, v);
            return v;
        }
        match self.addr_of(insn) {
            // Through a pointer (no scaled index), or 8 bytes of a global
            // (`mov _rtld_global_ro@GOT(%rip), %rax`, then `jmp
            // *0x338(%rax)`): a value of its own, the same each time it is
            // read until memory is written.
            Some(addr) if matches!(addr.sym, Some((_, 1))) || (addr.sym.is_none() && size == 8) => {
                let v = self.memoised((
                    Val::Load {
                        addr,
                        size,
                        signed: false,
                    },
                    size,
                ));
                if let Val::Lin(Lin {
                    sym: Some((p, _)), ..
                }) = v
                {
                    self.pointers.insert(p);
                }
                v
            }
            // A narrower global read zero-extended (`mov 0xef99(%rip),
            // %edx`, xz's switch on its operation mode): a value of its own
            // too, so that a compare bounds it, but no pointer. (A signed
            // one stays a load: `movslq T(%rip)` reads a table's entry.)
            Some(addr) if addr.sym.is_none() && !signed => self.memoised((
                Val::Load {
                    addr,
                    size,
                    signed: false,
                },
                size,
            )),
            Some(addr) => Val::Load { addr, size, signed },
            None => match self.pair_addr_of(insn) {
                // The same value each time it is read until memory is
                // written (zero-extended; `movsxd` extends the symbol).
                Some(key) => match self.pair_loads.get(&(key, size)) {
                    Some(&v) => v,
                    None => {
                        let v = self.fresh_in(Range::bits(8 * u32::from(size)));
                        self.pair_loads.insert((key, size), v);
                        v
                    }
                },
                None => self.fresh(),
            },
        }
    }

    fn operand(&mut self, insn: &Instruction, op: u32) -> Val {
        match insn.op_kind(op) {
            OpKind::Register => self.read(insn.op_register(op)),
            OpKind::Memory => {
                let size = insn.memory_size().size() as u8;
                self.load(insn, size, false)
            }
            OpKind::Immediate8
            | OpKind::Immediate16
            | OpKind::Immediate32
            | OpKind::Immediate64
            | OpKind::Immediate8to16
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64 => Val::Lin(Lin::konst(insn.immediate(op))),
            _ => self.fresh(),
        }
    }

    fn add(&mut self, a: Val, b: Val) -> Val {
        match (a, b) {
            (Val::Lin(x), Val::Lin(y)) => match x.add(y) {
                Some(l) => Val::Lin(l),
                // Two symbols (`bsf(m) + 16 - (p & 15)` in glibc's strcpy):
                // a symbol of its own, holding the sum of their ranges.
                None => {
                    let r = self.range_of(a).add(self.range_of(b));
                    let v = self.fresh_in(r);
                    let c = x.off.wrapping_add(y.off);
                    let d = match (x.sym, y.sym) {
                        (Some((p, 1)), Some((q, u64::MAX))) => Some((p, q, c)),
                        (Some((q, u64::MAX)), Some((p, 1))) => Some((p, q, c)),
                        _ => None,
                    };
                    if let (Some(d), Some(s)) = (d, Self::sym_of(v)) {
                        self.sums.insert(s, d);
                    }
                    v
                }
            },
            (
                Val::Load { addr, size, signed },
                Val::Lin(Lin {
                    sym: None,
                    off: add,
                }),
            )
            | (
                Val::Lin(Lin {
                    sym: None,
                    off: add,
                }),
                Val::Load { addr, size, signed },
            ) => Val::Rel {
                addr,
                size,
                signed,
                add,
            },
            _ => self.fresh(),
        }
    }

    /// The flags of `cmp a, b` at `width` bytes, when they can bound
    /// anything: narrower compares only of plain symbols and constants
    /// (the low half of a 64-bit `sym + c` kept in a stack slot is no
    /// bound, see `narrow`).
    fn compare(a: Val, b: Val, width: usize) -> Option<Flags> {
        if width >= 8 {
            return Some(Flags {
                a,
                b,
                width: 8,
                carry: true,
            });
        }
        let mask = (1u64 << (8 * width)) - 1;
        let narrow = |v: Val| match v {
            Val::Lin(Lin { sym: None, off }) => Some(Val::Lin(Lin::konst(off & mask))),
            Val::Lin(l) if l.plain_sym().is_some() => Some(v),
            _ => None,
        };
        Some(Flags {
            a: narrow(a)?,
            b: narrow(b)?,
            width,
            carry: true,
        })
    }

    /// The flags of `add r, c` giving `sum` from `old` (64-bit): when no
    /// value of `old` overflows as a signed number, OF is clear, so the
    /// signed conditions and ZF are those of `sum` against 0.
    fn add_flags(&self, old: Val, c: u64, sum: Val) -> Option<Flags> {
        let s = self.range_of(old).flip_sign();
        let lo = i128::from(s.umin()) - (1 << 63);
        let hi = i128::from(s.umax()) - (1 << 63);
        let c = i128::from(c as i64);
        let fits = |x: i128| (i128::from(i64::MIN)..=i128::from(i64::MAX)).contains(&x);
        (s.umin() == s.lo && fits(lo + c) && fits(hi + c)).then_some(Flags {
            a: sum,
            b: Val::Lin(Lin::konst(0)),
            width: 8,
            carry: false,
        })
    }

    fn step(&mut self, insn: &Instruction) {
        let op0_reg = insn.op_count() > 0 && insn.op0_kind() == OpKind::Register;
        let mut flags = None;
        let handled = match insn.mnemonic() {
            Mnemonic::Cmp => {
                let a = self.operand(insn, 0);
                let b = self.operand(insn, 1);
                let width = match insn.op0_kind() {
                    OpKind::Register => insn.op0_register().size(),
                    _ => insn.memory_size().size(),
                };
                self.flags = Self::compare(a, b, width);
                self.last_zero = match (a, b) {
                    (Val::Lin(Lin { sym: None, off: a }), Val::Lin(Lin { sym: None, off: b })) => {
                        let mask = if width >= 8 {
                            u64::MAX
                        } else {
                            (1u64 << (8 * width)) - 1
                        };
                        Some((a & mask) == (b & mask))
                    }
                    _ => None,
                };
                return;
            }
            Mnemonic::Test
                if op0_reg
                    && insn.op1_kind() == OpKind::Register
                    && insn.op1_register() == insn.op0_register() =>
            {
                // `test r, r` sets the flags exactly as `cmp r, 0`.
                let v = self.read(insn.op0_register());
                self.flags = Self::compare(v, Val::Lin(Lin::konst(0)), insn.op0_register().size());
                self.last_zero = match v {
                    Val::Lin(Lin { sym: None, off }) => Some(off == 0),
                    _ => None,
                };
                return;
            }
            Mnemonic::Mov if op0_reg => {
                let v = match insn.op1_kind() {
                    OpKind::Memory => {
                        let size = insn.memory_size().size() as u8;
                        self.load(insn, size, false)
                    }
                    _ => self.operand(insn, 1),
                };
                self.write(insn.op0_register(), v);
                true
            }
            Mnemonic::Mov if insn.op0_kind() == OpKind::Memory => {
                let v = self.operand(insn, 1);
                match Self::slot_key(insn) {
                    Some(k) => {
                        self.slots.insert(k, v);
                        // A two-symbol address may point into the stack.
                        self.pair_loads.clear();
                    }
                    None => self.forget_loads(),
                }
                true
            }
            Mnemonic::Xchg if op0_reg && insn.op1_kind() == OpKind::Register => {
                let a = self.read(insn.op0_register());
                let b = self.read(insn.op1_register());
                self.write(insn.op0_register(), b);
                self.write(insn.op1_register(), a);
                true
            }
            Mnemonic::Movsxd | Mnemonic::Cdqe => {
                let (dst, src) = if insn.mnemonic() == Mnemonic::Cdqe {
                    (Register::RAX, self.read(Register::EAX))
                } else if insn.op1_kind() == OpKind::Memory {
                    (insn.op0_register(), self.load(insn, 4, true))
                } else {
                    (insn.op0_register(), self.read(insn.op1_register()))
                };
                let v = match src {
                    Val::Load { addr, size: 4, .. } => Val::Load {
                        addr,
                        size: 4,
                        signed: true,
                    },
                    Val::Lin(l) if l.plain_sym().is_some() => {
                        let r = self.arith(src, 0, 2);
                        if let (Some(a), Some(b)) = (Self::sym_of(r), l.plain_sym()) {
                            self.sext_of.insert(a, b);
                        }
                        r
                    }
                    _ => self.fresh(),
                };
                if dst.size() == 8 {
                    self.write(dst, v);
                } else {
                    let f = self.fresh();
                    self.write(dst, f);
                }
                true
            }
            Mnemonic::Movzx if op0_reg && insn.op1_kind() == OpKind::Register => {
                let v = self.read(insn.op1_register());
                self.write(insn.op0_register(), v);
                true
            }
            Mnemonic::Movzx if op0_reg => {
                let size = insn.memory_size().size() as u8;
                // Through a pointer: the same value a `cmpb $n, 8(%rdx)`
                // before it compared (memoised, zero-extended).
                let pointer_form = insn.memory_index() == Register::None
                    && insn.memory_base().is_gpr64()
                    && Self::slot_key(insn).is_none();
                let through_pointer = match pointer_form {
                    true => match self.load(insn, size, false) {
                        v @ Val::Lin(l) if l.plain_sym().is_some() => Some(v),
                        _ => None,
                    },
                    false => None,
                };
                let v = match through_pointer {
                    Some(v) => v,
                    None => {
                        let v = self.fresh_in(Range::bits(8 * u32::from(size)));
                        if let (Some(addr), Some(s)) = (self.addr_of(insn), Self::sym_of(v)) {
                            self.small_loads.insert(s, (addr, size));
                        }
                        v
                    }
                };
                self.write(insn.op0_register(), v);
                true
            }
            Mnemonic::Lea if op0_reg && insn.op0_register().size() == 4 => {
                // `lea -0x20(%rax), %edx`: a 32-bit `value + constant`.
                let v = if insn.memory_index() == Register::None
                    && insn.memory_base().is_gpr64()
                    && insn.memory_base() != Register::RIP
                {
                    let b = self.read_full(insn.memory_base());
                    let b = self.narrow(b, 4);
                    self.arith(b, insn.memory_displacement64() & 0xffff_ffff, 1)
                } else {
                    // `lea (%rcx,%rcx,2), %r8d`: the 64-bit sum, when its
                    // range fits 32 bits, is the 32-bit result.
                    match self.addr_of(insn) {
                        Some(l)
                            if insn.memory_base() != Register::RIP
                                && self.range_of(Val::Lin(l)).umax() <= u64::from(u32::MAX) =>
                        {
                            Val::Lin(l)
                        }
                        _ => self.fresh(),
                    }
                };
                self.write(insn.op0_register(), v);
                true
            }
            Mnemonic::Lea if op0_reg => {
                let v = match self.addr_of(insn) {
                    Some(l) => Val::Lin(l),
                    // `lea (%r11,%rcx,1), %rcx` adding a loaded entry to a
                    // base; `lea 0x10(%rdi,%rdx,1)` adding two values.
                    None if insn.memory_index_scale() == 1
                        && insn.memory_base().is_gpr64()
                        && insn.memory_base() != Register::RIP
                        && insn.memory_index().is_gpr64() =>
                    {
                        let a = self.read_full(insn.memory_base());
                        let b = self.read_full(insn.memory_index());
                        let s = self.add(a, b);
                        match insn.memory_displacement64() {
                            0 => s,
                            d => self.add(s, Val::Lin(Lin::konst(d))),
                        }
                    }
                    None => self.fresh(),
                };
                self.write(insn.op0_register(), v);
                true
            }
            Mnemonic::Add | Mnemonic::Sub
                if op0_reg
                    && insn.op0_register().size() == 4
                    && matches!(
                        insn.op1_kind(),
                        OpKind::Immediate32 | OpKind::Immediate8to32
                    ) =>
            {
                let a = self.read(insn.op0_register());
                let mut c = insn.immediate(1);
                if insn.mnemonic() == Mnemonic::Sub {
                    // `sub` sets the flags exactly as `cmp`.
                    flags = Self::compare(a, Val::Lin(Lin::konst(c)), 4);
                    c = c.wrapping_neg();
                }
                let v = self.arith(a, c & 0xffff_ffff, 1);
                self.write(insn.op0_register(), v);
                true
            }
            Mnemonic::Pmovmskb | Mnemonic::Vpmovmskb if op0_reg => {
                let v = self.fresh_in(Range::bits(insn.op1_register().size() as u32));
                if let Some(s) = Self::sym_of(v) {
                    self.masks.insert(s);
                }
                self.write(insn.op0_register(), v);
                true
            }
            Mnemonic::Bsf | Mnemonic::Tzcnt if op0_reg && insn.op1_kind() == OpKind::Register => {
                // The index of the lowest set bit of a nonzero source lies
                // below the bit length of the source's largest value. A zero
                // source: `tzcnt` gives the width; `bsf` leaves the
                // destination unchanged (undefined on paper), so we need
                // the source proven nonzero (`test %rdx, %rdx; jne`), or the
                // destination to be the source (zero stays zero), or, for a
                // `pmovmskb` mask, rely on the code never scanning an empty
                // mask, which glibc's string functions guarantee by
                // construction (see docs/cfg.md).
                let src = self.read(insn.op1_register());
                let r = self.range_of(src);
                let width = 8 * insn.op0_register().size() as u64;
                let top = u64::from(63 - (r.umax() | 1).leading_zeros()).min(width - 1);
                let nonzero = r.umin() > 0;
                let same = insn.op1_register() == insn.op0_register();
                let is_mask = Self::sym_of(src).is_some_and(|s| self.masks.contains(&s));
                let bound = match insn.mnemonic() {
                    Mnemonic::Tzcnt if nonzero => Some(top),
                    Mnemonic::Tzcnt => Some(width),
                    _ if nonzero || same || is_mask => Some(top),
                    _ => None,
                };
                let v = match bound {
                    Some(b) => self.fresh_in(Range::upto(b)),
                    None => self.fresh(),
                };
                self.write(insn.op0_register(), v);
                true
            }
            Mnemonic::And
                if op0_reg
                    && matches!(
                        insn.op1_kind(),
                        OpKind::Immediate32
                            | OpKind::Immediate8to32
                            | OpKind::Immediate8to64
                            | OpKind::Immediate32to64
                            | OpKind::Immediate8
                    ) =>
            {
                let m = insn.immediate(1);
                let src = self.read(insn.op0_register());
                // The result is at most the mask and at most the source;
                // sign-extended negative masks bound only by the source.
                let mut hi = self.range_of(src).umax();
                if m < 1 << 31 {
                    hi = hi.min(m);
                }
                let v = self.fresh_in(Range::upto(hi));
                self.write(insn.op0_register(), v);
                true
            }
            Mnemonic::Ror | Mnemonic::Rol | Mnemonic::Xor
                if op0_reg
                    && insn.op0_register().size() == 8
                    && Self::sym_of(
                        self.regs
                            .get(&insn.op0_register())
                            .copied()
                            .unwrap_or(Val::Lin(Lin::konst(0))),
                    )
                    .is_some_and(|p| self.pointers.contains(&p))
                    && (insn.mnemonic() != Mnemonic::Xor
                        || insn.segment_prefix() == Register::FS) =>
            {
                // glibc's PTR_DEMANGLE: the result is still a code pointer.
                let v = self.fresh();
                if let Some(s) = Self::sym_of(v) {
                    self.pointers.insert(s);
                }
                self.write(insn.op0_register(), v);
                true
            }
            Mnemonic::Add | Mnemonic::Sub if op0_reg && insn.op0_register().size() == 8 => {
                let a = self.read(insn.op0_register());
                let mut b = self.operand(insn, 1);
                if insn.mnemonic() == Mnemonic::Sub {
                    // `sub` sets the flags exactly as `cmp`.
                    flags = Self::compare(a, b, 8);
                    b = match b {
                        Val::Lin(l) => Val::Lin(l.mul(u64::MAX)),
                        _ => self.fresh(),
                    };
                }
                let v = self.add(a, b);
                if let (Mnemonic::Add, Val::Lin(Lin { sym: None, off })) = (insn.mnemonic(), b) {
                    flags = self.add_flags(a, off, v);
                }
                self.write(insn.op0_register(), v);
                true
            }
            Mnemonic::Shr if op0_reg => {
                // At most the source's largest value shifted; a mask stays
                // a mask.
                let src = self.read(insn.op0_register());
                let hi = self
                    .range_of(src)
                    .umax()
                    .min(Range::bits(8 * insn.op0_register().size() as u32).hi());
                let hi = match insn.op1_kind() {
                    OpKind::Immediate8 => hi >> (insn.immediate(1) & 63),
                    _ => hi,
                };
                let v = self.fresh_in(Range::upto(hi));
                if let (Some(s), Some(d)) = (Self::sym_of(src), Self::sym_of(v)) {
                    if self.masks.contains(&s) {
                        self.masks.insert(d);
                    }
                }
                self.write(insn.op0_register(), v);
                true
            }
            Mnemonic::Shl
                if op0_reg
                    && matches!(insn.op0_register().size(), 4 | 8)
                    && insn.op1_kind() == OpKind::Immediate8 =>
            {
                let k = insn.immediate(1);
                let v = match self.read(insn.op0_register()) {
                    Val::Lin(l) if k < 64 && insn.op0_register().size() == 8 => {
                        Val::Lin(l.mul(1 << k))
                    }
                    // 32 bits: exact while no bit leaves the register
                    // (`and $0xf, %ecx; shl $6, %ecx`).
                    v @ Val::Lin(l)
                        if k < 32 && self.range_of(v).umax() <= u64::from(u32::MAX) >> k =>
                    {
                        Val::Lin(l.mul(1 << k))
                    }
                    _ => self.fresh(),
                };
                self.write(insn.op0_register(), v);
                true
            }
            _ => false,
        };
        if !handled {
            self.clobber(insn);
        }
        if insn.rflags_modified() != 0 {
            self.flags = flags;
            self.last_zero = None;
        }
    }

    /// Everything `insn` writes becomes an unknown value.
    fn clobber(&mut self, insn: &Instruction) {
        let info = self.info.info(insn);
        let regs: Vec<Register> = info
            .used_registers()
            .iter()
            .filter(|u| {
                matches!(
                    u.access(),
                    OpAccess::Write
                        | OpAccess::CondWrite
                        | OpAccess::ReadWrite
                        | OpAccess::ReadCondWrite
                )
            })
            .map(|u| u.register())
            .collect();
        let writes_mem = info.used_memory().iter().any(|m| {
            matches!(
                m.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            )
        });
        for r in regs {
            if r.is_gpr() {
                let f = self.fresh();
                self.regs.insert(r.full_register(), f);
                let full = r.full_register();
                if full == Register::RSP || full == Register::RBP {
                    self.slots.retain(|(b, _), _| *b != full);
                }
            }
        }
        if writes_mem {
            self.forget_loads();
            if let Some(k) = Self::slot_key(insn) {
                let f = self.fresh();
                self.slots.insert(k, f);
            }
        }
    }

    /// Applies the last flags and the direction the path takes at `jcc`
    /// to the compared values' ranges: `cmp a, b; ja` not taken gives
    /// `a <= b`, hence `a <= max(b)` and `b >= min(a)`.
    fn branch(&mut self, insn: &Instruction, taken: bool) {
        use ConditionCode as C;
        // `mov $0, %eax; test %rax, %rax; je` cannot fall through.
        match (insn.condition_code(), self.last_zero) {
            (C::e, Some(zero)) if taken != zero => self.infeasible = true,
            (C::ne, Some(zero)) if taken == zero => self.infeasible = true,
            _ => {}
        }
        let Some(f) = self.flags else {
            return;
        };
        #[derive(Clone, Copy, PartialEq)]
        enum Rel {
            Le,
            Lt,
            Ge,
            Gt,
            Eq,
            Ne,
        }
        let cc = insn.condition_code();
        let rel = match (cc, taken) {
            (C::a | C::g, true) | (C::be | C::le, false) => Rel::Gt,
            (C::a | C::g, false) | (C::be | C::le, true) => Rel::Le,
            (C::ae | C::ge, true) | (C::b | C::l, false) => Rel::Ge,
            (C::ae | C::ge, false) | (C::b | C::l, true) => Rel::Lt,
            (C::e, true) | (C::ne, false) => Rel::Eq,
            (C::e, false) | (C::ne, true) => Rel::Ne,
            _ => return,
        };
        let signed = matches!(cc, C::g | C::ge | C::l | C::le);
        let unsigned = matches!(cc, C::a | C::ae | C::b | C::be);
        // Signed order only for whole registers; unsigned only when CF is
        // that of `a - b`.
        if (signed && f.width < 8) || (unsigned && !f.carry) {
            return;
        }
        let view = |r: Range| if signed { r.flip_sign() } else { r };
        let (mut ra, mut rb) = (view(self.range_of(f.a)), view(self.range_of(f.b)));
        // A contradiction proves the path infeasible only for a 64-bit
        // compare or one of constants: a narrower compare of a symbol reads
        // the register's low half as the whole (see `narrow`), so it only
        // bounds the value, as a lone compare would.
        let konst = |v: Val| matches!(v, Val::Lin(Lin { sym: None, .. }));
        let strict = f.width >= 8 || (konst(f.a) && konst(f.b));
        let contradicts = |ra: Range, rb: Range| match rel {
            Rel::Le => ra.le(rb).is_none() || rb.ge(ra).is_none(),
            Rel::Lt => ra.lt(rb).is_none() || rb.gt(ra).is_none(),
            Rel::Ge => ra.ge(rb).is_none() || rb.le(ra).is_none(),
            Rel::Gt => ra.gt(rb).is_none() || rb.lt(ra).is_none(),
            Rel::Eq => ra.meet(rb).is_none(),
            Rel::Ne => ra.len == 0 && rb.len == 0 && ra.lo == rb.lo,
        };
        if !strict && contradicts(ra, rb) {
            if !konst(f.a) {
                ra = Range::FULL;
            }
            if !konst(f.b) {
                rb = Range::FULL;
            }
        }
        let (na, nb) = match rel {
            Rel::Le => (ra.le(rb), rb.ge(ra)),
            Rel::Lt => (ra.lt(rb), rb.gt(ra)),
            Rel::Ge => (ra.ge(rb), rb.le(ra)),
            Rel::Gt => (ra.gt(rb), rb.lt(ra)),
            Rel::Eq => (ra.meet(rb), rb.meet(ra)),
            Rel::Ne => (
                if rb.len == 0 {
                    ra.without(rb.lo)
                } else {
                    Some(ra)
                },
                if ra.len == 0 {
                    rb.without(ra.lo)
                } else {
                    Some(rb)
                },
            ),
        };
        // What the relation says about `a - b` (the view adds the same
        // constant to both, so it keeps the difference).
        let d = match rel {
            Rel::Le => Some(Range::between(ra.umin().wrapping_sub(rb.umax()), 0)),
            Rel::Lt => Some(Range::between(ra.umin().wrapping_sub(rb.umax()), u64::MAX)),
            Rel::Ge => (ra.umax() >= rb.umin()).then(|| Range::upto(ra.umax() - rb.umin())),
            Rel::Gt => (ra.umax() > rb.umin()).then(|| Range::between(1, ra.umax() - rb.umin())),
            Rel::Eq => Some(Range::konst(0)),
            Rel::Ne => Some(Range::between(1, u64::MAX)),
        };
        self.relate(f, d, strict);
        match (na, nb) {
            (Some(na), Some(nb)) => {
                self.refine(f.a, view(na), strict);
                self.refine(f.b, view(nb), strict);
            }
            // No values satisfy the branch: the path cannot run.
            _ => self.infeasible = true,
        }
    }

    /// Records that `f.a - f.b` lies in `d`, as a fact on the difference
    /// of their symbols (both `sym + c`; compared narrower than 64 bits
    /// only when both are known to fit 32 bits).
    fn relate(&mut self, f: Flags, d: Option<Range>, strict: bool) {
        let (
            Val::Lin(Lin {
                sym: Some((x, 1)),
                off: ox,
            }),
            Val::Lin(Lin {
                sym: Some((y, 1)),
                off: oy,
            }),
        ) = (f.a, f.b)
        else {
            return;
        };
        let fits = |v: Val| self.range_of(v).umax() <= u64::from(u32::MAX);
        if x == y || (f.width < 8 && !(fits(f.a) && fits(f.b))) {
            return;
        }
        let Some(d) = d else {
            return;
        };
        // x - y = (a - b) - (ox - oy)
        let d = d.add_const(oy.wrapping_sub(ox));
        for (key, r) in [((x, y), d), ((y, x), d.neg())] {
            let old = self.diffs.get(&key).copied().unwrap_or(Range::FULL);
            match old.meet(r) {
                Some(m) => {
                    self.diffs.insert(key, m);
                }
                None if strict => self.infeasible = true,
                None => {
                    self.diffs.insert(key, r);
                }
            }
        }
    }

    /// `s = zext8(x) - c` (32-bit) when `low8(x - c) <= n` was compared
    /// (`lea -c(%x), %eax; cmp $n, %al; ja` then `movzbl %xb, %eax; sub $c,
    /// %eax`, glibc's printf): with `c + n <= 255`, the byte `x` lies in
    /// `[c, c + n]`, so `s <= n`.
    fn byte_range_bound(&self, s: u32) -> Option<u64> {
        let (&(cval, k, _), _) = self
            .arith
            .iter()
            .find(|(&(_, _, op), &r)| op == 1 && Self::sym_of(r) == Some(s))?;
        let c = k.wrapping_neg() & 0xffff_ffff;
        let csym = Self::sym_of(cval)?;
        // `zext8(x)` is a view of `x`, or `x` itself when it fits a byte.
        let x = match self.memo.iter().find(|(&(x, size), &r)| {
            size == 1 && Self::sym_of(r) == Some(csym) && Self::sym_of(x).is_some()
        }) {
            Some((&(x, _), _)) => x,
            None if self.range_of(cval).umax() <= 0xff => cval,
            None => return None,
        };
        Self::sym_of(x)?;
        let a = *self.arith.get(&(x, k, 1))?;
        let b = Self::sym_of(*self.memo.get(&(a, 1))?)?;
        let n = self.ranges.get(&b)?.umax();
        (c <= 255 && c + n <= 255).then_some(n)
    }

    /// The values the index symbol `s` can hold: its own range, met with
    /// what its definition implies (a sign extension of a value below
    /// 2^31, printf's byte classes, a byte loaded from a bounded table).
    fn index_range(&self, s: u32, reader: &TableReader) -> Range {
        let mut r = self.ranges.get(&s).copied().unwrap_or(Range::FULL);
        let mut meet = |o: Range| r = r.meet(o).unwrap_or(r);
        if let Some(&inner) = self.sext_of.get(&s) {
            let i = self.index_range(inner, reader);
            if i.umax() < 1 << 31 {
                meet(i);
            }
        }
        if let Some(b) = self.byte_range_bound(s) {
            meet(Range::upto(b));
        }
        // `x - y + c` with a known range of `x - y`.
        if let Some(&(x, y, c)) = self.sums.get(&s) {
            if let Some(&d) = self.diffs.get(&(x, y)) {
                meet(d.add_const(c));
            }
        }
        // The index was loaded from a small table of bytes/words whose own
        // index is bounded: its largest entry bounds ours.
        if let Some(max) = self.small_load_max(s, reader) {
            meet(Range::upto(max));
        }
        r
    }

    fn small_load_max(&self, s: u32, reader: &TableReader) -> Option<u64> {
        let &(addr, size) = self.small_loads.get(&s)?;
        let (inner, scale) = addr.sym?;
        let i = self.index_range(inner, reader);
        if i.len >= MAX_ENTRIES || scale != u64::from(size) {
            return None;
        }
        let mut max = 0u64;
        for k in 0..=i.len {
            let a = addr
                .off
                .wrapping_add(scale.wrapping_mul(i.lo.wrapping_add(k)));
            let v = match size {
                1 => u64::from(reader.u8_at(a)?),
                2 => u64::from(reader.u16_at(a)?),
                _ => return None,
            };
            max = max.max(v);
        }
        Some(max)
    }
}

/// Classifies the indirect `jmp` ending `chain`'s last block.
///
/// `chain` lists the slice's blocks in execution order (each a slice of
/// instructions); `taken[i]` says whether control went from `chain[i]` to
/// `chain[i + 1]` through the taken side of `chain[i]`'s final branch.
///
/// `entry_value(r)` tells what a 64-bit register holds on entry to the
/// slice when all its reaching definitions agree; `in_proc(a)` whether `a`
/// lies in the jump's procedure. `None`: the path cannot
/// be taken (a branch on constant flags goes the other way).
pub fn resolve(
    chain: &[&[Instruction]],
    taken: &[bool],
    reader: &TableReader,
    entry_value: &mut dyn FnMut(Register) -> Option<EntryFact>,
    in_proc: &dyn Fn(u64) -> bool,
) -> Option<JumpResolution> {
    let mut infeasible = false;
    let r = resolve_path(chain, taken, reader, entry_value, in_proc, &mut infeasible);
    (!infeasible).then_some(r)
}

fn resolve_path(
    chain: &[&[Instruction]],
    taken: &[bool],
    reader: &TableReader,
    entry_value: &mut dyn FnMut(Register) -> Option<EntryFact>,
    in_proc: &dyn Fn(u64) -> bool,
    infeasible: &mut bool,
) -> JumpResolution {
    debug_assert_eq!(taken.len() + 1, chain.len());
    let Some(jmp) = chain.last().and_then(|b| b.last()) else {
        return JumpResolution::Unresolved("empty slice");
    };
    debug_assert_eq!(jmp.mnemonic(), Mnemonic::Jmp);
    let mut sim = Sim {
        regs: HashMap::new(),
        entry_value,
        memo: HashMap::new(),
        pair_loads: HashMap::new(),
        pointers: Default::default(),
        arith: HashMap::new(),
        sext_of: HashMap::new(),
        masks: Default::default(),
        sums: HashMap::new(),
        diffs: HashMap::new(),
        slots: HashMap::new(),
        next_sym: 0,
        ranges: HashMap::new(),
        small_loads: HashMap::new(),
        flags: None,
        last_zero: None,
        infeasible: false,
        info: InstructionInfoFactory::new(),
    };
    for (i, block) in chain.iter().enumerate() {
        let Some((last, body)) = block.split_last() else {
            continue;
        };
        for insn in body {
            sim.step(insn);
        }
        if i + 1 < chain.len() {
            if last.flow_control() == iced_x86::FlowControl::ConditionalBranch {
                sim.branch(last, taken[i]);
            } else {
                sim.step(last);
            }
        }
    }
    if sim.infeasible {
        *infeasible = true;
        return JumpResolution::Unresolved("infeasible path");
    }
    let target = match jmp.op0_kind() {
        OpKind::Register => sim.read(jmp.op0_register()),
        OpKind::Memory if jmp.memory_base() == Register::RIP => return JumpResolution::TailCall,
        OpKind::Memory => sim.load(jmp, 8, false),
        _ => return JumpResolution::Unresolved("unexpected operand"),
    };
    let (addr, entry_size, signed, add) = match target {
        Val::Load { addr, size: 8, .. } => (addr, 8u64, false, 0u64),
        Val::Rel {
            addr,
            size: 4,
            signed,
            add,
        } => (addr, 4, signed, add),
        Val::Lin(Lin {
            sym: Some((p, 1)),
            off: 0,
        }) if sim.pointers.contains(&p) => return JumpResolution::TailCall,
        Val::Lin(Lin { sym: None, off }) => return JumpResolution::Computed(vec![off]),
        // A label plus a bounded multiple of a variable (glibc's
        // memmove-ssse3: `and $0xf, %ecx; shl $6, %ecx; add %r9, %rcx;
        // jmp *%rcx`): every value the bound allows.
        Val::Lin(Lin {
            sym: Some((s, k)),
            off,
        }) if in_proc(off) && k != 0 && sim.index_range(s, reader).len < MAX_ENTRIES => {
            let r = sim.index_range(s, reader);
            let mut targets: Vec<u64> = (0..=r.len)
                .map(|i| off.wrapping_add(k.wrapping_mul(r.lo.wrapping_add(i))))
                .collect();
            targets.sort_unstable();
            targets.dedup();
            return JumpResolution::Computed(targets);
        }
        Val::Lin(Lin { sym: Some(_), off }) if in_proc(off) => {
            return JumpResolution::Unresolved(LABEL_ARITHMETIC)
        }
        Val::Lin(_) => return JumpResolution::Unresolved("target not computed in the slice"),
        _ => return JumpResolution::Unresolved("target is not a table entry"),
    };
    let Some((s, scale)) = addr.sym else {
        if entry_size == 4 {
            // A 4-byte offset read at a constant address plus a base
            // (`movslq T(%rip), %rax; lea T(%rip), %rsi; add %rsi, %rax;
            // jmp *%rax`, glibc's `__res_context_query`: a switch whose
            // index is known on this path) is one entry of a table: one
            // target, exactly. Never a tail call (it was one before, and
            // its target lay inside the procedure).
            return match reader.u32_at(addr.off) {
                Some(e) => {
                    let e = if signed {
                        e as i32 as i64 as u64
                    } else {
                        u64::from(e)
                    };
                    JumpResolution::Table {
                        table: addr.off,
                        targets: vec![add.wrapping_add(e)],
                    }
                }
                None => JumpResolution::Unresolved("table outside the file's sections"),
            };
        }
        return JumpResolution::TailCall;
    };
    if scale == 1 && entry_size == 8 && add == 0 {
        // `jmp [reg + d]`: a pointer field, not an indexed table.
        return JumpResolution::TailCall;
    }
    if scale != entry_size {
        // An 8-byte pointer read at a stride larger than 8 in PIC code is a
        // field of an array of structures (`ops[i].fn`, liblzma's
        // `lzma_properties_decode`): PIC jump tables hold 4-byte offsets.
        if reader.pic && entry_size == 8 && scale > 8 {
            return JumpResolution::TailCall;
        }
        return JumpResolution::Unresolved("index scale differs from the entry size");
    }
    // An index `s` in `lo..=lo+n` reads entries `0..=n` of the table at
    // `addr.off + scale*lo`, whatever the order in which the code formed
    // the address (`sub $4, %rax; cmp $0x16, %rax; ja` bounds `s - 4` by
    // 0x16: `lo` is 4).
    let range = sim.index_range(s, reader);
    let bounded = (range.len < MAX_ENTRIES).then(|| {
        (
            range.len,
            addr.off.wrapping_add(scale.wrapping_mul(range.lo)),
        )
    });
    let Some((n, table)) = bounded else {
        // PIC jump tables hold 32-bit offsets (8-byte addresses would each
        // need a dynamic relocation), so an unbounded indexed 8-byte load
        // in PIC code reads a function pointer from an array of structures.
        // ... unless the table's first entries are labels of this very
        // procedure (GNU `goto *labels[i]` in PIC code: absolute entries
        // with RELATIVE relocations).
        let labels = (0..2).any(|i| {
            reader
                .u64_at(addr.off.wrapping_add(8 * i))
                .is_some_and(in_proc)
        });
        if reader.pic && entry_size == 8 && !labels {
            return JumpResolution::TailCall;
        }
        if range.len <= u64::from(u32::MAX) {
            return JumpResolution::Unresolved("table bound too large");
        }
        return JumpResolution::Unresolved("no bounding compare on the index");
    };
    let entry = |a: u64| {
        if entry_size == 8 {
            reader.u64_at(a)
        } else {
            reader.u32_at(a).map(|e| {
                let e = if signed {
                    e as i32 as i64 as u64
                } else {
                    u64::from(e)
                };
                add.wrapping_add(e)
            })
        }
    };
    let mut targets = Vec::with_capacity(n as usize + 1);
    for i in 0..=n {
        match entry(table.wrapping_add(i * entry_size)) {
            Some(t) => targets.push(t),
            None => return JumpResolution::Unresolved("table outside the file's sections"),
        }
    }
    // A table whose proven range starts past entry 0 (`test %eax, %eax;
    // jne` then `cmp $5, %eax; ja`; cc1's `hash_operand`: `cmp $0x46, %di;
    // ja; test %di, %di; je; cmp $0x46, %di; ja; jmp *T(,%rdi,8)`): the
    // entries below it, when all are labels of the procedure, are added
    // back, so that the table is described from the address the code names
    // (which the rewriter retargets to the copy's table; for offsets, also
    // where they are counted from) and paths with different lower bounds
    // agree. They are never taken, which costs nothing in an exact CFG.
    let below = table.wrapping_sub(addr.off) / entry_size;
    let from_start = entry_size == 8 || add == addr.off;
    if from_start && table != addr.off && below < MAX_ENTRIES {
        let low: Option<Vec<u64>> = (0..below)
            .map(|i| entry(addr.off + i * entry_size).filter(|&t| in_proc(t)))
            .collect();
        if let Some(mut low) = low {
            low.extend(targets);
            return JumpResolution::Table {
                table: addr.off,
                targets: low,
            };
        }
    }
    JumpResolution::Table { table, targets }
}

/// Joins the tables two paths to one jump read, `(start, targets)` each,
/// when they are overlapping or adjacent runs of one table: both lists
/// must be the entries the memory holds at one stride (4-byte offsets from
/// one base, or 8-byte addresses) from the lower start. Paths with
/// different lower bounds on the index (`bsf(m)` in `0..=15` on one,
/// `bsf(m) + 16 - (p & 15)` in `1..=31` on another) read such runs.
pub fn merge_tables(
    reader: &TableReader,
    a: (u64, &[u64]),
    b: (u64, &[u64]),
) -> Option<JumpResolution> {
    let ((t1, l1), (t2, l2)) = if a.0 <= b.0 { (a, b) } else { (b, a) };
    for stride in [4u64, 8] {
        let gap = t2 - t1;
        let d = gap / stride;
        if gap % stride != 0 || d > l1.len() as u64 {
            continue;
        }
        let d = d as usize;
        let len = l1.len().max(d + l2.len());
        let union: Vec<u64> = (0..len)
            .map(|i| if i < l1.len() { l1[i] } else { l2[i - d] })
            .collect();
        let agree = l2.iter().enumerate().all(|(j, &t)| union[d + j] == t);
        // The memory at this stride must give exactly these targets.
        let read = |i: usize| -> Option<u64> {
            let at = t1.checked_add(stride * i as u64)?;
            match stride {
                8 => reader.u64_at(at),
                _ => reader.u32_at(at).map(|e| e as i32 as i64 as u64),
            }
        };
        let base = match stride {
            8 => Some(0),
            _ => read(0).map(|e| union[0].wrapping_sub(e)),
        };
        let Some(base) = base else { continue };
        let matches = (0..len).all(|i| read(i).map(|e| base.wrapping_add(e)) == Some(union[i]));
        if agree && matches {
            return Some(JumpResolution::Table {
                table: t1,
                targets: union,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    /// One readable region, for the table.
    struct Region(Vec<(u64, Vec<u8>)>);

    impl Memory for Region {
        fn bytes_at(&self, addr: u64, len: u64) -> Option<&[u8]> {
            self.0.iter().find_map(|(base, bytes)| {
                let off = usize::try_from(addr.checked_sub(*base)?).ok()?;
                bytes.get(off..off.checked_add(usize::try_from(len).ok()?)?)
            })
        }
    }

    const T: u64 = 0x2000;

    /// Assembles blocks of hand-encoded instructions laid out from 0x1000;
    /// `Rip(bytes)` is an instruction whose last four bytes are a
    /// RIP-relative displacement to `T`.
    enum I {
        Raw(&'static [u8]),
        Rip(&'static [u8]),
    }

    fn decode(blocks: &[&[I]]) -> Vec<Vec<Instruction>> {
        let mut ip = 0x1000u64;
        blocks
            .iter()
            .map(|b| {
                let mut bytes = Vec::new();
                let start = ip;
                for i in b.iter() {
                    match i {
                        I::Raw(r) => bytes.extend_from_slice(r),
                        I::Rip(r) => {
                            let next = start + (bytes.len() + r.len() + 4) as u64;
                            bytes.extend_from_slice(r);
                            bytes.extend_from_slice(
                                &((T as i64 - next as i64) as i32).to_le_bytes(),
                            );
                        }
                    }
                }
                ip += bytes.len() as u64;
                Decoder::with_ip(64, &bytes, start, DecoderOptions::NONE)
                    .into_iter()
                    .collect()
            })
            .collect()
    }

    fn run(
        blocks: &[&[I]],
        taken: &[bool],
        table: Vec<u8>,
        relative: &HashMap<u64, u64>,
    ) -> JumpResolution {
        run_with(blocks, taken, vec![(T, table)], relative, &mut |_| None)
    }

    fn run_with(
        blocks: &[&[I]],
        taken: &[bool],
        regions: Vec<(u64, Vec<u8>)>,
        relative: &HashMap<u64, u64>,
        entry: &mut dyn FnMut(Register) -> Option<EntryFact>,
    ) -> JumpResolution {
        let insns = decode(blocks);
        let slices: Vec<&[Instruction]> = insns.iter().map(Vec::as_slice).collect();
        let mem = Region(regions);
        let reader = TableReader {
            memory: &mem,
            pic: true,
            relative,
        };
        resolve(&slices, taken, &reader, entry, &|_| false).expect("a feasible path")
    }

    /// Like `run_with`, with the procedure's extent; `None`: infeasible.
    fn run_in(
        blocks: &[&[I]],
        taken: &[bool],
        regions: Vec<(u64, Vec<u8>)>,
        in_proc: &dyn Fn(u64) -> bool,
    ) -> Option<JumpResolution> {
        let insns = decode(blocks);
        let slices: Vec<&[Instruction]> = insns.iter().map(Vec::as_slice).collect();
        let mem = Region(regions);
        let relative = HashMap::new();
        let reader = TableReader {
            memory: &mem,
            pic: true,
            relative: &relative,
        };
        resolve(&slices, taken, &reader, &mut |_| None, in_proc)
    }

    fn rel_table(targets: &[u64]) -> Vec<u8> {
        targets
            .iter()
            .flat_map(|&t| ((t as i64 - T as i64) as i32).to_le_bytes())
            .collect()
    }

    // cmp edi, 5; ja +0x10
    const GUARD_JA: &[I] = &[I::Raw(&[0x83, 0xff, 0x05]), I::Raw(&[0x77, 0x10])];
    // lea rdx, [rip+T]; movsxd rax, [rdx+rdi*4]; add rax, rdx; jmp rax
    const PIC: &[I] = &[
        I::Rip(&[0x48, 0x8d, 0x15]),
        I::Raw(&[0x48, 0x63, 0x04, 0xba]),
        I::Raw(&[0x48, 0x01, 0xd0]),
        I::Raw(&[0xff, 0xe0]),
    ];

    #[test]
    fn gcc_pic_table_bounded_by_ja() {
        let targets = [0x1100, 0x1110, 0x1100, 0x1120, 0x1130, 0x1140];
        let r = run(
            &[GUARD_JA, PIC],
            &[false],
            rel_table(&targets),
            &HashMap::new(),
        );
        assert_eq!(
            r,
            JumpResolution::Table {
                table: T,
                targets: targets.to_vec()
            }
        );
    }

    /// liblzma's range encoder (`rc_encode`, gcc -O2 PIC): the switch on
    /// `rc->symbols[rc->pos]` bounds the word at `0x30(%rax,%rdx,4)` and
    /// loads it again as `(%rax,%rcx,4)` with `rcx = rdx + 12`: one
    /// address, so one value, bounded by the compare.
    fn rc_encode(lea_rcx: &'static [u8], between: &'static [u8]) -> JumpResolution {
        let head: &[I] = &[
            // lea r9, [rip+T]
            I::Rip(&[0x4c, 0x8d, 0x0d]),
            // mov rdx, [rax+0x28]
            I::Raw(&[0x48, 0x8b, 0x50, 0x28]),
            // cmp dword [rax+rdx*4+0x30], 4
            I::Raw(&[0x83, 0x7c, 0x90, 0x30, 0x04]),
            // lea rcx, [rdx+c]
            I::Raw(lea_rcx),
            // ja +0x1e
            I::Raw(&[0x77, 0x1e]),
        ];
        let tail: &[I] = &[
            I::Raw(between),
            // mov ecx, [rax+rcx*4]
            I::Raw(&[0x8b, 0x0c, 0x88]),
            // movsxd rcx, [r9+rcx*4]; add rcx, r9; jmp rcx
            I::Raw(&[0x49, 0x63, 0x0c, 0x89]),
            I::Raw(&[0x4c, 0x01, 0xc9]),
            I::Raw(&[0xff, 0xe1]),
        ];
        let targets = [0x1100, 0x1110, 0x1120, 0x1130, 0x1140, 0x1150];
        run(
            &[head, tail],
            &[false],
            rel_table(&targets),
            &HashMap::new(),
        )
    }

    #[test]
    fn a_word_compared_and_reloaded_through_another_register() {
        // lea rcx, [rdx+0xc]: 4*(rdx+12) = 4*rdx + 0x30.
        assert_eq!(
            rc_encode(&[0x48, 0x8d, 0x4a, 0x0c], &[]),
            JumpResolution::Table {
                table: T,
                targets: vec![0x1100, 0x1110, 0x1120, 0x1130, 0x1140]
            }
        );
        // The next word is another value: not bounded.
        assert!(matches!(
            rc_encode(&[0x48, 0x8d, 0x4a, 0x0d], &[]),
            JumpResolution::Unresolved(_)
        ));
        // A store in between (mov [rax], edi) may change the word.
        assert!(matches!(
            rc_encode(&[0x48, 0x8d, 0x4a, 0x0c], &[0x89, 0x38]),
            JumpResolution::Unresolved(_)
        ));
        // So may one to a stack slot (mov [rsp+8], edi): the address of
        // two symbols may point into the stack.
        assert!(matches!(
            rc_encode(&[0x48, 0x8d, 0x4a, 0x0c], &[0x89, 0x7c, 0x24, 0x08]),
            JumpResolution::Unresolved(_)
        ));
    }

    /// xz's `main` switches on a 32-bit global (`mov 0xef99(%rip), %edx;
    /// ...; cmp $4, %edx; ja`), read zero-extended: a value the compare
    /// bounds. (Here the global is the table's first word: its value does
    /// not matter.)
    #[test]
    fn a_32_bit_global_bounded_by_ja() {
        let head: &[I] = &[
            // mov edx, [rip+G]; cmp edx, 4; ja +0x10
            I::Rip(&[0x8b, 0x15]),
            I::Raw(&[0x83, 0xfa, 0x04]),
            I::Raw(&[0x77, 0x10]),
        ];
        let tail: &[I] = &[
            // lea rcx, [rip+T]; movsxd rdx, [rcx+rdx*4]; add rdx, rcx; jmp rdx
            I::Rip(&[0x48, 0x8d, 0x0d]),
            I::Raw(&[0x48, 0x63, 0x14, 0x91]),
            I::Raw(&[0x48, 0x01, 0xca]),
            I::Raw(&[0xff, 0xe2]),
        ];
        let targets = [0x1100, 0x1110, 0x1120, 0x1130, 0x1140, 0x1150];
        let table = rel_table(&targets);
        assert_eq!(
            run(&[head, tail], &[false], table.clone(), &HashMap::new()),
            JumpResolution::Table {
                table: T,
                targets: targets[..5].to_vec()
            }
        );
        // Taken, the compare bounds nothing.
        assert!(matches!(
            run(&[head, tail], &[true], table, &HashMap::new()),
            JumpResolution::Unresolved(_)
        ));
    }

    /// glibc's `__res_context_query`: `movslq T(%rip), %rax; lea
    /// T(%rip), %rsi; add %rsi, %rax; jmp *%rax` reads entry 0 of a table
    /// of offsets: one target (not a tail call).
    #[test]
    fn a_table_entry_at_a_constant_index() {
        let b: &[I] = &[
            I::Rip(&[0x48, 0x63, 0x05]),
            I::Rip(&[0x48, 0x8d, 0x35]),
            I::Raw(&[0x48, 0x01, 0xf0]),
            I::Raw(&[0xff, 0xe0]),
        ];
        let targets = [0x1100, 0x1110, 0x1120];
        assert_eq!(
            run(&[b], &[], rel_table(&targets), &HashMap::new()),
            JumpResolution::Table {
                table: T,
                targets: vec![0x1100]
            }
        );
    }

    #[test]
    fn the_taken_side_of_ja_bounds_nothing() {
        let r = run(
            &[GUARD_JA, PIC],
            &[true],
            rel_table(&[0x1100; 6]),
            &HashMap::new(),
        );
        assert!(matches!(r, JumpResolution::Unresolved(_)), "{r:?}");
    }

    #[test]
    fn no_compare_no_table() {
        let r = run(&[PIC], &[], rel_table(&[0x1100; 6]), &HashMap::new());
        assert_eq!(
            r,
            JumpResolution::Unresolved("no bounding compare on the index")
        );
    }

    #[test]
    fn jbe_taken_and_jae_not_taken_bound() {
        // cmp edi, 5; jbe: taken means edi <= 5.
        let jbe: &[I] = &[I::Raw(&[0x83, 0xff, 0x05]), I::Raw(&[0x76, 0x10])];
        let r = run(
            &[jbe, PIC],
            &[true],
            rel_table(&[0x1100; 6]),
            &HashMap::new(),
        );
        assert!(
            matches!(r, JumpResolution::Table { ref targets, .. } if targets.len() == 6),
            "{r:?}"
        );
        // cmp edi, 5; jae: not taken means edi <= 4.
        let jae: &[I] = &[I::Raw(&[0x83, 0xff, 0x05]), I::Raw(&[0x73, 0x10])];
        let r = run(
            &[jae, PIC],
            &[false],
            rel_table(&[0x1100; 6]),
            &HashMap::new(),
        );
        assert!(
            matches!(r, JumpResolution::Table { ref targets, .. } if targets.len() == 5),
            "{r:?}"
        );
    }

    #[test]
    fn absolute_entries_through_relative_relocations() {
        // cmp edi, 2; ja; mov eax, edi; jmp [rax*8 + T]
        let guard: &[I] = &[I::Raw(&[0x83, 0xff, 0x02]), I::Raw(&[0x77, 0x10])];
        let jump: &[I] = &[
            I::Raw(&[0x89, 0xf8]),
            I::Raw(&[0xff, 0x24, 0xc5, 0x00, 0x20, 0x00, 0x00]),
        ];
        // The file holds zeros; RELATIVE relocations give the values (PIE).
        let relative: HashMap<u64, u64> = [(T, 0x1100), (T + 8, 0x1180), (T + 16, 0x1100)].into();
        let r = run(&[guard, jump], &[false], vec![0; 24], &relative);
        assert_eq!(
            r,
            JumpResolution::Table {
                table: T,
                targets: vec![0x1100, 0x1180, 0x1100]
            }
        );
    }

    #[test]
    fn gcc_o0_stack_slot_form() {
        let guard: &[I] = &[
            I::Raw(&[0x89, 0x7d, 0xfc]),       // mov [rbp-4], edi
            I::Raw(&[0x83, 0x7d, 0xfc, 0x03]), // cmp dword [rbp-4], 3
            I::Raw(&[0x77, 0x10]),             // ja
        ];
        let jump: &[I] = &[
            I::Raw(&[0x8b, 0x45, 0xfc]),                   // mov eax, [rbp-4]
            I::Raw(&[0x48, 0x8d, 0x14, 0x85, 0, 0, 0, 0]), // lea rdx, [rax*4]
            I::Rip(&[0x48, 0x8d, 0x05]),                   // lea rax, [rip+T]
            I::Raw(&[0x8b, 0x04, 0x02]),                   // mov eax, [rdx+rax]
            I::Raw(&[0x48, 0x98]),                         // cdqe
            I::Rip(&[0x48, 0x8d, 0x15]),                   // lea rdx, [rip+T]
            I::Raw(&[0x48, 0x01, 0xd0]),                   // add rax, rdx
            I::Raw(&[0xff, 0xe0]),                         // jmp rax
        ];
        let targets = [0x1200, 0x1210, 0x1220, 0x1230];
        let r = run(
            &[guard, jump],
            &[false],
            rel_table(&targets),
            &HashMap::new(),
        );
        assert_eq!(
            r,
            JumpResolution::Table {
                table: T,
                targets: targets.to_vec()
            }
        );
    }

    #[test]
    fn a_clobbered_index_loses_its_bound() {
        // cmp edi, 5; ja; add edi, edi (the index changes after the compare)
        let jump: &[I] = &[
            I::Raw(&[0x01, 0xff]),
            I::Rip(&[0x48, 0x8d, 0x15]),
            I::Raw(&[0x48, 0x63, 0x04, 0xba]),
            I::Raw(&[0x48, 0x01, 0xd0]),
            I::Raw(&[0xff, 0xe0]),
        ];
        let r = run(
            &[GUARD_JA, jump],
            &[false],
            rel_table(&[0x1100; 12]),
            &HashMap::new(),
        );
        assert!(matches!(r, JumpResolution::Unresolved(_)), "{r:?}");
    }

    #[test]
    fn pointer_jumps_are_tail_calls() {
        // mov rax, [rdi+8]; jmp rax
        let jump: &[I] = &[I::Raw(&[0x48, 0x8b, 0x47, 0x08]), I::Raw(&[0xff, 0xe0])];
        assert_eq!(
            run(&[jump], &[], Vec::new(), &HashMap::new()),
            JumpResolution::TailCall
        );
        // jmp [rip+slot]
        let got: &[I] = &[I::Rip(&[0xff, 0x25])];
        assert_eq!(
            run(&[got], &[], Vec::new(), &HashMap::new()),
            JumpResolution::TailCall
        );
        // shl rax, 5; lea r10, [rip+T]; mov rax, [r10+rax+0x18]; jmp rax:
        // a function pointer in an array of 32-byte structures.
        let field: &[I] = &[
            I::Raw(&[0x48, 0xc1, 0xe0, 0x05]),
            I::Rip(&[0x4c, 0x8d, 0x15]),
            I::Raw(&[0x49, 0x8b, 0x44, 0x02, 0x18]),
            I::Raw(&[0xff, 0xe0]),
        ];
        assert_eq!(
            run(&[field], &[], Vec::new(), &HashMap::new()),
            JumpResolution::TailCall
        );
        // jmp rsi: an argument, nothing known.
        let arg: &[I] = &[I::Raw(&[0xff, 0xe6])];
        assert!(matches!(
            run(&[arg], &[], Vec::new(), &HashMap::new()),
            JumpResolution::Unresolved(_)
        ));
    }

    #[test]
    fn table_outside_memory_is_unresolved() {
        let r = run(
            &[GUARD_JA, PIC],
            &[false],
            rel_table(&[0x1100; 2]),
            &HashMap::new(),
        );
        assert_eq!(
            r,
            JumpResolution::Unresolved("table outside the file's sections")
        );
    }

    #[test]
    fn glibc_printf_byte_class_then_table() {
        // lea eax, [r9-0x20]; cmp al, 0x5a; ja   (the character is checked)
        let guard: &[I] = &[
            I::Raw(&[0x41, 0x8d, 0x41, 0xe0]),
            I::Raw(&[0x3c, 0x5a]),
            I::Raw(&[0x77, 0x10]),
        ];
        // movzx eax, r9b; sub eax, 0x20; cdqe; movzx eax, byte [rdi+rax];
        // movsxd rax, [rsi+rax*4]; add rax, rcx; jmp rax
        let jump: &[I] = &[
            I::Raw(&[0x41, 0x0f, 0xb6, 0xc1]),
            I::Raw(&[0x83, 0xe8, 0x20]),
            I::Raw(&[0x48, 0x98]),
            I::Raw(&[0x0f, 0xb6, 0x04, 0x07]),
            I::Raw(&[0x48, 0x63, 0x04, 0x86]),
            I::Raw(&[0x48, 0x01, 0xc8]),
            I::Raw(&[0xff, 0xe0]),
        ];
        const CLASSES: u64 = 0x3000;
        const BASE: u64 = 0x1800;
        // 0x5b character classes in 0..=2; three jump-table entries.
        let classes: Vec<u8> = (0..0x5b).map(|i| (i % 3) as u8).collect();
        let table: Vec<u8> = [0x10i32, 0x20, 0x30]
            .iter()
            .flat_map(|e| e.to_le_bytes())
            .collect();
        let mut entry = |r: Register| match r {
            Register::RDI => Some(EntryFact::Const(CLASSES)),
            Register::RSI => Some(EntryFact::Const(T)),
            Register::RCX => Some(EntryFact::Const(BASE)),
            _ => None,
        };
        let r = run_with(
            &[guard, jump],
            &[false],
            vec![(T, table), (CLASSES, classes)],
            &HashMap::new(),
            &mut entry,
        );
        assert_eq!(
            r,
            JumpResolution::Table {
                table: T,
                targets: vec![BASE + 0x10, BASE + 0x20, BASE + 0x30]
            }
        );
    }

    /// `_dl_tunable_set_hwcaps` in static glibc (gcc 12 -O2): the table base
    /// `rbx` is set at the entry; `sub $4, %rax; cmp $0x16, %rax; ja default;
    /// movslq (%rbx,%rax,4), %rax; add %rbx, %rax; jmp *%rax`. The 64-bit
    /// compare bounds `rax - 4`, not a plain symbol.
    const OFFSET_GUARD: &[I] = &[
        I::Raw(&[0x48, 0x83, 0xe8, 0x04]),
        I::Raw(&[0x48, 0x83, 0xf8, 0x16]),
        I::Raw(&[0x77, 0x10]),
    ];
    // movsxd rax, [rbx+rax*4]; add rax, rbx; jmp rax
    const RBX_TABLE: &[I] = &[
        I::Raw(&[0x48, 0x63, 0x04, 0x83]),
        I::Raw(&[0x48, 0x01, 0xd8]),
        I::Raw(&[0xff, 0xe0]),
    ];

    fn rbx_is_t(r: Register) -> Option<EntryFact> {
        (r == Register::RBX).then_some(EntryFact::Const(T))
    }

    #[test]
    fn a_64_bit_compare_of_index_minus_constant_bounds_the_table() {
        let targets: Vec<u64> = (0..0x17).map(|i| 0x1100 + 0x10 * (i % 5)).collect();
        let r = run_with(
            &[OFFSET_GUARD, RBX_TABLE],
            &[false],
            vec![(T, rel_table(&targets))],
            &HashMap::new(),
            &mut rbx_is_t,
        );
        assert_eq!(
            r,
            JumpResolution::Table {
                table: T,
                targets: targets.clone()
            }
        );
        // The taken side of `ja` (the default) bounds nothing.
        let r = run_with(
            &[OFFSET_GUARD, RBX_TABLE],
            &[true],
            vec![(T, rel_table(&targets))],
            &HashMap::new(),
            &mut rbx_is_t,
        );
        assert_eq!(
            r,
            JumpResolution::Unresolved("no bounding compare on the index")
        );
    }

    #[test]
    fn a_32_bit_compare_of_a_64_bit_index_minus_constant_bounds_nothing() {
        // sub rax, 4; mov [rbp-0x18], rax; cmp dword [rbp-0x18], 0x16; ja:
        // only the low half of `rax - 4` is bounded.
        let guard: &[I] = &[
            I::Raw(&[0x48, 0x83, 0xe8, 0x04]),
            I::Raw(&[0x48, 0x89, 0x45, 0xe8]),
            I::Raw(&[0x83, 0x7d, 0xe8, 0x16]),
            I::Raw(&[0x77, 0x10]),
        ];
        // mov rax, [rbp-0x18]; then the table jump
        let reload: &[I] = &[I::Raw(&[0x48, 0x8b, 0x45, 0xe8])];
        let r = run_with(
            &[guard, reload, RBX_TABLE],
            &[false, false],
            vec![(T, rel_table(&[0x1100; 0x17]))],
            &HashMap::new(),
            &mut rbx_is_t,
        );
        assert_eq!(
            r,
            JumpResolution::Unresolved("no bounding compare on the index")
        );
    }

    #[test]
    fn an_index_compared_with_an_offset_reads_the_shifted_table() {
        // mov rcx, rax; sub rcx, 4; cmp rcx, 2; ja: 4 <= rax <= 6, so
        // `movsxd rax, [rbx+rax*4]` reads entries 4..=6 of T.
        let guard: &[I] = &[
            I::Raw(&[0x48, 0x89, 0xc1]),
            I::Raw(&[0x48, 0x83, 0xe9, 0x04]),
            I::Raw(&[0x48, 0x83, 0xf9, 0x02]),
            I::Raw(&[0x77, 0x10]),
        ];
        let all: Vec<u64> = (0..7).map(|i| 0x1100 + 0x10 * i).collect();
        let r = run_with(
            &[guard, RBX_TABLE],
            &[false],
            vec![(T, rel_table(&all))],
            &HashMap::new(),
            &mut rbx_is_t,
        );
        assert_eq!(
            r,
            JumpResolution::Table {
                table: T + 16,
                targets: all[4..].to_vec()
            }
        );
    }

    /// cc1's `hash_operand` (gcc -O2, non-PIE): `movzwl (%rbx), %edi; cmp
    /// $5, %di; ja; test %di, %di; je; cmp $5, %di; ja; jmp *T(,%rdi,8)`.
    /// The path proves the index in `1..=5`, but the code names the table
    /// at `T`, whose entry 0 is a label too: the table is described from
    /// `T` (before, from `T + 8`, which the rewriter did not find in the
    /// code, so the copy jumped through the original table). Without a
    /// label there, from the first entry the path reads, as before.
    #[test]
    fn an_absolute_table_read_past_entry_0_is_described_from_its_start() {
        let head: &[I] = &[
            I::Raw(&[0x0f, 0xb7, 0x3b]),       // movzwl (%rbx), %edi
            I::Raw(&[0x66, 0x83, 0xff, 0x05]), // cmp $5, %di
            I::Raw(&[0x77, 0x10]),             // ja
        ];
        let zero: &[I] = &[I::Raw(&[0x66, 0x85, 0xff]), I::Raw(&[0x74, 0x10])];
        let guard: &[I] = &[I::Raw(&[0x66, 0x83, 0xff, 0x05]), I::Raw(&[0x77, 0x10])];
        let jump: &[I] = &[I::Raw(&[0xff, 0x24, 0xfd, 0x00, 0x20, 0x00, 0x00])];
        let all: Vec<u64> = (0..6).map(|i| 0x1100 + 0x10 * i).collect();
        let table = |entry0: u64| -> Vec<u8> {
            std::iter::once(entry0)
                .chain(all[1..].iter().copied())
                .flat_map(u64::to_le_bytes)
                .collect()
        };
        let in_proc = |a: u64| (0x1000..0x2000).contains(&a);
        let blocks = [head, zero, guard, jump];
        let r = run_in(&blocks, &[false; 3], vec![(T, table(0x1100))], &in_proc);
        assert_eq!(
            r,
            Some(JumpResolution::Table {
                table: T,
                targets: all.clone()
            })
        );
        let r = run_in(&blocks, &[false; 3], vec![(T, table(0x7000))], &in_proc);
        assert_eq!(
            r,
            Some(JumpResolution::Table {
                table: T + 8,
                targets: all[1..].to_vec()
            })
        );
    }

    #[test]
    fn a_constant_target_is_computed() {
        // lea rax, [rip+T]; jmp rax
        let jump: &[I] = &[I::Rip(&[0x48, 0x8d, 0x05]), I::Raw(&[0xff, 0xe0])];
        assert_eq!(
            run(&[jump], &[], Vec::new(), &HashMap::new()),
            JumpResolution::Computed(vec![T])
        );
    }

    #[test]
    fn a_branch_on_constant_flags_prunes_the_path() {
        // mov eax, 0; test rax, rax; je  (never falls through) ... jmp rax
        let guard: &[I] = &[
            I::Raw(&[0xb8, 0, 0, 0, 0]),
            I::Raw(&[0x48, 0x85, 0xc0]),
            I::Raw(&[0x74, 0x10]),
        ];
        let jump: &[I] = &[I::Raw(&[0xff, 0xe0])];
        let insns = decode(&[guard, jump]);
        let slices: Vec<&[Instruction]> = insns.iter().map(Vec::as_slice).collect();
        let mem = Region(Vec::new());
        let relative = HashMap::new();
        let reader = TableReader {
            memory: &mem,
            pic: true,
            relative: &relative,
        };
        assert_eq!(
            resolve(&slices, &[false], &reader, &mut |_| None, &|_| false),
            None
        );
        assert_eq!(
            resolve(&slices, &[true], &reader, &mut |_| None, &|_| false),
            Some(JumpResolution::Computed(vec![0]))
        );
    }

    /// 32 distinct case addresses and their int32 table relative to `T`.
    fn cases(n: u64) -> (Vec<u64>, Vec<u8>) {
        let t: Vec<u64> = (0..n).map(|i| 0x1100 + 0x10 * i).collect();
        let table = rel_table(&t);
        (t, table)
    }

    // and rcx, 0xf; pmovmskb edx, xmm0; test rdx, rdx; jne
    const MASK_NONZERO: &[I] = &[
        I::Raw(&[0x48, 0x83, 0xe1, 0x0f]),
        I::Raw(&[0x66, 0x0f, 0xd7, 0xd0]),
        I::Raw(&[0x48, 0x85, 0xd2]),
        I::Raw(&[0x75, 0x10]),
    ];

    /// glibc 2.36 `__strcpy_sse2_unaligned` (libc.so.6 at 0xa3d10): the
    /// index is `bsf(mask) + 16 - (src & 15)`, in `1..=31` by interval
    /// arithmetic, so the table is read from its second entry.
    #[test]
    fn glibc_strcpy_bsf_plus_16_minus_alignment() {
        let jump: &[I] = &[
            I::Raw(&[0x48, 0x0f, 0xbc, 0xd2]), // bsf rdx, rdx
            I::Raw(&[0x48, 0x01, 0xce]),       // add rsi, rcx
            I::Raw(&[0x48, 0x83, 0xc2, 0x10]), // add rdx, 0x10
            I::Raw(&[0x48, 0x29, 0xca]),       // sub rdx, rcx
            I::Rip(&[0x4c, 0x8d, 0x1d]),       // lea r11, [rip+T]
            I::Raw(&[0x49, 0x63, 0x0c, 0x93]), // movsxd rcx, [r11+rdx*4]
            I::Raw(&[0x49, 0x8d, 0x0c, 0x0b]), // lea rcx, [r11+rcx]
            I::Raw(&[0xff, 0xe1]),             // jmp rcx
        ];
        let (t, table) = cases(32);
        let r = run_with(
            &[MASK_NONZERO, jump],
            &[true],
            vec![(T, table.clone())],
            &HashMap::new(),
            &mut |_| None,
        );
        assert_eq!(
            r,
            JumpResolution::Table {
                table: T + 4,
                targets: t[1..].to_vec()
            }
        );
        // Entry 0 is a label of the procedure: the table is described from
        // its start.
        let r = run_in(&[MASK_NONZERO, jump], &[true], vec![(T, table)], &|a| {
            (0x1000..0x1400).contains(&a)
        });
        assert_eq!(
            r,
            Some(JumpResolution::Table {
                table: T,
                targets: t
            })
        );
    }

    /// Without the mask (an unknown register scanned by `bsf` into
    /// another), nothing bounds the index.
    #[test]
    fn bsf_of_an_unknown_register_bounds_nothing() {
        let jump: &[I] = &[
            I::Raw(&[0x48, 0x0f, 0xbc, 0xd6]), // bsf rdx, rsi
            I::Rip(&[0x4c, 0x8d, 0x1d]),
            I::Raw(&[0x49, 0x63, 0x0c, 0x93]),
            I::Raw(&[0x49, 0x8d, 0x0c, 0x0b]),
            I::Raw(&[0xff, 0xe1]),
        ];
        let (_, table) = cases(64);
        let r = run_with(&[jump], &[], vec![(T, table)], &HashMap::new(), &mut |_| {
            None
        });
        assert_eq!(
            r,
            JumpResolution::Unresolved("no bounding compare on the index")
        );
    }

    /// glibc 2.36 `__strcmp_sse2_unaligned`-style dispatch (libc.so.6 at
    /// 0xa5350): both offsets are masked to `0..=15`, the compare orders
    /// them (swapping with `xchg` if needed), and the index `15 + a - b`
    /// with `a < b` lies in `0..=14`: a fact on the difference of two
    /// symbols.
    #[test]
    fn glibc_strcmp_ordered_offsets() {
        let guard: &[I] = &[
            I::Raw(&[0x83, 0xe1, 0x0f]), // and ecx, 0xf
            I::Raw(&[0x83, 0xe0, 0x0f]), // and eax, 0xf
            I::Raw(&[0x39, 0xc1]),       // cmp ecx, eax
            I::Raw(&[0x74, 0x26]),       // je
        ];
        let ja: &[I] = &[I::Raw(&[0x77, 0x07])];
        let swap: &[I] = &[
            I::Raw(&[0x41, 0x89, 0xd0]), // mov r8d, edx
            I::Raw(&[0x91]),             // xchg ecx, eax
            I::Raw(&[0x48, 0x87, 0xf7]), // xchg rdi, rsi
        ];
        let jump: &[I] = &[
            I::Raw(&[0x4c, 0x8d, 0x48, 0x0f]), // lea r9, [rax+0xf]
            I::Raw(&[0x49, 0x29, 0xc9]),       // sub r9, rcx
            I::Rip(&[0x4c, 0x8d, 0x15]),       // lea r10, [rip+T]
            I::Raw(&[0x4f, 0x63, 0x0c, 0x8a]), // movsxd r9, [r10+r9*4]
            I::Raw(&[0x4f, 0x8d, 0x14, 0x0a]), // lea r10, [r10+r9]
            I::Raw(&[0x41, 0xff, 0xe2]),       // jmp r10
        ];
        let (t, table) = cases(31);
        let want = JumpResolution::Table {
            table: T,
            targets: t[..15].to_vec(),
        };
        // ja taken (ecx > eax).
        let r = run_with(
            &[guard, ja, jump],
            &[false, true],
            vec![(T, table.clone())],
            &HashMap::new(),
            &mut |_| None,
        );
        assert_eq!(r, want);
        // ja not taken (ecx < eax), swapped.
        let r = run_with(
            &[guard, ja, swap, jump],
            &[false, false, false],
            vec![(T, table.clone())],
            &HashMap::new(),
            &mut |_| None,
        );
        assert_eq!(r, want);
        // je taken (equal offsets, were the jump reached that way): the
        // difference is 0, the index 15.
        let r = run_with(
            &[guard, jump],
            &[true],
            vec![(T, table)],
            &HashMap::new(),
            &mut |_| None,
        );
        assert_eq!(
            r,
            JumpResolution::Table {
                table: T + 15 * 4,
                targets: vec![t[15]]
            }
        );
    }

    /// glibc's `__strncpy_sse2_unaligned` (libc.so.6 at 0xa45e1): `cmp
    /// %r8, %rdx; jb` not taken gives `r8 <= rdx = bsf(mask) <= 15`, which
    /// bounds the table index `r8`; the taken side bounds nothing.
    #[test]
    fn glibc_strncpy_remaining_length_below_bsf() {
        let block: &[I] = &[
            I::Raw(&[0x66, 0x0f, 0xd7, 0xd0]), // pmovmskb edx, xmm0
            I::Raw(&[0x48, 0x0f, 0xbc, 0xd2]), // bsf rdx, rdx
            I::Raw(&[0x4c, 0x39, 0xc2]),       // cmp rdx, r8
            I::Raw(&[0x72, 0x10]),             // jb
        ];
        let jump: &[I] = &[
            I::Rip(&[0x4c, 0x8d, 0x1d]),       // lea r11, [rip+T]
            I::Raw(&[0x4b, 0x63, 0x0c, 0x83]), // movsxd rcx, [r11+r8*4]
            I::Raw(&[0x49, 0x8d, 0x0c, 0x0b]), // lea rcx, [r11+rcx]
            I::Raw(&[0xff, 0xe1]),             // jmp rcx
        ];
        let (t, table) = cases(33);
        let r = run_with(
            &[block, jump],
            &[false],
            vec![(T, table.clone())],
            &HashMap::new(),
            &mut |_| None,
        );
        assert_eq!(
            r,
            JumpResolution::Table {
                table: T,
                targets: t[..16].to_vec()
            }
        );
        let r = run_with(
            &[block, jump],
            &[true],
            vec![(T, table)],
            &HashMap::new(),
            &mut |_| None,
        );
        assert_eq!(
            r,
            JumpResolution::Unresolved("no bounding compare on the index")
        );
    }

    /// glibc's strncpy zero-fill tail (libc.so.6 at 0xa50f6): `sub $0x40,
    /// %r8; jb` taken leaves `r8` in `-0x40..=-1`; `add $0x20; jl` and
    /// `sub $0x10; jl` not taken (signed, no overflow possible) leave
    /// `0..=0xf`.
    #[test]
    fn glibc_signed_flags_of_sub_and_add() {
        let b1: &[I] = &[I::Raw(&[0x49, 0x83, 0xe8, 0x40]), I::Raw(&[0x72, 0x1d])];
        let b2: &[I] = &[I::Raw(&[0x49, 0x83, 0xc0, 0x20]), I::Raw(&[0x7c, 0x2c])];
        let b3: &[I] = &[I::Raw(&[0x49, 0x83, 0xe8, 0x10]), I::Raw(&[0x7c, 0x38])];
        let jump: &[I] = &[
            I::Rip(&[0x4c, 0x8d, 0x1d]),
            I::Raw(&[0x4b, 0x63, 0x0c, 0x83]),
            I::Raw(&[0x49, 0x8d, 0x0c, 0x0b]),
            I::Raw(&[0xff, 0xe1]),
        ];
        let (t, table) = cases(16);
        let r = run_with(
            &[b1, b2, b3, jump],
            &[true, false, false],
            vec![(T, table.clone())],
            &HashMap::new(),
            &mut |_| None,
        );
        assert_eq!(
            r,
            JumpResolution::Table {
                table: T,
                targets: t
            }
        );
        // Without the first block `r8 + 0x20` may overflow: no bound.
        let r = run_with(
            &[b2, b3, jump],
            &[false, false],
            vec![(T, table)],
            &HashMap::new(),
            &mut |_| None,
        );
        assert!(matches!(r, JumpResolution::Unresolved(_)), "{r:?}");
    }

    /// glibc's `__memmove_ssse3` (libc.so.6 at 0x16e9c4): `and $0xf, %ecx;
    /// shl $6, %ecx; add %r9, %rcx; jmp *%rcx` with `r9` a label: one of
    /// 16 labels 64 bytes apart. Without the mask it stays unresolved.
    #[test]
    fn glibc_memmove_label_plus_shifted_offset() {
        let jump: &[I] = &[
            I::Rip(&[0x4c, 0x8d, 0x0d]), // lea r9, [rip+T]
            I::Raw(&[0x83, 0xe1, 0x0f]), // and ecx, 0xf
            I::Raw(&[0xc1, 0xe1, 0x06]), // shl ecx, 6
            I::Raw(&[0x4c, 0x01, 0xc9]), // add rcx, r9
            I::Raw(&[0xff, 0xe1]),       // jmp rcx
        ];
        let in_proc = |a: u64| (T..T + 0x1000).contains(&a);
        let want: Vec<u64> = (0..16).map(|i| T + 64 * i).collect();
        assert_eq!(
            run_in(&[jump], &[], Vec::new(), &in_proc),
            Some(JumpResolution::Computed(want))
        );
        // `and $0xf, %ecx; shl $5, %ecx; lea (%rcx,%rcx,2), %r8d; lea
        // L(%rip), %rdx; add %r8, %rdx; jmp *%rdx` (0x16e9dc): 96 apart.
        let times3: &[I] = &[
            I::Raw(&[0x83, 0xe1, 0x0f]),       // and ecx, 0xf
            I::Raw(&[0xc1, 0xe1, 0x05]),       // shl ecx, 5
            I::Raw(&[0x44, 0x8d, 0x04, 0x49]), // lea r8d, [rcx+rcx*2]
            I::Rip(&[0x48, 0x8d, 0x15]),       // lea rdx, [rip+T]
            I::Raw(&[0x4c, 0x01, 0xc2]),       // add rdx, r8
            I::Raw(&[0xff, 0xe2]),             // jmp rdx
        ];
        let want: Vec<u64> = (0..16).map(|i| T + 96 * i).collect();
        assert_eq!(
            run_in(&[times3], &[], Vec::new(), &in_proc),
            Some(JumpResolution::Computed(want))
        );
        let unmasked: &[I] = &[
            I::Rip(&[0x4c, 0x8d, 0x0d]),
            I::Raw(&[0xc1, 0xe1, 0x06]),
            I::Raw(&[0x4c, 0x01, 0xc9]),
            I::Raw(&[0xff, 0xe1]),
        ];
        assert_eq!(
            run_in(&[unmasked], &[], Vec::new(), &in_proc),
            Some(JumpResolution::Unresolved(LABEL_ARITHMETIC))
        );
    }

    /// `_dl_find_object`: `mov _rtld_global_ro@GOT(%rip), %rax; jmp
    /// *0x360(%rax)`, a function pointer in a global structure.
    #[test]
    fn a_pointer_field_of_a_global_is_a_tail_call() {
        let jump: &[I] = &[
            I::Rip(&[0x48, 0x8b, 0x05]),                   // mov rax, [rip+T]
            I::Raw(&[0xff, 0xa0, 0x60, 0x03, 0x00, 0x00]), // jmp [rax+0x360]
        ];
        assert_eq!(
            run(&[jump], &[], vec![0; 8], &HashMap::new()),
            JumpResolution::TailCall
        );
    }

    /// A path whose compare contradicts what is known cannot run: `mov
    /// $0x30, %ebx; cmp $0x2b, %ebx; ja` does not fall through.
    #[test]
    fn a_compare_against_a_known_range_prunes_the_path() {
        let guard: &[I] = &[
            I::Raw(&[0xbb, 0x30, 0, 0, 0]), // mov ebx, 0x30
            I::Raw(&[0x83, 0xfb, 0x2b]),    // cmp ebx, 0x2b
            I::Raw(&[0x77, 0x10]),          // ja
        ];
        let jump: &[I] = &[
            I::Rip(&[0x48, 0x8d, 0x0d]),       // lea rcx, [rip+T]
            I::Raw(&[0x48, 0x63, 0x04, 0x99]), // movsxd rax, [rcx+rbx*4]
            I::Raw(&[0x48, 0x01, 0xc8]),       // add rax, rcx
            I::Raw(&[0xff, 0xe0]),             // jmp rax
        ];
        let (_, table) = cases(0x31);
        assert_eq!(
            run_in(&[guard, jump], &[false], vec![(T, table)], &|_| false),
            None
        );
    }

    #[test]
    fn runs_of_one_table_merge() {
        let (t, table) = cases(8);
        let mem = Region(vec![(T, table)]);
        let relative = HashMap::new();
        let reader = TableReader {
            memory: &mem,
            pic: true,
            relative: &relative,
        };
        assert_eq!(
            merge_tables(&reader, (T + 4, &t[1..5]), (T, &t[..3])),
            Some(JumpResolution::Table {
                table: T,
                targets: t[..5].to_vec()
            })
        );
        // A gap between the runs, or lists that are not the memory's
        // entries, do not merge.
        assert_eq!(
            merge_tables(&reader, (T, &t[..2]), (T + 16, &t[4..6])),
            None
        );
        assert_eq!(
            merge_tables(&reader, (T, &t[..2]), (T + 4, &[0x5555])),
            None
        );
    }
}
