//! kqueue filters that are not descriptors: signals, processes, timers
//! (`EVFILT_SIGNAL`, `EVFILT_PROC`, `EVFILT_TIMER`, kqueue(2)), as polling 3.x offers
//! them through [`PollerKqueueExt`] and async-io uses them (`async_io::os::kqueue`).
//!
//! pollshot registers descriptors only (its kqueue backend has `EVFILT_READ` and
//! `EVFILT_WRITE` knotes and no way to name another filter), so the facade keeps
//! these knotes in a second kqueue of its own, made at the first
//! [`add_filter`](PollerKqueueExt::add_filter), with one thread blocked in kevent(2)
//! on it. Each event it collects is queued for the poller and wakes one waiter
//! with pollshot's `notify`; [`Poller::wait`] appends the queued events to what it
//! returns. Cost per filter event: one `kevent` in that thread, one notify (a
//! waker write and its read); nothing per wait while no filter fires.
//!
//! (The second kqueue is not nested in pollshot's poller as a readable descriptor:
//! libkqueue, the userspace kqueue that tests this on Linux, returns a pipe's write
//! end as the kqueue descriptor, which never becomes readable.)
//!
//! `PollMode` maps to the knote's flags: `Oneshot` is `EV_ONESHOT` (the knote is
//! removed when it fires; [`modify_filter`](PollerKqueueExt::modify_filter) adds it
//! again), `Level` none, `Edge` `EV_CLEAR`, `EdgeOneshot` both.

// kevent's field types and the constants' types differ between kqueues (NetBSD:
// u32 filter and flags; Apple: i16 and u16), so casts that are no-ops on one
// target are needed on another.
#![allow(clippy::unnecessary_cast)]

use super::PollerSealed;
use crate::{Event, PollMode, Poller};
use std::collections::HashSet;
use std::io;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::num::NonZeroI32;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Child;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

mod sys {
    //! The kqueue interface: libc's on the BSDs and Apple, libkqueue's on Linux
    //! (neither libc nor rustix declares kqueue there; pollshot's build script links
    //! the library for `--cfg pollshot_libkqueue`).

    #[cfg(target_os = "linux")]
    mod imp {
        use libc::{c_int, c_void};

        /// libkqueue's `struct kevent` (`<kqueue/sys/event.h>`, FreeBSD 11 layout).
        #[repr(C)]
        #[derive(Clone, Copy)]
        #[allow(non_camel_case_types)]
        pub(crate) struct kevent {
            pub ident: usize,
            pub filter: i16,
            pub flags: u16,
            pub fflags: u32,
            pub data: isize,
            pub udata: *mut c_void,
        }
        #[cfg(target_pointer_width = "64")]
        const _: () = assert!(std::mem::size_of::<kevent>() == 32);

        extern "C" {
            /// kqueue(2), libkqueue's.
            pub(crate) fn kqueue() -> c_int;
            /// kevent(2), libkqueue's.
            pub(crate) fn kevent(
                kq: c_int,
                changelist: *const kevent,
                nchanges: c_int,
                eventlist: *mut kevent,
                nevents: c_int,
                timeout: *const libc::timespec,
            ) -> c_int;
        }

        // `<kqueue/sys/event.h>`: the FreeBSD values.
        pub(crate) const EVFILT_READ: i16 = -1;
        pub(crate) const EVFILT_PROC: i16 = -5;
        pub(crate) const EVFILT_SIGNAL: i16 = -6;
        pub(crate) const EVFILT_TIMER: i16 = -7;
        pub(crate) const EV_ADD: u16 = 0x0001;
        pub(crate) const EV_DELETE: u16 = 0x0002;
        pub(crate) const EV_ONESHOT: u16 = 0x0010;
        pub(crate) const EV_CLEAR: u16 = 0x0020;
        pub(crate) const EV_RECEIPT: u16 = 0x0040;
        pub(crate) const EV_ERROR: u16 = 0x4000;
        pub(crate) const NOTE_EXIT: u32 = 0x8000_0000;
        pub(crate) const NOTE_FORK: u32 = 0x4000_0000;
        pub(crate) const NOTE_EXEC: u32 = 0x2000_0000;
    }

