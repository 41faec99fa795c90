//! The system interface: libc's declarations on the BSDs and Apple, our own for
//! libkqueue on Linux (neither libc nor rustix declares kqueue there). Everything
//! that differs between kqueue implementations is in this module (and, for a
//! NetBSD rump kernel, `--cfg pollshot_rump`, in `sys_rump.rs`).

use super::changes::{self, Action, Change, Filter};
use crate::backend::Tag;
use crate::token::{pack_usize, unpack_usize};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
#[cfg(not(pollshot_rump))]
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::Duration;

#[cfg(all(pollshot_rump, pollshot_libkqueue))]
compile_error!("--cfg pollshot_rump and --cfg pollshot_libkqueue are two kqueues: pass one");

// A NetBSD rump kernel (`--cfg pollshot_rump`): its declarations and descriptors.
#[cfg(pollshot_rump)]
#[path = "sys_rump.rs"]
mod rump;
#[cfg(pollshot_rump)]
pub(super) use self::rump::{
    drain_pipe, is_regular_file, new_kqueue, wake_pipe, waker_pipe, Fd, KEvent, ENABLE_EXTRA,
    NOT_POLLABLE, WAIT_RETURNS_CHANGE_ERRORS,
};

cfg_if::cfg_if! {
    if #[cfg(pollshot_rump)] {
        use self::rump::{kevent, EVFILT_READ, EVFILT_WRITE};
    } else if #[cfg(target_os = "linux")] {
        use libc::{c_int, c_void};

        /// libkqueue's `struct kevent` (`<kqueue/sys/event.h>`): 32 bytes on
        /// 64-bit targets, the FreeBSD 11 layout.
        #[repr(C)]
        #[derive(Clone, Copy)]
        #[allow(non_camel_case_types)]
        pub(super) struct kevent {
            pub ident: usize,
            pub filter: i16,
            pub flags: u16,
            pub fflags: u32,
            pub data: isize,
            pub udata: *mut c_void,
        }

        pub(super) type KEvent = kevent;

        const EVFILT_READ: i16 = -1;
        const EVFILT_WRITE: i16 = -2;
        const EVFILT_USER: i16 = -11;
        const NOTE_TRIGGER: u32 = 0x0100_0000;

        // The layout libkqueue was checked to have (a C probe printed the offsets):
        // ident @0, filter @8, flags @10, fflags @12, data @16, udata @24.
        #[cfg(target_pointer_width = "64")]
        const _: () = {
            assert!(std::mem::size_of::<kevent>() == 32);
            let k = MaybeUninit::<kevent>::uninit();
            let base = k.as_ptr();
            // SAFETY: only field addresses are computed (no read of the
            // uninitialised value), within the one allocation `k`.
            let offsets = unsafe {
                [
                    std::ptr::addr_of!((*base).ident).cast::<u8>().offset_from(base.cast::<u8>()),
                    std::ptr::addr_of!((*base).filter).cast::<u8>().offset_from(base.cast::<u8>()),
                    std::ptr::addr_of!((*base).flags).cast::<u8>().offset_from(base.cast::<u8>()),
                    std::ptr::addr_of!((*base).fflags).cast::<u8>().offset_from(base.cast::<u8>()),
                    std::ptr::addr_of!((*base).data).cast::<u8>().offset_from(base.cast::<u8>()),
                    std::ptr::addr_of!((*base).udata).cast::<u8>().offset_from(base.cast::<u8>()),
                ]
            };
            assert!(offsets[0] == 0 && offsets[1] == 8 && offsets[2] == 10);
            assert!(offsets[3] == 12 && offsets[4] == 16 && offsets[5] == 24);
        };

        // The library is linked by build.rs (found with pkg-config or
        // LIBKQUEUE_DIR), so `cargo check` works without it.
        extern "C" {
            /// kqueue(2), libkqueue's.
            fn kqueue() -> c_int;
            /// kevent(2), libkqueue's.
            fn kevent(
                kq: c_int,
                changelist: *const kevent,
                nchanges: c_int,
                eventlist: *mut kevent,
                nevents: c_int,
                timeout: *const libc::timespec,
            ) -> c_int;
        }

        /// Errors from `EV_ADD` meaning "this descriptor cannot be polled": EINVAL
        /// as on the BSDs, and EPERM, which libkqueue passes on from epoll
        /// (`/dev/null`, checked with a C probe).
        pub(super) const NOT_POLLABLE: &[i32] = &[libc::EINVAL, libc::EPERM];

        /// Whether a waiting call that carried changes returns their `EV_ERROR`
        /// entries even when no event fires. BSD kernels return at once with
        /// them. libkqueue keeps them only when a real event arrives in the same
        /// call and drops them when it returns 0 (checked with a C probe), so
        /// the backend re-submits carried changes with receipts after an empty
        /// wait.
        pub(super) const WAIT_RETURNS_CHANGE_ERRORS: bool = false;

        /// Flags added to every re-arm record (`EV_ADD | EV_ENABLE |
        /// EV_DISPATCH`). libkqueue (2.7.0) stores a record's `udata` only
        /// after its filter's modify step succeeded (`kevent_copyin_one`), and
        /// that step, for a socket or pipe knote, accepts only a record with
        /// `EV_CLEAR` (`evfilt_read_knote_modify`, `evfilt_write_knote_modify`).
        /// With `EV_CLEAR` too it enables the knote, then runs that step, which
        /// stores `udata` and leaves the knote's flags alone (the knote stays
        /// level-triggered: `EV_CLEAR` counts only when a knote is created, and
        /// a re-arm is only sent for a knote the backend added). libkqueue only:
        /// a BSD kernel must never see `EV_CLEAR` with `EV_DISPATCH`.
        pub(super) const ENABLE_EXTRA: u16 = changes::EV_CLEAR;
    } else {
        use libc::{kevent, EVFILT_READ, EVFILT_WRITE};
        #[cfg(not(any(target_os = "openbsd", target_os = "netbsd", pollshot_rump)))]
        use libc::{EVFILT_USER, NOTE_TRIGGER};

        /// The target's `struct kevent` (field types differ: NetBSD's `filter`
        /// and `flags` are 32 bits, FreeBSD 12+ has `ext[4]`).
        pub(super) type KEvent = libc::kevent;

        // The portable flag values the translator uses are the target's (u16 on
        // most targets, u32 on NetBSD).
        #[allow(clippy::unnecessary_cast)]
        const _: () = {
            assert!(libc::EV_ADD as u32 == changes::EV_ADD as u32);
            assert!(libc::EV_DELETE as u32 == changes::EV_DELETE as u32);
            assert!(libc::EV_ENABLE as u32 == changes::EV_ENABLE as u32);
            assert!(libc::EV_DISABLE as u32 == changes::EV_DISABLE as u32);
            assert!(libc::EV_CLEAR as u32 == changes::EV_CLEAR as u32);
            assert!(libc::EV_RECEIPT as u32 == changes::EV_RECEIPT as u32);
            assert!(libc::EV_DISPATCH as u32 == changes::EV_DISPATCH as u32);
            assert!(libc::EV_ERROR as u32 == changes::EV_ERROR as u32);
            assert!(libc::EV_EOF as u32 == changes::EV_EOF as u32);
        };

        /// Errors from `EV_ADD` meaning "this descriptor cannot be polled" (some
        /// devices: EINVAL; a device without a kqueue filter: EOPNOTSUPP or ENODEV).
        pub(super) const NOT_POLLABLE: &[i32] = &[libc::EINVAL, libc::EOPNOTSUPP, libc::ENODEV];

        /// BSD kernels answer a refused change in a waiting call with an
        /// `EV_ERROR` entry and return at once without waiting.
        pub(super) const WAIT_RETURNS_CHANGE_ERRORS: bool = true;

        /// Flags added to every re-arm record: none. Its `EV_ADD` makes every
        /// BSD kernel re-run the filter and store `udata` (see
        /// `backends/kqueue/mod.rs`, "The re-arm record").
        pub(super) const ENABLE_EXTRA: u16 = 0;
    }
}

