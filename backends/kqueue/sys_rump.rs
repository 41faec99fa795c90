//! The system interface on a NetBSD rump kernel (`--cfg pollshot_rump`): the
//! kqueue of real NetBSD kernel code (`sys/kern/kern_event.c`) running inside a
//! Linux process, for testing the backend on a BSD kernel without one.
//!
//! `sys.rs` builds the records and reads the answers as on every kqueue; this
//! module gives it the rump kernel's `struct kevent`, its filter numbers, its
//! `kevent` and `kqueue` calls, and the descriptors the backend owns (the
//! kqueue and the waker's pipe), which are rump descriptors: numbers in the rump
//! kernel's table, not the host's, closed with `rump_sys_close` and read and
//! written with `rump_sys_read` and `rump_sys_write`. A registered descriptor is
//! a rump descriptor too (`Poller::register_raw`).
//!
//! The layout and the values are NetBSD 7.99's (`sys/sys/event.h`,
//! `sys/sys/stat.h`, `sys/sys/errno.h` of the sources the rump kernel was built
//! from, rumpkernel/src-netbsd at the revision buildrump.sh names): `struct
//! kevent` is 40 bytes with 32-bit `filter` and `flags`, `EVFILT_READ` is 0 and
//! `EVFILT_WRITE` 1, and there is no `EVFILT_USER` (the waker is a pipe). The
//! kernel's errno values are NetBSD's; they are translated to the host's here,
//! at the boundary, so that the backend's errno tests mean what they say.
//!
//! The rump kernel boots with the first poller (or the first descriptor
//! `pollshot::rump` makes). A forked child does not inherit the rump kernel's
//! threads: a poller on it is for one process.

use crate::kqueue_backend::rump::{boot, host_errno, last_error, making, RumpFd};
use libc::{c_int, c_void, size_t};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;

/// NetBSD 7.99's `struct kevent` (`sys/sys/event.h`): 40 bytes on 64-bit
/// targets, `filter` and `flags` 32 bits, `data` 64 bits.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub(crate) struct kevent {
    pub ident: usize,
    pub filter: u32,
    pub flags: u32,
    pub fflags: u32,
    pub data: i64,
    pub udata: *mut c_void,
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(std::mem::size_of::<kevent>() == 40);
    let k = MaybeUninit::<kevent>::uninit();
    let base = k.as_ptr();
    // A field's byte offset in `kevent`.
    macro_rules! offset {
        ($field:ident) => {
            // SAFETY: only field addresses are computed (no read of the
            // uninitialised value), within the one allocation `k`.
            unsafe {
                std::ptr::addr_of!((*base).$field)
                    .cast::<u8>()
                    .offset_from(base.cast::<u8>())
            }
        };
    }
    let offsets = [
        offset!(filter),
        offset!(flags),
        offset!(fflags),
        offset!(data),
        offset!(udata),
    ];
    // ident @0, filter @8, flags @12, fflags @16, data @24, udata @32.
    assert!(offsets[0] == 8 && offsets[1] == 12 && offsets[2] == 16);
    assert!(offsets[3] == 24 && offsets[4] == 32);
};

/// The record type `sys.rs` builds.
pub(crate) type KEvent = kevent;

/// `EVFILT_READ` (`sys/sys/event.h`: 0U).
pub(crate) const EVFILT_READ: u32 = 0;
/// `EVFILT_WRITE` (`sys/sys/event.h`: 1U).
pub(crate) const EVFILT_WRITE: u32 = 1;

/// Errors from `EV_ADD` meaning "this descriptor cannot be polled" (host
/// values: translated from NetBSD's by [`kevent`]), as on the BSDs.
pub(crate) const NOT_POLLABLE: &[i32] = &[libc::EINVAL, libc::EOPNOTSUPP, libc::ENODEV];

/// A BSD kernel answers a refused change in a waiting call with an `EV_ERROR`
/// entry and returns at once (`kqueue_scan` is not reached: `kevent1` returns
/// after `kqueue_register` failed with the event list written).
pub(crate) const WAIT_RETURNS_CHANGE_ERRORS: bool = true;

/// Flags added to every re-arm record: none, as on every BSD kernel.
pub(crate) const ENABLE_EXTRA: u16 = 0;

// NetBSD's values (`sys/sys/stat.h`).
const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;

