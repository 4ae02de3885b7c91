#!/usr/bin/env bash
# Cross-builds longhaul for Windows, lints it (clippy -D warnings), runs the
# tests of the crates ported so far under Wine, then the Windows longhaul.exe against the Linux one as
# real processes (interop.py). Packages: .ci/setup-windows. Wine is not
# Windows: functional tests only, no timings.
set -euo pipefail
cd "$(dirname "$0")/../.."
linux=target/debug/longhaul
# The Linux binary the README's test command built (or build it).
[ -x "$linux" ] || cargo build -p longhaul
source scripts/windows/env.sh
WINEPREFIX="$(bash scripts/windows/wine_prefix.sh)"
export WINEPREFIX
trap 'wineserver -k 2>/dev/null || true' EXIT
# One wineserver for the whole run: left to itself it exits a few seconds
# after its last process, and a process started in that moment loses it
# ("wine client error:0: recvmsg: Connection reset by peer"). The one a
# fresh prefix's wineboot left is waited for first (killed if it stays,
# as one left by a killed run would).
timeout 10 wineserver -w 2>/dev/null || wineserver -k 2>/dev/null || true
wineserver -p || true
crates=(-p longhaul-proto -p longhaul-carrier -p longhaul-session)
# Clippy for Windows: every crate's code, and the tests that run here (the
# other crates' tests drive Linux namespaces and Unix sockets).
/usr/bin/cargo clippy --workspace "${LONGHAUL_WINDOWS_TARGET[@]}" -- -D warnings
/usr/bin/cargo clippy "${crates[@]}" --all-targets "${LONGHAUL_WINDOWS_TARGET[@]}" -- -D warnings
# longhaul.exe built with the test profile and zipped as a release would
# be (--version names the target); built first, the tests then reuse most
# of its dependencies (the other way round, each built nearly everything).
PROFILE=test bash scripts/windows/package.sh
/usr/bin/cargo test "${crates[@]}" "${LONGHAUL_WINDOWS_TARGET[@]}" "$@"
python3 scripts/windows/interop.py "$linux" target/windows/x86_64-pc-windows-gnu/debug/longhaul.exe
