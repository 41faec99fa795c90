//! [`Poller`]: the facade that joins the table, the state machine and a backend.

use crate::backend::{Backend, Tag};
use crate::error;
use crate::fork;
use crate::interest::Interest;
use crate::raw::RawFd;
use crate::state::{Armed, Fallbacks, Kernel, KernelError, RegState};
use crate::stats::Count;
use crate::sync::atomic::AtomicBool;
use crate::sync::{Mutex, MutexGuard};
use crate::table::{Entry, Live, SlotGuard, Table};
use crate::token::{Token, MAX_SLOTS};
use crate::wake::Notifies;
use std::io;
#[cfg(unix)]
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::PoisonError;

// The Windows API (`register` of a socket): a child module, for the private fields.
#[cfg(windows)]
#[path = "windows.rs"]
mod windows;

// The event path (`deliver`, kernel events checked against the table, the
// synthetic queue): a child module, for the private fields.
#[path = "delivery.rs"]
mod delivery;

/// A readiness poller: descriptors stay registered in the kernel for their whole
/// life, and each wait costs one *arm*.
///
/// ```text
/// register(fd) -> token          once per descriptor: no system call yet
/// loop {
///     try the I/O; on EWOULDBLOCK:
///     arm(token, interest)       epoll: 1 EPOLL_CTL_MOD (the first is an ADD)
///     deliver(&mut events, ..)   one event per arming, to exactly one thread
/// }
/// deregister(token)              epoll: 1 EPOLL_CTL_DEL
/// ```
///
/// `B` is the kernel interface; the default, [`DefaultBackend`](crate::DefaultBackend),
/// is chosen for the target at compile time. Every backend compiled for the target
/// can be named (`Poller<pollshot::backends::Blocking>`), so one process can compare
/// them.
///
/// Register (and record the token in your own table) before the first
/// [`arm`](Self::arm): once armed, another thread's `deliver` may receive the event
/// before `arm` returns.
///
/// `Poller` is `Send + Sync`: share it with an `Arc`. Any thread may arm, disarm,
/// register and deregister while others are blocked in [`deliver`](Self::deliver);
/// several threads may deliver at once, and each event reaches exactly one of them.
///
/// # Examples
///
/// The same code on every OS (a socket is `AsFd` on Unix, `AsSocket` on
/// Windows):
///
/// ```
/// use pollshot::{Events, Interest, Poller};
/// use std::io::{Read, Write};
/// use std::net::{TcpListener, TcpStream};
/// use std::time::Duration;
///
/// let poller = Poller::new()?;
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let mut a = TcpStream::connect(listener.local_addr()?)?;
/// let (mut b, _) = listener.accept()?;
/// b.set_nonblocking(true)?;
/// let token = poller.register(&b)?; // borrows: `b` stays yours, and open
///
/// let mut buf = [0u8; 64];
/// assert!(b.read(&mut buf).is_err()); // EWOULDBLOCK: now arm
/// poller.arm(token, Interest::READABLE)?;
/// a.write_all(b"ping")?;
///
/// let mut events = Events::with_capacity(64);
/// poller.deliver(&mut events, Some(Duration::from_secs(5)))?;
/// let event = events.iter().next().unwrap();
/// assert_eq!(event.token(), token);
/// assert!(event.is_readable());
/// assert_eq!(b.read(&mut buf)?, 4);
///
/// poller.deregister(token)?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Poller<B: Backend = crate::DefaultBackend> {
    backend: B,
    table: Table,
    /// Synthetic events for always-ready registrations: (slot, generation).
    /// Whether it is non-empty is `notifies.synthetic_pending()`.
    synthetic: Mutex<Vec<(u32, u32)>>,
    /// While synthetic events are pending, which source fills a deliver's buffer
    /// first alternates: true means the kernel's turn (see `deliver`).
    kernel_turn: AtomicBool,
    /// Pending notifies, blocked waiters, queued synthetic events (`src/wake.rs`).
    notifies: Notifies,
    /// `fork::count()` when the kernel instance was made.
    forks: u64,
}

/// The state machine's view of one descriptor, translated by the backend.
struct FdKernel<'a, B> {
    backend: &'a B,
    fd: RawFd,
    slot: u32,
    incarnation: u32,
    /// A deregistration by `register` of the same number (not by `deregister`).
    superseded: bool,
}

impl<B> FdKernel<'_, B> {
    fn tag(&self, generation: u32) -> Tag {
        Tag {
            slot: self.slot,
            incarnation: self.incarnation,
            generation,
        }
    }
}

impl<B: Backend> Kernel for FdKernel<'_, B> {
    #[inline(always)]
    fn add(&mut self, interest: Interest, generation: u32) -> Result<(), KernelError> {
        // The registration's descriptor was closed and its number now names one
        // of the poller's own (made since: a child's `reinit_after_fork`, the
        // io_uring backend's private epoll instance): never watched, reported
        // as the closed descriptor it is.
        if self.backend.owns_fd(self.fd) {
            return Err(KernelError::BadFd);
        }
        self.backend.add(self.fd, self.tag(generation), interest)
    }
    #[inline(always)]
    fn modify(&mut self, interest: Interest, generation: u32) -> Result<(), KernelError> {
        self.backend.modify(self.fd, self.tag(generation), interest)
    }
    #[inline(always)]
    fn quiet(&mut self, generation: u32) -> Result<(), KernelError> {
        self.backend.quiet(self.fd, self.tag(generation))
    }
    fn delete(&mut self) -> Result<(), KernelError> {
        if self.superseded {
            self.backend.delete_superseded(self.fd, self.tag(0))
        } else {
            self.backend.delete(self.fd, self.tag(0))
        }
    }
}

