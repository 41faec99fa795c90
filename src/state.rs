//! The pure arm/disarm state machine every backend runs. No system calls here.
//!
//! A registration's state is a [`RegState`]: its [`Phase`] (fresh, idle, armed with
//! an interest), its arming *generation*, and whether the kernel refused to poll its
//! descriptor (then it is *always ready*). Each operation consults the state, issues
//! at most the kernel commands the state table names through a [`Kernel`] (the
//! backend's translation for one descriptor), applies the fallbacks, and moves to the
//! next state. This is the state table of the repository's `docs/design.md`, one row
//! per match arm:
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
//! | in kernel | deregister | delete; ENOENT, EBADF, not pollable are not errors | freed |
//! | in kernel | deregister, delete refused | delete | idle, g+1 (still owed) |
//! | fresh | deregister | none | freed |
//!
//! A refusal that means "this descriptor cannot be polled" (epoll's EPERM for regular
//! files and `/dev/null`, kqueue's EINVAL for some devices) makes the registration
//! *always ready*: it is never in the kernel, each arm costs no system call and asks
//! the caller for one synthetic event, and deregistration issues no delete.
//!
//! The state of one registration has one owner at a time (the poller keeps it behind
//! its table slot's lock and holds it across the kernel command), so after every completed
//! operation the kernel's view equals the table's.

use crate::interest::Interest;
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

impl KernelError {
    /// Whether the kernel refused for want of a resource or time, so that the same
    /// command made again may succeed: ENOMEM, ENOSPC (epoll's
    /// `max_user_watches`), EAGAIN, EBUSY, EINTR (Unix errno values; elsewhere
    /// the kinds std gives ENOMEM, EAGAIN and EINTR). A refusal of the
    /// descriptor itself (EBADF, EINVAL, ELOOP, not a socket) is not.
    pub fn is_transient(&self) -> bool {
        let KernelError::Other(e) = self else {
            return false;
        };
        #[cfg(unix)]
        if let Some(errno) = e.raw_os_error() {
            return matches!(
                errno,
                libc::ENOMEM | libc::ENOSPC | libc::EAGAIN | libc::EBUSY | libc::EINTR
            );
        }
        matches!(
            e.kind(),
            io::ErrorKind::OutOfMemory | io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        )
    }
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
    /// `EPOLLONESHOT`; kqueue `EV_ADD | EV_ENABLE | EV_DISPATCH`).
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
///
/// Kept packed as the poller's table stores it, so that a slot's lock hands it
/// out and takes it back with a mask and an or, not a translation: `bits` holds
/// the always-ready mark in bit 1 and the phase in bits 2 to 5 (0 fresh,
/// 8 idle, 1 to 7 armed for that [`Interest::bits`]); bit 0 and bits
/// 6 and 7 are always 0 here (the table keeps its occupied bit in bit 0).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RegState {
    bits: u8,
    generation: u32,
}

/// [`RegState`]'s always-ready mark.
pub(crate) const ALWAYS_READY: u8 = 1 << 1;
/// Where [`RegState`]'s phase code starts.
const PHASE_SHIFT: u8 = 2;
/// The phase code of an idle registration (fresh is 0, armed the interest's bits).
const PHASE_IDLE: u8 = 8;
/// The bits a [`RegState`] uses: the always-ready mark and the phase code.
pub(crate) const STATE_BITS: u8 = ALWAYS_READY | (0b1111 << PHASE_SHIFT);

/// The packed code of `phase`.
#[inline(always)]
const fn code_of(phase: Phase) -> u8 {
    (match phase {
        Phase::Fresh => 0,
        Phase::Idle => PHASE_IDLE,
        Phase::Armed(interest) => interest.bits(),
    }) << PHASE_SHIFT
}

impl std::fmt::Debug for RegState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegState")
            .field("phase", &self.phase())
            .field("generation", &self.generation)
            .field("always_ready", &self.is_always_ready())
            .finish()
    }
}

impl RegState {
    /// A fresh registration whose first arming will be `generation + 1`.
    ///
    /// The poller starts each registration above every generation its slot used
    /// before, so that events still queued for an earlier registration are stale.
    pub const fn new(generation: u32) -> RegState {
        RegState {
            bits: 0,
            generation,
        }
    }

    /// A state from its parts, as [`phase`](Self::phase),
    /// [`generation`](Self::generation) and [`is_always_ready`](Self::is_always_ready)
    /// return them.
    #[cfg_attr(not(feature = "model"), allow(dead_code))]
    pub const fn from_parts(phase: Phase, generation: u32, always_ready: bool) -> RegState {
        RegState {
            bits: code_of(phase) | if always_ready { ALWAYS_READY } else { 0 },
            generation,
        }
    }

    /// The state in the table's packing (see [`RegState`]): `bits` as
    /// [`packed`](Self::packed) returned them (other bits are ignored).
    #[inline(always)]
    pub(crate) const fn from_packed(bits: u8, generation: u32) -> RegState {
        RegState {
            bits: bits & STATE_BITS,
            generation,
        }
    }

