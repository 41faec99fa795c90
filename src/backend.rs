//! The backend contract: what a kernel interface must provide, and the contract of
//! each method in terms of the state table in `state` (the crate's `src/state.rs`).
//!
//! Backends: `Epoll` (Linux, Android), `Kqueue` (the BSDs,
//! Apple; on Linux with `--cfg pollshot_libkqueue`), `Ports` (illumos, Solaris) and
//! [`Blocking`](crate::backends::Blocking) (poll(2), every Unix).
//!
//! [`Backend`] is the public name, *sealed*: it has no methods a user can call or
//! implement, only the supertrait [`Driver`], which is crate-private. The set of
//! backends is the crate's to keep, and their internals can change without a
//! breaking release.

use crate::interest::Interest;
use crate::raw::{Kind, RawFd};
// `crate::backend::RawEvent` stays a path to it (`src/readiness.rs` owns it).
pub(crate) use crate::readiness::RawEvent;
use crate::readiness::Readiness;
use crate::state::KernelError;
use crate::stats::Counters;
use std::io;
use std::time::Duration;

/// A kernel interface a [`Poller`](crate::Poller) can run on: one of the types in
/// [`backends`](crate::backends).
///
/// Sealed: implemented by the crate's backends only, and with no public methods. Use
/// it to name a backend, as in `Poller::<pollshot::backends::Blocking>::with_backend()`,
/// or as a bound, as in `fn serve<B: pollshot::Backend>(p: &pollshot::Poller<B>)`.
pub trait Backend: Driver {}

/// Where [`Driver::wait_each`] hands a wait's kernel events, one call each (a
/// trait rather than a closure, so that its method can be inlined always).
pub trait EventSink {
    /// Takes one kernel event.
    fn event(&mut self, ev: RawEvent);
}

/// Appends each event.
impl EventSink for Vec<RawEvent> {
    #[inline(always)]
    fn event(&mut self, ev: RawEvent) {
        self.push(ev);
    }
}

/// Who a kernel command is for: the slot, its incarnation and the arming generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    /// The registration's slot in the poller's table.
    pub slot: u32,
    /// The slot's incarnation (the high half of its [`Token`](crate::token::Token)).
    pub incarnation: u32,
    /// The generation this command installs (epoll writes it into `data.u64`).
    pub generation: u32,
}

