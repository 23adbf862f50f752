//! libFuzzer entry of the `trace_regen` target: `aetrace_fuzzing::trace_regen`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| aetrace_fuzzing::trace_regen(data));
