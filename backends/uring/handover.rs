//! The hand-over: several threads on one ring, and who may do what.
//!
//! A thread waiting in `io_uring_enter` for a completion is woken by the kernel
//! when the completion queue's tail passes the head it read on its way in
//! (`io_cqring_wait` and `io_should_wake` in io_uring/io_uring.c: it waits for
//! `min_complete` entries past that head). A completion that another thread took
//! from the queue before the waiter looked moves the head with it: the waiter
//! then waits for the *next* completion, which may never come. That is how a
//! `deregister` was left blocked for good beside threads polling with a zero
//! timeout: it waited in the kernel for its request's end, and a poll took that
//! completion first. So the rule is about the queue's head, not the kernel:
//!
//! **One thread at a time holds the ring (the leader, [`LEADER`]), and only it
//! takes completions from the queue or waits in the kernel.** It takes the ring
//! with one compare-and-swap on the [`Handover`] word and gives it back with one
//! read-modify-write, never across a return to its caller. While it holds the
//! ring nobody else moves the head, so an `io_uring_enter` it waits in returns
//! for every completion posted meanwhile (or already in the queue): whatever
//! another thread waits for ends as a completion, and that completion wakes the
//! leader.
//!
//! Every other thread that needs the kernel waits for the leader, and learns from
//! it:
//!
//! - a *follower* (a blocking wait that found the ring held) counts itself in the
//!   word and sleeps on the `handoff` futex word; the leader, giving the ring
//!   back, bumps the word and wakes one follower, which takes the ring (or what
//!   the leader left: parked events, a wake-up). A follower that was woken and
//!   returns without taking the ring passes the hand-over on, so a hand-over is
//!   never spent on a thread that leaves;
//! - a *departing* `deregister` (its registration's requests must end before it
//!   returns) takes the ring if it is free and waits in the kernel itself, its
//!   remove submitted by that enter; if it is held, it submits its remove
//!   (`io_uring_enter` without waiting: a leader in the kernel would not see it
//!   until it returns), counts itself in the word and sleeps on the `departed`
//!   futex word. The leader wakes for the cancelled request's completion, takes
//!   it, and bumps `departed` whenever it gives the ring back, and before it
//!   enters the kernel again holding it (its reap may have taken that
//!   completion). A deregister looks at its slot's count again after counting
//!   itself, before it sleeps: a leader that took the last completion in
//!   between did not see it counted;
//! - a *zero-timeout* wait never sleeps: with the ring held it takes only a
//!   wake-up and parked events, never the queue, and returns;
//! - a *wake-up* (the binary waker under `notify`) sets [`WOKEN`] in the word;
//!   with a follower asleep it wakes one (which takes it); else, with the ring
//!   held, it writes the eventfd once ([`KICKED`]): that completion ends the
//!   leader's enter, since nobody else takes it. A wait takes the flag whoever
//!   set it. The leader checks it as it takes the ring (a wake-up made just
//!   before found the ring free and woke nobody), and again before it enters:
//!   its reap may have taken the eventfd's completion ([`Handover::unkick`]),
//!   and a wake-up that found that write on its way wrote nothing more;
//! - events that a departing leader took for other registrations are *parked*
//!   ([`PARKED`]) for the next wait, which a follower woken by the hand-over is;
//! - a *push* to the submission queue (an arm, a remove, a request queued
//!   again) holds the queue's lock, a bit of the same word ([`QUEUE`],
//!   [`Handover::lock_queue`]), and so does the leader as it reads the queue's
//!   length for its enter. Released with one read-modify-write, the lock
//!   answers with the word: a pusher that finds [`LEADER`] there submits what
//!   it pushed itself (the leader may be in the kernel, and would not see it
//!   until it returns); one that does not released the lock before the next
//!   leader took it, which then counts the push in its enter.
//!
//! What this costs where nothing contends: taking and giving back the ring, two
//! read-modify-writes of one word per wait; taking and releasing the queue's
//! lock, two more per push (an arm) and per entering wait. A follower and a
//! departing deregister each cost a futex wake when the ring is given back.
//!
//! The protocol is the code below, generic over what it asks of a ring
//! ([`RingOps`]): the io_uring backend runs it on its ring, and the loom models
//! (`src/loom_tests/handover.rs`) run it on a modelled completion queue whose
//! waits behave as `io_cqring_wait` does, under every interleaving.

use crate::backend::{EventSink, RawEvent};
use std::io;
use std::time::Duration;

