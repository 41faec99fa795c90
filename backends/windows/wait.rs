//! Waitable handles: an event, a process, a thread, a semaphore, a mutex, a
//! waitable timer, registered with `Poller::register_waitable` and armed like a
//! socket, oneshot: an arming is one thread-pool wait on the object, whose
//! callback posts one packet to the poller's completion port when the object is
//! signaled.
//!
//! The mechanism, and why it is this one: Windows 8 and later have wait
//! completion packets (ntdll's `NtCreateWaitCompletionPacket`,
//! `NtAssociateWaitCompletionPacket`, `NtCancelWaitCompletionPacket`), which
//! queue the packet without a thread in between, but wine 8.0's ntdll does not
//! export them (checked: none of the three names is in its `ntdll.dll`). So an
//! arming is one `RegisterWaitForSingleObject` with `WT_EXECUTEONLYONCE` (the
//! callback runs at most once: oneshot), run by a worker thread of the pool. Its
//! callback posts `PostQueuedCompletionStatus` with [`WAIT_KEY`], the slot as the
//! packet's `lpOverlapped` and the arming's generation as its byte count: a
//! packet of an older arming, of a disarmed or a deregistered registration is
//! dropped by the poller as stale, by generation, as an AFD completion is. polling
//! 3.11 does the same (its `iocp` backend's `WaitHandle`).
//!
//! The callback is not run in the wait thread (`WT_EXECUTEINWAITTHREAD`), which
//! would save one hand-off to a worker per signal: on wine 8.0 that path races
//! with cancelling. `waitqueue_thread_proc` (dlls/ntdll/threadpool.c) counts the
//! callback as pending (`num_pending_callbacks++`) before it takes the pool's
//! lock, and runs it without queueing the object on the pool's list; a
//! concurrent `UnregisterWaitEx` reaches `tp_object_cancel`, which under the
//! pool's lock sees the count and unlinks the object's never-linked list entry
//! (a page fault writing address 8, in `list_remove`). Measured here under wine
//! 8.0: `waitable_rearm_storm_delivers_once_per_arming` (an always-signaled event,
//! armed and disarmed 300 times) crashed 11 of 60 runs with the flag, none of
//! 310 without it. A worker thread's callback is queued by `tp_object_submit`
//! under the pool's lock, which `tp_object_cancel` takes too.
//!
//! A satisfied wait has taken the object's signal (an auto-reset event reset, a
//! semaphore decremented), so a disarm must not lose it. A disarm therefore
//! cancels nothing: the wait stays in the pool, its phase (`Phase`, a word the
//! callback and the commands move by compare-and-swap) set to disarmed, and a
//! signal it takes then is kept, not posted; the next arm makes the same wait
//! its own (no system call), or, if a signal was kept, posts its packet at
//! once. A disarm that comes after the wait fired for the arming (its packet
//! posted, now stale) keeps that signal the same way. Cancelling a wait
//! unregisters it from the pool, and a wait satisfied just before its cancel
//! may have its callback cancelled with it (wine's `tp_object_cancel` drops a
//! queued callback): its signal is then gone with nothing to report it. So a
//! wait is cancelled only where its registration ends (deregister, supersede,
//! the poller's drop) or once it is spent (fired and delivered, at the next
//! arm). Measured under wine 8.0 (`tests/windows_break_waits.rs`): a semaphore
//! of 50 counts armed and disarmed 200 times, then armed and delivered, gives
//! its 50 counts as 50 events in each of 20 trials; cancelling at each disarm
//! (the design before) lost 933 of those 1,000 counts.
//!
//! Cancelling is `UnregisterWaitEx(wait, INVALID_HANDLE_VALUE)`, which returns only when no
//! callback of the wait is running or will run (Windows' documented contract;
//! wine's `RtlDeregisterWaitEx` does `TpSetWait(NULL)` and then
//! `TpWaitForWait(.., TRUE)`, the same), so the callback's context can be freed
//! right after it, and a deregister has taken effect when it returns: a packet
//! the callback posted before is stale in the table, and none comes after.
//!
//! The pool waits on a handle of the backend's own, not on the caller's: the
//! first arm of a registration duplicates the caller's handle
//! (`DuplicateHandle`, same access), every arming waits on that duplicate, and
//! it is closed a second after the registration ends (deregister, supersede,
//! the poller's drop), after its wait is unregistered (the second: wine's pool
//! thread may still wait on its value for a moment, see `retire`).
//! `register_waitable` only
//! borrows the handle, so safe code may close it while a wait is armed; a wait
//! on the caller's value would then be undefined (RegisterWaitForSingleObject:
//! the handle must stay open while the wait is pending), and in practice, on
//! wine, a wait on whatever object the number is given to next: its signals
//! reported for the old registration and an auto-reset event's consumed. With
//! the duplicate, a closed handle leaves the object alive until the
//! registration ends (and a second more), and its number's next owner is
//! never waited on.
//! Which behaviour a wait has (when it is satisfied, what it consumes: an
//! auto-reset event is reset, a semaphore decremented, a mutex acquired by the
//! pool's thread) is `WaitForSingleObject`'s, which the pool calls.

