//! The key's guarantee against an event that a `deliver` fetched from the
//! kernel before the registration changed: driven step by step (the backend's
//! wait, then the change, then the poller's acceptance of what the wait fetched),
//! which a race between threads only reaches now and then.

use crate::backends::Epoll;
use crate::event::Events;
use crate::interest::Interest;
use crate::poller::Poller;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A poller, a registration of `b` with key 1, armed, ready, and its kernel
/// event fetched by the backend's wait (not yet accepted).
fn fetched() -> (
    Poller<Epoll>,
    UnixStream,
    UnixStream,
    crate::Token,
    Vec<crate::backend::RawEvent>,
) {
    let p = Poller::<Epoll>::with_backend().unwrap();
    let (mut a, b) = UnixStream::pair().unwrap();
    let t = p.register_with(&b, 1).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    a.write_all(b"1").unwrap();
    let mut raw = Vec::new();
    use crate::backend::Driver;
    p.backend.wait(&mut raw, 8, Some(Duration::ZERO)).unwrap();
    assert_eq!(raw.len(), 1, "the kernel reported the arming");
    (p, a, b, t, raw)
}

/// Fetched, then deregistered and the number registered again (another socket,
/// key 2, armed and ready): the fetched event is dropped, not delivered with key
/// 2 or with the new token; the new registration's own event has key 2.
#[test]
fn an_event_fetched_before_deregistration_never_carries_the_next_key() {
    let (p, _a, b, t1, raw) = fetched();
    p.deregister(t1).unwrap();
    let (mut a2, b2) = UnixStream::pair().unwrap();
    let number = b.as_raw_fd();
    // SAFETY: dup3(2) onto the number `b` owns; `b`'s ownership is given up
    // below without closing (dup3 closed its descriptor).
    let r = unsafe { libc::dup3(b2.as_raw_fd(), number, libc::O_CLOEXEC) };
    assert_eq!(r, number);
    let _ = b.into_raw_fd();
    // SAFETY: `number` is open (dup3 above) and owned by nothing else now.
    let b2 = unsafe { OwnedFd::from_raw_fd(number) };
    let t2 = p.register_with(&b2, 2).unwrap();
    assert_eq!(t2.index(), t1.index());
    p.arm(t2, Interest::READABLE).unwrap();
    a2.write_all(b"2").unwrap();
    let mut events = Events::with_capacity(8);
    p.accept(&raw, &mut events);
    assert!(
        events.is_empty(),
        "the fetched event was delivered: {events:?}"
    );
    assert_eq!(
        p.deliver(&mut events, Some(Duration::from_secs(20)))
            .unwrap(),
        1
    );
    let e = events.iter().next().unwrap();
    assert_eq!((e.token(), e.key()), (t2, 2));
}

/// Fetched, then disarmed and armed again: the fetched event belongs to the old
/// arming and is dropped; the new arming reports with the key.
#[test]
fn an_event_fetched_before_a_rearm_is_dropped() {
    let (p, _a, _b, t, raw) = fetched();
    p.disarm(t).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let mut events = Events::with_capacity(8);
    p.accept(&raw, &mut events);
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(
        p.deliver(&mut events, Some(Duration::from_secs(20)))
            .unwrap(),
        1
    );
    assert_eq!(events.iter().next().unwrap().key(), 1);
}

/// Fetched, then the owner changes the key: the event, accepted after the
/// change, carries the new key (a key is read when the event is accepted).
#[test]
fn set_key_applies_to_an_event_accepted_after_it() {
    let (p, _a, _b, t, raw) = fetched();
    p.set_key(t, 5).unwrap();
    let mut events = Events::with_capacity(8);
    p.accept(&raw, &mut events);
    let e = events.iter().next().expect("the current arming's event");
    assert_eq!((e.token(), e.key()), (t, 5));
}
