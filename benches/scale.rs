//! scale: what N idle registrations cost, in memory and per round trip.
//!
//! For each backend compiled here (epoll, kqueue where it is compiled, io_uring
//! with `--features io-uring`, poll(2),
//! and `epoll-hand`: the same workload on a hand-written `EPOLLONESHOT` loop, what
//! the kernel alone costs) and each N (default 0, 100, 1,000, 10,000, 18,000): a
//! fresh poller registers and arms for reading N idle socketpair ends (nothing is
//! ever written to them), then one active socketpair, registered on the same
//! poller, does 64-byte round trips in one thread (write, deliver, read, write
//! back, re-arm, deliver, read, re-arm) for a fixed time. Measurements are
//! interleaved: each repetition runs every backend at every N once, the order of
//! N turned by one each time, and the report gives medians.
//!
//! Reported per backend and N:
//! - heap bytes per registration: what the process's heap held after the N
//!   registrations and their first arms minus before, divided by N, counted by
//!   this bench's global allocator (every Rust allocation); for kqueue on Linux
//!   also the C heap libkqueue (the kernel's stand-in) took, from mallinfo2(3);
//! - CPU µs per round trip (getrusage(2), user + system), its ratio to N = 0, and
//!   its user-space part (pollshot's own work, the bench's, libkqueue's);
//! - register, first arm and deregister time per registration (wall clock).
//!
//! Then the targets of issue 12 as ok/MISS: at N = 18,000 on epoll, at most 32
//! heap bytes per registration and CPU per round trip at most 1.05x N = 0.
//!
//! A last section measures what two threads pay when their registrations' slots
//! share one 64-byte line of the table (false sharing): each thread arms its own,
//! already armed, registration in a loop (no system call: the slot's lock and
//! state only), once with two numbers whose slots share a line and once with
//! neighbouring numbers (which the table keeps on different lines).
//!
//! The soft descriptor limit is raised to the hard one; N values that would not
//! fit under it are skipped with a note.
//!
//! Usage: `cargo bench --bench scale [-- FLAGS]`
//!
//! - `--n 0,100,1000,10000,18000`: the idle counts
//! - `--backend epoll,epoll-hand,kqueue,uring,blocking`: only these (`epoll-hand`:
//!   the same workload on a hand-written `EPOLLONESHOT` loop, what the kernel
//!   alone costs as N grows; `uring` needs `--features io-uring`)
//! - `--reps N` (default 5), `--millis MS` per measurement (default 300)
//! - `--no-sharing`: skip the false-sharing section
//! - `POLLSHOT_BENCH_QUICK=1`: 3 repetitions of 100 ms
//! - built with `--cfg pollshot_rump` (a NetBSD rump kernel) it refuses to run,
//!   saying why (exit 2); the main job gives that kernel's counts
// Unix only (descriptors, rusage): the bench's entry (`benches/entry/`) compiles
// this module on Unix only, and elsewhere says the bench cannot run there.
#![cfg(unix)]

#[path = "common/mod.rs"]
mod common;

use common::{cpu_times, die, median, Args};
use pollshot::{Backend, Events, Interest, Poller, Token};
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};
use std::sync::Barrier;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Heap accounting.

