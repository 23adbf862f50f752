//! `aetrace-regen`: the dynamic side. Rebuilds the exact block and
//! instruction trace of every thread of a recorded run from its witness
//! streams and the program database (paper 003: Figure 7's regeneration
//! with a procedure stack, Section 4.2; DESIGN.md decision 8, and decision
//! 7's parallelism across threads — not yet within one stream).
//!
//! - [`stream`]: the byte encoding a thread writes, read as items;
//! - [`compile`]: a program database turned into dense per-block successor
//!   tables, per-predicate witness choices and preformatted output;
//! - [`ending`]: how a killed thread's trace ends;
//! - [`departure`]: where a thread's trace stops being the native
//!   program's (a static image's unwinder looking up copies' addresses);
//! - [`machine`]: the regeneration rules (the contract with the rewriter,
//!   `docs/regen.md`);
//! - [`output`]: threads, modules, formats, `-j` parallelism, `--count`;
//! - [`index`]: the state index beside a trace (`TRACE.idx`), from which
//!   `-j` expands pieces of one stream without a pass before them;
//! - [`data_values`]: the data values a `record --data` trace holds;
//! - [`visit`]: the executed blocks for a consumer in the same process
//!   (`aetrace cachesim TRACE`);
//! - [`handlers`]: the signal handlers a thread is in, for the readers
//!   of their data values;
//! - [`info`]: `aetrace info` (container statistics, databases, bits per
//!   instruction);
//! - `testkit` (feature `testkit`): synthetic traces from random programs.
//!
//! Invariants: output is exact or regeneration stops with an [`Error`]
//! naming thread, procedure, block and stream offset; output is
//! byte-identical for any number of jobs. The tests compare it with random
//! executions of `aetrace_graph::testgen` programs, the oracle that shares
//! nothing with it (`src/tests.rs`); the benchmark with the reference
//! regenerator `aetrace_graph::regen_ref`.

pub mod compile;
pub mod departure;
pub mod ending;
pub mod error;
pub mod handlers;
pub mod index;
pub mod info;
pub mod machine;
mod ordered;
pub mod output;
mod regions;
pub mod stream;
pub mod summary;
pub mod visit;

#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

#[cfg(test)]
mod tests;

pub use departure::{departures, Departure};
pub use ending::{End, Ending};
pub use error::{Error, Result};
pub use output::{
    regen_command, regen_to, regen_trace, regen_trace_indexing, regen_trace_to, totals,
    with_thread_machine, with_thread_machines, Format, Options, ThreadTotals, Totals,
};

/// The data values thread `thread` of `trace` recorded (`record --data`,
/// VALUE records), in the order it wrote them (a handler's among the
/// interrupted code's: [`DataCursor`] tells where).
pub fn data_values<B: AsRef<[u8]>>(
    trace: &aetrace_format::Trace<B>,
    thread: aetrace_format::ThreadId,
) -> Result<Vec<u64>> {
    data_values_entered(trace, thread).map(|v| v.0.values)
}

/// A thread's data values, and which of them an outside-entry stub wrote
/// (`rsp` right after its ENTER, `docs/data.md`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DataValues {
    /// Every VALUE record's value, in order.
    pub values: Vec<u64>,
    /// `(n, raw)`: value `n` came right after ENTER(`raw`), nothing
    /// between; increasing `n`.
    pub entered: Vec<(usize, u32)>,
}

/// Where a SIGNAL (or FAULT) record stands among a thread's values: a
/// handler's values follow it; the values before it that the walk has
/// not read belong to the instruction the signal interrupted (its VALUE
/// records stand before it, and the signal came after them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignalAt {
    /// Values before the record.
    pub at: usize,
    /// The signal number.
    pub signo: u32,
    /// A FAULT: the thread ends there.
    pub fault: bool,
    /// The record's stream offset.
    pub offset: u64,
    /// The record came right after ENTER(`raw`), before the stub's
    /// `rsp` value: that value is the first after the handler.
    pub enter: Option<u32>,
    /// The interrupted rip (run-time, in the copy, after the fix-up).
    pub rip: u64,
    /// The interrupted `rep` string instruction's `rcx`, `rsi` and `rdi`
    /// are the three values right after the record (format 1.16).
    pub rep: bool,
}

/// Where a [`DataCursor`] stands ([`DataCursor::mark`]): its stream
/// offset, the values it gave, the `rsp` an ENTER_SAME would repeat and
/// those kept for handlers, and a value read and put back. A cursor
/// started there gives the same items as the one marked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ValueMark {
    offset: u64,
    given: u64,
    last: Option<u64>,
    kept: Vec<Option<u64>>,
    peeked: Option<(u64, Option<u32>)>,
}

