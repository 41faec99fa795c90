//! quickcheck properties of the state machine (`src/state.rs`) against the kernel
//! model (`src/model/`), through the simulated poller the `state_machine` fuzz
//! target uses (`fuzz/src/sim.rs`).
//!
//! Each generated case is a random sequence of operations (register, arm with each
//! interest, disarm, deregister, kernel waits and acceptances by three simulated
//! threads, kernel events with a current or a stale tag, waits that fetch only
//! stale events, readiness changes, close, number reuse, dup, notify, fork, a
//! command the kernel refuses), run
//! on epoll, every kqueue kernel family, poll, event ports and AFD semantics.
//! After every operation the simulator asserts (its panics name the property):
//! (a) the kernel's state equals the table's; (b) a delivered event belongs to the
//! registration's current arming; (c) at most one delivery per arming; (d)
//! readiness that holds while a registration is armed is never lost; (e) no kernel
//! command where none is needed; (f) AFD: no poll pending that no record names;
//! (g) a delete the kernel accepted left nothing of the registration there.
//! At the end all the semantics must have delivered the same armings at the same
//! operations (parity).

#[path = "../fuzz/src/sim.rs"]
#[allow(dead_code)]
mod sim;

use pollshot::model::AfdFault;
use pollshot::Interest;
use quickcheck::{Arbitrary, Gen, QuickCheck};
use sim::{run_parity, EpochPolicy, Op};

#[derive(Clone, Debug)]
struct QOp(Op);

impl Arbitrary for QOp {
    fn arbitrary(g: &mut Gen) -> QOp {
        let b = |g: &mut Gen| u8::arbitrary(g);
        // Readable, writable, both: the parity runs compare kqueue with epoll and
        // poll, and kqueue refuses `PRIORITY` (the state machine's tests in
        // `src/state.rs` take all seven interests).
        let interest = |g: &mut Gen| *g.choose(&Interest::ALL[..3]).unwrap();
        // Weighted towards the operations that move registrations.
        let op = match u8::arbitrary(g) % 22 {
            0 => Op::Open {
                pollable: u8::arbitrary(g) % 6 != 0,
            },
            1 => Op::Dup { fd: b(g) },
            2 => Op::Close { fd: b(g) },
            3 | 4 => Op::Levels {
                fd: b(g),
                bits: b(g),
            },
            5 | 6 => Op::Register { fd: b(g) },
            7..=9 => Op::Arm {
                reg: b(g),
                interest: interest(g),
            },
            10 => Op::Disarm { reg: b(g) },
            11 => Op::Deregister { reg: b(g) },
            12 => Op::Wait { thread: b(g) },
            13 => Op::Accept { thread: b(g) },
            14 | 15 => Op::Deliver { thread: b(g) },
            16 => Op::Fire {
                reg: b(g),
                thread: b(g),
            },
            17 => Op::Stale {
                reg: b(g),
                back: b(g),
                thread: b(g),
            },
            18 => Op::Notify,
            19 => Op::StaleWait {
                reg: b(g),
                back: b(g),
                thread: b(g),
            },
            20 if u8::arbitrary(g) % 4 == 0 => Op::Fork,
            21 if u8::arbitrary(g) % 2 == 0 => Op::Refuse,
            _ => Op::Levels { fd: b(g), bits: 0 },
        };
        QOp(op)
    }
}

fn ops(v: &[QOp]) -> Vec<Op> {
    v.iter().map(|q| q.0).collect()
}

fn qc() -> QuickCheck {
    QuickCheck::new().tests(1000).rng(Gen::new(150))
}

/// Properties (a) to (e) and parity, generations starting at 0.
#[test]
fn prop_state_machine_against_kernel_model() {
    fn prop(v: Vec<QOp>) -> bool {
        run_parity(&ops(&v), 0, EpochPolicy::PerSlot);
        true
    }
    qc().quickcheck(prop as fn(Vec<QOp>) -> bool);
}

/// The same with every registration starting a few armings below `u32::MAX`, so
/// generations wrap around during the run.
#[test]
fn prop_state_machine_across_generation_wraparound() {
    fn prop(v: Vec<QOp>, below: u8) -> bool {
        run_parity(
            &ops(&v),
            u32::MAX - u32::from(below % 8),
            EpochPolicy::PerSlot,
        );
        true
    }
    qc().quickcheck(prop as fn(Vec<QOp>, u8) -> bool);
}

