//! Generic test bodies: the model on every descriptor kind, exact system call
//! counts, threads, notify and bad input. Each runs on every backend through
//! `suite!`; where backends document different numbers the body branches on
//! `B::NAME` and says why.

use super::*;
use pollshot::Interest;
#[cfg(feature = "stats")]
use pollshot::Stats;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The model on one descriptor, step by step:
/// 1. register, arm `interest`; unless `always_ready`, nothing is delivered yet;
/// 2. `make_ready()`; exactly one event follows, checked by `check`;
/// 3. nothing more until re-armed, though the descriptor is still ready;
/// 4. re-arm without draining: delivered again, once (level-triggered);
/// 5. arm then disarm: nothing;
/// 6. deregister; the token names nothing afterwards.
///
/// What `make_ready` returns is kept alive until the end (a connecting client).
fn model<B: Backend, G>(
    register: impl FnOnce(&Poller<B>) -> io::Result<Token>,
    interest: Interest,
    always_ready: bool,
    make_ready: impl FnOnce() -> G,
    check: impl Fn(&Event),
) -> G {
    let p = poller::<B>();
    let t = register(&p).unwrap();
    p.arm(t, interest).unwrap();
    if !always_ready {
        assert_no_events(&p, 2, Duration::from_millis(10));
    }
    let guard = make_ready();
    for round in 0..2 {
        let ev = expect_one(&p, t);
        check(&ev);
        assert!(
            !ev.is_error(),
            "round {round}: unexpected error flag: {ev:?}"
        );
        // Still ready, but the delivery disarmed it: nothing is delivered, and the
        // waits really wait (a backend that left it armed would return at once
        // with an event dropped as stale: a busy loop).
        #[cfg(feature = "stats")]
        let before = p.stats();
        let start = Instant::now();
        assert_no_events(&p, 3, Duration::from_millis(5));
        assert!(
            start.elapsed() >= Duration::from_millis(15),
            "deliver did not wait: {:?}",
            start.elapsed()
        );
        #[cfg(feature = "stats")]
        if B::NAME != "kqueue" {
            // kqueue may report the other filter of a BOTH arming once more (stale).
            let s = p.stats().since(&before);
            assert_eq!(
                s.stale, 0,
                "round {round}: a delivered registration kept firing: {s:?}"
            );
        }
        // Re-arm without draining: the level still holds.
        p.arm(t, interest).unwrap();
    }
    // The third arming is cancelled before anything is delivered.
    p.disarm(t).unwrap();
    assert_no_events(&p, 3, Duration::from_millis(10));
    p.deregister(t).unwrap();
    assert_eq!(err_kind(p.arm(t, interest)), io::ErrorKind::NotFound);
    assert!(p.is_empty());
    guard
}

fn readable(ev: &Event) {
    assert!(ev.is_readable(), "expected readable: {ev:?}");
}

fn writable(ev: &Event) {
    assert!(ev.is_writable(), "expected writable: {ev:?}");
}

fn both(ev: &Event) {
    assert!(
        ev.is_readable() && ev.is_writable(),
        "expected readable and writable: {ev:?}"
    );
}

/// A Unix stream socketpair, readable.
pub fn kind_socketpair<B: Backend, D: Fd>() {
    let (a, b) = D::socketpair();
    model::<B, _>(
        |p| b.register(p),
        Interest::READABLE,
        false,
        || a.write_all(b"x"),
        readable,
    );
    // Nothing was drained by the poller.
    assert_eq!(b.drain(), 1);
}

/// A pipe's read end, readable.
pub fn kind_pipe_read<B: Backend, D: Fd>() {
    let (r, w) = D::pipe();
    model::<B, _>(
        |p| r.register(p),
        Interest::READABLE,
        false,
        || w.write_all(b"x"),
        readable,
    );
    assert_eq!(r.drain(), 1);
}

/// A pipe's write end, writable once the reader makes room.
pub fn kind_pipe_write<B: Backend, D: Fd>() {
    let (r, w) = D::pipe();
    assert!(w.fill() > 0);
    model::<B, _>(
        |p| w.register(p),
        Interest::WRITABLE,
        false,
        || assert!(r.drain() > 0),
        writable,
    );
}

/// A FIFO made with mkfifo(3), readable.
pub fn kind_fifo<B: Backend>() {
    let dir = tempfile::tempdir().unwrap();
    let (mut r, mut w) = fifo(dir.path());
    model::<B, _>(
        |p| p.register(&r),
        Interest::READABLE,
        false,
        || w.write_all(b"x").unwrap(),
        readable,
    );
    assert_eq!(drain(&mut r), 1);
}

/// A TCP listener: readable when a connection waits to be accepted.
pub fn kind_tcp_listener<B: Backend>() {
    let l = tcp_listener();
    let addr = l.local_addr().unwrap();
    let client = model::<B, _>(
        |p| p.register(&l),
        Interest::READABLE,
        false,
        || TcpStream::connect(addr).unwrap(),
        readable,
    );
    // The event was for a real pending connection, still there (not accepted).
    let (server, peer) = l.accept().expect("a pending connection");
    assert_eq!(peer, client.local_addr().unwrap());
    drop(server);
}

/// A connected TCP stream, readable.
pub fn kind_tcp_stream<B: Backend>() {
    let (mut client, mut server) = tcp_pair();
    model::<B, _>(
        |p| p.register(&server),
        Interest::READABLE,
        false,
        || client.write_all(b"x").unwrap(),
        readable,
    );
    assert_eq!(drain(&mut server), 1);
}

/// An eventfd, readable once its counter is non-zero.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn kind_eventfd<B: Backend>() {
    let mut efd = eventfd();
    let mut w = efd.try_clone().unwrap();
    model::<B, _>(
        |p| p.register(&efd),
        Interest::READABLE,
        false,
        || w.write_all(&3u64.to_ne_bytes()).unwrap(),
        readable,
    );
    let mut word = [0u8; 8];
    efd.read_exact(&mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 3);
}