#[cfg(all(loom, test))]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(all(loom, test)))]
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// A thread holds the ring: it alone takes completions and waits in the kernel.
pub(crate) const LEADER: u64 = 1;
/// A wake-up that no wait has taken yet (the binary waker: later ones merge).
pub(crate) const WOKEN: u64 = 1 << 1;
/// An eventfd write is on its way to the leader (cleared when the ring is given
/// back).
pub(crate) const KICKED: u64 = 1 << 2;
/// Events a departing leader took for others wait to be delivered.
pub(crate) const PARKED: u64 = 1 << 3;
/// The submission queue's lock, which also guards the ring's rare state
/// ([`lock_queue`](Handover::lock_queue)).
pub(crate) const QUEUE: u64 = 1 << 4;
/// Threads sleep on `queue_free` for [`QUEUE`].
const QUEUE_WAITERS: u64 = 1 << 5;
/// Looks at a held [`QUEUE`] before sleeping for it.
const QUEUE_SPINS: usize = if cfg!(all(loom, test)) { 0 } else { 100 };
/// One follower (bits 8 to 31).
const FOLLOWER: u64 = 1 << 8;
const FOLLOWERS: u64 = ((1 << 24) - 1) * FOLLOWER;
/// One departing deregister (bits 32 to 63).
const DEPARTING: u64 = 1 << 32;
const DEPARTINGS: u64 = !((1 << 32) - 1);

/// What the hand-over asks of a ring. The leader alone calls the methods that
/// take completions ([`reap`](Self::reap), [`reap_parking`](Self::reap_parking))
/// or wait ([`enter`](Self::enter), [`enter_depart`](Self::enter_depart)).
pub(crate) trait RingOps {
    /// Takes completions from the queue, handing at most `room` events to
    /// `sink`, and routes the ring's own (the waker's, the removes', cancelled
    /// requests queued again). The waker's completion calls
    /// [`Handover::unkick`]. Called by the leader only.
    /// Returns how many events went to `sink`; with none, the queue is empty.
    fn reap<S: EventSink>(&self, h: &Handover, sink: &mut S, room: usize) -> io::Result<usize>;

    /// A count that moves whenever completions of any kind (the waker's,
    /// stale ones) are taken from the queue (the backend counts the reaps that
    /// found any, the model the completions): the same before and after an
    /// enter whose reap found nothing means nothing was posted across the
    /// enter. Called by the leader.
    fn reaped(&self) -> u64;

    /// Takes every completion in the queue; events for registrations are parked
    /// for the next wait (and [`Handover::park`] called). Called by a departing
    /// leader only.
    fn reap_parking(&self, h: &Handover) -> io::Result<()>;

    /// Hands at most `room` parked events to `sink` and returns how many, and
    /// calls [`Handover::unpark`] when none are left. Any thread.
    fn take_parked<S: EventSink>(&self, h: &Handover, sink: &mut S, room: usize) -> usize;

    /// Whether entries wait in the submission queue.
    fn queued(&self) -> bool;

    /// One `io_uring_enter` that submits what is queued and waits for a
    /// completion for at most `timeout` (`None`: no limit); timing out is `Ok`.
    /// Returns whether it submitted anything (then a signal that ends its wait is
    /// answered with the count, not EINTR). Called by the leader only.
    fn enter(&self, timeout: Option<Duration>) -> io::Result<bool>;

    /// A departing leader's enter: submits and waits for a completion, no limit.
    /// The kernel's error as it is (EINTR, EBUSY, EAGAIN, ENOMEM).
    fn enter_depart(&self) -> io::Result<()>;

    /// An enter that submits what is queued and runs what is due, without
    /// waiting (a zero-timeout wait that holds no ring: it takes nothing).
    fn enter_nowait(&self) -> io::Result<()>;

    /// Submits what is queued without waiting or taking anything (for a leader
    /// that would not see it until it returns).
    fn submit(&self) -> io::Result<()>;

    /// Writes the eventfd once: its completion ends the leader's enter.
    fn kick(&self) -> io::Result<()>;

    /// The slot's poll requests whose completions have not been taken yet.
    fn inflight(&self, slot: u32) -> u32;
}

/// A futex word: the production one (futex(2)), or a model of it under loom.
#[cfg(not(all(loom, test)))]
#[derive(Debug, Default)]
pub(crate) struct Futex(AtomicU32);

