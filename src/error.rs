//! How kernel refusals and misuse become `io::Error`s: the one place the mapping
//! lives. The rules (the kernel's errno as it came; pollshot's own errors with a
//! message) and their tables are in the crate docs' `# Errors` section
//! (`src/lib.rs`), where users see them.

use crate::raw::RawFd;
use crate::state::KernelError;
use std::io;

/// An arm with `Interest::PRIORITY` on a backend that cannot ask for it at all
/// (`offered` false: kqueue, Windows' `afd`, each with its own reason), or not
/// without `READABLE`.
#[cold]
pub(crate) fn priority_unsupported(backend: &'static str, offered: bool) -> io::Error {
    let msg = if offered {
        format!(
            "pollshot arm: Interest::PRIORITY without READABLE is not offered on {backend} \
             (ordinary data takes a POLLPRI-only poll request off the socket's wait queue, \
             and urgent data after it would wake nothing); arm READABLE | PRIORITY"
        )
    } else if backend == "afd" {
        format!(
            "pollshot arm: Interest::PRIORITY is not offered on {backend} (Windows: AFD has \
             a bit for urgent data, AFD_POLL_RECEIVE_EXPEDITED, but how Windows and wine \
             report MSG_OOB data through it is not tested); arm READABLE, and read urgent \
             data inline (SO_OOBINLINE)"
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
        KernelError::BadFd => io::Error::from_raw_os_error(crate::raw::EBADF),
        KernelError::NotFound => io::Error::from_raw_os_error(libc::ENOENT),
        KernelError::Exists => io::Error::from_raw_os_error(libc::EEXIST),
        KernelError::NotPollable => io::Error::from_raw_os_error(libc::EPERM),
        KernelError::Other(e) => e,
    }
}

/// `register_exclusive`: exclusive wake-up is not offered, on any backend.
#[cold]
pub(crate) fn exclusive_unsupported() -> io::Error {
    let why = if cfg!(windows) {
        "Windows: each AFD poll completes for its own poller, and pollshot keeps one \
         poll per registration"
    } else {
        "EPOLLEXCLUSIVE cannot be combined with oneshot re-arming by EPOLL_CTL_MOD"
    };
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "pollshot register_exclusive: exclusive wake-up is not offered ({why}); share \
             one Poller among the accepting threads (each event reaches exactly one \
             deliver call)"
        ),
    )
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
#[cfg(unix)]
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
