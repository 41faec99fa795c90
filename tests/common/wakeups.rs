//! Wake-ups a runtime can count on, and one meaning for an event (issue 8): each
//! body runs on every backend through the `suite!` macro.
//!
//! - a wait that fetched only stale events keeps waiting (`deliver` never returns
//!   empty for them), and costs one wait per kernel wake-up;
//! - a signal is `Err(Interrupted)`, never a bare `Ok(0)` before the deadline;
//! - one notify ends exactly one blocked deliver; `k` notifies end `k`; a storm
//!   with no waiter costs one write;
//! - with more ready than fits, every ready registration is served within
//!   `ceil(N / capacity)` delivers;
//! - the readiness flags mean the same on every backend (pipe, half-close, refused
//!   connect, reset, own shutdown).
//!
//! Races are repeated [`TRIALS`] times in one process and every trial is asserted.

use super::*;
use pollshot::Interest;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;

/// Trials of each racy scenario.
pub const TRIALS: usize = 20;

/// Waits (without a deadline that decides anything) until `n` threads are counted
/// as waiters in `p`'s `deliver`; panics after [`HANG_AFTER`].
#[cfg(feature = "stats")]
pub fn until_waiters<B: Backend>(p: &Poller<B>, n: usize) {
    let start = Instant::now();
    while p.waiters() < n {
        assert!(
            start.elapsed() < HANG_AFTER,
            "{n} threads never reached deliver ({} did)",
            p.waiters()
        );
        thread::sleep(Duration::from_millis(1));
    }
}

/// Issue 8.1: a disarmed socket whose peer hangs up fires once on epoll (the kernel
/// adds `EPOLLHUP` to every registration) with a stale generation. A
/// `deliver(300 ms)` that fetched only that event keeps waiting until its deadline:
/// `Ok(0)`, not notified, not before 300 ms, and one wait per kernel wake-up.
#[cfg(feature = "stats")]
pub fn wake_stale_only_wait_keeps_waiting_until_the_deadline<B: Backend, D: Fd>() {
    const T: Duration = Duration::from_millis(300);
    let p = Arc::new(poller::<B>());
    let (a, b) = D::socketpair();
    let t = b.register(&p).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    p.disarm(t).unwrap();
    let before = p.stats();
    let waiter = {
        let p = Arc::clone(&p);
        thread::spawn(move || {
            let mut events = Events::with_capacity(8);
            let start = Instant::now();
            let n = p.deliver(&mut events, Some(T)).expect("deliver");
            (n, events.is_notified(), start.elapsed())
        })
    };
    until_waiters(&p, 1);
    drop(a); // the peer hangs up while the registration is disarmed
    let (n, notified, elapsed) = waiter.join().unwrap();
    let s = p.stats().since(&before);
    assert_eq!(n, 0, "a stale event was delivered");
    assert!(!notified, "nobody notified");
    assert!(
        elapsed >= T,
        "deliver returned after {elapsed:?}, before {T:?}"
    );
    if B::NAME == "epoll" {
        assert_eq!(
            s.stale, 1,
            "epoll reports the hang-up once (oneshot): {s:?}"
        );
    }
    // Every wait but the last was ended by stale events: no spin.
    assert!(
        s.waits >= 1 && s.waits <= 1 + s.stale,
        "{} waits for {} stale events: {s:?}",
        s.waits,
        s.stale
    );
    drop(b);
}

/// Issue 8.1: 20 disarmed sockets whose peers all hang up; `deliver(None)` returns
/// only for the notify that comes afterwards (not once per stale event), and the
/// stale events cost no more waits than there were kernel wake-ups.
#[cfg(feature = "stats")]
pub fn wake_stale_only_deliver_none_returns_only_for_a_notify<B: Backend, D: Fd>() {
    let p = Arc::new(poller::<B>());
    let mut peers = Vec::new();
    let mut ends = Vec::new();
    for _ in 0..20 {
        let (a, b) = D::socketpair();
        let t = b.register(&p).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        p.disarm(t).unwrap();
        peers.push(a);
        ends.push(b);
    }
    let before = p.stats();
    let returned = Arc::new(AtomicBool::new(false));
    let waiter = {
        let (p, returned) = (Arc::clone(&p), Arc::clone(&returned));
        thread::spawn(move || {
            let mut events = Events::with_capacity(64);
            let n = p.deliver(&mut events, None).expect("deliver");
            returned.store(true, Ordering::SeqCst);
            (n, events.is_notified())
        })
    };
    until_waiters(&p, 1);
    drop(peers);
    // Give the stale hang-ups time to reach the waiter; whatever the machine's
    // speed, the waiter must still be blocked afterwards.
    let start = Instant::now();
    while B::NAME == "epoll" && p.stats().since(&before).stale < 20 {
        assert!(start.elapsed() < LOST_AFTER, "the hang-ups never arrived");
        thread::sleep(Duration::from_millis(1));
    }
    thread::sleep(Duration::from_millis(20));
    assert!(
        !returned.load(Ordering::SeqCst),
        "deliver(None) returned without a notify"
    );
    p.notify().unwrap();
    let (n, notified) = waiter.join().unwrap();
    assert_eq!((n, notified), (0, true), "ended by the notify, no event");
    let s = p.stats().since(&before);
    assert!(s.waits <= 1 + s.stale, "{s:?}");
    drop(ends);
}

