//! `Poller<Kqueue>` on real NetBSD kernel code: a NetBSD rump kernel (NetBSD
//! 7.99.34 sources, `sys/kern/kern_event.c` 1.88, the kqueue NetBSD 8 and 9
//! ship) booted in this process, driven on its own pipes and `AF_LOCAL`
//! socketpairs. Built only with `--cfg pollshot_rump` and `POLLSHOT_RUMP_DIR`
//! naming the rump kernel (docs/testing.md, "On NetBSD kernel code").
//!
//! Every descriptor here is a rump descriptor (`pollshot::rump::RumpFd`): a
//! number in the rump kernel's table, registered with `register_raw`, read and
//! written with the rump kernel's calls. The per-backend suite runs on such
//! descriptors too (`tests/rump_suite.rs`). The cases are the ones where a kernel's re-arm path
//! decides the outcome: a re-arm with data left unread must be reported again
//! (NetBSD 8/9's `EV_ENABLE` does not re-run the filter; `kqueue_register` does
//! for `EV_ADD`), both filters of one registration re-armed together, an
//! end-of-file that is still there, an event fetched before another thread
//! re-armed (dropped as stale: `udata` carries the arming), deregistration, and
//! a notify through the pipe waker (NetBSD 7.99 has no `EVFILT_USER`). Two more
//! keep the rump kernel itself sound: deregistrations beside two delivering
//! threads end (they wedged a kernel with two virtual CPUs), and the kernel
//! refuses to boot without `RUMP_NCPU` (`pollshot::rump::boot`).
//!
//! Timing never decides a pass: a missing event fails after `LOST_AFTER`.
#![cfg(pollshot_rump)]

#[allow(unused_macros)] // the per-backend suite: tests/rump_suite.rs expands it
mod common;

use common::wakeups::{until_waiters, TRIALS};
use common::{assert_no_events, delta, expect_events, expect_one, poller, within, Fd, LOST_AFTER};
use pollshot::backends::Kqueue;
use pollshot::rump::RumpFd as Rfd;
use pollshot::{Events, Interest, Poller, Token};
use std::io;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// A non-blocking pipe in the rump kernel: `(read, write)`.
fn pipe() -> (Rfd, Rfd) {
    <Rfd as Fd>::pipe()
}

/// A non-blocking `AF_LOCAL` stream socketpair in the rump kernel.
fn socketpair() -> (Rfd, Rfd) {
    <Rfd as Fd>::socketpair()
}

/// Both kinds of descriptor pair: `(name, reader, writer)`.
fn pairs() -> Vec<(&'static str, Rfd, Rfd)> {
    let (r, w) = pipe();
    let (a, b) = socketpair();
    vec![("pipe", r, w), ("socketpair", a, b)]
}

fn write(fd: &Rfd, data: &[u8]) {
    Fd::write_all(fd, data);
}

/// Reads what is queued (non-blocking): the bytes, or `None` at end of file.
fn read(fd: &Rfd) -> Option<Vec<u8>> {
    let mut buf = [0u8; 256];
    match Fd::read(fd, &mut buf) {
        Ok(0) => None,
        Ok(n) => Some(buf[..n].to_vec()),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Some(Vec::new()),
        Err(e) => panic!("read {fd:?}: {e}"),
    }
}

/// A poller on the rump kernel's kqueue (which boots the kernel).
fn rump_poller() -> Poller<Kqueue> {
    poller::<Kqueue>()
}

fn register(p: &Poller<Kqueue>, fd: &Rfd) -> Token {
    Fd::register(fd, p).expect("register_raw")
}

/// One delivery and nothing more: `t`'s event, then an empty short wait.
fn expect_only(p: &Poller<Kqueue>, t: Token) -> pollshot::Event {
    let ev = expect_one(p, t);
    assert_no_events(p, 1, Duration::from_millis(100));
    ev
}

