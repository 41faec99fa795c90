//! kqueue(2), as each BSD kernel's registration path behaves, and this family's
//! part of [`Model::wait`], [`Model::view`], [`Model::force_report`] and the
//! [`RegKernel`] translation (the kqueue backend's own pure translator,
//! `changes` in `backends/kqueue/changes.rs`, with its per-registration belief).
//!
//! One knote per (descriptor number, filter). `EV_ADD` creates it, or on an
//! existing knote stores `udata` and re-runs the filter (every kernel:
//! `kqueue_register`'s `EV_ADD` branch; `kevent_register` on XNU);
//! `EV_ENABLE`/`EV_DISABLE`/`EV_DELETE` of a missing knote answer ENOENT, any
//! change on a closed number EBADF, `EV_ADD` on a description the kernel cannot
//! poll EINVAL. Closing a descriptor number drops every knote on that number
//! ("Calling close() on a file descriptor will remove any kevents that reference
//! the descriptor", kqueue(2)), whether or not a dup keeps the description open.
//!
//! A knote is reported when it is enabled, its filter fires with the
//! description's levels, and it is *active* (`KN_ACTIVE`): activity on the
//! description whose filter fires ([`Model::set_levels`], the kernel's
//! `knote()`), an `EV_ADD` whose filter run fires, or, on a kernel whose
//! `EV_ENABLE` re-runs the filter ([`KqueueKernel::enable_reevaluates`]), an
//! enable that finds it ready, mark it active; an `EV_DISPATCH` delivery
//! disables it and clears the mark; a scan that finds its filter no longer
//! firing clears it too. So on NetBSD 8/9 (whose `knote_enqueue` queues only a
//! knote still active) a bare `EV_ENABLE` of a dispatched knote whose descriptor
//! is still ready reports nothing until new activity: the lost re-report that
//! the backend's re-arm record (`EV_ADD | EV_ENABLE | EV_DISPATCH`) avoids, and
//! that [`RearmRecord::Enable`] reproduces.
//!
//! A waiting `kevent` call that carries changes ([`Model::kevent_wait`]) ends
//! without collecting events as soon as one `EV_ERROR` entry was written (a
//! refusal, or a receipt): the `nerrors` rule of every kernel's change loop.
//!
//! Not modelled, and what the backend does about it (both shown on NetBSD
//! 7.99's kernel code, `tests/rump_suite.rs`):
//!
//! - NetBSD 8/9's `kqueue_scan` puts a level-triggered knote that still fires
//!   back on the queue without waking the threads asleep in `kevent`, and
//!   `knote_activate` wakes them only when it queues a knote: a level-triggered
//!   knote that several threads wait on can lose a wake-up. The model has one
//!   waiter per wait and no waker knote; the backend's pipe waker is `EV_CLEAR`.
//! - NetBSD 7.99 to 9's `pipeclose` (`sys_pipe.c`) runs the writer's write
//!   filter (through `knote`) before it marks the pipe closed, so a pipe writer
//!   armed while the pipe is full is not activated by its reader's close: the
//!   model's [`Model::set_levels`] activates every knote whose filter fires, on
//!   every kqueue semantics; a re-arm's `EV_ADD` reports it on every kernel.

use super::{
    interest_from, Command, Errno, Fd, KernelView, Levels, Model, ModelEvent, Origin, RawEvent,
    Readiness, RegKernel, Semantics,
};
use crate::interest::Interest;
use crate::kqueue_backend::changes as kqc;
use crate::state::KernelError;
use crate::token::{pack_usize, unpack_usize};
use std::collections::BTreeMap;
use std::io;

/// kqueue filters and flags, with FreeBSD's values.
pub mod kq {
    /// `EV_ADD`.
    pub const EV_ADD: u16 = 0x0001;
    /// `EV_DELETE`.
    pub const EV_DELETE: u16 = 0x0002;
    /// `EV_ENABLE`.
    pub const EV_ENABLE: u16 = 0x0004;
    /// `EV_DISABLE`.
    pub const EV_DISABLE: u16 = 0x0008;
    /// `EV_ONESHOT`.
    pub const EV_ONESHOT: u16 = 0x0010;
    /// `EV_CLEAR`.
    pub const EV_CLEAR: u16 = 0x0020;
    /// `EV_RECEIPT`.
    pub const EV_RECEIPT: u16 = 0x0040;
    /// `EV_DISPATCH`.
    pub const EV_DISPATCH: u16 = 0x0080;
    /// `EV_ERROR` (in a returned event or receipt).
    pub const EV_ERROR: u16 = 0x4000;
    /// `EV_EOF` (in a returned event).
    pub const EV_EOF: u16 = 0x8000;
}

