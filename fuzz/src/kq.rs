//! The `kqueue_changes` harness: the kqueue backend's pure translator
//! (`changes::translate`, `changes::readd`, `changes::after_delivery` in
//! `backends/kqueue/changes.rs`), as the kernel model drives it, fed arbitrary
//! state-machine commands (add, modify, quiet, delete, in any order, legal or
//! not) for one registration per descriptor number, between descriptor churn
//! (open, dup, close, number reuse), waits and delivery hooks.
//!
//! Checked for every command, on the change records it sent
//! (`Model::take_changes`):
//! - every record names the number and carries the registration's `udata` (slot
//!   and the command's generation, or slot and incarnation where only `EV_ADD`
//!   stores `udata`; a delete's `udata` is not looked at) and `EV_RECEIPT`;
//!   one of `EV_ADD`, `EV_ADD | EV_ENABLE` (the re-arm record: a bare
//!   `EV_ENABLE` is never sent), `EV_DISABLE`, `EV_DELETE`; `EV_DISPATCH` on
//!   every add, re-arm and disable; `EV_DELETE` alone; never `EV_ONESHOT` or
//!   `EV_CLEAR`;
//! - `EV_ADD` only for an add or a modify, `EV_DELETE` only for a delete, the
//!   re-add after ENOENT, or the clean-up of a description kqueue cannot poll;
//! - the answer: EBADF on a closed number is `BadFd` (but a delete, for which it
//!   means already gone); an add on a description kqueue cannot poll is
//!   `NotPollable` and leaves no knote; an add or modify on an open, pollable
//!   number succeeds (ENOENT is repaired by a re-add);
//! - the knotes afterwards: add and modify(i) leave exactly the filters of i
//!   enabled, with `EV_DISPATCH`; quiet leaves none enabled; delete none present;
//! - every knote carries the `udata` of its number's registration (its slot, and
//!   a generation it was given, or its incarnation).
//!
//! A wait reports exactly the enabled knotes whose filter is ready, disables each
//! (`EV_DISPATCH`) and decodes to its `udata`'s slot and stamp. The delivery hook
//! sends only disables: with the re-arm record no readiness is lost on any
//! kernel (a knote enabled and ready is always active). Every run is made on
//! every kqueue semantics (`Semantics::KQUEUES`: FreeBSD and the kernels like it,
//! OpenBSD 6.4+, NetBSD 8/9, and OpenBSD with a 32-bit target's `udata`).

use arbitrary::Arbitrary;
use pollshot::model::{
    kq, Change, Command, CommandRecord, Fd, Filter, Levels, Model, Origin, Semantics,
};
use pollshot::state::{Kernel, KernelError};
use std::collections::BTreeMap;

/// One step. `fd` picks among the open numbers.
#[derive(Arbitrary, Clone, Copy, Debug)]
#[allow(missing_docs)]
pub enum KqOp {
    Open {
        file: bool,
    },
    Dup {
        fd: u8,
    },
    Close {
        fd: u8,
    },
    Levels {
        fd: u8,
        bits: u8,
    },
    /// `cmd` modulo 4: add, modify, quiet, delete, for the number's registration.
    Command {
        fd: u8,
        cmd: u8,
        interest: u8,
    },
    /// Deregister the number's registration (a delete) and register it anew.
    Renew {
        fd: u8,
    },
    Wait,
    /// The delivery hook for the number's registration.
    Delivered {
        fd: u8,
    },
}

#[derive(Clone, Copy, Debug)]
struct Reg {
    slot: u32,
    incarnation: u32,
    /// The generation of its last command (bumped by each, as the state
    /// machine does).
    generation: u32,
}