/// The system allocator, counting the bytes held.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; the counter is
// a plain atomic.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as isize, Relaxed);
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as isize, Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        HELD.fetch_add(new as isize - layout.size() as isize, Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes the C heap holds (glibc: arenas in use plus mmapped chunks), which
/// includes what the Rust allocator took from it; `None` elsewhere.
fn c_heap() -> Option<isize> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2(3) only reads the allocator's statistics.
        let m = unsafe { libc::mallinfo2() };
        Some((m.uordblks + m.hblkhd) as isize)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

// ---------------------------------------------------------------------------
// One measurement.

const MSG: usize = 64;

/// One measurement, or the medians of several (a [`Row`]).
struct Sample {
    /// Rust heap bytes per registration (None at N = 0).
    heap: Option<f64>,
    /// C heap bytes per registration beyond the Rust heap's (libkqueue).
    c_heap: Option<f64>,
    cpu_us: f64,
    /// The user-space part of `cpu_us`.
    user_us: f64,
    register_ns: Option<f64>,
    arm_us: Option<f64>,
    deregister_us: Option<f64>,
}

fn check(what: &str, r: io::Result<impl Sized>) {
    if let Err(e) = r {
        die(&format!("{what}: {e}"));
    }
}

/// What one measurement drives: a pollshot poller, or the hand-written epoll loop
/// that shows what the kernel alone costs.
trait Subject: Sized {
    type Key: Copy + PartialEq;
    fn new() -> Self;
    /// Registers `fd` (no system call).
    fn register(&mut self, fd: BorrowedFd<'_>) -> Self::Key;
    /// Arms for reading (pollshot's first arm: the `EPOLL_CTL_ADD`).
    fn arm(&mut self, key: Self::Key, fd: BorrowedFd<'_>);
    /// Waits until the event for `want` arrives (no other can: every idle
    /// registration is quiet). A second without it is a hang.
    fn await_event(&mut self, want: Self::Key);
    fn deregister(&mut self, key: Self::Key, fd: BorrowedFd<'_>);
}

struct Pollshot<B: Backend> {
    poller: Poller<B>,
    events: Events,
}

impl<B: Backend> Subject for Pollshot<B> {
    type Key = Token;
    fn new() -> Self {
        Pollshot {
            poller: Poller::with_backend().unwrap_or_else(|e| die(&format!("poller: {e}"))),
            events: Events::with_capacity(64),
        }
    }
    fn register(&mut self, fd: BorrowedFd<'_>) -> Token {
        self.poller
            .register(&fd)
            .unwrap_or_else(|e| die(&format!("register: {e}")))
    }
    fn arm(&mut self, key: Token, _: BorrowedFd<'_>) {
        check("arm", self.poller.arm(key, Interest::READABLE));
    }
    fn await_event(&mut self, want: Token) {
        loop {
            match self
                .poller
                .deliver(&mut self.events, Some(Duration::from_secs(1)))
            {
                Ok(0) => die("no event within 1 s: the round trip hung"),
                Ok(_) if self.events.iter().any(|e| e.token() == want) => return,
                Ok(_) => die("an idle registration was delivered"),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => die(&format!("deliver: {e}")),
            }
        }
    }
    fn deregister(&mut self, key: Token, _: BorrowedFd<'_>) {
        check("deregister", self.poller.deregister(key));
    }
}

/// `EPOLLONESHOT` by hand on rustix, with pollshot's flags; the key is the number.
#[cfg(any(target_os = "linux", target_os = "android"))]
struct Hand {
    epoll: OwnedFd,
}

#[cfg(any(target_os = "linux", target_os = "android"))]
impl Subject for Hand {
    type Key = u64;
    fn new() -> Self {
        use rustix::event::epoll;
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)
            .unwrap_or_else(|e| die(&format!("epoll_create1: {e}")));
        Hand { epoll }
    }
    fn register(&mut self, fd: BorrowedFd<'_>) -> u64 {
        fd.as_raw_fd() as u64
    }
    /// `EPOLL_CTL_MOD`; the first arm of a descriptor is an `EPOLL_CTL_ADD` (after
    /// MOD's ENOENT), so the kernel's set is built in pollshot's order.
    fn arm(&mut self, key: u64, fd: BorrowedFd<'_>) {
        use rustix::event::epoll::{self, EventData, EventFlags};
        let flags = EventFlags::IN | EventFlags::RDHUP | EventFlags::ONESHOT;
        let data = EventData::new_u64(key);
        let r = match epoll::modify(&self.epoll, fd, data, flags) {
            Err(rustix::io::Errno::NOENT) => epoll::add(&self.epoll, fd, data, flags),
            other => other,
        };
        check("epoll_ctl", r.map_err(io::Error::from));
    }
    fn await_event(&mut self, want: u64) {
        use rustix::event::epoll;
        let mut buf = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 64];
        let timeout = rustix::time::Timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        match epoll::wait(&self.epoll, &mut buf[..], Some(&timeout)) {
            Ok(([], _)) => die("no event within 1 s: the round trip hung"),
            Ok((evs, _)) if evs.iter().any(|e| e.data.u64() == want) => {}
            Ok(_) => die("an idle registration was delivered"),
            Err(e) => die(&format!("epoll_wait: {e}")),
        }
    }
    fn deregister(&mut self, _: u64, fd: BorrowedFd<'_>) {
        let r = rustix::event::epoll::delete(&self.epoll, fd);
        check("EPOLL_CTL_DEL", r.map_err(io::Error::from));
    }
}

fn measure<S: Subject>(
    idle: &[UnixStream],
    active: &mut (UnixStream, UnixStream),
    millis: u64,
) -> Sample {
    let n = idle.len();
    let mut p = S::new();
    // Allocated before the heap is counted.
    let mut keys = Vec::with_capacity(n);
    let ka = p.register(active.0.as_fd());
    let kb = p.register(active.1.as_fd());

    let heap0 = HELD.load(Relaxed);
    let c0 = c_heap();
    let t0 = Instant::now();
    for s in idle {
        keys.push(p.register(s.as_fd()));
    }
    let registered = t0.elapsed();
    let t1 = Instant::now();
    for (&k, s) in keys.iter().zip(idle) {
        p.arm(k, s.as_fd());
    }
    let armed = t1.elapsed();
    let heap = HELD.load(Relaxed) - heap0;
    let c = c_heap().zip(c0).map(|(c1, c0)| c1 - c0 - heap);

    p.arm(ka, active.0.as_fd());
    p.arm(kb, active.1.as_fd());
    let (a, b) = active;
    let mut buf = [0u8; MSG];
    let msg = [7u8; MSG];
    let mut rounds = 0u64;
    let deadline = Instant::now() + Duration::from_millis(millis);
    let (user0, sys0) = cpu_times();
    while rounds < 50 || Instant::now() < deadline {
        check("write", a.write_all(&msg));
        p.await_event(kb);
        check("read", b.read_exact(&mut buf));
        check("write", b.write_all(&buf));
        p.arm(kb, b.as_fd());
        p.await_event(ka);
        check("read", a.read_exact(&mut buf));
        p.arm(ka, a.as_fd());
        rounds += 1;
    }
    let (user1, sys1) = cpu_times();
    let user = user1 - user0;
    let cpu = user + (sys1 - sys0);

    let t2 = Instant::now();
    for (&k, s) in keys.iter().zip(idle) {
        p.deregister(k, s.as_fd());
    }
    let deregistered = t2.elapsed();
    p.deregister(ka, a.as_fd());
    p.deregister(kb, b.as_fd());

    let per = |d: Duration, unit: f64| (n > 0).then(|| d.as_secs_f64() * unit / n as f64);
    Sample {
        heap: (n > 0).then(|| heap as f64 / n as f64),
        c_heap: c.filter(|_| n > 0).map(|c| c as f64 / n as f64),
        cpu_us: cpu.as_secs_f64() * 1e6 / rounds as f64,
        user_us: user.as_secs_f64() * 1e6 / rounds as f64,
        register_ns: per(registered, 1e9),
        arm_us: per(armed, 1e6),
        deregister_us: per(deregistered, 1e6),
    }
}

/// Medians for one N of one backend.
struct Row {
    n: usize,
    m: Sample,
}

fn med(xs: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = xs.flatten().collect();
    (!v.is_empty()).then(|| median(&v))
}

/// One backend's measurement of N idle registrations.
type Measure = fn(&[UnixStream], &mut (UnixStream, UnixStream), u64) -> Sample;

/// Runs every backend at every N, `reps` times, interleaved: each repetition
/// measures each backend at each N once, the order of N turned by one per
/// repetition. Returns the medians per backend.
fn run(
    subjects: &[Measure],
    ns: &[usize],
    idle: &[UnixStream],
    active: &mut (UnixStream, UnixStream),
    reps: usize,
    millis: u64,
) -> Vec<Vec<Row>> {
    let mut samples: Vec<Vec<Vec<Sample>>> = subjects
        .iter()
        .map(|_| ns.iter().map(|_| Vec::new()).collect())
        .collect();
    let max = ns.iter().copied().max().unwrap_or(0);
    for m in subjects {
        // One unmeasured pass warms the allocator and the kernel's caches.
        m(&idle[..max], active, 20);
    }
    for rep in 0..reps {
        for (b, m) in subjects.iter().enumerate() {
            for k in 0..ns.len() {
                let i = (k + rep) % ns.len();
                samples[b][i].push(m(&idle[..ns[i]], active, millis));
            }
        }
    }
    samples
        .into_iter()
        .map(|per_n| {
            ns.iter()
                .zip(per_n)
                .map(|(&n, s)| Row {
                    n,
                    m: Sample {
                        heap: med(s.iter().map(|x| x.heap)),
                        c_heap: med(s.iter().map(|x| x.c_heap)),
                        cpu_us: median(&s.iter().map(|x| x.cpu_us).collect::<Vec<_>>()),
                        user_us: median(&s.iter().map(|x| x.user_us).collect::<Vec<_>>()),
                        register_ns: med(s.iter().map(|x| x.register_ns)),
                        arm_us: med(s.iter().map(|x| x.arm_us)),
                        deregister_us: med(s.iter().map(|x| x.deregister_us)),
                    },
                })
                .collect()
        })
        .collect()
}

fn print(name: &str, rows: &[Row]) {
    let base = rows.iter().find(|r| r.n == 0).map(|r| r.m.cpu_us);
    println!("\n{name}");
    let kq = rows.iter().any(|r| r.m.c_heap.is_some()) && name == "kqueue";
    println!(
        "{:>7} {:>10} {:>12} {:>10} {:>8} {:>11} {:>12} {:>12} {:>14}",
        "N",
        "heap B/reg",
        if kq { "libkqueue B" } else { "" },
        "cpu us/rt",
        "x N=0",
        "user us/rt",
        "register ns",
        "1st arm us",
        "deregister us"
    );
    let f = |x: Option<f64>, d: usize| x.map_or("-".to_string(), |v| format!("{v:.d$}"));
    for r in rows {
        println!(
            "{:>7} {:>10} {:>12} {:>10.2} {:>8} {:>11.2} {:>12} {:>12} {:>14}",
            r.n,
            f(r.m.heap, 1),
            if kq { f(r.m.c_heap, 0) } else { String::new() },
            r.m.cpu_us,
            base.map_or("-".to_string(), |b| format!("{:.2}x", r.m.cpu_us / b)),
            r.m.user_us,
            f(r.m.register_ns, 0),
            f(r.m.arm_us, 2),
            f(r.m.deregister_us, 2),
        );
    }
}

// ---------------------------------------------------------------------------
// False sharing between two registrations' slots.

/// A duplicate of `fd` at exactly `number`, if that number is free (never
/// replaces an open descriptor).
fn dup_at(fd: &impl AsFd, number: i32) -> Option<OwnedFd> {
    let d = rustix::io::fcntl_dupfd_cloexec(fd, number).ok()?;
    (d.as_raw_fd() == number).then_some(d)
}

/// Nanoseconds per arm of an already armed registration, two threads at once,
/// each on its own registration (numbers `x` and `y`).
fn sharing_pair(x: i32, y: i32, iters: u64) -> Option<f64> {
    let (s1, _p1) = UnixStream::pair().ok()?;
    let (s2, _p2) = UnixStream::pair().ok()?;
    let f1 = dup_at(&s1, x)?;
    let f2 = dup_at(&s2, y)?;
    let p = Poller::new().ok()?;
    let t1 = p.register(&f1).ok()?;
    let t2 = p.register(&f2).ok()?;
    p.arm(t1, Interest::READABLE).ok()?;
    p.arm(t2, Interest::READABLE).ok()?;
    let go = Barrier::new(2);
    let failed = AtomicBool::new(false);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in [t1, t2] {
            let (p, go, failed) = (&p, &go, &failed);
            s.spawn(move || {
                go.wait();
                for _ in 0..iters {
                    if p.arm(t, Interest::READABLE).is_err() {
                        failed.store(true, Relaxed);
                        return;
                    }
                }
            });
        }
    });
    let wall = start.elapsed();
    let _ = (p.deregister(t1), p.deregister(t2));
    (!failed.load(Relaxed)).then(|| wall.as_secs_f64() * 1e9 / iters as f64)
}

