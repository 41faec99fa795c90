//! The io_uring backend (Linux, cargo feature `io-uring`): the arm rides on the wait.
//!
//! The documentation is on [`Uring`], where rustdoc shows it.
//!
//! The rooms, each with one job:
//!
//! - `mod.rs`: [`Uring`], its documentation, and the
//!   [`Driver`](crate::backend::Driver) impl that maps the state machine's commands
//!   onto the ring;
//! - `ring.rs`: the ring and the state under its mutex (`Shared`, with `Odd`,
//!   what the rare paths keep per slot), its creation (io_uring_setup(2), the
//!   waker's multishot poll) and the one push into the submission queue;
//! - `slots.rs`: each slot's request record, one word the leader takes the common
//!   completion against without the mutex, in pages allocated on first use;
//! - `lock.rs`: the mutex over that state, without poisoning: a bit of the
//!   hand-over's word, whose release also says whether the ring is held;
//! - `submit.rs`: submission, an arm or a remove of one registration, queued, and
//!   submitted at once where another thread holds the ring (it may be in the
//!   kernel);
//! - `handover.rs`: the hand-over protocol, generic over the ring so that the
//!   loom models (`src/loom_tests/handover.rs`) run it too: one thread at a time
//!   holds the ring (it alone takes completions and waits in the kernel), the
//!   followers, departing deregisters and the binary waker;
//! - `enter.rs`: the ring's side of it, its `io_uring_enter` calls and the
//!   eventfd write;
//! - `complete.rs`: completion routing, each completion taken from the queue sent
//!   where it belongs (the delivery or a stale one, against the slot's word
//!   alone; under the mutex the waker's, a remove's answer, a cancelled request
//!   queued again, a current one that needs more);
//! - `half_closed.rs`: the private epoll instance for write-only armings of
//!   half-closed sockets;
//! - `exit.rs`: fork (a child's copy of the ring is dropped without touching the
//!   parent's) and thread exit (pending requests queued again).

mod complete;
mod depart;
mod enter;
mod exit;
mod half_closed;
mod lock;
mod ring;
mod slots;
mod submit;

