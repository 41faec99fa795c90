//! Several waiters on one ring: the leader blocked in `io_uring_enter`, the
//! followers on the hand-over futex, and the binary waker.

use super::lock::Guard;
use super::ring::{Ring, Shared, ENTRIES};
use crate::backend::RawEvent;
use crate::deadline::Countdown;
use crate::stats::Count;
use io_uring::types;
use rustix::fd::{AsRawFd, BorrowedFd};
use rustix::io::Errno;
use std::io;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The longest single futex wait of a follower (the loop around it goes on).
pub(super) const HOUR: Duration = Duration::from_secs(3600);

impl Ring {
    /// One `io_uring_enter` that submits what is queued (`to_submit`, the
    /// submission queue's length read under the mutex) and waits for a completion
    /// for at most `timeout` (`None`: no limit). Timing out is `Ok`. Returns how
    /// many entries it submitted: the kernel answers that count, not EINTR, when a
    /// signal ends the wait of an enter that submitted something.
    #[inline(always)]
    pub(super) fn enter(&self, to_submit: u32, timeout: Option<Duration>) -> io::Result<usize> {
        self.counters.one(Count::Wait);
        let Some(t) = timeout else {
            // What `submit_and_wait(1)` enters with on this ring (no SQPOLL, no
            // IOPOLL, no deferred task work: GETEVENTS alone), with the length
            // the caller read under the mutex instead of its reads of the
            // queue's length and flags, and rustix's system call instead of
            // libc's `syscall`. The kernel waits only if it submitted all
            // `to_submit` (else it answers the count at once, and the caller
            // looks again).
            // SAFETY: the ring's descriptor is open for as long as `self`; no
            // argument structure is passed, and the queued entries (polls and
            // removes) refer to no memory of ours.
            let r = unsafe {
                rustix::io_uring::io_uring_enter(
                    BorrowedFd::borrow_raw(self.ring.as_raw_fd()),
                    to_submit,
                    1,
                    rustix::io_uring::IoringEnterFlags::GETEVENTS,
                )
            };
            return match r {
                Ok(submitted) => Ok(submitted as usize),
                // ETIME: timed out. EBUSY: completions wait in the overflow list;
                // the reap that follows flushes them.
                Err(Errno::TIME | Errno::BUSY) => Ok(0),
                Err(e) => Err(e.into()),
            };
        };
        // A timespec as long as the kernel accepts: clamp what is huge.
        let t = t.min(Duration::from_secs(1 << 40));
        let ts = types::Timespec::from(t);
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(submitted) => Ok(submitted),
            // As above.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME) | Some(libc::EBUSY)) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// An enter that submits and runs what is due without waiting.
    pub(super) fn enter_nowait(&self) -> io::Result<()> {
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
    #[inline(always)]
    pub(super) fn wait(
        &self,
        out: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        let max = max.max(1);
        let mut g = self.lock();
        // The common case: no limit, no leader, and no wake-up or parked events
        // to take first.
        if timeout.is_none() && !g.leader && !g.woken && g.parked.is_empty() {
            // Completions already posted; no overflow flush for an empty queue,
            // as the enter below flushes one (GETEVENTS).
            let left = self.reap_then(&mut g, out, max, false)?;
            if !out.is_empty() {
                return Ok(self.leave(g, false, left));
            }
            // Nothing posted: lead one enter here, and take what it returned
            // for (the loop in `wait_for` goes on where that is nothing this
            // wait delivers). The reap found the queue empty: what was posted
            // so far is what was taken (one posted since counts as posted
            // across the enter, and this wait takes it).
            let posted = g.reaped;
            let (mut g, submitted) = self.lead(g, None)?;
            if !g.woken && g.parked.is_empty() {
                let left = self.reap(&mut g, out, max)?;
                if !out.is_empty() {
                    // Posted across the enter: not a signal.
                    return Ok(self.leave(g, false, left));
                }
            }
            if self.interrupted(&g, submitted, posted, &Countdown::new(None)) {
                return Err(io::Error::from_raw_os_error(libc::EINTR));
            }
            return self.wait_for(g, out, max, timeout);
        }
        self.wait_for(g, out, max, timeout)
    }

    /// The rest of [`wait`](Self::wait).
    #[inline(never)]
    fn wait_for<'a>(
        &'a self,
        mut g: Guard<'a, Shared>,
        out: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        let deadline = Countdown::new(timeout);
        // Enters made by this call; only "none", "some" and "3 or more" are
        // told apart, so it saturates (a blocked wait goes round once per
        // completion it does not deliver, with no bound).
        let mut polls = 0u8;
        loop {
            let consumed = std::mem::replace(&mut g.woken, false);
            if !g.parked.is_empty() {
                // What a deregister took from the queue while it waited.
                let n = g.parked.len().min(max.saturating_sub(out.len()));
                out.extend(g.parked.drain(..n));
            }
            let left = self.reap(&mut g, out, max)? || !g.parked.is_empty();
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
                polls = polls.saturating_add(1);
                drop(g);
                self.note_submitter();
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
            polls = polls.saturating_add(1);
            let posted = g.reaped + self.queued_completions(&g);
            let submitted;
            (g, submitted) = self.lead(g, remaining)?;
            if self.interrupted(&g, submitted, posted, &deadline) {
                return Err(io::Error::from_raw_os_error(libc::EINTR));
            }
        }
    }

    /// One `io_uring_enter` as the leader (no leader is in the kernel): it
    /// submits what is queued and waits for a completion for at most
    /// `remaining`. Returns the guard, taken again, and whether the enter
    /// submitted anything (then a signal that ended its wait is answered with the
    /// count, not EINTR: [`interrupted`](Self::interrupted) tells it from the
    /// completions posted before the enter, which the caller counts under the
    /// hold of the mutex it passes in).
    #[inline(always)]
    fn lead<'a>(
        &'a self,
        mut g: Guard<'a, Shared>,
        remaining: Option<Duration>,
    ) -> io::Result<(Guard<'a, Shared>, bool)> {
        g.leader = true;
        // SAFETY: under the mutex: the only submission queue handle; it only reads
        // the queue's length.
        let sq = unsafe { self.ring.submission_shared() };
        let to_submit = sq.len() as u32;
        // Nothing pushed: no tail to write back (the drop would store it).
        std::mem::forget(sq);
        drop(g);
        self.note_submitter();
        let r = self.enter(to_submit, remaining);
        let mut g = self.lock();
        g.leader = false;
        g.kicked = false;
        // A follower leads next, or takes what this one has no room for.
        self.left_kernel(&g);
        Ok((g, r? > 0))
    }

