//! The pure translation between the state machine and kevent records. No system
//! calls; compiled on every target.
//!
//! A backend (or the kernel model) keeps one [`Knotes`] per registration: what it
//! believes the kernel holds. [`translate`] turns one state-machine command into
//! at most two change records ([`Change`]) and the belief afterwards;
//! [`after_delivery`] says what to disable once a delivery was accepted;
//! [`readiness`] maps a returned kevent to [`Readiness`].
//!
//! ```text
//! let plan = translate(Command::Modify(Interest::READABLE), fd, udata, knotes);
//! for change in plan.changes() { /* EV_SET(change.fd, change.filter, change.flags(), udata) */ }
//! knotes = plan.after;
//! ```
//!
//! The belief may over-state what is enabled (a filter the kernel disabled by
//! `EV_DISPATCH` when it fired), never under-state it: an arm therefore always
//! enables every filter in its interest, and a disarm disables every filter
//! believed enabled.

use crate::event::Readiness;
use crate::interest::Interest;
// A kevent ident for a descriptor: `RawFd` on Unix; the same `c_int` elsewhere,
// where only the pure translation is compiled.
use std::ffi::c_int as RawFd;

/// `EV_ADD`: the same value in every kqueue (FreeBSD, NetBSD, OpenBSD, DragonFly,
/// XNU, libkqueue); the backend asserts it against the target's headers.
pub const EV_ADD: u16 = 0x0001;
/// `EV_DELETE`.
pub const EV_DELETE: u16 = 0x0002;
/// `EV_ENABLE`.
pub const EV_ENABLE: u16 = 0x0004;
/// `EV_DISABLE`.
pub const EV_DISABLE: u16 = 0x0008;
/// `EV_CLEAR`.
pub const EV_CLEAR: u16 = 0x0020;
/// `EV_RECEIPT`: answer this record with an `EV_ERROR` entry, `data` = 0 or errno.
pub const EV_RECEIPT: u16 = 0x0040;
/// `EV_DISPATCH`: disable the knote when it is reported.
pub const EV_DISPATCH: u16 = 0x0080;
/// `EV_ERROR`: a returned entry that answers a change record.
pub const EV_ERROR: u16 = 0x4000;
/// `EV_EOF`: the filter's end-of-file condition.
pub const EV_EOF: u16 = 0x8000;

/// A kqueue filter the poller uses for descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Filter {
    /// `EVFILT_READ`: readable interest.
    Read,
    /// `EVFILT_WRITE`: writable interest.
    Write,
}

impl Filter {
    /// Both filters, read first (the order records are emitted in).
    pub const BOTH: [Filter; 2] = [Filter::Read, Filter::Write];

    const fn bit(self) -> u8 {
        match self {
            Filter::Read => 1,
            Filter::Write => 2,
        }
    }
}

/// A set of filters (of one registration).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Filters(u8);

impl Filters {
    /// No filter.
    pub const NONE: Filters = Filters(0);
    /// `EVFILT_READ` alone.
    pub const READ: Filters = Filters(1);
    /// `EVFILT_WRITE` alone.
    pub const WRITE: Filters = Filters(2);
    /// Both filters.
    pub const BOTH: Filters = Filters(3);

    /// The filters an interest arms.
    pub const fn of(interest: Interest) -> Filters {
        Filters(interest.bits())
    }

    /// Whether `f` is in the set.
    pub const fn has(self, f: Filter) -> bool {
        self.0 & f.bit() != 0
    }

    /// The set with `f` added.
    #[must_use]
    pub const fn with(self, f: Filter) -> Filters {
        Filters(self.0 | f.bit())
    }

    /// The set with `f` removed.
    #[must_use]
    pub const fn without(self, f: Filter) -> Filters {
        Filters(self.0 & !f.bit())
    }

    /// Both sets together.
    #[must_use]
    pub const fn union(self, other: Filters) -> Filters {
        Filters(self.0 | other.0)
    }

    /// The set as two bits (1 read, 2 write), as [`Interest::bits`].
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// What a backend believes the kernel holds for one registration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Knotes {
    /// Filters with a knote in the kernel (added, not deleted).
    pub present: Filters,
    /// Filters that may be enabled (a subset of `present`). May over-state: a
    /// knote disabled by `EV_DISPATCH` when it fired still counts until the next
    /// command or [`after_delivery`].
    pub enabled: Filters,
}

