//! The blocking backend: the oneshot contract kept in user space over poll(2).
//!
//! Chosen at compile time on Unix targets with neither epoll nor kqueue, forced
//! elsewhere by `--cfg pollshot_force_blocking`, and always nameable as
//! `pollshot::backends::Blocking`.
//!
//! - add, re-arm, quiet and delete change an in-memory set: no system call. An arm
//!   made while a thread is blocked in poll(2) wakes it (one pipe write) so that it
//!   polls the new set; a quiet or delete needs no wake (what it removes is checked
//!   again before anything is delivered).
//! - a wait polls every armed descriptor and the waker pipe; each reported
//!   descriptor that is still armed with the same generation is disarmed in the set
//!   and delivered, so one arming gives one delivery even with several waiters.
//! - descriptors poll(2) cannot watch do not exist here: regular files are always
//!   ready, and a closed number reports `POLLNVAL` once, as an error event.

use crate::backend::{Backend, RawEvent, Sealed, Tag};
use crate::event::Readiness;
use crate::pipe;
use crate::state::KernelError;
use crate::stats::{Count, Counters};
use crate::Interest;
use rustix::event::{PollFd, PollFlags};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// One registration in the set.
#[derive(Clone, Copy, Debug)]
struct Reg {
    fd: RawFd,
    /// `Some` while armed.
    armed: Option<Interest>,
    generation: u32,
}

/// The poll(2) backend. See the module docs.
#[derive(Debug)]
pub struct Blocking {
    set: Mutex<HashMap<u32, Reg>>,
    wake_r: OwnedFd,
    wake_w: OwnedFd,
    /// A user notify is pending (a wait returns for it).
    notified: AtomicBool,
    /// The set changed while a waiter was blocked (a wait re-polls for it).
    changed: AtomicBool,
    /// A byte is in the pipe and not drained: further wakes skip the write.
    woken: AtomicBool,
    /// Threads inside poll(2) now.
    waiters: AtomicUsize,
    counters: Counters,
}

impl Sealed for Blocking {}

impl Blocking {
    fn set(&self) -> MutexGuard<'_, HashMap<u32, Reg>> {
        self.set.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wake(&self) -> io::Result<()> {
        if self.woken.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.counters.one(Count::Wake);
        pipe::wake(&self.wake_w)
    }

    fn arm_in_set(
        &self,
        fd: RawFd,
        tag: Tag,
        interest: Interest,
        must_exist: bool,
    ) -> Result<(), KernelError> {
        {
            let mut set = self.set();
            if must_exist && !set.contains_key(&tag.slot) {
                return Err(KernelError::NotFound);
            }
            set.insert(
                tag.slot,
                Reg {
                    fd,
                    armed: Some(interest),
                    generation: tag.generation,
                },
            );
        }
        // Pairs with the waiter's count-then-snapshot in `wait`: either the waiter's
        // snapshot holds this change, or this load sees the waiter and wakes it.
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.changed.store(true, Ordering::Release);
            self.wake().map_err(KernelError::Other)?;
        }
        Ok(())
    }
}

fn poll_flags(interest: Interest) -> PollFlags {
    let mut f = PollFlags::empty();
    if interest.is_readable() {
        f |= PollFlags::IN;
        // A peer's shutdown(SHUT_WR) is reported with the data as read-closed, as
        // epoll's EPOLLRDHUP is (scenario P10). POLLHUP alone needs both directions
        // shut down.
        #[cfg(all(
            any(target_os = "linux", target_os = "android"),
            not(any(target_arch = "sparc", target_arch = "sparc64"))
        ))]
        {
            f |= PollFlags::RDHUP;
        }
    }
    if interest.is_writable() {
        f |= PollFlags::OUT;
    }
    f
}

fn readiness(revents: PollFlags) -> Readiness {
    let mut r = Readiness::EMPTY;
    if revents.intersects(PollFlags::IN | PollFlags::PRI) {
        r.insert(Readiness::READABLE);
    }
    if revents.contains(PollFlags::OUT) {
        r.insert(Readiness::WRITABLE);
    }
    #[cfg(all(
        any(target_os = "linux", target_os = "android"),
        not(any(target_arch = "sparc", target_arch = "sparc64"))
    ))]
    if revents.contains(PollFlags::RDHUP) {
        r.insert(Readiness::READABLE.union(Readiness::READ_CLOSED));
    }
    if revents.contains(PollFlags::HUP) {
        r.insert(Readiness::READABLE.union(Readiness::WRITABLE));
        r.insert(Readiness::READ_CLOSED.union(Readiness::WRITE_CLOSED));
    }
    if revents.intersects(PollFlags::ERR | PollFlags::NVAL) {
        r.insert(
            Readiness::ERROR
                .union(Readiness::READABLE)
                .union(Readiness::WRITABLE),
        );
    }
    r
}

/// The descriptor is valid: `fcntl(F_GETFD)` succeeds.
fn is_open(fd: RawFd) -> bool {
    // SAFETY: the number only goes to fcntl(2), which answers EBADF for a closed one.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    rustix::io::fcntl_getfd(borrowed).is_ok()
}

impl Backend for Blocking {
    const NAME: &'static str = "blocking";
    const TAG_IS_GENERATION: bool = true;
    const SPLIT_FILTERS: bool = false;