use super::port::{post_packet, WAIT_KEY};
use crate::state::KernelError;
use crate::stats::{Count, Counters};
use std::collections::HashMap;
use std::ffi::c_void;
use std::io;
use std::ptr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};
use windows_sys::Win32::Foundation::{
    CloseHandle, DuplicateHandle, GetLastError, DUPLICATE_SAME_ACCESS, ERROR_INVALID_HANDLE,
    ERROR_IO_PENDING, HANDLE, INVALID_HANDLE_VALUE, WAIT_FAILED,
};
use windows_sys::Win32::System::Threading::{
    CreateEventW, GetCurrentProcess, RegisterWaitForSingleObject, UnregisterWaitEx,
    WaitForMultipleObjects, INFINITE, WT_EXECUTEONLYONCE,
};

/// Record shards, as the sockets' (`mod.rs`).
const SHARDS: usize = 16;

/// What a wait's callback needs: boxed per wait, freed when the wait is
/// unregistered (no callback runs after that).
struct Context {
    port: HANDLE,
    slot: u32,
    /// The wait's [`Phase`] in the low byte, the arming's generation above.
    phase: AtomicU64,
}

/// Where a wait stands. The callback and the commands (under the slot's lock)
/// move it by compare-and-swap, so that exactly one of a disarm and a satisfied
/// wait decides what becomes of the signal the wait took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting, for the arming of this generation: the callback posts its
    /// packet.
    Armed(u32),
    /// Waiting, for a registration that is disarmed: the callback posts
    /// nothing, and the signal it took is kept (`Kept`).
    Disarmed,
    /// Satisfied while armed for this generation: its packet is posted (or
    /// about to be).
    Fired(u32),
    /// Satisfied while disarmed: the object's signal is taken and reported by
    /// no packet yet.
    Kept,
}

impl Phase {
    fn word(self) -> u64 {
        match self {
            Phase::Armed(g) => (g as u64) << 8 | 1,
            Phase::Disarmed => 2,
            Phase::Fired(g) => (g as u64) << 8 | 3,
            Phase::Kept => 4,
        }
    }

    fn of(word: u64) -> Phase {
        let g = (word >> 8) as u32;
        match word & 0xff {
            1 => Phase::Armed(g),
            2 => Phase::Disarmed,
            3 => Phase::Fired(g),
            _ => Phase::Kept,
        }
    }
}

impl Context {
    fn phase(&self) -> Phase {
        Phase::of(self.phase.load(Ordering::Acquire))
    }

    /// Moves the phase from `from` to `to`; `Err` with the phase found when
    /// it was not `from`.
    fn swap(&self, from: Phase, to: Phase) -> Result<(), Phase> {
        self.phase
            .compare_exchange(from.word(), to.word(), Ordering::AcqRel, Ordering::Acquire)
            .map(drop)
            .map_err(Phase::of)
    }
}

