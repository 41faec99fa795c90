//! One state-machine command for one registration: translate it (`changes.rs`),
//! route its records ([`Shared::route`]), have them submitted, and act on the
//! kernel's answers: ENOENT on an arm starts the registration over, any other
//! refused arm becomes an error event, so nothing is lost. The system calls are
//! made in `backend.rs` ([`Kqueue::submit_now`], [`Driver::wake`](crate::backend::Driver::wake)).

use super::backend::{os, Kqueue};
use super::changes::{self, Action, Command, Filters, Plan};
use super::queue::{Batch, Outbox, Record, Route, Shared, View};
use super::sys;
use crate::backend::{RawEvent, Tag};
use crate::interest::Interest;
use crate::state::KernelError;
use crate::stats::Count;
use crate::token::unpack_usize;
use std::io;
use std::os::fd::RawFd;

/// What the kernel answered to one synchronous command's own records.
#[derive(Debug, Default)]
struct Verdict {
    other: Option<io::Error>,
    bad_fd: bool,
    not_pollable: bool,
    /// `Enable` records answered ENOENT: the kernel lost these knotes.
    lost: Filters,
    /// Whether every own record was a `Disable` answered ENOENT.
    all_gone: bool,
}

impl Kqueue {
    /// Counts one command of `kind` if it has records. The counters count
    /// commands, as on every backend (one per state-machine command that
    /// reaches the kernel), not the one or two records each becomes.
    pub(super) fn count(&self, kind: Count, plan: &Plan) {
        if !plan.is_empty() {
            self.counters.one(kind);
        }
    }

    /// Acts on the answer to a record nobody waits for (carried by a wait, or
    /// taken along by another command): ENOENT on `Enable` becomes an `Add`,
    /// routed into `out` under this same lock; other refusals of an arm become
    /// an error event for the registration (pushed to `events`). Under the lock.
    pub(super) fn settle(
        &self,
        sh: &mut Shared,
        rec: &Record,
        errno: i32,
        events: &mut Vec<RawEvent>,
        out: &mut Outbox,
    ) {
        if errno == 0 {
            return;
        }
        let f = rec.change.filter;
        let Some(view) = sh.current(rec) else {
            // A later command for the registration (or its deregistration)
            // superseded this record and answers for itself.
            return;
        };
        match (rec.change.action, errno) {
            (Action::Enable | Action::Add, libc::ENOENT) => {
                // The kernel lost the descriptor (closed, number reused): start
                // the registration over with the interest of the arm that failed
                // (what the view believes enabled, as this record is current).
                let interest = Interest::from_bits(view.knotes.enabled.with(f).bits())
                    .unwrap_or(Interest::BOTH);
                let plan = changes::readd(rec.change.fd, rec.change.udata, interest);
                view.knotes = plan.after;
                view.seq = view.seq.wrapping_add(1);
                let seq = view.seq;
                self.counters.one(Count::NotFoundToAdd);
                self.count(Count::Add, &plan);
                let readds: Vec<Record> = plan
                    .changes()
                    .map(|change| Record {
                        change,
                        seq,
                        ..*rec
                    })
                    .collect();
                out.route(sh, &readds);
            }
            (Action::Enable | Action::Add, _) => {
                if rec.change.action == Action::Add {
                    view.knotes.present = view.knotes.present.without(f);
                    view.knotes.enabled = view.knotes.enabled.without(f);
                }
                events.push(RawEvent {
                    slot: rec.slot,
                    stamp: unpack_usize(rec.change.udata).1,
                    readiness: changes::REFUSED,
                });
            }
            (Action::Disable, libc::ENOENT) => {
                view.knotes.present = view.knotes.present.without(f);
                view.knotes.enabled = view.knotes.enabled.without(f);
            }
            // A refused disable leaves a knote that fires at most once
            // (EV_DISPATCH) and is dropped as stale; a refused delete means the
            // kernel had already dropped the knote.
            _ => {}
        }
    }

