//! A pure reference model of the kernel side of pollshot, for tests and fuzzing.
//!
//! No system call happens here. A [`Model`] holds a descriptor table (numbers that
//! can be opened, closed, reused and dup'd), the open file descriptions behind the
//! numbers (each with readiness [`Levels`] the test sets), and one kernel
//! notification set with the [`Semantics`] of one backend:
//!
//! - [`Semantics::Epoll`]: epoll(7) (the room `epoll.rs` says what the kernel
//!   answers).
//! - kqueue(2), one semantics per family of BSD kernels (the room `kqueue.rs`;
//!   [`Semantics::kqueue_kernel`] says what each does with a bare `EV_ENABLE`):
//!   - [`Semantics::Kqueue`]: FreeBSD, macOS, DragonFly, NetBSD 10. A re-arm
//!     re-runs the filter and every change stores `udata`;
//!   - [`Semantics::KqueueOpenBsd`]: OpenBSD 6.4 and later. `EV_ENABLE` re-runs
//!     the filter but only `EV_ADD` stores `udata`;
//!   - [`Semantics::KqueueNetBsd8`]: NetBSD 8 and 9, OpenBSD 6.2 and 6.3. A bare
//!     `EV_ENABLE` neither re-runs the filter nor stores `udata`;
//!   - [`Semantics::KqueueFixedUdata`]: the OpenBSD 6.4+ kernel with the backend
//!     of a 32-bit target, whose `udata` carries the slot's incarnation, fixed at
//!     `EV_ADD`, the arming generation staying in the table.
//!
//!   The backend's re-arm record ([`RearmRecord::AddEnable`]) makes every kqueue
//!   re-report a still-ready descriptor and store `udata`;
//!   [`Model::set_rearm_record`] selects the record before it, to show what it
//!   lost.
//! - [`Semantics::Poll`]: the in-memory set of pollshot's poll(2) backend (the
//!   room `poll.rs`).
//! - [`Semantics::Ports`]: illumos event ports (the room `ports.rs`,
//!   [`PortAssociation`]).
//! - [`Semantics::Afd`]: Windows' `IOCTL_AFD_POLL` requests completing on an
//!   I/O completion port, with the Windows backend's records and cancels (the
//!   room `afd.rs`, [`AfdPoll`]). A poll completes once, at once if an event is
//!   true when it is issued, and its packet stays queued even if the event stops
//!   being true (the other kernels look again at wait time); a cancel of a
//!   pending poll queues one cancelled packet, which the backend reports for no
//!   slot ([`NO_SLOT`]); closing a socket's last handle completes its polls with
//!   LOCAL_CLOSE. [`Model::set_afd_fault`] breaks the modelled backend on
//!   purpose ([`AfdFault`]).
//!
//! [`Model::kernel`] returns a [`RegKernel`]: the [`Kernel`]
//! of one registration, translating the state machine's commands into this
//! kernel's calls exactly as the backend does (epoll: `backends/epoll.rs`; kqueue:
//! the kqueue backend's own pure translator, `changes` in `backends/kqueue/changes.rs`,
//! with its per-registration belief of what the kernel holds, submitted at once;
//! poll: `backends/blocking.rs`; event ports: `backends/ports/`; AFD:
//! `backends/windows/`). A [`RegState`](crate::state::RegState) drives it
//! directly. [`Model::wait`] returns what the kernel would report, as
//! [`RawEvent`]s with the slot and stamp a backend would decode (the arming
//! generation; where [`Model::tag_is_generation`] is false, the slot's incarnation), each
//! with the
//! [`Origin`] of the command that armed it: ground truth the kernel does not
//! have, so that a checker can tell which arming an accepted event completes.
//!
//! Running one operation sequence against a model of each semantics and comparing
//! what is delivered checks that the backends agree (parity).
//!
//! # Rooms, and how a semantics plugs in
//!
//! `mod.rs` holds what every kernel shares: the descriptor table, the
//! descriptions' levels, the types events and commands are reported in, and the
//! dispatch of [`Model::wait`], [`Model::view`], [`Model::force_report`],
//! [`Model::tag_for`] and the [`RegKernel`] commands to the room of the
//! semantics' family (`Family`, from `Semantics::family`). A room (`epoll.rs`,
//! `kqueue.rs`, `poll.rs`, `ports.rs`, `afd.rs`) holds its kernel's own state types and an
//! `impl Model` (and `impl RegKernel`) block with its part of each. A new kernel
//! interface plugs in with: a [`Semantics`] variant (in [`Semantics::ALL`]), a
//! `Family` variant and its arm in `Semantics::family`, a `mod` line here, its
//! state as a [`Model`] field (cleared by [`Model::close`] and
//! [`Model::fork_child`] as its kernel does), and one arm per `Family` match here
//! calling its room (`xxx_wait`, `xxx_view`, `xxx_force_report`, and one for a
//! [`RegKernel`] command). Another kernel of an existing interface (one more
//! kqueue) is a `Semantics` variant and the room's question about it (for
//! kqueue, its arm in [`Semantics::kqueue_kernel`]).
//!
//! # Examples
//!
//! ```
//! use pollshot::model::{Levels, Model, Origin, Semantics};
//! use pollshot::state::{Fallbacks, Phase, RegState};
//! use pollshot::Interest;
//!
//! for semantics in [Semantics::Epoll, Semantics::Kqueue, Semantics::KqueueNetBsd8, Semantics::Poll] {
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

