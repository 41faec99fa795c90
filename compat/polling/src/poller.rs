//! [`Poller`]: polling's registration calls over one `pollshot::Poller`.
//!
//! polling names a registration by its descriptor and tags its events with the
//! caller's key; pollshot names it by a [`Token`] it hands out. The facade keeps
//! the translation in one table, guarded by a read-write lock that every call but
//! `add` and `delete` takes shared:
//!
//! - `slots`, by the token's [`index`](Token::index) (on Unix the descriptor
//!   number itself): the token, the interest and the mode (for `modify` and
//!   `delete` by descriptor, and for `wait`, one lookup per delivered event by
//!   its token, for the level re-arm). A map, not a vector indexed by number: a
//!   number far above the others (one that is not open, say) costs one entry.
//! - on Windows, `sockets` and `waitables`: the index of each socket and waitable
//!   handle, by handle value (pollshot chooses the index there; the two kinds are
//!   named apart, as polling's `delete` and `remove_waitable` are).
//!
//! The caller's key is pollshot's key of the registration (`register_with`,
//! `set_key`): every delivered event carries it, and pollshot never delivers an
//! event of an earlier registration of the number with it. The slot keeps a copy
//! only so that a `modify` that keeps the key (async-io's never changes it) skips
//! the `set_key`.
//!
//! Each slot's key, interest and mode sit behind the slot's own mutex, held across
//! the pollshot call that arms or disarms it, so the kernel's arming and the table
//! change together.

use crate::event::Extra;
use crate::{AsRawSource, AsSource, Event, Events, PollMode};
use pollshot::{Interest, Token};
use std::collections::HashMap;
use std::fmt;
use std::io;
#[cfg(unix)]
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
#[cfg(windows)]
use std::os::windows::io::{AsRawSocket, BorrowedSocket, RawSocket};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

/// The key polling reserves for its own notifications.
const RESERVED_KEY: usize = usize::MAX;

/// Waits for readiness of registered descriptors: polling 3.x's `Poller` over a
/// `pollshot::Poller` (epoll `EPOLLONESHOT` on Linux, kqueue `EV_DISPATCH` on the
/// BSDs and Apple, poll(2) elsewhere).
///
/// What differs from polling's own backends:
///
/// - Several threads may [`wait`](Self::wait) at once; each event reaches exactly
///   one of them (polling returns at once, with no event, from a second concurrent
///   `wait`).
/// - An arming costs one `EPOLL_CTL_MOD` (none when the registration is still
///   armed), and a wait costs one `epoll_wait` (`epoll_pwait2` for sub-millisecond
///   timeouts): no timer descriptor and no notifier re-registration per wait.
/// - `add` makes no system call: the kernel learns of the descriptor at its first
///   arming (an `add` with an interest, or a `modify`). A descriptor that is not
///   open is therefore reported by that arming, not by an `add` with
///   [`Event::none`].
/// - Regular files (which epoll refuses with EPERM) are reported always ready.
/// - [`PollMode::Edge`] and [`PollMode::EdgeOneshot`] are refused
///   ([`supports_edge`](Self::supports_edge) is `false`); `Level` is emulated by
///   re-arming after each delivery.
/// - After `fork(2)`, the child cannot use a poller made by the parent (pollshot
///   refuses every call there); a child that needs one makes its own.
///
/// On Windows (AFD poll and a completion port; the crate docs have the table):
///
/// - `add` checks that the handle is a socket (`ErrorKind::InvalidInput` if not),
///   and arms nothing for [`Event::none`].
/// - `Level` is re-armed by the next `wait` (of any thread), not at the delivery:
///   an `IOCTL_AFD_POLL` reports the readiness of the moment it is issued, so a
///   poll issued at the delivery would later report data read since.
/// - The priority flag ([`Event::set_priority`]) changes nothing in what is
///   watched (pollshot asks AFD for no urgent data), as on kqueue.
/// - The poller is not `AsRawHandle`/`AsHandle` (polling's is, for its
///   completion port): pollshot does not hand out its port.
///
/// `Send + Sync`: share it by reference or `Arc`.
pub struct Poller {
    /// Shared with the kqueue filters' thread (which holds it weakly, to notify).
    inner: Arc<pollshot::Poller>,
    table: RwLock<Table>,
    /// Whether the backend can be asked for urgent data (`Interest::PRIORITY`):
    /// not on kqueue.
    priority: bool,
    /// The kqueue filters (signals, processes, timers): a second kqueue and a
    /// thread that collects its events.
    #[cfg(polling_kqueue)]
    pub(crate) filters: crate::os::kqueue::Filters,
    /// Windows: `Level` registrations delivered and not re-armed yet; the next
    /// `wait` arms them before it blocks (see `wait`).
    #[cfg(windows)]
    rearm: Mutex<Vec<Token>>,
}