#[cfg(not(all(loom, test)))]
impl Futex {
    /// The word now, for a [`wait`](Self::wait) that must see it move.
    #[inline(always)]
    fn load(&self) -> u32 {
        self.0.load(Ordering::Acquire)
    }

    /// Moves the word on and wakes `n` waiters (`u32::MAX`: all).
    fn bump_wake(&self, n: u32) {
        self.0.fetch_add(1, Ordering::Release);
        let n = n.min(i32::MAX as u32);
        let _ = rustix::thread::futex::wake(&self.0, rustix::thread::futex::Flags::PRIVATE, n);
    }

    /// Sleeps until the word moves on from `seen`, for at most `timeout`
    /// (`None`: no limit; the longest single sleep is an hour, the caller looks
    /// again). A signal is `Err(Interrupted)`; a wake-up, a timeout, a word
    /// already moved (EAGAIN) and a spurious return are `Ok`.
    fn wait(&self, seen: u32, timeout: Option<Duration>) -> io::Result<()> {
        let ts = timeout.map(|t| {
            let t = t.min(Duration::from_secs(3600));
            rustix::thread::futex::Timespec {
                tv_sec: t.as_secs() as _,
                tv_nsec: t.subsec_nanos() as _,
            }
        });
        match rustix::thread::futex::wait(
            &self.0,
            rustix::thread::futex::Flags::PRIVATE,
            seen,
            ts.as_ref(),
        ) {
            Err(rustix::io::Errno::INTR) => Err(io::Error::from_raw_os_error(libc::EINTR)),
            _ => Ok(()),
        }
    }
}

/// The model of a futex word: a counter under a loom mutex, a condition
/// variable for the sleepers, and the model's clock (a timed sleep ends once it
/// has expired, [`Handover::expire`]).
#[cfg(all(loom, test))]
#[derive(Debug, Default)]
pub(crate) struct Futex {
    word: loom::sync::Mutex<(u32, bool)>,
    moved: loom::sync::Condvar,
}

#[cfg(all(loom, test))]
impl Futex {
    fn load(&self) -> u32 {
        self.word.lock().unwrap().0
    }

    fn bump_wake(&self, n: u32) {
        let mut w = self.word.lock().unwrap();
        w.0 = w.0.wrapping_add(1);
        if n == 1 {
            self.moved.notify_one();
        } else {
            self.moved.notify_all();
        }
    }

    fn wait(&self, seen: u32, timeout: Option<Duration>) -> io::Result<()> {
        let mut w = self.word.lock().unwrap();
        while w.0 == seen && !(timeout.is_some() && w.1) {
            w = self.moved.wait(w).unwrap();
        }
        Ok(())
    }

    fn expire(&self) {
        self.word.lock().unwrap().1 = true;
        self.moved.notify_all();
    }
}

/// The hand-over's state: one word ([`LEADER`], [`WOKEN`], [`KICKED`],
/// [`PARKED`], the followers and the departing deregisters counted), and the two
/// futex words the waiters sleep on. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Handover {
    word: AtomicU64,
    /// Followers sleep here; bumped by a hand-over.
    handoff: Futex,
    /// Departing deregisters sleep here; bumped, with one counted, when the
    /// ring is given back and when its leader enters the kernel again.
    departed: Futex,
    /// Threads waiting for [`QUEUE`] sleep here; bumped when it is released
    /// with [`QUEUE_WAITERS`] set.
    queue_free: Futex,
}

/// What a leader's turn came to ([`Handover::lead`]).
enum Turn {
    /// Events in hand, or a wake-up or a poll's end: the wait returns.
    Done,
    /// Look again (the ring was given back).
    Again,
}

impl Handover {
    #[cfg(not(all(loom, test)))]
    pub(crate) const fn new() -> Handover {
        Handover {
            word: AtomicU64::new(0),
            handoff: Futex(AtomicU32::new(0)),
            departed: Futex(AtomicU32::new(0)),
            queue_free: Futex(AtomicU32::new(0)),
        }
    }

    #[cfg(all(loom, test))]
    pub(crate) fn new() -> Handover {
        Handover::default()
    }

    /// The word now.
    #[inline(always)]
    pub(crate) fn word(&self) -> u64 {
        self.word.load(Ordering::Acquire)
    }

