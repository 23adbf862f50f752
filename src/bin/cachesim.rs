//! The `cachesim` binary: hands its arguments to [`aetrace_cachesim::cli::main`]
//! (exit codes: 0 ok, 1 bad input or runtime error, 2 usage error).

fn main() -> std::process::ExitCode {
    aetrace_cachesim::cli::main(std::env::args_os().skip(1).collect())
}
