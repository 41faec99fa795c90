//! A simulated poller: the table of `pollshot::Poller` (a slot per descriptor
//! number, incarnations, start generations, the synthetic queue, the acceptance
//! check of `deliver`) driving
//! `pollshot::state::RegState` against `pollshot::model::Model`, with the core
//! invariants checked after every operation. Pure: no system call.
//!
//! Several simulated threads share the table. A thread's `Wait` takes what the
//! kernel reports into its own buffer; its `Accept` later checks that buffer
//! against the table. Anything may happen in between (another thread disarms,
//! re-arms, deregisters, registers a reused number), which is where stale tags
//! and in-flight deliveries come from.
//!
//! Invariants (a panic names the one broken):
//! - (a) the kernel's state equals the table's after every operation, for every
//!   live registration whose descriptor number was never closed under it;
//! - (b) an accepted event was armed by the registration it is delivered to, for
//!   its current arming (ground truth: the model's `Origin`, not the tags);
//! - (c) at most one delivery per arming;
//! - (d) a `Deliver` delivers every armed registration whose description is ready
//!   (unless an event for it is already in some thread's hands);
//! - (e) no kernel command where none is needed: arm of a registration armed for
//!   the same interest and disarm of an idle one issue none; any other arm issues
//!   one, or two when the kernel's answer forced a fallback; a disarm one; a
//!   deregistration one exactly when the kernel holds the descriptor;
//! - (f) AFD: no poll is pending unless it is its registration's current one
//!   (one the backend forgot would complete for a dead or re-armed arming, or
//!   never, its memory held until then);
//! - (g) a deregister whose delete the kernel accepted left nothing of the
//!   registration in the kernel (a refused one keeps it for the retry).
//!
//! Parity ([`run_parity`]): the same operations run on epoll, every kqueue
//! kernel family (FreeBSD and the kernels like it, OpenBSD 6.4+, NetBSD 8/9;
//! `udata` carrying the generation, or fixed at `EV_ADD` as on a 32-bit target;
//! on 32-bit targets only the latter, see [`runs_here`]), poll, event ports and
//! AFD semantics must deliver the same armings at the same operations, and give
//! the same results, for every registration that was not left behind by a close
//! (tainted), raced on kqueue (see [`Owner::raced`]), refused by AFD (not a
//! socket, [`Owner::refused`]), delivered by AFD for readiness gone by the
//! wait ([`Owner::gone`]) or refused a command on one semantics only
//! ([`Owner::refusals`]).
//!
//! And an arm of a live registration whose number is open succeeds, whatever
//! happened to the number before (closed, reused, dup'd: the fallbacks repair it).
//! A wait that fetched only stale events delivers nothing ([`Op::StaleWait`]); a
//! fork's re-initialisation issues only adds, one per armed registration, to the
//! child's new kernel ([`Op::Fork`]). A command the kernel refuses
//! ([`Op::Refuse`]) changes nothing in the table but a deregister's, which keeps
//! the registration disarmed and owing its delete.

use pollshot::model::{
    Command, CommandRecord, Errno, Fd, Levels, Model, ModelEvent, Origin, RearmRecord, Semantics,
};
use pollshot::model::{RawEvent, Readiness};
use pollshot::state::{Armed, Fallbacks, KernelError, Phase, RegState};
use pollshot::Interest;

/// Simulated threads.
pub const THREADS: usize = 3;

/// One operation of the alphabet. `fd` picks among the open descriptor numbers
/// (modulo their count), `reg` among every registration made so far, dead ones
/// included (modulo their count), `thread` among [`THREADS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Open a new description at the lowest free number (reusing numbers).
    Open {
        /// `false`: a regular file (the kernel refuses to poll it).
        pollable: bool,
    },
    /// dup(2) an open number to the lowest free one.
    Dup {
        /// Which open number.
        fd: u8,
    },
    /// close(2) an open number, registered or not.
    Close {
        /// Which open number.
        fd: u8,
    },
    /// Set the readiness of the description behind an open number.
    Levels {
        /// Which open number.
        fd: u8,
        /// [`Levels::from_bits`].
        bits: u8,
    },
    /// Register an open number (superseding a registration of the same number).
    Register {
        /// Which open number.
        fd: u8,
    },
    /// Arm a registration.
    Arm {
        /// Which registration.
        reg: u8,
        /// For what.
        interest: Interest,
    },
    /// Disarm a registration.
    Disarm {
        /// Which registration.
        reg: u8,
    },
    /// Deregister a registration.
    Deregister {
        /// Which registration.
        reg: u8,
    },
    /// A thread's kernel wait: what is ready goes into its buffer.
    Wait {
        /// Which thread.
        thread: u8,
    },
    /// A thread checks its buffer against the table.
    Accept {
        /// Which thread.
        thread: u8,
    },
    /// A whole `deliver` by one thread, checking that no readiness is lost.
    Deliver {
        /// Which thread.
        thread: u8,
    },
    /// The kernel reports a registration's arming now, whatever the levels (to a
    /// thread's buffer): a current tag.
    Fire {
        /// Which registration.
        reg: u8,
        /// Which thread.
        thread: u8,
    },
    /// A kernel event for a registration's slot with a stale tag (an older
    /// generation, or the incarnation of an earlier registration of the slot).
    Stale {
        /// Which registration.
        reg: u8,
        /// How far back.
        back: u8,
        /// Which thread.
        thread: u8,
    },
    /// `notify`.
    Notify,
    /// A thread's `deliver` whose first kernel wait fetches only stale events
    /// (one for a registration's slot with a stale tag, as [`Op::Stale`]): it
    /// delivers nothing from them and waits again (a whole [`Op::Deliver`]).
    StaleWait {
        /// Which registration's slot.
        reg: u8,
        /// How far back.
        back: u8,
        /// Which thread.
        thread: u8,
    },
    /// `fork`, then `reinit_after_fork` in the child, which the simulation
    /// follows from here on: a new kernel instance; registrations that were armed
    /// are added to it armed (always-ready ones queue a synthetic event again),
    /// idle ones become fresh; events other threads held are gone with them.
    Fork,
    /// The kernel refuses the first command of the next operation with ENOMEM
    /// ([`Model::refuse_next`]): an arm or a disarm fails with the state
    /// unchanged; a deregister fails and keeps the registration, disarmed and
    /// still owing its delete ([`Owner::owes_delete`]); a superseded
    /// registration's delete fails and its slot is the new one's all the same;
    /// a fork's re-add fails with the registration still armed, and the
    /// re-initialisation is made again (the caller's retry: another new kernel).
    Refuse,
}

/// Why an operation failed, comparable across semantics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The token names no live registration.
    NotFound,
    /// The descriptor number is closed (EBADF).
    BadFd,
    /// Another kernel refusal.
    Other,
}

