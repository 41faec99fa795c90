//! The notify protocol under every interleaving: issue 8, points 1, 3 and 4, and
//! the synthetic event's wake-up (an arm racing a waiter about to block).
//!
//! Each scenario asserts what `Poller::deliver` and `Poller::notify` document: a
//! notify ends exactly one deliver; `k` notifies with `k` waiters end `k`; a deliver
//! never returns `Ok(0)` without a notify before its deadline (the model's
//! `deliver` checks that on every return); nothing is lost (a lost wake-up leaves
//! a thread blocked for ever: loom reports the deadlock) or left over.

use super::check;
use super::model::{Delivered, Model, TIMED};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;
use std::time::Duration;

/// What the waiters of a scenario returned, for a thread that waits for them.
#[derive(Default)]
struct Returns {
    list: Mutex<Vec<Delivered>>,
    changed: Condvar,
}

impl Returns {
    fn push(&self, d: Delivered) {
        self.list.lock().unwrap().push(d);
        self.changed.notify_all();
    }

    /// Blocks until `done` holds for the deliveries returned so far.
    fn until(&self, done: impl Fn(&[Delivered]) -> bool) {
        let mut list = self.list.lock().unwrap();
        while !done(&list) {
            list = self.changed.wait(list).unwrap();
        }
    }
}

/// `n` threads each in one `deliver(capacity, timeout)`; their results go to the
/// returned list as they return.
fn waiters(
    model: &Arc<Model>,
    n: usize,
    capacity: usize,
    timeout: Option<Duration>,
) -> (Arc<Returns>, Vec<thread::JoinHandle<()>>) {
    let returns = Arc::new(Returns::default());
    let handles = (0..n)
        .map(|_| {
            let (model, returns) = (Arc::clone(model), Arc::clone(&returns));
            thread::spawn(move || returns.push(model.deliver(capacity, timeout)))
        })
        .collect();
    (returns, handles)
}

fn join(handles: Vec<thread::JoinHandle<()>>) {
    for h in handles {
        h.join().unwrap();
    }
}

fn results(returns: &Returns) -> Vec<Delivered> {
    returns.list.lock().unwrap().clone()
}

/// Runs `f` on a thread of its own and waits for it: loom explores the steps of
/// spawned threads against one another's, not the main thread's as finely.
fn on_thread<T: 'static>(model: &Arc<Model>, f: impl FnOnce(&Model) -> T + 'static) -> T {
    let model = Arc::clone(model);
    thread::spawn(move || f(&model)).join().unwrap()
}

/// Blocks (yielding to loom) until `n` threads are counted as waiting.
fn until_waiters(model: &Model, n: usize) {
    while model.waiters() < n {
        thread::yield_now();
    }
}

const NOTIFIED: Delivered = Delivered {
    slots: Vec::new(),
    notified: true,
    shutdown: false,
};

const TIMED_OUT: Delivered = Delivered {
    slots: Vec::new(),
    notified: false,
    shutdown: false,
};

const SHUT_DOWN: Delivered = Delivered {
    slots: Vec::new(),
    notified: false,
    shutdown: true,
};

/// Point 1's scenario: one waiter (`deliver(timeout)`) whose waits fetch only a
/// stale event and a wake-up that is not a notify, made by another thread while
/// this one calls `end` (a notify, or the deadline passing); returns what the
/// waiter's deliver returned.
fn stale_and_spurious(timeout: Option<Duration>, end: fn(&Model)) -> Delivered {
    let model = Arc::new(Model::new());
    let (returns, handles) = waiters(&model, 1, 8, timeout);
    let noise = {
        let model = Arc::clone(&model);
        thread::spawn(move || {
            model.stale_event();
            model.wake_not_notify();
        })
    };
    on_thread(&model, end);
    noise.join().unwrap();
    join(handles);
    assert_eq!(model.counters(), (0, 0), "(pending, waiters) left over");
    results(&returns).remove(0)
}

/// Point 1: a `deliver(None)` whose waits fetch only a stale event and a wake-up
/// that is not a notify keeps waiting; the notify, in any order with them, ends
/// it.
#[test]
fn loom_point1_stale_events_and_spurious_wakeups_do_not_end_deliver_none() {
    check(
        "point 1, deliver(None), stale + spurious + notify",
        3,
        || assert_eq!(stale_and_spurious(None, Model::notify), NOTIFIED),
    );
}

/// Point 1: a timed deliver that gets only a stale event and a spurious wake-up
/// returns at its deadline, not before, and not notified.
#[test]
fn loom_point1_stale_only_timed_deliver_returns_at_its_deadline() {
    check(
        "point 1, timed deliver, stale + spurious + deadline",
        3,
        || assert_eq!(stale_and_spurious(TIMED, Model::expire), TIMED_OUT),
    );
}