    #[cfg(not(target_os = "linux"))]
    mod imp {
        pub(crate) use libc::{kevent, kqueue};
        pub(crate) use libc::{
            EVFILT_PROC, EVFILT_READ, EVFILT_SIGNAL, EVFILT_TIMER, EV_ADD, EV_CLEAR, EV_DELETE,
            EV_ERROR, EV_ONESHOT, EV_RECEIPT, NOTE_EXEC, NOTE_EXIT, NOTE_FORK,
        };
    }

    pub(crate) use imp::*;

    /// A kevent record with the given fields, the rest (FreeBSD/NetBSD `ext`) zero.
    pub(crate) fn record(
        ident: usize,
        filter: i16,
        flags: u16,
        fflags: u32,
        data: isize,
        udata: usize,
    ) -> kevent {
        // SAFETY: `struct kevent` is integers and one pointer: all-zero is valid.
        let mut k: kevent = unsafe { std::mem::zeroed() };
        k.ident = ident as _;
        k.filter = filter as _;
        k.flags = flags as _;
        k.fflags = fflags as _;
        k.data = data as _;
        k.udata = udata as _;
        k
    }
}

/// Registration of kqueue filters that are not descriptors, by key, in a
/// [`Poller`]: polling 3.x's extension trait, implemented for the facade's
/// `Poller` with each filter `F` below ([`Signal`], [`Process`], [`Timer`]).
pub trait PollerKqueueExt<F: Filter>: PollerSealed {
    /// Adds `filter`'s knote; its events are reported by
    /// [`Poller::wait`] with `key` and `readable` set.
    ///
    /// # Errors
    /// - `ErrorKind::InvalidInput`: `key` is `usize::MAX`, or the kernel refused the
    ///   record (EINVAL: a bad signal number).
    /// - `ErrorKind::AlreadyExists`: this filter is registered already.
    /// - the kernel's answer otherwise (ESRCH: no such process; ENOMEM), or the
    ///   error making the second kqueue and its thread at the first call.
    fn add_filter(&self, filter: F, key: usize, mode: PollMode) -> io::Result<()>;

    /// Adds `filter`'s knote again, with `key` and `mode` (a oneshot knote that
    /// fired is gone until this is called).
    ///
    /// # Errors
    /// `ErrorKind::NotFound` when the filter was never added (or was deleted); else
    /// as [`add_filter`](Self::add_filter).
    fn modify_filter(&self, filter: F, key: usize, mode: PollMode) -> io::Result<()>;

    /// Removes `filter`'s knote (`EV_DELETE`; one that fired in oneshot mode is gone
    /// already, which is not an error).
    ///
    /// # Errors
    /// `ErrorKind::NotFound` when the filter is not registered; the kernel's answer
    /// otherwise.
    fn delete_filter(&self, filter: F) -> io::Result<()>;
}

/// A kqueue filter that [`PollerKqueueExt`] registers: [`Signal`], [`Process`],
/// [`Timer`] (sealed).
pub trait Filter: sealed::FilterSealed {}

mod sealed {
    /// What a filter is in the kernel: its identity and its record.
    pub trait FilterSealed {
        /// (filter, ident): the knote's identity in the kqueue.
        #[doc(hidden)]
        fn knote(&self) -> (i16, usize);
        /// (fflags, data) for `EV_ADD`.
        #[doc(hidden)]
        fn params(&self) -> (u32, isize);
    }
}

impl<T: sealed::FilterSealed + ?Sized> sealed::FilterSealed for &T {
    fn knote(&self) -> (i16, usize) {
        (**self).knote()
    }
    fn params(&self) -> (u32, isize) {
        (**self).params()
    }
}

impl<T: Filter + ?Sized> Filter for &T {}

