//! pollshot: a readiness poller that keeps every descriptor registered in the kernel
//! for its whole life and pays one cheap *arm* per wait.
//!
//! The classic scheme adds a descriptor to epoll before each wait and deletes it
//! after the wake: two `epoll_ctl` per wait cycle. pollshot registers once and arms
//! with a oneshot flag: the kernel disarms the registration when it delivers the
//! event, so the delete disappears and the next wait re-arms with one
//! `EPOLL_CTL_MOD`. A disarm quiets a registration instead of deleting it.
//!
//! | backend | targets | arm | delivery disarms by | waker |
//! |---|---|---|---|---|
//! | `backends::Epoll` | Linux, Android | `EPOLL_CTL_MOD` + `EPOLLONESHOT` | the kernel | eventfd |
//! | `backends::Kqueue` | FreeBSD, NetBSD, OpenBSD, DragonFly, macOS, iOS | `EV_ADD \| EV_ENABLE \| EV_DISPATCH`, batched into the next `kevent` | the kernel | `EVFILT_USER` or a pipe |
//! | `backends::Blocking` | every other Unix (or forced) | an in-memory set | the poller | a pipe |
//! | `backends::Ports` | illumos, Solaris | `port_associate` (`PORT_SOURCE_FD`) | the kernel | `port_send` |
//! | `backends::Afd` | Windows | one `IOCTL_AFD_POLL` on the socket's base handle, completing on an I/O completion port | the kernel (a poll completes once) | `PostQueuedCompletionStatus` |
//! | `backends::Uring` | Linux, feature `io-uring` | a oneshot `IORING_OP_POLL_ADD`, submitted by the next `io_uring_enter` | the kernel | a flag, an eventfd while a waiter is in the kernel |
//!
//! Each one compiled for the target is in [`backends`] (epoll only on Linux and
//! Android, kqueue only on its targets, event ports only on illumos and Solaris, so
//! those are named here without links; docs.rs documents the crate for Linux,
//! FreeBSD, macOS and Windows: pick the platform in its menu). All of them run one pure state
//! machine (public, with the feature `model`, as `pollshot::state`), so they behave
//! the same. See [`Poller`] for the API and an example, [`Event`] for what an event
//! means on every backend, and, in the repository, `docs/guarantees.md` for the
//! guarantees and limits and `docs/platforms.md` for what each OS gets.
//!
//! # Writing a runtime
//!
//! [`guide`] walks through what a runtime builds around [`Poller::deliver`]:
//! several threads on one poller, timers and deadlines, cutting a blocked
//! `deliver` short, write backpressure, closing, shutdown and fork, with a
//! multi-threaded echo server to copy.
//!
//! # The 1:1 path
//!
//! Where the target has no oneshot multiplexer ([`MULTIPLEXES_ONESHOT`] is false), a
//! runtime may prefer a thread per blocking operation over a shared poll(2) set:
//! `blocking::io_once` (Unix) tries the operation, waits with poll(2) only on
//! `WouldBlock`, and retries.
//!
//! # Errors
//!
//! Each method's `# Errors` section says what it returns and when; the rules
//! behind them are these.
//!
//! When the kernel refuses a command, the caller gets the kernel's error as it came:
//! `io::Error::from_raw_os_error(errno)`, so `raw_os_error()` is `Some(errno)` and
//! `kind()` is what std derives from it (the convention of std, mio and polling):
//!
//! | errno | from | when | `kind()` |
//! |---|---|---|---|
//! | EBADF | `arm`, `disarm` (epoll_ctl(2), kevent(2); the poll(2) backend's first-arm check) | the descriptor is closed; for `arm` after the ENOENT→ADD fallback too (the number is free) | `Uncategorized` |
//! | ENOMEM, ENOSPC | `arm`, `disarm`, `deregister` | kernel memory, or `max_user_watches` (epoll) | `OutOfMemory`, `StorageFull` |
//! | EMFILE, ENFILE, ENOMEM | `Poller::new`, `reinit_after_fork` | creating the instance or its waker | `Uncategorized`, `OutOfMemory` |
//! | EINTR | `deliver` | a signal arrived before any event | `Interrupted` |
//! | ENOMEM | `deliver` (poll(2) backend) | poll(2) could not allocate its table | `OutOfMemory` |
//! | EAGAIN, EBUSY, EINTR | `deliver`, `arm`, `deregister` (io_uring) | io_uring_enter(2): out of resources for the requests, completions in the overflow list, a signal | `WouldBlock`, `ResourceBusy`, `Interrupted` |
//! | any other | any call | passed on unchanged | std's |
//!
//! A refusal leaves nothing half done: the registration is as it was, and the
//! same call made again is the retry (`tests/faults` fails every system call of
//! every backend in turn to show it). One exception is on purpose: a refused
//! `deregister` leaves the registration registered and disarmed (nothing is
//! delivered for it), still owing its delete, so that the retry finishes it.
//!
//! Such an error does not name the call or the token, as pollshot's own errors
//! do: std's `io::Error` holds either an OS error code or a payload of its own,
//! never both, and a message would cost the errno (`raw_os_error()` would be
//! `None`), which callers match on. Which kernel call's error each method returns:
//!
//! | method | epoll | kqueue | poll(2) | io_uring | event ports | Windows (AFD) |
//! |---|---|---|---|---|---|---|
//! | `new`, `with_backend`, `reinit_after_fork` | epoll_create1(2), eventfd(2) | kqueue(2), pipe(2) (NetBSD, OpenBSD) | pipe(2) | io_uring_setup(2), eventfd(2) | port_create(3C) | CreateIoCompletionPort, NtCreateFile (`\Device\Afd`) |
//! | `arm`, `disarm` | epoll_ctl(2) | kevent(2) of a change submitted at once (a batched change refused later becomes an error event) | fcntl(2) `F_GETFD` at the first arm; write(2) to the pipe while a `deliver` is blocked | fcntl(2) `F_GETFD` at the first arm (a request refused at submission becomes an error event) | port_associate(3C), port_dissociate(3C) | NtDeviceIoControlFile (`IOCTL_AFD_POLL`), NtCancelIoFileEx; Winsock's `SIO_BASE_HANDLE` at the first arm |
//! | `deregister` | epoll_ctl(2) `EPOLL_CTL_DEL` | kevent(2) `EV_DELETE` | write(2) to the pipe while a `deliver` is blocked | io_uring_enter(2) | port_dissociate(3C) | NtCancelIoFileEx |
//! | `notify`, `shutdown` | write(2) to the eventfd | kevent(2) `EVFILT_USER`, or write(2) to the pipe | write(2) to the pipe | write(2) to the eventfd | port_send(3C) | PostQueuedCompletionStatus |
//! | `deliver` | epoll_wait(2), epoll_pwait2(2) | kevent(2) | poll(2), ppoll(2) | io_uring_enter(2) | port_getn(3C) | GetQueuedCompletionStatusEx |
//!
//! On Windows an NTSTATUS is passed on as its Win32 code
//! (`RtlNtStatusToDosError`), so `raw_os_error()` is a Win32 or Winsock error
//! code there.
//!
//! Not errors: ENOENT on a MOD (the number was closed and reused: it becomes an
//! ADD), EEXIST on an ADD (a dup is still registered: it becomes a MOD), EPERM from
//! epoll and EINVAL from kqueue on a descriptor they cannot poll (regular files,
//! `/dev/null`: reported always ready), and ENOENT or EBADF on a delete (the kernel
//! already dropped the descriptor). If a fallback fails too, its own errno is the
//! one returned.
//!
//! pollshot's own errors carry a message:
//!
//! | kind | when |
//! |---|---|
//! | `NotFound` | a token names no live registration |
//! | `InvalidInput` | a negative descriptor number; the poller's own descriptor |
//! | `Other` | a poller made before a fork, used in the child before `reinit_after_fork` |
//! | `OutOfMemory` | past the table's slot limit |
//! | `Unsupported` | an arm with `Interest::PRIORITY` on kqueue or Windows, or without `READABLE` on io_uring; `register_exclusive`, always |
//!
//! # Cargo features and cfgs
//!
//! - `stats`: system call counters, `Poller::stats` (a [`Stats`] snapshot).
//! - `io-uring` (Linux): the io_uring backend, `backends::Uring`, on the `io-uring`
//!   crate. Never the default backend.
//! - `model`: the pure state machine (`state`) and a reference model of the kernels
//!   (`model`) as public modules, for fuzzing a runtime's use of pollshot (the
//!   crate's own fuzz targets turn it on). Off by default.
//! - `--cfg pollshot_force_blocking`: make `backends::Blocking` the default
//!   backend on any target (for testing it on Linux).
//! - `--cfg pollshot_libkqueue`: compile the kqueue backend on Linux against an
//!   installed libkqueue (for testing it without a BSD kernel).
//! - `--cfg pollshot_rump`: compile the kqueue backend on Linux against a NetBSD
//!   rump kernel (NetBSD's kernel code in the process: descriptors are the rump
//!   kernel's, made by `pollshot::rump` and registered with `register_raw`), for
//!   the crate's own tests, benches and main job.

