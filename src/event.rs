//! [`Event`] (one delivery) and [`Events`] (a reusable buffer of them).

// `crate::event::Readiness` stays a path to it (`src/readiness.rs` owns it).
use crate::readiness::RawEvent;
pub(crate) use crate::readiness::Readiness;
use crate::token::Token;
use std::fmt;

/// One delivery: the registration it belongs to and what the kernel reported.
///
/// A delivery completes one arming and disarms the *whole* registration (oneshot):
/// nothing more is reported for it, in either direction, until it is armed again
/// with [`Poller::arm`](crate::Poller::arm). Registrations are level-triggered: a
/// reader need not drain; if data is left, the next arm reports it again. A
/// registration armed for both directions whose readable side fired is not watched
/// for writable any more: re-arm with what is still wanted. An arm *replaces* the
/// interest rather than adding to it, so that re-arm names every direction still
/// wanted (the contract and an example of a reader and a writer sharing one
/// registration are on [`Poller::arm`](crate::Poller::arm)).
///
/// # What an event means, on every backend
///
/// An event reports the directions of the interest its arming asked for, plus
/// errors; a direction that was not asked for is never set, whatever the kernel
/// said (epoll reports hang-ups and errors on every registration; kqueue reports per
/// filter; poll(2) per descriptor). Within those directions (event ports report
/// poll(2) bits: their column is poll(2)'s):
///
/// | method | set when | epoll | kqueue | poll(2) |
/// |---|---|---|---|---|
/// | [`is_readable`](Self::is_readable) | a read (or accept) will not block: data, EOF, or an error to report | `EPOLLIN`, `EPOLLRDHUP`, `EPOLLHUP`, `EPOLLERR` | `EVFILT_READ` | `POLLIN`, `POLLRDHUP`, `POLLHUP`, `POLLERR` |
/// | [`is_writable`](Self::is_writable) | a write will not block: room, a finished connect, or an error to report | `EPOLLOUT`, `EPOLLHUP`, `EPOLLERR` | `EVFILT_WRITE` | `POLLOUT`, `POLLHUP`, `POLLERR` |
/// | [`is_read_closed`](Self::is_read_closed) | the peer will send nothing more | `EPOLLRDHUP`, `EPOLLHUP` | `EV_EOF` on `EVFILT_READ` | `POLLRDHUP` (Linux), `POLLHUP` |
/// | [`is_write_closed`](Self::is_write_closed) | writes cannot succeed | `EPOLLHUP`; `EPOLLERR` with `EPOLLOUT` or alone | `EV_EOF` on `EVFILT_WRITE` | `POLLHUP`; `POLLERR` with `POLLOUT` or alone |
/// | [`is_priority`](Self::is_priority) | an exceptional condition: TCP urgent data, a `POLLPRI` file's change | `EPOLLPRI` | not offered | `POLLPRI` (io_uring too) |
/// | [`is_error`](Self::is_error) | the descriptor has a pending error | `EPOLLERR` | `EV_ERROR`, `EV_EOF` with an errno in `fflags` | `POLLERR` |
///
/// Examples: a peer's `shutdown(SHUT_WR)` is readable + read-closed (not
/// write-closed); a pipe's write end whose reader closed is writable +
/// write-closed (+ error on epoll and poll(2)); a refused non-blocking connect is
/// writable + write-closed + error; a reset is error + both closed directions that
/// were asked for.
///
/// A descriptor closed while armed is never reported (epoll drops a closed
/// descriptor from its set; close removes an event port's association; the poll(2)
/// backend drops one that poll(2) answers `POLLNVAL` for): its registration stays armed in the table, and the next
/// [`arm`](crate::Poller::arm) with another interest fails with EBADF (or, if the
/// number was reused, watches the new descriptor). Deregister before closing. On
/// io_uring a submitted poll request holds the open file, so a close does not end
/// it: its completion is delivered once (docs/guarantees.md).
///
/// On Windows (AFD poll events, `backends/windows/afd.rs`): readable is
/// `RECEIVE`, `ACCEPT`, `DISCONNECT`, `ABORT`, `CONNECT_FAIL`, `LOCAL_CLOSE`;
/// writable is `SEND`, `ABORT`, `CONNECT_FAIL`, `LOCAL_CLOSE`; read-closed is
/// `DISCONNECT` (the peer's graceful close or `shutdown(Write)`), `ABORT`,
/// `CONNECT_FAIL`, `LOCAL_CLOSE`; write-closed is `ABORT`, `CONNECT_FAIL`,
/// `LOCAL_CLOSE`; error is `ABORT` (a reset) and `CONNECT_FAIL` (a refused
/// connect). Unlike epoll, a socket closed while armed *is* reported, once:
/// `LOCAL_CLOSE`, both directions closed. A waitable handle's registration
/// (`Poller::register_waitable`) reports readable alone, once its object is
/// signaled; a posted packet (`Poller::post`) is an event of no registration
/// ([`is_posted`](Self::is_posted)).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub(crate) token: Token,
    pub(crate) key: usize,
    pub(crate) readiness: Readiness,
}

