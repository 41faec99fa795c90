//! The registration table (`src/table.rs`) and the poller's lookups in it under
//! every interleaving: on a real `Poller` over the loom kernel (`kernel.rs`),
//! issue 8's point 7 kind (a lookup or a fetched event racing a deregistration and
//! a new registration of the same slot) and generation continuity; on the table
//! itself, a lookup racing the creation of a chunk, and the slot's bit lock (its
//! spin, park and wake protocol) between 2 and 3 threads.

use super::check;
use super::kernel::LoomKernel;
use crate::event::Readiness;
use crate::interest::Interest;
use crate::state::RegState;
use crate::table::{Entry, Table};
use crate::token::Token;
use crate::{Events, Poller};
use loom::sync::Arc;
use loom::thread;
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// The descriptor number the scenarios register (the loom kernel never touches
/// it).
const FD: RawFd = 10;

fn poller() -> Arc<Poller<LoomKernel>> {
    Arc::new(Poller::with_backend().unwrap())
}

fn register(p: &Poller<LoomKernel>) -> Token {
    // SAFETY: the loom kernel only keeps the number as a key; no descriptor is
    // used.
    unsafe { p.register_raw(FD) }.unwrap()
}

/// On another thread (loom explores a spawned thread's steps against the other
/// spawned threads'): deregisters `old`, registers the number again (the slot is
/// reused) and arms the new registration for `arm`; returns its token.
fn reregister(p: &Arc<Poller<LoomKernel>>, old: Token, arm: Option<Interest>) -> Token {
    spawn(p, move |p| {
        p.deregister(old).unwrap();
        let new = register(p);
        if let Some(interest) = arm {
            p.arm(new, interest).unwrap();
        }
        new
    })
    .join()
    .unwrap()
}

/// Runs `f` on `p` on a thread of its own.
fn spawn<T: 'static>(
    p: &Arc<Poller<LoomKernel>>,
    f: impl FnOnce(&Poller<LoomKernel>) -> T + 'static,
) -> thread::JoinHandle<T> {
    let p = Arc::clone(p);
    thread::spawn(move || f(&p))
}

/// What one `deliver` at timeout 0 returned: (token, readiness) per event.
fn deliver_now(p: &Poller<LoomKernel>) -> Vec<(Token, Readiness)> {
    let mut events = Events::with_capacity(8);
    p.deliver(&mut events, Some(Duration::ZERO)).unwrap();
    events.iter().map(|e| (e.token(), e.readiness)).collect()
}

/// An `arm` with the old token racing its deregistration and a new registration
/// of the number, which reuses the slot: the arm reaches the old registration or
/// fails `NotFound`, never arms the new one; the new one's first arming has a
/// generation after every one of the old registration's (generation continuity).
#[test]
fn loom_table_arm_racing_deregister_and_reregister_of_the_slot() {
    check(
        "table, arm(old) racing deregister(old) + register",
        3,
        || {
            let p = poller();
            let old = register(&p);
            let arm = spawn(&p, move |p| p.arm(old, Interest::READABLE));
            let new = reregister(&p, old, None);
            let armed = arm.join().unwrap();
            assert_eq!(new.slot(), old.slot(), "the slot is reused");
            assert_ne!(new, old);
            match &armed {
                Ok(()) => {}
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}"),
            }
            assert_eq!(
                p.backend().entry(FD),
                None,
                "the old token's arm ({armed:?}) reached the new registration"
            );
            // The old registration ended at generation 1 (never armed) or 2 (armed
            // once); the new one's first arming is the next.
            let old_end = if armed.is_ok() { 2 } else { 1 };
            p.arm(new, Interest::READABLE).unwrap();
            assert_eq!(
                p.backend().entry(FD),
                Some((old_end + 1, Some(Interest::READABLE)))
            );
        },
    );
}