#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(clippy::undocumented_unsafe_blocks)]
#![cfg(any(unix, windows))]

mod backend;
#[cfg(unix)]
pub mod blocking;
mod deadline;
mod error;
mod event;
mod fork;
pub mod guide;
mod interest;
// The kernel model is compiled only where it is used: with the feature, and in the
// crate's own unit tests (the kqueue translator is checked against it).
#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(feature = "model")]
#[cfg_attr(docsrs, doc(cfg(feature = "model")))]
pub mod model;
#[cfg(all(test, not(feature = "model")))]
#[allow(dead_code)]
mod model;
#[cfg(unix)]
mod pipe;
mod poller;
mod raw;
mod readiness;
#[cfg(feature = "model")]
#[cfg_attr(docsrs, doc(cfg(feature = "model")))]
pub mod state;
#[cfg(not(feature = "model"))]
mod state;
mod stats;
mod sync;
mod table;
mod token;
mod wake;

pub use backend::Backend;
pub use event::{Event, Events};
pub use interest::Interest;
pub use poller::Poller;
pub use stats::Stats;
pub use token::Token;

// One file or folder per kernel interface, under backends/ at the crate root.
#[cfg(unix)]
#[path = "../backends/blocking.rs"]
mod blocking_backend;
#[cfg(any(target_os = "linux", target_os = "android"))]
#[path = "../backends/epoll.rs"]
mod epoll_backend;
// Compiled on every target: its translation to kevent records is pure and unit
// tested everywhere; only its system-call part is gated on the kqueue targets.
#[cfg(windows)]
#[path = "../backends/windows/mod.rs"]
mod afd_backend;
#[path = "../backends/kqueue/mod.rs"]
mod kqueue_backend;
// AFD's bits and their translation: pure, shared with the kernel model.
#[cfg_attr(not(windows), allow(dead_code))]
#[path = "../backends/windows/bits.rs"]
mod afd_bits;
#[cfg(all(feature = "io-uring", target_os = "linux"))]
#[path = "../backends/uring/mod.rs"]
mod uring_backend;
// The io_uring backend's hand-over protocol: generic over the ring, so that the
// loom models run it too.
#[cfg(any(all(feature = "io-uring", target_os = "linux"), all(test, loom)))]
#[path = "../backends/uring/handover.rs"]
mod uring_handover;
// Compiled on every target: its translation (poll bits, the user word) is pure,
// unit tested everywhere and used by the kernel model; the backend itself only on
// illumos and Solaris.
#[path = "../backends/ports/mod.rs"]
mod ports_backend;

