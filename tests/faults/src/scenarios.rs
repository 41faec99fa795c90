//! The scenarios: one per behaviour that keeps state, each a window of API calls
//! (the system calls under test) and the checks that the poller is still true
//! after it. Run as `faults run BACKEND SCENARIO[@ROLE] [trace options]`.
//!
//! Every scenario ends by checking, untraced: every readiness present was
//! delivered once (no lost wake-up), nothing stale was delivered, a deregistered
//! file is released (its peer reads EOF once it is closed), and a notify ended
//! exactly one `deliver`, as each scenario's behaviour asks.

use crate::check::{
    blocked, deliver_plain, errno_of, expect, gettid, pair, quiet, released, Ctx, Role, LONG, QUIET,
};
use crate::trace::Spec;
use pollshot::{Backend, Events, Interest, Poller, Token};
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Mutex;
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

/// A scenario and the roles it runs in (which thread is traced).
pub struct Scenario {
    pub name: &'static str,
    pub roles: &'static [Role],
    /// What it does, for the report.
    pub what: &'static str,
}

const MAIN: &[Role] = &[Role::Main];
const BOTH: &[Role] = &[Role::Main, Role::Waiter];
const THREE: &[Role] = &[Role::Main, Role::Waiter, Role::Follower];

/// Every scenario, in the order the driver runs them.
pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "new",
        roles: MAIN,
        what: "Poller::with_backend: the kernel instance and the waker",
    },
    Scenario {
        name: "register",
        roles: MAIN,
        what: "register a number already registered and armed (the old one superseded), then arm the new one",
    },
    Scenario {
        name: "first_arm",
        roles: MAIN,
        what: "the first arm of a registration",
    },
    Scenario {
        name: "rearm",
        roles: MAIN,
        what: "re-arm an idle registration, then re-arm it for another interest",
    },
    Scenario {
        name: "arm_many",
        roles: MAIN,
        what: "the first arms of 300 registrations (io_uring: more than its submission queue holds)",
    },
    Scenario {
        name: "half_closed",
        roles: MAIN,
        what: "arm writable a socket whose peer shut down its write side, its send buffer full",
    },
    Scenario {
        name: "disarm",
        roles: MAIN,
        what: "disarm an armed registration",
    },
    Scenario {
        name: "deregister",
        roles: MAIN,
        what: "deregister an armed registration",
    },
    Scenario {
        name: "deregister_blocked",
        roles: BOTH,
        what: "deregister an armed registration while another thread is blocked in deliver",
    },
    Scenario {
        name: "deliver_pending",
        roles: MAIN,
        what: "deliver, room for one, with two events pending",
    },
    Scenario {
        name: "notify0",
        roles: MAIN,
        what: "notify with no waiter: the next deliver returns",
    },
    Scenario {
        name: "notify1",
        roles: BOTH,
        what: "notify with one thread blocked in deliver",
    },
    Scenario {
        name: "notify2",
        roles: THREE,
        what: "notify with two threads blocked in deliver: exactly one returns",
    },
    Scenario {
        name: "shutdown",
        roles: THREE,
        what: "shutdown with two threads blocked in deliver",
    },
    Scenario {
        name: "fork",
        roles: MAIN,
        what: "reinit_after_fork in the child, with an armed and an idle registration",
    },
    Scenario {
        name: "file",
        roles: BOTH,
        what: "arm a regular file (always ready) while another thread is blocked in deliver",
    },
];

/// `name@waiter` or `name@follower` for a waiter's role, `name` for the main one.
pub fn full_name(name: &str, role: Role) -> String {
    match role {
        Role::Main => name.to_owned(),
        Role::Waiter => format!("{name}@waiter"),
        Role::Follower => format!("{name}@follower"),
    }
}

