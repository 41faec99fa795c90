//! pingpong: P socketpairs, T threads, round trips of 64 bytes, every
//! implementation in one run with interleaved repetitions.
//!
//! Each pair has a client end that writes 64 bytes and an echo end that writes
//! them back; the client checks the echo and sends the next. Multiplexed
//! implementations wait for readiness; a woken endpoint reads once (mio, being
//! edge-triggered, drains to `WouldBlock`), answers, and re-arms for reading.
//! The read after an endpoint's own write is not tried speculatively (the peer
//! cannot have answered yet), so a oneshot round trip costs, per side: one wait,
//! one read, one write, one re-arm.
//!
//! Implementations (`--impl NAME` runs one):
//!
//! | name | what |
//! |---|---|
//! | `pollshot-epoll`, `pollshot-kqueue`, `pollshot-blocking` | T threads delivering on one `pollshot::Poller` of that backend |
//! | `pollshot-uring` | the same on the io_uring backend (Linux, `--features io-uring`) |
//! | `…-sharded` | one poller per thread, each pair on one of them |
//! | `polling` | `polling` 3.x, oneshot mode, re-armed with `modify`, T threads on one poller |
//! | `mio` | `mio` 1.x, edge-triggered, one `Poll` per thread, drained to `WouldBlock` |
//! | `epoll-hand`, `epoll-hand-sharded` | a hand-written epoll loop: `EPOLLONESHOT`, one `EPOLL_CTL_MOD` per wait (Linux) |
//! | `threads` | plain 1:1 threads with blocking reads (2P threads; T unused) |
//!
//! Usage: `cargo bench --bench pingpong [-- FLAGS]`
//!
//! - `--pairs 1,8,64` `--threads 1,2,4`: the grid (default as shown)
//! - `--impl NAME[,NAME…]`: only these implementations (`benches/strace.sh` runs one at
//!   a time); `--list` names them
//! - `--reps N` (default 5), `--millis MS` per run (default 300), or `--rounds R`:
//!   a fixed total of round trips per run instead of a duration
//! - `POLLSHOT_BENCH_QUICK=1`: 3 repetitions of 100 ms
//! - built with `--cfg pollshot_rump` (a NetBSD rump kernel) it refuses to run,
//!   saying why (exit 2); the main job gives that kernel's counts
//! - `--chart FILE`: also draw an SVG chart of the grid to FILE (round trips per
//!   second and CPU per round trip; pollshot on the default backend beside the
//!   hand-written loop, mio and polling: the implementations of those that ran;
//!   `benches/common/chart.rs`). `docs/pingpong.svg` is made by
//!   `cargo bench --bench pingpong -- --impl pollshot-epoll,epoll-hand,mio,polling --chart docs/pingpong.svg`
//! - `--cpu-targets`: only `pollshot-epoll`, `epoll-hand`, `pollshot-epoll-sharded`
//!   and `mio`, at P in {1,8,64} x T in {1,2} unless `--pairs`/`--threads` say
//!   otherwise, and only the CPU table (below)
//!
//! Reports, per P and T: median round trips per second, CPU time per round trip
//! (getrusage), ratios to the hand-written loop, to `polling` and to `mio`, the
//! reads and writes per round trip (counted here), and, with `--features stats`,
//! pollshot's own system calls per round trip from its counters (`Poller::stats`;
//! off by default, so that the CPU figures are those of the crate as users build
//! it). Then, from the same interleaved runs, a table per (P, T) of CPU per round
//! trip: `pollshot-epoll` over `epoll-hand` (target at most 1.02x) and, at T >= 2,
//! `pollshot-epoll-sharded` against `mio` (target: no more CPU than mio), each
//! marked ok or MISS, with each median's spread.
// Unix only (descriptors, rusage): the bench's entry (`benches/entry/`) compiles
// this module on Unix only, and elsewhere says the bench cannot run there.
#![cfg(unix)]

#[path = "common/mod.rs"]
mod common;

#[path = "common/chart.rs"]
mod chart;

use common::{cpu_time, die, median, per, ratio, Args};
use pollshot::{Backend, Events, Interest, Poller, Token};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

/// Bytes per message.
const MSG: usize = 64;
/// Events per wait, for every implementation.
const BATCH: usize = 64;
/// A run that takes longer than this is a hang: the bench says so and exits 1.
const WATCHDOG: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------
// The workload, shared by every multiplexed implementation.

/// One end of a pair.
struct Endpoint<S> {
    sock: S,
    pair: u32,
    client: bool,
    st: Mutex<EpState>,
}

struct EpState {
    buf: [u8; MSG],
    have: usize,
    /// Client: the sequence number of the message in flight.
    seq: u64,
}

impl Default for EpState {
    fn default() -> Self {
        EpState {
            buf: [0; MSG],
            have: 0,
            seq: 0,
        }
    }
}

/// What one run shares between its threads.
struct Run<S> {
    eps: Vec<Endpoint<S>>,
    /// Round trips per pair, or `None` to run until `stop`.
    quota: Option<u64>,
    stop: AtomicBool,
    /// Clients still running.
    active: AtomicUsize,
    /// Every client finished: threads leave their loops.
    done: AtomicBool,
}

/// What one thread counted.
#[derive(Default, Clone, Copy)]
struct Local {
    rt: u64,
    reads: u64,
    writes: u64,
    /// Endpoints delivered by the multiplexer (one per wait cycle of an endpoint).
    events: u64,
}

impl std::ops::AddAssign for Local {
    fn add_assign(&mut self, o: Local) {
        self.rt += o.rt;
        self.reads += o.reads;
        self.writes += o.writes;
        self.events += o.events;
    }
}