/// The kernel interfaces. Each one compiled for the target is nameable here, so one
/// process can compare them (`Poller::<backends::Blocking>::with_backend()`).
/// `Epoll` is there on Linux and Android, `Kqueue` on the BSDs and Apple targets,
/// `Ports` (event ports) on illumos and Solaris, `Uring` on Linux with the cargo
/// feature `io-uring`, `Blocking` (poll(2)) on every Unix, and `Afd` on Windows.
pub mod backends {
    #[cfg(windows)]
    pub use crate::afd_backend::Afd;
    #[cfg(unix)]
    pub use crate::blocking_backend::Blocking;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub use crate::epoll_backend::Epoll;
    #[cfg(pollshot_kqueue)]
    pub use crate::kqueue_backend::Kqueue;
    #[cfg(any(target_os = "illumos", target_os = "solaris"))]
    pub use crate::ports_backend::Ports;
    #[cfg(all(feature = "io-uring", target_os = "linux"))]
    #[cfg_attr(docsrs, doc(cfg(all(feature = "io-uring", target_os = "linux"))))]
    pub use crate::uring_backend::Uring;
}

/// Descriptors of a NetBSD rump kernel (`--cfg pollshot_rump` on Linux only):
/// what the kqueue backend registers there. See the module's own page.
#[cfg(pollshot_rump)]
pub use crate::kqueue_backend::rump;