/// `faults run BACKEND SCENARIO[@ROLE] [--strace PATH --log FILE --syscalls LIST
/// [--inject SYSCALL:ERRNO:N]]`: prints `MET` lines and a `RESULT` line; exit
/// status 0 when every check passed, 1 otherwise, 2 for bad usage.
pub fn main(args: &[String]) -> i32 {
    let usage = "faults run BACKEND SCENARIO[@waiter|@follower] [--strace PATH --log FILE --syscalls LIST [--inject SYSCALL:ERRNO:N]]";
    let (Some(backend), Some(scenario)) = (args.first(), args.get(1)) else {
        eprintln!("usage: {usage}");
        return 2;
    };
    let (name, role) = match scenario.split_once('@') {
        Some((n, "waiter")) => (n, Role::Waiter),
        Some((n, "follower")) => (n, Role::Follower),
        None => (scenario.as_str(), Role::Main),
        Some(_) => {
            eprintln!("unknown role in {scenario:?}: usage: {usage}");
            return 2;
        }
    };
    let (mut strace, mut log, mut syscalls, mut inject) = (None, None, None, None);
    let mut rest = args[2..].iter();
    while let Some(flag) = rest.next() {
        let value = rest.next().cloned();
        match (flag.as_str(), value) {
            ("--strace", Some(v)) => strace = Some(v),
            ("--log", Some(v)) => log = Some(v),
            ("--syscalls", Some(v)) => syscalls = Some(v),
            ("--inject", Some(v)) => {
                let parts: Vec<&str> = v.split(':').collect();
                match parts[..] {
                    [s, e, n] if errno_of(e).is_some() && n.parse::<u32>().is_ok() => {
                        inject = Some((s.to_owned(), e.to_owned(), n.parse().unwrap_or(0)))
                    }
                    _ => {
                        eprintln!("bad --inject {v:?}: SYSCALL:ERRNO:N with a known ERRNO");
                        return 2;
                    }
                }
            }
            _ => {
                eprintln!("bad flag {flag:?}: usage: {usage}");
                return 2;
            }
        }
    }
    let spec = match (strace, log, syscalls) {
        (Some(strace), Some(log), Some(syscalls)) => Some(Spec {
            strace: strace.into(),
            log: log.into(),
            syscalls,
            inject: inject.clone(),
        }),
        (None, None, None) if inject.is_none() => None,
        _ => {
            eprintln!("--strace, --log and --syscalls go together: usage: {usage}");
            return 2;
        }
    };
    if !SCENARIOS
        .iter()
        .any(|s| s.name == name && s.roles.contains(&role))
    {
        eprintln!("no scenario {scenario:?} (faults list)");
        return 2;
    }
    let ctx = Ctx {
        role,
        spec,
        fault: inject.map(|(_, e, _)| {
            let errno = errno_of(&e).unwrap_or(0);
            (e, errno)
        }),
        met: Mutex::new(Vec::new()),
    };
    let result = match backend.as_str() {
        "epoll" => run::<pollshot::backends::Epoll>(name, &ctx),
        "poll" => run::<pollshot::backends::Blocking>(name, &ctx),
        "uring" => run::<pollshot::backends::Uring>(name, &ctx),
        #[cfg(pollshot_libkqueue)]
        "kqueue" => run::<pollshot::backends::Kqueue>(name, &ctx),
        other => {
            eprintln!("no backend {other:?} here (epoll, poll, uring; kqueue with libkqueue)");
            return 2;
        }
    };
    ctx.report();
    match result {
        Ok(()) => {
            println!("RESULT ok");
            0
        }
        Err(e) => {
            println!("RESULT fail: {e}");
            1
        }
    }
}

fn run<B: Backend>(name: &str, ctx: &Ctx) -> Result<(), String> {
    match name {
        "new" => new::<B>(ctx),
        "register" => register::<B>(ctx),
        "first_arm" => first_arm::<B>(ctx),
        "rearm" => rearm::<B>(ctx),
        "arm_many" => arm_many::<B>(ctx),
        "half_closed" => half_closed::<B>(ctx),
        "disarm" => disarm::<B>(ctx),
        "deregister" => deregister::<B>(ctx),
        "deregister_blocked" => deregister_blocked::<B>(ctx),
        "deliver_pending" => deliver_pending::<B>(ctx),
        "notify0" => notify0::<B>(ctx),
        "notify1" => notify_k::<B>(ctx, 1),
        "notify2" => notify_k::<B>(ctx, 2),
        "shutdown" => shutdown::<B>(ctx),
        "fork" => fork::<B>(ctx),
        "file" => file::<B>(ctx),
        _ => Err(format!("no scenario {name}")),
    }
}

fn poller<B: Backend>() -> Result<Poller<B>, String> {
    Poller::<B>::with_backend().map_err(|e| format!("Poller::with_backend: {e}"))
}

