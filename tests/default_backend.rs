//! The shared suite (`tests/common`) on `pollshot::DefaultBackend`: epoll or kqueue
//! on their targets, or the poll(2) backend when built with
//! `RUSTFLAGS="--cfg pollshot_force_blocking"` (what this file is for on Linux).

#[macro_use]
mod common;

suite!(pollshot::DefaultBackend);

// The constant agrees with the selection (checked at compile time).
#[cfg(pollshot_force_blocking)]
const _: () = assert!(!pollshot::MULTIPLEXES_ONESHOT);
#[cfg(all(
    not(pollshot_force_blocking),
    any(target_os = "linux", target_os = "android")
))]
const _: () = assert!(pollshot::MULTIPLEXES_ONESHOT);

/// The forced build really selects the poll(2) backend.
#[test]
fn default_backend_matches_cfg() {
    let name = common::poller::<pollshot::DefaultBackend>().backend_name();
    if cfg!(pollshot_force_blocking) {
        assert_eq!(name, "blocking");
    } else if cfg!(any(target_os = "linux", target_os = "android")) {
        assert_eq!(name, "epoll");
    }
}
