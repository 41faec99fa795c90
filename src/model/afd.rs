//! AFD poll semantics (Windows): a pure model of `IOCTL_AFD_POLL` requests
//! completing on an I/O completion port, and of the Windows backend's
//! translation of the state machine's commands into them.
//!
//! The kernel side, as probed under wine 8.0 and read in wine's `server/sock.c`
//! (`poll_socket`, `sock_poll_event`, `async_terminate`):
//!
//! - a poll request names one socket and an event mask. If one of the events is
//!   true when it is issued, it completes at once; otherwise it pends, and
//!   completes once, when one becomes true. Completion queues one packet on the
//!   port with the events that were true (oneshot: nothing more until a new
//!   request).
//! - a cancel of a pending request completes it with STATUS_CANCELLED (one
//!   packet); a cancel of a completed request answers STATUS_NOT_FOUND and
//!   queues nothing.
//! - closing the socket completes its pending requests with LOCAL_CLOSE.
//! - a post queues a packet of its own; a dequeue takes packets in order, each
//!   once.
//!
//! The backend side is `backends/windows/mod.rs`: add issues a poll, re-arm
//! issues a new poll then cancels the previous one if it may still fire, quiet
//! and delete cancel it, and a completion of a poll the backend cancelled is
//! reported for no slot (`NO_SLOT`), which the poller drops as stale. The bits
//! and their readiness are the backend's own (`backends/windows/bits.rs`).

use super::Levels;
use crate::afd_bits::{self, events_for, readiness};
use crate::backend::RawEvent;
use crate::event::Readiness;
use crate::interest::Interest;
use crate::state::{Kernel, KernelError};
use std::collections::{BTreeMap, VecDeque};

/// The slot of the event reported for a completion the backend cancelled.
pub const NO_SLOT: u32 = u32::MAX;

/// A socket of the model, by number.
pub type Socket = u32;

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
    /// Completed (or cancelled): its packet is queued.
    Queued,
    /// Its packet was dequeued.
    Dequeued,
}

/// One poll request and what the backend knows of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Poll {
    /// The socket it polls.
    pub socket: Socket,
    /// The events it polls for.
    pub mask: u32,
    /// The registration's slot and the arming generation it carries.
    pub slot: u32,
    /// See `slot`.
    pub generation: u32,
    /// Where it is.
    pub state: PollState,
    /// The backend marked it cancelled (its completion is dropped).
    pub cancelled: bool,
}

/// What a queued packet is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Packet {
    /// Poll `index` completed with these events, or was cancelled (`None`).
    Completion(usize, Option<u32>),
    /// A post (the waker).
    Wake,
}

/// Calls made, as the backend's `Stats` counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AfdCalls {
    /// `IOCTL_AFD_POLL` requests.
    pub polls: u64,
    /// `NtCancelIoFileEx` calls.
    pub cancels: u64,
    /// `GetQueuedCompletionStatusEx` calls.
    pub waits: u64,
    /// `PostQueuedCompletionStatus` calls.
    pub posts: u64,
}

/// The model: sockets with levels, the poll requests ever issued, the port's
/// queue, and the backend's record per slot (the last poll issued for it).
#[derive(Debug, Default)]
pub struct AfdModel {
    sockets: BTreeMap<Socket, (Levels, bool)>,
    polls: Vec<Poll>,
    queue: VecDeque<Packet>,
    records: BTreeMap<u32, (Socket, usize)>,
    calls: AfdCalls,
}

impl AfdModel {
    /// An empty model.
    pub fn new() -> AfdModel {
        AfdModel::default()
    }

    /// Opens socket `s` with `levels` (or reopens it, as a new socket).
    pub fn open(&mut self, s: Socket, levels: Levels) {
        self.sockets.insert(s, (levels, true));
    }

    /// Sets socket `s`'s levels: its pending polls for a true event complete.
    pub fn set_levels(&mut self, s: Socket, levels: Levels) {
        if let Some(entry) = self.sockets.get_mut(&s) {
            entry.0 = levels;
        }
        let bits = afd_bits(levels);
        for i in 0..self.polls.len() {
            let p = self.polls[i];
            if p.socket == s && p.state == PollState::Pending && p.mask & bits != 0 {
                self.complete(i, Some(p.mask & bits));
            }
        }
    }