/// A regular file: always ready both ways (epoll refuses it with EPERM; poll(2)
/// reports it ready), one delivery per arming.
pub fn kind_regular_file<B: Backend>() {
    let f = regular_file();
    model::<B, _>(|p| p.register(&f), Interest::BOTH, true, || (), both);
}

/// `/dev/null`: always ready both ways, like a regular file.
pub fn kind_dev_null<B: Backend>() {
    let f = dev_null();
    model::<B, _>(|p| p.register(&f), Interest::BOTH, true, || (), both);
}

// ---------------------------------------------------------------------------
// Exact counts (feature `stats`). Commands (adds, modifies, quiets, deletes) are the
// same on every backend: the state machine issues them. `ctl_calls` differs, as
// `assert_ctl` says.

/// `register` costs nothing; the first arm is one add.
#[cfg(feature = "stats")]
pub fn stats_register_is_free_first_arm_is_one_add<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (_a, b) = D::socketpair();
    let (t, s) = delta(&p, || b.register(&p).unwrap());
    assert_eq!(s, Stats::default(), "register made a system call: {s:?}");
    let ((), s) = delta(&p, || p.arm(t, Interest::READABLE).unwrap());
    assert_eq!(
        (s.adds, s.modifies, s.quiets, s.deletes),
        (1, 0, 0, 0),
        "{s:?}"
    );
    assert_ctl::<B>(&s);
    assert_eq!((s.wakes, s.wake_reads, s.waits), (0, 0, 0), "{s:?}");
}

/// After the first arm, each wait cycle (arm, deliver, read) is exactly one modify
/// and no delete, no waker traffic, no stale event: 100 round trips, totals exact.
#[cfg(feature = "stats")]
pub fn stats_100_round_trips_cost_one_modify_each<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (a, b) = D::socketpair();
    let t = b.register(&p).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let mut buf = [0u8; 64];
    let ((), s) = delta(&p, || {
        for i in 0..100u32 {
            a.write_all(&[i as u8; 64]);
            let ev = expect_one(&p, t);
            assert!(ev.is_readable());
            assert_eq!(b.read_some(&mut buf), 64);
            p.arm(t, Interest::READABLE).unwrap();
        }
    });
    assert_eq!(s.adds, 0, "{s:?}");
    assert_eq!(s.modifies, 100, "one modify per wait cycle: {s:?}");
    assert_eq!((s.quiets, s.deletes), (0, 0), "{s:?}");
    assert_ctl::<B>(&s);
    assert_eq!(
        (s.wakes, s.wake_reads),
        (0, 0),
        "no notify, no waker traffic: {s:?}"
    );
    assert_eq!(s.stale, 0, "{s:?}");
    assert_eq!(
        (s.not_found_to_add, s.exists_to_modify, s.not_pollable),
        (0, 0, 0),
        "{s:?}"
    );
    if B::NAME != "kqueue" {
        // Data is written before each deliver: one wait system call each (io_uring:
        // the enter that submits the re-arm, which completes at once).
        assert_eq!(s.waits, 100, "{s:?}");
    }
}

/// Arming an armed registration for the same interest issues nothing; for another
/// interest, one modify.
#[cfg(feature = "stats")]
pub fn stats_arm_of_armed_is_free<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (_a, b) = D::socketpair();
    let t = b.register(&p).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let ((), s) = delta(&p, || {
        for _ in 0..10 {
            p.arm(t, Interest::READABLE).unwrap();
        }
    });
    assert_eq!(
        s,
        Stats::default(),
        "re-arming an armed registration cost: {s:?}"
    );
    let ((), s) = delta(&p, || p.arm(t, Interest::BOTH).unwrap());
    assert_eq!(
        (s.adds, s.modifies, s.quiets, s.deletes),
        (0, 1, 0, 0),
        "{s:?}"
    );
    assert_ctl::<B>(&s);
    // The new interest is in force: the socket is writable at once.
    assert!(expect_one(&p, t).is_writable());
}

/// Disarming an armed registration is one quiet; disarming an idle or fresh one is
/// free.
#[cfg(feature = "stats")]
pub fn stats_disarm_is_one_quiet_and_idle_disarm_is_free<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (_a, b) = D::socketpair();
    let t = b.register(&p).unwrap();
    let ((), s) = delta(&p, || p.disarm(t).unwrap());
    assert_eq!(s, Stats::default(), "disarm of a fresh registration: {s:?}");
    p.arm(t, Interest::READABLE).unwrap();
    let ((), s) = delta(&p, || p.disarm(t).unwrap());
    assert_eq!(
        (s.adds, s.modifies, s.quiets, s.deletes),
        (0, 0, 1, 0),
        "{s:?}"
    );
    assert_ctl::<B>(&s);
    let ((), s) = delta(&p, || {
        p.disarm(t).unwrap();
        p.disarm(t).unwrap();
    });
    assert_eq!(s, Stats::default(), "disarm of an idle registration: {s:?}");
    // Idle after a delivery: disarm is free too.
    p.arm(t, Interest::WRITABLE).unwrap();
    expect_one(&p, t);
    let ((), s) = delta(&p, || p.disarm(t).unwrap());
    assert_eq!(s, Stats::default(), "disarm after a delivery: {s:?}");
}

