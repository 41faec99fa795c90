//! The `kqueue_changes` harness: arbitrary state-machine commands (add, modify,
//! quiet, delete, in any order, legal or not) for a few registrations, translated
//! by `pollshot::model::kqueue_changes` into kevent change records and applied to
//! the model's kqueue, between descriptor churn (open, dup, close, number reuse)
//! and waits.
//!
//! Checked for every command:
//! - the records: one per filter, read first; every one with `EV_RECEIPT` and the
//!   registration's `udata`; `EV_DISPATCH` on every add, enable and disable;
//!   `EV_DELETE` only for delete and alone; never `EV_ONESHOT` or `EV_CLEAR`;
//! - the kernel's answers: EBADF on a closed number; EINVAL for an add on a
//!   description kqueue cannot poll; ENOENT for an enable, disable or delete of a
//!   knote that does not exist; the state machine's classification of each;
//! - the knotes afterwards, when every record succeeded: add and modify(i) leave
//!   exactly the filters of i enabled, quiet none, delete none present;
//! - `udata` of a knote changes only with `EV_ADD`;
//! - a wait reports only enabled knotes, disables each reported one
//!   (`EV_DISPATCH`), and decodes to the slot and incarnation of its `udata`.

use arbitrary::Arbitrary;
use pollshot::model::{
    kq, kqueue_changes, Command, Errno, Fd, Filter, Levels, Model, Origin, Semantics,
};
use pollshot::state::{Kernel, KernelError};
use std::collections::BTreeMap;

/// One step.
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
    /// `cmd` modulo 4: add, modify, quiet, delete; the registration is
    /// (`fd`, `slot` modulo 4, `incarnation` modulo 4).
    Command {
        fd: u8,
        slot: u8,
        incarnation: u8,
        cmd: u8,
        interest: u8,
        generation: u32,
    },
    Wait,
}

fn check_records(command: Command, changes: &[pollshot::model::Change; 2], fd: Fd, udata: u64) {
    use kq::*;
    assert_eq!(changes[0].filter, Filter::Read);
    assert_eq!(changes[1].filter, Filter::Write);
    for c in changes {
        assert_eq!((c.ident, c.udata), (fd, udata), "{command:?}: {c:?}");
        assert!(
            c.flags & EV_RECEIPT != 0,
            "{command:?}: no EV_RECEIPT in {c:?}"
        );
        assert!(c.flags & (EV_ONESHOT | EV_CLEAR) == 0, "{command:?}: {c:?}");
        let acts = [EV_ADD, EV_ENABLE, EV_DISABLE, EV_DELETE];
        if c.flags & EV_DELETE != 0 {
            assert!(
                matches!(command, Command::Delete),
                "EV_DELETE for {command:?}"
            );
            assert_eq!(c.flags & !EV_RECEIPT, EV_DELETE, "{command:?}: {c:?}");
        } else {
            assert!(
                c.flags & EV_DISPATCH != 0,
                "{command:?}: no EV_DISPATCH in {c:?}"
            );
            assert!(
                acts.iter().any(|a| c.flags & a != 0),
                "{command:?}: no action in {c:?}"
            );
        }
        let enables = c.flags & (EV_ADD | EV_ENABLE) != 0 && c.flags & EV_DISABLE == 0;
        let wanted = match command {
            Command::Add(i, _) | Command::Modify(i, _) => c.filter.in_interest(i),
            Command::Quiet(_) | Command::Delete => false,
        };
        assert_eq!(enables, wanted, "{command:?}: {c:?}");
        if c.flags & EV_ADD != 0 {
            assert!(
                matches!(command, Command::Add(..)),
                "EV_ADD for {command:?}"
            );
        }
    }
}

