//! Submission: the arm and the remove of one registration, queued under the
//! mutex (which guards the submission queue) and submitted at once when another
//! thread holds the ring. A common arm touches its slot's record alone
//! (`slots.rs`); a slot with rare state goes through [`Odd`].

use super::ring::{fd_ref, Odd, Ring, Shared};
use super::slots::{
    generation, inflight, interest_flags, with_count, Req, BUSY, ODD, ONE, PENDING,
};
use crate::backend::Tag;
use crate::interest::Interest;
use crate::state::KernelError;
use crate::stats::Count;
use crate::token::pack64;
use crate::uring_handover::LEADER;
use io_uring::{opcode, squeue, types};
use rustix::fd::RawFd;
use rustix::io::Errno;
use std::sync::atomic::Ordering;

/// `poll32_events` for an interest.
#[inline]
pub(super) fn poll_events(interest: Interest) -> u32 {
    let mut e = 0;
    if interest.is_readable() {
        e |= (libc::POLLIN | libc::POLLRDHUP) as u32;
    }
    if interest.is_writable() {
        e |= libc::POLLOUT as u32;
    }
    if interest.is_priority() {
        e |= libc::POLLPRI as u32;
    }
    e
}

/// A oneshot poll request on `fd` for `events`, tagged `user_data`.
#[inline(always)]
pub(super) fn poll_add(fd: RawFd, events: u32, user_data: u64) -> squeue::Entry {
    opcode::PollAdd::new(types::Fd(fd), events)
        .build()
        .user_data(user_data)
}

impl Ring {
    /// Submits what is queued when another thread holds the ring (it may be in
    /// the kernel, and would not see it until it returns). Called without the
    /// mutex.
    #[inline(always)]
    pub(super) fn submit_for_leader(&self, leader: bool) -> Result<(), KernelError> {
        if !leader {
            return Ok(());
        }
        self.note_submitter();
        self.counters.one(Count::CtlCall);
        self.ring.submit().map(drop).map_err(KernelError::Other)
    }

    /// Queues the request for an arming; `rearm`: a modify, which answers
    /// `NotFound` for a number the kernel reported closed (see [`Odd::lost`]).
    /// A write-only arming of a registration known to be half-closed is made in
    /// the private epoll instance instead (one `epoll_ctl`).
    #[inline(always)]
    pub(super) fn arm(
        &self,
        fd: RawFd,
        tag: Tag,
        interest: Interest,
        rearm: bool,
    ) -> Result<(), KernelError> {
        let user_data = pack64(tag.slot, tag.generation);
        let events = poll_events(interest);
        let leader = {
            let mut guard = self.lock();
            let g = &mut *guard;
            let req = self.reqs.get_or_grow(tag.slot);
            let w = req.word.load(Ordering::Acquire);
            // The slot's word names the new request and counts it in flight
            // before it is pushed (another thread's enter may submit it at
            // once, and the leader take its completion); a failed push undoes
            // that.
            let now = u64::from(tag.generation) << 32 | PENDING | interest_flags(interest);
            if w & BUSY == 0 {
                // The commonest re-arm: the last request's completion was taken
                // (a delivery), nothing is pending and nothing rare kept. With
                // nothing of the slot in flight nobody else writes the word:
                // the leader writes it only as it takes a completion of the
                // slot's, and every other writer holds the mutex. So a plain
                // store, and no remove to push.
                req.word.store(now + ONE, Ordering::Release);
                if let Err(e) = self.push(g, &poll_add(fd, events, user_data)) {
                    swap_back(req, w);
                    return Err(e);
                }
                guard.unlock() & LEADER != 0
            } else if w & ODD != 0 {
                let queued = self.arm_odd(g, req, fd, tag, user_data, interest, rearm);
                let before = guard.unlock();
                queued? && before & LEADER != 0
            } else {
                // A poll request, where one of an earlier arming is pending or
                // in flight.
                let before = swap_in(req, w, now);
                if let Err(e) = self.push_arm(g, tag.slot, before, fd, events, user_data) {
                    swap_back(req, before);
                    return Err(e);
                }
                // The lock's release says whether a thread holds the ring: it
                // is ordered with the leader's own look at the queue (under the
                // lock), so one of the two submits what was pushed.
                guard.unlock() & LEADER != 0
            }
        };
        self.submit_for_leader(leader)
    }

    /// The pushes of a common arm: a remove of the request `before` names, if it
    /// is pending, then the poll request.
    #[inline(always)]
    fn push_arm(
        &self,
        g: &mut Shared,
        slot: u32,
        before: u64,
        fd: RawFd,
        events: u32,
        user_data: u64,
    ) -> Result<(), KernelError> {
        if before & PENDING != 0 {
            let remove = self.remove_entry(pack64(slot, generation(before)));
            self.push(g, &remove)?;
        }
        self.push(g, &poll_add(fd, events, user_data))
    }

