//! One test (or more) per scenario of `docs/cases.md`, named after its id.
//! Each asserts the row's "expected" column on real descriptors, on every backend
//! the suite is instantiated for. Where a backend documents a different path to the
//! same observable outcome (the poll(2) backend keeps no kernel state), the body
//! branches on `B::NAME` and says why.
//!
//! Closing a registered number and reusing it is done atomically with dup2(2)
//! (`reuse_number`) or in a number range of the test's own (`high_dup`), so tests
//! running in parallel threads never take each other's descriptors.

use super::*;
use pollshot::Interest;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// P01: one deliver fetched events for A and B; while handling A, B is
/// deregistered, closed, and its number reused by a new registration. The event
/// fetched for B never names the new registration, and the new one sees only its
/// own readiness.
pub fn case_p01_fetched_event_never_names_new_registration<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (a0, a1) = D::socketpair();
    let (b0, mut b1) = D::socketpair();
    let ta = a1.register(&p).unwrap();
    let tb = b1.register(&p).unwrap();
    p.arm(ta, Interest::READABLE).unwrap();
    p.arm(tb, Interest::READABLE).unwrap();
    a0.write_all(b"a");
    b0.write_all(b"b");
    let fetched = expect_events(&p, &[ta, tb]);
    let event_b = fetched[1];
    // Handling A: deregister B, close it and reuse its number for a new socket.
    p.deregister(tb).unwrap();
    let (c0, c1) = D::socketpair();
    c1.dup_onto(&mut b1);
    drop(c1);
    let tn = b1.register(&p).unwrap();
    p.arm(tn, Interest::READABLE).unwrap();
    assert_ne!(
        tn, tb,
        "a new registration in a reused slot has a new token"
    );
    // Now the event fetched for B.
    assert_eq!(event_b.token(), tb);
    assert_ne!(
        event_b.token(),
        tn,
        "the stale event names the new registration"
    );
    assert_eq!(
        err_kind(p.arm(event_b.token(), Interest::READABLE)),
        io::ErrorKind::NotFound
    );
    assert_eq!(err_kind(p.disarm(event_b.token())), io::ErrorKind::NotFound);
    // The new registration sees only its own readiness: nothing yet, then its own.
    let _ = b0.write(b"to the old socket"); // EPIPE: its peer is gone
    assert_no_events(&p, 5, Duration::from_millis(2));
    c0.write_all(b"c");
    let ev = expect_one(&p, tn);
    assert!(ev.is_readable());
    let mut buf = [0u8; 8];
    assert_eq!(b1.read_some(&mut buf), 1);
    assert_eq!(buf[0], b'c');
    drop(a1);
}

/// P02: pipe read end N registered and armed; its description stays open elsewhere
/// (a dup); N is closed without deregistering and reused by a new pipe, which is
/// registered (superseding the old registration). Writing to the old pipe wakes
/// nothing: 100 delivers with 1 ms timeouts return no event, and the orphaned kernel
/// entry fires at most once.
pub fn case_p02_orphaned_pipe_does_not_wake_new_registration<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (r_old, w_old) = D::pipe();
    let mut n = r_old;
    let t_old = n.register(&p).unwrap();
    p.arm(t_old, Interest::READABLE).unwrap();
    let elsewhere = n.dup();
    let (r_new, w_new) = D::pipe();
    r_new.dup_onto(&mut n);
    drop(r_new);
    let t_new = n.register(&p).unwrap();
    assert_ne!(t_new, t_old);
    assert_eq!(
        err_kind(p.arm(t_old, Interest::READABLE)),
        io::ErrorKind::NotFound,
        "superseded"
    );
    p.arm(t_new, Interest::READABLE).unwrap();
    if on_libkqueue::<B>() {
        // The old pipe must not become ready now that its knote is deleted
        // (`on_libkqueue`): the new registration works.
        w_new.write_all(b"new");
        assert!(expect_one(&p, t_new).is_readable());
        drop(elsewhere);
        return;
    }
    #[cfg(feature = "stats")]
    let before = p.stats();
    for _ in 0..3 {
        w_old.write_all(b"old");
    }
    let got = deliver_n(&p, 100, Duration::from_millis(1));
    assert!(got.is_empty(), "the old pipe woke a registration: {got:?}");
    #[cfg(feature = "stats")]
    {
        let s = p.stats().since(&before);
        assert!(
            s.stale <= 1,
            "the orphaned entry fired more than once: {s:?}"
        );
        if B::NAME == "epoll" {
            // The orphan's entry outlived the close (the dup holds the
            // description) and fired once with its old tag.
            assert_eq!(s.stale, 1, "{s:?}");
        }
    }
    w_new.write_all(b"new");
    assert!(expect_one(&p, t_new).is_readable());
    assert_no_events(&p, 3, Duration::from_millis(1));
    drop(elsewhere);
}

