//! [`Event`] (an interest going in, a readiness coming out) and [`PollMode`].

/// Extra readiness bits carried by an [`Event`] next to its two public flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Extra(u8);

impl Extra {
    /// Both directions hung up (epoll `EPOLLHUP`, kqueue `EV_EOF` on both filters).
    pub(crate) const HUP: u8 = 1;
    /// Urgent data (`EPOLLPRI`, poll `POLLPRI`): pollshot's `Interest::PRIORITY`.
    pub(crate) const PRI: u8 = 2;
    /// A pending error (epoll `EPOLLERR`, kqueue `EV_ERROR`, poll `POLLERR`).
    pub(crate) const ERR: u8 = 4;

    pub(crate) const EMPTY: Extra = Extra(0);
    /// Only [`ERR`](Self::ERR) set.
    #[allow(dead_code)] // used on the kqueue targets
    pub(crate) const ERR_ONLY: Extra = Extra(Extra::ERR);

    #[inline]
    fn set(&mut self, bit: u8, on: bool) {
        if on {
            self.0 |= bit;
        } else {
            self.0 &= !bit;
        }
    }

    #[inline]
    fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }

    /// The extra bits of one pollshot delivery.
    #[inline]
    pub(crate) fn of(ev: &pollshot::Event) -> Extra {
        let mut x = Extra::EMPTY;
        x.set(Extra::HUP, ev.is_read_closed() && ev.is_write_closed());
        x.set(Extra::ERR, ev.is_error());
        x.set(Extra::PRI, ev.is_priority());
        x
    }

    /// Whether the interest asks for urgent data.
    #[inline]
    pub(crate) fn priority(self) -> bool {
        self.has(Extra::PRI)
    }
}

/// An interest handed to [`Poller::add`](crate::Poller::add) and
/// [`Poller::modify`](crate::Poller::modify), or a readiness that
/// [`Poller::wait`](crate::Poller::wait) reports.
///
/// `key` is the caller's own number for the source: the poller never interprets it,
/// several sources may share one, and `modify` may change it. `usize::MAX` is
/// reserved (`add` and `modify` refuse it).
///
/// As an interest, `readable`/`writable` say which directions to watch; both false
/// registers the source without watching it. As a readiness, `readable` means a
/// read will not block: data, end of file, a hang-up or an error (epoll
/// `EPOLLIN`/`EPOLLRDHUP`/`EPOLLHUP`/`EPOLLERR`/`EPOLLPRI`); `writable` means a write
/// will not block: room, a hang-up or an error (`EPOLLOUT`/`EPOLLHUP`/`EPOLLERR`), so
/// a refused non-blocking `connect` and a peer's hang-up reach whoever waits on
/// either direction (epoll_ctl(2), kqueue(2), poll(2)). Only directions that were
/// watched are reported (polling's epoll backend also sets the other direction on
/// a hang-up or an error).
///
/// On Windows the AFD poll bits map to them as the crate docs' table says
/// (RECEIVE/ACCEPT/DISCONNECT readable, SEND writable, ABORT/CONNECT_FAIL/LOCAL_CLOSE
/// both), and an event of `os::iocp` (a posted packet, a signaled waitable) has
/// the directions it was given and no extra bits.
///
/// Compare events with [`with_no_extra`](Self::with_no_extra) when only the key and
/// the two directions matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// The caller's number for the source this interest or readiness is about.
    pub key: usize,
    /// Read readiness: watched (interest) or present (readiness).
    pub readable: bool,
    /// Write readiness: watched (interest) or present (readiness).
    pub writable: bool,
    pub(crate) extra: Extra,
}

impl Event {
    /// An event for `key` with the two directions given.
    #[inline]
    pub const fn new(key: usize, readable: bool, writable: bool) -> Event {
        Event {
            key,
            readable,
            writable,
            extra: Extra::EMPTY,
        }
    }

    /// `Event::new(key, true, true)`: both directions.
    #[inline]
    pub const fn all(key: usize) -> Event {
        Event::new(key, true, true)
    }

    /// `Event::new(key, true, false)`: read readiness only.
    #[inline]
    pub const fn readable(key: usize) -> Event {
        Event::new(key, true, false)
    }

    /// `Event::new(key, false, true)`: write readiness only.
    #[inline]
    pub const fn writable(key: usize) -> Event {
        Event::new(key, false, true)
    }

    /// `Event::new(key, false, false)`: no direction (registered, not watched).
    #[inline]
    pub const fn none(key: usize) -> Event {
        Event::new(key, false, false)
    }

    /// Asks for hang-up reports in this interest (epoll `EPOLLHUP`, poll `POLLHUP`).
    ///
    /// pollshot always reports a hang-up to an armed registration, on every backend,
    /// so the flag changes nothing in what is watched; it is kept in the value (it
    /// takes part in `==`).
    #[inline]
    pub fn set_interrupt(&mut self, active: bool) {
        self.extra.set(Extra::HUP, active);
    }

