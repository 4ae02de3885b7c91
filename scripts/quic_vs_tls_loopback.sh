#!/bin/bash
# quic:// against tls:// on loopback: throughput and CPU per GB of both ends.
LH=${LH:-/work/main/target/release/longhaul}
DIR=$(mktemp -d); cd "$DIR"; $LH keygen --out s.key > /dev/null 2>&1
export LONGHAUL_TOKEN=t
$LH bench server --listen 127.0.0.1:15301 > /dev/null 2>&1 & BS=$!
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
for round in 1 2; do
for scheme in tls quic; do
  port=$((17100 + round*10 + (scheme == "quic")))
  [ $scheme = quic ] && port=$((port+1))
  $LH server --listen $scheme://127.0.0.1:$port --key s.key --allow 127.0.0.1:15301 -q > /dev/null 2>&1 & S=$!
  sleep 0.3
  lport=$((15310 + round*10 + ($scheme == "quic")))
  [ $scheme = quic ] && lport=$((lport+1))
  $LH client $scheme://127.0.0.1:$port --pin "$($LH fingerprint s.key)" -L $lport:127.0.0.1:15301 -q > /dev/null 2>&1 & C=$!
  sleep 1
  s0=$(cpu $S); c0=$(cpu $C)
  out=$($LH bench tput 127.0.0.1:$lport -t ${SECS:-5} -P ${STREAMS:-1} 2>&1 | grep SUM)
  s1=$(cpu $S); c1=$(cpu $C)
  mb=$(echo "$out" | awk '{print $4}')
  rate=$(echo "$out" | awk '{print $6, $7}')
  echo "$scheme round $round: $rate  $mb MB  server cpu $(( (s1-s0) )) ticks, client $(( (c1-c0) )) ticks  -> cpu s/GB $(python3 -c "print(round(((($s1-$s0)+($c1-$c0))/100)/($mb/1000),2))")"
  kill $C $S; wait $C $S 2>/dev/null
done
done
kill $BS
