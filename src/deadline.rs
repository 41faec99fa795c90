//! A wait's deadline, taken once when the wait starts. `Poller::deliver`, every
//! backend's wait loop and `blocking::io_once` use it, so a wait that goes round
//! again (it fetched only stale events, or was woken to see a change) waits for
//! the time that is left, not the whole timeout again.

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
    pub(crate) fn new(timeout: Option<Duration>) -> Deadline {
        match timeout {
            None => Deadline::Never,
            Some(t) if t.is_zero() => Deadline::Now,
            Some(t) => match Instant::now().checked_add(t) {
                Some(at) => Deadline::At(at),
                None => Deadline::Far(t),
            },
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

#[cfg(test)]
mod tests {
    use super::Deadline;
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
}
