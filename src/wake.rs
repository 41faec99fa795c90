//! The notify protocol: counted wake-ups on top of a backend's binary waker.
//!
//! What [`Poller::notify`](crate::Poller::notify) promises:
//!
//! - one `notify` ends exactly one `deliver` call: one that is blocked now, or the
//!   next one (which then returns at once);
//! - a `deliver` with a zero timeout is not counted as a waiter, and takes a
//!   notify only while no waiter is counted: the waker is shared, so such a poll
//!   can take the kernel's wake-up meant for a blocked waiter, and then it leaves
//!   the notify pending and wakes the kernel again (`Notifies::woken`);
//! - `k` notifies with `k` or more blocked waiters end `k` distinct delivers;
//! - notifies coalesce only beyond the number of blocked waiters: while as many
//!   wake-ups are pending as there are threads blocked in `deliver` (at least one),
//!   a further notify changes nothing and costs no system call.
//!
//! The kernel side of every backend is a *binary* waker (an edge-triggered eventfd,
//! an `EVFILT_USER` knote, a pipe): a wake-up reaches at least one wait, and several
//! wake-ups before a wait sees them may merge into one. The counting lives here, in
//! one word ([`Notifies`]): `pending` (notifies not yet consumed), `waiters`
//! (threads inside a `deliver` that may block, counted once from entry to return)
//! and whether synthetic events are queued. A wait that the kernel woke takes one
//! pending notify and, if more are pending, wakes the kernel again before it
//! returns, so the next waiter gets the next one: the baton passes until every
//! pending notify has ended one wait. A kernel wake-up that finds nothing pending
//! (two wake-ups merged, then the baton was passed) is spurious: that wait goes on
//! waiting.
//!
//! A shutdown ([`Poller::shutdown`](crate::Poller::shutdown)) is a sticky bit in
//! the same word, and ends every `deliver`, not one: a thread counts itself as a
//! waiter and reads the bit in one read-modify-write, so a shutdown either comes
//! before it (the `deliver` returns without waiting) or sees it counted (and wakes
//! the kernel). A wait that the kernel woke reads the bit, and each `deliver` that
//! returns with the bit set wakes the kernel again while another waiter is
//! counted: the baton passes until every waiter has left. Counting notifies cannot
//! do this: `k` notifies made while fewer than `k` workers are counted coalesce, and
//! a worker that checked its stop flag before they were made then blocks with none
//! pending for it.
//!
//! Synthetic events (always-ready registrations) need a wake-up of their own: an
//! arm that queues one wakes the kernel if a waiter is counted, and a `deliver` that
//! returns while some are still queued and another waiter is counted wakes the
//! kernel on its way out (the arm's wake-up may have merged with a notify, or the
//! caller ran out of room).
//!
//! One word, because every decision needs a consistent view: "coalesce or wake"
//! compares `pending` with `waiters`, and "does a waiter see the synthetic event"
//! is a waiter's count against an arm's flag. As read-modify-writes of one
//! location these are ordered by the word's modification order alone, which the
//! loom model (`src/loom_tests/`) checks under every interleaving; two separate
//! atomics let a notify coalesce on a `pending` value that had already been
//! consumed (found by that model: k notifies then ended k - 1 waiters). Each
//! blocking `deliver` pays two read-modify-writes (enter, leave), small next to
//! its system call.

use crate::event::Events;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::io;
use std::time::Duration;

/// The pending notifies: bits 0 to 29 of [`Notifies::state`].
const PENDING: u64 = (1 << 30) - 1;
/// The poller was shut down: bit 30, set once and never cleared (but by a
/// forked child's re-initialisation).
const SHUTDOWN: u64 = 1 << 30;
/// Synthetic events are queued: bit 31.
const SYNTHETIC: u64 = 1 << 31;
/// One waiter: the waiters are bits 32 to 63.
const WAITER: u64 = 1 << 32;

/// The waiters counted in a [`Notifies::state`] word.
#[inline(always)]
fn waiters_in(state: u64) -> u64 {
    state >> 32
}

