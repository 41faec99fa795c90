//! keepalive: the HTTP/1.1 keep-alive responder of `examples/http_keepalive.rs`,
//! served by T threads on one pollshot poller and, in the same run, on `polling`,
//! each loaded by `wrk -t2 -c64 -d5s` (the Debian package) in turn.
//!
//! Usage: `cargo bench --bench keepalive [-- --threads T --seconds S --reps N
//! --backend NAME[,NAME]]` (defaults 2, 5, 3 and the default backend;
//! `POLLSHOT_BENCH_QUICK=1`: 1 repetition of 2 s). `--backend` names pollshot's
//! backends to run: the default one (`epoll` on Linux), `uring` (Linux, with
//! `--features io-uring`: `cargo bench --features io-uring --bench keepalive --
//! --backend epoll,uring`), or `all` (those compiled). Prints, per peer: median
//! requests per second, wrk's errors (socket errors and non-2xx responses), the
//! server's CPU time per request (getrusage: the server threads only, wrk is
//! another process), and the ratio to polling. Without `wrk` on PATH it prints a
//! SKIPPED line and exits 0.
// Unix only (descriptors, rusage): the bench's entry (`benches/entry/`) compiles
// this module on Unix only, and elsewhere says the bench cannot run there.
#![cfg(unix)]

#[path = "common/mod.rs"]
mod common;

#[allow(dead_code)]
#[path = "../examples/http_keepalive.rs"]
mod responder;

use common::{cpu_time, die, median, Args};
use responder::Peer;
use std::net::{SocketAddr, TcpListener};
use std::process::Command;

/// What one wrk run reported.
#[derive(Default, Clone, Copy)]
struct WrkResult {
    rps: f64,
    errors: u64,
    requests: u64,
}

/// Reads `Requests/sec:`, the `Socket errors:` line and `Non-2xx or 3xx responses:`.
fn parse_wrk(out: &str) -> Option<WrkResult> {
    let mut r = WrkResult::default();
    let mut seen = false;
    for line in out.lines() {
        let line = line.trim();
        if let Some(v) = line.strip_prefix("Requests/sec:") {
            r.rps = v.trim().parse().ok()?;
            seen = true;
        } else if let Some(v) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            for part in v.split(',') {
                r.errors += part
                    .split_whitespace()
                    .nth(1)
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        } else if let Some(v) = line.strip_prefix("Non-2xx or 3xx responses:") {
            r.errors += v.trim().parse::<u64>().unwrap_or(0);
        } else if line.contains("requests in") {
            // "123456 requests in 5.00s, 12.34MB read"
            r.requests = line
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
        }
    }
    seen.then_some(r)
}

fn wrk_available() -> bool {
    Command::new("wrk").arg("--version").output().is_ok()
}

/// One server run under wrk: (wrk's result, server CPU seconds, requests served).
fn one(peer: Peer, threads: usize, seconds: u64) -> (WrkResult, f64, u64) {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .unwrap_or_else(|e| die(&format!("bind: {e}")));
    let addr = listener.local_addr().unwrap();
    let c0 = cpu_time();
    let (stopper, joiner) = responder::serve(listener, threads, peer)
        .unwrap_or_else(|e| die(&format!("{peer:?}: {e}")));
    let out = Command::new("wrk")
        .args([
            "-t2",
            "-c64",
            &format!("-d{seconds}s"),
            &format!("http://{addr}/"),
        ])
        .output()
        .unwrap_or_else(|e| die(&format!("running wrk: {e}")));
    stopper
        .stop()
        .unwrap_or_else(|e| die(&format!("stop: {e}")));
    let served = joiner
        .join()
        .unwrap_or_else(|_| die("the server panicked"))
        .unwrap_or_else(|e| die(&format!("{peer:?} server: {e}")));
    let cpu = (cpu_time() - c0).as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    let r =
        parse_wrk(&text).unwrap_or_else(|| die(&format!("could not read wrk's output:\n{text}")));
    (r, cpu, served.requests)
}

/// The bench (its entry in `benches/entry/` calls it).
pub fn main() {
    let args = Args::parse();
    args.only(&["threads", "seconds", "reps", "backend"]);
    let quick = common::quick();
    let threads: usize = args.num("threads", 2);
    let seconds: u64 = args.num("seconds", if quick { 2 } else { 5 });
    let reps: usize = args.num("reps", if quick { 1 } else { 3 });
    if threads == 0 || seconds == 0 || reps == 0 {
        die("--threads, --seconds and --reps must be at least 1");
    }
    let mut peers = pollshot_peers(args.get("backend"));
    peers.push(Peer::Polling);
    let polling = peers.len() - 1;
    if !wrk_available() {
        println!("keepalive: SKIPPED: `wrk` is not on PATH (Debian/Ubuntu: apt-get install wrk; FreeBSD: pkg install wrk)");
        return;
    }
    println!(
        "keepalive: wrk -t2 -c64 -d{seconds}s against 127.0.0.1, server T={threads}; {}; {reps} interleaved repetitions",
        common::machine()
    );
    let mut rows: Vec<Vec<(WrkResult, f64, u64)>> = vec![Vec::new(); peers.len()];
    for rep in 0..reps {
        for k in 0..peers.len() {
            let j = (k + rep) % peers.len();
            rows[j].push(one(peers[j], threads, seconds));
        }
    }
    println!(
        "{:<15} {:>12} {:>8} {:>14} {:>12} {:>9}",
        "peer", "requests/s", "errors", "server cpu us", "served", "x polling"
    );
    let med: Vec<f64> = rows
        .iter()
        .map(|r| median(&r.iter().map(|x| x.0.rps).collect::<Vec<_>>()))
        .collect();
    for (i, peer) in peers.iter().enumerate() {
        let errors: u64 = rows[i].iter().map(|x| x.0.errors).sum();
        let served: u64 = rows[i].iter().map(|x| x.2).sum();
        let cpu_us = median(
            &rows[i]
                .iter()
                .map(|x| x.1 * 1e6 / x.2.max(1) as f64)
                .collect::<Vec<_>>(),
        );
        println!(
            "{:<15} {:>12.0} {:>8} {:>14.2} {:>12} {:>8.2}x",
            peer.name(),
            med[i],
            errors,
            cpu_us,
            served,
            med[i] / med[polling]
        );
    }
    let errors: u64 = rows.iter().flatten().map(|x| x.0.errors).sum();
    let ratios: Vec<String> = peers[..polling]
        .iter()
        .zip(&med)
        .map(|(p, m)| format!("{} / polling = {:.2}x", p.name(), m / med[polling]))
        .collect();
    println!(
        "targets: wrk errors 0: {} ({errors}); {}",
        if errors == 0 { "ok" } else { "MISS" },
        ratios.join(", ")
    );
}

/// The pollshot peers `--backend` names (comma-separated; `all`: every one
/// compiled); the default backend alone without it.
fn pollshot_peers(names: Option<&str>) -> Vec<Peer> {
    let Some(names) = names else {
        return vec![Peer::Pollshot];
    };
    if names == "all" {
        #[allow(unused_mut)]
        let mut all = vec![Peer::Pollshot];
        #[cfg(all(target_os = "linux", feature = "io-uring"))]
        all.push(Peer::PollshotUring);
        return all;
    }
    names
        .split(',')
        .map(|n| Peer::pollshot(n).unwrap_or_else(|why| die(&format!("--backend: {why}"))))
        .collect()
}