/// Whether `udata` carries the arming generation (`Driver::TAG_IS_GENERATION`),
/// so that an event read before a re-arm is told from one of the re-arm. It
/// needs a kernel that stores `udata` when a record re-arms a knote, which the
/// re-arm record's `EV_ADD` makes every kernel do (`kqueue_register` on
/// FreeBSD, NetBSD, OpenBSD and DragonFly, `kevent_register` on XNU; libkqueue
/// with [`ENABLE_EXTRA`]), and 32 bits for the generation in `udata` (64-bit
/// targets). A 32-bit `udata` has 12 bits left after the slot: there `udata`
/// carries the slot's incarnation, fixed at `EV_ADD`, and an event is current
/// while the table says armed.
pub(super) const UDATA_IS_GENERATION: bool = cfg!(target_pointer_width = "64");

/// The `udata` of a registration's records for the arming `tag`: slot and
/// arming generation where [`UDATA_IS_GENERATION`], else slot and incarnation
/// (fixed at `EV_ADD`). See `token.rs` for the packing.
pub(super) fn tag_udata(tag: Tag) -> usize {
    if UDATA_IS_GENERATION {
        pack_usize(tag.slot, tag.generation)
    } else {
        pack_usize(tag.slot, tag.incarnation)
    }
}

/// The stamp an event of the arming `tag` installs carries: [`tag_udata`]'s
/// high part, as it survives packing.
pub(super) fn tag_stamp(tag: Tag) -> u32 {
    unpack_usize(tag_udata(tag)).1
}

