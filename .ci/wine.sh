#!/usr/bin/env bash
# Runs a command (normally `cargo test --target x86_64-pc-windows-gnu ...`) with
# the crate's Windows test binaries executed under wine:
#
#   bash .ci/wine.sh cargo test --target x86_64-pc-windows-gnu --features stats --test windows
#
# 1. builds the stand-in bcryptprimitives.dll (.ci/wine/bcryptprimitives.c) with
#    mingw: wine 8.0 lacks the DLL, and Rust 1.78+ binaries import ProcessPrng
#    from it (without it they exit with status 53);
# 2. makes a wine prefix of its own, target/wine/prefix (WINE_PREFIX_DIR to move
#    it), once, and copies the stand-in into its system32;
# 3. starts a persistent wineserver (`wineserver -p`) for the whole command, so
#    that it does not shut down between two test binaries, and stops it
#    (`wineserver -k`) on the way out, also on failure;
# 4. runs the command with CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER=wine and
#    WINEDEBUG=-all, its output copied to this script's as it comes;
# 5. fails (exit 1 if the command's own status is 0) when a Windows program
#    crashed under it: wine prints "wine: Unhandled ..." and starts its debugger,
#    after which the crashed test binary often exits with status 0, so cargo
#    alone would report the crash as a pass.
#
# wine's services (winedevice.exe) inherit the stdout of the program that
# started them and hold it open until the server stops: this script starts them
# first, on /dev/null. So this script's own output may be piped
# (`.ci/wine.sh ... | tail`); COMMAND is one command, never a pipeline.
#
# Needs: wine (Debian's wine and wine64 8.0), x86_64-w64-mingw32-gcc (gcc-mingw-w64-x86-64)
# and the rustup target x86_64-pc-windows-gnu. Exits with the command's status.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/target/wine"
export WINEPREFIX="${WINE_PREFIX_DIR:-$dir/prefix}"
export WINEDEBUG=-all
# No Mono or Gecko install dialogs while the prefix is made.
export WINEDLLOVERRIDES="mscoree,mshtml="
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER=wine

die() { echo "wine.sh: $*" >&2; exit 1; }
command -v wine >/dev/null || die "wine not found (apt-get install wine)"
command -v wineserver >/dev/null || die "wineserver not found (apt-get install wine)"
command -v x86_64-w64-mingw32-gcc >/dev/null ||
    die "x86_64-w64-mingw32-gcc not found (apt-get install gcc-mingw-w64-x86-64)"
[ $# -gt 0 ] || die "usage: .ci/wine.sh COMMAND [ARGS...]"

mkdir -p "$dir"
dll="$dir/bcryptprimitives.dll"
src="$root/.ci/wine/bcryptprimitives.c"
if [ ! -f "$dll" ] || [ "$src" -nt "$dll" ]; then
    x86_64-w64-mingw32-gcc -shared -O2 -o "$dll" "$src" -ladvapi32 ||
        die "building the stand-in bcryptprimitives.dll failed"
fi

if [ ! -f "$WINEPREFIX/system.reg" ]; then
    echo "wine.sh: making the wine prefix $WINEPREFIX"
    wineboot -i >/dev/null 2>&1 || die "wineboot -i failed for $WINEPREFIX"
    wineserver -w
fi
sys32="$WINEPREFIX/drive_c/windows/system32"
[ -d "$sys32" ] || die "no system32 in $WINEPREFIX"
cp -f "$dll" "$sys32/bcryptprimitives.dll"

wineserver -p
trap 'wineserver -k 2>/dev/null || true' EXIT
# The first program of the server's life starts wine's services, which inherit
# its output and hold it open until the server stops: start them here, on
# /dev/null, so that no later program's output (a doctest's pipe to rustdoc)
# stays open after that program exits.
wine cmd /c exit </dev/null >/dev/null 2>&1 || die "wine cannot start a program"
# The command writes to a file (never a pipe, which wine's services would hold
# open), printed while it runs and searched for crashes after.
log="$dir/output.$$.log"
: >"$log"
"$@" >"$log" 2>&1 &
pid=$!
tail -n +1 -f --pid="$pid" "$log"
rc=0
wait "$pid" || rc=$?
if grep -q -e '^wine: Unhandled ' -e '^Unhandled exception: ' "$log"; then
    echo "wine.sh: a Windows program crashed under wine (the 'Unhandled' lines above):" >&2
    grep -e '^wine: Unhandled ' "$log" | head -5 >&2
    [ "$rc" -ne 0 ] || rc=1
fi
rm -f "$log"
exit "$rc"
