//! Kernel refusals the poller must survive, with no fault injector: a backend
//! that is epoll, except that it refuses the next command of one kind once, with
//! an errno. `tests/faults` makes the same refusals in the real system calls
//! (strace); these keep the two that the portable code decides in the plain
//! `cargo test`.

use crate::backend::{Backend, Driver, EventSink, RawEvent, Tag};
use crate::backends::Epoll;
use crate::event::Events;
use crate::interest::Interest;
use crate::poller::Poller;
use crate::raw::RawFd;
use crate::state::KernelError;
use crate::stats::Counters;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Command {
    Add,
    Delete,
}

/// Epoll, refusing the next `Command` with an errno once.
#[derive(Debug)]
struct Refusing {
    epoll: Epoll,
    refuse: Mutex<Option<(Command, i32)>>,
}

impl Refusing {
    fn refuses(&self, command: Command) -> Option<KernelError> {
        let mut refuse = self.refuse.lock().unwrap();
        match *refuse {
            Some((c, errno)) if c == command => {
                *refuse = None;
                Some(KernelError::Other(io::Error::from_raw_os_error(errno)))
            }
            _ => None,
        }
    }
}

impl Backend for Refusing {}

impl Driver for Refusing {
    const NAME: &'static str = "epoll, refusing";
    const TAG_IS_GENERATION: bool = true;
    const SPLIT_FILTERS: bool = false;

    fn new() -> io::Result<Refusing> {
        Ok(Refusing {
            epoll: Epoll::new()?,
            refuse: Mutex::new(None),
        })
    }
    fn add(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        match self.refuses(Command::Add) {
            Some(e) => Err(e),
            None => self.epoll.add(fd, tag, interest),
        }
    }
    fn modify(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        self.epoll.modify(fd, tag, interest)
    }
    fn quiet(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        self.epoll.quiet(fd, tag)
    }
    fn delete(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        match self.refuses(Command::Delete) {
            Some(e) => Err(e),
            None => self.epoll.delete(fd, tag),
        }
    }
    fn wait(
        &self,
        out: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        self.epoll.wait(out, max, timeout)
    }
    fn wait_each(
        &self,
        scratch: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
        each: &mut impl EventSink,
    ) -> io::Result<bool> {
        self.epoll.wait_each(scratch, max, timeout, each)
    }
    fn wake(&self) -> io::Result<()> {
        self.epoll.wake()
    }
    fn reinit_after_fork(&mut self) -> io::Result<()> {
        self.epoll.reinit_after_fork()
    }
    fn owns_fd(&self, fd: RawFd) -> bool {
        self.epoll.owns_fd(fd)
    }
    fn counters(&self) -> &Counters {
        self.epoll.counters()
    }
}

/// Whether the poller's epoll instance holds `fd` (its `tfd:` lines in
/// /proc/self/fdinfo, fs/eventpoll.c `ep_show_fdinfo`).
fn in_epoll(p: &Poller<Refusing>, fd: RawFd) -> bool {
    let epfd = p.backend.epoll.as_fd().as_raw_fd();
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{epfd}")).unwrap();
    info.lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&fd.to_string()) && l.starts_with("tfd:"))
}

/// A deregister whose `EPOLL_CTL_DEL` the kernel refuses (ENOMEM) answers that
/// errno and leaves the registration, disarmed, for the retry, which deletes
/// it. On the old code the slot was emptied all the same: the retry answered
/// `NotFound`, and the descriptor stayed in the kernel's set for good.
#[test]
fn a_refused_deregister_keeps_the_registration_for_the_retry() {
    let p = Poller::<Refusing>::with_backend().unwrap();
    let (mut a, b) = UnixStream::pair().unwrap();
    let t = p.register(&b).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    *p.backend.refuse.lock().unwrap() = Some((Command::Delete, libc::ENOMEM));
    let e = p.deregister(t).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOMEM));
    assert_eq!(p.len(), 1, "the registration is still there");
    assert!(in_epoll(&p, b.as_raw_fd()), "and still in the kernel");
    // Disarmed: the arming's event is stale.
    a.write_all(b"x").unwrap();
    let mut events = Events::with_capacity(4);
    p.deliver(&mut events, Some(Duration::from_millis(50)))
        .unwrap();
    assert!(
        events.is_empty(),
        "delivered {:?}",
        events.iter().collect::<Vec<_>>()
    );
    p.deregister(t).unwrap();
    assert_eq!(p.len(), 0);
    assert!(!in_epoll(&p, b.as_raw_fd()));
    assert_eq!(p.deregister(t).unwrap_err().kind(), io::ErrorKind::NotFound);
}

/// A forked child's `reinit_after_fork` whose re-add of an armed registration
/// the kernel refuses (ENOMEM) answers that errno; its retry adds the
/// registration again, armed, and its readiness is delivered. On the old code
/// the refused registration was left fresh: the retry re-added nothing, and the
/// child never heard of the readiness.
#[test]
fn a_refused_readd_after_fork_keeps_the_registration_armed_for_the_retry() {
    let mut p = Poller::<Refusing>::with_backend().unwrap();
    let (mut a, b) = UnixStream::pair().unwrap();
    let t = p.register(&b).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    let code = crate::fork::in_forked_child(|| {
        *p.backend.refuse.lock().unwrap() = Some((Command::Add, libc::ENOMEM));
        let refused = p.reinit_after_fork().unwrap_err().raw_os_error() == Some(libc::ENOMEM);
        let retried = p.reinit_after_fork().is_ok();
        a.write_all(b"x").unwrap();
        let mut events = Events::with_capacity(4);
        let delivered = p.deliver(&mut events, Some(Duration::from_secs(10))).ok() == Some(1)
            && events.iter().next().map(|e| e.token()) == Some(t);
        [refused, retried, delivered]
            .iter()
            .position(|ok| !ok)
            .map_or(0, |i| 10 + i as i32)
    });
    assert_eq!(
        code, 0,
        "10: the reinit was not refused, 11: its retry failed, 12: the armed \
         registration's readiness was not delivered"
    );
}
