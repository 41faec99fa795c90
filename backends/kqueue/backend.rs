//! The backend, `Kqueue`: the kqueue, the wait, the waker, and the [`Backend`]
//! contract. Every `kevent` call the backend makes is here, through
//! [`sys::call`]: the waker's registration ([`Kqueue::create`]) and trigger
//! ([`Kqueue::wake`]), change-only submissions ([`Kqueue::submit_now`]), and the
//! wait that carries the queued changes ([`Driver::wait`]). What a command does
//! with the kernel's answers is `command.rs`; where its records travel, `queue.rs`.

use super::changes::{self, Action, Command};
use super::queue::{sync::MutexGuard, Outbox, Queue, Record, Shared, NO_RECORD};
use super::sys::{self, KEvent, Kind};
use crate::backend::{Backend, Driver, RawEvent, Tag};
use crate::deadline::Countdown;
use crate::error::classify;
use crate::event::Readiness;
use crate::interest::Interest;
use crate::state::KernelError;
use crate::stats::{Count, Counters};
use crate::token::unpack_usize;
#[cfg(not(pollshot_rump))]
use rustix::fd::{AsFd, BorrowedFd};
use rustix::fd::{AsRawFd, RawFd};
use std::io;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;

/// Kernel events read per wait (a stack buffer: a wait never allocates).
const BATCH: usize = 256;
/// Queued changes one waiting call carries; the rest ride on the next call.
const CARRY: usize = 64;
/// Records per change-only call (a stack buffer); longer lists go in chunks.
const CHUNK: usize = 8;

enum Waker {
    /// An `EVFILT_USER` knote, ident 0.
    User,
    /// A pipe whose read end is registered level-triggered.
    Pipe { read: sys::Fd, write: sys::Fd },
}

/// The kqueue backend (FreeBSD, DragonFly, NetBSD, OpenBSD, Apple targets):
/// `EV_DISPATCH` on every arm, the changes riding on the next kevent(2) call, and a
/// deregister that has taken effect in the kernel when it returns. The commands it
/// issues and how the kernels differ are documented in the backend's source,
/// [`backends/kqueue/mod.rs`](https://docs.rs/crate/pollshot/latest/source/backends/kqueue/mod.rs).
pub struct Kqueue {
    /// `ManuallyDrop`: in a forked child the number is not ours to close.
    kq: ManuallyDrop<sys::Fd>,
    waker: Waker,
    pub(super) queue: Queue,
    /// A [`Driver::wake`] no wait has taken yet: the wait that takes it returns.
    user_woken: AtomicBool,
    /// A wake-up (trigger or pipe byte) is outstanding: further ones coalesce.
    woken: AtomicBool,
    /// Dropped in a forked child without re-initialising: leave `kq` alone.
    forsaken: bool,
    /// The fork count (`crate::fork`) when `kq` was made: a kqueue made in this
    /// process is its own to close, also in a child (a `reinit_after_fork`
    /// that failed after making it, then called again or dropped).
    made: u64,
    pub(super) counters: Counters,
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

/// The `io::Error` of a kernel errno.
pub(super) fn os(errno: i32) -> io::Error {
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
    pub(super) fn shared(&self) -> MutexGuard<'_, Shared> {
        self.queue.lock()
    }

    fn kq(&self) -> RawFd {
        self.kq.as_raw_fd()
    }