    /// Submits the batches routed into `out` (re-adds, the quiet after a
    /// delivery) and what their answers route in turn, settling every answer;
    /// error events go to `events`. Wakes a blocked waiter if records were
    /// queued for one to carry.
    pub(super) fn flush(&self, mut out: Outbox, events: &mut Vec<RawEvent>) {
        let mut wake = false;
        while !out.is_empty() {
            wake |= out.wake;
            let mut next = Outbox::default();
            for batch in &out.batches {
                let batch = batch.as_slice();
                let mut answers = Vec::new();
                self.submit_now(batch, |i, e| {
                    if e != 0 {
                        answers.push((i, e));
                    }
                });
                if !answers.is_empty() {
                    let mut sh = self.shared();
                    for (i, errno) in answers {
                        self.settle(&mut sh, &batch[i], errno, events, &mut next);
                    }
                }
            }
            out = next;
        }
        if wake {
            // A failed wake leaves the records queued for the next wait.
            let _ = self.kick();
        }
    }

    /// Hands error events found outside a wait to the next wait.
    pub(super) fn defer(&self, mut events: Vec<RawEvent>) {
        if !events.is_empty() {
            self.shared().deferred.append(&mut events);
            let _ = self.kick();
        }
    }

    /// Translates one command for one registration with `build` (given the view,
    /// it returns the plan), and routes its records. `None`: queued (or
    /// nothing to do); `Some(..)`: submitted, with the kernel's verdict.
    ///
    /// A deregistration (`kind` is `Count::Delete`) removes the view, drains
    /// `fd` ([`Queue::drain`]) and submits its queued records and its own
    /// `EV_DELETE`s at once: it has taken effect in the kernel when this
    /// returns, and nothing of `fd` is left queued or in flight.
    ///
    /// [`Queue::drain`]: super::queue::Queue::drain
    fn exchange(
        &self,
        fd: RawFd,
        tag: Tag,
        kind: Count,
        superseded: bool,
        build: impl FnOnce(&View) -> Plan,
    ) -> Option<Verdict> {
        let mut sh = self.shared();
        let view = sh.view(tag, sys::tag_stamp(tag));
        let plan = build(view);
        view.knotes = plan.after;
        view.seq = view.seq.wrapping_add(1);
        if matches!(kind, Count::Add | Count::Modify) {
            // The arming this command installs: its events carry this stamp.
            view.stamp = sys::tag_stamp(tag);
        }
        let seq = view.seq;
        self.count(kind, &plan);
        let mut own = Batch::new();
        for change in plan.changes() {
            own.push(Record {
                change,
                slot: tag.slot,
                incarnation: tag.incarnation,
                seq,
            });
        }
        let own = own.as_slice();
        if kind == Count::Delete && superseded {
            sh.views.remove(&tag.slot);
            sh.hold_back(own);
            return None;
        }
        let batch = if kind == Count::Delete {
            sh.views.remove(&tag.slot);
            let (sh, batch) = self.queue.drain(sh, fd, own, || {
                // A failed wake leaves the waiter blocked until its timeout.
                let _ = self.kick();
            });
            drop(sh);
            batch
        } else {
            let route = sh.route(own);
            drop(sh);
            match route {
                Route::Queued { wake } => {
                    if wake {
                        // A failed wake leaves the records queued for the next wait.
                        let _ = self.kick();
                    }
                    return None;
                }
                Route::Now(batch) => batch,
            }
        };
        let batch = batch.as_slice();
        let first_own = batch.len() - own.len();
        let mut errnos = [0i32; 4];
        let mut taken = Vec::new();
        self.submit_now(batch, |i, e| {
            if i >= first_own {
                errnos[i - first_own] = e;
            } else if e != 0 {
                taken.push((i, e));
            }
        });
        let mut verdict = Verdict {
            all_gone: true,
            ..Verdict::default()
        };
        let mut deferred = Vec::new();
        let mut out = Outbox::default();
        {
            let mut sh = self.shared();
            for (i, errno) in taken {
                self.settle(&mut sh, &batch[i], errno, &mut deferred, &mut out);
            }
            for (r, &errno) in own.iter().zip(&errnos) {
                let f = r.change.filter;
                if !(r.change.action == Action::Disable && errno == libc::ENOENT) {
                    verdict.all_gone = false;
                }
                match (r.change.action, errno) {
                    (_, 0) | (Action::Delete, libc::ENOENT | libc::EBADF) => continue,
                    // A delete through a number that now names a description
                    // kqueue cannot poll: nothing of this registration can be
                    // under it (a BSD kernel answers ENOENT; libkqueue passes
                    // on epoll's EPERM for a regular file or /dev/null).
                    (Action::Delete, e) if sys::NOT_POLLABLE.contains(&e) => continue,
                    (Action::Enable | Action::Add, libc::ENOENT) => {
                        verdict.lost = verdict.lost.with(f)
                    }
                    (Action::Disable, libc::ENOENT) => {}
                    // A re-arm carries `EV_ADD`: on a number reused by a
                    // description kqueue cannot poll it is refused as an add is.
                    (Action::Add | Action::Enable, e) if sys::NOT_POLLABLE.contains(&e) => {
                        verdict.not_pollable = true
                    }
                    (_, libc::EBADF) => verdict.bad_fd = true,
                    (_, e) => verdict.other = Some(os(e)),
                }
                // The knote is not there (any refusal but of a delete).
                if let Some(v) = sh.current(r) {
                    v.knotes.present = v.knotes.present.without(f);
                    v.knotes.enabled = v.knotes.enabled.without(f);
                }
            }
        }
        self.flush(out, &mut deferred);
        self.defer(deferred);
        Some(verdict)
    }

