//! [`Ports`]: the event ports backend's [`Driver`] (illumos, Solaris). Every port
//! call the crate makes is in this file.

use super::events::{self, slot_and_generation, user_word, WAKER};
use crate::backend::{Backend, Driver, RawEvent, Tag};
use crate::error::classify;
use crate::interest::Interest;
use crate::state::KernelError;
use crate::stats::{Count, Counters};
use rustix::event::port;
use rustix::event::PollFlags;
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ffi::c_void;
use std::io;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;

// The `user` word carries slot and generation in one pointer: 64-bit only (every
// illumos and Solaris Rust target is).
#[cfg(not(target_pointer_width = "64"))]
compile_error!("pollshot's event ports backend needs a 64-bit `void *` for its user word");

/// Kernel events retrieved per wait: a stack buffer, so a wait never allocates.
const BATCH: usize = 256;

/// The event ports backend (illumos, Solaris): `port_associate(3C)` on every arm,
/// oneshot by the kernel's own rule.
///
/// The default backend on illumos and Solaris (`--cfg pollshot_force_blocking`
/// selects the poll(2) backend there instead). Each behaviour relied on below names
/// the illumos function that decides it (`usr/src/uts/common/fs/portfs/port.c`,
/// `port_fd.c`, `port_vnops.c`, `usr/src/uts/common/os/fio.c`,
/// `usr/src/lib/libc/port/gen/event_port.c`). Checked by reading those sources
/// and the man pages, by the kernel model (`pollshot::model::Semantics::Ports`,
/// fuzzed by the state-machine target) and by compiling the shared suite for
/// `x86_64-unknown-illumos`; not run on an illumos or Solaris kernel.
///
/// - add and re-arm: `port_associate(port, PORT_SOURCE_FD, fd, events, user)`, with
///   `POLLIN` (and `POLLRDHUP` on illumos) for readable, `POLLOUT` for writable,
///   and `user` = slot | generation << 32. The same call for both rows:
///   `port_associate_fd` looks the association up by (number, open file), and an
///   existing one (re-association) gets the new events and `user`, and an event it
///   posted that is still queued is removed (`port_remove_done_event`), so it never
///   answers EEXIST nor ENOENT. It polls the descriptor at once (`VOP_POLL`) and
///   posts an event if it is ready. `POLLERR` and `POLLHUP` are reported whatever
///   was asked (`revents & (pd_events | POLLHUP | POLLERR)`).
/// - oneshot: an association posts at most one event (`port_associate_fd` and the
///   pollwakeup path clear `PORT_KEV_VALID` when they post), and a retrieved event
///   leaves the descriptor associated with nothing until the next
///   `port_associate` (port_associate(3C)). A re-arm of a registration armed for
///   the same interest issues nothing (the state table's row), so an event in
///   flight satisfies it.
/// - `port_associate_fd` drops its lock inside `VOP_POLL` and asks applications
///   not to associate and dissociate one descriptor from two threads at once: the
///   poller holds the registration's lock across each command (`src/table.rs`),
///   so they never race.
/// - quiet and delete: `port_dissociate(port, PORT_SOURCE_FD, fd)`. In
///   `port_dissociate_fd`: 0 when an association was active (armed, or fired and
///   still queued: the queued event is removed), ENOENT when it was not (its event
///   was already retrieved, or the number now names another open file), EBADFD when
///   the number is closed, EACCES for a process that is not the association's
///   owner (a forked child; never issued: the child makes a port of its own). It
///   frees the association in every case (`port_remove_fd_object`). The state
///   table's fallbacks take ENOENT and EBADFD as "already gone".
/// - close: closing a number removes its associations and their queued events
///   (`closeandsetf` calls `port_close_fd`, then `port_close_pfd` and
///   `port_remove_fd_object`), whether or not a dup keeps the open file alive: the
///   dup is another number, with an association of its own. After a close,
///   `port_associate` and `port_dissociate` answer EBADFD (`getf` fails), and on a
///   reused number the lookup by (number, open file) finds nothing: a new
///   association, or ENOENT. EBADFD is classified as EBADF elsewhere.
/// - regular files and `/dev/null`: `port_associate` succeeds, and an event is
///   posted at once: `fs_poll` (regular files) and `mmchpoll` (`/dev/null`,
///   `/dev/zero`) answer the events asked for as ready. So each arm is one
///   `port_associate` and one kernel event, never the always-ready fallback of
///   epoll and kqueue. A device whose poll routine fails (`VOP_POLL`'s error is
///   returned by `port_associate_fd`: ENOSYS from `fs_nosys_poll`, ENXIO from a
///   device without one) is always ready, as on the other backends.
/// - deliver: `port_getn(port, list, max, &nget, timeout)` with `nget` = 1: it
///   returns once at least one event is queued, at the timeout, or on a signal.
///   Several threads may wait at once; each event is moved to one of them
///   (`port_getn` takes the queue under `port_block`), and a posted event wakes
///   one waiter (`port_send_event` signals the first waiter whose `nget` is met;
///   waiters with smaller `nget` first, `port_queue_thread`). The timeout is a
///   relative timespec, exact to the nanosecond; zero does not block
///   (`port_get_timeout`); `tv_sec` is clamped to 10^8 s. ETIME (the timeout
///   passed) can come with events retrieved: libc's `port_getn` then updates
///   `nget`, which is read (rustix's `getn` would drop them, so this call is made
///   through `libc`). EINTR returns no event (`port_getn`'s `cv_waituntil_sig`
///   path) and is `ErrorKind::Interrupted`.
/// - waker: `port_send(port, 0, u64::MAX)`, one `PORT_SOURCE_USER` event, retrieved
///   by one waiter. A flag keeps at most one queued: a wake-up while one is queued
///   merges with it (the binary waker of the other backends; `src/wake.rs` counts
///   notifies above it), so the port's event limit (`process.max-port-events`,
///   EAGAIN) is never reached by wake-ups.
/// - limits: every association holds one of the port's event structures
///   (`port_alloc_event_local`, counted against the resource control
///   `process.port-max-events`): an arm past it fails with EAGAIN, returned as is.
/// - fork: the port is inherited and shared with the parent (port_create(3C)), and
///   a child's `port_associate` of an inherited descriptor would update the
///   parent's association (same number and open file). The child never touches
///   it: `reinit_after_fork` makes a new port, and closing the child's copy of the
///   old one removes only associations the child made (`port_close` with a count
///   above one calls `port_close_sourcefd` for the child's pid) and leaves the
///   parent's user events queued (they are shareable).
/// - `port_create` takes no flags: the port is made close-on-exec by an
///   `fcntl(F_SETFD)` right after (a concurrent `fork` + `exec` in between would
///   leak it into the new program).
/// - the port descriptor is readable while an event is queued (`port_poll`), so a
///   poller nests in another event loop as on epoll and kqueue.
#[derive(Debug)]
pub struct Ports {
    port: OwnedFd,
    /// A waker event is queued and not yet retrieved.
    wake_queued: AtomicBool,
    counters: Counters,
}

