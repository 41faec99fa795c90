//! The blocking backend: the oneshot contract kept in user space over poll(2).
//!
//! The documentation is on [`Blocking`], where rustdoc shows it.

use crate::backend::{Backend, Driver, RawEvent, Tag};
use crate::deadline::Countdown;
use crate::event::Readiness;
use crate::interest::Interest;
use crate::pipe;
use crate::state::KernelError;
use crate::stats::{Count, Counters};
use rustix::event::{PollFd, PollFlags};
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// One registration in the set.
#[derive(Clone, Copy, Debug)]
struct Reg {
    fd: RawFd,
    /// `Some` while armed.
    armed: Option<Interest>,
    generation: u32,
}

/// The registrations and the waiters polling them.
#[derive(Debug, Default)]
struct Set {
    /// By slot: the order a wait's scan follows.
    regs: BTreeMap<u32, Reg>,
    /// Where the next scan starts: the slot after the last one delivered.
    cursor: u32,
    /// Bumped by every arm.
    version: u64,
    /// The version of the snapshot each waiter is polling now (one entry per
    /// waiter, from its snapshot until poll(2) returned).
    polling: Vec<u64>,
}

impl Set {
    /// Whether a waiter is polling a snapshot older than the current set: it has
    /// been woken for an arm and has not yet seen it.
    fn stale_waiter(&self) -> bool {
        self.polling.iter().any(|&v| v != self.version)
    }
}

/// The blocking backend: the oneshot contract kept in user space over poll(2).
///
/// Chosen at compile time on Unix targets with neither epoll nor kqueue, forced
/// elsewhere by `--cfg pollshot_force_blocking`, and always nameable as
/// `pollshot::backends::Blocking`.
///
/// - add, re-arm, quiet and delete change an in-memory set: no system call. An arm
///   made while threads are blocked in poll(2) wakes them (one pipe write) so that
///   they poll the new set; a quiet needs no wake (what it removes is checked
///   again before anything is delivered). The set has a version, bumped by each
///   arm, and the pipe is drained only once no blocked waiter polls a set older
///   than the current one: a waiter that returns early cannot take the wake-up
///   meant for another one still polling without the new arm.
/// - a delete made while threads are blocked in poll(2) is an arm's opposite: a
///   thread in poll(2) holds a reference to every file in its set, so the delete
///   bumps the version, wakes them (one pipe write) and returns once each waiter
///   that polled an older set has returned from poll(2). When `deregister`
///   returns no poll(2) call holds the descriptor, and a `close` right after
///   releases it. With no thread in poll(2) it costs nothing; the wake-up is the
///   arm's, so a notify's count is untouched.
/// - a wait polls every armed descriptor and the waker pipe; each reported
///   descriptor that is still armed with the same generation is disarmed in the set
///   and delivered, so one arming gives one delivery even with several waiters.
/// - fairness: the set is ordered by slot, and each wait's scan starts right after
///   the last registration the previous wait delivered (wrapping), so with `N`
///   registrations ready and room for `c` per deliver, every one of them is served
///   within `ceil(N / c)` delivers.
/// - descriptors poll(2) cannot watch do not exist here: regular files are always
///   ready. A closed number (`POLLNVAL`) is dropped from the set and reported
///   nothing, as epoll drops a closed descriptor: the registration's next re-arm
///   finds it gone (ENOENT), re-adds it, and the first-arm check answers EBADF.
/// - the waker is the pipe: a `Driver::wake` sets a flag and writes a byte; every
///   waiter polling wakes (poll(2) has no exclusive wake-up), and the first to take
///   the flag is the one woken; the others find their set changed or nothing, and
///   poll again.
#[derive(Debug)]
pub struct Blocking {
    set: Mutex<Set>,
    /// Signalled when a waiter that polled an older set returns from poll(2).
    caught_up: Condvar,
    wake_r: OwnedFd,
    wake_w: OwnedFd,
    /// A [`Driver::wake`] no wait has taken yet (the wait that takes it returns).
    user_woken: AtomicBool,
    /// A byte is in the pipe and not drained: further wakes skip the write.
    woken: AtomicBool,
    counters: Counters,
}

impl Backend for Blocking {}

impl Blocking {
    fn set(&self) -> MutexGuard<'_, Set> {
        self.set.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes every waiter's poll(2) return (one pipe byte, unless one is there).
    /// A write the kernel refused leaves no byte there: the next kick writes.
    fn kick(&self) -> io::Result<()> {
        if self.woken.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.counters.one(Count::Wake);
        let r = pipe::wake(&self.wake_w);
        if r.is_err() {
            self.woken.store(false, Ordering::Release);
        }
        r
    }

