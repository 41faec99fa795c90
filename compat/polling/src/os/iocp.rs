//! Windows: packets posted to the poller and waitable handles (events, processes,
//! threads, mutexes, semaphores, waitable timers), as polling 3.x offers them
//! through [`PollerIocpExt`] and async-io uses them (`async_io::os::windows`).
//!
//! pollshot's Windows backend is an I/O completion port that AFD poll requests
//! complete to; both extensions go through the same port:
//!
//! | polling | pollshot | Windows calls |
//! |---|---|---|
//! | [`post`](PollerIocpExt::post) | `Poller::post(key, interest)` | one `PostQueuedCompletionStatus` |
//! | [`add_waitable`](PollerIocpExt::add_waitable) | `register_waitable_raw`, then `arm(token, READABLE)` unless [`Event::none`] | a wait on the object (its signal becomes one packet on the port) |
//! | [`modify_waitable`](PollerIocpExt::modify_waitable) | `arm(token, READABLE)`, or `disarm` for [`Event::none`] | a new wait (none while one is pending), or its cancel |
//! | [`remove_waitable`](PollerIocpExt::remove_waitable) | `deregister` | the wait's cancel |
//! | [`Poller::wait`] | `deliver` | one `GetQueuedCompletionStatusEx` |
//!
//! A posted packet is delivered once, to one waiting thread, with its event's key
//! and directions. A waitable's arming is oneshot (pollshot's arm): once the object
//! is signaled, one event with the key and the directions given (readable and
//! writable as the interest said, whatever the object) is delivered, and the
//! registration is silent until the next `modify_waitable`; in
//! [`PollMode::Level`] the facade arms it again after each delivery, so an object
//! that stays signaled (a manual-reset event, an exited process) is reported by
//! every wait.

use super::PollerSealed;
use crate::poller::{check_key, level_of};
use crate::{Event, PollMode, Poller};
use pollshot::Interest;
use std::io;
use std::os::windows::io::{AsHandle, AsRawHandle, BorrowedHandle, RawHandle};

/// A packet for [`PollerIocpExt::post`]: an [`Event`] that a [`Poller::wait`]
/// returns as it is given (its key and its two directions; extra bits such as
/// [`Event::is_interrupt`] are not carried).
#[derive(Debug, Clone)]
pub struct CompletionPacket(Event);

impl CompletionPacket {
    /// A packet that delivers `event`.
    pub fn new(event: Event) -> CompletionPacket {
        CompletionPacket(event)
    }

    /// The event this packet delivers.
    pub fn event(&self) -> &Event {
        &self.0
    }
}

/// Posted packets and waitable handles for [`Poller`] (Windows).
pub trait PollerIocpExt: PollerSealed {
    /// Posts `packet`: one [`wait`](Poller::wait), in one thread, returns its event
    /// (with the event's key, readable and writable as given). Cost: one
    /// `PostQueuedCompletionStatus`. Packets do not coalesce: each post is one
    /// delivery.
    ///
    /// # Errors
    /// - `ErrorKind::InvalidInput`: the event has no direction ([`Event::none`]):
    ///   pollshot posts a readiness, which needs one.
    /// - the kernel's error from `PostQueuedCompletionStatus` (not expected).
    fn post(&self, packet: CompletionPacket) -> io::Result<()>;

    /// Registers a waitable handle (an event, a process, a thread, a mutex, a
    /// semaphore, a waitable timer) under `interest.key`, and waits for it to be
    /// signaled unless `interest` is [`Event::none`]. Its event then reports
    /// `interest`'s directions.
    ///
    /// # Safety
    /// `handle` must stay open until it is [`remove_waitable`](Self::remove_waitable)d.
    ///
    /// # Errors
    /// - `ErrorKind::InvalidInput`: `interest.key` is `usize::MAX` (reserved), or
    ///   the handle is null.
    /// - `ErrorKind::AlreadyExists`: the handle is registered already.
    /// - `ErrorKind::Unsupported`: `mode` is `Edge` or `EdgeOneshot`.
    /// - pollshot's or the kernel's error registering or arming it (a handle that
    ///   cannot be waited on, or a socket's: `InvalidInput`). Nothing stays
    ///   registered after an error.
    unsafe fn add_waitable(
        &self,
        handle: impl AsRawWaitable,
        interest: Event,
        mode: PollMode,
    ) -> io::Result<()>;