/// Arm, deliver, and nothing more until the next arm: readable on both kinds,
/// writable on the writer, and the data is there to read.
#[test]
fn arm_and_deliver() {
    let p = rump_poller();
    for (kind, r, w) in pairs() {
        let tr = register(&p, &r);
        let tw = register(&p, &w);
        p.arm(tr, Interest::READABLE).unwrap();
        assert_no_events(&p, 1, Duration::from_millis(50));
        write(&w, b"x");
        let ev = expect_only(&p, tr);
        assert!(ev.is_readable() && !ev.is_read_closed(), "{kind}: {ev:?}");
        assert_eq!(read(&r).as_deref(), Some(&b"x"[..]), "{kind}");
        p.arm(tw, Interest::WRITABLE).unwrap();
        let ev = expect_only(&p, tw);
        assert!(ev.is_writable() && !ev.is_write_closed(), "{kind}: {ev:?}");
        p.deregister(tr).unwrap();
        p.deregister(tw).unwrap();
    }
}

/// A re-arm with the data left unread is reported again, every time (the
/// README's "Nothing is lost"), and a re-arm costs no system call of its own
/// (it rides on the next wait). Once the data is read, a re-arm reports nothing.
#[test]
fn rearm_with_data_unread_is_reported_again() {
    let p = rump_poller();
    for (kind, r, w) in pairs() {
        let t = register(&p, &r);
        write(&w, b"abc");
        p.arm(t, Interest::READABLE).unwrap();
        assert!(expect_only(&p, t).is_readable(), "{kind}: first arming");
        for round in 1..=3 {
            let ((), s) = delta(&p, || p.arm(t, Interest::READABLE).unwrap());
            assert_eq!(
                (s.modifies, s.ctl_calls),
                (1, 0),
                "{kind} round {round}: {s:?}"
            );
            let ev = expect_only(&p, t);
            assert!(ev.is_readable(), "{kind} round {round}: {ev:?}");
        }
        assert_eq!(read(&r).as_deref(), Some(&b"abc"[..]), "{kind}");
        p.arm(t, Interest::READABLE).unwrap();
        assert_no_events(&p, 2, Duration::from_millis(50));
        p.deregister(t).unwrap();
    }
}

/// A disarmed registration reports nothing, whatever arrives; the next arm
/// reports what is there: after a disarm of an armed registration, and after a
/// delivery, a disarm, then an arm with the data still unread.
#[test]
fn disarm_then_rearm() {
    let p = rump_poller();
    for (kind, r, w) in pairs() {
        let t = register(&p, &r);
        p.arm(t, Interest::READABLE).unwrap();
        p.disarm(t).unwrap();
        write(&w, b"y");
        assert_no_events(&p, 2, Duration::from_millis(50));
        p.arm(t, Interest::READABLE).unwrap();
        assert!(expect_only(&p, t).is_readable(), "{kind}: arm after disarm");
        p.disarm(t).unwrap();
        assert_no_events(&p, 1, Duration::from_millis(50));
        p.arm(t, Interest::READABLE).unwrap();
        let ev = expect_only(&p, t);
        assert!(
            ev.is_readable(),
            "{kind}: delivered, disarmed, re-armed: {ev:?}"
        );
        p.deregister(t).unwrap();
    }
}