/// Whether a `deliver` that leaves with synthetic events queued or the poller
/// shut down (`state`, as its leave saw the word; `me`: 1 if it was counted)
/// leaves another thread counted as waiting ([`Notifies::leave`]).
#[cold]
#[inline(never)]
fn others_waiting(state: u64, me: u64) -> bool {
    waiters_in(state) > me
}

/// The protocol's shared state. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Notifies {
    /// One word, so that every decision reads a consistent triple, and each
    /// change is one read-modify-write on one location: the notifies made and not
    /// yet consumed by a wait ([`PENDING`]: at most the most waiters there were),
    /// whether synthetic events are queued ([`SYNTHETIC`]), and the threads
    /// counted as waiting (`/ WAITER`: inside a `deliver` with a timeout other than
    /// zero, from entry to return).
    state: AtomicU64,
    /// A shutdown's wake-up was refused by the kernel: the next shutdown call
    /// wakes the kernel again ([`Notifies::shutdown`]). Only a refusal sets it.
    unwoken: AtomicBool,
}

/// A thread counted as a waiter (see [`Notifies::waiting`]); it stops counting
/// at [`Notifies::leave`] (or on drop, if the deliver panicked).
#[derive(Debug)]
pub(crate) struct Waiting<'a>(&'a Notifies);

impl Drop for Waiting<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.state.fetch_sub(WAITER, SeqCst);
    }
}

/// The state word as one access saw it ([`Notifies::waiting_seen`],
/// [`Notifies::seen`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seen(u64);

impl Seen {
    /// The poller was shut down.
    #[inline]
    pub(crate) fn shutdown(self) -> bool {
        self.0 & SHUTDOWN != 0
    }

    /// Synthetic events were queued.
    #[inline]
    pub(crate) fn synthetic(self) -> bool {
        self.0 & SYNTHETIC != 0
    }
}

/// What a wait that the kernel woke must do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Woken {
    /// This wait consumed one notify: its `deliver` returns, notified.
    pub(crate) notified: bool,
    /// More notifies are pending: wake the kernel again for the next waiter.
    pub(crate) pass_on: bool,
    /// The poller is shut down: the `deliver` returns, shut down (the wake-up
    /// for the next waiter is passed on by [`Notifies::leave`]).
    pub(crate) shutdown: bool,
}

impl Notifies {
    /// No notify pending, nobody waiting, no synthetic event queued.
    pub(crate) fn new() -> Notifies {
        Notifies {
            state: AtomicU64::new(0),
            unwoken: AtomicBool::new(false),
        }
    }

    /// A notify: counts it and calls `wake` (the backend's binary waker), or
    /// coalesces it when as many notifies are pending as there are waiters (at
    /// least one), both read in one load. If `wake` fails, the notify is taken
    /// back (unless a wait consumed it meanwhile) and the error returned.
    pub(crate) fn notify<E>(&self, wake: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let mut state = self.state.load(SeqCst);
        loop {
            if state & PENDING >= waiters_in(state).max(1) {
                return Ok(());
            }
            match self
                .state
                .compare_exchange(state, state + 1, SeqCst, SeqCst)
            {
                Ok(_) => break,
                Err(now) => state = now,
            }
        }
        wake().map_err(|e| {
            // Takes one pending notify back (unless a wait consumed it).
            let _ = self.woken(true);
            e
        })
    }

