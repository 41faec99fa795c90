//! The Windows backend's waitable handles under misuse: handles closed while
//! armed or before the first arm, their numbers reused, signals racing a
//! deregister, re-arm storms, signals taken just before a disarm (kept for the
//! next arm), a poller dropped under armed auto-reset events,
//! many waits at once, and the duplicates the poller owns. Run under wine:
//!
//! ```text
//! bash .ci/wine.sh cargo test --target x86_64-pc-windows-gnu --features stats --test windows_break_waits
//! ```
//!
//! Timing never decides a pass (see `windows_break.rs`).
#![cfg(all(windows, feature = "stats"))]

mod windows_common;

use pollshot::{Events, Interest, Poller};
use std::io;
use std::os::windows::io::{AsRawHandle, AsRawSocket, FromRawHandle, OwnedHandle, RawHandle};
use std::ptr;
use std::sync::Arc;
use std::thread;
use std::time::Duration;
use windows_common::{
    delta, event, notify_and_see_nothing, on_cue, one, set, tcp_pair, until, until_waiters, LONG,
    TRIALS,
};
use windows_sys::Win32::Foundation::{HANDLE, WAIT_OBJECT_0, WAIT_TIMEOUT};
use windows_sys::Win32::System::Threading::{CreateEventW, WaitForSingleObject};

/// Whether `h` is signaled now (a zero-timeout wait: consumes an auto-reset
/// event's signal).
fn signaled(h: &OwnedHandle) -> bool {
    // SAFETY: `h` is an open handle; a zero timeout.
    match unsafe { WaitForSingleObject(h.as_raw_handle() as HANDLE, 0) } {
        WAIT_OBJECT_0 => true,
        WAIT_TIMEOUT => false,
        r => panic!("WaitForSingleObject: {r:#x} {}", io::Error::last_os_error()),
    }
}

/// A new manual-reset event named `name` (this process's own namespace).
fn named_event(name: &str) -> OwnedHandle {
    let wide: Vec<u16> = name.encode_utf16().chain([0]).collect();
    // SAFETY: no attributes; `wide` is a live NUL-terminated name; the handle
    // returned is ours.
    let h = unsafe { CreateEventW(ptr::null(), 1, 0, wide.as_ptr()) };
    assert!(!h.is_null(), "CreateEventW: {}", io::Error::last_os_error());
    // SAFETY: a new handle nothing else owns.
    unsafe { OwnedHandle::from_raw_handle(h as RawHandle) }
}

/// Whether an event named `name` still exists: some handle to it is open
/// (OpenEventW finds a named object only while it has a handle).
fn exists(name: &str) -> bool {
    use windows_sys::Win32::Foundation::CloseHandle;
    use windows_sys::Win32::System::Threading::{OpenEventW, SYNCHRONIZATION_SYNCHRONIZE};
    let wide: Vec<u16> = name.encode_utf16().chain([0]).collect();
    // SAFETY: `wide` is a live NUL-terminated name.
    let h = unsafe { OpenEventW(SYNCHRONIZATION_SYNCHRONIZE, 0, wide.as_ptr()) };
    if h.is_null() {
        return false;
    }
    // SAFETY: the handle just opened is ours.
    unsafe { CloseHandle(h) };
    true
}

/// Waits until the event named `name` is gone, failing after [`LONG`]: a
/// registration's duplicate is closed a second after the registration ends
/// (`wait.rs`, `retire`), so a leaked one fails here and a closed one passes,
/// however slow the machine.
fn until_gone(name: &str) {
    until(|| !exists(name), || format!("{name} still exists"));
}

#[test]
fn a_reused_event_number_never_gets_the_old_events_signal() {
    // A waitable's wait has fired (its packet is queued) when it is
    // deregistered and closed; a new event of the same value, registered and
    // armed but never set, must deliver nothing.
    let p = Poller::new().unwrap();
    let mut reused = 0;
    for trial in 0..TRIALS {
        let old_ev = event(true);
        let value = old_ev.as_raw_handle();
        let old = p.register_waitable(&old_ev, 1).unwrap();
        p.arm(old, Interest::READABLE).unwrap();
        set(&old_ev);
        p.deregister(old).unwrap();
        drop(old_ev);
        let new_ev = event(true);
        if new_ev.as_raw_handle() != value {
            notify_and_see_nothing(&p);
            continue;
        }
        reused += 1;
        let new = p.register_waitable(&new_ev, 2).unwrap();
        assert_eq!(new.index(), old.index(), "trial {trial}");
        p.arm(new, Interest::READABLE).unwrap();
        notify_and_see_nothing(&p);
        set(&new_ev);
        let e = one(&p);
        assert_eq!((e.token(), e.key()), (new, 2), "trial {trial}");
        p.deregister(new).unwrap();
    }
    assert!(reused > 0, "no trial reused the number");
}

