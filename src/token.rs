//! [`Token`]: the name of a registration, and the tags that ride in the kernel.
//!
//! A token's layout (descriptor number low, incarnation high) is documented on
//! [`Token`], where users see it.
//!
//! The kernel tag is backend specific:
//!
//! - epoll: `epoll_event.data.u64` is 64 bits on every target, 32-bit ones
//!   included. It holds the slot in the low 32 bits and the registration's arming
//!   *generation* in the high 32 bits, rewritten by every `EPOLL_CTL_MOD`.
//! - kqueue: `udata` is pointer-sized. On every 64-bit target it holds slot and
//!   arming generation, rewritten by every arm, as epoll's `data` does: the
//!   backend's re-arm record (`EV_ADD | EV_ENABLE | EV_DISPATCH`) makes every
//!   kernel store it (FreeBSD, DragonFly, NetBSD and OpenBSD `kqueue_register`,
//!   Apple `kevent_register`; libkqueue with its extra `EV_CLEAR`), where a bare
//!   `EV_ENABLE` does not on NetBSD 8/9 and OpenBSD. On 32-bit targets it holds
//!   slot and incarnation, fixed at `EV_ADD`: the slot gets the low 20 bits
//!   (about a million registrations) and the incarnation the high 12 bits, and
//!   the generation stays in the table.
//!   So on 32-bit targets descriptor numbers of 2^20 and more cannot be
//!   registered (`register` refuses them with `InvalidInput`), on every backend
//!   alike.
//!
//! Wrap-around: generations and incarnations are `u32` counters that wrap, and a
//! slot's generations continue from one registration of the number to the next. A
//! stale event is mistaken for a current one only if its tag matches exactly,
//! which needs 2^32 armings of that number (on 32-bit kqueue: 2^12 registrations
//! made in the process while the number was re-registered) between the kernel
//! queueing the event and the poller reading it.

use std::fmt;

/// The name of a registration, handed out by [`Poller::register`](crate::Poller::register).
///
/// `Copy`, comparable and hashable; 64 bits on every target, in two halves:
///
/// - [`index`](Token::index), the low 32 bits: the registered descriptor number,
///   which is also the registration's slot in the poller's table. A number has
///   one registration at a time, so the index is a small dense integer for
///   indexing a runtime's own `Vec` of per-descriptor state, and the same index
///   comes back when the number is registered again.
/// - [`incarnation`](Token::incarnation), the high 32 bits: a process-wide counter
///   taken when the registration is made. A number deregistered (or superseded by
///   a later registration of the same number) and registered again gets a new
///   incarnation, so a token kept past its deregistration, or an
///   [`Event`](crate::Event) fetched before it, never names the new registration,
///   and a token of another poller names no registration of this one.
///
/// So compare the whole token, not the index alone, to tell a live registration
/// from an earlier one of the same number: a call with a token that names no live
/// registration fails with `ErrorKind::NotFound`. Tokens are unique in the process
/// until the incarnation counter wraps, 2^32 registrations later. On 32-bit
/// targets descriptor numbers of 2^20 and more cannot be registered
/// (`register` refuses them with `InvalidInput`: the kqueue tag keeps 20 bits
/// of the number, and every backend refuses them alike).
/// [`to_u64`](Token::to_u64) and [`from_u64`](Token::from_u64) convert a token to
/// and from its 64 bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(u64);

impl Token {
    /// The token for slot (descriptor number) `slot` in incarnation `incarnation`.
    #[inline]
    pub(crate) const fn new(slot: u32, incarnation: u32) -> Token {
        Token(((incarnation as u64) << 32) | slot as u64)
    }

    /// The descriptor number the registration was made for (`as_raw_fd` at
    /// [`register`](crate::Poller::register)), which is also its slot in the
    /// poller's table: one registration per number at a time, so the same index
    /// comes back when the number is registered again.
    #[inline]
    pub const fn index(self) -> usize {
        self.0 as u32 as usize
    }

