#!/usr/bin/env bash
# Loopback: is `longhaul cp` the bottleneck? Its goodput (hashing on, files
# on tmpfs) against the same tunnel's `bench tput`, interleaved, one run.
#
#   scripts/cp_loopback.sh [SIZE (2g)] [ROUNDS (3)]
#
# Needs a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
LH=${LH:-$PWD/target/release/longhaul}
size=${1:-2g}; rounds=${2:-3}
work=/dev/shm/lh-cp-loop
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
rm -rf "$work"; mkdir -p "$work/srv" "$work/k"
k=$work/k
"$LH" -q keygen --out "$k/s.key" >/dev/null
echo "$("$LH" -q keygen --out "$k/c.key") files=rw" > "$k/ak"
pin=$(cut -d' ' -f1 "$k/s.key.pub")
"$LH" -q bench server --listen 127.0.0.1:15201 & pids+=($!)
"$LH" -q server --listen 127.0.0.1:17000 --key "$k/s.key" --authorized-keys "$k/ak" \
  --files "$work/srv" --allow 127.0.0.1:15201 & pids+=($!)
sleep 0.5
"$LH" -q client 127.0.0.1:17000 --key "$k/c.key" --pin "$pin" -L 127.0.0.1:16201:127.0.0.1:15201 & pids+=($!)
head -c "$(numfmt --from=iec "${size^^}")" /dev/urandom > "$work/src.bin"
sleep 1
cpr() { "$LH" -q cp --json --key "$k/c.key" --pin "$pin" "$@" | sed -n 's/.*"goodput_bps": \([0-9.]*\).*/\1/p' | awk '{printf "%.2f", $1/1e9}'; }
echo "| round | bench tput (Gbit/s) | bench tput -R | cp upload | cp download |"
echo "|---|---|---|---|---|"
for r in $(seq "$rounds"); do
  t=$("$LH" -q bench tput 127.0.0.1:16201 -t 5 --json | sed -n 's/.*"bits_per_sec": \([0-9.]*\).*/\1/p' | head -1 | awk '{printf "%.2f", $1/1e9}')
  tr=$("$LH" -q bench tput 127.0.0.1:16201 -t 5 -R --json | sed -n 's/.*"bits_per_sec": \([0-9.]*\).*/\1/p' | head -1 | awk '{printf "%.2f", $1/1e9}')
  rm -f "$work/srv/src.bin"
  up=$(cpr "$work/src.bin" 127.0.0.1:17000:/)
  rm -f "$work/back.bin"
  down=$(cpr 127.0.0.1:17000:/src.bin "$work/back.bin")
  cmp -s "$work/src.bin" "$work/back.bin" || { echo "MISMATCH" >&2; exit 1; }
  echo "| $r | $t | $tr | $up | $down |"
done
