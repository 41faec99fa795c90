//! Shared test helpers and the per-backend suite.
//!
//! Each test file (`epoll.rs`, `blocking.rs`, `kqueue.rs`, `default_backend.rs`)
//! does `#[macro_use] mod common;` and `suite!(TheBackend);`, which expands to one
//! `#[test]` per body in [`bodies`] (the model on every descriptor kind, exact system
//! call counts, threads, notify, bad input), [`cases`] (one or more per scenario of
//! `docs/cases.md`, named after its id), [`contract`] (the arming contract) and
//! [`wakeups`] (deadlines, signals, counted notifies, what an event means) and
//! [`api`] (shutdown, the user key, priority events).
//!
//! Timing never decides a pass: the only clocks here are lower bounds a correct
//! poller must respect (a timeout waits at least its length) and generous deadlines
//! ([`LOST_AFTER`], [`within`]) that only turn a lost event or a hang into a failure
//! instead of a test run that never ends.

#![allow(dead_code)] // each test binary uses the helpers its cfgs compile

pub mod api;
pub mod bodies;
pub mod cases;
pub mod contract;
pub mod fds;
pub mod release;
pub mod wakeups;
// The scenarios the Windows suite runs too.
#[path = "../portable/mod.rs"]
pub mod portable;

pub use fds::{Fd, HostFd};
use pollshot::{Backend, Event, Events, Poller, Token};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Expands to one `#[test]` per generic body, each run on backend `$backend`
/// with host descriptors: [`fd_suite!`]'s bodies (on [`HostFd`]) and those only
/// host descriptors can express (TCP, FIFOs, files, ttys, fork, signals,
/// `/proc`).
///
/// Entries may carry attributes (`#[cfg(feature = "stats")] name`): they are put
/// on the generated test, and the body carries the same cfg.
#[allow(unused_macros)] // tests/rump_suite.rs expands fd_suite! alone
macro_rules! suite {
    ($backend:ty) => {
        fd_suite!($backend, crate::common::HostFd);
        suite!(@tests $backend, bodies, [
            kind_fifo,
            kind_tcp_listener,
            kind_tcp_stream,
            #[cfg(any(target_os = "linux", target_os = "android"))]
            kind_eventfd,
            kind_regular_file,
            kind_dev_null,
            descriptor_numbers_up_to_the_token_limit,
            errno_reused_by_dev_null_is_always_ready_not_an_error,
            errno_reused_by_dev_null_deregister_is_not_an_error,
            synthetic_stale_entries_take_no_room,
            synthetic_events_do_not_starve_kernel_events,
            fair_beside_always_ready_files_within_twice_ceil,
        ]);
        suite!(@tests $backend, cases, [
            case_p06_fork_child_reinit_parent_untouched,
            case_p06_fork_child_exit_leaves_the_poller_alone,
            case_p08_regular_file_dev_null_stdin_always_ready,
            case_p09_tty_and_dev_null_not_an_error,
            case_p10_half_close_tcp_read_closed_with_data,
            case_p11_reset_with_writes_queued_once_per_arming,
            case_p12_connect_in_progress_full_interest,
            case_p13_racing_disarm_rearm_on_erroring_fd,
            case_p14_exclusive_unsupported,
            case_p14_threads_share_listener_each_readiness_once,
        ]);
        suite!(@tests $backend, release, [
            release_peer_reads_eof_after_deregister_close,
            #[cfg(all(feature = "stats", target_os = "linux"))]
            release_peer_reads_eof_with_a_blocked_deliver,
            release_listener_port_binds_again_after_deregister_close,
            #[cfg(all(feature = "stats", target_os = "linux"))]
            release_listener_port_binds_again_with_a_blocked_deliver,
        ]);
        suite!(@tests $backend, wakeups, [
            #[cfg(feature = "stats")]
            wake_deregister_close_reuse_forked_child_no_spin,
            wake_signal_is_interrupted_never_an_early_ok,
            #[cfg(target_os = "linux")]
            wake_one_signal_ends_each_of_2_blocked_delivers,
            #[cfg(feature = "stats")]
            wake_2_always_ready_arms_end_2_blocked_delivers_with_room_for_1,
            #[cfg(feature = "stats")]
            wake_always_ready_arm_and_notify_with_2_blocked_delivers,
            meaning_half_close_is_read_closed_only,
            meaning_refused_connect_is_writable_write_closed_error,
            meaning_refused_connect_armed_readable_is_read_closed_error,
            meaning_reset_is_error_and_both_closed,
            meaning_own_shutdown_with_readable_interest_is_read_closed,
            meaning_listener_shut_down_while_armed_is_read_closed,
        ]);
        suite!(@tests $backend, api, [
            api_priority_tcp_urgent_data_wakes_a_priority_waiter,
            api_key_rides_on_events_and_set_key_changes_it,
        ]);
    };
    (@tests $backend:ty, $module:ident, [$($(#[$attr:meta])* $name:ident),* $(,)?]) => {
        $(
            $(#[$attr])*
            #[test]
            fn $name() {
                crate::common::apart_from_forks(crate::common::$module::$name::<$backend>)
            }
        )*
    };
}

/// Expands to one `#[test]` per body generic over the descriptors' kernel
/// ([`fds::Fd`]), each run on backend `$backend` with descriptors `$fd`:
/// [`HostFd`] in every suite ([`suite!`]), `RumpFd` in `tests/rump_suite.rs`
/// (NetBSD kernel code). Their names are the same in both.
macro_rules! fd_suite {
    ($backend:ty, $fd:ty) => {
        fd_suite!(@tests $backend, $fd, bodies, [
            kind_socketpair,
            kind_pipe_read,
            kind_pipe_write,
            #[cfg(feature = "stats")]
            stats_register_is_free_first_arm_is_one_add,
            #[cfg(feature = "stats")]
            stats_100_round_trips_cost_one_modify_each,
            #[cfg(feature = "stats")]
            stats_arm_of_armed_is_free,
            #[cfg(feature = "stats")]
            stats_disarm_is_one_quiet_and_idle_disarm_is_free,
            #[cfg(feature = "stats")]
            stats_deliver_without_notify_reads_no_waker,
            #[cfg(feature = "stats")]
            stats_deregister_is_one_delete_only_when_in_kernel,
            hangup_while_disarmed_does_not_spin,
            threads_4_deliver_64_pairs_10000_events_exactly_once,
            notify_wakes_blocked_deliver,
            notify_1000_from_4_threads_never_lost,
            notify_coalesces,
            bad_negative_fd,
            bad_register_own_descriptor,
            bad_closed_fd,
            bad_deregistered_token,
            bad_garbage_token,
            poller_is_send_sync,
            capacity_1_never_starves_a_ready_registration,
            arm_reaches_a_waiter_when_another_deliver_takes_the_wake,
            bad_token_from_another_poller,
            events_huge_capacity_is_clamped,
        ]);
        fd_suite!(@tests $backend, $fd, cases, [
            case_p01_fetched_event_never_names_new_registration,
            case_p02_orphaned_pipe_does_not_wake_new_registration,
            case_p03_dup_outlives_close_no_spin,
            case_p04_dup_outlives_close_exists_becomes_modify,
            case_p04_same_number_registered_twice_supersedes,
            case_p05_reused_number_rearm_becomes_add,
            case_p07_closed_fd_arm_disarm_deregister,
            case_p07_reused_number_arm_and_deregister,
            case_p10_half_close_unix_read_closed_with_data,
            case_p15_timeout_none_until_notify,
            case_p15_timeout_zero_never_blocks,
            case_p15_timeout_1ns,
            case_p15_timeout_999us,
            case_p15_timeout_1500us,
            case_p15_timeout_max_until_notify,
        ]);
        fd_suite!(@tests $backend, $fd, contract, [
            contract_delivery_disarms_both_directions,
            contract_arm_replaces_the_interest,
        ]);
        fd_suite!(@tests $backend, $fd, release, [
            #[cfg(feature = "stats")]
            release_deregister_costs_what_the_backend_says,
        ]);
        fd_suite!(@tests $backend, $fd, wakeups, [
            #[cfg(feature = "stats")]
            wake_stale_only_wait_keeps_waiting_until_the_deadline,
            #[cfg(feature = "stats")]
            wake_stale_only_deliver_none_returns_only_for_a_notify,
            #[cfg(feature = "stats")]
            wake_dup_outliving_close_stale_events_keep_waiting,
            #[cfg(feature = "stats")]
            wake_deregister_close_reuse_dup_held_no_spin,
            #[cfg(feature = "stats")]
            wake_one_notify_ends_exactly_one_of_4_blocked_delivers,
            #[cfg(feature = "stats")]
            wake_4_notifies_end_4_blocked_delivers,
            #[cfg(feature = "stats")]
            wake_a_notify_ends_the_blocked_deliver_not_a_zero_timeout_poll,
            #[cfg(feature = "stats")]
            wake_notify_storm_without_waiters_costs_one_write,
            wake_fair_64_ready_capacity_8_all_served_within_8_delivers,
            meaning_pipe_writer_whose_reader_closed_is_write_closed,
        ]);
        fd_suite!(@tests $backend, $fd, api, [
            api_shutdown_stops_k_workers_blocked_or_about_to_block_1000_trials,
            api_shutdown_keeps_arm_and_deregister_working,
            api_priority_interest_values,
            api_key_never_stale_across_deregister_and_reregistration_by_another_thread,
        ]);
    };
    (@tests $backend:ty, $fd:ty, $module:ident, [$($(#[$attr:meta])* $name:ident),* $(,)?]) => {
        $(
            $(#[$attr])*
            #[test]
            fn $name() {
                crate::common::apart_from_forks(crate::common::$module::$name::<$backend, $fd>)
            }
        )*
    };
}

/// Waits for child `pid` to end (retrying on EINTR) and returns its waitpid(2)
/// status.
pub fn wait_child(pid: libc::pid_t) -> libc::c_int {
    let mut status = 0;
    loop {
        // SAFETY: waitpid(2) on our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return status;
        }
        let e = io::Error::last_os_error();
        assert_eq!(e.kind(), io::ErrorKind::Interrupted, "waitpid: {e}");
    }
}

/// fork(2) copies every descriptor of the process into the child (close-on-exec
/// acts only at an exec), and the child holds its copies until it closes them or
/// exits: while it does, a description another test closes for the last time in
/// this process stays open (`__fput`, which calls `eventpoll_release`, has not
/// run). epoll then keeps its entry and reports it (P07's closed socket was
/// delivered so), its peer sees no EOF, its port stays bound. So no suite body
/// runs while a test forks: each holds this lock shared ([`apart_from_forks`], what
/// `suite!` runs), and a test that forks holds it exclusively ([`forking`]) from
/// before its fork until its child has exited or closed what it inherited.
static FORKS: std::sync::RwLock<()> = std::sync::RwLock::new(());

thread_local! {
    /// The shared hold on [`FORKS`] of the suite body running on this thread.
    static BODY_HOLD: std::cell::RefCell<Option<std::sync::RwLockReadGuard<'static, ()>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `body` holding [`FORKS`] shared: no other test forks meanwhile, unless
/// `body` itself calls [`forking`].
pub fn apart_from_forks(body: impl FnOnce()) {
    struct Release;
    impl Drop for Release {
        fn drop(&mut self) {
            BODY_HOLD.with(|h| h.borrow_mut().take());
        }
    }
    let hold = FORKS
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    BODY_HOLD.with(|h| *h.borrow_mut() = Some(hold));
    let _release = Release; // on return and on a panic
    body();
}

/// Waits until no other suite body runs and keeps new ones waiting until the
/// guard drops; the calling body's own shared hold ([`apart_from_forks`]) is
/// given up first. Take it before fork(2) and drop it once the child has exited
/// or closed every inherited descriptor but its own test's.
///
/// On libkqueue it also waits until libkqueue has freed every kqueue already
/// closed: it frees one later, on its monitoring thread, closing the kqueue's
/// numbers then, and the child of a fork frees (and closes) the pending ones
/// itself, whatever the process has reused those numbers for since (a test's
/// pipe or socket, closed in the child: seen as a child whose pipe read failed,
/// or a socket whose peer the child should have held, about 1 full run of the
/// suite in 24).
pub fn forking() -> std::sync::RwLockWriteGuard<'static, ()> {
    BODY_HOLD.with(|h| h.borrow_mut().take());
    let alone = FORKS
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    #[cfg(pollshot_libkqueue)]
    {
        extern "C" {
            /// libkqueue's (Linux): returns once its monitoring thread has
            /// freed every kqueue closed so far (`src/linux/platform.c`).
            fn libkqueue_drain_pending_close();
        }
        // SAFETY: takes no arguments; libkqueue is linked (the kqueue backend
        // calls it) and exports it.
        unsafe { libkqueue_drain_pending_close() };
    }
    alone
}

/// How long an event that should arrive at once may take before it counts as
/// lost. Generous on purpose: it only ends a test that would otherwise hang.
pub const LOST_AFTER: Duration = Duration::from_secs(20);

/// How long a blocking call may take before it counts as a hang (see [`within`]).
pub const HANG_AFTER: Duration = Duration::from_secs(60);

/// A poller on backend `B`.
pub fn poller<B: Backend>() -> Poller<B> {
    Poller::<B>::with_backend().expect("create poller")
}

/// Runs `f` on its own thread and returns its result; panics naming `what` if it
/// has not finished after [`HANG_AFTER`] (a hang, not a slow machine). A panic in
/// `f` is passed on.
pub fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let out = f();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(HANG_AFTER) {
        Ok(()) => handle
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p)),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // `f` panicked before sending.
            match handle.join() {
                Ok(_) => unreachable!("sent nothing yet returned"),
                Err(p) => std::panic::resume_unwind(p),
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: still blocked after {HANG_AFTER:?} (a hang)")
        }
    }
}

/// Delivers until exactly one event for each of `tokens` has arrived, and returns
/// them in the order of `tokens`. Panics on an event for any other token, on a
/// second event for the same token, or if one has not arrived after [`LOST_AFTER`].
pub fn expect_events<B: Backend>(p: &Poller<B>, tokens: &[Token]) -> Vec<Event> {
    let mut got: Vec<Option<Event>> = vec![None; tokens.len()];
    let mut events = Events::with_capacity(64);
    let deadline = Instant::now() + LOST_AFTER;
    while got.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "expected one event for each of {tokens:?}, got {got:?} after {LOST_AFTER:?}"
        );
        let n = p
            .deliver(&mut events, Some(Duration::from_millis(50)))
            .expect("deliver");
        assert_eq!(n, events.len(), "deliver's count and the buffer disagree");
        for ev in &events {
            let i = tokens
                .iter()
                .position(|t| *t == ev.token())
                .unwrap_or_else(|| {
                    panic!("event for an unexpected token: {ev:?}, expected {tokens:?}")
                });
            assert!(
                got[i].is_none(),
                "second event for {:?}: {ev:?} after {:?}",
                tokens[i],
                got[i]
            );
            got[i] = Some(*ev);
        }
    }
    got.into_iter().map(Option::unwrap).collect()
}

/// [`expect_events`] for one token.
pub fn expect_one<B: Backend>(p: &Poller<B>, token: Token) -> Event {
    expect_events(p, &[token])[0]
}

/// Calls `deliver` `n` times with `timeout` and returns every event delivered.
pub fn deliver_n<B: Backend>(p: &Poller<B>, n: usize, timeout: Duration) -> Vec<Event> {
    let mut events = Events::with_capacity(64);
    let mut all = Vec::new();
    for _ in 0..n {
        p.deliver(&mut events, Some(timeout)).expect("deliver");
        all.extend(events.iter().copied());
    }
    all
}

/// Calls `deliver` `n` times with `timeout`; panics if any event is delivered.
pub fn assert_no_events<B: Backend>(p: &Poller<B>, n: usize, timeout: Duration) {
    let got = deliver_n(p, n, timeout);
    assert!(got.is_empty(), "expected no events, got {got:?}");
}

/// The error kind of `r`, panicking if it is `Ok`.
#[track_caller]
pub fn err_kind<T: std::fmt::Debug>(r: io::Result<T>) -> io::ErrorKind {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.kind(),
    }
}

/// The errno of a failed call: kernel errors keep theirs (`raw_os_error`). Panics
/// on `Ok` or on an error without one (one of pollshot's own).
pub fn err_errno<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("expected a kernel error with an errno, got {e:?}")),
    }
}