mod afd;
pub mod epoll;
mod kqueue;
mod poll;
mod ports;

pub use self::afd::{afd_bits, AfdFault, AfdPoll, PollState, NO_SLOT};
pub use self::epoll::{epoll_flags_for, epoll_readiness, EpollEntry, EpollOp};
use self::kqueue::Belief;
pub use self::kqueue::{kq, kqueue_readiness, Change, Filter, Knote, KqueueKernel, RearmRecord};
pub use self::poll::{poll_readiness, PollEntry};
pub use self::ports::PortAssociation;
use crate::interest::Interest;
pub use crate::readiness::{RawEvent, Readiness};
use crate::state::{Kernel, KernelError};
use crate::token::{incarnation_in_usize, pack64, pack_usize};
use std::collections::BTreeMap;
use std::io;

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
    /// An exceptional condition: TCP urgent data (`POLLPRI`).
    pub priority: bool,
}

impl Levels {
    /// Levels from six bits: 1 readable, 2 writable, 4 read-closed, 8 hang-up,
    /// 16 error, 32 priority. Other bits are ignored.
    pub const fn from_bits(bits: u8) -> Levels {
        Levels {
            readable: bits & 1 != 0,
            writable: bits & 2 != 0,
            read_closed: bits & 4 != 0,
            hang_up: bits & 8 != 0,
            error: bits & 16 != 0,
            priority: bits & 32 != 0,
        }
    }

    /// Whether a registration armed for `interest` is reported with these levels
    /// on every semantics: the interest's direction is ready, or a hang-up or an
    /// error is pending (those are reported whatever the interest).
    pub const fn ready_for(self, interest: Interest) -> bool {
        (interest.is_readable() && (self.readable || self.read_closed))
            || (interest.is_writable() && self.writable)
            || (interest.is_priority() && self.priority)
            || self.hang_up
            || self.error
    }

    /// The levels as epoll bits (`EPOLLIN`, `EPOLLOUT`, `EPOLLRDHUP`, `EPOLLHUP`,
    /// `EPOLLERR`, `EPOLLPRI`).
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
        if self.priority {
            b |= epoll::PRI;
        }
        b
    }
}

