//! The kqueue backend (FreeBSD, NetBSD, OpenBSD, DragonFly, macOS, iOS; on Linux
//! against libkqueue with `--cfg pollshot_libkqueue`, or against a NetBSD rump
//! kernel with `--cfg pollshot_rump`): `EV_DISPATCH` on every arm.
//!
//! The rooms, each with one job:
//!
//! - [`changes`] (`changes.rs`), compiled on every target: the pure translation
//!   from the state machine's commands (add, modify, quiet, delete) to kevent change
//!   records, and from returned kevents to [`Readiness`](crate::event::Readiness). It is
//!   unit-tested on Linux (`changes_tests.rs`, row by row of the state table;
//!   `parity_tests.rs`, against epoll through the kernel model) and used by the
//!   kernel model.
//! - the backend itself, `Kqueue`, compiled where a kqueue exists
//!   (`cfg(pollshot_kqueue)`):
//!   - `sys.rs`, the system interface: `struct kevent` and the FFI for libkqueue,
//!     the flag values asserted against the target's headers, record builders, and
//!     the one `kevent` wrapper (`sys::call`) and `kqueue` wrapper
//!     (`sys::new_kqueue`), and the descriptors the backend owns (`sys::Fd`);
//!     on a rump kernel, `sys_rump.rs` gives it the rump kernel's `struct
//!     kevent`, system calls and descriptors (NetBSD 7.99's kqueue, run in the
//!     process: `tests/rump.rs`, `tests/rump_suite.rs`), and `rump.rs`, public
//!     as `pollshot::rump`, the rump descriptors that tests, benches and the
//!     main job register there;
//!   - `backend.rs`, the [`Backend`](crate::backend::Backend) impl: the kqueue and
//!     its waker, and every call of `sys::call` (the waker's registration and
//!     trigger, change-only submissions, the wait that carries queued changes);
//!   - `command.rs`, one command for one registration: translate, route, and act
//!     on the kernel's answers;
//!   - `queue.rs`, the bookkeeping under the backend's mutex: the change queue,
//!     the records in calls that have not returned, the views of registrations,
//!     the routing rule (queue or submit now) and the drain of a deregistered
//!     descriptor. No system call; compiled on every target and model-checked
//!     with loom (`queue_loom.rs`).
//!
//! # What the kernel is told
//!
//! One knote per filter: `EVFILT_READ` for readable, `EVFILT_WRITE` for writable.
//!
//! - first arm: `EV_ADD | EV_DISPATCH` for each filter in the interest; the other
//!   filter is not added.
//! - re-arm: `EV_ADD | EV_ENABLE | EV_DISPATCH` for each filter in the interest
//!   (see "The re-arm record" below), `EV_DISABLE | EV_DISPATCH` for an enabled
//!   filter outside it. `EV_DISPATCH` stays on every change, or a re-arm could
//!   fire twice. On libkqueue the re-arm record also has `EV_CLEAR`
//!   (`sys::ENABLE_EXTRA`), the only record that makes it store `udata` on an
//!   existing knote.
//! - disarm: `EV_DISABLE | EV_DISPATCH` for each enabled filter.
//! - deregister: `EV_DELETE` for each added filter, submitted before `deregister`
//!   returns, with the descriptor's queued records ahead of them, once no `kevent`
//!   call carries a record of it (`queue.rs`, "Ownership"); ENOENT and EBADF mean
//!   the descriptor was closed and the kernel already dropped its knotes. A
//!   registration superseded by a new one of the same number sends its deletes
//!   with the new one's first command on the number.
//! - `udata` is `pack_usize(slot, generation)` of the command (see `token.rs`) on
//!   every 64-bit target: every kernel stores the re-arm record's `udata`, so an
//!   event tells its arming, as on epoll (`Driver::TAG_IS_GENERATION`). A 32-bit
//!   `udata` has no room for the generation: there `udata` is
//!   `pack_usize(slot, incarnation)`, fixed at `EV_ADD`, the arming generation
//!   lives in the poller's table, and an event is current exactly when the table
//!   says armed (`sys::UDATA_IS_GENERATION`).
//! - one delivery disarms the whole registration (parity with `EPOLLONESHOT`): the
//!   kernel disabled the filter that fired; [`Driver::delivered`](crate::backend::Driver::delivered) disables the other
//!   one, a change that rides on the next `kevent` call (routed under the lock that
//!   read the registration's view, so a deregistration leaves none behind).
//!
//! # The re-arm record
//!
//! A knote that an `EV_DISPATCH` delivery disabled is re-armed with `EV_ADD |
//! EV_ENABLE | EV_DISPATCH`, `fflags` and `data` 0 as in the `EV_ADD` that created
//! it, because a bare `EV_ENABLE` does not mean the same on every kernel. What
//! decides it is each kernel's registration path, read in its source (a row names
//! the revision read; one marked "not read" is inferred from the revisions around
//! it):
//!
//! | kernel | `EV_ENABLE`: filter re-run (level re-report) | `EV_ENABLE`: `udata` stored | `EV_ADD` on the knote |
//! |---|---|---|---|
//! | FreeBSD 13, 14, main | yes: `kqueue_register` runs `f_event` at `done_ev_add:` | yes | re-run, stored |
//! | macOS, iOS (XNU; xnu-11417.101.15 read) | yes: `kevent_register`'s touch branch calls the filter's `f_touch` (`filt_sortouch`, `filt_sowtouch`, `filt_pipereadtouch`, `filt_pipewritetouch`), then `knote_apply_touch` clears `KN_DISABLED` and queues the knote if the touch found it ready | yes, unless the knote has `EV_UDATA_SPECIFIC` | the same touch branch: re-run, stored |
//! | DragonFly (current `kern_event.c` read; the first release with it not checked) | yes: `kqueue_register`'s modify branch (neither `EV_ADD` nor `EV_DELETE`) runs `filter_event`, whose `KNOTE_ACTIVATE` marks the knote active for the enable to queue | yes (same branch) | re-run, stored: the `EV_ADD` branch does the same for an existing knote |
//! | NetBSD 10, current | yes: `kqueue_register` runs `filter_event` at `done_ev_add:` | yes | re-run, stored |
//! | NetBSD 8, 9 (kern_event.c 1.88 read) | **no**: `knote_enqueue` queues only a knote still `KN_ACTIVE`, and the dispatch delivery (`kqueue_scan`) cleared that mark | **no** | re-run, stored: `kqueue_register`'s `EV_ADD` branch stores `udata` and runs `f_event`, whose `knote_activate` marks it active |
//! | OpenBSD 6.4+ (kern_event.c 1.101 and 1.205 read; 1.86, 6.4's change, not read) | yes: `kqueue_register` runs `f_event` (1.101), `filter_process` (1.205) | **no**: `udata` only on the `EV_ADD` path (`knote_assign`, from `filter_modify`) | re-run, stored: 1.205's `filter_modify` (`filt_sormodify`, `filt_sowmodify`, `filt_pipemodify`: `knote_modify`); 1.101 stores `kn_kevent.udata` and runs `f_event` |
//! | OpenBSD 6.2, 6.3 (not read: inferred from 1.47 and 1.101) | **no**: as NetBSD 8 (1.47's `kqueue_register` queues a re-enabled knote only if `KN_ACTIVE`) | **no** | re-run, stored: the `EV_ADD` branch on an existing knote is the same in 1.47 and 1.101 |
//!
//! On every row the knote keeps the `EV_DISPATCH` of the `EV_ADD` that created it
//! (a change to an existing knote never rewrites its flags), so the next delivery
//! disables it again (`kqueue_scan`; `knote_process` on XNU).
//!
//! So with a bare `EV_ENABLE`, a descriptor re-armed with its data still unread is
//! never reported again on NetBSD 8/9 and OpenBSD 6.2-6.3 (a lost wake-up), and
//! `udata` keeps the first arm's value on NetBSD 8/9 and OpenBSD. The `EV_ADD` of
//! the record runs in the same registration call before its `EV_ENABLE`
//! (`kqueue_register`; XNU's `kevent_register` takes both in one touch): the
//! filter is re-run and `udata` stored on every kernel in the table, and then the
//! enable queues the knote that the filter found ready. Respected with it:
//!
//! - never `EV_CLEAR` with `EV_DISPATCH`: NetBSD's `kqueue_scan` tests `EV_CLEAR`
//!   before `EV_DISPATCH` and then never disables the knote (libkqueue's extra
//!   `EV_CLEAR`, above, is libkqueue's only);
//! - a change to an existing knote overwrites its `fflags` and `data` (a low-water
//!   mark): the record passes the `Add`'s values (0) again;
//! - an `EV_ADD` of a number that was closed and reused registers the new file
//!   silently, where `EV_ENABLE` answered ENOENT: that is what the table's row
//!   "idle, arm(i): on ENOENT, add" does anyway, without the round trip. ENOENT
//!   (libkqueue, which keeps a closed number's knotes) still starts the
//!   registration over (`changes::readd`), and EINVAL (a reused number that
//!   kqueue cannot poll) is answered as to an add: always ready;
//! - an `EV_ERROR` entry written to the event list ends that `kevent` call
//!   without collecting events, on every kernel (the change loop returns once
//!   `nerrors` is non-zero: `kevent1` on NetBSD, `sys_kevent` on OpenBSD,
//!   `kqueue_kevent` on FreeBSD, `kern_kevent` on DragonFly; XNU's
//!   `kevent_internal` scans only when no entry was written): a refused record
//!   carried by a wait makes the wait return at once, and the wait loop goes on.
//!
//! # Change batching
//!
//! `kevent` takes a change list with the wait. A change made while no thread is
//! inside `kevent` is queued and rides on the next waiting call, so a re-arm costs no
//! system call of its own. A change made while a thread is blocked in `kevent` is
//! submitted at once (a change-only call with `EV_RECEIPT`), so no arm waits behind a
//! blocked wait. Changes to one descriptor reach the kernel in the order they were
//! made: a change for a descriptor whose earlier changes are still travelling with a
//! blocked waiter is queued behind them and that waiter is woken to pick it up.
//!
//! Commands that add a knote (`EV_ADD`) are always submitted at once, so that the
//! state machine gets the kernel's answer: EINVAL (a device kqueue cannot poll: the
//! registration becomes always ready, scenario P09) or EBADF.
//!
//! A batched change that the kernel refuses comes back as an `EV_ERROR` entry in
//! the event list (a BSD kernel then returns at once without waiting). ENOENT on
//! `EV_ENABLE` (the descriptor was closed and its number reused) is resubmitted as
//! `EV_ADD`; any other refusal of an arm becomes an error event for that
//! registration ([`Readiness::ERROR`](crate::event::Readiness::ERROR)), so it is never lost.
//!
//! Every change-only call sets `EV_RECEIPT` on each record and passes an event list
//! exactly as long as the change list, so the kernel answers every record (0 or an
//! errno) and returns at once; a shorter event list would stop at the first failure
//! and silently drop the rest.
//!
//! # Other details
//!
//! - Regular files: kqueue reports a file at end of file as never readable, unlike
//!   epoll and poll(2). The first arm checks the type with one fstat(2) and reports a
//!   regular file always ready (no knote), as the epoll backend does.
//! - The waker is an `EVFILT_USER` knote triggered with `NOTE_TRIGGER` (FreeBSD,
//!   DragonFly, Apple, libkqueue), a non-blocking pipe on OpenBSD and NetBSD (whose
//!   `EVFILT_USER` is recent), registered `EV_CLEAR`: a level-triggered one loses
//!   wake-ups on NetBSD 8/9 with several threads in `kevent` (`sys::pipe_waker`).
//!   Notifies coalesce until a wait consumes them.
//! - Timeouts are a timespec, `tv_sec` clamped to 10^8 s (Darwin answers EINVAL to
//!   very large values).
//! - A kqueue is not inherited across fork(2): the child makes a new one and never
//!   closes the inherited number, which it does not own.
//! - The kqueue is close-on-exec (`kqueue1(O_CLOEXEC)` on NetBSD, else `FD_CLOEXEC`
//!   right after kqueue(2)).