#[derive(Default)]
pub(crate) struct Table {
    /// By the token's index.
    slots: HashMap<usize, Slot>,
    /// Windows: each registered socket's index, by handle value.
    #[cfg(windows)]
    sockets: HashMap<RawSocket, usize>,
    /// Windows: each registered waitable handle's index, by handle value.
    #[cfg(windows)]
    pub(crate) waitables: HashMap<usize, usize>,
}

pub(crate) struct Slot {
    token: Token,
    /// A waitable handle (Windows): armed for `Interest::READABLE` (signaled)
    /// whatever the directions, which its events report as given.
    #[cfg(windows)]
    waitable: bool,
    state: Mutex<SlotState>,
}

#[derive(Clone, Copy)]
struct SlotState {
    /// The caller's key, as pollshot's key of the registration holds it (a copy,
    /// so that a `modify` that keeps it makes no `set_key`).
    key: usize,
    /// What the registration is armed for; `None`: registered, not watched.
    interest: Option<Interest>,
    /// `PollMode::Level`: re-armed after each delivery.
    level: bool,
}

impl Table {
    fn slot(&self, token: Token) -> Option<&Slot> {
        self.slots
            .get(&token.index())
            .filter(|slot| slot.token == token)
    }

    #[cfg(unix)]
    fn by_fd(&self, fd: RawFd) -> Option<&Slot> {
        self.slots.get(&usize::try_from(fd).ok()?)
    }

    #[cfg(windows)]
    fn by_fd(&self, socket: RawSocket) -> Option<&Slot> {
        self.slots.get(self.sockets.get(&socket)?)
    }

    #[cfg(windows)]
    pub(crate) fn by_index(&self, index: usize) -> Option<&Slot> {
        self.slots.get(&index)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A slot's state is three plain fields written together: a panic elsewhere
    // cannot leave it half-written, so poisoning carries no information.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The interest `ev` asks for (`priority`: whether the backend can be asked for
/// urgent data; where not, that flag is ignored, as polling's kqueue backend does).
fn interest_of(ev: Event, priority: bool) -> Option<Interest> {
    let directions = match (ev.readable, ev.writable) {
        (true, true) => Some(Interest::BOTH),
        (true, false) => Some(Interest::READABLE),
        (false, true) => Some(Interest::WRITABLE),
        (false, false) => None,
    };
    if priority && ev.extra.priority() {
        Some(directions.map_or(Interest::PRIORITY, |d| d | Interest::PRIORITY))
    } else {
        directions
    }
}

/// `level` for a mode, or `Unsupported` for the edge modes.
pub(crate) fn level_of(mode: PollMode) -> io::Result<bool> {
    match mode {
        PollMode::Oneshot => Ok(false),
        PollMode::Level => Ok(true),
        PollMode::Edge | PollMode::EdgeOneshot => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "polling (pollshot facade): PollMode::{mode:?} is not supported: pollshot \
                 registrations are level-triggered oneshot armings, with no edge-triggered \
                 mode (Poller::supports_edge() is false); use Oneshot or Level"
            ),
        )),
    }
}

pub(crate) fn check_key(op: &str, key: usize) -> io::Result<()> {
    if key == RESERVED_KEY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("polling {op}: the key usize::MAX is reserved for notifications"),
        ));
    }
    Ok(())
}

/// A source's number in messages: the descriptor (Unix), the socket's handle
/// value (Windows).
#[cfg(unix)]
type Raw = RawFd;
#[cfg(windows)]
type Raw = RawSocket;

/// `fd N` (Unix), `socket 0xN` (Windows).
fn named(fd: Raw) -> String {
    #[cfg(unix)]
    return format!("fd {fd}");
    #[cfg(windows)]
    return format!("socket {fd:#x}");
}

