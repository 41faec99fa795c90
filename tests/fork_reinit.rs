//! Fork and re-initialisation as a runtime meets them: a fork while other
//! threads of the parent are inside the poller, the child's use of every call
//! after `reinit_after_fork`, the parent's registrations after the child
//! re-initialised, deregistered, closed or left, a grandchild, a second reinit,
//! descriptors closed before the reinit, and what the child holds (descriptors,
//! io_uring mappings) before and after.
//!
//! Each scenario forks; the child runs its part under an alarm (a hang is a
//! SIGALRM, not a stuck test run) and leaves by `_exit(2)` with a code that
//! names the first check that failed (0: all passed). Every backend that runs
//! here: epoll and poll(2) in the default build, kqueue with
//! `--cfg pollshot_libkqueue`, io_uring with `--features io-uring`.
#![cfg(target_os = "linux")]

use pollshot::{Backend, Events, Interest, Poller, Token};
use std::io::{self, ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Trials of each racy scenario (20; `POLLSHOT_FORK_TRIALS` to probe further).
fn trials() -> usize {
    std::env::var("POLLSHOT_FORK_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}
/// Seconds a child may run before its alarm ends it (a hang; `POLLSHOT_FORK_ALARM`
/// to leave time to attach a debugger).
fn child_alarm() -> u32 {
    std::env::var("POLLSHOT_FORK_ALARM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}
/// Only turns a lost event into a failure.
const LOST_AFTER: Duration = Duration::from_secs(20);

/// One forking test at a time: a child holds every descriptor of the process.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    let g = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    #[cfg(pollshot_libkqueue)]
    {
        extern "C" {
            fn libkqueue_drain_pending_close();
        }
        // SAFETY: no arguments; libkqueue is linked and exports it
        // (tests/common/mod.rs, `forking`).
        unsafe { libkqueue_drain_pending_close() };
    }
    g
}

/// How a child ended: `Ok(code)` from `_exit`, `Err` naming the signal.
fn wait(pid: libc::pid_t) -> Result<i32, String> {
    let mut status = 0;
    loop {
        // SAFETY: our own child, a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        assert_eq!(io::Error::last_os_error().kind(), ErrorKind::Interrupted);
    }
    if libc::WIFEXITED(status) {
        Ok(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        Err(if sig == libc::SIGALRM {
            format!("hung: killed by SIGALRM after {} s", child_alarm())
        } else {
            format!("killed by signal {sig}")
        })
    } else {
        Err(format!("status {status:#x}"))
    }
}

/// Forks; the child runs `child` under an alarm and `_exit`s with its code (99:
/// it panicked). Returns the child's pid in the parent.
fn spawn_child(child: impl FnOnce() -> i32) -> libc::pid_t {
    let alarm = child_alarm();
    // SAFETY: fork(2) from a multi-threaded test process: the child runs
    // `child` (system calls, glibc's malloc, which fork leaves usable) and
    // leaves by _exit(2).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: alarm(2) and _exit(2) take plain integers.
        unsafe { libc::alarm(alarm) };
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(99);
        // SAFETY: as above; no destructor or atexit handler of the parent's runs.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// [`spawn_child`] and [`wait`], asserting the child exited 0.
#[track_caller]
fn in_child(what: &str, child: impl FnOnce() -> i32) {
    let pid = spawn_child(child);
    match wait(pid) {
        Ok(0) => {}
        Ok(code) => panic!("{what}: the child exited {code}"),
        Err(how) => panic!("{what}: the child {how}"),
    }
}

/// The index (from 1) of the first false check, or 0.
fn first_failed(checks: &[bool]) -> i32 {
    checks.iter().position(|ok| !ok).map_or(0, |i| i as i32 + 1)
}

fn pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    (a, b)
}

fn drain(mut s: &UnixStream) {
    let mut buf = [0u8; 256];
    while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
}

/// Delivers until one event for each of `tokens` came (and none for another
/// token, none twice); false on anything else or after [`LOST_AFTER`].
fn got_each<B: Backend>(p: &Poller<B>, tokens: &[Token]) -> bool {
    let mut seen = vec![false; tokens.len()];
    let mut events = Events::with_capacity(64);
    let deadline = std::time::Instant::now() + LOST_AFTER;
    while seen.iter().any(|s| !s) {
        if std::time::Instant::now() > deadline {
            eprintln!("lost: {tokens:?} seen {seen:?}");
            return false;
        }
        match p.deliver(&mut events, Some(Duration::from_millis(50))) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("deliver: {e}");
                return false;
            }
        }
        for ev in &events {
            match tokens.iter().position(|t| *t == ev.token()) {
                Some(i) if !seen[i] => seen[i] = true,
                other => {
                    eprintln!("unexpected {ev:?} ({other:?}) for {tokens:?}");
                    return false;
                }
            }
        }
    }
    true
}

/// Delivers until an event for `want` came, allowing events for `among`.
fn saw<B: Backend>(p: &Poller<B>, want: Token, among: &[Token]) -> bool {
    let mut events = Events::with_capacity(64);
    let deadline = std::time::Instant::now() + LOST_AFTER;
    let (mut calls, mut got) = (0, 0);
    while std::time::Instant::now() < deadline {
        calls += 1;
        if let Err(e) = p.deliver(&mut events, Some(Duration::from_millis(50))) {
            eprintln!("saw: deliver: {e}");
            return false;
        }
        got += events.len();
        if let Some(e) = events.iter().find(|e| !among.contains(&e.token())) {
            eprintln!("saw: unexpected {e:?}");
            return false;
        }
        if events.iter().any(|e| e.token() == want) {
            return true;
        }
    }
    eprintln!("saw: no event for {want:?} in {calls} delivers ({got} other events)");
    #[cfg(feature = "stats")]
    eprintln!("saw: stats {:?}, waiters {}", p.stats(), p.waiters());
    false
}

/// No event within a few short waits.
fn quiet<B: Backend>(p: &Poller<B>) -> bool {
    let mut events = Events::with_capacity(8);
    for _ in 0..3 {
        if p.deliver(&mut events, Some(Duration::from_millis(5)))
            .unwrap_or(1)
            != 0
        {
            eprintln!("unexpected events: {:?}", events.iter().collect::<Vec<_>>());
            return false;
        }
    }
    true
}

/// Open descriptors of this process (on libkqueue once it has closed every
/// kqueue dropped so far: it frees them on its monitoring thread).
fn open_fds() -> usize {
    #[cfg(pollshot_libkqueue)]
    {
        extern "C" {
            fn libkqueue_drain_pending_close();
        }
        // SAFETY: as in `serial`.
        unsafe { libkqueue_drain_pending_close() };
    }
    std::fs::read_dir("/proc/self/fd").map_or(usize::MAX, |d| d.count() - 1)
}

/// io_uring mappings of this process.
fn ring_maps() -> usize {
    std::fs::read_to_string("/proc/self/maps").map_or(usize::MAX, |m| {
        m.lines().filter(|l| l.contains("io_uring")).count()
    })
}

/// After a reinit, every call of the API works in the child on a fresh pair and
/// on the inherited, armed registration `inherited` (whose peer is `peer`):
/// register, arm, deliver, disarm, notify, deregister, shutdown. 0 or 20+ the
/// failed check.
fn use_every_call<B: Backend>(p: &Poller<B>, inherited: Token, mut peer: &UnixStream) -> i32 {
    let (mut a, b) = pair();
    let Ok(t) = p.register_with(&b, 77) else {
        return 20;
    };
    if p.arm(t, Interest::READABLE).is_err() {
        return 21;
    }
    if a.write_all(b"x").is_err() || !got_each(p, &[t]) {
        return 22;
    }
    // The inherited arming fires here.
    if peer.write_all(b"i").is_err() || !got_each(p, &[inherited]) {
        return 23;
    }
    // Disarm then re-arm.
    if p.arm(t, Interest::READABLE).is_err() || p.disarm(t).is_err() || !quiet(p) {
        return 24;
    }
    if p.arm(t, Interest::READABLE).is_err() || !got_each(p, &[t]) {
        return 25;
    }
    // A notify ends a blocking deliver (a lost one is the alarm).
    let mut events = Events::with_capacity(8);
    if p.notify().is_err() || p.deliver(&mut events, None).map_or(true, |n| n != 0) {
        return 26;
    }
    let len = p.len();
    if p.deregister(t).is_err() || p.len() != len - 1 {
        return 27;
    }
    if p.deregister(inherited).is_err() {
        return 28;
    }
    if p.shutdown().is_err() || p.deliver(&mut events, None).is_err() || !events.is_shutdown() {
        return 29;
    }
    drop((a, b));
    0
}

// ---------------------------------------------------------------------------
// Scenarios, generic over the backend.

/// A fork while other threads of the parent are inside the poller: two blocked
/// in `deliver`, one arming and disarming in a loop, one arming an always-ready
/// registration (a regular file: each arm queues a synthetic event). The child
/// re-initialises and uses every call; the parent then sees every readiness it
/// armed for. 20 trials.
pub fn fork_while_threads_deliver_and_arm<B: Backend + 'static>() {
    let _serial = serial();
    let p = Arc::new(Poller::<B>::with_backend().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    // Pairs the delivering threads take events for: re-armed by the main thread.
    let pairs: Vec<_> = (0..4).map(|_| pair()).collect();
    let tokens: Vec<Token> = pairs.iter().map(|(_, b)| p.register(b).unwrap()).collect();
    for t in &tokens {
        p.arm(*t, Interest::READABLE).unwrap();
    }
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for _ in 0..2 {
        let (p, tx) = (p.clone(), tx.clone());
        threads.push(std::thread::spawn(move || {
            let mut events = Events::with_capacity(16);
            loop {
                match p.deliver(&mut events, None) {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => panic!("parent deliver: {e}"),
                }
                for ev in &events {
                    tx.send(ev.token()).unwrap();
                }
                if events.is_shutdown() {
                    return;
                }
            }
        }));
    }
    // The arm in flight: a registration armed and disarmed without pause.
    let (_xa, xb) = pair();
    let x = p.register(&xb).unwrap();
    {
        let (p, stop) = (p.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                p.arm(x, Interest::READABLE).unwrap();
                p.disarm(x).unwrap();
            }
        }));
    }
    let (peer, b) = pair();
    let inherited = p.register(&b).unwrap();
    for trial in 0..trials() {
        p.arm(inherited, Interest::READABLE).unwrap();
        let pid = spawn_child(|| {
            // SAFETY: only this thread exists in the child, so nothing else
            // reads the poller while it is changed. (An Arc-shared poller has
            // no other way to `reinit_after_fork`, which takes `&mut self`:
            // `Arc::get_mut` fails, the parent's threads' counts are copied.)
            let p = unsafe { &mut *(Arc::as_ptr(&p) as *mut Poller<B>) };
            if p.reinit_after_fork().is_err() {
                return 10;
            }
            if p.len() != tokens.len() + 2 {
                return 11;
            }
            use_every_call(p, inherited, &peer)
        });
        let child = wait(pid);
        assert_eq!(child, Ok(0), "trial {trial}: the child");
        // The child wrote to `peer` (code 23 onwards): the parent's arming of
        // `inherited` fires too; take it here if the deliverers did.
        drain(&b);
        // The parent: each pair written once is delivered once.
        for (a, _) in &pairs {
            let mut a = a;
            a.write_all(b"p").unwrap();
        }
        let mut seen: Vec<Token> = Vec::new();
        while seen.len() < tokens.len() {
            let t = rx
                .recv_timeout(LOST_AFTER)
                .unwrap_or_else(|_| panic!("trial {trial}: parent lost events, got {seen:?}"));
            if t == inherited {
                continue;
            }
            assert!(
                tokens.contains(&t) && !seen.contains(&t),
                "trial {trial}: {t:?}"
            );
            seen.push(t);
        }
        for ((_, b), t) in pairs.iter().zip(&tokens) {
            drain(b);
            p.arm(*t, Interest::READABLE).unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    p.shutdown().unwrap();
    for t in threads {
        t.join().unwrap();
    }
}

/// A fork while another thread arms always-ready registrations (copies of a
/// regular file: each arm queues a synthetic event under the poller's queue
/// lock, scanning the queue for the slot, so with 512 queued the lock is held
/// most of the time) and a third delivers them. The child re-initialises and
/// arms one of them and a new pair. 20 trials; a hang in the child is the
/// alarm.
pub fn fork_while_another_thread_queues_synthetic_events<B: Backend + 'static>() {
    let _serial = serial();
    let p = Arc::new(Poller::<B>::with_backend().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let file = tempfile::tempfile().unwrap();
    let copies: Vec<_> = (0..512).map(|_| file.try_clone().unwrap()).collect();
    let always: Vec<Token> = copies.iter().map(|c| p.register(c).unwrap()).collect();
    let f = always[0];
    for t in &always {
        p.arm(*t, Interest::READABLE).unwrap();
    }
    let mut threads = Vec::new();
    {
        let (p, stop, always) = (p.clone(), stop.clone(), always.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for t in always.iter().rev() {
                    p.arm(*t, Interest::READABLE).unwrap();
                }
            }
        }));
    }
    {
        let (p, stop) = (p.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut events = Events::with_capacity(4);
            while !stop.load(Ordering::Relaxed) {
                let _ = p.deliver(&mut events, Some(Duration::from_millis(1)));
            }
        }));
    }
    let mut hung = 0;
    let mut failed = Vec::new();
    for trial in 0..trials() {
        let pid = spawn_child(|| {
            // SAFETY: only this thread exists in the child (see
            // `fork_while_threads_deliver_and_arm`).
            let p = unsafe { &mut *(Arc::as_ptr(&p) as *mut Poller<B>) };
            if p.reinit_after_fork().is_err() {
                return 10;
            }
            // The others' synthetic events (those armed at the fork) may come
            // first.
            if p.arm(f, Interest::READABLE).is_err() || !saw(p, f, &always) {
                return 11;
            }
            let (mut a, b) = pair();
            let t = p.register(&b).unwrap();
            let mut among = always.clone();
            among.push(t);
            if p.arm(t, Interest::READABLE).is_err()
                || a.write_all(b"c").is_err()
                || !saw(p, t, &among)
            {
                return 12;
            }
            0
        });
        match wait(pid) {
            Ok(0) => {}
            Err(how) if how.starts_with("hung") => hung += 1,
            other => failed.push((trial, other)),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        hung == 0 && failed.is_empty(),
        "{hung} of {} children hung; failed: {failed:?}",
        trials()
    );
}

