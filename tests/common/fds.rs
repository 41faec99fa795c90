//! What the suite's bodies do to descriptors, for two kernels: the host's
//! ([`HostFd`], every suite) and a NetBSD rump kernel's (`RumpFd`,
//! `--cfg pollshot_rump`: `tests/rump_suite.rs`). A body generic over [`Fd`]
//! makes its socketpairs and pipes, reads, writes, shuts down, duplicates and
//! reuses numbers through it, so the same body runs on host descriptors and on
//! NetBSD kernel code. Bodies that need what a rump kernel has not got (TCP,
//! fork, host signals, ttys, `/proc`) stay on host descriptors; `docs/testing.md`
//! lists them and why.

use pollshot::{Backend, Poller, Token};
use std::fmt::Debug;
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// A descriptor of one kernel, owned: closed when dropped. Every descriptor it
/// makes is non-blocking (and close-on-exec on the host).
pub trait Fd: Sized + Send + Sync + Debug + 'static {
    /// Whose descriptors: `"host"` or `"rump"`.
    const KERNEL: &'static str;
    /// Where the bodies' own number ranges start: a test that closes a
    /// registered number and needs it to stay free (or to get it back) uses
    /// `HIGH + 0`, `+ 100`, `+ 200` or `+ 300`, far above what the other tests
    /// running meanwhile open (the kernel hands out the lowest free number).
    /// 3000 on the host; 1000 on the rump kernel, whose table ends at 1772.
    const HIGH: RawFd;

    /// A connected stream socketpair (`AF_UNIX`/`AF_LOCAL`).
    fn socketpair() -> (Self, Self);
    /// A pipe: `(read end, write end)`.
    fn pipe() -> (Self, Self);
    /// The number, in its kernel's table.
    fn raw(&self) -> RawFd;
    /// read(2).
    fn read(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// write(2).
    fn write(&self, buf: &[u8]) -> io::Result<usize>;
    /// shutdown(2).
    fn shutdown(&self, how: Shutdown) -> io::Result<()>;
    /// dup(2).
    fn dup(&self) -> Self;
    /// A duplicate numbered at least `min` (fcntl(2) `F_DUPFD`).
    fn dup_at_least(&self, min: RawFd) -> Self;
    /// dup2(2) of this descriptor onto `target`'s number: `target`'s old
    /// description is closed and its number reused in one step.
    fn dup_onto(&self, target: &mut Self);
    /// poll(2) of this descriptor alone for `events` (`libc::POLLIN`...) for
    /// up to `ms`: the `revents` (0 on a timeout); EINTR is retried.
    fn poll(&self, events: libc::c_short, ms: libc::c_int) -> libc::c_short;
    /// `p.register_with`, for this kernel's number.
    fn register_with<B: Backend>(&self, p: &Poller<B>, key: usize) -> io::Result<Token>;

    /// `p.register`, for this kernel's number.
    fn register<B: Backend>(&self, p: &Poller<B>) -> io::Result<Token> {
        self.register_with(p, 0)
    }

    /// Writes all of `buf` (panics on an error or a short write: the
    /// descriptor has room, as every caller arranges).
    #[track_caller]
    fn write_all(&self, buf: &[u8]) {
        let n = self.write(buf).expect("write");
        assert_eq!(n, buf.len(), "short write");
    }

    /// One read into `buf` (panics on an error): the bytes read.
    #[track_caller]
    fn read_some(&self, buf: &mut [u8]) -> usize {
        self.read(buf).expect("read")
    }

    /// Writes until the descriptor would block; returns the bytes written.
    fn fill(&self) -> usize {
        super::fill(Io(self))
    }

    /// Reads until the descriptor would block or reaches EOF; returns the bytes
    /// read.
    fn drain(&self) -> usize {
        super::drain(Io(self))
    }

    /// Whether a read would block now (nothing buffered, no EOF).
    fn would_block(&self) -> bool {
        super::would_block(Io(self))
    }

    /// Whether a write would block now, without writing: poll(2) with a zero
    /// timeout, independent of the poller under test.
    fn would_block_write(&self) -> bool {
        self.poll(libc::POLLOUT, 0) & libc::POLLOUT == 0
    }

    /// `read_exact` on a non-blocking descriptor: retries `WouldBlock` until
    /// [`LOST_AFTER`](super::LOST_AFTER).
    fn read_exact_retry(&self, buf: &mut [u8]) {
        let deadline = Instant::now() + super::LOST_AFTER;
        let mut at = 0;
        while at < buf.len() {
            match self.read(&mut buf[at..]) {
                Ok(0) => panic!("EOF after {at} bytes"),
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("read: {e}"),
            }
        }
    }
}

