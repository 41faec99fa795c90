//! The Windows completion-port extras: posted packets (`Poller::post`) and
//! waitable handles (`Poller::register_waitable`), with exact counts from
//! `stats`. Run under wine:
//!
//! ```text
//! bash .ci/wine.sh cargo test --target x86_64-pc-windows-gnu --features stats --test windows_iocp
//! ```
//!
//! Timing never decides a pass: deadlines only turn a lost event or a hang into
//! a failure. "Nothing is delivered" is checked with a notify: the deliver that
//! takes it must return no event (and `stats` must show no packet dropped as
//! stale where none may exist).
#![cfg(all(windows, feature = "stats"))]

mod windows_common;

use pollshot::{Events, Interest, Poller, Stats, Token};
use std::io;
use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle, RawHandle};
use std::ptr;
use std::sync::Arc;
use std::thread;
use std::time::Duration;
use windows_common::{
    delta, event, notify_and_see_nothing, on_cue, one, reset, set, until_waiters, LONG, TRIALS,
};
use windows_sys::Win32::Foundation::{HANDLE, INVALID_HANDLE_VALUE};
use windows_sys::Win32::System::Memory::{CreateFileMappingW, PAGE_READWRITE};

fn assert_not_found(r: io::Result<()>) {
    assert_eq!(r.unwrap_err().kind(), io::ErrorKind::NotFound);
}

// ---- posted packets ----

#[test]
fn a_post_round_trips_its_key_and_directions() {
    let p = Poller::new().unwrap();
    let key = if cfg!(target_pointer_width = "64") {
        0xDEAD_BEEF_0000_0001u64 as usize
    } else {
        0xDEAD_0001
    };
    for (interest, r, w) in [
        (Interest::READABLE, true, false),
        (Interest::WRITABLE, false, true),
        (Interest::BOTH, true, true),
    ] {
        let (_, s) = delta(&p, || p.post(key, interest).unwrap());
        assert_eq!(s, Stats::default(), "a post is not counted");
        let (ev, s) = delta(&p, || one(&p));
        assert!(ev.is_posted());
        assert_eq!(ev.key(), key);
        assert_eq!((ev.is_readable(), ev.is_writable()), (r, w), "{interest:?}");
        assert!(!ev.is_error() && !ev.is_read_closed() && !ev.is_write_closed());
        assert!(!ev.is_priority());
        assert_eq!(
            s,
            Stats {
                waits: 1,
                ..Stats::default()
            }
        );
        // Its token names no registration.
        assert_eq!(ev.token(), Token::from_u64(u64::MAX));
        assert_not_found(p.arm(ev.token(), Interest::READABLE));
        assert_not_found(p.disarm(ev.token()));
        assert_not_found(p.deregister(ev.token()));
    }
    // Keys at the edges.
    for key in [0, usize::MAX] {
        p.post(key, Interest::READABLE).unwrap();
        assert_eq!(one(&p).key(), key);
    }
}

#[test]
fn a_post_with_priority_is_invalid_input_and_posts_nothing() {
    let p = Poller::new().unwrap();
    let e = p
        .post(1, Interest::READABLE | Interest::PRIORITY)
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    notify_and_see_nothing(&p);
}

#[test]
fn registration_events_are_not_posted() {
    let p = Poller::new().unwrap();
    let ev = event(true);
    let t = p.register_waitable(&ev, 3).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    set(&ev);
    let e = one(&p);
    assert!(!e.is_posted());
    assert_eq!((e.token(), e.key()), (t, 3));
    p.deregister(t).unwrap();
}