/// Each property checked here fails on a sequence that breaks it: the checks are
/// not vacuous. A registration armed and made ready, then delivered, then armed
/// again: both armings are delivered once each.
#[test]
fn two_armings_two_deliveries_on_every_semantics() {
    let seq = [
        Op::Open { pollable: true },
        Op::Register { fd: 0 },
        Op::Arm {
            reg: 0,
            interest: Interest::READABLE,
        },
        Op::Levels { fd: 0, bits: 1 },
        Op::Deliver { thread: 0 },
        Op::Arm {
            reg: 0,
            interest: Interest::READABLE,
        },
        Op::Deliver { thread: 1 },
    ];
    for s in run_parity(&seq, 0, EpochPolicy::PerSlot) {
        assert_eq!(s.owners()[0].delivered, vec![1, 2]);
    }
}

/// A fork: in the child, the armed socket is re-added armed (one add), the idle
/// one is fresh (nothing until its next arm, which is an add, not a modify), the
/// armed regular file queues its synthetic event again (poll(2) polls it: an add
/// there); the child's deliver gets
/// both armed ones, each arming once, on every semantics.
#[test]
fn fork_child_readds_armed_leaves_idle_fresh() {
    use pollshot::model::{Command, Semantics};
    let r = Interest::READABLE;
    let before_fork = [
        Op::Open { pollable: true },
        Op::Open { pollable: true },
        Op::Open { pollable: false },
        Op::Register { fd: 0 },
        Op::Register { fd: 1 },
        Op::Register { fd: 2 },
        Op::Arm {
            reg: 0,
            interest: r,
        },
        Op::Arm {
            reg: 1,
            interest: r,
        },
        Op::Disarm { reg: 1 },
        Op::Arm {
            reg: 2,
            interest: r,
        },
        Op::Levels { fd: 0, bits: 1 },
        Op::Wait { thread: 1 }, // another thread holds events: gone in the child
    ];
    let after_fork = [
        Op::Deliver { thread: 0 },
        Op::Arm {
            reg: 1,
            interest: r,
        },
    ];
    let adds = |cmds: &[pollshot::model::CommandRecord]| {
        cmds.iter()
            .filter(|c| matches!(c.command, Command::Add(..)))
            .count()
    };
    for sem in [Semantics::Epoll, Semantics::Kqueue, Semantics::Poll] {
        let mut s = sim::Sim::new(sem, 0, EpochPolicy::PerSlot);
        for op in &before_fork {
            s.apply(op);
        }
        s.apply(&Op::Fork);
        // poll(2) polls a regular file (always readable): an add for it too.
        let want = if sem == Semantics::Poll { 2 } else { 1 };
        assert_eq!(
            (s.commands.len(), adds(&s.commands)),
            (want, want),
            "{sem:?}: {:?}",
            s.commands
        );
        s.apply(&after_fork[0]);
        s.apply(&after_fork[1]);
        assert_eq!(
            (s.commands.len(), adds(&s.commands)),
            (1, 1),
            "{sem:?}: {:?}",
            s.commands
        );
        let delivered: Vec<_> = s.owners().iter().map(|o| o.delivered.clone()).collect();
        assert_eq!(delivered, [vec![1], vec![], vec![1]], "{sem:?}");
    }
    let all: Vec<Op> = before_fork
        .iter()
        .chain(&[Op::Fork])
        .chain(&after_fork)
        .copied()
        .collect();
    run_parity(&all, 0, EpochPolicy::PerSlot);
}

/// A fork after an armed socket was closed and its number reused by a handle AFD
/// cannot poll: the child's re-add is refused for the descriptor itself (EINVAL,
/// not for want of a resource), so the registration is left unarmed, as for
/// EBADF, where a retried re-initialisation would meet the same refusal for ever;
/// its next arm and deregister then work. (Kept armed, the table disagreed with
/// the kernel: found by the properties above.) Epoll and kqueue report such a
/// number always ready, poll(2) polls it: no refusal there.
#[test]
fn fork_child_leaves_unarmed_a_registration_whose_number_cannot_be_watched() {
    let ops = [
        Op::Open { pollable: true },
        Op::Register { fd: 0 },
        Op::Arm {
            reg: 0,
            interest: Interest::BOTH,
        },
        Op::Close { fd: 0 },
        Op::Open { pollable: false },
        Op::Fork,
        Op::Arm {
            reg: 0,
            interest: Interest::WRITABLE,
        },
        Op::Deregister { reg: 0 },
    ];
    for start in [0, u32::MAX] {
        run_parity(&ops, start, EpochPolicy::PerSlot);
    }
}