    /// The always-ready mark and the phase, packed (see [`RegState`]); only
    /// [`STATE_BITS`] may be set.
    #[inline(always)]
    pub(crate) const fn packed(&self) -> u8 {
        self.bits
    }

    #[inline(always)]
    const fn code(&self) -> u8 {
        self.bits & !ALWAYS_READY
    }

    #[inline(always)]
    fn set_phase(&mut self, phase: Phase) {
        self.bits = (self.bits & ALWAYS_READY) | code_of(phase);
    }

    /// The phase.
    #[cfg_attr(not(feature = "model"), allow(dead_code))]
    #[inline(always)]
    pub fn phase(&self) -> Phase {
        match self.code() >> PHASE_SHIFT {
            0 => Phase::Fresh,
            // `code_of` writes nothing else but 1..=7 (armed) and 8 (idle).
            c => Interest::from_bits(c).map_or(Phase::Idle, Phase::Armed),
        }
    }

    /// The current generation: the tag a current kernel event carries.
    #[inline(always)]
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Whether the kernel refused to poll the descriptor (reported always ready).
    #[cfg_attr(not(feature = "model"), allow(dead_code))]
    #[inline(always)]
    pub fn is_always_ready(&self) -> bool {
        self.bits & ALWAYS_READY != 0
    }

    /// Whether the kernel holds the descriptor (a delete is owed at deregistration).
    pub fn in_kernel(&self) -> bool {
        // Not fresh (code 0) and not always ready.
        self.bits != 0 && self.bits & ALWAYS_READY == 0
    }

    /// Arm for `interest`. See the module table; `fallbacks` records the fallbacks
    /// taken. On an error the state is unchanged, except that a descriptor the
    /// kernel refuses to poll becomes always ready (which is not an error).
    #[inline(always)]
    pub fn arm<K: Kernel>(
        &mut self,
        interest: Interest,
        kernel: &mut K,
        fallbacks: &mut Fallbacks,
    ) -> Result<Armed, KernelError> {
        if let Some(next) = self.rearm_generation(interest) {
            // Idle, or armed for another interest: the kernel holds it, re-arm.
            // The common case, kept small enough to inline into the caller; the
            // fallbacks are out of line.
            return match kernel.modify(interest, next) {
                Ok(()) => {
                    self.rearmed(interest, next);
                    Ok(Armed::Kernel)
                }
                Err(e) => self.modify_refused(e, interest, kernel, fallbacks),
            };
        }
        self.arm_other(interest, kernel, fallbacks)
    }

    /// The common [`arm`](Self::arm): `Some(generation)` when arming for
    /// `interest` is one kernel modify tagged with that generation (the kernel
    /// holds the registration, idle or armed for another interest, and it is not
    /// always ready); then [`rearmed`](Self::rearmed) records its success and
    /// [`modify_refused`](Self::modify_refused) handles its refusal. `None` for
    /// every other arm ([`arm`](Self::arm) itself). The poller runs these three
    /// steps inline, as `arm` composes them, so that the common re-arm builds
    /// nothing in memory.
    #[inline(always)]
    pub(crate) fn rearm_generation(&self, interest: Interest) -> Option<u32> {
        let armed = code_of(Phase::Armed(interest));
        if self.code() != armed && self.bits != code_of(Phase::Fresh) && !self.is_always_ready() {
            Some(self.generation.wrapping_add(1))
        } else {
            None
        }
    }

    /// [`rearm_generation`](Self::rearm_generation) for the commonest arm alone:
    /// `Some(generation)` when the registration is idle (its last arming was
    /// delivered or disarmed) and not always ready, one compare of the packed
    /// state; `None` for every other state, [`rearm_generation`](Self::rearm_generation)
    /// among them (armed for another interest), which [`arm`](Self::arm) handles.
    #[inline(always)]
    pub(crate) fn idle_rearm_generation(&self) -> Option<u32> {
        (self.bits == code_of(Phase::Idle)).then(|| self.generation.wrapping_add(1))
    }

    /// The kernel accepted the modify [`rearm_generation`](Self::rearm_generation)
    /// planned: armed for `interest` at generation `next`.
    #[inline(always)]
    pub(crate) fn rearmed(&mut self, interest: Interest, next: u32) {
        self.generation = next;
        self.bits = code_of(Phase::Armed(interest));
    }

    /// [`arm`](Self::arm) other than the common re-arm: unchanged (already armed
    /// for `interest`), fresh, or always ready.
    #[inline(never)]
    fn arm_other<K: Kernel>(
        &mut self,
        interest: Interest,
        kernel: &mut K,
        fallbacks: &mut Fallbacks,
    ) -> Result<Armed, KernelError> {
        if self.code() == code_of(Phase::Armed(interest)) {
            return Ok(Armed::Unchanged);
        }
        self.arm_fresh_or_always_ready(interest, kernel, fallbacks)
    }

