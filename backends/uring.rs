//! The io_uring backend (Linux, cargo feature `io-uring`): the arm rides on the wait.
//!
//! The documentation is on [`Uring`], where rustdoc shows it.

use crate::backend::{Backend, Driver, RawEvent, Tag};
use crate::deadline::Countdown;
use crate::event::Readiness;
use crate::interest::Interest;
use crate::state::KernelError;
use crate::stats::{Count, Counters};
use crate::token::{pack64, unpack64};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use rustix::event::epoll::{self, EventData, EventFlags};
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use rustix::io::Errno;
use std::cell::RefCell;
use std::io;
use std::mem::ManuallyDrop;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

/// `user_data` of the eventfd's multishot poll: a slot no table can reach.
const WAKER: u64 = pack64(u32::MAX, 0);
/// `user_data` of every `POLL_REMOVE`: its answer needs no routing.
const REMOVE: u64 = pack64(u32::MAX, 1);
/// A slot with no pending request.
const NONE: u64 = u64::MAX;
/// The slot of the poll requests on the private epoll instance's descriptor; their
/// stamp (2 and up) tells the current one from older ones.
const EPOLL_SLOT: u32 = u32::MAX;
/// What a completion must carry for a write-only arming to be delivered: the rest
/// (`POLLRDHUP`, which the kernel adds to every poll request) is not about writing.
const WRITE_BITS: u32 = (libc::POLLOUT | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) as u32;
/// Events taken from the private epoll instance per completion of its poll.
const EPOLL_BATCH: usize = 32;

/// Submission queue entries; the completion queue has twice as many.
const ENTRIES: u32 = 256;

/// The longest single futex wait of a follower (the loop around it goes on).
const HOUR: Duration = Duration::from_secs(3600);

/// The pending poll request of one slot.
#[derive(Clone, Copy, Debug)]
struct Pending {
    /// Its `user_data`, or [`NONE`].
    user_data: u64,
    fd: RawFd,
    /// The `poll32_events` it was submitted with.
    events: u32,
    /// Older requests with the same `user_data` still in the kernel (queued again
    /// when a submitting thread exited): each ends with one completion that is not
    /// this request's.
    older: u32,
    /// The last request answered -EBADF: the number was closed before it was
    /// submitted. As epoll drops a closed descriptor, nothing was reported, and the
    /// next command answers as epoll's would: a re-arm `NotFound` (then the add
    /// checks the number), a quiet or delete `BadFd` while the number is closed and
    /// `NotFound` once it is open again.
    lost: bool,
    /// The current arming (`user_data`) is watched by the private epoll instance,
    /// not by a poll request (see "Half-closed sockets" in the module docs).
    via_epoll: bool,
    /// The descriptor may have an entry in the private epoll instance (armed when
    /// `via_epoll`, else disabled by its oneshot report): a hint for ADD or MOD,
    /// and what a disarm or deregister deletes.
    in_epoll: bool,
    /// This registration's socket reported read-closed to a write-only arming: its
    /// write-only armings go to the private epoll instance directly. Cleared by the
    /// registration's first arm (an add).
    half_closed: bool,
}

const IDLE: Pending = Pending {
    user_data: NONE,
    fd: -1,
    events: 0,
    older: 0,
    lost: false,
    via_epoll: false,
    in_epoll: false,
    half_closed: false,
};

impl Pending {
    /// No request pending, with what the slot knows of the private epoll kept.
    #[inline]
    fn idle(self) -> Pending {
        Pending {
            fd: self.fd,
            in_epoll: self.in_epoll,
            half_closed: self.half_closed,
            ..IDLE
        }
    }
}

/// What the mutex guards besides the queues.
#[derive(Debug)]
struct Shared {
    /// Per slot: the request a completion must carry to be the current one.
    pending: Vec<Pending>,
    /// A thread is blocked (or about to block) in `io_uring_enter` waiting.
    leader: bool,
    /// The leader has been sent an eventfd write it has not yet returned for.
    kicked: bool,
    /// Threads waiting for a hand-over (on the `handoff` futex).
    followers: usize,
    /// Completions taken from the queue so far (with the queue's length: how many
    /// the kernel has posted, to tell a signal from a completion).
    reaped: u64,
    /// A wake-up no wait has taken yet (the binary waker: later ones merge).
    woken: bool,
    /// Slots whose current arming the private epoll instance watches.
    epoll_armed: usize,
    /// The stamp of the pending poll request on the private epoll instance's own
    /// descriptor (`user_data` = [`EPOLL_SLOT`] | stamp << 32), or 0: none.
    epoll_poll: u32,
    /// The last stamp handed out (from 2 on: 0 and 1 are the waker's and the
    /// removes').
    epoll_seq: u32,
}

impl Shared {
    fn new() -> Shared {
        Shared {
            pending: Vec::new(),
            leader: false,
            kicked: false,
            followers: 0,
            reaped: 0,
            woken: false,
            epoll_armed: 0,
            epoll_poll: 0,
            epoll_seq: 1,
        }
    }

    #[inline]
    fn slot(&mut self, slot: u32) -> &mut Pending {
        let i = slot as usize;
        if i >= self.pending.len() {
            self.pending.resize(i + 1, IDLE);
        }
        &mut self.pending[i]
    }
}

