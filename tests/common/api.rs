//! The runtime author's API: shutdown (every worker stops, blocked or about to
//! block), the user key per registration, priority events.
//!
//! Races are repeated in one test and every trial is asserted; the only clocks are
//! generous deadlines that turn a hang into a failure.

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One trial of the stop scenario: `k` workers loop on "check the stop flag, then
/// `deliver`" (a timeout far beyond the test's deadline), the main thread sets the
/// flag and calls `shutdown` once. Every worker must come back well before its
/// timeout: returns how many of them saw the shutdown in `deliver` (the others saw
/// the flag first).
fn stop_trial<B: Backend, D: Fd>(
    k: usize,
    done: &mpsc::Sender<(usize, bool)>,
    rx: &mpsc::Receiver<(usize, bool)>,
) -> usize {
    let poller = Arc::new(poller::<B>());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..k)
        .map(|i| {
            let (poller, stop, done) = (Arc::clone(&poller), Arc::clone(&stop), done.clone());
            std::thread::spawn(move || {
                let mut events = Events::with_capacity(8);
                // The worker's loop: check the flag, then deliver; a deliver
                // returns only shut down here (nothing is registered).
                let mut saw_shutdown = false;
                if !stop.load(Ordering::SeqCst) {
                    let n = poller
                        .deliver(&mut events, Some(Duration::from_secs(3600)))
                        .expect("deliver");
                    assert_eq!(n, 0, "nothing is registered");
                    assert!(
                        events.is_shutdown(),
                        "worker {i}: deliver returned neither events nor shut down"
                    );
                    saw_shutdown = true;
                }
                let _ = done.send((i, saw_shutdown));
            })
        })
        .collect();
    stop.store(true, Ordering::SeqCst);
    poller.shutdown().expect("shutdown");
    let mut saw = 0;
    for _ in 0..k {
        match rx.recv_timeout(LOST_AFTER) {
            Ok((_, s)) => saw += s as usize,
            Err(_) => panic!("a worker did not stop within {LOST_AFTER:?} of the shutdown"),
        }
    }
    for w in workers {
        w.join().expect("worker");
    }
    // Sticky: a later deliver, even one with no timeout, returns at once.
    let mut events = Events::with_capacity(8);
    assert_eq!(poller.deliver(&mut events, None).expect("deliver"), 0);
    assert!(events.is_shutdown());
    saw
}

/// Issue 18's scenario, 1000 times: 2, 3 and 4 workers that check a stop flag
/// before `deliver`; one `shutdown` stops them all, in every trial.
pub fn api_shutdown_stops_k_workers_blocked_or_about_to_block_1000_trials<B: Backend, D: Fd>() {
    let (tx, rx) = mpsc::channel();
    let mut saw = 0;
    let mut workers = 0;
    for trial in 0..1000 {
        let k = 2 + trial % 3;
        saw += stop_trial::<B, D>(k, &tx, &rx);
        workers += k;
    }
    eprintln!("1000 trials, {workers} workers: {saw} returned from deliver shut down");
}

/// Blocked workers return from `shutdown` with what they had; events already in
/// the kernel are not lost to a shutdown that comes after them; everything but
/// `deliver` keeps working.
pub fn api_shutdown_keeps_arm_and_deregister_working<B: Backend, D: Fd>() {
    let p = Arc::new(poller::<B>());
    let (a, b) = D::socketpair();
    let t = b.register(&p).unwrap();
    let blocked: Vec<_> = (0..2)
        .map(|_| {
            let p = Arc::clone(&p);
            std::thread::spawn(move || {
                let mut events = Events::with_capacity(8);
                let n = p.deliver(&mut events, None).unwrap();
                (
                    n,
                    events.is_shutdown(),
                    events.iter().map(|e| e.token()).collect::<Vec<_>>(),
                )
            })
        })
        .collect();
    // Both blocked (counted) before the shutdown: the one wake-up reaches both.
    #[cfg(feature = "stats")]
    while p.waiters() < 2 {
        std::thread::yield_now();
    }
    p.shutdown().unwrap();
    for h in blocked {
        let (n, shut, _) = within("a blocked deliver after shutdown", move || {
            h.join().unwrap()
        });
        assert_eq!((n, shut), (0, true));
    }
    // A ready registration: deliver still says shut down, without waiting or
    // taking the event; arm and deregister work.
    p.arm(t, pollshot::Interest::READABLE).unwrap();
    a.write_all(b"x");
    let mut events = Events::with_capacity(8);
    assert_eq!(p.deliver(&mut events, None).unwrap(), 0);
    assert!(events.is_shutdown() && !events.is_notified());
    p.disarm(t).unwrap();
    p.deregister(t).unwrap();
    assert!(p.is_empty());
}

