//! The rewriter's error type.
//!
//! Every message is one line naming the file it concerns, so the
//! command-line front end can print it as is. [`Refusal`] lists the kinds:
//! what the rewriter refuses to rewrite (docs/rewrite.md), what the new ELF
//! cannot hold, and internal failures; each message's text is the one
//! users and tests grep for.

use std::path::PathBuf;

use aetrace_graph::BlockId;

use crate::codegen::CodegenError;
use crate::counters::CounterError;
use crate::unwind::UnwindError;
use crate::FAULT_ENV;

/// Everything that can go wrong while rewriting a module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The module could not be loaded or analysed.
    #[error(transparent)]
    Analysis(#[from] aetrace_analysis::Error),
    /// The rewritten ELF could not be produced.
    #[error("{}: cannot rewrite: {what}", path.display())]
    Rewrite {
        /// The module being rewritten.
        path: PathBuf,
        /// Why the rewriter gave up on it.
        what: Refusal,
    },
}

impl Error {
    /// The additions could not be detached ([`Refusal::Detached`]): the
    /// module can still be rewritten with them attached.
    pub fn is_detach_refusal(&self) -> bool {
        matches!(
            self,
            Error::Rewrite {
                what: Refusal::Detached(_),
                ..
            }
        )
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a module cannot be rewritten.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    // The options and the module (`limits`, the context).
    /// The fault-injection variable is not `PROCEDURE:WITNESS`.
    #[error("{FAULT_ENV}={0}: expected PROCEDURE:WITNESS")]
    FaultSyntax(String),
    /// The fault-injection variable names a witness edge the procedure lacks.
    #[error("{FAULT_ENV}: procedure {proc} has no witness {witness}")]
    FaultNoWitness {
        /// The procedure named in the variable.
        proc: String,
        /// The witness-edge number asked for.
        witness: u32,
    },
    /// A static executable that can start threads was asked for path
    /// profiles or `--stop-at`, which need the first thread at the entry point.
    #[error(
        "{what} of a static executable that can start threads (it has {starter}): not \
         supported, its first thread is not known at the entry point"
    )]
    StaticThreads {
        /// The feature asked for: path profiles or `--stop-at`.
        what: &'static str,
        /// The thread starter found in the executable.
        starter: &'static str,
    },
    /// A shared object was given as the main program rather than with `--libs`.
    #[error("a shared object can only be instrumented as a library (--libs)")]
    SharedObject,
    /// An executable was given among the libraries.
    #[error("an executable cannot be instrumented as a library")]
    ExecutableAsLibrary,
    /// The module has more procedures than an ENTER record can number.
    #[error("{procs} procedures: ENTER records number at most {max} per module")]
    TooManyProcedures {
        /// How many procedures the module has.
        procs: usize,
        /// The most an ENTER record can number.
        max: u32,
    },
    /// The program headers cannot be read or make no sense.
    #[error("program headers: {0}")]
    ProgramHeaders(String),
    /// `--stop-at` with call events was asked of a program with C++ landing pads.
    #[error(
        "--stop-at with --event calls cannot stop exactly yet in a program that throws C++ \
         exceptions (use --event insns or blocks)"
    )]
    StopAtCallsThrows,
    /// Path profiles or `--stop-at` were asked of a program where a
    /// procedure not followed exactly reaches `longjmp`.
    #[error(
        "path profiles and --stop-at cannot follow a longjmp: procedure {proc} ({}) {} \
         longjmp at {at:#x}",
        if *.left_alone { "left alone" } else { "counted" },
        if *.tail { "tail-jumps to" } else { "calls" }
    )]
    UnfollowedLongjmp {
        /// The procedure that reaches `longjmp`.
        proc: String,
        /// Whether that procedure is left alone (else it is counted).
        left_alone: bool,
        /// Whether it tail-jumps to `longjmp` (else it calls it).
        tail: bool,
        /// Address of the call or jump.
        at: u64,
    },
    /// Path profiles were asked of a program that does something they cannot follow.
    #[error("path profiles of programs that {0} are not supported yet")]
    PathProfiles(PathLimit),
    /// `--stop-at` was asked of a program in which the named procedure calls setjmp or longjmp.
    #[error("--stop-at cannot count exactly: procedure {0} calls setjmp or longjmp")]
    StopAtSetjmp(String),
    /// `--data`: an instruction whose references cannot be recorded exactly.
    #[error("--data: {at}: {why}")]
    DataForm {
        /// The procedure, the instruction's link-time address and the
        /// instruction disassembled.
        at: String,
        /// Why it is refused.
        why: String,
    },

    // The plans (`plan`).
    /// The path counters of all procedures overflow the counter index space.
    #[error("too many path counters")]
    TooManyPathCounters,
    /// Counter placement or path numbering failed for procedure `proc`.
    #[error("{proc}: {why}")]
    Counters {
        /// The procedure whose plan failed.
        proc: String,
        /// What went wrong.
        #[source]
        why: CounterError,
    },
    /// A path-profile plan holds a landing or setjmp counter (a bug).
    #[error("{0}: internal: a landing or setjmp counter in a path profile")]
    PathCounterKinds(String),
    /// A jump-table case does not start a block of the procedure's CFG.
    #[error("{proc}: case {case:#x} is not a block")]
    CaseNotBlock {
        /// The procedure with the jump table.
        proc: String,
        /// The case's target address.
        case: u64,
    },
    /// Every procedure is left alone, so there is nothing to instrument.
    #[error("no procedure can be traced")]
    NothingTraced,
    /// The entry point of a static executable is in no traced procedure.
    #[error(
        "static executable: the entry point {entry:#x} cannot be traced ({}), so the runtime \
         has nowhere to start",
        match .left_alone {
            Some((name, why)) => format!("{name} is left alone: {why}"),
            None => "no procedure starts there".to_owned(),
        }
    )]
    StaticEntry {
        /// The ELF entry point.
        entry: u64,
        /// The procedure at the entry point and why it is left alone, if
        /// one starts there.
        left_alone: Option<(String, String)>,
    },
    /// A procedure's witness edges do not fit the 16-bit witness numbers.
    #[error("a procedure has more than 65535 witness edges")]
    TooManyWitnesses,
    /// A block's bytes lie outside the file (e.g. in `.bss`).
    #[error("{block} at {start:#x}: bytes not in the file")]
    BlockBytes {
        /// The block.
        block: BlockId,
        /// Its start address.
        start: u64,
    },
    /// Re-decoding a block while copying it disagrees with the recovered CFG.
    #[error("{block}: instruction at {at:#x} does not decode as the CFG says")]
    BlockDecode {
        /// The block.
        block: BlockId,
        /// Address of the instruction that decodes differently.
        at: u64,
    },

    // Code emission and linking (`emit`, `link`).
    /// The embedded runtime object could not be loaded or linked.
    #[error("{0}")]
    Runtime(aetrace_runtime::Error),
    /// Code generation (`codegen`, `counters`, `pathprof`).
    #[error(transparent)]
    Codegen(#[from] CodegenError),
    /// The new `.eh_frame` or `.eh_frame_hdr` could not be built.
    #[error("unwind tables: {0}")]
    Unwind(#[from] UnwindError),
    /// The second emission pass produced counter code of another size (a bug).
    #[error("counter code changed size between passes")]
    CounterSizeChanged,
    /// The entry point has no springboard to redirect to (a bug).
    #[error("internal: no springboard at the entry point")]
    NoEntrySpringboard,
    /// The runtime object lacks a symbol the rewriter links against.
    #[error("runtime lacks {0}")]
    RuntimeLacks(&'static str),
    /// The lazily bound GOT slots are not the ones the runtime expects (a bug).
    #[error("internal: GOT slots with a LAZY piece {got:x?}, expected {want:x?}")]
    LazySlots {
        /// The slots found.
        got: Vec<u64>,
        /// The slots expected.
        want: Vec<u64>,
    },
    /// A springboard's jump cannot reach its target with a rel32.
    #[error("springboard out of range")]
    SpringboardRange,

    // The new ELF (`elfout`).
    /// No room is left in the 47-bit address space for the new segments.
    #[error("the address space is exhausted above the image")]
    AddressSpace,
    /// A dynamic module has no `PT_DYNAMIC` segment to patch.
    #[error("no PT_DYNAMIC")]
    NoDynamic,
    /// A preinit function was asked of a static program.
    #[error(
        "a preinit function needs a dynamically linked executable (PT_INTERP): static \
         programs do not run DT_PREINIT_ARRAY; use a new entry point"
    )]
    PreinitStatic,
    /// An init function was asked of an executable.
    #[error("an init function is for shared objects (ET_DYN without DF_1_PIE)")]
    InitNotShared,
    /// A preinit function was asked of a shared object (not a PIE).
    #[error(
        "a preinit function needs an executable, and this ET_DYN has no DF_1_PIE: ld.so runs \
         DT_PREINIT_ARRAY for the main program only"
    )]
    PreinitNotPie,
    /// Detached additions (`elfout`, a start-up `--libs` library) were
    /// asked with something `ld.so` would read in them, or do not fit
    /// their slot: the caller may rewrite the module attached.
    #[error("the added segments cannot be detached: {0}")]
    Detached(&'static str),
    /// Both a preinit and an init function were asked for.
    #[error("both a preinit and an init function")]
    PreinitAndInit,
    /// A library search path was asked for in a module without a preinit
    /// array (only a dynamically linked executable has one).
    #[error("a library search path only goes into a dynamically linked executable")]
    SearchWithoutPreinit,
    /// An entry of the init or preinit array cannot be moved to the new array.
    #[error(
        "{array} entry at {at:#x} has no RELATIVE relocation (cannot copy it to the new array)"
    )]
    NoRelative {
        /// `DT_PREINIT_ARRAY` or `DT_INIT_ARRAY`.
        array: &'static str,
        /// Address of the entry.
        at: u64,
    },
    /// `DT_JMPREL` overlaps `DT_RELA` other than as its tail.
    #[error("DT_JMPREL lies inside DT_RELA but not at its end")]
    JmprelInsideRela,
    /// A patch of the original image falls outside the file-backed part of a `PT_LOAD`.
    #[error("patch [{at:#x}, +{len}) is not inside the file-backed part of a PT_LOAD")]
    PatchOutside {
        /// Virtual address of the patch.
        at: u64,
        /// Its length in bytes.
        len: u64,
    },
    /// A patch's file range lies past the end of the file.
    #[error("patch out of the file")]
    PatchOutOfFile,
    /// Two patches cover the same bytes (at the given address).
    #[error("patches overlap at {0:#x}")]
    PatchesOverlap(u64),
    /// The program headers, with the new ones, exceed one page.
    #[error("{0} program headers do not fit the kernel's one-page limit")]
    TooManyHeaders(usize),
    /// A new segment is ill-formed.
    #[error("new segment at {vaddr:#x}: {why}")]
    NewSegment {
        /// The segment's virtual address.
        vaddr: u64,
        /// What is wrong with it.
        why: SegmentFault,
    },
    /// The new unwind tables do not lie in a new segment's file bytes.
    #[error("{what} [{addr:#x}, +{len:#x}) is not in the file bytes of a new segment")]
    NotInNewSegment {
        /// The new `.eh_frame_hdr` or `.eh_frame`.
        what: &'static str,
        /// Its virtual address.
        addr: u64,
        /// Its length in bytes.
        len: u64,
    },
    /// A new entry, preinit or init address is not in executable file-backed memory.
    #[error("{what} {addr:#x} is not in the file-backed part of an executable segment")]
    NotExecutable {
        /// Entry, preinit or init.
        what: &'static str,
        /// The address.
        addr: u64,
    },
}

