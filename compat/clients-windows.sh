# The Windows mode of compat/clients.sh (`compat/clients.sh --windows`), sourced
# by it after the fetch: runs, for x86_64-pc-windows-gnu and under wine through
# .ci/wine.sh (the stand-in bcryptprimitives.dll, a persistent wineserver per
# suite),
#   1. polling 3.11.0's own test suite on the facade (its windows_* tests
#      included), as the package `polling`;
#   2. async-io's suite with the [patch] line (the facade);
#   3. stock polling 3.11.0's own suite, unpatched, for comparison: a test that
#      fails there too fails because of wine, not the facade.
# Each suite prints its counts per test binary. Tests skipped by name are listed
# below with the reason, and each is shown to fail on stock polling under wine.
#
# Needs wine (wine64), x86_64-w64-mingw32-gcc (gcc-mingw-w64-x86-64) and the
# rustup target x86_64-pc-windows-gnu (as .ci/wine.sh says).

windows_target=x86_64-pc-windows-gnu

# Skipped in every suite of this mode, by test name, with the reason (each fails
# the same way on stock polling 3.11.0 under wine 8.0; see the stock run below,
# which runs them):
windows_skips=(
)

windows_mode() {
    runner=(bash "$repo/.ci/wine.sh")
    if ! rustup target list --installed | grep -qx "$windows_target"; then
        echo "installing: rustup target add $windows_target"
        rustup target add "$windows_target"
    fi
    local skip_args=()
    local s
    for s in "${windows_skips[@]}"; do
        skip_args+=(--skip "$s")
    done

    # --- polling's own tests on the facade, windows_* included ----------------
    pl_ver=$(version_of polling)
    pl_pub="$scratch/polling-$pl_ver-published"
    copy_pkg polling "$pl_pub"
    local pl="$scratch/polling-$pl_ver-on-facade-windows"
    facade_pkg "$pl" "$pl_pub"
    cp "$pl_pub"/tests/*.rs "$pl/tests/"
    run_suite "windows:polling-$pl_ver-on-facade" "$pl" --target "$windows_target" \
        --tests -- --exact ${skip_args[@]+"${skip_args[@]}"}

    # --- async-io with the [patch] line ----------------------------------------
    local aio
    aio="$scratch/async-io-$(version_of async-io)-windows"
    copy_pkg async-io "$aio"
    patch_pkg "$aio"
    run_suite "windows:$(basename "$aio" -windows)" "$aio" --target "$windows_target" \
        -- --exact ${skip_args[@]+"${skip_args[@]}"}

    # --- stock polling, for comparison (nothing skipped) -----------------------
    rm -f "$pl_pub/Cargo.lock"
    (cd "$pl_pub" && cargo generate-lockfile)
    run_suite "windows:polling-$pl_ver-stock" "$pl_pub" --target "$windows_target" --tests
}
