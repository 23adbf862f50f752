//! The frames' real addresses (their CFAs, as gdb's frame ids and frame
//! bases have them) from a trace's data references (issue 22: no number
//! a user sees is invented; `docs/debug.md`, "Frames' addresses").
//!
//! A frame made by a traced call has its CFA 8 above the slot the call
//! pushed its return address to (the call's store). Walking back from
//! the position, a return pops a slot a call further back pushed: a call
//! whose slot a later return popped is matched (its callee returned);
//! an unmatched call returning where the frame's caller is (the next
//! frame's pc), its slot above the last one found, made the frame. A
//! frame entered from untraced code (`main`, a callback) has its CFA from
//! its first reference after its entry through `rsp` or `rbp` (the
//! register's value is the address less the displacement), by the CFI
//! row there (`crate::cfi::cfa_rule`): walking back, the last one seen
//! before the entry.
//!
//! Invariants: a CFA is given only where found as above, never guessed;
//! the CFAs found grow outwards (each creator's slot above the one before).

use crate::data::{Code, Data, Flow, Ref};
use crate::image::Image;
use crate::timeline::Timeline;
use crate::untraced::is_untraced;
use aetrace_analysis::addr::{Access, Gpr};

/// The CFAs of `frames[..needed]` (pc and procedure entry, innermost
/// first) at position `p`, whose instruction has not run: `None` if one
/// of them is not found.
pub fn cfas(
    data: &mut Data,
    t: &mut Timeline<'_>,
    code: &Code<'_, '_>,
    p: u64,
    frames: &[(u64, u64)],
    needed: usize,
) -> Result<Option<Vec<u64>>, String> {
    let mut walk = Walk {
        frames,
        found: vec![None; needed],
        level: 0,
        pending: Vec::new(),
        last_slot: None,
    };
    if needed > 0 {
        data.scan_back(t, code, p, |q, pc, flow, refs| {
            walk.step(code.image, q < p, pc, flow, refs);
            walk.level >= needed
        })?;
    }
    debug_assert!(walk
        .found
        .iter()
        .flatten()
        .collect::<Vec<_>>()
        .windows(2)
        .all(|w| w[0] < w[1]));
    Ok(walk.found.into_iter().collect())
}

/// The walk back ([`cfas`]): the frame whose body it is in and the slots
/// of returns whose calls are further back.
struct Walk<'f> {
    frames: &'f [(u64, u64)],
    found: Vec<Option<u64>>,
    level: usize,
    pending: Vec<u64>,
    /// The slot the frame below the current one was found at.
    last_slot: Option<u64>,
}

impl Walk<'_> {
    /// One position back; `ran`: its instruction ran (it is before the
    /// position the frames are of).
    fn step(&mut self, image: &Image, ran: bool, pc: u64, flow: Flow, refs: &[Ref]) {
        match (ran, flow) {
            (true, Flow::Ret) => {
                // Its references are the callee's.
                self.pending.extend(slot(refs, Access::Load, 0));
                return;
            }
            (true, Flow::Call(ret)) => {
                if let Some(s) = slot(refs, Access::Store, 8u64.wrapping_neg()) {
                    self.call(s, ret);
                }
            }
            _ => {}
        }
        if self.level >= self.found.len() || !self.pending.is_empty() || self.by_call(self.level) {
            return;
        }
        if let Some(c) = body_cfa(image, pc, refs) {
            self.found[self.level] = Some(c);
        }
        if pc == self.frames[self.level].1 {
            // The frame's entry: the walk is in its caller's body now.
            self.last_slot = self.found[self.level].map(|c| c - 8);
            self.level += 1;
        }
    }

    /// A call that pushed its return address `ret` to slot `s`.
    fn call(&mut self, s: u64, ret: u64) {
        if let Some(i) = self.pending.iter().position(|&x| x == s) {
            self.pending.swap_remove(i);
            return;
        }
        // Returns below its slot were in what it called (untraced code
        // calling back, signal handlers).
        self.pending.retain(|&x| x > s);
        let l = self.level;
        let creator = l < self.found.len()
            && self.by_call(l)
            && self.frames[l + 1].0 == ret
            && self.last_slot.map_or(true, |below| s > below);
        if creator {
            self.found[l] = Some(s + 8);
            self.last_slot = Some(s);
            self.level += 1;
        }
    }

    /// Whether frame `l` was made by a traced call: its caller's pc is a
    /// traced return address.
    fn by_call(&self, l: usize) -> bool {
        self.frames.get(l + 1).is_some_and(|f| !is_untraced(f.0))
    }
}

/// The slot a call pushed to (`disp` -8, a store) or a return popped
/// (`disp` 0, a load): 8 bytes at `rsp` + `disp`.
fn slot(refs: &[Ref], access: Access, disp: u64) -> Option<u64> {
    refs.iter()
        .find(|r| r.access == access && r.end - r.start == 8 && r.from == Some((Gpr::RSP, disp)))
        .map(|r| r.start)
}

/// The CFA at `pc` from a reference through the register its CFI row
/// computes the CFA from.
fn body_cfa(image: &Image, pc: u64, refs: &[Ref]) -> Option<u64> {
    let (reg, off) = crate::cfi::cfa_rule(image, pc)?;
    refs.iter().find_map(|r| match r.from {
        Some((g, disp)) if g == reg => Some(r.start.wrapping_sub(disp).wrapping_add(off as u64)),
        _ => None,
    })
}
