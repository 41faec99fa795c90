//! [`AsRawSource`] and [`AsSource`]: what `add`, `modify` and `delete` accept: a
//! descriptor on Unix, a socket on Windows (as polling's).

#[cfg(unix)]
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
#[cfg(windows)]
use std::os::windows::io::{AsRawSocket, AsSocket, BorrowedSocket, RawSocket};

/// A descriptor given by number, for [`Poller::add`](crate::Poller::add): a
/// reference to anything with a raw descriptor (`&TcpStream`), or a `RawFd` itself.
#[cfg(unix)]
pub trait AsRawSource {
    /// The descriptor number.
    fn raw(&self) -> RawFd;
}

#[cfg(unix)]
impl<T: AsRawFd> AsRawSource for &T {
    fn raw(&self) -> RawFd {
        self.as_raw_fd()
    }
}

#[cfg(unix)]
impl AsRawSource for RawFd {
    fn raw(&self) -> RawFd {
        *self
    }
}

/// A borrowed descriptor, for [`Poller::modify`](crate::Poller::modify) and
/// [`Poller::delete`](crate::Poller::delete): implemented for everything that is
/// [`AsFd`].
#[cfg(unix)]
pub trait AsSource: AsFd {
    /// The borrowed descriptor.
    fn source(&self) -> BorrowedFd<'_> {
        self.as_fd()
    }
}

#[cfg(unix)]
impl<T: AsFd> AsSource for T {}

/// A socket given by its handle value, for [`Poller::add`](crate::Poller::add)
/// (Windows): a reference to anything with a raw socket (`&TcpStream`,
/// `&UdpSocket`, `&TcpListener`), or a `RawSocket` itself.
#[cfg(windows)]
pub trait AsRawSource {
    /// The socket's handle value.
    fn raw(&self) -> RawSocket;
}

#[cfg(windows)]
impl<T: AsRawSocket> AsRawSource for &T {
    fn raw(&self) -> RawSocket {
        self.as_raw_socket()
    }
}

#[cfg(windows)]
impl AsRawSource for RawSocket {
    fn raw(&self) -> RawSocket {
        *self
    }
}

/// A borrowed socket, for [`Poller::modify`](crate::Poller::modify) and
/// [`Poller::delete`](crate::Poller::delete) (Windows): implemented for
/// everything that is [`AsSocket`].
#[cfg(windows)]
pub trait AsSource: AsSocket {
    /// The borrowed socket.
    fn source(&self) -> BorrowedSocket<'_> {
        self.as_socket()
    }
}

#[cfg(windows)]
impl<T: AsSocket> AsSource for T {}
