//! The procedure stack at any position, rebuilt from the instruction
//! stream alone (a shadow stack, as call-trace tools build one from branch
//! traces), for backtraces, `finish` and `next` in gdb.
//!
//! Rules, applied at each step from instruction `a` to instruction `b`:
//! `b` right after `a` changes nothing (a fall-through, or a call into
//! untraced code that came back); `a` a call (not a tail call) and `b`
//! elsewhere pushes `a`'s return address (a traced callee, or a callback
//! from untraced code the call ran); `b` a return address on the stack
//! pops down to it (a return, a longjmp or an exception to a caller);
//! anything else is a jump within the frame. Untraced code therefore has
//! no frames of its own: a callback's caller is the traced call that
//! started the untraced code.
//!
//! Invariants: the stack at an interval's start is the same whatever order
//! positions are visited in (it is computed front to back, interval by
//! interval, and kept per interval).

use crate::timeline::Timeline;
use aetrace_regen::compile::Module as Compiled;
use std::collections::HashMap;

/// The stack and the previous instruction's address, at an interval start.
#[derive(Clone, Debug, Default)]
struct State {
    stack: Vec<u64>,
    prev: Option<u64>,
}

/// Shadow stacks of one timeline.
pub struct Stacks {
    /// Call instruction address -> return address (the next instruction).
    calls: HashMap<u64, u64>,
    /// States at the starts of intervals `0..states.len()`.
    states: Vec<State>,
}

impl Stacks {
    /// The call sites of `modules` (non-tail calls ending a block).
    pub fn new(modules: &[&Compiled]) -> Stacks {
        let mut calls = HashMap::new();
        for m in modules {
            for (bi, b) in m.blocks.iter() {
                if b.call.is_some_and(|c| !c.tail) {
                    let lens = m.insn_lens(bi);
                    let last: u64 = lens[..lens.len() - 1].iter().map(|&l| u64::from(l)).sum();
                    let start = m.load_base.wrapping_add(b.start);
                    calls.insert(start + last, start + u64::from(b.size));
                }
            }
        }
        Stacks {
            calls,
            states: vec![State::default()],
        }
    }

    /// Return addresses at position `n` (before its instruction runs),
    /// innermost first.
    pub fn at(&mut self, t: &mut Timeline<'_>, n: u64) -> Vec<u64> {
        let Some(k) = t.interval_of(n) else {
            return Vec::new();
        };
        while self.states.len() <= k {
            let j = self.states.len() - 1;
            let mut s = self.states[j].clone();
            let (_, addrs) = t.interval(j);
            for &b in addrs {
                self.step(&mut s, b);
            }
            self.states.push(s);
        }
        let mut s = self.states[k].clone();
        let (start, addrs) = t.interval(k);
        for &b in &addrs[..=(n - start) as usize] {
            self.step(&mut s, b);
        }
        s.stack.reverse();
        s.stack
    }

    fn step(&self, s: &mut State, b: u64) {
        if let Some(a) = s.prev.replace(b) {
            match self.change(a, b, &s.stack) {
                Change::Push(ret) => s.stack.push(ret),
                Change::PopTo(i) => s.stack.truncate(i),
                Change::None => {}
            }
        }
    }

    /// What the step from instruction `a` to instruction `b` does to
    /// `stack` (return addresses, outermost first): the module comment's
    /// rules.
    pub fn change(&self, a: u64, b: u64, stack: &[u64]) -> Change {
        match self.calls.get(&a) {
            // The callee was untraced and returned.
            Some(&ret) if ret == b => Change::None,
            Some(&ret) => Change::Push(ret),
            None => match stack.iter().rposition(|&r| r == b) {
                Some(i) => Change::PopTo(i),
                None => Change::None,
            },
        }
    }
}

/// What one step does to the procedure stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing: a fall-through, a jump within the frame.
    None,
    /// A call: the callee's frame, with this return address.
    Push(u64),
    /// A return (or longjmp, exception) to the frame whose return address
    /// is at this depth: it and the frames above it end.
    PopTo(usize),
}