#[test]
fn an_event_closed_while_armed_leaves_no_wait_on_its_number() {
    // The caller closes an armed event without a deregister (safe code:
    // `register_waitable` only borrows it), and the number comes back as an
    // auto-reset event the poller was never given. The poller's wait must
    // not consume that event's signals: it waits on a handle of its own, not
    // on the number.
    let p = Poller::new().unwrap();
    let mut reused = 0;
    for trial in 0..TRIALS {
        let old_ev = event(true);
        let value = old_ev.as_raw_handle();
        let old = p.register_waitable(&old_ev, 1).unwrap();
        p.arm(old, Interest::READABLE).unwrap();
        drop(old_ev);
        let other = event(false);
        if other.as_raw_handle() == value {
            reused += 1;
        }
        for round in 0..3 {
            set(&other);
            // Give a wait on the number every chance to take the signal: the
            // pool's thread runs within this deliver's timeout.
            let mut events = Events::with_capacity(8);
            p.deliver(&mut events, Some(Duration::from_millis(20)))
                .unwrap();
            assert!(events.is_empty(), "trial {trial}: {events:?}");
            assert!(
                signaled(&other),
                "trial {trial} round {round}: signal taken"
            );
        }
        p.deregister(old).unwrap();
        notify_and_see_nothing(&p);
    }
    assert!(reused > 0, "no trial reused the number");
}

#[test]
fn a_set_racing_deregister_with_a_blocked_deliver() {
    // The waitable side: a thread blocked in deliver, the event set while
    // another thread deregisters. After both, no event of it comes.
    let p = Arc::new(Poller::new().unwrap());
    for trial in 0..TRIALS {
        let ev = Arc::new(event(true));
        let t = p.register_waitable(&*ev, trial).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        let waiter = {
            let p = Arc::clone(&p);
            thread::spawn(move || {
                let mut events = Events::with_capacity(8);
                p.deliver(&mut events, LONG).unwrap();
                events.iter().map(|e| e.token()).collect::<Vec<_>>()
            })
        };
        until_waiters(&p, 1);
        let (go, setter) = {
            let ev = Arc::clone(&ev);
            on_cue(move || set(&ev))
        };
        go.wait();
        p.deregister(t).unwrap();
        setter.join().unwrap();
        drop(ev);
        p.notify().unwrap();
        let got = waiter.join().unwrap();
        assert!(got.len() <= 1 && got.iter().all(|&x| x == t), "{got:?}");
        if !got.is_empty() {
            notify_and_see_nothing(&p);
        }
        notify_and_see_nothing(&p);
    }
}

#[test]
fn waitable_rearm_storm_delivers_once_per_arming() {
    // A manual-reset event stays set: every arming fires; a re-arm before its
    // packet is dequeued drops the old one as stale. Each disarm races the
    // pool's callback of that arming (on wine 8.0, when the callback ran in the
    // wait thread and a disarm unregistered the wait, about 1 run in 5 crashed:
    // see `backends/windows/wait.rs`), so the scenario is repeated.
    const ROUNDS: usize = 300;
    for trial in 0..TRIALS {
        let p = Poller::new().unwrap();
        let ev = event(true);
        set(&ev);
        let t = p.register_waitable(&ev, 9).unwrap();
        let before = p.stats();
        for _ in 0..ROUNDS {
            p.arm(t, Interest::READABLE).unwrap();
            p.disarm(t).unwrap();
        }
        p.arm(t, Interest::READABLE).unwrap();
        let e = one(&p);
        assert_eq!((e.token(), e.key()), (t, 9), "trial {trial}");
        notify_and_see_nothing(&p);
        let s = p.stats().since(&before);
        assert!(s.stale <= ROUNDS as u64, "trial {trial}: {s:?}");
        p.deregister(t).unwrap();
        notify_and_see_nothing(&p);
    }
}