/// One thread-pool wait and its callback's context.
struct Wait {
    wait: HANDLE,
    context: *mut Context,
}

// SAFETY: the wait handle may be unregistered from any thread; the context is
// only read by the callback (and freed once no callback can run).
unsafe impl Send for Wait {}

/// The callback of every wait: one post to the poller's port.
unsafe extern "system" fn signaled(context: *mut c_void, _timed_out: bool) {
    // SAFETY: `context` is the `Box<Context>` `Wait::start` registered, freed
    // only after `UnregisterWaitEx(.., INVALID_HANDLE_VALUE)` returned, which
    // waits for this callback; the port outlives every wait (`Waits::drain`).
    let c = unsafe { &*(context as *const Context) };
    // Once only (`WT_EXECUTEONLYONCE`): the phase is `Armed` or `Disarmed`; a
    // command may move it between the load and the swap (then again).
    loop {
        let from = c.phase();
        let (to, post) = match from {
            Phase::Armed(g) => (Phase::Fired(g), Some(g)),
            Phase::Disarmed => (Phase::Kept, None),
            Phase::Fired(_) | Phase::Kept => return,
        };
        if c.swap(from, to).is_ok() {
            if let Some(generation) = post {
                // A failed post (the port closed) cannot happen while the wait
                // exists, and a callback has nowhere to report it.
                let _ = post_packet(c.port, WAIT_KEY, generation, c.slot as usize);
            }
            return;
        }
    }
}

impl Wait {
    /// Starts one wait on `object` for arming `generation` of `slot`: one
    /// RegisterWaitForSingleObject. An object signaled already fires at once.
    fn start(port: HANDLE, object: HANDLE, slot: u32, generation: u32) -> io::Result<Wait> {
        let context = Box::into_raw(Box::new(Context {
            port,
            slot,
            phase: AtomicU64::new(Phase::Armed(generation).word()),
        }));
        let mut wait: HANDLE = ptr::null_mut();
        // SAFETY: `wait` is a live out-parameter; `context` stays allocated
        // until the wait is unregistered (`cancel`) or, if this call fails,
        // below; no timeout (INFINITE).
        let ok = unsafe {
            RegisterWaitForSingleObject(
                &mut wait,
                object,
                Some(signaled),
                context as *const c_void,
                INFINITE,
                WT_EXECUTEONLYONCE,
            )
        };
        if ok == 0 {
            let e = io::Error::last_os_error();
            // SAFETY: no wait was registered, so nothing else holds `context`.
            drop(unsafe { Box::from_raw(context) });
            return Err(e);
        }
        Ok(Wait { wait, context })
    }

    fn context(&self) -> &Context {
        // SAFETY: the context is freed only by `cancel`, which consumes `self`.
        unsafe { &*self.context }
    }

    /// Unregisters the wait, waiting for its callback if it is running: one
    /// UnregisterWaitEx. Afterwards no callback of it runs.
    fn cancel(self) -> io::Result<()> {
        // SAFETY: `self.wait` is a registered wait, unregistered once (this
        // consumes it); INVALID_HANDLE_VALUE makes the call wait for callbacks.
        let ok = unsafe { UnregisterWaitEx(self.wait, INVALID_HANDLE_VALUE) };
        // SAFETY: reads this thread's last error; no arguments.
        if ok == 0 && unsafe { GetLastError() } != ERROR_IO_PENDING {
            // Not unregistered: a callback may still run, so its context is
            // left allocated (leaked) rather than freed under it.
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the wait is unregistered and no callback of it runs any more:
        // the context is this value's alone.
        drop(unsafe { Box::from_raw(self.context) });
        Ok(())
    }
}

/// One waitable registration: the backend's duplicate of its handle (made at
/// the first arm, closed a second after the registration ends) and the wait of its last
/// arming (`None`: never armed, or its last arming was completed by a packet
/// posted at its arm, for a kept signal; a wait that fired stays until the
/// next arm or a cancel unregisters it, and a disarmed one waits on, for the
/// next arm).
#[derive(Default)]
struct Reg {
    /// Owned; null until the first arm.
    object: Object,
    wait: Option<Wait>,
    /// A signal a wait took for this registration that no delivery reported:
    /// the wait was satisfied (and its packet posted) before a disarm, which
    /// made the packet stale. Reported by the next arm, at once.
    kept: bool,
}

/// A handle the backend owns (null: none), closed on drop.
struct Object(HANDLE);

impl Default for Object {
    fn default() -> Object {
        Object(ptr::null_mut())
    }
}

// SAFETY: a kernel handle may be used and closed from any thread.
unsafe impl Send for Object {}

impl Drop for Object {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // No wait is left on it: every path that drops a `Reg` (`set`,
            // `drain`) takes its wait out and unregisters it first, and
            // forgets the duplicate instead where that failed.
            retire(self.0);
        }
    }
}

