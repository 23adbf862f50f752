//! libFuzzer entry of the `profile` target: `aetrace_fuzzing::profile`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| aetrace_fuzzing::profile(data));
