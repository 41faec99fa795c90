//! A pure reference model of the kernel side of pollshot, for tests and fuzzing.
//!
//! No system call happens here. A [`Model`] holds a descriptor table (numbers that
//! can be opened, closed, reused and dup'd), the open file descriptions behind the
//! numbers (each with readiness [`Levels`] the test sets), and one kernel
//! notification set with the [`Semantics`] of one backend:
//!
//! - [`Semantics::Epoll`]: epoll(7). Entries are keyed by (description, descriptor
//!   number), as the kernel keys them. `EPOLL_CTL_ADD` of a key present answers
//!   EEXIST, `EPOLL_CTL_MOD`/`EPOLL_CTL_DEL` of a key absent ENOENT, any command on
//!   a closed number EBADF, any command on a description the kernel cannot poll
//!   (regular files, `/dev/null`) EPERM. `EPOLLERR | EPOLLHUP` are always in an
//!   entry's mask; an `EPOLLONESHOT` entry loses every readiness bit when it is
//!   reported; `data` is returned as it was set. An entry lives until it is
//!   deleted or its *description* is released (the last descriptor referring to
//!   it closed), so a dup'd description keeps an orphan entry under the closed
//!   number alive.
//! - [`Semantics::Kqueue`]: kqueue(2) as on FreeBSD. One knote per
//!   (descriptor number, filter); `EV_ADD` creates it (or updates it),
//!   `EV_ENABLE`/`EV_DISABLE`/`EV_DELETE` of a missing knote answer ENOENT, any
//!   change on a closed number EBADF, `EV_ADD` on a description the kernel cannot
//!   poll EINVAL. `EV_DISPATCH` disables a knote when it is reported. Every change
//!   to an existing knote stores its `udata` (FreeBSD, DragonFly and XNU
//!   `kqueue_register`/`kevent_register`), so the backend's `udata` carries the
//!   arming generation, as epoll's `data` does. Closing a descriptor number drops
//!   every knote on that number ("Calling close() on a file descriptor will remove
//!   any kevents that reference the descriptor", kqueue(2)), whether or not a dup
//!   keeps the description open.
//! - [`Semantics::KqueueFixedUdata`]: the same, except that only `EV_ADD` stores
//!   `udata` (NetBSD, OpenBSD): the backend's `udata` carries the slot's
//!   incarnation, fixed at `EV_ADD`, and the arming generation stays in the table.
//! - [`Semantics::Poll`]: the in-memory set of pollshot's poll(2) backend, keyed by
//!   the registration's slot, polled by descriptor number at wait time (a closed
//!   number reports `POLLNVAL`; a reused number reports the new description).
//! - [`Semantics::Ports`]: illumos event ports (`ports.rs`, [`PortAssociation`]).
//!
//! [`Model::kernel`] returns a [`RegKernel`]: the [`Kernel`]
//! of one registration, translating the state machine's commands into this
//! kernel's calls exactly as the backend does (epoll: [`backends/epoll.rs`](https://docs.rs/crate/pollshot/latest/source/backends/epoll.rs); kqueue:
//! the kqueue backend's own pure translator, `changes` in [`backends/kqueue/changes.rs`](https://docs.rs/crate/pollshot/latest/source/backends/kqueue/changes.rs),
//! with its per-registration belief of what the kernel holds, submitted at once;
//! poll: [`backends/blocking.rs`](https://docs.rs/crate/pollshot/latest/source/backends/blocking.rs)). A [`RegState`](crate::state::RegState) drives it
//! directly. [`Model::wait`] returns what the kernel would report, as
//! [`RawEvent`]s with the slot and stamp a backend would decode (the arming
//! generation; with [`Semantics::KqueueFixedUdata`], the slot's incarnation), each
//! with the
//! [`Origin`] of the command that armed it: ground truth the kernel does not
//! have, so that a checker can tell which arming an accepted event completes.
//!
//! Running one operation sequence against a model of each semantics and comparing
//! what is delivered checks that the backends agree (parity).
//!
//! # Examples
//!
//! ```
//! use pollshot::model::{Levels, Model, Origin, Semantics};
//! use pollshot::state::{Fallbacks, Phase, RegState};
//! use pollshot::Interest;
//!
//! for semantics in [Semantics::Epoll, Semantics::Kqueue, Semantics::Poll] {
//!     let mut model = Model::new(semantics);
//!     let fd = model.open(true);
//!     let mut state = RegState::new(0);
//!     let origin = Origin { owner: 1, arming: 1 };
//!     state
//!         .arm(Interest::READABLE, &mut model.kernel(fd, 0, 0, origin), &mut Fallbacks::default())
//!         .unwrap();
//!     assert!(model.wait(16).is_empty());
//!     let desc = model.description(fd).unwrap();
//!     model.set_levels(desc, Levels { readable: true, ..Levels::default() });
//!     let events = model.wait(16);
//!     assert_eq!(events.len(), 1);
//!     assert_eq!(events[0].origin, origin);
//!     let tag = semantics.tag_is_generation().then_some(events[0].raw.stamp);
//!     assert_eq!(state.on_event(tag), Some(Interest::READABLE));
//!     assert_eq!(state.phase(), Phase::Idle);
//!     assert!(model.wait(16).is_empty()); // oneshot: reported once
//! }
//! ```

use crate::interest::Interest;
use crate::kqueue_backend::changes as kqc;
pub use crate::readiness::{RawEvent, Readiness};
use crate::state::{Kernel, KernelError};
use crate::token::{incarnation_in_usize, pack64, pack_usize, unpack64, unpack_usize};
use std::collections::BTreeMap;
use std::io;

mod ports;
pub use ports::PortAssociation;

/// A descriptor number, as in the process's descriptor table (`RawFd`).
pub type Fd = i32;

/// An open file description: what one or more descriptor numbers refer to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DescId(pub u32);

/// The readiness a description has now, as poll(2) would report it. Level
/// triggered: it holds until the test changes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Levels {
    /// Data to read, or EOF (`POLLIN`).
    pub readable: bool,
    /// Room to write (`POLLOUT`).
    pub writable: bool,
    /// The peer shut down its write side (`POLLRDHUP`).
    pub read_closed: bool,
    /// Hung up (`POLLHUP`).
    pub hang_up: bool,
    /// A pending error (`POLLERR`).
    pub error: bool,
}

