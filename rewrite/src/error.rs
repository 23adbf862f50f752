//! The rewriter's error type.
//!
//! Every message is one line naming the file it concerns, so the
//! command-line front end can print it as is. [`Refusal`] lists the kinds:
//! what the rewriter refuses to rewrite (docs/rewrite.md), what the new ELF
//! cannot hold, and internal failures; each message's text is the one
//! users and tests grep for.

use std::path::PathBuf;

use aetrace_graph::BlockId;

use crate::FAULT_ENV;

/// Everything that can go wrong while rewriting a module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The module could not be loaded or analysed.
    #[error(transparent)]
    Analysis(#[from] aetrace_analysis::Error),
    /// The rewritten ELF could not be produced.
    #[error("{}: cannot rewrite: {what}", path.display())]
    Rewrite { path: PathBuf, what: Refusal },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a module cannot be rewritten.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    // The options and the module (`limits`, the context).
    #[error("{FAULT_ENV}={0}: expected PROCEDURE:WITNESS")]
    FaultSyntax(String),
    #[error("{FAULT_ENV}: procedure {proc} has no witness {witness}")]
    FaultNoWitness { proc: String, witness: u32 },
    /// `what`: path profiles or `--stop-at`; `starter`: the thread starter.
    #[error(
        "{what} of a static executable that can start threads (it has {starter}): not \
         supported, its first thread is not known at the entry point"
    )]
    StaticThreads {
        what: &'static str,
        starter: &'static str,
    },
    #[error("a shared object can only be instrumented as a library (--libs)")]
    SharedObject,
    #[error("an executable cannot be instrumented as a library")]
    ExecutableAsLibrary,
    #[error("{procs} procedures: ENTER records number at most {max} per module")]
    TooManyProcedures { procs: usize, max: u32 },
    #[error("program headers: {0}")]
    ProgramHeaders(String),
    #[error(
        "--stop-at with --event calls cannot stop exactly yet in a program that throws C++ \
         exceptions (use --event insns or blocks)"
    )]
    StopAtCallsThrows,
    #[error(
        "path profiles and --stop-at cannot follow a longjmp: procedure {proc} ({}) {} \
         longjmp at {at:#x}",
        if *.left_alone { "left alone" } else { "counted" },
        if *.tail { "tail-jumps to" } else { "calls" }
    )]
    UnfollowedLongjmp {
        proc: String,
        left_alone: bool,
        tail: bool,
        at: u64,
    },
    #[error("path profiles of programs that {0} are not supported yet")]
    PathProfiles(PathLimit),
    #[error("--stop-at cannot count exactly: procedure {0} calls setjmp or longjmp")]
    StopAtSetjmp(String),

    // The plans (`plan`).
    #[error("too many path counters")]
    TooManyPathCounters,
    /// Counter placement or path numbering failed for procedure `proc`.
    #[error("{proc}: {why}")]
    Counters { proc: String, why: String },
    #[error("{0}: internal: a landing or setjmp counter in a path profile")]
    PathCounterKinds(String),
    #[error("{proc}: case {case:#x} is not a block")]
    CaseNotBlock { proc: String, case: u64 },
    #[error("no procedure can be traced")]
    NothingTraced,
    /// `left_alone`: the procedure at the entry point and why it is left
    /// alone, if one starts there.
    #[error(
        "static executable: the entry point {entry:#x} cannot be traced ({}), so the runtime \
         has nowhere to start",
        match .left_alone {
            Some((name, why)) => format!("{name} is left alone: {why}"),
            None => "no procedure starts there".to_owned(),
        }
    )]
    StaticEntry {
        entry: u64,
        left_alone: Option<(String, String)>,
    },
    #[error("a procedure has more than 65535 witness edges")]
    TooManyWitnesses,
    #[error("{block} at {start:#x}: bytes not in the file")]
    BlockBytes { block: BlockId, start: u64 },
    #[error("{block}: instruction at {at:#x} does not decode as the CFG says")]
    BlockDecode { block: BlockId, at: u64 },

    // Code emission and linking (`emit`, `link`).
    #[error("{0}")]
    Runtime(aetrace_runtime::Error),
    /// Code generation (`codegen`, `counters`, `pathprof`).
    #[error("{0}")]
    Codegen(String),
    #[error("unwind tables: {0}")]
    Unwind(String),
    #[error("counter code changed size between passes")]
    CounterSizeChanged,
    #[error("internal: no springboard at the entry point")]
    NoEntrySpringboard,
    #[error("runtime lacks {0}")]
    RuntimeLacks(&'static str),
    #[error("internal: GOT slots with a LAZY piece {got:x?}, expected {want:x?}")]
    LazySlots { got: Vec<u64>, want: Vec<u64> },
    #[error("springboard out of range")]
    SpringboardRange,

    // The new ELF (`elfout`).
    #[error("the address space is exhausted above the image")]
    AddressSpace,
    #[error("no PT_DYNAMIC")]
    NoDynamic,
    #[error(
        "a preinit function needs a dynamically linked executable (PT_INTERP): static \
         programs do not run DT_PREINIT_ARRAY; use a new entry point"
    )]
    PreinitStatic,
    #[error("an init function is for shared objects (ET_DYN without DF_1_PIE)")]
    InitNotShared,
    #[error(
        "a preinit function needs an executable, and this ET_DYN has no DF_1_PIE: ld.so runs \
         DT_PREINIT_ARRAY for the main program only"
    )]
    PreinitNotPie,
    #[error("both a preinit and an init function")]
    PreinitAndInit,
    /// `array`: `DT_PREINIT_ARRAY` or `DT_INIT_ARRAY`.
    #[error(
        "{array} entry at {at:#x} has no RELATIVE relocation (cannot copy it to the new array)"
    )]
    NoRelative { array: &'static str, at: u64 },
    #[error("DT_JMPREL lies inside DT_RELA but not at its end")]
    JmprelInsideRela,
    #[error("patch [{at:#x}, +{len}) is not inside the file-backed part of a PT_LOAD")]
    PatchOutside { at: u64, len: u64 },
    #[error("patch out of the file")]
    PatchOutOfFile,
    #[error("patches overlap at {0:#x}")]
    PatchesOverlap(u64),
    #[error("{0} program headers do not fit the kernel's one-page limit")]
    TooManyHeaders(usize),
    #[error("new segment at {vaddr:#x}: {why}")]
    NewSegment { vaddr: u64, why: SegmentFault },
    /// `what`: the new `.eh_frame_hdr` or `.eh_frame`.
    #[error("{what} [{addr:#x}, +{len:#x}) is not in the file bytes of a new segment")]
    NotInNewSegment {
        what: &'static str,
        addr: u64,
        len: u64,
    },
    /// `what`: entry, preinit or init.
    #[error("{what} {addr:#x} is not in the file-backed part of an executable segment")]
    NotExecutable { what: &'static str, addr: u64 },
}

/// What path profiles cannot follow (`limits`).
#[derive(Debug, thiserror::Error)]
pub enum PathLimit {
    #[error("abandon frames: procedure {proc} calls setjmp/longjmp at {at:#x}")]
    Setjmp { proc: String, at: u64 },
    #[error("share memory with a child: procedure {proc} calls vfork at {at:#x}")]
    Vfork { proc: String, at: u64 },
    #[error("abandon frames: procedure {proc} has a C++ landing pad at {pad:#x}")]
    LandingPad { proc: String, pad: u64 },
    #[error(
        "fork: procedure {proc} calls a fork at {at:#x} (each process would take back the \
         active paths of the frames it inherits)"
    )]
    Fork { proc: String, at: u64 },
}

/// What is wrong with a new segment (`elfout::Additions::segments`).
#[derive(Debug, thiserror::Error)]
pub enum SegmentFault {
    #[error("vaddr is not page-aligned")]
    NotPageAligned,
    #[error("below {0:#x} (first_free_vaddr or the previous segment's end)")]
    Below(u64),
    #[error("mem_size is zero or smaller than its bytes")]
    MemSize,
    #[error("flags other than PF_R, PF_W, PF_X")]
    Flags,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages built from several parts read as they did when they
    /// were format strings (users and tests grep them).
    #[test]
    fn messages_keep_their_text() {
        let cases: [(Refusal, &str); 5] = [
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
        ];
        for (r, text) in cases {
            assert_eq!(r.to_string(), text);
        }
    }
}