/// The message a client sends for `seq`: the sequence number, the pair, a pattern.
fn payload(pair: u32, seq: u64) -> [u8; MSG] {
    let mut b = [0u8; MSG];
    b[..8].copy_from_slice(&seq.to_le_bytes());
    b[8..12].copy_from_slice(&pair.to_le_bytes());
    for (i, x) in b[12..].iter_mut().enumerate() {
        *x = (seq as u8).wrapping_add(i as u8) ^ (pair as u8);
    }
    b
}

/// The outcome of one read on an endpoint.
enum Step {
    /// Data was read (a message may be complete and answered): wait for more.
    More,
    /// The read said `WouldBlock`.
    Blocked,
    /// A client finished its last round trip: nothing more for this endpoint.
    Finished,
}

impl<S> Run<S>
where
    for<'a> &'a S: Read + Write,
{
    fn new(pairs: Vec<(S, S)>, quota: Option<u64>) -> Run<S> {
        let n = pairs.len();
        let mut eps = Vec::with_capacity(2 * n);
        for (i, (c, e)) in pairs.into_iter().enumerate() {
            for (sock, client) in [(c, true), (e, false)] {
                eps.push(Endpoint {
                    sock,
                    pair: i as u32,
                    client,
                    st: Mutex::new(EpState::default()),
                });
            }
        }
        Run {
            eps,
            quota,
            stop: AtomicBool::new(false),
            active: AtomicUsize::new(n),
            done: AtomicBool::new(false),
        }
    }

    /// Clients send their first message.
    fn kick(&self, local: &mut Local) {
        for ep in self.eps.iter().filter(|e| e.client) {
            local.writes += 1;
            let n = (&ep.sock)
                .write(&payload(ep.pair, 0))
                .expect("pingpong: first write");
            assert_eq!(n, MSG, "pingpong: short first write");
        }
    }

    /// Reads once from endpoint `i` and answers a complete message.
    fn step(&self, i: usize, local: &mut Local) -> Step {
        let ep = &self.eps[i];
        let mut guard = ep.st.lock().unwrap();
        let st = &mut *guard;
        local.reads += 1;
        match (&ep.sock).read(&mut st.buf[st.have..]) {
            Ok(0) => panic!("pingpong: endpoint {i} read EOF mid-run"),
            Ok(n) => {
                st.have += n;
                if st.have < MSG {
                    return Step::More;
                }
                st.have = 0;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Blocked,
            Err(e) => panic!("pingpong: read on endpoint {i}: {e}"),
        }
        if !ep.client {
            local.writes += 1;
            let n = (&ep.sock).write(&st.buf).expect("pingpong: echo write");
            assert_eq!(n, MSG, "pingpong: short echo write");
            return Step::More;
        }
        assert!(
            st.buf == payload(ep.pair, st.seq),
            "pingpong: pair {} round trip {}: the echo differs from what was sent",
            ep.pair,
            st.seq
        );
        local.rt += 1;
        st.seq += 1;
        let finished = match self.quota {
            Some(q) => st.seq >= q,
            None => self.stop.load(Relaxed),
        };
        if finished {
            return Step::Finished;
        }
        local.writes += 1;
        let n = (&ep.sock)
            .write(&payload(ep.pair, st.seq))
            .expect("pingpong: write");
        assert_eq!(n, MSG, "pingpong: short write");
        Step::More
    }

    /// A client finished; true for the last one (who then wakes every waiter).
    fn finish(&self) -> bool {
        if self.active.fetch_sub(1, AcqRel) == 1 {
            self.done.store(true, Release);
            true
        } else {
            false
        }
    }
}

// ---------------------------------------------------------------------------
// Multiplexers: each one waits for readiness and re-arms an endpoint.

/// A readiness interface that T threads may share.
trait Mux: Send + Sync + Sized + 'static {
    type Buf;
    fn new() -> io::Result<Self>;
    fn buf() -> Self::Buf;
    /// Registers endpoint `ep` and arms it for reading.
    fn add(&mut self, ep: usize, fd: BorrowedFd<'_>) -> io::Result<()>;
    /// Re-arms endpoint `ep` for reading.
    fn arm(&self, ep: usize, fd: BorrowedFd<'_>) -> io::Result<()>;
    /// Waits (no timeout) and lists the endpoints delivered.
    fn wait(&self, buf: &mut Self::Buf, ready: &mut Vec<usize>) -> io::Result<()>;
    /// Wakes a waiter (or the next wait).
    fn wake(&self) -> io::Result<()>;
    /// Removes endpoint `ep` before its socket is closed.
    fn remove(&mut self, ep: usize, fd: BorrowedFd<'_>) -> io::Result<()>;
    /// pollshot's counters.
    fn counts(&self) -> Option<pollshot::Stats> {
        None
    }
}

/// pollshot on backend `B`.
struct Pollshot<B: Backend> {
    poller: Poller<B>,
    tokens: Vec<Token>,
    /// Endpoint index by token slot.
    by_slot: Vec<usize>,
}

impl<B: Backend> Mux for Pollshot<B> {
    type Buf = Events;
    fn new() -> io::Result<Self> {
        Ok(Pollshot {
            poller: Poller::<B>::with_backend()?,
            tokens: Vec::new(),
            by_slot: Vec::new(),
        })
    }
    fn buf() -> Events {
        Events::with_capacity(BATCH)
    }
    fn add(&mut self, ep: usize, fd: BorrowedFd<'_>) -> io::Result<()> {
        let t = self.poller.register(&fd)?;
        self.poller.arm(t, Interest::READABLE)?;
        if self.tokens.len() <= ep {
            self.tokens.resize(ep + 1, t);
        }
        self.tokens[ep] = t;
        if self.by_slot.len() <= t.index() {
            self.by_slot.resize(t.index() + 1, usize::MAX);
        }
        self.by_slot[t.index()] = ep;
        Ok(())
    }
    #[inline]
    fn arm(&self, ep: usize, _fd: BorrowedFd<'_>) -> io::Result<()> {
        self.poller.arm(self.tokens[ep], Interest::READABLE)
    }
    #[inline]
    fn wait(&self, buf: &mut Events, ready: &mut Vec<usize>) -> io::Result<()> {
        match self.poller.deliver(buf, None) {
            // Interrupted: the caller's loop waits again.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            r => r?,
        };
        ready.extend(buf.iter().map(|e| self.by_slot[e.token().index()]));
        Ok(())
    }
    fn wake(&self) -> io::Result<()> {
        self.poller.notify()
    }
    fn remove(&mut self, ep: usize, _fd: BorrowedFd<'_>) -> io::Result<()> {
        self.poller.deregister(self.tokens[ep])
    }
    #[cfg(feature = "stats")]
    fn counts(&self) -> Option<pollshot::Stats> {
        Some(self.poller.stats())
    }
}

/// `polling` 3.x in oneshot mode, re-armed with `modify`.
struct Polling {
    poller: polling::Poller,
}

impl Mux for Polling {
    type Buf = polling::Events;
    fn new() -> io::Result<Self> {
        Ok(Polling {
            poller: polling::Poller::new()?,
        })
    }
    fn buf() -> polling::Events {
        polling::Events::with_capacity(std::num::NonZeroUsize::new(BATCH).unwrap())
    }
    fn add(&mut self, ep: usize, fd: BorrowedFd<'_>) -> io::Result<()> {
        // SAFETY: polling requires the source to be deleted before it is closed:
        // `run_mux` calls `remove` for every endpoint before dropping the sockets.
        unsafe {
            self.poller.add_with_mode(
                fd.as_raw_fd(),
                polling::Event::readable(ep),
                polling::PollMode::Oneshot,
            )
        }
    }
    #[inline]
    fn arm(&self, ep: usize, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.poller
            .modify_with_mode(fd, polling::Event::readable(ep), polling::PollMode::Oneshot)
    }
    #[inline]
    fn wait(&self, buf: &mut polling::Events, ready: &mut Vec<usize>) -> io::Result<()> {
        buf.clear();
        self.poller.wait(buf, None)?;
        ready.extend(buf.iter().map(|e| e.key));
        Ok(())
    }
    fn wake(&self) -> io::Result<()> {
        self.poller.notify()
    }
    fn remove(&mut self, _ep: usize, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.poller.delete(fd)
    }
}

/// The floor: epoll with `EPOLLONESHOT`, one `EPOLL_CTL_MOD` per wait, written by
/// hand on rustix (the same flags pollshot uses: `EPOLLIN | EPOLLRDHUP`).
#[cfg(any(target_os = "linux", target_os = "android"))]
mod hand {
    use super::BATCH;
    use rustix::event::epoll::{self, EventData, EventFlags};
    use rustix::fd::{BorrowedFd, OwnedFd};
    use std::io;
    use std::mem::MaybeUninit;

    const WAKE: u64 = u64::MAX;
    const ARM: EventFlags = EventFlags::IN
        .union(EventFlags::RDHUP)
        .union(EventFlags::ONESHOT);

    pub struct HandEpoll {
        epoll: OwnedFd,
        waker: OwnedFd,
    }

    impl super::Mux for HandEpoll {
        type Buf = ();
        fn new() -> io::Result<Self> {
            let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
            let waker = rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
            )?;
            // Level-triggered and never drained: once written, every wait sees it.
            epoll::add(&epoll, &waker, EventData::new_u64(WAKE), EventFlags::IN)?;
            Ok(HandEpoll { epoll, waker })
        }
        fn buf() {}
        fn add(&mut self, ep: usize, fd: BorrowedFd<'_>) -> io::Result<()> {
            Ok(epoll::add(
                &self.epoll,
                fd,
                EventData::new_u64(ep as u64),
                ARM,
            )?)
        }
        #[inline]
        fn arm(&self, ep: usize, fd: BorrowedFd<'_>) -> io::Result<()> {
            Ok(epoll::modify(
                &self.epoll,
                fd,
                EventData::new_u64(ep as u64),
                ARM,
            )?)
        }
        #[inline]
        fn wait(&self, _: &mut (), ready: &mut Vec<usize>) -> io::Result<()> {
            let mut buf = [MaybeUninit::<epoll::Event>::uninit(); BATCH];
            let (evs, _) = epoll::wait(&self.epoll, &mut buf[..], None)?;
            for ev in evs.iter() {
                let d = ev.data.u64();
                if d != WAKE {
                    ready.push(d as usize);
                }
            }
            Ok(())
        }
        fn wake(&self) -> io::Result<()> {
            rustix::io::write(&self.waker, &1u64.to_ne_bytes())?;
            Ok(())
        }
        fn remove(&mut self, _ep: usize, fd: BorrowedFd<'_>) -> io::Result<()> {
            Ok(epoll::delete(&self.epoll, fd)?)
        }
    }
}

// ---------------------------------------------------------------------------
// Runs.

/// What one run measured.
#[derive(Clone, Copy, Default)]
struct Sample {
    rt: u64,
    secs: f64,
    cpu: f64,
    reads: u64,
    writes: u64,
    events: u64,
    stats: Option<pollshot::Stats>,
}

impl Sample {
    /// One run's sample from its threads' summed counts.
    fn new(total: Local, secs: f64, cpu: f64, stats: Option<pollshot::Stats>) -> Sample {
        Sample {
            rt: total.rt,
            secs,
            cpu,
            reads: total.reads,
            writes: total.writes,
            events: total.events,
            stats,
        }
    }
}

#[derive(Clone, Copy)]
struct Cfg {
    pairs: usize,
    threads: usize,
    rounds: Option<u64>,
    millis: u64,
}

impl Cfg {
    fn quota(&self) -> Option<u64> {
        self.rounds.map(|r| r.div_ceil(self.pairs as u64).max(1))
    }
}

fn std_pairs(n: usize, nonblocking: bool) -> io::Result<Vec<(UnixStream, UnixStream)>> {
    (0..n)
        .map(|_| {
            let (a, b) = UnixStream::pair()?;
            a.set_nonblocking(nonblocking)?;
            b.set_nonblocking(nonblocking)?;
            Ok((a, b))
        })
        .collect()
}

/// Waits for `handles`, or ends the process if they take longer than [`WATCHDOG`].
fn join_all<T: Send + 'static>(what: &str, handles: Vec<std::thread::JoinHandle<T>>) -> Vec<T> {
    let (tx, rx) = mpsc::channel::<()>();
    let what = what.to_string();
    let dog = std::thread::spawn(move || {
        if rx.recv_timeout(WATCHDOG) == Err(mpsc::RecvTimeoutError::Timeout) {
            eprintln!("pingpong: {what} did not finish within {WATCHDOG:?}: a hang");
            std::process::exit(1);
        }
    });
    let out = handles
        .into_iter()
        .map(|h| h.join().expect("pingpong: a thread panicked"))
        .collect();
    drop(tx);
    dog.join().unwrap();
    out
}

/// Starts the clock after `barrier`, stops clients after the duration (if no
/// quota), and joins.
fn drive<T: Send + 'static>(
    name: &str,
    cfg: &Cfg,
    stop: impl FnOnce(),
    barrier: &Barrier,
    handles: Vec<std::thread::JoinHandle<T>>,
) -> (Vec<T>, f64, f64) {
    let c0 = cpu_time();
    barrier.wait();
    let t0 = Instant::now();
    if cfg.rounds.is_none() {
        std::thread::sleep(Duration::from_millis(cfg.millis));
        stop();
    }
    let out = join_all(name, handles);
    let secs = t0.elapsed().as_secs_f64();
    let cpu = (cpu_time() - c0).as_secs_f64();
    (out, secs, cpu)
}

