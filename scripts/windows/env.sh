# Sourced: the environment of a Windows cross-build on Debian 12 with
# Debian's rustc-web (its library source lets cargo build Windows' std:
# rustup cannot fetch targets here) and mingw-w64, tests run by Wine.
# Packages: .ci/setup-windows. Tests: scripts/windows/test.sh.
export PATH=/usr/bin:$PATH RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER=wine
export WINEDEBUG=-all WINEARCH=win64
LONGHAUL_WINDOWS_TARGET=(-Zbuild-std=std,panic_abort --target x86_64-pc-windows-gnu
    --target-dir target/windows)
