#!/usr/bin/env python3
"""CPU per GB of every process of a 1-stream loopback transfer: both relays
and both iperf3 ends, wstunnel and longhaul builds, interleaved (benchmark;
docs/BENCHMARKS.md, issue 38's fifth part).

  machine_cpu.py --wstunnel PATH [--rounds 3] [--reverse] LABEL=BINARY[,CLIENT_ARG...] ...

e.g. `lh=target/release/longhaul lh-nr=target/release/longhaul,--no-reconnect`.

Why every process: on loopback the kernel charges the receive processing
of a packet to whoever holds the receiving socket (or runs the softirq)
at that moment, so a relay that reads its application promptly takes on
work the application's own writes would otherwise pay; the relays alone
overstate the difference between tools.

A 5 s iperf3 upload through `-L` per build and round (`--reverse`: a
download, the gateway's relay reading the target). The relays' and the
receiving iperf3's CPU come from /proc/PID/stat, the sending iperf3's from
its rusage (a child of this script). Loopback ports below 32768 only;
every process started here is killed by PID at the end.
"""
import argparse
import json
import os
import resource
import subprocess
import time

HZ = os.sysconf("SC_CLK_TCK")
TARGET, SERVER, FORWARD = 25701, 25710, 25711
QUIET = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}


def cpu(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def relays(wstunnel, binary, extra, started):
    """Starts a server and a client relay, each appended to `started` as
    soon as it runs (so that it is killed whatever happens next)."""
    def start(*cmd):
        started.append(subprocess.Popen(list(cmd), **QUIET))
        return started[-1]
    if binary is None:
        s = start(wstunnel, "server", f"ws://127.0.0.1:{SERVER}")
        time.sleep(0.5)
        c = start(wstunnel, "client", "-L", f"tcp://127.0.0.1:{FORWARD}:127.0.0.1:{TARGET}",
                  f"ws://127.0.0.1:{SERVER}")
    else:
        common = ["--insecure", "--control", "none"]
        s = start(binary, "server", "--listen", f"tcp://127.0.0.1:{SERVER}",
                  "--allow", f"127.0.0.1:{TARGET}", *common)
        time.sleep(0.5)
        c = start(binary, "client", f"tcp://127.0.0.1:{SERVER}", "-L",
                  f"127.0.0.1:{FORWARD}:127.0.0.1:{TARGET}", *common, *extra)
    time.sleep(1)
    for p in (s, c):
        if p.poll() is not None:
            raise SystemExit(f"{p.args[0]} {p.args[1]} exited ({p.returncode}): is a port taken?")
    return c, s


def one(label, wstunnel, binary, extra, sink, reverse):
    started = []
    try:
        c, s = relays(wstunnel, binary, extra, started)
        c0, s0, i0 = cpu(c.pid), cpu(s.pid), cpu(sink.pid)
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(
            ["iperf3", "-c", "127.0.0.1", "-p", str(FORWARD), "-t", "5", "-J"]
            + (["-R"] if reverse else []),
            capture_output=True, text=True, check=True).stdout
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        gb = json.loads(out)["end"]["sum_received"]["bytes"] / 1e9
        app = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / gb
        cr, sr, rx = (cpu(c.pid) - c0) / gb, (cpu(s.pid) - s0) / gb, (cpu(sink.pid) - i0) / gb
    finally:
        for p in started:
            p.kill()
            p.wait()
    # The script's iperf3 is the client side's application, the sink the
    # target: which of them sends depends on the direction.
    print(f"{label:10s} {gb:5.1f} GB | client relay {cr:.3f} + its app {app:.3f}"
          f" = {cr + app:.3f} | server relay {sr:.3f} + target {rx:.3f}"
          f" = {sr + rx:.3f} | all four {cr + app + sr + rx:.3f} s/GB", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wstunnel", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reverse", action="store_true")
    ap.add_argument("builds", nargs="+", metavar="LABEL=BINARY[,CLIENT_ARG...]")
    a = ap.parse_args()
    builds = []
    for b in a.builds:
        label, rest = b.split("=", 1)
        binary, *extra = rest.split(",")
        builds.append((label, binary, extra))
    sink = subprocess.Popen(["iperf3", "-s", "-B", "127.0.0.1", "-p", str(TARGET)], **QUIET)
    try:
        time.sleep(0.3)
        for _ in range(a.rounds):
            one("wstunnel", a.wstunnel, None, [], sink, a.reverse)
            for label, binary, extra in builds:
                one(label, a.wstunnel, binary, extra, sink, a.reverse)
    finally:
        sink.kill()
        sink.wait()


if __name__ == "__main__":
    main()