#[test]
fn posts_from_four_threads_reach_four_waiters_once_each() {
    let p = Arc::new(Poller::new().unwrap());
    for trial in 0..TRIALS {
        let before = p.stats();
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let p = Arc::clone(&p);
                thread::spawn(move || {
                    // Capacity 1: each waiter can take one packet only.
                    let mut events = Events::with_capacity(1);
                    assert_eq!(p.deliver(&mut events, LONG).unwrap(), 1);
                    assert!(!events.is_notified());
                    let ev = *events.iter().next().unwrap();
                    assert!(ev.is_posted() && ev.is_readable() && !ev.is_writable());
                    ev.key()
                })
            })
            .collect();
        until_waiters(&p, 4);
        let posters: Vec<_> = (0..4)
            .map(|i| {
                let p = Arc::clone(&p);
                thread::spawn(move || p.post(trial * 4 + i, Interest::READABLE).unwrap())
            })
            .collect();
        for t in posters {
            t.join().unwrap();
        }
        let mut keys: Vec<usize> = waiters.into_iter().map(|t| t.join().unwrap()).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            (trial * 4..trial * 4 + 4).collect::<Vec<_>>(),
            "trial {trial}"
        );
        let s = p.stats().since(&before);
        assert_eq!((s.stale, s.wakes), (0, 0), "trial {trial}: {s:?}");
        // No packet left over.
        notify_and_see_nothing(&p);
    }
}

#[test]
fn posts_and_notifies_stay_apart() {
    let p = Poller::new().unwrap();
    // Queued before any deliver: post, notify, post. One deliver takes all
    // three: the two posts as events, the notify as the notified mark.
    let (_, s) = delta(&p, || {
        p.post(1, Interest::READABLE).unwrap();
        p.notify().unwrap();
        p.post(2, Interest::WRITABLE).unwrap();
    });
    assert_eq!(
        s,
        Stats {
            wakes: 1,
            ..Stats::default()
        },
        "the notify is one waker post, the posts are not counted"
    );
    let mut events = Events::with_capacity(8);
    let (n, s) = delta(&p, || p.deliver(&mut events, LONG).unwrap());
    assert_eq!(n, 2);
    assert!(events.is_notified());
    let keys: Vec<usize> = events.iter().map(|e| e.key()).collect();
    assert_eq!(keys, [1, 2]);
    assert!(events.iter().all(|e| e.is_posted()));
    assert_eq!(
        s,
        Stats {
            waits: 1,
            ..Stats::default()
        }
    );
    // The notify was consumed once: the next deliver finds nothing.
    assert_eq!(p.deliver(&mut events, Some(Duration::ZERO)).unwrap(), 0);
    assert!(!events.is_notified());

    // A blocked waiter: a post ends its deliver with an event and no notify;
    // a notify ends the next with no event.
    let p = Arc::new(p);
    for trial in 0..TRIALS {
        let waiter = {
            let p = Arc::clone(&p);
            thread::spawn(move || {
                let mut events = Events::with_capacity(8);
                let n = p.deliver(&mut events, LONG).unwrap();
                (
                    n,
                    events.is_notified(),
                    events.iter().map(|e| e.key()).collect::<Vec<_>>(),
                )
            })
        };
        until_waiters(&p, 1);
        p.post(100 + trial, Interest::READABLE).unwrap();
        assert_eq!(waiter.join().unwrap(), (1, false, vec![100 + trial]));
        let waiter = {
            let p = Arc::clone(&p);
            thread::spawn(move || {
                let mut events = Events::with_capacity(8);
                (p.deliver(&mut events, LONG).unwrap(), events.is_notified())
            })
        };
        until_waiters(&p, 1);
        p.notify().unwrap();
        assert_eq!(waiter.join().unwrap(), (0, true));
    }
}

// ---- waitable handles ----

