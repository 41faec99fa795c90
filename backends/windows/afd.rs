//! The AFD side: the `\Device\Afd` handle polls are issued through, one poll
//! operation per arming, the socket's base handle, and the AFD event bits.
//!
//! `IOCTL_AFD_POLL` is the request Winsock's own `select` and `WSAPoll` are built
//! on: given a socket's base handle and an event mask, it completes once, when one
//! of the events is (or already was) true, and must be issued again to hear more.
//! Issued on an AFD handle associated with a completion port, its completion is a
//! packet on that port whose `lpOverlapped` is the request's APC context.
//! The request's layout and bits are wine's (`include/wine/afd.h`, the server
//! side in `server/sock.c`, `poll_socket`), which match Windows' `afd.sys`.

use crate::afd_bits::{events_for, readiness, HUNG_UP};
use crate::event::Readiness;
use crate::interest::Interest;
use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::io;
use std::mem::size_of;
use std::os::windows::io::RawSocket;
use std::ptr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Once;
use windows_sys::Wdk::Foundation::OBJECT_ATTRIBUTES;
use windows_sys::Wdk::Storage::FileSystem::{NtCancelIoFileEx, NtCreateFile, FILE_OPEN};
use windows_sys::Wdk::System::IO::NtDeviceIoControlFile;
use windows_sys::Win32::Foundation::{
    RtlNtStatusToDosError, HANDLE, NTSTATUS, STATUS_NOT_FOUND, STATUS_PENDING, UNICODE_STRING,
};
use windows_sys::Win32::Networking::WinSock::{
    getsockopt, WSAGetLastError, WSAIoctl, WSAStartup, SIO_BASE_HANDLE, SOCKET, SOCKET_ERROR,
    SOL_SOCKET, SO_TYPE, WSADATA,
};
use windows_sys::Win32::Storage::FileSystem::{FILE_SHARE_READ, FILE_SHARE_WRITE, SYNCHRONIZE};
use windows_sys::Win32::System::IO::IO_STATUS_BLOCK;

/// `IOCTL_AFD_POLL`: `CTL_CODE(FILE_DEVICE_NETWORK, 9, METHOD_BUFFERED, FILE_ANY_ACCESS)`.
const IOCTL_AFD_POLL: u32 = 0x0001_2024;

/// `NT_ERROR(status)`: the severity bits are 11.
pub(crate) const fn nt_error(status: NTSTATUS) -> bool {
    (status as u32) >> 30 == 3
}

/// An NTSTATUS as an `io::Error` with its Win32 error code (RtlNtStatusToDosError).
pub(crate) fn nt_io_error(status: NTSTATUS) -> io::Error {
    // SAFETY: a pure translation of a status value; no pointer is involved.
    let code = unsafe { RtlNtStatusToDosError(status) };
    io::Error::from_raw_os_error(code as i32)
}

/// `AFD_POLL_HANDLE_INFO`: one socket of a poll request.
#[repr(C)]
struct HandleInfo {
    handle: HANDLE,
    events: u32,
    status: NTSTATUS,
}

/// `AFD_POLL_INFO` with one socket: the ioctl's input and, rewritten by the
/// driver, its output (`number_of_handles` becomes the sockets that fired).
#[repr(C)]
struct PollInfo {
    /// Absolute or relative NT time; `i64::MAX` never expires.
    timeout: i64,
    number_of_handles: u32,
    /// Exclusive (a BOOLEAN and padding): 0, so a second poll on the socket
    /// leaves the first one alone.
    exclusive: u32,
    handles: [HandleInfo; 1],
}

const _: () = assert!(size_of::<PollInfo>() == 32);

/// [`Op::state`] bits: the completion was dequeued; the poll was cancelled (or
/// is to be dropped) by the backend.
const DONE: u8 = 1;
const CANCELLED: u8 = 2;

/// One `IOCTL_AFD_POLL` in flight: the memory the driver writes (the status
/// block and the poll info), and who it is for. It is shared (an `Arc`) by the
/// registration's record and the in-flight request, whose reference rides in
/// the completion packet as the APC context; it is freed when both are gone, so
/// neither a deregister nor a closed socket frees memory the driver may still
/// write.
pub(crate) struct Op {
    iosb: UnsafeCell<IO_STATUS_BLOCK>,
    info: UnsafeCell<PollInfo>,
    /// The registration's slot and the arming generation this poll installs.
    pub(crate) slot: u32,
    pub(crate) generation: u32,
    state: AtomicU8,
}

// SAFETY: the cells are written by the driver while the poll is in flight and
// read by this crate only after its completion was dequeued (`events`), which
// the completion port orders after the driver's writes; every other field is
// immutable or atomic. NtCancelIoFileEx takes the status block's address only.
unsafe impl Sync for Op {}
// SAFETY: as above; nothing in it is tied to a thread.
unsafe impl Send for Op {}

/// What the backend does with a dequeued completion.
pub(crate) enum Outcome {
    /// The backend cancelled this poll (disarm, re-arm, deregister): drop it.
    Cancelled,
    /// The poll completed for the registration with this readiness.
    Ready(Readiness),
}

