//! The epoll backend (Linux, Android): `EPOLLONESHOT` on every arm.
//!
//! The documentation is on [`Epoll`], where rustdoc shows it.

use crate::backend::{Backend, Driver, EventSink, Tag};
use crate::error::classify;
use crate::interest::Interest;
use crate::readiness::{RawEvent, Readiness};
use crate::state::KernelError;
use crate::stats::{Count, Counters};
use crate::token::{pack64, unpack64};
use rustix::event::epoll::{self, EventData, EventFlags};
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use rustix::io::Errno;
use std::io;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The `data.u64` of the waker's registration: a slot no table can reach.
const WAKER: u64 = u64::MAX;

/// Kernel events read per wait: a stack buffer, so a wait never allocates.
const BATCH: usize = 256;

/// The epoll backend (Linux, Android): `EPOLLONESHOT` on every arm.
///
/// Every epoll call the crate makes is in one file,
/// [`backends/epoll.rs`](https://docs.rs/crate/pollshot/latest/source/backends/epoll.rs)
/// (epoll_ctl(2), epoll_wait(2), eventfd(2)).
///
/// - add: `EPOLL_CTL_ADD` with the interest, `EPOLLONESHOT` and (readable)
///   `EPOLLRDHUP`; `data.u64` = slot | generation << 32.
/// - re-arm: `EPOLL_CTL_MOD`, the same flags and a new generation.
/// - quiet: `EPOLL_CTL_MOD` to `EPOLLONESHOT` alone. The kernel always adds
///   `EPOLLERR | EPOLLHUP` to a registration; without oneshot a quieted socket whose
///   peer hangs up would be reported on every wait forever (checked on this
///   kernel: 10 of 10 waits). With oneshot it fires at most once, and its stale
///   generation drops it.
/// - delete: `EPOLL_CTL_DEL`, only at deregistration.
/// - EPERM (regular files, `/dev/null`) is `NotPollable`: the registration is
///   reported always ready and never added.
/// - the waker is an eventfd registered edge-triggered (`EPOLLET`) under the reserved
///   tag `u64::MAX`. Each write is one edge, reported to one `epoll_wait` caller (the
///   kernel queues blocked waiters exclusively), and never re-reported: a
///   level-triggered waker on an epoll set shared by several threads is reported to
///   a second waiter before the first drains it (one notify, two early returns). The
///   counter is never read: an edge needs no drain, so a wake-up costs one write and
///   a wait that was not woken costs nothing extra. The counter would saturate only
///   after 2^64 - 2 writes; a write that finds it full (EAGAIN) resets it first.
#[derive(Debug)]
pub struct Epoll {
    epoll: OwnedFd,
    waker: OwnedFd,
    /// `epoll_pwait2` answered ENOSYS once (older kernel or a seccomp filter):
    /// sub-millisecond timeouts round up to milliseconds from then on.
    no_pwait2: AtomicBool,
    counters: Counters,
}

impl Backend for Epoll {}

/// The flags an arm for `interest` asks for: `EPOLLONESHOT`, readable `EPOLLIN |
/// EPOLLRDHUP`, writable `EPOLLOUT`, priority `EPOLLPRI` (looked up in
/// [`FLAGS`]).
#[inline(always)]
fn flags_for(interest: Interest) -> EventFlags {
    FLAGS[(interest.bits() & 7) as usize]
}

/// [`flags_for`] each interest's bits (0 unused: `EPOLLONESHOT` alone).
const FLAGS: [EventFlags; 8] = {
    let mut table = [EventFlags::ONESHOT; 8];
    let mut bits = 1;
    while bits < 8 {
        let mut flags = EventFlags::ONESHOT;
        if bits & Interest::READABLE.bits() != 0 {
            flags = flags.union(EventFlags::IN).union(EventFlags::RDHUP);
        }
        if bits & Interest::WRITABLE.bits() != 0 {
            flags = flags.union(EventFlags::OUT);
        }
        if bits & Interest::PRIORITY.bits() != 0 {
            flags = flags.union(EventFlags::PRI);
        }
        table[bits as usize] = flags;
        bits += 1;
    }
    table
};