    /// [`arm`](Self::arm) of a registration the kernel holds, whose modify the
    /// kernel refused with `e`: ENOENT becomes an add.
    #[cold]
    #[inline(never)]
    pub(crate) fn modify_refused<K: Kernel>(
        &mut self,
        e: KernelError,
        interest: Interest,
        kernel: &mut K,
        fallbacks: &mut Fallbacks,
    ) -> Result<Armed, KernelError> {
        let next = self.generation.wrapping_add(1);
        let result = match e {
            KernelError::NotFound => {
                fallbacks.not_found_to_add = true;
                kernel.add(interest, next)
            }
            other => Err(other),
        };
        self.armed_by(result, interest, fallbacks)
    }

    /// [`arm`](Self::arm) of a fresh registration (add; EEXIST becomes a
    /// modify) or an always-ready one (no command).
    #[inline(always)]
    fn arm_fresh_or_always_ready<K: Kernel>(
        &mut self,
        interest: Interest,
        kernel: &mut K,
        fallbacks: &mut Fallbacks,
    ) -> Result<Armed, KernelError> {
        let next = self.generation.wrapping_add(1);
        if self.is_always_ready() {
            self.generation = next;
            self.bits = ALWAYS_READY | code_of(Phase::Armed(interest));
            return Ok(Armed::Synthetic);
        }
        let result = match kernel.add(interest, next) {
            Err(KernelError::Exists) => {
                fallbacks.exists_to_modify = true;
                kernel.modify(interest, next)
            }
            other => other,
        };
        self.armed_by(result, interest, fallbacks)
    }