impl Levels {
    /// Levels from five bits: 1 readable, 2 writable, 4 read-closed, 8 hang-up,
    /// 16 error. Other bits are ignored.
    pub const fn from_bits(bits: u8) -> Levels {
        Levels {
            readable: bits & 1 != 0,
            writable: bits & 2 != 0,
            read_closed: bits & 4 != 0,
            hang_up: bits & 8 != 0,
            error: bits & 16 != 0,
        }
    }

    /// Whether a registration armed for `interest` is reported with these levels
    /// on every semantics: the interest's direction is ready, or a hang-up or an
    /// error is pending (those are reported whatever the interest).
    pub const fn ready_for(self, interest: Interest) -> bool {
        (interest.is_readable() && (self.readable || self.read_closed))
            || (interest.is_writable() && self.writable)
            || self.hang_up
            || self.error
    }

    /// The levels as epoll bits (`EPOLLIN`, `EPOLLOUT`, `EPOLLRDHUP`, `EPOLLHUP`,
    /// `EPOLLERR`).
    pub const fn epoll_bits(self) -> u32 {
        let mut b = 0;
        if self.readable {
            b |= epoll::IN;
        }
        if self.writable {
            b |= epoll::OUT;
        }
        if self.read_closed {
            b |= epoll::RDHUP;
        }
        if self.hang_up {
            b |= epoll::HUP;
        }
        if self.error {
            b |= epoll::ERR;
        }
        b
    }
}

/// Which kernel interface a [`Model`] behaves like. See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Semantics {
    /// epoll(7) with pollshot's epoll backend's commands.
    Epoll,
    /// kqueue(2) (FreeBSD) with two knotes per registration; every change
    /// stores `udata`.
    Kqueue,
    /// pollshot's poll(2) backend: a user-space set keyed by slot.
    Poll,
    /// kqueue(2) where only `EV_ADD` stores `udata` (NetBSD, OpenBSD).
    KqueueFixedUdata,
    /// illumos event ports, `port_associate` with the generation in `user`.
    Ports,
}

impl Semantics {
    /// Whether a [`RawEvent::stamp`] from this kernel is the arming generation
    /// (else it is the slot's incarnation): `Backend::TAG_IS_GENERATION`.
    pub const fn tag_is_generation(self) -> bool {
        !matches!(self, Semantics::KqueueFixedUdata)
    }

    /// Whether this is a kqueue (either kind).
    pub const fn is_kqueue(self) -> bool {
        matches!(self, Semantics::Kqueue | Semantics::KqueueFixedUdata)
    }

    /// Whether one registration may be reported as several kernel events by one
    /// wait (kqueue: one per filter): `Backend::SPLIT_FILTERS`.
    pub const fn split_filters(self) -> bool {
        self.is_kqueue()
    }
}

/// A kernel error number the model answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Errno {
    /// ENOENT: no such entry or knote.
    NoEnt,
    /// EEXIST: the entry is already there (epoll ADD).
    Exist,
    /// EBADF: the descriptor number is not open.
    BadF,
    /// EPERM: epoll cannot poll this description.
    Perm,
    /// EINVAL: kqueue cannot poll this description; or a malformed request.
    Inval,
}

impl Errno {
    /// The `errno` value (Linux numbering, from `libc`).
    pub const fn raw(self) -> i32 {
        match self {
            Errno::NoEnt => libc::ENOENT,
            Errno::Exist => libc::EEXIST,
            Errno::BadF => libc::EBADF,
            Errno::Perm => libc::EPERM,
            Errno::Inval => libc::EINVAL,
        }
    }
}

/// Ground truth about a kernel entry: which registration (`owner`) and which of its
/// armings (`arming`) the command that armed it was for. The kernel never sees
/// it; the model returns it beside each event so a checker can tell a current
/// event from a stale one independently of the tags. By convention `arming == 0`
/// marks a command that arms nothing (a quiet).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Origin {
    /// The registration, numbered by the driver.
    pub owner: u64,
    /// The arming, numbered by the driver; 0 for none.
    pub arming: u64,
}

/// epoll(7) event bits, with the kernel's values.
pub mod epoll {
    /// `EPOLLIN`.
    pub const IN: u32 = 0x001;
    /// `EPOLLPRI`.
    pub const PRI: u32 = 0x002;
    /// `EPOLLOUT`.
    pub const OUT: u32 = 0x004;
    /// `EPOLLERR`.
    pub const ERR: u32 = 0x008;
    /// `EPOLLHUP`.
    pub const HUP: u32 = 0x010;
    /// `EPOLLRDHUP`.
    pub const RDHUP: u32 = 0x2000;
    /// `EPOLLONESHOT`.
    pub const ONESHOT: u32 = 1 << 30;
    /// The bits that can be reported.
    pub const READINESS: u32 = IN | PRI | OUT | ERR | HUP | RDHUP;
}

/// An `epoll_ctl(2)` operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EpollOp {
    /// `EPOLL_CTL_ADD`.
    Add,
    /// `EPOLL_CTL_MOD`.
    Mod,
    /// `EPOLL_CTL_DEL`.
    Del,
}

/// One epoll entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpollEntry {
    /// The event mask, `EPOLLERR | EPOLLHUP` included; no readiness bit once a
    /// oneshot entry was reported.
    pub events: u32,
    /// `epoll_event.data.u64`.
    pub data: u64,
    /// Who armed it (ground truth).
    pub origin: Origin,
}

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
}

/// One entry of the poll(2) backend's set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollEntry {
    /// The descriptor number polled.
    pub fd: Fd,
    /// `Some` while armed.
    pub armed: Option<Interest>,
    /// The generation of the last arm or quiet.
    pub generation: u32,
    /// Who armed it (ground truth).
    pub origin: Origin,
}

/// One reported event: what the backend would decode, and ground truth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelEvent {
    /// Slot, stamp and readiness as the backend's `wait` would return them.
    pub raw: RawEvent,
    /// Who armed the entry that fired.
    pub origin: Origin,
    /// The knote's filter (kqueue), else `None`.
    pub filter: Option<Filter>,
}

