//! The harness behind pollshot's cargo-fuzz targets, shared with the stable
//! replay test (`tests/fuzz_replay.rs` includes this file with `#[path]`), so a
//! corpus file or a saved crash runs through exactly the same code on stable.
//!
//! Each target takes raw bytes and decodes them with `arbitrary`
//! (`Unstructured::arbitrary_take_rest`, as `libfuzzer-sys` would):
//!
//! - [`state_machine`]: operation sequences from several simulated threads against
//!   the kernel model (`pollshot::model`) with epoll, each kqueue kernel family,
//!   poll, event ports and AFD semantics: the invariants of [`sim`], parity of
//!   deliveries, and generation wrap-around (registrations start near
//!   `u32::MAX`).
//! - [`epoll_real`], [`blocking_real`] and [`uring_real`]: the same alphabet on
//!   real descriptors (socketpairs, pipes, `/dev/null`; writes, reads, close,
//!   number reuse, dup) through `Poller<Epoll>`, `Poller<Blocking>` and
//!   `Poller<Uring>`, each mirrored by the model ([`real`]).
//! - [`kqueue_changes`]: the command-to-kevent translation against the model's
//!   kqueue ([`kq`]).
//!
//! A failed check panics with the invariant's name: libFuzzer saves the input.

#![allow(clippy::new_without_default)]

#[path = "kq.rs"]
pub mod kq;
#[path = "real.rs"]
pub mod real;
#[path = "sim.rs"]
pub mod sim;

use arbitrary::{Arbitrary, Unstructured};
use pollshot::Interest;

/// Operations per input, at most: keeps each run short.
pub const MAX_OPS: usize = 256;

/// An interest from any byte: readable, writable or both. Not `PRIORITY`: the
/// parity runs compare kqueue (which refuses it) with epoll and poll, and the
/// descriptors of the real targets never raise `POLLPRI`.
pub fn interest(b: u8) -> Interest {
    Interest::ALL[b as usize % 3]
}

/// One [`sim::Op`], as `arbitrary` builds it.
#[derive(Arbitrary, Clone, Copy, Debug)]
#[allow(missing_docs)]
pub enum MachineOp {
    Open { file: bool },
    Dup { fd: u8 },
    Close { fd: u8 },
    Levels { fd: u8, bits: u8 },
    Register { fd: u8 },
    Arm { reg: u8, interest: u8 },
    Disarm { reg: u8 },
    Deregister { reg: u8 },
    Wait { thread: u8 },
    Accept { thread: u8 },
    Deliver { thread: u8 },
    Fire { reg: u8, thread: u8 },
    Stale { reg: u8, back: u8, thread: u8 },
    Notify,
    StaleWait { reg: u8, back: u8, thread: u8 },
    Fork,
    Refuse,
}

impl MachineOp {
    /// The simulator's operation.
    pub fn op(self) -> sim::Op {
        use sim::Op;
        match self {
            MachineOp::Open { file } => Op::Open { pollable: !file },
            MachineOp::Dup { fd } => Op::Dup { fd },
            MachineOp::Close { fd } => Op::Close { fd },
            MachineOp::Levels { fd, bits } => Op::Levels { fd, bits },
            MachineOp::Register { fd } => Op::Register { fd },
            MachineOp::Arm { reg, interest: i } => Op::Arm {
                reg,
                interest: interest(i),
            },
            MachineOp::Disarm { reg } => Op::Disarm { reg },
            MachineOp::Deregister { reg } => Op::Deregister { reg },
            MachineOp::Wait { thread } => Op::Wait { thread },
            MachineOp::Accept { thread } => Op::Accept { thread },
            MachineOp::Deliver { thread } => Op::Deliver { thread },
            MachineOp::Fire { reg, thread } => Op::Fire { reg, thread },
            MachineOp::Stale { reg, back, thread } => Op::Stale { reg, back, thread },
            MachineOp::Notify => Op::Notify,
            MachineOp::StaleWait { reg, back, thread } => Op::StaleWait { reg, back, thread },
            MachineOp::Fork => Op::Fork,
            MachineOp::Refuse => Op::Refuse,
        }
    }
}

/// The `state_machine` input: how far below `u32::MAX` generations start (0 to
/// 15: they wrap within a few armings; or from 0 when `wrap` is false), then the
/// operations.
#[derive(Arbitrary, Debug)]
pub struct MachineInput {
    /// Start near `u32::MAX`.
    pub wrap: bool,
    /// How far below `u32::MAX` (modulo 16).
    pub below: u8,
    /// The operations.
    pub ops: Vec<MachineOp>,
}

/// Decodes the whole input as libfuzzer-sys decodes a structured one; `None` when
/// the bytes do not decode. With `POLLSHOT_FUZZ_DEBUG` set in the environment,
/// prints what was decoded (to read a crash: `POLLSHOT_FUZZ_DEBUG=1 cargo +nightly
/// fuzz run TARGET ARTIFACT`).
pub fn decode<'a, T: Arbitrary<'a> + std::fmt::Debug>(data: &'a [u8]) -> Option<T> {
    let t = T::arbitrary_take_rest(Unstructured::new(data)).ok();
    if std::env::var_os("POLLSHOT_FUZZ_DEBUG").is_some() {
        eprintln!("{t:#?}");
    }
    t
}