/// What the child does with the poller it inherited, in
/// [`parent_sees_every_readiness_after_the_child`].
#[derive(Clone, Copy, Debug)]
pub enum ChildDoes {
    /// Re-initialises, deregisters every registration, closes every
    /// descriptor, `_exit`s.
    ReinitDeregisterClose,
    /// Re-initialises, re-arms and delivers every registration (the peers
    /// wrote nothing: none fires), `_exit`s holding them.
    ReinitAndKeep,
    /// Never re-initialises: drops the poller, closes every descriptor,
    /// leaves by exit(3) (thread-local destructors run).
    DropWithoutReinit,
    /// Never re-initialises, touches nothing, leaves by exit(3).
    Nothing,
}

/// The parent's registrations (8, armed) keep working after the child did
/// `does`: each pair written once after the child left is delivered once.
/// Also while the child still lives (checked before it exits). 20 trials.
pub fn parent_sees_every_readiness_after_the_child<B: Backend + 'static>(does: ChildDoes) {
    let _serial = serial();
    for trial in 0..trials() {
        let mut p = Poller::<B>::with_backend().unwrap();
        let pairs: Vec<_> = (0..8).map(|_| pair()).collect();
        let tokens: Vec<Token> = pairs.iter().map(|(_, b)| p.register(b).unwrap()).collect();
        for t in &tokens {
            p.arm(*t, Interest::READABLE).unwrap();
        }
        // One wait from this thread (io_uring: it submits the arms).
        let mut events = Events::with_capacity(16);
        assert_eq!(p.deliver(&mut events, Some(Duration::ZERO)).unwrap(), 0);
        // The child says it is done through `go_r`, and waits for the parent's
        // word on `back_r` before it leaves.
        let (go_r, go_w) = pair();
        let (back_r, back_w) = pair();
        go_r.set_nonblocking(false).unwrap();
        back_r.set_nonblocking(false).unwrap();
        let pid = spawn_child(|| {
            let mut code = 0;
            match does {
                ChildDoes::ReinitDeregisterClose => {
                    if p.reinit_after_fork().is_err() {
                        return 10;
                    }
                    for t in &tokens {
                        if p.deregister(*t).is_err() {
                            code = 11;
                        }
                    }
                    for (a, b) in &pairs {
                        // SAFETY: the child's copies only.
                        unsafe { libc::close(a.as_raw_fd()) };
                        unsafe { libc::close(b.as_raw_fd()) };
                    }
                }
                ChildDoes::ReinitAndKeep => {
                    if p.reinit_after_fork().is_err() {
                        return 10;
                    }
                    for t in &tokens {
                        if p.arm(*t, Interest::READABLE).is_err() {
                            code = 12;
                        }
                    }
                    let mut events = Events::with_capacity(16);
                    if p.deliver(&mut events, Some(Duration::from_millis(1)))
                        .is_err()
                    {
                        code = 13;
                    }
                }
                ChildDoes::DropWithoutReinit => {
                    // SAFETY: dropped once, here; the child never touches `p`
                    // again and leaves by exit(3), which runs no destructor of
                    // this frame.
                    unsafe { std::ptr::drop_in_place(&mut p) };
                    for (a, b) in &pairs {
                        // SAFETY: the child's copies only.
                        unsafe { libc::close(a.as_raw_fd()) };
                        unsafe { libc::close(b.as_raw_fd()) };
                    }
                }
                ChildDoes::Nothing => {}
            }
            let mut go_w = &go_w;
            let mut back_r = &back_r;
            let _ = go_w.write_all(&[code as u8]);
            let mut word = [0u8; 1];
            let _ = back_r.read_exact(&mut word);
            if matches!(does, ChildDoes::DropWithoutReinit | ChildDoes::Nothing) {
                // SAFETY: exit(3) runs this thread's TLS destructors.
                unsafe { libc::exit(code) };
            }
            code
        });
        // While the child lives: the parent's armings fire.
        let mut go = [0u8; 1];
        (&go_r).read_exact(&mut go).unwrap();
        for (a, _) in &pairs {
            let mut a = a;
            a.write_all(b"1").unwrap();
        }
        assert!(
            got_each(&p, &tokens),
            "trial {trial} ({does:?}): while the child lives"
        );
        for ((_, b), t) in pairs.iter().zip(&tokens) {
            drain(b);
            p.arm(*t, Interest::READABLE).unwrap();
        }
        (&back_w).write_all(b"x").unwrap();
        assert_eq!(wait(pid), Ok(0), "trial {trial} ({does:?}): the child");
        // After it left.
        for (a, _) in &pairs {
            let mut a = a;
            a.write_all(b"2").unwrap();
        }
        assert!(
            got_each(&p, &tokens),
            "trial {trial} ({does:?}): after the child left"
        );
        assert!(quiet(&p), "trial {trial} ({does:?})");
        // reinit in the parent is a no-op.
        p.reinit_after_fork().unwrap();
        for ((_, b), t) in pairs.iter().zip(&tokens) {
            drain(b);
            p.arm(*t, Interest::READABLE).unwrap();
        }
        (&pairs[3].0).write_all(b"3").unwrap();
        assert!(
            got_each(&p, &[tokens[3]]),
            "trial {trial} ({does:?}): after a parent reinit"
        );
        for t in &tokens {
            p.deregister(*t).unwrap();
        }
    }
}

