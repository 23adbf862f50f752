//! The `cachesim` binary: the same command line as `aetrace cachesim`
//! (exit codes: 0 ok, 1 bad input or runtime error, 2 usage error).

#[path = "../cmd/cachesim.rs"]
mod cachesim;
// The walk of a data trace; its text formats are `aetrace regen`'s.
#[allow(dead_code)]
#[path = "../cmd/dataout.rs"]
mod dataout;

fn main() -> std::process::ExitCode {
    cachesim::main(std::env::args_os().skip(1).collect())
}
