#!/bin/bash
# The CPU work of a 1-byte round trip through one -L forward, measured two
# repeatable ways (two-core rr latency is dominated by cross-core wake-ups):
#
#   scripts/rr_cost.sh count RELAY BIN   user-space instructions per round
#       trip in one relay (RELAY: client | server), from callgrind switched
#       on for N round trips after 300 to warm up;
#   scripts/rr_cost.sh pinned BIN...     every process on one core
#       (taskset -c 0), ROUNDS interleaved rounds of RUNS `bench rr` p50s.
#
# BIN is a longhaul binary or "ws" (wstunnel, from WSTUNNEL). The bench
# server and client are always LONGHAUL (default: the first longhaul BIN
# given, or target/release/longhaul). Loopback ports only; every process
# started here is killed by PID at the end.
set -u
MODE=${1:?count or pinned}
shift
if [ "$MODE" = pinned ] && [ -z "${RR_COST_PINNED:-}" ]; then
  # Everything this script starts inherits the one core.
  RR_COST_PINNED=1 exec taskset -c 0 "$0" pinned "$@"
fi
WSTUNNEL=${WSTUNNEL:-wstunnel}
N=${N:-3000}
ROUNDS=${ROUNDS:-3}
RUNS=${RUNS:-6}
WORK=$(mktemp -d)
PIDS=()
cleanup() { kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

# shellcheck source=scripts/loopback.sh
. "$(dirname "$0")/loopback.sh"

# start BIN [client-wrapper] [server-wrapper]: relays for -L 35531 -> bench server
start() {
  local bin=$1 cw=${2:-} sw=${3:-}
  if [ "$bin" = ws ]; then
    $sw "$WSTUNNEL" server ws://127.0.0.1:35530 >/dev/null 2>&1 & S=$!
    wait_port 35530
    $cw "$WSTUNNEL" client -L tcp://35531:127.0.0.1:35532 ws://127.0.0.1:35530 >/dev/null 2>&1 & C=$!
  else
    $sw "$bin" server --listen tcp://127.0.0.1:35530 --insecure --allow 127.0.0.1:35532 \
      --control none >/dev/null 2>&1 & S=$!
    wait_port 35530
    $cw "$bin" client tcp://127.0.0.1:35530 --insecure -L 35531:127.0.0.1:35532 \
      --control none >/dev/null 2>&1 & C=$!
  fi
  PIDS+=("$S" "$C")
  wait_port 35531
}

stop() { kill "$C" "$S" 2>/dev/null; wait "$C" "$S" 2>/dev/null; }

p50() { # rr p50 in µs of N round trips
  "$LONGHAUL" bench rr 127.0.0.1:35531 --sizes 1 -n "$1" --json 2>/dev/null |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["rows"][0]["p50_us"]))'
}

first=""
bins=("$@")
[ "$MODE" = count ] && bins=("${@:2}")
for b in "${bins[@]}"; do [ "$b" != ws ] && [ -z "$first" ] && first=$b; done
LONGHAUL=${LONGHAUL:-${first:-target/release/longhaul}}
"$LONGHAUL" bench server --listen 127.0.0.1:35532 >/dev/null 2>&1 & PIDS+=($!)
wait_port 35532 || exit 1

case $MODE in
count)
  relay=${1:?client or server}
  bin=${2:?binary}
  vg="valgrind --tool=callgrind --instr-atstart=no --dump-instr=no --callgrind-out-file=$WORK/cg.%p"
  if [ "$relay" = server ]; then start "$bin" "" "$vg"; else start "$bin" "$vg" ""; fi
  sleep 2
  p50 300 >/dev/null
  callgrind_control -i on >/dev/null 2>&1
  p50 "$N" >/dev/null
  callgrind_control -d >/dev/null 2>&1
  callgrind_control -i off >/dev/null 2>&1
  stop
  total=$(cat "$WORK"/cg.*.1 2>/dev/null | awk '/^summary:|^totals:/ {print $2; exit}')
  echo "$bin $relay relay: $total instructions for $N round trips, $((total / N)) per round trip"
  ;;
pinned)
  for round in $(seq "$ROUNDS"); do
    for bin in "$@"; do
      start "$bin"
      line=""
      for _ in $(seq "$RUNS"); do line="$line $(p50 "$N")"; done
      echo "round $round  $bin:$line"
      stop
    done
  done
  ;;
*) echo "usage: $0 count client|server BIN | pinned BIN..." >&2; exit 2 ;;
esac