fn failure(e: &KernelError) -> Failure {
    match e {
        KernelError::BadFd => Failure::BadFd,
        KernelError::NotFound => Failure::NotFound,
        _ => Failure::Other,
    }
}

/// One delivered event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The registration.
    pub owner: usize,
    /// The arming it completed (the driver's count, 1 for the first).
    pub arming: u64,
    /// What was reported (merged over kqueue filters).
    pub readiness: Readiness,
}

/// What a registration's history records, for parity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logged {
    /// An arm, disarm or deregister at operation `.0` and its result.
    Result(usize, Result<(), Failure>),
    /// A delivery at operation `.0` of arming `.1`.
    Delivered(usize, u64),
}

/// Everything known about one registration, live or dead.
#[derive(Clone, Debug)]
pub struct Owner {
    /// The descriptor number it was registered with.
    pub fd: Fd,
    /// Its slot in the table.
    pub slot: u32,
    /// Its incarnation.
    pub incarnation: u32,
    /// Not yet deregistered or superseded.
    pub alive: bool,
    /// Its number was closed while it was registered and it was not armed
    /// through the kernel since: the kernel may hold an orphan (epoll) or nothing
    /// (kqueue), so (a) and (d) skip it. An arm that reaches the kernel while the
    /// number is open again repairs it (scenario P05: ENOENT becomes ADD).
    pub tainted: bool,
    /// It was ever tainted: parity skips it (epoll may deliver an orphan's event
    /// that kqueue dropped with the number).
    pub ever_tainted: bool,
    /// kqueue only: it was delivered by an event of an earlier arming that was in
    /// a thread's hands across a disarm and re-arm (with `udata` fixed at
    /// `EV_ADD`, which cannot tell armings apart), or its two filters fired to
    /// two threads. Parity skips it.
    pub raced: bool,
    /// AFD only: the number named a description the kernel cannot poll (not a
    /// socket), so `Poller::register` refused it (`InvalidInput`): the
    /// registration never existed there (not alive from the start, the slot's
    /// registration untouched). Parity skips it.
    pub refused: bool,
    /// AFD only: a wait dequeued a completion of its arming whose events were
    /// no longer true (a poll's packet stays queued; the other kernels look at
    /// the levels when they wait, and report nothing then). Parity skips it.
    pub gone: bool,
    /// The arming in force: interest and number.
    pub spec: Option<(Interest, u64)>,
    armings: u64,
    /// Armings delivered.
    pub delivered: Vec<u64>,
    /// Its generation when it died.
    pub last_generation: u32,
    /// Its deregister was refused: the kernel may still hold the arming that
    /// was in force then (stale: the table moved to a new generation and is
    /// idle) until a command of the registration replaces it.
    pub owes_delete: bool,
    /// The operations (by number) whose kernel command was refused
    /// ([`Op::Refuse`]). Parity skips a registration whose refusals differ
    /// between semantics (one issued a command where another had none to
    /// issue: an always-ready registration).
    pub refusals: Vec<usize>,
    /// Its history.
    pub log: Vec<Logged>,
}

struct Entry {
    fd: Fd,
    owner: usize,
    incarnation: u32,
    state: RegState,
}

#[derive(Clone, Copy, Debug)]
struct Flight {
    ev: ModelEvent,
    synthetic: bool,
    fabricated: bool,
}

impl Flight {
    /// The synthetic event an arm of an always-ready registration queues.
    fn synthetic(slot: usize, generation: u32, interest: Interest, origin: Origin) -> Flight {
        Flight {
            ev: ModelEvent {
                raw: RawEvent {
                    slot: slot as u32,
                    stamp: generation,
                    readiness: synthetic_readiness(interest),
                },
                origin,
                filter: None,
            },
            synthetic: true,
            fabricated: false,
        }
    }
}

/// How a new registration's first generation is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochPolicy {
    /// Above the last generation of the slot's previous registration (wrap-safe:
    /// a tag carries the slot, so only that slot's stale tags matter). `Poller`'s
    /// rule (`src/table.rs`); an earlier global `fetch_max` stopped advancing once
    /// a generation wrapped, and this simulator found a stale delivery with it.
    PerSlot,
}

/// The simulated poller. See the module docs.
pub struct Sim {
    model: Model,
    policy: EpochPolicy,
    start: u32,
    slot_epoch: Vec<u32>,
    /// Per slot: the last stamps the kernel took (epoll and poll: the generations
    /// of commands that succeeded and of synthetic events; kqueue: incarnations).
    slot_stamps: Vec<Vec<u32>>,
    /// Indexed by descriptor number, as `Poller`'s table is: one slot per number.
    slots: Vec<Option<Entry>>,
    incarnations: u32,
    synthetic: Vec<Flight>,
    threads: [Vec<Flight>; THREADS],
    owners: Vec<Owner>,
    op: usize,
    /// Events dropped as stale.
    pub stale: u64,
    /// Commands of the last operation.
    pub commands: Vec<CommandRecord>,
    /// Fallbacks taken by the last operation.
    pub fallbacks: Fallbacks,
    /// Synthetic events queued by the last operation.
    pub synthetic_queued: u64,
    /// [`Op::Refuse`] came last: the next operation's first command is refused.
    refuse_next: bool,
}

fn synthetic_readiness(interest: Interest) -> Readiness {
    let mut r = Readiness::EMPTY;
    if interest.is_readable() {
        r.insert(Readiness::READABLE);
    }
    if interest.is_writable() {
        r.insert(Readiness::WRITABLE);
    }
    r
}

impl Sim {
    /// An empty poller on a model with `semantics`; every slot's first
    /// registration starts at generation `start` (its first arming is `start + 1`).
    pub fn new(semantics: Semantics, start: u32, policy: EpochPolicy) -> Sim {
        Sim {
            model: Model::new(semantics),
            policy,
            start,
            slot_epoch: Vec::new(),
            slot_stamps: Vec::new(),
            slots: Vec::new(),
            incarnations: 0,
            synthetic: Vec::new(),
            threads: Default::default(),
            owners: Vec::new(),
            op: 0,
            stale: 0,
            commands: Vec::new(),
            fallbacks: Fallbacks::default(),
            synthetic_queued: 0,
            refuse_next: false,
        }
    }

    /// The same, with the kqueue backend re-arming with `record`.
    pub fn with_rearm(
        semantics: Semantics,
        record: RearmRecord,
        start: u32,
        policy: EpochPolicy,
    ) -> Sim {
        let mut sim = Sim::new(semantics, start, policy);
        sim.model.set_rearm_record(record);
        sim
    }

    /// The kernel.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The kernel, to mirror descriptor changes made elsewhere.
    pub fn model_mut(&mut self) -> &mut Model {
        &mut self.model
    }

