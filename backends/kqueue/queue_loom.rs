//! Model checks with loom of the change queue's ordering and ownership rules
//! (`queue.rs`, "Ownership"): every interleaving of the threads below, on the
//! queue's own code (loom's `Mutex` and `Condvar` through `queue::sync`).
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test --release --lib loom_
//! ```
//!
//! The kernel is a log of the records applied, in the order they were applied;
//! a `kevent` call applies the records it was given at one moment between the
//! unlock that handed them over and the lock that releases them. Checked:
//! - when `deregister` returns, no record of its descriptor is queued or in a
//!   call (under the lock, at that moment);
//! - nothing of the descriptor reaches the kernel after its `EV_DELETE`, and
//!   every record of it made before the deregistration reaches the kernel once,
//!   before the `EV_DELETE` (queued records are flushed, never dropped);
//! - a deregistration whose records are carried by waiters blocked in the kernel
//!   wakes one of them, and a waiter that takes a wake-up meant for another
//!   passes it on, so the deregistration never waits forever.

use super::changes::{Action, Change, Filter, Filters, Knotes};
use super::queue::{Outbox, Queue, Record, Route, View, NO_RECORD};
use crate::token::{pack_usize, unpack_usize};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;
use std::os::fd::RawFd;

/// Runs `f` under loom, every interleaving with at most `PREEMPTIONS` forced
/// switches between threads (loom's usual bound; `LOOM_MAX_PREEMPTIONS` in the
/// environment overrides it). Each test has three threads.
fn model(f: impl Fn() + Sync + Send + 'static) {
    const PREEMPTIONS: usize = 4;
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(PREEMPTIONS);
    }
    b.check(f);
}

/// The deregistered descriptor, its registration's slot and incarnation.
const FD: RawFd = 5;
const SLOT: u32 = 0;
const INC: u32 = 1;
/// Another registration's descriptor.
const OTHER: RawFd = 6;

fn rec(fd: RawFd, slot: u32, filter: Filter, action: Action, seq: u32) -> Record {
    Record {
        change: Change {
            fd,
            filter,
            action,
            udata: 0,
        },
        slot,
        incarnation: INC,
        seq,
    }
}

/// The records the kernel applied, in order.
type Kernel = Arc<Mutex<Vec<Record>>>;

fn apply(kernel: &Kernel, records: &[Record]) {
    kernel.lock().unwrap().extend_from_slice(records);
}

/// A queue with one registration of `FD` (both filters added and enabled, at
/// sequence number 1, the arming in force stamped 1) and `queued` waiting to
/// ride on the next wait.
fn setup(queued: &[Record]) -> Arc<Queue> {
    let q = Queue::new();
    {
        let mut sh = q.lock();
        sh.views.insert(
            SLOT,
            View {
                incarnation: INC,
                knotes: Knotes {
                    present: Filters::BOTH,
                    enabled: Filters::BOTH,
                },
                seq: 1,
                stamp: 1,
                fired_at: None,
                fired: Filters::NONE,
            },
        );
        sh.pending.extend(queued.iter().copied());
    }
    Arc::new(q)
}

/// A change-only call of `batch` (held as in flight by whoever routed it).
fn submit(q: &Queue, kernel: &Kernel, batch: &[Record]) {
    apply(kernel, batch);
    q.release_batch(batch);
}

/// `deregister`, as `command.rs` does it: remove the view, drain, submit the
/// batch; then the ownership check, under the lock.
fn deregister(q: &Queue, kernel: &Kernel, wake: impl FnMut()) {
    let mut sh = q.lock();
    let view = sh.views.remove(&SLOT).expect("registered");
    let seq = view.seq + 1;
    let own = [
        rec(FD, SLOT, Filter::Read, Action::Delete, seq),
        rec(FD, SLOT, Filter::Write, Action::Delete, seq),
    ];
    let (sh, batch) = q.drain(sh, FD, &own, wake);
    drop(sh);
    submit(q, kernel, batch.as_slice());
    let sh = q.lock();
    assert!(
        !sh.in_flight(FD),
        "a record of {FD} in flight after deregister"
    );
    assert!(
        !sh.pending.iter().any(|r| r.change.fd == FD),
        "a record of {FD} queued after deregister: {:?}",
        sh.pending
    );
}

/// `Backend::delivered`, as `backend.rs` does it: under one lock, if the view
/// is there, disable the write filter and route the record; submit what was
/// routed now.
fn delivered(q: &Queue, kernel: &Kernel) {
    let mut out = Outbox::default();
    {
        let mut sh = q.lock();
        let Some(v) = sh.views.get_mut(&SLOT) else {
            return;
        };
        v.seq += 1;
        let r = rec(FD, SLOT, Filter::Write, Action::Disable, v.seq);
        out.route(&mut sh, &[r]);
    }
    for b in &out.batches {
        submit(q, kernel, b.as_slice());
    }
}

