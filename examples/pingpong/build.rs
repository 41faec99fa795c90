//! Sets `cfg(pollshot_kqueue)` where pollshot compiles its kqueue backend (the
//! BSDs and Apple, or Linux with `--cfg pollshot_libkqueue` or `--cfg
//! pollshot_rump`: pollshot's build script decides it the same way, from the
//! same list), and links the NetBSD rump kernel for `--cfg pollshot_rump` as
//! pollshot's build script does for its own targets: the rump libraries are
//! link arguments (`build/link.rs`), which reach only the package whose build
//! script prints them.

include!("../../build/kqueue_os.rs");
include!("../../build/link.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../../build/kqueue_os.rs");
    println!("cargo:rerun-if-changed=../../build/link.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let linux = os == "linux";
    let libkqueue = std::env::var_os("CARGO_CFG_POLLSHOT_LIBKQUEUE").is_some();
    let rump = std::env::var_os("CARGO_CFG_POLLSHOT_RUMP").is_some();
    if is_kqueue_os(&os) || ((libkqueue || rump) && linux) {
        println!("cargo:rustc-cfg=pollshot_kqueue");
    }
    if rump && linux {
        link_rump();
    }
}
