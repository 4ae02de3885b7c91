#!/bin/bash
# Loopback, one run, interleaved: longhaul builds (LABEL=BINARY ...) against
# wstunnel and a direct connection. Per relay and round:
#   * iperf3 (Debian's) 1 stream, 5 s, -O 1, through the relay's -L port;
#   * CPU = utime + stime of both relay processes during that iperf3 run,
#     per GB the iperf3 receiver counted;
#   * `longhaul bench rr --sizes 1`: 1-byte request/response p50 and rate
#     (the same client and bench server for every relay);
#   * with PERF=1, syscalls and context switches of both relays per MB
#     during the iperf3 run (`perf stat`).
# Usage: WSTUNNEL=/path/to/wstunnel scripts/loopback_vs_wstunnel.sh \
#            before=/work/longhaul-before after=/work/longhaul-after
# Build wstunnel from its source (erebe/wstunnel, `cargo build --release -p
# wstunnel-cli`). Only loopback ports; every process started here is
# killed by PID at the end.
set -u
WSTUNNEL=${WSTUNNEL:?set WSTUNNEL to a wstunnel binary}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
RR_N=${RR_N:-5000}
TOOL=${1#*=}   # the first longhaul binary runs the bench server and client
IPERF_PORT=25501
BENCH_PORT=25502
WORK=$(mktemp -d)
PIDS=()
cleanup() { kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

iperf3 -s -p $IPERF_PORT >/dev/null 2>&1 & PIDS+=($!)
"$TOOL" bench server --listen 127.0.0.1:$BENCH_PORT >/dev/null 2>&1 & PIDS+=($!)
sleep 0.5

ticks() { # pid -> utime+stime in clock ticks
  awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0
}

# shellcheck source=scripts/loopback.sh
. "$(dirname "$0")/loopback.sh"

# measure LABEL PORT_IPERF PORT_RR [relay pids...]
measure() {
  local label=$1 tp=$2 rp=$3
  shift 3
  local before=0 after=0 p
  for p in "$@"; do before=$((before + $(ticks "$p"))); done
  local json perfpid=""
  if [ -n "${PERF:-}" ] && [ $# -gt 0 ]; then
    perf stat -x, -e raw_syscalls:sys_enter,context-switches -p "$(IFS=,; echo "$*")" \
      -o "$WORK/perf" -- sleep $((SECS + 1)) 2>/dev/null &
    perfpid=$!
  fi
  json=$(iperf3 -c 127.0.0.1 -p "$tp" -t "$SECS" -O 1 -J 2>/dev/null)
  for p in "$@"; do after=$((after + $(ticks "$p"))); done
  local sys=0 cs=0
  if [ -n "$perfpid" ]; then
    wait "$perfpid"
    sys=$(awk -F, '/raw_syscalls/ {print $1}' "$WORK/perf")
    cs=$(awk -F, '/context-switches/ {print $1}' "$WORK/perf")
  fi
  local hz
  hz=$(getconf CLK_TCK)
  local rr
  rr=$("$TOOL" bench rr 127.0.0.1:"$rp" --sizes 1 -n "$RR_N" --json 2>/dev/null)
  python3 - "$label" "$((after - before))" "$hz" "$json" "$rr" "${sys:-0}" "${cs:-0}" <<'EOF'
import json, sys
label, ticks, hz, ip, rr = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
def num(x):
    try:
        return float(x)
    except ValueError:
        return 0.0
sysc, cs = num(sys.argv[6]), num(sys.argv[7])
try:
    end = json.loads(ip)["end"]["sum_received"]
    gbit, gb = end["bits_per_second"] / 1e9, end["bytes"] / 1e9
except Exception:
    gbit, gb = 0.0, 0.0
try:
    row = json.loads(rr)["rows"][0]
    p50, rate = row["p50_us"], row["round_trips_per_sec"]
except Exception:
    p50, rate = float("nan"), 0.0
cpu = (ticks / hz / gb) if gb > 0 and ticks > 0 else float("nan")
extra = ""
if sysc and gb:
    # perf counts a little longer than iperf3 sends: an upper bound.
    extra = f"  syscalls {sysc / (gb * 1000):5.1f}/MB  cs {cs / (gb * 1000):5.2f}/MB"
print(f"{label:<10} {gbit:6.2f} Gbit/s  cpu {cpu:6.3f} s/GB  rr p50 {p50:6.1f} us  {rate:7.0f}/s{extra}")
EOF
}

direct() {
  measure direct $IPERF_PORT $BENCH_PORT
}

longhaul() { # label binary
  local label=$1 bin=$2
  $bin server --listen tcp://127.0.0.1:25510 --insecure --allow 127.0.0.1:$IPERF_PORT \
    --allow 127.0.0.1:$BENCH_PORT --control none >/dev/null 2>&1 &
  local s=$!
  wait_port 25510 || return
  $bin client tcp://127.0.0.1:25510 --insecure -L 25511:127.0.0.1:$IPERF_PORT \
    -L 25512:127.0.0.1:$BENCH_PORT --control none >/dev/null 2>&1 &
  local c=$!
  wait_port 25511 && wait_port 25512 && measure "$label" 25511 25512 $c $s
  kill $c $s 2>/dev/null
  wait $c $s 2>/dev/null
}

wstunnel() {
  $WSTUNNEL server ws://127.0.0.1:25520 >/dev/null 2>&1 &
  local s=$!
  wait_port 25520 || return
  $WSTUNNEL client -L tcp://25521:127.0.0.1:$IPERF_PORT -L tcp://25522:127.0.0.1:$BENCH_PORT \
    ws://127.0.0.1:25520 >/dev/null 2>&1 &
  local c=$!
  wait_port 25521 && wait_port 25522 && measure wstunnel 25521 25522 $c $s
  kill $c $s 2>/dev/null
  wait $c $s 2>/dev/null
}

echo "loopback, iperf3 1 stream ${SECS}s, rr 1 B x $RR_N; $(nproc) cores; $(uname -r)"
for round in $(seq "$ROUNDS"); do
  echo "-- round $round"
  direct
  wstunnel
  for arg in "$@"; do
    longhaul "${arg%%=*}" "${arg#*=}"
  done
done
