//! One thread of the gdb target: its [`Timeline`], its position on it and
//! what gdb asked of it (`crate::process` serves a process's threads
//! through `gdbstub`, which speaks the protocol).
//!
//! - Registers: only `rip` is known (the instruction at the current
//!   position); every other register is *unavailable* (`xx` in `g`
//!   replies), so gdb never shows a made-up value, but one: at a signal
//!   handler's return into the restorer (untraced code, no real register
//!   known there), `rsp` is the made-up frame address `aetrace.py` gives
//!   the frame (as it gives callers), from which the restorer's CFI
//!   unwinds it as gdb's `<signal handler called>`. Writes are refused.
//! - Memory: the read-only segments of the modules ([`Image`]).
//! - Execution: `stepi`/`reverse-stepi` move one position (a passage
//!   through untraced code that calls back, `crate::untraced`, is one
//!   too, or two: [`Passage::positions`]); `continue`,
//!   `reverse-continue` and range stepping search the timeline for the next
//!   breakpoint (software and hardware alike: nothing is written into
//!   memory) inside the stub, at regeneration speed; running off either end
//!   stops with gdb's replay-log stop ("No more reverse-execution history").
//! - Signals: where the recorded run took a signal, a position of its own
//!   before the handler's first instruction, at the interrupted
//!   instruction, stops with the signal's number (gdb's "Program received
//!   signal"), after the passage through untraced code there, if any;
//!   every step and search, both ways, meets it in time order.
//! - Watchpoints (a trace with data addresses, [`Data`]): a write, read or
//!   access of a watched range stops forwards after the instruction that
//!   made it (x86's trap-after semantics, as gdb expects of a hardware
//!   watchpoint) and backwards before it (gdb's `record full` stops there).
//!   Where a signal was delivered right after that instruction, the stop
//!   is at the delivery, and the signal's own stop there comes next
//!   forwards (natively: the watchpoint, then the signal, both at the
//!   interrupted instruction).
//! - `monitor` commands: `when`, `seek N`, `info`, `calls [N]`,
//!   `last-write ADDR [LEN]`, `materialise` ([`Stub::monitor`]).

use crate::blocks::{BlockAt, BlockIndex, Blocks};
use crate::data::{Code, Data, Ref, Values};
use crate::frames::Walking;
use crate::image::Image;
use crate::materialise;
use crate::pcmap::PcFlags;
use crate::stack::Stacks;
use crate::timeline::{Found, Hit, Signal, Timeline};
use crate::untraced::{is_untraced, Passage, RETURNED, SIGRETURN, UNTRACED};
use aetrace_analysis::addr::Gpr;
use aetrace_regen::compile::Module as Compiled;
use gdbstub::arch::{Arch, Registers};
use gdbstub::target::ext::breakpoints::WatchKind;

/// x86-64 with only `rip` available (gdb's `i386:x86-64` core and SSE
/// registers, the layout of `gdbstub_arch`'s `X86_64_SSE`).
pub enum PcOnly {}

impl Arch for PcOnly {
    type Usize = u64;
    type Registers = PcRegs;
    type RegId = gdbstub_arch::x86::reg::id::X86_64CoreRegId;
    type BreakpointKind = usize;

    fn target_description_xml() -> Option<&'static str> {
        gdbstub_arch::x86::X86_64_SSE::target_description_xml()
    }
}

/// The register file: `rip`, the rest unavailable (`rsp` and `rbp` but
/// where [`Stub::frame0_stack`] gives them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PcRegs {
    /// The current instruction's address.
    pub rip: u64,
    /// The stack pointer, where known ([`Stub::frame0_stack`]).
    pub rsp: Option<u64>,
    /// The frame pointer, where known.
    pub rbp: Option<u64>,
}

/// Bytes of the `g` packet's registers before rbp: rax, rbx, rcx, rdx,
/// rsi, rdi; rsp follows rbp.
const BEFORE_RBP: usize = 6 * 8;
const BEFORE_RSP: usize = 7 * 8;

/// Bytes of the `g` packet's registers around rip: rax..r15 before it;
/// eflags, six segments, eight x87 registers, eight x87 control words,
/// sixteen xmm registers and mxcsr after it.
const BEFORE_RIP: usize = 16 * 8;
const AFTER_RIP: usize = 4 + 6 * 4 + 8 * 10 + 8 * 4 + 16 * 16 + 4;

impl Registers for PcRegs {
    type ProgramCounter = u64;

    fn pc(&self) -> u64 {
        self.rip
    }

    fn gdb_serialize(&self, mut write_byte: impl FnMut(Option<u8>)) {
        (0..BEFORE_RBP).for_each(|_| write_byte(None));
        for r in [self.rbp, self.rsp] {
            let r = r.map(u64::to_le_bytes);
            (0..8).for_each(|i| write_byte(r.map(|b| b[i])));
        }
        (BEFORE_RSP + 8..BEFORE_RIP).for_each(|_| write_byte(None));
        self.rip
            .to_le_bytes()
            .iter()
            .for_each(|&b| write_byte(Some(b)));
        (0..AFTER_RIP).for_each(|_| write_byte(None));
    }

    fn gdb_deserialize(&mut self, _bytes: &[u8]) -> Result<(), ()> {
        // A trace cannot be changed.
        Err(())
    }
}

/// What gdb asked the target to do at the next resume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Step,
    Continue,
    ReverseStep,
    ReverseContinue,
    /// Step while the pc is in `start..end`.
    Range(u64, u64),
}

/// Why the target stopped, before translation into gdbstub's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// A step ended (one instruction, or a range left).
    Step,
    /// A software breakpoint was reached.
    SwBreak,
    /// A hardware breakpoint was reached.
    HwBreak,
    /// The first instruction was reached going backwards.
    Begin,
    /// A run forwards went past the last instruction (the position
    /// after it, in untraced code: the thread ended).
    End,
    /// A watchpoint (its kind and address) was hit.
    Watch(WatchKind, u64),
    /// A recorded signal (its Linux number) is delivered here.
    Signal(u32),
}

/// Where a thread stands at its position `pos`, in time order: in the
/// `i`th position of the passage through untraced code before instruction
/// `pos` (most have one; [`Passage::positions`]), at the delivery
/// of the `k`th signal before it (the interrupted instruction not run
/// yet, no handler entered; several may be delivered at once, each a
/// stop, as natively), or at the instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    Passage(u8),
    Signal(usize),
    Insn,
}

