//! [`AsRawSource`] and [`AsSource`]: what `add`, `modify` and `delete` accept.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

/// A descriptor given by number, for [`Poller::add`](crate::Poller::add): a
/// reference to anything with a raw descriptor (`&TcpStream`), or a `RawFd` itself.
pub trait AsRawSource {
    /// The descriptor number.
    fn raw(&self) -> RawFd;
}

impl<T: AsRawFd> AsRawSource for &T {
    fn raw(&self) -> RawFd {
        self.as_raw_fd()
    }
}

impl AsRawSource for RawFd {
    fn raw(&self) -> RawFd {
        *self
    }
}

/// A borrowed descriptor, for [`Poller::modify`](crate::Poller::modify) and
/// [`Poller::delete`](crate::Poller::delete): implemented for everything that is
/// [`AsFd`].
pub trait AsSource: AsFd {
    /// The borrowed descriptor.
    fn source(&self) -> BorrowedFd<'_> {
        self.as_fd()
    }
}

impl<T: AsFd> AsSource for T {}