/// Issue 8.1 (P02/P03 kind): a dup keeps a closed registration's description open
/// and its number is taken by a new registration; the old description's events are
/// stale, and a `deliver(300 ms)` on the new, idle registration keeps waiting.
#[cfg(feature = "stats")]
pub fn wake_dup_outliving_close_stale_events_keep_waiting<B: Backend, D: Fd>() {
    const T: Duration = Duration::from_millis(300);
    let p = Arc::new(poller::<B>());
    let (a, b) = D::socketpair();
    let held = b.dup(); // the dup that outlives the close
    let mut b = b;
    let old = b.register(&p).unwrap();
    p.arm(old, Interest::READABLE).unwrap();
    // Another socket takes the closed number (dup2 over it: the close and the
    // reuse in one step) and is registered: it supersedes `old`.
    let (_c, d) = D::socketpair();
    d.dup_onto(&mut b);
    let new = b.register(&p).unwrap();
    p.arm(new, Interest::READABLE).unwrap();
    if on_libkqueue::<B>() {
        // The old description must not become ready now that its knote is
        // deleted (`on_libkqueue`; unchecked, a 300 ms spin here crashed libkqueue
        // in `linux_kevent_copyout` in about 1 run in 20). What holds is the
        // supersede and the new arm above; deregistering before the close is
        // `wake_deregister_close_reuse_*`.
        p.deregister(new).unwrap();
        drop(held);
        return;
    }
    let before = p.stats();
    let waiter = {
        let p = Arc::clone(&p);
        thread::spawn(move || {
            let mut events = Events::with_capacity(8);
            let start = Instant::now();
            let n = p.deliver(&mut events, Some(T)).expect("deliver");
            (n, events.is_notified(), start.elapsed())
        })
    };
    until_waiters(&p, 1);
    a.write_all(b"x"); // readable through the dup only
    let (n, notified, elapsed) = waiter.join().unwrap();
    let s = p.stats().since(&before);
    assert_eq!(n, 0, "the old description's event was delivered");
    assert!(!notified);
    assert!(elapsed >= T, "returned after {elapsed:?}");
    assert!(s.waits >= 1 && s.waits <= 1 + s.stale, "{s:?}");
    p.deregister(new).unwrap();
    drop(held);
}

/// Issue 8.7: a registration armed for both directions is delivered (writable; on
/// kqueue the read filter's disable is then queued), then deregistered while its
/// description stays open elsewhere (`holder`: a dup, or a forked child), closed,
/// and its number reused by a new socket, registered and armed readable, idle.
/// The old description becomes readable: 100 `deliver(10 ms)` return no event,
/// and cost at most one wait each plus one per stale event (no spin: the
/// deregistration reached the kernel before the close, so no kernel entry of the
/// old description is left). The new registration still works afterwards.
#[cfg(feature = "stats")]
fn deregister_close_reuse_no_spin<B: Backend, D: Fd>(holder: Holder) {
    let p = poller::<B>();
    let (a, b) = D::socketpair();
    let old = b.register(&p).unwrap();
    p.arm(old, Interest::BOTH).unwrap();
    assert!(expect_one(&p, old).is_writable());
    let kept = holder.keep(&b);
    p.deregister(old).unwrap();
    let mut b = b;
    let (c, d) = D::socketpair();
    d.dup_onto(&mut b); // close and reuse in one step
    drop(d);
    let new = b.register(&p).unwrap();
    p.arm(new, Interest::READABLE).unwrap();
    let before = p.stats();
    a.write_all(b"x"); // readable through the holder's reference only
    let got = deliver_n(&p, 100, Duration::from_millis(10));
    let s = p.stats().since(&before);
    assert!(got.is_empty(), "the old description was delivered: {got:?}");
    assert!(
        s.waits >= 100 && s.waits <= 100 + s.stale,
        "100 delivers of 10 ms cost {} waits for {} stale events: {s:?}",
        s.waits,
        s.stale
    );
    c.write_all(b"y");
    assert!(expect_one(&p, new).is_readable());
    p.deregister(new).unwrap();
    kept.release();
}

/// What keeps a deregistered registration's description open.
#[cfg(feature = "stats")]
#[derive(Clone, Copy)]
enum Holder {
    /// A dup in this process.
    Dup,
    /// A forked child that keeps its inherited copy until told to exit.
    Child,
}

/// A held reference to a description, until [`Kept::release`].
#[cfg(feature = "stats")]
enum Kept<D> {
    Dup(D),
    Child { pid: libc::pid_t, go: OwnedFd },
}