use crate::backend::{Backend, Driver, EventSink, RawEvent, Tag};
use crate::interest::Interest;
use crate::state::KernelError;
use crate::stats::{Count, Counters};
use ring::{fd_ref, Ring};
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use rustix::io::Errno;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The io_uring backend (Linux, cargo feature `io-uring`): the arm rides on the wait.
///
/// Every io_uring operation the crate makes is in one folder,
/// [`backends/uring/`](https://docs.rs/crate/pollshot/latest/source/backends/uring/) (io_uring_setup(2),
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
/// - disarm: an `IORING_OP_POLL_REMOVE` of the pending request, if one is pending
///   (none after a delivery), queued the same way. A request that completes before
///   its remove is processed is stale by generation and dropped by the poller; the
///   remove then answers ENOENT, which is fine and ignored.
/// - deregister: the same remove, submitted before `deregister` returns, which
///   returns only once no poll request of the registration is left (`depart.rs`).
///   A request holds a reference to its file until it has ended, and the kernel
///   ends a removed request through task work run by the thread that submitted
///   it (`io_poll_remove` in io_uring/poll.c, then `io_req_task_complete`, which
///   posts the completion and frees the request). So when `deregister` returns
///   the ring holds no reference to the file: a `close` right after it releases
///   the socket (the peer reads EOF, a listener's port can be bound again). The
///   price, once per descriptor: with the ring free, one `io_uring_enter`
///   (counted in `Stats::ctl_calls`) that submits the remove and waits for the
///   request's end, wherever a request may be left (armed, submitted or not;
///   disarmed, its remove not yet answered); none after a delivery. Completions
///   of other registrations it takes meanwhile are kept for the next wait. With
///   the ring held by another thread (in the kernel, or about to be), one
///   `io_uring_enter` that submits, then a futex wait until that thread, which
///   returns for the completion, has taken it. A submitting thread stopped
///   (SIGSTOP, a debugger) delays the deregistration until it runs again. When
///   the kernel refuses the enter (EAGAIN, ENOMEM), `deregister` returns that
///   error, the remove stays queued for the next enter, and a `deregister` of
///   the same registration again finishes the job (EINTR and EBUSY are retried
///   inside). Measured
///   (`cargo bench --bench scale`, one thread, N armed idle sockets): 1.8 µs per
///   deregistration at N = 1,000, 23 µs at 10,000 (epoll: 1.2 and 3.3 µs), the
///   growth the kernel's: it finds the request to remove in a hash table of 16
///   chains for this ring's 512 completion entries (`io_ring_ctx_alloc`).
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
/// is submitted, not when `arm` returns: at the next wait, or at any earlier
/// `io_uring_enter` (another registration's deregister, a full submission queue),
/// which issues every queued request (`io_issue_sqe` in io_uring/io_uring.c looks
/// the number up through `io_assign_file`). A number closed in
/// between completes with `-EBADF`, which is not reported (as epoll drops a closed
/// descriptor): the next re-arm that reaches the backend (one with another
/// interest: the same interest issues nothing, as on epoll) answers `NotFound`,
/// so the state machine's add checks the number and fails with EBADF, and a
/// disarm or delete answers EBADF; a
/// number closed and reused in between watches the new descriptor. The first arm checks the number is open (one `fcntl(F_GETFD)`,
/// so a closed descriptor is refused with EBADF as on epoll); later arms cost
/// nothing. Another: a pending request holds a reference to the open file, so a
/// socket closed while armed without a deregister is not released (its peer sees no
/// EOF) until the request completes or is removed, and a readiness that completes
/// it is delivered, once, with the registration's token (epoll would have dropped
/// the descriptor at the close): deregister before closing.
///
/// # Completions the backend handles itself
///
/// - `-ECANCELED` for the current request: the thread whose `io_uring_enter`
///   submitted it exited (the kernel cancels such a request when it would
///   complete). The same request is queued again, so the arming is not lost.
///   `-ECANCELED` for a removed request is the remove's answer: dropped.
/// - A completion with `POLLERR`: the request completed with the wake-up's mask,
///   which can say less than the socket's state (a listener shut down while armed
///   completes with `POLLERR` alone, no error pending). It is replaced by the
///   state now, one poll(2) with timeout 0 (counted in `Stats::ctl_calls`), so
///   the event means what epoll's would (`repoll` in `complete.rs`).
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
/// The submission queue and the ring's rare state are used under one mutex,
/// held only for pushes and the rare completions, never across
/// `io_uring_enter`: an arm takes it once, an entering wait once (for the
/// queue's length), a wait that finds completions posted not at all. Who may
/// take completions is the hand-over's rule (`handover.rs`): one thread at a time
/// *holds the ring* (the leader), and only it takes completions from the queue
/// or waits in the kernel; it takes the ring with one compare-and-swap and
/// gives it back before `deliver` returns. The others wait on a futex word
/// (futex(2)) for a hand-over: a blocking wait as a *follower*, a `deregister`
/// as a *departing* thread; a wait with a zero timeout takes only a wake-up or
/// parked events and returns.
///
/// Why one thread: a thread waiting in `io_uring_enter` is woken when the
/// completion queue's tail passes the head it read on its way in
/// (`io_cqring_wait` and `io_should_wake` in io_uring/io_uring.c). A completion
/// another thread took first moves the head with it, and the waiter sleeps on
/// for the next one. Before this rule, a `deregister` that waited in the kernel
/// for its request's end, beside threads polling with a zero timeout, could
/// sleep for good: a poll had taken that completion. With one taker, every
/// completion posted ends the leader's enter, and the leader passes on what
/// others wait for: it wakes one follower when it gives the ring back (which
/// takes what it left, or leads next), and wakes departing deregisters when it
/// gives the ring back and before it enters the kernel again holding it. A
/// wake-up reaches a follower through the futex word, the leader through the
/// eventfd (below). The protocol is model-checked with loom on a modelled
/// completion queue whose waits behave as the kernel's.
///
/// The price at T=2: an arm made while the other thread holds the ring costs
/// one `io_uring_enter`, and a hand-over is a futex wake.
///
/// At T=2 that price can be large, and it is the kernel's: a poll request
/// completes through task work run by the thread that submitted it. When that
/// thread is a follower asleep on the futex, or busy in its caller, the kernel
/// must wake or interrupt it to post the completion. Only then is the leader
/// woken, and it hands the ring over with one more wake-up. Measured at T=2 on
/// two cores (`cargo bench --features io-uring --bench pingpong`, docs/performance.md),
/// the shared ring is bimodal: 0.26x to 1.30x epoll's rate at P=1 from run to
/// run, 0.55-1.06x at P=8, 0.70-1.17x at P=64 (the good mode is one thread doing
/// the work while the other sleeps as a follower). Making every waiter block in
/// `io_uring_enter` (no leader) was tried and was no better at T=2, and worse at
/// T=4, because the kernel wakes every thread blocked on a ring for each
/// completion. `IORING_SETUP_COOP_TASKRUN` (with or without
/// `IORING_SETUP_TASKRUN_FLAG`) and submitting only from the leader were measured
/// and not kept: no consistent gain, and the first delays a completion whose
/// submitting thread is running in user space until that thread enters the
/// kernel (4.0 ms, a scheduler tick, instead of 85 µs in a test). A poller per
/// thread (`pollshot-uring-sharded`) has none of this: 1.06-1.83x sharded epoll at
/// T=2 in two runs.
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
/// The same task work reaches a thread's other system calls: a thread whose
/// `deliver` submitted a poll request and that then blocks in a system call of
/// its own, an `epoll_wait` of another event loop for example, has that call end
/// with EINTR when the request completes (20 of 20 trials): the kernel
/// interrupts the submitting thread to run the completion's task work
/// (`io_req_task_work_add`, TWA_SIGNAL). Such a thread must retry EINTR there, as
/// callers of a blocking call should, or leave the ring to threads that only wait
/// on it.
///
/// # The waker
///
/// The binary waker the poller counts notifies on (`src/wake.rs`): a flag the next
/// wait to look takes. With no waiter blocked it costs no system call; with a
/// follower waiting, a futex wake; with only the leader blocked in the
/// kernel, one eventfd write, which completes the eventfd's multishot
/// `IORING_OP_POLL_ADD` (one completion per write; read back only to empty a
/// full counter), unless a write is on its way already. A leader that takes
/// that completion before it enters (the write came between its look and its
/// enter) checks the flag before it sleeps. A wait that was not woken makes no
/// system call for the waker. (An `IORING_OP_MSG_RING` to the
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

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uring")
            .field("ring", &self.ring.ring.as_raw_fd())
            .field("waker", &self.ring.waker)
            .finish()
    }
}

