//! Descriptors of a NetBSD rump kernel, for `--cfg pollshot_rump` builds only:
//! NetBSD 7.99's kernel code booted in this process (the kqueue backend's
//! kernel there, `sys_rump.rs`), and the pipes and `AF_LOCAL` sockets the
//! crate's tests, benches and main job register with it.
//!
//! A rump descriptor is a number in the rump kernel's table, not the host's: it
//! is registered with [`Poller::register_raw`](crate::Poller::register_raw)
//! (never with a host descriptor's `register`), and read, written, shut down,
//! duplicated and closed with the rump kernel's system calls, which
//! [`RumpFd`] makes. The kernel boots on first use ([`boot`]; a poller of the
//! kqueue backend boots it too). Its errno values are NetBSD's; every error
//! here carries the host's value for the same error (`io::Error::raw_os_error`
//! compares with `libc::EBADF` as on the host).
//!
//! What a rump kernel cannot stand in for (no fork, no host signals, no TCP
//! without `rumpnet_net`) is listed in `docs/testing.md`.

use libc::{c_int, c_short, c_void, size_t, ssize_t};
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{OnceLock, RwLock, RwLockReadGuard};

// The rump kernel's entry points (librump: `<rump/rump.h>`, and
// `<rump/rump_syscalls.h>`, which renames each `rump_sys_NAME` to the symbol
// named here). Linked by build.rs (`POLLSHOT_RUMP_DIR`), so `cargo check` works
// without the libraries.
extern "C" {
    fn rump_init() -> c_int;
    #[link_name = "rump___sysimpl_pipe2"]
    fn rump_sys_pipe2(fds: *mut c_int, flags: c_int) -> c_int;
    #[link_name = "rump___sysimpl_socketpair"]
    fn rump_sys_socketpair(domain: c_int, kind: c_int, protocol: c_int, sv: *mut c_int) -> c_int;
    #[link_name = "rump___sysimpl_read"]
    fn rump_sys_read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t;
    #[link_name = "rump___sysimpl_write"]
    fn rump_sys_write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t;
    #[link_name = "rump___sysimpl_close"]
    fn rump_sys_close(fd: c_int) -> c_int;
    #[link_name = "rump___sysimpl_dup"]
    fn rump_sys_dup(fd: c_int) -> c_int;
    #[link_name = "rump___sysimpl_dup2"]
    fn rump_sys_dup2(from: c_int, to: c_int) -> c_int;
    #[link_name = "rump___sysimpl_fcntl"]
    fn rump_sys_fcntl(fd: c_int, cmd: c_int, arg: c_int) -> c_int;
    #[link_name = "rump___sysimpl_shutdown"]
    fn rump_sys_shutdown(fd: c_int, how: c_int) -> c_int;
    #[link_name = "rump___sysimpl_poll"]
    fn rump_sys_poll(fds: *mut libc::pollfd, nfds: u32, timeout: c_int) -> c_int;
    #[link_name = "rump___sysimpl_getrlimit"]
    fn rump_sys_getrlimit(which: c_int, rlp: *mut [u64; 2]) -> c_int;
    #[link_name = "rump___sysimpl_setrlimit"]
    fn rump_sys_setrlimit(which: c_int, rlp: *const [u64; 2]) -> c_int;
}

// NetBSD's values (`sys/sys/fcntl.h`, `sys/sys/socket.h`, `sys/sys/resource.h`).
// poll(2)'s bits are the same numbers as Linux's (`sys/sys/poll.h`).
const O_NONBLOCK: c_int = 0x4;
const AF_LOCAL: c_int = 1;
const SOCK_STREAM: c_int = 1;
const SOCK_NONBLOCK: c_int = 0x2000_0000;
const F_DUPFD: c_int = 0;
const RLIMIT_NOFILE: c_int = 8;

/// Held shared by every call here that makes a descriptor (and by the kqueue
/// backend's, `sys_rump.rs`), exclusively by [`RumpFd::dup_onto`]: NetBSD
/// 7.99's dup2(2) is not atomic against other threads' opens. `fd_dup2`
/// (`kern_descrip.c`) closes the target number, leaves `fd_lock`, and takes it
/// again to claim the number; an open by another thread in between is handed
/// that number, and `fd_dup2`, finding it used, closes that new descriptor too
/// and puts its own file there (the other thread's kqueue then named a socket:
/// `kevent` answered EBADF in 4 of 33 runs of `tests/rump_suite.rs`, three at
/// a time).
static NUMBERS: RwLock<()> = RwLock::new(());