// The one place the default backend is chosen.
cfg_if::cfg_if! {
    if #[cfg(pollshot_force_blocking)] {
        /// The default backend for this build: forced to poll(2) by
        /// `--cfg pollshot_force_blocking`.
        pub type DefaultBackend = backends::Blocking;
        /// Whether the default backend multiplexes with a kernel oneshot mechanism.
        pub const MULTIPLEXES_ONESHOT: bool = false;
    } else if #[cfg(windows)] {
        /// The default backend for this target: AFD poll and a completion port.
        pub type DefaultBackend = backends::Afd;
        /// Whether the default backend multiplexes with a kernel oneshot mechanism
        /// (one `IOCTL_AFD_POLL` completes once here).
        pub const MULTIPLEXES_ONESHOT: bool = true;
    } else if #[cfg(any(target_os = "linux", target_os = "android"))] {
        /// The default backend for this target: epoll with `EPOLLONESHOT`.
        pub type DefaultBackend = backends::Epoll;
        /// Whether the default backend multiplexes with a kernel oneshot mechanism
        /// (`EPOLLONESHOT` here). When false, consider the 1:1 path, [`blocking`].
        pub const MULTIPLEXES_ONESHOT: bool = true;
    } else if #[cfg(all(pollshot_kqueue, not(target_os = "linux")))] {
        /// The default backend for this target: kqueue with `EV_DISPATCH`.
        pub type DefaultBackend = backends::Kqueue;
        /// Whether the default backend multiplexes with a kernel oneshot mechanism
        /// (`EV_DISPATCH` here). When false, consider the 1:1 path, [`blocking`].
        pub const MULTIPLEXES_ONESHOT: bool = true;
    } else if #[cfg(any(target_os = "illumos", target_os = "solaris"))] {
        /// The default backend for this target: event ports, `port_associate(3C)`.
        pub type DefaultBackend = backends::Ports;
        /// Whether the default backend multiplexes with a kernel oneshot mechanism
        /// (event ports: a retrieved event dissociates the descriptor). When false,
        /// consider the 1:1 path, [`blocking`].
        pub const MULTIPLEXES_ONESHOT: bool = true;
    } else {
        /// The default backend for this target: neither epoll nor kqueue exists, so
        /// poll(2) with the oneshot contract kept in user space.
        pub type DefaultBackend = backends::Blocking;
        /// Whether the default backend multiplexes with a kernel oneshot mechanism:
        /// not on this target. Consider the 1:1 path, [`blocking`].
        pub const MULTIPLEXES_ONESHOT: bool = false;
    }
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
