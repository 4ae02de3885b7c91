#!/usr/bin/env python3
"""Many idle tunnels at one server, longhaul against wstunnel, one run.

longhaul: `longhaul bench sessions` opens N sessions (TLS, each its own
carrier, hello and attach) from one process, each with one stream held
open to a target that accepts and waits. wstunnel: N connections through
one wstunnel client's -L (one WebSocket over TLS to the server each), to
the same kind of target; both 16 at a time (a longhaul server keeps at
most 32 handshakes in flight per source address). For each, from outside: the server's RSS and
open descriptors before and with all N up, the rate they came up at, and
the server's CPU while all N sit idle for IDLE seconds (keepalives).

  many_sessions.py N [--wstunnel PATH] [--idle SECS] [--lh PATH] [--dead-after DUR]

Only loopback ports; every process started here is killed by PID at the
end. N is bounded by the open-files limit: a longhaul server holds 3
descriptors per session with a stream (carrier, its duplicate for the
path probe, the target), a wstunnel server 2 (its WebSocket, the target).
"""
import argparse
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopback import PROCS, free_port, kill_all, rss_kib, wait_port  # noqa: E402

def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_s(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


class Hold:
    """Accepts and holds connections (the target); counts them."""

    def __init__(self):
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(8192)
        self.port = self.ls.getsockname()[1]
        self.held = []
        self.first = self.last = None
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            c, _ = self.ls.accept()
            now = time.time()
            self.first = self.first or now
            self.last = now
            self.held.append(c)

    def reset(self):
        for c in self.held:
            c.close()
        self.held = []
        self.first = self.last = None


def spawn(args, log, capture=False):
    """Starts `args`, its output to `log` (stdout piped if `capture`)."""
    out = open(log, "w")
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE if capture else out, stderr=out, text=True)
    PROCS.append(p)
    return p


def measure_idle(pid, secs):
    c0 = cpu_s(pid)
    time.sleep(secs)
    return cpu_s(pid) - c0


def longhaul(lh, n, idle, target, work, dead_after):
    def keygen(name):
        return subprocess.run([lh, "-q", "keygen", "--out", f"{work}/{name}"],
                              capture_output=True, text=True, check=True).stdout.strip()

    fp = keygen("s.key")
    ck = keygen("c.key")
    open(f"{work}/ak", "w").write(ck + "\n")
    port = free_port()
    srv = spawn([lh, "-q", "server", "--listen", f"tls://127.0.0.1:{port}", "--key",
                 f"{work}/s.key", "--authorized-keys", f"{work}/ak", "--allow",
                 f"127.0.0.1:{target.port}", "--control", "none", "--max-sessions", str(n + 10), "--dead-after", dead_after],
                f"{work}/lh-server.log")
    wait_port(port)
    time.sleep(0.5)
    rss0, fd0 = rss_kib(srv.pid), fds(srv.pid)
    t0 = time.time()
    bench = spawn([lh, "-q", "bench", "sessions", f"tls://127.0.0.1:{port}", "-n", str(n),
                   "-c", "16", "--to", f"127.0.0.1:{target.port}", "--hold", str(idle + 30),
                   "--key", f"{work}/c.key", "--pin", fp, "--json", "--dead-after", dead_after],
                  f"{work}/lh-bench.log",
                  capture=True)
    out = ""
    while True:
        line = bench.stdout.readline()
        if not line:
            break
        out += line
        if line.startswith("}"):
            break
    rep = json.loads(out)
    up = time.time() - t0
    time.sleep(2)
    rss1, fd1 = rss_kib(srv.pid), fds(srv.pid)
    cpu = measure_idle(srv.pid, idle)
    bench.kill()
    srv.kill()
    return {
        "tunnels": rep["sessions"], "failed": rep["failed"],
        "per_second": rep["per_second"], "p50_ms": rep["p50_ms"], "p99_ms": rep["p99_ms"],
        "seconds": up, "rss_before_mib": rss0 / 1024, "rss_mib": rss1 / 1024,
        "kib_per_tunnel": (rss1 - rss0) / max(1, rep["sessions"]),
        "fds_per_tunnel": (fd1 - fd0) / max(1, rep["sessions"]),
        "idle_cpu_ms_per_s": cpu * 1000 / idle,
    }


def wstunnel(ws, n, idle, target, work):
    port, lport = free_port(), free_port()
    srv = spawn([ws, "server", f"wss://127.0.0.1:{port}"], f"{work}/ws-server.log")
    wait_port(port)
    cli = spawn([ws, "client", "-L", f"tcp://{lport}:127.0.0.1:{target.port}",
                 f"wss://127.0.0.1:{port}"], f"{work}/ws-client.log")
    wait_port(lport)
    time.sleep(1)
    target.reset()
    rss0, fd0 = rss_kib(srv.pid), fds(srv.pid)
    held = []
    lock = threading.Lock()
    t0 = time.time()
    todo = iter(range(n))

    def worker():
        while True:
            with lock:
                if next(todo, None) is None:
                    return
            try:
                s = socket.create_connection(("127.0.0.1", lport), timeout=30)
                with lock:
                    held.append(s)
            except OSError:
                pass

    ts = [threading.Thread(target=worker) for _ in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    deadline = time.time() + 60
    while len(target.held) < len(held) and time.time() < deadline:
        time.sleep(0.05)
    up = (target.last or time.time()) - t0
    time.sleep(2)
    rss1, fd1 = rss_kib(srv.pid), fds(srv.pid)
    cpu = measure_idle(srv.pid, idle)
    got = len(target.held)
    for s in held:
        s.close()
    cli.kill()
    srv.kill()
    return {
        "tunnels": got, "failed": n - got, "per_second": got / max(up, 1e-9),
        "seconds": up, "rss_before_mib": rss0 / 1024, "rss_mib": rss1 / 1024,
        "kib_per_tunnel": (rss1 - rss0) / max(1, got),
        "fds_per_tunnel": (fd1 - fd0) / max(1, got),
        "idle_cpu_ms_per_s": cpu * 1000 / idle,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("n", type=int)
    ap.add_argument("--lh", default="target/release/longhaul")
    ap.add_argument("--wstunnel")
    ap.add_argument("--idle", type=int, default=30)
    ap.add_argument("--dead-after", default="15s", help="longhaul's, on both sides")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="lh-many-")
    target = Hold()
    rows = [("longhaul", longhaul(a.lh, a.n, a.idle, target, work, a.dead_after))]
    target.reset()
    if a.wstunnel:
        rows.append(("wstunnel", wstunnel(a.wstunnel, a.n, a.idle, target, work)))
    for name, r in rows:
        print(f"{name:9} {r['tunnels']} up ({r['failed']} failed) at {r['per_second']:.0f}/s; "
              f"server RSS {r['rss_before_mib']:.1f} -> {r['rss_mib']:.1f} MiB = "
              f"{r['kib_per_tunnel']:.1f} KiB and {r['fds_per_tunnel']:.2f} fds per tunnel; "
              f"idle CPU {r['idle_cpu_ms_per_s']:.1f} ms/s"
              + (f"; dial to stream p50 {r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms"
                 if "p50_ms" in r else ""))
    print(json.dumps(dict(rows)))


if __name__ == "__main__":
    try:
        main()
    finally:
        kill_all()