/// The io_uring backend (Linux, cargo feature `io-uring`): the arm rides on the wait.
///
/// Every io_uring operation the crate makes is in one file,
/// [`backends/uring.rs`](https://docs.rs/crate/pollshot/latest/source/backends/uring.rs) (io_uring_setup(2),
/// io_uring_enter(2), `IORING_OP_POLL_ADD`, `IORING_OP_POLL_REMOVE`), through the
/// `io-uring` crate, and so are the epoll_ctl(2) and epoll_wait(2) of its private
/// epoll instance ("Half-closed sockets" below).
///
/// # Commands
///
/// - arm (add or re-arm): a oneshot `IORING_OP_POLL_ADD` for the interest (`POLLIN |
///   POLLRDHUP` to read, `POLLOUT` to write; the kernel adds `POLLERR | POLLHUP`),
///   `user_data` = slot | generation << 32, pushed to the submission queue. It costs
///   no system call: the next wait's `io_uring_enter` submits it. When another thread
///   is blocked in `io_uring_enter` (it would not see the arm until it returns), the
///   arming thread submits at once instead (one `io_uring_enter` without waiting,
///   counted in `Stats::ctl_calls`). A re-arm whose previous request is still
///   pending queues an `IORING_OP_POLL_REMOVE` for it first. The one exception, a
///   write-only arming of a half-closed socket, is an `epoll_ctl` (below).
/// - disarm and deregister: an `IORING_OP_POLL_REMOVE` of the pending request, if
///   one is pending (none after a delivery), queued the same way. A request that
///   completes before its remove is processed is stale by generation and dropped by
///   the poller; the remove then answers ENOENT, which is fine and ignored.
/// - a completion is the delivery: the oneshot request is gone, nothing to disarm.
///
/// # No persistent registration
///
/// Unlike an epoll or kqueue registration, a poll request exists only between an
/// arm and its completion (or removal). So the state table's rows about the
/// kernel's set have nothing to answer here: an add never answers EEXIST (a dup of
/// a registered description does not collide with anything), a re-arm never
/// answers ENOENT (it is a new request), and a delete of an idle registration
/// issues nothing. The state machine's commands are still counted as such
/// (`adds`, `modifies`, `quiets`, `deletes`), so the counts match the other
/// backends'. One consequence: the descriptor *number* is resolved when the request
/// is submitted, at the next wait, not when `arm` returns. A number closed in
/// between completes with `-EBADF`, which is not reported (as epoll drops a closed
/// descriptor): the next re-arm answers `NotFound`, so the state machine's add
/// checks the number and fails with EBADF, and a disarm or delete answers EBADF; a
/// number closed and reused in between watches the new descriptor. The first arm checks the number is open (one `fcntl(F_GETFD)`,
/// so a closed descriptor is refused with EBADF as on epoll); later arms cost
/// nothing. Another: a pending request holds a reference to the open file, so a
/// socket closed while armed without a deregister is not released (its peer sees no
/// EOF) until the request completes or is removed: deregister before closing.
///
/// # Completions the backend handles itself
///
/// - `-ECANCELED` for the current request: the thread whose `io_uring_enter`
///   submitted it exited (the kernel cancels such a request when it would
///   complete). The same request is queued again, so the arming is not lost.
///   `-ECANCELED` for a removed request is the remove's answer: dropped.
/// - `-EBADF` (the number was closed before submission): dropped, remembered for
///   the next command (above). Any other negative result for the current request:
///   one error event.
/// - A full completion queue: the kernel keeps what does not fit
///   (`IORING_FEAT_NODROP`) and sets `IORING_SQ_CQ_OVERFLOW`; a wait that sees the
///   flag enters with `IORING_ENTER_GETEVENTS` to flush it, and takes what it has
///   room for, leaving the rest in the queue for the next wait.
///
/// A completion is posted when the descriptor becomes ready and is not looked at
/// again when a wait takes it (epoll re-polls an entry as it reports it): readiness
/// that came and went in between (data written, then read by another path) is still
/// delivered once. The reader's next try answers `WouldBlock`, and it re-arms.
///
/// # Half-closed sockets: the private epoll instance
///
/// The kernel adds `POLLRDHUP` to every poll request, with `POLLERR | POLLHUP`
/// (`IO_POLL_UNMASK` in io_uring/poll.c), and no flag takes it out. So a
/// write-only arming of a socket whose peer shut down its write side completes at
/// once with read-closed alone, which says nothing about writing: epoll, asked for
/// `EPOLLOUT`, reports nothing until the socket is writable. Such a completion is
/// not delivered. The rest of that arming is watched by a private epoll instance
/// (made at its first use): `EPOLLOUT | EPOLLONESHOT` with `data` = the arming's
/// `user_data`, an `EPOLL_CTL_ADD` (or MOD where the descriptor has an entry from
/// an earlier arming), one `epoll_ctl` counted in `Stats::ctl_calls`. The ring
/// polls the instance's own descriptor with a oneshot `POLL_ADD` of its own; when
/// that completes, the wait takes the instance's events (`epoll_wait`, timeout 0,
/// counted in `Stats::waits`) as kernel events, checked against the slot's current
/// arming like any other (an old one is dropped as stale), and polls it again
/// while armings are left there. The registration is then known half-closed (a
/// half-close is for good): its later write-only armings go to the instance
/// directly (one MOD each) instead of a request that would complete at once (where
/// epoll refuses the number, closed without a deregister or reused by a file it
/// cannot poll, such an arming is a poll request like any other). An
/// arming with a readable interest is a poll request again (the read-closed is
/// news for it), after deleting an entry still armed. A disarm or deregister
/// deletes the entry (`EPOLL_CTL_DEL`; ENOENT, EBADF and EPERM mean it is gone),
/// so nothing of the registration outlives it there; an epoll entry holds no
/// reference to the file either. A thread that exits queues the instance's poll
/// again like the others. Every other arming keeps the arm of no system call.
///
/// Regular files and `/dev/null` have no poll method: the kernel reports them
/// readable and writable at once, so each arm completes at its submission (always
/// ready, with no synthetic queue).
///
/// # Several waiters on one ring
///
/// The submission and completion queues are each used under one mutex, held only
/// for pushes and reaps, never across `io_uring_enter`. One waiter at a time, the
/// *leader*, blocks in `io_uring_enter` (submitting what is queued and waiting for
/// one completion); the others wait on a futex word (futex(2)) for a hand-over. A
/// waiter first takes what the completion queue already holds (no system call); the
/// leader, when it returns, leaves the completions it has no room for in the queue
/// and wakes one follower, which takes them or becomes the next leader. Each completion is taken
/// from the queue by one thread under the mutex, so it reaches exactly one waiter.
/// The price at T=2: an arm made while the other thread leads costs one
/// `io_uring_enter`, and a wake-up of a follower is a futex wake.
///
/// That price is large, and it is the kernel's: a poll request completes through
/// task work run by the thread that submitted it. When that thread is a follower
/// asleep on the futex, or busy in its caller, the kernel must wake
/// or interrupt it to post the completion. Only then is the leader woken, and it
/// hands leadership over with one more wake-up. That is about two context switches
/// per round trip; epoll's waiters make 0.26. Measured at P=1 T=2 on two cores
/// (`cargo bench --features io-uring --bench pingpong`), this is about 0.1x
/// epoll's rate, 0.5x at P=8 and 0.8x at P=64. Making every waiter block in
/// `io_uring_enter` (no leader) was tried and was no better at T=2. At T=4 it was
/// worse, 0.5x this design at P=8, because the kernel wakes every thread blocked
/// on a ring for each completion. A poller per thread (`pollshot-uring-sharded`)
/// has none of this: 1.02-1.16x sharded epoll at T=2 in three runs.
///
/// Signals: `deliver` says `Interrupted` (EINTR) for a signal that ends a wait,
/// in the leader as in a follower. A follower's futex wait ends with EINTR, which a
/// condition variable's would have hidden. The leader's enter gives back EINTR
/// only if it submitted nothing. An enter that submitted answers with its count,
/// so the leader counts the completions posted across the enter. None posted, no
/// wake-up taken and time left is reported as `Interrupted`. That case is also
/// reached without a signal: the kernel's task-work notification (TWA_SIGNAL)
/// ends such a wait too, for example when a poll request's wake-up finds no
/// matching readiness and posts nothing. An enter that submitted nothing is
/// restarted by the kernel then, unseen. An enter that submitted cannot be told
/// apart from a real signal. The pingpong bench saw it 30 times in 1.2 million
/// round trips at T=2: a rare spurious `Interrupted`, which callers retry. The
/// other choice, waiting on, would have lost real signals.
///
/// # The waker
///
/// The binary waker the poller counts notifies on (`src/wake.rs`): a flag the next
/// wait to look takes. With no waiter blocked it costs no system call; with a
/// follower waiting, a futex wake; with only the leader blocked in the
/// kernel, one eventfd write, which completes the eventfd's multishot
/// `IORING_OP_POLL_ADD` (one completion per write, never read back). A wait that was
/// not woken makes no system call for the waker. (An `IORING_OP_MSG_RING` to the
/// ring itself would also need one `io_uring_enter` per wake-up of a blocked
/// leader; the eventfd was kept as the simpler of two equal costs, not measured.)
///
/// # Fork and refusal
///
/// The ring's memory is not inherited by a child (`MADV_DONTFORK`), and
/// `reinit_after_fork` makes a new ring and eventfd; the parent's ring is never
/// touched by the child. Where io_uring_setup(2) is refused (ENOSYS: not built in;
/// EPERM: `kernel.io_uring_disabled`, a seccomp filter or a container policy) or
/// the kernel lacks what this backend needs (Linux 5.13: `IORING_FEAT_NODROP`,
/// `IORING_FEAT_EXT_ARG`, multishot poll), `new` answers `ErrorKind::Unsupported`
/// with the reason.
///
/// # Dropping a ring
///
/// After a ring is closed, the kernel frees its memory (about 11 KiB of slab)
/// from a worker, or at once when every thread that submitted to it has exited.
/// On the 2-core test machine, with kernel 6.18, that worker freed about 1,400
/// rings a second. A thread that made and dropped more pollers than that, every
/// second, ran the kernel out of memory: the `uring_real` fuzz target did, at
/// 2,900 inputs a second. Keep a `Poller<Uring>` for as long as its thread runs,
/// as a runtime does.
pub struct Uring {
    ring: Arc<Ring>,
    /// Shared with the ring (and kept across `reinit_after_fork`).
    counters: Arc<Counters>,
}

