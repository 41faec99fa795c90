#!/usr/bin/env bash
# The Linux suites (epoll, poll(2), io_uring, fork) and the main job at up to 16
# threads, repeated until DEADLINE seconds (default 330) are nearly spent. Needs
# target/device from prepare.sh and OUT. Writes OUT/summary.txt, one line per run
# (its exit status and test result), and keeps the output of every failed run.
set -u
cd "$(dirname "$0")/../.."
dev=$PWD/target/device
start=$SECONDS
left() { echo $((${DEADLINE:-330} - (SECONDS - start))); }
sum=$OUT/summary.txt
{ uname -r; nproc; cat /proc/sys/kernel/io_uring_disabled 2>/dev/null; } > "$sum"
pass=0
while [ "$(left)" -gt 60 ]; do
    pass=$((pass + 1))
    for t in pollshot uring fork_reinit epoll blocking default_backend echo_server; do
        [ "$(left)" -gt 20 ] || break
        log=$OUT/log.$t.$pass
        s=$SECONDS
        POLLSHOT_FORK_TRIALS=${FORK_TRIALS:-60} timeout 120 "$dev/test-$t" > "$log" 2>&1
        rc=$?
        echo "pass $pass $t exit $rc $((SECONDS - s))s $(grep -h '^test result' "$log" | tail -1)" >> "$sum"
        [ $rc = 0 ] && rm -f "$log"
    done
    for run in "uring 16 64" "uring 8 8" "uring 4 1" "epoll 16 64" "epoll 8 8" "blocking 8 8"; do
        set -- $run
        [ "$(left)" -gt 15 ] || break
        log=$OUT/main.$1.$2.$3.$pass
        timeout 60 "$dev/pingpong-main" --backend "$1" --threads "$2" --pairs "$3" --rounds 200000 > "$log" 2>&1
        rc=$?
        echo "pass $pass main --backend $1 --threads $2 --pairs $3 exit $rc: $(grep -ho '[0-9]* round trips/s\|spurious wake-ups) [0-9]*' "$log" | tr '\n' ' ')" >> "$sum"
        [ $rc = 0 ] && rm -f "$log"
    done
done
echo "elapsed $((SECONDS - start)) s" >> "$sum"
