//! [`Interest`]: the readiness a registration is armed for.

use std::fmt;
use std::ops::BitOr;

/// The readiness a registration is armed for: any non-empty combination of
/// readable, writable and priority.
///
/// An `Interest` is never empty: the values are [`Interest::READABLE`],
/// [`Interest::WRITABLE`], [`Interest::PRIORITY`] and their unions with `|`
/// ([`Interest::BOTH`] is `READABLE | WRITABLE`). To stop reports,
/// [`disarm`](crate::Poller::disarm) the registration instead.
///
/// | interest | epoll (epoll_ctl(2)) | poll(2), io_uring `POLL_ADD`, event ports (port_associate(3C)) | kqueue (kqueue(2)) |
/// |---|---|---|---|
/// | readable | `EPOLLIN \| EPOLLRDHUP` | `POLLIN` (and `POLLRDHUP` on Linux) | the `EVFILT_READ` knote |
/// | writable | `EPOLLOUT` | `POLLOUT` | the `EVFILT_WRITE` knote |
/// | priority | `EPOLLPRI` | `POLLPRI` (io_uring: with readable only) | not offered: `arm` answers `ErrorKind::Unsupported` |
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Interest(u8);

impl Interest {
    const R: u8 = 0b001;
    const W: u8 = 0b010;
    const P: u8 = 0b100;

    /// Readable: data to read, a pending connection to accept, or the peer closed.
    pub const READABLE: Interest = Interest(Self::R);
    /// Writable: room in the send buffer, or a non-blocking connect completed.
    pub const WRITABLE: Interest = Interest(Self::W);
    /// Readable and writable.
    pub const BOTH: Interest = Interest(Self::R | Self::W);
    /// Priority: an exceptional condition, reported by
    /// [`Event::is_priority`](crate::Event::is_priority): TCP urgent data (a peer's
    /// `send(.., MSG_OOB)`, read with `recv(.., MSG_OOB)`), a pseudo-terminal
    /// master in packet mode with a state change, and files that signal a change by
    /// `POLLPRI` (cgroup v2 `cgroup.events`, sysfs attributes that notify,
    /// `/proc/self/mounts`): the kernel's `POLLPRI` (poll(2), epoll's `EPOLLPRI`).
    /// Usually armed with `READABLE`, as `READABLE | PRIORITY`; alone, ordinary data
    /// does not end the arming.
    ///
    /// epoll, the poll(2) backend and io_uring ask for it; io_uring only together
    /// with `READABLE` (an arm of `PRIORITY` without it answers
    /// `ErrorKind::Unsupported`): a socket's wake-up for ordinary data carries
    /// `EPOLLPRI` (`sock_def_readable`), on which the kernel's `io_poll_wake`
    /// takes a oneshot `POLLPRI`-only request off the wait queue, and urgent data
    /// that comes later would complete nothing. kqueue has no filter
    /// for it that every kqueue offers, so [`arm`](crate::Poller::arm) with it on
    /// `backends::Kqueue` answers `ErrorKind::Unsupported` for now. The way
    /// forward there is `EVFILT_EXCEPT` with `NOTE_OOB`, which fires on TCP urgent
    /// data: macOS (XNU's `filt_soread_common`), OpenBSD (`filt_soexcept`) and
    /// DragonFly (`filt_soread`) have it; FreeBSD's and NetBSD's `sys/event.h`
    /// define no `EVFILT_EXCEPT` (their poll(2) reports `POLLPRI`).
    pub const PRIORITY: Interest = Interest(Self::P);

    /// Every value, readable, writable and both first (for tests and fuzzing).
    pub const ALL: [Interest; 7] = [
        Self::READABLE,
        Self::WRITABLE,
        Self::BOTH,
        Self::PRIORITY,
        Interest(Self::R | Self::P),
        Interest(Self::W | Self::P),
        Interest(Self::R | Self::W | Self::P),
    ];

    /// Whether readable readiness is asked for.
    #[inline]
    pub const fn is_readable(self) -> bool {
        self.0 & Self::R != 0
    }

    /// Whether writable readiness is asked for.
    #[inline]
    pub const fn is_writable(self) -> bool {
        self.0 & Self::W != 0
    }

    /// Whether priority readiness is asked for ([`PRIORITY`](Self::PRIORITY)).
    #[inline]
    pub const fn is_priority(self) -> bool {
        self.0 & Self::P != 0
    }

    /// The interest as three bits (1 readable, 2 writable, 4 priority): always 1
    /// to 7.
    #[inline]
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// The interest with these bits (1 readable, 2 writable, 4 priority), or
    /// `None` when `bits` is 0 or has other bits set.
    #[inline]
    pub const fn from_bits(bits: u8) -> Option<Interest> {
        match bits {
            1..=7 => Some(Interest(bits)),
            _ => None,
        }
    }
}

impl BitOr for Interest {
    type Output = Interest;
    #[inline]
    fn bitor(self, rhs: Interest) -> Interest {
        Interest(self.0 | rhs.0)
    }
}

impl fmt::Debug for Interest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == Self::R | Self::W {
            return f.write_str("BOTH");
        }
        let mut sep = "";
        for (bit, name) in [
            (Self::R, "READABLE"),
            (Self::W, "WRITABLE"),
            (Self::P, "PRIORITY"),
        ] {
            if self.0 & bit != 0 {
                write!(f, "{sep}{name}")?;
                sep = " | ";
            }
        }
        Ok(())
    }
}