#[test]
fn a_poller_dropped_under_armed_auto_reset_events_leaves_their_signals() {
    // After the drop no wait of it is left in the thread pool: a signal set
    // afterwards is still there for its owner (an auto-reset event's would be
    // consumed by a leftover wait), and no callback posts to a closed port.
    for trial in 0..TRIALS {
        let p = Poller::new().unwrap();
        let evs: Vec<OwnedHandle> = (0..4).map(|_| event(false)).collect();
        let (_a, b) = tcp_pair();
        let ts = p.register(&b).unwrap();
        p.arm(ts, Interest::READABLE).unwrap();
        for (i, ev) in evs.iter().enumerate() {
            let t = p.register_waitable(ev, i).unwrap();
            p.arm(t, Interest::READABLE).unwrap();
        }
        drop(p);
        for ev in &evs {
            set(ev);
        }
        for (i, ev) in evs.iter().enumerate() {
            assert!(signaled(ev), "trial {trial}: event {i}'s signal taken");
        }
    }
}

#[test]
fn a_socket_is_not_a_waitable_handle() {
    // A socket handle can be waited on (a file object), but what signals it is
    // no readiness the caller can use: `register` is for sockets.
    let p = Poller::new().unwrap();
    let (_a, b) = tcp_pair();
    let h = b.as_raw_socket() as RawHandle;
    // SAFETY: `b` is open for the call.
    let e = unsafe { p.register_waitable_raw(h, 0) }.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("socket"), "{e}");
    assert!(p.is_empty());
}

#[test]
fn two_hundred_armed_events_all_fire() {
    // More waits than one wait thread of the pool serves (wine: 63 per
    // bucket, MAXIMUM_WAIT_OBJECTS less one).
    const N: usize = 200;
    let p = Poller::new().unwrap();
    let evs: Vec<OwnedHandle> = (0..N).map(|_| event(false)).collect();
    let ts: Vec<_> = evs
        .iter()
        .enumerate()
        .map(|(i, ev)| {
            let t = p.register_waitable(ev, i).unwrap();
            p.arm(t, Interest::READABLE).unwrap();
            t
        })
        .collect();
    for ev in evs.iter().rev() {
        set(ev);
    }
    let mut seen = vec![0; N];
    let mut events = Events::with_capacity(64);
    while seen.iter().sum::<usize>() < N {
        p.deliver(&mut events, LONG).unwrap();
        for e in events.iter() {
            assert_eq!(e.token(), ts[e.key()]);
            seen[e.key()] += 1;
        }
    }
    assert!(seen.iter().all(|&n| n == 1));
    // Each auto-reset event's signal was consumed by its one wait.
    assert!(evs.iter().all(|ev| !signaled(ev)));
    notify_and_see_nothing(&p);
}

#[test]
fn a_waitable_closed_before_its_first_arm_is_invalid_input_at_the_arm() {
    // Only the first arm duplicates the handle: closed by then, the arm fails
    // with a clear error and the registration stays, unarmed. (Another test's
    // thread may take the freed number first; the arm then duplicates that
    // handle, which is the documented reuse, so such a trial only deregisters.)
    let p = Poller::new().unwrap();
    let mut refused = 0;
    for trial in 0..TRIALS {
        let ev = event(true);
        let t = p.register_waitable(&ev, trial).unwrap();
        drop(ev);
        let (r, s) = delta(&p, || p.arm(t, Interest::READABLE));
        if let Err(e) = r {
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            assert!(e.to_string().contains("is closed"), "{e}");
            assert_eq!(s.ctl_calls, 1, "the DuplicateHandle only: {s:?}");
            assert_eq!(p.len(), 1);
            refused += 1;
        }
        p.deregister(t).unwrap();
        assert!(p.is_empty());
    }
    assert!(refused > 0);
    notify_and_see_nothing(&p);
}