/// P03: socket S registered and armed, dup'd to D, closed without deregistering;
/// D made readable again and again. No live registration gets an event for it, the
/// orphan's own registration at most one (its one arming), deregistering the closed
/// S is Ok, and nothing spins.
pub fn case_p03_dup_outlives_close_no_spin<B: Backend, D: Fd>() {
    // S's own number, which no socket made meanwhile (here or in a test running
    // in parallel) takes, so `ts` is never superseded.
    let min_fd = D::HIGH + 300; // this test's own range, see `Fd::HIGH`
    let p = poller::<B>();
    let (peer, s) = D::socketpair();
    let s = s.dup_at_least(min_fd);
    let ts = s.register(&p).unwrap();
    p.arm(ts, Interest::READABLE).unwrap();
    let d = s.dup();
    drop(s);
    let (xa, xb) = D::socketpair();
    let tx = xb.register(&p).unwrap();
    p.arm(tx, Interest::READABLE).unwrap();
    if on_libkqueue::<B>() {
        // The orphan must not become ready (`on_libkqueue`: its knote's report
        // would disable it through the closed number, and libkqueue frees its
        // state then): the other registration works, the deregistration is Ok.
        xa.write_all(b"x");
        assert!(expect_one(&p, tx).is_readable());
        p.deregister(ts)
            .expect("deregistering a closed descriptor is Ok");
        drop(d);
        return;
    }
    #[cfg(feature = "stats")]
    let before = p.stats();
    let mut got = Vec::new();
    for _ in 0..10 {
        peer.write_all(b"d");
        got.extend(deliver_n(&p, 10, Duration::from_millis(1)));
    }
    assert!(
        got.iter().all(|e| e.token() == ts),
        "only the orphan's own registration may fire: {got:?}"
    );
    assert!(
        got.len() <= 1,
        "more than one event for one arming: {got:?}"
    );
    p.deregister(ts)
        .expect("deregistering a closed descriptor is Ok");
    for _ in 0..10 {
        peer.write_all(b"d");
    }
    assert_no_events(&p, 20, Duration::from_millis(1));
    #[cfg(feature = "stats")]
    {
        let s = p.stats().since(&before);
        assert!(s.stale <= 1, "{s:?}");
    }
    xa.write_all(b"x");
    assert!(expect_one(&p, tx).is_readable());
    drop(d);
}

/// P04, the EEXIST path: X = dup(A) registered and armed, closed, deregistered (Ok:
/// already gone); the kernel's entry survives (A holds the description). dup(A)
/// again gets X's number: registering and arming it succeed (epoll: ADD answers
/// EEXIST and becomes MOD with a new generation), its readiness is delivered once,
/// and the old tag never.
pub fn case_p04_dup_outlives_close_exists_becomes_modify<B: Backend, D: Fd>() {
    let min_fd = D::HIGH + 100; // this test's own range, see `Fd::HIGH`
    let p = poller::<B>();
    let (a, peer) = D::socketpair();
    let x = a.dup_at_least(min_fd);
    let n = x.raw();
    let t_old = x.register(&p).unwrap();
    p.arm(t_old, Interest::READABLE).unwrap();
    drop(x);
    p.deregister(t_old)
        .expect("deregistering a closed descriptor is Ok");
    if on_libkqueue::<B>() {
        // `a` keeps the description of the closed number, whose knote is now
        // deleted: it must not become ready (`on_libkqueue`).
        return;
    }
    peer.write_all(b"p"); // the old entry may fire: stale
    assert_no_events(&p, 5, Duration::from_millis(2));
    let x = a.dup_at_least(n);
    assert_eq!(x.raw(), n, "the number was free");
    let t_new = x.register(&p).unwrap();
    assert_ne!(t_new, t_old);
    #[cfg(feature = "stats")]
    let before = p.stats();
    p.arm(t_new, Interest::READABLE)
        .expect("EEXIST is not an error");
    #[cfg(feature = "stats")]
    {
        let s = p.stats().since(&before);
        if B::NAME == "epoll" {
            assert_eq!(
                (s.adds, s.modifies, s.exists_to_modify),
                (1, 1, 1),
                "ADD, EEXIST, MOD: {s:?}"
            );
        }
    }
    let ev = expect_one(&p, t_new);
    assert!(ev.is_readable());
    assert_no_events(&p, 5, Duration::from_millis(1));
    p.deregister(t_new).unwrap();
}

/// P04, registering a number that is already registered (here the same
/// description again): the new registration supersedes the old one, whose token
/// is `NotFound` from then on; the new one is delivered once, the old never.
pub fn case_p04_same_number_registered_twice_supersedes<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (a, peer) = D::socketpair();
    let mut x = a.dup();
    let t_old = x.register(&p).unwrap();
    p.arm(t_old, Interest::READABLE).unwrap();
    a.dup_onto(&mut x); // close X and dup A onto its number at once
    let t_new = x.register(&p).unwrap();
    assert_ne!(t_new, t_old);
    assert_eq!(p.len(), 1, "one registration per number");
    assert_eq!(
        err_kind(p.arm(t_old, Interest::READABLE)),
        io::ErrorKind::NotFound
    );
    assert_eq!(err_kind(p.deregister(t_old)), io::ErrorKind::NotFound);
    p.arm(t_new, Interest::READABLE).unwrap();
    peer.write_all(b"p");
    assert_eq!(expect_one(&p, t_new).token(), t_new);
    assert_no_events(&p, 5, Duration::from_millis(1));
}

