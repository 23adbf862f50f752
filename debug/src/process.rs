//! The gdb target: every thread of one program image of the trace (a
//! process and its fork children, `crate::process_threads`), each a
//! [`Stub`] over its own regenerated stream (`gdbstub`'s multi-thread
//! target: gdb sees one process; docs/debug.md, "Threads").
//!
//! Invariants: threads are replayed independently (the trace orders each
//! thread's instructions, not the threads among themselves), so each keeps
//! its own position; only one thread moves per resume, as under gdb's `set
//! scheduler-locking on` (which aetrace's gdb script sets): the one gdb
//! names (`vCont` with a thread, `Hc` before a reverse command), else the
//! current thread (the last one whose registers or memory gdb read,
//! stepped, or was told stopped). gdb's thread ids are 1, 2, ... in the
//! trace's thread order; breakpoints and watchpoints are every thread's.

use crate::hc::Noted;
use crate::image::Image;
use crate::stub::{xfer, Action, PcOnly, PcRegs, Stop, Stub};
use gdbstub::common::{Pid, Signal, Tid};
use gdbstub::stub::MultiThreadStopReason;
use gdbstub::target::ext::base::multithread::{
    MultiThreadBase, MultiThreadRangeStepping, MultiThreadResume, MultiThreadSchedulerLocking,
    MultiThreadSingleStep,
};
use gdbstub::target::ext::base::reverse_exec::{ReplayLogPosition, ReverseCont, ReverseStep};
use gdbstub::target::ext::breakpoints::{
    Breakpoints, HwBreakpoint, HwWatchpoint, SwBreakpoint, WatchKind,
};
use gdbstub::target::ext::extended_mode::{Args, AttachKind, ExtendedMode, ShouldTerminate};
use gdbstub::target::ext::monitor_cmd::{outputln, ConsoleOutput, MonitorCmd};
use gdbstub::target::ext::thread_extra_info::ThreadExtraInfo;
use gdbstub::target::{Target, TargetError, TargetResult};

/// One thread: its ids and its stub.
pub struct Thread<'m> {
    /// The trace's thread id.
    pub thread: u32,
    /// The OS process id it had (a fork child's differs).
    pub pid: u32,
    /// The OS thread id it had.
    pub os_tid: u32,
    /// Its replay.
    pub stub: Stub<'m>,
}

/// The threads of a process and which one is current.
pub struct Process<'m> {
    threads: Vec<Thread<'m>>,
    current: usize,
    /// The thread and action of the next resume, if gdb named one.
    pending: Option<(usize, Action)>,
    /// The thread of gdb's last `Hc` (reverse commands).
    hc: Noted,
    /// The thread the session starts on, listed first
    /// ([`Process::list_active_threads`]).
    starts_on: usize,
}

impl<'m> Process<'m> {
    /// The process of `threads` (not empty), thread `current` selected.
    pub fn new(threads: Vec<Thread<'m>>, current: usize) -> Process<'m> {
        assert!(current < threads.len(), "the current thread is one of them");
        Process {
            threads,
            current,
            pending: None,
            hc: Noted::default(),
            starts_on: current,
        }
    }

    /// Where the connection notes gdb's `Hc` thread ([`crate::hc`]).
    pub fn hc(&self) -> Noted {
        self.hc.clone()
    }

    /// Makes gdb's `Hc` thread current, when gdb named one (under
    /// scheduler locking).
    fn follow_hc(&mut self) {
        if let Some(i) = self.hc.get().and_then(|t| self.index(t).ok()) {
            self.current = i;
        }
    }

    /// The current thread's stub.
    pub fn current(&mut self) -> &mut Stub<'m> {
        &mut self.threads[self.current].stub
    }

    /// gdb's id of thread index `i`.
    fn tid(i: usize) -> Tid {
        Tid::new(i + 1).expect("i + 1 is not zero")
    }

    /// The index of gdb's thread `tid`.
    fn index(&self, tid: Tid) -> Result<usize, String> {
        let i = tid.get() - 1;
        match i < self.threads.len() {
            true => Ok(i),
            false => Err(format!("no thread {tid}")),
        }
    }