impl ValueMark {
    /// Appends its bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let opt = |out: &mut Vec<u8>, v: Option<u64>| {
            out.push(v.is_some().into());
            out.extend_from_slice(&v.unwrap_or(0).to_le_bytes());
        };
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.given.to_le_bytes());
        opt(out, self.last);
        out.extend_from_slice(&(self.kept.len() as u32).to_le_bytes());
        for &k in &self.kept {
            opt(out, k);
        }
        opt(out, self.peeked.map(|p| p.0));
        opt(out, self.peeked.and_then(|p| p.1).map(u64::from));
    }

    /// Reads one from the front of `bytes` (`None`: malformed).
    pub fn decode(bytes: &mut &[u8]) -> Option<ValueMark> {
        let mut r = index::Fields(bytes);
        let opt = |r: &mut index::Fields<'_>| -> Option<Option<u64>> {
            let some = r.u8()?;
            let v = r.u64()?;
            match some {
                0 => Some(None),
                1 => Some(Some(v)),
                _ => None,
            }
        };
        let (offset, given, last) = (r.u64()?, r.u64()?, opt(&mut r)?);
        let n = r.u32()? as usize;
        let kept = (0..n).map(|_| opt(&mut r)).collect::<Option<Vec<_>>>()?;
        let (v, enter) = (opt(&mut r)?, opt(&mut r)?);
        let enter = enter.map(u32::try_from).transpose().ok()?;
        let peeked = match (v, enter) {
            (Some(v), e) => Some((v, e)),
            (None, None) => None,
            (None, Some(_)) => return None,
        };
        *bytes = r.0;
        Some(ValueMark {
            offset,
            given,
            last,
            kept,
            peeked,
        })
    }
}

/// One item of a thread's data, in stream order ([`DataCursor`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataItem {
    /// A value, and the ENTER right before it (nothing between).
    Value(u64, Option<u32>),
    /// A SIGNAL or FAULT record.
    Signal(SignalAt),
}

/// [`data_values`] with the values that follow an ENTER marked, and the
/// thread's SIGNAL and FAULT records in order (where each stands among
/// the values: the debugger's watchpoints place handlers' values by them).
pub fn data_values_entered<B: AsRef<[u8]>>(
    trace: &aetrace_format::Trace<B>,
    thread: aetrace_format::ThreadId,
) -> Result<(DataValues, Vec<SignalAt>)> {
    let (mut out, mut signals) = (DataValues::default(), Vec::new());
    let mut c = DataCursor::new(trace, thread)?;
    loop {
        c.append(usize::MAX, &mut out)?;
        match c.signal()? {
            Some(s) => signals.push(s),
            None => return Ok((out, signals)),
        }
    }
}

/// A thread's data values read in order, a window at a time, beside a walk
/// that uses them: memory is one chunk and one window, not every value of
/// the thread (an xz data trace has billions). A window stops before a
/// SIGNAL or FAULT record, which [`DataCursor::signal`] takes.
pub struct DataCursor<'t> {
    stream: stream::Stream<'t>,
    /// Values given so far.
    given: usize,
    /// An item read and put back.
    peeked: Option<DataItem>,
}

impl<'t> DataCursor<'t> {
    /// The values of `thread`. Refuses a trace older than
    /// [`MINOR_DATA_VALUES`]: it recorded other values than this reading
    /// expects.
    ///
    /// [`MINOR_DATA_VALUES`]: aetrace_format::header::MINOR_DATA_VALUES
    pub fn new<B: AsRef<[u8]>>(
        trace: &'t aetrace_format::Trace<B>,
        thread: aetrace_format::ThreadId,
    ) -> Result<Self> {
        DataCursor::sharing(trace, thread, None)
    }

    /// [`DataCursor::new`] reading its chunks through `shared` if given.
    pub(crate) fn sharing<B: AsRef<[u8]>>(
        trace: &'t aetrace_format::Trace<B>,
        thread: aetrace_format::ThreadId,
        shared: Option<&'t stream::Chunks>,
    ) -> Result<Self> {
        let minor = trace.header().minor;
        if minor < aetrace_format::header::MINOR_DATA_VALUES {
            return Err(Error::Usage(format!(
                "data values of format 1.{minor} are read differently since 1.{}: record the trace again with this aetrace",
                aetrace_format::header::MINOR_DATA_VALUES
            )));
        }
        let mut stream = stream::Stream::new(thread, trace.chunks(thread).collect());
        if let Some(shared) = shared {
            stream = stream.sharing(shared);
        }
        Ok(DataCursor {
            stream,
            given: 0,
            peeked: None,
        })
    }

