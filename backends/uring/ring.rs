//! The ring and the state its users share: the per-slot pending requests, the
//! leader's flags, the ring's creation (io_uring_setup(2), the waker's multishot
//! poll) and the one push into the submission queue.

use super::lock::{Guard, Lock};
use crate::backend::RawEvent;
use crate::state::KernelError;
use crate::stats::{Count, Counters};
use crate::token::{pack64, unpack64};
use crate::uring_handover::Handover;
use io_uring::{opcode, squeue, types, IoUring};
use rustix::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::io;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

/// `user_data` of the eventfd's multishot poll: a slot no table can reach.
pub(super) const WAKER: u64 = pack64(u32::MAX, 0);
/// `user_data` of every `POLL_REMOVE`: its answer needs no routing.
pub(super) const REMOVE: u64 = pack64(u32::MAX, 1);
/// A slot with no pending request.
pub(super) const NONE: u64 = u64::MAX;
/// The slot of the poll requests on the private epoll instance's descriptor; their
/// stamp (2 and up) tells the current one from older ones.
pub(super) const EPOLL_SLOT: u32 = u32::MAX;

/// Submission queue entries; the completion queue has twice as many.
pub(super) const ENTRIES: u32 = 256;

/// The pending poll request of one slot.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    /// Its `user_data`, or [`NONE`].
    pub(super) user_data: u64,
    pub(super) fd: RawFd,
    /// The `poll32_events` it was submitted with.
    pub(super) events: u32,
    /// Older requests with the same `user_data` still in the kernel (queued again
    /// when a submitting thread exited): each ends with one completion that is not
    /// this request's.
    pub(super) older: u32,
    /// The last request answered -EBADF: the number was closed before it was
    /// submitted. As epoll drops a closed descriptor, nothing was reported, and the
    /// next command answers as epoll's would: a re-arm `NotFound` (then the add
    /// checks the number), a quiet or delete `BadFd` while the number is closed and
    /// `NotFound` once it is open again.
    pub(super) lost: bool,
    /// The current arming (`user_data`) is watched by the private epoll instance,
    /// not by a poll request (see "Half-closed sockets" in the module docs).
    pub(super) via_epoll: bool,
    /// The descriptor may have an entry in the private epoll instance (armed when
    /// `via_epoll`, else disabled by its oneshot report): a hint for ADD or MOD,
    /// and what a disarm or deregister deletes.
    pub(super) in_epoll: bool,
    /// This registration's socket reported read-closed to a write-only arming: its
    /// write-only armings go to the private epoll instance directly. Cleared by the
    /// registration's first arm (an add).
    pub(super) half_closed: bool,
    /// One poll request of the slot in flight that `Shared::inflight` does not
    /// count: the common arm's, set by it and cleared by the slot's next
    /// completion taken (whichever request it ends: the count is what matters),
    /// so that an arm and its delivery touch only the slot. Kept by every other
    /// rewrite of the slot (`idle`).
    pub(super) fast: bool,
}

pub(super) const IDLE: Pending = Pending {
    user_data: NONE,
    fd: -1,
    events: 0,
    older: 0,
    lost: false,
    via_epoll: false,
    in_epoll: false,
    half_closed: false,
    fast: false,
};

impl Pending {
    /// No request pending, with what the slot knows of the private epoll kept,
    /// and its uncounted request in flight (`fast`).
    #[inline]
    pub(super) fn idle(self) -> Pending {
        Pending {
            fd: self.fd,
            in_epoll: self.in_epoll,
            half_closed: self.half_closed,
            fast: self.fast,
            ..IDLE
        }
    }
}

