//! epoll(7), and pollshot's epoll backend's commands (`backends/epoll.rs`): the
//! event bits with the kernel's values, `epoll_ctl(2)`, and this family's part of
//! [`Model::wait`], [`Model::view`], [`Model::force_report`] and the
//! [`RegKernel`] translation.
//!
//! Entries are keyed by (description, descriptor number), as the kernel keys
//! them. `EPOLL_CTL_ADD` of a key present answers EEXIST, `EPOLL_CTL_MOD`/`DEL` of
//! a key absent ENOENT, any command on a closed number EBADF, any command on a
//! description the kernel cannot poll EPERM. `EPOLLERR | EPOLLHUP` are always in
//! an entry's mask; an `EPOLLONESHOT` entry loses every readiness bit when it is
//! reported; `data` is returned as it was set. An entry lives until it is
//! deleted or its *description* is released (the last descriptor referring to
//! it closed), so a dup'd description keeps an orphan entry under the closed
//! number alive.

use super::{
    interest_from, Command, DescId, Errno, Fd, KernelView, Model, ModelEvent, Origin, RawEvent,
    Readiness, RegKernel,
};
use crate::interest::Interest;
use crate::token::{pack64, unpack64};
use std::collections::BTreeMap;

/// `EPOLLIN`.
pub const IN: u32 = 0x001;
/// `EPOLLPRI`.
pub const PRI: u32 = 0x002;
/// `EPOLLOUT`.
pub const OUT: u32 = 0x004;
/// `EPOLLERR`.
pub const ERR: u32 = 0x008;
/// `EPOLLHUP`.
pub const HUP: u32 = 0x010;
/// `EPOLLRDHUP`.
pub const RDHUP: u32 = 0x2000;
/// `EPOLLONESHOT`.
pub const ONESHOT: u32 = 1 << 30;
/// The bits that can be reported.
pub const READINESS: u32 = IN | PRI | OUT | ERR | HUP | RDHUP;

/// An `epoll_ctl(2)` operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EpollOp {
    /// `EPOLL_CTL_ADD`.
    Add,
    /// `EPOLL_CTL_MOD`.
    Mod,
    /// `EPOLL_CTL_DEL`.
    Del,
}

/// One epoll entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpollEntry {
    /// The event mask, `EPOLLERR | EPOLLHUP` included; no readiness bit once a
    /// oneshot entry was reported.
    pub events: u32,
    /// `epoll_event.data.u64`.
    pub data: u64,
    /// Who armed it (ground truth).
    pub origin: Origin,
}

/// epoll flags for an arm, as `backends/epoll.rs` sets them.
pub const fn epoll_flags_for(interest: Interest) -> u32 {
    let mut f = ONESHOT;
    if interest.is_readable() {
        f |= IN | RDHUP;
    }
    if interest.is_writable() {
        f |= OUT;
    }
    if interest.is_priority() {
        f |= PRI;
    }
    f
}

/// Readiness from epoll's `events`, as `backends/epoll.rs` decodes it (the same
/// function: [`Readiness::from_epoll`]).
pub const fn epoll_readiness(flags: u32) -> Readiness {
    Readiness::from_epoll(flags)
}

impl Model {
    /// The epoll entries, by (description, number).
    pub fn epoll_entries(&self) -> &BTreeMap<(DescId, Fd), EpollEntry> {
        &self.epoll
    }

    /// epoll_ctl(2). `events` are the requested bits (`EPOLLERR | EPOLLHUP` are
    /// added, as the kernel does); `data` is stored for `Add` and `Mod`.
    ///
    /// # Errors
    /// EBADF (closed number), EPERM (description not pollable), EEXIST (`Add` of a
    /// present key), ENOENT (`Mod` or `Del` of an absent key).
    pub fn epoll_ctl(
        &mut self,
        op: EpollOp,
        fd: Fd,
        events: u32,
        data: u64,
        origin: Origin,
    ) -> Result<(), Errno> {
        self.calls.epoll_ctl += 1;
        let desc = *self.fds.get(&fd).ok_or(Errno::BadF)?;
        if !self.descs[desc.0 as usize].pollable {
            return Err(Errno::Perm);
        }
        let key = (desc, fd);
        let entry = EpollEntry {
            events: events | ERR | HUP,
            data,
            origin,
        };
        match op {
            EpollOp::Add => {
                if self.epoll.contains_key(&key) {
                    return Err(Errno::Exist);
                }
                self.epoll.insert(key, entry);
            }
            EpollOp::Mod => {
                let e = self.epoll.get_mut(&key).ok_or(Errno::NoEnt)?;
                *e = entry;
            }
            EpollOp::Del => {
                self.epoll.remove(&key).ok_or(Errno::NoEnt)?;
            }
        }
        Ok(())
    }

    /// epoll's part of [`Model::wait`]: every entry whose mask meets its
    /// description's levels, oneshot entries disarmed.
    pub(super) fn epoll_wait(&mut self, max: usize) -> Vec<ModelEvent> {
        let mut out = Vec::new();
        for (&(desc, _), e) in self.epoll.iter_mut() {
            if out.len() >= max {
                break;
            }
            let ready = e.events & READINESS & self.descs[desc.0 as usize].levels.epoll_bits();
            if ready == 0 {
                continue;
            }
            if e.events & ONESHOT != 0 {
                e.events &= !READINESS;
            }
            let (slot, generation) = unpack64(e.data);
            out.push(ModelEvent {
                raw: RawEvent {
                    slot,
                    stamp: generation,
                    readiness: epoll_readiness(ready),
                },
                origin: e.origin,
                filter: None,
            });
        }
        out
    }