/// The target gdb debugs: a thread's timeline, a position on it, the
/// process image and the breakpoints.
pub struct Stub<'m> {
    timeline: Timeline<'m>,
    pos: u64,
    /// Where before or at instruction `pos`.
    at: At,
    /// The pc and return addresses past the last instruction, once asked.
    end: Option<(u64, Vec<u64>)>,
    /// Why the last run stopped (a resume may pass its signal on).
    last: Stop,
    image: Image,
    /// Breakpoint addresses: (address, hardware).
    breaks: Vec<(u64, bool)>,
    action: Action,
    /// The traced blocks.
    blocks: Blocks<'m>,
    /// Block numbers (`monitor when`).
    block_index: BlockIndex,
    modules: &'m [&'m Compiled],
    stacks: Stacks,
    /// The flags the walks riding along the timeline stop at: the
    /// procedure stack's, and the openers' where they are kept forwards
    /// ([`Riders`]).
    marks: PcFlags,
    /// The shadow regions' bytes at a position.
    shadow: Option<Shadow>,
    /// How to re-run the program (`monitor materialise`).
    plan: materialise::Plan,
    /// The thread's data references, or why there are none.
    data: Result<Data<'m>, String>,
    /// Without them, a control-only trace's outside entries' `rsp`, for
    /// the frames' addresses alone ([`crate::data::entry_values`]).
    entries: Option<Data<'m>>,
    /// What the frames' walks back from the intervals' starts found (data
    /// references).
    joins: crate::frames::Joins,
    /// The frames' openers kept forwards (outside entries' `rsp`), with
    /// the entries.
    forward: Option<crate::forward::Forward>,
    /// The frames' addresses of a control-only trace by the walk back
    /// from each stop ([`crate::Options::walk_back`]).
    pub walk_back: bool,
    /// Watched ranges: (start, length, kind).
    watches: Vec<(u64, u64, WatchKind)>,
    /// The instruction whose access made the last stop, with its
    /// references (`monitor watch-hit`).
    hit: Option<(u64, Vec<Ref>)>,
    /// A watch stop was made at the delivery the thread stands at (its
    /// access right before it): the delivery's signal stop is still due.
    due: bool,
    /// Where to say why a request was refused (gdb's remote protocol
    /// has only an error number for it).
    warn: fn(&str),
}

/// The shadow regions' bytes at a position: (position, [`SHADOW`]'s
/// bytes, [`PCS_BY_DEPTH`]'s bytes, [`OUTERMOST`]'s, [`FRAME_IDS`]'
/// and [`CALLER_RBP`]'s bytes), and frame 0's `rsp` and `rbp` where its
/// frame id is real ([`Stub::frame0_stack`]).
type Shadow = ((u64, At), Vec<u8>, Vec<u8>, [Vec<u8>; 3], Frame0);

/// Frame 0's `rsp` and `rbp`, where known.
type Frame0 = (Option<u64>, Option<u64>);

/// Calls `monitor calls` lists on each side of the current position.
const CALLS_AROUND: usize = 10;

/// Where gdb reads the procedure stack (aetrace's gdb unwinder): a
/// non-canonical address, never a program's. Layout, little-endian u64s:
/// the number of frames `n`, then per frame, innermost first, its pc and
/// its procedure's entry (0 when the pc is in no traced procedure); the
/// outermost frame is the last.
pub const SHADOW: u64 = 0xae7a_ce00_0000_0000;

/// The frames' pcs by depth from the bottom of the stack, where the CFI
/// `aetrace.py` gives a signal handler's caller ([`SIGRETURN`]) reads the
/// interrupted frame's pc (CFI has the frame's depth, from its made-up
/// frame address, not its level): the u64 at `PCS_BY_DEPTH + 8 * d` is the
/// pc of the frame `d` frames from the bottom (the outermost is 1).
pub const PCS_BY_DEPTH: u64 = SHADOW + (1 << 32);

/// Per frame, innermost first, whether its CFI at its pc (a caller's: the
/// call's) leaves the return address undefined ([`crate::cfi::outermost`]:
/// glibc's `_start`): the u64 at `OUTERMOST + 8 * level` is 1 if so.
/// `aetrace.py` leaves such a caller frame to gdb's DWARF unwinder, which
/// ends the backtrace there, as natively.
pub const OUTERMOST: u64 = SHADOW + (3 << 32);

/// Per frame, innermost first, its frame id's address (its CFA): the
/// u64 at `FRAME_IDS + 8 * level`, which `aetrace.py` also gives the
/// caller as its `rsp`. Real ([`crate::frames`]) where the trace's data
/// references give every frame the unwinder builds, else made up
/// ([`frame_address`]): one made-up frame among real ones would be inner
/// to them, which gdb takes for a corrupt stack.
pub const FRAME_IDS: u64 = SHADOW + (4 << 32);

/// Per frame, innermost first, the `rbp` its unwinder gives its caller:
/// two u64s at `CALLER_RBP + 16 * level`, 1 and the value, or 0 (not
/// saved). With real frame ids, the caller's CFA less its CFI's offset
/// where that is `rbp`-based (so never a made-up value); with made-up
/// ones, 16 below the caller's frame id where its CFA is `rbp`-based.
pub const CALLER_RBP: u64 = SHADOW + (5 << 32);

/// The made-up address of the frame `depth` frames from the bottom of the
/// stack (`aetrace.py`'s `frame_address`, `STACK_TOP - 0x100 * depth`):
/// frame ids and callers' `rsp` are made up from it.
fn frame_address(depth: u64) -> u64 {
    0x7ff0_0000_0000 - 0x100 * depth
}

/// The first of the frames whose CFAs `found` (innermost first, of the
/// frames the unwinder builds) are real: those from the outermost not
/// found outwards, if the made-up ones inside them (`made_up` by level)
/// are below them, as gdb has inner frames; else `None` (all made up).
/// So a frame's id is the same seen from inside it as at its own
/// instructions (`finish` and `next` compare them): a frame not found (a
/// callee of a caller that moved `rsp` by a register) does not take its
/// callers' real ids with it.
fn real_from(found: &[Option<u64>], made_up: impl Fn(usize) -> u64) -> Option<usize> {
    let first = found.iter().rposition(Option::is_none).map_or(0, |l| l + 1);
    match (first, found.get(first)) {
        (0, _) => Some(0),
        (_, Some(&Some(c))) if made_up(first - 1) < c => Some(first),
        _ => None,
    }
}

/// The frames whose pcs are `pc` and the return addresses `rets`
/// (innermost first), each with its procedure's entry.
fn with_entries(blocks: &Blocks<'_>, pc: u64, rets: &[u64]) -> Vec<(u64, u64)> {
    let entry = |a: u64| match is_untraced(a) {
        true => UNTRACED,
        false => blocks.at(a).map_or(0, |b| b.entry),
    };
    let mut frames = vec![(pc, entry(pc))];
    // A return address's procedure is its call instruction's.
    frames.extend(rets.iter().map(|&r| (r, entry(r - 1))));
    frames
}

/// `words` as little-endian bytes.
fn words(words: impl IntoIterator<Item = u64>) -> Vec<u8> {
    words.into_iter().flat_map(u64::to_le_bytes).collect()
}

/// Where gdb looks up the CFI of frame `l` of `frames` (innermost first;
/// `l` may be past the last): a caller's at its call (the byte before its
/// return address), the frame a signal interrupted (the restorer's
/// caller) and frame 0 at their pc.
fn cfi_pc(frames: &[(u64, u64)], l: usize) -> u64 {
    let pc = frames.get(l).map_or(0, |f| f.0);
    match l.checked_sub(1).map(|b| frames[b].0) {
        Some(b) if b != SIGRETURN => pc.wrapping_sub(1),
        _ => pc,
    }
}

