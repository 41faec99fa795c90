//! The kqueue backend's own contract on real descriptors: where its change records
//! travel (riding on the next wait, or submitted at once while another thread is
//! blocked), what a refused batched arm becomes, and one delivery disarming both
//! filters. The translator itself is unit-tested in `backends/kqueue/changes_tests.rs` on every
//! target; the shared suite is `tests/kqueue.rs`.
//!
//! Runs on the BSDs and Apple, and on Linux with `--cfg pollshot_libkqueue` against
//! an installed libkqueue (see the README).
#![cfg(all(pollshot_kqueue, not(pollshot_rump)))] // host descriptors: not on a rump kernel

use pollshot::backends::Kqueue;
use pollshot::{Events, Interest, Poller};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(20);

fn pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    (a, b)
}

/// Delivers in short slices until at least one event arrives (panics after
/// [`LONG`]). Short slices: libkqueue answers a refused batched change only when
/// its wait returns (a BSD kernel returns at once).
fn next(p: &Poller<Kqueue>, events: &mut Events) -> usize {
    let deadline = std::time::Instant::now() + LONG;
    while std::time::Instant::now() < deadline {
        let n = p.deliver(events, Some(Duration::from_millis(20))).unwrap();
        if n > 0 {
            return n;
        }
    }
    panic!("no event after {LONG:?}");
}

/// A registration of `b` (its peer `a`) that is idle in the kernel: armed once
/// (an add) and delivered, its byte read.
fn idle(p: &Poller<Kqueue>) -> (UnixStream, UnixStream, pollshot::Token) {
    let (mut a, mut b) = pair();
    let t = p.register(&b).unwrap();
    a.write_all(b"x").unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let mut events = Events::with_capacity(8);
    assert_eq!(next(p, &mut events), 1);
    let mut buf = [0u8; 8];
    assert_eq!(b.read(&mut buf).unwrap(), 1);
    (a, b, t)
}

/// A re-arm made by the thread that waits next costs no system call of its own:
/// 100 round trips are 100 `kevent` waits and no change-only call.
#[cfg(feature = "stats")]
#[test]
fn rearm_rides_on_the_next_wait() {
    let p = Poller::<Kqueue>::with_backend().unwrap();
    let (mut a, mut b) = pair();
    let t = p.register(&b).unwrap();
    let before = p.stats();
    p.arm(t, Interest::READABLE).unwrap();
    let s = p.stats().since(&before);
    assert_eq!(
        (s.adds, s.ctl_calls),
        (1, 1),
        "the first arm adds at once: {s:?}"
    );
    let mut events = Events::with_capacity(8);
    let before = p.stats();
    for i in 0..100 {
        if i > 0 {
            p.arm(t, Interest::READABLE).unwrap();
        }
        a.write_all(b"x").unwrap();
        assert_eq!(p.deliver(&mut events, Some(LONG)).unwrap(), 1);
        let ev = events.iter().next().unwrap();
        assert!(ev.token() == t && ev.is_readable(), "{ev:?}");
        let mut buf = [0u8; 1];
        assert_eq!(b.read(&mut buf).unwrap(), 1);
    }
    let s = p.stats().since(&before);
    assert_eq!(s.modifies, 99, "{s:?}");
    assert_eq!(s.ctl_calls, 0, "every re-arm rode on a wait: {s:?}");
    assert_eq!(s.waits, 100, "one kevent per round trip: {s:?}");
    assert_eq!((s.wakes, s.wake_reads, s.stale), (0, 0, 0), "{s:?}");
}