    /// Replaces `out` with the next at most `max` values (their `entered`
    /// numbered from 0 in `out`), up to the next SIGNAL or FAULT record;
    /// how many, 0 at the end or at such a record.
    pub fn read(&mut self, max: usize, out: &mut DataValues) -> Result<usize> {
        out.values.clear();
        out.entered.clear();
        self.append(max, out)
    }

    /// [`DataCursor::read`] appending to `out`; how many it appended.
    pub fn append(&mut self, max: usize, out: &mut DataValues) -> Result<usize> {
        let at = out.values.len();
        while out.values.len() - at < max {
            if self.peeked.is_none() {
                let left = max - (out.values.len() - at);
                self.given += self.stream.buffered_values(left, &mut out.values);
                if out.values.len() - at == max {
                    break;
                }
            }
            match self.next()? {
                Some(DataItem::Value(v, enter)) => {
                    if let Some(raw) = enter {
                        out.entered.push((out.values.len(), raw));
                    }
                    out.values.push(v);
                }
                Some(s @ DataItem::Signal(_)) => {
                    self.peeked = Some(s);
                    break;
                }
                None => break,
            }
        }
        Ok(out.values.len() - at)
    }

    /// The SIGNAL or FAULT record that comes next, taken, if no value
    /// comes before it (`None` at a value or at the end).
    pub fn signal(&mut self) -> Result<Option<SignalAt>> {
        match self.next()? {
            Some(DataItem::Signal(s)) => Ok(Some(s)),
            other => {
                self.peeked = other;
                Ok(None)
            }
        }
    }

    /// The SIGNAL or FAULT record a [`DataCursor::read`] stopped at, if
    /// it stopped at one (not taken).
    pub fn next_signal(&self) -> Option<SignalAt> {
        match self.peeked {
            Some(DataItem::Signal(s)) => Some(s),
            _ => None,
        }
    }

    /// The next item (the one put back first).
    fn next(&mut self) -> Result<Option<DataItem>> {
        if let Some(i) = self.peeked.take() {
            return Ok(Some(i));
        }
        let item = self.stream.next_data(self.given)?;
        self.given += matches!(item, Some(DataItem::Value(..))) as usize;
        Ok(item)
    }

    /// Where it stands, for [`Visit::values_at`] to start another cursor
    /// there; `None` right before a SIGNAL or FAULT record it stopped at.
    ///
    /// [`Visit::values_at`]: crate::visit::Visit::values_at
    pub fn mark(&self) -> Option<ValueMark> {
        let peeked = match self.peeked {
            None => None,
            Some(DataItem::Value(v, enter)) => Some((v, enter)),
            Some(DataItem::Signal(_)) => return None,
        };
        let e = self.stream.entry_rsp();
        Some(ValueMark {
            offset: self.stream.offset(),
            given: self.given as u64,
            last: e.0,
            kept: e.1.to_vec(),
            peeked,
        })
    }

    /// A cursor of the same thread at `mark` (its stream positioned by
    /// `stream`, fresh).
    pub(crate) fn at_mark(mut stream: stream::Stream<'t>, mark: &ValueMark) -> Result<Self> {
        if !stream.seek(mark.offset)? && stream.offset() != mark.offset {
            return Err(Error::Index(format!(
                "a data state's value cursor at stream offset {}, past the stream's end",
                mark.offset
            )));
        }
        stream.set_entry_rsp(mark.last, mark.kept.clone());
        Ok(DataCursor {
            stream,
            given: mark.given as usize,
            peeked: mark.peeked.map(|(v, e)| DataItem::Value(v, e)),
        })
    }

    /// The items left (read to the end), in order, to `f`.
    pub fn rest(mut self, f: &mut dyn FnMut(DataItem)) -> Result<()> {
        while let Some(item) = self.next()? {
            f(item);
        }
        Ok(())
    }

    /// How many values are left (read to the end, across signals), and
    /// how many of them ENTER_SAME records repeat (format 1.21: no VALUE
    /// written).
    pub fn count(mut self) -> Result<(u64, u64)> {
        let (mut n, before) = (0, self.stream.entries_same());
        while let Some(item) = self.next()? {
            n += matches!(item, DataItem::Value(..)) as u64;
        }
        Ok((n, self.stream.entries_same() - before))
    }
}