    /// Selects `tid`'s thread; its stub.
    fn select(&mut self, tid: Tid) -> Result<&mut Stub<'m>, String> {
        self.current = self.index(tid)?;
        Ok(self.current())
    }

    /// Runs the current thread's pending action; why it stopped.
    pub fn run(&mut self) -> Result<MultiThreadStopReason<u64>, String> {
        let stop = self.current().run()?;
        Ok(stop_reason(Self::tid(self.current), stop))
    }

    /// Every stub, for what all threads share (breakpoints, watchpoints).
    fn stubs(&mut self) -> impl Iterator<Item = &mut Stub<'m>> {
        self.threads.iter_mut().map(|t| &mut t.stub)
    }

    fn image(&self) -> &Image {
        self.threads[0].stub.image()
    }
}

/// gdbstub's stop reason for thread `tid`'s [`Stop`] (a step's too names
/// the thread: gdb cannot tell which one stepped otherwise).
fn stop_reason(tid: Tid, s: Stop) -> MultiThreadStopReason<u64> {
    use MultiThreadStopReason as R;
    let replay = |pos| R::ReplayLog {
        tid: Some(tid),
        pos,
    };
    match s {
        Stop::Step => R::SignalWithThread {
            tid,
            signal: Signal::SIGTRAP,
        },
        Stop::SwBreak => R::SwBreak(tid),
        Stop::HwBreak => R::HwBreak(tid),
        Stop::Begin => replay(ReplayLogPosition::Begin),
        Stop::End => replay(ReplayLogPosition::End),
        Stop::Watch(kind, addr) => R::Watch { tid, kind, addr },
        Stop::Signal(signo) => R::SignalWithThread {
            tid,
            signal: gdb_signal(signo),
        },
    }
}

/// gdb's number of Linux signal `signo` (the remote protocol numbers
/// signals as gdb's `enum gdb_signal`, not as Linux does).
fn gdb_signal(signo: u32) -> Signal {
    let gdb = match signo {
        1..=6 | 8 | 9 | 11 | 13..=15 | 21 | 22 | 24..=28 => signo,
        7 => 10,
        10 => 30,
        12 => 31,
        17 => 20,
        18 => 19,
        19 => 17,
        20 => 18,
        23 => 16,
        29 => 23,
        30 => 32,
        31 => 12,
        32 => 77,
        33..=63 => signo + 12,
        64 => 78,
        // GDB_SIGNAL_UNKNOWN (SIGSTKFLT has no number of gdb's own).
        _ => 143,
    };
    Signal(gdb as u8)
}

impl Target for Process<'_> {
    type Arch = PcOnly;
    type Error = String;

    #[inline(always)]
    fn base_ops(&mut self) -> gdbstub::target::ext::base::BaseOps<'_, PcOnly, String> {
        gdbstub::target::ext::base::BaseOps::MultiThread(self)
    }

    #[inline(always)]
    fn support_breakpoints(
        &mut self,
    ) -> Option<gdbstub::target::ext::breakpoints::BreakpointsOps<'_, Self>> {
        Some(self)
    }

    #[inline(always)]
    fn support_monitor_cmd(
        &mut self,
    ) -> Option<gdbstub::target::ext::monitor_cmd::MonitorCmdOps<'_, Self>> {
        Some(self)
    }

    #[inline(always)]
    fn support_exec_file(
        &mut self,
    ) -> Option<gdbstub::target::ext::exec_file::ExecFileOps<'_, Self>> {
        Some(self)
    }

    #[inline(always)]
    fn support_auxv(&mut self) -> Option<gdbstub::target::ext::auxv::AuxvOps<'_, Self>> {
        Some(self)
    }

    #[inline(always)]
    fn support_libraries_svr4(
        &mut self,
    ) -> Option<gdbstub::target::ext::libraries::LibrariesSvr4Ops<'_, Self>> {
        Some(self)
    }

    #[inline(always)]
    fn support_extended_mode(
        &mut self,
    ) -> Option<gdbstub::target::ext::extended_mode::ExtendedModeOps<'_, Self>> {
        Some(self)
    }
}