/// Fork twice: the child re-initialises (or not), forks a grandchild that
/// re-initialises and uses every call; the child's poller, then the parent's,
/// still deliver their armed registrations.
pub fn grandchild_reinit<B: Backend + 'static>(child_reinits: bool) {
    let _serial = serial();
    let mut p = Poller::<B>::with_backend().unwrap();
    let (mut peer, b) = pair();
    let t = p.register(&b).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let mut events = Events::with_capacity(4);
    assert_eq!(p.deliver(&mut events, Some(Duration::ZERO)).unwrap(), 0);
    in_child("child", || {
        if child_reinits {
            if p.reinit_after_fork().is_err() {
                return 10;
            }
            let mut events = Events::with_capacity(4);
            if p.deliver(&mut events, Some(Duration::ZERO)).is_err() {
                return 11;
            }
        }
        let g = spawn_child(|| {
            if p.reinit_after_fork().is_err() {
                return 30;
            }
            use_every_call(&p, t, &peer)
        });
        match wait(g) {
            Ok(0) => {}
            Ok(code) => return code,
            Err(how) => {
                eprintln!("grandchild {how}");
                return 40;
            }
        }
        // The grandchild wrote to `peer` once: the child's arming fires.
        if !child_reinits && p.reinit_after_fork().is_err() {
            return 12;
        }
        if !got_each(&p, &[t]) {
            return 13;
        }
        0
    });
    // The parent: the grandchild's byte is there.
    assert!(got_each(&p, &[t]), "the parent's arming");
    drain(&b);
    p.arm(t, Interest::READABLE).unwrap();
    peer.write_all(b"p").unwrap();
    assert!(got_each(&p, &[t]), "the parent's re-arm");
}

