//! The whole run's call tree as Chrome/Perfetto trace JSON (the Trace
//! Event Format's "X" complete events), for magic-trace-style views in
//! Perfetto or chrome://tracing (`aetrace timeline`, issue 22 point 6).
//!
//! One track per thread stream of the trace (fork children and the
//! streams after an `execve` included): `pid` is the kernel's process id,
//! `tid` the trace's thread id (unique in the trace, so two streams never
//! share a track), named "thread N (tid X)". Time is the thread's
//! instruction number: an event's `ts` is the position of its procedure's
//! first instruction, `ts + dur` the position of the first instruction
//! after it returned. Frames come from [`crate::stack`]'s rules, plus one:
//! a jump from one procedure to another's entry (a tail call, or a
//! callback from untraced code the previous frame returned into) ends the
//! frame and starts a sibling, as magic-trace draws tail calls. The
//! thread's first frame is named by the procedure of its first
//! instruction; top-level frames follow each other, and frames still
//! open at the thread's end close after its last instruction, so the top-level durations of a
//! thread sum to its instruction count. Events nest: each lies within its
//! caller's interval. A name is the procedure's, or the address of the
//! frame's first instruction when it is in no traced procedure.

use crate::blocks::Blocks;
use crate::stack::{Change, Stacks};
use crate::timeline::{Timeline, INTERVAL};
use crate::Error;
use aetrace_format::{ThreadInfo, Trace};
use std::io::Write;

/// What was written for one thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadSummary {
    /// The trace's thread id.
    pub thread: u32,
    /// Its instructions.
    pub instructions: u64,
    /// Its events (frames).
    pub events: u64,
}

/// Writes the call tree of every thread of `trace` to `out` as one JSON
/// object (`{"traceEvents": [...]}`); what it wrote, per thread.
pub fn write_json<B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    out: &mut dyn Write,
) -> Result<Vec<ThreadSummary>, Error> {
    let mut w = Events { out, first: true };
    w.raw("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[")?;
    let mut summaries = Vec::new();
    for info in trace.threads() {
        summaries.push(thread(trace, info, &mut w)?);
    }
    w.raw("\n]}\n")?;
    Ok(summaries)
}

/// Writes one thread's track: its name, then its frames as they close.
fn thread<B: AsRef<[u8]> + Sync>(
    trace: &Trace<B>,
    info: &ThreadInfo,
    w: &mut Events<'_>,
) -> Result<ThreadSummary, Error> {
    let (id, pid) = (info.start.thread.0, info.start.pid);
    let name = format!("thread {id} (tid {})", info.start.os_tid);
    w.event(format_args!(
        "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{pid},\"tid\":{id},\"args\":{{\"name\":{}}}}}",
        json(&name)
    ))?;
    let format = aetrace_regen::Format::Bin;
    aetrace_regen::with_thread_machine(trace, id, format, |machine| {
        let modules = machine.modules();
        let mut tree = Tree {
            blocks: Blocks::new(modules),
            stacks: Stacks::new(modules),
            rets: Vec::new(),
            open: Vec::new(),
            prev: None,
            track: (pid, id),
            events: 0,
        };
        let mut t = Timeline::new(machine, INTERVAL);
        let mut pos = 0;
        while let Some(k) = t.interval_of(pos) {
            let (start, addrs) = t.interval(k);
            for (i, &b) in addrs.iter().enumerate() {
                tree.step(start + i as u64, b, w)?;
            }
            pos = start + addrs.len() as u64;
        }
        if let Some(e) = t.error() {
            return Err(Error::Cut {
                thread: id,
                error: e.to_string(),
            });
        }
        tree.close_above(0, pos, w)?;
        Ok(ThreadSummary {
            thread: id,
            instructions: pos,
            events: tree.events,
        })
    })?
}

/// A thread's open frames, as the instruction stream is walked.
struct Tree<'m> {
    blocks: Blocks<'m>,
    stacks: Stacks,
    /// Return addresses of the open frames but the first, outermost first.
    rets: Vec<u64>,
    /// Open frames, outermost first: (start position, first address).
    open: Vec<(u64, u64)>,
    prev: Option<u64>,
    /// (pid, tid) of the thread's events.
    track: (u32, u32),
    events: u64,
}

impl Tree<'_> {
    /// Instruction `b` at position `pos`.
    fn step(&mut self, pos: u64, b: u64, w: &mut Events<'_>) -> Result<(), Error> {
        let Some(a) = self.prev.replace(b) else {
            self.open.push((pos, b));
            return Ok(());
        };
        match self.stacks.change(a, b, &self.rets) {
            Change::None if self.enters_another(a, b) => {
                self.close_above(self.open.len() - 1, pos, w)?;
                self.open.push((pos, b));
            }
            Change::None => {}
            Change::Push(ret) => {
                self.rets.push(ret);
                self.open.push((pos, b));
            }
            Change::PopTo(i) => {
                self.rets.truncate(i);
                self.close_above(i + 1, pos, w)?;
            }
        }
        Ok(())
    }

    /// Whether `b` is a traced procedure's entry reached by a jump from
    /// another procedure: a tail call, or a callback from untraced code the
    /// previous frame returned into (`main` after `_init`, both called by
    /// libc): the frame ends and the next one starts at its depth.
    fn enters_another(&self, a: u64, b: u64) -> bool {
        let entry = |x: u64| self.blocks.at(x).map(|blk| blk.entry);
        entry(b) == Some(b) && entry(a) != Some(b)
    }

    /// Ends the open frames from depth `depth` up, innermost first, before
    /// position `end`.
    fn close_above(&mut self, depth: usize, end: u64, w: &mut Events<'_>) -> Result<(), Error> {
        while self.open.len() > depth {
            let (ts, addr) = self.open.pop().expect("len > depth");
            let name = match self.blocks.at(addr) {
                Some(b) if !b.proc.is_empty() => json(b.proc),
                _ => json(&format!("{addr:#x}")),
            };
            let (pid, tid) = self.track;
            let dur = end - ts;
            w.event(format_args!(
                "{{\"ph\":\"X\",\"name\":{name},\"ts\":{ts},\"dur\":{dur},\"pid\":{pid},\"tid\":{tid}}}"
            ))?;
            self.events += 1;
        }
        Ok(())
    }
}

/// The JSON array's writer: one event a line, commas between.
struct Events<'w> {
    out: &'w mut dyn Write,
    first: bool,
}

impl Events<'_> {
    fn raw(&mut self, s: &str) -> Result<(), Error> {
        self.out.write_all(s.as_bytes()).map_err(Error::Write)
    }

    fn event(&mut self, e: std::fmt::Arguments<'_>) -> Result<(), Error> {
        let sep = if std::mem::take(&mut self.first) {
            "\n"
        } else {
            ",\n"
        };
        write!(self.out, "{sep}{e}").map_err(Error::Write)
    }
}

/// `s` as a JSON string.
fn json(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}
