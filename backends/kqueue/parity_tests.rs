//! Parity: random operation sequences on a few registrations, run through the
//! kernel model with epoll semantics (its own translation, as
//! `backends/epoll.rs`) and with each kqueue semantics driven by this translator
//! (`udata` carrying the arming generation where every change stores it, the
//! incarnation where only `EV_ADD` does); after every wait both deliver to the
//! same registrations, and every registration ends in the same phase.

use super::changes::{self, Command, Filters, Knotes, Plan};
use crate::backend::RawEvent;
use crate::interest::Interest;
use crate::model::{self, Levels, Model, Origin, Semantics};
use crate::state::{Fallbacks, Kernel, KernelError, Phase, RegState};
use crate::token::{incarnation_in_usize, pack_usize};

/// The kqueue side of one registration: this translator over the model.
struct Kq<'a> {
    model: &'a mut Model,
    fd: model::Fd,
    slot: u32,
    incarnation: u32,
    knotes: &'a mut Knotes,
    origin: Origin,
}

/// The `udata` the backend sends for an arming of `generation` (as
/// `sys::tag_udata`).
fn udata_for(sem: Semantics, slot: u32, incarnation: u32, generation: u32) -> usize {
    if sem.tag_is_generation() {
        pack_usize(slot, generation)
    } else {
        pack_usize(slot, incarnation)
    }
}

impl Kq<'_> {
    fn submit(&mut self, plan: Plan) -> Vec<(changes::Action, Option<model::Errno>)> {
        let records: Vec<model::Change> = plan
            .changes()
            .map(|c| model::Change {
                ident: c.fd,
                filter: match c.filter {
                    changes::Filter::Read => model::Filter::Read,
                    changes::Filter::Write => model::Filter::Write,
                },
                flags: c.flags() | changes::EV_RECEIPT,
                udata: c.udata as u64,
                origin: self.origin,
            })
            .collect();
        let answers = self.model.kevent(&records);
        let mut after = plan.after;
        let mut out = Vec::new();
        for (c, a) in plan.changes().zip(answers) {
            if a.is_err() && c.action != changes::Action::Delete {
                after.present = after.present.without(c.filter);
                after.enabled = after.enabled.without(c.filter);
            }
            out.push((c.action, a.err()));
        }
        *self.knotes = after;
        out
    }

    fn run(&mut self, command: Command, generation: u32) -> Result<(), KernelError> {
        use changes::Action::*;
        let udata = udata_for(
            self.model.semantics(),
            self.slot,
            self.incarnation,
            generation,
        );
        let plan = changes::translate(command, self.fd, udata, *self.knotes);
        let answers = self.submit(plan);
        let lost = answers
            .iter()
            .any(|(a, e)| matches!(a, Enable | Add) && *e == Some(model::Errno::NoEnt));
        for (a, e) in &answers {
            match (a, e) {
                (_, None) | (Delete, _) | (_, Some(model::Errno::NoEnt)) => {}
                (Add, Some(model::Errno::Inval)) => return Err(KernelError::NotPollable),
                (_, Some(model::Errno::BadF)) => return Err(KernelError::BadFd),
                (_, Some(e)) => {
                    return Err(KernelError::Other(std::io::Error::from_raw_os_error(
                        e.raw(),
                    )))
                }
            }
        }
        match command {
            Command::Add(i) | Command::Modify(i) if lost => {
                let plan = changes::readd(self.fd, udata, i);
                self.submit(plan);
                Ok(())
            }
            Command::Quiet
                if !answers.is_empty()
                    && answers.iter().all(|(_, e)| *e == Some(model::Errno::NoEnt)) =>
            {
                Err(KernelError::NotFound)
            }
            _ => Ok(()),
        }
    }
}