fn io<T>(what: &str, r: io::Result<T>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// Open descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

/// A full round trip on a new pair: register, arm, an event, deregister, release.
fn round_trip<B: Backend>(p: &Poller<B>) -> Result<(), String> {
    let (mut a, b, t) = armed(p)?;
    io("write", a.write_all(b"x"))?;
    expect(p, &[t], &[])?;
    quiet(p)?;
    finish(p, t, b, a)
}

/// A new pair, its second end registered and armed readable: `(peer,
/// registered, token)`.
fn armed<B: Backend>(p: &Poller<B>) -> Result<(UnixStream, UnixStream, Token), String> {
    let (a, b) = pair()?;
    let t = io("register", p.register(&b))?;
    io("arm", p.arm(t, Interest::READABLE))?;
    Ok((a, b, t))
}

/// Deregisters `t`, closes its descriptor `b`, and checks that `b`'s peer `a`
/// sees it released.
fn finish<B: Backend>(
    p: &Poller<B>,
    t: Token,
    b: UnixStream,
    mut a: UnixStream,
) -> Result<(), String> {
    io("deregister", p.deregister(t))?;
    drop(b);
    released(&mut a)
}

/// A zero-timeout deliver: io_uring submits the arms queued so far.
fn submit<B: Backend>(p: &Poller<B>) -> Result<(), String> {
    finds_nothing(|events| deliver_plain(p, events, Some(Duration::ZERO)))
}

/// [`submit`] in the window: a zero-timeout deliver under test, which finds
/// nothing (io_uring: the `io_uring_enter` that submits what the window queued).
fn submit_in<B: Backend>(ctx: &Ctx, p: &Poller<B>) -> Result<(), String> {
    finds_nothing(|events| ctx.deliver(p, events, Some(Duration::ZERO)))
}

/// `deliver` delivers no event.
fn finds_nothing(deliver: impl FnOnce(&mut Events) -> Result<usize, String>) -> Result<(), String> {
    let mut events = Events::with_capacity(4);
    deliver(&mut events)?;
    if events.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "unexpected events: {:?}",
            events.iter().collect::<Vec<_>>()
        ))
    }
}

/// The registration's descriptor reads empty (what was written is drained).
fn drain(s: &mut std::os::unix::net::UnixStream) {
    use std::io::Read;
    let mut buf = [0u8; 64];
    while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
}

fn new<B: Backend>(ctx: &Ctx) -> Result<(), String> {
    // What the first poller of a process sets up once (libkqueue's global state)
    // is not this window's.
    drop(poller::<B>()?);
    let before = open_fds();
    let p = ctx.window(Role::Main, || {
        ctx.call("Poller::with_backend", Poller::<B>::with_backend)
    })?;
    // A refused attempt left no descriptor behind: this poller holds as many as
    // another one does. (Not on libkqueue: it closes a kqueue's own descriptors
    // later, from its monitoring thread.)
    let after = open_fds();
    let other = poller::<B>()?;
    let per_poller = open_fds() - after;
    drop(other);
    if p.backend_name() != "kqueue" && after - before != per_poller {
        return Err(format!(
            "{} descriptors open for one poller, another takes {per_poller}: a refused attempt leaked",
            after - before
        ));
    }
    round_trip(&p)
}

fn register<B: Backend>(ctx: &Ctx) -> Result<(), String> {
    let p = poller::<B>()?;
    let (mut a, b) = pair()?;
    let old = io("register", p.register(&b))?;
    io("arm", p.arm(old, Interest::READABLE))?;
    submit(&p)?;
    let new = ctx.window(Role::Main, || {
        let new = ctx.call("register", || p.register(&b))?;
        ctx.call("arm", || p.arm(new, Interest::READABLE))?;
        submit_in(ctx, &p)?;
        Ok(new)
    })?;
    io("write", a.write_all(b"x"))?;
    expect(&p, &[new], &[])?;
    quiet(&p)?;
    if p.arm(old, Interest::READABLE).is_ok() {
        return Err("the superseded token still names a registration".into());
    }
    io("deregister", p.deregister(new))?;
    drop(b);
    released(&mut a)?;
    round_trip(&p)
}

fn first_arm<B: Backend>(ctx: &Ctx) -> Result<(), String> {
    let p = poller::<B>()?;
    let (mut a, b) = pair()?;
    let t = io("register", p.register(&b))?;
    ctx.window(Role::Main, || {
        ctx.call("arm", || p.arm(t, Interest::READABLE))?;
        submit_in(ctx, &p)
    })?;
    io("write", a.write_all(b"x"))?;
    expect(&p, &[t], &[])?;
    quiet(&p)?;
    finish(&p, t, b, a)
}