/// The next incarnation handed out (the high half of a token). One counter for
/// the whole process, not one per poller: a token from another poller then names
/// no registration here (`NotFound`) instead of this poller's registration that
/// happens to have the same slot and count.
static INCARNATIONS: AtomicU32 = AtomicU32::new(0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The synthetic queue is a Vec of plain pairs: a panic elsewhere cannot leave
    // it half-written, so poisoning carries no information here.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Poller {
    /// A poller on the target's default backend ([`DefaultBackend`](crate::DefaultBackend)).
    ///
    /// # Errors
    /// The kernel's error from creating the instance or its waker (EMFILE, ENFILE,
    /// ENOMEM): epoll_create1(2), eventfd(2), kqueue(2), pipe(2).
    pub fn new() -> io::Result<Poller> {
        Poller::with_backend()
    }
}

impl<B: Backend> Poller<B> {
    /// A poller on backend `B`, e.g. `Poller::<pollshot::backends::Blocking>::with_backend()`.
    ///
    /// # Errors
    /// As [`Poller::new`]; the io_uring backend (`backends::Uring`, feature
    /// `io-uring`) answers `ErrorKind::Unsupported`, with the reason, where the
    /// kernel refuses io_uring (io_uring_setup(2): ENOSYS, EPERM) or is older than
    /// Linux 5.13.
    pub fn with_backend() -> io::Result<Poller<B>> {
        let forks = fork::install();
        Ok(Poller {
            backend: B::new()?,
            table: Table::new(),
            synthetic: Mutex::new(Vec::new()),
            kernel_turn: AtomicBool::new(false),
            notifies: Notifies::new(),
            forks,
        })
    }

