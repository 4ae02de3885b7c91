#!/usr/bin/env python3
"""Resident memory per session at one server: N clients (processes), each
with one -L forward holding one idle stream to a target that accepts and
waits. The server's RSS is read before the clients start and once every
stream is open; the difference over N is the cost of a session with one
idle stream (its carrier, its stream and the target's socket).

    scripts/session_memory.py [N (200)] [--tls]   (IDLE=secs: then the server's idle CPU)

Loopback only; every process started here is killed by PID at the end.
"""
import os, socket, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopback import free_port, rss_kib  # noqa: E402

LH = os.environ.get("LH", "target/release/longhaul")
n = next((int(a) for a in sys.argv[1:] if a.isdigit()), 200)
tls = "--tls" in sys.argv
procs = []


try:
    target = socket.socket()
    target.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    target.bind(("127.0.0.1", 0))
    target.listen(4096)
    tport = target.getsockname()[1]
    sport = free_port()
    tmp = tempfile.mkdtemp(prefix="lh-sessmem-")
    scheme = "tls" if tls else "tcp"
    sargs = [LH, "-q", *os.environ.get("SERVER_OPTS", "").split(), "server", "--listen", f"{scheme}://127.0.0.1:{sport}",
             "--allow", f"127.0.0.1:{tport}", "--control", "none", "--insecure"]
    cargs = ["--insecure"]
    if tls:
        key = os.path.join(tmp, "s.key")
        fp = subprocess.run([LH, "-q", "keygen", "--out", key], capture_output=True,
                            text=True, check=True).stdout.strip()
        sargs += ["--key", key]
        cargs = ["--pin", fp]
        os.environ["LONGHAUL_TOKEN"] = "t"
    server = subprocess.Popen(sargs, stderr=subprocess.DEVNULL)
    procs.append(server)
    time.sleep(0.5)
    base = rss_kib(server.pid)
    ports = []
    for i in range(n):
        p = free_port()
        c = subprocess.Popen([LH, "-q", "client", f"{scheme}://127.0.0.1:{sport}", *cargs,
                              "--control", "none", "-L", f"127.0.0.1:{p}:127.0.0.1:{tport}"],
                             stderr=subprocess.DEVNULL)
        procs.append(c)
        ports.append(p)
    held, accepted = [], []
    t0 = time.time()
    for p in ports:
        while True:
            try:
                held.append(socket.create_connection(("127.0.0.1", p), timeout=2))
                break
            except OSError:
                if time.time() - t0 > 120:
                    raise
                time.sleep(0.05)
    target.settimeout(30)
    while len(accepted) < n:
        accepted.append(target.accept()[0])
    time.sleep(2)
    peak = rss_kib(server.pid)
    fds = len(os.listdir(f"/proc/{server.pid}/fd"))
    print(f"{n} sessions ({scheme}://), one idle stream each: server RSS {base} KiB -> "
          f"{peak} KiB, {(peak - base) / n:.1f} KiB per session, {fds} descriptors")

    def cpu_s(pid):
        # Nanoseconds on a CPU, every thread (stat's clock ticks are too
        # coarse: 200 idle sessions use a few ticks a minute).
        ns = 0
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                ns += int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
            except OSError:
                pass  # a thread that just ended
        return ns / 1e9

    def machine_s():
        # Every core's busy time, the kernel's own work (softirq: TCP
        # keepalive probes, timers) included, which no process is charged.
        f = open("/proc/stat").readline().split()[1:]
        busy = sum(int(x) for x in f) - int(f[3]) - int(f[4])
        return busy / os.sysconf("SC_CLK_TCK")

    idle = float(os.environ.get("IDLE", "30"))
    c0, m0 = cpu_s(server.pid), machine_s()
    time.sleep(idle)
    us = (cpu_s(server.pid) - c0) / idle / n * 1e6
    whole = (machine_s() - m0) / idle / n * 1e6
    print(f"idle for {idle:.0f} s (each client its own process, keepalives at their own "
          f"times): server CPU {us:.2f} us/s per session; whole machine (server, clients, "
          f"kernel) {whole:.2f} us/s per session")
finally:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()
    if "tmp" in globals():
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
