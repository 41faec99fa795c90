//! The Windows backend's sockets and posts under misuse: handle values
//! reused after a close (by sockets and by events), the same socket through
//! two handles, deregisters racing a ready socket, re-arm and post storms,
//! bad handles and edge values. Waitable handles under misuse are
//! `windows_break_waits.rs`. Run under wine:
//!
//! ```text
//! bash .ci/wine.sh cargo test --target x86_64-pc-windows-gnu --features stats --test windows_break
//! ```
//!
//! Timing never decides a pass: deadlines only turn a lost event or a hang into
//! a failure. "Nothing is delivered" is checked with a notify: completion ports
//! are FIFO, so the deliver that takes the notify has dequeued every packet
//! queued before it, and must return no event.
#![cfg(all(windows, feature = "stats"))]

mod windows_common;

use pollshot::{Events, Interest, Poller, Stats};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::windows::io::{AsRawHandle, AsRawSocket, OwnedHandle};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use windows_common::{
    delta, event, notify_and_see_nothing, on_cue, one, set, tcp_pair, until_waiters, LONG, TRIALS,
};

/// A new pair whose accepted socket has handle value `value`, if one comes in
/// a few tries (Windows and wine hand out the lowest free value, so the value
/// of a socket just closed comes back at once, but nothing promises it).
fn pair_with_value(value: u64) -> Option<(TcpStream, TcpStream)> {
    let mut kept = Vec::new();
    for _ in 0..8 {
        let (a, b) = tcp_pair();
        if b.as_raw_socket() == value {
            return Some((a, b));
        }
        if a.as_raw_socket() == value {
            return Some((b, a));
        }
        kept.push((a, b));
    }
    None
}

/// A new event whose handle has value `value`, if one comes in a few tries
/// (as [`pair_with_value`]); the events made on the way are closed.
fn event_with_value(value: u64) -> Option<OwnedHandle> {
    let mut kept = Vec::new();
    for _ in 0..8 {
        let ev = event(true);
        if ev.as_raw_handle() as u64 == value {
            return Some(ev);
        }
        kept.push(ev);
    }
    None
}

