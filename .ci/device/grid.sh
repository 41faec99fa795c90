#!/usr/bin/env bash
# The pingpong grid on a many-core machine: P in {1,8,64} x T in {1,2,4,8}, seven
# implementations, 5 interleaved repetitions of 250 ms (about 110 s). Needs
# target/device from prepare.sh and OUT (a folder for grid.txt and machine.txt).
# CHART=1 also draws docs/pingpong.svg's chart there, with the command its
# caption names (pingpong.svg and chart.txt in OUT; about 60 s more).
set -u
cd "$(dirname "$0")/../.."
{ uname -a; nproc; grep -m1 "model name" /proc/cpuinfo; cat /proc/sys/kernel/io_uring_disabled 2>/dev/null; uptime; } > "$OUT/machine.txt" 2>&1
timeout 420 target/device/pingpong-bench \
    --impl pollshot-epoll,pollshot-uring,pollshot-epoll-sharded,pollshot-uring-sharded,epoll-hand,mio,polling \
    --pairs 1,8,64 --threads 1,2,4,8 --reps "${REPS:-5}" --millis "${MS:-250}" > "$OUT/grid.txt" 2>&1
echo "grid: exit $?" >> "$OUT/machine.txt"
if [ -n "${CHART:-}" ]; then
    timeout 300 target/device/pingpong-bench --impl pollshot-epoll,epoll-hand,mio,polling \
        --chart "$OUT/pingpong.svg" > "$OUT/chart.txt" 2>&1
    echo "chart: exit $?" >> "$OUT/machine.txt"
fi