fn sum_stats(muxes: &[impl Mux]) -> Option<pollshot::Stats> {
    let mut total: Option<pollshot::Stats> = None;
    for m in muxes {
        let s = m.counts()?;
        total = Some(match total {
            None => s,
            Some(t) => add_stats(&t, &s),
        });
    }
    total
}

fn add_stats(a: &pollshot::Stats, b: &pollshot::Stats) -> pollshot::Stats {
    pollshot::Stats {
        adds: a.adds + b.adds,
        modifies: a.modifies + b.modifies,
        quiets: a.quiets + b.quiets,
        deletes: a.deletes + b.deletes,
        ctl_calls: a.ctl_calls + b.ctl_calls,
        waits: a.waits + b.waits,
        wakes: a.wakes + b.wakes,
        wake_reads: a.wake_reads + b.wake_reads,
        not_found_to_add: a.not_found_to_add + b.not_found_to_add,
        exists_to_modify: a.exists_to_modify + b.exists_to_modify,
        not_pollable: a.not_pollable + b.not_pollable,
        synthetic: a.synthetic + b.synthetic,
        stale: a.stale + b.stale,
    }
}

/// T threads on one multiplexer (`sharded`: one per thread, pair `p` on `p % T`).
fn run_mux<M: Mux>(name: &str, cfg: &Cfg, sharded: bool) -> io::Result<Sample> {
    let run = Arc::new(Run::new(std_pairs(cfg.pairs, true)?, cfg.quota()));
    let n = if sharded { cfg.threads } else { 1 };
    let mut muxes = (0..n).map(|_| M::new()).collect::<io::Result<Vec<M>>>()?;
    for (i, ep) in run.eps.iter().enumerate() {
        muxes[ep.pair as usize % n].add(i, ep.sock.as_fd())?;
    }
    let muxes = Arc::new(muxes);
    let barrier = Arc::new(Barrier::new(cfg.threads + 1));
    let handles: Vec<_> = (0..cfg.threads)
        .map(|t| {
            let (run, muxes, barrier) = (run.clone(), muxes.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mux = &muxes[t % muxes.len()];
                let mut buf = M::buf();
                let mut ready = Vec::with_capacity(BATCH);
                let mut local = Local::default();
                barrier.wait();
                while !run.done.load(Acquire) {
                    ready.clear();
                    mux.wait(&mut buf, &mut ready).expect("pingpong: wait");
                    local.events += ready.len() as u64;
                    for &i in &ready {
                        match run.step(i, &mut local) {
                            Step::More | Step::Blocked => {
                                mux.arm(i, run.eps[i].sock.as_fd()).expect("pingpong: arm")
                            }
                            Step::Finished => {
                                if run.finish() {
                                    for m in muxes.iter() {
                                        m.wake().expect("pingpong: wake");
                                    }
                                }
                            }
                        }
                    }
                }
                // Pass the wake-up on to a thread still blocked on this poller.
                mux.wake().expect("pingpong: wake");
                local
            })
        })
        .collect();
    let mut total = Local::default();
    run.kick(&mut total);
    let s0 = sum_stats(&muxes);
    let (locals, secs, cpu) = drive(
        name,
        cfg,
        || run.stop.store(true, Relaxed),
        &barrier,
        handles,
    );
    let s1 = sum_stats(&muxes);
    for l in locals {
        total += l;
    }
    let mut muxes = Arc::try_unwrap(muxes)
        .ok()
        .expect("pingpong: threads joined");
    for (i, ep) in run.eps.iter().enumerate() {
        muxes[ep.pair as usize % n].remove(i, ep.sock.as_fd())?;
    }
    Ok(Sample::new(
        total,
        secs,
        cpu,
        s0.zip(s1).map(|(a, b)| b.since(&a)),
    ))
}

