//! The shared suite (`tests/common`) on the kqueue backend: the BSDs and Apple, or
//! Linux built with `--cfg pollshot_libkqueue` against an installed libkqueue.
#![cfg(pollshot_kqueue)]

#[macro_use]
mod common;

suite!(pollshot::backends::Kqueue);