impl Op {
    /// A poll of `base` for `interest`, for `slot` at `generation`.
    pub(crate) fn new(base: RawSocket, slot: u32, generation: u32, interest: Interest) -> Op {
        Op {
            iosb: UnsafeCell::new(IO_STATUS_BLOCK::default()),
            info: UnsafeCell::new(PollInfo {
                timeout: i64::MAX,
                number_of_handles: 1,
                exclusive: 0,
                handles: [HandleInfo {
                    handle: base as HANDLE,
                    events: events_for(interest),
                    status: 0,
                }],
            }),
            slot,
            generation,
            state: AtomicU8::new(0),
        }
    }

    /// Marks the poll cancelled; true if it still needs a cancel request (it was
    /// neither dequeued nor cancelled before).
    pub(crate) fn mark_cancelled(&self) -> bool {
        self.state.fetch_or(CANCELLED, Ordering::AcqRel) & (DONE | CANCELLED) == 0
    }

    /// The completion with `status` (the packet's) was dequeued: what it means.
    pub(crate) fn complete(&self, status: NTSTATUS) -> Outcome {
        if self.state.fetch_or(DONE, Ordering::AcqRel) & CANCELLED != 0 {
            return Outcome::Cancelled;
        }
        if nt_error(status) {
            // Cancelled by someone else (STATUS_CANCELLED: the issuing thread's
            // exit on systems without thread-agnostic I/O) or failed: end the
            // arming with what can be said. An empty event sends the caller back
            // to its I/O call, which reports the error or WouldBlock; never a lost
            // arming.
            if status == windows_sys::Win32::Foundation::STATUS_CANCELLED {
                return Outcome::Ready(Readiness::EMPTY);
            }
            return Outcome::Ready(Readiness::ERROR.union(HUNG_UP));
        }
        // SAFETY: the completion was dequeued, so the driver has finished writing
        // the poll info (see the `Sync` impl); this is the only reader.
        let info = unsafe { &*self.info.get() };
        if info.number_of_handles == 0 {
            return Outcome::Ready(Readiness::EMPTY);
        }
        Outcome::Ready(readiness(info.handles[0].events))
    }
}

/// An AFD helper handle: `\Device\Afd\pollshot` opened with NtCreateFile.
pub(crate) struct AfdHandle(pub(crate) HANDLE);

// SAFETY: a kernel handle may be used from any thread at once; poll and cancel
// requests on it are independent (the driver serialises its own queue).
unsafe impl Send for AfdHandle {}
// SAFETY: as above.
unsafe impl Sync for AfdHandle {}

impl AfdHandle {
    /// Opens one (no socket is created: the handle only carries poll requests).
    pub(crate) fn open() -> io::Result<AfdHandle> {
        winsock();
        let name: Vec<u16> = "\\Device\\Afd\\pollshot".encode_utf16().collect();
        let ustr = UNICODE_STRING {
            Length: (name.len() * 2) as u16,
            MaximumLength: (name.len() * 2) as u16,
            Buffer: name.as_ptr() as *mut u16,
        };
        let attrs = OBJECT_ATTRIBUTES {
            Length: size_of::<OBJECT_ATTRIBUTES>() as u32,
            RootDirectory: ptr::null_mut(),
            ObjectName: &ustr,
            Attributes: 0,
            SecurityDescriptor: ptr::null(),
            SecurityQualityOfService: ptr::null(),
        };
        let mut handle: HANDLE = ptr::null_mut();
        let mut iosb = IO_STATUS_BLOCK::default();
        // SAFETY: every pointer is to a live local for the length of the call:
        // `attrs` names `ustr`, whose buffer `name` outlives the call; no EA
        // buffer. On success the kernel writes a handle this value now owns.
        let status = unsafe {
            NtCreateFile(
                &mut handle,
                SYNCHRONIZE,
                &attrs,
                &mut iosb,
                ptr::null(),
                0,
                FILE_SHARE_READ | FILE_SHARE_WRITE,
                FILE_OPEN,
                0,
                ptr::null(),
                0,
            )
        };
        if nt_error(status) {
            return Err(nt_io_error(status));
        }
        Ok(AfdHandle(handle))
    }

