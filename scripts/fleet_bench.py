#!/usr/bin/env python3
"""A fleet under load: three longhaul servers (--instance s1..s3) behind a
real HAProxy (TCP mode, routing on the TLS server name, as in the README),
N client processes, each with STREAMS streams of MIB MiB through its -L.

Phase 1, resumes: while every stream sends, every carrier between the
clients and HAProxy is reset twice (`ss -K`, the kernel resets the
sockets); then each stream's bytes are counted and hashed at the target,
and the logs say whether every resume landed on its own server.

Phase 2, rolling restart: streams that last about DRAIN_S/2 seconds are
started, then the three servers are restarted one after the other
(SIGTERM, wait for the exit, start again); every stream open at the start
must finish intact, and new connections made during the restart must work.

  fleet_bench.py BINARY [--clients N] [--streams K] [--mib M]

Only loopback ports; every process started here is killed by PID at the
end. Needs haproxy (Debian's) and ss (iproute2); run as root for the
open-files limit of 100 clients.
"""
import argparse
import hashlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopback import PROCS, free_port, kill_all, wait_port  # noqa: E402

def spawn(args, log):
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=open(log, "w"))
    PROCS.append(p)
    return p


class Target:
    """Counts and hashes what each connection sends; answers with
    "<bytes> <sha256 hex>\\n" once the sender half-closes."""

    def __init__(self):
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(4096)
        self.port = self.ls.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            c, _ = self.ls.accept()
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    @staticmethod
    def serve(c):
        h = hashlib.sha256()
        n = 0
        buf = bytearray(256 << 10)
        try:
            while True:
                k = c.recv_into(buf)
                if k == 0:
                    break
                h.update(memoryview(buf)[:k])
                n += k
            c.sendall(f"{n} {h.hexdigest()}\n".encode())
        except OSError:
            pass
        c.close()


def send_stream(port, data, want, pace, results, i):
    """Sends `data` (paced: a 256 KiB piece every `pace` s), then reads the
    target's count and hash."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=120)
        s.settimeout(300)
        view = memoryview(data)
        for off in range(0, len(data), 256 << 10):
            s.sendall(view[off:off + (256 << 10)])
            if pace:
                time.sleep(pace)
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while not answer.endswith(b"\n"):
            k = s.recv(256)
            if not k:
                break
            answer += k
        s.close()
        results[i] = answer.decode().strip() == want
    except OSError as e:
        results[i] = f"error: {e}"


def run_streams(ports, streams, data, want, pace):
    results = {}
    threads = []
    for ci, port in enumerate(ports):
        for k in range(streams):
            i = ci * streams + k
            t = threading.Thread(target=send_stream, args=(port, data, want, pace, results, i))
            t.start()
            threads.append(t)
    return threads, results


def haproxy_config(port, servers):
    c = f"""global
  maxconn 4000
defaults
  mode tcp
  timeout connect 2s
  timeout client 1h
  timeout server 1h
  retries 2
  option redispatch
frontend longhaul
  bind 127.0.0.1:{port}
  tcp-request inspect-delay 5s
  tcp-request content accept if {{ req.ssl_hello_type 1 }}
  default_backend fleet
backend fleet
  balance roundrobin
