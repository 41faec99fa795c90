//! One run of the workload on one backend: P socketpairs, T threads delivering on
//! one shared `Poller`, round trips of 64 bytes, every echo checked byte for byte.
//!
//! Each pair has a client end that writes 64 bytes and an echo end that writes
//! them back. Handlers follow the runtime pattern: try the I/O, arm only when there
//! is nothing to read; a woken endpoint reads once and does not drain. After an
//! endpoint's own write the next read cannot succeed yet (the peer has not
//! answered), so it arms at once. One round trip on epoll at P=1 thus costs 8 system
//! calls: per side one read, one write, one `EPOLL_CTL_MOD` and one wait. With more
//! pairs, one wait returns several events and the waits are shared.

use pollshot::{Backend, Events, Interest, Poller, Stats, Token};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MSG: usize = 64;

/// One end of a connected pair, as a run uses it: made in pairs, registered,
/// read and written. Host sockets (`HostSock`), or a NetBSD rump kernel's
/// `AF_LOCAL` sockets (`--cfg pollshot_rump`: `pollshot::rump::RumpFd`).
pub trait Sock: Send + Sync + Sized + 'static {
    /// Whose kernel runs the sockets, for the report: `None` for the host's;
    /// a run on another kernel reports counts, never rates.
    const KERNEL: Option<&'static str>;
    /// A connected pair, both ends non-blocking.
    fn pair() -> io::Result<(Self, Self)>;
    /// One read(2).
    fn read(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// One write(2).
    fn write(&self, buf: &[u8]) -> io::Result<usize>;
    /// Registers this end with `poller`.
    fn register<B: Backend>(&self, poller: &Poller<B>) -> io::Result<Token>;
}

/// The host's connected pair: a Unix socketpair; on Windows (no socketpair) a
/// TCP loopback pair, Nagle off.
#[cfg(unix)]
pub type HostSock = std::os::unix::net::UnixStream;
/// See the Unix definition.
#[cfg(windows)]
pub type HostSock = std::net::TcpStream;

impl Sock for HostSock {
    const KERNEL: Option<&'static str> = None;

    #[cfg(unix)]
    fn pair() -> io::Result<(Self, Self)> {
        let (a, b) = HostSock::pair()?;
        a.set_nonblocking(true)?;
        b.set_nonblocking(true)?;
        Ok((a, b))
    }

    #[cfg(windows)]
    fn pair() -> io::Result<(Self, Self)> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let client = HostSock::connect(listener.local_addr()?)?;
        let (echo, _) = listener.accept()?;
        for s in [&client, &echo] {
            s.set_nodelay(true)?;
            s.set_nonblocking(true)?;
        }
        Ok((client, echo))
    }

    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&mut &*self).read(buf)
    }

    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        (&mut &*self).write(buf)
    }

    fn register<B: Backend>(&self, poller: &Poller<B>) -> io::Result<Token> {
        poller.register(self)
    }
}

/// A NetBSD rump kernel's `AF_LOCAL` socketpair (`--cfg pollshot_rump`): the
/// kqueue backend's kernel there; registered with `register_raw`.
#[cfg(pollshot_rump)]
impl Sock for pollshot::rump::RumpFd {
    const KERNEL: Option<&'static str> = Some("NetBSD 7.99 rump kernel");

    fn pair() -> io::Result<(Self, Self)> {
        pollshot::rump::RumpFd::socketpair()
    }

    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        pollshot::rump::RumpFd::read(self, buf)
    }

    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        pollshot::rump::RumpFd::write(self, buf)
    }

    fn register<B: Backend>(&self, poller: &Poller<B>) -> io::Result<Token> {
        use std::os::fd::AsRawFd;
        // SAFETY: the number is open (owned by `self`, which outlives the run's
        // registration: `run` deregisters every token before the sockets drop);
        // the poller only passes it to the rump kernel's kevent.
        unsafe { poller.register_raw(self.as_raw_fd()) }
    }
}

