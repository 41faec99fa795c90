//! The Windows backend: AFD poll requests delivered through an I/O completion
//! port.
//!
//! The documentation is on [`Afd`], where rustdoc shows it. The rooms: `afd.rs`
//! (the AFD handle, `IOCTL_AFD_POLL`, the poll operation), `bits.rs` (the event
//! bits and their translation, pure, compiled everywhere for the kernel model),
//! `port.rs` (the completion port, its wait, the waker and the user's posts),
//! `wait.rs` (waitable handles: a thread-pool wait per arming), this file (the
//! `Driver` contract on them, and the sockets' records).

mod afd;
mod port;
mod wait;

use crate::backend::{Backend, Driver, RawEvent, Tag};
use crate::event::Readiness;
use crate::interest::Interest;
use crate::raw::{Kind, RawFd};
use crate::state::KernelError;
use crate::stats::{Count, Counters};
use afd::{AfdHandle, Op, Outcome};
use port::{Port, AFD_KEY, POST_KEY, WAIT_KEY, WAKE_KEY};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use windows_sys::Win32::Foundation::{
    CloseHandle, HANDLE, NTSTATUS, STATUS_INVALID_HANDLE, STATUS_OBJECT_TYPE_MISMATCH,
};
use windows_sys::Win32::Networking::WinSock::WSAENOTSOCK;
use windows_sys::Win32::System::IO::OVERLAPPED_ENTRY;

pub(crate) use afd::{base_socket, check_socket};
pub(crate) use wait::check_waitable;
use wait::Waits;

/// Completions dequeued per wait: a stack buffer, so a wait never allocates.
const BATCH: usize = 256;

/// Record shards: a registration's record is found under the lock of shard
/// `slot % SHARDS`, so arms of different registrations rarely meet on a lock.
const SHARDS: usize = 16;

/// The slot of the event reported for a completion the backend cancelled: no
/// table reaches it, so the poller drops the event as stale (and counts it), and
/// goes on waiting for the time left.
const NO_SLOT: u32 = u32::MAX;

