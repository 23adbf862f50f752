//! A machine's state at a pause point as bytes: the entries of the state
//! index (`crate::index`, `docs/regen.md` section 4, "The state index"),
//! from which `-j N` expands a piece of a stream without walking what
//! precedes it.
//!
//! A pause point is a read point (`summary`) outside any signal handler,
//! with nothing pending: the next stream item is a one-byte witness. The
//! state there is the stream offset, the current block, the procedure stack, the lazy bindings seen, the setjmp
//! bindings (call block and `rsp`, depth) and the transfer count. Counters
//! (`entries`, `signals`) are not state: a restored machine counts from 0.
//! The trail (what is not certain yet) is not kept either: the witness at
//! the pause point is in the stream, so everything before it ran, and the
//! restored machine starts with an empty trail, as a piece does. How many
//! chunks are read is not state either: a walk pauses where the stream's
//! bytes say (it reads the next chunk to see the witness), whatever it
//! has buffered; the buffer changes where summaries apply, never the
//! output.
//!
//! Invariants: equal states encode to equal bytes (sets and maps in
//! sorted order), so a piece that reaches the next entry's pause point
//! checks its own state against the entry; restoring checks every index
//! against the modules, and never panics on any bytes.

use super::{Frame, Loc, Machine, ModuleIx};
use crate::compile::{BlockIx, ProcIx, EXIT};
use crate::error::{Error, Result};
use crate::index::Fields;
use aetrace_graph::EntityRef;

const RET: u8 = 0;
const CB: u8 = 1;
const LAZY: u8 = 2;

impl<'a> Machine<'a> {
    /// The state at a pause point, encoded; `None` where the machine is
    /// not at one (inside a handler, a witness pending, stopped).
    pub(crate) fn snapshot(&self) -> Option<Vec<u8>> {
        let cur = self.cur?;
        let clean = self.started
            && self.pending.is_none()
            && self.sigs.is_empty()
            && self.uncount.is_empty()
            && !self.chained
            && self.stopped.is_none();
        if !clean {
            return None;
        }
        let mut out = Vec::with_capacity(64 + 9 * self.stack.len());
        put64(&mut out, self.stream.offset());
        put32(&mut out, self.xfers);
        put_loc(&mut out, cur);
        put32(&mut out, self.stack.len() as u32);
        for f in &self.stack {
            match *f {
                Frame::Ret(l) => {
                    out.push(RET);
                    put_loc(&mut out, l);
                }
                Frame::Cb => out.push(CB),
                Frame::Lazy => out.push(LAZY),
                Frame::Sig => return None,
            }
        }
        let mut lazy: Vec<_> = self.seen_lazy.iter().copied().collect();
        lazy.sort_unstable_by_key(|&(m, p)| (m.index(), p.index()));
        put32(&mut out, lazy.len() as u32);
        for (m, p) in lazy {
            put32(&mut out, m.index() as u32);
            put32(&mut out, p.index() as u32);
        }
        let mut bufs: Vec<_> = self.setjmps.iter().map(|(&k, &d)| (k, d)).collect();
        bufs.sort_unstable_by_key(|&((l, rsp), _)| (l.module.index(), l.block.index(), rsp));
        put32(&mut out, bufs.len() as u32);
        for ((l, rsp), depth) in bufs {
            put64(&mut out, rsp);
            put64(&mut out, depth as u64);
            put_loc(&mut out, l);
        }
        Some(out)
    }

    /// Puts a machine fresh from [`Machine::new`] (and `set_killed`) into
    /// the state `snap` encodes, its stream at the pause point.
    pub(crate) fn restore(&mut self, snap: &[u8]) -> Result<()> {
        let bad = |what: &str| Error::Index(format!("thread {}: {what}", self.thread));
        let mut r = Fields(snap);
        let offset = r.u64();
        let xfers = r.u32();
        let cur = self.read_loc(&mut r);
        let (Some(offset), Some(xfers), Some(cur)) = (offset, xfers, cur) else {
            return Err(bad("a state is cut short or names a block of no module"));
        };
        let b = self.block(cur);
        if b.next != EXIT || b.call.is_some() {
            return Err(bad("a state's block is not a read point"));
        }
        let state = self
            .read_rest(&mut r)
            .filter(|_| r.0.is_empty())
            .ok_or_else(|| bad("a state is malformed or names what no module has"))?;
        if !self.stream.seek(offset)? || self.stream.peek_byte_witness().is_none() {
            return Err(bad(&format!(
                "stream byte offset {offset} is not a witness of the stream"
            )));
        }
        (self.stack, self.seen_lazy, self.setjmps) = state;
        self.cur = Some(cur);
        self.xfers = xfers;
        self.started = true;
        // A fork child's parent state is in the snapshot's stack.
        self.forked_from = None;
        Ok(())
    }

    /// The stack, lazy bindings and setjmp bindings of a state.
    #[allow(clippy::type_complexity)]
    fn read_rest(
        &self,
        r: &mut Fields<'_>,
    ) -> Option<(
        Vec<Frame>,
        std::collections::HashSet<(ModuleIx, ProcIx)>,
        std::collections::HashMap<(Loc, u64), usize>,
    )> {
        let n = r.u32()? as usize;
        let mut stack = Vec::with_capacity(n.min(r.0.len()));
        for _ in 0..n {
            stack.push(match r.u8()? {
                RET => Frame::Ret(self.read_call(r)?),
                CB => Frame::Cb,
                LAZY => Frame::Lazy,
                _ => return None,
            });
        }
        let mut lazy = std::collections::HashSet::new();
        for _ in 0..r.u32()? {
            let m = r.u32()? as usize;
            let p = r.u32()? as usize;
            (p < self.modules.get(m)?.procs.len()).then_some(())?;
            lazy.insert((ModuleIx::new(m), ProcIx::new(p)));
        }
        let mut bufs = std::collections::HashMap::new();
        for _ in 0..r.u32()? {
            let rsp = r.u64()?;
            let depth = usize::try_from(r.u64()?).ok()?;
            bufs.insert((self.read_call(r)?, rsp), depth);
        }
        Some((stack, lazy, bufs))
    }

    /// A call block (where a `Ret` frame or a setjmp stands).
    fn read_call(&self, r: &mut Fields<'_>) -> Option<Loc> {
        self.read_loc(r).filter(|&l| self.block(l).call.is_some())
    }

    /// A block of one of the machine's modules.
    fn read_loc(&self, r: &mut Fields<'_>) -> Option<Loc> {
        let m = r.u32()? as usize;
        let b = r.u32()? as usize;
        (b < self.modules.get(m)?.blocks.len()).then(|| Loc {
            module: ModuleIx::new(m),
            block: BlockIx::new(b),
        })
    }
}

fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_loc(out: &mut Vec<u8>, l: Loc) {
    put32(out, l.module.index() as u32);
    put32(out, l.block.index() as u32);
}