/// mio 1.x: edge-triggered, one `Poll` per thread, each woken endpoint drained to
/// `WouldBlock`.
fn run_mio(name: &str, cfg: &Cfg) -> io::Result<Sample> {
    use mio::net::UnixStream as MioStream;
    use mio::{Events as MioEvents, Interest as MioInterest, Poll, Token as MioToken, Waker};
    const WAKE: MioToken = MioToken(usize::MAX);

    let pairs = (0..cfg.pairs)
        .map(|_| MioStream::pair())
        .collect::<io::Result<Vec<_>>>()?;
    let mut run = Run::new(pairs, cfg.quota());
    let n = cfg.threads;
    let polls = (0..n)
        .map(|_| Poll::new())
        .collect::<io::Result<Vec<_>>>()?;
    let wakers = Arc::new(
        polls
            .iter()
            .map(|p| Waker::new(p.registry(), WAKE))
            .collect::<io::Result<Vec<_>>>()?,
    );
    for (i, ep) in run.eps.iter_mut().enumerate() {
        polls[ep.pair as usize % n].registry().register(
            &mut ep.sock,
            MioToken(i),
            MioInterest::READABLE,
        )?;
    }
    let run = Arc::new(run);
    let barrier = Arc::new(Barrier::new(n + 1));
    let handles: Vec<_> = polls
        .into_iter()
        .map(|mut poll| {
            let (run, wakers, barrier) = (run.clone(), wakers.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut events = MioEvents::with_capacity(BATCH);
                let mut local = Local::default();
                barrier.wait();
                while !run.done.load(Acquire) {
                    poll.poll(&mut events, None).expect("pingpong: mio poll");
                    for ev in events.iter() {
                        let i = ev.token().0;
                        if ev.token() == WAKE {
                            continue;
                        }
                        local.events += 1;
                        loop {
                            match run.step(i, &mut local) {
                                Step::More => continue,
                                Step::Blocked => break,
                                Step::Finished => {
                                    if run.finish() {
                                        for w in wakers.iter() {
                                            w.wake().expect("pingpong: mio wake");
                                        }
                                    }
                                    break;
                                }
                            }
                        }
                    }
                }
                (local, poll)
            })
        })
        .collect();
    let mut total = Local::default();
    run.kick(&mut total);
    let (out, secs, cpu) = drive(
        name,
        cfg,
        || run.stop.store(true, Relaxed),
        &barrier,
        handles,
    );
    for (l, _poll) in out {
        total += l;
    }
    Ok(Sample::new(total, secs, cpu, None))
}

