//! pingpong: the main job. P socketpairs, T threads delivering on one shared
//! `Poller`, R round trips of 64 bytes; for every backend compiled on this OS it
//! prints round trips per second, the reads that found nothing (EAGAIN after a
//! delivery), and system calls per round trip by kind.
//!
//! ```text
//! cargo run --release --example pingpong [-- --pairs P --threads T --rounds R --backend NAME]
//! ```
//!
//! - `--pairs P`: socketpairs (default 8)
//! - `--threads T`: threads calling `deliver` on the one poller (default 2)
//! - `--rounds R`: round trips in all, spread over the pairs (default 300000)
//! - `--backend epoll|kqueue|blocking|all`: default `all` (those compiled here:
//!   epoll and blocking on Linux; kqueue and blocking on the BSDs and macOS, or on
//!   Linux built with `RUSTFLAGS="--cfg pollshot_libkqueue"` against libkqueue)
//!
//! Each pair has a client end that writes 64 bytes and an echo end that writes
//! them back. Handlers follow the runtime pattern: try the I/O, arm only when there
//! is nothing to read; a woken endpoint reads once and does not drain. After an
//! endpoint's own write the next read cannot succeed yet (the peer has not
//! answered), so it arms at once. One round trip on epoll at P=1 thus costs 8 system
//! calls: per side one read, one write, one `EPOLL_CTL_MOD` and one wait. With more
//! pairs, one wait returns several events and the waits are shared.
//!
//! The poller's counts come from `Poller::stats()` (cargo feature `stats`; the
//! crate's dev-dependency on itself turns it on for examples); reads and writes are
//! counted here, where they are made. Every echo is checked byte for byte.

use pollshot::{Backend, Events, Interest, Poller, Token};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MSG: usize = 64;

/// One end of a socketpair and what its handler remembers.
struct Endpoint {
    sock: UnixStream,
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
    /// Reads after a delivery that found nothing (EAGAIN): a delivery that did
    /// not describe the descriptor's state when it was handled.
    empty_reads: u64,
    writes: u64,
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
            // Nothing there after all: a delivery that did not describe the
            // descriptor when it was handled (counted and printed); arm again.
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
            self.poller.deliver(&mut events, None)?;
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
fn write_message(mut sock: &UnixStream, msg: &[u8; MSG]) -> io::Result<()> {
    let n = sock.write(msg)?;
    if n != MSG {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short write"));
    }
    Ok(())
}

/// One run on backend `B`: returns the line to print.
fn run<B: Backend>(pairs: usize, threads: usize, rounds: u64) -> io::Result<String> {
    let poller = Poller::<B>::with_backend()?;
    let quota = rounds.div_ceil(pairs as u64).max(1);
    let mut endpoints = Vec::with_capacity(2 * pairs);
    for pair in 0..pairs {
        let (client, echo) = UnixStream::pair()?;
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
        let token = poller.register(&ep.sock)?;
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

    #[cfg(feature = "stats")]
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
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let shared = shared.clone();
            std::thread::spawn(move || shared.serve())
        })
        .collect();
    for h in handles {
        let c = h.join().expect("a delivering thread panicked")?;
        total.round_trips += c.round_trips;
        total.reads += c.reads;
        total.empty_reads += c.empty_reads;
        total.writes += c.writes;
    }
    let secs = start.elapsed().as_secs_f64();

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
    let rt = total.round_trips as f64;
    let reads = total.reads as f64 / rt;
    let writes = total.writes as f64 / rt;
    let name = shared.poller.backend_name();
    let head = format!(
        "{name:<9} P={pairs} T={threads}  {:>8.0} round trips/s  EAGAIN reads {} of {}  syscalls/round trip: ",
        rt / secs.max(1e-9),
        total.empty_reads,
        total.reads
    );