impl Knotes {
    /// Nothing in the kernel (a fresh registration).
    pub const NONE: Knotes = Knotes {
        present: Filters::NONE,
        enabled: Filters::NONE,
    };
}

/// What one change record does to its knote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// `EV_ADD | EV_DISPATCH`: create the knote, enabled.
    Add,
    /// `EV_ADD | EV_ENABLE | EV_DISPATCH`: re-arm an existing knote. `EV_ADD`
    /// makes every kernel re-run the filter and store `udata` (the modify
    /// branch of `kqueue_register`); a bare `EV_ENABLE` re-reports a knote
    /// disabled by a dispatch only where the enable itself re-runs the filter
    /// (FreeBSD, XNU, DragonFly, NetBSD 10, OpenBSD 6.4+), not on NetBSD 8/9 or
    /// OpenBSD 6.2-6.3, and stores `udata` not on NetBSD 8/9 or OpenBSD.
    /// `fflags` and `data` are 0, as in the `Add` that created the knote (a
    /// change overwrites them). Never with `EV_CLEAR`: NetBSD's scan tests
    /// `EV_CLEAR` before `EV_DISPATCH` and never disables such a knote.
    Enable,
    /// `EV_DISABLE | EV_DISPATCH`: quiet an existing knote.
    Disable,
    /// `EV_DELETE`: remove the knote (deregistration only).
    Delete,
}

impl Action {
    /// The `EV_*` flags of a record with this action, without `EV_RECEIPT`.
    pub const fn flags(self) -> u16 {
        match self {
            Action::Add => EV_ADD | EV_DISPATCH,
            Action::Enable => EV_ADD | EV_ENABLE | EV_DISPATCH,
            Action::Disable => EV_DISABLE | EV_DISPATCH,
            Action::Delete => EV_DELETE,
        }
    }
}

/// One kevent change record: `EV_SET(fd, filter, action.flags(), 0, 0, udata)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    /// The descriptor (`ident`).
    pub fd: RawFd,
    /// The filter.
    pub filter: Filter,
    /// What the record does.
    pub action: Action,
    /// The registration's tag, `pack_usize(slot, incarnation)`.
    pub udata: usize,
}

impl Change {
    /// The record's `flags` field, without `EV_RECEIPT` (see [`Action::flags`]).
    pub const fn flags(&self) -> u16 {
        self.action.flags()
    }
}

/// A state-machine command for one registration (the [`Kernel`] trait's methods).
///
/// [`Kernel`]: crate::state::Kernel
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Rows "fresh, arm(i)": put it in the kernel armed for the interest.
    Add(Interest),
    /// Rows "idle, arm(i)" and "armed(i), arm(j)": re-arm for the interest.
    Modify(Interest),
    /// Row "armed, disarm": keep it but report nothing.
    Quiet,
    /// Row "in kernel, deregister": remove it.
    Delete,
}

/// At most four records (two per filter: a re-add deletes first) and the
/// belief after them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    records: [Option<Change>; 4],
    /// What the kernel holds once every record succeeded.
    pub after: Knotes,
}

impl Plan {
    fn new(after: Knotes) -> Plan {
        Plan {
            records: [None; 4],
            after,
        }
    }

    fn push(&mut self, c: Change) {
        let slot = self.records.iter_mut().find(|r| r.is_none());
        *slot.expect("a plan has at most two records per filter") = Some(c);
    }

    /// The records, in the order they must reach the kernel (read filter first).
    pub fn changes(&self) -> impl Iterator<Item = Change> + '_ {
        self.records.iter().flatten().copied()
    }

    /// The number of records.
    pub fn len(&self) -> usize {
        self.changes().count()
    }

    /// Whether the command needs no record.
    pub fn is_empty(&self) -> bool {
        self.records[0].is_none()
    }
}

