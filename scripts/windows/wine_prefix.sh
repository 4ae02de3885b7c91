#!/usr/bin/env bash
# Prints the path of a Wine prefix that runs Rust programs, making it on
# first use under target/windows/ (never in the user's ~/.wine): Wine 8
# lacks bcryptprimitives.dll, which Rust's std imports, so the prefix gets
# the stand-in built from bcryptprimitives.c.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
prefix="$here/../../target/windows/wine-prefix"
if [ ! -f "$prefix/.longhaul-ready" ]; then
    mkdir -p "$prefix"
    prefix="$(cd "$prefix" && pwd)"
    WINEPREFIX="$prefix" WINEDEBUG=-all WINEARCH=win64 wineboot -i >/dev/null 2>&1
    x86_64-w64-mingw32-gcc -O2 -shared -o "$prefix/bcryptprimitives.dll" \
        "$here/bcryptprimitives.c" "$here/bcryptprimitives.def" -lbcrypt
    cp "$prefix/bcryptprimitives.dll" "$prefix/drive_c/windows/system32/"
    touch "$prefix/.longhaul-ready"
fi
cd "$prefix" && pwd
