//! accept: N threads accepting on one TCP listener on 127.0.0.1, through one shared
//! pollshot poller (each backend compiled here), and through plain blocking
//! `accept` (1:1 threads), in one run with interleaved repetitions.
//!
//! Usage: `cargo bench --bench accept [-- --threads 2,4 --clients C --millis MS --reps N]`
//! (defaults 2,4 acceptors, 4 client threads, 1000 ms, 3 repetitions;
//! `POLLSHOT_BENCH_QUICK=1`: 300 ms, 2 repetitions). Built with `--cfg pollshot_rump`
//! (a NetBSD rump kernel, which has no TCP here) it refuses to run, saying why
//! (exit 2).
//!
//! Clients connect, wait for the server to close (which it does right after
//! accepting), and close with `SO_LINGER` 0 so no TIME_WAIT piles up. Through
//! pollshot the listener is registered once; the thread that is delivered its
//! readiness accepts one connection, re-arms (one `EPOLL_CTL_MOD`) so that another
//! thread can take the next one, then closes what it accepted. Reports accepts per
//! second, CPU time per accept (the whole process: the clients run in it too),
//! and the spread between the busiest and the idlest
//! acceptor (their counts and busiest/idlest).
// Unix only (descriptors, rusage): the bench's entry (`benches/entry/`) compiles
// this module on Unix only, and elsewhere says the bench cannot run there.
#![cfg(unix)]

#[path = "common/mod.rs"]
mod common;

use common::{cpu_time, die, median, Args};
use pollshot::{Backend, Events, Interest, Poller};
use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// What one run measured.
#[derive(Clone)]
struct Sample {
    per_thread: Vec<u64>,
    secs: f64,
    cpu: f64,
    connects: u64,
}

/// Connects until `stop`; each connection waits for the server's close.
fn client(addr: SocketAddr, stop: Arc<AtomicBool>, start: Arc<Barrier>) -> u64 {
    start.wait();
    let mut n = 0;
    let mut buf = [0u8; 16];
    while !stop.load(Ordering::Relaxed) {
        let mut s = match TcpStream::connect(addr) {
            Ok(s) => s,
            Err(e) => die(&format!("accept bench: connect: {e}")),
        };
        // The server closes right after accepting: EOF (or a reset).
        let _ = s.read(&mut buf);
        linger_zero(&s);
        n += 1;
    }
    n
}

/// `SO_LINGER` {on, 0}: close sends a reset and leaves no TIME_WAIT behind.
fn linger_zero(s: &TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt(2) reads `size_of::<linger>()` bytes from `&l`, which lives
    // across the call; the descriptor is an open socket owned by `s`.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .unwrap_or_else(|e| die(&format!("bind: {e}")));
    let a = l.local_addr().unwrap();
    (l, a)
}

/// Runs the clients for `millis` while `acceptors` serve; returns the sample.
fn load(
    addr: SocketAddr,
    clients: usize,
    millis: u64,
    acceptors: Vec<std::thread::JoinHandle<u64>>,
    stop_server: impl FnOnce(),
    start: Arc<Barrier>,
) -> Sample {
    let stop = Arc::new(AtomicBool::new(false));
    let cs: Vec<_> = (0..clients)
        .map(|_| {
            let (stop, start) = (stop.clone(), start.clone());
            std::thread::spawn(move || client(addr, stop, start))
        })
        .collect();
    let c0 = cpu_time();
    start.wait();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(millis));
    stop.store(true, Ordering::Relaxed);
    let connects: u64 = cs
        .into_iter()
        .map(|h| h.join().expect("a client panicked"))
        .sum();
    let secs = t0.elapsed().as_secs_f64();
    stop_server();
    let per_thread: Vec<u64> = acceptors
        .into_iter()
        .map(|h| h.join().expect("an acceptor panicked"))
        .collect();
    let cpu = (cpu_time() - c0).as_secs_f64();
    Sample {
        per_thread,
        secs,
        cpu,
        connects,
    }
}

/// N threads delivering on one pollshot poller of backend `B`.
fn via_pollshot<B: Backend>(threads: usize, clients: usize, millis: u64) -> io::Result<Sample> {
    let (l, addr) = listener();
    l.set_nonblocking(true)?;
    let poller = Arc::new(Poller::<B>::with_backend()?);
    let token = poller.register(&l)?;
    poller.arm(token, Interest::READABLE)?;
    let l = Arc::new(l);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(threads + clients + 1));
    let acceptors: Vec<_> = (0..threads)
        .map(|_| {
            let (poller, l, stop, start) = (poller.clone(), l.clone(), stop.clone(), start.clone());
            std::thread::spawn(move || {
                let mut events = Events::with_capacity(8);
                let mut n = 0u64;
                start.wait();
                while !stop.load(Ordering::Acquire) {
                    match poller.deliver(&mut events, None) {
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        r => r.expect("accept bench: deliver"),
                    };
                    if events.is_empty() {
                        continue;
                    }
                    // Accept one, re-arm at once so another thread takes the next.
                    let accepted = l.accept();
                    poller
                        .arm(token, Interest::READABLE)
                        .expect("accept bench: arm");
                    match accepted {
                        Ok((s, _)) => {
                            n += 1;
                            drop(s);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                        Err(e) => panic!("accept bench: accept: {e}"),
                    }
                }
                // Pass the wake-up on.
                poller.notify().expect("accept bench: notify");
                n
            })
        })
        .collect();
    let p = poller.clone();
    let sample = load(
        addr,
        clients,
        millis,
        acceptors,
        || {
            stop.store(true, Ordering::Release);
            p.notify().expect("accept bench: notify");
        },
        start,
    );
    poller.deregister(token)?;
    Ok(sample)
}

