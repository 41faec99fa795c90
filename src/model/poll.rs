//! pollshot's poll(2) backend (`backends/blocking.rs`): an in-memory set keyed by
//! the registration's slot, polled by descriptor number at wait time (a closed
//! number reports `POLLNVAL` and is dropped; a reused number reports the new
//! description), and this family's part of [`Model::wait`], [`Model::view`],
//! [`Model::force_report`] and the [`RegKernel`] translation.

use super::epoll;
use super::{
    Command, Errno, Fd, KernelView, Model, ModelEvent, Origin, RawEvent, Readiness, RegKernel,
};
use crate::interest::Interest;
use crate::token::pack64;
use std::collections::BTreeMap;

/// One entry of the poll(2) backend's set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollEntry {
    /// The descriptor number polled.
    pub fd: Fd,
    /// `Some` while armed.
    pub armed: Option<Interest>,
    /// The generation of the last arm or quiet.
    pub generation: u32,
    /// Who armed it (ground truth).
    pub origin: Origin,
}

/// `POLLRDHUP` as the poll(2) backend asks for it with a readable interest: on
/// Linux and Android only (elsewhere poll(2) has no such bit).
const POLL_RDHUP: u32 = if cfg!(any(target_os = "linux", target_os = "android")) {
    epoll::RDHUP
} else {
    0
};

/// Readiness from poll(2)'s `revents` in epoll bit values, as
/// `backends/blocking.rs` decodes it (the same function:
/// [`Readiness::from_epoll`]). `POLLNVAL` (a closed number) is no event: the backend
/// drops the entry, as epoll drops a closed descriptor.
pub const fn poll_readiness(revents: u32) -> Readiness {
    Readiness::from_epoll(revents)
}

impl Model {
    /// The poll(2) backend's set, by slot.
    pub fn poll_set(&self) -> &BTreeMap<u32, PollEntry> {
        &self.pollset
    }

    /// poll(2)'s part of [`Model::wait`]: every armed entry whose number's
    /// description meets the interest, disarmed; a closed number's entry dropped.
    pub(super) fn poll_wait(&mut self, max: usize) -> Vec<ModelEvent> {
        let mut out = Vec::new();
        let mut closed = Vec::new();
        for (&slot, e) in self.pollset.iter_mut() {
            if out.len() >= max {
                break;
            }
            let Some(interest) = e.armed else { continue };
            let readiness = match self.fds.get(&e.fd) {
                // POLLNVAL: the backend drops the entry, reports nothing.
                None => {
                    closed.push(slot);
                    continue;
                }
                Some(desc) => {
                    let d = &self.descs[desc.0 as usize];
                    let mut asked = epoll::ERR | epoll::HUP;
                    if interest.is_readable() {
                        asked |= epoll::IN | POLL_RDHUP;
                    }
                    if interest.is_writable() {
                        asked |= epoll::OUT;
                    }
                    if interest.is_priority() {
                        asked |= epoll::PRI;
                    }
                    // poll(2) on a regular file: always readable and writable.
                    let have = if d.pollable {
                        d.levels.epoll_bits()
                    } else {
                        epoll::IN | epoll::OUT
                    };
                    let r = asked & have;
                    if r == 0 {
                        continue;
                    }
                    poll_readiness(r)
                }
            };
            e.armed = None;
            out.push(ModelEvent {
                raw: RawEvent {
                    slot,
                    stamp: e.generation,
                    readiness,
                },
                origin: e.origin,
                filter: None,
            });
        }
        for slot in closed {
            self.pollset.remove(&slot);
        }
        out
    }

    /// A submission of io_uring's queue outside a wait, for a harness that mirrors
    /// the io_uring backend (`backends/uring/`) by this set: a deregister's
    /// `io_uring_enter` (it waits for its own requests' end), or a full
    /// submission queue's. The kernel resolves each queued poll request's number
    /// as it issues it (`io_issue_sqe` in io_uring/io_uring.c: `io_assign_file`
    /// takes the file through `io_file_get_normal`, a plain `fget`, and answers
    /// -EBADF where the number is closed), so every armed entry whose number is
    /// closed is dropped, reporting nothing, as [`Model::wait`] drops it for
    /// POLLNVAL; the backend drops such a request alike, and answers a re-arm
    /// `NotFound`. `except`: the slot of the command that submitted, whose new
    /// request is pushed after the submission. An entry whose request was
    /// submitted before its number was closed holds the file in the kernel and
    /// is dropped here all the same (the set cannot tell): a harness ends the run
    /// where that makes the two differ, as it does for [`Model::wait`]'s drop.
    pub fn poll_submitted(&mut self, except: Option<u32>) {
        let fds = &self.fds;
        self.pollset.retain(|&slot, e| {
            e.armed.is_none() || fds.contains_key(&e.fd) || Some(slot) == except
        });
    }

