//! A modelled io_uring for the hand-over (`backends/uring/handover.rs`): the
//! protocol's own code runs on it, under loom.
//!
//! The model keeps what decides who is woken, as the kernel does it:
//!
//! - a submission queue the ring pushes to under the hand-over's queue lock
//!   (the arm submits at once where its release says the ring is held),
//!   consumed by an enter (any thread's); the leader's waiting enter submits
//!   as many entries as it counted under that lock;
//! - poll requests in the kernel, completed by their descriptor's readiness (a
//!   request submitted for a ready descriptor completes at once) or by a
//!   remove, whose answer is the request's `-ECANCELED` completion (the
//!   remove's own success posts nothing: `IOSQE_CQE_SKIP_SUCCESS`);
//! - the completion queue, a queue with a head and a tail: taking a completion
//!   moves the head;
//! - a waiting enter as `io_cqring_wait` waits: it submits, then (a scheduling
//!   point later, as the kernel's task work posts a cancellation after the
//!   submission) returns at once if the queue holds a completion, else reads
//!   the head and sleeps until the tail passes it, or its timeout passes. A
//!   completion taken by another thread before that read is one it never
//!   returns for: the hang this protocol exists to exclude;
//! - the waker: an eventfd write posts one completion (the multishot poll's);
//! - a clock that expires once (timed enters and timed futex sleeps end then).

use crate::backend::{EventSink, RawEvent};
use crate::readiness::Readiness;
use crate::uring_handover::{Handover, RingOps, LEADER};
use loom::sync::{Condvar, Mutex};
use std::collections::VecDeque;
use std::io;
use std::time::Duration;

/// `user_data` of the waker's completions.
const WAKER: u64 = u64::MAX;
/// A completion's result for a request ended by a remove.
const CANCELED: i32 = -libc::ECANCELED;

/// A poll request's `user_data`: slot and generation.
fn tag(slot: u32, generation: u32) -> u64 {
    u64::from(slot) | u64::from(generation) << 32
}

#[derive(Clone, Copy, Debug)]
enum Entry {
    Poll(u64),
    Remove(u64),
}

/// The kernel's side of the ring.
#[derive(Default)]
struct Kernel {
    /// Pushed, not yet submitted.
    sq: Vec<Entry>,
    /// Poll requests submitted and not yet completed.
    live: Vec<u64>,
    /// Slots whose descriptor is ready.
    ready: Vec<u32>,
    /// Posted completions not yet taken: `user_data` and result.
    cq: VecDeque<(u64, i32)>,
    head: u64,
    tail: u64,
    expired: bool,
}

impl Kernel {
    fn post(&mut self, user_data: u64, res: i32) {
        self.cq.push_back((user_data, res));
        self.tail += 1;
    }

    /// Submits every queued entry. Returns whether there were any.
    fn submit(&mut self) -> bool {
        self.submit_at_most(usize::MAX) > 0
    }

    /// Submits the first `n` queued entries, or as many as there are. Returns
    /// how many it submitted.
    fn submit_at_most(&mut self, n: usize) -> usize {
        let n = n.min(self.sq.len());
        let entries: Vec<Entry> = self.sq.drain(..n).collect();
        for e in &entries {
            match *e {
                Entry::Poll(ud) if self.ready.contains(&(ud as u32)) => {
                    self.post(ud, libc::POLLIN as i32)
                }
                Entry::Poll(ud) => self.live.push(ud),
                Entry::Remove(ud) => {
                    if let Some(i) = self.live.iter().position(|&l| l == ud) {
                        self.live.remove(i);
                        self.post(ud, CANCELED);
                    }
                }
            }
        }
        n
    }
}

/// The ring's user-space side (under its mutex).
#[derive(Default)]
struct User {
    /// Per slot: the generation of the arming whose request is pending.
    pending: Vec<Option<u32>>,
    /// Per slot: requests pushed and whose completion was not taken.
    inflight: Vec<u32>,
    parked: Vec<RawEvent>,
    reaped: u64,
}

/// The modelled ring, with the hand-over's state. See the module docs.
pub(super) struct ModelRing {
    pub(super) handover: Handover,
    user: Mutex<User>,
    kernel: Mutex<Kernel>,
    /// Signalled when a completion is posted or the clock expires.
    posted: Condvar,
}

