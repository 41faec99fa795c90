//! pingpong: pollshot's main job. P socketpairs, T threads delivering on one shared
//! `Poller`, R round trips of 64 bytes; for every backend compiled on this OS it
//! prints round trips per second and system calls per round trip by kind.
//!
//! ```text
//! cargo run --release -p pingpong [-- --pairs P --threads T --rounds R --backend NAME]
//! ```
//!
//! - `--pairs P`: socketpairs (default 8)
//! - `--threads T`: threads calling `deliver` on the one poller (default 2)
//! - `--rounds R`: round trips in all, spread over the pairs (default 300000)
//! - `--backend epoll|kqueue|ports|blocking|uring|all`: default `all` (those
//!   compiled here: epoll and blocking on Linux, uring too with `--features
//!   io-uring`; kqueue and blocking on the BSDs and macOS, ports and blocking
//!   on illumos and Solaris; kqueue on Linux too when built with
//!   `RUSTFLAGS="--cfg pollshot_libkqueue"` against libkqueue, or with
//!   `RUSTFLAGS="--cfg pollshot_rump"` against a NetBSD rump kernel, whose
//!   `AF_LOCAL` socketpairs the pairs then are)
//!
//! On a rump kernel the report gives counts only: its system calls are function
//! calls in this process, so a rate would say nothing about NetBSD.
//!
//! A package of its own in the workspace, depending only on pollshot (with its
//! `stats` feature, for `Poller::stats()`): building it compiles none of the main
//! package's dev-dependencies. The poller's system calls come from its counters;
//! reads and writes are counted here, where they are made. Bad flags print what is
//! wrong and exit with status 2; a failed run exits with status 1.

mod args;
mod run;

use args::{Command, Config};
use run::Report;
use std::io;
use std::time::{Duration, Instant};

type Runner = fn(usize, usize, u64) -> io::Result<Report>;