/// Both filters on one registration (two knotes, one delivery): an idle socket
/// reports writable only; once data has arrived, a re-arm of both reports both,
/// the write knote that had fired included (its readiness never went away).
#[test]
fn both_filters_on_one_registration() {
    let p = rump_poller();
    let (a, b) = socketpair();
    let t = register(&p, &a);
    p.arm(t, Interest::BOTH).unwrap();
    let ev = expect_only(&p, t);
    assert!(ev.is_writable() && !ev.is_readable(), "idle: {ev:?}");
    write(&b, b"z");
    for round in 0..3 {
        p.arm(t, Interest::BOTH).unwrap();
        let ev = expect_only(&p, t);
        assert!(
            ev.is_readable() && ev.is_writable(),
            "round {round}: {ev:?}"
        );
    }
    // Read interest alone, data read: nothing; write interest: writable.
    assert_eq!(read(&a).as_deref(), Some(&b"z"[..]));
    p.arm(t, Interest::READABLE).unwrap();
    assert_no_events(&p, 2, Duration::from_millis(50));
    p.arm(t, Interest::WRITABLE).unwrap();
    let ev = expect_only(&p, t);
    assert!(ev.is_writable() && !ev.is_readable(), "{ev:?}");
    p.deregister(t).unwrap();
}

/// A peer's close is `EV_EOF`: read-closed on the reader of a pipe and of a
/// socketpair, write-closed on a pipe's writer, and reported again on every
/// re-arm while it holds.
#[test]
fn peer_close_is_eof() {
    let p = rump_poller();
    for (kind, r, w) in pairs() {
        let t = register(&p, &r);
        p.arm(t, Interest::READABLE).unwrap();
        drop(w);
        for round in 0..2 {
            let ev = expect_only(&p, t);
            assert!(
                ev.is_readable() && ev.is_read_closed(),
                "{kind} {round}: {ev:?}"
            );
            p.arm(t, Interest::READABLE).unwrap();
        }
        assert_eq!(read(&r), None, "{kind}: end of file");
        p.deregister(t).unwrap();
    }
    let (r, w) = pipe();
    let t = register(&p, &w);
    p.arm(t, Interest::WRITABLE).unwrap();
    assert!(expect_only(&p, t).is_writable());
    drop(r);
    p.arm(t, Interest::WRITABLE).unwrap();
    let ev = expect_only(&p, t);
    assert!(ev.is_write_closed(), "pipe writer, reader closed: {ev:?}");
    p.deregister(t).unwrap();
}

/// An event fetched by one thread before another re-arms is stale: dropped,
/// and the new arming reports the data still unread. Two registrations ready
/// at once, a deliver with room for one: the kernel returns both (the wait has
/// room for its carried re-arms' answers too), one is delivered and the other
/// kept by the backend. The main thread re-arms the kept one (disarm, arm);
/// the waiter's next deliver drops the kept event (its `udata` names the old
/// arming) and gets the new one. 20 trials, each asserted.
#[test]
fn event_fetched_before_a_rearm_is_stale() {
    let p = Arc::new(rump_poller());
    let (ra, wa) = pipe();
    let (rb, wb) = pipe();
    let (ta, tb) = (register(&p, &ra), register(&p, &rb));
    write(&wa, b"a");
    write(&wb, b"b");
    p.arm(ta, Interest::READABLE).unwrap();
    p.arm(tb, Interest::READABLE).unwrap();
    expect_events(&p, &[ta, tb]);
    for trial in 0..TRIALS {
        let before = p.stats();
        p.arm(ta, Interest::READABLE).unwrap();
        p.arm(tb, Interest::READABLE).unwrap();
        let (fetched, rearmed) = (mpsc::channel(), mpsc::channel::<()>());
        let waiter = {
            let p = Arc::clone(&p);
            let tx = fetched.0;
            let rx = rearmed.1;
            std::thread::spawn(move || {
                let mut one = Events::with_capacity(1);
                let n = p.deliver(&mut one, Some(LOST_AFTER)).expect("deliver");
                let first: Vec<_> = one.iter().copied().collect();
                tx.send(first.clone()).unwrap();
                assert_eq!(n, 1, "trial {trial}: the first deliver: {first:?}");
                rx.recv().unwrap();
                let other = if first[0].token() == ta { tb } else { ta };
                (first[0], expect_only(&p, other))
            })
        };
        let first = fetched.1.recv().unwrap();
        assert_eq!(
            first.len(),
            1,
            "trial {trial}: nothing delivered: {first:?}"
        );
        let other = if first[0].token() == ta { tb } else { ta };
        p.disarm(other).unwrap();
        p.arm(other, Interest::READABLE).unwrap();
        rearmed.0.send(()).unwrap();
        let (first, second) = waiter.join().unwrap();
        assert!(first.is_readable() && second.is_readable(), "trial {trial}");
        let s = p.stats().since(&before);
        assert_eq!(s.stale, 1, "trial {trial}: the kept event is stale: {s:?}");
    }
    p.deregister(ta).unwrap();
    p.deregister(tb).unwrap();
}

