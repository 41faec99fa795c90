//! [`Semantics::Ports`](super::Semantics::Ports): illumos event ports with the
//! event ports backend's commands (`backends/ports/`), modelled from the illumos
//! sources:
//!
//! - an association is keyed by (descriptor number, open file), as
//!   `port_cache_lookup_fp` keys it. add and modify are both `port_associate`,
//!   which creates or reactivates it with the new events and `user`
//!   (`port_associate_fd`), and never answers EEXIST or ENOENT; a number that is
//!   not open answers EBADFD (modelled as [`Errno::BadF`]: the backend classifies
//!   both as a bad descriptor).
//! - quiet and delete are both `port_dissociate`: the association is removed in
//!   every case; the answer is success when it was active (armed, or fired and not
//!   yet retrieved), ENOENT when it was not (retrieved, or never made for this open
//!   file), EBADFD (here EBADF) when the number is closed (`port_dissociate_fd`).
//! - an active association whose description is ready for what it asks (plus
//!   `POLLERR` and `POLLHUP`, always) is reported once by a wait and left inactive
//!   (oneshot); a regular file is ready for whatever it asks (`fs_poll`).
//! - closing a number removes its associations, whether or not a dup keeps the
//!   open file alive (`port_close_fd`).
//!
//! The translation (the `events` asked, the readiness of a retrieved event, the
//! `user` word) is the backend's own (`backends/ports/events.rs`).

use super::{Command, DescId, Errno, Fd, KernelView, Levels, Model, ModelEvent, Origin};
use crate::backend::RawEvent;
use crate::interest::Interest;
use crate::ports_backend::events::{self, bits};
use std::collections::BTreeMap;

/// One association with the event port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAssociation {
    /// The interest it is active for; `None` once its event was retrieved (the
    /// kernel keeps it, inactive, until a `port_associate`, a `port_dissociate` or
    /// the number's close).
    pub active: Option<Interest>,
    /// `portev_user` as the last `port_associate` set it.
    pub user: u64,
    /// Who associated it last (ground truth).
    pub origin: Origin,
}

/// The associations, by (number, description).
pub(super) type Associations = BTreeMap<(Fd, DescId), PortAssociation>;

/// What `VOP_POLL` answers a description with these levels: poll(2) bits with
/// illumos's values.
fn poll_bits(l: Levels, pollable: bool) -> i32 {
    if !pollable {
        // `fs_poll`: a regular file is readable and writable.
        return bits::IN | bits::OUT;
    }
    let mut b = 0;
    if l.readable {
        b |= bits::IN;
    }
    if l.writable {
        b |= bits::OUT;
    }
    if l.read_closed {
        b |= bits::RDHUP;
    }
    if l.hang_up {
        b |= bits::HUP;
    }
    if l.error {
        b |= bits::ERR;
    }
    b
}

impl Model {
    /// The event port's associations, by (number, description).
    pub fn port_associations(&self) -> &BTreeMap<(Fd, DescId), PortAssociation> {
        &self.ports
    }

    /// close(2) of `fd`: its associations go (`port_close_fd`).
    pub(super) fn port_close(&mut self, fd: Fd) {
        self.ports.retain(|&(n, _), _| n != fd);
    }

    /// One state-machine command for the registration on `fd` in `slot`, as the
    /// event ports backend issues it.
    pub(super) fn port_run(
        &mut self,
        fd: Fd,
        slot: u32,
        command: Command,
        origin: Origin,
    ) -> Result<(), Errno> {
        let desc = *self.fds.get(&fd).ok_or(Errno::BadF)?;
        match command {
            Command::Add(i, g) | Command::Modify(i, g) => {
                self.ports.insert(
                    (fd, desc),
                    PortAssociation {
                        active: Some(i),
                        user: events::user_word(slot, g),
                        origin,
                    },
                );
                Ok(())
            }
            Command::Quiet(_) | Command::Delete => match self.ports.remove(&(fd, desc)) {
                Some(a) if a.active.is_some() => Ok(()),
                _ => Err(Errno::NoEnt),
            },
        }
    }

    /// What the association of (`fd`, its description) reports with `asked` bits
    /// ready, if anything; it is left inactive.
    fn port_report(&mut self, fd: Fd, desc: DescId, have: i32) -> Option<ModelEvent> {
        let a = self.ports.get_mut(&(fd, desc))?;
        let interest = a.active?;
        let r = have & (events::events_for(interest) | bits::ERR | bits::HUP);
        if r == 0 {
            return None;
        }
        a.active = None;
        let (slot, generation) = events::slot_and_generation(a.user);
        Some(ModelEvent {
            raw: RawEvent {
                slot,
                stamp: generation,
                readiness: events::readiness(r),
            },
            origin: a.origin,
            filter: None,
        })
    }

    /// One wait: every active association that is ready, at most `max`, by key.
    pub(super) fn port_wait(&mut self, max: usize, out: &mut Vec<ModelEvent>) {
        let keys: Vec<(Fd, DescId)> = self.ports.keys().copied().collect();
        for (fd, desc) in keys {
            if out.len() >= max {
                break;
            }
            let d = &self.descs[desc.0 as usize];
            let have = poll_bits(d.levels, d.pollable);
            if let Some(ev) = self.port_report(fd, desc, have) {
                out.push(ev);
            }
        }
    }

    /// The association of `fd` fires now, whatever the levels: the directions it
    /// asks for.
    pub(super) fn port_force_report(&mut self, fd: Fd) -> Option<ModelEvent> {
        let desc = *self.fds.get(&fd)?;
        self.port_report(fd, desc, bits::IN | bits::OUT)
    }