/// A deliver that was not notified reads nothing from the waker; one notify is one
/// wake and one drain.
#[cfg(feature = "stats")]
pub fn stats_deliver_without_notify_reads_no_waker<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (a, b) = D::socketpair();
    let t = b.register(&p).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let (got, s) = delta(&p, || deliver_n(&p, 3, Duration::from_millis(2)));
    assert!(got.is_empty());
    assert_eq!((s.wakes, s.wake_reads), (0, 0), "{s:?}");
    assert!(s.waits >= 3, "{s:?}");
    a.write_all(b"x");
    let (_, s) = delta(&p, || expect_one(&p, t));
    assert_eq!((s.wakes, s.wake_reads), (0, 0), "{s:?}");
    let (n, s) = delta(&p, || {
        p.notify().unwrap();
        p.deliver(&mut Events::with_capacity(8), Some(Duration::ZERO))
            .unwrap()
    });
    assert_eq!(n, 0);
    if B::NAME == "uring" {
        // No waiter was blocked: the wake-up is a flag the deliver takes, no
        // system call (backends/uring/).
        assert_eq!((s.wakes, s.wake_reads), (0, 0), "{s:?}");
    } else {
        assert_eq!(s.wakes, 1, "{s:?}");
    }
    if B::NAME == "epoll" || B::NAME == "ports" {
        // The eventfd is edge-triggered, a port_send event is taken by the wait
        // that retrieves it: a wake-up needs no drain.
        assert_eq!(s.wake_reads, 0, "{s:?}");
    } else if B::NAME == "blocking" {
        // One pipe read that comes back short.
        assert_eq!(s.wake_reads, 1, "{s:?}");
    }
}

/// Deregistering a registration the kernel holds is one delete (armed or idle);
/// one that was never armed costs nothing.
#[cfg(feature = "stats")]
pub fn stats_deregister_is_one_delete_only_when_in_kernel<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (_a, b) = D::socketpair();
    let (_c, d) = D::socketpair();
    let (_e, f) = D::socketpair();
    let armed = b.register(&p).unwrap();
    let idle = d.register(&p).unwrap();
    let fresh = f.register(&p).unwrap();
    p.arm(armed, Interest::READABLE).unwrap();
    p.arm(idle, Interest::WRITABLE).unwrap();
    expect_one(&p, idle);
    for (t, deletes) in [(armed, 1), (idle, 1), (fresh, 0)] {
        let ((), s) = delta(&p, || p.deregister(t).unwrap());
        assert_eq!(
            (s.adds, s.modifies, s.quiets, s.deletes),
            (0, 0, 0, deletes),
            "{t:?}: {s:?}"
        );
        assert_ctl::<B>(&s);
    }
    assert!(p.is_empty());
}

// ---------------------------------------------------------------------------

/// A socket armed then disarmed whose peer then closes: 100 delivers with a 1 ms
/// timeout return nothing (the quieted registration may fire once in the kernel, and
/// is dropped as stale), and the next arm reports the hang-up once.
pub fn hangup_while_disarmed_does_not_spin<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (a, b) = D::socketpair();
    let t = b.register(&p).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    p.disarm(t).unwrap();
    drop(a);
    #[cfg(feature = "stats")]
    let before = p.stats();
    let got = deliver_n(&p, 100, Duration::from_millis(1));
    assert!(
        got.is_empty(),
        "a disarmed registration was delivered: {got:?}"
    );
    #[cfg(feature = "stats")]
    {
        let s = p.stats().since(&before);
        assert!(
            s.stale <= 1,
            "the quieted registration fired more than once: {s:?}"
        );
        match B::NAME {
            // The kernel adds EPOLLHUP to the quiet MOD; with EPOLLONESHOT it
            // fires exactly once (docs/design.md, "Kernel facts we rely on").
            "epoll" => assert_eq!(s.stale, 1, "{s:?}"),
            // Not in the polled set at all.
            "blocking" => assert_eq!(s.stale, 0, "{s:?}"),
            _ => {}
        }
    }
    for _ in 0..2 {
        p.arm(t, Interest::READABLE).unwrap();
        let ev = expect_one(&p, t);
        assert!(ev.is_readable() && ev.is_read_closed(), "{ev:?}");
        assert_no_events(&p, 5, Duration::from_millis(1));
    }
    assert_eq!(b.drain(), 0, "EOF");
    p.deregister(t).unwrap();
}

