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

/// Tests: runs `child` in a forked child, which leaves by `_exit(2)` with the
/// code `child` returns (0: passed; the caller's message says what each other
/// code means), and returns that code in the parent. The child must not
/// panic: it would unwind into a copy of the test harness.
#[cfg(all(test, unix, not(loom)))]
// Only the Linux and kqueue backends' tests fork (not illumos's, say).
#[allow(dead_code)]
pub(crate) fn in_forked_child(child: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child runs `child` alone and leaves by _exit, without the
    // parent's exit handlers.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = child();
        // SAFETY: as above.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: `status` outlives the call; `pid` is our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "the child died: {status:#x}");
    libc::WEXITSTATUS(status)
}

/// Puts `fresh` in `place` and leaks what was there, never dropped: in a forked
/// child, a lock (or a condition variable) inherited from the parent may be
/// held, or waited on, by a thread that does not exist here. Destroying it may
/// wait for that thread on some targets, and reaching its contents through it
/// would wait for good (`reinit_after_fork`).
pub(crate) fn replace_inherited<T>(place: &mut T, fresh: T) {
    std::mem::forget(std::mem::replace(place, fresh));
}