/// The Windows backend: one oneshot `IOCTL_AFD_POLL` per arm, completions
/// delivered through an I/O completion port.
///
/// Every AFD and completion-port call the crate makes is in
/// `backends/windows/` (NtCreateFile, NtDeviceIoControlFile, NtCancelIoFileEx,
/// WSAIoctl, CreateIoCompletionPort, GetQueuedCompletionStatusEx,
/// PostQueuedCompletionStatus). The model is polling's and mio's, and the
/// interface Winsock's own `WSAPoll` uses:
///
/// - the poller opens one `\Device\Afd` handle and associates it with its
///   completion port; every poll goes through it.
/// - add (the first arm): the socket's base handle (WSAIoctl `SIO_BASE_HANDLE`,
///   once per registration), then one `IOCTL_AFD_POLL` for the interest's AFD
///   events. Its APC context, which comes back as the completion's
///   `lpOverlapped`, is the arming's poll operation: the registration's slot and
///   the arming generation, and the memory the driver writes.
/// - re-arm: a new poll with a new generation, then a cancel
///   (NtCancelIoFileEx) of the previous one if it may still fire. An arm of an
///   armed registration with the same interest issues nothing (the state
///   machine's row).
/// - quiet (disarm): a cancel of the pending poll.
/// - delete (deregister): a cancel of the pending poll; its record is gone when
///   the call returns, and the socket can be closed at once: the poll's memory is
///   freed only when its (cancelled) completion is dequeued.
/// - deliver: GetQueuedCompletionStatusEx. A completion of a poll the backend
///   cancelled is dropped as stale; one with an older generation than the
///   table's is dropped by the poller, as on epoll. Several threads may wait at
///   once; each completion reaches one of them.
/// - the waker: PostQueuedCompletionStatus with a key of its own; each post
///   is one packet for one wait.
/// - the user's posts (`Poller::post`): PostQueuedCompletionStatus with another
///   key, the user's key as the packet's `lpOverlapped` and the interest's bits
///   as its byte count; delivered as an event of no registration
///   ([`Event::is_posted`](crate::Event::is_posted)).
/// - waitable handles (`Poller::register_waitable`): the first arm duplicates
///   the caller's handle (DuplicateHandle; closed when the registration ends),
///   and an arm is one RegisterWaitForSingleObject (`WT_EXECUTEONLYONCE`) on
///   that duplicate whose callback posts the slot and generation to the port;
///   disarm, re-arm and deregister
///   unregister it with UnregisterWaitEx, which waits for a running callback
///   (`backends/windows/wait.rs` says why this and not wait completion packets).
///
/// AFD events per interest and how they map to an [`Event`](crate::Event):
/// readable polls RECEIVE, ACCEPT and DISCONNECT; writable polls SEND; both
/// poll ABORT, LOCAL_CLOSE and CONNECT_FAIL. RECEIVE and ACCEPT are readable,
/// SEND writable, DISCONNECT readable + read-closed, ABORT (a reset) and
/// CONNECT_FAIL error + both directions closed, LOCAL_CLOSE (the socket was
/// closed while armed) both directions closed without error.
///
/// Counted in [`Stats`](crate::Stats): `adds`, `modifies`, `quiets`, `deletes`
/// per command; `ctl_calls` per system call they made (each `IOCTL_AFD_POLL`,
/// each NtCancelIoFileEx, each `SIO_BASE_HANDLE` lookup, each
/// DuplicateHandle, RegisterWaitForSingleObject and UnregisterWaitEx); `waits` per
/// GetQueuedCompletionStatusEx; `wakes` per waker post. The user's posts are
/// not counted (no field of `Stats` counts them).
///
/// Memory: per registration a record (base handle and the current poll, in a
/// hash map, about 28 bytes) and one poll operation of 80 bytes (its `Arc`
/// allocation) while an arming is in flight or was the last, besides the table's
/// 16-byte slot.
pub struct Afd {
    afd: AfdHandle,
    port: Port,
    records: [Mutex<HashMap<u32, Record>>; SHARDS],
    /// The waitable handles' registrations.
    waits: Waits,
    /// Polls issued whose completion is not dequeued yet (`Drop` waits for them).
    in_flight: AtomicUsize,
    counters: Counters,
}

/// The backend's view of one registration.
struct Record {
    base: RawFd,
    /// The last poll issued for it (in flight, completed or cancelled).
    op: Arc<Op>,
}

impl Backend for Afd {}

impl std::fmt::Debug for Afd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Afd")
            .field("afd", &self.afd.0)
            .field("port", &self.port.0)
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A map of plain records: a panic elsewhere cannot leave it half-written.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A refused poll, for the state machine. STATUS_INVALID_HANDLE (closed) and
/// STATUS_OBJECT_TYPE_MISMATCH (the number is another kind of object's now: a
/// socket closed without a deregister, its value given to an event; wine's
/// server `poll_socket` looks the handle up as a socket, `get_handle_obj`
/// with `sock_ops`, and answers this, as probed by `tests/windows_break.rs`)
/// are both no socket there, as a closed one: `BadFd`.
fn refused(status: NTSTATUS) -> KernelError {
    if status == STATUS_INVALID_HANDLE || status == STATUS_OBJECT_TYPE_MISMATCH {
        KernelError::BadFd
    } else {
        KernelError::Other(afd::nt_io_error(status))
    }
}

/// A posted packet's byte count: the interest's directions.
const POSTED_READABLE: u32 = 1;
const POSTED_WRITABLE: u32 = 2;

/// The readiness of a posted packet with byte count `bits`.
fn posted_readiness(bits: u32) -> Readiness {
    let mut r = Readiness::POSTED;
    if bits & POSTED_READABLE != 0 {
        r.insert(Readiness::READABLE);
    }
    if bits & POSTED_WRITABLE != 0 {
        r.insert(Readiness::WRITABLE);
    }
    r
}

impl Afd {
    /// Arms a waitable handle's registration (`wait.rs`); `fd` is its handle
    /// value.
    fn arm_waitable(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        self.waits.arm(
            self.port.0,
            fd as usize as HANDLE,
            tag.slot,
            tag.generation,
            interest,
            &self.counters,
        )
    }

