//! The command line of `cachesim` and `aetrace cachesim`.
//!
//! Dinero IV's single-dash options are parsed by hand (`-l1-isize 16k` is
//! not clap-friendly).  The trace is read from stdin or from the one
//! positional FILE.  How the reading is spread over threads:
//! - a binary file is read in pieces and decoded by one thread that hands
//!   batches to the simulating thread, as a pipe is (below): with two
//!   CPUs the decoding runs beside the simulation;
//! - a text file is memory-mapped, cut into pieces at line ends, and the
//!   pieces are parsed by two threads while the main thread simulates them
//!   in order;
//! - a pipe is read and parsed by one thread that hands batches to the
//!   simulating thread over a bounded channel;
//! - an aetrace trace is regenerated on one thread (`aetrace_regen::visit`)
//!   that hands batches of executed blocks to the simulating thread, which
//!   simulates them block by block (`aetrace_cachesim::fetch`): no text,
//!   no pipe, no record per instruction, the same results as the pipe
//!   from `aetrace regen --format bin`;
//! - an aetrace trace with data addresses (`record --data`) is walked on
//!   one thread (`dataout::walk`) that hands batches of references, in
//!   the order of `aetrace regen --format xdin --data`, to the simulating
//!   thread: the same references, so the same results, as that pipe.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;

use super::dataout::{Link, SegCode, Segmented, Whole};
use aetrace_analysis::addr::exec::code::flat::{FlatCode, Regs};
use aetrace_analysis::addr::exec::code::BlockCode;
use aetrace_analysis::addr::full::Recorded;
use aetrace_analysis::addr::Access;
use aetrace_cachesim::cachegrind::Cachegrind;
use aetrace_cachesim::config::{CacheConfig, HierarchyBuilder};
use aetrace_cachesim::dinero::Hierarchy;
use aetrace_cachesim::fetch::{BlockLines, CodeBlock, InsnFetch, Stripped};
use aetrace_cachesim::sweep::{Sweep, SweepSpec};
use aetrace_cachesim::trace::{InFormat, Input, Reader, Ref};
use aetrace_cachesim::{report, AccessKind, Error, Result};
use aetrace_regen::compile::BlockIx;
use aetrace_regen::compile::Module;
use aetrace_regen::visit::{BlockRun, Event, Runs, Segment, Step, Visit};

const USAGE: &str = "\
usage: cachesim [options] [FILE]
Reads a trace from FILE or stdin and simulates caches with Dinero IV semantics.

Cache options (N = 1..5 level, T = u unified, i instruction, d data):
  -lN-Tsize P      cache size (required; P = power of two, k/m/g suffix)
  -lN-Tbsize P     block size (required)
  -lN-Tsbsize P    sub-block size (only = block size is implemented)
  -lN-Tassoc U     associativity (default 1)
  -lN-Trepl C      replacement: l LRU, f FIFO, r random (default l)
  -lN-Tfetch C     fetch policy: d demand (the only one implemented)
  -lN-Twalloc C    write allocate: a always, n never, f no-fetch (default a)
  -lN-Twback C     write back: a always, n never (write through), f no-fetch (default a)
  -lN-Tccc         compulsory/capacity/conflict miss statistics
Input and run:
  -informat C      D extended din (default), d traditional din, b aetrace binary
                   (a binary trace is recognised by its header without -informat)
  -skipcount U     skip the first U references
  -maxcount U      stop after U references (0: no limit)
  --seed U         seed of random replacement (default 1)
  --model M        dinero (default) or cachegrind (I1/D1 + optional -l2-u LL)
  --json           print statistics as JSON
  --configs FILE   simulate every configuration of FILE (one line of cache
                   options each, # comments) in one pass over the input,
                   instead of cache options on the command line
An aetrace trace (TRACE.aet) as FILE is regenerated and simulated in this
process, block by block, with the same results as
`aetrace regen --format bin TRACE.aet | cachesim ...`, or, recorded with
--data, instructions and data as `aetrace regen --format xdin --data`:
  --modules        also print the instruction fetches per traced module
                   (a trace without data)
One-pass LRU sweep (instead of the options above):
  --sweep LO..HI   every power-of-two size from LO to HI
  --assoc LIST     associativities, e.g. 1,2,4,8,full (default 1,2,4,8,full)
  --bsize P        block size of the sweep (default 64)
  --svg FILE       also draw the miss-ratio curves as SVG
Exit status: 0 ok, 1 bad input or runtime error, 2 usage error.
";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Model {
    Dinero,
    Cachegrind,
}

/// A parsed command line.
#[derive(Debug)]
struct Cli {
    caches: HierarchyBuilder,
    configs: Option<PathBuf>,
    informat: Option<InFormat>,
    input: Input,
    skipcount: u64,
    maxcount: Option<u64>,
    seed: u64,
    model: Model,
    json: bool,
    modules: bool,
    sweep: Option<String>,
    assoc: Option<String>,
    bsize: Option<u64>,
    svg: Option<PathBuf>,
    help: bool,
}

fn number(opt: &str, v: Option<&str>) -> Result<u64> {
    let v = v.ok_or_else(|| Error::Usage(format!("\"{opt}\" option requires an argument")))?;
    v.parse()
        .map_err(|_| Error::Usage(format!("{opt} {v}: expected an unsigned decimal number")))
}

fn parse(args: &[String]) -> Result<Cli> {
    let mut cli = Cli {
        caches: HierarchyBuilder::default(),
        configs: None,
        informat: None,
        input: Input::Stdin,
        skipcount: 0,
        maxcount: None,
        seed: 1,
        model: Model::Dinero,
        json: false,
        modules: false,
        sweep: None,
        assoc: None,
        bsize: None,
        svg: None,
        help: false,
    };
    let mut file: Option<PathBuf> = None;
    let mut k = 0;
    while k < args.len() {
        let opt = args[k].as_str();
        let arg = args.get(k + 1).map(String::as_str);
        let need = |v: Option<&str>| {
            v.map(str::to_owned)
                .ok_or_else(|| Error::Usage(format!("\"{opt}\" option requires an argument")))
        };
        let mut used = 2;
        match opt {
            "-help" | "--help" | "-h" => {
                cli.help = true;
                used = 1;
            }
            "-informat" => {
                let v = need(arg)?;
                cli.informat = Some(InFormat::from_letter(&v).ok_or_else(|| {
                    Error::Usage(format!(
                        "-informat {v}: expected D (extended din), d (traditional din) or b (aetrace binary)"
                    ))
                })?);
            }
            "-skipcount" => cli.skipcount = number(opt, arg)?,
            // As in Dinero, 0 means no limit.
            "-maxcount" => cli.maxcount = Some(number(opt, arg)?).filter(|&n| n != 0),
            "--seed" => cli.seed = number(opt, arg)?,
            "--model" => {
                cli.model = match need(arg)?.as_str() {
                    "dinero" => Model::Dinero,
                    "cachegrind" => Model::Cachegrind,
                    v => {
                        return Err(Error::Usage(format!(
                            "--model {v}: expected dinero or cachegrind"
                        )))
                    }
                }
            }
            "--json" => {
                cli.json = true;
                used = 1;
            }
            "--modules" => {
                cli.modules = true;
                used = 1;
            }
            "--configs" => cli.configs = Some(PathBuf::from(need(arg)?)),
            "--sweep" => cli.sweep = Some(need(arg)?),
            "--assoc" => cli.assoc = Some(need(arg)?),
            "--bsize" => {
                cli.bsize = Some(aetrace_cachesim::config::parse_scaled(opt, &need(arg)?)?)
            }
            "--svg" => cli.svg = Some(PathBuf::from(need(arg)?)),
            "-flushcount" | "-stat-interval" | "-on-trigger" | "-off-trigger"
            | "-stat-idcombine" | "-custom" => {
                return Err(Error::Usage(format!(
                    "\"{opt}\": this Dinero IV option is not implemented"
                )))
            }
            "-" => {
                file = None;
                used = 1;
            }
            _ => match cli.caches.take(opt, arg)? {
                Some(n) => used = n,
                None if opt.starts_with('-') => {
                    return Err(Error::Usage(format!("\"{opt}\" option not recognized")))
                }
                None => {
                    if file.is_some() {
                        return Err(Error::Usage(format!("more than one input file ({opt})")));
                    }
                    file = Some(PathBuf::from(opt));
                    used = 1;
                }
            },
        }
        k += used;
    }
    if let Some(f) = file {
        cli.input = Input::File(f);
    }
    Ok(cli)
}