/// What a kqueue kernel does with a change record on an existing knote that
/// carries no `EV_ADD` (a bare `EV_ENABLE` or `EV_DISABLE`). With `EV_ADD` every
/// kernel re-runs the filter and stores `udata`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KqueueKernel {
    /// `EV_ENABLE` re-runs the filter, so a knote disabled by an `EV_DISPATCH`
    /// delivery whose descriptor is still ready is reported again (FreeBSD
    /// `kqueue_register` at `done_ev_add:`, XNU's `f_touch`, DragonFly, NetBSD 10,
    /// OpenBSD 6.4+). Else it only re-queues a knote still active (NetBSD 8/9
    /// `knote_enqueue`, OpenBSD 6.2-6.3).
    pub enable_reevaluates: bool,
    /// `EV_ENABLE` and `EV_DISABLE` store the record's `udata` (FreeBSD, XNU,
    /// DragonFly, NetBSD 10). Else only `EV_ADD` does (NetBSD 8/9, OpenBSD).
    pub enable_stores_udata: bool,
}

/// The record the modelled kqueue backend re-arms an existing knote with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RearmRecord {
    /// `EV_ADD | EV_ENABLE | EV_DISPATCH`: the backend's record; re-reports and
    /// stores `udata` on every kernel.
    #[default]
    AddEnable,
    /// `EV_ENABLE | EV_DISPATCH`, the record before: loses the re-report on a
    /// kernel whose enable does not re-run the filter, and keeps the first
    /// `udata` where the enable does not store it (the backend then carried the
    /// slot's incarnation in `udata`: [`Model::tag_is_generation`]).
    Enable,
}

impl RearmRecord {
    /// The `flags` of a record of `action` (without `EV_RECEIPT`).
    pub const fn flags(self, action: kqc::Action) -> u16 {
        match (self, action) {
            (RearmRecord::Enable, kqc::Action::Enable) => kq::EV_ENABLE | kq::EV_DISPATCH,
            _ => action.flags(),
        }
    }
}

/// A kqueue filter on a descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Filter {
    /// `EVFILT_READ`.
    Read,
    /// `EVFILT_WRITE`.
    Write,
}

impl Filter {
    /// Both filters, read first.
    pub const BOTH: [Filter; 2] = [Filter::Read, Filter::Write];

    /// Whether `interest` asks for this filter.
    pub const fn in_interest(self, interest: Interest) -> bool {
        match self {
            Filter::Read => interest.is_readable(),
            Filter::Write => interest.is_writable(),
        }
    }

    /// Whether the filter fires with these levels (the read filter on data, EOF or
    /// an error; the write filter on room, EOF or an error).
    pub const fn fires(self, l: Levels) -> bool {
        match self {
            Filter::Read => l.readable || l.read_closed || l.hang_up || l.error,
            Filter::Write => l.writable || l.hang_up || l.error,
        }
    }
}

/// One kevent(2) change record (`struct kevent` as a change).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    /// `ident`: the descriptor number.
    pub ident: Fd,
    /// `filter`.
    pub filter: Filter,
    /// `flags`: the `kq::EV_*` bits.
    pub flags: u16,
    /// `udata`, widened to 64 bits.
    pub udata: u64,
    /// Who issued it (ground truth, not part of the kernel's record).
    pub origin: Origin,
}

/// One knote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knote {
    /// Whether it may be reported.
    pub enabled: bool,
    /// `EV_DISPATCH`: disabled when reported.
    pub dispatch: bool,
    /// `udata` as stored.
    pub udata: u64,
    /// Who last enabled or added it (ground truth).
    pub origin: Origin,
    /// `KN_ACTIVE`: its filter fired since it was last reported (or since a
    /// scan found it not firing); only an active knote is reported.
    pub active: bool,
}