/// The kernel refuses a command ([`Op::Refuse`]) of each kind in turn, on every
/// semantics: an arm, a disarm, a deregister (armed, then idle), a superseded
/// registration's delete and a fork's re-add. Each refused call fails and
/// changes nothing in the table, but the deregister, which keeps the
/// registration disarmed: nothing is delivered for it (the kernel's arming
/// is stale), it can be armed again, and its retry deletes it (invariant (g):
/// nothing of it is left in the kernel). Parity holds throughout.
#[test]
fn refused_commands_change_nothing_and_a_refused_deregister_is_retried() {
    let (r, w) = (Interest::READABLE, Interest::WRITABLE);
    let arm = |reg, interest| Op::Arm { reg, interest };
    let ops = [
        Op::Open { pollable: true },
        Op::Open { pollable: true },
        Op::Register { fd: 0 },
        Op::Register { fd: 1 },
        // A refused first arm: still fresh; the retry adds.
        Op::Refuse,
        arm(0, r),
        arm(0, r),
        // A refused disarm: still armed; readiness is delivered.
        Op::Refuse,
        Op::Disarm { reg: 0 },
        Op::Levels { fd: 0, bits: 1 },
        Op::Deliver { thread: 0 },
        // A refused re-arm for another interest, then a refused deregister of
        // an armed registration: kept, disarmed; its event (fetched before, or
        // reported after) is stale.
        arm(1, w),
        Op::Wait { thread: 1 },
        Op::Refuse,
        arm(0, w),
        arm(0, r),
        Op::Refuse,
        Op::Deregister { reg: 0 },
        Op::Accept { thread: 1 },
        Op::Deliver { thread: 2 },
        // Armed again, delivered, then deregistered for good by the retry.
        arm(0, r),
        Op::Deliver { thread: 0 },
        Op::Refuse,
        Op::Deregister { reg: 0 },
        Op::Deregister { reg: 0 },
        Op::Deregister { reg: 0 },
        // A superseded registration's refused delete: the new one works.
        arm(1, w),
        Op::Refuse,
        Op::Register { fd: 1 },
        arm(2, r),
        Op::Levels { fd: 1, bits: 3 },
        Op::Deliver { thread: 1 },
        // A fork whose first re-add is refused: made again, both re-added.
        Op::Register { fd: 0 },
        arm(3, w),
        arm(2, w),
        Op::Refuse,
        Op::Fork,
        Op::Levels { fd: 0, bits: 3 },
        Op::Deliver { thread: 0 },
    ];
    for start in [0, u32::MAX - 2] {
        let sims = run_parity(&ops, start, EpochPolicy::PerSlot);
        for s in &sims {
            let sem = s.model().semantics();
            let o = &s.owners()[0];
            assert!(!o.alive, "{sem:?}: deregistered by the retry");
            assert_eq!(o.refusals.len(), 5, "{sem:?}: {o:?}");
            assert_eq!(o.delivered, [1, 3], "{sem:?}: {o:?}");
            let newer = &s.owners()[2];
            assert_eq!(newer.delivered, [1, 2], "{sem:?}: {newer:?}");
            assert_eq!(s.owners()[3].delivered, [1], "{sem:?}");
        }
    }
}

/// Runs `run`: the message it panicked with, if it did.
fn panic_message<T>(run: impl FnOnce() -> T) -> Option<String> {
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).err()?;
    let msg = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()));
    Some(msg.unwrap_or_default())
}

/// Runs `ops` on NetBSD 8/9's kqueue with the re-arm record before `EV_ADD |
/// EV_ENABLE | EV_DISPATCH` (a bare `EV_ENABLE`): the panic message of the
/// invariant it breaks, if any.
fn old_rearm_on_netbsd8(ops: &[Op]) -> Option<String> {
    use pollshot::model::{RearmRecord, Semantics};
    panic_message(|| {
        sim::run_one(
            Semantics::KqueueNetBsd8,
            RearmRecord::Enable,
            ops,
            0,
            EpochPolicy::PerSlot,
        )
    })
}

/// Runs `ops` on AFD semantics with the Windows backend broken by `fault`: the
/// panic message of the invariant it breaks, if any.
fn afd_fault(fault: AfdFault, ops: &[Op]) -> Option<String> {
    panic_message(|| sim::run_afd_fault(fault, ops, 0, EpochPolicy::PerSlot))
}