#[test]
fn a_set_event_is_delivered_once_and_again_only_when_rearmed() {
    let p = Poller::new().unwrap();
    let ev = event(true);
    let (t, s) = delta(&p, || p.register_waitable(&ev, 7).unwrap());
    assert_eq!(
        s,
        Stats::default(),
        "register's check is not a backend call"
    );
    let (_, s) = delta(&p, || p.arm(t, Interest::READABLE).unwrap());
    assert_eq!(
        s,
        Stats {
            adds: 1,
            ctl_calls: 2, // DuplicateHandle (the first arm), RegisterWaitForSingleObject
            ..Stats::default()
        }
    );
    set(&ev);
    let (e, s) = delta(&p, || one(&p));
    assert_eq!((e.token(), e.key()), (t, 7));
    assert!(e.is_readable() && !e.is_writable() && !e.is_error() && !e.is_posted());
    assert_eq!(
        s,
        Stats {
            waits: 1,
            ..Stats::default()
        }
    );
    // Oneshot: still set, but not armed.
    let (_, s) = delta(&p, || notify_and_see_nothing(&p));
    assert_eq!(s.stale, 0);
    // Re-armed while still set (manual reset): delivered again at once.
    let (_, s) = delta(&p, || p.arm(t, Interest::READABLE).unwrap());
    assert_eq!(
        s,
        Stats {
            modifies: 1,
            ctl_calls: 2, // UnregisterWaitEx of the fired wait, RegisterWaitForSingleObject
            ..Stats::default()
        }
    );
    assert_eq!(one(&p).token(), t);
    // Reset, re-armed: nothing until it is set again.
    reset(&ev);
    p.arm(t, Interest::READABLE).unwrap();
    // An arm of an armed registration issues nothing.
    let (_, s) = delta(&p, || p.arm(t, Interest::READABLE).unwrap());
    assert_eq!(s, Stats::default());
    notify_and_see_nothing(&p);
    set(&ev);
    assert_eq!(one(&p).token(), t);
    let (_, s) = delta(&p, || p.deregister(t).unwrap());
    assert_eq!(
        s,
        Stats {
            deletes: 1,
            ctl_calls: 1, // UnregisterWaitEx
            ..Stats::default()
        }
    );
    assert!(p.is_empty());
}

#[test]
fn an_auto_reset_event_is_consumed_by_its_delivery() {
    let p = Poller::new().unwrap();
    let ev = event(false);
    set(&ev); // set before the arm: the wait is satisfied at once
    let t = p.register_waitable(&ev, 1).unwrap();
    for _ in 0..TRIALS {
        p.arm(t, Interest::READABLE).unwrap();
        assert_eq!(one(&p).token(), t);
        set(&ev);
    }
    // The last set is still pending (nothing waited on it): one more.
    p.arm(t, Interest::READABLE).unwrap();
    assert_eq!(one(&p).token(), t);
    // The wait consumed it: armed again, nothing.
    p.arm(t, Interest::READABLE).unwrap();
    let (_, s) = delta(&p, || notify_and_see_nothing(&p));
    assert_eq!(s.stale, 0);
    p.deregister(t).unwrap();
}

#[test]
fn disarm_then_set_delivers_nothing() {
    let p = Poller::new().unwrap();
    let ev = event(true);
    let t = p.register_waitable(&ev, 0).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    // The wait stays in the pool, disarmed: no system call.
    let (_, s) = delta(&p, || p.disarm(t).unwrap());
    assert_eq!(
        s,
        Stats {
            quiets: 1,
            ..Stats::default()
        }
    );
    set(&ev);
    let (_, s) = delta(&p, || notify_and_see_nothing(&p));
    assert_eq!(s.stale, 0, "the disarmed wait posted nothing");
    // The registration is intact: armed again, the set event is reported.
    let (_, s) = delta(&p, || p.arm(t, Interest::READABLE).unwrap());
    // Either the pool had not seen the set yet (the disarmed wait is the new
    // arming's: no call), or its wait took it for the disarmed registration,
    // which kept it (UnregisterWaitEx of the spent wait, and the arming's
    // packet posted at once).
    let want = |ctl_calls| Stats {
        modifies: 1,
        ctl_calls,
        ..Stats::default()
    };
    assert!(s == want(0) || s == want(2), "{s:?}");
    assert_eq!(one(&p).token(), t);
    p.deregister(t).unwrap();
}

