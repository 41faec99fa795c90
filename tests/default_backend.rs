//! The shared suite (`tests/common`) on `pollshot::DefaultBackend`: epoll or kqueue
//! on their targets, or the poll(2) backend when built with
//! `RUSTFLAGS="--cfg pollshot_force_blocking"` (what this file is for on Linux).
#![cfg(unix)]

#[macro_use]
mod common;

suite!(pollshot::DefaultBackend);

// The constant agrees with the selection (checked at compile time).
#[cfg(pollshot_force_blocking)]
const _: () = assert!(!pollshot::MULTIPLEXES_ONESHOT);
#[cfg(all(
    not(pollshot_force_blocking),
    any(
        target_os = "linux",
        target_os = "android",
        target_os = "illumos",
        target_os = "solaris"
    )
))]
const _: () = assert!(pollshot::MULTIPLEXES_ONESHOT);

/// The forced build really selects the poll(2) backend.
#[test]
fn default_backend_matches_cfg() {
    let name = common::poller::<pollshot::DefaultBackend>().backend_name();
    if cfg!(pollshot_force_blocking) {
        assert_eq!(name, "blocking");
    } else if cfg!(any(target_os = "linux", target_os = "android")) {
        assert_eq!(name, "epoll");
    } else if cfg!(any(target_os = "illumos", target_os = "solaris")) {
        assert_eq!(name, "ports");
    }
}

/// `Poller` is `AsFd` for nesting in another event loop: on epoll and kqueue the
/// descriptor is readable exactly while an armed registration has a readiness
/// pending (poll(2) on it with a zero timeout), and `deliver` then collects it.
#[cfg(not(pollshot_force_blocking))]
#[test]
fn poller_fd_is_readable_while_an_event_is_pending() {
    use pollshot::{Events, Interest};
    use std::io::Write;
    use std::os::fd::{AsFd, AsRawFd};
    use std::time::Duration;

    fn readable(fd: std::os::fd::BorrowedFd<'_>) -> bool {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        assert!(n >= 0, "{}", std::io::Error::last_os_error());
        n == 1 && p.revents & libc::POLLIN != 0
    }

    let poller = common::poller::<pollshot::DefaultBackend>();
    let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let token = poller.register(&b).unwrap();
    poller.arm(token, Interest::READABLE).unwrap();
    assert!(!readable(poller.as_fd()), "nothing pending yet");
    a.write_all(b"x").unwrap();
    assert!(readable(poller.as_fd()), "a readiness is pending");
    assert_eq!(poller.as_fd().as_raw_fd(), poller.as_raw_fd());
    let mut events = Events::with_capacity(4);
    assert_eq!(
        poller.deliver(&mut events, Some(Duration::ZERO)).unwrap(),
        1
    );
    assert!(
        !readable(poller.as_fd()),
        "delivered: the registration is disarmed"
    );
    poller.deregister(token).unwrap();
}