#[cfg(feature = "stats")]
impl Holder {
    fn keep<D: Fd>(self, fd: &D) -> Kept<D> {
        match self {
            Holder::Dup => Kept::Dup(fd.dup()),
            Holder::Child => {
                // Until the child has closed what it inherited (`forking`).
                let alone = forking();
                let (go_r, go_w) = rustix::pipe::pipe().expect("pipe");
                let (closed_r, closed_w) = rustix::pipe::pipe().expect("pipe");
                assert_eq!(
                    D::KERNEL,
                    "host",
                    "a forked child holds host descriptors only"
                );
                let keep = fd.raw();
                let wait_on = go_r.as_raw_fd();
                let tell = closed_w.as_raw_fd();
                // SAFETY: plain sysconf(3) query.
                let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) }.clamp(256, 65536) as RawFd;
                // SAFETY: fork(2) from a multi-threaded test process. The child
                // only makes async-signal-safe calls (close(2), write(2),
                // read(2), _exit(2)): it closes every inherited number but the
                // held one and its two pipe ends (so it keeps no other test's
                // descriptor open), says so on one pipe, waits until the parent
                // closes the other, and leaves without running any destructor.
                let pid = unsafe { libc::fork() };
                assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
                if pid == 0 {
                    // SAFETY: see above; the buffer is a local array.
                    unsafe {
                        for n in 3..max {
                            if n != keep && n != wait_on && n != tell {
                                libc::close(n);
                            }
                        }
                        libc::write(tell, b"c".as_ptr().cast(), 1);
                        libc::close(tell);
                        // Until EOF; an error but EINTR ends it with code 2 (a
                        // failure, not a spin).
                        let mut byte = 0u8;
                        while libc::read(wait_on, (&mut byte as *mut u8).cast(), 1) < 0 {
                            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                                libc::_exit(2);
                            }
                        }
                        libc::_exit(0);
                    }
                }
                drop((go_r, closed_w));
                let mut byte = [0u8; 1];
                let said = loop {
                    match rustix::io::read(&closed_r, &mut byte) {
                        Err(rustix::io::Errno::INTR) => continue,
                        r => break r.expect("read"),
                    }
                };
                assert_eq!(said, 1, "the child ended before closing what it inherited");
                drop(alone);
                Kept::Child { pid, go: go_w }
            }
        }
    }
}

#[cfg(feature = "stats")]
impl<D> Kept<D> {
    fn release(self) {
        match self {
            Kept::Dup(fd) => drop(fd),
            Kept::Child { pid, go } => {
                drop(go); // EOF: the child exits
                let status = wait_child(pid);
                assert!(
                    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                    "the holding child failed (status {status:#x}; exit code 2: its read \
                     of the pipe failed)"
                );
            }
        }
    }
}

/// Issue 8.7, first input, with a dup: see [`deregister_close_reuse_no_spin`].
#[cfg(feature = "stats")]
pub fn wake_deregister_close_reuse_dup_held_no_spin<B: Backend, D: Fd>() {
    deregister_close_reuse_no_spin::<B, D>(Holder::Dup);
}

/// Issue 8.7, first input, with a forked child holding the description: see
/// [`deregister_close_reuse_no_spin`].
#[cfg(feature = "stats")]
pub fn wake_deregister_close_reuse_forked_child_no_spin<B: Backend>() {
    deregister_close_reuse_no_spin::<B, HostFd>(Holder::Child);
}

/// The handler for [`wake_signal_is_interrupted_never_an_early_ok`]: does nothing,
/// and is installed without `SA_RESTART`, so a blocked wait fails with EINTR.
extern "C" fn on_alarm(_: libc::c_int) {}

/// Issue 8.2: SIGALRM every 5 ms (sent to the waiting thread only, handler without
/// `SA_RESTART`): each `deliver(200 ms)` either says `Interrupted` or returns after
/// at least 200 ms; never a bare `Ok(0)` before its deadline.
pub fn wake_signal_is_interrupted_never_an_early_ok<B: Backend>() {
    const T: Duration = Duration::from_millis(200);
    install_sigalrm();
    let p = Arc::new(poller::<B>());
    let (_a, b) = socketpair();
    let t = p.register(&b).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    // The waiter stays alive until the signalling has stopped, so that every
    // pthread_kill targets a live thread.
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let waiter = {
        let (p, stop) = (Arc::clone(&p), Arc::clone(&stop));
        thread::spawn(move || {
            // SAFETY: pthread_self(3) has no preconditions.
            tx.send(unsafe { libc::pthread_self() }).unwrap();
            let mut events = Events::with_capacity(8);
            let (mut interrupted, mut timed_out) = (0, 0);
            while interrupted < 20 || timed_out < 1 {
                let start = Instant::now();
                match p.deliver(&mut events, Some(T)) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                        assert_eq!(e.raw_os_error(), Some(libc::EINTR), "{e}");
                        interrupted += 1;
                    }
                    Ok(n) => {
                        let elapsed = start.elapsed();
                        assert_eq!(n, 0, "no event is due");
                        assert!(!events.is_notified(), "nobody notified");
                        assert!(
                            elapsed >= T,
                            "deliver({T:?}) returned Ok(0) after {elapsed:?} under signals"
                        );
                        // A timeout before 20 interrupts (the signalling thread
                        // starved on a loaded machine) leaves the signals on: they
                        // stop once 20 interrupts are in, and the rounds after that
                        // run without signals, so a timeout is seen then at the
                        // latest.
                        timed_out += 1;
                    }
                    Err(e) => panic!("deliver: {e}"),
                }
                if interrupted >= 20 {
                    stop.store(true, Ordering::SeqCst);
                }
            }
            done_rx.recv().unwrap();
            (interrupted, timed_out)
        })
    };
    let target = rx.recv().unwrap();
    while !stop.load(Ordering::SeqCst) {
        // SAFETY: `target` is a live thread of this process (it waits for
        // `done_tx` before it ends); SIGALRM has a handler.
        let rc = unsafe { libc::pthread_kill(target, libc::SIGALRM) };
        assert_eq!(rc, 0);
        thread::sleep(Duration::from_millis(5));
    }
    done_tx.send(()).unwrap();
    let (interrupted, timed_out) = waiter.join().unwrap();
    assert!(interrupted >= 20 && timed_out >= 1);
}

