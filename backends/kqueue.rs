//! The kqueue backend (FreeBSD, NetBSD, OpenBSD, DragonFly, macOS, iOS; on Linux
//! against libkqueue with `--cfg pollshot_libkqueue`): `EV_DISPATCH` on every arm.
//!
//! Every kevent(2) call the crate makes is in this file. The file has two parts:
//!
//! - [`changes`], compiled on every target: the pure translation from the state
//!   machine's commands (add, modify, quiet, delete) to kevent change records, and
//!   from returned kevents to [`Readiness`](crate::Readiness). It is unit-tested on
//!   Linux and used by the kernel model.
//! - the backend itself, `Kqueue`, compiled where a kqueue exists.
//!
//! # What the kernel is told
//!
//! One knote per filter: `EVFILT_READ` for readable, `EVFILT_WRITE` for writable.
//!
//! - first arm: `EV_ADD | EV_DISPATCH` for each filter in the interest; the other
//!   filter is not added.
//! - re-arm: `EV_ENABLE | EV_DISPATCH` for each filter in the interest (`EV_ADD` for a
//!   filter never added), `EV_DISABLE | EV_DISPATCH` for an enabled filter outside it.
//!   `EV_DISPATCH` stays on every change, or a re-arm could fire twice.
//! - disarm: `EV_DISABLE | EV_DISPATCH` for each enabled filter.
//! - deregister: `EV_DELETE` for each added filter; ENOENT and EBADF mean the
//!   descriptor was closed and the kernel already dropped its knotes.
//! - `udata` is `pack_usize(slot, incarnation)` (see `token.rs`), the same on every
//!   change of one registration: kernels differ on whether `EV_ENABLE` rewrites it,
//!   so the arming generation lives in the poller's table and an event is current
//!   exactly when the table says armed.
//! - one delivery disarms the whole registration (parity with `EPOLLONESHOT`): the
//!   kernel disabled the filter that fired; [`Backend::delivered`] disables the other
//!   one, a change that rides on the next `kevent` call.
//!
//! # Change batching
//!
//! `kevent` takes a change list with the wait. A change made while no thread is
//! inside `kevent` is queued and rides on the next waiting call, so a re-arm costs no
//! system call of its own. A change made while a thread is blocked in `kevent` is
//! submitted at once (a change-only call with `EV_RECEIPT`), so no arm waits behind a
//! blocked wait. Changes to one descriptor reach the kernel in the order they were
//! made: a change for a descriptor whose earlier changes are still travelling with a
//! blocked waiter is queued behind them and that waiter is woken to pick it up.
//!
//! Commands that add a knote (`EV_ADD`) are always submitted at once, so that the
//! state machine gets the kernel's answer: EINVAL (a device kqueue cannot poll: the
//! registration becomes always ready, scenario P09) or EBADF.
//!
//! A batched change that the kernel refuses comes back as an `EV_ERROR` entry in
//! the event list (a BSD kernel then returns at once without waiting). ENOENT on
//! `EV_ENABLE` (the descriptor was closed and its number reused) is resubmitted as
//! `EV_ADD`; any other refusal of an arm becomes an error event for that
//! registration ([`Readiness::ERROR`](crate::Readiness::ERROR)), so it is never lost.
//!
//! Every change-only call sets `EV_RECEIPT` on each record and passes an event list
//! exactly as long as the change list, so the kernel answers every record (0 or an
//! errno) and returns at once; a shorter event list would stop at the first failure
//! and silently drop the rest.
//!
//! # Other details
//!
//! - Regular files: kqueue reports a file at end of file as never readable, unlike
//!   epoll and poll(2). The first arm checks the type with one fstat(2) and reports a
//!   regular file always ready (no knote), as the epoll backend does.
//! - The waker is an `EVFILT_USER` knote triggered with `NOTE_TRIGGER` (FreeBSD,
//!   DragonFly, Apple, libkqueue), a non-blocking pipe on OpenBSD and NetBSD (whose
//!   `EVFILT_USER` is recent). Notifies coalesce until a wait consumes them.
//! - Timeouts are a timespec, `tv_sec` clamped to 10^8 s (Darwin answers EINVAL to
//!   very large values).
//! - A kqueue is not inherited across fork(2): the child makes a new one and never
//!   closes the inherited number, which it does not own.
//! - The kqueue is close-on-exec (`kqueue1(O_CLOEXEC)` on NetBSD, else `FD_CLOEXEC`
//!   right after kqueue(2)).

#![cfg_attr(not(pollshot_kqueue), allow(dead_code))]

// An interface for the backend, the kernel model and the tests; not every target
// uses every item.
#[allow(dead_code)]
pub(crate) mod changes {
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
    use std::os::fd::RawFd;

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
        /// `EV_ENABLE | EV_DISPATCH`: re-arm an existing knote.
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
                Action::Enable => EV_ENABLE | EV_DISPATCH,
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
}

#[cfg(pollshot_kqueue)]
pub use self::imp::Kqueue;

/// The system interface: libc's declarations on the BSDs and Apple, our own for
/// libkqueue on Linux (neither libc nor rustix declares kqueue there). Everything
/// that differs between kqueue implementations is in this module.
#[cfg(pollshot_kqueue)]
mod sys {
    use super::changes::{self, Change, Filter};
    use std::io;
    use std::mem::MaybeUninit;
    use std::os::fd::{FromRawFd, OwnedFd, RawFd};
    use std::time::Duration;