    /// [`waiting_seen`](Self::waiting_seen) with only the shutdown bit (the unit
    /// tests).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn waiting(&self) -> (Waiting<'_>, bool) {
        let (waiting, seen) = self.waiting_seen();
        (waiting, seen.shutdown())
    }

    /// A thread enters a `deliver` that may block: it counts as a waiter until
    /// [`leave`](Self::leave). One count for the whole call, not one per wait
    /// inside it: a waiter that a spurious wake-up or a stale event sent round the
    /// loop never drops out of the count, so a notify made meanwhile cannot
    /// coalesce for want of it.
    ///
    /// Also hands out what the same read-modify-write saw: whether the poller is
    /// shut down ([`shutdown`](Self::shutdown); a shutdown after it sees this
    /// waiter and wakes the kernel), and whether synthetic events are queued (an
    /// arm that queues one after it sees this waiter and wakes the kernel), so a
    /// `deliver` reads both with no second load.
    #[inline]
    pub(crate) fn waiting_seen(&self) -> (Waiting<'_>, Seen) {
        let before = self.state.fetch_add(WAITER, SeqCst);
        (Waiting(self), Seen(before))
    }

    /// The shutdown and synthetic bits now, in one load (a `deliver` that is not
    /// counted as a waiter: a zero timeout).
    #[inline]
    pub(crate) fn seen(&self) -> Seen {
        Seen(self.state.load(SeqCst))
    }

    /// Shuts the poller down: every `deliver` blocked now and every later one
    /// returns at once, shut down. Sets the sticky [`SHUTDOWN`] bit and, if a
    /// waiter is counted, wakes the kernel once; each `deliver` that returns shut
    /// down wakes it again while another waiter is counted ([`leave`](Self::leave)),
    /// so the one wake-up reaches every waiter in turn, and a waiter counted after
    /// the bit was set sees it at [`waiting_seen`](Self::waiting_seen) and never blocks.
    /// Returns `wake`'s error (the bit stays set: later delivers still return).
    pub(crate) fn shutdown<E>(&self, wake: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let before = self.state.fetch_or(SHUTDOWN, SeqCst);
        if waiters_in(before) > 0 && (before & SHUTDOWN == 0 || self.unwoken.swap(false, SeqCst)) {
            self.shutdown_wake(wake)?;
        }
        Ok(())
    }

    /// [`shutdown`](Self::shutdown)'s wake-up of the waiters counted. If the
    /// kernel refuses it, the next `shutdown` call (the caller's retry) wakes
    /// again: the bit is set for good, and a waiter blocked in the kernel would
    /// otherwise never see it.
    #[inline(never)]
    fn shutdown_wake<E>(&self, wake: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        wake().map_err(|e| {
            self.unwoken.store(true, SeqCst);
            e
        })
    }

    /// Whether the poller is shut down (a `deliver` that is not counted as a
    /// waiter: a zero timeout).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn is_shutdown(&self) -> bool {
        self.state.load(SeqCst) & SHUTDOWN != 0
    }

    /// A `deliver` returns: stops counting its [`Waiting`] (if it was counted), and
    /// says whether it must wake the kernel on its way out: synthetic events are
    /// still queued, or the poller is shut down, and another thread is counted as
    /// waiting. That thread may be blocked, and the wake-up meant for it (an arm's,
    /// or the shutdown's) may have been taken by this call, which returns without
    /// the events (it was notified, or out of room, or did not block).
    #[inline]
    pub(crate) fn leave(&self, waiting: Option<Waiting<'_>>) -> bool {
        let (state, me) = match waiting {
            Some(w) => {
                std::mem::forget(w);
                (self.state.fetch_sub(WAITER, SeqCst), 1)
            }
            None => (self.state.load(SeqCst), 0),
        };
        // Neither bit set (the common leave): one test, and the rest out of line.
        if state & (SYNTHETIC | SHUTDOWN) == 0 {
            return false;
        }
        others_waiting(state, me)
    }

    /// Threads counted as waiting now (`Poller::waiters`, the loom model).
    #[cfg_attr(not(feature = "stats"), allow(dead_code))]
    #[inline]
    pub(crate) fn waiters(&self) -> usize {
        waiters_in(self.state.load(SeqCst)) as usize
    }

    /// The kernel woke this wait: take one pending notify, if any, and see
    /// whether the poller is shut down. `counted`: the wait's `deliver` is
    /// counted as a waiter. One that is not (a zero timeout) takes a notify only
    /// while no waiter is counted, decided on the word the take changes:
    /// otherwise the notify is for a waiter, which may be blocked, and this wait
    /// took the wake-up meant for it, so it takes nothing and passes the wake-up
    /// on (`pass_on`).
    pub(crate) fn woken(&self, counted: bool) -> Woken {
        let mut state = self.state.load(SeqCst);
        loop {
            let pending = state & PENDING;
            let shutdown = state & SHUTDOWN != 0;
            let left_to_waiters = !counted && waiters_in(state) > 0;
            if pending == 0 || left_to_waiters {
                return Woken {
                    notified: false,
                    pass_on: pending > 0,
                    shutdown,
                };
            }
            match self
                .state
                .compare_exchange(state, state - 1, SeqCst, SeqCst)
            {
                Ok(_) => {
                    return Woken {
                        notified: true,
                        pass_on: pending > 1,
                        shutdown,
                    }
                }
                Err(now) => state = now,
            }
        }
    }

    /// Notifies pending now (for tests and `Debug`).
    #[allow(dead_code)]
    pub(crate) fn pending(&self) -> usize {
        (self.state.load(SeqCst) & PENDING) as usize
    }

    /// Whether synthetic events are queued. A waiter reads this after it counted
    /// itself, on the same word: an arm that queues an event after the count sees
    /// the waiter ([`synthetic_queued`](Self::synthetic_queued)).
    #[inline]
    pub(crate) fn synthetic_pending(&self) -> bool {
        self.state.load(SeqCst) & SYNTHETIC != 0
    }

    /// A synthetic event was queued (call it under the queue's lock). Returns
    /// whether to wake the kernel: a thread counted as waiting may be blocked
    /// there and would not see the event. With nobody counted, the next waiter
    /// counts itself on this same word before it reads the flag, and finds the
    /// event. That wake-up is not a notify: the wait it ends finds none pending.
    #[inline]
    pub(crate) fn synthetic_queued(&self) -> bool {
        waiters_in(self.state.fetch_or(SYNTHETIC, SeqCst)) > 0
    }

    /// The synthetic queue was emptied (call it under the queue's lock).
    #[inline]
    pub(crate) fn synthetic_drained(&self) {
        self.state.fetch_and(!SYNTHETIC, SeqCst);
    }

    /// Forget everything (a forked child: no other thread exists there).
    pub(crate) fn reset(&mut self) {
        *self = Notifies::new();
    }
}