impl Event {
    /// The registration this event was delivered for.
    ///
    /// An event is checked against the table when it is delivered. If the
    /// registration is deregistered afterwards, the token stops matching any live
    /// registration (a new registration in the same slot has a different token), so
    /// an event fetched earlier can never be mistaken for a later registration
    /// (scenario P01).
    #[inline]
    pub fn token(&self) -> Token {
        self.token
    }

    /// The registration's key ([`Poller::register_with`](crate::Poller::register_with),
    /// [`Poller::set_key`](crate::Poller::set_key); 0 after a plain `register`),
    /// as it was when `deliver` accepted this event.
    ///
    /// Never stale: `deliver` accepts an event only for its registration's
    /// current arming, under that registration's lock, so an event for an earlier
    /// registration of the same number, or one reported before a deregistration,
    /// disarm or re-arm took effect, is dropped rather than delivered with the
    /// key of whatever was registered since. What that lets a runtime do with a
    /// pointer as the key (and the one race it must still close itself) is on
    /// [`register_with`](crate::Poller::register_with).
    #[inline]
    pub fn key(&self) -> usize {
        self.key
    }

    /// A read (or an accept) will not block: data is there, the read side reached
    /// EOF, or an error is pending. Only for an arming with a readable interest
    /// (the table above says which kernel flags set it).
    #[inline]
    pub fn is_readable(&self) -> bool {
        self.readiness.contains(Readiness::READABLE)
    }

    /// A write will not block: the send buffer has room, a non-blocking connect
    /// finished, or the write will fail at once (closed, error). Only for an arming
    /// with a writable interest.
    #[inline]
    pub fn is_writable(&self) -> bool {
        self.readiness.contains(Readiness::WRITABLE)
    }

    /// The peer will send no more: a read returns what is buffered, then EOF. A
    /// peer's `shutdown(SHUT_WR)` sets this and not
    /// [`is_write_closed`](Self::is_write_closed). Only for an arming with a readable
    /// interest. poll(2) outside Linux has no half-close flag (`POLLRDHUP`): there a
    /// half-close is only readable, and the read returns EOF.
    #[inline]
    pub fn is_read_closed(&self) -> bool {
        self.readiness.contains(Readiness::READ_CLOSED)
    }

    /// Writing can no longer succeed: the connection is hung up, reset or refused,
    /// or a pipe's reader is gone (EPIPE). Only for an arming with a writable
    /// interest.
    #[inline]
    pub fn is_write_closed(&self) -> bool {
        self.readiness.contains(Readiness::WRITE_CLOSED)
    }

    /// An exceptional condition (epoll `EPOLLPRI`, poll(2) and io_uring
    /// `POLLPRI`): TCP urgent data is waiting (read it with `recv(.., MSG_OOB)`,
    /// or inline with `SO_OOBINLINE`), or a file that signals by `POLLPRI` changed
    /// (cgroup, sysfs, `/proc/self/mounts`: re-read it from the start). Only for
    /// an arming with [`Interest::PRIORITY`](crate::Interest::PRIORITY); never on kqueue, which refuses that
    /// interest.
    #[inline]
    pub fn is_priority(&self) -> bool {
        self.readiness.contains(Readiness::PRIORITY)
    }

    /// The descriptor has a pending error (epoll `EPOLLERR`, kqueue `EV_ERROR` or
    /// `EV_EOF` with a non-zero `fflags`, poll `POLLERR`); the next I/O call (or
    /// `getsockopt(SO_ERROR)`) says which. Reported whatever the interest. Also set
    /// when a change that rode on a later `kevent` call was refused by the kernel.
    #[inline]
    pub fn is_error(&self) -> bool {
        self.readiness.contains(Readiness::ERROR)
    }

    /// Whether this event is a packet the program posted itself (Windows:
    /// `Poller::post`, one `PostQueuedCompletionStatus` on the poller's completion
    /// port), not a registration's readiness. Such an event carries the posted key
    /// ([`key`](Self::key)) and readable/writable as the posted interest said
    /// (nothing else is ever set); its [`token`](Self::token) names no
    /// registration (`Token::from_u64(u64::MAX)`), so [`Poller::arm`](crate::Poller::arm),
    /// `disarm` and `deregister` refuse it with `ErrorKind::NotFound`. Each post
    /// is delivered once, to one `deliver`, and never dropped as stale.
    ///
    /// Always false on Unix, and for every event of a registration.
    #[inline]
    pub fn is_posted(&self) -> bool {
        self.readiness.contains(Readiness::POSTED)
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Event");
        d.field("token", &self.token);
        if self.key != 0 {
            d.field("key", &self.key);
        }
        for (name, on) in [
            ("readable", self.is_readable()),
            ("writable", self.is_writable()),
            ("read_closed", self.is_read_closed()),
            ("write_closed", self.is_write_closed()),
            ("priority", self.is_priority()),
            ("error", self.is_error()),
            ("posted", self.is_posted()),
        ] {
            if on {
                d.field(name, &true);
            }
        }
        d.finish()
    }
}

