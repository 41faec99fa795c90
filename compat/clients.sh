#!/usr/bin/env bash
# Runs other people's test suites on pollshot through the polling facade
# (compat/polling): the published packages of async-io 2.x (latest), async-process
# 2.x (latest) and polling 3.11.0, fetched from crates.io into a scratch directory
# outside the repository, each patched with
#     [patch.crates-io] polling = { path = "<repo>/compat/polling" }
# (polling's own tests run against the facade as the package named `polling`).
# Then checks async-io with the facade for the kqueue targets, and, when libkqueue
# is installed, runs the facade's kqueue filter tests against it.
# With --windows, runs instead the Windows suites under wine
# (compat/clients-windows.sh): polling's own (its windows_* tests included),
# async-io's, async-process's and the facade's own on the facade for
# x86_64-pc-windows-gnu, and stock polling's for comparison.
#
# Usage: compat/clients.sh [--no-cross] [--keep] [--windows]
#   POLLSHOT_CLIENTS_DIR=DIR  scratch directory (default: a new one under $TMPDIR,
#                             removed at the end unless --keep); reusing one keeps
#                             its build cache.
#   PKG_CONFIG_PATH / LIBKQUEUE_DIR as for pollshot's libkqueue build
#                             (default probe: /opt/libkqueue).
# Exit status: non-zero when any suite has a failing test or a step fails.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
facade="$repo/compat/polling"
cross=1
keep=0
windows=0
for arg in "$@"; do
    case "$arg" in
        --no-cross) cross=0 ;;
        --keep) keep=1 ;;
        --windows) windows=1 ;;
        -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "clients.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done

for tool in cargo jq; do
    if ! command -v "$tool" >/dev/null; then
        if [ "$tool" = jq ] && command -v apt-get >/dev/null; then
            echo "installing jq (apt-get)"
            apt-get install -y jq || { apt-get update && apt-get install -y jq; }
        else
            echo "clients.sh: $tool is required" >&2
            exit 1
        fi
    fi
done

if [ -n "${POLLSHOT_CLIENTS_DIR:-}" ]; then
    scratch=$POLLSHOT_CLIENTS_DIR
    mkdir -p "$scratch"
else
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/pollshot-clients.XXXXXX")
    if [ "$keep" = 0 ]; then
        trap 'rm -rf "$scratch"' EXIT
    fi
