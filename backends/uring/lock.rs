//! The mutex over the ring's shared state: a futex word, without poisoning.
//!
//! `std::sync::Mutex` on Linux is the same three-state futex lock, plus a poison
//! flag that every lock and unlock tests against the process's panic count. The
//! ring's state is plain data updated in single assignments, so a panic while it
//! is held cannot leave it half-written and poisoning has nothing to guard. A
//! one-thread round trip takes this lock three times (two arms, and the wait that
//! enters, for the submission queue's length); the poison checks and the lock
//! result's unwrapping were about 90 of its user-space instructions when it was
//! taken five times.
//!
//! States: 0 unlocked, 1 locked, 2 locked with waiters (or maybe). A locker that
//! finds it taken spins briefly, then sets 2 and waits on the word (futex(2),
//! `FUTEX_WAIT_PRIVATE`); an unlock that finds 2 wakes one waiter
//! (`FUTEX_WAKE_PRIVATE`), which sets 2 again when it takes the lock, so that no
//! later waiter is forgotten.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};

const UNLOCKED: u32 = 0;
const LOCKED: u32 = 1;
const CONTENDED: u32 = 2;

/// A mutex without poisoning (see the module docs).
pub(super) struct Lock<T> {
    state: AtomicU32,
    data: UnsafeCell<T>,
}

// SAFETY: the data is reached only through a `Guard`, and at most one guard exists
// at a time (the state word's acquire and release order its accesses), as for
// `std::sync::Mutex<T>`, which is `Sync` for `T: Send`.
unsafe impl<T: Send> Sync for Lock<T> {}

/// Holds the lock; dropping it unlocks.
pub(super) struct Guard<'a, T> {
    lock: &'a Lock<T>,
}

impl<T> Lock<T> {
    pub(super) const fn new(data: T) -> Lock<T> {
        Lock {
            state: AtomicU32::new(UNLOCKED),
            data: UnsafeCell::new(data),
        }
    }

    #[inline(always)]
    pub(super) fn lock(&self) -> Guard<'_, T> {
        if self
            .state
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        Guard { lock: self }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        // A short spin first: no system call made under this lock waits (the
        // enters that block drop it first), so it is usually released soon.
        for _ in 0..100 {
            if self.state.load(Ordering::Relaxed) == UNLOCKED
                && self
                    .state
                    .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            std::hint::spin_loop();
        }
        while self.state.swap(CONTENDED, Ordering::Acquire) != UNLOCKED {
            // EAGAIN (the word moved on) and EINTR: look again.
            let _ = rustix::thread::futex::wait(
                &self.state,
                rustix::thread::futex::Flags::PRIVATE,
                CONTENDED,
                None,
            );
        }
    }
}

impl<T> Drop for Guard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        if self.lock.state.swap(UNLOCKED, Ordering::Release) == CONTENDED {
            let _ = rustix::thread::futex::wake(
                &self.lock.state,
                rustix::thread::futex::Flags::PRIVATE,
                1,
            );
        }
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
    use std::sync::Arc;

    /// Four threads, 20,000 unsynchronised-looking increments each under the lock:
    /// none is lost, so the lock excludes (and waiters are woken, or it would hang).
    #[test]
    fn lock_excludes_and_wakes() {
        let lock = Arc::new(Lock::new((0u64, 0u64)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = lock.lock();
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
        assert_eq!(*lock.lock(), (80_000, 80_000));
    }
}