/// Whether the waker is an `EVFILT_USER` knote (else a pipe). OpenBSD and NetBSD
/// gained `EVFILT_USER` recently (NetBSD 10), so they use the pipe.
pub(super) const USER_WAKER: bool = cfg!(not(any(
    target_os = "openbsd",
    target_os = "netbsd",
    pollshot_rump
)));

/// What a returned kevent is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Fd(Filter),
    User,
    Other,
}

/// A record with every field given; the rest (NetBSD/FreeBSD `ext`) zero.
#[allow(clippy::unnecessary_cast)] // field types differ between targets
fn make(ident: usize, filter: Filter, flags: u16, udata: usize) -> KEvent {
    // SAFETY: `struct kevent` is integers and one pointer: all-zero is valid.
    let mut k: KEvent = unsafe { std::mem::zeroed() };
    k.ident = ident as _;
    k.filter = match filter {
        Filter::Read => EVFILT_READ,
        Filter::Write => EVFILT_WRITE,
    };
    k.flags = flags as _;
    k.udata = udata as _;
    k
}

/// The kevent for a change record, with `extra` flags (`EV_RECEIPT`), and
/// [`ENABLE_EXTRA`] on an `EV_ENABLE`.
pub(super) fn record(c: &Change, extra: u16) -> KEvent {
    let enable = if c.action == Action::Enable {
        ENABLE_EXTRA
    } else {
        0
    };
    make(c.fd as usize, c.filter, c.flags() | extra | enable, c.udata)
}

/// The pipe waker's registration: its read end, `EV_CLEAR` (each write that
/// finds the knote idle is reported once; the wait that gets it drains the
/// pipe).
///
/// Not level-triggered: NetBSD 8/9's `kqueue_scan` (`kern_event.c` 1.83-1.88)
/// takes a knote off the queue, drops `kq_lock` to run its filter, and puts a
/// level-triggered knote that still fires back at the tail without a
/// `cv_broadcast`; a thread that entered `kevent` meanwhile found `kq_count` 0
/// and went to sleep. The knote then stays queued and active after the reader
/// drained the pipe, so the next wake-up's write finds it queued
/// (`knote_activate` broadcasts only when it queues a knote) and wakes no
/// sleeper: with several threads in `deliver`, a notify, a shutdown or a
/// passed-on wake-up was lost until a timeout (a NetBSD rump kernel of that
/// code: `tests/rump_suite.rs`, `wake_4_notifies_end_4_blocked_delivers` and
/// `api_shutdown_stops_k_workers_blocked_or_about_to_block_1000_trials`). An
/// `EV_CLEAR` knote is never put back by the scan: the next write's
/// `knote_activate` queues it and broadcasts.
pub(super) fn pipe_waker(fd: RawFd) -> KEvent {
    make(
        fd as usize,
        Filter::Read,
        changes::EV_ADD | changes::EV_CLEAR | changes::EV_RECEIPT,
        0,
    )
}

/// The `EVFILT_USER` waker's registration (ident 0, `EV_CLEAR`: one trigger is
/// reported once), or its trigger.
#[cfg(not(any(target_os = "openbsd", target_os = "netbsd", pollshot_rump)))]
#[allow(clippy::unnecessary_cast)]
pub(super) fn user_waker(trigger: bool) -> KEvent {
    // SAFETY: as in `make`.
    let mut k: KEvent = unsafe { std::mem::zeroed() };
    k.filter = EVFILT_USER;
    if trigger {
        k.fflags = NOTE_TRIGGER;
    } else {
        k.flags = (changes::EV_ADD | changes::EV_CLEAR | changes::EV_RECEIPT) as _;
    }
    k
}

#[cfg(any(target_os = "openbsd", target_os = "netbsd", pollshot_rump))]
pub(super) fn user_waker(_trigger: bool) -> KEvent {
    unreachable!("no EVFILT_USER waker on this target")
}

/// What `k` is about.
pub(super) fn kind(k: &KEvent) -> Kind {
    if k.filter == EVFILT_READ {
        Kind::Fd(Filter::Read)
    } else if k.filter == EVFILT_WRITE {
        Kind::Fd(Filter::Write)
    } else if USER_WAKER && is_user(k) {
        Kind::User
    } else {
        Kind::Other
    }
}

#[cfg(not(any(target_os = "openbsd", target_os = "netbsd", pollshot_rump)))]
fn is_user(k: &KEvent) -> bool {
    k.filter == EVFILT_USER
}

#[cfg(any(target_os = "openbsd", target_os = "netbsd", pollshot_rump))]
fn is_user(_: &KEvent) -> bool {
    false
}

