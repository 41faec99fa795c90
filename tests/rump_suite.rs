//! The shared suite (`tests/common`) on NetBSD kernel code: `Poller<Kqueue>`
//! on a NetBSD rump kernel (NetBSD 7.99.34, `sys/kern/kern_event.c` 1.88, the
//! kqueue NetBSD 8 and 9 ship) booted in this process, every body that
//! descriptors of that kernel can express run on them (`fd_suite!` with
//! `pollshot::rump::RumpFd`: `AF_LOCAL` socketpairs and pipes made, read,
//! written, shut down, duplicated and closed by the rump kernel's system calls,
//! registered with `register_raw`). The bodies and their names are those of
//! `tests/kqueue.rs` (libkqueue, a BSD); `docs/testing.md` lists the cases a
//! rump kernel cannot express, and why. Built only with `--cfg pollshot_rump`
//! and `POLLSHOT_RUMP_DIR` naming the rump kernel.
#![cfg(pollshot_rump)]

#[macro_use]
mod common;

fd_suite!(pollshot::backends::Kqueue, pollshot::rump::RumpFd);