#[test]
fn deregister_then_set_delivers_nothing_and_the_handle_closes() {
    let p = Poller::new().unwrap();
    let ev = event(true);
    let t = p.register_waitable(&ev, 0).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    p.deregister(t).unwrap();
    set(&ev);
    drop(ev); // CloseHandle: the pool no longer waits on it
    let (_, s) = delta(&p, || notify_and_see_nothing(&p));
    assert_eq!(s.stale, 0);
    assert!(p.is_empty());
    assert_not_found(p.arm(t, Interest::READABLE));
}

#[test]
fn a_signal_racing_deregister_is_never_delivered_after_it() {
    let p = Arc::new(Poller::new().unwrap());
    let mut stale = 0;
    for trial in 0..TRIALS {
        let ev = Arc::new(event(true));
        let t = p.register_waitable(&*ev, trial).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        let (go, setter) = {
            let ev = Arc::clone(&ev);
            on_cue(move || set(&ev))
        };
        go.wait();
        let before = p.stats();
        p.deregister(t).unwrap();
        setter.join().unwrap();
        drop(ev);
        // Whatever the callback posted before the deregister is stale now.
        notify_and_see_nothing(&p);
        stale += p.stats().since(&before).stale;
    }
    assert!(stale <= TRIALS as u64, "at most one stale packet per trial");
}

#[test]
fn four_signaled_waitables_reach_four_waiters_once_each() {
    let p = Arc::new(Poller::new().unwrap());
    let evs: Vec<OwnedHandle> = (0..4).map(|_| event(false)).collect();
    let tokens: Vec<Token> = evs
        .iter()
        .enumerate()
        .map(|(i, ev)| p.register_waitable(ev, i).unwrap())
        .collect();
    for trial in 0..TRIALS {
        for &t in &tokens {
            p.arm(t, Interest::READABLE).unwrap();
        }
        let before = p.stats();
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let p = Arc::clone(&p);
                thread::spawn(move || {
                    let mut events = Events::with_capacity(1);
                    assert_eq!(p.deliver(&mut events, LONG).unwrap(), 1);
                    let ev = *events.iter().next().unwrap();
                    assert!(ev.is_readable() && !ev.is_posted());
                    (ev.token(), ev.key())
                })
            })
            .collect();
        until_waiters(&p, 4);
        for ev in &evs {
            set(ev);
        }
        let mut got: Vec<(Token, usize)> = waiters.into_iter().map(|t| t.join().unwrap()).collect();
        got.sort_unstable_by_key(|&(_, k)| k);
        let want: Vec<(Token, usize)> = tokens.iter().copied().zip(0..4).collect();
        assert_eq!(got, want, "trial {trial}");
        assert_eq!(p.stats().since(&before).stale, 0, "trial {trial}");
    }
    notify_and_see_nothing(&p);
    for t in tokens {
        p.deregister(t).unwrap();
    }
}

#[test]
fn a_child_process_exit_wakes_its_registration() {
    let p = Poller::new().unwrap();
    let mut child = std::process::Command::new("cmd")
        .args(["/c", "exit 3"])
        .spawn()
        .unwrap();
    let t = p.register_waitable(&child, 42).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let e = one(&p);
    assert_eq!((e.token(), e.key()), (t, 42));
    assert!(e.is_readable());
    // It has exited: the status is there without waiting.
    assert_eq!(child.try_wait().unwrap().and_then(|s| s.code()), Some(3));
    // A process stays signaled: armed again, reported again.
    p.arm(t, Interest::READABLE).unwrap();
    assert_eq!(one(&p).token(), t);
    p.deregister(t).unwrap();
}