    /// The backend (the loom model's kernel, `src/loom_tests/`).
    #[cfg(all(test, loom))]
    pub(crate) fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend's name, one of six: `"epoll"` ([`backends::Epoll`](crate::backends),
    /// Linux and Android), `"uring"` (`backends::Uring`, Linux, feature
    /// `io-uring`), `"kqueue"` (`backends::Kqueue`, the BSDs and Apple targets),
    /// `"ports"` (`backends::Ports`, event ports on illumos and Solaris),
    /// `"blocking"` (`backends::Blocking`, poll(2), every Unix) and `"afd"`
    /// (`backends::Afd`, Windows).
    pub fn backend_name(&self) -> &'static str {
        B::NAME
    }

    #[inline]
    fn check_fork(&self, op: &'static str) -> io::Result<()> {
        if fork::count() == self.forks {
            Ok(())
        } else {
            Err(error::forked(op))
        }
    }

    /// Adds `fd` to the table, not yet armed. No system call: the kernel learns of
    /// the descriptor at the first [`arm`](Self::arm).
    ///
    /// `fd` is borrowed for this call only: the descriptor stays the caller's, and
    /// should stay open until [`deregister`](Self::deregister). Passing an owned
    /// value does not compile, so a descriptor cannot be closed by the call that
    /// registers it (its number would then name whatever reuses it):
    ///
    /// ```compile_fail
    /// let poller = pollshot::Poller::new()?;
    /// let (a, _b) = std::os::unix::net::UnixStream::pair()?;
    /// poller.register(a)?; // error: expected a reference
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// If the descriptor is closed first, the poller copes (see [`arm`](Self::arm)
    /// and [`deregister`](Self::deregister)); if its number is then reused and
    /// registered again, the new registration *supersedes* the old one: the old
    /// token stops naming a registration and its queued events are dropped as stale.
    /// Registering a number that is still open and registered does the same, so
    /// one descriptor number has at most one registration.
    ///
    /// # Errors
    /// - `ErrorKind::InvalidInput`: `fd` is the poller's own kernel instance or
    ///   waker.
    /// - `ErrorKind::Other`: used in a forked child before
    ///   [`reinit_after_fork`](Self::reinit_after_fork).
    /// - `ErrorKind::InvalidInput`: on 32-bit targets, a descriptor number of 2^20
    ///   or more (the kqueue tag keeps 20 bits of it; see [`Token`]).
    #[cfg(unix)]
    pub fn register<F: AsFd + ?Sized>(&self, fd: &F) -> io::Result<Token> {
        self.insert(fd.as_fd().as_raw_fd(), 0)
    }

    /// [`register`](Self::register) with a *key*: a word of the caller's that
    /// every event of this registration carries
    /// ([`Event::key`](crate::Event::key)), e.g. a pointer to the runtime's
    /// per-connection state, or an index into its own table.
    /// `register` is `register_with(fd, 0)`. [`set_key`](Self::set_key) changes
    /// it.
    ///
    /// # The guarantee: a key is never stale
    ///
    /// An event carries the key its registration had when `deliver` accepted the
    /// event, and `deliver` accepts an event only for the registration's current
    /// arming, under the registration's lock. An event of an earlier registration
    /// of the same descriptor number, or one the kernel reported before a
    /// [`deregister`](Self::deregister), [`disarm`](Self::disarm) or re-arm took
    /// effect (even one a `deliver` already fetched from the kernel when that call
    /// ran), is dropped as stale, never delivered with any key. So:
    ///
    /// - after `deregister(token)` returns, no `deliver` that accepts events from
    ///   then on returns this registration's key, even if the number is registered
    ///   again at once by another thread, with another key;
    /// - a runtime may store a pointer as the key and dereference it when it
    ///   handles an event, as long as what it points to lives until `deregister`
    ///   returns *and* no event accepted before that is still being handled. A
    ///   delivery disarms the registration (oneshot), so until the registration is
    ///   armed again only the thread that holds its event can receive anything for
    ///   it: the thread that handles a connection's event and then deregisters it
    ///   (instead of re-arming) may free the connection's state right after
    ///   `deregister` returns. A thread that deregisters a registration that is
    ///   armed (a timer closing an idle connection) cannot know whether another
    ///   thread's `deliver` accepted an event just before: it hands the state over
    ///   (a reference count, or a message to the thread that will see the event)
    ///   rather than free it.
    ///
    /// mio's `Token` and polling's `key` are the user's too, but nothing drops an
    /// event fetched before a deregistration there, so such an event names whatever
    /// the user keeps under that number by the time it is handled.
    ///
    /// Memory: the key costs 8 bytes per registration on 64-bit targets (24 in
    /// all); cost per event: one load, on the line next to the registration's
    /// slot.
    ///
    /// ```
    /// use pollshot::{Events, Interest, Poller};
    /// use std::io::Write;
    /// use std::os::unix::net::UnixStream;
    /// use std::time::Duration;
    ///
    /// struct Conn {
    ///     name: &'static str,
    /// }
    /// let poller = Poller::new()?;
    /// let (mut a, b) = UnixStream::pair()?;
    /// let conn = Box::new(Conn { name: "b" });
    /// let token = poller.register_with(&b, &*conn as *const Conn as usize)?;
    /// poller.arm(token, Interest::READABLE)?;
    /// a.write_all(b"x")?;
    /// let mut events = Events::with_capacity(8);
    /// poller.deliver(&mut events, Some(Duration::from_secs(5)))?;
    /// let event = events.iter().next().unwrap();
    /// // SAFETY: `conn` lives until after `deregister` below, and this thread
    /// // handles the registration's only event.
    /// let conn = unsafe { &*(event.key() as *const Conn) };
    /// assert_eq!(conn.name, "b");
    /// poller.deregister(token)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`register`](Self::register).
    #[cfg(unix)]
    pub fn register_with<F: AsFd + ?Sized>(&self, fd: &F, key: usize) -> io::Result<Token> {
        self.insert(fd.as_fd().as_raw_fd(), key)
    }

    /// Changes the registration's key ([`register_with`](Self::register_with)):
    /// events accepted after this returns carry `key`; one accepted before (being
    /// handled by another thread now) carries the old one. No system call.
    ///
    /// # Errors
    /// - `ErrorKind::NotFound`: `token` names no live registration.
    /// - `ErrorKind::Other`: used in a forked child before
    ///   [`reinit_after_fork`](Self::reinit_after_fork).
    pub fn set_key(&self, token: Token, key: usize) -> io::Result<()> {
        self.check_fork("set_key")?;
        match self.table.lock(token.index()) {
            Some(mut slot) if matches!(&*slot, Some(e) if e.token == token) => {
                slot.set_key(key);
                Ok(())
            }
            _ => Err(error::unknown_token("set_key", token)),
        }
    }

    /// Exclusive wake-up for a listening socket shared by several pollers or
    /// processes (epoll `EPOLLEXCLUSIVE`): not offered, always an error, on every
    /// backend (on Windows too, where it takes `&impl AsSocket`, so that portable
    /// code needs no `cfg`).
    ///
    /// `EPOLLEXCLUSIVE` is only valid with `EPOLL_CTL_ADD`: the kernel refuses it in
    /// a MOD and refuses MOD on a registration that has it, so it cannot be combined
    /// with the arm-by-MOD model (epoll_ctl(2)). To spread accepts, share one poller
    /// among the accepting threads instead: each readiness event reaches exactly one
    /// thread that called [`deliver`](Self::deliver).
    ///
    /// # Errors
    /// Always `ErrorKind::Unsupported`, saying the above.
    #[cfg(unix)]
    pub fn register_exclusive<F: AsFd + ?Sized>(&self, fd: &F) -> io::Result<Token> {
        let _ = fd.as_fd();
        Err(error::exclusive_unsupported())
    }

    /// [`register`](Self::register) for a raw descriptor number.
    ///
    /// # Errors
    /// `ErrorKind::InvalidInput` for a negative `fd`; otherwise as `register`.
    ///
    /// # Safety
    /// A non-negative `fd` must be an open descriptor when this is called. The
    /// poller only ever passes the number to the kernel's registration and wait
    /// calls (never reads, writes or closes it), and copes with it being closed
    /// later, as `register` documents.
    #[cfg(unix)]
    pub unsafe fn register_raw(&self, fd: RawFd) -> io::Result<Token> {
        if fd < 0 {
            return Err(error::negative_fd(fd));
        }
        self.insert(fd, 0)
    }

    fn insert(&self, fd: RawFd, key: usize) -> io::Result<Token> {
        self.insert_as(fd, key, crate::raw::Kind::Io)
    }

    /// `insert` of a registration of `kind` (Windows: a socket or a waitable
    /// handle; always `Io` on Unix).
    fn insert_as(&self, fd: RawFd, key: usize, kind: crate::raw::Kind) -> io::Result<Token> {
        self.check_fork("register")?;
        if self.backend.owns_fd(fd) {
            return Err(error::own_fd(fd));
        }
        // The slot is the descriptor number's own.
        let index = crate::raw::slot_of(fd);
        let Some(mut slot) = self.table.lock_for_insert(index) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "pollshot register: descriptor number {fd} is past the {MAX_SLOTS} \
                     this target's tokens can name"
                ),
            ));
        };
        if slot.is_some() {
            // The number is registered already: its descriptor was closed without a
            // deregister and the number reused (P02, P04), or the caller registered
            // it twice. The old registration is superseded: delete whatever the
            // kernel holds under this number (ENOENT/EBADF: nothing), free the slot.
            // A refused EPOLL_CTL_DEL here (not ENOENT/EBADF) would leave an entry
            // whose events carry the old registration's generation: dropped as
            // stale, since the new one continues the slot's generations.
            let _superseded = self.free(&mut slot, true);
        }
        let incarnation = INCARNATIONS.fetch_add(1, Ordering::Relaxed);
        let token = Token::new(index as u32, incarnation);
        let start = slot.next_generation();
        self.backend.registered(index as u32, Some(kind));
        *slot = Some(Entry {
            fd,
            token,
            state: RegState::new(start),
        });
        slot.set_key(key);
        Ok(token)
    }

    /// Empties a locked slot, deleting its registration from the kernel if there.
    /// The slot's lock is held across the kernel's delete, so a racing arm then
    /// finds the slot empty (`NotFound`). `superseded`: a new registration of the
    /// same number replaces it.
    ///
    /// A delete the kernel refuses (not ENOENT or EBADF) leaves a deregistration's
    /// slot as it is, its registration disarmed and still in the kernel
    /// (`RegState::deregister`), for the caller to deregister again; a superseded
    /// registration's slot is emptied all the same (the number is the new one's).
    fn free(&self, slot: &mut SlotGuard<'_>, superseded: bool) -> io::Result<()> {
        let Some(entry) = slot.as_mut() else {
            return Ok(());
        };
        let index = entry.token.slot();
        let result = entry.state.deregister(&mut FdKernel {
            backend: &self.backend,
            fd: entry.fd,
            slot: index,
            incarnation: entry.token.incarnation(),
            superseded,
        });
        match result {
            Err(e) if !superseded => Err(error::kernel(e)),
            result => {
                slot.vacate();
                self.backend.registered(index, None);
                result.map(drop).map_err(error::kernel)
            }
        }
    }

    /// The state machine's kernel for `token`'s descriptor.
    #[inline(always)]
    fn kernel_for(&self, token: Token) -> FdKernel<'_, B> {
        FdKernel {
            backend: &self.backend,
            fd: crate::raw::fd_at(token.index()),
            slot: token.slot(),
            incarnation: token.incarnation(),
            superseded: false,
        }
    }

    #[inline(always)]
    fn count_fallbacks(&self, fb: Fallbacks) {
        if fb == Fallbacks::default() {
            // The common case: three additions of zero (locked instructions with
            // `stats`) would cost as much as the rest of an arm in user space.
            return;
        }
        let c = self.backend.counters();
        c.bump(Count::NotFoundToAdd, fb.not_found_to_add as u64);
        c.bump(Count::ExistsToModify, fb.exists_to_modify as u64);
        c.bump(Count::NotPollable, fb.not_pollable as u64);
    }

    /// Arms the registration: the next readiness for `interest` (or a hang-up or
    /// error) is delivered once, to one [`deliver`](Self::deliver) call, and disarms
    /// it again.
    ///
    /// # The contract: an arm replaces, a delivery disarms both directions
    ///
    /// - `interest` *replaces* what the registration was armed for; it is not added
    ///   to it. Arm `READABLE`, then `WRITABLE`, and only writable is watched: data
    ///   that arrives afterwards is not reported.
    /// - A delivery disarms the *whole* registration, whatever directions the event
    ///   reports. Armed for `BOTH` with a full send buffer, an event that reports
    ///   readable ends the arming: when the buffer drains later, nothing is
    ///   reported until writable is armed again.
    ///
    /// So a runtime that keeps a reader and a writer waiting on one registration
    /// arms the union of what they wait for, and after each delivery wakes the
    /// waiters whose direction the event reports and re-arms with what is still
    /// wanted. This is `EPOLLONESHOT`'s and `EV_DISPATCH`'s own rule (and the
    /// contract of `polling`'s `modify`); the poll(2) backend keeps it too.
    ///
    /// (On a Unix socketpair, whose send buffer is the peer's receive queue; the
    /// contract is the same on every backend.)
    ///
    /// ```
    /// # #[cfg(unix)]
    /// # fn main() -> std::io::Result<()> {
    /// use pollshot::{Events, Interest, Poller};
    /// use std::io::{ErrorKind, Read, Write};
    /// use std::os::unix::net::UnixStream;
    /// use std::time::Duration;
    ///
    /// /// What the waiters on one registration want together, if anything.
    /// fn union(reader: Option<Interest>, writer: Option<Interest>) -> Option<Interest> {
    ///     match (reader, writer) {
    ///         (Some(r), Some(w)) => Some(r | w),
    ///         (r, w) => r.or(w),
    ///     }
    /// }
    ///
    /// let poller = Poller::new()?;
    /// let (mut peer, mut sock) = UnixStream::pair()?;
    /// sock.set_nonblocking(true)?;
    /// peer.set_nonblocking(true)?;
    /// let token = poller.register(&sock)?;
    ///
    /// // The writer fills the send buffer until a write would block; the reader
    /// // finds nothing to read. Both wait on the one registration.
    /// let mut buf = [0u8; 4096];
    /// loop {
    ///     match sock.write(&buf) {
    ///         Ok(_) => {}
    ///         Err(e) if e.kind() == ErrorKind::WouldBlock => break,
    ///         Err(e) => return Err(e),
    ///     }
    /// }
    /// assert_eq!(sock.read(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
    /// let (mut reader, mut writer) = (Some(Interest::READABLE), Some(Interest::WRITABLE));
    /// poller.arm(token, union(reader, writer).unwrap())?; // BOTH
    ///
    /// let mut events = Events::with_capacity(8);
    /// let timeout = Some(Duration::from_secs(20)); // only turns a lost event into a failure
    /// peer.write_all(b"ping")?;
    /// assert_eq!(poller.deliver(&mut events, timeout)?, 1);
    /// let event = *events.iter().next().unwrap();
    /// assert!(event.is_readable() && !event.is_writable());
    /// // The delivery disarmed both directions: wake the reader, whose direction the
    /// // event reports ...
    /// if event.is_readable() {
    ///     assert_eq!(sock.read(&mut buf)?, 4);
    ///     reader = None;
    /// }
    /// if event.is_writable() {
    ///     writer = None;
    /// }
    /// // ... and re-arm what is still wanted: the writer's WRITABLE.
    /// assert_eq!(union(reader, writer), Some(Interest::WRITABLE));
    /// poller.arm(token, union(reader, writer).unwrap())?;
    ///
    /// // The peer drains the buffer: the re-arm is what makes the room reported.
    /// while peer.read(&mut buf).is_ok_and(|n| n > 0) {}
    /// assert_eq!(poller.deliver(&mut events, timeout)?, 1);
    /// let event = events.iter().next().unwrap();
    /// assert_eq!(event.token(), token);
    /// assert!(event.is_writable() && !event.is_readable());
    ///
    /// poller.deregister(token)?;
    /// # Ok(())
    /// # }
    /// # #[cfg(not(unix))]
    /// # fn main() {}
    /// ```
    ///
    /// # Cost
    ///
    /// Arming an armed registration for the same interest is free (no system
    /// call: an event already in flight satisfies it). Otherwise one kernel command:
    /// epoll `EPOLL_CTL_MOD` (the first arm is `EPOLL_CTL_ADD`); kqueue `EV_ENABLE`
    /// (first `EV_ADD`), which rides on the next `kevent` call when possible; the
    /// poll(2) backend changes its set in memory. If the kernel lost the descriptor
    /// (closed, number reused) MOD's ENOENT becomes ADD; if a dup of it is still
    /// registered, ADD's EEXIST becomes MOD. A descriptor the kernel cannot poll
    /// (regular files, `/dev/null`: epoll's EPERM) is reported always ready: each arm
    /// queues one synthetic event (and wakes a thread blocked in `deliver`).
    ///
    /// The table is trusted for "already armed": if the descriptor was closed while
    /// armed and its number reused, an arm with the same interest issues nothing
    /// and the new descriptor is not watched until a disarm or an arm with another
    /// interest. Likewise a registration found always ready stays so if its number
    /// is reused by a pollable descriptor. Deregister before closing (or register
    /// the new descriptor, which supersedes the old registration).
    ///
    /// # Errors
    /// - `ErrorKind::NotFound`: `token` names no live registration.
    /// - `ErrorKind::Unsupported`: `interest` has [`Interest::PRIORITY`] on a
    ///   backend that cannot ask for it (kqueue, Windows), or without
    ///   [`Interest::READABLE`] on io_uring (see [`Interest::PRIORITY`]); nothing
    ///   changed.
    /// - EBADF (`raw_os_error()`): the descriptor is closed; the registration is
    ///   unchanged. The poll(2) backend checks this at the first arm only (later
    ///   arms cost no system call): there a descriptor closed after its first arm is
    ///   dropped from the set when poll(2) answers `POLLNVAL`, never reported, and
    ///   its next re-arm fails with EBADF.
    /// - `ErrorKind::Other`: used in a forked child before
    ///   [`reinit_after_fork`](Self::reinit_after_fork).
    /// - the kernel's error otherwise (ENOMEM, ENOSPC: `max_user_watches`), with
    ///   its errno: epoll_ctl(2), kevent(2), port_associate(3C), or on Windows
    ///   the AFD poll's status as its Win32 code (WSAENOTSOCK, 10038, for a
    ///   closed socket). It names neither the call nor the token (the crate
    ///   docs' "Errors" say why and list each backend's calls).
    #[inline(always)]
    pub fn arm(&self, token: Token, interest: Interest) -> io::Result<()> {
        if interest.is_priority()
            && (!B::PRIORITY || !B::PRIORITY_WITHOUT_READABLE && !interest.is_readable())
        {
            return Err(error::priority_unsupported(B::NAME, B::PRIORITY));
        }
        self.check_fork("arm")?;
        let Some(mut live) = self.table.live(token) else {
            return Err(error::unknown_token("arm", token));
        };
        // The common re-arm of an idle registration, one kernel modify:
        // `RegState::arm`'s first step, taken here inline (the same three calls
        // `arm` makes), so that it builds nothing in memory. Every other arm (a
        // re-arm for another interest included) goes through `RegState::arm`.
        if let Some(next) = live.state.idle_rearm_generation() {
            let tag = Tag {
                slot: token.slot(),
                incarnation: token.incarnation(),
                generation: next,
            };
            return match self
                .backend
                .modify(crate::raw::fd_at(token.index()), tag, interest)
            {
                Ok(()) => {
                    live.state.rearmed(interest, next);
                    live.store();
                    Ok(())
                }
                Err(e) => self.arm_refused(live, token, interest, e),
            };
        }
        self.arm_other(live, token, interest)
    }

    /// [`arm`](Self::arm) whose re-arm the kernel refused with `e`
    /// (`RegState::modify_refused`: ENOENT becomes an add).
    #[cold]
    #[inline(never)]
    fn arm_refused(
        &self,
        live: Live<'_>,
        token: Token,
        interest: Interest,
        e: KernelError,
    ) -> io::Result<()> {
        let mut fb = Fallbacks::default();
        let mut state = live.state;
        let armed = state.modify_refused(e, interest, &mut self.kernel_for(token), &mut fb);
        self.arm_finish(live, state, token, armed, fb)
    }

    /// [`arm`](Self::arm) other than the common re-arm of an idle registration:
    /// armed (for `interest` or another), fresh (the first arm), or always ready
    /// (`RegState::arm`, whole).
    #[inline(never)]
    fn arm_other(&self, live: Live<'_>, token: Token, interest: Interest) -> io::Result<()> {
        let mut fb = Fallbacks::default();
        let mut state = live.state;
        let armed = state.arm(interest, &mut self.kernel_for(token), &mut fb);
        self.arm_finish(live, state, token, armed, fb)
    }

    /// Writes an arm's new `state` to its locked slot, counts its fallbacks,
    /// queues its synthetic event if it has one, and unlocks the slot.
    #[inline(always)]
    fn arm_finish(
        &self,
        mut live: Live<'_>,
        state: RegState,
        token: Token,
        armed: Result<Armed, KernelError>,
        fb: Fallbacks,
    ) -> io::Result<()> {
        live.state = state;
        live.store();
        self.count_fallbacks(fb);
        let wake = match armed {
            Ok(Armed::Synthetic) => self.queue_synthetic(token.slot(), live.state.generation()),
            Ok(_) => false,
            Err(e) => return Err(error::kernel(e)),
        };
        // Unlocks the slot.
        drop(live);
        if wake {
            // A waiter blocked in the kernel would not see the synthetic event:
            // wake it (after the slot's lock is released).
            self.backend.wake()?;
        }
        Ok(())
    }

    /// Queues a synthetic event for `slot`; returns whether to wake the kernel (a
    /// thread counted as waiting may be blocked there: `src/wake.rs`). Out of
    /// line: it keeps the common arm (a kernel command) small enough to inline.
    #[inline(never)]
    fn queue_synthetic(&self, slot: u32, generation: u32) -> bool {
        self.backend.counters().one(Count::Synthetic);
        let mut queue = lock(&self.synthetic);
        // At most one entry per slot: an earlier one is for an arming this arm
        // replaced (stale). Kept, re-arms without a deliver would grow the queue
        // without bound and push the current entry past a deliver's capacity.
        match queue.iter_mut().find(|(s, _)| *s == slot) {
            Some(entry) => entry.1 = generation,
            None => queue.push((slot, generation)),
        }
        self.notifies.synthetic_queued()
    }

    /// Disarms the registration without removing it from the kernel: nothing is
    /// delivered for it until the next [`arm`](Self::arm), and an event already in
    /// flight for the old arming is dropped as stale.
    ///
    /// Cost: nothing if not armed; otherwise epoll `EPOLL_CTL_MOD` with
    /// `EPOLLONESHOT` and no readiness bits (the kernel still adds `EPOLLERR |
    /// EPOLLHUP`, which with oneshot can fire at most once, and is then dropped as
    /// stale); kqueue `EV_DISABLE | EV_DISPATCH`; the poll(2) backend changes its set;
    /// Windows cancels a socket's AFD poll, and leaves a waitable handle's
    /// thread-pool wait in place, disarmed (no call: a signal it takes is kept
    /// for the next arm, see `register_waitable`).
    ///
    /// # Errors
    /// - `ErrorKind::NotFound`: `token` names no live registration.
    /// - EBADF (`raw_os_error()`): the descriptor is closed. The registration is
    ///   disarmed in the table all the same (nothing more is delivered for it).
    /// - `ErrorKind::Other`: used in a forked child before re-initialisation.
    #[inline(always)]
    pub fn disarm(&self, token: Token) -> io::Result<()> {
        self.check_fork("disarm")?;
        let Some(mut live) = self.table.live(token) else {
            return Err(error::unknown_token("disarm", token));
        };
        let disarmed = live.state.disarm(&mut self.kernel_for(token));
        live.store();
        disarmed.map(drop).map_err(error::kernel)
    }

    /// Removes the registration from the table and the kernel. The token then names
    /// nothing, and events for it still in flight are dropped as stale.
    ///
    /// Call it before closing the descriptor. If the descriptor was closed first,
    /// the kernel's ENOENT or EBADF mean it is already gone: not an error; so does
    /// epoll's EPERM when its number now names a regular file or `/dev/null`
    /// (the kernel refuses to poll the number before it looks for the entry).
    ///
    /// # Errors
    /// - `ErrorKind::NotFound`: `token` names no live registration (deregistered
    ///   twice, or superseded by a later registration of the same number).
    /// - `ErrorKind::Other`: used in a forked child before re-initialisation.
    /// - the kernel's refusal, with its errno: `EPOLL_CTL_DEL`'s or `EV_DELETE`'s
    ///   other than ENOENT, EBADF and EPERM (ENOMEM), io_uring's `io_uring_enter`
    ///   (EAGAIN).
    ///   Nothing is released then: the registration stays, disarmed (nothing is
    ///   delivered for it until an arm), and `token` still names it. Call
    ///   `deregister` again (or arm it again) once the kernel has recovered.
    pub fn deregister(&self, token: Token) -> io::Result<()> {
        self.check_fork("deregister")?;
        match self.table.lock(token.index()) {
            Some(mut slot) if matches!(&*slot, Some(e) if e.token == token) => {
                self.free(&mut slot, false)
            }
            _ => Err(error::unknown_token("deregister", token)),
        }
    }

    /// Ends one [`deliver`](Self::deliver) call: one that is blocked now (it returns
    /// with whatever events it has, possibly none, and
    /// [`Events::is_notified`](crate::Events::is_notified) true), or, if none is
    /// blocked, the next one, which then returns at once.
    ///
    /// - One notify ends exactly one deliver, even with several threads blocked.
    /// - `k` notifies with `k` or more threads blocked end `k` distinct delivers.
    /// - Notifies coalesce only beyond the number of blocked delivers: while as
    ///   many are pending as there are threads blocked (at least one), another
    ///   notify changes nothing.
    /// - A `deliver` with a zero timeout (a poll, which never blocks) takes a
    ///   notify only while no thread is inside a `deliver` that may block: one
    ///   that is (a worker parked with `None` or a timeout) gets it, even while
    ///   other threads poll in a loop. A poll that takes the waker's wake-up
    ///   first leaves the notify and wakes the kernel again: one more waker
    ///   write per such poll until the blocked thread has run. A thread polling
    ///   in a tight loop beside one blocked `deliver` made a mean of 179 writes
    ///   per notify on epoll (at most 1,870), 23 on io_uring and 4 on poll(2),
    ///   on a loaded 2-core machine; a poller that is polled in a loop while
    ///   others block pays that.
    ///
    /// So notifies do not stop `k` workers: a worker that has not entered
    /// `deliver` yet is not counted, and `k` notifies made before the workers
    /// block coalesce into fewer (one, with none blocked), so the last workers
    /// sleep to their timeout, or for ever with `None`. Stop workers with
    /// [`shutdown`](Self::shutdown), which ends every deliver, blocked or later.
    ///
    /// Cost: one write to the waker (eventfd(2), `EVFILT_USER` trigger, a pipe), and
    /// none for a notify that coalesces; a waiter that takes a notify while more are
    /// pending writes once more for the next waiter.
    ///
    /// # Errors
    /// `ErrorKind::Other` in a forked child before re-initialisation; the kernel's
    /// error from the write otherwise (not expected), with its errno; that notify
    /// is then not pending.
    pub fn notify(&self) -> io::Result<()> {
        self.check_fork("notify")?;
        self.notifies.notify(|| self.backend.wake())
    }

    /// Shuts the poller down for every [`deliver`](Self::deliver): each one blocked
    /// now returns at once, with the events it already took (possibly none), and
    /// each later one returns `Ok(0)` at once, without waiting; both say so with
    /// [`Events::is_shutdown`](crate::Events::is_shutdown). Sticky: there is no
    /// way back (make a new poller).
    /// Everything else keeps working (arm, deregister, a `deliver` that finds
    /// events in the kernel before it sees the shutdown returns them), so the
    /// workers can tidy up their registrations after they left their loops.
    ///
    /// This is how a runtime stops `k` workers, blocked or about to block: each
    /// worker loops until its `deliver` says [`Events::is_shutdown`](crate::Events::is_shutdown)
    /// (no stop flag of its own is needed), and the runtime calls `shutdown` once
    /// and joins them. A worker about to block still returns: `deliver` counts itself as
    /// a waiter and reads the shutdown bit in one read-modify-write of the word
    /// `shutdown` sets, so either the worker sees the bit, or `shutdown` sees the
    /// worker and wakes the kernel; each `deliver` that returns shut down wakes the
    /// kernel again while another waiter is counted, so the one wake-up reaches
    /// them all (`src/wake.rs`, model-checked with loom).
    ///
    /// ```
    /// use std::io::ErrorKind;
    /// use std::sync::Arc;
    /// let poller = Arc::new(pollshot::Poller::new()?);
    /// let workers: Vec<_> = (0..4)
    ///     .map(|_| {
    ///         let poller = Arc::clone(&poller);
    ///         std::thread::spawn(move || -> std::io::Result<()> {
    ///             let mut events = pollshot::Events::with_capacity(64);
    ///             loop {
    ///                 match poller.deliver(&mut events, None) {
    ///                     Ok(_) => { /* handle the events */ }
    ///                     // A signal: wait again.
    ///                     Err(e) if e.kind() == ErrorKind::Interrupted => continue,
    ///                     Err(e) => return Err(e),
    ///                 }
    ///                 if events.is_shutdown() {
    ///                     return Ok(());
    ///                 }
    ///             }
    ///         })
    ///     })
    ///     .collect();
    /// poller.shutdown()?;
    /// for w in workers {
    ///     w.join().unwrap()?;
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// Cost: one atomic read-modify-write and at most one write to the waker
    /// (none if no `deliver` is running); then one waker write per `deliver` that
    /// returns shut down while another is counted.
    ///
    /// # Errors
    /// `ErrorKind::Other` in a forked child before re-initialisation (which clears
    /// the shutdown: the child's poller starts anew); the kernel's error from the
    /// waker's write otherwise (not expected), with its errno. The poller is shut
    /// down all the same: every later `deliver` returns at once. A `deliver`
    /// blocked now may not have been woken: call `shutdown` again, which wakes
    /// the kernel again after such a failure.
    pub fn shutdown(&self) -> io::Result<()> {
        self.check_fork("shutdown")?;
        self.notifies.shutdown(|| self.backend.wake())
    }

    #[cfg_attr(
        not(windows),
        doc = r#"Makes a poller inherited across `fork(2)` usable in the child: a new kernel
