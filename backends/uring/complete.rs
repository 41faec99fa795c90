//! Completion routing: each completion taken from the queue is the waker's, a
//! remove's answer, a cancelled request to queue again, the private epoll's, a
//! stale one, or the delivery of the current arming.

use super::ring::{fd_ref, waker_poll, Ring, Shared, EPOLL_SLOT, NONE, REMOVE, WAKER};
use crate::backend::RawEvent;
use crate::event::Readiness;
use crate::state::KernelError;
use crate::stats::Count;
use crate::token::unpack64;
use io_uring::{cqueue, opcode, squeue, types};
use rustix::event::{PollFd, PollFlags};
use rustix::fd::RawFd;
use std::io;

/// What a completion must carry for a write-only arming to be delivered: the rest
/// (`POLLRDHUP`, which the kernel adds to every poll request) is not about writing.
pub(super) const WRITE_BITS: u32 =
    (libc::POLLOUT | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) as u32;

/// What a write-only arming answers: [`WRITE_BITS`] and urgent data.
const ANSWERED: u32 = WRITE_BITS | libc::POLLPRI as u32;

/// `POLLIN | POLLPRI | POLLOUT`: a completion with these bits alone (the usual
/// one) is decoded by [`PLAIN_READINESS`].
const PLAIN: u32 = (libc::POLLIN | libc::POLLPRI | libc::POLLOUT) as u32;

/// [`Readiness::from_epoll`] of each combination of the [`PLAIN`] bits, by value.
const PLAIN_READINESS: [Readiness; 8] = {
    let mut t = [Readiness::EMPTY; 8];
    let mut i = 0;
    while i < 8 {
        t[i] = Readiness::from_epoll(i as u32);
        i += 1;
    }
    t
};

/// What a failed request reports: an error on both directions.
pub(super) const FAILED: Readiness = Readiness::ERROR
    .union(Readiness::READABLE)
    .union(Readiness::WRITABLE);

pub(super) fn kernel_io(e: KernelError) -> io::Error {
    match e {
        KernelError::Other(e) => e,
        _ => io::Error::other("pollshot io_uring backend: unexpected answer"),
    }
}

impl Ring {
    /// Takes completions into `out` (at most `max` in all), handling the waker's,
    /// the removes' and cancelled ones; with `flush`, a flagged overflow is
    /// flushed while there is room (else it is left for the caller's next
    /// `io_uring_enter` with `IORING_ENTER_GETEVENTS`, which flushes it). Returns
    /// whether completions are left in the queue. Called by the ring's leader
    /// (`handover.rs`) only, under the mutex.
    #[inline(always)]
    pub(super) fn reap_then(
        &self,
        g: &mut Shared,
        out: &mut Vec<RawEvent>,
        max: usize,
        flush: bool,
    ) -> io::Result<bool> {
        let before = out.len();
        loop {
            let left = {
                // SAFETY: under the mutex: the only completion queue handle. It is
                // dropped (its head synced) before the ring is entered here; the
                // pushes of `complete` touch only the submission queue (and a full
                // one's submit does not wait for completions).
                let mut cq = unsafe { self.ring.completion_shared() };
                while out.len() < max {
                    let Some(cqe) = cq.next() else { break };
                    g.reaped += 1;
                    if !self.deliver_current(g, &cqe, out) {
                        self.complete(g, &cqe, out, max)?;
                    }
                }
                !cq.is_empty()
            };
            // A reap that took events leaves a flagged overflow to the next one
            // (the flag stays set until flushed), which finds the queue empty.
            if left || out.len() >= max || out.len() > before || !flush {
                return Ok(left);
            }
            // SAFETY: under the mutex: the only submission queue handle; it only
            // reads the kernel's flags.
            let sq = unsafe { self.ring.submission_shared() };
            let overflow = sq.cq_overflow();
            // Nothing pushed: no tail to write back (the drop would store it).
            std::mem::forget(sq);
            if !overflow {
                return Ok(false);
            }
            self.flush_overflow()?;
        }
    }

