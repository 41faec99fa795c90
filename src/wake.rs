//! The notify protocol: counted wake-ups on top of a backend's binary waker.
//!
//! What [`Poller::notify`](crate::Poller::notify) promises:
//!
//! - one `notify` ends exactly one `deliver` call: one that is blocked now, or the
//!   next one (which then returns at once);
//! - `k` notifies with `k` or more blocked waiters end `k` distinct delivers;
//! - notifies coalesce only beyond the number of blocked waiters: while as many
//!   wake-ups are pending as there are threads blocked in `deliver` (at least one),
//!   a further notify changes nothing and costs no system call.
//!
//! The kernel side of every backend is a *binary* waker (an edge-triggered eventfd,
//! an `EVFILT_USER` knote, a pipe): a wake-up reaches at least one wait, and several
//! wake-ups before a wait sees them may merge into one. The counting lives here, in
//! two numbers: `pending` (notifies not yet consumed) and `waiters` (threads inside a
//! blocking wait). A wait that the kernel woke takes one pending notify and, if more
//! are pending, wakes the kernel again before it returns, so the next waiter gets
//! the next one: the baton passes until every pending notify has ended one wait. A
//! kernel wake-up that finds nothing pending (two wake-ups merged, then the baton
//! was passed) is spurious: that wait goes on waiting.
//!
//! Orderings are `SeqCst`: the decision "coalesce or wake" reads both counters, and
//! each blocking wait pays two read-modify-writes (enter, leave), which is small next
//! to the wait's system call.

#[cfg(not(loom))]
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

#[cfg(loom)]
use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};

/// The two counters of the protocol. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Notifies {
    /// Notifies made and not yet consumed by a wait.
    pending: AtomicUsize,
    /// Threads inside a blocking backend wait (timeout other than zero).
    waiters: AtomicUsize,
}

/// A thread counted in `waiters` (see [`Notifies::waiting`]).
#[derive(Debug)]
pub(crate) struct Waiting<'a>(&'a Notifies);

impl Drop for Waiting<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, SeqCst);
    }
}

/// What a wait that the kernel woke must do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Woken {
    /// This wait consumed one notify: its `deliver` returns, notified.
    pub(crate) notified: bool,
    /// More notifies are pending: wake the kernel again for the next waiter.
    pub(crate) pass_on: bool,
}

impl Notifies {
    /// A new pair of counters (no notify pending, nobody waiting).
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Notifies {
        Notifies {
            pending: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
        }
    }

    /// A new pair of counters (loom's atomics are not `const`).
    #[cfg(loom)]
    pub(crate) fn new() -> Notifies {
        Notifies {
            pending: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
        }
    }

    /// A notify: counts it and calls `wake` (the backend's binary waker), or
    /// coalesces it when as many notifies are pending as there are blocked waiters
    /// (at least one). If `wake` fails, the notify is taken back and the error
    /// returned.
    pub(crate) fn notify<E>(&self, wake: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let mut pending = self.pending.load(SeqCst);
        loop {
            let waiters = self.waiters.load(SeqCst);
            if pending >= waiters.max(1) {
                return Ok(());
            }
            match self
                .pending
                .compare_exchange(pending, pending + 1, SeqCst, SeqCst)
            {
                Ok(_) => break,
                Err(now) => pending = now,
            }
        }
        wake().map_err(|e| {
            self.pending.fetch_sub(1, SeqCst);
            e
        })
    }

    /// A thread is about to block in the backend's wait; it counts as a waiter
    /// until the guard drops.
    #[inline]
    pub(crate) fn waiting(&self) -> Waiting<'_> {
        self.waiters.fetch_add(1, SeqCst);
        Waiting(self)
    }

    /// Threads counted as waiting now.
    #[inline]
    pub(crate) fn waiters(&self) -> usize {
        self.waiters.load(SeqCst)
    }

    /// The kernel woke this wait: take one pending notify, if any.
    pub(crate) fn woken(&self) -> Woken {
        let mut pending = self.pending.load(SeqCst);
        loop {
            if pending == 0 {
                return Woken {
                    notified: false,
                    pass_on: false,
                };
            }
            match self
                .pending
                .compare_exchange(pending, pending - 1, SeqCst, SeqCst)
            {
                Ok(_) => {
                    return Woken {
                        notified: true,
                        pass_on: pending > 1,
                    }
                }
                Err(now) => pending = now,
            }
        }
    }

    /// Notifies pending now (for tests and `Debug`).
    #[allow(dead_code)]
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(SeqCst)
    }

    /// Forget everything (a forked child: no other thread exists there).
    #[cfg(not(loom))]
    pub(crate) fn reset(&mut self) {
        *self.pending.get_mut() = 0;
        *self.waiters.get_mut() = 0;
    }
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
        let w = n.woken();
        assert!(w.notified && !w.pass_on);
        assert_eq!(n.pending(), 0);
        // Nothing pending: a kernel wake-up now is spurious.
        assert_eq!(
            n.woken(),
            Woken {
                notified: false,
                pass_on: false
            }
        );
    }

    #[test]
    fn k_waiters_take_k_notifies_then_coalesce() {
        let n = Notifies::new();
        let waiting: Vec<_> = (0..4).map(|_| n.waiting()).collect();
        assert_eq!(count_wakes(&n, 10), 4);
        let mut passes = 0;
        for i in 0..4 {
            let w = n.woken();
            assert!(w.notified, "waiter {i}");
            passes += w.pass_on as usize;
        }
        drop(waiting);
        assert_eq!(n.waiters(), 0);
        assert_eq!(passes, 3, "the baton passes to each following waiter");
        assert_eq!(n.pending(), 0);
    }

    #[test]
    fn a_failed_wake_takes_its_notify_back() {
        let n = Notifies::new();
        assert_eq!(n.notify(|| Err("EIO")), Err("EIO"));
        assert_eq!(n.pending(), 0);
        assert_eq!(count_wakes(&n, 1), 1);
    }
}