    /// The end of an arm whose kernel command (after its fallback) answered
    /// `result`: armed with the next generation, or always ready if the kernel
    /// cannot poll the descriptor; unchanged on another error.
    fn armed_by(
        &mut self,
        result: Result<(), KernelError>,
        interest: Interest,
        fallbacks: &mut Fallbacks,
    ) -> Result<Armed, KernelError> {
        let next = self.generation.wrapping_add(1);
        let armed = code_of(Phase::Armed(interest));
        match result {
            Ok(()) => {
                self.generation = next;
                self.bits = armed;
                Ok(Armed::Kernel)
            }
            Err(KernelError::NotPollable) => {
                fallbacks.not_pollable = true;
                self.generation = next;
                self.bits = ALWAYS_READY | armed;
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
    #[inline(always)]
    pub fn disarm<K: Kernel>(&mut self, kernel: &mut K) -> Result<bool, KernelError> {
        if !self.is_armed() {
            return Ok(false);
        }
        let next = self.generation.wrapping_add(1);
        if self.is_always_ready() {
            self.generation = next;
            self.set_phase(Phase::Idle);
            return Ok(false);
        }
        match kernel.quiet(next) {
            Ok(()) => {
                self.generation = next;
                self.set_phase(Phase::Idle);
                Ok(true)
            }
            Err(KernelError::NotFound) => {
                self.generation = next;
                self.set_phase(Phase::Fresh);
                Ok(true)
            }
            Err(KernelError::BadFd) => {
                self.generation = next;
                self.set_phase(Phase::Fresh);
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
    #[inline(always)]
    pub fn on_event(&mut self, tag: Option<u32>) -> Option<Interest> {
        // Armed exactly when the code is an interest's bits (1 to 7): `code_of`
        // writes nothing else but those, 0 (fresh) and 8 (idle), so the low three
        // bits of the phase alone tell (one test), and are the interest.
        const _: () = assert!(PHASE_IDLE & 7 == 0);
        let interest = Interest::from_bits((self.code() >> PHASE_SHIFT) & 7)?;
        if tag.is_some_and(|g| g != self.generation) {
            return None;
        }
        self.set_phase(Phase::Idle);
        Some(interest)
    }

    /// Whether the phase is armed (code 1 to 7).
    #[inline(always)]
    fn is_armed(&self) -> bool {
        (self.code() >> PHASE_SHIFT).wrapping_sub(1) < PHASE_IDLE - 1
    }

    /// Deregister: delete from the kernel if it holds the descriptor. ENOENT and
    /// EBADF mean the kernel already dropped it (the descriptor was closed) and
    /// are not errors; so is a refusal that means "this descriptor cannot be
    /// polled" (epoll's EPERM: the number was closed and now names a regular file
    /// or `/dev/null`, which the kernel checks before it looks the entry up, so
    /// nothing of this registration can be under that number). Afterwards the
    /// state is fresh with a new generation.
    ///
    /// A delete the kernel refuses otherwise (ENOMEM; io_uring's EAGAIN) leaves
    /// the descriptor in the kernel: the state is then idle with a new generation
    /// (disarmed: an event of the arming in force is stale) and still owes the
    /// delete, so that the caller can deregister again.
    pub fn deregister<K: Kernel>(&mut self, kernel: &mut K) -> Result<bool, KernelError> {
        let owed = self.in_kernel();
        self.generation = self.generation.wrapping_add(1);
        if !owed {
            self.set_phase(Phase::Fresh);
            return Ok(false);
        }
        match kernel.delete() {
            Ok(())
            | Err(KernelError::NotFound)
            | Err(KernelError::BadFd)
            | Err(KernelError::NotPollable) => {
                self.set_phase(Phase::Fresh);
                Ok(true)
            }
            Err(e) => {
                self.set_phase(Phase::Idle);
                Err(e)
            }
        }
    }

    /// The descriptor moved to a new kernel instance (after fork): nothing is in
    /// the new kernel. An armed registration stays armed in the table and is
    /// re-added by [`RegState::rearm_fresh`].
    pub fn forget_kernel(&mut self) {
        if self.bits == code_of(Phase::Idle) {
            // Idle and not always ready.
            self.bits = code_of(Phase::Fresh);
        }
    }

    /// After [`forget_kernel`](Self::forget_kernel): add an armed registration to the
    /// new kernel with a new generation. Returns what [`arm`](Self::arm) returns.
    ///
    /// If the kernel refuses the add for want of a resource
    /// ([`KernelError::is_transient`]: ENOMEM, ENOSPC...), the state is as it was
    /// (armed), so that a retry of the re-initialisation adds it again. A refusal
    /// of the descriptor itself (EBADF: closed in the child; EINVAL: its number
    /// now names something the kernel cannot watch) leaves it fresh, unarmed, as
    /// a retry would meet the same refusal for ever.
    pub fn rearm_fresh<K: Kernel>(
        &mut self,
        kernel: &mut K,
        fallbacks: &mut Fallbacks,
    ) -> Result<Armed, KernelError> {
        match self.phase() {
            Phase::Armed(interest) => {
                let before = *self;
                self.set_phase(if self.is_always_ready() {
                    Phase::Idle
                } else {
                    Phase::Fresh
                });
                let armed = self.arm(interest, kernel, fallbacks);
                if matches!(&armed, Err(e) if e.is_transient()) {
                    *self = before;
                }
                armed
            }
            _ => Ok(Armed::Unchanged),
        }
    }
}

/// One test per row of the table, each asserting the exact commands issued.
#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    const R: Interest = Interest::READABLE;
    const W: Interest = Interest::WRITABLE;
    const B: Interest = Interest::BOTH;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Cmd {
        Add(Interest, u32),
        Modify(Interest, u32),
        Quiet(u32),
        Delete,
    }

    #[derive(Clone, Copy, Debug)]
    enum Ans {
        NotFound,
        Exists,
        NotPollable,
        BadFd,
        Other,
        Invalid,
    }

    /// A kernel that records every command and answers from a script (success
    /// once the script is used up).
    #[derive(Default)]
    struct Rec {
        log: Vec<Cmd>,
        script: VecDeque<Ans>,
    }

    impl Rec {
        fn answering(script: &[Ans]) -> Rec {
            Rec {
                log: Vec::new(),
                script: script.iter().copied().collect(),
            }
        }
        fn answer(&mut self, cmd: Cmd) -> Result<(), KernelError> {
            self.log.push(cmd);
            match self.script.pop_front() {
                None => Ok(()),
                Some(Ans::NotFound) => Err(KernelError::NotFound),
                Some(Ans::Exists) => Err(KernelError::Exists),
                Some(Ans::NotPollable) => Err(KernelError::NotPollable),
                Some(Ans::BadFd) => Err(KernelError::BadFd),
                Some(Ans::Other) => Err(KernelError::Other(out_of_memory())),
                Some(Ans::Invalid) => Err(KernelError::Other(io::ErrorKind::InvalidInput.into())),
            }
        }
    }

    impl Kernel for Rec {
        fn add(&mut self, interest: Interest, generation: u32) -> Result<(), KernelError> {
            self.answer(Cmd::Add(interest, generation))
        }
        fn modify(&mut self, interest: Interest, generation: u32) -> Result<(), KernelError> {
            self.answer(Cmd::Modify(interest, generation))
        }
        fn quiet(&mut self, generation: u32) -> Result<(), KernelError> {
            self.answer(Cmd::Quiet(generation))
        }
        fn delete(&mut self) -> Result<(), KernelError> {
            self.answer(Cmd::Delete)
        }
    }

    /// A registration armed for `i` with generation `g` (added at `g`).
    fn armed(i: Interest, g: u32) -> RegState {
        let mut s = RegState::new(g.wrapping_sub(1));
        s.arm(i, &mut Rec::default(), &mut Fallbacks::default())
            .unwrap();
        assert_eq!((s.phase(), s.generation()), (Phase::Armed(i), g));
        s
    }

    /// A registration in the kernel, idle, with generation `g`.
    fn idle(g: u32) -> RegState {
        let mut s = armed(R, g);
        assert_eq!(s.on_event(Some(g)), Some(R));
        assert_eq!((s.phase(), s.generation()), (Phase::Idle, g));
        s
    }

    fn arm(s: &mut RegState, i: Interest, k: &mut Rec) -> (Result<Armed, KernelError>, Fallbacks) {
        let mut fb = Fallbacks::default();
        let r = s.arm(i, k, &mut fb);
        (r, fb)
    }

    // Row: fresh | arm(i) | add(i); on EEXIST: modify(i) | armed(i, g+1)
    #[test]
    fn row_fresh_arm_adds() {
        for i in Interest::ALL {
            let mut s = RegState::new(5);
            let mut k = Rec::default();
            let (r, fb) = arm(&mut s, i, &mut k);
            assert!(matches!(r, Ok(Armed::Kernel)));
            assert_eq!(k.log, [Cmd::Add(i, 6)]);
            assert_eq!((s.phase(), s.generation()), (Phase::Armed(i), 6));
            assert_eq!(fb, Fallbacks::default());
            assert!(s.in_kernel());
        }
    }

    #[test]
    fn row_fresh_arm_exists_becomes_modify() {
        let mut s = RegState::new(5);
        let mut k = Rec::answering(&[Ans::Exists]);
        let (r, fb) = arm(&mut s, W, &mut k);
        assert!(matches!(r, Ok(Armed::Kernel)));
        assert_eq!(k.log, [Cmd::Add(W, 6), Cmd::Modify(W, 6)]);
        assert_eq!((s.phase(), s.generation()), (Phase::Armed(W), 6));
        assert!(fb.exists_to_modify && !fb.not_found_to_add);
    }

    #[test]
    fn row_fresh_arm_refused_leaves_it_fresh() {
        for ans in [Ans::BadFd, Ans::Other] {
            let mut s = RegState::new(5);
            let mut k = Rec::answering(&[ans]);
            let (r, _) = arm(&mut s, R, &mut k);
            assert!(r.is_err());
            assert_eq!(k.log, [Cmd::Add(R, 6)]);
            assert_eq!(s, RegState::new(5));
        }
        // EEXIST, then the MOD refused: still fresh, the error returned.
        let mut s = RegState::new(5);
        let mut k = Rec::answering(&[Ans::Exists, Ans::BadFd]);
        assert!(matches!(arm(&mut s, R, &mut k).0, Err(KernelError::BadFd)));
        assert_eq!(k.log, [Cmd::Add(R, 6), Cmd::Modify(R, 6)]);
        assert_eq!(s, RegState::new(5));
    }

    // Row: idle | arm(i) | modify(i); on ENOENT: add(i) | armed(i, g+1)
    #[test]
    fn row_idle_arm_modifies() {
        for i in Interest::ALL {
            let mut s = idle(9);
            let mut k = Rec::default();
            let (r, fb) = arm(&mut s, i, &mut k);
            assert!(matches!(r, Ok(Armed::Kernel)));
            assert_eq!(k.log, [Cmd::Modify(i, 10)]);
            assert_eq!((s.phase(), s.generation()), (Phase::Armed(i), 10));
            assert_eq!(fb, Fallbacks::default());
        }
    }

    #[test]
    fn row_idle_arm_not_found_becomes_add() {
        let mut s = idle(9);
        let mut k = Rec::answering(&[Ans::NotFound]);
        let (r, fb) = arm(&mut s, B, &mut k);
        assert!(matches!(r, Ok(Armed::Kernel)));
        assert_eq!(k.log, [Cmd::Modify(B, 10), Cmd::Add(B, 10)]);
        assert_eq!((s.phase(), s.generation()), (Phase::Armed(B), 10));
        assert!(fb.not_found_to_add && !fb.exists_to_modify);
    }

    #[test]
    fn row_idle_arm_refused_leaves_it_idle() {
        let mut s = idle(9);
        let mut k = Rec::answering(&[Ans::BadFd]);
        assert!(matches!(arm(&mut s, R, &mut k).0, Err(KernelError::BadFd)));
        assert_eq!(k.log, [Cmd::Modify(R, 10)]);
        assert_eq!(s, idle(9));
    }

    // Row: armed(i, g) | arm(i) | none: zero system calls | armed(i, g)
    #[test]
    fn row_armed_arm_same_interest_issues_nothing() {
        for i in Interest::ALL {
            let mut s = armed(i, 3);
            let mut k = Rec::default();
            let (r, fb) = arm(&mut s, i, &mut k);
            assert!(matches!(r, Ok(Armed::Unchanged)));
            assert!(k.log.is_empty());
            assert_eq!(s, armed(i, 3));
            assert_eq!(fb, Fallbacks::default());
        }
    }

    // Row: armed(i, g) | arm(j), j != i | modify(j); on ENOENT: add(j) | armed(j, g+1)
    #[test]
    fn row_armed_arm_other_interest_modifies() {
        for i in Interest::ALL {
            for j in Interest::ALL.into_iter().filter(|&j| j != i) {
                let mut s = armed(i, 3);
                let mut k = Rec::default();
                assert!(matches!(arm(&mut s, j, &mut k).0, Ok(Armed::Kernel)));
                assert_eq!(k.log, [Cmd::Modify(j, 4)]);
                assert_eq!((s.phase(), s.generation()), (Phase::Armed(j), 4));

                let mut s = armed(i, 3);
                let mut k = Rec::answering(&[Ans::NotFound]);
                let (r, fb) = arm(&mut s, j, &mut k);
                assert!(matches!(r, Ok(Armed::Kernel)));
                assert_eq!(k.log, [Cmd::Modify(j, 4), Cmd::Add(j, 4)]);
                assert_eq!((s.phase(), s.generation()), (Phase::Armed(j), 4));
                assert!(fb.not_found_to_add);
            }
        }
    }

    // Row: armed(i, g) | disarm | quiet | idle, g+1
    #[test]
    fn row_armed_disarm_quiets() {
        for i in Interest::ALL {
            let mut s = armed(i, 3);
            let mut k = Rec::default();
            assert!(matches!(s.disarm(&mut k), Ok(true)));
            assert_eq!(k.log, [Cmd::Quiet(4)]);
            assert_eq!((s.phase(), s.generation()), (Phase::Idle, 4));
        }
    }

    #[test]
    fn row_armed_disarm_when_the_kernel_lost_it() {
        // ENOENT: the kernel dropped it; fresh, nothing more delivered.
        let mut s = armed(R, 3);
        let mut k = Rec::answering(&[Ans::NotFound]);
        assert!(matches!(s.disarm(&mut k), Ok(true)));
        assert_eq!(k.log, [Cmd::Quiet(4)]);
        assert_eq!((s.phase(), s.generation()), (Phase::Fresh, 4));
        // EBADF: the number is closed; fresh as well, and said.
        let mut s = armed(R, 3);
        let mut k = Rec::answering(&[Ans::BadFd]);
        assert!(matches!(s.disarm(&mut k), Err(KernelError::BadFd)));
        assert_eq!((s.phase(), s.generation()), (Phase::Fresh, 4));
        // Anything else: unchanged, the error returned.
        let mut s = armed(R, 3);
        let mut k = Rec::answering(&[Ans::Other]);
        assert!(matches!(s.disarm(&mut k), Err(KernelError::Other(_))));
        assert_eq!(s, armed(R, 3));
    }

    // Row: fresh or idle | disarm | none | unchanged
    #[test]
    fn row_fresh_or_idle_disarm_issues_nothing() {
        for s0 in [RegState::new(7), idle(7)] {
            let mut s = s0;
            let mut k = Rec::default();
            assert!(matches!(s.disarm(&mut k), Ok(false)));
            assert!(k.log.is_empty());
            assert_eq!(s, s0);
        }
    }

    // Row: armed(i, g) | kernel event tagged g | none | idle; delivered
    #[test]
    fn row_armed_current_event_is_delivered() {
        for i in Interest::ALL {
            let mut s = armed(i, 3);
            assert_eq!(s.on_event(Some(3)), Some(i));
            assert_eq!((s.phase(), s.generation()), (Phase::Idle, 3));
            // kqueue: no tag; current exactly while armed.
            let mut s = armed(i, 3);
            assert_eq!(s.on_event(None), Some(i));
            assert_eq!(s.phase(), Phase::Idle);
            // One delivery per arming: the next event is dropped.
            assert_eq!(s.on_event(Some(3)), None);
            assert_eq!(s.on_event(None), None);
        }
    }

    // Row: any | kernel event tagged g' != g, or slot freed | none | unchanged; dropped
    #[test]
    fn row_stale_event_is_dropped() {
        let mut s = armed(W, 3);
        for stale in [2, 4, 0, u32::MAX] {
            assert_eq!(s.on_event(Some(stale)), None);
            assert_eq!(s, armed(W, 3));
        }
        for s0 in [RegState::new(3), idle(3)] {
            let mut s = s0;
            assert_eq!(s.on_event(Some(3)), None);
            assert_eq!(s.on_event(None), None);
            assert_eq!(s, s0);
        }
        // Disarm then re-arm: the first arming's event is stale.
        let mut s = armed(R, 3);
        s.disarm(&mut Rec::default()).unwrap();
        s.arm(R, &mut Rec::default(), &mut Fallbacks::default())
            .unwrap();
        assert_eq!(s.generation(), 5);
        assert_eq!(s.on_event(Some(3)), None);
        assert_eq!(s.on_event(Some(4)), None);
        assert_eq!(s.on_event(Some(5)), Some(R));
    }

    // Row: in kernel | deregister | delete; ENOENT, EBADF, not pollable are not errors | freed
    #[test]
    fn row_in_kernel_deregister_deletes() {
        for (s0, ans) in [
            (armed(R, 3), None),
            (idle(3), None),
            (armed(B, 3), Some(Ans::NotFound)),
            (idle(3), Some(Ans::BadFd)),
            (idle(3), Some(Ans::NotPollable)),
            (armed(W, 3), Some(Ans::NotPollable)),
        ] {
            let mut s = s0;
            let mut k = Rec::answering(ans.as_slice());
            assert!(matches!(s.deregister(&mut k), Ok(true)));
            assert_eq!(k.log, [Cmd::Delete]);
            assert_eq!((s.phase(), s.generation()), (Phase::Fresh, 4));
            assert_eq!(s.on_event(Some(3)), None);
        }
    }

    // Row: in kernel | deregister, delete refused | delete | idle, g+1 (still owed)
    #[test]
    fn row_in_kernel_deregister_refused_keeps_it_for_a_retry() {
        for s0 in [armed(R, 3), idle(3)] {
            let mut s = s0;
            let mut k = Rec::answering(&[Ans::Other]);
            assert!(matches!(s.deregister(&mut k), Err(KernelError::Other(_))));
            assert_eq!(k.log, [Cmd::Delete]);
            // Still in the kernel, disarmed: the arming's event is stale now.
            assert_eq!((s.phase(), s.generation()), (Phase::Idle, 4));
            assert!(s.in_kernel());
            assert_eq!(s.on_event(Some(3)), None);
            // The retry deletes.
            let mut k = Rec::default();
            assert!(matches!(s.deregister(&mut k), Ok(true)));
            assert_eq!(k.log, [Cmd::Delete]);
            assert_eq!((s.phase(), s.generation()), (Phase::Fresh, 5));
            assert!(!s.in_kernel());
        }
    }

    // Row: fresh | deregister | none | freed
    #[test]
    fn row_fresh_deregister_issues_nothing() {
        let mut s = RegState::new(3);
        let mut k = Rec::default();
        assert!(matches!(s.deregister(&mut k), Ok(false)));
        assert!(k.log.is_empty());
        assert_eq!((s.phase(), s.generation()), (Phase::Fresh, 4));
    }

    // A descriptor the kernel cannot poll: always ready, never in the kernel.
    #[test]
    fn not_pollable_is_always_ready_without_commands() {
        let mut s = RegState::new(0);
        let mut k = Rec::answering(&[Ans::NotPollable]);
        let (r, fb) = arm(&mut s, R, &mut k);
        assert!(matches!(r, Ok(Armed::Synthetic)));
        assert_eq!(k.log, [Cmd::Add(R, 1)]);
        assert!(fb.not_pollable && s.is_always_ready() && !s.in_kernel());
        assert_eq!((s.phase(), s.generation()), (Phase::Armed(R), 1));

        let mut k = Rec::default();
        assert!(matches!(arm(&mut s, R, &mut k).0, Ok(Armed::Unchanged)));
        assert_eq!(s.on_event(Some(1)), Some(R));
        assert!(matches!(arm(&mut s, W, &mut k).0, Ok(Armed::Synthetic)));
        assert_eq!(s.generation(), 2);
        assert!(matches!(s.disarm(&mut k), Ok(false)));
        assert_eq!((s.phase(), s.generation()), (Phase::Idle, 3));
        assert_eq!(s.on_event(Some(2)), None);
        assert!(matches!(s.deregister(&mut k), Ok(false)));
        assert!(
            k.log.is_empty(),
            "no command after the refusal: {:?}",
            k.log
        );

        // The refusal on a re-arm (idle -> modify) works the same way.
        let mut s = idle(4);
        let mut k = Rec::answering(&[Ans::NotPollable]);
        assert!(matches!(arm(&mut s, W, &mut k).0, Ok(Armed::Synthetic)));
        assert_eq!(k.log, [Cmd::Modify(W, 5)]);
        assert!(!s.in_kernel());
    }

    // After fork: a refused re-add leaves the registration armed, so that the
    // retried re-initialisation adds it again; a closed descriptor leaves it fresh.
    #[test]
    fn fork_rearm_refused_keeps_it_armed() {
        let mut s = armed(W, 3);
        s.forget_kernel();
        let mut k = Rec::answering(&[Ans::Other]);
        let r = s.rearm_fresh(&mut k, &mut Fallbacks::default());
        assert!(matches!(r, Err(KernelError::Other(_))));
        assert_eq!(k.log, [Cmd::Add(W, 4)]);
        assert_eq!(s, armed(W, 3));
        // The retry, in the next new kernel.
        s.forget_kernel();
        let mut k = Rec::default();
        let r = s.rearm_fresh(&mut k, &mut Fallbacks::default());
        assert!(matches!(r, Ok(Armed::Kernel)));
        assert_eq!(k.log, [Cmd::Add(W, 4)]);
        assert_eq!((s.phase(), s.generation()), (Phase::Armed(W), 4));
        // EBADF: closed in the child, left unarmed.
        let mut s = armed(W, 3);
        s.forget_kernel();
        let r = s.rearm_fresh(
            &mut Rec::answering(&[Ans::BadFd]),
            &mut Fallbacks::default(),
        );
        assert!(matches!(r, Err(KernelError::BadFd)));
        assert_eq!((s.phase(), s.generation()), (Phase::Fresh, 3));
        // EINVAL: the number names something the kernel refuses to watch (on
        // epoll, the child's own new instance); a retry would meet it again, so
        // it is left unarmed, as for EBADF.
        let mut s = armed(W, 3);
        s.forget_kernel();
        let r = s.rearm_fresh(
            &mut Rec::answering(&[Ans::Invalid]),
            &mut Fallbacks::default(),
        );
        assert!(matches!(r, Err(KernelError::Other(_))));
        assert_eq!((s.phase(), s.generation()), (Phase::Fresh, 3));
    }

    /// The kernel's "out of memory" as a backend passes it on: ENOMEM on Unix,
    /// `ERROR_NOT_ENOUGH_MEMORY` on Windows.
    fn out_of_memory() -> io::Error {
        #[cfg(unix)]
        let errno = libc::ENOMEM;
        #[cfg(windows)]
        let errno = 8; // ERROR_NOT_ENOUGH_MEMORY
        io::Error::from_raw_os_error(errno)
    }

    #[test]
    fn transient_refusals_are_those_of_resources() {
        assert!(KernelError::Other(out_of_memory()).is_transient());
        #[cfg(unix)]
        let other = |errno| KernelError::Other(io::Error::from_raw_os_error(errno));
        #[cfg(unix)]
        for errno in [
            libc::ENOMEM,
            libc::ENOSPC,
            libc::EAGAIN,
            libc::EBUSY,
            libc::EINTR,
        ] {
            assert!(other(errno).is_transient(), "errno {errno}");
        }
        #[cfg(unix)]
        for errno in [libc::EINVAL, libc::ELOOP, libc::EPERM, libc::EBADF] {
            assert!(!other(errno).is_transient(), "errno {errno}");
        }
        for e in [
            KernelError::NotFound,
            KernelError::Exists,
            KernelError::NotPollable,
            KernelError::BadFd,
        ] {
            assert!(!e.is_transient());
        }
        let kind = |k| KernelError::Other(io::Error::from(k));
        assert!(kind(io::ErrorKind::OutOfMemory).is_transient());
        assert!(!kind(io::ErrorKind::InvalidInput).is_transient());
    }

    #[test]
    fn generation_wraps_around() {
        let mut s = RegState::new(u32::MAX);
        let mut k = Rec::default();
        arm(&mut s, R, &mut k).0.unwrap();
        assert_eq!(k.log, [Cmd::Add(R, 0)]);
        assert_eq!(s.on_event(Some(u32::MAX)), None);
        assert_eq!(s.on_event(Some(0)), Some(R));
        let mut s = armed(R, u32::MAX);
        s.disarm(&mut k).unwrap();
        assert_eq!(s.generation(), 0);
    }

    #[test]
    fn fork_forget_then_rearm_fresh() {
        // Armed: re-added to the new kernel with a new generation.
        let mut s = armed(W, 3);
        s.forget_kernel();
        let mut k = Rec::default();
        let r = s.rearm_fresh(&mut k, &mut Fallbacks::default());
        assert!(matches!(r, Ok(Armed::Kernel)));
        assert_eq!(k.log, [Cmd::Add(W, 4)]);
        assert_eq!((s.phase(), s.generation()), (Phase::Armed(W), 4));
        // Idle: nothing in the new kernel until the next arm, which adds.
        let mut s = idle(3);
        s.forget_kernel();
        assert_eq!(s.phase(), Phase::Fresh);
        let mut k = Rec::default();
        assert!(matches!(
            s.rearm_fresh(&mut k, &mut Fallbacks::default()),
            Ok(Armed::Unchanged)
        ));
        assert!(k.log.is_empty());
        arm(&mut s, R, &mut k).0.unwrap();
        assert_eq!(k.log, [Cmd::Add(R, 4)]);
        // Always ready and armed: a synthetic event again, no command.
        let mut s = RegState::new(0);
        arm(&mut s, R, &mut Rec::answering(&[Ans::NotPollable]))
            .0
            .unwrap();
        s.forget_kernel();
        let mut k = Rec::default();
        assert!(matches!(
            s.rearm_fresh(&mut k, &mut Fallbacks::default()),
            Ok(Armed::Synthetic)
        ));
        assert!(k.log.is_empty());
        assert_eq!(s.generation(), 2);
    }
}