/// What path profiles cannot follow (`limits`).
#[derive(Debug, thiserror::Error)]
pub enum PathLimit {
    /// A procedure calls setjmp or longjmp, which abandon frames with active paths.
    #[error("abandon frames: procedure {proc} calls setjmp/longjmp at {at:#x}")]
    Setjmp {
        /// The calling procedure.
        proc: String,
        /// Address of the call.
        at: u64,
    },
    /// A procedure calls vfork, whose child shares the parent's path state.
    #[error("share memory with a child: procedure {proc} calls vfork at {at:#x}")]
    Vfork {
        /// The calling procedure.
        proc: String,
        /// Address of the call.
        at: u64,
    },
    /// A procedure has a C++ landing pad, reached by unwinding past frames.
    #[error("abandon frames: procedure {proc} has a C++ landing pad at {pad:#x}")]
    LandingPad {
        /// The procedure with the pad.
        proc: String,
        /// Address of the landing pad.
        pad: u64,
    },
    /// A procedure calls fork, after which both processes would flush inherited paths.
    #[error(
        "fork: procedure {proc} calls a fork at {at:#x} (each process would take back the \
         active paths of the frames it inherits)"
    )]
    Fork {
        /// The calling procedure.
        proc: String,
        /// Address of the call.
        at: u64,
    },
}