    /// After a [`lead`](Self::lead) whose enter `submitted`: nothing was posted
    /// since `posted`, no wake-up was taken and time is left, so a signal ended
    /// the wait (the kernel answered the count, not EINTR).
    #[inline(always)]
    fn interrupted(
        &self,
        g: &Guard<'_, Shared>,
        submitted: bool,
        posted: u64,
        deadline: &Countdown,
    ) -> bool {
        submitted
            && g.reaped + self.queued_completions(g) == posted
            && !g.woken
            && !deadline.passed()
    }

    /// A follower's wait for a hand-over: until the `handoff` word moves on from
    /// `seen`, for at most `timeout`. A signal is `Err(Interrupted)`; a timeout,
    /// a hand-over and a spurious wake-up are `Ok` (the caller looks again).
    pub(super) fn follow(&self, seen: u32, timeout: Option<Duration>) -> io::Result<()> {
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
    pub(super) fn hand_over(&self, _held: &Guard<'_, Shared>) {
        self.handoff.fetch_add(1, Ordering::Relaxed);
        let _ =
            rustix::thread::futex::wake(&self.handoff, rustix::thread::futex::Flags::PRIVATE, 1);
    }

    /// Completions in the queue, not yet taken (under the mutex).
    #[inline(always)]
    pub(super) fn queued_completions(&self, _held: &Guard<'_, Shared>) -> u64 {
        // SAFETY: under the mutex: the only completion queue handle; it only reads
        // the queue's length.
        let cq = unsafe { self.ring.completion_shared() };
        let n = cq.len() as u64;
        // Nothing taken: no head to write back (the drop would store it).
        std::mem::forget(cq);
        n
    }

    /// Returns from a wait: hands what is left (completions, notifies) to a
    /// follower, and submits what the reap queued if a leader is in the kernel.
    #[inline(always)]
    pub(super) fn leave(&self, g: Guard<'_, Shared>, consumed: bool, left: bool) -> bool {
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
    pub(super) fn wake(&self) -> io::Result<()> {
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
        match self.write_waker() {
            Ok(()) => Ok(()),
            Err(e) => {
                let mut g = self.lock();
                g.kicked = false;
                g.woken = false;
                Err(e)
            }
        }
    }
}
