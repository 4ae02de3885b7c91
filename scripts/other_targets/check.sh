#!/usr/bin/env bash
# Type-checks the workspace (every target: library, binary, tests) for
# FreeBSD and macOS with Debian's toolchain and std built from source
# (scripts/windows/env.sh). Nothing is linked or run: there is no FreeBSD
# or macOS machine here, and no Apple SDK (the C parts of ring, blake3 and
# mimalloc compile to empty objects: cc_stub.sh). Packages:
# .ci/setup-windows and clang.
set -euo pipefail
cd "$(dirname "$0")/../.."
here="$(pwd)/scripts/other_targets"
source scripts/windows/env.sh
# macOS on arm64 only: x86_64 macOS compiles the same cfg(target_os) code,
# and a third std build cost CI minutes.
for t in x86_64-unknown-freebsd aarch64-apple-darwin; do
    case "$t" in
    *apple*)
        v=${t//-/_}
        export "CC_$v=$here/cc_stub.sh" "AR_$v=llvm-ar"
        ;;
    esac
    echo "== cargo check --target $t"
    /usr/bin/cargo check --workspace --all-targets -Zbuild-std=std,panic_abort \
        --target "$t" --target-dir target/other
done
