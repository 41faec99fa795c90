//! The translator, row by row of the state table, with the exact records; and the
//! readiness mapping. Parity with epoll through the kernel model is
//! `parity_tests.rs`.

use super::changes::*;
use crate::event::Readiness;
use crate::interest::Interest;
use crate::state::{Armed, Fallbacks, Kernel, KernelError, Phase, RegState};
use crate::token::pack_usize;
use std::collections::VecDeque;
use std::ffi::c_int as RawFd;

const FD: RawFd = 42;
const R: Interest = Interest::READABLE;
const W: Interest = Interest::WRITABLE;
const B: Interest = Interest::BOTH;

fn udata() -> usize {
    pack_usize(7, 3)
}

fn rec(filter: Filter, action: Action) -> Change {
    Change {
        fd: FD,
        filter,
        action,
        udata: udata(),
    }
}

use Action::{Add, Delete, Disable, Enable};
use Filter::{Read, Write};

/// A kernel that records every change record and answers from a script (0 once
/// it is used up), translating each command as the backend does: `translate`,
/// and on ENOENT from an `Enable` or an `Add`, `readd`.
struct Recorder {
    knotes: Knotes,
    log: Vec<Change>,
    script: VecDeque<i32>,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder::answering(&[])
    }

    fn answering(script: &[i32]) -> Recorder {
        Recorder {
            knotes: Knotes::NONE,
            log: Vec::new(),
            script: script.iter().copied().collect(),
        }
    }

    fn submit(&mut self, plan: Plan) -> Vec<(Change, i32)> {
        let mut answers = Vec::new();
        let mut after = plan.after;
        for c in plan.changes() {
            let errno = self.script.pop_front().unwrap_or(0);
            self.log.push(c);
            if errno != 0 && c.action != Delete {
                after.present = after.present.without(c.filter);
                after.enabled = after.enabled.without(c.filter);
            }
            answers.push((c, errno));
        }
        self.knotes = after;
        answers
    }

    fn run(&mut self, command: Command) -> Result<(), KernelError> {
        let answers = self.submit(translate(command, FD, udata(), self.knotes));
        let lost = answers
            .iter()
            .any(|(c, e)| matches!(c.action, Enable | Add) && *e == libc::ENOENT);
        let gone = answers
            .iter()
            .all(|(c, e)| c.action == Disable && *e == libc::ENOENT);
        for (c, e) in &answers {
            match (c.action, *e) {
                (_, 0) | (Delete, libc::ENOENT | libc::EBADF) | (_, libc::ENOENT) => {}
                (Add, libc::EINVAL) => return Err(KernelError::NotPollable),
                (_, libc::EBADF) => return Err(KernelError::BadFd),
                (_, e) => return Err(KernelError::Other(std::io::Error::from_raw_os_error(e))),
            }
        }
        match command {
            Command::Add(i) | Command::Modify(i) if lost => {
                self.submit(readd(FD, udata(), i));
                Ok(())
            }
            Command::Quiet if gone && !answers.is_empty() => Err(KernelError::NotFound),
            _ => Ok(()),
        }
    }

    fn take(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.log)
    }
}

impl Kernel for Recorder {
    fn add(&mut self, interest: Interest, _: u32) -> Result<(), KernelError> {
        self.run(Command::Add(interest))
    }
    fn modify(&mut self, interest: Interest, _: u32) -> Result<(), KernelError> {
        self.run(Command::Modify(interest))
    }
    fn quiet(&mut self, _: u32) -> Result<(), KernelError> {
        self.run(Command::Quiet)
    }
    fn delete(&mut self) -> Result<(), KernelError> {
        self.run(Command::Delete)
    }
}

fn arm(s: &mut RegState, i: Interest, k: &mut Recorder) -> Result<Armed, KernelError> {
    s.arm(i, k, &mut Fallbacks::default())
}

/// A registration armed for `i` (its records taken).
fn armed(i: Interest) -> (RegState, Recorder) {
    let mut s = RegState::new(0);
    let mut k = Recorder::new();
    arm(&mut s, i, &mut k).unwrap();
    k.take();
    (s, k)
}

/// A registration armed for `i`, then delivered (the backend's
/// `after_delivery` applied with `fired` filters): idle in the kernel.
fn idle(i: Interest, fired: Filters) -> (RegState, Recorder) {
    let (mut s, mut k) = armed(i);
    assert_eq!(s.on_event(None), Some(i));
    let plan = after_delivery(FD, udata(), k.knotes, fired);
    k.submit(plan);
    k.take();
    (s, k)
}