/// After `deregister` nothing of the registration is reported, even with the
/// data that was ready when it was armed; its token is refused; the same
/// number registered again is a new registration that reports the data.
#[test]
fn deregister() {
    let p = rump_poller();
    for (kind, r, w) in pairs() {
        let t = register(&p, &r);
        p.arm(t, Interest::READABLE).unwrap();
        write(&w, b"d");
        p.deregister(t).unwrap();
        assert_no_events(&p, 2, Duration::from_millis(50));
        assert!(p.arm(t, Interest::READABLE).is_err(), "{kind}: old token");
        let t2 = register(&p, &r);
        assert_ne!(t, t2, "{kind}");
        p.arm(t2, Interest::READABLE).unwrap();
        assert!(expect_only(&p, t2).is_readable(), "{kind}");
        p.deregister(t2).unwrap();
    }
    assert!(p.is_empty());
}

/// A registered number closed without a deregister and reused (dup2(2) puts
/// another pipe's read end on it: the kernel drops the old file's knotes): the
/// re-arm's `EV_ADD` registers the new file at once, with no ENOENT to repair,
/// and the registration reports the new file's data.
#[test]
fn rearm_of_a_reused_number_registers_the_new_file() {
    let p = rump_poller();
    let (r, w) = pipe();
    let t = register(&p, &r);
    p.arm(t, Interest::READABLE).unwrap();
    write(&w, b"1");
    assert!(expect_only(&p, t).is_readable());
    let (r2, w2) = pipe();
    let mut r = r;
    r2.dup_onto(&mut r).expect("dup2"); // `r` now names r2's file
    let ((), s) = delta(&p, || {
        p.arm(t, Interest::READABLE).unwrap();
        assert_no_events(&p, 1, Duration::from_millis(50));
    });
    assert_eq!(
        s.not_found_to_add, 0,
        "the kernel took the re-arm as is: {s:?}"
    );
    write(&w2, b"2");
    p.arm(t, Interest::READABLE).unwrap();
    assert!(expect_only(&p, t).is_readable());
    assert_eq!(read(&r).as_deref(), Some(&b"2"[..]), "the new file's data");
    p.deregister(t).unwrap();
}

/// A notify from another thread ends a deliver blocked in the rump kernel's
/// kevent (through the waker's pipe): `Ok(0)`, notified, one wake-up write.
/// 20 trials.
#[test]
fn notify_wakes_a_blocked_deliver() {
    let p = Arc::new(rump_poller());
    for trial in 0..TRIALS {
        let before = p.stats();
        let waiter = {
            let p = Arc::clone(&p);
            std::thread::spawn(move || {
                let mut events = Events::with_capacity(8);
                let start = Instant::now();
                let n = p.deliver(&mut events, Some(LOST_AFTER)).expect("deliver");
                (n, events.is_notified(), start.elapsed())
            })
        };
        until_waiters(&p, 1);
        p.notify().unwrap();
        let (n, notified, elapsed) = within("notified deliver", move || waiter.join().unwrap());
        assert_eq!((n, notified), (0, true), "trial {trial} after {elapsed:?}");
        let s = p.stats().since(&before);
        assert_eq!(s.wakes, 1, "trial {trial}: {s:?}");
    }
}