/// Four threads deliver on one poller over 64 socketpairs until 10,000 events have
/// been handled. Each pair carries one byte at a time: a delivery reads it, writes
/// the next one, and re-arms. Asserts: no two threads hold one pair at once, every
/// delivery finds its byte (a second delivery for one arming would find none), each
/// pair gets exactly its share, and none is lost (all 10,000 arrive).
pub fn threads_4_deliver_64_pairs_10000_events_exactly_once<B: Backend, D: Fd>() {
    const PAIRS: usize = 64;
    const THREADS: usize = 4;
    const TOTAL: usize = 10_000;
    struct Pair<D> {
        a: D,
        b: D,
        busy: AtomicBool,
        delivered: AtomicUsize,
        quota: usize,
    }
    let p = Arc::new(poller::<B>());
    let mut pairs = Vec::new();
    let mut by_token = HashMap::new();
    for i in 0..PAIRS {
        let (a, b) = D::socketpair();
        let quota = TOTAL / PAIRS + usize::from(i < TOTAL % PAIRS);
        let t = b.register(&p).unwrap();
        by_token.insert(t, i);
        pairs.push((
            t,
            Pair {
                a,
                b,
                busy: AtomicBool::new(false),
                delivered: AtomicUsize::new(0),
                quota,
            },
        ));
    }
    let tokens: Vec<Token> = pairs.iter().map(|(t, _)| *t).collect();
    let pairs: Arc<Vec<Pair<D>>> = Arc::new(pairs.into_iter().map(|(_, pair)| pair).collect());
    assert_eq!(pairs.iter().map(|x| x.quota).sum::<usize>(), TOTAL);
    let by_token = Arc::new(by_token);
    let done = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    for (i, pair) in pairs.iter().enumerate() {
        pair.a.write_all(&[1]);
        p.arm(tokens[i], Interest::READABLE).unwrap();
    }
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (p, pairs, by_token, done, failures, tokens) =
                (p.clone(), pairs.clone(), by_token.clone(), done.clone(), failures.clone(), tokens.clone());
            std::thread::spawn(move || {
                let mut events = Events::with_capacity(16);
                while done.load(Ordering::Acquire) < TOTAL && failures.lock().unwrap().is_empty() {
                    p.deliver(&mut events, Some(Duration::from_millis(20))).unwrap();
                    for ev in &events {
                        let Some(&i) = by_token.get(&ev.token()) else {
                            failures.lock().unwrap().push(format!("unknown token {ev:?}"));
                            continue;
                        };
                        let pair = &pairs[i];
                        if pair.busy.swap(true, Ordering::AcqRel) {
                            failures.lock().unwrap().push(format!("pair {i} delivered to two threads at once"));
                            continue;
                        }
                        let mut byte = [0u8; 2];
                        match pair.b.read(&mut byte) {
                            Ok(1) => {}
                            other => failures
                                .lock()
                                .unwrap()
                                .push(format!("pair {i}: delivery without its byte ({other:?}): twice for one arming?")),
                        }
                        let n = pair.delivered.fetch_add(1, Ordering::AcqRel) + 1;
                        done.fetch_add(1, Ordering::AcqRel);
                        let more = n < pair.quota;
                        if more {
                            pair.a.write_all(&[1]);
                        }
                        pair.busy.store(false, Ordering::Release);
                        if more {
                            p.arm(tokens[i], Interest::READABLE).unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    let watch = (done.clone(), failures.clone());
    within("10,000 events over 64 pairs", move || {
        while watch.0.load(Ordering::Acquire) < TOTAL && watch.1.lock().unwrap().is_empty() {
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    for w in workers {
        w.join().unwrap();
    }
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} failures, first: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert_eq!(done.load(Ordering::Acquire), TOTAL);
    for (i, pair) in pairs.iter().enumerate() {
        assert_eq!(
            pair.delivered.load(Ordering::Acquire),
            pair.quota,
            "pair {i}"
        );
        assert!(pair.b.would_block(), "pair {i}: a byte left undelivered");
    }
    // Every pair ran out of quota disarmed: nothing more comes.
    assert_no_events(&p, 2, Duration::from_millis(5));
}

/// `notify` from another thread wakes a `deliver(None)` blocked with nothing
/// registered.
pub fn notify_wakes_blocked_deliver<B: Backend, D: Fd>() {
    let (p, _pair) = super::cases::notified_wait::<B, D>(None);
    // The notify was consumed: the registration is still armed and quiet.
    assert_no_events(&p, 2, Duration::from_millis(5));
}

/// 1,000 notifies from 4 threads while one thread loops in `deliver(None)`: the
/// last notify always ends the loop (none is lost), and they coalesce (each
/// waker write covers at least one notify).
pub fn notify_1000_from_4_threads_never_lost<B: Backend, D: Fd>() {
    const THREADS: usize = 4;
    const EACH: usize = 250;
    let p = Arc::new(poller::<B>());
    let sent = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicBool::new(false));
    let waiter = {
        let (p, finished) = (p.clone(), finished.clone());
        std::thread::spawn(move || {
            let mut events = Events::with_capacity(8);
            let mut returns = 0usize;
            loop {
                let n = p.deliver(&mut events, None).unwrap();
                assert_eq!(n, 0, "nothing is registered");
                returns += 1;
                if finished.load(Ordering::Acquire) {
                    return returns;
                }
            }
        })
    };
    let notifiers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (p, sent, finished) = (p.clone(), sent.clone(), finished.clone());
            std::thread::spawn(move || {
                for _ in 0..EACH {
                    // The last notify of all is made after `finished` is set: the
                    // waiter must return after it, whenever it lands.
                    if sent.fetch_add(1, Ordering::AcqRel) + 1 == THREADS * EACH {
                        finished.store(true, Ordering::Release);
                    }
                    p.notify().unwrap();
                }
            })
        })
        .collect();
    for n in notifiers {
        n.join().unwrap();
    }
    let returns = within("the waiter returns after the last notify", move || {
        waiter.join().unwrap()
    });
    assert!(
        (1..=THREADS * EACH).contains(&returns),
        "{returns} returns for 1,000 notifies"
    );
    #[cfg(feature = "stats")]
    {
        let s = p.stats();
        // io_uring writes its waker only for a waiter blocked in the kernel: a
        // waiter that always found a wake-up pending cost no write at all.
        let least = if B::NAME == "uring" { 0 } else { 1 };
        assert!(
            s.wakes >= least && s.wakes <= (THREADS * EACH) as u64,
            "notifies coalesce: {s:?}"
        );
    }
}

/// Notifies made before a `deliver` coalesce into one wake-up: the next deliver
/// returns at once, the one after waits its whole timeout.
pub fn notify_coalesces<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let mut events = Events::with_capacity(8);
    #[cfg(feature = "stats")]
    let before = p.stats();
    for _ in 0..10 {
        p.notify().unwrap();
    }
    assert_eq!(p.deliver(&mut events, Some(Duration::ZERO)).unwrap(), 0);
    #[cfg(feature = "stats")]
    {
        let s = p.stats().since(&before);
        // io_uring: no waiter was blocked, so no waker write at all.
        let writes = if B::NAME == "uring" { 0 } else { 1 };
        assert_eq!(s.wakes, writes, "10 notifies, one waker write: {s:?}");
    }
    let timeout = Duration::from_millis(20);
    let start = Instant::now();
    assert_eq!(p.deliver(&mut events, Some(timeout)).unwrap(), 0);
    let elapsed = start.elapsed();
    assert!(
        elapsed >= timeout,
        "a consumed notify woke a later deliver ({elapsed:?})"
    );
    // And a later notify still works.
    let p = Arc::new(p);
    p.notify().unwrap();
    let n = within("deliver(None) after a notify", move || {
        p.deliver(&mut events, None).unwrap()
    });
    assert_eq!(n, 0);
}

// ---------------------------------------------------------------------------
// Bad input: a clear io::Error, never a panic or a hang.

/// A negative descriptor number is `InvalidInput`.
pub fn bad_negative_fd<B: Backend, D: Fd>() {
    let p = poller::<B>();
    for fd in [-1, -2, i32::MIN] {
        // SAFETY: a negative number is rejected before it reaches the kernel.
        let r = unsafe { p.register_raw(fd) };
        assert_eq!(err_kind(r), io::ErrorKind::InvalidInput, "fd {fd}");
    }
    assert!(p.is_empty());
}

/// Descriptor numbers as the README promises them: on 64-bit targets every
/// non-negative `i32` has a slot; on 32-bit targets numbers below 2^20 (the slot
/// bits of a 32-bit kqueue tag, on every backend alike) work, and 2^20 and more are
/// refused with `InvalidInput` naming the limit, before any system call. A real
/// descriptor at the highest number this process may open below 2^20 (the soft
/// descriptor limit raised to the hard one; Linux's default `fs.nr_open`, 2^20,
/// caps the hard one there) is registered, armed and delivered, and deregistered.
pub fn descriptor_numbers_up_to_the_token_limit<B: Backend>() {
    const LIMIT_32: RawFd = 1 << 20;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit(2) with a valid rlimit pointer. A higher soft
    // limit only lets this process open more descriptors.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
    let top = lim.rlim_cur.min(LIMIT_32 as libc::rlim_t) as RawFd - 1;
    let p = poller::<B>();
    let (mut a, b) = socketpair();
    // The lowest free number from 64 below the top: other tests' numbers are far
    // lower (see `high_dup`), so it is the top or close to it.
    let fd = high_dup(&b, top - 64);
    let n = fd.as_raw_fd();
    assert!(n <= top && n < LIMIT_32, "{n}");
    let t = p.register(&fd).unwrap();
    assert_eq!(t.index(), n as usize);
    p.arm(t, Interest::READABLE).unwrap();
    a.write_all(b"x").unwrap();
    assert!(expect_one(&p, t).is_readable(), "number {n}");
    p.deregister(t).unwrap();
    #[cfg(target_pointer_width = "32")]
    for n in [LIMIT_32, LIMIT_32 + 1, i32::MAX] {
        let before = p.stats();
        // SAFETY: a number past the table is rejected before it reaches the
        // kernel (the system call count below checks it).
        let e = unsafe { p.register_raw(n) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "fd {n}: {e}");
        assert!(e.to_string().contains("1048576"), "fd {n}: {e}");
        assert_eq!(p.stats().since(&before).syscalls(), 0, "fd {n}");
    }
    assert!(p.is_empty());
}

/// Arming a registration whose descriptor was closed (never armed) fails with the
/// kernel's EBADF (`raw_os_error`), and leaves the registration as it was: once the
/// number names a descriptor again, arming works.
pub fn bad_closed_fd<B: Backend, D: Fd>() {
    let min_fd = D::HIGH; // this test's own range, see `Fd::HIGH`
    let p = poller::<B>();
    let (_a, b) = D::socketpair();
    let fd = b.dup_at_least(min_fd);
    let n = fd.raw();
    let t = fd.register(&p).unwrap();
    drop(fd);
    for interest in Interest::ALL {
        let refused = interest.is_priority()
            && (p.backend_name() == "kqueue"
                || p.backend_name() == "uring" && !interest.is_readable());
        if refused {
            // Refused before any command (`Interest::PRIORITY`).
            assert_eq!(err_kind(p.arm(t, interest)), io::ErrorKind::Unsupported);
            continue;
        }
        assert_eq!(err_errno(p.arm(t, interest)), libc::EBADF, "{interest:?}");
    }
    assert_eq!(p.len(), 1, "the registration stays");
    p.disarm(t).unwrap(); // never armed: nothing to do
                          // The number names a socket again: the registration works.
    let (c, d) = D::socketpair();
    let again = d.dup_at_least(n);
    assert_eq!(again.raw(), n, "the number was free");
    p.arm(t, Interest::READABLE).unwrap();
    c.write_all(b"x");
    assert!(expect_one(&p, t).is_readable());
    p.deregister(t).unwrap();
}

/// A refusal that is not an error on a re-arm: a registration idle in the kernel
/// whose socket is closed and whose number now names `/dev/null`. The arm
/// succeeds and no errno reaches the caller: epoll's MOD answers EPERM (the kernel
/// checks that the target can be polled before it looks the entry up, so this is
/// EPERM, not ENOENT), and the registration is reported always ready, one event
/// per arm. The poll(2) backend polls `/dev/null` for real; kqueue takes its own
/// path to the same outcome. On every backend each arm delivers one event, with no
/// error flag.
pub fn errno_reused_by_dev_null_is_always_ready_not_an_error<B: Backend>() {
    let p = poller::<B>();
    let (mut peer, sock) = socketpair();
    let mut fd = OwnedFd::from(sock);
    let t = p.register(&fd).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    peer.write_all(b"x").unwrap();
    expect_one(&p, t); // idle in the kernel now
    reuse_number(dev_null(), &mut fd); // the socket's last reference closes
    #[cfg(feature = "stats")]
    let before = p.stats();
    p.arm(t, Interest::READABLE)
        .expect("EPERM on a re-arm is not an error");
    #[cfg(feature = "stats")]
    if B::NAME == "epoll" {
        let s = p.stats().since(&before);
        assert_eq!(
            (
                s.modifies,
                s.not_pollable,
                s.synthetic,
                s.adds,
                s.not_found_to_add
            ),
            (1, 1, 1, 0, 0),
            "one MOD answered EPERM, then always ready: {s:?}"
        );
    }
    // libkqueue keeps the closed socket's knote (a BSD kernel drops it at close,
    // see docs/design.md): the re-arm that rides on the next wait meets that stale
    // knote and its refusal comes back with each arm's event, as an error flag:
    // still one event per arm, never a loop.
    let stale_knote = cfg!(pollshot_libkqueue) && B::NAME == "kqueue";
    for round in 0..2 {
        let ev = expect_one(&p, t);
        assert!(ev.is_readable(), "round {round}: {ev:?}");
        assert!(!ev.is_error() || stale_knote, "round {round}: {ev:?}");
        assert_no_events(&p, 2, Duration::from_millis(2));
        p.arm(t, Interest::READABLE).unwrap();
    }
    p.deregister(t).unwrap();
}

/// The same refusal on a deregistration: a registration whose socket is closed
/// (idle in the kernel, or armed) and whose number now names `/dev/null` or a
/// regular file. Deregistering it is not an error and frees it: nothing of the
/// registration can be under a number the kernel cannot poll (epoll's DEL
/// answers EPERM there, before it looks the entry up, as its MOD does; the closed
/// socket's entry left with its last reference). On the old code epoll's
/// deregister answered EPERM and kept the registration, and every retry
/// answered EPERM again: it could never be removed.
pub fn errno_reused_by_dev_null_deregister_is_not_an_error<B: Backend>() {
    for (armed, file) in [(false, false), (true, false), (false, true), (true, true)] {
        // A poller a case: on libkqueue a stale knote (below) outlives its case
        // in its kqueue and would meet the next case's socket at that number.
        let p = poller::<B>();
        let case = format!("armed {armed}, regular file {file}");
        let (mut peer, sock) = socketpair();
        let mut fd = OwnedFd::from(sock);
        let t = p.register(&fd).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        if !armed {
            peer.write_all(b"x").unwrap();
            expect_one(&p, t); // idle in the kernel now
        }
        if file {
            reuse_number(regular_file(), &mut fd);
        } else {
            reuse_number(dev_null(), &mut fd); // the socket's last reference closes
        }
        p.deregister(t)
            .unwrap_or_else(|e| panic!("{case}: EPERM on a deregister is not an error: {e:?}"));
        assert!(p.is_empty(), "{case}: the registration is gone");
        assert_eq!(
            err_kind(p.deregister(t)),
            io::ErrorKind::NotFound,
            "{case}: deregistered once"
        );
        assert_no_events(&p, 2, Duration::from_millis(2));
        if armed && on_libkqueue::<B>() {
            // libkqueue's artifact: the armed socket's knote, whose epoll entry
            // left with the socket, may outlive a refused EV_DELETE (about 1 run
            // in 4); an EV_ADD of the same number then finds it and touches
            // nothing, so the new descriptor never reports (nor would any
            // later registration of that number in this kqueue). A BSD kernel drops
            // a closed number's knotes at close (`knote_fdclose`): its delete
            // answers ENOENT and the add makes a new knote.
            continue;
        }
        // The number, registered again, is the new descriptor's (always ready).
        let again = p.register(&fd).unwrap();
        p.arm(again, Interest::READABLE).unwrap();
        assert!(expect_one(&p, again).is_readable(), "{case}");
        p.deregister(again).unwrap();
    }
}

/// A deregistered token: arm, disarm and deregister are `NotFound`; so is a second
/// deregister, and the poller keeps working for other registrations.
pub fn bad_deregistered_token<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (_a, b) = D::socketpair();
    let (_c, d) = D::socketpair();
    let armed = b.register(&p).unwrap();
    let fresh = d.register(&p).unwrap();
    p.arm(armed, Interest::READABLE).unwrap();
    p.deregister(armed).unwrap();
    p.deregister(fresh).unwrap();
    for t in [armed, fresh] {
        assert_eq!(
            err_kind(p.arm(t, Interest::READABLE)),
            io::ErrorKind::NotFound
        );
        assert_eq!(err_kind(p.arm(t, Interest::BOTH)), io::ErrorKind::NotFound);
        assert_eq!(err_kind(p.disarm(t)), io::ErrorKind::NotFound);
        assert_eq!(err_kind(p.deregister(t)), io::ErrorKind::NotFound);
    }
    assert!(p.is_empty());
    // A new registration (likely in a freed slot) is unaffected.
    let t = b.register(&p).unwrap();
    assert!(t != armed && t != fresh);
    p.arm(t, Interest::WRITABLE).unwrap();
    assert!(expect_one(&p, t).is_writable());
}

/// Tokens that were never handed out: `NotFound` everywhere, live registrations
/// untouched.
pub fn bad_garbage_token<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (_a, b) = D::socketpair();
    let live = b.register(&p).unwrap();
    let garbage = [
        Token::from_u64(u64::MAX),
        Token::from_u64(live.to_u64() ^ (1 << 32)), // the live slot, another incarnation
        Token::from_u64(live.to_u64() + 1),         // an empty slot
        Token::from_u64(0xdead_beef_0000_0000 | 1_000_000),
    ];
    for t in garbage {
        assert_ne!(t, live);
        assert_eq!(
            err_kind(p.arm(t, Interest::READABLE)),
            io::ErrorKind::NotFound,
            "{t:?}"
        );
        assert_eq!(err_kind(p.disarm(t)), io::ErrorKind::NotFound, "{t:?}");
        assert_eq!(err_kind(p.deregister(t)), io::ErrorKind::NotFound, "{t:?}");
    }
    assert_eq!(p.len(), 1);
    p.arm(live, Interest::WRITABLE).unwrap();
    assert!(expect_one(&p, live).is_writable());
}

/// `Poller<B>` can be shared between threads (compile-time).
pub fn poller_is_send_sync<B: Backend, D: Fd>() {
    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}
    assert_send_sync::<Poller<B>>();
    assert_send_sync::<Token>();
    assert_send_sync::<Event>();
    assert_send::<Events>();
}