    /// What the port holds for `fd`'s description: present while an association
    /// exists (active or retrieved), armed while active, the tag its `user`.
    pub(super) fn port_view(&self, fd: Fd) -> KernelView {
        let Some(&desc) = self.fds.get(&fd) else {
            return KernelView::default();
        };
        match self.ports.get(&(fd, desc)) {
            None => KernelView::default(),
            Some(a) => KernelView {
                present: true,
                armed: a.active,
                tag: Some(a.user),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Origin, Semantics};
    use super::*;
    use crate::state::{Armed, Fallbacks, KernelError, Phase, RegState};

    const O: Origin = Origin {
        owner: 1,
        arming: 1,
    };

    fn arm(m: &mut Model, s: &mut RegState, fd: Fd, i: Interest) -> Result<Armed, KernelError> {
        s.arm(
            i,
            &mut m.kernel(fd, fd as u32, 0, O),
            &mut Fallbacks::default(),
        )
    }

    #[test]
    fn associate_reports_once_then_rearm_reports_again() {
        let mut m = Model::new(Semantics::Ports);
        let fd = m.open(true);
        let mut s = RegState::new(0);
        assert!(matches!(
            arm(&mut m, &mut s, fd, Interest::READABLE),
            Ok(Armed::Kernel)
        ));
        assert!(m.wait(8).is_empty());
        let d = m.description(fd).unwrap();
        m.set_levels(d, Levels::from_bits(1));
        let ev = m.wait(8);
        assert_eq!(ev.len(), 1);
        assert_eq!(s.on_event(Some(ev[0].raw.stamp)), Some(Interest::READABLE));
        assert!(m.wait(8).is_empty(), "oneshot");
        // Retrieved: still there, inactive.
        assert!(m.view(fd, fd as u32).present);
        assert_eq!(m.view(fd, fd as u32).armed, None);
        arm(&mut m, &mut s, fd, Interest::READABLE).unwrap();
        assert_eq!(m.wait(8).len(), 1);
    }

    #[test]
    fn dissociate_answers_and_removes() {
        let mut m = Model::new(Semantics::Ports);
        let fd = m.open(true);
        let mut s = RegState::new(0);
        arm(&mut m, &mut s, fd, Interest::WRITABLE).unwrap();
        // Active: disarm succeeds, nothing left.
        assert!(matches!(
            s.disarm(&mut m.kernel(fd, fd as u32, 0, O)),
            Ok(true)
        ));
        assert_eq!(s.phase(), Phase::Idle);
        assert_eq!(m.view(fd, fd as u32), KernelView::default());
        // Re-arm (modify) associates again; its event retrieved, a dissociate
        // answers ENOENT: the deregistration takes it as already gone.
        arm(&mut m, &mut s, fd, Interest::WRITABLE).unwrap();
        let d = m.description(fd).unwrap();
        m.set_levels(d, Levels::from_bits(2));
        assert_eq!(m.wait(8).len(), 1);
        m.take_commands();
        assert!(matches!(
            s.deregister(&mut m.kernel(fd, fd as u32, 0, O)),
            Ok(true)
        ));
        let log = m.take_commands();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].error, Some(Errno::NoEnt));
        assert!(m.port_associations().is_empty());
    }

    #[test]
    fn close_removes_the_association_even_with_a_dup_open() {
        let mut m = Model::new(Semantics::Ports);
        let fd = m.open(true);
        let dup = m.dup(fd).unwrap();
        let mut s = RegState::new(0);
        arm(&mut m, &mut s, fd, Interest::READABLE).unwrap();
        m.close(fd).unwrap();
        let d = m.description(dup).unwrap();
        m.set_levels(d, Levels::from_bits(1));
        assert!(
            m.wait(8).is_empty(),
            "the closed number's association is gone"
        );
        // The closed number: EBADFD (modelled as EBADF) for both calls.
        let r = arm(&mut m, &mut s, fd, Interest::WRITABLE);
        assert!(matches!(r, Err(KernelError::BadFd)));
        // Reused by a new open file: a new association.
        let again = m.open(true);
        assert_eq!(again, fd);
        assert!(matches!(
            arm(&mut m, &mut s, fd, Interest::WRITABLE),
            Ok(Armed::Kernel)
        ));
        assert_eq!(m.port_associations().len(), 1);
    }

    #[test]
    fn regular_file_is_reported_by_the_kernel_not_always_ready() {
        let mut m = Model::new(Semantics::Ports);
        let fd = m.open(false);
        let mut s = RegState::new(0);
        assert!(matches!(
            arm(&mut m, &mut s, fd, Interest::BOTH),
            Ok(Armed::Kernel)
        ));
        let ev = m.wait(8);
        assert_eq!(ev.len(), 1);
        let r = ev[0].raw.readiness;
        assert!(r.contains(crate::event::Readiness::READABLE));
        assert!(r.contains(crate::event::Readiness::WRITABLE));
        assert!(!s.is_always_ready());
    }

    #[test]
    fn rearm_replaces_events_and_user() {
        let mut m = Model::new(Semantics::Ports);
        let fd = m.open(true);
        let d = m.description(fd).unwrap();
        m.set_levels(d, Levels::from_bits(1));
        let mut s = RegState::new(0);
        arm(&mut m, &mut s, fd, Interest::WRITABLE).unwrap();
        arm(&mut m, &mut s, fd, Interest::READABLE).unwrap();
        let ev = m.wait(8);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].raw.stamp, s.generation());
        assert_eq!(s.on_event(Some(ev[0].raw.stamp)), Some(Interest::READABLE));
    }
}
