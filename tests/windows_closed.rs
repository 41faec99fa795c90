//! Windows: an arm of a registered socket that was closed. A test binary of its
//! own, with one test: in a process whose other tests open sockets, files and
//! threads, the closed handle's value would be reused between the close and the
//! arm (the registration then watches the new socket, as documented), so only a
//! process doing nothing else tests the closed handle itself. Run under wine:
//! `bash .ci/wine.sh cargo test --target x86_64-pc-windows-gnu --test windows_closed`.
#![cfg(windows)]

use pollshot::{Interest, Poller};
use std::net::{TcpListener, TcpStream};

#[test]
fn arm_of_a_closed_socket_is_wsaenotsock() {
    let p = Poller::new().unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let _a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    let t = p.register(&b).unwrap();
    drop(b);
    let e = p.arm(t, Interest::READABLE).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(10038), "WSAENOTSOCK: {e}");
    p.deregister(t).unwrap();
    assert!(p.is_empty());
}
