//! The lock over the ring's submission queue and its shared state, without
//! poisoning: a bit of the hand-over's word
//! ([`QUEUE`](crate::uring_handover::QUEUE), taken with one atomic OR where it
//! is free), so that its release (one atomic subtraction) also answers whether
//! a thread holds the ring, which an arm needs to know: an uncontended arm
//! makes two read-modify-writes of that word and no other load of it. A
//! locker that finds it held spins briefly, then sleeps on a futex word
//! (`Handover::lock_queue`).
//!
//! The state is plain data updated in single assignments, so a panic while it
//! is held cannot leave it half-written and poisoning has nothing to guard.

use crate::uring_handover::Handover;
use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};

/// Data under the hand-over's queue lock.
pub(super) struct Lock<T> {
    data: UnsafeCell<T>,
}

// SAFETY: the data is reached only through a `Guard`, and at most one guard exists
// at a time (the lock bit's acquire and release order its accesses), as for
// `std::sync::Mutex<T>`, which is `Sync` for `T: Send`.
unsafe impl<T: Send> Sync for Lock<T> {}

/// Holds the lock; dropping it unlocks.
pub(super) struct Guard<'a, T> {
    lock: &'a Lock<T>,
    handover: &'a Handover,
}

impl<T> Lock<T> {
    pub(super) const fn new(data: T) -> Lock<T> {
        Lock {
            data: UnsafeCell::new(data),
        }
    }

    #[inline(always)]
    pub(super) fn lock<'a>(&'a self, handover: &'a Handover) -> Guard<'a, T> {
        handover.lock_queue();
        Guard {
            lock: self,
            handover,
        }
    }
}

impl<T> Guard<'_, T> {
    /// Unlocks; returns the hand-over's word before.
    #[inline(always)]
    pub(super) fn unlock(self) -> u64 {
        let h = self.handover;
        std::mem::forget(self);
        h.unlock_queue()
    }
}

impl<T> Drop for Guard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        self.handover.unlock_queue();
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;

    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock: no other reference to the data exists.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard holds the lock, and `&mut self` makes this the only
        // reference through it.
        unsafe { &mut *self.lock.data.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::Lock;
    use crate::uring_handover::{Handover, LEADER};
    use std::sync::Arc;

    /// Four threads, 20,000 unsynchronised-looking increments each under the lock:
    /// none is lost, so the lock excludes (and sleepers are woken, or it would
    /// hang); the hand-over's word is left as it was.
    #[test]
    fn lock_excludes_and_wakes() {
        let shared = Arc::new((Handover::new(), Lock::new((0u64, 0u64))));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let (h, lock) = &*shared;
                    for _ in 0..20_000 {
                        let mut g = lock.lock(h);
                        let (a, b) = *g;
                        // Two fields written apart: a torn pair means two holders.
                        g.0 = a + 1;
                        std::hint::black_box(&mut *g);
                        g.1 = b + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let (h, lock) = &*shared;
        assert_eq!(*lock.lock(h), (80_000, 80_000));
        assert_eq!(h.word(), 0);
    }

    /// The release answers the word as it was: whether a thread holds the ring.
    #[test]
    fn unlock_answers_whether_the_ring_is_held() {
        let h = Handover::new();
        let lock = Lock::new(());
        assert_eq!(lock.lock(&h).unlock() & LEADER, 0);
        h.take_for_test();
        assert_eq!(lock.lock(&h).unlock() & LEADER, LEADER);
    }
}
