//! A wait's deadline, taken once when the wait starts. `Poller::deliver`, every
//! backend's wait loop and `blocking::io_once` use it, so a wait that goes round
//! again (it fetched only stale events, or was woken to see a change) waits for
//! the time that is left, not the whole timeout again.
//!
//! [`Countdown`] is the form a wait loop uses: it reads the clock once, at its
//! first wait, and again only for a wait that goes round; `None` and zero
//! timeouts never read it.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// When a wait must end, from its `timeout` (`None`: never).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deadline {
    /// Block until an event or a notify.
    Never,
    /// Never block: the timeout was zero.
    Now,
    /// Wait until this instant.
    At(Instant),
    /// Too far to represent as an `Instant`: wait this long, again and again.
    Far(Duration),
}

impl Deadline {
    /// The deadline of a wait that starts now.
    #[inline]
    pub(crate) fn new(timeout: Option<Duration>) -> Deadline {
        match timeout {
            None => Deadline::Never,
            Some(t) if t.is_zero() => Deadline::Now,
            Some(t) => Deadline::after(t),
        }
    }

    /// The deadline `t` (not zero) from now: the one clock read. Out of line,
    /// so that `new` of `None` or zero is a constant where it is inlined.
    #[inline(never)]
    fn after(t: Duration) -> Deadline {
        match Instant::now().checked_add(t) {
            Some(at) => Deadline::At(at),
            None => Deadline::Far(t),
        }
    }

    /// The timeout for the next wait: `None` for no limit, the time left, or zero
    /// once the deadline has passed (and always for [`Deadline::Now`]).
    #[inline]
    pub(crate) fn left(&self) -> Option<Duration> {
        match *self {
            Deadline::Never => None,
            Deadline::Now => Some(Duration::ZERO),
            Deadline::At(at) => Some(at.saturating_duration_since(Instant::now())),
            Deadline::Far(t) => Some(t),
        }
    }

    /// Whether no time is left: a zero timeout, or a deadline that has passed.
    #[inline]
    #[cfg_attr(windows, allow(dead_code))] // used by the poll(2) paths only
    pub(crate) fn passed(&self) -> bool {
        self.left() == Some(Duration::ZERO)
    }
}

/// The timeouts of a call's waits, for a deadline taken at the first of them.
///
/// The first [`left`](Self::left) answers the whole timeout and takes the deadline
/// then (one clock read, none for `None` or zero); later ones answer the time left
/// (one clock read each). The deadline is thus at least `timeout` after the call
/// began: a wait never ends early, and a call that waits again does not wait the
/// whole timeout again.
#[derive(Debug)]
pub(crate) struct Countdown {
    timeout: Option<Duration>,
    /// Taken by the first `left`.
    deadline: Cell<Option<Deadline>>,
}

impl Countdown {
    /// A countdown of `timeout` (`None`: no limit); reads no clock.
    #[inline]
    pub(crate) fn new(timeout: Option<Duration>) -> Countdown {
        Countdown {
            timeout,
            deadline: Cell::new(None),
        }
    }

    /// The timeout for the next wait: the whole timeout the first time, then the
    /// time left (zero once passed), as [`Deadline::left`].
    #[inline]
    pub(crate) fn left(&self) -> Option<Duration> {
        match self.deadline.get() {
            Some(deadline) => deadline.left(),
            None => {
                self.deadline.set(Some(Deadline::new(self.timeout)));
                self.timeout
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Countdown, Deadline};
    use std::time::Duration;

    #[test]
    fn kinds_of_timeout() {
        assert_eq!(Deadline::new(None), Deadline::Never);
        assert_eq!(Deadline::new(None).left(), None);
        assert_eq!(Deadline::new(Some(Duration::ZERO)), Deadline::Now);
        assert!(Deadline::new(Some(Duration::ZERO)).passed());
        assert_eq!(
            Deadline::new(Some(Duration::MAX)),
            Deadline::Far(Duration::MAX)
        );
        assert_eq!(
            Deadline::new(Some(Duration::MAX)).left(),
            Some(Duration::MAX)
        );
        assert!(!Deadline::new(None).passed());
    }

    #[test]
    fn time_left_shrinks_and_reaches_zero() {
        let d = Deadline::new(Some(Duration::from_millis(30)));
        let first = d.left().unwrap();
        assert!(first <= Duration::from_millis(30) && !first.is_zero());
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(d.left(), Some(Duration::ZERO));
        assert!(d.passed());
    }

    #[test]
    fn a_countdown_answers_the_whole_timeout_first_then_the_time_left() {
        let c = Countdown::new(Some(Duration::from_millis(30)));
        assert_eq!(c.left(), Some(Duration::from_millis(30)));
        let second = c.left().unwrap();
        assert!(second <= Duration::from_millis(30));
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(c.left(), Some(Duration::ZERO));
        let never = Countdown::new(None);
        assert_eq!((never.left(), never.left()), (None, None));
        let now = Countdown::new(Some(Duration::ZERO));
        assert_eq!(
            (now.left(), now.left()),
            (Some(Duration::ZERO), Some(Duration::ZERO))
        );
        let far = Countdown::new(Some(Duration::MAX));
        assert_eq!(
            (far.left(), far.left()),
            (Some(Duration::MAX), Some(Duration::MAX))
        );
    }
}
