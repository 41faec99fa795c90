use pollshot::{backends, Backend, Events, Interest, Poller};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

fn run<B: Backend>() {
    let p = Poller::<B>::with_backend().unwrap();
    let (mut a, mut b) = UnixStream::pair().unwrap();
    b.set_nonblocking(true).unwrap();
    let t = p.register(&b).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let mut ev = Events::with_capacity(8);
    assert_eq!(p.deliver(&mut ev, Some(Duration::from_millis(10))).unwrap(), 0);
    a.write_all(b"x").unwrap();
    assert_eq!(p.deliver(&mut ev, Some(Duration::from_secs(5))).unwrap(), 1);
    assert!(ev.iter().next().unwrap().is_readable());
    assert_eq!(p.deliver(&mut ev, Some(Duration::from_millis(10))).unwrap(), 0);
    p.arm(t, Interest::READABLE).unwrap();
    assert_eq!(p.deliver(&mut ev, Some(Duration::from_secs(5))).unwrap(), 1);
    let mut buf = [0; 8];
    assert_eq!(b.read(&mut buf).unwrap(), 1);
    p.notify().unwrap();
    assert_eq!(p.deliver(&mut ev, None).unwrap(), 0);
    p.deregister(t).unwrap();
}

#[test]
fn smoke_epoll() { run::<backends::Epoll>() }
#[test]
fn smoke_blocking() { run::<backends::Blocking>() }