//!
//! # Kernel differences the backend cannot hide
//!
//! - NetBSD 7.99 to 9 never report to an armed pipe writer that its reader
//!   closed while the pipe was full: `pipeclose` (`sys_pipe.c`) wakes the
//!   reader's knote list, where the writer's write knote hangs, before it sets
//!   `PIPE_EOF`; `knote` (`kern_event.c`) runs `filt_pipewrite`, which finds the
//!   buffer still full and leaves the knote inactive, and the list is then
//!   cleared. A re-arm (its `EV_ADD` re-runs the filter in `kqueue_register`)
//!   reports write-closed. Shown on that kernel code (`tests/rump_suite.rs`,
//!   `meaning_pipe_writer_whose_reader_closed_is_write_closed`); a writer that
//!   waits on a full pipe there should re-arm on a timer.
//! - libkqueue (Linux) is no BSD kernel: it reads and clears `SO_ERROR` on an
//!   `EPOLLERR` for the read filter and the write filter alike (a refused
//!   connect's ECONNREFUSED is then gone for the caller), and a knote whose
//!   descriptor was closed without `EV_DELETE` while a dup keeps it open leaves
//!   an epoll entry that no change can remove, which makes `kevent` return at
//!   once (a `deliver` with a timeout spins to its deadline) and may point at
//!   freed state. `docs/testing.md` lists its differences.

#![cfg_attr(not(pollshot_kqueue), allow(dead_code))]

// An interface for the backend, the kernel model and the tests; not every target
// uses every item.
#[allow(dead_code)]
pub(crate) mod changes;

#[cfg(pollshot_kqueue)]
mod backend;
#[cfg(pollshot_kqueue)]
mod command;
// Pure bookkeeping, compiled everywhere so that loom can check it on any host.
#[allow(dead_code)]
mod queue;
#[cfg(pollshot_kqueue)]
mod sys;
// A NetBSD rump kernel's descriptors, public for the crate's tests, benches and
// main job (`pollshot::rump`).
#[cfg(pollshot_rump)]
pub mod rump;

#[cfg(pollshot_kqueue)]
pub use self::backend::Kqueue;

#[cfg(test)]
mod changes_tests;
#[cfg(test)]
mod parity_tests;
#[cfg(all(test, loom))]
mod queue_loom;
