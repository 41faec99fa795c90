//! The pure arm/disarm state machine every backend runs. No system calls here.
//!
//! A registration's state is a [`RegState`]: its [`Phase`] (fresh, idle, armed with
//! an interest), its arming *generation*, and whether the kernel refused to poll its
//! descriptor (then it is *always ready*). Each operation consults the state, issues
//! at most the kernel commands the design's table names through a [`Kernel`] (the
//! backend's translation for one descriptor), applies the fallbacks, and moves to the
//! next state. This is the table of `DESIGN.md`, one row per match arm:
//!
//! | state | operation | kernel command | next state |
//! |---|---|---|---|
//! | fresh | arm(i) | add(i); on EEXIST: modify(i) | armed(i, g+1) |
//! | idle | arm(i) | modify(i); on ENOENT: add(i) | armed(i, g+1) |
//! | armed(i, g) | arm(i) | none | armed(i, g) |
//! | armed(i, g) | arm(j), j != i | modify(j); on ENOENT: add(j) | armed(j, g+1) |
//! | armed(i, g) | disarm | quiet | idle, g+1 |
//! | fresh or idle | disarm | none | unchanged |
//! | armed(i, g) | kernel event tagged g | none | idle; delivered |
//! | any | event tagged g' != g | none | unchanged; dropped as stale |
//! | in kernel | deregister | delete; ENOENT, EBADF are not errors | freed |
//! | fresh | deregister | none | freed |
//!
//! A refusal that means "this descriptor cannot be polled" (epoll's EPERM for regular
//! files and `/dev/null`, kqueue's EINVAL for some devices) makes the registration
//! *always ready*: it is never in the kernel, each arm costs no system call and asks
//! the caller for one synthetic event, and deregistration issues no delete.
//!
//! The state of one registration has one owner at a time (the poller keeps it behind
//! a mutex and holds it across the kernel command), so after every completed
//! operation the kernel's view equals the table's.

use crate::Interest;
use std::io;

/// The kernel's answer to a command, classified by what the state machine does next.
#[derive(Debug)]
pub enum KernelError {
    /// The descriptor is not in the kernel's set (epoll ENOENT on MOD; kqueue ENOENT
    /// on `EV_ENABLE`/`EV_DISABLE`): the descriptor was closed, or its number reused.
    NotFound,
    /// The descriptor is already in the kernel's set (epoll EEXIST on ADD): a dup of
    /// an earlier registration's description is still there.
    Exists,
    /// The kernel cannot poll this descriptor (epoll EPERM on regular files and
    /// `/dev/null`; kqueue EINVAL on some devices): treat it as always ready.
    NotPollable,
    /// The descriptor number is not open (EBADF).
    BadFd,
    /// Anything else, passed to the caller unchanged.
    Other(io::Error),
}

/// One descriptor's view of the kernel: the four commands a backend translates.
///
/// `generation` is the arming generation the command installs; backends whose tag
/// carries it (epoll) write it into the kernel, others (kqueue) ignore it.
pub trait Kernel {
    /// Add the descriptor, armed for `interest` (epoll `EPOLL_CTL_ADD` with
    /// `EPOLLONESHOT`; kqueue `EV_ADD | EV_DISPATCH`).
    fn add(&mut self, interest: Interest, generation: u32) -> Result<(), KernelError>;
    /// Re-arm a descriptor the kernel holds (epoll `EPOLL_CTL_MOD` with
    /// `EPOLLONESHOT`; kqueue `EV_ENABLE | EV_DISPATCH`).
    fn modify(&mut self, interest: Interest, generation: u32) -> Result<(), KernelError>;
    /// Quiet it without removing it (epoll MOD to `EPOLLONESHOT` alone; kqueue
    /// `EV_DISABLE | EV_DISPATCH`).
    fn quiet(&mut self, generation: u32) -> Result<(), KernelError>;
    /// Remove it (epoll `EPOLL_CTL_DEL`; kqueue `EV_DELETE`).
    fn delete(&mut self) -> Result<(), KernelError>;
}

/// Where a registration stands with the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not in the kernel (never armed, or the kernel dropped it).
    Fresh,
    /// In the kernel, quiet: it will not be reported.
    Idle,
    /// In the kernel, armed for this interest: one report will come when ready.
    Armed(Interest),
}

/// What an arm did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Armed {
    /// Already armed for this interest: no command issued.
    Unchanged,
    /// The kernel was told (one command, or two with a fallback).
    Kernel,
    /// The descriptor is always ready: the caller must queue one synthetic event
    /// tagged with the current generation.
    Synthetic,
}

/// Which fallbacks an operation took, for the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fallbacks {
    /// MOD answered ENOENT and became ADD.
    pub not_found_to_add: bool,
    /// ADD answered EEXIST and became MOD.
    pub exists_to_modify: bool,
    /// The kernel refused the descriptor; it is now always ready.
    pub not_pollable: bool,
}

/// One registration's state: phase, generation and the always-ready mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegState {
    phase: Phase,
    generation: u32,
    always_ready: bool,
}

impl RegState {
    /// A fresh registration whose first arming will be `generation + 1`.
    ///
    /// The poller starts each registration above every generation its slot used
    /// before, so that events still queued for an earlier registration are stale.
    pub const fn new(generation: u32) -> RegState {
        RegState {
            phase: Phase::Fresh,
            generation,
            always_ready: false,
        }
    }