/// What one backend wait brought, for the loop's decision to return or wait on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fetched {
    /// No kernel event and no wake-up: the wait timed out.
    Nothing,
    /// Kernel events (current or stale), no wake-up.
    Events,
    /// The waker fired (a notify, or a wake-up of the poller's own).
    Woken,
}

/// Where a `deliver` call gets its events and wake-ups: the poller (its event
/// path, `src/delivery.rs`), or the loom model of one (`src/loom_tests/`). Both
/// run the one loop in [`deliver`].
pub(crate) trait Source {
    /// The protocol's shared state.
    fn notifies(&self) -> &Notifies;

    /// While synthetic events are queued: whether the kernel fills the buffer
    /// first this time (the answer alternates).
    fn kernel_turn(&self) -> bool;

    /// Moves queued synthetic events that are still current into `events`, up to
    /// its room, and clears the flag when the queue is empty.
    fn take_synthetic(&self, events: &mut Events);

    /// One backend wait for at most `events.remaining()` events; current ones are
    /// appended (stale ones dropped). `Woken` when a wake-up reached this wait.
    /// EINTR is `ErrorKind::Interrupted`, with nothing appended.
    fn wait(&self, events: &mut Events, timeout: Option<Duration>) -> io::Result<Fetched>;

    /// The backend's binary waker.
    fn wake(&self) -> io::Result<()>;
}