/// The records for `command` on `fd`, given what the kernel is believed to hold.
///
/// - `Add(i)` and `Modify(i)`: for each filter in `i`, `Enable` if present else
///   `Add`; for each filter believed enabled outside `i`, `Disable`. From a fresh
///   registration (`Knotes::NONE`) `Add(i)` is one `Add` per filter in `i`.
/// - `Quiet`: `Disable` for each filter believed enabled (each present filter if
///   none is believed enabled, so a quiet always reaches the kernel).
/// - `Delete`: `Delete` for each present filter.
pub fn translate(command: Command, fd: RawFd, udata: usize, knotes: Knotes) -> Plan {
    let rec = |filter, action| Change {
        fd,
        filter,
        action,
        udata,
    };
    match command {
        Command::Add(interest) | Command::Modify(interest) => {
            let want = Filters::of(interest);
            let mut plan = Plan::new(Knotes {
                present: knotes.present.union(want),
                enabled: want,
            });
            for f in Filter::BOTH {
                if want.has(f) {
                    let action = if knotes.present.has(f) {
                        Action::Enable
                    } else {
                        Action::Add
                    };
                    plan.push(rec(f, action));
                } else if knotes.enabled.has(f) && knotes.present.has(f) {
                    plan.push(rec(f, Action::Disable));
                }
            }
            plan
        }
        Command::Quiet => {
            let mut plan = Plan::new(Knotes {
                present: knotes.present,
                enabled: Filters::NONE,
            });
            let targets = if knotes.enabled.is_empty() {
                knotes.present
            } else {
                Filters(knotes.enabled.0 & knotes.present.0)
            };
            for f in Filter::BOTH {
                if targets.has(f) {
                    plan.push(rec(f, Action::Disable));
                }
            }
            plan
        }
        Command::Delete => {
            let mut plan = Plan::new(Knotes::NONE);
            for f in Filter::BOTH {
                if knotes.present.has(f) {
                    plan.push(rec(f, Action::Delete));
                }
            }
            plan
        }
    }
}

/// Once a delivery was accepted for a registration whose filters `fired` in the
/// kernel (`EV_DISPATCH` disabled those): disable the other enabled ones, so one
/// delivery disarms the whole registration as on epoll. Nothing is believed
/// enabled afterwards.
pub fn after_delivery(fd: RawFd, udata: usize, knotes: Knotes, fired: Filters) -> Plan {
    let mut plan = Plan::new(Knotes {
        present: knotes.present,
        enabled: Filters::NONE,
    });
    for f in Filter::BOTH {
        if knotes.enabled.has(f) && knotes.present.has(f) && !fired.has(f) {
            plan.push(Change {
                fd,
                filter: f,
                action: Action::Disable,
                udata,
            });
        }
    }
    plan
}

/// The records that start a registration over after the kernel answered
/// ENOENT to an `Enable` (or an `Add`): it lost the descriptor, which was
/// closed and its number reused (row "idle, arm(i)": on ENOENT, add). A
/// `Delete` for each filter, then an `Add` for each filter in `interest`; the
/// knotes are exactly the interest's after.
///
/// Where the kernel keeps its promise the deletes answer ENOENT and are
/// ignored. A kqueue that keeps knotes (and its own per-descriptor state) for
/// a closed number and reports ENOENT only when they are used (libkqueue
/// does) refuses an `Add` until they are deleted; deleting first works on both.
pub fn readd(fd: RawFd, udata: usize, interest: Interest) -> Plan {
    let want = Filters::of(interest);
    let mut plan = Plan::new(Knotes {
        present: want,
        enabled: want,
    });
    let rec = |filter, action| Change {
        fd,
        filter,
        action,
        udata,
    };
    for f in Filter::BOTH {
        plan.push(rec(f, Action::Delete));
    }
    for f in Filter::BOTH {
        if want.has(f) {
            plan.push(rec(f, Action::Add));
        }
    }
    plan
}

/// The readiness a returned event of `filter` reports, from its `flags` and
/// `fflags`: the read filter is readable and, with `EV_EOF`, read-closed; the
/// write filter is writable and, with `EV_EOF`, write-closed. `EV_EOF` with a
/// non-zero `fflags` (the socket's pending error) adds [`Readiness::ERROR`].
/// A peer's `shutdown(SHUT_WR)` is thus read-closed only (scenario P10).
pub fn readiness(filter: Filter, flags: u16, fflags: u32) -> Readiness {
    let eof = flags & EV_EOF != 0;
    let mut r = match (filter, eof) {
        (Filter::Read, false) => Readiness::READABLE,
        (Filter::Read, true) => Readiness::READABLE.union(Readiness::READ_CLOSED),
        (Filter::Write, false) => Readiness::WRITABLE,
        (Filter::Write, true) => Readiness::WRITABLE.union(Readiness::WRITE_CLOSED),
    };
    if eof && fflags != 0 {
        r.insert(Readiness::ERROR);
    }
    r
}

/// What a refused arm is delivered as: an error, readable and writable, so that
/// whichever operation the caller tries finds out what happened.
pub const REFUSED: Readiness = Readiness::ERROR
    .union(Readiness::READABLE)
    .union(Readiness::WRITABLE);