/// `-skipcount` and `-maxcount` applied to a stream of batches.
struct Window {
    skip: u64,
    left: u64,
    simulated: u64,
}

impl Window {
    /// `-skipcount` and `-maxcount` of `cli`.
    fn new(cli: &Cli) -> Self {
        Window {
            skip: cli.skipcount,
            left: cli.maxcount.unwrap_or(u64::MAX),
            simulated: 0,
        }
    }

    /// Simulates the part of `batch` inside the window; false when done.
    fn feed<T>(&mut self, batch: &[T], sim: &mut impl FnMut(&[T]) -> Result<()>) -> Result<bool> {
        let s = (self.skip as usize).min(batch.len());
        self.skip -= s as u64;
        let refs = &batch[s..];
        let n = self.left.min(refs.len() as u64) as usize;
        sim(&refs[..n])?;
        self.simulated += n as u64;
        self.left -= n as u64;
        Ok(self.left > 0)
    }

    fn finish(self) -> u64 {
        if self.skip > 0 {
            eprintln!("cachesim: warning: input ended before -skipcount was satisfied");
        }
        self.simulated
    }
}

/// Reads the trace and sends batches to `sim`.  Text and `bin` input are
/// parsed or decoded on other threads.
fn drive(cli: &Cli, mut sim: impl FnMut(&[Ref]) -> Result<()>) -> Result<u64> {
    let mut window = Window::new(cli);
    if let Some(path) = is_trace(cli) {
        return drive_data(path, window, (None, None), sim);
    }
    let mut reader = Reader::open(&cli.input, cli.informat)?;
    if let Some((text, format)) = reader.mapped_text() {
        return drive_chunks(text, format, window, sim);
    }
    let (tx, rx) = mpsc::sync_channel::<Result<Vec<Ref>>>(4);
    let (back_tx, back_rx) = mpsc::channel::<Vec<Ref>>();
    // `move`: an early return drops `rx`, which unblocks and stops the parser
    // thread before the scope joins it.
    std::thread::scope(move |scope| {
        scope.spawn(move || loop {
            let mut batch = back_rx.try_recv().unwrap_or_default();
            let r = reader.next_batch(&mut batch);
            let end = matches!(&r, Ok(()) if batch.is_empty());
            let failed = r.is_err();
            if tx.send(r.map(|()| batch)).is_err() || end || failed {
                return;
            }
        });
        for msg in rx.iter() {
            let batch = msg?;
            if batch.is_empty() || !window.feed(&batch, &mut sim)? {
                break;
            }
            let _ = back_tx.send(batch);
        }
        // Dropping `rx` here stops the parser thread at its next send.
        drop(rx);
        Ok(window.finish())
    })
}

/// Parser threads for a memory-mapped text file.
const PARSERS: usize = 2;
/// Bytes of text per piece handed to a parser thread.
const CHUNK: usize = 1 << 20;

/// A memory-mapped text file: [`PARSERS`] threads parse alternate pieces
/// while this thread simulates them in order, so text parsing, the slow
/// part, uses every core.  Errors keep their file line numbers: a piece's
/// line numbers are offset by the lines of the pieces before it.
fn drive_chunks(
    text: &[u8],
    format: InFormat,
    mut window: Window,
    mut sim: impl FnMut(&[Ref]) -> Result<()>,
) -> Result<u64> {
    let bounds = aetrace_cachesim::trace::chunk_bounds(text, CHUNK);
    std::thread::scope(|scope| {
        let mut results = Vec::new();
        let mut recycle = Vec::new();
        for w in 0..PARSERS {
            let (tx, rx) = mpsc::sync_channel::<Result<(Vec<Ref>, u64)>>(2);
            let (back_tx, back_rx) = mpsc::channel::<Vec<Ref>>();
            results.push(rx);
            recycle.push(back_tx);
            let bounds = &bounds;
            scope.spawn(move || {
                for &(a, b) in bounds.iter().skip(w).step_by(PARSERS) {
                    let mut out = back_rx.try_recv().unwrap_or_default();
                    let r = aetrace_cachesim::trace::parse_chunk(&text[a..b], format, &mut out)
                        .map(|n| (out, n));
                    let failed = r.is_err();
                    if tx.send(r).is_err() || failed {
                        return;
                    }
                }
            });
        }
        // Returning drops `results`, which stops the parsers at their next send.
        let mut lines_before = 0u64;
        for k in 0..bounds.len() {
            let msg = results[k % PARSERS]
                .recv()
                .map_err(|_| Error::Io(std::io::Error::other("a parser thread stopped")))?;
            let (refs, lines) = msg.map_err(|e| match e {
                Error::Line { line, message } => Error::Line {
                    line: line + lines_before,
                    message,
                },
                e => e,
            })?;
            lines_before += lines;
            if !window.feed(&refs, &mut sim)? {
                break;
            }
            let _ = recycle[k % PARSERS].send(refs);
        }
        Ok(window.finish())
    })
}

/// References per batch of a data trace's walk (gzip 2 MB, loaded machine:
/// 27.4 CPU s and 95k context switches against 30.5 s and 362k at 4096),
/// counted by [`Sent::weight`].
const DATA_BATCH: usize = 16384;

/// What [`Batches`] sends for a reference: a [`Ref`], or a [`Rec`], which
/// also counts the followers before it.
trait Sent: Copy + Send + 'static {
    fn new(kind: AccessKind, addr: u64, size: u32) -> Self;
    /// The reference.
    fn plain(&self) -> Ref;
    /// Counts `n` more followers before the reference; false (nothing
    /// changed) if it cannot carry them.
    fn fold(&mut self, n: u64) -> bool;
    /// The followers counted in it.
    fn before(&self) -> u64;
    fn set_addr(&mut self, addr: u64);
    /// The references it stands for as the walk sent them with every
    /// group of followers a marker of its own: where the batches are
    /// cut does not depend on how the followers go.
    #[inline(always)]
    fn weight(&self) -> usize {
        1 + usize::from(self.before() != 0)
    }
    /// A marker of `n` instruction fetches that hit I1's line fetched
    /// last (a real fetch is never 0 bytes long).
    fn marker(n: u64) -> Self {
        Self::new(AccessKind::Instr, n, 0)
    }
}

impl Sent for Ref {
    #[inline(always)]
    fn new(kind: AccessKind, addr: u64, size: u32) -> Self {
        Ref { kind, addr, size }
    }
    #[inline(always)]
    fn plain(&self) -> Ref {
        *self
    }
    fn fold(&mut self, n: u64) -> bool {
        n == 0
    }
    #[inline(always)]
    fn before(&self) -> u64 {
        0
    }
    #[inline(always)]
    fn set_addr(&mut self, addr: u64) {
        self.addr = addr;
    }
}

/// A reference and the followers before it (the cachegrind model's
/// batches of a data trace): a group of followers rides in the
/// reference after it instead of a marker of its own, which was 45 % of
/// the references sent on gzip, each a pass of the simulating loop.
#[derive(Clone, Copy, Debug)]
struct Rec {
    addr: u64,
    size: u32,
    /// The followers before it.
    before: u16,
    kind: AccessKind,
}

impl Sent for Rec {
    #[inline(always)]
    fn new(kind: AccessKind, addr: u64, size: u32) -> Self {
        Rec {
            addr,
            size,
            before: 0,
            kind,
        }
    }
    #[inline(always)]
    fn plain(&self) -> Ref {
        Ref {
            kind: self.kind,
            addr: self.addr,
            size: self.size,
        }
    }
    #[inline(always)]
    fn fold(&mut self, n: u64) -> bool {
        // A marker counts its fetches in its address.
        match u16::try_from(n + u64::from(self.before)) {
            Ok(b) if self.size != 0 => {
                self.before = b;
                true
            }
            _ => false,
        }
    }
    #[inline(always)]
    fn before(&self) -> u64 {
        u64::from(self.before)
    }
    #[inline(always)]
    fn set_addr(&mut self, addr: u64) {
        self.addr = addr;
    }
}

/// `r` with the followers `pending` (none after) counted in it, or, if
/// it cannot carry them, in a marker pushed to `out`; `grouped` gains
/// the followers counted beyond one reference sent each.
#[inline(always)]
fn lead<W: Sent>(pending: &mut u64, grouped: &mut u64, out: &mut Vec<W>, mut r: W) -> W {
    if *pending != 0 {
        let n = std::mem::take(pending);
        match r.fold(n) {
            true => *grouped += n,
            false => {
                *grouped += n - 1;
                out.push(W::marker(n));
            }
        }
    }
    r
}