    /// Takes the ring, free as a test expects it.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn take_for_test(&self) {
        self.take().expect("the ring is free");
    }

    /// Takes the ring if it is free. Returns the word as the take found it (its
    /// [`WOKEN`] and [`PARKED`] are news for the new leader), or `None` if the
    /// ring is held.
    #[inline(always)]
    fn take(&self) -> Option<u64> {
        self.change(|w| (w & LEADER == 0).then_some(w | LEADER))
            .ok()
    }

    /// One change of the word, made only while `f` says how (a compare-and-swap
    /// loop). Returns the word before it, or as `f` refused it.
    #[inline(always)]
    fn change(&self, f: impl FnMut(u64) -> Option<u64>) -> Result<u64, u64> {
        self.word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, f)
    }

    /// Gives the ring back: wakes one follower to take it, and every departing
    /// deregister to look again. A kick on its way is forgotten (its completion
    /// may end a later leader's enter early: harmless).
    #[inline(always)]
    fn give_back(&self) {
        // The common case, nothing else in the word: one compare-and-swap
        // whose answer needs no test.
        if self
            .word
            .compare_exchange(LEADER, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            self.give_back_other();
        }
    }

    /// [`give_back`](Self::give_back) with more than [`LEADER`] in the word.
    #[cold]
    #[inline(never)]
    fn give_back_other(&self) {
        let before = self.word.fetch_and(!(LEADER | KICKED), Ordering::AcqRel);
        if before & (FOLLOWERS | DEPARTINGS) != 0 {
            self.handed(before);
        }
    }

    #[cold]
    #[inline(never)]
    fn handed(&self, before: u64) {
        if before & FOLLOWERS != 0 {
            self.handoff.bump_wake(1);
        }
        if before & DEPARTINGS != 0 {
            self.departed.bump_wake(u32::MAX);
        }
    }

    /// Takes a pending wake-up, if one is set in `w` and no other wait took it
    /// first.
    #[inline(always)]
    fn take_woken(&self, w: u64) -> bool {
        w & WOKEN != 0 && self.word.fetch_and(!WOKEN, Ordering::AcqRel) & WOKEN != 0
    }

    /// The leader took the waker's completion: the kick on its way (if any) has
    /// come. A wake-up that found it on its way wrote nothing and left its flag
    /// to the leader, which checks the flag before it enters again.
    #[inline(always)]
    pub(crate) fn unkick(&self) {
        self.word.fetch_and(!KICKED, Ordering::AcqRel);
    }

    /// Events were parked (under the ring's own lock, with the events).
    pub(crate) fn park(&self) {
        self.word.fetch_or(PARKED, Ordering::AcqRel);
    }

    /// The parked events are all taken (under the ring's own lock).
    pub(crate) fn unpark(&self) {
        self.word.fetch_and(!PARKED, Ordering::AcqRel);
    }

    /// Takes the submission queue's lock ([`QUEUE`]): one atomic OR where it
    /// is free; else a short spin, then a futex sleep.
    #[inline(always)]
    pub(crate) fn lock_queue(&self) {
        if self.word.fetch_or(QUEUE, Ordering::Acquire) & QUEUE != 0 {
            self.lock_queue_contended();
        }
    }

    #[cold]
    #[inline(never)]
    fn lock_queue_contended(&self) {
        loop {
            // A short spin first: no system call made under this lock waits,
            // so it is usually released soon. (None in the loom models: a spin
            // only multiplies their interleavings.)
            for _ in 0..QUEUE_SPINS {
                if self.word.load(Ordering::Relaxed) & QUEUE == 0
                    && self.word.fetch_or(QUEUE, Ordering::Acquire) & QUEUE == 0
                {
                    return;
                }
                std::hint::spin_loop();
            }
            // Read before saying so: a release after that moves it on.
            let seen = self.queue_free.load();
            if self
                .change(|w| (w & QUEUE != 0).then_some(w | QUEUE_WAITERS))
                .is_ok()
            {
                // EINTR and a spurious return: look again.
                let _ = self.queue_free.wait(seen, None);
            }
            if self.word.fetch_or(QUEUE, Ordering::Acquire) & QUEUE == 0 {
                return;
            }
        }
    }

    /// Releases the submission queue's lock, waking every thread asleep for
    /// it. Returns the word before: its [`LEADER`] says whether a thread holds
    /// the ring (and may be in the kernel, not seeing what was pushed).
    #[inline(always)]
    pub(crate) fn unlock_queue(&self) -> u64 {
        let before = self.word.fetch_sub(QUEUE, Ordering::AcqRel);
        if before & QUEUE_WAITERS != 0 {
            self.wake_queue_waiters();
        }
        before
    }

    #[cold]
    #[inline(never)]
    fn wake_queue_waiters(&self) {
        // Cleared before the bump: a thread that says it sleeps after this
        // read the futex word before the bump, so its sleep ends at once.
        self.word.fetch_and(!QUEUE_WAITERS, Ordering::AcqRel);
        self.queue_free.bump_wake(u32::MAX);
    }

    /// The wait: see the module docs. `left` says the time left of the call's
    /// timeout at each turn (`None`: no limit). Hands at most `room` events to
    /// `sink` (at least 1); returns whether it took a wake-up.
    ///
    /// The common paths are inline and hand events to `sink` as they are
    /// taken; the others, out of line, put them in `scratch` (cleared first),
    /// handed to `sink` when they return. A sink handed to a call out of line
    /// would have to live in memory on every path.
    #[inline(always)]
    pub(crate) fn wait<R: RingOps, S: EventSink>(
        &self,
        ring: &R,
        sink: &mut S,
        scratch: &mut Vec<RawEvent>,
        room: usize,
        left: impl Fn() -> Option<Duration>,
    ) -> io::Result<bool> {
        // The common case: the ring free, nothing flagged, nobody waiting: take
        // it and what the queue holds.
        if self
            .word
            .compare_exchange(0, LEADER, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return match ring.reap(self, sink, room) {
                Ok(0) => self.wait_led(ring, sink, scratch, room, left),
                r => {
                    self.give_back();
                    r.map(|_| false)
                }
            };
        }
        scratch.clear();
        let r = self.wait_on(ring, scratch, room, left, 0);
        handed(sink, scratch, r)
    }

    /// [`wait`](Self::wait) with no limit, holding the ring, after a reap
    /// that found nothing: the common end, one enter that returns with
    /// events, inline; anything else goes on in [`lead_on`](Self::lead_on).
    #[inline(always)]
    pub(crate) fn wait_led<R: RingOps, S: EventSink>(
        &self,
        ring: &R,
        sink: &mut S,
        scratch: &mut Vec<RawEvent>,
        room: usize,
        left: impl Fn() -> Option<Duration>,
    ) -> io::Result<bool> {
        let remaining = left();
        if remaining.is_none() && self.word() == LEADER {
            let reaped = ring.reaped();
            // A refused enter goes out of line at once: the common path keeps
            // no `io::Result` of it to test and drop after the reap.
            let submitted = match ring.enter(None) {
                Ok(submitted) => submitted,
                Err(e) => {
                    scratch.clear();
                    let r = self.wait_refused(ring, scratch, room, left, reaped, e);
                    return handed(sink, scratch, r);
                }
            };
            match ring.reap(self, sink, room) {
                Ok(taken) if taken > 0 => {
                    self.give_back();
                    return Ok(false);
                }
                after => {
                    scratch.clear();
                    let entered = Ok(submitted);
                    let r = self.wait_entered(ring, scratch, room, left, reaped, entered, after);
                    return handed(sink, scratch, r);
                }
            }
        }
        scratch.clear();
        let r = self.wait_leading(ring, scratch, room, left, remaining);
        handed(sink, scratch, r)
    }

    /// [`wait_led`](Self::wait_led) after an enter that the kernel refused:
    /// the reap that follows every enter, then [`wait_entered`](Self::wait_entered).
    #[cold]
    #[inline(never)]
    fn wait_refused<R: RingOps, S: EventSink>(
        &self,
        ring: &R,
        sink: &mut S,
        room: usize,
        left: impl Fn() -> Option<Duration>,
        reaped: u64,
        refused: io::Error,
    ) -> io::Result<bool> {
        let after = ring.reap(self, sink, room);
        self.wait_entered(ring, sink, room, left, reaped, Err(refused), after)
    }

    /// [`wait_led`](Self::wait_led) after an enter that did not end with
    /// events: its end ([`entered`](Self::entered)), then the loop.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn wait_entered<R: RingOps, S: EventSink>(
        &self,
        ring: &R,
        sink: &mut S,
        room: usize,
        left: impl Fn() -> Option<Duration>,
        reaped: u64,
        entered: io::Result<bool>,
        after: io::Result<usize>,
    ) -> io::Result<bool> {
        match self.entered(ring, &left, reaped, entered, after)? {
            Turn::Done => Ok(false),
            Turn::Again => self.wait_on(ring, sink, room, left, 1),
        }
    }

    /// [`wait_led`](Self::wait_led) holding the ring with a limit, a wake-up
    /// flagged or another thread counted: one turn of the leader, then the
    /// loop.
    #[cold]
    #[inline(never)]
    fn wait_leading<R: RingOps, S: EventSink>(
        &self,
        ring: &R,
        sink: &mut S,
        room: usize,
        left: impl Fn() -> Option<Duration>,
        remaining: Option<Duration>,
    ) -> io::Result<bool> {
        let mut polls = 0;
        match self.lead_on(ring, sink, room, remaining, &left, &mut polls)? {
            Turn::Done => Ok(false),
            Turn::Again => self.wait_on(ring, sink, room, left, polls),
        }
    }

    /// The loop of [`wait`](Self::wait): lead when the ring is free, else take a
    /// wake-up or parked events, else follow. `polls`: enters made so far.
    #[inline(never)]
    fn wait_on<R: RingOps, S: EventSink>(
        &self,
        ring: &R,
        sink: &mut S,
        room: usize,
        left: impl Fn() -> Option<Duration>,
        mut polls: u8,
    ) -> io::Result<bool> {
        // Slept as a follower, and has not led since (a leader that gives the
        // ring back hands it over itself).
        let mut followed = false;
        loop {
            let remaining = left();
            match self.take() {
                Some(w) => {
                    followed = false;
                    // This thread leads: first what the take found (a wake-up
                    // made while the ring was free woke nobody), then the queue.
                    let consumed = self.take_woken(w);
                    let parked = if w & PARKED != 0 {
                        ring.take_parked(self, sink, room)
                    } else {
                        0
                    };
                    if consumed || parked > 0 {
                        self.give_back();
                        return Ok(consumed);
                    }
                    match ring.reap(self, sink, room) {
                        Ok(0) => {}
                        r => {
                            self.give_back();
                            return r.map(|_| false);
                        }
                    }
                    match self.lead_on(ring, sink, room, remaining, &left, &mut polls)? {
                        Turn::Done => return Ok(false),
                        Turn::Again => {}
                    }
                }
                None => {
                    let w = self.word();
                    if w & LEADER == 0 {
                        continue; // given back meanwhile: take it
                    }
                    let consumed = self.take_woken(w);
                    let parked = if w & PARKED != 0 {
                        ring.take_parked(self, sink, room)
                    } else {
                        0
                    };
                    if consumed || parked > 0 || remaining == Some(Duration::ZERO) {
                        return Ok(self.leave(ring, followed, consumed));
                    }
                    if let Err(e) = self.follow(remaining) {
                        self.leave(ring, true, false);
                        return Err(e);
                    }
                    followed = true;
                }
            }
        }
    }

    /// One turn of the leader, after a reap that found nothing: wait in the
    /// kernel for the time `remaining` (a zero timeout: a few enters that
    /// submit and wait for nothing), and take what it returned for. Gives the
    /// ring back before returning.
    #[allow(clippy::too_many_arguments)]
    fn lead_on<R: RingOps, S: EventSink>(
        &self,
        ring: &R,
        sink: &mut S,
        room: usize,
        remaining: Option<Duration>,
        left: &impl Fn() -> Option<Duration>,
        polls: &mut u8,
    ) -> io::Result<Turn> {
        if self.word() & WOKEN != 0 {
            // A wake-up came since the take; its kick, if one was written, may
            // be what the reap just took: take the flag rather than sleep.
            self.give_back();
            return Ok(Turn::Again);
        }
        self.before_enter();
        if remaining == Some(Duration::ZERO) {
            // A poll: submit what is queued and collect what is due, again only
            // for what the reap queued (a cancelled request), a few times in
            // all (`polls`: this call's enters). The enter waits for nothing,
            // so the ring is given back across it.
            let again = *polls == 0 || (*polls < 3 && ring.queued());
            self.give_back();
            if !again {
                return Ok(Turn::Done);
            }
            *polls += 1;
            ring.enter_nowait()?;
            return Ok(Turn::Again);
        }
        // A poll after this enter (the deadline passed) needs no enter of its
        // own unless a reap queued something.
        *polls = polls.saturating_add(1);
        let reaped = ring.reaped();
        let entered = ring.enter(remaining);
        let after = ring.reap(self, sink, room);
        self.entered(ring, left, reaped, entered, after)
    }

    /// Before the leader enters the kernel (holding the ring): departing
    /// deregisters look again, since the reap just made may have taken their
    /// slot's last completion, and the ring is not given back until the enter
    /// returns.
    #[inline(always)]
    fn before_enter(&self) {
        if self.word() & DEPARTINGS != 0 {
            self.departed.bump_wake(u32::MAX);
        }
    }

    /// The end of a leader's enter: `entered` its answer, `after` the reap that
    /// followed, `reaped` the completions taken before it. Gives the ring back.
    fn entered<R: RingOps>(
        &self,
        ring: &R,
        left: &impl Fn() -> Option<Duration>,
        reaped: u64,
        entered: io::Result<bool>,
        after: io::Result<usize>,
    ) -> io::Result<Turn> {
        // The signal test before the ring is given back: afterwards another
        // leader's completions would count. The reap before the enter found
        // the queue empty, and one that finds nothing to deliver empties it.
        let signal = matches!((&entered, &after), (Ok(true), Ok(0)))
            && ring.reaped() == reaped
            && self.word() & WOKEN == 0;
        self.give_back();
        entered?;
        if after? > 0 {
            return Ok(Turn::Done);
        }
        if signal && left() != Some(Duration::ZERO) {
            // The enter submitted, so the kernel answered a signal with the
            // count: nothing was posted across it, no wake-up came and time is
            // left.
            return Err(io::Error::from_raw_os_error(libc::EINTR));
        }
        Ok(Turn::Again)
    }

    /// Sleeps as a follower until a hand-over, a wake-up or the timeout, if the
    /// ring is still held (else returns at once: the caller takes it).
    fn follow(&self, timeout: Option<Duration>) -> io::Result<()> {
        // Read before counting in: a hand-over after the count moves the word
        // on from this value, so the sleep below cannot miss it.
        let seen = self.handoff.load();
        let counted =
            self.change(|w| (w & LEADER != 0 && w & (WOKEN | PARKED) == 0).then_some(w + FOLLOWER));
        if counted.is_err() {
            return Ok(()); // news: look again
        }
        let r = self.handoff.wait(seen, timeout);
        self.word.fetch_sub(FOLLOWER, Ordering::AcqRel);
        r
    }

    /// A wait returns. One that slept as a follower (`followed`) may have been
    /// handed the ring or a wake-up meant for a thread that stays: with the ring
    /// free and followers asleep it hands over to one; with a wake-up nobody took,
    /// it sends that on ([`route`](Self::route)). Returns `consumed`.
    #[inline(always)]
    fn leave<R: RingOps>(&self, ring: &R, followed: bool, consumed: bool) -> bool {
        if followed {
            self.pass_on(ring);
        }
        consumed
    }

    #[cold]
    #[inline(never)]
    fn pass_on<R: RingOps>(&self, ring: &R) {
        let w = self.word();
        if w & LEADER == 0 && w & FOLLOWERS != 0 {
            self.handoff.bump_wake(1);
        } else if w & WOKEN != 0 {
            if let Route::Kick = self.route(w) {
                if ring.kick().is_err() {
                    // Best effort: no write on its way after all.
                    self.word.fetch_and(!KICKED, Ordering::AcqRel);
                }
            }
        }
    }

    /// The binary waker: the next wait to look, or one sleeping now, returns
    /// woken. Sets [`WOKEN`] (merging with one not taken yet) and wakes the
    /// thread that will see it: a follower, or the leader through the eventfd.
    pub(crate) fn wake<R: RingOps>(&self, ring: &R) -> io::Result<()> {
        let w = self.word.fetch_or(WOKEN, Ordering::AcqRel);
        if w & WOKEN != 0 {
            return Ok(()); // merges with the one no wait has taken yet
        }
        match self.route(w | WOKEN) {
            Route::Nobody => Ok(()),
            Route::Kick => ring.kick().map_err(|e| {
                self.word.fetch_and(!(KICKED | WOKEN), Ordering::AcqRel);
                e
            }),
        }
    }

    /// Makes a leader in the kernel return (one eventfd write, unless one is on
    /// its way) to submit what was queued: a thread that exits queued its
    /// requests again, which only an enter from a live thread submits
    /// (`exit.rs`); a departing deregister's own submit of its removes was
    /// refused ([`depart`](Self::depart)). Not a wake-up: the leader finds
    /// nothing and enters again, submitting them.
    pub(crate) fn nudge<R: RingOps>(&self, ring: &R) {
        let kick = self.change(|w| (w & LEADER != 0 && w & KICKED == 0).then_some(w | KICKED));
        if kick.is_ok() && ring.kick().is_err() {
            self.word.fetch_and(!KICKED, Ordering::AcqRel);
        }
    }

    /// Sends a pending wake-up (`w` is the word with [`WOKEN`] set) to a thread
    /// that will see it: a sleeping follower (woken here), else the leader, by
    /// the eventfd unless a write is on its way ([`KICKED`], set here: the
    /// caller writes). With the ring free, the next wait takes it.
    fn route(&self, w: u64) -> Route {
        if w & FOLLOWERS != 0 {
            self.handoff.bump_wake(1);
            return Route::Nobody;
        }
        // The leader, unless a write is on its way, the flag was taken
        // meanwhile, or the ring was given back.
        match self.change(|w| {
            (w & (WOKEN | LEADER) == WOKEN | LEADER && w & KICKED == 0).then_some(w | KICKED)
        }) {
            Ok(_) => Route::Kick,
            Err(now) if now & WOKEN != 0 && now & FOLLOWERS != 0 => {
                // A follower came meanwhile: it takes the flag.
                self.handoff.bump_wake(1);
                Route::Nobody
            }
            Err(_) => Route::Nobody,
        }
    }

    /// Waits until no poll request of `slot` is left in the kernel (`depart.rs`):
    /// the caller has queued the removes. As the leader (the ring is free), one
    /// enter that submits them and waits for a completion, and every completion
    /// taken (others' events parked); else submits them for the leader and
    /// sleeps until the leader gives the ring back or enters the kernel again
    /// (after taking completions that may be the slot's last).
    ///
    /// # Errors
    /// The kernel's refusal of an enter (EAGAIN, ENOMEM: the removes stay queued,
    /// so a later enter submits them). EINTR and EBUSY look again.
    pub(crate) fn depart<R: RingOps>(&self, ring: &R, slot: u32) -> io::Result<()> {
        loop {
            if ring.inflight(slot) == 0 {
                return Ok(());
            }
            if self.take().is_some() {
                let r = ring.reap_parking(self);
                if r.is_err() || ring.inflight(slot) == 0 {
                    self.give_back();
                    return r;
                }
                self.before_enter();
                let entered = ring.enter_depart();
                let r = ring.reap_parking(self);
                self.give_back();
                match entered {
                    Ok(()) => {}
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                    Err(e) => return Err(e),
                }
                r?;
                continue;
            }
            let seen = self.departed.load();
            if self
                .change(|w| (w & LEADER != 0).then_some(w + DEPARTING))
                .is_err()
            {
                continue; // given back meanwhile: take it
            }
            if ring.inflight(slot) == 0 {
                // Taken between the look above and the count: the leader that
                // took it did not see this thread counted.
                self.word.fetch_sub(DEPARTING, Ordering::AcqRel);
                return Ok(());
            }
            // The leader would not see the removes until it returns.
            let submitted = if ring.queued() { ring.submit() } else { Ok(()) };
            let refused = match submitted {
                Err(e) if !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => Some(e),
                Err(_) => {
                    // Not submitted (a signal; completions in the overflow
                    // list): the leader, blocked for as long as it likes, is
                    // the one whose next enter submits the removes, so it must
                    // return and enter again.
                    self.nudge(ring);
                    None
                }
                Ok(()) => None,
            };
            if refused.is_none() {
                // A wake-up, EAGAIN (moved on already), EINTR: look again.
                let _ = self.departed.wait(seen, None);
            }
            self.word.fetch_sub(DEPARTING, Ordering::AcqRel);
            if let Some(e) = refused {
                return Err(e);
            }
        }
    }

    /// The model's clock expired: timed sleeps end.
    #[cfg(all(loom, test))]
    pub(crate) fn expire(&self) {
        self.handoff.expire();
        self.departed.expire();
    }
}

/// Hands what a slow path of [`Handover::wait`] put in `scratch` to `sink`,
/// and returns its answer.
#[inline(always)]
fn handed<S: EventSink>(
    sink: &mut S,
    scratch: &mut Vec<RawEvent>,
    r: io::Result<bool>,
) -> io::Result<bool> {
    for ev in scratch.drain(..) {
        sink.event(ev);
    }
    r
}

/// Who a wake-up goes to ([`Handover::route`]).
enum Route {
    /// A follower was woken, or no thread needs waking.
    Nobody,
    /// The leader: the caller writes the eventfd.
    Kick,
}