#[test]
fn flags_are_the_portable_values() {
    assert_eq!(Add.flags(), 0x0081, "EV_ADD | EV_DISPATCH");
    assert_eq!(Enable.flags(), 0x0085, "EV_ADD | EV_ENABLE | EV_DISPATCH");
    assert_eq!(Disable.flags(), 0x0088, "EV_DISABLE | EV_DISPATCH");
    assert_eq!(Delete.flags(), 0x0002, "EV_DELETE");
    assert_eq!(rec(Read, Enable).flags(), Enable.flags());
    assert_eq!(
        (EV_RECEIPT, EV_CLEAR, EV_ERROR, EV_EOF),
        (0x40, 0x20, 0x4000, 0x8000)
    );
}

// Row: fresh | arm(i) | add(i) | armed(i, g+1). One EV_ADD | EV_DISPATCH per
// filter in the interest; the other filter is not added. (kqueue's EV_ADD of an
// existing knote updates it: it never answers EEXIST, so that fallback is
// epoll's only.)
#[test]
fn row_fresh_arm_adds_each_filter_of_the_interest() {
    for (i, want) in [
        (R, vec![rec(Read, Add)]),
        (W, vec![rec(Write, Add)]),
        (B, vec![rec(Read, Add), rec(Write, Add)]),
    ] {
        let mut s = RegState::new(0);
        let mut k = Recorder::new();
        assert!(matches!(arm(&mut s, i, &mut k), Ok(Armed::Kernel)));
        assert_eq!(k.take(), want, "{i:?}");
        assert_eq!(k.knotes.present, Filters::of(i));
        assert_eq!(k.knotes.enabled, Filters::of(i));
        assert_eq!(s.phase(), Phase::Armed(i));
    }
}

#[test]
fn row_fresh_arm_refused() {
    // EINVAL (a device kqueue cannot poll, P09): always ready, nothing kept.
    let mut s = RegState::new(0);
    let mut k = Recorder::answering(&[libc::EINVAL]);
    assert!(matches!(arm(&mut s, R, &mut k), Ok(Armed::Synthetic)));
    assert_eq!(k.take(), [rec(Read, Add)]);
    assert!(s.is_always_ready() && !s.in_kernel());
    assert_eq!(k.knotes, Knotes::NONE);
    // EBADF: an error, the registration unchanged.
    let mut s = RegState::new(0);
    let mut k = Recorder::answering(&[libc::EBADF]);
    assert!(matches!(arm(&mut s, R, &mut k), Err(KernelError::BadFd)));
    assert_eq!(s, RegState::new(0));
}

// Row: idle | arm(i) | modify(i); on ENOENT: add(i) | armed(i, g+1). EV_ENABLE |
// EV_DISPATCH for the filters present, EV_ADD for one never added; nothing for
// a filter that is disabled already.
#[test]
fn row_idle_arm_enables() {
    for (first, fired, i, want) in [
        (R, Filters::READ, R, vec![rec(Read, Enable)]),
        (R, Filters::READ, W, vec![rec(Write, Add)]),
        (
            R,
            Filters::READ,
            B,
            vec![rec(Read, Enable), rec(Write, Add)],
        ),
        (B, Filters::READ, R, vec![rec(Read, Enable)]),
        (B, Filters::WRITE, W, vec![rec(Write, Enable)]),
        (
            B,
            Filters::BOTH,
            B,
            vec![rec(Read, Enable), rec(Write, Enable)],
        ),
    ] {
        let (mut s, mut k) = idle(first, fired);
        assert_eq!(
            k.knotes.enabled,
            Filters::NONE,
            "a delivery leaves nothing enabled"
        );
        assert!(matches!(arm(&mut s, i, &mut k), Ok(Armed::Kernel)));
        assert_eq!(
            k.take(),
            want,
            "armed {first:?}, fired {fired:?}, then {i:?}"
        );
        assert_eq!(k.knotes.enabled, Filters::of(i));
        assert_eq!(s.phase(), Phase::Armed(i));
    }
}