/// A data trace's walk as batches of references sent to the simulating
/// thread (a modify is a read then a write, as in extended din).
///
/// With `followers` (the cachegrind model, no `-skipcount`), an
/// instruction fetch in the line its block's instruction before it ended
/// in (not a *leader*, `aetrace_cachesim::fetch`) is not sent: it hits I1
/// and changes no state, since data references never touch I1. The
/// followers between two references sent are counted in the next
/// ([`Rec`]), so that the model still sees an instruction between a read
/// and a write (no read-modify-write merged across it).
struct Batches<W> {
    tx: mpsc::SyncSender<Vec<W>>,
    back: mpsc::Receiver<Vec<W>>,
    out: Out<W>,
    /// The simulating thread wants no more.
    stopped: bool,
    followers: Option<Followers>,
    /// Per module, per block: what a whole run of it sends, built at its
    /// first such run.
    templates: Vec<Vec<Option<Template<W>>>>,
    /// Per segment program number (`Sink::segment_code`).
    segs: Vec<Option<SegTemplate<W>>>,
    /// With one configuration: its I1's top lines, so that the fetches
    /// that change nothing go as followers.
    tops: Option<Tops>,
}

/// The batch [`Batches`] fills, and the followers not in it yet.
struct Out<W> {
    batch: Vec<W>,
    /// The batch's [`Sent::weight`].
    weight: usize,
    /// Followers not sent since the last reference sent.
    pending: u64,
    /// Followers counted in references sent beyond one each.
    grouped: u64,
    /// Whether followers would be pending had no fetch been folded
    /// ([`Tops`]): the batch's weight is that stream's, so batches are
    /// cut where they were.
    shadow: bool,
}

/// What a run of a segment's program sends ([`Batches`]): its blocks'
/// templates chained, the followers pending after each block counted in
/// the next block's first reference. A block's first fetch in the I1
/// line the block before it ended in is a follower too (that line is the
/// most recent of its set: a hit that changes nothing), counted there
/// with the followers after it; not the first block's, whose run before
/// is not fixed.
struct SegTemplate<W> {
    code: SegCode<W>,
    /// Its references' [`Sent::weight`].
    weight: usize,
    /// Followers counted in references inside the run beyond one each.
    grouped: u64,
    /// Followers after the run's last reference sent.
    trailing: u64,
    /// The run without its fetches, with [`Tops`].
    lean: Option<Lean<W>>,
}

/// What a whole run of a block with flat code sends ([`Batches`]), its
/// data addresses left to fill: the references are fixed by the block's
/// code and its followers, so a run copies them and the block's flat
/// code puts its addresses in ([`FlatCode::run_into`]), rather than
/// deciding each instruction again. Its first reference is the block's
/// first fetch, with no followers before it.
struct Template<W> {
    /// The run's references, a data reference's address 0 (stored
    /// over, not or'ed in: no load of the record just copied).
    refs: Vec<W>,
    /// Their [`Sent::weight`].
    weight: usize,
    /// The flat code, each address placed in its references.
    flat: FlatCode,
    /// Followers counted in references inside the run beyond one each.
    grouped: u64,
    /// Followers after the run's last reference sent (pending after it).
    trailing: u64,
    /// The run without its fetches, with [`Tops`].
    lean: Option<Lean<W>>,
}

/// The line on top of each set of the one I1 simulated (the cachegrind
/// model with one configuration), as the simulating thread has it when
/// it comes to the fetch the walk sends next. A fetch whose lines are on
/// top of their sets hits and changes nothing (LRU), as a follower does,
/// so it goes as one: counted in the reference sent after it. Data
/// references never touch I1, and every fetch leaves its lines on top of
/// their sets, hit or miss, so the fetches sent decide the tops.
struct Tops {
    shift: u32,
    mask: u64,
    top: Vec<u64>,
    /// How many times a top changed (a fetch sent): a [`Lean`] stamped
    /// with this number finds its lines still on top without looking.
    changes: u64,
}

impl Tops {
    /// An empty I1 of `sets` sets of `line`-byte lines.
    fn new((line, sets): (u64, u64)) -> Self {
        debug_assert!(line.is_power_of_two() && sets.is_power_of_two());
        Tops {
            shift: line.trailing_zeros(),
            mask: sets - 1,
            // No line: addresses are below 2^64 - 1.
            top: vec![u64::MAX; sets as usize],
            changes: 0,
        }
    }

    /// The first and last line of a fetch of `size` > 0 bytes at `addr`.
    #[inline(always)]
    fn lines(&self, addr: u64, size: u32) -> (u64, u64) {
        let end = addr.wrapping_add(u64::from(size) - 1);
        (addr >> self.shift, end >> self.shift)
    }

    #[inline(always)]
    fn on_top(&self, line: u64) -> bool {
        self.top[(line & self.mask) as usize] == line
    }

    /// Whether a fetch of `size` bytes at `addr` changes nothing: its one
    /// or two lines on top of their sets (a straddling fetch whose two
    /// lines hit is counted as one hit, `look_up`'s way).
    #[inline(always)]
    fn hits(&self, addr: u64, size: u32) -> bool {
        let (b, e) = self.lines(addr, size);
        self.on_top(b) && (e == b || (e == b + 1 && self.on_top(e)))
    }

    /// The fetch of `size` bytes at `addr` is sent: its lines go on top.
    /// One over more than two lines is refused by the simulator, which
    /// then stops: nothing after it is simulated.
    #[inline(always)]
    fn fetched(&mut self, addr: u64, size: u32) {
        let (b, e) = self.lines(addr, size);
        self.put(&[b, e.min(b + 1)]);
    }

    /// Each of `lines` goes on top of its set, in turn.
    #[inline(always)]
    fn put(&mut self, lines: &[u64]) {
        for &l in lines {
            self.top[(l & self.mask) as usize] = l;
        }
        self.changes += 1;
    }

    /// Whether every line of `l`'s run is on top of its set, so that the
    /// run's fetches change nothing; if not, they are sent, and each goes
    /// on top in turn. A run whose lines are in distinct sets then leaves
    /// them all on top: stamped, the next run finds them there at once
    /// if no top changed since.
    #[inline(always)]
    fn settle<W>(&mut self, l: &Lean<W>) -> bool {
        if l.stamp.get() == self.changes {
            return true;
        }
        if l.lines.iter().all(|&b| self.on_top(b)) {
            l.stamp.set(self.changes);
            return true;
        }
        self.put(&l.lines);
        if l.distinct {
            l.stamp.set(self.changes);
        }
        false
    }
}

/// A template's references without its fetches ([`Tops`]), for a run
/// whose fetches all hit on top of their I1 sets: each goes as a follower
/// in the reference after it, and the flat code puts the addresses in the
/// records left.
struct Lean<W> {
    /// The I1 lines the run fetches, in order (both of a straddling fetch).
    lines: Vec<u64>,
    /// No two of `lines` share a set unless equal.
    distinct: bool,
    /// [`Tops::changes`] when its lines were last all on top, if known.
    stamp: std::cell::Cell<u64>,
    refs: Vec<W>,
    flat: FlatCode,
    /// Followers counted in `refs` beyond one each (the first's too).
    grouped: u64,
    /// Followers after the last of `refs`.
    trailing: u64,
}

impl<W: Sent> Lean<W> {
    /// The lean form of a template (`refs`, their placed `flat` code,
    /// `trailing` followers after them); `None` if a fetch spans more than
    /// two lines (the simulator refuses it).
    fn new(refs: &[W], flat: &FlatCode, trailing: u64, tops: &Tops) -> Option<Self> {
        let (mut lines, mut kept, mut grouped, mut pending) = (Vec::new(), Vec::new(), 0, 0);
        // Where each of `refs` went, for the data references' addresses.
        let mut to = Vec::with_capacity(refs.len());
        for r in refs {
            let p = r.plain();
            pending += r.before();
            to.push(u32::MAX);
            match (p.kind, p.size) {
                // A marker.
                (AccessKind::Instr, 0) => pending += p.addr,
                (AccessKind::Instr, size) => {
                    let (b, e) = tops.lines(p.addr, size);
                    if e > b + 1 {
                        return None;
                    }
                    lines.push(b);
                    lines.extend((e != b).then_some(e));
                    pending += 1;
                }
                (kind, size) => {
                    let r = lead(&mut pending, &mut grouped, &mut kept, W::new(kind, 0, size));
                    *to.last_mut().expect("pushed") = u32::try_from(kept.len()).ok()?;
                    kept.push(r);
                }
            }
        }
        let set = |b: u64| b & tops.mask;
        let distinct = (lines.iter()).all(|&a| lines.iter().all(|&b| a == b || set(a) != set(b)));
        Some(Lean {
            lines,
            distinct,
            stamp: std::cell::Cell::new(u64::MAX),
            refs: kept,
            flat: flat.moved(|p| to[p as usize]),
            grouped,
            trailing: pending + trailing,
        })
    }
}