impl Backend for Uring {}

impl Driver for Uring {
    const NAME: &'static str = "uring";
    const TAG_IS_GENERATION: bool = true;
    const SPLIT_FILTERS: bool = false;
    // Ordinary data takes a POLLPRI-only request off the wait queue
    // (`Driver::PRIORITY_WITHOUT_READABLE`).
    const PRIORITY_WITHOUT_READABLE: bool = false;

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
        self.ring.remove(fd, tag, false)
    }

    fn delete(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        self.counters.one(Count::Delete);
        self.ring.remove(fd, tag, true)
    }

    #[inline(always)]
    fn wait(
        &self,
        out: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        self.ring.wait(out, &mut Vec::new(), max, timeout)
    }

    /// Each event straight from the completion queue: the leader takes
    /// completions without the ring's mutex (`handover.rs`), so the poller's
    /// table check runs as they are taken, with no copy through `scratch` on
    /// the common paths (the hand-over's rare ones go through it).
    #[inline(always)]
    fn wait_each(
        &self,
        scratch: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
        each: &mut impl EventSink,
    ) -> io::Result<bool> {
        self.ring.wait(each, scratch, max, timeout)
    }

    fn wake(&self) -> io::Result<()> {
        self.ring.wake()
    }

    fn reinit_after_fork(&mut self) -> io::Result<()> {
        // The child has no mapping of the parent's ring (MADV_DONTFORK), and closing
        // its copy of the ring's descriptor leaves the parent's ring alone. The
        // mutex may have been held by a thread that does not exist here: all new.
        // A ring this process made (an earlier call here that failed after making
        // it) is the child's own: dropped whole, unmapped and closed.
        self.abandon_after_fork();
        self.ring = Ring::new(self.counters.clone())?;
        Ok(())
    }

    fn abandon_after_fork(&mut self) {
        if self.ring.forks != crate::fork::count() {
            self.ring.abandoned.store(true, Ordering::Relaxed);
        }
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
    /// The ring's descriptor. It is readable once a completion is posted, but an
    /// arm only queues its request for the next `deliver` to submit: an outer
    /// epoll is not woken for a registration armed since the last `deliver` (see
    /// [`Poller`'s `AsFd`](crate::Poller#impl-AsFd-for-Poller<B>)).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ring.ring.as_fd()
    }
}

