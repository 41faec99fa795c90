#!/usr/bin/env bash
# Builds what the many-core runs need into target/device (an ignored folder that a
# device machine receives as it is: it has no network, so no cargo there).
#
# Usage (from the repository root): bash .ci/device/prepare.sh
# Then, on the many-core machine, from the repository root, with OUT set to a folder
# for the results: bash .ci/device/grid.sh, or bash .ci/device/stress.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=target/device
rm -rf "$dest" && mkdir -p "$dest"
# The pingpong bench (every implementation; the grid).
bench=$(cargo bench --features io-uring,stats --bench pingpong --no-run --message-format=json 2>/dev/null |
    jq -r 'select(.reason == "compiler-artifact" and .target.name == "pingpong" and .executable != null) | .executable')
strip -o "$dest/pingpong-bench" "$bench"
# The main job.
cargo build -q --release -p pingpong --features io-uring
strip -o "$dest/pingpong-main" target/release/pingpong
# The Linux suites, as CI's io_uring step builds them.
cargo test -q --features stats,io-uring --no-run --message-format=json 2>/dev/null |
    jq -r 'select(.reason == "compiler-artifact" and .executable != null and .profile.test) | "\(.target.name) \(.executable)"' |
    while read -r name exe; do
        case $name in
            pollshot | uring | fork_reinit | epoll | blocking | default_backend | echo_server)
                strip -o "$dest/test-$name" "$exe" ;;
        esac
    done
ls -la "$dest"
du -sh "$dest"