    /// epoll's part of [`Model::view`].
    pub(super) fn epoll_view(&self, fd: Fd) -> KernelView {
        let Some(&desc) = self.fds.get(&fd) else {
            return KernelView::default();
        };
        match self.epoll.get(&(desc, fd)) {
            None => KernelView::default(),
            Some(e) => KernelView {
                present: true,
                armed: interest_from(e.events & IN != 0, e.events & OUT != 0, e.events & PRI != 0),
                tag: Some(e.data),
            },
        }
    }

    /// epoll's part of [`Model::force_report`].
    pub(super) fn epoll_force_report(&mut self, fd: Fd) -> Option<ModelEvent> {
        let desc = *self.fds.get(&fd)?;
        let e = self.epoll.get_mut(&(desc, fd))?;
        let bits = e.events & (IN | OUT);
        if bits == 0 {
            return None;
        }
        if e.events & ONESHOT != 0 {
            e.events &= !READINESS;
        }
        let (slot, generation) = unpack64(e.data);
        Some(ModelEvent {
            raw: RawEvent {
                slot,
                stamp: generation,
                readiness: epoll_readiness(bits),
            },
            origin: e.origin,
            filter: None,
        })
    }
}

impl RegKernel<'_> {
    /// The epoll backend's call for one command (`backends/epoll.rs`).
    pub(super) fn epoll(&mut self, command: Command) -> Result<(), Errno> {
        let origin = self.origin;
        match command {
            Command::Add(i, g) => {
                let data = pack64(self.slot, g);
                self.model
                    .epoll_ctl(EpollOp::Add, self.fd, epoll_flags_for(i), data, origin)
            }
            Command::Modify(i, g) => {
                let data = pack64(self.slot, g);
                self.model
                    .epoll_ctl(EpollOp::Mod, self.fd, epoll_flags_for(i), data, origin)
            }
            Command::Quiet(g) => {
                let data = pack64(self.slot, g);
                let quiet = Origin {
                    arming: 0,
                    ..origin
                };
                self.model
                    .epoll_ctl(EpollOp::Mod, self.fd, ONESHOT, data, quiet)
            }
            Command::Delete => self.model.epoll_ctl(EpollOp::Del, self.fd, 0, 0, origin),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Levels, Semantics};
    use super::*;

    const O: Origin = Origin {
        owner: 1,
        arming: 1,
    };

    #[test]
    fn epoll_keys_by_description_and_number() {
        let mut m = Model::new(Semantics::Epoll);
        let a = m.open(true);
        m.epoll_ctl(EpollOp::Add, a, IN | ONESHOT, 7, O).unwrap();
        assert_eq!(m.epoll_ctl(EpollOp::Add, a, IN, 7, O), Err(Errno::Exist));
        let d = m.dup(a).unwrap();
        // Another number of the same description is another key.
        assert_eq!(m.epoll_ctl(EpollOp::Mod, d, IN, 7, O), Err(Errno::NoEnt));
        // Closing the registered number leaves the entry (the dup keeps the
        // description open): it still fires, once.
        m.close(a).unwrap();
        let desc = m.description(d).unwrap();
        m.set_levels(desc, Levels::from_bits(1));
        assert_eq!(m.wait(8).len(), 1);
        assert_eq!(m.wait(8).len(), 0);
        // The number is reused by a dup of the same description: ADD says EEXIST.
        assert_eq!(m.dup(d), Ok(a));
        assert_eq!(m.epoll_ctl(EpollOp::Add, a, IN, 7, O), Err(Errno::Exist));
        m.close(a).unwrap();
        // Reused by another description: MOD says ENOENT.
        assert_eq!(m.open(true), a);
        assert_eq!(m.epoll_ctl(EpollOp::Mod, a, IN, 7, O), Err(Errno::NoEnt));
        // The last close of the description drops the orphan entry.
        m.close(d).unwrap();
        assert!(m.epoll_entries().keys().all(|&(id, _)| id != desc));
        assert_eq!(m.epoll_ctl(EpollOp::Mod, d, IN, 7, O), Err(Errno::BadF));
        let file = m.open(false);
        assert_eq!(m.epoll_ctl(EpollOp::Add, file, IN, 7, O), Err(Errno::Perm));
    }

    #[test]
    fn epoll_quiet_entry_fires_once_on_hang_up() {
        let mut m = Model::new(Semantics::Epoll);
        let a = m.open(true);
        m.epoll_ctl(EpollOp::Add, a, ONESHOT, 7, O).unwrap();
        let desc = m.description(a).unwrap();
        m.set_levels(desc, Levels::from_bits(1));
        assert!(m.wait(8).is_empty());
        m.set_levels(desc, Levels::from_bits(8));
        let ev = m.wait(8);
        assert_eq!(ev.len(), 1);
        assert!(ev[0].raw.readiness.contains(Readiness::WRITE_CLOSED));
        assert!(m.wait(8).is_empty());
        // Without oneshot, level-triggered: every wait.
        m.epoll_ctl(EpollOp::Mod, a, 0, 7, O).unwrap();
        assert_eq!(m.wait(8).len(), 1);
        assert_eq!(m.wait(8).len(), 1);
    }
}