/// The scenario that wedged a rump kernel with two virtual CPUs (and a CI run
/// with it, until its 90 minutes were up): deregistrations of armed, ready registrations while two
/// other threads deliver from the same poller, so that the deregistration's
/// `EV_DELETE` meets a `kqueue_scan` running the same knote's filter.
/// NetBSD 7.99's `knote_detach` busy-waits for that knote holding `fd_lock`;
/// with `RUMP_NCPU=2` the scanning thread could wait for the spinning thread's
/// virtual CPU forever (6 of 9 runs of 40,000 rounds wedged, the first at
/// round 3,200; the full `rump_suite` 1 run in 132). With one virtual CPU
/// (`.cargo/config.toml`) 19 runs of 40,000 rounds ended; here 1,000 rounds of
/// 16 registrations, every call `Ok`, events delivered meanwhile.
#[test]
fn deregister_while_two_threads_deliver_never_wedges() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const ROUNDS: usize = 1_000;
    const WIDTH: usize = 16;
    let p = Arc::new(rump_poller());
    let stop = Arc::new(AtomicBool::new(false));
    let delivered = Arc::new(AtomicUsize::new(0));
    let deliverers: Vec<_> = (0..2)
        .map(|_| {
            let (p, stop, delivered) = (Arc::clone(&p), Arc::clone(&stop), Arc::clone(&delivered));
            std::thread::spawn(move || {
                let mut events = Events::with_capacity(64);
                while !stop.load(Ordering::SeqCst) {
                    p.deliver(&mut events, Some(Duration::from_millis(5)))
                        .expect("deliver");
                    delivered.fetch_add(events.len(), Ordering::SeqCst);
                }
            })
        })
        .collect();
    let rounds = {
        let p = Arc::clone(&p);
        within(
            "1,000 rounds of deregistrations beside 2 delivering threads",
            move || {
                for _ in 0..ROUNDS {
                    let pairs: Vec<(Rfd, Rfd)> = (0..WIDTH).map(|_| socketpair()).collect();
                    let tokens: Vec<Token> = pairs.iter().map(|(_, b)| register(&p, b)).collect();
                    for (a, _) in &pairs {
                        write(a, b"x");
                    }
                    for t in &tokens {
                        p.arm(*t, Interest::READABLE).expect("arm");
                    }
                    for t in &tokens {
                        p.deregister(*t).expect("deregister");
                    }
                }
                ROUNDS
            },
        )
    };
    stop.store(true, Ordering::SeqCst);
    for d in deliverers {
        within("a delivering thread's end", move || d.join().unwrap());
    }
    assert_eq!(rounds, ROUNDS);
    assert!(p.is_empty());
    assert!(
        delivered.load(Ordering::SeqCst) > 0,
        "no event was delivered: the deregistrations never met a ready knote"
    );
}

/// `boot` refuses, saying why, where `RUMP_NCPU` is unset (with two or more
/// virtual CPUs the rump kernel can wedge: `pollshot::rump::boot`): this
/// binary run again without the variable, on the helper below.
#[test]
fn boot_without_rump_ncpu_is_refused_with_the_reason() {
    let out = std::process::Command::new(std::env::current_exe().expect("this test's binary"))
        .args(["--exact", "boot_child", "--ignored", "--nocapture"])
        .env_remove("RUMP_NCPU")
        .output()
        .expect("run this binary again");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(
            "boot: refused, InvalidInput: the rump kernel was not booted: RUMP_NCPU is unset"
        ),
        "{text}"
    );
}

/// The child of the test above: boots the rump kernel with the environment it
/// was given and prints the outcome.
#[test]
#[ignore = "run by boot_without_rump_ncpu_is_refused_with_the_reason, without RUMP_NCPU"]
fn boot_child() {
    match pollshot::rump::boot() {
        Ok(()) => println!("boot: booted"),
        Err(e) => println!("boot: refused, {:?}: {e}", e.kind()),
    }
}