    /// Every registration made so far.
    pub fn owners(&self) -> &[Owner] {
        &self.owners
    }

    /// The live registration of `owner`: its state.
    pub fn state(&self, owner: usize) -> Option<RegState> {
        let o = self.owners.get(owner)?;
        if !o.alive {
            return None;
        }
        self.slots[o.slot as usize].as_ref().map(|e| e.state)
    }

    fn sem(&self) -> Semantics {
        self.model.semantics()
    }

    fn begin(&mut self) {
        self.commands.clear();
        self.fallbacks = Fallbacks::default();
        self.synthetic_queued = 0;
    }

    /// Opens a description at the lowest free number.
    pub fn open(&mut self, pollable: bool) -> Fd {
        self.model.open(pollable)
    }

    /// The number `fd` is closed: a registration on it is tainted.
    pub fn close(&mut self, fd: Fd) {
        if self.model.close(fd).is_ok() {
            if let Some(Some(entry)) = self.slots.get(fd as usize) {
                let o = entry.owner;
                self.owners[o].tainted = true;
                self.owners[o].ever_tainted = true;
            }
        }
    }

    /// Sets the levels of the description behind `fd` (a closed `fd` is ignored).
    pub fn set_levels(&mut self, fd: Fd, levels: Levels) {
        if let Some(d) = self.model.description(fd) {
            self.model.set_levels(d, levels);
        }
    }

    /// Notes that `owner`'s command in this operation was refused, if it was.
    fn note_refusal(&mut self, owner: usize, cmds: &[CommandRecord]) -> bool {
        let refused = cmds.iter().any(|c| c.error == Some(Errno::NoMem));
        if refused {
            let op = self.op;
            self.owners[owner].refusals.push(op);
        }
        refused
    }

    /// Deregisters the registration in `slot` (`superseded`: by a new
    /// registration of its number), as `Poller::free` does: a refused delete
    /// keeps a deregistration's registration, idle with a new generation and
    /// still in the kernel; a superseded one's slot is emptied all the same.
    fn free(&mut self, slot: usize, superseded: bool) -> Result<(), Failure> {
        if superseded && self.sem().is_kqueue() {
            // The kqueue backend holds a superseded registration's deletes back
            // to ride on the next command for the number (`Shared::hold_back`),
            // and ignores their answer: the poller never sees one refused.
            self.model.refuse_next(false);
        }
        let entry = self.slots[slot].as_mut().expect("free of an empty slot");
        let owed = entry.state.in_kernel();
        let before = entry.state;
        let origin = Origin {
            owner: entry.owner as u64,
            arming: 0,
        };
        let r = entry.state.deregister(&mut self.model.kernel(
            entry.fd,
            slot as u32,
            entry.incarnation,
            origin,
        ));
        let (owner, fd, after) = (entry.owner, entry.fd, entry.state);
        let cmds = self.model.take_commands();
        assert_eq!(
            cmds.len(),
            owed as usize,
            "(e) deregister issued {cmds:?}; the kernel held it: {owed}"
        );
        if owed {
            assert_eq!(cmds[0].command, Command::Delete);
        }
        let refused = self.note_refusal(owner, &cmds);
        self.commands.extend(cmds);
        assert_eq!(
            after.generation(),
            before.generation().wrapping_add(1),
            "deregister: a new generation"
        );
        if refused && !superseded {
            // Kept for the retry: disarmed, still in the kernel.
            assert!(r.is_err(), "a refused delete answered {r:?}");
            assert_eq!(after.phase(), Phase::Idle, "a refused deregister");
            assert!(after.in_kernel(), "a refused deregister owes its delete");
            let o = &mut self.owners[owner];
            o.spec = None;
            o.owes_delete = true;
            return r.map(drop).map_err(|e| failure(&e));
        }
        assert!(refused || r.is_ok(), "deregister failed: {r:?}");
        let entry = self.slots[slot].take().expect("the slot");
        let g = entry.state.generation();
        self.slot_epoch[slot] = g;
        let tainted = self.owners[owner].tainted;
        let o = &mut self.owners[owner];
        o.alive = false;
        o.spec = None;
        o.last_generation = g;
        o.owes_delete = false;
        if owed && r.is_ok() && !superseded && !tainted && self.model.is_open(fd) {
            // (g) A delete that returned Ok left nothing of the registration in
            // the kernel. (A registration that never reached the kernel owes
            // none: what the kernel may hold under its number is an orphan it
            // never knew, a closed dup's or a superseded registration's whose
            // delete was refused, with a stale tag.)
            let view = self.model.view(fd, slot as u32);
            assert!(
                !view.present,
                "(g) registration {owner} deregistered, but the kernel ({:?}) still holds {view:?}",
                self.sem()
            );
        }
        r.map(drop).map_err(|e| failure(&e))
    }

    /// Registers the open number `fd`, superseding a registration of the same
    /// number as `Poller::register` does. Returns the new registration. On AFD
    /// a number whose description the kernel cannot poll is refused (see
    /// [`Owner::refused`]).
    pub fn register(&mut self, fd: Fd) -> usize {
        self.begin();
        // The slot is the number's own.
        let slot = fd as usize;
        while self.slots.len() <= slot {
            self.slots.push(None);
            self.slot_epoch.push(self.start);
            self.slot_stamps.push(Vec::new());
        }
        if self.sem().registers_sockets_only() && !self.pollable(fd) {
            let owner = self.owners.len();
            self.owners.push(Owner {
                fd,
                slot: fd as u32,
                incarnation: u32::MAX,
                alive: false,
                tainted: false,
                ever_tainted: false,
                raced: false,
                refused: true,
                gone: false,
                spec: None,
                armings: 0,
                delivered: Vec::new(),
                last_generation: 0,
                owes_delete: false,
                refusals: Vec::new(),
                log: Vec::new(),
            });
            return owner;
        }
        if let Some(owner) = self.slots[slot].as_ref().map(|e| e.owner) {
            let r = self.free(slot, true);
            let op = self.op;
            self.owners[owner].log.push(Logged::Result(op, r));
        }
        let start = match self.policy {
            EpochPolicy::PerSlot => self.slot_epoch[slot],
        };
        let incarnation = self.incarnations;
        self.incarnations = self.incarnations.wrapping_add(1);
        if !self.model.tag_is_generation() {
            self.note_stamp(slot, Model::kqueue_stamp(incarnation));
        }
        let owner = self.owners.len();
        self.owners.push(Owner {
            fd,
            slot: slot as u32,
            incarnation,
            alive: true,
            tainted: false,
            ever_tainted: false,
            raced: false,
            refused: false,
            gone: false,
            spec: None,
            armings: 0,
            delivered: Vec::new(),
            last_generation: start,
            owes_delete: false,
            refusals: Vec::new(),
            log: Vec::new(),
        });
        self.slots[slot] = Some(Entry {
            fd,
            owner,
            incarnation,
            state: RegState::new(start),
        });
        owner
    }