/// A state-machine command as the [`RegKernel`] received it, with its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// [`Kernel::add`].
    Add(Interest, u32),
    /// [`Kernel::modify`].
    Modify(Interest, u32),
    /// [`Kernel::quiet`].
    Quiet(u32),
    /// [`Kernel::delete`].
    Delete,
}

/// A [`Command`] and the kernel's answer (`None` when it succeeded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandRecord {
    /// What was asked.
    pub command: Command,
    /// The errno it failed with, if it failed.
    pub error: Option<Errno>,
}

/// Kernel calls the model served, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Calls {
    /// `epoll_ctl` calls.
    pub epoll_ctl: u64,
    /// kevent change records applied.
    pub kevent_changes: u64,
    /// Waits ([`Model::wait`]).
    pub waits: u64,
}

/// What the kqueue backend believes the kernel holds for one registration, and
/// which filters fired since its last command (its per-slot view in
/// [`backends/kqueue/queue.rs`](https://docs.rs/crate/pollshot/latest/source/backends/kqueue/queue.rs)).
#[derive(Clone, Copy, Debug, Default)]
struct Belief {
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

#[derive(Clone, Debug)]
struct Desc {
    levels: Levels,
    pollable: bool,
    refs: u32,
}

/// The kernel, modelled. See the module docs.
#[derive(Clone, Debug)]
pub struct Model {
    semantics: Semantics,
    descs: Vec<Desc>,
    fds: BTreeMap<Fd, DescId>,
    epoll: BTreeMap<(DescId, Fd), EpollEntry>,
    knotes: BTreeMap<(Fd, Filter), Knote>,
    pollset: BTreeMap<u32, PollEntry>,
    ports: ports::Associations,
    /// kqueue: the backend's belief per registration, by slot.
    beliefs: BTreeMap<u32, Belief>,
    /// kqueue: the change records the registrations' commands sent.
    sent: Vec<Change>,
    notified: bool,
    log: Vec<CommandRecord>,
    calls: Calls,
}

/// What the kernel holds for one registration, for comparing with the table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelView {
    /// Whether the kernel holds anything under the registration's key (epoll: an
    /// entry for (description, number); kqueue: a knote on the number; poll: the
    /// slot in the set).
    pub present: bool,
    /// The readiness it is armed for (epoll: the `EPOLLIN`/`EPOLLOUT` bits;
    /// kqueue: the enabled filters; poll: the armed interest), if any.
    pub armed: Option<Interest>,
    /// The tag stored (epoll `data`, kqueue `udata` of the first knote, poll:
    /// slot and generation packed like epoll's `data`).
    pub tag: Option<u64>,
}

fn interest_from(read: bool, write: bool) -> Option<Interest> {
    Interest::from_bits(read as u8 | (write as u8) << 1)
}

/// epoll flags for an arm, as [`backends/epoll.rs`](https://docs.rs/crate/pollshot/latest/source/backends/epoll.rs) sets them.
pub const fn epoll_flags_for(interest: Interest) -> u32 {
    let mut f = epoll::ONESHOT;
    if interest.is_readable() {
        f |= epoll::IN | epoll::RDHUP;
    }
    if interest.is_writable() {
        f |= epoll::OUT;
    }
    f
}

/// Readiness from epoll's `events`, as [`backends/epoll.rs`](https://docs.rs/crate/pollshot/latest/source/backends/epoll.rs) decodes it (the same
/// function: [`Readiness::from_epoll`]).
pub const fn epoll_readiness(flags: u32) -> Readiness {
    Readiness::from_epoll(flags)
}

/// `POLLRDHUP` as the poll(2) backend asks for it with a readable interest: on
/// Linux and Android only (elsewhere poll(2) has no such bit).
const POLL_RDHUP: u32 = if cfg!(any(target_os = "linux", target_os = "android")) {
    epoll::RDHUP
} else {
    0
};

