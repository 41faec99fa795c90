//! The io_uring backend's hand-over (`backends/uring/handover.rs`) under every
//! interleaving, on the modelled ring of `ring.rs`: a leader in the kernel, a
//! follower, a departing deregister, a zero-timeout poll and the waker.
//!
//! Each scenario asserts that every thread returns (one left waiting is a
//! deadlock loom reports: the hang of a `deregister` beside zero-timeout polls
//! was one), that each event is delivered once, and that a deregister leaves no
//! request of its registration in the kernel.

use super::check;
use super::ring::ModelRing;
use crate::event::{Event, Events, Readiness};
use crate::token::Token;
use crate::wake::{self, Fetched, Notifies, Source};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use std::io;
use std::time::Duration;

const ZERO: Option<Duration> = Some(Duration::ZERO);
/// Any nonzero timeout: the model's clock decides when it passes.
const TIMED: Option<Duration> = Some(Duration::from_secs(1));

fn spawn<T: 'static>(
    ring: &Arc<ModelRing>,
    f: impl FnOnce(&ModelRing) -> T + 'static,
) -> thread::JoinHandle<T> {
    let ring = Arc::clone(ring);
    thread::spawn(move || f(&ring))
}

/// A ring with `slots` registrations, each armed (generation 1) and its
/// request submitted.
fn armed(slots: u32) -> Arc<ModelRing> {
    let ring = Arc::new(ModelRing::new(slots as usize));
    for slot in 0..slots {
        ring.arm(slot, 1);
    }
    ring.submit_now();
    ring
}

/// Waits (`deliver(None)`) until a wake-up comes; returns the slots delivered
/// meanwhile.
fn until_woken(ring: &ModelRing) -> Vec<u32> {
    let mut got = Vec::new();
    loop {
        let (slots, woken) = ring.deliver(8, None);
        got.extend(slots);
        if woken {
            return got;
        }
    }
}

/// The hang: a `deregister` beside a thread that polls with a zero timeout.
/// The deregister leads an enter that submits its remove and waits for the
/// cancelled request's completion; a poll that took that completion from the
/// queue before the enter looked left it asleep for good. Now only the leader
/// takes completions.
#[test]
fn loom_uring_deregister_beside_a_zero_timeout_poll() {
    check("uring: deregister beside 2 zero-timeout polls", 3, || {
        let ring = armed(1);
        let poll = spawn(&ring, |ring| {
            for _ in 0..2 {
                assert_eq!(ring.deliver(8, ZERO), (vec![], false));
            }
        });
        spawn(&ring, |ring| ring.deregister(0)).join().unwrap();
        poll.join().unwrap();
        assert_eq!(ring.left_over(), (0, 0));
    });
}

/// A deregister while another thread leads a blocked `deliver(None)` and a
/// third polls: the deregister submits its remove and sleeps (or leads, if it
/// finds the ring free), the leader returns for the cancellation and wakes it;
/// the blocked deliver still ends with the wake-up made afterwards.
#[test]
fn loom_uring_deregister_beside_a_blocked_deliver_and_a_poll() {
    check(
        "uring: deregister, blocked deliver, zero-timeout poll, wake",
        2,
        || {
            let ring = armed(1);
            let blocked = spawn(&ring, until_woken);
            let poll = spawn(&ring, |ring| ring.deliver(8, ZERO));
            spawn(&ring, |ring| ring.deregister(0)).join().unwrap();
            let polled = poll.join().unwrap();
            ring.wake();
            assert_eq!(blocked.join().unwrap(), Vec::<u32>::new());
            assert_eq!(polled, (vec![], false));
            assert_eq!(ring.left_over().1, 0);
        },
    );
}

/// Two blocked delivers with room for one event each, two registrations made
/// ready: the leader returns with one and hands the ring over; the follower
/// takes the other (or leads and waits for it).
#[test]
fn loom_uring_follower_takes_what_the_leader_leaves() {
    check("uring: leader + follower (room for 1), 2 ready", 2, || {
        let ring = armed(2);
        let a = spawn(&ring, |ring| ring.deliver(1, None));
        let b = spawn(&ring, |ring| ring.deliver(1, None));
        spawn(&ring, |ring| {
            ring.ready(0);
            ring.ready(1);
        })
        .join()
        .unwrap();
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        let mut slots: Vec<u32> = a.0.into_iter().chain(b.0).collect();
        slots.sort_unstable();
        assert_eq!(slots, [0, 1]);
        assert_eq!(ring.left_over(), (0, 0));
    });
}

