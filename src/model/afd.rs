//! [`Semantics::Afd`](super::Semantics::Afd): `IOCTL_AFD_POLL` requests
//! completing on an I/O completion port (Windows), with the Windows backend's
//! translation of the state machine's commands into them (`backends/windows/`).
//!
//! The kernel side, as probed under wine 8.0 and read in wine's `server/sock.c`
//! and `server/async.c`:
//!
//! - a poll request names one socket (a handle, resolved to the socket object
//!   when it is issued: `poll_socket`'s `get_handle_obj` with the socket type)
//!   and an event mask. A closed handle is refused (STATUS_INVALID_HANDLE), a
//!   handle that is not a socket too (STATUS_OBJECT_TYPE_MISMATCH). If one of
//!   the events is true when it is issued, it completes at once
//!   (`poll_single_socket`, then `complete_async_poll`); otherwise it pends, and
//!   completes once, when one becomes true (`sock_poll_event` ...
//!   `complete_async_poll`). Completion queues one packet on the port with the
//!   events that were true then: the packet stays queued even if they stop
//!   being true before it is dequeued, and nothing more comes until a new
//!   request (oneshot).
//! - a cancel (`NtCancelIoFileEx`) of a pending request completes it with
//!   STATUS_CANCELLED, one packet (`sock_cancel_async`, `async_terminate`); a
//!   cancel of a completed request answers STATUS_NOT_FOUND and queues nothing
//!   (`cancel_async` in `server/async.c`).
//! - closing the socket's last handle completes its pending requests with
//!   LOCAL_CLOSE (`sock_close_handle`, when `handle_count == 1`); closing one of
//!   several handles of it completes nothing.
//! - a dequeue (`GetQueuedCompletionStatusEx`) takes packets in order, each
//!   once. (The waker's posts are packets too; the model keeps the shared
//!   [`Model::notify`] flag for them.)
//!
//! The backend side (`backends/windows/mod.rs`, `afd.rs`): add takes the
//! socket's base handle (the number itself: no layered provider) and issues a
//! poll carrying the slot and the arming generation; modify issues a new poll
//! on the recorded base handle, then cancels the previous one if it may still
//! fire; quiet cancels the current poll; delete forgets the record and cancels
//! it; a cancel marks the poll, and issues `NtCancelIoFileEx` only for a poll
//! neither dequeued nor cancelled before (`Op::mark_cancelled`). A dequeued
//! completion of a marked poll is reported for no slot ([`NO_SLOT`]), which the
//! poller drops as stale; any other carries the poll's own slot and
//! generation. The bits and their readiness are the backend's own
//! (`backends/windows/bits.rs`).
//!
//! Windows has no fork: [`Model::fork_child`] models a new port and AFD handle
//! (a new poller), as the other kernels' new instance.
//!
//! [`AfdFault`] breaks the modelled backend on purpose, to show that the
//! fuzzer and the properties find what it breaks.

use super::{Command, DescId, Errno, Fd, KernelView, Levels, Model, ModelEvent, Origin};
use crate::afd_bits::{self, events_for, readiness};
use crate::backend::RawEvent;
use crate::event::Readiness;
use crate::interest::Interest;
use crate::token::pack64;
use std::collections::{BTreeMap, VecDeque};

/// The slot of the event reported for a completion the backend cancelled.
pub const NO_SLOT: u32 = u32::MAX;

/// The AFD bits a socket with `levels` has true: readable is RECEIVE, writable
/// SEND, read-closed DISCONNECT, a hang-up or an error ABORT.
pub const fn afd_bits(levels: Levels) -> u32 {
    let mut b = 0;
    if levels.readable {
        b |= afd_bits::RECEIVE;
    }
    if levels.writable {
        b |= afd_bits::SEND;
    }
    if levels.read_closed {
        b |= afd_bits::DISCONNECT;
    }
    if levels.hang_up || levels.error {
        b |= afd_bits::ABORT;
    }
    b
}

/// Where one poll request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollState {
    /// Issued, nothing true yet.
    Pending,
    /// Completed (or cancelled): its packet is queued on the port.
    Queued,
    /// Its packet was dequeued.
    Dequeued,
}