/// How long a registration's duplicate stays open after the registration
/// ended (see [`retire`]).
const RETIRE_AFTER: Duration = Duration::from_secs(1);

/// Closes `h`, a duplicate whose registration has ended, [`RETIRE_AFTER`]
/// from now, on one thread of the process's (`pollshot-retire`, started at the
/// first call; if it cannot be started, `h` is closed at once).
///
/// Why not at once: wine 8.0's pool thread waits on handle values, not on the
/// objects. `waitqueue_thread_proc` (dlls/ntdll/threadpool.c) copies the
/// waiting objects' handles under `waitqueue.cs`, leaves it, then calls
/// `NtWaitForMultipleObjects` with the copies. A wait unregistered in between
/// leaves its handle in that call; closed at once, its value is the next
/// handle the process makes (the server gives out the lowest free entry), so
/// the call may wait on a new object (the next registration's duplicate, or
/// any handle of the caller's) and, satisfied, consume its signal for a wait
/// that no longer exists ("wait object triggered while object was
/// destroyed"): an auto-reset event reset, a semaphore count gone, no
/// callback. Measured here: 4 threads each registering, setting, arming,
/// delivering and deregistering a fresh event, 16,000 times under CPU load,
/// lost 1 signal with the close at once (and wine printed that warning for
/// it). Kept open, the value names the old object until the pool thread's
/// call has long returned. Windows' pool needs no delay, but the cost is
/// small: the object lives a second longer.
fn retire(h: HANDLE) {
    static CLOSER: OnceLock<Option<mpsc::Sender<(Instant, usize)>>> = OnceLock::new();
    let closer = CLOSER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<(Instant, usize)>();
        let started = thread::Builder::new()
            .name("pollshot-retire".into())
            .spawn(move || {
                // Every entry is due `RETIRE_AFTER` after it was sent: in the
                // order sent.
                for (due, h) in rx {
                    let now = Instant::now();
                    if due > now {
                        thread::sleep(due - now);
                    }
                    // SAFETY: the duplicate was handed over by `retire`, its
                    // only owner; closed once.
                    unsafe { CloseHandle(h as HANDLE) };
                }
            });
        started.ok().map(|_| tx)
    });
    let sent = match closer {
        Some(tx) => tx.send((Instant::now() + RETIRE_AFTER, h as usize)).is_ok(),
        None => false,
    };
    if !sent {
        // SAFETY: the duplicate is the caller's alone (not handed over); closed
        // once.
        unsafe { CloseHandle(h) };
    }
}

/// The backend's own handle for the object `h` names: DuplicateHandle with the
/// same access, not inheritable.
fn duplicate(h: HANDLE) -> Result<Object, KernelError> {
    let mut dup: HANDLE = ptr::null_mut();
    // SAFETY: both process handles are this process's pseudo-handle; `dup` is a
    // live out-parameter; the handle made is owned by the `Object` returned.
    let ok = unsafe {
        DuplicateHandle(
            GetCurrentProcess(),
            h,
            GetCurrentProcess(),
            &mut dup,
            0,
            0,
            DUPLICATE_SAME_ACCESS,
        )
    };
    if ok == 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(ERROR_INVALID_HANDLE as i32) {
            return Err(KernelError::Other(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "pollshot arm: waitable handle {:#x} is closed (DuplicateHandle: {e}); \
                     it must stay open until the first arm",
                    h as usize
                ),
            )));
        }
        return Err(KernelError::Other(e));
    }
    Ok(Object(dup))
}

