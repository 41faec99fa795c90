//! Fork and thread exit: a forked child drops its copy of the ring without
//! touching the parent's, and a thread that submitted to a ring queues its
//! pending requests again when it exits.

use super::ring::{Odd, Ring, EPOLL_SLOT};
use super::slots::{events_of, fd_of, generation, ONE, PENDING};
use super::submit::poll_add;
use crate::token::pack64;
use rustix::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::cell::{Cell, RefCell};
use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::Weak;

impl Drop for Ring {
    fn drop(&mut self) {
        if self.abandoned.load(Ordering::Relaxed) {
            let fd = self.ring.as_raw_fd();
            // SAFETY: the child's copy of the ring's descriptor is owned by this
            // `IoUring`, which is never used or dropped after this (its mappings are
            // not the child's to unmap); closing the copy leaves the parent's ring
            // alone.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        } else {
            // SAFETY: the ring is dropped once, here, and not used afterwards.
            unsafe { ManuallyDrop::drop(&mut self.ring) };
        }
    }
}

/// The rings a thread has submitted to. The kernel ties a poll request to the
/// thread whose `io_uring_enter` submitted it: once that thread has exited, the
/// request completes with `-ECANCELED` when it would fire, from a kernel worker
/// about a jiffy later. So a thread that exits queues every pending request again
/// (a remove of the old one and the same poll), for a live thread's next enter to
/// submit, and kicks a leader blocked in the kernel so that it does so at once.
pub(super) struct Submitters(RefCell<Vec<Weak<Ring>>>);

impl Drop for Submitters {
    fn drop(&mut self) {
        for ring in self.0.get_mut().drain(..) {
            if let Some(ring) = ring.upgrade() {
                // In a forked child the ring's memory is not mapped (MADV_DONTFORK)
                // and its requests are the parent's: nothing to do.
                if ring.forks == crate::fork::count() {
                    ring.requeue_all();
                }
            }
        }
    }
}

thread_local! {
    static SUBMITTERS: Submitters = const { Submitters(RefCell::new(Vec::new())) };
    /// The [`Ring::id`] this thread noted last (0: none): a thread that submits to
    /// one ring again and again finds it here without walking its list. A plain
    /// `Cell` without a destructor, so reading it costs no registration check.
    static NOTED: Cell<u64> = const { Cell::new(0) };
}

impl Ring {
    /// Records that this thread submits to this ring (see [`Submitters`]).
    #[inline(always)]
    pub(super) fn note_submitter(&self) {
        if NOTED.get() != self.id {
            self.note_submitter_slow();
        }
    }

    #[cold]
    #[inline(never)]
    fn note_submitter_slow(&self) {
        // During the thread's own teardown the list is gone: nothing to record.
        let _ = SUBMITTERS.try_with(|list| {
            let mut list = list.0.borrow_mut();
            if !list.iter().any(|r| Weak::ptr_eq(r, &self.me)) {
                list.retain(|r| r.strong_count() > 0);
                list.push(self.me.clone());
            }
            NOTED.set(self.id);
        });
    }

    /// A thread that submitted to this ring is exiting: queue every pending request
    /// again (see [`Submitters`]).
    pub(super) fn requeue_all(&self) {
        let kick = {
            let mut g = self.lock();
            let mut queued = false;
            let mut again = Vec::new();
            self.reqs.each(|slot, req| {
                let w = req.word.load(Ordering::Acquire);
                // A via_epoll arming has no poll request pending.
                if w & PENDING != 0 {
                    again.push((slot, generation(w)));
                }
            });
            for (slot, generation) in again {
                let Some(req) = self.reqs.get(slot) else {
                    continue;
                };
                let user_data = pack64(slot, generation);
                let remove = self.remove_entry(user_data);
                let w = req.word.load(Ordering::Acquire);
                let poll = poll_add(fd_of(slot), events_of(w), user_data);
                req.word.fetch_add(ONE, Ordering::AcqRel);
                if self.push(&mut g, &remove).is_err() || self.push(&mut g, &poll).is_err() {
                    req.word.fetch_sub(ONE, Ordering::AcqRel);
                    break;
                }
                let odd = g.odd(slot);
                self.set_odd(
                    &mut g,
                    slot,
                    Odd {
                        older: odd.older + 1,
                        ..odd
                    },
                );
                queued = true;
            }
            if g.epoll_poll != 0 {
                // The private epoll's poll too, under a new stamp: the old one's
                // -ECANCELED (the remove's answer, or the exit's) is then stale.
                let remove = self.remove_entry(pack64(EPOLL_SLOT, g.epoll_poll));
                g.epoll_poll = 0;
                if self.push(&mut g, &remove).is_ok() {
                    if let Some(again) = self.epoll_poll(&mut g) {
                        queued |= self.push(&mut g, &again).is_ok();
                    }
                }
            }
            queued
        };
        if kick {
            // The leader returns, finds nothing to deliver, and enters again,
            // submitting what was queued from its own, live, thread.
            self.handover.nudge(self);
        }
    }
}
