//! Fork detection without a system call on the hot path.
//!
//! glibc no longer caches `getpid`, so asking for the pid on every call would cost a
//! system call. Instead a `pthread_atfork(3)` child handler bumps a process-wide
//! counter; a poller remembers the counter's value and compares it (one relaxed
//! load) before touching the kernel. A child made with a raw `fork`/`clone` system
//! call that skips the libc wrapper is not seen.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
#[cfg(unix)]
use std::sync::Once;

static FORKS: AtomicU64 = AtomicU64::new(0);
#[cfg(unix)]
static INSTALL: Once = Once::new();

#[cfg(unix)]
extern "C" fn in_child() {
    FORKS.fetch_add(1, Relaxed);
}

/// Installs the handler (once per process) and returns the current fork count.
pub(crate) fn install() -> u64 {
    // Windows has no fork: the count stays 0.
    #[cfg(unix)]
    INSTALL.call_once(|| {
        // SAFETY: `in_child` is an `extern "C" fn()` that only does an atomic add,
        // which is async-signal-safe as a child handler must be; the other handlers
        // are absent. pthread_atfork(3) only fails with ENOMEM, in which case fork
        // detection is off (documented on `Poller::reinit_after_fork`).
        unsafe {
            libc::pthread_atfork(None, None, Some(in_child));
        }
    });
    FORKS.load(Relaxed)
}

/// How many times this process has been the child of a fork (since `install`).
#[inline]
pub(crate) fn count() -> u64 {
    FORKS.load(Relaxed)
}
