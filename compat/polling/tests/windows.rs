//! The facade on Windows (AFD poll and a completion port, through pollshot):
//! sockets, posted packets and waitable handles, on TCP loopback pairs and event
//! objects. Runs under wine (`.ci/wine.sh`). Timing decides nothing: waits that
//! must see an event have generous deadlines, and waits that must see none are
//! zero-timeout polls after the readiness they would report was consumed or made
//! impossible.

#![cfg(windows)]

use polling::os::iocp::{CompletionPacket, PollerIocpExt};
use polling::{Event, Events, PollMode, Poller};
use std::io::{self, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::windows::io::{AsHandle, AsRawHandle, AsRawSocket, BorrowedHandle, RawHandle};
use std::time::Duration;
use windows_sys::Win32::Foundation::CloseHandle;
use windows_sys::Win32::System::Threading::{CreateEventW, ResetEvent, SetEvent};

const LONG: Option<Duration> = Some(Duration::from_secs(10));
const NOW: Option<Duration> = Some(Duration::ZERO);

/// A connected loopback pair, both non-blocking.
fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    (a, b)
}

fn wait(poller: &Poller, timeout: Option<Duration>) -> Vec<Event> {
    let mut events = Events::new();
    poller.wait(&mut events, timeout).unwrap();
    events.iter().map(Event::with_no_extra).collect()
}

/// A manual-reset event object, not set.
struct EventObject(RawHandle);

impl EventObject {
    fn new() -> EventObject {
        // SAFETY: no security attributes, no name; the handle is checked.
        let h = unsafe { CreateEventW(std::ptr::null(), 1, 0, std::ptr::null()) };
        assert!(!h.is_null(), "CreateEventW: {}", io::Error::last_os_error());
        EventObject(h as RawHandle)
    }
    fn set(&self) {
        // SAFETY: an open event handle.
        assert_ne!(unsafe { SetEvent(self.0 as _) }, 0);
    }
    fn reset(&self) {
        // SAFETY: an open event handle.
        assert_ne!(unsafe { ResetEvent(self.0 as _) }, 0);
    }
}

impl AsRawHandle for EventObject {
    fn as_raw_handle(&self) -> RawHandle {
        self.0
    }
}

impl AsHandle for EventObject {
    fn as_handle(&self) -> BorrowedHandle<'_> {
        // SAFETY: open until drop.
        unsafe { BorrowedHandle::borrow_raw(self.0) }
    }
}

impl Drop for EventObject {
    fn drop(&mut self) {
        // SAFETY: the handle is ours and closed once.
        unsafe { CloseHandle(self.0 as _) };
    }
}

/// A level registration is armed again by the next wait, not at the delivery: an
/// AFD poll reports the readiness of the moment it is issued, so a re-arm at the
/// delivery would report data the caller has read since (20 trials).
#[test]
fn level_reports_the_readiness_at_each_wait() {
    for trial in 0..20 {
        let poller = Poller::new().unwrap();
        let (mut a, mut b) = tcp_pair();
        unsafe { poller.add_with_mode(&b, Event::readable(5), PollMode::Level) }.unwrap();
        a.write_all(b"hello").unwrap();
        assert_eq!(wait(&poller, LONG), [Event::readable(5)], "trial {trial}");
        let mut buf = [0u8; 3];
        b.read_exact(&mut buf).unwrap();
        // Still readable: reported again.
        assert_eq!(wait(&poller, LONG), [Event::readable(5)], "trial {trial}");
        let mut rest = [0u8; 2];
        b.read_exact(&mut rest).unwrap();
        // Everything read: nothing to report.
        assert_eq!(wait(&poller, NOW), [], "trial {trial}");
        a.write_all(b"x").unwrap();
        assert_eq!(wait(&poller, LONG), [Event::readable(5)], "trial {trial}");
        poller.delete(&b).unwrap();
    }
}