impl Kernel for Kq<'_> {
    fn add(&mut self, i: Interest, g: u32) -> Result<(), KernelError> {
        self.run(Command::Add(i), g)
    }
    fn modify(&mut self, i: Interest, g: u32) -> Result<(), KernelError> {
        self.run(Command::Modify(i), g)
    }
    fn quiet(&mut self, g: u32) -> Result<(), KernelError> {
        self.run(Command::Quiet, g)
    }
    fn delete(&mut self) -> Result<(), KernelError> {
        self.run(Command::Delete, 0)
    }
}

/// One registration on one side.
struct Reg {
    fd: model::Fd,
    slot: u32,
    incarnation: u32,
    state: RegState,
    knotes: Knotes,
    fired: Filters,
}

impl Reg {
    /// The registration's state, and the kqueue backend's view of it on `model`
    /// with its changes counted for `origin`.
    fn kq<'a>(&'a mut self, model: &'a mut Model, origin: Origin) -> (&'a mut RegState, Kq<'a>) {
        let kq = Kq {
            model,
            fd: self.fd,
            slot: self.slot,
            incarnation: self.incarnation,
            knotes: &mut self.knotes,
            origin,
        };
        (&mut self.state, kq)
    }
}

/// One side: a model and its registrations (by index).
struct Side {
    model: Model,
    regs: Vec<Reg>,
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Arm(usize, Interest),
    Disarm(usize),
    Levels(usize, u8),
    Wait,
    /// Close the number without deregistering; open a new description there.
    Reuse(usize),
    /// Deregister and register the same number again (a new incarnation).
    Reregister(usize),
}

const REGS: usize = 3;

impl Side {
    fn new(semantics: Semantics) -> Side {
        let mut model = Model::new(semantics);
        let regs = (0..REGS)
            .map(|i| Reg {
                fd: model.open(true),
                slot: i as u32,
                incarnation: i as u32,
                state: RegState::new(0),
                knotes: Knotes::NONE,
                fired: Filters::NONE,
            })
            .collect();
        Side { model, regs }
    }

    fn kernel_call<T>(
        &mut self,
        r: usize,
        f: impl FnOnce(&mut RegState, &mut dyn Kernel) -> T,
    ) -> T {
        let reg = &mut self.regs[r];
        let origin = Origin {
            owner: r as u64,
            arming: 1,
        };
        if self.model.semantics().is_kqueue() {
            let (state, mut k) = reg.kq(&mut self.model, origin);
            f(state, &mut k)
        } else {
            let mut k = self.model.kernel(reg.fd, reg.slot, reg.incarnation, origin);
            f(&mut reg.state, &mut k)
        }
    }

    /// Applies `op`; for a wait, returns the registrations delivered to.
    fn apply(&mut self, op: Op) -> Option<Vec<usize>> {
        match op {
            Op::Arm(r, i) => {
                self.kernel_call(r, |s, k| s.arm(i, &mut Wrap(k), &mut Fallbacks::default()))
                    .expect("arm");
            }
            Op::Disarm(r) => {
                self.kernel_call(r, |s, k| s.disarm(&mut Wrap(k)))
                    .expect("disarm");
            }
            Op::Levels(r, bits) => {
                let desc = self.model.description(self.regs[r].fd).unwrap();
                self.model.set_levels(desc, Levels::from_bits(bits));
            }
            Op::Reuse(r) => {
                let fd = self.regs[r].fd;
                self.model.close(fd).unwrap();
                self.model.open_at(fd, true).unwrap();
            }
            Op::Reregister(r) => {
                self.kernel_call(r, |s, k| s.deregister(&mut Wrap(k)))
                    .expect("deregister");
                let reg = &mut self.regs[r];
                reg.incarnation += REGS as u32;
                reg.state = RegState::new(reg.state.generation());
                reg.knotes = Knotes::NONE;
            }
            Op::Wait => return Some(self.wait()),
        }
        None
    }

