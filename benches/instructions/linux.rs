// The benchmarks of `benches/instructions.rs` (Linux: epoll, io_uring).

use gungraun::{library_benchmark, library_benchmark_group, main};
use pollshot::backends::{Blocking, Epoll};
use pollshot::{Backend, Events, Interest, Poller, Token};
use std::hint::black_box;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Bytes per message.
const MSG: usize = 64;
/// Round trips of the short run (all pairs together).
const SHORT: u64 = 1_000;
/// Round trips of the long run.
const LONG: u64 = 3_000;
/// Events per wait.
const BATCH: usize = 64;

// ---------------------------------------------------------------------------
// The workload.

/// A readiness loop on one thread.
trait Loop {
    /// Edge-triggered: a woken endpoint is read until `WouldBlock` (one more read
    /// per wake-up, after its answer), and `arm` does nothing.
    const EDGE: bool = false;
    fn new() -> Self;
    /// Registers endpoint `ep` and arms it for reading.
    fn add(&mut self, ep: usize, fd: BorrowedFd<'_>);
    /// Re-arms endpoint `ep` for reading.
    fn arm(&mut self, ep: usize, fd: BorrowedFd<'_>);
    /// Waits (no timeout) and lists the endpoints delivered.
    fn wait(&mut self, ready: &mut Vec<usize>);
}

/// The message a client sends for `seq`: the sequence number, the pair, a pattern.
fn payload(pair: usize, seq: u64) -> [u8; MSG] {
    let mut b = [0u8; MSG];
    b[..8].copy_from_slice(&seq.to_le_bytes());
    b[8] = pair as u8;
    for (i, x) in b[9..].iter_mut().enumerate() {
        *x = (seq as u8).wrapping_add(i as u8);
    }
    b
}

/// P socketpairs, non-blocking: endpoint `2p` is pair `p`'s client, `2p + 1` its
/// echo.
fn endpoints(pairs: usize) -> Vec<UnixStream> {
    let mut eps = Vec::with_capacity(2 * pairs);
    for _ in 0..pairs {
        let (c, e) = UnixStream::pair().expect("socketpair");
        c.set_nonblocking(true).expect("O_NONBLOCK");
        e.set_nonblocking(true).expect("O_NONBLOCK");
        eps.push(c);
        eps.push(e);
    }
    eps
}

/// A run's state, made before the measured function: the loop with every
/// endpoint registered and armed. The fields drop in order: the loop (and its
/// kernel object) before the sockets, so that no descriptor is closed while it is
/// registered (polling's contract).
struct Setup<L> {
    lp: L,
    eps: Vec<UnixStream>,
    rounds: u64,
}

fn setup<L: Loop>(pairs: usize, rounds: u64) -> Setup<L> {
    let eps = endpoints(pairs);
    let mut lp = L::new();
    for (i, s) in eps.iter().enumerate() {
        lp.add(i, s.as_fd());
    }
    Setup { lp, eps, rounds }
}

/// `rounds` round trips in all, spread over the pairs; returns the round trips
/// made.
fn pingpong<L: Loop>(mut s: Setup<L>) -> u64 {
    let pairs = s.eps.len() / 2;
    let quota = s.rounds / pairs as u64;
    let mut seq = vec![0u64; pairs];
    let mut active = pairs;
    let mut ready = Vec::with_capacity(BATCH);
    let mut buf = [0u8; MSG];
    let mut done = 0;
    for p in 0..pairs {
        let n = (&s.eps[2 * p]).write(&payload(p, 0)).expect("first write");
        assert_eq!(n, MSG, "short first write");
    }
    while active > 0 {
        ready.clear();
        s.lp.wait(&mut ready);
        for &i in &ready {
            let sock = &s.eps[i];
            let n = (&*sock).read(&mut buf).expect("read");
            assert_eq!(n, MSG, "endpoint {i}: short read");
            let p = i / 2;
            if i % 2 == 1 {
                let n = (&*sock).write(&buf).expect("echo write");
                assert_eq!(n, MSG, "short echo write");
            } else {
                assert!(buf == payload(p, seq[p]), "pair {p}: the echo differs");
                seq[p] += 1;
                done += 1;
                if seq[p] == quota {
                    active -= 1;
                    continue;
                }
                let n = (&*sock).write(&payload(p, seq[p])).expect("write");
                assert_eq!(n, MSG, "short write");
            }
            if L::EDGE {
                // The peer cannot have answered yet (one thread): this read says
                // `WouldBlock`, and the next edge wakes the endpoint again.
                let e = (&*sock).read(&mut buf).expect_err("the drain read found data");
                assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "drain read");
            }
            s.lp.arm(i, sock.as_fd());
        }
    }
    done
}

// ---------------------------------------------------------------------------
// The loops.

/// pollshot on backend `B`: each registration's key is its endpoint (as the hand
/// loops carry the endpoint in the kernel's tag).
struct Pollshot<B: Backend> {
    poller: Poller<B>,
    events: Events,
    tokens: Vec<Token>,
}

impl<B: Backend> Loop for Pollshot<B> {
    fn new() -> Self {
        Pollshot {
            poller: Poller::<B>::with_backend().expect("poller"),
            events: Events::with_capacity(BATCH),
            tokens: Vec::new(),
        }
    }
    fn add(&mut self, ep: usize, fd: BorrowedFd<'_>) {
        let t = self.poller.register_with(&fd, ep).expect("register");
        self.poller.arm(t, Interest::READABLE).expect("first arm");
        self.tokens.push(t);
    }
    #[inline]
    fn arm(&mut self, ep: usize, _fd: BorrowedFd<'_>) {
        self.poller
            .arm(self.tokens[ep], Interest::READABLE)
            .expect("arm");
    }
    #[inline]
    fn wait(&mut self, ready: &mut Vec<usize>) {
        self.poller.deliver(&mut self.events, None).expect("deliver");
        ready.extend(self.events.iter().map(|e| e.key()));
    }
}

/// The epoll floor: `EPOLLONESHOT`, one `EPOLL_CTL_MOD` per wait, on rustix (the
/// flags pollshot uses: `EPOLLIN | EPOLLRDHUP`).
struct HandEpoll {
    epoll: rustix::fd::OwnedFd,
}

const HAND_ARM: rustix::event::epoll::EventFlags = rustix::event::epoll::EventFlags::IN
    .union(rustix::event::epoll::EventFlags::RDHUP)
    .union(rustix::event::epoll::EventFlags::ONESHOT);

impl Loop for HandEpoll {
    fn new() -> Self {
        use rustix::event::epoll;
        HandEpoll {
            epoll: epoll::create(epoll::CreateFlags::CLOEXEC).expect("epoll_create1"),
        }
    }
    fn add(&mut self, ep: usize, fd: BorrowedFd<'_>) {
        use rustix::event::epoll;
        epoll::add(&self.epoll, fd, epoll::EventData::new_u64(ep as u64), HAND_ARM)
            .expect("EPOLL_CTL_ADD");
    }
    #[inline]
    fn arm(&mut self, ep: usize, fd: BorrowedFd<'_>) {
        use rustix::event::epoll;
        epoll::modify(&self.epoll, fd, epoll::EventData::new_u64(ep as u64), HAND_ARM)
            .expect("EPOLL_CTL_MOD");
    }
    #[inline]
    fn wait(&mut self, ready: &mut Vec<usize>) {
        use rustix::event::epoll;
        let mut buf = [std::mem::MaybeUninit::<epoll::Event>::uninit(); BATCH];
        let (evs, _) = epoll::wait(&self.epoll, &mut buf[..], None).expect("epoll_wait");
        ready.extend(evs.iter().map(|ev| ev.data.u64() as usize));
    }
}

/// `polling` 3.x in oneshot mode, re-armed with `modify`.
struct Polling {
    poller: polling::Poller,
    events: polling::Events,
}

impl Loop for Polling {
    fn new() -> Self {
        Polling {
            poller: polling::Poller::new().expect("polling::Poller::new"),
            events: polling::Events::with_capacity(std::num::NonZeroUsize::new(BATCH).unwrap()),
        }
    }
    fn add(&mut self, ep: usize, fd: BorrowedFd<'_>) {
        use std::os::fd::AsRawFd;
        // SAFETY: polling requires the source to stay open while it is in the
        // poller: `Setup` drops the poller before the sockets.
        unsafe {
            self.poller.add_with_mode(
                fd.as_raw_fd(),
                polling::Event::readable(ep),
                polling::PollMode::Oneshot,
            )
        }
        .expect("polling add");
    }
    #[inline]
    fn arm(&mut self, ep: usize, fd: BorrowedFd<'_>) {
        self.poller
            .modify_with_mode(fd, polling::Event::readable(ep), polling::PollMode::Oneshot)
            .expect("polling modify");
    }
    #[inline]
    fn wait(&mut self, ready: &mut Vec<usize>) {
        self.events.clear();
        self.poller.wait(&mut self.events, None).expect("polling wait");
        ready.extend(self.events.iter().map(|e| e.key));
    }
}

/// `mio` 1.x: edge-triggered, each endpoint registered once for reading and
/// drained to `WouldBlock` on every wake-up (`EDGE`).
struct Mio {
    poll: mio::Poll,
    events: mio::Events,
}

impl Loop for Mio {
    const EDGE: bool = true;
    fn new() -> Self {
        Mio {
            poll: mio::Poll::new().expect("mio::Poll::new"),
            events: mio::Events::with_capacity(BATCH),
        }
    }
    fn add(&mut self, ep: usize, fd: BorrowedFd<'_>) {
        use std::os::fd::AsRawFd;
        self.poll
            .registry()
            .register(
                &mut mio::unix::SourceFd(&fd.as_raw_fd()),
                mio::Token(ep),
                mio::Interest::READABLE,
            )
            .expect("mio register");
    }
    #[inline]
    fn arm(&mut self, _ep: usize, _fd: BorrowedFd<'_>) {}
    #[inline]
    fn wait(&mut self, ready: &mut Vec<usize>) {
        self.poll.poll(&mut self.events, None).expect("mio poll");
        ready.extend(self.events.iter().map(|e| e.token().0));
    }
}

/// The io_uring floor: one oneshot `IORING_OP_POLL_ADD` per wait (`POLLIN |
/// POLLRDHUP`, as pollshot), queued by `arm` and submitted by the next wait's
/// enter; completions already posted are reaped without entering.
#[cfg(feature = "io-uring")]
struct HandUring {
    ring: io_uring::IoUring,
}

#[cfg(feature = "io-uring")]
impl HandUring {
    fn push(&mut self, ep: usize, fd: BorrowedFd<'_>) {
        use io_uring::{opcode, types};
        use std::os::fd::AsRawFd;
        let e = opcode::PollAdd::new(
            types::Fd(fd.as_raw_fd()),
            (libc::POLLIN | libc::POLLRDHUP) as u32,
        )
        .build()
        .user_data(ep as u64);
        // SAFETY: the entry names a descriptor that outlives the ring's use of it
        // (the sockets are dropped after the ring), and holds no buffer.
        unsafe { self.ring.submission().push(&e) }.expect("submission queue full");
    }
}

#[cfg(feature = "io-uring")]
impl Loop for HandUring {
    fn new() -> Self {
        HandUring {
            ring: io_uring::IoUring::new(256).expect("io_uring_setup"),
        }
    }
    fn add(&mut self, ep: usize, fd: BorrowedFd<'_>) {
        self.push(ep, fd);
    }
    #[inline]
    fn arm(&mut self, ep: usize, fd: BorrowedFd<'_>) {
        self.push(ep, fd);
    }
    #[inline]
    fn wait(&mut self, ready: &mut Vec<usize>) {
        if self.ring.completion().is_empty() {
            self.ring.submit_and_wait(1).expect("io_uring_enter");
        }
        ready.extend(self.ring.completion().map(|c| c.user_data() as usize));
    }
}

// ---------------------------------------------------------------------------
// Round-trip benchmarks: `<loop>_p<P>` at SHORT and LONG round trips.

macro_rules! round_trips {
    ($($(#[$m:meta])* $name:ident: $loop:ty;)*) => {$(
        $(#[$m])*
        #[library_benchmark]
        #[bench::p1_short(args = (1, SHORT), setup = setup::<$loop>)]
        #[bench::p1_long(args = (1, LONG), setup = setup::<$loop>)]
        #[bench::p8_short(args = (8, SHORT), setup = setup::<$loop>)]
        #[bench::p8_long(args = (8, LONG), setup = setup::<$loop>)]
        fn $name(s: Setup<$loop>) -> u64 {
            black_box(pingpong(s))
        }
    )*};
}

round_trips! {
    hand_epoll: HandEpoll;
    pollshot_epoll: Pollshot<Epoll>;
    pollshot_poll: Pollshot<Blocking>;
    polling_oneshot: Polling;
    mio_edge: Mio;
    #[cfg(feature = "io-uring")]
    hand_uring: HandUring;
    #[cfg(feature = "io-uring")]
    pollshot_uring: Pollshot<pollshot::backends::Uring>;
}

// ---------------------------------------------------------------------------
// One operation each, on `Poller<Epoll>`.

/// A poller with one registered socket (`b`) and its peer (`a`). The poller is
/// boxed: gungraun moves the setup's value into the measured function and out
/// again, and a move of the poller itself (over a kilobyte) would be counted as
/// the operation's.
struct One {
    poller: Box<Poller<Epoll>>,
    token: Token,
    events: Events,
    a: UnixStream,
    b: UnixStream,
}

fn one() -> One {
    let (a, b) = UnixStream::pair().expect("socketpair");
    b.set_nonblocking(true).expect("O_NONBLOCK");
    let poller = Box::new(Poller::<Epoll>::with_backend().expect("poller"));
    let token = poller.register(&b).expect("register");
    One {
        poller,
        token,
        events: Events::with_capacity(BATCH),
        a,
        b,
    }
}

/// Armed, and its event delivered: the next arm is a re-arm (`EPOLL_CTL_MOD`).
fn delivered_once() -> One {
    let mut o = one();
    o.poller.arm(o.token, Interest::READABLE).expect("arm");
    (&o.a).write_all(&[1]).expect("write");
    let n = o.poller.deliver(&mut o.events, None).expect("deliver");
    assert_eq!(n, 1);
    (&o.b).read_exact(&mut [0]).expect("read");
    o
}

/// Armed (the first arm, an `EPOLL_CTL_ADD`), nothing ready.
fn armed() -> One {
    let o = one();
    o.poller.arm(o.token, Interest::READABLE).expect("arm");
    o
}

/// Armed, and one byte ready.
fn ready() -> One {
    let o = armed();
    (&o.a).write_all(&[1]).expect("write");
    o
}

/// Nothing registered armed; a notify to come.
fn idle() -> One {
    one()
}

/// Checks an operation's outcome outside the measured function.
fn check_delivered(o: One) {
    assert_eq!(o.events.len(), 1, "one event delivered");
    assert_eq!(o.events.iter().next().map(|e| e.token()), Some(o.token));
}

fn check_notified(o: One) {
    assert!(o.events.is_notified() && o.events.is_empty(), "notified, no event");
}

fn drop_one(o: One) {
    drop(o);
}

#[library_benchmark]
#[bench::rearm(setup = delivered_once, teardown = drop_one)]
fn arm(o: One) -> One {
    o.poller
        .arm(black_box(o.token), Interest::READABLE)
        .expect("arm");
    o
}

#[library_benchmark]
#[bench::armed(setup = armed, teardown = drop_one)]
fn disarm(o: One) -> One {
    o.poller.disarm(black_box(o.token)).expect("disarm");
    o
}

#[library_benchmark]
#[bench::no_timeout(args = (None), setup = with_ready, teardown = check_delivered)]
#[bench::timeout(args = (Some(Duration::from_secs(5))), setup = with_ready, teardown = check_delivered)]
fn deliver(s: (One, Option<Duration>)) -> One {
    let (mut o, timeout) = s;
    let n = o
        .poller
        .deliver(&mut o.events, black_box(timeout))
        .expect("deliver");
    assert_eq!(n, 1);
    o
}

fn with_ready(timeout: Option<Duration>) -> (One, Option<Duration>) {
    (ready(), timeout)
}

#[library_benchmark]
#[bench::no_timeout(setup = idle, teardown = check_notified)]
fn notify_deliver(mut o: One) -> One {
    o.poller.notify().expect("notify");
    let n = o.poller.deliver(&mut o.events, None).expect("deliver");
    assert_eq!(n, 0);
    o
}

library_benchmark_group!(
    name = round_trips,
    benchmarks = [hand_epoll, pollshot_epoll, pollshot_poll, polling_oneshot, mio_edge]
);

#[cfg(feature = "io-uring")]
library_benchmark_group!(name = round_trips_uring, benchmarks = [hand_uring, pollshot_uring]);

library_benchmark_group!(
    name = operations,
    benchmarks = [arm, disarm, deliver, notify_deliver]
);

#[cfg(feature = "io-uring")]
main!(library_benchmark_groups = round_trips, round_trips_uring, operations);

#[cfg(not(feature = "io-uring"))]
main!(library_benchmark_groups = round_trips, operations);
