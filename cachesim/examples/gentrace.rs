//! Writes a deterministic synthetic address trace for `bench/cachesim.sh`
//! in three formats: `PREFIX.xdin`, `PREFIX.din` and `PREFIX.bin`.
//!
//! Usage: `gentrace N PREFIX`
//!
//! The stream imitates a program: instruction fetches walk loops of basic
//! blocks (2..9 instructions of 1..8 bytes at 4-byte steps) placed in a
//! 256 KiB code region, the loops chosen with a skew so a few hundred
//! blocks are hot; about a third of the instructions also read or write
//! data: a hot 4 KiB stack (65%), a streamed 4 MiB array (30%) and random
//! words of a 64 MiB heap (5%).  The `.xdin` and `.bin`
//! files hold the same references; the `.din` copy has the same addresses
//! with Dinero III's implied size 4.

use std::fs::File;
use std::io::{BufWriter, Write};

use aetrace_cachesim::cache::Rng;
use aetrace_cachesim::AccessKind;
use aetrace_format::addrtrace::AddrWriter;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: gentrace N PREFIX");
        std::process::exit(2);
    }
    let n: u64 = args[1].parse()?;
    let prefix = &args[2];
    let mut xdin = BufWriter::with_capacity(1 << 20, File::create(format!("{prefix}.xdin"))?);
    let mut din = BufWriter::with_capacity(1 << 20, File::create(format!("{prefix}.din"))?);
    let mut bin = AddrWriter::new(File::create(format!("{prefix}.bin"))?, Some(n))?;
    let mut rng = Rng::new(42);
    const CODE: u64 = 0x40_0000;
    const STACK: u64 = 0x7ffd_0000_0000;
    const ARRAY: u64 = 0x60_0000;
    const HEAP: u64 = 0x1000_0000;
    let blocks: Vec<u64> = (0..4096)
        .map(|_| CODE + (rng.below(256 * 1024) as u64 & !3))
        .collect();
    // Loops: a run of 2..9 blocks repeated 1..64 times; the next loop starts
    // at a block picked with a skew towards low ids (the minimum of three
    // draws), so a few hundred blocks are hot and the rest are rare.
    let mut loop_start = 0usize;
    let mut loop_len = 4usize;
    let mut trips = 8u32;
    let mut at_block = 0usize;
    let mut pc = blocks[0];
    let mut left_in_block = 4;
    let mut stream = 0u64;
    let mut written = 0u64;
    let mut emit =
        |kind: AccessKind, addr: u64, size: u32, written: &mut u64| -> std::io::Result<()> {
            let letter = match kind {
                AccessKind::Read => 'r',
                AccessKind::Write => 'w',
                AccessKind::Instr => 'i',
                AccessKind::Misc => 'm',
            };
            writeln!(xdin, "{letter} {addr:x} {size:x}")?;
            writeln!(din, "{} {addr:x}", kind as u8)?;
            bin.push(kind, addr, size).map_err(std::io::Error::other)?;
            *written += 1;
            Ok(())
        };
    while written < n {
        let len = 1 + rng.below(8) as u32;
        emit(AccessKind::Instr, pc, len, &mut written)?;
        pc += 4;
        left_in_block -= 1;
        if left_in_block == 0 {
            at_block += 1;
            if at_block == loop_len {
                at_block = 0;
                trips -= 1;
                if trips == 0 {
                    loop_start = rng
                        .below(blocks.len())
                        .min(rng.below(blocks.len()))
                        .min(rng.below(blocks.len()));
                    loop_len = 2 + rng.below(8);
                    trips = 1 + rng.below(64) as u32;
                }
            }
            let b = (loop_start + at_block) % blocks.len();
            pc = blocks[b];
            // Block lengths are a function of the block, as in a program.
            left_in_block = 2 + (b * 7919) % 8;
        }
        if written < n && rng.below(3) == 0 {
            let kind = if rng.below(5) < 3 {
                AccessKind::Read
            } else {
                AccessKind::Write
            };
            let size = [1, 2, 4, 8, 8, 8, 4, 4][rng.below(8)];
            let addr = match rng.below(20) {
                0..=12 => STACK - 4096 + (rng.below(4096) as u64 & !7),
                13..=18 => {
                    stream = (stream + 8) % (4 << 20);
                    ARRAY + stream
                }
                _ => HEAP + (rng.below(64 << 20) as u64 & !7),
            };
            emit(kind, addr, size, &mut written)?;
        }
    }
    xdin.flush()?;
    din.flush()?;
    bin.finish()?;
    Ok(())
}