impl<'m> Stub<'m> {
    /// A stub at position `at` of `timeline`, over `image`; `modules` are
    /// the regenerator's (blocks and procedures for `monitor`).
    pub fn new(
        timeline: Timeline<'m>,
        image: Image,
        modules: &'m [&'m Compiled],
        at: u64,
    ) -> Stub<'m> {
        let blocks = Blocks::new(modules);
        let block_index = BlockIndex::new(&blocks);
        let stacks = Stacks::new(modules).with_passages(modules, &image);
        Stub {
            block_index,
            timeline,
            pos: at,
            at: At::Insn,
            end: None,
            last: Stop::Step,
            marks: stacks.marks().clone(),
            stacks,
            image,
            breaks: Vec::new(),
            action: Action::Continue,
            blocks,
            modules,
            shadow: None,
            plan: Err("the stub was not told how the program was run".into()),
            data: Err("watchpoints need data addresses: record with --data".into()),
            entries: None,
            joins: crate::frames::Joins::default(),
            forward: None,
            walk_back: false,
            watches: Vec::new(),
            hit: None,
            due: false,
            warn: |_| {},
        }
    }

    /// The same stub, with the thread's recorded data values (or why it
    /// has none) and where to say why a watchpoint is refused.
    pub fn with_data(mut self, values: Result<Values<'m>, String>, warn: fn(&str)) -> Self {
        self.data = values.map(Data::new);
        self.warn = warn;
        if self.data.is_ok() {
            // Its frames' openers are kept forwards too, their addresses
            // from its references.
            self.keep_forwards(false);
        }
        self
    }

    /// The same stub, with a control-only trace's outside entries'
    /// `rsp` ([`crate::data::entry_values`]).
    pub fn with_entries(mut self, values: Values<'m>) -> Self {
        self.entries = Some(Data::new(values));
        self.keep_forwards(true);
        self
    }

    /// Keeps the frames' openers forwards ([`crate::forward`]), reading
    /// the outside entries' `rsp` if `entry_rsp`.
    fn keep_forwards(&mut self, entry_rsp: bool) {
        let code = Code {
            image: &self.image,
            blocks: &self.blocks,
            modules: self.modules,
        };
        let forward = crate::forward::Forward::new(&code, entry_rsp);
        self.marks = self.stacks.marks().union(forward.marks());
        self.forward = Some(forward);
    }

    /// The timeline and the walks that ride along its first pass over
    /// the history.
    fn riders(&mut self) -> (Riders<'_, 'm>, &mut Timeline<'m>) {
        let data = match (self.data.as_mut(), self.entries.as_mut()) {
            (Ok(d), _) | (Err(_), Some(d)) => Some(d),
            _ => None,
        };
        let forward = self.forward.as_mut().zip(data);
        let code = Code {
            image: &self.image,
            blocks: &self.blocks,
            modules: self.modules,
        };
        let riders = Riders {
            stacks: &mut self.stacks,
            forward,
            code,
            marks: &self.marks,
        };
        (riders, &mut self.timeline)
    }

    /// The same stub, re-running the program by `plan` to materialise.
    pub fn with_plan(mut self, plan: materialise::Plan) -> Self {
        self.plan = plan;
        self
    }

    /// `monitor materialise`: the program re-run to the current
    /// instruction ([`materialise`]); the reply aetrace's gdb command
    /// reads, or why not.
    fn materialise(&mut self) -> String {
        let untraced = self.at != At::Insn || self.at_end();
        let recorded = match &self.plan {
            _ if untraced => {
                return "materialise: cannot materialise in untraced code or at a signal's delivery: step to a traced instruction first".into()
            }
            Ok(r) => r.clone(),
            Err(why) => return format!("materialise: cannot materialise here: {why}"),
        };
        let frames = self.frames();
        let target = materialise::Target {
            n: self.pos + 1,
            pc: frames[0].0,
            // Untraced code has no frame in the re-run's copies either
            // (gdb unwinds through libc there).
            returns: frames[1..]
                .iter()
                .map(|f| f.0)
                .filter(|&a| !is_untraced(a))
                .collect(),
        };
        match materialise::materialise(&recorded, &target) {
            Ok(m) => m.reply(target.n),
            Err(e) => format!("materialise: {e}"),
        }
    }

    /// The executable's path as the trace names it ("" if it names none).
    pub fn exe_path(&self) -> &str {
        self.image.main().map_or("", |m| m.path.as_str())
    }

    /// The current position.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The current instruction's address (in a passage through untraced
    /// code, its made-up pc).
    pub fn pc(&mut self) -> u64 {
        match self.at {
            At::Passage(i) => self.passage_before(self.pos).map_or(UNTRACED, |p| p.pc(i)),
            At::Signal(k) => self.delivery_pc(k),
            At::Insn => match self.timeline.address(self.pos) {
                Some(a) => a,
                None => self.end_state().0,
            },
        }
    }

    /// At a signal handler's return into the restorer ([`SIGRETURN`],
    /// the innermost frame): the `rsp` of the frame the handler's was,
    /// one frame address in from the restorer's, so that the restorer's
    /// CFI (a signal frame, its CFA `rsp` + 0x100, as where it is a
    /// handler's caller) gives it the frame id `finish` out of the
    /// handler expects. Elsewhere none.
    pub fn restorer_rsp(&mut self) -> Option<u64> {
        if self.pc() != SIGRETURN {
            return None;
        }
        Some(frame_address(self.frames().len() as u64 + 1))
    }

    /// Whether the position is the one after the thread's last
    /// instruction (where a run off the end stops).
    fn at_end(&mut self) -> bool {
        !self.timeline.has(self.pos)
    }

    /// The pc and return addresses after the last instruction
    /// ([`Stacks::after_end`]).
    fn end_state(&mut self) -> (u64, Vec<u64>) {
        if self.end.is_none() {
            let len = self.timeline.known_len().expect("the end was reached");
            self.end = Some(self.stacks.after_end(&mut self.timeline, len));
        }
        self.end.clone().expect("just set")
    }

    /// The signal of the last stop, which gdb may pass back when it
    /// resumes (delivering it is what the recorded run did next).
    pub(crate) fn stop_signal(&self) -> Option<u32> {
        match self.last {
            Stop::Signal(s) => Some(s),
            _ => None,
        }
    }

    /// Whether the thread stands at a recorded signal's delivery, its
    /// handler next.
    pub(crate) fn at_delivery(&self) -> bool {
        matches!(self.at, At::Signal(_))
    }

    /// Says `why` on gdb's terminal (the stub's stderr).
    pub(crate) fn warn(&self, why: &str) {
        (self.warn)(why);
    }

    /// Moves to position `n` if the thread executed that many instructions.
    pub fn seek(&mut self, n: u64) -> bool {
        let (mut riders, t) = self.riders();
        let from = riders.reached();
        let ok = t.has_visiting(n, from, |t, k| riders.reach(t, k + 1));
        if ok {
            self.pos = n;
            self.at = At::Insn;
        }
        ok
    }

    /// The passage through untraced code just before position `n`, if any.
    fn passage_before(&mut self, n: u64) -> Option<Passage> {
        let k = self.timeline.interval_of(n)?;
        let found = self.stacks.passages(&mut self.timeline, k);
        let i = found.binary_search_by_key(&n, |p| p.0).ok()?;
        Some(found[i].1)
    }

    /// Carries out the pending action and says why it stopped (an error:
    /// the data values and the instructions disagree).
    pub fn run(&mut self) -> Result<Stop, String> {
        self.hit = None;
        let stop = self.run_action()?;
        self.last = stop;
        Ok(stop)
    }

    /// [`Stub::run`]'s action, with or without watchpoints.
    fn run_action(&mut self) -> Result<Stop, String> {
        if let Some(stop) = self.due_signal() {
            return Ok(stop);
        }
        if !self.watches.is_empty() {
            // A passage makes no access, nor a delivery: a run with
            // watchpoints starts from the instruction after it (a step
            // is the plain one).
            let step = matches!(self.action, Action::Step | Action::ReverseStep);
            if self.at != At::Insn && step {
                return Ok(self.run_plain());
            }
            return self.run_watching();
        }
        Ok(self.run_plain())
    }

    /// The signal stop still due at the delivery a watch stop was made at,
    /// if the action goes forwards (natively gdb stops at the watchpoint,
    /// then at the signal, both at the interrupted instruction); the
    /// position does not change.
    fn due_signal(&mut self) -> Option<Stop> {
        let due = std::mem::take(&mut self.due);
        let backwards = matches!(self.action, Action::ReverseStep | Action::ReverseContinue);
        let At::Signal(k) = self.at else { return None };
        if !due || backwards {
            return None;
        }
        let s = self.timeline.signal_before(self.pos, k)?;
        Some(Stop::Signal(s.signo))
    }

    /// [`Stub::run`] without watchpoints: a search on addresses alone.
    fn run_plain(&mut self) -> Stop {
        let breaks = self.breaks.clone();
        match self.action {
            Action::Step => self.step_forward(),
            Action::ReverseStep => self.step_backward(),
            Action::Continue => self.search(true, Stops::at(&breaks, None)),
            Action::ReverseContinue => self.search(false, Stops::at(&breaks, None)),
            // Until the pc leaves the range or meets a breakpoint.
            Action::Range(start, end) => self.search(true, Stops::at(&breaks, Some((start, end)))),
        }
    }

    /// One step forwards: into the passage before the next instruction, if
    /// there is one, else to the delivery of a signal before it, if there
    /// is one, else to it.
    fn step_forward(&mut self) -> Stop {
        match self.at {
            At::Passage(i) => {
                let next = self
                    .passage_before(self.pos)
                    .filter(|p| i + 1 < p.positions());
                if next.is_some() {
                    self.at = At::Passage(i + 1);
                    return Stop::Step;
                }
                return self.signal_or_insn();
            }
            At::Signal(k) => {
                // The next signal delivered at once, else the handler.
                if let Some(s) = self.timeline.signal_before(self.pos, k + 1) {
                    return self.at_signal(s);
                }
                self.at = At::Insn;
                return Stop::Step;
            }
            At::Insn => {}
        }
        if self.at_end() {
            return Stop::End;
        }
        // The next position is an instruction, or the one past the last.
        self.pos += 1;
        if self.passage_before(self.pos).is_some() {
            self.at = At::Passage(0);
            return Stop::Step;
        }
        self.signal_or_insn()
    }

    /// The instruction the `k`th signal delivered before the position
    /// interrupted, if it was traced.
    fn signal_pc(&mut self, k: usize) -> Option<u64> {
        let s = self.timeline.signal_before(self.pos, k)?;
        self.timeline.interrupted(s).pc
    }

    /// The pc at the `k`th signal's delivery before the position: the
    /// instruction it interrupted, else (untraced code was interrupted)
    /// the passage's last position's.
    fn delivery_pc(&mut self, k: usize) -> u64 {
        match self.signal_pc(k) {
            Some(x) => x,
            None => self
                .passage_before(self.pos)
                .map_or(UNTRACED, |p| p.pc(u8::MAX)),
        }
    }

    /// Moves to the delivery of the signal before the position, if there
    /// is one (a stop with its number), else to the instruction.
    fn signal_or_insn(&mut self) -> Stop {
        match self.timeline.signal_before(self.pos, 0) {
            Some(s) => self.at_signal(s),
            None => {
                self.at = At::Insn;
                Stop::Step
            }
        }
    }

    /// Stops at the delivery of `s`.
    fn at_signal(&mut self, s: Signal) -> Stop {
        (self.pos, self.at) = (s.pos, At::Signal(self.timeline.rank(&s)));
        Stop::Signal(s.signo)
    }

    /// One step backwards: to the delivery of a signal before this
    /// instruction, if there is one, else into the passage before it, if
    /// there is one, else to the previous instruction. A step back to a
    /// delivery is a plain step, as in gdb's `record full`, which reports
    /// no signal backwards: reported, a signal gdb does not stop for made
    /// gdb step on, so `reverse-finish` out of a handler went one
    /// instruction past the interrupted one.
    fn step_backward(&mut self) -> Stop {
        match self.at {
            At::Passage(0) => {
                // No passage precedes position 0 (it follows an instruction).
                (self.pos, self.at) = (self.pos - 1, At::Insn);
                return Stop::Step;
            }
            At::Passage(i) => {
                self.at = At::Passage(i - 1);
                return Stop::Step;
            }
            _ => {}
        }
        let back_to = match self.at {
            At::Insn if self.pos > 0 => self.timeline.signal_last_in(self.pos - 1, self.pos),
            At::Signal(k) if k > 0 => self.timeline.signal_before(self.pos, k - 1),
            _ => None,
        };
        if let Some(s) = back_to {
            self.at_signal(s);
            return Stop::Step;
        }
        self.at = At::Insn;
        if let Some(p) = self.passage_before(self.pos) {
            self.at = At::Passage(p.positions() - 1);
            return Stop::Step;
        }
        match self.pos.checked_sub(1) {
            Some(p) => {
                self.pos = p;
                Stop::Step
            }
            None => Stop::Begin,
        }
    }

    /// Runs forwards or backwards to the nearest instruction or passage
    /// whose pc `stops` says to stop at, or to the end. Passages are only
    /// looked for when their pcs are stops (a breakpoint gdb set there,
    /// a range being stepped), so a plain run searches addresses alone.
    fn search(&mut self, forward: bool, stops: Stops<'_>) -> Stop {
        if forward && self.at == At::Insn && self.at_end() {
            return Stop::End;
        }
        if let Some(s) = self.signal_at_once(forward) {
            return self.at_signal(s);
        }
        let found = match forward {
            // From a passage or a delivery, its instruction is the next one;
            // the stack at the stop (gdb reads it) is walked along.
            true => {
                let from = self.pos - u64::from(self.at != At::Insn);
                let (mut riders, t) = self.riders();
                t.find_forward_visiting(from, stops, |t, k| riders.reach(t, k + 1))
            }
            false => self.timeline.find_backward(self.pos, stops),
        };
        let at = match found {
            Found::At(p) | Found::End(p) => p,
        };
        // A signal delivered on the way stops first, and a passage before it
        // first of all (in time order, whichever the direction).
        let signal = self.signal_on_the_way(forward, at);
        let passage = match forward {
            true => {
                let to = signal.map_or(at, |s| s.pos);
                self.passage_between(self.pos, to, true, &stops)
            }
            false => {
                let from = signal.map_or(at, |s| s.pos) + 1;
                self.passage_between(from, self.pos, false, &stops)
            }
        };
        if let Some((q, i)) = passage {
            (self.pos, self.at) = (q, At::Passage(i));
            return self.break_kind().unwrap_or(Stop::Step);
        }
        if let Some(s) = signal {
            return self.at_signal(s);
        }
        match (found, forward) {
            (Found::End(_), true) => self.off_the_end(stops.range.is_some()),
            _ => self.stop_at(found, Stop::Begin),
        }
    }

    /// At a signal's delivery, the next signal delivered at once with it
    /// (`forward`), or the previous one.
    fn signal_at_once(&mut self, forward: bool) -> Option<Signal> {
        let At::Signal(k) = self.at else { return None };
        let k = match forward {
            true => k + 1,
            false => k.checked_sub(1)?,
        };
        self.timeline.signal_before(self.pos, k)
    }

    /// The first signal delivered after the current point and before
    /// instruction `at` (forwards), or the last one after instruction `at`
    /// and before the current point (backwards).
    fn signal_on_the_way(&mut self, forward: bool, at: u64) -> Option<Signal> {
        match (forward, self.at) {
            (true, At::Passage(_)) => self
                .timeline
                .signal_before(self.pos, 0)
                .or_else(|| self.timeline.signal_in(self.pos, at)),
            (true, _) => self.timeline.signal_in(self.pos, at),
            (false, At::Insn) => self.timeline.signal_last_in(at, self.pos),
            (false, _) => self.timeline.signal_last_in(at, self.pos - 1),
        }
    }

    /// Moves past the last instruction, where untraced code ran next: a
    /// breakpoint there (gdb's `finish` out of a thread's start routine
    /// sets one at `<untraced>`) or the end of a range being stepped stop
    /// as such, else the run ended ([`Stop::End`]).
    fn off_the_end(&mut self, range: bool) -> Stop {
        if self.at_end() {
            return Stop::End;
        }
        self.pos = self.timeline.known_len().expect("the end was reached");
        self.at = At::Insn;
        match self.break_kind() {
            Some(b) => b,
            None if range => Stop::Step,
            None => Stop::End,
        }
    }

    /// The first (`forward`) or last position of a passage before an
    /// instruction in `from..=to`, after (`forward`) or before the current
    /// point, whose pc `stops` says to stop at: (instruction, position in
    /// the passage).
    fn passage_between(
        &mut self,
        from: u64,
        to: u64,
        forward: bool,
        stops: &Stops<'_>,
    ) -> Option<(u64, u8)> {
        let pcs = [UNTRACED, RETURNED, SIGRETURN];
        if from > to || !pcs.into_iter().any(|pc| stops.hit(pc)) {
            return None;
        }
        let (first, last) = (
            self.timeline.interval_of(from)?,
            self.timeline.interval_of(to)?,
        );
        let mut ks: Vec<usize> = (first..=last).collect();
        if !forward {
            ks.reverse();
        }
        // The current point: a passage's position, else after the
        // passage before the current instruction.
        let here = match self.at {
            At::Passage(i) => (self.pos, i),
            _ => (self.pos, u8::MAX),
        };
        ks.into_iter().find_map(|k| {
            let found = self.stacks.passages(&mut self.timeline, k);
            let mut hits = found
                .iter()
                .filter(|(q, _)| (from..=to).contains(q))
                .flat_map(|&(q, p)| (0..p.positions()).map(move |i| (q, i, p.pc(i))))
                .filter(|&(q, i, pc)| {
                    let later = match forward {
                        true => (q, i) > here,
                        false => (q, i) < here,
                    };
                    later && stops.hit(pc)
                });
            match forward {
                true => hits.next(),
                false => hits.next_back(),
            }
            .map(|(q, i, _)| (q, i))
        })
    }

    /// [`Stub::run`] with watchpoints: a walk over each position's data
    /// references too. Forwards, the current instruction runs first (its
    /// accesses count, its breakpoint does not) and an access stops after
    /// its instruction; backwards, undoing an access stops before it.
    fn run_watching(&mut self) -> Result<Stop, String> {
        let from = self.pos;
        let (forward, range) = match self.action {
            Action::Step => return self.step_watching(true),
            Action::ReverseStep => return self.step_watching(false),
            Action::Continue => (true, None),
            Action::Range(start, end) => (true, Some(start..end)),
            Action::ReverseContinue => (false, None),
        };
        if let Some(s) = self.signal_at_once(forward) {
            return Ok(self.at_signal(s));
        }
        let was = std::mem::replace(&mut self.at, At::Insn);
        // From a passage or a delivery, the instruction there has not run:
        // its breakpoint stops too.
        let first = from + u64::from(was == At::Insn);
        let (breaks, watches) = (&self.breaks, &self.watches);
        let stops =
            |pc: u64| is_break(breaks, pc) || range.as_ref().is_some_and(|r| !r.contains(&pc));
        let code = Code {
            image: &self.image,
            blocks: &self.blocks,
            modules: self.modules,
        };
        let data = self.data.as_mut().map_err(|e| e.clone())?;
        let found = data.scan(
            &mut self.timeline,
            &code,
            from,
            forward,
            |p, pc, refs| match forward {
                true if p >= first && stops(pc) => Some(None),
                true => watch_hit(watches, refs).map(|w| Some((w, refs.to_vec()))),
                false => match watch_hit(watches, refs) {
                    Some(w) => Some(Some((w, refs.to_vec()))),
                    None => stops(pc).then_some(None),
                },
            },
        )?;
        // A signal delivered before the stop's instruction (its access)
        // stops first, as in a plain search.
        let at = match (found.as_ref(), forward) {
            (Some((p, _)), _) => *p,
            (None, true) => self.timeline.known_len().unwrap_or(from),
            (None, false) => 0,
        };
        self.at = was;
        if let Some(s) = self.signal_on_the_way(forward, at) {
            return Ok(self.at_signal(s));
        }
        self.at = At::Insn;
        Ok(match (found, forward) {
            (Some((p, None)), _) => self.stop_at(Found::At(p), Stop::End),
            (Some((p, Some((w, refs)))), true) => self.after_access(p, w, refs),
            (Some((p, Some((w, refs)))), false) => self.before_access(p, w, refs),
            (None, true) => self.off_the_end(range.is_some()),
            (None, false) => self.stop_at(Found::End(0), Stop::Begin),
        })
    }

    /// One step with watchpoints: forwards, the current instruction's
    /// accesses; backwards, the previous one's.
    fn step_watching(&mut self, forward: bool) -> Result<Stop, String> {
        let p = match forward {
            true => self.pos,
            false => match self.pos.checked_sub(1) {
                Some(p) => p,
                None => return Ok(Stop::Begin),
            },
        };
        let refs = self.refs_at(p)?.unwrap_or_default();
        Ok(match (watch_hit(&self.watches, &refs), forward) {
            (Some(w), true) => self.after_access(p, w, refs),
            (Some(w), false) => self.before_access(p, w, refs),
            (None, _) => self.run_plain(),
        })
    }

    /// Stops after the access of position `p` (references `refs`) to
    /// watched address `w` (past the last instruction when `p` is the
    /// last).
    fn after_access(&mut self, p: u64, w: (WatchKind, u64), refs: Vec<Ref>) -> Stop {
        (self.pos, self.at) = (p + 1, At::Insn);
        // A signal delivered right after the access (an asynchronous one:
        // a fault is delivered after its own instruction's position)
        // interrupted the next traced instruction before it ran: the stop
        // is at the delivery, whose signal stop comes next.
        if self.passage_before(p + 1).is_none() && self.signal_pc(0).is_some() {
            (self.at, self.due) = (At::Signal(0), true);
        }
        self.hit = Some((p, refs));
        Stop::Watch(w.0, w.1)
    }

    /// Stops before the access of position `p` (going backwards).
    fn before_access(&mut self, p: u64, w: (WatchKind, u64), refs: Vec<Ref>) -> Stop {
        self.pos = p;
        self.hit = Some((p, refs));
        Stop::Watch(w.0, w.1)
    }

    /// `monitor watch-hit`: the instruction whose access made the last
    /// stop, and its references (aetrace's `watch-write` reads them).
    fn watch_hit_reply(&self) -> String {
        let Some((p, refs)) = &self.hit else {
            return "the last stop was not a watchpoint's".into();
        };
        let refs: Vec<String> = refs
            .iter()
            .map(|r| format!("{} {:#x},{}", r.access.letter(), r.start, r.end - r.start))
            .collect();
        format!("instruction {p}: {}", refs.join(" "))
    }

    /// The data references of position `p` (`None` past the end).
    fn refs_at(&mut self, p: u64) -> Result<Option<Vec<Ref>>, String> {
        self.scan_data(p, true, |q, _, refs| (q == p).then(|| refs.to_vec()))
            .map(|f| f.map(|(_, refs)| refs))
    }

    /// [`Data::scan`] on this stub's timeline and code.
    fn scan_data<T>(
        &mut self,
        from: u64,
        forward: bool,
        f: impl FnMut(u64, u64, &[Ref]) -> Option<T>,
    ) -> Result<Option<(u64, T)>, String> {
        let code = Code {
            image: &self.image,
            blocks: &self.blocks,
            modules: self.modules,
        };
        let data = self.data.as_mut().map_err(|e| e.clone())?;
        data.scan(&mut self.timeline, &code, from, forward, f)
    }

    /// `monitor last-write ADDR [LEN]`: the last instruction before the
    /// current one that wrote a byte of `addr..addr + len`.
    fn last_write(&mut self, addr: u64, len: u64) -> String {
        let end = addr.saturating_add(len.max(1));
        let found = self.scan_data(self.pos, false, |_, pc, refs| {
            let r = refs.iter().find(|r| r.writes() && r.overlaps(addr, end));
            r.map(|r| (pc, *r))
        });
        match found {
            Ok(Some((p, (pc, r)))) => {
                let proc = self.block_at(pc).map_or("?", |b| b.proc);
                format!(
                    "instruction {p} at {pc:#x} in {proc} wrote {:#x},{}",
                    r.start,
                    r.end - r.start
                )
            }
            Ok(None) => format!(
                "no write to {addr:#x},{len} before instruction {}",
                self.pos
            ),
            Err(e) => format!("last-write: {e}"),
        }
    }

    /// Moves to what a search found: a breakpoint, or `end` of the timeline.
    fn stop_at(&mut self, f: Found, end: Stop) -> Stop {
        match f {
            Found::At(p) => {
                (self.pos, self.at) = (p, At::Insn);
                self.break_kind().unwrap_or(Stop::Step)
            }
            Found::End(p) => {
                (self.pos, self.at) = (p, At::Insn);
                end
            }
        }
    }

    /// The breakpoint at the current pc, if any.
    fn break_kind(&mut self) -> Option<Stop> {
        let pc = self.pc();
        let hw = self.breaks.iter().find(|b| b.0 == pc)?.1;
        Some(if hw { Stop::HwBreak } else { Stop::SwBreak })
    }

    fn block_at(&self, addr: u64) -> Option<&BlockAt<'m>> {
        self.blocks.at(addr)
    }

    /// The procedure stack now: (pc, procedure entry) per frame,
    /// innermost first (a caller's pc is its return address).
    pub fn frames(&mut self) -> Vec<(u64, u64)> {
        let pc = self.pc();
        let end = self.at == At::Insn && self.at_end();
        let rets = match self.at {
            At::Signal(k) => self.delivery_returns(k),
            _ if end => self.end_state().1,
            At::Passage(i) => self.stacks.at(&mut self.timeline, self.pos, Some(i)),
            At::Insn => self.stacks.at(&mut self.timeline, self.pos, None),
        };
        with_entries(&self.blocks, pc, &rets)
    }

    /// The return addresses at the `k`th signal's delivery before the
    /// position: the first one's interrupted frame and its callers, and
    /// for each signal delivered at once after it, the restorer and the
    /// handler it interrupted (at its first instruction), innermost first.
    fn delivery_returns(&mut self, k: usize) -> Vec<u64> {
        let mut rets = match self.signal_pc(0) {
            Some(x) => self.stacks.at_signal(&mut self.timeline, self.pos, x),
            // Untraced code was interrupted: the passage's (last) stack.
            None => self.stacks.at(&mut self.timeline, self.pos, Some(u8::MAX)),
        };
        for j in 0..k {
            let pc = self.delivery_pc(j);
            rets.splice(0..0, [SIGRETURN, pc]);
        }
        rets
    }

    /// Reads the shadow region ([`SHADOW`], [`PCS_BY_DEPTH`]): how many
    /// bytes were served.
    fn read_shadow(&mut self, addr: u64, data: &mut [u8]) -> usize {
        let s = self.shadow();
        if let Some(off) = addr.checked_sub(CALLER_RBP) {
            return xfer(&s.3[2], off, data.len(), data);
        }
        if let Some(off) = addr.checked_sub(FRAME_IDS) {
            return xfer(&s.3[1], off, data.len(), data);
        }
        if let Some(off) = addr.checked_sub(OUTERMOST) {
            return xfer(&s.3[0], off, data.len(), data);
        }
        match addr.checked_sub(PCS_BY_DEPTH) {
            Some(off) => xfer(&s.2, off, data.len(), data),
            None => xfer(&s.1, addr - SHADOW, data.len(), data),
        }
    }

    /// Frame 0's `rsp` and `rbp` where its frame id is real: its CFA less
    /// the offset of its CFI row (for the register that row computes it
    /// from). At a signal handler's return into the restorer, the made-up
    /// `rsp` of [`Stub::restorer_rsp`]. Elsewhere unavailable.
    pub fn frame0_stack(&mut self) -> Frame0 {
        match self.restorer_rsp() {
            Some(rsp) => (Some(rsp), None),
            None => self.shadow().4,
        }
    }

    /// The shadow regions at the current position, computed once there.
    fn shadow(&mut self) -> &Shadow {
        let here = (self.pos, self.at);
        if self.shadow.as_ref().map(|s| s.0) != Some(here) {
            let frames = self.frames();
            let mut bytes = (frames.len() as u64).to_le_bytes().to_vec();
            // Depth 0 is no frame's.
            let mut by_depth = vec![0; 8];
            for &(pc, entry) in &frames {
                bytes.extend(pc.to_le_bytes().into_iter().chain(entry.to_le_bytes()));
            }
            for &(pc, _) in frames.iter().rev() {
                by_depth.extend(pc.to_le_bytes());
            }
            let [based, outermost] = self.cfi_facts(&frames);
            let (ids, rbps, frame0) = self.frame_addresses(&frames, &based, &outermost);
            let rbps = rbps
                .iter()
                .flat_map(|r| [u64::from(r.is_some()), r.unwrap_or(0)]);
            let outermost = words(outermost.into_iter().map(u64::from));
            let regions = [outermost, words(ids), words(rbps)];
            self.shadow = Some((here, bytes, by_depth, regions, frame0));
        }
        self.shadow.as_ref().expect("just set")
    }

    /// Per frame of `frames` (innermost first), whether its CFA is
    /// computed from `rbp` ([`crate::cfi::cfa_from_rbp`]: the made-up
    /// `rbp` [`CALLER_RBP`] gives a caller) and whether its return address
    /// is undefined ([`OUTERMOST`]). A caller's CFI row is the one at its call (the byte before
    /// its return address), as gdb looks it up; the frame a signal
    /// interrupted (the caller of the restorer) is at its pc.
    fn cfi_facts(&self, frames: &[(u64, u64)]) -> [Vec<bool>; 2] {
        let mut facts = [Vec::new(), Vec::new()];
        for l in 0..frames.len() {
            let at = cfi_pc(frames, l);
            facts[0].push(crate::cfi::cfa_from_rbp(&self.image, at));
            facts[1].push(crate::cfi::outermost(&self.image, at));
        }
        facts
    }

    /// [`FRAME_IDS`]' and [`CALLER_RBP`]'s values for `frames` (innermost
    /// first), whose CFAs are `rbp`-based and outermost as `based` and
    /// `outermost` say, and frame 0's `rsp` and `rbp` where they are real.
    fn frame_addresses(
        &mut self,
        frames: &[(u64, u64)],
        based: &[bool],
        outermost: &[bool],
    ) -> (Vec<u64>, Vec<Option<u64>>, Frame0) {
        let n = frames.len();
        // The frames the unwinder builds: up to the first whose own CFI
        // ends the backtrace, or the untraced code that started the thread.
        let last_untraced = frames.last().is_some_and(|f| f.1 == UNTRACED);
        let needed = (1..n)
            .find(|&l| outermost[l])
            .unwrap_or(n - usize::from(last_untraced));
        let made_up = |l: usize| frame_address((n - l) as u64);
        let found = self.real_cfas(frames, needed);
        let real = found.as_deref().and_then(|f| real_from(f, made_up));
        let real = real.unwrap_or(n);
        // Made up: the frames inside the real ones, or all.
        let made = |l: usize| l < real || real == n;
        let ids: Vec<u64> = (0..n)
            .map(|l| match found.as_deref().and_then(|f| f.get(l)) {
                Some(&Some(c)) if !made(l) => c,
                _ => made_up(l),
            })
            .collect();
        let rule = |l: usize| crate::cfi::cfa_rule(&self.image, cfi_pc(frames, l));
        let below = |l: usize, reg: Gpr| match rule(l) {
            Some((r, off)) if r == reg && l < needed => Some(ids[l].wrapping_sub(off as u64)),
            _ => None,
        };
        // A made-up caller's made-up `rbp`, 16 below its id.
        let rbp = |l: usize| match made(l) {
            true => (l == n || based[l]).then(|| made_up(l) - 16),
            false => below(l, Gpr::RBP),
        };
        let rbps = (0..n).map(|l| rbp(l + 1)).collect();
        let frame0 = match made(0) {
            false => (below(0, Gpr::RSP), below(0, Gpr::RBP)),
            true => (None, None),
        };
        (ids, rbps, frame0)
    }

    /// The real CFAs of `frames[..needed]` ([`crate::frames`]), where the
    /// thread has data references or its outside entries' `rsp` and
    /// stands at a traced instruction or in a passage through untraced
    /// code (a callback's caller frame has the same id there as seen from
    /// the callback: `finish` out of it stops there), with no signal
    /// handler's frame (whose caller's CFI `aetrace.py` makes from made-up
    /// frame addresses).
    fn real_cfas(&mut self, frames: &[(u64, u64)], needed: usize) -> Option<Vec<Option<u64>>> {
        let end = self.at_end();
        let passage = match self.at {
            At::Insn if !end => false,
            At::Passage(_) => true,
            _ => return None,
        };
        if frames.iter().any(|f| f.0 == SIGRETURN) {
            return None;
        }
        let at = crate::frames::Stand {
            pos: self.pos,
            passage,
        };
        let code = Code {
            image: &self.image,
            blocks: &self.blocks,
            modules: self.modules,
        };
        let t = &mut self.timeline;
        let (stacks, blocks, joins) = (&mut self.stacks, &self.blocks, &mut self.joins);
        let found = match (self.data.as_mut(), self.entries.as_mut()) {
            (Ok(data), _) => {
                // The frames at an interval's start, for its walk back.
                let mut frames_at = |t: &mut Timeline<'_>, pos: u64| {
                    let pc = t.address(pos).unwrap_or(0);
                    with_entries(blocks, pc, &stacks.at(t, pos, None))
                };
                let cx = &mut Walking {
                    data,
                    t,
                    code: &code,
                };
                // The openers kept forwards, where they tell; else (and
                // as their reference twin) the walk back.
                let forward = match (self.walk_back, self.forward.as_mut()) {
                    (false, Some(f)) => f.data_cfas(cx, at, frames, needed).ok().flatten(),
                    _ => None,
                };
                match forward {
                    Some(cfas) => Ok(cfas),
                    None => crate::frames::cfas(cx, joins, &mut frames_at, at, frames, needed),
                }
            }
            (Err(_), Some(data)) => {
                let cx = &mut Walking {
                    data,
                    t,
                    code: &code,
                };
                match (self.walk_back, self.forward.as_mut()) {
                    (false, Some(forward)) => forward.cfas(cx, at, frames, needed),
                    _ => crate::frames::cfas_by_entries(cx, at, frames, needed),
                }
            }
            (Err(_), None) => return None,
        };
        found.ok()
    }

    /// Answers `monitor CMD`: one or more lines of text.
    pub fn monitor(&mut self, cmd: &str) -> String {
        let words: Vec<&str> = cmd.split_whitespace().collect();
        match words[..] {
            ["when"] => {
                let end = self.at_end();
                let at = self.pos - u64::from(end);
                let n = self.block_index.number(&mut self.timeline, at);
                let block = n.unwrap_or(0).saturating_sub(1);
                let passage = match (self.at, end) {
                    (At::Passage(_), _) => " (in untraced code before it)",
                    (At::Signal(_), _) => " (at a signal's delivery before it)",
                    (_, true) => " (past the thread's last instruction)",
                    _ => "",
                };
                format!("instruction {} block {block}{passage}", self.pos)
            }
            ["seek", n] => match n.parse::<u64>() {
                Ok(n) if self.seek(n) => format!(
                    "at instruction {n} ({:#x}); run `maintenance flush register-cache` (aetrace's `seek` command does)",
                    self.pc()
                ),
                Ok(n) => format!("no instruction {n}: the thread executed fewer"),
                Err(_) => format!("seek: {n:?} is not an instruction number"),
            },
            ["info"] => self.info(),
            ["calls"] => self.calls(CALLS_AROUND),
            ["calls", n] => match n.parse::<usize>() {
                Ok(n) => self.calls(n),
                Err(_) => format!("calls: {n:?} is not a number of calls"),
            },
            ["materialise"] => self.materialise(),
            ["watch-hit"] => self.watch_hit_reply(),
            ["last-write", a] => self.last_write_cmd(a, "1"),
            ["last-write", a, n] => self.last_write_cmd(a, n),
            _ => "commands: when, seek N, info, calls [N], last-write ADDR [LEN], watch-hit, materialise"
                .into(),
        }
    }

    /// `monitor last-write` with its words parsed.
    fn last_write_cmd(&mut self, addr: &str, len: &str) -> String {
        match (number(addr), number(len)) {
            (Some(a), Some(n)) => self.last_write(a, n),
            _ => {
                format!("last-write: {addr:?} {len:?}: an address and a length, decimal or 0x hex")
            }
        }
    }

    /// `monitor calls N`: the last `n` entries into traced procedures
    /// before the current position and the next `n` from it, one line
    /// each (position, procedure; `=>` marks the first at or after the
    /// current position).
    fn calls(&mut self, n: usize) -> String {
        let entries: std::collections::HashMap<u64, &str> =
            self.blocks.iter().map(|b| (b.entry, b.proc)).collect();
        let is_entry = |a: u64| entries.contains_key(&a);
        let mut all = self.timeline.find_many(self.pos, n, false, is_entry);
        all.reverse();
        let here = all.len();
        if is_entry(self.pc()) {
            all.push(self.pos);
        }
        let rest = n.saturating_sub(all.len() - here);
        all.extend(self.timeline.find_many(self.pos, rest, true, is_entry));
        if all.is_empty() {
            return "no call into a traced procedure".into();
        }
        let mut lines = Vec::new();
        for (i, q) in all.into_iter().enumerate() {
            let name = self.timeline.address(q).map_or("?", |a| entries[&a]);
            let mark = if i == here { "=>" } else { "  " };
            lines.push(format!("{mark} instruction {q}: {name}"));
        }
        lines.join("\n")
    }

    /// `monitor info`: where the current instruction is.
    fn info(&mut self) -> String {
        let pc = self.pc();
        match self.at {
            At::Passage(_) => return format!("in untraced code before instruction {}", self.pos),
            At::Signal(_) => {
                return format!(
                    "at a signal's delivery before instruction {} (its handler's first)",
                    self.pos
                )
            }
            At::Insn => {}
        }
        if self.at_end() {
            return format!(
                "past the thread's last instruction ({} instructions): in untraced code",
                self.pos
            );
        }
        let module = self
            .image
            .module_at(pc)
            .map_or("?".to_owned(), |m| m.path.clone());
        match self.block_at(pc) {
            Some(b) => format!(
                "instruction {} at {pc:#x}: module {} procedure {} block {:#x}",
                self.pos, self.modules[b.module].name, b.proc, b.start
            ),
            None => format!(
                "instruction {} at {pc:#x}: module {module}, in no traced block",
                self.pos
            ),
        }
    }

    /// The error that ended the timeline early, if any.
    pub fn timeline_error(&self) -> Option<String> {
        self.timeline.error().map(|e| e.to_string())
    }
}

