//! Deregistration: when `deregister` returns, no poll request of the registration
//! is left in the kernel, so the ring holds no reference to its file.
//!
//! A poll request holds a reference to the open file from its submission until it
//! ends, and a remove only asks for its end: the kernel marks the request
//! cancelled and completes it through task work run by the thread that submitted
//! it (`io_poll_remove` and `io_poll_cancel_req` in io_uring/poll.c, then
//! `io_req_task_complete`), which posts its completion (`-ECANCELED`) and frees the
//! request (`io_free_batch_list` puts the file). A deregister therefore submits the
//! remove at once and waits until every request of the slot has ended: the slot's
//! `inflight` count, pushed minus reaped, is 0.
//!
//! Who reaps: with no leader in the kernel, the deregistering thread leads for the
//! time of one `io_uring_enter` (it submits the remove and waits for a completion)
//! and takes what the queue holds; completions of other slots are kept in
//! `Shared::parked` for the next wait (a leader in the kernel, which would not
//! return for completions taken before it saw them, is kicked through the
//! eventfd to deliver them). With a leader blocked in the kernel, the
//! deregistering thread submits the remove (one `io_uring_enter` without waiting)
//! and waits on the `departed` futex word; the leader returns for the completion,
//! reaps it and bumps the word (and bumps it whenever it leaves the kernel, so a
//! deregister never waits on a word no leader will move).

use super::lock::Guard;
use super::ring::{Ring, Shared};
use crate::state::KernelError;
use crate::stats::Count;
use std::sync::atomic::Ordering;

impl Ring {
    /// Waits until no poll request of `slot` is left (see the module docs). The
    /// caller has queued the removes.
    pub(super) fn depart(&self, slot: u32) -> Result<(), KernelError> {
        let mut g = self.lock();
        g.departing += 1;
        let r = loop {
            let mut parked = std::mem::take(&mut g.parked);
            let before = parked.len();
            let reaped = self.reap(&mut g, &mut parked, usize::MAX);
            let more = parked.len() > before;
            g.parked = parked;
            if more && g.leader {
                // The leader in the kernel would not return for completions
                // taken before it saw them: it delivers them.
                self.kick_leader(&mut g);
            }
            if let Err(e) = reaped {
                break Err(KernelError::Other(e));
            }
            if g.inflight(slot) == 0 {
                break Ok(());
            }
            if g.leader {
                // SAFETY: under the mutex: the only submission queue handle; it only
                // reads the queue's length.
                let queued = !unsafe { self.ring.submission_shared() }.is_empty();
                let seen = self.departed.load(Ordering::Relaxed);
                drop(g);
                // The leader would not see the remove until it returns.
                let submitted = self.submit_for_leader(queued);
                if submitted.is_ok() {
                    // Woken, EAGAIN (moved on already), EINTR: look again.
                    let _ = rustix::thread::futex::wait(
                        &self.departed,
                        rustix::thread::futex::Flags::PRIVATE,
                        seen,
                        None,
                    );
                }
                g = self.lock();
                if let Err(e) = submitted {
                    break Err(e);
                }
                continue;
            }
            // No leader: lead for one enter that submits the remove and waits for
            // a completion (the cancelled request's, posted by task work).
            g.leader = true;
            drop(g);
            self.note_submitter();
            self.counters.one(Count::CtlCall);
            let r = self.ring.submitter().submit_and_wait(1);
            g = self.lock();
            g.leader = false;
            g.kicked = false;
            self.left_kernel(&g);
            match r {
                // EINTR: a signal; EBUSY: completions in the overflow list, which
                // the reap flushes.
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                Err(e) => break Err(KernelError::Other(e)),
            }
        };
        g.departing -= 1;
        if !g.parked.is_empty() && !g.leader && g.followers > 0 {
            // A follower takes what this deregister took from the queue.
            self.hand_over(&g);
        }
        r
    }

    /// Makes the leader blocked in the kernel return (one eventfd write, as a
    /// wake-up's), unless one is on its way.
    fn kick_leader(&self, g: &mut Shared) {
        if g.kicked {
            return;
        }
        g.kicked = true;
        self.counters.one(Count::Wake);
        if self.write_waker().is_err() {
            g.kicked = false;
        }
    }

    /// A thread that led (a wait's or a deregister's `io_uring_enter`) has left
    /// the kernel: one follower leads next, and waiting deregisters look again.
    #[inline(always)]
    pub(super) fn left_kernel(&self, g: &Guard<'_, Shared>) {
        if g.followers > 0 {
            self.hand_over(g);
        }
        self.wake_departing(g);
    }

    /// Wakes every deregister waiting on `departed` (under the mutex, so one
    /// between reading the word and waiting on it sees the word move).
    #[inline(always)]
    pub(super) fn wake_departing(&self, g: &Shared) {
        if g.departing != 0 {
            self.wake_departed();
        }
    }

    /// [`wake_departing`](Self::wake_departing) with deregisters waiting.
    #[cold]
    #[inline(never)]
    fn wake_departed(&self) {
        self.departed.fetch_add(1, Ordering::Relaxed);
        let _ = rustix::thread::futex::wake(
            &self.departed,
            rustix::thread::futex::Flags::PRIVATE,
            i32::MAX as u32,
        );
    }

    /// A completion of `slot` was taken: one request fewer in flight (the
    /// uncounted one, `Pending::fast`, first).
    #[inline(always)]
    pub(super) fn settle(&self, g: &mut Shared, slot: u32) {
        if let Some(p) = g.pending.get_mut(slot as usize) {
            if std::mem::replace(&mut p.fast, false) {
                // Waiting deregisters look again (their slot's count may be 0).
                self.wake_departing(g);
                return;
            }
        }
        self.settle_counted(g, slot);
    }

    /// [`settle`](Self::settle) where the slot has no uncounted request.
    #[inline(always)]
    pub(super) fn settle_counted(&self, g: &mut Shared, slot: u32) {
        if let Some(n) = g.inflight.get_mut(slot as usize) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.wake_departing(g);
            }
        }
    }
}