/// What one run measured.
pub struct Report {
    /// The backend's name, as the poller gives it.
    pub backend: &'static str,
    /// The kernel the run's sockets and poller ran on, where not the host's (a
    /// NetBSD rump kernel): its figures are counts, never rates.
    pub kernel: Option<&'static str>,
    /// Round trips completed (the rounds asked for, rounded up to a multiple of
    /// the pairs).
    pub round_trips: u64,
    /// From the first message to the last echo.
    pub elapsed: Duration,
    /// Socket reads and writes the handlers made (the poller does not count them).
    pub reads: u64,
    /// See `reads`.
    pub writes: u64,
    /// Reads that found nothing (`WouldBlock`): a delivery that was not real
    /// readiness, a spurious wake-up. 0 on epoll and poll(2); on io_uring a few
    /// with several threads (a poll request completes with the readiness its
    /// wake-up carried, which a writer's late wake-up can carry for data
    /// already read: docs/guarantees.md, "Limits").
    pub empty_reads: u64,
    /// The poller's counters over the run.
    pub stats: Stats,
}

/// One end of a socketpair and what its handler remembers.
struct Endpoint<S> {
    sock: S,
    pair: usize,
    client: bool,
    state: Mutex<State>,
}

struct State {
    buf: [u8; MSG],
    /// Bytes of `buf` received so far (a message may arrive in pieces).
    have: usize,
    /// Client: round trips completed.
    done: u64,
}

/// Everything the threads share.
struct Shared<B: Backend, S> {
    poller: Poller<B>,
    endpoints: Vec<Endpoint<S>>,
    /// Endpoint index by token index.
    by_slot: Vec<usize>,
    tokens: Vec<Token>,
    /// Round trips per pair.
    quota: u64,
    /// Clients still running; when it reaches 0, `finished` is set.
    running: AtomicUsize,
    finished: AtomicBool,
}

/// What one thread counted.
#[derive(Default, Clone, Copy)]
struct Counts {
    round_trips: u64,
    reads: u64,
    writes: u64,
    empty_reads: u64,
}

/// The message for round trip `n` of pair `pair`: recognisable bytes to check.
fn message(pair: usize, n: u64) -> [u8; MSG] {
    let mut m = [0u8; MSG];
    m[..8].copy_from_slice(&n.to_le_bytes());
    m[8..16].copy_from_slice(&(pair as u64).to_le_bytes());
    for (i, b) in m[16..].iter_mut().enumerate() {
        *b = (n as u8).wrapping_mul(31).wrapping_add(i as u8) ^ pair as u8;
    }
    m
}

impl<B: Backend, S: Sock> Shared<B, S> {
    /// The handler for a delivered (readable) endpoint: reads once, answers a
    /// complete message, and re-arms unless the client has finished.
    fn handle(&self, i: usize, counts: &mut Counts) -> io::Result<()> {
        let ep = &self.endpoints[i];
        let mut st = ep.state.lock().unwrap();
        let st = &mut *st;
        counts.reads += 1;
        match ep.sock.read(&mut st.buf[st.have..]) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed mid-run",
                ))
            }
            Ok(n) => st.have += n,
            // Nothing there after all: a spurious wake-up (libkqueue can hand one
            // readiness to two waiters). Counted, and armed again.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => counts.empty_reads += 1,
            Err(e) => return Err(e),
        }
        if st.have == MSG {
            st.have = 0;
            if ep.client {
                if st.buf != message(ep.pair, st.done) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "pair {}: round trip {}: the echo differs from what was sent",
                            ep.pair, st.done
                        ),
                    ));
                }
                st.done += 1;
                counts.round_trips += 1;
                if st.done == self.quota {
                    if self.running.fetch_sub(1, Ordering::AcqRel) == 1 {
                        self.finished.store(true, Ordering::Release);
                        self.poller.notify()?;
                    }
                    return Ok(());
                }
                counts.writes += 1;
                write_message(&ep.sock, &message(ep.pair, st.done))?;
            } else {
                counts.writes += 1;
                write_message(&ep.sock, &st.buf)?;
            }
        }
        self.poller.arm(self.tokens[i], Interest::READABLE)
    }

    /// One thread: deliver, handle, until every client has finished.
    fn serve(&self) -> io::Result<Counts> {
        let mut counts = Counts::default();
        let mut events = Events::with_capacity(64);
        while !self.finished.load(Ordering::Acquire) {
            match self.poller.deliver(&mut events, None) {
                // A signal (or, on io_uring, the kernel's task work) ended the
                // wait: wait again, as every caller of a blocking call should.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => r?,
            };
            for event in &events {
                self.handle(self.by_slot[event.token().index()], &mut counts)?;
            }
        }
        // `notify` wakes one waiter: pass the wake-up on to the next thread.
        self.poller.notify()?;
        Ok(counts)
    }
}