/// Runs the steps. Panics on the first broken rule.
pub fn run(ops: &[KqOp]) {
    let mut m = Model::new(Semantics::Kqueue);
    // udata each knote was added with, to check it never changes otherwise.
    let mut added: BTreeMap<(Fd, Filter), u64> = BTreeMap::new();
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
                    added.retain(|&(f, _), _| f != fd);
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
                let enabled: Vec<(Fd, Filter)> = m
                    .knotes()
                    .iter()
                    .filter(|(_, k)| k.enabled)
                    .map(|(&key, _)| key)
                    .collect();
                let before = m.knotes().clone();
                for ev in m.wait(usize::MAX) {
                    let f = ev.filter.expect("a kqueue event names its filter");
                    let key = enabled
                        .iter()
                        .copied()
                        .find(|&(fd, filt)| {
                            filt == f
                                && before[&(fd, filt)].udata
                                    == m.tag_for(ev.raw.slot, ev.raw.stamp, 0)
                        })
                        .expect("an event from a knote that was not enabled");
                    assert!(
                        !m.knote_enabled(key.0, key.1),
                        "EV_DISPATCH left {key:?} enabled"
                    );
                }
            }
            KqOp::Command {
                fd,
                slot,
                incarnation,
                cmd,
                interest,
                generation,
            } => {
                let Some(fd) = pick(fd) else { continue };
                let (slot, inc) = (u32::from(slot % 4), u32::from(incarnation % 4));
                let i = super::interest(interest);
                let command = match cmd % 4 {
                    0 => Command::Add(i, generation),
                    1 => Command::Modify(i, generation),
                    2 => Command::Quiet(generation),
                    _ => Command::Delete,
                };
                let udata = m.tag_for(slot, inc, generation);
                let origin = Origin {
                    owner: 1,
                    arming: 1,
                };
                check_records(
                    command,
                    &kqueue_changes(command, fd, udata, origin),
                    fd,
                    udata,
                );
                let open = m.is_open(fd);
                let pollable = m.description(fd).is_some_and(|d| m.is_pollable(d));
                let had: Vec<bool> = Filter::BOTH
                    .iter()
                    .map(|&f| m.knotes().contains_key(&(fd, f)))
                    .collect();
                let mut k = m.kernel(fd, slot, inc, origin);
                let r = match command {
                    Command::Add(i, g) => k.add(i, g),
                    Command::Modify(i, g) => k.modify(i, g),
                    Command::Quiet(g) => k.quiet(g),
                    Command::Delete => k.delete(),
                };
                let log = m.take_commands();
                assert_eq!(log.len(), 1);
                let want = if !open {
                    Some(Errno::BadF)
                } else if matches!(command, Command::Add(..)) {
                    (!pollable).then_some(Errno::Inval)
                } else {
                    (!had.iter().all(|&h| h)).then_some(Errno::NoEnt)
                };
                assert_eq!(
                    log[0].error, want,
                    "{command:?} on fd {fd} (open {open}, pollable {pollable}, knotes {had:?})"
                );
                match (want, &r) {
                    (None, Ok(())) => {}
                    (Some(Errno::BadF), Err(KernelError::BadFd))
                    | (Some(Errno::Inval), Err(KernelError::NotPollable))
                    | (Some(Errno::NoEnt), Err(KernelError::NotFound)) => {}
                    _ => panic!("{command:?}: answered {:?}, classified {r:?}", log[0].error),
                }
                if want.is_none() {
                    for f in Filter::BOTH {
                        let k = m.knotes().get(&(fd, f)).copied();
                        match command {
                            Command::Add(i, _) | Command::Modify(i, _) => {
                                let k = k.expect("an armed registration lost a knote");
                                assert_eq!(k.enabled, f.in_interest(i), "{command:?}: {f:?} {k:?}");
                                assert!(k.dispatch);
                            }
                            Command::Quiet(_) => {
                                assert!(!k.unwrap().enabled, "quiet left {f:?} enabled")
                            }
                            Command::Delete => assert!(k.is_none(), "delete left {f:?}"),
                        }
                    }
                }
                match command {
                    Command::Add(..) if want.is_none() => {
                        for f in Filter::BOTH {
                            added.insert((fd, f), udata);
                        }
                    }
                    Command::Delete if want.is_none() => {
                        added.retain(|&(f, _), _| f != fd);
                    }
                    _ => {}
                }
                for (key, k) in m.knotes() {
                    assert_eq!(
                        Some(&k.udata),
                        added.get(key),
                        "udata of {key:?} changed without EV_ADD"
                    );
                }
            }
        }
    }
}