/// An arm made while another thread is blocked in `kevent` is submitted at once
/// (one change-only call) and reaches the blocked waiter without a notify.
#[cfg(feature = "stats")]
#[test]
fn arm_while_another_thread_waits_is_submitted_at_once() {
    let p = Arc::new(Poller::<Kqueue>::with_backend().unwrap());
    let (mut a, _b, t) = idle(&p);

    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let waiter = {
        let p = p.clone();
        std::thread::spawn(move || {
            let mut events = Events::with_capacity(8);
            started_tx.send(()).unwrap();
            let n = p.deliver(&mut events, Some(LONG)).unwrap();
            (
                n,
                events
                    .iter()
                    .map(|e| (e.token(), e.is_readable()))
                    .collect::<Vec<_>>(),
            )
        })
    };
    started_rx.recv().unwrap();
    // Let the waiter reach kevent (not a correctness condition: an arm made
    // before it blocks rides on its call instead, and is delivered all the same).
    std::thread::sleep(Duration::from_millis(50));
    a.write_all(b"y").unwrap();
    let before = p.stats();
    p.arm(t, Interest::READABLE).unwrap();
    let s = p.stats().since(&before);
    let (n, got) = waiter.join().unwrap();
    assert_eq!((n, got), (1, vec![(t, true)]));
    assert_eq!(s.modifies, 1, "{s:?}");
    assert!(s.ctl_calls <= 1, "{s:?}");
    assert_eq!(s.wakes, 0, "no notify needed: {s:?}");
}

/// A batched arm of a descriptor that was closed behind the poller's back: `arm`
/// returns Ok (nothing has reached the kernel yet), and the kernel's refusal comes
/// back as one error event for the registration: never silently lost.
#[test]
fn refused_batched_arm_is_delivered_as_an_error() {
    let p = Poller::<Kqueue>::with_backend().unwrap();
    let (mut a, b) = pair();
    // A number of its own, far from the ones other tests reuse.
    let x = rustix::io::fcntl_dupfd_cloexec(&b, 4000).unwrap();
    let t = p.register(&x).unwrap();
    a.write_all(b"x").unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let mut events = Events::with_capacity(8);
    assert_eq!(next(&p, &mut events), 1);
    // Close it: the number stays free.
    let n = x.as_raw_fd();
    drop(x);
    p.arm(t, Interest::READABLE)
        .expect("a batched arm is answered later");
    assert_eq!(next(&p, &mut events), 1);
    let ev = events.iter().next().unwrap();
    assert!(ev.token() == t && ev.is_error(), "{ev:?}");
    // Once per arming: nothing more.
    for _ in 0..5 {
        assert_eq!(
            p.deliver(&mut events, Some(Duration::from_millis(2)))
                .unwrap(),
            0
        );
    }
    p.deregister(t)
        .expect("deregistering a closed descriptor is Ok");
    // SAFETY: only checks that the number is still free (fcntl answers EBADF).
    assert!(rustix::io::fcntl_getfd(unsafe { std::os::fd::BorrowedFd::borrow_raw(n) }).is_err());
}

/// One delivery disarms the whole registration, as `EPOLLONESHOT` does: armed for
/// both directions, the write filter fires; the read filter is disabled after the
/// delivery, so data arriving later is not reported until the next arm.
#[test]
fn one_delivery_disarms_both_filters() {
    let p = Poller::<Kqueue>::with_backend().unwrap();
    let (mut a, b) = pair();
    let t = p.register(&b).unwrap();
    p.arm(t, Interest::BOTH).unwrap();
    let mut events = Events::with_capacity(8);
    assert_eq!(next(&p, &mut events), 1);
    let ev = events.iter().next().unwrap();
    assert!(ev.is_writable() && !ev.is_readable(), "{ev:?}");
    #[cfg(feature = "stats")]
    let before = p.stats();
    a.write_all(b"x").unwrap();
    for _ in 0..5 {
        assert_eq!(
            p.deliver(&mut events, Some(Duration::from_millis(2)))
                .unwrap(),
            0
        );
    }
    #[cfg(feature = "stats")]
    {
        let s = p.stats().since(&before);
        assert_eq!(
            s.stale, 0,
            "the read filter was disabled before the data came: {s:?}"
        );
    }
    p.arm(t, Interest::READABLE).unwrap();
    assert_eq!(next(&p, &mut events), 1);
    assert!(events.iter().next().unwrap().is_readable());
    p.deregister(t).unwrap();
}