/// A shared hold on [`NUMBERS`], for a call that makes a descriptor.
pub(super) fn making() -> RwLockReadGuard<'static, ()> {
    NUMBERS
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Boots the rump kernel, once per process; later calls return the first
/// one's outcome. Also raises the rump process's descriptor limit to its
/// maximum (NetBSD's default soft limit, 128 descriptors, is shared by every
/// thread of this process that makes rump descriptors).
///
/// The kernel gets the number of virtual CPUs that the environment variable
/// `RUMP_NCPU` names (read by librumpuser at boot). The project's
/// `.cargo/config.toml` sets it to 1 for every command cargo runs, and this
/// function refuses to boot where it is unset: with two or more, a
/// deregistration can wedge the whole rump kernel. NetBSD 7.99's
/// `knote_detach` (`kern_event.c`) busy-waits, holding the descriptor table's
/// `fd_lock`, for a knote that a concurrent `kqueue_scan` marked busy while it
/// runs the filter; a rump kernel's spin-waiting thread keeps its virtual CPU,
/// and the scanning thread, once it has given its CPU up on a contended lock,
/// can wait for exactly that CPU forever. Every later call that opens or closes
/// a descriptor then waits for `fd_lock` (docs/testing.md, "On NetBSD kernel
/// code", says what this costs the tests).
///
/// # Errors
/// - `InvalidInput` where `RUMP_NCPU` is unset (run the test binary through
///   cargo, or set `RUMP_NCPU=1`);
/// - `rump_init` failed: its errno (the host's value).
pub fn boot() -> io::Result<()> {
    static BOOTED: OnceLock<Result<(), i32>> = OnceLock::new();
    if BOOTED.get().is_none() && std::env::var_os("RUMP_NCPU").is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the rump kernel was not booted: RUMP_NCPU is unset (set RUMP_NCPU=1, as the \
             project's .cargo/config.toml does for cargo's commands: with more than one \
             virtual CPU a deregistration can wedge the whole rump kernel)",
        ));
    }
    let r = BOOTED.get_or_init(|| {
        // SAFETY: rump_init takes no argument; called once (`OnceLock`).
        let e = unsafe { rump_init() };
        if e != 0 {
            return Err(host_errno(e));
        }
        let mut lim = [0u64; 2];
        // SAFETY: getrlimit/setrlimit(2) with a `struct rlimit` (two 64-bit
        // values on NetBSD) that lives across the calls.
        unsafe {
            if rump_sys_getrlimit(RLIMIT_NOFILE, &mut lim) == 0 && lim[0] < lim[1] {
                lim[0] = lim[1];
                rump_sys_setrlimit(RLIMIT_NOFILE, &lim);
            }
        }
        Ok(())
    });
    r.map_err(io::Error::from_raw_os_error)
}

