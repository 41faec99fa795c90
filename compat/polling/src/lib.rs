//! polling 3.x's public API over [pollshot](../pollshot/index.html): a drop-in for
//! `[patch.crates-io]`, so that programs on async-io (smol, async-std, async-net,
//! async-process) run on pollshot's persistent oneshot registrations.
//!
//! ```toml
//! [patch.crates-io]
//! polling = { path = "<pollshot>/compat/polling" }
//! ```
//!
//! The API is polling 3.11's: [`Poller`] (`add`, `add_with_mode`, `modify`,
//! `modify_with_mode`, `delete`, `wait`, `wait_deadline`, `notify`,
//! `supports_level`, `supports_edge`), [`Event`], [`Events`], [`PollMode`],
//! [`AsRawSource`], [`AsSource`], on the kqueue targets `os::kqueue` (signal,
//! process and timer filters), and on Windows `os::iocp` (posted packets and
//! waitable handles). What differs is listed on [`Poller`]: several threads may
//! wait at once, the edge modes are refused, `Level` is emulated.
//!
//! How a polling call becomes pollshot calls:
//!
//! | polling | pollshot | epoll system calls |
//! |---|---|---|
//! | `add(fd, Event::none(k))` | `register` | none |
//! | `add(fd, interest)`, `modify(fd, interest)` | `arm(token, interest)` | one `EPOLL_CTL_MOD` (the first: ADD); none if still armed |
//! | `modify(fd, Event::none(k))` | `disarm(token)` | one MOD if armed, else none |
//! | `delete(fd)` | `deregister(token)` | one `EPOLL_CTL_DEL` if ever armed |
//! | `wait(events, timeout)` | `deliver` | one `epoll_wait`/`epoll_pwait2` |
//! | `notify()` | `notify` | one eventfd write (and one read by the woken wait) |
//!
//! On Windows the sources are sockets (`AsRawSocket`/`AsSocket`), and pollshot's
//! backend is AFD poll through an I/O completion port:
//!
//! | polling | pollshot | Windows calls |
//! |---|---|---|
//! | `add(socket, Event::none(k))` | `register` | one `getsockopt(SO_TYPE)` (is it a socket) |
//! | `add(socket, interest)`, `modify(socket, interest)` | `arm(token, interest)` | one `IOCTL_AFD_POLL` on the base socket (the first also a `SIO_BASE_HANDLE`); none if still armed for it |
//! | `modify(socket, Event::none(k))` | `disarm(token)` | one `NtCancelIoFileEx` if a poll is pending |
//! | `delete(socket)` | `deregister(token)` | one `NtCancelIoFileEx` if a poll is pending |
//! | `wait(events, timeout)` | `deliver` | one `GetQueuedCompletionStatusEx` |
//! | `notify()` | `notify` | one `PostQueuedCompletionStatus` |
//! | `os::iocp`: `post`, `add_waitable`, `modify_waitable`, `remove_waitable` | `post`, `register_waitable_raw` + `arm`, `arm`/`disarm`, `deregister` | see `os::iocp` |
//!
//! An AFD poll's bits become an [`Event`] so: RECEIVE and ACCEPT readable, SEND
//! writable, DISCONNECT (the peer's close or `shutdown`) readable; ABORT (a reset)
//! and CONNECT_FAIL (a refused `connect`) are errors ([`Event::is_err`]) and, with
//! LOCAL_CLOSE, a hang-up of both directions ([`Event::is_interrupt`] when both
//! were watched), reported to whichever directions were watched.

#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![cfg(any(unix, windows))]

mod event;
mod events;
mod poller;
mod source;

pub mod os;

pub use event::{Event, PollMode};
pub use events::Events;
pub use poller::Poller;
pub use source::{AsRawSource, AsSource};

#[allow(dead_code)]
fn _assert_send_sync() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<Poller>();
    sync::<Poller>();
    send::<Event>();
    sync::<Event>();
    send::<Events>();
}