    /// A new kqueue and its waker.
    fn create() -> io::Result<(sys::Fd, Waker)> {
        let kq = sys::new_kqueue()?;
        let (waker, reg) = if sys::USER_WAKER {
            (Waker::User, sys::user_waker(false))
        } else {
            let (read, write) = sys::waker_pipe()?;
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

    /// Submits `batch` (held in `inflight` by the caller) in change-only calls
    /// with `EV_RECEIPT` and an event list as long as the change list, then
    /// releases it. Calls `answer(index, errno)` for every record (0: done).
    pub(super) fn submit_now(&self, batch: &[Record], mut answer: impl FnMut(usize, i32)) {
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
        self.queue.release_batch(batch);
    }

    /// Makes a blocked (or the next) `kevent` return: trigger the user event or
    /// write the pipe, unless a wake-up is already outstanding.
    pub(super) fn kick(&self) -> io::Result<()> {
        if self.woken.swap(true, SeqCst) {
            return Ok(());
        }
        self.counters.one(Count::Wake);
        let r = loop {
            let r = match &self.waker {
                Waker::User => {
                    let mut none: [MaybeUninit<KEvent>; 0] = [];
                    sys::call(self.kq(), &[sys::user_waker(true)], &mut none, None).map(drop)
                }
                Waker::Pipe { write, .. } => sys::wake_pipe(write),
            };
            // A trigger is idempotent: EINTR (libkqueue's eventfd write; a
            // kernel's change-only call does not wait) triggers again.
            match r {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => break r,
            }
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
    const TAG_IS_GENERATION: bool = sys::UDATA_IS_GENERATION;
    const SPLIT_FILTERS: bool = true;
    // `Interest::PRIORITY` has no filter on every kqueue (`EVFILT_EXCEPT` with
    // `NOTE_OOB` on macOS, OpenBSD and DragonFly only): refused for now.
    const PRIORITY: bool = false;

    fn new() -> io::Result<Kqueue> {
        let (kq, waker) = Kqueue::create()?;
        Ok(Kqueue {
            kq: ManuallyDrop::new(kq),
            waker,
            queue: Queue::new(),
            user_woken: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            forsaken: false,
            made: crate::fork::install(),
            counters: Counters::default(),
        })
    }

    /// `EV_ADD | EV_DISPATCH` per filter, submitted at once. A regular file is
    /// reported always ready (one fstat(2) tells), as on epoll: kqueue would
    /// never report a file at its end as readable.
    fn add(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        match sys::is_regular_file(fd) {
            Ok(true) => return Err(KernelError::NotPollable),
            Ok(false) => {}
            Err(e) => return Err(classify(e, &[])),
        }
        self.command(fd, tag, Command::Add(interest), false)
    }

    fn modify(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        self.command(fd, tag, Command::Modify(interest), false)
    }

    fn quiet(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        self.command(fd, tag, Command::Quiet, false)
    }

    /// `EV_DELETE` per added filter, submitted at once after the descriptor's
    /// records in flight have returned, with its queued records ahead of them:
    /// when this returns the kernel has applied them, and nothing of `fd` is
    /// queued or in flight (`queue.rs`, "Ownership").
    fn delete(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        self.command(fd, tag, Command::Delete, false)
    }

    /// `EV_DELETE` per added filter, queued to reach the kernel with the next
    /// command on the number (`Shared::hold_back`).
    fn delete_superseded(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        self.command(fd, tag, Command::Delete, true)
    }

    /// Disables the filters that did not fire, unless a command for the
    /// registration came after the event was read (then that command decided).
    /// The records are routed under the lock that reads the view, so a
    /// deregistration that removed it leaves nothing to send.
    fn delivered(&self, fd: RawFd, tag: Tag, _interest: Interest, _readiness: Readiness) {
        let mut out = Outbox::default();
        {
            let mut sh = self.shared();
            let Some(view) = sh.views.get_mut(&tag.slot) else {
                return;
            };
            if view.incarnation != tag.incarnation || view.fired_at != Some(view.seq) {
                return;
            }
            let udata = sys::tag_udata(Tag {
                generation: view.stamp,
                ..tag
            });
            let plan = changes::after_delivery(fd, udata, view.knotes, view.fired);
            view.knotes = plan.after;
            if plan.is_empty() {
                return;
            }
            view.seq = view.seq.wrapping_add(1);
            let seq = view.seq;
            self.count(Count::Quiet, &plan);
            let own: Vec<Record> = plan
                .changes()
                .map(|change| Record {
                    change,
                    slot: tag.slot,
                    incarnation: tag.incarnation,
                    seq,
                })
                .collect();
            out.route(&mut sh, &own);
        }
        let mut events = Vec::new();
        self.flush(out, &mut events);
        self.defer(events);
    }

    fn wait(
        &self,
        out: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        let max = max.max(1);
        let deadline = Countdown::new(timeout);
        let mut remaining = deadline.left();
        loop {
            // Enter: take the queue (it rides on this call) and count as a waiter.
            // A record whose descriptor is in another thread's call stays queued
            // (it must reach the kernel after that call's records), and so does
            // one of a descriptor being deregistered (`Queue::drain`).
            let mut carried = [NO_RECORD; CARRY];
            let ncarried = {
                let mut sh = self.shared();
                sh.take_deferred(out, max.saturating_sub(out.len()));
                if out.len() >= max {
                    return Ok(false);
                }
                sh.enter_wait(&mut carried)
            };
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
            let again = |r: &&Record| matches!(r.change.action, Action::Enable | Action::Disable);
            let reverify =
                !sys::WAIT_RETURNS_CHANGE_ERRORS && n == 0 && carried.iter().any(|r| again(&r));
            let mut woke = false;
            let mut outbox = Outbox::default();
            let mut refused = Vec::new();
            let drained;
            let mut wake_others;
            {
                let mut sh = self.shared();
                // What is re-asked below stays held, for a change-only call.
                drained = sh.leave_wait(carried, |r| reverify && again(&r));
                let mut errors = Vec::new();
                pair(carried, entries, |i, errno| errors.push((i, errno)));
                for (i, errno) in errors {
                    self.settle(&mut sh, &carried[i], errno, &mut refused, &mut outbox);
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
                    let fd = sys::ident(e) as RawFd;
                    let by_generation = sys::UDATA_IS_GENERATION;
                    if let Some(repair) = sh.note_report(fd, slot, stamp, filter, by_generation) {
                        outbox.route(&mut sh, &[repair]);
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
                wake_others = (!sh.pending.is_empty() || !sh.deferred.is_empty()) && sh.waiters > 0;
            }
            if drained {
                self.queue.released();
            }
            if reverify {
                // Still held in `inflight`, so nothing overtook them; repeating an
                // enable or a disable is harmless.
                let batch: Vec<Record> = carried.iter().filter(again).copied().collect();
                let mut answers = Vec::new();
                self.submit_now(&batch, |i, e| answers.push((i, e)));
                let mut sh = self.shared();
                for (i, errno) in answers {
                    self.settle(&mut sh, &batch[i], errno, &mut refused, &mut outbox);
                }
            }
            if woke {
                if let Waker::Pipe { read, .. } = &self.waker {
                    self.counters.bump(Count::WakeRead, sys::drain_pipe(read));
                }
                // Clear before reading `user_woken`: a notify that lands in between
                // either sees `woken` clear and wakes again, or stored its flag
                // before this read (all SeqCst).
                self.woken.store(false, SeqCst);
                // Likewise for a deregistration draining a record another waiter
                // carries (`Queue::drain`): it registered before it tried to wake
                // (and found `woken` set, so it relied on this wake-up), and
                // `woken` is clear now, so one of the two wakes that waiter.
                let sh = self.shared();
                wake_others |= sh.drain_needs_wake() && sh.waiters > 0;
            }
            let user = woke && self.user_woken.swap(false, SeqCst);
            self.flush(outbox, &mut refused);
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
            remaining = deadline.left();
            if remaining == Some(Duration::ZERO) {
                return Ok(false);
            }
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
        let old = std::mem::replace(&mut self.kq, ManuallyDrop::new(kq));
        if self.made == crate::fork::count() {
            // Made by an earlier call here that failed after making it: the
            // child's own, closed.
            drop(ManuallyDrop::into_inner(old));
        }
        self.made = crate::fork::count();
        // A pipe waker is the child's own copy: dropping it closes only that.
        self.waker = waker;
        // A thread may have been in a command or a wait when the parent forked.
        crate::fork::replace_inherited(&mut self.queue, Queue::new());
        *self.user_woken.get_mut() = false;
        *self.woken.get_mut() = false;
        self.forsaken = false;
        Ok(())
    }

    fn abandon_after_fork(&mut self) {
        // Only a kqueue made before the fork is not this process's to close.
        self.forsaken = self.made != crate::fork::count();
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

// Not on a rump kernel: its kqueue is no host descriptor.
#[cfg(not(pollshot_rump))]
impl AsFd for Kqueue {
    /// The kqueue (to nest this poller in another).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.kq.as_fd()
    }
}

// A rump kernel's process cannot fork.
#[cfg(all(test, not(pollshot_rump)))]
mod fork_tests {
    use super::Kqueue;
    use crate::backend::Driver;
    use rustix::fd::AsRawFd;

    /// `reinit_after_fork` called again in a child (the poller's retry after
    /// a re-add the kernel refused) closes the kqueue the first call made
    /// there, and a dropped backend closes its own. (The number of the kqueue
    /// made before the fork is left alone: a kqueue is not inherited, so the
    /// number may name something else in the child; on libkqueue the child's
    /// first `kqueue()` has answered that same number, so none is assumed.)
    /// On the old code the first child-made kqueue was taken for the parent's
    /// and left open: each retry leaked a descriptor.
    #[test]
    fn a_reinit_retry_in_a_child_closes_the_kqueue_the_first_call_made() {
        let k = Kqueue::new().unwrap();
        // libkqueue frees a closed kqueue later, on its monitoring thread, and
        // a forked child frees the pending ones itself, closing their numbers,
        // which may be this child's by then: none pending at the fork.
        #[cfg(pollshot_libkqueue)]
        {
            extern "C" {
                /// libkqueue's (Linux): returns once its monitoring thread has
                /// freed every kqueue closed so far (`src/linux/platform.c`).
                fn libkqueue_drain_pending_close();
            }
            // SAFETY: takes no arguments; libkqueue is linked and exports it.
            unsafe { libkqueue_drain_pending_close() };
        }
        let mut k = Some(k);
        let code = crate::fork::in_forked_child(|| {
            let open = |fd: i32| {
                // SAFETY: F_GETFD reads the descriptor's flags, on any number.
                let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
                flags != -1
            };
            let b = k.as_mut().expect("made above");
            let first = b.reinit_after_fork().is_ok();
            let made = b.kq.as_raw_fd();
            let second = b.reinit_after_fork().is_ok();
            // Nothing was opened since the retry closed `made`: its number is free.
            let closed = !open(made);
            let last = b.kq.as_raw_fd();
            b.abandon_after_fork();
            drop(k.take());
            [first, second && closed, !open(last)]
                .iter()
                .position(|ok| !ok)
                .map_or(0, |i| 10 + i as i32)
        });
        assert_eq!(
            code, 0,
            "10: the first reinit failed, 11: the retry failed or left the first \
             child-made kqueue open, 12: the dropped backend left its kqueue open"
        );
        let k = k.expect("the parent's");
        // The parent's kqueue still works: a wake-up reaches a wait.
        k.wake().unwrap();
        let mut out = Vec::new();
        let woken = k
            .wait(&mut out, 4, Some(std::time::Duration::from_secs(10)))
            .unwrap();
        assert!(woken, "the parent's wait took no wake-up");
    }
}
