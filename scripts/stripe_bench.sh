#!/usr/bin/env bash
# Striped carriers against one carrier and a direct TCP connection, one run,
# through longhaul's WAN emulator, with iperf3 as the load everywhere.
#
#   scripts/stripe_bench.sh [DELAY] [LOSS] [RATE|-] [CC] [K...]
#   e.g. scripts/stripe_bench.sh 50ms 1% - cubic 1 2 4 8
#        scripts/stripe_bench.sh 50ms 0 1gbit cubic 1 4
#        scripts/stripe_bench.sh loopback 0 - cubic 1 4      (no emulator)
#
# One-way DELAY (RTT = 2×), random LOSS each way, optional RATE cap, the
# congestion control CC on every TCP connection (iperf3's direct one and the
# carriers; the application's own connections to the tunnel are on
# loopback). For each K a client with ?stripes=K forwards a port to the
# iperf3 server; K=1 is one carrier. ROUNDS rounds, interleaved: direct,
# then each K. Prints Mbit/s and ratios; needs root and iperf3.
# Env: ROUNDS (3), TIME (15), OMIT (3), P (1: iperf3 -P), LH, MPTCP (1: also
# direct MPTCP with 4 subflows, via mptcpize), CARRIER (tcp, or tls: pinned
# keys made for the run).
set -euo pipefail
cd "$(dirname "$0")/.."
LH=${LH:-target/release/longhaul}
delay=${1:-50ms}; loss=${2:-1%}; rate=${3:--}; cc=${4:-cubic}; shift $(( $# < 4 ? $# : 4 ))
ks=("$@"); [ ${#ks[@]} -gt 0 ] || ks=(1 2 4 8)
ROUNDS=${ROUNDS:-3}; TIME=${TIME:-15}; OMIT=${OMIT:-3}; P=${P:-1}
NAME=sb
command -v iperf3 >/dev/null || { echo "iperf3 is not installed (apt-get install iperf3)" >&2; exit 1; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; "$LH" -q netem --name $NAME down >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$LH" -q netem --name $NAME down >/dev/null 2>&1 || true
if [ "$delay" = loopback ]; then
  A=(env); B=(env); SIP=127.0.0.1
else
  up=(--delay "$delay")
  [ "$loss" != 0 ] && up+=(--loss "$loss")
  [ "$rate" != - ] && up+=(--rate "$rate")
  "$LH" -q netem --name $NAME up "${up[@]}"
  A=("$LH" -q netem --name $NAME exec a --)
  B=("$LH" -q netem --name $NAME exec b --)
  SIP=198.18.0.2
fi
scheme=tcp; sopts=(--insecure); copts=(--insecure)
if [ "${CARRIER:-tcp}" = tls ]; then
  keys=$(mktemp -d)
  "$LH" -q keygen --out "$keys/s.key" >/dev/null
  "$LH" -q keygen --out "$keys/c.key" > "$keys/ak"
  scheme=tls; sopts=(--key "$keys/s.key" --authorized-keys "$keys/ak")
  copts=(--key "$keys/c.key" --pin "$(cut -d' ' -f1 "$keys/s.key.pub")")
fi
"${B[@]}" iperf3 -s -p 5202 >/dev/null 2>&1 & pids+=($!)
"${B[@]}" "$LH" -q server --listen $scheme://$SIP:7000 "${sopts[@]}" --allow 127.0.0.1:5202 \
  --congestion "$cc" --max-stripes 16 2>/tmp/stripe_bench_server.log & pids+=($!)
sleep 1
for k in "${ks[@]}"; do
  "${A[@]}" "$LH" -q client "$scheme://$SIP:7000?stripes=$k" "${copts[@]}" --congestion "$cc" \
    -L "127.0.0.1:$((6000 + k)):127.0.0.1:5202" 2>"/tmp/stripe_bench_client$k.log" & pids+=($!)
done
sleep 3
mbit() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["end"]["sum_received"]["bits_per_second"]/1e6,1))' 2>/dev/null; }
# iperf3 fails now and then (its control connection over a lossy path):
# try again, up to three times.
run() {
  local v
  for _ in 1 2 3; do
    if v=$("${A[@]}" iperf3 -c "$1" -p "$2" -t "$TIME" -O "$OMIT" -P "$P" -C "$cc" -J | mbit) && [ -n "$v" ]; then
      echo "$v"; return
    fi
    sleep 1
  done
  echo nan
}
if [ "${MPTCP:-0}" = 1 ]; then
  command -v mptcpize >/dev/null || { echo "MPTCP=1 needs mptcpize (apt-get install mptcpd)" >&2; exit 1; }
  # Four subflows: three more client addresses, each an endpoint.
  for i in 11 12 13; do "${A[@]}" ip addr add 198.18.0.$i/24 dev lh0 2>/dev/null || true; done
  "${A[@]}" ip mptcp limits set subflows 4 add_addr_accepted 4
  "${B[@]}" ip mptcp limits set subflows 4 add_addr_accepted 4
  for i in 11 12 13; do "${A[@]}" ip mptcp endpoint add 198.18.0.$i dev lh0 subflow 2>/dev/null || true; done
  "${B[@]}" mptcpize run iperf3 -s -p 5203 >/dev/null 2>&1 & pids+=($!)
  sleep 1
fi
echo "${CARRIER:-tcp} carriers, one-way delay $delay, loss $loss, rate $rate, $cc, iperf3 -P $P, $TIME s (+$OMIT s warm-up), $ROUNDS rounds"
for r in $(seq "$ROUNDS"); do
  d=$(run $SIP 5202)
  line="round $r: direct $d"
  if [ "${MPTCP:-0}" = 1 ]; then
    m=$("${A[@]}" mptcpize run iperf3 -c 198.18.0.2 -p 5203 -t "$TIME" -O "$OMIT" -P "$P" -C "$cc" -J | mbit)
    line+=" | mptcp(4 subflows) $m"
  fi
  one=""
  for k in "${ks[@]}"; do
    v=$(run 127.0.0.1 $((6000 + k)))
    [ "$k" = 1 ] && one=$v
    line+=" | K=$k $v ($(python3 -c "print(f'{$v/$d:.2f}')")× direct"
    [ -n "$one" ] && [ "$k" != 1 ] && line+=", $(python3 -c "print(f'{$v/$one:.2f}')")× one carrier"
    line+=")"
  done
  echo "$line Mbit/s"
done
[ "$delay" = loopback ] || "$LH" -q netem --name $NAME status | grep -iE "late|worst|lost" || true