impl<W: Sent> Template<W> {
    /// The references of a whole run of `code` (module load bias
    /// `base`, flat code `flat`), with `follows` its instructions'
    /// follower flags if followers are counted, as [`Batches`]'s
    /// per-instruction path sends them with nothing pending before.
    fn new(
        code: &BlockCode,
        flat: &FlatCode,
        base: u64,
        follows: Option<&[bool]>,
        tops: Option<&Tops>,
    ) -> Self {
        let mut t = Template {
            refs: Vec::new(),
            weight: 0,
            flat: flat.clone(),
            grouped: 0,
            trailing: 0,
            lean: None,
        };
        let mut at = Vec::new();
        for (k, c) in code.insns.iter().enumerate() {
            match follows.is_some_and(|f| k != 0 && f[k]) {
                true => t.trailing += 1,
                false => t.push(AccessKind::Instr, base.wrapping_add(c.ip), c.len),
            }
            for r in code.refs(k) {
                if r.access != Access::Store {
                    t.push(AccessKind::Read, 0, r.size);
                }
                let read = t.refs.len() as u32 - 1;
                if r.access != Access::Load {
                    t.push(AccessKind::Write, 0, r.size);
                }
                // A store's place is its write: `read` is the one before.
                let write = t.refs.len() as u32 - 1;
                at.push([
                    if r.access == Access::Store {
                        write
                    } else {
                        read
                    },
                    write,
                ]);
            }
        }
        debug_assert_eq!(
            at.len(),
            flat.refs,
            "the flat code's addresses are the block's"
        );
        t.flat = flat.placed(|n| at[n]);
        t.weight = t.refs.iter().map(W::weight).sum();
        t.lean = tops.and_then(|tops| Lean::new(&t.refs, &t.flat, t.trailing, tops));
        t
    }

    /// Appends a reference after the followers pending.
    fn push(&mut self, kind: AccessKind, addr: u64, size: u32) {
        let r = lead(
            &mut self.trailing,
            &mut self.grouped,
            &mut self.refs,
            W::new(kind, addr, size),
        );
        self.refs.push(r);
    }
}

/// Which instructions of each block are followers for the smallest I1
/// line, and the block run walked now.
struct Followers {
    line: u64,
    /// Per instruction of every block (modules in order).
    follows: Vec<bool>,
    /// Per module: per block, where its instructions start in `follows`.
    starts: Vec<Vec<usize>>,
    /// The run's first instruction in `follows`.
    at: usize,
    /// The instruction fetched last in the run (a `rep`'s iterations are
    /// fetches of one instruction: sent).
    prev: Option<u32>,
}

impl Followers {
    fn new(modules: &[Module], line: u64) -> Self {
        let code = modules.iter().flat_map(|m| {
            m.blocks.iter().map(|(b, block)| CodeBlock {
                addr: m.load_base.wrapping_add(block.start),
                lens: m.insn_lens(b),
            })
        });
        let lines = BlockLines::new(code, line);
        let (mut follows, mut starts, mut id) = (Vec::new(), Vec::new(), 0);
        for m in modules {
            starts.push(Vec::with_capacity(m.blocks.len()));
            for _ in 0..m.blocks.len() {
                let (leaders, ninsns) = lines.block(id);
                let at = follows.len();
                starts.last_mut().expect("pushed").push(at);
                follows.resize(at + ninsns as usize, true);
                let mut k = at;
                for l in leaders {
                    follows[k] = false;
                    k += 1 + l.follow as usize;
                }
                id += 1;
            }
        }
        Followers {
            line,
            follows,
            starts,
            at: 0,
            prev: None,
        }
    }

    /// Whether the fetch of instruction `k` of the run is a follower.
    #[inline(always)]
    fn follows(&mut self, k: u32) -> bool {
        let f = k != 0 && self.prev == Some(k - 1) && self.follows[self.at + k as usize];
        self.prev = Some(k);
        f
    }
}

impl<W: Sent> Out<W> {
    /// Appends `refs` (a template's: the first a fetch with no
    /// followers before it) after the followers pending, of
    /// [`Sent::weight`] `weight`; where they start.
    /// A [`Lean`] template's may be none (the followers stay pending),
    /// and its first may carry followers; `weight` is then the full
    /// template's.
    #[inline(always)]
    fn append(&mut self, refs: &[W], weight: usize) -> usize {
        let mut at = self.batch.len();
        self.batch.extend_from_slice(refs);
        self.weight += weight + usize::from(std::mem::take(&mut self.shadow));
        if self.pending != 0 && !refs.is_empty() {
            let n = std::mem::take(&mut self.pending);
            match self.batch[at].fold(n) {
                true => self.grouped += n,
                false => at = self.insert_marker(at, n),
            }
        }
        at
    }

    /// A follower: an instruction whose fetch is not sent.
    #[inline(always)]
    fn follower(&mut self) {
        self.pending += 1;
        self.shadow = true;
    }

    /// A fetch that hits on top of its I1 set ([`Tops`]) goes as a
    /// follower; it weighs what it would have as a reference.
    #[inline(always)]
    fn folded(&mut self) {
        self.pending += 1;
        self.weight += 1 + usize::from(std::mem::take(&mut self.shadow));
    }

    /// After a template's run: `grouped` followers counted in its
    /// references beyond one each, `trailing` after them (`full`: the
    /// full template's).
    #[inline(always)]
    fn ran(&mut self, grouped: u64, trailing: u64, full: u64) {
        self.grouped += grouped;
        self.pending += trailing;
        self.shadow = full != 0;
    }

    /// A marker of `n` followers put at `at`, before the references
    /// there; where they start now.
    #[cold]
    fn insert_marker(&mut self, at: usize, n: u64) -> usize {
        self.grouped += n - 1;
        self.batch.insert(at, W::marker(n));
        at + 1
    }
}

impl<W: Sent> Batches<W> {
    #[inline(always)]
    fn push(&mut self, kind: AccessKind, addr: u64, size: u32) -> super::dataout::Result<()> {
        self.out.append(&[W::new(kind, addr, size)], 1);
        if self.out.weight < DATA_BATCH {
            return Ok(());
        }
        self.flush()
    }

    /// Sends the batch (and, at the end, the followers still pending).
    fn finish(&mut self) -> super::dataout::Result<()> {
        let o = &mut self.out;
        if o.pending != 0 {
            let n = std::mem::take(&mut o.pending);
            o.grouped += n - 1;
            o.batch.push(W::marker(n));
        }
        self.flush()
    }

    #[cold]
    fn flush(&mut self) -> super::dataout::Result<()> {
        let next = self.back.try_recv().unwrap_or_default();
        if (self.tx)
            .send(std::mem::replace(&mut self.out.batch, next))
            .is_err()
        {
            self.stopped = true;
            return Err("the simulation stopped".into());
        }
        self.out.batch.clear();
        self.out.weight = 0;
        Ok(())
    }
}

impl<W: Sent> super::dataout::Sink for Batches<W> {
    fn modules(&mut self, modules: &[Module]) {
        if let Some(f) = &mut self.followers {
            *f = Followers::new(modules, f.line);
        }
        self.templates = super::dataout::per_block(modules);
    }

    #[inline]
    fn run(&mut self, r: BlockRun) {
        if let Some(f) = &mut self.followers {
            f.at = f.starts[r.module as usize][r.block.as_u32() as usize];
            f.prev = None;
        }
    }

    /// Sends whole run `r` by its template, the flat code putting the
    /// run's addresses in the copy.
    #[inline]
    fn whole<T: FnMut(Recorded) -> Result<u64, String>>(
        &mut self,
        r: BlockRun,
        (code, flat): (&BlockCode, &FlatCode),
        base: u64,
        regs: &mut Regs,
        take: &mut T,
    ) -> super::dataout::Result<Whole> {
        let n = code.insns.len();
        if n == 0 {
            return Ok(Whole::Not);
        }
        let (m, b) = (r.module as usize, r.block.as_u32() as usize);
        let follows = (self.followers.as_ref()).map(|f| {
            let at = f.starts[m][b];
            &f.follows[at..at + n]
        });
        let tops = &mut self.tops;
        let t = self.templates[m][b]
            .get_or_insert_with(|| Template::new(code, flat, base, follows, tops.as_ref()));
        let o = &mut self.out;
        let before = o.batch.len();
        let (refs, flat, grouped, trailing) = match lean(tops, &t.lean) {
            Some(l) => (&l.refs, &l.flat, l.grouped, l.trailing),
            // The block's first instruction is sent: it takes what is pending.
            None => (&t.refs, &t.flat, t.grouped, t.trailing),
        };
        let at = o.append(refs, t.weight);
        let ran = flat.run_into(regs, take, &mut o.batch[at..], |r, a| r.set_addr(a));
        if let Err((k, why)) = ran {
            o.batch.truncate(before);
            return Ok(Whole::Failed(k, why));
        }
        o.ran(grouped, trailing, t.trailing);
        if o.weight >= DATA_BATCH {
            self.flush()?;
        }
        Ok(Whole::Ran)
    }

