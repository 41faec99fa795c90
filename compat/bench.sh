#!/usr/bin/env bash
# The side-by-side HTTP benchmark of issue 10: one async-io keep-alive server
# (compat/bench-http: Async<TcpListener>, async-executor, one task per connection)
# built twice from the same source in scratch directories outside the repository:
# "stock" on polling 3.11.0 from crates.io, "facade" with
#     [patch.crates-io] polling = { path = "<repo>/compat/polling" }
# Each is loaded by wrk at c=1 (-t1 -c1) and c=64 (-t2 -c64), runs interleaved,
# REPS repetitions each (medians reported). Per run: requests/s, server CPU µs per
# request (/proc/PID/stat utime+stime, all threads), system calls per request
# (perf stat -e raw_syscalls:sys_enter on the server: counted in the kernel, without
# slowing it), wrk's errors. Then one shorter run of each under strace -f -c for
# the calls by name (strace slows the server several-fold, which changes how often
# it blocks, so its totals are shown but the targets use perf's counts).
#
# Usage: compat/bench.sh [--reps N] [--seconds S] [--strace-seconds S] [--threads T]
#   --threads T: the server's executor threads (default 1); POLLSHOT_BENCH_DIR=DIR
#   keeps the builds in DIR (default: a new temporary directory, removed at exit).
# Needs: cargo, wrk, perf (for syscall counts; else that column is "-"), strace.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
reps=3
seconds=5
strace_seconds=2
threads=1
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) reps=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --strace-seconds) strace_seconds=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

for tool in cargo wrk; do
    command -v "$tool" >/dev/null || { echo "bench.sh: $tool is required" >&2; exit 1; }
done
have_perf=0
if command -v perf >/dev/null && perf stat -e raw_syscalls:sys_enter -- true >/dev/null 2>&1; then
    have_perf=1
else
    echo "bench.sh: perf cannot count raw_syscalls:sys_enter here: no syscalls/request column"
fi
# The calls counted by name (where the kernel has the tracepoint), besides the total.
perf_events=raw_syscalls:sys_enter
perf_names=()
for name in recvfrom sendto read write epoll_wait epoll_pwait epoll_pwait2 epoll_ctl \
    futex accept4 timerfd_settime; do
    if [ -d "/sys/kernel/tracing/events/syscalls/sys_enter_$name" ] ||
        [ -d "/sys/kernel/debug/tracing/events/syscalls/sys_enter_$name" ]; then
        perf_events="$perf_events,syscalls:sys_enter_$name"
        perf_names+=("$name")
    fi
done
if [ "$have_perf" = 1 ] && ! perf stat -e "$perf_events" -- true >/dev/null 2>&1; then
    perf_events=raw_syscalls:sys_enter
    perf_names=()
fi
have_strace=0
command -v strace >/dev/null && have_strace=1

if [ -n "${POLLSHOT_BENCH_DIR:-}" ]; then
    scratch=$POLLSHOT_BENCH_DIR
    mkdir -p "$scratch"
else
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/pollshot-bench.XXXXXX")
    trap 'rm -rf "$scratch"' EXIT
