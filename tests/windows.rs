//! The Windows suite: the AFD backend on TCP loopback pairs (Windows has no
//! socketpair), with exact counts of its calls from `stats`. Run under wine in CI:
//!
//! ```text
//! bash .ci/wine.sh cargo test --target x86_64-pc-windows-gnu --features stats --test windows
//! ```
//!
//! The shared suite (`tests/common`) is built on Unix descriptors (socketpairs,
//! pipes, fork, signals); the cases of it that apply on Windows are written here
//! again on sockets. Timing never decides a pass: deadlines only turn a lost event
//! or a hang into a failure.
#![cfg(all(windows, feature = "stats"))]

mod portable;
mod windows_common;

use pollshot::{Events, Interest, Poller, Stats, Token};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::windows::io::{AsRawHandle, AsRawSocket, RawSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use windows_common::{
    close_with_reset, delta, notify_and_see_nothing, one, tcp_pair, until_waiters, LONG, TRIALS,
};

/// One delivery, which must be for `token`.
fn one_event(p: &Poller, token: Token) -> pollshot::Event {
    let ev = one(p);
    assert_eq!(ev.token(), token);
    ev
}

#[test]
fn loopback_pair_carries_bytes() {
    let (mut a, mut b) = tcp_pair();
    a.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    b.set_nonblocking(false).unwrap();
    b.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
}

#[test]
fn register_is_one_base_handle_query_first_arm_one_poll() {
    let p = Poller::new().unwrap();
    assert_eq!(p.backend_name(), "afd");
    let (mut a, b) = tcp_pair();
    let (t, s) = delta(&p, || p.register(&b).unwrap());
    assert_eq!(
        s,
        Stats::default(),
        "register's check is not a backend call"
    );
    let (_, s) = delta(&p, || p.arm(t, Interest::READABLE).unwrap());
    let want = Stats {
        adds: 1,
        ctl_calls: 2, // SIO_BASE_HANDLE + IOCTL_AFD_POLL
        ..Stats::default()
    };
    assert_eq!(s, want);
    a.write_all(b"x").unwrap();
    let (ev, s) = delta(&p, || one_event(&p, t));
    assert!(ev.is_readable() && !ev.is_writable() && !ev.is_read_closed());
    assert_eq!(
        s,
        Stats {
            waits: 1,
            ..Stats::default()
        }
    );
}

#[test]
fn token_index_is_the_handle_value_over_4() {
    let p = Poller::new().unwrap();
    let (_a, b) = tcp_pair();
    let t = p.register(&b).unwrap();
    assert_eq!(t.index() as RawSocket, b.as_raw_socket() / 4);
    assert_eq!(b.as_raw_socket() % 4, 0, "handle values are multiples of 4");
}

#[test]
fn writable_on_a_connected_socket() {
    let p = Poller::new().unwrap();
    let (a, _b) = tcp_pair();
    let t = p.register(&a).unwrap();
    p.arm(t, Interest::WRITABLE).unwrap();
    let ev = one_event(&p, t);
    assert!(ev.is_writable() && !ev.is_readable() && !ev.is_error());
}

#[test]
fn round_trips_cost_one_poll_and_one_wait_each() {
    let p = Poller::new().unwrap();
    let (mut a, b) = tcp_pair();
    let t = p.register(&b).unwrap();
    a.write_all(b"x").unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    one_event(&p, t);
    // The byte stays unread: each arm completes at once (level-triggered).
    for round in 0..100 {
        let (ev, s) = delta(&p, || {
            p.arm(t, Interest::READABLE).unwrap();
            one_event(&p, t)
        });
        assert!(ev.is_readable(), "round {round}");
        let want = Stats {
            modifies: 1,
            ctl_calls: 1,
            waits: 1,
            ..Stats::default()
        };
        assert_eq!(s, want, "round {round}");
    }
}

#[test]
fn arm_of_armed_with_the_same_interest_issues_nothing() {
    let p = Poller::new().unwrap();
    let (_a, b) = tcp_pair();
    let t = p.register(&b).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let (_, s) = delta(&p, || {
        for _ in 0..10 {
            p.arm(t, Interest::READABLE).unwrap();
        }
    });
    assert_eq!(s, Stats::default());
}

/// Disarm cancels the pending poll; data that arrives afterwards is not
/// delivered, the cancelled completion is dropped as stale, and the next arm
/// reports the data.
#[test]
fn disarm_cancels_the_poll_its_completion_is_stale() {
    let p = Poller::new().unwrap();
    let (mut a, mut b) = tcp_pair();
    let t = p.register(&b).unwrap();
    for trial in 0..TRIALS {
        p.arm(t, Interest::READABLE).unwrap();
        let (_, s) = delta(&p, || p.disarm(t).unwrap());
        let want = Stats {
            quiets: 1,
            ctl_calls: 1,
            ..Stats::default()
        };
        assert_eq!(s, want, "trial {trial}");
        a.write_all(b"x").unwrap();
        let (_, s) = delta(&p, || notify_and_see_nothing(&p));
        assert_eq!(s.stale, 1, "trial {trial}: the cancelled completion {s:?}");
        assert_eq!(s.wakes, 1, "trial {trial}: {s:?}");
        p.arm(t, Interest::READABLE).unwrap();
        assert!(one_event(&p, t).is_readable(), "trial {trial}");
        let mut buf = [0u8; 8];
        assert_eq!(b.read(&mut buf).unwrap(), 1);
    }
}

/// Deregister cancels the poll and has taken effect when it returns: the socket
/// is closed at once, and nothing is ever delivered for it.
#[test]
fn deregister_then_close_at_once_nothing_delivered() {
    let p = Poller::new().unwrap();
    for trial in 0..TRIALS {
        let (mut a, b) = tcp_pair();
        let t = p.register(&b).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        let (_, s) = delta(&p, || p.deregister(t).unwrap());
        let want = Stats {
            deletes: 1,
            ctl_calls: 1,
            ..Stats::default()
        };
        assert_eq!(s, want, "trial {trial}");
        drop(b);
        let _ = a.write(b"x");
        let (_, s) = delta(&p, || notify_and_see_nothing(&p));
        assert_eq!(s.stale, 1, "trial {trial}: the cancelled completion {s:?}");
        assert_eq!(p.len(), 0);
        assert_eq!(
            p.arm(t, Interest::READABLE).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}

/// A re-arm with another interest issues a new poll and cancels the old one,
/// whose completion is dropped.
#[test]
fn rearm_with_another_interest_polls_anew_and_cancels() {
    let p = Poller::new().unwrap();
    let (_a, b) = tcp_pair();
    let t = p.register(&b).unwrap();
    for trial in 0..TRIALS {
        p.arm(t, Interest::READABLE).unwrap();
        let (_, s) = delta(&p, || p.arm(t, Interest::WRITABLE).unwrap());
        let want = Stats {
            modifies: 1,
            ctl_calls: 2, // the new poll, the cancel of the old
            ..Stats::default()
        };
        assert_eq!(s, want, "trial {trial}");
        let (ev, s) = delta(&p, || one_event(&p, t));
        assert!(ev.is_writable() && !ev.is_readable(), "trial {trial}");
        // The cancelled readable poll's completion, before or with the event.
        let (_, s2) = delta(&p, || notify_and_see_nothing(&p));
        assert_eq!(s.stale + s2.stale, 1, "trial {trial}: {s:?} {s2:?}");
    }
}

#[test]
fn a_completion_older_than_the_arming_is_stale() {
    // The poll completes (data), then a disarm and a re-arm with the same
    // interest run before any deliver: the first completion carries the old
    // generation and is dropped; the new arming delivers once.
    let p = Poller::new().unwrap();
    let (mut a, b) = tcp_pair();
    let t = p.register(&b).unwrap();
    a.write_all(b"x").unwrap();
    for trial in 0..TRIALS {
        p.arm(t, Interest::READABLE).unwrap();
        p.disarm(t).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        let (ev, s) = delta(&p, || one_event(&p, t));
        assert!(ev.is_readable());
        let (_, s2) = delta(&p, || notify_and_see_nothing(&p));
        assert_eq!(s.stale + s2.stale, 1, "trial {trial}: {s:?} {s2:?}");
    }
}

#[test]
fn arm_from_a_thread_that_exits_still_delivers() {
    let p = Arc::new(Poller::new().unwrap());
    let (mut a, b) = tcp_pair();
    let t = p.register(&b).unwrap();
    let p2 = Arc::clone(&p);
    thread::spawn(move || p2.arm(t, Interest::READABLE).unwrap())
        .join()
        .unwrap();
    a.write_all(b"x").unwrap();
    assert!(one_event(&p, t).is_readable());
}

#[test]
fn half_close_is_readable_and_read_closed_only() {
    let p = Poller::new().unwrap();
    let (a, b) = tcp_pair();
    let t = p.register(&b).unwrap();
    p.arm(t, Interest::BOTH).unwrap();
    // Writable first (the send buffer has room): re-arm for readable alone.
    let ev = one_event(&p, t);
    assert!(ev.is_writable());
    p.arm(t, Interest::READABLE).unwrap();
    a.shutdown(Shutdown::Write).unwrap();
    let ev = one_event(&p, t);
    assert!(ev.is_readable() && ev.is_read_closed(), "{ev:?}");
    assert!(!ev.is_write_closed() && !ev.is_error(), "{ev:?}");
}

#[test]
fn peer_close_is_read_closed() {
    let p = Poller::new().unwrap();
    let (a, b) = tcp_pair();
    let t = p.register(&b).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    drop(a);
    let ev = one_event(&p, t);
    assert!(ev.is_readable() && ev.is_read_closed(), "{ev:?}");
}

#[test]
fn reset_is_error_and_both_closed() {
    let p = Poller::new().unwrap();
    let (a, b) = tcp_pair();
    let t = p.register(&b).unwrap();
    p.arm(t, Interest::BOTH).unwrap();
    assert!(one_event(&p, t).is_writable());
    p.arm(t, Interest::READABLE).unwrap();
    close_with_reset(a);
    let ev = one_event(&p, t);
    assert!(
        ev.is_error() && ev.is_read_closed() && ev.is_readable(),
        "{ev:?}"
    );
    // Only the directions asked for: not writable, not write-closed.
    assert!(!ev.is_writable() && !ev.is_write_closed(), "{ev:?}");
    p.arm(t, Interest::WRITABLE).unwrap();
    let ev = one_event(&p, t);
    assert!(ev.is_error() && ev.is_write_closed(), "{ev:?}");
}

/// A non-blocking TCP socket whose connect to a closed loopback port is under
/// way (connect answered WSAEWOULDBLOCK), and that port.
fn connecting_to_a_closed_port() -> TcpStream {
    use std::os::windows::io::FromRawSocket;
    use windows_sys::Win32::Networking::WinSock::{
        connect, ioctlsocket, socket, WSAGetLastError, AF_INET, FIONBIO, INVALID_SOCKET, IN_ADDR,
        IN_ADDR_0, IPPROTO_TCP, SOCKADDR, SOCKADDR_IN, SOCK_STREAM, WSAEWOULDBLOCK,
    };
    // A port nobody listens on: bound, then closed (std starts Winsock too).
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    // SAFETY: plain arguments; the socket returned is ours.
    let s = unsafe { socket(AF_INET as i32, SOCK_STREAM, IPPROTO_TCP) };
    assert_ne!(s, INVALID_SOCKET);
    // SAFETY: `s` is a new socket nothing else owns.
    let stream = unsafe { TcpStream::from_raw_socket(s as RawSocket) };
    let mut on = 1u32;
    // SAFETY: `s` is open; the argument is the local `on`.
    assert_eq!(unsafe { ioctlsocket(s, FIONBIO, &mut on) }, 0);
    let addr = SOCKADDR_IN {
        sin_family: AF_INET,
        sin_port: port.to_be(),
        sin_addr: IN_ADDR {
            S_un: IN_ADDR_0 {
                S_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
            },
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `s` is open; the address is the local `addr`, its size given.
    let r = unsafe {
        connect(
            s,
            &addr as *const SOCKADDR_IN as *const SOCKADDR,
            std::mem::size_of::<SOCKADDR_IN>() as i32,
        )
    };
    assert_ne!(r, 0, "a connect to a closed port did not succeed at once");
    // SAFETY: reads this thread's last Winsock error.
    assert_eq!(unsafe { WSAGetLastError() }, WSAEWOULDBLOCK);
    stream
}

#[test]
fn refused_connect_is_writable_write_closed_and_error() {
    // AFD reports CONNECT_FAIL: error, both directions closed; an arming for
    // writable keeps writable, write-closed and error.
    let p = Poller::new().unwrap();
    let s = connecting_to_a_closed_port();
    let t = p.register(&s).unwrap();
    let (_, st) = delta(&p, || p.arm(t, Interest::WRITABLE).unwrap());
    assert_eq!(
        st,
        Stats {
            adds: 1,
            ctl_calls: 2, // SIO_BASE_HANDLE + IOCTL_AFD_POLL
            ..Stats::default()
        }
    );
    let ev = one_event(&p, t);
    assert!(
        ev.is_writable() && ev.is_write_closed() && ev.is_error(),
        "{ev:?}"
    );
    assert!(
        !ev.is_readable() && !ev.is_read_closed(),
        "not asked: {ev:?}"
    );
    assert_eq!(
        s.take_error().unwrap().map(|e| e.raw_os_error()),
        Some(Some(10061)),
        "WSAECONNREFUSED"
    );
    p.deregister(t).unwrap();
}

#[test]
fn listener_is_readable_for_a_connection() {
    let p = Poller::new().unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let t = p.register(&l).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    assert!(one_event(&p, t).is_readable());
    assert!(l.accept().is_ok());
}

#[test]
fn notifies_without_waiters_coalesce_into_one_post() {
    let p = Poller::new().unwrap();
    let (_, s) = delta(&p, || {
        for _ in 0..1000 {
            p.notify().unwrap();
        }
    });
    assert_eq!(
        s,
        Stats {
            wakes: 1,
            ..Stats::default()
        }
    );
    let mut events = Events::with_capacity(8);
    assert_eq!(p.deliver(&mut events, Some(Duration::ZERO)).unwrap(), 0);
    assert!(events.is_notified());
    p.deliver(&mut events, Some(Duration::ZERO)).unwrap();
    assert!(!events.is_notified(), "one pending notify, consumed once");
}

#[test]
fn notify_before_deliver_is_kept() {
    let p = Poller::new().unwrap();
    p.notify().unwrap();
    let mut events = Events::with_capacity(8);
    assert_eq!(p.deliver(&mut events, None).unwrap(), 0);
    assert!(events.is_notified());
}

/// Four threads blocked in `deliver(None)`, four notifies: each deliver ends,
/// notified, and none is left over. 20 trials.
#[test]
fn four_notifies_end_four_blocked_delivers() {
    let p = Arc::new(Poller::new().unwrap());
    for trial in 0..TRIALS {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let p = Arc::clone(&p);
                thread::spawn(move || {
                    let mut events = Events::with_capacity(8);
                    let n = p.deliver(&mut events, None).expect("deliver");
                    (n, events.is_notified())
                })
            })
            .collect();
        until_waiters(&p, 4);
        let (results, s) = delta(&p, || {
            for _ in 0..4 {
                p.notify().unwrap();
            }
            threads
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        // One post per notify (4 waiters: none coalesces), and one more by each
        // waiter that took a notify while more were pending (the baton), at most
        // 3: which waiters pass it on depends on when each woke.
        assert_eq!(
            results,
            vec![(0, true); 4],
            "trial {trial}: each ended notified"
        );
        assert!((4..=7).contains(&s.wakes), "trial {trial}: {s:?}");
        let mut events = Events::with_capacity(8);
        p.deliver(&mut events, Some(Duration::ZERO)).unwrap();
        assert!(
            !events.is_notified(),
            "trial {trial}: a notify was left over"
        );
    }
}

/// The scenario of `tests/portable`, which the Unix suite runs on every backend.
#[test]
fn a_notify_ends_the_blocked_deliver_not_a_zero_timeout_poll() {
    portable::a_notify_ends_the_blocked_deliver_not_a_zero_timeout_poll(Poller::new().unwrap());
}

/// Four threads share one poller and 16 pairs; every byte's readiness is
/// delivered exactly once, to one of them.
#[test]
fn four_threads_deliver_each_event_exactly_once() {
    const PAIRS: usize = 16;
    const ROUNDS: usize = 20;
    let p = Arc::new(Poller::new().unwrap());
    let pairs: Vec<_> = (0..PAIRS).map(|_| tcp_pair()).collect();
    let readers: Arc<Vec<TcpStream>> =
        Arc::new(pairs.iter().map(|(_, b)| b.try_clone().unwrap()).collect());
    let tokens: Arc<Vec<Token>> =
        Arc::new(readers.iter().map(|b| p.register(b).unwrap()).collect());
    let seen: Arc<Vec<AtomicUsize>> = Arc::new((0..PAIRS).map(|_| AtomicUsize::new(0)).collect());
    let total = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (p, readers, tokens, seen, total) = (
                Arc::clone(&p),
                Arc::clone(&readers),
                Arc::clone(&tokens),
                Arc::clone(&seen),
                Arc::clone(&total),
            );
            thread::spawn(move || {
                let mut events = Events::with_capacity(4);
                loop {
                    p.deliver(&mut events, LONG).unwrap();
                    if events.is_notified() {
                        return;
                    }
                    for ev in events.iter() {
                        let i = tokens.iter().position(|t| *t == ev.token()).unwrap();
                        let mut buf = [0u8; 1];
                        assert_eq!((&readers[i]).read(&mut buf).unwrap(), 1);
                        seen[i].fetch_add(1, Ordering::SeqCst);
                        total.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for round in 0..ROUNDS {
        for (i, (a, _)) in pairs.iter().enumerate() {
            p.arm(tokens[i], Interest::READABLE).unwrap();
            (&*a).write_all(b"x").unwrap();
        }
        let start = Instant::now();
        while total.load(Ordering::SeqCst) < (round + 1) * PAIRS {
            assert!(
                start.elapsed() < LONG.unwrap(),
                "round {round}: an event was lost"
            );
            thread::sleep(Duration::from_millis(1));
        }
    }
    for _ in 0..4 {
        p.notify().unwrap();
    }
    for h in threads {
        h.join().unwrap();
    }
    for (i, n) in seen.iter().enumerate() {
        assert_eq!(n.load(Ordering::SeqCst), ROUNDS, "pair {i}");
    }
    assert_eq!(p.stats().stale, 0);
}

#[test]
fn a_handle_that_is_not_a_socket_is_invalid_input() {
    let p = Poller::new().unwrap();
    let file = std::fs::File::open(std::env::current_exe().unwrap()).unwrap();
    // SAFETY: the handle is open for the call; the poller only queries it.
    let r = unsafe { p.register_raw(file.as_raw_handle() as RawSocket) };
    let e = r.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("not a socket"), "{e}");
    assert!(p.is_empty());
}

#[test]
fn unknown_tokens_are_not_found() {
    let p = Poller::new().unwrap();
    let (_a, b) = tcp_pair();
    let t = p.register(&b).unwrap();
    p.deregister(t).unwrap();
    assert_eq!(
        p.arm(t, Interest::READABLE).unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    let garbage = Token::from_u64(u64::MAX);
    assert_eq!(
        p.disarm(garbage).unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
}

#[test]
fn registering_a_socket_again_supersedes() {
    let p = Poller::new().unwrap();
    let (mut a, b) = tcp_pair();
    let t1 = p.register(&b).unwrap();
    p.arm(t1, Interest::READABLE).unwrap();
    let t2 = p.register(&b).unwrap();
    assert_ne!(t1, t2);
    assert_eq!(t1.index(), t2.index());
    assert_eq!(p.len(), 1);
    assert_eq!(
        p.arm(t1, Interest::READABLE).unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    p.arm(t2, Interest::READABLE).unwrap();
    a.write_all(b"x").unwrap();
    assert!(one_event(&p, t2).is_readable());
}

#[test]
fn closing_an_armed_socket_reports_it_closed() {
    // Unlike epoll, which drops a closed descriptor silently, AFD completes a
    // pending poll of a socket closed by its owner (LOCAL_CLOSE).
    let p = Poller::new().unwrap();
    let (_a, b) = tcp_pair();
    let t = p.register(&b).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    drop(b);
    let ev = one_event(&p, t);
    assert!(ev.is_read_closed(), "{ev:?}");
    p.deregister(t).unwrap();
}

#[test]
fn dropping_a_poller_with_polls_in_flight_releases_them() {
    // Pending polls (idle sockets), completed ones not yet dequeued (data) and
    // cancelled ones: the drop cancels and dequeues every one; the sockets stay
    // usable, and a new poller watches them.
    let pairs: Vec<_> = (0..8).map(|_| tcp_pair()).collect();
    for trial in 0..TRIALS {
        let p = Poller::new().unwrap();
        let tokens: Vec<_> = pairs.iter().map(|(_, b)| p.register(b).unwrap()).collect();
        for (i, t) in tokens.iter().enumerate() {
            p.arm(*t, Interest::READABLE).unwrap();
            if i % 3 == 1 {
                p.disarm(*t).unwrap();
            }
        }
        (&pairs[0].0).write_all(b"x").unwrap();
        drop(p);
        let p = Poller::new().unwrap();
        let t = p.register(&pairs[0].1).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        assert!(one_event(&p, t).is_readable(), "trial {trial}");
        let mut buf = [0u8; 8];
        assert_eq!((&pairs[0].1).read(&mut buf).unwrap(), 1, "trial {trial}");
    }
}

#[test]
fn capacity_1_serves_every_ready_registration() {
    let p = Poller::new().unwrap();
    let pairs: Vec<_> = (0..4).map(|_| tcp_pair()).collect();
    let tokens: Vec<_> = pairs.iter().map(|(_, b)| p.register(b).unwrap()).collect();
    for ((a, _), t) in pairs.iter().zip(&tokens) {
        (&*a).write_all(b"x").unwrap();
        p.arm(*t, Interest::READABLE).unwrap();
    }
    let mut events = Events::with_capacity(1);
    let mut seen = Vec::new();
    for _ in 0..4 {
        assert_eq!(p.deliver(&mut events, LONG).unwrap(), 1);
        seen.push(events.iter().next().unwrap().token());
    }
    seen.sort();
    let mut want = tokens.clone();
    want.sort();
    assert_eq!(seen, want, "each of the 4 once, in 4 delivers");
}

/// Portable code needs no `cfg` around `register_exclusive`: it exists on
/// Windows, and refuses as on Unix, with the way out in its message.
#[test]
fn register_exclusive_is_refused_with_unsupported() {
    let p = Poller::new().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let e = p.register_exclusive(&listener).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("register_exclusive") && msg.contains("share one Poller"),
        "{msg}"
    );
    assert!(!msg.contains("EPOLL_CTL_MOD"), "Windows' own reason: {msg}");
    assert!(p.is_empty(), "nothing registered");
}

/// `Interest::PRIORITY` is refused with Windows' reason (not kqueue's), and the
/// registration is left as it was: a plain READABLE arm works after it.
#[test]
fn priority_is_refused_with_windows_reason() {
    let p = Poller::new().unwrap();
    let (mut a, b) = tcp_pair();
    let t = p.register(&b).unwrap();
    let e = p
        .arm(t, Interest::READABLE | Interest::PRIORITY)
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("AFD_POLL_RECEIVE_EXPEDITED"), "{msg}");
    assert!(!msg.contains("kqueue"), "{msg}");
    p.arm(t, Interest::READABLE).unwrap();
    a.write_all(b"x").unwrap();
    one_event(&p, t);
    p.deregister(t).unwrap();
}