/// Plain 1:1 threads: one blocking thread per endpoint (2P threads).
fn run_threads(name: &str, cfg: &Cfg) -> io::Result<Sample> {
    let pairs = std_pairs(cfg.pairs, false)?;
    let stop = Arc::new(AtomicBool::new(false));
    let quota = cfg.quota();
    let barrier = Arc::new(Barrier::new(2 * cfg.pairs + 1));
    let mut handles = Vec::new();
    for (p, (client, echo)) in pairs.into_iter().enumerate() {
        let b = barrier.clone();
        handles.push(std::thread::spawn(move || {
            let mut local = Local::default();
            let mut buf = [0u8; MSG];
            b.wait();
            while read_full(&echo, &mut buf, &mut local) {
                local.writes += 1;
                (&echo).write_all(&buf).expect("pingpong: echo write");
            }
            local
        }));
        let (b, stop) = (barrier.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            let mut local = Local::default();
            let mut buf = [0u8; MSG];
            b.wait();
            for seq in 0u64.. {
                let msg = payload(p as u32, seq);
                local.writes += 1;
                (&client).write_all(&msg).expect("pingpong: write");
                assert!(
                    read_full(&client, &mut buf, &mut local),
                    "pingpong: EOF from echo"
                );
                assert!(
                    buf == msg,
                    "pingpong: pair {p} round trip {seq}: echo differs"
                );
                local.rt += 1;
                let finished = match quota {
                    Some(q) => seq + 1 >= q,
                    None => stop.load(Relaxed),
                };
                if finished {
                    break;
                }
            }
            client
                .shutdown(std::net::Shutdown::Write)
                .expect("pingpong: shutdown");
            local
        }));
    }
    let (locals, secs, cpu) = drive(name, cfg, || stop.store(true, Relaxed), &barrier, handles);
    let mut total = Local::default();
    for l in locals {
        total += l;
    }
    Ok(Sample::new(total, secs, cpu, None))
}

/// Reads exactly one message, counting read calls; false on EOF at a boundary.
fn read_full(mut s: &UnixStream, buf: &mut [u8; MSG], local: &mut Local) -> bool {
    let mut have = 0;
    while have < MSG {
        local.reads += 1;
        match s.read(&mut buf[have..]) {
            Ok(0) if have == 0 => return false,
            Ok(0) => panic!("pingpong: EOF inside a message"),
            Ok(n) => have += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => panic!("pingpong: read: {e}"),
        }
    }
    true
}

// ---------------------------------------------------------------------------
// The implementations and the report.

type Runner = fn(&str, &Cfg) -> io::Result<Sample>;