/// Point 3: two timed waiters and one notify: exactly one returns notified; the
/// other returns only at its deadline; nothing pending afterwards.
#[test]
fn loom_point3_one_notify_ends_exactly_one_of_two_waiters() {
    check("point 3, 2 waiters, 1 notify", 3, || {
        let model = Arc::new(Model::new());
        let (returns, handles) = waiters(&model, 2, 8, TIMED);
        on_thread(&model, Model::notify);
        returns.until(|r| !r.is_empty());
        model.expire();
        join(handles);
        let mut r = results(&returns);
        r.sort_by_key(|d| d.notified);
        assert_eq!(r, [TIMED_OUT, NOTIFIED]);
        assert_eq!(model.counters(), (0, 0));
    });
}

/// A notify made while a waiter is counted ends that waiter's `deliver(None)`,
/// even where a `deliver` with a zero timeout on another thread (not counted)
/// takes the kernel's wake-up first: that call leaves the notify and wakes the
/// kernel again. Before, it took the notify, and the waiter blocked for ever (a
/// deadlock to loom).
#[test]
fn loom_a_zero_timeout_deliver_leaves_the_notify_to_the_counted_waiter() {
    check(
        "a zero-timeout deliver beside a waiter, 1 notify",
        3,
        || {
            let model = Arc::new(Model::new());
            let (returns, handles) = waiters(&model, 1, 8, None);
            until_waiters(&model, 1);
            let poll = {
                let model = Arc::clone(&model);
                thread::spawn(move || model.deliver(8, Some(Duration::ZERO)))
            };
            on_thread(&model, Model::notify);
            let polled = poll.join().unwrap();
            join(handles);
            assert_eq!(polled, TIMED_OUT);
            assert_eq!(results(&returns), [NOTIFIED]);
            assert_eq!(model.counters(), (0, 0));
        },
    );
}

/// Point 4: `k` waiters blocked, `k` notifies: each waiter returns notified.
fn k_notifies_end_k_waiters(k: usize) {
    let model = Arc::new(Model::new());
    let (returns, handles) = waiters(&model, k, 8, None);
    on_thread(&model, move |model| {
        until_waiters(model, k);
        for _ in 0..k {
            model.notify();
        }
    });
    join(handles);
    assert_eq!(results(&returns), vec![NOTIFIED; k]);
    assert_eq!(model.counters(), (0, 0));
}

#[test]
fn loom_point4_two_notifies_end_two_waiters() {
    check("point 4, 2 waiters, 2 notifies", 3, || {
        k_notifies_end_k_waiters(2)
    });
}

#[test]
fn loom_point4_three_notifies_end_three_waiters() {
    check("point 4, 3 waiters, 3 notifies", 1, || {
        k_notifies_end_k_waiters(3)
    });
}

/// Point 4: a notify racing a deliver that is not yet waiting ends that deliver.
#[test]
fn loom_point4_notify_with_no_waiter_ends_the_next_deliver() {
    check(
        "point 4, notify before or during the next deliver",
        3,
        || {
            let model = Arc::new(Model::new());
            let notifier = {
                let model = Arc::clone(&model);
                thread::spawn(move || model.notify())
            };
            assert_eq!(on_thread(&model, |model| model.deliver(8, None)), NOTIFIED);
            notifier.join().unwrap();
            assert_eq!(model.counters(), (0, 0));
        },
    );
}

/// Points 1 and 4: two blocked waiters, two notifies and a wake-up that is not a
/// notify (an arm's wake-up for a synthetic event another deliver took): both
/// waiters still return notified.
#[test]
fn loom_point4_two_notifies_end_two_waiters_despite_a_spurious_wakeup() {
    check(
        "point 4, 2 waiters, 2 notifies, 1 spurious wake-up",
        2,
        || {
            let model = Arc::new(Model::new());
            let (returns, handles) = waiters(&model, 2, 8, None);
            until_waiters(&model, 2);
            let noise = {
                let model = Arc::clone(&model);
                thread::spawn(move || model.wake_not_notify())
            };
            model.notify();
            model.notify();
            noise.join().unwrap();
            join(handles);
            assert_eq!(results(&returns), vec![NOTIFIED; 2]);
            assert_eq!(model.counters(), (0, 0));
        },
    );
}