/// What the kqueue backend believes the kernel holds for one registration, and
/// which filters fired since its last command (its per-slot view in
/// `backends/kqueue/queue.rs`).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Belief {
    incarnation: u32,
    knotes: kqc::Knotes,
    seq: u32,
    /// The stamp an event of the arming in force carries (`View::stamp`).
    stamp: u32,
    fired_at: Option<u32>,
    fired: kqc::Filters,
}

impl Belief {
    fn fired(&mut self, filter: Filter) {
        let f = match filter {
            Filter::Read => kqc::Filter::Read,
            Filter::Write => kqc::Filter::Write,
        };
        if self.fired_at != Some(self.seq) {
            self.fired_at = Some(self.seq);
            self.fired = kqc::Filters::NONE;
        }
        self.fired = self.fired.with(f);
    }
}

/// Readiness of one kqueue event: the filter's direction, `EV_EOF` as
/// read-closed (read filter) or write-closed (write filter), an error as error.
pub fn kqueue_readiness(filter: Filter, l: Levels) -> Readiness {
    let mut r = Readiness::EMPTY;
    match filter {
        Filter::Read => {
            r.insert(Readiness::READABLE);
            if l.read_closed || l.hang_up {
                r.insert(Readiness::READ_CLOSED);
            }
        }
        Filter::Write => {
            r.insert(Readiness::WRITABLE);
            if l.hang_up {
                r.insert(Readiness::WRITE_CLOSED);
            }
        }
    }
    if l.error {
        r.insert(Readiness::ERROR);
    }
    r
}

impl Semantics {
    /// The kqueue kernel this semantics models, `None` for a semantics that is not
    /// a kqueue.
    pub const fn kqueue_kernel(self) -> Option<KqueueKernel> {
        let (enable_reevaluates, enable_stores_udata) = match self {
            Semantics::Kqueue => (true, true),
            Semantics::KqueueFixedUdata | Semantics::KqueueOpenBsd => (true, false),
            Semantics::KqueueNetBsd8 => (false, false),
            _ => return None,
        };
        Some(KqueueKernel {
            enable_reevaluates,
            enable_stores_udata,
        })
    }
}

impl Model {
    /// The record the modelled kqueue backend re-arms with (default: the
    /// backend's, [`RearmRecord::AddEnable`]). Set it before any command.
    pub fn set_rearm_record(&mut self, record: RearmRecord) {
        self.rearm = record;
    }

    /// The re-arm record in use.
    pub fn rearm_record(&self) -> RearmRecord {
        self.rearm
    }

