//! Submission: the arm and the remove of one registration, queued under the
//! mutex and submitted at once when a leader is blocked in the kernel.

use super::ring::{fd_ref, Pending, Ring, Shared, IDLE, NONE};
use crate::backend::Tag;
use crate::interest::Interest;
use crate::state::KernelError;
use crate::stats::Count;
use crate::token::pack64;
use io_uring::{opcode, types};
use rustix::fd::RawFd;
use rustix::io::Errno;

/// `poll32_events` for an interest.
#[inline]
pub(super) fn poll_events(interest: Interest) -> u32 {
    let mut e = 0;
    if interest.is_readable() {
        e |= (libc::POLLIN | libc::POLLRDHUP) as u32;
    }
    if interest.is_writable() {
        e |= libc::POLLOUT as u32;
    }
    if interest.is_priority() {
        e |= libc::POLLPRI as u32;
    }
    e
}

impl Ring {
    /// Submits what is queued when a leader is blocked in the kernel (it would not
    /// see it until it returns). Called without the mutex.
    #[inline(always)]
    pub(super) fn submit_for_leader(&self, leader: bool) -> Result<(), KernelError> {
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
    pub(super) fn arm(
        &self,
        fd: RawFd,
        tag: Tag,
        interest: Interest,
        rearm: bool,
    ) -> Result<(), KernelError> {
        let user_data = pack64(tag.slot, tag.generation);
        let events = poll_events(interest);
        let leader = {
            let mut guard = self.lock();
            let g = &mut *guard;
            let p = g.slot(tag.slot);
            if p.lost || p.via_epoll || (rearm && p.half_closed) {
                self.arm_rare(g, fd, tag, user_data, events, rearm)?
            } else {
                // The common case: a poll request, where none or one is pending.
                // The pushes come first (they touch only the queue), so that a
                // failed one leaves the slot as it was; then the slot is written
                // and the request counted in flight (by `fast`, unless the slot
                // has an uncounted one already). What the slot knew of a
                // half-closed socket no longer holds after a registration's first
                // arm (`rearm` false); `lost` and `via_epoll` are false already.
                if p.user_data != NONE {
                    self.push_uncounted(&self.remove_entry(p.user_data))?;
                }
                let entry = opcode::PollAdd::new(types::Fd(fd), events)
                    .build()
                    .user_data(user_data);
                self.push_uncounted(&entry)?;
                p.user_data = user_data;
                p.fd = fd;
                p.events = events;
                p.older = 0;
                p.half_closed = false;
                if p.fast {
                    g.count_inflight(tag.slot);
                } else {
                    p.fast = true;
                }
                self.handover.led()
            }
        };
        self.submit_for_leader(leader)
    }

    /// [`arm`](Self::arm) for a slot whose number the kernel reported closed, whose
    /// arming the private epoll instance watches, or whose socket is known
    /// half-closed. Returns whether to submit for a leader blocked in the kernel.
    #[cold]
    #[inline(never)]
    fn arm_rare(
        &self,
        g: &mut Shared,
        fd: RawFd,
        tag: Tag,
        user_data: u64,
        events: u32,
        rearm: bool,
    ) -> Result<bool, KernelError> {
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
            self.push(g, &remove)?;
        }
        // A poll request would complete at once with read-closed.
        let to_epoll = old.half_closed && events & libc::POLLIN as u32 == 0;
        let now = if old.via_epoll && !to_epoll {
            // Back to a poll request: the epoll entry must not report.
            self.epoll_forget(g, tag.slot, fd)?;
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
            match self.epoll_watch(g, tag.slot) {
                Ok(Some(poll)) => {
                    self.push(g, &poll)?;
                    true
                }
                Ok(None) => return Ok(false),
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
            self.push(g, &entry)?;
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
        Ok(self.handover.led())
    }

    /// Removes the slot's pending request or epoll entry, if any. A disarm
    /// (`deregister` false) queues the remove, submitted at once only where a
    /// leader is blocked in the kernel; a deregister also waits until no request
    /// of the slot is left in the kernel (`depart.rs`).
    pub(super) fn remove(&self, fd: RawFd, tag: Tag, deregister: bool) -> Result<(), KernelError> {
        let leader = {
            let mut g = self.lock();
            // Nothing of the registration outlives a disarm or deregister in the
            // private epoll instance.
            self.epoll_forget(&mut g, tag.slot, fd)?;
            let old = std::mem::replace(g.slot(tag.slot), IDLE);
            g.slot(tag.slot).half_closed = old.half_closed;
            // Its request, if any, is still in flight until its completion.
            g.slot(tag.slot).fast = old.fast;
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
            if old.user_data != NONE && !old.via_epoll {
                let remove = self.remove_entry(old.user_data);
                self.push(&mut g, &remove)?;
            }
            if deregister {
                // A request removed earlier (a disarm, a re-arm) may not have
                // ended either.
                let left = g.inflight(tag.slot) > 0;
                drop(g);
                return if left { self.depart(tag.slot) } else { Ok(()) };
            }
            if old.user_data == NONE || old.via_epoll {
                return Ok(());
            }
            self.handover.led()
        };
        self.submit_for_leader(leader)
    }
}
