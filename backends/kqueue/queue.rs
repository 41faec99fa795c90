//! The backend's bookkeeping, under its one mutex ([`Queue`]): the change records
//! queued to ride on the next waiting call, the records handed to `kevent` calls
//! that have not returned (so that changes to one descriptor reach the kernel in
//! the order they were made), the backend's view of each registration, and the
//! rules that decide how a command's records travel ([`Shared::route`],
//! [`Queue::drain`]). No system call is made here: `backend.rs` makes them.
//!
//! # Ownership
//!
//! Every record is routed (queued, or held as in flight) under the same lock
//! acquisition that made it, so a record exists only while its registration's
//! view does. A deregistration removes the view, then [`Queue::drain`]s its
//! descriptor: it waits until no call carries a record of it (waking a blocked
//! waiter that does), keeps waiters from carrying its queued records meanwhile,
//! and then takes those queued records ahead of its own `EV_DELETE`s into one
//! change-only call that it makes itself. When `deregister` returns, no record of
//! that descriptor is queued or in any `kevent` call: nothing the poller sends
//! later can land on a new description that reuses the number.
//!
//! The module compiles on every target (it is pure bookkeeping) so that its
//! ordering and ownership rules are model-checked with loom on Linux
//! (`RUSTFLAGS="--cfg loom" cargo test --release --lib loom_`); the one
//! std/loom switch is [`sync`].

use super::changes::{Action, Change, Filter, Filters, Knotes};
use crate::backend::{RawEvent, Tag};
use crate::token::pack_usize;
use std::collections::{HashMap, VecDeque};
// A kevent ident for a descriptor: `RawFd` on Unix; the same `c_int` elsewhere,
// where only the pure translation is compiled.
use std::ffi::c_int as RawFd;
use std::sync::PoisonError;

/// The synchronisation primitives: std's, or loom's in the `--cfg loom` unit
/// tests (`queue_loom.rs`). The one place the switch is made.
pub(super) mod sync {
    #[cfg(all(test, loom))]
    pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
    #[cfg(not(all(test, loom)))]
    pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
}

use sync::{Condvar, Mutex, MutexGuard};

/// Queued changes past which the queue is flushed by change-only calls, so a
/// thread that changes registrations without ever waiting cannot grow it.
const QUEUE_MAX: usize = 1024;

/// A change record and whose it is: the registration's slot and incarnation, and
/// the sequence number of the command that made it (see [`View::seq`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Record {
    pub(super) change: Change,
    pub(super) slot: u32,
    pub(super) incarnation: u32,
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
    incarnation: 0,
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
    /// The stamp a kernel event of the arming in force carries in `udata`: the
    /// arming generation where the kernel stores `udata` on `EV_ENABLE`
    /// (`sys::UDATA_IS_GENERATION`), else the incarnation.
    pub(super) stamp: u32,
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
    /// Descriptors a deregistration is draining ([`Queue::drain`]), once per
    /// draining thread.
    draining: Vec<RawFd>,
    /// Descriptors whose queued records wait for the next command on the number
    /// ([`Shared::hold_back`]).
    held_back: Vec<RawFd>,
}

/// Records of one descriptor in calls that have not returned.
#[derive(Clone, Copy, Debug, Default)]
struct Held {
    all: u32,
    /// Those whose order matters: adds, disables, deletes.
    ordered: u32,
    /// Those carried by a waiting call, which may block until it is woken.
    carried: u32,
}

impl Shared {
    /// Whether `r` may reach the kernel before records of its descriptor that
    /// are in calls that have not returned. Enables commute with enables (the
    /// knote ends enabled whichever lands first; a late one at worst causes one
    /// event the table drops as stale), so an enable or add may pass enables;
    /// anything else waits behind (a disable overtaken by an enable would leave
    /// an armed registration disabled).
    ///
    /// Where `udata` carries the arming generation, the enable that lands last
    /// also sets the knote's `udata`: an older one landing after a newer one
    /// leaves the arming in force tagged with an older generation. Its first
    /// report is then dropped as stale, and [`Shared::note_report`] re-enables
    /// the knote with the arming in force, so nothing is lost. (Keeping enables
    /// in order instead would make an arm wait for a blocked waiter that carries
    /// the previous one, and wake it.)
    pub(super) fn clear_to_go(&self, r: &Record) -> bool {
        match self.inflight.get(&r.change.fd) {
            None => true,
            Some(h) => h.ordered == 0 && matches!(r.change.action, Action::Enable | Action::Add),
        }
    }