/// `std::io`'s view of a descriptor of either kernel, for the host helpers
/// (`fill`, `drain`, `would_block`).
struct Io<'a, D>(&'a D);

impl<D: Fd> io::Read for Io<'_, D> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl<D: Fd> io::Write for Io<'_, D> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A host descriptor.
#[derive(Debug)]
pub struct HostFd(pub OwnedFd);

impl AsFd for HostFd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl Fd for HostFd {
    const KERNEL: &'static str = "host";
    const HIGH: RawFd = 3000;

    fn socketpair() -> (HostFd, HostFd) {
        let (a, b) = super::socketpair();
        (HostFd(a.into()), HostFd(b.into()))
    }

    fn pipe() -> (HostFd, HostFd) {
        let (r, w) = super::pipe();
        (HostFd(r.into()), HostFd(w.into()))
    }

    fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        Ok(rustix::io::read(&self.0, buf)?)
    }

    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        Ok(rustix::io::write(&self.0, buf)?)
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let how = match how {
            Shutdown::Read => libc::SHUT_RD,
            Shutdown::Write => libc::SHUT_WR,
            Shutdown::Both => libc::SHUT_RDWR,
        };
        // SAFETY: shutdown(2) on a descriptor this value owns.
        if unsafe { libc::shutdown(self.raw(), how) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn dup(&self) -> HostFd {
        HostFd(rustix::io::fcntl_dupfd_cloexec(&self.0, 0).expect("F_DUPFD_CLOEXEC"))
    }

    fn dup_at_least(&self, min: RawFd) -> HostFd {
        HostFd(super::high_dup(&self.0, min))
    }

    fn dup_onto(&self, target: &mut HostFd) {
        super::reuse_number(&self.0, &mut target.0);
    }

    fn poll(&self, events: libc::c_short, ms: libc::c_int) -> libc::c_short {
        let mut pfd = libc::pollfd {
            fd: self.raw(),
            events,
            revents: 0,
        };
        loop {
            // SAFETY: one valid pollfd, for the duration of the call.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n >= 0 {
                return pfd.revents;
            }
            let e = io::Error::last_os_error();
            assert_eq!(e.kind(), io::ErrorKind::Interrupted, "poll: {e}");
        }
    }

    fn register_with<B: Backend>(&self, p: &Poller<B>, key: usize) -> io::Result<Token> {
        p.register_with(&self.0, key)
    }
}

#[cfg(pollshot_rump)]
pub use pollshot::rump::RumpFd;

/// A descriptor of the rump kernel (`pollshot::rump`), registered with
/// `register_raw`.
#[cfg(pollshot_rump)]
impl Fd for RumpFd {
    const KERNEL: &'static str = "rump";
    const HIGH: RawFd = 1000;

    fn socketpair() -> (RumpFd, RumpFd) {
        RumpFd::socketpair().expect("rump socketpair")
    }

    fn pipe() -> (RumpFd, RumpFd) {
        RumpFd::pipe().expect("rump pipe")
    }

    fn raw(&self) -> RawFd {
        self.as_raw_fd()
    }

    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        RumpFd::read(self, buf)
    }

    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        RumpFd::write(self, buf)
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        RumpFd::shutdown(self, how)
    }

    fn dup(&self) -> RumpFd {
        self.try_clone().expect("rump dup")
    }

    fn dup_at_least(&self, min: RawFd) -> RumpFd {
        self.try_clone_at_least(min).expect("rump F_DUPFD")
    }

    fn dup_onto(&self, target: &mut RumpFd) {
        RumpFd::dup_onto(self, target).expect("rump dup2");
    }

    fn poll(&self, events: libc::c_short, ms: libc::c_int) -> libc::c_short {
        loop {
            match RumpFd::poll(self, events, ms) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r.expect("rump poll"),
            }
        }
    }

    /// `register_raw`, then `set_key` (before any arm, so every event carries
    /// `key`): pollshot has no `register_raw_with`.
    fn register_with<B: Backend>(&self, p: &Poller<B>, key: usize) -> io::Result<Token> {
        // SAFETY: the number is open (owned by `self`); the poller only passes
        // it to the rump kernel's kevent, and copes with it being closed later.
        let t = unsafe { p.register_raw(self.raw()) }?;
        if key != 0 {
            p.set_key(t, key)?;
        }
        Ok(t)
    }
}