#[test]
fn a_reused_socket_number_never_gets_the_old_sockets_completion() {
    // The old socket's poll has completed (data was waiting) when it is
    // deregistered, or, in the other half of the trials, is completed by the
    // close itself (LOCAL_CLOSE, no deregister: the new registration
    // supersedes). Either way its packet is still queued when the number's new
    // socket is registered and armed: it must be dropped, never delivered.
    let p = Poller::new().unwrap();
    let mut reused = 0;
    for trial in 0..TRIALS {
        let (mut a, b) = tcp_pair();
        let value = b.as_raw_socket();
        let old = p.register_with(&b, 1).unwrap();
        p.arm(old, Interest::READABLE).unwrap();
        a.write_all(b"x").unwrap();
        if trial % 2 == 0 {
            p.deregister(old).unwrap();
        }
        drop(b);
        let Some((_a2, b2)) = pair_with_value(value) else {
            if trial % 2 == 1 {
                p.deregister(old).unwrap();
            }
            notify_and_see_nothing(&p);
            continue;
        };
        reused += 1;
        let new = p.register_with(&b2, 2).unwrap();
        assert_eq!(new.index(), old.index(), "trial {trial}");
        p.arm(new, Interest::READABLE).unwrap();
        // The new socket has nothing to read: no event at all.
        notify_and_see_nothing(&p);
        assert_eq!(
            p.arm(old, Interest::READABLE).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        p.deregister(new).unwrap();
        assert!(p.is_empty(), "trial {trial}");
    }
    assert!(reused > 0, "no trial reused the number");
}

#[test]
fn a_socket_and_its_duplicate_are_two_registrations() {
    // `try_clone` is WSADuplicateSocketW: another handle value for the same
    // socket (under wine, the same base handle too). Each registration polls on
    // its own and each gets its event; a deregister of one leaves the other.
    let p = Poller::new().unwrap();
    for trial in 0..TRIALS {
        let (mut a, b) = tcp_pair();
        let dup = b.try_clone().unwrap();
        assert_ne!(dup.as_raw_socket(), b.as_raw_socket());
        let t1 = p.register_with(&b, 1).unwrap();
        let t2 = p.register_with(&dup, 2).unwrap();
        assert_ne!(t1.index(), t2.index());
        p.arm(t1, Interest::READABLE).unwrap();
        p.arm(t2, Interest::READABLE).unwrap();
        a.write_all(b"x").unwrap();
        let mut keys = Vec::new();
        let mut events = Events::with_capacity(8);
        while keys.len() < 2 {
            p.deliver(&mut events, LONG).unwrap();
            keys.extend(events.iter().map(|e| e.key()));
        }
        keys.sort();
        assert_eq!(keys, [1, 2], "trial {trial}");
        p.deregister(t1).unwrap();
        p.arm(t2, Interest::READABLE).unwrap();
        assert_eq!(one(&p).token(), t2, "trial {trial}");
        p.deregister(t2).unwrap();
        notify_and_see_nothing(&p);
        drop(dup);
        drop(b);
    }
}

#[test]
fn a_deregister_racing_a_ready_socket_and_a_blocked_deliver() {
    // A thread blocks in deliver; another makes the socket ready and
    // deregisters it at the same moment. The deliver may report the event
    // (accepted before the deregister took the slot) or not; once both are
    // done, nothing more of it ever comes, and the socket closes at once.
    let p = Arc::new(Poller::new().unwrap());
    let (mut seen, mut missed) = (0, 0);
    for trial in 0..TRIALS {
        let (mut a, b) = tcp_pair();
        let t = p.register_with(&b, trial).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        let waiter = {
            let p = Arc::clone(&p);
            thread::spawn(move || {
                let mut events = Events::with_capacity(8);
                p.deliver(&mut events, LONG).unwrap();
                events
                    .iter()
                    .map(|e| (e.token(), e.key()))
                    .collect::<Vec<_>>()
            })
        };
        until_waiters(&p, 1);
        let (go, writer) = on_cue(move || {
            a.write_all(b"x").unwrap();
            a
        });
        go.wait();
        p.deregister(t).unwrap();
        drop(b);
        let _a = writer.join().unwrap();
        p.notify().unwrap();
        let got = waiter.join().unwrap();
        match got.as_slice() {
            [] => missed += 1,
            [(tok, key)] => {
                assert_eq!((*tok, *key), (t, trial), "trial {trial}");
                seen += 1;
            }
            more => panic!("trial {trial}: {more:?}"),
        }
        if !got.is_empty() {
            // The notify is still queued: take it.
            notify_and_see_nothing(&p);
        }
        notify_and_see_nothing(&p);
        assert!(p.is_empty());
    }
    assert_eq!(seen + missed, TRIALS);
}

#[test]
fn a_thousand_rearms_with_data_pending_leave_one_event_and_every_poll_drained() {
    // Data is waiting, so every poll completes at once; each re-arm with the
    // other interest issues a new poll and cancels the old one, whose packet is
    // then dropped as stale. After the storm: one event for the last arming,
    // and exactly one stale packet per superseded poll (none lost, none twice).
    const ROUNDS: usize = 1000;
    let p = Poller::new().unwrap();
    let (mut a, b) = tcp_pair();
    a.write_all(b"x").unwrap();
    let t = p.register(&b).unwrap();
    let before = p.stats();
    for i in 0..ROUNDS {
        let interest = if i % 2 == 0 {
            Interest::READABLE
        } else {
            Interest::WRITABLE
        };
        p.arm(t, interest).unwrap();
        if i % 4 == 3 {
            // Disarm and arm again at once, with the same interest.
            p.disarm(t).unwrap();
            p.arm(t, interest).unwrap();
        }
    }
    // The last arming is WRITABLE (ROUNDS is even): its event, then nothing.
    let e = one(&p);
    assert_eq!(e.token(), t);
    assert!(e.is_writable() && !e.is_readable(), "{e:?}");
    notify_and_see_nothing(&p);
    let s = p.stats().since(&before);
    let polls = s.adds + s.modifies;
    assert_eq!(s.adds, 1);
    assert_eq!(s.quiets, (ROUNDS / 4) as u64);
    assert_eq!(polls, (ROUNDS + ROUNDS / 4) as u64, "{s:?}");
    assert_eq!(
        s.stale,
        polls - 1,
        "one stale packet per superseded poll: {s:?}"
    );
    // And the socket still works: the data is there.
    p.arm(t, Interest::READABLE).unwrap();
    assert!(one(&p).is_readable());
    let mut buf = [0u8; 4];
    assert_eq!((&b).read(&mut buf).unwrap(), 1);
    p.deregister(t).unwrap();
}

#[test]
fn a_post_storm_with_notifies_delivers_each_post_once_then_shutdown_wakes_all() {
    const THREADS: usize = 4;
    const POSTS: usize = 2000;
    let p = Arc::new(Poller::new().unwrap());
    let seen = Arc::new(Mutex::new(HashMap::<usize, usize>::new()));
    let total = Arc::new(AtomicUsize::new(0));
    let waiters: Vec<_> = (0..THREADS)
        .map(|_| {
            let (p, seen, total) = (Arc::clone(&p), Arc::clone(&seen), Arc::clone(&total));
            thread::spawn(move || {
                let mut events = Events::with_capacity(3);
                loop {
                    p.deliver(&mut events, LONG).unwrap();
                    for e in events.iter() {
                        assert!(e.is_posted(), "{e:?}");
                        *seen.lock().unwrap().entry(e.key()).or_default() += 1;
                        total.fetch_add(1, Ordering::SeqCst);
                    }
                    if events.is_shutdown() {
                        return;
                    }
                }
            })
        })
        .collect();
    let posters: Vec<_> = (0..THREADS)
        .map(|i| {
            let p = Arc::clone(&p);
            thread::spawn(move || {
                for j in 0..POSTS {
                    p.post(i * POSTS + j, Interest::READABLE).unwrap();
                    if j % 7 == 0 {
                        p.notify().unwrap();
                    }
                }
            })
        })
        .collect();
    for t in posters {
        t.join().unwrap();
    }
    let start = Instant::now();
    while total.load(Ordering::SeqCst) < THREADS * POSTS {
        assert!(start.elapsed() < LONG.unwrap(), "posts lost");
        thread::sleep(Duration::from_millis(1));
    }
    p.shutdown().unwrap();
    for w in waiters {
        w.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), THREADS * POSTS);
    assert!(seen.values().all(|&n| n == 1), "a post delivered twice");
}