/// One poll request and what the backend knows of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AfdPoll {
    /// The socket it polls (the description its handle named when issued).
    pub desc: DescId,
    /// The interest it was issued for.
    pub interest: Interest,
    /// The AFD events it polls for.
    pub mask: u32,
    /// The registration's slot it carries.
    pub slot: u32,
    /// The arming generation it carries.
    pub generation: u32,
    /// Who issued it (ground truth).
    pub origin: Origin,
    /// Where it is.
    pub state: PollState,
    /// The backend marked it cancelled (its completion is dropped).
    pub cancelled: bool,
    /// A cancel reached it while it was pending: it completed with
    /// STATUS_CANCELLED.
    pub status_cancelled: bool,
}

/// A way to break the modelled Windows backend, for showing that the checks
/// find it (`POLLSHOT_FUZZ_AFD_FAULT` in the fuzz harness).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AfdFault {
    /// The backend as it is.
    #[default]
    None,
    /// Disarm (quiet) and deregister (delete) leave the pending poll alone: no
    /// mark, no `NtCancelIoFileEx`. Re-arm still cancels.
    NoCancel,
    /// Stale completions get through: the backend neither marks the polls it
    /// cancels nor carries the arming generation in the completion (the slot
    /// only; the generation is read from the registration's record when the
    /// completion is dequeued), so a cancelled or superseded poll's completion
    /// looks current.
    StaleThrough,
}

/// What the port holds: the poll whose packet it is, and its events (`None`:
/// STATUS_CANCELLED).
type Packet = (usize, Option<u32>);

/// The AFD side of a [`Model`]: every poll ever issued, the port's queue, the
/// backend's record per slot (the base handle and the last poll issued).
#[derive(Clone, Debug, Default)]
pub(super) struct AfdState {
    polls: Vec<AfdPoll>,
    queue: VecDeque<Packet>,
    records: BTreeMap<u32, (Fd, usize)>,
    fault: AfdFault,
}

impl AfdState {
    /// A new port and AFD handle: nothing issued, nothing queued; the fault
    /// stays.
    pub(super) fn clear(&mut self) {
        let fault = self.fault;
        *self = AfdState {
            fault,
            ..AfdState::default()
        };
    }
}

impl Model {
    /// Breaks the modelled Windows backend with `fault` (see [`AfdFault`]). Set
    /// it before any command.
    pub fn set_afd_fault(&mut self, fault: AfdFault) {
        self.afd.fault = fault;
    }

    /// Every poll request issued (to this port), in order.
    pub fn afd_polls(&self) -> &[AfdPoll] {
        &self.afd.polls
    }

    /// A poll that is pending although no registration's record names it as
    /// its current poll, if there is one: it would complete for a dead or
    /// re-armed arming, or never, and the backend would hold its memory until
    /// then. None ever with the backend as it is.
    pub fn afd_unowned_pending(&self) -> Option<AfdPoll> {
        let current = |i: usize| self.afd.records.values().any(|&(_, c)| c == i);
        self.afd
            .polls
            .iter()
            .enumerate()
            .find(|&(i, p)| p.state == PollState::Pending && !p.cancelled && !current(i))
            .map(|(_, p)| *p)
    }

    fn afd_complete(&mut self, i: usize, events: Option<u32>) {
        self.afd.polls[i].state = PollState::Queued;
        self.afd.queue.push_back((i, events));
    }

    /// Activity on `desc`: its pending polls for an event now true complete.
    pub(super) fn afd_activity(&mut self, desc: DescId) {
        let bits = afd_bits(self.levels(desc));
        for i in 0..self.afd.polls.len() {
            let p = self.afd.polls[i];
            if p.desc == desc && p.state == PollState::Pending && p.mask & bits != 0 {
                self.afd_complete(i, Some(p.mask & bits));
            }
        }
    }

    /// The last handle of `desc` closed: its pending polls complete with
    /// LOCAL_CLOSE (`sock_close_handle`).
    pub(super) fn afd_close(&mut self, desc: DescId) {
        for i in 0..self.afd.polls.len() {
            let p = self.afd.polls[i];
            if p.desc == desc && p.state == PollState::Pending {
                self.afd_complete(i, Some(afd_bits::LOCAL_CLOSE & p.mask));
            }
        }
    }

