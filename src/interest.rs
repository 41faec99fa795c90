//! [`Interest`]: the readiness a registration is armed for.

use std::fmt;
use std::ops::BitOr;

/// The readiness a registration is armed for: readable, writable or both.
///
/// An `Interest` is never empty: the only values are [`Interest::READABLE`],
/// [`Interest::WRITABLE`] and [`Interest::BOTH`] (`READABLE | WRITABLE`). To stop
/// reports, [`disarm`](crate::Poller::disarm) the registration instead.
///
/// On epoll, readable is `EPOLLIN | EPOLLRDHUP` and writable is `EPOLLOUT`
/// (epoll_ctl(2)); on kqueue they are the `EVFILT_READ` and `EVFILT_WRITE` knotes
/// (kqueue(2)); on poll(2) they are `POLLIN` and `POLLOUT`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Interest(u8);

impl Interest {
    const R: u8 = 0b01;
    const W: u8 = 0b10;

    /// Readable: data to read, a pending connection to accept, or the peer closed.
    pub const READABLE: Interest = Interest(Self::R);
    /// Writable: room in the send buffer, or a non-blocking connect completed.
    pub const WRITABLE: Interest = Interest(Self::W);
    /// Readable and writable.
    pub const BOTH: Interest = Interest(Self::R | Self::W);

    /// All three values, in the order readable, writable, both (for tests and fuzzing).
    pub const ALL: [Interest; 3] = [Self::READABLE, Self::WRITABLE, Self::BOTH];

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

    /// The interest as two bits (1 readable, 2 writable): always 1, 2 or 3.
    #[inline]
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// The interest with these two bits (1 readable, 2 writable), or `None`
    /// when `bits` is 0 or has other bits set.
    #[inline]
    pub const fn from_bits(bits: u8) -> Option<Interest> {
        match bits {
            1..=3 => Some(Interest(bits)),
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
        f.write_str(match self.0 {
            Self::R => "READABLE",
            Self::W => "WRITABLE",
            _ => "BOTH",
        })
    }
}