fn sharing(reps: usize) {
    // Numbers in the table's first chunk (0..64, 16 lines): `k` and `k + 16`
    // share a line, `k` and `k + 1` are two lines apart (src/table.rs, "Cache
    // lines"). Without that spreading, neighbouring numbers would share lines.
    const K: i32 = 40;
    let iters = 2_000_000;
    let mut same = Vec::new();
    let mut apart = Vec::new();
    for _ in 0..reps {
        match (
            sharing_pair(K, K + 16, iters),
            sharing_pair(K + 1, K + 2, iters),
        ) {
            (Some(s), Some(a)) => {
                same.push(s);
                apart.push(a);
            }
            _ => {
                println!(
                    "\nfalse sharing: skipped (numbers {K}..{} not free)",
                    K + 16
                );
                return;
            }
        }
    }
    let (s, a) = (median(&same), median(&apart));
    println!(
        "\nfalse sharing (epoll; 2 threads, each arming its own armed registration, no system call; \
         wall ns per arm, median of {reps}):"
    );
    println!(
        "  slots on one 64-byte line (numbers {K} and {}): {s:.1} ns",
        K + 16
    );
    println!(
        "  neighbouring numbers (lines 128 bytes apart, numbers {} and {}): {a:.1} ns",
        K + 1,
        K + 2
    );
    println!("  ratio one line / apart: {:.2}x", s / a);
}