/// Changes that ride on a wait are applied before it blocks: arms of many
/// registrations made with no waiter all reach the kernel in the next call.
#[test]
fn many_batched_arms_reach_one_wait() {
    let p = Poller::<Kqueue>::with_backend().unwrap();
    let pairs: Vec<_> = (0..100).map(|_| pair()).collect();
    let tokens: Vec<_> = pairs.iter().map(|(_, b)| p.register(b).unwrap()).collect();
    // First arms add at once; idle them with a delivery each.
    for ((a, _), t) in pairs.iter().zip(&tokens) {
        (&*a).write_all(b"x").unwrap();
        p.arm(*t, Interest::READABLE).unwrap();
    }
    let mut events = Events::with_capacity(256);
    let mut seen = 0;
    while seen < tokens.len() {
        seen += next(&p, &mut events);
    }
    // Re-arm all (queued: nobody waits), then one wait reports all of them.
    for t in &tokens {
        p.arm(*t, Interest::READABLE).unwrap();
    }
    let mut got = 0;
    while got < tokens.len() {
        got += next(&p, &mut events);
    }
    assert_eq!(got, tokens.len());
    for ((_, b), t) in pairs.iter().zip(&tokens) {
        p.deregister(*t).unwrap();
        let mut buf = [0u8; 4];
        assert_eq!((&*b).read(&mut buf).unwrap(), 1);
    }
}

/// A kqueue is not inherited across fork: the child re-initialises and never
/// closes the inherited number, which may belong to something else by then.
#[test]
fn forked_child_does_not_close_the_parent_number() {
    let mut p = Poller::<Kqueue>::with_backend().unwrap();
    let (mut a, b) = pair();
    let t = p.register(&b).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    // SAFETY: the child only calls async-signal-safe-enough code (the poller's
    // re-initialisation and plain system calls) and exits with _exit.
    match unsafe { libc::fork() } {
        0 => {
            let ok = p.reinit_after_fork().is_ok() && {
                a.write_all(b"c").is_ok() && {
                    let mut events = Events::with_capacity(4);
                    p.deliver(&mut events, Some(LONG))
                        .map(|n| n == 1)
                        .unwrap_or(false)
                }
            };
            drop(p);
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        pid if pid > 0 => {
            let mut status = 0;
            // SAFETY: waits for the child made above.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "child: {status}"
            );
            // The parent's registration is untouched: the byte the child wrote
            // is reported here.
            let mut events = Events::with_capacity(4);
            assert_eq!(next(&p, &mut events), 1);
            assert_eq!(events.iter().next().unwrap().token(), t);
        }
        _ => panic!("fork: {}", std::io::Error::last_os_error()),
    }
}

/// A deregistration whose descriptor has a queued re-arm that a blocked waiter
/// carries into `kevent` (issue 8.7): `deregister` does not wait for that
/// waiter's timeout (it has none) but wakes it, and the wake-up is the backend's
/// own: the waiter's `deliver(None)` goes on waiting and returns only for the
/// notify that comes afterwards. When `deregister` returns, its delete has been
/// submitted (one change-only call). 20 trials.
#[cfg(feature = "stats")]
#[test]
fn deregister_wakes_a_waiter_that_carries_its_records() {
    for trial in 0..20 {
        let p = Arc::new(Poller::<Kqueue>::with_backend().unwrap());
        let (_a, _b, t) = idle(&p);
        // Re-armed with nobody waiting: queued, to ride on the next wait.
        p.arm(t, Interest::READABLE).unwrap();
        let waiter = {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut events = Events::with_capacity(8);
                let n = p.deliver(&mut events, None).unwrap();
                (n, events.is_notified())
            })
        };
        while p.waiters() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Let it take the re-arm into kevent (not a correctness condition: a
        // deregistration that comes first flushes the re-arm itself).
        std::thread::sleep(Duration::from_millis(20));
        let before = p.stats();
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let p = p.clone();
            std::thread::spawn(move || tx.send(p.deregister(t).is_ok()).unwrap());
        }
        assert_eq!(
            rx.recv_timeout(LONG),
            Ok(true),
            "trial {trial}: deregister did not return (a waiter carrying its records was not woken)"
        );
        let s = p.stats().since(&before);
        assert_eq!((s.deletes, s.ctl_calls), (1, 1), "trial {trial}: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !waiter.is_finished(),
            "trial {trial}: the backend's wake-up ended a deliver(None)"
        );
        p.notify().unwrap();
        assert_eq!(waiter.join().unwrap(), (0, true), "trial {trial}");
    }
}
