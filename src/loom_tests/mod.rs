//! Loom model checks (`--cfg loom`, unit tests only): every interleaving of the
//! threads in each scenario, within the preemption bound that [`check`] sets.
//!
//! Run them with
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --lib loom_ -- --nocapture --test-threads=1
//! ```
//!
//! - `model`: a poller made of the crate's own protocol (`src/wake.rs`: the
//!   counters, the synthetic flag and the deliver loop, the code the real poller
//!   runs) over a model kernel whose binary waker behaves as the backends' wakers
//!   do;
//! - `wake`: the scenarios of issue 8, points 1, 3 and 4, the synthetic
//!   event's wake-up (the arm/deliver Dekker pair), and shutdown: 2 and 3 workers
//!   that check a stop flag before `deliver`, stopped by one `shutdown`, and a
//!   shutdown racing a notify;
//! - `kernel`: a backend for a real `Poller` under loom (an epoll-like kernel in
//!   a loom mutex);
//! - `table`: the table's lock-free lookup on that poller: an arm or a fetched
//!   event racing a deregistration and a new registration of the same slot (point
//!   7's kind), generation continuity, a lookup racing a new chunk;
//! - `ring` and `handover`: the io_uring backend's hand-over
//!   (`backends/uring/handover.rs`, the code the backend runs) on a modelled ring
//!   whose enter waits as `io_cqring_wait` does (for a completion past the head
//!   it read): a leader, a follower, a departing deregister, a zero-timeout poll,
//!   wake-ups, and the counted notify of `src/wake.rs` over it.
//!
//! Each scenario's preemption bound is the second argument of its [`check`]: 3
//! for those of 2 or 3 threads (every interleaving of those threads with up to 3
//! preemptions), 2 for the 4-thread one with a spurious wake-up, 1 for the
//! 4-thread one with 3 waiters (it also passes at 2: 872,899 interleavings, over
//! two minutes here). Each of these bugs, seeded by hand, fails within these
//! bounds (a deadlock, or an assertion):
//!
//! - notify coalescing whenever a notify is pending, whatever the waiters;
//! - notify comparing a `pending` it read before the waiters' count (two atomics:
//!   what the protocol was before, with 2 and 3 waiters);
//! - a waiter counted once per wait instead of once per `deliver`;
//! - a waiter reading the synthetic flag before counting itself;
//! - a `deliver` that leaves synthetic events queued without waking the next
//!   waiter;
//! - a `deliver` that returns shut down without waking the kernel for another
//!   counted waiter (one shutdown wake-up then ends one of two workers);
//! - a new registration starting its generations at 0 (the slot's earlier
//!   registration's event then completes the new arming);
//! - a lookup that takes the slot's registration without comparing the token;
//! - a slot unlock that does not wake the threads sleeping on it, or that
//!   releases with `Relaxed` (an update made under the lock is lost);
//! - a zero-timeout poll that takes completions while another thread holds the
//!   ring (the io_uring hang of a `deregister` beside polling threads: a
//!   deadlock after 434 interleavings); the protocol as it was before, written
//!   onto the same modelled ring, deadlocks after 14 to 24;
//! - a leader that enters the kernel without looking at the wake-up flag after
//!   its reap took the eventfd's completion, and a departing deregister that
//!   sleeps without looking at its slot again after counting itself (each a
//!   deadlock, found while writing the protocol);
//! - a leader that enters the kernel again, holding the ring, without waking
//!   the departing deregisters its reap may have served (a deadlock).

mod handover;
mod kernel;
mod model;
mod ring;
mod table;
mod wake;

use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs `f` under loom for every interleaving with at most `preemptions` thread
/// preemptions (`LOOM_MAX_PREEMPTIONS` overrides it), and prints how many
/// interleavings that was.
pub(crate) fn check(name: &str, preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    RUNS.store(0, Ordering::Relaxed);
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(preemptions);
    }
    let bound = builder.preemption_bound;
    builder.check(move || {
        RUNS.fetch_add(1, Ordering::Relaxed);
        f();
    });
    let runs = RUNS.load(Ordering::Relaxed);
    println!("loom {name}: {runs} interleavings, preemption bound {bound:?}");
    assert!(runs > 1, "{name}: loom explored a single interleaving");
}
