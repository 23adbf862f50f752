//! Follows a program and prints the engine's counters and blocks per
//! second: `follow PROGRAM ARGS...` (used by `bench/verify.sh`). With
//! `FOLLOW_PRINT` set it also prints the first blocks; the first events are
//! printed with the blocks that preceded them.
use std::ffi::OsString;
use std::path::PathBuf;

use aetrace_verify::{Arrival, Event, Observer, Options, Pid};

struct Count(u64, u64, Vec<(u64, Arrival)>);
impl Observer for Count {
    fn block(&mut self, _: Pid, _: usize, start: u64, a: Arrival) {
        self.0 += 1;
        self.2.push((start, a));
        if self.2.len() > 8 {
            self.2.remove(0);
        }
        if std::env::var_os("FOLLOW_PRINT").is_some() && self.0 < 40 {
            eprintln!("{start:#x} {a:?}");
        }
    }
    fn event(&mut self, tid: Pid, e: &Event) {
        self.1 += 1;
        if self.1 < 20 {
            eprintln!("[{tid}] {e:?} after {:x?}", self.2);
        }
    }
}

fn main() {
    let mut args = std::env::args_os().skip(1);
    let prog = PathBuf::from(args.next().expect("usage: follow PROGRAM ARGS..."));
    let rest: Vec<OsString> = args.collect();
    let mut c = Count(0, 0, Vec::new());
    match aetrace_verify::follow(&prog, &rest, &Options::default(), &mut c) {
        Ok(o) => eprintln!(
            "{:?} {:?} {:?} blocks/s {:.0}",
            o.exit,
            o.stats,
            o.elapsed,
            o.stats.blocks as f64 / o.elapsed.as_secs_f64()
        ),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2)
        }
    }
}
