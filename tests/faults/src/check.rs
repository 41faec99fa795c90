//! What a run checks while it runs: the window (traced or not), the API calls in
//! it (a refusal answered with the injected errno, once, then a retry that
//! succeeds), and the helpers that check the poller afterwards (every readiness
//! delivered, nothing stale, the file released, a waiter blocked in the kernel).

use crate::trace::{self, Spec};
use pollshot::{Backend, Event, Events, Poller, Token};
use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an expected event, a waiter's return or a release may take: only a
/// failure (a lost event, a held file) waits this long.
pub const LONG: Duration = Duration::from_secs(10);

/// How long "nothing more is delivered" is watched: a stale event, a second
/// return for one notify, shows at once.
pub const QUIET: Duration = Duration::from_millis(60);

/// Which thread of a scenario is traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The thread that makes the API call under test.
    Main,
    /// A thread blocked in `deliver` meanwhile, the first to block (on io_uring,
    /// the leader in `io_uring_enter`).
    Waiter,
    /// A thread blocked in `deliver` meanwhile, the last of two to block (on
    /// io_uring, a follower on the hand-over futex).
    Follower,
}

/// A scenario's run: the trace (if any), the injected error (if any), and what the
/// API answered.
pub struct Ctx {
    pub role: Role,
    pub spec: Option<Spec>,
    /// The injected errno's name and number (`None`: a run with no fault).
    pub fault: Option<(String, i32)>,
    /// The API calls that met the refusal: `(call, what it returned)`.
    pub met: Mutex<Vec<(String, String)>>,
}

/// The errno values the driver injects, by name.
pub fn errno_of(name: &str) -> Option<i32> {
    Some(match name {
        "EAGAIN" => libc::EAGAIN,
        "EBUSY" => libc::EBUSY,
        "EINTR" => libc::EINTR,
        "EMFILE" => libc::EMFILE,
        "ENFILE" => libc::ENFILE,
        "ENODEV" => libc::ENODEV,
        "ENOMEM" => libc::ENOMEM,
        "ENOSPC" => libc::ENOSPC,
        "EPERM" => libc::EPERM,
        _ => return None,
    })
}

impl Ctx {
    /// Runs `f` as the window if `role` is the traced one (strace attached to this
    /// thread around it), else plainly.
    pub fn window<T>(
        &self,
        role: Role,
        f: impl FnOnce() -> Result<T, String>,
    ) -> Result<T, String> {
        match &self.spec {
            Some(spec) if role == self.role => {
                let attached = trace::attach(spec)?;
                let r = f();
                attached.detach()?;
                r
            }
            _ => f(),
        }
    }

    /// Whether `e` is what the injected refusal makes the API answer: the kernel's
    /// errno, or `Unsupported` where io_uring_setup(2) answers EPERM (the
    /// backend's documented refusal).
    fn is_the_fault(&self, e: &io::Error) -> bool {
        match &self.fault {
            Some((name, errno)) => {
                e.raw_os_error() == Some(*errno)
                    || (name == "EPERM" && e.kind() == io::ErrorKind::Unsupported)
            }
            None => false,
        }
    }

    fn record(&self, what: &str, e: &io::Error) -> Result<(), String> {
        let mut met = self.met.lock().unwrap_or_else(|p| p.into_inner());
        if !met.is_empty() {
            return Err(format!(
                "{what}: a second refusal ({e}) after {met:?}: one call was failed"
            ));
        }
        let answer = match e.raw_os_error() {
            Some(_) => self.fault.as_ref().map_or("?".into(), |f| f.0.clone()),
            None => format!("{:?}", e.kind()),
        };
        met.push((what.to_owned(), answer));
        Ok(())
    }

    /// An API call under test: `Ok`, or the injected refusal once, and then the
    /// same call again, which must succeed.
    pub fn call<T>(&self, what: &str, mut f: impl FnMut() -> io::Result<T>) -> Result<T, String> {
        match f() {
            Ok(v) => Ok(v),
            Err(e) if self.is_the_fault(&e) => {
                self.record(what, &e)?;
                f().map_err(|e| format!("{what} retried after the refusal: {e}"))
            }
            Err(e) => Err(format!(
                "{what}: {e} (errno {:?}, kind {:?}); injected: {:?}",
                e.raw_os_error(),
                e.kind(),
                self.fault.as_ref().map(|f| &f.0)
            )),
        }
    }

    /// A `deliver` under test: as [`call`](Self::call), and `Interrupted` is
    /// always "call again" (the contract; io_uring's task work can end a wait so
    /// with no signal), recorded as the refusal when EINTR was injected.
    pub fn deliver<B: Backend>(
        &self,
        p: &Poller<B>,
        events: &mut Events,
        timeout: Option<Duration>,
    ) -> Result<usize, String> {
        for _ in 0..1000 {
            match p.deliver(events, timeout) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    if self.is_the_fault(&e) && self.met_nothing() {
                        self.record("deliver", &e)?;
                    }
                }
                Err(e) if self.is_the_fault(&e) => self.record("deliver", &e)?,
                Err(e) => {
                    return Err(format!(
                        "deliver: {e} (errno {:?}); injected: {:?}",
                        e.raw_os_error(),
                        self.fault.as_ref().map(|f| &f.0)
                    ))
                }
            }
        }
        Err("deliver: Interrupted 1,000 times".into())
    }

    /// Records what the API gave for the refusal where it is not an error: a
    /// documented error event (io_uring's private epoll refused).
    pub fn noted(&self, what: &str, answer: &str) {
        self.met
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((what.to_owned(), answer.to_owned()));
    }

    fn met_nothing(&self) -> bool {
        self.met
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// The `MET` lines the driver reads: which call met the refusal, and what it
    /// got (none: the backend absorbed it).
    pub fn report(&self) {
        for (what, answer) in self.met.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            println!("MET {what} {answer}");
        }
    }
}