    /// Closes socket `s`: its pending polls complete with LOCAL_CLOSE.
    pub fn close(&mut self, s: Socket) {
        if let Some(entry) = self.sockets.get_mut(&s) {
            entry.1 = false;
        }
        for i in 0..self.polls.len() {
            let p = self.polls[i];
            if p.socket == s && p.state == PollState::Pending {
                self.complete(i, Some(afd_bits::LOCAL_CLOSE & p.mask));
            }
        }
    }

    fn complete(&mut self, i: usize, events: Option<u32>) {
        self.polls[i].state = PollState::Queued;
        self.queue.push_back(Packet::Completion(i, events));
    }

    /// Issues a poll (one `IOCTL_AFD_POLL`): completes at once if an event is
    /// true. `BadFd` on a closed or unknown socket (STATUS_INVALID_HANDLE).
    fn issue(
        &mut self,
        s: Socket,
        interest: Interest,
        slot: u32,
        generation: u32,
    ) -> Result<usize, KernelError> {
        self.calls.polls += 1;
        let Some(&(levels, true)) = self.sockets.get(&s) else {
            return Err(KernelError::BadFd);
        };
        let mask = events_for(interest);
        self.polls.push(Poll {
            socket: s,
            mask,
            slot,
            generation,
            state: PollState::Pending,
            cancelled: false,
        });
        let i = self.polls.len() - 1;
        let bits = afd_bits(levels) & mask;
        if bits != 0 {
            self.complete(i, Some(bits));
        }
        Ok(i)
    }

    /// The backend's cancel: marks the poll, and issues `NtCancelIoFileEx` only
    /// if it may still fire (neither dequeued nor cancelled before).
    fn cancel(&mut self, i: usize) {
        let p = &mut self.polls[i];
        if p.cancelled || p.state == PollState::Dequeued {
            p.cancelled = true;
            return;
        }
        p.cancelled = true;
        self.calls.cancels += 1;
        if p.state == PollState::Pending {
            self.complete(i, None);
        }
        // Queued: STATUS_NOT_FOUND, nothing more queued.
    }

    /// The waker: one packet.
    pub fn post(&mut self) {
        self.calls.posts += 1;
        self.queue.push_back(Packet::Wake);
    }

    /// One `GetQueuedCompletionStatusEx` for at most `max` packets: the events
    /// the backend would report (a cancelled poll's for [`NO_SLOT`]) and whether a
    /// post was among them.
    pub fn wait(&mut self, max: usize) -> (Vec<RawEvent>, bool) {
        self.calls.waits += 1;
        let mut out = Vec::new();
        let mut woken = false;
        for _ in 0..max.max(1) {
            let Some(packet) = self.queue.pop_front() else {
                break;
            };
            match packet {
                Packet::Wake => woken = true,
                Packet::Completion(i, events) => {
                    let p = &mut self.polls[i];
                    p.state = PollState::Dequeued;
                    out.push(match (p.cancelled, events) {
                        (true, _) => RawEvent {
                            slot: NO_SLOT,
                            stamp: 0,
                            readiness: Readiness::EMPTY,
                        },
                        (false, events) => RawEvent {
                            slot: p.slot,
                            stamp: p.generation,
                            readiness: events.map_or(Readiness::EMPTY, readiness),
                        },
                    });
                }
            }
        }
        (out, woken)
    }

    /// The calls made so far.
    pub fn calls(&self) -> AfdCalls {
        self.calls
    }

    /// Every poll request issued, in order.
    pub fn polls(&self) -> &[Poll] {
        &self.polls
    }

    /// Packets queued and not yet dequeued.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The [`Kernel`] of the registration in `slot` on socket `s`: the backend's
    /// translation of the state machine's commands.
    pub fn kernel(&mut self, s: Socket, slot: u32) -> AfdKernel<'_> {
        AfdKernel {
            model: self,
            socket: s,
            slot,
        }
    }
}

/// One registration's view of an [`AfdModel`] (see [`AfdModel::kernel`]).
#[derive(Debug)]
pub struct AfdKernel<'m> {
    model: &'m mut AfdModel,
    socket: Socket,
    slot: u32,
}

