//! The Windows suite, run under wine in CI (`bash .ci/wine.sh cargo test --target
//! x86_64-pc-windows-gnu --features stats --test windows`).
#![cfg(windows)]

use pollshot::{Events, Interest, Poller, Stats};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// A connected TCP loopback pair: Windows has no socketpair.
fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    a.set_nodelay(true).unwrap();
    (a, b)
}

const LONG: Option<Duration> = Some(Duration::from_secs(10));

#[test]
fn loopback_pair_carries_bytes() {
    let (mut a, mut b) = tcp_pair();
    a.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    b.set_nonblocking(false).unwrap();
    b.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
}

#[test]
fn readable_after_a_write_one_poll_one_wait() {
    let poller = Poller::new().unwrap();
    assert_eq!(poller.backend_name(), "afd");
    let (mut a, b) = tcp_pair();
    let t = poller.register(&b).unwrap();
    let s0 = poller.stats();
    poller.arm(t, Interest::READABLE).unwrap();
    a.write_all(b"x").unwrap();
    let mut events = Events::with_capacity(8);
    assert_eq!(poller.deliver(&mut events, LONG).unwrap(), 1);
    let ev = events.iter().next().unwrap();
    assert_eq!(ev.token(), t);
    assert!(ev.is_readable() && !ev.is_writable());
    let d = poller.stats().since(&s0);
    assert_eq!(
        d,
        Stats {
            adds: 1,
            ctl_calls: 2, // SIO_BASE_HANDLE + IOCTL_AFD_POLL
            waits: 1,
            ..Stats::default()
        }
    );
}