/// Only for gdb's `kill` (`vKill`): gdbstub answers it `OK` only in
/// extended mode, and without the answer gdb says "Remote connection
/// closed" (before 2026-11-29). A trace has no process to run or attach:
/// those requests are refused; `quit` detaches, as from an attached
/// process, since the replay is no process of the user's to kill.
impl ExtendedMode for Process<'_> {
    fn run(&mut self, _file: Option<&[u8]>, _args: Args<'_, '_>) -> TargetResult<Pid, Self> {
        Err(TargetError::NonFatal)
    }

    fn attach(&mut self, _pid: Pid) -> TargetResult<(), Self> {
        Err(TargetError::NonFatal)
    }

    fn query_if_attached(&mut self, _pid: Pid) -> TargetResult<AttachKind, Self> {
        Ok(AttachKind::Attach)
    }

    fn kill(&mut self, _pid: Option<Pid>) -> TargetResult<ShouldTerminate, Self> {
        // The session ends; the stub's caller cleans up as after a detach.
        Ok(ShouldTerminate::Yes)
    }

    /// (`R`, extended-remote only) The run from its start: every thread
    /// back to its first instruction.
    fn restart(&mut self) -> Result<(), String> {
        self.stubs().for_each(|s| {
            s.seek(0);
        });
        Ok(())
    }
}

impl MultiThreadBase for Process<'_> {
    /// Reading a thread's registers selects it: gdb reads the selected
    /// thread's before it resumes, and `bc` names no thread.
    fn read_registers(&mut self, regs: &mut PcRegs, tid: Tid) -> TargetResult<(), Self> {
        let stub = self.select(tid).map_err(TargetError::Fatal)?;
        regs.rip = stub.pc();
        (regs.rsp, regs.rbp) = stub.frame0_stack();
        Ok(())
    }

    fn write_registers(&mut self, _regs: &PcRegs, _tid: Tid) -> TargetResult<(), Self> {
        Err(TargetError::NonFatal)
    }

    /// Reading memory for a thread selects it too (the shadow region is
    /// the thread's procedure stack).
    fn read_addrs(&mut self, start: u64, data: &mut [u8], tid: Tid) -> TargetResult<usize, Self> {
        let stub = self.select(tid).map_err(TargetError::Fatal)?;
        match stub.read_memory(start, data) {
            0 => Err(TargetError::NonFatal),
            n => Ok(n),
        }
    }

    fn write_addrs(&mut self, _start: u64, _data: &[u8], _tid: Tid) -> TargetResult<(), Self> {
        Err(TargetError::NonFatal)
    }

    /// The thread the session starts on, then the others in the trace's
    /// order: gdbstub's reply to gdb's `?` names the first thread listed,
    /// and gdb selects it (gdb's `Hg0` before it and its thread numbers
    /// follow the list too, so no other order selects it).
    fn list_active_threads(&mut self, active: &mut dyn FnMut(Tid)) -> Result<(), String> {
        active(Self::tid(self.starts_on));
        let others = (0..self.threads.len()).filter(|&i| i != self.starts_on);
        others.for_each(|i| active(Self::tid(i)));
        Ok(())
    }

    #[inline(always)]
    fn support_resume(
        &mut self,
    ) -> Option<gdbstub::target::ext::base::multithread::MultiThreadResumeOps<'_, Self>> {
        Some(self)
    }

    #[inline(always)]
    fn support_thread_extra_info(
        &mut self,
    ) -> Option<gdbstub::target::ext::thread_extra_info::ThreadExtraInfoOps<'_, Self>> {
        Some(self)
    }
}

impl ThreadExtraInfo for Process<'_> {
    fn thread_extra_info(&self, tid: Tid, buf: &mut [u8]) -> Result<usize, String> {
        let t = &self.threads[self.index(tid)?];
        let text = format!(
            "trace thread {} pid {} tid {} at instruction {}",
            t.thread,
            t.pid,
            t.os_tid,
            t.stub.position()
        );
        Ok(xfer(text.as_bytes(), 0, buf.len(), buf))
    }
}