    /// Issues `op` (a reference to it rides in the completion). `Ok` when a
    /// completion packet will come (pending, or completed at once: the packet is
    /// queued either way); the NTSTATUS of a request refused at once otherwise.
    pub(crate) fn poll(&self, op: &std::sync::Arc<Op>) -> Result<(), NTSTATUS> {
        let raw = std::sync::Arc::into_raw(op.clone());
        let info = op.info.get();
        // SAFETY: `info` and the status block live in `op`, kept alive by the
        // reference passed as the APC context until the completion is dequeued
        // (`Afd::wait`) or, on a refusal here, released below; the buffer is the
        // size the driver expects for one socket (METHOD_BUFFERED: it copies in
        // and out). No event and no APC routine: completion goes to the port.
        let status = unsafe {
            NtDeviceIoControlFile(
                self.0,
                ptr::null_mut(),
                None,
                raw as *const c_void,
                op.iosb.get(),
                IOCTL_AFD_POLL,
                info as *const c_void,
                size_of::<PollInfo>() as u32,
                info as *mut c_void,
                size_of::<PollInfo>() as u32,
            )
        };
        if status == STATUS_PENDING || !nt_error(status) {
            return Ok(());
        }
        // Refused at once: no packet will be queued, so the request's reference
        // is released here.
        // SAFETY: `raw` came from `Arc::into_raw` above and was not handed on.
        drop(unsafe { std::sync::Arc::from_raw(raw) });
        Err(status)
    }

    /// Cancels `op`'s poll (NtCancelIoFileEx). A poll that has completed answers
    /// STATUS_NOT_FOUND: not an error, its packet is queued or dequeued already.
    /// A cancelled poll still queues one packet (STATUS_CANCELLED).
    pub(crate) fn cancel(&self, op: &Op) -> io::Result<()> {
        let mut iosb = IO_STATUS_BLOCK::default();
        // SAFETY: `op` is alive (borrowed), so its status block names this poll
        // and no other request; the kernel writes the cancel's own status into
        // the local `iosb`.
        let status = unsafe { NtCancelIoFileEx(self.0, op.iosb.get(), &mut iosb) };
        if nt_error(status) && status != STATUS_NOT_FOUND {
            return Err(nt_io_error(status));
        }
        Ok(())
    }

    /// Cancels every poll issued through this handle.
    pub(crate) fn cancel_all(&self) {
        let mut iosb = IO_STATUS_BLOCK::default();
        // SAFETY: a null request cancels all of the handle's I/O; `iosb` is a
        // live local.
        let _ = unsafe { NtCancelIoFileEx(self.0, ptr::null(), &mut iosb) };
    }
}

/// Winsock initialised once for the process (WSAStartup 2.2, never cleaned up),
/// so that WSAIoctl answers for a handle that is not a socket before any socket
/// was made.
fn winsock() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // SAFETY: WSADATA is plain data WSAStartup fills; zeroed is a valid value.
        let mut data: WSADATA = unsafe { std::mem::zeroed() };
        // SAFETY: `data` is a live out-parameter. A failure (WSASYSNOTREADY)
        // shows up as the error of the next Winsock call.
        let _ = unsafe { WSAStartup(0x0202, &mut data) };
    });
}

/// Whether `s` is a socket: getsockopt(2) `SO_TYPE` answers for sockets only.
/// (wine's `SIO_BASE_HANDLE` answers for any handle, so it is no check there.)
///
/// # Errors
/// Winsock's error: WSAENOTSOCK (10038) for a handle that is not a socket (or a
/// closed one).
pub(crate) fn check_socket(s: RawSocket) -> io::Result<()> {
    winsock();
    let mut kind = 0i32;
    let mut len = size_of::<i32>() as i32;
    // SAFETY: the option buffer is the local `kind`, its size in `len`; Winsock
    // validates `s` itself and writes at most `len` bytes.
    let r = unsafe {
        getsockopt(
            s as SOCKET,
            SOL_SOCKET,
            SO_TYPE,
            &mut kind as *mut i32 as *mut u8,
            &mut len,
        )
    };
    if r == SOCKET_ERROR {
        // SAFETY: reads this thread's last Winsock error; no arguments.
        return Err(io::Error::from_raw_os_error(unsafe { WSAGetLastError() }));
    }
    Ok(())
}

/// The socket's base handle (WSAIoctl `SIO_BASE_HANDLE`): the handle of the
/// base service provider's socket, the one AFD knows, beneath any layered
/// service provider.
///
/// # Errors
/// Winsock's error: WSAENOTSOCK (10038) for a handle that is not a socket (or a
/// closed one).
pub(crate) fn base_socket(s: RawSocket) -> io::Result<RawSocket> {
    winsock();
    let mut base: SOCKET = 0;
    let mut bytes = 0u32;
    // SAFETY: the output buffer is the local `base`, its size given; no input,
    // no overlapped request, no completion routine: a synchronous query that
    // validates `s` itself.
    let r = unsafe {
        WSAIoctl(
            s as SOCKET,
            SIO_BASE_HANDLE,
            ptr::null(),
            0,
            &mut base as *mut SOCKET as *mut c_void,
            size_of::<SOCKET>() as u32,
            &mut bytes,
            ptr::null_mut(),
            None,
        )
    };
    if r == SOCKET_ERROR {
        // SAFETY: reads this thread's last Winsock error; no arguments.
        return Err(io::Error::from_raw_os_error(unsafe { WSAGetLastError() }));
    }
    Ok(base as RawSocket)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_operation_is_64_bytes_80_with_its_arc_counts() {
        assert_eq!(size_of::<Op>(), 64);
        assert_eq!(size_of::<Op>() + 2 * size_of::<usize>(), 80);
    }
}
