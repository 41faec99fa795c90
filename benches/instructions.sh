#!/usr/bin/env bash
# The instruction bench (benches/instructions.rs) and its regression check.
#
# Runs `cargo bench --features io-uring --bench instructions` under gungraun
# (Callgrind), prints user-space instructions per round trip for every loop (the
# difference between its long and short runs, divided by the round trips between
# them, so setup and teardown cancel), pollshot's margin over the hand-written
# loop of the same kernel interface (polling's and mio's over the hand epoll
# loop), and the operations' counts; then fails (exit 1) if a margin exceeds its
# figure in benches/instructions.bounds by more than 10% (pollshot's margins have
# bounds; polling's and mio's, other crates' code, are printed only).
#
# Usage: benches/instructions.sh [--record]   (--record: rewrite the bounds'
# figures with this run's margins). Needs valgrind and gungraun-runner (the
# version of the gungraun dev-dependency) on PATH; .ci/run installs both.
set -euo pipefail
cd "$(dirname "$0")/.."
bounds=benches/instructions.bounds
# Round trips of the short and long runs (SHORT and LONG in the bench).
short=1000
long=3000

features=io-uring
if [ "${POLLSHOT_NO_URING:-}" = 1 ]; then
    features=""
fi
json=$(cargo bench -q ${features:+--features "$features"} --bench instructions -- --output-format=json)
rows=$(jq -r '[.function_name, .id, .profiles[0].data.total.metrics.Ir.values.new] | @tsv' <<<"$json")
ir() { awk -v f="$1" -v i="$2" '$1 == f && $2 == i { print $3 }' <<<"$rows"; }
# Instructions per round trip of loop $1 at pairs $2 (empty if not run).
per_rt() {
    local s l
    s=$(ir "$1" "p$2_short")
    l=$(ir "$1" "p$2_long")
    [ -n "$s" ] && [ -n "$l" ] || return 0
    echo $(((l - s) / (long - short)))
}

printf '\nuser-space instructions per 64-byte round trip (one thread; Callgrind, %d - %d round trips)\n\n' "$long" "$short"
printf '| loop | P=1 | margin | P=8 | margin |\n|---|--:|--:|--:|--:|\n'
declare -A margin
for loop in hand_epoll pollshot_epoll pollshot_poll polling_oneshot mio_edge hand_uring pollshot_uring; do
    case $loop in
        *_uring) hand=hand_uring ;;
        *) hand=hand_epoll ;;
    esac
    line="| $loop"
    for p in 1 8; do
        x=$(per_rt "$loop" "$p")
        h=$(per_rt "$hand" "$p")
        if [ -z "$x" ]; then
            line+=" | - | -"
        elif [ "$loop" = "$hand" ]; then
            line+=" | $x | -"
        else
            margin[${loop}_p$p]=$((x - h))
            line+=" | $x | +$((x - h))"
        fi
    done
    echo "$line |"
done
printf '\nPoller<Epoll>, one operation (instructions, setup excluded)\n\n| operation | instructions |\n|---|--:|\n'
awk '$2 !~ /^p[0-9]+_(short|long)$/ { printf "| %s %s | %s |\n", $1, $2, $3 }' <<<"$rows"

if [ "${1:-}" = --record ]; then
    tmp=$(mktemp)
    while IFS= read -r l; do
        if [[ $l =~ ^([a-z_0-9]+)([[:space:]]+)([a-z_]+)([[:space:]]+)[0-9]+$ ]] && [ -n "${margin[${BASH_REMATCH[1]}]:-}" ]; then
            printf '%-17s %-13s %s\n' "${BASH_REMATCH[1]}" "${BASH_REMATCH[3]}" "${margin[${BASH_REMATCH[1]}]}"
        else
            echo "$l"
        fi
    done <"$bounds" >"$tmp"
    mv "$tmp" "$bounds"
    echo "recorded in $bounds"
    exit 0
fi

echo
bad=0
while read -r name _hand figure; do
    case $name in '#'* | '') continue ;; esac
    got=${margin[$name]:-}
    if [ -z "$got" ]; then
        echo "bound $name: not measured in this run (io_uring off?)"
        continue
    fi
    limit=$((figure + figure / 10))
    if [ "$got" -gt "$limit" ]; then
        echo "REGRESSION: $name: margin +$got instructions per round trip, bound +$limit (+$figure recorded, +10%)"
        bad=1
    else
        echo "ok: $name: margin +$got (bound +$limit)"
    fi
done <"$bounds"
exit "$bad"
