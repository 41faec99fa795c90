//! The shared suite (`tests/common`) on the epoll backend.
#![cfg(any(target_os = "linux", target_os = "android"))]

#[macro_use]
mod common;

suite!(pollshot::backends::Epoll);
