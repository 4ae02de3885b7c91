#!/usr/bin/env bash
# The folder carrier against a direct loopback connection, in one run:
# seed 000's table (request/response of 1 B … 100 000 B) and bulk
# throughput, on tmpfs (inotify), through a bindfs FUSE mount (no
# notifications: polling) and on the local disk; then an idle session's
# CPU while polling. TLS inside the files, as users run it.
#
#   bash scripts/folder_bench.sh [N (rr round trips per size, 2000)] [T (tput seconds, 5)]
#
# Needs a release build (cargo build --release -p longhaul) and, for the
# FUSE row, bindfs and root.
set -euo pipefail
cd "$(dirname "$0")/.."
LH=${LH:-target/release/longhaul}
N=${1:-2000}
T=${2:-5}
SIZES=1,10,100,1000,10000,100000
work=$(mktemp -d /tmp/lh-folder-bench.XXXXXX)
pids=()
mounted=""
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "$mounted" ] && umount -l "$mounted" 2>/dev/null || true
  rm -rf "$work" /dev/shm/lh-folder-bench.$$
}
trap cleanup EXIT

"$LH" keygen --out "$work/server.key" >/dev/null
fp=$("$LH" fingerprint "$work/server.key")
"$LH" -q bench server --listen 127.0.0.1:5290 & pids+=($!)
sleep 0.3

cpu_of() { # utime+stime of a pid, in clock ticks
  awk '{print $14+$15}' "/proc/$1/stat"
}

# run_case NAME SERVER_DIR CLIENT_DIR
run_case() {
  local name=$1 sdir=$2 cdir=$3 port=$4
  "$LH" -q server --listen "dir://$sdir" --key "$work/server.key" --token benchtok \
    --allow 127.0.0.1:5290 & local s=$!
  pids+=($s)
  sleep 0.3
  LONGHAUL_TOKEN=benchtok "$LH" -q client "dir://$cdir" --pin "$fp" --known-hosts "$work/kh" \
    -L "$port:127.0.0.1:5290" & local c=$!
  pids+=($c)
  # Up when the forward accepts (the session's handshake runs first).
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
  echo "### $name"
  echo '```'
  "$LH" bench rr "127.0.0.1:$port" --sizes $SIZES -n "$N"
  "$LH" bench tput "127.0.0.1:$port" -t "$T" -O 1 | grep SUM
  echo '```'
  # An idle session: CPU of both ends (and of the FUSE daemon) over 10 s.
  sleep 2
  local c0 s0 f0=0 f1=0 fuse
  fuse=$(pgrep -n bindfs || true)
  c0=$(cpu_of $c); s0=$(cpu_of $s)
  [ -n "$fuse" ] && f0=$(cpu_of "$fuse")
  sleep 10
  [ -n "$fuse" ] && f1=$(cpu_of "$fuse")
  echo "idle 10 s: client $(( $(cpu_of $c) - c0 )) ticks, server $(( $(cpu_of $s) - s0 )) ticks, FUSE daemon $(( f1 - f0 )) ticks (100 ticks = 1 s of a core)"
  kill $c $s; wait $c $s 2>/dev/null || true
  echo
}

echo "### direct (loopback TCP)"
echo '```'
"$LH" bench rr 127.0.0.1:5290 --sizes $SIZES -n "$N"
"$LH" bench tput 127.0.0.1:5290 -t "$T" -O 1 | grep SUM
echo '```'
echo

shm=/dev/shm/lh-folder-bench.$$
mkdir -p "$shm"
run_case "folder on tmpfs (inotify)" "$shm" "$shm" 5291

disk="$work/disk"
mkdir -p "$disk"
run_case "folder on the local disk ($(stat -f -c %T "$work"), inotify)" "$disk" "$disk" 5292

if command -v bindfs >/dev/null && [ "$(id -u)" = 0 ]; then
  back="$work/back"; mnt="$work/mnt"
  mkdir -p "$back" "$mnt"
  bindfs "$back" "$mnt"; mounted=$mnt
  run_case "folder through bindfs (FUSE, client polls the mount)" "$back" "$mnt" 5293
  run_case "folder through bindfs, ?poll=on on both sides" "$back?poll=on" "$mnt?poll=on" 5294
fi