/// Installs [`on_alarm`] for SIGALRM without `SA_RESTART`.
fn install_sigalrm() {
    // SAFETY: a zeroed sigaction is valid; the handler is an `extern "C" fn(c_int)`
    // that does nothing (async-signal-safe), installed without SA_RESTART.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_alarm as *const () as libc::sighandler_t;
        sa.sa_flags = 0;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut()), 0);
    }
}

/// Waits until thread `tid` of this process sleeps in the kernel (state `S` in
/// `/proc/self/task/TID/stat`): blocked in a system call, so that a signal now
/// interrupts that call rather than arriving before it. Panics after
/// [`HANG_AFTER`].
fn until_asleep(tid: libc::pid_t) {
    let path = format!("/proc/self/task/{tid}/stat");
    let start = Instant::now();
    loop {
        let stat = std::fs::read_to_string(&path).unwrap();
        // The state follows the command name's closing parenthesis.
        let state = stat[stat.rfind(')').unwrap() + 1..]
            .trim_start()
            .chars()
            .next();
        if state == Some('S') {
            return;
        }
        assert!(start.elapsed() < HANG_AFTER, "thread {tid} never blocked");
        thread::sleep(Duration::from_millis(1));
    }
}

/// Issue 8.2, one signal each: two threads blocked in `deliver(10 s)` on one
/// poller whose only registration was armed before either began (on io_uring the
/// first wait's enter submits that arm, and the second thread waits for a
/// hand-over in user space). SIGALRM (no `SA_RESTART`) is sent once to the
/// second, then, once that one has returned, once to the first: each `deliver`
/// says `Interrupted` (EINTR). An enter that submitted answers a signal with its
/// count rather than EINTR, and a condition-variable wait ignores signals: either
/// made a thread sleep out its 10 s. 20 trials.
#[cfg(target_os = "linux")]
pub fn wake_one_signal_ends_each_of_2_blocked_delivers<B: Backend>() {
    install_sigalrm();
    for trial in 0..TRIALS {
        let p = Arc::new(poller::<B>());
        let (_a, b) = socketpair();
        let t = p.register(&b).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        let mut waiters = Vec::new();
        for _ in 0..2 {
            let (tx, rx) = mpsc::channel();
            let p = Arc::clone(&p);
            let h = thread::spawn(move || {
                // SAFETY: pthread_self(3) and gettid(2) have no preconditions.
                tx.send(unsafe { (libc::pthread_self(), libc::gettid()) })
                    .unwrap();
                let mut events = Events::with_capacity(4);
                let r = p.deliver(&mut events, Some(Duration::from_secs(10)));
                r.map(|n| (n, events.is_notified()))
            });
            let (pthread, tid) = rx.recv().unwrap();
            until_asleep(tid);
            waiters.push((h, pthread, tid));
        }
        // The second first (on io_uring the follower), then the first.
        for (h, pthread, tid) in waiters.into_iter().rev() {
            until_asleep(tid);
            // SAFETY: the thread is alive (it has not been joined) and SIGALRM has
            // a handler.
            assert_eq!(unsafe { libc::pthread_kill(pthread, libc::SIGALRM) }, 0);
            match h.join().unwrap() {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    assert_eq!(e.raw_os_error(), Some(libc::EINTR), "{e}")
                }
                other => panic!("trial {trial}: a signalled deliver returned {other:?}"),
            }
        }
    }
}

