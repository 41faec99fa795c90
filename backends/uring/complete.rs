//! Completion routing: each completion taken from the queue is the delivery of
//! the current arming or a stale one (both taken against the slot's word alone,
//! without the mutex), or, under the mutex, the waker's, a remove's answer, a
//! cancelled request to queue again, the private epoll's, or a current one that
//! needs more than its word (an error, `POLLERR`, a half-closed socket's).

use super::ring::{fd_ref, waker_poll, Odd, Ring, Shared, EPOLL_SLOT, REMOVE, WAKER};
use super::slots::{self, Req, GENERATION, ODD, ONE, PENDING, READS};
use super::submit::poll_add;
use crate::backend::{EventSink, RawEvent};
use crate::event::Readiness;
use crate::state::KernelError;
use crate::stats::Count;
use crate::token::unpack64;
use io_uring::{cqueue, squeue};
use rustix::event::{PollFd, PollFlags};
use rustix::fd::RawFd;
use std::io;
use std::sync::atomic::Ordering;

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

/// What [`Ring::take_other`] made of a completion.
enum Other {
    /// The current request's event.
    Event(RawEvent),
    /// A stale completion, counted.
    Stale,
    /// For [`Ring::take_rare`].
    Rare,
}

/// What [`Ring::take_common`] did with a completion.
enum Taken {
    /// An event went to the sink.
    Event,
    /// A stale completion, counted.
    Nothing,
    /// For [`Ring::take_rare`].
    Rare,
}

pub(super) fn kernel_io(e: KernelError) -> io::Error {
    match e {
        KernelError::Other(e) => e,
        _ => io::Error::other("pollshot io_uring backend: unexpected answer"),
    }
}

impl Ring {
    /// Takes completions from the queue, handing at most `room` events to
    /// `sink`: the common one against its slot's word without the mutex
    /// ([`take_common`](Self::take_common)), any other under it
    /// ([`route`](Self::route)). Called by the leader only (`handover.rs`):
    /// nobody else moves the queue's head meanwhile.
    #[inline(always)]
    pub(super) fn reap<S: EventSink>(&self, sink: &mut S, room: usize) -> io::Result<usize> {
        // SAFETY: the leader's only: no other completion queue handle exists
        // while it holds the ring. Dropped (its head synced) before returning,
        // on every path.
        let mut cq = unsafe { self.ring.completion_shared() };
        if cq.is_empty() {
            // Nothing taken: no head to write back (the drop would store it).
            std::mem::forget(cq);
            return Ok(0);
        }
        let mut taken = 0;
        while taken < room {
            let Some(cqe) = cq.next() else { break };
            match self.take_common(&cqe, sink) {
                Taken::Event => taken += 1,
                Taken::Nothing => {}
                Taken::Rare => match self.take_rare(&cqe, room - taken) {
                    Ok(out) => {
                        taken += out.len();
                        for ev in out {
                            sink.event(ev);
                        }
                    }
                    Err(e) => {
                        self.count_reap();
                        drop(cq);
                        return Err(e);
                    }
                },
            }
        }
        self.count_reap();
        drop(cq);
        Ok(taken)
    }