fi
case "$scratch/" in
    "$repo"/*) echo "bench.sh: the scratch directory must be outside the repository" >&2; exit 2 ;;
esac
export CARGO_TERM_COLOR=never
clk_tck=$(getconf CLK_TCK)

# --- two builds of one source ---------------------------------------------------
for v in stock facade; do
    dir="$scratch/$v"
    mkdir -p "$dir"
    rm -rf "$dir/src"
    cp -R "$repo/compat/bench-http/src" "$repo/compat/bench-http/Cargo.toml" "$dir/"
    if [ "$v" = facade ]; then
        printf '\n[patch.crates-io]\npolling = { path = "%s/compat/polling" }\n' "$repo" >>"$dir/Cargo.toml"
    fi
    rm -f "$dir/Cargo.lock"
    (cd "$dir" && cargo generate-lockfile -q && cargo build --release -q)
    used=$(cd "$dir" && cargo tree -i polling -e normal --prefix none | head -n1)
    echo "$v: $used"
    case "$v:$used" in
        facade:*"($repo/compat/polling)"*) ;;
        stock:*"("*) echo "bench.sh: stock build does not use crates.io polling" >&2; exit 1 ;;
        stock:*) ;;
        *) echo "bench.sh: facade build does not use the facade" >&2; exit 1 ;;
    esac
done

# --- one run ----------------------------------------------------------------------
server_pid=
start_server() { # IMPL [WRAPPER...] -> sets server_pid, port
    local v=$1
    shift
    local out="$scratch/$v.out"
    : >"$out"
    "$@" "$scratch/$v/target/release/pollshot-bench-http" --port 0 --threads "$threads" >"$out" 2>&1 &
    server_pid=$!
    for _ in $(seq 100); do
        if grep -q 'listening on' "$out"; then break; fi
        sleep 0.05
    done
    port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$out")
    [ -n "$port" ] || { echo "bench.sh: $v did not start"; cat "$out"; exit 1; }
    # Let async-io start its reactor thread before counting.
    sleep 0.3
}

stop_server() {
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
}

cpu_ticks() { # PID -> utime+stime of every thread, in clock ticks
    awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"
}

wrk_args() { # CONNS
    if [ "$1" = 1 ]; then echo "-t1 -c1"; else echo "-t2 -c$1"; fi
}

# run IMPL CONNS -> appends "rps cpu_us_per_req syscalls_per_req errors" to results
run() {
    local v=$1 conns=$2
    start_server "$v"
    local perf_out="$scratch/perf.$v.$conns" perf_pid=
    if [ "$have_perf" = 1 ]; then
        perf stat -x, -e "$perf_events" -p "$server_pid" -o "$perf_out" &
        perf_pid=$!
        sleep 0.2
    fi
    local t0 t1 log="$scratch/wrk.$v.$conns"
    t0=$(cpu_ticks "$server_pid")
    # shellcheck disable=SC2046
    wrk $(wrk_args "$conns") -d"${seconds}s" "http://127.0.0.1:$port/" >"$log"
    t1=$(cpu_ticks "$server_pid")
    local calls=-
    if [ -n "$perf_pid" ]; then
        kill -INT "$perf_pid"
        wait "$perf_pid" || true
        calls=$(awk -F, '/raw_syscalls:sys_enter/ { print $1 }' "$perf_out")
    fi
    stop_server
    if [ -n "$perf_pid" ]; then
        local req
        req=$(awk '/ requests in / { print $1 }' "$log")
        awk -F, -v v="$v" -v c="$conns" -v req="$req" '/syscalls:sys_enter_/ {
                n = $3; sub(/.*sys_enter_/, "", n); printf "%s %s %s %.3f\n", v, c, n, $1 / req
            }' "$perf_out" >>"$scratch/names"
    fi
    awk -v v="$v" -v c="$conns" -v t0="$t0" -v t1="$t1" -v hz="$clk_tck" -v calls="$calls" '
        / requests in / { req = $1 }
        /^Requests\/sec:/ { rps = $2 }
        /Socket errors:/ { gsub(",", ""); err += $4 + $6 + $8 + $10 }
        /Non-2xx or 3xx responses:/ { err += $5 }
        END {
            cpu = (t1 - t0) * 1e6 / hz / req
            spr = (calls == "-" || calls == "") ? "-" : sprintf("%.2f", calls / req)
            printf "%s %s %.0f %.2f %s %d\n", v, c, rps, cpu, spr, err + 0
        }' "$log" | tee -a "$scratch/results"
}

: >"$scratch/results"
: >"$scratch/names"
echo
echo "impl conns req/s cpu_us/req syscalls/req errors  (wrk -d${seconds}s, server --threads $threads)"
for rep in $(seq "$reps"); do
    for conns in 1 64; do
        # Interleaved; the order alternates between repetitions.
        if [ $((rep % 2)) = 1 ]; then order="stock facade"; else order="facade stock"; fi
        for v in $order; do run "$v" "$conns"; done
    done
done

# --- system calls by name: strace -f -c, a shorter run each ----------------------
if [ "$have_strace" = 1 ]; then
    for conns in 1 64; do
        for v in stock facade; do
            out="$scratch/strace.$v.$conns"
            start_server "$v" strace -f -c -o "$out"
            # shellcheck disable=SC2046
            wrk $(wrk_args "$conns") -d"${strace_seconds}s" "http://127.0.0.1:$port/" >"$scratch/wrk.strace.$v.$conns"
            # Stop the traced server (strace's child), so strace writes its summary.
            traced=$(pgrep -P "$server_pid" || true)
            [ -z "$traced" ] || kill -TERM $traced
            wait "$server_pid" 2>/dev/null || true
            req=$(awk '/ requests in / { print $1 }' "$scratch/wrk.strace.$v.$conns")
            echo
            echo "strace -f -c, $v, c=$conns, $req requests in ${strace_seconds}s (per request):"
            awk -v req="$req" '
                $NF == "total" { printf "  total %.2f\n", $4 / req; next }
                NF >= 5 && $4 ~ /^[0-9]+$/ {
                    name = $NF; calls = $4
                    if (calls / req >= 0.01) printf "  %-16s %.2f\n", name, calls / req
                }' "$out"
        done
    done
fi

# --- the table and the targets -----------------------------------------------------
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
col() { # IMPL CONNS COLUMN -> median
    awk -v v="$1" -v c="$2" -v k="$3" '$1 == v && $2 == c { print $k }' "$scratch/results" | median
}
errors() { awk -v c="$1" '$2 == c { s += $6 } END { print s + 0 }' "$scratch/results"; }

echo
echo "| c | impl | req/s | CPU µs/req | syscalls/req | errors |"
echo "|---|---|---:|---:|---:|---:|"
for conns in 1 64; do
    for v in stock facade; do
        e=$(awk -v v="$v" -v c="$conns" '$1 == v && $2 == c { s += $6 } END { print s + 0 }' "$scratch/results")
        printf '| %s | %s | %s | %s | %s | %s |\n' "$conns" "$v" "$(col "$v" "$conns" 3)" \
            "$(col "$v" "$conns" 4)" "$(col "$v" "$conns" 5)" "$e"
    done
done

if [ "${#perf_names[@]}" -gt 0 ]; then
    echo
    echo "system calls per request by name (perf stat, medians):"
    printf '| c | impl |'
    for n in "${perf_names[@]}"; do printf ' %s |' "$n"; done
    printf ' total |\n|---|---|'
    for _ in "${perf_names[@]}"; do printf -- '---:|'; done
    printf -- '---:|\n'
    for conns in 1 64; do
        for v in stock facade; do
            printf '| %s | %s |' "$conns" "$v"
            for n in "${perf_names[@]}"; do
                printf ' %s |' "$(awk -v v="$v" -v c="$conns" -v n="$n" \
                    '$1 == v && $2 == c && $3 == n { print $4 }' "$scratch/names" | median)"
            done
            printf ' %s |\n' "$(col "$v" "$conns" 5)"
        done
    done
fi

verdict() { if [ "$1" = 1 ]; then echo ok; else echo MISS; fi; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0 || a == "-" || b == "-") print "-"; else printf "%.3f", a / b }'; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN { print (a != "-" && a + 0 >= b + 0) ? 1 : 0 }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { print (a != "-" && a + 0 <= b + 0) ? 1 : 0 }'; }

rps1=$(ratio "$(col facade 1 3)" "$(col stock 1 3)")
sys1=$(ratio "$(col facade 1 5)" "$(col stock 1 5)")
rps64=$(ratio "$(col facade 64 3)" "$(col stock 64 3)")
cpu64=$(ratio "$(col facade 64 4)" "$(col stock 64 4)")
echo
echo "targets (facade / stock, medians of $reps):"
echo "  c=1:  syscalls/req ratio $sys1 (<= 0.75)   $(verdict "$(le "$sys1" 0.75)")"
echo "  c=1:  req/s ratio        $rps1 (>= 1.10)   $(verdict "$(ge "$rps1" 1.10)")"
c64=0
if [ "$(ge "$rps64" 1.05)" = 1 ] || [ "$(le "$cpu64" 0.90)" = 1 ]; then c64=1; fi
echo "  c=64: req/s ratio $rps64 (>= 1.05) or CPU/req ratio $cpu64 (<= 0.90)   $(verdict "$c64")"
echo "  errors: c=1 $(errors 1), c=64 $(errors 64) (0)   $(verdict "$(le "$(($(errors 1) + $(errors 64)))" 0)")"
