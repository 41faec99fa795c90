//! The `epoll_real`, `blocking_real` and `uring_real` harness: the fuzz alphabet on
//! real descriptors through a real `Poller<B>`, mirrored step by step by the
//! simulated poller of [`super::sim`] over the kernel model (epoll semantics for
//! `Epoll`, the poll set for `Blocking` and `Uring`: io_uring keeps no registration
//! between armings either).
//!
//! Descriptors: up to 12 open numbers over socketpairs, pipes (either end
//! registered) and `/dev/null`; the peer end of each is held apart and never
//! registered (the model knows it too: a number closed under a registration may
//! be reused by a peer). Operations write and read through the peer or the registered end,
//! fill and drain send buffers, shut down or close the peer, close, dup and reuse
//! numbers (the kernel hands out the lowest free one). Before each `deliver` the
//! model takes the real readiness of every open number from poll(2).
//!
//! Checked after every operation:
//! - the result (Ok, or the error's kind) equals the simulator's;
//! - with `stats`: every counter moved exactly as the simulator's commands say:
//!   add/modify/quiet/delete and their `epoll_ctl`s (none on the poll backend),
//!   fallbacks, synthetic events, stale drops, one wait per `deliver`, no waker
//!   write for a synthetic event (nobody is blocked), one waker
//!   write per notify that was not pending, one waker read per `deliver` that found
//!   one pending on the poll(2) backend (none on epoll: its eventfd is
//!   edge-triggered): the minimum system calls, and nothing else;
//! - on `deliver` (timeout 0): no event for a dead or idle registration; every
//!   armed registration whose descriptor poll(2) says ready for its interest (or
//!   hung up, or in error), and whose number was never closed under it, is
//!   delivered (no lost wakeup); the events equal the simulator's, readiness
//!   included; and the simulator's own invariants hold.

use super::sim::{Failure, Owner, Sim};
use arbitrary::Arbitrary;
use pollshot::model::Readiness;
use pollshot::model::{Fd, Levels, Semantics};
use pollshot::{Backend, Events, Interest, Poller, Token};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fd::{AsFd, AsRawFd, OwnedFd};
use rustix::io::Errno;
use std::collections::BTreeMap;
use std::io;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// poll(2)'s half-close bit: Linux and Android only; elsewhere a half-close shows
/// as EOF on read.
#[cfg(any(target_os = "linux", target_os = "android"))]
const RDHUP: PollFlags = PollFlags::RDHUP;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const RDHUP: PollFlags = PollFlags::empty();

/// One operation on real descriptors. `fd` picks among the open numbers, `reg`
/// among every registration made (dead ones included).
#[derive(Arbitrary, Clone, Copy, Debug)]
#[allow(missing_docs)]
pub enum RealOp {
    /// 0 socketpair, 1 pipe read end, 2 pipe write end, 3 `/dev/null`.
    Open {
        kind: u8,
    },
    Dup {
        fd: u8,
    },
    Close {
        fd: u8,
    },
    /// The peer writes `len + 1` bytes: the number becomes readable.
    Write {
        fd: u8,
        len: u8,
    },
    /// Read the number until it would block.
    Read {
        fd: u8,
    },
    /// Write through the number until it would block: not writable.
    Fill {
        fd: u8,
    },
    /// The peer reads until it would block: writable again.
    DrainPeer {
        fd: u8,
    },
    /// The peer shuts down its write side (socketpair): read-closed.
    ShutdownPeer {
        fd: u8,
    },
    /// The peer closes: hang-up (pipe write end: error).
    ClosePeer {
        fd: u8,
    },
    Register {
        fd: u8,
    },
    Arm {
        reg: u8,
        interest: u8,
    },
    Disarm {
        reg: u8,
    },
    Deregister {
        reg: u8,
    },
    Deliver,
    Notify,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Pair,
    PipeRead,
    PipeWrite,
    Null,
}

struct Obj {
    kind: Kind,
    peer: Option<OwnedFd>,
    peer_shut: bool,
    /// Open numbers referring to the registered end's description.
    locals: usize,
}

struct Local {
    fd: OwnedFd,
    obj: usize,
}

