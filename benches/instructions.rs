//! instructions: user-space instructions per round trip and per operation, counted
//! by Callgrind through `gungraun`, so that a loaded machine cannot blur them (two
//! runs agree to the instruction).
//!
//! Round trips: one thread, P socketpairs (P = 1 and 8), 64-byte messages, one
//! read per wake-up, every echo checked (the same workload as `benches/pingpong.rs`
//! on one thread), on
//!
//! | name | what |
//! |---|---|
//! | `pollshot_epoll` | `Poller<Epoll>` |
//! | `pollshot_poll` | `Poller<Blocking>` (poll(2)) |
//! | `pollshot_uring` | `Poller<Uring>` (`--features io-uring`) |
//! | `polling_oneshot` | `polling` 3.x, oneshot mode, re-armed with `modify` |
//! | `mio_edge` | `mio` 1.x, edge-triggered, registered once; each wake-up's read is followed by the read that says `WouldBlock` |
//! | `hand_epoll` | a hand-written `EPOLLONESHOT` loop, one `EPOLL_CTL_MOD` per wait |
//! | `hand_uring` | a hand-written io_uring loop, one oneshot `POLL_ADD` per wait (`--features io-uring`) |
//!
//! Each is run for [`SHORT`] and [`LONG`] round trips: the difference, divided by
//! `LONG - SHORT`, is the cost of one round trip with every setup cost (the
//! poller, the sockets, registration, the first arms, the teardown) cancelled.
//! pollshot is built as users build it, without `stats` (the dev-dependency on
//! itself turns on `model` alone; with the counters a round trip on epoll takes
//! 90 more instructions at P=1, 64 at P=8). Each pollshot registration's key is
//! its endpoint, as the hand loops carry the endpoint in the kernel's tag.
//!
//! Operations (`Poller<Epoll>`, boxed, so that gungraun's move of the setup's
//! value in and out of the measured function is not counted): a re-arm, a disarm,
//! the delivery of one ready event (no timeout, and with a timeout), and a notify
//! with the deliver it ends; each is measured alone, its setup and teardown
//! excluded by gungraun.
//!
//! Run: `benches/instructions.sh` (it runs `cargo bench --features io-uring
//! --bench instructions`, prints the table per round trip and the margin over the
//! hand loop (polling and mio against the hand epoll loop too), and checks
//! pollshot's margins against `benches/instructions.bounds`). Needs
//! valgrind and `gungraun-runner` of the same version as the `gungraun`
//! dev-dependency.

// gungraun's macros make modules and items without doc comments, with items newer
// than the crate's MSRV (gungraun, a dev-dependency, needs Rust 1.88 itself).
#![allow(missing_docs, clippy::incompatible_msrv)]

#[cfg(target_os = "linux")]
include!("instructions/linux.rs");

/// epoll and io_uring are Linux's: elsewhere the bench has nothing to count.
#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("instructions: Linux only (epoll, io_uring)");
}