/// The ring and what its users share; threads that submitted to it hold a `Weak`
/// to it (see [`Submitters`]).
struct Ring {
    /// Dropped normally, except in a forked child (see `abandoned`).
    ring: ManuallyDrop<IoUring>,
    /// Set in a forked child: the ring's memory is not mapped there, and its
    /// addresses may since hold other mappings (a new ring's), so dropping the ring
    /// only closes the child's copy of its descriptor.
    abandoned: AtomicBool,
    shared: Mutex<Shared>,
    /// Followers wait on this word (futex(2)) for the leader's hand-over or a
    /// wake-up: bumped, under the mutex, by each. A futex wait, unlike a condition
    /// variable's, ends with EINTR on a signal, so a follower says `Interrupted` as
    /// a thread blocked in the kernel does.
    handoff: AtomicU32,
    /// The fork count (`crate::fork`) when the ring was made: a thread exiting in
    /// a forked child must not touch the parent's ring (see [`Submitters`]).
    forks: u64,
    waker: OwnedFd,
    /// The private epoll instance for write-only armings of half-closed sockets,
    /// made at its first use.
    epoll: OnceLock<OwnedFd>,
    /// `IOSQE_CQE_SKIP_SUCCESS` is known (5.17): a successful remove posts nothing.
    skip_success: bool,
    counters: Arc<Counters>,
    /// This ring, for the submitters' lists.
    me: Weak<Ring>,
}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uring")
            .field("ring", &self.ring.ring.as_raw_fd())
            .field("waker", &self.ring.waker)
            .finish()
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if self.abandoned.load(Ordering::Relaxed) {
            let fd = self.ring.as_raw_fd();
            // SAFETY: the child's copy of the ring's descriptor is owned by this
            // `IoUring`, which is never used or dropped after this (its mappings are
            // not the child's to unmap); closing the copy leaves the parent's ring
            // alone.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        } else {
            // SAFETY: the ring is dropped once, here, and not used afterwards.
            unsafe { ManuallyDrop::drop(&mut self.ring) };
        }
    }
}

/// The rings a thread has submitted to. The kernel ties a poll request to the
/// thread whose `io_uring_enter` submitted it: once that thread has exited, the
/// request completes with `-ECANCELED` when it would fire, from a kernel worker
/// about a jiffy later. So a thread that exits queues every pending request again
/// (a remove of the old one and the same poll), for a live thread's next enter to
/// submit, and kicks a leader blocked in the kernel so that it does so at once.
struct Submitters(RefCell<Vec<Weak<Ring>>>);

impl Drop for Submitters {
    fn drop(&mut self) {
        for ring in self.0.get_mut().drain(..) {
            if let Some(ring) = ring.upgrade() {
                // In a forked child the ring's memory is not mapped (MADV_DONTFORK)
                // and its requests are the parent's: nothing to do.
                if ring.forks == crate::fork::count() {
                    ring.requeue_all();
                }
            }
        }
    }
}

thread_local! {
    static SUBMITTERS: Submitters = const { Submitters(RefCell::new(Vec::new())) };
}

impl Backend for Uring {}

/// `poll32_events` for an interest.
#[inline]
fn poll_events(interest: Interest) -> u32 {
    let mut e = 0;
    if interest.is_readable() {
        e |= (libc::POLLIN | libc::POLLRDHUP) as u32;
    }
    if interest.is_writable() {
        e |= libc::POLLOUT as u32;
    }
    e
}

/// What a failed request reports: an error on both directions.
const FAILED: Readiness = Readiness::ERROR
    .union(Readiness::READABLE)
    .union(Readiness::WRITABLE);