/// A second reinit after a successful one is a no-op: no descriptor or ring
/// made or closed, a pending notify and an arming kept.
pub fn reinit_twice_is_a_noop<B: Backend + 'static>() {
    let _serial = serial();
    let mut p = Poller::<B>::with_backend().unwrap();
    let (_pa, pb) = pair();
    let pt = p.register(&pb).unwrap();
    p.arm(pt, Interest::READABLE).unwrap();
    in_child("reinit twice", || {
        if p.reinit_after_fork().is_err() {
            return 10;
        }
        let (mut a, b) = pair();
        let t = p.register(&b).unwrap();
        if p.arm(t, Interest::READABLE).is_err() || p.notify().is_err() {
            return 11;
        }
        let (fds, maps) = (open_fds(), ring_maps());
        if p.reinit_after_fork().is_err() {
            return 12;
        }
        if open_fds() != fds || ring_maps() != maps {
            eprintln!(
                "fds {fds} -> {}, maps {maps} -> {}",
                open_fds(),
                ring_maps()
            );
            return 13;
        }
        // The notify is still pending: a blocking deliver returns (lost: the
        // alarm).
        let mut events = Events::with_capacity(4);
        if p.deliver(&mut events, None).map_or(true, |n| n != 0) {
            return 14;
        }
        if a.write_all(b"x").is_err() || !got_each(&p, &[t]) {
            return 15;
        }
        0
    });
}

