//! Helpers of the Windows test binaries (`windows.rs`, `windows_iocp.rs`,
//! `windows_break.rs`, `windows_break_waits.rs`, and `echo_server.rs` there):
//! loopback socket pairs, a reset close, event
//! objects, a thread started on cue, counted calls, and
//! the deliveries they assert. Timing never decides a pass: [`LONG`] only turns
//! a lost event or a hang into a failure.

#![allow(dead_code)] // each test binary uses the helpers it needs

use pollshot::{Events, Poller, Stats};
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle, RawHandle};
use std::ptr;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};
use windows_sys::Win32::Foundation::HANDLE;
use windows_sys::Win32::System::Threading::{CreateEventW, ResetEvent, SetEvent};

/// Trials of each racy scenario.
pub const TRIALS: usize = 20;
/// Long enough that only a lost event or a hang reaches it.
pub const LONG: Option<Duration> = Some(Duration::from_secs(20));

/// A connected, non-blocking TCP loopback pair (Windows has no socketpair).
pub fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    for s in [&a, &b] {
        s.set_nonblocking(true).unwrap();
        s.set_nodelay(true).unwrap();
    }
    (a, b)
}

/// The counts `f` cost.
pub fn delta<R>(p: &Poller, f: impl FnOnce() -> R) -> (R, Stats) {
    let before = p.stats();
    let r = f();
    (r, p.stats().since(&before))
}

/// One delivery of one event.
pub fn one(p: &Poller) -> pollshot::Event {
    let mut events = Events::with_capacity(8);
    let n = p.deliver(&mut events, LONG).unwrap();
    assert_eq!(n, 1, "one event: {events:?}");
    *events.iter().next().unwrap()
}

/// A notify, then a deliver that must end on it with no event. Completion
/// ports are FIFO: that deliver has dequeued every packet queued before it.
pub fn notify_and_see_nothing(p: &Poller) {
    p.notify().unwrap();
    let mut events = Events::with_capacity(8);
    assert_eq!(p.deliver(&mut events, LONG).unwrap(), 0, "{events:?}");
    assert!(events.is_notified());
}

/// Until `n` threads are counted in `p`'s `deliver` (a hang fails).
pub fn until_waiters(p: &Poller, n: usize) {
    until(|| p.waiters() >= n, || format!("{n} threads never blocked"));
}

/// Checks `done` every millisecond until it holds; fails with `what` if it
/// still does not after [`LONG`].
pub fn until(mut done: impl FnMut() -> bool, what: impl FnOnce() -> String) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < LONG.unwrap(), "{}", what());
        thread::sleep(Duration::from_millis(1));
    }
}

/// A new event object: manual-reset (stays set until reset) or auto-reset (a
/// satisfied wait resets it), not set.
pub fn event(manual: bool) -> OwnedHandle {
    // SAFETY: no attributes, no name; the handle returned is ours.
    let h = unsafe { CreateEventW(ptr::null(), manual as i32, 0, ptr::null()) };
    assert!(!h.is_null(), "CreateEventW: {}", io::Error::last_os_error());
    // SAFETY: `h` is a new handle nothing else owns.
    unsafe { OwnedHandle::from_raw_handle(h as RawHandle) }
}

/// Starts a thread that runs `f` once the caller reaches the returned barrier
/// too (`go.wait()`): the two then race, as a scenario's trials need.
pub fn on_cue<R: Send + 'static>(
    f: impl FnOnce() -> R + Send + 'static,
) -> (Arc<Barrier>, thread::JoinHandle<R>) {
    let go = Arc::new(Barrier::new(2));
    let cue = Arc::clone(&go);
    let handle = thread::spawn(move || {
        cue.wait();
        f()
    });
    (go, handle)
}

pub fn set(h: &OwnedHandle) {
    // SAFETY: `h` is an open event handle.
    assert_ne!(unsafe { SetEvent(h.as_raw_handle() as HANDLE) }, 0);
}

pub fn reset(h: &OwnedHandle) {
    // SAFETY: `h` is an open event handle.
    assert_ne!(unsafe { ResetEvent(h.as_raw_handle() as HANDLE) }, 0);
}

/// Closes `s` with a reset: SO_LINGER on with a zero timeout, then close.
pub fn close_with_reset(s: TcpStream) {
    use windows_sys::Win32::Networking::WinSock::{setsockopt, LINGER, SOL_SOCKET, SO_LINGER};
    let linger = LINGER {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `s` is an open socket; the option buffer is the local `linger`,
    // its size given.
    let r = unsafe {
        setsockopt(
            std::os::windows::io::AsRawSocket::as_raw_socket(&s) as usize,
            SOL_SOCKET,
            SO_LINGER,
            &linger as *const LINGER as *const u8,
            std::mem::size_of::<LINGER>() as i32,
        )
    };
    assert_eq!(r, 0, "setsockopt SO_LINGER");
    drop(s);
}
