//! Deregistration: when `deregister` returns, no poll request of the registration
//! is left in the kernel, so the ring holds no reference to its file.
//!
//! A poll request holds a reference to the open file from its submission until it
//! ends, and a remove only asks for its end: the kernel marks the request
//! cancelled and completes it through task work run by the thread that submitted
//! it (`io_poll_remove` and `io_poll_cancel_req` in io_uring/poll.c, then
//! `io_req_task_complete`), which posts its completion (`-ECANCELED`) and frees the
//! request (`io_free_batch_list` puts the file). A deregister therefore submits the
//! remove at once and waits until every request of the slot has ended: the count
//! of requests in flight in the slot's word (`slots.rs`), pushed minus taken, is
//! 0.
//!
//! Who takes that completion is the hand-over's rule (`handover.rs`,
//! [`Handover::depart`](crate::uring_handover::Handover::depart)): with the ring
//! free, the deregistering thread leads one `io_uring_enter` that submits the
//! remove and waits for a completion, and takes what the queue holds
//! (completions of other slots are parked in `Shared::parked` for the next
//! wait); with the ring held, it submits the remove (one `io_uring_enter`
//! without waiting) and sleeps until the leader, which nobody else takes
//! completions from, returns for the completion and takes it.
//!
//! When the kernel refuses an enter (EAGAIN or ENOMEM: it could not allocate),
//! `deregister` returns that error. Nothing of the remove was submitted (an enter
//! answers an error only when it submitted nothing), so it stays queued for the
//! next enter; the slot's requests are still counted in flight, and a
//! `deregister` of the same registration again waits for them as the first
//! would have. EINTR (a signal, or the kernel's task-work notification) and EBUSY
//! (completions in the overflow list, which the next take flushes) look again.

use super::ring::Ring;
use crate::state::KernelError;

impl Ring {
    /// Waits until no poll request of `slot` is left (see the module docs). The
    /// caller has queued the removes.
    pub(super) fn depart(&self, slot: u32) -> Result<(), KernelError> {
        self.handover.depart(self, slot).map_err(KernelError::Other)
    }
}
