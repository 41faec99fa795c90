//! The shared suite (`tests/common`) on the io_uring backend (cargo feature
//! `io-uring`), and what only io_uring has: cancelled, failed and overflowing
//! completions, and a refusal by the kernel.
#![cfg(all(target_os = "linux", feature = "io-uring"))]

#[macro_use]
mod common;

suite!(pollshot::backends::Uring);

mod uring_only {
    use crate::common::{assert_no_events, expect_one, pipe, poller, socketpair, LOST_AFTER};
    use pollshot::backends::Uring;
    use pollshot::{Events, Interest, Poller, Token};
    use std::collections::HashSet;
    use std::io::{self, Write};
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::time::{Duration, Instant};

    /// The kernel accepts io_uring here. `.ci/run` runs this first: a panic whose
    /// message starts with "REFUSED" means the kernel (or a seccomp filter) refuses
    /// io_uring, and the rest of this file is skipped with a printed line.
    #[test]
    fn kernel_accepts_io_uring() {
        match Poller::<Uring>::with_backend() {
            Ok(p) => assert_eq!(p.backend_name(), "uring"),
            Err(e) if e.kind() == io::ErrorKind::Unsupported => panic!("REFUSED: {e}"),
            Err(e) => panic!("io_uring poller: {e}"),
        }
    }

    /// A thread arms a pipe, submits the request with a deliver of its own and
    /// exits before the pipe is written (the kernel would complete its request with
    /// -ECANCELED): another thread's deliver still gets the readiness, exactly once.
    /// 20 trials.
    #[test]
    fn arming_outlives_the_thread_that_submitted_it() {
        for trial in 0..20 {
            let p = std::sync::Arc::new(poller::<Uring>());
            let (r, mut w) = pipe();
            let t = p.register(&r).unwrap();
            let q = p.clone();
            std::thread::spawn(move || {
                q.arm(t, Interest::READABLE).unwrap();
                let n = q
                    .deliver(&mut Events::with_capacity(4), Some(Duration::ZERO))
                    .unwrap();
                assert_eq!(n, 0, "nothing written yet");
            })
            .join()
            .unwrap();
            w.write_all(b"x").unwrap();
            // Even a deliver that never blocks gets it (the exiting thread queued
            // its request again; the kernel's -ECANCELED for it comes only when it
            // would fire, a jiffy later, from a kernel worker).
            let mut events = Events::with_capacity(4);
            assert_eq!(
                p.deliver(&mut events, Some(Duration::ZERO)).unwrap(),
                1,
                "trial {trial}"
            );
            let ev = events.iter().next().unwrap();
            assert!(ev.token() == t && ev.is_readable(), "trial {trial}: {ev:?}");
            assert_no_events(&p, 3, Duration::from_millis(2));
            // The registration still works from this thread.
            p.arm(t, Interest::READABLE).unwrap();
            assert!(expect_one(&p, t).is_readable(), "trial {trial}");
        }
    }

    /// The same while another thread is blocked in `deliver(None)` the whole time:
    /// the exiting thread's requests are queued again and the blocked thread (the
    /// one in `io_uring_enter`) is the one that gets the event. 20 trials.
    #[test]
    fn blocked_waiter_gets_readiness_armed_by_an_exited_thread() {
        for trial in 0..20 {
            let p = std::sync::Arc::new(poller::<Uring>());
            let (r, mut w) = pipe();
            let t = p.register(&r).unwrap();
            let waiter = {
                let p = p.clone();
                std::thread::spawn(move || {
                    let mut events = Events::with_capacity(4);
                    let deadline = Instant::now() + LOST_AFTER;
                    while Instant::now() < deadline {
                        p.deliver(&mut events, Some(Duration::from_millis(100)))
                            .unwrap();
                        if let Some(ev) = events.iter().next() {
                            return Some(ev.token());
                        }
                    }
                    None
                })
            };
            let q = p.clone();
            std::thread::spawn(move || {
                q.arm(t, Interest::READABLE).unwrap();
                q.deliver(&mut Events::with_capacity(4), Some(Duration::ZERO))
                    .unwrap();
            })
            .join()
            .unwrap();
            w.write_all(b"x").unwrap();
            assert_eq!(waiter.join().unwrap(), Some(t), "trial {trial}");
            assert_no_events(&p, 2, Duration::from_millis(2));
        }
    }