/// Checks the kernel's log: the `EV_DELETE`s of `FD` come last among its
/// records, and each of `made` (records of `FD` made before the deregistration)
/// was applied exactly once, before them.
fn check_log(kernel: &Kernel, made: &[Record]) {
    let log = kernel.lock().unwrap();
    let of_fd: Vec<&Record> = log.iter().filter(|r| r.change.fd == FD).collect();
    let first_delete = of_fd
        .iter()
        .position(|r| r.change.action == Action::Delete)
        .expect("the EV_DELETEs reached the kernel");
    assert!(
        of_fd[first_delete..]
            .iter()
            .all(|r| r.change.action == Action::Delete),
        "a record of {FD} reached the kernel after its EV_DELETE: {of_fd:?}"
    );
    for m in made {
        let n = of_fd[..first_delete]
            .iter()
            .filter(|r| r.change == m.change && r.seq == m.seq)
            .count();
        assert_eq!(n, 1, "{m:?} applied {n} times before the delete: {of_fd:?}");
    }
}

/// A deregistration races a wait that may carry its descriptor's queued
/// `EV_ENABLE` (and another descriptor's), and a delivery hook that may queue
/// or submit the disable of its other filter. 3 threads.
#[test]
fn loom_deregister_racing_a_wait_and_a_delivery_leaves_nothing_behind() {
    model(|| {
        let enable = rec(FD, SLOT, Filter::Read, Action::Enable, 1);
        let other = rec(OTHER, 1, Filter::Read, Action::Enable, 1);
        let q = setup(&[enable, other]);
        let kernel: Kernel = Arc::new(Mutex::new(Vec::new()));

        let waiter = {
            let (q, kernel) = (q.clone(), kernel.clone());
            thread::spawn(move || wait_call(&q, &kernel))
        };
        let hook = {
            let (q, kernel) = (q.clone(), kernel.clone());
            thread::spawn(move || delivered(&q, &kernel))
        };
        deregister(&q, &kernel, || {});
        waiter.join().unwrap();
        hook.join().unwrap();

        // The disable the hook made (if it ran before the deregistration) is in
        // the log before the delete; the queued enable always is.
        let log = kernel.lock().unwrap().clone();
        let mut made = vec![enable];
        if let Some(d) = log
            .iter()
            .find(|r| r.change.fd == FD && r.change.action == Action::Disable)
        {
            made.push(*d);
        }
        check_log(&kernel, &made);
        // Nothing of FD is left anywhere; the other descriptor's record was
        // applied once or is still queued.
        let sh = q.lock();
        assert!(!sh.in_flight(FD) && !sh.in_flight(OTHER));
        let applied = log.iter().filter(|r| r.change.fd == OTHER).count();
        let queued = sh.pending.iter().filter(|r| r.change.fd == OTHER).count();
        assert_eq!(applied + queued, 1, "{log:?} {:?}", sh.pending);
    });
}

/// A wake-up for waiters blocked in the kernel, coalescing like the backend's
/// `woken` flag: `kick` sets it and wakes them, a waiter that returns takes it.
#[derive(Default)]
struct Waker {
    woken: Mutex<bool>,
    cv: Condvar,
}

impl Waker {
    fn kick(&self) {
        *self.woken.lock().unwrap() = true;
        self.cv.notify_all();
    }

    /// Blocks until woken, and takes the wake-up.
    fn wait(&self) {
        let mut w = self.woken.lock().unwrap();
        while !*w {
            w = self.cv.wait(w).unwrap();
        }
        *w = false;
    }
}

/// Two waiters carry one queued record each (at most) and stay blocked in the
/// kernel until a wake-up; a waiter that carried nothing returns at once (its
/// timeout). The deregistration must wake the one that carries its record: its
/// one wake-up reaches either waiter, and a waiter that took it while the other
/// still carries one passes it on (as `backend.rs`'s `wait` does after clearing
/// `woken`). A lost wake-up shows as a deadlock. Here one waiter may carry the
/// descriptor's `EV_ENABLE`, the other another descriptor's. 3 threads.
#[test]
fn loom_deregister_wakes_the_waiter_that_carries_its_record() {
    let read = rec(FD, SLOT, Filter::Read, Action::Enable, 1);
    let other = rec(OTHER, 1, Filter::Read, Action::Enable, 1);
    waiters_carrying([read, other], vec![read]);
}

/// The same where both waiters may carry one of the descriptor's two queued
/// `EV_ENABLE`s (enables may be in flight together).
#[test]
fn loom_deregister_wakes_both_waiters_that_carry_its_records() {
    let read = rec(FD, SLOT, Filter::Read, Action::Enable, 1);
    let write = rec(FD, SLOT, Filter::Write, Action::Enable, 1);
    waiters_carrying([read, write], vec![read, write]);
}