fn rearm<B: Backend>(ctx: &Ctx) -> Result<(), String> {
    let p = poller::<B>()?;
    let (mut a, mut b) = pair()?;
    let t = io("register", p.register(&b))?;
    io("arm", p.arm(t, Interest::READABLE))?;
    io("write", a.write_all(b"x"))?;
    expect(&p, &[t], &[])?;
    drain(&mut b);
    ctx.window(Role::Main, || {
        // Idle -> armed (writable), then armed -> armed for another interest.
        ctx.call("arm", || p.arm(t, Interest::WRITABLE))?;
        ctx.call("arm", || p.arm(t, Interest::READABLE))?;
        submit_in(ctx, &p)
    })?;
    // Armed readable: the writable state the first arm asked for is not reported
    // (the second arm replaced it), the data written now is.
    quiet(&p)?;
    io("write", a.write_all(b"y"))?;
    let ev = expect(&p, &[t], &[])?;
    if !ev[0].is_readable() {
        return Err(format!("armed readable, got {:?}", ev[0]));
    }
    io("arm", p.arm(t, Interest::WRITABLE))?;
    expect(&p, &[t], &[])?;
    finish(&p, t, b, a)
}

fn arm_many<B: Backend>(ctx: &Ctx) -> Result<(), String> {
    const N: usize = 300;
    let p = poller::<B>()?;
    let mut pairs = Vec::with_capacity(N);
    let mut tokens = Vec::with_capacity(N);
    for _ in 0..N {
        let (a, b) = pair()?;
        tokens.push(io("register", p.register(&b))?);
        pairs.push((a, b));
    }
    ctx.window(Role::Main, || {
        for &t in &tokens {
            ctx.call("arm", || p.arm(t, Interest::READABLE))?;
        }
        submit_in(ctx, &p)
    })?;
    for (a, _) in &mut pairs {
        io("write", a.write_all(b"x"))?;
    }
    expect(&p, &tokens, &[])?;
    quiet(&p)?;
    for (&t, (mut a, b)) in tokens.iter().zip(pairs) {
        io("deregister", p.deregister(t))?;
        drop(b);
        released(&mut a)?;
    }
    Ok(())
}

fn half_closed<B: Backend>(ctx: &Ctx) -> Result<(), String> {
    let p = poller::<B>()?;
    let (mut a, mut b) = pair()?;
    io("shutdown", a.shutdown(std::net::Shutdown::Write))?;
    let chunk = [0u8; 4096];
    loop {
        match b.write(&chunk) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(format!("write: {e}")),
        }
    }
    let t = io("register", p.register(&b))?;
    let got = ctx.window(Role::Main, || {
        ctx.call("arm", || p.arm(t, Interest::WRITABLE))?;
        // io_uring: the request completes at once with read-closed alone, and
        // the private epoll instance takes the arming over (made here).
        let mut events = Events::with_capacity(4);
        ctx.deliver(&p, &mut events, Some(QUIET))?;
        Ok(events.iter().copied().collect::<Vec<_>>())
    })?;
    match got[..] {
        [] => {}
        // io_uring where the private epoll refused the arming: an error event
        // (the arming's delivery; a write then says what it is).
        [ev] if ev.token() == t && ev.is_error() => {
            ctx.noted("deliver", "an error event");
            io("arm", p.arm(t, Interest::WRITABLE))?;
        }
        _ => return Err(format!("not writable, yet delivered {got:?}")),
    }
    quiet(&p)?;
    // Room: the arming is delivered, writable.
    drain(&mut a);
    let ev = expect(&p, &[t], &[])?;
    if !ev[0].is_writable() {
        return Err(format!("armed writable, got {:?}", ev[0]));
    }
    finish(&p, t, b, a)
}

fn disarm<B: Backend>(ctx: &Ctx) -> Result<(), String> {
    let p = poller::<B>()?;
    let (mut a, b, t) = armed(&p)?;
    submit(&p)?;
    ctx.window(Role::Main, || {
        ctx.call("disarm", || p.disarm(t))?;
        submit_in(ctx, &p)
    })?;
    io("write", a.write_all(b"x"))?;
    quiet(&p)?;
    io("arm", p.arm(t, Interest::READABLE))?;
    expect(&p, &[t], &[])?;
    finish(&p, t, b, a)
}