    /// One `IOCTL_AFD_POLL` on the handle `base`: refused for a closed number
    /// (STATUS_INVALID_HANDLE, [`Errno::BadF`]) or one that is not a socket
    /// (STATUS_OBJECT_TYPE_MISMATCH, modelled as [`Errno::Inval`]: the backend
    /// passes it on as an error); completes at once if an event is true.
    fn afd_issue(
        &mut self,
        base: Fd,
        interest: Interest,
        slot: u32,
        generation: u32,
        origin: Origin,
    ) -> Result<usize, Errno> {
        self.calls.afd_polls += 1;
        let desc = *self.fds.get(&base).ok_or(Errno::BadF)?;
        if !self.is_pollable(desc) {
            return Err(Errno::Inval);
        }
        let mask = events_for(interest);
        self.afd.polls.push(AfdPoll {
            desc,
            interest,
            mask,
            slot,
            generation,
            origin,
            state: PollState::Pending,
            cancelled: false,
            status_cancelled: false,
        });
        let i = self.afd.polls.len() - 1;
        let bits = afd_bits(self.levels(desc)) & mask;
        if bits != 0 {
            self.afd_complete(i, Some(bits));
        }
        Ok(i)
    }

    /// The backend's cancel of poll `i`: marks it, and issues `NtCancelIoFileEx`
    /// only if it may still fire. A pending poll completes with STATUS_CANCELLED;
    /// a queued one answers STATUS_NOT_FOUND and queues nothing more.
    fn afd_cancel(&mut self, i: usize) {
        let mark = self.afd.fault != AfdFault::StaleThrough;
        let p = &mut self.afd.polls[i];
        let may_fire = !p.cancelled && p.state != PollState::Dequeued;
        p.cancelled |= mark;
        if !may_fire {
            return;
        }
        self.calls.afd_cancels += 1;
        if p.state == PollState::Pending {
            p.status_cancelled = true;
            self.afd_complete(i, None);
        }
    }

    /// One state-machine command for the registration on `fd` in `slot`, as the
    /// Windows backend issues it.
    pub(super) fn afd_run(
        &mut self,
        fd: Fd,
        slot: u32,
        command: Command,
        origin: Origin,
    ) -> Result<(), Errno> {
        let keep = self.afd.fault == AfdFault::NoCancel;
        match command {
            Command::Add(interest, g) => {
                // SIO_BASE_HANDLE: WSAENOTSOCK for a closed handle (BadFd).
                if !self.is_open(fd) {
                    return Err(Errno::BadF);
                }
                let i = self.afd_issue(fd, interest, slot, g, origin)?;
                if let Some((_, old)) = self.afd.records.insert(slot, (fd, i)) {
                    self.afd_cancel(old);
                }
                Ok(())
            }
            Command::Modify(interest, g) => {
                let &(base, old) = self.afd.records.get(&slot).ok_or(Errno::NoEnt)?;
                // The new poll first: if it is refused, the arming in force stays.
                let i = self.afd_issue(base, interest, slot, g, origin)?;
                self.afd.records.insert(slot, (base, i));
                self.afd_cancel(old);
                Ok(())
            }
            Command::Quiet(_) => {
                let &(_, i) = self.afd.records.get(&slot).ok_or(Errno::NoEnt)?;
                if !keep {
                    self.afd_cancel(i);
                }
                Ok(())
            }
            Command::Delete => {
                let (_, i) = self.afd.records.remove(&slot).ok_or(Errno::NoEnt)?;
                if !keep {
                    self.afd_cancel(i);
                }
                Ok(())
            }
        }
    }

    /// What the backend reports for the dequeued packet of poll `i`.
    fn afd_event(&self, i: usize, events: Option<u32>) -> ModelEvent {
        let p = &self.afd.polls[i];
        let readiness = events.map_or(Readiness::EMPTY, readiness);
        let raw = match self.afd.fault {
            _ if p.cancelled => RawEvent {
                slot: NO_SLOT,
                stamp: 0,
                readiness: Readiness::EMPTY,
            },
            AfdFault::StaleThrough => {
                let record = self.afd.records.get(&p.slot);
                RawEvent {
                    slot: p.slot,
                    stamp: record.map_or(p.generation, |&(_, c)| self.afd.polls[c].generation),
                    readiness,
                }
            }
            AfdFault::None | AfdFault::NoCancel => RawEvent {
                slot: p.slot,
                stamp: p.generation,
                readiness,
            },
        };
        ModelEvent {
            raw,
            origin: p.origin,
            filter: None,
        }
    }