    /// One wait, accepted as the poller does.
    fn wait(&mut self) -> Vec<usize> {
        let events = self.model.wait(64);
        let sem = self.model.semantics();
        let kq = sem.is_kqueue();
        let mut delivered = Vec::new();
        for reg in &mut self.regs {
            reg.fired = Filters::NONE;
        }
        for ev in &events {
            let RawEvent { slot, stamp, .. } = ev.raw;
            let r = slot as usize;
            let reg = &mut self.regs[r];
            let tag = if kq {
                // The stamp of the arming in force (`View::stamp`): the
                // generation, or the incarnation.
                let current = if sem.tag_is_generation() {
                    reg.state.generation()
                } else {
                    incarnation_in_usize(reg.incarnation)
                };
                if stamp != current {
                    continue;
                }
                if let Some(f) = ev.filter {
                    reg.fired = reg.fired.with(match f {
                        model::Filter::Read => changes::Filter::Read,
                        model::Filter::Write => changes::Filter::Write,
                    });
                }
                sem.tag_is_generation().then_some(stamp)
            } else {
                Some(stamp)
            };
            if reg.state.on_event(tag).is_some() {
                delivered.push(r);
            }
        }
        if kq {
            for &r in &delivered {
                let reg = &mut self.regs[r];
                let g = reg.state.generation();
                let udata = udata_for(sem, reg.slot, reg.incarnation, g);
                let plan = changes::after_delivery(reg.fd, udata, reg.knotes, reg.fired);
                let origin = Origin {
                    owner: r as u64,
                    arming: 0,
                };
                reg.kq(&mut self.model, origin).1.submit(plan);
            }
        }
        delivered.sort_unstable();
        delivered
    }

    fn phases(&self) -> Vec<Phase> {
        self.regs.iter().map(|r| r.state.phase()).collect()
    }
}

/// `&mut dyn Kernel` as a `Kernel` (the state machine takes `K: Kernel`).
struct Wrap<'a>(&'a mut dyn Kernel);

impl Kernel for Wrap<'_> {
    fn add(&mut self, i: Interest, g: u32) -> Result<(), KernelError> {
        self.0.add(i, g)
    }
    fn modify(&mut self, i: Interest, g: u32) -> Result<(), KernelError> {
        self.0.modify(i, g)
    }
    fn quiet(&mut self, g: u32) -> Result<(), KernelError> {
        self.0.quiet(g)
    }
    fn delete(&mut self) -> Result<(), KernelError> {
        self.0.delete()
    }
}

/// xorshift64*: reproducible sequences without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> usize {
        (self.next() % n) as usize
    }
}

fn op(rng: &mut Rng) -> Op {
    let r = rng.below(REGS as u64);
    match rng.below(20) {
        0..=6 => Op::Arm(r, Interest::ALL[rng.below(3)]),
        7..=8 => Op::Disarm(r),
        // Readable, writable, read-closed, hang-up, error in any mix; most
        // often one direction or nothing.
        9..=13 => Op::Levels(r, [0, 1, 2, 3, 1, 2, 5, 8, 16, 0][rng.below(10)]),
        14..=17 => Op::Wait,
        18 => Op::Reuse(r),
        _ => Op::Reregister(r),
    }
}

#[test]
fn epoll_and_kqueue_translations_deliver_alike() {
    for kq in [Semantics::Kqueue, Semantics::KqueueFixedUdata] {
        deliver_alike(kq);
    }
}

fn deliver_alike(kq: Semantics) {
    let mut waits = 0;
    let mut deliveries = 0;
    for seed in 1..=400u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut epoll = Side::new(Semantics::Epoll);
        let mut kqueue = Side::new(kq);
        let mut ops = Vec::new();
        for _ in 0..80 {
            let o = op(&mut rng);
            ops.push(o);
            let e = epoll.apply(o);
            let k = kqueue.apply(o);
            assert_eq!(e, k, "seed {seed}: deliveries differ after {ops:?}");
            if let Some(d) = e {
                waits += 1;
                deliveries += d.len();
            }
            assert_eq!(
                epoll.phases(),
                kqueue.phases(),
                "seed {seed}: phases differ after {ops:?}"
            );
        }
    }
    // The sequences exercised something.
    assert!(
        waits > 5_000 && deliveries > 2_000,
        "{waits} waits, {deliveries} deliveries"
    );
}
