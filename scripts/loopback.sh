# What the loopback shell scripts share (sourced, not run): waiting for a
# listener. The Python scripts share theirs in loopback.py.

# wait_port PORT: returns once something listens on 127.0.0.1:PORT (10 s).
wait_port() {
  for _ in $(seq 200); do
    ss -Hltn "sport = :$1" | grep -q . && return 0
    sleep 0.05
  done
  echo "port $1 never opened" >&2
  return 1
}
