//! Half-closed sockets: the private epoll instance that watches the write-only
//! armings a poll request cannot (see "Half-closed sockets" on `Uring`).

use super::ring::{fd_ref, Odd, Ring, Shared, EPOLL_SLOT};
use super::slots::{self, fd_of, generation};
use super::submit::poll_add;
use crate::backend::RawEvent;
use crate::event::Readiness;
use crate::state::KernelError;
use crate::stats::Count;
use crate::token::{pack64, unpack64};
use io_uring::squeue;
use rustix::event::epoll::{self, EventData, EventFlags};
use rustix::fd::{AsRawFd, OwnedFd, RawFd};
use rustix::io::Errno;
use std::io;
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;

/// Events taken from the private epoll instance per completion of its poll.
pub(super) const EPOLL_BATCH: usize = 32;

impl Ring {
    /// The private epoll instance, made at its first use.
    pub(super) fn private_epoll(&self) -> io::Result<&OwnedFd> {
        if let Some(ep) = self.epoll.get() {
            return Ok(ep);
        }
        // Under the mutex: no other thread makes one meanwhile.
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        Ok(self.epoll.get_or_init(|| ep))
    }

    /// Watches the slot's descriptor for the rest of its latest arming (its
    /// generation in the slot's word) in the private epoll instance: `EPOLLOUT
    /// | EPOLLONESHOT`, MOD where an entry may exist and ADD where not, each
    /// falling back to the other (ENOENT, EEXIST). Returns the poll on the
    /// instance's descriptor to queue, if none is pending. On failure the slot
    /// is left with nothing pending. The arming has no poll request pending.
    pub(super) fn epoll_watch(
        &self,
        g: &mut Shared,
        slot: u32,
    ) -> Result<Option<squeue::Entry>, KernelError> {
        let p = g.odd(slot);
        let req = self.reqs.get_or_grow(slot);
        let user_data = pack64(slot, generation(req.word.load(Ordering::Acquire)));
        let fd = fd_of(slot);
        let r = self
            .private_epoll()
            .map_err(KernelError::Other)
            .and_then(|ep| {
                let data = EventData::new_u64(user_data);
                let flags = EventFlags::OUT | EventFlags::ONESHOT;
                let mut modify = p.in_epoll;
                for _ in 0..2 {
                    self.counters.one(Count::CtlCall);
                    let r = if modify {
                        epoll::modify(ep, fd_ref(fd), data, flags)
                    } else {
                        epoll::add(ep, fd_ref(fd), data, flags)
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
            self.set_odd(
                g,
                slot,
                Odd {
                    in_epoll: true, // it may be there: a later delete tries
                    ..p.idle()
                },
            );
            return Err(e);
        }
        if !p.via_epoll {
            g.epoll_armed += 1;
        }
        self.set_odd(
            g,
            slot,
            Odd {
                via_epoll: true,
                in_epoll: true,
                half_closed: true,
                ..p
            },
        );
        Ok(self.epoll_poll(g))
    }

    /// Deletes the registration's entry (descriptor `fd`) from the private epoll
    /// instance, if it may have one (ENOENT, EBADF and EPERM mean it is gone
    /// already).
    /// Nothing is pending there after.
    pub(super) fn epoll_forget(
        &self,
        g: &mut Shared,
        slot: u32,
        fd: RawFd,
    ) -> Result<(), KernelError> {
        let p = g.odd(slot);
        if !p.in_epoll {
            return Ok(());
        }
        if p.via_epoll {
            g.epoll_armed -= 1;
            self.set_odd(
                g,
                slot,
                Odd {
                    in_epoll: false,
                    ..p.idle()
                },
            );
        } else {
            self.set_odd(
                g,
                slot,
                Odd {
                    in_epoll: false,
                    ..p
                },
            );
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
    pub(super) fn epoll_poll(&self, g: &mut Shared) -> Option<squeue::Entry> {
        if g.epoll_poll != 0 || g.epoll_armed == 0 {
            return None;
        }
        let ep = self.epoll.get()?;
        g.epoll_seq = g.epoll_seq.wrapping_add(1).max(2);
        g.epoll_poll = g.epoll_seq;
        Some(poll_add(
            ep.as_raw_fd(),
            libc::POLLIN as u32,
            pack64(EPOLL_SLOT, g.epoll_poll),
        ))
    }

    /// The private epoll instance reported readable: takes at most `room` of its
    /// events (`epoll_wait` with timeout 0) into `out`, current armings only.
    pub(super) fn epoll_take(&self, g: &mut Shared, out: &mut Vec<RawEvent>, room: usize) {
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
            let odd = g.odd(slot);
            let current = odd.via_epoll
                && self.reqs.get(slot).is_some_and(|r| {
                    slots::generation(r.word.load(Ordering::Acquire)) == generation
                });
            if !current {
                self.counters.one(Count::Stale);
                continue;
            }
            // The oneshot entry is disabled by its report and stays for the next
            // write-only arming (a MOD).
            g.epoll_armed -= 1;
            self.set_odd(g, slot, odd.idle());
            out.push(RawEvent {
                slot,
                stamp: generation,
                readiness: Readiness::from_epoll(flags.bits()),
            });
        }
    }
}