/// (name, runner, whether it is a sharded variant).
#[allow(clippy::vec_init_then_push)] // the pushes are cfg'd per target
fn impls() -> Vec<(&'static str, Runner, bool)> {
    let mut v: Vec<(&'static str, Runner, bool)> = Vec::new();
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        v.push((
            "pollshot-epoll",
            |n, c| run_mux::<Pollshot<pollshot::backends::Epoll>>(n, c, false),
            false,
        ));
        v.push((
            "pollshot-epoll-sharded",
            |n, c| run_mux::<Pollshot<pollshot::backends::Epoll>>(n, c, true),
            true,
        ));
    }
    #[cfg(all(target_os = "linux", feature = "io-uring"))]
    {
        v.push((
            "pollshot-uring",
            |n, c| run_mux::<Pollshot<pollshot::backends::Uring>>(n, c, false),
            false,
        ));
        v.push((
            "pollshot-uring-sharded",
            |n, c| run_mux::<Pollshot<pollshot::backends::Uring>>(n, c, true),
            true,
        ));
    }
    #[cfg(pollshot_kqueue)]
    {
        v.push((
            "pollshot-kqueue",
            |n, c| run_mux::<Pollshot<pollshot::backends::Kqueue>>(n, c, false),
            false,
        ));
        v.push((
            "pollshot-kqueue-sharded",
            |n, c| run_mux::<Pollshot<pollshot::backends::Kqueue>>(n, c, true),
            true,
        ));
    }
    v.push((
        "pollshot-blocking",
        |n, c| run_mux::<Pollshot<pollshot::backends::Blocking>>(n, c, false),
        false,
    ));
    v.push((
        "pollshot-blocking-sharded",
        |n, c| run_mux::<Pollshot<pollshot::backends::Blocking>>(n, c, true),
        true,
    ));
    v.push(("polling", |n, c| run_mux::<Polling>(n, c, false), false));
    v.push(("mio", run_mio, false));
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        v.push((
            "epoll-hand",
            |n, c| run_mux::<hand::HandEpoll>(n, c, false),
            false,
        ));
        v.push((
            "epoll-hand-sharded",
            |n, c| run_mux::<hand::HandEpoll>(n, c, true),
            true,
        ));
    }
    v.push(("threads", run_threads, false));
    v
}

/// The medians of one implementation at one P and T.
#[derive(Clone, Copy)]
struct Summary {
    rate: f64,
    cpu_us: f64,
    /// (max - min) / median of the runs' CPU per round trip.
    cpu_spread: f64,
    reads: f64,
    writes: f64,
    /// Deliveries per round trip.
    events: f64,
    stats: Option<[f64; 7]>,
}

fn summarize(samples: &[Sample]) -> Summary {
    let rates: Vec<f64> = samples.iter().map(|s| s.rt as f64 / s.secs).collect();
    let cpus: Vec<f64> = samples
        .iter()
        .map(|s| s.cpu * 1e6 / s.rt.max(1) as f64)
        .collect();
    let rt: f64 = samples.iter().map(|s| s.rt as f64).sum::<f64>().max(1.0);
    let reads = samples.iter().map(|s| s.reads as f64).sum::<f64>() / rt;
    let writes = samples.iter().map(|s| s.writes as f64).sum::<f64>() / rt;
    let events = samples.iter().map(|s| s.events as f64).sum::<f64>() / rt;
    let stats = samples
        .iter()
        .map(|s| s.stats)
        .collect::<Option<Vec<_>>>()
        .map(|v| {
            let f = |g: fn(&pollshot::Stats) -> u64| v.iter().map(g).sum::<u64>() as f64 / rt;
            [
                f(|s| s.ctl_calls),
                f(|s| s.adds),
                f(|s| s.modifies),
                f(|s| s.quiets + s.deletes),
                f(|s| s.waits),
                f(|s| s.wakes + s.wake_reads),
                f(|s| s.stale),
            ]
        });
    Summary {
        rate: median(&rates),
        cpu_us: median(&cpus),
        cpu_spread: {
            let (lo, hi) = cpus.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &c| {
                (lo.min(c), hi.max(c))
            });
            (hi - lo) / median(&cpus)
        },
        reads,
        writes,
        events,
        stats,
    }
}

/// The hand-written loop an implementation is held against: sharded to sharded.
fn floor_of(name: &str) -> &'static str {
    if name.ends_with("-sharded") {
        "epoll-hand-sharded"
    } else {
        "epoll-hand"
    }
}

fn print_table(p: usize, t: usize, rows: &[(&str, Summary)]) {
    let get = |n: &str| rows.iter().find(|(m, _)| *m == n).map(|(_, s)| s.rate);
    let cpu = |n: &str| rows.iter().find(|(m, _)| *m == n).map(|(_, s)| s.cpu_us);
    println!();
    println!("P={p} T={t}");
    println!(
        "{:<26} {:>11} {:>8} {:>7} {:>8} {:>7} {:>7} {:>5} {:>5} {:>6} {:>6} {:>6} {:>6}",
        "implementation",
        "rt/s",
        "cpu us",
        "x hand",
        "cpu hand",
        "x poll",
        "x mio",
        "read",
        "write",
        "ctl",
        "wait",
        "wake",
        "total"
    );
    for (name, s) in rows {
        let (ctl, wait, wake, total) = match s.stats {
            Some(st) => (
                per(Some(st[0])),
                per(Some(st[4])),
                per(Some(st[5])),
                per(Some(st[0] + st[4] + st[5] + s.reads + s.writes)),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        println!(
            "{:<26} {:>11.0} {:>8.2} {:>7} {:>8} {:>7} {:>7} {:>5.2} {:>5.2} {:>6} {:>6} {:>6} {:>6}",
            name,
            s.rate,
            s.cpu_us,
            ratio(Some(s.rate), get(floor_of(name))),
            // CPU efficiency against the floor: its CPU per round trip over ours.
            ratio(cpu(floor_of(name)), Some(s.cpu_us)),
            ratio(Some(s.rate), get("polling")),
            ratio(Some(s.rate), get("mio")),
            s.reads,
            s.writes,
            ctl,
            wait,
            wake,
            total,
        );
    }
}

/// The summaries of one run: per (P, T), per implementation.
type Results<'a> = [((usize, usize), Vec<(&'a str, Summary)>)];