impl Process<'_> {
    /// Records gdb's action for thread `tid` (a step or range beats a
    /// continue: gdb steps one thread and lets the others continue),
    /// resuming with `signal`. The run goes on as recorded whatever the
    /// signal: the one the thread stopped with, which the recorded run
    /// went on to deliver (gdb passes it back), is what it did; none at a
    /// recorded delivery it stopped with (`signal 0`, `handle SIG nopass`) or another
    /// signal (`signal SIG`) is said on gdb's terminal, not refused (an
    /// error here ends gdbstub's session: before 2026-11-29, `signal SIG`
    /// at a signal stop closed the connection).
    fn pend(&mut self, tid: Tid, action: Action, signal: Option<Signal>) -> Result<(), String> {
        let i = self.index(tid)?;
        let stub = &self.threads[i].stub;
        let own = stub.stop_signal().map(gdb_signal);
        if signal.is_some_and(|s| Some(s) != own) {
            stub.warn(
                "a trace cannot deliver another signal than the recorded one: the run goes on \
                 as recorded",
            );
        } else if signal.is_none() && own.is_some() && stub.at_delivery() {
            // Only where gdb was told of the signal: a step back onto a
            // delivery is a plain step (as `record full` reports it), and
            // gdb resumes from it without a signal, as it should.
            stub.warn(
                "a trace cannot discard the signal it stopped with (signal 0, handle nopass): \
                 the run goes on as recorded, into the signal's handler",
            );
        }
        if self.pending.is_none() || action != Action::Continue {
            self.pending = Some((i, action));
        }
        Ok(())
    }
}

impl MultiThreadResume for Process<'_> {
    fn resume(&mut self) -> Result<(), String> {
        let (i, action) = self
            .pending
            .take()
            .unwrap_or((self.current, Action::Continue));
        self.current = i;
        self.current().set_action(action);
        Ok(())
    }

    fn clear_resume_actions(&mut self) -> Result<(), String> {
        self.pending = None;
        Ok(())
    }

    fn set_resume_action_continue(
        &mut self,
        tid: Tid,
        signal: Option<Signal>,
    ) -> Result<(), String> {
        self.pend(tid, Action::Continue, signal)
    }

    #[inline(always)]
    fn support_single_step(
        &mut self,
    ) -> Option<gdbstub::target::ext::base::multithread::MultiThreadSingleStepOps<'_, Self>> {
        Some(self)
    }

    #[inline(always)]
    fn support_range_step(
        &mut self,
    ) -> Option<gdbstub::target::ext::base::multithread::MultiThreadRangeSteppingOps<'_, Self>>
    {
        Some(self)
    }

    #[inline(always)]
    fn support_scheduler_locking(
        &mut self,
    ) -> Option<gdbstub::target::ext::base::multithread::MultiThreadSchedulerLockingOps<'_, Self>>
    {
        Some(self)
    }

    #[inline(always)]
    fn support_reverse_step(
        &mut self,
    ) -> Option<gdbstub::target::ext::base::reverse_exec::ReverseStepOps<'_, Tid, Self>> {
        Some(self)
    }

    #[inline(always)]
    fn support_reverse_cont(
        &mut self,
    ) -> Option<gdbstub::target::ext::base::reverse_exec::ReverseContOps<'_, Tid, Self>> {
        Some(self)
    }
}

/// Only one thread ever moves: gdb's scheduler locking is what the stub
/// does anyway (gdb sends it with `set scheduler-locking on`).
impl MultiThreadSchedulerLocking for Process<'_> {
    fn set_resume_action_scheduler_lock(&mut self) -> Result<(), String> {
        Ok(())
    }
}

impl MultiThreadSingleStep for Process<'_> {
    fn set_resume_action_step(&mut self, tid: Tid, signal: Option<Signal>) -> Result<(), String> {
        self.pend(tid, Action::Step, signal)
    }
}

impl MultiThreadRangeStepping for Process<'_> {
    fn set_resume_action_range_step(
        &mut self,
        tid: Tid,
        start: u64,
        end: u64,
    ) -> Result<(), String> {
        self.pend(tid, Action::Range(start, end), None)
    }
}

