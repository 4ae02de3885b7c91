"""What the loopback benchmark scripts share: ports, processes, memory.

Imported by fleet_bench.py, many_sessions.py, session_memory.py and
stream_memory.py (same folder)."""
import socket
import time

# Every process a script starts, killed by PID at its end (kill_all).
PROCS = []


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, secs=20):
    t = time.time()
    while time.time() - t < secs:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"port {port} never opened")


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def kill_all():
    """Kills every process in PROCS (only those), then reaps them."""
    for p in PROCS:
        try:
            p.kill()
        except OSError:
            pass
    for p in PROCS:
        try:
            p.wait(timeout=5)
        except Exception:
            pass