/// Issue 8.3: four threads blocked in `deliver(300 ms)` on one poller with an idle
/// armed socket; one notify ends exactly one of them (the others time out, not
/// notified), and no notify is left over afterwards. 20 trials.
///
/// A trial needs all four blocked at once. On a loaded machine the first thread
/// may time out before the last one has started: that attempt is not a trial of
/// the scenario, so it is joined and started again (at most [`VOID_ATTEMPTS`]
/// times in all), never counted as a pass or a failure.
#[cfg(feature = "stats")]
pub fn wake_one_notify_ends_exactly_one_of_4_blocked_delivers<B: Backend, D: Fd>() {
    const T: Duration = Duration::from_millis(300);
    let p = Arc::new(poller::<B>());
    let (_a, b) = D::socketpair();
    let t = b.register(&p).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let mut void = 0;
    let mut trial = 0;
    while trial < TRIALS {
        let returned = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (p, returned) = (Arc::clone(&p), Arc::clone(&returned));
                thread::spawn(move || {
                    let mut events = Events::with_capacity(8);
                    let start = Instant::now();
                    // io_uring may end a wait with `Interrupted` and no signal (its
                    // task work; `Poller::deliver` documents it): call again for
                    // the time left, as a caller must.
                    let n = loop {
                        match p.deliver(&mut events, Some(T.saturating_sub(start.elapsed()))) {
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            r => break r.expect("deliver"),
                        }
                    };
                    returned.fetch_add(1, Ordering::SeqCst);
                    (n, events.is_notified(), start.elapsed())
                })
            })
            .collect();
        if !until_waiters_or_returned(&p, 4, &returned) {
            for h in threads {
                let (n, notified, _) = h.join().unwrap();
                assert!(n == 0 && !notified, "nobody notified, nothing ready");
            }
            void += 1;
            assert!(
                void < VOID_ATTEMPTS,
                "{void} attempts never had 4 threads blocked at once"
            );
            continue;
        }
        p.notify().unwrap();
        let results: Vec<_> = threads.into_iter().map(|h| h.join().unwrap()).collect();
        let notified = results.iter().filter(|r| r.1).count();
        assert_eq!(notified, 1, "trial {trial}: {results:?}");
        for (n, was_notified, elapsed) in &results {
            assert_eq!(*n, 0, "trial {trial}: {results:?}");
            if !was_notified {
                assert!(*elapsed >= T, "trial {trial}: early return {results:?}");
            }
        }
        let mut events = Events::with_capacity(8);
        p.deliver(&mut events, Some(Duration::ZERO)).unwrap();
        assert!(
            !events.is_notified(),
            "trial {trial}: a notify was left over"
        );
        trial += 1;
    }
}

/// [`portable::a_notify_ends_the_blocked_deliver_not_a_zero_timeout_poll`] (the
/// Windows suite runs it too).
#[cfg(feature = "stats")]
pub fn wake_a_notify_ends_the_blocked_deliver_not_a_zero_timeout_poll<B: Backend, D: Fd>() {
    portable::a_notify_ends_the_blocked_deliver_not_a_zero_timeout_poll(poller::<B>());
}

/// Attempts of a racy scenario that may be void (its setup was overtaken by a
/// timeout on a loaded machine) before the test gives up.
#[cfg(feature = "stats")]
const VOID_ATTEMPTS: usize = 100;

/// [`until_waiters`] for waiters with a timeout: true once `n` threads are counted
/// in `p`'s `deliver`, false as soon as one of them has returned (`returned`)
/// before that. Panics after [`HANG_AFTER`].
#[cfg(feature = "stats")]
fn until_waiters_or_returned<B: Backend>(p: &Poller<B>, n: usize, returned: &AtomicUsize) -> bool {
    let start = Instant::now();
    loop {
        if p.waiters() >= n {
            return true;
        }
        if returned.load(Ordering::SeqCst) > 0 {
            return false;
        }
        assert!(
            start.elapsed() < HANG_AFTER,
            "{n} threads never reached deliver ({} did)",
            p.waiters()
        );
        thread::sleep(Duration::from_millis(1));
    }
}

/// Issue 8.4: four threads blocked in `deliver(None)`, then four notifies back to
/// back: all four delivers end, each notified. 20 trials.
#[cfg(feature = "stats")]
pub fn wake_4_notifies_end_4_blocked_delivers<B: Backend, D: Fd>() {
    let p = Arc::new(poller::<B>());
    let (_a, b) = D::socketpair();
    let t = b.register(&p).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    for trial in 0..TRIALS {
        let done = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (p, done) = (Arc::clone(&p), Arc::clone(&done));
                thread::spawn(move || {
                    let mut events = Events::with_capacity(8);
                    let n = p.deliver(&mut events, None).expect("deliver");
                    done.fetch_add(1, Ordering::SeqCst);
                    (n, events.is_notified())
                })
            })
            .collect();
        until_waiters(&p, 4);
        for _ in 0..4 {
            p.notify().unwrap();
        }
        let start = Instant::now();
        while done.load(Ordering::SeqCst) < 4 {
            assert!(
                start.elapsed() < LOST_AFTER,
                "trial {trial}: 4 notifies ended only {} of 4 blocked delivers",
                done.load(Ordering::SeqCst)
            );
            thread::sleep(Duration::from_millis(1));
        }
        for h in threads {
            assert_eq!(h.join().unwrap(), (0, true), "trial {trial}");
        }
        let mut events = Events::with_capacity(8);
        p.deliver(&mut events, Some(Duration::ZERO)).unwrap();
        assert!(
            !events.is_notified(),
            "trial {trial}: a notify was left over"
        );
    }
}

