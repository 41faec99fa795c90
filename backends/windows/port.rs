//! The completion port: where AFD completions and the waker's packets arrive,
//! and the wait (`GetQueuedCompletionStatusEx`) that delivers them.
//!
//! A port queues packets and hands each one to exactly one thread blocked in
//! `GetQueuedCompletionStatusEx` (the kernel's `KeRemoveQueue`; wine's server
//! `completion` object), so several threads may wait on one port at once and a
//! completion reaches one of them.
//!
//! The waker is `PostQueuedCompletionStatus` with a key of its own: each post
//! is one packet, reported to one wait, and a post made before any wait is kept
//! until one dequeues it. Posts never merge, which is stronger than the binary
//! waker the notify protocol (`src/wake.rs`) needs.

use std::io;
use std::ptr;
use std::time::Duration;
use windows_sys::Win32::Foundation::{CloseHandle, GetLastError, HANDLE, WAIT_TIMEOUT};
use windows_sys::Win32::System::IO::{
    CreateIoCompletionPort, GetQueuedCompletionStatusEx, PostQueuedCompletionStatus,
    OVERLAPPED_ENTRY,
};

/// The completion key of every AFD poll (the AFD handle's association).
pub(crate) const AFD_KEY: usize = 1;
/// The completion key of the waker's posts.
pub(crate) const WAKE_KEY: usize = 2;
/// The completion key of the user's posts (`Poller::post`): the packet's
/// `lpOverlapped` is the user's key, its byte count the interest's bits.
pub(crate) const POST_KEY: usize = 3;
/// The completion key of a waitable handle's packet (`wait.rs`): the packet's
/// `lpOverlapped` is the registration's slot, its byte count the arming's
/// generation.
pub(crate) const WAIT_KEY: usize = 4;

/// A completion port (owned: closed on drop).
pub(crate) struct Port(pub(crate) HANDLE);

// SAFETY: a completion port handle may be used from any thread at once; the
// kernel serialises its queue.
unsafe impl Send for Port {}
// SAFETY: as above.
unsafe impl Sync for Port {}

impl Port {
    /// A new port; its concurrency value is the default (the processors).
    pub(crate) fn new() -> io::Result<Port> {
        // SAFETY: INVALID_HANDLE_VALUE with no existing port makes a new port;
        // no pointer is passed.
        let port = unsafe {
            CreateIoCompletionPort(
                windows_sys::Win32::Foundation::INVALID_HANDLE_VALUE,
                ptr::null_mut(),
                0,
                0,
            )
        };
        if port.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(Port(port))
    }

    /// Associates `handle` with this port: its I/O completions become packets
    /// with key `key`.
    pub(crate) fn associate(&self, handle: HANDLE, key: usize) -> io::Result<()> {
        // SAFETY: both handles are open (the caller owns `handle`, this value the
        // port); no pointer is passed.
        let r = unsafe { CreateIoCompletionPort(handle, self.0, key, 0) };
        if r.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Dequeues up to `buf.len()` packets, waiting up to `timeout` (`None`:
    /// forever) for the first. `Ok(0)` when the time passed.
    pub(crate) fn wait(
        &self,
        buf: &mut [OVERLAPPED_ENTRY],
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let mut n = 0u32;
        // SAFETY: `buf` is a live array of `buf.len()` entries that the call
        // fills at most; `n` is a live out-parameter. Not alertable.
        let ok = unsafe {
            GetQueuedCompletionStatusEx(
                self.0,
                buf.as_mut_ptr(),
                buf.len() as u32,
                &mut n,
                timeout_ms(timeout),
                0,
            )
        };
        if ok != 0 {
            return Ok(n as usize);
        }
        // SAFETY: reads this thread's last error; no arguments.
        let code = unsafe { GetLastError() };
        if code == WAIT_TIMEOUT {
            return Ok(0);
        }
        Err(io::Error::from_raw_os_error(code as i32))
    }

    /// The waker: posts one packet with [`WAKE_KEY`].
    pub(crate) fn post(&self) -> io::Result<()> {
        post_packet(self.0, WAKE_KEY, 0, 0)
    }
}

/// Posts one packet on port `port` (PostQueuedCompletionStatus) with completion
/// key `key`, byte count `bytes` and `word` as its `lpOverlapped`: a value that is
/// never dereferenced (no I/O request is behind it), only handed back by the
/// wait that dequeues the packet.
pub(crate) fn post_packet(port: HANDLE, key: usize, bytes: u32, word: usize) -> io::Result<()> {
    // SAFETY: the port handle is open (the caller's); the OVERLAPPED pointer is
    // a plain word the kernel only copies into the packet and never reads.
    let ok = unsafe { PostQueuedCompletionStatus(port, bytes, key, word as *const _) };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Drop for Port {
    fn drop(&mut self) {
        // SAFETY: the port handle is owned by this value and closed once.
        unsafe { CloseHandle(self.0) };
    }
}

/// A timeout in the milliseconds GetQueuedCompletionStatusEx takes: `None` is
/// INFINITE, zero is 0, anything else is rounded *up* (never down to 0, which
/// would spin) and clamped below INFINITE (about 49.7 days).
pub(crate) fn timeout_ms(timeout: Option<Duration>) -> u32 {
    match timeout {
        None => u32::MAX,
        Some(t) if t.is_zero() => 0,
        Some(t) => {
            let ms = t.as_nanos().div_ceil(1_000_000);
            u32::try_from(ms).unwrap_or(u32::MAX - 1).min(u32::MAX - 1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::timeout_ms;
    use std::time::Duration;

    #[test]
    fn millisecond_timeouts_round_up_and_clamp_below_infinite() {
        assert_eq!(timeout_ms(None), u32::MAX);
        assert_eq!(timeout_ms(Some(Duration::ZERO)), 0);
        assert_eq!(timeout_ms(Some(Duration::from_nanos(1))), 1);
        assert_eq!(timeout_ms(Some(Duration::from_micros(1500))), 2);
        assert_eq!(timeout_ms(Some(Duration::MAX)), u32::MAX - 1);
    }
}
