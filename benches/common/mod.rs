//! Helpers shared by the benches: argument parsing, CPU time, medians, formatting.
//!
//! Included with `#[path = "common/mod.rs"] mod common;` by each bench, so it is not
//! a bench target of its own (`autobenches = false`). Not every bench uses every
//! helper.
#![allow(dead_code)]

use std::time::Duration;

/// `--name value` pairs and bare flags from the command line. `cargo bench` passes
/// `--bench` to a `harness = false` target; it is ignored here.
pub struct Args {
    pairs: Vec<(String, Option<String>)>,
}

impl Args {
    /// Parses `std::env::args()`. Every `--name` takes the next word as its value
    /// unless that word starts with `--` too (then it is a bare flag).
    pub fn parse() -> Args {
        let words: Vec<String> = std::env::args().skip(1).collect();
        let mut pairs = Vec::new();
        let mut i = 0;
        while i < words.len() {
            let w = &words[i];
            if w == "--bench" {
                i += 1;
                continue;
            }
            let name = match w.strip_prefix("--") {
                Some(n) => n.to_string(),
                None => die(&format!(
                    "unexpected argument {w:?} (flags are --name value)"
                )),
            };
            if let Some((n, v)) = name.split_once('=') {
                pairs.push((n.to_string(), Some(v.to_string())));
                i += 1;
            } else if i + 1 < words.len() && !words[i + 1].starts_with("--") {
                pairs.push((name, Some(words[i + 1].clone())));
                i += 2;
            } else {
                pairs.push((name, None));
                i += 1;
            }
        }
        Args { pairs }
    }

    /// Whether the bare flag `--name` was given.
    pub fn flag(&self, name: &str) -> bool {
        self.pairs.iter().any(|(n, _)| n == name)
    }

    /// The value of `--name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
    }

    /// The value of `--name` parsed as a number, or `default`. A value that does
    /// not parse ends the program with a clear message.
    pub fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> T {
        match self.get(name) {
            None => default,
            Some(v) => v
                .parse()
                .unwrap_or_else(|_| die(&format!("--{name} {v:?}: not a number"))),
        }
    }

    /// A comma-separated list of numbers for `--name`, or `default`.
    pub fn list(&self, name: &str, default: &[usize]) -> Vec<usize> {
        match self.get(name) {
            None => default.to_vec(),
            Some(v) => v
                .split(',')
                .map(|x| {
                    x.trim()
                        .parse()
                        .unwrap_or_else(|_| die(&format!("--{name} {v:?}: not a list of numbers")))
                })
                .collect(),
        }
    }

    /// Fails on any flag not in `known`, so a typo does not silently run the
    /// default (which takes minutes).
    pub fn only(&self, known: &[&str]) {
        for (n, _) in &self.pairs {
            if !known.contains(&n.as_str()) {
                die(&format!(
                    "unknown flag --{n}; known: --{}",
                    known.join(", --")
                ));
            }
        }
    }
}

/// Prints `msg` and exits with status 2 (bad usage).
pub fn die(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(2)
}

/// Refuses a build against a NetBSD rump kernel (`--cfg pollshot_rump`):
/// prints why and exits with status 2. There the kqueue backend's kernel is the
/// rump kernel, whose descriptors are its own (a host socket registered with it
/// names another descriptor or none), and a rump kernel's system calls are
/// function calls in this process, so its timings say nothing about NetBSD. The
/// counts of the same workload on NetBSD kernel code are the main job's. Does
/// nothing in any other build.
pub fn refuse_rump_kernel(bench: &str) {
    if cfg!(pollshot_rump) {
        die(&format!(
            "{bench}: not run on a NetBSD rump kernel (--cfg pollshot_rump): its kqueue \
             rows would register host sockets with the rump kernel's kqueue, and a rump \
             kernel's timings mean nothing for NetBSD; for the system calls per round \
             trip on NetBSD kernel code run the main job: RUSTFLAGS=\"--cfg pollshot_rump\" \
             cargo run --release -p pingpong -- --backend kqueue (docs/testing.md)"
        ));
    }
}

/// Whether `POLLSHOT_BENCH_QUICK` is set to something other than `0` or empty.
pub fn quick() -> bool {
    std::env::var("POLLSHOT_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// User plus system CPU time of the whole process so far (all threads), from
/// getrusage(2) with `RUSAGE_SELF`.
pub fn cpu_time() -> Duration {
    let (user, system) = cpu_times();
    user + system
}

/// User and system CPU time of the whole process so far (all threads), from
/// getrusage(2) with `RUSAGE_SELF`.
pub fn cpu_times() -> (Duration, Duration) {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage(2) fills the struct it is given; RUSAGE_SELF is always
    // valid, so it cannot fail (and a zeroed rusage is a valid value regardless).
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// The median of `xs` (the mean of the middle two for an even count); NaN if empty.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `a / b` formatted as `1.23x`, or `-` when either is missing or zero.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if a > 0.0 && b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".to_string(),
    }
}

/// A count per round trip with two decimals, or `-`.
pub fn per(x: Option<f64>) -> String {
    match x {
        Some(v) => format!("{v:.2}"),
        None => "-".to_string(),
    }
}

/// `nproc` and `uname -r` of this machine, for the header of a report.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| std::env::consts::OS.to_string());
    format!("{} CPUs, {} {}", cpus, std::env::consts::OS, kernel)
}