/// P05: a registration fired, its descriptor closed and the number reused; arming
/// the old registration again re-adds the new descriptor (epoll: MOD answers ENOENT
/// and becomes ADD) and its readiness is delivered.
pub fn case_p05_reused_number_rearm_becomes_add<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (a, mut b) = D::socketpair();
    let t = b.register(&p).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    a.write_all(b"a");
    expect_one(&p, t);
    let (c, d) = D::socketpair();
    d.dup_onto(&mut b); // the old socket's last reference closes
    drop(d);
    #[cfg(feature = "stats")]
    let before = p.stats();
    p.arm(t, Interest::READABLE).unwrap();
    #[cfg(feature = "stats")]
    {
        let s = p.stats().since(&before);
        if B::NAME == "epoll" {
            assert_eq!(
                (s.modifies, s.adds, s.not_found_to_add),
                (1, 1, 1),
                "MOD, ENOENT, ADD: {s:?}"
            );
        }
    }
    assert_no_events(&p, 3, Duration::from_millis(2));
    c.write_all(b"c");
    assert!(expect_one(&p, t).is_readable());
    let mut buf = [0u8; 4];
    assert_eq!(b.read_some(&mut buf), 1);
    assert_eq!(buf[0], b'c');
}

/// Exit codes of the P06 child, for the parent's message.
fn p06_meaning(code: i32) -> &'static str {
    match code {
        10..=15 => "a method did not fail with ErrorKind::Other before reinit_after_fork",
        20 => "reinit_after_fork failed",
        30 => "write in the child failed",
        31 => "the armed registration did not fire in the child after reinit",
        32 => "an event for the wrong registration in the child",
        33 => "deliver failed in the child after reinit",
        99 => "the child panicked",
        _ => "unknown",
    }
}

/// The P06 child's checks; returns an exit code (0: all good). Never panics on
/// purpose: a failed check is a code.
fn p06_child<B: Backend>(
    p: &mut Poller<B>,
    armed: Token,
    idle: Token,
    a: &UnixStream,
    b: &UnixStream,
) -> i32 {
    fn other<T>(r: io::Result<T>) -> bool {
        matches!(r, Err(e) if e.kind() == io::ErrorKind::Other)
    }
    let mut events = Events::with_capacity(8);
    if !other(p.register(b)) {
        return 10;
    }
    if !other(p.arm(armed, Interest::READABLE)) {
        return 11;
    }
    if !other(p.disarm(armed)) {
        return 12;
    }
    if !other(p.deliver(&mut events, Some(Duration::ZERO))) {
        return 13;
    }
    if !other(p.notify()) {
        return 14;
    }
    if !other(p.deregister(idle)) {
        return 15;
    }
    if p.reinit_after_fork().is_err() {
        return 20;
    }
    if (&*a).write_all(b"c").is_err() {
        return 30;
    }
    let deadline = Instant::now() + LOST_AFTER;
    while Instant::now() < deadline {
        match p.deliver(&mut events, Some(Duration::from_millis(50))) {
            Err(_) => return 33,
            Ok(_) => {
                if let Some(ev) = events.iter().next() {
                    return if ev.token() == armed { 0 } else { 32 };
                }
            }
        }
    }
    31
}

/// P06: fork with armed registrations. In the child every method fails with
/// `ErrorKind::Other` until `reinit_after_fork`, after which an armed registration
/// fires in the child. The parent's registrations are untouched: the armed one
/// still fires (once), the idle one stays quiet.
pub fn case_p06_fork_child_reinit_parent_untouched<B: Backend>() {
    let alone = forking(); // the child holds every descriptor of the process
    let mut p = poller::<B>();
    let (a, b) = socketpair();
    let (mut c, d) = socketpair();
    let armed = p.register(&b).unwrap();
    let idle = p.register(&d).unwrap();
    p.arm(armed, Interest::READABLE).unwrap();
    p.arm(idle, Interest::READABLE).unwrap();
    p.disarm(idle).unwrap();
    // SAFETY: fork(2) from a multi-threaded test process. The child only runs
    // `p06_child` on objects this thread owns (the poller's locks are free: no
    // other thread has it), allocates through glibc's malloc (which fork(2) leaves
    // usable), and leaves with _exit(2), running no destructor or atexit handler.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p06_child(&mut p, armed, idle, &a, &b)
        }))
        .unwrap_or(99);
        // SAFETY: _exit(2) ends the child at once; nothing of the parent's is touched.
        unsafe { libc::_exit(code) };
    }
    let status = wait_child(pid);
    drop(alone);
    assert!(
        libc::WIFEXITED(status),
        "the child did not exit normally (status {status:#x})"
    );
    let code = libc::WEXITSTATUS(status);
    assert_eq!(code, 0, "child: {}", p06_meaning(code));
    // The parent: the child's byte made `b` readable; the parent's arming is intact.
    let ev = expect_one(&p, armed);
    assert!(ev.is_readable());
    c.write_all(b"d").unwrap();
    assert_no_events(&p, 5, Duration::from_millis(2)); // `idle` stays idle
    p.arm(idle, Interest::READABLE).unwrap();
    assert!(expect_one(&p, idle).is_readable());
    p.reinit_after_fork().unwrap(); // a no-op in the process that made it
    p.arm(armed, Interest::READABLE).unwrap();
    assert!(expect_one(&p, armed).is_readable());
}

