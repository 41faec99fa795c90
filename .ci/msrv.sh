#!/usr/bin/env bash
# The MSRV check: the library as a user gets it, built by the oldest Rust that
# Cargo.toml's `rust-version` promises.
#
#   bash .ci/msrv.sh
#
# What a user gets is the published package (`cargo package`: Cargo.toml's
# `include` list, its manifest as crates.io serves it) and its [dependencies];
# the repository's dev-dependencies and its Cargo.lock (version 4, which cargo
# reads from 1.78 on) are not part of it. So the check unpacks the package under
# target/msrv, makes a crate there that depends on it (with `rust-version` set
# to the MSRV and each of pollshot's features as its own), resolves that crate's
# lockfile with the current cargo's MSRV-aware resolver
# (CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback: the newest version of each
# dependency that supports the MSRV, as a user on that Rust gets with an
# MSRV-aware cargo; the lockfile comes out in a version the old cargo reads), and
# runs `cargo +MSRV check --locked` on it: default features, each feature, all
# of them, for the host; default and all features for Windows (AFD) and macOS
# (kqueue). (rustup has no 1.74.0 std for FreeBSD, NetBSD or illumos to
# download here: "unavailable for download for channel '1.74.0'".)
#
# Installs the toolchain (`rustup toolchain install MSRV --profile minimal`)
# and its targets when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
msrv=$(sed -n 's/^rust-version = "\([0-9.]*\)"$/\1/p' Cargo.toml | head -1)
[ -n "$msrv" ] || { echo "msrv.sh: no rust-version in Cargo.toml" >&2; exit 1; }
# rust-version "1.74" names the toolchain 1.74.0.
toolchain=$msrv
[[ $msrv =~ ^[0-9]+\.[0-9]+$ ]] && toolchain=$msrv.0
features=(stats io-uring model)
targets=(x86_64-pc-windows-msvc aarch64-apple-darwin)

if rustup toolchain list | grep -q "^$toolchain-"; then
    echo "installed: toolchain $toolchain"
else
    echo "installing: rustup toolchain install $toolchain --profile minimal"
    rustup toolchain install "$toolchain" --profile minimal
fi
for target in "${targets[@]}"; do
    if ! rustup +"$toolchain" target list --installed | grep -qx "$target"; then
        echo "installing: rustup target add --toolchain $toolchain $target"
        rustup target add --toolchain "$toolchain" "$target"
    fi
done

dir=target/msrv
rm -rf "$dir"
mkdir -p "$dir/probe/src"
cargo package -p pollshot --no-verify --allow-dirty --quiet
version=$(cargo pkgid -p pollshot | sed 's/.*[#@]//')
tar -xzf "target/package/pollshot-$version.crate" -C "$dir"

{
    printf '[package]\nname = "msrv-probe"\nversion = "0.0.0"\nedition = "2021"\n'
    printf 'rust-version = "%s"\npublish = false\n\n' "$msrv"
    printf '[dependencies]\npollshot = { path = "../pollshot-%s" }\n\n[features]\n' "$version"
    for f in "${features[@]}"; do printf '%s = ["pollshot/%s"]\n' "$f" "$f"; done
    # Not a member of the repository's workspace.
    printf '\n[workspace]\n'
} >"$dir/probe/Cargo.toml"
echo 'pub use pollshot;' >"$dir/probe/src/lib.rs"

cd "$dir/probe"
CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback cargo generate-lockfile --quiet
echo "resolved for Rust $msrv: $(awk -F'"' '/^name = /{n=$2} /^version = /{if (n != "" && n != "msrv-probe") printf "%s %s, ", n, $2}' Cargo.lock | sed 's/, $//')"
check() {
    echo "cargo +$toolchain check $*"
    cargo +"$toolchain" check --locked --quiet "$@"
}
check
for f in "${features[@]}"; do check --features "$f"; done
check --all-features
for target in "${targets[@]}"; do
    check --target "$target"
    check --target "$target" --all-features
done
echo "msrv.sh: pollshot $version builds with Rust $toolchain (default features; ${features[*]}; all features; the host and ${targets[*]})"
