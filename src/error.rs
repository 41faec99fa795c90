//! How kernel refusals and misuse become `io::Error`s with a clear kind and message.

use crate::state::KernelError;
use std::fmt;
use std::io;
use std::os::fd::RawFd;

/// An operation on a descriptor that the kernel refused; the `io::Error`'s payload.
#[derive(Debug)]
struct OpError {
    op: &'static str,
    fd: RawFd,
    source: io::Error,
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pollshot {} on fd {}: {}", self.op, self.fd, self.source)
    }
}

impl std::error::Error for OpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// The `io::Error` for a kernel refusal during `op` on `fd`.
///
/// EBADF (the number is not open) is `InvalidInput`; ENOENT left over after the
/// fallbacks is `NotFound`; anything else keeps the kind of the OS error, which
/// stays reachable as the error's `source()`.
pub(crate) fn kernel(op: &'static str, fd: RawFd, e: KernelError) -> io::Error {
    let (kind, source) = match e {
        KernelError::BadFd => (
            io::ErrorKind::InvalidInput,
            io::Error::from_raw_os_error(libc::EBADF),
        ),
        KernelError::NotFound => (
            io::ErrorKind::NotFound,
            io::Error::from_raw_os_error(libc::ENOENT),
        ),
        KernelError::Exists => (
            io::ErrorKind::AlreadyExists,
            io::Error::from_raw_os_error(libc::EEXIST),
        ),
        KernelError::NotPollable => (
            io::ErrorKind::Unsupported,
            io::Error::from_raw_os_error(libc::EPERM),
        ),
        KernelError::Other(e) => (e.kind(), e),
    };
    io::Error::new(kind, OpError { op, fd, source })
}

/// The token names no live registration.
pub(crate) fn unknown_token(op: &'static str, token: crate::Token) -> io::Error {
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