    /// Whether `fd` is open on a description the kernel can poll.
    fn pollable(&self, fd: Fd) -> bool {
        self.model
            .description(fd)
            .is_some_and(|d| self.model.is_pollable(d))
    }

    /// Whether an arm of `fd` may fail although the number is open: on AFD,
    /// a registered socket's number closed and reused by a handle that is not a
    /// socket (the poll of it is refused, and the backend passes that on).
    fn arm_may_fail(&self, fd: Fd) -> bool {
        !self.model.is_open(fd) || (self.sem().registers_sockets_only() && !self.pollable(fd))
    }

    fn note_stamp(&mut self, slot: usize, stamp: u32) {
        let h = &mut self.slot_stamps[slot];
        if h.last() != Some(&stamp) {
            if h.len() == 8 {
                h.remove(0);
            }
            h.push(stamp);
        }
    }

    /// Notes the stamps that `commands` (for `slot`) gave the kernel.
    fn note_commands(&mut self, slot: usize, commands: &[CommandRecord]) {
        if !self.model.tag_is_generation() {
            return;
        }
        let gens: Vec<u32> = commands
            .iter()
            .filter(|c| c.error.is_none())
            .filter_map(|c| match c.command {
                Command::Add(_, g) | Command::Modify(_, g) | Command::Quiet(g) => Some(g),
                Command::Delete => None,
            })
            .collect();
        for g in gens {
            self.note_stamp(slot, g);
        }
    }

    fn live(&self, owner: usize) -> Option<usize> {
        let o = self.owners.get(owner)?;
        o.alive.then_some(o.slot as usize)
    }

    fn log(&mut self, owner: usize, r: Result<(), Failure>) -> Result<(), Failure> {
        let op = self.op;
        if let Some(o) = self.owners.get_mut(owner) {
            o.log.push(Logged::Result(op, r));
        }
        r
    }

    /// `Poller::arm`.
    pub fn arm(&mut self, owner: usize, interest: Interest) -> Result<(), Failure> {
        self.begin();
        let Some(slot) = self.live(owner) else {
            return self.log(owner, Err(Failure::NotFound));
        };
        let o = &self.owners[owner];
        let spec = o.spec;
        let renew = spec.map(|(i, _)| i) != Some(interest);
        let arming = match spec {
            Some((_, n)) if !renew => n,
            _ => o.armings + 1,
        };
        let entry = self.slots[slot].as_mut().unwrap();
        let before = entry.state;
        let origin = Origin {
            owner: owner as u64,
            arming,
        };
        let mut fb = Fallbacks::default();
        let r = entry.state.arm(
            interest,
            &mut self
                .model
                .kernel(entry.fd, slot as u32, entry.incarnation, origin),
            &mut fb,
        );
        let after = entry.state;
        let cmds = self.model.take_commands();
        self.fallbacks = fb;
        let first_ok = match before.phase() {
            Phase::Fresh => {
                matches!(cmds.first(), Some(CommandRecord { command: Command::Add(i, _), .. }) if *i == interest)
            }
            _ => {
                matches!(cmds.first(), Some(CommandRecord { command: Command::Modify(i, _), .. }) if *i == interest)
            }
        };
        let result = match r {
            Ok(Armed::Unchanged) => {
                assert!(
                    cmds.is_empty(),
                    "(e) arm of an armed registration issued {cmds:?}"
                );
                assert!(
                    !renew,
                    "arm reported unchanged but the arming {spec:?} is not for {interest:?}"
                );
                Ok(())
            }
            Ok(Armed::Kernel) => {
                // The kernel now watches what the number refers to, under the
                // current tag: a registration left behind by a close is repaired
                // once its number is open again (the poll backend arms a closed
                // number without complaint).
                let fd = self.owners[owner].fd;
                if self.model.is_open(fd) {
                    self.owners[owner].tainted = false;
                }
                // The kernel's arming is this one: what a refused deregister
                // left there is replaced.
                self.owners[owner].owes_delete = false;
                assert!(renew, "(e) arm for the interest in force issued {cmds:?}");
                assert!(first_ok, "arm from {:?} issued {cmds:?}", before.phase());
                let fallback =
                    cmds.len() == 2 && matches!(cmds[0].error, Some(Errno::NoEnt | Errno::Exist));
                assert!(cmds.len() == 1 || fallback, "(e) arm issued {cmds:?}");
                assert_eq!(cmds.last().unwrap().error, None);
                self.set_spec(owner, Some((interest, arming)));
                Ok(())
            }
            Ok(Armed::Synthetic) => {
                assert!(
                    renew,
                    "(e) arm for the interest in force queued a synthetic event"
                );
                if before.is_always_ready() {
                    assert!(
                        cmds.is_empty(),
                        "(e) arm of an always-ready registration issued {cmds:?}"
                    );
                } else {
                    assert!(first_ok && cmds.len() <= 2, "arm issued {cmds:?}");
                    assert!(matches!(
                        cmds.last().unwrap().error,
                        Some(Errno::Perm | Errno::Inval)
                    ));
                }
                self.set_spec(owner, Some((interest, arming)));
                let flight = Flight::synthetic(slot, after.generation(), interest, origin);
                // Poller::queue_synthetic: at most one queued entry per slot.
                match self
                    .synthetic
                    .iter_mut()
                    .find(|f| f.ev.raw.slot == slot as u32)
                {
                    Some(f) => *f = flight,
                    None => self.synthetic.push(flight),
                }
                self.synthetic_queued += 1;
                // Poller::arm wakes the kernel only for a blocked waiter, and the
                // simulated threads' waits never block: no wake-up here.
                Ok(())
            }
            Err(e) => {
                assert_eq!(before, after, "a failed arm ({e:?}) changed the state");
                let fd = self.owners[owner].fd;
                let refused = self.note_refusal(owner, &cmds);
                assert!(
                    refused || self.arm_may_fail(fd),
                    "arm of registration {owner} on open fd {fd} failed: {e:?} after {cmds:?}"
                );
                Err(failure(&e))
            }
        };
        self.note_commands(slot, &cmds);
        self.commands = cmds;
        if self.synthetic_queued > 0 && self.model.tag_is_generation() {
            self.note_stamp(slot, after.generation());
        }
        self.log(owner, result)
    }

    fn set_spec(&mut self, owner: usize, spec: Option<(Interest, u64)>) {
        let o = &mut self.owners[owner];
        if let Some((_, n)) = spec {
            o.armings = o.armings.max(n);
        }
        o.spec = spec;
    }