// ---------------------------------------------------------------------------
// Found by the adversarial review: each named after the failure it guards against.

/// Four pipes with data, armed, delivered with capacity 1 and re-armed after each
/// delivery without draining: every one of them is delivered within 40 delivers.
/// (The poll(2) backend scanned its set in one fixed order, so the first ready
/// registration in that order took every delivery and the others starved.)
pub fn capacity_1_never_starves_a_ready_registration<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let pipes: Vec<(D, D)> = (0..4).map(|_| D::pipe()).collect();
    let tokens: Vec<Token> = pipes
        .iter()
        .map(|(r, w)| {
            w.write_all(b"x");
            let t = r.register(&p).unwrap();
            p.arm(t, Interest::READABLE).unwrap();
            t
        })
        .collect();
    let mut events = Events::with_capacity(1);
    let mut counts = vec![0usize; tokens.len()];
    for _ in 0..40 {
        p.deliver(&mut events, Some(LOST_AFTER)).unwrap();
        for ev in &events {
            let i = tokens.iter().position(|t| *t == ev.token()).unwrap();
            counts[i] += 1;
            p.arm(ev.token(), Interest::READABLE).unwrap();
        }
    }
    assert_eq!(counts.iter().sum::<usize>(), 40, "{counts:?}");
    assert!(
        counts.iter().all(|&n| n > 0),
        "a ready, armed registration starved: {counts:?}"
    );
}

