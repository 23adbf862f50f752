//! How errors name the place regeneration stopped: procedure, block,
//! record and stream offset (the crate's invariant: output is exact or
//! regeneration stops with an error naming them).

use super::{Interrupt, Loc, Machine, TAG_SHIFT};
use crate::compile::ProcIx;
use crate::error::Error;
use crate::stream::Item;
use aetrace_graph::EntityRef;

/// What a truncation's place says when the stream ends where a witness or
/// record is needed.
pub(super) const MUST_WRITE_MORE: &str = ", where the program must have written more";

impl<'a> Machine<'a> {
    /// "in procedure f after block 0x401000" / "while untraced code runs".
    pub(super) fn at(&self, l: Option<Loc>) -> String {
        match l {
            Some(l) => format!(
                "in procedure {} after block {}",
                self.proc_name(l),
                self.module(l).block_name(l.block)
            ),
            None => "while untraced code runs".into(),
        }
    }

    pub(super) fn unexpected(&self, item: Item, offset: u64, at: Option<Loc>) -> Error {
        let at = self.at(at);
        match item {
            Item::End => Error::Truncated {
                thread: self.thread,
                offset,
                at: format!("{at}{MUST_WRITE_MORE}"),
                note: self.note.clone(),
            },
            Item::Signal { signo, rip, .. } => Error::Signal {
                thread: self.thread,
                signo,
                rip,
                offset,
                at,
                why: "a signal cannot be placed here".into(),
            },
            Item::Indirect(_) => Error::Unexpected {
                thread: self.thread,
                record: item.describe(),
                offset,
                at: format!("{at}, where no unresolved indirect jump is being followed"),
            },
            Item::SetjmpResume { .. } => Error::Unsupported {
                thread: self.thread,
                record: item.describe(),
                offset,
                at,
                why: "a longjmp came back to a setjmp while the regenerator follows traced code: it was made inside a call taken for one that returns without running traced code",
            },
            Item::Setjmp(_) | Item::Longjmp(_) => Error::Unsupported {
                thread: self.thread,
                record: item.describe(),
                offset,
                at,
                why: "traces before format 1.10 name jmp_bufs in SETJMP and LONGJMP, which this regenerator no longer follows: record the program again",
            },
            Item::Landing(_) => Error::Unsupported {
                thread: self.thread,
                record: item.describe(),
                offset,
                at,
                why: "a landing pad is entered by the unwinder (untraced code), never from traced code",
            },
            Item::Fork(_) => Error::Unsupported {
                thread: self.thread,
                record: item.describe(),
                offset,
                at,
                why: "a fork child continues from its parent's state at the fork, and the parent's stream has no FORKED record for this child (the parent was not traced at the fork)",
            },
            // Written only on a stub's lazy path, read only where that
            // stub's jump is decided: anywhere else the trace and the
            // database disagree.
            Item::Lazy(raw) => Error::Unexpected {
                thread: self.thread,
                record: format!(
                    "{} (lazy binding in PLT stub {})",
                    item.describe(),
                    self.proc_named(raw)
                ),
                offset,
                at: format!("{at}, where no jump of that stub is being decided"),
            },
            Item::Enter(raw) | Item::EnterAt(raw, _) => Error::Unexpected {
                thread: self.thread,
                record: format!("{} (entry of {})", item.describe(), self.proc_named(raw)),
                offset,
                at,
            },
            Item::Desync(_) => Error::Unsupported {
                thread: self.thread,
                record: item.describe(),
                offset,
                at,
                why: "the program left instrumented code here; nothing after it can be regenerated",
            },
            _ => Error::Unexpected {
                thread: self.thread,
                record: item.describe(),
                offset,
                at,
            },
        }
    }

    /// How messages name the procedure an ENTER-style payload names.
    pub(super) fn proc_named(&self, raw: u32) -> String {
        let (tag, q) = (raw >> TAG_SHIFT, raw & ((1 << TAG_SHIFT) - 1));
        match self.by_tag.get(tag as usize).copied().flatten() {
            Some(i) => {
                let m = self.image(i);
                match m.procs.get(ProcIx::from_u32(q)) {
                    Some(p) => format!("{} of {}", p.name, m.name),
                    None => format!("{q} (module {} has {} procedures)", m.name, m.procs.len()),
                }
            }
            None => format!("{q} of module tag {tag}, which the process does not have"),
        }
    }

    /// A signal that cannot be placed: the error.
    pub(super) fn sig_error(&self, sig: &Interrupt, why: String) -> Error {
        Error::Signal {
            thread: self.thread,
            signo: sig.signo,
            rip: sig.rip,
            offset: sig.offset,
            at: self.at(sig.retry.block().or(self.cur)),
            why,
        }
    }

    /// How signal messages name block `l`: `0x401000`, with its module's
    /// name when it is not the executable.
    pub(super) fn block_named(&self, l: Loc) -> String {
        let m = self.module(l);
        match l.module.index() {
            0 => m.block_name(l.block),
            _ => format!("{} of {}", m.block_name(l.block), m.name),
        }
    }
}