/// The backends compiled for this target, by name.
#[allow(clippy::vec_init_then_push)] // the pushes are cfg'd per target
fn backends() -> Vec<(&'static str, Runner)> {
    use run::HostSock;
    let mut compiled: Vec<(&'static str, Runner)> = Vec::new();
    #[cfg(any(target_os = "linux", target_os = "android"))]
    compiled.push(("epoll", run::run::<pollshot::backends::Epoll, HostSock>));
    // kqueue where pollshot compiles it (build.rs: the BSDs and Apple, Linux
    // against libkqueue) on host socketpairs, or on a NetBSD rump kernel's
    // socketpairs (the backend's kernel there).
    #[cfg(all(pollshot_kqueue, not(pollshot_rump)))]
    compiled.push(("kqueue", run::run::<pollshot::backends::Kqueue, HostSock>));
    #[cfg(all(pollshot_kqueue, pollshot_rump))]
    compiled.push((
        "kqueue",
        run::run::<pollshot::backends::Kqueue, pollshot::rump::RumpFd>,
    ));
    #[cfg(any(target_os = "illumos", target_os = "solaris"))]
    compiled.push(("ports", run::run::<pollshot::backends::Ports, HostSock>));
    #[cfg(unix)]
    compiled.push((
        "blocking",
        run::run::<pollshot::backends::Blocking, HostSock>,
    ));
    // Windows: AFD poll on TCP loopback pairs (`run::HostSock`).
    #[cfg(windows)]
    compiled.push(("afd", run::run::<pollshot::backends::Afd, HostSock>));
    #[cfg(all(target_os = "linux", feature = "io-uring"))]
    compiled.push(("uring", run::run::<pollshot::backends::Uring, HostSock>));
    compiled
}

/// How one backend names its calls and its four commands (add, re-arm, quiet,
/// delete), for the report.
struct Words {
    /// The wait system call.
    wait: &'static str,
    /// A system call made only to change registrations; `None` where commands
    /// change memory (the poll(2) backend).
    ctl: Option<&'static str>,
    /// The waker's system calls.
    waker: &'static str,
    /// What the commands are, per round trip.
    commands: &'static str,
    /// The four commands' names.
    ops: [&'static str; 4],
}

fn words(backend: &str) -> Words {
    let (wait, ctl, waker, commands, ops) = match backend {
        "epoll" => (
            "epoll_wait",
            Some("epoll_ctl"),
            "eventfd",
            "epoll_ctl per round trip by op",
            ["ADD", "MOD", "MOD to quiet", "DEL"],
        ),
        "kqueue" => (
            "kevent waits",
            Some("kevent for changes alone"),
            "waker",
            "change records per round trip (most ride on the waits)",
            ["EV_ADD", "EV_ENABLE", "EV_DISABLE", "EV_DELETE"],
        ),
        "afd" => (
            "GetQueuedCompletionStatusEx",
            Some("IOCTL_AFD_POLL and NtCancelIoFileEx"),
            "PostQueuedCompletionStatus",
            "AFD calls per round trip by command",
            [
                "first polls",
                "re-polls",
                "cancels to disarm",
                "cancels to deregister",
            ],
        ),
        "ports" => (
            "port_getn",
            Some("port_associate and port_dissociate"),
            "port_send",
            "port calls per round trip by command",
            [
                "associations",
                "re-associations",
                "dissociations to quiet",
                "dissociations",
            ],
        ),
        "uring" => (
            "io_uring_enter waits",
            Some("io_uring_enter to submit alone"),
            "eventfd",
            "poll requests per round trip (most ride on the waits)",
            ["first arms", "re-arms", "disarms", "removals"],
        ),
        _ => (
            "poll",
            None,
            "waker pipe",
            "arms per round trip, in memory (no system call)",
            ["first arms", "re-arms", "disarms", "removals"],
        ),
    };
    Words {
        wait,
        ctl,
        waker,
        commands,
        ops,
    }
}

/// The report of one run: what it did, then its system calls per round trip by
/// kind, in the words of its backend.
fn describe(r: &Report) -> String {
    let rt = r.round_trips as f64;
    let per = |n: u64| n as f64 / rt;
    let s = &r.stats;
    let w = words(r.backend);
    let secs = r.elapsed.as_secs_f64();
    let total = per(s.syscalls()) + per(r.reads) + per(r.writes);
    let ctl = match w.ctl {
        Some(name) => format!(" + {name} {:.2}", per(s.ctl_calls)),
        None => String::new(),
    };
    let counts = [s.adds, s.modifies, s.quiets, s.deletes];
    let ops: Vec<String> = w
        .ops
        .iter()
        .zip(counts)
        .map(|(name, n)| format!("{name} {:.2}", per(n)))
        .collect();
    let pad = " ".repeat(10);
    // On another kernel in this process (a rump kernel) the time says nothing
    // about that kernel: counts only.
    let took = match r.kernel {
        None => format!("in {secs:.3} s: {:.0} round trips/s", rt / secs.max(1e-9)),
        Some(kernel) => format!("on a {kernel} (counts only, no rate)"),
    };
    format!(
        "{:<9} {} round trips {took}\n\
         {pad}system calls per round trip {total:.2} = read {:.2} + write {:.2}{ctl} + \
         {} {:.2} + {} {:.2}\n\
         {pad}{}: {}; reads that found nothing (spurious wake-ups) {}",
        r.backend,
        r.round_trips,
        per(r.reads),
        per(r.writes),
        w.wait,
        per(s.waits),
        w.waker,
        per(s.wakes + s.wake_reads),
        w.commands,
        ops.join(", "),
        r.empty_reads
    )
}

/// Prints `msg` and the usage line, and exits with status 2 (bad usage).
fn usage(msg: &str) -> ! {
    eprintln!("pingpong: {msg}");
    eprintln!("usage: pingpong [--pairs P] [--threads T] [--rounds R] [--backend NAME] (--help)");
    std::process::exit(2)
}

fn main() {
    let Config {
        pairs,
        threads,
        rounds,
        backend,
    } = match args::parse(std::env::args().skip(1)) {
        Ok(Command::Run(config)) => config,
        Ok(Command::Help) => {
            println!("{}", args::HELP);
            return;
        }
        Err(msg) => usage(&msg),
    };

    let compiled = backends();
    let names: Vec<_> = compiled.iter().map(|(n, _)| *n).collect();
    let chosen: Vec<_> = compiled
        .iter()
        .filter(|(n, _)| backend == "all" || *n == backend)
        .collect();
    if chosen.is_empty() {
        let why = if backend == "uring" {
            "not compiled: build with --features io-uring (Linux)"
        } else if ["epoll", "kqueue", "ports", "blocking", "afd"].contains(&backend.as_str()) {
            "not compiled for this OS"
        } else {
            "unknown backend"
        };
        usage(&format!(
            "--backend {backend:?}: {why}; this build has {} (or all)",
            names.join(", ")
        ));
    }

    let per_pair = rounds.div_ceil(pairs as u64).max(1);
    let all = per_pair.saturating_mul(pairs as u64);
    let chosen_names: Vec<_> = chosen.iter().map(|(n, _)| *n).collect();
    println!(
        "pingpong: P={pairs} socketpairs, T={threads} threads delivering on one poller, \
         R={all} round trips of 64 bytes ({per_pair} per pair{}); backends: {}",
        if all == rounds {
            String::new()
        } else {
            format!("; --rounds {rounds} rounded up to a multiple of P")
        },
        chosen_names.join(", ")
    );

    // A hang would be a bug: say so instead of waiting forever.
    let limit = Duration::from_secs(60).saturating_add(Duration::from_millis(all));
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("pingpong: no result after {limit:?}: giving up (this is a bug)");
        std::process::exit(1);
    });
    let start = Instant::now();
    for (name, f) in chosen {
        match f(pairs, threads, rounds) {
            Ok(report) => println!("{}", describe(&report)),
            Err(e) => {
                eprintln!("pingpong: {name}: {e}");
                std::process::exit(1);
            }
        }
    }
    println!(
        "pingpong: elapsed {:.3} s in all",
        start.elapsed().as_secs_f64()
    );
}