    /// A kernel event of `filter` on `fd` tagged `(slot, stamp)` was read:
    /// notes the filters fired for the arming in force (for
    /// `Backend::delivered`), and returns the repair of a knote left with an
    /// older arming's `udata` ([`Shared::clear_to_go`]): when `udata` carries the
    /// generation (`by_generation`) and the event names an older arming of the
    /// slot while its view believes `filter` enabled for the arming in force, an
    /// `EV_ENABLE` of that filter with the arming in force's `udata`, to route
    /// under this lock. The kernel disabled the knote when it reported it; the
    /// repair enables it again, and a readiness that still holds is reported
    /// with the right stamp. (An event of an earlier registration of the slot
    /// looks the same; its repair only re-enables what is already enabled.)
    pub(super) fn note_report(
        &mut self,
        fd: RawFd,
        slot: u32,
        stamp: u32,
        filter: Filter,
        by_generation: bool,
    ) -> Option<Record> {
        let v = self.views.get_mut(&slot)?;
        if v.stamp == stamp {
            if v.fired_at != Some(v.seq) {
                v.fired_at = Some(v.seq);
                v.fired = Filters::NONE;
            }
            v.fired = v.fired.with(filter);
            return None;
        }
        let older = (v.stamp.wrapping_sub(stamp) as i32) > 0;
        if !(by_generation && older && v.knotes.enabled.has(filter)) {
            return None;
        }
        Some(Record {
            change: Change {
                fd,
                filter,
                action: Action::Enable,
                udata: pack_usize(slot, v.stamp),
            },
            slot,
            incarnation: v.incarnation,
            seq: v.seq,
        })
    }

    /// Whether a waiting call may carry the queued record `r` now: it may go
    /// ([`Shared::clear_to_go`]) and no deregistration is draining its descriptor.
    pub(super) fn may_carry(&self, r: &Record) -> bool {
        let fd = r.change.fd;
        self.clear_to_go(r) && !self.draining.contains(&fd) && !self.held_back.contains(&fd)
    }

    /// Queues `own` (the `EV_DELETE`s of a registration that a new registration
    /// of the same number supersedes) to reach the kernel in one call with the
    /// next command on that number (the new registration's first arm, always
    /// submitted at once, or its deregistration), not carried alone by a wait.
    ///
    /// The number already names the new registration's descriptor, so the
    /// deletes act on it whenever they land; what matters is that they land
    /// before that registration's first `EV_ADD`, which the queue's order per
    /// descriptor ensures. In one call with it they also leave libkqueue no gap
    /// to reuse the state it frees for an orphaned epoll entry (a description
    /// closed without `EV_DELETE` that a dup keeps open): that entry keeps
    /// pointing at the freed state, and a later allocation there would take the
    /// orphan's events.
    pub(super) fn hold_back(&mut self, own: &[Record]) {
        let Some(fd) = own.first().map(|r| r.change.fd) else {
            return;
        };
        self.pending.extend(own.iter().copied());
        if !self.held_back.contains(&fd) {
            self.held_back.push(fd);
        }
    }

    /// The records of `fd` held back ([`Shared::hold_back`]) go with whatever
    /// routes next for `fd`.
    fn release_held_back(&mut self, fd: RawFd) {
        if let Some(i) = self.held_back.iter().position(|&d| d == fd) {
            self.held_back.swap_remove(i);
        }
    }

    /// Whether any record of `fd` is in a call that has not returned.
    pub(super) fn in_flight(&self, fd: RawFd) -> bool {
        self.inflight.contains_key(&fd)
    }

    /// Whether a deregistration waits for a record carried by a waiting call:
    /// then a wake-up must reach that call ([`Queue::drain`]), and a waiter that
    /// took a wake-up meant for another passes it on.
    pub(super) fn drain_needs_wake(&self) -> bool {
        self.draining
            .iter()
            .any(|fd| self.inflight.get(fd).is_some_and(|h| h.carried > 0))
    }