/// A thread blocks in `deliver(None)` with nothing armed; another arms a pipe and
/// then makes a non-blocking `deliver` of its own (which may consume the wake-up
/// the arm sent); then the pipe is written. The blocked thread must get the event.
/// (On the poll(2) backend the second deliver drained the wake-up meant for the
/// blocked thread, which went back to sleep polling its old set, without the pipe:
/// the event was never delivered.) Repeated, since it is a race; a lost event is
/// reported after [`LOST_AFTER`].
pub fn arm_reaches_a_waiter_when_another_deliver_takes_the_wake<B: Backend, D: Fd>() {
    for round in 0..30 {
        let p = Arc::new(poller::<B>());
        let (r, w) = D::pipe();
        let t = r.register(&p).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let (p, done) = (p.clone(), done.clone());
            std::thread::spawn(move || {
                let mut events = Events::with_capacity(4);
                while !done.load(Ordering::Acquire) {
                    p.deliver(&mut events, None).unwrap();
                    if let Some(ev) = events.iter().next() {
                        let _ = tx.send(ev.token());
                        return;
                    }
                }
            })
        };
        // Make it likely (not certain) that the waiter is blocked in the kernel.
        std::thread::sleep(Duration::from_millis(2));
        p.arm(t, Interest::READABLE).unwrap();
        assert_eq!(
            p.deliver(&mut Events::with_capacity(4), Some(Duration::ZERO))
                .unwrap(),
            0
        );
        w.write_all(b"x");
        let got = rx.recv_timeout(LOST_AFTER);
        done.store(true, Ordering::Release);
        p.notify().unwrap();
        waiter.join().unwrap();
        assert_eq!(
            got.ok(),
            Some(t),
            "round {round}: the blocked deliver never got the event"
        );
    }
}