/// Which kernel interface a [`Model`] behaves like. See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Semantics {
    /// epoll(7) with pollshot's epoll backend's commands.
    Epoll,
    /// kqueue(2) as on FreeBSD, macOS, DragonFly and NetBSD 10, with two knotes
    /// per registration: an `EV_ENABLE` re-runs the filter, every change stores
    /// `udata`.
    Kqueue,
    /// pollshot's poll(2) backend: a user-space set keyed by slot.
    Poll,
    /// kqueue(2) where only `EV_ADD` stores `udata` (the OpenBSD 6.4+ kernel),
    /// with the backend of a 32-bit target: `udata` carries the slot's
    /// incarnation.
    KqueueFixedUdata,
    /// kqueue(2) as on OpenBSD 6.4 and later: an `EV_ENABLE` re-runs the filter,
    /// only `EV_ADD` stores `udata`.
    KqueueOpenBsd,
    /// kqueue(2) as on NetBSD 8 and 9 (and OpenBSD 6.2, 6.3): an `EV_ENABLE`
    /// only re-queues a knote still active, only `EV_ADD` stores `udata`.
    KqueueNetBsd8,
    /// illumos event ports, `port_associate` with the generation in `user`.
    Ports,
    /// Windows: one `IOCTL_AFD_POLL` per arming, completing on an I/O
    /// completion port with the slot and the generation; cancelled on disarm,
    /// re-arm and deregister.
    Afd,
}

/// The kernel interface of a [`Semantics`]: which room serves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Epoll,
    Kqueue,
    Poll,
    Ports,
    Afd,
}

impl Semantics {
    /// Every semantics, for running one sequence on each.
    pub const ALL: [Semantics; 8] = [
        Semantics::Epoll,
        Semantics::Kqueue,
        Semantics::KqueueFixedUdata,
        Semantics::KqueueOpenBsd,
        Semantics::KqueueNetBsd8,
        Semantics::Poll,
        Semantics::Ports,
        Semantics::Afd,
    ];

    /// Every kqueue semantics.
    pub const KQUEUES: [Semantics; 4] = [
        Semantics::Kqueue,
        Semantics::KqueueFixedUdata,
        Semantics::KqueueOpenBsd,
        Semantics::KqueueNetBsd8,
    ];

    /// The room that serves this semantics.
    const fn family(self) -> Family {
        match self {
            Semantics::Epoll => Family::Epoll,
            Semantics::Kqueue
            | Semantics::KqueueFixedUdata
            | Semantics::KqueueOpenBsd
            | Semantics::KqueueNetBsd8 => Family::Kqueue,
            Semantics::Poll => Family::Poll,
            Semantics::Ports => Family::Ports,
            Semantics::Afd => Family::Afd,
        }
    }

    /// Whether a [`RawEvent::stamp`] from this kernel, with the backend's re-arm
    /// record, is the arming generation (else it is the slot's incarnation):
    /// `Backend::TAG_IS_GENERATION`. See also [`Model::tag_is_generation`].
    pub const fn tag_is_generation(self) -> bool {
        !matches!(self, Semantics::KqueueFixedUdata)
    }

    /// Whether this is a kqueue (any kind).
    pub const fn is_kqueue(self) -> bool {
        matches!(self.family(), Family::Kqueue)
    }

    /// Whether one registration may be reported as several kernel events by one
    /// wait (kqueue: one per filter): `Backend::SPLIT_FILTERS`.
    pub const fn split_filters(self) -> bool {
        self.is_kqueue()
    }

