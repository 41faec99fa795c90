// The target operating systems whose kernel has kqueue(2). The one place that
// list lives: `include!`d by pollshot's build.rs and by compat/polling/build.rs.

/// Whether `target_os` (a `CARGO_CFG_TARGET_OS` value) has a kqueue.
fn is_kqueue_os(target_os: &str) -> bool {
    matches!(
        target_os,
        "freebsd"
            | "netbsd"
            | "openbsd"
            | "dragonfly"
            | "macos"
            | "ios"
            | "tvos"
            | "watchos"
            | "visionos"
    )
}
