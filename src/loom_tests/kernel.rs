//! A kernel for a real [`Poller`](crate::Poller) under loom: a backend whose
//! registrations and readiness live in a loom mutex, so the poller's own code
//! (the table, `register`, `arm`, `deregister`, `deliver`'s acceptance check)
//! runs under the model checker. epoll's contract: the tag is the generation,
//! one event per arming (oneshot), `add` of a present number is EEXIST, `modify`
//! of an absent one ENOENT. Waits never block (the scenarios deliver with a zero
//! timeout); the waker is a flag the next wait takes.

use crate::backend::{Backend, Driver, RawEvent, Tag};
use crate::event::Readiness;
use crate::interest::Interest;
use crate::state::KernelError;
use crate::stats::Counters;
use loom::sync::Mutex;
use std::collections::BTreeMap;
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

#[derive(Debug, Default)]
struct State {
    /// Per number: the tag of the last command and the interest it is armed for.
    entries: BTreeMap<RawFd, (Tag, Option<Interest>)>,
    /// Per number: what the description behind it is ready for.
    ready: BTreeMap<RawFd, Readiness>,
    woken: bool,
}

/// The backend. See the module docs.
#[derive(Debug)]
pub(crate) struct LoomKernel {
    state: Mutex<State>,
    counters: Counters,
}

impl LoomKernel {
    /// Makes the description behind `fd` ready for `readiness`.
    pub(crate) fn set_ready(&self, fd: RawFd, readiness: Readiness) {
        self.state.lock().unwrap().ready.insert(fd, readiness);
    }

    /// What the kernel holds for `fd`: the tag's generation and the interest it
    /// is armed for.
    pub(crate) fn entry(&self, fd: RawFd) -> Option<(u32, Option<Interest>)> {
        let state = self.state.lock().unwrap();
        state
            .entries
            .get(&fd)
            .map(|(tag, armed)| (tag.generation, *armed))
    }

    fn command(
        &self,
        fd: RawFd,
        f: impl FnOnce(Option<&mut (Tag, Option<Interest>)>) -> Result<(), KernelError>,
    ) -> Result<(), KernelError> {
        f(self.state.lock().unwrap().entries.get_mut(&fd))
    }
}

impl Backend for LoomKernel {}

impl Driver for LoomKernel {
    const NAME: &'static str = "loom";
    const TAG_IS_GENERATION: bool = true;
    const SPLIT_FILTERS: bool = false;

    fn new() -> io::Result<Self> {
        Ok(LoomKernel {
            state: Mutex::new(State::default()),
            counters: Counters::default(),
        })
    }

    fn add(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        let mut state = self.state.lock().unwrap();
        if state.entries.contains_key(&fd) {
            return Err(KernelError::Exists);
        }
        state.entries.insert(fd, (tag, Some(interest)));
        Ok(())
    }

    fn modify(&self, fd: RawFd, tag: Tag, interest: Interest) -> Result<(), KernelError> {
        self.command(fd, |e| {
            *e.ok_or(KernelError::NotFound)? = (tag, Some(interest));
            Ok(())
        })
    }

    fn quiet(&self, fd: RawFd, tag: Tag) -> Result<(), KernelError> {
        self.command(fd, |e| {
            *e.ok_or(KernelError::NotFound)? = (tag, None);
            Ok(())
        })
    }

    fn delete(&self, fd: RawFd, _tag: Tag) -> Result<(), KernelError> {
        let mut state = self.state.lock().unwrap();
        state
            .entries
            .remove(&fd)
            .map(drop)
            .ok_or(KernelError::NotFound)
    }

    fn wait(
        &self,
        out: &mut Vec<RawEvent>,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        assert_eq!(
            timeout,
            Some(Duration::ZERO),
            "the loom kernel never blocks"
        );
        let mut state = self.state.lock().unwrap();
        let State {
            entries,
            ready,
            woken,
        } = &mut *state;
        for (fd, (tag, armed)) in entries.iter_mut() {
            if out.len() >= max {
                break;
            }
            let Some(interest) = *armed else { continue };
            let r = ready.get(fd).copied().unwrap_or(Readiness::EMPTY);
            if r.for_interest(interest) != Readiness::EMPTY {
                *armed = None; // oneshot: the report disarms
                out.push(RawEvent {
                    slot: tag.slot,
                    stamp: tag.generation,
                    readiness: r,
                });
            }
        }
        Ok(std::mem::take(woken))
    }

    fn wake(&self) -> io::Result<()> {
        self.state.lock().unwrap().woken = true;
        Ok(())
    }

    fn reinit_after_fork(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn owns_fd(&self, _fd: RawFd) -> bool {
        false
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }
}
