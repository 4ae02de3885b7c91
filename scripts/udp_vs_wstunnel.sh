#!/usr/bin/env bash
# UDP on loopback, in one run: direct, through longhaul's `-L udp:` and
# through wstunnel's `-L udp://`, interleaved over ROUNDS rounds.
#   DNS: a real resolver (dnsmasq, started here on loopback with options of
#   its own) asked with one query in flight (scripts/dns_closed_loop.py) and
#   with 10 and 100 in flight (dnsperf, Debian's; p50/p99 from its -v
#   lines).
#   iperf3 -u -b RATE: loss and throughput (iperf3's TCP control channel
#   goes through a TCP forward on the same port).
# Usage: WSTUNNEL=/path/to/wstunnel [LONGHAUL=bin] [ROUNDS=3] [RATE=1G] \
#        scripts/udp_vs_wstunnel.sh
# Needs dnsmasq (dnsmasq-base), dnsperf, iperf3. Only loopback; every
# process it starts is killed by PID at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
LONGHAUL=${LONGHAUL:-$here/../target/release/longhaul}
WSTUNNEL=${WSTUNNEL:?set WSTUNNEL to a wstunnel binary}
ROUNDS=${ROUNDS:-3}
RATE=${RATE:-1G}
SECS=${SECS:-5}
DNS=15500 IPERF=15501 LH_CARRIER=15502 WS_CARRIER=15503
LH_DNS=15510 LH_IPERF=15511 WS_DNS=15520 WS_IPERF=15521
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
tmp=$(mktemp -d)

dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts \
  --listen-address=127.0.0.1 --bind-interfaces --address=/lh.test/198.18.0.7 \
  --port=$DNS --pid-file="$tmp/dnsmasq.pid" --cache-size=10000 & pids+=($!)
iperf3 -s -p $IPERF >/dev/null 2>&1 & pids+=($!)
"$LONGHAUL" server --listen tcp://127.0.0.1:$LH_CARRIER --insecure --control none -q \
  --allow udp:127.0.0.1:$DNS --allow udp:127.0.0.1:$IPERF --allow 127.0.0.1:$IPERF & pids+=($!)
"$WSTUNNEL" server ws://127.0.0.1:$WS_CARRIER >/dev/null 2>&1 & pids+=($!)
sleep 0.5
"$LONGHAUL" client tcp://127.0.0.1:$LH_CARRIER --insecure --control none -q \
  -L udp:$LH_DNS:127.0.0.1:$DNS -L udp:$LH_IPERF:127.0.0.1:$IPERF \
  -L $LH_IPERF:127.0.0.1:$IPERF & pids+=($!)
"$WSTUNNEL" client ws://127.0.0.1:$WS_CARRIER \
  -L "udp://$WS_DNS:127.0.0.1:$DNS?timeout_sec=0" -L "udp://$WS_IPERF:127.0.0.1:$IPERF?timeout_sec=0" \
  -L "tcp://$WS_IPERF:127.0.0.1:$IPERF" >/dev/null 2>&1 & pids+=($!)
sleep 1
for i in $(seq 1 1000); do echo "h$i.lh.test A"; done > "$tmp/q.txt"

# dnsperf with Q in flight: qps p50_us p99_us lost%
perf_q() {
  dnsperf -s 127.0.0.1 -p "$1" -d "$tmp/q.txt" -l "$SECS" -q "$2" -v 2>/dev/null |
    awk '/^> NOERROR/ {print $NF * 1e6 > "'"$tmp"'/lat"} /Queries per second/ {qps=$4} /Queries lost/ {lost=$4}
         END {printf "%s %s ", qps, lost}'
  sort -g "$tmp/lat" | awk '{a[NR]=$1} END {printf "%.0f %.0f\n", a[int(NR*0.5)], a[int(NR*0.99)]}'
}

printf "%-6s %-9s %-36s %-36s %-36s %s\n" round path "dns 1 in flight: qps p50 p99 lost" \
  "dns 10: qps lost p50 p99" "dns 100: qps lost p50 p99" "iperf3 -u $RATE: Mbit/s loss%"
for r in $(seq 1 "$ROUNDS"); do
  for path in direct longhaul wstunnel; do
    case $path in
      direct) d=$DNS i=$IPERF ;;
      longhaul) d=$LH_DNS i=$LH_IPERF ;;
      wstunnel) d=$WS_DNS i=$WS_IPERF ;;
    esac
    one=$(python3 "$here/dns_closed_loop.py" "$d" "$SECS")
    ten=$(perf_q "$d" 10)
    hundred=$(perf_q "$d" 100)
    ip=$(iperf3 -c 127.0.0.1 -p "$i" -u -b "$RATE" -t "$SECS" -J 2>/dev/null |
      python3 -c 'import json,sys; j=json.load(sys.stdin)["end"]["sum"]; print("%.0f %.2f" % (j["bits_per_second"]/1e6, j["lost_percent"]))' || echo "failed")
    printf "%-6s %-9s %-36s %-36s %-36s %s\n" "$r" "$path" "$one" "$ten" "$hundred" "$ip"
  done
done