/// `n` waiters in `deliver(None)` with room for `capacity` events each, while
/// this thread arms an always-ready registration in each of `slots`: every
/// waiter returns, and together they got each event once (returned sorted).
fn arms_for_waiters(n: usize, capacity: usize, slots: &[u32]) -> Vec<u32> {
    let model = Arc::new(Model::new());
    let (returns, handles) = waiters(&model, n, capacity, None);
    let slots = slots.to_vec();
    on_thread(&model, move |model| {
        for slot in slots {
            model.arm_always_ready(slot);
        }
    });
    join(handles);
    assert_eq!(model.queued(), 0, "a synthetic event left queued");
    let mut got: Vec<u32> = results(&returns)
        .into_iter()
        .flat_map(|d| d.slots)
        .collect();
    got.sort_unstable();
    got
}

/// The Dekker pair: an arm that queues a synthetic event while a waiter is about
/// to block: the waiter does not block past it.
#[test]
fn loom_synthetic_arm_racing_a_waiter_about_to_block() {
    check("synthetic, 1 waiter, 1 arm", 3, || {
        assert_eq!(arms_for_waiters(1, 8, &[1]), [1]);
    });
}

/// Two waiters with room for one event each, two always-ready arms: each waiter
/// gets one event (neither stays blocked while an event is queued).
#[test]
fn loom_synthetic_two_arms_two_waiters_with_room_for_one() {
    check("synthetic, 2 waiters (capacity 1), 2 arms", 3, || {
        assert_eq!(arms_for_waiters(2, 1, &[1, 2]), [1, 2]);
    });
}

/// Two timed waiters, one always-ready arm and one notify (their wake-ups may
/// merge into one): the event and the notify are each taken once, and no waiter
/// stays blocked while the event is queued.
#[test]
fn loom_synthetic_arm_and_notify_with_two_waiters() {
    check("synthetic, 2 waiters, 1 arm + 1 notify", 3, || {
        let model = Arc::new(Model::new());
        let (returns, handles) = waiters(&model, 2, 8, TIMED);
        on_thread(&model, |model| {
            model.arm_always_ready(1);
            model.notify();
        });
        let taken = |r: &[Delivered]| -> usize {
            r.iter().map(|d| d.slots.len() + d.notified as usize).sum()
        };
        returns.until(|r| taken(r) == 2);
        model.expire();
        join(handles);
        let r = results(&returns);
        let slots: Vec<u32> = r.iter().flat_map(|d| d.slots.clone()).collect();
        assert_eq!(slots, [1]);
        assert_eq!(r.iter().filter(|d| d.notified).count(), 1);
        assert_eq!(model.counters(), (0, 0));
    });
}

/// Shutdown: `k` workers that each check a stop flag, then (if it was clear)
/// `deliver(None)`, racing a thread that sets the flag and calls `shutdown` once:
/// every worker returns (a worker left blocked is a deadlock loom reports), each
/// that delivered returns shut down, and nothing is left counted.
fn shutdown_stops_k_workers(k: usize) {
    use loom::sync::atomic::{AtomicBool, Ordering};
    let model = Arc::new(Model::new());
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..k)
        .map(|_| {
            let (model, stop) = (Arc::clone(&model), Arc::clone(&stop));
            thread::spawn(move || (!stop.load(Ordering::SeqCst)).then(|| model.deliver(8, None)))
        })
        .collect();
    stop.store(true, Ordering::SeqCst);
    on_thread(&model, Model::shutdown);
    for h in handles {
        if let Some(d) = h.join().unwrap() {
            assert_eq!(d, SHUT_DOWN);
        }
    }
    assert_eq!(model.counters(), (0, 0));
    // Sticky: a later deliver returns at once.
    assert_eq!(model.deliver(8, None), SHUT_DOWN);
}

#[test]
fn loom_shutdown_stops_two_workers_blocked_or_about_to_block() {
    check("shutdown, 2 workers, stop flag", 3, || {
        shutdown_stops_k_workers(2)
    });
}

#[test]
fn loom_shutdown_stops_three_workers_blocked_or_about_to_block() {
    check("shutdown, 3 workers, stop flag", 2, || {
        shutdown_stops_k_workers(3)
    });
}

/// Shutdown racing a notify and a spurious wake-up with two blocked waiters:
/// both return (notified or shut down), and a shutdown never eats the notify
/// silently: at most one is notified, and every waiter not notified is shut down.
#[test]
fn loom_shutdown_with_a_notify_and_a_spurious_wakeup() {
    check("shutdown, 2 waiters, notify + spurious", 2, || {
        let model = Arc::new(Model::new());
        let (returns, handles) = waiters(&model, 2, 8, None);
        let noise = {
            let model = Arc::clone(&model);
            thread::spawn(move || {
                model.wake_not_notify();
                model.notify();
            })
        };
        model.shutdown();
        noise.join().unwrap();
        join(handles);
        let r = results(&returns);
        assert_eq!(r.len(), 2);
        for d in &r {
            assert!(d.notified || d.shutdown, "{d:?}");
        }
        assert_eq!(model.waiters(), 0);
    });
}