fn waiters_carrying(queued: [Record; 2], made: Vec<Record>) {
    model(move || {
        let q = setup(&queued);
        let kernel: Kernel = Arc::new(Mutex::new(Vec::new()));
        let waker = Arc::new(Waker::default());

        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (q, kernel, waker) = (q.clone(), kernel.clone(), waker.clone());
                thread::spawn(move || {
                    let mut carried = [NO_RECORD; 1];
                    let n = q.lock().enter_wait(&mut carried);
                    apply(&kernel, &carried[..n]);
                    if n > 0 {
                        waker.wait();
                    }
                    let mut sh = q.lock();
                    let drained = sh.leave_wait(&carried[..n], |_| false);
                    let pass_on = n > 0 && sh.drain_needs_wake() && sh.waiters > 0;
                    drop(sh);
                    if drained {
                        q.released();
                    }
                    if pass_on {
                        waker.kick();
                    }
                })
            })
            .collect();
        deregister(&q, &kernel, || waker.kick());
        // A waiter still blocked with another descriptor's record ends (its
        // event, its timeout).
        waker.kick();
        for w in waiters {
            w.join().unwrap();
        }
        check_log(&kernel, &made);
    });
}

/// Where `udata` carries the generation, the `udata` left on an enabled knote
/// is the arming in force's once its reports were read: a re-arm (stamp 2)
/// routed while a waiter carries the previous arm's `EV_ENABLE` (stamp 1) may
/// pass it and land first (`Shared::clear_to_go`); the older `udata` left then
/// shows in the knote's next report, which `Shared::note_report` answers with a
/// repair that re-enables it with stamp 2. Checked on the kernel's knote after a
/// last wait took what was queued and every report was read. 3 threads.
#[test]
fn loom_a_knote_left_with_an_older_arming_is_repaired_at_its_report() {
    model(|| {
        let first = Record {
            change: Change {
                udata: pack_usize(SLOT, 1),
                ..rec(FD, SLOT, Filter::Read, Action::Enable, 1).change
            },
            ..rec(FD, SLOT, Filter::Read, Action::Enable, 1)
        };
        let q = setup(&[first]);
        let kernel: Kernel = Arc::new(Mutex::new(Vec::new()));
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (q, kernel) = (q.clone(), kernel.clone());
                thread::spawn(move || wait_call(&q, &kernel))
            })
            .collect();
        // The re-arm: a new command for the registration, as `exchange` routes
        // it (the view's stamp is the new arming's).
        let rearm = {
            let mut sh = q.lock();
            let v = sh.views.get_mut(&SLOT).unwrap();
            v.seq += 1;
            v.stamp = 2;
            let mut r = rec(FD, SLOT, Filter::Read, Action::Enable, v.seq);
            r.change.udata = pack_usize(SLOT, 2);
            match sh.route(&[r]) {
                Route::Now(b) => Some(b),
                Route::Queued { .. } => None,
            }
        };
        if let Some(b) = rearm {
            submit(&q, &kernel, b.as_slice());
        }
        for w in waiters {
            w.join().unwrap();
        }
        // The next wait carries whatever is still queued.
        wait_call(&q, &kernel);
        // The knote's udata is the last enable's to land. It fires: read the
        // report as `wait` does, and apply the repair it asks for.
        let left = last_udata(&kernel);
        let (_, stamp) = unpack_usize(left);
        let repair = q.lock().note_report(FD, SLOT, stamp, Filter::Read, true);
        if let Some(r) = repair {
            let mut out = Outbox::default();
            out.route(&mut q.lock(), &[r]);
            for b in &out.batches {
                submit(&q, &kernel, b.as_slice());
            }
            wait_call(&q, &kernel);
        }
        assert_eq!(
            unpack_usize(last_udata(&kernel)).1,
            2,
            "the enabled knote is left tagged with an older arming"
        );
    });
}

/// The `udata` of the last `EV_ENABLE` of `FD` the kernel applied.
fn last_udata(kernel: &Kernel) -> usize {
    let log = kernel.lock().unwrap();
    log.iter()
        .rev()
        .find(|r| r.change.fd == FD && r.change.action == Action::Enable)
        .map(|r| r.change.udata)
        .expect("an enable reached the kernel")
}

/// A waiting call: it carries what it may, the kernel applies it, and it
/// returns (an event, or its timeout).
fn wait_call(q: &Queue, kernel: &Kernel) {
    let mut carried = [NO_RECORD; 4];
    let n = q.lock().enter_wait(&mut carried);
    apply(kernel, &carried[..n]);
    if q.lock().leave_wait(&carried[..n], |_| false) {
        q.released();
    }
}