instance and waker owned by the child, and every registration that was armed
is added to it, armed as it was (idle ones are added at their next arm). The
parent's registrations are never touched: on epoll the inherited instance is
shared with the parent, so the child's copy is only closed; a kqueue is not
inherited, so its old number is left alone.

Until this is called, every method in the child fails with
`ErrorKind::Other`. Does nothing in the process that made the poller.
Fork detection relies on `pthread_atfork(3)`: a child made by a raw `clone`
system call is not detected.

A registration whose descriptor is closed in the child (EBADF) cannot be
re-added: it is left unarmed, and its next [`arm`](Self::arm) reports the
closed descriptor as usual. It does not fail the re-initialisation.

# Errors
The kernel's error creating the new instance or waker, or re-adding a
registration for a reason other than EBADF (ENOMEM, ENOSPC). The poller then
stays unusable in the child; calling this again starts over."#
    )]
    #[cfg_attr(
        windows,
        doc = r#"Does nothing and returns `Ok(())` on Windows, which has no `fork`: a
process is made with `CreateProcess`, and a child never inherits this poller
(its completion port and AFD handle are not inheritable). It exists so that
code written for Unix and Windows needs no `cfg` around it.

# Errors
None on Windows."#
    )]
    pub fn reinit_after_fork(&mut self) -> io::Result<()> {
        let now = fork::count();
        if now == self.forks {
            return Ok(());
        }
        self.backend.reinit_after_fork()?;
        let mut synthetic = Vec::new();
        let backend = &self.backend;
        self.table.try_for_each_after_fork(|entry| {
            let state = &mut entry.state;
            state.forget_kernel();
            let mut fb = Fallbacks::default();
            let armed = state.rearm_fresh(
                &mut FdKernel {
                    backend,
                    fd: entry.fd,
                    slot: entry.token.slot(),
                    incarnation: entry.token.incarnation(),
                    superseded: false,
                },
                &mut fb,
            );
            match armed {
                Ok(Armed::Synthetic) => synthetic.push((entry.token.slot(), state.generation())),
                // Closed in the child: left unarmed (fresh), reported at its next arm.
                Ok(_) | Err(KernelError::BadFd) => {}
                Err(e) => return Err(error::kernel(e)),
            }
            Ok(())
        })?;
        // A thread may have been queueing when the parent forked.
        fork::replace_inherited(&mut self.synthetic, Mutex::new(Vec::new()));
        let queue = self
            .synthetic
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        queue.extend(synthetic);
        self.notifies.reset();
        if !queue.is_empty() {
            self.notifies.synthetic_queued();
        }
        self.forks = now;
        Ok(())
    }

    /// The number of live registrations.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no descriptor is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A snapshot of the system call counters (cargo feature `stats`).
    #[cfg(feature = "stats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "stats")))]
    pub fn stats(&self) -> crate::stats::Stats {
        self.backend.counters().snapshot()
    }

    /// How many threads are inside [`deliver`](Self::deliver) with a timeout other
    /// than zero right now (cargo feature `stats`): the waiters that
    /// [`notify`](Self::notify) counts. A snapshot, for tests and diagnostics: a
    /// thread is counted from just before it looks for events until its `deliver`
    /// returns, blocked in the kernel or about to be.
    #[cfg(feature = "stats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "stats")))]
    pub fn waiters(&self) -> usize {
        self.notifies.waiters()
    }
}