    /// `Poller::disarm`.
    pub fn disarm(&mut self, owner: usize) -> Result<(), Failure> {
        self.begin();
        let Some(slot) = self.live(owner) else {
            return self.log(owner, Err(Failure::NotFound));
        };
        let spec = self.owners[owner].spec;
        let entry = self.slots[slot].as_mut().unwrap();
        let before = entry.state;
        let origin = Origin {
            owner: owner as u64,
            arming: 0,
        };
        let r = entry.state.disarm(&mut self.model.kernel(
            entry.fd,
            slot as u32,
            entry.incarnation,
            origin,
        ));
        let after = entry.state;
        let cmds = self.model.take_commands();
        if self.note_refusal(owner, &cmds) {
            assert_eq!(before, after, "a refused disarm changed the state");
            assert!(r.is_err(), "a refused disarm answered {r:?}");
        }
        match spec {
            None => assert!(
                cmds.is_empty(),
                "(e) disarm of an idle registration issued {cmds:?}"
            ),
            Some(_) => {
                let want = usize::from(!before.is_always_ready());
                assert_eq!(cmds.len(), want, "(e) disarm issued {cmds:?}");
                if want == 1 {
                    assert!(matches!(cmds[0].command, Command::Quiet(_)));
                }
            }
        }
        if !matches!(after.phase(), Phase::Armed(_)) {
            self.set_spec(owner, None);
        }
        self.note_commands(slot, &cmds);
        self.commands = cmds;
        let r = r.map(drop).map_err(|e| failure(&e));
        self.log(owner, r)
    }

    /// `Poller::deregister`.
    pub fn deregister(&mut self, owner: usize) -> Result<(), Failure> {
        self.begin();
        let Some(slot) = self.live(owner) else {
            return self.log(owner, Err(Failure::NotFound));
        };
        let r = self.free(slot, false);
        self.log(owner, r)
    }

    /// `Poller::notify`; returns whether one was already pending.
    pub fn notify(&mut self) -> bool {
        self.begin();
        self.model.notify()
    }

    fn in_flight(&self) -> impl Iterator<Item = &Flight> {
        self.threads.iter().flatten().chain(self.synthetic.iter())
    }

    /// Adds kernel events to a thread's buffer, noting kqueue's split races.
    fn take_into(&mut self, thread: usize, events: Vec<ModelEvent>) {
        for ev in events {
            if self.sem().split_filters() {
                let other_thread = self.threads.iter().enumerate().any(|(t, buf)| {
                    t != thread
                        && buf.iter().any(|f| {
                            !f.synthetic
                                && f.ev.raw.slot == ev.raw.slot
                                && f.ev.raw.stamp == ev.raw.stamp
                        })
                });
                if other_thread {
                    if let Some(Some(e)) = self.slots.get(ev.raw.slot as usize) {
                        let o = e.owner;
                        self.owners[o].raced = true;
                    }
                }
            }
            self.threads[thread].push(Flight {
                ev,
                synthetic: false,
                fabricated: false,
            });
        }
    }

    /// A thread's kernel wait (the first half of `deliver`): synthetic events
    /// first, then what the kernel reports. A thread still holding events from
    /// its last wait checks them first.
    pub fn wait(&mut self, thread: usize) -> Vec<Delivery> {
        let earlier = self.accept(thread);
        self.begin();
        let synthetic = std::mem::take(&mut self.synthetic);
        self.threads[thread].extend(synthetic);
        let events = self.model.wait(usize::MAX);
        if self.sem() == Semantics::Afd {
            for ev in &events {
                let Some(o) = self.owners.get(ev.origin.owner as usize) else {
                    continue;
                };
                let current = o.spec.is_some_and(|(_, n)| n == ev.origin.arming);
                if current && self.ready(ev.origin.owner as usize) == Some(false) {
                    self.owners[ev.origin.owner as usize].gone = true;
                }
            }
        }
        self.take_into(thread, events);
        earlier
    }

    /// The kernel reports live `owner`'s arming now to `thread` (see
    /// [`Model::force_report`]); nothing for a dead one.
    pub fn fire(&mut self, owner: usize, thread: usize) -> Vec<Delivery> {
        let earlier = self.accept(thread);
        let o = &self.owners[owner];
        // A description the kernel cannot poll is always ready: nothing comes and goes.
        if !o.alive
            || self
                .model
                .description(o.fd)
                .is_some_and(|d| !self.model.is_pollable(d))
        {
            return earlier;
        }
        if let Some(ev) = self.model.force_report(o.fd, o.slot) {
            self.take_into(thread, vec![ev]);
        }
        earlier
    }

    /// A kernel event for `owner`'s slot with a stale tag, to `thread`: one of
    /// the last stamps the kernel was given for the slot that is not current
    /// (nothing if there is none).
    pub fn inject_stale(&mut self, owner: usize, back: u8, thread: usize) -> Vec<Delivery> {
        let earlier = self.accept(thread);
        let slot = self.owners[owner].slot as usize;
        let current = self.slots[slot].as_ref().map(|e| {
            if self.model.tag_is_generation() {
                e.state.generation()
            } else {
                Model::kqueue_stamp(e.incarnation)
            }
        });
        let old: Vec<u32> = self.slot_stamps[slot]
            .iter()
            .copied()
            .filter(|&s| Some(s) != current)
            .collect();
        if old.is_empty() {
            return earlier;
        }
        let stamp = old[old.len() - 1 - back as usize % old.len()];
        let o = &self.owners[owner];
        let ev = ModelEvent {
            raw: RawEvent {
                slot: o.slot,
                stamp,
                readiness: Readiness::READABLE,
            },
            origin: Origin {
                owner: u64::MAX,
                arming: 0,
            },
            filter: None,
        };
        self.threads[thread].push(Flight {
            ev,
            synthetic: false,
            fabricated: true,
        });
        earlier
    }

    /// `deliver` by `thread` whose first kernel wait fetched only a stale event for
    /// `owner`'s slot (see [`Sim::inject_stale`]): that wait delivers nothing, and
    /// the call waits again (a whole [`Sim::deliver`], with its no-lost-readiness
    /// check). Where the slot has no stale stamp yet (kqueue's stamp is the
    /// incarnation), the first wait fetched nothing.
    pub fn stale_only_wait(&mut self, owner: usize, back: u8, thread: usize) -> Vec<Delivery> {
        let mut out = self.accept(thread);
        let stale = self.stale;
        self.inject_stale(owner, back, thread);
        if !self.threads[thread].is_empty() {
            let got = self.accept(thread);
            assert!(
                got.is_empty(),
                "a wait that fetched only stale events delivered {got:?}"
            );
            assert_eq!(self.stale, stale + 1, "the stale event was not dropped");
        }
        out.extend(self.deliver(thread));
        out
    }

