//! The backend's bookkeeping, under its one mutex ([`Shared`]): the change records
//! queued to ride on the next waiting call, the records handed to `kevent` calls
//! that have not returned (so that changes to one descriptor reach the kernel in
//! the order they were made), the backend's view of each registration, and the rule
//! that decides how a command's records travel ([`Shared::route`]). No system call
//! is made here: `backend.rs` makes them.

use super::changes::{Action, Change, Filter, Filters, Knotes};
use crate::backend::{RawEvent, Tag};
use crate::token::{incarnation_in_usize, unpack_usize};
use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;

/// Queued changes past which the queue is flushed by change-only calls, so a
/// thread that changes registrations without ever waiting cannot grow it.
const QUEUE_MAX: usize = 1024;

/// A change record and whose it is: the registration's slot and the sequence
/// number of the command that made it (see [`View::seq`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Record {
    pub(super) change: Change,
    pub(super) slot: u32,
    pub(super) seq: u32,
}

pub(super) const NO_RECORD: Record = Record {
    change: Change {
        fd: -1,
        filter: Filter::Read,
        action: Action::Delete,
        udata: 0,
    },
    slot: 0,
    seq: 0,
};

/// The backend's view of one registration.
#[derive(Clone, Copy, Debug)]
pub(super) struct View {
    pub(super) incarnation: u32,
    pub(super) knotes: Knotes,
    /// Bumped by every command: an answer or an event read for an older
    /// sequence number no longer describes the registration.
    pub(super) seq: u32,
    /// The sequence number when a kernel event was last read for it, and the
    /// filters read since (`EV_DISPATCH` disabled them).
    pub(super) fired_at: Option<u32>,
    pub(super) fired: Filters,
}

/// What the mutex guards: the queue, the views and who is in the kernel.
#[derive(Debug, Default)]
pub(super) struct Shared {
    /// Changes waiting to ride on the next waiting call.
    pub(super) pending: VecDeque<Record>,
    /// Records per descriptor handed to a `kevent` call that has not returned
    /// (carried by a waiter, or in a change-only call): the kernel may not
    /// have applied them yet. See [`Shared::clear_to_go`].
    inflight: HashMap<RawFd, Held>,
    pub(super) views: HashMap<u32, View>,
    /// Threads between taking the queue and leaving `kevent`.
    pub(super) waiters: usize,
    /// Events for the next wait: error events for refused changes found outside
    /// a wait, and kernel events a wait had no room for.
    pub(super) deferred: Vec<RawEvent>,
}

/// Records of one descriptor in calls that have not returned.
#[derive(Clone, Copy, Debug, Default)]
struct Held {
    all: u32,
    /// Those whose order matters: adds, disables, deletes.
    ordered: u32,
}

impl Shared {
    /// Whether `r` may reach the kernel before records of its descriptor that
    /// are in calls that have not returned. Enables commute with enables (the
    /// knote ends enabled whichever lands first; a late one at worst causes one
    /// event the table drops as stale), so an enable or add may pass enables;
    /// anything else waits behind (a disable overtaken by an enable would leave
    /// an armed registration disabled).
    pub(super) fn clear_to_go(&self, r: &Record) -> bool {
        match self.inflight.get(&r.change.fd) {
            None => true,
            Some(h) => h.ordered == 0 && matches!(r.change.action, Action::Enable | Action::Add),
        }
    }

    pub(super) fn view(&mut self, tag: Tag) -> &mut View {
        let fresh = |seq| View {
            incarnation: tag.incarnation,
            knotes: Knotes::NONE,
            seq,
            fired_at: None,
            fired: Filters::NONE,
        };
        let v = self.views.entry(tag.slot).or_insert(fresh(0));
        if v.incarnation != tag.incarnation {
            // The slot now holds a new registration.
            *v = fresh(v.seq);
        }
        v
    }

    /// The view `rec` was made for, if no later command changed it.
    pub(super) fn current(&mut self, rec: &Record) -> Option<&mut View> {
        let inc = unpack_usize(rec.change.udata).1;
        self.views
            .get_mut(&rec.slot)
            .filter(|v| incarnation_in_usize(v.incarnation) == inc && v.seq == rec.seq)
    }

