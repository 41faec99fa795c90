//! The ring and the state its users share: what the mutex guards (the rare
//! paths' per-slot state, the private epoll's, parked events), the ring's
//! creation (io_uring_setup(2), the waker's multishot poll) and the one push
//! into the submission queue.

use super::lock::{Guard, Lock};
use super::slots::{Reqs, ODD};
use crate::backend::RawEvent;
use crate::state::KernelError;
use crate::stats::{Count, Counters};
use crate::token::pack64;
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
/// The slot of the poll requests on the private epoll instance's descriptor; their
/// stamp (2 and up) tells the current one from older ones.
pub(super) const EPOLL_SLOT: u32 = u32::MAX;

/// Submission queue entries; the completion queue has twice as many.
pub(super) const ENTRIES: u32 = 256;

/// What the rare paths keep of a slot, under the mutex. A slot with any of it
/// (not the default) has [`ODD`](super::slots::ODD) in its word, so its arms and
/// completions take those paths.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Odd {
    /// Older requests with the latest arming's `user_data` still in the kernel
    /// (queued again when a submitting thread exited): each ends with one
    /// completion that is not the current request's.
    pub(super) older: u32,
    /// The last request answered -EBADF: the number was closed before it was
    /// submitted. As epoll drops a closed descriptor, nothing was reported, and the
    /// next command answers as epoll's would: a re-arm `NotFound` (then the add
    /// checks the number), a quiet or delete `BadFd` while the number is closed and
    /// `NotFound` once it is open again.
    pub(super) lost: bool,
    /// The latest arming is watched by the private epoll instance, not by a poll
    /// request (see "Half-closed sockets" in the module docs).
    pub(super) via_epoll: bool,
    /// The descriptor may have an entry in the private epoll instance (armed when
    /// `via_epoll`, else disabled by its oneshot report): a hint for ADD or MOD,
    /// and what a disarm or deregister deletes.
    pub(super) in_epoll: bool,
    /// This registration's socket reported read-closed to a write-only arming: its
    /// write-only armings go to the private epoll instance directly. Cleared by the
    /// registration's first arm (an add).
    pub(super) half_closed: bool,
}

/// What the mutex guards besides the submission queue.
#[derive(Debug)]
pub(super) struct Shared {
    /// Per slot: what the rare paths keep ([`Odd`]); grown by them only.
    pub(super) odd: Vec<Odd>,
    /// Slots whose current arming the private epoll instance watches.
    pub(super) epoll_armed: usize,
    /// The stamp of the pending poll request on the private epoll instance's own
    /// descriptor (`user_data` = [`EPOLL_SLOT`] | stamp << 32), or 0: none.
    pub(super) epoll_poll: u32,
    /// The last stamp handed out (from 2 on: 0 and 1 are the waker's and the
    /// removes').
    pub(super) epoll_seq: u32,
    /// Events a deregister took from the completion queue while it led, for the
    /// next wait to deliver (`PARKED` in the hand-over's word says so).
    pub(super) parked: Vec<RawEvent>,
}

impl Odd {
    /// No arming's state kept, with what the slot knows of the private epoll
    /// kept (its entry, a half-closed socket).
    #[inline]
    pub(super) fn idle(self) -> Odd {
        Odd {
            in_epoll: self.in_epoll,
            half_closed: self.half_closed,
            ..Odd::default()
        }
    }
}

impl Shared {
    pub(super) fn new() -> Shared {
        Shared {
            odd: Vec::new(),
            epoll_armed: 0,
            epoll_poll: 0,
            epoll_seq: 1,
            parked: Vec::new(),
        }
    }

    /// What the rare paths keep of `slot`.
    #[inline]
    pub(super) fn odd(&self, slot: u32) -> Odd {
        self.odd.get(slot as usize).copied().unwrap_or_default()
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
    /// Each slot's request record, reachable without the mutex (`slots.rs`).
    pub(super) reqs: Reqs,
    /// Reaps that found completions posted, so far: unchanged across an enter
    /// and the reap after it, nothing was posted (a signal ended the enter, not
    /// a completion). Written by the leader only.
    pub(super) reaped: AtomicU64,
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
            reqs: Reqs::new(),
            reaped: AtomicU64::new(0),
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
        self.shared.lock(&self.handover)
    }

    /// One write to the waker eventfd, which completes its multishot poll once:
    /// EINTR is retried, and a full counter (EAGAIN, which no write would then
    /// complete the poll with) is read back to 0 and written again.
    pub(super) fn write_waker(&self) -> io::Result<()> {
        loop {
            match rustix::io::write(&self.waker, &1u64.to_ne_bytes()) {
                Ok(_) => return Ok(()),
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => {
                    // Another writer's reset may have emptied it first: either
                    // way the next write completes the poll.
                    let _ = rustix::io::read(&self.waker, &mut [0u8; 8]);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Pushes under the mutex; a push that had to submit a full queue is counted.
    /// A slot's poll request is counted in flight by the caller, in the slot's
    /// word, before the push (a thread that submits it may take its completion
    /// at once).
    #[inline(always)]
    pub(super) fn push(
        &self,
        _held: &mut Shared,
        entry: &squeue::Entry,
    ) -> Result<(), KernelError> {
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

    /// Sets what the rare paths keep of `slot` (under the mutex), and the slot's
    /// [`ODD`] flag with it.
    pub(super) fn set_odd(&self, g: &mut Shared, slot: u32, odd: Odd) {
        let i = slot as usize;
        if i >= g.odd.len() {
            if odd == Odd::default() {
                return;
            }
            g.odd.resize(i + 1, Odd::default());
        }
        g.odd[i] = odd;
        let req = self.reqs.get_or_grow(slot);
        if odd == Odd::default() {
            req.word.fetch_and(!ODD, Ordering::AcqRel);
        } else {
            req.word.fetch_or(ODD, Ordering::AcqRel);
        }
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