"""
    for name, _ in servers:
        c += f"  use-server {name} if {{ req.ssl_sni -i {name} }}\n"
    for name, p in servers:
        c += f"  server {name} 127.0.0.1:{p} check inter 1s fall 2 rise 2\n"
    return c


def count(logs, what):
    total = 0
    for f in logs:
        try:
            total += open(f).read().count(what)
        except OSError:
            pass
    return total


def pct(v, p):
    if not v:
        return "-"
    return f"{v[min(len(v) - 1, int(len(v) * p / 100))]:.0f}"


def outages(logs):
    """The outage of every resume the clients logged, in ms."""
    import re
    out = []
    for f in logs:
        for line in open(f, errors="replace"):
            if "back: session resumed" in line:
                m = re.search(r"outage=([0-9.]+)(ms|s|µs)", line)
                if m:
                    v = float(m.group(1))
                    out.append(v * {"ms": 1, "s": 1000, "µs": 0.001}[m.group(2)])
    return sorted(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--drain", type=int, default=30)
    a = ap.parse_args()
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    work = tempfile.mkdtemp(prefix="lh-fleet-")
    bin_ = a.binary

    def keygen(name):
        out = subprocess.run([bin_, "keygen", "--out", f"{work}/{name}"], capture_output=True,
                             text=True, check=True)
        return out.stdout.strip()

    fp = keygen("server.key")
    ck = keygen("c.key")
    open(f"{work}/ak", "w").write(ck + "\n")
    target = Target()
    servers = [(f"s{i}", free_port()) for i in (1, 2, 3)]

    def start_server(name, port):
        p = spawn([bin_, "server", "--listen", f"tls://127.0.0.1:{port}", "--key",
                   f"{work}/server.key", "--authorized-keys", f"{work}/ak", "--allow",
                   f"127.0.0.1:{target.port}", "--instance", name, "--drain-timeout",
                   f"{a.drain}s", "--control", "none"], f"{work}/{name}.log")
        wait_port(port)
        return p

    procs = {name: start_server(name, port) for name, port in servers}
    lb = free_port()
    open(f"{work}/haproxy.cfg", "w").write(haproxy_config(lb, servers))
    spawn([haproxy, "-db", "-f", f"{work}/haproxy.cfg"], f"{work}/haproxy.log")
    wait_port(lb)
    ports = []
    t0 = time.time()
    for i in range(a.clients):
        port = free_port()
        spawn([bin_, "client", f"tls://127.0.0.1:{lb}", "--key", f"{work}/c.key", "--pin", fp,
               "-L", f"127.0.0.1:{port}:127.0.0.1:{target.port}", "--control", "none"],
              f"{work}/c{i}.log")
        ports.append(port)
    for p in ports:
        wait_port(p)
    # Sessions start with the first connection: one quick stream each.
    warm = b"x" * 1024
    threads, res = run_streams(ports, 1, warm, f"1024 {hashlib.sha256(warm).hexdigest()}", 0)
    for t in threads:
        t.join()
    assert all(v is True for v in res.values()), res
    print(f"{a.clients} clients with a session in {time.time() - t0:.1f} s; "
          f"sessions per server: {[count([f'{work}/{n}.log'], 'session started') for n, _ in servers]}")

    data = random.randbytes(a.mib << 20)
    want = f"{len(data)} {hashlib.sha256(data).hexdigest()}"
    total = a.clients * a.streams * len(data)
    clogs = [f"{work}/c{i}.log" for i in range(a.clients)]
    slogs = [f"{work}/{n}.log" for n, _ in servers]

    # Phase 1: every carrier reset twice during the transfer.
    t0 = time.time()
    # Paced to last about 12 s, so that both resets fall inside.
    threads, res = run_streams(ports, a.streams, data, want, 12 / max(1, len(data) >> 18))
    for _ in range(2):
        time.sleep(4)
        subprocess.run(["ss", "-K", "dst", "127.0.0.1", "dport", "=", f":{lb}"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for t in threads:
        t.join()
    took = time.time() - t0
    ok = sum(1 for v in res.values() if v is True)
    print(f"phase 1: {ok}/{len(res)} streams intact ({total / 2**30:.1f} GiB in {took:.1f} s); "
          f"resumes logged by clients {count(clogs, 'back: session resumed')} "
          f"(outage p50 {pct(outages(clogs), 50)} ms, max {pct(outages(clogs), 100)} ms), "
          f"fresh sessions {count(clogs, 'starting a new session')}, "
          f"resumes refused by servers {count(slogs, 'resume refused')}")
    bad = {k: v for k, v in res.items() if v is not True}
    if bad:
        print("  failed streams:", dict(list(bad.items())[:10]))

    # Phase 2: a rolling restart under load.
    pace = (a.drain / 2) / max(1, len(data) >> 18)
    t0 = time.time()
    threads, res = run_streams(ports, a.streams, data, want, pace)
    time.sleep(2)
    late = {}
    for name, port in servers:
        p = procs[name]
        ts = time.time()
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=a.drain + 15)
        except subprocess.TimeoutExpired:
            print(f"  {name} did not exit within drain + 15 s")
            p.kill()
        stopped = time.time() - ts
        procs[name] = start_server(name, port)
        # New connections while the fleet restarts.
        lt, lres = run_streams(ports[:10], 1, warm, f"1024 {hashlib.sha256(warm).hexdigest()}", 0)
        for t in lt:
            t.join()
        late[name] = (stopped, sum(1 for v in lres.values() if v is True))
    for t in threads:
        t.join()
    ok = sum(1 for v in res.values() if v is True)
    print(f"phase 2: {ok}/{len(res)} streams open before the restart intact "
          f"(ran {time.time() - t0:.1f} s, --drain-timeout {a.drain}s); "
          + "; ".join(f"{n} drained in {s:.1f} s, then {k}/{min(10, len(ports))} new connections ok"
                      for n, (s, k) in late.items()))
    bad = {k: v for k, v in res.items() if v is not True}
    if bad:
        print("  failed streams:", dict(list(bad.items())[:10]))
    print(f"logs in {work}")


if __name__ == "__main__":
    try:
        main()
    finally:
        kill_all()
