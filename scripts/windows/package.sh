#!/usr/bin/env bash
# Builds longhaul.exe for Windows (release) and zips it with the README,
# SECURITY notes and an example client config:
# target/windows/longhaul-VERSION-x86_64-pc-windows-gnu.zip. Packages:
# .ci/setup-windows. The exe is checked to run (`--version` under Wine)
# before it is zipped.
#
#   scripts/windows/package.sh            # release build (slow: builds std)
#   PROFILE=debug scripts/windows/package.sh   # a debug build
#   PROFILE=test scripts/windows/package.sh    # CI: the test build's profile,
#                                              # reusing what the tests built
set -euo pipefail
cd "$(dirname "$0")/../.."
profile="${PROFILE:-release}"
source scripts/windows/env.sh
WINEPREFIX="$(bash scripts/windows/wine_prefix.sh)"
export WINEPREFIX
# Cargo's profile names and the folders they build into.
case "$profile" in
release) flags=(--release) dir=release ;;
test) flags=(--profile test) dir=debug ;;
*) flags=() dir=debug ;;
esac
/usr/bin/cargo build --locked -p longhaul "${flags[@]}" "${LONGHAUL_WINDOWS_TARGET[@]}"
exe="target/windows/x86_64-pc-windows-gnu/$dir/longhaul.exe"
version="$(WINEDEBUG=-all wine "$exe" --version | tr -d '\r')"
case "$version" in
    *x86_64-pc-windows-gnu*) ;;
    *) echo "longhaul.exe --version does not name its target: $version" >&2; exit 1 ;;
esac
number="$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)"
stage="target/windows/package/longhaul-$number-x86_64-pc-windows-gnu"
rm -rf "$stage" && mkdir -p "$stage"
cp "$exe" "$stage/longhaul.exe"
cp README.md docs/SECURITY.md "$stage/"
[ -f contrib/client.toml ] && cp contrib/client.toml "$stage/client.example.toml"
zip="target/windows/$(basename "$stage").zip"
rm -f "$zip"
(cd "$(dirname "$stage")" && python3 -m zipfile -c "$OLDPWD/$zip" "$(basename "$stage")")
echo "$zip: $version"