    fn segment_code(&mut self, id: usize, (m, module): (&Module, u32), links: &[Link]) -> bool {
        let line = self.followers.as_ref().map(|f| f.line);
        let (mut code, mut grouped, mut trailing) = (SegCode::default(), 0, 0);
        // The I1 line the block before ended in.
        let mut ended = None;
        for &link in links {
            let b = link.block;
            let Some(t) = &self.templates[module as usize][b.as_u32() as usize] else {
                return false;
            };
            let lines = line.map(|l| block_lines(m, b, l));
            // The block's first fetch, a follower here: its reference
            // is not sent, and the followers after it wait for the next.
            let skip =
                usize::from(lines.is_some_and(|(first, _)| ended.is_some_and(|e| first == [e, e])));
            trailing += skip as u64;
            // The followers pending go in the block's first reference
            // sent, as `whole` sends them (or a marker before it).
            let mut extra = Vec::new();
            let first =
                (t.refs.get(skip)).map(|&r| lead(&mut trailing, &mut grouped, &mut extra, r));
            let at = code.recs.len() + extra.len();
            if code
                .push(&extra, (&t.refs, &t.flat), (skip, link), m.blocks[b].ninsns)
                .is_none()
            {
                return false;
            }
            if let Some(r) = first {
                code.recs[at] = r;
            }
            grouped += t.grouped;
            trailing += t.trailing;
            ended = lines.map(|(_, end)| end);
        }
        let lean =
            (self.tops.as_ref()).and_then(|tops| Lean::new(&code.recs, &code.flat, trailing, tops));
        let seg = SegTemplate {
            weight: code.recs.iter().map(W::weight).sum(),
            code,
            grouped,
            trailing,
            lean,
        };
        super::dataout::put_segment(&mut self.segs, id, seg);
        true
    }

    /// Sends the segment's references by its template, the chained flat
    /// code putting the addresses in the copy; not when the batch would
    /// be sent inside it (the runs one by one would send it there).
    #[inline]
    fn run_segment<T: FnMut(Recorded) -> Result<u64, String>>(
        &mut self,
        id: usize,
        regs: &mut Regs,
        take: &mut T,
    ) -> super::dataout::Result<Segmented> {
        let Batches {
            segs, out: o, tops, ..
        } = self;
        let Some(Some(seg)) = segs.get(id) else {
            return Ok(Segmented::Not);
        };
        if o.weight + 1 + seg.weight >= DATA_BATCH {
            return Ok(Segmented::Not);
        }
        let before = o.batch.len();
        let lean = lean(tops, &seg.lean);
        let (refs, flat, grouped, trailing) = match lean {
            Some(l) => (&l.refs, &l.flat, l.grouped, l.trailing),
            None => (&seg.code.recs, &seg.code.flat, seg.grouped, seg.trailing),
        };
        let at = o.append(refs, seg.weight);
        let ran = flat.run_into(regs, take, &mut o.batch[at..], |r, a| r.set_addr(a));
        if let Err((k, why)) = ran {
            let (block, k) = seg.code.insn(k);
            // The blocks before it keep their records; a lean run's
            // places are not the blocks' (a failed walk never sends the
            // batch, `drive_data`).
            o.batch.truncate(match block {
                b if b == 0 || lean.is_some() => before,
                b => at + seg.code.records_of(b),
            });
            return Ok(Segmented::Failed { block, k, why });
        }
        o.ran(grouped, trailing, seg.trailing);
        Ok(Segmented::Ran)
    }

    #[inline(always)]
    fn insn(&mut self, k: u32, addr: u64, len: u32) -> super::dataout::Result<()> {
        if self.followers.as_mut().is_some_and(|f| f.follows(k)) {
            self.out.follower();
            return Ok(());
        }
        if let Some(tops) = &mut self.tops {
            if tops.hits(addr, len) {
                self.out.folded();
                return match self.out.weight < DATA_BATCH {
                    true => Ok(()),
                    false => self.flush(),
                };
            }
            tops.fetched(addr, len);
        }
        self.push(AccessKind::Instr, addr, len)
    }

    #[inline(always)]
    fn data(&mut self, access: Access, addr: u64, size: u32) -> super::dataout::Result<()> {
        if access != Access::Store {
            self.push(AccessKind::Read, addr, size)?;
        }
        if access != Access::Load {
            self.push(AccessKind::Write, addr, size)?;
        }
        Ok(())
    }
}

/// The I1 lines (of `line` bytes) of block `b`'s first instruction's
/// first and last byte, and of the block's last byte.
fn block_lines(m: &Module, b: BlockIx, line: u64) -> ([u64; 2], u64) {
    let block = &m.blocks[b];
    let lens = m.insn_lens(b);
    debug_assert_eq!(
        lens.iter().map(|&l| u32::from(l)).sum::<u32>(),
        block.size,
        "a block is its instructions"
    );
    let start = m.load_base.wrapping_add(block.start);
    let first = start.wrapping_add(u64::from(lens[0]) - 1);
    let last = start.wrapping_add(u64::from(block.size) - 1);
    ([start / line, first / line], last / line)
}

/// `lean` if every fetch of its run hits on top of its I1 set (`tops`);
/// else the run's fetches are sent, and `tops` follows them.
#[inline(always)]
fn lean<'l, W>(tops: &mut Option<Tops>, lean: &'l Option<Lean<W>>) -> Option<&'l Lean<W>> {
    match (tops, lean) {
        (Some(tops), Some(l)) => tops.settle(l).then_some(l),
        // No tops, or a fetch over more than two lines, which stops the
        // simulation.
        _ => None,
    }
}

/// The smallest I1 line of `cgs` when the input is a trace whose
/// followers may go as markers: not with -skipcount or -maxcount, whose
/// window counts each reference.
fn followers(cli: &Cli, groups: &mut [Stripped<Cachegrind>]) -> Option<u64> {
    let plain = cli.skipcount == 0 && cli.maxcount.is_none() && is_trace(cli).is_some();
    let cgs = groups.iter_mut().flat_map(Stripped::sims_mut);
    plain.then(|| cgs.map(|cg| cg.i1_line()).min())?
}

/// The I1 line and sets of the one simulator of `groups`, if one: the
/// walk then keeps its top lines ([`Tops`]).
fn i1_tops(groups: &mut [Stripped<Cachegrind>]) -> Option<(u64, u64)> {
    match groups {
        [g] => match g.sims_mut() {
            [cg] => Some((cg.i1_line(), cg.i1_sets())),
            _ => None,
        },
        _ => None,
    }
}

/// `sims` (one per configuration) as groups that each simulate a trace's
/// blocks on a thread of its own: two when there are two configurations
/// or more, the input is a trace and there are two CPUs; else one. Every
/// group still gets every block, so the statistics are those of one group
/// (they are independent simulators). With the groups, the configuration
/// of each of their simulators, group after group.
fn groups<S: InsnFetch>(cli: &Cli, sims: Vec<S>) -> (Vec<Stripped<S>>, Vec<usize>) {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if sims.len() < 2 || cpus < 2 || is_trace(cli).is_none() {
        let order = (0..sims.len()).collect();
        return (vec![Stripped::new(sims)], order);
    }
    let sides = sides(&sims);
    let mut sims: Vec<Option<S>> = sims.into_iter().map(Some).collect();
    let mut take = |ks: &[usize]| -> Vec<S> {
        let each = ks
            .iter()
            .map(|&k| sims[k].take().expect("in one side only"));
        each.collect()
    };
    let groups = sides.iter().map(|ks| Stripped::new(take(ks))).collect();
    (groups, sides.concat())
}