#[test]
fn an_event_a_pipe_and_a_closed_handle_are_not_sockets() {
    use std::os::windows::io::RawSocket;
    let p = Poller::new().unwrap();
    let ev = event(true);
    // A child's stdin and stdout: the two ends of anonymous pipes.
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--list")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (r, w) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let closed = {
        let (_a, b) = tcp_pair();
        b.as_raw_socket()
    };
    for h in [
        ev.as_raw_handle() as RawSocket,
        r.as_raw_handle() as RawSocket,
        w.as_raw_handle() as RawSocket,
        closed,
    ] {
        // SAFETY: the poller only queries the value (the query fails).
        let e = unsafe { p.register_raw(h) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{h:#x}: {e}");
        assert!(e.to_string().contains("not a socket"), "{e}");
    }
    assert!(p.is_empty());
    drop((r, w));
    child.wait().unwrap();
}

#[test]
fn a_token_of_another_poller_is_not_found_here() {
    let (p, q) = (Poller::new().unwrap(), Poller::new().unwrap());
    let (_a, b) = tcp_pair();
    let t = p.register(&b).unwrap();
    for r in [q.arm(t, Interest::READABLE), q.disarm(t), q.deregister(t)] {
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::NotFound);
    }
    // q registering the same socket makes a token of its own.
    let u = q.register(&b).unwrap();
    assert_ne!(t, u);
    p.arm(t, Interest::WRITABLE).unwrap();
    q.arm(u, Interest::WRITABLE).unwrap();
    assert_eq!(one(&p).token(), t);
    assert_eq!(one(&q).token(), u);
}

