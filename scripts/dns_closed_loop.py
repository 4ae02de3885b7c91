#!/usr/bin/env python3
"""One DNS query in flight at a time for SECS seconds against 127.0.0.1:PORT:
prints queries/s, p50 and p99 latency in microseconds, and losses (a query
not answered within 1 s counts as lost and is sent again)."""
import socket, struct, sys, time

port, secs = int(sys.argv[1]), float(sys.argv[2])

def query(qid, name):
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\x00" + struct.pack(">HH", 1, 1)

s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1.0)
lat, lost, qid = [], 0, 0
end = time.perf_counter() + secs
while time.perf_counter() < end:
    qid = (qid + 1) & 0xFFFF
    q = query(qid, "h%d.lh.test" % (qid % 1000))
    t = time.perf_counter()
    s.sendto(q, ("127.0.0.1", port))
    try:
        while True:
            d, _ = s.recvfrom(4096)
            if d[:2] == q[:2]:
                break
        lat.append(time.perf_counter() - t)
    except socket.timeout:
        lost += 1
lat.sort()
n = len(lat)
print("qps %.0f p50_us %.1f p99_us %.1f lost %d" % (n / secs, lat[n // 2] * 1e6, lat[int(n * 0.99)] * 1e6, lost))