/// `s` as a number: `0x` hex, else decimal.
fn number(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The first watchpoint (kind, address) that `refs` trigger.
fn watch_hit(watches: &[(u64, u64, WatchKind)], refs: &[Ref]) -> Option<(WatchKind, u64)> {
    let hits = |&(a, len, kind): &(u64, u64, WatchKind)| {
        refs.iter().any(|r| {
            r.overlaps(a, a.saturating_add(len))
                && match kind {
                    WatchKind::Write => r.writes(),
                    WatchKind::Read => r.reads(),
                    WatchKind::ReadWrite => true,
                }
        })
    };
    watches
        .iter()
        .find(|w| hits(w))
        .map(|&(a, _, kind)| (kind, a))
}

/// Whether `a` is a breakpoint's address.
fn is_break(breaks: &[(u64, bool)], a: u64) -> bool {
    breaks.iter().any(|b| b.0 == a)
}

/// Where a run stops: at a breakpoint, or outside a range being stepped.
/// A search over many addresses compares a chunk with one breakpoint at
/// a time, which vectorises (`bench/run debug`).
#[derive(Clone, Copy)]
struct Stops<'a> {
    breaks: &'a [(u64, bool)],
    range: Option<(u64, u64)>,
}

impl<'a> Stops<'a> {
    /// At `breaks`, and outside `range` when stepping one.
    fn at(breaks: &'a [(u64, bool)], range: Option<(u64, u64)>) -> Self {
        Stops { breaks, range }
    }
}