/// N threads blocked in accept(2) on one blocking listener.
fn via_blocking_accept(threads: usize, clients: usize, millis: u64) -> io::Result<Sample> {
    let (l, addr) = listener();
    let l = Arc::new(l);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(threads + clients + 1));
    let acceptors: Vec<_> = (0..threads)
        .map(|_| {
            let (l, stop, start) = (l.clone(), stop.clone(), start.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                start.wait();
                loop {
                    match l.accept() {
                        Ok((s, _)) => {
                            if stop.load(Ordering::Acquire) {
                                return n;
                            }
                            n += 1;
                            drop(s);
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted
                            ) => {}
                        Err(e) => panic!("accept bench: accept: {e}"),
                    }
                }
            })
        })
        .collect();
    Ok(load(
        addr,
        clients,
        millis,
        acceptors,
        || {
            // One connection per acceptor to wake it; it sees `stop` and returns.
            stop.store(true, Ordering::Release);
            for _ in 0..threads {
                let _ = TcpStream::connect(addr).map(|s| linger_zero(&s));
            }
        },
        start,
    ))
}

type Runner = fn(usize, usize, u64) -> io::Result<Sample>;

#[allow(clippy::vec_init_then_push)] // the pushes are cfg'd per target
fn impls() -> Vec<(&'static str, Runner)> {
    let mut v: Vec<(&'static str, Runner)> = Vec::new();
    #[cfg(any(target_os = "linux", target_os = "android"))]
    v.push(("pollshot-epoll", via_pollshot::<pollshot::backends::Epoll>));
    #[cfg(pollshot_kqueue)]
    v.push((
        "pollshot-kqueue",
        via_pollshot::<pollshot::backends::Kqueue>,
    ));
    v.push((
        "pollshot-blocking",
        via_pollshot::<pollshot::backends::Blocking>,
    ));
    v.push(("blocking-accept", via_blocking_accept));
    v
}

/// The bench (its entry in `benches/entry/` calls it).
pub fn main() {
    common::refuse_rump_kernel("accept");
    let args = Args::parse();
    args.only(&["threads", "clients", "millis", "reps", "impl"]);
    let quick = common::quick();
    let threads = args.list("threads", &[2, 4]);
    let clients: usize = args.num("clients", 4);
    let millis: u64 = args.num("millis", if quick { 300 } else { 1000 });
    let reps: usize = args.num("reps", if quick { 2 } else { 3 });
    if threads.contains(&0) || clients == 0 || reps == 0 || millis == 0 {
        die("--threads, --clients, --millis and --reps must be at least 1");
    }
    let mut list = impls();
    if let Some(name) = args.get("impl") {
        list.retain(|(n, _)| *n == name);
        if list.is_empty() {
            die(&format!("--impl {name:?}: not compiled here"));
        }
    }
    println!(
        "accept: {clients} client threads connecting to 127.0.0.1; {}; {reps} interleaved repetitions of {millis} ms",
        common::machine()
    );
    println!(
        "{:<20} {:>3} {:>11} {:>10} {:>9} {:>9} {:>8}",
        "implementation", "N", "accepts/s", "cpu us", "busiest", "idlest", "spread"
    );
    for &n in &threads {
        let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); list.len()];
        for rep in 0..reps {
            for k in 0..list.len() {
                let j = (k + rep) % list.len();
                let (name, f) = list[j];
                let s =
                    f(n, clients, millis).unwrap_or_else(|e| die(&format!("{name} N={n}: {e}")));
                let accepted: u64 = s.per_thread.iter().sum();
                assert_eq!(
                    accepted, s.connects,
                    "{name}: every connection is accepted exactly once"
                );
                samples[j].push(s);
            }
        }
        for ((name, _), ss) in list.iter().zip(&samples) {
            let rate = median(
                &ss.iter()
                    .map(|s| s.per_thread.iter().sum::<u64>() as f64 / s.secs)
                    .collect::<Vec<_>>(),
            );
            let cpu = median(
                &ss.iter()
                    .map(|s| s.cpu * 1e6 / s.connects.max(1) as f64)
                    .collect::<Vec<_>>(),
            );
            // Spread over all repetitions: each thread's share, summed.
            let mut totals = vec![0u64; n];
            for s in ss {
                for (t, c) in s.per_thread.iter().enumerate() {
                    totals[t] += c;
                }
            }
            let max = *totals.iter().max().unwrap();
            let min = *totals.iter().min().unwrap();
            let spread = if min == 0 {
                "inf".to_string()
            } else {
                format!("{:.2}x", max as f64 / min as f64)
            };
            println!("{name:<20} {n:>3} {rate:>11.0} {cpu:>10.2} {max:>9} {min:>9} {spread:>8}");
        }
    }
}