#[test]
fn edge_capacities_and_timeouts() {
    let p = Poller::new().unwrap();
    // Capacity 0 is 1: no event is dropped for want of room.
    let mut events = Events::with_capacity(0);
    assert_eq!(events.capacity(), 1);
    for key in [1, 2, 3] {
        p.post(key, Interest::WRITABLE).unwrap();
    }
    let mut keys = Vec::new();
    for _ in 0..3 {
        assert_eq!(p.deliver(&mut events, LONG).unwrap(), 1);
        keys.push(events.iter().next().unwrap().key());
    }
    assert_eq!(keys, [1, 2, 3]);
    // The largest capacity takes what is queued, and no more.
    let mut big = Events::with_capacity(usize::MAX);
    p.post(usize::MAX, Interest::BOTH).unwrap();
    assert_eq!(p.deliver(&mut big, LONG).unwrap(), 1);
    assert_eq!(big.iter().next().unwrap().key(), usize::MAX);
    // A nanosecond waits (at least a millisecond) and returns empty; a wait
    // of Duration::MAX returns for a queued post.
    let (n, s) = delta(&p, || {
        p.deliver(&mut events, Some(Duration::from_nanos(1)))
            .unwrap()
    });
    assert_eq!(n, 0);
    assert!(!events.is_notified());
    assert!(s.waits >= 1);
    p.post(7, Interest::READABLE).unwrap();
    assert_eq!(p.deliver(&mut events, Some(Duration::MAX)).unwrap(), 1);
    assert_eq!(events.iter().next().unwrap().key(), 7);
}

#[test]
fn more_completions_than_capacity_lose_none() {
    // Sockets, events and posts, more than a wait's batch of 256 in all, taken
    // 3 at a time: each exactly once.
    const SOCKETS: usize = 16;
    const EVENTS: usize = 16;
    const POSTS: usize = 300;
    let p = Poller::new().unwrap();
    let pairs: Vec<_> = (0..SOCKETS).map(|_| tcp_pair()).collect();
    let evs: Vec<OwnedHandle> = (0..EVENTS).map(|_| event(true)).collect();
    for (i, (a, b)) in pairs.iter().enumerate() {
        let t = p.register_with(b, 1_000 + i).unwrap();
        (&*a).write_all(b"x").unwrap();
        p.arm(t, Interest::READABLE).unwrap();
    }
    for (i, ev) in evs.iter().enumerate() {
        let t = p.register_waitable(ev, 2_000 + i).unwrap();
        set(ev);
        p.arm(t, Interest::READABLE).unwrap();
    }
    for i in 0..POSTS {
        p.post(3_000 + i, Interest::READABLE).unwrap();
    }
    let mut seen = HashMap::<usize, usize>::new();
    let mut events = Events::with_capacity(3);
    while seen.len() < SOCKETS + EVENTS + POSTS {
        let n = p.deliver(&mut events, LONG).unwrap();
        assert!((1..=3).contains(&n), "{n}");
        for e in events.iter() {
            *seen.entry(e.key()).or_default() += 1;
        }
    }
    assert!(seen.values().all(|&n| n == 1));
    notify_and_see_nothing(&p);
    assert_eq!(p.stats().stale, 0);
}

#[test]
fn a_closed_sockets_number_reused_by_an_event_and_back() {
    // Handles and sockets share the value space. A socket closed while armed,
    // its number given to an event: the event's registration supersedes the
    // socket's, whose completion (LOCAL_CLOSE) is never delivered. Then that
    // event closed while armed, its number given to a socket: the same.
    let p = Poller::new().unwrap();
    let (mut to_event, mut to_socket) = (0, 0);
    for trial in 0..TRIALS {
        let (_a, b) = tcp_pair();
        let value = b.as_raw_socket();
        let ts = p.register_with(&b, 1).unwrap();
        p.arm(ts, Interest::READABLE).unwrap();
        drop(b);
        let Some(ev) = event_with_value(value) else {
            p.deregister(ts).unwrap();
            notify_and_see_nothing(&p);
            continue;
        };
        to_event += 1;
        let te = p.register_waitable(&ev, 2).unwrap();
        assert_eq!(te.index(), ts.index());
        p.arm(te, Interest::READABLE).unwrap();
        notify_and_see_nothing(&p);
        set(&ev);
        assert_eq!(one(&p).key(), 2, "trial {trial}");
        // Armed again (still set: it fires at once), then closed.
        p.arm(te, Interest::READABLE).unwrap();
        drop(ev);
        let Some((mut a2, b2)) = pair_with_value(value) else {
            p.deregister(te).unwrap();
            notify_and_see_nothing(&p);
            continue;
        };
        to_socket += 1;
        let t2 = p.register_with(&b2, 3).unwrap();
        p.arm(t2, Interest::READABLE).unwrap();
        notify_and_see_nothing(&p);
        a2.write_all(b"x").unwrap();
        let e = one(&p);
        assert_eq!((e.token(), e.key()), (t2, 3), "trial {trial}");
        p.deregister(t2).unwrap();
        assert!(p.is_empty());
    }
    assert!(to_event > 0 && to_socket > 0, "{to_event} {to_socket}");
}

