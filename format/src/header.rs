//! The 64-byte file header that opens every trace (layout in `docs/format.md`).
//!
//! Invariants: the header is exactly [`HEADER_LEN`] bytes for every 1.x version (new
//! file-wide facts go into new section kinds, never into a longer header), so its
//! checksum sits at a fixed place and a single damaged byte is always caught.
//! The version is checked before the checksum because another major may lay the
//! header out differently.

use crate::bytes::{le_u16, le_u32, le_u64};
use crate::error::{Error, Result};
use crate::section::SectionKind;

/// The first 8 bytes of every trace.
pub const MAGIC: [u8; 8] = *b"AETRACE\0";
/// Major version written and read: a reader refuses any other major.
pub const VERSION_MAJOR: u16 = 1;
/// Minor version written: readers accept any minor of their major (see docs/format.md).
pub const VERSION_MINOR: u16 = 22;
/// The first minor whose SIGNAL rips are never glibc's signal restorer
/// (the runtime reports where the restorer returns instead).
pub const MINOR_RESTORER_RESOLVED: u16 = 4;
/// The first minor whose traced handlers return through the runtime's
/// restorer, which writes SIGRETURN (where the thread resumes) after each.
pub const MINOR_SIGRETURN: u16 = 11;
/// The first minor whose `rep` string instructions (`movs`, `stos`,
/// `lods`, `ins`, `outs`; `--data`) that fault have their `rcx`, `rsi` and
/// `rdi` at the fault as three VALUEs right after the SIGNAL or FAULT:
/// how many iterations ran before it.
pub const MINOR_REP_FAULT: u16 = 13;
/// The first minor whose data values are the ones this reader expects:
/// 1.7's outside-entry stubs write `rsp` as a VALUE right after ENTER;
/// 1.8 records a register at its definition where two addresses use it,
/// and evaluates 32-bit arithmetic (fewer values); 1.15 also records a
/// register before the end of a predecessor that loses it at a join the
/// other ways into know it (`analysis::addr::exec`); 1.17 closes such a
/// join whenever the block after it uses the register (a loop head that
/// would learn it back every iteration), `rsp` included; 1.18 starts the
/// return point of a call whose callee never runs traced code with the
/// registers the ABI preserves known; 1.19 does so after a call to a
/// traced leaf too; 1.20 records the result of a call to a thread
/// constant's import (`__errno_location`) once per thread and handler;
/// 1.22 starts a procedure entered only by direct calls with the argument
/// registers its entry block uses, recorded at a call that does not know
/// them. The regenerator's analysis decides where values are, so older data
/// traces are refused.
pub const MINOR_DATA_VALUES: u16 = 22;
/// The first minor whose control-only traces have, like data traces,
/// the entry's `rsp` as a VALUE right after each ENTER an outside-entry
/// stub writes (one per entry from untraced code or by an indirect call),
/// or an ENTER_SAME (kind 21) where it repeats the thread's last: the
/// debugger's frame addresses. Readers of control flow skip the values
/// and take ENTER_SAME as ENTER.
pub const MINOR_ENTRY_RSP: u16 = 21;
/// The first minor whose SETJMP records carry `rsp` and whose setjmp
/// calls write SETJMP_RESUME when they return again (no LONGJMP): older
/// SETJMP and LONGJMP records name jmp_bufs, which regen refuses.
pub const MINOR_SETJMP_RSP: u16 = 10;
/// The first minor whose recorder ties an exec'd image's modules to its
/// stream (IMAGE sections): a stream started by an exec without one runs
/// an image whose modules the trace does not know. Older traces key
/// modules by pid, as their readers did.
pub const MINOR_IMAGES: u16 = 12;
/// Size of the file header; the first section starts here.
pub const HEADER_LEN: usize = 64;
/// `e_machine` of x86-64, the only architecture traced so far.
pub const ARCH_X86_64: u32 = 62;
/// Incompatible flag: CHUNKs may use codec 2, `zstd+values` (1.7,
/// `values`); a reader without it refuses the file at its header.
pub const INCOMPAT_VALUE_CODEC: u32 = 1;
/// Incompatible flag: CHUNKs may use codec 3, `zstd+split` (1.9,
/// `values`); a reader without it refuses the file at its header.
pub const INCOMPAT_SPLIT_CODEC: u32 = 2;
/// Incompatible feature flags this reader understands.
pub const KNOWN_INCOMPAT_FLAGS: u32 = INCOMPAT_VALUE_CODEC | INCOMPAT_SPLIT_CODEC;

