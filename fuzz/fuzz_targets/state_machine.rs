//! cargo-fuzz target `state_machine`: see `fuzz/src/lib.rs` (`pollshot_fuzz::state_machine`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pollshot_fuzz::state_machine(data));
