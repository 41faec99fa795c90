//! The polling semantics async-io depends on, asserted on real descriptors through
//! the facade. Timing decides nothing here except lower bounds a correct poller must
//! respect (a wait that must last at least its timeout) and generous deadlines.

#![cfg(unix)]

use polling::{Event, Events, PollMode, Poller};
use std::io::{self, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const LONG: Option<Duration> = Some(Duration::from_secs(10));

fn pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    (a, b)
}

/// Waits until at least one event is appended (a generous deadline turns a hang
/// into a failure) and returns the events.
fn wait_some(poller: &Poller) -> Vec<Event> {
    let mut events = Events::new();
    let n = poller.wait(&mut events, LONG).unwrap();
    assert!(n > 0, "no event within {LONG:?}");
    events.iter().collect()
}

fn wait_none(poller: &Poller) {
    let mut events = Events::new();
    let n = poller.wait(&mut events, Some(Duration::ZERO)).unwrap();
    assert_eq!(
        n,
        0,
        "unexpected events: {:?}",
        events.iter().collect::<Vec<_>>()
    );
}

#[test]
fn second_add_of_one_fd_is_already_exists() {
    let poller = Poller::new().unwrap();
    let (a, _b) = pair();
    // SAFETY (all `add` calls in this file): the descriptor outlives its
    // registration; each test deletes it or drops the poller first.
    unsafe { poller.add(&a, Event::none(1)).unwrap() };
    let e = unsafe { poller.add(&a, Event::readable(2)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    // The same number as a RawFd: the registration is the descriptor's.
    let e = unsafe { poller.add(a.as_raw_fd(), Event::none(3)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    poller.delete(&a).unwrap();
}

#[test]
fn delete_and_modify_of_an_unknown_fd_are_not_found() {
    let poller = Poller::new().unwrap();
    let (a, _b) = pair();
    assert_eq!(poller.delete(&a).unwrap_err().kind(), ErrorKind::NotFound);
    let e = poller.modify(&a, Event::readable(1)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    unsafe { poller.add(&a, Event::none(1)).unwrap() };
    poller.delete(&a).unwrap();
    // Deleted twice.
    assert_eq!(poller.delete(&a).unwrap_err().kind(), ErrorKind::NotFound);
}

#[test]
fn the_reserved_key_is_invalid_input() {
    let poller = Poller::new().unwrap();
    let (a, _b) = pair();
    let e = unsafe { poller.add(&a, Event::readable(usize::MAX)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    // Nothing was registered by the refused add.
    assert_eq!(poller.delete(&a).unwrap_err().kind(), ErrorKind::NotFound);
    unsafe { poller.add(&a, Event::readable(1)).unwrap() };
    let e = poller.modify(&a, Event::readable(usize::MAX)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    poller.delete(&a).unwrap();
}

#[test]
fn bad_descriptors_are_refused_with_clear_errors() {
    let poller = Poller::new().unwrap();
    let e = unsafe { poller.add(-1, Event::readable(1)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    // A number that is not open (far above any descriptor this process has; a
    // closed number could be reused by a parallel test): refused by its first
    // arming with epoll_ctl's EBADF, and not left registered.
    let closed = i32::MAX;
    for attempt in 0..2 {
        let e = unsafe { poller.add(closed, Event::readable(1)) }.unwrap_err();
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EBADF),
            "attempt {attempt}: {e}"
        );
    }
    // Registered without an interest, it is refused by the first modify.
    unsafe { poller.add(closed, Event::none(1)).unwrap() };
    // SAFETY: the number is only passed to epoll_ctl, which answers EBADF.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(closed) };
    let e = poller.modify(borrowed, Event::readable(1)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}");
    poller.delete(borrowed).unwrap();
    // The poller's own descriptor.
    let e = unsafe { poller.add(&poller, Event::readable(1)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
}

#[test]
fn edge_modes_are_unsupported_and_level_is_supported() {
    let poller = Poller::new().unwrap();
    assert!(!poller.supports_edge());
    assert!(poller.supports_level());
    let (a, _b) = pair();
    for mode in [PollMode::Edge, PollMode::EdgeOneshot] {
        let e = unsafe { poller.add_with_mode(&a, Event::readable(1), mode) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    }
    unsafe { poller.add(&a, Event::none(1)).unwrap() };
    let e = poller
        .modify_with_mode(&a, Event::readable(1), PollMode::Edge)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    poller.delete(&a).unwrap();
}

#[test]
fn keys_are_opaque_and_may_be_shared() {
    let poller = Poller::new().unwrap();
    let (a, mut pa) = pair();
    let (b, mut pb) = pair();
    unsafe {
        poller.add(&a, Event::readable(7)).unwrap();
        poller.add(&b, Event::readable(7)).unwrap();
    }
    pa.write_all(b"x").unwrap();
    pb.write_all(b"y").unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        got.extend(wait_some(&poller));
    }
    assert_eq!(got.len(), 2, "{got:?}");
    for ev in got {
        assert_eq!(ev.with_no_extra(), Event::readable(7));
    }
    poller.delete(&a).unwrap();
    poller.delete(&b).unwrap();
}

#[test]
fn modify_changes_the_key() {
    let poller = Poller::new().unwrap();
    let (a, mut pa) = pair();
    unsafe { poller.add(&a, Event::readable(1)).unwrap() };
    poller.modify(&a, Event::readable(2)).unwrap();
    pa.write_all(b"x").unwrap();
    let got = wait_some(&poller);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key, 2);
    poller.delete(&a).unwrap();
}

#[test]
fn modify_reports_readiness_already_present() {
    // async-io arms only after a read returned WouldBlock; if data arrived between
    // that read and the arming, the arming must report it or the task hangs.
    let poller = Poller::new().unwrap();
    let (mut a, mut pa) = pair();
    unsafe { poller.add(&a, Event::none(1)).unwrap() };
    pa.write_all(b"early").unwrap();
    poller.modify(&a, Event::readable(1)).unwrap();
    let got = wait_some(&poller);
    assert_eq!(got[0].with_no_extra(), Event::readable(1));
    // Oneshot: delivered once, silent until re-armed, although data remains.
    wait_none(&poller);
    let mut buf = [0u8; 2];
    a.read_exact(&mut buf).unwrap();
    poller.modify(&a, Event::readable(1)).unwrap();
    let got = wait_some(&poller);
    assert_eq!(
        got[0].with_no_extra(),
        Event::readable(1),
        "3 bytes still buffered"
    );
    poller.delete(&a).unwrap();
}

#[test]
fn modify_to_none_disarms() {
    let poller = Poller::new().unwrap();
    let (a, mut pa) = pair();
    unsafe { poller.add(&a, Event::readable(1)).unwrap() };
    poller.modify(&a, Event::none(1)).unwrap();
    pa.write_all(b"x").unwrap();
    wait_none(&poller);
    poller.modify(&a, Event::readable(1)).unwrap();
    assert_eq!(wait_some(&poller)[0].key, 1);
    poller.delete(&a).unwrap();
}

#[test]
fn level_mode_reports_until_drained() {
    let poller = Poller::new().unwrap();
    let (mut a, mut pa) = pair();
    unsafe {
        poller
            .add_with_mode(&a, Event::readable(4), PollMode::Level)
            .unwrap()
    };
    pa.write_all(b"abc").unwrap();
    for _ in 0..3 {
        let got = wait_some(&poller);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].with_no_extra(), Event::readable(4));
    }
    let mut buf = [0u8; 3];
    a.read_exact(&mut buf).unwrap();
    wait_none(&poller);
    pa.write_all(b"d").unwrap();
    assert_eq!(wait_some(&poller)[0].key, 4);
    // Back to oneshot: one report, then silence.
    poller
        .modify_with_mode(&a, Event::readable(4), PollMode::Oneshot)
        .unwrap();
    assert_eq!(wait_some(&poller)[0].key, 4);
    wait_none(&poller);
    poller.delete(&a).unwrap();
}

#[test]
fn a_refused_connect_reaches_both_directions() {
    // A port with no listener on 127.0.0.1: bind one, note the port, close it.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    // SAFETY: socket(2) and fcntl(2) on the new descriptor; sockaddr_in is plain
    // integers (all-zero is valid; BSDs add `sin_len`, left zero).
    let (sock, addr) = unsafe {
        let sock = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(sock >= 0, "{}", io::Error::last_os_error());
        let flags = libc::fcntl(sock, libc::F_GETFL);
        assert_eq!(
            libc::fcntl(sock, libc::F_SETFL, flags | libc::O_NONBLOCK),
            0
        );
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_port = port.to_be();
        addr.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 1]).to_be();
        (sock, addr)
    };
    // SAFETY: `addr` is a valid sockaddr_in of the length given.
    let r = unsafe {
        libc::connect(
            sock,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    let err = io::Error::last_os_error();
    assert!(
        r == 0
            || err.raw_os_error() == Some(libc::EINPROGRESS)
            || err.raw_os_error() == Some(libc::ECONNREFUSED),
        "{err}"
    );
    let poller = Poller::new().unwrap();
    // async-io waits for writability after a non-blocking connect.
    unsafe { poller.add(sock, Event::writable(9)).unwrap() };
    let got = wait_some(&poller);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key, 9);
    assert!(got[0].writable, "{got:?}");
    assert_eq!(got[0].is_err(), Some(true), "{got:?}");
    // SAFETY: `sock` is open until the close below.
    poller
        .delete(unsafe { std::os::fd::BorrowedFd::borrow_raw(sock) })
        .unwrap();
    // SAFETY: `sock` is ours and closed once.
    unsafe { libc::close(sock) };
}

#[test]
fn a_hang_up_reaches_a_reader_and_a_writer() {
    for interest in [Event::readable(1), Event::writable(1), Event::all(1)] {
        let poller = Poller::new().unwrap();
        let (a, pa) = pair();
        // Fill the send buffer so that only the hang-up can make `a` writable.
        let mut w = &a;
        while w.write(&[0u8; 4096]).is_ok() {}
        unsafe { poller.add(&a, interest).unwrap() };
        if !interest.readable {
            wait_none(&poller);
        }
        drop(pa);
        let got = wait_some(&poller);
        assert_eq!(got.len(), 1, "{interest:?}: {got:?}");
        // Each watched direction is reported (pollshot reports only the armed
        // directions); a hang-up of both shows as an interrupt when both are armed.
        assert_eq!(got[0].readable, interest.readable, "{interest:?}: {got:?}");
        assert_eq!(got[0].writable, interest.writable, "{interest:?}: {got:?}");
        if interest.readable && interest.writable {
            assert!(got[0].is_interrupt(), "both directions hung up: {got:?}");
        }
        poller.delete(&a).unwrap();
    }
}

#[test]
fn wait_appends_and_returns_the_list_length() {
    let poller = Poller::new().unwrap();
    let (a, mut pa) = pair();
    let (b, mut pb) = pair();
    unsafe {
        poller.add(&a, Event::readable(1)).unwrap();
        poller.add(&b, Event::readable(2)).unwrap();
    }
    let mut events = Events::new();
    pa.write_all(b"x").unwrap();
    assert_eq!(poller.wait(&mut events, LONG).unwrap(), 1);
    pb.write_all(b"y").unwrap();
    // The list's length, as polling 3.x returns it (its own test `append_events`).
    assert_eq!(poller.wait(&mut events, LONG).unwrap(), 2);
    let keys: Vec<usize> = events.iter().map(|e| e.key).collect();
    assert_eq!(keys, [1, 2]);
    events.clear();
    assert!(events.is_empty());
    poller.delete(&a).unwrap();
    poller.delete(&b).unwrap();
}

#[test]
fn notify_is_latched_and_coalesces() {
    let poller = Poller::new().unwrap();
    let mut events = Events::new();
    // Latched: a notify before the wait makes it return at once.
    poller.notify().unwrap();
    poller.notify().unwrap();
    assert_eq!(poller.wait(&mut events, LONG).unwrap(), 0);
    assert!(events.is_empty());
    // Coalesced: the second notify left nothing for this wait, which lasts its
    // whole timeout.
    let t = Duration::from_millis(50);
    let start = Instant::now();
    assert_eq!(poller.wait(&mut events, Some(t)).unwrap(), 0);
    assert!(start.elapsed() >= t, "woken by a second, coalesced notify");
}

#[test]
fn notify_wakes_a_blocked_wait_20_times() {
    let poller = Arc::new(Poller::new().unwrap());
    for _ in 0..20 {
        let p = Arc::clone(&poller);
        let waiter = thread::spawn(move || {
            let mut events = Events::new();
            p.wait(&mut events, None).unwrap()
        });
        thread::sleep(Duration::from_millis(5));
        poller.notify().unwrap();
        assert_eq!(waiter.join().unwrap(), 0);
    }
}

#[test]
fn a_wait_below_a_millisecond_lasts_at_least_its_timeout() {
    let poller = Poller::new().unwrap();
    let mut events = Events::new();
    for micros in [1, 100, 999, 1500] {
        let t = Duration::from_micros(micros);
        let start = Instant::now();
        assert_eq!(poller.wait(&mut events, Some(t)).unwrap(), 0);
        assert!(start.elapsed() >= t, "{micros} µs");
    }
}

extern "C" fn on_signal(_: libc::c_int) {}

#[test]
fn a_signal_does_not_end_the_wait_before_its_deadline() {
    // SAFETY: installs a handler that does nothing, without SA_RESTART, so the
    // signal interrupts the blocked epoll_wait with EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGURG, &sa, std::ptr::null_mut()), 0);
    }
    let poller = Arc::new(Poller::new().unwrap());
    let t = Duration::from_millis(300);
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as usize;
    let done = Arc::new(AtomicBool::new(false));
    let d = Arc::clone(&done);
    let killer = thread::spawn(move || {
        for _ in 0..5 {
            thread::sleep(Duration::from_millis(20));
            if d.load(Ordering::Acquire) {
                break;
            }
            // SAFETY: the waiting thread outlives this one (it joins it).
            unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGURG) };
        }
    });
    let mut events = Events::new();
    let start = Instant::now();
    let n = poller.wait(&mut events, Some(t)).unwrap();
    let elapsed = start.elapsed();
    done.store(true, Ordering::Release);
    killer.join().unwrap();
    assert_eq!(n, 0);
    assert!(
        elapsed >= t,
        "the wait ended after {elapsed:?}, before its {t:?} deadline"
    );
}

#[test]
fn several_threads_wait_at_once_and_each_event_reaches_one() {
    // polling lets only one thread wait; pollshot lets them all, and the facade
    // keeps that. Two waiters, two ready sources: each gets exactly one event, 20
    // times over.
    for _ in 0..20 {
        let poller = Arc::new(Poller::new().unwrap());
        let (a, mut pa) = pair();
        let (b, mut pb) = pair();
        unsafe {
            poller.add(&a, Event::readable(1)).unwrap();
            poller.add(&b, Event::readable(2)).unwrap();
        }
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let p = Arc::clone(&poller);
                thread::spawn(move || {
                    let mut events = Events::with_capacity(1.try_into().unwrap());
                    p.wait(&mut events, LONG).unwrap();
                    events.iter().map(|e| e.key).collect::<Vec<_>>()
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(5));
        pa.write_all(b"x").unwrap();
        pb.write_all(b"y").unwrap();
        let mut keys: Vec<usize> = waiters
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        keys.sort();
        assert_eq!(keys, [1, 2]);
        poller.delete(&a).unwrap();
        poller.delete(&b).unwrap();
    }
}

#[test]
fn a_tcp_round_trip_through_the_facade() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let poller = Poller::new().unwrap();
    unsafe { poller.add(&listener, Event::readable(0)).unwrap() };
    let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    assert_eq!(wait_some(&poller)[0].with_no_extra(), Event::readable(0));
    let (mut server, _) = listener.accept().unwrap();
    server.set_nonblocking(true).unwrap();
    unsafe { poller.add(&server, Event::readable(1)).unwrap() };
    client.write_all(b"ping").unwrap();
    assert_eq!(wait_some(&poller)[0].with_no_extra(), Event::readable(1));
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    poller.delete(&server).unwrap();
    poller.delete(&listener).unwrap();
}

/// `delete` then `close` while another thread sits in `wait`: the poller holds
/// no reference to the socket when `delete` returns, so the peer reads EOF at
/// once (on a poll(2)-only build the waiting thread's poll(2) held it until its
/// wait ended). The peer's poll(2) timeout only bounds a failure. 20 trials.
#[test]
fn delete_and_close_while_another_thread_waits_releases_the_socket() {
    let poller = Arc::new(Poller::new().unwrap());
    for trial in 0..20 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        a.set_nonblocking(true).unwrap();
        unsafe { poller.add(&a, Event::readable(7)).unwrap() };
        let p = poller.clone();
        let waiter = thread::spawn(move || {
            let mut events = Events::new();
            loop {
                match p.wait(&mut events, LONG) {
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    r => break r.unwrap(),
                }
            }
        });
        // Likely in its wait by now; the outcome asserted holds either way.
        thread::sleep(Duration::from_millis(5));
        poller.delete(&a).unwrap();
        drop(a);
        let mut pfd = libc::pollfd {
            fd: b.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, 2_000) };
        assert_eq!(
            n, 1,
            "trial {trial}: the peer saw no EOF after delete + close"
        );
        b.set_nonblocking(true).unwrap();
        assert_eq!((&b).read(&mut [0u8; 8]).unwrap(), 0, "trial {trial}");
        poller.notify().unwrap();
        assert_eq!(waiter.join().unwrap(), 0, "trial {trial}");
    }
}

/// `with_priority` asks pollshot for `Interest::PRIORITY`: TCP urgent data
/// (`send(MSG_OOB)`) is reported with `is_priority()` under the source's key, and
/// not readable while only the urgent byte is there. kqueue cannot be asked for it:
/// there the flag changes nothing (as on polling's kqueue backend).
#[test]
fn with_priority_reports_tcp_urgent_data_as_is_priority() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    server.set_nonblocking(true).unwrap();
    let poller = Poller::new().unwrap();
    // SAFETY: `server` outlives its registration (deleted below).
    unsafe { poller.add(&server, Event::readable(7).with_priority()) }.unwrap();
    let byte = b'!';
    // SAFETY: send(2) on an open socket with a valid one-byte buffer.
    let n = unsafe {
        libc::send(
            client.as_raw_fd(),
            (&byte as *const u8).cast(),
            1,
            libc::MSG_OOB,
        )
    };
    assert_eq!(n, 1, "send(MSG_OOB): {}", io::Error::last_os_error());
    let events = wait_some(&poller);
    assert_eq!(events.len(), 1, "{events:?}");
    let e = events[0];
    assert_eq!(e.key, 7);
    if cfg!(any(target_os = "linux", target_os = "android")) {
        assert!(e.is_priority(), "{e:?}");
        assert!(!e.readable, "only the urgent byte is there: {e:?}");
    }
    // Without the flag: never priority.
    poller.modify(&server, Event::readable(8)).unwrap();
    (&client).write_all(b"data").unwrap();
    for e in wait_some(&poller) {
        assert_eq!(e.key, 8, "the modified key");
        assert!(!e.is_priority(), "{e:?}");
    }
    poller.delete(&server).unwrap();
}
