//! A deregistered descriptor is released at once: when `deregister` returns, the
//! poller holds no reference to the file, so a `close` right after it is the last
//! one. Each body runs on every backend through the `suite!` macro, alone and with
//! another thread blocked in `deliver(None)` (a thread in poll(2) holds every file
//! in its set; an io_uring poll request holds its file until it has ended).
//!
//! - after `deregister` + `close` of a connected socket, the peer reads EOF at
//!   once: a poll(2) of the peer reports `POLLIN` or `POLLHUP`, and a read
//!   returns 0;
//! - after `deregister` + `close` of a listening socket, its port can be bound
//!   again at once.
//!
//! Each scenario is repeated [`TRIALS`] times in one process and every trial is
//! asserted. The poll(2) of the peer has a timeout only so that a failure ends:
//! on a poller that still holds the file nothing arrives at all.

use super::*;
use pollshot::Interest;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
#[cfg(target_os = "linux")]
use std::{sync::mpsc, thread};

/// Trials of each scenario.
pub const TRIALS: usize = 20;

/// How long the peer's poll(2) may wait for the EOF before the trial fails. The
/// EOF is on its way when `close` returns; this only bounds a failure.
const EOF_WITHIN_MS: i32 = 2_000;

/// Another thread blocked in `deliver(None)` on `p` until [`Blocker::finish`].
#[cfg(all(feature = "stats", target_os = "linux"))]
struct Blocker<B: Backend> {
    p: Arc<Poller<B>>,
    handle: thread::JoinHandle<Vec<Token>>,
}

#[cfg(all(feature = "stats", target_os = "linux"))]
impl<B: Backend> Blocker<B> {
    /// Starts the thread and waits until it is blocked in the kernel's wait
    /// (see [`until_blocked_in_wait`]), with the armed descriptors in it.
    fn start(p: &Arc<Poller<B>>) -> Blocker<B> {
        let q = p.clone();
        let (tx, rx) = mpsc::channel();
        let handle = thread::spawn(move || {
            // SAFETY: gettid(2) has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            let mut events = Events::with_capacity(8);
            loop {
                match q.deliver(&mut events, None) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => panic!("deliver: {e}"),
                }
                // Only the notify of `finish` ends it: the armed descriptors are
                // deregistered before they can report.
                return events.iter().map(|e| e.token()).collect();
            }
        });
        until_blocked_in_wait(rx.recv().expect("the blocking thread's id"));
        Blocker {
            p: p.clone(),
            handle,
        }
    }

    /// Ends the blocked deliver with a notify; returns the tokens it delivered.
    fn finish(self) -> Vec<Token> {
        self.p.notify().expect("notify");
        self.handle.join().expect("blocking thread")
    }
}

/// Waits until thread `tid` of this process sits in a system call other than
/// futex(2) (`/proc/self/task/<tid>/syscall` names it): inside `deliver` that is
/// the backend's wait (epoll_wait, poll, io_uring_enter, kevent's). Panics after
/// [`HANG_AFTER`].
#[cfg(target_os = "linux")]
pub fn until_blocked_in_wait(tid: libc::pid_t) {
    let path = format!("/proc/self/task/{tid}/syscall");
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let nr = text
            .split_whitespace()
            .next()
            .and_then(|w| w.parse::<libc::c_long>().ok());
        if matches!(nr, Some(nr) if nr >= 0 && nr != libc::SYS_futex) {
            return;
        }
        assert!(
            start.elapsed() < HANG_AFTER,
            "thread {tid} never blocked in a wait ({text:?})"
        );
        thread::sleep(Duration::from_millis(1));
    }
}

/// Whether a poll(2) of `fd` reports it readable or hung up within `ms`.
fn peer_sees_eof(fd: &impl AsFd, ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd, for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n >= 0 {
            return n == 1 && pfd.revents & (libc::POLLIN | libc::POLLHUP) != 0;
        }
        let e = io::Error::last_os_error();
        assert_eq!(e.kind(), io::ErrorKind::Interrupted, "poll: {e}");
    }
}

/// Registers `fd`, arms it readable and lets one deliver (20 ms, nothing ready)
/// hand the arming to the kernel (the io_uring backend submits its poll request
/// there); then deregisters it.
fn arm_wait_deregister<B: Backend>(p: &Poller<B>, fd: &impl AsFd) {
    let t = p.register(fd).expect("register");
    p.arm(t, Interest::READABLE).expect("arm");
    let mut events = Events::with_capacity(8);
    let n = loop {
        match p.deliver(&mut events, Some(Duration::from_millis(20))) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => break r.expect("deliver"),
        }
    };
    assert_eq!(n, 0, "nothing is ready yet: {events:?}");
    p.deregister(t).expect("deregister");
}