/// P06, the child that leaves: a child forked from a thread that used the poller
/// (on io_uring, one that submitted to the ring) exits normally with `exit(3)`,
/// which runs that thread's thread-local destructors, without touching the
/// poller. It must exit 0 (io_uring's exiting-thread hook once touched the
/// parent's ring there, unmapped in the child: SIGSEGV), and the parent's arming
/// still fires once. 20 trials.
pub fn case_p06_fork_child_exit_leaves_the_poller_alone<B: Backend>() {
    let _alone = forking(); // each child holds every descriptor of the process
    for trial in 0..super::wakeups::TRIALS {
        let p = poller::<B>();
        let (mut a, b) = socketpair();
        let t = p.register(&b).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        let mut events = Events::with_capacity(4);
        // A wait from this thread (io_uring: it submits the arm).
        assert_eq!(p.deliver(&mut events, Some(Duration::ZERO)).unwrap(), 0);
        // SAFETY: fork(2) from a multi-threaded test process; the child touches
        // nothing of the poller and leaves with exit(3) (the point of the test).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: exit(3) runs atexit handlers and this thread's TLS
            // destructors, as a child that returns from its work would.
            unsafe { libc::exit(0) };
        }
        let status = wait_child(pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "trial {trial}: the child did not exit 0 (status {status:#x}, signal {})",
            if libc::WIFSIGNALED(status) {
                libc::WTERMSIG(status)
            } else {
                0
            }
        );
        a.write_all(b"p").unwrap();
        assert!(expect_one(&p, t).is_readable(), "trial {trial}");
        assert_no_events(&p, 2, Duration::from_millis(2));
    }
}

/// P07: another component closed a registered descriptor (number free) while it
/// was armed. Nothing is reported for it; the next arm and disarm that reach the
/// kernel fail with the kernel's EBADF (`raw_os_error`), deregister is Ok, and
/// nothing panics. The same on every backend (see `Event`'s docs): epoll drops a
/// closed descriptor from its set, the poll(2) backend drops one that poll(2)
/// answers `POLLNVAL` for.
pub fn case_p07_closed_fd_arm_disarm_deregister<B: Backend, D: Fd>() {
    let min_fd = D::HIGH + 200; // this test's own range, see `Fd::HIGH`
    let p = poller::<B>();
    let x = {
        let (_a, b) = D::socketpair();
        b.dup_at_least(min_fd) // the only reference once `b` drops
    };
    let t = x.register(&p).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    drop(x);
    if cfg!(pollshot_libkqueue) && B::NAME == "kqueue" {
        // libkqueue keeps a closed number's knote (a BSD kernel drops it at close,
        // see docs/design.md), so whether the re-arm is refused at once (EBADF) or rides
        // on the next wait and comes back as one error event depends on timing.
        // Either way the refusal is reported once, never lost.
        match p.arm(t, Interest::WRITABLE) {
            Ok(()) => assert!(expect_one(&p, t).is_error()),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}"),
        }
        assert_no_events(&p, 3, Duration::from_millis(1));
        let disarmed = p.disarm(t);
        assert!(disarmed.is_ok() || err_errno(disarmed) == libc::EBADF);
    } else {
        // Closed while armed: never reported.
        assert_no_events(&p, 3, Duration::from_millis(1));
        // The re-arm reaches the kernel (or, on poll(2), finds the entry dropped
        // and re-adds it): EBADF, the registration unchanged.
        assert_eq!(err_errno(p.arm(t, Interest::WRITABLE)), libc::EBADF);
        let disarmed = p.disarm(t);
        if B::NAME == "kqueue" {
            // A BSD kernel dropped the knotes at close: EBADF or ENOENT (then Ok).
            assert!(disarmed.is_ok() || err_errno(disarmed) == libc::EBADF);
        } else {
            assert_eq!(err_errno(disarmed), libc::EBADF);
        }
        p.disarm(t).unwrap(); // nothing armed any more
        assert_eq!(err_errno(p.arm(t, Interest::READABLE)), libc::EBADF);
        assert_no_events(&p, 3, Duration::from_millis(1));
    }
    p.deregister(t)
        .expect("deregistering a closed descriptor is Ok");
    assert_eq!(err_kind(p.deregister(t)), io::ErrorKind::NotFound);
    assert!(p.is_empty());
}

/// P07 with the number reused: arm re-adds (epoll: ENOENT becomes ADD) and
/// deregister deletes; deregistering a reused number that was never re-armed is Ok
/// too and leaves the new descriptor alone.
pub fn case_p07_reused_number_arm_and_deregister<B: Backend, D: Fd>() {
    let p = poller::<B>();
    // Re-armed after the reuse.
    let (_a, b) = D::socketpair();
    let mut x = b;
    let t = x.register(&p).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let (c, d) = D::socketpair();
    d.dup_onto(&mut x);
    drop(d);
    p.arm(t, Interest::BOTH).unwrap();
    assert!(expect_one(&p, t).is_writable());
    p.deregister(t).unwrap();
    c.write_all(b"c");
    assert_no_events(&p, 3, Duration::from_millis(1));
    // Deregistered straight after the reuse (DEL: ENOENT, already gone).
    let (_e, f) = D::socketpair();
    let mut y = f;
    let u = y.register(&p).unwrap();
    p.arm(u, Interest::READABLE).unwrap();
    let (g, h) = D::socketpair();
    h.dup_onto(&mut y);
    drop(h);
    p.deregister(u).unwrap();
    assert!(p.is_empty());
    g.write_all(b"g");
    assert_no_events(&p, 3, Duration::from_millis(1));
    // The new descriptor registers afresh.
    let v = y.register(&p).unwrap();
    p.arm(v, Interest::READABLE).unwrap();
    assert!(expect_one(&p, v).is_readable());
}

