//! cargo-fuzz target `epoll_real`: see `fuzz/src/lib.rs` (`pollshot_fuzz::epoll_real`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pollshot_fuzz::epoll_real(data));