/// The body of [`Poller::deliver`](crate::Poller::deliver): clears `events`
/// (after the waiter count's read-modify-write, so that the compiler knows the
/// buffer is empty when it sizes the first wait) and waits, for the time `left`
/// says remains (`None`: no deadline), until events are in hand, a notify was
/// consumed, or the time is up.
#[inline(always)]
pub(crate) fn deliver<S: Source>(
    source: &S,
    events: &mut Events,
    left: impl Fn() -> Option<Duration>,
) -> io::Result<usize> {
    let notifies = source.notifies();
    let first = left();
    // Counted as a waiter before looking at the synthetic queue: an arm that
    // queues a synthetic event after the count sees the waiter and wakes the
    // kernel (`synthetic_queued`: the same word), so a synthetic event never waits
    // behind a blocked wait.
    let (waiting, seen) = if first == Some(Duration::ZERO) {
        (None, notifies.seen())
    } else {
        let (waiting, seen) = notifies.waiting_seen();
        (Some(waiting), seen)
    };
    let counted = waiting.is_some();
    events.clear();
    let result = if seen.shutdown() {
        events.set_shutdown();
        Ok(0)
    } else if !seen.synthetic() {
        // The loop's first turn when no synthetic event is queued (the kernel
        // alone fills the buffer, which is empty, and the wait is as asked), taken
        // here inline; only its common end, events in hand, returns from here.
        match wait_once(source, events, first, counted) {
            Ok(_) if !events.is_empty() => Ok(events.len()),
            waited => deliver_on(source, events, first, left, waited, counted),
        }
    } else {
        deliver_loop(source, events, first, left, true, counted)
    };
    if notifies.leave(waiting) {
        // Synthetic events are still queued and another thread may be blocked:
        // pass the wake-up on. Its failure (EBADF, misuse of the waker) leaves
        // this caller's result as it is.
        let _ = source.wake();
    }
    result
}

/// [`deliver`] after a first turn (no synthetic event queued, a wait for `first`)
/// that did not end with events in hand: the loop's end of that turn, then its
/// next turns. Out of line: the common deliver returns without it.
#[inline(never)]
fn deliver_on<S: Source>(
    source: &S,
    events: &mut Events,
    first: Option<Duration>,
    time_left: impl Fn() -> Option<Duration>,
    waited: io::Result<Fetched>,
    counted: bool,
) -> io::Result<usize> {
    if let Some(result) = turn_end(events, first, first, waited) {
        return result;
    }
    let pending = source.notifies().synthetic_pending();
    deliver_loop(source, events, time_left(), time_left, pending, counted)
}

/// The end of one turn of [`deliver_loop`], which waited for `wait_for` with
/// `left` the time left, and whose wait answered `waited`: `Some` of what
/// `deliver` returns, or `None` to go round again.
#[inline(always)]
fn turn_end(
    events: &Events,
    left: Option<Duration>,
    wait_for: Option<Duration>,
    waited: io::Result<Fetched>,
) -> Option<io::Result<usize>> {
    let fetched = match waited {
        Ok(fetched) => fetched,
        // EINTR: nothing was fetched by this wait; events in hand are returned,
        // never dropped.
        Err(e) if e.kind() == io::ErrorKind::Interrupted => {
            if events.is_empty() && !events.is_notified() {
                return Some(Err(e));
            }
            return Some(Ok(events.len()));
        }
        Err(e) => return Some(Err(e)),
    };
    if !events.is_empty() || events.is_notified() || events.is_shutdown() {
        return Some(Ok(events.len()));
    }
    if left == Some(Duration::ZERO) {
        return Some(Ok(0));
    }
    if wait_for != Some(Duration::ZERO) && fetched == Fetched::Nothing {
        // The kernel wait returned with no event and no wake-up: the timeout
        // passed.
        return Some(Ok(0));
    }
    // Only the synthetic queue's stale entries and a peek at the kernel (now
    // wait as asked), or only stale events, or a wake-up that was not a notify
    // (a synthetic event another deliver took, a merged wake-up): wait for the
    // time left.
    None
}

/// [`deliver`]'s loop, with the caller counted as a waiter (`counted`) or not,
/// for a call that never blocks. `first` is the time left at entry; `pending`,
/// whether synthetic events were queued when the call counted itself (read again
/// on each later turn). Out of line: the common deliver does not come here.
#[inline(never)]
fn deliver_loop<S: Source>(
    source: &S,
    events: &mut Events,
    first: Option<Duration>,
    time_left: impl Fn() -> Option<Duration>,
    mut pending: bool,
    counted: bool,
) -> io::Result<usize> {
    let notifies = source.notifies();
    let mut left = first;
    loop {
        // While synthetic events are pending, the synthetic queue and the kernel
        // take turns at filling the buffer first: whichever went first could fill a
        // small buffer on every call (an always-ready registration re-armed after
        // each delivery) and starve the other.
        let kernel_first = pending && source.kernel_turn();
        if pending && !kernel_first {
            source.take_synthetic(events);
            if events.remaining() == 0 {
                return Ok(events.len());
            }
        }
        // Block only if nothing is in hand yet and the synthetic queue has had its
        // turn.
        let wait_for = if kernel_first || !events.is_empty() {
            Some(Duration::ZERO)
        } else {
            left
        };
        let waited = wait_once(source, events, wait_for, counted);
        if kernel_first {
            source.take_synthetic(events);
        }
        if let Some(result) = turn_end(events, left, wait_for, waited) {
            return result;
        }
        left = time_left();
        pending = notifies.synthetic_pending();
    }
}

