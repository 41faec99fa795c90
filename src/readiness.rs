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
    #[inline(always)]
    pub const fn from_epoll(bits: u32) -> Readiness {
        // Looked up: the bits that matter are IN, PRI, OUT, ERR, HUP (0x1f) and
        // RDHUP (0x2000), folded into six (`epoll_index`).
        Readiness(EPOLL_READINESS[epoll_index(bits)])
    }

    /// [`from_epoll`](Self::from_epoll), worked out bit by bit (what the table
    /// it looks up is built from).
    const fn decode_epoll(bits: u32) -> Readiness {
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
    #[inline(always)]
    pub const fn for_interest(self, interest: Interest) -> Readiness {
        Readiness(self.0 & KEEP[(interest.bits() & 7) as usize])
    }

    /// The mask [`for_interest`](Self::for_interest) keeps for interest bits
    /// `bits` (1 to 7), worked out bit by bit.
    const fn keep_for(bits: u8) -> u8 {
        let Some(interest) = Interest::from_bits(bits) else {
            return Readiness::ERROR.0;
        };
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
        keep
    }
}

/// `EPOLLRDHUP`, the one bit [`Readiness::from_epoll`] reads above `EPOLLHUP`.
const EPOLL_RDHUP: u32 = 0x2000;

/// The index of epoll's `bits` in [`EPOLL_READINESS`]: IN, PRI, OUT, ERR and HUP
/// (bits 0 to 4) as they are, RDHUP as bit 5.
#[inline(always)]
const fn epoll_index(bits: u32) -> usize {
    ((bits & 0x1f) | ((bits & EPOLL_RDHUP) >> 8)) as usize
}

/// [`Readiness::from_epoll`] of every combination of the six bits it reads.
const EPOLL_READINESS: [u8; 64] = {
    let mut table = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let bits = (i as u32 & 0x1f) | ((i as u32 & 0x20) << 8);
        table[i] = Readiness::decode_epoll(bits).0;
        i += 1;
    }
    table
};

/// [`Readiness::for_interest`]'s mask for each interest's bits (0 unused).
const KEEP: [u8; 8] = {
    let mut table = [0u8; 8];
    let mut i = 0;
    while i < 8 {
        table[i] = Readiness::keep_for(i as u8);
        i += 1;
    }
    table
};

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The looked-up decoding equals the bit-by-bit one for every combination
    /// of the bits it reads, whatever else is set (EPOLLONESHOT, EPOLLET, ...).
    #[test]
    fn epoll_table_matches_the_bitwise_decoding() {
        for low in 0..=0x3fffu32 {
            for high in [0, 1 << 30, 1 << 31, 0x4000_0000 | 0x200] {
                let bits = low | high;
                assert_eq!(
                    Readiness::from_epoll(bits),
                    Readiness::decode_epoll(bits),
                    "{bits:#x}"
                );
            }
        }
        assert_eq!(Readiness::from_epoll(0x001), Readiness::READABLE);
        assert_eq!(
            Readiness::from_epoll(0x2000),
            Readiness::READABLE.union(Readiness::READ_CLOSED)
        );
    }

    #[test]
    fn interest_masks_keep_only_the_armed_directions() {
        let all = Readiness(0x3f);
        for i in Interest::ALL {
            let kept = all.for_interest(i);
            assert!(kept.contains(Readiness::ERROR));
            assert_eq!(kept.contains(Readiness::READABLE), i.is_readable());
            assert_eq!(kept.contains(Readiness::READ_CLOSED), i.is_readable());
            assert_eq!(kept.contains(Readiness::WRITABLE), i.is_writable());
            assert_eq!(kept.contains(Readiness::WRITE_CLOSED), i.is_writable());
            assert_eq!(kept.contains(Readiness::PRIORITY), i.is_priority());
        }
    }
}