    /// One command for one registration, answered synchronously (except a
    /// `superseded` delete, see [`Shared::hold_back`]).
    pub(super) fn command(
        &self,
        fd: RawFd,
        tag: Tag,
        command: Command,
        superseded: bool,
    ) -> Result<(), KernelError> {
        let udata = sys::tag_udata(tag);
        let kind = match command {
            Command::Add(_) => Count::Add,
            Command::Modify(_) => Count::Modify,
            Command::Quiet => Count::Quiet,
            Command::Delete => Count::Delete,
        };
        let build = |v: &View| changes::translate(command, fd, udata, v.knotes);
        let Some(verdict) = self.exchange(fd, tag, kind, superseded, build) else {
            return Ok(());
        };
        let verdict = match command {
            Command::Add(interest) | Command::Modify(interest)
                if !verdict.lost.is_empty() && verdict.other.is_none() && !verdict.bad_fd =>
            {
                // Row "idle, arm(i)": on ENOENT, add. The kernel lost the
                // descriptor (closed, number reused): start it over.
                self.counters.one(Count::NotFoundToAdd);
                let readd = |_: &View| changes::readd(fd, udata, interest);
                let again = self
                    .exchange(fd, tag, Count::Add, false, readd)
                    .unwrap_or_default();
                if !again.lost.is_empty() && again.other.is_none() && !again.bad_fd {
                    return Err(KernelError::NotFound);
                }
                again
            }
            _ => verdict,
        };
        if let Some(e) = verdict.other {
            return Err(KernelError::Other(e));
        }
        if verdict.bad_fd {
            return Err(KernelError::BadFd);
        }
        if verdict.not_pollable {
            // Always ready from now on: no knote of it may stay behind.
            let _ = self.command(fd, tag, Command::Delete, false);
            return Err(KernelError::NotPollable);
        }
        if command == Command::Quiet && verdict.all_gone {
            return Err(KernelError::NotFound);
        }
        Ok(())
    }
}