fi
case "$scratch/" in
    "$repo"/*) echo "clients.sh: the scratch directory must be outside the repository" >&2; exit 2 ;;
esac
export CARGO_TARGET_DIR="$scratch/target"
export CARGO_TERM_COLOR=never
echo "scratch: $scratch"

# Steps that fail are counted, not fatal, so that every suite reports; the exit
# status says whether anything failed.
failures=()
summary=()

step() { printf '\n=== %s ===\n' "$*"; }

# --- fetch the published packages ---------------------------------------------
step "fetch async-io 2.x, async-process 2.x, polling 3.11.0 from crates.io"
fetcher="$scratch/fetch"
rm -rf "$fetcher"
mkdir -p "$fetcher/src"
cat >"$fetcher/Cargo.toml" <<'EOF'
[package]
name = "pollshot-clients-fetch"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
async-io = "2"
async-process = "2"
polling = "=3.11.0"

[workspace]
EOF
: >"$fetcher/src/lib.rs"
cargo update --manifest-path "$fetcher/Cargo.toml"
cargo fetch --manifest-path "$fetcher/Cargo.toml"
meta=$(cargo metadata --format-version 1 --manifest-path "$fetcher/Cargo.toml")
src_of() { # NAME -> the unpacked package directory
    jq -r --arg n "$1" '.packages[] | select(.name == $n) | .manifest_path' <<<"$meta" |
        head -n1 | xargs dirname
}
version_of() {
    jq -r --arg n "$1" '.packages[] | select(.name == $n) | .version' <<<"$meta" | head -n1
}
patch_line="polling = { path = \"$facade\" }"

copy_pkg() { # NAME DEST: a writable copy of the published package
    rm -rf "$2"
    cp -R "$(src_of "$1")" "$2"
    chmod -R u+w "$2"
}

# patch_pkg DIR: adds the [patch] line and resolves the package's dependencies
# afresh (its shipped lock file pins libc and rustix below what pollshot needs, so
# the patch could not be used with it), then checks that polling is the facade.
patch_pkg() {
    printf '\n[patch.crates-io]\n%s\n' "$patch_line" >>"$1/Cargo.toml"
    rm -f "$1/Cargo.lock"
    (cd "$1" && cargo generate-lockfile)
    local used
    used=$(cd "$1" && cargo tree -i polling -e normal --prefix none | head -n1)
    echo "polling in $(basename "$1"): $used"
    case "$used" in
        *"($facade)"*) ;;
        *) echo "clients.sh: the [patch] is not used in $1" >&2; exit 1 ;;
    esac
}

# --- run one test suite, record its counts --------------------------------------
# run_suite LABEL DIR [cargo test args...]: prints every test binary's counts.
run_suite() {
    local label=$1 dir=$2
    shift 2
    local log="$scratch/$label.log"
    step "$label: cargo test $*"
    local rc=0
    # ("${runner[@]}": .ci/wine.sh in the Windows mode, nothing otherwise)
    (cd "$dir" && ${runner[@]+"${runner[@]}"} cargo test --no-fail-fast "$@") >"$log" 2>&1 || rc=$?
    # "Running tests/x.rs (...)" / "Doc-tests name" followed by "test result: ..."
    local parsed
    parsed=$(awk '
        /^ *Running / { name = ($2 == "unittests") ? $2 " " $3 : $2 }
        /^ *Doc-tests / { name = "doctests " $2 }
        /^test result:/ {
            p = $4; f = $6; ig = $8;
            sub(";", "", p); sub(";", "", f); sub(";", "", ig);
            printf "%-34s passed %4d  failed %3d  ignored %3d\n", name, p, f, ig
        }' "$log")
    echo "$parsed"
    grep -E '^(test .* FAILED|failures:$|    [a-z_:]+$)' "$log" | head -40 || true
    local fails
    fails=$(awk '/^test result:/ { f = $6; sub(";", "", f); s += f } END { print s + 0 }' "$log")
    local passes
    passes=$(awk '/^test result:/ { p = $4; sub(";", "", p); s += p } END { print s + 0 }' "$log")
    summary+=("$label: $passes passed, $fails failed (log: $log)")
    if [ "$rc" != 0 ] || [ "$fails" != 0 ]; then
        echo "--- $label FAILED (cargo exit $rc); last lines of $log:"
        tail -n 40 "$log"
        failures+=("$label")
    fi
}

# facade_pkg DIR PUBLISHED: a package at DIR that builds polling's tests (copied
# by the caller into DIR/tests) against the facade as the package `polling`: the
# facade's manifest with absolute paths, plus polling's dev-dependencies (and
# cfg-if, a normal dependency of polling that its tests use through `cfg_if!`; the
# windows-sys that its windows_waitable test uses is the facade's own Windows
# dev-dependency).
facade_pkg() {
    rm -rf "$1"
    mkdir -p "$1/tests"
    {
        # (without its [[test]] sections: their files are the facade's, not here)
        awk '/^\[/ { skip = ($0 == "[[test]]") } !skip' "$facade/Cargo.toml" |
            sed -e "s|path = \"\\.\\./\\.\\.\"|path = \"$repo\"|" \
                -e "s|^\\[package\\]|[package]\\nbuild = \"$facade/build.rs\"|"
        printf '\n[lib]\npath = "%s/src/lib.rs"\n' "$facade"
        awk '/^\[/ { keep = ($0 ~ /dev-dependencies/) } keep' "$2/Cargo.toml"
        awk '/^\[/ { keep = ($0 == "[dependencies.cfg-if]") } keep' "$2/Cargo.toml" |
            sed 's/^\[dependencies\.cfg-if\]/[dev-dependencies.cfg-if]/'
    } >"$1/Cargo.toml"
}

runner=()
if [ "$windows" = 1 ]; then
    # shellcheck source=compat/clients-windows.sh
    source "$repo/compat/clients-windows.sh"
    windows_mode
    step "summary"
    printf '%s\n' "${summary[@]}"
    if [ "${#failures[@]}" != 0 ]; then
        echo "FAILED: ${failures[*]}"
        exit 1
    fi
    echo "all Windows client suites passed"
    exit 0
fi

# --- async-io and async-process: their packages with the [patch] line -----------
# client_suite NAME: copies, patches and tests the published package (its
# directory is left in $client_dir).
client_suite() {
    local dir
    dir="$scratch/$1-$(version_of "$1")"
    copy_pkg "$1" "$dir"
    patch_pkg "$dir"
    run_suite "$(basename "$dir")" "$dir"
    client_dir=$dir
}
# Skipped: none. async-io's tests use 127.0.0.1, except issue_182's
# `networking_initialized`, which resolves google.com and returns early (passing)
# when it cannot, as offline.
client_suite async-io
aio=$client_dir
summary+=("  (async-io issue_182::networking_initialized passes without a connection when DNS is unreachable)")
client_suite async-process

# --- polling's own tests, against the facade as the package `polling` ---------
pl_ver=$(version_of polling)
pl_pub="$scratch/polling-$pl_ver-published"
copy_pkg polling "$pl_pub"
pl="$scratch/polling-$pl_ver-on-facade"
facade_pkg "$pl" "$pl_pub"
skipped_windows=()
for t in "$pl_pub"/tests/*.rs; do
    base=$(basename "$t")
    case "$base" in
        windows_*) skipped_windows+=("$base") ;;
        *) cp "$t" "$pl/tests/" ;;
    esac
done
echo "polling tests not run (Windows only, #![cfg(windows)]): ${skipped_windows[*]}"
# The facade refuses PollMode::Edge/EdgeOneshot (Poller::supports_edge() is false),
# and these two tests panic on Linux when the edge mode is refused. (The
# multiple_pollers tests of the edge mode check supports_edge() and return.)
edge_skips=(edge_triggered edge_oneshot_triggered)
for t in "$pl"/tests/*.rs; do
    name=$(basename "$t" .rs)
    if [ "$name" = other_modes ]; then
        args=(--test "$name" -- --exact)
        for s in "${edge_skips[@]}"; do args+=(--skip "$s"); done
        echo "SKIPPED: other_modes::${edge_skips[*]} (PollMode::Edge/EdgeOneshot: unsupported by the facade)"
    else
        args=(--test "$name")
    fi
    run_suite "polling-$pl_ver:$name" "$pl" "${args[@]}"
done
run_suite "polling-facade-own" "$facade"

# --- cross checks: async-io with the facade on the kqueue targets --------------
if [ "$cross" = 1 ]; then
    for target in x86_64-unknown-freebsd aarch64-apple-darwin; do
        step "cargo check $(basename "$aio") --target $target (facade: os::kqueue filters)"
        if ! rustup target list --installed | grep -qx "$target"; then
            rustup target add "$target"
        fi
        if (cd "$aio" && cargo check --lib --target "$target"); then
            summary+=("cargo check async-io --target $target: ok")
        else
            summary+=("cargo check async-io --target $target: FAILED")
            failures+=("check-$target")
        fi
        step "cargo clippy the facade --target $target (tests included)"
        if (cd "$facade" && cargo clippy --all-targets --target "$target" -- -D warnings); then
            summary+=("cargo clippy compat/polling --target $target: ok")
        else
            summary+=("cargo clippy compat/polling --target $target: FAILED")
            failures+=("clippy-$target")
        fi
    done
fi

# --- the kqueue filters against libkqueue on Linux ----------------------------
step "os::kqueue filters against libkqueue (--cfg pollshot_libkqueue)"
if [ -z "${PKG_CONFIG_PATH:-}" ] && [ -z "${LIBKQUEUE_DIR:-}" ] &&
    [ -d /opt/libkqueue/lib/pkgconfig ]; then
    export PKG_CONFIG_PATH=/opt/libkqueue/lib/pkgconfig
fi
if pkg-config --exists libkqueue 2>/dev/null || [ -n "${LIBKQUEUE_DIR:-}" ]; then
    libdir=${LIBKQUEUE_DIR:-$(pkg-config --variable=libdir libkqueue)}
    export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    CARGO_TARGET_DIR="$scratch/target-libkqueue" RUSTFLAGS="--cfg pollshot_libkqueue" \
        run_suite "polling-facade-libkqueue" "$facade" --test kqueue_filters
else
    echo "SKIPPED: libkqueue not found (pkg-config libkqueue, LIBKQUEUE_DIR, /opt/libkqueue)"
    summary+=("polling-facade-libkqueue: SKIPPED (libkqueue not installed)")
fi

step "summary"
printf '%s\n' "${summary[@]}"
if [ "${#failures[@]}" != 0 ]; then
    echo "FAILED: ${failures[*]}"
    exit 1
fi
echo "all client suites passed"
