//! The pure part of the event ports backend, compiled on every target: poll(2)
//! event bits with illumos's values, the `events` an arming asks `port_associate`
//! for, the [`Readiness`] of a retrieved `portev_events`, the `user` word, and the
//! timeout's `timespec`. No system call; unit tested on every target and used by the
//! kernel model (`Semantics::Ports`).

#![cfg_attr(
    not(any(target_os = "illumos", target_os = "solaris")),
    allow(dead_code)
)]

use crate::event::Readiness;
use crate::interest::Interest;
use crate::token::{pack64, unpack64};
use std::time::Duration;

/// poll(2) event bits with the values of illumos's `<sys/poll.h>` (asserted
/// against `libc` on illumos and Solaris).
pub(crate) mod bits {
    /// `POLLIN`.
    pub(crate) const IN: i32 = 0x0001;
    /// `POLLPRI`.
    pub(crate) const PRI: i32 = 0x0002;
    /// `POLLOUT`.
    pub(crate) const OUT: i32 = 0x0004;
    /// `POLLERR`.
    pub(crate) const ERR: i32 = 0x0008;
    /// `POLLHUP`.
    pub(crate) const HUP: i32 = 0x0010;
    /// `POLLNVAL`.
    pub(crate) const NVAL: i32 = 0x0020;
    /// `POLLRDHUP` (illumos only; Solaris has no such bit).
    pub(crate) const RDHUP: i32 = 0x4000;
}

#[cfg(any(target_os = "illumos", target_os = "solaris"))]
const _: () = {
    assert!(bits::IN == libc::POLLIN as i32);
    assert!(bits::PRI == libc::POLLPRI as i32);
    assert!(bits::OUT == libc::POLLOUT as i32);
    assert!(bits::ERR == libc::POLLERR as i32);
    assert!(bits::HUP == libc::POLLHUP as i32);
    assert!(bits::NVAL == libc::POLLNVAL as i32);
};
#[cfg(target_os = "illumos")]
const _: () = assert!(bits::RDHUP == libc::POLLRDHUP as i32);

/// Whether readable armings also ask for `POLLRDHUP`: on illumos, whose
/// `<sys/poll.h>` has it (a peer's `shutdown(SHUT_WR)` then reads as read-closed);
/// Solaris has no such bit, and a half-closed socket reads as readable only (EOF).
pub(crate) const ASK_RDHUP: bool = !cfg!(target_os = "solaris");

/// The `events` argument of `port_associate(3C)` for an arming: `POLLIN` (and
/// `POLLRDHUP`, [`ASK_RDHUP`]) for readable, `POLLOUT` for writable, `POLLPRI` for
/// priority. `POLLERR` and
/// `POLLHUP` need not be asked: `port_associate_fd` keeps them in every report
/// (`revents & (pd_events | POLLHUP | POLLERR)`), as poll(2) does.
#[inline]
pub(crate) const fn events_for(interest: Interest) -> i32 {
    let mut e = 0;
    if interest.is_readable() {
        e |= bits::IN;
        if ASK_RDHUP {
            e |= bits::RDHUP;
        }
    }
    if interest.is_writable() {
        e |= bits::OUT;
    }
    if interest.is_priority() {
        e |= bits::PRI;
    }
    e
}

/// The readiness of a retrieved `portev_events` (poll(2) bits, as `VOP_POLL`
/// answered them when the event was posted): converted to epoll's bit values and
/// decoded by [`Readiness::from_epoll`], the rules every backend shares. `POLLNVAL`
/// and unknown bits are ignored (a closed descriptor's association is removed by
/// close: `port_close_fd`, and never reported).
#[inline]
pub(crate) const fn readiness(revents: i32) -> Readiness {
    let mut e = 0u32;
    if revents & bits::IN != 0 {
        e |= 0x001;
    }
    if revents & bits::PRI != 0 {
        e |= 0x002;
    }
    if revents & bits::OUT != 0 {
        e |= 0x004;
    }
    if revents & bits::ERR != 0 {
        e |= 0x008;
    }
    if revents & bits::HUP != 0 {
        e |= 0x010;
    }
    if revents & bits::RDHUP != 0 {
        e |= 0x2000;
    }
    Readiness::from_epoll(e)
}

