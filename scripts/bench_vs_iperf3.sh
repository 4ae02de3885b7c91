#!/usr/bin/env bash
# Does `longhaul bench tput` agree with iperf3 on the same direct path?
# Runs both (bench tput with its default iperf3-like sender and with
# --sender fill), alternately, through longhaul's WAN emulator at the given
# one-way delays, ROUNDS times each, same duration and warm-up (-O).
# Usage: scripts/bench_vs_iperf3.sh [DELAYS (default "0ms 50ms")] ; needs root and iperf3.
# Env: ROUNDS (3), TIME (12), OMIT (3), LH (target/release/longhaul).
set -euo pipefail
cd "$(dirname "$0")/.."
LH=${LH:-target/release/longhaul}
ROUNDS=${ROUNDS:-3}; TIME=${TIME:-12}; OMIT=${OMIT:-3}
NAME=bvi
command -v iperf3 >/dev/null || { echo "iperf3 is not installed (apt-get install iperf3)" >&2; exit 1; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; "$LH" -q netem --name $NAME down >/dev/null 2>&1 || true; }
trap cleanup EXIT
for delay in ${1:-0ms 50ms}; do
  "$LH" -q netem --name $NAME down >/dev/null 2>&1 || true
  "$LH" -q netem --name $NAME up --delay "$delay"
  "$LH" -q netem --name $NAME exec b -- iperf3 -s -B 198.18.0.2 -p 5202 >/dev/null 2>&1 & pids+=($!)
  "$LH" -q netem --name $NAME exec b -- "$LH" -q bench server --listen 198.18.0.2:5201 >/dev/null 2>&1 & pids+=($!)
  sleep 1
  for i in $(seq "$ROUNDS"); do
    ip=$("$LH" -q netem --name $NAME exec a -- iperf3 -c 198.18.0.2 -p 5202 -t "$TIME" -O "$OMIT" -J |
      python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["end"]["sum_received"]["bits_per_second"]/1e6)')
    lh=$("$LH" -q netem --name $NAME exec a -- "$LH" -q bench tput 198.18.0.2:5201 -t "$TIME" -O "$OMIT" -i 0 --json |
      python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["bits_per_sec"]/1e6)')
    fill=$("$LH" -q netem --name $NAME exec a -- "$LH" -q bench tput 198.18.0.2:5201 -t "$TIME" -O "$OMIT" -i 0 --sender fill --json |
      python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["bits_per_sec"]/1e6)')
    python3 -c "print(f'delay $delay each way, round $i: iperf3 {float(\"$ip\"):.1f} Mbit/s, bench tput {float(\"$lh\"):.1f} Mbit/s (ratio {float(\"$lh\")/float(\"$ip\"):.3f}), bench tput --sender fill {float(\"$fill\"):.1f} Mbit/s (ratio {float(\"$fill\")/float(\"$ip\"):.3f})')"
  done
  "$LH" -q netem --name $NAME status | grep -iE "late|worst" || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; pids=()
done
