#!/usr/bin/env bash
# Seed 003's table through longhaul's WAN emulator, one run: goodput of a
# transfer in blocks (4 KiB … 16 MiB), one block in flight and several,
# directly and through a longhaul -L forward (TLS, pinned keys), interleaved.
#
#   scripts/goodput_bench.sh [DELAY (5ms: RTT 10 ms)] [RATE (1gbit)] [DEPTHS (1,8)] [SECONDS (4)]
#
# Needs root and a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
LH=${LH:-target/release/longhaul}
delay=${1:-5ms}; rate=${2:-1gbit}; depths=${3:-1,8}; secs=${4:-4}
NAME=gp
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; "$LH" -q netem --name $NAME down >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$LH" -q netem --name $NAME down >/dev/null 2>&1 || true
"$LH" -q netem --name $NAME up --delay "$delay" --rate "$rate"
A=("$LH" -q netem --name $NAME exec a --)
B=("$LH" -q netem --name $NAME exec b --)
keys=$(mktemp -d)
"$LH" -q keygen --out "$keys/s.key" >/dev/null
"$LH" -q keygen --out "$keys/c.key" > "$keys/ak"
"${B[@]}" "$LH" -q bench server --listen 0.0.0.0:5201 & pids+=($!)
"${B[@]}" "$LH" -q server --listen tls://198.18.0.2:7000 --key "$keys/s.key" \
  --authorized-keys "$keys/ak" --allow 127.0.0.1:5201 & pids+=($!)
sleep 1
"${A[@]}" "$LH" -q client tls://198.18.0.2:7000 --key "$keys/c.key" \
  --pin "$(cut -d' ' -f1 "$keys/s.key.pub")" -L 127.0.0.1:6201:127.0.0.1:5201 & pids+=($!)
sleep 2
echo "# netem: $delay each way, $rate; blocks acknowledged one by one (depth 1) or $depths in flight"
for path in "direct 198.18.0.2:5201" "longhaul 127.0.0.1:6201"; do
  set -- $path
  echo "## $1"
  "${A[@]}" "$LH" bench goodput "$2" --depth "$depths" -t "$secs"
done
