//! AFD's poll event bits, and the backend's pure translation: which bits an
//! arming for an interest polls for, and the readiness a completion's bits
//! report. Compiled on every target (no system call here): the Windows backend
//! (`afd.rs`) and the kernel model's AFD semantics (`src/model/afd.rs`) share it.

use crate::event::Readiness;
use crate::interest::Interest;

/// AFD event bits (wine's `AFD_POLL_*`, Windows' `AFD_POLL_*_BIT` masks).
pub(crate) const RECEIVE: u32 = 0x0001;
pub(crate) const RECEIVE_EXPEDITED: u32 = 0x0002;
pub(crate) const SEND: u32 = 0x0004;
pub(crate) const DISCONNECT: u32 = 0x0008;
pub(crate) const ABORT: u32 = 0x0010;
pub(crate) const LOCAL_CLOSE: u32 = 0x0020;
pub(crate) const ACCEPT: u32 = 0x0080;
pub(crate) const CONNECT_FAIL: u32 = 0x0100;

/// What an arming for `interest` polls for. Errors and hang-ups of both
/// directions (ABORT, LOCAL_CLOSE, CONNECT_FAIL) are polled for whatever the
/// interest, as epoll always reports `EPOLLERR | EPOLLHUP`; DISCONNECT (the
/// peer's shutdown of its sending side) only for a readable interest, as epoll's
/// `EPOLLRDHUP`.
pub(crate) const fn events_for(interest: Interest) -> u32 {
    let mut events = ABORT | LOCAL_CLOSE | CONNECT_FAIL;
    if interest.is_readable() {
        events |= RECEIVE | ACCEPT | DISCONNECT;
    }
    if interest.is_writable() {
        events |= SEND;
    }
    events
}

/// Readiness from AFD event bits, by the rules of [`Event`](crate::Event):
///
/// - RECEIVE, RECEIVE_EXPEDITED, ACCEPT: readable. SEND: writable.
/// - DISCONNECT: readable and read-closed (epoll's `EPOLLRDHUP`).
/// - ABORT (a reset), CONNECT_FAIL (a refused connect): error, both directions
///   readable and writable and both closed (epoll's `EPOLLERR | EPOLLHUP`).
/// - LOCAL_CLOSE (the socket was closed while polled): both directions readable,
///   writable and closed (epoll's `EPOLLHUP`).
pub(crate) const fn readiness(events: u32) -> Readiness {
    let mut r = Readiness::EMPTY;
    if events & (RECEIVE | RECEIVE_EXPEDITED | ACCEPT) != 0 {
        r = r.union(Readiness::READABLE);
    }
    if events & SEND != 0 {
        r = r.union(Readiness::WRITABLE);
    }
    if events & DISCONNECT != 0 {
        r = r.union(Readiness::READABLE).union(Readiness::READ_CLOSED);
    }
    if events & (ABORT | CONNECT_FAIL | LOCAL_CLOSE) != 0 {
        r = r.union(HUNG_UP);
    }
    if events & (ABORT | CONNECT_FAIL) != 0 {
        r = r.union(Readiness::ERROR);
    }
    r
}

/// Both directions readable, writable and closed.
pub(crate) const HUNG_UP: Readiness = Readiness::READABLE
    .union(Readiness::WRITABLE)
    .union(Readiness::READ_CLOSED)
    .union(Readiness::WRITE_CLOSED);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interest_selects_the_polled_events() {
        let r = events_for(Interest::READABLE);
        assert_eq!(
            r & (RECEIVE | DISCONNECT | ACCEPT),
            RECEIVE | DISCONNECT | ACCEPT
        );
        assert_eq!(r & SEND, 0);
        let w = events_for(Interest::WRITABLE);
        assert_eq!(w & (RECEIVE | DISCONNECT), 0);
        assert_ne!(w & SEND, 0);
        for i in Interest::ALL {
            let always = ABORT | LOCAL_CLOSE | CONNECT_FAIL;
            assert_eq!(events_for(i) & always, always);
        }
    }

    #[test]
    fn afd_bits_map_through_the_event_table() {
        let half = readiness(DISCONNECT);
        assert!(half.contains(Readiness::READ_CLOSED) && !half.contains(Readiness::WRITE_CLOSED));
        let reset = readiness(ABORT);
        assert!(reset.contains(Readiness::ERROR.union(HUNG_UP)));
        assert_eq!(readiness(SEND), Readiness::WRITABLE);
        assert_eq!(readiness(ACCEPT), Readiness::READABLE);
        assert!(!readiness(LOCAL_CLOSE).contains(Readiness::ERROR));
    }
}