/// Which configurations each of two groups ([`groups`]) takes. Those
/// whose first instruction caches would share a filter ([`Stripped`]: one
/// line size, strippable) stay together, so the filter runs once; such a
/// class, or a configuration fed directly, goes to the group with less
/// work so far, the heaviest first. Work is counted in leader lookups per
/// leader: one for a cache fed directly, one for a filter and a tenth for
/// each cache behind it (the filter passed 9 % of gzip's leaders,
/// `docs/cachesim.md`). One class alone is split alternately (a filter
/// in each group).
fn sides<S: InsnFetch>(sims: &[S]) -> [Vec<usize>; 2] {
    let mut classes: Vec<(Option<u64>, Vec<usize>)> = Vec::new();
    for (k, s) in sims.iter().enumerate() {
        let line = s.strippable().map(|(line, _)| line);
        match classes.iter_mut().find(|c| line.is_some() && c.0 == line) {
            Some(c) => c.1.push(k),
            None => classes.push((line, vec![k])),
        }
    }
    let mut sides = [Vec::new(), Vec::new()];
    if let [(_, one)] = &classes[..] {
        for &k in one {
            sides[k % 2].push(k);
        }
        return sides;
    }
    let work = |c: &(Option<u64>, Vec<usize>)| match c.1.len() {
        n if n >= 2 => 10 + n,
        _ => 10,
    };
    classes.sort_by_key(|c| std::cmp::Reverse(work(c)));
    let mut load = [0, 0];
    for c in &classes {
        let side = usize::from(load[1] < load[0]);
        load[side] += work(c);
        sides[side].extend(&c.1);
    }
    sides
}

/// The simulators of [`groups`] back in configuration order (`order`:
/// the configuration of each, group after group), every fetch counted.
fn ungroup<S: InsnFetch>(groups: Vec<Stripped<S>>, order: &[usize]) -> Vec<S> {
    let mut out: Vec<Option<S>> = order.iter().map(|_| None).collect();
    for (s, &k) in groups.into_iter().flat_map(Stripped::finish).zip(order) {
        out[k] = Some(s);
    }
    let each = out
        .into_iter()
        .map(|s| s.expect("every configuration in a group"));
    each.collect()
}

/// Walks the data trace at `path` on a second thread and simulates its
/// references on this one, within `window`; with `line`, followers for
/// I1 lines of that size are counted in the references after them
/// ([`Batches`]).
fn drive_data<W: Sent>(
    path: &Path,
    mut window: Window,
    (line, tops): (Option<u64>, Option<(u64, u64)>),
    mut sim: impl FnMut(&[W]) -> Result<()>,
) -> Result<u64> {
    let (tx, rx) = mpsc::sync_channel::<Vec<W>>(4);
    let (back_tx, back) = mpsc::channel::<Vec<W>>();
    // `move`: an early return drops `rx`, which stops the walk at its next
    // batch before the scope joins it.
    std::thread::scope(move |scope| {
        let walk = scope.spawn(move || {
            let mut b = Batches {
                tx,
                back,
                out: Out {
                    batch: Vec::with_capacity(DATA_BATCH),
                    weight: 0,
                    pending: 0,
                    grouped: 0,
                    shadow: false,
                },
                stopped: false,
                followers: line.map(|line| Followers::new(&[], line)),
                templates: Vec::new(),
                segs: Vec::new(),
                tops: tops.map(Tops::new),
            };
            let opts = aetrace_regen::Options::default();
            let r = super::dataout::walk(path, &opts, &mut b).and_then(|_| b.finish());
            match r {
                Err(_) if b.stopped => Ok(b.out.grouped),
                r => r.map(|()| b.out.grouped).map_err(|e| e.to_string()),
            }
        });
        for batch in rx.iter() {
            if !window.feed(&batch, &mut sim)? {
                break;
            }
            let _ = back_tx.send(batch);
        }
        drop(rx);
        let walked = walk.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        let grouped = walked.map_err(|e| Error::Producer(e.into()))?;
        Ok(window.finish() + grouped)
    })
}

/// Whether `input` is an aetrace trace (by its magic; `-informat` says
/// otherwise).
fn is_trace(cli: &Cli) -> Option<&Path> {
    let Input::File(p) = &cli.input else {
        return None;
    };
    let mut magic = [0u8; 8];
    let read = std::fs::File::open(p).and_then(|mut f| f.read_exact(&mut magic));
    (cli.informat.is_none() && read.is_ok() && magic == aetrace_format::header::MAGIC)
        .then_some(p.as_path())
}

/// A trace's executed blocks fed to a simulator of instruction fetches,
/// within `-skipcount` and `-maxcount`.
struct Blocks<'m> {
    modules: &'m [Module],
    /// The leaders of every block, then of each segment seen, for the
    /// simulator's line sizes.
    lines: BlockLines,
    /// Per module: the number of its first block in `lines`.
    base: Vec<usize>,
    /// Per segment number, module after module (from `seg_base`): its
    /// entry in `lines` ([`Blocks::NEW`]: not seen yet). One flat table,
    /// one load per segment record.
    segments: Vec<u32>,
    /// Per module: where its segment numbers start in `segments`.
    seg_base: Vec<usize>,
    /// Per module: its instructions simulated.
    fetched: Vec<u64>,
    skip: u64,
    left: u64,
}

/// Block `b` of module `m` as the simulator sees it.
fn code_block(m: &Module, b: BlockIx) -> CodeBlock<'_> {
    CodeBlock {
        addr: m.load_base.wrapping_add(m.blocks[b].start),
        lens: m.insn_lens(b),
    }
}

impl<'m> Blocks<'m> {
    const NEW: u32 = u32::MAX;

    fn new(modules: &'m [Module], mut table: BlockLines, cli: &Cli) -> Self {
        let (mut base, mut n) = (Vec::with_capacity(modules.len()), 0);
        let mut seg_base = vec![0];
        for m in modules {
            base.push(n);
            n += m.blocks.len();
            seg_base.push(seg_base.last().map_or(0, |&n| n) + Segment::numbers(m));
            for b in m.blocks.keys() {
                table.push([code_block(m, b)]);
            }
        }
        Blocks {
            modules,
            lines: table,
            base,
            segments: vec![Blocks::NEW; seg_base.last().map_or(0, |&n| n)],
            seg_base,
            fetched: vec![0; modules.len()],
            skip: cli.skipcount,
            left: cli.maxcount.unwrap_or(u64::MAX),
        }
    }

    /// Simulates segment `s` by its leaders, computed on first sight
    /// (segments come only without a window). Inlined into the loop over
    /// records: out of line, its prologue was a fifth of its cost.
    #[inline(always)]
    fn segment(&mut self, s: Segment, sim: &mut impl InsnFetch) -> Result<()> {
        let mi = s.module as usize;
        let at = self.seg_base[mi] + s.number as usize;
        let mut id = self.segments[at];
        if id == Blocks::NEW {
            id = self.add_segment(s, at);
        }
        let id = id as usize;
        self.fetched[mi] += u64::from(self.lines.ninsns(id));
        sim.entry(&self.lines, id)
    }

    #[inline(never)]
    fn add_segment(&mut self, s: Segment, at: usize) -> u32 {
        let m = &self.modules[s.module as usize];
        let code = s.blocks(m).into_iter().map(|b| code_block(m, b));
        let id = self.lines.push(code) as u32;
        self.segments[at] = id;
        id
    }

    /// Simulates run `r`, or its part inside the window; false once the
    /// window is full. A whole block inside the window goes by its leaders.
    /// `WINDOW`: `-skipcount` or `-maxcount` given (without, nothing is
    /// checked against the window, nor `left` changed).
    #[inline]
    fn run<const WINDOW: bool>(&mut self, r: BlockRun, sim: &mut impl InsnFetch) -> Result<bool> {
        let mi = r.module as usize;
        let id = self.base[mi] + r.block.as_u32() as usize;
        let n = u64::from(r.end - r.first);
        let inside = !WINDOW || (self.skip == 0 && self.left > n);
        if inside && r.first == 0 && r.end == self.lines.ninsns(id) {
            if WINDOW {
                self.left -= n;
            }
            self.fetched[mi] += n;
            sim.entry(&self.lines, id)?;
            return Ok(true);
        }
        self.part(r, sim)
    }