/// A signal, by number (`EVFILT_SIGNAL`): reported each time it is delivered to
/// the process, whatever its disposition (a signal set to `SIG_IGN` is still
/// reported on BSD kernels; libkqueue needs it blocked instead).
#[derive(Debug, Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Signal(pub std::os::raw::c_int);

impl sealed::FilterSealed for Signal {
    fn knote(&self) -> (i16, usize) {
        (sys::EVFILT_SIGNAL as i16, self.0 as usize)
    }
    fn params(&self) -> (u32, isize) {
        (0, 0)
    }
}

impl Filter for Signal {}

/// A child process (`EVFILT_PROC`): its exit, fork or exec, by [`ProcessOps`].
#[derive(Debug)]
pub struct Process<'a> {
    pid: NonZeroI32,
    ops: ProcessOps,
    _child: PhantomData<&'a Child>,
}

/// What to watch a [`Process`] for.
#[derive(Debug, Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum ProcessOps {
    /// It exited (`NOTE_EXIT`).
    Exit,
    /// It forked (`NOTE_FORK`; not on libkqueue).
    Fork,
    /// It called exec (`NOTE_EXEC`; not on libkqueue).
    Exec,
}

impl<'a> Process<'a> {
    /// Watches `child` for `ops`.
    ///
    /// # Safety
    /// `child` must outlive the filter's registration (its process id must not be
    /// reused by another process while registered).
    pub unsafe fn new(child: &'a Child, ops: ProcessOps) -> Process<'a> {
        let pid = i32::try_from(child.id()).ok().and_then(NonZeroI32::new);
        Process {
            // A child's id is a positive pid_t.
            pid: pid.unwrap_or(NonZeroI32::MIN),
            ops,
            _child: PhantomData,
        }
    }

    /// Watches the process `pid` for `ops`.
    ///
    /// # Safety
    /// `pid` must name a child of this process that stays unreaped while the filter
    /// is registered.
    pub unsafe fn from_pid(pid: NonZeroI32, ops: ProcessOps) -> Process<'a> {
        Process {
            pid,
            ops,
            _child: PhantomData,
        }
    }
}

impl sealed::FilterSealed for Process<'_> {
    fn knote(&self) -> (i16, usize) {
        (sys::EVFILT_PROC as i16, self.pid.get() as usize)
    }
    fn params(&self) -> (u32, isize) {
        let note = match self.ops {
            ProcessOps::Exit => sys::NOTE_EXIT,
            ProcessOps::Fork => sys::NOTE_FORK,
            ProcessOps::Exec => sys::NOTE_EXEC,
        };
        (note as u32, 0)
    }
}

impl Filter for Process<'_> {}

/// A timer (`EVFILT_TIMER`) named `id`: fires after `timeout`, rounded up to whole
/// milliseconds (the unit every kqueue accepts); again every `timeout` unless
/// oneshot. Modifying it restarts it.
#[derive(Debug, Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timer {
    /// The timer's name (its knote ident), unique among this poller's timers.
    pub id: usize,
    /// The delay until it fires.
    pub timeout: Duration,
}

impl sealed::FilterSealed for Timer {
    fn knote(&self) -> (i16, usize) {
        (sys::EVFILT_TIMER as i16, self.id)
    }
    fn params(&self) -> (u32, isize) {
        let ms = self.timeout.as_nanos().div_ceil(1_000_000);
        (0, isize::try_from(ms).unwrap_or(isize::MAX))
    }
}

impl Filter for Timer {}