    /// [`arm`](Self::arm) for a slot with state of the rare paths ([`Odd`]): a
    /// number the kernel reported closed, an arming the private epoll instance
    /// watches, a socket known half-closed, older requests queued again. Returns
    /// whether it queued a request (to submit if a thread holds the ring).
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn arm_odd(
        &self,
        g: &mut Shared,
        req: &Req,
        fd: RawFd,
        tag: Tag,
        user_data: u64,
        interest: Interest,
        rearm: bool,
    ) -> Result<bool, KernelError> {
        let slot = tag.slot;
        let events = poll_events(interest);
        let mut old = g.odd(slot);
        if rearm && old.lost {
            return Err(KernelError::NotFound);
        }
        if !rearm {
            // A registration's first arm (or its number's check after a
            // loss): what the slot knew of a socket no longer holds.
            old.half_closed = false;
        }
        let w = req.word.load(Ordering::Acquire);
        if w & PENDING != 0 {
            let remove = self.remove_entry(pack64(slot, generation(w)));
            self.push(g, &remove)?;
            req.word.fetch_and(!PENDING, Ordering::AcqRel);
        }
        // A poll request would complete at once with read-closed.
        let to_epoll = old.half_closed && events & libc::POLLIN as u32 == 0;
        let now = if old.via_epoll && !to_epoll {
            // Back to a poll request: the epoll entry must not report.
            self.epoll_forget(g, slot, fd)?;
            g.odd(slot)
        } else {
            old
        };
        // The new arming is the slot's latest, not pending yet.
        let latest = u64::from(tag.generation) << 32 | interest_flags(interest);
        let _ = req
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some(with_count(latest | (w & ODD), w))
            });
        let pending = Odd {
            via_epoll: now.via_epoll,
            ..now.idle()
        };
        let watched = to_epoll && {
            self.set_odd(g, slot, pending);
            match self.epoll_watch(g, slot) {
                Ok(Some(poll)) => {
                    self.push(g, &poll)?;
                    true
                }
                Ok(None) => return Ok(false),
                // epoll refuses the number: closed (EBADF) or reused by a
                // file it cannot poll (EPERM). A poll request does for it
                // what it does for any arming (-EBADF at submission, or an
                // always-ready completion), and the registration is no
                // longer known half-closed (a socket still half-closed
                // comes back here through its completion).
                Err(_) => false,
            }
        };
        if !watched {
            req.word.fetch_add(PENDING + ONE, Ordering::AcqRel);
            if let Err(e) = self.push(g, &poll_add(fd, events, user_data)) {
                req.word.fetch_sub(PENDING + ONE, Ordering::AcqRel);
                return Err(e);
            }
            // After a refusal, the slot as `epoll_watch` left it (its entry
            // may be there).
            let now = g.odd(slot);
            self.set_odd(
                g,
                slot,
                Odd {
                    via_epoll: false,
                    in_epoll: pending.in_epoll || now.in_epoll,
                    half_closed: pending.half_closed && !to_epoll,
                    ..pending
                },
            );
        }
        Ok(true)
    }

    /// Removes the slot's pending request or epoll entry, if any. A disarm
    /// (`deregister` false) queues the remove, submitted at once only where
    /// another thread holds the ring; a deregister also waits until no request
    /// of the slot is left in the kernel (`depart.rs`). A refused push (a full
    /// submission queue whose submit the kernel refused) leaves the slot as it
    /// was, so the command can be made again.
    pub(super) fn remove(&self, fd: RawFd, tag: Tag, deregister: bool) -> Result<(), KernelError> {
        let slot = tag.slot;
        let leader = {
            let mut g = self.lock();
            let req = self.reqs.get_or_grow(slot);
            if req.word.load(Ordering::Acquire) & ODD != 0 {
                // Nothing of the registration outlives a disarm or deregister in
                // the private epoll instance.
                self.epoll_forget(&mut g, slot, fd)?;
                let odd = g.odd(slot);
                self.set_odd(
                    &mut g,
                    slot,
                    Odd {
                        lost: odd.lost,
                        ..odd.idle()
                    },
                );
                if odd.lost {
                    // As epoll answers for a descriptor it dropped at close: EBADF
                    // while the number is closed, ENOENT once it names a
                    // descriptor again.
                    drop(g);
                    return Err(match rustix::io::fcntl_getfd(fd_ref(fd)) {
                        Err(Errno::BADF) => KernelError::BadFd,
                        _ => KernelError::NotFound,
                    });
                }
            }
            let w = req.word.load(Ordering::Acquire);
            if w & PENDING != 0 {
                let remove = self.remove_entry(pack64(slot, generation(w)));
                self.push(&mut g, &remove)?;
                req.word.fetch_and(!PENDING, Ordering::AcqRel);
            }
            if deregister {
                // A request removed earlier (a disarm, a re-arm) may not have
                // ended either.
                let left = inflight(req.word.load(Ordering::Acquire)) > 0;
                drop(g);
                return if left { self.depart(slot) } else { Ok(()) };
            }
            if w & PENDING == 0 {
                return Ok(());
            }
            g.unlock() & LEADER != 0
        };
        self.submit_for_leader(leader)
    }
}

/// Makes `now` (a generation and flags) the slot's word, with one more request
/// counted in flight, where requests of the slot are in flight (the leader may
/// take their completions meanwhile: a compare-and-swap); `w` is the word as
/// the caller read it, under the mutex. Returns the word before.
#[inline(always)]
fn swap_in(req: &Req, mut w: u64, now: u64) -> u64 {
    loop {
        match req.word.compare_exchange_weak(
            w,
            with_count(now, w) + ONE,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(before) => return before,
            Err(seen) => w = seen,
        }
    }
}

/// Undoes [`swap_in`] after a refused push: the word `before` named, less the
/// request counted (meanwhile the leader may have taken completions of the
/// earlier requests: their counts stay taken).
#[cold]
fn swap_back(req: &Req, before: u64) {
    let _ = req
        .word
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            Some(with_count(before, w) - ONE)
        });
}