/// What the mutex guards besides the queues.
#[derive(Debug)]
pub(super) struct Shared {
    /// Per slot: the request a completion must carry to be the current one.
    pub(super) pending: Vec<Pending>,
    /// Completions taken from the queue so far (with the queue's length: how many
    /// the kernel has posted, to tell a signal from a completion).
    pub(super) reaped: u64,
    /// Slots whose current arming the private epoll instance watches.
    pub(super) epoll_armed: usize,
    /// The stamp of the pending poll request on the private epoll instance's own
    /// descriptor (`user_data` = [`EPOLL_SLOT`] | stamp << 32), or 0: none.
    pub(super) epoll_poll: u32,
    /// The last stamp handed out (from 2 on: 0 and 1 are the waker's and the
    /// removes').
    pub(super) epoll_seq: u32,
    /// Per slot: its poll requests in the kernel or the submission queue whose
    /// completion has not been taken yet (pushed minus reaped; each oneshot request
    /// ends with exactly one completion), less the one `Pending::fast` stands for.
    /// A deregister waits for the sum, [`inflight`](Self::inflight), to be 0
    /// (`depart.rs`).
    pub(super) inflight: Vec<u32>,
    /// Events a deregister took from the completion queue while it led, for the
    /// next wait to deliver (`PARKED` in the hand-over's word says so).
    pub(super) parked: Vec<RawEvent>,
}

impl Shared {
    pub(super) fn new() -> Shared {
        Shared {
            pending: Vec::new(),
            reaped: 0,
            epoll_armed: 0,
            epoll_poll: 0,
            epoll_seq: 1,
            inflight: Vec::new(),
            parked: Vec::new(),
        }
    }

    /// The slot's requests not yet completed: its `inflight` count and its
    /// uncounted one (`Pending::fast`).
    #[inline]
    pub(super) fn inflight(&self, slot: u32) -> u32 {
        let i = slot as usize;
        let fast = self.pending.get(i).is_some_and(|p| p.fast);
        self.inflight.get(i).copied().unwrap_or(0) + u32::from(fast)
    }

    /// The slot's pending request; `pending` and `inflight` grow together to hold
    /// it, so that an index checked here is in bounds for both.
    #[inline(always)]
    pub(super) fn slot(&mut self, slot: u32) -> &mut Pending {
        let i = slot as usize;
        if i < self.pending.len() {
            &mut self.pending[i]
        } else {
            self.grow(i)
        }
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, i: usize) -> &mut Pending {
        self.pending.resize(i + 1, IDLE);
        if self.inflight.len() <= i {
            self.inflight.resize(i + 1, 0);
        }
        &mut self.pending[i]
    }

    /// One more request of `slot` in flight.
    #[inline(always)]
    pub(super) fn count_inflight(&mut self, slot: u32) {
        let i = slot as usize;
        if i < self.inflight.len() {
            self.inflight[i] += 1;
        } else {
            self.count_inflight_grown(i);
        }
    }

    #[cold]
    #[inline(never)]
    fn count_inflight_grown(&mut self, i: usize) {
        self.inflight.resize(i + 1, 0);
        self.inflight[i] = 1;
    }
}

/// The ring and what its users share; threads that submitted to it hold a `Weak`
/// to it (see [`Submitters`](super::exit::Submitters)).
pub(super) struct Ring {
    /// Dropped normally, except in a forked child (see `abandoned`).
    pub(super) ring: ManuallyDrop<IoUring>,
    /// Set in a forked child: the ring's memory is not mapped there, and its
    /// addresses may since hold other mappings (a new ring's), so dropping the ring
    /// only closes the child's copy of its descriptor.
    pub(super) abandoned: AtomicBool,
    pub(super) shared: Lock<Shared>,
    /// Who holds the ring, and the futex words the others sleep on
    /// (`handover.rs`). A futex wait, unlike a condition variable's, ends with
    /// EINTR on a signal, so a follower says `Interrupted` as a thread blocked in
    /// the kernel does.
    pub(super) handover: Handover,
    /// The fork count (`crate::fork`) when the ring was made: a thread exiting in
    /// a forked child must not touch the parent's ring (see [`Submitters`](super::exit::Submitters)).
    pub(super) forks: u64,
    pub(super) waker: OwnedFd,
    /// The private epoll instance for write-only armings of half-closed sockets,
    /// made at its first use.
    pub(super) epoll: OnceLock<OwnedFd>,
    /// `IOSQE_CQE_SKIP_SUCCESS` is known (5.17): a successful remove posts nothing.
    pub(super) skip_success: bool,
    pub(super) counters: Arc<Counters>,
    /// This ring, for the submitters' lists.
    pub(super) me: Weak<Ring>,
    /// This ring's id in the submitters' lists (`exit.rs`), unique in the process.
    pub(super) id: u64,
}