    /// The incarnation: which registration of this number the token names.
    #[inline]
    pub const fn incarnation(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// The token as 64 bits (descriptor number low, incarnation high).
    #[inline]
    pub const fn to_u64(self) -> u64 {
        self.0
    }

    /// A token from [`Token::to_u64`]. Any value is accepted; one that names no live
    /// registration makes the poller's calls fail with `ErrorKind::NotFound`.
    #[inline]
    pub const fn from_u64(bits: u64) -> Token {
        Token(bits)
    }

    #[inline]
    pub(crate) const fn slot(self) -> u32 {
        self.0 as u32
    }

    /// The token of a posted packet's event (Windows `Poller::post`): slot
    /// `u32::MAX`, past every table's range, so it names no registration.
    #[cfg_attr(not(windows), allow(dead_code))]
    pub(crate) const POSTED: Token = Token(u64::MAX);
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({}#{})", self.index(), self.incarnation())
    }
}

/// Packs a slot and a 32-bit stamp (generation on epoll, incarnation on kqueue)
/// into a 64-bit kernel tag: slot low, stamp high.
#[inline]
pub(crate) const fn pack64(slot: u32, stamp: u32) -> u64 {
    ((stamp as u64) << 32) | slot as u64
}

/// The inverse of [`pack64`]: `(slot, stamp)`.
#[inline]
pub(crate) const fn unpack64(tag: u64) -> (u32, u32) {
    (tag as u32, (tag >> 32) as u32)
}

/// Bits of the slot in a pointer-sized tag on 32-bit targets.
#[cfg(target_pointer_width = "32")]
pub(crate) const SLOT_BITS_32: u32 = 20;

/// Packs slot and incarnation into a pointer-sized tag (kqueue `udata`). On 32-bit
/// targets the slot keeps its low 20 bits and the incarnation its low 12 bits;
/// the table refuses slots past 2^20 there, so the slot is never truncated.
#[inline]
#[allow(dead_code)]
pub(crate) const fn pack_usize(slot: u32, incarnation: u32) -> usize {
    #[cfg(target_pointer_width = "64")]
    {
        pack64(slot, incarnation) as usize
    }
    #[cfg(target_pointer_width = "32")]
    {
        ((incarnation << SLOT_BITS_32) | (slot & ((1 << SLOT_BITS_32) - 1))) as usize
    }
}

/// The inverse of [`pack_usize`]: `(slot, incarnation)`, the incarnation truncated
/// to the bits that fit (12 on 32-bit targets).
#[inline]
#[allow(dead_code)]
pub(crate) const fn unpack_usize(tag: usize) -> (u32, u32) {
    #[cfg(target_pointer_width = "64")]
    {
        unpack64(tag as u64)
    }
    #[cfg(target_pointer_width = "32")]
    {
        let t = tag as u32;
        (t & ((1 << SLOT_BITS_32) - 1), t >> SLOT_BITS_32)
    }
}

/// The incarnation as it survives [`pack_usize`], for comparing with a delivered tag.
#[inline]
#[allow(dead_code)]
pub(crate) const fn incarnation_in_usize(incarnation: u32) -> u32 {
    unpack_usize(pack_usize(0, incarnation)).1
}

/// Slots the table may hold on this target: descriptor numbers below it can be
/// registered. Every non-negative `i32` on 64-bit targets.
pub(crate) const MAX_SLOTS: usize = {
    #[cfg(target_pointer_width = "64")]
    {
        1 << 31
    }
    #[cfg(target_pointer_width = "32")]
    {
        1 << SLOT_BITS_32
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_round_trips_at_the_edges() {
        for (slot, inc) in [
            (0, 0),
            (u32::MAX, 0),
            (0, u32::MAX),
            (u32::MAX, u32::MAX),
            (7, 9),
        ] {
            let t = Token::new(slot, inc);
            assert_eq!(t.index(), slot as usize);
            assert_eq!(t.incarnation(), inc);
            assert_eq!(Token::from_u64(t.to_u64()), t);
            assert_eq!(unpack64(pack64(slot, inc)), (slot, inc));
        }
    }

    #[test]
    fn usize_tag_keeps_slot_and_incarnation_bits() {
        let max_slot = (MAX_SLOTS - 1) as u32;
        for (slot, inc) in [
            (0, 0),
            (max_slot, 0),
            (0, u32::MAX),
            (max_slot, u32::MAX),
            (5, 4097),
        ] {
            let (s, i) = unpack_usize(pack_usize(slot, inc));
            assert_eq!(s, slot);
            assert_eq!(i, incarnation_in_usize(inc));
        }
        // Neighbouring incarnations stay distinct after truncation.
        assert_ne!(incarnation_in_usize(1), incarnation_in_usize(2));
    }
}