/// A 64-byte write to a socket with room for it completes at once.
fn write_message(sock: &impl Sock, msg: &[u8; MSG]) -> io::Result<()> {
    let n = sock.write(msg)?;
    if n != MSG {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short write"));
    }
    Ok(())
}

/// Adds what failed to an error: `socketpair: Too many open files`.
fn context(what: &'static str) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// One run on backend `B` with sockets `S`: `pairs` socketpairs, `threads`
/// delivering threads, `rounds` round trips in all (rounded up to a multiple of
/// `pairs`).
///
/// # Errors
/// Creating the poller, a socketpair or a thread failed (EMFILE, EAGAIN), or the
/// run went wrong (a short write, an echo that differs, an early EOF).
pub fn run<B: Backend, S: Sock>(pairs: usize, threads: usize, rounds: u64) -> io::Result<Report> {
    let poller = Poller::<B>::with_backend().map_err(context("creating the poller"))?;
    let quota = rounds.div_ceil(pairs as u64).max(1);
    let mut endpoints = Vec::with_capacity(2 * pairs);
    for pair in 0..pairs {
        let (client, echo) = S::pair().map_err(context("socketpair"))?;
        for (sock, is_client) in [(client, true), (echo, false)] {
            endpoints.push(Endpoint {
                sock,
                pair,
                client: is_client,
                state: Mutex::new(State {
                    buf: [0; MSG],
                    have: 0,
                    done: 0,
                }),
            });
        }
    }
    let mut tokens = Vec::with_capacity(endpoints.len());
    let mut by_slot = vec![0; endpoints.len()];
    for (i, ep) in endpoints.iter().enumerate() {
        let token = ep.sock.register(&poller).map_err(context("register"))?;
        if by_slot.len() <= token.index() {
            by_slot.resize(token.index() + 1, 0);
        }
        by_slot[token.index()] = i;
        tokens.push(token);
    }
    let shared = Arc::new(Shared {
        poller,
        endpoints,
        by_slot,
        tokens,
        quota,
        running: AtomicUsize::new(pairs),
        finished: AtomicBool::new(false),
    });

    let before = shared.poller.stats();
    let start = Instant::now();
    let mut total = Counts::default();
    // Start every pair: the client writes its first message, both ends wait to read.
    for (i, ep) in shared.endpoints.iter().enumerate() {
        if ep.client {
            total.writes += 1;
            write_message(&ep.sock, &message(ep.pair, 0))?;
        }
        shared.poller.arm(shared.tokens[i], Interest::READABLE)?;
    }
    let mut handles = Vec::with_capacity(threads);
    for _ in 0..threads {
        let shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("pingpong".into())
            .spawn(move || shared.serve());
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                // The threads already running would wait for round trips that
                // cannot all happen: give up on the run (the process exits).
                return Err(context("spawning a delivering thread")(e));
            }
        }
    }
    for h in handles {
        let c = h.join().expect("a delivering thread panicked")?;
        total.round_trips += c.round_trips;
        total.reads += c.reads;
        total.writes += c.writes;
        total.empty_reads += c.empty_reads;
    }
    let elapsed = start.elapsed();
    let stats = shared.poller.stats().since(&before);

    let expected = quota * pairs as u64;
    if total.round_trips != expected {
        return Err(io::Error::other(format!(
            "{} round trips completed, {expected} expected",
            total.round_trips
        )));
    }
    for ep in &shared.endpoints {
        if ep.client && ep.state.lock().unwrap().done != quota {
            return Err(io::Error::other(format!("pair {} did not finish", ep.pair)));
        }
    }
    let shared = Arc::try_unwrap(shared).ok().expect("threads have finished");
    for t in &shared.tokens {
        shared.poller.deregister(*t)?;
    }
    Ok(Report {
        backend: shared.poller.backend_name(),
        kernel: S::KERNEL,
        round_trips: total.round_trips,
        elapsed,
        reads: total.reads,
        writes: total.writes,
        empty_reads: total.empty_reads,
        stats,
    })
}

#[cfg(test)]
mod tests {
    use super::{run, HostSock, Sock};