/// Descriptors closed in the child before its reinit: the reinit succeeds, the
/// closed registrations answer EBADF at their next arm and deregister cleanly,
/// the open ones deliver; counts and tokens (and keys) are as inherited.
///
/// The child first frees 16 numbers below the pairs' (copies made before
/// them), so that the reinit's new instance and waker take those and not the
/// closed registrations' numbers ([`closed_number_taken_by_the_new_instance`]
/// is that case).
pub fn closed_before_reinit<B: Backend + 'static>() {
    let _serial = serial();
    let spares: Vec<_> = (0..16)
        .map(|_| std::fs::File::open("/dev/null").unwrap())
        .collect();
    let mut p = Poller::<B>::with_backend().unwrap();
    let pairs: Vec<_> = (0..6).map(|_| pair()).collect();
    assert!(spares
        .iter()
        .all(|s| s.as_raw_fd() < pairs[0].1.as_raw_fd()));
    let tokens: Vec<Token> = pairs
        .iter()
        .enumerate()
        .map(|(i, (_, b))| p.register_with(b, 1000 + i).unwrap())
        .collect();
    // 0..3 armed, 3..6 idle (4 armed then disarmed).
    for t in &tokens[..3] {
        p.arm(*t, Interest::READABLE).unwrap();
    }
    p.arm(tokens[4], Interest::READABLE).unwrap();
    p.disarm(tokens[4]).unwrap();
    in_child("closed before reinit", || {
        for s in &spares {
            // SAFETY: the child's copies only.
            unsafe { libc::close(s.as_raw_fd()) };
        }
        // Close an armed one (1) and an idle one (4).
        // SAFETY: the child's copies only.
        unsafe { libc::close(pairs[1].1.as_raw_fd()) };
        unsafe { libc::close(pairs[4].1.as_raw_fd()) };
        if let Err(e) = p.reinit_after_fork() {
            eprintln!("reinit: {e}");
            return 10;
        }
        if p.len() != 6 {
            return 11;
        }
        let ebadf = |t: Token| {
            p.arm(t, Interest::READABLE)
                .err()
                .and_then(|e| e.raw_os_error())
        };
        if ebadf(tokens[1]) != Some(libc::EBADF) || ebadf(tokens[4]) != Some(libc::EBADF) {
            eprintln!(
                "arm of closed: {:?} {:?}",
                ebadf(tokens[1]),
                ebadf(tokens[4])
            );
            return 12;
        }
        // The open ones: armed 0 and 2 still armed; idle 3 and 5 armed now.
        for i in [3, 5] {
            if p.arm(tokens[i], Interest::READABLE).is_err() {
                return 13;
            }
        }
        for i in [0, 2, 3, 5] {
            let _ = (&pairs[i].0).write_all(b"c");
        }
        let want = [tokens[0], tokens[2], tokens[3], tokens[5]];
        let mut events = Events::with_capacity(16);
        let mut keys = Vec::new();
        let deadline = std::time::Instant::now() + LOST_AFTER;
        while keys.len() < 4 && std::time::Instant::now() < deadline {
            if p.deliver(&mut events, Some(Duration::from_millis(50)))
                .is_err()
            {
                return 14;
            }
            for ev in &events {
                if !want.contains(&ev.token()) {
                    return 15;
                }
                keys.push(ev.key());
            }
        }
        keys.sort_unstable();
        if keys != [1000, 1002, 1003, 1005] {
            eprintln!("keys {keys:?}");
            return 16;
        }
        for t in &tokens {
            if p.deregister(*t).is_err() {
                return 17;
            }
        }
        if !p.is_empty() {
            return 18;
        }
        0
    });
    // The parent's table is untouched; the child wrote to pairs 0, 2, 3 and 5,
    // of which the parent armed 0 and 2 (and 1, written to by nobody).
    assert_eq!(p.len(), 6);
    assert!(got_each(&p, &[tokens[0], tokens[2]]));
    (&pairs[1].0).write_all(b"p").unwrap();
    assert!(got_each(&p, &[tokens[1]]));
}