/// The host's errno for NetBSD's `e` (`sys/sys/errno.h`). 1 to 34 are the same
/// numbers as Linux's but for 11 (EDEADLK; Linux's 11 is EAGAIN); the rest
/// differ, and a value the host has no name for becomes EIO.
pub(super) fn host_errno(e: i32) -> i32 {
    /// NetBSD's 35 to 96, in order.
    const FROM_35: [i32; 62] = [
        libc::EAGAIN,
        libc::EINPROGRESS,
        libc::EALREADY,
        libc::ENOTSOCK,
        libc::EDESTADDRREQ,
        libc::EMSGSIZE,
        libc::EPROTOTYPE,
        libc::ENOPROTOOPT,
        libc::EPROTONOSUPPORT,
        libc::ESOCKTNOSUPPORT,
        libc::EOPNOTSUPP,
        libc::EPFNOSUPPORT,
        libc::EAFNOSUPPORT,
        libc::EADDRINUSE,
        libc::EADDRNOTAVAIL,
        libc::ENETDOWN,
        libc::ENETUNREACH,
        libc::ENETRESET,
        libc::ECONNABORTED,
        libc::ECONNRESET,
        libc::ENOBUFS,
        libc::EISCONN,
        libc::ENOTCONN,
        libc::ESHUTDOWN,
        libc::ETOOMANYREFS,
        libc::ETIMEDOUT,
        libc::ECONNREFUSED,
        libc::ELOOP,
        libc::ENAMETOOLONG,
        libc::EHOSTDOWN,
        libc::EHOSTUNREACH,
        libc::ENOTEMPTY,
        libc::EIO, // EPROCLIM
        libc::EUSERS,
        libc::EDQUOT,
        libc::ESTALE,
        libc::EREMOTE,
        libc::EIO, // EBADRPC
        libc::EIO, // ERPCMISMATCH
        libc::EIO, // EPROGUNAVAIL
        libc::EIO, // EPROGMISMATCH
        libc::EIO, // EPROCUNAVAIL
        libc::ENOLCK,
        libc::ENOSYS,
        libc::EIO, // EFTYPE
        libc::EIO, // EAUTH
        libc::EIO, // ENEEDAUTH
        libc::EIDRM,
        libc::ENOMSG,
        libc::EOVERFLOW,
        libc::EILSEQ,
        libc::ENOTSUP,
        libc::ECANCELED,
        libc::EBADMSG,
        libc::ENODATA,
        libc::ENOSR,
        libc::ENOSTR,
        libc::ETIME,
        libc::ENODATA, // ENOATTR
        libc::EMULTIHOP,
        libc::ENOLINK,
        libc::EPROTO,
    ];
    match e {
        11 => libc::EDEADLK,
        0..=34 => e,
        35..=96 => FROM_35[(e - 35) as usize],
        _ => libc::EIO,
    }
}

/// The error of a failed rump system call: its errno (NetBSD's, which
/// `rumpuser_seterrno` leaves in the host's errno) as the host's.
pub(super) fn last_error() -> io::Error {
    let e = io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO);
    io::Error::from_raw_os_error(host_errno(e))
}

/// A system call's `-1` as [`last_error`], anything else as its value.
fn check(r: c_int) -> io::Result<c_int> {
    if r < 0 {
        Err(last_error())
    } else {
        Ok(r)
    }
}

/// An open descriptor of the rump kernel, closed with its close(2) when
/// dropped. Reads and writes go to the rump kernel (`Read` and `Write` are
/// implemented for `RumpFd` and `&RumpFd`); its number is
/// [`as_raw_fd`](AsRawFd::as_raw_fd), for `Poller::register_raw` and the rump
/// kernel's calls, never for the host's.
#[derive(Debug)]
pub struct RumpFd(RawFd);

impl RumpFd {
    /// A connected `AF_LOCAL` stream socketpair (socketpair(2)), both ends
    /// non-blocking. Boots the kernel first ([`boot`]).
    ///
    /// # Errors
    /// The boot's, or socketpair(2)'s (EMFILE past the descriptor limit).
    pub fn socketpair() -> io::Result<(RumpFd, RumpFd)> {
        boot()?;
        let mut fds = [-1; 2];
        let _making = making();
        // SAFETY: socketpair(2) writes two descriptors into `fds`.
        check(unsafe {
            rump_sys_socketpair(AF_LOCAL, SOCK_STREAM | SOCK_NONBLOCK, 0, fds.as_mut_ptr())
        })?;
        Ok((RumpFd(fds[0]), RumpFd(fds[1])))
    }

    /// A pipe (pipe2(2)), `(read end, write end)`, both non-blocking. Boots the
    /// kernel first ([`boot`]).
    ///
    /// # Errors
    /// The boot's, or pipe2(2)'s.
    pub fn pipe() -> io::Result<(RumpFd, RumpFd)> {
        boot()?;
        let mut fds = [-1; 2];
        let _making = making();
        // SAFETY: pipe2(2) writes two descriptors into `fds`.
        check(unsafe { rump_sys_pipe2(fds.as_mut_ptr(), O_NONBLOCK) })?;
        Ok((RumpFd(fds[0]), RumpFd(fds[1])))
    }

    /// Takes ownership of rump descriptor `fd`.
    ///
    /// # Safety
    /// `fd` is an open descriptor of the rump kernel that nothing else closes.
    pub unsafe fn from_raw(fd: RawFd) -> RumpFd {
        RumpFd(fd)
    }