fn not_registered(op: &str, fd: Raw) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "polling {op}: {} is not registered in this poller",
            named(fd)
        ),
    )
}

/// What pollshot is armed for when a slot watches `interest`: the interest for a
/// socket, `READABLE` (signaled) for a waitable handle.
#[cfg_attr(unix, allow(unused_variables))]
fn arming(slot: &Slot, interest: Interest) -> Interest {
    #[cfg(windows)]
    if slot.waitable {
        return Interest::READABLE;
    }
    interest
}

impl Poller {
    /// A new poller: one pollshot poller on the target's default backend.
    ///
    /// # Errors
    /// The kernel's error creating the instance or its waker (EMFILE, ENFILE,
    /// ENOMEM): epoll_create1(2), eventfd(2), kqueue(2), pipe(2).
    pub fn new() -> io::Result<Poller> {
        let inner = pollshot::Poller::new()?;
        Ok(Poller {
            // Neither kqueue nor AFD is asked for urgent data by pollshot.
            priority: !matches!(inner.backend_name(), "kqueue" | "afd"),
            inner: Arc::new(inner),
            table: RwLock::new(Table::default()),
            #[cfg(polling_kqueue)]
            filters: crate::os::kqueue::Filters::new(),
            #[cfg(windows)]
            rearm: Mutex::new(Vec::new()),
        })
    }

    /// Whether [`PollMode::Level`] is accepted: always (emulated: the facade re-arms
    /// a level registration after each delivery, one `EPOLL_CTL_MOD` per delivery).
    pub fn supports_level(&self) -> bool {
        true
    }

    /// Whether [`PollMode::Edge`] and [`PollMode::EdgeOneshot`] are accepted: never.
    /// pollshot has no edge-triggered registration; see [`PollMode`].
    pub fn supports_edge(&self) -> bool {
        false
    }