/// Borrows a registered descriptor number for one `epoll_ctl`.
#[inline]
fn fd_ref<'a>(fd: RawFd) -> BorrowedFd<'a> {
    // SAFETY: the number is passed only to epoll_ctl(2), which validates it: a
    // closed number answers EBADF and a reused one is handled as the state table
    // says. No I/O is done through it and it is never closed here.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

impl Epoll {
    fn create() -> io::Result<(OwnedFd, OwnedFd)> {
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let waker = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        // Edge-triggered: one report per write, to one waiter (module docs).
        epoll::add(
            &ep,
            &waker,
            EventData::new_u64(WAKER),
            EventFlags::IN | EventFlags::ET,
        )?;
        Ok((ep, waker))
    }

    #[inline(always)]
    fn ctl(&self, count: Count, r: rustix::io::Result<()>) -> Result<(), KernelError> {
        self.counters.one(count);
        self.counters.one(Count::CtlCall);
        r.map_err(|e| classify(e.into(), &[libc::EPERM]))
    }

    /// epoll_pwait2(2) with an exact timespec, for timeouts that are not whole
    /// milliseconds. `None` means the kernel lacks it (ENOSYS, remembered).
    #[cfg(target_os = "linux")]
    fn wait_exact(
        &self,
        buf: &mut [MaybeUninit<epoll::Event>],
        t: Duration,
    ) -> Option<io::Result<usize>> {
        if self.no_pwait2.load(Ordering::Relaxed) {
            return None;
        }
        let ts = KernelTimespec::from(t);
        // SAFETY: epoll_pwait2(2) writes at most `buf.len()` `struct epoll_event`s
        // into `buf`, whose element type is layout-identical to the kernel's
        // (rustix's `epoll::Event` is `repr(C)`, packed on x86_64 as the kernel's);
        // `ts` is the kernel's `struct __kernel_timespec` and outlives the call; a
        // null sigmask leaves the signal mask alone.
        let n = unsafe {
            libc::syscall(
                libc::SYS_epoll_pwait2,
                self.epoll.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len() as libc::c_int,
                &ts as *const KernelTimespec,
                std::ptr::null::<libc::sigset_t>(),
                0usize,
            )
        };
        if n >= 0 {
            return Some(Ok(n as usize));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSYS) {
            self.no_pwait2.store(true, Ordering::Relaxed);
            return None;
        }
        Some(Err(e))
    }

    #[cfg(not(target_os = "linux"))]
    fn wait_exact(
        &self,
        _: &mut [MaybeUninit<epoll::Event>],
        _: Duration,
    ) -> Option<io::Result<usize>> {
        None
    }

    #[inline(always)]
    fn wait_into(
        &self,
        buf: &mut [MaybeUninit<epoll::Event>],
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        if let Some(t) = timeout {
            // Not a whole number of milliseconds, and short enough for a plain
            // millisecond count: the exact wait avoids rounding up.
            if t.subsec_nanos() % 1_000_000 != 0 && t < Duration::from_secs(i32::MAX as u64 / 1000)
            {
                if let Some(r) = self.wait_exact(buf, t) {
                    return r;
                }
            }
        }
        let ms = timeout_ms(timeout);
        let ts;
        let ts_ref = if ms < 0 {
            None
        } else {
            ts = rustix::event::Timespec {
                tv_sec: (ms / 1000) as _,
                tv_nsec: ((ms % 1000) * 1_000_000) as _,
            };
            Some(&ts)
        };
        // rustix issues epoll_pwait with this whole-millisecond timeout.
        match epoll::wait(&self.epoll, &mut *buf, ts_ref) {
            Ok((ready, _)) => Ok(ready.len()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Driver for Epoll {
    const NAME: &'static str = "epoll";
    const TAG_IS_GENERATION: bool = true;
    const SPLIT_FILTERS: bool = false;

    fn new() -> io::Result<Epoll> {
        let (epoll, waker) = Epoll::create()?;
        Ok(Epoll {
            epoll,
            waker,
            no_pwait2: AtomicBool::new(false),
            counters: Counters::default(),
        })
    }

    #[inline(always)]
    fn add(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        let data = EventData::new_u64(pack64(tag.slot, tag.generation));
        let r = epoll::add(&self.epoll, fd_ref(fd), data, flags_for(interest));
        self.ctl(Count::Add, r)
    }

    #[inline(always)]
    fn modify(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        let data = EventData::new_u64(pack64(tag.slot, tag.generation));
        let r = epoll::modify(&self.epoll, fd_ref(fd), data, flags_for(interest));
        self.ctl(Count::Modify, r)
    }

    #[inline(always)]
    fn quiet(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        let data = EventData::new_u64(pack64(tag.slot, tag.generation));
        let r = epoll::modify(&self.epoll, fd_ref(fd), data, EventFlags::ONESHOT);
        self.ctl(Count::Quiet, r)
    }

    fn delete(&self, fd: RawFd, _tag: Tag) -> Result<(), KernelError> {
        let r = epoll::delete(&self.epoll, fd_ref(fd));
        self.ctl(Count::Delete, r)
    }

    fn wait(
        &self,
        out: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        // (`wait_each` needs no scratch here: an empty `Vec` never allocates.)
        self.wait_each(&mut Vec::new(), max, timeout, out)
    }

    /// Hands each `epoll_event` to `each` straight from the stack buffer: no
    /// copy into the poller's scratch.
    #[inline(always)]
    fn wait_each(
        &self,
        _scratch: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
        each: &mut impl EventSink,
    ) -> io::Result<bool> {
        let mut buf = [MaybeUninit::<epoll::Event>::uninit(); BATCH];
        // The poller never asks for 0 (its buffer is empty or has room at every
        // wait); a caller that did would get EINVAL from the kernel, not events
        // past its room.
        let len = max.min(BATCH);
        self.counters.one(Count::Wait);
        let n = self.wait_into(&mut buf[..len], timeout)?;
        let mut woken = false;
        // SAFETY: `n <= len <= BATCH`: it is the length of the sub-slice of
        // `buf[..len]` that rustix's `epoll::wait` hands back as filled, or
        // epoll_pwait2(2)'s count, at most its `maxevents` (`len`).
        let filled = unsafe { buf.get_unchecked(..n) };
        for slot in filled {
            // SAFETY: the kernel initialised the first `n` entries.
            let ev = unsafe { slot.assume_init_ref() };
            let data = ev.data.u64();
            if data == WAKER {
                woken = true;
                continue;
            }
            let (slot, generation) = unpack64(data);
            each.event(RawEvent {
                slot,
                stamp: generation,
                readiness: Readiness::from_epoll({ ev.flags }.bits()),
            });
        }
        Ok(woken)
    }

    fn wake(&self) -> io::Result<()> {
        self.counters.one(Count::Wake);
        loop {
            match rustix::io::write(&self.waker, &1u64.to_ne_bytes()) {
                Ok(_) => return Ok(()),
                Err(Errno::INTR) => continue,
                // The counter is saturated (2^64 - 2 writes unread): reset it, so
                // that the next write is an edge again.
                Err(Errno::AGAIN) => {
                    self.counters.one(Count::WakeRead);
                    let mut word = [0u8; 8];
                    // Another writer's reset may have emptied it first: either way
                    // the next write is an edge.
                    let _ = rustix::io::read(&self.waker, &mut word);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn reinit_after_fork(&mut self) -> io::Result<()> {
        // The inherited epoll instance is shared with the parent: never epoll_ctl it.
        // Closing the child's copy (by dropping it) leaves the parent's alone.
        let (epoll, waker) = Epoll::create()?;
        self.epoll = epoll;
        self.waker = waker;
        Ok(())
    }

    fn owns_fd(&self, fd: RawFd) -> bool {
        fd == self.epoll.as_raw_fd() || fd == self.waker.as_raw_fd()
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }
}

impl AsFd for Epoll {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.epoll.as_fd()
    }
}

/// The kernel's `struct __kernel_timespec` (include/uapi/linux/time_types.h): what
/// epoll_pwait2(2) reads, two 64-bit fields on every target. On 32-bit targets it
/// is not `libc::timespec`, whose `time_t` and `long` are 32 bits there: the kernel
/// (`get_timespec64`, kernel/time/time.c) would read 16 bytes from an 8-byte struct
/// and answer EINVAL for the stack bytes it took as nanoseconds
/// (`poll_select_set_timeout`, called from `epoll_pwait2` in fs/eventpoll.c).
#[cfg(target_os = "linux")]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KernelTimespec {
    tv_sec: i64,
    tv_nsec: i64,
}

#[cfg(target_os = "linux")]
impl From<Duration> for KernelTimespec {
    /// Exact: whole seconds and nanoseconds (the caller keeps `t` below
    /// `i32::MAX` milliseconds, so the seconds always fit).
    fn from(t: Duration) -> KernelTimespec {
        KernelTimespec {
            tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(t.subsec_nanos()),
        }
    }
}

/// Converts a timeout to whole milliseconds for `epoll_wait(2)`:
/// `None` is -1 (block), zero is 0, anything else is rounded *up* (never down to 0,
/// which would spin) and clamped to `i32::MAX` (about 24.8 days).
fn timeout_ms(timeout: Option<Duration>) -> i32 {
    match timeout {
        None => -1,
        Some(t) if t.is_zero() => 0,
        Some(t) => {
            let ms = t.as_nanos().div_ceil(1_000_000);
            i32::try_from(ms).unwrap_or(i32::MAX)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{flags_for, timeout_ms};
    use crate::interest::Interest;
    use rustix::event::epoll::EventFlags;
    use std::time::Duration;

    #[test]
    fn arm_flags_are_oneshot_and_the_interest_s_bits() {
        for i in Interest::ALL {
            let f = flags_for(i);
            assert!(f.contains(EventFlags::ONESHOT));
            assert_eq!(f.contains(EventFlags::IN), i.is_readable());
            assert_eq!(f.contains(EventFlags::RDHUP), i.is_readable());
            assert_eq!(f.contains(EventFlags::OUT), i.is_writable());
            assert_eq!(f.contains(EventFlags::PRI), i.is_priority());
            let all = EventFlags::ONESHOT
                | EventFlags::IN
                | EventFlags::RDHUP
                | EventFlags::OUT
                | EventFlags::PRI;
            assert!(all.contains(f));
        }
    }

    #[test]
    fn millisecond_timeouts_round_up_and_clamp() {
        assert_eq!(timeout_ms(None), -1);
        assert_eq!(timeout_ms(Some(Duration::ZERO)), 0);
        assert_eq!(timeout_ms(Some(Duration::from_nanos(1))), 1);
        assert_eq!(timeout_ms(Some(Duration::from_micros(999))), 1);
        assert_eq!(timeout_ms(Some(Duration::from_micros(1500))), 2);
        assert_eq!(timeout_ms(Some(Duration::from_millis(7))), 7);
        assert_eq!(timeout_ms(Some(Duration::MAX)), i32::MAX);
    }
}
