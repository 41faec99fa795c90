//! The Windows part of [`Poller`]'s API: registering sockets and waitable
//! handles, and posting completion packets.

use super::Poller;
use crate::backend::Backend;
use crate::interest::Interest;
use crate::raw::{Kind, RawFd};
use crate::token::Token;
use std::io;
use std::os::windows::io::{AsHandle, AsRawHandle, AsRawSocket, AsSocket, RawHandle, RawSocket};

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
    /// Unix. [`set_key`](Self::set_key) changes it.
    ///
    /// # The guarantee: a key is never stale
    ///
    /// An event carries the key its registration had when `deliver` accepted
    /// the completion, and `deliver` accepts a completion only for the
    /// registration's current arming (its slot and generation ride in the
    /// completion), under the registration's lock. A completion of an earlier
    /// registration of the same handle value, or of a poll that a
    /// [`deregister`](Self::deregister), [`disarm`](Self::disarm) or re-arm
    /// cancelled or replaced, is dropped as stale. So after `deregister(token)`
    /// returns, no `deliver` returns this registration's key, and a runtime may
    /// keep a pointer to its per-connection state in the key, alive until
    /// `deregister` returns. One rule: a thread that deregisters a registration
    /// that is still armed cannot know whether another thread's `deliver` has
    /// just accepted its event, so it hands the state over (a reference count, or
    /// a message to the thread that will see the event) instead of freeing it.
    ///
    /// # Errors
    /// As `register`.
    pub fn register_with<S: AsSocket + ?Sized>(&self, socket: &S, key: usize) -> io::Result<Token> {
        // SAFETY: a borrowed socket is open for the length of this call.
        unsafe { self.insert_socket(socket.as_socket().as_raw_socket(), key) }
    }

    /// Exclusive wake-up for a listening socket shared by several pollers or
    /// processes (epoll's `EPOLLEXCLUSIVE`): not offered, always an error, as on
    /// Unix. It exists on Windows so that portable code needs no `cfg`; share one
    /// poller among the accepting threads instead: each completion reaches
    /// exactly one thread that called [`deliver`](Self::deliver).
    ///
    /// # Errors
    /// Always `ErrorKind::Unsupported`, saying the above.
    pub fn register_exclusive<S: AsSocket + ?Sized>(&self, socket: &S) -> io::Result<Token> {
        let _ = socket.as_socket();
        Err(crate::error::exclusive_unsupported())
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

    /// Queues one completion packet on the poller's completion port (Windows:
    /// `PostQueuedCompletionStatus`): exactly one [`deliver`](Self::deliver)
    /// returns it, as one [`Event`](crate::Event) with
    /// [`is_posted`](crate::Event::is_posted) true, [`key`](crate::Event::key)
    /// `key`, and [`is_readable`](crate::Event::is_readable) and
    /// [`is_writable`](crate::Event::is_writable) as `interest` says (nothing
    /// else set). It belongs to no registration: its token names none (`arm`,
    /// `disarm` and `deregister` refuse it with `ErrorKind::NotFound`), and it is
    /// never dropped as stale. Posts never merge: `k` posts are `k` events, each
    /// to one waiter, in the port's order; a post made while no thread waits is
    /// kept for the next `deliver`. They are not notifies: a post never sets
    /// [`Events::is_notified`](crate::Events::is_notified), and a
    /// [`notify`](Self::notify) never becomes an event.
    ///
    /// What `polling::os::iocp::CompletionPacket` with `PollerIocpExt::post`
    /// do. Not counted in [`Stats`](crate::Stats).
    ///
    /// # Errors
    /// - `ErrorKind::InvalidInput`: `interest` has
    ///   [`Interest::PRIORITY`] (a posted packet carries readable and writable
    ///   only); nothing is posted.
    /// - the kernel's error from PostQueuedCompletionStatus (not expected:
    ///   ERROR_NO_SYSTEM_RESOURCES when nonpaged memory runs out).
    pub fn post(&self, key: usize, interest: Interest) -> io::Result<()> {
        self.check_fork("post")?;
        if interest.is_priority() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "pollshot post: a posted packet carries readable and writable only, not \
                 Interest::PRIORITY",
            ));
        }
        self.backend.post(key, interest)
    }

    /// Adds a waitable object's handle to the table, not yet armed (Windows):
    /// an event, a process (a child's exit), a thread, a semaphore, a mutex, a
    /// waitable timer. What `polling`'s `PollerIocpExt::add_waitable` does, for
    /// async-io's `Waitable` and async-process's child handles.
    ///
    /// The registration is oneshot like a socket's: [`arm`](Self::arm) with
    /// [`Interest::READABLE`] starts one wait on the object, and when it is
    /// signaled exactly one readable event is delivered (with `key`); nothing
    /// more comes until it is armed again, when a manual-reset event still set,
    /// or a process that has exited, is reported again at once.
    /// [`disarm`](Self::disarm) stops the reports: nothing is delivered until the
    /// next arm. A signal is never lost to a disarm: the wait stays in the
    /// pool, and a signal it takes while disarmed (or took just before the
    /// disarm, for the arming it ended) is kept and reported by the next arm,
    /// at once. So a disarmed registration still takes at most one signal from
    /// its object (an auto-reset event's, a semaphore's count); deregister to
    /// stop that. [`deregister`](Self::deregister) cancels the wait and has
    /// taken effect when it returns: no event of it is delivered after that,
    /// and the handle can be closed at once; a signal its wait took and no
    /// delivery reported is consumed. An event of an older arming is dropped as
    /// stale, by its generation, as a socket's.
    ///
    /// The wait is the thread pool's (`RegisterWaitForSingleObject` with
    /// `WT_EXECUTEONLYONCE`, its callback posting to the completion port;
    /// `backends/windows/wait.rs` says why), so what satisfies it, and what it
    /// consumes, is `WaitForSingleObject`'s: an auto-reset event is reset and a
    /// semaphore decremented by the wait, and a mutex is then owned by the
    /// pool's thread (do not register mutexes you mean to release).
    ///
    /// Cost: `register_waitable` makes two checks, that the handle is not a
    /// socket's (getsockopt `SO_TYPE`) and that it can be waited on
    /// (`WaitForMultipleObjects` for it and an event never set, with a zero
    /// timeout: it consumes nothing), not counted in [`Stats`](crate::Stats);
    /// the first arm duplicates the handle (DuplicateHandle: the poller waits
    /// on a handle of its own, so a handle the caller closes while armed
    /// leaves no wait on its number; the duplicate is closed a second after
    /// the registration ends, by a thread of the process's, since under wine
    /// the pool may still wait on its value for a moment), an arm is
    /// one RegisterWaitForSingleObject, and a re-arm after a delivery and a
    /// deregister of a registration whose wait was started are one
    /// UnregisterWaitEx more; a disarm costs no call, a re-arm after it none
    /// (the disarmed wait serves it) or, when it reports a kept signal, one
    /// UnregisterWaitEx and one PostQueuedCompletionStatus; each a `ctl_call`.
    /// The token's
    /// [`index`](Token::index) is the handle value divided by 4, as a
    /// socket's: handles and sockets share the value space, so a waitable
    /// handle and a socket never share a slot.
    ///
    /// `handle` is borrowed for this call only: it should stay open until the
    /// first [`arm`](Self::arm), which duplicates it (an arm that finds it
    /// closed fails with `ErrorKind::InvalidInput`, and the registration stays,
    /// unarmed). After that the poller waits on its duplicate: closing
    /// `handle` while armed is safe and leaves the object signalable until
    /// `deregister`, and the value's next owner is never waited on. A
    /// registration of a handle value that is registered already supersedes
    /// the old one.
    ///
    /// # Errors
    /// - `ErrorKind::InvalidInput`: `handle` cannot be waited on: it is closed,
    ///   not a handle, or of an object that has no signaled state (a file
    ///   mapping, a registry key: `WaitForMultipleObjects` answers
    ///   `ERROR_INVALID_HANDLE`), or it is the poller's own completion port or
    ///   AFD handle, or its value is past the table's range (a pseudo-handle
    ///   such as `GetCurrentProcess()`'s: duplicate it first).
    /// - `ErrorKind::InvalidInput`: `handle` is a socket's (getsockopt
    ///   `SO_TYPE` answers for it): sockets are registered with
    ///   [`register`](Self::register).
    /// - `ErrorKind::PermissionDenied`: the handle lacks `SYNCHRONIZE` access
    ///   (`ERROR_ACCESS_DENIED`).
    ///
    /// [`arm`](Self::arm) of a waitable registration with any interest but
    /// `Interest::READABLE` fails with `ErrorKind::InvalidInput`, changing
    /// nothing.
    pub fn register_waitable<H: AsHandle + ?Sized>(
        &self,
        handle: &H,
        key: usize,
    ) -> io::Result<Token> {
        // SAFETY: a borrowed handle is open for the length of this call.
        unsafe { self.register_waitable_raw(handle.as_handle().as_raw_handle(), key) }
    }

    /// [`register_waitable`](Self::register_waitable) for a raw handle.
    ///
    /// # Errors
    /// As `register_waitable`.
    ///
    /// # Safety
    /// `handle` must be an open handle when this is called. The poller never
    /// closes it, nor reads or writes the object; the thread pool waits on the
    /// poller's duplicate of it (made at the first arm), never on `handle`
    /// itself, so closing it later is no misuse.
    pub unsafe fn register_waitable_raw(&self, handle: RawHandle, key: usize) -> io::Result<Token> {
        self.check_fork("register_waitable")?;
        let value = handle as usize as RawFd;
        if self.backend.owns_fd(value) {
            return Err(crate::error::own_fd(value));
        }
        // A socket handle can be waited on (a file object), but what signals it
        // is no readiness: sockets are registered with `register`.
        if crate::afd_backend::check_socket(value).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "pollshot register_waitable: handle {value:#x} is a socket (getsockopt \
                     SO_TYPE answers): register it with `register`"
                ),
            ));
        }
        if let Err(e) = crate::afd_backend::check_waitable(handle) {
            let code = e.raw_os_error();
            let kind = if code == Some(5) {
                io::ErrorKind::PermissionDenied
            } else {
                io::ErrorKind::InvalidInput
            };
            return Err(io::Error::new(
                kind,
                format!(
                    "pollshot register_waitable: handle {value:#x} cannot be waited on \
                     (WaitForMultipleObjects: {e}): closed, not a handle, an object with no \
                     signaled state, or without SYNCHRONIZE access"
                ),
            ));
        }
        self.insert_as(value, key, Kind::Waitable)
    }
}