/// Four always-ready registrations (regular files): three are armed and then
/// disarmed or deregistered, the fourth is armed, all before any deliver. The
/// synthetic entries of the cancelled armings are still queued ahead of the current
/// one; they must take no room in the buffer: a deliver with capacity 1 returns the
/// current event at once. (They did take it: that deliver returned nothing, and
/// once the arms' wake-up was used up a deliver blocked for its whole timeout,
/// forever with `None`, with a current event queued.)
pub fn synthetic_stale_entries_take_no_room<B: Backend>() {
    let p = Arc::new(poller::<B>());
    let files: Vec<File> = (0..4).map(|_| regular_file()).collect();
    let tokens: Vec<Token> = files.iter().map(|f| p.register(f).unwrap()).collect();
    for (i, &t) in tokens[..3].iter().enumerate() {
        p.arm(t, Interest::READABLE).unwrap();
        if i == 2 {
            p.deregister(t).unwrap();
        } else {
            p.disarm(t).unwrap();
        }
    }
    let current = tokens[3];
    p.arm(current, Interest::READABLE).unwrap();
    let waiter = p.clone();
    let got = within(
        "deliver(None), capacity 1, a current event queued",
        move || {
            let mut events = Events::with_capacity(1);
            waiter.deliver(&mut events, None).unwrap();
            events.iter().map(Event::token).collect::<Vec<_>>()
        },
    );
    assert_eq!(got, [current], "the current arming's event, at once");
    assert_no_events(&p, 2, Duration::from_millis(5));
}

/// Capacity 1, an always-ready registration (a regular file) re-armed after each
/// delivery, and a socket with data waiting: both keep being delivered. (The
/// synthetic events filled the buffer before the kernel was asked, so the socket
/// was never delivered.)
pub fn synthetic_events_do_not_starve_kernel_events<B: Backend>() {
    let p = poller::<B>();
    let f = regular_file();
    let (mut a, b) = socketpair();
    a.write_all(b"waiting").unwrap();
    let file = p.register(&f).unwrap();
    let sock = p.register(&b).unwrap();
    p.arm(file, Interest::READABLE).unwrap();
    p.arm(sock, Interest::READABLE).unwrap();
    let mut events = Events::with_capacity(1);
    let (mut files, mut socks) = (0, 0);
    for _ in 0..20 {
        p.deliver(&mut events, Some(LOST_AFTER)).unwrap();
        for ev in &events {
            // Re-armed without draining: both stay ready.
            if ev.token() == file {
                files += 1;
            } else {
                assert_eq!(ev.token(), sock, "{ev:?}");
                socks += 1;
            }
            p.arm(ev.token(), Interest::READABLE).unwrap();
        }
    }
    // Turns alternate, but a kernel turn may return only the waker (the file's
    // re-arm notifies): each gets a share, not necessarily half.
    assert!(
        files >= 3 && socks >= 3,
        "20 delivers of capacity 1: file {files}, socket {socks}"
    );
}