    /// A short real run on each backend that keeps its delivery exact: every round
    /// trip completes, each side reads and writes once per round trip, and no
    /// delivery finds its socket empty (a spurious wake-up).
    fn exact<B: pollshot::Backend, S: Sock>() {
        let r = run::<B, S>(8, 2, 4000).unwrap();
        assert_eq!(r.round_trips, 4000);
        assert_eq!((r.reads, r.writes), (8000, 8000), "{}", r.backend);
        assert_eq!(r.empty_reads, 0, "{}: spurious wake-ups", r.backend);
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn epoll_run_is_exact() {
        exact::<pollshot::backends::Epoll, HostSock>();
    }

    #[cfg(unix)]
    #[test]
    fn blocking_run_is_exact() {
        exact::<pollshot::backends::Blocking, HostSock>();
    }

    #[cfg(windows)]
    #[test]
    fn afd_run_is_exact() {
        exact::<pollshot::backends::Afd, HostSock>();
    }

    /// The system calls of a run at one thread, exact: what the printed
    /// figures per round trip rest on. With one thread every delivery is read
    /// and answered before the next wait, and a socketpair's write makes its
    /// peer readable at once, so the waits are exactly `2 R / P` (each returns
    /// the P clients, or the P echo ends): a round trip costs 2 reads, 2 writes
    /// and `2 / P` waits, and every delivery re-arms (a modify) but each
    /// client's last one. Besides them: the first arm of each end (an add), and
    /// the wake-ups at the end (the last client's notify, and the thread's
    /// pass-on as it leaves: one or two). Where the re-arms go (riding on the
    /// waits, or calls of their own) is the backend's: the caller checks
    /// `ctl_calls`.
    #[cfg(any(target_os = "linux", target_os = "android", pollshot_kqueue))]
    fn one_thread_counts<B: pollshot::Backend, S: Sock>(pairs: u64, rounds: u64) -> super::Stats {
        let r = run::<B, S>(pairs as usize, 1, rounds).unwrap();
        let s = r.stats;
        assert_eq!(r.round_trips, rounds, "{}", r.backend);
        assert_eq!((r.reads, r.writes), (2 * rounds, 2 * rounds), "{s:?}");
        assert_eq!(
            s.waits,
            2 * rounds / pairs,
            "one wait per P deliveries: {s:?}"
        );
        assert_eq!(
            (s.adds, s.modifies),
            (2 * pairs, 2 * rounds - pairs),
            "{s:?}"
        );
        assert_eq!((s.quiets, s.stale, r.empty_reads), (0, 0, 0), "{s:?}");
        assert!((1..=2).contains(&(s.wakes + s.wake_reads)), "{s:?}");
        s
    }

    /// kqueue at one thread: every re-arm rides on a wait, so the change-only
    /// calls are the first arms' (an add is submitted at once): 6 system calls
    /// per round trip at P=1 (2 of them `kevent` waits), 4.25 at P=8.
    #[cfg(pollshot_kqueue)]
    fn kqueue_one_thread<S: Sock>() {
        for pairs in [1, 8] {
            let s = one_thread_counts::<pollshot::backends::Kqueue, S>(pairs, 2000);
            assert_eq!(s.ctl_calls, 2 * pairs, "re-arms ride on the waits: {s:?}");
        }
    }

    /// libkqueue, a BSD or macOS.
    #[cfg(all(pollshot_kqueue, not(pollshot_rump)))]
    #[test]
    fn kqueue_one_thread_counts_are_exact() {
        kqueue_one_thread::<HostSock>();
    }

    /// The same on NetBSD kernel code: the kqueue backend on a rump kernel's
    /// `AF_LOCAL` socketpairs (`--cfg pollshot_rump`), and the short run at two
    /// threads.
    #[cfg(pollshot_rump)]
    #[test]
    fn kqueue_on_rump_counts_are_exact() {
        kqueue_one_thread::<pollshot::rump::RumpFd>();
        exact::<pollshot::backends::Kqueue, pollshot::rump::RumpFd>();
    }

    /// epoll at one thread: one `epoll_ctl` per command (8 system calls per
    /// round trip at P=1, 6.25 at P=8).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn epoll_one_thread_counts_are_exact() {
        for pairs in [1, 8] {
            let s = one_thread_counts::<pollshot::backends::Epoll, HostSock>(pairs, 2000);
            assert_eq!(s.ctl_calls, s.adds + s.modifies, "{s:?}");
        }
    }
}