/// A reusable buffer of [`Event`]s filled by [`Poller::deliver`](crate::Poller::deliver).
///
/// One `deliver` call returns at most [`capacity`](Events::capacity) events; the
/// buffer never grows, so a steady-state loop does not allocate.
#[derive(Debug, Clone)]
pub struct Events {
    list: Vec<Event>,
    cap: usize,
    /// The last `deliver` consumed a notify.
    notified: bool,
    /// The last `deliver` found the poller shut down.
    shutdown: bool,
    /// Scratch for the backend's kernel events, checked against the table before
    /// they become `list` entries.
    pub(crate) raw: Vec<RawEvent>,
}

impl Events {
    /// The largest capacity: 65,536 events (about 2.25 MiB reserved).
    /// [`with_capacity`](Events::with_capacity) lowers a larger one to this.
    pub const MAX_CAPACITY: usize = 1 << 16;

    /// A buffer for up to `capacity` events per `deliver`. A capacity of 0 is
    /// raised to 1 (a deliver that could return nothing would only sleep), and one
    /// above [`MAX_CAPACITY`](Events::MAX_CAPACITY) is lowered to it (the whole
    /// capacity is reserved here, so that `deliver` never allocates).
    pub fn with_capacity(capacity: usize) -> Events {
        let cap = capacity.clamp(1, Events::MAX_CAPACITY);
        Events {
            list: Vec::with_capacity(cap),
            cap,
            notified: false,
            shutdown: false,
            raw: Vec::with_capacity(cap),
        }
    }

    /// The most events one `deliver` returns into this buffer.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// The number of events from the last `deliver`.
    #[inline]
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether the last `deliver` returned no event (a timeout, a notify or a
    /// shutdown: [`is_notified`](Events::is_notified) and
    /// [`is_shutdown`](Events::is_shutdown) tell which).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Whether the last `deliver` consumed a [`notify`](crate::Poller::notify). Each
    /// notify is consumed by exactly one `deliver`; the call that consumes it
    /// returns (with the events it fetched, possibly none). A `deliver` that returned
    /// `Ok(0)` with this and [`is_shutdown`](Events::is_shutdown) false timed out.
    #[inline]
    pub fn is_notified(&self) -> bool {
        self.notified
    }

    /// Whether the last `deliver` found the poller shut down
    /// ([`Poller::shutdown`](crate::Poller::shutdown)): it returned at once, with
    /// the events it had already taken from the kernel (possibly none). Every
    /// later `deliver` on that poller returns `Ok(0)` with this true, without
    /// waiting. A worker loop ends on it:
    ///
    /// ```
    /// use std::io::ErrorKind;
    /// # let poller = pollshot::Poller::new()?;
    /// # poller.shutdown()?;
    /// let mut events = pollshot::Events::with_capacity(64);
    /// loop {
    ///     match poller.deliver(&mut events, None) {
    ///         Ok(_) => { /* handle `events` (a delivery disarmed each registration) */ }
    ///         // A signal: wait again.
    ///         Err(e) if e.kind() == ErrorKind::Interrupted => continue,
    ///         Err(e) => return Err(e),
    ///     }
    ///     if events.is_shutdown() {
    ///         break;
    ///     }
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    #[inline]
    pub fn is_shutdown(&self) -> bool {
        self.shutdown
    }

    /// The events from the last `deliver`, in the order the kernel reported them.
    #[inline]
    pub fn iter(&self) -> std::slice::Iter<'_, Event> {
        self.list.iter()
    }

    /// Forgets the events held and the notified and shut-down marks (`deliver`
    /// does this itself first).
    #[inline]
    pub fn clear(&mut self) {
        self.list.clear();
        self.notified = false;
        self.shutdown = false;
    }

    #[inline]
    pub(crate) fn set_notified(&mut self) {
        self.notified = true;
    }

    #[inline]
    pub(crate) fn set_shutdown(&mut self) {
        self.shutdown = true;
    }

    /// Room left in this call.
    #[inline]
    pub(crate) fn remaining(&self) -> usize {
        self.cap - self.list.len()
    }

    #[inline]
    pub(crate) fn push(&mut self, event: Event) {
        debug_assert!(self.list.len() < self.cap);
        self.list.push(event);
    }

    /// The scratch for one wait's kernel events and the list of events
    /// delivered, borrowed apart: the poller fills the one and checks it into
    /// the other ([`Events::merge`] and `Vec::push` on the list, within
    /// [`remaining`](Self::remaining) taken before).
    #[inline(always)]
    pub(crate) fn split(&mut self) -> (&mut Vec<RawEvent>, &mut Vec<Event>) {
        (&mut self.raw, &mut self.list)
    }

    /// Merges `readiness` into an event of `list` (as [`split`](Self::split)
    /// hands it out) already delivered for `token` in this call (kqueue reports
    /// the two filters of one registration as two kernel events).
    pub(crate) fn merge(list: &mut [Event], token: Token, readiness: Readiness) -> bool {
        match list.iter_mut().find(|e| e.token == token) {
            Some(e) => {
                e.readiness.insert(readiness);
                true
            }
            None => false,
        }
    }
}

impl<'a> IntoIterator for &'a Events {
    type Item = &'a Event;
    type IntoIter = std::slice::Iter<'a, Event>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}
