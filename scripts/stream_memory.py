#!/usr/bin/env python3
"""Resident memory of a longhaul client and server per stream (benchmark;
docs/BENCHMARKS.md). Starts `longhaul server` and `longhaul client -L` on
loopback (tcp://, --insecure), then:

  idle: N connections through the forward, each sends 1 byte, then nothing;
  busy: B connections that all send without pause into a draining target.

and prints VmRSS of both processes before and after. The target runs in its
own process, so each process here holds at most N sockets (the open-file
limit is per process).

With --pace N the idle connections are opened N a second (in steps of
100), so the figure is what the streams hold once open; without it they
are opened as fast as one client can, and the figure includes what the
burst left behind (allocator pages the opens' transient state scattered).

Usage: stream_memory.py [--bin target/release/longhaul] [--idle 10000] [--busy 100] [--pace 0]
"""
import argparse
import os
import resource
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopback import free_port, rss_kib, wait_port  # noqa: E402


def pss_kib(pid):
    for line in open(f"/proc/{pid}/smaps_rollup"):
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


TARGET = r"""
import selectors, socket, sys
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen(4096); l.setblocking(False)
sel = selectors.DefaultSelector(); sel.register(l, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fileobj is l:
            try:
                c, _ = l.accept(); c.setblocking(False); sel.register(c, selectors.EVENT_READ)
            except OSError:
                pass
        else:
            try:
                if not key.fileobj.recv(1 << 16):
                    sel.unregister(key.fileobj); key.fileobj.close()
            except OSError:
                sel.unregister(key.fileobj); key.fileobj.close()
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/longhaul")
    ap.add_argument("--idle", type=int, default=10000)
    ap.add_argument("--busy", type=int, default=100)
    ap.add_argument("--pace", type=int, default=0, help="idle streams opened per second (0: at once)")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tport, sport, lport = free_port(), free_port(), free_port()
    procs = [subprocess.Popen([sys.executable, "-c", TARGET, str(tport)])]
    wait_port(tport)
    devnull = subprocess.DEVNULL
    server = subprocess.Popen([a.bin, "server", "--listen", f"tcp://127.0.0.1:{sport}",
                               "--insecure", "--allow", f"127.0.0.1:{tport}"], stderr=devnull)
    procs.append(server)
    wait_port(sport)
    client = subprocess.Popen([a.bin, "client", f"tcp://127.0.0.1:{sport}", "--insecure",
                               "-L", f"{lport}:127.0.0.1:{tport}"], stderr=devnull)
    procs.append(client)
    wait_port(lport)
    try:
        time.sleep(0.5)
        base = (rss_kib(client.pid), rss_kib(server.pid))
        print(f"baseline: client {base[0]} KiB, server {base[1]} KiB")
        conns = []
        t = time.time()
        for _ in range(a.idle):
            s = socket.create_connection(("127.0.0.1", lport))
            s.send(b"x")
            conns.append(s)
            if a.pace and len(conns) % 100 == 0:
                time.sleep(100 / a.pace)
        time.sleep(2)
        idle = (rss_kib(client.pid), rss_kib(server.pid))
        total = idle[0] + idle[1]
        per = ((idle[0] - base[0]) + (idle[1] - base[1])) * 1024 / a.idle
        # PSS counts the pages both processes share (the program's code,
        # libc) once, as the machine holds them.
        pss = sum(pss_kib(p.pid) for p in (client, server))
        print(f"{a.idle} idle streams (opened in {time.time() - t:.1f} s): client {idle[0]} KiB, "
              f"server {idle[1]} KiB, together {total / 1024:.1f} MiB (PSS {pss / 1024:.1f} MiB); "
              f"{per:.0f} bytes per stream (client + server, above baseline)")
        for s in conns:
            s.close()
        conns = []
        time.sleep(2)
        after = (rss_kib(client.pid), rss_kib(server.pid))
        print(f"after closing them: client {after[0]} KiB, server {after[1]} KiB")

        stop = threading.Event()

        if a.busy == 0:
            return

        def pump():
            s = socket.create_connection(("127.0.0.1", lport))
            block = b"\0" * (256 * 1024)
            while not stop.is_set():
                s.sendall(block)
            s.close()

        threads = [threading.Thread(target=pump, daemon=True) for _ in range(a.busy)]
        for th in threads:
            th.start()
        time.sleep(3)
        peak = (0, 0)
        for _ in range(10):
            cur = (rss_kib(client.pid), rss_kib(server.pid))
            peak = (max(peak[0], cur[0]), max(peak[1], cur[1]))
            time.sleep(0.3)
        stop.set()
        per = ((peak[0] - after[0]) + (peak[1] - after[1])) / a.busy
        print(f"{a.busy} busy streams: client {peak[0]} KiB, server {peak[1]} KiB (peak of 10 samples); "
              f"{per:.0f} KiB per busy stream (client + server)")
    finally:
        for p in procs:
            p.kill()


if __name__ == "__main__":
    main()