/// Issue 8.4: 800,000 notifies from 4 threads with nobody waiting coalesce into one
/// pending wake-up: one waker write in all, and it ends exactly one deliver.
#[cfg(feature = "stats")]
pub fn wake_notify_storm_without_waiters_costs_one_write<B: Backend, D: Fd>() {
    let p = Arc::new(poller::<B>());
    let before = p.stats();
    let start = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (p, start) = (Arc::clone(&p), Arc::clone(&start));
            thread::spawn(move || {
                start.wait();
                for _ in 0..200_000 {
                    p.notify().unwrap();
                }
            })
        })
        .collect();
    for h in threads {
        h.join().unwrap();
    }
    let s = p.stats().since(&before);
    // io_uring: with no waiter blocked the binary waker is a flag the next wait
    // takes, no system call at all (backends/uring/).
    let writes = if B::NAME == "uring" { 0 } else { 1 };
    assert_eq!(s.wakes, writes, "{s:?}");
    assert_eq!(s.syscalls(), writes, "{s:?}");
    let mut events = Events::with_capacity(8);
    p.deliver(&mut events, Some(Duration::ZERO)).unwrap();
    assert!(events.is_notified());
    p.deliver(&mut events, Some(Duration::ZERO)).unwrap();
    assert!(!events.is_notified(), "one pending notify, consumed once");
}

/// What a deliver returned: the tokens it delivered, and whether it was notified.
type Returned = (Vec<Token>, bool);

/// One `deliver(None)` on each of `n` threads with room for `capacity` events;
/// each sends `(tokens delivered, notified)` when it returns.
#[cfg(feature = "stats")]
fn blocked_delivers<B: Backend>(
    p: &Arc<Poller<B>>,
    n: usize,
    capacity: usize,
) -> (mpsc::Receiver<Returned>, Vec<thread::JoinHandle<()>>) {
    let (tx, rx) = mpsc::channel();
    let threads = (0..n)
        .map(|_| {
            let (p, tx) = (Arc::clone(p), tx.clone());
            thread::spawn(move || {
                let mut events = Events::with_capacity(capacity);
                p.deliver(&mut events, None).expect("deliver");
                let tokens = events.iter().map(|e| e.token()).collect();
                let _ = tx.send((tokens, events.is_notified()));
            })
        })
        .collect();
    until_waiters(p, n);
    (rx, threads)
}

/// Found by the loom model (`src/loom_tests/`): two threads blocked in
/// `deliver(None)` with room for one event each, and two always-ready
/// registrations (regular files) armed back to back. The two arms' wake-ups merge
/// into one; the thread it reaches takes one event and returns with the other
/// still queued. That thread must pass the wake-up on as it leaves: each deliver
/// returns with one event. 20 trials.
#[cfg(feature = "stats")]
pub fn wake_2_always_ready_arms_end_2_blocked_delivers_with_room_for_1<B: Backend>() {
    let p = Arc::new(poller::<B>());
    let files = [regular_file(), regular_file()];
    let tokens: Vec<Token> = files.iter().map(|f| p.register(f).unwrap()).collect();
    for trial in 0..TRIALS {
        let (rx, threads) = blocked_delivers(&p, 2, 1);
        for &t in &tokens {
            p.arm(t, Interest::READABLE).unwrap();
        }
        let mut got = Vec::new();
        for _ in 0..2 {
            match rx.recv_timeout(LOST_AFTER) {
                Ok((t, notified)) => {
                    assert!(!notified, "trial {trial}: nobody notified");
                    got.extend(t);
                }
                Err(_) => break,
            }
        }
        if got.len() < 2 {
            // Release the deliver left blocked before failing.
            p.notify().unwrap();
        }
        for h in threads {
            h.join().unwrap();
        }
        got.sort();
        let mut want = tokens.clone();
        want.sort();
        assert_eq!(
            got, want,
            "trial {trial}: a deliver stayed blocked with an event queued"
        );
    }
}

/// Found by the loom model (`src/loom_tests/`): two threads blocked in
/// `deliver(None)`; an always-ready registration (a regular file) armed and a
/// notify, back to back. Their wake-ups merge into one; the thread it reaches
/// takes the notify and returns. The event must still be delivered (to the other
/// thread, which that one wakes as it leaves, or to the same call), and the notify
/// consumed once. 20 trials, each on a new poller.
#[cfg(feature = "stats")]
pub fn wake_always_ready_arm_and_notify_with_2_blocked_delivers<B: Backend>() {
    for trial in 0..TRIALS {
        let p = Arc::new(poller::<B>());
        let file = regular_file();
        let t = p.register(&file).unwrap();
        let (rx, threads) = blocked_delivers(&p, 2, 8);
        p.arm(t, Interest::READABLE).unwrap();
        p.notify().unwrap();
        let (mut events, mut notifies, mut returned) = (Vec::new(), 0, 0);
        while events.is_empty() || notifies == 0 {
            let Ok((tokens, notified)) = rx.recv_timeout(LOST_AFTER) else {
                break;
            };
            returned += 1;
            events.extend(tokens);
            notifies += notified as usize;
        }
        if returned < 2 {
            // One call took both: the other is still blocked, as it may be.
            p.notify().unwrap();
        }
        for h in threads {
            h.join().unwrap();
        }
        assert_eq!(
            (events, notifies),
            (vec![t], 1),
            "trial {trial}: the event and the notify, each once"
        );
    }
}