    #[cfg(feature = "stats")]
    let tail = {
        let s = shared.poller.stats().since(&before);
        let per = |n: u64| n as f64 / rt;
        let commands = format!(
            "[add {:.2} mod {:.2} quiet {:.2} del {:.2}]",
            per(s.adds),
            per(s.modifies),
            per(s.quiets),
            per(s.deletes)
        );
        // What a registration command and a wait are called on this backend.
        let (ctl, wait) = match name {
            "epoll" => (
                format!("epoll_ctl {:.2} {commands}", per(s.ctl_calls)),
                "wait",
            ),
            "kqueue" => (
                format!(
                    "kevent for changes alone {:.2} {commands}",
                    per(s.ctl_calls)
                ),
                "kevent wait",
            ),
            _ => (format!("arms in memory, no syscall {commands}"), "poll"),
        };
        format!(
            "{:.2} ({ctl}, {wait} {:.2}, wake {:.2}, read {reads:.2}, write {writes:.2}); stale events dropped {}",
            per(s.syscalls()) + reads + writes,
            per(s.waits),
            per(s.wakes + s.wake_reads),
            s.stale,
        )
    };
    #[cfg(not(feature = "stats"))]
    let tail =
        format!("read {reads:.2}, write {writes:.2} (poller counts need the `stats` feature)");

    let shared = Arc::try_unwrap(shared).ok().expect("threads have finished");
    for t in &shared.tokens {
        shared.poller.deregister(*t)?;
    }
    Ok(head + &tail)
}

type Runner = fn(usize, usize, u64) -> io::Result<String>;

/// The backends compiled for this target, by name.
#[allow(clippy::vec_init_then_push)] // the pushes are cfg'd per target
fn backends() -> Vec<(&'static str, Runner)> {
    let mut compiled: Vec<(&str, Runner)> = Vec::new();
    #[cfg(any(target_os = "linux", target_os = "android"))]
    compiled.push(("epoll", run::<pollshot::backends::Epoll>));
    #[cfg(pollshot_kqueue)]
    compiled.push(("kqueue", run::<pollshot::backends::Kqueue>));
    compiled.push(("blocking", run::<pollshot::backends::Blocking>));
    compiled
}

fn usage(msg: &str) -> ! {
    eprintln!("pingpong: {msg}");
    eprintln!("usage: pingpong [--pairs P] [--threads T] [--rounds R] [--backend epoll|kqueue|blocking|all]");
    std::process::exit(2)
}

fn main() {
    let (mut pairs, mut threads, mut rounds, mut backend) =
        (8usize, 2usize, 300_000u64, "all".to_string());
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            println!(
                "pingpong: P socketpairs, T threads delivering on one shared poller, R round \
                 trips of 64 bytes each, on every backend compiled for this OS.\n\
                 usage: pingpong [--pairs P (8)] [--threads T (2)] [--rounds R (300000)] \
                 [--backend epoll|kqueue|blocking|all (all)]"
            );
            return;
        }
        let value = args
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        let number = || -> u64 {
            match value.parse() {
                Ok(n) if n > 0 => n,
                _ => usage(&format!("{flag} {value:?}: expected a number above 0")),
            }
        };
        match flag.as_str() {
            "--pairs" => pairs = number() as usize,
            "--threads" => threads = number() as usize,
            "--rounds" => rounds = number(),
            "--backend" => backend = value.clone(),
            _ => usage(&format!("unknown flag {flag:?}")),
        }
    }

    let compiled = backends();

    let chosen: Vec<_> = compiled
        .iter()
        .filter(|(n, _)| backend == "all" || *n == backend)
        .collect();
    if chosen.is_empty() {
        let names: Vec<_> = compiled.iter().map(|(n, _)| *n).collect();
        let why = if ["epoll", "kqueue", "blocking"].contains(&backend.as_str()) {
            "not compiled for this OS"
        } else {
            "unknown backend"
        };
        usage(&format!(
            "--backend {backend:?}: {why}; this build has {} (or all)",
            names.join(", ")
        ));
    }
    // A hang would be a bug: say so instead of waiting forever.
    let limit = Duration::from_secs(60 + rounds / 1000);
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("pingpong: no result after {limit:?}: giving up (this is a bug)");
        std::process::exit(1);
    });
    for (name, f) in chosen {
        match f(pairs, threads, rounds) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                eprintln!("pingpong: {name}: {e}");
                std::process::exit(1);
            }
        }
    }
}