    /// poll(2)'s part of [`Model::view`].
    pub(super) fn poll_view(&self, slot: u32) -> KernelView {
        match self.pollset.get(&slot) {
            None => KernelView::default(),
            Some(e) => KernelView {
                present: true,
                armed: e.armed,
                tag: Some(pack64(slot, e.generation)),
            },
        }
    }

    /// poll(2)'s part of [`Model::force_report`].
    pub(super) fn poll_force_report(&mut self, slot: u32) -> Option<ModelEvent> {
        let e = self.pollset.get_mut(&slot)?;
        let interest = e.armed.take()?;
        let mut bits = 0;
        if interest.is_readable() {
            bits |= epoll::IN;
        }
        if interest.is_writable() {
            bits |= epoll::OUT;
        }
        Some(ModelEvent {
            raw: RawEvent {
                slot,
                stamp: e.generation,
                readiness: poll_readiness(bits),
            },
            origin: e.origin,
            filter: None,
        })
    }
}

impl RegKernel<'_> {
    fn poll_arm(
        &mut self,
        interest: Option<Interest>,
        generation: u32,
        must_exist: bool,
    ) -> Result<(), Errno> {
        if must_exist && !self.model.pollset.contains_key(&self.slot) {
            return Err(Errno::NoEnt);
        }
        self.model.pollset.insert(
            self.slot,
            PollEntry {
                fd: self.fd,
                armed: interest,
                generation,
                origin: self.origin,
            },
        );
        Ok(())
    }

    /// The poll(2) backend's answer to one command (`backends/blocking.rs`).
    pub(super) fn poll(&mut self, command: Command) -> Result<(), Errno> {
        match command {
            Command::Add(i, g) => {
                if self.model.is_open(self.fd) {
                    self.poll_arm(Some(i), g, false)
                } else {
                    Err(Errno::BadF)
                }
            }
            Command::Modify(i, g) => self.poll_arm(Some(i), g, true),
            Command::Quiet(g) => {
                let open = self.model.is_open(self.fd);
                match self.model.pollset.get_mut(&self.slot) {
                    Some(e) => {
                        e.armed = None;
                        e.generation = g;
                        Ok(())
                    }
                    // As the poll(2) backend answers: gone from the set, and the number
                    // closed (EBADF) or open again (ENOENT).
                    None if !open => Err(Errno::BadF),
                    None => Err(Errno::NoEnt),
                }
            }
            Command::Delete => self
                .model
                .pollset
                .remove(&self.slot)
                .map(drop)
                .ok_or(Errno::NoEnt),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Levels, Semantics};
    use super::*;
    use crate::state::{Kernel, KernelError};

    const O: Origin = Origin {
        owner: 1,
        arming: 1,
    };

    #[test]
    fn poll_set_follows_the_number() {
        let mut m = Model::new(Semantics::Poll);
        let a = m.open(true);
        let mut k = m.kernel(a, 0, 0, O);
        k.add(Interest::READABLE, 1).unwrap();
        m.close(a).unwrap();
        assert!(
            m.wait(8).is_empty(),
            "a closed number (POLLNVAL) is dropped, not reported"
        );
        let mut k = m.kernel(a, 0, 0, O);
        assert!(matches!(
            k.modify(Interest::READABLE, 2),
            Err(KernelError::NotFound)
        ));
        assert!(matches!(
            k.add(Interest::READABLE, 2),
            Err(KernelError::BadFd)
        ));
        let b = m.open(true);
        assert_eq!(a, b);
        let mut k = m.kernel(b, 0, 0, O);
        k.add(Interest::READABLE, 2).unwrap();
        let desc = m.description(b).unwrap();
        m.set_levels(desc, Levels::from_bits(1));
        assert_eq!(m.wait(8)[0].raw.stamp, 2);
        let mut k = m.kernel(a, 1, 0, O);
        assert!(matches!(
            k.modify(Interest::READABLE, 2),
            Err(KernelError::NotFound)
        ));
        assert!(matches!(k.quiet(2), Err(KernelError::NotFound)));
        assert!(matches!(k.delete(), Err(KernelError::NotFound)));
        let log = m.take_commands();
        assert_eq!(log.len(), 7);
        assert_eq!(log[6].error, Some(Errno::NoEnt));
    }
}