    fn arm_in_set(
        &self,
        fd: RawFd,
        tag: Tag,
        interest: Interest,
        must_exist: bool,
    ) -> Result<(), KernelError> {
        let (before, waiters) = {
            let mut set = self.set();
            if must_exist && !set.regs.contains_key(&tag.slot) {
                return Err(KernelError::NotFound);
            }
            let before = set.regs.insert(
                tag.slot,
                Reg {
                    fd,
                    armed: Some(interest),
                    generation: tag.generation,
                },
            );
            set.version = set.version.wrapping_add(1);
            (before, !set.polling.is_empty())
        };
        // A waiter that took its snapshot before this arm is listed in `polling`
        // (both under the set's lock): wake it to poll the new set. The byte stays
        // in the pipe until every such waiter has returned from poll(2) (`wait`).
        if waiters {
            if let Err(e) = self.kick() {
                self.unarm(tag.slot, before);
                return Err(KernelError::Other(e));
            }
        }
        Ok(())
    }

    /// Takes back an arm whose wake-up was refused: the registration is as it
    /// was `before` (the state machine keeps it unchanged on an error, and arms
    /// it again with the same generation). Left in the set, a waiter polling
    /// later would report the refused arming, and its report could complete the
    /// next arming, of another interest, under the same generation. The
    /// registration's lock, which the poller holds across the command, keeps
    /// every other command for the slot out meanwhile.
    #[cold]
    fn unarm(&self, slot: u32, before: Option<Reg>) {
        let mut set = self.set();
        match before {
            Some(reg) => set.regs.insert(slot, reg),
            None => set.regs.remove(&slot),
        };
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
    if interest.is_priority() {
        f |= PollFlags::PRI;
    }
    f
}

/// Readiness from poll(2)'s `revents`: converted to epoll's bit values (the same
/// numbers on Linux) and decoded by the rules every backend shares.
fn readiness(revents: PollFlags) -> Readiness {
    let mut bits = 0;
    for (flag, bit) in [
        (PollFlags::IN, 0x001),
        (PollFlags::PRI, 0x002),
        (PollFlags::OUT, 0x004),
        (PollFlags::ERR, 0x008),
        (PollFlags::HUP, 0x010),
    ] {
        if revents.contains(flag) {
            bits |= bit;
        }
    }
    #[cfg(all(
        any(target_os = "linux", target_os = "android"),
        not(any(target_arch = "sparc", target_arch = "sparc64"))
    ))]
    if revents.contains(PollFlags::RDHUP) {
        bits |= 0x2000;
    }
    Readiness::from_epoll(bits)
}

/// The longest single condition-variable wait (the loop around it goes on).
const HOUR: Duration = Duration::from_secs(3600);

/// The descriptor is valid: `fcntl(F_GETFD)` succeeds.
fn is_open(fd: RawFd) -> bool {
    // SAFETY: the number only goes to fcntl(2), which answers EBADF for a closed one.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    rustix::io::fcntl_getfd(borrowed).is_ok()
}

impl Driver for Blocking {
    const NAME: &'static str = "blocking";
    const TAG_IS_GENERATION: bool = true;
    const SPLIT_FILTERS: bool = false;

