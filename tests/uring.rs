//! The shared suite (`tests/common`) on the io_uring backend (cargo feature
//! `io-uring`), and what only io_uring has: cancelled, failed and overflowing
//! completions, and a refusal by the kernel.
#![cfg(all(target_os = "linux", feature = "io-uring"))]

#[macro_use]
mod common;

suite!(pollshot::backends::Uring);