#[test]
fn row_idle_arm_not_found_starts_over() {
    // The descriptor was closed and its number reused: the kernel lost it.
    for (i, adds) in [
        (R, vec![rec(Read, Add)]),
        (B, vec![rec(Read, Add), rec(Write, Add)]),
    ] {
        let (mut s, _) = idle(B, Filters::BOTH);
        let mut k = Recorder::answering(&[libc::ENOENT, libc::ENOENT]);
        k.knotes = Knotes {
            present: Filters::BOTH,
            enabled: Filters::NONE,
        };
        assert!(matches!(arm(&mut s, i, &mut k), Ok(Armed::Kernel)));
        let mut want: Vec<Change> = translate(
            Command::Modify(i),
            FD,
            udata(),
            Knotes {
                present: Filters::BOTH,
                enabled: Filters::NONE,
            },
        )
        .changes()
        .collect();
        want.extend([rec(Read, Delete), rec(Write, Delete)]);
        want.extend(adds);
        assert_eq!(k.take(), want, "{i:?}");
        assert_eq!(k.knotes.present, Filters::of(i));
        assert_eq!(s.phase(), Phase::Armed(i));
    }
}

// Row: armed(i, g) | arm(i) | none: zero records | armed(i, g).
#[test]
fn row_armed_arm_same_interest_issues_nothing() {
    for i in Interest::ALL {
        let (mut s, mut k) = armed(i);
        assert!(matches!(arm(&mut s, i, &mut k), Ok(Armed::Unchanged)));
        assert!(k.take().is_empty());
    }
}

// Row: armed(i, g) | arm(j), j != i | modify(j) | armed(j, g+1). Enable (or add)
// the filters of j, disable the enabled ones outside it.
#[test]
fn row_armed_arm_other_interest() {
    for (i, j, want) in [
        (R, W, vec![rec(Read, Disable), rec(Write, Add)]),
        (R, B, vec![rec(Read, Enable), rec(Write, Add)]),
        (W, R, vec![rec(Read, Add), rec(Write, Disable)]),
        (W, B, vec![rec(Read, Add), rec(Write, Enable)]),
        (B, R, vec![rec(Read, Enable), rec(Write, Disable)]),
        (B, W, vec![rec(Read, Disable), rec(Write, Enable)]),
    ] {
        let (mut s, mut k) = armed(i);
        assert!(matches!(arm(&mut s, j, &mut k), Ok(Armed::Kernel)));
        assert_eq!(k.take(), want, "{i:?} -> {j:?}");
        assert_eq!(k.knotes.enabled, Filters::of(j));
        assert_eq!(k.knotes.present, Filters::of(i).union(Filters::of(j)));
    }
}

// Row: armed(i, g) | disarm | quiet | idle, g+1. EV_DISABLE | EV_DISPATCH for
// each enabled filter (EV_DISPATCH kept, or a re-enable could fire twice).
#[test]
fn row_armed_disarm_disables() {
    for (i, want) in [
        (R, vec![rec(Read, Disable)]),
        (W, vec![rec(Write, Disable)]),
        (B, vec![rec(Read, Disable), rec(Write, Disable)]),
    ] {
        let (mut s, mut k) = armed(i);
        assert!(matches!(s.disarm(&mut k), Ok(true)));
        assert_eq!(k.take(), want, "{i:?}");
        assert_eq!(k.knotes.enabled, Filters::NONE);
        assert_eq!(
            k.knotes.present,
            Filters::of(i),
            "never deleted by a disarm"
        );
        assert_eq!(s.phase(), Phase::Idle);
    }
    // Armed for R after B: only R is enabled; W was disabled by the arm.
    let (mut s, mut k) = armed(B);
    arm(&mut s, R, &mut k).unwrap();
    k.take();
    s.disarm(&mut k).unwrap();
    assert_eq!(k.take(), [rec(Read, Disable)]);
    // ENOENT: the kernel dropped it; fresh.
    let (mut s, mut k) = armed(R);
    k.script.push_back(libc::ENOENT);
    assert!(matches!(s.disarm(&mut k), Ok(true)));
    assert_eq!(s.phase(), Phase::Fresh);
}

// Row: fresh or idle | disarm | none | unchanged.
#[test]
fn row_fresh_or_idle_disarm_issues_nothing() {
    let mut s = RegState::new(0);
    let mut k = Recorder::new();
    assert!(matches!(s.disarm(&mut k), Ok(false)));
    let (mut s, mut k2) = idle(B, Filters::READ);
    assert!(matches!(s.disarm(&mut k2), Ok(false)));
    assert!(k.take().is_empty() && k2.take().is_empty());
}

