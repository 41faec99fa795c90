//! Scenarios that need no descriptor, only a poller: the Unix suite
//! (`tests/common`, every Unix backend) and the Windows suite (`tests/windows.rs`)
//! both run them. Timing never decides a pass: deadlines only turn a lost
//! wake-up or a hang into a failure. They count waiters (`Poller::waiters`):
//! cargo feature `stats`.
#![cfg(feature = "stats")]

use pollshot::{Backend, Events, Poller};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Trials of each racy scenario.
const TRIALS: usize = 20;

/// How long a blocked `deliver` of a scenario waits at most: only a failure
/// (a lost notify) waits that long.
const LOST_AFTER: Duration = Duration::from_secs(10);

/// Waits until `n` threads are counted in `p`'s `deliver`; panics after 60 s.
fn until_waiters<B: Backend>(p: &Poller<B>, n: usize) {
    let start = Instant::now();
    while p.waiters() < n {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{n} threads never reached deliver ({} did)",
            p.waiters()
        );
        thread::sleep(Duration::from_millis(1));
    }
}

/// A notify made while a thread is blocked in `deliver` ends that `deliver`,
/// even with another thread polling with a zero timeout the whole time: the
/// poller's waker may wake the polling call first, which must leave the notify
/// to the blocked one (it passes the wake-up on) rather than take it. On the old
/// code this failed at its first trial on every backend: the poll took the
/// notify, and the blocked `deliver` slept to its timeout. 20 trials.
pub fn a_notify_ends_the_blocked_deliver_not_a_zero_timeout_poll<B: Backend>(p: Poller<B>) {
    let p = Arc::new(p);
    for trial in 0..TRIALS {
        let stop = Arc::new(AtomicBool::new(false));
        let blocked = {
            let (p, stop) = (Arc::clone(&p), Arc::clone(&stop));
            thread::spawn(move || {
                let mut events = Events::with_capacity(4);
                let start = Instant::now();
                // io_uring may end a wait with `Interrupted` and no signal: call
                // again for the time left, as a caller must.
                let n = loop {
                    let left = LOST_AFTER.saturating_sub(start.elapsed());
                    match p.deliver(&mut events, Some(left)) {
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        r => break r.expect("deliver"),
                    }
                };
                stop.store(true, Ordering::SeqCst);
                (n, events.is_notified())
            })
        };
        let poll = {
            let (p, stop) = (Arc::clone(&p), Arc::clone(&stop));
            thread::spawn(move || {
                let mut events = Events::with_capacity(4);
                let mut notified = 0;
                while !stop.load(Ordering::SeqCst) {
                    match p.deliver(&mut events, Some(Duration::ZERO)) {
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        r => {
                            r.expect("deliver(ZERO)");
                        }
                    }
                    notified += events.is_notified() as usize;
                }
                notified
            })
        };
        until_waiters(&p, 1);
        p.notify().unwrap();
        let (n, notified) = blocked.join().unwrap();
        let polled = poll.join().unwrap();
        assert_eq!(
            (n, notified, polled),
            (0, true, 0),
            "trial {trial}: (events, the blocked deliver notified, zero-timeout polls notified)"
        );
        let mut events = Events::with_capacity(4);
        p.deliver(&mut events, Some(Duration::ZERO)).unwrap();
        assert!(
            !events.is_notified(),
            "trial {trial}: a notify was left over"
        );
        assert_eq!(p.waiters(), 0, "trial {trial}: a waiter is still counted");
    }
}