/// The `user` word of an association: the slot (low half) and the arming
/// generation (high half), as epoll's `data.u64`. `port_associate` replaces it on
/// every call, so a retrieved event names the arming that posted it.
#[inline]
pub(crate) const fn user_word(slot: u32, generation: u32) -> u64 {
    pack64(slot, generation)
}

/// The inverse of [`user_word`]: `(slot, generation)`.
#[inline]
pub(crate) const fn slot_and_generation(user: u64) -> (u32, u32) {
    unpack64(user)
}

/// The `user` word of the waker's `port_send` events: no slot has it (slots are
/// below `u32::MAX`), and `PORT_SOURCE_USER` tells it apart anyway.
pub(crate) const WAKER: u64 = u64::MAX;

/// Largest `tv_sec` passed to `port_getn`: `port_getn` adds the timeout to the
/// current time (`timespecadd`), so a value near `i64::MAX` would overflow; about
/// 3 years, and the wait loop above goes on for the time left.
pub(crate) const MAX_SECS: u64 = 100_000_000;

/// `(tv_sec, tv_nsec)` of a timeout for `port_getn`: exact to the nanosecond,
/// `tv_sec` clamped to [`MAX_SECS`]. Zero stays zero (`port_get_timeout`: a zeroed
/// timespec does not block).
#[inline]
pub(crate) fn timespec_parts(t: Duration) -> (u64, u32) {
    if t.as_secs() >= MAX_SECS {
        (MAX_SECS, 0)
    } else {
        (t.as_secs(), t.subsec_nanos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_asked_per_interest() {
        let rd = if ASK_RDHUP {
            bits::IN | bits::RDHUP
        } else {
            bits::IN
        };
        assert_eq!(events_for(Interest::READABLE), rd);
        assert_eq!(events_for(Interest::WRITABLE), bits::OUT);
        assert_eq!(events_for(Interest::BOTH), rd | bits::OUT);
    }

    #[test]
    fn readiness_follows_the_shared_rules() {
        let r = readiness(bits::IN);
        assert!(r.contains(Readiness::READABLE) && !r.contains(Readiness::WRITABLE));
        assert_eq!(readiness(bits::OUT), Readiness::WRITABLE);
        let half = readiness(bits::IN | bits::RDHUP);
        assert_eq!(half, Readiness::READABLE.union(Readiness::READ_CLOSED));
        let hup = readiness(bits::HUP);
        for b in [
            Readiness::READABLE,
            Readiness::WRITABLE,
            Readiness::READ_CLOSED,
            Readiness::WRITE_CLOSED,
        ] {
            assert!(hup.contains(b));
        }
        // A pipe's write end whose reader closed: POLLERR alone.
        let err = readiness(bits::ERR);
        assert!(err.contains(Readiness::ERROR) && err.contains(Readiness::WRITE_CLOSED));
        assert_eq!(readiness(bits::NVAL), Readiness::EMPTY);
        assert_eq!(readiness(0x0040 | 0x0100), Readiness::EMPTY);
    }

    #[test]
    fn user_word_round_trips_and_the_waker_names_no_slot() {
        for (slot, g) in [(0, 0), (7, 9), (u32::MAX - 1, u32::MAX)] {
            assert_eq!(slot_and_generation(user_word(slot, g)), (slot, g));
            assert_ne!(user_word(slot, g), WAKER);
        }
    }

    #[test]
    fn timespec_is_exact_and_clamped() {
        assert_eq!(timespec_parts(Duration::ZERO), (0, 0));
        assert_eq!(timespec_parts(Duration::from_nanos(1)), (0, 1));
        assert_eq!(timespec_parts(Duration::from_micros(1500)), (0, 1_500_000));
        assert_eq!(timespec_parts(Duration::from_secs(5)), (5, 0));
        assert_eq!(timespec_parts(Duration::MAX), (MAX_SECS, 0));
    }
}