#[test]
fn a_pseudo_handle_is_past_the_table() {
    use windows_sys::Win32::System::Threading::{GetCurrentProcess, GetCurrentThread};
    let p = Poller::new().unwrap();
    // SAFETY: pseudo-handles are always valid in their process/thread.
    for h in unsafe { [GetCurrentProcess(), GetCurrentThread()] } {
        // SAFETY: as above; the poller refuses the value.
        let e = unsafe { p.register_waitable_raw(h as RawHandle, 0) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }
    assert!(p.is_empty());
}

#[test]
fn waitable_registrations_close_every_duplicate_they_make() {
    // The poller's duplicate keeps the object alive until the registration
    // ends, and is closed after it: once the caller's handle is closed too,
    // the named object is gone (a leaked duplicate would keep it).
    let p = Poller::new().unwrap();
    let tag = std::process::id();
    // Objects whose registration has ended, each checked gone after the loop
    // (a duplicate is closed a second after its registration ends).
    let mut ended = Vec::new();
    for trial in 0..TRIALS {
        let name = |case: &str| format!("pollshot-break-{tag}-{trial}-{case}");
        // Armed, fired, re-armed, deregistered, then closed.
        let n = name("deregistered");
        let ev = named_event(&n);
        let t = p.register_waitable(&ev, 1).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        set(&ev);
        assert_eq!(one(&p).token(), t);
        p.arm(t, Interest::READABLE).unwrap();
        p.deregister(t).unwrap();
        drop(ev);
        ended.push(n);
        // Closed while armed: alive through the duplicate until deregister.
        let n = name("closed-armed");
        let ev = named_event(&n);
        let t = p.register_waitable(&ev, 2).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        drop(ev);
        assert!(exists(&n), "trial {trial}: the duplicate keeps {n}");
        p.deregister(t).unwrap();
        ended.push(n);
        // Superseded by a registration of the same handle, armed both times.
        let n = name("superseded");
        let ev = named_event(&n);
        let t = p.register_waitable(&ev, 3).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        let t2 = p.register_waitable(&ev, 4).unwrap();
        p.arm(t2, Interest::READABLE).unwrap();
        p.deregister(t2).unwrap();
        drop(ev);
        ended.push(n);
    }
    for n in &ended {
        until_gone(n);
    }
    // The poller's drop closes what its armed registrations held.
    let names: Vec<String> = (0..8)
        .map(|i| format!("pollshot-break-{tag}-drop-{i}"))
        .collect();
    // All open at once (a handle closed at once would give its number to the
    // next, superseding the registration).
    let evs: Vec<OwnedHandle> = names.iter().map(|n| named_event(n)).collect();
    for (i, ev) in evs.iter().enumerate() {
        let t = p.register_waitable(ev, i).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
    }
    drop(evs);
    assert!(names.iter().all(|n| exists(n)));
    drop(p);
    for n in &names {
        until_gone(n);
    }
}

#[test]
fn a_child_whose_handle_is_dropped_while_armed_still_reports_its_exit() {
    // `Child`'s drop closes its process handle: the poller's wait is on its
    // own duplicate, so the exit is still one event.
    let p = Poller::new().unwrap();
    for trial in 0..4 {
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--list", "--exact", "no-such-test"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let t = p.register_waitable(&child, trial).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        drop(child);
        let e = one(&p);
        assert_eq!((e.token(), e.key()), (t, trial));
        p.deregister(t).unwrap();
    }
}

#[test]
fn a_handle_with_synchronize_access_only_is_enough() {
    use windows_sys::Win32::Foundation::DuplicateHandle;
    use windows_sys::Win32::System::Threading::{GetCurrentProcess, SYNCHRONIZATION_SYNCHRONIZE};
    let p = Poller::new().unwrap();
    let ev = event(true);
    let mut h: HANDLE = ptr::null_mut();
    // SAFETY: this process's pseudo-handle twice; `h` is a live out-parameter;
    // the handle made is ours.
    let ok = unsafe {
        DuplicateHandle(
            GetCurrentProcess(),
            ev.as_raw_handle() as HANDLE,
            GetCurrentProcess(),
            &mut h,
            SYNCHRONIZATION_SYNCHRONIZE,
            0,
            0,
        )
    };
    assert_ne!(ok, 0, "DuplicateHandle: {}", io::Error::last_os_error());
    // SAFETY: a new handle nothing else owns.
    let sync_only = unsafe { OwnedHandle::from_raw_handle(h as RawHandle) };
    let t = p.register_waitable(&sync_only, 5).unwrap();
    let (_, s) = delta(&p, || p.arm(t, Interest::READABLE).unwrap());
    assert_eq!(
        s.ctl_calls, 2,
        "DuplicateHandle, RegisterWaitForSingleObject"
    );
    drop(sync_only);
    set(&ev);
    assert_eq!(one(&p).key(), 5);
    p.deregister(t).unwrap();
}

/// A semaphore with `count` counts and room for as many.
fn semaphore(count: i32) -> OwnedHandle {
    use windows_sys::Win32::System::Threading::CreateSemaphoreW;
    // SAFETY: no attributes, no name: a new unnamed semaphore.
    let h = unsafe { CreateSemaphoreW(ptr::null(), count, count.max(1), ptr::null()) };
    assert!(
        !h.is_null(),
        "CreateSemaphoreW: {}",
        io::Error::last_os_error()
    );
    // SAFETY: `h` is a new handle, owned by the value returned.
    unsafe { OwnedHandle::from_raw_handle(h as RawHandle) }
}

/// Arms `t` and takes the one event that must come (`one`: a deliver with a
/// 20 s timeout, so a lost signal fails here, never a slow pool thread).
fn arm_and_take(p: &Poller, t: pollshot::Token, what: &str) {
    p.arm(t, Interest::READABLE).unwrap();
    assert_eq!(one(p).token(), t, "{what}");
}

#[test]
fn a_disarm_after_the_wait_took_a_semaphore_count_keeps_it_for_the_next_arm() {
    // Each satisfied wait decrements the semaphore; a disarm after that makes
    // its packet stale, and the count would be gone unreported. Every count
    // must come out as exactly one event.
    const COUNT: i32 = 50;
    const ROUNDS: usize = 200;
    for trial in 0..TRIALS {
        let p = Poller::new().unwrap();
        let sem = semaphore(COUNT);
        let t = p.register_waitable(&sem, 1).unwrap();
        for _ in 0..ROUNDS {
            p.arm(t, Interest::READABLE).unwrap();
            p.disarm(t).unwrap();
        }
        for k in 0..COUNT {
            arm_and_take(&p, t, &format!("trial {trial}, count {k}"));
        }
        // Every count reported: the semaphore is empty, and one more arming
        // reports nothing.
        p.arm(t, Interest::READABLE).unwrap();
        notify_and_see_nothing(&p);
        p.deregister(t).unwrap();
        assert!(
            !signaled(&sem),
            "trial {trial}: counts left after {COUNT} events"
        );
    }
}

#[test]
fn a_disarm_after_the_wait_took_an_auto_reset_signal_keeps_it_for_the_next_arm() {
    // Set, armed, disarmed at once or after the pool's wait has (very likely)
    // fired: the next arm reports the signal, wherever it is (still in the
    // event, or taken and kept), exactly once.
    for trial in 0..TRIALS * 5 {
        let p = Poller::new().unwrap();
        let ev = event(false);
        let t = p.register_waitable(&ev, 3).unwrap();
        set(&ev);
        p.arm(t, Interest::READABLE).unwrap();
        if trial % 2 == 1 {
            thread::sleep(Duration::from_millis(5));
        }
        p.disarm(t).unwrap();
        arm_and_take(&p, t, &format!("trial {trial}"));
        p.arm(t, Interest::READABLE).unwrap();
        notify_and_see_nothing(&p);
        assert!(!signaled(&ev), "trial {trial}: reported, and left set");
        p.deregister(t).unwrap();
    }
}

#[test]
fn fresh_events_registered_and_deregistered_on_four_threads_lose_no_signal() {
    // Wine's pool thread waits on handle values it copied before a deregister:
    // a duplicate closed at once gives its value to the next event made, and
    // that wait then takes the new event's signal for a wait that is gone
    // (`wait.rs`, `retire`). Each of 4 threads makes, sets, registers, arms,
    // delivers and deregisters a fresh event, 500 times: every signal must
    // come out as its event. (Rare to catch: the old close at once lost 1 of
    // 16,000 under CPU load.)
    const ROUNDS: usize = 500;
    let threads: Vec<_> = (0..4)
        .map(|id| {
            thread::spawn(move || {
                let p = Poller::new().unwrap();
                for round in 0..ROUNDS {
                    let ev = event(false);
                    let t = p.register_waitable(&ev, round).unwrap();
                    set(&ev);
                    arm_and_take(&p, t, &format!("thread {id}, round {round}"));
                    // Armed again on the now unsignaled event, so the
                    // deregister unregisters a wait still waiting.
                    p.arm(t, Interest::READABLE).unwrap();
                    p.deregister(t).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
