#!/usr/bin/env bash
# `longhaul cp` against scp and rsync -e ssh on one emulated path, one run,
# interleaved: upload of one file from namespace a to namespace b, each
# command timed whole (connection set-up included), files on tmpfs so the
# disk is not what is measured.
#
#   scripts/cp_bench.sh [DELAY each way (10ms)] [RATE (1gbit)] [SIZE (1g)] [STRIPES (1,4)] [ROUNDS (2)]
#
# Needs root, a release build, openssh-server and rsync (apt-get install
# openssh-server rsync).
set -euo pipefail
cd "$(dirname "$0")/.."
LH=${LH:-$PWD/target/release/longhaul}
delay=${1:-10ms}; rate=${2:-1gbit}; size=${3:-1g}; stripes=${4:-1,4}; rounds=${5:-2}
NAME=cpb
work=/dev/shm/lh-cp-bench
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  "$LH" -q netem --name $NAME down >/dev/null 2>&1 || true
  cat "$work/sshd.log" >&2 || true; rm -rf "$work"
}
trap cleanup EXIT
"$LH" -q netem --name $NAME down >/dev/null 2>&1 || true
"$LH" -q netem --name $NAME up --delay "$delay" --rate "$rate"
A=("$LH" -q netem --name $NAME exec a --)
B=("$LH" -q netem --name $NAME exec b --)
rm -rf "$work"; mkdir -p "$work/keys" "$work/dest" /run/sshd
k=$work/keys
"$LH" -q keygen --out "$k/s.key" >/dev/null
echo "$("$LH" -q keygen --out "$k/c.key") files=rw" > "$k/ak"
ssh-keygen -q -t ed25519 -N '' -f "$k/host" && ssh-keygen -q -t ed25519 -N '' -f "$k/id"
cp "$k/id.pub" "$k/ssh_ak"
cat > "$k/sshd_config" <<CFG
ListenAddress 198.18.0.2
Port 22
HostKey $k/host
AuthorizedKeysFile $k/ssh_ak
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PidFile $k/sshd.pid
Subsystem sftp /usr/lib/openssh/sftp-server
CFG
"${B[@]}" /usr/sbin/sshd -D -e -f "$k/sshd_config" 2>"$work/sshd.log" & pids+=($!)
"${B[@]}" "$LH" -q server --listen tls://198.18.0.2:7000 --key "$k/s.key" \
  --authorized-keys "$k/ak" --files "$work/dest" ${SRV_OPTS:-} & pids+=($!)
head -c "$(numfmt --from=iec "${size^^}")" /dev/urandom > "$work/src.bin"
bytes=$(stat -c %s "$work/src.bin")
sleep 1
OPTS="-i $k/id -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
pin=$(cut -d' ' -f1 "$k/s.key.pub")
run() { # NAME COMMAND…: times one upload, prints Mbit/s
  rm -rf "$work/dest/"* "$work/dest/".[!.]* 2>/dev/null || true
  local t0 t1 own
  t0=$(date +%s.%N); "${A[@]}" "$@" >"$work/out"; t1=$(date +%s.%N)
  cmp -s "$work/src.bin" "$work/dest/src.bin" || { echo "MISMATCH after $*" >&2; exit 1; }
  echo "$bytes $t0 $t1" | awk '{printf "%.0f", $1*8/($3-$2)/1e6}'
  # cp's own figure: from the session being up to the file verified.
  own=$(sed -n 's/.*"goodput_bps": \([0-9.]*\).*/\1/p' "$work/out")
  [ -z "$own" ] || echo "$own" | awk '{printf " (%.0f)", $1/1e6}'
}
echo "# netem: $delay each way, $rate; $size file, upload a → b; Mbit/s of the whole command (longhaul cp's own goodput, session up to file verified)"
# ONLY_LH=1 leaves scp and rsync out.
header="| round |"; [ -n "${ONLY_LH:-}" ] || header+=" scp | rsync -e ssh |"
for s in ${stripes//,/ }; do header+=" longhaul cp stripes=$s |"; done
echo "$header"
for r in $(seq "$rounds"); do
  line="| $r "
  if [ -z "${ONLY_LH:-}" ]; then
    line+="| $(run scp $OPTS -q "$work/src.bin" root@198.18.0.2:"$work/dest/") "
    line+="| $(run rsync -e "ssh $OPTS" "$work/src.bin" root@198.18.0.2:"$work/dest/") "
  fi
  for s in ${stripes//,/ }; do
    line+="| $(run "$LH" -q cp ${CP_OPTS:-} --json --key "$k/c.key" --pin "$pin" "$work/src.bin" "tls://198.18.0.2:7000?stripes=$s:/") "
  done
  echo "$line|"
done
