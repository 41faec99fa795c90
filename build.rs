//! Sets `cfg(pollshot_kqueue)` where the kqueue backend is compiled (the BSDs and
//! Apple targets, or Linux with `--cfg pollshot_libkqueue` or `--cfg pollshot_rump`),
//! links libkqueue for the `--cfg pollshot_libkqueue` build on Linux, and a NetBSD
//! rump kernel for the `--cfg pollshot_rump` one (see [`link_rump`], in
//! `build/link.rs`).
//!
//! The library is found, in order, through:
//! 1. `LIBKQUEUE_DIR`: the directory holding `libkqueue.so` (or `libkqueue.a`);
//! 2. `pkg-config --libs libkqueue` (the `pkg-config` program; `PKG_CONFIG_PATH`
//!    as usual, e.g. `/opt/libkqueue/lib/pkgconfig`).
//!
//! When neither finds it, the build only warns: `cargo check` needs no library, and
//! a link step then fails naming `-lkqueue`. At run time the dynamic loader must
//! find the library too (`LD_LIBRARY_PATH` for a prefix outside its search path).
//! The crate never builds, vendors or ships libkqueue.

use std::env;
use std::process::Command;

include!("build/kqueue_os.rs");
include!("build/link.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build/kqueue_os.rs");
    println!("cargo:rerun-if-changed=build/link.rs");
    println!("cargo:rerun-if-env-changed=LIBKQUEUE_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG");

    let libkqueue = env::var_os("CARGO_CFG_POLLSHOT_LIBKQUEUE").is_some();
    let rump = env::var_os("CARGO_CFG_POLLSHOT_RUMP").is_some();
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let linux = os == "linux";

    // `pollshot_kqueue`: the kqueue backend's system-call layer is compiled (the
    // BSDs and Apple, or Linux against libkqueue or a NetBSD rump kernel).
    let kqueue_os = is_kqueue_os(&os);
    if kqueue_os || ((libkqueue || rump) && linux) {
        println!("cargo:rustc-cfg=pollshot_kqueue");
    }
    if rump && linux {
        return link_rump();
    }

    if !(libkqueue && linux) {
        return;
    }

    if let Some(dir) = env::var_os("LIBKQUEUE_DIR") {
        let dir = Path::new(&dir);
        if dir.is_dir() {
            println!("cargo:rustc-link-search=native={}", dir.display());
            println!("cargo:rustc-link-lib={}", link_lib(dir, "kqueue"));
            return;
        }
        println!(
            "cargo:warning=pollshot: LIBKQUEUE_DIR={} is not a directory; trying pkg-config",
            dir.display()
        );
    }

    match pkg_config_libs() {
        Ok(flags) => {
            let mut linked = false;
            for flag in flags.split_whitespace() {
                if let Some(dir) = flag.strip_prefix("-L") {
                    println!("cargo:rustc-link-search=native={dir}");
                } else if let Some(lib) = flag.strip_prefix("-l") {
                    println!("cargo:rustc-link-lib={lib}");
                    linked |= lib == "kqueue";
                }
            }
            if !linked {
                println!("cargo:rustc-link-lib=kqueue");
            }
        }
        Err(why) => println!(
            "cargo:warning=pollshot: --cfg pollshot_libkqueue but libkqueue was not found ({why}); \
             set LIBKQUEUE_DIR to its lib directory or PKG_CONFIG_PATH to its pkgconfig directory. \
             `cargo check` works without it; linking needs it."
        ),
    }
}

/// `pkg-config --libs libkqueue`, or why not.
fn pkg_config_libs() -> Result<String, String> {
    let program = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_owned());
    let out = Command::new(&program)
        .args(["--libs", "libkqueue"])
        .output()
        .map_err(|e| format!("running {program}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("{program} --libs libkqueue: {}", err.trim()));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("{program} output: {e}"))
}

/// `cargo:rustc-link-lib`'s value for library `name` of `dir`: the name, or the
/// file itself (`dylib:+verbatim=FILE`) where [`link_name`] finds `libNAME.so`
/// to be a flattened link.
fn link_lib(dir: &Path, name: &str) -> String {
    match link_name(dir, name).strip_prefix(':') {
        Some(file) => format!("dylib:+verbatim={file}"),
        None => name.to_owned(),
    }
}
