#!/usr/bin/env bash
# A voice-like UDP flow (64 kbit/s: 160-byte datagrams every 20 ms) beside a
# bulk TCP stream in the same session, over longhaul's WAN emulator; the
# voice flow's round trip measured by `longhaul bench udp` (the bench
# server sends each datagram back), alone and beside the bulk stream, on
# one carrier and on K lanes (?stripes=K); with QUIC=1 also over one
# quic:// carrier (the voice flow as QUIC datagrams).
#
#   scripts/voice_beside_bulk.sh [DELAY (50ms)] [LOSS (1%)] [CC (cubic)] [K...(1 4)]
#
# Env: ROUNDS (2), TIME (20), QUIC (0), LH. Needs root. Network only between the
# emulator's namespaces (198.18.0.0/15); every process started here is
# killed by PID and the emulator taken down at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
LH=${LH:-target/release/longhaul}
delay=${1:-50ms}; loss=${2:-1%}; cc=${3:-cubic}; shift $(( $# < 3 ? $# : 3 ))
ks=("$@"); [ ${#ks[@]} -gt 0 ] || ks=(1 4)
ROUNDS=${ROUNDS:-2}; TIME=${TIME:-20}; QUIC=${QUIC:-0}
work=$(mktemp -d)
"$LH" -q keygen --out "$work/s.key" >/dev/null 2>&1
pin=$("$LH" fingerprint "$work/s.key")
export LONGHAUL_TOKEN=voice
NAME=vb
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; "$LH" -q netem --name $NAME down >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
"$LH" -q netem --name $NAME down >/dev/null 2>&1 || true
up=(--delay "$delay"); [ "$loss" != 0 ] && up+=(--loss "$loss")
"$LH" -q netem --name $NAME up "${up[@]}"
A=("$LH" -q netem --name $NAME exec a --)
B=("$LH" -q netem --name $NAME exec b --)
SIP=198.18.0.2
"${B[@]}" "$LH" -q bench server --listen 127.0.0.1:5201 & pids+=($!)
"${B[@]}" "$LH" -q server --listen tcp://$SIP:7000 --insecure --control none --congestion "$cc" \
  --allow 127.0.0.1:5201 --allow udp:127.0.0.1:5201 --max-stripes 16 & pids+=($!)
"${B[@]}" "$LH" -q server --listen quic://$SIP:7001 --key "$work/s.key" --control none --congestion "$cc" \
  --allow 127.0.0.1:5201 --allow udp:127.0.0.1:5201 & pids+=($!)
sleep 1
for k in "${ks[@]}"; do
  "${A[@]}" "$LH" -q client "tcp://$SIP:7000?stripes=$k" --insecure --control none --congestion "$cc" \
    -L "127.0.0.1:$((6000 + k)):127.0.0.1:5201" -L "udp:127.0.0.1:$((6000 + k)):127.0.0.1:5201" & pids+=($!)
done
paths=(); for k in "${ks[@]}"; do paths+=("stripes=$k:$((6000 + k))"); done
if [ "$QUIC" = 1 ]; then
  "${A[@]}" "$LH" -q client "quic://$SIP:7001" --pin "$pin" --control none --congestion "$cc" \
    -L "127.0.0.1:6100:127.0.0.1:5201" -L "udp:127.0.0.1:6100:127.0.0.1:5201" & pids+=($!)
  paths+=("quic:6100")
fi
sleep 3
# The flow opens during the warm-up (not counted): beside bulk, the bulk
# starts 1 s into it, so what is measured is a call already up when a
# download starts, as in life (a flow opened beside bulk waits for its
# OPEN behind the bulk bytes, and its first datagrams with it).
voice() {
  "${A[@]}" "$LH" bench udp "127.0.0.1:$1" -b 64kbit -l 160 -t "$TIME" --warmup "$2" --json |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print("p50 %.1f ms  p99 %.1f ms  lost %.2f %%  jitter %.1f ms" % (j["rtt_p50_us"]/1e3, j["rtt_p99_us"]/1e3, j["lost_percent"], j["jitter_us"]/1e3))'
}
printf "%-6s %-12s %-8s %s\n" round path bulk "voice round trip"
for r in $(seq 1 "$ROUNDS"); do
  for p in "${paths[@]}"; do
    name=${p%:*}; port=${p##*:}
    printf "%-6s %-12s %-8s %s\n" "$r" "$name" alone "$(voice $port 1)"
    voice $port 4 > "$work/beside" & v=$!
    sleep 1
    "${A[@]}" "$LH" -q bench tput "127.0.0.1:$port" -t $((TIME + 4)) -i 0 > "$work/bulk" 2>&1 || true
    wait $v || true
    printf "%-6s %-12s %-8s %s  bulk %s\n" "$r" "$name" beside "$(cat "$work/beside")" \
      "$(awk '/SUM/ {print $6, $7}' "$work/bulk")"
  done
done