    /// One `GetQueuedCompletionStatusEx` for at most `max` packets, in order.
    pub(super) fn afd_wait(&mut self, max: usize) -> Vec<ModelEvent> {
        let mut out = Vec::new();
        while out.len() < max.max(1) {
            let Some((i, events)) = self.afd.queue.pop_front() else {
                break;
            };
            self.afd.polls[i].state = PollState::Dequeued;
            out.push(self.afd_event(i, events));
        }
        out
    }

    /// The current poll of `slot` completes now with its interest's direction
    /// (readiness that came and went), or its queued packet is dequeued now.
    pub(super) fn afd_force_report(&mut self, slot: u32) -> Option<ModelEvent> {
        let &(_, i) = self.afd.records.get(&slot)?;
        let p = self.afd.polls[i];
        if p.cancelled || p.status_cancelled {
            return None;
        }
        let events = match p.state {
            PollState::Dequeued => return None,
            PollState::Pending => {
                let mut bits = 0;
                if p.interest.is_readable() {
                    bits |= afd_bits::RECEIVE;
                }
                if p.interest.is_writable() {
                    bits |= afd_bits::SEND;
                }
                Some(bits)
            }
            PollState::Queued => {
                let at = self.afd.queue.iter().position(|&(q, _)| q == i)?;
                self.afd.queue.remove(at)?.1
            }
        };
        self.afd.polls[i].state = PollState::Dequeued;
        Some(self.afd_event(i, events))
    }