#[cfg(all(test, not(loom)))]
mod fork_tests {
    use super::Uring;
    use crate::backend::Driver;

    /// This process's io_uring mappings (`/proc/self/maps`, whose lines name
    /// a ring's memory `anon_inode:[io_uring]`). A forked child has none of its
    /// parent's: the rings are made with `MADV_DONTFORK`.
    fn ring_mappings() -> usize {
        std::fs::read_to_string("/proc/self/maps").map_or(usize::MAX, |m| {
            m.lines().filter(|l| l.contains("io_uring")).count()
        })
    }

    /// `reinit_after_fork` called again in a child (the poller's retry after
    /// a re-add the kernel refused) drops the ring the first call made there
    /// whole, unmapped, and a dropped backend drops it too; the parent's ring
    /// is never touched. On the old code the first child-made ring was taken
    /// for the parent's and only its descriptor closed: each retry left one
    /// ring's mappings behind.
    #[test]
    fn a_reinit_retry_in_a_child_unmaps_the_ring_the_first_call_made() {
        let mut u = Some(Uring::new().unwrap());
        let code = crate::fork::in_forked_child(|| {
            let inherited = ring_mappings();
            let b = u.as_mut().expect("made above");
            let first = b.reinit_after_fork().is_ok();
            let one = ring_mappings();
            let second = b.reinit_after_fork().is_ok();
            let after = ring_mappings();
            b.abandon_after_fork();
            drop(u.take());
            let dropped = ring_mappings();
            [
                inherited == 0,
                first && one > 0,
                second && after == one,
                dropped == 0,
            ]
            .iter()
            .position(|ok| !ok)
            .map_or(0, |i| 10 + i as i32)
        });
        assert_eq!(
            code, 0,
            "10: the child has the parent's ring mapped, 11: the first reinit \
             failed or mapped nothing, 12: the retry failed or left the first \
             child-made ring mapped, 13: the dropped backend left its ring mapped"
        );
        let u = u.expect("the parent's");
        // The parent's ring still works: a wake-up reaches a wait.
        u.wake().unwrap();
        let mut out = Vec::new();
        let woken = u
            .wait(&mut out, 4, Some(std::time::Duration::from_secs(10)))
            .unwrap();
        assert!(woken, "the parent's wait took no wake-up");
    }
}