    /// [`Blocks::run`] of a part of a block, or of a block the window
    /// cuts: instruction by instruction. Out of line, so that the loop
    /// over whole blocks and segments keeps its state in registers.
    #[inline(never)]
    fn part(&mut self, r: BlockRun, sim: &mut impl InsnFetch) -> Result<bool> {
        let mi = r.module as usize;
        let n = u64::from(r.end - r.first);
        let skipped = self.skip.min(n);
        self.skip -= skipped;
        let take = self.left.min(n - skipped);
        self.left -= take;
        self.fetched[mi] += take;
        let m = &self.modules[mi];
        let first = (u64::from(r.first) + skipped) as usize;
        let lens = m.insn_lens(r.block);
        let before: u64 = lens[..first].iter().map(|&l| u64::from(l)).sum();
        let mut addr = m.load_base.wrapping_add(m.blocks[r.block].start) + before;
        for &len in &lens[first..first + take as usize] {
            sim.fetch(Ref {
                kind: AccessKind::Instr,
                addr,
                size: u32::from(len),
            })?;
            addr += u64::from(len);
        }
        Ok(self.left > 0)
    }
}

/// What a simulated trace gives besides the simulator's state.
struct Simulated {
    /// References simulated.
    refs: u64,
    /// Per traced module: its path and instruction fetches simulated.
    modules: Vec<(String, u64)>,
    /// The regeneration stopped with this error after `refs` references
    /// (the report of what ran comes first, as from a pipe).
    error: Option<Error>,
}

/// Regenerates the trace at `path` on one thread and simulates its blocks
/// with `sims`, each group (several with `--configs`: [`groups`]) on a
/// thread of its own, every batch of blocks shared by all. With `segments` (and no window), each summarised segment's
/// blocks at once.
fn drive_trace<S: InsnFetch + Send>(
    cli: &Cli,
    path: &Path,
    sims: &mut [S],
    segments: bool,
) -> Result<Simulated> {
    let trace = aetrace_format::TraceFile::open(path)?;
    let producer = |e: aetrace_regen::Error| Error::Producer(Box::new(e));
    let opts = aetrace_regen::Options::default();
    let visit = if segments && cli.skipcount == 0 && cli.maxcount.is_none() {
        Visit::with_segments(&trace, &opts)
    } else {
        Visit::new(&trace, &opts)
    }
    .map_err(producer)?;
    let (regen, fed) = shared_batches(cli, &visit, sims);
    let blocks = fed?;
    if blocks.skip > 0 {
        eprintln!("cachesim: warning: input ended before -skipcount was satisfied");
    }
    Ok(Simulated {
        refs: blocks.fetched.iter().sum(),
        modules: (visit.modules().iter().map(|m| m.name.clone()))
            .zip(blocks.fetched.iter().copied())
            .collect(),
        error: regen.err().map(producer),
    })
}

/// How the regeneration ended, and the blocks one group of simulators
/// took (every group takes the same ones).
type Fed<'m> = (
    std::result::Result<(), aetrace_regen::Error>,
    Result<Blocks<'m>>,
);

/// The regeneration on one thread and each group of `sims` on another,
/// all groups reading the same batches. A batch comes back for reuse
/// from the last group to let it go.
fn shared_batches<'m, S: InsnFetch + Send, B: AsRef<[u8]> + Sync>(
    cli: &Cli,
    visit: &'m Visit<'_, B>,
    sims: &mut [S],
) -> Fed<'m> {
    use std::sync::Arc;
    let (txs, rxs): (Vec<_>, Vec<_>) = sims
        .iter()
        .map(|_| mpsc::sync_channel::<Arc<Runs>>(4))
        .unzip();
    let (back_tx, back_rx) = mpsc::channel::<Arc<Runs>>();
    std::thread::scope(|scope| {
        let regen = scope.spawn(move || {
            visit.run(&mut |runs| {
                let spare = back_rx.try_iter().find_map(|b| Arc::try_unwrap(b).ok());
                let batch = Arc::new(std::mem::replace(runs, spare.unwrap_or_default()));
                // A group that stopped (window full, or an error) stops it.
                txs.iter().all(|tx| tx.send(Arc::clone(&batch)).is_ok())
            })
        });
        let groups: Vec<_> = (sims.iter_mut().zip(rxs))
            .map(|(sim, rx)| {
                let back = back_tx.clone();
                scope.spawn(move || -> Result<Blocks<'m>> {
                    let mut blocks = Blocks::new(visit.modules(), BlockLines::for_sim(sim), cli);
                    let window = cli.skipcount > 0 || cli.maxcount.is_some();
                    for batch in rx.iter() {
                        let go = if window {
                            feed::<true>(&mut blocks, &batch, sim)?
                        } else {
                            feed::<false>(&mut blocks, &batch, sim)?
                        };
                        if !go {
                            break;
                        }
                        let _ = back.send(batch);
                    }
                    Ok(blocks)
                })
            })
            .collect();
        let mut fed = groups
            .into_iter()
            .map(|g| g.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        let first = fed.next().expect("one group or more");
        let fed = fed.fold(first, |a, b| a.and_then(|a| b.map(|_| a)));
        let regen = regen
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (regen, fed)
    })
}

/// Simulates `batch`'s blocks with `sim`; false once the window is full
/// (`WINDOW`: there is one, [`Blocks::run`]).
#[inline]
fn feed<const WINDOW: bool>(
    blocks: &mut Blocks<'_>,
    batch: &Runs,
    sim: &mut impl InsnFetch,
) -> Result<bool> {
    for step in batch.steps() {
        match step {
            Step::Segment(s) => blocks.segment(s, sim)?,
            Step::Event(Event::Run(r)) => {
                if !blocks.run::<WINDOW>(r, sim)? {
                    return Ok(false);
                }
            }
            // Instructions only: a handler's blocks are blocks.
            Step::Event(
                Event::Thread(_)
                | Event::Signal { .. }
                | Event::SigReturn { .. }
                | Event::Pause { .. },
            ) => {}
        }
    }
    Ok(true)
}

/// The one-pass sweep as a simulator of instruction fetches, fetch by
/// fetch (lines of one byte make every instruction a leader).
struct SweepFetch<'a>(&'a mut Sweep);

impl InsnFetch for SweepFetch<'_> {
    fn fetch_line(&self) -> u64 {
        1
    }
    fn fetch(&mut self, r: Ref) -> Result<()> {
        self.0.run(std::slice::from_ref(&r));
        Ok(())
    }
    fn repeat(&mut self, _: u64) {
        unreachable!("one-byte lines make every instruction a leader")
    }
    fn repeat_straddles(&mut self, _: u64) {
        unreachable!("the sweep is not strippable: no filter stands before it")
    }
}

/// `--modules`: the per-module table after the report, or a key of its JSON.
fn modules_report(json: bool, modules: &[(String, u64)]) -> (serde_json::Value, String) {
    let v = modules
        .iter()
        .map(|(m, n)| serde_json::json!({"module": m, "instructions": n}))
        .collect();
    let mut t = String::from("---Instruction fetches per traced module\n");
    for (m, n) in modules {
        t += &format!("{n:>16}  {m}\n");
    }
    (
        serde_json::Value::Array(v),
        if json { String::new() } else { t },
    )
}

/// Writes a report as pretty JSON or as text, each built only if wanted.
fn emit(
    out: &mut dyn Write,
    json: bool,
    value: impl FnOnce() -> serde_json::Value,
    text: impl FnOnce() -> String,
) -> Result<()> {
    if json {
        let v = serde_json::to_string_pretty(&value()).expect("JSON of plain data");
        writeln!(out, "{v}")?;
    } else {
        out.write_all(text().as_bytes())?;
    }
    Ok(())
}

/// The references of the input simulated by `sim`: a trace in this
/// process (with `segments`, a segment's blocks at once), anything else
/// read by `pipe`.
fn simulate<S: InsnFetch + Send>(
    cli: &Cli,
    sims: &mut [S],
    segments: bool,
    pipe: impl FnOnce(&mut [S]) -> Result<u64>,
) -> Result<Simulated> {
    let data = match is_trace(cli) {
        Some(path) => {
            super::dataout::has_data(path).map_err(|e| Error::Producer(e.to_string().into()))?
        }
        None => false,
    };
    match is_trace(cli) {
        Some(path) if !data => drive_trace(cli, path, sims, segments),
        _ if cli.modules => Err(Error::Usage(
            "--modules needs an aetrace trace recorded without --data as input".into(),
        )),
        _ => Ok(Simulated {
            refs: pipe(sims)?,
            modules: Vec::new(),
            error: None,
        }),
    }
}

/// Writes the report of `s` (with `--modules`, its table too), then
/// returns the regeneration's error if it stopped early.
fn write_report(
    out: &mut dyn Write,
    cli: &Cli,
    s: Simulated,
    value: impl FnOnce() -> serde_json::Value,
    text: impl FnOnce() -> String,
) -> Result<()> {
    let extra = cli.modules.then(|| modules_report(cli.json, &s.modules));
    emit(
        out,
        cli.json,
        || {
            let mut v = value();
            if let Some((m, _)) = &extra {
                v["modules"] = m.clone();
            }
            v
        },
        || text() + extra.as_ref().map_or("", |e| &e.1),
    )?;
    s.error.map_or(Ok(()), Err)
}

