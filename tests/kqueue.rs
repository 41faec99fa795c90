//! The shared suite (`tests/common`) on the kqueue backend: the BSDs and Apple, or
//! Linux built with `--cfg pollshot_libkqueue` against an installed libkqueue.
#![cfg(any(
    target_os = "freebsd",
    target_os = "netbsd",
    target_os = "openbsd",
    target_os = "dragonfly",
    target_os = "macos",
    target_os = "ios",
    all(target_os = "linux", pollshot_libkqueue)
))]

#[macro_use]
mod common;

suite!(pollshot::backends::Kqueue);