fn mode_flags(mode: PollMode) -> u16 {
    (match mode {
        PollMode::Oneshot => sys::EV_ONESHOT,
        PollMode::Level => 0,
        PollMode::Edge => sys::EV_CLEAR,
        PollMode::EdgeOneshot => sys::EV_ONESHOT | sys::EV_CLEAR,
    }) as u16
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain sets and vectors, each changed by one call: poisoning carries no
    // information.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The facade's second kqueue, its thread and what the thread collected.
pub(crate) struct Filters {
    side: OnceLock<Side>,
    init: Mutex<()>,
}

struct Side {
    kq: Arc<OwnedFd>,
    /// (filter, ident) of every registered knote.
    knotes: Mutex<HashSet<(i16, usize)>>,
    /// Events collected by the thread, not yet returned by a `wait`.
    queue: Arc<Mutex<Vec<Event>>>,
    /// Closing it (dropping the write end) tells the thread to stop.
    stop: Option<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

fn kevent_changes(kq: RawFd, changes: &[sys::kevent], ignore: &[i32]) -> io::Result<()> {
    let mut out: Vec<MaybeUninit<sys::kevent>> = Vec::with_capacity(changes.len());
    out.resize_with(changes.len(), MaybeUninit::uninit);
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `changes` holds `changes.len()` records; `out` has room for as many
    // (with EV_RECEIPT each change is answered by one entry, so the kernel never
    // stops early); `zero` outlives the call.
    let n = unsafe {
        sys::kevent(
            kq,
            changes.as_ptr(),
            changes.len() as _,
            out.as_mut_ptr().cast(),
            out.len() as _,
            &zero,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    for entry in &out[..n as usize] {
        // SAFETY: the kernel wrote the first `n` entries.
        let e = unsafe { entry.assume_init_ref() };
        if e.flags as u32 & sys::EV_ERROR as u32 != 0
            && e.data != 0
            && !ignore.contains(&(e.data as i32))
        {
            return Err(io::Error::from_raw_os_error(e.data as i32));
        }
    }
    Ok(())
}

impl Filters {
    pub(crate) fn new() -> Filters {
        Filters {
            side: OnceLock::new(),
            init: Mutex::new(()),
        }
    }

    fn side(&self, inner: &Arc<pollshot::Poller>) -> io::Result<&Side> {
        if let Some(side) = self.side.get() {
            return Ok(side);
        }
        let _init = lock(&self.init);
        if let Some(side) = self.side.get() {
            return Ok(side);
        }
        let side = Side::new(inner)?;
        Ok(self.side.get_or_init(|| side))
    }

    /// Moves the events the thread collected into `list`; how many.
    #[inline]
    pub(crate) fn take(&self, list: &mut Vec<Event>) -> usize {
        match self.side.get() {
            None => 0,
            Some(side) => {
                let mut queue = lock(&side.queue);
                let n = queue.len();
                list.append(&mut queue);
                n
            }
        }
    }

    pub(crate) fn add(
        &self,
        inner: &Arc<pollshot::Poller>,
        f: &dyn sealed::FilterSealed,
        key: usize,
        mode: PollMode,
        add: bool,
    ) -> io::Result<()> {
        crate::poller::check_key(if add { "add_filter" } else { "modify_filter" }, key)?;
        let side = self.side(inner)?;
        let id = f.knote();
        let mut knotes = lock(&side.knotes);
        if add && knotes.contains(&id) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "polling add_filter: filter {} ident {} is registered already",
                    id.0, id.1
                ),
            ));
        }
        if !add && !knotes.contains(&id) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "polling modify_filter: filter {} ident {} is not registered",
                    id.0, id.1
                ),
            ));
        }
        let (fflags, data) = f.params();
        let flags = sys::EV_ADD as u16 | sys::EV_RECEIPT as u16 | mode_flags(mode);
        let rec = sys::record(id.1, id.0, flags, fflags, data, key);
        kevent_changes(side.kq.as_raw_fd(), &[rec], &[])?;
        knotes.insert(id);
        Ok(())
    }

    pub(crate) fn delete(&self, f: &dyn sealed::FilterSealed) -> io::Result<()> {
        let id = f.knote();
        let not_found = || {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "polling delete_filter: filter {} ident {} is not registered",
                    id.0, id.1
                ),
            )
        };
        let side = self.side.get().ok_or_else(not_found)?;
        let mut knotes = lock(&side.knotes);
        if !knotes.remove(&id) {
            return Err(not_found());
        }
        let rec = sys::record(
            id.1,
            id.0,
            (sys::EV_DELETE | sys::EV_RECEIPT) as u16,
            0,
            0,
            0,
        );
        // ENOENT: a oneshot knote that fired is gone already.
        kevent_changes(side.kq.as_raw_fd(), &[rec], &[libc::ENOENT])
    }
}

