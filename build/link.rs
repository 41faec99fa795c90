// Linking the two stand-in kqueues on Linux: libkqueue and a NetBSD rump
// kernel. `include!`d by pollshot's build.rs and by examples/pingpong/build.rs
// (a `cargo:rustc-link-arg` reaches only the package that prints it, and the
// rump kernel is linked with link arguments: see `link_rump`).

use std::path::Path;

/// How to name library `name` found in `dir` to the linker: `name` itself
/// (`-lname`) where `libNAME.so` is the library or a symbolic link to it, or
/// `:FILE` (`-l:FILE`, the file verbatim) where `libNAME.so` is a few bytes
/// naming another file of `dir`: a symbolic link flattened into a text file by a
/// copy that does not keep links, which no linker reads.
fn link_name(dir: &Path, name: &str) -> String {
    let so = dir.join(format!("lib{name}.so"));
    let Ok(bytes) = std::fs::read(&so) else {
        return name.to_owned();
    };
    if bytes.len() > 255 || bytes.starts_with(b"\x7fELF") {
        return name.to_owned();
    }
    match std::str::from_utf8(&bytes).map(str::trim) {
        Ok(file) if !file.contains('/') && dir.join(file).is_file() => format!(":{file}"),
        _ => name.to_owned(),
    }
}

/// Links a NetBSD rump kernel for `--cfg pollshot_rump`: `POLLSHOT_RUMP_DIR` is
/// the prefix buildrump.sh installed into (`-d`; its `lib/` holds `librump.so`).
/// The component libraries are linked with `--no-as-needed`: nothing names their
/// symbols (`rump_init` finds them among the loaded objects), so the linker would
/// drop them, and a rump kernel without `rumpnet_local` has no `AF_LOCAL`.
/// These are link arguments, which reach only the package whose build script
/// prints them (pollshot's tests and benches, and the pingpong package, which
/// calls this too), and an rpath lets them run without `LD_LIBRARY_PATH`.
/// Without the variable the build only warns: `cargo check` needs no library.
/// Neither package builds, vendors or ships the rump kernel.
fn link_rump() {
    println!("cargo:rerun-if-env-changed=POLLSHOT_RUMP_DIR");
    let Some(prefix) = std::env::var_os("POLLSHOT_RUMP_DIR") else {
        println!(
            "cargo:warning=--cfg pollshot_rump but POLLSHOT_RUMP_DIR is not set; \
             set it to the rump kernel's prefix (buildrump.sh -d). `cargo check` works \
             without it; linking needs it."
        );
        return;
    };
    let lib = Path::new(&prefix).join("lib");
    if !lib.join("librump.so").is_file() {
        println!(
            "cargo:warning=POLLSHOT_RUMP_DIR={}: no lib/librump.so there",
            Path::new(&prefix).display()
        );
    }
    println!("cargo:rustc-link-arg=-L{}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    for l in ["rumpnet_local", "rumpnet", "rumpvfs", "rump", "rumpuser"] {
        println!("cargo:rustc-link-arg=-l{}", link_name(&lib, l));
    }
    println!("cargo:rustc-link-arg=-Wl,--as-needed");
}