/// Oneshot: one event per arming; `modify` arms again, with a new key.
#[test]
fn oneshot_socket_and_key_change() {
    let poller = Poller::new().unwrap();
    let (mut a, b) = tcp_pair();
    unsafe { poller.add(&b, Event::readable(1)) }.unwrap();
    a.write_all(b"x").unwrap();
    assert_eq!(wait(&poller, LONG), [Event::readable(1)]);
    assert_eq!(wait(&poller, NOW), []);
    poller.modify(&b, Event::all(2)).unwrap();
    let got = wait(&poller, LONG);
    assert_eq!(got, [Event::all(2)]);
    poller.delete(&b).unwrap();
}

/// A peer's close reaches a readable interest (AFD DISCONNECT).
#[test]
fn peer_close_is_readable() {
    let poller = Poller::new().unwrap();
    let (a, b) = tcp_pair();
    unsafe { poller.add(&b, Event::readable(3)) }.unwrap();
    drop(a);
    let mut events = Events::new();
    poller.wait(&mut events, LONG).unwrap();
    let ev = events.iter().next().unwrap();
    assert_eq!((ev.key, ev.readable), (3, true));
    poller.delete(&b).unwrap();
}

#[test]
fn bad_sources_are_clear_errors() {
    let poller = Poller::new().unwrap();
    let (a, _b) = tcp_pair();
    unsafe { poller.add(&a, Event::none(1)) }.unwrap();
    let e = unsafe { poller.add(&a, Event::none(1)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    poller.delete(&a).unwrap();
    let e = poller.delete(&a).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let e = poller.modify(&a, Event::readable(1)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    // INVALID_SOCKET, and an event object's handle given as a socket.
    let e = unsafe { poller.add(u64::MAX, Event::readable(1)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let object = EventObject::new();
    let e = unsafe { poller.add(object.0 as u64, Event::readable(1)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    // The reserved key, and the edge modes.
    let e = unsafe { poller.add(&a, Event::readable(usize::MAX)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    for mode in [PollMode::Edge, PollMode::EdgeOneshot] {
        let e = unsafe { poller.add_with_mode(&a, Event::readable(1), mode) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    }
    assert!(!poller.supports_edge());
    assert!(poller.supports_level());
    // Nothing stayed registered after the errors.
    unsafe { poller.add(a.as_raw_socket(), Event::none(1)) }.unwrap();
    // A registered socket's handle given as a waitable: refused, and the
    // socket's registration is left as it was.
    let e = unsafe {
        poller.add_waitable(
            a.as_raw_socket() as RawHandle,
            Event::readable(2),
            PollMode::Oneshot,
        )
    }
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    poller.modify(&a, Event::writable(1)).unwrap();
    let evs = wait(&poller, Some(Duration::from_secs(20)));
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0].key, 1);
    poller.delete(&a).unwrap();
}

/// pollshot cannot ask AFD for urgent data: the priority flag changes nothing in
/// what is watched, as on kqueue.
#[test]
fn priority_flag_is_accepted_and_ignored() {
    let poller = Poller::new().unwrap();
    let (mut a, b) = tcp_pair();
    unsafe { poller.add(&b, Event::readable(4).with_priority()) }.unwrap();
    a.write_all(b"x").unwrap();
    assert_eq!(wait(&poller, LONG), [Event::readable(4)]);
    poller.delete(&b).unwrap();
}

/// Each post is one event, with its key and directions, to one wait; posts do
/// not coalesce, and a notify is not an event.
#[test]
fn posted_packets() {
    let poller = Poller::new().unwrap();
    for k in 0..3 {
        poller
            .post(CompletionPacket::new(Event::writable(k)))
            .unwrap();
    }
    poller.post(CompletionPacket::new(Event::all(9))).unwrap();
    let packet = CompletionPacket::new(Event::readable(8));
    assert_eq!(*packet.event(), Event::readable(8));
    poller.post(packet.clone()).unwrap();
    let mut got = Vec::new();
    while got.len() < 5 {
        let batch = wait(&poller, LONG);
        assert!(!batch.is_empty());
        got.extend(batch);
    }
    assert_eq!(
        got,
        [
            Event::writable(0),
            Event::writable(1),
            Event::writable(2),
            Event::all(9),
            Event::readable(8)
        ]
    );
    assert_eq!(wait(&poller, NOW), []);
    poller.notify().unwrap();
    assert_eq!(wait(&poller, LONG), []);
    let e = poller
        .post(CompletionPacket::new(Event::none(1)))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
}

/// A waitable in `Oneshot`: one event when signaled, with the directions given;
/// silent until `modify_waitable`; none after a reset; gone after removal.
#[test]
fn waitable_oneshot() {
    let poller = Poller::new().unwrap();
    let object = EventObject::new();
    unsafe { poller.add_waitable(&object, Event::writable(6), PollMode::Oneshot) }.unwrap();
    assert_eq!(wait(&poller, NOW), []);
    object.set();
    assert_eq!(wait(&poller, LONG), [Event::writable(6)]);
    assert_eq!(wait(&poller, NOW), []);
    // Still set: the new arming reports it at once, under the new key.
    poller
        .modify_waitable(&object, Event::all(7), PollMode::Oneshot)
        .unwrap();
    assert_eq!(wait(&poller, LONG), [Event::all(7)]);
    object.reset();
    poller
        .modify_waitable(&object, Event::readable(7), PollMode::Oneshot)
        .unwrap();
    assert_eq!(wait(&poller, NOW), []);
    // Disarmed by Event::none: a set is not reported.
    poller
        .modify_waitable(&object, Event::none(7), PollMode::Oneshot)
        .unwrap();
    object.set();
    assert_eq!(wait(&poller, NOW), []);
    poller.remove_waitable(&object).unwrap();
    let e = poller.remove_waitable(&object).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let e = poller
        .modify_waitable(&object, Event::readable(1), PollMode::Oneshot)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
}

/// A waitable in `Level`: a set manual-reset event is reported by every wait,
/// until it is reset.
#[test]
fn waitable_level() {
    let poller = Poller::new().unwrap();
    let object = EventObject::new();
    unsafe { poller.add_waitable(&object, Event::readable(2), PollMode::Level) }.unwrap();
    object.set();
    for _ in 0..3 {
        assert_eq!(wait(&poller, LONG), [Event::readable(2)]);
    }
    object.reset();
    // The re-arm of the last delivery is made by this wait: nothing is set.
    assert_eq!(wait(&poller, NOW), []);
    let e =
        unsafe { poller.add_waitable(&object, Event::readable(2), PollMode::Level) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    for mode in [PollMode::Edge, PollMode::EdgeOneshot] {
        let e = poller
            .modify_waitable(&object, Event::readable(2), mode)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    }
    poller.remove_waitable(&object).unwrap();
}

/// Sockets and waitables side by side, with one key: each reports its own event.
#[test]
fn sockets_waitables_and_posts_together() {
    let poller = Poller::new().unwrap();
    let (mut a, b) = tcp_pair();
    let object = EventObject::new();
    unsafe { poller.add(&b, Event::readable(1)) }.unwrap();
    unsafe { poller.add_waitable(&object, Event::writable(1), PollMode::Oneshot) }.unwrap();
    a.write_all(b"x").unwrap();
    object.set();
    poller.post(CompletionPacket::new(Event::all(1))).unwrap();
    let mut got = Vec::new();
    while got.len() < 3 {
        let batch = wait(&poller, LONG);
        assert!(!batch.is_empty());
        got.extend(batch);
    }
    got.sort_by_key(|e| (e.readable, e.writable));
    assert_eq!(got, [Event::writable(1), Event::readable(1), Event::all(1)]);
    // Deleting the socket leaves the waitable, and the other way round.
    poller.delete(&b).unwrap();
    poller
        .modify_waitable(&object, Event::writable(1), PollMode::Oneshot)
        .unwrap();
    assert_eq!(wait(&poller, LONG), [Event::writable(1)]);
    poller.remove_waitable(&object).unwrap();
}