impl ModelRing {
    /// A ring for registrations in slots `0..slots`.
    pub(super) fn new(slots: usize) -> ModelRing {
        ModelRing {
            handover: Handover::new(),
            user: Mutex::new(User {
                pending: vec![None; slots],
                inflight: vec![0; slots],
                ..User::default()
            }),
            kernel: Mutex::new(Kernel::default()),
            posted: Condvar::new(),
        }
    }

    /// `arm`: queues a poll request for `slot`'s arming `generation` (a remove
    /// of the pending one first) under the hand-over's queue lock, and submits
    /// it at once where the lock's release says the ring is held, as the
    /// backend's arm does (`submit.rs`).
    pub(super) fn arm(&self, slot: u32, generation: u32) {
        self.handover.lock_queue();
        {
            let mut u = self.user.lock().unwrap();
            let mut k = self.kernel.lock().unwrap();
            if let Some(old) = u.pending[slot as usize].replace(generation) {
                k.sq.push(Entry::Remove(tag(slot, old)));
            }
            k.sq.push(Entry::Poll(tag(slot, generation)));
            u.inflight[slot as usize] += 1;
        }
        if self.handover.unlock_queue() & LEADER != 0 {
            self.submit().unwrap();
        }
    }

    /// Submits what is queued (a setup step: requests in the kernel before the
    /// scenario starts).
    pub(super) fn submit_now(&self) {
        self.kernel.lock().unwrap().submit();
    }

    /// `deregister`: queues the remove of the pending request and waits until
    /// no request of `slot` is left in the kernel.
    pub(super) fn deregister(&self, slot: u32) {
        let left = {
            let mut u = self.user.lock().unwrap();
            if let Some(old) = u.pending[slot as usize].take() {
                self.kernel
                    .lock()
                    .unwrap()
                    .sq
                    .push(Entry::Remove(tag(slot, old)));
            }
            u.inflight[slot as usize] > 0
        };
        if left {
            self.handover
                .depart(self, slot)
                .expect("the model kernel never refuses");
        }
        assert_eq!(self.inflight(slot), 0, "a request of slot {slot} left");
        assert!(
            !self
                .kernel
                .lock()
                .unwrap()
                .live
                .iter()
                .any(|&l| l as u32 == slot),
            "slot {slot}'s request still in the kernel"
        );
    }

    /// The descriptor of `slot` becomes ready: its request in the kernel, if
    /// any, completes.
    pub(super) fn ready(&self, slot: u32) {
        let mut k = self.kernel.lock().unwrap();
        k.ready.push(slot);
        if let Some(i) = k.live.iter().position(|&l| l as u32 == slot) {
            let ud = k.live.remove(i);
            k.post(ud, libc::POLLIN as i32);
            self.posted.notify_all();
        }
    }

    /// A wait for at most `max` events: `timeout` `None` (no limit), zero, or
    /// any other (it passes when the clock expires). Returns the slots of the
    /// events and whether a wake-up was taken.
    pub(super) fn deliver(&self, max: usize, timeout: Option<Duration>) -> (Vec<u32>, bool) {
        let left = || match timeout {
            Some(t) if !t.is_zero() && self.expired() => Some(Duration::ZERO),
            t => t,
        };
        let mut out: Vec<RawEvent> = Vec::new();
        let mut scratch = Vec::new();
        let woken = self
            .handover
            .wait(self, &mut out, &mut scratch, max, left)
            .expect("the model kernel never fails");
        assert!(out.len() <= max);
        (out.iter().map(|e| e.slot).collect(), woken)
    }

    /// The binary waker.
    pub(super) fn wake(&self) {
        self.handover
            .wake(self)
            .expect("the model waker never fails");
    }

    /// Every deadline passes.
    pub(super) fn expire(&self) {
        self.kernel.lock().unwrap().expired = true;
        self.posted.notify_all();
        self.handover.expire();
    }

    fn expired(&self) -> bool {
        self.kernel.lock().unwrap().expired
    }

    /// Completions posted and not taken, and requests in the kernel.
    pub(super) fn left_over(&self) -> (usize, usize) {
        let k = self.kernel.lock().unwrap();
        (k.cq.len(), k.live.len())
    }