/// Issue 8.5: 64 socketpairs with one unread byte each, all armed readable, a
/// buffer of 8, and 32 delivers that re-arm each delivered registration without
/// reading: every registration is served within the first ceil(64 / 8) = 8
/// delivers, and exactly 32 * 8 / 64 = 4 times in all.
pub fn wake_fair_64_ready_capacity_8_all_served_within_8_delivers<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let pairs: Vec<_> = (0..64).map(|_| D::socketpair()).collect();
    let tokens: Vec<Token> = pairs
        .iter()
        .map(|(a, b)| {
            a.write_all(b"x");
            let t = b.register(&p).unwrap();
            p.arm(t, Interest::READABLE).unwrap();
            t
        })
        .collect();
    let mut served = vec![0usize; 64];
    let mut first = vec![None; 64];
    let mut events = Events::with_capacity(8);
    for d in 1..=32 {
        let n = p
            .deliver(&mut events, Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(n, 8, "deliver #{d}: 64 are ready, 8 fit");
        for ev in &events {
            let i = tokens.iter().position(|&t| t == ev.token()).unwrap();
            served[i] += 1;
            first[i].get_or_insert(d);
            p.arm(ev.token(), Interest::READABLE).unwrap();
        }
    }
    let late: Vec<_> = (0..64)
        .filter(|&i| !matches!(first[i], Some(d) if d <= 8))
        .collect();
    assert!(
        late.is_empty(),
        "first served after deliver #8: {late:?} ({first:?})"
    );
    assert!(served.iter().all(|&n| n == 4), "served counts {served:?}");
}

/// The event `p` delivers for `t`, armed for `interest` (after `arm`).
fn one_event<B: Backend>(p: &Poller<B>, t: Token, interest: Interest) -> Event {
    p.arm(t, interest).unwrap();
    expect_one(p, t)
}

/// Issue 8.6: a pipe's write end armed writable whose reader closed: writable and
/// write-closed, never readable or read-closed (a write-only end).
pub fn meaning_pipe_writer_whose_reader_closed_is_write_closed<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (r, w) = D::pipe();
    w.fill();
    let t = w.register(&p).unwrap();
    p.arm(t, Interest::WRITABLE).unwrap();
    drop(r);
    if D::KERNEL == "rump" {
        // NetBSD 7.99 to 9 never report this to the armed writer: `pipeclose`
        // (sys_pipe.c) wakes the closing reader's knote list, where the
        // writer's write knote hangs, before it sets `PIPE_EOF`; `knote`
        // (kern_event.c) runs `filt_pipewrite`, which finds the buffer still
        // full and leaves the knote inactive, and `SLIST_INIT` then drops it
        // from that list. A re-arm's `EV_ADD` (`kqueue_register`) re-runs the
        // filter, which finds the reader gone: write-closed (the backend's docs,
        // "Kernel differences").
        assert_no_events(&p, 2, Duration::from_millis(50));
        p.disarm(t).unwrap();
        p.arm(t, Interest::WRITABLE).unwrap();
    }
    let ev = expect_one(&p, t);
    assert!(ev.is_writable() && ev.is_write_closed(), "{ev:?}");
    assert!(!ev.is_readable() && !ev.is_read_closed(), "{ev:?}");
    p.deregister(t).unwrap();
}

/// Issue 8.6: the peer's `shutdown(SHUT_WR)` with both directions armed: readable
/// and read-closed, not write-closed, no error (TCP and Unix sockets).
pub fn meaning_half_close_is_read_closed_only<B: Backend>() {
    let p = poller::<B>();
    let (client, server) = tcp_pair();
    let t = p.register(&server).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let ev = expect_one(&p, t);
    assert!(ev.is_readable() && ev.is_read_closed(), "tcp {ev:?}");
    assert!(!ev.is_write_closed() && !ev.is_error(), "tcp {ev:?}");
    let (a, b) = socketpair();
    let u = p.register(&b).unwrap();
    a.shutdown(Shutdown::Write).unwrap();
    let ev = one_event(&p, u, Interest::READABLE);
    assert!(ev.is_readable() && ev.is_read_closed(), "unix {ev:?}");
    assert!(!ev.is_write_closed() && !ev.is_error(), "unix {ev:?}");
    drop(client);
}

/// A non-blocking connect to a port nothing listens on, registered with `p`
/// and armed for `interest`: the socket, its token and its one event.
fn refused_connect<B: Backend>(p: &Poller<B>, interest: Interest) -> (TcpStream, Token, Event) {
    let addr = {
        let l = tcp_listener();
        v4_addr(&l) // closed when `l` drops: nothing listens there
    };
    let s = tcp_connect_nonblocking(addr);
    let t = p.register(&s).unwrap();
    let ev = one_event(p, t, interest);
    (s, t, ev)
}