    /// Gives up ownership: the number stays open, and is returned.
    pub fn into_raw(self) -> RawFd {
        let fd = self.0;
        std::mem::forget(self);
        fd
    }

    /// read(2): the bytes read into `buf` (0 at end of file).
    ///
    /// # Errors
    /// `WouldBlock` (EAGAIN) when nothing is there, or read(2)'s other errors.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: at most `buf.len()` bytes into `buf`.
        let n = unsafe { rump_sys_read(self.0, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(last_error());
        }
        Ok(n as usize)
    }

    /// write(2): the bytes of `buf` written.
    ///
    /// # Errors
    /// `WouldBlock` (EAGAIN) when there is no room, EPIPE when the reader is
    /// gone, or write(2)'s other errors.
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: `buf` is live for the call.
        let n = unsafe { rump_sys_write(self.0, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(last_error());
        }
        Ok(n as usize)
    }

    /// shutdown(2) of a socket's reading side, writing side or both.
    ///
    /// # Errors
    /// shutdown(2)'s: ENOTSOCK for a pipe, ENOTCONN.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let how = match how {
            Shutdown::Read => 0,
            Shutdown::Write => 1,
            Shutdown::Both => 2,
        };
        // SAFETY: shutdown(2) takes the number and a constant.
        check(unsafe { rump_sys_shutdown(self.0, how) }).map(drop)
    }

    /// A duplicate (dup(2)): a new number for the same open file.
    ///
    /// # Errors
    /// dup(2)'s (EMFILE).
    pub fn try_clone(&self) -> io::Result<RumpFd> {
        let _making = making();
        // SAFETY: dup(2) takes the number; the new one is owned by the result.
        check(unsafe { rump_sys_dup(self.0) }).map(RumpFd)
    }

    /// A duplicate numbered at least `min` (fcntl(2) `F_DUPFD`).
    ///
    /// # Errors
    /// fcntl(2)'s: EINVAL for a `min` past the descriptor limit, EMFILE.
    pub fn try_clone_at_least(&self, min: RawFd) -> io::Result<RumpFd> {
        let _making = making();
        // SAFETY: F_DUPFD takes the number and an integer; the new number is
        // owned by the result.
        check(unsafe { rump_sys_fcntl(self.0, F_DUPFD, min) }).map(RumpFd)
    }

    /// Makes `target`'s number name this descriptor's open file (dup2(2)): the
    /// old file of `target` is closed and the number reused in one step. No
    /// descriptor is made through this module meanwhile: the rump kernel's
    /// dup2 could close it (see `NUMBERS` in this module's source); an open
    /// made with the rump kernel's calls directly is not held off.
    ///
    /// # Errors
    /// dup2(2)'s.
    pub fn dup_onto(&self, target: &mut RumpFd) -> io::Result<()> {
        let _alone = NUMBERS
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // SAFETY: both numbers are open and owned by the two values.
        check(unsafe { rump_sys_dup2(self.0, target.0) }).map(drop)
    }

    /// poll(2) of this descriptor for `events` (`libc::POLLIN`...: NetBSD's
    /// bits are the same numbers) for up to `timeout_ms` (-1: no limit): the
    /// `revents` (0 on a timeout).
    ///
    /// # Errors
    /// poll(2)'s (EINTR).
    pub fn poll(&self, events: c_short, timeout_ms: c_int) -> io::Result<c_short> {
        let mut pfd = libc::pollfd {
            fd: self.0,
            events,
            revents: 0,
        };
        // SAFETY: one `struct pollfd` (the same layout on NetBSD), live for the
        // call.
        check(unsafe { rump_sys_poll(&mut pfd, 1, timeout_ms) })?;
        Ok(pfd.revents)
    }
}

impl AsRawFd for RumpFd {
    /// The rump kernel's number (not a host descriptor).
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

impl Drop for RumpFd {
    fn drop(&mut self) {
        // SAFETY: the number is this value's own, closed once, here.
        unsafe { rump_sys_close(self.0) };
    }
}

impl io::Read for &RumpFd {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        RumpFd::read(self, buf)
    }
}

impl io::Write for &RumpFd {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        RumpFd::write(self, buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl io::Read for RumpFd {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        RumpFd::read(self, buf)
    }
}

impl io::Write for RumpFd {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        RumpFd::write(self, buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
