//! A poller for the model checker: the crate's protocol (`Notifies` and the
//! deliver loop, `src/wake.rs`) over a model kernel.
//!
//! The model kernel's waker behaves as every backend's does (backend contract,
//! `Driver::wake`): a wake-up reaches at least one wait, blocked now or the next;
//! several wake-ups that no wait has seen merge into one; a blocked wait that
//! another wait's wake-up reached first goes on waiting. The kernel can also hold
//! stale events (a wait that fetches one returns `Fetched::Events` with nothing
//! appended, as the poller's wait does after dropping a stale event), and a clock
//! that expires once: a wait with a timeout returns `Fetched::Nothing` after that.

use crate::event::{Event, Events, Readiness};
use crate::token::Token;
use crate::wake::{self, Fetched, Notifies, Source};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Condvar, Mutex};
use std::io;
use std::time::Duration;

/// The timeout a timed `deliver` in the model passes: any nonzero value; the
/// model's clock decides when it has passed.
pub(super) const TIMED: Option<Duration> = Some(Duration::from_secs(1));

/// The model kernel.
#[derive(Default)]
struct Kernel {
    /// The binary waker: a wake-up no wait has taken yet.
    woken: bool,
    /// Stale events queued (each ends one wait, and is dropped by it).
    stale: usize,
    /// The clock passed every deadline.
    expired: bool,
}

/// A poller in the model. See the module docs.
pub(super) struct Model {
    notifies: Notifies,
    kernel_turn: AtomicBool,
    /// Synthetic events queued, by slot (each current: always-ready registrations
    /// armed once).
    synthetic: Mutex<Vec<u32>>,
    kernel: Mutex<Kernel>,
    /// Signalled for every change to `kernel`.
    changed: Condvar,
}

/// What one `deliver` returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Delivered {
    /// The slots of the events delivered.
    pub(super) slots: Vec<u32>,
    pub(super) notified: bool,
    pub(super) shutdown: bool,
}

impl Model {
    pub(super) fn new() -> Model {
        Model {
            notifies: Notifies::new(),
            kernel_turn: AtomicBool::new(false),
            synthetic: Mutex::new(Vec::new()),
            kernel: Mutex::new(Kernel::default()),
            changed: Condvar::new(),
        }
    }

    /// `Poller::deliver`: the same loop, with the model's clock as the deadline.
    pub(super) fn deliver(&self, capacity: usize, timeout: Option<Duration>) -> Delivered {
        let mut events = Events::with_capacity(capacity);
        // Only a timed deliver looks at the clock (one scheduling point less per
        // loop for the others).
        let left = || match timeout {
            Some(t) if !t.is_zero() && self.expired() => Some(Duration::ZERO),
            t => t,
        };
        let n = wake::deliver(self, &mut events, left).expect("the model kernel never fails");
        assert_eq!(n, events.len());
        let delivered = Delivered {
            slots: events.iter().map(|e| e.token().slot()).collect(),
            notified: events.is_notified(),
            shutdown: events.is_shutdown(),
        };
        if delivered.slots.is_empty() && !delivered.notified && !delivered.shutdown {
            // A zero timeout's deadline is its entry.
            assert!(
                timeout == Some(Duration::ZERO) || (timeout.is_some() && self.expired()),
                "deliver({timeout:?}) returned Ok(0), not notified, before its deadline"
            );
        }
        delivered
    }

    /// `Poller::notify`.
    pub(super) fn notify(&self) {
        self.notifies
            .notify(|| self.wake())
            .expect("the model waker never fails");
    }

    /// `Poller::shutdown`.
    pub(super) fn shutdown(&self) {
        self.notifies
            .shutdown(|| self.wake())
            .expect("the model waker never fails");
    }

    /// `Poller::arm` of an always-ready registration in `slot`: queue its synthetic
    /// event, then wake a blocked waiter (`Poller::queue_synthetic`, `Poller::arm`).
    pub(super) fn arm_always_ready(&self, slot: u32) {
        let wake = {
            let mut queue = self.synthetic.lock().unwrap();
            if !queue.contains(&slot) {
                queue.push(slot);
            }
            self.notifies.synthetic_queued()
        };
        if wake {
            self.wake().expect("the model waker never fails");
        }
    }

    /// The kernel reports an event whose generation is stale (a disarmed socket's
    /// hang-up, a dup's event): the wait that fetches it drops it.
    pub(super) fn stale_event(&self) {
        self.kernel.lock().unwrap().stale += 1;
        self.changed.notify_all();
    }

    /// Every deadline passes.
    pub(super) fn expire(&self) {
        self.kernel.lock().unwrap().expired = true;
        self.changed.notify_all();
    }

    fn expired(&self) -> bool {
        self.kernel.lock().unwrap().expired
    }

    /// A kernel wake-up that is not a notify (an arm's wake-up for a synthetic
    /// event that another deliver took): the wait it reaches finds none pending.
    pub(super) fn wake_not_notify(&self) {
        let _ = self.wake();
    }

    /// Notifies pending and threads counted as waiting.
    pub(super) fn counters(&self) -> (usize, usize) {
        (self.notifies.pending(), self.notifies.waiters())
    }

    /// Threads counted as waiting.
    pub(super) fn waiters(&self) -> usize {
        self.notifies.waiters()
    }

    /// Synthetic events still queued.
    pub(super) fn queued(&self) -> usize {
        self.synthetic.lock().unwrap().len()
    }
}

impl Source for Model {
    fn notifies(&self) -> &Notifies {
        &self.notifies
    }

    fn kernel_turn(&self) -> bool {
        self.kernel_turn.fetch_xor(true, Ordering::Relaxed)
    }

    fn take_synthetic(&self, events: &mut Events) {
        let taken: Vec<u32> = {
            let mut queue = self.synthetic.lock().unwrap();
            let n = queue.len().min(events.remaining());
            let taken = queue.drain(..n).collect();
            if queue.is_empty() {
                self.notifies.synthetic_drained();
            }
            taken
        };
        for slot in taken {
            events.push(Event {
                token: Token::new(slot, 0),
                key: 0,
                readiness: Readiness::READABLE,
            });
        }
    }

    fn wait(&self, _events: &mut Events, timeout: Option<Duration>) -> io::Result<Fetched> {
        let mut kernel = self.kernel.lock().unwrap();
        loop {
            if kernel.woken {
                kernel.woken = false;
                return Ok(Fetched::Woken);
            }
            if kernel.stale > 0 {
                kernel.stale -= 1;
                return Ok(Fetched::Events);
            }
            if timeout == Some(Duration::ZERO) || (timeout.is_some() && kernel.expired) {
                return Ok(Fetched::Nothing);
            }
            kernel = self.changed.wait(kernel).unwrap();
        }
    }

    fn wake(&self) -> io::Result<()> {
        self.kernel.lock().unwrap().woken = true;
        // One blocked wait takes the wake-up; the others that wake (none here, but
        // a kernel may wake several) find it taken and wait on.
        self.changed.notify_one();
        Ok(())
    }
}