/// The waitable registrations, by slot.
pub(crate) struct Waits {
    shards: [Mutex<HashMap<u32, Reg>>; SHARDS],
    /// Slots held, so that a socket's arm skips the lookup when there are none.
    held: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A map of plain records: a panic elsewhere cannot leave it half-written.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The error of an arm for another interest than readable.
fn readable_only(interest: crate::interest::Interest) -> KernelError {
    KernelError::Other(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "pollshot arm: a waitable handle's registration is armed with Interest::READABLE \
             only (readable: the object is signaled), not {interest:?}"
        ),
    ))
}

impl Waits {
    pub(crate) fn new() -> Waits {
        Waits {
            shards: Default::default(),
            held: AtomicUsize::new(0),
        }
    }

    fn shard(&self, slot: u32) -> MutexGuard<'_, HashMap<u32, Reg>> {
        lock(&self.shards[slot as usize % SHARDS])
    }

    /// Whether `slot` holds a waitable handle's registration.
    #[inline]
    pub(crate) fn holds(&self, slot: u32) -> bool {
        self.held.load(Ordering::Relaxed) != 0 && self.shard(slot).contains_key(&slot)
    }

    /// `slot` now holds a waitable handle's registration (`true`) or not.
    /// Called under the slot's lock; a wait left from an earlier registration
    /// (not expected: its deregister cancelled it) is cancelled, and the
    /// earlier registration's duplicate handle closed.
    pub(crate) fn set(&self, slot: u32, waitable: bool) -> io::Result<()> {
        let old = if waitable {
            let old = self.shard(slot).insert(slot, Reg::default());
            if old.is_none() {
                self.held.fetch_add(1, Ordering::Relaxed);
            }
            old
        } else {
            let old = self.shard(slot).remove(&slot);
            if old.is_some() {
                self.held.fetch_sub(1, Ordering::Relaxed);
            }
            old
        };
        let Some(mut old) = old else {
            return Ok(());
        };
        let r = match old.wait.take() {
            Some(wait) => wait.cancel(),
            None => Ok(()),
        };
        if r.is_err() {
            // A wait that could not be unregistered may still wait on the
            // duplicate: it is left open (leaked) rather than closed under it.
            std::mem::forget(old.object);
        }
        r
    }

    /// Arms `slot` (arming `generation`) on `object`. The poller re-arms only a
    /// registration that is not armed, so the wait left from its last arming,
    /// if any, was either delivered or disarmed:
    /// - disarmed and still waiting: it is the new arming's wait (its phase moves
    ///   to `Armed(generation)`); no system call;
    /// - a kept signal (a wait satisfied for a disarmed arming, or a disarm
    ///   that came after the arming's wait fired): the arming's packet is posted
    ///   at once (one PostQueuedCompletionStatus), after the spent wait is
    ///   unregistered (one UnregisterWaitEx);
    /// - otherwise the spent wait, if any, is unregistered and a new one starts
    ///   on the registration's duplicate of `object` (one
    ///   RegisterWaitForSingleObject; the first arm makes the duplicate, one
    ///   DuplicateHandle).
    ///
    /// Each system call is a `ctl_call`. `InvalidInput` when the first arm
    /// finds `object` closed.
    pub(crate) fn arm(
        &self,
        port: HANDLE,
        object: HANDLE,
        slot: u32,
        generation: u32,
        interest: crate::interest::Interest,
        counters: &Counters,
    ) -> Result<(), KernelError> {
        if interest != crate::interest::Interest::READABLE {
            return Err(readable_only(interest));
        }
        // Decided under the shard's lock; a spent wait is unregistered outside
        // it (UnregisterWaitEx may wait for a callback, which takes no lock of
        // ours).
        let (spent, mut dup, kept) = {
            let mut shard = self.shard(slot);
            let Some(r) = shard.get_mut(&slot) else {
                return Err(KernelError::NotFound);
            };
            // (A disarm keeps a signal only of a wait that fired: a kept
            // signal comes with a spent wait, or none.)
            let mut kept = std::mem::take(&mut r.kept);
            let spent = r.wait.take();
            if let Some(w) = &spent {
                match w.context().phase() {
                    from @ (Phase::Disarmed | Phase::Armed(_)) if !kept => {
                        match w.context().swap(from, Phase::Armed(generation)) {
                            Ok(()) => {
                                r.wait = spent;
                                return Ok(());
                            }
                            // Satisfied meanwhile, while disarmed: kept.
                            Err(_) => kept = true,
                        }
                    }
                    Phase::Kept => kept = true,
                    // Delivered (`Fired`), or spent with its signal kept.
                    _ => {}
                }
            }
            (spent, r.object.0, kept)
        };
        if let Some(w) = spent {
            counters.one(Count::CtlCall);
            w.cancel().map_err(KernelError::Other)?;
        }
        if kept {
            counters.one(Count::CtlCall);
            let posted = post_packet(port, WAIT_KEY, generation, slot as usize);
            // The poller serialises commands for one registration, and makes
            // and removes it under the slot's lock it holds now: the record is
            // there.
            if posted.is_err() {
                // Not armed: the signal stays kept for the next arm.
                if let Some(r) = self.shard(slot).get_mut(&slot) {
                    r.kept = true;
                }
            }
            return posted.map_err(KernelError::Other);
        }
        if dup.is_null() {
            counters.one(Count::CtlCall);
            let owned = duplicate(object)?;
            dup = owned.0;
            // As above: the record is there, and its `object` still null.
            match self.shard(slot).get_mut(&slot) {
                Some(r) => r.object = owned,
                None => return Err(KernelError::NotFound),
            }
        }
        counters.one(Count::CtlCall);
        let wait = Wait::start(port, dup, slot, generation).map_err(KernelError::Other)?;
        // As above: the record is there.
        let stray = match self.shard(slot).get_mut(&slot) {
            Some(r) => r.wait.replace(wait),
            None => Some(wait),
        };
        match stray {
            Some(w) => w.cancel().map_err(KernelError::Other),
            None => Ok(()),
        }
    }

    /// Disarms `slot`'s armed registration: no system call. Its wait, if still
    /// waiting, stays in the pool for the next arm (its phase moves to
    /// `Disarmed`: a signal it takes meanwhile is kept, not posted). If the
    /// arming's wait had fired, or the arming has no wait (its packet was posted
    /// at the arm), the object's signal was taken for an arming whose packet
    /// the disarm makes stale: the registration keeps it (`Reg::kept`) and its
    /// next arm reports it. The poller calls this under the slot's lock, which
    /// a delivery of the arming takes too, and only for an armed registration:
    /// its packet has not been delivered. `NotFound` if the slot holds no
    /// waitable registration.
    pub(crate) fn disarm(&self, slot: u32) -> Result<(), KernelError> {
        let mut shard = self.shard(slot);
        let Some(r) = shard.get_mut(&slot) else {
            return Err(KernelError::NotFound);
        };
        let kept = match &r.wait {
            // An armed registration without a wait: its arming was posted.
            None => true,
            Some(w) => match w.context().phase() {
                // Satisfied meanwhile if the swap fails: its packet is stale.
                from @ Phase::Armed(_) => w.context().swap(from, Phase::Disarmed).is_err(),
                Phase::Fired(_) | Phase::Kept => true,
                Phase::Disarmed => false,
            },
        };
        r.kept |= kept;
        Ok(())
    }

    /// Cancels `slot`'s wait, if it has one (one UnregisterWaitEx, a
    /// `ctl_call`): a deregister. A signal its wait took and no delivery
    /// reported is consumed (nothing can give it back to the object).
    /// `NotFound` if the slot holds no waitable registration.
    pub(crate) fn cancel(&self, slot: u32, counters: &Counters) -> Result<(), KernelError> {
        let wait = match self.shard(slot).get_mut(&slot) {
            Some(r) => {
                r.kept = false;
                r.wait.take()
            }
            None => return Err(KernelError::NotFound),
        };
        match wait {
            Some(w) => {
                counters.one(Count::CtlCall);
                w.cancel().map_err(KernelError::Other)
            }
            None => Ok(()),
        }
    }

    /// Cancels every wait and closes every duplicate (the poller's drop, before
    /// its port is closed).
    pub(crate) fn drain(&self) {
        for shard in &self.shards {
            let regs: Vec<Reg> = lock(shard).drain().map(|(_, r)| r).collect();
            for mut r in regs {
                let unregistered = r.wait.take().map_or(true, |w| w.cancel().is_ok());
                if !unregistered {
                    // As in `set`: still waited on, so left open.
                    std::mem::forget(r.object);
                }
            }
        }
        self.held.store(0, Ordering::Relaxed);
    }
}