/// `ident`.
#[allow(clippy::unnecessary_cast)]
pub(super) fn ident(k: &KEvent) -> usize {
    k.ident as usize
}

/// `flags`, the bits the portable code knows (all below 2^16).
#[allow(clippy::unnecessary_cast)]
pub(super) fn flags(k: &KEvent) -> u16 {
    k.flags as u16
}

/// `fflags`.
pub(super) fn fflags(k: &KEvent) -> u32 {
    k.fflags
}

/// `data` as an errno, for an `EV_ERROR` entry (0: the change succeeded).
#[allow(clippy::unnecessary_cast)]
pub(super) fn errno(k: &KEvent) -> i32 {
    i32::try_from(k.data as i64).unwrap_or(libc::EINVAL)
}

/// `udata`.
pub(super) fn udata(k: &KEvent) -> usize {
    k.udata as usize
}

/// The descriptors the backend owns (the kqueue, the waker's pipe): the host's
/// (on a rump kernel, its own: `sys_rump.rs`).
#[cfg(not(pollshot_rump))]
pub(super) type Fd = OwnedFd;

/// The waker's pipe, its wake-up and its drain: the host's.
#[cfg(not(pollshot_rump))]
pub(super) use crate::pipe::{
    drain as drain_pipe, nonblocking_pipe as waker_pipe, wake as wake_pipe,
};

/// Whether `fd` is a regular file (fstat(2)). Errors: the kernel's (EBADF for a
/// closed number).
#[cfg(not(pollshot_rump))]
pub(super) fn is_regular_file(fd: RawFd) -> io::Result<bool> {
    use rustix::fs::FileType;
    // SAFETY: the number is only passed to fstat(2), which answers EBADF for a
    // closed one; it is never closed or used for I/O here.
    let st = rustix::fs::fstat(unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) })?;
    Ok(FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
}

/// A new kqueue, close-on-exec.
#[cfg(not(pollshot_rump))]
pub(super) fn new_kqueue() -> io::Result<OwnedFd> {
    #[cfg(target_os = "netbsd")]
    // SAFETY: kqueue1(2) takes flags only.
    let fd = unsafe { libc::kqueue1(libc::O_CLOEXEC) };
    #[cfg(all(not(target_os = "netbsd"), target_os = "linux"))]
    // SAFETY: kqueue(2) takes no argument.
    let fd = unsafe { kqueue() };
    #[cfg(all(not(target_os = "netbsd"), not(target_os = "linux")))]
    // SAFETY: kqueue(2) takes no argument.
    let fd = unsafe { libc::kqueue() };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: kqueue returned a new descriptor that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    #[cfg(not(target_os = "netbsd"))]
    rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)?;
    Ok(owned)
}

/// libkqueue (2.7.0) answers an `EV_ENABLE | EV_RECEIPT` record for a socket or
/// pipe knote with whatever `errno` the calling thread had: it enables the
/// knote, then its filter's modify step refuses a receipt without `EV_CLEAR`
/// and sets no errno (`kevent_copyin_one`, `evfilt_read_knote_modify`). With
/// errno cleared first that answer reads as 0, which is the truth (the knote was
/// enabled); a real refusal of the enable still sets its own errno.
#[cfg(all(target_os = "linux", not(pollshot_rump)))]
fn clear_errno() {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = 0 };
}

/// Largest `tv_sec` passed: Darwin answers EINVAL to values near `i64::MAX`.
const MAX_SECS: u64 = 100_000_000;

/// kevent(2): submit `changes`, then wait up to `timeout` (`None`: forever) for
/// events written into `events`. Returns how many entries were written.
#[allow(clippy::unnecessary_cast)]
pub(super) fn call(
    kq: RawFd,
    changes: &[KEvent],
    events: &mut [MaybeUninit<KEvent>],
    timeout: Option<Duration>,
) -> io::Result<usize> {
    let ts = timeout.map(|t| {
        // SAFETY: `timespec` is integers (plus padding on some targets): all-zero is valid.
        let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
        ts.tv_sec = t.as_secs().min(MAX_SECS) as _;
        ts.tv_nsec = t.subsec_nanos() as _;
        ts
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    #[cfg(all(target_os = "linux", not(pollshot_rump)))]
    clear_errno();
    // SAFETY: `changes` holds `changes.len()` initialised records; the kernel
    // writes at most `events.len()` entries into `events` (MaybeUninit has the
    // layout of KEvent); `tsp` is null or points at `ts`, alive for the call.
    let n = unsafe {
        kevent(
            kq,
            changes.as_ptr(),
            changes.len() as _,
            events.as_mut_ptr().cast::<KEvent>(),
            events.len() as _,
            tsp,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