// The rump kernel's system calls (librump). `<rump/rump_syscalls.h>` renames
// each `rump_sys_NAME` to the symbol below (`__RENAME`), the versioned one where
// NetBSD versioned the call (kevent50, fstat50). Linked by build.rs
// (`POLLSHOT_RUMP_DIR`), so `cargo check` works without the libraries.
extern "C" {
    #[link_name = "rump___sysimpl_kqueue"]
    fn rump_sys_kqueue() -> c_int;
    #[link_name = "rump___sysimpl_kevent50"]
    fn rump_sys_kevent(
        kq: c_int,
        changelist: *const kevent,
        nchanges: size_t,
        eventlist: *mut kevent,
        nevents: size_t,
        timeout: *const libc::timespec,
    ) -> c_int;
    #[link_name = "rump___sysimpl_fstat50"]
    fn rump_sys_fstat(fd: c_int, st: *mut c_void) -> c_int;
}

/// `rump_sys_kevent`, with `sys::call`'s signature: NetBSD's errno values in a
/// failure and in the written `EV_ERROR` entries' `data` become the host's.
///
/// # Safety
/// As kevent(2): `changelist` holds `nchanges` records, `eventlist` has room for
/// `nevents`, `timeout` is null or valid for the call.
pub(crate) unsafe fn kevent(
    kq: c_int,
    changelist: *const kevent,
    nchanges: size_t,
    eventlist: *mut kevent,
    nevents: size_t,
    timeout: *const libc::timespec,
) -> c_int {
    // SAFETY: the caller's promises are kevent(2)'s.
    let n = unsafe { rump_sys_kevent(kq, changelist, nchanges, eventlist, nevents, timeout) };
    if n < 0 {
        let e = last_error().raw_os_error().unwrap_or(libc::EIO);
        // SAFETY: __errno_location returns this thread's errno slot, always valid.
        unsafe { *libc::__errno_location() = e };
        return n;
    }
    for i in 0..n as usize {
        // SAFETY: the kernel wrote the first `n` entries, `n <= nevents`.
        let k = unsafe { &mut *eventlist.add(i) };
        if k.flags & u32::from(super::changes::EV_ERROR) != 0 {
            k.data = host_errno(i32::try_from(k.data).unwrap_or(libc::EIO)).into();
        }
    }
    n
}

/// The descriptors the backend owns (the kqueue, the waker's pipe ends): the
/// rump kernel's.
pub(crate) type Fd = RumpFd;

/// A new kqueue in the rump kernel, which boots first if no one booted it
/// (`rump::boot`). (Close-on-exec means nothing there: a rump kernel runs no
/// program.)
pub(crate) fn new_kqueue() -> io::Result<Fd> {
    boot()?;
    // Held off by a dup2 (`rump::making`).
    let _making = making();
    // SAFETY: kqueue(2) takes no argument.
    let fd = unsafe { rump_sys_kqueue() };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: kqueue(2) returned a new number that nothing else owns.
    Ok(unsafe { RumpFd::from_raw(fd) })
}

/// The waker's pipe in the rump kernel, both ends non-blocking: `(read, write)`.
pub(crate) fn waker_pipe() -> io::Result<(Fd, Fd)> {
    RumpFd::pipe()
}

/// Writes one byte to the waker's pipe. A full pipe already wakes its reader:
/// not an error.
pub(crate) fn wake_pipe(w: &Fd) -> io::Result<()> {
    match w.write(&[1]) {
        Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
        _ => Ok(()),
    }
}

/// Reads the waker's pipe empty; returns the reads made (one unless more than
/// 64 bytes were queued).
pub(crate) fn drain_pipe(r: &Fd) -> u64 {
    let mut buf = [0u8; 64];
    let mut reads = 0;
    loop {
        reads += 1;
        match r.read(&mut buf) {
            Ok(n) if n == buf.len() => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            _ => return reads,
        }
    }
}

/// Whether the rump descriptor `fd` is a regular file (fstat(2): `st_mode` is
/// the `u32` at offset 8 of NetBSD's `struct stat`, after the 64-bit
/// `st_dev`). Errors: the kernel's (EBADF for a closed number).
pub(crate) fn is_regular_file(fd: RawFd) -> io::Result<bool> {
    // NetBSD's `struct stat` is 152 bytes on 64-bit targets: room to spare, and
    // 8-byte aligned.
    let mut st = [0u64; 32];
    // SAFETY: the kernel writes one `struct stat` (less than 256 bytes) into `st`.
    if unsafe { rump_sys_fstat(fd, st.as_mut_ptr().cast()) } < 0 {
        return Err(last_error());
    }
    // st_mode: the low half of the second u64 (little-endian) or the high half
    // (big-endian): the u32 at byte offset 8 either way.
    let bytes = st[1].to_ne_bytes();
    let mode = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    Ok(mode & S_IFMT == S_IFREG)
}