/// P08: a "stdin" redirected from a regular file, `/dev/null` and a temp file,
/// armed readable and writable: no error, one event per arming (always ready), and
/// on epoll EPERM is remembered (`not_pollable`) and no DEL is issued for an fd that
/// was never added.
pub fn case_p08_regular_file_dev_null_stdin_always_ready<B: Backend>() {
    let p = poller::<B>();
    let mut source = tempfile::NamedTempFile::new().unwrap();
    source.write_all(b"input\n").unwrap();
    let stdin_like = File::open(source.path()).unwrap();
    let files = [stdin_like, dev_null(), regular_file()];
    let tokens: Vec<Token> = files.iter().map(|f| p.register(f).unwrap()).collect();
    #[cfg(feature = "stats")]
    let before = p.stats();
    for (interest, check) in [
        (Interest::BOTH, (true, true)),
        (Interest::READABLE, (true, false)),
        (Interest::WRITABLE, (false, true)),
    ] {
        for t in &tokens {
            p.arm(*t, interest)
                .unwrap_or_else(|e| panic!("arm {interest:?}: {e}"));
        }
        for ev in expect_events(&p, &tokens) {
            assert!(!ev.is_error(), "{ev:?}");
            if check.0 {
                assert!(ev.is_readable(), "{interest:?}: {ev:?}");
            }
            if check.1 {
                assert!(ev.is_writable(), "{interest:?}: {ev:?}");
            }
        }
        assert_no_events(&p, 3, Duration::from_millis(1));
    }
    for t in &tokens {
        p.arm(*t, Interest::BOTH).unwrap();
        p.disarm(*t).unwrap();
    }
    assert_no_events(&p, 3, Duration::from_millis(1));
    #[cfg(feature = "stats")]
    {
        let s = p.stats().since(&before);
        match B::NAME {
            "epoll" => {
                // One refused ADD each, remembered: later arms are synthetic.
                assert_eq!(
                    (s.adds, s.not_pollable, s.modifies, s.quiets),
                    (3, 3, 0, 0),
                    "{s:?}"
                );
                assert_eq!(s.synthetic, 12, "one synthetic event per arming: {s:?}");
            }
            // poll(2) polls files; so does an event port (`fs_poll`).
            "blocking" | "ports" => assert_eq!(s.not_pollable, 0, "polled files: {s:?}"),
            _ => {}
        }
    }
    #[cfg(feature = "stats")]
    let before = p.stats();
    for t in &tokens {
        p.deregister(*t).unwrap();
    }
    #[cfg(feature = "stats")]
    {
        let s = p.stats().since(&before);
        match B::NAME {
            "epoll" => assert_eq!(s.deletes, 0, "never added, never deleted: {s:?}"),
            "blocking" | "ports" => assert_eq!(s.deletes, 3, "{s:?}"),
            _ => {}
        }
    }
}

/// P09 (kqueue answers EINVAL for some devices): a tty and `/dev/null` behave as in
/// P08 on every backend: arming is not an error and readiness is delivered once
/// per arming.
pub fn case_p09_tty_and_dev_null_not_an_error<B: Backend>() {
    let p = poller::<B>();
    let null = dev_null();
    let tn = p.register(&null).unwrap();
    for _ in 0..2 {
        p.arm(tn, Interest::BOTH).expect("arm /dev/null");
        let ev = expect_one(&p, tn);
        assert!(
            ev.is_readable() && ev.is_writable() && !ev.is_error(),
            "{ev:?}"
        );
    }
    let Some((mut master, slave)) = pty() else {
        eprintln!("no pseudo-terminal available: only /dev/null was checked");
        return;
    };
    let ts = p.register(&slave).unwrap();
    p.arm(ts, Interest::WRITABLE).expect("arm a tty");
    assert!(expect_one(&p, ts).is_writable());
    p.arm(ts, Interest::READABLE).unwrap();
    assert_no_events(&p, 3, Duration::from_millis(2));
    master.write_all(b"line\n").unwrap();
    assert!(expect_one(&p, ts).is_readable());
    p.arm(ts, Interest::READABLE).unwrap();
    assert!(
        expect_one(&p, ts).is_readable(),
        "level-triggered: the line is still there"
    );
}

/// P10 on one stream: the peer sent its last bytes and shut down its write side.
/// The read event carries the data and read-closed together, never write-closed;
/// the reader drains to EOF and can still write.
///
/// `fin_is_synchronous`: the shutdown reached the reader before `shutdown` returned
/// (Unix sockets). Over TCP the FIN may land just after the data, so an event
/// without read-closed is re-armed until the FIN shows.
fn half_close<B: Backend, D: Fd>(
    reader: D,
    peer: D,
    shutdown: impl FnOnce(),
    fin_is_synchronous: bool,
) {
    // poll(2) has POLLRDHUP only on Linux (and FreeBSD, which uses kqueue): elsewhere
    // the poll(2) backend can report the half-close only as the EOF a read finds.
    let reports_read_closed =
        B::NAME != "blocking" || cfg!(any(target_os = "linux", target_os = "android"));
    let p = poller::<B>();
    let t = reader.register(&p).unwrap();
    peer.write_all(b"last bytes");
    shutdown();
    let deadline = Instant::now() + LOST_AFTER;
    loop {
        p.arm(t, Interest::READABLE).unwrap();
        let ev = expect_one(&p, t);
        assert!(ev.is_readable(), "{ev:?}");
        assert!(!ev.is_write_closed(), "the write side is open: {ev:?}");
        assert!(!ev.is_error(), "{ev:?}");
        if ev.is_read_closed() || !reports_read_closed {
            break;
        }
        assert!(
            !fin_is_synchronous,
            "the shutdown preceded the arm, yet no read-closed: {ev:?}"
        );
        assert!(
            Instant::now() < deadline,
            "read-closed never reported: {ev:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("read after read-closed: {e}"),
        }
    }
    assert_eq!(got, b"last bytes");
    assert_eq!(
        reader
            .write(b"reply")
            .expect("the write side is still open"),
        5
    );
    let mut reply = [0u8; 5];
    peer.read_exact_retry(&mut reply);
    assert_eq!(&reply, b"reply");
}