fn check_records(
    command: Command,
    result: &Result<(), KernelError>,
    sent: &[Change],
    fd: Fd,
    udata: u64,
) {
    use kq::*;
    for c in sent {
        assert_eq!(c.ident, fd, "{command:?}: {c:?}");
        if c.flags & EV_DELETE == 0 {
            assert_eq!(c.udata, udata, "{command:?}: {c:?}");
        }
        assert!(
            c.flags & EV_RECEIPT != 0,
            "{command:?}: no EV_RECEIPT in {c:?}"
        );
        assert!(c.flags & (EV_ONESHOT | EV_CLEAR) == 0, "{command:?}: {c:?}");
        let action = c.flags & (EV_ADD | EV_ENABLE | EV_DISABLE | EV_DELETE);
        assert!(
            [EV_ADD, EV_ADD | EV_ENABLE, EV_DISABLE, EV_DELETE].contains(&action),
            "{command:?}: not one action (or the re-arm record) in {c:?}"
        );
        if c.flags & EV_DELETE != 0 {
            assert_eq!(c.flags & !EV_RECEIPT, EV_DELETE, "{command:?}: {c:?}");
            let cleanup = matches!(result, Err(KernelError::NotPollable));
            assert!(
                matches!(
                    command,
                    Command::Delete | Command::Add(..) | Command::Modify(..)
                ) || cleanup,
                "EV_DELETE for {command:?}"
            );
        } else {
            assert!(
                c.flags & EV_DISPATCH != 0,
                "{command:?}: no EV_DISPATCH in {c:?}"
            );
        }
        if c.flags & EV_ADD != 0 {
            assert!(
                matches!(command, Command::Add(..) | Command::Modify(..)),
                "EV_ADD for {command:?}"
            );
        }
    }
}

/// Runs the steps on both kqueue semantics. Panics on the first broken rule.
pub fn run(ops: &[KqOp]) {
    for sem in Semantics::KQUEUES {
        run_on(sem, ops);
    }
}

