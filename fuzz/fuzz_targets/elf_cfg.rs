//! libFuzzer entry of the `elf_cfg` target: `aetrace_fuzzing::elf_cfg`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| aetrace_fuzzing::elf_cfg(data));
