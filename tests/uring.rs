//! The shared suite (`tests/common`) on the io_uring backend (cargo feature
//! `io-uring`), and what only io_uring has: cancelled, failed and overflowing
//! completions, and a refusal by the kernel.
#![cfg(all(target_os = "linux", feature = "io-uring"))]

#[macro_use]
mod common;

suite!(pollshot::backends::Uring);

mod uring_only {
    use crate::common::{assert_no_events, expect_one, pipe, poller, socketpair, LOST_AFTER};
    use pollshot::backends::Uring;
    use pollshot::{Events, Interest, Poller, Token};
    use std::collections::HashSet;
    use std::io::{self, Read, Write};
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::time::{Duration, Instant};

    /// The kernel accepts io_uring here. `.ci/run` runs this first: a panic whose
    /// message starts with "REFUSED" means the kernel (or a seccomp filter) refuses
    /// io_uring, and the rest of this file is skipped with a printed line.
    #[test]
    fn kernel_accepts_io_uring() {
        match Poller::<Uring>::with_backend() {
            Ok(p) => assert_eq!(p.backend_name(), "uring"),
            Err(e) if e.kind() == io::ErrorKind::Unsupported => panic!("REFUSED: {e}"),
            Err(e) => panic!("io_uring poller: {e}"),
        }
    }

    /// A `deliver(None)` stays blocked while another thread registers, arms and
    /// deregisters 1,000 sockets, and the notify then ends it. Its wait goes round
    /// once per completion it does not deliver (the removes' answers): a `u8`
    /// count of its enters overflowed past 255 (a panic in a debug build, in 5 of
    /// 5 trials on the old code; found by a breaking helper). 5 trials.
    #[cfg(feature = "stats")]
    #[test]
    fn blocked_deliver_outlasts_1000_deregisters() {
        use std::os::unix::net::UnixStream;
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        for trial in 0..5 {
            let p = Arc::new(poller::<Uring>());
            let done = Arc::new(AtomicBool::new(false));
            let blocked = {
                let (p, done) = (Arc::clone(&p), Arc::clone(&done));
                std::thread::spawn(move || {
                    let mut events = Events::with_capacity(4);
                    loop {
                        match p.deliver(&mut events, None) {
                            // io_uring's task work can end a wait with no signal.
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            r => {
                                r.expect("deliver");
                                if events.is_notified() || done.load(Ordering::SeqCst) {
                                    return events.is_notified();
                                }
                            }
                        }
                    }
                })
            };
            crate::common::wakeups::until_waiters(&p, 1);
            for _ in 0..1000 {
                let (_a, b) = UnixStream::pair().unwrap();
                let t = p.register(&b).unwrap();
                p.arm(t, Interest::READABLE).unwrap();
                p.deregister(t).unwrap();
            }
            done.store(true, Ordering::SeqCst);
            p.notify().unwrap();
            assert!(
                blocked.join().expect("the blocked deliver panicked"),
                "trial {trial}: the blocked deliver ended without the notify"
            );
        }
    }

