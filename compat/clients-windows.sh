# The Windows mode of compat/clients.sh (`compat/clients.sh --windows`), sourced
# by it after the fetch: runs, for x86_64-pc-windows-gnu and under wine through
# .ci/wine.sh (the stand-in bcryptprimitives.dll, a persistent wineserver per
# suite),
#   1. polling 3.11.0's own test suite on the facade (its windows_* tests
#      included), as the package `polling`;
#   2. async-io's and async-process's suites with the [patch] line (the facade);
#   3. the facade's own Windows tests (compat/polling/tests/windows.rs);
#   4. stock polling 3.11.0's own suite, unpatched, for comparison: a test that
#      fails there too fails because of wine, not the facade.
# Each suite prints its counts per test binary. Tests skipped by name are listed
# below with the reason, and each is shown to fail on stock polling under wine.
#
# Needs wine (Debian packages wine and wine64), x86_64-w64-mingw32-gcc (gcc-mingw-w64-x86-64) and the
# rustup target x86_64-pc-windows-gnu (as .ci/wine.sh says).

windows_target=x86_64-pc-windows-gnu

# Skipped in every suite of this mode, by test name, with the reason: a test that
# fails the same way on stock polling 3.11.0 under wine (the stock run below runs
# everything). None, measured with Debian's wine 8.0: polling's 21 tests and 22
# doctests pass on stock polling, and every test of each suite here passes on the
# facade.
windows_skips=()

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

    # --- async-io and async-process with the [patch] line ----------------------
    local name dir
    for name in async-io async-process; do
        dir="$scratch/$name-$(version_of "$name")-windows"
        copy_pkg "$name" "$dir"
        patch_pkg "$dir"
        run_suite "windows:$(basename "$dir" -windows)" "$dir" --target "$windows_target" \
            -- --exact ${skip_args[@]+"${skip_args[@]}"}
    done

    # --- the facade's own Windows tests ------------------------------------------
    run_suite "windows:polling-facade-own" "$facade" --target "$windows_target" --test windows

    # --- stock polling, for comparison (nothing skipped) -----------------------
    rm -f "$pl_pub/Cargo.lock"
    (cd "$pl_pub" && cargo generate-lockfile)
    run_suite "windows:polling-$pl_ver-stock" "$pl_pub" --target "$windows_target"
}
