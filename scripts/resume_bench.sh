#!/usr/bin/env bash
# Carrier resets during a transfer, through a real longhaul client and server.
#
#   scripts/resume_bench.sh loopback [tcp|tls] [SECONDS] [RESET_EVERY]
#   scripts/resume_bench.sh wan      [tcp|tls] [SECONDS] [RESET_EVERY]   (root: netem, 100 ms RTT)
#
# A sender pushes a pseudo-random stream through an -L forward to a receiver
# for SECONDS; every RESET_EVERY seconds (0: never) the carrier's socket is
# killed with `ss -K` (a reset on both ends). Prints, as JSON: whether every
# byte arrived exactly once (SHA-256 and count), how long delivery stopped
# after each reset, and the goodput.
set -euo pipefail
cd "$(dirname "$0")/.."
where=${1:-loopback}; kind=${2:-tcp}; secs=${3:-20}; every=${4:-5}
B=${LONGHAUL:-target/release/longhaul}
PY="python3 scripts/resume_bench.py"
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; if [ "$where" = wan ]; then $B netem --name rb down >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT
if [ "$where" = wan ]; then
  $B netem --name rb down >/dev/null 2>&1 || true
  $B netem --name rb up --delay 50ms -q &
  pids+=($!)
  sleep 2
  A="$B netem --name rb exec a --"; BB="$B netem --name rb exec b --"; SIP=198.18.0.2
else
  A=""; BB=""; SIP=127.0.0.1
fi
SPORT=7600; TPORT=7601; LPORT=7602
opts=(--insecure)
copts=(--insecure)
scheme=tcp
if [ "$kind" = tls ]; then
  $B keygen --out "$tmp/s.key" >/dev/null
  $B keygen --out "$tmp/c.key" > "$tmp/ak"
  opts=(--key "$tmp/s.key" --authorized-keys "$tmp/ak")
  copts=(--key "$tmp/c.key" --pin "$(cut -d' ' -f1 "$tmp/s.key.pub")")
  scheme=tls
fi
$BB $PY receive $TPORT "$tmp/recv.json" & pids+=($!)
$BB $B server --listen $scheme://$SIP:$SPORT "${opts[@]}" --allow $SIP:$TPORT -q 2>"$tmp/server.log" & pids+=($!)
sleep 0.5
$A $B client $scheme://$SIP:$SPORT "${copts[@]}" -L $LPORT:$SIP:$TPORT 2>"$tmp/client.log" & pids+=($!)
sleep 1
$A $PY send 127.0.0.1:$LPORT "$secs" "$every" $SPORT "$tmp/send.json"
sleep 0.5
$PY report "$tmp/send.json" "$tmp/recv.json"
grep -E "resumed|refused|lost" "$tmp/client.log" | sed 's/\x1b\[[0-9;]*m//g' | tail -4 >&2 || true