/// The refused connect's errno is in `SO_ERROR` for the caller, on every
/// kernel but libkqueue, which reads `SO_ERROR` itself to fill the event's
/// `fflags` when it reports an error (on `EPOLLERR`: `evfilt_write_copyout`
/// and `evfilt_read_copyout`), and reading it clears it: the event says error,
/// the socket has nothing pending (docs/testing.md, "On libkqueue"; libkqueue's
/// artifact, not a BSD kernel's, whose filters report `EV_EOF` with the error
/// in `fflags` and leave it there: `filt_soread`, `filt_sowrite`).
fn assert_refused_errno_kept<B: Backend>(s: &TcpStream, ev: &Event) {
    let pending = s.take_error().unwrap().and_then(|e| e.raw_os_error());
    if on_libkqueue::<B>() {
        assert_eq!(pending, None, "libkqueue read and cleared SO_ERROR: {ev:?}");
    } else {
        assert_eq!(pending, Some(libc::ECONNREFUSED), "{ev:?}");
    }
}

/// Issue 8.6: a refused non-blocking connect, armed writable: writable,
/// write-closed and error (the connect's errno is in `SO_ERROR`).
pub fn meaning_refused_connect_is_writable_write_closed_error<B: Backend>() {
    let p = poller::<B>();
    let (s, t, ev) = refused_connect(&p, Interest::WRITABLE);
    assert!(
        ev.is_writable() && ev.is_write_closed() && ev.is_error(),
        "{ev:?}"
    );
    assert!(!ev.is_readable() && !ev.is_read_closed(), "{ev:?}");
    assert_refused_errno_kept::<B>(&s, &ev);
    p.deregister(t).unwrap();
}

/// A refused non-blocking connect armed readable only: readable, read-closed
/// and error, and the connect's errno stays in `SO_ERROR` for the caller
/// (not on libkqueue, whose read filter clears it as its write filter does:
/// [`assert_refused_errno_kept`]).
pub fn meaning_refused_connect_armed_readable_is_read_closed_error<B: Backend>() {
    let p = poller::<B>();
    let (s, t, ev) = refused_connect(&p, Interest::READABLE);
    assert!(
        ev.is_readable() && ev.is_read_closed() && ev.is_error(),
        "{ev:?}"
    );
    assert!(!ev.is_writable(), "armed readable only: {ev:?}");
    assert_refused_errno_kept::<B>(&s, &ev);
    p.deregister(t).unwrap();
}

/// Issue 8.6: a reset (the peer closes with `SO_LINGER` 0), both directions armed:
/// error, read-closed and write-closed.
pub fn meaning_reset_is_error_and_both_closed<B: Backend>() {
    let p = poller::<B>();
    let (client, server) = tcp_pair();
    let t = p.register(&server).unwrap();
    close_with_reset(client);
    // A BSD kernel may report the read filter's EOF before the write filter's: arm
    // again for what has not been reported until both have been.
    let mut seen = Vec::new();
    let mut want = Interest::BOTH;
    loop {
        let ev = one_event(&p, t, want);
        seen.push(ev);
        if ev.is_read_closed() && ev.is_write_closed() {
            break;
        }
        want = match (ev.is_read_closed(), ev.is_write_closed()) {
            (true, false) => Interest::WRITABLE,
            (false, true) => Interest::READABLE,
            _ => want,
        };
        assert!(seen.len() < 4, "{seen:?}");
    }
    assert!(seen.iter().any(Event::is_error), "{seen:?}");
    p.deregister(t).unwrap();
}

/// Issue 8.6 (and 8.7 on kqueue): the socket's own `shutdown(SHUT_RDWR)` with a
/// readable interest: readable and read-closed; write-closed is not reported for a
/// direction that was not asked for (epoll says `EPOLLHUP`, kqueue only fires the
/// read filter: the same event on both).
pub fn meaning_own_shutdown_with_readable_interest_is_read_closed<B: Backend>() {
    let p = poller::<B>();
    let (_client, server) = tcp_pair();
    let t = p.register(&server).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    server.shutdown(Shutdown::Both).unwrap();
    let ev = expect_one(&p, t);
    assert!(ev.is_readable() && ev.is_read_closed(), "{ev:?}");
    assert!(!ev.is_writable() && !ev.is_write_closed(), "{ev:?}");
    p.deregister(t).unwrap();
}

/// A listening socket shut down while armed readable (the arming in the kernel,
/// a wait already made): readable and read-closed, no error, on every backend
/// (epoll, poll(2) and kqueue report it so; io_uring's request completed with the
/// wake-up's `POLLERR`, which the backend replaces by the state). No error is
/// pending (`SO_ERROR` is 0).
pub fn meaning_listener_shut_down_while_armed_is_read_closed<B: Backend>() {
    let p = poller::<B>();
    let l = tcp_listener();
    let t = p.register(&l).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    assert_no_events(&p, 1, Duration::from_millis(20));
    // SAFETY: shutdown(2) on a socket this test owns.
    assert_eq!(unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) }, 0);
    let ev = expect_one(&p, t);
    assert!(ev.is_readable() && ev.is_read_closed(), "{ev:?}");
    assert!(!ev.is_error(), "{ev:?}");
    assert_eq!(l.take_error().unwrap().map(|e| e.to_string()), None);
    p.deregister(t).unwrap();
}
