//! The Windows part of [`Poller`]'s API: registering sockets.

use super::Poller;
use crate::backend::Backend;
use crate::token::Token;
use std::io;
use std::os::windows::io::{AsRawSocket, AsSocket, RawSocket};

impl<B: Backend> Poller<B> {
    /// Adds `socket` to the table, not yet armed (Windows). One system call, the
    /// check that it is a socket (getsockopt `SO_TYPE`), not counted in
    /// [`Stats`](crate::Stats); the kernel learns of it at the first
    /// [`arm`](Self::arm).
    ///
    /// `socket` is borrowed for this call only, as on Unix: it should stay open
    /// until [`deregister`](Self::deregister), and a registration of a handle
    /// value that is registered already supersedes the old one. The token's
    /// [`index`](Token::index) is the handle value divided by 4 (handle values
    /// are multiples of 4; the two low bits are tag bits the kernel ignores).
    ///
    /// # Errors
    /// - `ErrorKind::InvalidInput`: `socket` is not a socket (WSAENOTSOCK from
    ///   getsockopt: a file, a pipe, a closed handle), or it is the poller's own
    ///   AFD handle or completion port.
    /// - Winsock's error from getsockopt otherwise (WSANOTINITIALISED where
    ///   Winsock cannot start: not expected).
    pub fn register<S: AsSocket + ?Sized>(&self, socket: &S) -> io::Result<Token> {
        self.register_with(socket, 0)
    }

    /// [`register`](Self::register) with a key of the caller's that every event
    /// of this registration carries ([`Event::key`](crate::Event::key)), as on
    /// Unix (see the Unix `register_with` for the guarantee: the key is never
    /// delivered with an event of an earlier or later registration).
    ///
    /// # Errors
    /// As `register`.
    pub fn register_with<S: AsSocket + ?Sized>(&self, socket: &S, key: usize) -> io::Result<Token> {
        // SAFETY: a borrowed socket is open for the length of this call.
        unsafe { self.insert_socket(socket.as_socket().as_raw_socket(), key) }
    }

    /// [`register`](Self::register) for a raw socket handle (Windows).
    ///
    /// # Errors
    /// As `register`.
    ///
    /// # Safety
    /// `socket` must be an open handle when this is called. The poller only
    /// passes its value to Winsock's queries (`SO_TYPE`, `SIO_BASE_HANDLE`) and, as the base
    /// handle, to AFD poll requests (never reads, writes or closes it), and copes
    /// with it being closed later, as `register` documents.
    pub unsafe fn register_raw(&self, socket: RawSocket) -> io::Result<Token> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.insert_socket(socket, 0) }
    }

    /// `register_raw` with a key.
    ///
    /// # Safety
    /// As `register_raw`.
    unsafe fn insert_socket(&self, socket: RawSocket, key: usize) -> io::Result<Token> {
        self.check_fork("register")?;
        if self.backend.owns_fd(socket) {
            return Err(crate::error::own_fd(socket));
        }
        if let Err(e) = crate::afd_backend::check_socket(socket) {
            if e.raw_os_error() == Some(windows_sys::Win32::Networking::WinSock::WSAENOTSOCK) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "pollshot register: handle {socket:#x} is not a socket (getsockopt \
                         SO_TYPE: WSAENOTSOCK); AFD polls sockets only"
                    ),
                ));
            }
            return Err(e);
        }
        self.insert(socket, key)
    }
}
