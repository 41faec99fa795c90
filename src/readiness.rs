//! What a backend reports: [`Readiness`] (the bits of one kernel event) and
//! [`RawEvent`] (one kernel event, before the poller checks it against the table).
//!
//! Below both the backend contract (`src/backend.rs`), whose `wait` returns these,
//! and the user's [`Event`](crate::Event) (`src/event.rs`), which carries a
//! `Readiness`: backends and the poller import them from here.

use crate::interest::Interest;

/// Readiness bits as a backend reports them for one kernel event (crate-private).
///
/// Users read them through [`Event`](crate::Event)'s methods; backends build them from the
/// kernel's flags with the constants below, and the poller keeps the directions of
/// the arming's interest ([`Readiness::for_interest`]).
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct Readiness(u8);

impl Readiness {
    /// See the [`Event`](crate::Event) method of the same name.
    pub const READABLE: Readiness = Readiness(1);
    /// See the [`Event`](crate::Event) method of the same name.
    pub const WRITABLE: Readiness = Readiness(2);
    /// See the [`Event`](crate::Event) method of the same name.
    pub const READ_CLOSED: Readiness = Readiness(4);
    /// See the [`Event`](crate::Event) method of the same name.
    pub const WRITE_CLOSED: Readiness = Readiness(8);
    /// See the [`Event`](crate::Event) method of the same name.
    pub const ERROR: Readiness = Readiness(16);
    /// See the [`Event`](crate::Event) method of the same name.
    pub const PRIORITY: Readiness = Readiness(32);
    /// A packet the user posted (Windows `Poller::post`), not a registration's
    /// event: see [`RawEvent`] for what its slot and stamp then hold.
    pub const POSTED: Readiness = Readiness(64);
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

    /// Readiness from a report in epoll's bit values (`EPOLLIN` 0x1, `EPOLLPRI` 0x2,
    /// `EPOLLOUT` 0x4, `EPOLLERR` 0x8, `EPOLLHUP` 0x10, `EPOLLRDHUP` 0x2000; poll(2)'s
    /// `revents` use the same values on Linux, and the poll(2) backend converts to
    /// them elsewhere), by the rules of [`Event`](crate::Event):
    ///
    /// - IN: readable. OUT: writable. PRI: priority (not readable: TCP urgent
    ///   data alone leaves an ordinary read blocking, tcp_poll(); only an arming
    ///   with [`Interest::PRIORITY`] asks for it).
    /// - RDHUP: readable and read-closed (the peer shut down its writing side).
    /// - HUP: both directions closed: readable, writable, read- and write-closed.
    /// - ERR: error, and readable and writable (the next I/O call reports the error
    ///   instead of blocking); also write-closed when it comes with OUT or with none
    ///   of IN, PRI, HUP, RDHUP (a pipe's write end whose reader closed: writes fail
    ///   with EPIPE), as mio's mapping has it.
    ///
    /// Other bits are ignored. The epoll backend, the poll(2) backend and the kernel
    /// model all decode with this one function.
    pub const fn from_epoll(bits: u32) -> Readiness {
        const IN: u32 = 0x001;
        const PRI: u32 = 0x002;
        const OUT: u32 = 0x004;
        const ERR: u32 = 0x008;
        const HUP: u32 = 0x010;
        const RDHUP: u32 = 0x2000;
        let mut r = 0;
        if bits & IN != 0 {
            r |= Readiness::READABLE.0;
        }
        if bits & PRI != 0 {
            r |= Readiness::PRIORITY.0;
        }
        if bits & OUT != 0 {
            r |= Readiness::WRITABLE.0;
        }
        if bits & RDHUP != 0 {
            r |= Readiness::READABLE.0 | Readiness::READ_CLOSED.0;
        }
        if bits & HUP != 0 {
            r |= Readiness::READABLE.0
                | Readiness::WRITABLE.0
                | Readiness::READ_CLOSED.0
                | Readiness::WRITE_CLOSED.0;
        }
        if bits & ERR != 0 {
            r |= Readiness::ERROR.0 | Readiness::READABLE.0 | Readiness::WRITABLE.0;
            if bits & OUT != 0 || bits & (IN | PRI | HUP | RDHUP) == 0 {
                r |= Readiness::WRITE_CLOSED.0;
            }
        }
        Readiness(r)
    }

    /// The bits an arming for `interest` reports: readable and read-closed only for
    /// a readable interest, writable and write-closed only for a writable one,
    /// priority only for a priority one, error always. Every backend's report goes through this, so one event means
    /// the same on epoll (which reports hang-ups and errors whatever the interest),
    /// kqueue (which reports per filter) and poll(2).
    #[inline]
    pub const fn for_interest(self, interest: Interest) -> Readiness {
        let mut keep = Readiness::ERROR.0;
        if interest.is_readable() {
            keep |= Readiness::READABLE.0 | Readiness::READ_CLOSED.0;
        }
        if interest.is_writable() {
            keep |= Readiness::WRITABLE.0 | Readiness::WRITE_CLOSED.0;
        }
        if interest.is_priority() {
            keep |= Readiness::PRIORITY.0;
        }
        Readiness(self.0 & keep)
    }
}

/// One kernel event, before the poller checks it against the table.
///
/// A posted packet (Windows: readiness with [`Readiness::POSTED`]) names no
/// registration: its slot is the low 32 bits of the user's key and its stamp the
/// high 32 bits, and the poller delivers it without a table check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawEvent {
    /// The slot the kernel tag names.
    pub slot: u32,
    /// The stamp the kernel tag carries: the arming generation on a backend whose
    /// kernel tag holds it (epoll: `data.u64`), else the slot's incarnation (kqueue:
    /// `udata`, fixed at `EV_ADD`).
    pub stamp: u32,
    /// What the kernel reported.
    pub readiness: Readiness,
}
