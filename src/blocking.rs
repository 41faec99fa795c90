//! The 1:1 path: one blocking operation on one descriptor, from the calling thread.
//!
//! Where the target has no oneshot multiplexer ([`MULTIPLEXES_ONESHOT`] is false), a
//! runtime can give each blocked operation its own thread instead of sharing one
//! poll(2) set: [`io_once`] tries the operation first (a ready descriptor costs no
//! wait at all), waits with poll(2) on that one descriptor only when the operation
//! says `WouldBlock`, and retries.
//!
//! [`MULTIPLEXES_ONESHOT`]: crate::MULTIPLEXES_ONESHOT

use crate::deadline::Deadline;
use crate::interest::Interest;
use rustix::event::{PollFd, PollFlags};
use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

/// Performs `op` on `fd` (non-blocking), waiting with poll(2) for `interest` each
/// time it fails with `ErrorKind::WouldBlock`, until it succeeds, fails otherwise,
/// or `timeout` passes.
///
/// - `op` is called first without waiting; a ready descriptor costs no poll(2).
/// - `op` failing with `ErrorKind::Interrupted` is retried at once.
/// - `timeout`: `None` waits forever; `Some(d)` gives up after at least `d`
///   (poll(2) counts milliseconds, rounded up) with `ErrorKind::TimedOut`.
///   `Some(Duration::ZERO)` tries once and returns `WouldBlock` if not ready.
/// - A hang-up or error reported by poll(2) is not an error here: `op` runs again
///   and reports what happened (EOF, EPIPE, ECONNRESET).
///
/// # Errors
/// `op`'s error other than `WouldBlock`/`Interrupted`; `ErrorKind::TimedOut` after
/// `timeout`; poll(2)'s error (EINTR is retried; EINVAL, ENOMEM otherwise).
///
/// # Examples
///
/// ```
/// use pollshot::{blocking::io_once, Interest};
/// use std::io::{Read, Write};
/// use std::os::unix::net::UnixStream;
///
/// let (mut a, mut b) = UnixStream::pair()?;
/// b.set_nonblocking(true)?;
/// let writer = std::thread::spawn(move || a.write_all(b"hello"));
/// let mut buf = [0u8; 16];
/// let n = io_once(&b, Interest::READABLE, None, || (&b).read(&mut buf))?;
/// assert!(n > 0);
/// writer.join().unwrap()?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn io_once<F, T, Op>(
    fd: F,
    interest: Interest,
    timeout: Option<Duration>,
    mut op: Op,
) -> io::Result<T>
where
    F: AsFd,
    Op: FnMut() -> io::Result<T>,
{
    let deadline = Deadline::new(timeout);
    let mut flags = PollFlags::empty();
    if interest.is_readable() {
        flags |= PollFlags::IN;
    }
    if interest.is_writable() {
        flags |= PollFlags::OUT;
    }
    loop {
        match op() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            done => return done,
        }
        let left = match deadline {
            Deadline::Now => return Err(io::ErrorKind::WouldBlock.into()),
            _ if deadline.passed() => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "pollshot io_once: timed out waiting for readiness",
                ))
            }
            // poll(2) counts milliseconds in an int: clamp, and the loop goes on.
            _ => deadline
                .left()
                .map(|t| t.min(Duration::from_millis(i32::MAX as u64))),
        };
        let ts = left.map(|t| rustix::event::Timespec {
            tv_sec: t.as_secs() as _,
            tv_nsec: t.subsec_nanos() as _,
        });
        let mut fds = [PollFd::new(&fd, flags)];
        match rustix::event::poll(&mut fds, ts.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}