impl Backend for Ports {}

/// Borrows a registered descriptor number for one port call.
#[inline]
fn fd_ref<'a>(fd: RawFd) -> BorrowedFd<'a> {
    // SAFETY: the number is passed only to port_associate(3C) or port_dissociate(3C),
    // which look it up (EBADFD when closed); the kernel drops the association when
    // the number is closed (`port_close_fd`), so nothing outlives it. No I/O is done
    // through it and it is never closed here.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

/// A kernel answer as the state machine reads it: EBADFD (the object number is
/// closed) is EBADF; `VOP_POLL`'s refusals (ENOSYS, ENXIO) are "cannot be polled".
fn kernel_error(e: io::Error) -> KernelError {
    if e.raw_os_error() == Some(libc::EBADFD) {
        return KernelError::BadFd;
    }
    classify(e, &[libc::ENOSYS, libc::ENXIO])
}

impl Ports {
    fn create() -> io::Result<OwnedFd> {
        let port = port::create()?;
        rustix::io::fcntl_setfd(&port, rustix::io::FdFlags::CLOEXEC)?;
        Ok(port)
    }

    #[inline(always)]
    fn associate(
        &self,
        count: Count,
        fd: RawFd,
        tag: Tag,
        interest: Interest,
    ) -> Result<(), KernelError> {
        self.counters.one(count);
        self.counters.one(Count::CtlCall);
        let events = PollFlags::from_bits_retain(events::events_for(interest) as _);
        let user = user_word(tag.slot, tag.generation) as usize as *mut c_void;
        // SAFETY: see `fd_ref`: the kernel validates the number and removes the
        // association when it is closed; `user` is an opaque word, never
        // dereferenced.
        let r = unsafe { port::associate_fd(&self.port, fd_ref(fd), events, user) };
        r.map_err(|e| kernel_error(e.into()))
    }

    #[inline(always)]
    fn dissociate(&self, count: Count, fd: RawFd) -> Result<(), KernelError> {
        self.counters.one(count);
        self.counters.one(Count::CtlCall);
        // SAFETY: see `fd_ref`; a number that is not associated answers ENOENT.
        let r = unsafe { port::dissociate_fd(&self.port, fd_ref(fd)) };
        r.map_err(|e| kernel_error(e.into()))
    }
}

impl Driver for Ports {
    const NAME: &'static str = "ports";
    const TAG_IS_GENERATION: bool = true;
    const SPLIT_FILTERS: bool = false;

    fn new() -> io::Result<Ports> {
        Ok(Ports {
            port: Ports::create()?,
            wake_queued: AtomicBool::new(false),
            counters: Counters::default(),
        })
    }

    #[inline(always)]
    fn add(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        self.associate(Count::Add, fd, tag, interest)
    }

    #[inline(always)]
    fn modify(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        self.associate(Count::Modify, fd, tag, interest)
    }

    #[inline(always)]
    fn quiet(&self, fd: RawFd, _tag: Tag) -> Result<(), KernelError> {
        self.dissociate(Count::Quiet, fd)
    }

    fn delete(&self, fd: RawFd, _tag: Tag) -> Result<(), KernelError> {
        self.dissociate(Count::Delete, fd)
    }

    fn wait(
        &self,
        out: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        let mut buf = [MaybeUninit::<libc::port_event>::uninit(); BATCH];
        let len = max.clamp(1, BATCH);
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let ts_ptr = match timeout {
            None => std::ptr::null_mut(),
            Some(t) => {
                let (secs, nanos) = events::timespec_parts(t);
                ts.tv_sec = secs as libc::time_t;
                ts.tv_nsec = nanos as libc::c_long;
                &mut ts as *mut libc::timespec
            }
        };
        // At least one event; at most `len`.
        let mut nget: libc::c_uint = 1;
        self.counters.one(Count::Wait);
        // SAFETY: port_getn(3C) writes at most `len` `port_event_t`s into `buf`
        // (libc's `port_event` is the C layout) and the count into `nget`; `ts`
        // outlives the call.
        let r = unsafe {
            libc::port_getn(
                self.port.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                len as libc::c_uint,
                &mut nget,
                ts_ptr,
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            // ETIME may come with events: libc's port_getn stored their count.
            if e.raw_os_error() != Some(libc::ETIME) {
                return Err(e);
            }
        }
        let n = (nget as usize).min(len);
        let mut woken = false;
        for slot in &buf[..n] {
            // SAFETY: the kernel initialised the first `nget` entries.
            let ev = unsafe { slot.assume_init_ref() };
            match ev.portev_source as libc::c_int {
                libc::PORT_SOURCE_FD => {
                    let (slot, generation) = slot_and_generation(ev.portev_user as usize as u64);
                    out.push(RawEvent {
                        slot,
                        stamp: generation,
                        readiness: events::readiness(ev.portev_events),
                    });
                }
                libc::PORT_SOURCE_USER if ev.portev_user as usize as u64 == WAKER => {
                    // Taken: the next wake-up queues a new one.
                    self.wake_queued.store(false, SeqCst);
                    woken = true;
                }
                // Nothing else is sent to this port.
                _ => {}
            }
        }
        Ok(woken)
    }

    fn wake(&self) -> io::Result<()> {
        if self.wake_queued.swap(true, SeqCst) {
            // One is queued and no wait has taken it yet: this one merges with it.
            return Ok(());
        }
        self.counters.one(Count::Wake);
        port::send(&self.port, 0, WAKER as usize as *mut c_void).map_err(|e| {
            self.wake_queued.store(false, SeqCst);
            e.into()
        })
    }

    fn reinit_after_fork(&mut self) -> io::Result<()> {
        // The inherited port is shared with the parent: never associate on it.
        // Closing the child's copy (by dropping it) leaves the parent's alone.
        self.port = Ports::create()?;
        self.wake_queued = AtomicBool::new(false);
        Ok(())
    }

    fn owns_fd(&self, fd: RawFd) -> bool {
        fd == self.port.as_raw_fd()
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }
}

impl AsFd for Ports {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.port.as_fd()
    }
}