    fn new() -> io::Result<Blocking> {
        let (wake_r, wake_w) = pipe::nonblocking_pipe()?;
        Ok(Blocking {
            set: Mutex::new(Set::default()),
            caught_up: Condvar::new(),
            wake_r,
            wake_w,
            user_woken: AtomicBool::new(false),
            woken: AtomicBool::new(false),
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

    /// A quiet of an entry poll(2) dropped (`POLLNVAL`) answers as epoll's MOD of a
    /// closed descriptor does: EBADF (one `fcntl(F_GETFD)`, on this rare path only),
    /// or ENOENT if the number was reused.
    fn quiet(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        self.counters.one(Count::Quiet);
        if let Some(reg) = self.set().regs.get_mut(&tag.slot) {
            reg.armed = None;
            reg.generation = tag.generation;
            return Ok(());
        }
        Err(if is_open(fd) {
            KernelError::NotFound
        } else {
            KernelError::BadFd
        })
    }

    /// A waiter blocked in poll(2) holds a reference to every file in its set,
    /// and the set it polls may hold this descriptor (a snapshot taken while it
    /// was armed). So a delete made while waiters are polling bumps the set's
    /// version, wakes them (one pipe write, unless a byte is there) and waits
    /// until every waiter that polled an older set has returned from poll(2)
    /// (they poll the new set, without this descriptor, next); with no waiter
    /// polling it costs nothing.
    fn delete(&self, _fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        self.counters.one(Count::Delete);
        let mut set = self.set();
        let Some(reg) = set.regs.remove(&tag.slot) else {
            return Err(KernelError::NotFound);
        };
        if set.polling.is_empty() {
            return Ok(());
        }
        set.version = set.version.wrapping_add(1);
        let version = set.version;
        drop(set);
        // As for an arm, the byte stays in the pipe until no waiter polls a set
        // older than the current one (`wait`), so none of them can miss it.
        if let Err(e) = self.kick() {
            // Not deleted: the waiters were not told. The registration stays in
            // the set, disarmed (the poller keeps it idle), for the retry.
            self.set().regs.insert(tag.slot, Reg { armed: None, ..reg });
            return Err(KernelError::Other(e));
        }
        let mut set = self.set();
        while set.polling.iter().any(|&v| v < version) {
            set = self
                .caught_up
                .wait(set)
                .unwrap_or_else(PoisonError::into_inner);
        }
        Ok(())
    }

    fn wait(
        &self,
        out: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        let deadline = Countdown::new(timeout);
        let mut remaining = deadline.left();
        loop {
            // A snapshot of the armed set in scan order (from the cursor, wrapping),
            // (slot, generation) beside each pollfd, and this waiter listed with its
            // version: an arm after this point wakes it (see `arm_in_set`).
            let (armed, version) = {
                let mut set = self.set();
                let cursor = set.cursor;
                let armed: Vec<(u32, Reg)> = set
                    .regs
                    .range(cursor..)
                    .chain(set.regs.range(..cursor))
                    .filter(|(_, r)| r.armed.is_some())
                    .map(|(&s, &r)| (s, r))
                    .collect();
                let version = set.version;
                set.polling.push(version);
                (armed, version)
            };
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
            // poll(2) counts milliseconds on most targets: clamp to what fits; the
            // loop below keeps waiting until the real deadline.
            let ts = remaining.map(|t| {
                let t = t.min(Duration::from_millis(i32::MAX as u64));
                rustix::event::Timespec {
                    tv_sec: t.as_secs() as _,
                    tv_nsec: t.subsec_nanos() as _,
                }
            });
            self.counters.one(Count::Wait);
            let r = rustix::event::poll(&mut fds, ts.as_ref());
            let mut set = self.set();
            if let Some(i) = set.polling.iter().position(|&v| v == version) {
                set.polling.swap_remove(i);
            }
            if version != set.version {
                self.caught_up.notify_all();
            }
            // This waiter is off the list before an error (EINTR) is returned.
            let n = r?;
            let mut user_notify = false;
            let mut left_for_others = false;
            if n > 0 && !fds[0].revents().is_empty() {
                // Another waiter still polls a set older than an arm: the byte is
                // its wake-up too. Leave it; the last such waiter drains it.
                if set.stale_waiter() {
                    left_for_others = true;
                } else {
                    self.counters
                        .bump(Count::WakeRead, pipe::drain(&self.wake_r));
                    self.woken.store(false, Ordering::Release);
                }
                user_notify = self.user_woken.swap(false, Ordering::AcqRel);
            }
            if n > 0 {
                let mut last = None;
                for ((slot, seen), pfd) in armed.iter().zip(&fds[1..]) {
                    if out.len() >= max {
                        break;
                    }
                    let revents = pfd.revents();
                    if revents.is_empty() {
                        continue;
                    }
                    // Deliver only if still armed for the same generation: another
                    // waiter may have taken it, or it was disarmed or re-armed.
                    let Some(reg) = set.regs.get_mut(slot) else {
                        continue;
                    };
                    if reg.armed.is_none() || reg.generation != seen.generation {
                        continue;
                    }
                    if revents.contains(PollFlags::NVAL) {
                        // Closed: dropped, as epoll drops a closed descriptor.
                        set.regs.remove(slot);
                        continue;
                    }
                    reg.armed = None;
                    out.push(RawEvent {
                        slot: *slot,
                        stamp: reg.generation,
                        readiness: readiness(revents),
                    });
                    last = Some(*slot);
                }
                if let Some(slot) = last {
                    set.cursor = slot.wrapping_add(1);
                }
            }
            drop(set);
            if !out.is_empty() || user_notify {
                return Ok(user_notify);
            }
            // Woken only to see a changed set, or every report was taken by another
            // waiter: poll again for the time left.
            remaining = deadline.left();
            if remaining == Some(Duration::ZERO) {
                return Ok(false);
            }
            if left_for_others {
                // Polling again now would return at once (the byte is still in the
                // pipe): wait for the waiters it is for, which it has woken, to
                // return from poll(2), up to the time left.
                let mut set = self.set();
                while set.stale_waiter() {
                    let t = remaining.map_or(HOUR, |t| t.min(HOUR));
                    let (guard, waited) = self
                        .caught_up
                        .wait_timeout(set, t)
                        .unwrap_or_else(PoisonError::into_inner);
                    set = guard;
                    if waited.timed_out() && remaining.is_some() {
                        break;
                    }
                }
                remaining = deadline.left();
                if remaining == Some(Duration::ZERO) {
                    return Ok(false);
                }
            }
        }
    }

    fn wake(&self) -> io::Result<()> {
        self.user_woken.store(true, Ordering::Release);
        self.kick()
    }

    fn reinit_after_fork(&mut self) -> io::Result<()> {
        // Nothing is in a kernel; only the waker pipe is shared with the parent.
        let (r, w) = pipe::nonblocking_pipe()?;
        self.wake_r = r;
        self.wake_w = w;
        // No thread but this one exists in the child: nobody is polling. One
        // may have been arming or polling when the parent forked.
        crate::fork::replace_inherited(&mut self.set, Mutex::new(Set::default()));
        *self.user_woken.get_mut() = false;
        *self.woken.get_mut() = false;
        Ok(())
    }

    fn owns_fd(&self, fd: RawFd) -> bool {
        fd == self.wake_r.as_raw_fd() || fd == self.wake_w.as_raw_fd()
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    /// A backend whose waker refuses every write: its write end is a copy of
    /// the pipe's read end, which write(2) answers with EBADF. The real write
    /// end is returned, to keep open (closed, the read end would poll as hung
    /// up) and to put back.
    fn with_refusing_waker() -> (Blocking, OwnedFd) {
        let mut b = Blocking::new().unwrap();
        let read_end = b.wake_r.try_clone().unwrap();
        let write_end = std::mem::replace(&mut b.wake_w, read_end);
        (b, write_end)
    }

    /// Waits until a thread is polling (listed with its snapshot's version).
    fn until_polling(b: &Blocking) {
        while b.set().polling.is_empty() {
            std::thread::yield_now();
        }
    }

    fn tag(slot: u32, generation: u32) -> Tag {
        Tag {
            slot,
            incarnation: 1,
            generation,
        }
    }

    /// A re-arm whose wake-up of a polling waiter the kernel refused returns the
    /// error, and the state machine then keeps the registration as it was
    /// (idle, its generation unchanged); so must the set. On the old code the
    /// refused arming stayed in the set: the next wait reported it (writable,
    /// generation 2) although the arm had failed, and the state machine, which
    /// arms again with generation 2, could take that report for a later arming
    /// of another interest. 20 trials.
    #[test]
    fn a_refused_arm_leaves_the_set_as_it_was() {
        for trial in 0..20 {
            let (b, write_end) = with_refusing_waker();
            let b = Arc::new(b);
            let (mut peer, sock) = UnixStream::pair().unwrap();
            let (mut other_peer, other) = UnixStream::pair().unwrap();
            let fd = sock.as_raw_fd();
            // Armed readable, delivered: idle at generation 1 (no waiter, no wake-up).
            b.add(fd, tag(5, 1), Interest::READABLE).unwrap();
            peer.write_all(b"x").unwrap();
            let mut out = Vec::new();
            b.wait(&mut out, 8, Some(Duration::from_secs(10))).unwrap();
            assert_eq!(out.len(), 1, "trial {trial}: {out:?}");
            // A waiter polls the set, where only `other` is armed: its readiness
            // ends the wait (the waker cannot).
            b.add(other.as_raw_fd(), tag(6, 1), Interest::READABLE)
                .unwrap();
            let waiter = {
                let b = Arc::clone(&b);
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    b.wait(&mut out, 8, Some(Duration::from_secs(60))).unwrap();
                    out
                })
            };
            until_polling(&b);
            let refused = b.modify(fd, tag(5, 2), Interest::WRITABLE);
            assert!(
                matches!(refused, Err(KernelError::Other(ref e)) if e.raw_os_error() == Some(libc::EBADF)),
                "trial {trial}: {refused:?}"
            );
            other_peer.write_all(b"y").unwrap();
            let got = waiter.join().unwrap();
            assert_eq!(got.len(), 1, "trial {trial}: {got:?}");
            assert_eq!(got[0].slot, 6, "trial {trial}: {got:?}");
            // Nothing else is armed: the refused arm left nothing to report.
            let mut out = Vec::new();
            b.wait(&mut out, 8, Some(Duration::ZERO)).unwrap();
            assert!(
                out.is_empty(),
                "trial {trial}: the refused arm reported {out:?}"
            );
            // The registration is still there, idle: the retry arms it.
            let mut b = Arc::into_inner(b).unwrap();
            b.wake_w = write_end;
            b.modify(fd, tag(5, 2), Interest::WRITABLE).unwrap();
            b.wait(&mut out, 8, Some(Duration::from_secs(10))).unwrap();
            assert_eq!(out.len(), 1, "trial {trial}: {out:?}");
            assert_eq!((out[0].slot, out[0].stamp), (5, 2), "trial {trial}");
        }
    }
}