/// The model sees the lost re-report: a registration re-armed with its data
/// unread is delivered again on NetBSD 8/9 with the backend's re-arm record
/// (`run_parity` above runs it on every semantics) and never with a bare
/// `EV_ENABLE`, which (d) reports.
#[test]
fn old_rearm_record_loses_the_rereport_on_netbsd8() {
    let seq = [
        Op::Open { pollable: true },
        Op::Register { fd: 0 },
        Op::Arm {
            reg: 0,
            interest: Interest::READABLE,
        },
        Op::Levels { fd: 0, bits: 1 },
        Op::Deliver { thread: 0 },
        Op::Arm {
            reg: 0,
            interest: Interest::READABLE,
        },
        Op::Deliver { thread: 1 },
    ];
    let msg = old_rearm_on_netbsd8(&seq).expect("the old record passed on NetBSD 8/9");
    assert!(msg.starts_with("(d)"), "{msg}");
    for s in run_parity(&seq, 0, EpochPolicy::PerSlot) {
        assert_eq!(s.owners()[0].delivered, vec![1, 2]);
    }
}

/// Random sequences (the generator above) find the old record's lost re-report
/// on NetBSD 8/9: the first failing case breaks (d). How many cases and how
/// long it took is printed (`--nocapture`); only the finding decides.
#[test]
fn random_sequences_find_the_old_records_lost_rereport_on_netbsd8() {
    let started = std::time::Instant::now();
    let mut g = Gen::new(150);
    for case in 1..=100_000u32 {
        let v: Vec<QOp> = Arbitrary::arbitrary(&mut g);
        if let Some(msg) = old_rearm_on_netbsd8(&ops(&v)) {
            eprintln!(
                "old re-arm record on NetBSD 8/9: lost re-report found after {case} cases, {:?}",
                started.elapsed()
            );
            assert!(msg.starts_with("(d)"), "case {case}: {msg}");
            return;
        }
    }
    panic!("100000 random sequences never found the old record's lost re-report");
}

/// The modelled Windows backend broken on purpose, on the shortest sequences
/// that show it: a disarm that cancels nothing leaves the poll armed in the
/// kernel (a); a cancelled poll's completion that is neither marked nor carries
/// its own generation completes the re-arm with the disarmed arming's event (b).
/// The backend as it is passes both (and `run_parity` runs them on every
/// semantics).
#[test]
fn afd_faults_are_found_on_short_sequences() {
    let r = Interest::READABLE;
    let disarm = [
        Op::Open { pollable: true },
        Op::Register { fd: 0 },
        Op::Arm {
            reg: 0,
            interest: r,
        },
        Op::Disarm { reg: 0 },
    ];
    let msg = afd_fault(AfdFault::NoCancel, &disarm).expect("no-cancel passed");
    assert!(msg.starts_with("(a)"), "{msg}");
    let rearm: Vec<Op> = disarm
        .iter()
        .copied()
        .chain([
            Op::Arm {
                reg: 0,
                interest: r,
            },
            Op::Deliver { thread: 0 },
        ])
        .collect();
    let msg = afd_fault(AfdFault::StaleThrough, &rearm).expect("stale-through passed");
    assert!(msg.starts_with("(b)"), "{msg}");
    for seq in [&disarm[..], &rearm[..]] {
        assert_eq!(afd_fault(AfdFault::None, seq), None);
        run_parity(seq, 0, EpochPolicy::PerSlot);
    }
}

/// Random sequences (the generator above) find each AFD fault: the first
/// failing case breaks an invariant. How many cases and how long it took is
/// printed (`--nocapture`); only the finding decides.
#[test]
fn random_sequences_find_each_afd_fault() {
    for fault in [AfdFault::NoCancel, AfdFault::StaleThrough] {
        let started = std::time::Instant::now();
        let mut g = Gen::new(150);
        let found = (1..=100_000u32).find_map(|case| {
            let v: Vec<QOp> = Arbitrary::arbitrary(&mut g);
            afd_fault(fault, &ops(&v)).map(|msg| (case, msg))
        });
        let (case, msg) = found.unwrap_or_else(|| panic!("100000 sequences never found {fault:?}"));
        eprintln!(
            "AFD {fault:?}: found after {case} cases, {:?}: {}",
            started.elapsed(),
            msg.lines().next().unwrap_or_default()
        );
        // An invariant's message starts with its letter, "(b) ...": as a panic
        // message itself, or after assert_eq!'s "assertion `left == right`
        // failed: " (which invariant trips first depends on the random case).
        let tag = msg
            .strip_prefix("assertion `left == right` failed: ")
            .unwrap_or(&msg);
        assert!(tag.starts_with('('), "case {case}: {msg}");
    }
}