    /// Counts one more reap that found completions posted (the leader's
    /// only). It took at least one (`room` is at least 1): an unchanged count
    /// is all the signal test asks (`handover.rs`), and one increment per reap
    /// is cheaper than the count of completions taken.
    #[inline(always)]
    fn count_reap(&self) {
        self.reaped.store(
            self.reaped.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
    }

    /// The common completion of a slot's request, against the slot's word
    /// alone: the current request of an arming that reads, nothing rare kept
    /// for the slot, fired with `POLLIN`, `POLLPRI` or `POLLOUT` alone, is
    /// delivered to `sink` with one compare of the word; anything else goes to
    /// [`take_other`](Self::take_other).
    #[inline(always)]
    fn take_common<S: EventSink>(&self, cqe: &cqueue::Entry, sink: &mut S) -> Taken {
        let user_data = cqe.user_data();
        let slot = user_data as u32;
        // The waker's, the removes' and the private epoll's (slot `u32::MAX`)
        // have no record.
        let Some(req) = self.reqs.get(slot) else {
            return Taken::Rare;
        };
        let bits = cqe.result() as u32;
        // The word of the request's arming while it is pending: its
        // generation (the high half of `user_data`), PENDING and READS, no ODD.
        let current = (user_data & GENERATION) | PENDING | READS;
        let w = req.word.load(Ordering::Acquire);
        // A negative result is above PLAIN as unsigned, and so is POLLERR.
        if (w ^ current) & (GENERATION | PENDING | READS | ODD) == 0 && bits <= PLAIN {
            // Delivered: no request of the arming is pending any more (the
            // word has PENDING, so clearing it is a subtraction).
            if req
                .word
                .compare_exchange(w, w - PENDING - ONE, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                sink.event(RawEvent {
                    slot,
                    stamp: (user_data >> 32) as u32,
                    readiness: PLAIN_READINESS[(bits & PLAIN) as usize],
                });
                return Taken::Event;
            }
        }
        match self.take_other(req, cqe) {
            Other::Event(ev) => {
                sink.event(ev);
                Taken::Event
            }
            Other::Stale => Taken::Nothing,
            Other::Rare => Taken::Rare,
        }
    }

    /// A slot's completion that [`take_common`](Self::take_common) did not
    /// take at once, still against the slot's word alone: the current request,
    /// fired with readiness its arming asks for, is an event; a request that is
    /// not the current one (removed, re-armed, deregistered) is stale. Either
    /// is one request fewer in flight. Anything else (an error, a cancelled
    /// current request, a slot with rare state) is [`Other::Rare`], for the
    /// mutex. (Out of line, it is handed no sink: one that a call out of line
    /// is handed must live in memory, also on the common path.)
    #[inline(never)]
    fn take_other(&self, req: &Req, cqe: &cqueue::Entry) -> Other {
        let (slot, generation) = unpack64(cqe.user_data());
        let res = cqe.result();
        let bits = res as u32;
        let mut w = req.word.load(Ordering::Acquire);
        loop {
            if w & PENDING == 0 || slots::generation(w) != generation {
                // Not the slot's current request: fired before its remove was
                // processed, the remove's answer, or for a freed slot.
                req.word.fetch_sub(ONE, Ordering::AcqRel);
                self.counters.one(Count::Stale);
                return Other::Stale;
            }
            if w & ODD != 0
                || res < 0
                || bits & libc::POLLERR as u32 != 0
                || (w & READS == 0 && bits & ANSWERED == 0)
            {
                return Other::Rare;
            }
            // Delivered: no request of the arming is pending any more.
            match req.word.compare_exchange_weak(
                w,
                (w & !PENDING) - ONE,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => w = now,
            }
        }
        Other::Event(RawEvent {
            slot,
            stamp: generation,
            readiness: if bits & !PLAIN == 0 {
                PLAIN_READINESS[bits as usize]
            } else {
                Readiness::from_epoll(bits)
            },
        })
    }

    /// A completion [`take_common`](Self::take_common) left, routed under the
    /// mutex; the entry it answers is queued. Returns its events (at most
    /// `room`), for the caller to hand to its sink once the mutex is released
    /// (the sink takes the table's slot locks, which an arm holds while it
    /// takes the mutex).
    #[cold]
    #[inline(never)]
    fn take_rare(&self, cqe: &cqueue::Entry, room: usize) -> io::Result<Vec<RawEvent>> {
        let mut out = Vec::new();
        {
            let mut g = self.lock();
            if let Some(entry) = self.route(&mut g, cqe, &mut out, room) {
                if let Err(e) = self.push(&mut g, &entry) {
                    let (slot, _) = unpack64(entry.get_user_data());
                    if let Some(req) = self.reqs.get(slot).filter(|_| slot != EPOLL_SLOT) {
                        // A request queued again that could not be: the arming
                        // is lost, and nothing of it is in flight.
                        req.word.fetch_sub(ONE, Ordering::AcqRel);
                        req.word.fetch_and(!PENDING, Ordering::AcqRel);
                    }
                    return Err(kernel_io(e));
                }
            }
        }
        Ok(out)
    }

    /// One completion, under the mutex, with room for `room` events in `out`.
    /// Returns the entry to queue: again for a cancelled current request (the
    /// thread that submitted it exited), or the poll on the private epoll
    /// instance.
    fn route(
        &self,
        g: &mut Shared,
        cqe: &cqueue::Entry,
        out: &mut Vec<RawEvent>,
        room: usize,
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
        if slot == EPOLL_SLOT {
            if generation != g.epoll_poll {
                // An older poll, removed when a submitting thread exited.
                return None;
            }
            g.epoll_poll = 0;
            if res != -libc::ECANCELED {
                self.epoll_take(g, out, room);
            }
            // Its submitting thread exited (-ECANCELED), or armings are left: again.
            return self.epoll_poll(g);
        }
        let req = self.reqs.get(slot)?;
        // One request fewer in flight, whichever it is.
        let w = req.word.fetch_sub(ONE, Ordering::AcqRel) - ONE;
        // A slot watched by the private epoll has no poll request pending: a
        // request with its tag is an older one.
        let current = w & PENDING != 0 && slots::generation(w) == generation;
        let mut odd = g.odd(slot);
        if res == -libc::ECANCELED {
            if !current {
                // The answer to a remove: the kernel's report for a disarmed or
                // deregistered arming, stale by generation.
                self.counters.one(Count::Stale);
                return None;
            }
            if odd.older > 0 {
                // An older request with this tag, removed when it was queued again.
                odd.older -= 1;
                self.set_odd(g, slot, odd);
                self.counters.one(Count::Stale);
                return None;
            }
            // The submitting thread exited: the arming still holds. Counted in
            // flight again (the caller pushes it).
            req.word.fetch_add(ONE, Ordering::AcqRel);
            return Some(poll_add(slots::fd_of(slot), slots::events_of(w), user_data));
        }
        if !current {
            // Fired before its remove was processed, or for a freed slot: stale.
            self.counters.one(Count::Stale);
            return None;
        }
        let (fd, events) = (slots::fd_of(slot), slots::events_of(w));
        // The arming's request is over: delivered, failed, or (below) moved
        // to the private epoll.
        req.word.fetch_and(!PENDING, Ordering::AcqRel);
        if res >= 0 && events & libc::POLLIN as u32 == 0 && res as u32 & ANSWERED == 0 {
            // A write-only arming completed with read-closed alone (the kernel adds
            // POLLRDHUP to every poll request): epoll would report nothing until
            // the socket is writable. The private epoll watches the rest of it.
            odd.half_closed = true;
            self.set_odd(g, slot, odd);
            match self.epoll_watch(g, slot) {
                Ok(poll) => return poll,
                Err(KernelError::BadFd) => {
                    // Closed since: as a request's -EBADF, below.
                    let odd = g.odd(slot);
                    self.set_odd(g, slot, Odd { lost: true, ..odd });
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
        let idle = odd.idle();
        if res == -libc::EBADF {
            // Closed before submission: dropped, as epoll drops a closed descriptor.
            self.set_odd(g, slot, Odd { lost: true, ..idle });
            return None;
        }
        if idle != odd {
            self.set_odd(g, slot, idle);
        }
        let readiness = if res >= 0 {
            let mut bits = res as u32;
            if bits & libc::POLLERR as u32 != 0 {
                bits = self.repoll(fd, events).unwrap_or(bits);
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
