//! How kernel refusals and misuse become `io::Error`s: the one place the mapping
//! lives.
//!
//! # Errors from the kernel keep their errno
//!
//! When the kernel refuses a command, the caller gets the kernel's error as it came:
//! `io::Error::from_raw_os_error(errno)`, so `raw_os_error()` is `Some(errno)` and
//! `kind()` is what std derives from it (the convention of std, mio and polling):
//!
//! | errno | from | when | `kind()` |
//! |---|---|---|---|
//! | EBADF | `arm`, `disarm` (epoll_ctl(2), kevent(2); the poll(2) backend's first-arm check) | the descriptor is closed; for `arm` after the ENOENT→ADD fallback too (the number is free) | `Uncategorized` |
//! | ENOMEM, ENOSPC | `arm` | kernel memory, or `max_user_watches` (epoll) | `OutOfMemory`, `StorageFull` |
//! | EMFILE, ENFILE, ENOMEM | `Poller::new`, `reinit_after_fork` | creating the instance or its waker | `Uncategorized`, `OutOfMemory` |
//! | EINTR | `deliver` | a signal arrived before any event | `Interrupted` |
//! | any other | any call | passed on unchanged | std's |
//!
//! Not errors: ENOENT on a MOD (the number was closed and reused: it becomes an
//! ADD), EEXIST on an ADD (a dup is still registered: it becomes a MOD), EPERM from
//! epoll and EINVAL from kqueue on a descriptor they cannot poll (regular files,
//! `/dev/null`: reported always ready), and ENOENT or EBADF on a delete (the kernel
//! already dropped the descriptor). If a fallback fails too, its own errno is the
//! one returned.
//!
//! # pollshot's own errors carry a message
//!
//! | kind | when |
//! |---|---|
//! | `NotFound` | a token names no live registration |
//! | `InvalidInput` | a negative descriptor number; the poller's own descriptor |
//! | `Other` | a poller made before a fork, used in the child before `reinit_after_fork` |
//! | `OutOfMemory` | past the table's slot limit |
//! | `Unsupported` | an arm with `Interest::PRIORITY` on kqueue, or without `READABLE` on io_uring |

use crate::state::KernelError;
use std::io;
use std::os::fd::RawFd;

/// An arm with `Interest::PRIORITY` on a backend that cannot ask for it at all
/// (`offered` false), or not without `READABLE`.
#[cold]
pub(crate) fn priority_unsupported(backend: &'static str, offered: bool) -> io::Error {
    let msg = if offered {
        format!(
            "pollshot arm: Interest::PRIORITY without READABLE is not offered on {backend} \
             (ordinary data takes a POLLPRI-only poll request off the socket's wait queue, \
             and urgent data after it would wake nothing); arm READABLE | PRIORITY"
        )
    } else {
        format!(
            "pollshot arm: Interest::PRIORITY is not offered on {backend} (no filter for \
             urgent data on every kqueue; EVFILT_EXCEPT with NOTE_OOB exists on macOS, \
             OpenBSD and DragonFly only); arm READABLE, and read urgent data inline \
             (SO_OOBINLINE)"
        )
    };
    io::Error::new(io::ErrorKind::Unsupported, msg)
}

/// The `io::Error` for a kernel refusal: the kernel's errno as it came.
pub(crate) fn kernel(e: KernelError) -> io::Error {
    match e {
        KernelError::BadFd => io::Error::from_raw_os_error(libc::EBADF),
        KernelError::NotFound => io::Error::from_raw_os_error(libc::ENOENT),
        KernelError::Exists => io::Error::from_raw_os_error(libc::EEXIST),
        KernelError::NotPollable => io::Error::from_raw_os_error(libc::EPERM),
        KernelError::Other(e) => e,
    }
}

/// The token names no live registration.
pub(crate) fn unknown_token(op: &'static str, token: crate::token::Token) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "pollshot {op}: {token:?} names no live registration (deregistered, \
             superseded by a later registration of the same fd, or never registered)"
        ),
    )
}

/// The poller was made in the parent of a fork and used in the child.
pub(crate) fn forked(op: &'static str) -> io::Error {
    io::Error::other(format!(
        "pollshot {op}: this poller was created before a fork and is used in the child; \
             call Poller::reinit_after_fork first (the kernel instance belongs to the parent)"
    ))
}

/// A negative descriptor number.
pub(crate) fn negative_fd(fd: RawFd) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("pollshot register: fd {fd} is negative, not a descriptor"),
    )
}

/// Classifies an OS error from a registration command: `errno` values the state
/// machine has a row for become their variant, anything else is passed on.
// Only the kernel backends (epoll, kqueue) classify errno values; poll(2)-only
// targets such as illumos have no registration system call.
#[cfg_attr(
    not(any(target_os = "linux", target_os = "android", pollshot_kqueue)),
    allow(dead_code)
)]
pub(crate) fn classify(e: io::Error, not_pollable: &[i32]) -> KernelError {
    match e.raw_os_error() {
        Some(libc::ENOENT) => KernelError::NotFound,
        Some(libc::EEXIST) => KernelError::Exists,
        Some(libc::EBADF) => KernelError::BadFd,
        Some(code) if not_pollable.contains(&code) => KernelError::NotPollable,
        _ => KernelError::Other(e),
    }
}

/// The descriptor is the poller's own (its kernel instance or waker).
pub(crate) fn own_fd(fd: RawFd) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("pollshot register: fd {fd} is this poller's own kernel instance or waker"),
    )
}