#[test]
fn rearms_racing_two_delivering_threads_account_for_every_poll_once() {
    // Data is waiting, so every poll completes at once, while two threads
    // dequeue. Each poll issued (an add or a modify) ends as exactly one
    // packet: delivered as an event, or dropped as stale (cancelled, or of an
    // older arming). None is lost, none counted twice.
    const ROUNDS: usize = 1000;
    let p = Arc::new(Poller::new().unwrap());
    let (mut a, b) = tcp_pair();
    a.write_all(b"x").unwrap();
    let t = p.register(&b).unwrap();
    let delivered = Arc::new(AtomicUsize::new(0));
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let (p, delivered) = (Arc::clone(&p), Arc::clone(&delivered));
            thread::spawn(move || {
                let mut events = Events::with_capacity(2);
                loop {
                    p.deliver(&mut events, LONG).unwrap();
                    for e in events.iter() {
                        assert_eq!(e.token(), t);
                        delivered.fetch_add(1, Ordering::SeqCst);
                    }
                    if events.is_shutdown() {
                        return;
                    }
                }
            })
        })
        .collect();
    let before = p.stats();
    for i in 0..ROUNDS {
        let interest = [Interest::READABLE, Interest::WRITABLE, Interest::BOTH][i % 3];
        p.arm(t, interest).unwrap();
        if i % 5 == 4 {
            p.disarm(t).unwrap();
        }
    }
    p.disarm(t).unwrap();
    let accounted = |s: &Stats| delivered.load(Ordering::SeqCst) as u64 + s.stale;
    let start = Instant::now();
    loop {
        let s = p.stats().since(&before);
        if accounted(&s) >= s.adds + s.modifies {
            break;
        }
        assert!(start.elapsed() < LONG.unwrap(), "packets lost: {s:?}");
        thread::sleep(Duration::from_millis(1));
    }
    p.shutdown().unwrap();
    for w in waiters {
        w.join().unwrap();
    }
    let s = p.stats().since(&before);
    assert_eq!(accounted(&s), s.adds + s.modifies, "{s:?}");
    assert!(s.adds + s.modifies >= (ROUNDS / 3) as u64, "{s:?}");
    p.deregister(t).unwrap();
}

#[test]
fn closing_one_handle_of_a_duplicated_socket_leaves_the_other_registration() {
    // The socket lives on through its other handle: a registration of that
    // handle sees no close, and the socket's data later.
    let p = Poller::new().unwrap();
    for trial in 0..TRIALS {
        let (mut a, b) = tcp_pair();
        let dup = b.try_clone().unwrap();
        let t = p.register(&dup).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        drop(b);
        let mut events = Events::with_capacity(8);
        p.notify().unwrap();
        p.deliver(&mut events, LONG).unwrap();
        assert!(
            events.is_empty(),
            "trial {trial}: before any data: {events:?}"
        );
        a.write_all(b"x").unwrap();
        let e = one(&p);
        assert!(
            e.is_readable() && !e.is_read_closed(),
            "trial {trial}: {e:?}"
        );
        let mut buf = [0u8; 4];
        assert_eq!((&dup).read(&mut buf).unwrap(), 1);
        p.deregister(t).unwrap();
    }
}

#[test]
fn arm_of_a_socket_registration_whose_number_is_now_an_event_is_wsaenotsock() {
    // The socket was closed without a deregister and its number went to an
    // event: the first arm finds no socket there, as for a closed one
    // (`windows_closed.rs`), and says so the same way. Nothing is delivered.
    let p = Poller::new().unwrap();
    let mut reused = 0;
    for trial in 0..TRIALS {
        let (_a, b) = tcp_pair();
        let value = b.as_raw_socket();
        let t = p.register(&b).unwrap();
        drop(b);
        if let Some(_ev) = event_with_value(value) {
            reused += 1;
            let e = p.arm(t, Interest::READABLE).unwrap_err();
            assert_eq!(
                e.raw_os_error(),
                Some(10038),
                "trial {trial}: WSAENOTSOCK: {e}"
            );
            notify_and_see_nothing(&p);
        }
        p.deregister(t).unwrap();
    }
    assert!(reused > 0, "no trial reused the number");
}
