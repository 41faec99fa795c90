//! The event ports backend (illumos, Solaris): `port_associate(3C)` on every arm,
//! `port_getn(3C)` to deliver, `port_send(3C)` to wake.
//!
//! The rooms:
//!
//! - `events.rs`, compiled on every target: the pure translation (poll(2) bits with
//!   illumos's values, the `events` an arming asks for, the readiness of a
//!   retrieved event, the `user` word, the timeout), unit tested everywhere and
//!   used by the kernel model (`pollshot::model::Semantics::Ports`).
//! - `backend.rs`, compiled on illumos and Solaris: [`Ports`], the
//!   [`Backend`](crate::backend::Backend), with every port call. Its documentation
//!   says what the kernel is told and which kernel function decides each behaviour
//!   relied on.

pub(crate) mod events;

#[cfg(any(target_os = "illumos", target_os = "solaris"))]
mod backend;

#[cfg(any(target_os = "illumos", target_os = "solaris"))]
pub use backend::Ports;