// ---------------------------------------------------------------------------
// System call counters (feature `stats`)

/// Runs `f` and returns its result with the counters it moved.
#[cfg(feature = "stats")]
pub fn delta<B: Backend, R>(p: &Poller<B>, f: impl FnOnce() -> R) -> (R, pollshot::Stats) {
    let before = p.stats();
    let r = f();
    (r, p.stats().since(&before))
}

/// Registration commands in a delta: adds + modifies + quiets + deletes.
#[cfg(feature = "stats")]
pub fn commands(s: &pollshot::Stats) -> u64 {
    s.adds + s.modifies + s.quiets + s.deletes
}

/// Asserts `ctl_calls` as each backend documents it (`Stats::ctl_calls`): epoll
/// makes one `epoll_ctl` per command; the poll(2) backend changes memory only (0);
/// kqueue batches change records into `kevent` calls (at most one call per record).
#[cfg(feature = "stats")]
#[track_caller]
pub fn assert_ctl<B: Backend>(s: &pollshot::Stats) {
    match B::NAME {
        "epoll" => assert_eq!(
            s.ctl_calls,
            commands(s),
            "epoll: one epoll_ctl per command: {s:?}"
        ),
        "blocking" => assert_eq!(
            s.ctl_calls, 0,
            "poll(2) backend: commands are in memory: {s:?}"
        ),
        _ => assert!(
            s.ctl_calls <= commands(s),
            "kqueue: at most one kevent per record: {s:?}"
        ),
    }
}

