//! libFuzzer entry of the `addrtrace` target: `aetrace_fuzzing::addrtrace`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| aetrace_fuzzing::addrtrace(data));