pub(super) fn unsupported(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("pollshot io_uring backend: {what}"),
    )
}

/// Why io_uring_setup(2) failed, as an `Unsupported` error where the kernel refuses
/// io_uring, else the error unchanged.
pub(super) fn setup_error(e: io::Error) -> io::Error {
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
pub(super) fn create() -> io::Result<(IoUring, OwnedFd, bool)> {
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
pub(super) fn waker_poll(waker: &OwnedFd) -> squeue::Entry {
    opcode::PollAdd::new(types::Fd(waker.as_raw_fd()), libc::POLLIN as u32)
        .multi(true)
        .build()
        .user_data(WAKER)
}

/// Pushes one entry; a full queue is submitted first to make room.
///
/// The caller holds the mutex (or owns the ring exclusively): no other submission
/// queue handle exists meanwhile.
pub(super) fn push_raw(ring: &IoUring, entry: &squeue::Entry) -> io::Result<bool> {
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
pub(super) fn fd_ref<'a>(fd: RawFd) -> BorrowedFd<'a> {
    // SAFETY: the number is passed only to fcntl(2), which answers EBADF for a closed
    // one; no I/O is done through it and it is never closed here.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

/// Ring ids ([`Ring::id`]), from 1 on (0 is "none" in the thread's last noted
/// ring, `exit.rs`); never reused, so a ring dropped and another made at its
/// address are told apart.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Ring {
    pub(super) fn new(counters: Arc<Counters>) -> io::Result<Arc<Ring>> {
        let (ring, waker, skip_success) = create()?;
        Ok(Arc::new_cyclic(|me| Ring {
            ring: ManuallyDrop::new(ring),
            abandoned: AtomicBool::new(false),
            shared: Lock::new(Shared::new()),
            handover: Handover::new(),
            forks: crate::fork::install(),
            waker,
            epoll: OnceLock::new(),
            skip_success,
            counters,
            me: me.clone(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }))
    }

    #[inline(always)]
    pub(super) fn lock(&self) -> Guard<'_, Shared> {
        // Every field is plain data updated in single assignments: a panic elsewhere
        // cannot leave it half-written, so the lock has no poisoning (`lock.rs`).
        self.shared.lock()
    }

    /// Pushes under the mutex; a push that had to submit a full queue is counted.
    /// A poll request of a slot counts in the slot's `inflight` from here.
    #[inline(always)]
    pub(super) fn push(&self, g: &mut Shared, entry: &squeue::Entry) -> Result<(), KernelError> {
        self.push_uncounted(entry)?;
        let (slot, _) = unpack64(entry.get_user_data());
        // The waker's, the removes' and the private epoll's: not a slot's.
        if slot != u32::MAX {
            g.count_inflight(slot);
        }
        Ok(())
    }

    /// [`push`](Self::push) without counting the request in its slot's
    /// `inflight`: the caller, which holds the mutex, counts a slot's poll request.
    #[inline(always)]
    pub(super) fn push_uncounted(&self, entry: &squeue::Entry) -> Result<(), KernelError> {
        // SAFETY: under the mutex (the caller holds it): the only submission queue
        // handle, dropped (its tail synced) at the end of the statement. Poll and
        // poll-remove entries refer to no memory of ours: nothing must outlive
        // their submission.
        let pushed = unsafe { self.ring.submission_shared().push(entry) }.is_ok();
        if !pushed {
            self.push_full(entry)?;
        }
        Ok(())
    }

    /// The queue is full: submit it to make room, then push (counted).
    #[cold]
    #[inline(never)]
    fn push_full(&self, entry: &squeue::Entry) -> Result<(), KernelError> {
        let submitted = push_raw(&self.ring, entry).map_err(KernelError::Other)?;
        if submitted {
            self.note_submitter();
            self.counters.one(Count::CtlCall);
        }
        Ok(())
    }

    /// The entry that removes a pending request.
    #[inline]
    pub(super) fn remove_entry(&self, user_data: u64) -> squeue::Entry {
        let e = opcode::PollRemove::new(user_data).build().user_data(REMOVE);
        if self.skip_success {
            e.flags(squeue::Flags::SKIP_SUCCESS)
        } else {
            e
        }
    }
}
