#!/usr/bin/env bash
# JMUX interoperability with a real jetsocat (Devolutions), both roles:
#   1. jetsocat jmux-proxy is the server, `longhaul client --jmux -L` the client;
#   2. `longhaul server --jmux` is the server, jetsocat jmux-proxy the client.
# In each, 3 streams carry 32 MiB each way with a half-close in between, and
# every byte is checked with SHA-256 (scripts/jmux_load.py).
# Usage: scripts/interop-jetsocat.sh JETSOCAT_BIN [LONGHAUL_BIN]
# Build jetsocat with ../shared/peers/build-jetsocat.sh (not part of cargo test).
set -euo pipefail
JET=${1:?usage: $0 JETSOCAT_BIN [LONGHAUL_BIN]}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LH=${2:-$HERE/../target/release/longhaul}
[ -x "$LH" ] || { echo "no longhaul binary at $LH (cargo build --release)" >&2; exit 1; }
STREAMS=${STREAMS:-3}
SIZE=${SIZE:-$((32 << 20))}
LOGS=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_listen() { for _ in $(seq 100); do ss -Hltn "sport = :$1" | grep -q . && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

echo "jetsocat: $("$JET" --help | sed -n '/^Version:/{n;p}' | tr -d '\t')"
TPORT=$(port)
python3 "$HERE/jmux_load.py" target "$TPORT" & pids+=($!)
wait_listen "$TPORT"
status=0

echo "== role 1: jetsocat server, longhaul client"
JPORT=$(port); LPORT=$(port)
"$JET" jmux-proxy "tcp-listen://127.0.0.1:$JPORT" --allow-all --log-term --color never >"$LOGS/jet1.log" 2>&1 & pids+=($!)
wait_listen "$JPORT"
"$LH" client --jmux --insecure "tcp://127.0.0.1:$JPORT" -L "$LPORT:127.0.0.1:$TPORT" 2>"$LOGS/lh1.log" & pids+=($!)
wait_listen "$LPORT"
python3 "$HERE/jmux_load.py" load "$LPORT" "$STREAMS" "$SIZE" || status=1
drops=$(grep -c "exceeding the maximum size" "$LOGS/jet1.log" || true)
echo "jetsocat dropped $drops oversized packets"; [ "$drops" = 0 ] || status=1

echo "== role 2: longhaul server, jetsocat client"
SPORT=$(port); LPORT=$(port)
"$LH" server --jmux --insecure --listen "tcp://127.0.0.1:$SPORT" --allow "127.0.0.1:$TPORT" 2>"$LOGS/lh2.log" & pids+=($!)
wait_listen "$SPORT"
"$JET" jmux-proxy "tcp://127.0.0.1:$SPORT" "tcp-listen://127.0.0.1:$LPORT/127.0.0.1:$TPORT" --log-term --color never >"$LOGS/jet2.log" 2>&1 & pids+=($!)
wait_listen "$LPORT"
python3 "$HERE/jmux_load.py" load "$LPORT" "$STREAMS" "$SIZE" || status=1
if grep -q "closing session" "$LOGS/lh2.log"; then grep "closing session" "$LOGS/lh2.log"; status=1; fi

[ $status = 0 ] && echo "PASS: both roles intact" || { echo "FAIL (logs in $LOGS)"; }
exit $status