    fn records(&self, slot: u32) -> MutexGuard<'_, HashMap<u32, Record>> {
        lock(&self.records[slot as usize % SHARDS])
    }

    /// Issues `op`'s poll: one `IOCTL_AFD_POLL`.
    fn issue(&self, op: &Arc<Op>) -> Result<(), KernelError> {
        self.counters.one(Count::CtlCall);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.afd.poll(op).map_err(|status| {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            refused(status)
        })
    }

    /// Cancels `op`'s poll if it may still fire: one NtCancelIoFileEx, or none.
    fn cancel(&self, op: &Op) -> Result<(), KernelError> {
        if !op.mark_cancelled() {
            return Ok(());
        }
        self.counters.one(Count::CtlCall);
        self.afd.cancel(op).map_err(KernelError::Other)
    }
}

impl Driver for Afd {
    const NAME: &'static str = "afd";
    const TAG_IS_GENERATION: bool = true;
    const SPLIT_FILTERS: bool = false;
    // `Interest::PRIORITY` is refused for now (`Unsupported`): AFD has a bit
    // for urgent data (`AFD_POLL_RECEIVE_EXPEDITED`), but how wine and Windows
    // report `MSG_OOB` through it is not yet tested.
    const PRIORITY: bool = false;

    fn new() -> io::Result<Afd> {
        let afd = AfdHandle::open()?;
        let port = Port::new()?;
        port.associate(afd.0, AFD_KEY)?;
        Ok(Afd {
            afd,
            port,
            records: Default::default(),
            waits: Waits::new(),
            in_flight: AtomicUsize::new(0),
            counters: Counters::default(),
        })
    }

    fn add(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        self.counters.one(Count::Add);
        if self.waits.holds(tag.slot) {
            return self.arm_waitable(fd, tag, interest);
        }
        self.counters.one(Count::CtlCall);
        let base = base_socket(fd).map_err(|e| match e.raw_os_error() {
            Some(WSAENOTSOCK) => KernelError::BadFd,
            _ => KernelError::Other(e),
        })?;
        let op = Arc::new(Op::new(base, tag.slot, tag.generation, interest));
        self.issue(&op)?;
        let old = self.records(tag.slot).insert(tag.slot, Record { base, op });
        // A record left by an earlier registration of the slot (the poller
        // deletes before it adds, so not expected): its poll must not fire.
        match old {
            Some(old) => self.cancel(&old.op),
            None => Ok(()),
        }
    }

    fn modify(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        self.counters.one(Count::Modify);
        if self.waits.holds(tag.slot) {
            return self.arm_waitable(fd, tag, interest);
        }
        let base = match self.records(tag.slot).get(&tag.slot) {
            Some(r) => r.base,
            None => return Err(KernelError::NotFound),
        };
        let op = Arc::new(Op::new(base, tag.slot, tag.generation, interest));
        // The new poll first: if it is refused, the arming in force stays.
        self.issue(&op)?;
        let old = match self.records(tag.slot).get_mut(&tag.slot) {
            Some(r) => std::mem::replace(&mut r.op, op),
            None => return Err(KernelError::NotFound),
        };
        self.cancel(&old)
    }

    fn quiet(&self, _fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        self.counters.one(Count::Quiet);
        if self.waits.holds(tag.slot) {
            return self.waits.disarm(tag.slot);
        }
        let op = self.records(tag.slot).get(&tag.slot).map(|r| r.op.clone());
        match op {
            Some(op) => self.cancel(&op),
            None => Err(KernelError::NotFound),
        }
    }

    fn delete(&self, _fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        self.counters.one(Count::Delete);
        if self.waits.holds(tag.slot) {
            return self.waits.cancel(tag.slot, &self.counters);
        }
        let record = self.records(tag.slot).remove(&tag.slot);
        match record {
            Some(r) => self.cancel(&r.op),
            None => Err(KernelError::NotFound),
        }
    }

