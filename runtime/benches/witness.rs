//! Cost of the witness hot sequences, measured in a tight generated loop
//! (16 witnesses per iteration, one buffer check per iteration as at a loop
//! header) while a recorder thread drains the region concurrently, against
//! a plain one-byte store baseline measured in the same run; and, per
//! value of `rax`, today's VALUE record against the two forms of a second
//! value stream growing down from `LIMIT` (docs/data.md, "A second value
//! stream, measured before building").
//!
//! Run: `cargo bench -p aetrace-runtime --bench witness`

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aetrace_runtime::emit::{
    emit_buffer_check, emit_record, emit_witness, FlagsSave, Payload, Site,
};
use aetrace_runtime::layout::{HEADROOM, S_LIMIT};
use aetrace_runtime::{Geometry, RecordKind, Region};
use common::*;
use iced_x86::code_asm::*;

const PER_ITER: u64 = 16;
const ITERS: u64 = 250_000;

/// What one generated loop body does.
#[derive(Clone, Copy)]
enum Body {
    /// `mov byte [rdi+i], W` then `add rdi, 16`: the floor.
    Plain,
    /// Load gs:[POS], store, bump, store gs:[POS]: the same memory chain
    /// without the single-instruction reservation (NOT signal safe; it
    /// isolates what `xadd` itself costs).
    LoadStore,
    Witness(Site),
    /// The same two chains through the slot's POS word addressed as `[rdx]`
    /// (slot address loaded from gs:[BASE] once per iteration): isolates
    /// the cost of the gs prefix on the dependency chain.
    LoadStoreNoGs,
    XaddNoGs,
    /// Two dead registers: load the slot address from `gs:[BASE]` (a
    /// constant, off the dependency chain), then `xadd` through it.
    XaddViaBase,
    /// A VALUE record of `rax` in the witness stream (today's
    /// `record --data`), dead scratch, dead flags.
    ValueRecord,
    /// `rax` into a value stream growing down from `LIMIT`, reserved
    /// with `xadd gs:[LIMIT]` then stored.
    ValueXadd,
    /// The same stored first and published by `sub gs:[LIMIT], 8`.
    ValueSub,
}

/// `fn(buf, iters)`: `iters` x (check + 16 witnesses), or the references.
fn build(m: &mut Mapped, body: Body) -> extern "C" fn(*mut u8, u64) {
    let flush = m.sym("flush");
    let mut a = CodeAssembler::new(64).unwrap();
    let mut lp = a.create_label();
    a.set_label(&mut lp).unwrap();
    match body {
        Body::Witness(site) => {
            emit_buffer_check(
                &mut a,
                flush,
                Site {
                    flags_live: false,
                    ..site
                },
            )
            .unwrap();
            for i in 0..PER_ITER {
                emit_witness(&mut a, 1 + i as u8, site).unwrap();
            }
        }
        Body::LoadStore => {
            emit_buffer_check(&mut a, flush, Site::with_scratch(r11)).unwrap();
            for i in 0..PER_ITER {
                a.mov(r11, qword_ptr(0u64).gs()).unwrap();
                a.mov(byte_ptr(r11), 1 + i as u32).unwrap();
                a.lea(r11, ptr(r11 + 1)).unwrap();
                a.mov(qword_ptr(0u64).gs(), r11).unwrap();
            }
        }
        Body::XaddViaBase => {
            emit_buffer_check(&mut a, flush, Site::with_scratch(r11)).unwrap();
            for i in 0..PER_ITER {
                a.mov(r10, qword_ptr(24u64).gs()).unwrap();
                a.mov(r11d, 1u32).unwrap();
                a.xadd(qword_ptr(r10), r11).unwrap();
                a.mov(byte_ptr(r11), 1 + i as u32).unwrap();
            }
        }
        Body::LoadStoreNoGs | Body::XaddNoGs => {
            emit_buffer_check(&mut a, flush, Site::with_scratch(r11)).unwrap();
            // The slot's own POS word, addressed without the gs prefix.
            a.mov(rdx, qword_ptr(24u64).gs()).unwrap();
            for i in 0..PER_ITER {
                if matches!(body, Body::XaddNoGs) {
                    a.mov(r11d, 1u32).unwrap();
                    a.xadd(qword_ptr(rdx), r11).unwrap();
                } else {
                    a.mov(r11, qword_ptr(rdx)).unwrap();
                    a.lea(r10, ptr(r11 + 1)).unwrap();
                    a.mov(qword_ptr(rdx), r10).unwrap();
                }
                a.mov(byte_ptr(r11), 1 + i as u32).unwrap();
            }
        }
        Body::ValueRecord | Body::ValueXadd | Body::ValueSub => {
            emit_buffer_check(&mut a, flush, Site::with_scratch(r11)).unwrap();
            let store = ptr(r11 + (HEADROOM - 8) as i32);
            for _ in 0..PER_ITER {
                match body {
                    Body::ValueRecord => emit_record(
                        &mut a,
                        RecordKind::Value,
                        Payload::Reg64(rax),
                        Site::with_scratch(r11),
                    )
                    .unwrap(),
                    Body::ValueXadd => {
                        a.mov(r11, -8i64).unwrap();
                        a.xadd(qword_ptr(S_LIMIT).gs(), r11).unwrap();
                        a.mov(qword_ptr(store), rax).unwrap();
                    }
                    _ => {
                        a.mov(r11, qword_ptr(S_LIMIT).gs()).unwrap();
                        a.mov(qword_ptr(store), rax).unwrap();
                        a.sub(qword_ptr(S_LIMIT).gs(), 8).unwrap();
                    }
                }
            }
        }
        Body::Plain => {
            for i in 0..PER_ITER {
                a.mov(byte_ptr(rdi + i as i32), 1 + i as u32).unwrap();
            }
            a.add(rdi, PER_ITER as i32).unwrap();
        }
    }
    a.dec(rsi).unwrap();
    a.jnz(lp).unwrap();
    a.ret().unwrap();
    let code = a.assemble(m.next_ip()).unwrap();
    unsafe { std::mem::transmute::<u64, extern "C" fn(*mut u8, u64)>(m.place(&code)) }
}