#[test]
fn handles_that_cannot_be_waited_on_are_refused() {
    use windows_sys::Win32::Foundation::DuplicateHandle;
    use windows_sys::Win32::System::Threading::GetCurrentProcess;
    let p = Poller::new().unwrap();
    // SAFETY: no file (the paging file), no name; the handle returned is ours.
    let mapping = unsafe {
        CreateFileMappingW(
            INVALID_HANDLE_VALUE,
            ptr::null(),
            PAGE_READWRITE,
            0,
            4096,
            ptr::null(),
        )
    };
    assert!(!mapping.is_null());
    // SAFETY: `mapping` is a new handle nothing else owns.
    let mapping = unsafe { OwnedHandle::from_raw_handle(mapping as RawHandle) };
    // The same section with SYNCHRONIZE access, which a section has no use for.
    let mut dup: HANDLE = ptr::null_mut();
    // SAFETY: both process handles are this process's pseudo-handle; `dup` is a
    // live out-parameter; the handle made is ours.
    let ok = unsafe {
        DuplicateHandle(
            GetCurrentProcess(),
            mapping.as_raw_handle() as HANDLE,
            GetCurrentProcess(),
            &mut dup,
            0x0010_0000 | 0x0004, // SYNCHRONIZE | SECTION_MAP_READ
            0,
            0,
        )
    };
    assert_ne!(ok, 0, "DuplicateHandle: {}", io::Error::last_os_error());
    // SAFETY: `dup` is a new handle nothing else owns.
    let dup = unsafe { OwnedHandle::from_raw_handle(dup as RawHandle) };
    let cases = [
        (ptr::null_mut(), io::ErrorKind::InvalidInput),
        // Far past any handle this process has.
        (0x7fff_fff0usize as RawHandle, io::ErrorKind::InvalidInput),
        // A section has no signaled state.
        (dup.as_raw_handle(), io::ErrorKind::InvalidInput),
        // ... and is made without SYNCHRONIZE access.
        (mapping.as_raw_handle(), io::ErrorKind::PermissionDenied),
    ];
    for (h, kind) in cases {
        // SAFETY: the poller only checks the value (the check fails).
        let e = unsafe { p.register_waitable_raw(h, 0) }.unwrap_err();
        assert_eq!(e.kind(), kind, "{h:?}: {e}");
        assert!(e.to_string().contains("cannot be waited on"), "{e}");
    }
    assert!(p.is_empty());
}

#[test]
fn an_arm_with_another_interest_than_readable_is_invalid_input() {
    let p = Poller::new().unwrap();
    let ev = event(true);
    let t = p.register_waitable(&ev, 0).unwrap();
    for interest in [Interest::WRITABLE, Interest::BOTH] {
        let (r, s) = delta(&p, || p.arm(t, interest));
        let e = r.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{interest:?}: {e}");
        assert!(e.to_string().contains("READABLE"), "{e}");
        assert_eq!(s.ctl_calls, 0, "nothing was started");
    }
    // Nothing changed: a readable arm works.
    p.arm(t, Interest::READABLE).unwrap();
    // Re-arming an armed waitable with another interest is refused too, and the
    // wait in force stays.
    assert_eq!(
        p.arm(t, Interest::WRITABLE).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    set(&ev);
    assert_eq!(one(&p).token(), t);
    p.deregister(t).unwrap();
}

#[test]
fn registering_a_waitable_handle_again_supersedes() {
    // One handle value has one registration at a time, as for sockets.
    let p = Poller::new().unwrap();
    let ev = event(true);
    let old = p.register_waitable(&ev, 1).unwrap();
    p.arm(old, Interest::READABLE).unwrap();
    let new = p.register_waitable(&ev, 2).unwrap();
    assert_ne!(old, new);
    assert_not_found(p.arm(old, Interest::READABLE));
    p.arm(new, Interest::READABLE).unwrap();
    set(&ev);
    let e = one(&p);
    assert_eq!((e.token(), e.key()), (new, 2));
    p.deregister(new).unwrap();
    assert!(p.is_empty());
}

#[test]
fn dropping_a_poller_with_waits_armed_cancels_them() {
    for _ in 0..TRIALS {
        let p = Poller::new().unwrap();
        let evs: Vec<OwnedHandle> = (0..4).map(|_| event(true)).collect();
        for (i, ev) in evs.iter().enumerate() {
            let t = p.register_waitable(ev, i).unwrap();
            p.arm(t, Interest::READABLE).unwrap();
        }
        set(&evs[0]);
        drop(p); // unregisters every wait before the port closes
        for ev in &evs {
            set(ev);
        }
    }
}
