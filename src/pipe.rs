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

/// Writes one byte to the waker. A full pipe already wakes its reader: not an
/// error. EINTR is retried.
pub(crate) fn wake(w: impl AsFd) -> io::Result<()> {
    match rustix::io::write(&w, &[1]) {
        Ok(_) => Ok(()),
        Err(e) => wake_refused(w, e),
    }
}

/// [`wake`] whose write the kernel refused with `e`: EINTR writes again, and so
/// does an EAGAIN while the pipe has room (poll(2) says `POLLOUT`, which a pipe
/// reports exactly when a write would not answer EAGAIN: `pipe_poll` and
/// `pipe_write` in fs/pipe.c both ask `pipe_full`), so that the byte is written
/// unless the pipe is full (its reader is woken then). No kernel answers EAGAIN
/// with room; a fault injector does (`tests/faults`).
#[cold]
#[inline(never)]
fn wake_refused(w: impl AsFd, mut e: Errno) -> io::Result<()> {
    loop {
        match e {
            Errno::INTR => {}
            Errno::AGAIN => {
                let mut fds = [rustix::event::PollFd::new(
                    &w,
                    rustix::event::PollFlags::OUT,
                )];
                let zero = rustix::event::Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                match rustix::event::poll(&mut fds, Some(&zero)) {
                    Ok(_) if fds[0].revents().contains(rustix::event::PollFlags::OUT) => {}
                    // Full (or the poll itself refused): the reader is woken.
                    _ => return Ok(()),
                }
            }
            e => return Err(e.into()),
        }
        match rustix::io::write(&w, &[1]) {
            Ok(_) => return Ok(()),
            Err(again) => e = again,
        }
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