/// One backend wait; a wake-up that reached it is checked against the pending
/// notifies ([`Notifies::woken`]: a caller not `counted` as a waiter leaves them
/// to the counted ones), and passed on to the next waiter when more are pending
/// or when this caller left the notify to a waiter.
#[inline(always)]
fn wait_once<S: Source>(
    source: &S,
    events: &mut Events,
    timeout: Option<Duration>,
    counted: bool,
) -> io::Result<Fetched> {
    let fetched = source.wait(events, timeout)?;
    if fetched == Fetched::Woken {
        let w = source.notifies().woken(counted);
        if w.notified {
            events.set_notified();
        }
        if w.shutdown {
            events.set_shutdown();
        }
        if w.pass_on {
            // More notifies are pending, or this call (not counted) left the
            // notify to a counted waiter, which may be blocked: wake the kernel
            // again, so that the next waiter gets it. The waker's write fails
            // only on misuse of its descriptor (EBADF); then the notifies stay
            // pending, and are not reported to this caller, which got what it
            // asked for.
            let _ = source.wake();
        }
    }
    Ok(fetched)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn count_wakes(n: &Notifies, times: usize) -> usize {
        let wakes = Cell::new(0);
        for _ in 0..times {
            n.notify(|| -> Result<(), ()> {
                wakes.set(wakes.get() + 1);
                Ok(())
            })
            .unwrap();
        }
        wakes.get()
    }

    #[test]
    fn with_no_waiter_notifies_coalesce_into_one() {
        let n = Notifies::new();
        assert_eq!(count_wakes(&n, 1000), 1);
        assert_eq!(n.pending(), 1);
        let w = n.woken(true);
        assert!(w.notified && !w.pass_on);
        assert_eq!(n.pending(), 0);
        // Nothing pending: a kernel wake-up now is spurious.
        assert_eq!(
            n.woken(true),
            Woken {
                notified: false,
                pass_on: false,
                shutdown: false,
            }
        );
    }

    #[test]
    fn a_wait_not_counted_leaves_a_notify_to_the_counted_waiters() {
        let n = Notifies::new();
        let blocked = n.waiting().0;
        assert_eq!(count_wakes(&n, 1), 1);
        // A zero-timeout deliver (not counted) took the kernel's wake-up: it
        // leaves the notify and wakes the kernel again for the waiter.
        let w = n.woken(false);
        assert!(!w.notified && w.pass_on, "{w:?}");
        assert_eq!(n.pending(), 1);
        // The waiter's wait takes it.
        let w = n.woken(true);
        assert!(w.notified && !w.pass_on, "{w:?}");
        drop(blocked);
        // With no waiter counted, a call not counted is "the next deliver".
        assert_eq!(count_wakes(&n, 1), 1);
        let w = n.woken(false);
        assert!(w.notified && !w.pass_on, "{w:?}");
        assert_eq!(n.pending(), 0);
        // Nothing pending: nothing to pass on.
        let w = n.woken(false);
        assert!(!w.notified && !w.pass_on, "{w:?}");
    }

    #[test]
    fn k_waiters_take_k_notifies_then_coalesce() {
        let n = Notifies::new();
        let waiting: Vec<_> = (0..4).map(|_| n.waiting().0).collect();
        assert_eq!(count_wakes(&n, 10), 4);
        let mut passes = 0;
        for i in 0..4 {
            let w = n.woken(true);
            assert!(w.notified, "waiter {i}");
            passes += w.pass_on as usize;
        }
        drop(waiting);
        assert_eq!(n.waiters(), 0);
        assert_eq!(passes, 3, "the baton passes to each following waiter");
        assert_eq!(n.pending(), 0);
    }

    #[test]
    fn a_deliver_leaving_queued_synthetic_events_wakes_only_for_another_waiter() {
        let n = Notifies::new();
        let me = n.waiting().0;
        assert!(n.synthetic_queued(), "a waiter is counted: wake the kernel");
        assert!(n.synthetic_pending());
        // Alone: nobody to pass the wake-up to.
        assert!(!n.leave(Some(me)));
        // Another thread counted: pass it on, counted or not.
        let other = n.waiting().0;
        let me = n.waiting().0;
        assert!(n.leave(Some(me)));
        assert!(n.leave(None));
        // Nothing queued: nothing to pass on.
        n.synthetic_drained();
        assert!(!n.leave(None));
        assert!(!n.leave(Some(other)));
        assert_eq!(n.waiters(), 0);
    }

    #[test]
    fn shutdown_wakes_once_for_counted_waiters_and_each_leaver_passes_it_on() {
        let n = Notifies::new();
        let wakes = Cell::new(0);
        let wake = || -> Result<(), ()> {
            wakes.set(wakes.get() + 1);
            Ok(())
        };
        let (a, shut) = n.waiting();
        assert!(!shut);
        let (b, _) = n.waiting();
        n.shutdown(wake).unwrap();
        assert_eq!(wakes.get(), 1, "waiters counted: one wake-up");
        n.shutdown(wake).unwrap();
        assert_eq!(wakes.get(), 1, "a second shutdown changes nothing");
        let w = n.woken(true);
        assert!(w.shutdown && !w.notified && !w.pass_on);
        assert!(n.leave(Some(a)), "another waiter is counted: pass it on");
        assert!(!n.leave(Some(b)), "the last waiter: nobody to pass it to");
        // Sticky, and seen by a waiter counted later without any wake-up.
        let (c, shut) = n.waiting();
        assert!(shut && n.is_shutdown());
        drop(c);
        assert_eq!(n.waiters(), 0);
        // With nobody counted: no wake-up at all.
        let m = Notifies::new();
        m.shutdown(wake).unwrap();
        assert_eq!(wakes.get(), 1);
        assert!(m.is_shutdown());
    }

    /// A shutdown whose wake-up the kernel refused is shut down, and its retry
    /// wakes the kernel (a waiter blocked there would not see the bit otherwise);
    /// once a wake-up went through, a further shutdown changes nothing again.
    /// On the old code the retry woke nothing: the blocked waiters slept on
    /// (found by `tests/faults` on libkqueue, its waker write failed with EINTR).
    #[test]
    fn a_shutdown_whose_wake_up_failed_wakes_again_when_retried() {
        let n = Notifies::new();
        let wakes = Cell::new(0);
        let (a, _) = n.waiting();
        assert_eq!(n.shutdown(|| Err::<(), _>("refused")), Err("refused"));
        assert!(n.is_shutdown());
        let wake = || -> Result<(), ()> {
            wakes.set(wakes.get() + 1);
            Ok(())
        };
        n.shutdown(wake).unwrap();
        assert_eq!(wakes.get(), 1, "the retry wakes the kernel");
        n.shutdown(wake).unwrap();
        assert_eq!(wakes.get(), 1, "after a wake-up went through: nothing");
        drop(a);
    }

    #[test]
    fn an_arm_wakes_the_kernel_only_for_a_counted_waiter() {
        let n = Notifies::new();
        assert!(!n.synthetic_queued());
        let w = n.waiting().0;
        assert!(n.synthetic_queued());
        drop(w);
        assert_eq!(n.waiters(), 0);
    }

    #[test]
    fn a_failed_wake_takes_its_notify_back() {
        let n = Notifies::new();
        assert_eq!(n.notify(|| Err("EIO")), Err("EIO"));
        assert_eq!(n.pending(), 0);
        assert_eq!(count_wakes(&n, 1), 1);
    }
}
