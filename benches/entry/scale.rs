//! `cargo bench --bench scale`: `benches/scale.rs` on Unix; elsewhere a program
//! that says the bench cannot run there (it needs descriptors and getrusage),
//! so that every target builds and links on Windows.

#[cfg(unix)]
#[path = "../scale.rs"]
mod bench;

fn main() {
    #[cfg(unix)]
    bench::main();
    #[cfg(not(unix))]
    println!("SKIPPED: the scale bench runs on Unix only (descriptors, getrusage)");
}