    /// Whether only sockets can be registered (Windows: `Poller::register`
    /// refuses any other handle with `InvalidInput`, before the table or the
    /// kernel hears of it), so a description the kernel cannot poll is never
    /// registered, rather than made always ready.
    pub const fn registers_sockets_only(self) -> bool {
        matches!(self, Semantics::Afd)
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
    /// EINVAL: kqueue cannot poll this description; or a malformed request. AFD:
    /// a poll of a handle that is not a socket (STATUS_OBJECT_TYPE_MISMATCH),
    /// passed on as an error.
    Inval,
    /// ENOMEM: the kernel refused the command for want of memory (epoll_ctl's
    /// ENOMEM, io_uring_enter's EAGAIN, a refused waker write on poll(2)), only
    /// where [`Model::refuse_next`] asked for it. Nothing changed, but a poll(2)
    /// delete, which the backend takes back disarmed.
    NoMem,
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
            Errno::NoMem => libc::ENOMEM,
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
    /// AFD: `IOCTL_AFD_POLL` requests issued (refused ones included).
    pub afd_polls: u64,
    /// AFD: `NtCancelIoFileEx` calls.
    pub afd_cancels: u64,
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
    afd: afd::AfdState,
    /// kqueue: the backend's belief per registration, by slot.
    beliefs: BTreeMap<u32, Belief>,
    /// kqueue: the change records the registrations' commands sent.
    sent: Vec<Change>,
    /// kqueue: the record the modelled backend re-arms with.
    rearm: RearmRecord,
    notified: bool,
    /// The next command a [`RegKernel`] receives is refused ([`Model::refuse_next`]).
    refuse: bool,
    log: Vec<CommandRecord>,
    calls: Calls,
}

/// What the kernel holds for one registration, for comparing with the table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelView {
    /// Whether the kernel holds anything under the registration's key (epoll: an
    /// entry for (description, number); kqueue: a knote on the number; poll: the
    /// slot in the set; AFD: the backend's record for the slot).
    pub present: bool,
    /// The readiness it is armed for (epoll: the `EPOLLIN`/`EPOLLOUT` bits;
    /// kqueue: the enabled filters; poll: the armed interest; AFD: the interest
    /// of the oldest poll for the slot that may still fire), if any.
    pub armed: Option<Interest>,
    /// The tag stored (epoll `data`, kqueue `udata` of the first knote, poll and
    /// AFD: slot and generation packed like epoll's `data`).
    pub tag: Option<u64>,
}