impl Side {
    fn new(inner: &Arc<pollshot::Poller>) -> io::Result<Side> {
        // SAFETY: kqueue(2) takes no arguments.
        let raw = unsafe { sys::kqueue() };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let kq = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
        // SAFETY: plain fcntl(2) on our own descriptor.
        unsafe { libc::fcntl(kq.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe(2) made both; each is owned once, here.
        let (stop_r, stop_w) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        for fd in [stop_r.as_raw_fd(), stop_w.as_raw_fd()] {
            // SAFETY: as above.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
        // The stop pipe's read end: EOF (the write end closed) ends the thread.
        let rec = sys::record(
            stop_r.as_raw_fd() as usize,
            sys::EVFILT_READ as i16,
            (sys::EV_ADD | sys::EV_RECEIPT) as u16,
            0,
            0,
            usize::MAX,
        );
        kevent_changes(kq.as_raw_fd(), &[rec], &[])?;
        let queue = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (kq, queue, inner) = (Arc::clone(&kq), Arc::clone(&queue), Arc::downgrade(inner));
            std::thread::Builder::new()
                .name("polling-kqueue-filters".into())
                .spawn(move || collect(&kq, stop_r, &queue, &inner))?
        };
        Ok(Side {
            kq,
            knotes: Mutex::new(HashSet::new()),
            queue,
            stop: Some(stop_w),
            thread: Some(thread),
        })
    }
}

/// The thread: blocks in kevent(2) on the second kqueue, queues what fires and
/// wakes one waiter of the poller; ends when the stop pipe reports EOF.
fn collect(
    kq: &OwnedFd,
    _stop: OwnedFd,
    queue: &Mutex<Vec<Event>>,
    inner: &std::sync::Weak<pollshot::Poller>,
) {
    const BATCH: usize = 16;
    let mut buf = [MaybeUninit::<sys::kevent>::uninit(); BATCH];
    loop {
        // SAFETY: an empty change list; `buf` has room for BATCH records; a null
        // timeout blocks.
        let n = unsafe {
            sys::kevent(
                kq.as_raw_fd(),
                std::ptr::null(),
                0,
                buf.as_mut_ptr().cast(),
                BATCH as _,
                std::ptr::null(),
            )
        };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        let mut fired = false;
        {
            let mut q = lock(queue);
            for entry in &buf[..n as usize] {
                // SAFETY: the kernel wrote the first `n` entries.
                let e = unsafe { entry.assume_init_ref() };
                let key = e.udata as usize;
                if key == usize::MAX {
                    return; // the stop pipe
                }
                let mut ev = Event::readable(key);
                if e.flags as u32 & sys::EV_ERROR as u32 != 0 {
                    ev.extra = crate::event::Extra::ERR_ONLY;
                }
                q.push(ev);
                fired = true;
            }
        }
        if fired {
            match inner.upgrade() {
                Some(p) => {
                    let _ = p.notify();
                }
                None => return,
            }
        }
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<F: Filter> PollerKqueueExt<F> for Poller {
    fn add_filter(&self, filter: F, key: usize, mode: PollMode) -> io::Result<()> {
        self.filters.add(self.inner(), &filter, key, mode, true)
    }

    fn modify_filter(&self, filter: F, key: usize, mode: PollMode) -> io::Result<()> {
        self.filters.add(self.inner(), &filter, key, mode, false)
    }

    fn delete_filter(&self, filter: F) -> io::Result<()> {
        self.filters.delete(&filter)
    }
}