impl<B: Backend> Drop for Poller<B> {
    fn drop(&mut self) {
        if fork::count() != self.forks {
            self.backend.abandon_after_fork();
        }
    }
}

/// The backend's kernel instance (the epoll or kqueue descriptor; the poll(2)
/// backend's waker; the io_uring ring), for nesting this poller in another event
/// loop: on epoll and kqueue it is readable while a kernel event is pending
/// (epoll(7), kqueue(2)), after which `deliver` with a zero timeout collects it.
/// Only read readiness may be asked of it; never read, write or close it.
///
/// Only epoll and kqueue wake an outer loop for a registration's readiness. The
/// poll(2) backend's descriptor is its waker pipe: readable for a notify (or an
/// arm made while a thread polls), never because a registration became ready. The
/// ring is readable once a completion is posted, but an arm only queues its poll
/// request, which the next `deliver` submits: an outer epoll waiting after an arm
/// sees nothing (measured: a socketpair armed readable, written, an outer
/// `epoll_wait` of 500 ms returned 0 on both, and 1 on epoll).
#[cfg(unix)]
impl<B: Backend + AsFd> AsFd for Poller<B> {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.backend.as_fd()
    }
}

/// [`AsFd`]'s descriptor as a number.
#[cfg(unix)]
impl<B: Backend + AsFd> AsRawFd for Poller<B> {
    fn as_raw_fd(&self) -> RawFd {
        self.backend.as_fd().as_raw_fd()
    }
}

impl<B: Backend> std::fmt::Debug for Poller<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poller")
            .field("backend", &B::NAME)
            .field("registrations", &self.len())
            .finish()
    }
}

#[cfg(all(test, not(loom), any(target_os = "linux", target_os = "android")))]
#[path = "poller_key_tests.rs"]
mod key_tests;

#[cfg(all(test, not(loom), any(target_os = "linux", target_os = "android")))]
#[path = "refusal_tests.rs"]
mod refusal_tests;
