//! The ring's side of the hand-over (`handover.rs`): its `io_uring_enter`
//! calls, the eventfd write that kicks a leader out of the kernel, and the
//! [`RingOps`] the protocol runs on.

use super::ring::{Ring, ENTRIES};
use super::slots::inflight;
use crate::backend::{EventSink, RawEvent};
use crate::deadline::Countdown;
use crate::stats::Count;
use crate::uring_handover::{Handover, RingOps};
use io_uring::types;
use rustix::fd::AsFd;
use rustix::io::Errno;
use std::io;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl Ring {
    /// The wait (see "Several waiters on one ring" on `Uring`): the hand-over's,
    /// with a deadline taken at the first turn. Returns whether it consumed a
    /// wake-up.
    #[inline(always)]
    pub(super) fn wait<S: EventSink>(
        &self,
        sink: &mut S,
        scratch: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        if timeout.is_none() {
            // No deadline: nothing to count down.
            return self.handover.wait(self, sink, scratch, max.max(1), || None);
        }
        let deadline = Countdown::new(timeout);
        self.handover
            .wait(self, sink, scratch, max.max(1), || deadline.left())
    }

    /// The binary waker (see the module docs of `handover.rs`).
    pub(super) fn wake(&self) -> io::Result<()> {
        self.handover.wake(self)
    }

    /// One `io_uring_enter` that submits `to_submit` entries (the submission
    /// queue's length read under the mutex) and waits for a completion for at
    /// most `timeout` (`None`: no limit). Timing out is `Ok`. Returns how many
    /// entries it submitted: the kernel answers that count, not EINTR, when a
    /// signal ends the wait of an enter that submitted something.
    #[inline(always)]
    fn enter_for(&self, to_submit: u32, timeout: Option<Duration>) -> io::Result<usize> {
        self.counters.one(Count::Wait);
        let Some(t) = timeout else {
            // What `submit_and_wait(1)` enters with on this ring (no SQPOLL, no
            // IOPOLL, no deferred task work: GETEVENTS alone), with the length
            // the caller read under the mutex instead of its reads of the
            // queue's length and flags, and rustix's system call instead of
            // libc's `syscall`. The kernel waits only if it submitted all
            // `to_submit` (else it answers the count at once, and the caller
            // looks again).
            // SAFETY: no argument structure is passed, and the queued entries
            // (polls and removes) refer to no memory of ours.
            let r = unsafe {
                rustix::io_uring::io_uring_enter(
                    self.ring.as_fd(),
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

    /// The submission queue's length (under the mutex).
    #[inline(always)]
    fn to_submit(&self) -> u32 {
        let _held = self.lock();
        // SAFETY: under the mutex: the only submission queue handle; it only reads
        // the queue's length.
        let sq = unsafe { self.ring.submission_shared() };
        let n = sq.len() as u32;
        // Nothing pushed: no tail to write back (the drop would store it).
        std::mem::forget(sq);
        n
    }
}

impl RingOps for Ring {
    #[inline(always)]
    fn reap<S: EventSink>(&self, _h: &Handover, sink: &mut S, room: usize) -> io::Result<usize> {
        Ring::reap(self, sink, room)
    }

    #[inline(always)]
    fn reaped(&self) -> u64 {
        self.reaped.load(Ordering::Relaxed)
    }

    fn reap_parking(&self, h: &Handover) -> io::Result<()> {
        let mut parked: Vec<RawEvent> = Vec::new();
        let r = Ring::reap(self, &mut parked, usize::MAX);
        if !parked.is_empty() {
            let mut g = self.lock();
            g.parked.append(&mut parked);
            h.park();
        }
        r.map(drop)
    }

    fn take_parked<S: EventSink>(&self, h: &Handover, sink: &mut S, room: usize) -> usize {
        let mut g = self.lock();
        let n = g.parked.len().min(room);
        for ev in g.parked.drain(..n) {
            sink.event(ev);
        }
        if g.parked.is_empty() {
            h.unpark();
        }
        n
    }

    fn queued(&self) -> bool {
        self.to_submit() > 0
    }

    #[inline(always)]
    fn enter(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let to_submit = self.to_submit();
        self.note_submitter();
        Ok(self.enter_for(to_submit, timeout)? > 0)
    }

    fn enter_depart(&self) -> io::Result<()> {
        self.note_submitter();
        self.counters.one(Count::CtlCall);
        self.ring.submitter().submit_and_wait(1).map(drop)
    }

    fn enter_nowait(&self) -> io::Result<()> {
        self.note_submitter();
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

    fn submit(&self) -> io::Result<()> {
        self.note_submitter();
        self.counters.one(Count::CtlCall);
        self.ring.submit().map(drop)
    }

    fn kick(&self) -> io::Result<()> {
        self.counters.one(Count::Wake);
        // A full counter is read back and written again, EINTR written again: a
        // refused write completes nothing on the multishot poll.
        self.write_waker()
    }

    fn inflight(&self, slot: u32) -> u32 {
        self.reqs
            .get(slot)
            .map_or(0, |r| inflight(r.word.load(Ordering::Acquire)))
    }
}