    fn wait(
        &self,
        out: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        let mut buf = [OVERLAPPED_ENTRY::default(); BATCH];
        let len = max.clamp(1, BATCH);
        self.counters.one(Count::Wait);
        let n = self.port.wait(&mut buf[..len], timeout)?;
        let mut woken = false;
        for entry in &buf[..n] {
            match entry.lpCompletionKey {
                WAKE_KEY => woken = true,
                POST_KEY => {
                    let key = entry.lpOverlapped as usize as u64;
                    out.push(RawEvent {
                        slot: key as u32,
                        stamp: (key >> 32) as u32,
                        readiness: posted_readiness(entry.dwNumberOfBytesTransferred),
                    });
                }
                WAIT_KEY => out.push(RawEvent {
                    slot: entry.lpOverlapped as usize as u32,
                    stamp: entry.dwNumberOfBytesTransferred,
                    readiness: Readiness::READABLE,
                }),
                AFD_KEY => {
                    // SAFETY: every packet with AFD_KEY is the completion of a poll
                    // issued by `AfdHandle::poll`, whose APC context (this
                    // `lpOverlapped`) is a reference from `Arc::into_raw` that only
                    // this dequeue takes back, once.
                    let op = unsafe { Arc::from_raw(entry.lpOverlapped as *const Op) };
                    self.in_flight.fetch_sub(1, Ordering::Relaxed);
                    let event = match op.complete(entry.Internal as NTSTATUS) {
                        Outcome::Cancelled => RawEvent {
                            slot: NO_SLOT,
                            stamp: 0,
                            readiness: Readiness::EMPTY,
                        },
                        Outcome::Ready(readiness) => RawEvent {
                            slot: op.slot,
                            stamp: op.generation,
                            readiness,
                        },
                    };
                    out.push(event);
                }
                // Not a key of this backend's: nothing of ours to release.
                _ => {}
            }
        }
        Ok(woken)
    }

    fn wake(&self) -> io::Result<()> {
        self.counters.one(Count::Wake);
        self.port.post()
    }

    fn registered(&self, slot: u32, kind: Option<Kind>) {
        // Only a wait left by an earlier registration could fail to cancel
        // here (not expected: its deregister cancelled it); its context is then
        // kept, and nothing is reported.
        let _ = self.waits.set(slot, kind == Some(Kind::Waitable));
    }

    fn post(&self, key: usize, interest: Interest) -> io::Result<()> {
        let mut bits = 0;
        if interest.is_readable() {
            bits |= POSTED_READABLE;
        }
        if interest.is_writable() {
            bits |= POSTED_WRITABLE;
        }
        port::post_packet(self.port.0, POST_KEY, bits, key)
    }

    fn reinit_after_fork(&mut self) -> io::Result<()> {
        // Windows has no fork: the poller never calls this.
        Ok(())
    }

    fn owns_fd(&self, fd: RawFd) -> bool {
        fd == self.afd.0 as RawFd || fd == self.port.0 as RawFd
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }
}

impl Drop for Afd {
    fn drop(&mut self) {
        // No wait's callback may post to the port once it is closed.
        self.waits.drain();
        // Every poll still in flight is cancelled, and its completion dequeued so
        // that its memory is freed after the driver is done with it. A wait that
        // finds nothing for a second means the driver has none left to queue.
        self.afd.cancel_all();
        let mut buf = [OVERLAPPED_ENTRY::default(); BATCH];
        while self.in_flight.load(Ordering::Relaxed) > 0 {
            let n = match self.port.wait(&mut buf, Some(Duration::from_secs(1))) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            for entry in &buf[..n] {
                if entry.lpCompletionKey == AFD_KEY {
                    // SAFETY: as in `wait`: the reference the poll's APC context
                    // carries, taken back once.
                    drop(unsafe { Arc::from_raw(entry.lpOverlapped as *const Op) });
                    self.in_flight.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        // SAFETY: the AFD handle is owned by this backend and closed once; the
        // port is closed after it (its own drop).
        unsafe { CloseHandle(self.afd.0) };
    }
}