/// A connected TCP pair on the loopback: (client, accepted server side), both
/// non-blocking.
fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    client.set_nonblocking(true).unwrap();
    server.set_nonblocking(true).unwrap();
    (client, server)
}

/// Sends one byte of TCP urgent data (send(2) with `MSG_OOB`).
fn send_urgent(s: &TcpStream, byte: u8) {
    // SAFETY: send(2) on an open socket with a valid one-byte buffer.
    let n = unsafe { libc::send(s.as_raw_fd(), (&byte as *const u8).cast(), 1, libc::MSG_OOB) };
    assert_eq!(n, 1, "send(MSG_OOB): {}", io::Error::last_os_error());
}

/// Reads the urgent byte (recv(2) with `MSG_OOB`).
fn recv_urgent(s: &TcpStream) -> io::Result<u8> {
    let mut byte = 0u8;
    // SAFETY: recv(2) on an open socket into a valid one-byte buffer.
    let n = unsafe {
        libc::recv(
            s.as_raw_fd(),
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_OOB,
        )
    };
    if n == 1 {
        Ok(byte)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// TCP urgent data wakes a waiter armed for `PRIORITY` alone and one armed for
/// `READABLE | PRIORITY`, reported as priority (and not readable: the urgent
/// byte alone leaves an ordinary read blocking); ordinary data does not end a
/// `PRIORITY`-only arming. kqueue refuses the interest with `Unsupported`.
pub fn api_priority_tcp_urgent_data_wakes_a_priority_waiter<B: Backend>() {
    use pollshot::Interest;
    let p = poller::<B>();
    let (mut client, server) = tcp_pair();
    let t = p.register(&server).unwrap();
    if p.backend_name() == "kqueue" {
        let e = p
            .arm(t, Interest::READABLE | Interest::PRIORITY)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
        assert!(e.to_string().contains("PRIORITY"), "{e}");
        p.arm(t, Interest::READABLE).unwrap(); // the registration is unchanged
        return;
    }
    if p.backend_name() == "uring" {
        // PRIORITY needs READABLE there (see `Interest::PRIORITY`).
        let e = p.arm(t, Interest::PRIORITY).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
        let e = p
            .arm(t, Interest::WRITABLE | Interest::PRIORITY)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
        p.arm(t, Interest::READABLE | Interest::PRIORITY).unwrap();
        send_urgent(&client, b'!');
        let e = expect_one(&p, t);
        assert!(e.is_priority() && !e.is_writable(), "{e:?}");
        assert_eq!(recv_urgent(&server).unwrap(), b'!');
        client.write_all(b"more").unwrap();
        p.arm(t, Interest::READABLE | Interest::PRIORITY).unwrap();
        let e = expect_one(&p, t);
        assert!(e.is_readable() && !e.is_priority(), "{e:?}");
        p.deregister(t).unwrap();
        return;
    }
    // PRIORITY alone: ordinary data does not end the arming.
    p.arm(t, Interest::PRIORITY).unwrap();
    client.write_all(b"data").unwrap();
    assert_no_events(&p, 8, Duration::from_millis(50));
    // The urgent byte does, once.
    send_urgent(&client, b'!');
    let e = expect_one(&p, t);
    assert!(e.is_priority(), "{e:?}");
    assert!(
        !e.is_readable() && !e.is_writable(),
        "only priority was asked: {e:?}"
    );
    // Not re-armed: nothing more.
    assert_no_events(&p, 8, Duration::from_millis(20));
    assert_eq!(recv_urgent(&server).unwrap(), b'!');
    let mut buf = [0u8; 16];
    assert_eq!(
        (&server).read(&mut buf).unwrap(),
        4,
        "the ordinary data is intact"
    );
    // READABLE | PRIORITY: urgent data is priority; ordinary data readable only.
    p.arm(t, Interest::READABLE | Interest::PRIORITY).unwrap();
    send_urgent(&client, b'?');
    let e = expect_one(&p, t);
    assert!(e.is_priority(), "{e:?}");
    assert_eq!(recv_urgent(&server).unwrap(), b'?');
    // Nothing urgent is pending now (the mark was read): ordinary data is
    // readable, not priority.
    client.write_all(b"more").unwrap();
    p.arm(t, Interest::READABLE | Interest::PRIORITY).unwrap();
    let e = expect_one(&p, t);
    assert!(e.is_readable() && !e.is_priority(), "{e:?}");
    assert_eq!((&server).read(&mut buf).unwrap(), 4);
    p.deregister(t).unwrap();
}

/// `Interest` values with `PRIORITY` print and compare as expected.
pub fn api_priority_interest_values<B: Backend, D: Fd>() {
    use pollshot::Interest;
    let rp = Interest::READABLE | Interest::PRIORITY;
    assert!(rp.is_readable() && rp.is_priority() && !rp.is_writable());
    assert_eq!(format!("{rp:?}"), "READABLE | PRIORITY");
    assert_eq!(format!("{:?}", Interest::BOTH), "BOTH");
    assert_eq!(Interest::from_bits(rp.bits()), Some(rp));
    assert_eq!(Interest::from_bits(8), None);
    assert_eq!(Interest::from_bits(0), None);
    assert_eq!(Interest::ALL.len(), 7);
    // A registration armed for priority on a pipe never reports readable.
    let p = poller::<B>();
    let (r, w) = D::pipe();
    let t = r.register(&p).unwrap();
    match p.arm(t, Interest::PRIORITY) {
        Err(e) => assert_eq!(e.kind(), io::ErrorKind::Unsupported),
        Ok(()) => {
            w.write_all(b"x");
            assert_no_events(&p, 8, Duration::from_millis(20));
        }
    }
    p.deregister(t).unwrap();
}

/// The key rides on every event of its registration: kernel events and an
/// always-ready registration's synthetic ones; `set_key` changes it for the
/// events accepted after it; a plain `register` has key 0; a stale token cannot
/// set a key.
pub fn api_key_rides_on_events_and_set_key_changes_it<B: Backend>() {
    use pollshot::Interest;
    let p = poller::<B>();
    let (mut a, b) = UnixStream::pair().unwrap();
    b.set_nonblocking(true).unwrap();
    let t = p.register_with(&b, 0xdead_beef).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    a.write_all(b"x").unwrap();
    let e = expect_one(&p, t);
    assert_eq!(e.key(), 0xdead_beef);
    p.set_key(t, usize::MAX).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    assert_eq!(expect_one(&p, t).key(), usize::MAX);
    p.deregister(t).unwrap();
    assert_eq!(
        err_kind(p.set_key(t, 1)),
        io::ErrorKind::NotFound,
        "a deregistered token"
    );
    // A plain register: key 0.
    let t = p.register(&b).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    assert_eq!(expect_one(&p, t).key(), 0);
    p.deregister(t).unwrap();
    // Always ready (/dev/null): the synthetic event carries the key too.
    let null = File::open("/dev/null").unwrap();
    let t = p.register_with(&null, 77).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    assert_eq!(expect_one(&p, t).key(), 77);
    p.deregister(t).unwrap();
}

/// Issue 18's race, 200 trials: a thread delivers while another deregisters a
/// ready, armed registration (its event may be in the kernel's queue, or fetched
/// already by the deliverer) and registers the same descriptor number again at
/// once, with another key, armed and ready. Every event's key is the key of the
/// registration its token names (never the other one's), the old registration
/// yields at most one event, the new one exactly one.
pub fn api_key_never_stale_across_deregister_and_reregistration_by_another_thread<
    B: Backend,
    D: Fd,
>() {
    use pollshot::Interest;
    use std::collections::HashMap;
    use std::sync::Mutex;
    const TRIALS: usize = 200;
    let p = Arc::new(poller::<B>());
    // Token -> key, written before the registration is armed.
    let keys: Arc<Mutex<HashMap<Token, usize>>> = Arc::default();
    let (tx, rx) = mpsc::channel::<Event>();
    let stop = Arc::new(AtomicBool::new(false));
    let deliverer = {
        let (p, stop) = (Arc::clone(&p), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut events = Events::with_capacity(16);
            while !stop.load(Ordering::SeqCst) {
                p.deliver(&mut events, Some(Duration::from_millis(100)))
                    .or_else(|e| {
                        if e.kind() == io::ErrorKind::Interrupted {
                            Ok(0)
                        } else {
                            Err(e)
                        }
                    })
                    .unwrap();
                for e in &events {
                    tx.send(*e).unwrap();
                }
            }
        })
    };
    let mut old_seen = 0;
    for trial in 0..TRIALS {
        let (a1, b1) = D::socketpair();
        let number = b1.raw();
        let k1 = 2 * trial + 1;
        let t1 = b1.register_with(&p, k1).unwrap();
        keys.lock().unwrap().insert(t1, k1);
        p.arm(t1, Interest::READABLE).unwrap();
        a1.write_all(b"1");
        // Another thread: deregister, close, reuse the number, register again.
        let (p2, keys2) = (Arc::clone(&p), Arc::clone(&keys));
        let (t2, k2, _a2, b2) = std::thread::spawn(move || {
            let (a2, b2) = D::socketpair();
            p2.deregister(t1).unwrap();
            // The new socket takes the old number (dup2 closes the old one).
            let mut b1 = b1;
            b2.dup_onto(&mut b1);
            let b2 = b1;
            assert_eq!(b2.raw(), number);
            let k2 = 2 * trial + 2;
            let t2 = b2.register_with(&p2, k2).unwrap();
            keys2.lock().unwrap().insert(t2, k2);
            p2.arm(t2, Interest::READABLE).unwrap();
            a2.write_all(b"2");
            (t2, k2, a2, b2)
        })
        .join()
        .unwrap();
        assert_eq!(t2.index(), t1.index(), "the number was reused");
        // Events until the new registration's one.
        loop {
            let e = rx
                .recv_timeout(LOST_AFTER)
                .unwrap_or_else(|_| panic!("trial {trial}: the new registration's event was lost"));
            let want = keys.lock().unwrap().get(&e.token()).copied();
            assert_eq!(
                Some(e.key()),
                want,
                "trial {trial}: event {e:?} carries a key not its registration's"
            );
            if e.token() == t1 {
                old_seen += 1;
                assert_eq!(e.key(), k1);
                continue;
            }
            assert_eq!((e.token(), e.key()), (t2, k2), "trial {trial}");
            break;
        }
        p.deregister(t2).unwrap();
        drop(b2);
        // Nothing else for either registration.
        if let Ok(e) = rx.try_recv() {
            panic!("trial {trial}: an extra event {e:?}");
        }
    }
    stop.store(true, Ordering::SeqCst);
    deliverer.join().unwrap();
    eprintln!("{TRIALS} trials: the old registration's event was delivered (before its deregistration) in {old_seen}");
}