    /// A descriptor closed after its arm was queued and before the wait submitted
    /// it: the request completes with -EBADF, which is not reported (epoll drops a
    /// closed descriptor the same way); the next arm fails with EBADF; the
    /// registration works again once the number names a descriptor.
    #[test]
    fn closed_before_submission_is_dropped_then_ebadf() {
        const MIN_FD: i32 = 3300; // this test's own range, see `high_dup`
        let p = poller::<Uring>();
        let (_a, b) = socketpair(); // `_a` open: `b` is not readable
        let x = crate::common::high_dup(&b, MIN_FD);
        let n = x.as_raw_fd();
        let t = p.register(&x).unwrap();
        p.arm(t, Interest::READABLE).unwrap(); // checked open, queued
        drop(x);
        assert_no_events(&p, 3, Duration::from_millis(1));
        let e = p.arm(t, Interest::WRITABLE).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}");
        // Still armed in the table (the arm failed): a disarm reaches the backend,
        // EBADF, and leaves it idle.
        let e = p.disarm(t).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}");
        let (mut c, d) = socketpair();
        let again = crate::common::high_dup(&d, n);
        assert_eq!(again.as_raw_fd(), n, "the number was free");
        p.arm(t, Interest::READABLE).unwrap();
        c.write_all(b"x").unwrap();
        let ev = expect_one(&p, t);
        assert!(ev.is_readable() && !ev.is_error(), "{ev:?}");
        p.deregister(t).unwrap();
    }

    /// More completions at once than the completion queue holds (512): 1,200
    /// always-ready registrations (dups of `/dev/null`) armed before one deliver.
    /// The kernel keeps the excess (`IORING_SQ_CQ_OVERFLOW`); every one is delivered
    /// exactly once, in delivers of at most 64, and nothing after.
    #[test]
    fn completion_queue_overflow_loses_nothing() {
        const N: usize = 1200;
        raise_nofile(N as u64 + 512);
        let p = poller::<Uring>();
        let null = crate::common::dev_null();
        let fds: Vec<OwnedFd> = (0..N)
            .map(|_| rustix::io::dup(&null).expect("dup /dev/null"))
            .collect();
        let tokens: Vec<Token> = fds.iter().map(|f| p.register(f).unwrap()).collect();
        for &t in &tokens {
            p.arm(t, Interest::READABLE).unwrap();
        }
        let mut seen = HashSet::new();
        let mut events = Events::with_capacity(64);
        let deadline = Instant::now() + LOST_AFTER;
        while seen.len() < N {
            assert!(
                Instant::now() < deadline,
                "{} of {N} delivered after {LOST_AFTER:?}",
                seen.len()
            );
            let n = p
                .deliver(&mut events, Some(Duration::from_millis(10)))
                .unwrap();
            assert!(n <= 64);
            for ev in &events {
                assert!(ev.is_readable(), "{ev:?}");
                assert!(seen.insert(ev.token()), "delivered twice: {ev:?}");
            }
        }
        assert_no_events(&p, 3, Duration::from_millis(2));
        // All of them again: the registrations are intact after the overflow.
        for &t in &tokens {
            p.arm(t, Interest::WRITABLE).unwrap();
        }
        seen.clear();
        while seen.len() < N {
            assert!(Instant::now() < deadline + LOST_AFTER, "second round lost");
            p.deliver(&mut events, Some(Duration::from_millis(10)))
                .unwrap();
            for ev in &events {
                assert!(seen.insert(ev.token()), "delivered twice: {ev:?}");
            }
        }
    }

    /// Raises the soft descriptor limit to `want` (at most the hard limit).
    fn raise_nofile(want: u64) {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit(2) with a valid rlimit pointer.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
            if lim.rlim_cur < want {
                lim.rlim_cur = want.min(lim.rlim_max);
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
        }
    }

    /// Where io_uring_setup(2) is refused, `with_backend` answers `Unsupported`
    /// with the reason. A forked child installs a seccomp filter that makes
    /// io_uring_setup fail with `errno`, then creates a poller.
    fn refused_with(errno: i32, needle: &str) {
        // SAFETY: fork(2) from a multi-threaded test process; the child only makes
        // system calls, allocates through glibc's malloc (usable after fork) and
        // leaves with _exit(2).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            let code = match refuse_io_uring_setup(errno) {
                Err(_) => 2,
                Ok(()) => match Poller::<Uring>::with_backend() {
                    Ok(_) => 3,
                    Err(e) if e.kind() != io::ErrorKind::Unsupported => 4,
                    Err(e) if !e.to_string().contains(needle) => 5,
                    Err(_) => 0,
                },
            };
            // SAFETY: _exit(2) ends the child at once.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waitpid(2) on our own child with a valid status pointer.
        while unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
            assert_eq!(
                io::Error::last_os_error().kind(),
                io::ErrorKind::Interrupted
            );
        }
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        let what = match libc::WEXITSTATUS(status) {
            0 => return,
            2 => "installing the seccomp filter failed",
            3 => "the poller was created although io_uring_setup was refused",
            4 => "the error's kind is not Unsupported",
            5 => "the message does not name the refusal",
            _ => "unknown",
        };
        panic!("errno {errno}: {what}");
    }

    /// A seccomp filter: io_uring_setup(2) fails with `errno`, everything else runs.
    fn refuse_io_uring_setup(errno: i32) -> io::Result<()> {
        const NR: u32 = libc::SYS_io_uring_setup as u32;
        let filter = [
            // A = the system call number (offset 0 of struct seccomp_data).
            bpf(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
            bpf(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 1, NR),
            bpf(
                libc::BPF_RET | libc::BPF_K,
                0,
                0,
                libc::SECCOMP_RET_ERRNO | errno as u32,
            ),
            bpf(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        ];
        let prog = libc::sock_fprog {
            len: filter.len() as u16,
            filter: filter.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: prctl(2) with constant arguments, then with a pointer to a
        // filter program that outlives the call.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    fn bpf(code: u32, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
        libc::sock_filter {
            code: code as u16,
            jt,
            jf,
            k,
        }
    }

    #[test]
    fn refused_by_seccomp_eperm_is_unsupported() {
        refused_with(libc::EPERM, "EPERM");
    }

    #[test]
    fn refused_by_seccomp_enosys_is_unsupported() {
        refused_with(libc::ENOSYS, "ENOSYS");
    }
}