/// P10 over TCP loopback.
pub fn case_p10_half_close_tcp_read_closed_with_data<B: Backend>() {
    let (client, server) = tcp_pair();
    let c2 = client.try_clone().unwrap();
    half_close::<B, HostFd>(
        HostFd(server.into()),
        HostFd(client.into()),
        move || c2.shutdown(Shutdown::Write).unwrap(),
        false,
    );
}

/// P10 over a Unix stream socketpair.
pub fn case_p10_half_close_unix_read_closed_with_data<B: Backend, D: Fd>() {
    let (a, b) = D::socketpair();
    let a2 = a.dup();
    half_close::<B, D>(b, a, move || a2.shutdown(Shutdown::Write).unwrap(), true);
}

/// P11: writes queued, then the peer resets. The write interest, re-armed, reports
/// write-closed or error once per arming, never a loop of events.
pub fn case_p11_reset_with_writes_queued_once_per_arming<B: Backend>() {
    let p = poller::<B>();
    let (mut client, server) = tcp_pair();
    assert!(fill(&mut client) > 0);
    let t = p.register(&client).unwrap();
    close_with_reset(server);
    wait_for_error(&p, t, Interest::WRITABLE);
    for arming in 0..5 {
        p.arm(t, Interest::WRITABLE).unwrap();
        let ev = expect_one(&p, t);
        assert!(
            ev.is_write_closed() || ev.is_error(),
            "arming {arming}: {ev:?}"
        );
        assert_no_events(&p, 20, Duration::from_millis(1));
    }
    p.deregister(t).unwrap();
}

/// Arms `t` for `interest` until an event reports an error or a hang-up (the reset
/// may land after an ordinary readiness event).
fn wait_for_error<B: Backend>(p: &Poller<B>, t: Token, interest: Interest) {
    let deadline = Instant::now() + LOST_AFTER;
    loop {
        assert!(Instant::now() < deadline, "the reset was never reported");
        p.arm(t, interest).unwrap();
        let ev = expect_one(p, t);
        if ev.is_error() || ev.is_write_closed() {
            return;
        }
    }
}