const CREATOR_LEN: usize = 24;

/// The decoded file header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Format major version: a reader refuses a major it does not know.
    pub major: u16,
    /// Format minor version: newer minors only add what older readers may skip.
    pub minor: u16,
    /// Feature bits a reader must understand to read the file.
    pub incompat_flags: u32,
    /// Feature bits a reader may ignore.
    pub compat_flags: u32,
    /// ELF `e_machine` of the traced program.
    pub arch: u32,
    /// Creation time, nanoseconds since the Unix epoch.
    pub created_unix_ns: u64,
    /// The program that wrote the trace, e.g. `aetrace 0.1.0` (at most 24 bytes).
    pub creator: String,
}

impl Header {
    /// A header for a trace written now by this crate's version.
    pub fn new(creator: &str, created_unix_ns: u64) -> Result<Self> {
        if creator.len() > CREATOR_LEN || creator.contains('\0') {
            return Err(Error::Misuse(format!(
                "creator {creator:?} must be at most {CREATOR_LEN} bytes without NUL"
            )));
        }
        Ok(Header {
            major: VERSION_MAJOR,
            minor: VERSION_MINOR,
            incompat_flags: 0,
            compat_flags: 0,
            arch: ARCH_X86_64,
            created_unix_ns,
            creator: creator.to_owned(),
        })
    }

    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        // Fixed offsets into a fixed-size array: cannot go out of bounds.
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..10].copy_from_slice(&self.major.to_le_bytes());
        h[10..12].copy_from_slice(&self.minor.to_le_bytes());
        h[12..16].copy_from_slice(&self.incompat_flags.to_le_bytes());
        h[16..20].copy_from_slice(&self.compat_flags.to_le_bytes());
        h[20..24].copy_from_slice(&self.arch.to_le_bytes());
        h[24..32].copy_from_slice(&self.created_unix_ns.to_le_bytes());
        let creator = self.creator.as_bytes();
        let n = creator.len().min(CREATOR_LEN);
        h[32..32 + n].copy_from_slice(&creator[..n]);
        // 56..60 reserved, zero.
        let crc = crc32fast::hash(&h[..60]);
        h[60..64].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Decodes and checks the header at the start of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Header> {
        let magic = bytes.get(..MAGIC.len()).unwrap_or(bytes);
        if MAGIC.get(..magic.len()) != Some(magic) {
            return Err(Error::NotATrace);
        }
        let truncated = Error::Truncated {
            offset: 0,
            what: "file header",
        };
        let (Some(major), Some(minor)) = (le_u16(bytes, 8), le_u16(bytes, 10)) else {
            return Err(truncated);
        };
        if major != VERSION_MAJOR {
            return Err(Error::UnsupportedVersion { major, minor });
        }
        let Some(h) = bytes.get(..HEADER_LEN) else {
            return Err(truncated);
        };
        let stored = le_u32(h, 60).unwrap_or(0);
        if crc32fast::hash(h.get(..60).unwrap_or(&[])) != stored {
            return Err(Error::BadChecksum {
                offset: 0,
                kind: SectionKind::FILE_HEADER,
                part: "header",
            });
        }
        let field = |at| le_u32(h, at).unwrap_or(0);
        let incompat_flags = field(12);
        if incompat_flags & !KNOWN_INCOMPAT_FLAGS != 0 {
            return Err(Error::UnsupportedFeatures {
                flags: incompat_flags & !KNOWN_INCOMPAT_FLAGS,
            });
        }
        let creator = h.get(32..32 + CREATOR_LEN).unwrap_or(&[]);
        let creator = creator.split(|&b| b == 0).next().unwrap_or(&[]);
        let creator = std::str::from_utf8(creator)
            .map_err(|_| Error::corrupt(32, "creator is not UTF-8"))?
            .to_owned();
        Ok(Header {
            major,
            minor,
            incompat_flags,
            compat_flags: field(16),
            arch: field(20),
            created_unix_ns: le_u64(h, 24).unwrap_or(0),
            creator,
        })
    }
}