    /// Hands at most `room` completions' events to `sink`, and looks at the
    /// queue as it ends.
    fn take<S: EventSink>(&self, h: &Handover, sink: &mut S, room: usize) -> usize {
        let mut u = self.user.lock().unwrap();
        let mut k = self.kernel.lock().unwrap();
        let mut taken = 0;
        while taken < room {
            let Some((ud, res)) = k.cq.pop_front() else {
                break;
            };
            k.head += 1;
            u.reaped += 1;
            if ud == WAKER {
                h.unkick();
                continue;
            }
            let (slot, generation) = (ud as u32 as usize, (ud >> 32) as u32);
            u.inflight[slot] -= 1;
            if res >= 0 && u.pending[slot] == Some(generation) {
                u.pending[slot] = None;
                taken += 1;
                sink.event(RawEvent {
                    slot: slot as u32,
                    stamp: generation,
                    readiness: Readiness::READABLE,
                });
            }
        }
        taken
    }

    /// A waiting enter, as `io_cqring_wait` waits (see the module docs).
    fn enter_waiting(&self, timed: bool) -> bool {
        let submitted = self.kernel.lock().unwrap().submit();
        self.wait_posted(timed, submitted)
    }

    /// The leader's waiting enter, as the backend's (`enter.rs`): the queue's
    /// length read under the hand-over's queue lock, then an enter that submits
    /// that many; the kernel waits only if it submitted them all (an entry
    /// pushed after the read is its pusher's to submit: the lock's release told
    /// it that the ring is held).
    fn enter_counted(&self, timed: bool) -> bool {
        self.handover.lock_queue();
        let to_submit = self.kernel.lock().unwrap().sq.len();
        self.handover.unlock_queue();
        let submitted = self.kernel.lock().unwrap().submit_at_most(to_submit);
        if submitted < to_submit {
            // Another thread submitted some first: the kernel answers at once.
            return submitted > 0;
        }
        self.wait_posted(timed, submitted > 0)
    }

    /// The wait of an enter that submitted (`submitted`: anything).
    fn wait_posted(&self, timed: bool, submitted: bool) -> bool {
        self.posted.notify_all();
        // The kernel posts a cancellation from task work, after the
        // submission: another thread may run in between.
        let mut k = self.kernel.lock().unwrap();
        if k.tail > k.head {
            return submitted;
        }
        let target = k.head + 1;
        while k.tail < target && !(timed && k.expired) {
            k = self.posted.wait(k).unwrap();
        }
        submitted
    }
}

impl RingOps for ModelRing {
    fn reap<S: EventSink>(&self, h: &Handover, sink: &mut S, room: usize) -> io::Result<usize> {
        Ok(self.take(h, sink, room))
    }

    fn reaped(&self) -> u64 {
        self.user.lock().unwrap().reaped
    }

    fn reap_parking(&self, h: &Handover) -> io::Result<()> {
        let mut parked = Vec::new();
        self.take(h, &mut parked, usize::MAX);
        if !parked.is_empty() {
            let mut u = self.user.lock().unwrap();
            u.parked.extend(parked);
            h.park();
        }
        Ok(())
    }

    fn take_parked<S: EventSink>(&self, h: &Handover, sink: &mut S, room: usize) -> usize {
        let mut u = self.user.lock().unwrap();
        let n = u.parked.len().min(room);
        for ev in u.parked.drain(..n) {
            sink.event(ev);
        }
        if u.parked.is_empty() {
            h.unpark();
        }
        n
    }

    fn queued(&self) -> bool {
        !self.kernel.lock().unwrap().sq.is_empty()
    }

    fn enter(&self, timeout: Option<Duration>) -> io::Result<bool> {
        assert_ne!(timeout, Some(Duration::ZERO), "a zero timeout never waits");
        Ok(self.enter_counted(timeout.is_some()))
    }

    fn enter_depart(&self) -> io::Result<()> {
        self.enter_waiting(false);
        Ok(())
    }

    fn enter_nowait(&self) -> io::Result<()> {
        self.submit()
    }

    fn submit(&self) -> io::Result<()> {
        if self.kernel.lock().unwrap().submit() {
            self.posted.notify_all();
        }
        Ok(())
    }

    fn kick(&self) -> io::Result<()> {
        self.kernel.lock().unwrap().post(WAKER, 1);
        self.posted.notify_all();
        Ok(())
    }

    fn inflight(&self, slot: u32) -> u32 {
        self.user.lock().unwrap().inflight[slot as usize]
    }
}
