//! Displaced stepping: an instruction that cannot be emulated is executed
//! from a copy in a scratch page of the program, not by putting the
//! original byte back under the breakpoint. With several threads the
//! in-place step-over has a race (another thread can run through the
//! restored byte and go unseen); a copy leaves every `int3` in place.
//!
//! The page is mapped once, at the first stop after `execve` (one thread
//! only), by making the program run an `mmap` system call: the tracer
//! writes `syscall` over the instruction at `rip`, sets the registers,
//! single-steps, and puts bytes and registers back. It is asked for near the
//! main executable so that RIP-relative operands and the `jmp` back reach
//! (rel32). Each thread has its own slot: the copied instruction, then a
//! `jmp` to the instruction after the original, so a thread that continues
//! from the copy without the tracer (a `clone` child, a restarted system
//! call) still runs the program's own code.
//!
//! Invariants: a slot is written only while its thread is stopped and not
//! stepping; the copy computes exactly what the original computes (iced-x86
//! re-encodes RIP-relative operands for the new address, and refuses when
//! the displacement does not fit: the caller then steps in place).

use iced_x86::{Decoder, DecoderOptions, Encoder, FlowControl, Mnemonic};

use crate::sys::{self, Mem, Pid};
use crate::Error;

/// Bytes per slot: an instruction (at most 15 bytes, re-encoded) and a
/// 5-byte `jmp`.
const SLOT: u64 = 32;
/// Slots (threads) in the page.
const SLOTS: u64 = 2048;

/// The scratch page.
pub struct Scratch {
    base: u64,
}

/// Where a displaced instruction runs and where it ends.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Displaced {
    /// Address of the copy.
    pub at: u64,
    /// `rip` after the copy ran (its end).
    pub done: u64,
    /// The matching address in the program (after the original).
    pub back: u64,
}

impl Scratch {
    /// Maps the page in the stopped, single-threaded process `pid`, within
    /// rel32 reach of `[lo, hi)`. `None` when the kernel puts it out of
    /// reach (the tracer then steps in place).
    pub fn map(pid: Pid, mem: &Mem, lo: u64, hi: u64) -> Result<Option<Scratch>, Error> {
        let saved = sys::get_regs(pid)?;
        let mut code = [0u8; 2];
        mem.read(saved.rip, &mut code)?;
        let size = SLOT * SLOTS;
        // Below the module when there is room (PIE), else above it.
        let hint = if lo > 1 << 30 {
            (lo - (64 << 20)) & !0xfff
        } else {
            (hi + (1 << 30)) & !0xfff
        };
        let mut regs = saved;
        regs.rax = libc::SYS_mmap as u64;
        regs.rdi = hint;
        regs.rsi = size;
        regs.rdx = (libc::PROT_READ | libc::PROT_EXEC) as u64;
        regs.r10 = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        regs.r8 = u64::MAX;
        regs.r9 = 0;
        mem.write(saved.rip, &[0x0f, 0x05])?;
        sys::set_regs(pid, &regs)?;
        sys::step(pid, 0)?;
        let status = sys::wait_pid(pid)?;
        let after = sys::get_regs(pid)?;
        mem.write(saved.rip, &code)?;
        sys::set_regs(pid, &saved)?;
        if !libc::WIFSTOPPED(status) || libc::WSTOPSIG(status) != libc::SIGTRAP {
            return Err(Error::Launch {
                program: format!("process {pid}"),
                status,
            });
        }
        let base = after.rax;
        let reach = |a: u64, b: u64| a.abs_diff(b) < (1 << 31) - (1 << 24);
        if (base as i64) < 0 || !reach(base, lo) || !reach(base + size, hi) {
            return Ok(None);
        }
        Ok(Some(Scratch { base }))
    }

    /// Copies the instruction at runtime `ip` (its file bytes `bytes`) into
    /// slot `slot`, followed by a `jmp` back. `None` when it cannot run
    /// displaced: a branch (emulated or stepped in place), or a re-encoding
    /// that does not fit.
    pub fn place(
        &self,
        mem: &Mem,
        slot: u64,
        ip: u64,
        bytes: &[u8],
    ) -> Result<Option<Displaced>, Error> {
        if slot >= SLOTS {
            return Ok(None);
        }
        let insn = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE).decode();
        if insn.is_invalid()
            || !(insn.flow_control() == FlowControl::Next || insn.mnemonic() == Mnemonic::Syscall)
        {
            return Ok(None);
        }
        let at = self.base + slot * SLOT;
        let mut enc = Encoder::new(64);
        let Ok(n) = enc.encode(&insn, at) else {
            return Ok(None);
        };
        let mut copy = enc.take_buffer();
        let done = at + n as u64;
        let back = insn.next_ip();
        let Ok(rel) = i32::try_from(back as i64 - (done as i64 + 5)) else {
            return Ok(None);
        };
        copy.push(0xe9);
        copy.extend_from_slice(&rel.to_le_bytes());
        debug_assert!(copy.len() as u64 <= SLOT);
        mem.write(at, &copy)?;
        Ok(Some(Displaced { at, done, back }))
    }
}