struct Harness<B: Backend> {
    poller: Poller<B>,
    sim: Sim,
    epoll: bool,
    /// The io_uring backend, mirrored by the poll-set model: see `counters` and
    /// `deliver` for what is checked differently.
    uring: bool,
    /// The io_uring backend and the model parted where they cannot be mirrored
    /// (see the `Arm` step): the run stops.
    diverged: bool,
    objs: Vec<Obj>,
    locals: BTreeMap<Fd, Local>,
    tokens: Vec<Token>,
    events: Events,
    #[cfg(feature = "stats")]
    last: pollshot::Stats,
    stale: u64,
}

fn failure(e: &io::Error) -> Failure {
    match e.kind() {
        io::ErrorKind::NotFound => Failure::NotFound,
        _ if e.raw_os_error() == Some(Errno::BADF.raw_os_error()) => Failure::BadFd,
        _ => Failure::Other,
    }
}

fn revents(fd: impl AsFd, flags: PollFlags) -> PollFlags {
    let mut p = [PollFd::new(&fd, flags)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    loop {
        match rustix::event::poll(&mut p, Some(&zero)) {
            Ok(_) => return p[0].revents(),
            Err(Errno::INTR) => continue,
            Err(e) => panic!("poll: {e}"),
        }
    }
}

fn drain(fd: impl AsFd) {
    let mut buf = [0u8; 65536];
    for _ in 0..64 {
        match rustix::io::read(&fd, &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

fn fill(fd: impl AsFd) {
    let buf = [7u8; 65536];
    for _ in 0..64 {
        if rustix::io::write(&fd, &buf).is_err() {
            return;
        }
    }
}

fn nonblocking(fd: &OwnedFd) {
    rustix::io::ioctl_fionbio(fd, true).expect("FIONBIO");
}

impl<B: Backend> Harness<B> {
    fn new(semantics: Semantics) -> Harness<B> {
        let poller = Poller::<B>::with_backend().expect("poller");
        Harness {
            #[cfg(feature = "stats")]
            last: poller.stats(),
            poller,
            // The Poller's own start generation and epoch policy.
            sim: Sim::new(semantics, 0, super::sim::EpochPolicy::PerSlot),
            epoll: semantics == Semantics::Epoll,
            uring: B::NAME == "uring",
            diverged: false,
            objs: Vec::new(),
            locals: BTreeMap::new(),
            tokens: Vec::new(),
            events: Events::with_capacity(64),
            stale: 0,
        }
    }

    fn pick_fd(&self, i: u8) -> Option<Fd> {
        let n = self.locals.len();
        (n > 0).then(|| *self.locals.keys().nth(i as usize % n).unwrap())
    }

    fn pick_reg(&self, i: u8) -> Option<usize> {
        let n = self.tokens.len();
        (n > 0).then(|| i as usize % n)
    }

    fn obj_of(&mut self, fd: u8) -> Option<&mut Obj> {
        let fd = self.pick_fd(fd)?;
        let o = self.locals[&fd].obj;
        Some(&mut self.objs[o])
    }

    fn open(&mut self, kind: u8) {
        if self.locals.len() >= 12 {
            return;
        }
        let kind = [Kind::Pair, Kind::PipeRead, Kind::PipeWrite, Kind::Null][kind as usize % 4];
        let (local, peer) = match kind {
            Kind::Pair => {
                let (a, b) = UnixStream::pair().expect("socketpair");
                (OwnedFd::from(a), Some(OwnedFd::from(b)))
            }
            Kind::PipeRead | Kind::PipeWrite => {
                // Plain pipe(2): `pipe2` is missing on Apple targets, and the
                // harness never execs.
                let (r, w) = rustix::pipe::pipe().expect("pipe");
                if kind == Kind::PipeRead {
                    (r, Some(w))
                } else {
                    (w, Some(r))
                }
            }
            Kind::Null => {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/null")
                    .expect("/dev/null");
                (OwnedFd::from(f), None)
            }
        };
        nonblocking(&local);
        if let Some(p) = &peer {
            nonblocking(p);
        }
        let fd = local.as_raw_fd();
        let model = self.sim.model_mut();
        model
            .open_at(fd, kind != Kind::Null)
            .expect("the kernel handed out a number the model has open");
        // The peer is in the model too: a registration whose number was closed
        // may find the peer's description under it once the number is reused.
        if let Some(p) = &peer {
            model
                .open_at(p.as_raw_fd(), true)
                .expect("the kernel handed out a number the model has open");
        }
        self.objs.push(Obj {
            kind,
            peer,
            peer_shut: false,
            locals: 1,
        });
        self.locals.insert(
            fd,
            Local {
                fd: local,
                obj: self.objs.len() - 1,
            },
        );
    }

    fn dup(&mut self, fd: u8) {
        let Some(fd) = self.pick_fd(fd) else { return };
        if self.locals.len() >= 12 {
            return;
        }
        let l = &self.locals[&fd];
        let new = rustix::io::fcntl_dupfd_cloexec(&l.fd, 0).expect("dup");
        let obj = l.obj;
        let n = new.as_raw_fd();
        self.sim
            .model_mut()
            .dup_to(fd, n)
            .expect("the kernel handed out a number the model has open");
        self.objs[obj].locals += 1;
        self.locals.insert(n, Local { fd: new, obj });
    }

    fn close(&mut self, fd: u8) {
        let Some(fd) = self.pick_fd(fd) else { return };
        let l = self.locals.remove(&fd).unwrap();
        self.objs[l.obj].locals -= 1;
        drop(l.fd);
        self.sim.close(fd);
    }

    fn io(&mut self, op: RealOp) {
        let byte = [1u8; 256];
        match op {
            RealOp::Write { fd, len } => {
                if let Some(o) = self.obj_of(fd) {
                    if matches!(o.kind, Kind::Pair | Kind::PipeRead) && !o.peer_shut && o.locals > 0
                    {
                        if let Some(p) = &o.peer {
                            let _ = rustix::io::write(p, &byte[..=len as usize]);
                        }
                    }
                }
            }
            RealOp::Read { fd } => {
                if let Some(fd) = self.pick_fd(fd) {
                    let l = &self.locals[&fd];
                    if matches!(self.objs[l.obj].kind, Kind::Pair | Kind::PipeRead) {
                        drain(&l.fd);
                    }
                }
            }
            RealOp::Fill { fd } => {
                if let Some(fd) = self.pick_fd(fd) {
                    let l = &self.locals[&fd];
                    let o = &self.objs[l.obj];
                    // Never write towards a closed reader (EPIPE, SIGPIPE).
                    if matches!(o.kind, Kind::Pair | Kind::PipeWrite) && o.peer.is_some() {
                        fill(&l.fd);
                    }
                }
            }
            RealOp::DrainPeer { fd } => {
                if let Some(o) = self.obj_of(fd) {
                    if matches!(o.kind, Kind::Pair | Kind::PipeWrite) {
                        if let Some(p) = &o.peer {
                            drain(p);
                        }
                    }
                }
            }
            RealOp::ShutdownPeer { fd } => {
                if let Some(o) = self.obj_of(fd) {
                    if o.kind == Kind::Pair && !o.peer_shut {
                        if let Some(p) = o.peer.take() {
                            let s = UnixStream::from(p);
                            s.shutdown(std::net::Shutdown::Write).expect("shutdown");
                            o.peer = Some(OwnedFd::from(s));
                            o.peer_shut = true;
                        }
                    }
                }
            }
            RealOp::ClosePeer { fd } => {
                if let Some(p) = self.obj_of(fd).and_then(|o| o.peer.take()) {
                    let n = p.as_raw_fd();
                    drop(p);
                    self.sim.close(n);
                }
            }
            _ => unreachable!(),
        }
    }

    /// The model takes every open number's readiness (registered ends and peers)
    /// from poll(2).
    fn sync_levels(&mut self) {
        let locals = self.locals.values().map(|l| &l.fd);
        let peers = self.objs.iter().filter_map(|o| o.peer.as_ref());
        let fds: Vec<&OwnedFd> = locals.chain(peers).collect();
        for fd in fds {
            let r = revents(fd, PollFlags::IN | PollFlags::OUT | PollFlags::PRI | RDHUP);
            let levels = Levels {
                readable: r.contains(PollFlags::IN),
                writable: r.contains(PollFlags::OUT),
                read_closed: !RDHUP.is_empty() && r.contains(RDHUP),
                hang_up: r.contains(PollFlags::HUP),
                error: r.contains(PollFlags::ERR),
                priority: r.contains(PollFlags::PRI),
            };
            self.sim.set_levels(fd.as_raw_fd(), levels);
        }
    }

    fn same(&self, what: &str, real: io::Result<()>, sim: Result<(), Failure>) {
        let real = real.as_ref().map(drop).map_err(failure);
        assert_eq!(
            real, sim,
            "{what}: the poller answered {real:?}, the model {sim:?}"
        );
    }

    /// With `stats`: the counters moved exactly as the simulator says.
    #[cfg(feature = "stats")]
    fn counters(&mut self, what: &str, waits: u64, wakes: u64, wake_reads: u64) {
        use pollshot::model::Command;
        let now = self.poller.stats();
        let d = now.since(&self.last);
        self.last = now;
        let cmds = &self.sim.commands;
        let count = |f: fn(&Command) -> bool| cmds.iter().filter(|c| f(&c.command)).count() as u64;
        let fb = self.sim.fallbacks;
        let stale = self.sim.stale - self.stale;
        self.stale = self.sim.stale;
        let want = pollshot::Stats {
            adds: count(|c| matches!(c, Command::Add(..))),
            modifies: count(|c| matches!(c, Command::Modify(..))),
            quiets: count(|c| matches!(c, Command::Quiet(_))),
            deletes: count(|c| matches!(c, Command::Delete)),
            ctl_calls: if self.epoll { cmds.len() as u64 } else { 0 },
            waits,
            wakes,
            wake_reads,
            not_found_to_add: fb.not_found_to_add as u64,
            exists_to_modify: fb.exists_to_modify as u64,
            not_pollable: fb.not_pollable as u64,
            synthetic: self.sim.synthetic_queued,
            stale,
        };
        if self.uring {
            // Commands and fallbacks as the model says; system calls: one
            // fcntl(F_GETFD) per add (plus a submit when the submission queue is
            // full), at most 3 enters per deliver (submit, and again for what
            // the reap queued), no waker traffic (no waiter is ever blocked);
            // stale drops are the backend's own (a request that fired before its
            // remove), not the model's.
            let same = pollshot::Stats {
                ctl_calls: want.ctl_calls,
                waits: want.waits,
                wakes: want.wakes,
                wake_reads: want.wake_reads,
                stale: want.stale,
                ..d
            };
            assert_eq!(same, want, "{what}: counters moved by {d:?}, want {want:?}");
            assert!(d.ctl_calls >= want.adds, "{what}: {d:?}");
            assert!(d.waits <= 3 * waits, "{what}: {d:?}");
            assert_eq!((d.wakes, d.wake_reads), (0, 0), "{what}: {d:?}");
            return;
        }
        assert_eq!(
            d, want,
            "{what}: counters moved by {d:?}, the minimum is {want:?}"
        );
    }

    #[cfg(not(feature = "stats"))]
    fn counters(&mut self, _: &str, _: u64, _: u64, _: u64) {
        self.stale = self.sim.stale;
    }

    fn deliver(&mut self) {
        self.sync_levels();
        // Before: which registrations are live and armed, and which of those the
        // kernel says are ready.
        let owners = self.sim.owners().to_vec();
        let mut due = Vec::new();
        for (o, ow) in owners.iter().enumerate() {
            let Some((interest, _)) = ow.spec else {
                continue;
            };
            if !ow.alive || ow.tainted {
                continue;
            }
            // The number is open: a registered end, or (a repaired registration
            // whose number was reused) a peer.
            let (fd, null) = match self.locals.get(&ow.fd) {
                Some(l) => (&l.fd, self.objs[l.obj].kind == Kind::Null),
                None => (
                    self.objs
                        .iter()
                        .filter_map(|o| o.peer.as_ref())
                        .find(|p| p.as_raw_fd() == ow.fd)
                        .expect("an untainted registration on a number that is not open"),
                    false,
                ),
            };
            let ready = null || {
                let mut f = PollFlags::empty();
                if interest.is_readable() {
                    f |= PollFlags::IN;
                }
                if interest.is_writable() {
                    f |= PollFlags::OUT;
                }
                !revents(fd, f).is_empty()
            };
            if ready {
                due.push(o);
            }
        }
        let pending = self.sim.model().is_notified();
        let mut real: Vec<(usize, Readiness)> = Vec::new();
        // io_uring: a deliver that found completions already posted (or a pending
        // wake-up) returns them without entering the kernel, so arms queued since
        // are submitted by the next deliver: up to 3 delivers make up the model's
        // one (each still never blocks). Every other backend: exactly one.
        let rounds = if self.uring { 3 } else { 1 };
        let mut delivers = 0;
        for _ in 0..rounds {
            if delivers > 0 && due.iter().all(|o| real.iter().any(|(r, _)| r == o)) {
                break;
            }
            delivers += 1;
            self.deliver_once(&owners, &mut real);
        }
        if self.diverged {
            return;
        }
        for o in &due {
            assert!(
                real.iter().any(|(r, _)| r == o),
                "lost wakeup: registration {o} ({:?}) is armed and its descriptor ready, not delivered: {real:?}",
                owners[*o]
            );
        }
        let mut sim: Vec<(usize, Readiness)> = self
            .sim
            .deliver(0)
            .iter()
            .map(|d| (d.owner, d.readiness))
            .collect();
        if self.uring {
            // io_uring posts a completion when the descriptor becomes ready, and
            // does not look again when the deliver takes it (epoll and poll(2) do):
            // readiness that came and went since (data written, then read) is still
            // delivered once, for a live armed registration. The model is told so
            // (`Sim::fire`: the kernel reports the arming now), and the event is
            // compared by owner.
            for &(o, r) in real.iter() {
                if sim.iter().any(|(s, _)| *s == o) || owners[o].tainted {
                    continue;
                }
                self.sim.fire(o, 0);
                let fired = self.sim.accept(0);
                assert!(
                    fired.iter().any(|d| d.owner == o),
                    "deliver: the poller delivered registration {o}, which the model \
                     cannot report: {:?}",
                    owners[o]
                );
                sim.push((o, r));
            }
            // A number closed under an armed registration: io_uring watches the
            // old description (a request already submitted holds its file) or
            // reports -EBADF (a request still queued), where poll(2) reports
            // POLLNVAL. Those registrations are compared by the checks above only.
            let tainted = |o: &usize| owners[*o].tainted;
            // One the model delivered (POLLNVAL) and the poller did not is idle in
            // the model and still armed in the poller: every later command on it
            // differs (a disarm quiets on one side only). The run ends, as it
            // does for one the poller delivered (`deliver_once`).
            if sim
                .iter()
                .any(|(o, _)| tainted(o) && real.iter().all(|(r, _)| r != o))
            {
                self.diverged = true;
                return;
            }
            real.retain(|e| !tainted(&e.0));
            sim.retain(|e| !tainted(&e.0));
            // The readiness is the kernel's when the request completed (data
            // written, then the peer shut down: readable, not yet read-closed),
            // where the model reads the levels now: compared by owner, and never
            // empty.
            for (o, r) in real.iter_mut() {
                assert!(*r != Readiness::EMPTY, "registration {o}: an empty event");
                *r = Readiness::EMPTY;
            }
            for (_, r) in sim.iter_mut() {
                *r = Readiness::EMPTY;
            }
        }
        real.sort_by_key(|e| e.0);
        sim.sort_by_key(|e| e.0);
        assert_eq!(
            real, sim,
            "deliver: the poller delivered {real:?}, the model {sim:?}"
        );
        // epoll's eventfd is edge-triggered and never drained; the poll(2)
        // backend drains its pipe once.
        let drained = pending && !self.epoll;
        self.counters("deliver", delivers, 0, drained as u64);
    }

    /// One `deliver` at timeout 0; its events are checked (a live, armed
    /// registration each) and appended to `real`.
    fn deliver_once(&mut self, owners: &[Owner], real: &mut Vec<(usize, Readiness)>) {
        let n = self
            .poller
            .deliver(&mut self.events, Some(Duration::ZERO))
            .expect("deliver");
        assert_eq!(n, self.events.len());
        for ev in self.events.iter() {
            let o = self
                .tokens
                .iter()
                .position(|&t| t == ev.token())
                .expect("an event for a token never handed out");
            let ow = &owners[o];
            if self.uring && ow.alive && ow.ever_tainted {
                // io_uring resolved the number when the arm was submitted, after it
                // had been closed and reused: it watched the new descriptor (as
                // documented). The model cannot follow: the run ends.
                self.diverged = true;
                continue;
            }
            assert!(ow.alive, "an event for dead registration {o}: {ev:?}");
            assert!(
                ow.spec.is_some(),
                "an event for idle registration {o}: {ev:?}"
            );
            assert!(
                real.iter().all(|(r, _)| *r != o),
                "registration {o} delivered twice: {ev:?}"
            );
            real.push((o, ev_readiness(ev)));
        }
    }

    /// io_uring: a request submitted before its number was closed keeps the open
    /// file (no EBADF until a re-arm is submitted), and a re-arm is queued (Ok) and
    /// dropped at submission, where the model refuses a command on the closed
    /// number now (EBADF). From such a command on, the two cannot be mirrored:
    /// the run ends (`diverged`).
    fn parted(&mut self, o: usize, real_ok: bool, sim: Result<(), Failure>) -> bool {
        if self.uring && real_ok && sim == Err(Failure::BadFd) && self.sim.owners()[o].tainted {
            self.diverged = true;
        }
        self.diverged
    }

    /// io_uring: a re-arm or disarm of a registration whose number was closed
    /// and then reused before its queued request was submitted (the `deliver`
    /// between returned a notify or completions already posted without entering
    /// the kernel, so no -EBADF came back) replaces or removes that request, and
    /// a new one watches the new descriptor (as documented), where the model's
    /// poll set dropped the entry for POLLNVAL and answers ENOENT (an arm repairs
    /// it with an add; a disarm leaves it to the next arm's add). Both answer Ok;
    /// their commands differ from here on, so the two cannot be mirrored: the run
    /// ends (`diverged`). Where the request was submitted and answered -EBADF, an
    /// arm takes the model's fallback too, and the run goes on.
    fn repaired_unseen(&mut self, tainted: bool, real_ok: bool, sim: Result<(), Failure>) -> bool {
        #[cfg(feature = "stats")]
        let same_repair = self.poller.stats().since(&self.last).not_found_to_add > 0;
        #[cfg(not(feature = "stats"))]
        let same_repair = false;
        let dropped = self
            .sim
            .commands
            .iter()
            .any(|c| c.error == Some(pollshot::model::Errno::NoEnt));
        if self.uring && tainted && real_ok && sim.is_ok() && dropped && !same_repair {
            self.diverged = true;
        }
        self.diverged
    }

    /// io_uring: a step whose system calls went past its adds' `fcntl(F_GETFD)`
    /// may have entered the ring outside a wait (a deregister's, or a
    /// superseding register's, `io_uring_enter` that waits for its requests'
    /// end; a full submission queue's), submitting every queued request: one
    /// whose number was closed since its arm answered -EBADF there, and the
    /// backend answers its next re-arm `NotFound`. The model drops such entries
    /// too ([`Model::poll_submitted`](pollshot::model::Model::poll_submitted)),
    /// but `own`'s (the slot the step armed: its request is pushed after the
    /// submission). Also an `epoll_ctl` counts: a drop the ring did not make
    /// only ends the run earlier (`parted`, `repaired_unseen`).
    #[cfg(feature = "stats")]
    fn submitted(&mut self, before: &pollshot::Stats, _: RealOp, own: Option<Fd>) {
        let d = self.poller.stats().since(before);
        if self.uring && d.ctl_calls > d.adds {
            let own = own.map(|fd| fd as u32);
            self.sim.model_mut().poll_submitted(own);
        }
    }

    /// Without `stats`: every deregister (a superseding register's too) is
    /// taken to have entered.
    #[cfg(not(feature = "stats"))]
    fn submitted(&mut self, _: &(), op: RealOp, _: Option<Fd>) {
        if self.uring && matches!(op, RealOp::Register { .. } | RealOp::Deregister { .. }) {
            self.sim.model_mut().poll_submitted(None);
        }
    }

    fn step(&mut self, op: RealOp) {
        #[cfg(feature = "stats")]
        let before = self.poller.stats();
        #[cfg(not(feature = "stats"))]
        let before = ();
        let own = match op {
            RealOp::Arm { reg, .. } => self.pick_reg(reg).map(|o| self.sim.owners()[o].fd),
            _ => None,
        };
        match op {
            RealOp::Open { kind } => self.open(kind),
            RealOp::Dup { fd } => self.dup(fd),
            RealOp::Close { fd } => self.close(fd),
            RealOp::Write { .. }
            | RealOp::Read { .. }
            | RealOp::Fill { .. }
            | RealOp::DrainPeer { .. }
            | RealOp::ShutdownPeer { .. }
            | RealOp::ClosePeer { .. } => self.io(op),
            RealOp::Register { fd } => {
                let Some(fd) = self.pick_fd(fd) else { return };
                // A registration of the number already: superseded, deregistered.
                let supersedes = self.sim.owners().iter().any(|o| o.alive && o.fd == fd);
                let token = self
                    .poller
                    .register(&self.locals[&fd].fd)
                    .expect("register");
                let owner = self.sim.register(fd);
                assert_eq!(owner, self.tokens.len());
                self.tokens.push(token);
                // io_uring: that deregister waits as `Deregister`'s does (below).
                self.counters("register", u64::from(self.uring && supersedes), 0, 0);
            }
            RealOp::Arm { reg, interest } => {
                let Some(o) = self.pick_reg(reg) else { return };
                let i: Interest = super::interest(interest);
                let tainted = self.sim.owners()[o].tainted;
                let real = self.poller.arm(self.tokens[o], i);
                let sim = self.sim.arm(o, i);
                if self.parted(o, real.is_ok(), sim)
                    || self.repaired_unseen(tainted, real.is_ok(), sim)
                {
                    return;
                }
                self.same("arm", real, sim);
                // A synthetic event wakes the kernel only for a blocked waiter, and
                // this harness never blocks (it delivers with timeout 0).
                self.counters("arm", 0, 0, 0);
            }
            RealOp::Disarm { reg } => {
                let Some(o) = self.pick_reg(reg) else { return };
                let tainted = self.sim.owners()[o].tainted;
                let real = self.poller.disarm(self.tokens[o]);
                let sim = self.sim.disarm(o);
                if self.parted(o, real.is_ok(), sim)
                    || self.repaired_unseen(tainted, real.is_ok(), sim)
                {
                    return;
                }
                self.same("disarm", real, sim);
                self.counters("disarm", 0, 0, 0);
            }
            RealOp::Deregister { reg } => {
                let Some(o) = self.pick_reg(reg) else { return };
                let real = self.poller.deregister(self.tokens[o]);
                let sim = self.sim.deregister(o);
                self.same("deregister", real, sim);
                // io_uring: a deregister waits for its requests' end and takes
                // what the completion queue holds meanwhile (the private epoll's
                // events among them: its epoll_wait is a wait).
                self.counters("deregister", u64::from(self.uring), 0, 0);
            }
            RealOp::Deliver => self.deliver(),
            RealOp::Notify => {
                self.poller.notify().expect("notify");
                let pending = self.sim.notify();
                self.counters("notify", 0, (!pending) as u64, 0);
            }
        }
        if matches!(
            op,
            RealOp::Register { .. }
                | RealOp::Arm { .. }
                | RealOp::Disarm { .. }
                | RealOp::Deregister { .. }
        ) {
            self.submitted(&before, op, own);
        }
        self.sim.check();
    }
}

fn ev_readiness(ev: &pollshot::Event) -> Readiness {
    let mut r = Readiness::EMPTY;
    for (on, bit) in [
        (ev.is_readable(), Readiness::READABLE),
        (ev.is_writable(), Readiness::WRITABLE),
        (ev.is_read_closed(), Readiness::READ_CLOSED),
        (ev.is_write_closed(), Readiness::WRITE_CLOSED),
        (ev.is_error(), Readiness::ERROR),
    ] {
        if on {
            r.insert(bit);
        }
    }
    r
}

/// Runs `ops` on a real `Poller<B>` mirrored by a model with `semantics`, then
/// one last `deliver`. Panics on the first difference.
///
/// The model mirrors the process's descriptor numbers, so nothing else may open
/// or close descriptors meanwhile: runs in one process are serialised.
pub fn run<B: Backend>(semantics: Semantics, ops: &[RealOp]) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut h = Harness::<B>::new(semantics);
    for &op in ops {
        h.step(op);
        if h.diverged {
            return;
        }
    }
    h.step(RealOp::Deliver);
}
