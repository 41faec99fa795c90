//! [`Events`]: the caller's list of readiness events, filled by `wait`.

use crate::Event;
use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::num::NonZeroUsize;

/// A list of readiness [`Event`]s that [`Poller::wait`](crate::Poller::wait)
/// appends to (it never clears it: call [`clear`](Self::clear) between waits when
/// only the new events matter).
///
/// One `wait` collects at most [`capacity`](Self::capacity) events from the kernel;
/// the list itself grows past that if it is not cleared. `Send`, not `Sync`: one
/// list per waiting thread.
pub struct Events {
    pub(crate) list: Vec<Event>,
    /// pollshot's buffer for one delivery, translated into `list`.
    pub(crate) raw: pollshot::Events,
    cap: NonZeroUsize,
    _not_sync: PhantomData<Cell<()>>,
}

impl Events {
    /// The capacity of [`Events::new`]: 1024 events per `wait`.
    const DEFAULT_CAPACITY: NonZeroUsize = match NonZeroUsize::new(1024) {
        Some(n) => n,
        None => unreachable!(),
    };

    /// An empty list collecting up to 1024 events per `wait`.
    pub fn new() -> Events {
        Events::with_capacity(Events::DEFAULT_CAPACITY)
    }

    /// An empty list collecting up to `capacity` events per `wait`. The memory for
    /// them is reserved here (pollshot caps one delivery at
    /// `pollshot::Events::MAX_CAPACITY`, 65,536 events; a larger `capacity` is kept
    /// as the list's reservation and reported by [`capacity`](Self::capacity)).
    pub fn with_capacity(capacity: NonZeroUsize) -> Events {
        Events {
            list: Vec::with_capacity(capacity.get()),
            raw: pollshot::Events::with_capacity(capacity.get()),
            cap: capacity,
            _not_sync: PhantomData,
        }
    }

    /// The events held, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = Event> + '_ {
        self.list.iter().copied()
    }

    /// Forgets the events held.
    pub fn clear(&mut self) {
        self.list.clear();
    }

    /// The number of events held.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether no event is held.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The capacity given at creation: the most events one `wait` collects.
    pub fn capacity(&self) -> NonZeroUsize {
        self.cap
    }
}

impl Default for Events {
    fn default() -> Events {
        Events::new()
    }
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Events")
            .field("len", &self.list.len())
            .field("capacity", &self.cap)
            .finish()
    }
}
