//! The event path of [`Poller`]: [`Poller::deliver`], and what it runs on (the
//! [`Source`] of `src/wake.rs`'s loop): one backend wait whose kernel events are
//! checked against the table as the backend reads them, and the queue of
//! synthetic events for always-ready registrations.
//!
//! A child module of `src/poller.rs`, for the poller's private fields. The arm
//! side of the synthetic queue (`Poller::queue_synthetic`) stays there, with the
//! arm that calls it.

use super::{lock, Poller};
use crate::backend::{Backend, EventSink, RawEvent, Tag};
use crate::deadline::Countdown;
use crate::event::{Event, Events, Readiness};
use crate::interest::Interest;
use crate::stats::Count;
use crate::table::Delivery;
use crate::token::Token;
use crate::wake::{self, Fetched, Notifies, Source};
use std::io;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl<B: Backend> Poller<B> {
    /// Waits for events and delivers each to this caller: fills `events` (cleared
    /// first) with at most `events.capacity()` of them and returns how many.
    ///
    /// Each delivered event completes one arming and leaves its registration
    /// disarmed. Events for deregistered, disarmed or re-armed registrations (a stale
    /// generation) are dropped, never delivered, and a wait that fetched only such
    /// events goes on waiting for the time left: `deliver` does not return empty for
    /// them. While always-ready registrations have synthetic events queued, they and
    /// the kernel's events take turns at filling the buffer first, so that neither
    /// starves the other.
    ///
    /// # Returns
    /// - `Ok(n)` with `n >= 1`: `n` events (a [`notify`](Self::notify) may have been
    ///   consumed too: [`Events::is_notified`]).
    /// - `Ok(0)` with [`Events::is_notified`] true: a notify ended the wait.
    /// - `Ok(0)` with [`Events::is_shutdown`] true: the poller is shut down
    ///   ([`shutdown`](Self::shutdown)); events taken before it saw that come with
    ///   `Ok(n)`, also marked shut down.
    /// - `Ok(0)` with both false: the timeout passed.
    ///
    /// `deliver(None)` never returns `Ok(0)` without a notify or a shutdown.
    ///
    /// # Timeouts
    /// The deadline is taken once, on entry; every wait inside the call (one per
    /// kernel wake-up) waits only for the time left.
    /// - `None` blocks until an event or a notify.
    /// - `Some(Duration::ZERO)` never blocks.
    /// - Anything else waits at least that long: epoll uses `epoll_pwait2(2)` (a
    ///   timespec, exact) for timeouts that are not whole milliseconds where the
    ///   kernel has it, else rounds *up* to the next millisecond; kqueue passes a
    ///   timespec; the poll(2) backend uses `ppoll(2)` with a timespec on Linux and
    ///   milliseconds rounded up elsewhere. A nonzero timeout is never
    ///   rounded to 0, and a huge one (`Duration::MAX`) is clamped, not refused.
    ///
    /// # Errors
    /// - `ErrorKind::Interrupted` (EINTR): a signal arrived before any event. The
    ///   call returns, so that the caller can look at what its signal handler set;
    ///   call again to keep waiting, with the time the caller has left (as for
    ///   `std::io::Read`, whose callers already loop on `Interrupted`). Events
    ///   already taken are never dropped for a signal: they are returned as `Ok`.
    ///   On [`backends::Uring`](crate::backends) it can also come with no signal, though
    ///   rarely: 30 times in 1.2 million round trips in the pingpong bench at 2 threads.
    ///   The kernel's task work can end a wait whose enter also submitted arms, and
    ///   that looks the same as a signal. So treat `Interrupted` as "call again",
    ///   never as proof that a signal came.
    /// - `ErrorKind::Other`: in a forked child before
    ///   [`reinit_after_fork`](Self::reinit_after_fork).
    /// - the kernel's error from the wait otherwise (EBADF, EFAULT, EINVAL: not
    ///   expected), with its errno.
    #[inline(always)]
    pub fn deliver(&self, events: &mut Events, timeout: Option<Duration>) -> io::Result<usize> {
        self.check_fork("deliver")?;
        // No deadline: nothing to count down (and nothing kept in memory for it).
        if timeout.is_none() {
            return wake::deliver(self, events, || None);
        }
        // The deadline is taken at the first wait: one clock read, none for zero,
        // and one more per wait that goes round.
        let countdown = Countdown::new(timeout);
        wake::deliver(self, events, || countdown.left())
    }

    /// Checks kernel events against the table; current ones are delivered
    /// ([`accept_one`](Self::accept_one) each).
    #[cfg(all(test, not(loom), any(target_os = "linux", target_os = "android")))]
    fn accept_into(&self, raw: &[RawEvent], events: &mut Vec<Event>) {
        for &ev in raw {
            self.accept_one(ev, events);
        }
    }

    /// Checks one kernel event against the table; a current one is delivered.
    /// One table access ([`Table::deliver`]).
    #[inline(always)]
    fn accept_one(&self, ev: RawEvent, events: &mut Vec<Event>) {
        // A packet the user posted (Windows): no registration's, never stale.
        #[cfg(windows)]
        if ev.readiness.contains(Readiness::POSTED) {
            events.push(Event {
                token: Token::POSTED,
                key: crate::token::pack64(ev.slot, ev.stamp) as usize,
                readiness: ev.readiness,
            });
            return;
        }
        // Current: the stamp names the arming in force (the generation), or
        // the registration (the incarnation, where the table's phase
        // decides). Only a current event may be merged into a delivery.
        // A taken event is pushed under the slot's lock, straight from the
        // slot's words.
        let push = |token, interest: Interest, key| {
            events.push(Event {
                token,
                key,
                readiness: ev.readiness.for_interest(interest),
            })
        };
        let delivery = if B::TAG_IS_GENERATION {
            self.table.deliver(
                ev.slot as usize,
                |generation, _| ev.stamp == generation,
                push,
            )
        } else {
            self.table.deliver(
                ev.slot as usize,
                |_, token| ev.stamp == stamp_of(token),
                push,
            )
        };
        match delivery {
            Delivery::Taken { token, interest } => {
                let t = Tag {
                    slot: ev.slot,
                    incarnation: token.incarnation(),
                    generation: 0,
                };
                let fd = crate::raw::fd_at(ev.slot as usize);
                self.backend.delivered(fd, t, interest, ev.readiness);
            }
            // kqueue: the other filter of a registration delivered in this
            // same call is part of that delivery, not a stale event.
            Delivery::Current(token)
                if B::SPLIT_FILTERS && Events::merge(events, token, ev.readiness) => {}
            _ => self.backend.counters().one(Count::Stale),
        }
    }

    /// [`accept_into`](Self::accept_into) the list of `events` (the key tests:
    /// events fetched before a change to the registration).
    #[cfg(all(test, not(loom), any(target_os = "linux", target_os = "android")))]
    pub(super) fn accept(&self, raw: &[RawEvent], events: &mut Events) {
        self.accept_into(raw, events.split().1);
    }

    /// Moves queued synthetic events that are still current into `events`, up to
    /// its room. Stale entries (an arming since disarmed, re-armed or deregistered)
    /// are dropped and take no room, so they cannot hide a current entry behind
    /// them.
    fn take_synthetic(&self, events: &mut Events) {
        let mut taken = Vec::new();
        while events.remaining() > 0 {
            {
                let mut queue = lock(&self.synthetic);
                let n = queue.len().min(events.remaining());
                taken.clear();
                taken.extend(queue.drain(..n));
                if queue.is_empty() {
                    self.notifies.synthetic_drained();
                }
            }
            if taken.is_empty() {
                return;
            }
            // The synthetic lock is released before any slot's: arm takes them
            // in the other order.
            // The same slot access as a kernel event's (`Table::deliver`): current
            // when the queued generation is the arming in force.
            for &(slot, generation) in &taken {
                let push = |token, interest, key| {
                    events.push(Event {
                        token,
                        key,
                        readiness: synthetic_readiness(interest),
                    })
                };
                match self
                    .table
                    .deliver(slot as usize, |g, _| g == generation, push)
                {
                    Delivery::Taken { .. } => {}
                    _ => self.backend.counters().one(Count::Stale),
                }
            }
        }
    }
}