/// The contract a kernel interface implements (crate-private: see [`Backend`]).
///
/// Every method may be called from several threads at once. The poller serialises
/// the commands for one registration (it holds that registration's lock across the
/// call), never across registrations, and never holds a lock across [`wait`](Self::wait).
///
/// Registration commands answer with a [`KernelError`] the state machine acts on:
/// `NotFound` (ENOENT), `Exists` (EEXIST), `NotPollable` (the kernel cannot poll this
/// descriptor: epoll EPERM, kqueue EINVAL), `BadFd` (EBADF), or `Other`.
pub trait Driver: Send + Sync + Sized + 'static {
    /// A short name for reports: `"epoll"`, `"kqueue"`, `"blocking"`.
    const NAME: &'static str;

    /// Whether [`RawEvent::stamp`] is the arming generation (epoll: it rides in
    /// `data.u64`; kqueue on 64-bit targets, whose re-arm record every kernel
    /// stores `udata` from). If not, it is the slot's incarnation (kqueue on
    /// 32-bit targets: `udata` is fixed at `EV_ADD`), and an event is current exactly when
    /// the table says armed.
    const TAG_IS_GENERATION: bool;

    /// Whether one registration may come back as several kernel events from one
    /// wait (kqueue: one knote per filter). The poller merges them into one event.
    const SPLIT_FILTERS: bool;

    /// Whether the kernel can be asked for [`Interest::PRIORITY`] (epoll
    /// `EPOLLPRI`, poll(2) and io_uring `POLLPRI`). Where not (kqueue), the
    /// poller refuses such an arm with `ErrorKind::Unsupported` before any
    /// command, so `add` and `modify` never see the bit.
    const PRIORITY: bool = true;

    /// Whether [`Interest::PRIORITY`] may be asked for without
    /// [`Interest::READABLE`]. io_uring: no. A socket wakes its waiters with
    /// `EPOLLPRI` in the key for all data (`sock_def_readable`), so the kernel's
    /// `io_poll_wake` takes a oneshot poll request that asks for `POLLPRI` off the
    /// wait queue when ordinary data arrives, and urgent data that comes after
    /// it completes nothing: the poller refuses such an arm with
    /// `ErrorKind::Unsupported` rather than lose the event.
    const PRIORITY_WITHOUT_READABLE: bool = true;

    /// A new kernel instance and waker, both close-on-exec.
    ///
    /// # Errors
    /// The kernel's error from creating them (EMFILE, ENFILE, ENOMEM).
    fn new() -> io::Result<Self>;

    /// Row "fresh, arm(i)": put `fd` in the kernel armed once for `interest`.
    fn add(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError>;

    /// Rows "idle, arm(i)" and "armed(i), arm(j)": re-arm `fd` once for `interest`
    /// with a new generation. A descriptor the kernel lost answers `NotFound`.
    fn modify(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError>;

    /// Row "armed, disarm": keep `fd` in the kernel but report nothing (epoll: a MOD
    /// with `EPOLLONESHOT` and no readiness bits, so that a hang-up fires at most once).
    fn quiet(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError>;

    /// Row "in kernel, deregister": remove `fd`. ENOENT, EBADF and a refusal to
    /// poll the number (epoll's EPERM: it now names a regular file) are answered
    /// as such; the state machine treats them as success.
    fn delete(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError>;

    /// Row "in kernel, deregister" for a registration that a new registration of
    /// the same descriptor number supersedes (`Poller::register`): the number was
    /// closed and reused, or registered twice, and already belongs to the new
    /// registration. The default is [`delete`](Self::delete); kqueue lets the
    /// delete ride with the new registration's first command on that number.
    #[inline]
    fn delete_superseded(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        self.delete(fd, tag)
    }

    /// The poller made (`Some(kind)`) or removed (`None`) the registration in
    /// table slot `slot`, under that slot's lock: before any command for the new
    /// registration, after the last one for the old. The default does nothing;
    /// the Windows backend keeps which slots hold waitable handles.
    #[inline(always)]
    fn registered(&self, slot: u32, kind: Option<Kind>) {
        let _ = (slot, kind);
    }

    /// Windows: queues one packet the user posts (`Poller::post`) on the
    /// completion port, to be reported by one [`wait`](Self::wait) as a
    /// [`RawEvent`] with [`Readiness::POSTED`] (its slot and stamp the key's low
    /// and high halves, readable and writable as `interest` says).
    ///
    /// # Errors
    /// The kernel's error from the post (not expected).
    #[cfg(windows)]
    fn post(&self, key: usize, interest: Interest) -> io::Result<()>;

    /// Called after the poller accepted a delivery for `fd` that completes an arming
    /// for `interest` and reported `readiness`. A backend whose kernel disarmed only
    /// part of the registration (kqueue: the filter that fired) quiets the rest here.
    #[inline]
    fn delivered(&self, fd: RawFd, tag: Tag, interest: Interest, readiness: Readiness) {
        let _ = (fd, tag, interest, readiness);
    }

    /// Waits for kernel events and appends at most `max` of them to `out`.
    ///
    /// `max` is at least 1: the poller waits only when its buffer has room
    /// (`Events::remaining`), and epoll passes it to the kernel as `maxevents`,
    /// which refuses 0 (EINVAL).
    ///
    /// `None` blocks until an event or a [`wake`](Self::wake); `Some(ZERO)` never
    /// blocks; any other timeout waits at least that long (rounded up to the kernel's
    /// unit), and a huge one is clamped rather than refused. The wait returns when it
    /// appended an event, when it was woken, or when the timeout passed; a kernel
    /// wait that returned only for the backend's own purposes (a change to carry) is
    /// repeated inside for the time left.
    ///
    /// Returns `Ok(true)` when a [`wake`](Self::wake) reached this wait (it may have
    /// appended events too), `Ok(false)` otherwise: with nothing appended, that means
    /// the timeout passed. EINTR is returned as `ErrorKind::Interrupted`, with
    /// nothing appended.
    fn wait(
        &self,
        out: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<bool>;

    /// [`wait`](Self::wait), with each event appended handed to `each` instead
    /// (in the kernel's order), so that the poller checks it against the table
    /// straight from the kernel's buffer. Same timeouts, wake-ups, errors and
    /// return value as `wait`; `scratch` is the poller's buffer for a backend that
    /// needs one. The default is `wait` into `scratch` (cleared first), then
    /// `each` on every event it appended, also when the wait fails; epoll
    /// overrides it and reads its stack buffer of `epoll_event`s directly.
    #[inline(always)]
    fn wait_each(
        &self,
        scratch: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
        each: &mut impl EventSink,
    ) -> io::Result<bool> {
        scratch.clear();
        let waited = self.wait(scratch, max, timeout);
        for &ev in scratch.iter() {
            each.event(ev);
        }
        waited
    }

    /// The binary waker: after this call, at least one wait (blocked now, or the
    /// next one) returns `Ok(true)`. Wake-ups that no wait has seen yet may merge
    /// into one; the poller counts notifies above this (`src/wake.rs`).
    fn wake(&self) -> io::Result<()>;

    /// In a forked child: replace the kernel instance and the waker with new ones
    /// that the child owns, without touching the parent's (never close a descriptor
    /// the child does not own). Registrations are re-added by the poller afterwards.
    fn reinit_after_fork(&mut self) -> io::Result<()>;

    /// In a forked child that drops the poller without re-initialising: release
    /// what the child must not close (a kqueue is not inherited across fork).
    fn abandon_after_fork(&mut self) {}

    /// Whether `fd` is one of the backend's own descriptors (the kernel instance,
    /// the waker). The poller refuses to register those: a registration would steal
    /// the waker's readiness and break `notify`.
    fn owns_fd(&self, fd: RawFd) -> bool;

    /// The counters this backend and its poller increment.
    fn counters(&self) -> &Counters;
}
