//! The Windows suite, run under wine in CI (`bash .ci/wine.sh cargo test --target
//! x86_64-pc-windows-gnu --features stats --test windows`).
#![cfg(windows)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

/// A connected TCP loopback pair: Windows has no socketpair.
fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    (a, b)
}

#[test]
fn loopback_pair_carries_bytes() {
    let (mut a, mut b) = tcp_pair();
    a.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    b.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
}