fn interest_from(read: bool, write: bool, priority: bool) -> Option<Interest> {
    Interest::from_bits(read as u8 | (write as u8) << 1 | (priority as u8) << 2)
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
            afd: afd::AfdState::default(),
            beliefs: BTreeMap::new(),
            sent: Vec::new(),
            rearm: RearmRecord::default(),
            notified: false,
            refuse: false,
            log: Vec::new(),
            calls: Calls::default(),
        }
    }

    /// Makes the kernel refuse the next command a [`RegKernel`] receives with
    /// ENOMEM ([`Errno::NoMem`]), as a kernel short of memory does: the command
    /// changes nothing (epoll_ctl(2) ENOMEM; a kqueue change refused whole; an
    /// io_uring submission refused), except a delete on poll(2) semantics, which
    /// leaves the entry disarmed (the backend takes back a delete whose wake-up
    /// was refused, disarmed). `false` withdraws a refusal not used yet.
    pub fn refuse_next(&mut self, refuse: bool) {
        self.refuse = refuse;
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
    /// to the description closes, the description is released, epoll drops its
    /// entries and AFD completes its pending polls with LOCAL_CLOSE.
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
            if self.semantics == Semantics::Afd {
                self.afd_close(desc);
            }
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
    /// description is ignored. On kqueue this is activity: each knote of the
    /// description whose filter fires becomes active (`knote()`); on AFD each
    /// pending poll of the description for an event now true completes.
    pub fn set_levels(&mut self, desc: DescId, levels: Levels) {
        if let Some(d) = self.descs.get_mut(desc.0 as usize) {
            d.levels = levels;
            if self.semantics.is_kqueue() {
                self.kqueue_activity(desc);
            }
            if self.semantics == Semantics::Afd {
                self.afd_activity(desc);
            }
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
        self.afd.clear();
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

    /// What the kernel holds for the registration on `fd` in `slot`.
    pub fn view(&self, fd: Fd, slot: u32) -> KernelView {
        match self.semantics.family() {
            Family::Epoll => self.epoll_view(fd),
            Family::Kqueue => self.kqueue_view(fd),
            Family::Poll => self.poll_view(slot),
            Family::Ports => self.port_view(fd),
            Family::Afd => self.afd_view(slot),
        }
    }

    /// One wait: what the kernel reports now, at most `max` events, ordered by key
    /// (AFD: the port's packets in the order they were queued, a cancelled poll's
    /// for [`NO_SLOT`]). Reported oneshot entries are disarmed (epoll),
    /// dispatched knotes disabled (kqueue), reported set entries disarmed (poll).
    /// Consumes a pending notify.
    pub fn wait(&mut self, max: usize) -> Vec<ModelEvent> {
        self.calls.waits += 1;
        self.notified = false;
        match self.semantics.family() {
            Family::Epoll => self.epoll_wait(max),
            Family::Kqueue => self.kqueue_wait(max),
            Family::Poll => self.poll_wait(max),
            Family::Ports => {
                let mut out = Vec::new();
                self.port_wait(max, &mut out);
                out
            }
            Family::Afd => self.afd_wait(max),
        }
    }

    /// The kernel reports the registration on `fd` in `slot` now, if it is armed,
    /// whatever the levels say (readiness that came and went before anyone looked):
    /// epoll fires the entry, kqueue its first enabled knote, poll its set entry,
    /// AFD completes the slot's current poll (or dequeues its queued packet).
    /// The event reports the armed direction.
    pub fn force_report(&mut self, fd: Fd, slot: u32) -> Option<ModelEvent> {
        match self.semantics.family() {
            Family::Epoll => self.epoll_force_report(fd),
            Family::Kqueue => self.kqueue_force_report(fd),
            Family::Poll => self.poll_force_report(slot),
            Family::Ports => self.port_force_report(fd),
            Family::Afd => self.afd_force_report(slot),
        }
    }

    /// The tag this kernel stores for a registration in `slot`, incarnation
    /// `incarnation`, armed at `generation` (what [`KernelView::tag`] shows): epoll
    /// and poll pack slot and generation, kqueue packs them into a
    /// pointer-sized `udata` (slot and incarnation where
    /// [`Model::tag_is_generation`] is false).
    pub fn tag_for(&self, slot: u32, incarnation: u32, generation: u32) -> u64 {
        match self.semantics.family() {
            Family::Kqueue if self.tag_is_generation() => pack_usize(slot, generation) as u64,
            Family::Kqueue => pack_usize(slot, incarnation) as u64,
            Family::Epoll | Family::Poll | Family::Ports | Family::Afd => pack64(slot, generation),
        }
    }

    /// Whether a [`RawEvent::stamp`] from this model is the arming generation
    /// (else the slot's incarnation), as the modelled backend chose its tags: the
    /// semantics' [`Semantics::tag_is_generation`], except with the re-arm record
    /// [`RearmRecord::Enable`] on a kernel whose `EV_ENABLE` does not store
    /// `udata`, where the backend carried the incarnation (as it did before).
    pub fn tag_is_generation(&self) -> bool {
        let kept = self
            .semantics
            .kqueue_kernel()
            .is_some_and(|k| !k.enable_stores_udata);
        self.semantics.tag_is_generation() && !(self.rearm == RearmRecord::Enable && kept)
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
/// | modify(i) | `MOD`, `ONESHOT` + i | `EV_ADD \| EV_ENABLE \| EV_DISPATCH` per filter in i (`EV_ADD \| EV_DISPATCH` if never added), `EV_DISABLE \| EV_DISPATCH` for one enabled outside i; ENOENT: delete both, add again | re-arm, ENOENT if absent |
/// | quiet | `MOD`, `ONESHOT` alone | `EV_DISABLE \| EV_DISPATCH` per enabled filter; all ENOENT: `NotFound` | disarm, ENOENT if absent |
/// | delete | `DEL` | `EV_DELETE` per added filter | remove, ENOENT if absent |
///
/// The kqueue column is the backend's translator (`backends/kqueue/changes.rs`,
/// `changes::translate`, `changes::readd`), every record with `EV_RECEIPT`; the
/// refusals are classified as the backend classifies them (EINVAL on an add:
/// not pollable, and the knotes are deleted; EBADF: bad descriptor).
///
/// AFD (`backends/windows/mod.rs`): add(i) is one `IOCTL_AFD_POLL` for i on the
/// number (the base handle), recorded for the slot (EBADF if the number is
/// closed); modify(i) a poll on the recorded base handle, then a cancel of the
/// previous poll if it may still fire (ENOENT with no record); quiet a cancel of
/// the current poll; delete forgets the record and cancels it (ENOENT with no
/// record). A poll of a handle that is not a socket is refused with EINVAL,
/// passed on as an error (`KernelError::Other`), not as "not pollable".
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
    fn run(&mut self, command: Command) -> Result<(), KernelError> {
        let sem = self.model.semantics;
        if std::mem::take(&mut self.model.refuse) {
            if command == Command::Delete && sem.family() == Family::Poll {
                if let Some(e) = self.model.pollset.get_mut(&self.slot) {
                    e.armed = None;
                }
            }
            self.model.log.push(CommandRecord {
                command,
                error: Some(Errno::NoMem),
            });
            return Err(classify(Errno::NoMem, sem));
        }
        let r = match sem.family() {
            Family::Epoll => self.epoll(command),
            Family::Kqueue => {
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
            Family::Poll => self.poll(command),
            Family::Ports => self
                .model
                .port_run(self.fd, self.slot, command, self.origin),
            Family::Afd => self.model.afd_run(self.fd, self.slot, command, self.origin),
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

    /// `refuse_next`: the next command alone is refused with ENOMEM and changes
    /// nothing in the kernel, but a poll(2) delete, which leaves the entry
    /// disarmed; a refusal withdrawn refuses nothing.
    #[test]
    fn a_refusal_refuses_the_next_command_alone_and_changes_nothing() {
        const O: Origin = Origin {
            owner: 1,
            arming: 1,
        };
        for sem in Semantics::ALL {
            let mut m = Model::new(sem);
            let fd = m.open(true);
            m.kernel(fd, 0, 0, O).add(Interest::READABLE, 1).unwrap();
            m.take_commands();
            let before = m.view(fd, 0);
            for cmd in [Command::Modify(Interest::WRITABLE, 2), Command::Quiet(2)] {
                m.refuse_next(true);
                let mut k = m.kernel(fd, 0, 0, O);
                let r = match cmd {
                    Command::Modify(i, g) => k.modify(i, g),
                    _ => k.quiet(2),
                };
                assert!(
                    matches!(r, Err(KernelError::Other(ref e)) if e.raw_os_error() == Some(libc::ENOMEM)),
                    "{sem:?} {cmd:?}: {r:?}"
                );
                assert_eq!(m.view(fd, 0), before, "{sem:?} {cmd:?}");
                let log = m.take_commands();
                assert_eq!(log.len(), 1, "{sem:?}");
                assert_eq!(log[0].error, Some(Errno::NoMem), "{sem:?}");
            }
            m.refuse_next(true);
            assert!(m.kernel(fd, 0, 0, O).delete().is_err(), "{sem:?}");
            let kept = m.view(fd, 0);
            assert!(kept.present, "{sem:?}: a refused delete keeps the entry");
            if sem == Semantics::Poll {
                assert_eq!(kept.armed, None, "poll(2): taken back disarmed");
            } else {
                assert_eq!(kept, before, "{sem:?}");
            }
            m.refuse_next(true);
            m.refuse_next(false);
            m.kernel(fd, 0, 0, O).delete().unwrap();
            assert!(!m.view(fd, 0).present, "{sem:?}: the retry deletes");
        }
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