    /// The phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The current generation: the tag a current kernel event carries.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Whether the kernel refused to poll the descriptor (reported always ready).
    pub fn is_always_ready(&self) -> bool {
        self.always_ready
    }

    /// Whether the kernel holds the descriptor (a delete is owed at deregistration).
    pub fn in_kernel(&self) -> bool {
        !self.always_ready && self.phase != Phase::Fresh
    }

    /// Arm for `interest`. See the module table; `fallbacks` records the fallbacks
    /// taken. On an error the state is unchanged, except that a descriptor the
    /// kernel refuses to poll becomes always ready (which is not an error).
    pub fn arm<K: Kernel>(
        &mut self,
        interest: Interest,
        kernel: &mut K,
        fallbacks: &mut Fallbacks,
    ) -> Result<Armed, KernelError> {
        if self.phase == Phase::Armed(interest) {
            return Ok(Armed::Unchanged);
        }
        let next = self.generation.wrapping_add(1);
        if self.always_ready {
            self.generation = next;
            self.phase = Phase::Armed(interest);
            return Ok(Armed::Synthetic);
        }
        let result = match self.phase {
            Phase::Fresh => match kernel.add(interest, next) {
                Err(KernelError::Exists) => {
                    fallbacks.exists_to_modify = true;
                    kernel.modify(interest, next)
                }
                other => other,
            },
            Phase::Idle | Phase::Armed(_) => match kernel.modify(interest, next) {
                Err(KernelError::NotFound) => {
                    fallbacks.not_found_to_add = true;
                    kernel.add(interest, next)
                }
                other => other,
            },
        };
        match result {
            Ok(()) => {
                self.generation = next;
                self.phase = Phase::Armed(interest);
                Ok(Armed::Kernel)
            }
            Err(KernelError::NotPollable) => {
                fallbacks.not_pollable = true;
                self.always_ready = true;
                self.generation = next;
                self.phase = Phase::Armed(interest);
                Ok(Armed::Synthetic)
            }
            Err(e) => Err(e),
        }
    }

    /// Disarm: quiet an armed registration; nothing for a fresh or idle one.
    ///
    /// ENOENT means the kernel already dropped the descriptor: the registration is
    /// fresh afterwards. EBADF (the number is closed) also leaves it fresh with a new
    /// generation, so nothing more is delivered for it, and is returned as an error.
    pub fn disarm<K: Kernel>(&mut self, kernel: &mut K) -> Result<bool, KernelError> {
        if !matches!(self.phase, Phase::Armed(_)) {
            return Ok(false);
        }
        let next = self.generation.wrapping_add(1);
        if self.always_ready {
            self.generation = next;
            self.phase = Phase::Idle;
            return Ok(false);
        }
        match kernel.quiet(next) {
            Ok(()) => {
                self.generation = next;
                self.phase = Phase::Idle;
                Ok(true)
            }
            Err(KernelError::NotFound) => {
                self.generation = next;
                self.phase = Phase::Fresh;
                Ok(true)
            }
            Err(KernelError::BadFd) => {
                self.generation = next;
                self.phase = Phase::Fresh;
                Err(KernelError::BadFd)
            }
            Err(e) => Err(e),
        }
    }

    /// A kernel (or synthetic) event arrived. `tag` is the generation it carries,
    /// or `None` for backends that keep the generation only in the table (kqueue:
    /// the event is current exactly when the registration is armed).
    ///
    /// Returns the interest of the arming it completes, or `None` when the event is
    /// stale and must be dropped.
    pub fn on_event(&mut self, tag: Option<u32>) -> Option<Interest> {
        match self.phase {
            Phase::Armed(interest) if tag.map_or(true, |g| g == self.generation) => {
                self.phase = Phase::Idle;
                Some(interest)
            }
            _ => None,
        }
    }

    /// Deregister: delete from the kernel if it holds the descriptor. ENOENT and
    /// EBADF mean the kernel already dropped it (the descriptor was closed) and
    /// are not errors. Afterwards the state is fresh with a new generation.
    pub fn deregister<K: Kernel>(&mut self, kernel: &mut K) -> Result<bool, KernelError> {
        let owed = self.in_kernel();
        self.generation = self.generation.wrapping_add(1);
        self.phase = Phase::Fresh;
        if !owed {
            return Ok(false);
        }
        match kernel.delete() {
            Ok(()) | Err(KernelError::NotFound) | Err(KernelError::BadFd) => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// The descriptor moved to a new kernel instance (after fork): nothing is in
    /// the new kernel. An armed registration stays armed in the table and is
    /// re-added by [`RegState::rearm_fresh`].
    pub fn forget_kernel(&mut self) {
        if !self.always_ready && self.phase == Phase::Idle {
            self.phase = Phase::Fresh;
        }
    }

    /// After [`forget_kernel`](Self::forget_kernel): add an armed registration to the
    /// new kernel with a new generation. Returns what [`arm`](Self::arm) returns.
    pub fn rearm_fresh<K: Kernel>(
        &mut self,
        kernel: &mut K,
        fallbacks: &mut Fallbacks,
    ) -> Result<Armed, KernelError> {
        match self.phase {
            Phase::Armed(interest) => {
                self.phase = Phase::Fresh;
                if self.always_ready {
                    self.phase = Phase::Idle;
                }
                self.arm(interest, kernel, fallbacks)
            }
            _ => Ok(Armed::Unchanged),
        }
    }
}