// ---------------------------------------------------------------------------
// Descriptor makers. Every descriptor is non-blocking and close-on-exec.

/// Sets `O_NONBLOCK` on `fd`.
pub fn set_nonblocking(fd: impl AsFd) {
    let flags = rustix::fs::fcntl_getfl(&fd).expect("F_GETFL");
    rustix::fs::fcntl_setfl(&fd, flags | rustix::fs::OFlags::NONBLOCK).expect("F_SETFL");
}

/// Whether `B` is the kqueue backend on libkqueue (`--cfg pollshot_libkqueue`).
///
/// There a registered number closed without a deregistration while a dup (or a
/// child) keeps its description open leaves an epoll entry inside libkqueue that
/// no kevent change can remove, and the first change that reaches its knote
/// through the closed or reused number (its `EV_DELETE`, or the disable after
/// its report) frees the state that entry points at: once that description is
/// ready, each `kevent` reads freed memory (seen as a crash in
/// `linux_kevent_copyout`, or `kevent` failing with errno 0 from its "bad udata"
/// branch) and returns at once (docs/testing.md, "On libkqueue"). The cases of
/// that kind stop on libkqueue before the orphaned description can be ready,
/// after asserting what led there: libkqueue's artifact, not a BSD kernel's
/// (`tests/rump_suite.rs` runs them whole on NetBSD kernel code).
pub fn on_libkqueue<B: Backend>() -> bool {
    cfg!(pollshot_libkqueue) && B::NAME == "kqueue"
}