    /// What the port holds for `slot`: present while the backend has a record;
    /// armed for the interest of the oldest poll carrying the slot that may
    /// still fire (neither cancelled, by the backend's mark or the kernel's
    /// STATUS_CANCELLED, nor dequeued), whose tag it shows; with none, not
    /// armed, and the tag of the record's last poll.
    pub(super) fn afd_view(&self, slot: u32) -> KernelView {
        let record = self.afd.records.get(&slot);
        let live = self.afd.polls.iter().find(|p| {
            p.slot == slot && !p.cancelled && !p.status_cancelled && p.state != PollState::Dequeued
        });
        match (live, record) {
            (Some(p), _) => KernelView {
                present: record.is_some(),
                armed: Some(p.interest),
                tag: Some(pack64(slot, p.generation)),
            },
            (None, Some(&(_, i))) => KernelView {
                present: true,
                armed: None,
                tag: Some(pack64(slot, self.afd.polls[i].generation)),
            },
            (None, None) => KernelView::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Semantics;
    use super::*;
    use crate::state::{Fallbacks, Kernel, KernelError, Phase, RegState};

    const O: Origin = Origin {
        owner: 1,
        arming: 1,
    };

    fn ready(m: &mut Model, fd: Fd, bits: u8) {
        let d = m.description(fd).unwrap();
        m.set_levels(d, Levels::from_bits(bits));
    }

    #[test]
    fn disarm_then_data_then_rearm_delivers_once_and_the_cancelled_poll_is_dropped() {
        let mut m = Model::new(Semantics::Afd);
        let fd = m.open(true);
        let mut s = RegState::new(0);
        let fb = &mut Fallbacks::default();
        s.arm(Interest::READABLE, &mut m.kernel(fd, 0, 0, O), fb)
            .unwrap();
        s.disarm(&mut m.kernel(fd, 0, 0, O)).unwrap();
        ready(&mut m, fd, 1);
        s.arm(Interest::READABLE, &mut m.kernel(fd, 0, 0, O), fb)
            .unwrap();
        let ev = m.wait(8);
        assert_eq!(ev.len(), 2, "the cancelled packet, then the re-arm's");
        assert_eq!(ev[0].raw.slot, NO_SLOT);
        assert_eq!(
            (ev[1].raw.slot, ev[1].raw.stamp),
            (0, 3),
            "arm 1, disarm 2, re-arm 3"
        );
        assert_eq!(s.on_event(Some(ev[1].raw.stamp)), Some(Interest::READABLE));
        let c = m.calls();
        assert_eq!((c.afd_polls, c.afd_cancels, c.waits), (2, 1, 1));
        assert!(m.afd_polls()[0].cancelled);
        assert!(
            m.wait(8).is_empty(),
            "oneshot: nothing while the data stays"
        );
    }

    #[test]
    fn a_cancel_after_completion_issues_no_packet_and_a_second_cancel_no_call() {
        let mut m = Model::new(Semantics::Afd);
        let fd = m.open(true);
        ready(&mut m, fd, 1);
        let mut k = m.kernel(fd, 0, 0, O);
        k.add(Interest::READABLE, 1).unwrap();
        k.quiet(2).unwrap();
        k.quiet(3).unwrap();
        assert_eq!(
            m.calls().afd_cancels,
            1,
            "marked: the second cancel is not issued"
        );
        let ev = m.wait(8);
        assert_eq!(ev.len(), 1, "the completion, no second packet");
        assert_eq!(ev[0].raw.slot, NO_SLOT, "marked cancelled: dropped");
    }

    #[test]
    fn closing_the_last_handle_completes_with_local_close_a_dup_keeps_it_pending() {
        let mut m = Model::new(Semantics::Afd);
        let fd = m.open(true);
        let dup = m.dup(fd).unwrap();
        m.kernel(fd, 0, 0, O).add(Interest::WRITABLE, 1).unwrap();
        m.close(fd).unwrap();
        assert!(m.wait(8).is_empty(), "a handle of the socket is still open");
        m.close(dup).unwrap();
        let ev = m.wait(8);
        assert_eq!(ev.len(), 1);
        assert_eq!((ev[0].raw.slot, ev[0].raw.stamp), (0, 1));
        assert_eq!(ev[0].raw.readiness, readiness(afd_bits::LOCAL_CLOSE));
        // The record stays: a re-arm polls the closed handle (refused), a
        // deregistration finds the record.
        let mut k = m.kernel(fd, 0, 0, O);
        assert!(matches!(
            k.modify(Interest::WRITABLE, 2),
            Err(KernelError::BadFd)
        ));
        k.delete().unwrap();
        assert!(matches!(k.delete(), Err(KernelError::NotFound)));
    }

    #[test]
    fn a_handle_that_is_not_a_socket_is_refused_as_an_error() {
        let mut m = Model::new(Semantics::Afd);
        let fd = m.open(false);
        let mut s = RegState::new(0);
        let r = s.arm(
            Interest::READABLE,
            &mut m.kernel(fd, 0, 0, O),
            &mut Fallbacks::default(),
        );
        assert!(matches!(r, Err(KernelError::Other(_))), "{r:?}");
        assert_eq!(s.phase(), Phase::Fresh);
        assert!(!s.is_always_ready());
    }

    #[test]
    fn faults_change_what_the_backend_does() {
        // NoCancel: a disarmed poll stays pending and later fires.
        let mut m = Model::new(Semantics::Afd);
        m.set_afd_fault(AfdFault::NoCancel);
        let fd = m.open(true);
        let mut k = m.kernel(fd, 0, 0, O);
        k.add(Interest::READABLE, 1).unwrap();
        k.quiet(2).unwrap();
        assert_eq!(m.view(fd, 0).armed, Some(Interest::READABLE));
        k = m.kernel(fd, 0, 0, O);
        k.delete().unwrap();
        assert!(m.afd_unowned_pending().is_some());
        // StaleThrough: a cancelled poll's completion carries the re-arm's
        // generation.
        let mut m = Model::new(Semantics::Afd);
        m.set_afd_fault(AfdFault::StaleThrough);
        let fd = m.open(true);
        let mut k = m.kernel(fd, 0, 0, O);
        k.add(Interest::READABLE, 1).unwrap();
        k.quiet(2).unwrap();
        k.modify(Interest::READABLE, 3).unwrap();
        let ev = m.wait(8);
        assert_eq!((ev[0].raw.slot, ev[0].raw.stamp), (0, 3));
        assert_eq!(ev[0].origin, O);
    }
}
