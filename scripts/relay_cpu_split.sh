#!/bin/bash
# User and system CPU per GB of each relay (client and server) during a
# 5 s iperf3 upload through `-L`, wstunnel then a longhaul build, on
# loopback (benchmark; docs/BENCHMARKS.md, issue 38's third part).
#   WSTUNNEL=/path/to/wstunnel scripts/relay_cpu_split.sh target/release/longhaul
# CLIENT_ARGS adds options to longhaul's client (e.g. --no-reconnect: no
# resume, so no link layer and no replay buffer).
# Only loopback ports below 32768; every process started here is killed
# by PID at the end.
set -u
W=${WSTUNNEL:?set WSTUNNEL to a wstunnel binary}
HZ=$(getconf CLK_TCK)
run() { # label C S port
  local l=$1 c=$2 s=$3 p=$4
  local u0=$(awk '{print $14}' /proc/$c/stat) s0=$(awk '{print $15}' /proc/$c/stat) u1=$(awk '{print $14}' /proc/$s/stat) s1=$(awk '{print $15}' /proc/$s/stat)
  local gb=$(iperf3 -c 127.0.0.1 -p $p -t 5 -J | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bytes"]/1e9)')
  local U0=$(awk '{print $14}' /proc/$c/stat) S0=$(awk '{print $15}' /proc/$c/stat) U1=$(awk '{print $14}' /proc/$s/stat) S1=$(awk '{print $15}' /proc/$s/stat)
  python3 -c "gb=$gb; print(f'$l: {gb:.1f} GB; client user {($U0-$u0)/$HZ/gb:.3f} sys {($S0-$s0)/$HZ/gb:.3f}; server user {($U1-$u1)/$HZ/gb:.3f} sys {($S1-$s1)/$HZ/gb:.3f} s/GB')"
}
iperf3 -s -p 25701 >/dev/null 2>&1 & IP=$!
$W server ws://127.0.0.1:25720 >/dev/null 2>&1 & S=$!; sleep 0.5
$W client -L tcp://25721:127.0.0.1:25701 ws://127.0.0.1:25720 >/dev/null 2>&1 & C=$!; sleep 1
run wstunnel $C $S 25721; kill $C $S; wait $C $S 2>/dev/null
B=${1:?a longhaul binary}
$B server --listen tcp://127.0.0.1:25710 --insecure --allow 127.0.0.1:25701 --control none >/dev/null 2>&1 & S=$!; sleep 0.5
$B client tcp://127.0.0.1:25710 --insecure ${CLIENT_ARGS:-} -L 25711:127.0.0.1:25701 --control none >/dev/null 2>&1 & C=$!; sleep 1
run longhaul $C $S 25711; kill $C $S; wait $C $S 2>/dev/null
kill $IP