/// The smallest case of the above: the child closes an armed registration's
/// descriptor, whose number is then the lowest free one (the child fills
/// the free numbers below it first), and re-initialises. The new instance
/// (and waker) take the lowest free numbers, this one first. Expected, as
/// documented on `reinit_after_fork`: the reinit succeeds and the
/// registration's next arm answers EBADF (it names no descriptor of the
/// caller's); a second, idle registration closed the same way answers EBADF
/// too. Exit codes: 10 the reinit failed, 11 the armed one's arm did not
/// answer EBADF, 12 the idle one's, 13 the retried reinit failed.
pub fn closed_number_taken_by_the_new_instance<B: Backend + 'static>() {
    let _serial = serial();
    let mut p = Poller::<B>::with_backend().unwrap();
    let (_a1, b1) = pair();
    let (_a2, b2) = pair();
    let armed = p.register(&b1).unwrap();
    let idle = p.register(&b2).unwrap();
    p.arm(armed, Interest::READABLE).unwrap();
    let mut events = Events::with_capacity(4);
    assert_eq!(p.deliver(&mut events, Some(Duration::ZERO)).unwrap(), 0);
    let (n1, n2) = (b1.as_raw_fd(), b2.as_raw_fd());
    let pid = spawn_child(|| {
        // Fill every free number below n1 (kept open until _exit).
        loop {
            // SAFETY: duplicates stdin's number; the copy is left open.
            let d = unsafe { libc::fcntl(0, libc::F_DUPFD, 0) };
            if d < 0 || d > n1 {
                // SAFETY: our own duplicate.
                unsafe { libc::close(d) };
                break;
            }
        }
        // SAFETY: the child's copies only.
        unsafe { libc::close(n1) };
        unsafe { libc::close(n2) };
        let r = p.reinit_after_fork();
        let mut code = 0;
        if let Err(e) = &r {
            eprintln!("{}: reinit: {e}", B::NAME);
            code = 10;
            if p.reinit_after_fork().is_err() {
                return 13;
            }
        }
        let errno = |t: Token| {
            p.arm(t, Interest::READABLE)
                .err()
                .and_then(|e| e.raw_os_error())
        };
        let (ea, ei) = (errno(armed), errno(idle));
        if code == 0 && ea != Some(libc::EBADF) {
            code = 11;
        } else if code == 0 && ei != Some(libc::EBADF) {
            code = 12;
        }
        eprintln!(
            "{}: numbers {n1} {n2}; reinit {:?}; arm after: armed {ea:?}, idle {ei:?}",
            B::NAME,
            r.map_err(|e| e.raw_os_error())
        );
        code
    });
    assert_eq!(
        wait(pid),
        Ok(0),
        "10: the reinit failed (the retry succeeded), 11: the closed armed \
         registration's arm did not answer EBADF, 12: the closed idle one's, \
         13: the retry failed too"
    );
}