/// Two blocked delivers and two wake-ups, the second made once one deliver
/// returned: each deliver returns woken, whichever led (the leader through the
/// eventfd, a follower through the hand-over word).
#[test]
fn loom_uring_wakeups_reach_the_leader_and_the_follower() {
    check("uring: leader + follower, 2 wake-ups", 2, || {
        let ring = Arc::new(ModelRing::new(0));
        let returned = Arc::new(AtomicUsize::new(0));
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let returned = Arc::clone(&returned);
                spawn(&ring, move |ring| {
                    let got = until_woken(ring);
                    returned.fetch_add(1, Ordering::SeqCst);
                    got
                })
            })
            .collect();
        ring.wake();
        while returned.load(Ordering::SeqCst) == 0 {
            thread::yield_now();
        }
        ring.wake();
        for w in waiters {
            assert_eq!(w.join().unwrap(), Vec::<u32>::new());
        }
    });
}

/// A blocked `deliver(None)` beside a timed one whose deadline passes: the
/// registration made ready is delivered once, to one of them, and the
/// `deliver(None)` does not sleep past a ring given back (it leads, or takes
/// the event, or the wake-up made after the timed one returned).
#[test]
fn loom_uring_timed_waiter_leaves_the_ring_to_the_blocked_one() {
    check(
        "uring: deliver(None) + timed deliver, deadline, 1 ready",
        2,
        || {
            let ring = armed(1);
            let blocked = spawn(&ring, |ring| ring.deliver(8, None));
            let timed = spawn(&ring, |ring| ring.deliver(8, TIMED));
            spawn(&ring, |ring| {
                ring.expire();
                ring.ready(0);
            })
            .join()
            .unwrap();
            let timed = timed.join().unwrap();
            if timed.0 == [0] {
                // The event went to the timed deliver: the other one needs a
                // wake-up to return.
                ring.wake();
            }
            let blocked = blocked.join().unwrap();
            let mut slots: Vec<u32> = blocked.0.into_iter().chain(timed.0).collect();
            slots.sort_unstable();
            assert_eq!(slots, [0]);
        },
    );
}

/// The poller's notify protocol (`src/wake.rs`) over the modelled ring.
struct Counted {
    notifies: Notifies,
    ring: ModelRing,
}

impl Source for Counted {
    fn notifies(&self) -> &Notifies {
        &self.notifies
    }

    fn kernel_turn(&self) -> bool {
        true
    }

    fn take_synthetic(&self, _events: &mut Events) {}

    fn wait(&self, events: &mut Events, timeout: Option<Duration>) -> io::Result<Fetched> {
        let (slots, woken) = self.ring.deliver(events.remaining(), timeout);
        for &slot in &slots {
            events.push(Event {
                token: Token::new(slot, 0),
                key: 0,
                readiness: Readiness::READABLE,
            });
        }
        Ok(match (woken, slots.is_empty()) {
            (true, _) => Fetched::Woken,
            (false, false) => Fetched::Events,
            (false, true) => Fetched::Nothing,
        })
    }

    fn wake(&self) -> io::Result<()> {
        self.ring.wake();
        Ok(())
    }
}

/// A notify made while a `deliver(None)` is counted as a waiter ends it, even
/// with another thread polling the ring with a zero timeout: the poll may take
/// the ring's wake-up, and then passes it on (`Notifies::woken`), to the leader
/// through the eventfd or to the follower through the hand-over word.
#[test]
fn loom_uring_a_notify_ends_the_blocked_deliver_beside_a_poll() {
    check(
        "uring: counted deliver(None) + zero-timeout poll + notify",
        2,
        || {
            let counted = Arc::new(Counted {
                notifies: Notifies::new(),
                ring: ModelRing::new(0),
            });
            let blocked = {
                let c = Arc::clone(&counted);
                thread::spawn(move || {
                    let mut events = Events::with_capacity(8);
                    wake::deliver(&*c, &mut events, || None).unwrap();
                    events.is_notified()
                })
            };
            while counted.notifies.waiters() == 0 {
                thread::yield_now();
            }
            let poll = {
                let c = Arc::clone(&counted);
                thread::spawn(move || {
                    let mut events = Events::with_capacity(8);
                    wake::deliver(&*c, &mut events, || ZERO).unwrap();
                    events.is_notified()
                })
            };
            counted.notifies.notify(|| counted.wake()).unwrap();
            assert!(!poll.join().unwrap(), "the poll took the notify");
            assert!(
                blocked.join().unwrap(),
                "the blocked deliver was not notified"
            );
        },
    );
}