fn deregister<B: Backend>(ctx: &Ctx) -> Result<(), String> {
    let p = poller::<B>()?;
    let (mut a, b, t) = armed(&p)?;
    submit(&p)?;
    ctx.window(Role::Main, || ctx.call("deregister", || p.deregister(t)))?;
    io("write", a.write_all(b"x"))?;
    quiet(&p)?;
    if p.arm(t, Interest::READABLE).is_ok() {
        return Err("the deregistered token still names a registration".into());
    }
    if !p.is_empty() {
        return Err(format!("{} registrations left", p.len()));
    }
    drop(b);
    released(&mut a)?;
    round_trip(&p)
}

/// What a waiter thread saw: the tokens of its events, and whether a notify or a
/// shutdown ended its `deliver`.
#[derive(Debug, Default)]
struct Seen {
    tokens: Vec<Token>,
    notified: bool,
    shutdown: bool,
}

/// Waiter threads that have returned.
#[derive(Default)]
struct Done(AtomicUsize);

impl Done {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// Waits until `n` waiters have returned, then checks that no more return
    /// for [`QUIET`] (one notify ends one deliver).
    fn exactly(&self, n: usize) -> Result<(), String> {
        let deadline = Instant::now() + LONG;
        while self.count() < n {
            if Instant::now() > deadline {
                return Err(format!(
                    "lost: {} waiters returned after {LONG:?}, {n} expected",
                    self.count()
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(QUIET);
        match self.count() {
            c if c == n => Ok(()),
            c => Err(format!("{c} waiters returned, {n} expected")),
        }
    }
}

type Waiter<'scope> = ScopedJoinHandle<'scope, Result<Seen, String>>;

/// Starts a thread that delivers, blocking, until a notify, a shutdown or an
/// event for `until` ends it, and waits until it is blocked in the kernel (with
/// the waiters `before`, which must still be); `traced`: in a waiter's role, its
/// deliver calls are the window. Returns the thread and its id.
fn spawn_waiter<'scope, 'env, B: Backend>(
    scope: &'scope Scope<'scope, 'env>,
    p: &'env Poller<B>,
    ctx: &'env Ctx,
    done: &'env Done,
    traced: bool,
    until: Option<Token>,
    before: &[i32],
) -> Result<(Waiter<'scope>, i32), String> {
    let (tx, rx) = mpsc::channel();
    let handle = scope.spawn(move || {
        let _ = tx.send(gettid());
        let traced = traced && ctx.role != Role::Main;
        let mut seen = Seen::default();
        let mut body = || -> Result<(), String> {
            let mut events = Events::with_capacity(8);
            loop {
                if traced {
                    ctx.deliver(p, &mut events, None)?;
                } else {
                    deliver_plain(p, &mut events, None)?;
                }
                seen.tokens.extend(events.iter().map(|e| e.token()));
                seen.notified |= events.is_notified();
                seen.shutdown |= events.is_shutdown();
                if seen.notified || seen.shutdown || until.is_some_and(|t| seen.tokens.contains(&t))
                {
                    return Ok(());
                }
            }
        };
        let r = if traced {
            ctx.window(ctx.role, body)
        } else {
            body()
        };
        done.0.fetch_add(1, Ordering::SeqCst);
        r.map(|()| seen)
    });
    let tid = rx
        .recv_timeout(LONG)
        .map_err(|_| "a waiter thread did not start".to_owned())?;
    let mut all = before.to_vec();
    all.push(tid);
    blocked(&all, &|| done.count() > 0)?;
    Ok((handle, tid))
}

/// Runs `f`; if it fails, shuts the poller down so that the waiters it started
/// return (and the scope can join them) instead of blocking for ever.
fn released_on_error<B: Backend>(
    p: &Poller<B>,
    f: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    let r = f();
    if r.is_err() {
        let _ = p.shutdown();
    }
    r
}

/// Whether waiter `i` of `k` (in the order they block) is the traced one.
fn traced_waiter(ctx: &Ctx, i: usize, k: usize) -> bool {
    match ctx.role {
        Role::Main => false,
        Role::Waiter => i == 0,
        Role::Follower => i + 1 == k,
    }
}

fn join(w: Waiter<'_>) -> Result<Seen, String> {
    w.join()
        .map_err(|_| "a waiter thread panicked".to_owned())?
}

fn deregister_blocked<B: Backend>(ctx: &Ctx) -> Result<(), String> {
    let p = poller::<B>()?;
    let (mut a, b, t) = armed(&p)?;
    let done = Done::default();
    std::thread::scope(|s| {
        released_on_error(&p, || {
            let (w, _) = spawn_waiter(s, &p, ctx, &done, true, None, &[])?;
            ctx.window(Role::Main, || ctx.call("deregister", || p.deregister(t)))?;
            // Released while the waiter is still blocked: no wait of its holds the file.
            drop(b);
            released(&mut a)?;
            if done.count() != 0 {
                return Err("the waiter returned before the notify".into());
            }
            io("notify", p.notify())?;
            done.exactly(1)?;
            let seen = join(w)?;
            if !seen.notified || !seen.tokens.is_empty() {
                return Err(format!("the waiter saw {seen:?}, expected a notify alone"));
            }
            Ok(())
        })
    })?;
    quiet(&p)?;
    if p.arm(t, Interest::READABLE).is_ok() {
        return Err("the deregistered token still names a registration".into());
    }
    round_trip(&p)
}

fn deliver_pending<B: Backend>(ctx: &Ctx) -> Result<(), String> {
    let p = poller::<B>()?;
    let (mut a1, b1) = pair()?;
    let (mut a2, b2) = pair()?;
    let t1 = io("register", p.register(&b1))?;
    let t2 = io("register", p.register(&b2))?;
    io("arm", p.arm(t1, Interest::READABLE))?;
    io("arm", p.arm(t2, Interest::READABLE))?;
    io("write", a1.write_all(b"x"))?;
    io("write", a2.write_all(b"x"))?;
    let got = ctx.window(Role::Main, || {
        let mut got = Vec::new();
        let mut events = Events::with_capacity(1);
        // A whole number of milliseconds, then not (epoll: epoll_pwait, then
        // epoll_pwait2).
        for timeout in [LONG, LONG + Duration::from_micros(500)] {
            ctx.deliver(&p, &mut events, Some(timeout))?;
            got.extend(events.iter().copied());
        }
        Ok(got)
    })?;
    expect(&p, &[t1, t2], &got)?;
    quiet(&p)?;
    io("deregister", p.deregister(t1))?;
    io("deregister", p.deregister(t2))?;
    drop((b1, b2));
    released(&mut a1)?;
    released(&mut a2)
}

fn notify0<B: Backend>(ctx: &Ctx) -> Result<(), String> {
    let p = poller::<B>()?;
    ctx.window(Role::Main, || ctx.call("notify", || p.notify()))?;
    let mut events = Events::with_capacity(4);
    deliver_plain(&p, &mut events, Some(LONG))?;
    if !events.is_notified() || !events.is_empty() {
        return Err(format!(
            "lost: the deliver after the notify returned {:?}, notified {}",
            events.iter().collect::<Vec<_>>(),
            events.is_notified()
        ));
    }
    // One notify ends one deliver.
    quiet(&p)?;
    round_trip(&p)
}

fn notify_k<B: Backend>(ctx: &Ctx, k: usize) -> Result<(), String> {
    let p = poller::<B>()?;
    let done = Done::default();
    std::thread::scope(|s| {
        released_on_error(&p, || {
            let mut waiters = Vec::new();
            let mut tids = Vec::new();
            for i in 0..k {
                let (w, tid) =
                    spawn_waiter(s, &p, ctx, &done, traced_waiter(ctx, i, k), None, &tids)?;
                waiters.push(w);
                tids.push(tid);
            }
            ctx.window(Role::Main, || ctx.call("notify", || p.notify()))?;
            done.exactly(1)?;
            for n in 2..=k {
                io("notify", p.notify())?;
                done.exactly(n)?;
            }
            for w in waiters {
                let seen = join(w)?;
                if !seen.notified || !seen.tokens.is_empty() {
                    return Err(format!("a waiter saw {seen:?}, expected a notify alone"));
                }
            }
            Ok(())
        })
    })?;
    quiet(&p)?;
    round_trip(&p)
}

fn shutdown<B: Backend>(ctx: &Ctx) -> Result<(), String> {
    let p = poller::<B>()?;
    let (a, b, t) = armed(&p)?;
    let done = Done::default();
    std::thread::scope(|s| {
        released_on_error(&p, || {
            let (w0, tid0) = spawn_waiter(s, &p, ctx, &done, traced_waiter(ctx, 0, 2), None, &[])?;
            let (w1, _) = spawn_waiter(s, &p, ctx, &done, traced_waiter(ctx, 1, 2), None, &[tid0])?;
            ctx.window(Role::Main, || ctx.call("shutdown", || p.shutdown()))?;
            done.exactly(2)?;
            for w in [w0, w1] {
                let seen = join(w)?;
                if !seen.shutdown || !seen.tokens.is_empty() {
                    return Err(format!(
                        "a waiter saw {seen:?}, expected the shutdown alone"
                    ));
                }
            }
            Ok(())
        })
    })?;
    let mut events = Events::with_capacity(4);
    let start = Instant::now();
    deliver_plain(&p, &mut events, Some(LONG))?;
    if !events.is_shutdown() || start.elapsed() >= LONG {
        return Err("a deliver after the shutdown waited".into());
    }
    // Everything else still works.
    finish(&p, t, b, a)
}

fn fork<B: Backend>(ctx: &Ctx) -> Result<(), String> {
    let mut p = poller::<B>()?;
    let (mut a1, b1) = pair()?;
    let (mut a2, mut b2) = pair()?;
    let t1 = io("register", p.register(&b1))?;
    let t2 = io("register", p.register(&b2))?;
    io("arm", p.arm(t1, Interest::READABLE))?;
    io("arm", p.arm(t2, Interest::READABLE))?;
    io("write", a2.write_all(b"x"))?;
    expect(&p, &[t2], &[])?;
    drain(&mut b2);
    io("flush", io::stdout().flush())?;
    // SAFETY: this process has one thread here (the scenario's), so the child
    // may run anything; it leaves by _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", io::Error::last_os_error()));
    }
    if pid > 0 {
        let mut status = 0;
        // SAFETY: `status` outlives the call; `pid` is our child.
        if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
            return Err(format!("waitpid: {}", io::Error::last_os_error()));
        }
        // The child printed its own report.
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            println!(
                "RESULT fail: the child ended by signal {}",
                libc::WTERMSIG(status)
            );
            1
        };
        let _ = io::stdout().flush();
        std::process::exit(code);
    }
    let r = (|| {
        ctx.window(Role::Main, || {
            ctx.call("reinit_after_fork", || p.reinit_after_fork())
        })?;
        // The armed registration is armed in the child's kernel, the idle one
        // arms again.
        io("write", a1.write_all(b"x"))?;
        expect(&p, &[t1], &[])?;
        io("arm", p.arm(t2, Interest::READABLE))?;
        io("write", a2.write_all(b"y"))?;
        expect(&p, &[t2], &[])?;
        quiet(&p)?;
        io("deregister", p.deregister(t1))?;
        io("deregister", p.deregister(t2))?;
        round_trip(&p)
    })();
    ctx.report();
    let code = match r {
        Ok(()) => {
            println!("RESULT ok");
            0
        }
        Err(e) => {
            println!("RESULT fail: in the child: {e}");
            1
        }
    };
    let _ = io::stdout().flush();
    // SAFETY: leaves the child without running the parent's exit handlers.
    unsafe { libc::_exit(code) }
}

fn file<B: Backend>(ctx: &Ctx) -> Result<(), String> {
    let p = poller::<B>()?;
    let path = std::env::temp_dir().join(format!("pollshot-faults-{}", std::process::id()));
    let f = io("create a file", std::fs::File::create(&path))?;
    let _ = std::fs::remove_file(&path);
    let t = io("register", p.register(&f))?;
    let done = Done::default();
    std::thread::scope(|s| {
        released_on_error(&p, || {
            let (w, _) = spawn_waiter(s, &p, ctx, &done, true, Some(t), &[])?;
            ctx.window(Role::Main, || {
                ctx.call("arm", || p.arm(t, Interest::READABLE))
            })?;
            done.exactly(1)?;
            let seen = join(w)?;
            if seen.tokens != [t] {
                return Err(format!(
                    "the waiter saw {seen:?}, expected one event for {t:?}"
                ));
            }
            Ok(())
        })
    })?;
    quiet(&p)?;
    io("arm", p.arm(t, Interest::READABLE))?;
    expect(&p, &[t], &[])?;
    quiet(&p)?;
    io("deregister", p.deregister(t))?;
    round_trip(&p)
}