    /// `fork`, then `Poller::reinit_after_fork` in the child (which the
    /// simulation becomes): a new kernel instance ([`Model::fork_child`]); every
    /// registration forgets the kernel, the armed ones are added to the new
    /// instance armed (a new generation, the same arming), always-ready ones queue
    /// a synthetic event again, a closed number (EBADF) is left unarmed. Checks
    /// that only adds were issued, one per armed registration the kernel can
    /// poll: a delete, modify or quiet would be a command for the parent's
    /// registrations (on epoll the child inherits the parent's instance).
    pub fn fork(&mut self) {
        self.begin();
        // Only the forking thread exists in the child, and it is not inside
        // `deliver`: what the threads held belongs to the parent.
        for t in &mut self.threads {
            t.clear();
        }
        // A re-add the kernel refused fails the re-initialisation, and the
        // caller makes it again: another new kernel instance (a refusal is
        // made once).
        while !self.reinit_after_fork() {}
    }

    /// One `reinit_after_fork` in the child: a new kernel instance, every
    /// registration re-added as [`Sim::fork`] says. `false` when a re-add was
    /// refused ([`Op::Refuse`]): the registration is as it was (armed), and
    /// the re-initialisation stopped there, as the poller's does.
    fn reinit_after_fork(&mut self) -> bool {
        self.model.fork_child();
        self.synthetic.clear();
        for slot in 0..self.slots.len() {
            let Some(entry) = self.slots[slot].as_mut() else {
                continue;
            };
            let owner = entry.owner;
            let spec = self.owners[owner].spec;
            let before = entry.state;
            entry.state.forget_kernel();
            let origin = Origin {
                owner: owner as u64,
                arming: spec.map_or(0, |(_, n)| n),
            };
            let mut fb = Fallbacks::default();
            let r = entry.state.rearm_fresh(
                &mut self
                    .model
                    .kernel(entry.fd, slot as u32, entry.incarnation, origin),
                &mut fb,
            );
            let (fd, after) = (entry.fd, entry.state);
            let cmds = self.model.take_commands();
            assert!(
                cmds.iter().all(|c| matches!(c.command, Command::Add(..))),
                "fork: re-initialisation issued {cmds:?}, not only adds"
            );
            // Nothing is in the new kernel: what a refused deregister left in
            // the parent's is no concern of the child's.
            self.owners[owner].owes_delete = false;
            if self.note_refusal(owner, &cmds) {
                assert!(r.is_err(), "fork: a refused re-add answered {r:?}");
                assert_eq!(after, before, "fork: a refused re-add changed the state");
                self.commands.extend(cmds);
                return false;
            }
            match r {
                Ok(Armed::Unchanged) => {
                    assert!(spec.is_none(), "fork: armed {spec:?}, not re-added");
                    assert!(cmds.is_empty(), "fork: idle, but issued {cmds:?}");
                }
                Ok(Armed::Kernel) => {
                    assert!(spec.is_some(), "fork: idle, but re-added");
                    assert_eq!(cmds.last().and_then(|c| c.error), None);
                    if self.model.is_open(fd) {
                        self.owners[owner].tainted = false;
                    }
                }
                Ok(Armed::Synthetic) => {
                    let (interest, _) = spec.expect("fork: idle, but a synthetic event");
                    let flight = Flight::synthetic(slot, after.generation(), interest, origin);
                    self.synthetic.push(flight);
                    if self.model.tag_is_generation() {
                        self.note_stamp(slot, after.generation());
                    }
                }
                // Closed in the child: left unarmed, reported at its next arm.
                Err(KernelError::BadFd) => {
                    assert!(!self.model.is_open(fd));
                    self.set_spec(owner, None);
                }
                // AFD: the number names a handle that is not a socket now (a
                // refusal of the descriptor, not transient: the state machine
                // leaves it unarmed, `RegState::rearm_fresh`). (Windows has no
                // fork: the AFD run follows the state machine.)
                Err(ref e) if self.arm_may_fail(fd) && self.model.is_open(fd) => {
                    assert!(!e.is_transient(), "fork: {e:?} is transient");
                    assert_eq!(after.phase(), Phase::Fresh, "fork: refused, still armed");
                    self.set_spec(owner, None);
                }
                Err(e) => panic!("fork: re-adding registration {owner} failed: {e:?}"),
            }
            self.note_commands(slot, &cmds);
            self.commands.extend(cmds);
        }
        true
    }
    /// A thread checks the events it holds against the table (the second half of
    /// `deliver`, as `Poller::accept` and `Poller::take_synthetic` do).
    pub fn accept(&mut self, thread: usize) -> Vec<Delivery> {
        let flights = std::mem::take(&mut self.threads[thread]);
        let mut out: Vec<Delivery> = Vec::new();
        for f in flights {
            let slot = f.ev.raw.slot as usize;
            let generation_tags = self.model.tag_is_generation();
            let Some(entry) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
                self.stale += 1;
                continue;
            };
            let (tag, current) = if f.synthetic || generation_tags {
                (Some(f.ev.raw.stamp), true)
            } else {
                (
                    None,
                    f.ev.raw.stamp == Model::kqueue_stamp(entry.incarnation),
                )
            };
            if !current {
                self.stale += 1;
                continue;
            }
            let owner = entry.owner;
            match entry.state.on_event(tag) {
                Some(interest) => {
                    if !f.synthetic {
                        let (fd, inc) = (entry.fd, entry.incarnation);
                        self.model.delivered(fd, slot as u32, inc);
                    }
                    let arming = self.check_delivery(owner, &f, interest);
                    let op = self.op;
                    self.owners[owner].log.push(Logged::Delivered(op, arming));
                    out.push(Delivery {
                        owner,
                        arming,
                        readiness: f.ev.raw.readiness.for_interest(interest),
                    });
                }
                None => match out.iter_mut().find(|d| d.owner == owner) {
                    Some(d) if self.model.semantics().split_filters() && !f.synthetic => {
                        d.readiness.insert(f.ev.raw.readiness)
                    }
                    _ => self.stale += 1,
                },
            }
        }
        out
    }

    /// Checks (b) and (c) for a delivery to `owner` completing an arming for
    /// `interest`; returns the arming.
    fn check_delivery(&mut self, owner: usize, f: &Flight, interest: Interest) -> u64 {
        let fixed_udata = !self.model.tag_is_generation();
        let o = &mut self.owners[owner];
        let Some((armed_for, arming)) = o.spec else {
            panic!("(b) delivered {f:?} to registration {owner}, which is not armed");
        };
        assert_eq!(
            armed_for, interest,
            "(b) delivered for {interest:?}, armed for {armed_for:?}"
        );
        assert!(
            !f.fabricated,
            "(b) delivered a stale event {f:?} to registration {owner}"
        );
        assert_eq!(
            f.ev.origin.owner, owner as u64,
            "(b) delivered registration {}'s event to registration {owner}",
            f.ev.origin.owner
        );
        if f.ev.origin.arming != arming {
            // A kqueue whose udata is fixed at EV_ADD keeps no generation in it:
            // an event of an earlier arming of the same registration, in a
            // thread's hands across a disarm and a re-arm, completes the new
            // arming. Anything else is a bug (on every other semantics the
            // generation in the tag drops such an event).
            assert!(
                fixed_udata && f.ev.origin.arming != 0 && f.ev.origin.arming < arming,
                "(b) delivered an event of arming {} for arming {arming} of registration {owner}",
                f.ev.origin.arming
            );
            o.raced = true;
        }
        assert!(
            !o.delivered.contains(&arming),
            "(c) arming {arming} of registration {owner} delivered twice"
        );
        o.delivered.push(arming);
        o.spec = None;
        arming
    }

    /// Whether `owner` is armed and its description ready for the interest.
    fn ready(&self, owner: usize) -> Option<bool> {
        let o = &self.owners[owner];
        let (interest, _) = o.spec?;
        let st = self.state(owner)?;
        if st.is_always_ready() {
            return Some(true);
        }
        let desc = self.model.description(o.fd)?;
        Some(!self.model.is_pollable(desc) || self.model.levels(desc).ready_for(interest))
    }

    /// A whole `deliver` by `thread`: wait, then accept; (d) every armed, untainted
    /// registration whose description is ready and for which no event is in
    /// another thread's hands is delivered.
    pub fn deliver(&mut self, thread: usize) -> Vec<Delivery> {
        let mut out = self.accept(thread);
        let due: Vec<usize> = (0..self.owners.len())
            .filter(|&o| {
                let ow = &self.owners[o];
                ow.alive
                    && !ow.tainted
                    && self.ready(o) == Some(true)
                    && !self
                        .threads
                        .iter()
                        .flatten()
                        .any(|f| f.ev.raw.slot == ow.slot)
            })
            .collect();
        self.wait(thread);
        let now = self.accept(thread);
        for o in due {
            assert!(
                now.iter().any(|d| d.owner == o),
                "(d) registration {o} ({:?}) is armed and ready but was not delivered: {now:?}",
                self.owners[o]
            );
        }
        out.extend(now);
        out
    }

    /// (a): the kernel's state equals the table's, and the table's the ledger's;
    /// and (f).
    pub fn check(&self) {
        let sem = self.sem();
        if let Some(p) = self.model.afd_unowned_pending() {
            panic!("(f) a poll is pending that no registration's record names: {p:?}");
        }
        // kqueue with the generation in udata (each knote's own state), or with
        // the incarnation (fixed at EV_ADD).
        let kq_generation = sem.is_kqueue() && self.model.tag_is_generation();
        let kq_fixed = sem.is_kqueue() && !self.model.tag_is_generation();
        for (slot, entry) in self.slots.iter().enumerate() {
            let Some(entry) = entry else { continue };
            let o = &self.owners[entry.owner];
            let phase = entry.state.phase();
            match (phase, o.spec) {
                (Phase::Armed(i), Some((j, _))) if i == j => {}
                (Phase::Fresh | Phase::Idle, None) => {}
                _ => panic!(
                    "table {phase:?} but the arming in force is {:?} ({o:?})",
                    o.spec
                ),
            }
            if o.tainted || entry.state.is_always_ready() {
                continue;
            }
            let g = entry.state.generation();
            let tag = self.model.tag_for(slot as u32, entry.incarnation, g);
            let current = |f: &&Flight| {
                !f.fabricated
                    && !f.synthetic
                    && f.ev.raw.slot == slot as u32
                    && f.ev.raw.stamp
                        == if self.model.tag_is_generation() {
                            g
                        } else {
                            Model::kqueue_stamp(entry.incarnation)
                        }
            };
            let flying: Vec<&Flight> = self.in_flight().filter(current).collect();
            let view = self.model.view(entry.fd, slot as u32);
            let flying_bits = flying.iter().fold(0u8, |b, f| {
                b | match f.ev.filter {
                    Some(pollshot::model::Filter::Read) => 1,
                    Some(pollshot::model::Filter::Write) => 2,
                    None => 0,
                }
            });
            // kqueue with the generation in udata: each knote's own state.
            let knote = |f: pollshot::model::Filter| self.model.knotes().get(&(entry.fd, f));
            let ok = match phase {
                Phase::Fresh if kq_generation => pollshot::model::Filter::BOTH
                    .iter()
                    .all(|&f| !knote(f).is_some_and(|k| k.enabled && k.udata == tag)),
                Phase::Fresh => !(view.armed.is_some() && view.tag == Some(tag)),
                // kqueue (`backends/kqueue/backend.rs`, `delivered`): when a disarm and
                // re-arm came between the read of an event and its acceptance, the
                // accepted event completes the new arming (udata cannot tell armings
                // apart), and the backend leaves the re-armed knotes enabled ("that
                // command decided"): the table says idle, the kernel armed, until
                // the next report (dropped as stale) or arm. Tolerated for such a
                // raced registration only; see the fuzz notes.
                Phase::Idle if kq_fixed && o.raced => view.present,
                // A refused deregister left the kernel as it was: present, and
                // armed for the arming then in force (stale: the table moved
                // to a new generation, which a kqueue whose udata is fixed at
                // `EV_ADD` cannot tell) until a command replaces it. poll(2)'s
                // backend takes the delete back disarmed; an event port's
                // association may be gone already (a retrieved event).
                Phase::Idle if o.owes_delete => {
                    sem == Semantics::Ports
                        || (view.present
                            && (kq_fixed || view.armed.is_none() || view.tag != Some(tag)))
                }
                // Event ports: a quiet (`port_dissociate`) removes the association,
                // a retrieved event leaves it inactive: either way nothing armed.
                Phase::Idle if sem == Semantics::Ports => view.armed.is_none(),
                Phase::Idle => view.present && view.armed.is_none(),
                // Every filter of the interest carries this arming's udata and
                // is enabled, or fired (an event of it in a thread's hands); no
                // other filter is enabled.
                Phase::Armed(i) if kq_generation => {
                    let enabled = view.armed.map_or(0, Interest::bits);
                    let each = pollshot::model::Filter::BOTH.iter().all(|&f| {
                        let bit = match f {
                            pollshot::model::Filter::Read => 1,
                            pollshot::model::Filter::Write => 2,
                        };
                        !f.in_interest(i)
                            || knote(f).is_some_and(|k| {
                                k.udata == tag && (k.enabled || flying_bits & bit != 0)
                            })
                    });
                    each && enabled & !i.bits() == 0
                }
                Phase::Armed(i) if kq_fixed => {
                    let enabled = view.armed.map_or(0, Interest::bits);
                    view.present
                        && view.tag == Some(tag)
                        && enabled & !i.bits() == 0
                        && (enabled | flying_bits) & i.bits() == i.bits()
                }
                Phase::Armed(i) => {
                    view.tag == Some(tag)
                        && (view.armed == Some(i)
                            || (view.present && view.armed.is_none() && !flying.is_empty()))
                }
            };
            assert!(
                ok,
                "(a) registration {} in slot {slot}: table {phase:?} generation {g}, kernel {view:?}, in flight {flying:?}",
                entry.owner
            );
        }
    }

    /// Applies one operation of the alphabet, then checks (a).
    pub fn apply(&mut self, op: &Op) {
        self.op += 1;
        // A refusal is for the first command of the operation right after it.
        let refuse = std::mem::take(&mut self.refuse_next);
        self.model.refuse_next(refuse);
        let fds = self.model.open_fds();
        let pick_fd = |i: u8| (!fds.is_empty()).then(|| fds[i as usize % fds.len()]);
        let n = self.owners.len();
        let pick = |i: u8| (n > 0).then(|| i as usize % n);
        let thread = |t: u8| t as usize % THREADS;
        match *op {
            Op::Open { pollable } => {
                if fds.len() < 12 {
                    self.open(pollable);
                }
            }
            Op::Dup { fd } => {
                if let (Some(fd), true) = (pick_fd(fd), fds.len() < 12) {
                    let _ = self.model.dup(fd);
                }
            }
            Op::Close { fd } => {
                if let Some(fd) = pick_fd(fd) {
                    self.close(fd);
                }
            }
            Op::Levels { fd, bits } => {
                if let Some(fd) = pick_fd(fd) {
                    let mut l = Levels::from_bits(bits);
                    // A socket whose peer shut down reads EOF: readable too.
                    l.readable |= l.read_closed;
                    self.set_levels(fd, l);
                }
            }
            Op::Register { fd } => {
                if let (Some(fd), true) = (pick_fd(fd), n < 32) {
                    self.register(fd);
                }
            }
            Op::Arm { reg, interest } => {
                if let Some(o) = pick(reg) {
                    let _ = self.arm(o, interest);
                }
            }
            Op::Disarm { reg } => {
                if let Some(o) = pick(reg) {
                    let _ = self.disarm(o);
                }
            }
            Op::Deregister { reg } => {
                if let Some(o) = pick(reg) {
                    let _ = self.deregister(o);
                }
            }
            Op::Wait { thread: t } => {
                self.wait(thread(t));
            }
            Op::Accept { thread: t } => {
                self.accept(thread(t));
            }
            Op::Deliver { thread: t } => {
                self.deliver(thread(t));
            }
            Op::Fire { reg, thread: t } => {
                if let Some(o) = pick(reg) {
                    self.fire(o, thread(t));
                }
            }
            Op::Stale {
                reg,
                back,
                thread: t,
            }
            | Op::StaleWait {
                reg,
                back,
                thread: t,
            } => {
                if let Some(o) = pick(reg) {
                    if matches!(op, Op::Stale { .. }) {
                        self.inject_stale(o, back, thread(t));
                    } else {
                        self.stale_only_wait(o, back, thread(t));
                    }
                }
            }
            Op::Notify => {
                self.notify();
            }
            Op::Fork => self.fork(),
            Op::Refuse => self.refuse_next = true,
        }
        self.model.refuse_next(false);
        self.check();
    }

    /// Ends a run: every thread checks what it holds, then one more `deliver`
    /// (with the no-lost-readiness check) and a last (a).
    pub fn finish(&mut self) {
        self.op += 1;
        for t in 0..THREADS {
            self.accept(t);
        }
        self.check();
        self.op += 1;
        self.deliver(0);
        self.check();
    }
}

