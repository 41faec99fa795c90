//! Sets `cfg(polling_kqueue)` where `polling::os::kqueue` exists: the BSDs and
//! Apple targets, and Linux with `--cfg pollshot_libkqueue` (libkqueue, which
//! pollshot's own build script links).

include!("../../build/kqueue_os.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../../build/kqueue_os.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let libkqueue = os == "linux" && std::env::var_os("CARGO_CFG_POLLSHOT_LIBKQUEUE").is_some();
    if is_kqueue_os(&os) || libkqueue {
        println!("cargo:rustc-cfg=polling_kqueue");
    }
}