/// A connected Unix stream socketpair, both ends non-blocking.
pub fn socketpair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().expect("socketpair");
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    (a, b)
}

/// A pipe, `(read end, write end)`, both non-blocking.
pub fn pipe() -> (File, File) {
    let (r, w) = rustix::pipe::pipe().expect("pipe");
    for fd in [&r, &w] {
        rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC).unwrap();
        set_nonblocking(fd);
    }
    (File::from(r), File::from(w))
}

/// A FIFO made with mkfifo(3) in `dir`, opened `(read end, write end)`, both
/// non-blocking (the read end first, so the write end's open succeeds).
pub fn fifo(dir: &Path) -> (File, File) {
    let path = dir.join("fifo");
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo: {}", io::Error::last_os_error());
    let r = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .expect("open fifo for reading");
    let w = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .expect("open fifo for writing");
    (r, w)
}

/// A non-blocking TCP listener on 127.0.0.1, any port.
pub fn tcp_listener() -> TcpListener {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    l.set_nonblocking(true).unwrap();
    l
}

/// The listener's address as an IPv4 socket address.
pub fn v4_addr(l: &TcpListener) -> SocketAddrV4 {
    match l.local_addr().unwrap() {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(_) => unreachable!("bound to 127.0.0.1"),
    }
}