impl Hit for Stops<'_> {
    fn hit(&self, a: u64) -> bool {
        let out = self.range.is_some_and(|(s, e)| a < s || a >= e);
        out || is_break(self.breaks, a)
    }

    fn any(&self, c: &[u64]) -> bool {
        let out = |(s, e)| c.iter().fold(false, |o, &a| o | (a < s) | (a >= e));
        let one = |b: u64| c.iter().fold(false, |o, &a| o | (a == b));
        self.range.is_some_and(out) || self.breaks.iter().any(|b| one(b.0))
    }
}

/// Copies `data[offset..offset + length]` into `buf` (qXfer objects).
pub(crate) fn xfer(data: &[u8], offset: u64, length: usize, buf: &mut [u8]) -> usize {
    let from = (offset as usize).min(data.len());
    let n = length.min(buf.len()).min(data.len() - from);
    buf[..n].copy_from_slice(&data[from..from + n]);
    n
}

impl<'m> Stub<'m> {
    /// Sets what the next [`Stub::run`] does.
    pub(crate) fn set_action(&mut self, action: Action) {
        self.action = action;
    }

    /// The process image gdb reads.
    pub(crate) fn image(&self) -> &Image {
        &self.image
    }

    /// Reads memory: the shadow region or the image; how many bytes.
    pub(crate) fn read_memory(&mut self, start: u64, data: &mut [u8]) -> usize {
        match start.checked_sub(SHADOW) {
            Some(_) => self.read_shadow(start, data),
            None => self.image.read(start, data),
        }
    }

