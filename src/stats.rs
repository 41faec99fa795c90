//! System call counters (cargo feature `stats`) and their snapshot, [`Stats`].
//!
//! Without the feature the counters are zero-sized and every increment compiles to
//! nothing; `Poller::stats` exists only with the feature.

#[cfg(feature = "stats")]
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of a poller's counters. Every field counts since the poller was made.
///
/// What is a system call differs by backend: on epoll every command is one
/// `epoll_ctl`; on kqueue commands are change records, several of which may ride on
/// one `kevent` call; on the poll(2) backend commands change an in-memory set and cost
/// no system call. [`Stats::syscalls`] adds up the ones that were real system calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Add commands (epoll `EPOLL_CTL_ADD`, kqueue `EV_ADD` records).
    pub adds: u64,
    /// Re-arm commands (epoll `EPOLL_CTL_MOD` with readiness bits, kqueue `EV_ENABLE` records).
    pub modifies: u64,
    /// Quiet commands for a disarm (epoll `EPOLL_CTL_MOD` to `EPOLLONESHOT` alone,
    /// kqueue `EV_DISABLE` records).
    pub quiets: u64,
    /// Delete commands (epoll `EPOLL_CTL_DEL`, kqueue `EV_DELETE` records).
    pub deletes: u64,
    /// System calls made only to change registrations (each `epoll_ctl`; each
    /// `kevent` call without an event list; 0 on the poll(2) backend).
    pub ctl_calls: u64,
    /// Wait system calls (`epoll_wait`/`epoll_pwait`/`epoll_pwait2`, `kevent` with an
    /// event list, `poll`), changes that rode on a kqueue wait included.
    pub waits: u64,
    /// Notifier writes (`eventfd` write, `EVFILT_USER` trigger, pipe write).
    pub wakes: u64,
    /// Notifier drains (`eventfd` or pipe read).
    pub wake_reads: u64,
    /// Times MOD answered ENOENT (closed or reused descriptor) and became ADD.
    pub not_found_to_add: u64,
    /// Times ADD answered EEXIST (a dup still registered) and became MOD.
    pub exists_to_modify: u64,
    /// Registrations the kernel refused to poll (EPERM/EINVAL) and that are now
    /// reported always ready.
    pub not_pollable: u64,
    /// Synthetic events queued for always-ready registrations.
    pub synthetic: u64,
    /// Kernel events dropped as stale: tagged with an old generation, for a freed
    /// slot, or for a registration that was not armed.
    pub stale: u64,
}

impl Stats {
    /// System calls counted: `ctl_calls + waits + wakes + wake_reads`.
    pub fn syscalls(&self) -> u64 {
        self.ctl_calls + self.waits + self.wakes + self.wake_reads
    }

    /// `self - earlier`, field by field (saturating at 0): the counts between two snapshots.
    pub fn since(&self, earlier: &Stats) -> Stats {
        macro_rules! d {
            ($($f:ident),*) => { Stats { $($f: self.$f.saturating_sub(earlier.$f)),* } };
        }
        d!(
            adds,
            modifies,
            quiets,
            deletes,
            ctl_calls,
            waits,
            wakes,
            wake_reads,
            not_found_to_add,
            exists_to_modify,
            not_pollable,
            synthetic,
            stale
        )
    }
}

/// What one counter counts; see the fields of [`Stats`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Count {
    Add,
    Modify,
    Quiet,
    Delete,
    CtlCall,
    Wait,
    Wake,
    WakeRead,
    NotFoundToAdd,
    ExistsToModify,
    NotPollable,
    Synthetic,
    Stale,
}

#[cfg_attr(not(feature = "stats"), allow(dead_code))]
const KINDS: usize = 13;

/// Stripes of counters: each thread adds to its own stripe (chosen round-robin at
/// the thread's first count), so threads on different cores do not move one cache
/// line back and forth on every system call; a snapshot sums the stripes.
#[cfg(feature = "stats")]
const STRIPES: usize = 8;

/// One stripe: the thirteen counters, alone on their cache lines.
#[cfg(feature = "stats")]
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe([AtomicU64; KINDS]);

#[cfg(feature = "stats")]
fn stripe_index() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    MINE.with(|m| {
        if m.get() == usize::MAX {
            m.set(NEXT.fetch_add(1, Relaxed) % STRIPES);
        }
        m.get()
    })
}

/// The live counters a backend and the poller increment.
#[derive(Debug, Default)]
pub struct Counters {
    #[cfg(feature = "stats")]
    stripes: [Stripe; STRIPES],
}

impl Counters {
    /// Adds `n` to one counter (nothing without the `stats` feature).
    #[inline(always)]
    pub fn bump(&self, count: Count, n: u64) {
        #[cfg(feature = "stats")]
        self.stripes[stripe_index()].0[count as usize].fetch_add(n, Relaxed);
        #[cfg(not(feature = "stats"))]
        let _ = (count, n);
    }

    /// Adds one to a counter.
    #[inline(always)]
    pub fn one(&self, count: Count) {
        self.bump(count, 1);
    }

    /// A snapshot (all zero without the `stats` feature).
    pub fn snapshot(&self) -> Stats {
        #[cfg(feature = "stats")]
        {
            let g = |c: Count| -> u64 {
                self.stripes
                    .iter()
                    .map(|s| s.0[c as usize].load(Relaxed))
                    .sum()
            };
            Stats {
                adds: g(Count::Add),
                modifies: g(Count::Modify),
                quiets: g(Count::Quiet),
                deletes: g(Count::Delete),
                ctl_calls: g(Count::CtlCall),
                waits: g(Count::Wait),
                wakes: g(Count::Wake),
                wake_reads: g(Count::WakeRead),
                not_found_to_add: g(Count::NotFoundToAdd),
                exists_to_modify: g(Count::ExistsToModify),
                not_pollable: g(Count::NotPollable),
                synthetic: g(Count::Synthetic),
                stale: g(Count::Stale),
            }
        }
        #[cfg(not(feature = "stats"))]
        Stats::default()
    }
}

const _: () = assert!(Count::Stale as usize + 1 == KINDS);
