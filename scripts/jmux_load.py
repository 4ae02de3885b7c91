#!/usr/bin/env python3
"""Load for the JMUX interop check: N streams through a forward, each sends
SIZE random bytes, half-closes, and reads SIZE bytes back; the target hashes
what it got and answers with its own random bytes. Every byte is checked
(SHA-256) both ways. Usage:
    jmux_load.py target PORT              # run the target (until killed)
    jmux_load.py load FWD_PORT N SIZE     # run the load through the forward
The target writes, per connection, the SHA-256 of what it received followed
by its reply, so the load can check both directions from its own end."""
import hashlib
import os
import socket
import sys
import threading


def recv_all(s):
    h = hashlib.sha256()
    n = 0
    while True:
        b = s.recv(1 << 20)
        if not b:
            return h.digest(), n
        h.update(b)
        n += len(b)


def target(port):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(64)

    def serve(c):
        with c:
            size = int.from_bytes(c.recv(8, socket.MSG_WAITALL), "big")
            got, _ = recv_all(c)
            reply = os.urandom(size)
            c.sendall(got + hashlib.sha256(reply).digest() + reply)
            c.shutdown(socket.SHUT_WR)

    while True:
        c, _ = l.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def one(port, size, results, i):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=120)
        data = os.urandom(size)
        sent = hashlib.sha256(data).digest()
        out = {}

        def reader():
            buf = bytearray()
            while True:
                b = s.recv(1 << 20)
                if not b:
                    break
                buf += b
            out["buf"] = bytes(buf)

        t = threading.Thread(target=reader)
        t.start()
        s.sendall(size.to_bytes(8, "big") + data)
        s.shutdown(socket.SHUT_WR)  # half-close: the reply must still come
        t.join()
        buf = out["buf"]
        ok_up = buf[:32] == sent
        reply_hash, reply = buf[32:64], buf[64:]
        ok_down = len(reply) == size and hashlib.sha256(reply).digest() == reply_hash
        results[i] = (ok_up, ok_down, len(reply))
    except Exception as e:  # noqa: BLE001 - reported below
        results[i] = (False, False, repr(e))


def load(port, n, size):
    results = [None] * n
    ts = [threading.Thread(target=one, args=(port, size, results, i)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    bad = 0
    for i, r in enumerate(results):
        up, down, info = r
        print(f"stream {i}: client->target {'ok' if up else 'CORRUPT'}, "
              f"target->client {'ok' if down else 'CORRUPT'} ({info})")
        bad += (not up) + (not down)
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "target":
        target(int(sys.argv[2]))
    else:
        sys.exit(load(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