    /// The view of `tag`'s registration, made fresh if the slot held another.
    pub(super) fn view(&mut self, tag: Tag, stamp: u32) -> &mut View {
        let fresh = |seq| View {
            incarnation: tag.incarnation,
            knotes: Knotes::NONE,
            seq,
            stamp,
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
        self.views
            .get_mut(&rec.slot)
            .filter(|v| v.incarnation == rec.incarnation && v.seq == rec.seq)
    }

    /// Marks `r` as in a call that has not returned; `carried`: by a waiting call.
    pub(super) fn hold(&mut self, r: &Record, carried: bool) {
        let h = self.inflight.entry(r.change.fd).or_default();
        h.all += 1;
        h.ordered += u32::from(r.change.action != Action::Enable);
        h.carried += u32::from(carried);
    }

    /// The call holding `r` returned. Returns whether a deregistration may be
    /// waiting for this (the caller then wakes it: [`Queue::released`]).
    pub(super) fn release(&mut self, r: &Record, carried: bool) -> bool {
        let fd = r.change.fd;
        let Some(h) = self.inflight.get_mut(&fd) else {
            return false;
        };
        h.all -= 1;
        h.ordered -= u32::from(r.change.action != Action::Enable);
        h.carried -= u32::from(carried);
        if h.all == 0 {
            self.inflight.remove(&fd);
            return self.draining.contains(&fd);
        }
        false
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
                    && !self.draining.contains(&f)
                    && !self.held_back.contains(&f)
                    && !rest.iter().any(|q: &Record| q.change.fd == f))
            {
                batch.push(r);
            } else {
                rest.push_back(r);
            }
        }
        self.pending = rest;
    }

    /// A waiting call enters: it takes the queued records it may carry
    /// ([`Shared::may_carry`]), at most `carried.len()`, in queue order (once a
    /// record of a descriptor stays queued, so do the later ones of that
    /// descriptor), holds them as carried, and counts as a waiter. Returns how
    /// many it took into `carried`.
    pub(super) fn enter_wait(&mut self, carried: &mut [Record]) -> usize {
        let mut n = 0;
        let mut skipped = VecDeque::new();
        while n < carried.len() {
            let Some(r) = self.pending.pop_front() else {
                break;
            };
            let fd = r.change.fd;
            if !self.may_carry(&r) || skipped.iter().any(|s: &Record| s.change.fd == fd) {
                skipped.push_back(r);
                continue;
            }
            carried[n] = r;
            n += 1;
        }
        while let Some(r) = skipped.pop_back() {
            self.pending.push_front(r);
        }
        for r in &carried[..n] {
            self.hold(r, true);
        }
        self.waiters += 1;
        n
    }

    /// The waiting call that carried `carried` left `kevent`: it no longer
    /// counts as a waiter and its records are released, except those for which
    /// `again` says yes, which stay held (not carried) for a change-only call
    /// that repeats them. Returns whether a deregistration may be waiting for
    /// this ([`Queue::released`]).
    pub(super) fn leave_wait(
        &mut self,
        carried: &[Record],
        again: impl Fn(&Record) -> bool,
    ) -> bool {
        self.waiters -= 1;
        let mut drained = false;
        for r in carried {
            drained |= self.release(r, true);
            if again(r) {
                self.hold(r, false);
            }
        }
        drained
    }

    /// Moves up to `room` deferred events to `out`.
    pub(super) fn take_deferred(&mut self, out: &mut Vec<RawEvent>, room: usize) {
        let n = self.deferred.len().min(room);
        out.extend(self.deferred.drain(..n));
    }

    /// Decides how `own` (records for one descriptor) travel. Under the lock
    /// that made them.
    ///
    /// - its descriptor has records in a `kevent` call that has not returned,
    ///   which it may not overtake ([`Shared::clear_to_go`]): queue behind them
    ///   (and wake a blocked waiter to carry them);
    /// - it adds a knote, or a thread is blocked in `kevent`, or the queue is
    ///   full: submit now, the descriptor's queued records first;
    /// - otherwise: queue, to ride on the next waiting call.
    ///
    /// A deregistration's `EV_DELETE`s never come here: see [`Queue::drain`].
    pub(super) fn route(&mut self, own: &[Record]) -> Route {
        let Some(fd) = own.first().map(|r| r.change.fd) else {
            return Route::Queued { wake: false };
        };
        self.release_held_back(fd);
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
        Route::Now(self.submit_with_queued(own))
    }

    /// The batch for a change-only call now: the queued records of `own`'s
    /// descriptor (`fd` when `own` is empty) first, then `own`; all held as in
    /// flight.
    fn submit_with_queued_of(&mut self, fd: RawFd, own: &[Record]) -> Batch {
        let mut batch = Batch::new();
        self.take_pending(fd, &mut batch);
        for r in own {
            batch.push(*r);
        }
        for r in batch.as_slice() {
            self.hold(r, false);
        }
        batch
    }

    fn submit_with_queued(&mut self, own: &[Record]) -> Batch {
        self.submit_with_queued_of(own[0].change.fd, own)
    }
}