/// A connected pair, both ends non-blocking: `(peer, registered)`.
pub fn pair() -> Result<(UnixStream, UnixStream), String> {
    let (a, b) = UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
    for s in [&a, &b] {
        s.set_nonblocking(true)
            .map_err(|e| format!("O_NONBLOCK: {e}"))?;
    }
    Ok((a, b))
}

/// `deliver` outside the window: `Interrupted` is "call again".
pub fn deliver_plain<B: Backend>(
    p: &Poller<B>,
    events: &mut Events,
    timeout: Option<Duration>,
) -> Result<usize, String> {
    loop {
        match p.deliver(events, timeout) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r.map_err(|e| format!("deliver: {e}")),
        }
    }
}

/// Delivers until each of `tokens` has had exactly one event; fails on a second
/// event for one of them, on an event for another token (stale), or after
/// [`LONG`] (lost). `already`: events delivered before, counted in.
pub fn expect<B: Backend>(
    p: &Poller<B>,
    tokens: &[Token],
    already: &[Event],
) -> Result<Vec<Event>, String> {
    let mut got: Vec<Event> = Vec::new();
    let mut events = Events::with_capacity(16);
    let deadline = Instant::now() + LONG;
    let take = |got: &mut Vec<Event>, ev: Event| -> Result<(), String> {
        if !tokens.contains(&ev.token()) {
            return Err(format!("stale: an event for {ev:?}, expected {tokens:?}"));
        }
        if got.iter().any(|g| g.token() == ev.token()) {
            return Err(format!("a second event for {:?}: {ev:?}", ev.token()));
        }
        got.push(ev);
        Ok(())
    };
    for ev in already {
        take(&mut got, *ev)?;
    }
    while got.len() < tokens.len() {
        if Instant::now() > deadline {
            return Err(format!(
                "lost: expected one event for each of {tokens:?}, got {got:?} after {LONG:?}"
            ));
        }
        deliver_plain(p, &mut events, Some(Duration::from_millis(50)))?;
        for ev in events.iter() {
            take(&mut got, *ev)?;
        }
    }
    Ok(got)
}

/// Nothing is delivered for [`QUIET`] (no stale event, no spurious notify).
pub fn quiet<B: Backend>(p: &Poller<B>) -> Result<(), String> {
    let mut events = Events::with_capacity(16);
    deliver_plain(p, &mut events, Some(QUIET))?;
    if !events.is_empty() || events.is_notified() {
        return Err(format!(
            "expected nothing, got {:?} (notified {})",
            events.iter().collect::<Vec<_>>(),
            events.is_notified()
        ));
    }
    Ok(())
}

/// The registered end of `peer`'s pair is closed by now: the peer reads EOF (or a
/// reset) once
/// no one holds the file (a poll request on io_uring, a blocked poll(2) would).
pub fn released(peer: &mut UnixStream) -> Result<(), String> {
    let deadline = Instant::now() + LONG;
    let mut buf = [0u8; 64];
    loop {
        match peer.read(&mut buf) {
            // EOF, or a reset where the closed end had unread data.
            Ok(0) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("peer read: {e}")),
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the deregistered file was not released: no EOF at its peer after {LONG:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// This thread's id (for [`blocked`]).
pub fn gettid() -> i32 {
    // SAFETY: gettid(2) takes no argument.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Whether thread `tid` of this process sleeps in one of a backend's waits:
/// epoll_wait/epoll_pwait/epoll_pwait2, poll/ppoll, io_uring_enter, futex (a
/// follower's), or (libkqueue) its epoll wait.
fn in_wait(tid: i32) -> bool {
    let path = format!("/proc/self/task/{tid}/syscall");
    let Ok(s) = std::fs::read_to_string(path) else {
        return false;
    };
    let Some(nr) = s
        .split_whitespace()
        .next()
        .and_then(|n| n.parse::<i64>().ok())
    else {
        return false;
    };
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
    let sleeping = stat
        .rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('S'));
    sleeping
        && [
            libc::SYS_epoll_wait,
            libc::SYS_epoll_pwait,
            libc::SYS_epoll_pwait2,
            libc::SYS_poll,
            libc::SYS_ppoll,
            libc::SYS_io_uring_enter,
            libc::SYS_futex,
        ]
        .contains(&nr)
}

/// Waits until every thread of `tids` sleeps in a wait (seen twice, 5 ms apart);
/// fails at once when `gone` says one of them returned instead.
pub fn blocked(tids: &[i32], gone: &dyn Fn() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + LONG;
    let mut seen = 0;
    while seen < 2 {
        if gone() {
            return Err(format!("a waiter of {tids:?} returned instead of blocking"));
        }
        if tids.iter().all(|&t| in_wait(t)) {
            seen += 1;
        } else {
            seen = 0;
        }
        if Instant::now() > deadline {
            return Err(format!("threads {tids:?} never blocked in a wait"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}
