#!/bin/bash
# Usage: build the previous commit and this one (release) as
# /work/longhaul-before and /work/longhaul-after, then run this script.
# Interleaved before/after: tcp:// and tls:// forwards on loopback.
set -u
B=/work/longhaul-after
BENCH=127.0.0.1:35201
$B bench server --listen $BENCH >/dev/null 2>&1 & BS=$!
cd /tmp/bb; [ -f s.key ] || $B keygen --out s.key >/dev/null
FP=$(cat s.key.pub | awk '{print $1}')
sleep 0.5
one() { # binary label scheme
  local bin=$1 label=$2 scheme=$3
  local extra=(); [ $scheme = tcp ] && extra=(--insecure)
  $bin server --listen $scheme://127.0.0.1:35300 --key s.key --allow $BENCH --insecure --control none >/dev/null 2>&1 & local S=$!
  sleep 0.4
  local cextra=(--insecure); [ $scheme = tls ] && cextra=(--pin "$FP")
  $bin client $scheme://127.0.0.1:35300 "${cextra[@]}" -L 35400:$BENCH --control none >/dev/null 2>&1 & local C=$!
  sleep 0.6
  local rr=$($B bench rr 127.0.0.1:35400 --sizes 1 -n 5000 --json 2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin)["rows"][0]; print("%.0f/s p50 %.0fus" % (r["round_trips_per_sec"], r["p50_us"]))' 2>/dev/null)
  local tp=$($B bench tput 127.0.0.1:35400 -t 3 --json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.2f Gbit/s" % (d["bits_per_sec"]/1e9))' 2>/dev/null)
  echo "$label $scheme rr: $rr tput: $tp"
  kill $C $S 2>/dev/null; wait $C $S 2>/dev/null
}
for round in 1 2 3; do
  one /work/longhaul-before before tcp
  one /work/longhaul-after after tcp
  one /work/longhaul-before before tls
  one /work/longhaul-after after tls
done
kill $BS