    #[cfg(any(polling_kqueue, windows))]
    pub(crate) fn inner(&self) -> &Arc<pollshot::Poller> {
        &self.inner
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Table> {
        // The table is only changed by whole inserts and removals: a panic while it
        // is held for writing cannot leave a half-made entry.
        self.table.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Table> {
        self.table.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `source` in [`PollMode::Oneshot`] and arms it for `interest`
    /// (nothing is armed for [`Event::none`]). See
    /// [`add_with_mode`](Self::add_with_mode).
    ///
    /// # Safety
    /// `source` must stay open until it is [`delete`](Self::delete)d from this poller.
    ///
    /// # Errors
    /// As [`add_with_mode`](Self::add_with_mode).
    pub unsafe fn add(&self, source: impl AsRawSource, interest: Event) -> io::Result<()> {
        // SAFETY: the caller's promise is passed on unchanged.
        unsafe { self.add_with_mode(source, interest, PollMode::Oneshot) }
    }

    /// Registers `source` under `interest.key` and arms it for `interest`'s
    /// directions in `mode`.
    ///
    /// The registration is the descriptor's: one per descriptor number per poller.
    /// An interest with no direction registers without arming (no system call);
    /// otherwise the first arming is one `EPOLL_CTL_ADD` (kqueue: `EV_ADD`).
    ///
    /// # Safety
    /// `source` must stay open until it is [`delete`](Self::delete)d from this poller.
    ///
    /// # Errors
    /// - `ErrorKind::InvalidInput`: `interest.key` is `usize::MAX` (reserved), the
    ///   descriptor is negative, or it is the poller's own.
    /// - EBADF (`raw_os_error()`, as epoll_ctl(2) answers): the descriptor is not
    ///   open; reported by the first arming (an `add` with an interest, else the
    ///   first `modify`).
    /// - `ErrorKind::AlreadyExists`: the descriptor is registered already.
    /// - `ErrorKind::Unsupported`: `mode` is `Edge` or `EdgeOneshot`.
    /// - the kernel's error from the first arming otherwise (ENOMEM, ENOSPC):
    ///   epoll_ctl(2), kevent(2). Nothing stays registered after an error.
    pub unsafe fn add_with_mode(
        &self,
        source: impl AsRawSource,
        interest: Event,
        mode: PollMode,
    ) -> io::Result<()> {
        check_key("add", interest.key)?;
        let level = level_of(mode)?;
        let fd = source.raw();
        #[cfg(unix)]
        if fd < 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("polling add: fd {fd} is negative, not a descriptor"),
            ));
        }
        #[cfg(windows)]
        // INVALID_SOCKET (winsock2.h: `(SOCKET)(~0)`).
        if fd == RawSocket::MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "polling add: the socket is INVALID_SOCKET, not a socket handle",
            ));
        }
        let mut table = self.write();
        if table.by_fd(fd).is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "polling add: {} is registered already (modify it instead)",
                    named(fd)
                ),
            ));
        }
        // SAFETY: `fd` is a valid descriptor (non-negative) or socket handle (not
        // INVALID_SOCKET), checked above, and by this function's contract open
        // until it is deleted from this poller, which deregisters it; pollshot only
        // passes the number to the kernel.
        #[cfg(unix)]
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        // SAFETY: as above.
        #[cfg(windows)]
        let borrowed = unsafe { BorrowedSocket::borrow_raw(fd) };
        let token = self.inner.register_with(&borrowed, interest.key)?;
        let _index = self.insert_slot(&mut table, token, interest, level, false)?;
        #[cfg(windows)]
        table.sockets.insert(fd, _index);
        Ok(())
    }

    /// Arms a new registration `token` for `interest` (none for no direction) and
    /// records it in the table; on an error deregisters it. Returns its index.
    pub(crate) fn insert_slot(
        &self,
        table: &mut Table,
        token: Token,
        interest: Event,
        level: bool,
        #[cfg_attr(unix, allow(unused_variables))] waitable: bool,
    ) -> io::Result<usize> {
        let slot = Slot {
            token,
            #[cfg(windows)]
            waitable,
            state: Mutex::new(SlotState {
                key: interest.key,
                interest: None,
                level,
            }),
        };
        let wanted = interest_of(interest, self.priority);
        if let Some(i) = wanted {
            if let Err(e) = self.inner.arm(token, arming(&slot, i)) {
                let _ = self.inner.deregister(token);
                return Err(e);
            }
        }
        lock(&slot.state).interest = wanted;
        table.slots.insert(token.index(), slot);
        Ok(token.index())
    }

    /// [`modify_with_mode`](Self::modify_with_mode) in [`PollMode::Oneshot`].
    ///
    /// # Errors
    /// As [`modify_with_mode`](Self::modify_with_mode).
    pub fn modify(&self, source: impl AsSource, interest: Event) -> io::Result<()> {
        self.modify_with_mode(source, interest, PollMode::Oneshot)
    }

    /// Re-arms the registration of `source` for `interest`'s directions in `mode`,
    /// under `interest.key` from now on; [`Event::none`] disarms it.
    ///
    /// A readiness that already holds is reported by the next `wait` (the arming is
    /// level-triggered). Cost: none when the registration is still armed for the
    /// same directions (its arming stands); one `EPOLL_CTL_MOD` otherwise (kqueue:
    /// `EV_ENABLE`, riding on the next `kevent` call where it can).
    ///
    /// # Errors
    /// - `ErrorKind::InvalidInput`: `interest.key` is `usize::MAX`.
    /// - EBADF (`raw_os_error()`): the descriptor is closed.
    /// - `ErrorKind::NotFound`: `source` is not registered in this poller.
    /// - `ErrorKind::Unsupported`: `mode` is `Edge` or `EdgeOneshot`.
    /// - the kernel's error otherwise (ENOMEM, ENOSPC): epoll_ctl(2), kevent(2).
    pub fn modify_with_mode(
        &self,
        source: impl AsSource,
        interest: Event,
        mode: PollMode,
    ) -> io::Result<()> {
        check_key("modify", interest.key)?;
        let level = level_of(mode)?;
        #[cfg(unix)]
        let fd = source.source().as_raw_fd();
        #[cfg(windows)]
        let fd = source.source().as_raw_socket();
        let table = self.read();
        let slot = table
            .by_fd(fd)
            .ok_or_else(|| not_registered("modify", fd))?;
        self.modify_slot(slot, interest, level)
    }

    /// Re-arms `slot` for `interest` (disarms it for none), under its key.
    pub(crate) fn modify_slot(&self, slot: &Slot, interest: Event, level: bool) -> io::Result<()> {
        let mut state = lock(&slot.state);
        let wanted = interest_of(interest, self.priority);
        if interest.key != state.key {
            // Before the arm: the new arming's event carries the new key.
            self.inner.set_key(slot.token, interest.key)?;
            state.key = interest.key;
        }
        match wanted {
            Some(i) => self.inner.arm(slot.token, arming(slot, i))?,
            None => self.inner.disarm(slot.token)?,
        }
        *state = SlotState {
            key: interest.key,
            interest: wanted,
            level,
        };
        Ok(())
    }

    /// Removes the registration of `source` (`EPOLL_CTL_DEL`; kqueue `EV_DELETE`;
    /// nothing when it was never armed). Its events not yet collected are dropped.
    /// The descriptor is left as it is (still non-blocking, still open).
    ///
    /// # Errors
    /// - `ErrorKind::NotFound`: `source` is not registered in this poller.
    /// - the kernel's error from the delete other than ENOENT and EBADF (which mean
    ///   the kernel dropped it already); the registration is removed all the same.
    pub fn delete(&self, source: impl AsSource) -> io::Result<()> {
        #[cfg(unix)]
        let fd = source.source().as_raw_fd();
        #[cfg(windows)]
        let fd = source.source().as_raw_socket();
        let mut table = self.write();
        #[cfg(unix)]
        let index = usize::try_from(fd).ok();
        #[cfg(windows)]
        let index = table.sockets.remove(&fd);
        let slot = index
            .and_then(|i| table.slots.remove(&i))
            .ok_or_else(|| not_registered("delete", fd))?;
        drop(table);
        self.inner.deregister(slot.token)
    }

    /// Removes the slot at `index` from the table and deregisters it.
    #[cfg(windows)]
    pub(crate) fn remove_slot(
        &self,
        mut table: RwLockWriteGuard<'_, Table>,
        index: usize,
    ) -> io::Result<()> {
        let Some(slot) = table.slots.remove(&index) else {
            return Ok(());
        };
        drop(table);
        self.inner.deregister(slot.token)
    }

    /// Waits for readiness and appends the events to `events` (never clearing it);
    /// returns `events.len()` afterwards, as polling 3.x does: the number of new
    /// events when the list was cleared before the call.
    ///
    /// Returns with none when `timeout` passes or a [`notify`](Self::notify) wakes
    /// it. `None` blocks; zero never blocks; anything else waits at least that long,
    /// below a millisecond too (`epoll_pwait2` with the exact timespec where the
    /// kernel has it, else rounded up to whole milliseconds); a timeout too large
    /// for an `Instant` blocks. A signal (EINTR) does not end the wait: it goes on
    /// until the same deadline.
    ///
    /// Several threads may wait at once; each event is appended for one of them.
    /// One call collects at most `events.capacity()` events.
    ///
    /// # Errors
    /// The kernel's error from the wait (EBADF, EFAULT, EINVAL: not expected), or
    /// `ErrorKind::Other` in a forked child (pollshot's pollers do not survive
    /// fork(2)): epoll_wait(2), kevent(2), poll(2).
    pub fn wait(&self, events: &mut Events, timeout: Option<Duration>) -> io::Result<usize> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        self.wait_until(events, deadline)
    }

    /// [`wait`](Self::wait) until `deadline` (an `Instant` in the past does not
    /// block).
    ///
    /// # Errors
    /// As [`wait`](Self::wait).
    pub fn wait_deadline(&self, events: &mut Events, deadline: Instant) -> io::Result<usize> {
        self.wait_until(events, Some(deadline))
    }

    fn wait_until(&self, events: &mut Events, deadline: Option<Instant>) -> io::Result<usize> {
        loop {
            #[cfg(windows)]
            self.rearm_level();
            let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let delivered = match self.inner.deliver(&mut events.raw, timeout) {
                Ok(n) => Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Err(()),
                Err(e) => return Err(e),
            };
            let mut added = 0;
            if delivered.is_ok_and(|n| n > 0) {
                added += self.translate(events);
            }
            #[cfg(polling_kqueue)]
            {
                added += self.filters.take(&mut events.list);
            }
            match delivered {
                // A timeout or a notify (`events.raw.is_notified()`): either ends
                // the wait. pollshot itself keeps waiting past stale events.
                Ok(0) => break,
                // Events, or only events for sources deleted meanwhile: then
                // keep waiting for the time left.
                Ok(_) if added > 0 || timeout == Some(Duration::ZERO) => break,
                Ok(_) => {}
                // A signal: keep waiting until the same deadline.
                Err(()) if added > 0 => break,
                Err(()) => {}
            }
        }
        // polling 3.x returns the length of the list, which equals the number of new
        // events when the list was cleared before the wait.
        Ok(events.list.len())
    }

    /// Arms the `Level` registrations delivered since the last wait (Windows), so
    /// that their poll reports the readiness of this wait's start. One that was
    /// deleted, disarmed or made oneshot meanwhile is left as it is; an error (the
    /// socket closed without `delete`) leaves it disarmed, as on Unix.
    #[cfg(windows)]
    fn rearm_level(&self) {
        let tokens = std::mem::take(&mut *lock(&self.rearm));
        if tokens.is_empty() {
            return;
        }
        let table = self.read();
        for token in tokens {
            let Some(slot) = table.slot(token) else {
                continue;
            };
            let state = lock(&slot.state);
            if let (true, Some(interest)) = (state.level, state.interest) {
                let _ = self.inner.arm(slot.token, arming(slot, interest));
            }
        }
    }

    /// Appends the caller's events for pollshot's last delivery; how many.
    fn translate(&self, events: &mut Events) -> usize {
        let table = self.read();
        let Events { list, raw, .. } = events;
        let before = list.len();
        for ev in raw.iter() {
            // A packet of `PollerIocpExt::post`: no registration's.
            #[cfg(windows)]
            if ev.is_posted() {
                list.push(Event::new(ev.key(), ev.is_readable(), ev.is_writable()));
                continue;
            }
            // Deleted meanwhile (another thread's `delete` between pollshot's
            // delivery and this lookup): dropped.
            let Some(slot) = table.slot(ev.token()) else {
                continue;
            };
            let state = lock(&slot.state);
            let Some(interest) = state.interest else {
                // Disarmed by `modify(none)` after the delivery was taken.
                continue;
            };
            #[cfg(unix)]
            if state.level {
                // Level emulation: watch again at once; a readiness that still holds
                // is reported by the next wait. An error here (the descriptor was
                // closed without `delete`) leaves it disarmed, as polling's level
                // registration of a closed descriptor goes silent.
                let _ = self.inner.arm(slot.token, arming(slot, interest));
            }
            #[cfg(windows)]
            if state.level {
                // Level emulation on AFD: an IOCTL_AFD_POLL reports the readiness of
                // the moment it is issued, and its completion waits in the port, so
                // an arming made now would report data the caller reads before the
                // next wait. The next wait arms it instead (`rearm_level`).
                lock(&self.rearm).push(slot.token);
            }
            #[cfg(windows)]
            if slot.waitable {
                // Signaled: reported with the directions it was given, as polling
                // reports a waitable's interest.
                list.push(Event::new(
                    ev.key(),
                    interest.is_readable(),
                    interest.is_writable(),
                ));
                continue;
            }
            list.push(Event {
                key: ev.key(),
                readable: ev.is_readable(),
                writable: ev.is_writable(),
                extra: Extra::of(ev),
            });
        }
        list.len() - before
    }

    /// Wakes one thread blocked in [`wait`](Self::wait), or makes the next `wait`
    /// return at once. Notifies that no `wait` consumed yet coalesce into one
    /// wake-up. Cost: one write to the waker (eventfd(2), `EVFILT_USER`, a pipe);
    /// none while a notify is pending.
    ///
    /// # Errors
    /// The kernel's error from the write (not expected), or `ErrorKind::Other` in a
    /// forked child.
    pub fn notify(&self) -> io::Result<()> {
        self.inner.notify()
    }
}

/// The kernel instance (epoll or kqueue descriptor), readable while a readiness is
/// pending, for nesting this poller in another event loop (async-io's
/// `reactor_fd`). Only watch it for reading; never read, write or close it.
#[cfg(unix)]
impl AsFd for Poller {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

/// [`AsFd`]'s descriptor as a number.
#[cfg(unix)]
impl AsRawFd for Poller {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl fmt::Debug for Poller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Poller");
        d.field("backend", &self.inner.backend_name());
        #[cfg(unix)]
        d.field("fd", &self.inner.as_raw_fd());
        d.field("sources", &self.read().slots.len()).finish()
    }
}
