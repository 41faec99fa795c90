#!/usr/bin/env bash
# benches/strace.sh: system calls per round trip, by name, for each pingpong
# implementation, counted from outside with `strace -f -c` (peers included).
#
# Usage: benches/strace.sh [--pairs P] [--threads T] [IMPL ...]
#   default: P=1 T=1, every implementation `pingpong --list` names.
#
# Each implementation runs twice under strace, with R1 and R2 round trips; the
# difference of the counts divided by the difference of the round trips is the
# steady-state cost of one round trip (setup, thread start and teardown cancel
# out). Socket I/O in the bench is recvfrom/sendto (std's UnixStream), so the
# `read` and `write` columns are notifier traffic only (eventfd, pipes).
# "ctl/cycle" is epoll_ctl per wait cycle: per delivery of one endpoint, of which
# a round trip has two (client and echo each woken once).
set -euo pipefail
cd "$(dirname "$0")/.."

P=1 T=1 R1=${R1:-2000} R2=${R2:-12000}
IMPLS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --pairs) P=$2; shift 2 ;;
        --threads) T=$2; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        -*) echo "strace.sh: unknown flag $1" >&2; exit 2 ;;
        *) IMPLS+=("$1"); shift ;;
    esac
done

if ! command -v strace >/dev/null; then
    echo "strace.sh: SKIPPED: strace is not installed (apt-get install strace)"
    exit 0
fi

# On Linux the io_uring backend (pollshot-uring) is built in too.
FEATURES=()
[ "$(uname -s)" = Linux ] && FEATURES=(--features io-uring)
BIN=$(cargo bench "${FEATURES[@]}" --bench pingpong --no-run --message-format=json 2>/dev/null \
    | grep -o '"executable":"[^"]*"' | grep pingpong | tail -1 | cut -d'"' -f4)
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then
    echo "strace.sh: could not build the pingpong bench" >&2
    exit 1
fi
if [ ${#IMPLS[@]} -eq 0 ]; then
    mapfile -t IMPLS < <("$BIN" --list)
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# run IMPL R -> prints "round_trips file"
run() {
    local impl=$1 r=$2 out=$TMP/$1.$2
    strace -f -c -o "$out.strace" "$BIN" --impl "$impl" --pairs "$P" --threads "$T" \
        --rounds "$r" --reps 1 >"$out.stdout" 2>&1 || {
        echo "strace.sh: $impl failed:" >&2; cat "$out.stdout" >&2; exit 1; }
    local rt
    rt=$(sed -n 's/^round_trips=//p' "$out.stdout")
    echo "$rt $out.strace"
}

echo "system calls per round trip (strace -f -c, marginal between $R1 and $R2 round trips), P=$P T=$T"
printf '%-26s %8s %8s %9s %9s %7s %7s %6s %6s %6s %8s %11s %7s %7s %9s\n' \
    implementation recvfrom sendto epoll_ctl epoll_wait poll kevent read write futex timerfd uring_enter other total ctl/cycle
for impl in "${IMPLS[@]}"; do
    read -r rt1 f1 < <(run "$impl" "$R1")
    read -r rt2 f2 < <(run "$impl" "$R2")
    awk -v rt1="$rt1" -v rt2="$rt2" -v name="$impl" -v P="$P" '
        # strace -c rows: % time, seconds, usecs/call, calls, [errors], syscall
        FNR == 1 { file++ }
        $1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" { c[file, $NF] += $4; names[$NF] = 1 }
        END {
            d = rt2 - rt1
            if (d <= 0) { printf "%-26s (no round trips measured)\n", name; exit }
            split("recvfrom sendto epoll_ctl epoll_wait poll kevent read write futex timerfd io_uring_enter", cols, " ")
            for (n in names) {
                v = (c[2, n] - c[1, n]) / d
                col = n
                if (n == "epoll_pwait" || n == "epoll_pwait2") col = "epoll_wait"
                if (n == "ppoll") col = "poll"
                if (n == "timerfd_settime") col = "timerfd"
                if (n == "recvmsg") col = "recvfrom"
                if (n == "sendmsg") col = "sendto"
                known = 0
                for (i in cols) if (cols[i] == col) known = 1
                if (!known) col = "other"
                per[col] += v
                total += v
            }
            for (k in per) if (per[k] > -0.005 && per[k] < 0.005) per[k] = 0
            printf "%-26s", name
            for (i = 1; i <= 11; i++) printf " %*.2f", (i <= 2 ? 8 : (i <= 4 ? 9 : (i <= 6 ? 7 : (i <= 10 ? 6 : 11)))), per[cols[i]] + 0
            printf " %7.2f %7.2f", per["other"] + 0, total
            # Two wait cycles (two deliveries) per round trip in the pingpong.
            printf " %9.3f\n", per["epoll_ctl"] / 2
        }' "$f1" "$f2"
done