/// Fairness beside always-ready registrations (docs/guarantees.md, "Fair under
/// load"): `k` sockets with data waiting and `f` regular files, all armed
/// readable and re-armed after each delivery without draining, so all `N = k +
/// f` stay ready; with room for `c`, each is first delivered within `2 *
/// ceil(N / c)` delivers and delivered again at least that often. (On epoll the
/// files' synthetic events and the kernel's take turns at filling the buffer
/// first: the bound is twice the kernel's own; a turn order that let one side
/// go first on every call would starve the other and fail here.)
pub fn fair_beside_always_ready_files_within_twice_ceil<B: Backend>() {
    for (k, f, c) in [(10usize, 1usize, 1usize), (3, 5, 2), (8, 8, 4), (1, 6, 1)] {
        let p = poller::<B>();
        let n = k + f;
        let bound = 2 * n.div_ceil(c);
        let files: Vec<File> = (0..f).map(|_| regular_file()).collect();
        let pairs: Vec<_> = (0..k).map(|_| socketpair()).collect();
        let mut tokens = Vec::new();
        for file in &files {
            tokens.push(p.register(file).unwrap());
        }
        for (a, b) in &pairs {
            (&*a).write_all(b"x").unwrap();
            tokens.push(p.register(b).unwrap());
        }
        for &t in &tokens {
            p.arm(t, Interest::READABLE).unwrap();
        }
        let mut last = vec![0usize; n];
        let mut events = Events::with_capacity(c);
        for d in 1..=4 * bound {
            p.deliver(&mut events, Some(LOST_AFTER)).unwrap();
            assert!(!events.is_empty(), "k={k} f={f} c={c}: deliver #{d} empty");
            for ev in &events {
                let i = tokens.iter().position(|&t| t == ev.token()).unwrap();
                assert!(
                    d - last[i] <= bound,
                    "k={k} f={f} c={c}: registration {i} ({}) served at #{} then #{d}, over 2 * ceil({n} / {c}) = {bound}",
                    if i < f { "file" } else { "socket" },
                    last[i]
                );
                last[i] = d;
                p.arm(ev.token(), Interest::READABLE).unwrap();
            }
            for (i, &l) in last.iter().enumerate() {
                assert!(
                    d - l <= bound,
                    "k={k} f={f} c={c}: registration {i} not served since #{l}, now #{d} (bound {bound})"
                );
            }
        }
    }
}

/// A token handed out by another poller is `NotFound`, not a registration of
/// this one. (Each poller counted incarnations from 0, so the first registration
/// of every poller had the same token, and one poller's token armed, disarmed or
/// deregistered another's registration.)
pub fn bad_token_from_another_poller<B: Backend, D: Fd>() {
    let p1 = poller::<B>();
    let p2 = poller::<B>();
    let (_a, b) = D::socketpair();
    let (_c, d) = D::socketpair();
    let t1 = b.register(&p1).unwrap();
    let t2 = d.register(&p2).unwrap();
    assert_ne!(t1, t2, "two pollers handed out the same token");
    assert_eq!(
        err_kind(p2.arm(t1, Interest::WRITABLE)),
        io::ErrorKind::NotFound
    );
    assert_eq!(err_kind(p2.disarm(t1)), io::ErrorKind::NotFound);
    assert_eq!(err_kind(p2.deregister(t1)), io::ErrorKind::NotFound);
    assert_eq!(p2.len(), 1);
    p2.arm(t2, Interest::WRITABLE).unwrap();
    assert!(expect_one(&p2, t2).is_writable());
}

/// `Events::with_capacity` with a huge capacity is lowered to
/// `Events::MAX_CAPACITY`, and the buffer works. (It reserved the whole capacity
/// up front: the process aborted on the failed allocation.) `1 << (BITS - 4)` is
/// 2^60 on 64-bit targets and 2^28 on 32-bit ones: past any allocation on both.
pub fn events_huge_capacity_is_clamped<B: Backend, D: Fd>() {
    for cap in [usize::MAX, 1 << (usize::BITS - 4), Events::MAX_CAPACITY + 1] {
        assert_eq!(Events::with_capacity(cap).capacity(), Events::MAX_CAPACITY);
    }
    assert_eq!(
        Events::with_capacity(Events::MAX_CAPACITY).capacity(),
        Events::MAX_CAPACITY
    );
    let p = poller::<B>();
    let (_a, b) = D::socketpair();
    let t = b.register(&p).unwrap();
    p.arm(t, Interest::WRITABLE).unwrap();
    let mut events = Events::with_capacity(usize::MAX);
    assert_eq!(p.deliver(&mut events, Some(LOST_AFTER)).unwrap(), 1);
    assert_eq!(events.iter().next().unwrap().token(), t);
}

/// The poller's own descriptors (kernel instance, waker) cannot be registered:
/// a registration would steal the waker's readiness and break `notify`.
pub fn bad_register_own_descriptor<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let mut refused = 0;
    for fd in 0..64 {
        // SAFETY: probing numbers; a closed one is simply never armed here.
        if let Err(e) = unsafe { p.register_raw(fd) } {
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            refused += 1;
        }
    }
    assert!(refused >= 1, "the waker's number was accepted");
    // notify still wakes a deliver after all that.
    p.notify().unwrap();
    let mut events = Events::with_capacity(4);
    assert_eq!(p.deliver(&mut events, None).unwrap(), 0);
}