fn run_on(sem: Semantics, ops: &[KqOp]) {
    let mut m = Model::new(sem);
    let mut regs: BTreeMap<Fd, Reg> = BTreeMap::new();
    let mut incarnations = 0u32;
    fn reg_of(fd: Fd, regs: &mut BTreeMap<Fd, Reg>, incarnations: &mut u32) -> Reg {
        let n = regs.len() as u32;
        *regs.entry(fd).or_insert_with(|| {
            *incarnations += 1;
            Reg {
                slot: n,
                incarnation: *incarnations,
                generation: 0,
            }
        })
    }
    let origin = Origin {
        owner: 1,
        arming: 1,
    };
    for &op in ops {
        let fds = m.open_fds();
        let pick = |i: u8| (!fds.is_empty()).then(|| fds[i as usize % fds.len()]);
        match op {
            KqOp::Open { file } => {
                if fds.len() < 8 {
                    m.open(!file);
                }
            }
            KqOp::Dup { fd } => {
                if let (Some(fd), true) = (pick(fd), fds.len() < 8) {
                    m.dup(fd).unwrap();
                }
            }
            KqOp::Close { fd } => {
                if let Some(fd) = pick(fd) {
                    m.close(fd).unwrap();
                    assert!(
                        m.knotes().keys().all(|&(f, _)| f != fd),
                        "close left knotes on {fd}"
                    );
                }
            }
            KqOp::Levels { fd, bits } => {
                if let Some(fd) = pick(fd) {
                    let d = m.description(fd).unwrap();
                    m.set_levels(d, Levels::from_bits(bits));
                }
            }
            KqOp::Wait => {
                // What must fire: the enabled knotes whose filter is ready, in key
                // order (the model's report order).
                let before = m.knotes().clone();
                let due: Vec<(Fd, Filter)> = before
                    .iter()
                    .filter(|&(&(fd, f), k)| {
                        k.enabled && f.fires(m.levels(m.description(fd).unwrap()))
                    })
                    .map(|(&key, _)| key)
                    .collect();
                let events = m.wait(usize::MAX);
                assert_eq!(
                    events.len(),
                    due.len(),
                    "a wait reported {events:?}, ready and enabled: {due:?}"
                );
                for (ev, key) in events.iter().zip(&due) {
                    assert_eq!(ev.filter, Some(key.1));
                    assert_eq!(
                        before[key].udata,
                        m.tag_for(ev.raw.slot, ev.raw.stamp, ev.raw.stamp),
                        "{ev:?} from {key:?}"
                    );
                }
                for (key, k) in m.knotes() {
                    let was = before[key].enabled;
                    assert_eq!(
                        k.enabled,
                        was && !due.contains(key),
                        "{key:?} after a wait (EV_DISPATCH)"
                    );
                }
            }
            KqOp::Delivered { fd } => {
                let Some(fd) = pick(fd) else { continue };
                let r = reg_of(fd, &mut regs, &mut incarnations);
                m.delivered(fd, r.slot, r.incarnation);
                for c in m.take_changes() {
                    assert_eq!(
                        c.flags,
                        kq::EV_DISABLE | kq::EV_DISPATCH | kq::EV_RECEIPT,
                        "delivery hook sent {c:?}"
                    );
                    assert_eq!(c.ident, fd);
                }
            }
            KqOp::Renew { fd } => {
                let Some(fd) = pick(fd) else { continue };
                let r = reg_of(fd, &mut regs, &mut incarnations);
                let _ = m.kernel(fd, r.slot, r.incarnation, origin).delete();
                m.take_changes();
                m.take_commands();
                incarnations += 1;
                regs.insert(
                    fd,
                    Reg {
                        incarnation: incarnations,
                        ..r
                    },
                );
            }
            KqOp::Command { fd, cmd, interest } => {
                let Some(fd) = pick(fd) else { continue };
                let mut r = reg_of(fd, &mut regs, &mut incarnations);
                r.generation = r.generation.wrapping_add(1);
                regs.insert(fd, r);
                let (i, g) = (super::interest(interest), r.generation);
                let command = match cmd % 4 {
                    0 => Command::Add(i, g),
                    1 => Command::Modify(i, g),
                    2 => Command::Quiet(g),
                    _ => Command::Delete,
                };
                let udata = m.tag_for(r.slot, r.incarnation, g);
                let pollable = m.description(fd).is_some_and(|d| m.is_pollable(d));
                let mut k = m.kernel(fd, r.slot, r.incarnation, origin);
                let result = match command {
                    Command::Add(i, g) => k.add(i, g),
                    Command::Modify(i, g) => k.modify(i, g),
                    Command::Quiet(g) => k.quiet(g),
                    Command::Delete => k.delete(),
                };
                let sent = m.take_changes();
                let log = m.take_commands();
                assert!(
                    matches!(&log[..], [CommandRecord { command: c, .. }] if *c == command),
                    "{command:?} logged as {log:?}"
                );
                check_records(command, &result, &sent, fd, udata);
                match (&result, command) {
                    (Err(KernelError::NotPollable), Command::Add(..) | Command::Modify(..)) => {
                        assert!(
                            !pollable,
                            "{command:?} on a pollable description: NotPollable"
                        );
                        assert!(
                            m.knotes().keys().all(|&(f, _)| f != fd),
                            "knotes left for a description kqueue cannot poll"
                        );
                    }
                    (Err(e), _) => {
                        let why = sent.len();
                        assert!(
                            matches!(
                                (e, command),
                                (KernelError::NotFound, Command::Quiet(_))
                                    | (
                                        KernelError::BadFd,
                                        Command::Add(..) | Command::Modify(..) | Command::Quiet(_)
                                    )
                            ),
                            "{command:?} on fd {fd} (pollable {pollable}, {why} records): {e:?}"
                        );
                        if matches!(e, KernelError::NotFound) {
                            // Every disable answered ENOENT: nothing of it is enabled.
                            assert!(Filter::BOTH.iter().all(|&f| !m.knote_enabled(fd, f)));
                        }
                    }
                    (Ok(()), _) => {
                        for f in Filter::BOTH {
                            let k = m.knotes().get(&(fd, f)).copied();
                            match command {
                                Command::Add(i, _) | Command::Modify(i, _) => {
                                    let on = k.is_some_and(|k| k.enabled && k.dispatch);
                                    assert_eq!(on, f.in_interest(i), "{command:?}: {f:?} {k:?}");
                                }
                                Command::Quiet(_) => assert!(
                                    !k.is_some_and(|k| k.enabled),
                                    "quiet left {f:?} enabled"
                                ),
                                Command::Delete => assert!(k.is_none(), "delete left {f:?}: {k:?}"),
                            }
                        }
                    }
                }
                // Only the modelled errors exist: an open pollable number never
                // answers BadFd.
                if matches!(result, Err(KernelError::BadFd)) {
                    assert!(!m.is_open(fd), "{command:?}: BadFd on an open number");
                }
            }
        }
        for (&(fd, f), k) in m.knotes() {
            let r = regs
                .get(&fd)
                .copied()
                .expect("a knote on a number never registered");
            let ok = if m.tag_is_generation() {
                (0..=r.generation).any(|g| k.udata == m.tag_for(r.slot, r.incarnation, g))
            } else {
                k.udata == m.tag_for(r.slot, r.incarnation, 0)
            };
            assert!(
                ok,
                "knote ({fd}, {f:?}) carries another registration's udata: {k:?}, {r:?}"
            );
        }
    }
}
