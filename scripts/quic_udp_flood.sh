#!/usr/bin/env bash
# A bulk stream over quic:// alone, then beside a UDP flood through the
# same session's `-L udp:` forward (twice the path's rate): the share the
# stream keeps (docs/BENCHMARKS.md, "A UDP flood beside a stream").
#
#   scripts/quic_udp_flood.sh [DELAY (10ms)] [RATE (100mbit)] [FLOOD (200mbit)]
#
# Env: SIZE (1000: bytes per flood datagram), LH. Needs root. Network only between the emulator's namespaces
# (198.18.0.0/15); every process started here is killed by PID and the
# emulator taken down at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
LH=${LH:-target/release/longhaul}
delay=${1:-10ms}; rate=${2:-100mbit}; flood=${3:-200mbit}
NAME=fl; SIP=198.18.0.2
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; "$LH" -q netem --name $NAME down >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
"$LH" -q keygen --out "$work/s.key" >/dev/null 2>&1
pin=$("$LH" fingerprint "$work/s.key")
export LONGHAUL_TOKEN=flood
"$LH" -q netem --name $NAME down >/dev/null 2>&1 || true
"$LH" -q netem --name $NAME up --delay "$delay" --rate "$rate"
A=("$LH" -q netem --name $NAME exec a --); B=("$LH" -q netem --name $NAME exec b --)
"${B[@]}" "$LH" -q bench server --listen 127.0.0.1:5201 & pids+=($!)
"${B[@]}" "$LH" -q server --listen quic://$SIP:7001 --key "$work/s.key" --control none --congestion bbr \
  --allow 127.0.0.1:5201 --allow udp:127.0.0.1:5201 & pids+=($!)
sleep 1
"${A[@]}" "$LH" -q client quic://$SIP:7001 --pin "$pin" --control "$work/c.sock" --congestion bbr \
  -L 127.0.0.1:6100:127.0.0.1:5201 -L udp:127.0.0.1:6100:127.0.0.1:5201 & pids+=($!)
sleep 2
echo "bulk alone: $("${A[@]}" "$LH" -q bench tput 127.0.0.1:6100 -t 8 -i 0 2>&1 | awk '/SUM/ {print $6, $7}')"
"${A[@]}" "$LH" bench udp 127.0.0.1:6100 -b "$flood" -l "${SIZE:-1000}" -t 10 --json > "$work/udp" & u=$!
sleep 1
echo "bulk beside a $flood UDP flood: $("${A[@]}" "$LH" -q bench tput 127.0.0.1:6100 -t 8 -i 0 2>&1 | awk '/SUM/ {print $6, $7}')"
wait $u
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("flood: back %.1f Mbit/s, lost %.1f %%" % (j["received_mbit_s"], j["lost_percent"]))' "$work/udp"
"${A[@]}" "$LH" status --json "$work/c.sock" |
  python3 -c 'import json,sys; print("session datagrams:", json.load(sys.stdin)[0]["sessions"][0]["datagrams"])'