/// Point 7's kind: a `deliver` that fetched the old registration's event (the
/// descriptor readable, armed readable) races its deregistration, a new
/// registration in the same slot and an arm of it for writable (the descriptor is
/// not writable). The event is delivered as the old registration's or dropped as
/// stale, never as the new one's; the new one is delivered once it is writable.
#[test]
fn loom_table_event_in_flight_across_deregister_and_reregister() {
    check(
        "table, deliver racing deregister + register + arm",
        3,
        || {
            let p = poller();
            let old = register(&p);
            p.arm(old, Interest::READABLE).unwrap();
            p.backend().set_ready(FD, Readiness::READABLE);
            let deliver = spawn(&p, deliver_now);
            let new = reregister(&p, old, Some(Interest::WRITABLE));
            let got = deliver.join().unwrap();
            assert!(
                got.iter()
                    .all(|&(t, r)| t == old && r == Readiness::READABLE),
                "delivered {got:?}: the old registration's event as the new one's ({new:?})"
            );
            assert!(got.len() <= 1, "one arming, delivered {got:?}");
            assert_eq!(deliver_now(&p), [], "the new registration is not writable");
            p.backend()
                .set_ready(FD, Readiness::READABLE.union(Readiness::WRITABLE));
            assert_eq!(deliver_now(&p), [(new, Readiness::WRITABLE)]);
        },
    );
}

/// A lookup of slot 64 racing the registration that creates its chunk (the
/// table's second small chunk): the lookup finds nothing, or the slot, empty or
/// with the registration in it (all three happen). Loom does not see the plain
/// memory of a chunk (`Box<[Line]>`), so it cannot tell a chunk published with
/// `Release` and found with `Acquire` from one published `Relaxed` (tried: this
/// passes either way); what it checks is the slot's lock and contents.
#[test]
fn loom_table_lookup_racing_the_registration_that_creates_a_chunk() {
    check(
        "table, lock(64) racing the insert that creates its chunk",
        3,
        || {
            let table = Arc::new(Table::new());
            let token = Token::new(64, 7);
            let insert = {
                let table = Arc::clone(&table);
                thread::spawn(move || {
                    let mut slot = table.lock_for_insert(64).unwrap();
                    let start = slot.next_generation();
                    *slot = Some(Entry {
                        fd: 64,
                        token,
                        state: RegState::new(start),
                    });
                })
            };
            let lookup = {
                let table = Arc::clone(&table);
                thread::spawn(move || table.lock(64).map(|slot| slot.as_ref().map(|e| e.token)))
            };
            let seen = lookup.join().unwrap();
            insert.join().unwrap();
            assert!(
                matches!(seen, None | Some(None)) || seen == Some(Some(token)),
                "{seen:?}"
            );
            assert!(table.lock(64).is_some_and(|slot| slot.is_some()));
        },
    );
}

/// `n` threads each take one slot's lock (the bit lock with its sleeping path:
/// one spin under loom, then `PARKED` and a bucket's condition variable) and add
/// one to the slot's generation under it: every thread gets the lock (an unlock
/// that missed a sleeper would leave it asleep: loom reports the deadlock), one at
/// a time (no increment is lost), and the slot is unlocked and vacant after.
fn slot_lock_excludes_and_wakes(n: u32) {
    let table = Arc::new(Table::new());
    drop(table.lock_for_insert(5).unwrap());
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                let mut slot = table.lock(5).unwrap();
                let generation = slot.next_generation();
                *slot = Some(Entry {
                    fd: 5,
                    token: Token::new(5, generation),
                    state: RegState::new(generation + 1),
                });
                slot.vacate();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let slot = table.lock(5).unwrap();
    assert!(slot.is_none());
    assert_eq!(
        slot.next_generation(),
        n,
        "an update under the lock was lost"
    );
}

#[test]
fn loom_table_slot_lock_two_threads() {
    check("table, slot lock, 2 threads", 3, || {
        slot_lock_excludes_and_wakes(2)
    });
}

#[test]
fn loom_table_slot_lock_three_threads() {
    check("table, slot lock, 3 threads", 3, || {
        slot_lock_excludes_and_wakes(3)
    });
}
