#!/usr/bin/env bash
# Cross-builds the crates that build for Windows so far and runs their
# tests under Wine (packages: .ci/setup-windows). Wine is not Windows:
# functional tests only, no timings.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/windows/env.sh
WINEPREFIX="$(bash scripts/windows/wine_prefix.sh)"
export WINEPREFIX
trap 'wineserver -k 2>/dev/null || true' EXIT
crates=(-p longhaul-proto -p longhaul-carrier -p longhaul-session)
/usr/bin/cargo test "${crates[@]}" "${LONGHAUL_WINDOWS_TARGET[@]}" "$@"