fn main() {
    let mut m = Mapped::new();
    let region = Region::create(Geometry {
        slot_count: 4,
        half_size: 1 << 20,
    })
    .unwrap();
    let variants: Vec<(&str, Body)> = vec![
        ("plain store (baseline)", Body::Plain),
        ("load/store gs:[POS] (not signal safe)", Body::LoadStore),
        (
            "load/store chain on POS via [rdx], no gs",
            Body::LoadStoreNoGs,
        ),
        ("xadd on POS via [rdx], no gs", Body::XaddNoGs),
        (
            "witness via gs:[BASE] + xadd [base] (2 regs)",
            Body::XaddViaBase,
        ),
        (
            "witness, dead scratch",
            Body::Witness(Site::with_scratch(r11)),
        ),
        (
            "witness, no scratch (push/pop, red zone)",
            Body::Witness(Site {
                scratch: None,
                flags_live: false,
                red_zone_live: true,
                flags_save: FlagsSave::Lahf,
            }),
        ),
        (
            "witness, no scratch, red zone free",
            Body::Witness(Site {
                scratch: None,
                flags_live: false,
                red_zone_live: false,
                flags_save: FlagsSave::Lahf,
            }),
        ),
        (
            "witness, scratch, live flags lahf/seto",
            Body::Witness(Site {
                scratch: Some(r11),
                flags_live: true,
                red_zone_live: true,
                flags_save: FlagsSave::Lahf,
            }),
        ),
        (
            "witness, scratch, live flags pushf/popf",
            Body::Witness(Site {
                scratch: Some(r11),
                flags_live: true,
                red_zone_live: true,
                flags_save: FlagsSave::Pushf,
            }),
        ),
        (
            "witness, no scratch, live flags lahf/seto",
            Body::Witness(Site::CONSERVATIVE),
        ),
        (
            "witness, no scratch, live flags pushf/popf",
            Body::Witness(Site {
                flags_save: FlagsSave::Pushf,
                ..Site::CONSERVATIVE
            }),
        ),
        (
            "value: VALUE record (10 B, witness stream)",
            Body::ValueRecord,
        ),
        ("value: stream, xadd gs:[LIMIT] then store", Body::ValueXadd),
        ("value: stream, store then sub gs:[LIMIT]", Body::ValueSub),
    ];
    let fns: Vec<_> = variants
        .iter()
        .map(|(n, s)| (*n, build(&mut m, *s)))
        .collect();
    let mut buf = vec![0u8; (ITERS * PER_ITER) as usize + 64];
    let saved_gs = get_gs();
    let stop = AtomicBool::new(false);
    let mut results = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut d = region.drainer();
            let mut bytes = 0u64;
            while !stop.load(Ordering::Acquire) {
                bytes += d.poll(false, &mut |_| {}).unwrap();
                d.wait(Duration::from_millis(1));
            }
            bytes += d.poll(true, &mut |_| {}).unwrap();
            eprintln!("drained {bytes} bytes");
        });
        m.init(&[region.env()]);
        for (name, f) in &fns {
            f(buf.as_mut_ptr(), ITERS / 10); // warm up
            let best = (0..31)
                .map(|_| {
                    let t = Instant::now();
                    f(buf.as_mut_ptr(), ITERS);
                    t.elapsed()
                })
                .min()
                .unwrap();
            results.push((*name, best.as_secs_f64() * 1e9 / (ITERS * PER_ITER) as f64));
        }
        set_gs(saved_gs);
        stop.store(true, Ordering::Release);
    });
    let base = results[0].1;
    println!("{:<45} {:>10} {:>8}", "sequence", "ns/witness", "x plain");
    for (name, ns) in &results {
        println!("{name:<45} {ns:>10.3} {:>8.2}", ns / base);
    }
}