    /// kqueue: the change records sent for registrations (through
    /// [`RegKernel`] and [`Model::delivered`]) since the last call, in order.
    pub fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.sent)
    }

    /// Submits a kqueue plan at once: the records (with `EV_RECEIPT`), their
    /// answers, and the belief of the registration afterwards (a refused record,
    /// but of a delete, means its knote is not there).
    pub(super) fn submit(
        &mut self,
        slot: u32,
        plan: kqc::Plan,
        origin: Origin,
    ) -> Vec<(kqc::Action, Option<Errno>)> {
        let quiet = Origin {
            arming: 0,
            ..origin
        };
        let records: Vec<Change> = plan
            .changes()
            .map(|c| Change {
                ident: c.fd,
                filter: match c.filter {
                    kqc::Filter::Read => Filter::Read,
                    kqc::Filter::Write => Filter::Write,
                },
                flags: self.rearm.flags(c.action) | kq::EV_RECEIPT,
                udata: c.udata as u64,
                origin: match c.action {
                    kqc::Action::Add | kqc::Action::Enable => origin,
                    kqc::Action::Disable | kqc::Action::Delete => quiet,
                },
            })
            .collect();
        let answers = self.kevent(&records);
        let mut after = plan.after;
        let mut out = Vec::new();
        for (c, a) in plan.changes().zip(&answers) {
            if a.is_err() && c.action != kqc::Action::Delete {
                after.present = after.present.without(c.filter);
                after.enabled = after.enabled.without(c.filter);
            }
            out.push((c.action, a.err()));
        }
        if let Some(b) = self.beliefs.get_mut(&slot) {
            b.knotes = after;
        }
        self.sent.extend(records);
        out
    }

    /// The knotes, by (number, filter).
    pub fn knotes(&self) -> &BTreeMap<(Fd, Filter), Knote> {
        &self.knotes
    }

    /// kevent(2) with a change list and `EV_RECEIPT`: applies every change in
    /// order and answers each (a real kernel without `EV_RECEIPT` and with a short
    /// event list stops at the first failure; that is the caller's to avoid).
    pub fn kevent(&mut self, changes: &[Change]) -> Vec<Result<(), Errno>> {
        changes.iter().map(|c| self.apply_change(c)).collect()
    }

    /// A waiting kevent(2) that carries `changes`: applies each in order; a
    /// refused one, or one with `EV_RECEIPT`, writes an `EV_ERROR` entry, and a
    /// call that wrote one returns those entries alone, without collecting events
    /// (nothing is reported or disabled; every kernel's change loop returns once
    /// `nerrors` is non-zero: `kevent1` on NetBSD, `sys_kevent` on OpenBSD,
    /// `kqueue_kevent` on FreeBSD). Otherwise it is a [`Model::wait`] for at most
    /// `max` events. Returns every change's answer and the events.
    pub fn kevent_wait(
        &mut self,
        changes: &[Change],
        max: usize,
    ) -> (Vec<Result<(), Errno>>, Vec<ModelEvent>) {
        let answers = self.kevent(changes);
        let errors = changes
            .iter()
            .zip(&answers)
            .any(|(c, a)| a.is_err() || c.flags & kq::EV_RECEIPT != 0);
        if errors {
            self.calls.waits += 1;
            return (answers, Vec::new());
        }
        (answers, self.wait(max))
    }

    fn apply_change(&mut self, c: &Change) -> Result<(), Errno> {
        use kq::*;
        self.calls.kevent_changes += 1;
        let kernel = self.semantics.kqueue_kernel().ok_or(Errno::Inval)?;
        let desc = *self.fds.get(&c.ident).ok_or(Errno::BadF)?;
        let d = &self.descs[desc.0 as usize];
        let fires = d.pollable && c.filter.fires(d.levels);
        let key = (c.ident, c.filter);
        if c.flags & EV_DELETE != 0 {
            return self.knotes.remove(&key).map(drop).ok_or(Errno::NoEnt);
        }
        if c.flags & EV_ADD != 0 {
            if !d.pollable {
                return Err(Errno::Inval);
            }
            let new = !self.knotes.contains_key(&key);
            let k = self.knotes.entry(key).or_insert(Knote {
                enabled: false,
                dispatch: false,
                udata: c.udata,
                origin: c.origin,
                active: false,
            });
            // kqueue_register's EV_ADD branch: store udata, run the filter
            // (knote_activate when it fires), then apply EV_ENABLE/EV_DISABLE.
            // An add enables, unless EV_DISABLE.
            k.enabled = c.flags & EV_DISABLE == 0;
            k.dispatch = c.flags & EV_DISPATCH != 0 || (!new && k.dispatch);
            k.udata = c.udata;
            k.origin = c.origin;
            k.active |= fires;
            return Ok(());
        }
        let k = self.knotes.get_mut(&key).ok_or(Errno::NoEnt)?;
        if kernel.enable_stores_udata {
            k.udata = c.udata;
        }
        if c.flags & EV_DISPATCH != 0 {
            k.dispatch = true;
        }
        if c.flags & EV_ENABLE != 0 {
            k.enabled = true;
            k.origin = c.origin;
            if kernel.enable_reevaluates {
                k.active |= fires;
            }
        }
        if c.flags & EV_DISABLE != 0 {
            k.enabled = false;
        }
        Ok(())
    }

    /// Activity on `desc` (the kernel's `knote()` on its klist): every knote on a
    /// number referring to it whose filter fires with the new levels becomes
    /// active, enabled or not.
    pub(super) fn kqueue_activity(&mut self, desc: super::DescId) {
        let levels = self.levels(desc);
        let fds = &self.fds;
        for (&(fd, filter), k) in self.knotes.iter_mut() {
            if fds.get(&fd) == Some(&desc) && filter.fires(levels) {
                k.active = true;
            }
        }
    }

    /// After a delivery that completed an arming of the registration on `fd` in
    /// `slot`, incarnation `incarnation`: kqueue disables its filters that did not
    /// fire, unless a command for it came after the event was read (then that
    /// command decided), as `Backend::delivered` does in `backends/kqueue/backend.rs`
    /// (`changes::after_delivery`); nothing on other semantics.
    pub fn delivered(&mut self, fd: Fd, slot: u32, incarnation: u32) {
        if !self.semantics.is_kqueue() {
            return;
        }
        let tag_is_generation = self.tag_is_generation();
        let Some(b) = self.beliefs.get_mut(&slot) else {
            return;
        };
        if b.incarnation != incarnation || b.fired_at != Some(b.seq) {
            return;
        }
        let udata = pack_usize(
            slot,
            if tag_is_generation {
                b.stamp
            } else {
                incarnation
            },
        );
        let plan = kqc::after_delivery(fd, udata, b.knotes, b.fired);
        b.knotes = plan.after;
        if plan.is_empty() {
            return;
        }
        b.seq = b.seq.wrapping_add(1);
        let origin = Origin {
            owner: u64::MAX,
            arming: 0,
        };
        self.submit(slot, plan, origin);
    }

    /// kqueue's part of [`Model::view`].
    pub(super) fn kqueue_view(&self, fd: Fd) -> KernelView {
        let r = self.knotes.get(&(fd, Filter::Read));
        let w = self.knotes.get(&(fd, Filter::Write));
        KernelView {
            present: r.is_some() || w.is_some(),
            armed: interest_from(
                r.is_some_and(|k| k.enabled),
                w.is_some_and(|k| k.enabled),
                false,
            ),
            tag: r.or(w).map(|k| k.udata),
        }
    }

    /// Whether the knote (`fd`, `filter`) exists and is enabled.
    pub fn knote_enabled(&self, fd: Fd, filter: Filter) -> bool {
        self.knotes.get(&(fd, filter)).is_some_and(|k| k.enabled)
    }

    /// Reports knote `k` of (`fd`, `filter`) with `levels`: an `EV_DISPATCH` knote
    /// is disabled and no longer active; the belief of its registration notes the
    /// filter fired when the event carries the stamp in force.
    fn report(
        beliefs: &mut BTreeMap<u32, Belief>,
        filter: Filter,
        k: &mut Knote,
        levels: Levels,
    ) -> ModelEvent {
        if k.dispatch {
            k.enabled = false;
            k.active = false;
        }
        let (slot, stamp) = unpack_usize(k.udata as usize);
        if let Some(b) = beliefs.get_mut(&slot) {
            if b.stamp == stamp {
                b.fired(filter);
            }
        }
        ModelEvent {
            raw: RawEvent {
                slot,
                stamp,
                readiness: kqueue_readiness(filter, levels),
            },
            origin: k.origin,
            filter: Some(filter),
        }
    }

    /// kqueue's part of [`Model::wait`] (`kqueue_scan`): every enabled, active
    /// knote whose filter fires; one that no longer fires is no longer active.
    pub(super) fn kqueue_wait(&mut self, max: usize) -> Vec<ModelEvent> {
        let mut out = Vec::new();
        for (&(fd, filter), k) in self.knotes.iter_mut() {
            if out.len() >= max {
                break;
            }
            if !k.enabled {
                continue;
            }
            // A knote exists only on an open number (close drops them).
            let levels = self.descs[self.fds[&fd].0 as usize].levels;
            if !filter.fires(levels) {
                k.active = false;
                continue;
            }
            if !k.active {
                continue;
            }
            out.push(Model::report(&mut self.beliefs, filter, k, levels));
        }
        out
    }

    /// kqueue's part of [`Model::force_report`]: the first enabled knote, active
    /// or not.
    pub(super) fn kqueue_force_report(&mut self, fd: Fd) -> Option<ModelEvent> {
        let levels = self.levels(*self.fds.get(&fd)?);
        for filter in Filter::BOTH {
            if let Some(k) = self.knotes.get_mut(&(fd, filter)) {
                if k.enabled {
                    return Some(Model::report(&mut self.beliefs, filter, k, levels));
                }
            }
        }
        None
    }
}