/// Target `state_machine`: see the crate docs and [`sim`]. With
/// `POLLSHOT_FUZZ_OLD_REARM=1` in the environment it runs the NetBSD 8/9 kqueue
/// semantics alone with the re-arm record before `EV_ADD | EV_ENABLE |
/// EV_DISPATCH` (a bare `EV_ENABLE`), to show that the fuzzer finds the
/// readiness that record loses (invariant (d)). With `POLLSHOT_FUZZ_AFD_FAULT`
/// set to `no-cancel` or `stale-through` it runs AFD semantics alone with the
/// Windows backend broken that way ([`AfdFault`](pollshot::model::AfdFault)),
/// to show that the fuzzer finds it.
pub fn state_machine(data: &[u8]) {
    let Some(input) = decode::<MachineInput>(data) else {
        return;
    };
    let ops: Vec<sim::Op> = input.ops.iter().take(MAX_OPS).map(|o| o.op()).collect();
    let start = if input.wrap {
        u32::MAX - u32::from(input.below % 16)
    } else {
        0
    };
    if let Some(fault) = afd_fault() {
        sim::run_afd_fault(fault, &ops, start, sim::EpochPolicy::PerSlot);
        return;
    }
    if old_rearm() {
        use pollshot::model::{RearmRecord, Semantics};
        let (sem, record) = (Semantics::KqueueNetBsd8, RearmRecord::Enable);
        sim::run_one(sem, record, &ops, start, sim::EpochPolicy::PerSlot);
        return;
    }
    sim::run_parity(&ops, start, sim::EpochPolicy::PerSlot);
}

/// Whether `POLLSHOT_FUZZ_OLD_REARM` is set (read once).
fn old_rearm() -> bool {
    static OLD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OLD.get_or_init(|| std::env::var_os("POLLSHOT_FUZZ_OLD_REARM").is_some())
}

/// The fault `POLLSHOT_FUZZ_AFD_FAULT` names, if it is set (read once). Any
/// other value panics, naming the ones there are.
fn afd_fault() -> Option<pollshot::model::AfdFault> {
    use pollshot::model::AfdFault;
    static FAULT: std::sync::OnceLock<Option<AfdFault>> = std::sync::OnceLock::new();
    *FAULT.get_or_init(|| {
        let v = std::env::var("POLLSHOT_FUZZ_AFD_FAULT").ok()?;
        match v.as_str() {
            "no-cancel" => Some(AfdFault::NoCancel),
            "stale-through" => Some(AfdFault::StaleThrough),
            other => panic!(
                "POLLSHOT_FUZZ_AFD_FAULT={other:?}: the faults are no-cancel and stale-through"
            ),
        }
    })
}

/// Target `epoll_real`: see [`real`].
pub fn epoll_real(data: &[u8]) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Some(ops) = decode::<Vec<real::RealOp>>(data) {
        real::run::<pollshot::backends::Epoll>(
            pollshot::model::Semantics::Epoll,
            &ops[..ops.len().min(MAX_OPS)],
        );
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = data;
}

/// Target `uring_real`: see [`real`]. A kernel that refuses io_uring runs nothing.
pub fn uring_real(data: &[u8]) {
    #[cfg(all(target_os = "linux", feature = "io-uring"))]
    if let Some(ops) = decode::<Vec<real::RealOp>>(data) {
        static REFUSED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *REFUSED
            .get_or_init(|| pollshot::Poller::<pollshot::backends::Uring>::with_backend().is_err())
        {
            return;
        }
        // Each input runs in a thread of its own. The kernel frees a closed ring's
        // memory from a worker (about 1,400 rings a second on the 2-core test
        // machine), or all at once when the thread that submitted to it exits.
        // Thousands of inputs a second from one thread outran that worker until
        // the kernel ran out of memory (about 11 KiB of slab per ring). A panic in
        // the thread aborts the process through libFuzzer's hook, as on the main
        // thread (and is passed on where there is no hook: the replay tests). A
        // plain join, not a scope's: it returns once the thread's locals are
        // dropped, before the leak checker looks.
        let run = std::thread::spawn(move || {
            real::run::<pollshot::backends::Uring>(pollshot::model::Semantics::Poll, &ops)
        });
        if let Err(panic) = run.join() {
            std::panic::resume_unwind(panic);
        }
    }
    #[cfg(not(all(target_os = "linux", feature = "io-uring")))]
    let _ = data;
}

/// Target `blocking_real`: see [`real`].
pub fn blocking_real(data: &[u8]) {
    if let Some(ops) = decode::<Vec<real::RealOp>>(data) {
        real::run::<pollshot::backends::Blocking>(
            pollshot::model::Semantics::Poll,
            &ops[..ops.len().min(MAX_OPS)],
        );
    }
}

/// Target `kqueue_changes`: see [`kq`].
pub fn kqueue_changes(data: &[u8]) {
    if let Some(ops) = decode::<Vec<kq::KqOp>>(data) {
        kq::run(&ops[..ops.len().min(MAX_OPS)]);
    }
}
