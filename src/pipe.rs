//! The self-pipe used as a waker where no eventfd or `EVFILT_USER` exists.

use rustix::fd::{AsFd, OwnedFd};
use rustix::io::Errno;
use std::io;

/// A pipe whose both ends are non-blocking and close-on-exec: `(read, write)`.
///
/// pipe(2) then fcntl(2): `pipe2` is missing on Apple targets, and this is not on
/// any hot path (once per poller).
pub(crate) fn nonblocking_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = rustix::pipe::pipe()?;
    for fd in [&r, &w] {
        rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC)?;
        let flags = rustix::fs::fcntl_getfl(fd)?;
        rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)?;
    }
    Ok((r, w))
}

/// Writes one byte to the waker. A full pipe already wakes its reader: not an error.
pub(crate) fn wake(w: impl AsFd) -> io::Result<()> {
    match rustix::io::write(w, &[1]) {
        Ok(_) | Err(Errno::AGAIN) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Reads the waker empty (one read unless more than 64 bytes were queued).
pub(crate) fn drain(r: impl AsFd) -> u64 {
    let mut buf = [0u8; 64];
    let mut reads = 0;
    loop {
        reads += 1;
        match rustix::io::read(&r, &mut buf) {
            Ok(n) if n == buf.len() => continue,
            Err(Errno::INTR) => continue,
            _ => return reads,
        }
    }
}