/// What is wrong with a new segment (`elfout::Additions::segments`).
#[derive(Debug, thiserror::Error)]
pub enum SegmentFault {
    /// Its virtual address is not a multiple of the page size.
    #[error("vaddr is not page-aligned")]
    NotPageAligned,
    /// It starts below the given address, the first free one.
    #[error("below {0:#x} (first_free_vaddr or the previous segment's end)")]
    Below(u64),
    /// Its memory size is zero or smaller than its file bytes.
    #[error("mem_size is zero or smaller than its bytes")]
    MemSize,
    /// It asks for flags other than read, write and execute.
    #[error("flags other than PF_R, PF_W, PF_X")]
    Flags,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::QueryAt;

    /// The messages built from several parts read as they did when they
    /// were format strings (users and tests grep them).
    #[test]
    fn messages_keep_their_text() {
        let cases: [(Refusal, &str); 9] = [
            (
                Refusal::UnfollowedLongjmp {
                    proc: "f".into(),
                    left_alone: false,
                    tail: true,
                    at: 0x10,
                },
                "path profiles and --stop-at cannot follow a longjmp: procedure f (counted) \
                 tail-jumps to longjmp at 0x10",
            ),
            (
                Refusal::StaticEntry {
                    entry: 0x401000,
                    left_alone: Some(("_start".into(), "2 entry points".into())),
                },
                "static executable: the entry point 0x401000 cannot be traced (_start is left \
                 alone: 2 entry points), so the runtime has nowhere to start",
            ),
            (
                Refusal::StaticEntry {
                    entry: 0x10,
                    left_alone: None,
                },
                "static executable: the entry point 0x10 cannot be traced (no procedure starts \
                 there), so the runtime has nowhere to start",
            ),
            (
                Refusal::PathProfiles(PathLimit::Vfork {
                    proc: "g".into(),
                    at: 0x20,
                }),
                "path profiles of programs that share memory with a child: procedure g calls \
                 vfork at 0x20 are not supported yet",
            ),
            (
                Refusal::NewSegment {
                    vaddr: 0x1000,
                    why: SegmentFault::Below(0x2000),
                },
                "new segment at 0x1000: below 0x2000 (first_free_vaddr or the previous \
                 segment's end)",
            ),
            (
                Refusal::Codegen(CodegenError::Procedure {
                    name: "f".into(),
                    source: Box::new(CodegenError::LazyPltCounted {
                        at: 0x30,
                        count: true,
                        exit: false,
                        witness: Some(2),
                    }),
                }),
                "procedure f: internal: the PLT jump at 0x30 decided by LAZY has a count \
                 (true), EXIT (false) or witness (Some(2))",
            ),
            (
                Refusal::Codegen(CodegenError::UnwitnessedTailCall(0x40)),
                "conditional tail call at 0x40 without a witness: its transfer cannot be counted",
            ),
            (
                Refusal::Counters {
                    proc: "g".into(),
                    why: CounterError::StopQuery(QueryAt::Call(BlockId::from_u32(3))),
                },
                "g: the stop-at query of the call in block block3 does not fit 32 bits",
            ),
            (
                Refusal::Unwind(UnwindError::At {
                    what: "FDE for",
                    at: 0x50,
                    source: Box::new(UnwindError::Overflow("args_size")),
                }),
                "unwind tables: FDE for 0x50: args_size overflow",
            ),
        ];
        for (r, text) in cases {
            assert_eq!(r.to_string(), text);
        }
    }
}