/// A connected TCP pair over loopback, `(client, server)`, both non-blocking.
pub fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let client = TcpStream::connect(l.local_addr().unwrap()).expect("connect");
    let (server, _) = l.accept().expect("accept");
    client.set_nonblocking(true).unwrap();
    server.set_nonblocking(true).unwrap();
    client.set_nodelay(true).unwrap();
    server.set_nodelay(true).unwrap();
    (client, server)
}

/// A non-blocking TCP socket whose connect to `addr` was started and may still be in
/// progress (EINPROGRESS), as a runtime's connect leaves it.
pub fn tcp_connect_nonblocking(addr: SocketAddrV4) -> TcpStream {
    // SAFETY: socket(2) with constant arguments; the result is checked below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    assert!(raw >= 0, "socket: {}", io::Error::last_os_error());
    // SAFETY: `raw` was just returned by socket(2) and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC).unwrap();
    set_nonblocking(&fd);
    // SAFETY: an all-zero sockaddr_in is a valid value; the fields are set below.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sin.sin_family = libc::AF_INET as libc::sa_family_t;
    sin.sin_port = addr.port().to_be();
    sin.sin_addr.s_addr = u32::from(*addr.ip()).to_be();
    #[cfg(any(
        target_os = "freebsd",
        target_os = "netbsd",
        target_os = "openbsd",
        target_os = "dragonfly",
        target_os = "macos",
        target_os = "ios"
    ))]
    {
        sin.sin_len = std::mem::size_of::<libc::sockaddr_in>() as u8;
    }
    // SAFETY: `sin` is a valid sockaddr_in and the length passed is its size.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::EINPROGRESS), "connect: {e}");
    }
    TcpStream::from(fd)
}

