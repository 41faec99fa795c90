//! [`Event`] (one delivery) and [`Events`] (a reusable buffer of them).

use crate::backend::RawEvent;
use crate::Token;
use std::fmt;

/// Readiness bits as a backend reports them for one kernel event.
///
/// Users read them through [`Event`]'s methods; backends build them from the
/// kernel's flags with the constants below.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct Readiness(u8);

impl Readiness {
    /// See the [`Event`] method of the same name.
    pub const READABLE: Readiness = Readiness(1);
    /// See the [`Event`] method of the same name.
    pub const WRITABLE: Readiness = Readiness(2);
    /// See the [`Event`] method of the same name.
    pub const READ_CLOSED: Readiness = Readiness(4);
    /// See the [`Event`] method of the same name.
    pub const WRITE_CLOSED: Readiness = Readiness(8);
    /// See the [`Event`] method of the same name.
    pub const ERROR: Readiness = Readiness(16);
    /// No bit set.
    pub const EMPTY: Readiness = Readiness(0);

    /// Whether every bit of `other` is set.
    #[inline]
    pub const fn contains(self, other: Readiness) -> bool {
        self.0 & other.0 == other.0
    }

    /// Sets the bits of `other`.
    #[inline]
    pub fn insert(&mut self, other: Readiness) {
        self.0 |= other.0;
    }

    /// The bits of both.
    #[inline]
    pub const fn union(self, other: Readiness) -> Readiness {
        Readiness(self.0 | other.0)
    }
}

/// One delivery: the registration it belongs to and the readiness the kernel reported.
///
/// A delivery disarms its registration (oneshot): nothing more is reported for it
/// until it is armed again with [`Poller::arm`](crate::Poller::arm). Registrations are
/// level-triggered: a reader need not drain; if data is left, the next arm reports it
/// again.
///
/// The flags are what the kernel said, not filtered by the interest asked for:
/// a hang-up or an error is reported whatever the interest, so that the next I/O
/// call finds out what happened.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub(crate) token: Token,
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

    /// Data can be read, a connection accepted, or the read side reached EOF
    /// (epoll `EPOLLIN`/`EPOLLRDHUP`/`EPOLLHUP`, kqueue `EVFILT_READ`, poll `POLLIN`/`POLLHUP`).
    #[inline]
    pub fn is_readable(&self) -> bool {
        self.readiness.contains(Readiness::READABLE)
    }

    /// The send buffer has room, or a non-blocking connect finished
    /// (epoll `EPOLLOUT`, kqueue `EVFILT_WRITE`, poll `POLLOUT`).
    #[inline]
    pub fn is_writable(&self) -> bool {
        self.readiness.contains(Readiness::WRITABLE)
    }

    /// The peer will send no more: a read returns what is buffered, then EOF
    /// (epoll `EPOLLRDHUP` or `EPOLLHUP`, kqueue `EV_EOF` on `EVFILT_READ`, poll `POLLRDHUP`
    /// (Linux) or `POLLHUP`; poll(2) elsewhere has no half-close flag: the read returns EOF).
    /// A peer's `shutdown(SHUT_WR)` sets this and not [`is_write_closed`](Self::is_write_closed).
    #[inline]
    pub fn is_read_closed(&self) -> bool {
        self.readiness.contains(Readiness::READ_CLOSED)
    }

    /// Writing can no longer succeed: the connection is hung up both ways
    /// (epoll `EPOLLHUP`, kqueue `EV_EOF` on `EVFILT_WRITE`, poll `POLLHUP`).
    #[inline]
    pub fn is_write_closed(&self) -> bool {
        self.readiness.contains(Readiness::WRITE_CLOSED)
    }

    /// The descriptor has a pending error (epoll `EPOLLERR`, kqueue `EV_ERROR` or
    /// `EV_EOF` with a non-zero `fflags`, poll `POLLERR`/`POLLNVAL`); the next I/O
    /// call (or `getsockopt(SO_ERROR)`) says which. Also set when a change that rode
    /// on a later `kevent` call was refused by the kernel.
    #[inline]
    pub fn is_error(&self) -> bool {
        self.readiness.contains(Readiness::ERROR)
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Event");
        d.field("token", &self.token);
        for (name, on) in [
            ("readable", self.is_readable()),
            ("writable", self.is_writable()),
            ("read_closed", self.is_read_closed()),
            ("write_closed", self.is_write_closed()),
            ("error", self.is_error()),
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
    /// Scratch for the backend's kernel events, checked against the table before
    /// they become `list` entries.
    pub(crate) raw: Vec<RawEvent>,
}

impl Events {
    /// The largest capacity: 65,536 events (about 1.75 MiB reserved).
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

    /// Whether the last `deliver` returned no event (a timeout or a notify).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The events from the last `deliver`, in the order the kernel reported them.
    #[inline]
    pub fn iter(&self) -> std::slice::Iter<'_, Event> {
        self.list.iter()
    }

    /// Forgets the events held (`deliver` does this itself first).
    #[inline]
    pub fn clear(&mut self) {
        self.list.clear();
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

    /// Merges `readiness` into an event already delivered for `token` in this call
    /// (kqueue reports the two filters of one registration as two kernel events).
    pub(crate) fn merge(&mut self, token: Token, readiness: Readiness) -> bool {
        match self.list.iter_mut().find(|e| e.token == token) {
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