/// [`Shared`] behind its mutex, and the condition a draining deregistration
/// waits on.
pub(super) struct Queue {
    shared: Mutex<Shared>,
    /// Signalled when a descriptor that a deregistration drains has no record in
    /// flight any more.
    released: Condvar,
}

impl Queue {
    /// An empty queue.
    pub(super) fn new() -> Queue {
        Queue {
            shared: Mutex::new(Shared::default()),
            released: Condvar::new(),
        }
    }

    /// Locks the bookkeeping.
    pub(super) fn lock(&self) -> MutexGuard<'_, Shared> {
        // Every update under this lock completes before it is released: a panic
        // elsewhere leaves nothing half-done.
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the deregistrations waiting in [`Queue::drain`]; call it when
    /// [`Shared::release`] said so.
    pub(super) fn released(&self) {
        self.released.notify_all();
    }

    /// The change-only call that carried `batch` (held as in flight by
    /// [`Shared::route`] or [`Queue::drain`]) returned: releases it, and wakes a
    /// deregistration that waited for it.
    pub(super) fn release_batch(&self, batch: &[Record]) {
        let mut sh = self.lock();
        let mut drained = false;
        for r in batch {
            drained |= sh.release(r, false);
        }
        drop(sh);
        if drained {
            self.released();
        }
    }

    /// For a deregistration of `fd`, whose view the caller removed under `sh`
    /// (so no new record of `fd` can be made): waits until no record of `fd` is
    /// in a `kevent` call, calling `wake` (once, unlocked) if a waiting call
    /// carries one, and returns the batch to submit at once: the queued records
    /// of `fd`, then `own` (its `EV_DELETE`s), held as in flight. While it
    /// waits, waiting calls leave `fd`'s queued records in the queue.
    pub(super) fn drain<'a>(
        &'a self,
        mut sh: MutexGuard<'a, Shared>,
        fd: RawFd,
        own: &[Record],
        mut wake: impl FnMut(),
    ) -> (MutexGuard<'a, Shared>, Batch) {
        sh.draining.push(fd);
        let mut woken = false;
        while sh.in_flight(fd) {
            if !woken && sh.drain_needs_wake() {
                woken = true;
                drop(sh);
                wake();
                sh = self.lock();
                continue;
            }
            sh = self
                .released
                .wait(sh)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if let Some(i) = sh.draining.iter().position(|&d| d == fd) {
            sh.draining.swap_remove(i);
        }
        sh.release_held_back(fd);
        let batch = sh.submit_with_queued_of(fd, own);
        (sh, batch)
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

/// Records routed outside a command (re-adds after ENOENT, the quiet after a
/// delivery): the batches to submit once the lock is released, and whether a
/// blocked waiter must be woken to carry what was queued.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    pub(super) batches: Vec<Batch>,
    pub(super) wake: bool,
}

impl Outbox {
    /// Routes `records` (of any descriptors, in order) under the lock that made
    /// them, one group per descriptor.
    pub(super) fn route(&mut self, sh: &mut Shared, records: &[Record]) {
        let mut fds: Vec<RawFd> = Vec::new();
        for r in records {
            if !fds.contains(&r.change.fd) {
                fds.push(r.change.fd);
            }
        }
        for fd in fds {
            let group: Vec<Record> = records
                .iter()
                .filter(|r| r.change.fd == fd)
                .copied()
                .collect();
            match sh.route(&group) {
                Route::Queued { wake } => self.wake |= wake,
                Route::Now(batch) => self.batches.push(batch),
            }
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.batches.is_empty() && !self.wake
    }
}