impl Kernel for AfdKernel<'_> {
    fn add(&mut self, interest: Interest, generation: u32) -> Result<(), KernelError> {
        let i = self
            .model
            .issue(self.socket, interest, self.slot, generation)?;
        if let Some((_, old)) = self.model.records.insert(self.slot, (self.socket, i)) {
            self.model.cancel(old);
        }
        Ok(())
    }

    fn modify(&mut self, interest: Interest, generation: u32) -> Result<(), KernelError> {
        let Some(&(socket, old)) = self.model.records.get(&self.slot) else {
            return Err(KernelError::NotFound);
        };
        let i = self.model.issue(socket, interest, self.slot, generation)?;
        self.model.records.insert(self.slot, (socket, i));
        self.model.cancel(old);
        Ok(())
    }

    fn quiet(&mut self, _generation: u32) -> Result<(), KernelError> {
        match self.model.records.get(&self.slot) {
            Some(&(_, i)) => {
                self.model.cancel(i);
                Ok(())
            }
            None => Err(KernelError::NotFound),
        }
    }

    fn delete(&mut self) -> Result<(), KernelError> {
        match self.model.records.remove(&self.slot) {
            Some((_, i)) => {
                self.model.cancel(i);
                Ok(())
            }
            None => Err(KernelError::NotFound),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Fallbacks, Phase, RegState};
    use quickcheck::{Arbitrary, Gen, QuickCheck};

    /// One step of a scenario on two registrations (slots 0 and 1, sockets 0
    /// and 1).
    #[derive(Clone, Debug)]
    enum Step {
        Arm(usize, Interest),
        Disarm(usize),
        /// Deregister and register again (a new incarnation, same slot).
        Reregister(usize),
        Levels(usize, u8),
        Deliver(usize),
        Notify,
    }

    impl Arbitrary for Step {
        fn arbitrary(g: &mut Gen) -> Step {
            let r = usize::arbitrary(g) % 2;
            let i = *g.choose(&Interest::ALL).unwrap();
            match u8::arbitrary(g) % 8 {
                0 | 1 => Step::Arm(r, i),
                2 => Step::Disarm(r),
                3 => Step::Reregister(r),
                4 | 5 => Step::Levels(r, u8::arbitrary(g) & 0b111),
                6 => Step::Deliver(1 + usize::arbitrary(g) % 3),
                _ => Step::Notify,
            }
        }
    }

    struct World {
        model: AfdModel,
        regs: [RegState; 2],
        levels: [Levels; 2],
        /// The generation each registration's deregistration ended at: no event
        /// of an earlier arming may be accepted after it.
        floor: [u32; 2],
        /// Accepted (slot, generation) pairs: one delivery per arming.
        accepted: Vec<(u32, u32)>,
    }

    impl World {
        fn new() -> World {
            let mut model = AfdModel::new();
            model.open(0, Levels::default());
            model.open(1, Levels::default());
            World {
                model,
                regs: [RegState::new(0), RegState::new(0)],
                levels: [Levels::default(); 2],
                floor: [0; 2],
                accepted: Vec::new(),
            }
        }

        /// The poller's acceptance of what one wait returned.
        fn accept(&mut self, events: &[RawEvent]) -> Result<(), String> {
            for ev in events {
                if ev.slot == NO_SLOT {
                    continue;
                }
                let r = ev.slot as usize;
                let state = &mut self.regs[r];
                if ev.stamp != state.generation() {
                    continue;
                }
                if state.on_event(Some(ev.stamp)).is_none() {
                    continue;
                }
                if ev.stamp <= self.floor[r] {
                    return Err(format!("an arming from before a deregistration: {ev:?}"));
                }
                if self.accepted.contains(&(ev.slot, ev.stamp)) {
                    return Err(format!("two deliveries of one arming: {ev:?}"));
                }
                self.accepted.push((ev.slot, ev.stamp));
            }
            Ok(())
        }

        fn step(&mut self, step: &Step) -> Result<(), String> {
            let before = self.model.calls();
            match *step {
                Step::Arm(r, i) => {
                    let was = self.regs[r].phase();
                    let mut k = self.model.kernel(r as Socket, r as u32);
                    self.regs[r]
                        .arm(i, &mut k, &mut Fallbacks::default())
                        .map_err(|e| format!("arm: {e:?}"))?;
                    if was == Phase::Armed(i) && self.model.calls() != before {
                        return Err("an arm of an armed registration issued a call".into());
                    }
                }
                Step::Disarm(r) => {
                    let mut k = self.model.kernel(r as Socket, r as u32);
                    self.regs[r]
                        .disarm(&mut k)
                        .map_err(|e| format!("disarm: {e:?}"))?;
                }
                Step::Reregister(r) => {
                    let mut k = self.model.kernel(r as Socket, r as u32);
                    self.regs[r]
                        .deregister(&mut k)
                        .map_err(|e| format!("deregister: {e:?}"))?;
                    self.floor[r] = self.regs[r].generation();
                    self.regs[r] = RegState::new(self.floor[r]);
                }
                Step::Levels(r, bits) => {
                    self.levels[r] = Levels::from_bits(bits);
                    self.model.set_levels(r as Socket, self.levels[r]);
                }
                Step::Deliver(max) => {
                    let (events, _) = self.model.wait(max);
                    self.accept(&events)?;
                }
                Step::Notify => self.model.post(),
            }
            self.check()
        }

        /// After every step: at most one poll per registration may still fire,
        /// and an armed registration whose socket has a polled event true has a
        /// current completion queued (no readiness is lost).
        fn check(&self) -> Result<(), String> {
            for r in 0..2 {
                let live: Vec<_> = self
                    .model
                    .polls()
                    .iter()
                    .filter(|p| {
                        p.slot == r as u32 && !p.cancelled && p.state != PollState::Dequeued
                    })
                    .collect();
                if live.len() > 1 {
                    return Err(format!("registration {r}: {} polls may fire", live.len()));
                }
                if let Phase::Armed(i) = self.regs[r].phase() {
                    let ready = afd_bits(self.levels[r]) & events_for(i) != 0;
                    let current = live
                        .iter()
                        .any(|p| p.generation == self.regs[r].generation());
                    if !current {
                        return Err(format!("registration {r} armed with no current poll"));
                    }
                    let queued = live.iter().any(|p| p.state == PollState::Queued);
                    if ready && !queued {
                        return Err(format!("registration {r}: ready but nothing queued (lost)"));
                    }
                }
            }
            Ok(())
        }

        /// Drains the port: every poll issued yields exactly one packet.
        fn drain(&mut self) -> Result<(), String> {
            for r in 0..2 {
                let mut k = self.model.kernel(r as Socket, r as u32);
                self.regs[r]
                    .deregister(&mut k)
                    .map_err(|e| format!("{e:?}"))?;
            }
            while self.model.queued() > 0 {
                let (events, _) = self.model.wait(8);
                self.accept(&events)?;
            }
            if let Some(p) = self
                .model
                .polls()
                .iter()
                .find(|p| p.state != PollState::Dequeued)
            {
                return Err(format!("a poll never completed: {p:?}"));
            }
            Ok(())
        }
    }

    fn run(steps: Vec<Step>) -> bool {
        let mut w = World::new();
        for (n, s) in steps.iter().enumerate() {
            if let Err(e) = w.step(s) {
                eprintln!("step {n} {s:?}: {e}");
                return false;
            }
        }
        match w.drain() {
            Ok(()) => true,
            Err(e) => {
                eprintln!("drain: {e}");
                false
            }
        }
    }

    #[test]
    fn afd_model_keeps_the_contract_on_random_scenarios() {
        // 2,000 scenarios of up to 100 steps (quickcheck's default size).
        QuickCheck::new()
            .tests(2000)
            .quickcheck(run as fn(Vec<Step>) -> bool);
    }

    #[test]
    fn disarm_then_data_then_rearm_delivers_once_and_the_cancelled_poll_is_dropped() {
        let mut w = World::new();
        for s in [
            Step::Arm(0, Interest::READABLE),
            Step::Disarm(0),
            Step::Levels(0, 1),
            Step::Arm(0, Interest::READABLE),
            Step::Deliver(8),
        ] {
            w.step(&s).unwrap();
        }
        assert_eq!(w.accepted, [(0, 3)], "arm 1, disarm 2, re-arm 3");
        let c = w.model.calls();
        assert_eq!((c.polls, c.cancels, c.waits), (2, 1, 1));
        assert!(w.model.polls()[0].cancelled);
    }

    #[test]
    fn a_cancel_after_completion_issues_no_packet() {
        let mut m = AfdModel::new();
        m.open(0, Levels::from_bits(1));
        let mut k = m.kernel(0, 0);
        k.add(Interest::READABLE, 1).unwrap();
        k.quiet(2).unwrap();
        assert_eq!(m.queued(), 1, "the completion, not a second packet");
        let (events, _) = m.wait(8);
        assert_eq!(events[0].slot, NO_SLOT, "marked cancelled: dropped");
    }
}