    /// The kernel holds completions that did not fit: an enter with GETEVENTS
    /// moves them into the queue.
    #[cold]
    #[inline(never)]
    fn flush_overflow(&self) -> io::Result<()> {
        self.counters.one(Count::Wait);
        // SAFETY: no argument structure is passed (a null pointer).
        match unsafe {
            self.ring.submitter().enter::<libc::sigset_t>(
                0,
                0,
                io_uring::EnterFlags::GETEVENTS.bits(),
                None,
            )
        } {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The common completion: the current request of a slot's arming by poll
    /// request, fired with no error, for a readable arming or with a bit a
    /// write-only one answers. Delivered into `out` (which has room) and `true`;
    /// `false` (nothing done) for any other, which [`complete`](Self::complete)
    /// routes.
    #[inline(always)]
    fn deliver_current(
        &self,
        g: &mut Shared,
        cqe: &cqueue::Entry,
        out: &mut Vec<RawEvent>,
    ) -> bool {
        let user_data = cqe.user_data();
        let res = cqe.result();
        let (slot, generation) = unpack64(user_data);
        let i = slot as usize;
        // The waker's, the removes' and the private epoll's (slot `u32::MAX`) are
        // out of every table's range.
        let Some(p) = g.pending.get_mut(i) else {
            return false;
        };
        let bits = res as u32;
        if p.user_data != user_data
            || p.via_epoll
            || res < 0
            || bits & libc::POLLERR as u32 != 0
            || (p.events & libc::POLLIN as u32 == 0 && bits & ANSWERED == 0)
        {
            return false;
        }
        // Idle (`Pending::idle`): neither `via_epoll` (tested above) nor `lost`
        // (reset by every arm) is set on a slot with a request pending.
        debug_assert!(!p.lost);
        p.user_data = NONE;
        p.events = 0;
        p.older = 0;
        if std::mem::replace(&mut p.fast, false) {
            // The common arm's request (see `settle`).
            self.handover.settled();
        } else {
            self.settle_counted(g, slot);
        }
        out.push(RawEvent {
            slot,
            stamp: generation,
            readiness: if bits & !PLAIN == 0 {
                PLAIN_READINESS[bits as usize]
            } else {
                Readiness::from_epoll(bits)
            },
        });
        true
    }

    /// One completion, with room for it in `out` (at most `max` in all), routed
    /// by [`route`](Self::route); the entry it answers is queued.
    #[cold]
    #[inline(never)]
    fn complete(
        &self,
        g: &mut Shared,
        cqe: &cqueue::Entry,
        out: &mut Vec<RawEvent>,
        max: usize,
    ) -> io::Result<()> {
        if let Some(entry) = self.route(g, cqe, out, max) {
            self.push(g, &entry).map_err(kernel_io)?;
        }
        Ok(())
    }

    /// One completion, with room for it in `out` (at most `max` in all). Returns
    /// the entry to queue: again for a cancelled current request, or the poll on
    /// the private epoll instance.
    #[inline(always)]
    fn route(
        &self,
        g: &mut Shared,
        cqe: &cqueue::Entry,
        out: &mut Vec<RawEvent>,
        max: usize,
    ) -> Option<squeue::Entry> {
        let user_data = cqe.user_data();
        if user_data == WAKER {
            self.handover.unkick();
            if !cqueue::more(cqe.flags()) {
                // The multishot poll ended (a full queue, or cancelled): again.
                return Some(waker_poll(&self.waker));
            }
            return None;
        }
        if user_data == REMOVE {
            // 0: removed; -ENOENT or -EALREADY: its target had completed. Fine.
            return None;
        }
        let (slot, generation) = unpack64(user_data);
        let res = cqe.result();
        if slot != EPOLL_SLOT {
            self.settle(g, slot);
        }
        if slot == EPOLL_SLOT {
            if generation != g.epoll_poll {
                // An older poll, removed when a submitting thread exited.
                return None;
            }
            g.epoll_poll = 0;
            if res != -libc::ECANCELED {
                self.epoll_take(g, out, max - out.len());
            }
            // Its submitting thread exited (-ECANCELED), or armings are left: again.
            return self.epoll_poll(g);
        }
        // A slot watched by the private epoll has no poll request of its own: a
        // request with its tag is an older one.
        let current = g
            .pending
            .get(slot as usize)
            .is_some_and(|p| p.user_data == user_data && !p.via_epoll);
        if res == -libc::ECANCELED {
            if !current {
                // The answer to a remove: the kernel's report for a disarmed or
                // deregistered arming, stale by generation.
                self.counters.one(Count::Stale);
                return None;
            }
            let p = &mut g.pending[slot as usize];
            if p.older > 0 {
                // An older request with this tag, removed when it was queued again.
                p.older -= 1;
                self.counters.one(Count::Stale);
                return None;
            }
            // The submitting thread exited: the arming still holds.
            let p = *p;
            return Some(
                opcode::PollAdd::new(types::Fd(p.fd), p.events)
                    .build()
                    .user_data(user_data),
            );
        }
        if !current {
            // Fired before its remove was processed, or for a freed slot: stale.
            self.counters.one(Count::Stale);
            return None;
        }
        let p = g.pending[slot as usize];
        if res >= 0 && p.events & libc::POLLIN as u32 == 0 && res as u32 & ANSWERED == 0 {
            // A write-only arming completed with read-closed alone (the kernel adds
            // POLLRDHUP to every poll request): epoll would report nothing until
            // the socket is writable. The private epoll watches the rest of it.
            g.pending[slot as usize].half_closed = true;
            match self.epoll_watch(g, slot) {
                Ok(poll) => return poll,
                Err(KernelError::BadFd) => {
                    // Closed since: as a request's -EBADF, below.
                    g.pending[slot as usize].lost = true;
                    return None;
                }
                Err(_) => {
                    // No way to watch it (ENOMEM, ENOSPC: max_user_watches): an
                    // error event, which a write then explains.
                    out.push(RawEvent {
                        slot,
                        stamp: generation,
                        readiness: FAILED,
                    });
                    return None;
                }
            }
        }
        g.pending[slot as usize] = p.idle();
        if res == -libc::EBADF {
            // Closed before submission: dropped, as epoll drops a closed descriptor.
            g.pending[slot as usize].lost = true;
            return None;
        }
        let readiness = if res >= 0 {
            let mut bits = res as u32;
            if bits & libc::POLLERR as u32 != 0 {
                bits = self.repoll(p.fd, p.events).unwrap_or(bits);
            }
            Readiness::from_epoll(bits)
        } else {
            FAILED
        };
        out.push(RawEvent {
            slot,
            stamp: generation,
            readiness,
        });
        None
    }

    /// The descriptor's state now, as epoll would report it: one poll(2) with
    /// timeout 0 for `events` (the kernel adds `POLLERR | POLLHUP`), or `None`
    /// when it reports nothing or `POLLNVAL`.
    ///
    /// A poll request completes with the mask of the wake-up that fired it, when
    /// the wake-up carries one (`io_poll_wake` in io_uring/poll.c hands the key to
    /// `__io_poll_execute`, and `io_poll_check_events` polls the file again only
    /// when there is none), where epoll polls the file again as it reports
    /// (`ep_item_poll` in fs/eventpoll.c). The two differ where a socket's
    /// wake-up says less than its state: `tcp_disconnect` ends with
    /// `sk_error_report`, whose wake-up key is `EPOLLERR` alone, so a listening
    /// socket shut down while armed completed with `POLLERR`, no error pending,
    /// where poll(2) and epoll report `POLLIN | POLLHUP | POLLRDHUP`. So a
    /// completion with `POLLERR` is replaced by the state now (errors are rare:
    /// one poll(2) each, counted in `Stats::ctl_calls`: it waits for nothing).
    fn repoll(&self, fd: RawFd, events: u32) -> Option<u32> {
        let flags = PollFlags::from_bits_truncate(events as _);
        let mut fds = [PollFd::from_borrowed_fd(fd_ref(fd), flags)];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        self.counters.one(Count::CtlCall);
        let n = rustix::event::poll(&mut fds, Some(&zero)).ok()?;
        let revents = fds[0].revents();
        if n != 1 || revents.contains(PollFlags::NVAL) {
            return None;
        }
        Some(u32::from(revents.bits()))
    }
}
