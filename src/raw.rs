//! The raw handle a registration names, and where in the table it lives, per
//! platform: the one place the core learns what a "descriptor" is.
//!
//! - Unix: a descriptor number (`RawFd`), which is its own slot.
//! - Windows: a socket handle (`RawSocket`). Kernel handle values are multiples of
//!   4: the low two bits are tag bits the object manager ignores (wine's server
//!   too, `handle_to_index`), so `h` and `h | 3` name one socket. The slot is the
//!   value divided by 4: dense like descriptor numbers, and a handle written with
//!   tag bits finds the same registration.

#[cfg(unix)]
pub(crate) use std::os::fd::RawFd;

/// A socket handle, named `RawFd` so the core reads the same on every platform.
#[cfg(windows)]
pub(crate) type RawFd = std::os::windows::io::RawSocket;

/// What a registration names, as the poller tells its backend
/// (`Driver::registered`): a descriptor polled for readiness (every Unix
/// descriptor, a socket on Windows), or on Windows a waitable object's handle (an
/// event, a process, a thread...), watched for being signaled. Handle values
/// share one namespace, so a slot holds one kind at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A descriptor (Unix) or socket (Windows), polled for readiness.
    Io,
    /// A waitable object's handle (Windows), watched for being signaled.
    #[cfg(windows)]
    Waitable,
}

/// The error code of a closed descriptor: EBADF on Unix; on Windows Winsock's
/// WSAENOTSOCK (10038), what a closed socket handle answers.
#[cfg(unix)]
pub(crate) const EBADF: i32 = libc::EBADF;
/// The error code of a closed descriptor: Winsock's WSAENOTSOCK (10038), what a
/// closed socket handle answers.
#[cfg(windows)]
pub(crate) const EBADF: i32 = windows_sys::Win32::Networking::WinSock::WSAENOTSOCK;

/// The table slot of `fd`. A value past the table's range gives an index at or
/// past `MAX_SLOTS`, which the table refuses.
#[cfg(unix)]
#[inline(always)]
pub(crate) const fn slot_of(fd: RawFd) -> usize {
    fd as usize
}

/// The descriptor that slot `index` holds (the inverse of [`slot_of`]).
#[cfg(unix)]
#[inline(always)]
pub(crate) const fn fd_at(index: usize) -> RawFd {
    index as RawFd
}

/// The table slot of socket handle `s`: its value divided by 4 (module docs);
/// `usize::MAX` where that does not fit.
#[cfg(windows)]
#[inline(always)]
pub(crate) fn slot_of(s: RawFd) -> usize {
    usize::try_from(s >> 2).unwrap_or(usize::MAX)
}

/// The socket handle that slot `index` holds, without tag bits.
#[cfg(windows)]
#[inline(always)]
pub(crate) const fn fd_at(index: usize) -> RawFd {
    (index as RawFd) << 2
}

#[cfg(all(test, windows))]
mod tests {
    use super::*;

    #[test]
    fn handle_tag_bits_find_one_slot() {
        assert_eq!(slot_of(0x104), 0x41);
        assert_eq!(slot_of(0x107), 0x41);
        assert_eq!(fd_at(slot_of(0x107)), 0x104);
        assert_eq!(slot_of(u64::MAX), (u64::MAX >> 2) as usize);
    }
}