fn unsupported(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("pollshot io_uring backend: {what}"),
    )
}

/// Why io_uring_setup(2) failed, as an `Unsupported` error where the kernel refuses
/// io_uring, else the error unchanged.
fn setup_error(e: io::Error) -> io::Error {
    let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map(|s| format!("kernel.io_uring_disabled = {}", s.trim()))
        .unwrap_or_else(|_| "kernel.io_uring_disabled absent".to_owned());
    match e.raw_os_error() {
        Some(libc::ENOSYS) => unsupported(&format!(
            "io_uring_setup(2) answered ENOSYS: the kernel has no io_uring, or a \
             seccomp filter hides it ({sysctl})"
        )),
        Some(libc::EPERM) => unsupported(&format!(
            "io_uring_setup(2) answered EPERM: io_uring is disabled for this process \
             ({sysctl}; 1 allows only the io_uring_group, 2 nobody), or a seccomp \
             filter or container policy refuses it"
        )),
        _ => e,
    }
}

/// A new ring with the waker's multishot poll submitted, and the waker.
fn create() -> io::Result<(IoUring, OwnedFd, bool)> {
    let ring = IoUring::builder()
        .dontfork()
        .setup_cqsize(ENTRIES * 2)
        .build(ENTRIES)
        .map_err(setup_error)?;
    let params = ring.params();
    if !params.is_feature_nodrop() || !params.is_feature_ext_arg() {
        return Err(unsupported(
            "the kernel lacks IORING_FEAT_NODROP or IORING_FEAT_EXT_ARG (Linux 5.11 or newer needed)",
        ));
    }
    // IORING_FEAT_RSRC_TAGS came with multishot poll, in 5.13.
    if !params.is_feature_resource_tagging() {
        return Err(unsupported(
            "the kernel lacks multishot poll (Linux 5.13 or newer needed)",
        ));
    }
    let skip_success = params.is_feature_skip_cqe_on_success();
    let waker = rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
    )?;
    let uring = (ring, waker, skip_success);
    push_raw(&uring.0, &waker_poll(&uring.1))?;
    uring.0.submit()?;
    Ok(uring)
}

/// The eventfd's multishot poll.
fn waker_poll(waker: &OwnedFd) -> squeue::Entry {
    opcode::PollAdd::new(types::Fd(waker.as_raw_fd()), libc::POLLIN as u32)
        .multi(true)
        .build()
        .user_data(WAKER)
}

/// Pushes one entry; a full queue is submitted first to make room.
///
/// The caller holds the mutex (or owns the ring exclusively): no other submission
/// queue handle exists meanwhile.
fn push_raw(ring: &IoUring, entry: &squeue::Entry) -> io::Result<bool> {
    let mut submitted = false;
    loop {
        // SAFETY: the caller holds the backend's mutex (or owns the ring), so this is
        // the only submission queue handle; it is dropped (synced) before the ring
        // is entered below.
        let mut sq = unsafe { ring.submission_shared() };
        // SAFETY: poll and poll-remove entries refer to no memory of ours: nothing
        // must outlive their submission.
        if unsafe { sq.push(entry) }.is_ok() {
            return Ok(submitted);
        }
        drop(sq);
        ring.submit()?;
        submitted = true;
    }
}