/// P12: a non-blocking connect in progress, armed writable, then readable and
/// writable (one modify). The completion is delivered; re-arming the remaining
/// direction after it is one command, and that direction is delivered too.
pub fn case_p12_connect_in_progress_full_interest<B: Backend>() {
    let p = poller::<B>();
    let l = tcp_listener();
    let s = tcp_connect_nonblocking(v4_addr(&l));
    let t = p.register(&s).unwrap();
    p.arm(t, Interest::WRITABLE).unwrap();
    #[cfg(feature = "stats")]
    let before = p.stats();
    p.arm(t, Interest::BOTH).unwrap();
    #[cfg(feature = "stats")]
    {
        let s = p.stats().since(&before);
        assert_eq!(
            (s.adds, s.modifies, s.quiets, s.deletes),
            (0, 1, 0, 0),
            "{s:?}"
        );
        assert_ctl::<B>(&s);
    }
    let ev = expect_one(&p, t);
    assert!(
        ev.is_writable() && !ev.is_error(),
        "connect completion: {ev:?}"
    );
    assert!(!ev.is_readable(), "nothing to read yet: {ev:?}");
    assert!(s.take_error().unwrap().is_none(), "connect failed");
    #[cfg(feature = "stats")]
    let before = p.stats();
    p.arm(t, Interest::READABLE).unwrap();
    #[cfg(feature = "stats")]
    {
        let s = p.stats().since(&before);
        assert_eq!(commands(&s), 1, "re-arming the remaining direction: {s:?}");
        assert_ctl::<B>(&s);
    }
    assert_no_events(&p, 3, Duration::from_millis(2));
    let deadline = Instant::now() + LOST_AFTER;
    let (mut server, _) = loop {
        match l.accept() {
            Ok(x) => break x,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    server.write_all(b"hi").unwrap();
    let ev = expect_one(&p, t);
    assert!(ev.is_readable(), "{ev:?}");
    // Both directions in one arming are both reported.
    p.arm(t, Interest::BOTH).unwrap();
    let ev = expect_one(&p, t);
    assert!(ev.is_readable() && ev.is_writable(), "{ev:?}");
}

/// P13: one thread delivers while another disarms and re-arms an fd that reports
/// an error (a reset). No arming is delivered twice, the state ends as the last
/// completed call asked, and the error is delivered once per arming.
pub fn case_p13_racing_disarm_rearm_on_erroring_fd<B: Backend>() {
    const RACING: usize = 2000;
    const HANDSHAKES: usize = 200;
    let p = Arc::new(poller::<B>());
    let (mut client, server) = tcp_pair();
    fill(&mut client);
    let t = p.register(&client).unwrap();
    close_with_reset(server);
    wait_for_error(&p, t, Interest::BOTH);

    let stop = Arc::new(AtomicBool::new(false));
    let delivered = Arc::new(AtomicUsize::new(0));
    // Completed deliver calls: a call that ends after `calls` reached c + 2 began
    // after the moment `calls` was c, so it and everything before it are counted.
    let calls = Arc::new(AtomicUsize::new(0));
    let bad = Arc::new(Mutex::new(Vec::<String>::new()));
    let (tx, rx) = mpsc::channel::<()>();
    let deliverer = {
        let (p, stop, delivered, calls, bad) = (
            p.clone(),
            stop.clone(),
            delivered.clone(),
            calls.clone(),
            bad.clone(),
        );
        std::thread::spawn(move || {
            let mut events = Events::with_capacity(8);
            while !stop.load(Ordering::Acquire) {
                p.deliver(&mut events, Some(Duration::from_millis(5)))
                    .unwrap();
                for ev in &events {
                    // libkqueue reports the reset's errno in fflags only once
                    // (its SO_ERROR read clears it); later read-filter reports
                    // carry EV_EOF alone. BSD kernels keep the error.
                    let hung_up = ev.is_error()
                        || ev.is_write_closed()
                        || (cfg!(pollshot_libkqueue) && ev.is_read_closed());
                    if ev.token() != t || !hung_up {
                        bad.lock().unwrap().push(format!("{ev:?}"));
                    }
                    delivered.fetch_add(1, Ordering::AcqRel);
                    let _ = tx.send(());
                }
                calls.fetch_add(1, Ordering::AcqRel);
            }
        })
    };
    // Waits (without a clock) until the deliverer has completed two more calls.
    let settle = {
        let calls = calls.clone();
        move || {
            let c = calls.load(Ordering::Acquire);
            let calls = calls.clone();
            within("the deliverer keeps delivering", move || {
                while calls.load(Ordering::Acquire) < c + 2 {
                    std::thread::yield_now();
                }
            });
        }
    };
    // Racing: each iteration is one arming, cancelled by the disarm unless the
    // deliverer took it first. Deliveries can only be fewer.
    let racer = p.clone();
    within("racing arm/disarm", move || {
        for i in 0..RACING {
            racer.arm(t, Interest::ALL[i % 3]).unwrap();
            if i % 5 == 0 {
                std::thread::yield_now();
            }
            racer.disarm(t).unwrap();
        }
    });
    settle();
    let raced = delivered.load(Ordering::Acquire);
    assert!(raced <= RACING, "{raced} deliveries for {RACING} armings");
    // The last completed call was a disarm: nothing more may come.
    settle();
    settle();
    assert_eq!(
        delivered.load(Ordering::Acquire),
        raced,
        "delivered after the final disarm"
    );
    while rx.try_recv().is_ok() {}
    // Handshakes: arm only after the previous arming was delivered; each arming is
    // delivered exactly once (a double shows in the total, a loss as a hang).
    let hp = p.clone();
    let rx = within("arm, wait for the delivery, repeat", move || {
        for _ in 0..HANDSHAKES {
            hp.arm(t, Interest::READABLE).unwrap();
            rx.recv_timeout(LOST_AFTER)
                .expect("an arming on an erroring fd was not delivered");
        }
        rx
    });
    settle();
    settle();
    stop.store(true, Ordering::Release);
    p.notify().unwrap();
    deliverer.join().unwrap();
    drop(rx);
    let total = delivered.load(Ordering::Acquire);
    assert_eq!(
        total - raced,
        HANDSHAKES,
        "deliveries for {HANDSHAKES} sequential armings"
    );
    let bad = bad.lock().unwrap();
    assert!(bad.is_empty(), "unexpected events: {bad:?}");
    // The last arming was delivered: idle, nothing more.
    assert_no_events(&p, 10, Duration::from_millis(1));
}

/// P14: exclusive wake-up is refused with `Unsupported` (EPOLLEXCLUSIVE cannot be
/// re-armed by MOD) and registers nothing.
pub fn case_p14_exclusive_unsupported<B: Backend>() {
    let p = poller::<B>();
    let l = tcp_listener();
    assert_eq!(
        err_kind(p.register_exclusive(&l)),
        io::ErrorKind::Unsupported
    );
    assert!(p.is_empty());
    // The documented alternative works: a plain registration of the same listener.
    let t = p.register(&l).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    expect_one(&p, t);
}

/// P14's alternative: several threads deliver on one poller over one listener; each
/// readiness event reaches exactly one thread (no two threads ever hold the listener
/// at once) and every connection is accepted exactly once.
pub fn case_p14_threads_share_listener_each_readiness_once<B: Backend>() {
    const THREADS: usize = 4;
    const CONNECTIONS: usize = 64;
    let p = Arc::new(poller::<B>());
    let l = Arc::new(tcp_listener());
    let t = p.register(&*l).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let busy = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicUsize::new(0));
    let bad = Arc::new(Mutex::new(Vec::<String>::new()));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (p, l, busy, accepted, bad) = (
                p.clone(),
                l.clone(),
                busy.clone(),
                accepted.clone(),
                bad.clone(),
            );
            std::thread::spawn(move || {
                let mut events = Events::with_capacity(8);
                let mut mine = Vec::new();
                while accepted.load(Ordering::Acquire) < CONNECTIONS
                    && bad.lock().unwrap().is_empty()
                {
                    p.deliver(&mut events, Some(Duration::from_millis(20)))
                        .unwrap();
                    for ev in &events {
                        if ev.token() != t {
                            bad.lock().unwrap().push(format!("foreign event {ev:?}"));
                            continue;
                        }
                        if busy.swap(true, Ordering::AcqRel) {
                            bad.lock()
                                .unwrap()
                                .push("two threads hold the listener's readiness".into());
                            continue;
                        }
                        loop {
                            match l.accept() {
                                Ok((s, _)) => {
                                    mine.push(s);
                                    accepted.fetch_add(1, Ordering::AcqRel);
                                }
                                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                                Err(e) => {
                                    bad.lock().unwrap().push(format!("accept: {e}"));
                                    break;
                                }
                            }
                        }
                        busy.store(false, Ordering::Release);
                        p.arm(t, Interest::READABLE).unwrap();
                    }
                }
                mine.len()
            })
        })
        .collect();
    let addr = l.local_addr().unwrap();
    let clients: Vec<TcpStream> = (0..CONNECTIONS)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let (acc, bad2) = (accepted.clone(), bad.clone());
    within("64 connections accepted", move || {
        while acc.load(Ordering::Acquire) < CONNECTIONS && bad2.lock().unwrap().is_empty() {
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    let per_thread: Vec<usize> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let bad = bad.lock().unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(
        per_thread.iter().sum::<usize>(),
        CONNECTIONS,
        "{per_thread:?}"
    );
    assert_eq!(accepted.load(Ordering::Acquire), CONNECTIONS);
    drop(clients);
}

/// A deliver with `timeout` and nothing ready (one armed, idle socket in the set):
/// `Ok(0)`, and a nonzero timeout waited at least its length.
fn quiet_wait<B: Backend, D: Fd>(timeout: Duration) {
    let p = poller::<B>();
    let (_a, b) = D::socketpair();
    let t = b.register(&p).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let mut events = Events::with_capacity(8);
    for _ in 0..3 {
        let start = Instant::now();
        let n = p
            .deliver(&mut events, Some(timeout))
            .expect("deliver with a timeout");
        let elapsed = start.elapsed();
        assert_eq!(n, 0);
        assert!(
            elapsed >= timeout,
            "returned after {elapsed:?}, before the {timeout:?} timeout"
        );
    }
}

/// A deliver with `timeout` on another thread, ended by a notify: `Ok(0)`. Returns
/// the poller and the socketpair whose one end is registered and still armed.
pub(crate) fn notified_wait<B: Backend, D: Fd>(
    timeout: Option<Duration>,
) -> (Arc<Poller<B>>, (D, D)) {
    let p = Arc::new(poller::<B>());
    let (a, b) = D::socketpair();
    let t = b.register(&p).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let notifier = {
        let p = p.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            p.notify().unwrap();
        })
    };
    let waiter = p.clone();
    let n = within("deliver ended by a notify", move || {
        waiter
            .deliver(&mut Events::with_capacity(8), timeout)
            .expect("deliver with a huge or no timeout")
    });
    assert_eq!(n, 0, "a notify delivers no event");
    notifier.join().unwrap();
    (p, (a, b))
}

