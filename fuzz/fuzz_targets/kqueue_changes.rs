//! cargo-fuzz target `kqueue_changes`: see `fuzz/src/lib.rs` (`pollshot_fuzz::kqueue_changes`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pollshot_fuzz::kqueue_changes(data));
