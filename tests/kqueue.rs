//! The shared suite (`tests/common`) on the kqueue backend: the BSDs and Apple, or
//! Linux built with `--cfg pollshot_libkqueue` against an installed libkqueue.
#![cfg(all(pollshot_kqueue, not(pollshot_rump)))] // host descriptors: not on a rump kernel

#[macro_use]
mod common;

suite!(pollshot::backends::Kqueue);
