fn main() -> std::process::ExitCode {
    aetrace_cachesim::cli::main(std::env::args_os().skip(1).collect())
}
