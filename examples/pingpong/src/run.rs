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
#[cfg(unix)]
use std::os::unix::net::UnixStream as Sock;
// Windows has no socketpair: a TCP loopback pair (`connected_pair`).
#[cfg(windows)]
use std::net::TcpStream as Sock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MSG: usize = 64;

/// What one run measured.
pub struct Report {
    /// The backend's name, as the poller gives it.
    pub backend: &'static str,
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
    /// readiness, a spurious wake-up. 0 on epoll and io_uring.
    pub empty_reads: u64,
    /// The poller's counters over the run.
    pub stats: Stats,
}

/// One end of a socketpair and what its handler remembers.
struct Endpoint {
    sock: Sock,
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
struct Shared<B: Backend> {
    poller: Poller<B>,
    endpoints: Vec<Endpoint>,
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

impl<B: Backend> Shared<B> {
    /// The handler for a delivered (readable) endpoint: reads once, answers a
    /// complete message, and re-arms unless the client has finished.
    fn handle(&self, i: usize, counts: &mut Counts) -> io::Result<()> {
        let ep = &self.endpoints[i];
        let mut st = ep.state.lock().unwrap();
        let st = &mut *st;
        counts.reads += 1;
        match (&ep.sock).read(&mut st.buf[st.have..]) {
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
fn write_message(mut sock: &Sock, msg: &[u8; MSG]) -> io::Result<()> {
    let n = sock.write(msg)?;
    if n != MSG {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short write"));
    }
    Ok(())
}

/// A connected pair of sockets: a socketpair on Unix.
#[cfg(unix)]
fn connected_pair() -> io::Result<(Sock, Sock)> {
    Sock::pair()
}

/// A connected pair of sockets: on Windows a TCP loopback pair, Nagle off.
#[cfg(windows)]
fn connected_pair() -> io::Result<(Sock, Sock)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let client = Sock::connect(listener.local_addr()?)?;
    let (echo, _) = listener.accept()?;
    for s in [&client, &echo] {
        s.set_nodelay(true)?;
    }
    Ok((client, echo))
}

/// Adds what failed to an error: `socketpair: Too many open files`.
fn context(what: &'static str) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// One run on backend `B`: `pairs` socketpairs, `threads` delivering threads,
/// `rounds` round trips in all (rounded up to a multiple of `pairs`).
///
/// # Errors
/// Creating the poller, a socketpair or a thread failed (EMFILE, EAGAIN), or the
/// run went wrong (a short write, an echo that differs, an early EOF).
pub fn run<B: Backend>(pairs: usize, threads: usize, rounds: u64) -> io::Result<Report> {
    let poller = Poller::<B>::with_backend().map_err(context("creating the poller"))?;
    let quota = rounds.div_ceil(pairs as u64).max(1);
    let mut endpoints = Vec::with_capacity(2 * pairs);
    for pair in 0..pairs {
        let (client, echo) = connected_pair().map_err(context("socketpair"))?;
        for (sock, is_client) in [(client, true), (echo, false)] {
            sock.set_nonblocking(true)?;
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
        let token = poller.register(&ep.sock).map_err(context("register"))?;
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
    use super::run;

    /// A short real run on each backend that keeps its delivery exact: every round
    /// trip completes, each side reads and writes once per round trip, and no
    /// delivery finds its socket empty (a spurious wake-up).
    fn exact<B: pollshot::Backend>() {
        let r = run::<B>(8, 2, 4000).unwrap();
        assert_eq!(r.round_trips, 4000);
        assert_eq!((r.reads, r.writes), (8000, 8000), "{}", r.backend);
        assert_eq!(r.empty_reads, 0, "{}: spurious wake-ups", r.backend);
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn epoll_run_is_exact() {
        exact::<pollshot::backends::Epoll>();
    }

    #[cfg(unix)]
    #[test]
    fn blocking_run_is_exact() {
        exact::<pollshot::backends::Blocking>();
    }

    #[cfg(windows)]
    #[test]
    fn afd_run_is_exact() {
        exact::<pollshot::backends::Afd>();
    }
}