/// A thread that submitted exits around the fork (io_uring ties a poll
/// request to the thread that submitted it; a thread that exits queues its
/// requests again): in the parent, a thread arms and waits once (submits) and
/// exits while the main thread forks; in the child, after the reinit, a
/// spawned thread arms and waits once, then exits, and the child's main
/// thread must still see that registration's readiness. The parent sees its
/// own. 20 trials.
pub fn submitter_exits_around_the_fork<B: Backend + 'static>() {
    let _serial = serial();
    for trial in 0..trials() {
        let p = Arc::new(Poller::<B>::with_backend().unwrap());
        let (mut a, b) = pair();
        let t = p.register(&b).unwrap();
        let submitter = {
            let p = p.clone();
            std::thread::spawn(move || {
                p.arm(t, Interest::READABLE).unwrap();
                let mut events = Events::with_capacity(4);
                p.deliver(&mut events, Some(Duration::ZERO)).unwrap();
            })
        };
        let pid = spawn_child(|| {
            // SAFETY: only this thread exists in the child (see
            // `fork_while_threads_deliver_and_arm`).
            let p = unsafe { &mut *(Arc::as_ptr(&p) as *mut Poller<B>) };
            if p.reinit_after_fork().is_err() {
                return 10;
            }
            let (mut ca, cb) = pair();
            let ct = p.register(&cb).unwrap();
            // SAFETY: the poller outlives the thread, joined below.
            let pp: &'static Poller<B> = unsafe { &*(p as *const Poller<B>) };
            let h = std::thread::spawn(move || {
                pp.arm(ct, Interest::READABLE).is_ok() && {
                    let mut events = Events::with_capacity(4);
                    pp.deliver(&mut events, Some(Duration::ZERO)).is_ok()
                }
            });
            if !h.join().unwrap_or(false) {
                return 11;
            }
            if ca.write_all(b"c").is_err() || !got_each(p, &[ct]) {
                return 12;
            }
            0
        });
        submitter.join().unwrap();
        assert_eq!(wait(pid), Ok(0), "trial {trial}: the child");
        a.write_all(b"p").unwrap();
        assert!(got_each(&p, &[t]), "trial {trial}: the parent's arming");
    }
}