/// Readiness from poll(2)'s `revents` in epoll bit values, as
/// [`backends/blocking.rs`](https://docs.rs/crate/pollshot/latest/source/backends/blocking.rs) decodes it (the same function:
/// [`Readiness::from_epoll`]). `POLLNVAL` (a closed number) is no event: the backend
/// drops the entry, as epoll drops a closed descriptor.
pub const fn poll_readiness(revents: u32) -> Readiness {
    Readiness::from_epoll(revents)
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

impl Model {
    /// An empty kernel: no descriptor open, nothing registered.
    pub fn new(semantics: Semantics) -> Model {
        Model {
            semantics,
            descs: Vec::new(),
            fds: BTreeMap::new(),
            epoll: BTreeMap::new(),
            knotes: BTreeMap::new(),
            pollset: BTreeMap::new(),
            ports: BTreeMap::new(),
            beliefs: BTreeMap::new(),
            sent: Vec::new(),
            notified: false,
            log: Vec::new(),
            calls: Calls::default(),
        }
    }

    /// The semantics this model has.
    pub fn semantics(&self) -> Semantics {
        self.semantics
    }

    /// The lowest number not open (as open(2) and dup(2) pick), counting from 3.
    pub fn lowest_free(&self) -> Fd {
        let mut n = 3;
        for &fd in self.fds.keys() {
            if fd == n {
                n += 1;
            } else if fd > n {
                break;
            }
        }
        n
    }

    /// Opens a new description with no readiness at the lowest free number.
    /// `pollable: false` makes a description the kernel refuses to poll (a
    /// regular file, `/dev/null`).
    pub fn open(&mut self, pollable: bool) -> Fd {
        let fd = self.lowest_free();
        self.attach(fd, pollable);
        fd
    }

    /// Opens a new description at number `fd` (for mirroring a real process).
    ///
    /// # Errors
    /// `Errno::BadF` if `fd` is negative, `Errno::Exist` if it is open.
    pub fn open_at(&mut self, fd: Fd, pollable: bool) -> Result<DescId, Errno> {
        if fd < 0 {
            return Err(Errno::BadF);
        }
        if self.fds.contains_key(&fd) {
            return Err(Errno::Exist);
        }
        Ok(self.attach(fd, pollable))
    }

    fn attach(&mut self, fd: Fd, pollable: bool) -> DescId {
        let id = DescId(self.descs.len() as u32);
        self.descs.push(Desc {
            levels: Levels::default(),
            pollable,
            refs: 1,
        });
        self.fds.insert(fd, id);
        id
    }

    /// dup(2): a new number (the lowest free) for the description behind `fd`.
    ///
    /// # Errors
    /// `Errno::BadF` if `fd` is not open.
    pub fn dup(&mut self, fd: Fd) -> Result<Fd, Errno> {
        let to = self.lowest_free();
        self.dup_to(fd, to)?;
        Ok(to)
    }

    /// Makes the free number `to` refer to `fd`'s description (mirroring a dup
    /// whose result the real kernel chose).
    ///
    /// # Errors
    /// `Errno::BadF` if `fd` is not open or `to` is negative, `Errno::Exist` if `to`
    /// is open.
    pub fn dup_to(&mut self, fd: Fd, to: Fd) -> Result<(), Errno> {
        let desc = *self.fds.get(&fd).ok_or(Errno::BadF)?;
        if to < 0 {
            return Err(Errno::BadF);
        }
        if self.fds.contains_key(&to) {
            return Err(Errno::Exist);
        }
        self.descs[desc.0 as usize].refs += 1;
        self.fds.insert(to, desc);
        Ok(())
    }

    /// close(2). kqueue: drops the knotes on `fd`. When the last number referring
    /// to the description closes, the description is released and epoll drops its
    /// entries.
    ///
    /// # Errors
    /// `Errno::BadF` if `fd` is not open.
    pub fn close(&mut self, fd: Fd) -> Result<(), Errno> {
        let desc = self.fds.remove(&fd).ok_or(Errno::BadF)?;
        self.knotes.retain(|&(ident, _), _| ident != fd);
        self.port_close(fd);
        let d = &mut self.descs[desc.0 as usize];
        d.refs -= 1;
        if d.refs == 0 {
            self.epoll.retain(|&(id, _), _| id != desc);
        }
        Ok(())
    }

    /// The description behind `fd`, if it is open.
    pub fn description(&self, fd: Fd) -> Option<DescId> {
        self.fds.get(&fd).copied()
    }

    /// Whether `fd` is open.
    pub fn is_open(&self, fd: Fd) -> bool {
        self.fds.contains_key(&fd)
    }

    /// The open numbers, ascending.
    pub fn open_fds(&self) -> Vec<Fd> {
        self.fds.keys().copied().collect()
    }

    /// Whether the kernel can poll the description.
    pub fn is_pollable(&self, desc: DescId) -> bool {
        self.descs.get(desc.0 as usize).is_some_and(|d| d.pollable)
    }

    /// Whether the description is still open (some number refers to it).
    pub fn is_live(&self, desc: DescId) -> bool {
        self.descs.get(desc.0 as usize).is_some_and(|d| d.refs > 0)
    }

    /// The description's readiness now (all false for an unknown one).
    pub fn levels(&self, desc: DescId) -> Levels {
        self.descs
            .get(desc.0 as usize)
            .map_or(Levels::default(), |d| d.levels)
    }

    /// Sets the description's readiness (a write, a read, a hang-up...). An unknown
    /// description is ignored.
    pub fn set_levels(&mut self, desc: DescId, levels: Levels) {
        if let Some(d) = self.descs.get_mut(desc.0 as usize) {
            d.levels = levels;
        }
    }

    /// A notify: the next wait returns at once (and reports no event for it).
    /// Returns whether one was already pending (the notify coalesced).
    pub fn notify(&mut self) -> bool {
        std::mem::replace(&mut self.notified, true)
    }

    /// Whether a notify is pending.
    pub fn is_notified(&self) -> bool {
        self.notified
    }

    /// A forked child's `reinit_after_fork` made a new kernel instance: nothing is
    /// registered in it and no notify is pending, while the descriptors (numbers
    /// and the descriptions behind them, with their readiness) are the ones the
    /// child inherited. The parent's instance is not modelled past this point: the
    /// child never touches it.
    pub fn fork_child(&mut self) {
        self.epoll.clear();
        self.knotes.clear();
        self.pollset.clear();
        self.ports.clear();
        self.beliefs.clear();
        self.sent.clear();
        self.log.clear();
        self.notified = false;
    }

    /// Kernel calls served so far.
    pub fn calls(&self) -> Calls {
        self.calls
    }

    /// The state-machine commands received through [`RegKernel`]s since the last
    /// call, with their answers.
    pub fn take_commands(&mut self) -> Vec<CommandRecord> {
        std::mem::take(&mut self.log)
    }

    /// kqueue: the change records sent for registrations (through
    /// [`RegKernel`] and [`Model::delivered`]) since the last call, in order.
    pub fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.sent)
    }

    /// Submits a kqueue plan at once: the records (with `EV_RECEIPT`), their
    /// answers, and the belief of the registration afterwards (a refused record,
    /// but of a delete, means its knote is not there).
    fn submit(
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
                flags: c.flags() | kq::EV_RECEIPT,
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

    /// The epoll entries, by (description, number).
    pub fn epoll_entries(&self) -> &BTreeMap<(DescId, Fd), EpollEntry> {
        &self.epoll
    }

    /// The knotes, by (number, filter).
    pub fn knotes(&self) -> &BTreeMap<(Fd, Filter), Knote> {
        &self.knotes
    }

    /// The poll(2) backend's set, by slot.
    pub fn poll_set(&self) -> &BTreeMap<u32, PollEntry> {
        &self.pollset
    }

    /// epoll_ctl(2). `events` are the requested bits (`EPOLLERR | EPOLLHUP` are
    /// added, as the kernel does); `data` is stored for `Add` and `Mod`.
    ///
    /// # Errors
    /// EBADF (closed number), EPERM (description not pollable), EEXIST (`Add` of a
    /// present key), ENOENT (`Mod` or `Del` of an absent key).
    pub fn epoll_ctl(
        &mut self,
        op: EpollOp,
        fd: Fd,
        events: u32,
        data: u64,
        origin: Origin,
    ) -> Result<(), Errno> {
        self.calls.epoll_ctl += 1;
        let desc = *self.fds.get(&fd).ok_or(Errno::BadF)?;
        if !self.descs[desc.0 as usize].pollable {
            return Err(Errno::Perm);
        }
        let key = (desc, fd);
        let entry = EpollEntry {
            events: events | epoll::ERR | epoll::HUP,
            data,
            origin,
        };
        match op {
            EpollOp::Add => {
                if self.epoll.contains_key(&key) {
                    return Err(Errno::Exist);
                }
                self.epoll.insert(key, entry);
            }
            EpollOp::Mod => {
                let e = self.epoll.get_mut(&key).ok_or(Errno::NoEnt)?;
                *e = entry;
            }
            EpollOp::Del => {
                self.epoll.remove(&key).ok_or(Errno::NoEnt)?;
            }
        }
        Ok(())
    }

    /// kevent(2) with a change list and `EV_RECEIPT`: applies every change in
    /// order and answers each (a real kernel without `EV_RECEIPT` and with a short
    /// event list stops at the first failure; that is the caller's to avoid).
    pub fn kevent(&mut self, changes: &[Change]) -> Vec<Result<(), Errno>> {
        changes.iter().map(|c| self.apply_change(c)).collect()
    }

    fn apply_change(&mut self, c: &Change) -> Result<(), Errno> {
        use kq::*;
        self.calls.kevent_changes += 1;
        let desc = *self.fds.get(&c.ident).ok_or(Errno::BadF)?;
        let key = (c.ident, c.filter);
        if c.flags & EV_DELETE != 0 {
            return self.knotes.remove(&key).map(drop).ok_or(Errno::NoEnt);
        }
        if c.flags & EV_ADD != 0 {
            if !self.descs[desc.0 as usize].pollable {
                return Err(Errno::Inval);
            }
            let enabled = c.flags & EV_DISABLE == 0;
            let k = self.knotes.entry(key).or_insert(Knote {
                enabled,
                dispatch: false,
                udata: c.udata,
                origin: c.origin,
            });
            k.enabled = enabled;
            k.dispatch = c.flags & EV_DISPATCH != 0;
            k.udata = c.udata;
            k.origin = c.origin;
            return Ok(());
        }
        let k = self.knotes.get_mut(&key).ok_or(Errno::NoEnt)?;
        if self.semantics == Semantics::Kqueue {
            k.udata = c.udata;
        }
        if c.flags & EV_DISPATCH != 0 {
            k.dispatch = true;
        }
        if c.flags & EV_ENABLE != 0 {
            k.enabled = true;
            k.origin = c.origin;
        }
        if c.flags & EV_DISABLE != 0 {
            k.enabled = false;
        }
        Ok(())
    }

    /// The kernel's handle for one registration: the descriptor number, the slot
    /// and incarnation its tags carry, and the `origin` its commands record.
    pub fn kernel(&mut self, fd: Fd, slot: u32, incarnation: u32, origin: Origin) -> RegKernel<'_> {
        RegKernel {
            model: self,
            fd,
            slot,
            incarnation,
            origin,
        }
    }

    /// After a delivery that completed an arming of the registration on `fd` in
    /// `slot`, incarnation `incarnation`: kqueue disables its filters that did not
    /// fire, unless a command for it came after the event was read (then that
    /// command decided), as `Backend::delivered` does in [`backends/kqueue/backend.rs`](https://docs.rs/crate/pollshot/latest/source/backends/kqueue/backend.rs)
    /// (`changes::after_delivery`); nothing on other semantics.
    pub fn delivered(&mut self, fd: Fd, slot: u32, incarnation: u32) {
        if !self.semantics.is_kqueue() {
            return;
        }
        let tag_is_generation = self.semantics.tag_is_generation();
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

    /// What the kernel holds for the registration on `fd` in `slot`.
    pub fn view(&self, fd: Fd, slot: u32) -> KernelView {
        match self.semantics {
            Semantics::Epoll => {
                let Some(&desc) = self.fds.get(&fd) else {
                    return KernelView::default();
                };
                match self.epoll.get(&(desc, fd)) {
                    None => KernelView::default(),
                    Some(e) => KernelView {
                        present: true,
                        armed: interest_from(e.events & epoll::IN != 0, e.events & epoll::OUT != 0),
                        tag: Some(e.data),
                    },
                }
            }
            Semantics::Kqueue | Semantics::KqueueFixedUdata => {
                let r = self.knotes.get(&(fd, Filter::Read));
                let w = self.knotes.get(&(fd, Filter::Write));
                KernelView {
                    present: r.is_some() || w.is_some(),
                    armed: interest_from(
                        r.is_some_and(|k| k.enabled),
                        w.is_some_and(|k| k.enabled),
                    ),
                    tag: r.or(w).map(|k| k.udata),
                }
            }
            Semantics::Poll => match self.pollset.get(&slot) {
                None => KernelView::default(),
                Some(e) => KernelView {
                    present: true,
                    armed: e.armed,
                    tag: Some(pack64(slot, e.generation)),
                },
            },
            Semantics::Ports => self.port_view(fd),
        }
    }

    /// Whether the knote (`fd`, `filter`) exists and is enabled.
    pub fn knote_enabled(&self, fd: Fd, filter: Filter) -> bool {
        self.knotes.get(&(fd, filter)).is_some_and(|k| k.enabled)
    }

    /// One wait: what the kernel reports now, at most `max` events, ordered by key.
    /// Reported oneshot entries are disarmed (epoll), dispatched knotes disabled
    /// (kqueue), reported set entries disarmed (poll). Consumes a pending notify.
    pub fn wait(&mut self, max: usize) -> Vec<ModelEvent> {
        self.calls.waits += 1;
        self.notified = false;
        let mut out = Vec::new();
        match self.semantics {
            Semantics::Epoll => {
                for (&(desc, _), e) in self.epoll.iter_mut() {
                    if out.len() >= max {
                        break;
                    }
                    let ready = e.events
                        & epoll::READINESS
                        & self.descs[desc.0 as usize].levels.epoll_bits();
                    if ready == 0 {
                        continue;
                    }
                    if e.events & epoll::ONESHOT != 0 {
                        e.events &= !epoll::READINESS;
                    }
                    let (slot, generation) = unpack64(e.data);
                    out.push(ModelEvent {
                        raw: RawEvent {
                            slot,
                            stamp: generation,
                            readiness: epoll_readiness(ready),
                        },
                        origin: e.origin,
                        filter: None,
                    });
                }
            }
            Semantics::Kqueue | Semantics::KqueueFixedUdata => {
                for (&(fd, filter), k) in self.knotes.iter_mut() {
                    if out.len() >= max {
                        break;
                    }
                    // A knote exists only on an open number (close drops them).
                    let levels = self.descs[self.fds[&fd].0 as usize].levels;
                    if !k.enabled || !filter.fires(levels) {
                        continue;
                    }
                    if k.dispatch {
                        k.enabled = false;
                    }
                    let (slot, stamp) = unpack_usize(k.udata as usize);
                    if let Some(b) = self.beliefs.get_mut(&slot) {
                        if b.stamp == stamp {
                            b.fired(filter);
                        }
                    }
                    out.push(ModelEvent {
                        raw: RawEvent {
                            slot,
                            stamp,
                            readiness: kqueue_readiness(filter, levels),
                        },
                        origin: k.origin,
                        filter: Some(filter),
                    });
                }
            }
            Semantics::Poll => {
                let mut closed = Vec::new();
                for (&slot, e) in self.pollset.iter_mut() {
                    if out.len() >= max {
                        break;
                    }
                    let Some(interest) = e.armed else { continue };
                    let readiness = match self.fds.get(&e.fd) {
                        // POLLNVAL: the backend drops the entry, reports nothing.
                        None => {
                            closed.push(slot);
                            continue;
                        }
                        Some(desc) => {
                            let d = &self.descs[desc.0 as usize];
                            let mut asked = epoll::ERR | epoll::HUP;
                            if interest.is_readable() {
                                asked |= epoll::IN | POLL_RDHUP;
                            }
                            if interest.is_writable() {
                                asked |= epoll::OUT;
                            }
                            // poll(2) on a regular file: always readable and writable.
                            let have = if d.pollable {
                                d.levels.epoll_bits()
                            } else {
                                epoll::IN | epoll::OUT
                            };
                            let r = asked & have;
                            if r == 0 {
                                continue;
                            }
                            poll_readiness(r)
                        }
                    };
                    e.armed = None;
                    out.push(ModelEvent {
                        raw: RawEvent {
                            slot,
                            stamp: e.generation,
                            readiness,
                        },
                        origin: e.origin,
                        filter: None,
                    });
                }
                for slot in closed {
                    self.pollset.remove(&slot);
                }
            }
            Semantics::Ports => self.port_wait(max, &mut out),
        }
        out
    }

    /// The kernel reports the registration on `fd` in `slot` now, if it is armed,
    /// whatever the levels say (readiness that came and went before anyone looked):
    /// epoll fires the entry, kqueue its first enabled knote, poll its set entry.
    /// The event reports the armed direction.
    pub fn force_report(&mut self, fd: Fd, slot: u32) -> Option<ModelEvent> {
        match self.semantics {
            Semantics::Epoll => {
                let desc = *self.fds.get(&fd)?;
                let e = self.epoll.get_mut(&(desc, fd))?;
                let bits = e.events & (epoll::IN | epoll::OUT);
                if bits == 0 {
                    return None;
                }
                if e.events & epoll::ONESHOT != 0 {
                    e.events &= !epoll::READINESS;
                }
                let (slot, generation) = unpack64(e.data);
                Some(ModelEvent {
                    raw: RawEvent {
                        slot,
                        stamp: generation,
                        readiness: epoll_readiness(bits),
                    },
                    origin: e.origin,
                    filter: None,
                })
            }
            Semantics::Kqueue | Semantics::KqueueFixedUdata => {
                let levels = self.levels(*self.fds.get(&fd)?);
                for filter in Filter::BOTH {
                    if let Some(k) = self.knotes.get_mut(&(fd, filter)) {
                        if k.enabled {
                            if k.dispatch {
                                k.enabled = false;
                            }
                            let (slot, stamp) = unpack_usize(k.udata as usize);
                            if let Some(b) = self.beliefs.get_mut(&slot) {
                                if b.stamp == stamp {
                                    b.fired(filter);
                                }
                            }
                            return Some(ModelEvent {
                                raw: RawEvent {
                                    slot,
                                    stamp,
                                    readiness: kqueue_readiness(filter, levels),
                                },
                                origin: k.origin,
                                filter: Some(filter),
                            });
                        }
                    }
                }
                None
            }
            Semantics::Poll => {
                let e = self.pollset.get_mut(&slot)?;
                let interest = e.armed.take()?;
                let mut bits = 0;
                if interest.is_readable() {
                    bits |= epoll::IN;
                }
                if interest.is_writable() {
                    bits |= epoll::OUT;
                }
                Some(ModelEvent {
                    raw: RawEvent {
                        slot,
                        stamp: e.generation,
                        readiness: poll_readiness(bits),
                    },
                    origin: e.origin,
                    filter: None,
                })
            }
            Semantics::Ports => self.port_force_report(fd),
        }
    }

    /// The tag this kernel stores for a registration in `slot`, incarnation
    /// `incarnation`, armed at `generation` (what [`KernelView::tag`] shows): epoll
    /// and poll pack slot and generation, kqueue packs them into a
    /// pointer-sized `udata`, [`Semantics::KqueueFixedUdata`] slot and incarnation.
    pub fn tag_for(&self, slot: u32, incarnation: u32, generation: u32) -> u64 {
        match self.semantics {
            Semantics::Kqueue => pack_usize(slot, generation) as u64,
            Semantics::KqueueFixedUdata => pack_usize(slot, incarnation) as u64,
            Semantics::Epoll | Semantics::Poll | Semantics::Ports => pack64(slot, generation),
        }
    }

    /// The stamp a current event for a registration in incarnation `incarnation`
    /// carries on [`Semantics::KqueueFixedUdata`] (the incarnation as it survives
    /// packing into `udata`).
    pub fn kqueue_stamp(incarnation: u32) -> u32 {
        incarnation_in_usize(incarnation)
    }
}

