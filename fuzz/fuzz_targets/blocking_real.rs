//! cargo-fuzz target `blocking_real`: see `fuzz/src/lib.rs` (`pollshot_fuzz::blocking_real`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pollshot_fuzz::blocking_real(data));