/// What the child holds: descriptors and io_uring mappings before the reinit,
/// after it, after a second one, after dropping the poller; and a twin
/// poller dropped without reinit. The poller's own descriptors are counted
/// in the parent (made and dropped around a twin).
pub fn child_holds_no_leak<B: Backend + 'static>() {
    let _serial = serial();
    // The poller's own descriptors, used as below, in the parent.
    let base = open_fds();
    let (own, poller, twin, pairs) = {
        let pairs: Vec<_> = (0..4).map(|_| pair()).collect();
        let with_pairs = open_fds();
        let p = Poller::<B>::with_backend().unwrap();
        let twin = Poller::<B>::with_backend().unwrap();
        for (_, b) in &pairs {
            let t = p.register(b).unwrap();
            p.arm(t, Interest::READABLE).unwrap();
            let t = twin.register(b).unwrap();
            twin.arm(t, Interest::READABLE).unwrap();
        }
        let mut events = Events::with_capacity(4);
        p.deliver(&mut events, Some(Duration::ZERO)).unwrap();
        twin.deliver(&mut events, Some(Duration::ZERO)).unwrap();
        let own = (open_fds() - with_pairs) / 2;
        (own, p, twin, pairs)
    };
    let _ = base;
    let mut p = Some(poller);
    let mut twin = Some(twin);
    let pid = spawn_child(|| {
        let c0 = open_fds();
        let m0 = ring_maps();
        let r1 = p.as_mut().unwrap().reinit_after_fork().is_ok();
        let (c1, m1) = (open_fds(), ring_maps());
        let r2 = p.as_mut().unwrap().reinit_after_fork().is_ok();
        let (c2, m2) = (open_fds(), ring_maps());
        drop(twin.take());
        let (c3, m3) = (open_fds(), ring_maps());
        drop(p.take());
        let (c4, m4) = (open_fds(), ring_maps());
        eprintln!(
            "{}: own {own}; fds {c0} reinit {c1} again {c2} twin dropped {c3} poller dropped {c4}; \
             io_uring maps {m0} {m1} {m2} {m3} {m4}",
            B::NAME
        );
        if cfg!(pollshot_libkqueue) && B::NAME == "kqueue" {
            // libkqueue's kqueue is a descriptor the child inherits (a BSD's
            // is not), left alone by design; it also makes its own threads'
            // descriptors again in the child. Only the second reinit is
            // checked there.
            return first_failed(&[r1 && r2, true, true, c2 == c1]);
        }
        first_failed(&[
            r1 && r2,
            m0 == 0,
            c1 == c0,
            c2 == c1 && m2 == m1,
            c3 == c2 - own,
            c4 == c3 - own,
            m4 == 0,
        ])
    });
    let r = wait(pid);
    drop(pairs);
    assert_eq!(
        r,
        Ok(0),
        "1: a reinit failed, 2: the child has io_uring mappings before reinit, \
         3: the reinit changed the descriptor count, 4: the second reinit changed \
         something, 5: dropping the twin did not close its own, 6: dropping the \
         reinitialised poller did not close its own, 7: io_uring mappings left"
    );
}

macro_rules! scenarios {
    ($module:ident, $backend:ty) => {
        mod $module {
            use super::*;
            type B = $backend;

            #[test]
            fn fork_while_threads_deliver_and_arm() {
                super::fork_while_threads_deliver_and_arm::<B>();
            }
            #[test]
            fn fork_while_another_thread_queues_synthetic_events() {
                super::fork_while_another_thread_queues_synthetic_events::<B>();
            }
            #[test]
            fn parent_after_child_reinit_deregister_close() {
                parent_sees_every_readiness_after_the_child::<B>(ChildDoes::ReinitDeregisterClose);
            }
            #[test]
            fn parent_after_child_reinit_and_keep() {
                parent_sees_every_readiness_after_the_child::<B>(ChildDoes::ReinitAndKeep);
            }
            #[test]
            fn parent_after_child_drop_without_reinit() {
                parent_sees_every_readiness_after_the_child::<B>(ChildDoes::DropWithoutReinit);
            }
            #[test]
            fn parent_after_child_does_nothing() {
                parent_sees_every_readiness_after_the_child::<B>(ChildDoes::Nothing);
            }
            #[test]
            fn grandchild_after_child_reinit() {
                grandchild_reinit::<B>(true);
            }
            #[test]
            fn grandchild_without_child_reinit() {
                grandchild_reinit::<B>(false);
            }
            #[test]
            fn reinit_twice_is_a_noop() {
                super::reinit_twice_is_a_noop::<B>();
            }
            #[test]
            fn closed_before_reinit() {
                super::closed_before_reinit::<B>();
            }
            #[test]
            #[cfg_attr(
                pollshot_libkqueue,
                ignore = "libkqueue makes descriptors of its own in a child, which the backend \
                          cannot know: they take the closed numbers (a BSD kqueue is one \
                          descriptor)"
            )]
            fn closed_number_taken_by_the_new_instance() {
                super::closed_number_taken_by_the_new_instance::<B>();
            }
            #[test]
            fn submitter_exits_around_the_fork() {
                super::submitter_exits_around_the_fork::<B>();
            }
            #[test]
            fn child_holds_no_leak() {
                super::child_holds_no_leak::<B>();
            }
        }
    };
}

scenarios!(epoll, pollshot::backends::Epoll);
scenarios!(blocking, pollshot::backends::Blocking);
#[cfg(pollshot_kqueue)]
scenarios!(kqueue, pollshot::backends::Kqueue);
#[cfg(feature = "io-uring")]
scenarios!(uring, pollshot::backends::Uring);