    /// Registrations churned on a ring that threads poll, one a timeout of
    /// `timeouts` (`None`: no limit): one thread loops over a fresh socket pair,
    /// `register`, `arm`, `yield_now`, `deregister` (and a `notify` after each
    /// where `notify_each`), `CHURN` times a trial or for `churn_for`, whichever
    /// ends first (a bound on the test's length, not an assertion). Returns how
    /// many of `trials` trials made no progress for 10 s (a watchdog: the churn
    /// thread stuck in a `deregister`). A stuck trial is freed by notifies, so
    /// the next one runs.
    fn churn_beside_pollers(
        timeouts: &[Option<Duration>],
        notify_each: bool,
        churn_for: Duration,
        trials: usize,
    ) -> usize {
        use std::os::unix::net::UnixStream;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        const CHURN: u64 = 1_000;
        const STUCK: Duration = Duration::from_secs(10);
        let mut hung = 0;
        for _ in 0..trials {
            let p = Arc::new(poller::<Uring>());
            let stop = Arc::new(AtomicBool::new(false));
            let done = Arc::new(AtomicU64::new(0));
            let polling: Vec<_> = timeouts
                .iter()
                .map(|&timeout| {
                    let (p, stop) = (Arc::clone(&p), Arc::clone(&stop));
                    std::thread::spawn(move || {
                        let mut events = Events::with_capacity(8);
                        while !stop.load(Ordering::Relaxed) {
                            match p.deliver(&mut events, timeout) {
                                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                                r => {
                                    r.expect("deliver");
                                }
                            }
                        }
                    })
                })
                .collect();
            let churn = {
                let (p, done) = (Arc::clone(&p), Arc::clone(&done));
                std::thread::spawn(move || {
                    let start = Instant::now();
                    for _ in 0..CHURN {
                        if start.elapsed() > churn_for {
                            break;
                        }
                        let (_a, b) = UnixStream::pair().unwrap();
                        let t = p.register(&b).unwrap();
                        p.arm(t, Interest::READABLE).unwrap();
                        std::thread::yield_now();
                        p.deregister(t).unwrap();
                        if notify_each {
                            p.notify().unwrap();
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            };
            let (mut seen, mut since) = (0, Instant::now());
            let mut stuck = false;
            while !churn.is_finished() {
                std::thread::sleep(Duration::from_millis(5));
                let now = done.load(Ordering::Relaxed);
                if now != seen {
                    (seen, since) = (now, Instant::now());
                } else if since.elapsed() > STUCK {
                    // Counted once; notifies free the stuck deregister (the
                    // old code's leader then returns), so the trial ends.
                    stuck = true;
                    p.notify().unwrap();
                    assert!(
                        since.elapsed() < STUCK * 2,
                        "pollers {timeouts:?}: a deregister still stuck after notifies"
                    );
                }
            }
            hung += usize::from(stuck);
            churn.join().expect("churn");
            stop.store(true, Ordering::Relaxed);
            // A poller without a time limit ends at a notify (counted: one
            // each, until every poller has seen the stop).
            while !polling.iter().all(|t| t.is_finished()) {
                p.notify().unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
            for t in polling {
                t.join().expect("poller");
            }
        }
        hung
    }

    /// A `deregister` on a ring that 1, 2 and 3 other threads poll in a loop
    /// with a zero timeout returns: no trial makes no progress for 10 s. Before,
    /// the deregister could lead an `io_uring_enter` waiting for its request's
    /// completion, which a poller had already taken from the queue: it slept in
    /// the kernel until something else completed. 20 trials per shape.
    #[test]
    fn deregister_beside_zero_timeout_pollers_returns() {
        let zero = Some(Duration::ZERO);
        let churn_for = Duration::from_millis(300);
        let hung: Vec<usize> = (1..=3)
            .map(|pollers| churn_beside_pollers(&vec![zero; pollers], false, churn_for, 20))
            .collect();
        assert_eq!(
            hung,
            [0, 0, 0],
            "trials of 20 hung, with 1, 2 and 3 zero-timeout pollers"
        );
    }

    /// The same churn beside pollers of every other kind: a short timeout, a
    /// very short one, none (with and without a notify after each deregister),
    /// and a zero timeout beside a blocking or a short one. 20 trials a shape,
    /// none may hang.
    #[test]
    fn deregister_beside_blocking_and_short_timeout_pollers_returns() {
        let (zero, us, ms) = (
            Some(Duration::ZERO),
            Some(Duration::from_micros(1)),
            Some(Duration::from_millis(1)),
        );
        let shapes: [(&[Option<Duration>], bool); 6] = [
            (&[ms, ms], false),
            (&[us, us], false),
            (&[None, None], false),
            (&[None, None], true),
            (&[zero, None], false),
            (&[zero, ms], false),
        ];
        let churn_for = Duration::from_millis(100);
        let hung: Vec<usize> = shapes
            .iter()
            .map(|&(timeouts, notify_each)| {
                churn_beside_pollers(timeouts, notify_each, churn_for, 20)
            })
            .collect();
        assert_eq!(hung, [0; 6], "trials of 20 hung, per shape {:?}", shapes);
    }

    /// A thread arms a pipe, submits the request with a deliver of its own and
    /// exits before the pipe is written (the kernel would complete its request with
    /// -ECANCELED): another thread's deliver still gets the readiness, exactly once.
    /// 20 trials.
    #[test]
    fn arming_outlives_the_thread_that_submitted_it() {
        for trial in 0..20 {
            let p = std::sync::Arc::new(poller::<Uring>());
            let (r, mut w) = pipe();
            let t = p.register(&r).unwrap();
            arm_on_a_thread_that_exits(&p, t, Interest::READABLE, 1);
            w.write_all(b"x").unwrap();
            // Even a deliver that never blocks gets it (the exiting thread queued
            // its request again; the kernel's -ECANCELED for it comes only when it
            // would fire, a jiffy later, from a kernel worker).
            let mut events = Events::with_capacity(4);
            assert_eq!(
                p.deliver(&mut events, Some(Duration::ZERO)).unwrap(),
                1,
                "trial {trial}"
            );
            let ev = events.iter().next().unwrap();
            assert!(ev.token() == t && ev.is_readable(), "trial {trial}: {ev:?}");
            assert_no_events(&p, 3, Duration::from_millis(2));
            // The registration still works from this thread.
            p.arm(t, Interest::READABLE).unwrap();
            assert!(expect_one(&p, t).is_readable(), "trial {trial}");
        }
    }

    /// A thread arms `t` for `interest`, makes `delivers` delivers that never
    /// block (each must find nothing: the descriptor is not ready) and exits.
    fn arm_on_a_thread_that_exits(
        p: &std::sync::Arc<Poller<Uring>>,
        t: Token,
        interest: Interest,
        delivers: usize,
    ) {
        let q = p.clone();
        std::thread::spawn(move || {
            q.arm(t, interest).unwrap();
            for _ in 0..delivers {
                let n = q
                    .deliver(&mut Events::with_capacity(4), Some(Duration::ZERO))
                    .unwrap();
                assert_eq!(n, 0, "not ready yet");
            }
        })
        .join()
        .unwrap();
    }

    /// The same while another thread is blocked in `deliver(None)` the whole time:
    /// the exiting thread's requests are queued again and the blocked thread (the
    /// one in `io_uring_enter`) is the one that gets the event. 20 trials.
    #[test]
    fn blocked_waiter_gets_readiness_armed_by_an_exited_thread() {
        for trial in 0..20 {
            let p = std::sync::Arc::new(poller::<Uring>());
            let (r, mut w) = pipe();
            let t = p.register(&r).unwrap();
            let waiter = first_event_on_a_thread(&p);
            let q = p.clone();
            std::thread::spawn(move || {
                q.arm(t, Interest::READABLE).unwrap();
                q.deliver(&mut Events::with_capacity(4), Some(Duration::ZERO))
                    .unwrap();
            })
            .join()
            .unwrap();
            w.write_all(b"x").unwrap();
            let got = waiter.join().unwrap().map(|ev| ev.token());
            assert_eq!(got, Some(t), "trial {trial}");
            assert_no_events(&p, 2, Duration::from_millis(2));
        }
    }

    /// A thread that delivers (100 ms at a time, so it is blocked in the kernel
    /// nearly always) until its first event, which it returns; `None` after
    /// [`LOST_AFTER`].
    fn first_event_on_a_thread(
        p: &std::sync::Arc<Poller<Uring>>,
    ) -> std::thread::JoinHandle<Option<pollshot::Event>> {
        let p = p.clone();
        std::thread::spawn(move || {
            let mut events = Events::with_capacity(4);
            let deadline = Instant::now() + LOST_AFTER;
            while Instant::now() < deadline {
                p.deliver(&mut events, Some(Duration::from_millis(100)))
                    .unwrap();
                if let Some(ev) = events.iter().next() {
                    return Some(*ev);
                }
            }
            None
        })
    }

    /// A descriptor closed after its arm was queued and before the wait submitted
    /// it: the request completes with -EBADF, which is not reported (epoll drops a
    /// closed descriptor the same way); the next arm fails with EBADF; the
    /// registration works again once the number names a descriptor.
    #[test]
    fn closed_before_submission_is_dropped_then_ebadf() {
        const MIN_FD: i32 = 3500; // this test's own range, see `high_dup`
        let p = poller::<Uring>();
        let (_a, b) = socketpair(); // `_a` open: `b` is not readable
        let x = crate::common::high_dup(&b, MIN_FD);
        let n = x.as_raw_fd();
        let t = p.register(&x).unwrap();
        p.arm(t, Interest::READABLE).unwrap(); // checked open, queued
        drop(x);
        assert_no_events(&p, 3, Duration::from_millis(1));
        // The table still says armed, as on epoll: the same interest issues
        // nothing and answers Ok; another interest reaches the backend.
        #[cfg(feature = "stats")]
        let before = p.stats();
        p.arm(t, Interest::READABLE).unwrap();
        #[cfg(feature = "stats")]
        {
            let d = p.stats().since(&before);
            assert_eq!((d.modifies, d.adds, d.quiets), (0, 0, 0), "issued: {d:?}");
        }
        let e = p.arm(t, Interest::WRITABLE).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}");
        // Still armed in the table (the arm failed): a disarm reaches the backend,
        // EBADF, and leaves it idle.
        let e = p.disarm(t).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}");
        let (mut c, d) = socketpair();
        let again = crate::common::high_dup(&d, n);
        assert_eq!(again.as_raw_fd(), n, "the number was free");
        p.arm(t, Interest::READABLE).unwrap();
        c.write_all(b"x").unwrap();
        let ev = expect_one(&p, t);
        assert!(ev.is_readable() && !ev.is_error(), "{ev:?}");
        p.deregister(t).unwrap();
    }

    /// A socket closed after its arm was submitted is not closed for good: the
    /// pending poll request holds the open file (`io_poll_add` takes it through
    /// `io_assign_file` as the request is issued), so the peer's write completes
    /// the request and the event is delivered, once, with the registration's
    /// token, where epoll drops the descriptor at its close
    /// (docs/guarantees.md, "A descriptor closed while armed is never
    /// reported"). The completion lets the file go: the peer then sees the close.
    /// The next arm's request finds the number closed: -EBADF, not reported.
    #[test]
    fn closed_after_submission_is_reported_once() {
        // This test's own range (see `high_dup`): a number no other test's
        // socket takes once it is free, so the re-arm below finds it closed.
        const MIN_FD: i32 = 3600;
        let p = poller::<Uring>();
        let (mut a, low) = socketpair();
        let b = crate::common::high_dup(&low, MIN_FD);
        drop(low); // `b` is the socket's only number
        let t = p.register(&b).unwrap();
        // Queued, then submitted by a wait that finds nothing: the request
        // holds the file now.
        p.arm(t, Interest::READABLE).unwrap();
        assert_no_events(&p, 1, Duration::ZERO);
        drop(b);
        let mut buf = [0u8; 8];
        let e = a.read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "not released: {e}");
        a.write_all(b"x").unwrap();
        let ev = expect_one(&p, t);
        assert!(ev.is_readable(), "{ev:?}");
        // Released once completed: the peer sees the close (a reset, as the
        // socket went with the byte unread; `unix_release_sock`).
        let r = a.read(&mut buf).map_err(|e| e.kind());
        assert!(
            matches!(r, Ok(0) | Err(io::ErrorKind::ConnectionReset)),
            "the peer sees no close: {r:?}"
        );
        assert_no_events(&p, 3, Duration::from_millis(1));
        // Re-armed: its request answers -EBADF at the next wait, not reported.
        p.arm(t, Interest::READABLE).unwrap();
        assert_no_events(&p, 3, Duration::from_millis(1));
        p.deregister(t).unwrap();
    }

    /// Another registration's deregister submits the queue as a wait does: its
    /// `io_uring_enter` (it waits for its own request's end) issues every queued
    /// request, and the kernel resolves each one's number then (`io_issue_sqe` in
    /// io_uring/io_uring.c: `io_assign_file`, a plain `fget`), so an arm whose
    /// number was closed since is answered -EBADF there, with no wait between.
    /// The next re-arm answers as epoll's would: EBADF while the number is closed
    /// (the modify answers `NotFound`, the add's check EBADF), and once the number
    /// names a descriptor again, an add that watches it. Were the request still
    /// queued, that re-arm would be queued too and answer Ok. (The fuzzer's case:
    /// `fuzz/regressions/uring_real/deregister_submits_arm_of_closed_number*`.)
    #[test]
    fn deregister_submits_an_arm_whose_number_was_closed() {
        const MIN_FD: i32 = 3500; // this test's own range, see `high_dup`
        let p = poller::<Uring>();
        let (_a, b) = socketpair(); // `_a` open: `b` is not readable
        let x = crate::common::high_dup(&b, MIN_FD);
        let n = x.as_raw_fd();
        let t = p.register(&x).unwrap();
        p.arm(t, Interest::READABLE).unwrap(); // checked open, queued
        let (_c, d) = socketpair();
        let other = p.register(&d).unwrap();
        p.arm(other, Interest::READABLE).unwrap();
        drop(x);
        costs(&p, 1, "the deregister's enter", || p.deregister(other));
        #[cfg(feature = "stats")]
        let before = p.stats();
        let e = p.arm(t, Interest::WRITABLE).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}");
        #[cfg(feature = "stats")]
        {
            let d = p.stats().since(&before);
            assert_eq!(
                (d.modifies, d.not_found_to_add, d.adds, d.ctl_calls),
                (1, 1, 1, 1),
                "a modify answered NotFound, an add's fcntl EBADF: {d:?}"
            );
        }
        // The number names a socket again: the same re-arm is an add.
        let (_e, f) = socketpair();
        let again = crate::common::high_dup(&f, n);
        assert_eq!(again.as_raw_fd(), n, "the number was free");
        #[cfg(feature = "stats")]
        let before = p.stats();
        p.arm(t, Interest::WRITABLE).unwrap();
        #[cfg(feature = "stats")]
        {
            let d = p.stats().since(&before);
            assert_eq!((d.modifies, d.not_found_to_add, d.adds), (1, 1, 1), "{d:?}");
        }
        let ev = expect_one(&p, t);
        assert!(ev.is_writable() && !ev.is_error(), "{ev:?}");
        p.deregister(t).unwrap();
    }

    /// More completions at once than the completion queue holds (512): 1,200
    /// always-ready registrations (dups of `/dev/null`) armed before one deliver.
    /// The kernel keeps the excess (`IORING_SQ_CQ_OVERFLOW`); every one is delivered
    /// exactly once, in delivers of at most 64, and nothing after.
    #[test]
    fn completion_queue_overflow_loses_nothing() {
        const N: usize = 1200;
        raise_nofile((N + 512) as libc::rlim_t);
        let p = poller::<Uring>();
        let null = crate::common::dev_null();
        let fds: Vec<OwnedFd> = (0..N)
            .map(|_| rustix::io::dup(&null).expect("dup /dev/null"))
            .collect();
        let tokens: Vec<Token> = fds.iter().map(|f| p.register(f).unwrap()).collect();
        for &t in &tokens {
            p.arm(t, Interest::READABLE).unwrap();
        }
        let mut seen = HashSet::new();
        let mut events = Events::with_capacity(64);
        let deadline = Instant::now() + LOST_AFTER;
        while seen.len() < N {
            assert!(
                Instant::now() < deadline,
                "{} of {N} delivered after {LOST_AFTER:?}",
                seen.len()
            );
            let n = p
                .deliver(&mut events, Some(Duration::from_millis(10)))
                .unwrap();
            assert!(n <= 64);
            for ev in &events {
                assert!(ev.is_readable(), "{ev:?}");
                assert!(seen.insert(ev.token()), "delivered twice: {ev:?}");
            }
        }
        assert_no_events(&p, 3, Duration::from_millis(2));
        // All of them again: the registrations are intact after the overflow.
        for &t in &tokens {
            p.arm(t, Interest::WRITABLE).unwrap();
        }
        seen.clear();
        while seen.len() < N {
            assert!(Instant::now() < deadline + LOST_AFTER, "second round lost");
            p.deliver(&mut events, Some(Duration::from_millis(10)))
                .unwrap();
            for ev in &events {
                assert!(seen.insert(ev.token()), "delivered twice: {ev:?}");
            }
        }
    }

    /// Delivers (10 ms at a time) until one event comes, calling `nudge` before
    /// each; panics after [`LOST_AFTER`]. Returns every event of that deliver.
    fn first_events(p: &Poller<Uring>, mut nudge: impl FnMut()) -> Vec<pollshot::Event> {
        let mut events = Events::with_capacity(8);
        let deadline = Instant::now() + LOST_AFTER;
        loop {
            assert!(Instant::now() < deadline, "no event after {LOST_AFTER:?}");
            nudge();
            p.deliver(&mut events, Some(Duration::from_millis(10)))
                .unwrap();
            if !events.is_empty() {
                return events.iter().copied().collect();
            }
        }
    }

    /// Runs the command `f`, which must succeed; with `stats`, asserts it made
    /// `ctl_calls` system calls of the kind (`what` says which).
    #[track_caller]
    fn costs(p: &Poller<Uring>, ctl_calls: u64, what: &str, f: impl FnOnce() -> io::Result<()>) {
        #[cfg(feature = "stats")]
        let before = p.stats();
        f().unwrap();
        #[cfg(feature = "stats")]
        assert_eq!(p.stats().since(&before).ctl_calls, ctl_calls, "{what}");
        #[cfg(not(feature = "stats"))]
        let _ = (p, ctl_calls, what);
    }

    /// What a deregistration costs, exactly: one `io_uring_enter` (it submits the
    /// remove and waits until the request has ended) whenever a poll request of
    /// the registration may still be in the kernel or queued (armed and
    /// submitted; armed and not yet submitted; disarmed, its remove queued), and
    /// no system call after a delivery (nothing is pending). No other thread
    /// waits here; the `release` tests of the shared suite cover the outcome
    /// with one.
    #[cfg(feature = "stats")]
    #[test]
    fn deregister_costs_one_enter_while_a_request_is_pending() {
        let p = poller::<Uring>();
        let deregister = |t: Token, what: &str, enters: u64| {
            let before = p.stats();
            p.deregister(t).unwrap();
            let d = p.stats().since(&before);
            assert_eq!(
                (d.ctl_calls, d.syscalls()),
                (enters, enters),
                "{what}: {d:?}"
            );
        };
        let mut events = Events::with_capacity(8);
        for _ in 0..20 {
            let (a, mut b) = socketpair();
            let t = p.register(&a).unwrap();
            p.arm(t, Interest::READABLE).unwrap();
            deregister(t, "armed, not submitted", 1);

            let t = p.register(&a).unwrap();
            p.arm(t, Interest::READABLE).unwrap();
            assert_eq!(p.deliver(&mut events, Some(Duration::ZERO)).unwrap(), 0);
            deregister(t, "armed and submitted", 1);

            let t = p.register(&a).unwrap();
            p.arm(t, Interest::READABLE).unwrap();
            assert_eq!(p.deliver(&mut events, Some(Duration::ZERO)).unwrap(), 0);
            p.disarm(t).unwrap();
            deregister(t, "disarmed, its remove queued", 1);

            let t = p.register(&a).unwrap();
            p.arm(t, Interest::READABLE).unwrap();
            b.write_all(b"x").unwrap();
            assert!(expect_one(&p, t).is_readable());
            deregister(t, "delivered", 0);
            assert_no_events(&p, 2, Duration::from_millis(1));
        }
    }

    /// A deregister racing another registration's readiness while a thread is
    /// blocked in `deliver(None)`: this thread arms both registrations while the
    /// other one leads (so it submits their requests, and the kernel runs their
    /// completions' task work here), writes to one, and deregisters the other,
    /// which waits for its own request's end while the leader holds the ring
    /// (or leads itself, parking the first one's event). The leader returns
    /// with that event, exactly once. 20 trials.
    #[test]
    fn deregister_hands_on_what_it_took_from_the_queue() {
        crate::common::within("deregister beside a ready registration", || {
            for trial in 0..20 {
                let p = std::sync::Arc::new(poller::<Uring>());
                let (x, mut xw) = socketpair();
                let (y, _yw) = socketpair();
                let tx = p.register(&x).unwrap();
                let ty = p.register(&y).unwrap();
                let q = p.clone();
                let (tid_tx, tid_rx) = std::sync::mpsc::channel();
                let leader = std::thread::spawn(move || {
                    // SAFETY: gettid(2) has no preconditions.
                    tid_tx.send(unsafe { libc::gettid() }).unwrap();
                    let mut events = Events::with_capacity(8);
                    loop {
                        match q.deliver(&mut events, None) {
                            Ok(0) => continue,
                            Ok(_) => return events.iter().map(|e| e.token()).collect::<Vec<_>>(),
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            Err(e) => panic!("deliver: {e}"),
                        }
                    }
                });
                crate::common::release::until_blocked_in_wait(tid_rx.recv().unwrap());
                p.arm(tx, Interest::READABLE).unwrap();
                p.arm(ty, Interest::READABLE).unwrap();
                xw.write_all(b"x").unwrap();
                p.deregister(ty).unwrap();
                assert_eq!(leader.join().unwrap(), vec![tx], "trial {trial}");
                p.deregister(tx).unwrap();
            }
        });
    }

    /// The fuzzer's case (`fuzz/regressions/uring_real/
    /// write_only_arm_of_half_closed_socket_waits_for_room`): a write-only arming
    /// of a socket whose send buffer is full and whose peer shut down its write
    /// side. The kernel adds POLLRDHUP to every poll request, so the request
    /// completes at once with read-closed alone; the poller reports nothing until
    /// the socket is writable (as epoll does), then writable. Later write-only
    /// armings are one `epoll_ctl` each (the private epoll instance), a disarm one
    /// more (its delete), a readable arming none (a poll request again). Over a
    /// Unix socketpair and TCP loopback; 20 trials each.
    #[test]
    fn write_only_arm_of_half_closed_socket_waits_for_room() {
        for _ in 0..20 {
            let (a, b) = socketpair();
            let b2 = b.try_clone().unwrap();
            half_closed_writer(a, b, move || {
                b2.shutdown(std::net::Shutdown::Write).unwrap()
            });
            let (a, b) = crate::common::tcp_pair();
            let b2 = b.try_clone().unwrap();
            half_closed_writer(a, b, move || {
                b2.shutdown(std::net::Shutdown::Write).unwrap()
            });
        }
    }

    fn half_closed_writer<S>(a: S, b: S, shutdown: impl FnOnce())
    where
        S: std::os::fd::AsFd,
        for<'s> &'s S: io::Read + io::Write,
    {
        use crate::common::{drain, fill};
        let p = poller::<Uring>();
        let t = p.register(&a).unwrap();
        fill(&a);
        shutdown();
        p.arm(t, Interest::WRITABLE).unwrap();
        assert_no_events(&p, 3, Duration::from_millis(2));
        // Room again: writable, and nothing about the read side.
        let got = first_events(&p, || {
            drain(&b);
        });
        assert_eq!(got.len(), 1, "{got:?}");
        let ev = got[0];
        assert!(ev.token() == t && ev.is_writable(), "{ev:?}");
        assert!(
            !ev.is_read_closed() && !ev.is_readable() && !ev.is_error(),
            "{ev:?}"
        );
        assert_no_events(&p, 2, Duration::from_millis(1));

        // Known half-closed: the next write-only arming is the epoll entry's MOD.
        costs(&p, 1, "one epoll_ctl MOD", || p.arm(t, Interest::WRITABLE));
        assert!(expect_one(&p, t).is_writable());

        // Full again, armed, disarmed (the delete), emptied: nothing.
        fill(&a);
        p.arm(t, Interest::WRITABLE).unwrap();
        assert_no_events(&p, 2, Duration::from_millis(2));
        costs(&p, 1, "one epoll_ctl DEL", || p.disarm(t));
        drain(&b);
        assert_no_events(&p, 3, Duration::from_millis(2));

        // A readable arming is a poll request again: read-closed at once.
        costs(&p, 0, "no system call", || p.arm(t, Interest::READABLE));
        let ev = expect_one(&p, t);
        assert!(ev.is_readable() && ev.is_read_closed(), "{ev:?}");

        // Watched by epoll when deregistered: nothing holds the socket after.
        fill(&a);
        p.arm(t, Interest::WRITABLE).unwrap();
        assert_no_events(&p, 2, Duration::from_millis(1));
        p.deregister(t).unwrap();
        drop(a);
        let deadline = Instant::now() + LOST_AFTER;
        let mut buf = [0u8; 65536];
        loop {
            match (&b).read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline, "no EOF: the socket is held");
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("read: {e}"),
            }
        }
        assert_no_events(&p, 2, Duration::from_millis(1));
    }

    /// A registration known to be half-closed whose number is reused by
    /// `/dev/null` (dup2), or closed, without a deregister: its next write-only
    /// arming is what any arming of such a number is on this backend (the private
    /// epoll refuses both numbers, EPERM and EBADF, and a poll request takes
    /// over): `/dev/null` is always ready; a closed number's request is dropped
    /// at submission, and the arm after answers EBADF. (The fuzzer's case:
    /// `fuzz/regressions/uring_real/half_closed_rearm_of_closed_number`.)
    #[test]
    fn half_closed_registration_whose_number_is_reused_or_closed() {
        const MIN_FD: i32 = 3400; // this test's own range, see `high_dup`
        for reuse in [true, false] {
            let p = poller::<Uring>();
            let (a, b) = socketpair();
            let s = std::os::unix::net::UnixStream::from(crate::common::high_dup(&a, MIN_FD));
            drop(a);
            let t = p.register(&s).unwrap();
            crate::common::fill(&s);
            b.shutdown(std::net::Shutdown::Write).unwrap();
            p.arm(t, Interest::WRITABLE).unwrap();
            assert_no_events(&p, 3, Duration::from_millis(2));
            crate::common::drain(&b);
            assert!(expect_one(&p, t).is_writable(), "reuse {reuse}");
            let mut n = OwnedFd::from(s);
            if reuse {
                crate::common::reuse_number(crate::common::dev_null(), &mut n);
                p.arm(t, Interest::WRITABLE).unwrap();
                let ev = expect_one(&p, t);
                assert!(ev.is_writable() && !ev.is_error(), "{ev:?}");
                p.deregister(t).unwrap();
            } else {
                drop(n);
                p.arm(t, Interest::WRITABLE).unwrap();
                assert_no_events(&p, 3, Duration::from_millis(1));
                // Still armed in the table: another interest reaches the backend.
                let e = p.arm(t, Interest::READABLE).unwrap_err();
                assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}");
            }
        }
    }

    /// A shared poller and a socketpair `(a, b)`: `a` registered (token `t`), its
    /// send buffer full, its peer `b` shut down for writing.
    fn full_half_closed() -> (
        std::sync::Arc<Poller<Uring>>,
        std::os::unix::net::UnixStream,
        std::os::unix::net::UnixStream,
        Token,
    ) {
        let p = std::sync::Arc::new(poller::<Uring>());
        let (a, b) = socketpair();
        let t = p.register(&a).unwrap();
        crate::common::fill(&a);
        b.shutdown(std::net::Shutdown::Write).unwrap();
        (p, a, b, t)
    }

    /// The same with a waiter blocked in the kernel the whole time: the arm is
    /// submitted at once, completes with read-closed alone in the waiter's enter,
    /// and the waiter's first event is the writable one that the peer's reads
    /// make. 20 trials.
    #[test]
    fn blocked_waiter_gets_writable_not_read_closed_of_half_closed_socket() {
        for trial in 0..20 {
            let (p, _a, b, t) = full_half_closed();
            let waiter = first_event_on_a_thread(&p);
            p.arm(t, Interest::WRITABLE).unwrap();
            // Give the request time to complete in the waiter's enter (either
            // order must end the same way).
            std::thread::sleep(Duration::from_millis(trial % 3));
            crate::common::drain(&b);
            let ev = waiter.join().unwrap().expect("no event");
            assert!(ev.token() == t && ev.is_writable(), "trial {trial}: {ev:?}");
            assert!(
                !ev.is_read_closed() && !ev.is_error(),
                "trial {trial}: {ev:?}"
            );
            assert_no_events(&p, 2, Duration::from_millis(1));
            p.deregister(t).unwrap();
        }
    }

    /// The private epoll instance's own poll outlives the thread that submitted
    /// it: a thread arms a full, half-closed socket for writing, delivers (the
    /// request completes with read-closed alone, and its deliver submits the poll
    /// on the private epoll instance) and exits. Once the peer reads, a deliver
    /// that never blocks gets the writable event, exactly once. 20 trials.
    #[test]
    fn private_epoll_poll_outlives_the_thread_that_submitted_it() {
        for trial in 0..20 {
            let (p, _a, b, t) = full_half_closed();
            arm_on_a_thread_that_exits(&p, t, Interest::WRITABLE, 3);
            crate::common::drain(&b);
            let mut events = Events::with_capacity(4);
            let n = p.deliver(&mut events, Some(Duration::ZERO)).unwrap();
            assert_eq!(n, 1, "trial {trial}");
            let ev = events.iter().next().unwrap();
            assert!(ev.token() == t && ev.is_writable(), "trial {trial}: {ev:?}");
            assert_no_events(&p, 3, Duration::from_millis(2));
        }
    }

    /// Raises the soft descriptor limit to `want` (at most the hard limit).
    fn raise_nofile(want: libc::rlim_t) {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit(2) with a valid rlimit pointer.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
            if lim.rlim_cur < want {
                lim.rlim_cur = want.min(lim.rlim_max);
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
        }
    }

    /// Where io_uring_setup(2) is refused, `with_backend` answers `Unsupported`
    /// with the reason. A forked child installs a seccomp filter that makes
    /// io_uring_setup fail with `errno`, then creates a poller.
    fn refused_with(errno: i32, needle: &str) {
        // No suite body runs until the child has exited: it holds every
        // descriptor of the process (`crate::common::forking`).
        let _alone = crate::common::forking();
        // SAFETY: fork(2) from a multi-threaded test process; the child only makes
        // system calls, allocates through glibc's malloc (usable after fork) and
        // leaves with _exit(2).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            let code = match refuse_io_uring_setup(errno) {
                Err(_) => 2,
                Ok(()) => match Poller::<Uring>::with_backend() {
                    Ok(_) => 3,
                    Err(e) if e.kind() != io::ErrorKind::Unsupported => 4,
                    Err(e) if !e.to_string().contains(needle) => 5,
                    Err(_) => 0,
                },
            };
            // SAFETY: _exit(2) ends the child at once.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waitpid(2) on our own child with a valid status pointer.
        while unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
            assert_eq!(
                io::Error::last_os_error().kind(),
                io::ErrorKind::Interrupted
            );
        }
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        let what = match libc::WEXITSTATUS(status) {
            0 => return,
            2 => "installing the seccomp filter failed",
            3 => "the poller was created although io_uring_setup was refused",
            4 => "the error's kind is not Unsupported",
            5 => "the message does not name the refusal",
            _ => "unknown",
        };
        panic!("errno {errno}: {what}");
    }

    /// A seccomp filter: io_uring_setup(2) fails with `errno`, everything else runs.
    fn refuse_io_uring_setup(errno: i32) -> io::Result<()> {
        const NR: u32 = libc::SYS_io_uring_setup as u32;
        let filter = [
            // A = the system call number (offset 0 of struct seccomp_data).
            bpf(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
            bpf(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 1, NR),
            bpf(
                libc::BPF_RET | libc::BPF_K,
                0,
                0,
                libc::SECCOMP_RET_ERRNO | errno as u32,
            ),
            bpf(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        ];
        let prog = libc::sock_fprog {
            len: filter.len() as u16,
            filter: filter.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: prctl(2) with constant arguments, then with a pointer to a
        // filter program that outlives the call.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    fn bpf(code: u32, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
        libc::sock_filter {
            code: code as u16,
            jt,
            jf,
            k,
        }
    }

    #[test]
    fn refused_by_seccomp_eperm_is_unsupported() {
        refused_with(libc::EPERM, "EPERM");
    }

    #[test]
    fn refused_by_seccomp_enosys_is_unsupported() {
        refused_with(libc::ENOSYS, "ENOSYS");
    }
}
