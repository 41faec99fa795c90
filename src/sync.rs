//! The synchronisation primitives that the loom model checks (`src/loom_tests/`):
//! std's in every build, loom's in the crate's unit tests under `--cfg loom`. Code
//! that a model exercises (the notify protocol, the table, the poller) takes its
//! atomics and locks from here, and nowhere else. A `static` stays on std's (loom's
//! are not `const`): `Poller`'s process-wide incarnation counter, the fork count.
//!
//! Only the unit-test build switches (`all(loom, test)`): loom is a dev-dependency,
//! and the copy of the library that the integration tests link is built without it.

#[cfg(all(loom, test))]
pub(crate) use loom::sync::{atomic, Condvar, Mutex, MutexGuard};

#[cfg(not(all(loom, test)))]
pub(crate) use std::sync::{atomic, Condvar, Mutex, MutexGuard};