fn peer_eof_trials<B: Backend>(p: &Arc<Poller<B>>, blocked: bool) {
    for trial in 0..TRIALS {
        let (a, b) = tcp_pair();
        if blocked {
            // The blocked thread's wait must have the socket in it: arm first.
            let t = p.register(&a).expect("register");
            p.arm(t, Interest::READABLE).expect("arm");
            #[cfg(all(feature = "stats", target_os = "linux"))]
            let blocker = Blocker::start(p);
            p.deregister(t).expect("deregister");
            drop(a);
            assert!(
                peer_sees_eof(&b, EOF_WITHIN_MS),
                "trial {trial}: the peer saw no EOF after deregister + close \
                 (another thread in deliver)"
            );
            #[cfg(all(feature = "stats", target_os = "linux"))]
            assert_eq!(blocker.finish(), Vec::<Token>::new(), "trial {trial}");
        } else {
            arm_wait_deregister(p, &a);
            drop(a);
            assert!(
                peer_sees_eof(&b, EOF_WITHIN_MS),
                "trial {trial}: the peer saw no EOF after deregister + close"
            );
        }
        set_nonblocking(&b);
        let mut buf = [0u8; 8];
        assert_eq!(
            (&b).read(&mut buf).expect("the peer's read"),
            0,
            "trial {trial}: EOF"
        );
    }
}

fn listener_trials<B: Backend>(p: &Arc<Poller<B>>, blocked: bool) {
    for trial in 0..TRIALS {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr: SocketAddr = l.local_addr().expect("local_addr");
        l.set_nonblocking(true).expect("nonblocking");
        if blocked {
            let t = p.register(&l).expect("register");
            p.arm(t, Interest::READABLE).expect("arm");
            #[cfg(all(feature = "stats", target_os = "linux"))]
            let blocker = Blocker::start(p);
            p.deregister(t).expect("deregister");
            drop(l);
            let again = TcpListener::bind(addr);
            #[cfg(all(feature = "stats", target_os = "linux"))]
            assert_eq!(blocker.finish(), Vec::<Token>::new(), "trial {trial}");
            again.unwrap_or_else(|e| {
                panic!(
                    "trial {trial}: {addr} not free after deregister + close \
                     (another thread in deliver): {e}"
                )
            });
        } else {
            arm_wait_deregister(p, &l);
            drop(l);
            TcpListener::bind(addr).unwrap_or_else(|e| {
                panic!("trial {trial}: {addr} not free after deregister + close: {e}")
            });
        }
    }
}

/// Deregister + close of an armed, submitted socket: the peer reads EOF at once.
pub fn release_peer_reads_eof_after_deregister_close<B: Backend>() {
    let p = Arc::new(poller::<B>());
    peer_eof_trials(&p, false);
}

/// As above, with another thread blocked in `deliver(None)` meanwhile.
#[cfg(all(feature = "stats", target_os = "linux"))]
pub fn release_peer_reads_eof_with_a_blocked_deliver<B: Backend>() {
    let p = Arc::new(poller::<B>());
    within("deregister + close with a blocked deliver", move || {
        peer_eof_trials(&p, true)
    });
}

/// Deregister + close of an armed, submitted listener: its port binds again.
pub fn release_listener_port_binds_again_after_deregister_close<B: Backend>() {
    let p = Arc::new(poller::<B>());
    listener_trials(&p, false);
}

/// As above, with another thread blocked in `deliver(None)` meanwhile.
#[cfg(all(feature = "stats", target_os = "linux"))]
pub fn release_listener_port_binds_again_with_a_blocked_deliver<B: Backend>() {
    let p = Arc::new(poller::<B>());
    within(
        "deregister + close of a listener with a blocked deliver",
        move || listener_trials(&p, true),
    );
}

/// What one deregistration of an armed registration costs with no other thread
/// in `deliver`, in system calls (exact, from the `stats` counters), as each
/// backend's documentation says: epoll one `epoll_ctl` (`EPOLL_CTL_DEL`); kqueue
/// one `kevent` carrying the `EV_DELETE`; event ports one `port_dissociate`; io_uring one `io_uring_enter` (the
/// remove, and the wait until the request has ended); poll(2) none. After a
/// delivery (nothing armed in the kernel): epoll and kqueue the same, io_uring
/// and poll(2) none. 20 trials.
#[cfg(feature = "stats")]
pub fn release_deregister_costs_what_the_backend_says<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (armed, delivered) = match p.backend_name() {
        "epoll" | "kqueue" | "ports" => (1, 1),
        "uring" => (1, 0),
        "blocking" => (0, 0),
        other => panic!("no documented cost for backend {other}"),
    };
    let mut events = Events::with_capacity(8);
    for trial in 0..TRIALS {
        let (a, b) = D::socketpair();
        let t = a.register(&p).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        assert_eq!(p.deliver(&mut events, Some(Duration::ZERO)).unwrap(), 0);
        let (r, d) = delta(&p, || p.deregister(t));
        r.unwrap();
        assert_eq!(d.syscalls(), armed, "trial {trial}, armed: {d:?}");

        let t = a.register(&p).unwrap();
        p.arm(t, Interest::READABLE).unwrap();
        b.write_all(b"x");
        assert!(expect_one(&p, t).is_readable());
        let (r, d) = delta(&p, || p.deregister(t));
        r.unwrap();
        assert_eq!(d.syscalls(), delivered, "trial {trial}, delivered: {d:?}");
    }
}