/// The [`Kernel`] of one registration in a [`Model`]: see [`Model::kernel`].
///
/// Translates each command as the backend of the model's semantics does:
///
/// | command | epoll | kqueue (both filters, one change each) | poll |
/// |---|---|---|---|
/// | add(i) | `ADD`, `ONESHOT` + i | `EV_ADD \| EV_DISPATCH` per filter in i | insert armed, EBADF if closed |
/// | modify(i) | `MOD`, `ONESHOT` + i | `EV_ENABLE \| EV_DISPATCH` per filter in i (`EV_ADD` if never added), `EV_DISABLE \| EV_DISPATCH` for one enabled outside i; ENOENT: delete both, add again | re-arm, ENOENT if absent |
/// | quiet | `MOD`, `ONESHOT` alone | `EV_DISABLE \| EV_DISPATCH` per enabled filter; all ENOENT: `NotFound` | disarm, ENOENT if absent |
/// | delete | `DEL` | `EV_DELETE` per added filter | remove, ENOENT if absent |
///
/// The kqueue column is the backend's translator ([`backends/kqueue/changes.rs`](https://docs.rs/crate/pollshot/latest/source/backends/kqueue/changes.rs),
/// `changes::translate`, `changes::readd`), every record with `EV_RECEIPT`; the
/// refusals are classified as the backend classifies them (EINVAL on an add:
/// not pollable, and the knotes are deleted; EBADF: bad descriptor).
///
/// Every command and its answer is logged ([`Model::take_commands`]).
#[derive(Debug)]
pub struct RegKernel<'m> {
    model: &'m mut Model,
    fd: Fd,
    slot: u32,
    incarnation: u32,
    origin: Origin,
}

