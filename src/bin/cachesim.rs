//! The `cachesim` binary: the same command line as `aetrace cachesim`
//! (exit codes: 0 ok, 1 bad input or runtime error, 2 usage error).

#[path = "../cmd/cachesim.rs"]
mod cachesim;

fn main() -> std::process::ExitCode {
    cachesim::main(std::env::args_os().skip(1).collect())
}