impl ReverseStep<Tid> for Process<'_> {
    /// gdb's `Hc` thread steps back, else the current one (gdbstub turns
    /// `Hc0`, any thread, into thread 1: `tid` cannot tell).
    fn reverse_step(&mut self, _tid: Tid) -> Result<(), String> {
        self.follow_hc();
        self.current().set_action(Action::ReverseStep);
        Ok(())
    }
}

impl ReverseCont<Tid> for Process<'_> {
    /// As [`Process::reverse_step`].
    fn reverse_cont(&mut self) -> Result<(), String> {
        self.follow_hc();
        self.current().set_action(Action::ReverseContinue);
        Ok(())
    }
}

impl Breakpoints for Process<'_> {
    #[inline(always)]
    fn support_sw_breakpoint(
        &mut self,
    ) -> Option<gdbstub::target::ext::breakpoints::SwBreakpointOps<'_, Self>> {
        Some(self)
    }

    #[inline(always)]
    fn support_hw_breakpoint(
        &mut self,
    ) -> Option<gdbstub::target::ext::breakpoints::HwBreakpointOps<'_, Self>> {
        Some(self)
    }

    #[inline(always)]
    fn support_hw_watchpoint(
        &mut self,
    ) -> Option<gdbstub::target::ext::breakpoints::HwWatchpointOps<'_, Self>> {
        Some(self)
    }
}

impl SwBreakpoint for Process<'_> {
    fn add_sw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        self.stubs().for_each(|s| s.add_break(addr, false));
        Ok(true)
    }

    fn remove_sw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        Ok(self
            .stubs()
            .fold(false, |r, s| s.remove_break(addr, false) | r))
    }
}

impl HwBreakpoint for Process<'_> {
    fn add_hw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        self.stubs().for_each(|s| s.add_break(addr, true));
        Ok(true)
    }

    fn remove_hw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        Ok(self
            .stubs()
            .fold(false, |r, s| s.remove_break(addr, true) | r))
    }
}

impl HwWatchpoint for Process<'_> {
    /// Refused unless every thread has data addresses.
    fn add_hw_watchpoint(
        &mut self,
        addr: u64,
        len: u64,
        kind: WatchKind,
    ) -> TargetResult<bool, Self> {
        let ok = self.stubs().all(|s| s.add_watch(addr, len, kind));
        if !ok {
            self.stubs().for_each(|s| {
                s.remove_watch(addr, len, kind);
            });
        }
        Ok(ok)
    }

    fn remove_hw_watchpoint(
        &mut self,
        addr: u64,
        len: u64,
        kind: WatchKind,
    ) -> TargetResult<bool, Self> {
        Ok(self
            .stubs()
            .fold(false, |r, s| s.remove_watch(addr, len, kind) | r))
    }
}

impl MonitorCmd for Process<'_> {
    fn handle_monitor_cmd(&mut self, cmd: &[u8], mut out: ConsoleOutput<'_>) -> Result<(), String> {
        let reply = self.current().monitor(&String::from_utf8_lossy(cmd));
        outputln!(out, "{reply}");
        Ok(())
    }
}

impl gdbstub::target::ext::exec_file::ExecFile for Process<'_> {
    fn get_exec_file(
        &self,
        _pid: Option<gdbstub::common::Pid>,
        offset: u64,
        length: usize,
        buf: &mut [u8],
    ) -> TargetResult<usize, Self> {
        Ok(xfer(
            self.threads[0].stub.exe_path().as_bytes(),
            offset,
            length,
            buf,
        ))
    }
}

impl gdbstub::target::ext::auxv::Auxv for Process<'_> {
    fn get_auxv(&self, offset: u64, length: usize, buf: &mut [u8]) -> TargetResult<usize, Self> {
        Ok(xfer(&self.image().auxv(), offset, length, buf))
    }
}

impl gdbstub::target::ext::libraries::LibrariesSvr4 for Process<'_> {
    fn get_libraries_svr4(
        &self,
        offset: u64,
        length: usize,
        buf: &mut [u8],
    ) -> TargetResult<usize, Self> {
        let xml = self.image().libraries_svr4();
        Ok(xfer(xml.as_bytes(), offset, length, buf))
    }
}