/// Borrows a registered descriptor number for one `fcntl`.
#[inline]
fn fd_ref<'a>(fd: RawFd) -> BorrowedFd<'a> {
    // SAFETY: the number is passed only to fcntl(2), which answers EBADF for a closed
    // one; no I/O is done through it and it is never closed here.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

impl Ring {
    fn new(counters: Arc<Counters>) -> io::Result<Arc<Ring>> {
        let (ring, waker, skip_success) = create()?;
        Ok(Arc::new_cyclic(|me| Ring {
            ring: ManuallyDrop::new(ring),
            abandoned: AtomicBool::new(false),
            shared: Mutex::new(Shared::new()),
            handoff: AtomicU32::new(0),
            forks: crate::fork::install(),
            waker,
            epoll: OnceLock::new(),
            skip_success,
            counters,
            me: me.clone(),
        }))
    }

    /// Records that this thread submits to this ring (see [`Submitters`]).
    #[inline(always)]
    fn note_submitter(&self) {
        // During the thread's own teardown the list is gone: nothing to record.
        let _ = SUBMITTERS.try_with(|list| {
            let mut list = list.0.borrow_mut();
            if list.iter().any(|r| Weak::ptr_eq(r, &self.me)) {
                return;
            }
            list.retain(|r| r.strong_count() > 0);
            list.push(self.me.clone());
        });
    }

    /// A thread that submitted to this ring is exiting: queue every pending request
    /// again (see [`Submitters`]).
    fn requeue_all(&self) {
        let kick = {
            let mut g = self.lock();
            let mut queued = false;
            for i in 0..g.pending.len() {
                let p = g.pending[i];
                if p.user_data == NONE || p.via_epoll {
                    continue;
                }
                let remove = self.remove_entry(p.user_data);
                let again = opcode::PollAdd::new(types::Fd(p.fd), p.events)
                    .build()
                    .user_data(p.user_data);
                if self.push(&mut g, &remove).is_err() || self.push(&mut g, &again).is_err() {
                    break;
                }
                g.pending[i].older += 1;
                queued = true;
            }
            if g.epoll_poll != 0 {
                // The private epoll's poll too, under a new stamp: the old one's
                // -ECANCELED (the remove's answer, or the exit's) is then stale.
                let remove = self.remove_entry(pack64(EPOLL_SLOT, g.epoll_poll));
                g.epoll_poll = 0;
                if self.push(&mut g, &remove).is_ok() {
                    if let Some(again) = self.epoll_poll(&mut g) {
                        queued |= self.push(&mut g, &again).is_ok();
                    }
                }
            }
            let kick = queued && g.leader && !g.kicked;
            if kick {
                g.kicked = true;
            }
            kick
        };
        if kick {
            // The leader returns, finds nothing to deliver, and enters again,
            // submitting what was queued from its own, live, thread.
            self.counters.one(Count::Wake);
            let _ = rustix::io::write(&self.waker, &1u64.to_ne_bytes());
        }
    }

    #[inline(always)]
    fn lock(&self) -> MutexGuard<'_, Shared> {
        // Every field is plain data updated in single assignments: a panic elsewhere
        // cannot leave it half-written.
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Pushes under the mutex; a push that had to submit a full queue is counted.
    #[inline(always)]
    fn push(&self, _held: &mut Shared, entry: &squeue::Entry) -> Result<(), KernelError> {
        match push_raw(&self.ring, entry) {
            Ok(submitted) => {
                if submitted {
                    self.note_submitter();
                    self.counters.one(Count::CtlCall);
                }
                Ok(())
            }
            Err(e) => Err(KernelError::Other(e)),
        }
    }

    /// The entry that removes a pending request.
    #[inline]
    fn remove_entry(&self, user_data: u64) -> squeue::Entry {
        let e = opcode::PollRemove::new(user_data).build().user_data(REMOVE);
        if self.skip_success {
            e.flags(squeue::Flags::SKIP_SUCCESS)
        } else {
            e
        }
    }

    /// Submits what is queued when a leader is blocked in the kernel (it would not
    /// see it until it returns). Called without the mutex.
    #[inline(always)]
    fn submit_for_leader(&self, leader: bool) -> Result<(), KernelError> {
        if !leader {
            return Ok(());
        }
        self.note_submitter();
        self.counters.one(Count::CtlCall);
        self.ring.submit().map(drop).map_err(KernelError::Other)
    }

    /// Queues the request for an arming; `rearm`: a modify, which answers
    /// `NotFound` for a number the kernel reported closed (see [`Pending::lost`]).
    /// A write-only arming of a registration known to be half-closed is made in
    /// the private epoll instance instead (one `epoll_ctl`).
    #[inline(always)]
    fn arm(&self, fd: RawFd, tag: Tag, interest: Interest, rearm: bool) -> Result<(), KernelError> {
        let user_data = pack64(tag.slot, tag.generation);
        let events = poll_events(interest);
        let leader = {
            let mut g = self.lock();
            let mut old = *g.slot(tag.slot);
            if rearm && old.lost {
                return Err(KernelError::NotFound);
            }
            if !rearm {
                // A registration's first arm (or its number's check after a
                // loss): what the slot knew of a socket no longer holds.
                old.half_closed = false;
            }
            if old.user_data != NONE && !old.via_epoll {
                let remove = self.remove_entry(old.user_data);
                self.push(&mut g, &remove)?;
            }
            // A poll request would complete at once with read-closed.
            let to_epoll = old.half_closed && events & libc::POLLIN as u32 == 0;
            let now = if old.via_epoll && !to_epoll {
                // Back to a poll request: the epoll entry must not report.
                self.epoll_forget(&mut g, tag.slot, fd)?;
                *g.slot(tag.slot)
            } else {
                old
            };
            let pending = Pending {
                user_data,
                fd,
                events,
                via_epoll: now.via_epoll,
                ..now.idle()
            };
            let watched = to_epoll && {
                *g.slot(tag.slot) = pending;
                match self.epoll_watch(&mut g, tag.slot) {
                    Ok(Some(poll)) => {
                        self.push(&mut g, &poll)?;
                        true
                    }
                    Ok(None) => return Ok(()),
                    // epoll refuses the number: closed (EBADF) or reused by a
                    // file it cannot poll (EPERM). A poll request does for it
                    // what it does for any arming (-EBADF at submission, or an
                    // always-ready completion), and the registration is no
                    // longer known half-closed (a socket still half-closed
                    // comes back here through its completion).
                    Err(_) => false,
                }
            };
            if !watched {
                let entry = opcode::PollAdd::new(types::Fd(fd), events)
                    .build()
                    .user_data(user_data);
                self.push(&mut g, &entry)?;
                // After a refusal, the slot as `epoll_watch` left it (its entry
                // may be there).
                let now = *g.slot(tag.slot);
                *g.slot(tag.slot) = Pending {
                    via_epoll: false,
                    in_epoll: pending.in_epoll || now.in_epoll,
                    half_closed: pending.half_closed && !to_epoll,
                    ..pending
                };
            }
            g.leader
        };
        self.submit_for_leader(leader)
    }

    /// Removes the slot's pending request or epoll entry, if any.
    fn remove(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        let leader = {
            let mut g = self.lock();
            // Nothing of the registration outlives a disarm or deregister in the
            // private epoll instance.
            self.epoll_forget(&mut g, tag.slot, fd)?;
            let old = std::mem::replace(g.slot(tag.slot), IDLE);
            g.slot(tag.slot).half_closed = old.half_closed;
            if old.lost {
                // As epoll answers for a descriptor it dropped at close: EBADF while
                // the number is closed, ENOENT once it names a descriptor again.
                g.slot(tag.slot).lost = true;
                drop(g);
                return Err(match rustix::io::fcntl_getfd(fd_ref(fd)) {
                    Err(Errno::BADF) => KernelError::BadFd,
                    _ => KernelError::NotFound,
                });
            }
            if old.user_data == NONE || old.via_epoll {
                return Ok(());
            }
            let remove = self.remove_entry(old.user_data);
            self.push(&mut g, &remove)?;
            g.leader
        };
        self.submit_for_leader(leader)
    }

    /// The private epoll instance, made at its first use.
    fn private_epoll(&self) -> io::Result<&OwnedFd> {
        if let Some(ep) = self.epoll.get() {
            return Ok(ep);
        }
        // Under the mutex: no other thread makes one meanwhile.
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        Ok(self.epoll.get_or_init(|| ep))
    }

    /// Watches the slot's descriptor for the rest of its current arming (its
    /// `user_data`) in the private epoll instance: `EPOLLOUT | EPOLLONESHOT`, MOD
    /// where an entry may exist and ADD where not, each falling back to the other
    /// (ENOENT, EEXIST). Returns the poll on the instance's descriptor to queue,
    /// if none is pending. On failure the slot is left with nothing pending.
    fn epoll_watch(&self, g: &mut Shared, slot: u32) -> Result<Option<squeue::Entry>, KernelError> {
        let p = *g.slot(slot);
        let r = self
            .private_epoll()
            .map_err(KernelError::Other)
            .and_then(|ep| {
                let data = EventData::new_u64(p.user_data);
                let flags = EventFlags::OUT | EventFlags::ONESHOT;
                let mut modify = p.in_epoll;
                for _ in 0..2 {
                    self.counters.one(Count::CtlCall);
                    let r = if modify {
                        epoll::modify(ep, fd_ref(p.fd), data, flags)
                    } else {
                        epoll::add(ep, fd_ref(p.fd), data, flags)
                    };
                    match r {
                        Ok(()) => return Ok(()),
                        Err(Errno::NOENT) if modify => modify = false,
                        Err(Errno::EXIST) if !modify => modify = true,
                        Err(Errno::BADF) => return Err(KernelError::BadFd),
                        Err(e) => return Err(KernelError::Other(e.into())),
                    }
                }
                Err(KernelError::Other(io::Error::other(
                    "pollshot io_uring backend: epoll_ctl answered ENOENT and EEXIST",
                )))
            });
        if let Err(e) = r {
            if p.via_epoll {
                g.epoll_armed -= 1;
            }
            *g.slot(slot) = Pending {
                in_epoll: true, // it may be there: a later delete tries
                ..p.idle()
            };
            return Err(e);
        }
        if !p.via_epoll {
            g.epoll_armed += 1;
        }
        *g.slot(slot) = Pending {
            via_epoll: true,
            in_epoll: true,
            half_closed: true,
            ..p
        };
        Ok(self.epoll_poll(g))
    }

    /// Deletes the registration's entry (descriptor `fd`) from the private epoll
    /// instance, if it may have one (ENOENT, EBADF and EPERM mean it is gone
    /// already).
    /// Nothing is pending there after.
    fn epoll_forget(&self, g: &mut Shared, slot: u32, fd: RawFd) -> Result<(), KernelError> {
        let p = *g.slot(slot);
        if !p.in_epoll {
            return Ok(());
        }
        if p.via_epoll {
            g.epoll_armed -= 1;
            *g.slot(slot) = Pending {
                in_epoll: false,
                ..p.idle()
            };
        } else {
            g.slot(slot).in_epoll = false;
        }
        let Some(ep) = self.epoll.get() else {
            return Ok(());
        };
        self.counters.one(Count::CtlCall);
        match epoll::delete(ep, fd_ref(fd)) {
            // EPERM: the number names a file epoll cannot poll now (reused).
            Ok(()) | Err(Errno::NOENT) | Err(Errno::BADF) | Err(Errno::PERM) => Ok(()),
            Err(e) => Err(KernelError::Other(e.into())),
        }
    }

    /// The poll on the private epoll instance's descriptor, if none is pending and
    /// some arming is watched there. The caller pushes it.
    fn epoll_poll(&self, g: &mut Shared) -> Option<squeue::Entry> {
        if g.epoll_poll != 0 || g.epoll_armed == 0 {
            return None;
        }
        let ep = self.epoll.get()?;
        g.epoll_seq = g.epoll_seq.wrapping_add(1).max(2);
        g.epoll_poll = g.epoll_seq;
        Some(
            opcode::PollAdd::new(types::Fd(ep.as_raw_fd()), libc::POLLIN as u32)
                .build()
                .user_data(pack64(EPOLL_SLOT, g.epoll_poll)),
        )
    }

    /// The private epoll instance reported readable: takes at most `room` of its
    /// events (`epoll_wait` with timeout 0) into `out`, current armings only.
    fn epoll_take(&self, g: &mut Shared, out: &mut Vec<RawEvent>, room: usize) {
        let Some(ep) = self.epoll.get() else { return };
        let mut buf = [MaybeUninit::<epoll::Event>::uninit(); EPOLL_BATCH];
        let n = room.clamp(1, EPOLL_BATCH);
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        self.counters.one(Count::Wait);
        // An error (EINTR) leaves the events in the instance: the poll queued
        // again after this completes at once.
        let Ok((ready, _)) = epoll::wait(ep, &mut buf[..n], Some(&zero)) else {
            return;
        };
        for ev in ready.iter() {
            let (flags, user_data) = (ev.flags, ev.data.u64());
            let (slot, generation) = unpack64(user_data);
            let current = g
                .pending
                .get(slot as usize)
                .is_some_and(|p| p.via_epoll && p.user_data == user_data);
            if !current {
                self.counters.one(Count::Stale);
                continue;
            }
            // The oneshot entry is disabled by its report and stays for the next
            // write-only arming (a MOD).
            g.epoll_armed -= 1;
            let p = &mut g.pending[slot as usize];
            *p = p.idle();
            out.push(RawEvent {
                slot,
                stamp: generation,
                readiness: Readiness::from_epoll(flags.bits()),
            });
        }
    }

    /// Takes completions into `out` (at most `max` in all), handling the waker's,
    /// the removes' and cancelled ones; a flagged overflow is flushed while there is
    /// room. Returns whether completions are left in the queue.
    fn reap(&self, g: &mut Shared, out: &mut Vec<RawEvent>, max: usize) -> io::Result<bool> {
        loop {
            let mut rearm: Option<squeue::Entry> = None;
            let mut left = false;
            {
                // SAFETY: under the mutex: the only completion queue handle. It is
                // dropped (its head synced) before anything else touches the ring.
                let mut cq = unsafe { self.ring.completion_shared() };
                while out.len() < max && rearm.is_none() {
                    let Some(cqe) = cq.next() else { break };
                    g.reaped += 1;
                    rearm = self.complete(g, &cqe, out, max);
                }
                if !cq.is_empty() {
                    left = true;
                }
            }
            if let Some(entry) = rearm {
                self.push(g, &entry).map_err(kernel_io)?;
                continue;
            }
            if left || out.len() >= max {
                return Ok(left);
            }
            // SAFETY: under the mutex: the only submission queue handle; it only
            // reads the kernel's flags.
            let overflow = unsafe { self.ring.submission_shared() }.cq_overflow();
            if !overflow {
                return Ok(false);
            }
            // The kernel holds completions that did not fit: an enter with
            // GETEVENTS moves them into the queue.
            self.counters.one(Count::Wait);
            // SAFETY: no argument structure is passed (a null pointer).
            match unsafe {
                self.ring.submitter().enter::<libc::sigset_t>(
                    0,
                    0,
                    io_uring::EnterFlags::GETEVENTS.bits(),
                    None,
                )
            } {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// One completion, with room for it in `out` (at most `max` in all). Returns
    /// the entry to queue: again for a cancelled current request, or the poll on
    /// the private epoll instance.
    #[inline(always)]
    fn complete(
        &self,
        g: &mut Shared,
        cqe: &cqueue::Entry,
        out: &mut Vec<RawEvent>,
        max: usize,
    ) -> Option<squeue::Entry> {
        let user_data = cqe.user_data();
        if user_data == WAKER {
            g.kicked = false;
            if !cqueue::more(cqe.flags()) {
                // The multishot poll ended (a full queue, or cancelled): again.
                return Some(waker_poll(&self.waker));
            }
            return None;
        }
        if user_data == REMOVE {
            // 0: removed; -ENOENT or -EALREADY: its target had completed. Fine.
            return None;
        }
        let (slot, generation) = unpack64(user_data);
        let res = cqe.result();
        if slot == EPOLL_SLOT {
            if generation != g.epoll_poll {
                // An older poll, removed when a submitting thread exited.
                return None;
            }
            g.epoll_poll = 0;
            if res != -libc::ECANCELED {
                self.epoll_take(g, out, max - out.len());
            }
            // Its submitting thread exited (-ECANCELED), or armings are left: again.
            return self.epoll_poll(g);
        }
        // A slot watched by the private epoll has no poll request of its own: a
        // request with its tag is an older one.
        let current = g
            .pending
            .get(slot as usize)
            .is_some_and(|p| p.user_data == user_data && !p.via_epoll);
        if res == -libc::ECANCELED {
            if !current {
                // The answer to a remove: the kernel's report for a disarmed or
                // deregistered arming, stale by generation.
                self.counters.one(Count::Stale);
                return None;
            }
            let p = &mut g.pending[slot as usize];
            if p.older > 0 {
                // An older request with this tag, removed when it was queued again.
                p.older -= 1;
                self.counters.one(Count::Stale);
                return None;
            }
            // The submitting thread exited: the arming still holds.
            let p = *p;
            return Some(
                opcode::PollAdd::new(types::Fd(p.fd), p.events)
                    .build()
                    .user_data(user_data),
            );
        }
        if !current {
            // Fired before its remove was processed, or for a freed slot: stale.
            self.counters.one(Count::Stale);
            return None;
        }
        let p = g.pending[slot as usize];
        if res >= 0 && p.events & libc::POLLIN as u32 == 0 && res as u32 & WRITE_BITS == 0 {
            // A write-only arming completed with read-closed alone (the kernel adds
            // POLLRDHUP to every poll request): epoll would report nothing until
            // the socket is writable. The private epoll watches the rest of it.
            g.pending[slot as usize].half_closed = true;
            match self.epoll_watch(g, slot) {
                Ok(poll) => return poll,
                Err(KernelError::BadFd) => {
                    // Closed since: as a request's -EBADF, below.
                    g.pending[slot as usize].lost = true;
                    return None;
                }
                Err(_) => {
                    // No way to watch it (ENOMEM, ENOSPC: max_user_watches): an
                    // error event, which a write then explains.
                    out.push(RawEvent {
                        slot,
                        stamp: generation,
                        readiness: FAILED,
                    });
                    return None;
                }
            }
        }
        g.pending[slot as usize] = p.idle();
        if res == -libc::EBADF {
            // Closed before submission: dropped, as epoll drops a closed descriptor.
            g.pending[slot as usize].lost = true;
            return None;
        }
        let readiness = if res >= 0 {
            Readiness::from_epoll(res as u32)
        } else {
            FAILED
        };
        out.push(RawEvent {
            slot,
            stamp: generation,
            readiness,
        });
        None
    }

    /// One `io_uring_enter` that submits what is queued and waits for a completion
    /// for at most `timeout` (`None`: no limit). Timing out is `Ok`. Returns how
    /// many entries it submitted: the kernel answers that count, not EINTR, when a
    /// signal ends the wait of an enter that submitted something.
    fn enter(&self, timeout: Option<Duration>) -> io::Result<usize> {
        self.counters.one(Count::Wait);
        let submitter = self.ring.submitter();
        let r = match timeout {
            None => submitter.submit_and_wait(1),
            Some(t) => {
                // A timespec as long as the kernel accepts: clamp what is huge.
                let t = t.min(Duration::from_secs(1 << 40));
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                submitter.submit_with_args(1, &args)
            }
        };
        match r {
            Ok(submitted) => Ok(submitted),
            // ETIME: timed out. EBUSY: completions wait in the overflow list; the
            // reap that follows flushes them.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME) | Some(libc::EBUSY)) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// An enter that submits and runs what is due without waiting.
    fn enter_nowait(&self) -> io::Result<()> {
        self.counters.one(Count::Wait);
        // SAFETY: no argument structure is passed (a null pointer).
        let r = unsafe {
            let submitter = self.ring.submitter();
            submitter.enter::<libc::sigset_t>(
                ENTRIES,
                0,
                io_uring::EnterFlags::GETEVENTS.bits(),
                None,
            )
        };
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The wait: see the module docs. Returns whether it consumed a wake-up.
    fn wait(
        &self,
        out: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        let max = max.max(1);
        let deadline = Countdown::new(timeout);
        self.note_submitter();
        let mut g = self.lock();
        let mut polls = 0u8;
        loop {
            let consumed = std::mem::replace(&mut g.woken, false);
            let left = self.reap(&mut g, out, max)?;
            if consumed || !out.is_empty() {
                return Ok(self.leave(g, consumed, left));
            }
            let remaining = deadline.left();
            if remaining == Some(Duration::ZERO) {
                // SAFETY: under the mutex: the only submission queue handle; it only
                // reads the queue's length.
                let queued = !unsafe { self.ring.submission_shared() }.is_empty();
                // A poll: submit what is queued and collect what is due; again only
                // for what the reap queued (a cancelled request), a few times.
                if polls >= 3 || (polls > 0 && !queued) {
                    return Ok(self.leave(g, false, left));
                }
                polls += 1;
                drop(g);
                let r = self.enter_nowait();
                g = self.lock();
                r?;
                continue;
            }
            if g.leader {
                g.followers += 1;
                let seen = self.handoff.load(Ordering::Relaxed);
                drop(g);
                let r = self.follow(seen, remaining);
                g = self.lock();
                g.followers -= 1;
                if let Err(e) = r {
                    if !g.leader && g.followers > 0 {
                        // A hand-over may have been meant for this thread: pass it on.
                        self.hand_over(&g);
                    }
                    return Err(e);
                }
                continue;
            }
            g.leader = true;
            let posted = g.reaped + self.queued_completions(&g);
            drop(g);
            let r = self.enter(remaining);
            polls += 1;
            g = self.lock();
            g.leader = false;
            g.kicked = false;
            if g.followers > 0 {
                // One of them leads next, or takes what this one has no room for.
                self.hand_over(&g);
            }
            if r? > 0
                && g.reaped + self.queued_completions(&g) == posted
                && !g.woken
                && !deadline.passed()
            {
                // It submitted, nothing was posted, and time is left: a signal
                // ended the wait (the kernel answered the count, not EINTR).
                return Err(io::Error::from_raw_os_error(libc::EINTR));
            }
        }
    }

    /// A follower's wait for a hand-over: until the `handoff` word moves on from
    /// `seen`, for at most `timeout`. A signal is `Err(Interrupted)`; a timeout,
    /// a hand-over and a spurious wake-up are `Ok` (the caller looks again).
    fn follow(&self, seen: u32, timeout: Option<Duration>) -> io::Result<()> {
        let ts = timeout.map(|t| {
            let t = t.min(HOUR);
            rustix::thread::futex::Timespec {
                tv_sec: t.as_secs() as _,
                tv_nsec: t.subsec_nanos() as _,
            }
        });
        match rustix::thread::futex::wait(
            &self.handoff,
            rustix::thread::futex::Flags::PRIVATE,
            seen,
            ts.as_ref(),
        ) {
            Err(Errno::INTR) => Err(io::Error::from_raw_os_error(libc::EINTR)),
            // Woken, EAGAIN (moved on before the wait began), ETIMEDOUT.
            _ => Ok(()),
        }
    }

    /// Wakes one follower (under the mutex, so a follower between reading the
    /// word and waiting on it sees the word move and does not block).
    fn hand_over(&self, _held: &MutexGuard<'_, Shared>) {
        self.handoff.fetch_add(1, Ordering::Relaxed);
        let _ =
            rustix::thread::futex::wake(&self.handoff, rustix::thread::futex::Flags::PRIVATE, 1);
    }

    /// Completions in the queue, not yet taken (under the mutex).
    fn queued_completions(&self, _held: &MutexGuard<'_, Shared>) -> u64 {
        // SAFETY: under the mutex: the only completion queue handle; it only reads
        // the queue's length.
        unsafe { self.ring.completion_shared() }.len() as u64
    }

    /// Returns from a wait: hands what is left (completions, notifies) to a
    /// follower, and submits what the reap queued if a leader is in the kernel.
    fn leave(&self, g: MutexGuard<'_, Shared>, consumed: bool, left: bool) -> bool {
        if left && g.followers > 0 {
            self.hand_over(&g);
        }
        // SAFETY: under the mutex: the only submission queue handle; it only reads
        // the queue's length.
        let queued = g.leader && !unsafe { self.ring.submission_shared() }.is_empty();
        drop(g);
        if queued {
            // A failure here would surface at the leader's own enter.
            let _ = self.submit_for_leader(true);
        }
        consumed
    }

    /// The binary waker (see the module docs): the next wait to look, or a
    /// blocked one, returns woken.
    fn wake(&self) -> io::Result<()> {
        let kick = {
            let mut g = self.lock();
            if g.woken {
                return Ok(()); // merges with the one no wait has taken yet
            }
            g.woken = true;
            if g.followers > 0 {
                self.hand_over(&g);
                false
            } else if g.leader && !g.kicked {
                g.kicked = true;
                true
            } else {
                false
            }
        };
        if !kick {
            return Ok(());
        }
        self.counters.one(Count::Wake);
        match rustix::io::write(&self.waker, &1u64.to_ne_bytes()) {
            // EAGAIN: the counter is at its maximum; the poll fires for readability
            // all the same.
            Ok(_) | Err(Errno::AGAIN) => Ok(()),
            Err(e) => {
                let mut g = self.lock();
                g.kicked = false;
                g.woken = false;
                Err(e.into())
            }
        }
    }
}

fn kernel_io(e: KernelError) -> io::Error {
    match e {
        KernelError::Other(e) => e,
        _ => io::Error::other("pollshot io_uring backend: unexpected answer"),
    }
}

impl Driver for Uring {
    const NAME: &'static str = "uring";
    const TAG_IS_GENERATION: bool = true;
    const SPLIT_FILTERS: bool = false;

    /// # Errors
    /// `ErrorKind::Unsupported` with the reason where the kernel refuses io_uring
    /// (see the module docs); the kernel's error from io_uring_setup(2), mmap(2) or
    /// eventfd(2) otherwise (EMFILE, ENOMEM).
    fn new() -> io::Result<Uring> {
        let counters = Arc::new(Counters::default());
        Ok(Uring {
            ring: Ring::new(counters.clone())?,
            counters,
        })
    }

    /// The first arm checks the number is open (one `fcntl(F_GETFD)`), then queues
    /// the request.
    fn add(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        self.counters.one(Count::Add);
        self.counters.one(Count::CtlCall);
        match rustix::io::fcntl_getfd(fd_ref(fd)) {
            Ok(_) => {}
            Err(Errno::BADF) => return Err(KernelError::BadFd),
            Err(e) => return Err(KernelError::Other(e.into())),
        }
        self.ring.arm(fd, tag, interest, false)
    }

    #[inline(always)]
    fn modify(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        self.counters.one(Count::Modify);
        self.ring.arm(fd, tag, interest, true)
    }

    fn quiet(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        self.counters.one(Count::Quiet);
        self.ring.remove(fd, tag)
    }

    fn delete(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        self.counters.one(Count::Delete);
        self.ring.remove(fd, tag)
    }

    #[inline(always)]
    fn wait(
        &self,
        out: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        self.ring.wait(out, max, timeout)
    }

    fn wake(&self) -> io::Result<()> {
        self.ring.wake()
    }

    fn reinit_after_fork(&mut self) -> io::Result<()> {
        // The child has no mapping of the parent's ring (MADV_DONTFORK), and closing
        // its copy of the ring's descriptor leaves the parent's ring alone. The
        // mutex may have been held by a thread that does not exist here: all new.
        self.ring.abandoned.store(true, Ordering::Relaxed);
        self.ring = Ring::new(self.counters.clone())?;
        Ok(())
    }

    fn abandon_after_fork(&mut self) {
        self.ring.abandoned.store(true, Ordering::Relaxed);
    }

    fn owns_fd(&self, fd: RawFd) -> bool {
        fd == self.ring.ring.as_raw_fd()
            || fd == self.ring.waker.as_raw_fd()
            || self.ring.epoll.get().is_some_and(|ep| fd == ep.as_raw_fd())
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }
}

impl AsFd for Uring {
    /// The ring's descriptor.
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the ring's descriptor is open for as long as `self` (and so the
        // borrow) lives.
        unsafe { BorrowedFd::borrow_raw(self.ring.ring.as_raw_fd()) }
    }
}