    fn new() -> io::Result<Blocking> {
        let (wake_r, wake_w) = pipe::nonblocking_pipe()?;
        Ok(Blocking {
            set: Mutex::new(HashMap::new()),
            wake_r,
            wake_w,
            notified: AtomicBool::new(false),
            changed: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            waiters: AtomicUsize::new(0),
            counters: Counters::default(),
        })
    }

    /// The first arm checks the number is open (one `fcntl(F_GETFD)`, so a closed
    /// descriptor is refused with EBADF as on the kernel backends); later arms cost
    /// no system call.
    fn add(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        self.counters.one(Count::Add);
        if !is_open(fd) {
            return Err(KernelError::BadFd);
        }
        self.arm_in_set(fd, tag, interest, false)
    }

    fn modify(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        self.counters.one(Count::Modify);
        self.arm_in_set(fd, tag, interest, true)
    }

    fn quiet(&self, _fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        self.counters.one(Count::Quiet);
        match self.set().get_mut(&tag.slot) {
            Some(reg) => {
                reg.armed = None;
                reg.generation = tag.generation;
                Ok(())
            }
            None => Err(KernelError::NotFound),
        }
    }

    fn delete(&self, _fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        self.counters.one(Count::Delete);
        match self.set().remove(&tag.slot) {
            Some(_) => Ok(()),
            None => Err(KernelError::NotFound),
        }
    }

    fn wait(
        &self,
        out: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<()> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut remaining = timeout;
        loop {
            // Count this waiter before the snapshot: an arm that lands after the
            // snapshot then sees the waiter and wakes it (see `arm_in_set`).
            self.waiters.fetch_add(1, Ordering::SeqCst);
            // A snapshot of the armed set: (slot, generation) beside each pollfd.
            let armed: Vec<(u32, Reg)> = self
                .set()
                .iter()
                .filter(|(_, r)| r.armed.is_some())
                .map(|(&s, &r)| (s, r))
                .collect();
            let mut fds = Vec::with_capacity(armed.len() + 1);
            fds.push(PollFd::new(&self.wake_r, PollFlags::IN));
            for (_, reg) in &armed {
                // SAFETY: the number only goes to poll(2), which reports a closed
                // one as POLLNVAL rather than failing; no I/O is done through it.
                let fd = unsafe { BorrowedFd::borrow_raw(reg.fd) };
                fds.push(PollFd::from_borrowed_fd(
                    fd,
                    poll_flags(reg.armed.unwrap_or(Interest::BOTH)),
                ));
            }
            // A change flagged before this snapshot is in it: poll without blocking
            // once, then loop for the time left.
            let wait = if self.changed.swap(false, Ordering::AcqRel) {
                Some(Duration::ZERO)
            } else {
                // poll(2) counts milliseconds on most targets: clamp to what fits;
                // the loop below keeps waiting until the real deadline.
                remaining.map(|t| t.min(Duration::from_millis(i32::MAX as u64)))
            };
            let ts = wait.map(|t| rustix::event::Timespec {
                tv_sec: t.as_secs() as _,
                tv_nsec: t.subsec_nanos() as _,
            });
            self.counters.one(Count::Wait);
            let r = rustix::event::poll(&mut fds, ts.as_ref());
            self.waiters.fetch_sub(1, Ordering::SeqCst);
            let n = r?;
            let mut user_notify = false;
            if n > 0 && !fds[0].revents().is_empty() {
                self.counters
                    .bump(Count::WakeRead, pipe::drain(&self.wake_r));
                self.woken.store(false, Ordering::Release);
                user_notify = self.notified.swap(false, Ordering::AcqRel);
            }
            if n > 0 {
                let mut set = self.set();
                for (pfd, (slot, seen)) in fds[1..].iter().zip(&armed) {
                    let revents = pfd.revents();
                    if revents.is_empty() || out.len() >= max {
                        continue;
                    }
                    // Deliver only if still armed for the same generation: another
                    // waiter may have taken it, or it was disarmed or re-armed.
                    if let Some(reg) = set.get_mut(slot) {
                        if reg.armed.is_some() && reg.generation == seen.generation {
                            reg.armed = None;
                            out.push(RawEvent {
                                slot: *slot,
                                stamp: reg.generation,
                                readiness: readiness(revents),
                            });
                        }
                    }
                }
            }
            if !out.is_empty() || user_notify {
                return Ok(());
            }
            // Woken only to see a changed set, or every report was taken by another
            // waiter: poll again for the time left.
            remaining = match deadline {
                None if timeout.is_some() => Some(Duration::MAX), // overflowed: huge
                None => None,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(());
                    }
                    Some(d - now)
                }
            };
            if timeout == Some(Duration::ZERO) {
                return Ok(());
            }
        }
    }

    fn notify(&self) -> io::Result<()> {
        self.notified.store(true, Ordering::Release);
        self.wake()
    }

    fn reinit_after_fork(&mut self) -> io::Result<()> {
        // Nothing is in a kernel; only the waker pipe is shared with the parent.
        let (r, w) = pipe::nonblocking_pipe()?;
        self.wake_r = r;
        self.wake_w = w;
        self.set
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        *self.notified.get_mut() = false;
        *self.changed.get_mut() = false;
        *self.woken.get_mut() = false;
        Ok(())
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }
}

impl AsFd for Blocking {
    /// The waker's read end (to nest this poller in another).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.wake_r.as_fd()
    }
}