/// Closes `s` with `SO_LINGER` 0, so the peer gets a reset (RST) instead of a FIN.
pub fn close_with_reset(s: TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `linger` is a valid `struct linger` and the length passed is its size.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_LINGER: {}", io::Error::last_os_error());
    drop(s);
}

/// A non-blocking eventfd, initially not readable.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn eventfd() -> File {
    use rustix::event::EventfdFlags;
    File::from(
        rustix::event::eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC).expect("eventfd"),
    )
}

/// A regular file (tempfile(3)-style, already unlinked) holding a few bytes.
pub fn regular_file() -> File {
    let mut f = tempfile::tempfile().expect("tempfile");
    f.write_all(b"regular file contents\n").unwrap();
    f
}

/// `/dev/null`, open for reading and writing.
pub fn dev_null() -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/null")
        .expect("open /dev/null")
}

/// A pseudo-terminal, `(master, slave)`, both non-blocking; `None` where the
/// system has no ptys to hand out (a container without devpts).
pub fn pty() -> Option<(File, File)> {
    // SAFETY: posix_openpt(3) with constant flags; the result is checked.
    let m = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
    if m < 0 {
        return None;
    }
    // SAFETY: `m` was just returned by posix_openpt and is owned by nobody else.
    let master = unsafe { OwnedFd::from_raw_fd(m) };
    // SAFETY: grantpt(3)/unlockpt(3) on the master we own.
    if unsafe { libc::grantpt(m) } != 0 || unsafe { libc::unlockpt(m) } != 0 {
        return None;
    }
    let mut name = [0 as libc::c_char; 128];
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        // SAFETY: `name` is writable for its whole length, which is passed.
        if unsafe { libc::ptsname_r(m, name.as_mut_ptr(), name.len()) } != 0 {
            return None;
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        // SAFETY: ptsname(3) returns a static NUL-terminated string or null; it is
        // copied at once (tests that race on it would only get a wrong name, which
        // fails the open below).
        let p = unsafe { libc::ptsname(m) };
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` is a NUL-terminated string from ptsname(3).
        let s = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes();
        for (d, c) in name.iter_mut().zip(s) {
            *d = *c as libc::c_char;
        }
    }
    // SAFETY: `name` is NUL-terminated (zero-filled, and the name is shorter).
    let cpath = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    let path = Path::new(std::ffi::OsStr::from_bytes(cpath.to_bytes()));
    let slave = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    set_nonblocking(&master);
    Some((File::from(master), slave))
}

/// A duplicate of `fd` numbered at least `min` (fcntl(2) `F_DUPFD_CLOEXEC`).
///
/// Tests that close a registered number and need it to stay free (or to get it
/// back) use a number far above what the test harness's threads allocate (the
/// kernel hands out the lowest free number), each test its own range.
pub fn high_dup(fd: impl AsFd, min: RawFd) -> OwnedFd {
    rustix::io::fcntl_dupfd_cloexec(fd, min).expect("F_DUPFD_CLOEXEC")
}

/// Makes the number of `target` name the description of `src` (dup2(2)): the old
/// description is closed and the number reused in one atomic step, so no other
/// thread can take the number in between.
pub fn reuse_number(src: impl AsFd, target: &mut OwnedFd) {
    rustix::io::dup2(src, target).expect("dup2");
}

/// Writes until the descriptor would block; returns the bytes written.
pub fn fill(mut w: impl Write) -> usize {
    let buf = [0x5au8; 65536];
    let mut total = 0;
    loop {
        match w.write(&buf) {
            Ok(n) => total += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return total,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => panic!("fill: {e}"),
        }
    }
}

/// Reads until the descriptor would block or reaches EOF; returns the bytes read.
pub fn drain(mut r: impl Read) -> usize {
    let mut buf = [0u8; 65536];
    let mut total = 0;
    loop {
        match r.read(&mut buf) {
            Ok(0) => return total,
            Ok(n) => total += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return total,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => panic!("drain: {e}"),
        }
    }
}

/// Whether `r` would block on a read now (nothing buffered, no EOF).
pub fn would_block(mut r: impl Read) -> bool {
    let mut b = [0u8; 1];
    matches!(r.read(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}
