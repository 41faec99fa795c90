//! The guide's server (`examples/echo_server.rs`) under load: a few hundred
//! connections from threads of clients on loopback, every byte checked, resets and
//! half-closes among them; its deadlines, its timer protocol, and its shutdown.
//!
//! No timing decides a result: waits are for conditions (a byte, an EOF, a
//! counter), and a watchdog only turns a hang into a failure.
#![cfg(unix)]

#[allow(dead_code)] // the example's `main` and what only it uses
#[path = "../examples/echo_server.rs"]
mod echo_server;

#[allow(unused_macros)] // the per-backend `suite!`, not used here
mod common;

use echo_server::{Config, Counters, Server, Timers};
use pollshot::{Poller, Token};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// A read or write that takes this long means a hang: the test fails.
const HANG: Duration = Duration::from_secs(60);

/// Aborts the process if the test is still running after `HANG` and some: a hung
/// server fails the run instead of stalling it.
struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    fn new(name: &'static str) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        thread::spawn(move || {
            let start = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                if start.elapsed() > HANG * 3 {
                    eprintln!("{name}: hung for {:?}: aborting", start.elapsed());
                    std::process::abort();
                }
                thread::sleep(Duration::from_millis(50));
            }
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn start(config: Config) -> Server {
    Server::start(SocketAddr::from(([127, 0, 0, 1], 0)), config).expect("server starts")
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(HANG)).unwrap();
    s.set_write_timeout(Some(HANG)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Waits (for a condition, `HANG` at most) until the server has closed every
/// connection it accepted.
fn wait_all_closed(server: &Server) {
    let start = Instant::now();
    while server.counters().open() > 0 {
        assert!(
            start.elapsed() < HANG,
            "connections still open: {:?}",
            server.counters()
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// The byte at `offset` of stream `seed`: position dependent, so a lost,
/// repeated or reordered byte is seen.
fn pattern(seed: u64, offset: u64) -> u8 {
    ((offset ^ (seed << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

/// A small deterministic generator for chunk sizes.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Reads until EOF; returns what came.
fn read_to_eof(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    s.read_to_end(&mut got)
        .expect("read until the server's EOF");
    got
}

/// How an echo connection ends.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ending {
    /// Everything echoed, then `shutdown(Write)`: the server half-closes back.
    HalfClose,
    /// A last chunk written and `shutdown(Write)` at once, before its echo: the
    /// server must echo it after reading EOF, then half-close.
    HalfCloseInFlight,
    /// A chunk written and never read, then a reset.
    Reset,
    /// Everything echoed, then a plain close.
    Close,
}

const ENDINGS: [Ending; 4] = [
    Ending::HalfClose,
    Ending::HalfCloseInFlight,
    Ending::Reset,
    Ending::Close,
];

/// A connection the server has accepted: its first byte (`pattern(seed, 0)`)
/// came back. Opening the next one only then keeps the listener's accept queue
/// (128 long, std's backlog) from overflowing: Linux drops the handshake's last
/// ACK of a connection that finds the queue full, and the client, which thinks it
/// is connected, retransmits its data with a backoff that grows to seconds.
fn accepted(addr: SocketAddr, seed: u64) -> TcpStream {
    let mut s = connect(addr);
    s.write_all(&[pattern(seed, 0)]).unwrap();
    let mut one = [0];
    s.read_exact(&mut one).expect("the first byte's echo");
    assert_eq!(one, [pattern(seed, 0)], "stream {seed}: first byte");
    s
}

/// One client thread's connections: all open at once, driven in turns, every
/// echo compared byte for byte.
fn echo_clients(addr: SocketAddr, thread_no: u64, conns: usize, rounds: usize) {
    let mut streams: Vec<(u64, TcpStream, u64)> = (0..conns as u64)
        .map(|i| {
            let seed = thread_no * 1000 + i;
            (seed, accepted(addr, seed), 1)
        })
        .collect();
    let mut rng = 0x2545_F491_4F6C_DD1D ^ thread_no;
    for _ in 0..rounds {
        for (seed, s, offset) in &mut streams {
            let len = 1 + next(&mut rng) % 6000;
            let chunk: Vec<u8> = (*offset..*offset + len)
                .map(|o| pattern(*seed, o))
                .collect();
            s.write_all(&chunk).expect("write a chunk");
            let mut back = vec![0; chunk.len()];
            s.read_exact(&mut back).expect("read its echo");
            assert!(
                back == chunk,
                "stream {seed}: echo differs at offset {offset}"
            );
            *offset += len;
        }
    }
    for (seed, mut s, offset) in streams {
        match ENDINGS[(seed % 4) as usize] {
            Ending::HalfClose => {
                s.shutdown(Shutdown::Write).unwrap();
                assert_eq!(
                    read_to_eof(&mut s),
                    b"",
                    "stream {seed}: nothing after the echoes"
                );
            }
            Ending::HalfCloseInFlight => {
                let chunk: Vec<u8> = (offset..offset + 3000).map(|o| pattern(seed, o)).collect();
                s.write_all(&chunk).unwrap();
                s.shutdown(Shutdown::Write).unwrap();
                assert!(
                    read_to_eof(&mut s) == chunk,
                    "stream {seed}: the last chunk's echo, then EOF"
                );
            }
            Ending::Reset => {
                s.write_all(&[pattern(seed, offset); 100]).unwrap();
                common::close_with_reset(s);
            }
            Ending::Close => drop(s),
        }
    }
}

/// A connection whose client writes and does not read until the server has
/// stopped reading (its buffer full, `WRITABLE` armed only): then reads
/// everything, checks every byte, and half-closes. The writer writes until the
/// reader starts, so the server's buffer must fill, whatever the kernel's socket
/// buffers hold.
fn backpressure_client(addr: SocketAddr, seed: u64, paused: impl Fn() -> u64) {
    let s = accepted(addr, seed);
    let mut writer_side = s.try_clone().unwrap();
    let go = Arc::new(AtomicBool::new(false));
    let writer_go = Arc::clone(&go);
    let writer = thread::spawn(move || {
        let mut offset = 1u64; // after the first byte
        while !writer_go.load(Ordering::SeqCst) || offset < 256 * 1024 {
            let chunk: Vec<u8> = (offset..offset + 32 * 1024)
                .map(|o| pattern(seed, o))
                .collect();
            writer_side.write_all(&chunk).expect("backpressure writer");
            offset += chunk.len() as u64;
        }
        writer_side.shutdown(Shutdown::Write).unwrap();
        offset
    });
    let start = Instant::now();
    while paused() == 0 {
        assert!(start.elapsed() < HANG, "the server never stopped reading");
        thread::sleep(Duration::from_millis(1));
    }
    go.store(true, Ordering::SeqCst);
    let mut reader = s;
    let mut got = 1u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = reader.read(&mut buf).expect("backpressure reader");
        if n == 0 {
            break;
        }
        for (i, &b) in buf[..n].iter().enumerate() {
            let o = got + i as u64;
            assert_eq!(b, pattern(seed, o), "stream {seed}: byte {o}");
        }
        got += n as u64;
    }
    let written = writer.join().unwrap();
    assert_eq!(got, written, "stream {seed}: every byte written came back");
}

fn get(c: &AtomicU64) -> u64 {
    Counters::get(c)
}

#[test]
fn hundreds_of_connections_every_byte_echoed_with_resets_and_half_closes() {
    let _dog = Watchdog::new("hundreds_of_connections");
    const THREADS: u64 = 8;
    const CONNS: usize = 40;
    const BACKPRESSURE: u64 = 2;
    let server = Arc::new(start(Config {
        threads: 2,
        idle: Duration::from_secs(600), // no deadline fires under this load
        first_byte: Duration::from_secs(600),
        max_buffered: 16 * 1024,
    }));
    let addr = server.local_addr().unwrap();

    let mut clients: Vec<_> = (0..THREADS)
        .map(|t| thread::spawn(move || echo_clients(addr, t, CONNS, 8)))
        .collect();
    for b in 0..BACKPRESSURE {
        let server = Arc::clone(&server);
        clients.push(thread::spawn(move || {
            backpressure_client(addr, 9_000 + b, || get(&server.counters().paused))
        }));
    }
    for c in clients {
        c.join().expect("a client failed");
    }
    wait_all_closed(&server);

    let c = server.counters();
    let echo = THREADS * CONNS as u64;
    let resets = (0..THREADS)
        .flat_map(|t| (0..CONNS as u64).map(move |i| t * 1000 + i))
        .filter(|seed| ENDINGS[(seed % 4) as usize] == Ending::Reset)
        .count() as u64;
    assert_eq!(get(&c.accepted), echo + BACKPRESSURE, "{c:?}");
    assert_eq!(
        get(&c.closed_error),
        resets,
        "each reset closed on its error: {c:?}"
    );
    assert_eq!(get(&c.closed_eof), echo - resets + BACKPRESSURE, "{c:?}");
    assert_eq!(get(&c.closed_deadline), 0, "{c:?}");
    assert!(get(&c.paused) >= 1, "backpressure stopped reading: {c:?}");
    // epoll reports the readiness that holds at the wait: an event after which
    // the handler moved nothing would be a spin (readable armed while refusing to
    // read) or a lost arm.
    let backend = Poller::new().unwrap().backend_name();
    if backend == "epoll" {
        assert_eq!(get(&c.wasted), 0, "no event found nothing to do: {c:?}");
    }
    let server = Arc::into_inner(server).expect("the clients are gone");
    server.shutdown().expect("shutdown");
}

#[test]
fn deadlines_close_idle_and_silent_connections() {
    let _dog = Watchdog::new("deadlines");
    let server = start(Config {
        threads: 2,
        idle: Duration::from_millis(50),
        first_byte: Duration::from_millis(50),
        max_buffered: 16 * 1024,
    });
    let addr = server.local_addr().unwrap();
    let mut streams: Vec<TcpStream> = (0..10).map(|_| connect(addr)).collect();
    for (i, s) in streams.iter_mut().enumerate() {
        if i % 2 == 0 {
            // Talks once, then goes idle.
            s.write_all(b"ping").unwrap();
            let mut back = [0; 4];
            s.read_exact(&mut back).unwrap();
            assert_eq!(&back, b"ping");
        } // else: silent, closed by its first-byte deadline
    }
    for s in &mut streams {
        assert_eq!(
            read_to_eof(s),
            b"",
            "closed by the server, nothing more sent"
        );
    }
    wait_all_closed(&server);
    let c = server.counters();
    assert_eq!(get(&c.closed_deadline), 10, "{c:?}");
    assert_eq!(get(&c.accepted), 10, "{c:?}");
    server.shutdown().unwrap();
}

/// Silent connections are closed by their first-byte deadline (100 ms), 20 times,
/// while a talker, whose idle deadline (600 s) the timers' owner may be waiting
/// for, stays open and echoed.
#[test]
fn silent_connections_close_at_their_first_byte_deadline_while_a_talker_stays() {
    let _dog = Watchdog::new("first_byte_deadline");
    let server = start(Config {
        threads: 2,
        idle: Duration::from_secs(600),
        first_byte: Duration::from_millis(100),
        max_buffered: 16 * 1024,
    });
    let addr = server.local_addr().unwrap();
    let mut talker = connect(addr);
    let mut one = [0; 1];
    for trial in 0..20 {
        // The talker's byte keeps one worker busy while the silent connection
        // arrives.
        talker.write_all(&[trial]).unwrap();
        let mut silent = connect(addr);
        talker.read_exact(&mut one).unwrap();
        assert_eq!(one, [trial], "trial {trial}: the talker is still echoed");
        assert_eq!(read_to_eof(&mut silent), b"", "trial {trial}");
    }
    let c = server.counters();
    assert_eq!(get(&c.closed_deadline), 20, "{c:?}");
    assert_eq!(c.open(), 1, "the talker stays: {c:?}");
    server.shutdown().unwrap();
    assert_eq!(
        read_to_eof(&mut talker),
        b"",
        "the shutdown closed the talker"
    );
}

/// The timer protocol alone: one owner at a time, given up after its wait; a
/// deadline sooner than the owner's wake-up revokes it and asks for one notify,
/// a later one (or one with no owner: the pushing worker takes the timers
/// itself) for none.
#[test]
fn timers_hand_out_one_owner_and_ask_for_notifies_only_when_needed() {
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    let a = Token::from_u64(1);
    let b = Token::from_u64(2);
    let mut timers = Timers::default();
    // Nothing to wait for: no timeout, no owner.
    assert_eq!(timers.before_wait(t0), (vec![], None, None));
    assert!(!timers.push(at(1000), a), "no owner: the pusher waits next");
    // A worker takes the timers, with the earliest deadline's timeout.
    let (due, timeout, owner) = timers.before_wait(t0);
    assert!(due.is_empty());
    assert_eq!(timeout, Some(Duration::from_millis(1000)));
    assert!(owner.is_some());
    // A second worker waits without a timeout.
    assert_eq!(timers.before_wait(t0), (vec![], None, None));
    assert!(!timers.push(at(1500), b), "later than the owner's wake-up");
    assert!(timers.push(at(10), b), "sooner: cut the owner's wait short");
    assert!(
        !timers.push(at(5), a),
        "revoked already: the notified worker takes it"
    );
    let (_, timeout, second) = timers.before_wait(t0);
    assert_eq!(timeout, Some(Duration::from_millis(5)));
    // The revoked owner's wait ends late: it gives up nothing of the new owner's.
    timers.after_wait(owner);
    assert_eq!(timers.before_wait(t0), (vec![], None, None), "still owned");
    timers.after_wait(second);
    // Due entries come out in time order, each once.
    let (due, timeout, _) = timers.before_wait(at(1500));
    assert_eq!(due, vec![a, b, a, b]);
    assert_eq!(timeout, Some(Duration::ZERO), "look again before blocking");
    assert_eq!(timers.before_wait(at(1500)), (vec![], None, None));
}

/// The cut-short on a real poller: the owner blocks in `deliver` until a deadline
/// 600 s away; another worker pushes one 100 ms away, which asks for a notify;
/// the notify ends the owner's `deliver` (`Ok(0)`, notified), and its next wait
/// has the sooner timeout. 20 trials.
#[test]
fn a_sooner_deadline_cuts_the_owners_blocked_deliver_short() {
    let _dog = Watchdog::new("cut_short");
    for trial in 0..20 {
        let poller = Arc::new(Poller::new().unwrap());
        let timers = Arc::new(std::sync::Mutex::new(Timers::default()));
        let far = Instant::now() + Duration::from_secs(600);
        assert!(!timers.lock().unwrap().push(far, Token::from_u64(1)));
        let owner = {
            let (poller, timers) = (Arc::clone(&poller), Arc::clone(&timers));
            thread::spawn(move || {
                let mut events = pollshot::Events::with_capacity(8);
                let (_, timeout, mine) = timers.lock().unwrap().before_wait(Instant::now());
                assert!(mine.is_some() && timeout > Some(Duration::from_secs(500)));
                let n = poller.deliver(&mut events, timeout).unwrap();
                assert!(n == 0 && events.is_notified(), "ended by the notify");
                timers.lock().unwrap().after_wait(mine);
                timers.lock().unwrap().before_wait(Instant::now()).1
            })
        };
        // Push while the owner waits (blocked, or about to block: the notify is
        // counted either way).
        while poller.waiters() == 0 && !owner.is_finished() {
            thread::yield_now();
        }
        let soon = Instant::now() + Duration::from_millis(100);
        assert!(
            timers.lock().unwrap().push(soon, Token::from_u64(2)),
            "trial {trial}"
        );
        poller.notify().unwrap();
        let next = owner.join().expect("the owner's checks");
        assert!(
            matches!(next, Some(t) if t <= Duration::from_millis(100)),
            "trial {trial}: {next:?}"
        );
    }
}

/// Shutdown with every worker blocked, or busy, or about to block: every
/// worker exits, 20 times.
#[test]
fn shutdown_stops_every_worker() {
    let _dog = Watchdog::new("shutdown");
    for trial in 0..20 {
        let server = start(Config {
            threads: 4,
            ..Config::default()
        });
        let addr = server.local_addr().unwrap();
        if trial % 2 == 1 {
            // Busy workers: connections in flight while the stop comes.
            let mut s = connect(addr);
            s.write_all(b"busy").unwrap();
            let mut back = [0; 4];
            s.read_exact(&mut back).unwrap();
            server.shutdown().expect("shutdown");
            assert_eq!(
                read_to_eof(&mut s),
                b"",
                "trial {trial}: closed by the shutdown"
            );
        } else {
            server.shutdown().expect("shutdown");
        }
    }
}