/// One line per target of issue 5, with the measured value (the ratio of median
/// round trips per second) and, beside it, the same ratio in CPU time per round
/// trip (steadier on a shared machine).
fn print_targets(all: &Results<'_>) {
    let get = |p: usize, t: usize, n: &str| -> Option<Summary> {
        all.iter()
            .find(|(k, _)| *k == (p, t))
            .and_then(|(_, rows)| rows.iter().find(|(m, _)| *m == n).map(|(_, s)| *s))
    };
    // The rate ratio a/b, and the CPU ratio b/a, as one value for `line`.
    let r = |a: Option<Summary>, b: Option<Summary>| {
        a.zip(b)
            .map(|(a, b)| (a.rate / b.rate, b.cpu_us / a.cpu_us))
    };
    let line = |what: String, v: Option<(f64, f64)>, min: f64| match v {
        Some((v, c)) => println!(
            "  {:<4} {what}: {v:.2}x (target >= {min:.2}x; by CPU per round trip {c:.2}x)",
            if v >= min { "ok" } else { "MISS" }
        ),
        None => println!("  n/a  {what}: not measured in this run"),
    };
    println!();
    println!("targets (issue 5), medians of interleaved runs:");
    for ((p, t), rows) in all {
        for (n, floor) in [
            ("pollshot-epoll", "epoll-hand"),
            ("pollshot-epoll-sharded", "epoll-hand-sharded"),
        ] {
            if rows.iter().any(|(m, _)| *m == n) {
                line(
                    format!("P={p} T={t} {n} / {floor}"),
                    r(get(*p, *t, n), get(*p, *t, floor)),
                    0.97,
                );
            }
        }
    }
    for ((p, t), _) in all {
        let min = match t {
            1 => 1.35,
            2 => 1.2,
            _ => continue,
        };
        if *p == 1 {
            line(
                format!("P={p} T={t} pollshot-epoll / polling"),
                r(get(*p, *t, "pollshot-epoll"), get(*p, *t, "polling")),
                min,
            );
        }
    }
    for ((p, t), _) in all {
        match t {
            1 => line(
                format!("P={p} T={t} pollshot-epoll / mio"),
                r(get(*p, *t, "pollshot-epoll"), get(*p, *t, "mio")),
                1.0,
            ),
            2 => line(
                format!("P={p} T={t} pollshot-epoll-sharded / mio"),
                r(get(*p, *t, "pollshot-epoll-sharded"), get(*p, *t, "mio")),
                1.0,
            ),
            _ => {}
        }
    }
    for ((p, t), rows) in all {
        if let Some((_, s)) = rows.iter().find(|(m, _)| *m == "pollshot-epoll") {
            if let Some(st) = s.stats {
                let total = st[0] + st[4] + st[5] + s.reads + s.writes;
                // A wait cycle of an endpoint: armed, delivered once, handled.
                let ctl_per_cycle = st[0] / s.events.max(f64::MIN_POSITIVE);
                let near = |a: f64, b: f64| (a - b).abs() < 0.005;
                let base = (*p, *t) == (1, 1);
                let pass = near(ctl_per_cycle, 1.0) && st[5] < 0.005 && (!base || near(total, 8.0));
                println!(
                    "  {} P={p} T={t} pollshot-epoll: epoll_ctl per wait cycle {ctl_per_cycle:.3} \
                     (target 1.00), notifier calls/rt {:.4} (target 0), syscalls/rt {total:.2}{}",
                    if pass { "ok  " } else { "MISS" },
                    st[5],
                    if base { " (target 8.00)" } else { "" },
                );
            }
        }
    }
}

/// The implementations [`print_cpu_targets`] compares (`--cpu-targets` runs only
/// these).
const CPU_TARGET_IMPLS: [&str; 4] = [
    "pollshot-epoll",
    "epoll-hand",
    "pollshot-epoll-sharded",
    "mio",
];

/// Per cell of one interleaved run: CPU per round trip of `pollshot-epoll` over
/// `epoll-hand` (target at most 1.02x), and at T >= 2 `pollshot-epoll-sharded`
/// against `mio` (target: no more CPU per round trip than mio, so mio's over
/// sharded at least 1.00x; the rate ratio beside it). Spreads are (max - min) /
/// median of the runs' CPU per round trip.
fn print_cpu_targets(all: &Results<'_>, reps: usize) {
    let get =
        |rows: &[(&str, Summary)], n: &str| rows.iter().find(|(m, _)| *m == n).map(|(_, s)| *s);
    let (mut ok, mut cells) = (0, 0);
    println!();
    println!("CPU per round trip (median us of {reps} interleaved runs; spread in parentheses):");
    println!();
    println!(
        "| P, T | pollshot-epoll | epoll-hand | pollshot / hand (<= 1.02x) | pollshot-epoll-sharded | mio | mio / sharded (>= 1.00x) | rate sharded / mio |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|--:|");
    for ((p, t), rows) in all {
        let cell = |v: Option<Summary>| {
            v.map_or("-".to_string(), |s| {
                format!("{:.2} ({:.0}%)", s.cpu_us, s.cpu_spread * 100.0)
            })
        };
        let (ps, hand, mio) = (
            get(rows, "pollshot-epoll"),
            get(rows, "epoll-hand"),
            get(rows, "mio"),
        );
        let sh = if *t >= 2 {
            get(rows, "pollshot-epoll-sharded")
        } else {
            None
        };
        let mut verdict = |v: Option<f64>, pass: fn(f64) -> bool| match v {
            Some(x) => {
                cells += 1;
                if pass(x) {
                    ok += 1;
                    format!("{x:.3}x ok")
                } else {
                    format!("{x:.3}x MISS")
                }
            }
            None => "-".to_string(),
        };
        let vs_hand = verdict(ps.zip(hand).map(|(a, b)| a.cpu_us / b.cpu_us), |x| {
            x <= 1.02
        });
        let vs_mio = verdict(sh.zip(mio).map(|(a, b)| b.cpu_us / a.cpu_us), |x| x >= 1.0);
        println!(
            "| {p}, {t} | {} | {} | {vs_hand} | {} | {} | {vs_mio} | {} |",
            cell(ps),
            cell(hand),
            cell(sh),
            cell(mio),
            ratio(sh.map(|s| s.rate), mio.map(|s| s.rate)),
        );
    }
    println!();
    println!("{ok} of {cells} CPU targets met");
}

