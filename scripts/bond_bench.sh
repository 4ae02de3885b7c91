#!/usr/bin/env bash
# Bonding two emulated links with a striped session, against each link
# alone and MPTCP over both, one run, iperf3 as the load.
#
#   scripts/bond_bench.sh [LINK1 DELAY] [LINK1 RATE] [LINK2 DELAY,RATE[,LOSS]] [K]
#   e.g. scripts/bond_bench.sh 10ms 500mbit 30ms,200mbit 4
#
# Link 1 joins 198.18.0.1 and 198.18.0.2; link 2 carries what side a sends
# from 198.18.1.1. The client's lanes leave from both addresses in turn
# (`?stripes=K&via=198.18.0.1,198.18.1.1`). Needs root, iperf3, mptcpize.
# Env: ROUNDS (2), TIME (10), OMIT (3), CC (cubic), LH.
set -euo pipefail
cd "$(dirname "$0")/.."
LH=${LH:-target/release/longhaul}
d1=${1:-10ms}; r1=${2:-500mbit}; l2=${3:-30ms,200mbit}; k=${4:-4}
ROUNDS=${ROUNDS:-2}; TIME=${TIME:-10}; OMIT=${OMIT:-3}; CC=${CC:-cubic}
NAME=bond
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; "$LH" -q netem --name $NAME down >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$LH" -q netem --name $NAME down >/dev/null 2>&1 || true
"$LH" -q netem --name $NAME up --delay "$d1" --rate "$r1" --link2 "$l2"
A=("$LH" -q netem --name $NAME exec a --)
B=("$LH" -q netem --name $NAME exec b --)
"${B[@]}" iperf3 -s -p 5202 >/dev/null 2>&1 & pids+=($!)
"${B[@]}" "$LH" -q server --listen tcp://0.0.0.0:7000 --insecure --allow 127.0.0.1:5202 --congestion "$CC" 2>/dev/null & pids+=($!)
mptcp=0
if command -v mptcpize >/dev/null; then
  mptcp=1
  "${A[@]}" ip mptcp limits set subflows 2 add_addr_accepted 2
  "${B[@]}" ip mptcp limits set subflows 2 add_addr_accepted 2
  "${A[@]}" ip mptcp endpoint add 198.18.1.1 dev lh1 subflow
  "${B[@]}" mptcpize run iperf3 -s -p 5203 >/dev/null 2>&1 & pids+=($!)
fi
sleep 1
"${A[@]}" "$LH" -q client "tcp://198.18.0.2:7000?stripes=$k&via=198.18.0.1,198.18.1.1" --insecure \
  --congestion "$CC" -L "127.0.0.1:6000:127.0.0.1:5202" 2>/dev/null & pids+=($!)
sleep 3
mbit() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["end"]["sum_received"]["bits_per_second"]/1e6,1))' 2>/dev/null || echo nan; }
ip3() { "${A[@]}" "$@" -t "$TIME" -O "$OMIT" -C "$CC" -J | mbit; sleep 1; }
echo "link 1: $d1 one way, $r1; link 2: $l2; $CC; $TIME s (+$OMIT s warm-up); K=$k lanes"
for r in $(seq "$ROUNDS"); do
  one=$(ip3 iperf3 -c 198.18.0.2 -p 5202)
  two=$(ip3 iperf3 -c 198.18.0.2 -B 198.18.1.1 -p 5202)
  line="round $r: link 1 alone $one | link 2 alone $two"
  if [ $mptcp = 1 ]; then line+=" | MPTCP over both $(ip3 mptcpize run iperf3 -c 198.18.0.2 -p 5203)"; fi
  s=$(ip3 iperf3 -c 127.0.0.1 -p 6000)
  line+=" | longhaul K=$k over both $s ($(python3 -c "print(f'{$s/($one+$two):.3f}')")× the sum)"
  echo "$line Mbit/s"
done
