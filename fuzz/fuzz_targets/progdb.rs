//! libFuzzer entry of the `progdb` target: `aetrace_fuzzing::progdb`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| aetrace_fuzzing::progdb(data));