    cfg_if::cfg_if! {
        if #[cfg(target_os = "linux")] {
            use libc::{c_int, c_void};

            /// libkqueue's `struct kevent` (`<kqueue/sys/event.h>`): 32 bytes on
            /// 64-bit targets, the FreeBSD 11 layout.
            #[repr(C)]
            #[derive(Clone, Copy)]
            #[allow(non_camel_case_types)]
            pub(super) struct kevent {
                pub ident: usize,
                pub filter: i16,
                pub flags: u16,
                pub fflags: u32,
                pub data: isize,
                pub udata: *mut c_void,
            }

            pub(super) type KEvent = kevent;

            const EVFILT_READ: i16 = -1;
            const EVFILT_WRITE: i16 = -2;
            const EVFILT_USER: i16 = -11;
            const NOTE_TRIGGER: u32 = 0x0100_0000;

            // The layout libkqueue was checked to have (a C probe printed the offsets):
            // ident @0, filter @8, flags @10, fflags @12, data @16, udata @24.
            #[cfg(target_pointer_width = "64")]
            const _: () = {
                assert!(std::mem::size_of::<kevent>() == 32);
                let k = MaybeUninit::<kevent>::uninit();
                let base = k.as_ptr();
                // SAFETY: only field addresses are computed (no read of the
                // uninitialised value), within the one allocation `k`.
                let offsets = unsafe {
                    [
                        std::ptr::addr_of!((*base).ident).cast::<u8>().offset_from(base.cast::<u8>()),
                        std::ptr::addr_of!((*base).filter).cast::<u8>().offset_from(base.cast::<u8>()),
                        std::ptr::addr_of!((*base).flags).cast::<u8>().offset_from(base.cast::<u8>()),
                        std::ptr::addr_of!((*base).fflags).cast::<u8>().offset_from(base.cast::<u8>()),
                        std::ptr::addr_of!((*base).data).cast::<u8>().offset_from(base.cast::<u8>()),
                        std::ptr::addr_of!((*base).udata).cast::<u8>().offset_from(base.cast::<u8>()),
                    ]
                };
                assert!(offsets[0] == 0 && offsets[1] == 8 && offsets[2] == 10);
                assert!(offsets[3] == 12 && offsets[4] == 16 && offsets[5] == 24);
            };

            // The library is linked by build.rs (found with pkg-config or
            // LIBKQUEUE_DIR), so `cargo check` works without it.
            extern "C" {
                /// kqueue(2), libkqueue's.
                fn kqueue() -> c_int;
                /// kevent(2), libkqueue's.
                fn kevent(
                    kq: c_int,
                    changelist: *const kevent,
                    nchanges: c_int,
                    eventlist: *mut kevent,
                    nevents: c_int,
                    timeout: *const libc::timespec,
                ) -> c_int;
            }

            /// Errors from `EV_ADD` meaning "this descriptor cannot be polled": EINVAL
            /// as on the BSDs, and EPERM, which libkqueue passes on from epoll
            /// (`/dev/null`, checked with a C probe).
            pub(super) const NOT_POLLABLE: &[i32] = &[libc::EINVAL, libc::EPERM];

            /// Whether a waiting call that carried changes returns their `EV_ERROR`
            /// entries even when no event fires. BSD kernels return at once with
            /// them. libkqueue keeps them only when a real event arrives in the same
            /// call and drops them when it returns 0 (checked with a C probe), so
            /// the backend re-submits carried changes with receipts after an empty
            /// wait.
            pub(super) const WAIT_RETURNS_CHANGE_ERRORS: bool = false;
        } else {
            use libc::{kevent, EVFILT_READ, EVFILT_WRITE};
            #[cfg(not(any(target_os = "openbsd", target_os = "netbsd")))]
            use libc::{EVFILT_USER, NOTE_TRIGGER};

            /// The target's `struct kevent` (field types differ: NetBSD's `filter`
            /// and `flags` are 32 bits, FreeBSD 12+ has `ext[4]`).
            pub(super) type KEvent = libc::kevent;

            // The portable flag values the translator uses are the target's (u16 on
            // most targets, u32 on NetBSD).
            #[allow(clippy::unnecessary_cast)]
            const _: () = {
                assert!(libc::EV_ADD as u32 == changes::EV_ADD as u32);
                assert!(libc::EV_DELETE as u32 == changes::EV_DELETE as u32);
                assert!(libc::EV_ENABLE as u32 == changes::EV_ENABLE as u32);
                assert!(libc::EV_DISABLE as u32 == changes::EV_DISABLE as u32);
                assert!(libc::EV_CLEAR as u32 == changes::EV_CLEAR as u32);
                assert!(libc::EV_RECEIPT as u32 == changes::EV_RECEIPT as u32);
                assert!(libc::EV_DISPATCH as u32 == changes::EV_DISPATCH as u32);
                assert!(libc::EV_ERROR as u32 == changes::EV_ERROR as u32);
                assert!(libc::EV_EOF as u32 == changes::EV_EOF as u32);
            };

            /// Errors from `EV_ADD` meaning "this descriptor cannot be polled" (some
            /// devices: EINVAL; a device without a kqueue filter: EOPNOTSUPP or ENODEV).
            pub(super) const NOT_POLLABLE: &[i32] = &[libc::EINVAL, libc::EOPNOTSUPP, libc::ENODEV];

            /// BSD kernels answer a refused change in a waiting call with an
            /// `EV_ERROR` entry and return at once without waiting.
            pub(super) const WAIT_RETURNS_CHANGE_ERRORS: bool = true;
        }
    }

    /// Whether the waker is an `EVFILT_USER` knote (else a pipe). OpenBSD and NetBSD
    /// gained `EVFILT_USER` recently (NetBSD 10), so they use the pipe.
    pub(super) const USER_WAKER: bool = cfg!(not(any(target_os = "openbsd", target_os = "netbsd")));

    /// What a returned kevent is about.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum Kind {
        Fd(Filter),
        User,
        Other,
    }

    /// A record with every field given; the rest (NetBSD/FreeBSD `ext`) zero.
    #[allow(clippy::unnecessary_cast)] // field types differ between targets
    fn make(ident: usize, filter: Filter, flags: u16, udata: usize) -> KEvent {
        // SAFETY: `struct kevent` is integers and one pointer: all-zero is valid.
        let mut k: KEvent = unsafe { std::mem::zeroed() };
        k.ident = ident as _;
        k.filter = match filter {
            Filter::Read => EVFILT_READ,
            Filter::Write => EVFILT_WRITE,
        };
        k.flags = flags as _;
        k.udata = udata as _;
        k
    }

    /// The kevent for a change record, with `extra` flags (`EV_RECEIPT`).
    pub(super) fn record(c: &Change, extra: u16) -> KEvent {
        make(c.fd as usize, c.filter, c.flags() | extra, c.udata)
    }

    /// The pipe waker's registration: its read end, level-triggered.
    pub(super) fn pipe_waker(fd: RawFd) -> KEvent {
        make(
            fd as usize,
            Filter::Read,
            changes::EV_ADD | changes::EV_RECEIPT,
            0,
        )
    }

    /// The `EVFILT_USER` waker's registration (ident 0, `EV_CLEAR`: one trigger is
    /// reported once), or its trigger.
    #[cfg(not(any(target_os = "openbsd", target_os = "netbsd")))]
    #[allow(clippy::unnecessary_cast)]
    pub(super) fn user_waker(trigger: bool) -> KEvent {
        // SAFETY: as in `make`.
        let mut k: KEvent = unsafe { std::mem::zeroed() };
        k.filter = EVFILT_USER;
        if trigger {
            k.fflags = NOTE_TRIGGER;
        } else {
            k.flags = (changes::EV_ADD | changes::EV_CLEAR | changes::EV_RECEIPT) as _;
        }
        k
    }

    #[cfg(any(target_os = "openbsd", target_os = "netbsd"))]
    pub(super) fn user_waker(_trigger: bool) -> KEvent {
        unreachable!("no EVFILT_USER waker on this target")
    }

    /// What `k` is about.
    pub(super) fn kind(k: &KEvent) -> Kind {
        if k.filter == EVFILT_READ {
            Kind::Fd(Filter::Read)
        } else if k.filter == EVFILT_WRITE {
            Kind::Fd(Filter::Write)
        } else if USER_WAKER && is_user(k) {
            Kind::User
        } else {
            Kind::Other
        }
    }

    #[cfg(not(any(target_os = "openbsd", target_os = "netbsd")))]
    fn is_user(k: &KEvent) -> bool {
        k.filter == EVFILT_USER
    }

    #[cfg(any(target_os = "openbsd", target_os = "netbsd"))]
    fn is_user(_: &KEvent) -> bool {
        false
    }

    /// `ident`.
    #[allow(clippy::unnecessary_cast)]
    pub(super) fn ident(k: &KEvent) -> usize {
        k.ident as usize
    }

    /// `flags`, the bits the portable code knows (all below 2^16).
    #[allow(clippy::unnecessary_cast)]
    pub(super) fn flags(k: &KEvent) -> u16 {
        k.flags as u16
    }

    /// `fflags`.
    pub(super) fn fflags(k: &KEvent) -> u32 {
        k.fflags
    }

    /// `data` as an errno, for an `EV_ERROR` entry (0: the change succeeded).
    #[allow(clippy::unnecessary_cast)]
    pub(super) fn errno(k: &KEvent) -> i32 {
        i32::try_from(k.data as i64).unwrap_or(libc::EINVAL)
    }

    /// `udata`.
    pub(super) fn udata(k: &KEvent) -> usize {
        k.udata as usize
    }

    /// A new kqueue, close-on-exec.
    pub(super) fn new_kqueue() -> io::Result<OwnedFd> {
        #[cfg(target_os = "netbsd")]
        // SAFETY: kqueue1(2) takes flags only.
        let fd = unsafe { libc::kqueue1(libc::O_CLOEXEC) };
        #[cfg(all(not(target_os = "netbsd"), target_os = "linux"))]
        // SAFETY: kqueue(2) takes no argument.
        let fd = unsafe { kqueue() };
        #[cfg(all(not(target_os = "netbsd"), not(target_os = "linux")))]
        // SAFETY: kqueue(2) takes no argument.
        let fd = unsafe { libc::kqueue() };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: kqueue returned a new descriptor that nothing else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        #[cfg(not(target_os = "netbsd"))]
        rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)?;
        Ok(owned)
    }

    /// libkqueue (2.7.0) answers an `EV_ENABLE | EV_RECEIPT` record for a socket or
    /// pipe knote with whatever `errno` the calling thread had: it enables the
    /// knote, then its filter's modify step refuses a receipt without `EV_CLEAR`
    /// and sets no errno (`kevent_copyin_one`, `evfilt_read_knote_modify`). With
    /// errno cleared first that answer reads as 0, which is the truth (the knote was
    /// enabled); a real refusal of the enable still sets its own errno.
    #[cfg(target_os = "linux")]
    fn clear_errno() {
        // SAFETY: __errno_location returns this thread's errno slot, always valid.
        unsafe { *libc::__errno_location() = 0 };
    }

    /// Largest `tv_sec` passed: Darwin answers EINVAL to values near `i64::MAX`.
    const MAX_SECS: u64 = 100_000_000;

    /// kevent(2): submit `changes`, then wait up to `timeout` (`None`: forever) for
    /// events written into `events`. Returns how many entries were written.
    #[allow(clippy::unnecessary_cast)]
    pub(super) fn call(
        kq: RawFd,
        changes: &[KEvent],
        events: &mut [MaybeUninit<KEvent>],
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let ts = timeout.map(|t| {
            // SAFETY: `timespec` is integers (plus padding on some targets): all-zero is valid.
            let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
            ts.tv_sec = t.as_secs().min(MAX_SECS) as _;
            ts.tv_nsec = t.subsec_nanos() as _;
            ts
        });
        let tsp = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        #[cfg(target_os = "linux")]
        clear_errno();
        // SAFETY: `changes` holds `changes.len()` initialised records; the kernel
        // writes at most `events.len()` entries into `events` (MaybeUninit has the
        // layout of KEvent); `tsp` is null or points at `ts`, alive for the call.
        let n = unsafe {
            kevent(
                kq,
                changes.as_ptr(),
                changes.len() as _,
                events.as_mut_ptr().cast::<KEvent>(),
                events.len() as _,
                tsp,
            )
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

/// The backend: the change queue, the wait, the waker.
#[cfg(pollshot_kqueue)]
mod imp {
    use super::changes::{self, Action, Change, Command, Filter, Filters, Knotes, Plan};
    use super::sys::{self, KEvent, Kind};
    use crate::backend::{Backend, Driver, RawEvent, Tag};
    use crate::error::classify;
    use crate::event::Readiness;
    use crate::interest::Interest;
    use crate::pipe;
    use crate::state::KernelError;
    use crate::stats::{Count, Counters};
    use crate::token::{incarnation_in_usize, pack_usize, unpack_usize};
    use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
    use std::collections::{HashMap, VecDeque};
    use std::io;
    use std::mem::{ManuallyDrop, MaybeUninit};
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::{Mutex, MutexGuard, PoisonError};
    use std::time::{Duration, Instant};

    /// Kernel events read per wait (a stack buffer: a wait never allocates).
    const BATCH: usize = 256;
    /// Queued changes one waiting call carries; the rest ride on the next call.
    const CARRY: usize = 64;
    /// Records per change-only call (a stack buffer); longer lists go in chunks.
    const CHUNK: usize = 8;
    /// Queued changes past which the queue is flushed by change-only calls, so a
    /// thread that changes registrations without ever waiting cannot grow it.
    const QUEUE_MAX: usize = 1024;

    /// A change record and whose it is: the registration's slot and the sequence
    /// number of the command that made it (see [`View::seq`]).
    #[derive(Clone, Copy, Debug)]
    struct Record {
        change: Change,
        slot: u32,
        seq: u32,
    }

    const NO_RECORD: Record = Record {
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
    struct View {
        incarnation: u32,
        knotes: Knotes,
        /// Bumped by every command: an answer or an event read for an older
        /// sequence number no longer describes the registration.
        seq: u32,
        /// The sequence number when a kernel event was last read for it, and the
        /// filters read since (`EV_DISPATCH` disabled them).
        fired_at: Option<u32>,
        fired: Filters,
    }

    /// What the mutex guards: the queue, the views and who is in the kernel.
    #[derive(Debug, Default)]
    struct Shared {
        /// Changes waiting to ride on the next waiting call.
        pending: VecDeque<Record>,
        /// Records per descriptor handed to a `kevent` call that has not returned
        /// (carried by a waiter, or in a change-only call): the kernel may not
        /// have applied them yet. See [`Shared::clear_to_go`].
        inflight: HashMap<RawFd, Held>,
        views: HashMap<u32, View>,
        /// Threads between taking the queue and leaving `kevent`.
        waiters: usize,
        /// Events for the next wait: error events for refused changes found outside
        /// a wait, and kernel events a wait had no room for.
        deferred: Vec<RawEvent>,
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
        fn clear_to_go(&self, r: &Record) -> bool {
            match self.inflight.get(&r.change.fd) {
                None => true,
                Some(h) => {
                    h.ordered == 0 && matches!(r.change.action, Action::Enable | Action::Add)
                }
            }
        }

        fn view(&mut self, tag: Tag) -> &mut View {
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
        fn current(&mut self, rec: &Record) -> Option<&mut View> {
            let inc = unpack_usize(rec.change.udata).1;
            self.views
                .get_mut(&rec.slot)
                .filter(|v| incarnation_in_usize(v.incarnation) == inc && v.seq == rec.seq)
        }

        fn hold(&mut self, r: &Record) {
            let h = self.inflight.entry(r.change.fd).or_default();
            h.all += 1;
            h.ordered += u32::from(r.change.action != Action::Enable);
        }

        fn release(&mut self, r: &Record) {
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
        fn take_deferred(&mut self, out: &mut Vec<RawEvent>, room: usize) {
            let n = self.deferred.len().min(room);
            out.extend(self.deferred.drain(..n));
        }
    }

    /// A few records, inline unless a command takes queued records along.
    #[derive(Debug)]
    enum Batch {
        Inline([Record; 2], usize),
        Heap(Vec<Record>),
    }

    impl Batch {
        fn new() -> Batch {
            Batch::Inline([NO_RECORD; 2], 0)
        }

        fn push(&mut self, r: Record) {
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

        fn as_slice(&self) -> &[Record] {
            match self {
                Batch::Inline(items, len) => &items[..*len],
                Batch::Heap(v) => v,
            }
        }
    }

    enum Waker {
        /// An `EVFILT_USER` knote, ident 0.
        User,
        /// A pipe whose read end is registered level-triggered.
        Pipe { read: OwnedFd, write: OwnedFd },
    }

    /// The kqueue backend. See the module docs for the commands it issues.
    pub struct Kqueue {
        /// `ManuallyDrop`: in a forked child the number is not ours to close.
        kq: ManuallyDrop<OwnedFd>,
        waker: Waker,
        shared: Mutex<Shared>,
        /// A [`Driver::wake`] no wait has taken yet: the wait that takes it returns.
        user_woken: AtomicBool,
        /// A wake-up (trigger or pipe byte) is outstanding: further ones coalesce.
        woken: AtomicBool,
        /// Dropped in a forked child without re-initialising: leave `kq` alone.
        forsaken: bool,
        counters: Counters,
    }

    impl std::fmt::Debug for Kqueue {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Kqueue")
                .field("kq", &self.kq.as_raw_fd())
                .field("user_waker", &matches!(self.waker, Waker::User))
                .finish_non_exhaustive()
        }
    }

    impl Backend for Kqueue {}

    /// How a command's records travel.
    enum Route {
        /// Queued for the next waiting call; `wake`: wake a blocked waiter to carry it.
        Queued { wake: bool },
        /// Submit now, in this order (queued records of the descriptor first).
        Now(Batch),
    }

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

    /// Borrows a descriptor number for fstat(2).
    fn fd_ref<'a>(fd: RawFd) -> BorrowedFd<'a> {
        // SAFETY: the number is only passed to fstat(2), which answers EBADF for a
        // closed one; it is never closed or used for I/O here.
        unsafe { BorrowedFd::borrow_raw(fd) }
    }

    fn os(errno: i32) -> io::Error {
        io::Error::from_raw_os_error(errno)
    }

    /// The initialised prefix of a kevent buffer.
    ///
    /// # Safety
    /// The first `n` entries of `buf` are initialised.
    unsafe fn init(buf: &[MaybeUninit<KEvent>], n: usize) -> &[KEvent] {
        debug_assert!(n <= buf.len());
        // SAFETY: the caller promises the first `n` entries are initialised, and
        // MaybeUninit<KEvent> has the layout of KEvent.
        unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<KEvent>(), n) }
    }

    impl Kqueue {
        fn shared(&self) -> MutexGuard<'_, Shared> {
            // Every update under this lock completes before it is released: a panic
            // elsewhere leaves nothing half-done.
            self.shared.lock().unwrap_or_else(PoisonError::into_inner)
        }

        fn kq(&self) -> RawFd {
            self.kq.as_raw_fd()
        }

        /// A new kqueue and its waker.
        fn create() -> io::Result<(OwnedFd, Waker)> {
            let kq = sys::new_kqueue()?;
            let (waker, reg) = if sys::USER_WAKER {
                (Waker::User, sys::user_waker(false))
            } else {
                let (read, write) = pipe::nonblocking_pipe()?;
                let reg = sys::pipe_waker(read.as_raw_fd());
                (Waker::Pipe { read, write }, reg)
            };
            let mut out = [MaybeUninit::<KEvent>::uninit(); 1];
            let n = sys::call(kq.as_raw_fd(), &[reg], &mut out, Some(Duration::ZERO))?;
            // SAFETY: the kernel wrote the first `n` entries.
            if let Some(receipt) = unsafe { init(&out, n) }.first() {
                let errno = sys::errno(receipt);
                if errno != 0 {
                    return Err(os(errno));
                }
            }
            Ok((kq, waker))
        }

        /// Counts one command of `kind` if it has records. The counters count
        /// commands, as on every backend (one per state-machine command that
        /// reaches the kernel), not the one or two records each becomes.
        fn count(&self, kind: Count, plan: &Plan) {
            if !plan.is_empty() {
                self.counters.one(kind);
            }
        }

        /// Decides how `own` (records for one descriptor) travel. Under the lock.
        ///
        /// - its descriptor has records in a `kevent` call that has not returned,
        ///   which it may not overtake ([`Shared::clear_to_go`]): queue behind them
        ///   (and wake a blocked waiter to carry them);
        /// - it adds a knote, or a thread is blocked in `kevent`, or the queue is
        ///   full: submit now, the descriptor's queued records first;
        /// - otherwise: queue, to ride on the next waiting call.
        fn route(sh: &mut Shared, own: &[Record]) -> Route {
            let Some(fd) = own.first().map(|r| r.change.fd) else {
                return Route::Queued { wake: false };
            };
            let adds = own.iter().any(|r| r.change.action == Action::Add);
            if !own.iter().all(|r| sh.clear_to_go(r)) {
                sh.pending.extend(own.iter().copied());
                return Route::Queued {
                    wake: sh.waiters > 0,
                };
            }
            if !(adds || sh.waiters > 0 || sh.pending.len() >= QUEUE_MAX) {
                sh.pending.extend(own.iter().copied());
                return Route::Queued { wake: false };
            }
            let mut batch = Batch::new();
            sh.take_pending(fd, &mut batch);
            for r in own {
                batch.push(*r);
            }
            for r in batch.as_slice() {
                sh.hold(r);
            }
            Route::Now(batch)
        }

        /// Submits `batch` (held in `inflight` by the caller) in change-only calls
        /// with `EV_RECEIPT` and an event list as long as the change list, then
        /// releases it. Calls `answer(index, errno)` for every record (0: done).
        fn submit_now(&self, batch: &[Record], mut answer: impl FnMut(usize, i32)) {
            for (c, chunk) in batch.chunks(CHUNK).enumerate() {
                let mut list = [MaybeUninit::<KEvent>::uninit(); CHUNK];
                for (slot, r) in list.iter_mut().zip(chunk) {
                    slot.write(sys::record(&r.change, changes::EV_RECEIPT));
                }
                // SAFETY: the first `chunk.len()` entries were written just above.
                let list = unsafe { init(&list, chunk.len()) };
                let mut out = [MaybeUninit::<KEvent>::uninit(); CHUNK];
                self.counters.one(Count::CtlCall);
                let mut errnos = [None; CHUNK];
                match sys::call(
                    self.kq(),
                    list,
                    &mut out[..chunk.len()],
                    Some(Duration::ZERO),
                ) {
                    // SAFETY: the kernel wrote the first `n` entries.
                    Ok(n) => pair(chunk, unsafe { init(&out, n) }, |i, e| errnos[i] = Some(e)),
                    Err(e) => errnos = [Some(e.raw_os_error().unwrap_or(libc::EIO)); CHUNK],
                }
                for (i, e) in errnos.iter().take(chunk.len()).enumerate() {
                    // With a receipt per record, a record left unanswered means the
                    // call stopped early: it is not known to be done.
                    answer(c * CHUNK + i, e.unwrap_or(libc::EIO));
                }
            }
            let mut sh = self.shared();
            for r in batch {
                sh.release(r);
            }
        }

        /// Acts on the answer to a record nobody waits for (carried by a wait, or
        /// taken along by another command): ENOENT on `Enable` becomes an `Add`
        /// (pushed to `readds`); other refusals of an arm become an error event for
        /// the registration (pushed to `events`). Under the lock.
        fn settle(
            &self,
            sh: &mut Shared,
            rec: &Record,
            errno: i32,
            events: &mut Vec<RawEvent>,
            readds: &mut Vec<Record>,
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
                    readds.extend(plan.changes().map(|change| Record {
                        change,
                        seq,
                        ..*rec
                    }));
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

        /// Submits records nobody waits for (re-adds, the quiet after a delivery)
        /// and settles their answers; error events go to `events`.
        fn submit_detached(&self, records: Vec<Record>, events: &mut Vec<RawEvent>) {
            let mut todo = records;
            let mut wake = false;
            while !todo.is_empty() {
                let mut readds = Vec::new();
                let mut fds: Vec<RawFd> = Vec::new();
                for r in &todo {
                    if !fds.contains(&r.change.fd) {
                        fds.push(r.change.fd);
                    }
                }
                for fd in fds {
                    let group: Vec<Record> =
                        todo.iter().filter(|r| r.change.fd == fd).copied().collect();
                    let route = Kqueue::route(&mut self.shared(), &group);
                    match route {
                        Route::Queued { wake: w } => wake |= w,
                        Route::Now(batch) => {
                            let batch = batch.as_slice();
                            let mut answers = Vec::new();
                            self.submit_now(batch, |i, e| answers.push((i, e)));
                            let mut sh = self.shared();
                            for (i, errno) in answers {
                                self.settle(&mut sh, &batch[i], errno, events, &mut readds);
                            }
                        }
                    }
                }
                todo = readds;
            }
            if wake {
                // A failed wake leaves the records queued for the next wait.
                let _ = self.kick();
            }
        }

        /// Hands error events found outside a wait to the next wait.
        fn defer(&self, mut events: Vec<RawEvent>) {
            if !events.is_empty() {
                self.shared().deferred.append(&mut events);
                let _ = self.kick();
            }
        }

        /// Translates one command for one registration with `build` (given the view,
        /// it returns the plan), and routes its records. `Ok(None)`: queued (or
        /// nothing to do); `Ok(Some(..))`: submitted, with the kernel's verdict.
        fn exchange(
            &self,
            tag: Tag,
            kind: Count,
            build: impl FnOnce(&View) -> Plan,
        ) -> Option<Verdict> {
            let mut sh = self.shared();
            let view = sh.view(tag);
            let plan = build(view);
            view.knotes = plan.after;
            view.seq = view.seq.wrapping_add(1);
            let seq = view.seq;
            if kind == Count::Delete {
                sh.views.remove(&tag.slot);
            }
            self.count(kind, &plan);
            let mut own = Batch::new();
            for change in plan.changes() {
                own.push(Record {
                    change,
                    slot: tag.slot,
                    seq,
                });
            }
            let own = own.as_slice();
            let route = Kqueue::route(&mut sh, own);
            drop(sh);
            let batch = match route {
                Route::Queued { wake } => {
                    if wake {
                        // A failed wake leaves the records queued for the next wait.
                        let _ = self.kick();
                    }
                    return None;
                }
                Route::Now(batch) => batch,
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
            let mut readds = Vec::new();
            {
                let mut sh = self.shared();
                for (i, errno) in taken {
                    self.settle(&mut sh, &batch[i], errno, &mut deferred, &mut readds);
                }
                for (r, &errno) in own.iter().zip(&errnos) {
                    let f = r.change.filter;
                    if !(r.change.action == Action::Disable && errno == libc::ENOENT) {
                        verdict.all_gone = false;
                    }
                    match (r.change.action, errno) {
                        (_, 0) | (Action::Delete, libc::ENOENT | libc::EBADF) => continue,
                        (Action::Enable | Action::Add, libc::ENOENT) => {
                            verdict.lost = verdict.lost.with(f)
                        }
                        (Action::Disable, libc::ENOENT) => {}
                        (Action::Add, e) if sys::NOT_POLLABLE.contains(&e) => {
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
            if !readds.is_empty() {
                self.submit_detached(readds, &mut deferred);
            }
            self.defer(deferred);
            Some(verdict)
        }

        /// One command for one registration, answered synchronously.
        fn command(&self, fd: RawFd, tag: Tag, command: Command) -> Result<(), KernelError> {
            let udata = pack_usize(tag.slot, tag.incarnation);
            let kind = match command {
                Command::Add(_) => Count::Add,
                Command::Modify(_) => Count::Modify,
                Command::Quiet => Count::Quiet,
                Command::Delete => Count::Delete,
            };
            let build = |v: &View| changes::translate(command, fd, udata, v.knotes);
            let Some(verdict) = self.exchange(tag, kind, build) else {
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
                    let again = self.exchange(tag, Count::Add, readd).unwrap_or_default();
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
                let _ = self.command(fd, tag, Command::Delete);
                return Err(KernelError::NotPollable);
            }
            if command == Command::Quiet && verdict.all_gone {
                return Err(KernelError::NotFound);
            }
            Ok(())
        }

        /// Makes a blocked (or the next) `kevent` return: trigger the user event or
        /// write the pipe, unless a wake-up is already outstanding.
        fn kick(&self) -> io::Result<()> {
            if self.woken.swap(true, SeqCst) {
                return Ok(());
            }
            self.counters.one(Count::Wake);
            let r = match &self.waker {
                Waker::User => {
                    let mut none: [MaybeUninit<KEvent>; 0] = [];
                    sys::call(self.kq(), &[sys::user_waker(true)], &mut none, None).map(drop)
                }
                Waker::Pipe { write, .. } => pipe::wake(write),
            };
            if r.is_err() {
                self.woken.store(false, SeqCst);
            }
            r
        }

        fn is_pipe_waker(&self, e: &KEvent) -> bool {
            match &self.waker {
                Waker::Pipe { read, .. } => sys::ident(e) == read.as_raw_fd() as usize,
                Waker::User => false,
            }
        }
    }

    /// Pairs the `EV_ERROR` entries among `entries` with the records they answer.
    /// The kernel answers records in order, so each entry goes to the first
    /// unanswered record from the previous match on with the same ident, filter and
    /// udata (searching from the start if none follows). Calls `answer(index, errno)`.
    fn pair(records: &[Record], entries: &[KEvent], mut answer: impl FnMut(usize, i32)) {
        if !entries
            .iter()
            .any(|e| sys::flags(e) & changes::EV_ERROR != 0)
        {
            return;
        }
        let mut answered = vec![false; records.len()];
        let mut cursor = 0;
        for e in entries {
            if sys::flags(e) & changes::EV_ERROR == 0 {
                continue;
            }
            let Kind::Fd(filter) = sys::kind(e) else {
                continue;
            };
            let is = |r: &Record| {
                r.change.fd as usize == sys::ident(e)
                    && r.change.filter == filter
                    && r.change.udata == sys::udata(e)
            };
            let found = (cursor..records.len())
                .chain(0..cursor)
                .find(|&i| !answered[i] && is(&records[i]));
            if let Some(i) = found {
                answered[i] = true;
                cursor = i + 1;
                answer(i, sys::errno(e));
            }
        }
    }

    impl Driver for Kqueue {
        const NAME: &'static str = "kqueue";
        const TAG_IS_GENERATION: bool = false;
        const SPLIT_FILTERS: bool = true;

        fn new() -> io::Result<Kqueue> {
            let (kq, waker) = Kqueue::create()?;
            Ok(Kqueue {
                kq: ManuallyDrop::new(kq),
                waker,
                shared: Mutex::new(Shared::default()),
                user_woken: AtomicBool::new(false),
                woken: AtomicBool::new(false),
                forsaken: false,
                counters: Counters::default(),
            })
        }

        /// `EV_ADD | EV_DISPATCH` per filter, submitted at once. A regular file is
        /// reported always ready (one fstat(2) tells), as on epoll: kqueue would
        /// never report a file at its end as readable.
        fn add(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
            match rustix::fs::fstat(fd_ref(fd)) {
                Ok(st)
                    if rustix::fs::FileType::from_raw_mode(st.st_mode)
                        == rustix::fs::FileType::RegularFile =>
                {
                    return Err(KernelError::NotPollable);
                }
                Ok(_) => {}
                Err(e) => return Err(classify(e.into(), &[])),
            }
            self.command(fd, tag, Command::Add(interest))
        }

        fn modify(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
            self.command(fd, tag, Command::Modify(interest))
        }

        fn quiet(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError> {
            self.command(fd, tag, Command::Quiet)
        }

        fn delete(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError> {
            self.command(fd, tag, Command::Delete)
        }

        /// Disables the filters that did not fire, unless a command for the
        /// registration came after the event was read (then that command decided).
        fn delivered(&self, fd: RawFd, tag: Tag, _interest: Interest, _readiness: Readiness) {
            let udata = pack_usize(tag.slot, tag.incarnation);
            let own = {
                let mut sh = self.shared();
                let Some(view) = sh.views.get_mut(&tag.slot) else {
                    return;
                };
                if view.incarnation != tag.incarnation || view.fired_at != Some(view.seq) {
                    return;
                }
                let plan = changes::after_delivery(fd, udata, view.knotes, view.fired);
                view.knotes = plan.after;
                if plan.is_empty() {
                    return;
                }
                view.seq = view.seq.wrapping_add(1);
                let seq = view.seq;
                self.count(Count::Quiet, &plan);
                plan.changes()
                    .map(|change| Record {
                        change,
                        slot: tag.slot,
                        seq,
                    })
                    .collect::<Vec<_>>()
            };
            let mut events = Vec::new();
            self.submit_detached(own, &mut events);
            self.defer(events);
        }

        fn wait(
            &self,
            out: &mut Vec<RawEvent>,
            max: usize,
            timeout: Option<Duration>,
        ) -> io::Result<bool> {
            let max = max.max(1);
            let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
            let mut remaining = timeout;
            loop {
                // Enter: take the queue (it rides on this call) and count as a waiter.
                // A record whose descriptor is in another thread's call stays queued
                // (it must reach the kernel after that call's records).
                let mut carried = [NO_RECORD; CARRY];
                let mut ncarried = 0;
                {
                    let mut sh = self.shared();
                    sh.take_deferred(out, max.saturating_sub(out.len()));
                    if out.len() >= max {
                        return Ok(false);
                    }
                    let mut skipped = VecDeque::new();
                    while ncarried < CARRY {
                        let Some(r) = sh.pending.pop_front() else {
                            break;
                        };
                        let fd = r.change.fd;
                        // Records of one descriptor keep their order: once one is
                        // skipped, so are the ones after it.
                        if !sh.clear_to_go(&r) || skipped.iter().any(|s: &Record| s.change.fd == fd)
                        {
                            skipped.push_back(r);
                            continue;
                        }
                        carried[ncarried] = r;
                        ncarried += 1;
                    }
                    while let Some(r) = skipped.pop_back() {
                        sh.pending.push_front(r);
                    }
                    for r in &carried[..ncarried] {
                        sh.hold(r);
                    }
                    sh.waiters += 1;
                }
                let carried = &carried[..ncarried];
                let mut list = [MaybeUninit::<KEvent>::uninit(); CARRY];
                for (slot, r) in list.iter_mut().zip(carried) {
                    slot.write(sys::record(&r.change, 0));
                }
                // SAFETY: the first `ncarried` entries were written just above.
                let list = unsafe { init(&list, ncarried) };
                // Room for an error entry per carried record, then the events.
                let room = (max - out.len()).min(BATCH);
                let mut buf = [MaybeUninit::<KEvent>::uninit(); CARRY + BATCH];
                let t = if out.is_empty() {
                    remaining
                } else {
                    Some(Duration::ZERO)
                };
                self.counters.one(Count::Wait);
                let result = sys::call(self.kq(), list, &mut buf[..ncarried + room], t);

                // Leave: read what came back.
                let n = *result.as_ref().unwrap_or(&0);
                // SAFETY: the kernel wrote the first `n` entries.
                let entries = unsafe { init(&buf, n) };
                // libkqueue drops the answers of carried changes when nothing fires
                // (see sys::WAIT_RETURNS_CHANGE_ERRORS): ask again with receipts.
                let again =
                    |r: &&Record| matches!(r.change.action, Action::Enable | Action::Disable);
                let reverify =
                    !sys::WAIT_RETURNS_CHANGE_ERRORS && n == 0 && carried.iter().any(|r| again(&r));
                let mut woke = false;
                let mut readds = Vec::new();
                let mut refused = Vec::new();
                let wake_others;
                {
                    let mut sh = self.shared();
                    sh.waiters -= 1;
                    for r in carried.iter().filter(|r| !reverify || !again(r)) {
                        sh.release(r);
                    }
                    let mut errors = Vec::new();
                    pair(carried, entries, |i, errno| errors.push((i, errno)));
                    for (i, errno) in errors {
                        self.settle(&mut sh, &carried[i], errno, &mut refused, &mut readds);
                    }
                    for e in entries {
                        let flags = sys::flags(e);
                        if flags & changes::EV_ERROR != 0 {
                            continue;
                        }
                        let filter = match sys::kind(e) {
                            Kind::User => {
                                woke = true;
                                continue;
                            }
                            Kind::Fd(_) if self.is_pipe_waker(e) => {
                                woke = true;
                                continue;
                            }
                            Kind::Fd(filter) => filter,
                            Kind::Other => continue,
                        };
                        let (slot, stamp) = unpack_usize(sys::udata(e));
                        if let Some(v) = sh.views.get_mut(&slot) {
                            if incarnation_in_usize(v.incarnation) == stamp {
                                if v.fired_at != Some(v.seq) {
                                    v.fired_at = Some(v.seq);
                                    v.fired = Filters::NONE;
                                }
                                v.fired = v.fired.with(filter);
                            }
                        }
                        let ev = RawEvent {
                            slot,
                            stamp,
                            readiness: changes::readiness(filter, flags, sys::fflags(e)),
                        };
                        // The kernel disabled the knote when it reported it: an event
                        // this call has no room for is kept for the next wait.
                        if out.len() < max {
                            out.push(ev);
                        } else {
                            sh.deferred.push(ev);
                        }
                    }
                    wake_others =
                        (!sh.pending.is_empty() || !sh.deferred.is_empty()) && sh.waiters > 0;
                }
                if reverify {
                    // Still held in `inflight`, so nothing overtook them; repeating an
                    // enable or a disable is harmless.
                    let batch: Vec<Record> = carried.iter().filter(again).copied().collect();
                    let mut answers = Vec::new();
                    self.submit_now(&batch, |i, e| answers.push((i, e)));
                    let mut sh = self.shared();
                    for (i, errno) in answers {
                        self.settle(&mut sh, &batch[i], errno, &mut refused, &mut readds);
                    }
                }
                if woke {
                    if let Waker::Pipe { read, .. } = &self.waker {
                        self.counters.bump(Count::WakeRead, pipe::drain(read));
                    }
                    // Clear before reading `user_woken`: a notify that lands in between
                    // either sees `woken` clear and wakes again, or stored its flag
                    // before this read (all SeqCst).
                    self.woken.store(false, SeqCst);
                }
                let user = woke && self.user_woken.swap(false, SeqCst);
                if !readds.is_empty() {
                    self.submit_detached(readds, &mut refused);
                }
                if !refused.is_empty() {
                    let room = max.saturating_sub(out.len()).min(refused.len());
                    out.extend(refused.drain(..room));
                    self.shared().deferred.append(&mut refused);
                }
                if wake_others {
                    // Changes queued behind this call's, or events it had no room
                    // for: a blocked waiter picks them up.
                    let _ = self.kick();
                }
                result?;
                if !out.is_empty() || user || timeout == Some(Duration::ZERO) {
                    return Ok(user);
                }
                // Woken for queued changes, or only answers to changes came back:
                // wait again for the time left.
                remaining = match deadline {
                    None if timeout.is_some() => Some(Duration::MAX),
                    None => None,
                    Some(d) => {
                        let now = Instant::now();
                        if now >= d {
                            return Ok(false);
                        }
                        Some(d - now)
                    }
                };
            }
        }

        fn wake(&self) -> io::Result<()> {
            self.user_woken.store(true, SeqCst);
            self.kick()
        }

        fn reinit_after_fork(&mut self) -> io::Result<()> {
            // The inherited kqueue number is not the child's (a kqueue is not
            // inherited across fork): replace it without closing it (`ManuallyDrop`).
            let (kq, waker) = Kqueue::create()?;
            self.kq = ManuallyDrop::new(kq);
            // A pipe waker is the child's own copy: dropping it closes only that.
            self.waker = waker;
            *self
                .shared
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner) = Shared::default();
            *self.user_woken.get_mut() = false;
            *self.woken.get_mut() = false;
            self.forsaken = false;
            Ok(())
        }

        fn abandon_after_fork(&mut self) {
            self.forsaken = true;
        }

        fn owns_fd(&self, fd: RawFd) -> bool {
            fd == self.kq.as_raw_fd()
                || matches!(&self.waker, Waker::Pipe { read, write }
                    if fd == read.as_raw_fd() || fd == write.as_raw_fd())
        }

        fn counters(&self) -> &Counters {
            &self.counters
        }
    }

    impl Drop for Kqueue {
        fn drop(&mut self) {
            if !self.forsaken {
                // SAFETY: dropped once, here, and never used afterwards.
                unsafe { ManuallyDrop::drop(&mut self.kq) };
            }
        }
    }

    impl AsFd for Kqueue {
        /// The kqueue (to nest this poller in another).
        fn as_fd(&self) -> BorrowedFd<'_> {
            self.kq.as_fd()
        }
    }
}

#[cfg(test)]
mod tests {
    //! The translator, row by row of the state table, with the exact records; the
    //! readiness mapping; and parity with epoll through the kernel model.

    use super::changes::*;
    use crate::event::Readiness;
    use crate::interest::Interest;
    use crate::state::{Armed, Fallbacks, Kernel, KernelError, Phase, RegState};
    use crate::token::pack_usize;
    use std::collections::VecDeque;
    use std::os::fd::RawFd;

    const FD: RawFd = 42;
    const R: Interest = Interest::READABLE;
    const W: Interest = Interest::WRITABLE;
    const B: Interest = Interest::BOTH;

    fn udata() -> usize {
        pack_usize(7, 3)
    }

    fn rec(filter: Filter, action: Action) -> Change {
        Change {
            fd: FD,
            filter,
            action,
            udata: udata(),
        }
    }

    use Action::{Add, Delete, Disable, Enable};
    use Filter::{Read, Write};

    /// A kernel that records every change record and answers from a script (0 once
    /// it is used up), translating each command as the backend does: `translate`,
    /// and on ENOENT from an `Enable` or an `Add`, `readd`.
    struct Recorder {
        knotes: Knotes,
        log: Vec<Change>,
        script: VecDeque<i32>,
    }

    impl Recorder {
        fn new() -> Recorder {
            Recorder::answering(&[])
        }

        fn answering(script: &[i32]) -> Recorder {
            Recorder {
                knotes: Knotes::NONE,
                log: Vec::new(),
                script: script.iter().copied().collect(),
            }
        }

        fn submit(&mut self, plan: Plan) -> Vec<(Change, i32)> {
            let mut answers = Vec::new();
            let mut after = plan.after;
            for c in plan.changes() {
                let errno = self.script.pop_front().unwrap_or(0);
                self.log.push(c);
                if errno != 0 && c.action != Delete {
                    after.present = after.present.without(c.filter);
                    after.enabled = after.enabled.without(c.filter);
                }
                answers.push((c, errno));
            }
            self.knotes = after;
            answers
        }

        fn run(&mut self, command: Command) -> Result<(), KernelError> {
            let answers = self.submit(translate(command, FD, udata(), self.knotes));
            let lost = answers
                .iter()
                .any(|(c, e)| matches!(c.action, Enable | Add) && *e == libc::ENOENT);
            let gone = answers
                .iter()
                .all(|(c, e)| c.action == Disable && *e == libc::ENOENT);
            for (c, e) in &answers {
                match (c.action, *e) {
                    (_, 0) | (Delete, libc::ENOENT | libc::EBADF) | (_, libc::ENOENT) => {}
                    (Add, libc::EINVAL) => return Err(KernelError::NotPollable),
                    (_, libc::EBADF) => return Err(KernelError::BadFd),
                    (_, e) => return Err(KernelError::Other(std::io::Error::from_raw_os_error(e))),
                }
            }
            match command {
                Command::Add(i) | Command::Modify(i) if lost => {
                    self.submit(readd(FD, udata(), i));
                    Ok(())
                }
                Command::Quiet if gone && !answers.is_empty() => Err(KernelError::NotFound),
                _ => Ok(()),
            }
        }

        fn take(&mut self) -> Vec<Change> {
            std::mem::take(&mut self.log)
        }
    }

    impl Kernel for Recorder {
        fn add(&mut self, interest: Interest, _: u32) -> Result<(), KernelError> {
            self.run(Command::Add(interest))
        }
        fn modify(&mut self, interest: Interest, _: u32) -> Result<(), KernelError> {
            self.run(Command::Modify(interest))
        }
        fn quiet(&mut self, _: u32) -> Result<(), KernelError> {
            self.run(Command::Quiet)
        }
        fn delete(&mut self) -> Result<(), KernelError> {
            self.run(Command::Delete)
        }
    }

    fn arm(s: &mut RegState, i: Interest, k: &mut Recorder) -> Result<Armed, KernelError> {
        s.arm(i, k, &mut Fallbacks::default())
    }

    /// A registration armed for `i` (its records taken).
    fn armed(i: Interest) -> (RegState, Recorder) {
        let mut s = RegState::new(0);
        let mut k = Recorder::new();
        arm(&mut s, i, &mut k).unwrap();
        k.take();
        (s, k)
    }

    /// A registration armed for `i`, then delivered (the backend's
    /// `after_delivery` applied with `fired` filters): idle in the kernel.
    fn idle(i: Interest, fired: Filters) -> (RegState, Recorder) {
        let (mut s, mut k) = armed(i);
        assert_eq!(s.on_event(None), Some(i));
        let plan = after_delivery(FD, udata(), k.knotes, fired);
        k.submit(plan);
        k.take();
        (s, k)
    }

    #[test]
    fn flags_are_the_portable_values() {
        assert_eq!(Add.flags(), 0x0081, "EV_ADD | EV_DISPATCH");
        assert_eq!(Enable.flags(), 0x0084, "EV_ENABLE | EV_DISPATCH");
        assert_eq!(Disable.flags(), 0x0088, "EV_DISABLE | EV_DISPATCH");
        assert_eq!(Delete.flags(), 0x0002, "EV_DELETE");
        assert_eq!(rec(Read, Enable).flags(), Enable.flags());
        assert_eq!(
            (EV_RECEIPT, EV_CLEAR, EV_ERROR, EV_EOF),
            (0x40, 0x20, 0x4000, 0x8000)
        );
    }

    // Row: fresh | arm(i) | add(i) | armed(i, g+1). One EV_ADD | EV_DISPATCH per
    // filter in the interest; the other filter is not added. (kqueue's EV_ADD of an
    // existing knote updates it: it never answers EEXIST, so that fallback is
    // epoll's only.)
    #[test]
    fn row_fresh_arm_adds_each_filter_of_the_interest() {
        for (i, want) in [
            (R, vec![rec(Read, Add)]),
            (W, vec![rec(Write, Add)]),
            (B, vec![rec(Read, Add), rec(Write, Add)]),
        ] {
            let mut s = RegState::new(0);
            let mut k = Recorder::new();
            assert!(matches!(arm(&mut s, i, &mut k), Ok(Armed::Kernel)));
            assert_eq!(k.take(), want, "{i:?}");
            assert_eq!(k.knotes.present, Filters::of(i));
            assert_eq!(k.knotes.enabled, Filters::of(i));
            assert_eq!(s.phase(), Phase::Armed(i));
        }
    }

    #[test]
    fn row_fresh_arm_refused() {
        // EINVAL (a device kqueue cannot poll, P09): always ready, nothing kept.
        let mut s = RegState::new(0);
        let mut k = Recorder::answering(&[libc::EINVAL]);
        assert!(matches!(arm(&mut s, R, &mut k), Ok(Armed::Synthetic)));
        assert_eq!(k.take(), [rec(Read, Add)]);
        assert!(s.is_always_ready() && !s.in_kernel());
        assert_eq!(k.knotes, Knotes::NONE);
        // EBADF: an error, the registration unchanged.
        let mut s = RegState::new(0);
        let mut k = Recorder::answering(&[libc::EBADF]);
        assert!(matches!(arm(&mut s, R, &mut k), Err(KernelError::BadFd)));
        assert_eq!(s, RegState::new(0));
    }

    // Row: idle | arm(i) | modify(i); on ENOENT: add(i) | armed(i, g+1). EV_ENABLE |
    // EV_DISPATCH for the filters present, EV_ADD for one never added; nothing for
    // a filter that is disabled already.
    #[test]
    fn row_idle_arm_enables() {
        for (first, fired, i, want) in [
            (R, Filters::READ, R, vec![rec(Read, Enable)]),
            (R, Filters::READ, W, vec![rec(Write, Add)]),
            (
                R,
                Filters::READ,
                B,
                vec![rec(Read, Enable), rec(Write, Add)],
            ),
            (B, Filters::READ, R, vec![rec(Read, Enable)]),
            (B, Filters::WRITE, W, vec![rec(Write, Enable)]),
            (
                B,
                Filters::BOTH,
                B,
                vec![rec(Read, Enable), rec(Write, Enable)],
            ),
        ] {
            let (mut s, mut k) = idle(first, fired);
            assert_eq!(
                k.knotes.enabled,
                Filters::NONE,
                "a delivery leaves nothing enabled"
            );
            assert!(matches!(arm(&mut s, i, &mut k), Ok(Armed::Kernel)));
            assert_eq!(
                k.take(),
                want,
                "armed {first:?}, fired {fired:?}, then {i:?}"
            );
            assert_eq!(k.knotes.enabled, Filters::of(i));
            assert_eq!(s.phase(), Phase::Armed(i));
        }
    }

    #[test]
    fn row_idle_arm_not_found_starts_over() {
        // The descriptor was closed and its number reused: the kernel lost it.
        for (i, adds) in [
            (R, vec![rec(Read, Add)]),
            (B, vec![rec(Read, Add), rec(Write, Add)]),
        ] {
            let (mut s, _) = idle(B, Filters::BOTH);
            let mut k = Recorder::answering(&[libc::ENOENT, libc::ENOENT]);
            k.knotes = Knotes {
                present: Filters::BOTH,
                enabled: Filters::NONE,
            };
            assert!(matches!(arm(&mut s, i, &mut k), Ok(Armed::Kernel)));
            let mut want: Vec<Change> = translate(
                Command::Modify(i),
                FD,
                udata(),
                Knotes {
                    present: Filters::BOTH,
                    enabled: Filters::NONE,
                },
            )
            .changes()
            .collect();
            want.extend([rec(Read, Delete), rec(Write, Delete)]);
            want.extend(adds);
            assert_eq!(k.take(), want, "{i:?}");
            assert_eq!(k.knotes.present, Filters::of(i));
            assert_eq!(s.phase(), Phase::Armed(i));
        }
    }

    // Row: armed(i, g) | arm(i) | none: zero records | armed(i, g).
    #[test]
    fn row_armed_arm_same_interest_issues_nothing() {
        for i in Interest::ALL {
            let (mut s, mut k) = armed(i);
            assert!(matches!(arm(&mut s, i, &mut k), Ok(Armed::Unchanged)));
            assert!(k.take().is_empty());
        }
    }

    // Row: armed(i, g) | arm(j), j != i | modify(j) | armed(j, g+1). Enable (or add)
    // the filters of j, disable the enabled ones outside it.
    #[test]
    fn row_armed_arm_other_interest() {
        for (i, j, want) in [
            (R, W, vec![rec(Read, Disable), rec(Write, Add)]),
            (R, B, vec![rec(Read, Enable), rec(Write, Add)]),
            (W, R, vec![rec(Read, Add), rec(Write, Disable)]),
            (W, B, vec![rec(Read, Add), rec(Write, Enable)]),
            (B, R, vec![rec(Read, Enable), rec(Write, Disable)]),
            (B, W, vec![rec(Read, Disable), rec(Write, Enable)]),
        ] {
            let (mut s, mut k) = armed(i);
            assert!(matches!(arm(&mut s, j, &mut k), Ok(Armed::Kernel)));
            assert_eq!(k.take(), want, "{i:?} -> {j:?}");
            assert_eq!(k.knotes.enabled, Filters::of(j));
            assert_eq!(k.knotes.present, Filters::of(i).union(Filters::of(j)));
        }
    }

    // Row: armed(i, g) | disarm | quiet | idle, g+1. EV_DISABLE | EV_DISPATCH for
    // each enabled filter (EV_DISPATCH kept, or a re-enable could fire twice).
    #[test]
    fn row_armed_disarm_disables() {
        for (i, want) in [
            (R, vec![rec(Read, Disable)]),
            (W, vec![rec(Write, Disable)]),
            (B, vec![rec(Read, Disable), rec(Write, Disable)]),
        ] {
            let (mut s, mut k) = armed(i);
            assert!(matches!(s.disarm(&mut k), Ok(true)));
            assert_eq!(k.take(), want, "{i:?}");
            assert_eq!(k.knotes.enabled, Filters::NONE);
            assert_eq!(
                k.knotes.present,
                Filters::of(i),
                "never deleted by a disarm"
            );
            assert_eq!(s.phase(), Phase::Idle);
        }
        // Armed for R after B: only R is enabled; W was disabled by the arm.
        let (mut s, mut k) = armed(B);
        arm(&mut s, R, &mut k).unwrap();
        k.take();
        s.disarm(&mut k).unwrap();
        assert_eq!(k.take(), [rec(Read, Disable)]);
        // ENOENT: the kernel dropped it; fresh.
        let (mut s, mut k) = armed(R);
        k.script.push_back(libc::ENOENT);
        assert!(matches!(s.disarm(&mut k), Ok(true)));
        assert_eq!(s.phase(), Phase::Fresh);
    }

    // Row: fresh or idle | disarm | none | unchanged.
    #[test]
    fn row_fresh_or_idle_disarm_issues_nothing() {
        let mut s = RegState::new(0);
        let mut k = Recorder::new();
        assert!(matches!(s.disarm(&mut k), Ok(false)));
        let (mut s, mut k2) = idle(B, Filters::READ);
        assert!(matches!(s.disarm(&mut k2), Ok(false)));
        assert!(k.take().is_empty() && k2.take().is_empty());
    }

    // Row: armed(i, g) | kernel event | none | idle; delivered. EV_DISPATCH disabled
    // the filter that fired; the other enabled one is disabled after the delivery,
    // so one delivery disarms the whole registration (parity with EPOLLONESHOT).
    #[test]
    fn row_delivery_disables_the_filters_that_did_not_fire() {
        let both = Knotes {
            present: Filters::BOTH,
            enabled: Filters::BOTH,
        };
        let plan = after_delivery(FD, udata(), both, Filters::READ);
        assert_eq!(plan.changes().collect::<Vec<_>>(), [rec(Write, Disable)]);
        assert_eq!(plan.after.enabled, Filters::NONE);
        let plan = after_delivery(FD, udata(), both, Filters::WRITE);
        assert_eq!(plan.changes().collect::<Vec<_>>(), [rec(Read, Disable)]);
        assert!(after_delivery(FD, udata(), both, Filters::BOTH).is_empty());
        let read = Knotes {
            present: Filters::BOTH,
            enabled: Filters::READ,
        };
        let plan = after_delivery(FD, udata(), read, Filters::READ);
        assert!(
            plan.is_empty(),
            "a single-filter arming costs nothing after delivery"
        );
        assert_eq!(
            plan.after,
            Knotes {
                present: Filters::BOTH,
                enabled: Filters::NONE
            }
        );
    }

    // Row: any | stale event | none | unchanged. Nothing to translate: the table
    // drops it. Row: in kernel | deregister | delete | freed.
    #[test]
    fn row_in_kernel_deregister_deletes_each_added_filter() {
        for (i, want) in [
            (R, vec![rec(Read, Delete)]),
            (W, vec![rec(Write, Delete)]),
            (B, vec![rec(Read, Delete), rec(Write, Delete)]),
        ] {
            let (mut s, mut k) = armed(i);
            assert!(matches!(s.deregister(&mut k), Ok(true)));
            assert_eq!(k.take(), want, "{i:?}");
            assert_eq!(k.knotes, Knotes::NONE);
        }
        // Idle after R then W: both knotes exist, both deleted.
        let (mut s, mut k) = idle(R, Filters::READ);
        arm(&mut s, W, &mut k).unwrap();
        s.disarm(&mut k).unwrap();
        k.take();
        s.deregister(&mut k).unwrap();
        assert_eq!(k.take(), [rec(Read, Delete), rec(Write, Delete)]);
        // ENOENT / EBADF (closed): not errors.
        for e in [libc::ENOENT, libc::EBADF] {
            let (mut s, mut k) = armed(R);
            k.script.push_back(e);
            assert!(matches!(s.deregister(&mut k), Ok(true)));
        }
    }

    // Row: fresh | deregister | none | freed.
    #[test]
    fn row_fresh_deregister_issues_nothing() {
        let mut s = RegState::new(0);
        let mut k = Recorder::new();
        assert!(matches!(s.deregister(&mut k), Ok(false)));
        assert!(k.take().is_empty());
    }

    #[test]
    fn readd_deletes_then_adds_the_interest() {
        let plan = readd(FD, udata(), W);
        assert_eq!(
            plan.changes().collect::<Vec<_>>(),
            [rec(Read, Delete), rec(Write, Delete), rec(Write, Add)]
        );
        assert_eq!(
            plan.after,
            Knotes {
                present: Filters::WRITE,
                enabled: Filters::WRITE
            }
        );
    }

    #[test]
    fn readiness_per_filter() {
        let rc = Readiness::READABLE.union(Readiness::READ_CLOSED);
        let wc = Readiness::WRITABLE.union(Readiness::WRITE_CLOSED);
        assert_eq!(readiness(Read, 0, 0), Readiness::READABLE);
        assert_eq!(readiness(Write, 0, 0), Readiness::WRITABLE);
        // P10: a peer's shutdown(SHUT_WR) is read-closed only.
        assert_eq!(readiness(Read, EV_EOF, 0), rc);
        assert_eq!(readiness(Write, EV_EOF, 0), wc);
        // EV_EOF with the socket's error in fflags (P11: a reset).
        assert_eq!(
            readiness(Read, EV_EOF, libc::ECONNRESET as u32),
            rc.union(Readiness::ERROR)
        );
        assert_eq!(
            readiness(Write, EV_EOF, libc::EPIPE as u32),
            wc.union(Readiness::ERROR)
        );
        // fflags without EV_EOF is filter data (NOTE_LOWAT...), not an error.
        assert_eq!(
            readiness(Read, EV_DISPATCH | EV_ADD, 1),
            Readiness::READABLE
        );
        assert!(REFUSED.contains(
            Readiness::ERROR
                .union(Readiness::READABLE)
                .union(Readiness::WRITABLE)
        ));
    }

    /// Parity: random operation sequences on a few registrations, run through the
    /// kernel model with epoll semantics (its own translation, as
    /// `backends/epoll.rs`) and with kqueue semantics driven by this translator;
    /// after every wait both deliver to the same registrations, and every
    /// registration ends in the same phase.
    mod parity {
        use super::super::changes::{self, Command, Filters, Knotes, Plan};
        use crate::backend::RawEvent;
        use crate::interest::Interest;
        use crate::model::{self, Levels, Model, Origin, Semantics};
        use crate::state::{Fallbacks, Kernel, KernelError, Phase, RegState};
        use crate::token::{incarnation_in_usize, pack_usize};

        /// The kqueue side of one registration: this translator over the model.
        struct Kq<'a> {
            model: &'a mut Model,
            fd: model::Fd,
            udata: usize,
            knotes: &'a mut Knotes,
            origin: Origin,
        }

        impl Kq<'_> {
            fn submit(&mut self, plan: Plan) -> Vec<(changes::Action, Option<model::Errno>)> {
                let records: Vec<model::Change> = plan
                    .changes()
                    .map(|c| model::Change {
                        ident: c.fd,
                        filter: match c.filter {
                            changes::Filter::Read => model::Filter::Read,
                            changes::Filter::Write => model::Filter::Write,
                        },
                        flags: c.flags() | changes::EV_RECEIPT,
                        udata: c.udata as u64,
                        origin: self.origin,
                    })
                    .collect();
                let answers = self.model.kevent(&records);
                let mut after = plan.after;
                let mut out = Vec::new();
                for (c, a) in plan.changes().zip(answers) {
                    if a.is_err() && c.action != changes::Action::Delete {
                        after.present = after.present.without(c.filter);
                        after.enabled = after.enabled.without(c.filter);
                    }
                    out.push((c.action, a.err()));
                }
                *self.knotes = after;
                out
            }

            fn run(&mut self, command: Command) -> Result<(), KernelError> {
                use changes::Action::*;
                let plan = changes::translate(command, self.fd, self.udata, *self.knotes);
                let answers = self.submit(plan);
                let lost = answers
                    .iter()
                    .any(|(a, e)| matches!(a, Enable | Add) && *e == Some(model::Errno::NoEnt));
                for (a, e) in &answers {
                    match (a, e) {
                        (_, None) | (Delete, _) | (_, Some(model::Errno::NoEnt)) => {}
                        (Add, Some(model::Errno::Inval)) => return Err(KernelError::NotPollable),
                        (_, Some(model::Errno::BadF)) => return Err(KernelError::BadFd),
                        (_, Some(e)) => {
                            return Err(KernelError::Other(std::io::Error::from_raw_os_error(
                                e.raw(),
                            )))
                        }
                    }
                }
                match command {
                    Command::Add(i) | Command::Modify(i) if lost => {
                        let plan = changes::readd(self.fd, self.udata, i);
                        self.submit(plan);
                        Ok(())
                    }
                    Command::Quiet
                        if !answers.is_empty()
                            && answers.iter().all(|(_, e)| *e == Some(model::Errno::NoEnt)) =>
                    {
                        Err(KernelError::NotFound)
                    }
                    _ => Ok(()),
                }
            }
        }

        impl Kernel for Kq<'_> {
            fn add(&mut self, i: Interest, _: u32) -> Result<(), KernelError> {
                self.run(Command::Add(i))
            }
            fn modify(&mut self, i: Interest, _: u32) -> Result<(), KernelError> {
                self.run(Command::Modify(i))
            }
            fn quiet(&mut self, _: u32) -> Result<(), KernelError> {
                self.run(Command::Quiet)
            }
            fn delete(&mut self) -> Result<(), KernelError> {
                self.run(Command::Delete)
            }
        }

        /// One registration on one side.
        struct Reg {
            fd: model::Fd,
            slot: u32,
            incarnation: u32,
            state: RegState,
            knotes: Knotes,
            fired: Filters,
        }

        /// One side: a model and its registrations (by index).
        struct Side {
            model: Model,
            regs: Vec<Reg>,
        }

        #[derive(Clone, Copy, Debug)]
        enum Op {
            Arm(usize, Interest),
            Disarm(usize),
            Levels(usize, u8),
            Wait,
            /// Close the number without deregistering; open a new description there.
            Reuse(usize),
            /// Deregister and register the same number again (a new incarnation).
            Reregister(usize),
        }

        const REGS: usize = 3;

        impl Side {
            fn new(semantics: Semantics) -> Side {
                let mut model = Model::new(semantics);
                let regs = (0..REGS)
                    .map(|i| Reg {
                        fd: model.open(true),
                        slot: i as u32,
                        incarnation: i as u32,
                        state: RegState::new(0),
                        knotes: Knotes::NONE,
                        fired: Filters::NONE,
                    })
                    .collect();
                Side { model, regs }
            }

            fn kernel_call<T>(
                &mut self,
                r: usize,
                f: impl FnOnce(&mut RegState, &mut dyn Kernel) -> T,
            ) -> T {
                let reg = &mut self.regs[r];
                let origin = Origin {
                    owner: r as u64,
                    arming: 1,
                };
                if self.model.semantics() == Semantics::Kqueue {
                    let mut k = Kq {
                        model: &mut self.model,
                        fd: reg.fd,
                        udata: pack_usize(reg.slot, reg.incarnation),
                        knotes: &mut reg.knotes,
                        origin,
                    };
                    f(&mut reg.state, &mut k)
                } else {
                    let mut k = self.model.kernel(reg.fd, reg.slot, reg.incarnation, origin);
                    f(&mut reg.state, &mut k)
                }
            }

            /// Applies `op`; for a wait, returns the registrations delivered to.
            fn apply(&mut self, op: Op) -> Option<Vec<usize>> {
                match op {
                    Op::Arm(r, i) => {
                        self.kernel_call(r, |s, k| {
                            s.arm(i, &mut Wrap(k), &mut Fallbacks::default())
                        })
                        .expect("arm");
                    }
                    Op::Disarm(r) => {
                        self.kernel_call(r, |s, k| s.disarm(&mut Wrap(k)))
                            .expect("disarm");
                    }
                    Op::Levels(r, bits) => {
                        let desc = self.model.description(self.regs[r].fd).unwrap();
                        self.model.set_levels(desc, Levels::from_bits(bits));
                    }
                    Op::Reuse(r) => {
                        let fd = self.regs[r].fd;
                        self.model.close(fd).unwrap();
                        self.model.open_at(fd, true).unwrap();
                    }
                    Op::Reregister(r) => {
                        self.kernel_call(r, |s, k| s.deregister(&mut Wrap(k)))
                            .expect("deregister");
                        let reg = &mut self.regs[r];
                        reg.incarnation += REGS as u32;
                        reg.state = RegState::new(reg.state.generation());
                        reg.knotes = Knotes::NONE;
                    }
                    Op::Wait => return Some(self.wait()),
                }
                None
            }

            /// One wait, accepted as the poller does.
            fn wait(&mut self) -> Vec<usize> {
                let events = self.model.wait(64);
                let kq = self.model.semantics() == Semantics::Kqueue;
                let mut delivered = Vec::new();
                for reg in &mut self.regs {
                    reg.fired = Filters::NONE;
                }
                for ev in &events {
                    let RawEvent { slot, stamp, .. } = ev.raw;
                    let r = slot as usize;
                    let reg = &mut self.regs[r];
                    let tag = if kq {
                        if stamp != incarnation_in_usize(reg.incarnation) {
                            continue;
                        }
                        if let Some(f) = ev.filter {
                            reg.fired = reg.fired.with(match f {
                                model::Filter::Read => changes::Filter::Read,
                                model::Filter::Write => changes::Filter::Write,
                            });
                        }
                        None
                    } else {
                        Some(stamp)
                    };
                    if reg.state.on_event(tag).is_some() {
                        delivered.push(r);
                    }
                }
                if kq {
                    for &r in &delivered {
                        let reg = &mut self.regs[r];
                        let udata = pack_usize(reg.slot, reg.incarnation);
                        let plan = changes::after_delivery(reg.fd, udata, reg.knotes, reg.fired);
                        let mut k = Kq {
                            model: &mut self.model,
                            fd: reg.fd,
                            udata,
                            knotes: &mut reg.knotes,
                            origin: Origin {
                                owner: r as u64,
                                arming: 0,
                            },
                        };
                        k.submit(plan);
                    }
                }
                delivered.sort_unstable();
                delivered
            }

            fn phases(&self) -> Vec<Phase> {
                self.regs.iter().map(|r| r.state.phase()).collect()
            }
        }

        /// `&mut dyn Kernel` as a `Kernel` (the state machine takes `K: Kernel`).
        struct Wrap<'a>(&'a mut dyn Kernel);

        impl Kernel for Wrap<'_> {
            fn add(&mut self, i: Interest, g: u32) -> Result<(), KernelError> {
                self.0.add(i, g)
            }
            fn modify(&mut self, i: Interest, g: u32) -> Result<(), KernelError> {
                self.0.modify(i, g)
            }
            fn quiet(&mut self, g: u32) -> Result<(), KernelError> {
                self.0.quiet(g)
            }
            fn delete(&mut self) -> Result<(), KernelError> {
                self.0.delete()
            }
        }

        /// xorshift64*: reproducible sequences without a dependency.
        struct Rng(u64);

        impl Rng {
            fn next(&mut self) -> u64 {
                self.0 ^= self.0 >> 12;
                self.0 ^= self.0 << 25;
                self.0 ^= self.0 >> 27;
                self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
            }
            fn below(&mut self, n: u64) -> usize {
                (self.next() % n) as usize
            }
        }

        fn op(rng: &mut Rng) -> Op {
            let r = rng.below(REGS as u64);
            match rng.below(20) {
                0..=6 => Op::Arm(r, Interest::ALL[rng.below(3)]),
                7..=8 => Op::Disarm(r),
                // Readable, writable, read-closed, hang-up, error in any mix; most
                // often one direction or nothing.
                9..=13 => Op::Levels(r, [0, 1, 2, 3, 1, 2, 5, 8, 16, 0][rng.below(10)]),
                14..=17 => Op::Wait,
                18 => Op::Reuse(r),
                _ => Op::Reregister(r),
            }
        }

        #[test]
        fn epoll_and_kqueue_translations_deliver_alike() {
            let mut waits = 0;
            let mut deliveries = 0;
            for seed in 1..=400u64 {
                let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
                let mut epoll = Side::new(Semantics::Epoll);
                let mut kqueue = Side::new(Semantics::Kqueue);
                let mut ops = Vec::new();
                for _ in 0..80 {
                    let o = op(&mut rng);
                    ops.push(o);
                    let e = epoll.apply(o);
                    let k = kqueue.apply(o);
                    assert_eq!(e, k, "seed {seed}: deliveries differ after {ops:?}");
                    if let Some(d) = e {
                        waits += 1;
                        deliveries += d.len();
                    }
                    assert_eq!(
                        epoll.phases(),
                        kqueue.phases(),
                        "seed {seed}: phases differ after {ops:?}"
                    );
                }
            }
            // The sequences exercised something.
            assert!(
                waits > 5_000 && deliveries > 2_000,
                "{waits} waits, {deliveries} deliveries"
            );
        }
    }
}