impl RegKernel<'_> {
    /// The kqueue backend's command for this registration: translate from the
    /// belief, submit, classify (as `Kqueue::command` in `backends/kqueue/command.rs`).
    pub(super) fn kqueue(&mut self, command: Command) -> Result<(), KernelError> {
        use kqc::Action::{Add, Delete, Disable, Enable};
        let (cmd, generation) = match command {
            Command::Add(i, g) => (kqc::Command::Add(i), g),
            Command::Modify(i, g) => (kqc::Command::Modify(i), g),
            Command::Quiet(g) => (kqc::Command::Quiet, g),
            Command::Delete => (kqc::Command::Delete, 0),
        };
        let (slot, incarnation) = (self.slot, self.incarnation);
        let udata = if self.model.tag_is_generation() {
            pack_usize(slot, generation)
        } else {
            pack_usize(slot, incarnation)
        };
        let stamp = unpack_usize(udata).1;
        let b = self.model.beliefs.entry(slot).or_insert(Belief {
            incarnation,
            stamp,
            ..Belief::default()
        });
        if b.incarnation != incarnation {
            // The slot now holds a new registration.
            *b = Belief {
                incarnation,
                stamp,
                seq: b.seq,
                ..Belief::default()
            };
        }
        b.seq = b.seq.wrapping_add(1);
        if matches!(cmd, kqc::Command::Add(_) | kqc::Command::Modify(_)) {
            b.stamp = stamp;
        }
        let plan = kqc::translate(cmd, self.fd, udata, b.knotes);
        let mut answers = self.model.submit(slot, plan, self.origin);
        let lost = |a: &[(kqc::Action, Option<Errno>)]| {
            a.iter()
                .any(|(act, e)| matches!(act, Enable | Add) && *e == Some(Errno::NoEnt))
        };
        let all_gone = !answers.is_empty()
            && answers
                .iter()
                .all(|&(act, e)| act == Disable && e == Some(Errno::NoEnt));
        if let (kqc::Command::Add(i) | kqc::Command::Modify(i), true) = (cmd, lost(&answers)) {
            if answers
                .iter()
                .all(|&(_, e)| matches!(e, None | Some(Errno::NoEnt)))
            {
                // Row "idle, arm(i)": on ENOENT, add: the backend starts it over.
                answers = self
                    .model
                    .submit(slot, kqc::readd(self.fd, udata, i), self.origin);
                if lost(&answers) {
                    return Err(KernelError::NotFound);
                }
            }
        }
        let mut bad_fd = false;
        let mut not_pollable = false;
        for &(act, e) in &answers {
            match (act, e) {
                (_, None) | (Delete, Some(Errno::NoEnt | Errno::BadF)) => {}
                (Enable | Add | Disable, Some(Errno::NoEnt)) => {}
                (Add | Enable, Some(Errno::Inval)) => not_pollable = true,
                (_, Some(Errno::BadF)) => bad_fd = true,
                (_, Some(e)) => {
                    return Err(KernelError::Other(io::Error::from_raw_os_error(e.raw())))
                }
            }
        }
        if command == Command::Delete {
            self.model.beliefs.remove(&slot);
        }
        if bad_fd {
            return Err(KernelError::BadFd);
        }
        if not_pollable {
            // Always ready from now on: no knote of it may stay behind.
            let _ = self.kqueue(Command::Delete);
            return Err(KernelError::NotPollable);
        }
        if cmd == kqc::Command::Quiet && all_gone {
            return Err(KernelError::NotFound);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const O: Origin = Origin {
        owner: 1,
        arming: 1,
    };

    #[test]
    fn kqueue_close_drops_knotes_and_enable_stores_udata_where_the_kernel_does() {
        for sem in Semantics::KQUEUES {
            kqueue_close_drops_knotes(sem);
        }
    }

    fn kqueue_close_drops_knotes(sem: Semantics) {
        let mut m = Model::new(sem);
        let a = m.open(true);
        let add = Change {
            ident: a,
            filter: Filter::Read,
            flags: kq::EV_ADD | kq::EV_DISPATCH,
            udata: 5,
            origin: O,
        };
        assert_eq!(m.kevent(&[add]), vec![Ok(())]);
        let enable = Change {
            flags: kq::EV_ENABLE | kq::EV_DISPATCH,
            udata: 9,
            ..add
        };
        assert_eq!(m.kevent(&[enable]), vec![Ok(())]);
        let kept = if sem == Semantics::Kqueue { 9 } else { 5 };
        assert_eq!(m.knotes()[&(a, Filter::Read)].udata, kept);
        let desc = m.description(a).unwrap();
        m.set_levels(desc, Levels::from_bits(1));
        assert_eq!(m.wait(8).len(), 1);
        assert!(m.wait(8).is_empty(), "EV_DISPATCH disables on report");
        let d = m.dup(a).unwrap();
        m.close(a).unwrap();
        assert!(m.knotes().is_empty());
        assert_eq!(m.kevent(&[enable]), vec![Err(Errno::BadF)]);
        let enable_d = Change { ident: d, ..enable };
        assert_eq!(m.kevent(&[enable_d]), vec![Err(Errno::NoEnt)]);
        let file = m.open(false);
        assert_eq!(
            m.kevent(&[Change { ident: file, ..add }]),
            vec![Err(Errno::Inval)]
        );
    }

    /// A pipe's read end, `EV_ADD | EV_DISPATCH`, one byte written: reported once.
    /// Re-armed with the byte unread: the bare `EV_ENABLE` reports it again only
    /// where the enable re-runs the filter; `EV_ADD | EV_ENABLE | EV_DISPATCH`
    /// reports it on every kernel, with the new `udata`. (What a NetBSD 7.99 rump
    /// kernel, kern_event.c 1.88, answers.)
    #[test]
    fn rearm_with_data_unread_is_reported_again_on_every_kernel_only_with_ev_add() {
        for sem in Semantics::KQUEUES {
            let kernel = sem.kqueue_kernel().unwrap();
            for (flags, udata) in [
                (kq::EV_ENABLE | kq::EV_DISPATCH, 6),
                (kq::EV_ADD | kq::EV_ENABLE | kq::EV_DISPATCH, 7),
            ] {
                let mut m = Model::new(sem);
                let a = m.open(true);
                let add = Change {
                    ident: a,
                    filter: Filter::Read,
                    flags: kq::EV_ADD | kq::EV_DISPATCH,
                    udata: 5,
                    origin: O,
                };
                assert_eq!(m.kevent(&[add]), vec![Ok(())]);
                let desc = m.description(a).unwrap();
                m.set_levels(desc, Levels::from_bits(1));
                assert_eq!(m.wait(8).len(), 1, "{sem:?}");
                assert!(m.wait(8).is_empty(), "{sem:?}: dispatched");
                assert_eq!(
                    m.kevent(&[Change {
                        flags,
                        udata,
                        ..add
                    }]),
                    vec![Ok(())]
                );
                let again = m.wait(8);
                let with_add = flags & kq::EV_ADD != 0;
                if with_add || kernel.enable_reevaluates {
                    assert_eq!(again.len(), 1, "{sem:?} {flags:#x}");
                    let stored = with_add || kernel.enable_stores_udata;
                    let want = if stored { udata } else { 5 };
                    assert_eq!(m.knotes()[&(a, Filter::Read)].udata, want, "{sem:?}");
                } else {
                    assert!(again.is_empty(), "{sem:?}: the lost re-report");
                    // New data (activity) reports it.
                    m.set_levels(desc, Levels::from_bits(1));
                    assert_eq!(m.wait(8).len(), 1, "{sem:?}");
                }
            }
        }
    }

    /// A carried change that the kernel refuses ends the waiting call: no event is
    /// collected (nor its knote disabled) until the next call.
    #[test]
    fn an_ev_error_entry_ends_the_waiting_call() {
        for sem in Semantics::KQUEUES {
            let mut m = Model::new(sem);
            let a = m.open(true);
            let b = m.open(true);
            let add = Change {
                ident: a,
                filter: Filter::Read,
                flags: kq::EV_ADD | kq::EV_DISPATCH,
                udata: 5,
                origin: O,
            };
            m.kevent(&[add]);
            m.set_levels(m.description(a).unwrap(), Levels::from_bits(1));
            m.close(b).unwrap();
            let refused = Change {
                ident: b,
                flags: kq::EV_ENABLE | kq::EV_DISPATCH,
                ..add
            };
            let (answers, events) = m.kevent_wait(&[refused], 8);
            assert_eq!(answers, vec![Err(Errno::BadF)]);
            assert!(events.is_empty(), "{sem:?}: the error ended the call");
            let receipt = Change {
                flags: kq::EV_DISABLE | kq::EV_RECEIPT,
                filter: Filter::Write,
                ..add
            };
            let (answers, events) = m.kevent_wait(&[receipt], 8);
            assert_eq!(answers, vec![Err(Errno::NoEnt)]);
            assert!(events.is_empty());
            let (answers, events) = m.kevent_wait(&[], 8);
            assert!(answers.is_empty());
            assert_eq!(events.len(), 1, "{sem:?}: reported by the next call");
        }
    }
}