/// P15: `None` blocks until a notify.
pub fn case_p15_timeout_none_until_notify<B: Backend, D: Fd>() {
    notified_wait::<B, D>(None);
}

/// P15: zero never blocks, and still delivers what is ready.
pub fn case_p15_timeout_zero_never_blocks<B: Backend, D: Fd>() {
    let p = Arc::new(poller::<B>());
    let (a, b) = D::socketpair();
    let t = b.register(&p).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let q = p.clone();
    let n = within("deliver(Some(ZERO)) with nothing ready", move || {
        q.deliver(&mut Events::with_capacity(8), Some(Duration::ZERO))
            .unwrap()
    });
    assert_eq!(n, 0);
    a.write_all(b"x");
    let mut events = Events::with_capacity(8);
    assert_eq!(p.deliver(&mut events, Some(Duration::ZERO)).unwrap(), 1);
    assert_eq!(events.iter().next().unwrap().token(), t);
}

/// P15: 1 ns is not rounded to "don't wait" with an error or a spin; it waits at
/// least 1 ns.
pub fn case_p15_timeout_1ns<B: Backend, D: Fd>() {
    quiet_wait::<B, D>(Duration::from_nanos(1));
}

/// P15: 999 µs waits at least 999 µs (rounded up to 1 ms, or exact).
pub fn case_p15_timeout_999us<B: Backend, D: Fd>() {
    quiet_wait::<B, D>(Duration::from_micros(999));
}

/// P15: 1.5 ms waits at least 1.5 ms (never rounded down to 1 ms).
pub fn case_p15_timeout_1500us<B: Backend, D: Fd>() {
    quiet_wait::<B, D>(Duration::from_micros(1500));
}

/// P15: `Duration::MAX` is clamped, not refused; a notify ends it.
pub fn case_p15_timeout_max_until_notify<B: Backend, D: Fd>() {
    notified_wait::<B, D>(Some(Duration::MAX));
}