// Row: armed(i, g) | kernel event | none | idle; delivered. EV_DISPATCH disabled
// the filter that fired; the other enabled one is disabled after the delivery,
// so one delivery disarms the whole registration (parity with EPOLLONESHOT).
#[test]
fn row_delivery_disables_the_filters_that_did_not_fire() {
    let both = Knotes {
        present: Filters::BOTH,
        enabled: Filters::BOTH,
    };
    let plan = after_delivery(FD, udata(), both, Filters::READ);
    assert_eq!(plan.changes().collect::<Vec<_>>(), [rec(Write, Disable)]);
    assert_eq!(plan.after.enabled, Filters::NONE);
    let plan = after_delivery(FD, udata(), both, Filters::WRITE);
    assert_eq!(plan.changes().collect::<Vec<_>>(), [rec(Read, Disable)]);
    assert!(after_delivery(FD, udata(), both, Filters::BOTH).is_empty());
    let read = Knotes {
        present: Filters::BOTH,
        enabled: Filters::READ,
    };
    let plan = after_delivery(FD, udata(), read, Filters::READ);
    assert!(
        plan.is_empty(),
        "a single-filter arming costs nothing after delivery"
    );
    assert_eq!(
        plan.after,
        Knotes {
            present: Filters::BOTH,
            enabled: Filters::NONE
        }
    );
}

// Row: any | stale event | none | unchanged. Nothing to translate: the table
// drops it. Row: in kernel | deregister | delete | freed.
#[test]
fn row_in_kernel_deregister_deletes_each_added_filter() {
    for (i, want) in [
        (R, vec![rec(Read, Delete)]),
        (W, vec![rec(Write, Delete)]),
        (B, vec![rec(Read, Delete), rec(Write, Delete)]),
    ] {
        let (mut s, mut k) = armed(i);
        assert!(matches!(s.deregister(&mut k), Ok(true)));
        assert_eq!(k.take(), want, "{i:?}");
        assert_eq!(k.knotes, Knotes::NONE);
    }
    // Idle after R then W: both knotes exist, both deleted.
    let (mut s, mut k) = idle(R, Filters::READ);
    arm(&mut s, W, &mut k).unwrap();
    s.disarm(&mut k).unwrap();
    k.take();
    s.deregister(&mut k).unwrap();
    assert_eq!(k.take(), [rec(Read, Delete), rec(Write, Delete)]);
    // ENOENT / EBADF (closed): not errors.
    for e in [libc::ENOENT, libc::EBADF] {
        let (mut s, mut k) = armed(R);
        k.script.push_back(e);
        assert!(matches!(s.deregister(&mut k), Ok(true)));
    }
}

// Row: fresh | deregister | none | freed.
#[test]
fn row_fresh_deregister_issues_nothing() {
    let mut s = RegState::new(0);
    let mut k = Recorder::new();
    assert!(matches!(s.deregister(&mut k), Ok(false)));
    assert!(k.take().is_empty());
}

#[test]
fn readd_deletes_then_adds_the_interest() {
    let plan = readd(FD, udata(), W);
    assert_eq!(
        plan.changes().collect::<Vec<_>>(),
        [rec(Read, Delete), rec(Write, Delete), rec(Write, Add)]
    );
    assert_eq!(
        plan.after,
        Knotes {
            present: Filters::WRITE,
            enabled: Filters::WRITE
        }
    );
}

#[test]
fn readiness_per_filter() {
    let rc = Readiness::READABLE.union(Readiness::READ_CLOSED);
    let wc = Readiness::WRITABLE.union(Readiness::WRITE_CLOSED);
    assert_eq!(readiness(Read, 0, 0), Readiness::READABLE);
    assert_eq!(readiness(Write, 0, 0), Readiness::WRITABLE);
    // P10: a peer's shutdown(SHUT_WR) is read-closed only.
    assert_eq!(readiness(Read, EV_EOF, 0), rc);
    assert_eq!(readiness(Write, EV_EOF, 0), wc);
    // EV_EOF with the socket's error in fflags (P11: a reset).
    assert_eq!(
        readiness(Read, EV_EOF, libc::ECONNRESET as u32),
        rc.union(Readiness::ERROR)
    );
    assert_eq!(
        readiness(Write, EV_EOF, libc::EPIPE as u32),
        wc.union(Readiness::ERROR)
    );
    // fflags without EV_EOF is filter data (NOTE_LOWAT...), not an error.
    assert_eq!(
        readiness(Read, EV_DISPATCH | EV_ADD, 1),
        Readiness::READABLE
    );
    assert!(REFUSED.contains(
        Readiness::ERROR
            .union(Readiness::READABLE)
            .union(Readiness::WRITABLE)
    ));
}
