#!/usr/bin/env python3
"""Carrier resets during a transfer: how long delivery stops, and whether
every byte arrives exactly once.

  resume_bench.py receive PORT OUT.json
      accepts one connection, hashes everything it receives, notes every
      pause in arrivals longer than 20 ms, writes OUT.json at EOF.
  resume_bench.py send HOST:PORT SECONDS RESET_EVERY CARRIER_PORT OUT.json
      sends a pseudo-random stream for SECONDS; every RESET_EVERY seconds
      (0: never) kills the carrier's TCP socket with `ss -K` (the kernel
      resets it, the peer sees a reset), as a middlebox or a flaky link
      would; writes OUT.json.

The two halves may run in different network namespaces (scripts/resume_bench.sh
wires them through `longhaul netem exec`).
"""
import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

CHUNK = 256 * 1024


def receive(port, out):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(1)
    c, _ = ls.accept()
    h = hashlib.sha256()
    total = 0
    pauses = []
    first = last = None
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while True:
        n = c.recv_into(buf)
        now = time.time()
        if n == 0:
            break
        if first is None:
            first = now
        if last is not None and now - last > 0.02:
            pauses.append({"from": last, "to": now, "seconds": now - last})
        last = now
        h.update(view[:n])
        total += n
    json.dump(
        {"bytes": total, "sha256": h.hexdigest(), "first": first, "last": last, "pauses": pauses},
        open(out, "w"),
    )


def send(dest, seconds, reset_every, carrier_port, out):
    host, port = dest.rsplit(":", 1)
    rng = random.Random(4)
    block = bytes(rng.getrandbits(8) for _ in range(1 << 16)) * 64  # 4 MiB
    s = socket.create_connection((host, int(port)))
    h = hashlib.sha256()
    total = 0
    resets = []
    stop = time.time() + seconds

    def resetter():
        if reset_every <= 0:
            return
        t = time.time() + reset_every
        while t < stop - 1:
            time.sleep(max(0, t - time.time()))
            at = time.time()
            subprocess.run(
                ["ss", "-K", "dport", "=", f":{carrier_port}"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            resets.append(at)
            t += reset_every

    th = threading.Thread(target=resetter)
    th.start()
    off = 0
    start = time.time()
    while time.time() < stop:
        piece = block[off : off + CHUNK]
        s.sendall(piece)
        h.update(piece)
        total += len(piece)
        off = (off + CHUNK) % len(block)
    s.shutdown(socket.SHUT_WR)
    sent_at = time.time()
    s.recv(1)
    s.close()
    th.join()
    json.dump(
        {"bytes": total, "sha256": h.hexdigest(), "start": start, "end": sent_at, "resets": resets},
        open(out, "w"),
    )


if __name__ == "__main__":
    if sys.argv[1] == "receive":
        receive(int(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "send":
        send(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    elif sys.argv[1] == "report":
        snd = json.load(open(sys.argv[2]))
        rcv = json.load(open(sys.argv[3]))
        ok = snd["bytes"] == rcv["bytes"] and snd["sha256"] == rcv["sha256"]
        stalls = []
        for r in snd["resets"]:
            # The pause in arrivals that covers or follows the reset.
            ps = [p for p in rcv["pauses"] if p["to"] > r and p["from"] < r + 5]
            stalls.append(max((p["seconds"] for p in ps), default=0.0))
        dur = rcv["last"] - rcv["first"]
        print(
            json.dumps(
                {
                    "intact": ok,
                    "bytes_sent": snd["bytes"],
                    "bytes_received": rcv["bytes"],
                    "resets": len(snd["resets"]),
                    "stall_ms": [round(x * 1000, 1) for x in stalls],
                    "goodput_mbit": round(rcv["bytes"] * 8 / dur / 1e6, 1),
                }
            )
        )
        sys.exit(0 if ok else 1)