/// The stamp a current event for `token` carries on a backend whose tag is the
/// slot and its incarnation (as it survives packing into `udata`).
fn stamp_of(token: Token) -> u32 {
    crate::token::incarnation_in_usize(token.incarnation())
}

/// What a synthetic event for an always-ready descriptor reports: the interest.
fn synthetic_readiness(interest: Interest) -> Readiness {
    let mut r = Readiness::EMPTY;
    if interest.is_readable() {
        r.insert(Readiness::READABLE);
    }
    if interest.is_writable() {
        r.insert(Readiness::WRITABLE);
    }
    r
}

/// One wait's kernel events, checked into the list of delivered events as the
/// backend reads them ([`Poller::accept_one`]).
struct Accept<'a, B: Backend> {
    poller: &'a Poller<B>,
    list: &'a mut Vec<Event>,
    /// `Events` once the wait fetched any kernel event (current or stale).
    fetched: Fetched,
}

impl<B: Backend> EventSink for Accept<'_, B> {
    #[inline(always)]
    fn event(&mut self, ev: RawEvent) {
        self.fetched = Fetched::Events;
        self.poller.accept_one(ev, self.list);
    }
}

/// The loop of [`Poller::deliver`] (`wake::deliver`, shared with the loom model)
/// runs on this poller's synthetic queue and backend.
impl<B: Backend> Source for Poller<B> {
    #[inline(always)]
    fn notifies(&self) -> &Notifies {
        &self.notifies
    }

    #[inline(always)]
    fn kernel_turn(&self) -> bool {
        self.kernel_turn.fetch_xor(true, Ordering::Relaxed)
    }

    #[inline(always)]
    fn take_synthetic(&self, events: &mut Events) {
        Poller::take_synthetic(self, events);
    }

    #[inline(always)]
    fn wait(&self, events: &mut Events, timeout: Option<Duration>) -> io::Result<Fetched> {
        let max = events.remaining();
        let (raw, list) = events.split();
        let mut accept = Accept {
            poller: self,
            list,
            fetched: Fetched::Nothing,
        };
        let waited = self.backend.wait_each(raw, max, timeout, &mut accept);
        Ok(if waited? {
            Fetched::Woken
        } else {
            accept.fetched
        })
    }

    #[inline(always)]
    fn wake(&self) -> io::Result<()> {
        self.backend.wake()
    }
}