/// One cache configuration to simulate; `options` is its line of
/// `--configs` (none for the command line's options).
struct Configuration {
    options: Option<String>,
    caches: Vec<CacheConfig>,
}

/// The command line's cache options, or each line of `--configs FILE`.
fn configurations(cli: &Cli) -> Result<Vec<Configuration>> {
    let Some(path) = &cli.configs else {
        return Ok(vec![Configuration {
            options: None,
            caches: cli.caches.build()?,
        }]);
    };
    if !cli.caches.is_empty() {
        return Err(Error::Usage(
            "--configs replaces the -lN-T cache options".into(),
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|source| Error::File {
        path: path.display().to_string(),
        source,
    })?;
    let mut configs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let options = line.split('#').next().unwrap_or_default().trim();
        if options.is_empty() {
            continue;
        }
        let at = |e: Error| Error::Usage(format!("{}:{}: {e}", path.display(), n + 1));
        let words: Vec<&str> = options.split_whitespace().collect();
        let mut b = HierarchyBuilder::default();
        let mut k = 0;
        while k < words.len() {
            match b.take(words[k], words.get(k + 1).copied()).map_err(at)? {
                Some(used) => k += used,
                None => {
                    let e = Error::Usage(format!("\"{}\" is not a cache option", words[k]));
                    return Err(at(e));
                }
            }
        }
        configs.push(Configuration {
            options: Some(options.to_string()),
            caches: b.build().map_err(at)?,
        });
    }
    if configs.is_empty() {
        return Err(Error::Usage(format!(
            "--configs {}: no configuration in the file",
            path.display()
        )));
    }
    Ok(configs)
}

/// The JSON report: `one(k)` for the command line's configuration, or
/// under "configurations", each with its options.
fn reports_json(
    configs: &[Configuration],
    one: impl Fn(usize) -> serde_json::Value,
) -> serde_json::Value {
    if let [Configuration { options: None, .. }] = configs {
        return one(0);
    }
    let each = configs.iter().enumerate().map(|(k, c)| {
        let mut v = one(k);
        v["options"] = c.options.clone().into();
        v
    });
    serde_json::json!({ "configurations": each.collect::<Vec<_>>() })
}

/// The text report: `one(k)`, with `--configs` each after a header line.
fn reports_text(configs: &[Configuration], one: impl Fn(usize) -> String) -> String {
    if let [Configuration { options: None, .. }] = configs {
        return one(0);
    }
    let each = configs.iter().enumerate().map(|(k, c)| {
        let options = c.options.as_deref().unwrap_or_default();
        format!("---Configuration {}: {options}\n{}", k + 1, one(k))
    });
    each.collect()
}

fn run(cli: Cli, out: &mut dyn Write) -> Result<()> {
    if let Some(range) = &cli.sweep {
        if !cli.caches.is_empty() || cli.configs.is_some() || cli.model != Model::Dinero {
            return Err(Error::Usage(
                "--sweep takes --assoc/--bsize, not -lN-T cache options or --model".into(),
            ));
        }
        let spec = SweepSpec::parse(
            range,
            cli.assoc.as_deref().unwrap_or("1,2,4,8,full"),
            cli.bsize.unwrap_or(64),
        )?;
        let bsize = spec.bsize;
        let mut sw = Sweep::new(spec);
        // No segments: one-byte lines, every instruction a leader.
        let s = simulate(&cli, &mut [SweepFetch(&mut sw)], false, |f| {
            drive(&cli, |refs| {
                f.iter_mut().for_each(|f| f.0.run(refs));
                Ok(())
            })
        })?;
        let points = sw.results();
        if let Some(path) = &cli.svg {
            aetrace_cachesim::sweep::svg(&points, bsize, path)?;
        }
        return write_report(
            out,
            &cli,
            s,
            || serde_json::json!({"model": "sweep", "block_size": bsize, "points": points}),
            || aetrace_cachesim::sweep::table(&points, bsize),
        );
    }
    if cli.assoc.is_some() || cli.svg.is_some() || cli.bsize.is_some() {
        return Err(Error::Usage(
            "--assoc, --bsize and --svg belong to --sweep".into(),
        ));
    }
    let configs = configurations(&cli)?;
    match cli.model {
        Model::Dinero => {
            let hs = (configs.iter())
                .map(|c| Hierarchy::new(c.caches.clone(), cli.seed))
                .collect();
            let (mut groups, order) = groups(&cli, hs);
            let s = simulate(&cli, &mut groups, true, |groups| {
                drive(&cli, |refs| {
                    (groups.iter_mut().flat_map(Stripped::sims_mut)).for_each(|h| h.run(refs));
                    Ok(())
                })
            })?;
            let mut hs = ungroup(groups, &order);
            hs.iter_mut().for_each(Hierarchy::finish);
            let refs = s.refs;
            write_report(
                out,
                &cli,
                s,
                || reports_json(&configs, |k| report::dinero_json(&hs[k].caches, refs)),
                || reports_text(&configs, |k| report::dinero_report(&hs[k].caches, refs)),
            )
        }
        Model::Cachegrind => {
            let cgs = (configs.iter())
                .map(|c| Cachegrind::new(&c.caches))
                .collect::<Result<Vec<_>>>()?;
            let (mut groups, order) = groups(&cli, cgs);
            // Reference numbers count from the start of the input.
            let base = cli.skipcount;
            let from_start = |e| match e {
                Error::Reference { index, message } => Error::Reference {
                    index: index + base,
                    message,
                },
                e => e,
            };
            let s = simulate(&cli, &mut groups, true, |groups| {
                let line = followers(&cli, groups);
                let tops = line.and_then(|_| i1_tops(groups));
                match is_trace(&cli) {
                    Some(path) => {
                        drive_data(path, Window::new(&cli), (line, tops), |recs: &[Rec]| {
                            simulate_sent(groups, recs, line.is_some())
                        })
                    }
                    None => drive(&cli, |refs| simulate_sent(groups, refs, false)),
                }
            })
            .map_err(from_start)?;
            let cgs = ungroup(groups, &order);
            let refs = s.refs;
            let json = |k: usize| serde_json::json!({"model": "cachegrind", "references": refs, "stats": cgs[k].stats});
            write_report(
                out,
                &cli,
                s,
                || reports_json(&configs, json),
                || reports_text(&configs, |k| cgs[k].report()),
            )
        }
    }
}

/// Simulates `refs` in every simulator of `groups`; `markers`: a
/// reference of an instruction fetch 0 bytes long is a marker of that
/// many I1 hits ([`Batches`]).
#[inline(always)]
fn simulate_sent<W: Sent>(
    groups: &mut [Stripped<Cachegrind>],
    refs: &[W],
    markers: bool,
) -> Result<()> {
    let cgs = groups.iter_mut().flat_map(Stripped::sims_mut);
    cgs.into_iter().try_for_each(|cg| {
        refs.iter().try_for_each(|r| {
            let p = r.plain();
            match p.size {
                0 if markers && p.kind == AccessKind::Instr => {
                    cg.count_i1_hits(p.addr);
                    Ok(())
                }
                _ => cg.reference_after(r.before(), p),
            }
        })
    })
}

/// Entry point of `cachesim ARGS` and `aetrace cachesim ARGS` (arguments
/// without the program name).  Exit codes: 0 ok, 1 bad input or runtime
/// error, 2 usage error.
pub fn main(args: Vec<OsString>) -> ExitCode {
    let mut strings = Vec::with_capacity(args.len());
    for a in args {
        match a.into_string() {
            Ok(s) => strings.push(s),
            Err(a) => {
                eprintln!("cachesim: argument {a:?} is not valid UTF-8\n(run \"cachesim -help\" for usage)");
                return ExitCode::from(2);
            }
        }
    }
    let cli = match parse(&strings) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cachesim: {e}\n(run \"cachesim -help\" for usage)");
            return ExitCode::from(2);
        }
    };
    if cli.help {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match run(cli, &mut out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Error::Usage(m)) => {
            eprintln!("cachesim: {m}\n(run \"cachesim -help\" for usage)");
            ExitCode::from(2)
        }
        // The reader of our output went away (`cachesim ... | head`): not an
        // error of ours, as ripgrep also treats it.
        Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            let _ = out.flush();
            eprintln!("cachesim: {e}");
            ExitCode::from(1)
        }
    }
}
