#!/usr/bin/env bash
# The link layer's cost on loopback: one server, a client with it (the
# default) and one without (--no-reconnect: no resume offered), bench tput
# and bench rr through each, interleaved.
#   scripts/link_cost.sh [BIN] [ROUNDS]
cd "$(dirname "$0")/.."
B=${1:-target/release/longhaul}; R=${2:-3}
$B bench server --listen 127.0.0.1:5401 -q 2>/dev/null & BS=$!
$B server --listen tcp://127.0.0.1:7500 --insecure --allow 127.0.0.1:5401 -q 2>/dev/null & S=$!
sleep 0.3
$B client tcp://127.0.0.1:7500 --insecure -L 5402:127.0.0.1:5401 -q 2>/dev/null & C1=$!
$B client tcp://127.0.0.1:7500 --insecure --no-reconnect -L 5403:127.0.0.1:5401 -q 2>/dev/null & C2=$!
sleep 0.5
for i in $(seq $R); do
 for p in 5402 5403; do
  name=$([ $p = 5402 ] && echo "link on " || echo "link off")
  t=$($B bench tput 127.0.0.1:$p -t 3 -i 0 --json 2>/dev/null | python3 -c "import json,sys;j=json.load(sys.stdin);print('%.2f Gbit/s' % (j['bits_per_sec']/1e9))")
  r=$($B bench rr 127.0.0.1:$p --sizes 1 -n 5000 --json 2>/dev/null | python3 -c "import json,sys;x=json.load(sys.stdin)['rows'][0];print('%d/s p50 %.0f us p99 %.0f us' % (x['round_trips_per_sec'],x['p50_us'],x['p99_us']))")
  echo "$name tput $t | rr 1 B $r"
 done
done
kill $BS $S $C1 $C2