    /// Adds a breakpoint (hardware or software) at `addr`.
    pub(crate) fn add_break(&mut self, addr: u64, hw: bool) {
        if !self.breaks.contains(&(addr, hw)) {
            self.breaks.push((addr, hw));
        }
    }

    /// Removes a breakpoint: whether there was one.
    pub(crate) fn remove_break(&mut self, addr: u64, hw: bool) -> bool {
        let before = self.breaks.len();
        self.breaks.retain(|&b| b != (addr, hw));
        self.breaks.len() < before
    }

    /// Adds a watchpoint: refused (saying why) without data addresses.
    pub(crate) fn add_watch(&mut self, addr: u64, len: u64, kind: WatchKind) -> bool {
        if let Err(why) = &self.data {
            self.warn(why);
            return false;
        }
        if !self.watches.contains(&(addr, len, kind)) {
            self.watches.push((addr, len, kind));
        }
        true
    }

    /// Removes a watchpoint: whether there was one.
    pub(crate) fn remove_watch(&mut self, addr: u64, len: u64, kind: WatchKind) -> bool {
        let before = self.watches.len();
        self.watches.retain(|&w| w != (addr, len, kind));
        self.watches.len() < before
    }
}

/// The walks kept per interval that ride along the timeline's first pass
/// over the history (issue 22: a session's first stop and `continue`
/// regenerate it once): the procedure stack's and, without data, the
/// frames' openers'.
struct Riders<'s, 'm> {
    stacks: &'s mut Stacks,
    forward: Option<(&'s mut crate::forward::Forward, &'s mut Data<'m>)>,
    code: Code<'s, 'm>,
    /// Both walks' flags ([`Stub::marks`]).
    marks: &'s PcFlags,
}

impl Riders<'_, '_> {
    /// The intervals whose starts' states all riders know:
    /// `0..=reached()`.
    fn reached(&self) -> usize {
        let f = self.forward.as_ref().map_or(usize::MAX, |f| f.0.reached());
        self.stacks.reached().min(f)
    }

    /// Each rider's states up to interval `k`'s start: each interval is
    /// scanned once for the positions either walk may stop at (the scan
    /// was most of both walks' time, 2026-12-02).
    fn reach(&mut self, t: &mut Timeline<'_>, k: usize) {
        let mut flagged = Vec::new();
        for j in self.reached()..k {
            let stacks = self.stacks.reached() == j;
            // An error stops the openers' pass: the stop that needs them
            // is given it.
            let forward = (self.forward.as_mut()).filter(|f| f.0.reached() == j && !f.0.broken());
            if !stacks && forward.is_none() {
                continue;
            }
            let (_, addrs) = t.interval(j);
            self.marks.flagged(addrs, &mut flagged);
            if let Some((forward, data)) = forward {
                let cx = &mut Walking {
                    data,
                    t,
                    code: &self.code,
                };
                forward.reach_next(cx, &flagged);
            }
            if stacks {
                self.stacks.reach_next(t, &flagged);
            }
        }
    }
}