/// A manual-reset event that is never set, made once for the process: the
/// second handle of [`check_waitable`]'s wait.
fn never_signaled() -> io::Result<HANDLE> {
    static NEVER: OnceLock<usize> = OnceLock::new();
    if let Some(&h) = NEVER.get() {
        return Ok(h as HANDLE);
    }
    // SAFETY: no attributes, no name: a new unnamed manual-reset event, not set.
    let h = unsafe { CreateEventW(ptr::null(), 1, 0, ptr::null()) };
    if h.is_null() {
        return Err(io::Error::last_os_error());
    }
    match NEVER.set(h as usize) {
        Ok(()) => Ok(h),
        Err(_) => {
            // Another thread made one first: use it, close ours.
            // SAFETY: `h` is ours, closed once.
            unsafe { windows_sys::Win32::Foundation::CloseHandle(h) };
            Ok(*NEVER.get().expect("set") as HANDLE)
        }
    }
}

/// Whether `h` is an open handle of an object that can be waited on, without
/// changing its state: `WaitForMultipleObjects` for *all* of `h` and an event
/// that is never set, with a zero timeout. A wait for all is satisfied (and
/// consumes a signal) only when every object is signaled, so this one never is:
/// it times out for a waitable object, signaled or not, and fails for a closed
/// handle or an object that cannot be waited on (a file mapping, a registry key).
///
/// # Errors
/// The wait's error (`ERROR_INVALID_HANDLE`, 6, for a closed or non-waitable
/// handle; `ERROR_ACCESS_DENIED`, 5, for a handle without `SYNCHRONIZE` access).
pub(crate) fn check_waitable(h: HANDLE) -> io::Result<()> {
    let handles = [h, never_signaled()?];
    // SAFETY: `handles` is a live array of two handle values; the call only
    // validates and inspects them (a zero timeout, wait-all never satisfied).
    let r = unsafe { WaitForMultipleObjects(2, handles.as_ptr(), 1, 0) };
    if r == WAIT_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Phase;

    #[test]
    fn a_phase_round_trips_through_its_word() {
        for g in [0, 1, 0xff, 0x100, 0xdead_beef, u32::MAX] {
            for p in [
                Phase::Armed(g),
                Phase::Disarmed,
                Phase::Fired(g),
                Phase::Kept,
            ] {
                assert_eq!(Phase::of(p.word()), p, "{g:#x}");
            }
            assert_ne!(Phase::Armed(g).word(), Phase::Fired(g).word());
        }
        // Armings of different generations are different words (a swap from
        // one never succeeds on the other).
        assert_ne!(Phase::Armed(1).word(), Phase::Armed(2).word());
    }
}