/// The bench (its entry in `benches/entry/` calls it).
pub fn main() {
    common::refuse_rump_kernel("pingpong");
    let args = Args::parse();
    args.only(&[
        "pairs",
        "threads",
        "impl",
        "reps",
        "millis",
        "rounds",
        "list",
        "cpu-targets",
        "chart",
    ]);
    let cpu_targets = args.flag("cpu-targets");
    if cpu_targets && args.get("impl").is_some() {
        die("--cpu-targets runs its own implementations: drop --impl");
    }
    let all = impls();
    if args.flag("list") {
        for (n, _, _) in &all {
            println!("{n}");
        }
        return;
    }
    let quick = common::quick();
    let pairs = args.list("pairs", &[1, 8, 64]);
    let threads = args.list("threads", if cpu_targets { &[1, 2] } else { &[1, 2, 4] });
    let reps: usize = args.num("reps", if quick { 3 } else { 5 });
    let millis: u64 = args.num("millis", if quick { 100 } else { 300 });
    let rounds: Option<u64> = args.get("rounds").map(|_| args.num("rounds", 0u64));
    if pairs.contains(&0) || threads.contains(&0) || reps == 0 || rounds == Some(0) {
        die("--pairs, --threads, --reps and --rounds must be at least 1");
    }
    let chosen: Vec<_> = match args.get("impl") {
        Some(names) => names
            .split(',')
            .map(|name| {
                all.iter()
                    .find(|(n, _, _)| *n == name)
                    .cloned()
                    .unwrap_or_else(|| {
                        let known: Vec<_> = all.iter().map(|(n, _, _)| *n).collect();
                        die(&format!("--impl {name:?}: not one of {}", known.join(", ")))
                    })
            })
            .collect(),
        None if cpu_targets => all
            .iter()
            .filter(|(n, _, _)| CPU_TARGET_IMPLS.contains(n))
            .cloned()
            .collect(),
        None => all.clone(),
    };
    println!(
        "pingpong: {} byte round trips; {}; {reps} interleaved repetitions of {}; stats {}",
        MSG,
        common::machine(),
        match rounds {
            Some(r) => format!("{r} round trips"),
            None => format!("{millis} ms"),
        },
        if cfg!(feature = "stats") { "on" } else { "off" },
    );
    println!(
        "columns: median round trips/s; CPU us per round trip (getrusage, all threads); ratios of medians \
         to the hand-written loop (sharded to sharded), polling, mio; per round trip: read and write calls \
         (counted by the bench), pollshot's ctl/wait/notifier calls (its counters) and their total"
    );
    let mut results = Vec::new();
    for &t in &threads {
        for &p in &pairs {
            let cfg = Cfg {
                pairs: p,
                threads: t,
                rounds,
                millis,
            };
            // At T=1 a sharded run is the same as a shared one.
            let list: Vec<_> = chosen
                .iter()
                .filter(|(_, _, sh)| !(*sh && t == 1 && args.get("impl").is_none()))
                .collect();
            let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); list.len()];
            for rep in 0..reps {
                // Rotate the order so no implementation always runs first.
                for k in 0..list.len() {
                    let j = (k + rep) % list.len();
                    let (name, f, _) = list[j];
                    let s =
                        f(name, &cfg).unwrap_or_else(|e| die(&format!("{name} P={p} T={t}: {e}")));
                    samples[j].push(s);
                }
            }
            let rows: Vec<(&str, Summary)> = list
                .iter()
                .zip(&samples)
                .map(|((n, _, _), s)| (*n, summarize(s)))
                .collect();
            print_table(p, t, &rows);
            if args.get("impl").is_some() {
                let total: u64 = samples.iter().flatten().map(|s| s.rt).sum();
                println!("round_trips={total}");
            }
            results.push(((p, t), rows));
        }
    }
    if args.get("impl").is_none() {
        if !cpu_targets {
            print_targets(&results);
        }
        print_cpu_targets(&results, reps);
    }
    if let Some(path) = args.get("chart") {
        write_chart(path, &results, reps, millis, rounds);
    }
}

/// `--chart FILE`: the grid's medians as an SVG chart (`benches/common/chart.rs`).
fn write_chart(path: &str, results: &Results<'_>, reps: usize, millis: u64, rounds: Option<u64>) {
    let pollshot = format!(
        "pollshot-{}",
        Poller::new().map_or("?", |p| p.backend_name())
    );
    let wanted = [pollshot.as_str(), "epoll-hand", "mio", "polling"];
    let series: Vec<&str> = wanted
        .into_iter()
        .filter(|name| {
            results
                .iter()
                .any(|(_, rows)| rows.iter().any(|(n, _)| n == name))
        })
        .collect();
    let groups: Vec<chart::Group> = results
        .iter()
        .map(|&((p, t), ref rows)| chart::Group {
            label: format!("P={p} T={t}"),
            values: series
                .iter()
                .map(|name| {
                    rows.iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, s)| (s.rate, s.cpu_us))
                })
                .collect(),
        })
        .collect();
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "CPU model unknown".into());
    let notes = [
        format!("cargo bench --bench pingpong -- {}", args.join(" ")),
        format!(
            "{}; {cpu}; {reps} interleaved repetitions of {} per bar",
            common::machine(),
            match rounds {
                Some(r) => format!("{r} round trips"),
                None => format!("{millis} ms"),
            }
        ),
    ];
    let title = "pingpong: 64-byte round trips on P socketpairs, T threads on one poller";
    match chart::write(std::path::Path::new(path), title, &notes, &series, &groups) {
        Ok(()) => println!("chart: {path} ({})", series.join(", ")),
        Err(e) => die(&format!("--chart {path}: {e}")),
    }
}
