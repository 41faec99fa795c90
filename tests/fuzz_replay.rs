//! Replays every checked-in fuzz input on the stable toolchain: the seed corpus
//! (`fuzz/seeds/<target>/`) and every saved crash (`fuzz/regressions/<target>/`),
//! through the very harness the cargo-fuzz targets run (`fuzz/src`, included
//! here with `#[path]`). A crash found by `cargo +nightly fuzz run` becomes a
//! permanent test by copying its artifact into `fuzz/regressions/<target>/`.
#![cfg(unix)]

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod harness;

use std::path::Path;

/// The real-descriptor harnesses expect the kernel to hand out descriptor numbers
/// as their model predicts (lowest free number first): anything else in this
/// process opening a descriptor meanwhile (another replay, the test harness's own
/// threads) breaks that. Replays run one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `target` on every file of `fuzz/seeds/<name>` and `fuzz/regressions/<name>`;
/// returns how many. A failing input panics with its path.
fn replay(name: &str, target: fn(&[u8])) -> usize {
    let _one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut n = 0;
    for dir in ["seeds", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(name)) else {
            continue;
        };
        let mut paths: Vec<_> = entries
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        paths.sort();
        for path in paths {
            let data = std::fs::read(&path).unwrap();
            let r = std::panic::catch_unwind(|| target(&data));
            assert!(
                r.is_ok(),
                "fuzz input {} fails (replay it: cargo +nightly fuzz run {name} {})",
                path.display(),
                path.display()
            );
            n += 1;
        }
    }
    n
}

#[test]
fn replay_state_machine() {
    assert!(
        replay("state_machine", harness::state_machine) > 0,
        "no seed for state_machine"
    );
}

#[test]
fn replay_epoll_real() {
    assert!(
        replay("epoll_real", harness::epoll_real) > 0,
        "no seed for epoll_real"
    );
}

#[test]
fn replay_blocking_real() {
    assert!(
        replay("blocking_real", harness::blocking_real) > 0,
        "no seed for blocking_real"
    );
}

#[cfg(all(target_os = "linux", feature = "io-uring"))]
#[test]
fn replay_uring_real() {
    assert!(
        replay("uring_real", harness::uring_real) > 0,
        "no seed for uring_real"
    );
}

#[test]
fn replay_kqueue_changes() {
    assert!(
        replay("kqueue_changes", harness::kqueue_changes) > 0,
        "no seed for kqueue_changes"
    );
}