    /// Waits again for `handle` to be signaled, reporting `interest` (key and
    /// directions) from now on; [`Event::none`] stops waiting. Nothing is issued
    /// while a wait for it is still pending.
    ///
    /// # Errors
    /// - `ErrorKind::InvalidInput`: `interest.key` is `usize::MAX`.
    /// - `ErrorKind::NotFound`: `handle` is not registered in this poller.
    /// - `ErrorKind::Unsupported`: `mode` is `Edge` or `EdgeOneshot`.
    /// - pollshot's or the kernel's error from the arming.
    fn modify_waitable(
        &self,
        handle: impl AsWaitable,
        interest: Event,
        mode: PollMode,
    ) -> io::Result<()>;

    /// Removes the registration of `handle`; its event not yet collected is
    /// dropped. The handle is left open.
    ///
    /// # Errors
    /// - `ErrorKind::NotFound`: `handle` is not registered in this poller (polling
    ///   returns `Ok` there).
    /// - pollshot's error from the deregistration; it is removed all the same.
    fn remove_waitable(&self, handle: impl AsWaitable) -> io::Result<()>;
}

/// A waitable handle given by value, for [`PollerIocpExt::add_waitable`]: a
/// reference to anything with a raw handle (`&Child`), or a `RawHandle` itself.
pub trait AsRawWaitable {
    /// The handle.
    fn as_raw_handle(&self) -> RawHandle;
}

impl AsRawWaitable for RawHandle {
    fn as_raw_handle(&self) -> RawHandle {
        *self
    }
}

impl<T: AsRawHandle + ?Sized> AsRawWaitable for &T {
    fn as_raw_handle(&self) -> RawHandle {
        AsRawHandle::as_raw_handle(*self)
    }
}

/// A borrowed waitable handle, for [`PollerIocpExt::modify_waitable`] and
/// [`PollerIocpExt::remove_waitable`]: implemented for everything that is
/// [`AsHandle`].
pub trait AsWaitable: AsHandle {
    /// The borrowed handle.
    fn as_waitable(&self) -> BorrowedHandle<'_> {
        self.as_handle()
    }
}

impl<T: AsHandle + ?Sized> AsWaitable for T {}

fn not_registered(op: &str, handle: RawHandle) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("polling {op}: handle {handle:p} is not a waitable registered in this poller"),
    )
}

impl PollerIocpExt for Poller {
    fn post(&self, packet: CompletionPacket) -> io::Result<()> {
        let ev = packet.0;
        let interest = match (ev.readable, ev.writable) {
            (true, true) => Interest::BOTH,
            (true, false) => Interest::READABLE,
            (false, true) => Interest::WRITABLE,
            (false, false) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "polling post: the packet's event (key {}) has no direction; \
                         post Event::readable, writable or all",
                        ev.key
                    ),
                ))
            }
        };
        self.inner().post(ev.key, interest)
    }

    unsafe fn add_waitable(
        &self,
        handle: impl AsRawWaitable,
        interest: Event,
        mode: PollMode,
    ) -> io::Result<()> {
        check_key("add_waitable", interest.key)?;
        let level = level_of(mode)?;
        let handle = handle.as_raw_handle();
        if handle.is_null() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "polling add_waitable: the handle is null",
            ));
        }
        let mut table = self.write();
        if table.waitables.contains_key(&(handle as usize)) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "polling add_waitable: handle {handle:p} is registered already \
                     (modify_waitable it instead)"
                ),
            ));
        }
        // SAFETY: by this function's contract the handle stays open until it is
        // removed from this poller, which deregisters it.
        let token = unsafe { self.inner().register_waitable_raw(handle, interest.key) }?;
        let index = self.insert_slot(&mut table, token, interest, level, true)?;
        table.waitables.insert(handle as usize, index);
        Ok(())
    }

    fn modify_waitable(
        &self,
        handle: impl AsWaitable,
        interest: Event,
        mode: PollMode,
    ) -> io::Result<()> {
        check_key("modify_waitable", interest.key)?;
        let level = level_of(mode)?;
        let handle = handle.as_waitable().as_raw_handle();
        let table = self.read();
        let slot = table
            .waitables
            .get(&(handle as usize))
            .and_then(|&i| table.by_index(i))
            .ok_or_else(|| not_registered("modify_waitable", handle))?;
        self.modify_slot(slot, interest, level)
    }

    fn remove_waitable(&self, handle: impl AsWaitable) -> io::Result<()> {
        let handle = handle.as_waitable().as_raw_handle();
        let mut table = self.write();
        let index = table
            .waitables
            .remove(&(handle as usize))
            .ok_or_else(|| not_registered("remove_waitable", handle))?;
        self.remove_slot(table, index)
    }
}