fn classify(e: Errno, semantics: Semantics) -> KernelError {
    match e {
        Errno::NoEnt => KernelError::NotFound,
        Errno::Exist => KernelError::Exists,
        Errno::BadF => KernelError::BadFd,
        Errno::Perm if semantics == Semantics::Epoll => KernelError::NotPollable,
        Errno::Inval if semantics.is_kqueue() => KernelError::NotPollable,
        other => KernelError::Other(io::Error::from_raw_os_error(other.raw())),
    }
}

impl RegKernel<'_> {
    /// The kqueue backend's command for this registration: translate from the
    /// belief, submit, classify (as `Kqueue::command` in [`backends/kqueue/command.rs`](https://docs.rs/crate/pollshot/latest/source/backends/kqueue/command.rs)).
    fn kqueue(&mut self, command: Command) -> Result<(), KernelError> {
        use kqc::Action::{Add, Delete, Disable, Enable};
        let (cmd, generation) = match command {
            Command::Add(i, g) => (kqc::Command::Add(i), g),
            Command::Modify(i, g) => (kqc::Command::Modify(i), g),
            Command::Quiet(g) => (kqc::Command::Quiet, g),
            Command::Delete => (kqc::Command::Delete, 0),
        };
        let (slot, incarnation) = (self.slot, self.incarnation);
        let udata = if self.model.semantics.tag_is_generation() {
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
                (Add, Some(Errno::Inval)) => not_pollable = true,
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

    fn poll_arm(
        &mut self,
        interest: Option<Interest>,
        generation: u32,
        must_exist: bool,
    ) -> Result<(), Errno> {
        if must_exist && !self.model.pollset.contains_key(&self.slot) {
            return Err(Errno::NoEnt);
        }
        self.model.pollset.insert(
            self.slot,
            PollEntry {
                fd: self.fd,
                armed: interest,
                generation,
                origin: self.origin,
            },
        );
        Ok(())
    }

    fn run(&mut self, command: Command) -> Result<(), KernelError> {
        let sem = self.model.semantics;
        let origin = self.origin;
        let r = match (sem, command) {
            (Semantics::Epoll, Command::Add(i, g)) => {
                let data = pack64(self.slot, g);
                self.model
                    .epoll_ctl(EpollOp::Add, self.fd, epoll_flags_for(i), data, origin)
            }
            (Semantics::Epoll, Command::Modify(i, g)) => {
                let data = pack64(self.slot, g);
                self.model
                    .epoll_ctl(EpollOp::Mod, self.fd, epoll_flags_for(i), data, origin)
            }
            (Semantics::Epoll, Command::Quiet(g)) => {
                let data = pack64(self.slot, g);
                let quiet = Origin {
                    arming: 0,
                    ..origin
                };
                self.model
                    .epoll_ctl(EpollOp::Mod, self.fd, epoll::ONESHOT, data, quiet)
            }
            (Semantics::Epoll, Command::Delete) => {
                self.model.epoll_ctl(EpollOp::Del, self.fd, 0, 0, origin)
            }
            (Semantics::Kqueue | Semantics::KqueueFixedUdata, command) => {
                let r = self.kqueue(command);
                let error = match &r {
                    Ok(()) => None,
                    Err(KernelError::NotFound) => Some(Errno::NoEnt),
                    Err(KernelError::BadFd) => Some(Errno::BadF),
                    Err(KernelError::NotPollable) => Some(Errno::Inval),
                    Err(_) => Some(Errno::Inval),
                };
                self.model.log.push(CommandRecord { command, error });
                return r;
            }
            (Semantics::Poll, Command::Add(i, g)) => {
                if self.model.is_open(self.fd) {
                    self.poll_arm(Some(i), g, false)
                } else {
                    Err(Errno::BadF)
                }
            }
            (Semantics::Poll, Command::Modify(i, g)) => self.poll_arm(Some(i), g, true),
            (Semantics::Poll, Command::Quiet(g)) => {
                let open = self.model.is_open(self.fd);
                match self.model.pollset.get_mut(&self.slot) {
                    Some(e) => {
                        e.armed = None;
                        e.generation = g;
                        Ok(())
                    }
                    // As the poll(2) backend answers: gone from the set, and the number
                    // closed (EBADF) or open again (ENOENT).
                    None if !open => Err(Errno::BadF),
                    None => Err(Errno::NoEnt),
                }
            }
            (Semantics::Poll, Command::Delete) => self
                .model
                .pollset
                .remove(&self.slot)
                .map(drop)
                .ok_or(Errno::NoEnt),
            (Semantics::Ports, command) => self.model.port_run(self.fd, self.slot, command, origin),
        };
        self.model.log.push(CommandRecord {
            command,
            error: r.err(),
        });
        r.map_err(|e| classify(e, sem))
    }
}

impl Kernel for RegKernel<'_> {
    fn add(&mut self, interest: Interest, generation: u32) -> Result<(), KernelError> {
        self.run(Command::Add(interest, generation))
    }
    fn modify(&mut self, interest: Interest, generation: u32) -> Result<(), KernelError> {
        self.run(Command::Modify(interest, generation))
    }
    fn quiet(&mut self, generation: u32) -> Result<(), KernelError> {
        self.run(Command::Quiet(generation))
    }
    fn delete(&mut self) -> Result<(), KernelError> {
        self.run(Command::Delete)
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
    fn epoll_keys_by_description_and_number() {
        let mut m = Model::new(Semantics::Epoll);
        let a = m.open(true);
        m.epoll_ctl(EpollOp::Add, a, epoll::IN | epoll::ONESHOT, 7, O)
            .unwrap();
        assert_eq!(
            m.epoll_ctl(EpollOp::Add, a, epoll::IN, 7, O),
            Err(Errno::Exist)
        );
        let d = m.dup(a).unwrap();
        // Another number of the same description is another key.
        assert_eq!(
            m.epoll_ctl(EpollOp::Mod, d, epoll::IN, 7, O),
            Err(Errno::NoEnt)
        );
        // Closing the registered number leaves the entry (the dup keeps the
        // description open): it still fires, once.
        m.close(a).unwrap();
        let desc = m.description(d).unwrap();
        m.set_levels(desc, Levels::from_bits(1));
        assert_eq!(m.wait(8).len(), 1);
        assert_eq!(m.wait(8).len(), 0);
        // The number is reused by a dup of the same description: ADD says EEXIST.
        assert_eq!(m.dup(d), Ok(a));
        assert_eq!(
            m.epoll_ctl(EpollOp::Add, a, epoll::IN, 7, O),
            Err(Errno::Exist)
        );
        m.close(a).unwrap();
        // Reused by another description: MOD says ENOENT.
        assert_eq!(m.open(true), a);
        assert_eq!(
            m.epoll_ctl(EpollOp::Mod, a, epoll::IN, 7, O),
            Err(Errno::NoEnt)
        );
        // The last close of the description drops the orphan entry.
        m.close(d).unwrap();
        assert!(m.epoll_entries().keys().all(|&(id, _)| id != desc));
        assert_eq!(
            m.epoll_ctl(EpollOp::Mod, d, epoll::IN, 7, O),
            Err(Errno::BadF)
        );
        let file = m.open(false);
        assert_eq!(
            m.epoll_ctl(EpollOp::Add, file, epoll::IN, 7, O),
            Err(Errno::Perm)
        );
    }

    #[test]
    fn epoll_quiet_entry_fires_once_on_hang_up() {
        let mut m = Model::new(Semantics::Epoll);
        let a = m.open(true);
        m.epoll_ctl(EpollOp::Add, a, epoll::ONESHOT, 7, O).unwrap();
        let desc = m.description(a).unwrap();
        m.set_levels(desc, Levels::from_bits(1));
        assert!(m.wait(8).is_empty());
        m.set_levels(desc, Levels::from_bits(8));
        let ev = m.wait(8);
        assert_eq!(ev.len(), 1);
        assert!(ev[0].raw.readiness.contains(Readiness::WRITE_CLOSED));
        assert!(m.wait(8).is_empty());
        // Without oneshot, level-triggered: every wait.
        m.epoll_ctl(EpollOp::Mod, a, 0, 7, O).unwrap();
        assert_eq!(m.wait(8).len(), 1);
        assert_eq!(m.wait(8).len(), 1);
    }

    #[test]
    fn kqueue_close_drops_knotes_and_enable_stores_udata_where_the_kernel_does() {
        for sem in [Semantics::Kqueue, Semantics::KqueueFixedUdata] {
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

    #[test]
    fn poll_set_follows_the_number() {
        let mut m = Model::new(Semantics::Poll);
        let a = m.open(true);
        let mut k = m.kernel(a, 0, 0, O);
        k.add(Interest::READABLE, 1).unwrap();
        m.close(a).unwrap();
        assert!(
            m.wait(8).is_empty(),
            "a closed number (POLLNVAL) is dropped, not reported"
        );
        let mut k = m.kernel(a, 0, 0, O);
        assert!(matches!(
            k.modify(Interest::READABLE, 2),
            Err(KernelError::NotFound)
        ));
        assert!(matches!(
            k.add(Interest::READABLE, 2),
            Err(KernelError::BadFd)
        ));
        let b = m.open(true);
        assert_eq!(a, b);
        let mut k = m.kernel(b, 0, 0, O);
        k.add(Interest::READABLE, 2).unwrap();
        let desc = m.description(b).unwrap();
        m.set_levels(desc, Levels::from_bits(1));
        assert_eq!(m.wait(8)[0].raw.stamp, 2);
        let mut k = m.kernel(a, 1, 0, O);
        assert!(matches!(
            k.modify(Interest::READABLE, 2),
            Err(KernelError::NotFound)
        ));
        assert!(matches!(k.quiet(2), Err(KernelError::NotFound)));
        assert!(matches!(k.delete(), Err(KernelError::NotFound)));
        let log = m.take_commands();
        assert_eq!(log.len(), 7);
        assert_eq!(log[6].error, Some(Errno::NoEnt));
    }

    #[test]
    fn lowest_free_number_is_reused() {
        let mut m = Model::new(Semantics::Epoll);
        let a = m.open(true);
        let b = m.open(true);
        assert_eq!((a, b), (3, 4));
        m.close(a).unwrap();
        assert_eq!(m.dup(b), Ok(3));
        assert_eq!(m.open_at(3, true), Err(Errno::Exist));
        assert_eq!(m.close(9), Err(Errno::BadF));
    }
}
