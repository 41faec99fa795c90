//! The shared suite (`tests/common`) on the poll(2) backend, which every Unix has,
//! and the 1:1 helper `pollshot::blocking::io_once`.
#![cfg(unix)]

#[macro_use]
mod common;

suite!(pollshot::backends::Blocking);

mod io_once {
    use crate::common::{fill, pipe, socketpair, within};
    use pollshot::blocking::io_once;
    use pollshot::Interest;
    use std::io::{self, Read, Write};
    use std::time::{Duration, Instant};

    /// A ready descriptor: the operation succeeds on its first call, whatever the
    /// timeout (even zero): no waiting.
    #[test]
    fn reads_when_ready_without_waiting() {
        for timeout in [Some(Duration::ZERO), Some(Duration::from_secs(3600)), None] {
            let (mut a, b) = socketpair();
            a.write_all(b"ready").unwrap();
            let mut calls = 0;
            let mut buf = [0u8; 16];
            let n = io_once(&b, Interest::READABLE, timeout, || {
                calls += 1;
                (&b).read(&mut buf)
            })
            .unwrap();
            assert_eq!(&buf[..n], b"ready");
            assert_eq!(calls, 1, "{timeout:?}: the operation was retried");
        }
    }

    /// Not ready: the operation says WouldBlock, io_once waits, and the retry after
    /// the peer writes succeeds.
    #[test]
    fn waits_on_would_block_then_retries() {
        let (a, b) = socketpair();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            (&a).write_all(b"late").unwrap();
            a
        });
        let (n, calls, buf) = within("io_once(None) until the peer writes", move || {
            let mut calls = 0;
            let mut buf = [0u8; 16];
            let n = io_once(&b, Interest::READABLE, None, || {
                calls += 1;
                (&b).read(&mut buf)
            })
            .unwrap();
            (n, calls, buf)
        });
        assert_eq!(&buf[..n], b"late");
        assert!(
            calls >= 2,
            "the first call could not have succeeded: {calls}"
        );
        drop(writer.join().unwrap());
    }

    /// Writable interest: a full pipe blocks the write until the reader drains it.
    #[test]
    fn waits_for_writable() {
        let (r, w) = pipe();
        let mut w2 = w.try_clone().unwrap();
        assert!(fill(&mut w2) > 0);
        let reader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            crate::common::drain(&r);
            r
        });
        let n = within("io_once write until the pipe drains", move || {
            io_once(&w, Interest::WRITABLE, None, || (&w).write(b"more")).unwrap()
        });
        assert!(n > 0);
        drop(reader.join().unwrap());
    }

    /// Never ready: `TimedOut` after at least the timeout.
    #[test]
    fn times_out() {
        let (_a, b) = socketpair();
        let timeout = Duration::from_millis(20);
        let mut buf = [0u8; 4];
        let start = Instant::now();
        let r = io_once(&b, Interest::READABLE, Some(timeout), || {
            (&b).read(&mut buf)
        });
        let elapsed = start.elapsed();
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert!(elapsed >= timeout, "gave up after {elapsed:?}");
    }

    /// `Some(ZERO)` and not ready: one try, `WouldBlock`.
    #[test]
    fn zero_timeout_is_would_block() {
        let (_a, b) = socketpair();
        let mut calls = 0;
        let mut buf = [0u8; 4];
        let r = io_once(&b, Interest::READABLE, Some(Duration::ZERO), || {
            calls += 1;
            (&b).read(&mut buf)
        });
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::WouldBlock);
        assert_eq!(calls, 1);
    }

    /// The operation's own errors pass through at once; `Interrupted` is retried.
    #[test]
    fn passes_errors_and_retries_interrupted() {
        let (_a, b) = socketpair();
        let mut calls = 0;
        let r: io::Result<()> = io_once(&b, Interest::READABLE, None, || {
            calls += 1;
            match calls {
                1 => Err(io::ErrorKind::Interrupted.into()),
                _ => Err(io::ErrorKind::ConnectionReset.into()),
            }
        });
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::ConnectionReset);
        assert_eq!(calls, 2);
    }
}

/// A socket deregistered and closed while another thread is blocked in poll(2)
/// with it in its set is released at once: its peer reads EOF. (poll(2) holds
/// the file of each descriptor it watches until it returns; the deregister wakes
/// the waiter to poll the set without it.) 20 trials.
mod release {
    use crate::common::socketpair;
    use pollshot::backends::Blocking;
    use pollshot::{Events, Interest, Poller};
    use std::io::Read;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn deregister_then_close_releases_the_socket_under_a_blocked_waiter() {
        for trial in 0..20 {
            let poller = Arc::new(Poller::<Blocking>::with_backend().unwrap());
            let (mut a, b) = socketpair();
            a.set_nonblocking(false).unwrap();
            a.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let t = poller.register(&b).unwrap();
            poller.arm(t, Interest::READABLE).unwrap();
            let waiter = {
                let poller = Arc::clone(&poller);
                std::thread::spawn(move || {
                    let mut events = Events::with_capacity(4);
                    let n = poller.deliver(&mut events, None).unwrap();
                    (n, events.is_notified())
                })
            };
            while poller.waiters() == 0 {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(2)); // into poll(2), most trials
            poller.deregister(t).unwrap();
            drop(b);
            let mut buf = [0u8; 1];
            let n = a
                .read(&mut buf)
                .unwrap_or_else(|e| panic!("trial {trial}: {e}"));
            assert_eq!(n, 0, "trial {trial}: EOF");
            poller.notify().unwrap();
            assert_eq!(
                waiter.join().unwrap(),
                (0, true),
                "trial {trial}: only the notify ends it"
            );
        }
    }
}

/// What a deregistration costs on the poll(2) backend: no system call with no
/// thread in poll(2); with one blocked there, one pipe write, after which
/// `deregister` waits until that thread has returned from poll(2) (it held the
/// descriptor). 20 trials.
#[cfg(all(feature = "stats", target_os = "linux"))]
mod deregister_cost {
    use crate::common::release::until_blocked_in_wait;
    use crate::common::{poller, socketpair};
    use pollshot::backends::Blocking;
    use pollshot::{Events, Interest};
    use std::sync::Arc;

    #[test]
    fn free_without_waiters_one_write_with_a_blocked_one() {
        let p = Arc::new(poller::<Blocking>());
        for trial in 0..20 {
            let (a, _b) = socketpair();
            let t = p.register(&a).unwrap();
            p.arm(t, Interest::READABLE).unwrap();
            let before = p.stats();
            p.deregister(t).unwrap();
            let d = p.stats().since(&before);
            assert_eq!(d.syscalls(), 0, "trial {trial}: {d:?}");

            let t = p.register(&a).unwrap();
            p.arm(t, Interest::READABLE).unwrap();
            let q = p.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            let waiter = std::thread::spawn(move || {
                // SAFETY: gettid(2) has no preconditions.
                tx.send(unsafe { libc::gettid() }).unwrap();
                let mut events = Events::with_capacity(8);
                loop {
                    match q.deliver(&mut events, None) {
                        Ok(n) => return n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => panic!("deliver: {e}"),
                    }
                }
            });
            // In poll(2), with the socket in its set.
            until_blocked_in_wait(rx.recv().unwrap());
            let before = p.stats();
            p.deregister(t).unwrap();
            let d = p.stats().since(&before);
            // The waiter's own calls (its drain, its next poll) may fall in the
            // window: only the deregistering thread writes.
            assert_eq!(d.wakes, 1, "trial {trial}: {d:?}");
            p.notify().unwrap();
            assert_eq!(waiter.join().unwrap(), 0, "trial {trial}");
        }
    }
}
