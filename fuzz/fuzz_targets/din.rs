//! libFuzzer entry of the `din` target: `aetrace_fuzzing::din`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| aetrace_fuzzing::din(data));