    pub(super) fn hold(&mut self, r: &Record) {
        let h = self.inflight.entry(r.change.fd).or_default();
        h.all += 1;
        h.ordered += u32::from(r.change.action != Action::Enable);
    }

    pub(super) fn release(&mut self, r: &Record) {
        if let Some(h) = self.inflight.get_mut(&r.change.fd) {
            h.all -= 1;
            h.ordered -= u32::from(r.change.action != Action::Enable);
            if h.all == 0 {
                self.inflight.remove(&r.change.fd);
            }
        }
    }

    /// Takes queued records for a change-only call: those of `fd`, or (when the
    /// queue is too long) every one whose descriptor is not in a call. Order
    /// per descriptor is kept. The records taken are held in `inflight`.
    fn take_pending(&mut self, fd: RawFd, batch: &mut Batch) {
        if self.pending.is_empty() {
            return;
        }
        let all = self.pending.len() >= QUEUE_MAX;
        let mut rest = VecDeque::with_capacity(self.pending.len());
        while let Some(r) = self.pending.pop_front() {
            let f = r.change.fd;
            if f == fd
                || (all
                    && !self.inflight.contains_key(&f)
                    && !rest.iter().any(|q: &Record| q.change.fd == f))
            {
                batch.push(r);
            } else {
                rest.push_back(r);
            }
        }
        self.pending = rest;
    }

    /// Moves up to `room` deferred events to `out`.
    pub(super) fn take_deferred(&mut self, out: &mut Vec<RawEvent>, room: usize) {
        let n = self.deferred.len().min(room);
        out.extend(self.deferred.drain(..n));
    }

    /// Decides how `own` (records for one descriptor) travel. Under the lock.
    ///
    /// - its descriptor has records in a `kevent` call that has not returned,
    ///   which it may not overtake ([`Shared::clear_to_go`]): queue behind them
    ///   (and wake a blocked waiter to carry them);
    /// - it adds a knote, or a thread is blocked in `kevent`, or the queue is
    ///   full: submit now, the descriptor's queued records first;
    /// - otherwise: queue, to ride on the next waiting call.
    pub(super) fn route(&mut self, own: &[Record]) -> Route {
        let Some(fd) = own.first().map(|r| r.change.fd) else {
            return Route::Queued { wake: false };
        };
        let adds = own.iter().any(|r| r.change.action == Action::Add);
        if !own.iter().all(|r| self.clear_to_go(r)) {
            self.pending.extend(own.iter().copied());
            return Route::Queued {
                wake: self.waiters > 0,
            };
        }
        if !(adds || self.waiters > 0 || self.pending.len() >= QUEUE_MAX) {
            self.pending.extend(own.iter().copied());
            return Route::Queued { wake: false };
        }
        let mut batch = Batch::new();
        self.take_pending(fd, &mut batch);
        for r in own {
            batch.push(*r);
        }
        for r in batch.as_slice() {
            self.hold(r);
        }
        Route::Now(batch)
    }
}

/// A few records, inline unless a command takes queued records along.
#[derive(Debug)]
pub(super) enum Batch {
    Inline([Record; 2], usize),
    Heap(Vec<Record>),
}

impl Batch {
    pub(super) fn new() -> Batch {
        Batch::Inline([NO_RECORD; 2], 0)
    }

    pub(super) fn push(&mut self, r: Record) {
        match self {
            Batch::Inline(items, len) if *len < items.len() => {
                items[*len] = r;
                *len += 1;
            }
            Batch::Inline(items, len) => {
                let mut v = items[..*len].to_vec();
                v.push(r);
                *self = Batch::Heap(v);
            }
            Batch::Heap(v) => v.push(r),
        }
    }

    pub(super) fn as_slice(&self) -> &[Record] {
        match self {
            Batch::Inline(items, len) => &items[..*len],
            Batch::Heap(v) => v,
        }
    }
}

/// How a command's records travel.
pub(super) enum Route {
    /// Queued for the next waiting call; `wake`: wake a blocked waiter to carry it.
    Queued { wake: bool },
    /// Submit now, in this order (queued records of the descriptor first).
    Now(Batch),
}