    /// [`set_interrupt(true)`](Self::set_interrupt), by value.
    #[inline]
    pub fn with_interrupt(mut self) -> Event {
        self.set_interrupt(true);
        self
    }

    /// Asks for urgent-data reports in this interest: pollshot's
    /// `Interest::PRIORITY` (epoll `EPOLLPRI`, poll(2) `POLLPRI`), reported by
    /// [`is_priority`](Self::is_priority). On kqueue, which pollshot cannot ask for
    /// it, the flag is kept in the value and changes nothing in what is watched (as
    /// on polling's own kqueue backend).
    #[inline]
    pub fn set_priority(&mut self, active: bool) {
        self.extra.set(Extra::PRI, active);
    }

    /// [`set_priority(true)`](Self::set_priority), by value.
    #[inline]
    pub fn with_priority(mut self) -> Event {
        self.set_priority(true);
        self
    }

    /// Whether this readiness is a hang-up of both directions (epoll `EPOLLHUP`,
    /// kqueue `EV_EOF` on both filters, poll `POLLHUP`). A half-close (the peer's
    /// `shutdown(SHUT_WR)`) is reported as readable, not as an interrupt.
    ///
    /// pollshot reports only the directions an arming asked for, so this is seen
    /// by a registration watching both directions; one watching a single direction
    /// gets the hang-up as that direction's readiness (a read or write then
    /// returns at once).
    #[inline]
    pub fn is_interrupt(&self) -> bool {
        self.extra.has(Extra::HUP)
    }

    /// Whether this readiness is urgent data (`EPOLLPRI`, poll `POLLPRI`): TCP
    /// out-of-band data, or a `POLLPRI` file's change. Only for an interest that
    /// asked with [`set_priority`](Self::set_priority); never on kqueue or Windows.
    #[inline]
    pub fn is_priority(&self) -> bool {
        self.extra.has(Extra::PRI)
    }

    /// Whether a non-blocking `connect` failed: `Some(error and hang-up)`.
    #[inline]
    #[deprecated(
        since = "3.4.0",
        note = "use `is_err` (with `is_interrupt` where a hang-up matters)"
    )]
    pub fn is_connect_failed(&self) -> Option<bool> {
        Some(self.extra.has(Extra::ERR) && self.extra.has(Extra::HUP))
    }

    /// Whether the descriptor has a pending error (epoll `EPOLLERR`, kqueue
    /// `EV_ERROR`, poll `POLLERR`/`POLLNVAL`; on Windows AFD's ABORT, a reset, and
    /// CONNECT_FAIL): `Some` on every pollshot backend. A
    /// refused `connect` shows it; `getsockopt(SO_ERROR)` or the next I/O call says
    /// which error.
    #[inline]
    pub fn is_err(&self) -> Option<bool> {
        Some(self.extra.has(Extra::ERR))
    }

    /// Forgets the extra bits (interrupt, priority, error).
    #[inline]
    pub fn clear_extra(&mut self) {
        self.extra = Extra::EMPTY;
    }

    /// The event without its extra bits, for comparing key and directions only.
    #[inline]
    pub fn with_no_extra(mut self) -> Event {
        self.clear_extra();
        self
    }
}

/// How a registration reports readiness.
///
/// | mode | facade | cost per delivery (epoll) |
/// |---|---|---|
/// | `Oneshot` | pollshot's arm: one delivery, then silent until the next `modify` | the `modify`: one `EPOLL_CTL_MOD`, none when already armed |
/// | `Level` | re-armed by the facade after each delivery, so a readiness that holds is reported by every `wait` | one `EPOLL_CTL_MOD` inside `wait` |
/// | `Edge`, `EdgeOneshot` | refused: `ErrorKind::Unsupported` ([`Poller::supports_edge`](crate::Poller::supports_edge) is `false`) | – |
///
/// pollshot's registrations are level-triggered oneshot armings; it has no
/// edge-triggered mode to map `Edge` onto (epoll `EPOLLET`, kqueue `EV_CLEAR`), and
/// re-arming cannot emulate one (a re-arm reports a readiness that still holds,
/// where an edge registration stays silent until new data arrives).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum PollMode {
    /// One delivery per arming; `modify` (or `add`) arms again. The default.
    Oneshot,
    /// A readiness is reported by every `wait` until it is gone or the interest is
    /// changed by `modify` or `delete`.
    Level,
    /// Reported once per new readiness. Not supported by this facade.
    Edge,
    /// Reported once per new readiness, then disarmed. Not supported by this facade.
    EdgeOneshot,
}