/// Whether [`run_parity`] runs `semantics` on this target: every one on 64-bit
/// targets. On 32-bit targets no kqueue whose `udata` carries the generation: a
/// 32-bit `udata` has 12 bits left after the slot, too few for it, so no 32-bit
/// kqueue backend carries it there (`UDATA_IS_GENERATION` in
/// `backends/kqueue/sys.rs`), and the model's `pack_usize` would cut it to 12
/// bits. (The event ports model keeps a 64-bit user word on every target.)
pub fn runs_here(semantics: Semantics) -> bool {
    cfg!(target_pointer_width = "64") || !(semantics.is_kqueue() && semantics.tag_is_generation())
}

/// Runs `ops` on every semantics that [`runs_here`] (`Semantics::ALL`: epoll,
/// each kqueue kernel family, poll, event ports, AFD), each registration starting at
/// generation `start`, checking every invariant, then parity: each registration
/// neither tainted nor raced in any run has the same history in all of them.
pub fn run_parity(ops: &[Op], start: u32, policy: EpochPolicy) -> Vec<Sim> {
    let mut sims: Vec<Sim> = Semantics::ALL
        .into_iter()
        .filter(|&s| runs_here(s))
        .map(|s| Sim::new(s, start, policy))
        .collect();
    for op in ops {
        for s in sims.iter_mut() {
            s.apply(op);
        }
    }
    for s in sims.iter_mut() {
        s.finish();
    }
    let n = sims[0].owners.len();
    for o in 0..n {
        if sims.iter().any(|s| {
            let ow = &s.owners[o];
            ow.ever_tainted
                || ow.raced
                || ow.refused
                || ow.gone
                || ow.refusals != sims[0].owners[o].refusals
        }) {
            continue;
        }
        let first = &sims[0].owners[o].log;
        for s in &sims[1..] {
            assert_eq!(
                first,
                &s.owners[o].log,
                "parity: registration {o} on epoll vs {:?}",
                s.sem()
            );
        }
    }
    sims
}

/// Runs `ops` on AFD semantics with the Windows backend broken by `fault`,
/// checking every invariant (no parity).
pub fn run_afd_fault(
    fault: pollshot::model::AfdFault,
    ops: &[Op],
    start: u32,
    policy: EpochPolicy,
) -> Sim {
    let mut sim = Sim::new(Semantics::Afd, start, policy);
    sim.model.set_afd_fault(fault);
    for op in ops {
        sim.apply(op);
    }
    sim.finish();
    sim
}

/// Runs `ops` on one semantics with the kqueue backend re-arming with `record`,
/// checking every invariant (no parity). [`RearmRecord::Enable`] on
/// `Semantics::KqueueNetBsd8` is the backend before its re-arm record: (d) finds
/// the readiness it loses.
pub fn run_one(
    semantics: Semantics,
    record: RearmRecord,
    ops: &[Op],
    start: u32,
    policy: EpochPolicy,
) -> Sim {
    let mut sim = Sim::with_rearm(semantics, record, start, policy);
    for op in ops {
        sim.apply(op);
    }
    sim.finish();
    sim
}