// ---------------------------------------------------------------------------

/// Raises the soft descriptor limit to the hard one; returns the soft limit now.
fn raise_nofile() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    if let Some(hard) = l.maximum {
        l.current = Some(hard);
        if let Err(e) = setrlimit(Resource::Nofile, l) {
            eprintln!("note: raising RLIMIT_NOFILE to {hard} failed: {e}");
        }
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The bench (its entry in `benches/entry/` calls it).
pub fn main() {
    common::refuse_rump_kernel("scale");
    let args = Args::parse();
    args.only(&["n", "backend", "reps", "millis", "no-sharing"]);
    let quick = common::quick();
    let reps = args.num("reps", if quick { 3 } else { 5 });
    let millis = args.num("millis", if quick { 100 } else { 300 });
    let mut ns = args.list("n", &[0, 100, 1_000, 10_000, 18_000]);
    let backends: Vec<String> = args
        .get("backend")
        .map(|v| v.split(',').map(str::to_string).collect())
        .unwrap_or_else(|| {
            ["epoll", "epoll-hand", "kqueue", "uring", "blocking"]
                .iter()
                .map(|s| s.to_string())
                .collect()
        });
    if reps == 0 || millis == 0 {
        die("--reps and --millis must be at least 1");
    }

    let limit = raise_nofile();
    // The active pair, each poller's own descriptors (libkqueue keeps a few more)
    // and stdio: 64 numbers of headroom.
    let room = limit.saturating_sub(64) as usize;
    ns.retain(|&n| {
        let fits = n <= room;
        if !fits {
            println!("note: N = {n} skipped: RLIMIT_NOFILE is {limit}");
        }
        fits
    });
    let max = ns.iter().copied().max().unwrap_or(0);
    println!(
        "scale: {} ; RLIMIT_NOFILE {limit}; N = {ns:?}; {reps} interleaved repetitions of {millis} ms",
        common::machine()
    );

    if !args.flag("no-sharing") {
        sharing(reps);
    }

    let mut active = UnixStream::pair().unwrap_or_else(|e| die(&format!("socketpair: {e}")));
    for s in [&active.0, &active.1] {
        check("nonblocking", s.set_nonblocking(true));
    }
    let mut idle = Vec::with_capacity(max);
    while idle.len() < max {
        let (x, y) = UnixStream::pair().unwrap_or_else(|e| die(&format!("socketpair: {e}")));
        idle.push(x);
        if idle.len() < max {
            idle.push(y);
        }
    }

    let mut names: Vec<&str> = Vec::new();
    let mut subjects: Vec<Measure> = Vec::new();
    for name in &backends {
        let m: Measure = match name.as_str() {
            #[cfg(any(target_os = "linux", target_os = "android"))]
            "epoll" => measure::<Pollshot<pollshot::backends::Epoll>>,
            #[cfg(any(target_os = "linux", target_os = "android"))]
            "epoll-hand" => measure::<Hand>,
            #[cfg(pollshot_kqueue)]
            "kqueue" => measure::<Pollshot<pollshot::backends::Kqueue>>,
            #[cfg(all(feature = "io-uring", target_os = "linux"))]
            "uring" => match Poller::<pollshot::backends::Uring>::with_backend() {
                Ok(_) => measure::<Pollshot<pollshot::backends::Uring>>,
                Err(e) => {
                    println!("\nuring: unavailable here: {e}");
                    continue;
                }
            },
            #[cfg(not(all(feature = "io-uring", target_os = "linux")))]
            "uring" => {
                println!("\nuring: not compiled (Linux, --features io-uring)");
                continue;
            }
            "blocking" => measure::<Pollshot<pollshot::backends::Blocking>>,
            #[cfg(not(any(target_os = "linux", target_os = "android")))]
            "epoll" | "epoll-hand" => {
                println!("\n{name}: not compiled for this target");
                continue;
            }
            #[cfg(not(pollshot_kqueue))]
            "kqueue" => {
                println!("\nkqueue: not compiled (on Linux: --cfg pollshot_libkqueue, see README)");
                continue;
            }
            other => die(&format!(
                "--backend {other:?}: not one of epoll, epoll-hand, kqueue, uring, blocking"
            )),
        };
        names.push(name);
        subjects.push(m);
    }
    let all = run(&subjects, &ns, &idle, &mut active, reps, millis);
    let mut results: Vec<(String, Vec<Row>)> = Vec::new();
    for (name, rows) in names.into_iter().zip(all) {
        let label = match name {
            "blocking" => "blocking (poll(2))",
            "epoll-hand" => "epoll-hand (EPOLLONESHOT by hand: the kernel alone; its 1st arm is MOD, ENOENT, ADD)",
            other => other,
        };
        print(label, &rows);
        let growth: Vec<String> = rows
            .iter()
            .filter(|r| r.n > 0)
            .filter_map(|r| cpu_ratio(&rows, r.n).map(|x| format!("{x:.2}x at N={}", r.n)))
            .collect();
        match name {
            "blocking" => println!(
                "  poll(2) growth: CPU per round trip {} (each wait passes every armed descriptor to the kernel)",
                growth.join(", ")
            ),
            "kqueue" => println!(
                "  measured (no target): CPU per round trip {}",
                growth.join(", ")
            ),
            _ => {}
        }
        results.push((name.to_string(), rows));
    }

    println!("\ntargets (issue 12), medians of interleaved runs:");
    let rows_of = |name: &str| results.iter().find(|(n, _)| n == name).map(|(_, r)| r);
    let Some(rows) = rows_of("epoll") else {
        println!("  (epoll not run)");
        return;
    };
    let h = rows
        .iter()
        .find(|r| r.n == 18_000)
        .and_then(|r| r.m.heap)
        .unwrap_or(f64::INFINITY);
    println!(
        "  {} epoll heap per registration at N=18,000: {h:.1} B (target <= 32)",
        if h <= 32.0 { "ok  " } else { "MISS" }
    );
    let r = cpu_ratio(rows, 18_000).unwrap_or(f64::INFINITY);
    println!(
        "  {} epoll CPU per round trip at N=18,000: {r:.3}x N=0 (target <= 1.05x)",
        if r <= 1.05 { "ok  " } else { "MISS" }
    );
    if let Some(x) = rows_of("epoll-hand").and_then(|h| cpu_ratio(h, 18_000)) {
        println!(
            "       the hand-written loop in the same run (the kernel alone): {x:.3}x; \
             pollshot over it: {:.3}x at N=18,000, {:.3}x at N=0",
            per_hand(rows, rows_of("epoll-hand"), 18_000).unwrap_or(f64::NAN),
            per_hand(rows, rows_of("epoll-hand"), 0).unwrap_or(f64::NAN),
        );
    }
    if let Some(x) = rows_of("kqueue").and_then(|k| cpu_ratio(k, 18_000)) {
        println!("  (measured) kqueue CPU per round trip at N=18,000: {x:.3}x N=0");
    }
}

/// pollshot's CPU per round trip at `n` over the hand-written loop's.
fn per_hand(rows: &[Row], hand: Option<&Vec<Row>>, n: usize) -> Option<f64> {
    let at = |rows: &[Row]| rows.iter().find(|r| r.n == n).map(|r| r.m.cpu_us);
    Some(at(rows)? / at(hand?)?)
}

/// CPU per round trip at `n` over that at N = 0.
fn cpu_ratio(rows: &[Row], n: usize) -> Option<f64> {
    let at = |n| rows.iter().find(|r| r.n == n).map(|r| r.m.cpu_us);
    Some(at(n)? / at(0)?)
}
