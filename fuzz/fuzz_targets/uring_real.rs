//! cargo-fuzz target `uring_real`: see `fuzz/src/lib.rs` (`pollshot_fuzz::uring_real`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pollshot_fuzz::uring_real(data));
